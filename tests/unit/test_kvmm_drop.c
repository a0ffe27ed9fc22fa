/*
 * tests/unit/test_kvmm_drop.c — kvmm_seq_drop_pages, the page removal under
 * the context-window policies: the sequence shrinks by whole pages from
 * inside, the pages after them move down and become private (copied when
 * shared with another sequence or known to the prefix index), the dropped
 * pages lose a reference, the sequence is never published again, and
 * every invariant (kvmm_check) holds. Page content is tracked through a
 * host pool: each token slot holds a pattern of its token id.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvmm.h"

#define BS 4
#define TB 8

static struct kvmm *make(uint32_t n_pages, int prefix)
{
	struct kvmm_config c = {
		.page_bytes = (size_t)BS * TB,
		.block_size = BS,
		.pool_bytes = (uint64_t)n_pages * BS * TB,
		.max_seqs = 8,
		.prefix_cache = prefix,
	};
	struct kvmm *m = NULL;

	assert_int_equal(kvmm_create(&c, &m), 0);
	return m;
}

static void check(const struct kvmm *m)
{
	char why[256];
	int r = kvmm_check(m, why, sizeof(why));
	if (r)
		fail_msg("kvmm_check: %s", why);
}

/* Append tokens[0..n) and write each slot's content (the token id). */
static void grow(struct kvmm *m, uint32_t seq, const int32_t *toks, uint32_t n)
{
	struct kvmm_grow g = {seq, n, toks};
	uint32_t len = kvmm_seq_len(m, seq), np;

	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	const int32_t *pages = kvmm_seq_pages(m, seq, &np);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = len + i;
		uint64_t *slot = (uint64_t *)((char *)kvmm_pool_base(m) + (size_t)pages[pos / BS] * BS * TB) + pos % BS;
		*slot = (uint64_t)toks[i] * 1000003u;
	}
	assert_int_equal(kvmm_seq_publish(m, seq), 0);
}

/* The token ids the sequence's slots hold, in order. */
static void content(const struct kvmm *m, uint32_t seq, int32_t *out)
{
	uint32_t np, len = kvmm_seq_len(m, seq);
	const int32_t *pages = kvmm_seq_pages(m, seq, &np);
	for (uint32_t pos = 0; pos < len; pos++) {
		const uint64_t *slot =
			(const uint64_t *)((const char *)kvmm_pool_base(m) + (size_t)pages[pos / BS] * BS * TB) + pos % BS;
		out[pos] = (int32_t)(*slot / 1000003u);
	}
}

static void test_drop_private(void **state)
{
	(void)state;
	struct kvmm *m = make(16, 0);
	uint32_t s;
	int32_t toks[22], got[22];
	struct kvmm_stats st;
	struct kvmm_seq_record rec;

	for (int i = 0; i < 22; i++)
		toks[i] = 100 + i;
	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, toks, 22); /* 6 pages, the last holding 2 */
	assert_int_equal(kvmm_seq_drop_pages(m, s, 1, 2), 0);
	check(m);
	assert_int_equal(kvmm_seq_len(m, s), 14);
	content(m, s, got);
	for (int i = 0; i < 4; i++)
		assert_int_equal(got[i], toks[i]);      /* the first page stays */
	for (int i = 4; i < 14; i++)
		assert_int_equal(got[i], toks[i + 8]);  /* the rest moved down 8 */
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_used, 4);
	assert_int_equal(st.pages_free, 12);
	assert_int_equal(st.tokens_resident, 14);
	assert_int_equal(kvmm_seq_ledger(m, s, &rec), 0);
	assert_int_equal(rec.dropped_tokens, 8);
	assert_int_equal(rec.drops, 1);
	assert_int_equal(rec.cow_copies, 0); /* private pages are not copied */
	/* growing on continues in the moved last page */
	grow(m, s, toks, 3);
	check(m);
	assert_int_equal(kvmm_seq_len(m, s), 17);
	assert_int_equal(kvmm_seq_finish(m, s, &rec), 0);
	assert_int_equal(rec.prompt_tokens + rec.generated_tokens, 25); /* everything it saw */
	kvmm_destroy(m);
}

