/*
 * tests/unit/test_kvmm_release.c — kvmm_seq_release, the release of pages
 * a sequence's windowed layers are done with: the kept share of released
 * pages lands in packed pages (pack_slots per page) or nowhere
 * (KVMM_PACK_NONE), pages are freed or stay cached for the prefix index,
 * forks share packed pages and copy them before writing, swap carries
 * them, and every invariant (kvmm_check) holds throughout.
 *
 * The pages model a three-layer model: layers 0 and 1 windowed, layer 2
 * global. A page is L regions of BS token slots of 8 bytes; slot (layer l,
 * position p) holds p * 1000003 + l. The pack callback copies region 2
 * of the source into region `slot` of the packed page, so that position
 * p's global K/V is found at packed page (head of its group), region p's
 * page index % 3.
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
#define L 3
#define REGION ((size_t)BS * TB)
#define PAGE (L * REGION)
#define K 3 /* pack slots: one global layer of three */

static int n_packs;

static uint64_t *slot_at(struct kvmm *m, int32_t page, uint32_t region, uint32_t t)
{
	return (uint64_t *)((char *)kvmm_pool_base(m) + (size_t)page * PAGE + region * REGION) + t;
}

static int pack(void *ud, uint32_t dst, uint32_t slot, uint32_t src)
{
	struct kvmm *m = *(struct kvmm **)ud;

	memcpy(slot_at(m, (int32_t)dst, slot, 0), slot_at(m, (int32_t)src, 2, 0), REGION);
	n_packs++;
	return 0;
}

static struct kvmm *mref; /* the pack callback's view of the pool under test */

static struct kvmm *make_io(uint32_t n_pages, int prefix, uint32_t pack_slots, uint32_t n_slots)
{
	struct kvmm_config c = {
		.page_bytes = PAGE,
		.block_size = BS,
		.pool_bytes = (uint64_t)n_pages * PAGE,
		.max_seqs = 8,
		.prefix_cache = prefix,
		.pack_slots = pack_slots,
		.page_ops = {.pack = pack, .ud = &mref},
	};
	struct kvmm_swap_io *mem = NULL;

	n_packs = 0;
	if (n_slots)
		assert_int_equal(kvmm_swap_io_mem_new((uint64_t)n_slots * PAGE, &mem), 0);
	assert_int_equal(kvmm_create_with_io(&c, mem, &mref), 0);
	return mref;
}

static struct kvmm *make(uint32_t n_pages, int prefix, uint32_t pack_slots)
{
	return make_io(n_pages, prefix, pack_slots, 0);
}

static void check(const struct kvmm *m)
{
	char why[256] = "";
	if (kvmm_check(m, why, sizeof(why)))
		fail_msg("kvmm_check: %s", why);
}

/* Append n tokens (ids base + position) and write every layer's slots. */
static void grow(struct kvmm *m, uint32_t seq, uint32_t n)
{
	uint32_t len = kvmm_seq_len(m, seq), np;
	int32_t toks[256];

	assert_true(n <= 256);
	for (uint32_t i = 0; i < n; i++)
		toks[i] = (int32_t)(100 + len + i);
	struct kvmm_grow g = {seq, n, toks};
	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	const int32_t *pages = kvmm_seq_pages(m, seq, &np);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = len + i;
		for (uint32_t l = 0; l < L; l++)
			*slot_at(m, pages[pos / BS], l, pos % BS) = (uint64_t)pos * 1000003u + l;
	}
	assert_int_equal(kvmm_seq_publish(m, seq), 0);
}

/* Every position's content where a backend would read it: the global layer
 * of released positions from their packed page, every layer of the others
 * from their page. */
static void verify(struct kvmm *m, uint32_t seq, int packed)
{
	uint32_t np, len = kvmm_seq_len(m, seq), rel = kvmm_seq_released(m, seq);
	const int32_t *pages = kvmm_seq_pages(m, seq, &np);

	for (uint32_t pos = 0; pos < len; pos++) {
		uint32_t i = pos / BS;
		if (i < rel) {
			if (!packed) {
				assert_int_equal(pages[i], KVMM_RELEASED);
				continue;
			}
			int32_t head = pages[i - i % K];
			assert_true(head >= 0);
			if (i % K)
				assert_int_equal(pages[i], KVMM_RELEASED);
			assert_true(kvmm_page_state(m, (uint32_t)head) & KVMM_PAGE_PACKED);
			assert_int_equal(*slot_at(m, head, i % K, pos % BS), (uint64_t)pos * 1000003u + 2);
			continue;
		}
		for (uint32_t l = 0; l < L; l++)
			assert_int_equal(*slot_at(m, pages[i], l, pos % BS), (uint64_t)pos * 1000003u + l);
	}
}

