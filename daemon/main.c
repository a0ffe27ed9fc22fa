/*
 * daemon/main.c — the kvd program: command line and configuration, model
 * loading, the listening socket (socket activation or a path of its own),
 * signals through a signalfd, then the server loop until SIGTERM. Under
 * systemd the KV pool and prefix index kept from the last clean stop are
 * adopted at start and handed over again at the stop (persist.h).
 *
 * Exit status follows sysexits where one fits: 0 after a clean drain, 64 for
 * a command-line mistake, 78 (EX_CONFIG) for a configuration error (printed
 * as "file:line: message"), 1 when the model or the socket cannot be set up.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "config.h"
#include "engine.h"
#include "spec_draft.h"
#include "ipc.h"
#include "kvmm.h"
#include "log.h"
#include "model.h"
#include "persist.h"
#include "server.h"

#define EXIT_USAGE  64
#define EXIT_CONFIG 78
#define DEFAULT_CONFIG "/etc/kvd/kvd.conf"
#define MAX_OVERRIDES 32
#define LISTEN_BACKLOG 128

static const char help_head[] =
	"NAME\n"
	"    kvd - local LLM generation daemon with a paged KV cache\n"
	"\n"
	"SYNOPSIS\n"
	"    kvd [OPTIONS]\n"
	"    kvd --check-config [--config PATH] [OPTIONS]\n"
	"\n"
	"DESCRIPTION\n"
	"    kvd keeps one Llama-family model (a GGUF file) loaded and serves text\n"
	"    generation to local processes over a Unix SOCK_SEQPACKET socket; clients\n"
	"    use libkvclient or kvctl(1). Requests are batched at the iteration level\n"
	"    (continuous batching); the KV cache is managed in fixed-size pages with\n"
	"    copy-on-write prefix sharing, an LRU prefix cache and swap to a file.\n"
	"\n"
	"    kvd runs in the foreground and logs to stderr with sd-daemon priority\n"
	"    prefixes (<3> error .. <7> debug). Under systemd it is a Type=notify\n"
	"    service: READY=1 once the model is loaded and the socket is live,\n"
	"    STATUS= lines while loading and serving, WATCHDOG=1 pings when\n"
	"    WatchdogSec= is set. A socket passed by systemd (kvd.socket) is used\n"
	"    when present; otherwise kvd binds server.socket itself.\n"
	"\n"
	"OPTIONS\n"
	"    Options override the configuration file; each names the key it sets.\n"
	"\n"
	"    -c, --config PATH        configuration file (default " DEFAULT_CONFIG ";\n"
	"                             a missing default file is not an error, a\n"
	"                             missing file given here is)\n"
	;

/* After the options the configuration table describes (print_key_option). */
static const char help_tail[] =
	"        --check-config       load and check the configuration (and that the\n"
	"                             model file exists), print a summary, exit\n"
	"    -V, --version            print the version and exit\n"
	"    -h, --help               print this help and exit\n"
	"\n"
	"ENVIRONMENT\n"
	"    KVD_SOCKET       socket path; overrides the file's server.socket (an\n"
	"                     explicit --socket wins over it)\n"
	"    LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES\n"
	"                     socket activation (sd_listen_fds(3)): exactly one\n"
	"                     listening SOCK_SEQPACKET Unix socket; and the fds\n"
	"                     named kv-pool and kv-index that kvd stored at its\n"
	"                     last clean stop (FileDescriptorStoreMax=)\n"
	"    NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID\n"
	"                     systemd readiness, status and watchdog (sd_notify(3))\n"
	"\n"
	"SIGNALS\n"
	"    SIGTERM, SIGINT  drain: stop accepting, refuse new requests, let running\n"
	"                     ones finish for up to server.drain_timeout seconds,\n"
	"                     then end the rest with a shutdown error; a second\n"
	"                     signal ends them at once\n"
	"    SIGHUP           re-read the configuration: log level, scheduler limits,\n"
	"                     per-client limits, allowed users/groups and the ledger\n"
	"                     file apply at once (the ledger is reopened, for log\n"
	"                     rotation); other changes are logged as needing a\n"
	"                     restart\n"
	"\n"
	"EXIT STATUS\n"
	"    0   stopped cleanly (or --check-config passed)\n"
	"    1   the model, the KV pool or the socket could not be set up\n"
	"    64  bad command-line usage\n"
	"    78  configuration error, reported as \"file:line: message\"\n"
	"\n"
	"FILES\n"
	"    " DEFAULT_CONFIG "      the configuration; every key is documented there\n"
	"    /run/kvd/kvd.sock      the socket under systemd\n"
	"\n"
	"SEE ALSO\n"
	"    kvctl(1), systemd.socket(5), sd_notify(3)\n";

