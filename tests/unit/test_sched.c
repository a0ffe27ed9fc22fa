/*
 * tests/unit/test_sched.c — the continuous-batching scheduler, driven for
 * real over a real engine and a real kvmm pool, with a stub backend in
 * place of a model: no GGUF file, any block size, any pool size.
 *
 * The stub backend is a toy "attention": for each new token it writes
 * (token, position) as the token's V row and, reading every earlier V row
 * of the sequence back through its page table, a running hash as the K
 * row; the logits are a function of that hash. So a token depends on the
 * whole history exactly as the pages hold it: a wrong page after a swap,
 * a copy-on-write, a prefix hit or a recompute shows up as wrong tokens,
 * and a forward pass that finds a V row out of place fails with -EIO. The
 * test computes the tokens a request must get (expected()) with the same
 * hash, without the scheduler, and compares exactly.
 *
 * What is checked: tokens equal expected() alone and under any batch mix
 * (chunked prefill, block sizes 1 to 32, prefix sharing); admission from
 * free pages; preemption with recompute and with swap (host pool, device
 * pool page by page and batched, per the backend's declared caps); a backend
 * table whose caps do not hold is refused; cancel (waiting,
 * running, swapped); sessions (history reuse, rollback of a cancelled
 * turn, close, expiry on a clock the test drives); stop verdicts,
 * end-of-generation, ignore_eos and max_tokens; submit's limits; an engine
 * failure; seeded sampling is the same under any load; the inter-token
 * latency histogram and the sessions' reuse counters; prompt-lookup
 * speculation changes no token (greedy, seeded, stop verdicts, swap).
 */
#include <errno.h>
#include <math.h>
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
#include "daemon/model/grammar.h"
#include "daemon/sched.h"
#include "daemon/spec_draft.h"
#include "daemon/step_model.h"
#include "kvmm.h"

#define N_VOCAB 512
#define MAX_REQ 32
#define MAX_TOKS 1024
#define GEN 12

/* ---- the stub backend ------------------------------------------------------ */

struct stub {
	struct kvd_paged_view view;
	int fail_forwards;    /* > 0: the next forward fails with -EIO */
	uint64_t forwards;
	uint64_t max_batch;   /* most sequences in one forward */
	/* simulated time: each forward advances *clock by step_ns plus
	 * token_ns per token plus pair_ns per (token, earlier position) pair
	 * its attention reads (when clock is set) */
	uint64_t *clock, step_ns, token_ns, pair_ns;
	/* as a device backend (stub_dev_ops, stub_dev_batched_ops): the pool
	 * kvmm does not map, and the page moves it was asked for */
	unsigned char *dev;
	uint64_t page_reads, page_writes, batch_reads, batch_writes, batch_pages;
};

static struct stub *g_stub; /* the live one, for fault injection */
/* Copying mode (speculation tests): the logits favour one successor of the
 * last token strongly (cyc_logit), so outputs repeat and prompt-lookup
 * drafts get accepted; the K/V rows and their checks stay as they are. */
static int g_copying;

static uint64_t mix(uint64_t h, uint64_t x)
{
	h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 29);
}

static float logit_of(uint64_t h, int32_t i)
{
	return (float)(mix(h, (uint64_t)i) >> 40) * (1.0f / 16777216.0f);
}

static uint64_t fold(uint64_t h, int32_t tok, uint32_t pos)
{
	return mix(h, (uint64_t)(uint32_t)tok | (uint64_t)pos << 32);
}

#define H0 0x1234567887654321ull

#define CYC_PERIOD 7
static int32_t cyc_next(int32_t tok)
{
	return (int32_t)(((uint32_t)tok * 5u + 1u) % CYC_PERIOD);
}

/* the peak decides greedy tokens; the rest, drawn by seeded sampling,
 * still depends on the whole history (h) as the pages hold it */
static float cyc_logit(int32_t last, uint64_t h, int32_t t)
{
	return (t == cyc_next(last) ? 8.0f : 0.0f) + logit_of(h, t);
}

static int stub_init(const struct kvd_backend_config *cfg, void **ret)
{
	struct stub *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	g_stub = st;
	*ret = st;
	return 0;
}

static int stub_load(void *ctx, const struct kvd_model_weights *w)
{
	return w->hp.n_vocab == N_VOCAB ? 0 : -EINVAL;
}

static int stub_attach(void *ctx, const struct kvd_paged_view *v)
{
	struct stub *st = ctx;
	if (v->layout.token_stride < 8)
		return -EINVAL;
	st->view = *v;
	if (!v->base) { /* a device pool: this stub's own memory */
		st->dev = calloc(v->n_pages, v->layout.page_bytes);
		if (!st->dev)
			return -ENOMEM;
		st->view.base = st->dev;
	}
	return 0;
}

static unsigned char *row(struct stub *st, const int32_t *pages, uint32_t pos, int v)
{
	const struct kvd_kv_layout *l = &st->view.layout;
	unsigned char *page = (unsigned char *)st->view.base + (size_t)pages[pos / l->block_size] * l->page_bytes;
	return page + (v ? l->v_offset : 0) + (pos % l->block_size) * l->token_stride;
}

static int stub_forward(void *ctx, const struct kvd_batch *b)
{
	struct stub *st = ctx;

	st->forwards++;
	if ((uint64_t)b->n_seqs > st->max_batch)
		st->max_batch = (uint64_t)b->n_seqs;
	if (st->fail_forwards > 0) {
		st->fail_forwards--;
		return -EIO;
	}
	if (st->clock) {
		*st->clock += st->step_ns;
		for (int32_t i = 0; i < b->n_seqs; i++) {
			uint64_t n = (uint64_t)b->seqs[i].n_tokens, p0 = (uint64_t)b->seqs[i].pos0;
			*st->clock += st->token_ns * n + st->pair_ns * (n * p0 + n * (n - 1) / 2);
		}
	}
	for (int32_t i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		for (int32_t j = 0; j < s->n_tokens; j++) {
			uint32_t pos = (uint32_t)(s->pos0 + j);
			uint32_t vrow[2] = { (uint32_t)s->tokens[j], pos };
			uint64_t h = H0, k;

			if ((int64_t)pos / st->view.layout.block_size >= s->n_pages)
				return -EFAULT;
			memcpy(row(st, s->pages, pos, 1), vrow, sizeof(vrow));
			/* attend over the whole history through the page table */
			for (uint32_t q = 0; q <= pos; q++) {
				memcpy(vrow, row(st, s->pages, q, 1), sizeof(vrow));
				if (vrow[1] != q)
					return -EIO;
				h = fold(h, (int32_t)vrow[0], q);
				if (q + 1 == pos) {
					memcpy(&k, row(st, s->pages, q, 0), sizeof(k));
					if (k != h)
						return -EIO; /* the K row of the previous token */
				}
			}
			memcpy(row(st, s->pages, pos, 0), &h, sizeof(h));
			float *lg = s->all_logits ? s->logits + (size_t)j * N_VOCAB
						  : j == s->n_tokens - 1 ? s->logits : NULL;
			if (s->logits && lg)
				for (int32_t t = 0; t < N_VOCAB; t++)
					lg[t] = g_copying ? cyc_logit(s->tokens[j], h, t) : logit_of(h, t);
		}
	}
	return 0;
}

static int stub_page_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct stub *st = ctx;
	const struct kvd_kv_layout *l = &st->view.layout;
	unsigned char *base = st->view.base;

	for (uint32_t layer = 0; layer < l->n_layer; layer++)
		for (int v = 0; v < 2; v++) {
			size_t off = layer * l->layer_stride + (v ? l->v_offset : 0);
			memcpy(base + dst * l->page_bytes + off, base + src * l->page_bytes + off, n_tokens * l->token_stride);
		}
	return 0;
}

static int stub_page_read(void *ctx, uint32_t page, void *dst)
{
	struct stub *st = ctx;
	st->page_reads++;
	memcpy(dst, (unsigned char *)st->view.base + page * st->view.layout.page_bytes, st->view.layout.page_bytes);
	return 0;
}

static int stub_page_write(void *ctx, uint32_t page, const void *src)
{
	struct stub *st = ctx;
	st->page_writes++;
	memcpy((unsigned char *)st->view.base + page * st->view.layout.page_bytes, src, st->view.layout.page_bytes);
	return 0;
}

static int stub_pages_read(void *ctx, const uint32_t *pages, uint32_t n, void *dst)
{
	struct stub *st = ctx;
	size_t pb = st->view.layout.page_bytes;
	st->batch_reads++;
	st->batch_pages += n;
	for (uint32_t i = 0; i < n; i++)
		memcpy((unsigned char *)dst + i * pb, (unsigned char *)st->view.base + pages[i] * pb, pb);
	return 0;
}

static int stub_pages_write(void *ctx, const uint32_t *pages, uint32_t n, const void *src)
{
	struct stub *st = ctx;
	size_t pb = st->view.layout.page_bytes;
	st->batch_writes++;
	st->batch_pages += n;
	for (uint32_t i = 0; i < n; i++)
		memcpy((unsigned char *)st->view.base + pages[i] * pb, (const unsigned char *)src + i * pb, pb);
	return 0;
}

static int stub_suggest_pool_pages(void *ctx, size_t page_bytes, double fraction, uint32_t *ret_pages)
{
	*ret_pages = 64;
	return 0;
}

static void stub_destroy(void *ctx)
{
	struct stub *st = ctx;
	if (ctx == g_stub)
		g_stub = NULL;
	if (st)
		free(st->dev);
	free(ctx);
}

static const struct kvd_backend_ops stub_ops = {
	.name = "stub",
	.version = KVD_BACKEND_ABI_VERSION,
	.init = stub_init,
	.load = stub_load,
	.attach_kv = stub_attach,
	.forward = stub_forward,
	.page_copy = stub_page_copy,
	.page_read = stub_page_read,
	.page_write = stub_page_write,
	.destroy = stub_destroy,
};

/* The same stub declaring a device pool, page by page and batched. */
static const struct kvd_backend_ops stub_dev_ops = {
	.name = "stub-dev",
	.version = KVD_BACKEND_ABI_VERSION,
	.init = stub_init,
	.load = stub_load,
	.attach_kv = stub_attach,
	.forward = stub_forward,
	.page_copy = stub_page_copy,
	.page_read = stub_page_read,
	.page_write = stub_page_write,
	.destroy = stub_destroy,
	.suggest_pool_pages = stub_suggest_pool_pages,
	.caps = KVD_CAP_DEVICE_POOL,
};

static const struct kvd_backend_ops stub_dev_batched_ops = {
	.name = "stub-dev-batched",
	.version = KVD_BACKEND_ABI_VERSION,
	.init = stub_init,
	.load = stub_load,
	.attach_kv = stub_attach,
	.forward = stub_forward,
	.page_copy = stub_page_copy,
	.page_read = stub_page_read,
	.page_write = stub_page_write,
	.destroy = stub_destroy,
	.suggest_pool_pages = stub_suggest_pool_pages,
	.pages_read = stub_pages_read,
	.pages_write = stub_pages_write,
	.caps = KVD_CAP_DEVICE_POOL | KVD_CAP_BATCHED_SWAP,
};

/* The draft model of the draft tests: the stub, except that after every
 * position p with p % 5 == 3 its argmax is a token the copying target
 * never takes there, so some drafts are rejected and the draft sequence is
 * cut back. */
static int stub_draft_forward(void *ctx, const struct kvd_batch *b)
{
	int r = stub_forward(ctx, b);
	if (r < 0)
		return r;
	for (int32_t i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *q = &b->seqs[i];
		for (int32_t j = 0; j < q->n_tokens; j++) {
			float *lg = q->all_logits ? q->logits + (size_t)j * N_VOCAB : j == q->n_tokens - 1 ? q->logits : NULL;
			if (q->logits && lg && (q->pos0 + j) % 5 == 3)
				lg[((uint32_t)q->tokens[j] * 3u + 2u) % N_VOCAB] += 100.0f;
		}
	}
	return 0;
}

static const struct kvd_backend_ops stub_draft_ops = {
	.name = "stub-draft",
	.version = KVD_BACKEND_ABI_VERSION,
	.init = stub_init,
	.load = stub_load,
	.attach_kv = stub_attach,
	.forward = stub_draft_forward,
	.page_copy = stub_page_copy,
	.page_read = stub_page_read,
	.page_write = stub_page_write,
	.destroy = stub_destroy,
};

/* The tokens greedy decoding must give after prompt p[0..n). */
static void expected(const int32_t *p, uint32_t n, uint32_t gen, int32_t *out)
{
	uint64_t h = H0;
	uint32_t pos = 0;

	for (; pos < n; pos++)
		h = fold(h, p[pos], pos);
	for (uint32_t g = 0; g < gen; g++, pos++) {
		int32_t best = 0;
		for (int32_t t = 1; t < N_VOCAB; t++)
			if (logit_of(h, t) > logit_of(h, best))
				best = t;
		out[g] = best;
		h = fold(h, best, pos);
	}
}

