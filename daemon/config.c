/*
 * daemon/config.c — the key table, value parsers and validation.
 *
 * kvd_conf_keys[] is the one list of keys: set_key() parses a value by its
 * row, kvd_config_defaults() sets every row's default through the same
 * parser, and main.c (options, --help) and server.c (SIGHUP) read the rows.
 */
#include "config.h"
#include "backend.h" /* KVD_KV_TYPES */
#include "spec.h"

#include <assert.h>
#include <errno.h>
#include <ctype.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <stddef.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
	case 'B': break; /* plain bytes: "512B", taken below */
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

#define FIELD(f) offsetof(struct kvd_config, f), sizeof(((struct kvd_config *)0)->f)
#define NO_FIELD2 0, 0
#define OPT(long_name, short_name, arg) long_name, short_name, arg, NULL
#define NO_OPT NULL, 0, NULL, NULL
#define STR_MAX(f) (sizeof(((struct kvd_config *)0)->f) - 1)

static const char *const backends[] = { "auto", "cpu", "cuda", NULL };
/* "auto", then kernels/backend.h's KV types (KVD_KV_TYPES), and the
 * message naming them all ("auto, f16, ..., q4_0 or f32") */
#define CACHE_TYPE_NAME(e, v, name, be, bb) name,
static const char *const cache_types[] = { "auto", KVD_KV_TYPES(CACHE_TYPE_NAME) NULL };
#define CACHE_TYPE_LIST(e, v, name, be, bb) ", " name
#define CACHE_TYPE_LAST(e, v, name, be, bb) " or " name
#define CACHE_TYPE_BAD_MSG "cache_type must be auto" KVD_KV_TYPES_(CACHE_TYPE_LIST, CACHE_TYPE_LAST) ", not '%s'"
static const char *const prefix_sharings[] = { "user", "group", "all", NULL };
static const char *const context_policies[] = { "error", "truncate-oldest", "sliding-window", "sinks", NULL };
static const char *const spec_modes[] = { "off", "lookup", "auto", "draft", NULL };
static const char *const log_levels[] = {"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"};
#define N_LOG_LEVELS (sizeof(log_levels) / sizeof(log_levels[0]))

/* One row per key, in etc/kvd.conf's order. t_config.sh reads the first
 * line of each row (section, name, type, default) to check etc/kvd.conf. */
