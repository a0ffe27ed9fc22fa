/*
 * tests/unit/test_kvmm_hibernate_sums.c — cmocka tests of the page
 * checksums kvmm keeps for hibernation (kvmm_page.sum): a page computed in
 * this run gets its checksum when it enters the prefix index, an adopted
 * page keeps the one verified at adoption, and pages from the fd-store
 * hand-over get theirs at the first save, so a save re-hashes nothing it
 * already knows (kvmm_hib_save_stats.pages_hashed). A kept checksum is
 * never stale: after a drop, an eviction, a demotion and promotion, and a
 * demoted twin replaced by a page computed again with other bytes, each
 * re-used page's checksum is its new content's (kvmm_check verifies every
 * kept checksum against the page's bytes; the file then adopts with no page
 * refused and with the new content). A write into an indexed page, which
 * kvmm forbids, is caught by kvmm_check and by adoption (the page is
 * refused, never served). Where the file system allows it, the file's
 * blocks are allocated before the page writes.
 *
 * As in test_kvmm_hibernate.c, the test plays the engine: every token slot
 * holds a function of its token id, position and a salt, written at commit.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvmm.h"

#define TB 8
#define BS 4
#define N_PAGES 32
#define OWNER "model=a;layout=b"

static char dir[64], path[128], swap_dir[128];

static uint64_t pattern(int32_t tok, uint32_t pos)
{
	uint64_t z = ((uint64_t)(uint32_t)tok << 32 | pos) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static struct kvmm *pool_swap(uint32_t n_pages, int swap)
{
	struct kvmm_config c = {
		.page_bytes = (size_t)BS * TB, .block_size = BS, .pool_bytes = (uint64_t)n_pages * BS * TB,
		.max_seqs = 16, .prefix_cache = 1,
		.swap_path = swap ? swap_dir : NULL, .swap_bytes = swap ? 64ull * 4096 : 0,
	};
	struct kvmm *m = NULL;

	assert_int_equal(kvmm_create(&c, &m), 0);
	return m;
}

static struct kvmm *pool(uint32_t n_pages)
{
	return pool_swap(n_pages, 0);
}

static void check(const struct kvmm *m)
{
	char why[256] = "";

	if (kvmm_check(m, why, sizeof(why)))
		fail_msg("kvmm_check: %s", why);
}

static int32_t tA[17], tB[13], tC[13];

static void prompts(void)
{
	for (int i = 0; i < 17; i++)
		tA[i] = 100 + i;
	memcpy(tB, tA, 8 * sizeof(int32_t));
	for (int i = 8; i < 13; i++)
		tB[i] = 500 + i;
	for (int i = 0; i < 13; i++)
		tC[i] = 900 + i; /* shares nothing with A */
}

/* A sequence in scope 1 holding toks with content salted by salt, published, freed. */
static void fill(struct kvmm *m, const int32_t *toks, uint32_t n, int salt)
{
	struct kvmm_grow g;
	const int32_t *pages;
	uint32_t s, np;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	assert_int_equal(kvmm_seq_set_scope(m, s, 1), 0);
	g = (struct kvmm_grow){s, n, toks};
	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	pages = kvmm_seq_pages(m, s, &np);
	for (uint32_t pos = 0; pos < n; pos++) {
		uint64_t v = pattern(toks[pos] + salt, pos);

		memcpy((char *)kvmm_pool_base(m) + (size_t)pages[pos / BS] * kvmm_page_bytes(m) + (pos % BS) * TB, &v,
		       TB);
	}
	assert_int_equal(kvmm_seq_publish(m, s), 0);
	assert_int_equal(kvmm_seq_free(m, s), 0);
}

/* Tokens a lookup in scope 1 finds; their content must be salt's. */
static uint32_t hit(struct kvmm *m, const int32_t *toks, uint32_t n, int salt)
{
	uint32_t s, got = 0, np;
	const int32_t *pages;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	assert_int_equal(kvmm_seq_set_scope(m, s, 1), 0);
	assert_int_equal(kvmm_prefix_attach(m, s, toks, n, &got), 0);
	pages = kvmm_seq_pages(m, s, &np);
	for (uint32_t pos = 0; pos < got / BS * BS; pos++) {
		uint64_t v;

		memcpy(&v, (const char *)kvmm_pool_base(m) + (size_t)pages[pos / BS] * kvmm_page_bytes(m) + (pos % BS) * TB,
		       TB);
		if (v != pattern(toks[pos] + salt, pos))
			fail_msg("token %u: content differs from salt %d", pos, salt);
	}
	assert_int_equal(kvmm_seq_free(m, s), 0);
	return got;
}

