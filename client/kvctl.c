/*
 * client/kvctl.c — kvctl, the command-line client of kvd.
 *
 * Built only on libkvclient (the public kvclient.h), like any program a
 * user writes: generate text (streamed to stdout, or one JSON object),
 * show the KV-cache statistics, tokenize and count with the model's own
 * tokenizer, compute the KV-cache capacity bill of a model, list live
 * requests, manage sessions, print versions. Every command documents
 * itself with --help; exit statuses are distinct so scripts can tell
 * "daemon down" from "request refused" from "usage error".
 *
 * Messages go to stderr, prefixed "kvctl: "; when stderr is connected to
 * the journal ($JOURNAL_STREAM) lines carry sd-daemon priority prefixes.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
	"    KVD_SOCKET      socket path used when --socket is not given\n"

struct ctx {
	const char *socket;  /* NULL: library default */
	double timeout_s;    /* < 0: none */
};

/* ---- messages --------------------------------------------------------------- */

static bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* Set once at start: stderr is the journal, so lines carry priorities. */
static bool g_journal;

static void vlog(int prio, const char *fmt, va_list ap)
{
	if (g_journal)
		fprintf(stderr, "<%d>", prio);
	fputs("kvctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

__attribute__((format(printf, 1, 2))) static void log_err(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(3, fmt, ap);
	va_end(ap);
}

__attribute__((format(printf, 1, 2))) static void log_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(4, fmt, ap);
	va_end(ap);
}

/* Exit status for a library error code. */
static int exit_for(int code)
{
	switch (code) {
	case 0:
		return EXIT_OK;
	case -ECANCELED:
		return EXIT_CANCELLED;
	case KVC_ERR_VERSION:
		return EXIT_VERSION;
	case KVC_ERR_DENIED:
	case -ENOENT:
	case -ECONNREFUSED:
	case -EACCES:
	case -EPERM:
	case -ENAMETOOLONG:
	case -ENOTSOCK:
	case -EPROTOTYPE:
		return EXIT_UNAVAILABLE;
	case KVC_ERR_CONTEXT:
	case KVC_ERR_SESSION:
	case KVC_ERR_LIMIT:
	case -EINVAL:
	case -E2BIG:
	case -EOPNOTSUPP:
		return EXIT_REJECTED;
	case -ECONNRESET:
	case -EPIPE:
	case -ETIMEDOUT:
	case -EPROTO:
	case KVC_ERR_SHUTDOWN:
		return EXIT_LOST;
	default:
		return EXIT_FAIL;
	}
}

/* Log a failure of a call on a connected client, with the daemon's words. */
static int fail(kvc_client *c, const char *what, int code)
{
	const char *m = c ? kvc_last_message(c) : "";
	if (*m)
		log_err("%s: %s (%s)", what, kv_strerror(code), m);
	else
		log_err("%s: %s", what, kv_strerror(code));
	return exit_for(code);
}

static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	char msg[512];
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (cmd) {
		log_err("%s: %s", cmd, msg);
		fprintf(stderr, "       try 'kvctl %s --help'\n", cmd);
	} else {
		log_err("%s", msg);
		fprintf(stderr, "       try 'kvctl --help'\n");
	}
	return EXIT_USAGE;
}

/* ---- parsing helpers ---------------------------------------------------------- */

static bool parse_u64(const char *s, uint64_t *ret)
{
	char *end;
	if (!s || !*s || *s == '-')
		return false;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end)
		return false;
	*ret = v;
	return true;
}

static bool parse_u32(const char *s, uint32_t *ret)
{
	uint64_t v;
	if (!parse_u64(s, &v) || v > UINT32_MAX)
		return false;
	*ret = (uint32_t)v;
	return true;
}

static bool parse_double(const char *s, double *ret)
{
	char *end;
	if (!s || !*s)
		return false;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end || !isfinite(v))
		return false;
	*ret = v;
	return true;
}

/* "64G", "1.5GiB", "512M", "1000000": binary multiples (K = 1024). */
static bool parse_size(const char *s, uint64_t *ret)
{
	char *end;
	if (!s || !*s || *s == '-')
		return false;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || !isfinite(v) || v < 0 || end == s)
		return false;
	double mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	}
	if (mul > 1) {
		if (*end == 'i')
			end++;
		if (*end == 'B' || *end == 'b')
			end++;
	} else if (*end == 'B' || *end == 'b') {
		end++;
	}
	if (*end || v * mul >= 1.8e19)
		return false;
	*ret = (uint64_t)(v * mul);
	return true;
}

static void fmt_bytes(char *out, size_t cap, double b)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	int u = 0;
	while (b >= 1024 && u < 5) {
		b /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(out, cap, "%.0f B", b);
	else
		snprintf(out, cap, "%.1f %s", b, units[u]);
}

static void fmt_version(char *out, size_t cap, unsigned v)
{
	snprintf(out, cap, "%u.%u.%u", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff);
}

