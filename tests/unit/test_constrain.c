/*
 * tests/unit/test_constrain.c — sampling under a constraint
 * (daemon/model/sampler.h kvd_sampler_sample_masked,
 * kvd_gram_sample, daemon/model/grammar_sample.c).
 *
 * Exactness against a reference: a masked draw equals the plain sampler's
 * draw over logits with every disallowed token set to -inf, for greedy,
 * top-k, top-p, min-p, temperature and repetition penalty, over random
 * logits and random masks and many seeds, and step after step, so the two
 * consume the same random numbers. The grammar step: greedy answers by the
 * check alone when the argmax is allowed (a hit) and builds the mask when
 * it is not (a miss), returning the best allowed token either way; seeded
 * draws always use the mask and equal the reference; a constraint that
 * allows nothing is reported as stuck; the end token is allowed only once
 * the constraint is complete.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grammar.h"
#include "sampler.h"

/* Deterministic test data (not the sampler's PRNG). */
static uint64_t lcg(uint64_t *x)
{
	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	return *x >> 33;
}

static float frand(uint64_t *x, float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)lcg(x) / (double)(1ull << 31));
}

static int bit(const uint32_t *m, int32_t i)
{
	return m[i / 32] >> (i % 32) & 1u;
}

/* The sampler settings the exactness check runs over. */
static const struct kvd_sampler_params param_sets[] = {
	{ .temperature = 0, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1, .repeat_last_n = 64 },
	{ .temperature = 0, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1.3f, .repeat_last_n = 16 },
	{ .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1, .repeat_last_n = 64 },
	{ .temperature = 1.0f, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 0 },
	{ .temperature = 1.5f, .top_k = 0, .top_p = 0.7f, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 0 },
	{ .temperature = 0.6f, .top_k = 5, .top_p = 1, .min_p = 0.2f, .repeat_penalty = 1.1f, .repeat_last_n = 8 },
	{ .temperature = 2.0f, .top_k = 1000, .top_p = 0.9f, .min_p = 0.01f, .repeat_penalty = 1, .repeat_last_n = 0 },
	{ .temperature = 0.3f, .top_k = 1, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 0 },
};

/* Masked sampling equals sampling over -inf logits: same token at every
 * step of a run, for every parameter set, seed and mask density. */
static void test_masked_equals_reference(void **state)
{
	(void)state;
	enum { N = 600, STEPS = 12, SEEDS = 40 };
	float logits[N], ref[N];
	uint32_t mask[(N + 31) / 32];
	int32_t hist[STEPS + 8];
	uint64_t x = 12345;
	size_t checked = 0;

	for (size_t ps = 0; ps < sizeof(param_sets) / sizeof(param_sets[0]); ps++)
		for (uint64_t seed = 1; seed <= SEEDS; seed++) {
			struct kvd_sampler_params p = param_sets[ps];
			p.seed = seed * 7919;
			struct kvd_sampler *a = kvd_sampler_new(&p, N), *b = kvd_sampler_new(&p, N);
			assert_non_null(a);
			assert_non_null(b);
			size_t nh = 0;
			for (int k = 0; k < 8; k++)
				hist[nh++] = (int32_t)(lcg(&x) % N);
			unsigned density = 1 + (unsigned)(seed % 4); /* 1/2 .. 1/16 of the tokens allowed */
			for (int step = 0; step < STEPS; step++) {
				memset(mask, 0, sizeof(mask));
				for (int32_t i = 0; i < N; i++) {
					logits[i] = frand(&x, -8, 8);
					if (lcg(&x) % (1u << density) == 0)
						mask[i / 32] |= 1u << (i % 32);
				}
				mask[0] |= 1u; /* at least one allowed */
				for (int32_t i = 0; i < N; i++)
					ref[i] = bit(mask, i) ? logits[i] : -INFINITY;
				int32_t t = kvd_sampler_sample_masked(a, logits, hist, nh, mask);
				int32_t r = kvd_sampler_sample(b, ref, hist, nh);
				if (t != r)
					fail_msg("params %zu seed %" PRIu64 " step %d: masked %d, reference %d", ps, seed, step,
						 t, r);
				assert_true(bit(mask, t));
				hist[nh++] = t;
				checked++;
			}
			kvd_sampler_free(a);
			kvd_sampler_free(b);
		}
	assert_int_equal(checked, sizeof(param_sets) / sizeof(param_sets[0]) * SEEDS * STEPS);
}