/* ---- a scheduler over the stub ------------------------------------------- */

struct rec {
	int32_t toks[MAX_TOKS];
	enum kvd_finish ending[MAX_TOKS];
	uint32_t n;
	int done;
	uint32_t stop_at;   /* answer STOP at this many tokens (0: never) */
	struct kvd_request_result res;
};

/* What one sample of a request got (setup.samples: on_sample_token). */
#define SAMPLE_REQS 4
#define SAMPLE_TOKS 64
#define SAMPLE_TOP  5
struct srec {
	int32_t toks[SAMPLE_TOKS];
	uint32_t n;
	int done;
	struct kvd_request_result res;
	int n_lp;                    /* tokens that came with log-probabilities */
	float lp[SAMPLE_TOKS];
	uint32_t n_top;
	int32_t top_id[SAMPLE_TOKS][SAMPLE_TOP];
	float top_lp[SAMPLE_TOKS][SAMPLE_TOP];
};

struct ctx {
	struct kvd_engine *e;
	struct kvd_sched *s;
	struct rec r[MAX_REQ];
	struct srec sr[SAMPLE_REQS][KVD_MAX_SAMPLES];
	uint32_t log_id[4096], log_sample[4096]; /* every on_sample_token, in order */
	uint32_t n_log;
	int samples;        /* setup.samples */
	int32_t eog;        /* the end-of-generation token, -1: none */
	uint64_t clock_ns;
	uint64_t expired[8];
	int n_expired;
};

static enum kvd_token_verdict on_token(void *ud, uint64_t id, int32_t t, enum kvd_finish ending)
{
	struct ctx *c = ud;
	assert_true(id < MAX_REQ);
	struct rec *r = &c->r[id];
	assert_false(r->done);
	assert_true(r->n < MAX_TOKS);
	r->ending[r->n] = ending;
	r->toks[r->n++] = t;
	return r->stop_at && r->n == r->stop_at ? KVD_TOKEN_STOP : KVD_TOKEN_CONTINUE;
}

static enum kvd_token_verdict on_sample_token(void *ud, uint64_t id, const struct kvd_token_event *ev)
{
	struct ctx *c = ud;
	assert_true(id < SAMPLE_REQS && ev->sample < KVD_MAX_SAMPLES);
	struct srec *r = &c->sr[id][ev->sample];
	assert_false(r->done);
	assert_true(r->n < SAMPLE_TOKS && c->n_log < 4096);
	c->log_id[c->n_log] = (uint32_t)id;
	c->log_sample[c->n_log++] = ev->sample;
	if (ev->lp) {
		assert_int_equal(ev->lp->token, ev->token);
		assert_true(ev->lp->n_top <= SAMPLE_TOP);
		r->lp[r->n] = ev->lp->logprob;
		r->n_top = ev->lp->n_top;
		memcpy(r->top_id[r->n], ev->lp->top_id, ev->lp->n_top * sizeof(int32_t));
		memcpy(r->top_lp[r->n], ev->lp->top_logprob, ev->lp->n_top * sizeof(float));
		r->n_lp++;
	}
	r->toks[r->n++] = ev->token;
	return KVD_TOKEN_CONTINUE;
}

static void on_done(void *ud, uint64_t id, const struct kvd_request_result *res)
{
	struct ctx *c = ud;
	if (c->samples) {
		assert_true(id < SAMPLE_REQS && res->sample < res->n_samples && res->n_samples <= KVD_MAX_SAMPLES);
		struct srec *r = &c->sr[id][res->sample];
		assert_false(r->done);
		r->done = 1;
		r->res = *res;
		r->res.ledger = NULL;
		return;
	}
	assert_true(id < MAX_REQ);
	assert_false(c->r[id].done);
	c->r[id].done = 1;
	c->r[id].res = *res;
	c->r[id].res.ledger = NULL;
}

static int is_eog(void *ud, int32_t t)
{
	struct ctx *c = ud;
	return t == c->eog;
}

static uint64_t clock_of(void *ud)
{
	struct ctx *c = ud;
	return c->clock_ns;
}

static void on_expired(void *ud, uint64_t session)
{
	struct ctx *c = ud;
	assert_true(c->n_expired < 8);
	c->expired[c->n_expired++] = session;
}

struct setup {
	const struct kvd_backend_ops *ops; /* NULL: stub_ops */
	uint32_t block_size;
	uint32_t pages;
	uint32_t per_step;
	uint32_t max_seqs;
	int prefix_cache;
	const char *swap;
	uint32_t session_idle_s;
	uint32_t max_waiting;
	uint32_t max_step_ms;
	int samples;        /* report through on_sample_token (struct srec) */
	struct kvd_spec_config spec;
	uint32_t draft_pages; /* > 0: a draft engine (stub_draft_ops) with this many pages */
	uint32_t draw_threads; /* kvd_sched_config.draw_threads */
};

/* A stub engine of `pages` pages of block_size tokens, over ops. */
static struct kvd_engine *open_stub(const struct kvd_backend_ops *ops, uint32_t block_size, uint32_t pages,
				    int prefix_cache, const char *swap)
{
	char err[256];
	struct kvd_engine *e = NULL;
	struct kvd_hparams hp = { .n_vocab = N_VOCAB, .n_embd = 4, .n_layer = 1, .n_head = 1, .n_head_kv = 1,
				  .head_dim = 4, .n_ff = 4, .n_ctx_train = 4096 };
	struct kvd_kv_layout l;
	kvd_kv_layout_init(&l, &hp, block_size);
	struct kvd_engine_config ec = {
		.block_size = block_size,
		.kv_pool_bytes = (uint64_t)pages * l.page_bytes,
		.max_seqs = 64,
		.prefix_cache = prefix_cache,
		.shuffle_seed = 7,
		.swap_path = swap,
		.swap_bytes = swap ? 4u << 20 : 0,
	};
	int r = kvd_engine_open_backend(&ec, ops, &hp, &e, err, sizeof(err));
	if (r < 0)
		print_error("engine: %s\n", err);
	assert_int_equal(r, 0);
	assert_null(kvd_engine_model(e));
	assert_int_equal(kvmm_n_pages(kvd_engine_kvmm(e)), pages);
	return e;
}

static void open_ctx(struct ctx *c, const struct setup *su)
{
	memset(c, 0, sizeof(*c));
	c->samples = su->samples;
	c->eog = -1;
	c->clock_ns = 1000000000ull;
	c->e = open_stub(su->ops ? su->ops : &stub_ops, su->block_size, su->pages, su->prefix_cache, su->swap);
	if (su->draft_pages)
		kvd_engine_set_draft(c->e, open_stub(&stub_draft_ops, su->block_size, su->draft_pages, 0, NULL));
	struct kvd_sched_config sc = {
		.max_num_seqs = su->max_seqs ? su->max_seqs : 32,
		.max_tokens_per_step = su->per_step ? su->per_step : 512,
		.max_model_len = 2048,
		.max_waiting = su->max_waiting,
		.session_idle_s = su->session_idle_s,
		.max_step_ms = su->max_step_ms,
		.spec = su->spec,
		.draw_threads = su->draw_threads,
	};
	struct kvd_sched_events ev = { .on_token = on_token, .on_done = on_done, .is_eog = is_eog,
				       .now_ns = clock_of, .on_session_expired = on_expired, .ud = c,
				       .on_sample_token = su->samples ? on_sample_token : NULL };
	assert_int_equal(kvd_sched_create(&sc, c->e, &ev, &c->s), 0);
}

static uint32_t pages_used(struct ctx *c)
{
	struct kvmm_stats ks;
	kvmm_get_stats(kvd_engine_kvmm(c->e), &ks);
	return ks.pages_used;
}

static void close_ctx(struct ctx *c)
{
	c->s = kvd_sched_destroy(c->s);
	c->e = kvd_engine_close(c->e);
}

static void run_until_idle(struct ctx *c)
{
	for (int i = 0; i < 100000 && !kvd_sched_idle(c->s); i++) {
		c->clock_ns += 1000000; /* 1 ms a step */
		assert_true(kvd_sched_step(c->s) >= 0);
	}
	assert_true(kvd_sched_idle(c->s));
}

static struct kvd_request_params greedy(uint32_t max_tokens, uint64_t session)
{
	struct kvd_request_params p = { .max_tokens = max_tokens, .session = session };
	kvd_sampler_params_default(&p.sampling);
	p.sampling.temperature = 0;
	return p;
}

/* Distinct prompts of 5..45 tokens; with shared, they all begin with the
 * same 24 tokens (prefix sharing). */
static uint32_t prompt_of(int i, int shared, int32_t *out)
{
	uint32_t n = 5 + (uint32_t)(i * 7) % 41;
	if (shared && n < 30)
		n += 24;
	for (uint32_t k = 0; k < n; k++)
		out[k] = (int32_t)((k * 31 + (shared && k < 24 ? 0 : (uint32_t)i * 977)) % N_VOCAB);
	return n;
}

/* n requests submitted at once; each gets exactly expected(). */
static void batch_check(const struct setup *su, int n, int shared, int expect_preempt)
{
	struct ctx c;
	int32_t p[64], want[GEN];
	struct kvd_sched_stats st;

	open_ctx(&c, su);
	for (int i = 0; i < n; i++) {
		uint32_t np = prompt_of(i, shared, p);
		struct kvd_request_params rp = greedy(GEN, 0);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
	}
	run_until_idle(&c);
	for (int i = 0; i < n; i++) {
		uint32_t np = prompt_of(i, shared, p);
		expected(p, np, GEN, want);
		assert_true(c.r[i].done);
		assert_int_equal(c.r[i].res.finish, KVD_FINISH_LENGTH);
		assert_int_equal(c.r[i].res.generated_tokens, GEN);
		assert_int_equal(c.r[i].res.prompt_tokens, np);
		assert_int_equal(c.r[i].n, GEN);
		if (memcmp(c.r[i].toks, want, sizeof(want)))
			print_error("request %d of %d (block %u): prompt %u\n", i, n, su->block_size, np);
		assert_memory_equal(c.r[i].toks, want, sizeof(want));
	}
	kvd_sched_get_stats(c.s, &st);
	assert_int_equal(st.requests_done, (uint64_t)n);
	assert_int_equal(st.tokens_generated, (uint64_t)n * GEN);
	/* one inter-token gap per token after each request's first */
	assert_int_equal(st.itl.count, (uint64_t)n * (GEN - 1));
	if (expect_preempt) {
		assert_true(st.preemptions > 0);
	} else {
		/* a running sequence gets one token a step, and a step is 1 ms:
		 * every gap is 1 ms, counted in the bucket whose bound it is */
		unsigned b = 0;
		while (kvd_hist_bounds_ns[b] != 1000000)
			b++;
		assert_int_equal(st.preemptions, 0);
		assert_int_equal(st.itl.sum_ns, (uint64_t)n * (GEN - 1) * 1000000);
		assert_int_equal(st.itl.bucket[b], (uint64_t)n * (GEN - 1));
	}
	assert_int_equal(pages_used(&c), 0);
	close_ctx(&c);
}

/* ---- tests ------------------------------------------------------------------ */

static void test_alone_and_batched_any_block_size(void **state)
{
	static const uint32_t bs[] = { 1, 3, 4, 16, 32 };
	(void)state;
	for (size_t i = 0; i < sizeof(bs) / sizeof(bs[0]); i++) {
		uint32_t pages = 4096 / bs[i] + 64;
		/* alone, with the whole prompt in one step */
		batch_check(&(struct setup){ .block_size = bs[i], .pages = pages }, 1, 0, 0);
		/* many at once, a 7-token budget: chunked prefill beside decodes */
		batch_check(&(struct setup){ .block_size = bs[i], .pages = pages, .per_step = 7 }, 16, 0, 0);
		/* a shared prefix from the cache */
		batch_check(&(struct setup){ .block_size = bs[i], .pages = pages, .prefix_cache = 1 }, 16, 1, 0);
	}
}

static void test_admission_from_free_pages(void **state)
{
	struct ctx c;
	int32_t p[8], want[GEN];
	struct kvd_sched_stats st;
	(void)state;

	/* 10 pages of 4 tokens; 8-token prompts need 2 pages each to prefill */
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 10 });
	for (int i = 0; i < 8; i++) {
		for (int k = 0; k < 8; k++)
			p[k] = (int32_t)((i * 8 + k) * 13 % N_VOCAB);
		struct kvd_request_params rp = greedy(GEN, 0);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, 8, &rp), 0);
	}
	kvd_sched_get_stats(c.s, &st);
	assert_int_equal(st.waiting, 8);
	assert_true(kvd_sched_step(c.s) > 0);
	kvd_sched_get_stats(c.s, &st);
	assert_int_equal(st.running, 5); /* exactly what the free pages hold */
	assert_int_equal(st.waiting, 3);
	assert_int_equal(pages_used(&c), 10);
	for (int i = 0; i < 5; i++)
		assert_int_equal(c.r[i].n, 1); /* the oldest five, one token each */
	for (int i = 5; i < 8; i++)
		assert_int_equal(c.r[i].n, 0);
	run_until_idle(&c);
	for (int i = 0; i < 8; i++) {
		for (int k = 0; k < 8; k++)
			p[k] = (int32_t)((i * 8 + k) * 13 % N_VOCAB);
		expected(p, 8, GEN, want);
		assert_memory_equal(c.r[i].toks, want, sizeof(want));
	}
	kvd_sched_get_stats(c.s, &st);
	assert_true(st.preemptions > 0); /* the ninth token needs a third page each */
	assert_int_equal(pages_used(&c), 0);
	close_ctx(&c);
}