/* Read all of stdin (at most max bytes; -E2BIG beyond). */
static int read_stdin(size_t max, char **ret, size_t *ret_len)
{
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	for (;;) {
		if (len == cap) {
			if (cap > max) {
				free(buf);
				return -E2BIG;
			}
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t n = read(STDIN_FILENO, buf + len, cap - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			int e = -errno;
			free(buf);
			return e;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	if (len > max) {
		free(buf);
		return -E2BIG;
	}
	*ret = buf;
	*ret_len = len;
	return 0;
}

/* The text operand: words joined by spaces, or stdin for none or "-". */
#define MAX_INPUT_BYTES (64u << 20)
static int input_text(int argc, char **argv, char **ret, size_t *ret_len)
{
	if (argc == 0 || (argc == 1 && strcmp(argv[0], "-") == 0))
		return read_stdin(MAX_INPUT_BYTES, ret, ret_len);
	size_t len = 0;
	for (int i = 0; i < argc; i++)
		len += strlen(argv[i]) + 1;
	char *buf = malloc(len + 1), *p = buf;
	if (!buf)
		return -ENOMEM;
	for (int i = 0; i < argc; i++) {
		if (i)
			*p++ = ' ';
		size_t n = strlen(argv[i]);
		memcpy(p, argv[i], n);
		p += n;
	}
	*p = 0;
	*ret = buf;
	*ret_len = (size_t)(p - buf);
	return 0;
}

/* ---- JSON output ------------------------------------------------------------------ */

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t k;
	uint32_t cp;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		k = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		k = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		k = 4, cp = c & 0x07;
	else
		return 0;
	if (n < k)
		return 0;
	for (size_t i = 1; i < k; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((k == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)))
		return 0;
	return k;
}

/* A JSON string; invalid UTF-8 bytes become U+FFFD. */
static void json_str(FILE *f, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	fputc('"', f);
	for (size_t i = 0; i < n;) {
		unsigned c = p[i];
		switch (c) {
		case '"': fputs("\\\"", f); i++; continue;
		case '\\': fputs("\\\\", f); i++; continue;
		case '\n': fputs("\\n", f); i++; continue;
		case '\r': fputs("\\r", f); i++; continue;
		case '\t': fputs("\\t", f); i++; continue;
		}
		if (c < 0x20 || c == 0x7f) {
			fprintf(f, "\\u%04x", c);
			i++;
			continue;
		}
		size_t k = utf8_len(p + i, n - i);
		if (k == 0) {
			fputs("\\ufffd", f);
			i++;
			continue;
		}
		fwrite(p + i, 1, k, f);
		i += k;
	}
	fputc('"', f);
}

/* ---- connecting ---------------------------------------------------------------------- */

static int connect_daemon(const struct ctx *x, kvc_client **ret)
{
	int r = kvc_connect(x->socket, ret);
	if (r < 0) {
		const char *path = x->socket ? x->socket : getenv(KVC_SOCKET_ENV);
		if (!path || !*path)
			path = KVC_DEFAULT_SOCKET;
		log_err("cannot connect to kvd at %s: %s", path, kv_strerror(r));
		if (r == -ENOENT || r == -ECONNREFUSED)
			fprintf(stderr, "       is kvd running? (systemctl start kvd, or set KVD_SOCKET)\n");
		return exit_for(r);
	}
	if (x->timeout_s >= 0)
		kvc_set_timeout(*ret, x->timeout_s * 1000 > INT_MAX ? INT_MAX : (int)(x->timeout_s * 1000));
	return 0;
}

/* Options every command accepts. Returns 1 if handled, -1 on a bad value. */
enum { OPT_SOCKET = 1000, OPT_TIMEOUT, OPT_FIRST_CMD };

static int common_opt(struct ctx *x, const char *cmd, int opt, const char *arg)
{
	switch (opt) {
	case OPT_SOCKET:
		x->socket = arg;
		return 1;
	case OPT_TIMEOUT:
		if (!parse_double(arg, &x->timeout_s) || x->timeout_s < 0)
			return usage_error(cmd, "--timeout: '%s' is not a number of seconds", arg), -1;
		return 1;
	}
	return 0;
}

#define COMMON_LONGOPTS                                                                                     \
	{ "socket", required_argument, NULL, OPT_SOCKET }, { "timeout", required_argument, NULL, OPT_TIMEOUT }, \
		{ "help", no_argument, NULL, 'h' }

/* ---- generate ----------------------------------------------------------------------------- */

static const char help_generate[] =
	"NAME\n"
	"    kvctl generate - generate text with the model loaded in kvd\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl generate [OPTIONS] [PROMPT...]\n"
	"    echo PROMPT | kvctl generate [OPTIONS] [-]\n"
	"\n"
	"DESCRIPTION\n"
	"    Sends PROMPT (the arguments joined by spaces; standard input when there are\n"
	"    none or the only one is \"-\") to kvd and streams the generated text to\n"
	"    standard output as it is produced. By default the prompt is a user message\n"
	"    rendered with the model's chat template, and the answer is the assistant's\n"
	"    reply; --raw completes the text exactly as given instead.\n"
	"\n"
	"    Ctrl-C cancels the generation (the daemon frees its memory at once) and exits\n"
	"    with status 130. Unless -n is given, a newline is printed after text that does\n"
	"    not end with one.\n"
	"\n"
	"OPTIONS\n"
	"    --raw                plain completion: no chat template\n"
	"    --system TEXT        system message for the chat template (not with --raw)\n"
	"    --max-tokens N       generate at most N tokens (default 256)\n"
	"    --temperature T      sampling temperature; 0 means greedy, deterministic\n"
	"                         decoding (default 0.8)\n"
	"    --top-p P            nucleus sampling: keep the likeliest tokens whose\n"
	"                         probabilities add up to P, 0 < P <= 1; 1 is off\n"
	"                         (default 0.95)\n"
	"    --top-k K            keep only the K likeliest tokens; 0 is off (default 40)\n"
	"    --min-p P            drop tokens less likely than P times the likeliest one,\n"
	"                         0 <= P < 1; 0 is off (default 0.05)\n"
	"    --repeat-penalty R   penalize tokens seen in the last 64; 1 is off (default)\n"
	"    --seed N             sampling seed, for reproducible output (default: random)\n"
	"    --stop STRING        stop when STRING is generated (it is not printed);\n"
	"                         repeatable, up to 8 strings of up to 256 bytes\n"
	"    --session ID         continue session ID (see 'kvctl session'): the daemon\n"
	"                         keeps the conversation's KV cache, so only the new turn\n"
	"                         is processed\n"
	"    --json               print nothing while generating; at the end print one JSON\n"
	"                         object: {\"text\", \"token_ids\", \"finish_reason\",\n"
	"                         \"prompt_tokens\", \"cached_tokens\", \"generated_tokens\",\n"
	"                         \"ttft_ms\", \"tokens_per_s\", \"total_ms\", \"model\"}.\n"
	"                         ttft_ms is the time from the daemon receiving the request\n"
	"                         to the first token; tokens_per_s the decode speed after\n"
	"                         the first token. On failure the object has an \"error\"\n"
	"                         member {\"code\", \"message\"} instead.\n"
	"    -n, --no-newline     do not add a final newline\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl generate \"Why is the sky blue?\"\n"
	"    kvctl generate --raw --temperature 0 --max-tokens 20 \"The capital of France is\"\n"
	"    git diff | kvctl generate --system \"Write a commit message.\" --json | jq -r .text\n";

/* What a SIGINT handler needs: set while a request runs. */
static kvc_client *volatile g_sig_client;
static volatile uint64_t g_sig_request;
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	g_interrupted = 1;
	kvc_client *c = g_sig_client;
	uint64_t id = g_sig_request;
	if (c && id)
		kvc_cancel(c, id); /* async-signal-safe */
}

static void install_sigint(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;
	sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C kills at once */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN); /* write errors are reported, not fatal */
}

struct gen_out {
	bool json;
	char *text;
	size_t len, cap;
	int32_t *ids;
	size_t n_ids, cap_ids;
	bool last_nl;
	int io_error;
};

static int append(void **buf, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap : 256;
	while (nc < need)
		nc *= 2;
	void *nb = realloc(*buf, nc * elem);
	if (!nb)
		return -ENOMEM;
	*buf = nb;
	*cap = nc;
	return 0;
}

static int gen_event(struct gen_out *o, const struct kvc_event *ev)
{
	if (o->json) {
		if (append((void **)&o->text, &o->cap, o->len + ev->text_len + 1, 1) < 0)
			return -ENOMEM;
		memcpy(o->text + o->len, ev->text, ev->text_len);
		o->len += ev->text_len;
		if (ev->ids) {
			if (append((void **)&o->ids, &o->cap_ids, o->n_ids + ev->n_tokens, sizeof(int32_t)) < 0)
				return -ENOMEM;
			memcpy(o->ids + o->n_ids, ev->ids, ev->n_tokens * sizeof(int32_t));
			o->n_ids += ev->n_tokens;
		}
		return 0;
	}
	if (ev->text_len == 0)
		return 0;
	if (fwrite(ev->text, 1, ev->text_len, stdout) != ev->text_len || fflush(stdout) != 0)
		return -errno ? -errno : -EIO;
	o->last_nl = ev->text[ev->text_len - 1] == '\n';
	return 0;
}

static double ms(uint64_t ns)
{
	return (double)ns / 1e6;
}