/* kvd's own options; those that set a configuration key come from
 * kvd_conf_keys[] (build_options), long-only ones numbered from
 * OPT_KEY_BASE + their row. */
enum {
	OPT_CHECK_CONFIG = 256,
	OPT_KEY_BASE,
};
#define MAX_OPTIONS 64 /* own options plus the table's, with the terminating row */
#define HELP_DESC_COL 29 /* where an option's description starts */
#define HELP_KEY_COL 64  /* where the key it sets is named */
#define HELP_WIDTH 78    /* descriptions wrap before this column */

static const struct option own_opts[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "check-config", no_argument, NULL, OPT_CHECK_CONFIG },
	{ "version", no_argument, NULL, 'V' },
	{ "help", no_argument, NULL, 'h' },
};
#define OWN_SHORT_OPTS "c:Vh"

/* getopt's tables: kvd's own options, then every key with an option. */
static void build_options(struct option *lo, char *shorts, size_t shorts_cap)
{
	size_t n = 0, ns = strlen(OWN_SHORT_OPTS);

	memcpy(lo, own_opts, sizeof(own_opts));
	n = sizeof(own_opts) / sizeof(own_opts[0]);
	memcpy(shorts, OWN_SHORT_OPTS, ns + 1);
	for (size_t i = 0; i < kvd_conf_n_keys; i++) {
		const struct kvd_conf_key *k = &kvd_conf_keys[i];
		if (!k->opt)
			continue;
		assert(n + 1 < MAX_OPTIONS && ns + 3 < shorts_cap);
		lo[n++] = (struct option){ k->opt + 2, k->opt_arg ? required_argument : no_argument, NULL,
					   k->opt_short ? k->opt_short : OPT_KEY_BASE + (int)i };
		if (k->opt_short) {
			shorts[ns++] = k->opt_short;
			if (k->opt_arg)
				shorts[ns++] = ':';
			shorts[ns] = 0;
		}
	}
	lo[n] = (struct option){ 0 };
}

/* The row an option returned by getopt sets; NULL: not a key's option. */
static const struct kvd_conf_key *key_of_option(int c)
{
	if (c >= OPT_KEY_BASE && (size_t)(c - OPT_KEY_BASE) < kvd_conf_n_keys)
		return &kvd_conf_keys[c - OPT_KEY_BASE];
	for (size_t i = 0; c > 0 && c < 256 && i < kvd_conf_n_keys; i++)
		if (kvd_conf_keys[i].opt && kvd_conf_keys[i].opt_short == c)
			return &kvd_conf_keys[i];
	return NULL;
}

/* One option of the table in --help: the option, its description wrapped
 * from HELP_DESC_COL to HELP_WIDTH, and "[section] key" at HELP_KEY_COL
 * of its last line (or of a line of its own when the text reaches it). */
static void print_key_option(FILE *f, const struct kvd_conf_key *k)
{
	char line[256], tag[96];
	const char *w = k->help;
	int col;

	if (k->opt_short)
		col = fprintf(f, "    -%c, %s%s%s", k->opt_short, k->opt, k->opt_arg ? " " : "", k->opt_arg ? k->opt_arg : "");
	else
		col = fprintf(f, "        %s%s%s", k->opt, k->opt_arg ? " " : "", k->opt_arg ? k->opt_arg : "");
	if (col > HELP_DESC_COL - 2) {
		fputc('\n', f);
		col = 0;
	}
	snprintf(tag, sizeof(tag), "[%s] %s", k->section, k->name);
	while (*w) {
		/* as many words as fit before HELP_WIDTH */
		size_t len = 0, room = HELP_WIDTH - HELP_DESC_COL;
		const char *p = w;
		while (*p) {
			const char *e = strchr(p, ' ');
			size_t wl = e ? (size_t)(e - p) : strlen(p);
			if (len && len + 1 + wl > room)
				break;
			len += (len ? 1 : 0) + wl;
			p += wl;
			while (*p == ' ')
				p++;
		}
		snprintf(line, sizeof(line), "%.*s", (int)len, w);
		w = p;
		fprintf(f, "%*s%s", HELP_DESC_COL - col, "", line);
		col = HELP_DESC_COL + (int)len;
		if (*w) {
			fputc('\n', f);
			col = 0;
		}
	}
	if (col > HELP_KEY_COL - 1) {
		fputc('\n', f);
		col = 0;
	}
	fprintf(f, "%*s%s\n", HELP_KEY_COL - col, "", tag);
}