/* A mask of NULL is the plain sampler, bit for bit, on the same stream. */
static void test_null_mask_is_plain(void **state)
{
	(void)state;
	enum { N = 300 };
	float logits[N];
	uint64_t x = 99;
	struct kvd_sampler_params p = param_sets[2];
	p.seed = 5;
	struct kvd_sampler *a = kvd_sampler_new(&p, N), *b = kvd_sampler_new(&p, N);
	for (int step = 0; step < 200; step++) {
		for (int32_t i = 0; i < N; i++)
			logits[i] = frand(&x, -5, 5);
		assert_int_equal(kvd_sampler_sample_masked(a, logits, NULL, 0, NULL), kvd_sampler_sample(b, logits, NULL, 0));
	}
	kvd_sampler_free(a);
	kvd_sampler_free(b);
}

/* Every allowed logit at -inf: an allowed token still (the lowest). */
static void test_all_allowed_masked_out(void **state)
{
	(void)state;
	enum { N = 64 };
	float logits[N];
	uint32_t mask[2] = { 0, 1u << 5 }; /* token 37 only */
	for (int i = 0; i < N; i++)
		logits[i] = i == 37 ? -INFINITY : 1.0f;
	for (size_t ps = 0; ps < sizeof(param_sets) / sizeof(param_sets[0]); ps++) {
		struct kvd_sampler_params p = param_sets[ps];
		p.seed = 1;
		struct kvd_sampler *a = kvd_sampler_new(&p, N);
		assert_int_equal(kvd_sampler_sample_masked(a, logits, NULL, 0, mask), 37);
		kvd_sampler_free(a);
	}
}

/* ---- the grammar step ---- */

/* A toy vocabulary: single letters, pairs, braces, and an end token. */
static const char *const toy_tokens[] = { "a", "b", "c", "ab", "ba", "{", "}", "x", "abc", "", "cc", "bb" };
#define TOY_N ((int32_t)(sizeof(toy_tokens) / sizeof(toy_tokens[0])))
#define TOY_END 9

struct toy {
	struct kvd_grammar *g;
	struct kvd_gram_vocab *v;
	struct kvd_gram_scratch *s;
	struct kvd_gram_state st;
};

static void toy_open(struct toy *t, const char *gbnf)
{
	const uint8_t *bytes[TOY_N];
	uint32_t lens[TOY_N];
	uint8_t kinds[TOY_N];
	for (int32_t i = 0; i < TOY_N; i++) {
		bytes[i] = (const uint8_t *)toy_tokens[i];
		lens[i] = (uint32_t)strlen(toy_tokens[i]);
		kinds[i] = i == TOY_END ? KVD_GRAM_TOKEN_END : KVD_GRAM_TOKEN_TEXT;
	}
	memset(t, 0, sizeof(*t));
	struct kvd_grammar_error err;
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, gbnf, strlen(gbnf), &t->g, &err), 0);
	assert_int_equal(kvd_gram_vocab_new(TOY_N, bytes, lens, kinds, &t->v), 0);
	t->s = kvd_gram_scratch_new();
	assert_non_null(t->s);
	assert_int_equal(kvd_gram_state_init(t->g, t->s, &t->st), 0);
}

static void toy_close(struct toy *t)
{
	kvd_gram_state_fini(&t->st);
	kvd_gram_scratch_free(t->s);
	kvd_gram_vocab_free(t->v);
	kvd_grammar_unref(t->g);
}

/* Greedy: the argmax allowed is answered by the check (a hit); a refused
 * argmax is followed by the next best candidates, checked in order (a hit
 * too when one of them is allowed), giving the best allowed token. */