static void print_gen_json(const struct gen_out *o, const struct kvc_result *res, int code, const char *model)
{
	FILE *f = stdout;
	fputs("{\"text\":", f);
	json_str(f, o->text ? o->text : "", o->len);
	fputs(",\"token_ids\":[", f);
	for (size_t i = 0; i < o->n_ids; i++)
		fprintf(f, "%s%" PRId32, i ? "," : "", o->ids[i]);
	fputs("]", f);
	if (res) {
		double tps = res->generated_tokens > 1 && res->decode_ns
				     ? (double)(res->generated_tokens - 1) * 1e9 / (double)res->decode_ns
				     : 0.0;
		fprintf(f,
			",\"finish_reason\":\"%s\",\"prompt_tokens\":%" PRIu32 ",\"cached_tokens\":%" PRIu32
			",\"generated_tokens\":%" PRIu32 ",\"ttft_ms\":%.3f,\"tokens_per_s\":%.2f,\"queue_ms\":%.3f"
			",\"total_ms\":%.3f",
			kvc_finish_name(res->finish_reason), res->prompt_tokens, res->cached_tokens,
			res->generated_tokens, ms(res->ttft_ns), tps, ms(res->queue_ns), ms(res->total_ns));
	}
	if (model) {
		fputs(",\"model\":", f);
		json_str(f, model, strlen(model));
	}
	if (code < 0 && code != -ECANCELED) {
		const char *m = res && res->error_message[0] ? res->error_message : kv_strerror(code);
		fprintf(f, ",\"error\":{\"code\":%d,\"message\":", code);
		json_str(f, m, strlen(m));
		fputs("}", f);
	}
	fputs("}\n", f);
}

static int cmd_generate(struct ctx *x, int argc, char **argv)
{
	enum { O_RAW = OPT_FIRST_CMD, O_SYSTEM, O_MAX, O_TEMP, O_TOPP, O_TOPK, O_MINP, O_REP, O_SEED, O_STOP,
	       O_SESSION, O_JSON };
	static const struct option longopts[] = {
		{ "raw", no_argument, NULL, O_RAW },
		{ "system", required_argument, NULL, O_SYSTEM },
		{ "max-tokens", required_argument, NULL, O_MAX },
		{ "temperature", required_argument, NULL, O_TEMP },
		{ "top-p", required_argument, NULL, O_TOPP },
		{ "top-k", required_argument, NULL, O_TOPK },
		{ "min-p", required_argument, NULL, O_MINP },
		{ "repeat-penalty", required_argument, NULL, O_REP },
		{ "seed", required_argument, NULL, O_SEED },
		{ "stop", required_argument, NULL, O_STOP },
		{ "session", required_argument, NULL, O_SESSION },
		{ "json", no_argument, NULL, O_JSON },
		{ "no-newline", no_argument, NULL, 'n' },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "generate";
	struct kvc_gen_params p;
	const char *stops[8];
	size_t n_stop = 0;
	bool json = false, newline = true;
	double d;
	uint32_t u;
	int o, r;

	kvc_gen_params_init(&p);
	while ((o = getopt_long(argc, argv, "hn", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_generate, stdout);
			return EXIT_OK;
		case 'n':
			newline = false;
			break;
		case O_RAW:
			p.flags |= KVC_GEN_RAW;
			break;
		case O_SYSTEM:
			p.system = optarg;
			break;
		case O_MAX:
			if (!parse_u32(optarg, &p.max_tokens) || p.max_tokens == 0)
				return usage_error(cmd, "--max-tokens: '%s' is not a positive integer", optarg);
			break;
		case O_TEMP:
			if (!parse_double(optarg, &d) || d < 0)
				return usage_error(cmd, "--temperature: '%s' is not a number >= 0", optarg);
			p.temperature = (float)d;
			break;
		case O_TOPP:
			if (!parse_double(optarg, &d) || d <= 0 || d > 1)
				return usage_error(cmd, "--top-p: '%s' is not in (0, 1]", optarg);
			p.top_p = (float)d;
			break;
		case O_TOPK:
			if (!parse_u32(optarg, &u) || u > INT32_MAX)
				return usage_error(cmd, "--top-k: '%s' is not an integer >= 0", optarg);
			p.top_k = (int32_t)u;
			break;
		case O_MINP:
			if (!parse_double(optarg, &d) || d < 0 || d >= 1)
				return usage_error(cmd, "--min-p: '%s' is not in [0, 1)", optarg);
			p.min_p = (float)d;
			break;
		case O_REP:
			if (!parse_double(optarg, &d) || d <= 0)
				return usage_error(cmd, "--repeat-penalty: '%s' is not a number > 0", optarg);
			p.repeat_penalty = (float)d;
			break;
		case O_SEED:
			if (!parse_u64(optarg, &p.seed) || p.seed == KVC_SEED_RANDOM)
				return usage_error(cmd, "--seed: '%s' is not an integer below 2^64-1", optarg);
			break;
		case O_STOP:
			if (n_stop == 8)
				return usage_error(cmd, "--stop: at most 8 stop strings");
			if (!*optarg || strlen(optarg) > 256)
				return usage_error(cmd, "--stop: strings must be 1 to 256 bytes long");
			stops[n_stop++] = optarg;
			break;
		case O_SESSION:
			if (!parse_u64(optarg, &p.session_id) || p.session_id == 0)
				return usage_error(cmd, "--session: '%s' is not a session id", optarg);
			break;
		case O_JSON:
			json = true;
			break;
		default:
			return usage_error(cmd, "unknown option");
		}
	}
	if (p.system && (p.flags & KVC_GEN_RAW))
		return usage_error(cmd, "--system needs the chat template: drop --raw");
	p.stop = stops;
	p.n_stop = n_stop;
	if (json)
		p.flags |= KVC_GEN_WANT_IDS;

	char *prompt;
	size_t len;
	r = input_text(argc - optind, argv + optind, &prompt, &len);
	if (r < 0) {
		log_err("reading the prompt: %s", kv_strerror(r));
		return r == -E2BIG ? EXIT_REJECTED : EXIT_IO;
	}
	if (len == 0) {
		free(prompt);
		return usage_error(cmd, "the prompt is empty");
	}

	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0) {
		free(prompt);
		return r;
	}
	install_sigint();
	struct gen_out out = { .json = json, .last_nl = true };
	kvc_request *q;
	r = kvc_request_start(c, prompt, len, &p, &q);
	free(prompt);
	if (r < 0) {
		if (json)
			print_gen_json(&out, NULL, r, kvc_server_info(c)->model_name);
		int st = fail(c, "generate", r);
		kvc_close(c);
		return st;
	}
	/* Publish the request to the SIGINT handler; signals arriving before
	 * this point just set g_interrupted, which is checked below. */
	g_sig_request = kvc_request_id(q);
	g_sig_client = c;
	if (g_interrupted)
		kvc_cancel(c, kvc_request_id(q));

	const struct kvc_event *ev;
	while ((r = kvc_request_next(q, &ev)) == 1) {
		if (out.io_error)
			continue;
		int e = gen_event(&out, ev);
		if (e < 0) {
			out.io_error = e;
			kvc_cancel(c, kvc_request_id(q));
		}
	}
	g_sig_client = NULL;
	g_sig_request = 0;

	const struct kvc_result *res = kvc_request_result(q);
	int status;
	if (out.io_error) {
		if (out.io_error != -EPIPE) /* a closed pipe (| head) is not worth a message */
			log_err("writing the output: %s", kv_strerror(out.io_error));
		status = EXIT_IO;
	} else if (json) {
		print_gen_json(&out, res, r, kvc_server_info(c)->model_name);
		status = r < 0 ? exit_for(r) : EXIT_OK;
		if (fflush(stdout) != 0)
			status = EXIT_IO;
	} else {
		if (newline && !out.last_nl)
			fputc('\n', stdout);
		status = fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
		if (r == -ECANCELED) {
			status = EXIT_CANCELLED;
		} else if (r < 0) {
			if (res && res->error_message[0])
				log_err("generate: %s (%s)", kv_strerror(r), res->error_message);
			else
				log_err("generate: %s", kv_strerror(r));
			status = exit_for(r);
		}
	}
	if (json && r == -ECANCELED)
		status = EXIT_CANCELLED;
	kvc_request_finish(q);
	kvc_close(c);
	free(out.text);
	free(out.ids);
	return status;
}

