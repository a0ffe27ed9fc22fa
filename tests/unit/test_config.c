/*
 * tests/unit/test_config.c — the configuration key table (daemon/config.c):
 * every row's default parses and is what kvd_config_defaults() sets, every
 * numeric row takes its limits and refuses one past them, the restart-only
 * rows are the ones that shape the process (model, pool, socket), options
 * name their rows, and the messages of a refused value are the documented
 * ones.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "daemon/config.h"

static int set(struct kvd_config *c, const struct kvd_conf_key *k, const char *v, char *err, size_t errlen)
{
	return kvd_config_set(c, k->section, k->name, v, "test", err, errlen);
}

static const struct kvd_conf_key *row(const char *section, const char *name)
{
	for (size_t i = 0; i < kvd_conf_n_keys; i++)
		if (!strcmp(kvd_conf_keys[i].section, section) && !strcmp(kvd_conf_keys[i].name, name))
			return &kvd_conf_keys[i];
	fail_msg("no row %s.%s", section, name);
	return NULL;
}

/* Setting every row to its default on top of kvd_config_defaults() changes
 * no byte: the defaults come from the table and nowhere else. */
static void test_defaults_are_the_table(void **state)
{
	struct kvd_config *d = malloc(sizeof(*d)), *c = malloc(sizeof(*c));
	char err[512];

	assert_non_null(d);
	assert_non_null(c);
	kvd_config_defaults(d);
	*c = *d;
	for (size_t i = 0; i < kvd_conf_n_keys; i++) {
		const struct kvd_conf_key *k = &kvd_conf_keys[i];
		assert_non_null(k->def);
		assert_non_null(k->help);
		if (set(c, k, k->def, err, sizeof(err)) < 0)
			fail_msg("%s.%s: default '%s' refused: %s", k->section, k->name, k->def, err);
	}
	memset(c->model_origin, 0, sizeof(c->model_origin)); /* where model.path was set: "test" */
	assert_memory_equal(c, d, sizeof(*c));
	/* a few, spelled out */
	assert_int_equal(d->block_size, 16);
	assert_int_equal(d->prefix_caching, 1);
	assert_int_equal(d->max_num_seqs, 64);
	assert_int_equal(d->token_ring_bytes, 256u << 10);
	assert_int_equal(d->socket_mode, 0660);
	assert_int_equal(d->log_level, 6);
	assert_true(d->pool_bytes == 0 && d->pool_fraction == 0.25);
	assert_string_equal(d->socket, "/run/kvd/kvd.sock");
	free(c);
	free(d);
}

/* Every integer row takes min and max and refuses one past either. */
static void test_integer_limits(void **state)
{
	struct kvd_config *c = malloc(sizeof(*c));
	char v[64], err[512];
	int n = 0;

	assert_non_null(c);
	kvd_config_defaults(c);
	for (size_t i = 0; i < kvd_conf_n_keys; i++) {
		const struct kvd_conf_key *k = &kvd_conf_keys[i];
		if (k->type != KVD_CONF_U32)
			continue;
		n++;
		snprintf(v, sizeof(v), "%llu", (unsigned long long)k->min);
		assert_int_equal(set(c, k, v, err, sizeof(err)), 0);
		snprintf(v, sizeof(v), "%llu", (unsigned long long)k->max);
		assert_int_equal(set(c, k, v, err, sizeof(err)), 0);
		snprintf(v, sizeof(v), "%llu", (unsigned long long)k->max + 1);
		assert_int_equal(set(c, k, v, err, sizeof(err)), -EINVAL);
		if (k->min > 0) {
			snprintf(v, sizeof(v), "%llu", (unsigned long long)k->min - 1);
			assert_int_equal(set(c, k, v, err, sizeof(err)), -EINVAL);
		}
		snprintf(v, sizeof(v), "bad value '%llu' for %s.%s", (unsigned long long)k->min - 1, k->section, k->name);
		if (k->min > 0)
			assert_non_null(strstr(err, v));
	}
	assert_true(n >= 14);
	free(c);
}

/* The keys that shape the process need a restart; limits apply live. */
static void test_reload_classes(void **state)
{
	static const char *const restart[] = { "model.path", "engine.backend", "engine.threads", "kv.pool_size",
					       "kv.block_size", "kv.cache_type", "kv.prefix_caching", "kv.swap_file", "kv.swap_size", "kv.keep_on_restart", "kv.release_local", "kv.persist_path", "kv.persist_size", "kv.persist_timeout",
					       "scheduler.max_model_len", "server.socket", "server.socket_mode",
					       "server.socket_group", "speculative.draft_model", "speculative.draft_pool_size" };
	size_t n_restart = 0;
	char name[96];

	for (size_t i = 0; i < kvd_conf_n_keys; i++) {
		const struct kvd_conf_key *k = &kvd_conf_keys[i];
		bool listed = false;
		snprintf(name, sizeof(name), "%s.%s", k->section, k->name);
		for (size_t j = 0; j < sizeof(restart) / sizeof(restart[0]); j++)
			listed |= !strcmp(name, restart[j]);
		if (listed != (k->reload == KVD_CONF_RESTART))
			fail_msg("%s: reload class %d", name, k->reload);
		n_restart += listed;
	}
	assert_int_equal(n_restart, sizeof(restart) / sizeof(restart[0]));
	assert_int_equal(row("log", "level")->reload, KVD_CONF_LIVE);
	assert_int_equal(row("server", "allowed_users")->reload, KVD_CONF_LIVE);
}