static void test_release_packs(void **state)
{
	(void)state;
	struct kvmm *m = make(16, 0, K);
	uint32_t s, rel = 99;
	struct kvmm_stats st;
	struct kvmm_seq_record rec;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, 30); /* 8 pages, the last holding 2 */
	assert_int_equal(kvmm_seq_release(m, s, 5, &rel), 0);
	assert_int_equal(rel, 5);
	assert_int_equal(n_packs, 5);
	check(m);
	verify(m, s, 1);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_used, 3 + 2); /* pages 5..7, packed pages of groups 0 and 1 */
	assert_int_equal(st.pages_packed, 2);
	assert_int_equal(st.pages_released, 5);
	assert_int_equal(st.pages_free, 16 - 5);
	assert_int_equal(kvmm_seq_pages_held(m, s), 5);
	assert_int_equal(kvmm_seq_ledger(m, s, &rec), 0);
	assert_int_equal(rec.released_tokens, 20);
	assert_int_equal(rec.packed_pages, 2);
	assert_int_equal(rec.pages, 5);
	assert_int_equal(rec.kv_bytes_allocated, 5 * PAGE);
	assert_int_equal(rec.kv_bytes_useful, 10 * PAGE / BS + 5 * (PAGE / K));
	/* nothing to do again; growth goes on in the last page */
	assert_int_equal(kvmm_seq_release(m, s, 5, &rel), 0);
	assert_int_equal(n_packs, 5);
	grow(m, s, 14); /* 44 tokens: 11 full pages */
	assert_int_equal(kvmm_seq_release(m, s, 9, &rel), 0);
	assert_int_equal(rel, 9);
	check(m);
	verify(m, s, 1);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_packed, 3);
	assert_int_equal(st.pages_used, 2 + 3);
	/* the length and positions are the sequence's own still */
	assert_int_equal(kvmm_seq_len(m, s), 44);
	/* a window policy cannot drop pages from inside it any more */
	assert_int_equal(kvmm_seq_drop_pages(m, s, 9, 1), -EBUSY);
	assert_int_equal(kvmm_seq_finish(m, s, &rec), 0);
	assert_int_equal(rec.released_tokens, 36);
	check(m);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, 16);
	assert_int_equal(st.pages_packed, 0);
	kvmm_destroy(m);
}

static void test_release_errors(void **state)
{
	(void)state;
	struct kvmm *m = make(8, 0, 0);
	uint32_t s;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, 12);
	assert_int_equal(kvmm_seq_release(m, s, 1, NULL), -EOPNOTSUPP);
	assert_int_equal(kvmm_seq_release(m, 7, 1, NULL), -ENOENT);
	kvmm_destroy(m);

	/* a pack callback is required with pack slots, and at most KVMM_PACK_MAX */
	struct kvmm_config c = {.page_bytes = PAGE, .block_size = BS, .pool_bytes = 8 * PAGE, .pack_slots = 3};
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c.pack_slots = KVMM_PACK_MAX + 1;
	c.page_ops.pack = pack;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);

	m = make(8, 0, K);
	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, 10); /* 2 full pages, published */
	assert_int_equal(kvmm_seq_release(m, s, 3, NULL), -EINVAL); /* page 2 is not full */
	assert_int_equal(kvmm_seq_released(m, s), 0);
	assert_int_equal(kvmm_seq_release(m, s, 2, NULL), 0);
	check(m);
	kvmm_destroy(m);
}

static void test_release_none(void **state)
{
	(void)state;
	struct kvmm *m = make(8, 0, KVMM_PACK_NONE);
	uint32_t s;
	struct kvmm_stats st;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, 22);
	assert_int_equal(kvmm_seq_release(m, s, 4, NULL), 0);
	check(m);
	verify(m, s, 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_used, 2);
	assert_int_equal(st.pages_packed, 0);
	assert_int_equal(n_packs, 0);
	/* 82 tokens in a pool of 8 pages: only with releases (a window of a
	 * page and a half) */
	for (int k = 0; k < 10; k++) {
		grow(m, s, 6);
		assert_int_equal(kvmm_seq_release(m, s, (kvmm_seq_len(m, s) - 6) / BS, NULL), 0);
		check(m);
	}
	verify(m, s, 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(kvmm_seq_len(m, s), 82);
	assert_int_equal(kvmm_seq_released(m, s), 19);
	assert_int_equal(st.pages_used, 21 - 19);
	kvmm_destroy(m);
}

/* Released pages known to the prefix index stay cached: a second prompt
 * gets all of them back; nothing is published under a released page. */
static void test_release_prefix(void **state)
{
	(void)state;
	struct kvmm *m = make(32, 1, K);
	uint32_t a, b, c, hit = 0;
	int32_t toks[40];
	struct kvmm_stats st;

	for (int i = 0; i < 40; i++)
		toks[i] = 100 + i;
	assert_int_equal(kvmm_seq_new(m, &a), 0);
	grow(m, a, 24); /* 6 full pages, published */
	assert_int_equal(kvmm_seq_release(m, a, 4, NULL), 0);
	check(m);
	verify(m, a, 1);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 4);
	assert_int_equal(st.pages_used, 2 + 2);
	/* the same prompt maps the four cached pages and the two live ones */
	assert_int_equal(kvmm_seq_new(m, &b), 0);
	assert_int_equal(kvmm_prefix_attach(m, b, toks, 25, &hit), 0);
	assert_int_equal(hit, 24);
	check(m);
	verify(m, b, 0);
	/* a grows on: its new pages are entered under its kept ones */
	grow(m, a, 8);
	check(m);
	assert_int_equal(kvmm_seq_free(m, b), 0);
	assert_int_equal(kvmm_seq_new(m, &c), 0);
	assert_int_equal(kvmm_prefix_attach(m, c, toks, 33, &hit), 0);
	assert_int_equal(hit, 32);
	check(m);
	verify(m, c, 0);
	assert_int_equal(kvmm_seq_free(m, c), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	check(m);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_used, 0);
	assert_int_equal(st.pages_packed, 0);
	kvmm_destroy(m);
}