/* ---- stats --------------------------------------------------------------------------------- */

static const char help_stats[] =
	"NAME\n"
	"    kvctl stats - show kvd's KV-cache pages and scheduler counters\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl stats [--json] [--watch [SECS]]\n"
	"\n"
	"DESCRIPTION\n"
	"    The KV cache is a pool of fixed-size pages (block_size tokens each). A page is\n"
	"    free, used by one or more sequences (shared when by two or more: common\n"
	"    prefixes are stored once), or cached: no longer used but kept so that a later\n"
	"    prompt with the same prefix reuses it. Swapped counts pages' worth of\n"
	"    sequences written to the swap file under memory pressure. Slack is the unused\n"
	"    tail of partly filled pages: the only waste of paging.\n"
	"\n"
	"    The table shows the pool in pages and bytes, the KV bytes one token costs, the\n"
	"    prefix cache's hit rate (prompt tokens found / looked up), slack, and how many\n"
	"    requests run, wait for memory, or are swapped out.\n"
	"\n"
	"OPTIONS\n"
	"    --json          print one JSON object with integer members pages_total,\n"
	"                    pages_free, pages_used, pages_shared, pages_cached,\n"
	"                    pages_swapped, page_bytes, block_size, kv_bytes_per_token,\n"
	"                    pool_bytes, tokens_resident, slack_tokens, prefix_lookups,\n"
	"                    prefix_query_tokens, prefix_hit_tokens, pages_evicted,\n"
	"                    cow_copies, swap_out_pages, swap_in_pages, swap_bytes,\n"
	"                    requests_running, requests_waiting, requests_swapped,\n"
	"                    requests_completed, requests_rejected, clients, sessions,\n"
	"                    prompt_tokens_total, generated_tokens_total, steps, uptime_ns,\n"
	"                    ledger_records_dropped, swap_errors, swap_fallback_recomputes,\n"
	"                    and the strings model and server_version\n"
	"    --watch [SECS]  repeat every SECS seconds (default 1) until interrupted; with\n"
	"                    --json, one object per line\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl stats\n"
	"    kvctl stats --json | jq .pages_shared\n"
	"    kvctl stats --watch 0.5\n";

static void print_stats_json(const struct kvc_stats *s, const struct kvc_info *i)
{
	char v[32];
#define F(name) fprintf(stdout, "\"" #name "\":%" PRIu64 ",", s->name)
	fputc('{', stdout);
	F(pages_total); F(pages_free); F(pages_used); F(pages_shared); F(pages_cached); F(pages_swapped);
	F(page_bytes); F(block_size); F(kv_bytes_per_token); F(pool_bytes); F(tokens_resident); F(slack_tokens);
	F(prefix_lookups); F(prefix_query_tokens); F(prefix_hit_tokens); F(pages_evicted); F(cow_copies);
	F(swap_out_pages); F(swap_in_pages); F(swap_bytes); F(requests_running); F(requests_waiting);
	F(requests_swapped); F(requests_completed); F(requests_rejected); F(clients); F(sessions);
	F(prompt_tokens_total); F(generated_tokens_total); F(steps); F(uptime_ns);
	F(ledger_records_dropped); F(swap_errors); F(swap_fallback_recomputes);
#undef F
	fputs("\"model\":", stdout);
	json_str(stdout, i->model_name, strlen(i->model_name));
	fmt_version(v, sizeof(v), i->server_version);
	fprintf(stdout, ",\"server_version\":\"%s\"}\n", v);
}

static double pct(uint64_t a, uint64_t b)
{
	return b ? 100.0 * (double)a / (double)b : 0.0;
}

static void print_stats_table(const struct kvc_stats *s, const struct kvc_info *i)
{
	char b1[32], b2[32], b3[32], v[32];
	uint64_t up = s->uptime_ns / 1000000000u;

	fmt_version(v, sizeof(v), i->server_version);
	printf("kvd %s, model %s, up %" PRIu64 "h%02" PRIu64 "m%02" PRIu64 "s\n", v, i->model_name, up / 3600,
	       (up / 60) % 60, up % 60);
	fmt_bytes(b1, sizeof(b1), (double)s->page_bytes);
	fmt_bytes(b2, sizeof(b2), (double)s->pages_total * (double)s->page_bytes);
	fmt_bytes(b3, sizeof(b3), (double)s->kv_bytes_per_token);
	printf("KV pool   %" PRIu64 " pages x %s = %s   (%" PRIu64 " tokens/page, %s per token)\n", s->pages_total, b1,
	       b2, s->block_size, b3);
	printf("          %10s %8s %12s\n", "pages", "share", "bytes");
	struct {
		const char *name;
		uint64_t n;
	} rows[] = {
		{ "free", s->pages_free },     { "used", s->pages_used },     { "  shared", s->pages_shared },
		{ "cached", s->pages_cached }, { "swapped", s->pages_swapped },
	};
	for (size_t k = 0; k < sizeof(rows) / sizeof(rows[0]); k++) {
		fmt_bytes(b1, sizeof(b1), (double)rows[k].n * (double)s->page_bytes);
		if (k == 4)
			printf("  %-8s%10" PRIu64 " %8s %12s   (in the swap file)\n", rows[k].name, rows[k].n, "", b1);
		else
			printf("  %-8s%10" PRIu64 " %7.1f%% %12s\n", rows[k].name, rows[k].n, pct(rows[k].n, s->pages_total),
			       b1);
	}
	fmt_bytes(b1, sizeof(b1), (double)s->slack_tokens * (double)s->kv_bytes_per_token);
	printf("tokens    %" PRIu64 " resident; slack %" PRIu64 " token slots (%s) in partly filled pages\n",
	       s->tokens_resident, s->slack_tokens, b1);
	printf("prefix    %" PRIu64 " of %" PRIu64 " prompt tokens found in the cache (%.1f%%), %" PRIu64
	       " lookups; %" PRIu64 " pages evicted, %" PRIu64 " copy-on-write copies\n",
	       s->prefix_hit_tokens, s->prefix_query_tokens, pct(s->prefix_hit_tokens, s->prefix_query_tokens),
	       s->prefix_lookups, s->pages_evicted, s->cow_copies);
	fmt_bytes(b1, sizeof(b1), (double)s->swap_bytes);
	printf("swap      %" PRIu64 " pages out, %" PRIu64 " in; file %s; %" PRIu64 " I/O errors, %" PRIu64
	       " requests recomputed after them\n",
	       s->swap_out_pages, s->swap_in_pages, b1, s->swap_errors, s->swap_fallback_recomputes);
	printf("requests  %" PRIu64 " running, %" PRIu64 " waiting, %" PRIu64 " swapped; %" PRIu64 " completed, %" PRIu64
	       " rejected\n",
	       s->requests_running, s->requests_waiting, s->requests_swapped, s->requests_completed,
	       s->requests_rejected);
	printf("clients   %" PRIu64 " connected, %" PRIu64 " sessions; %" PRIu64 " prompt and %" PRIu64
	       " generated tokens in %" PRIu64 " steps\n",
	       s->clients, s->sessions, s->prompt_tokens_total, s->generated_tokens_total, s->steps);
	if (s->ledger_records_dropped)
		printf("ledger    %" PRIu64 " records could not be written (see kvd's log)\n", s->ledger_records_dropped);
}

