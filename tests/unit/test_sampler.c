/*
 * tests/unit/test_sampler.c — the sampler and stop strings
 * (daemon/model/sampler.h).
 *
 * Sampling: parameter validation; greedy is argmax with ties to the lowest
 * id; the caller's logits are never modified; a seed fixes the sequence and
 * another seed changes it; top_k = 1 and a tiny top_p are greedy at any
 * temperature; top-k, top-p and min-p keep exactly the expected sets; the
 * empirical distribution over 20000 draws matches the softmax within 5
 * binomial standard deviations; repetition penalty follows llama.cpp's
 * rule; a 49152-entry vocabulary with top_k set is checked against a brute
 * force top-k and timed.
 *
 * Stop strings: hits inside and across chunks, held-back prefixes released
 * by flush or by later text, several stops, the earliest-completing stop
 * winning, and a randomized check that any chunking of a text gives the
 * same output as feeding it byte by byte.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cmocka.h>

#include "sampler.h"

/* Deterministic test data (not the sampler's PRNG). */
static uint64_t lcg(uint64_t *x)
{
	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	return *x >> 33;
}

static float rand_logit(uint64_t *x)
{
	return (float)((double)lcg(x) / (double)(1ull << 31) * 20.0 - 10.0);
}

static struct kvd_sampler_params params(float temp, int32_t top_k, float top_p, float min_p, uint64_t seed)
{
	struct kvd_sampler_params p;
	kvd_sampler_params_default(&p);
	p.temperature = temp;
	p.top_k = top_k;
	p.top_p = top_p;
	p.min_p = min_p;
	p.seed = seed;
	return p;
}

static int32_t greedy_ref(const float *l, int32_t n)
{
	int32_t b = 0;
	for (int32_t i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* ---- parameters ---- */

static void test_params(void **state)
{
	(void)state;
	struct kvd_sampler_params p;
	kvd_sampler_params_default(&p);
	assert_true(p.temperature == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0.05f);
	assert_true(p.repeat_penalty == 1.0f && p.repeat_last_n == 64 && p.seed == 0);
	assert_int_equal(kvd_sampler_params_check(&p), 0);
	assert_int_equal(kvd_sampler_params_check(NULL), -EINVAL);

	struct kvd_sampler_params bad[] = { p, p, p, p, p, p, p, p, p, p, p };
	bad[0].temperature = -0.1f;
	bad[1].top_p = 0;
	bad[2].min_p = 1;
	bad[3].repeat_penalty = 0;
	bad[4].repeat_penalty = -1;
	bad[5].temperature = NAN;
	bad[6].top_p = NAN;
	bad[7].min_p = NAN;
	bad[8].repeat_penalty = INFINITY;
	bad[9].repeat_last_n = -1;
	bad[10].temperature = INFINITY;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(kvd_sampler_params_check(&bad[i]), -EINVAL);
		assert_null(kvd_sampler_new(&bad[i], 10));
	}
	/* "off" values are valid */
	struct kvd_sampler_params off = p;
	off.top_k = 0;
	off.top_p = 1;
	off.min_p = 0;
	off.temperature = 0;
	assert_int_equal(kvd_sampler_params_check(&off), 0);
	off.top_k = -5;
	off.top_p = 2;
	off.min_p = -1;
	assert_int_equal(kvd_sampler_params_check(&off), 0);

	assert_null(kvd_sampler_new(&p, 0));
	assert_null(kvd_sampler_new(&p, -1));
	assert_null(kvd_sampler_new(&p, KVD_SAMPLER_MAX_VOCAB + 1));
	struct kvd_sampler *s = kvd_sampler_new(&p, KVD_SAMPLER_MAX_VOCAB);
	assert_non_null(s);
	assert_null(kvd_sampler_free(s));
	assert_null(kvd_sampler_free(NULL));
}

/* ---- greedy ---- */

static void test_greedy_argmax_ties_lowest(void **state)
{
	(void)state;
	struct kvd_sampler_params p = params(0, 40, 0.95f, 0.05f, 1);
	struct kvd_sampler *s = kvd_sampler_new(&p, 16);
	float l[16];
	for (int i = 0; i < 16; i++)
		l[i] = (float)(i % 5);
	/* 4.0 at ids 4, 9, 14 */
	assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), 4);
	l[4] = 3.5f;
	assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), 9);
	for (int i = 0; i < 16; i++)
		l[i] = -1.0f;
	assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), 0);
	l[15] = INFINITY;
	assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), 15);
	l[15] = NAN; /* NaN never wins */
	l[3] = NAN;
	l[7] = -0.5f;
	assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), 7);
	for (int i = 0; i < 16; i++)
		l[i] = -INFINITY;
	assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), 0);
	kvd_sampler_free(s);

	/* many ties, NaN and infinities, vocabulary sizes around the
	 * sampler's unrolling: the documented rules, written out */
	for (int32_t nv = 1; nv <= 67; nv++) {
		uint64_t y = 7 + (uint64_t)nv;
		float t[67];
		struct kvd_sampler *g = kvd_sampler_new(&p, nv);
		for (int round = 0; round < 20; round++) {
			for (int32_t i = 0; i < nv; i++) {
				uint32_t r = (uint32_t)(lcg(&y) % 9);
				t[i] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? FLT_MAX : (float)(r % 3);
			}
			int32_t want = 0;
			float best = -INFINITY;
			for (int32_t i = 0; i < nv; i++) {
				float v = isnan(t[i]) ? -INFINITY : t[i] > FLT_MAX ? FLT_MAX : t[i];
				if (v > best) {
					best = v;
					want = i;
				}
			}
			assert_int_equal(kvd_sampler_sample(g, t, NULL, 0), want);
		}
		kvd_sampler_free(g);
	}

	/* against a reference on random logits */
	uint64_t x = 42;
	s = kvd_sampler_new(&p, 1000);
	float big[1000];
	for (int round = 0; round < 50; round++) {
		for (int i = 0; i < 1000; i++)
			big[i] = rand_logit(&x);
		assert_int_equal(kvd_sampler_sample(s, big, NULL, 0), greedy_ref(big, 1000));
	}
	kvd_sampler_free(s);
}