static void print_help(FILE *f)
{
	fputs(help_head, f);
	for (size_t i = 0; i < kvd_conf_n_keys; i++)
		if (kvd_conf_keys[i].opt)
			print_key_option(f, &kvd_conf_keys[i]);
	fputs(help_tail, f);
}

struct override {
	const char *section, *key, *value, *flag;
};

/* What the command line said, kept for SIGHUP: a reload re-reads the file
 * and applies the same overrides on top. */
struct args {
	const char *config;
	bool config_explicit;
	bool socket_explicit;
	bool check_config;
	struct override ov[MAX_OVERRIDES];
	size_t n_ov;
};

/* defaults, file, KVD_SOCKET, command line; then the cross-field checks.
 * Returns 0, or -EINVAL with the message in err. */
static int load_config(const struct args *a, struct kvd_config *cfg, char *err, size_t errlen)
{
	int r;

	kvd_config_defaults(cfg);
	r = kvd_config_load(cfg, a->config, err, errlen);
	/* running without a file: defaults and flags; but --check-config is
	 * asked about a file, and a missing one is not "OK" */
	if (r == -ENOENT && !a->config_explicit && !a->check_config)
		r = 0;
	if (r < 0)
		return -EINVAL;
	const char *env = getenv("KVD_SOCKET");
	if (env && *env && !a->socket_explicit) {
		r = kvd_config_set(cfg, "server", "socket", env, "KVD_SOCKET", err, errlen);
		if (r < 0)
			return -EINVAL;
	}
	for (size_t i = 0; i < a->n_ov; i++) {
		r = kvd_config_set(cfg, a->ov[i].section, a->ov[i].key, a->ov[i].value, a->ov[i].flag, err, errlen);
		if (r < 0)
			return -EINVAL;
	}
	r = kvd_config_validate(cfg, err, errlen);
	return r < 0 ? -EINVAL : 0;
}

static int reload_hook(void *ud, struct kvd_config *ret)
{
	const struct args *a = ud;
	char err[1024];
	if (load_config(a, ret, err, sizeof(err)) < 0) {
		log_error("reload: %s", err);
		return -EINVAL;
	}
	return 0;
}

static int add_override(struct args *a, const char *sec, const char *key, const char *value, const char *flag)
{
	if (a->n_ov == MAX_OVERRIDES)
		return -E2BIG;
	a->ov[a->n_ov++] = (struct override){ sec, key, value, flag };
	return 0;
}