static void test_preempt_recompute(void **state)
{
	(void)state;
	/* 16 requests of up to 57 tokens in 40 pages of 4 tokens */
	batch_check(&(struct setup){ .block_size = 4, .pages = 40 }, 16, 0, 1);
	batch_check(&(struct setup){ .block_size = 3, .pages = 40, .per_step = 9, .prefix_cache = 1 }, 16, 1, 1);
}

/* One run of the demotion scenario: prompt A, then a bigger B that needs
 * the pages A's cached prefix holds, then A again. Returns A's second
 * cached-token count and the pages demoted. */
static void demote_run(const char *swap, uint32_t *ret_cached, uint64_t *ret_demoted)
{
	struct ctx c;
	int32_t a[33], b[56], want[GEN];
	struct kvd_sched_stats st;

	for (int k = 0; k < 33; k++)
		a[k] = (int32_t)((k * 37 + 5) % N_VOCAB);
	for (int k = 0; k < 56; k++)
		b[k] = (int32_t)((k * 53 + 11) % N_VOCAB);
	/* 24 pages of 4 tokens: A leaves about 11 cached, B needs 17 */
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 24, .prefix_cache = 1, .swap = swap });
	for (int i = 0; i < 3; i++) {
		struct kvd_request_params rp = greedy(GEN, 0);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, i == 1 ? b : a, i == 1 ? 56 : 33, &rp), 0);
		run_until_idle(&c);
		expected(i == 1 ? b : a, i == 1 ? 56 : 33, GEN, want);
		assert_int_equal(c.r[i].res.finish, KVD_FINISH_LENGTH);
		assert_memory_equal(c.r[i].toks, want, sizeof(want));
	}
	*ret_cached = c.r[2].res.cached_tokens;
	kvd_sched_get_stats(c.s, &st);
	*ret_demoted = st.pages_demoted;
	assert_int_equal(st.demote_errors, 0);
	assert_int_equal(pages_used(&c), 0);
	close_ctx(&c);
}

/* Cached prefix pages are written to swap ahead of pressure rather than
 * dropped: after a request that needs their memory, the first prompt still
 * finds its whole prefix (read back from swap, checked token for token by
 * the stub backend), where without swap its tail had to be recomputed. */
static void test_demote_ahead_of_pressure(void **state)
{
	char dir[] = "/tmp/kvd-test-sched-demote-XXXXXX", path[64];
	uint32_t cached_swap = 0, cached_none = 0;
	uint64_t demoted_swap = 0, demoted_none = 0;
	(void)state;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/swap", dir);
	demote_run(path, &cached_swap, &demoted_swap);
	demote_run(NULL, &cached_none, &demoted_none);
	unlink(path);
	rmdir(dir);
	assert_true(demoted_swap > 0);
	assert_int_equal(demoted_none, 0);
	assert_int_equal(cached_swap, 32); /* every full page of the 33-token prompt */
	assert_true(cached_none < cached_swap);
}

/* A long prompt arriving while a stream decodes: with max_step_ms every
 * step that carries the stream's decode stays within the limit once the
 * cost of a token has been measured (two steps; all steps count without a
 * limit), the prompt still gets
 * through, and a prompt with nothing else running is read in full-size
 * chunks. Time is simulated: the stub charges 4 ms a step plus 0.5 ms a
 * token. Returns the longest step that carried a decode of the stream. */
static uint64_t step_budget_run(uint32_t max_step_ms, uint32_t *ret_idle_steps)
{
	struct ctx c;
	static int32_t a[8], b[900], d[900];
	int32_t want[4];
	uint64_t longest = 0;
	int mixed = 0;

	for (int k = 0; k < 8; k++)
		a[k] = (int32_t)((k * 7 + 1) % N_VOCAB);
	for (int k = 0; k < 900; k++) {
		b[k] = (int32_t)((k * 31 + 3) % N_VOCAB);
		d[k] = (int32_t)((k * 17 + 9) % N_VOCAB);
	}
	open_ctx(&c, &(struct setup){ .block_size = 16, .pages = 256, .max_step_ms = max_step_ms });
	g_stub->clock = &c.clock_ns;
	g_stub->step_ns = 4000000;
	g_stub->token_ns = 500000;
	struct kvd_request_params rs = greedy(300, 0), rp = greedy(4, 0);
	assert_int_equal(kvd_sched_submit(c.s, 0, a, 8, &rs), 0);
	while (c.r[0].n < 5)
		assert_true(kvd_sched_step(c.s) > 0);
	assert_int_equal(kvd_sched_submit(c.s, 1, b, 900, &rp), 0);
	while (!c.r[1].done) {
		uint32_t before = c.r[0].n;
		uint64_t t0 = c.clock_ns;
		assert_true(kvd_sched_step(c.s) > 0);
		assert_false(c.r[0].done); /* the stream outlives the prompt */
		if (c.r[0].n > before && c.r[1].n == 0 && ++mixed > (max_step_ms ? 2 : 0) && c.clock_ns - t0 > longest)
			longest = c.clock_ns - t0;
	}
	expected(b, 900, 4, want);
	assert_memory_equal(c.r[1].toks, want, sizeof(want));
	assert_int_equal(kvd_sched_cancel(c.s, 0), 0);
	run_until_idle(&c);
	/* alone: 900 tokens in 512-token chunks, the first token after 2 steps */
	assert_int_equal(kvd_sched_submit(c.s, 2, d, 900, &rp), 0);
	*ret_idle_steps = 0;
	while (c.r[2].n == 0) {
		assert_true(kvd_sched_step(c.s) > 0);
		++*ret_idle_steps;
	}
	run_until_idle(&c);
	close_ctx(&c);
	return longest;
}

/* The same with attention's cost: a 1,900-token prompt whose chunks cost
 * more per token the deeper they are (0.1 ms a token plus 0.1 us per
 * token and earlier position, so a token at depth 1,900 costs three times
 * one at depth 0). The budget follows the depth: no step that carries the
 * stream's decode overruns 20 ms once two prefill steps are measured, and
 * the prompt still gets through in a bounded number of steps. Returns the
 * longest such step. */
static uint64_t deep_budget_run(uint32_t max_step_ms, uint32_t *ret_steps)
{
	struct ctx c;
	enum { N = 1900 };
	static int32_t a[8], b[N];
	int32_t want[4];
	uint64_t longest = 0;
	int mixed = 0;

	for (int k = 0; k < 8; k++)
		a[k] = (int32_t)((k * 5 + 2) % N_VOCAB);
	for (int k = 0; k < N; k++)
		b[k] = (int32_t)((k * 29 + 11) % N_VOCAB);
	open_ctx(&c, &(struct setup){ .block_size = 16, .pages = 256, .max_step_ms = max_step_ms });
	g_stub->clock = &c.clock_ns;
	g_stub->step_ns = 2000000;
	g_stub->token_ns = 100000;
	g_stub->pair_ns = 100;
	struct kvd_request_params rs = greedy(2000, 0), rp = greedy(4, 0);
	assert_int_equal(kvd_sched_submit(c.s, 0, a, 8, &rs), 0);
	while (c.r[0].n < 5)
		assert_true(kvd_sched_step(c.s) > 0);
	assert_int_equal(kvd_sched_submit(c.s, 1, b, N, &rp), 0);
	*ret_steps = 0;
	while (!c.r[1].done) {
		uint32_t before = c.r[0].n;
		uint64_t t0 = c.clock_ns;
		assert_true(kvd_sched_step(c.s) > 0);
		++*ret_steps;
		assert_false(c.r[0].done);
		if (c.r[0].n > before && c.r[1].n == 0 && ++mixed > 2 && c.clock_ns - t0 > longest)
			longest = c.clock_ns - t0;
	}
	expected(b, N, 4, want);
	assert_memory_equal(c.r[1].toks, want, sizeof(want));
	assert_int_equal(kvd_sched_cancel(c.s, 0), 0);
	run_until_idle(&c);
	close_ctx(&c);
	return longest;
}

static void test_step_budget_depth(void **state)
{
	uint32_t steps = 0;
	(void)state;

	uint64_t longest = deep_budget_run(20, &steps);
	print_message("deep prompt: longest step with a decode %.2f ms, %u steps\n", longest / 1e6, steps);
	assert_true(longest <= 20000000);
	/* the time the decodes leave (about 18 ms of 20) is used: at the
	 * mean cost, 0.2 ms a token, 1900 tokens take about 21 steps; one
	 * that assumed the deepest rate everywhere would need 32; allow for
	 * the fit's first steps */
	assert_true(steps <= 28);
}

/* The step-time model on samples it cannot separate a from b with: chunks
 * of one size at slowly growing depth (what a long prompt beside a stream
 * turns into). The prediction for such a chunk must stay near its measured
 * cost, and the chunk the budget allows near the true one: a fallback
 * that counted the samples' depth twice would shrink it threefold. */
static void test_step_model_collinear(void **state)
{
	(void)state;
	struct kvd_step_model m = {0};
	const double a = 700e3, b = 1100; /* ns a token, ns a pair */
	const uint64_t dec = 3000000;
	for (int i = 0; i < 5; i++)
		kvd_step_model_decode(&m, dec);
	uint32_t p0 = 2000;
	for (int i = 0; i < 200; i++, p0 += 4) {
		double w = kvd_step_pairs(4, p0);
		kvd_step_model_prefill(&m, 4, w, dec + (uint64_t)(a * 4 + b * w));
	}
	double truth = a * 4 + b * kvd_step_pairs(4, p0);
	double pred = kvd_step_model_charge(&m, 1e9, 4, p0);
	assert_true(fabs(pred - truth) < 0.15 * truth);
	/* the true largest chunk within 45 ms at p0 */
	uint32_t n = 1;
	while (a * (n + 1) + b * kvd_step_pairs(n + 1, p0) <= 45e6)
		n++;
	uint32_t cap = kvd_step_model_cap(&m, 45e6, p0, 512);
	print_message("collinear samples: predicted %.2f ms for %.2f ms; cap %u, true %u\n", pred / 1e6, truth / 1e6, cap, n);
	assert_true(cap >= n * 8 / 10 && cap <= n * 12 / 10 + 1);
}

/* The margin for the spread of step times: none while steps take what the
 * model predicts, mean + 2 sd of measured / predicted when a shared machine
 * makes them vary (here +-10% about the truth: the margin must cover the
 * slow ones), never past KVD_STEP_MARGIN_MAX; what a step leaves for
 * prefill shrinks by it. */
static void test_step_model_margin(void **state)
{
	(void)state;
	const double a = 700e3, b = 1100;
	const uint64_t dec = 3000000, target = 50000000;
	struct kvd_step_model exact = {0}, noisy = {0}, wild = {0};
	for (int i = 0; i < 5; i++) {
		kvd_step_model_decode(&exact, dec);
		kvd_step_model_decode(&noisy, dec);
		kvd_step_model_decode(&wild, dec);
	}
	assert_true(kvd_step_model_margin(&exact) == 1);
	for (int i = 0; i < 400; i++) {
		uint32_t n = 16 + (uint32_t)(i * 7 % 48), p0 = (uint32_t)(i * 37 % 3000);
		double w = kvd_step_pairs(n, p0), t = a * n + b * w;
		double f = i % 2 ? 1.1 : 0.9;             /* steps 10% slow or fast in turn */
		double g = i % 4 == 3 ? 3.0 : 1.0;        /* one step in four three times as long */
		kvd_step_model_prefill(&exact, n, w, dec + (uint64_t)t);
		kvd_step_model_prefill(&noisy, n, w, (uint64_t)((dec + t) * f));
		kvd_step_model_prefill(&wild, n, w, (uint64_t)((dec + t) * g));
	}
	double me = kvd_step_model_margin(&exact), mn = kvd_step_model_margin(&noisy), mw = kvd_step_model_margin(&wild);
	print_message("margins: exact %.3f, +-10%% %.3f, bursts %.3f\n", me, mn, mw);
	assert_true(me >= 1 && me < 1.02);
	assert_true(mn > 1.1 && mn < 1.35); /* covers the slow half: 1.1 and then some */
	assert_true(mw == KVD_STEP_MARGIN_MAX);
	/* the prefill share: the target over the margin, less the decodes */
	assert_true(fabs(kvd_step_model_left(&exact, target) - ((double)target / me - (double)exact.decode_ns)) < 1);
	assert_true(fabs(kvd_step_model_left(&noisy, target) - ((double)target / mn - (double)noisy.decode_ns)) < 1);
	assert_true(kvd_step_model_left(&noisy, target) < kvd_step_model_left(&exact, target));
}

