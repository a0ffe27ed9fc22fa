/*
 * daemon/config.c — the key table, value parsers and validation.
 */
#include "config.h"

#include <errno.h>
#include <ctype.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void kvd_config_defaults(struct kvd_config *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->model, sizeof(c->model), "/var/lib/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf");
	snprintf(c->backend, sizeof(c->backend), "auto");
	c->threads = 0;
	c->pool_fraction = 0.25;
	c->block_size = 16;
	c->prefix_caching = 1;
	c->swap_bytes = 1ull << 30;
	c->max_num_seqs = 64;
	c->max_tokens_per_step = 512;
	c->max_step_ms = 50;
	c->max_waiting = 1024;
	c->session_idle_s = 600;
	snprintf(c->socket, sizeof(c->socket), "/run/kvd/kvd.sock");
	c->socket_mode = 0660;
	c->max_clients = 256;
	c->max_clients_per_user = 32;
	c->admin_reserved_clients = 4;
	c->idle_timeout_s = 300;
	c->max_requests_per_client = 16;
	c->max_prompt_bytes = 1u << 20;
	c->drain_timeout_s = 10;
	c->token_ring_bytes = 256u << 10;
	c->log_level = 6;
}

int kvd_parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case 0: break;
	case 'K': shift = 10; end++; break;
	case 'M': shift = 20; end++; break;
	case 'G': shift = 30; end++; break;
	case 'T': shift = 40; end++; break;
	default: return -EINVAL;
	}
	if ((*end == 'i' || *end == 'I') && shift)
		end++;
	if ((*end == 'B' || *end == 'b'))
		end++;
	if (*end)
		return -EINVAL;
	if (shift && v > (ULLONG_MAX >> shift))
		return -ERANGE;
	*ret = (uint64_t)v << shift;
	return 0;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *ret)
{
	char *end;
	unsigned long v;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

static int parse_bool(const char *s, int *ret)
{
	if (!strcasecmp(s, "yes") || !strcasecmp(s, "true") || !strcasecmp(s, "on") || !strcmp(s, "1"))
		*ret = 1;
	else if (!strcasecmp(s, "no") || !strcasecmp(s, "false") || !strcasecmp(s, "off") || !strcmp(s, "0"))
		*ret = 0;
	else
		return -EINVAL;
	return 0;
}

static int copy_str(char *dst, size_t cap, const char *v)
{
	if (strlen(v) >= cap)
		return -ENAMETOOLONG;
	strcpy(dst, v);
	return 0;
}

/* Name -> id lookups for parse_ids(); -ENOENT for an unknown name. */
static int lookup_user(const char *name, uint32_t *ret)
{
	struct passwd *pw = getpwnam(name);
	if (!pw)
		return -ENOENT;
	*ret = pw->pw_uid;
	return 0;
}

static int lookup_group(const char *name, uint32_t *ret)
{
	struct group *gr = getgrnam(name);
	if (!gr)
		return -ENOENT;
	*ret = gr->gr_gid;
	return 0;
}

/* Comma/space separated names or numeric ids, at most KVD_CONF_MAX_IDS.
 * On -ENOENT the unknown token is copied to bad. */
static int parse_ids(const char *v, int (*lookup)(const char *, uint32_t *), uint32_t *out, size_t *n, char *bad,
		     size_t badlen)
{
	char buf[1024], *save = NULL, *tok;
	if (copy_str(buf, sizeof(buf), v) < 0)
		return -EINVAL;
	*n = 0;
	for (tok = strtok_r(buf, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
		uint32_t id;
		if (*n == KVD_CONF_MAX_IDS)
			return -E2BIG;
		if (isdigit((unsigned char)*tok) ? parse_u32(tok, 0, UINT32_MAX - 1, &id) < 0 : lookup(tok, &id) < 0) {
			snprintf(bad, badlen, "%s", tok);
			return -ENOENT;
		}
		out[(*n)++] = id;
	}
	return 0;
}

static const char *const log_levels[] = {"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"};

/* Returns 0 or -EINVAL with the reason (without location) in msg. */
static int set_key(struct kvd_config *c, const char *sec, const char *key, const char *v, char *msg, size_t ml)
{
	uint64_t u64;
	char bad[128];
	int r;

#define IS(s, k) (!strcmp(sec, s) && !strcmp(key, k))
	if (IS("model", "path")) {
		if (!*v || copy_str(c->model, sizeof(c->model), v) < 0)
			goto bad_value;
	} else if (IS("engine", "backend")) {
		if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda")) {
			snprintf(msg, ml, "backend must be auto, cpu or cuda, not '%s'", v);
			return -EINVAL;
		}
		snprintf(c->backend, sizeof(c->backend), "%s", v);
	} else if (IS("engine", "threads")) {
		uint32_t n;
		if (parse_u32(v, 0, 1024, &n) < 0)
			goto bad_value;
		c->threads = (int)n;
	} else if (IS("kv", "pool_size")) {
		size_t len = strlen(v);
		if (len > 1 && v[len - 1] == '%') {
			char *end;
			double f = strtod(v, &end);
			if (end != v + len - 1 || !(f > 0 && f <= 90)) {
				snprintf(msg, ml, "pool_size percentage must be in (0, 90], not '%s'", v);
				return -EINVAL;
			}
			c->pool_fraction = f / 100.0;
			c->pool_bytes = 0;
		} else {
			if (kvd_parse_size(v, &u64) < 0 || u64 == 0)
				goto bad_value;
			c->pool_bytes = u64;
		}
	} else if (IS("kv", "block_size")) {
		uint32_t n;
		if (parse_u32(v, 1, 1024, &n) < 0)
			goto bad_value;
		c->block_size = n;
	} else if (IS("kv", "prefix_caching")) {
		if (parse_bool(v, &c->prefix_caching) < 0)
			goto bad_value;
	} else if (IS("kv", "swap_file")) {
		if (copy_str(c->swap_file, sizeof(c->swap_file), v) < 0)
			goto bad_value;
	} else if (IS("kv", "swap_size")) {
		if (kvd_parse_size(v, &u64) < 0)
			goto bad_value;
		c->swap_bytes = u64;
	} else if (IS("scheduler", "max_model_len")) {
		if (parse_u32(v, 0, 1u << 24, &c->max_model_len) < 0)
			goto bad_value;
	} else if (IS("scheduler", "max_num_seqs")) {
		if (parse_u32(v, 1, 4096, &c->max_num_seqs) < 0)
			goto bad_value;
	} else if (IS("scheduler", "max_tokens_per_step")) {
		if (parse_u32(v, 1, 1u << 16, &c->max_tokens_per_step) < 0)
			goto bad_value;
	} else if (IS("scheduler", "max_step_ms")) {
		if (parse_u32(v, 0, 60000, &c->max_step_ms) < 0)
			goto bad_value;
	} else if (IS("scheduler", "max_waiting")) {
		if (parse_u32(v, 1, 1u << 20, &c->max_waiting) < 0)
			goto bad_value;
	} else if (IS("scheduler", "session_idle_timeout")) {
		if (parse_u32(v, 0, 86400 * 7, &c->session_idle_s) < 0)
			goto bad_value;
	} else if (IS("server", "socket")) {
		if (!*v || copy_str(c->socket, sizeof(c->socket), v) < 0 || strlen(v) >= 108)
			goto bad_value;
	} else if (IS("server", "socket_mode")) {
		char *end;
		unsigned long m = strtoul(v, &end, 8);
		if (!*v || *end || m > 0777)
			goto bad_value;
		c->socket_mode = (mode_t)m;
	} else if (IS("server", "socket_group")) {
		if (copy_str(c->socket_group, sizeof(c->socket_group), v) < 0)
			goto bad_value;
	} else if (IS("server", "allowed_users")) {
		r = parse_ids(v, lookup_user, c->allowed_uids, &c->n_allowed_uids, bad, sizeof(bad));
		if (r == -ENOENT) {
			snprintf(msg, ml, "unknown user '%s'", bad);
			return -EINVAL;
		}
		if (r < 0)
			goto bad_value;
	} else if (IS("server", "allowed_groups")) {
		r = parse_ids(v, lookup_group, c->allowed_gids, &c->n_allowed_gids, bad, sizeof(bad));
		if (r == -ENOENT) {
			snprintf(msg, ml, "unknown group '%s'", bad);
			return -EINVAL;
		}
		if (r < 0)
			goto bad_value;
	} else if (IS("server", "admin_groups")) {
		r = parse_ids(v, lookup_group, c->admin_gids, &c->n_admin_gids, bad, sizeof(bad));
		if (r == -ENOENT) {
			snprintf(msg, ml, "unknown group '%s'", bad);
			return -EINVAL;
		}
		if (r < 0)
			goto bad_value;
	} else if (IS("server", "max_clients")) {
		if (parse_u32(v, 1, 65536, &c->max_clients) < 0)
			goto bad_value;
	} else if (IS("server", "max_clients_per_user")) {
		if (parse_u32(v, 1, 65536, &c->max_clients_per_user) < 0)
			goto bad_value;
	} else if (IS("server", "admin_reserved_clients")) {
		if (parse_u32(v, 0, 1024, &c->admin_reserved_clients) < 0)
			goto bad_value;
	} else if (IS("server", "idle_timeout")) {
		if (parse_u32(v, 0, 86400 * 7, &c->idle_timeout_s) < 0)
			goto bad_value;
	} else if (IS("server", "max_requests_per_client")) {
		if (parse_u32(v, 1, 4096, &c->max_requests_per_client) < 0)
			goto bad_value;
	} else if (IS("server", "max_prompt_bytes")) {
		if (kvd_parse_size(v, &u64) < 0 || u64 == 0 || u64 > (16u << 20))
			goto bad_value;
		c->max_prompt_bytes = u64;
	} else if (IS("server", "drain_timeout")) {
		if (parse_u32(v, 0, 3600, &c->drain_timeout_s) < 0)
			goto bad_value;
	} else if (IS("server", "token_ring_size")) {
		if (kvd_parse_size(v, &u64) < 0 || u64 < (16u << 10) || u64 > (64u << 20) || (u64 & (u64 - 1))) {
			snprintf(msg, ml, "token_ring_size must be a power of two from 16K to 64M, not '%s'", v);
			return -EINVAL;
		}
		c->token_ring_bytes = (uint32_t)u64;
	} else if (IS("log", "level")) {
		size_t i;
		for (i = 0; i < sizeof(log_levels) / sizeof(log_levels[0]); i++)
			if (!strcmp(v, log_levels[i]))
				break;
		if (i == sizeof(log_levels) / sizeof(log_levels[0])) {
			snprintf(msg, ml, "log level must be one of emerg..debug (err, warning, notice, info, debug), not '%s'", v);
			return -EINVAL;
		}
		c->log_level = (int)i;
	} else if (IS("log", "ledger")) {
		if (copy_str(c->ledger_log, sizeof(c->ledger_log), v) < 0)
			goto bad_value;
	} else {
		snprintf(msg, ml, "unknown key '%s' in section [%s]", key, sec);
		return -EINVAL;
	}
	return 0;
#undef IS
bad_value:
	snprintf(msg, ml, "bad value '%s' for %s.%s", v, sec, key);
	return -EINVAL;
}

struct parse_ctx {
	struct kvd_config *c;
	FILE *f;
	const char *path;
	int line;        /* lines read so far: the handler runs for the last one */
	int err_line;    /* line of the first key the handler refused; 0: none */
	char msg[512];   /* why it refused that key */
};

/* inih's line reader, counting lines: Debian's inih passes no line number
 * to the handler (INI_HANDLER_LINENO=0), and the handler wants one. */
static char *conf_reader(char *str, int num, void *stream)
{
	struct parse_ctx *p = stream;
	char *r = fgets(str, num, p->f);
	if (r)
		p->line++;
	return r;
}

/* inih goes on after an error and returns the line of the first one; only
 * the first refused key's line and message are kept, so that the message
 * printed is the one of the line printed. */
static int conf_handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse_ctx *p = user;
	char msg[sizeof(p->msg)];
	if (!name) /* section header alone (INI_CALL_HANDLER_ON_NEW_SECTION) */
		return 1;
	if (set_key(p->c, section, name, value, msg, sizeof(msg)) < 0) {
		if (!p->err_line) {
			p->err_line = p->line;
			memcpy(p->msg, msg, sizeof(p->msg));
		}
		return 0;
	}
	if (!strcmp(section, "model") && !strcmp(name, "path"))
		snprintf(p->c->model_origin, sizeof(p->c->model_origin), "%s:%d", p->path, p->line);
	return 1;
}

