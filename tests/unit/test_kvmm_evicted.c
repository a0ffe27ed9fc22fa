/*
 * tests/unit/test_kvmm_evicted.c — cmocka tests of the prefix index's
 * memory of dropped pages (kvmm_seq_record.evicted_prefix_tokens): a
 * prompt whose identical prefix was cached and evicted counts the tokens
 * it recomputes; a hit, a never-seen prompt and another scope's eviction
 * count nothing; a partial eviction counts only the dropped tail; the
 * memory is bounded and keeps the latest evictions; it names the owner
 * whose allocation evicted the page (kvmm_seq_record.evicted_prefix_by),
 * another owner or the same, and no one for an explicit drop.
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

#include "kvmm.h"

#define BS 4u

static struct kvmm *make(uint32_t n_pages)
{
	struct kvmm_config c = {
		.page_bytes = BS * 8, .block_size = BS, .pool_bytes = (uint64_t)n_pages * BS * 8,
		.max_seqs = 8, .prefix_cache = 1,
	};
	struct kvmm *m = NULL;

	assert_int_equal(kvmm_create(&c, &m), 0);
	return m;
}

static void done(struct kvmm *m)
{
	char why[256];

	if (kvmm_check(m, why, sizeof(why)))
		fail_msg("kvmm_check: %s", why);
	assert_null(kvmm_destroy(m));
}

/* A request of owner in scope: attach the prompt, compute the rest,
 * publish, finish. Returns its evicted_prefix_tokens; *ret_hit gets the
 * cached tokens, *ret_by (when not NULL) its evicted_prefix_by. */
static uint32_t request_as(struct kvmm *m, uint64_t scope, uint32_t owner, const int32_t *t, uint32_t n,
			   uint32_t *ret_hit, uint32_t *ret_by)
{
	struct kvmm_seq_record rec;
	uint32_t s, hit = 0;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	assert_int_equal(kvmm_seq_set_scope(m, s, scope), 0);
	if (owner != KVMM_OWNER_NONE)
		assert_int_equal(kvmm_seq_set_owner(m, s, owner), 0);
	assert_int_equal(kvmm_prefix_attach(m, s, t, n, &hit), 0);
	struct kvmm_grow g = { s, n - hit, t + hit };
	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	assert_int_equal(kvmm_seq_publish(m, s), 0);
	assert_int_equal(kvmm_seq_finish(m, s, &rec), 0);
	if (ret_hit)
		*ret_hit = hit;
	if (ret_by)
		*ret_by = rec.evicted_prefix_by;
	if (!rec.evicted_prefix_tokens)
		assert_int_equal(rec.evicted_prefix_by, KVMM_OWNER_NONE);
	return rec.evicted_prefix_tokens;
}

static uint32_t request(struct kvmm *m, uint64_t scope, const int32_t *t, uint32_t n, uint32_t *ret_hit)
{
	return request_as(m, scope, KVMM_OWNER_NONE, t, n, ret_hit, NULL);
}

static void iota(int32_t *t, uint32_t n, int32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + (int32_t)i;
}

static void test_recompute_after_eviction_counted(void **state)
{
	struct kvmm *m = make(32);
	int32_t t[13], u[13];
	uint32_t hit, dropped;

	(void)state;
	iota(t, 13, 100);
	iota(u, 13, 500);
	assert_int_equal(request(m, 7, t, 13, &hit), 0); /* first time: nothing evicted */
	assert_int_equal(hit, 0);
	assert_int_equal(request(m, 7, t, 13, &hit), 0); /* a hit recomputes nothing */
	assert_int_equal(hit, 12);
	assert_int_equal(kvmm_cache_evict(m, 100, &dropped), 0);
	assert_int_equal(dropped, 3);
	/* all three pages were dropped: their 12 tokens are computed again */
	assert_int_equal(request(m, 7, t, 13, &hit), 12);
	assert_int_equal(hit, 0);
	/* another scope never had them; a prompt never seen is not counted */
	assert_int_equal(kvmm_cache_evict(m, 100, &dropped), 0);
	assert_int_equal(request(m, 8, t, 13, &hit), 0);
	assert_int_equal(request(m, 7, u, 13, &hit), 0);
	/* only the prompt's whole pages below its last token count: 9 tokens
	 * take two pages and one token of the third, of which 8 are keyable */
	assert_int_equal(kvmm_cache_evict(m, 100, &dropped), 0);
	assert_int_equal(request(m, 7, t, 9, &hit), 8);
	done(m);
}

