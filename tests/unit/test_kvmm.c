/*
 * tests/unit/test_kvmm.c — cmocka tests of kvmm, one or more per operation:
 * configuration, sequences, plan/commit with copy-on-write, publish and
 * prefix attach (hash collisions included), LRU reclaim order, eviction,
 * demotion and promotion, sequence swap through every store (memory,
 * io_uring file, fault layer), the ledger, shuffled placement and device
 * pools. (The metadata memfd, read from another process through
 * libkvclient's KV map, has its own tests in test_kvmap.c.)
 *
 * The test plays the engine: after a commit it writes a known pattern into
 * the new tokens' slots (8 bytes per token: a function of token id and
 * position), and checks that pattern through every page table later.
 * kvmm_check() runs after every test.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvmm.h"

#define TB 8 /* bytes per token slot in these tests */

static uint64_t pattern(int32_t tok, uint32_t pos)
{
	uint64_t z = ((uint64_t)(uint32_t)tok << 32 | pos) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static struct kvmm_config cfg_of(uint32_t bs, uint32_t n_pages)
{
	return (struct kvmm_config){
		.page_bytes = (size_t)bs * TB,
		.block_size = bs,
		.pool_bytes = (uint64_t)n_pages * bs * TB,
		.max_seqs = 16,
		.prefix_cache = 1,
	};
}

static struct kvmm *make(uint32_t bs, uint32_t n_pages)
{
	struct kvmm_config c = cfg_of(bs, n_pages);
	struct kvmm *m = NULL;

	assert_int_equal(kvmm_create(&c, &m), 0);
	return m;
}

static struct kvmm *make_swap(uint32_t bs, uint32_t n_pages, uint32_t n_slots, struct kvmm_swap_io **ret_fault)
{
	struct kvmm_config c = cfg_of(bs, n_pages);
	struct kvmm_swap_io *mem = NULL, *f = NULL;
	struct kvmm *m = NULL;

	assert_int_equal(kvmm_swap_io_mem_new((uint64_t)n_slots * bs * TB, &mem), 0);
	assert_int_equal(kvmm_swap_io_fault_new(mem, &f), 0);
	assert_int_equal(kvmm_create_with_io(&c, f, &m), 0);
	assert_int_equal(kvmm_swap_slots(m), n_slots);
	if (ret_fault)
		*ret_fault = f;
	return m;
}

static void check(const struct kvmm *m)
{
	char why[256] = "";
	int r = kvmm_check(m, why, sizeof(why));

	if (r)
		fail_msg("kvmm_check: %s", why);
}

static void done(struct kvmm *m)
{
	check(m);
	assert_null(kvmm_destroy(m));
}

/* Append tokens to a sequence and write their pattern, as the engine would. */
static int grow(struct kvmm *m, uint32_t seq, const int32_t *toks, uint32_t n)
{
	uint32_t len = kvmm_seq_len(m, seq), np;
	struct kvmm_grow g = {seq, n, toks};
	const int32_t *pages;
	int r = kvmm_commit(m, &g, 1);

	if (r < 0)
		return r;
	pages = kvmm_seq_pages(m, seq, &np);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = len + i;
		uint64_t v = pattern(toks[i], pos);

		memcpy((char *)kvmm_pool_base(m) + (size_t)pages[pos / kvmm_block_size(m)] * kvmm_page_bytes(m) +
			       (pos % kvmm_block_size(m)) * TB,
		       &v, TB);
	}
	return 0;
}

/* Every token of the sequence reads back as the pattern of toks. */
static void expect_content(const struct kvmm *m, uint32_t seq, const int32_t *toks)
{
	uint32_t np, len = kvmm_seq_len(m, seq), bs = kvmm_block_size(m);
	const int32_t *pages = kvmm_seq_pages(m, seq, &np);

	assert_non_null(pages);
	assert_int_equal(np, (len + bs - 1) / bs);
	for (uint32_t pos = 0; pos < len; pos++) {
		uint64_t v, want = pattern(toks[pos], pos);

		memcpy(&v, (const char *)kvmm_pool_base(m) + (size_t)pages[pos / bs] * kvmm_page_bytes(m) + (pos % bs) * TB,
		       TB);
		if (v != want)
			fail_msg("seq %u token %u: %#llx, want %#llx", seq, pos, (unsigned long long)v,
				 (unsigned long long)want);
	}
}

static void iota(int32_t *t, uint32_t n, int32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + (int32_t)i;
}

static uint32_t new_seq(struct kvmm *m)
{
	uint32_t s;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	return s;
}

/* ---- configuration ---------------------------------------------------------------- */

static void test_create_rejects_bad_config(void **state)
{
	struct kvmm_config c;
	struct kvmm *m = (struct kvmm *)0x1;

	(void)state;
	c = cfg_of(4, 8), c.page_bytes = 0;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c = cfg_of(4, 8), c.block_size = 0;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c = cfg_of(4, 8), c.block_size = KVMM_MAX_BLOCK_SIZE + 1;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c = cfg_of(4, 8), c.max_seqs = KVMM_MAX_SEQS + 1;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c = cfg_of(4, 8), c.pool_bytes = 0, c.pool_fraction = 0;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c = cfg_of(4, 8), c.pool_bytes = 0, c.pool_fraction = 1.5;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c = cfg_of(4, 8), c.pool_bytes = 31; /* less than one page */
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	c = cfg_of(4, 8), c.page_ops.read = (int (*)(void *, uint32_t, void *))1;
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	assert_ptr_equal(m, (struct kvmm *)0x1); /* ret untouched on failure */
	assert_null(kvmm_destroy(NULL));
	assert_null(kvmm_swap_io_free(NULL));
}

static void test_create_by_fraction(void **state)
{
	struct kvmm_config c = cfg_of(16, 1);
	struct kvmm *m = NULL;
	struct kvmm_stats st;

	(void)state;
	c.page_bytes = 64 << 10;
	c.pool_bytes = 0;
	c.pool_fraction = 0.002;
	assert_int_equal(kvmm_create(&c, &m), 0);
	assert_true(kvmm_n_pages(m) > 0);
	assert_non_null(kvmm_pool_base(m));
	assert_true(kvmm_pool_fd(m) >= 0);
	assert_true(kvmm_pool_hugetlb(m) == 0 || kvmm_pool_hugetlb(m) == 1);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_total, kvmm_n_pages(m));
	assert_int_equal(st.pages_free, kvmm_n_pages(m));
	assert_int_equal(st.block_size, 16);
	assert_int_equal(kvmm_available_pages(m), kvmm_n_pages(m));
	done(m);
}

/* ---- sequences ------------------------------------------------------------------------ */