static void test_step_budget(void **state)
{
	uint32_t idle_steps = 0;
	(void)state;

	assert_true(step_budget_run(20, &idle_steps) <= 20000000);
	assert_int_equal(idle_steps, 2);
	/* without a limit, the prompt's 512-token chunks hold the stream up */
	assert_true(step_budget_run(0, &idle_steps) > 200000000);
	assert_int_equal(idle_steps, 2);
}

/*
 * Preemption by swap gives every request its exact tokens, on a host pool
 * (the stub reads pages in place: no page moves through the backend), on a
 * device pool moved page by page, and on one whose backend declares
 * batched swap: there every swap goes through pages_read/pages_write, at
 * most one call per swap queue's worth of pages, never page by page.
 */
static void test_preempt_swap(void **state)
{
	static const struct kvd_backend_ops *const ops[] = {&stub_ops, &stub_dev_ops, &stub_dev_batched_ops};
	(void)state;

	for (unsigned o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
		/* kvmm creates the swap file itself and refuses an existing path */
		char dir[] = "/tmp/kvd-test-sched-swap-XXXXXX", path[64];
		struct ctx c;
		int32_t p[64], want[GEN];
		uint32_t swaps = 0;

		assert_non_null(mkdtemp(dir));
		snprintf(path, sizeof(path), "%s/swap", dir);
		open_ctx(&c, &(struct setup){ .ops = ops[o], .block_size = 4, .pages = 40, .swap = path });
		assert_true((kvmm_pool_base(kvd_engine_kvmm(c.e)) == NULL) == ((ops[o]->caps & KVD_CAP_DEVICE_POOL) != 0));
		for (int i = 0; i < 16; i++) {
			uint32_t np = prompt_of(i, 0, p);
			struct kvd_request_params rp = greedy(GEN, 0);
			assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
		}
		run_until_idle(&c);
		for (int i = 0; i < 16; i++) {
			uint32_t np = prompt_of(i, 0, p);
			expected(p, np, GEN, want);
			assert_int_equal(c.r[i].res.finish, KVD_FINISH_LENGTH);
			assert_memory_equal(c.r[i].toks, want, sizeof(want));
			swaps += c.r[i].res.swaps;
		}
		assert_true(swaps > 0);
		struct kvmm_ledger l;
		kvmm_get_ledger(kvd_engine_kvmm(c.e), &l);
		assert_true(l.swap_out_pages > 0);
		if (ops[o] == &stub_dev_batched_ops) {
			assert_int_equal(g_stub->page_reads + g_stub->page_writes, 0);
			assert_true(g_stub->batch_reads > 0 && g_stub->batch_writes > 0);
			assert_int_equal(g_stub->batch_pages, l.swap_out_pages + l.swap_in_pages);
			/* fewer calls than pages: batches, not pages */
			assert_true(g_stub->batch_reads + g_stub->batch_writes < g_stub->batch_pages);
		} else if (ops[o] == &stub_dev_ops) {
			assert_int_equal(g_stub->batch_reads + g_stub->batch_writes, 0);
			assert_int_equal(g_stub->page_reads + g_stub->page_writes, l.swap_out_pages + l.swap_in_pages);
		} else {
			assert_int_equal(g_stub->page_reads + g_stub->page_writes + g_stub->batch_pages, 0);
		}
		assert_int_equal(pages_used(&c), 0);
		close_ctx(&c);
		rmdir(dir);
	}
}

/* A table whose caps promise slots it lacks, or name unknown caps, is
 * refused before anything starts. */
static void test_backend_caps_checked(void **state)
{
	struct kvd_hparams hp = { .n_vocab = N_VOCAB, .n_embd = 4, .n_layer = 1, .n_head = 1, .n_head_kv = 1,
				  .head_dim = 4, .n_ff = 4, .n_ctx_train = 4096 };
	struct kvd_engine_config ec = { .block_size = 4, .kv_pool_bytes = 1u << 16, .max_seqs = 4 };
	struct kvd_backend_ops bad[4];
	struct kvd_engine *e = NULL;
	char err[256];
	(void)state;

	bad[0] = stub_ops, bad[0].caps = KVD_CAP_BATCHED_SWAP;          /* no pages_read/pages_write */
	bad[1] = stub_dev_ops, bad[1].suggest_pool_pages = NULL;         /* device pool without sizing */
	bad[2] = stub_ops, bad[2].caps = KVD_CAP_ALL + 1;                /* a cap this ABI does not know */
	bad[3] = stub_dev_batched_ops, bad[3].version = KVD_BACKEND_ABI_MIN - 1; /* older than any readable */
	for (int i = 0; i < 4; i++) {
		assert_int_equal(kvd_engine_open_backend(&ec, &bad[i], &hp, &e, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "not a backend table of ABI"));
		assert_null(g_stub); /* never started */
	}
	assert_int_equal(kvd_backend_ops_check(&stub_ops), 0);
	assert_int_equal(kvd_backend_ops_check(&stub_dev_batched_ops), 0);
}

static void test_cancel(void **state)
{
	/* kvmm creates the swap file itself and refuses an existing path */
	char dir[] = "/tmp/kvd-test-sched-swap-XXXXXX", path[64];
	struct ctx c;
	int32_t p[64];
	struct kvd_sched_stats st;
	(void)state;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/swap", dir);
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 64, .swap = path, .max_seqs = 4 });
	for (int i = 0; i < 8; i++) {
		uint32_t np = prompt_of(i + 3, 0, p);
		struct kvd_request_params rp = greedy(150, 0);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
	}
	/* run until someone is swapped out */
	for (int k = 0; k < 400; k++) {
		assert_true(kvd_sched_step(c.s) >= 0);
		kvd_sched_get_stats(c.s, &st);
		if (st.swapped)
			break;
	}
	assert_true(st.swapped > 0);
	assert_true(st.waiting > 0);
	struct kvd_sched_req_info info[8];
	size_t n = kvd_sched_list(c.s, info, 8);
	assert_int_equal(n, 8);
	/* cancel one of each state */
	for (int want = 0; want < 4; want++) {
		for (size_t i = 0; i < n; i++) {
			int state_i = info[i].state;
			if (state_i != want || c.r[info[i].req_id].done)
				continue;
			assert_int_equal(kvd_sched_cancel(c.s, info[i].req_id), 0);
			assert_true(c.r[info[i].req_id].done);
			assert_int_equal(c.r[info[i].req_id].res.finish, KVD_FINISH_CANCELLED);
			assert_int_equal(kvd_sched_cancel(c.s, info[i].req_id), -ENOENT);
			break;
		}
	}
	/* the rest: everything goes at once */
	for (int i = 0; i < 8; i++)
		if (!c.r[i].done)
			assert_int_equal(kvd_sched_cancel(c.s, (uint64_t)i), 0);
	assert_true(kvd_sched_idle(c.s));
	assert_int_equal(pages_used(&c), 0);
	struct kvmm_stats ks;
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_int_equal(ks.seqs_live, 0);
	assert_int_equal(ks.pages_swapped, 0);
	close_ctx(&c);
	rmdir(dir);
}

static void test_session(void **state)
{
	struct ctx c;
	int32_t p1[64], p2[64], all[256];
	uint32_t n1 = prompt_of(1, 0, p1), n2 = prompt_of(2, 0, p2);
	struct kvd_request_params sp = greedy(GEN, 77), plain = greedy(GEN, 0);
	(void)state;

	open_ctx(&c, &(struct setup){ .block_size = 5, .pages = 200, .prefix_cache = 1 });
	/* turn 1, turn 2 of session 77 */
	assert_int_equal(kvd_sched_submit(c.s, 0, p1, n1, &sp), 0);
	run_until_idle(&c);
	assert_int_equal(kvd_sched_session_tokens(c.s, 77), (int)(n1 + GEN));
	assert_int_equal(kvd_sched_session_last_token(c.s, 77), c.r[0].toks[GEN - 1]);
	assert_int_equal(kvd_sched_submit(c.s, 1, p2, n2, &sp), 0);
	assert_int_equal(kvd_sched_submit(c.s, 2, p2, n2, &sp), -EBUSY); /* a turn is running */
	run_until_idle(&c);
	assert_int_equal(c.r[1].res.prompt_tokens, n1 + GEN + n2);
	assert_int_equal(c.r[1].res.cached_tokens, n1 + GEN - 1); /* the last token was never computed */
	/* the turn's reuse of its kept KV, for the daemon's prefix counters */
	{
		struct kvd_sched_stats st;
		kvd_sched_get_stats(c.s, &st);
		assert_int_equal(st.session_lookups, 1);
		assert_int_equal(st.session_query_tokens, n1 + GEN + n2);
		assert_int_equal(st.session_hit_tokens, n1 + GEN - 1);
	}
	memcpy(all, p1, n1 * 4);
	memcpy(all + n1, c.r[0].toks, GEN * 4);
	memcpy(all + n1 + GEN, p2, n2 * 4);
	int32_t want[GEN];
	expected(all, n1 + GEN + n2, GEN, want);
	assert_memory_equal(c.r[1].toks, want, sizeof(want));
	/* the same as one request over the whole history */
	assert_int_equal(kvd_sched_submit(c.s, 2, all, n1 + GEN + n2, &plain), 0);
	run_until_idle(&c);
	assert_memory_equal(c.r[2].toks, want, sizeof(want));

	/* a cancelled turn leaves the session as it was */
	int before = kvd_sched_session_tokens(c.s, 77);
	assert_int_equal(kvd_sched_submit(c.s, 3, p1, n1, &sp), 0);
	assert_true(kvd_sched_step(c.s) > 0);
	assert_true(kvd_sched_step(c.s) > 0);
	assert_int_equal(kvd_sched_cancel(c.s, 3), 0);
	assert_int_equal(c.r[3].res.finish, KVD_FINISH_CANCELLED);
	assert_int_equal(kvd_sched_session_tokens(c.s, 77), before);
	assert_int_equal(kvd_sched_submit(c.s, 4, p1, n1, &sp), 0);
	run_until_idle(&c);
	memcpy(all + n1 + GEN + n2, c.r[1].toks, GEN * 4);
	memcpy(all + n1 + 2 * GEN + n2, p1, n1 * 4);
	expected(all, 2 * n1 + 2 * GEN + n2, GEN, want);
	assert_memory_equal(c.r[4].toks, want, sizeof(want));

	/* a failed first turn of another session leaves nothing */
	struct kvd_request_params sp2 = greedy(GEN, 78);
	assert_int_equal(kvd_sched_submit(c.s, 5, p2, n2, &sp2), 0);
	assert_int_equal(kvd_sched_cancel(c.s, 5), 0);
	assert_int_equal(kvd_sched_session_tokens(c.s, 78), -ENOENT);

	assert_int_equal(kvd_sched_session_close(c.s, 77), 0);
	assert_int_equal(kvd_sched_session_tokens(c.s, 77), -ENOENT);
	assert_int_equal(kvd_sched_session_close(c.s, 77), -ENOENT);
	assert_int_equal(pages_used(&c), 0);
	assert_int_equal(c.n_expired, 0);
	close_ctx(&c);
}

/* An idle session survives under pressure as tokens: its pages go first,
 * and its next turn recomputes them with the same result. */
static void test_session_reclaimed_under_pressure(void **state)
{
	struct ctx c;
	int32_t p[64], all[256], want[GEN];
	uint32_t n = prompt_of(4, 0, p);
	struct kvd_request_params sp = greedy(GEN, 9), plain = greedy(GEN, 0);
	struct kvd_sched_stats st;
	(void)state;

	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 24 });
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &sp), 0);
	run_until_idle(&c);
	assert_true(pages_used(&c) > 0);
	/* a plain request that needs the whole pool */
	int32_t big[80];
	for (int k = 0; k < 80; k++)
		big[k] = (int32_t)(k * 7 % N_VOCAB);
	assert_int_equal(kvd_sched_submit(c.s, 1, big, 80, &plain), 0);
	run_until_idle(&c);
	expected(big, 80, GEN, want);
	assert_memory_equal(c.r[1].toks, want, sizeof(want));
	kvd_sched_get_stats(c.s, &st);
	assert_int_equal(st.preemptions, 0);
	assert_int_equal(st.sessions, 1);
	assert_int_equal(kvd_sched_session_tokens(c.s, 9), (int)(n + GEN));
	/* the next turn recomputes the history */
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 5, &sp), 0);
	run_until_idle(&c);
	memcpy(all, p, n * 4);
	memcpy(all + n, c.r[0].toks, GEN * 4);
	memcpy(all + n + GEN, p, 5 * 4);
	expected(all, n + GEN + 5, GEN, want);
	assert_memory_equal(c.r[2].toks, want, sizeof(want));
	assert_int_equal(c.r[2].res.cached_tokens, 0);
	close_ctx(&c);
}

