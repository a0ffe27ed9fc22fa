/*
 * tests/unit/test_sched_ctx.c — the scheduler's window context policies
 * over a stub backend whose "attention" sees exactly what the KV holds:
 * each K row records the position its key was rotated for and each V row
 * the token, kv_shift moves the recorded positions, and forward refuses a
 * cache whose positions are not 0 .. pos (so every drop must be followed by
 * the right re-rotation). The logits hash the tokens visible to the new
 * token, so greedy generation is compared with a model of the policy
 * written here from its definition (daemon/engine.h): sinks kept, the
 * window grown to max_window, then its oldest page dropped before the
 * token that would overflow it. Checked: long prompts prefilled in big
 * chunks give the same tokens as the definition (chunks stop at the
 * eviction points), generation runs past max_model_len, pages in use stay
 * bounded, a sequence preempted and recomputed (no swap) replays its drops
 * and gives the same tokens, the result counts the dropped tokens, and a backend without
 * kv_shift or a window that does not fit is refused.
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
#include "daemon/sched.h"
#include "kvmm.h"

#define N_VOCAB 64
#define BS 4
#define MAX_LEN 64
#define N_GEN 300

struct stub {
	struct kvd_paged_view view;
	uint64_t shifts;
};

static uint64_t mix(uint64_t h, uint64_t x)
{
	h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return h;
}

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

static int32_t *slot(struct stub *st, const int32_t *pages, uint32_t pos, int v)
{
	const struct kvd_kv_layout *l = &st->view.layout;
	return (int32_t *)((char *)st->view.base + (size_t)pages[pos / l->block_size] * l->page_bytes +
			   (v ? l->v_offset : 0) + (pos % l->block_size) * l->token_stride);
}

static int stub_forward(void *ctx, const struct kvd_batch *b)
{
	struct stub *st = ctx;
	for (int32_t i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		for (int32_t j = 0; j < s->n_tokens; j++) {
			uint32_t pos = (uint32_t)(s->pos0 + j);
			uint64_t h = 7;
			if (pos >= MAX_LEN)
				return -ERANGE; /* positions past the context */
			*slot(st, s->pages, pos, 0) = (int32_t)pos;
			*slot(st, s->pages, pos, 1) = s->tokens[j];
			for (uint32_t q = 0; q <= pos; q++) {
				if (*slot(st, s->pages, q, 0) != (int32_t)q)
					return -EIO; /* a key not rotated for where it is */
				h = mix(h, (uint64_t)*slot(st, s->pages, q, 1));
			}
			float *lg = s->all_logits ? s->logits + (size_t)j * N_VOCAB
						  : j == s->n_tokens - 1 ? s->logits : NULL;
			for (int32_t t = 0; lg && t < N_VOCAB; t++)
				lg[t] = (float)(mix(h, (uint64_t)t) >> 40);
		}
	}
	return 0;
}

static int stub_page_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct stub *st = ctx;
	const struct kvd_kv_layout *l = &st->view.layout;
	(void)n_tokens;
	memcpy((char *)st->view.base + dst * l->page_bytes, (char *)st->view.base + src * l->page_bytes, l->page_bytes);
	return 0;
}

static int stub_kv_shift(void *ctx, const int32_t *pages, uint32_t n_pages, uint32_t n_tokens, int32_t delta)
{
	struct stub *st = ctx;
	(void)n_pages;
	st->shifts++;
	for (uint32_t t = 0; t < n_tokens; t++)
		*slot(st, pages, t, 0) += delta;
	return 0;
}

static int stub_rw(void *ctx, uint32_t page, void *p) { (void)ctx; (void)page; (void)p; return -ENOTSUP; }
static int stub_wr(void *ctx, uint32_t page, const void *p) { (void)ctx; (void)page; (void)p; return -ENOTSUP; }
static void stub_destroy(void *ctx) { free(ctx); }

