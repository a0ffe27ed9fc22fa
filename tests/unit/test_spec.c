/*
 * tests/unit/test_spec.c — the prompt-lookup drafter of speculative
 * decoding (daemon/spec.h): what it proposes after a sequence's tokens,
 * the most recent match first, never past the tokens it has, nothing
 * without a match or beyond its look-back; the draft length each sequence
 * learns from its acceptance, its back-off and probing again; the fit of
 * what a draft token costs and the threshold made from it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include <cmocka.h>

#include "daemon/spec.h"

static void expect_draft(const int32_t *toks, uint32_t n, uint32_t min_match, uint32_t max_draft, const int32_t *want,
			 uint32_t n_want)
{
	int32_t d[KVD_SPEC_MAX_DRAFT + 1];

	memset(d, 0x7f, sizeof(d));
	assert_int_equal(kvd_spec_draft(toks, n, min_match, max_draft, d), n_want);
	for (uint32_t i = 0; i < n_want; i++)
		assert_int_equal(d[i], want[i]);
	assert_int_equal(d[n_want], 0x7f7f7f7f); /* nothing written past it */
}

static void test_copies_what_followed_the_match(void **state)
{
	static const int32_t t[] = { 1, 2, 3, 4, 5, 6, 1, 2, 3 };
	static const int32_t w[] = { 4, 5, 6, 1 };

	(void)state;
	expect_draft(t, 9, 3, 4, w, 4);
	expect_draft(t, 9, 3, 16, (const int32_t[]){ 4, 5, 6, 1, 2, 3 }, 6); /* up to the end */
	expect_draft(t, 9, 2, 1, w, 1);
}

static void test_most_recent_match_wins(void **state)
{
	static const int32_t t[] = { 1, 2, 3, 7, 8, 1, 2, 3, 9, 1, 2, 3 };

	(void)state;
	expect_draft(t, 12, 3, 4, (const int32_t[]){ 9, 1, 2, 3 }, 4);
	/* a longer key only matches the older place */
	static const int32_t u[] = { 5, 1, 2, 3, 7, 8, 6, 1, 2, 3, 9, 5, 1, 2, 3 };
	expect_draft(u, 15, 4, 2, (const int32_t[]){ 7, 8 }, 2);
}

static void test_never_past_the_end(void **state)
{
	static const int32_t t[] = { 5, 5, 5, 5 };

	(void)state;
	expect_draft(t, 4, 3, 8, (const int32_t[]){ 5 }, 1);
	expect_draft(t, 4, 2, 8, (const int32_t[]){ 5 }, 1); /* i = 1: from = 3, the last token */
}

static void test_nothing_without_a_match(void **state)
{
	static const int32_t t[] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	int32_t d[4];

	(void)state;
	assert_int_equal(kvd_spec_draft(t, 8, 3, 4, d), 0);
	assert_int_equal(kvd_spec_draft(t, 3, 3, 4, d), 0); /* the key is everything */
	assert_int_equal(kvd_spec_draft(t, 8, 0, 4, d), 0);
	assert_int_equal(kvd_spec_draft(t, 8, 3, 0, d), 0);
	assert_int_equal(kvd_spec_draft(t, 0, 1, 4, d), 0);
}

static void test_lookback_bound(void **state)
{
	uint32_t n = KVD_SPEC_LOOKBACK + 64;
	int32_t *t = malloc(n * sizeof(*t)), d[4];

	(void)state;
	assert_non_null(t);
	for (uint32_t i = 0; i < n; i++)
		t[i] = 1000 + (int32_t)i; /* all distinct ... */
	t[0] = 1, t[1] = 2, t[2] = 3, t[3] = 4; /* ... but one old match */
	t[n - 3] = 1, t[n - 2] = 2, t[n - 1] = 3;
	assert_int_equal(kvd_spec_draft(t, n, 3, 4, d), 0);
	/* within the look-back it is found */
	t[100] = 1, t[101] = 2, t[102] = 3, t[103] = 4;
	assert_int_equal(kvd_spec_draft(t, n, 3, 4, d), 4);
	assert_int_equal(d[0], 4);
	free(t);
}

/* A fresh sequence drafts as its prior says (p = 0.5: the longest i with
 * 0.5^i > 0.1 is 3); acceptance lengthens its drafts to the full length,
 * rejections shorten them (never below 1). */