static int parse_args(int argc, char **argv, struct args *a)
{
	struct option long_opts[MAX_OPTIONS];
	char short_opts[2 * MAX_OPTIONS + 1];
	const struct kvd_conf_key *k;
	int c;

	build_options(long_opts, short_opts, sizeof(short_opts));
	a->config = DEFAULT_CONFIG;
	while ((c = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1) {
		switch (c) {
		case 'c': a->config = optarg; a->config_explicit = true; break;
		case OPT_CHECK_CONFIG: a->check_config = true; break;
		case 'V':
			printf("kvd %s (protocol %u)\n", KVD_VERSION, IPC_PROTO_VERSION);
			exit(0);
		case 'h':
			print_help(stdout);
			exit(0);
		default:
			k = key_of_option(c);
			if (!k) {
				fprintf(stderr, "Try 'kvd --help'.\n");
				return -EINVAL;
			}
			if (add_override(a, k->section, k->name, k->opt_arg ? optarg : k->opt_value, k->opt) < 0) {
				fprintf(stderr, "kvd: more than %d options\nTry 'kvd --help'.\n", MAX_OVERRIDES);
				return -EINVAL;
			}
			if (!strcmp(k->section, "server") && !strcmp(k->name, "socket"))
				a->socket_explicit = true;
			break;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvd: unexpected argument '%s'\nTry 'kvd --help'.\n", argv[optind]);
		return -EINVAL;
	}
	return 0;
}

/* The listening socket: the one systemd passed (n fds from
 * sd_listen_fds_with_names, with their names), or our own at cfg->socket
 * (*ret_own set: kvd removes that file when it exits). */
static int open_listener(const struct kvd_config *cfg, int n, char **names, int *ret_fd, bool *ret_own)
{
	int fd = -1, n_sock = 0, r;

	/* The fd store's memfds (persist.h) come in the same list; they are
	 * not sockets and were taken (and closed) already. */
	for (int i = 0; i < n; i++) {
		if (names && kvd_persist_fd_name(names[i]))
			continue;
		if (n_sock++ == 0)
			fd = SD_LISTEN_FDS_START + i;
	}
	if (n < 0) {
		log_error("socket activation: %s", strerror(-n));
		return n;
	}
	if (n_sock > 1) {
		log_error("socket activation: %d sockets passed; kvd takes exactly one", n_sock);
		return -EINVAL;
	}
	if (n_sock == 1) {
		if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0) {
			log_error("socket activation: fd %d is not a listening SOCK_SEQPACKET Unix socket "
				  "(kvd.socket needs ListenSequentialPacket=)", fd);
			return -EINVAL;
		}
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			log_error("socket activation: fcntl: %m");
			return -errno;
		}
		log_info("listening on the socket passed by the service manager");
		*ret_fd = fd;
		return 0;
	}
	r = ipc_listen(cfg->socket, cfg->socket_mode, LISTEN_BACKLOG, &fd);
	if (r < 0) {
		if (r == -ENOENT)
			log_error("cannot listen on %s: its directory does not exist", cfg->socket);
		else if (r == -EADDRINUSE)
			log_error("cannot listen on %s: another kvd is serving there", cfg->socket);
		else
			log_error("cannot listen on %s: %s", cfg->socket, strerror(-r));
		return r;
	}
	if (cfg->socket_group[0] && cfg->socket[0] != '@') {
		struct group *g = getgrnam(cfg->socket_group);
		if (!g || chown(cfg->socket, (uid_t)-1, g->gr_gid) < 0)
			log_warning("socket %s: cannot set group '%s': %s", cfg->socket, cfg->socket_group,
				    g ? strerror(errno) : "no such group");
	}
	log_info("listening on %s", cfg->socket);
	*ret_fd = fd;
	*ret_own = cfg->socket[0] != '@';
	return 0;
}

static const char *file_kind(const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return "it appeared meanwhile";
	if (S_ISLNK(st.st_mode))
		return "a symbolic link";
	if (S_ISREG(st.st_mode))
		return "a regular file";
	if (S_ISDIR(st.st_mode))
		return "a directory";
	return "a special file";
}

static void fmt_mib(char *buf, size_t size, uint64_t bytes)
{
	snprintf(buf, size, "%.1f MiB", (double)bytes / 1048576.0);
}

/* Create the swap file (cfg->swap_file, which must not exist) and reserve
 * its space, saying exactly what went wrong when that fails: an existing
 * path, a file system without the room, or something else. The reason is
 * also left in err for the service manager's status line. */