/*
 * The caller's logits are never written: the sampler reads them from a
 * read-only mapping (a write, through a cast or not, faults and fails the
 * test), and sampling the same array twenty times gives exactly the
 * tokens that sampling a fresh copy each time gives (a sampler that
 * changed its input in place, say by applying the repetition penalty to
 * it, would compound the change and drift).
 */
static void test_logits_not_modified(void **state)
{
	(void)state;
	enum { N = 4096, ROUNDS = 20 };
	static float fresh[N];
	int32_t hist[100], got[ROUNDS], want[ROUNDS];
	uint64_t x = 7;
	size_t bytes = sizeof(float) * N;
	float *l = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(l != MAP_FAILED);
	for (int i = 0; i < N; i++)
		l[i] = rand_logit(&x);
	for (int i = 0; i < 100; i++)
		hist[i] = (int32_t)(lcg(&x) % N);
	memcpy(fresh, l, bytes);
	assert_int_equal(mprotect(l, bytes, PROT_READ), 0);
	struct kvd_sampler_params p = params(0.9f, 0, 0.9f, 0.01f, 3);
	p.repeat_penalty = 1.3f;
	struct kvd_sampler *s = kvd_sampler_new(&p, N), *s2 = kvd_sampler_new(&p, N);
	for (int i = 0; i < ROUNDS; i++) {
		got[i] = kvd_sampler_sample(s, l, hist, 100);
		float copy[N];
		memcpy(copy, fresh, bytes);
		want[i] = kvd_sampler_sample(s2, copy, hist, 100);
	}
	assert_memory_equal(got, want, sizeof(got));
	assert_memory_equal(l, fresh, bytes);
	kvd_sampler_free(s);
	kvd_sampler_free(s2);
	munmap(l, bytes);
}

/* ---- determinism ---- */

static void run_sequence(uint64_t seed, int32_t *out, int n_tokens)
{
	enum { N = 512 };
	static float l[N];
	uint64_t x = 99;
	struct kvd_sampler_params p = params(1.0f, 0, 1.0f, 0, seed);
	struct kvd_sampler *s = kvd_sampler_new(&p, N);
	for (int t = 0; t < n_tokens; t++) {
		for (int i = 0; i < N; i++)
			l[i] = rand_logit(&x) * 0.3f; /* fairly flat: many candidates */
		out[t] = kvd_sampler_sample(s, l, out, (size_t)t);
		assert_true(out[t] >= 0 && out[t] < N);
	}
	kvd_sampler_free(s);
}

static void test_seed_determinism(void **state)
{
	(void)state;
	enum { T = 200 };
	int32_t a[T], b[T], c[T];
	run_sequence(12345, a, T);
	run_sequence(12345, b, T);
	run_sequence(12346, c, T);
	assert_memory_equal(a, b, sizeof(a));
	int same = 0;
	for (int i = 0; i < T; i++)
		same += a[i] == c[i];
	assert_true(same < T / 4);
}

/* ---- filters that reduce to greedy ---- */

static void test_top_k_1_is_greedy(void **state)
{
	(void)state;
	enum { N = 300 };
	float l[N];
	uint64_t x = 5;
	const float temps[] = { 0.01f, 0.5f, 1.0f, 3.0f, 100.0f };
	for (size_t ti = 0; ti < sizeof(temps) / sizeof(temps[0]); ti++) {
		struct kvd_sampler_params p = params(temps[ti], 1, 1.0f, 0, ti);
		struct kvd_sampler *s = kvd_sampler_new(&p, N);
		for (int round = 0; round < 40; round++) {
			for (int i = 0; i < N; i++)
				l[i] = (float)(lcg(&x) % 8); /* many ties */
			assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), greedy_ref(l, N));
		}
		kvd_sampler_free(s);
	}
}

