/*
 * daemon/config.h — kvd's configuration: defaults, the INI file (inih),
 * and command-line overrides, validated in one place.
 *
 * Every key is documented with its default in etc/kvd.conf. Errors come
 * back as "file:line: message" so an operator can fix them directly.
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
	int prefix_caching;
	char swap_file[KVD_CONF_PATH_MAX]; /* empty: no swap */
	uint64_t swap_bytes;
	uint32_t max_model_len;    /* 0: the model's context length */
	uint32_t max_num_seqs;
	uint32_t max_tokens_per_step;
	uint32_t max_step_ms;
	uint32_t max_waiting;
	uint32_t session_idle_s;
	char socket[KVD_CONF_PATH_MAX];
	mode_t socket_mode;
	char socket_group[64];     /* empty: leave the group alone */
	uid_t allowed_uids[KVD_CONF_MAX_IDS];
	size_t n_allowed_uids;
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
	uint32_t drain_timeout_s;  /* SIGTERM: finish in-flight requests this long */
	uint32_t token_ring_bytes; /* per-client server->client ring (power of two) */
	int log_level;             /* sd-daemon priority: 3 err .. 7 debug */
	char ledger_log[KVD_CONF_PATH_MAX]; /* empty: no per-request ledger file */
	/* Where model.path was last set ("file:line", "--model"), for messages
	 * about the model; empty while it is the built-in default. */
	char model_origin[KVD_CONF_PATH_MAX + 32];
};

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

/* Parse "123", "64K", "512M", "2G", "1T" (powers of 1024). */
int kvd_parse_size(const char *s, uint64_t *ret);

#endif