const struct kvd_conf_key kvd_conf_keys[] = {
	{ "model", "path", KVD_CONF_STR, "/var/lib/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf",
	  1, STR_MAX(model), KVD_CONF_RESTART, "GGUF model file", OPT("--model", 'm', "PATH"),
	  NULL, NULL, FIELD(model), NO_FIELD2 },
	{ "engine", "backend", KVD_CONF_STR, "auto",
	  0, STR_MAX(backend), KVD_CONF_RESTART, "auto, cpu or cuda", OPT("--backend", 'b', "NAME"),
	  backends, "backend must be auto, cpu or cuda, not '%s'", FIELD(backend), NO_FIELD2 },
	{ "engine", "threads", KVD_CONF_U32, "0",
	  0, 1024, KVD_CONF_RESTART, "CPU compute threads, 0 = one per CPU", OPT("--threads", 't', "N"),
	  NULL, NULL, FIELD(threads), NO_FIELD2 },
	/* bytes: at least min; a percentage: in (0, max] */
	{ "kv", "pool_size", KVD_CONF_POOL, "25%",
	  1, 90, KVD_CONF_RESTART, "KV pool: bytes (512M, 2G) or a percentage of available memory (25%)",
	  OPT("--pool-size", 0, "SIZE"), NULL, "pool_size percentage must be in (0, 90], not '%s'",
	  FIELD(pool_bytes), FIELD(pool_fraction) },
	{ "kv", "block_size", KVD_CONF_U32, "16",
	  1, 1024, KVD_CONF_RESTART, "tokens per KV page", OPT("--block-size", 0, "N"),
	  NULL, NULL, FIELD(block_size), NO_FIELD2 },
	{ "kv", "cache_type", KVD_CONF_STR, "auto",
	  1, STR_MAX(cache_type), KVD_CONF_RESTART, "K/V element type: auto (bf16 where the CPU backend has bfloat16 products, AVX-512 BF16; else f16), f16, bf16, q8_0, q4_0 (32-element blocks, one scale each) or f32",
	  OPT("--cache-type", 0, "TYPE"), cache_types, CACHE_TYPE_BAD_MSG,
	  FIELD(cache_type), NO_FIELD2 },
	{ "kv", "prefix_caching", KVD_CONF_BOOL, "yes",
	  0, 1, KVD_CONF_RESTART, "do not share or cache prompt prefixes",
	  "--no-prefix-caching", 0, NULL, "no", NULL, NULL, FIELD(prefix_caching), NO_FIELD2 },
	{ "kv", "prefix_sharing", KVD_CONF_STR, "user",
	  1, STR_MAX(prefix_sharing), KVD_CONF_LIVE,
	  "who shares cached prompt prefixes: user (each uid its own cache), group (each primary group) or all "
	  "(everyone; one user can then learn another's prompts from hits and timing)",
	  OPT("--prefix-sharing", 0, "WHO"), prefix_sharings, "prefix_sharing must be user, group or all, not '%s'",
	  FIELD(prefix_sharing), NO_FIELD2 },
	{ "kv", "swap_file", KVD_CONF_STR, "",
	  0, STR_MAX(swap_file), KVD_CONF_RESTART, "swap file for preempted sequences; \"\" = none",
	  OPT("--swap-file", 0, "PATH"), NULL, NULL, FIELD(swap_file), NO_FIELD2 },
	{ "kv", "swap_size", KVD_CONF_SIZE, "1G",
	  0, UINT64_MAX, KVD_CONF_RESTART, "swap file size", OPT("--swap-size", 0, "SIZE"),
	  NULL, NULL, FIELD(swap_bytes), NO_FIELD2 },
	{ "kv", "release_local", KVD_CONF_BOOL, "yes",
	  0, 1, KVD_CONF_RESTART,
	  "keep every layer's K/V for the whole context even where a model's windowed layers no longer read it "
	  "(Gemma 3's local layers)",
	  "--no-release-local", 0, NULL, "no", NULL, NULL, FIELD(release_local), NO_FIELD2 },
	{ "kv", "keep_on_restart", KVD_CONF_BOOL, "yes",
	  0, 1, KVD_CONF_RESTART, "do not hand the KV pool and prefix index to systemd's fd store at a clean stop",
	  "--no-keep-on-restart", 0, NULL, "no", NULL, NULL, FIELD(keep_on_restart), NO_FIELD2 },
	/* Hibernation of the prefix cache to a file (daemon/persist.h), kept together. */
	{ "kv", "persist_path", KVD_CONF_STR, "auto",
	  0, STR_MAX(persist_path), KVD_CONF_RESTART,
	  "file the prefix cache is written to at a clean stop and adopted from at start; auto = "
	  "$STATE_DIRECTORY/prefix-cache under systemd (StateDirectory=), else none; \"\" = none",
	  OPT("--persist-path", 0, "PATH"), NULL, NULL, FIELD(persist_path), NO_FIELD2 },
	{ "kv", "persist_size", KVD_CONF_SIZE, "1G",
	  0, UINT64_MAX, KVD_CONF_RESTART, "most bytes of cached pages written at a stop (hottest first)",
	  OPT("--persist-size", 0, "SIZE"), NULL, NULL, FIELD(persist_bytes), NO_FIELD2 },
	{ "kv", "persist_timeout", KVD_CONF_U32, "10",
	  0, 3600, KVD_CONF_RESTART,
	  "seconds the write at a stop may take at most (keep it below the unit's TimeoutStopSec)",
	  OPT("--persist-timeout", 0, "SECONDS"), NULL, NULL, FIELD(persist_timeout_s), NO_FIELD2 },
	{ "scheduler", "max_model_len", KVD_CONF_U32, "0",
	  0, 1u << 24, KVD_CONF_RESTART, "longest prompt + generation; 0 = the model's context",
	  OPT("--max-model-len", 0, "N"), NULL, NULL, FIELD(max_model_len), NO_FIELD2 },
	{ "scheduler", "max_num_seqs", KVD_CONF_U32, "64",
	  1, 4096, KVD_CONF_LIVE, "sequences decoded together", OPT("--max-num-seqs", 0, "N"),
	  NULL, NULL, FIELD(max_num_seqs), NO_FIELD2 },
	{ "scheduler", "max_tokens_per_step", KVD_CONF_U32, "512",
	  1, 1u << 16, KVD_CONF_LIVE, "tokens computed per step", OPT("--max-tokens-per-step", 0, "N"),
	  NULL, NULL, FIELD(max_tokens_per_step), NO_FIELD2 },
	{ "scheduler", "max_step_ms", KVD_CONF_U32, "50",
	  0, 60000, KVD_CONF_LIVE, "while requests decode, a step lasts about this long at most (planned with a margin for the measured spread of step times); 0 = no limit",
	  OPT("--max-step-ms", 0, "MS"), NULL, NULL, FIELD(max_step_ms), NO_FIELD2 },
	{ "scheduler", "max_waiting", KVD_CONF_U32, "1024",
	  1, 1u << 20, KVD_CONF_LIVE, "requests queued (accepted but not started) at most", NO_OPT,
	  NULL, NULL, FIELD(max_waiting), NO_FIELD2 },
	{ "scheduler", "session_idle_timeout", KVD_CONF_U32, "600",
	  0, 86400 * 7, KVD_CONF_LIVE, "seconds an idle session keeps its KV; 0 = never", NO_OPT,
	  NULL, NULL, FIELD(session_idle_s), NO_FIELD2 },
	{ "scheduler", "context_policy", KVD_CONF_STR, "error",
	  1, STR_MAX(context_policy), KVD_CONF_LIVE,
	  "requests and sessions that name no policy: error, truncate-oldest, sliding-window or sinks",
	  OPT("--context-policy", 0, "POLICY"), context_policies,
	  "context_policy must be error, truncate-oldest, sliding-window or sinks, not '%s'", FIELD(context_policy),
	  NO_FIELD2 },
	{ "scheduler", "context_window", KVD_CONF_U32, "0",
	  0, 1u << 24, KVD_CONF_LIVE, "tokens the window policies keep at least; 0 = as many as fit", NO_OPT,
	  NULL, NULL, FIELD(context_window), NO_FIELD2 },
	{ "scheduler", "context_sinks", KVD_CONF_U32, "4",
	  1, 1u << 24, KVD_CONF_LIVE, "first tokens the sinks policy keeps (rounded up to KV pages)", NO_OPT,
	  NULL, NULL, FIELD(context_sinks), NO_FIELD2 },
	{ "speculative", "mode", KVD_CONF_STR, "auto",
	  1, STR_MAX(spec_mode), KVD_CONF_LIVE,
	  "speculative decoding: off; lookup (draft from n-gram matches in the request's own prompt and output, "
	  "draft length learnt from each sequence's acceptance); draft (the draft model drafts); or auto (lookup, "
	  "and the draft model where lookup finds nothing, each draft token only where its measured acceptance "
	  "beats its measured cost); outputs stay byte-identical",
	  OPT("--speculative", 0, "MODE"), spec_modes, "speculative mode must be off, lookup, auto or draft, not '%s'",
	  FIELD(spec_mode), NO_FIELD2 },
	{ "speculative", "draft_tokens", KVD_CONF_U32, "8",
	  1, KVD_SPEC_MAX_DRAFT, KVD_CONF_LIVE, "tokens drafted for one sequence in a step at most", NO_OPT,
	  NULL, NULL, FIELD(spec_draft_tokens), NO_FIELD2 },
	{ "speculative", "min_match", KVD_CONF_U32, "3",
	  1, KVD_SPEC_MAX_MIN_MATCH, KVD_CONF_LIVE, "last tokens that must match earlier in the sequence for a lookup draft",
	  NO_OPT, NULL, NULL, FIELD(spec_min_match), NO_FIELD2 },
	{ "speculative", "draft_model", KVD_CONF_STR, "",
	  0, STR_MAX(spec_draft_model), KVD_CONF_RESTART,
	  "draft model GGUF (the target's vocabulary; loaded beside it, same backend and threads); \"\" = none",
	  OPT("--draft-model", 0, "PATH"), NULL, NULL, FIELD(spec_draft_model), NO_FIELD2 },
	{ "speculative", "draft_pool_size", KVD_CONF_SIZE, "64M",
	  1, UINT64_MAX, KVD_CONF_RESTART, "the draft model's KV pool (a cache: a full one drops draft sequences)",
	  OPT("--draft-pool-size", 0, "SIZE"), NULL, NULL, FIELD(spec_draft_pool_bytes), NO_FIELD2 },
	{ "server", "socket", KVD_CONF_STR, "/run/kvd/kvd.sock",
	  1, 107, KVD_CONF_RESTART, "Unix socket path; \"@name\" for the abstract namespace",
	  OPT("--socket", 's', "PATH"), NULL, NULL, FIELD(socket), NO_FIELD2 },
	{ "server", "socket_mode", KVD_CONF_MODE, "0660",
	  0, 0777, KVD_CONF_RESTART, "permission bits of the socket kvd creates itself", NO_OPT,
	  NULL, NULL, FIELD(socket_mode), NO_FIELD2 },
	{ "server", "socket_group", KVD_CONF_STR, "",
	  0, STR_MAX(socket_group), KVD_CONF_RESTART, "group of the socket kvd creates itself", NO_OPT,
	  NULL, NULL, FIELD(socket_group), NO_FIELD2 },
	{ "server", "allowed_users", KVD_CONF_USERS, "",
	  0, KVD_CONF_MAX_IDS, KVD_CONF_LIVE, "users who may connect (both lists empty: anyone)", NO_OPT,
	  NULL, NULL, FIELD(allowed_uids), FIELD(n_allowed_uids) },
	{ "server", "allowed_groups", KVD_CONF_GROUPS, "",
	  0, KVD_CONF_MAX_IDS, KVD_CONF_LIVE, "groups whose members may connect", NO_OPT,
	  NULL, NULL, FIELD(allowed_gids), FIELD(n_allowed_gids) },
	{ "server", "admin_groups", KVD_CONF_GROUPS, "",
	  0, KVD_CONF_MAX_IDS, KVD_CONF_LIVE, "administrators besides root", NO_OPT,
	  NULL, NULL, FIELD(admin_gids), FIELD(n_admin_gids) },
	{ "server", "gateway_users", KVD_CONF_USERS, "",
	  0, KVD_CONF_MAX_IDS, KVD_CONF_LIVE,
	  "trusted gateways (kvd-http's user): each tenant they name is an owner of its own for fair scheduling",
	  NO_OPT, NULL, NULL, FIELD(gateway_uids), FIELD(n_gateway_uids) },
	{ "server", "max_clients", KVD_CONF_U32, "256",
	  1, 65536, KVD_CONF_LIVE, "connected clients at most", NO_OPT,
	  NULL, NULL, FIELD(max_clients), NO_FIELD2 },
	{ "server", "admin_reserved_clients", KVD_CONF_U32, "4",
	  0, 1024, KVD_CONF_LIVE, "of max_clients, slots only administrators may take", NO_OPT,
	  NULL, NULL, FIELD(admin_reserved_clients), NO_FIELD2 },
	{ "server", "max_clients_per_user", KVD_CONF_U32, "32",
	  1, 65536, KVD_CONF_LIVE, "connections one user may hold at once", NO_OPT,
	  NULL, NULL, FIELD(max_clients_per_user), NO_FIELD2 },
	{ "server", "idle_timeout", KVD_CONF_U32, "300",
	  0, 86400 * 7, KVD_CONF_LIVE, "seconds an idle connection holding nothing stays; 0 = never", NO_OPT,
	  NULL, NULL, FIELD(idle_timeout_s), NO_FIELD2 },
	{ "server", "max_requests_per_client", KVD_CONF_U32, "16",
	  1, 4096, KVD_CONF_LIVE, "requests in flight per client at most", NO_OPT,
	  NULL, NULL, FIELD(max_requests_per_client), NO_FIELD2 },
	{ "server", "max_prompt_bytes", KVD_CONF_SIZE, "1M",
	  1, 16u << 20, KVD_CONF_LIVE, "bytes of prompt text per request at most", NO_OPT,
	  NULL, NULL, FIELD(max_prompt_bytes), NO_FIELD2 },
	{ "limits", "max_constraint_bytes", KVD_CONF_SIZE, "256K",
	  1, 1u << 20, KVD_CONF_LIVE,
	  "bytes of a request's constraint (JSON Schema, grammar, regex or choice list) at most; larger ones are "
	  "refused (E2BIG)", NO_OPT, NULL, NULL, FIELD(max_constraint_bytes), NO_FIELD2 },
	{ "server", "drain_timeout", KVD_CONF_U32, "10",
	  0, 3600, KVD_CONF_LIVE, "on SIGTERM, time running requests get to finish",
	  OPT("--drain-timeout", 0, "SEC"), NULL, NULL, FIELD(drain_timeout_s), NO_FIELD2 },
	{ "server", "token_ring_size", KVD_CONF_SIZE_POW2, "256K",
	  16u << 10, 64u << 20, KVD_CONF_LIVE, "each client's ring for the token stream", NO_OPT,
	  NULL, "token_ring_size must be a power of two from 16K to 64M, not '%s'", FIELD(token_ring_bytes),
	  NO_FIELD2 },
	{ "log", "level", KVD_CONF_LOG_LEVEL, "info",
	  0, N_LOG_LEVELS - 1, KVD_CONF_LIVE, "err, warning, notice, info or debug", OPT("--log-level", 'l', "LEVEL"),
	  NULL, "log level must be one of emerg..debug (err, warning, notice, info, debug), not '%s'",
	  FIELD(log_level), NO_FIELD2 },
	{ "log", "ledger", KVD_CONF_STR, "",
	  0, STR_MAX(ledger_log), KVD_CONF_LIVE,
	  "append one JSON record per finished or rejected request (reopened on SIGHUP)", OPT("--ledger", 0, "PATH"),
	  NULL, NULL, FIELD(ledger_log), NO_FIELD2 },
};
const size_t kvd_conf_n_keys = sizeof(kvd_conf_keys) / sizeof(kvd_conf_keys[0]);

