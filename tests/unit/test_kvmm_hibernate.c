/*
 * tests/unit/test_kvmm_hibernate.c — cmocka tests of kvmm/hibernate.c: the
 * prefix cache saved to a file and adopted by a fresh pool of another size
 * (round trip: the same prefixes hit in the same owner scopes with the same
 * content, other scopes miss), the byte budget (a closed set of the
 * hottest chains), a deadline already past, and the refusals: a flipped bit
 * in a page (that page and what hangs below it never enter the index), a
 * truncated file, a corrupt index, another layout, a symbolic link, a file
 * readable by others, adoption into a pool that computed the same prefix
 * meanwhile; the accounting of hits on adopted pages (pool counters and the
 * sequence's record, a partial last page, pages computed in this run under
 * adopted ones) and kvmm_cache_drop_all (cached pages gone, mapped ones kept).
 *
 * As in test_kvmm_persist.c, the test plays the engine: every token slot
 * holds a function of its token id and position, written at commit.
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvmm.h"

#define TB 8
#define BS 4
#define OWNER "model=a;layout=b"

static char dir[64], path[128];

static uint64_t pattern(int32_t tok, uint32_t pos)
{
	uint64_t z = ((uint64_t)(uint32_t)tok << 32 | pos) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static struct kvmm *pool(uint32_t bs, uint32_t n_pages)
{
	struct kvmm_config c = {
		.page_bytes = (size_t)bs * TB, .block_size = bs, .pool_bytes = (uint64_t)n_pages * bs * TB,
		.max_seqs = 16, .prefix_cache = 1,
	};
	struct kvmm *m = NULL;

	assert_int_equal(kvmm_create(&c, &m), 0);
	return m;
}

static void check(const struct kvmm *m)
{
	char why[256] = "";

	if (kvmm_check(m, why, sizeof(why)))
		fail_msg("kvmm_check: %s", why);
}

/* A sequence in `scope` holding toks, published; freed unless keep. */
static uint32_t fill(struct kvmm *m, uint64_t scope, const int32_t *toks, uint32_t n, int salt, int keep)
{
	struct kvmm_grow g;
	const int32_t *pages;
	uint32_t s, np;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	assert_int_equal(kvmm_seq_set_scope(m, s, scope), 0);
	g = (struct kvmm_grow){s, n, toks};
	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	pages = kvmm_seq_pages(m, s, &np);
	for (uint32_t pos = 0; pos < n; pos++) {
		uint64_t v = pattern(toks[pos] + salt, pos);

		memcpy((char *)kvmm_pool_base(m) + (size_t)pages[pos / BS] * kvmm_page_bytes(m) + (pos % BS) * TB, &v,
		       TB);
	}
	assert_int_equal(kvmm_seq_publish(m, s), 0);
	if (!keep)
		assert_int_equal(kvmm_seq_free(m, s), 0);
	return s;
}

/* Tokens a lookup in scope finds (and checks their content against salt). */
static uint32_t hit(struct kvmm *m, uint64_t scope, const int32_t *toks, uint32_t n, int salt)
{
	uint32_t s, got = 0, np;
	const int32_t *pages;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	assert_int_equal(kvmm_seq_set_scope(m, s, scope), 0);
	assert_int_equal(kvmm_prefix_attach(m, s, toks, n, &got), 0);
	pages = kvmm_seq_pages(m, s, &np);
	for (uint32_t pos = 0; pos < got / BS * BS; pos++) {
		uint64_t v;

		memcpy(&v, (const char *)kvmm_pool_base(m) + (size_t)pages[pos / BS] * kvmm_page_bytes(m) + (pos % BS) * TB,
		       TB);
		if (v != pattern(toks[pos] + salt, pos))
			fail_msg("scope %llu token %u: content differs", (unsigned long long)scope, pos);
	}
	assert_int_equal(kvmm_seq_free(m, s), 0);
	return got;
}

static void adopt_all(struct kvmm *m, struct kvmm_hib *h, struct kvmm_hib_progress *p)
{
	int r, turns = 0;

	memset(p, 0, sizeof(*p));
	while ((r = kvmm_hib_adopt(m, h, 3, p)) == 1)
		assert_true(++turns < 10000);
	assert_int_equal(r, 0);
	check(m);
}

