/*
 * tests/unit/test_kvtypes.c — the KV element types are listed twice, once
 * on each side of the layering (kernels/backend.h's KVD_KV_TYPES for the
 * kernels and the daemon, ipc/ipc.h's IPC_KV_TYPES for the wire, libkvclient
 * and kvctl), since kernels and ipc cannot see each other. This test, which
 * may include both, checks that the two lists agree row for row, and that
 * what each list generates (the enum and its helpers, [kv] cache_type's
 * choices and message, ipc_kv_type_name(), kvc_kv_type()) says the same.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "daemon/config.h"
#include "ipc.h"
#include "kvclient.h"

struct row {
	int value; /* enum kvd_kv_type; the wire's kv_type - 1 */
	const char *name;
	uint32_t block_elems, block_bytes;
};

#define KROW(e, v, name, be, bb) { (int)(e), name, be, bb },
static const struct row kernels_rows[] = { KVD_KV_TYPES(KROW) };
#define IROW(v, name, be, bb) { (int)(v) - 1, name, be, bb },
static const struct row wire_rows[] = { IPC_KV_TYPES(IROW) };
#define N_KERNELS (sizeof(kernels_rows) / sizeof(kernels_rows[0]))
#define N_WIRE (sizeof(wire_rows) / sizeof(wire_rows[0]))

static const struct row *wire_row(int value)
{
	for (size_t i = 0; i < N_WIRE; i++)
		if (wire_rows[i].value == value)
			return &wire_rows[i];
	return NULL;
}

/* Every type in both lists, with the same name and block size. */
static void test_lists_agree(void **state)
{
	(void)state;
	assert_int_equal(N_KERNELS, N_WIRE);
	for (size_t i = 0; i < N_KERNELS; i++) {
		const struct row *k = &kernels_rows[i], *w = wire_row(k->value);
		assert_non_null(w);
		assert_string_equal(k->name, w->name);
		assert_int_equal(k->block_elems, w->block_elems);
		assert_int_equal(k->block_bytes, w->block_bytes);
		/* the wire's values are dense from 1, the enum's from 0 */
		assert_true(k->value >= 0 && (size_t)k->value < N_KERNELS);
	}
	/* the wire's list runs in value order (kvc_kv_type(i) is kv_type i + 1) */
	for (size_t i = 0; i < N_WIRE; i++)
		assert_int_equal(wire_rows[i].value, (int)i);
	assert_true(N_WIRE <= IPC_KV_TYPE_MAX);
}

/* What the kernels' list generates: names, parsing, row sizes. */
static void test_kernels_helpers(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_KERNELS; i++) {
		const struct row *k = &kernels_rows[i];
		enum kvd_kv_type t = (enum kvd_kv_type)k->value, back;
		assert_string_equal(kvd_kv_type_name(t), k->name);
		assert_int_equal(kvd_kv_type_parse(k->name, &back), 0);
		assert_int_equal(back, t);
		assert_int_equal(kvd_kv_row_bytes(t, 64), 64 / k->block_elems * k->block_bytes);
		assert_int_equal(kvd_kv_row_bytes(t, 576), 576 / k->block_elems * k->block_bytes);
		if (k->block_elems > 1)
			assert_int_equal(kvd_kv_row_bytes(t, k->block_elems + 1), 0);
	}
	/* the fixed values, written down once more on purpose */
	assert_int_equal(KVD_KV_F16, 0);
	assert_int_equal(KVD_KV_F32, 1);
	assert_int_equal(KVD_KV_Q8_0, 2);
	assert_int_equal(KVD_KV_Q4_0, 3);
	assert_int_equal(KVD_KV_BF16, 4);
	assert_int_equal(kvd_kv_row_bytes(KVD_KV_Q8_0, 64), 68);
	assert_int_equal(kvd_kv_row_bytes(KVD_KV_Q4_0, 64), 36);
	enum kvd_kv_type t;
	assert_int_equal(kvd_kv_type_parse("q8", &t), -EINVAL);
	assert_int_equal(kvd_kv_type_parse("f16x", &t), -EINVAL);
	assert_null(kvd_kv_type_name((enum kvd_kv_type)N_KERNELS));
	assert_int_equal(kvd_kv_row_bytes((enum kvd_kv_type)N_KERNELS, 64), 0);
}

/* What the wire's list generates: ipc_kv_type_name() and kvc_kv_type(). */
static void test_wire_helpers(void **state)
{
	(void)state;
	uint32_t be = 7, bb = 7;
	for (size_t i = 0; i < N_WIRE; i++) {
		assert_string_equal(ipc_kv_type_name((uint32_t)i + 1), wire_rows[i].name);
		assert_string_equal(kvc_kv_type((unsigned)i, &be, &bb), wire_rows[i].name);
		assert_int_equal(be, wire_rows[i].block_elems);
		assert_int_equal(bb, wire_rows[i].block_bytes);
		assert_string_equal(kvc_kv_type((unsigned)i, NULL, NULL), wire_rows[i].name);
	}
	assert_null(ipc_kv_type_name(0));
	assert_null(ipc_kv_type_name((uint32_t)N_WIRE + 1));
	be = bb = 7;
	assert_null(kvc_kv_type((unsigned)N_WIRE, &be, &bb));
	assert_int_equal(be, 7);
	assert_int_equal(bb, 7);
}

/* [kv] cache_type: "auto" then every type, and the message naming them. */
static void test_config_choices(void **state)
{
	(void)state;
	const struct kvd_conf_key *k = NULL;
	for (size_t i = 0; i < kvd_conf_n_keys; i++)
		if (!strcmp(kvd_conf_keys[i].name, "cache_type"))
			k = &kvd_conf_keys[i];
	assert_non_null(k);
	assert_non_null(k->choices);
	assert_string_equal(k->choices[0], "auto");
	size_t n = 0;
	while (k->choices[n + 1])
		n++;
	assert_int_equal(n, N_KERNELS);
	for (size_t i = 0; i < N_KERNELS; i++) {
		assert_string_equal(k->choices[i + 1], kernels_rows[i].name);
		assert_non_null(strstr(k->help, kernels_rows[i].name)); /* the help names each */
	}
	assert_string_equal(k->bad_msg, "cache_type must be auto, f16, bf16, q8_0, q4_0 or f32, not '%s'");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lists_agree),
		cmocka_unit_test(test_kernels_helpers),
		cmocka_unit_test(test_wire_helpers),
		cmocka_unit_test(test_config_choices),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