static const struct kvd_backend_ops shift_ops = {
	.name = "stub-shift", .version = KVD_BACKEND_ABI_VERSION, .init = stub_init, .load = stub_load,
	.attach_kv = stub_attach, .forward = stub_forward, .page_copy = stub_page_copy, .page_read = stub_rw,
	.page_write = stub_wr, .destroy = stub_destroy, .kv_shift = stub_kv_shift,
};
static const struct kvd_backend_ops noshift_ops = {
	.name = "stub-noshift", .version = KVD_BACKEND_ABI_VERSION, .init = stub_init, .load = stub_load,
	.attach_kv = stub_attach, .forward = stub_forward, .page_copy = stub_page_copy, .page_read = stub_rw,
	.page_write = stub_wr, .destroy = stub_destroy,
};

/* The policy from its definition: what greedy decoding gives. */
static void expected(const int32_t *prompt, uint32_t n, uint32_t sink, uint32_t max_window, int32_t *out)
{
	int32_t kv[MAX_LEN];
	uint32_t len = 0;
	for (uint32_t t = 0; t < n + N_GEN - 1; t++) {
		int32_t tok = t < n ? prompt[t] : out[t - n];
		if (len >= sink + max_window) { /* drop the oldest window page */
			memmove(kv + sink, kv + sink + BS, (len - sink - BS) * sizeof(*kv));
			len -= BS;
		}
		kv[len++] = tok;
		if (t + 1 >= n) {
			uint64_t h = 7;
			for (uint32_t q = 0; q < len; q++)
				h = mix(h, (uint64_t)kv[q]);
			int32_t best = 0;
			for (int32_t v = 1; v < N_VOCAB; v++)
				if ((float)(mix(h, (uint64_t)v) >> 40) > (float)(mix(h, (uint64_t)best) >> 40))
					best = v;
			out[t + 1 - n] = best;
		}
	}
}

struct run {
	int32_t toks[N_GEN];
	uint32_t n;
	int done;
	struct kvd_request_result res;
};

static enum kvd_token_verdict on_token(void *ud, uint64_t id, int32_t t, enum kvd_finish ending)
{
	struct run *r = (struct run *)ud + id;
	(void)ending;
	assert_true(r->n < N_GEN);
	r->toks[r->n++] = t;
	return KVD_TOKEN_CONTINUE;
}

static void on_done(void *ud, uint64_t id, const struct kvd_request_result *res)
{
	struct run *r = (struct run *)ud + id;
	r->done = 1;
	r->res = *res;
}

static void open_sched(const struct kvd_backend_ops *ops, struct run *runs, uint32_t pool_pages,
		       struct kvd_engine **e, struct kvd_sched **s)
{
	char err[256];
	struct kvd_hparams hp = { .n_vocab = N_VOCAB, .n_embd = 4, .n_layer = 1, .n_head = 1, .n_head_kv = 1,
				  .head_dim = 4, .n_ff = 4, .n_ctx_train = MAX_LEN };
	struct kvd_kv_layout l;
	kvd_kv_layout_init(&l, &hp, BS);
	struct kvd_engine_config ec = { .block_size = BS, .kv_pool_bytes = pool_pages * l.page_bytes, .max_seqs = 8,
					.prefix_cache = 1, .shuffle_seed = 3 };
	assert_int_equal(kvd_engine_open_backend(&ec, ops, &hp, e, err, sizeof(err)), 0);
	struct kvd_sched_config sc = { .max_num_seqs = 8, .max_tokens_per_step = pool_pages < 32 ? 8 : 256, .max_model_len = MAX_LEN };
	struct kvd_sched_events ev = { .on_token = on_token, .on_done = on_done, .ud = runs };
	assert_int_equal(kvd_sched_create(&sc, *e, &ev, s), 0);
}

