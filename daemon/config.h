/*
 * daemon/config.h — kvd's configuration: defaults, the INI file (inih),
 * and command-line overrides, validated in one place.
 *
 * One table, kvd_conf_keys[], lists every key: its section and name, type,
 * default, limits, whether SIGHUP applies it, a line of help and the kvd
 * option that sets it. Parsing, the defaults, kvd --help's option list and
 * the reload all read that table; etc/kvd.conf documents exactly its keys
 * with the same defaults (tests/integration/t_config.sh checks both).
 * Errors come back as "file:line: message" so an operator can fix them
 * directly.
 */
#ifndef KVD_CONFIG_H
#define KVD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KVD_CONF_MAX_IDS 64
#define KVD_CONF_PATH_MAX 4096

struct kvd_config {
	char model[KVD_CONF_PATH_MAX];
	char backend[16];          /* auto | cpu | cuda */
	int threads;               /* 0: one per CPU */
	uint64_t pool_bytes;       /* 0: use pool_fraction */
	double pool_fraction;
	uint32_t block_size;
	char cache_type[8];        /* auto | f16 | bf16 | q8_0 | q4_0 | f32: K/V element type */
	int prefix_caching;
	char prefix_sharing[8];     /* user | group | all: who shares cached prefixes (scope.h) */
	char swap_file[KVD_CONF_PATH_MAX]; /* empty: no swap */
	uint64_t swap_bytes;
	int keep_on_restart;       /* hand the pool to systemd's fd store at a clean stop */
	char persist_path[KVD_CONF_PATH_MAX]; /* hibernation file; "auto"; empty: none */
	uint64_t persist_bytes;    /* most bytes in it */
	uint32_t persist_timeout_s; /* longest write at a stop */
	int release_local;         /* release pages windowed layers are done with */
	uint32_t max_model_len;    /* 0: the model's context length */
	uint32_t max_num_seqs;
	uint32_t max_tokens_per_step;
	uint32_t max_step_ms;
	uint32_t max_waiting;
	uint32_t session_idle_s;
	char context_policy[16];   /* error | truncate-oldest | sliding-window | sinks */
	uint32_t context_window;   /* window policies: tokens; 0 = as many as fit */
	uint32_t context_sinks;    /* sinks: first tokens kept */
	char spec_mode[8];         /* [speculative] mode: off | lookup | auto | draft */
	uint32_t spec_draft_tokens; /* tokens drafted per step at most */
	uint32_t spec_min_match;   /* n-gram length a prompt-lookup draft needs */
	char spec_draft_model[KVD_CONF_PATH_MAX]; /* draft model GGUF; empty: none */
	uint64_t spec_draft_pool_bytes; /* the draft model's KV pool */
	char socket[KVD_CONF_PATH_MAX];
	mode_t socket_mode;
	char socket_group[64];     /* empty: leave the group alone */
	uid_t allowed_uids[KVD_CONF_MAX_IDS];
	size_t n_allowed_uids;
	uid_t gateway_uids[KVD_CONF_MAX_IDS]; /* trusted gateways: their tenants are owners */
	size_t n_gateway_uids;
	gid_t allowed_gids[KVD_CONF_MAX_IDS];
	size_t n_allowed_gids;
	gid_t admin_gids[KVD_CONF_MAX_IDS]; /* with root: administrators */
	size_t n_admin_gids;
	uint32_t max_clients;
	uint32_t max_clients_per_user;
	uint32_t admin_reserved_clients; /* of max_clients, only administrators may take */
	uint32_t idle_timeout_s;   /* close a connection holding nothing this long; 0: never */
	uint32_t max_requests_per_client;
	uint64_t max_prompt_bytes;
	uint64_t max_constraint_bytes; /* [limits]: a request's constraint text at most */
	uint32_t drain_timeout_s;  /* SIGTERM: finish in-flight requests this long */
	uint32_t token_ring_bytes; /* per-client server->client ring (power of two) */
	int log_level;             /* sd-daemon priority: 3 err .. 7 debug */
	char ledger_log[KVD_CONF_PATH_MAX]; /* empty: no per-request ledger file */
	/* Where model.path was last set ("file:line", "--model"), for messages
	 * about the model; empty while it is the built-in default. */
	char model_origin[KVD_CONF_PATH_MAX + 32];
};