/* snprintf() for messages that may be cut short to fit err (paths are long). */
static void errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static int open_swap(const struct kvd_config *cfg, struct kvmm_swap_io **ret, char *err, size_t errlen)
{
	const char *path = cfg->swap_file;
	char want[32], have[32], dir[KVD_CONF_PATH_MAX];
	int step = KVMM_SWAP_STEP_ARGS, r;

	r = kvmm_swap_io_file_open(path, cfg->swap_bytes, KVMM_SWAP_OPEN_UNLINK, ret, &step);
	if (r == 0)
		return 0;
	fmt_mib(want, sizeof(want), cfg->swap_bytes);
	if (r == -EEXIST) {
		errf(err, errlen,
			 "swap file %s: the path already exists (%s); kvd creates its swap file itself and never "
			 "reuses, overwrites or deletes an existing file: remove it or set kv.swap_file to a new path",
			 path, file_kind(path));
	} else if (step == KVMM_SWAP_STEP_PREALLOCATE) {
		struct statvfs sv;
		char *slash;

		snprintf(dir, sizeof(dir), "%s", path);
		slash = strrchr(dir, '/');
		if (!slash)
			snprintf(dir, sizeof(dir), ".");
		else if (slash == dir)
			dir[1] = 0;
		else
			*slash = 0;
		if (statvfs(dir, &sv) == 0)
			fmt_mib(have, sizeof(have), (uint64_t)sv.f_bavail * sv.f_frsize);
		else
			snprintf(have, sizeof(have), "?");
		errf(err, errlen,
			 "swap file %s: cannot preallocate %s (kv.swap_size): %s; %s has %s free "
			 "(make kv.swap_size smaller or put kv.swap_file on a larger file system)",
			 path, want, strerror(-r), dir, have);
	} else if (step == KVMM_SWAP_STEP_CREATE) {
		errf(err, errlen, "swap file %s: cannot create it: %s", path, strerror(-r));
	} else if (step == KVMM_SWAP_STEP_RING) {
		errf(err, errlen, "swap file %s: cannot set up io_uring for it: %s", path, strerror(-r));
	} else {
		errf(err, errlen, "swap file %s: kv.swap_size of %" PRIu64 " bytes is not usable: %s", path,
			 cfg->swap_bytes, strerror(-r));
	}
	return r;
}

#ifdef KVD_FAULT_INJECTION
/*
 * Test builds only (build/tests/kvd-faulty, this file compiled with
 * -DKVD_FAULT_INJECTION; the kvd that is installed never reads it; also
 * KVD_TEST_FAULTS and KVD_TEST_SERVER_VERSION, arm_server_faults):
 * KVD_TEST_SWAP_FAULT=OP:ERROR[:AFTER[:COUNT]] puts kvmm's fault layer
 * between kvmm and the swap file. OP is read, write or any; ERROR is EIO,
 * ENOSPC or short (half the bytes); the first AFTER matching page transfers
 * pass (default 0), then COUNT fail (default 0: all that follow).
 */
static int arm_swap_fault(struct kvmm_swap_io **io, char *err, size_t errlen)
{
	const char *spec = getenv("KVD_TEST_SWAP_FAULT");
	char op[16], what[16];
	unsigned long long after = 0, count = 0;
	struct kvmm_io_fault f = { 0 };
	struct kvmm_swap_io *w = NULL;
	int n, r;

	if (!spec || !*spec)
		return 0;
	n = sscanf(spec, "%15[a-z]:%15[A-Za-z]:%llu:%llu", op, what, &after, &count);
	if (n < 2)
		goto bad;
	if (!strcmp(op, "read"))
		f.ops_mask = 1u << KVMM_IO_READ;
	else if (!strcmp(op, "write"))
		f.ops_mask = 1u << KVMM_IO_WRITE;
	else if (strcmp(op, "any"))
		goto bad;
	if (!strcmp(what, "EIO"))
		f.error = -EIO;
	else if (!strcmp(what, "ENOSPC"))
		f.error = -ENOSPC;
	else if (!strcmp(what, "short"))
		f.error = KVMM_IO_FAULT_SHORT;
	else
		goto bad;
	f.after = after;
	f.count = (uint32_t)count;
	r = kvmm_swap_io_fault_new(*io, &w);
	*io = NULL; /* the fault layer owns it now, also on failure */
	if (r < 0 || (r = kvmm_swap_io_fault_arm(w, &f)) < 0) {
		kvmm_swap_io_free(w);
		errf(err, errlen, "KVD_TEST_SWAP_FAULT: %s", strerror(-r));
		return r;
	}
	*io = w;
	log_warning("TEST BUILD: swap fault injection armed: %s", spec);
	return 0;
bad:
	errf(err, errlen, "KVD_TEST_SWAP_FAULT=%s: expected OP:ERROR[:AFTER[:COUNT]] (read|write|any, EIO|ENOSPC|short)",
	     spec);
	return -EINVAL;
}

/*
 * Test builds only, like KVD_TEST_SWAP_FAULT: KVD_TEST_FAULTS is a
 * comma-separated list of faults in the server; "peercred" makes every
 * SO_PEERCRED read fail.
 */