/* The row of section.name; NULL when there is none. */
static const struct kvd_conf_key *kvd_conf_find(const char *section, const char *name)
{
	for (size_t i = 0; i < kvd_conf_n_keys; i++)
		if (!strcmp(kvd_conf_keys[i].section, section) && !strcmp(kvd_conf_keys[i].name, name))
			return &kvd_conf_keys[i];
	return NULL;
}

/* Returns 0 or -EINVAL with the reason (without location) in msg. */
static int set_key(struct kvd_config *c, const char *sec, const char *key, const char *v, char *msg, size_t ml)
{
	const struct kvd_conf_key *k = kvd_conf_find(sec, key);
	char *field, *field2, bad[128];
	uint64_t u64;
	uint32_t u32;
	size_t len, n;
	int r, b;

	if (!k) {
		snprintf(msg, ml, "unknown key '%s' in section [%s]", key, sec);
		return -EINVAL;
	}
	field = (char *)c + k->off;
	field2 = (char *)c + k->off2;
	switch (k->type) {
	case KVD_CONF_STR:
		len = strlen(v);
		if (len < k->min || len > k->max)
			goto bad_value;
		if (k->choices) {
			for (n = 0; k->choices[n] && strcmp(v, k->choices[n]); n++)
				;
			if (!k->choices[n])
				goto bad_value;
		}
		memcpy(field, v, len + 1);
		break;
	case KVD_CONF_U32:
		if (parse_u32(v, (uint32_t)k->min, (uint32_t)k->max, &u32) < 0)
			goto bad_value;
		assert(k->size == sizeof(u32));
		memcpy(field, &u32, sizeof(u32)); /* a uint32_t, or an int (threads) */
		break;
	case KVD_CONF_BOOL:
		if (parse_bool(v, &b) < 0)
			goto bad_value;
		memcpy(field, &b, sizeof(b));
		break;
	case KVD_CONF_SIZE:
		if (kvd_parse_size(v, &u64) < 0 || u64 < k->min || u64 > k->max)
			goto bad_value;
		memcpy(field, &u64, sizeof(u64));
		break;
	case KVD_CONF_SIZE_POW2:
		if (kvd_parse_size(v, &u64) < 0 || u64 < k->min || u64 > k->max || (u64 & (u64 - 1)))
			goto bad_value;
		u32 = (uint32_t)u64;
		memcpy(field, &u32, sizeof(u32));
		break;
	case KVD_CONF_MODE: {
		char *end;
		unsigned long m = strtoul(v, &end, 8);
		if (!*v || *end || m > k->max)
			goto bad_value;
		*(mode_t *)(void *)field = (mode_t)m;
		break;
	}
	case KVD_CONF_USERS:
	case KVD_CONF_GROUPS:
		r = parse_ids(v, k->type == KVD_CONF_USERS ? lookup_user : lookup_group, (uint32_t *)(void *)field,
			      (size_t *)(void *)field2, bad, sizeof(bad));
		if (r == -ENOENT) {
			snprintf(msg, ml, "unknown %s '%s'", k->type == KVD_CONF_USERS ? "user" : "group", bad);
			return -EINVAL;
		}
		if (r < 0)
			goto bad_value;
		break;
	case KVD_CONF_POOL:
		len = strlen(v);
		if (len > 1 && v[len - 1] == '%') {
			char *end;
			double f = strtod(v, &end);
			if (end != v + len - 1 || !(f > 0 && f <= (double)k->max))
				goto bad_message;
			f /= 100.0;
			u64 = 0;
			memcpy(field2, &f, sizeof(f));
		} else if (kvd_parse_size(v, &u64) < 0 || u64 < k->min) {
			goto bad_value;
		}
		memcpy(field, &u64, sizeof(u64));
		break;
	case KVD_CONF_LOG_LEVEL:
		for (n = 0; n < N_LOG_LEVELS && strcmp(v, log_levels[n]); n++)
			;
		if (n == N_LOG_LEVELS)
			goto bad_message;
		b = (int)n;
		memcpy(field, &b, sizeof(b));
		break;
	}
	return 0;
bad_value:
	if (k->bad_msg && k->type != KVD_CONF_POOL)
		goto bad_message;
	snprintf(msg, ml, "bad value '%s' for %s.%s", v, sec, key);
	return -EINVAL;
bad_message:
	snprintf(msg, ml, k->bad_msg, v);
	return -EINVAL;
}

void kvd_config_defaults(struct kvd_config *c)
{
	char msg[256];

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < kvd_conf_n_keys; i++) {
		int r = set_key(c, kvd_conf_keys[i].section, kvd_conf_keys[i].name, kvd_conf_keys[i].def, msg,
				sizeof(msg));
		assert(r == 0); /* the table's own defaults parse */
		(void)r;
	}
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
	if (c->spec_draft_model[0] && stat(c->spec_draft_model, &st) < 0) {
		snprintf(err, errlen, "[speculative] draft_model '%s': %s", c->spec_draft_model, strerror(errno));
		return -EINVAL;
	}
	if (!strcmp(c->spec_mode, "draft") && !c->spec_draft_model[0]) {
		snprintf(err, errlen, "[speculative] mode = draft needs a draft model ([speculative] draft_model, --draft-model)");
		return -EINVAL;
	}
	if (c->swap_file[0] && c->swap_bytes == 0) {
		snprintf(err, errlen, "swap_file is set but swap_size is 0");
		return -EINVAL;
	}
	return 0;
}