static void test_tiny_top_p_is_greedy(void **state)
{
	(void)state;
	enum { N = 2000 };
	static float l[N];
	uint64_t x = 11;
	const float temps[] = { 0.3f, 1.0f, 5.0f };
	for (size_t ti = 0; ti < 3; ti++) {
		/* with and without top-k, so both top-p paths run */
		for (int32_t k = 0; k <= 100; k += 100) {
			struct kvd_sampler_params p = params(temps[ti], k, 1e-6f, 0, 77 + ti);
			struct kvd_sampler *s = kvd_sampler_new(&p, N);
			for (int round = 0; round < 30; round++) {
				for (int i = 0; i < N; i++)
					l[i] = rand_logit(&x);
				assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), greedy_ref(l, N));
			}
			kvd_sampler_free(s);
		}
	}
}

/* ---- distributions ---- */

/* Draws n samples and checks each token's count against probs within
 * 5 binomial standard deviations (a false failure is ~1e-6 likely, and
 * the seed is fixed anyway). Tokens with probability 0 must never appear. */
static void check_distribution(const struct kvd_sampler_params *p, const float *l, int32_t n_vocab,
			       const double *probs, int n)
{
	struct kvd_sampler *s = kvd_sampler_new(p, n_vocab);
	assert_non_null(s);
	int counts[16] = { 0 };
	assert_true(n_vocab <= 16);
	for (int i = 0; i < n; i++) {
		int32_t t = kvd_sampler_sample(s, l, NULL, 0);
		assert_true(t >= 0 && t < n_vocab);
		counts[t]++;
	}
	for (int32_t t = 0; t < n_vocab; t++) {
		double mean = n * probs[t], sd = sqrt(n * probs[t] * (1 - probs[t]));
		if (probs[t] == 0) {
			if (counts[t] != 0)
				fail_msg("token %d drawn %d times, expected never", t, counts[t]);
			continue;
		}
		if (fabs(counts[t] - mean) > 5 * sd)
			fail_msg("token %d: %d draws, expected %.1f +- %.1f", t, counts[t], mean, 5 * sd);
	}
	kvd_sampler_free(s);
}

static void softmax(const float *l, int n, float temp, double *out)
{
	double m = -INFINITY, z = 0;
	for (int i = 0; i < n; i++)
		m = l[i] > m ? l[i] : m;
	for (int i = 0; i < n; i++)
		z += out[i] = exp((l[i] - m) / temp);
	for (int i = 0; i < n; i++)
		out[i] /= z;
}

static void test_distribution_temperature_1(void **state)
{
	(void)state;
	const float l[4] = { 1.0f, 2.0f, 0.5f, -1.0f };
	double probs[4];
	softmax(l, 4, 1.0f, probs);
	struct kvd_sampler_params p = params(1.0f, 0, 1.0f, 0, 2024);
	check_distribution(&p, l, 4, probs, 20000);
	/* top_k larger than the vocabulary is the same as off */
	p.top_k = 10;
	p.seed = 9;
	check_distribution(&p, l, 4, probs, 20000);
}

static void test_distribution_temperature_scales(void **state)
{
	(void)state;
	const float l[4] = { 1.0f, 2.0f, 0.5f, -1.0f };
	double probs[4];
	softmax(l, 4, 2.5f, probs);
	struct kvd_sampler_params p = params(2.5f, 0, 1.0f, 0, 31);
	check_distribution(&p, l, 4, probs, 20000);
	softmax(l, 4, 0.5f, probs);
	p = params(0.5f, 0, 1.0f, 0, 32);
	check_distribution(&p, l, 4, probs, 20000);
}

/* Probabilities 0.5, 0.3, 0.15, 0.05 (as logs). */
static void fixed_probs(float *l)
{
	const double pr[4] = { 0.5, 0.3, 0.15, 0.05 };
	for (int i = 0; i < 4; i++)
		l[i] = (float)log(pr[i]);
}

static void test_top_k_keeps_k(void **state)
{
	(void)state;
	float l[4];
	fixed_probs(l);
	const double probs[4] = { 0.5 / 0.8, 0.3 / 0.8, 0, 0 };
	struct kvd_sampler_params p = params(1.0f, 2, 1.0f, 0, 5);
	check_distribution(&p, l, 4, probs, 20000);
}

static void test_top_p_keeps_prefix(void **state)
{
	(void)state;
	float l[4];
	fixed_probs(l);
	/* 0.5 < 0.7 <= 0.8: the first two */
	const double two[4] = { 0.5 / 0.8, 0.3 / 0.8, 0, 0 };
	struct kvd_sampler_params p = params(1.0f, 0, 0.7f, 0, 6);
	check_distribution(&p, l, 4, two, 20000);
	/* 0.8 < 0.9 <= 0.95: three */
	const double three[4] = { 0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0 };
	p = params(1.0f, 0, 0.9f, 0, 7);
	check_distribution(&p, l, 4, three, 20000);
	/* top-p's mass is over the top-k survivors: top_k 3 then 0.6 of
	 * (0.5, 0.3, 0.15)/0.95 = 0.526, 0.842: two */
	p = params(1.0f, 3, 0.6f, 0, 8);
	check_distribution(&p, l, 4, two, 20000);
}