static void arm_server_faults(struct kvd_server_hooks *hooks)
{
	const char *faults = getenv("KVD_TEST_FAULTS");

	hooks->fault_peercred = faults && strstr(faults, "peercred");
	if (hooks->fault_peercred)
		log_warning("TEST BUILD: KVD_TEST_FAULTS: reading peer credentials fails on purpose");
	/* KVD_TEST_SERVER_VERSION=MAJOR.MINOR.PATCH: WELCOME says that version */
	const char *v = getenv("KVD_TEST_SERVER_VERSION");
	unsigned maj, min, pat;
	if (v && sscanf(v, "%u.%u.%u", &maj, &min, &pat) == 3 && maj < 256 && min < 256 && pat < 256) {
		hooks->fault_server_version = (maj << 16) | (min << 8) | pat;
		log_warning("TEST BUILD: KVD_TEST_SERVER_VERSION: WELCOME says kvd %u.%u.%u", maj, min, pat);
	}
}
#endif

int main(int argc, char **argv)
{
	struct args a = { 0 };
	struct kvd_config cfg;
	struct kvd_engine *e = NULL;
	struct kvd_server *srv = NULL;
	struct kvd_persist *persist = NULL;
	char err[1024], **listen_names = NULL;
	int n_listen = 0;
	int r, listen_fd = -1, sig_fd = -1, status = 1;
	bool own_socket = false;
	sigset_t mask;

	if (parse_args(argc, argv, &a) < 0)
		return EXIT_USAGE;
	if (load_config(&a, &cfg, err, sizeof(err)) < 0) {
		log_error("%s", err);
		return EXIT_CONFIG;
	}
	if (a.check_config) {
		printf("%s: configuration OK\n  model %s\n  backend %s, threads %d\n  socket %s\n"
		       "  block_size %u, cache_type %s, prefix_caching %s, swap %s\n  max_num_seqs %u, max_tokens_per_step %u\n",
		       a.config, cfg.model, cfg.backend, cfg.threads, cfg.socket, cfg.block_size, cfg.cache_type,
		       cfg.prefix_caching ? "yes" : "no", cfg.swap_file[0] ? cfg.swap_file : "none", cfg.max_num_seqs,
		       cfg.max_tokens_per_step);
		return 0;
	}
	kvd_log_level = cfg.log_level;

	/* Every client holds two descriptors: its socket and the daemon's end
	 * of its wake-up socket pair (the memfd and the client's end are closed
	 * once handed over in WELCOME). Take the hard limit, as programs that
	 * never use select() should. */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	/* Signals go to the signalfd from here on (SIGTERM during loading is
	 * handled once the loop starts: it then drains an empty daemon). */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0) {
		log_error("sigprocmask: %m");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN); /* a file size limit: the write fails (EFBIG), kvd lives on */
	sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sig_fd < 0) {
		log_error("signalfd: %m");
		return 1;
	}

	log_info("kvd %s starting: model %s", KVD_VERSION, cfg.model);
	struct kvmm_swap_io *swap_io = NULL;
	if (cfg.swap_file[0] && open_swap(&cfg, &swap_io, err, sizeof(err)) < 0) {
		log_error("%s", err);
		sd_notifyf(0, "STATUS=failed: %s", err);
		goto out;
	}
#ifdef KVD_FAULT_INJECTION
	if (swap_io && arm_swap_fault(&swap_io, err, sizeof(err)) < 0) {
		log_error("%s", err);
		goto out;
	}