static void sleep_s(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !g_interrupted)
		;
}

static int cmd_stats(struct ctx *x, int argc, char **argv)
{
	enum { O_JSON = OPT_FIRST_CMD, O_WATCH };
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, O_JSON },
		{ "watch", optional_argument, NULL, O_WATCH },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "stats";
	bool json = false;
	double watch = 0;
	int o, r;

	while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_stats, stdout);
			return EXIT_OK;
		case O_JSON:
			json = true;
			break;
		case O_WATCH:
			watch = 1;
			if (optarg) {
				if (!parse_double(optarg, &watch) || watch <= 0)
					return usage_error(cmd, "--watch: '%s' is not a number of seconds > 0", optarg);
			} else if (optind < argc && parse_double(argv[optind], &watch)) {
				if (watch <= 0)
					return usage_error(cmd, "--watch: '%s' is not a number of seconds > 0", argv[optind]);
				optind++;
			}
			break;
		default:
			return usage_error(cmd, "unknown option");
		}
	}
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);

	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	if (watch > 0) {
		struct sigaction sa = { .sa_handler = on_sigint };
		sigemptyset(&sa.sa_mask);
		sigaction(SIGINT, &sa, NULL);
	}
	bool tty = isatty(STDOUT_FILENO);
	int status = EXIT_OK;
	do {
		struct kvc_stats s;
		r = kvc_stats(c, &s);
		if (r < 0) {
			if (g_interrupted)
				break;
			status = fail(c, "stats", r);
			break;
		}
		if (json) {
			print_stats_json(&s, kvc_server_info(c));
		} else {
			if (watch > 0 && tty)
				fputs("\033[H\033[2J", stdout);
			else if (watch > 0)
				fputs("\n", stdout);
			print_stats_table(&s, kvc_server_info(c));
		}
		if (fflush(stdout) != 0) {
			status = EXIT_IO;
			break;
		}
		if (watch > 0)
			sleep_s(watch);
	} while (watch > 0 && !g_interrupted);
	kvc_close(c);
	return status;
}

/* ---- tokenize and count ----------------------------------------------------------------------- */

static const char help_tokenize[] =
	"NAME\n"
	"    kvctl tokenize - show the token ids the model's tokenizer gives a text\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl tokenize [--bos] [--special] [--json] [TEXT... | -]\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes TEXT (the arguments joined by spaces; standard input when there are\n"
	"    none or the only one is \"-\") with the tokenizer of the model loaded in kvd\n"
	"    and prints the ids on one line, separated by spaces. No chat template is\n"
	"    applied.\n"
	"\n"
	"OPTIONS\n"
	"    --bos       prepend the model's beginning-of-sequence token, if it has one\n"
	"    --special   recognise special-token texts such as <|im_start|> as single tokens\n"
	"                (without it they are tokenized as plain text)\n"
	"    --json      print {\"tokens\": [ids...], \"count\": N}\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl tokenize \"Hello, world\"\n"
	"    kvctl tokenize --special '<|im_start|>user'\n";

static const char help_count[] =
	"NAME\n"
	"    kvctl count - count the tokens of a text with the model's tokenizer\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl count [--bos] [--special] [--json] [TEXT... | -]\n"
	"\n"
	"DESCRIPTION\n"
	"    Prints how many tokens TEXT (the arguments joined by spaces; standard input\n"
	"    when there are none or the only one is \"-\") takes for the model loaded in\n"
	"    kvd. No chat template is applied: a chat prompt costs a few tokens more.\n"
	"\n"
	"OPTIONS\n"
	"    --bos       count the beginning-of-sequence token too, if the model has one\n"
	"    --special   recognise special-token texts as single tokens\n"
	"    --json      print {\"count\": N, \"bytes\": B}\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl count < README.md\n";

static int cmd_tokenize(struct ctx *x, int argc, char **argv, bool count)
{
	enum { O_BOS = OPT_FIRST_CMD, O_SPECIAL, O_JSON };
	static const struct option longopts[] = {
		{ "bos", no_argument, NULL, O_BOS },
		{ "special", no_argument, NULL, O_SPECIAL },
		{ "json", no_argument, NULL, O_JSON },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = count ? "count" : "tokenize";
	unsigned flags = 0;
	bool json = false;
	int o, r;

	while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(count ? help_count : help_tokenize, stdout);
			return EXIT_OK;
		case O_BOS:
			flags |= KVC_TOK_ADD_BOS;
			break;
		case O_SPECIAL:
			flags |= KVC_TOK_PARSE_SPECIAL;
			break;
		case O_JSON:
			json = true;
			break;
		default:
			return usage_error(cmd, "unknown option");
		}
	}
	char *text;
	size_t len;
	r = input_text(argc - optind, argv + optind, &text, &len);
	if (r < 0) {
		log_err("reading the text: %s", kv_strerror(r));
		return r == -E2BIG ? EXIT_REJECTED : EXIT_IO;
	}
	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0) {
		free(text);
		return r;
	}
	int status = EXIT_OK;
	if (count) {
		size_t n;
		r = kvc_count_tokens(c, text, len, flags, &n);
		if (r < 0)
			status = fail(c, cmd, r);
		else if (json)
			printf("{\"count\":%zu,\"bytes\":%zu}\n", n, len);
		else
			printf("%zu\n", n);
	} else {
		int32_t *ids;
		size_t n;
		r = kvc_tokenize(c, text, len, flags, &ids, &n);
		if (r < 0) {
			status = fail(c, cmd, r);
		} else {
			fputs(json ? "{\"tokens\":[" : "", stdout);
			for (size_t i = 0; i < n; i++)
				printf("%s%" PRId32, i ? (json ? "," : " ") : "", ids[i]);
			if (json)
				printf("],\"count\":%zu}\n", n);
			else
				fputc('\n', stdout);
			kvc_free(ids);
		}
	}
	if (fflush(stdout) != 0 && status == EXIT_OK)
		status = EXIT_IO;
	free(text);
	kvc_close(c);
	return status;
}

/* ---- plan ---------------------------------------------------------------------------------------- */

