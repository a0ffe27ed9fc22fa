/*
 * client/kvctl/util.c — the helpers kvctl's commands share: messages (stderr,
 * prefixed "kvctl: "; with sd-daemon priority prefixes when stderr is the
 * journal), exit statuses for library errors, argument parsing, JSON strings,
 * connecting to the daemon with a hint when that fails, and Ctrl-C handling.
 */
#include <errno.h>
#include <fcntl.h>
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

#include "kvctl.h"

/* ---- messages --------------------------------------------------------------- */

bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* Set once at start: stderr is the journal, so lines carry priorities. */
bool g_journal;

static void vlog(int prio, const char *fmt, va_list ap)
{
	if (g_journal)
		fprintf(stderr, "<%d>", prio);
	fputs("kvctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

__attribute__((format(printf, 1, 2))) void log_err(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(3, fmt, ap);
	va_end(ap);
}

__attribute__((format(printf, 1, 2))) void log_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(4, fmt, ap);
	va_end(ap);
}

/* Exit status for a library error code. */
int exit_for(int code)
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
int fail(kvc_client *c, const char *what, int code)
{
	const char *m = c ? kvc_last_message(c) : "";
	if (*m)
		log_err("%s: %s (%s)", what, kv_strerror(code), m);
	else
		log_err("%s: %s", what, kv_strerror(code));
	return exit_for(code);
}

int usage_error(const char *cmd, const char *fmt, ...)
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

bool parse_u64(const char *s, uint64_t *ret)
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

bool parse_u32(const char *s, uint32_t *ret)
{
	uint64_t v;
	if (!parse_u64(s, &v) || v > UINT32_MAX)
		return false;
	*ret = (uint32_t)v;
	return true;
}

bool parse_double(const char *s, double *ret)
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
bool parse_size(const char *s, uint64_t *ret)
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

int grow_array(void **buf, size_t *cap, size_t need, size_t elem)
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

void fmt_bytes(char *out, size_t cap, double b)
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

void fmt_version(char *out, size_t cap, unsigned v)
{
	snprintf(out, cap, "%u.%u.%u", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff);
}

/* Read all of stdin (at most max bytes; -E2BIG beyond). */
static int read_fd(int fd, size_t max, char **ret, size_t *ret_len)
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
		ssize_t n = read(fd, buf + len, cap - len);
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
int read_stdin(size_t max, char **ret, size_t *ret_len)
{
	return read_fd(STDIN_FILENO, max, ret, ret_len);
}

int read_file(const char *path, size_t max, char **ret, size_t *ret_len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = read_fd(fd, max, ret, ret_len);
	close(fd);
	return r;
}

int input_text(int argc, char **argv, char **ret, size_t *ret_len)
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
void json_str(FILE *f, const char *s, size_t n)
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

int connect_daemon(const struct ctx *x, kvc_client **ret)
{
	int r = kvc_connect(x->socket, ret);
	if (r < 0) {
		const char *env = getenv(KVC_SOCKET_ENV);
		const char *path, *from;
		if (x->socket) {
			path = x->socket;
			from = "from --socket";
		} else if (env && *env) {
			path = env;
			from = "from $" KVC_SOCKET_ENV;
		} else {
			path = KVC_DEFAULT_SOCKET;
			from = "the default; $" KVC_SOCKET_ENV " is not set";
		}
		log_err("cannot connect to kvd at %s (%s): %s", path, from, kv_strerror(r));
		if (r == -ENOENT || r == -ECONNREFUSED)
			fprintf(stderr,
				"       is kvd running there? Start it (systemctl start kvd, or make run), or\n"
				"       name its socket with --socket PATH or " KVC_SOCKET_ENV "=PATH; after 'make run',\n"
				"       '. run/env' sets " KVC_SOCKET_ENV " to run/kvd.sock and puts kvctl on PATH\n");
		else if (r == -EACCES || r == -EPERM)
			fprintf(stderr, "       no permission on %s: kvd's socket is for its group (usermod -aG kvd $USER)\n",
				path);
		return exit_for(r);
	}
	if (x->timeout_s >= 0)
		kvc_set_timeout(*ret, x->timeout_s * 1000 > INT_MAX ? INT_MAX : (int)(x->timeout_s * 1000));
	return 0;
}

int option_error(const char *cmd, char **argv, int opt)
{
	/* getopt_long has moved optind past the option it refused (and its
	 * value, if any), unless it was inside a cluster such as -xy */
	const char *arg = optind > 0 ? argv[optind - 1] : "";
	char name[64];

	if (optopt > 0 && optopt < 256)
		snprintf(name, sizeof(name), "-%c", optopt);
	else
		snprintf(name, sizeof(name), "%.*s", (int)strcspn(arg, "="), arg);
	if (opt == ':')
		return usage_error(cmd, "option '%s' needs a value", name);
	return usage_error(cmd, "unknown option '%s'", name);
}

int common_opt(struct ctx *x, const char *cmd, int opt, const char *arg)
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

/*
 * Options of a command that takes only --json besides the common ones and
 * no arguments. Returns -1 to go on (with *ret_json set), or the exit
 * status to return at once (after --help or a usage error).
 */
int parse_json_only(struct ctx *x, const char *cmd, const char *help, int argc, char **argv, bool *ret_json)
{
	enum { O_JSON = OPT_FIRST_CMD };
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, O_JSON },
		COMMON_LONGOPTS,
		{ 0 },
	};
	int o, r;

	*ret_json = false;
	while ((o = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
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
			return option_error(cmd, argv, o);
		}
	}
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
	return -1;
}

/* ---- Ctrl-C ---------------------------------------------------------------- */

kvc_client *volatile g_sig_client;
volatile uint64_t g_sig_request;
volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	g_interrupted = 1;
	kvc_client *c = g_sig_client;
	uint64_t id = g_sig_request;
	if (c && id)
		kvc_cancel(c, id); /* async-signal-safe */
}

void install_sigint(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;
	sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C kills at once */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN); /* write errors are reported, not fatal */
}
void install_sigint_flag(void)
{
	struct sigaction sa = { .sa_handler = on_sigint };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
}

void sleep_s(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !g_interrupted)
		;
}