static void test_greedy_fast_path(void **state)
{
	(void)state;
	struct toy t;
	toy_open(&t, "root ::= \"a\" [bc]+");
	struct kvd_sampler_params p = param_sets[0];
	struct kvd_sampler *smp = kvd_sampler_new(&p, TOY_N);
	uint32_t mask[1];
	float l[TOY_N];
	int32_t tok;
	int fast;

	for (int32_t i = 0; i < TOY_N; i++)
		l[i] = (float)i * 0.01f;
	l[3] = 5; /* "ab": allowed at the start */
	assert_int_equal(kvd_gram_sample(smp, l, NULL, 0, t.g, t.v, t.s, &t.st, mask, 1, &tok, &fast), 0);
	assert_int_equal(tok, 3);
	assert_int_equal(fast, 1);
	l[3] = 0;
	l[7] = 9; /* "x": never allowed; "a" (id 0) and "ab" (3) and "abc" (8) are */
	l[8] = 4;
	l[0] = 3;
	assert_int_equal(kvd_gram_sample(smp, l, NULL, 0, t.g, t.v, t.s, &t.st, mask, 1, &tok, &fast), 0);
	assert_int_equal(fast, 1);
	assert_int_equal(tok, 8);
	/* the end token only once complete */
	l[TOY_END] = 50;
	assert_int_equal(kvd_gram_sample(smp, l, NULL, 0, t.g, t.v, t.s, &t.st, mask, 1, &tok, &fast), 0);
	assert_int_equal(tok, 8);
	assert_int_equal(kvd_gram_accept_token(t.g, t.v, t.s, &t.st, 8), 0); /* "abc": complete now */
	assert_int_equal(kvd_gram_sample(smp, l, NULL, 0, t.g, t.v, t.s, &t.st, mask, 1, &tok, &fast), 0);
	assert_int_equal(tok, TOY_END);
	assert_int_equal(fast, 1);
	kvd_sampler_free(smp);
	toy_close(&t);
}

/* Seeded: the draw equals the reference over -inf logits built from
 * kvd_gram_allowed_mask, step after step, by the mask or (top-k with every
 * candidate allowed) by the check. */
static void test_seeded_equals_reference(void **state)
{
	(void)state;
	struct toy t;
	toy_open(&t, "root ::= \"{\" ([abc] | \"ab\" | \"ba\" | \"cc\" | \"bb\")* \"}\"");
	uint64_t x = 7;
	size_t masked_draws = 0;
	for (uint64_t seed = 1; seed <= 50; seed++) {
		struct kvd_sampler_params p = param_sets[2 + seed % 5];
		p.seed = seed;
		struct kvd_sampler *a = kvd_sampler_new(&p, TOY_N), *b = kvd_sampler_new(&p, TOY_N);
		struct kvd_gram_state st = { 0 };
		assert_int_equal(kvd_gram_state_copy(&st, &t.st), 0);
		for (int step = 0; step < 10; step++) {
			float l[TOY_N], ref[TOY_N];
			uint32_t mask[1], want[1];
			int32_t tok;
			int fast = -1;
			for (int32_t i = 0; i < TOY_N; i++)
				l[i] = frand(&x, -3, 3);
			assert_true(kvd_gram_allowed_mask(t.g, t.v, t.s, &st, want) > 0);
			for (int32_t i = 0; i < TOY_N; i++)
				ref[i] = bit(want, i) ? l[i] : -INFINITY;
			int rc = kvd_gram_sample(a, l, NULL, 0, t.g, t.v, t.s, &st, mask, 1, &tok, &fast);
			assert_int_equal(rc, 0);
			int32_t r = kvd_sampler_sample(b, ref, NULL, 0);
			if (kvd_sampler_is_greedy(a)) {
				assert_int_equal(tok, r);
			} else {
				assert_int_equal(tok, r);
				masked_draws++;
			}
			if (tok == TOY_END)
				break;
			assert_int_equal(kvd_gram_accept_token(t.g, t.v, t.s, &st, tok), 0);
			if (!kvd_gram_can_continue(&st))
				break;
		}
		kvd_gram_state_fini(&st);
		kvd_sampler_free(a);
		kvd_sampler_free(b);
	}
	assert_true(masked_draws > 100);
	toy_close(&t);
}