static void test_min_p_filters(void **state)
{
	(void)state;
	float l[4];
	fixed_probs(l);
	/* keep p >= 0.2 * 0.5 = 0.1: the first three */
	const double three[4] = { 0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0 };
	struct kvd_sampler_params p = params(1.0f, 0, 1.0f, 0.2f, 9);
	check_distribution(&p, l, 4, three, 20000);
	/* keep p >= 0.25: the first two */
	const double two[4] = { 0.5 / 0.8, 0.3 / 0.8, 0, 0 };
	p = params(1.0f, 0, 1.0f, 0.5f, 10);
	check_distribution(&p, l, 4, two, 20000);
	/* keep p >= 0.45: only the first */
	const double one[4] = { 1, 0, 0, 0 };
	p = params(1.0f, 0, 1.0f, 0.9f, 11);
	check_distribution(&p, l, 4, one, 2000);
	/* min-p and top-p together: the shorter prefix wins */
	p = params(1.0f, 0, 0.7f, 0.2f, 12);
	check_distribution(&p, l, 4, two, 20000);
	/* min-p after temperature: at T = 2 the ratios are square roots,
	 * sqrt(0.05/0.5) = 0.316 >= 0.3, so all four stay */
	double probs[4];
	softmax(l, 4, 2.0f, probs);
	p = params(2.0f, 0, 1.0f, 0.3f, 13);
	check_distribution(&p, l, 4, probs, 20000);
}

/* ---- repetition penalty ---- */

static void test_repetition_penalty(void **state)
{
	(void)state;
	struct kvd_sampler_params p = params(0, 0, 1.0f, 0, 0);
	p.repeat_penalty = 1.5f;
	p.repeat_last_n = 4;
	struct kvd_sampler *s = kvd_sampler_new(&p, 4);

	/* positive logits are divided: 2.0 / 1.5 = 1.33 < 1.9 */
	float l[4] = { 2.0f, 1.9f, 0.0f, -3.0f };
	int32_t h1[] = { 0 };
	assert_int_equal(kvd_sampler_sample(s, l, NULL, 0), 0);
	assert_int_equal(kvd_sampler_sample(s, l, h1, 1), 1);
	/* negative logits are multiplied: -1.0 * 1.5 = -1.5 < -1.2 */
	float n[4] = { -1.0f, -1.2f, -5.0f, -6.0f };
	assert_int_equal(kvd_sampler_sample(s, n, h1, 1), 1);
	/* a token repeated many times is penalised once: 2.0 / 1.5 > 1.3 */
	float r[4] = { 2.0f, 1.3f, 0.0f, 0.0f };
	int32_t h3[] = { 0, 0, 0, 0 };
	assert_int_equal(kvd_sampler_sample(s, r, h3, 4), 0);
	/* only the last repeat_last_n tokens count */
	int32_t h_old[] = { 0, 2, 3, 2, 3 };
	assert_int_equal(kvd_sampler_sample(s, l, h_old, 5), 0);
	int32_t h_new[] = { 2, 3, 2, 0 };
	assert_int_equal(kvd_sampler_sample(s, l, h_new, 4), 1);
	/* ids outside the vocabulary are ignored */
	int32_t h_bad[] = { -1, 4, 1000000, INT32_MIN };
	assert_int_equal(kvd_sampler_sample(s, l, h_bad, 4), 0);
	kvd_sampler_free(s);

	/* penalty 1 and repeat_last_n 0 are off */
	p.repeat_penalty = 1.0f;
	s = kvd_sampler_new(&p, 4);
	assert_int_equal(kvd_sampler_sample(s, l, h1, 1), 0);
	kvd_sampler_free(s);
	p.repeat_penalty = 1.5f;
	p.repeat_last_n = 0;
	s = kvd_sampler_new(&p, 4);
	assert_int_equal(kvd_sampler_sample(s, l, h1, 1), 0);
	kvd_sampler_free(s);

	/* a penalty below 1 promotes, without overflowing to inf */
	p.repeat_penalty = 1e-30f;
	p.repeat_last_n = 64;
	s = kvd_sampler_new(&p, 4);
	float big[4] = { INFINITY, 1e30f, 0, 0 };
	int32_t h_one[] = { 1 };
	/* both become FLT_MAX: a tie, so the lower id */
	assert_int_equal(kvd_sampler_sample(s, big, h_one, 1), 0);
	big[0] = 3e38f;
	assert_int_equal(kvd_sampler_sample(s, big, h_one, 1), 1);
	kvd_sampler_free(s);

	/* the penalty applies when sampling too: 30 / 100 = 0.3 makes token 1
	 * (20) all but certain */
	p = params(1.0f, 0, 1.0f, 0, 4);
	p.repeat_penalty = 100.0f;
	s = kvd_sampler_new(&p, 4);
	float pk[4] = { 30.0f, 20.0f, 0, 0 };
	int32_t h0[] = { 0 };
	for (int i = 0; i < 200; i++)
		assert_int_equal(kvd_sampler_sample(s, pk, h0, 1), 1);
	kvd_sampler_free(s);
}