static void check_policy(uint32_t policy, uint32_t window, uint32_t sinks, uint32_t n_prompt, uint32_t pool_pages)
{
	struct run runs[3] = {0};
	struct kvd_engine *e;
	struct kvd_sched *s;
	int32_t prompt[200], want[N_GEN];
	struct kvd_window w;
	uint32_t pages_max = 0;

	for (uint32_t i = 0; i < n_prompt; i++)
		prompt[i] = (int32_t)((i * 37 + 11) % N_VOCAB);
	open_sched(&shift_ops, runs, pool_pages, &e, &s);
	struct kvd_request_params p = { .sampling = { .temperature = 0, .top_p = 1, .repeat_penalty = 1 },
					.max_tokens = N_GEN, .ctx_policy = policy, .ctx_window = window,
					.ctx_sinks = sinks };
	/* two at once: batch-mates do not change a sequence's window */
	assert_int_equal(kvd_sched_submit(s, 0, prompt, n_prompt, &p), 0);
	assert_int_equal(kvd_sched_submit(s, 1, prompt + 1, n_prompt - 1, &p), 0);
	while (!kvd_sched_idle(s)) {
		assert_true(kvd_sched_step(s) >= 0);
		struct kvmm_stats ks;
		kvmm_get_stats(kvd_engine_kvmm(e), &ks);
		if (ks.pages_used > pages_max)
			pages_max = ks.pages_used;
	}
	assert_int_equal(kvd_window_make(BS, MAX_LEN, policy == KVD_CTX_SINKS, sinks, window, &w), 0);
	for (int k = 0; k < 2; k++) {
		assert_true(runs[k].done);
		assert_int_equal(runs[k].res.finish, KVD_FINISH_LENGTH);
		assert_int_equal(runs[k].n, N_GEN);
		expected(prompt + k, n_prompt - (uint32_t)k, w.sink_pages * BS, w.max_window, want);
		assert_memory_equal(runs[k].toks, want, sizeof(want));
		/* everything but the K/V kept (and the last token, never computed) was dropped */
		uint32_t total = n_prompt - (uint32_t)k + N_GEN - 1;
		assert_true(runs[k].res.context_dropped_tokens > total - w.sink_pages * BS - w.max_window - 1);
		assert_true(runs[k].res.context_dropped_tokens <= total - window);
		assert_int_equal(runs[k].res.context_dropped_tokens % BS, 0);
	}
	/* both sequences' pages: the sinks and the window, each */
	assert_true(pages_max <= 2 * (w.sink_pages + (w.max_window + BS - 1) / BS));
	struct kvd_sched_stats st;
	kvd_sched_get_stats(s, &st);
	if (pool_pages < 2 * (w.sink_pages + (w.max_window + BS - 1) / BS))
		assert_true(st.preemptions > 0); /* recomputed: the drops replay at the same points */
	kvd_sched_destroy(s);
	kvd_engine_close(e);
}

static void test_sliding_window(void **state)
{
	(void)state;
	check_policy(KVD_CTX_SLIDING_WINDOW, 20, 0, 10, 64);
	check_policy(KVD_CTX_SLIDING_WINDOW, 0, 0, 150, 64); /* a prompt past the context, the largest window */
	check_policy(KVD_CTX_SLIDING_WINDOW, 0, 0, 150, 20); /* two do not fit: preempted and recomputed */
}

static void test_sinks(void **state)
{
	(void)state;
	check_policy(KVD_CTX_SINKS, 16, 0, 10, 64);  /* 4 sinks: one page */
	check_policy(KVD_CTX_SINKS, 24, 6, 150, 64); /* 6 sinks: two pages */
	check_policy(KVD_CTX_SINKS, 40, 4, 150, 14); /* preempted and recomputed */
}

/* Two windows over the same tokens: the second's prompt is the first's
 * stream so far, so it maps the first's cached pages while both still
 * hold them, in a pool too small for a copy of them. Each then reaches its
 * first drop needing copies of the pages they share, which do not fit:
 * the younger's KV must be given up (recomputed later) for either to go
 * on. Both must end, with the policy's tokens. */