static void test_partial_eviction_counts_the_tail(void **state)
{
	struct kvmm *m = make(32);
	int32_t t[17];
	uint32_t hit, dropped;

	(void)state;
	iota(t, 17, 40);
	assert_int_equal(request(m, 1, t, 17, &hit), 0);
	/* tails go first: one page evicted leaves the first three cached */
	assert_int_equal(kvmm_cache_evict(m, 1, &dropped), 0);
	assert_int_equal(dropped, 1);
	assert_int_equal(request(m, 1, t, 17, &hit), 4);
	assert_int_equal(hit, 12);
	/* a longer prompt: the evicted chain ends where the cached one did */
	int32_t v[25];
	memcpy(v, t, sizeof(t));
	iota(v + 17, 8, 900);
	assert_int_equal(request(m, 1, v, 25, &hit), 0); /* all 16 cached again now */
	assert_int_equal(hit, 16);
	done(m);
}

static void test_memory_is_bounded_and_keeps_the_latest(void **state)
{
	struct kvmm *m = make(8);
	int32_t t[5];
	uint32_t hit, dropped;

	(void)state;
	/* far more dropped pages than the memory's 512 entries */
	for (int32_t k = 0; k < 5000; k++) {
		iota(t, 5, 10 * k);
		request(m, 3, t, 5, &hit);
		assert_int_equal(kvmm_cache_evict(m, 8, &dropped), 0);
	}
	iota(t, 5, 10 * 4999);
	assert_int_equal(request(m, 3, t, 5, &hit), 4); /* the latest is remembered */
	uint32_t forgotten = 0;
	for (int32_t k = 0; k < 100; k++) {
		assert_int_equal(kvmm_cache_evict(m, 8, &dropped), 0);
		iota(t, 5, 10 * k);
		forgotten += request(m, 3, t, 5, &hit) == 0;
	}
	assert_true(forgotten > 50); /* the oldest mostly are not */
	done(m);
}

/* Eight pages: A's 13-token prompt caches three; B's 32-token prompt needs
 * all eight, so its allocations reclaim A's; then A recomputes 12 tokens
 * that B evicted. A's own long prompt evicting its short one names A. */
static void test_evictor_is_the_allocating_owner(void **state)
{
	struct kvmm *m = make(8);
	int32_t a[13], along[32], b[32];
	uint32_t hit, by, dropped, s, c;

	(void)state;
	iota(a, 13, 100);
	iota(along, 32, 3000);
	iota(b, 32, 7000);
	assert_int_equal(kvmm_seq_set_owner(m, 999, 1), -ENOENT);
	assert_int_equal(request_as(m, 1, 1000, a, 13, &hit, &by), 0);
	assert_int_equal(by, KVMM_OWNER_NONE); /* nothing evicted: no evictor */
	assert_int_equal(request_as(m, 2, 2000, b, 32, &hit, &by), 0); /* another owner, another scope */
	assert_int_equal(request_as(m, 1, 1000, a, 13, &hit, &by), 12);
	assert_int_equal(hit, 0);
	assert_int_equal(by, 2000);
	/* self-eviction: A's long prompt reclaims A's short one */
	assert_int_equal(request_as(m, 1, 1000, along, 32, &hit, &by), 0);
	assert_int_equal(request_as(m, 1, 1000, a, 13, &hit, &by), 12);
	assert_int_equal(by, 1000);
	/* an explicit drop has no requester to name */
	assert_int_equal(kvmm_cache_evict(m, 100, &dropped), 0);
	assert_true(dropped >= 3);
	assert_int_equal(request_as(m, 1, 1000, a, 13, &hit, &by), 12);
	assert_int_equal(by, KVMM_OWNER_NONE);
	/* a sequence with no owner evicts as no one; a fork inherits the owner */
	iota(b, 32, 9000); /* never sent: nothing of its own evicted */
	assert_int_equal(request_as(m, 2, KVMM_OWNER_NONE, b, 32, &hit, &by), 0);
	assert_int_equal(request_as(m, 1, 1000, a, 13, &hit, &by), 12);
	assert_int_equal(by, KVMM_OWNER_NONE);
	assert_int_equal(kvmm_seq_new(m, &s), 0);
	assert_int_equal(kvmm_seq_set_owner(m, s, 3000), 0);
	assert_int_equal(kvmm_seq_set_scope(m, s, 2), 0);
	assert_int_equal(kvmm_seq_fork(m, s, &c), 0);
	struct kvmm_grow g = { c, 32, b };
	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	assert_int_equal(kvmm_seq_finish(m, c, NULL), 0);
	assert_int_equal(kvmm_seq_finish(m, s, NULL), 0);
	assert_int_equal(request_as(m, 1, 1000, a, 13, &hit, &by), 12);
	assert_int_equal(by, 3000);
	done(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_recompute_after_eviction_counted),
		cmocka_unit_test(test_partial_eviction_counts_the_tail),
		cmocka_unit_test(test_memory_is_bounded_and_keeps_the_latest),
		cmocka_unit_test(test_evictor_is_the_allocating_owner),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