static void test_session_expiry(void **state)
{
	struct ctx c;
	int32_t p[64];
	uint32_t n = prompt_of(5, 0, p);
	struct kvd_request_params a = greedy(4, 1), b = greedy(4, 2), d = greedy(4, 3);
	(void)state;

	/* the config says 100 s; session 2 asks for 5 s */
	open_ctx(&c, &(struct setup){ .block_size = 8, .pages = 64, .session_idle_s = 100 });
	b.session_idle_s = 5;
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &a), 0);
	assert_int_equal(kvd_sched_submit(c.s, 1, p, n, &b), 0);
	run_until_idle(&c);
	assert_int_equal(kvd_sched_expire_sessions(c.s), 0);
	c.clock_ns += 4000000000ull;
	assert_int_equal(kvd_sched_expire_sessions(c.s), 0);
	/* used again at 4 s: its idle time starts again */
	assert_int_equal(kvd_sched_session_touch(c.s, 2), 0);
	c.clock_ns += 4000000000ull;
	assert_int_equal(kvd_sched_expire_sessions(c.s), 0);
	c.clock_ns += 1000000001ull;
	assert_int_equal(kvd_sched_expire_sessions(c.s), 1);
	assert_int_equal(c.n_expired, 1);
	assert_int_equal(c.expired[0], 2);
	assert_int_equal(kvd_sched_session_tokens(c.s, 2), -ENOENT);
	assert_int_equal(kvd_sched_session_touch(c.s, 2), -ENOENT);
	assert_true(kvd_sched_session_tokens(c.s, 1) > 0);
	/* a session with a turn running is never idle */
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &a), 0);
	assert_true(kvd_sched_step(c.s) > 0);
	c.clock_ns += 1000ull * 1000000000ull;
	assert_int_equal(kvd_sched_expire_sessions(c.s), 0);
	run_until_idle(&c);
	c.clock_ns += 100ull * 1000000000ull;
	assert_int_equal(kvd_sched_expire_sessions(c.s), 0); /* exactly 100 s is not past it */
	c.clock_ns += 1;
	assert_int_equal(kvd_sched_expire_sessions(c.s), 1);
	assert_int_equal(c.expired[1], 1);
	assert_int_equal(pages_used(&c), 0);
	/* 0 in the config and the request: never */
	struct kvd_sched_config sc = { .session_idle_s = 0 };
	kvd_sched_set_config(c.s, &sc);
	assert_int_equal(kvd_sched_submit(c.s, 3, p, n, &d), 0);
	run_until_idle(&c);
	c.clock_ns += 1000000ull * 1000000000ull;
	assert_int_equal(kvd_sched_expire_sessions(c.s), 0);
	assert_true(kvd_sched_session_tokens(c.s, 3) > 0);
	close_ctx(&c);
}

static void test_stop_eos_length(void **state)
{
	struct ctx c;
	int32_t p[64], want[40];
	uint32_t n = prompt_of(6, 0, p);
	(void)state;

	expected(p, n, 40, want);
	open_ctx(&c, &(struct setup){ .block_size = 16, .pages = 64 });
	/* max_tokens: ending NONE until the last token, then LENGTH */
	struct kvd_request_params rp = greedy(7, 0);
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &rp), 0);
	/* a stop verdict at the 3rd token */
	c.r[1].stop_at = 3;
	rp.max_tokens = 20;
	assert_int_equal(kvd_sched_submit(c.s, 1, p, n, &rp), 0);
	/* a stop verdict on the max_tokens-th token wins over length */
	c.r[2].stop_at = 5;
	rp.max_tokens = 5;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), 0);
	run_until_idle(&c);
	assert_int_equal(c.r[0].res.finish, KVD_FINISH_LENGTH);
	assert_int_equal(c.r[0].n, 7);
	for (int k = 0; k < 6; k++)
		assert_int_equal(c.r[0].ending[k], KVD_FINISH_NONE);
	assert_int_equal(c.r[0].ending[6], KVD_FINISH_LENGTH);
	assert_memory_equal(c.r[0].toks, want, 7 * 4);
	assert_int_equal(c.r[1].res.finish, KVD_FINISH_STOP);
	assert_int_equal(c.r[1].n, 3);
	assert_int_equal(c.r[1].res.generated_tokens, 3);
	assert_int_equal(c.r[2].res.finish, KVD_FINISH_STOP);
	assert_int_equal(c.r[2].n, 5);

	/* end of generation: the 4th expected token is declared EOG */
	c.eog = want[3];
	int first = 0;
	while (want[first] != c.eog)
		first++;
	rp.max_tokens = 30;
	assert_int_equal(kvd_sched_submit(c.s, 3, p, n, &rp), 0);
	c.r[4].stop_at = (uint32_t)first + 1; /* STOP on the EOG token: still EOS */
	assert_int_equal(kvd_sched_submit(c.s, 4, p, n, &rp), 0);
	rp.ignore_eos = 1;
	assert_int_equal(kvd_sched_submit(c.s, 5, p, n, &rp), 0);
	run_until_idle(&c);
	assert_int_equal(c.r[3].res.finish, KVD_FINISH_EOS);
	assert_int_equal(c.r[3].n, (uint32_t)first + 1); /* the EOG token is reported */
	assert_int_equal(c.r[3].toks[first], c.eog);
	assert_int_equal(c.r[3].ending[first], KVD_FINISH_EOS);
	assert_int_equal(c.r[4].res.finish, KVD_FINISH_EOS);
	assert_int_equal(c.r[5].res.finish, KVD_FINISH_LENGTH);
	assert_int_equal(c.r[5].n, 30);
	assert_memory_equal(c.r[5].toks, want, 30 * 4);
	assert_int_equal(c.r[5].ending[first], KVD_FINISH_NONE);
	assert_int_equal(pages_used(&c), 0);
	close_ctx(&c);
}

static void test_limits(void **state)
{
	struct ctx c;
	int32_t p[64];
	uint32_t n = prompt_of(3, 0, p);
	struct kvd_request_params rp = greedy(100, 0);
	(void)state;

	/* 16 pages of 16 tokens: 256 tokens */
	open_ctx(&c, &(struct setup){ .block_size = 16, .pages = 16, .max_waiting = 2 });
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &rp), 0);
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &rp), -EEXIST);
	assert_int_equal(kvd_sched_submit(c.s, 1, p, n, &rp), 0);
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), -EBUSY); /* two waiting already */
	assert_int_equal(kvd_sched_cancel(c.s, 1), 0);
	rp.max_tokens = 2048;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), -E2BIG);
	rp.max_tokens = 300; /* n + 300 tokens: within max_model_len, more than the pool */
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), -ENOSPC);
	rp.max_tokens = 10;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 0, &rp), -EINVAL);
	p[1] = N_VOCAB;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), -EINVAL);
	p[1] = -1;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), -EINVAL);
	p[1] = 1;
	rp.max_tokens = 0;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), -EINVAL);
	rp.max_tokens = 10;
	rp.sampling.temperature = -1;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), -EINVAL);
	assert_false(c.r[2].done);
	/* request 0 runs; cancelling it frees its pages at once */
	assert_true(kvd_sched_step(c.s) > 0);
	assert_true(pages_used(&c) > 0);
	assert_int_equal(kvd_sched_cancel(c.s, 0), 0);
	assert_int_equal(pages_used(&c), 0);
	assert_true(kvd_sched_idle(c.s));
	assert_int_equal(kvd_sched_step(c.s), 0);
	close_ctx(&c);
}

static void test_engine_failure(void **state)
{
	struct ctx c;
	int32_t p[64], want[GEN];
	uint32_t n = prompt_of(8, 0, p);
	struct kvd_request_params rp = greedy(GEN, 0);
	(void)state;

	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 64 });
	assert_int_equal(kvd_sched_submit(c.s, 0, p, n, &rp), 0);
	assert_int_equal(kvd_sched_submit(c.s, 1, p, n, &rp), 0);
	assert_true(kvd_sched_step(c.s) > 0);
	g_stub->fail_forwards = 1;
	assert_int_equal(kvd_sched_step(c.s), -EIO);
	for (int i = 0; i < 2; i++) {
		assert_true(c.r[i].done);
		assert_int_equal(c.r[i].res.finish, KVD_FINISH_ERROR);
		assert_int_equal(c.r[i].res.error, -EIO);
	}
	assert_int_equal(pages_used(&c), 0);
	/* still usable */
	assert_int_equal(kvd_sched_submit(c.s, 2, p, n, &rp), 0);
	run_until_idle(&c);
	expected(p, n, GEN, want);
	assert_memory_equal(c.r[2].toks, want, sizeof(want));
	close_ctx(&c);
}

/* Seeded sampling: a request's tokens do not depend on its batch-mates,
 * the step budget, the block size or preemption. */
static void test_sampling_same_under_any_load(void **state)
{
	static struct rec ref[MAX_REQ];
	static const struct setup mixes[] = {
		{ .block_size = 16, .pages = 400 },                            /* roomy */
		{ .block_size = 2, .pages = 60, .per_step = 5 },                /* tight, chunked */
		{ .block_size = 7, .pages = 30, .prefix_cache = 1, .max_seqs = 3 },
	};
	int32_t p[64];
	const int n = 12;
	(void)state;

	for (int m = 0; m < 3; m++) {
		struct ctx c;
		open_ctx(&c, &mixes[m]);
		for (int i = 0; i < n; i++) {
			uint32_t np = prompt_of(i, 1, p);
			struct kvd_request_params rp = { .max_tokens = 20 };
			kvd_sampler_params_default(&rp.sampling);
			rp.sampling.temperature = 1.5f;
			rp.sampling.top_k = 0;
			rp.sampling.min_p = 0;
			rp.sampling.seed = (uint64_t)i * 1000003u;
			assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
			if (m == 0)
				run_until_idle(&c); /* the reference: each alone */
		}
		run_until_idle(&c);
		for (int i = 0; i < n; i++) {
			assert_int_equal(c.r[i].n, 20);
			if (m == 0)
				ref[i] = c.r[i];
			else
				assert_memory_equal(c.r[i].toks, ref[i].toks, 20 * 4);
		}
		if (m == 0) {
			/* sampling really is not greedy here */
			int32_t want[20];
			int differ = 0;
			for (int i = 0; i < n; i++) {
				expected(p, prompt_of(i, 1, p), 20, want);
				differ += memcmp(want, ref[i].toks, sizeof(want)) != 0;
			}
			assert_true(differ > 0);
		}
		close_ctx(&c);
	}
}

/* A step's tokens drawn on the draw pool (daemon/sched_draw.c) are the ones
 * drawn one at a time: twelve requests, unconstrained seeded, constrained
 * greedy and constrained seeded (a regex that lets through 64 of the 512
 * tokens, so most draws build a mask and some pass the sampled-token
 * check), each alone with one draw thread as the reference, then all at
 * once with one, two and three threads, roomy and tight (preemption with
 * swap): the same tokens, the same count of checked and masked draws, and
 * with more than one thread the draws really ran on the pool. */