static void test_shared_prompt(void **state)
{
	(void)state;
	struct run runs[3] = {0};
	struct kvd_engine *e;
	struct kvd_sched *s;
	int32_t a_prompt[10], b_prompt[54], want[N_GEN];
	struct kvd_window w;
	uint64_t steps = 0;

	for (uint32_t i = 0; i < 10; i++)
		a_prompt[i] = (int32_t)((i * 29 + 5) % N_VOCAB);
	open_sched(&shift_ops, runs, 20, &e, &s);
	assert_int_equal(kvd_window_make(BS, MAX_LEN, 1, 0, 0, &w), 0);
	struct kvd_request_params p = { .sampling = { .temperature = 0, .top_p = 1, .repeat_penalty = 1 },
					.max_tokens = N_GEN, .ctx_policy = KVD_CTX_SINKS };
	assert_int_equal(kvd_sched_submit(s, 0, a_prompt, 10, &p), 0);
	while (runs[0].n < 44) {
		assert_true(kvd_sched_step(s) > 0);
		steps++;
	}
	memcpy(b_prompt, a_prompt, sizeof(a_prompt));
	memcpy(b_prompt + 10, runs[0].toks, 44 * sizeof(int32_t));
	assert_int_equal(kvd_sched_submit(s, 1, b_prompt, 54, &p), 0);
	while (!kvd_sched_idle(s) && steps < 100000) {
		assert_true(kvd_sched_step(s) >= 0);
		steps++;
	}
	assert_true(kvd_sched_idle(s));
	expected(a_prompt, 10, w.sink_pages * BS, w.max_window, want);
	assert_int_equal(runs[0].n, N_GEN);
	assert_memory_equal(runs[0].toks, want, sizeof(want));
	expected(b_prompt, 54, w.sink_pages * BS, w.max_window, want);
	assert_int_equal(runs[1].n, N_GEN);
	assert_memory_equal(runs[1].toks, want, sizeof(want));
	assert_true(runs[1].res.preemptions > 0); /* the younger gave up its KV */
	kvd_sched_destroy(s);
	kvd_engine_close(e);
}

static void test_refusals(void **state)
{
	(void)state;
	struct run runs[3] = {0};
	struct kvd_engine *e;
	struct kvd_sched *s;
	int32_t prompt[4] = {1, 2, 3, 4};
	struct kvd_request_params p = { .sampling = { .temperature = 0, .top_p = 1, .repeat_penalty = 1 },
					.max_tokens = 10, .ctx_policy = KVD_CTX_SINKS };

	open_sched(&noshift_ops, runs, 64, &e, &s);
	assert_int_equal(kvd_sched_submit(s, 0, prompt, 4, &p), -ENOTSUP);
	p.ctx_policy = KVD_CTX_ERROR;
	p.max_tokens = MAX_LEN;
	assert_int_equal(kvd_sched_submit(s, 0, prompt, 4, &p), -E2BIG); /* as before */
	kvd_sched_destroy(s);
	kvd_engine_close(e);

	open_sched(&shift_ops, runs, 64, &e, &s);
	p.ctx_policy = KVD_CTX_SLIDING_WINDOW;
	p.ctx_window = MAX_LEN - BS + 2; /* with a page of slack, past the context */
	assert_int_equal(kvd_sched_submit(s, 0, prompt, 4, &p), -E2BIG);
	p.ctx_window = MAX_LEN - BS + 1; /* the largest that fits */
	p.max_tokens = 1000;             /* far past max_model_len */
	assert_int_equal(kvd_sched_submit(s, 0, prompt, 4, &p), 0);
	p.ctx_policy = KVD_CTX_SINKS;
	assert_int_equal(kvd_sched_submit(s, 1, prompt, 4, &p), -E2BIG); /* the sink page does not fit */
	kvd_sched_destroy(s);
	kvd_engine_close(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sliding_window),
		cmocka_unit_test(test_sinks),
		cmocka_unit_test(test_shared_prompt),
		cmocka_unit_test(test_refusals),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