static void save(struct kvmm *m, struct kvmm_hib_save_stats *st)
{
	unlink(path);
	assert_int_equal(kvmm_hib_save(m, path, OWNER, sizeof(OWNER), 1ull << 30, 0, st), 0);
}

/* Adopt the file into a fresh pool: every page must be taken, none refused. */
static struct kvmm *adopt_fresh(uint32_t want)
{
	struct kvmm *b = pool(N_PAGES);
	struct kvmm_hib_progress p = {0};
	struct kvmm_hib *h = NULL;
	int r;

	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	while ((r = kvmm_hib_adopt(b, h, 0, &p)) == 1)
		;
	assert_int_equal(r, 0);
	assert_int_equal(p.refused, 0);
	assert_int_equal(p.adopted, want);
	kvmm_hib_close(h);
	check(b);
	return b;
}

/* Whether the test directory's file system allocates ahead (fallocate). */
static int can_preallocate(void)
{
	char probe[160];
	int fd, ok;

	snprintf(probe, sizeof(probe), "%s/probe", dir);
	fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	ok = fallocate(fd, 0, 0, 65536) == 0;
	close(fd);
	unlink(probe);
	return ok;
}

static void test_sums_taken_once(void **state)
{
	struct kvmm *a = pool(N_PAGES), *b, *c;
	struct kvmm_hib_save_stats st;

	prompts();
	fill(a, tA, 16, 0);
	fill(a, tB, 12, 0);
	check(a);
	save(a, &st);
	assert_int_equal(st.pages_written, 5);
	assert_int_equal(st.pages_hashed, 0); /* all taken when indexed */
	assert_int_equal(st.preallocated, can_preallocate()); /* the blocks before the writes */
	b = adopt_fresh(5);
	save(b, &st); /* adopted pages keep the checksum verified at adoption */
	assert_int_equal(st.pages_written, 5);
	assert_int_equal(st.pages_hashed, 0);
	c = adopt_fresh(5);
	assert_int_equal(hit(c, tA, 17, 0), 16);
	assert_int_equal(hit(c, tB, 13, 0), 12);
	kvmm_destroy(a);
	kvmm_destroy(b);
	kvmm_destroy(c);
}

static void test_fd_store_sums_at_first_save(void **state)
{
	struct kvmm *a = pool(N_PAGES), *b = NULL, *c;
	struct kvmm_config cfg = {
		.page_bytes = (size_t)BS * TB, .block_size = BS, .pool_bytes = (uint64_t)N_PAGES * BS * TB,
		.max_seqs = 16, .prefix_cache = 1,
	};
	struct kvmm_hib_save_stats st;
	void *buf = NULL;
	size_t bytes = 0;
	uint32_t n = 0;
	int fd;

	prompts();
	fill(a, tA, 16, 3);
	fd = dup(kvmm_pool_fd(a));
	assert_true(fd >= 0);
	assert_int_equal(kvmm_prefix_export(a, OWNER, sizeof(OWNER), &buf, &bytes), 0);
	kvmm_destroy(a);
	assert_int_equal(kvmm_create_adopt(&cfg, NULL, fd, N_PAGES, &b), 0);
	assert_int_equal(kvmm_prefix_import(b, buf, bytes, &n), 0);
	assert_int_equal(n, 4);
	check(b);
	save(b, &st); /* not hashed at the hand-over (readiness): here */
	assert_int_equal(st.pages_hashed, 4);
	check(b);
	save(b, &st);
	assert_int_equal(st.pages_hashed, 0);
	c = adopt_fresh(4);
	assert_int_equal(hit(c, tA, 17, 3), 16);
	free(buf);
	kvmm_destroy(b);
	kvmm_destroy(c);
}