static void test_draws_parallel_exact(void **state)
{
	static struct rec ref[MAX_REQ];
	static const struct setup mixes[] = {
		{ .block_size = 16, .pages = 400, .draw_threads = 1 }, /* reference, alone */
		{ .block_size = 16, .pages = 400, .draw_threads = 1 },
		{ .block_size = 16, .pages = 400, .draw_threads = 2 },
		{ .block_size = 4, .pages = 40, .swap = "mem", .draw_threads = 3 },
	};
	uint8_t bytes[N_VOCAB][2];
	const uint8_t *bp[N_VOCAB];
	uint32_t lens[N_VOCAB];
	struct kvd_gram_vocab *v = NULL;
	struct kvd_grammar *g = NULL;
	struct kvd_sched_stats st, st_serial = { 0 };
	int32_t p[64];
	const int n = 12, toks = 24;
	(void)state;

	for (int t = 0; t < N_VOCAB; t++) { /* token t: two letters a..p, of which a..h pass */
		bytes[t][0] = (uint8_t)('a' + t % 16);
		bytes[t][1] = (uint8_t)('a' + t / 32);
		bp[t] = bytes[t];
		lens[t] = 2;
	}
	assert_int_equal(kvd_gram_vocab_new(N_VOCAB, bp, lens, NULL, &v), 0);
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_REGEX, "[a-h]+", 6, &g, NULL), 0);
	for (int m = 0; m < 4; m++) {
		struct ctx c;
		open_ctx(&c, &mixes[m]);
		for (int i = 0; i < n; i++) {
			uint32_t np = prompt_of(i, 1, p);
			struct kvd_request_params rp = { .max_tokens = (uint32_t)toks };
			kvd_sampler_params_default(&rp.sampling);
			if (i % 3 != 1) {
				rp.sampling.temperature = 1.5f;
				rp.sampling.top_k = 0;
				rp.sampling.min_p = 0;
				rp.sampling.seed = (uint64_t)i * 7919u + 1;
			} else {
				rp.sampling.temperature = 0; /* greedy */
			}
			if (i % 3) {
				rp.grammar = g;
				rp.gram_vocab = v;
			}
			assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
			if (m == 0)
				run_until_idle(&c);
		}
		run_until_idle(&c);
		kvd_sched_get_stats(c.s, &st);
		for (int i = 0; i < n; i++) {
			assert_int_equal(c.r[i].n, toks);
			if (m == 0) {
				ref[i] = c.r[i];
				for (int k = 0; k < toks && i % 3; k++) /* the constraint held */
					assert_true(ref[i].toks[k] % 16 < 8 && ref[i].toks[k] / 32 < 8);
			} else {
				assert_memory_equal(c.r[i].toks, ref[i].toks, (size_t)toks * 4);
			}
		}
		if (m == 0) {
			print_message("draws: %llu checked, %llu masked\n", (unsigned long long)st.gram_checked, (unsigned long long)st.gram_masked);
			assert_true(st.gram_masked > 0 && st.gram_checked > 0); /* both paths ran */
			assert_int_equal(st.draws_parallel, 0);
			st_serial = st;
		} else {
			assert_int_equal(st.gram_masked + st.gram_checked, st_serial.gram_masked + st_serial.gram_checked);
			if (m < 3)
				assert_int_equal(st.gram_masked, st_serial.gram_masked);
			if (mixes[m].draw_threads > 1)
				assert_true(st.draws_parallel > (uint64_t)(n * toks) / 2);
			else
				assert_int_equal(st.draws_parallel, 0);
		}
		close_ctx(&c);
	}
	kvd_grammar_unref(g);
	kvd_gram_vocab_free(v);
}

/* ---- speculative decoding -------------------------------------------------- */

/* Prompt-lookup drafts change no token: with the stub copying (its logits
 * favour one successor of the last token), greedy and seeded requests get
 * the same tokens with [speculative] mode = lookup as with it off, in a
 * roomy pool and in a tight one with swap (preemptions between drafting
 * steps), at block sizes that put the cut inside and across pages; drafts
 * are accepted, stop verdicts inside a draft end exactly where they would,
 * and every page comes back. mode = auto likewise; a request that opts out
 * drafts nothing; the requests' drafted and accepted tokens and verify
 * steps add up to the scheduler's, and the acceptance histograms hold
 * every verify step. */
static void test_spec_lookup_exact(void **state)
{
	static struct rec ref[MAX_REQ];
	static const struct setup mixes[] = {
		{ .block_size = 16, .pages = 400, .prefix_cache = 1 },
		{ .block_size = 4, .pages = 40, .prefix_cache = 1, .swap = "mem" },
		{ .block_size = 1, .pages = 150, .per_step = 7 },
	};
	const int n = 8;
	int32_t p[64];
	(void)state;

	g_copying = 1;
	for (int m = 0; m < 3; m++)
		for (int mode = 0; mode < 3; mode++) { /* off, lookup, auto */
			struct setup su = mixes[m];
			struct ctx c;
			struct kvd_sched_stats st;
			char dir[] = "/tmp/kvd-test-spec-XXXXXX", swap[64];
			if (su.swap) { /* kvmm creates (and unlinks) the file itself */
				assert_non_null(mkdtemp(dir));
				snprintf(swap, sizeof(swap), "%s/swap", dir);
				su.swap = swap;
			}
			su.spec = (struct kvd_spec_config){ .mode = mode == 2 ? KVD_SPEC_AUTO : mode ? KVD_SPEC_LOOKUP : KVD_SPEC_OFF,
							    .draft_tokens = 8, .min_match = 2 };
			open_ctx(&c, &su);
			for (int i = 0; i < n; i++) {
				uint32_t np = prompt_of(i, 1, p);
				struct kvd_request_params rp = greedy(40, 0);
				if (i % 2) {
					rp.sampling.temperature = 1.0f;
					rp.sampling.top_k = 0;
					rp.sampling.min_p = 0;
					rp.sampling.seed = (uint64_t)i * 7919u;
				}
				rp.no_speculate = i == 5; /* opts out */
				c.r[i].stop_at = i == 2 ? 13 : 0; /* a stop verdict, likely inside a draft */
				assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
			}
			run_until_idle(&c);
			kvd_sched_get_stats(c.s, &st);
			for (int i = 0; i < n; i++) {
				assert_true(c.r[i].done);
				assert_int_equal(c.r[i].n, i == 2 ? 13 : 40);
				if (mode == 0)
					ref[i] = c.r[i];
				else if (memcmp(c.r[i].toks, ref[i].toks, c.r[i].n * sizeof(int32_t)))
					fail_msg("mix %d request %d: tokens differ with speculation", m, i);
				assert_int_equal(c.r[i].res.finish, ref[i].res.finish);
				assert_int_equal(c.r[i].res.generated_tokens, ref[i].res.generated_tokens);
			}
			if (mode == 0) {
				assert_int_equal(st.spec_drafted, 0);
			} else {
				assert_true(st.spec_accepted > 0);
				assert_true(st.spec_accepted <= st.spec_drafted);
			}
			/* the requests' counts add up to the scheduler's; each one's
			 * histogram holds its verify steps; the opted-out one drafted nothing */
			uint64_t drafted = 0, accepted = 0, verifies = 0, runs = 0;
			for (int i = 0; i < n; i++) {
				const struct kvd_request_result *x = &c.r[i].res;
				uint32_t in_runs = 0;
				for (unsigned b = 0; b < KVD_SPEC_RUN_BUCKETS; b++)
					in_runs += x->spec_runs[b];
				assert_int_equal(in_runs, x->spec_verify_steps);
				assert_true(x->spec_accepted_tokens <= x->spec_drafted_tokens);
				drafted += x->spec_drafted_tokens;
				accepted += x->spec_accepted_tokens;
				verifies += x->spec_verify_steps;
			}
			for (unsigned b = 0; b < KVD_SPEC_RUN_BUCKETS; b++)
				runs += st.spec_runs[b];
			assert_int_equal(c.r[5].res.spec_drafted_tokens, 0);
			assert_int_equal(drafted, st.spec_drafted);
			assert_int_equal(accepted, st.spec_accepted);
			assert_int_equal(verifies, st.spec_verifies);
			assert_int_equal(runs, st.spec_verifies);
			if (m == 1)
				assert_true(st.preemptions > 0);
			assert_int_equal(st.tokens_generated, (uint64_t)(n - 1) * 40 + 13);
			assert_int_equal(pages_used(&c), 0);
			close_ctx(&c);
			if (su.swap) {
				unlink(swap);
				rmdir(dir);
			}
		}
	g_copying = 0;
}

/* The draft sequence of one request, driven directly: a request 300
 * tokens ahead catches up KVD_SPEC_CATCHUP_TOKENS at a time without
 * drafting; then it drafts k tokens (one fed back per later draft step);
 * when the target accepts two and emits another token, the sequence is
 * cut back to exactly the agreeing prefix (its KV length in the draft
 * pool too); a draft that was accepted whole is cut back by one (the last
 * token is fed again for its logits); dropping gives every page back. */
static void test_spec_draft_dseq(void **state)
{
	(void)state;
	struct kvd_engine *de = open_stub(&stub_ops, 4, 200, 0, NULL);
	struct kvd_spec_drafter *dr = kvd_spec_drafter_new(de);
	struct kvmm *kv = kvd_engine_kvmm(de);
	struct kvd_spec_dseq d = { 0 };
	int32_t toks[400], out[8];
	struct kvd_spec_djob j;
	uint64_t total, used;

	assert_non_null(dr);
	for (int i = 0; i < 300; i++)
		toks[i] = (int32_t)((i * 37) % N_VOCAB);
	j = (struct kvd_spec_djob){ .d = &d, .toks = toks, .n_toks = 300, .k = 4, .out = out };
	assert_int_equal(kvd_spec_drafter_run(dr, &j, 1, NULL, NULL), 0);
	assert_int_equal(j.n_fed, KVD_SPEC_CATCHUP_TOKENS);
	assert_int_equal(j.n_out, 0); /* too far behind to draft yet */
	assert_true(d.has);
	assert_int_equal(d.n, KVD_SPEC_CATCHUP_TOKENS);
	assert_int_equal(kvmm_seq_len(kv, d.seq), KVD_SPEC_CATCHUP_TOKENS);

	j = (struct kvd_spec_djob){ .d = &d, .toks = toks, .n_toks = 300, .k = 4, .out = out };
	assert_int_equal(kvd_spec_drafter_run(dr, &j, 1, NULL, NULL), 0);
	assert_int_equal(j.n_out, 4);
	assert_int_equal(j.n_fed, 300 - KVD_SPEC_CATCHUP_TOKENS + 3);
	assert_int_equal(d.n, 303);
	assert_int_equal(d.base, 300);
	assert_int_equal(d.n_tail, 3);
	/* the drafts are the stub's greedy continuation */
	int32_t want[4];
	expected(toks, 300, 4, want);
	assert_memory_equal(out, want, sizeof(want));

	/* the target accepts two drafts and emits another token */
	toks[300] = out[0];
	toks[301] = out[1];
	toks[302] = (out[2] + 1) % N_VOCAB;
	assert_int_equal(kvd_spec_dseq_sync(dr, &d, toks, 303), 1);
	assert_int_equal(d.n, 302);
	assert_int_equal(kvmm_seq_len(kv, d.seq), 302);
	assert_int_equal(d.n_tail, 0);

	/* drafted again from there, and every draft accepted */
	j = (struct kvd_spec_djob){ .d = &d, .toks = toks, .n_toks = 303, .k = 3, .out = out };
	assert_int_equal(kvd_spec_drafter_run(dr, &j, 1, NULL, NULL), 0);
	assert_int_equal(j.n_out, 3);
	assert_int_equal(j.n_fed, 1 + 2);
	memcpy(&toks[303], out, 3 * sizeof(*out));
	assert_int_equal(kvd_spec_dseq_sync(dr, &d, toks, 306), 1);
	assert_int_equal(d.n, 305); /* toks[303], toks[304] kept; toks[305] is fed again */
	assert_int_equal(kvmm_seq_len(kv, d.seq), 305);

	kvd_spec_drafter_pages(dr, &total, &used);
	assert_int_equal(total, 200);
	assert_int_equal(used, 77); /* 305 tokens of 4-token pages */
	assert_int_equal(kvd_spec_dseq_pages(dr, &d), 77);
	kvd_spec_dseq_drop(dr, &d);
	assert_false(d.has);
	assert_int_equal(kvd_spec_dseq_pages(dr, &d), 0);
	kvd_spec_drafter_pages(dr, &total, &used);
	assert_int_equal(used, 0);
	/* dropped (as preemption does): it starts again from the first token */
	assert_int_equal(kvd_spec_dseq_sync(dr, &d, toks, 306), 306);
	kvd_spec_drafter_free(dr);
	kvd_engine_close(de);
}

/* Draft-model speculation changes no token: the stub copying, a draft
 * engine that disagrees after every fifth position (stub_draft_ops), so
 * drafts are both accepted and rejected; greedy and seeded requests of two
 * owners get the same tokens with mode = draft and auto as with off: with
 * a roomy draft pool, beside a tight main pool with swap (preemptions
 * between drafting steps), and with a draft pool the first owner's six
 * requests overfill (drafts left out, and the second owner, under its
 * share, taking pages from the first). The owner with two requests among
 * eight drafts every time; every draft page and every pool page comes
 * back. */