static int32_t tA[17], tB[13];

static void prompts(void)
{
	for (int i = 0; i < 17; i++)
		tA[i] = 100 + i;
	memcpy(tB, tA, 8 * sizeof(int32_t)); /* B shares A's first two pages */
	for (int i = 8; i < 13; i++)
		tB[i] = 500 + i;
}

/* Pool with A (4 pages) and B (1 more) in scope 1, and A in scope 2 with
 * other content (another user's KV for the same tokens). */
static struct kvmm *source(void)
{
	struct kvmm *m = pool(BS, 32);

	prompts();
	fill(m, 1, tA, 16, 0, 0);
	fill(m, 1, tB, 12, 0, 0);
	fill(m, 2, tA, 16, 7, 0);
	return m;
}

static void save_ok(struct kvmm *m, uint64_t max_bytes, struct kvmm_hib_save_stats *st)
{
	unlink(path);
	assert_int_equal(kvmm_hib_save(m, path, OWNER, sizeof(OWNER), max_bytes, 0, st), 0);
}

static void test_round_trip_scopes(void **state)
{
	struct kvmm *a = source(), *b = pool(BS, 20);
	struct kvmm_hib_save_stats st;
	struct kvmm_hib_progress p;
	struct kvmm_hib *h = NULL;
	struct stat sb;
	uint32_t ob;
	const void *owner;

	save_ok(a, 1ull << 30, &st);
	assert_int_equal(st.pages_written, 9);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0600);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	owner = kvmm_hib_owner(h, &ob);
	assert_int_equal(ob, sizeof(OWNER));
	assert_memory_equal(owner, OWNER, sizeof(OWNER));
	assert_int_equal(hit(b, 1, tA, 17, 0), 0);
	adopt_all(b, h, &p);
	assert_int_equal(p.adopted, 9);
	assert_int_equal(p.refused + p.skipped + p.present, 0);
	assert_int_equal(hit(b, 1, tA, 17, 0), 16);
	assert_int_equal(hit(b, 1, tB, 13, 0), 12);
	assert_int_equal(hit(b, 2, tA, 17, 7), 16); /* scope 2's own content */
	assert_int_equal(hit(b, 2, tB, 13, 7), 8);  /* B was never scope 2's */
	assert_int_equal(hit(b, 3, tA, 17, 0), 0);  /* nobody else's */
	check(b);
	kvmm_hib_close(h);
	kvmm_destroy(a);
	kvmm_destroy(b);
}

static void test_budget_closed_set(void **state)
{
	struct kvmm *a = source(), *b = pool(BS, 20);
	struct kvmm_hib_save_stats st;
	struct kvmm_hib_progress p;
	struct kvmm_hib *h = NULL;
	uint64_t per = 4096 + 24 + 4 * BS; /* a slot and an entry */

	/* Header, owner and the index's block, then 3 entries' worth. */
	save_ok(a, 4096 + 24 + 4096 + 3 * per, &st);
	assert_int_equal(st.candidates, 9);
	assert_true(st.pages_written > 0 && st.pages_written <= 3);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	adopt_all(b, h, &p);
	assert_int_equal(p.adopted, st.pages_written);
	assert_int_equal(p.skipped, 0); /* every parent was written first */
	kvmm_hib_close(h);
	/* A deadline already past: a valid file with nothing in it. */
	unlink(path);
	assert_int_equal(kvmm_hib_save(a, path, OWNER, sizeof(OWNER), 1ull << 30, 1, &st), 0);
	assert_true(st.timed_out);
	assert_int_equal(st.pages_written, 0);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	kvmm_hib_close(h);
	kvmm_destroy(a);
	kvmm_destroy(b);
}

static uint8_t *slurp(size_t *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long sz;

	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)sz);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
	fclose(f);
	*n = (size_t)sz;
	return buf;
}

static void spit(const uint8_t *buf, size_t n)
{
	int fd;

	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, n), (ssize_t)n);
	close(fd);
}