/* ---- a model-sized vocabulary ---- */

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void test_large_vocab_top_k(void **state)
{
	(void)state;
	enum { N = 49152, K = 40, ROUNDS = 300 };
	float *l = malloc(N * sizeof(float)), *sorted = malloc(N * sizeof(float));
	assert_non_null(l);
	assert_non_null(sorted);
	uint64_t x = 1234;
	for (int i = 0; i < N; i++)
		l[i] = rand_logit(&x);
	memcpy(sorted, l, N * sizeof(float));
	qsort(sorted, N, sizeof(float), cmp_desc);
	float kth = sorted[K - 1];

	struct kvd_sampler_params p = params(3.0f, K, 1.0f, 0, 99); /* hot: spreads over the top k */
	struct kvd_sampler *s = kvd_sampler_new(&p, N);
	int distinct = 0;
	char seen[N] = { 0 };
	double t0 = now_ms();
	for (int r = 0; r < ROUNDS; r++) {
		int32_t t = kvd_sampler_sample(s, l, NULL, 0);
		assert_true(t >= 0 && t < N);
		if (l[t] < kth)
			fail_msg("token %d (logit %f) is outside the top %d (>= %f)", t, l[t], K, kth);
		distinct += !seen[t];
		seen[t] = 1;
	}
	double ms = (now_ms() - t0) / ROUNDS;
	print_message("49152 logits, top_k 40: %.3f ms per token\n", ms);
	assert_true(distinct > 10);
	assert_true(ms < 10.0);
	kvd_sampler_free(s);

	/* top-p alone on a flat distribution: the prefix grows to (nearly)
	 * everything; every id must still be reachable and valid */
	for (int i = 0; i < N; i++)
		l[i] = 0.0f;
	l[N - 1] = 0.5f;
	p = params(1.0f, 0, 0.999f, 0, 5);
	s = kvd_sampler_new(&p, N);
	memset(seen, 0, sizeof(seen));
	distinct = 0;
	for (int r = 0; r < 200; r++) {
		int32_t t = kvd_sampler_sample(s, l, NULL, 0);
		assert_true(t >= 0 && t < N);
		distinct += !seen[t];
		seen[t] = 1;
	}
	assert_true(distinct > 150);
	kvd_sampler_free(s);

	/* and top-p on a peaked one stays within the nucleus */
	x = 77;
	for (int i = 0; i < N; i++)
		l[i] = rand_logit(&x) * 2.0f;
	memcpy(sorted, l, N * sizeof(float));
	qsort(sorted, N, sizeof(float), cmp_desc);
	double z = 0, cum = 0;
	for (int i = 0; i < N; i++)
		z += exp(sorted[i] - sorted[0]);
	int nucleus = 0;
	while (cum < 0.9 * z)
		cum += exp(sorted[nucleus++] - sorted[0]);
	float last = sorted[nucleus]; /* one extra: sums may round differently */
	p = params(1.0f, 0, 0.9f, 0, 6);
	s = kvd_sampler_new(&p, N);
	for (int r = 0; r < 300; r++) {
		int32_t t = kvd_sampler_sample(s, l, NULL, 0);
		if (l[t] < last)
			fail_msg("token %d outside the %d-token nucleus", t, nucleus);
	}
	kvd_sampler_free(s);
	free(l);
	free(sorted);
}

/* ---- stop strings ---- */

/* Feeds the chunks; returns the concatenated output and whether a stop hit
 * (then later chunks are not fed). Flushes when no stop hit. */
static int feed_all(struct kvd_stop *st, const char *const *chunks, size_t n, char *out, size_t *ret_len)
{
	size_t total = 0;
	char buf[4096];
	for (size_t i = 0; i < n; i++) {
		int hit = -1;
		size_t len = strlen(chunks[i]);
		size_t w = kvd_stop_feed(st, chunks[i], len, buf, len + KVD_SAMPLER_MAX_STOP_LEN, &hit);
		assert_true(hit == 0 || hit == 1);
		memcpy(out + total, buf, w);
		total += w;
		if (hit) {
			out[total] = '\0';
			*ret_len = total;
			return 1;
		}
	}
	total += kvd_stop_flush(st, out + total, KVD_SAMPLER_MAX_STOP_LEN);
	out[total] = '\0';
	*ret_len = total;
	return 0;
}

static void test_stop_init_limits(void **state)
{
	(void)state;
	struct kvd_stop st;
	const char *nine[9] = { "a", "b", "c", "d", "e", "f", "g", "h", "i" };
	assert_int_equal(kvd_stop_init(&st, nine, 9), -E2BIG);
	assert_int_equal(kvd_stop_init(&st, nine, 8), 0);
	assert_int_equal(st.n, 8);

	char longest[KVD_SAMPLER_MAX_STOP_LEN + 2];
	memset(longest, 'x', sizeof(longest));
	longest[KVD_SAMPLER_MAX_STOP_LEN + 1] = '\0';
	const char *too_long[] = { "ok", longest };
	assert_int_equal(kvd_stop_init(&st, too_long, 2), -E2BIG);
	longest[KVD_SAMPLER_MAX_STOP_LEN] = '\0';
	assert_int_equal(kvd_stop_init(&st, too_long, 2), 0);
	assert_int_equal(st.len[1], KVD_SAMPLER_MAX_STOP_LEN);

	const char *empty[] = { "x", "" };
	st.n = 77;
	assert_int_equal(kvd_stop_init(&st, empty, 2), -EINVAL);
	assert_int_equal(st.n, 77); /* untouched on failure */
	const char *null_entry[] = { "x", NULL };
	assert_int_equal(kvd_stop_init(&st, null_entry, 2), -EINVAL);
	assert_int_equal(kvd_stop_init(&st, NULL, 1), -EINVAL);
	assert_int_equal(kvd_stop_init(&st, NULL, 0), 0);

	/* no stops: everything passes straight through, nothing held */
	char out[512];
	size_t len;
	const char *chunks[] = { "abc", "", "def" };
	assert_int_equal(feed_all(&st, chunks, 3, out, &len), 0);
	assert_string_equal(out, "abcdef");
}

