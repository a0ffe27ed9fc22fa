/*
 * tests/unit/test_sched.c — the continuous-batching scheduler over the real
 * engine (the default model, models/SmolLM2-135M-Instruct.Q4_1.gguf; the
 * tests are skipped when it is missing).
 *
 * What is checked, each against a plain reference run of the same request
 * alone in a roomy pool (greedy, so the tokens must match exactly):
 *  - a batch of requests submitted together, with a small per-step token
 *    budget (chunked prefill), gives each request its tokens alone;
 *  - a pool too small for the batch, without swap (preempted sequences are
 *    recomputed) and with a swap file (they are swapped out and back), gives
 *    the same tokens, and preemptions really happened;
 *  - a session's second turn equals a fresh request whose prompt is the
 *    whole history, and reuses the history's KV (cached_tokens);
 *  - a cancelled session turn leaves the session as it was: the next turn
 *    equals the one that would have run without the cancelled one;
 *  - cancelling frees the pages at once; submit refuses what cannot fit
 *    (-E2BIG past max_model_len, -ENOSPC past the whole pool).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine.h"
#include "daemon/sched.h"
#include "kvmm.h"

#define MODEL_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define MAX_REQ 8
#define GEN 12

struct rec {
	int32_t toks[4096];
	uint32_t n;
	int done;
	struct kvd_request_result res;
};

struct ctx {
	struct kvd_engine *e;
	struct kvd_sched *s;
	struct rec r[MAX_REQ + 4];
};

static void on_token(void *ud, uint64_t id, int32_t t, const char *text, size_t len)
{
	struct ctx *c = ud;
	(void)text;
	(void)len;
	assert_true(id < MAX_REQ + 4);
	c->r[id].toks[c->r[id].n++] = t;
}

static void on_done(void *ud, uint64_t id, const struct kvd_request_result *res)
{
	struct ctx *c = ud;
	assert_false(c->r[id].done);
	c->r[id].done = 1;
	c->r[id].res = *res;
	c->r[id].res.ledger = NULL;
}

static int open_ctx(struct ctx *c, uint64_t pool_bytes, const char *swap, uint32_t per_step)
{
	char err[256];
	struct kvd_engine_config ec = {
		.model_path = MODEL_PATH,
		.backend = "cpu",
		.n_threads = 2,
		.block_size = 16,
		.kv_pool_bytes = pool_bytes,
		.max_seqs = 64,
		.prefix_cache = 1,
		.swap_path = swap,
		.swap_bytes = swap ? 64u << 20 : 0,
	};
	memset(c, 0, sizeof(*c));
	if (access(MODEL_PATH, R_OK) != 0)
		return -ENOENT;
	assert_int_equal(kvd_engine_open(&ec, &c->e, err, sizeof(err)), 0);
	struct kvd_sched_config sc = { .max_num_seqs = 32, .max_tokens_per_step = per_step, .max_model_len = 2048 };
	struct kvd_sched_events ev = { .on_token = on_token, .on_done = on_done, .ud = c };
	assert_int_equal(kvd_sched_create(&sc, c->e, &ev, &c->s), 0);
	return 0;
}

static void close_ctx(struct ctx *c)
{
	c->s = kvd_sched_destroy(c->s);
	c->e = kvd_engine_close(c->e);
}

static void run_until_idle(struct ctx *c)
{
	for (int i = 0; i < 100000 && !kvd_sched_idle(c->s); i++)
		assert_true(kvd_sched_step(c->s) >= 0);
	assert_true(kvd_sched_idle(c->s));
}

static struct kvd_request_params greedy(uint32_t max_tokens, uint64_t session)
{
	struct kvd_request_params p = { .max_tokens = max_tokens, .ignore_eos = 1, .session = session };
	kvd_sampler_params_default(&p.sampling);
	p.sampling.temperature = 0;
	return p;
}

/* Distinct prompts of 20..60 tokens from plain ids (no tokenizer needed). */
static uint32_t prompt_of(int i, int32_t *out)
{
	uint32_t n = 20 + (uint32_t)(i * 7) % 41;
	for (uint32_t k = 0; k < n; k++)
		out[k] = 100 + (int32_t)((k * 31 + (uint32_t)i * 977) % 20000);
	return n;
}

/* The tokens each of n prompts gets alone, in a roomy pool. */
static void reference(int n, struct rec *ref)
{
	struct ctx c;
	int32_t p[128];

	assert_int_equal(open_ctx(&c, 64u << 20, NULL, 512), 0);
	for (int i = 0; i < n; i++) {
		uint32_t np = prompt_of(i, p);
		struct kvd_request_params rp = greedy(GEN, 0);
		memset(&c.r[i], 0, sizeof(c.r[i]));
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
		run_until_idle(&c);
		ref[i] = c.r[i];
		assert_int_equal(ref[i].n, GEN);
	}
	close_ctx(&c);
}

static void batch_vs_reference(uint64_t pool_bytes, const char *swap, uint32_t per_step, int expect_preempt)
{
	static struct rec ref[MAX_REQ];
	static int have_ref;
	struct ctx c;
	int32_t p[128];
	struct kvd_sched_stats st;

	if (access(MODEL_PATH, R_OK) != 0)
		skip();
	if (!have_ref) {
		reference(MAX_REQ, ref);
		have_ref = 1;
	}
	assert_int_equal(open_ctx(&c, pool_bytes, swap, per_step), 0);
	for (int i = 0; i < MAX_REQ; i++) {
		uint32_t np = prompt_of(i, p);
		struct kvd_request_params rp = greedy(GEN, 0);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
	}
	run_until_idle(&c);
	for (int i = 0; i < MAX_REQ; i++) {
		assert_true(c.r[i].done);
		assert_int_equal(c.r[i].res.finish, KVD_FINISH_LENGTH);
		assert_int_equal(c.r[i].n, GEN);
		assert_memory_equal(c.r[i].toks, ref[i].toks, GEN * sizeof(int32_t));
	}
	kvd_sched_get_stats(c.s, &st);
	if (expect_preempt)
		assert_true(st.preemptions > 0);
	struct kvmm_stats ks;
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_int_equal(ks.pages_used, 0);
	close_ctx(&c);
}

