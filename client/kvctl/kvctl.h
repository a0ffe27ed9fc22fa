/*
 * client/kvctl/kvctl.h — what kvctl's command files share: exit statuses,
 * the help text every command repeats, the command table's row, and the
 * helpers for messages, argument parsing, JSON output and connecting.
 *
 * kvctl is built only on libkvclient (the public kvclient.h), like any
 * program a user writes. Each command family lives in its own file and
 * exports one or more `struct kvctl_command` rows; main.c holds the table.
 */
#ifndef KVCTL_H
#define KVCTL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvclient.h"

/* ---- exit statuses (documented in every --help) ------------------------- */

#define EXIT_OK          0   /* success */
#define EXIT_FAIL        1   /* the daemon failed the request (engine error, out of memory, ...) */
#define EXIT_USAGE       2   /* bad command line */
#define EXIT_UNAVAILABLE 3   /* the daemon cannot be reached or refused this user */
#define EXIT_REJECTED    4   /* the request was refused as invalid or too large */
#define EXIT_LOST        5   /* the connection broke or timed out during the request */
#define EXIT_VERSION     6   /* the daemon speaks an incompatible protocol */
#define EXIT_IO          7   /* reading the input or writing the output failed */
#define EXIT_CUT         8   /* generate: a constrained output was cut before it was complete */
#define EXIT_CANCELLED   130 /* interrupted (SIGINT): the request was cancelled */

#define EXIT_STATUS_HELP                                                                                      \
	"EXIT STATUS\n"                                                                                       \
	"    0    success\n"                                                                                  \
	"    1    the daemon failed the request (engine error, out of memory, ...)\n"                       \
	"    2    usage error (unknown option, bad value)\n"                                                 \
	"    3    the daemon cannot be reached (not running, wrong socket, no permission)\n"                 \
	"         or refused this user\n"                                                                    \
	"    4    the request was refused: invalid parameters, prompt too large for the\n"                  \
	"         context window, unknown session, per-client limit reached\n"                               \
	"    5    the connection was lost or timed out during the request (daemon crashed,\n"                \
	"         restarted or is shutting down)\n"                                                          \
	"    6    the daemon speaks an incompatible protocol version\n"                                      \
	"    7    reading the input or writing the output failed\n"                                         \
	"    130  interrupted with Ctrl-C (SIGINT); a running generation was cancelled\n"

#define COMMON_HELP                                                                                           \
	"COMMON OPTIONS\n"                                                                                    \
	"    --socket PATH   the daemon's socket (default: $KVD_SOCKET, else " KVC_DEFAULT_SOCKET ");\n"   \
	"                    \"@name\" names an abstract socket\n"                                           \
	"    --timeout SECS  give up waiting for the daemon after SECS seconds (fractions\n"                \
	"                    allowed; default: wait as long as needed)\n"                                   \
	"    -h, --help      show this help\n"                                                               \
	"\n"                                                                                                  \
	"ENVIRONMENT\n"                                                                                       \
	"    KVD_SOCKET      socket path used when --socket is not given (in a checkout,\n"                 \
	"                    after 'make run', '. run/env' sets it to run/kvd.sock)\n"

struct ctx {
	const char *socket;  /* NULL: library default */
	double timeout_s;    /* < 0: none */
};

/* ---- the command table ------------------------------------------------------ */

struct kvctl_command {
	const char *name;
	const char *summary; /* one line for 'kvctl --help' */
	int (*fn)(struct ctx *x, int argc, char **argv);
	const char *help;    /* the man-page text of 'kvctl NAME --help' */
};

extern const struct kvctl_command kvctl_cmd_generate, kvctl_cmd_stats, kvctl_cmd_ps, kvctl_cmd_tokenize,
	kvctl_cmd_count, kvctl_cmd_plan, kvctl_cmd_session, kvctl_cmd_version, kvctl_cmd_chat;
extern const struct kvctl_command kvctl_cmd_ledger, kvctl_cmd_cache;

/* ---- stats --map (map.c) and --prometheus (prom.c) --------------------------- */

/* Draw the KV pool (once, or every watch seconds until SIGINT); color_mode
 * 1 always, 0 never, -1 on a terminal unless NO_COLOR is set. Returns the
 * exit status. */
int map_main(kvc_client *c, double watch, int color_mode);
/* The stats and histograms in Prometheus' text exposition format. */
void prom_print(FILE *f, const struct kvc_stats *s, const struct kvc_histograms *h, const struct kvc_info *i);
/* kvd's KV element type ("f16", "q8_0", ...) that costs kv_bytes_per_token
 * for this shape, or NULL (plan.c). */
const char *kv_cache_type_name(uint64_t kv_bytes_per_token, uint32_t layers, uint32_t kv_heads, uint32_t head_dim);

/* ---- generation (generate.c) and conversations (chat.c) --------------------- */

/* 'kvctl generate' (chat false) or 'kvctl chat' (chat true): options,
 * input, streaming and the exit status. */
