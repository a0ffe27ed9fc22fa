/*
 * tests/unit/test_spec.c — the prompt-lookup drafter of speculative
 * decoding (daemon/spec.h): what it proposes after a sequence's tokens,
 * the most recent match first, never past the tokens it has, nothing
 * without a match or beyond its look-back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copies_what_followed_the_match),
		cmocka_unit_test(test_most_recent_match_wins),
		cmocka_unit_test(test_never_past_the_end),
		cmocka_unit_test(test_nothing_without_a_match),
		cmocka_unit_test(test_lookback_bound),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