#endif
	/* What systemd passed, read once (the fd store's memfds are closed
	 * or adopted before the socket is looked at). */
	n_listen = sd_listen_fds_with_names(1, &listen_names);
	persist = kvd_persist_new(&cfg, n_listen, listen_names);
	if (!persist) {
		log_error("out of memory");
		goto out;
	}
	sd_notifyf(0, "STATUS=loading model %s", cfg.model);
	enum kvd_kv_type kv_type = KVD_KV_F16;
	/* the key's choices are the type names and "auto" */
	int kv_auto = kvd_kv_type_parse(cfg.cache_type, &kv_type) < 0;
	struct kvd_engine_config ec = {
		.model_path = cfg.model,
		.backend = cfg.backend,
		.n_threads = cfg.threads,
		.block_size = cfg.block_size,
		.kv_type = kv_type,
		.kv_type_auto = kv_auto,
		.kv_pool_bytes = cfg.pool_bytes,
		.kv_pool_fraction = cfg.pool_fraction,
		.max_seqs = cfg.max_num_seqs * 2 + 256 < KVMM_MAX_SEQS ? cfg.max_num_seqs * 2 + 256 : KVMM_MAX_SEQS,
		.prefix_cache = cfg.prefix_caching,
		.keep_local = !cfg.release_local,
		.swap_io = swap_io, /* the engine owns it from here on */
		.pool_adopt = kvd_persist_pool_adopt,
		.pool_adopt_ud = persist,
	};
	r = kvd_engine_open(&ec, &e, err, sizeof(err));
	if (r < 0) {
		log_error("%s", err[0] ? err : strerror(-r));
		sd_notifyf(0, "STATUS=failed: %s", err[0] ? err : strerror(-r));
		goto out;
	}
	{
		const struct kvd_model *m = kvd_engine_model(e);
		const struct kvd_hparams *hp = kvd_model_hparams(m);
		struct kvmm *kv = kvd_engine_kvmm(e);
		log_info("model '%s': %d layers, n_embd %d, %d/%d heads, vocab %d, context %d; %s backend",
			 kvd_model_name(m), hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_vocab, hp->n_ctx_train,
			 kvd_engine_backend_name(e));
		log_info("KV pool: %u pages of %u tokens (%zu bytes each, %s K/V%s, %.1f MiB), prefix caching %s, swap %s",
			 kvmm_n_pages(kv), kvmm_block_size(kv), kvmm_page_bytes(kv),
			 kvd_kv_type_name(kvd_engine_kv_layout(e)->type), kv_auto ? " (cache_type auto)" : "",
			 (double)kvmm_n_pages(kv) * (double)kvmm_page_bytes(kv) / 1048576.0,
			 cfg.prefix_caching ? "on" : "off", cfg.swap_file[0] ? cfg.swap_file : "none");
	}
	if (cfg.spec_draft_model[0]) {
		r = kvd_spec_draft_open(e, cfg.spec_draft_model, cfg.spec_draft_pool_bytes, &ec, err, sizeof(err));
		if (r < 0) {
			log_error("%s", err);
			sd_notifyf(0, "STATUS=failed: %s", err);
			goto out;
		}
		struct kvmm *dkv = kvd_engine_kvmm(kvd_engine_draft(e));
		log_info("draft model '%s' for speculative decoding (mode %s): %u KV pages of %u tokens (%.1f MiB)",
			 kvd_model_name(kvd_engine_model(kvd_engine_draft(e))), cfg.spec_mode, kvmm_n_pages(dkv),
			 kvmm_block_size(dkv), (double)kvmm_n_pages(dkv) * (double)kvmm_page_bytes(dkv) / 1048576.0);
	}
	kvd_persist_adopt(persist, e);
	kvd_persist_hib_open(persist, e);
	r = open_listener(&cfg, n_listen, listen_names, &listen_fd, &own_socket);
	if (r < 0)
		goto out;
	struct kvd_server_hooks hooks = { .reload = reload_hook, .ud = &a,
					  .background = kvd_persist_background, .background_ud = persist,
					  .cache_save = kvd_persist_cache_save, .cache_drop = kvd_persist_cache_drop,
					  .cache_ud = persist };
#ifdef KVD_FAULT_INJECTION
	arm_server_faults(&hooks);
#endif
	r = kvd_server_create(&cfg, e, listen_fd, sig_fd, &hooks, &srv);
	listen_fd = sig_fd = -1; /* the server owns them now */
	if (r < 0) {
		log_error("cannot start the server: %s", strerror(-r));
		goto out;
	}
	r = kvd_server_run(srv);
	status = r < 0 ? 1 : 0;
	if (status == 0) {
		kvd_persist_hand_over(persist, e);
		kvd_persist_hibernate(persist, e);
	}
out:
	srv = kvd_server_free(srv);
	persist = kvd_persist_free(persist);
	for (int i = 0; listen_names && i < n_listen; i++)
		free(listen_names[i]);
	free(listen_names);
	e = kvd_engine_close(e);
	if (listen_fd >= 0)
		close(listen_fd);
	if (sig_fd >= 0)
		close(sig_fd);
	if (own_socket)
		unlink(cfg.socket);
	return status;
}