/* Greedy over a vocabulary larger than KVD_SAMPLER_GREEDY_CHECK_K, most
 * of it never allowed: the pick equals the reference argmax over -inf
 * logits (with and without a repetition penalty), answered by the ordered
 * check when an allowed token ranks among the best candidates and by the
 * mask when none does; both happen. */
static void test_greedy_next_best(void **state)
{
	(void)state;
	enum { NV = 3 * KVD_SAMPLER_GREEDY_CHECK_K };
	const uint8_t *bytes[NV];
	uint32_t lens[NV];
	for (int i = 0; i < NV; i++) {
		bytes[i] = (const uint8_t *)(i % 48 == 0 ? "a" : i % 48 == 1 ? "b" : "x");
		lens[i] = 1;
	}
	struct kvd_grammar *g = NULL;
	struct kvd_gram_vocab *v = NULL;
	struct kvd_grammar_error err;
	const char *gbnf = "root ::= [ab]+";
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, gbnf, strlen(gbnf), &g, &err), 0);
	assert_int_equal(kvd_gram_vocab_new(NV, bytes, lens, NULL, &v), 0);
	struct kvd_gram_scratch *scr = kvd_gram_scratch_new();
	struct kvd_gram_state st = { 0 };
	assert_non_null(scr);
	assert_int_equal(kvd_gram_state_init(g, scr, &st), 0);
	static const struct kvd_sampler_params ps[] = {
		{ .temperature = 0, .top_k = 40, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 0 },
		{ .temperature = 0.7f, .top_k = 1, .top_p = 1, .min_p = 0, .repeat_penalty = 1.5f, .repeat_last_n = 8 },
	};
	uint64_t x = 4242;
	size_t fast_n = 0, masked_n = 0;
	for (int trial = 0; trial < 400; trial++) {
		struct kvd_sampler *a = kvd_sampler_new(&ps[trial % 2], NV), *b = kvd_sampler_new(&ps[trial % 2], NV);
		float l[NV], ref[NV];
		uint32_t mask[(NV + 31) / 32], want[(NV + 31) / 32];
		int32_t hist[4] = { 0, 16, 17, 1 }, tok;
		int fast = -1;
		for (int i = 0; i < NV; i++)
			l[i] = frand(&x, -2, 2);
		if (trial % 7 == 0)
			l[5] = NAN;
		if (trial % 11 == 0)
			l[trial % 2 ? 48 : 32] = INFINITY; /* an allowed "a", or a refused "x", at +inf */
		assert_true(kvd_gram_allowed_mask(g, v, scr, &st, want) > 0);
		for (int i = 0; i < NV; i++)
			ref[i] = bit(want, i) ? l[i] : -INFINITY;
		assert_int_equal(kvd_gram_sample(a, l, hist, 4, g, v, scr, &st, mask, (NV + 31) / 32, &tok, &fast), 0);
		assert_int_equal(tok, kvd_sampler_sample(b, ref, hist, 4));
		fast ? fast_n++ : masked_n++;
		kvd_sampler_free(a);
		kvd_sampler_free(b);
	}
	assert_true(fast_n > 40);
	assert_true(masked_n > 10);
	kvd_gram_state_fini(&st);
	kvd_gram_scratch_free(scr);
	kvd_gram_vocab_free(v);
	kvd_grammar_unref(g);
}

/* Seeded top-k: when every unmasked top-k candidate is allowed the draw
 * is answered by checking them (no mask), and either way it equals the
 * reference draw over -inf logits, step after step (so both consume the
 * same random numbers), with temperature, top-p, min-p and a repetition
 * penalty over a history; both paths are taken many times. */
