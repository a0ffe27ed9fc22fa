/*
 * client/kvctl/ledger.h — what kvctl ledger's two files share: the small
 * scanner that reads members of kvd's ledger records (ledger.c) and the
 * report over them (ledger_report.c).
 */
#ifndef KVCTL_LEDGER_H
#define KVCTL_LEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvclient.h"

/* The value of top-level member key of the JSON object at json, or NULL. */
const char *ledger_member(const char *json, const char *key);
/* A non-negative integer member into *ret; false when absent or not one. */
bool ledger_member_u64(const char *json, const char *key, uint64_t *ret);
/* A number member (integer or fraction) into *ret; false when absent. */
bool ledger_member_double(const char *json, const char *key, double *ret);
/* A string member, unescaped into out (\uXXXX beyond ASCII as '?'). */
bool ledger_member_str(const char *json, const char *key, char *out, size_t cap);

/*
 * Print the report over records recs[0 .. n) whose time_ns is at least
 * since_ns, with the daemon's counters *st: a short page, or one JSON
 * object when json. Returns 0, or -ENOMEM.
 */
int ledger_report(const struct kvc_ledger_record *recs, size_t n, uint64_t since_ns, const struct kvc_stats *st,
		  bool json);

#endif