static const char help_plan[] =
	"NAME\n"
	"    kvctl plan - the KV-cache capacity bill of a model\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl plan [--context N] [--memory SIZE] [--json]\n"
	"    kvctl plan --layers N --kv-heads N --head-dim N [--dtype-bytes B]\n"
	"               [--block-size N] [--context N] [--memory SIZE] [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    Every token a sequence holds costs, in every layer, one key and one value\n"
	"    vector per KV head:\n"
	"\n"
	"        KV bytes per token = 2 x layers x kv_heads x head_dim x bytes_per_element\n"
	"\n"
	"    kvd stores them in pages of block-size tokens, allocated as a sequence grows,\n"
	"    so a request of C tokens of context holds ceil(C / block) pages, and a memory\n"
	"    budget M holds floor(M / page bytes) pages, i.e. that many pages divided by\n"
	"    the pages of one request concurrent sequences at full length. Models with\n"
	"    grouped-query attention (fewer KV heads than attention heads) are cheaper.\n"
	"\n"
	"    Without the model options, the figures are those of the model loaded in kvd,\n"
	"    the context defaults to its context length and the budget to its KV pool.\n"
	"    With --layers, --kv-heads and --head-dim no daemon is needed; the context\n"
	"    then defaults to 4096 and, without --memory, budgets of 1, 4, 16 and 64 GiB\n"
	"    are shown.\n"
	"\n"
	"OPTIONS\n"
	"    --layers N       transformer layers\n"
	"    --kv-heads N     key/value heads per layer\n"
	"    --head-dim N     dimension of one head\n"
	"    --dtype-bytes B  bytes per K or V element: 2 for F16/BF16 (default), 4 for F32,\n"
	"                     1 for 8-bit caches\n"
	"    --block-size N   tokens per page (default 16, or the daemon's)\n"
	"    --context N      tokens of context per request (prompt + generated)\n"
	"    --memory SIZE    memory for the KV cache: bytes, or with a K, M, G or T suffix\n"
	"                     (powers of 1024; KiB, MB and the like are accepted too)\n"
	"    --json           print {\"kv_bytes_per_token\", \"page_bytes\", \"block_size\",\n"
	"                     \"context_tokens\", \"pages_per_request\",\n"
	"                     \"bytes_per_request\", \"budgets\": [{\"memory_bytes\",\n"
	"                     \"pages\", \"sequences\"}...]}\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl plan\n"
	"    kvctl plan --context 32768\n"
	"    kvctl plan --layers 32 --kv-heads 8 --head-dim 128 --context 8192 --memory 24G\n";

static int cmd_plan(struct ctx *x, int argc, char **argv)
{
	enum { O_LAYERS = OPT_FIRST_CMD, O_KVH, O_HDIM, O_DTYPE, O_BLOCK, O_CTX, O_MEM, O_JSON };
	static const struct option longopts[] = {
		{ "layers", required_argument, NULL, O_LAYERS },
		{ "kv-heads", required_argument, NULL, O_KVH },
		{ "head-dim", required_argument, NULL, O_HDIM },
		{ "dtype-bytes", required_argument, NULL, O_DTYPE },
		{ "block-size", required_argument, NULL, O_BLOCK },
		{ "context", required_argument, NULL, O_CTX },
		{ "memory", required_argument, NULL, O_MEM },
		{ "json", no_argument, NULL, O_JSON },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "plan";
	uint32_t layers = 0, kvh = 0, hdim = 0, dtype = 0, block = 0, ctx = 0;
	uint64_t mem = 0;
	bool json = false;
	int o, r;

	while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		uint32_t *dst = NULL;
		const char *name = NULL;
		switch (o) {
		case 'h':
			fputs(help_plan, stdout);
			return EXIT_OK;
		case O_LAYERS: dst = &layers; name = "--layers"; break;
		case O_KVH: dst = &kvh; name = "--kv-heads"; break;
		case O_HDIM: dst = &hdim; name = "--head-dim"; break;
		case O_DTYPE: dst = &dtype; name = "--dtype-bytes"; break;
		case O_BLOCK: dst = &block; name = "--block-size"; break;
		case O_CTX: dst = &ctx; name = "--context"; break;
		case O_MEM:
			if (!parse_size(optarg, &mem) || mem == 0)
				return usage_error(cmd, "--memory: '%s' is not a size (e.g. 512M, 24G)", optarg);
			break;
		case O_JSON:
			json = true;
			break;
		default:
			return usage_error(cmd, "unknown option");
		}
		if (dst && (!parse_u32(optarg, dst) || *dst == 0 || *dst > (1u << 24)))
			return usage_error(cmd, "%s: '%s' is not an integer in 1..16777216", name, optarg);
	}
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);

	bool given = layers || kvh || hdim;
	char model[80] = "";
	if (given) {
		if (!layers || !kvh || !hdim)
			return usage_error(cmd, "--layers, --kv-heads and --head-dim go together");
		if (!dtype)
			dtype = 2;
		if (!block)
			block = 16;
		if (!ctx)
			ctx = 4096;
		snprintf(model, sizeof(model), "given");
	} else {
		if (dtype)
			return usage_error(cmd, "--dtype-bytes needs --layers, --kv-heads and --head-dim");
		kvc_client *c;
		if ((r = connect_daemon(x, &c)) != 0)
			return r;
		const struct kvc_info *i = kvc_server_info(c);
		layers = i->n_layers;
		kvh = i->n_kv_heads;
		hdim = i->head_dim;
		dtype = i->kv_dtype_bytes;
		if (!block)
			block = i->block_size;
		if (!ctx)
			ctx = i->n_ctx;
		if (!mem)
			mem = i->pool_bytes;
		snprintf(model, sizeof(model), "%s", i->model_name);
		kvc_close(c);
		if (!layers || !kvh || !hdim || !dtype || !block || !ctx) {
			log_err("plan: the daemon did not describe its model's KV layout");
			return EXIT_FAIL;
		}
	}

	/* All factors are at most 2^24 and the product is kept in 128 bits'
	 * worth of checks: overflow is reported, never wrapped. */
	uint64_t per_token, page_bytes, pages_per_req, req_bytes;
	if (__builtin_mul_overflow((uint64_t)2 * layers * kvh, (uint64_t)hdim * dtype, &per_token) ||
	    __builtin_mul_overflow(per_token, (uint64_t)block, &page_bytes)) {
		log_err("plan: these figures overflow 64 bits");
		return EXIT_USAGE;
	}
	pages_per_req = ((uint64_t)ctx + block - 1) / block;
	if (__builtin_mul_overflow(pages_per_req, page_bytes, &req_bytes)) {
		log_err("plan: these figures overflow 64 bits");
		return EXIT_USAGE;
	}
	uint64_t budgets[4];
	size_t n_budgets = 0;
	if (mem)
		budgets[n_budgets++] = mem;
	else
		for (int k = 0; k < 4; k++)
			budgets[n_budgets++] = (1ull << 30) << (2 * k);

	char b1[32], b2[32], b3[32];
	if (json) {
		printf("{\"model\":");
		json_str(stdout, model, strlen(model));
		printf(",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"dtype_bytes\":%u,\"kv_bytes_per_token\":%" PRIu64
		       ",\"block_size\":%u,\"page_bytes\":%" PRIu64 ",\"context_tokens\":%u,\"pages_per_request\":%" PRIu64
		       ",\"bytes_per_request\":%" PRIu64 ",\"budgets\":[",
		       layers, kvh, hdim, dtype, per_token, block, page_bytes, ctx, pages_per_req, req_bytes);
		for (size_t k = 0; k < n_budgets; k++) {
			uint64_t pages = budgets[k] / page_bytes;
			printf("%s{\"memory_bytes\":%" PRIu64 ",\"pages\":%" PRIu64 ",\"sequences\":%" PRIu64 "}",
			       k ? "," : "", budgets[k], pages, pages / pages_per_req);
		}
		printf("]}\n");
	} else {
		fmt_bytes(b1, sizeof(b1), (double)per_token);
		printf("model              %s\n", model);
		printf("KV per token       2 x %u layers x %u KV heads x %u dims x %u bytes = %" PRIu64 " B (%s)\n", layers,
		       kvh, hdim, dtype, per_token, b1);
		fmt_bytes(b1, sizeof(b1), (double)page_bytes);
		printf("page               %u tokens = %" PRIu64 " B (%s)\n", block, page_bytes, b1);
		fmt_bytes(b1, sizeof(b1), (double)req_bytes);
		fmt_bytes(b2, sizeof(b2), (double)ctx * (double)per_token);
		printf("per request        %u tokens -> %" PRIu64 " pages = %s", ctx, pages_per_req, b1);
		if ((uint64_t)ctx != pages_per_req * block) /* the last page is partly empty */
			printf(" (%s hold tokens)", b2);
		fputc('\n', stdout);
		for (size_t k = 0; k < n_budgets; k++) {
			uint64_t pages = budgets[k] / page_bytes;
			fmt_bytes(b3, sizeof(b3), (double)budgets[k]);
			printf("%-18s %s -> %" PRIu64 " pages -> %" PRIu64 " sequences of %u tokens\n",
			       k == 0 ? "budget" : "", b3, pages, pages / pages_per_req, ctx);
		}
	}
	return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
}