static void test_spec_draft_exact(void **state)
{
	static struct rec ref[MAX_REQ];
	static const struct setup mixes[] = {
		{ .block_size = 16, .pages = 400, .prefix_cache = 1, .draft_pages = 400 },
		{ .block_size = 4, .pages = 40, .prefix_cache = 1, .swap = "mem", .draft_pages = 60 },
		{ .block_size = 4, .pages = 400, .prefix_cache = 1, .draft_pages = 40 },
	};
	const int n = 8;
	int32_t p[64];
	(void)state;

	g_copying = 1;
	for (int m = 0; m < 3; m++)
		for (int mode = 0; mode < 3; mode++) { /* off, draft, auto */
			struct setup su = mixes[m];
			struct ctx c;
			struct kvd_sched_stats st;
			char dir[] = "/tmp/kvd-test-spec-XXXXXX", swap[64];
			if (su.swap) {
				assert_non_null(mkdtemp(dir));
				snprintf(swap, sizeof(swap), "%s/swap", dir);
				su.swap = swap;
			}
			su.spec = (struct kvd_spec_config){ .mode = mode == 2 ? KVD_SPEC_AUTO : mode ? KVD_SPEC_DRAFT : KVD_SPEC_OFF,
							    .draft_tokens = 8, .min_match = 2 };
			open_ctx(&c, &su);
			for (int i = 0; i < n; i++) {
				uint32_t np = prompt_of(i, 0, p);
				struct kvd_request_params rp = greedy(40, 0);
				if (i % 2) {
					rp.sampling.temperature = 1.0f;
					rp.sampling.top_k = 0;
					rp.sampling.min_p = 0;
					rp.sampling.seed = (uint64_t)i * 7919u;
				}
				rp.owner = i < 6 ? 1000 : 1001;
				assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, np, &rp), 0);
			}
			run_until_idle(&c);
			kvd_sched_get_stats(c.s, &st);
			for (int i = 0; i < n; i++) {
				assert_true(c.r[i].done);
				assert_int_equal(c.r[i].n, 40);
				if (mode == 0)
					ref[i] = c.r[i];
				else if (memcmp(c.r[i].toks, ref[i].toks, c.r[i].n * sizeof(int32_t)))
					fail_msg("mix %d mode %d request %d: tokens differ with a draft model", m, mode, i);
				assert_int_equal(c.r[i].res.finish, ref[i].res.finish);
			}
			if (mode == 0) {
				assert_int_equal(st.spec_drafted, 0);
			} else {
				assert_true(st.spec_accepted > 0);
				assert_true(st.spec_accepted < st.spec_drafted); /* some rejected: cut back */
				assert_true(c.r[6].res.spec_drafted_tokens + c.r[7].res.spec_drafted_tokens > 0);
			}
			if (m == 2 && mode) { /* under its share of the overfilled draft pool: */
				if (mode == 1)
					assert_true(st.spec_draft_reclaims > 0);
				/* the second owner drafts for at least half its tokens */
				assert_true(c.r[6].res.spec_drafted_tokens + c.r[7].res.spec_drafted_tokens >= 40);
			}
			assert_int_equal(st.spec_draft_pages_total, su.draft_pages);
			assert_int_equal(st.spec_draft_pages_used, 0);
			assert_int_equal(pages_used(&c), 0);
			close_ctx(&c);
			if (su.swap) {
				unlink(swap);
				rmdir(dir);
			}
		}
	g_copying = 0;
}

/* ---- parallel samples -------------------------------------------------------- */

static struct kvd_request_params sampled(uint32_t max_tokens, uint32_t n_samples, uint64_t seed)
{
	struct kvd_request_params p = { .max_tokens = max_tokens, .n_samples = n_samples };
	kvd_sampler_params_default(&p.sampling);
	p.sampling.temperature = 1.5f;
	p.sampling.top_k = 0;
	p.sampling.min_p = 0;
	p.sampling.seed = seed;
	return p;
}

static void step_n(struct ctx *c, int n)
{
	for (int i = 0; i < n; i++) {
		c->clock_ns += 1000000;
		assert_true(kvd_sched_step(c->s) > 0);
	}
}

/* n = 4 greedy samples of an 18-token prompt, 4-token pages: the prompt's
 * 4 full pages exist once, each sample holds only its own tail. */
static void test_samples_share_prompt_pages(void **state)
{
	struct ctx c;
	int32_t p[18], want[GEN];
	struct kvmm_stats ks;
	struct kvd_sched_stats st;
	struct kvd_sched_req_info info[8];
	(void)state;

	for (int k = 0; k < 18; k++)
		p[k] = (int32_t)(k * 37 % N_VOCAB);
	expected(p, 18, GEN, want);
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 64, .samples = 1 });
	struct kvd_request_params rp = greedy(GEN, 0);
	rp.n_samples = 4;
	assert_int_equal(kvd_sched_submit(c.s, 0, p, 18, &rp), 0);
	step_n(&c, 1); /* the prompt, once; then the fork and every sample's first token */
	assert_int_equal(kvd_sched_list(c.s, info, 8), 4);
	for (uint32_t i = 0; i < 4; i++) {
		assert_int_equal(info[i].sample, i); /* the samples follow their parent */
		assert_int_equal(info[i].req_id, 0);
		assert_int_equal(c.sr[0][i].n, 1);
	}
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_int_equal(ks.pages_used, 5); /* still one sequence's pages: the fork copied nothing */
	assert_int_equal(ks.pages_shared, 5);
	step_n(&c, 3); /* each sample has now written 3 tokens of its own: 21 tokens, 6 pages */
	uint32_t full = 18 / 4, all = (21 + 3) / 4 /* 21 tokens in KV */, tail = all - full;
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_int_equal(ks.pages_used, full + 4 * tail); /* 4 + 4 * 2 = 12, not 4 * 6 = 24 */
	assert_int_equal(ks.pages_shared, full);
	assert_int_equal(ks.cow_copies, 3); /* the partial page: three copies, the last writer keeps it */
	assert_int_equal(kvd_sched_list(c.s, info, 8), 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(info[i].pages, all);
		assert_int_equal(info[i].pages_shared, full);
	}
	kvd_sched_get_stats(c.s, &st);
	assert_int_equal(st.samples_forked, 3);
	assert_int_equal(st.running, 4);
	run_until_idle(&c);
	for (int i = 0; i < 4; i++) {
		assert_true(c.sr[0][i].done);
		assert_int_equal(c.sr[0][i].res.sample, i);
		assert_int_equal(c.sr[0][i].res.n_samples, 4);
		assert_int_equal(c.sr[0][i].res.finish, KVD_FINISH_LENGTH);
		assert_int_equal(c.sr[0][i].res.generated_tokens, GEN);
		assert_int_equal(c.sr[0][i].res.prompt_tokens, 18);
		assert_int_equal(c.sr[0][i].n, GEN);
		assert_memory_equal(c.sr[0][i].toks, want, sizeof(want)); /* greedy: all equal the reference */
	}
	/* stream order: every step reports the samples in index order */
	assert_int_equal(c.n_log, 4 * GEN);
	for (uint32_t k = 0; k < c.n_log; k++)
		assert_int_equal(c.log_sample[k], k % 4);
	assert_int_equal(pages_used(&c), 0);
	close_ctx(&c);

	/* a prompt that ends on a page boundary: every prompt page is shared */
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 64, .samples = 1 });
	assert_int_equal(kvd_sched_submit(c.s, 1, p, 16, &rp), 0);
	step_n(&c, 3);
	kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
	assert_int_equal(ks.pages_used, 4 + 4 * 1);
	assert_int_equal(ks.pages_shared, 4);
	assert_int_equal(ks.cow_copies, 0);
	run_until_idle(&c);
	close_ctx(&c);
}

/* Seeded samples: sample i is what a one-sample request with the seed
 * kvd_sample_seed(seed, i) gives (sample 0: the seed itself), under any
 * load; the samples differ from each other. */
static void test_samples_seeded(void **state)
{
	static int32_t ref[KVD_MAX_SAMPLES][20];
	int32_t p[64];
	const uint64_t seed = 4242;
	(void)state;

	uint32_t np = prompt_of(3, 0, p);
	for (uint32_t i = 0; i < 6; i++) {
		struct ctx c;
		open_ctx(&c, &(struct setup){ .block_size = 16, .pages = 200 });
		struct kvd_request_params rp = sampled(20, 1, kvd_sample_seed(seed, i));
		assert_int_equal(kvd_sched_submit(c.s, 0, p, np, &rp), 0);
		run_until_idle(&c);
		assert_int_equal(c.r[0].n, 20);
		memcpy(ref[i], c.r[0].toks, sizeof(ref[i]));
		close_ctx(&c);
	}
	assert_int_equal(kvd_sample_seed(seed, 0), seed);
	int differ = 0;
	for (int i = 1; i < 6; i++)
		differ += memcmp(ref[0], ref[i], sizeof(ref[0])) != 0;
	assert_int_equal(differ, 5);

	char dir[] = "/tmp/kvd-test-sched-swap-XXXXXX", path[64];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/swap", dir);
	const struct setup mixes[] = {
		{ .block_size = 16, .pages = 200, .samples = 1 },
		{ .block_size = 3, .pages = 64, .per_step = 16, .prefix_cache = 1, .samples = 1 }, /* tight: recompute */
		{ .block_size = 5, .pages = 200, .max_seqs = 8, .samples = 1 },
		{ .block_size = 3, .pages = 64, .per_step = 16, .swap = path, .samples = 1 }, /* tight: swap */
	};
	for (int m = 0; m < 4; m++) {
		struct ctx c;
		int32_t q[64];
		open_ctx(&c, &mixes[m]);
		struct kvd_request_params rp = sampled(20, 6, seed);
		assert_int_equal(kvd_sched_submit(c.s, 0, p, np, &rp), 0);
		step_n(&c, 2);
		for (int j = 1; j < SAMPLE_REQS; j++) { /* company: other sampled requests, arriving later */
			uint32_t nq = prompt_of(j + 7, 1, q);
			struct kvd_request_params o = sampled(20, 2, (uint64_t)j);
			assert_int_equal(kvd_sched_submit(c.s, (uint64_t)j, q, nq, &o), 0);
		}
		run_until_idle(&c);
		for (int i = 0; i < 6; i++) {
			assert_true(c.sr[0][i].done);
			assert_int_equal(c.sr[0][i].n, 20);
			assert_memory_equal(c.sr[0][i].toks, ref[i], sizeof(ref[i]));
		}
		for (int j = 1; j < SAMPLE_REQS; j++)
			assert_true(c.sr[j][0].done && c.sr[j][1].done && !c.sr[j][2].done);
		struct kvd_sched_stats st;
		kvd_sched_get_stats(c.s, &st);
		if (m == 1 || m == 3)
			assert_true(st.preemptions > 0); /* samples were preempted, and resumed */
		if (m == 3) {
			struct kvmm_stats ks;
			kvmm_get_stats(kvd_engine_kvmm(c.e), &ks);
			assert_true(ks.swap_out_pages > 0 && ks.swap_in_pages > 0);
		}
		assert_int_equal(pages_used(&c), 0);
		close_ctx(&c);
	}
	unlink(path);
	rmdir(dir);
}

/* log-softmax of the stub's logits after history h, in double. */
static double ref_logprob(uint64_t h, int32_t t)
{
	double m = -1e30, sum = 0;
	for (int32_t i = 0; i < N_VOCAB; i++)
		if (logit_of(h, i) > m)
			m = logit_of(h, i);
	for (int32_t i = 0; i < N_VOCAB; i++)
		sum += exp((double)logit_of(h, i) - m);
	return (double)logit_of(h, t) - m - log(sum);
}

/* Log-probabilities of every token and its top alternatives, against the
 * log-softmax of the logits computed here; they are those of the model's
 * distribution, not of the tempered one the sampler draws from. */
static void test_samples_logprobs(void **state)
{
	struct ctx c;
	int32_t p[20];
	(void)state;

	for (int k = 0; k < 20; k++)
		p[k] = (int32_t)(k * 91 % N_VOCAB);
	open_ctx(&c, &(struct setup){ .block_size = 8, .pages = 100, .samples = 1 });
	struct kvd_request_params rp = sampled(10, 3, 99);
	rp.logprobs = 1;
	rp.top_logprobs = SAMPLE_TOP;
	assert_int_equal(kvd_sched_submit(c.s, 0, p, 20, &rp), 0);
	struct kvd_request_params plain = sampled(10, 1, 5); /* no log-probabilities asked */
	assert_int_equal(kvd_sched_submit(c.s, 1, p, 20, &plain), 0);
	run_until_idle(&c);
	assert_int_equal(c.sr[1][0].n_lp, 0);
	for (int i = 0; i < 3; i++) {
		struct srec *r = &c.sr[0][i];
		assert_int_equal(r->n, 10);
		assert_int_equal(r->n_lp, 10);
		assert_int_equal(r->n_top, SAMPLE_TOP);
		uint64_t h = H0;
		uint32_t pos = 0;
		for (; pos < 20; pos++)
			h = fold(h, p[pos], pos);
		for (uint32_t g = 0; g < 10; g++, pos++) {
			assert_float_equal(r->lp[g], ref_logprob(h, r->toks[g]), 1e-5);
			/* the top ones: in order, the likeliest of all */
			int32_t best[SAMPLE_TOP];
			for (int k = 0; k < SAMPLE_TOP; k++) {
				best[k] = -1;
				for (int32_t t = 0; t < N_VOCAB; t++) {
					int taken = 0;
					for (int j = 0; j < k; j++)
						taken |= best[j] == t;
					if (!taken && (best[k] < 0 || logit_of(h, t) > logit_of(h, best[k])))
						best[k] = t;
				}
				assert_int_equal(r->top_id[g][k], best[k]);
				assert_float_equal(r->top_lp[g][k], ref_logprob(h, best[k]), 1e-5);
			}
			h = fold(h, r->toks[g], pos);
		}
	}
	close_ctx(&c);
}