static void test_seq_new_free_limits(void **state)
{
	struct kvmm_config c = cfg_of(4, 8);
	struct kvmm *m = NULL;
	uint32_t s[4], x = 77, np = 5;

	(void)state;
	c.max_seqs = 4;
	assert_int_equal(kvmm_create(&c, &m), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(kvmm_seq_new(m, &s[i]), 0);
	assert_int_equal(kvmm_seq_new(m, &x), -ENOSPC);
	assert_int_equal(x, 77);
	assert_int_equal(kvmm_seq_fork(m, s[0], &x), -ENOSPC);
	assert_int_equal(kvmm_seq_free(m, s[2]), 0);
	assert_int_equal(kvmm_seq_free(m, s[2]), -ENOENT);
	assert_int_equal(kvmm_seq_free(m, 1000), -ENOENT);
	assert_int_equal(kvmm_seq_len(m, 1000), 0);
	assert_null(kvmm_seq_pages(m, 1000, &np));
	assert_int_equal(np, 5);
	assert_int_equal(kvmm_seq_new(m, &x), 0);
	assert_int_equal(x, s[2]); /* ids are reused */
	done(m);
}

static void test_commit_allocates_on_growth(void **state)
{
	struct kvmm *m = make(4, 8);
	uint32_t s = new_seq(m), need = 99, np;
	int32_t t[13];
	struct kvmm_stats st;
	struct kvmm_grow g;

	(void)state;
	iota(t, 13, 100);
	g = (struct kvmm_grow){s, 10, t};
	assert_int_equal(kvmm_plan(m, &g, 1, &need), 0);
	assert_int_equal(need, 3);
	assert_int_equal(grow(m, s, t, 10), 0);
	assert_int_equal(kvmm_seq_len(m, s), 10);
	assert_non_null(kvmm_seq_pages(m, s, &np));
	assert_int_equal(np, 3);
	g = (struct kvmm_grow){s, 2, t + 10};
	assert_int_equal(kvmm_plan(m, &g, 1, &need), 0);
	assert_int_equal(need, 0); /* fits in the partial page */
	g.n_tokens = 3;
	assert_int_equal(kvmm_plan(m, &g, 1, &need), 0);
	assert_int_equal(need, 1);
	assert_int_equal(grow(m, s, t + 10, 3), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_used, 4);
	assert_int_equal(st.pages_free, 4);
	assert_int_equal(st.tokens_resident, 13);
	expect_content(m, s, t);
	g.n_tokens = 0;
	assert_int_equal(kvmm_commit(m, &g, 1), 0); /* empty growth is a no-op */
	assert_int_equal(kvmm_seq_free(m, s), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, 8);
	done(m);
}

static void test_plan_commit_all_or_nothing(void **state)
{
	struct kvmm *m = make(4, 4);
	uint32_t a = new_seq(m), b = new_seq(m), need = 7, np;
	int32_t t[16];
	struct kvmm_grow g[2];
	const int32_t *pa;
	int32_t before[4];

	(void)state;
	iota(t, 16, 0);
	assert_int_equal(grow(m, a, t, 6), 0); /* 2 pages */
	pa = kvmm_seq_pages(m, a, &np);
	memcpy(before, pa, np * sizeof(int32_t));
	g[0] = (struct kvmm_grow){a, 4, t + 6}; /* +1 page */
	g[1] = (struct kvmm_grow){b, 8, t};     /* +2 pages: 3 > 2 free */
	assert_int_equal(kvmm_plan(m, g, 2, &need), -ENOMEM);
	assert_int_equal(need, 7);
	assert_int_equal(kvmm_commit(m, g, 2), -ENOMEM);
	assert_int_equal(kvmm_seq_len(m, a), 6);
	assert_int_equal(kvmm_seq_len(m, b), 0);
	pa = kvmm_seq_pages(m, a, &np);
	assert_int_equal(np, 2);
	assert_memory_equal(pa, before, 2 * sizeof(int32_t));
	g[1].n_tokens = 4;
	assert_int_equal(kvmm_plan(m, g, 2, &need), 0);
	assert_int_equal(need, 2);
	assert_int_equal(kvmm_commit(m, g, 2), 0);
	assert_int_equal(kvmm_available_pages(m), 0);
	/* Unknown, duplicate, swapped-out: refused before anything happens. */
	g[1] = (struct kvmm_grow){999, 1, t};
	assert_int_equal(kvmm_plan(m, g, 2, &need), -ENOENT);
	g[1] = (struct kvmm_grow){a, 1, t};
	assert_int_equal(kvmm_plan(m, g, 2, &need), -EINVAL);
	assert_int_equal(kvmm_commit(m, g, 2), -EINVAL);
	done(m);
}

/* ---- fork and copy-on-write --------------------------------------------------------------- */

struct copy_log {
	struct kvmm *m;
	int calls;
	uint32_t last_n;
	int fail;
};

static int copy_tokens(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct copy_log *l = ud;
	char *base = kvmm_pool_base(l->m);
	size_t pb = kvmm_page_bytes(l->m);

	l->calls++;
	l->last_n = n_tokens;
	if (l->fail)
		return -EIO;
	/* Layout-aware: copy only the n_tokens slots, scribble the rest. */
	memset(base + dst * pb, 0xcd, pb);
	memcpy(base + dst * pb, base + src * pb, n_tokens * TB);
	return 0;
}

static void test_fork_shares_and_cow_copies(void **state)
{
	struct copy_log log = {0};
	struct kvmm_config c = cfg_of(4, 16);
	struct kvmm *m = NULL;
	uint32_t a, b, np;
	int32_t ta[8], tb[8];
	const int32_t *pa, *pb;
	struct kvmm_stats st;

	(void)state;
	c.page_ops.copy = copy_tokens;
	c.page_ops.ud = &log;
	assert_int_equal(kvmm_create(&c, &m), 0);
	log.m = m;
	a = new_seq(m);
	iota(ta, 8, 10);
	assert_int_equal(grow(m, a, ta, 6), 0);
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	memcpy(tb, ta, sizeof(tb));
	tb[6] = 99;
	pa = kvmm_seq_pages(m, a, &np);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pa[0]), 2);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pa[1]), 2);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_shared, 2);
	assert_int_equal(st.tokens_resident, 12);
	/* The child writes into the shared partial page: it gets a copy of
	 * the 2 tokens already there. */
	assert_int_equal(grow(m, b, tb + 6, 1), 0);
	assert_int_equal(log.calls, 1);
	assert_int_equal(log.last_n, 2);
	pa = kvmm_seq_pages(m, a, &np);
	pb = kvmm_seq_pages(m, b, &np);
	assert_int_equal(pa[0], pb[0]);
	assert_int_not_equal(pa[1], pb[1]);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pa[1]), 1);
	/* The parent now owns its page alone: no copy. */
	assert_int_equal(grow(m, a, ta + 6, 2), 0);
	assert_int_equal(log.calls, 1);
	expect_content(m, a, ta);
	expect_content(m, b, tb);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.cow_copies, 1);
	assert_int_equal(kvmm_seq_fork(m, 999, &b), -ENOENT);
	done(m);
}

/* A sequence cut back (rejected draft tokens) frees the pages past the cut,
 * keeps the shared head and its fork sibling untouched, refuses to cut
 * published pages, and grows again as if the cut tokens never were: the
 * prefix index never sees them. */
static void test_truncate_cuts_tail_keeps_shared_head(void **state)
{
	struct copy_log log = {0};
	struct kvmm_config c = cfg_of(4, 16);
	struct kvmm *m = NULL;
	uint32_t a, b, d, np, hit = 0, free_before;
	int32_t ta[16], tb[16];
	const int32_t *pa, *pb;
	struct kvmm_stats st;

	(void)state;
	c.page_ops.copy = copy_tokens;
	c.page_ops.ud = &log;
	assert_int_equal(kvmm_create(&c, &m), 0);
	log.m = m;
	a = new_seq(m);
	iota(ta, 16, 10);
	assert_int_equal(grow(m, a, ta, 6), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0); /* page 0 indexed */
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	kvmm_get_stats(m, &st);
	free_before = st.pages_free;
	/* b appends 7 draft tokens: its partial page is copied, two new pages */
	memcpy(tb, ta, sizeof(tb));
	for (int i = 6; i < 13; i++)
		tb[i] = 500 + i;
	assert_int_equal(grow(m, b, tb + 6, 7), 0);
	assert_int_equal(kvmm_seq_len(m, b), 13);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, free_before - 3);
	/* refused: the published page; no-op: at or past the length */
	assert_int_equal(kvmm_seq_truncate(m, b, 3), -EBUSY);
	assert_int_equal(kvmm_seq_truncate(m, b, 13), 0);
	assert_int_equal(kvmm_seq_truncate(m, 999, 1), -ENOENT);
	/* two drafts accepted: keep 8 tokens, the last two pages go */
	assert_int_equal(kvmm_seq_truncate(m, b, 8), 0);
	assert_int_equal(kvmm_seq_len(m, b), 8);
	pb = kvmm_seq_pages(m, b, &np);
	assert_int_equal(np, 2);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, free_before - 1);
	assert_int_equal(st.tokens_resident, 6 + 8);
	check(m);
	/* none accepted: back to the fork point, inside its private copy */
	assert_int_equal(kvmm_seq_truncate(m, b, 6), 0);
	assert_int_equal(kvmm_seq_len(m, b), 6);
	pa = kvmm_seq_pages(m, a, &np);
	pb = kvmm_seq_pages(m, b, &np);
	assert_int_equal(np, 2);
	assert_int_equal(pa[0], pb[0]);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pa[0]), 2);
	assert_int_not_equal(pa[1], pb[1]);
	check(m);
	/* grows again over the cut positions with other tokens */
	for (int i = 6; i < 12; i++)
		tb[i] = 900 + i;
	assert_int_equal(grow(m, b, tb + 6, 6), 0);
	assert_int_equal(kvmm_seq_publish(m, b), 0);
	expect_content(m, a, ta);
	expect_content(m, b, tb);
	/* the index holds b's real pages, never the cut drafts */
	d = new_seq(m);
	int32_t td[13];
	memcpy(td, ta, 6 * sizeof(int32_t));
	for (int i = 6; i < 13; i++)
		td[i] = 500 + i;
	assert_int_equal(kvmm_prefix_attach(m, d, td, 13, &hit), 0);
	assert_int_equal(hit, 4);
	assert_int_equal(kvmm_seq_free(m, d), 0);
	d = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, d, tb, 12, &hit), 0);
	assert_int_equal(hit, 11);
	assert_int_equal(kvmm_seq_free(m, d), 0);
	assert_int_equal(kvmm_seq_free(m, b), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.tokens_resident, 0);
	done(m);
}

static void test_cow_in_one_step_copies_once(void **state)
{
	struct kvmm *m = make(4, 8);
	uint32_t a = new_seq(m), b, need, np;
	int32_t t[8];
	struct kvmm_grow g[2];
	struct kvmm_stats st;
	const int32_t *pa, *pb;

	(void)state;
	iota(t, 8, 0);
	assert_int_equal(grow(m, a, t, 5), 0);
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	g[0] = (struct kvmm_grow){a, 1, t + 5};
	g[1] = (struct kvmm_grow){b, 1, t + 5};
	assert_int_equal(kvmm_plan(m, g, 2, &need), 0);
	assert_int_equal(need, 1); /* the second writer inherits the original */
	assert_int_equal(kvmm_commit(m, g, 2), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.cow_copies, 1);
	pa = kvmm_seq_pages(m, a, &np);
	pb = kvmm_seq_pages(m, b, &np);
	assert_int_not_equal(pa[1], pb[1]);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pa[1]), 1);
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pb[1]), 1);
	done(m);
}