static void test_length_follows_acceptance(void **state)
{
	struct kvd_spec_seq q = { 0 };

	(void)state;
	assert_int_equal(kvd_spec_next_len(&q, 8, 0.1), 3);
	uint32_t prev = 3, steps = 0;
	while (kvd_spec_next_len(&q, 8, 0.1) < 8) { /* all accepted: longer each time */
		uint32_t k = kvd_spec_next_len(&q, 8, 0.1);
		assert_true(k >= prev);
		kvd_spec_learn(&q, k, k);
		prev = k;
		assert_true(++steps < 6);
	}
	q = (struct kvd_spec_seq){ 0 };
	for (int i = 0; i < 20; i++)
		kvd_spec_learn(&q, 8, 8);
	assert_int_equal(kvd_spec_next_len(&q, 8, 0.1), 8);
	float m0 = q.miss;
	kvd_spec_learn(&q, 8, 2); /* 6 of 8 rejected */
	uint32_t k1 = kvd_spec_next_len(&q, 8, 0.3);
	assert_true(k1 >= 1 && k1 < 8);
	/* p = 1 - (m0 + 0.3 * (0.75 - m0)): the longest i with p^i > 0.3 */
	assert_int_equal(k1, (uint32_t)floor(log(0.3) / log(1.0 - (m0 + 0.3 * (0.75 - m0)))));
	kvd_spec_learn(&q, k1, 0);
	kvd_spec_learn(&q, k1, 0);
	uint32_t k2 = kvd_spec_next_len(&q, 8, 0.3);
	assert_true(k2 >= 1 && k2 < k1);
	for (int i = 0; i < 20; i++)
		kvd_spec_learn(&q, 8, 8);
	assert_int_equal(kvd_spec_next_len(&q, 8, 0.1), 8);
	/* a higher threshold (a wider batch) drafts shorter; >= 1: nothing */
	kvd_spec_learn(&q, 8, 4);
	assert_true(kvd_spec_next_len(&q, 8, 0.6) < kvd_spec_next_len(&q, 8, 0.1));
	assert_int_equal(kvd_spec_next_len(&q, 8, 1.0), 0);
	assert_int_equal(kvd_spec_next_len(&q, 0, 0.1), 0);
}

/* KVD_SPEC_MISSES verify steps accepting nothing pause drafting for
 * KVD_SPEC_PAUSE_MIN decodes, the next pause is twice as long (up to
 * KVD_SPEC_PAUSE_MAX), and any accepted token ends the back-off. */
static void test_backs_off_and_probes_again(void **state)
{
	struct kvd_spec_seq q = { 0 };
	uint32_t pause = KVD_SPEC_PAUSE_MIN;

	(void)state;
	for (int round = 0; round < 8; round++) {
		for (uint32_t i = 0; i < KVD_SPEC_MISSES; i++) {
			uint32_t k = kvd_spec_next_len(&q, 8, 0.1);
			assert_true(k >= 1); /* probing: a short draft, never none */
			kvd_spec_learn(&q, k, 0);
		}
		for (uint32_t i = 0; i < pause; i++)
			assert_int_equal(kvd_spec_next_len(&q, 8, 0.1), 0);
		assert_true(kvd_spec_next_len(&q, 8, 0.1) >= 1); /* probes again */
		pause = pause * 2 > KVD_SPEC_PAUSE_MAX ? KVD_SPEC_PAUSE_MAX : pause * 2;
	}
	assert_int_equal(pause, KVD_SPEC_PAUSE_MAX);
	kvd_spec_learn(&q, 1, 1); /* accepted: the back-off starts over */
	for (uint32_t i = 0; i < KVD_SPEC_MISSES; i++)
		kvd_spec_learn(&q, 1, 0);
	for (uint32_t i = 0; i < KVD_SPEC_PAUSE_MIN; i++)
		assert_int_equal(kvd_spec_next_len(&q, 8, 0.1), 0);
	assert_true(kvd_spec_next_len(&q, 8, 0.1) >= 1);
}

/* Steps timed as 10 ms + 0.5 ms per draft token: the fit finds both, and
 * the threshold is B * 0.5 / 10; before enough drafting steps it is
 * lookup's constant. */
static void test_cost_fit_and_threshold(void **state)
{
	struct kvd_spec_cost c = { 0 };

	(void)state;
	assert_true(kvd_spec_threshold(&c, 1) == KVD_SPEC_LOOKUP_THRESHOLD);
	for (uint32_t i = 0; i < 40; i++) {
		uint32_t d = (i * 7) % 9;
		kvd_spec_cost_step(&c, d, 10000000u + 500000u * d);
	}
	assert_true(fabs(c.plain_ns - 1e7) < 1e3);
	assert_true(fabs(c.draft_ns - 5e5) < 1e2);
	assert_true(fabs(kvd_spec_threshold(&c, 1) - 0.05) < 1e-4);
	assert_true(fabs(kvd_spec_threshold(&c, 32) - 1.6) < 1e-3); /* a wide batch: no drafts pay */
	struct kvd_spec_seq q = { 0 };
	assert_int_equal(kvd_spec_next_len(&q, 8, kvd_spec_threshold(&c, 32)), 0);
}

/* Steps slowed by other load make the fit decline every draft, so no step
 * drafts and the fit would never change: after KVD_SPEC_REPROBE_STEPS
 * plain steps it asks to be measured again; forgotten, it is lookup's
 * threshold until KVD_SPEC_COST_MIN_STEPS drafting steps at the usual cost
 * bring it back to what drafting pays at. A fit that declines again waits
 * twice as long, up to KVD_SPEC_REPROBE_MAX; one that drafts, the least. */