/* A fork shares the packed pages; the first sibling to release into a
 * shared one copies it, and each keeps its own content. */
static void test_release_fork(void **state)
{
	(void)state;
	struct kvmm *m = make(32, 0, K);
	uint32_t p, c, np;
	struct kvmm_stats st;
	struct kvmm_seq_record rec;

	assert_int_equal(kvmm_seq_new(m, &p), 0);
	grow(m, p, 28);
	assert_int_equal(kvmm_seq_release(m, p, 4, NULL), 0); /* group 1 holds slot 0 */
	assert_int_equal(kvmm_seq_fork(m, p, &c), 0);
	check(m);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_packed, 2);
	const int32_t *pp = kvmm_seq_pages(m, p, &np);
	int32_t shared_head = pp[3];
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)shared_head), 2);
	/* the child writes slot 1 of group 1: a copy first */
	assert_int_equal(kvmm_seq_release(m, c, 5, NULL), 0);
	check(m);
	const int32_t *cp = kvmm_seq_pages(m, c, &np);
	assert_true(cp[3] != shared_head);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)shared_head), 1);
	assert_int_equal(kvmm_seq_ledger(m, c, &rec), 0);
	assert_int_equal(rec.cow_copies, 1);
	verify(m, c, 1);
	verify(m, p, 1);
	/* the parent's copy was not written into */
	assert_true(*slot_at(m, shared_head, 1, 0) != (uint64_t)16 * 1000003u + 2);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_packed, 3);
	/* diverging afterwards: each grows and releases on its own */
	grow(m, p, 8);
	grow(m, c, 4);
	assert_int_equal(kvmm_seq_release(m, p, 7, NULL), 0);
	assert_int_equal(kvmm_seq_release(m, c, 6, NULL), 0);
	check(m);
	verify(m, p, 1);
	verify(m, c, 1);
	assert_int_equal(kvmm_seq_free(m, p), 0);
	assert_int_equal(kvmm_seq_free(m, c), 0);
	check(m);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, 32);
	kvmm_destroy(m);
}

/* Swap-out writes packed pages like any private page and skips released
 * positions; swap-in brings them back, content intact. */
static void test_release_swap(void **state)
{
	(void)state;
	struct kvmm *m = make_io(12, 1, K, 16);
	uint32_t s, o;
	struct kvmm_stats st;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, 30);
	assert_int_equal(kvmm_seq_release(m, s, 5, NULL), 0);
	check(m);
	assert_int_equal(kvmm_seq_swap_out(m, s), 0);
	check(m);
	assert_int_equal(kvmm_seq_release(m, s, 6, NULL), -ENOENT);
	/* another sequence overwrites every free page */
	kvmm_cache_evict(m, 12, NULL);
	assert_int_equal(kvmm_seq_new(m, &o), 0);
	kvmm_get_stats(m, &st);
	grow(m, o, st.pages_free * BS);
	assert_int_equal(kvmm_seq_free(m, o), 0);
	kvmm_cache_evict(m, 12, NULL);
	check(m);
	assert_int_equal(kvmm_seq_swap_in(m, s), 0);
	check(m);
	verify(m, s, 1);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_packed, 2);
	grow(m, s, 10);
	assert_int_equal(kvmm_seq_release(m, s, 7, NULL), 0);
	check(m);
	verify(m, s, 1);
	kvmm_destroy(m);
}

/* With no page left for a new packed page, release stops and leaves the
 * page as it was; it goes on once there is room. */
static void test_release_no_room(void **state)
{
	(void)state;
	struct kvmm *m = make(4, 0, K);
	uint32_t s;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, 16); /* every page */
	assert_int_equal(kvmm_seq_release(m, s, 2, NULL), 0);
	assert_int_equal(kvmm_seq_released(m, s), 0);
	check(m);
	verify(m, s, 1);
	kvmm_destroy(m);

	m = make(5, 0, K);
	assert_int_equal(kvmm_seq_new(m, &s), 0);
	grow(m, s, 16);
	assert_int_equal(kvmm_seq_release(m, s, 4, NULL), 0);
	/* group 0 fits (one new page, then three freed); group 1 takes a
	 * freed page */
	assert_int_equal(kvmm_seq_released(m, s), 4);
	check(m);
	verify(m, s, 1);
	kvmm_destroy(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_release_packs), cmocka_unit_test(test_release_errors),
		cmocka_unit_test(test_release_none),  cmocka_unit_test(test_release_prefix),
		cmocka_unit_test(test_release_fork),  cmocka_unit_test(test_release_swap),
		cmocka_unit_test(test_release_no_room),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