static void test_commit_copy_failure_changes_nothing(void **state)
{
	struct copy_log log = {0};
	struct kvmm_config c = cfg_of(4, 8);
	struct kvmm *m = NULL;
	uint32_t a, b, d, np, free_before;
	int32_t t[12], before[2];
	struct kvmm_grow g[3];
	struct kvmm_stats st;

	(void)state;
	c.page_ops.copy = copy_tokens;
	c.page_ops.ud = &log;
	assert_int_equal(kvmm_create(&c, &m), 0);
	log.m = m;
	a = new_seq(m);
	d = new_seq(m);
	iota(t, 12, 0);
	assert_int_equal(grow(m, a, t, 6), 0);
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	memcpy(before, kvmm_seq_pages(m, b, &np), sizeof(before));
	kvmm_get_stats(m, &st);
	free_before = st.pages_free;
	log.fail = 1;
	g[0] = (struct kvmm_grow){d, 5, t};     /* fresh pages, no copy */
	g[1] = (struct kvmm_grow){b, 3, t + 6}; /* copy: fails */
	g[2] = (struct kvmm_grow){a, 1, t + 6};
	assert_int_equal(kvmm_commit(m, g, 3), -EIO);
	assert_int_equal(kvmm_seq_len(m, d), 0);
	assert_int_equal(kvmm_seq_len(m, b), 6);
	assert_memory_equal(kvmm_seq_pages(m, b, &np), before, sizeof(before));
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, free_before);
	assert_int_equal(st.cow_copies, 0);
	check(m);
	log.fail = 0;
	assert_int_equal(kvmm_commit(m, g, 3), 0);
	done(m);
}

/* ---- prefix index ------------------------------------------------------------------------------ */

static void test_publish_and_attach(void **state)
{
	struct kvmm *m = make(4, 16);
	uint32_t a = new_seq(m), b = new_seq(m), c = new_seq(m), hit = 99, np;
	int32_t t[14];
	const int32_t *pa, *pb;
	struct kvmm_stats st;

	(void)state;
	iota(t, 14, 50);
	assert_int_equal(grow(m, a, t, 12), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	/* Longer prompt: every full page matches. */
	assert_int_equal(kvmm_prefix_attach(m, b, t, 14, &hit), 0);
	assert_int_equal(hit, 12);
	pa = kvmm_seq_pages(m, a, &np);
	pb = kvmm_seq_pages(m, b, &np);
	assert_int_equal(np, 3);
	assert_memory_equal(pa, pb, 3 * sizeof(int32_t));
	assert_int_equal(kvmm_page_refcount(m, (uint32_t)pa[2]), 2);
	expect_content(m, b, t);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 14, &hit), -EBUSY);
	/* Exactly the cached prompt: one token is left to compute, so the last
	 * page is mapped partly used and copied on the next write. */
	assert_int_equal(kvmm_prefix_attach(m, c, t, 12, &hit), 0);
	assert_int_equal(hit, 11);
	assert_int_equal(kvmm_seq_len(m, c), 11);
	kvmm_seq_pages(m, c, &np);
	assert_int_equal(np, 3);
	assert_int_equal(grow(m, c, t + 11, 1), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.cow_copies, 1);
	assert_int_equal(kvmm_seq_pages(m, c, &np)[2] != pa[2], 1);
	expect_content(m, c, t);
	expect_content(m, a, t);
	/* Publishing c's recomputed page finds the identical one: deduplicated. */
	assert_int_equal(kvmm_seq_publish(m, c), 0);
	assert_int_equal(kvmm_seq_pages(m, c, &np)[2], pa[2]);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.prefix_lookups, 2);
	assert_int_equal(st.prefix_query_tokens, 26);
	assert_int_equal(st.prefix_hit_tokens, 23);
	/* Short prompts never hit. */
	assert_int_equal(kvmm_seq_free(m, c), 0);
	c = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, c, t, 1, &hit), 0);
	assert_int_equal(hit, 0);
	assert_int_equal(kvmm_prefix_attach(m, 999, t, 4, &hit), -ENOENT);
	done(m);
}

/* Owner scopes: a page published in one scope serves only that scope, with
 * full hash collisions too; forks keep their scope; the same tokens in two
 * scopes are two chains (no deduplication across them). */
static void test_prefix_scopes_never_cross(void **state)
{
	const uint64_t A = 0x1111, B = 0x2222;
	uint32_t a, b, hit = 99, np;
	int32_t t[14];
	const int32_t *pa, *pb;
	struct kvmm_stats st;

	(void)state;
	for (int bits = 64; bits >= 1; bits -= 63) { /* then every key collides but two */
		struct kvmm *m = make(4, 64);

		assert_int_equal(kvmm_debug_set_hash_bits(m, (unsigned)bits), 0);
		iota(t, 14, 300);
		a = new_seq(m);
		b = new_seq(m);
		assert_int_equal(kvmm_seq_set_scope(m, a, A), 0);
		assert_int_equal(grow(m, a, t, 12), 0);
		assert_int_equal(kvmm_seq_set_scope(m, a, B), -EBUSY);
		assert_int_equal(kvmm_seq_publish(m, a), 0);
		/* another scope, the same tokens: no hit */
		assert_int_equal(kvmm_seq_set_scope(m, b, B), 0);
		assert_int_equal(kvmm_prefix_attach(m, b, t, 14, &hit), 0);
		assert_int_equal(hit, 0);
		assert_int_equal(kvmm_seq_free(m, b), 0);
		/* the default scope 0 is another scope too */
		b = new_seq(m);
		assert_int_equal(kvmm_prefix_attach(m, b, t, 14, &hit), 0);
		assert_int_equal(hit, 0);
		/* b computes the same prompt itself and publishes it: its own
		 * pages, not deduplicated onto a's */
		assert_int_equal(grow(m, b, t, 12), 0);
		assert_int_equal(kvmm_seq_publish(m, b), 0);
		pa = kvmm_seq_pages(m, a, &np);
		pb = kvmm_seq_pages(m, b, &np);
		for (uint32_t i = 0; i < 3; i++)
			assert_true(pa[i] != pb[i]);
		assert_int_equal(kvmm_seq_free(m, b), 0);
		/* the same scope hits, and so does a fork of it */
		b = new_seq(m);
		assert_int_equal(kvmm_seq_set_scope(m, b, A), 0);
		assert_int_equal(kvmm_prefix_attach(m, b, t, 14, &hit), 0);
		assert_int_equal(hit, 12);
		pb = kvmm_seq_pages(m, b, &np);
		pa = kvmm_seq_pages(m, a, &np);
		assert_memory_equal(pa, pb, 3 * sizeof(int32_t));
		expect_content(m, b, t);
		{
			uint32_t f, g = new_seq(m);
			int32_t u[4];

			assert_int_equal(kvmm_seq_fork(m, b, &f), 0);
			iota(u, 4, 900);
			assert_int_equal(grow(m, f, u, 4), 0); /* page 3 of f: A's chain */
			assert_int_equal(kvmm_seq_publish(m, f), 0);
			int32_t v[18];
			memcpy(v, t, 12 * sizeof(int32_t));
			memcpy(v + 12, u, 4 * sizeof(int32_t));
			v[16] = v[17] = 1;
			assert_int_equal(kvmm_seq_set_scope(m, g, A), 0);
			assert_int_equal(kvmm_prefix_attach(m, g, v, 18, &hit), 0);
			assert_int_equal(hit, 16);
			assert_int_equal(kvmm_seq_free(m, g), 0);
			g = new_seq(m);
			assert_int_equal(kvmm_seq_set_scope(m, g, B), 0);
			assert_int_equal(kvmm_prefix_attach(m, g, v, 18, &hit), 0);
			assert_int_equal(hit, 0);
			assert_int_equal(kvmm_seq_free(m, g), 0);
			assert_int_equal(kvmm_seq_free(m, f), 0);
		}
		assert_int_equal(kvmm_seq_free(m, b), 0);
		assert_int_equal(kvmm_seq_free(m, a), 0);
		kvmm_get_stats(m, &st);
		assert_int_equal(st.prefix_hit_tokens, 12 + 16);
		assert_int_equal(kvmm_seq_set_scope(m, 999, A), -ENOENT);
		done(m);
	}
}

static void test_attach_block_size_one(void **state)
{
	struct kvmm *m = make(1, 16);
	uint32_t a = new_seq(m), b = new_seq(m), hit, np;
	int32_t t[6];

	(void)state;
	iota(t, 6, 7);
	assert_int_equal(grow(m, a, t, 5), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 5, &hit), 0);
	assert_int_equal(hit, 4);
	kvmm_seq_pages(m, b, &np);
	assert_int_equal(np, 4);
	assert_int_equal(grow(m, b, t + 4, 2), 0);
	expect_content(m, b, t);
	done(m);
}