/* ---- ps -------------------------------------------------------------------------------------------- */

static const char help_ps[] =
	"NAME\n"
	"    kvctl ps - list the requests live in kvd and the KV pages they hold\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl ps [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    One line per request of any client: the client's id (as kvd numbers its\n"
	"    connections) and the request's id within it, the client's pid and uid, the\n"
	"    state (uploading its prompt, waiting for memory, prefill, running, swapped),\n"
	"    prompt tokens and how many of them came from the prefix cache or session,\n"
	"    tokens generated out of the maximum, KV pages held and how many of those are\n"
	"    shared with other sequences, age, and session.\n"
	"\n"
	"OPTIONS\n"
	"    --json   print {\"requests\": [{...}, ...]} with the members client_id,\n"
	"             request_id, pid, uid, state, prompt_tokens, cached_tokens,\n"
	"             generated_tokens, max_tokens, pages, pages_shared, age_ms, session_id\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP;

/*
 * Options of a command that takes only --json besides the common ones and
 * no arguments. Returns -1 to go on (with *ret_json set), or the exit
 * status to return at once (after --help or a usage error).
 */
static int parse_json_only(struct ctx *x, const char *cmd, const char *help, int argc, char **argv, bool *ret_json)
{
	enum { O_JSON = OPT_FIRST_CMD };
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, O_JSON },
		COMMON_LONGOPTS,
		{ 0 },
	};
	int o, r;

	*ret_json = false;
	while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help, stdout);
			return EXIT_OK;
		case O_JSON:
			*ret_json = true;
			break;
		default:
			return usage_error(cmd, "unknown option");
		}
	}
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
	return -1;
}

static int cmd_ps(struct ctx *x, int argc, char **argv)
{
	const char *cmd = "ps";
	bool json;
	int r = parse_json_only(x, cmd, help_ps, argc, argv, &json);

	if (r >= 0)
		return r;
	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	struct kvc_ps_entry *e;
	size_t n;
	r = kvc_ps(c, &e, &n);
	if (r < 0) {
		int st = fail(c, cmd, r);
		kvc_close(c);
		return st;
	}
	if (json) {
		fputs("{\"requests\":[", stdout);
		for (size_t i = 0; i < n; i++)
			printf("%s{\"client_id\":%" PRIu64 ",\"request_id\":%" PRIu64 ",\"pid\":%" PRIu32 ",\"uid\":%" PRIu32
			       ",\"state\":\"%s\",\"prompt_tokens\":%" PRIu32 ",\"cached_tokens\":%" PRIu32
			       ",\"generated_tokens\":%" PRIu32 ",\"max_tokens\":%" PRIu32 ",\"pages\":%" PRIu32
			       ",\"pages_shared\":%" PRIu32 ",\"age_ms\":%" PRIu64 ",\"session_id\":%" PRIu64 "}",
			       i ? "," : "", e[i].client_id, e[i].request_id, e[i].pid, e[i].uid,
			       kvc_req_state_name((int)e[i].state), e[i].prompt_tokens, e[i].cached_tokens,
			       e[i].generated_tokens, e[i].max_tokens, e[i].pages, e[i].pages_shared,
			       e[i].age_ns / 1000000, e[i].session_id);
		fputs("]}\n", stdout);
	} else {
		printf("%8s %8s %8s %6s %-9s %7s %7s %13s %6s %6s %9s %s\n", "CLIENT", "REQ", "PID", "UID", "STATE",
		       "PROMPT", "CACHED", "GEN/MAX", "PAGES", "SHARED", "AGE", "SESSION");
		for (size_t i = 0; i < n; i++) {
			char gen[32], sess[24] = "-";
			snprintf(gen, sizeof(gen), "%" PRIu32 "/%" PRIu32, e[i].generated_tokens, e[i].max_tokens);
			if (e[i].session_id)
				snprintf(sess, sizeof(sess), "%" PRIu64, e[i].session_id);
			printf("%8" PRIu64 " %8" PRIu64 " %8" PRIu32 " %6" PRIu32 " %-9s %7" PRIu32 " %7" PRIu32
			       " %13s %6" PRIu32 " %6" PRIu32 " %8.1fs %s\n",
			       e[i].client_id, e[i].request_id, e[i].pid, e[i].uid, kvc_req_state_name((int)e[i].state),
			       e[i].prompt_tokens, e[i].cached_tokens, gen, e[i].pages, e[i].pages_shared,
			       (double)e[i].age_ns / 1e9, sess);
		}
	}
	kvc_free(e);
	kvc_close(c);
	return fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
}

/* ---- session ---------------------------------------------------------------------------------------- */

static const char help_session[] =
	"NAME\n"
	"    kvctl session - open and close kvd sessions\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl session open [--idle SECS]\n"
	"    kvctl session close ID\n"
	"\n"
	"DESCRIPTION\n"
	"    A session keeps a conversation's KV cache in kvd between requests, so each\n"
	"    turn given with 'kvctl generate --session ID' processes only its new text.\n"
	"    'open' prints the new session's id. A session belongs to the user who opened\n"
	"    it and outlives the connection; kvd closes it after SECS seconds without use\n"
	"    (default: the daemon's session idle timeout). 'close' frees its memory now.\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    s=$(kvctl session open)\n"
	"    kvctl generate --session \"$s\" \"My name is Ada.\"\n"
	"    kvctl generate --session \"$s\" \"What is my name?\"\n"
	"    kvctl session close \"$s\"\n";