static void test_reused_pages_never_stale(void **state)
{
	struct kvmm *a = pool(N_PAGES), *b;
	struct kvmm_hib_save_stats st;
	uint32_t dropped = 0, got = 0;

	prompts();
	fill(a, tA, 16, 0);
	save(a, &st);
	/* Dropped, then the same tokens computed again with other bytes: the
	 * freed pages are taken again (one free list), each gets a new sum. */
	assert_int_equal(kvmm_cache_drop_all(a, &dropped), 0);
	assert_int_equal(dropped, 4);
	check(a);
	fill(a, tA, 16, 11);
	check(a);
	save(a, &st);
	assert_int_equal(st.pages_hashed, 0);
	b = adopt_fresh(4);
	assert_int_equal(hit(b, tA, 17, 11), 16);
	kvmm_destroy(b);
	/* Evicted, then again with other bytes. */
	assert_int_equal(kvmm_cache_evict(a, N_PAGES, &got), 0);
	assert_true(got >= 1);
	fill(a, tA, 16, 12);
	fill(a, tB, 12, 12);
	check(a);
	save(a, &st);
	b = adopt_fresh(5);
	assert_int_equal(hit(b, tA, 17, 12), 16);
	assert_int_equal(hit(b, tB, 13, 12), 12);
	kvmm_destroy(b);
	kvmm_destroy(a);
}

static void test_swap_and_twin_never_stale(void **state)
{
	struct kvmm *a = pool_swap(N_PAGES, 1), *b;
	struct kvmm_hib_save_stats st;
	uint32_t demoted = 0;

	prompts();
	fill(a, tA, 16, 0);
	save(a, &st);
	/* Demoted to swap (the pages freed, re-used below), promoted by a hit
	 * into other pages: their checksums are taken again there. */
	assert_int_equal(kvmm_cache_demote(a, N_PAGES, &demoted), 0);
	assert_int_equal(demoted, 4);
	check(a);
	fill(a, tC, 12, 5); /* takes the freed pages */
	assert_int_equal(hit(a, tA, 17, 0), 16);
	check(a);
	save(a, &st);
	assert_int_equal(st.pages_hashed, 0);
	b = adopt_fresh(7);
	assert_int_equal(hit(b, tA, 17, 0), 16);
	assert_int_equal(hit(b, tC, 13, 5), 12);
	kvmm_destroy(b);
	/* Demoted again, then computed again with other bytes: the new pages
	 * become the demoted nodes' resident copies (twins), with new sums. */
	assert_int_equal(kvmm_cache_demote(a, N_PAGES, &demoted), 0);
	assert_true(demoted >= 4);
	fill(a, tA, 16, 9);
	check(a);
	save(a, &st);
	assert_int_equal(st.pages_hashed, 0);
	b = adopt_fresh(4);
	assert_int_equal(hit(b, tA, 17, 9), 16);
	kvmm_destroy(b);
	kvmm_destroy(a);
}

static void test_write_into_indexed_page_caught(void **state)
{
	struct kvmm *a = pool(N_PAGES), *b = pool(N_PAGES);
	struct kvmm_hib_save_stats st;
	struct kvmm_hib_progress p = {0};
	struct kvmm_hib *h = NULL;
	char why[256] = "";
	uint32_t s, got = 0, np;
	const int32_t *pages;
	int r;

	prompts();
	fill(a, tA, 16, 0);
	/* Find tA's last page and change one byte of it, as a buggy writer would. */
	assert_int_equal(kvmm_seq_new(a, &s), 0);
	assert_int_equal(kvmm_seq_set_scope(a, s, 1), 0);
	assert_int_equal(kvmm_prefix_attach(a, s, tA, 17, &got), 0);
	assert_int_equal(got, 16);
	pages = kvmm_seq_pages(a, s, &np);
	((char *)kvmm_pool_base(a))[(size_t)pages[3] * kvmm_page_bytes(a) + 5] ^= 0x10;
	assert_int_equal(kvmm_seq_free(a, s), 0);
	assert_int_not_equal(kvmm_check(a, why, sizeof(why)), 0);
	assert_non_null(strstr(why, "checksum"));
	save(a, &st);
	assert_int_equal(st.pages_written, 4);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	while ((r = kvmm_hib_adopt(b, h, 0, &p)) == 1)
		;
	assert_int_equal(r, 0);
	assert_int_equal(p.adopted, 3);
	assert_int_equal(p.refused, 1); /* the changed page is never served */
	assert_int_equal(hit(b, tA, 17, 0), 12);
	kvmm_hib_close(h);
	kvmm_destroy(a);
	kvmm_destroy(b);
}

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/kvd-hibsum-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/cache.kvd", dir);
	snprintf(swap_dir, sizeof(swap_dir), "%s/swap", dir);
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sums_taken_once),
		cmocka_unit_test(test_fd_store_sums_at_first_save),
		cmocka_unit_test(test_reused_pages_never_stale),
		cmocka_unit_test(test_swap_and_twin_never_stale),
		cmocka_unit_test(test_write_into_indexed_page_caught),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