static void test_hash_collisions_never_map_wrong_pages(void **state)
{
	struct kvmm *m = make(4, 64);
	int32_t t[8][12];
	uint32_t s[8], hit;

	(void)state;
	assert_int_equal(kvmm_debug_set_hash_bits(m, 1), 0); /* two keys in all */
	assert_int_equal(kvmm_debug_set_hash_bits(m, 0), -EINVAL);
	for (int i = 0; i < 8; i++) {
		for (int j = 0; j < 12; j++)
			t[i][j] = (j < 4 && i < 4) ? 1000 + j : i * 100 + j; /* 0..3 share a first page */
		s[i] = new_seq(m);
		assert_int_equal(grow(m, s[i], t[i], 12), 0);
		assert_int_equal(kvmm_seq_publish(m, s[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		uint32_t x = new_seq(m);

		assert_int_equal(kvmm_prefix_attach(m, x, t[i], 12, &hit), 0);
		assert_int_equal(hit, 11);
		expect_content(m, x, t[i]);
		assert_int_equal(kvmm_seq_free(m, x), 0);
	}
	/* A prompt that differs in its second page matches only the first. */
	{
		int32_t q[12];
		uint32_t x = new_seq(m);

		memcpy(q, t[0], sizeof(q));
		q[5] = -7;
		assert_int_equal(kvmm_prefix_attach(m, x, q, 12, &hit), 0);
		assert_int_equal(hit, 4);
		expect_content(m, x, q);
	}
	done(m);
}

static void test_lru_reclaims_only_when_free_list_empty_tails_first(void **state)
{
	struct kvmm *m = make(4, 8);
	uint32_t a = new_seq(m), b, c, hit;
	int32_t t[16], u[16];
	struct kvmm_stats st;

	(void)state;
	iota(t, 16, 0);
	iota(u, 16, 500);
	assert_int_equal(grow(m, a, t, 16), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 4);
	assert_int_equal(st.pages_free, 4);
	assert_int_equal(kvmm_available_pages(m), 8);
	b = new_seq(m);
	assert_int_equal(grow(m, b, u, 16), 0); /* takes the 4 free pages */
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 4);
	assert_int_equal(st.pages_evicted, 0);
	c = new_seq(m);
	assert_int_equal(grow(m, c, u, 8), 0); /* reclaims 2: the tails */
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 2);
	assert_int_equal(st.pages_evicted, 2);
	assert_int_equal(kvmm_seq_free(m, c), 0);
	c = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, c, t, 16, &hit), 0);
	assert_int_equal(hit, 8); /* the head survived */
	expect_content(m, c, t);
	done(m);
}

static void test_evict_drops_subtrees(void **state)
{
	struct kvmm *m = make(4, 16);
	uint32_t a = new_seq(m), b = new_seq(m), dropped = 0, hit;
	int32_t t[12], u[12];
	struct kvmm_stats st;
	struct kvmm_ledger l;

	(void)state;
	iota(t, 12, 0);
	memcpy(u, t, sizeof(u));
	u[8] = 77; /* shares two pages with t */
	assert_int_equal(grow(m, a, t, 12), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_prefix_attach(m, b, u, 12, &hit), 0);
	assert_int_equal(hit, 8);
	assert_int_equal(grow(m, b, u + 8, 4), 0);
	assert_int_equal(kvmm_seq_publish(m, b), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	assert_int_equal(kvmm_seq_free(m, b), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 4); /* 2 shared + 2 tails */
	assert_int_equal(kvmm_cache_evict(m, 2, &dropped), 0);
	assert_int_equal(dropped, 2); /* both tails, heads kept */
	b = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, b, u, 12, &hit), 0);
	assert_int_equal(hit, 8);
	assert_int_equal(kvmm_seq_free(m, b), 0);
	assert_int_equal(kvmm_cache_evict(m, 100, &dropped), 0);
	assert_int_equal(dropped, 2);
	kvmm_get_stats(m, &st);
	kvmm_get_ledger(m, &l);
	assert_int_equal(st.pages_cached, 0);
	assert_int_equal(st.pages_free, 16);
	assert_int_equal(l.pages_evicted_explicit, 4);
	done(m);
}

static void test_prefix_cache_off(void **state)
{
	struct kvmm_config c = cfg_of(4, 8);
	struct kvmm *m = NULL;
	uint32_t a, b, hit;
	int32_t t[8];
	struct kvmm_stats st;

	(void)state;
	c.prefix_cache = 0;
	assert_int_equal(kvmm_create(&c, &m), 0);
	a = new_seq(m);
	b = new_seq(m);
	iota(t, 8, 0);
	assert_int_equal(grow(m, a, t, 8), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 8, &hit), 0);
	assert_int_equal(hit, 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 0);
	assert_int_equal(st.pages_free, 8);
	done(m);
}

/* ---- swap ------------------------------------------------------------------------------------------ */

static void overwrite_free_pages(struct kvmm *m)
{
	/* Scribble over the pool's free pages so a swap-in or promotion that
	 * forgot to read would show. Pages in use or cached are left alone. */
	for (uint32_t p = 0; p < kvmm_n_pages(m); p++)
		if (kvmm_page_state(m, p) & KVMM_PAGE_FREE)
			memset((char *)kvmm_pool_base(m) + (size_t)p * kvmm_page_bytes(m), 0x5a, kvmm_page_bytes(m));
}

static void swap_roundtrip(struct kvmm *m)
{
	uint32_t a = new_seq(m), b, np;
	int32_t t[22], u[22];
	const int32_t *pa;
	struct kvmm_stats st;
	uint32_t free_before;

	iota(t, 22, 3);
	assert_int_equal(grow(m, a, t, 10), 0);
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0); /* 2 shared full pages + a shared partial */
	memcpy(u, t, sizeof(u));
	assert_int_equal(grow(m, a, t + 10, 12), 0);
	assert_int_equal(grow(m, b, u + 10, 1), 0);
	kvmm_get_stats(m, &st);
	free_before = st.pages_free;
	assert_int_equal(kvmm_seq_swap_out(m, a), 0);
	assert_int_equal(kvmm_seq_is_swapped(m, a), 1);
	assert_int_equal(kvmm_seq_swap_out(m, a), -EALREADY);
	pa = kvmm_seq_pages(m, a, &np);
	assert_int_equal(np, 6);
	assert_true(pa[0] >= 0 && pa[1] >= 0); /* shared pages stay */
	for (uint32_t i = 2; i < np; i++)
		assert_int_equal(pa[i], -1);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, free_before + 4);
	assert_int_equal(st.pages_swapped, 4);
	assert_int_equal(st.seqs_swapped, 1);
	assert_int_equal(st.tokens_resident, 11);
	check(m);
	{
		struct kvmm_grow g = {a, 1, t};
		uint32_t need, hit;

		assert_int_equal(kvmm_plan(m, &g, 1, &need), -ENOENT);
		assert_int_equal(kvmm_seq_fork(m, a, &need), -ENOENT);
		assert_int_equal(kvmm_seq_publish(m, a), -ENOENT);
		assert_int_equal(kvmm_prefix_attach(m, a, t, 4, &hit), -EBUSY);
	}
	overwrite_free_pages(m);
	assert_int_equal(kvmm_seq_swap_in(m, a), 0);
	assert_int_equal(kvmm_seq_swap_in(m, a), -EALREADY);
	assert_int_equal(kvmm_seq_is_swapped(m, a), 0);
	expect_content(m, a, t);
	expect_content(m, b, u);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_swapped, 0);
	assert_int_equal(st.swap_out_pages, 4);
	assert_int_equal(st.swap_in_pages, 4);
	assert_int_equal(st.tokens_resident, 33);
	/* A swapped-out sequence can be freed; its slots come back. */
	assert_int_equal(kvmm_seq_swap_out(m, a), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	assert_int_equal(kvmm_swap_slots_free(m), kvmm_swap_slots(m));
	expect_content(m, b, u);
}

static void test_swap_roundtrip_memory_store(void **state)
{
	struct kvmm *m = make_swap(4, 16, 16, NULL);

	(void)state;
	swap_roundtrip(m);
	done(m);
}

/* A path for a swap file that does not exist yet (kvmm creates it, and
 * refuses an existing one), in a fresh private directory. */
static char *tmp_swap_path(void)
{
	const char *d = getenv("TMPDIR");
	char *p = malloc(4096);

	assert_non_null(p);
	snprintf(p, 4096, "%s/kvmm-test-swap-XXXXXX", d && *d ? d : "/tmp");
	assert_non_null(mkdtemp(p));
	strcat(p, "/swap");
	return p;
}

/* Remove what tmp_swap_path() made (and whatever a test left at the path). */
static void free_swap_path(char *p)
{
	char *slash = strrchr(p, '/');

	(void)unlink(p);
	(void)rmdir(p);
	*slash = 0;
	assert_int_equal(rmdir(p), 0);
	free(p);
}

static void test_swap_roundtrip_io_uring_file(void **state)
{
	uint32_t flags[2] = {0, KVMM_SWAP_OPEN_NO_DIRECT};

	(void)state;
	for (int k = 0; k < 2; k++) {
		struct kvmm_config c = cfg_of(4, 16);
		struct kvmm_swap_io *io = NULL;
		struct kvmm *m = NULL;
		char *path = tmp_swap_path();

		assert_int_equal(kvmm_swap_io_uring_open(path, 1 << 20, flags[k] | KVMM_SWAP_OPEN_UNLINK, &io), 0);
		assert_int_equal(access(path, F_OK), -1); /* unlinked */
		if (k == 1)
			assert_int_equal(io->flags & KVMM_SWAP_DIRECT, 0);
		assert_int_equal(kvmm_create_with_io(&c, io, &m), 0);
		swap_roundtrip(m);
		done(m);
		free_swap_path(path);
	}
}

