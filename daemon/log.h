/*
 * daemon/log.h — kvd's log: one line per event on stderr, prefixed with
 * its sd-daemon priority ("<3>" error .. "<7>" debug) so that journald
 * files it at the right level. Only code under daemon/ logs; libraries
 * return errors and let the daemon say what happened once.
 *
 * The threshold is the one mutable global kvd has (STYLE.md rule 4).
 */
#ifndef KVD_LOG_H
#define KVD_LOG_H

#include <errno.h>

#define KVD_LOG_ERR     3
#define KVD_LOG_WARNING 4
#define KVD_LOG_NOTICE  5
#define KVD_LOG_INFO    6
#define KVD_LOG_DEBUG   7

/* Lines above this priority number are dropped. Default: info. */
extern int kvd_log_level;

/* Write "<prio>message\n" to stderr in one write() (without "<prio>" when
 * stderr is a terminal); never fails visibly.
 * errno is preserved, so "%m" works and callers can log before returning
 * -errno. Returns nothing. */
void kvd_log(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...)   kvd_log(KVD_LOG_ERR, __VA_ARGS__)
#define log_warning(...) kvd_log(KVD_LOG_WARNING, __VA_ARGS__)
#define log_notice(...)  kvd_log(KVD_LOG_NOTICE, __VA_ARGS__)
#define log_info(...)    kvd_log(KVD_LOG_INFO, __VA_ARGS__)
#define log_debug(...)   kvd_log(KVD_LOG_DEBUG, __VA_ARGS__)

#endif
