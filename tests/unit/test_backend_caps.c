/*
 * tests/unit/test_backend_caps.c — the backend table's capability query and
 * its versioning (kernels/backend.h): the engine reads an ABI 3 table only
 * as far as ABI 3 defines it (never its missing kv_shift slot), answers for
 * it from its words, takes an ABI 4 table's supports() as the one answer
 * (kv_shift per KV type), names the missing capability, and the CPU
 * backend's answers follow its config's instruction set, not the
 * environment.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine.h"

struct stub {
	struct kvd_paged_view view;
};

static int stub_init(const struct kvd_backend_config *cfg, void **ret)
{
	(void)cfg;
	*ret = calloc(1, sizeof(struct stub));
	return *ret ? 0 : -ENOMEM;
}
static int stub_load(void *ctx, const struct kvd_model_weights *w) { (void)ctx; (void)w; return 0; }
static int stub_attach(void *ctx, const struct kvd_paged_view *v)
{
	((struct stub *)ctx)->view = *v;
	return 0;
}
static int stub_forward(void *ctx, const struct kvd_batch *b) { (void)ctx; (void)b; return 0; }
static int stub_page_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n) { (void)ctx; (void)dst; (void)src; (void)n; return 0; }
static void stub_destroy(void *ctx) { free(ctx); }
static int stub_kv_shift(void *ctx, const int32_t *pages, uint32_t n_pages, uint32_t n_tokens, int32_t delta)
{
	(void)ctx; (void)pages; (void)n_pages; (void)n_tokens; (void)delta;
	return 0;
}
/* an ABI 4 backend whose kv_shift handles bf16 pools only */
static int stub_supports(void *ctx, const struct kvd_cap_query *q)
{
	(void)ctx;
	switch (q->kind) {
	case KVD_CAPQ_KV_TYPE: return q->kv_type == KVD_KV_F16 || q->kv_type == KVD_KV_BF16;
	case KVD_CAPQ_KV_SHIFT: return q->kv_type == KVD_KV_BF16;
	default: return 0;
	}
}

static const struct kvd_hparams hp = { .n_vocab = 16, .n_embd = 32, .n_layer = 1, .n_head = 1, .n_head_kv = 1,
				       .head_dim = 32, .n_ff = 32, .n_ctx_train = 256 };

static struct kvd_engine *open_on(const struct kvd_backend_ops *ops, enum kvd_kv_type kt)
{
	struct kvd_engine_config ec = { .block_size = 4, .kv_pool_bytes = 1u << 16, .max_seqs = 4, .kv_type = kt };
	struct kvd_engine *e = NULL;
	char err[256];
	int r = kvd_engine_open_backend(&ec, ops, &hp, &e, err, sizeof(err));
	if (r < 0)
		fail_msg("open: %s", err);
	return e;
}

/* An ABI 3 plug-in's table ends at `caps`. Whatever the memory after it
 * holds (here: bytes that would read as a kv_shift pointer), the engine
 * must not take it for a slot. */