static void test_swap_by_config_path_and_direct_pool_io(void **state)
{
	/* 4 KiB pages: transfers go straight from the pool (fixed buffers). */
	struct kvmm_config c = cfg_of(4, 16);
	struct kvmm *m = NULL;
	char *path = tmp_swap_path();
	uint32_t a, b;
	int32_t t[20];

	(void)state;
	c.page_bytes = 4096;
	c.pool_bytes = 16 * 4096;
	c.swap_path = path;
	c.swap_bytes = 8 * 4096;
	assert_int_equal(kvmm_create(&c, &m), 0);
	assert_int_equal(kvmm_swap_slots(m), 8);
	assert_int_equal(access(path, F_OK), -1); /* anonymous once open */
	a = new_seq(m);
	b = new_seq(m);
	iota(t, 20, 1);
	assert_int_equal(grow(m, a, t, 20), 0);
	assert_int_equal(grow(m, b, t, 20), 0);
	assert_int_equal(kvmm_seq_swap_out(m, a), 0);
	assert_int_equal(kvmm_seq_swap_out(m, b), -ENOSPC); /* 5 + 5 > 8 slots */
	assert_int_equal(kvmm_seq_is_swapped(m, b), 0);
	expect_content(m, b, t);
	overwrite_free_pages(m);
	assert_int_equal(kvmm_seq_swap_in(m, a), 0);
	expect_content(m, a, t);
	done(m);
	c.swap_bytes = 100; /* less than one slot */
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	free_swap_path(path);
}

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static void expect_file(const char *path, const char *text)
{
	char buf[256];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf));
	close(fd);
	assert_int_equal(n, (ssize_t)strlen(text));
	assert_memory_equal(buf, text, strlen(text));
}

/* An existing file at the swap path is refused, by every way of opening
 * swap, and stays as it was: not truncated, not zeroed, not unlinked. */
static void test_swap_file_refuses_existing_file(void **state)
{
	static const uint32_t flags[] = {0, KVMM_SWAP_OPEN_NO_DIRECT, KVMM_SWAP_OPEN_UNLINK,
					 KVMM_SWAP_OPEN_UNLINK | KVMM_SWAP_OPEN_NO_DIRECT};
	char *path = tmp_swap_path();
	struct kvmm_config c = cfg_of(4, 16);
	struct kvmm_swap_io *io = NULL;
	struct kvmm *m = NULL;
	int step = -1;

	(void)state;
	write_file(path, "precious data\n");
	for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++) {
		assert_int_equal(kvmm_swap_io_file_open(path, 1 << 20, flags[k], &io, &step), -EEXIST);
		assert_int_equal(step, KVMM_SWAP_STEP_CREATE);
		assert_null(io);
		expect_file(path, "precious data\n");
	}
	c.swap_path = path;
	c.swap_bytes = 1 << 20;
	assert_int_equal(kvmm_create(&c, &m), -EEXIST);
	assert_null(m);
	expect_file(path, "precious data\n");
	/* a directory there is refused the same way */
	assert_int_equal(unlink(path), 0);
	assert_int_equal(mkdir(path, 0700), 0);
	assert_int_equal(kvmm_swap_io_uring_open(path, 1 << 20, KVMM_SWAP_OPEN_UNLINK, &io), -EEXIST);
	assert_int_equal(rmdir(path), 0);
	free_swap_path(path);
}

/* A symbolic link at the swap path is never followed: its target is left
 * alone, and a dangling link does not create its target. */
static void test_swap_file_refuses_symlink(void **state)
{
	char *path = tmp_swap_path();
	char target[4096];
	struct kvmm_swap_io *io = NULL;

	(void)state;
	snprintf(target, sizeof(target), "%s.target", path);
	write_file(target, "someone else's file\n");
	assert_int_equal(symlink(target, path), 0);
	assert_int_equal(kvmm_swap_io_uring_open(path, 1 << 20, KVMM_SWAP_OPEN_UNLINK, &io), -EEXIST);
	assert_int_equal(kvmm_swap_io_uring_open(path, 1 << 20, 0, &io), -EEXIST);
	expect_file(target, "someone else's file\n");
	assert_int_equal(access(path, F_OK), 0); /* the link is still there */
	assert_int_equal(unlink(target), 0);
	/* dangling: the open would otherwise create the target */
	assert_int_equal(kvmm_swap_io_uring_open(path, 1 << 20, KVMM_SWAP_OPEN_UNLINK, &io), -EEXIST);
	assert_int_equal(access(target, F_OK), -1);
	assert_int_equal(unlink(path), 0);
	free_swap_path(path);
}

/* When the space cannot be reserved (RLIMIT_FSIZE plays a full file system:
 * fallocate fails with EFBIG), the error names the preallocation step and
 * the half-made file is gone again. Runs in a child: the limit sticks. */
static void test_swap_file_preallocation_failure(void **state)
{
	char *path = tmp_swap_path();
	pid_t pid;
	int st;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit rl = {64 << 10, 64 << 10};
		struct kvmm_swap_io *io = NULL;
		int step = -1, r;

		signal(SIGXFSZ, SIG_IGN);
		if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
			_exit(10);
		r = kvmm_swap_io_file_open(path, 1 << 20, 0, &io, &step);
		if (r != -EFBIG && r != -ENOSPC)
			_exit(11);
		if (step != KVMM_SWAP_STEP_PREALLOCATE)
			_exit(12);
		if (access(path, F_OK) == 0)
			_exit(13);
		r = kvmm_swap_io_file_open(path, 1 << 20, KVMM_SWAP_OPEN_UNLINK, &io, &step);
		if ((r != -EFBIG && r != -ENOSPC) || step != KVMM_SWAP_STEP_PREALLOCATE || access(path, F_OK) == 0)
			_exit(14);
		/* within the limit it works */
		if (kvmm_swap_io_file_open(path, 32 << 10, KVMM_SWAP_OPEN_UNLINK, &io, &step) != 0)
			_exit(15);
		kvmm_swap_io_free(io);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	free_swap_path(path);
}

/* What the swap error handler was told. */
struct incidents {
	int n;
	struct kvmm_swap_incident last;
};

static void record_incident(void *ud, const struct kvmm_swap_incident *inc)
{
	struct incidents *r = ud;

	r->n++;
	r->last = *inc;
}

static void test_swap_out_faults_leave_sequence_resident(void **state)
{
	int errs[3] = {-EIO, -ENOSPC, KVMM_IO_FAULT_SHORT};

	(void)state;
	for (int k = 0; k < 3; k++) {
		struct kvmm_swap_io *f;
		struct kvmm *m = make_swap(4, 16, 16, &f);
		uint32_t a = new_seq(m);
		int32_t t[20];
		struct kvmm_io_fault fault = {.after = 2, .ops_mask = 1u << KVMM_IO_WRITE, .count = 1, .error = errs[k]};
		struct kvmm_ledger l;
		struct kvmm_seq_record rec;
		struct incidents inc = {0};

		iota(t, 20, 9);
		assert_int_equal(grow(m, a, t, 20), 0);
		kvmm_set_swap_error_handler(m, record_incident, &inc);
		assert_int_equal(kvmm_swap_io_fault_arm(f, &fault), 0);
		assert_int_equal(kvmm_seq_swap_out(m, a), errs[k] < 0 ? errs[k] : -EIO);
		assert_int_equal(kvmm_swap_io_fault_count(f), 1);
		/* one incident, told once, with what failed */
		assert_int_equal(inc.n, 1);
		assert_int_equal(inc.last.what, KVMM_SWAP_SEQ_OUT);
		assert_int_equal(inc.last.op, KVMM_IO_WRITE);
		assert_int_equal(inc.last.seq, a);
		assert_int_equal(inc.last.error, errs[k] < 0 ? errs[k] : -EIO);
		assert_int_equal(inc.last.pages, 5);
		assert_int_equal(inc.last.pages_failed, 1);
		assert_int_equal(inc.last.short_transfers, errs[k] < 0 ? 0 : 1);
		assert_int_equal(kvmm_seq_is_swapped(m, a), 0);
		assert_int_equal(kvmm_swap_slots_free(m), 16);
		expect_content(m, a, t);
		check(m);
		kvmm_get_ledger(m, &l);
		assert_int_equal(l.swap_errors, 1);
		assert_int_equal(kvmm_seq_ledger(m, a, &rec), 0);
		assert_int_equal(rec.swap_errors, 1);
		/* Disarmed, it works, and nothing more is reported. */
		assert_int_equal(kvmm_swap_io_fault_arm(f, NULL), 0);
		assert_int_equal(kvmm_seq_swap_out(m, a), 0);
		assert_int_equal(kvmm_seq_swap_in(m, a), 0);
		expect_content(m, a, t);
		assert_int_equal(inc.n, 1);
		done(m);
	}
}

static void test_swap_in_faults_leave_sequence_swapped(void **state)
{
	int errs[2] = {-EIO, KVMM_IO_FAULT_SHORT};

	(void)state;
	assert_int_equal(kvmm_swap_io_fault_arm(NULL, NULL), -EINVAL);
	for (int k = 0; k < 2; k++) {
		struct kvmm_swap_io *f;
		struct kvmm *m = make_swap(4, 16, 16, &f);
		uint32_t a = new_seq(m);
		int32_t t[20];
		struct kvmm_io_fault fault = {.after = 3, .ops_mask = 1u << KVMM_IO_READ, .count = 1, .error = errs[k]};
		struct kvmm_stats st;
		struct incidents inc = {0};
		uint32_t b = new_seq(m);
		int32_t tb[48];

		iota(t, 20, 9);
		assert_int_equal(grow(m, a, t, 20), 0);
		kvmm_set_swap_error_handler(m, record_incident, &inc);
		assert_int_equal(kvmm_seq_swap_out(m, a), 0);
		/* a full swap file is not an I/O error: nothing reported */
		iota(tb, 48, 1000);
		assert_int_equal(grow(m, b, tb, 48), 0); /* 12 pages, 11 slots free */
		assert_int_equal(kvmm_seq_swap_out(m, b), -ENOSPC);
		assert_int_equal(kvmm_seq_free(m, b), 0);
		assert_int_equal(inc.n, 0);
		assert_int_equal(kvmm_swap_io_fault_arm(f, &fault), 0);
		assert_int_equal(kvmm_seq_swap_in(m, a), errs[k] < 0 ? errs[k] : -EIO);
		assert_int_equal(kvmm_seq_is_swapped(m, a), 1);
		assert_int_equal(inc.n, 1);
		assert_int_equal(inc.last.what, KVMM_SWAP_SEQ_IN);
		assert_int_equal(inc.last.op, KVMM_IO_READ);
		assert_int_equal(inc.last.seq, a);
		assert_int_equal(inc.last.pages, 5);
		assert_int_equal(inc.last.pages_failed, 1);
		assert_int_equal(inc.last.short_transfers, errs[k] < 0 ? 0 : 1);
		kvmm_get_stats(m, &st);
		assert_int_equal(st.pages_free, 16);
		assert_int_equal(st.pages_swapped, 5);
		check(m);
		assert_int_equal(kvmm_swap_io_fault_arm(f, NULL), 0);
		overwrite_free_pages(m);
		assert_int_equal(kvmm_seq_swap_in(m, a), 0);
		expect_content(m, a, t);
		done(m);
	}
}