static void test_stop_within_chunk(void **state)
{
	(void)state;
	struct kvd_stop st;
	const char *stops[] = { "</s>" };
	assert_int_equal(kvd_stop_init(&st, stops, 1), 0);
	char out[512];
	size_t len;
	const char *chunks[] = { "Hello</s>world" };
	assert_int_equal(feed_all(&st, chunks, 1, out, &len), 1);
	assert_string_equal(out, "Hello");
	/* at the very start */
	assert_int_equal(kvd_stop_init(&st, stops, 1), 0);
	const char *c2[] = { "</s>" };
	assert_int_equal(feed_all(&st, c2, 1, out, &len), 1);
	assert_int_equal(len, 0);
}

static void test_stop_across_chunks(void **state)
{
	(void)state;
	struct kvd_stop st;
	const char *stops[] = { "</s>" };
	char buf[512];
	int hit;
	assert_int_equal(kvd_stop_init(&st, stops, 1), 0);
	size_t w = kvd_stop_feed(&st, "Hello<", 6, buf, 6 + KVD_SAMPLER_MAX_STOP_LEN, &hit);
	assert_int_equal(hit, 0);
	assert_int_equal(w, 5);
	assert_memory_equal(buf, "Hello", 5);
	w = kvd_stop_feed(&st, "/s", 2, buf, 2 + KVD_SAMPLER_MAX_STOP_LEN, &hit);
	assert_int_equal(hit, 0);
	assert_int_equal(w, 0); /* "</s" held */
	assert_int_equal(st.n_tail, 3);
	w = kvd_stop_feed(&st, ">more", 5, buf, 5 + KVD_SAMPLER_MAX_STOP_LEN, &hit);
	assert_int_equal(hit, 1);
	assert_int_equal(w, 0);
	assert_int_equal(st.n_tail, 0);

	/* a held prefix that turns out not to be a stop is released */
	assert_int_equal(kvd_stop_init(&st, stops, 1), 0);
	char out[512];
	size_t len;
	const char *c2[] = { "a</", "b", "c" };
	assert_int_equal(feed_all(&st, c2, 3, out, &len), 0);
	assert_string_equal(out, "a</bc");
	/* a held prefix released by flush at the end */
	const char *hashes[] = { "###" };
	assert_int_equal(kvd_stop_init(&st, hashes, 1), 0);
	w = kvd_stop_feed(&st, "abc#", 4, buf, 4 + KVD_SAMPLER_MAX_STOP_LEN, &hit);
	assert_int_equal(w, 3);
	w = kvd_stop_feed(&st, "#", 1, buf, 1 + KVD_SAMPLER_MAX_STOP_LEN, &hit);
	assert_int_equal(w, 0);
	assert_int_equal(hit, 0);
	w = kvd_stop_flush(&st, buf, KVD_SAMPLER_MAX_STOP_LEN);
	assert_int_equal(w, 2);
	assert_memory_equal(buf, "##", 2);
	assert_int_equal(kvd_stop_flush(&st, buf, KVD_SAMPLER_MAX_STOP_LEN), 0);

	/* overlapping self-prefixes: "aab" in "aaab" byte by byte */
	const char *aab[] = { "aab" };
	assert_int_equal(kvd_stop_init(&st, aab, 1), 0);
	const char *c3[] = { "a", "a", "a", "b", "zzz" };
	assert_int_equal(feed_all(&st, c3, 5, out, &len), 1);
	assert_string_equal(out, "a");

	/* a 256-byte stop fed 7 bytes at a time after some text */
	char big[KVD_SAMPLER_MAX_STOP_LEN + 1], text[600];
	for (int i = 0; i < KVD_SAMPLER_MAX_STOP_LEN; i++)
		big[i] = (char)('a' + i % 26);
	big[KVD_SAMPLER_MAX_STOP_LEN] = '\0';
	const char *bigs[] = { big };
	assert_int_equal(kvd_stop_init(&st, bigs, 1), 0);
	snprintf(text, sizeof(text), "prefix-%s-suffix", big);
	size_t total = 0, tl = strlen(text);
	hit = 0;
	for (size_t off = 0; off < tl && !hit; off += 7) {
		size_t n = tl - off < 7 ? tl - off : 7;
		total += kvd_stop_feed(&st, text + off, n, out + total, n + KVD_SAMPLER_MAX_STOP_LEN, &hit);
	}
	assert_int_equal(hit, 1);
	assert_int_equal(total, 7);
	assert_memory_equal(out, "prefix-", 7);
}