static void test_flipped_page_bit(void **state)
{
	struct kvmm *a = pool(BS, 32), *b = pool(BS, 20);
	struct kvmm_hib_progress p;
	struct kvmm_hib *h = NULL;
	uint8_t *buf;
	size_t n;

	prompts();
	fill(a, 1, tA, 16, 0, 0); /* one chain of 4 pages */
	save_ok(a, 1ull << 30, NULL);
	buf = slurp(&n);
	/* The data region starts after the header and the index block; the
	 * file order is A's pages head first. Flip a bit in the second. */
	buf[8192 + 4096 + 5] ^= 0x10;
	spit(buf, n);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0); /* pages are checked on adoption */
	adopt_all(b, h, &p);
	assert_int_equal(p.adopted, 1);
	assert_int_equal(p.refused, 1);
	assert_int_equal(p.skipped, 2); /* below the refused one */
	assert_int_equal(hit(b, 1, tA, 17, 0), 4);
	kvmm_hib_close(h);
	free(buf);
	kvmm_destroy(a);
	kvmm_destroy(b);
}

static void test_refusals(void **state)
{
	struct kvmm *a = source(), *b = pool(BS * 2, 20);
	struct kvmm_hib_progress p = {0};
	struct kvmm_hib *h = NULL;
	const char *why = NULL;
	char link[160];
	uint8_t *buf;
	size_t n;

	save_ok(a, 1ull << 30, NULL);
	buf = slurp(&n);
	/* Another layout. */
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	assert_int_equal(kvmm_hib_adopt(b, h, 0, &p), -ESTALE);
	h = kvmm_hib_close(h);
	/* Truncated: one byte short, and no header at all. */
	spit(buf, n - 1);
	assert_int_equal(kvmm_hib_open(path, &h, &why), -EBADMSG);
	assert_string_equal(why, "truncated");
	spit(buf, 10);
	assert_int_equal(kvmm_hib_open(path, &h, &why), -EBADMSG);
	/* A corrupt index, and a corrupt header. */
	buf[4096 + 40] ^= 1;
	spit(buf, n);
	assert_int_equal(kvmm_hib_open(path, &h, &why), -EBADMSG);
	assert_string_equal(why, "index checksum mismatch");
	buf[4096 + 40] ^= 1;
	buf[20] ^= 1;
	spit(buf, n);
	assert_int_equal(kvmm_hib_open(path, &h, &why), -EBADMSG);
	assert_string_equal(why, "header checksum mismatch");
	buf[20] ^= 1;
	/* Readable by others. */
	spit(buf, n);
	assert_int_equal(chmod(path, 0644), 0);
	assert_int_equal(kvmm_hib_open(path, &h, &why), -EPERM);
	/* A symbolic link to a good file: never followed, never replaced. */
	assert_int_equal(chmod(path, 0600), 0);
	snprintf(link, sizeof(link), "%s/link", dir);
	assert_int_equal(symlink(path, link), 0);
	assert_int_equal(kvmm_hib_open(link, &h, &why), -ELOOP);
	assert_string_equal(why, "the path is a symbolic link");
	assert_int_equal(kvmm_hib_save(a, link, OWNER, sizeof(OWNER), 1ull << 30, 0, NULL), -ELOOP);
	unlink(link);
	assert_null(h);
	free(buf);
	kvmm_destroy(a);
	kvmm_destroy(b);
}

static void test_adopt_while_serving(void **state)
{
	struct kvmm *a = source(), *b = pool(BS, 20);
	struct kvmm_hib_progress p;
	struct kvmm_hib *h = NULL;

	save_ok(a, 1ull << 30, NULL);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	/* This run computed A in scope 1 before the file was read. */
	fill(b, 1, tA, 16, 0, 0);
	adopt_all(b, h, &p);
	assert_int_equal(p.present, 4);
	assert_int_equal(p.adopted, 5);
	assert_int_equal(hit(b, 1, tB, 13, 0), 12);
	assert_int_equal(hit(b, 2, tA, 17, 7), 16);
	kvmm_hib_close(h);
	kvmm_destroy(b);
	/* A pool with too few free pages adopts what fits and skips the rest. */
	b = pool(BS, 3);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	adopt_all(b, h, &p);
	assert_int_equal(p.adopted, 3);
	assert_int_equal(p.skipped, 6);
	kvmm_hib_close(h);
	kvmm_destroy(a);
	kvmm_destroy(b);
}