static void test_drop_shared_and_indexed(void **state)
{
	(void)state;
	struct kvmm *m = make(24, 1);
	uint32_t a, b, c;
	int32_t toks[16], got[16];
	struct kvmm_stats st;

	for (int i = 0; i < 16; i++)
		toks[i] = 7 * i + 1;
	assert_int_equal(kvmm_seq_new(m, &a), 0);
	grow(m, a, toks, 14); /* 3 full pages indexed, one partial */
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	uint32_t np;
	const int32_t *pa = kvmm_seq_pages(m, a, &np);
	int32_t first_page = pa[0], dropped = pa[1], moved2 = pa[2];
	assert_int_equal(kvmm_seq_drop_pages(m, a, 1, 1), 0);
	check(m);
	pa = kvmm_seq_pages(m, a, &np);
	assert_int_equal(np, 3);
	assert_int_equal(pa[0], first_page);       /* untouched, still shared */
	assert_true(pa[1] != moved2);              /* copied: b sees the original */
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)first_page), 2);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)dropped), 1); /* b's only */
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pa[1]), 1);
	assert_int_equal(kvmm_page_state(m, (uint32_t)pa[1]) & KVMM_PAGE_INDEXED, 0);
	content(m, a, got);
	for (int i = 0; i < 4; i++)
		assert_int_equal(got[i], toks[i]);
	for (int i = 4; i < 10; i++)
		assert_int_equal(got[i], toks[i + 4]);
	content(m, b, got);                         /* the fork is unchanged */
	for (int i = 0; i < 14; i++)
		assert_int_equal(got[i], toks[i]);
	/* a is never published again: filling its last page adds no index entry */
	kvmm_get_stats(m, &st);
	uint32_t cached_before = st.pages_cached;
	grow(m, a, toks, 2);
	check(m);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, cached_before);
	/* and a new request with b's prefix still finds the original pages */
	assert_int_equal(kvmm_seq_new(m, &c), 0);
	uint32_t hit = 0;
	assert_int_equal(kvmm_prefix_attach(m, c, toks, 14, &hit), 0);
	assert_int_equal(hit, 12);
	check(m);
	kvmm_destroy(m);
}

static void test_drop_refusals(void **state)
{
	(void)state;
	struct kvmm *m = make(7, 1);
	uint32_t a, b;
	int32_t toks[24];

	for (int i = 0; i < 24; i++)
		toks[i] = i + 3;
	assert_int_equal(kvmm_seq_new(m, &a), 0);
	grow(m, a, toks, 10);
	assert_int_equal(kvmm_seq_drop_pages(m, a, 1, 0), -EINVAL);
	assert_int_equal(kvmm_seq_drop_pages(m, a, 2, 1), -EINVAL); /* the partial last page */
	assert_int_equal(kvmm_seq_drop_pages(m, a, 0, 4), -EINVAL);
	assert_int_equal(kvmm_seq_drop_pages(m, 7, 0, 1), -ENOENT);
	/* a fork shares everything: dropping page 0 of a needs copies of pages
	 * 1 and 2, but dropping frees nothing (b keeps page 0) and only 4 pages
	 * are left: fits. Fill the pool first so it does not. */
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	uint32_t c;
	assert_int_equal(kvmm_seq_new(m, &c), 0);
	grow(m, c, toks + 10, 13); /* 4 pages: the pool is full */
	assert_int_equal(kvmm_available_pages(m), 0);
	uint32_t len = kvmm_seq_len(m, a);
	assert_int_equal(kvmm_seq_drop_pages(m, a, 0, 1), -ENOMEM);
	assert_int_equal(kvmm_seq_len(m, a), len);
	check(m);
	/* once b is gone, a's pages are its own: page 1, indexed, leaves the
	 * index instead of being copied, so no free page is needed */
	assert_int_equal(kvmm_seq_free(m, b), 0);
	assert_int_equal(kvmm_available_pages(m), 0);
	struct kvmm_seq_record rec;
	assert_int_equal(kvmm_seq_ledger(m, a, &rec), 0);
	uint32_t cows = rec.cow_copies;
	uint32_t np;
	int32_t p1 = kvmm_seq_pages(m, a, &np)[1];
	assert_true(kvmm_page_state(m, (uint32_t)p1) & KVMM_PAGE_INDEXED);
	assert_int_equal(kvmm_seq_drop_pages(m, a, 0, 1), 0);
	assert_int_equal(kvmm_seq_len(m, a), len - BS);
	assert_int_equal(kvmm_seq_pages(m, a, &np)[0], p1);
	assert_int_equal(kvmm_page_state(m, (uint32_t)p1) & KVMM_PAGE_INDEXED, 0);
	assert_int_equal(kvmm_seq_ledger(m, a, &rec), 0);
	assert_int_equal(rec.cow_copies, cows);
	check(m);
	kvmm_destroy(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_drop_private),
		cmocka_unit_test(test_drop_shared_and_indexed),
		cmocka_unit_test(test_drop_refusals),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