static void test_abi3_table_read_to_its_end(void **state)
{
	size_t end = offsetof(struct kvd_backend_ops, kv_shift);
	unsigned char *mem = malloc(sizeof(struct kvd_backend_ops));
	struct kvd_backend_ops v3 = {
		.name = "stub-v3", .version = 3, .init = stub_init, .load = stub_load, .attach_kv = stub_attach,
		.forward = stub_forward, .page_copy = stub_page_copy, .destroy = stub_destroy,
	};
	struct kvd_cap_query q = {.kind = KVD_CAPQ_KV_SHIFT, .kv_type = KVD_KV_F16};
	char why[256];
	(void)state;

	assert_non_null(mem);
	memset(mem, 0xa5, sizeof(struct kvd_backend_ops)); /* what follows the table */
	memcpy(mem, &v3, end);
	const struct kvd_backend_ops *o = (const struct kvd_backend_ops *)mem;
	assert_int_equal(kvd_backend_ops_check(o), 0);
	assert_int_equal(kvd_backend_supports(o, NULL, &q), 0);
	struct kvd_engine *e = open_on(o, KVD_KV_F16);
	assert_int_equal(kvd_engine_can_shift(e), 0);
	assert_int_equal(kvd_engine_seq_evict(e, 0, 0, 1), -ENOTSUP);
	kvd_engine_shift_refusal(e, why, sizeof(why));
	assert_non_null(strstr(why, "kv_shift) of a f16 KV cache, which the stub-v3 backend does not implement"));
	kvd_engine_close(e);
	/* its words: the Llama base and f16 K/V */
	q = (struct kvd_cap_query){.kind = KVD_CAPQ_KV_TYPE, .kv_type = KVD_KV_BF16};
	assert_int_equal(kvd_backend_supports(o, NULL, &q), 0);
	q.kv_type = KVD_KV_F16;
	assert_int_equal(kvd_backend_supports(o, NULL, &q), 1);
	q = (struct kvd_cap_query){.kind = KVD_CAPQ_MODEL_FEATURE, .feature = KVD_FEAT_QKV_BIAS};
	assert_int_equal(kvd_backend_supports(o, NULL, &q), 0);
	free(mem);
	/* versions outside MIN .. VERSION are refused before any slot is read */
	v3.version = KVD_BACKEND_ABI_MIN - 1;
	assert_int_equal(kvd_backend_ops_check(&v3), -EINVAL);
	v3.version = KVD_BACKEND_ABI_VERSION + 1;
	assert_int_equal(kvd_backend_ops_check(&v3), -EINVAL);
}

/* ABI 4: kv_shift is decided by the backend's answer for the pool's type,
 * not by a list in the engine. */
static void test_kv_shift_per_type(void **state)
{
	static const struct kvd_backend_ops v4 = {
		.name = "stub-v4", .version = 4, .init = stub_init, .load = stub_load, .attach_kv = stub_attach,
		.forward = stub_forward, .page_copy = stub_page_copy, .destroy = stub_destroy,
		.kv_shift = stub_kv_shift, .supports = stub_supports,
	};
	char why[256];
	(void)state;

	struct kvd_engine *e = open_on(&v4, KVD_KV_BF16);
	assert_int_equal(kvd_engine_can_shift(e), 1);
	kvd_engine_close(e);
	e = open_on(&v4, KVD_KV_F16);
	assert_int_equal(kvd_engine_can_shift(e), 0);
	kvd_engine_shift_refusal(e, why, sizeof(why));
	assert_non_null(strstr(why, "re-rotating cached keys (kv_shift) of a f16 KV cache, which the stub-v4 backend"));
	kvd_engine_close(e);
}

static int cpu_asks(void *ctx, struct kvd_cap_query q)
{
	return kvd_backend_supports(&kvd_cpu_backend, ctx, &q);
}

/* The CPU backend's answers: its config's instruction set decides the fast
 * KV type; kv_shift for the 16-bit types; every feature and K-quant. */