/* Attach toks in scope to a new sequence; its record's adopted share in
 * *ret_adopted / *ret_pages. Returns the hit; the sequence stays (*ret_seq). */
static uint32_t attach_rec(struct kvmm *m, uint64_t scope, const int32_t *toks, uint32_t n, uint32_t *ret_seq,
			   uint32_t *ret_adopted, uint32_t *ret_pages)
{
	struct kvmm_seq_record rec;
	uint32_t s, got = 0;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	assert_int_equal(kvmm_seq_set_scope(m, s, scope), 0);
	assert_int_equal(kvmm_prefix_attach(m, s, toks, n, &got), 0);
	assert_int_equal(kvmm_seq_ledger(m, s, &rec), 0);
	assert_int_equal(rec.shared_prefix_tokens, got);
	*ret_adopted = rec.adopted_tokens;
	*ret_pages = rec.adopted_pages;
	*ret_seq = s;
	return got;
}

static void test_adopted_hits(void **state)
{
	struct kvmm *a = source(), *b = pool(BS, 20);
	struct kvmm_hib_progress p;
	struct kvmm_hib *h = NULL;
	struct kvmm_stats ks;
	uint32_t s, ad, pg;
	int32_t tC[9], tD[17];

	for (int i = 0; i < 9; i++)
		tC[i] = 900 + i;
	memcpy(tD, tA, 8 * sizeof(int32_t)); /* D: A's first two pages, then its own */
	for (int i = 8; i < 17; i++)
		tD[i] = 700 + i;
	save_ok(a, 1ull << 30, NULL);
	assert_int_equal(kvmm_hib_open(path, &h, NULL), 0);
	adopt_all(b, h, &p);
	kvmm_hib_close(h);
	kvmm_get_stats(b, &ks);
	assert_int_equal(ks.pages_adopted_file, 9);
	assert_int_equal(ks.adopted_hit_pages, 0);
	assert_int_equal(ks.adopted_hit_tokens, 0);

	/* A prompt computed in this run: no adopted hit. */
	fill(b, 1, tC, 8, 0, 0);
	assert_int_equal(attach_rec(b, 1, tC, 9, &s, &ad, &pg), 8);
	assert_int_equal(ad, 0);
	assert_int_equal(pg, 0);
	assert_int_equal(kvmm_seq_free(b, s), 0);
	kvmm_get_stats(b, &ks);
	assert_int_equal(ks.adopted_hit_tokens, 0);
	assert_int_equal(ks.prefix_hit_tokens, 8);

	/* The adopted A: four whole pages. */
	assert_int_equal(attach_rec(b, 1, tA, 17, &s, &ad, &pg), 16);
	assert_int_equal(ad, 16);
	assert_int_equal(pg, 4);
	assert_int_equal(kvmm_seq_free(b, s), 0);
	/* Eight tokens of A: the hit stops at 7 (one is left to compute), the
	 * second page counts its 3 tokens. */
	assert_int_equal(attach_rec(b, 1, tA, 8, &s, &ad, &pg), 7);
	assert_int_equal(ad, 7);
	assert_int_equal(pg, 2);
	assert_int_equal(kvmm_seq_free(b, s), 0);
	kvmm_get_stats(b, &ks);
	assert_int_equal(ks.adopted_hit_pages, 6);
	assert_int_equal(ks.adopted_hit_tokens, 23);
	assert_int_equal(ks.adopted_file_hit_tokens, 23);

	/* D computed now under A's adopted pages: only those two count. */
	fill(b, 1, tD, 16, 0, 0);
	assert_int_equal(attach_rec(b, 1, tD, 17, &s, &ad, &pg), 16);
	assert_int_equal(ad, 8);
	assert_int_equal(pg, 2);
	assert_int_equal(kvmm_seq_free(b, s), 0);
	/* Another scope never hits scope 1's adopted pages. */
	assert_int_equal(attach_rec(b, 3, tA, 17, &s, &ad, &pg), 0);
	assert_int_equal(ad, 0);
	assert_int_equal(kvmm_seq_free(b, s), 0);
	kvmm_get_stats(b, &ks);
	assert_int_equal(ks.adopted_hit_tokens, 31);
	assert_true(ks.adopted_hit_tokens <= ks.prefix_hit_tokens);
	check(b);
	kvmm_destroy(a);
	kvmm_destroy(b);
}