/* Why inih could not parse line `line` of the file (read again). */
static void syntax_message(const char *path, int line, char *msg, size_t ml)
{
	char buf[256] = "";
	FILE *f = fopen(path, "r");
	int n = 0;

	while (f && fgets(buf, sizeof(buf), f) && ++n < line)
		;
	if (f)
		fclose(f);
	if (n != line) {
		snprintf(msg, ml, "syntax error");
		return;
	}
	buf[strcspn(buf, "\r\n")] = 0;
	const char *t = buf + strspn(buf, " \t");
	if (*t == '[' && !strchr(t, ']'))
		snprintf(msg, ml, "syntax error: section header '%s' has no closing ']'", t);
	else
		snprintf(msg, ml, "syntax error: expected [section], key = value or a comment, not '%s'", t);
}

int kvd_config_load(struct kvd_config *c, const char *path, char *err, size_t errlen)
{
	struct parse_ctx p = {.c = c, .path = path};
	int line, saved;

	p.f = fopen(path, "r");
	if (!p.f) {
		saved = errno;
		snprintf(err, errlen, "%s: cannot read the configuration: %s", path, strerror(saved));
		return -saved;
	}
	line = ini_parse_stream(conf_reader, &p, conf_handler, &p);
	fclose(p.f);
	if (line == 0)
		return 0;
	if (line < 0) { /* inih could not allocate its line buffer */
		snprintf(err, errlen, "%s: cannot parse the configuration: %s", path, strerror(ENOMEM));
		return -ENOMEM;
	}
	/* the first error is a refused key, or else a line inih could not parse */
	if (line != p.err_line)
		syntax_message(path, line, p.msg, sizeof(p.msg));
	snprintf(err, errlen, "%s:%d: %s", path, line, p.msg);
	return -EINVAL;
}

int kvd_config_set(struct kvd_config *c, const char *section, const char *key, const char *value,
		   const char *origin, char *err, size_t errlen)
{
	char msg[512];
	int r = set_key(c, section, key, value, msg, sizeof(msg));
	if (r < 0)
		snprintf(err, errlen, "%s: %s", origin, msg);
	else if (!strcmp(section, "model") && !strcmp(key, "path"))
		snprintf(c->model_origin, sizeof(c->model_origin), "%s", origin);
	return r;
}

int kvd_config_validate(const struct kvd_config *c, char *err, size_t errlen)
{
	struct stat st;
	const char *origin = c->model_origin[0] ? c->model_origin : "built-in default [model] path";
	if (stat(c->model, &st) < 0) {
		snprintf(err, errlen, "%s: model '%s': %s", origin, c->model, strerror(errno));
		return -EINVAL;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s: model '%s' is not a regular file", origin, c->model);
		return -EINVAL;
	}
	if (c->swap_file[0] && c->swap_bytes == 0) {
		snprintf(err, errlen, "swap_file is set but swap_size is 0");
		return -EINVAL;
	}
	return 0;
}