static void test_swap_in_needs_room(void **state)
{
	struct kvmm *m = make_swap(4, 4, 16, NULL);
	uint32_t a = new_seq(m), b = new_seq(m);
	int32_t t[16];

	(void)state;
	iota(t, 16, 0);
	assert_int_equal(grow(m, a, t, 12), 0);
	assert_int_equal(kvmm_seq_swap_out(m, a), 0);
	assert_int_equal(grow(m, b, t, 8), 0);
	assert_int_equal(kvmm_seq_swap_in(m, a), -ENOMEM);
	assert_int_equal(kvmm_seq_is_swapped(m, a), 1);
	assert_int_equal(kvmm_seq_free(m, b), 0);
	assert_int_equal(kvmm_seq_swap_in(m, a), 0);
	expect_content(m, a, t);
	done(m);
}

static void test_swap_without_store(void **state)
{
	struct kvmm *m = make(4, 4);
	uint32_t a = new_seq(m), n = 5;

	(void)state;
	assert_int_equal(kvmm_seq_swap_out(m, a), -ENODEV);
	assert_int_equal(kvmm_seq_swap_out(m, 999), -ENOENT);
	assert_int_equal(kvmm_seq_swap_in(m, a), -EALREADY);
	assert_int_equal(kvmm_cache_demote(m, 4, &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(kvmm_swap_slots(m), 0);
	done(m);
}

static void test_swap_in_remaps_cached_pages(void **state)
{
	struct kvmm *m = make_swap(4, 16, 16, NULL);
	uint32_t a = new_seq(m), b, hit;
	int32_t t[14];
	struct kvmm_ledger l;

	(void)state;
	iota(t, 14, 0);
	assert_int_equal(grow(m, a, t, 14), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_seq_swap_out(m, a), 0);
	/* The 3 published pages stayed cached: swap-in maps them, reads 1. */
	assert_int_equal(kvmm_seq_swap_in(m, a), 0);
	kvmm_get_ledger(m, &l);
	assert_int_equal(l.swap_in_remapped_pages, 3);
	assert_int_equal(l.swap_in_pages, 1);
	expect_content(m, a, t);
	/* Now with the cache emptied meanwhile: all are read and re-indexed. */
	assert_int_equal(kvmm_seq_swap_out(m, a), 0);
	assert_int_equal(kvmm_cache_evict(m, 100, NULL), 0);
	overwrite_free_pages(m);
	assert_int_equal(kvmm_seq_swap_in(m, a), 0);
	expect_content(m, a, t);
	b = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 14, &hit), 0);
	assert_int_equal(hit, 12);
	expect_content(m, b, t);
	done(m);
}

static void test_demote_and_promote(void **state)
{
	struct kvmm_swap_io *f;
	struct kvmm *m = make_swap(4, 16, 8, &f);
	uint32_t a = new_seq(m), b, n = 0, hit;
	int32_t t[16];
	struct kvmm_stats st;
	struct kvmm_ledger l;

	(void)state;
	iota(t, 16, 40);
	assert_int_equal(grow(m, a, t, 16), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	assert_int_equal(kvmm_cache_demote(m, 3, &n), 0);
	assert_int_equal(n, 3);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 1);
	assert_int_equal(st.pages_demoted, 3);
	assert_int_equal(st.pages_swapped, 3);
	assert_int_equal(st.pages_free, 15);
	check(m);
	overwrite_free_pages(m);
	b = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 16, &hit), 0);
	assert_int_equal(hit, 15);
	expect_content(m, b, t);
	kvmm_get_ledger(m, &l);
	assert_int_equal(l.pages_demoted, 3);
	assert_int_equal(l.pages_promoted, 3);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_demoted, 0);
	assert_int_equal(kvmm_seq_free(m, b), 0);

	/* A failed read during promotion cuts the hit there and drops the
	 * entry (and what hangs below it); the pool stays consistent. */
	assert_int_equal(kvmm_cache_demote(m, 4, &n), 0);
	assert_int_equal(n, 4);
	{
		struct kvmm_io_fault fault = {.after = 2, .ops_mask = 1u << KVMM_IO_READ, .count = 1, .error = -EIO};

		assert_int_equal(kvmm_swap_io_fault_arm(f, &fault), 0);
	}
	b = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 16, &hit), 0);
	assert_int_equal(hit, 8);
	expect_content(m, b, t);
	check(m);
	assert_int_equal(kvmm_swap_io_fault_arm(f, NULL), 0);
	/* A failed write during demotion keeps the page in memory. */
	assert_int_equal(kvmm_seq_free(m, b), 0);
	{
		struct kvmm_io_fault fault = {.after = 0, .ops_mask = 1u << KVMM_IO_WRITE, .count = 1, .error = -EIO};

		assert_int_equal(kvmm_swap_io_fault_arm(f, &fault), 0);
		n = 77;
		assert_int_equal(kvmm_cache_demote(m, 2, &n), -EIO);
		assert_int_equal(n, 77);
	}
	check(m);
	assert_int_equal(kvmm_swap_io_fault_arm(f, NULL), 0);
	b = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 16, &hit), 0);
	assert_int_equal(hit, 8);
	expect_content(m, b, t);
	done(m);
}

static void test_swap_out_takes_slots_from_demoted(void **state)
{
	struct kvmm *m = make_swap(4, 16, 4, NULL);
	uint32_t a = new_seq(m), b = new_seq(m), n, hit;
	int32_t t[16], u[12];
	struct kvmm_ledger l;

	(void)state;
	iota(t, 16, 0);
	iota(u, 12, 900);
	assert_int_equal(grow(m, a, t, 16), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	assert_int_equal(kvmm_cache_demote(m, 4, &n), 0);
	assert_int_equal(n, 4);
	assert_int_equal(kvmm_swap_slots_free(m), 0);
	assert_int_equal(grow(m, b, u, 12), 0);
	assert_int_equal(kvmm_seq_swap_out(m, b), 0); /* drops 3 demoted entries */
	kvmm_get_ledger(m, &l);
	assert_true(l.demoted_dropped >= 3);
	assert_int_equal(kvmm_seq_swap_in(m, b), 0);
	expect_content(m, b, u);
	a = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, a, t, 16, &hit), 0);
	assert_true(hit <= 4);
	expect_content(m, a, t);
	done(m);
}

static void test_swap_in_reindexes_shared_pages(void **state)
{
	/* A page that only swapped-out sequences hold loses its index entry
	 * when its parent is evicted; swap-in enters it again. */
	struct kvmm *m = make_swap(4, 16, 16, NULL);
	uint32_t d = new_seq(m), s = new_seq(m), t, x, hit, dropped;
	int32_t tok[9];
	struct kvmm_stats st;

	(void)state;
	iota(tok, 9, 300);
	assert_int_equal(grow(m, d, tok, 4), 0);
	assert_int_equal(kvmm_seq_publish(m, d), 0);
	assert_int_equal(kvmm_seq_free(m, d), 0);
	assert_int_equal(grow(m, s, tok, 8), 0); /* computed again, not attached */
	assert_int_equal(kvmm_seq_fork(m, s, &t), 0);
	assert_int_equal(kvmm_seq_publish(m, s), 0); /* page 0 deduplicated, page 1 indexed (shared with t) */
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_shared, 1);
	check(m);
	assert_int_equal(kvmm_seq_swap_out(m, s), 0);
	assert_int_equal(kvmm_seq_swap_out(m, t), 0);
	assert_int_equal(kvmm_cache_evict(m, 100, &dropped), 0);
	assert_int_equal(dropped, 1);
	check(m);
	overwrite_free_pages(m);
	assert_int_equal(kvmm_seq_swap_in(m, s), 0);
	assert_int_equal(kvmm_seq_swap_in(m, t), 0);
	expect_content(m, s, tok);
	expect_content(m, t, tok);
	x = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, x, tok, 9, &hit), 0);
	assert_int_equal(hit, 8);
	expect_content(m, x, tok);
	done(m);
}