/* The fd-store hand-over's pages count as adopted, not as from a file. */
static void test_adopted_hits_fd_store(void **state)
{
	struct kvmm *a = source(), *b = NULL;
	struct kvmm_config c = {
		.page_bytes = (size_t)BS * TB, .block_size = BS, .pool_bytes = 32ull * BS * TB,
		.max_seqs = 16, .prefix_cache = 1,
	};
	struct kvmm_stats ks;
	uint32_t s, ad, pg, n = 0;
	void *buf = NULL;
	size_t bytes = 0;
	int fd = dup(kvmm_pool_fd(a));

	assert_true(fd >= 0);
	assert_int_equal(kvmm_prefix_export(a, OWNER, sizeof(OWNER), &buf, &bytes), 0);
	kvmm_destroy(a);
	assert_int_equal(kvmm_create_adopt(&c, NULL, fd, 32, &b), 0);
	assert_int_equal(kvmm_prefix_import(b, buf, bytes, &n), 0);
	assert_int_equal(n, 9);
	assert_int_equal(attach_rec(b, 1, tA, 17, &s, &ad, &pg), 16);
	assert_int_equal(ad, 16);
	assert_int_equal(pg, 4);
	assert_int_equal(kvmm_seq_free(b, s), 0);
	kvmm_get_stats(b, &ks);
	assert_int_equal(ks.adopted_hit_tokens, 16);
	assert_int_equal(ks.adopted_hit_pages, 4);
	assert_int_equal(ks.adopted_file_hit_tokens, 0);
	assert_int_equal(ks.pages_adopted_file, 0);
	check(b);
	free(buf);
	kvmm_destroy(b); /* and the pool fd, kvmm's since the adoption */
}

static void test_drop_all(void **state)
{
	struct kvmm *m = source();
	struct kvmm_stats ks;
	uint32_t s, ad, pg, dropped = 0, np;

	/* A sequence maps scope 2's A while the cache is dropped. */
	assert_int_equal(attach_rec(m, 2, tA, 17, &s, &ad, &pg), 16);
	kvmm_get_stats(m, &ks);
	assert_int_equal(ks.pages_cached, 5); /* scope 1's A and B */
	assert_int_equal(kvmm_cache_drop_all(m, &dropped), 0);
	assert_int_equal(dropped, 5);
	kvmm_get_stats(m, &ks);
	assert_int_equal(ks.pages_cached, 0);
	assert_int_equal(ks.pages_used, 4);
	kvmm_seq_pages(m, s, &np);
	assert_int_equal(np, 4);
	check(m);
	assert_int_equal(hit(m, 1, tA, 17, 0), 0);
	assert_int_equal(hit(m, 1, tB, 13, 0), 0);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	/* Its pages stay cached once it is done (they stayed indexed). */
	assert_int_equal(hit(m, 2, tA, 17, 7), 16);
	assert_int_equal(kvmm_cache_drop_all(m, &dropped), 0);
	assert_int_equal(dropped, 4);
	assert_int_equal(hit(m, 2, tA, 17, 7), 0);
	check(m);
	kvmm_destroy(m);
}

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/kvd-hib-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/cache.kvd", dir);
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
		cmocka_unit_test(test_round_trip_scopes),
		cmocka_unit_test(test_budget_closed_set),
		cmocka_unit_test(test_flipped_page_bit),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_adopt_while_serving),
		cmocka_unit_test(test_adopted_hits),
		cmocka_unit_test(test_adopted_hits_fd_store),
		cmocka_unit_test(test_drop_all),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