static void test_batch_chunked(void **state)
{
	(void)state;
	batch_vs_reference(64u << 20, NULL, 48, 0); /* 48-token budget: prompts prefill in chunks */
}

static void test_small_pool_recompute(void **state)
{
	(void)state;
	/* 368640-byte pages: 14 pages for 8 sequences of up to 5 pages each */
	batch_vs_reference(14ull * 368640, NULL, 512, 1);
}

static void test_small_pool_swap(void **state)
{
	/* kvmm creates the swap file itself and refuses an existing path */
	char dir[] = "/tmp/kvd-test-sched-swap-XXXXXX", path[sizeof(dir) + 8];
	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/swap", dir);
	batch_vs_reference(14ull * 368640, path, 512, 1);
	rmdir(dir);
}

static void test_session(void **state)
{
	struct ctx c;
	int32_t p1[64], p2[64], all[256];
	uint32_t n1 = prompt_of(1, p1), n2 = prompt_of(2, p2);
	struct kvd_request_params sp = greedy(GEN, 77), plain = greedy(GEN, 0);
	(void)state;

	if (open_ctx(&c, 64u << 20, NULL, 512) < 0)
		skip();
	/* turn 1, turn 2 of session 77 */
	assert_int_equal(kvd_sched_submit(c.s, 0, p1, n1, &sp), 0);
	run_until_idle(&c);
	assert_int_equal(kvd_sched_session_tokens(c.s, 77), (int)(n1 + GEN));
	assert_int_equal(kvd_sched_submit(c.s, 1, p2, n2, &sp), 0);
	run_until_idle(&c);
	assert_int_equal(c.r[1].res.prompt_tokens, n1 + GEN + n2);
	assert_int_equal(c.r[1].res.cached_tokens, n1 + GEN - 1); /* the last token was never computed */
	/* the same as one request over the whole history */
	memcpy(all, p1, n1 * 4);
	memcpy(all + n1, c.r[0].toks, GEN * 4);
	memcpy(all + n1 + GEN, p2, n2 * 4);
	assert_int_equal(kvd_sched_submit(c.s, 2, all, n1 + GEN + n2, &plain), 0);
	run_until_idle(&c);
	assert_memory_equal(c.r[1].toks, c.r[2].toks, GEN * 4);

	/* a cancelled turn leaves the session as it was */
	int before = kvd_sched_session_tokens(c.s, 77);
	assert_int_equal(kvd_sched_submit(c.s, 3, p1, n1, &sp), 0);
	assert_true(kvd_sched_step(c.s) > 0);
	assert_int_equal(kvd_sched_cancel(c.s, 3), 0);
	assert_int_equal(c.r[3].res.finish, KVD_FINISH_CANCELLED);
	assert_int_equal(kvd_sched_session_tokens(c.s, 77), before);
	assert_int_equal(kvd_sched_submit(c.s, 4, p1, n1, &sp), 0);
	run_until_idle(&c);
	memcpy(all + n1 + GEN + n2, c.r[1].toks, GEN * 4);
	memcpy(all + n1 + 2 * GEN + n2, p1, n1 * 4);
	assert_int_equal(kvd_sched_submit(c.s, 5, all, 2 * n1 + 2 * GEN + n2, &plain), 0);
	run_until_idle(&c);
	assert_memory_equal(c.r[4].toks, c.r[5].toks, GEN * 4);

	assert_int_equal(kvd_sched_session_close(c.s, 77), 0);
	assert_int_equal(kvd_sched_session_tokens(c.s, 77), -ENOENT);
	struct kvmm_stats ks;
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_int_equal(ks.pages_used, 0);
	close_ctx(&c);
}

static void test_cancel_and_limits(void **state)
{
	struct ctx c;
	int32_t p[64];
	uint32_t n = prompt_of(3, p);
	struct kvd_request_params rp = greedy(100, 0);
	struct kvmm_stats ks;
	(void)state;

	if (open_ctx(&c, 16ull * 368640, NULL, 512) < 0) /* 16 pages: 256 tokens */
		skip();
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &rp), 0);
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &rp), -EEXIST);
	assert_true(kvd_sched_step(c.s) > 0);
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_true(ks.pages_used > 0);
	assert_int_equal(kvd_sched_cancel(c.s, 0), 0);
	assert_int_equal(c.r[0].res.finish, KVD_FINISH_CANCELLED);
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_int_equal(ks.pages_used, 0);
	assert_int_equal(kvd_sched_cancel(c.s, 0), -ENOENT);
	rp.max_tokens = 2048;
	assert_int_equal(kvd_sched_submit(c.s, 1, p, n, &rp), -E2BIG);
	rp.max_tokens = 300; /* n + 300 tokens: within max_model_len, more than the pool */
	assert_int_equal(kvd_sched_submit(c.s, 1, p, n, &rp), -ENOSPC);
	assert_int_equal(kvd_sched_submit(c.s, 1, p, 0, &rp), -EINVAL);
	assert_true(kvd_sched_idle(c.s));
	close_ctx(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_chunked),
		cmocka_unit_test(test_small_pool_recompute),
		cmocka_unit_test(test_small_pool_swap),
		cmocka_unit_test(test_session),
		cmocka_unit_test(test_cancel_and_limits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