/* Options: unique, and a flag without an argument says what it sets. */
static void test_options(void **state)
{
	struct kvd_config *c = malloc(sizeof(*c));
	char err[512];

	assert_non_null(c);
	for (size_t i = 0; i < kvd_conf_n_keys; i++) {
		const struct kvd_conf_key *k = &kvd_conf_keys[i];
		if (!k->opt)
			continue;
		assert_true(!strncmp(k->opt, "--", 2));
		assert_true(k->opt_arg || k->opt_value);
		for (size_t j = i + 1; j < kvd_conf_n_keys; j++) {
			if (kvd_conf_keys[j].opt)
				assert_string_not_equal(k->opt, kvd_conf_keys[j].opt);
			if (k->opt_short)
				assert_int_not_equal(k->opt_short, kvd_conf_keys[j].opt_short);
		}
	}
	const struct kvd_conf_key *k = row("kv", "prefix_caching");
	kvd_config_defaults(c);
	assert_string_equal(k->opt, "--no-prefix-caching");
	assert_int_equal(set(c, k, k->opt_value, err, sizeof(err)), 0);
	assert_int_equal(c->prefix_caching, 0);
	free(c);
}

/* The messages t_config.sh and operators see. */
static void test_messages(void **state)
{
	struct kvd_config *c = malloc(sizeof(*c));
	char err[512];

	assert_non_null(c);
	kvd_config_defaults(c);
	assert_int_equal(kvd_config_set(c, "server", "bogus", "1", "f:3", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "f:3: unknown key 'bogus' in section [server]");
	assert_int_equal(kvd_config_set(c, "engine", "backend", "tpu", "f:1", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "f:1: backend must be auto, cpu or cuda, not 'tpu'");
	assert_int_equal(kvd_config_set(c, "server", "token_ring_size", "100K", "f:2", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "f:2: token_ring_size must be a power of two from 16K to 64M, not '100K'");
	assert_int_equal(kvd_config_set(c, "kv", "pool_size", "0", "f:4", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "f:4: bad value '0' for kv.pool_size");
	assert_int_equal(kvd_config_set(c, "kv", "pool_size", "95%", "f:5", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "f:5: pool_size percentage must be in (0, 90], not '95%'");
	assert_int_equal(kvd_config_set(c, "kv", "pool_size", "2G", "f:6", err, sizeof(err)), 0);
	assert_true(c->pool_bytes == 2ull << 30);
	assert_int_equal(kvd_config_set(c, "kv", "pool_size", "10%", "f:7", err, sizeof(err)), 0);
	assert_true(c->pool_bytes == 0 && c->pool_fraction == 0.1);
	assert_int_equal(kvd_config_set(c, "server", "socket", "", "f:8", err, sizeof(err)), -EINVAL);
	assert_int_equal(kvd_config_set(c, "server", "allowed_users", "0, 65534", "f:9", err, sizeof(err)), 0);
	assert_int_equal(c->n_allowed_uids, 2);
	assert_int_equal(c->allowed_uids[1], 65534);
	free(c);
}

/* kv.cache_type: auto by default; its other choices are exactly the KV
 * element types kernels/backend.h names; anything else is refused by name. */
static void test_cache_type(void **state)
{
	struct kvd_config *c = malloc(sizeof(*c));
	const struct kvd_conf_key *k = row("kv", "cache_type");
	char err[512];
	size_t n = 0;

	assert_non_null(c);
	kvd_config_defaults(c);
	assert_string_equal(c->cache_type, "auto");
	assert_string_equal(k->opt, "--cache-type");
	assert_string_equal(k->choices[0], "auto");
	for (n = 1; k->choices[n]; n++) {
		enum kvd_kv_type t = (enum kvd_kv_type)99;
		assert_int_equal(kvd_config_set(c, "kv", "cache_type", k->choices[n], "f:1", err, sizeof(err)), 0);
		assert_string_equal(c->cache_type, k->choices[n]);
		assert_int_equal(kvd_kv_type_parse(c->cache_type, &t), 0);
		assert_string_equal(kvd_kv_type_name(t), k->choices[n]);
	}
	assert_int_equal(n, 6);
	const char *bad[] = {"q8", "Q8_0", "q4_1", "", "f16 ", "BF16", "bf8"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[128];
		assert_int_equal(kvd_config_set(c, "kv", "cache_type", bad[i], "f:7", err, sizeof(err)), -EINVAL);
		snprintf(want, sizeof(want), "f:7: cache_type must be auto, f16, bf16, q8_0, q4_0 or f32, not '%s'", bad[i]);
		if (bad[i][0])
			assert_string_equal(err, want);
		else
			assert_non_null(strstr(err, "f:7: "));
	}
	assert_string_equal(c->cache_type, "f32"); /* the last good value stays */
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_are_the_table),
		cmocka_unit_test(test_integer_limits),
		cmocka_unit_test(test_reload_classes),
		cmocka_unit_test(test_options),
		cmocka_unit_test(test_messages),
		cmocka_unit_test(test_cache_type),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