static int cmd_session(struct ctx *x, int argc, char **argv)
{
	enum { O_IDLE = OPT_FIRST_CMD };
	static const struct option longopts[] = {
		{ "idle", required_argument, NULL, O_IDLE },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = "session";
	uint32_t idle = 0;
	int o, r;

	while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_session, stdout);
			return EXIT_OK;
		case O_IDLE:
			if (!parse_u32(optarg, &idle) || idle == 0)
				return usage_error(cmd, "--idle: '%s' is not a number of seconds > 0", optarg);
			break;
		default:
			return usage_error(cmd, "unknown option");
		}
	}
	int rest = argc - optind;
	char **args = argv + optind;
	bool open_ = rest == 1 && strcmp(args[0], "open") == 0;
	bool close_ = rest == 2 && strcmp(args[0], "close") == 0;
	uint64_t id = 0;
	if (!open_ && !close_)
		return usage_error(cmd, "expected 'open' or 'close ID'");
	if (close_ && (!parse_u64(args[1], &id) || id == 0))
		return usage_error(cmd, "'%s' is not a session id", args[1]);
	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0)
		return r;
	int status = EXIT_OK;
	if (open_) {
		r = kvc_session_open(c, idle, &id);
		if (r < 0)
			status = fail(c, "session open", r);
		else
			printf("%" PRIu64 "\n", id);
	} else {
		r = kvc_session_close(c, id);
		if (r < 0)
			status = fail(c, "session close", r);
	}
	kvc_close(c);
	if (fflush(stdout) != 0 && status == EXIT_OK)
		status = EXIT_IO;
	return status;
}

/* ---- version ----------------------------------------------------------------------------------------- */

static const char help_version[] =
	"NAME\n"
	"    kvctl version - print the versions of kvctl, libkvclient and kvd\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl version [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    Prints kvctl's version (and that of the libkvclient it was built with and the\n"
	"    one it runs with), then connects to kvd and prints its version and model.\n"
	"    The client's versions are always printed; exit status 3 then says that the\n"
	"    daemon could not be reached.\n"
	"\n"
	"OPTIONS\n"
	"    --json   print {\"kvctl\", \"libkvclient\", \"kvd\", \"model\", \"n_ctx\",\n"
	"             \"n_vocab\", \"block_size\"}; kvd and model are null when the daemon\n"
	"             cannot be reached\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP;

static int cmd_version(struct ctx *x, int argc, char **argv)
{
	const char *cmd = "version";
	bool json;
	int r = parse_json_only(x, cmd, help_version, argc, argv, &json);

	if (r >= 0)
		return r;
	kvc_client *c = NULL;
	r = kvc_connect(x->socket, &c);
	const struct kvc_info *i = r == 0 ? kvc_server_info(c) : NULL;
	char sv[32] = "";
	if (i)
		fmt_version(sv, sizeof(sv), i->server_version);
	if (json) {
		printf("{\"kvctl\":\"%s\",\"libkvclient\":\"%s\",\"kvd\":", KVC_VERSION_STRING, kvc_version_string());
		if (i) {
			printf("\"%s\",\"model\":", sv);
			json_str(stdout, i->model_name, strlen(i->model_name));
			printf(",\"n_ctx\":%" PRIu32 ",\"n_vocab\":%" PRIu32 ",\"block_size\":%" PRIu32 "}\n", i->n_ctx,
			       i->n_vocab, i->block_size);
		} else {
			printf("null,\"model\":null,\"n_ctx\":null,\"n_vocab\":null,\"block_size\":null}\n");
		}
	} else {
		printf("kvctl %s (built with libkvclient %s, running with %s)\n", KVC_VERSION_STRING, KVC_VERSION_STRING,
		       kvc_version_string());
		if (i)
			printf("kvd %s, model %s (context %" PRIu32 " tokens, vocabulary %" PRIu32 ", %" PRIu32
			       " tokens per KV page)\n",
			       sv, i->model_name, i->n_ctx, i->n_vocab, i->block_size);
	}
	fflush(stdout);
	if (r < 0) {
		if (!json)
			log_warn("kvd: not reachable: %s", kv_strerror(r));
		return exit_for(r);
	}
	kvc_close(c);
	return EXIT_OK;
}

/* ---- main ---------------------------------------------------------------------------------------------- */

static const char help_main[] =
	"NAME\n"
	"    kvctl - control and use kvd, the local LLM generation daemon\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl [--socket PATH] [--timeout SECS] COMMAND [OPTIONS] [ARGS]\n"
	"    kvctl --version | --help | help COMMAND\n"
	"\n"
	"DESCRIPTION\n"
	"    kvd keeps one language model loaded and serves text generation to local\n"
	"    programs; its KV cache is managed in pages, like virtual memory. kvctl is its\n"
	"    command-line client, built on libkvclient.\n"
	"\n"
	"COMMANDS\n"
	"    generate   generate text from a prompt, streamed to stdout (or as JSON)\n"
	"    stats      KV-cache pages (free, used, shared, cached, swapped) and counters\n"
	"    tokenize   the token ids of a text, with the model's tokenizer\n"
	"    count      the number of tokens of a text\n"
	"    plan       the KV-cache capacity bill: bytes per token, per request, and\n"
	"               how many sequences fit a memory budget\n"
	"    ps         live requests and the pages they hold\n"
	"    session    open and close sessions (conversations kept in the KV cache)\n"
	"    version    versions of kvctl, libkvclient and kvd\n"
	"    help       this text, or 'help COMMAND' for a command's\n"
	"\n"
	"    Run 'kvctl COMMAND --help' for a command's options.\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl generate \"Why is the sky blue?\"\n"
	"    kvctl stats --json\n"
	"    KVD_SOCKET=$PWD/kvd.sock kvctl ps\n";

struct command {
	const char *name;
	int (*fn)(struct ctx *x, int argc, char **argv);
	const char *help;
};

static int cmd_tokenize_ids(struct ctx *x, int argc, char **argv)
{
	return cmd_tokenize(x, argc, argv, false);
}

static int cmd_count(struct ctx *x, int argc, char **argv)
{
	return cmd_tokenize(x, argc, argv, true);
}

static const struct command commands[] = {
	{ "generate", cmd_generate, help_generate }, { "stats", cmd_stats, help_stats },
	{ "tokenize", cmd_tokenize_ids, help_tokenize }, { "count", cmd_count, help_count },
	{ "plan", cmd_plan, help_plan },             { "ps", cmd_ps, help_ps },
	{ "session", cmd_session, help_session },    { "version", cmd_version, help_version },
};

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "version", no_argument, NULL, 'V' },
		COMMON_LONGOPTS,
		{ 0 },
	};
	struct ctx x = { .socket = NULL, .timeout_s = -1 };
	int o, r;

	g_journal = stderr_is_journal();
	opterr = 1;
	while ((o = getopt_long(argc, argv, "+hV", longopts, NULL)) != -1) {
		if ((r = common_opt(&x, NULL, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help_main, stdout);
			return EXIT_OK;
		case 'V':
			printf("kvctl %s\n", KVC_VERSION_STRING);
			return EXIT_OK;
		default:
			fprintf(stderr, "       try 'kvctl --help'\n");
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		fputs(help_main, stderr);
		return EXIT_USAGE;
	}
	const char *name = argv[optind];
	if (strcmp(name, "help") == 0) {
		if (optind + 1 >= argc) {
			fputs(help_main, stdout);
			return EXIT_OK;
		}
		const struct command *c = find_command(argv[optind + 1]);
		if (!c) {
			log_err("help: no command '%s'", argv[optind + 1]);
			return EXIT_USAGE;
		}
		fputs(c->help, stdout);
		return EXIT_OK;
	}
	const struct command *c = find_command(name);
	if (!c) {
		log_err("no command '%s'", name);
		fprintf(stderr, "       try 'kvctl --help'\n");
		return EXIT_USAGE;
	}
	/* The command parses its own options from its name on (options may
	 * follow operands; "--" ends them). optind = 0 resets getopt fully. */
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	optind = 0;
	return c->fn(&x, sub_argc, sub_argv);
}