enum kvd_conf_type {
	KVD_CONF_STR,        /* text; min/max: its length in bytes; choices: allowed values */
	KVD_CONF_U32,        /* integer in [min, max] (uint32_t or int field) */
	KVD_CONF_BOOL,       /* yes/no, true/false, on/off, 1/0 (int field) */
	KVD_CONF_SIZE,       /* bytes with K/M/G/T, in [min, max] (uint64_t field) */
	KVD_CONF_SIZE_POW2,  /* a power of two of bytes in [min, max] (uint32_t field) */
	KVD_CONF_MODE,       /* octal permission bits (mode_t field) */
	KVD_CONF_USERS,      /* user names or uids; field2: the count */
	KVD_CONF_GROUPS,     /* group names or gids; field2: the count */
	KVD_CONF_POOL,       /* bytes, or a percentage "25%" (field2: the fraction) */
	KVD_CONF_LOG_LEVEL,  /* emerg .. debug, stored as 0 .. 7 (int field) */
};

enum kvd_conf_reload {
	KVD_CONF_LIVE,       /* SIGHUP applies a new value at once */
	KVD_CONF_RESTART,    /* SIGHUP keeps the running value and says a restart is needed */
};

struct kvd_conf_key {
	const char *section, *name;
	enum kvd_conf_type type;
	const char *def;               /* the default, written as in etc/kvd.conf */
	uint64_t min, max;             /* limits (see the type) */
	enum kvd_conf_reload reload;
	const char *help;              /* one sentence, for kvd --help */
	const char *opt;               /* kvd's option ("--pool-size"), or NULL */
	char opt_short;                /* its short form ('m'), or 0 */
	const char *opt_arg;           /* the option's argument ("SIZE"); NULL: it takes none... */
	const char *opt_value;         /* ...and sets this value */
	const char *const *choices;    /* KVD_CONF_STR: the allowed values, NULL-terminated; or NULL */
	const char *bad_msg;           /* message for a refused value (one %s: the value); NULL: "bad value" */
	size_t off, size;              /* the field in struct kvd_config */
	size_t off2, size2;            /* a second field it sets (see the type); size2 0: none */
};

/* Every key, in etc/kvd.conf's order; kvd_conf_n_keys rows. */
extern const struct kvd_conf_key kvd_conf_keys[];
extern const size_t kvd_conf_n_keys;

/* Every key at its table default (kvd_conf_keys[].def). */
void kvd_config_defaults(struct kvd_config *c);

/*
 * Parse `path` over the current values. Returns 0; -ENOENT/-EACCES when the
 * file cannot be read; -EINVAL for an unknown section or key or a bad
 * value, with "path:line: message" in err.
 */
int kvd_config_load(struct kvd_config *c, const char *path, char *err, size_t errlen);

/*
 * Set one key as if read from the file ("section.key", value); used for
 * command-line overrides. Same errors, with `origin` in place of path:line.
 */
int kvd_config_set(struct kvd_config *c, const char *section, const char *key, const char *value,
		   const char *origin, char *err, size_t errlen);

/* Cross-field checks after everything is set (the model file must exist,
 * ...). Returns 0 or -EINVAL with a message that starts with the origin of
 * the offending setting ("file:line: ..."). */
int kvd_config_validate(const struct kvd_config *c, char *err, size_t errlen);

/* Parse "123", "64K", "512M", "2G", "1T" (powers of 1024); a unit may be
 * followed by "i" and/or "B" ("64KiB", "512MB"), and a plain number by "B". */
int kvd_parse_size(const char *s, uint64_t *ret);

#endif