static void test_stop_multiple(void **state)
{
	(void)state;
	struct kvd_stop st;
	char out[512];
	size_t len;
	const char *stops[] = { "STOP", "\n\n", "<|im_end|>" };
	assert_int_equal(kvd_stop_init(&st, stops, 3), 0);
	const char *c1[] = { "x\n", "\ny STOP" };
	assert_int_equal(feed_all(&st, c1, 2, out, &len), 1);
	assert_string_equal(out, "x");

	assert_int_equal(kvd_stop_init(&st, stops, 3), 0);
	const char *c2[] = { "answer<|im", "_end", "|>\n\n" };
	assert_int_equal(feed_all(&st, c2, 3, out, &len), 1);
	assert_string_equal(out, "answer");

	/* the stop that completes first wins, as if fed byte by byte */
	const char *s2[] = { "abcd", "c" };
	assert_int_equal(kvd_stop_init(&st, s2, 2), 0);
	const char *c3[] = { "xabcd" };
	assert_int_equal(feed_all(&st, c3, 1, out, &len), 1);
	assert_string_equal(out, "xab");
	/* completing together: the one that started first */
	const char *s3[] = { "b", "ab" };
	assert_int_equal(kvd_stop_init(&st, s3, 2), 0);
	const char *c4[] = { "xab" };
	assert_int_equal(feed_all(&st, c4, 1, out, &len), 1);
	assert_string_equal(out, "x");
	/* binary-safe text: NUL bytes pass */
	const char *s4[] = { "END" };
	assert_int_equal(kvd_stop_init(&st, s4, 1), 0);
	char buf[512];
	int hit;
	size_t w = kvd_stop_feed(&st, "a\0bEN", 5, buf, 5 + KVD_SAMPLER_MAX_STOP_LEN, &hit);
	assert_int_equal(w, 3);
	assert_memory_equal(buf, "a\0b", 3);
	w = kvd_stop_feed(&st, "D", 1, buf, 1 + KVD_SAMPLER_MAX_STOP_LEN, NULL);
	assert_int_equal(w, 0);
}

/* Random texts, stops and chunkings over a 3-letter alphabet: output and
 * hit never depend on the chunking, and match a direct search for the
 * earliest-ending stop. */
static void test_stop_chunking_invariant(void **state)
{
	(void)state;
	uint64_t x = 2718;
	for (int round = 0; round < 2000; round++) {
		char stops_buf[4][8], text[64];
		const char *stops[4];
		size_t n_stops = 1 + lcg(&x) % 4;
		for (size_t i = 0; i < n_stops; i++) {
			size_t len = 1 + lcg(&x) % 5;
			for (size_t j = 0; j < len; j++)
				stops_buf[i][j] = (char)('a' + lcg(&x) % 3);
			stops_buf[i][len] = '\0';
			stops[i] = stops_buf[i];
		}
		size_t tl = lcg(&x) % 40;
		for (size_t j = 0; j < tl; j++)
			text[j] = (char)('a' + lcg(&x) % 3);
		text[tl] = '\0';

		/* reference: for each end position, the earliest-ending match */
		size_t ref_len = tl;
		int ref_hit = 0;
		for (size_t end = 1; end <= tl && !ref_hit; end++) {
			for (size_t start = 0; start < end; start++) {
				for (size_t i = 0; i < n_stops; i++) {
					size_t sl = strlen(stops[i]);
					if (end - start == sl && memcmp(text + start, stops[i], sl) == 0) {
						ref_hit = 1;
						ref_len = start;
						break;
					}
				}
				if (ref_hit)
					break;
			}
		}

		for (int mode = 0; mode < 3; mode++) {
			struct kvd_stop st;
			assert_int_equal(kvd_stop_init(&st, stops, n_stops), 0);
			char out[512], buf[512];
			size_t total = 0, off = 0;
			int hit = 0;
			while (off < tl && !hit) {
				size_t n = mode == 0 ? tl : mode == 1 ? 1 : 1 + lcg(&x) % 6;
				if (n > tl - off)
					n = tl - off;
				size_t w = kvd_stop_feed(&st, text + off, n, buf, n + KVD_SAMPLER_MAX_STOP_LEN, &hit);
				memcpy(out + total, buf, w);
				total += w;
				off += n;
			}
			if (!hit)
				total += kvd_stop_flush(&st, out + total, KVD_SAMPLER_MAX_STOP_LEN);
			if (hit != ref_hit || total != ref_len || memcmp(out, text, total) != 0)
				fail_msg("round %d mode %d: text '%s' stops %zu ('%s'...): got hit %d len %zu, "
					 "expected hit %d len %zu", round, mode, text, n_stops, stops[0],
					 hit, total, ref_hit, ref_len);
		}
	}
}

/* Log-probabilities: log-softmax in double, NaN as -inf, top-n in the
 * sampler's order (ties by lower id), bounds. */