static void test_cpu_answers(void **state)
{
	struct kvd_backend_config gen = {.n_threads = 1, .cpu_isa = KVD_CPU_ISA_GENERIC};
	struct kvd_backend_config best = {.n_threads = 1, .cpu_isa = KVD_CPU_ISA_BEST};
	struct kvd_backend_config avx2 = {.n_threads = 1, .cpu_isa = KVD_CPU_ISA_AVX2};
	void *cg = NULL, *cb = NULL, *c2 = NULL;
	const struct kvd_cap_query fast64 = {.kind = KVD_CAPQ_KV_FAST, .kv_type = KVD_KV_BF16, .head_dim = 64};
	const struct kvd_cap_query fast32 = {.kind = KVD_CAPQ_KV_FAST, .kv_type = KVD_KV_BF16, .head_dim = 32};
	(void)state;

	assert_int_equal(kvd_cpu_backend.version, KVD_BACKEND_ABI_VERSION);
	assert_non_null(kvd_cpu_backend.supports);
	assert_int_equal(kvd_cpu_backend.init(&gen, &cg), 0);
	assert_int_equal(kvd_cpu_backend.init(&best, &cb), 0);
	assert_int_equal(kvd_cpu_backend.init(&avx2, &c2), 0);
	assert_int_equal(cpu_asks(cg, fast64), 0);
	assert_int_equal(cpu_asks(c2, fast64), 0);
	assert_int_equal(cpu_asks(cb, fast32), 0); /* no bf16 kernel for head size 32 */
	int bf16_hw = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl") &&
		      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
	assert_int_equal(cpu_asks(cb, fast64), bf16_hw);
	printf("bf16 products here: %s\n", bf16_hw ? "yes" : "no");
	static const enum kvd_kv_type all[] = {KVD_KV_F16, KVD_KV_F32, KVD_KV_Q8_0, KVD_KV_Q4_0, KVD_KV_BF16};
	for (unsigned i = 0; i < 5; i++) {
		struct kvd_cap_query q = {.kind = KVD_CAPQ_KV_SHIFT, .kv_type = all[i]};
		assert_int_equal(cpu_asks(cg, q), all[i] == KVD_KV_F16 || all[i] == KVD_KV_BF16 || all[i] == KVD_KV_F32);
		q = (struct kvd_cap_query){.kind = KVD_CAPQ_KV_TYPE, .kv_type = all[i], .head_dim = 64};
		assert_int_equal(cpu_asks(cg, q), 1);
	}
	for (uint32_t bit = 1; bit & KVD_FEAT_ALL; bit <<= 1)
		assert_int_equal(cpu_asks(cb, (struct kvd_cap_query){.kind = KVD_CAPQ_MODEL_FEATURE, .feature = bit}), 1);
	assert_int_equal(cpu_asks(cb, (struct kvd_cap_query){.kind = KVD_CAPQ_WEIGHT_TYPE, .wtype = KVD_WTYPE_Q6_K}), 1);
	assert_int_equal(cpu_asks(cb, (struct kvd_cap_query){.kind = KVD_CAPQ_WEIGHT_TYPE, .wtype = 4}), 0);
	assert_int_equal(cpu_asks(cb, (struct kvd_cap_query){.kind = KVD_CAPQ_ATTENTION, .head_dim = 64, .n_rep = 65}), 0);
	assert_int_equal(cpu_asks(cb, (struct kvd_cap_query){.kind = KVD_CAPQ_RELEASED_PAGES}), 1);
	assert_int_equal(cpu_asks(cb, (struct kvd_cap_query){.kind = 99}), 0); /* a newer question: no */
	kvd_cpu_backend.destroy(cg);
	kvd_cpu_backend.destroy(cb);
	kvd_cpu_backend.destroy(c2);
}

static void test_cap_names(void **state)
{
	char b[160];
	(void)state;
	struct kvd_cap_query q = {.kind = KVD_CAPQ_WEIGHT_TYPE, .wtype = KVD_WTYPE_Q4_K};
	assert_string_equal(kvd_cap_describe(&q, b, sizeof(b)), "weight type q4_K");
	q = (struct kvd_cap_query){.kind = KVD_CAPQ_KV_TYPE, .kv_type = KVD_KV_Q8_0};
	assert_string_equal(kvd_cap_describe(&q, b, sizeof(b)), "KV cache type q8_0");
	q = (struct kvd_cap_query){.kind = KVD_CAPQ_MODEL_FEATURE, .feature = KVD_FEAT_WINDOW};
	assert_string_equal(kvd_cap_describe(&q, b, sizeof(b)), "sliding-window attention");
	q = (struct kvd_cap_query){.kind = KVD_CAPQ_KV_SHIFT, .kv_type = KVD_KV_BF16};
	assert_string_equal(kvd_cap_describe(&q, b, sizeof(b)), "re-rotating cached keys (kv_shift) of a bf16 KV cache");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_abi3_table_read_to_its_end),
		cmocka_unit_test(test_kv_shift_per_type),
		cmocka_unit_test(test_cpu_answers),
		cmocka_unit_test(test_cap_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