static void test_promotion_failure_mid_chain(void **state)
{
	/* Chain: page 0 cached, page 1 demoted, page 2 cached. The read of
	 * page 1 fails: the hit stops at page 0 and page 2 (now unreachable)
	 * is dropped with it. */
	struct kvmm_swap_io *f;
	struct kvmm *m = make_swap(4, 16, 8, &f);
	uint32_t a = new_seq(m), b, n = 0, hit;
	int32_t t[13];
	struct kvmm_io_fault wfail = {.after = 0, .ops_mask = 1u << KVMM_IO_WRITE, .count = 1, .error = -EIO};
	struct kvmm_io_fault rfail = {.after = 0, .ops_mask = 1u << KVMM_IO_READ, .count = 1, .error = -EIO};
	struct kvmm_stats st;
	struct incidents inc = {0};

	(void)state;
	kvmm_set_swap_error_handler(m, record_incident, &inc);
	iota(t, 13, 70);
	assert_int_equal(grow(m, a, t, 12), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	/* Demote the two coldest (pages 2 and 1); page 2's write fails and it
	 * goes back to the cold end in memory. */
	assert_int_equal(kvmm_swap_io_fault_arm(f, &wfail), 0);
	assert_int_equal(kvmm_cache_demote(m, 2, &n), -EIO);
	assert_int_equal(inc.n, 1);
	assert_int_equal(inc.last.what, KVMM_SWAP_DEMOTE);
	assert_int_equal(inc.last.seq, -1);
	assert_int_equal(inc.last.pages, 2);
	assert_int_equal(inc.last.pages_failed, 1);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_demoted, 1);
	assert_int_equal(st.pages_cached, 2);
	assert_int_equal(kvmm_swap_io_fault_arm(f, &rfail), 0);
	b = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 13, &hit), 0);
	assert_int_equal(hit, 4);
	assert_int_equal(inc.n, 2);
	assert_int_equal(inc.last.what, KVMM_SWAP_PROMOTE);
	assert_int_equal(inc.last.op, KVMM_IO_READ);
	assert_int_equal(inc.last.error, -EIO);
	expect_content(m, b, t);
	check(m);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_demoted, 0);
	assert_int_equal(st.pages_cached, 0);
	assert_int_equal(kvmm_swap_io_fault_arm(f, NULL), 0);
	done(m);
}

static void test_unkeyed_growth_is_never_indexed(void **state)
{
	struct kvmm *m = make(4, 8);
	uint32_t a = new_seq(m), b = new_seq(m), hit;
	int32_t t[8];
	struct kvmm_grow g = {a, 8, NULL};

	(void)state;
	iota(t, 8, 0);
	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 8, &hit), 0);
	assert_int_equal(hit, 0);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	assert_int_equal(kvmm_available_pages(m), 8);
	done(m);
}

static void test_large_step(void **state)
{
	/* More growths in one step than the commit keeps on its stack. */
	struct kvmm_config c = cfg_of(4, 512);
	struct kvmm *m = NULL;
	struct kvmm_grow g[100];
	uint32_t need, s[100];
	int32_t t[6];

	(void)state;
	c.max_seqs = 100;
	assert_int_equal(kvmm_create(&c, &m), 0);
	iota(t, 6, 1);
	for (int i = 0; i < 100; i++) {
		s[i] = new_seq(m);
		g[i] = (struct kvmm_grow){s[i], 6, t};
	}
	assert_int_equal(kvmm_plan(m, g, 100, &need), 0);
	assert_int_equal(need, 200);
	assert_int_equal(kvmm_commit(m, g, 100), 0);
	for (int i = 0; i < 100; i++)
		assert_int_equal(kvmm_seq_len(m, s[i]), 6);
	done(m);
}

/* ---- metadata memfd, ledger, placement, device pools --------------------------------------------- */

static void test_ledger_and_record(void **state)
{
	struct kvmm *m = make(4, 32);
	uint32_t a = new_seq(m), b = new_seq(m), hit;
	int32_t t[20];
	struct kvmm_seq_record rec;
	struct kvmm_ledger l;
	char buf[2048];
	int n;

	(void)state;
	iota(t, 20, 0);
	assert_int_equal(kvmm_seq_set_prompt_tokens(m, a, 12), 0);
	assert_int_equal(grow(m, a, t, 12), 0);
	assert_int_equal(grow(m, a, t + 12, 1), 0);
	assert_int_equal(grow(m, a, t + 13, 1), 0);
	assert_int_equal(kvmm_seq_publish(m, a), 0);
	assert_int_equal(kvmm_seq_add_time(m, a, 1000, 5000), 0);
	assert_int_equal(kvmm_seq_ledger(m, a, &rec), 0);
	assert_int_equal(rec.len_tokens, 14);
	assert_int_equal(rec.pages, 4);
	assert_int_equal(rec.slack_tokens, 2);
	assert_int_equal(rec.steps, 3);
	assert_int_equal(rec.kv_read_bytes, (12 + 13 + 14) * TB);
	kvmm_get_ledger(m, &l);
	assert_int_equal(l.kv_read_bytes_last_step, 14 * TB);
	assert_int_equal(l.kv_bytes_allocated, 4 * 4 * TB);
	assert_int_equal(l.kv_bytes_useful, 14 * TB);
	assert_int_equal(kvmm_prefix_attach(m, b, t, 14, &hit), 0);
	assert_int_equal(hit, 12);
	assert_int_equal(kvmm_seq_finish(m, a, &rec), 0);
	assert_int_equal(rec.prompt_tokens, 12);
	assert_int_equal(rec.generated_tokens, 2);
	assert_int_equal(rec.retained_tokens, 12);
	assert_int_equal(rec.mem_wait_ns, 1000);
	assert_int_equal(rec.compute_ns, 5000);
	assert_int_equal(rec.pages_allocated, 4);
	n = kvmm_seq_record_json(&rec, buf, sizeof(buf));
	assert_true(n > 0 && (size_t)n == strlen(buf));
	assert_non_null(strstr(buf, "\"prompt_tokens\":12,"));
	assert_non_null(strstr(buf, "\"retained_tokens\":12,"));
	assert_int_equal(kvmm_seq_record_json(&rec, buf, 10), -ENOBUFS);
	assert_int_equal(kvmm_seq_finish(m, b, &rec), 0);
	assert_int_equal(rec.shared_prefix_tokens, 12);
	kvmm_get_ledger(m, &l);
	assert_int_equal(l.seqs_created, 2);
	assert_int_equal(l.seqs_finished, 2);
	assert_int_equal(l.prompt_tokens, 12 + 12);
	assert_int_equal(l.generated_tokens, 2);
	assert_int_equal(l.shared_prefix_tokens, 12);
	assert_int_equal(l.mem_wait_ns, 1000);
	assert_int_equal(kvmm_seq_set_prompt_tokens(m, a, 1), -ENOENT);
	assert_int_equal(kvmm_seq_add_time(m, a, 1, 1), -ENOENT);
	assert_int_equal(kvmm_seq_ledger(m, a, &rec), -ENOENT);
	done(m);
}

static void hand_out_order(uint64_t seed, int32_t *order, uint32_t n)
{
	struct kvmm_config c = cfg_of(1, n);
	struct kvmm *m = NULL;
	uint32_t s, np;
	int32_t t[64] = {0};

	c.shuffle_seed = seed;
	assert_int_equal(kvmm_create(&c, &m), 0);
	s = new_seq(m);
	assert_int_equal(grow(m, s, t, n), 0);
	memcpy(order, kvmm_seq_pages(m, s, &np), n * sizeof(int32_t));
	done(m);
}

static void test_shuffle_seed_scrambles_placement(void **state)
{
	int32_t a[64], b[64], c[64];
	bool ascending = true;

	(void)state;
	hand_out_order(0, a, 64);
	for (int i = 0; i < 64; i++)
		ascending &= a[i] == i;
	assert_true(ascending);
	hand_out_order(42, b, 64);
	hand_out_order(42, c, 64);
	assert_memory_equal(b, c, sizeof(b));
	assert_memory_not_equal(a, b, sizeof(a));
}

struct device {
	char *mem;
	size_t pb;
	int copies, reads, writes;
};

static int dev_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n)
{
	struct device *d = ud;

	d->copies++;
	memcpy(d->mem + dst * d->pb, d->mem + src * d->pb, n * TB);
	return 0;
}

static int dev_read(void *ud, uint32_t page, void *host)
{
	struct device *d = ud;

	d->reads++;
	memcpy(host, d->mem + page * d->pb, d->pb);
	return 0;
}

static int dev_write(void *ud, uint32_t page, const void *host)
{
	struct device *d = ud;

	d->writes++;
	memcpy(d->mem + page * d->pb, host, d->pb);
	return 0;
}