static void test_logprobs(void **state)
{
	(void)state;
	float l[6] = { 1.0f, 3.0f, NAN, 3.0f, -INFINITY, 0.5f };
	struct kvd_logprobs lp;
	double z = exp(1.0) + 2 * exp(3.0) + exp(0.5);

	assert_int_equal(kvd_logprobs_compute(l, 6, 5, 4, &lp), 0);
	assert_int_equal(lp.token, 5);
	assert_float_equal(lp.logprob, 0.5 - log(z), 1e-6);
	assert_int_equal(lp.n_top, 4);
	assert_int_equal(lp.top_id[0], 1); /* tie with 3: lower id first */
	assert_int_equal(lp.top_id[1], 3);
	assert_int_equal(lp.top_id[2], 0);
	assert_int_equal(lp.top_id[3], 5);
	assert_float_equal(lp.top_logprob[0], 3.0 - log(z), 1e-6);
	assert_float_equal(lp.top_logprob[2], 1.0 - log(z), 1e-6);
	assert_int_equal(kvd_logprobs_compute(l, 6, 2, 0, &lp), 0);
	assert_true(isinf(lp.logprob) && lp.logprob < 0); /* NaN counts as -inf */
	assert_int_equal(kvd_logprobs_compute(l, 6, 4, 6, &lp), 0);
	assert_true(isinf(lp.top_logprob[5]) && lp.top_logprob[5] < 0);
	/* a large vocabulary: each log-probability is the logit minus the
	 * log-sum-exp computed here in double (so the probabilities add up to
	 * one), checked on every 37th token; top-20 sorted */
	enum { V = 50000 };
	static float big[V];
	uint64_t x = 1;
	for (int i = 0; i < V; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		big[i] = (float)((x >> 40) % 20000) / 1000.0f - 10.0f;
	}
	double zmax = -INFINITY, zsum = 0;
	for (int i = 0; i < V; i++)
		zmax = big[i] > zmax ? big[i] : zmax;
	for (int i = 0; i < V; i++)
		zsum += exp(big[i] - zmax);
	double lse = zmax + log(zsum);
	for (int i = 0; i < V; i += i == 0 ? 1 : 37) {
		assert_int_equal(kvd_logprobs_compute(big, V, i, i == 0 ? KVD_LOGPROBS_MAX_TOP : 0, &lp), 0);
		assert_float_equal(lp.logprob, big[i] - lse, 1e-4);
		if (i == 0)
			for (int k = 1; k < KVD_LOGPROBS_MAX_TOP; k++)
				assert_true(big[lp.top_id[k - 1]] > big[lp.top_id[k]] ||
					    (big[lp.top_id[k - 1]] == big[lp.top_id[k]] && lp.top_id[k - 1] < lp.top_id[k]));
	}
	/* bounds */
	assert_int_equal(kvd_logprobs_compute(l, 6, 6, 0, &lp), -EINVAL);
	assert_int_equal(kvd_logprobs_compute(l, 6, -1, 0, &lp), -EINVAL);
	assert_int_equal(kvd_logprobs_compute(l, 6, 0, 7, &lp), -EINVAL);
	assert_int_equal(kvd_logprobs_compute(big, V, 0, KVD_LOGPROBS_MAX_TOP + 1, &lp), -EINVAL);
	/* the samples' seeds: sample 0 keeps the seed, the others all differ */
	assert_int_equal(kvd_sample_seed(77, 0), 77);
	for (uint32_t i = 1; i < 16; i++) {
		assert_true(kvd_sample_seed(77, i) != 77);
		for (uint32_t j = 1; j < i; j++)
			assert_true(kvd_sample_seed(77, i) != kvd_sample_seed(77, j));
	}
	/* SplitMix64's first output for state 0 is 0xe220a8397b1dcdaf: the rule
	 * "output function of seed + i * 0x9e3779b97f4a7c15" for seed 0, i 1 */
	assert_true(kvd_sample_seed(0, 1) == 0xe220a8397b1dcdafull);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_params),
		cmocka_unit_test(test_logprobs),
		cmocka_unit_test(test_greedy_argmax_ties_lowest),
		cmocka_unit_test(test_logits_not_modified),
		cmocka_unit_test(test_seed_determinism),
		cmocka_unit_test(test_top_k_1_is_greedy),
		cmocka_unit_test(test_tiny_top_p_is_greedy),
		cmocka_unit_test(test_distribution_temperature_1),
		cmocka_unit_test(test_distribution_temperature_scales),
		cmocka_unit_test(test_top_k_keeps_k),
		cmocka_unit_test(test_top_p_keeps_prefix),
		cmocka_unit_test(test_min_p_filters),
		cmocka_unit_test(test_repetition_penalty),
		cmocka_unit_test(test_large_vocab_top_k),
		cmocka_unit_test(test_stop_init_limits),
		cmocka_unit_test(test_stop_within_chunk),
		cmocka_unit_test(test_stop_across_chunks),
		cmocka_unit_test(test_stop_multiple),
		cmocka_unit_test(test_stop_chunking_invariant),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