int generate_main(struct ctx *x, int argc, char **argv, bool chat);
extern const char *const kvctl_help_chat;

/* A conversation read from JSON: msgs[0 .. n) point into priv (the parsed
 * document), released by chat_conv_free(). */
struct chat_conv {
	struct kvc_chat_msg *msgs;
	size_t n;
	void *priv;
};
/* Parse text[0 .. len) as a JSON array of {"role", "content"} messages, the
 * last one the user's. Returns 0; -EINVAL with err[0 .. err_cap) saying
 * what is wrong and where; -ENOMEM; -EOPNOTSUPP when kvctl was built
 * without a JSON library. */
int chat_conv_parse(const char *text, size_t len, struct chat_conv *ret, char *err, size_t err_cap);
void chat_conv_free(struct chat_conv *c);

/* ---- messages (util.c) ----------------------------------------------------- */

/* stderr is the journal ($JOURNAL_STREAM): messages carry sd-daemon priorities. */
bool stderr_is_journal(void);
/* Set once by main(). */
extern bool g_journal;

__attribute__((format(printf, 1, 2))) void log_err(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void log_warn(const char *fmt, ...);
/* The exit status for a libkvclient error code. */
int exit_for(int code);
/* Log a failure of a call on a connected client, with the daemon's words;
 * returns the exit status. */
int fail(kvc_client *c, const char *what, int code);
/* Log a usage error for cmd (NULL: kvctl itself) and point at its --help;
 * returns EXIT_USAGE. */
__attribute__((format(printf, 2, 3))) int usage_error(const char *cmd, const char *fmt, ...);

/* ---- parsing and formatting (util.c) ---------------------------------------- */

/* *buf (of *cap elements of elem bytes) grown to hold at least need, by
 * doubling from 256: 0, or -ENOMEM with *buf unchanged. */
int grow_array(void **buf, size_t *cap, size_t need, size_t elem);

bool parse_u64(const char *s, uint64_t *ret);
bool parse_u32(const char *s, uint32_t *ret);
bool parse_double(const char *s, double *ret);
/* "64G", "1.5GiB", "512M", "1000000": binary multiples (K = 1024). */
bool parse_size(const char *s, uint64_t *ret);
void fmt_bytes(char *out, size_t cap, double b);
void fmt_version(char *out, size_t cap, unsigned v);
/* Read all of stdin (at most max bytes; -E2BIG beyond). */
int read_stdin(size_t max, char **ret, size_t *ret_len);
#define MAX_INPUT_BYTES (64u << 20)
/* Read all of the file at path the same way. */
int read_file(const char *path, size_t max, char **ret, size_t *ret_len);
/* The text operand: words joined by spaces, or stdin for none or "-". */
int input_text(int argc, char **argv, char **ret, size_t *ret_len);
/* A JSON string; invalid UTF-8 bytes become U+FFFD. */
void json_str(FILE *f, const char *s, size_t n);

/* ---- connecting and options (util.c) ----------------------------------------- */

/* Connect to the daemon of x; on failure log why (and where it looked) and
 * return the exit status, else 0. */
int connect_daemon(const struct ctx *x, kvc_client **ret);

/* Options every command accepts. */
enum { OPT_SOCKET = 1000, OPT_TIMEOUT, OPT_FIRST_CMD };
#define COMMON_LONGOPTS                                                                                     \
	{ "socket", required_argument, NULL, OPT_SOCKET }, { "timeout", required_argument, NULL, OPT_TIMEOUT }, \
		{ "help", no_argument, NULL, 'h' }
/* Log the option getopt_long just refused ('?': unknown, ':': its value is
 * missing; getopt's own messages are off, opterr = 0) and return EXIT_USAGE.
 * Options parse with an optstring beginning ':' so that the two differ. */
int option_error(const char *cmd, char **argv, int opt);
/* Returns 1 if opt was a common option (handled), -1 on a bad value (logged),
 * 0 if it is not one. */
int common_opt(struct ctx *x, const char *cmd, int opt, const char *arg);
/*
 * Options of a command that takes only --json besides the common ones and
 * no arguments. Returns -1 to go on (with *ret_json set), or the exit
 * status to return at once (after --help or a usage error).
 */
int parse_json_only(struct ctx *x, const char *cmd, const char *help, int argc, char **argv, bool *ret_json);

/* ---- Ctrl-C (util.c) ------------------------------------------------------------ */

/* What the SIGINT handler needs: set while a request runs. */
extern kvc_client *volatile g_sig_client;
extern volatile uint64_t g_sig_request;
extern volatile sig_atomic_t g_interrupted;
/* SIGINT cancels the published request (then a second one kills at once);
 * SIGPIPE is ignored so that write errors are reported. */
void install_sigint(void);
/* SIGINT only sets g_interrupted (for loops such as stats --watch). */
void install_sigint_flag(void);
/* Sleep s seconds, or until interrupted. */
void sleep_s(double s);

#endif