static void test_device_pool_swaps_through_callbacks(void **state)
{
	struct kvmm_config c = cfg_of(4, 8);
	struct device d = {.pb = 4 * TB};
	struct kvmm_swap_io *io = NULL;
	struct kvmm *m = NULL;
	uint32_t a, b, np;
	const int32_t *p;
	char saved[8][4 * TB];

	(void)state;
	d.mem = calloc(8, d.pb);
	assert_non_null(d.mem);
	c.page_ops = (struct kvmm_page_ops){.copy = dev_copy, .read = dev_read, .write = dev_write, .ud = &d};
	assert_int_equal(kvmm_swap_io_mem_new(64 * TB * 4, &io), 0);
	assert_int_equal(kvmm_create_with_io(&c, io, &m), 0);
	assert_null(kvmm_pool_base(m));
	assert_int_equal(kvmm_pool_fd(m), -1);
	a = new_seq(m);
	{
		int32_t t[10];
		struct kvmm_grow g = {a, 10, t};

		iota(t, 10, 0);
		assert_int_equal(kvmm_commit(m, &g, 1), 0);
	}
	p = kvmm_seq_pages(m, a, &np);
	for (uint32_t i = 0; i < np; i++) {
		memset(d.mem + p[i] * d.pb, 'A' + (int)i, d.pb);
		memcpy(saved[i], d.mem + p[i] * d.pb, d.pb);
	}
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	{
		int32_t t = 5;
		struct kvmm_grow g = {b, 1, &t};

		assert_int_equal(kvmm_commit(m, &g, 1), 0);
		assert_int_equal(d.copies, 1);
		assert_int_equal(kvmm_seq_free(m, b), 0);
	}
	assert_int_equal(kvmm_seq_swap_out(m, a), 0);
	assert_int_equal(d.reads, 3);
	memset(d.mem, 0, 8 * d.pb);
	assert_int_equal(kvmm_seq_swap_in(m, a), 0);
	assert_int_equal(d.writes, 3);
	p = kvmm_seq_pages(m, a, &np);
	for (uint32_t i = 0; i < np; i++)
		assert_memory_equal(d.mem + p[i] * d.pb, saved[i], d.pb);
	done(m);
	free(d.mem);
	c.page_ops.copy = NULL; /* a device pool needs the copy hook */
	assert_int_equal(kvmm_create(&c, &m), -EINVAL);
}

/* A device whose batched callbacks count their calls and the pages in them;
 * the per-page ones count too, and the test expects them unused. */
struct bdevice {
	struct device d;
	int read_batches, write_batches;
	uint32_t read_pages, write_pages;
	int fail_read_n, fail_write_n; /* -errno to return from the next batch */
};

static int bdev_read_n(void *ud, const uint32_t *pages, uint32_t n, void *host)
{
	struct bdevice *b = ud;

	b->read_batches++;
	if (b->fail_read_n) {
		int r = b->fail_read_n;

		b->fail_read_n = 0;
		return r;
	}
	for (uint32_t i = 0; i < n; i++)
		memcpy((char *)host + i * b->d.pb, b->d.mem + pages[i] * b->d.pb, b->d.pb);
	b->read_pages += n;
	return 0;
}

static int bdev_write_n(void *ud, const uint32_t *pages, uint32_t n, const void *host)
{
	struct bdevice *b = ud;

	b->write_batches++;
	if (b->fail_write_n) {
		int r = b->fail_write_n;

		b->fail_write_n = 0;
		return r;
	}
	for (uint32_t i = 0; i < n; i++)
		memcpy(b->d.mem + pages[i] * b->d.pb, (const char *)host + i * b->d.pb, b->d.pb);
	b->write_pages += n;
	return 0;
}

/*
 * A device pool with batched page_ops: a sequence of n pages swaps out with
 * one read_n of n pages and back in with one write_n, never page by page,
 * and its content survives exactly; with a store whose alignment makes a
 * slot larger than a page (align 64, pages of 32 bytes) as well as with slots
 * of exactly one page. A failed batch fails the whole operation and leaves
 * the sequence where it was.
 */
static void test_device_pool_batches_swap(void **state)
{
	(void)state;
	for (int aligned = 0; aligned < 2; aligned++) {
		struct kvmm_config c = cfg_of(4, 16);
		struct bdevice b = {.d = {.pb = 4 * TB}};
		struct kvmm_swap_io *io = NULL;
		struct kvmm *m = NULL;
		uint32_t a, np;
		const int32_t *p;
		char saved[6][4 * TB];
		int32_t t[22];
		struct kvmm_grow g = {0, 22, t};

		b.d.mem = calloc(16, b.d.pb);
		assert_non_null(b.d.mem);
		c.page_ops = (struct kvmm_page_ops){.copy = dev_copy, .read = dev_read, .write = dev_write,
						    .read_n = bdev_read_n, .write_n = bdev_write_n, .ud = &b};
		assert_int_equal(kvmm_swap_io_mem_new(64 * 64, &io), 0);
		if (aligned)
			io->align = 64; /* the memory store takes any alignment it is told */
		assert_int_equal(kvmm_create_with_io(&c, io, &m), 0);
		a = new_seq(m);
		g.seq = a;
		iota(t, 22, 100);
		assert_int_equal(kvmm_commit(m, &g, 1), 0);
		p = kvmm_seq_pages(m, a, &np);
		assert_int_equal(np, 6);
		for (uint32_t i = 0; i < np; i++) {
			for (size_t k = 0; k < b.d.pb; k++)
				b.d.mem[p[i] * b.d.pb + k] = (char)(i * 37 + k * 3 + 1);
			memcpy(saved[i], b.d.mem + p[i] * b.d.pb, b.d.pb);
		}

		/* a failed batched read: nothing written, the sequence stays resident */
		b.fail_read_n = -EIO;
		assert_int_equal(kvmm_seq_swap_out(m, a), -EIO);
		assert_int_equal(b.read_batches, 1);
		assert_int_equal(kvmm_seq_len(m, a), 22);
		p = kvmm_seq_pages(m, a, &np);
		for (uint32_t i = 0; i < np; i++)
			assert_true(p[i] >= 0);

		assert_int_equal(kvmm_seq_swap_out(m, a), 0);
		assert_int_equal(b.read_batches, 2);
		assert_int_equal(b.read_pages, 6);
		memset(b.d.mem, 0, 16 * b.d.pb);

		/* a failed batched write: the sequence stays swapped out */
		b.fail_write_n = -EIO;
		assert_int_equal(kvmm_seq_swap_in(m, a), -EIO);
		assert_int_equal(b.write_batches, 1);
		p = kvmm_seq_pages(m, a, &np);
		for (uint32_t i = 0; i < np; i++)
			assert_int_equal(p[i], -1);

		assert_int_equal(kvmm_seq_swap_in(m, a), 0);
		assert_int_equal(b.write_batches, 2);
		assert_int_equal(b.write_pages, 6);
		assert_int_equal(b.d.reads, 0); /* never page by page */
		assert_int_equal(b.d.writes, 0);
		p = kvmm_seq_pages(m, a, &np);
		for (uint32_t i = 0; i < np; i++)
			assert_memory_equal(b.d.mem + p[i] * b.d.pb, saved[i], b.d.pb);
		done(m);
		free(b.d.mem);
	}
	{
		/* batched callbacks come in pairs, and only with a device pool */
		struct kvmm_config c = cfg_of(4, 8);
		struct kvmm *m = NULL;

		c.page_ops = (struct kvmm_page_ops){.copy = dev_copy, .read = dev_read, .write = dev_write,
						    .read_n = bdev_read_n};
		assert_int_equal(kvmm_create(&c, &m), -EINVAL);
		c.page_ops = (struct kvmm_page_ops){.read_n = bdev_read_n, .write_n = bdev_write_n};
		assert_int_equal(kvmm_create(&c, &m), -EINVAL);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_rejects_bad_config),
		cmocka_unit_test(test_create_by_fraction),
		cmocka_unit_test(test_seq_new_free_limits),
		cmocka_unit_test(test_commit_allocates_on_growth),
		cmocka_unit_test(test_plan_commit_all_or_nothing),
		cmocka_unit_test(test_fork_shares_and_cow_copies),
		cmocka_unit_test(test_truncate_cuts_tail_keeps_shared_head),
		cmocka_unit_test(test_cow_in_one_step_copies_once),
		cmocka_unit_test(test_commit_copy_failure_changes_nothing),
		cmocka_unit_test(test_publish_and_attach),
		cmocka_unit_test(test_attach_block_size_one),
		cmocka_unit_test(test_prefix_scopes_never_cross),
		cmocka_unit_test(test_hash_collisions_never_map_wrong_pages),
		cmocka_unit_test(test_lru_reclaims_only_when_free_list_empty_tails_first),
		cmocka_unit_test(test_evict_drops_subtrees),
		cmocka_unit_test(test_prefix_cache_off),
		cmocka_unit_test(test_swap_roundtrip_memory_store),
		cmocka_unit_test(test_swap_roundtrip_io_uring_file),
		cmocka_unit_test(test_swap_by_config_path_and_direct_pool_io),
		cmocka_unit_test(test_swap_out_faults_leave_sequence_resident),
		cmocka_unit_test(test_swap_in_faults_leave_sequence_swapped),
		cmocka_unit_test(test_swap_in_needs_room),
		cmocka_unit_test(test_swap_without_store),
		cmocka_unit_test(test_swap_in_remaps_cached_pages),
		cmocka_unit_test(test_demote_and_promote),
		cmocka_unit_test(test_swap_out_takes_slots_from_demoted),
		cmocka_unit_test(test_swap_in_reindexes_shared_pages),
		cmocka_unit_test(test_promotion_failure_mid_chain),
		cmocka_unit_test(test_unkeyed_growth_is_never_indexed),
		cmocka_unit_test(test_large_step),
		cmocka_unit_test(test_ledger_and_record),
		cmocka_unit_test(test_swap_file_refuses_existing_file),
		cmocka_unit_test(test_swap_file_refuses_symlink),
		cmocka_unit_test(test_swap_file_preallocation_failure),
		cmocka_unit_test(test_shuffle_seed_scrambles_placement),
		cmocka_unit_test(test_device_pool_swaps_through_callbacks),
		cmocka_unit_test(test_device_pool_batches_swap),
	};

	return cmocka_run_group_tests_name("kvmm", tests, NULL, NULL);
}