static void busy_steps(struct kvd_spec_cost *c, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) { /* drafts cost 20 ms each */
		uint32_t d = 1 + i % 4;
		kvd_spec_cost_step(c, d, 10000000u + 20000000u * d);
	}
}

static void test_cost_reprobe(void **state)
{
	struct kvd_spec_cost c = { 0 };

	(void)state;
	for (uint32_t i = 0; i < 40; i++) {
		uint32_t d = (i * 7) % 9;
		kvd_spec_cost_step(&c, d, 10000000u + 500000u * d);
	}
	assert_false(kvd_spec_cost_reprobe(&c));
	busy_steps(&c, 200);
	assert_true(kvd_spec_threshold(&c, 1) >= 1.0);
	for (uint32_t i = 0; i + 1 < KVD_SPEC_REPROBE_STEPS; i++) {
		kvd_spec_cost_step(&c, 0, 10000000u);
		assert_false(kvd_spec_cost_reprobe(&c));
	}
	kvd_spec_cost_step(&c, 0, 10000000u);
	assert_true(kvd_spec_cost_reprobe(&c));
	kvd_spec_cost_forget(&c);
	assert_true(c.relearning);
	assert_false(kvd_spec_cost_reprobe(&c));
	assert_true(kvd_spec_threshold(&c, 1) == KVD_SPEC_LOOKUP_THRESHOLD);
	for (uint32_t i = 0; i < KVD_SPEC_COST_MIN_STEPS; i++) {
		uint32_t d = 1 + i % KVD_SPEC_REPROBE_TOKENS;
		kvd_spec_cost_step(&c, 0, 10000000u);
		kvd_spec_cost_step(&c, d, 10000000u + 500000u * d);
	}
	assert_false(c.relearning);
	assert_true(fabs(kvd_spec_threshold(&c, 1) - 0.05) < 1e-3);

	/* re-measured as still too dear: the next re-probe is twice as far */
	busy_steps(&c, 200);
	for (uint32_t i = 0; i < KVD_SPEC_REPROBE_STEPS; i++)
		kvd_spec_cost_step(&c, 0, 10000000u);
	kvd_spec_cost_forget(&c);
	busy_steps(&c, KVD_SPEC_COST_MIN_STEPS);
	assert_true(kvd_spec_threshold(&c, 1) >= 1.0);
	for (uint32_t i = 0; i < 2 * KVD_SPEC_REPROBE_STEPS; i++) {
		assert_false(kvd_spec_cost_reprobe(&c));
		kvd_spec_cost_step(&c, 0, 10000000u);
	}
	assert_true(kvd_spec_cost_reprobe(&c));
	for (uint32_t i = 0; i < 8; i++)
		kvd_spec_cost_forget(&c);
	assert_int_equal(c.reprobe_after, KVD_SPEC_REPROBE_MAX);
}

static void test_run_buckets(void **state)
{
	static const unsigned want[17] = { 0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4 };

	(void)state;
	for (uint32_t i = 0; i <= KVD_SPEC_MAX_DRAFT; i++)
		assert_int_equal(kvd_spec_run_bucket(i), want[i]);
}

/* [speculative] mode names round-trip, draft included; others are refused */
static void test_mode_names(void **state)
{
	(void)state;
	static const char *const names[] = { "off", "lookup", "auto", "draft" };
	for (unsigned i = 0; i < 4; i++) {
		enum kvd_spec_mode m = KVD_SPEC_OFF;
		assert_int_equal(kvd_spec_mode_parse(names[i], &m), 0);
		assert_int_equal((int)m, (int)i);
		assert_string_equal(kvd_spec_mode_name(m), names[i]);
	}
	enum kvd_spec_mode m = KVD_SPEC_LOOKUP;
	assert_int_equal(kvd_spec_mode_parse("Draft", &m), -EINVAL);
	assert_int_equal(kvd_spec_mode_parse("", &m), -EINVAL);
	assert_int_equal(kvd_spec_mode_parse(NULL, &m), -EINVAL);
	assert_int_equal((int)m, (int)KVD_SPEC_LOOKUP); /* untouched on failure */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copies_what_followed_the_match),
		cmocka_unit_test(test_most_recent_match_wins),
		cmocka_unit_test(test_never_past_the_end),
		cmocka_unit_test(test_nothing_without_a_match),
		cmocka_unit_test(test_lookback_bound),
		cmocka_unit_test(test_length_follows_acceptance),
		cmocka_unit_test(test_backs_off_and_probes_again),
		cmocka_unit_test(test_cost_fit_and_threshold),
		cmocka_unit_test(test_cost_reprobe),
		cmocka_unit_test(test_run_buckets),
		cmocka_unit_test(test_mode_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