/* Samples are sequences: counted against max_num_seqs at admission,
 * bounded, cancelled together, refused with sessions. */
static void test_samples_admission_cancel_limits(void **state)
{
	struct ctx c;
	int32_t p[12];
	struct kvd_sched_stats st;
	(void)state;

	for (int k = 0; k < 12; k++)
		p[k] = (int32_t)(k * 5 % N_VOCAB);
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 100, .max_seqs = 5, .samples = 1 });
	struct kvd_request_params rp = sampled(GEN, 3, 1);
	assert_int_equal(kvd_sched_submit(c.s, 0, p, 12, &rp), 0);
	assert_int_equal(kvd_sched_submit(c.s, 1, p, 12, &rp), 0); /* 3 + 3 > 5: waits */
	step_n(&c, 1);
	kvd_sched_get_stats(c.s, &st);
	assert_int_equal(st.running, 3);
	assert_int_equal(st.waiting, 1);
	run_until_idle(&c);
	for (int i = 0; i < 3; i++)
		assert_true(c.sr[0][i].done && c.sr[1][i].done);
	/* limits */
	struct kvd_request_params bad = sampled(GEN, KVD_MAX_SAMPLES + 1, 1);
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 12, &bad), -EINVAL);
	bad = sampled(GEN, 6, 1);
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 12, &bad), -ERANGE); /* more than max_num_seqs */
	bad = sampled(GEN, 2, 1);
	bad.session = 5;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 12, &bad), -EINVAL);
	bad = sampled(GEN, 2, 1);
	bad.logprobs = 1;
	bad.top_logprobs = KVD_LOGPROBS_MAX_TOP + 1;
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 12, &bad), -EINVAL);
	/* the pool holds one 12 + 90 token sequence (26 of its 100 pages) but
	 * not 5 of them sharing only 3 prompt pages: 26 + 4 * 23 > 100 */
	bad = sampled(90, 5, 1);
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 12, &bad), -ENOSPC);
	bad = sampled(90, 4, 1); /* 26 + 3 * 23 = 95 */
	assert_int_equal(kvd_sched_submit(c.s, 2, p, 12, &bad), 0);
	assert_int_equal(kvd_sched_cancel(c.s, 2), 0); /* before the fork: every sample reports */
	for (int i = 0; i < 4; i++) {
		assert_true(c.sr[2][i].done);
		assert_int_equal(c.sr[2][i].res.finish, KVD_FINISH_CANCELLED);
		assert_int_equal(c.sr[2][i].res.generated_tokens, 0);
	}
	assert_false(c.sr[2][4].done);
	struct kvd_request_params four = sampled(40, 4, 1);
	assert_int_equal(kvd_sched_submit(c.s, 3, p, 12, &four), 0);
	step_n(&c, 3);
	assert_true(pages_used(&c) > 0);
	assert_int_equal(kvd_sched_cancel(c.s, 3), 0); /* after: all four, pages freed */
	assert_int_equal(kvd_sched_cancel(c.s, 3), -ENOENT);
	for (int i = 0; i < 4; i++) {
		assert_true(c.sr[3][i].done);
		assert_int_equal(c.sr[3][i].res.finish, KVD_FINISH_CANCELLED);
		assert_int_equal(c.sr[3][i].res.generated_tokens, 3);
	}
	assert_int_equal(pages_used(&c), 0);
	assert_true(kvd_sched_idle(c.s));
	close_ctx(&c);
}


/* ---- fair sharing between owners ------------------------------------------ */

#define FLOOD_REQS 24
#define FLOOD_GEN  600
#define VICTIM_ID  30
#define VICTIM_GEN 64

static void fair_prompt(int i, int32_t *p)
{
	for (int k = 0; k < 8; k++)
		p[k] = (int32_t)((i * 8 + k) * 29 % N_VOCAB);
}

/* The victim's short request (owner 2) on the flood of owner 1 (flood:
 * FLOOD_REQS long ones, submitted first and decoding until the pool is
 * full), or alone (flood 0); the stub's clock gives a step a fixed 2 ms
 * plus 1 ms a token, like a CPU. Returns the victim's result and, in
 * *ret_steps, the steps from its submission to its first token. */
static struct kvd_request_result fair_run(int flood, uint32_t *ret_steps, uint64_t *ret_attacker_preempt)
{
	struct ctx c;
	int32_t p[8], want[VICTIM_GEN];
	struct kvd_sched_stats st;
	uint32_t steps = 0;

	/* 200 pages of 4 tokens: the flood's sequences fill it after ~25 tokens each */
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 200, .max_step_ms = 50 });
	g_stub->clock = &c.clock_ns;
	g_stub->step_ns = 2000000;
	g_stub->token_ns = 1000000;
	for (int i = 0; i < (flood ? FLOOD_REQS : 0); i++) {
		struct kvd_request_params rp = greedy(FLOOD_GEN, 0);
		rp.owner = 1;
		fair_prompt(i, p);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, 8, &rp), 0);
	}
	for (int i = 0; i < (flood ? 120 : 0); i++)
		assert_true(kvd_sched_step(c.s) > 0);
	kvd_sched_get_stats(c.s, &st);
	assert_true(!flood || st.preemptions > 0); /* the pool is full */
	struct kvd_request_params vp = greedy(VICTIM_GEN, 0);
	vp.owner = 2;
	fair_prompt(VICTIM_ID, p);
	assert_int_equal(kvd_sched_submit(c.s, VICTIM_ID, p, 8, &vp), 0);
	while (!c.r[VICTIM_ID].n && steps < 400) {
		assert_true(kvd_sched_step(c.s) >= 0);
		steps++;
	}
	/* from its first token on, it has a token in every step */
	for (uint32_t n = c.r[VICTIM_ID].n; !c.r[VICTIM_ID].done && steps < 4000; n++) {
		assert_true(kvd_sched_step(c.s) > 0);
		assert_int_equal(c.r[VICTIM_ID].n, n + 1);
	}
	assert_true(c.r[VICTIM_ID].done);
	expected(p, 8, VICTIM_GEN, want);
	assert_memory_equal(c.r[VICTIM_ID].toks, want, sizeof(want));
	struct kvd_request_result res = c.r[VICTIM_ID].res;
	*ret_steps = steps;
	*ret_attacker_preempt = 0;
	if (flood) {
		/* the flood is served too, and gets exactly its tokens */
		run_until_idle(&c);
		for (int i = 0; i < FLOOD_REQS; i++) {
			static int32_t fwant[FLOOD_GEN];
			fair_prompt(i, p);
			expected(p, 8, FLOOD_GEN, fwant);
			assert_int_equal(c.r[i].res.finish, KVD_FINISH_LENGTH);
			assert_memory_equal(c.r[i].toks, fwant, sizeof(fwant));
			*ret_attacker_preempt += c.r[i].res.preemptions;
		}
	}
	assert_int_equal(pages_used(&c), 0);
	close_ctx(&c);
	return res;
}

/*
 * One owner floods (24 requests of 600 tokens, the pool full, its own
 * requests preempting each other); another owner's short request is
 * admitted at once, has its first token within twice its time alone plus
 * one step budget (max_step_ms), gets a token in every step from then on,
 * decodes at no less than half its speed alone (its fair share of the
 * engine's time with two owners active) and is never preempted; the
 * sequences given up to make room are the flooding owner's.
 */
static void test_fair_share_between_owners(void **state)
{
	uint32_t steps_idle, steps_flood;
	uint64_t pre_idle, pre_flood;
	(void)state;

	struct kvd_request_result idle = fair_run(0, &steps_idle, &pre_idle);
	struct kvd_request_result fl = fair_run(1, &steps_flood, &pre_flood);
	print_message("victim alone: ttft %.1f ms, %.2f ms/token; beside the flood: ttft %.1f ms (%u steps), "
		      "%.2f ms/token (%.0f %% of its speed alone); flood preempted %llu times\n",
		      idle.ttft_ns / 1e6, idle.decode_ns / 1e6 / (VICTIM_GEN - 1), fl.ttft_ns / 1e6, steps_flood,
		      fl.decode_ns / 1e6 / (VICTIM_GEN - 1), 100.0 * idle.decode_ns / fl.decode_ns,
		      (unsigned long long)pre_flood);
	assert_int_equal(steps_idle, 1);
	assert_true(steps_flood <= 3);
	assert_true(fl.ttft_ns <= 2 * idle.ttft_ns + 50000000ull);
	assert_true(fl.decode_ns <= 2 * idle.decode_ns);
	assert_int_equal(fl.preemptions, 0);
	assert_true(pre_flood > 0);
}

/*
 * Preemption takes from the owner furthest over its share of the pool,
 * not the youngest request: owner 1's six older requests grow out of the
 * pool, owner 2's two younger ones stay within its half of it, so every
 * sequence given up is owner 1's and owner 2's are never preempted.
 */
static void test_fair_preempts_owner_over_share(void **state)
{
	struct ctx c;
	int32_t p[8];
	struct kvd_sched_stats st;
	struct kvd_sched_req_info info[16];
	(void)state;

	/* 128 pages of 4 tokens: owner 2's two requests need 54 at most, under
	 * its half; owner 1's six would need 312 */
	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 128 });
	for (int i = 0; i < 8; i++) {
		struct kvd_request_params rp = greedy(i < 6 ? 200 : 100, 0);
		rp.owner = i < 6 ? 1 : 2;
		fair_prompt(i, p);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, 8, &rp), 0);
	}
	for (int k = 0; k < 400; k++) {
		assert_true(kvd_sched_step(c.s) >= 0);
		kvd_sched_get_stats(c.s, &st);
		if (st.preemptions >= 3)
			break;
	}
	assert_true(st.preemptions >= 3);
	size_t n = kvd_sched_list(c.s, info, 16);
	assert_int_equal(n, 8);
	for (size_t i = 0; i < n; i++)
		if (info[i].req_id >= 6)
			assert_int_equal(info[i].state, 2); /* owner 2's still decode */
	run_until_idle(&c);
	for (int i = 0; i < 8; i++)
		assert_int_equal(c.r[i].res.finish, KVD_FINISH_LENGTH);
	assert_int_equal(c.r[6].res.preemptions + c.r[7].res.preemptions, 0);
	close_ctx(&c);
}

/* Within one owner, a lower priority value is admitted first; between
 * owners priority buys nothing over the other's share. */
static void test_fair_priority_within_owner(void **state)
{
	struct ctx c;
	int32_t p[8];
	static const int32_t prio[3] = { 3, 0, 3 };
	(void)state;

	open_ctx(&c, &(struct setup){ .block_size = 4, .pages = 64, .max_seqs = 1 });
	for (int i = 0; i < 3; i++) {
		struct kvd_request_params rp = greedy(4, 0);
		rp.priority = prio[i];
		fair_prompt(i, p);
		assert_int_equal(kvd_sched_submit(c.s, (uint64_t)i, p, 8, &rp), 0);
	}
	assert_true(kvd_sched_step(c.s) > 0);
	assert_int_equal(c.r[1].n, 1);
	assert_int_equal(c.r[0].n + c.r[2].n, 0);
	while (!c.r[1].done)
		assert_true(kvd_sched_step(c.s) > 0);
	assert_true(kvd_sched_step(c.s) > 0);
	assert_int_equal(c.r[0].n, 1); /* then the elder of the two left */
	assert_int_equal(c.r[2].n, 0);
	run_until_idle(&c);
	close_ctx(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alone_and_batched_any_block_size),
		cmocka_unit_test(test_admission_from_free_pages),
		cmocka_unit_test(test_preempt_recompute),
		cmocka_unit_test(test_preempt_swap),
		cmocka_unit_test(test_backend_caps_checked),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_session),
		cmocka_unit_test(test_session_reclaimed_under_pressure),
		cmocka_unit_test(test_session_expiry),
		cmocka_unit_test(test_stop_eos_length),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_engine_failure),
		cmocka_unit_test(test_demote_ahead_of_pressure),
		cmocka_unit_test(test_step_budget),
		cmocka_unit_test(test_step_budget_depth),
		cmocka_unit_test(test_step_model_collinear),
		cmocka_unit_test(test_step_model_margin),
		cmocka_unit_test(test_sampling_same_under_any_load),
		cmocka_unit_test(test_draws_parallel_exact),
		cmocka_unit_test(test_spec_lookup_exact),
		cmocka_unit_test(test_spec_draft_dseq),
		cmocka_unit_test(test_spec_draft_exact),
		cmocka_unit_test(test_samples_share_prompt_pages),
		cmocka_unit_test(test_samples_seeded),
		cmocka_unit_test(test_samples_logprobs),
		cmocka_unit_test(test_samples_admission_cancel_limits),
		cmocka_unit_test(test_fair_share_between_owners),
		cmocka_unit_test(test_fair_preempts_owner_over_share),
		cmocka_unit_test(test_fair_priority_within_owner),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