static void test_seeded_topk_check(void **state)
{
	(void)state;
	struct toy t;
	/* after "{": most tokens allowed ("x" and "{" never), so a small top-k
	 * is often all allowed and often not */
	toy_open(&t, "root ::= \"{\" ([abc] | \"ab\" | \"ba\" | \"cc\" | \"bb\" | \"abc\")* \"}\"");
	static const struct kvd_sampler_params ps[] = {
		{ .temperature = 0.8f, .top_k = 3, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1, .repeat_last_n = 64 },
		{ .temperature = 1.0f, .top_k = 2, .top_p = 1, .min_p = 0, .repeat_penalty = 1.3f, .repeat_last_n = 4 },
		{ .temperature = 1.5f, .top_k = 5, .top_p = 0.7f, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 0 },
		{ .temperature = 0.6f, .top_k = 4, .top_p = 1, .min_p = 0.2f, .repeat_penalty = 0.9f, .repeat_last_n = 8 },
		{ .temperature = 2.0f, .top_k = 11, .top_p = 0.9f, .min_p = 0.01f, .repeat_penalty = 1, .repeat_last_n = 0 },
	};
	uint64_t x = 99;
	size_t fast_draws = 0, masked_draws = 0;
	for (uint64_t seed = 1; seed <= 200; seed++) {
		struct kvd_sampler_params p = ps[seed % 5];
		p.seed = seed * 31;
		struct kvd_sampler *a = kvd_sampler_new(&p, TOY_N), *b = kvd_sampler_new(&p, TOY_N);
		struct kvd_gram_state st = { 0 };
		int32_t hist[16] = { 5 };
		size_t nh = 1;
		assert_int_equal(kvd_gram_state_copy(&st, &t.st), 0);
		assert_int_equal(kvd_gram_accept_token(t.g, t.v, t.s, &st, 5), 0); /* "{" */
		for (int step = 0; step < 12; step++) {
			float l[TOY_N], ref[TOY_N];
			uint32_t mask[1], want[1];
			int32_t tok;
			int fast = -1;
			for (int32_t i = 0; i < TOY_N; i++)
				l[i] = frand(&x, -3, 3);
			if (step % 3 == 0)
				l[7] = 4; /* "x" on top: never allowed */
			assert_true(kvd_gram_allowed_mask(t.g, t.v, t.s, &st, want) > 0);
			for (int32_t i = 0; i < TOY_N; i++)
				ref[i] = bit(want, i) ? l[i] : -INFINITY;
			assert_int_equal(kvd_gram_sample(a, l, hist, nh, t.g, t.v, t.s, &st, mask, 1, &tok, &fast), 0);
			int32_t r = kvd_sampler_sample(b, ref, hist, nh);
			assert_int_equal(tok, r);
			assert_true(bit(want, tok));
			fast ? fast_draws++ : masked_draws++;
			if (tok == TOY_END)
				break;
			assert_int_equal(kvd_gram_accept_token(t.g, t.v, t.s, &st, tok), 0);
			hist[nh++] = tok;
			if (!kvd_gram_can_continue(&st))
				break;
		}
		kvd_gram_state_fini(&st);
		kvd_sampler_free(a);
		kvd_sampler_free(b);
	}
	assert_true(fast_draws > 200);
	assert_true(masked_draws > 200);
	toy_close(&t);
}

/* Nothing allowed: stuck (-ENOENT), and the caller's buffer too small is
 * refused rather than overrun. */
static void test_stuck(void **state)
{
	(void)state;
	struct toy t;
	toy_open(&t, "root ::= \"q\"");
	struct kvd_sampler_params p = param_sets[0];
	struct kvd_sampler *smp = kvd_sampler_new(&p, TOY_N);
	float l[TOY_N] = { 0 };
	uint32_t mask[1];
	int32_t tok = -1;
	assert_int_equal(kvd_gram_sample(smp, l, NULL, 0, t.g, t.v, t.s, &t.st, mask, 1, &tok, NULL), -ENOENT);
	assert_int_equal(kvd_gram_sample(smp, l, NULL, 0, t.g, t.v, t.s, &t.st, mask, 0, &tok, NULL), -EINVAL);
	kvd_sampler_free(smp);
	toy_close(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_masked_equals_reference),
		cmocka_unit_test(test_null_mask_is_plain),
		cmocka_unit_test(test_all_allowed_masked_out),
		cmocka_unit_test(test_greedy_fast_path),
		cmocka_unit_test(test_seeded_equals_reference),
		cmocka_unit_test(test_seeded_topk_check),
		cmocka_unit_test(test_greedy_next_best),
		cmocka_unit_test(test_stuck),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
