/*
 * tests/unit/test_kvmm_persist.c — cmocka tests of kvmm/persist.c: the
 * prefix index exported by one pool and imported by a new pool over the same
 * memfd (round trip: the same prefixes hit, with the same content, in the
 * same recency order), refusal of a buffer from a pool laid out otherwise,
 * corrupt and hostile buffers (every byte flipped; crafted entries with a
 * valid checksum), the sealed memfds that carry buffers and pools, and
 * demoted entries that are left out.
 *
 * As in test_kvmm.c, the test plays the engine: every token slot (8 bytes)
 * holds a function of its token id and position, written at commit, so a
 * page's content can be checked in the pool that adopted it.
 *
 * The format constants below restate kvmm/persist.c's layout (a 64-byte
 * header, the owner's bytes padded to 8, entries of 16 bytes plus the
 * tokens) so that tests can craft entries.
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
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvmm.h"

#define TB 8
#define BS 4
#define NP 32
#define HDR_BYTES 64
#define ENTRY_BYTES (24 + 4 * BS)
#define OWNER "model=a;layout=b"

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

static void check(const struct kvmm *m)
{
	char why[256] = "";

	if (kvmm_check(m, why, sizeof(why)))
		fail_msg("kvmm_check: %s", why);
}

static uint32_t new_seq(struct kvmm *m)
{
	uint32_t s;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	return s;
}

static void grow(struct kvmm *m, uint32_t seq, const int32_t *toks, uint32_t n)
{
	uint32_t len = kvmm_seq_len(m, seq), np;
	struct kvmm_grow g = {seq, n, toks};
	const int32_t *pages;

	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	pages = kvmm_seq_pages(m, seq, &np);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = len + i;
		uint64_t v = pattern(toks[i], pos);

		memcpy((char *)kvmm_pool_base(m) + (size_t)pages[pos / kvmm_block_size(m)] * kvmm_page_bytes(m) +
			       (pos % kvmm_block_size(m)) * TB,
		       &v, TB);
	}
	assert_int_equal(kvmm_seq_publish(m, seq), 0);
}

static void expect_content(const struct kvmm *m, uint32_t seq, const int32_t *toks)
{
	uint32_t np, len = kvmm_seq_len(m, seq), bs = kvmm_block_size(m);
	const int32_t *pages = kvmm_seq_pages(m, seq, &np);

	for (uint32_t pos = 0; pos < len; pos++) {
		uint64_t v;

		memcpy(&v, (const char *)kvmm_pool_base(m) + (size_t)pages[pos / bs] * kvmm_page_bytes(m) + (pos % bs) * TB,
		       TB);
		if (v != pattern(toks[pos], pos))
			fail_msg("token %u: content differs", pos);
	}
}

static void iota(int32_t *t, uint32_t n, int32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + (int32_t)i;
}

/* Prompts of the fixture: A (16 tokens, 4 pages, finished: cached), then B
 * (A's first 8 tokens and 4 of its own: 1 new page, left live). The index
 * then holds 5 pages; A's tail is the coldest. */
static int32_t tA[17], tB[13];

static struct kvmm *fixture(uint32_t *ret_live)
{
	struct kvmm_config c = cfg_of(BS, NP);
	struct kvmm *m = NULL;
	uint32_t a, b;

	assert_int_equal(kvmm_create(&c, &m), 0);
	iota(tA, 17, 100);
	memcpy(tB, tA, 8 * sizeof(int32_t));
	iota(tB + 8, 5, 500);
	a = new_seq(m);
	grow(m, a, tA, 16);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	b = new_seq(m);
	grow(m, b, tB, 12);
	check(m);
	*ret_live = b;
	return m;
}

/* Export m with OWNER, hand its pool memfd over as a service manager
 * would (a duplicate survives m), and destroy m. */
static void export_and_close(struct kvmm *m, void **ret_buf, size_t *ret_bytes, int *ret_pool_fd)
{
	*ret_pool_fd = dup(kvmm_pool_fd(m));
	assert_true(*ret_pool_fd >= 0);
	assert_int_equal(kvmm_prefix_export(m, OWNER, strlen(OWNER), ret_buf, ret_bytes), 0);
	assert_null(kvmm_destroy(m));
}

static struct kvmm *adopt(int pool_fd, uint32_t bs, uint32_t n_pages)
{
	struct kvmm_config c = cfg_of(bs, 1); /* pool_bytes ignored on adoption */
	struct kvmm *m = NULL;

	assert_int_equal(kvmm_create_adopt(&c, NULL, pool_fd, n_pages, &m), 0);
	return m;
}

static void test_round_trip(void **state)
{
	struct kvmm *m;
	void *buf;
	size_t bytes;
	int fd;
	uint32_t live, n = 0, hit, s;
	struct kvmm_persist_info info;
	struct kvmm_stats st;
	struct kvmm_ledger l;

	(void)state;
	m = fixture(&live);
	export_and_close(m, &buf, &bytes, &fd);
	assert_int_equal(kvmm_persist_parse(buf, bytes, &info), 0);
	assert_int_equal(info.n_entries, 5);
	assert_int_equal(info.block_size, BS);
	assert_int_equal(info.n_pages, NP);
	assert_int_equal(info.owner_bytes, strlen(OWNER));
	assert_memory_equal(info.owner, OWNER, strlen(OWNER));

	m = adopt(fd, BS, NP);
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), 0);
	assert_int_equal(n, 5);
	check(m);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_cached, 5);
	assert_int_equal(st.pages_free, NP - 5);
	assert_int_equal(st.pages_used, 0);
	kvmm_get_ledger(m, &l);
	assert_int_equal(l.pages_adopted, 5);
	/* A second import into the same pool is refused. */
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), -EBUSY);

	/* Both prompts hit everything they cached, with the old content. */
	s = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, s, tA, 17, &hit), 0);
	assert_int_equal(hit, 16);
	expect_content(m, s, tA);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	s = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, s, tB, 13, &hit), 0);
	assert_int_equal(hit, 12);
	expect_content(m, s, tB);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	check(m);
	assert_null(kvmm_destroy(m));
	free(buf);
}

/* Owner scopes survive the hand-over: the same prompt cached in two scopes
 * comes back as two chains, each serving only its own scope. */
static void test_round_trip_keeps_scopes(void **state)
{
	struct kvmm_config c = cfg_of(BS, NP);
	struct kvmm *m = NULL;
	void *buf;
	size_t bytes;
	int fd;
	uint32_t n = 0, hit, s;
	static const uint64_t scopes[] = { 7, 9 };

	(void)state;
	assert_int_equal(kvmm_create(&c, &m), 0);
	iota(tA, 17, 100);
	for (int i = 0; i < 2; i++) {
		s = new_seq(m);
		assert_int_equal(kvmm_seq_set_scope(m, s, scopes[i]), 0);
		grow(m, s, tA, 16);
		assert_int_equal(kvmm_seq_free(m, s), 0);
	}
	check(m);
	export_and_close(m, &buf, &bytes, &fd);
	m = adopt(fd, BS, NP);
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), 0);
	assert_int_equal(n, 2 * 16 / BS);
	check(m);
	for (uint64_t sc = 0; sc <= 10; sc++) {
		s = new_seq(m);
		assert_int_equal(kvmm_seq_set_scope(m, s, sc), 0);
		assert_int_equal(kvmm_prefix_attach(m, s, tA, 17, &hit), 0);
		if (hit != (sc == 7 || sc == 9 ? 16u : 0u))
			fail_msg("scope %llu: hit %u", (unsigned long long)sc, hit);
		if (hit)
			expect_content(m, s, tA);
		assert_int_equal(kvmm_seq_free(m, s), 0);
	}
	check(m);
	assert_null(kvmm_destroy(m));
	free(buf);
}

/* Recency survives: A is cached first, C after it, then A is used again,
 * so C is the coldest (though A's entries come first in the buffer): one
 * page evicted after the import is C's tail. */
static void test_round_trip_keeps_recency(void **state)
{
	struct kvmm_config c = cfg_of(BS, NP);
	struct kvmm *m = NULL;
	void *buf;
	size_t bytes;
	int fd;
	uint32_t n, hit, s, dropped;
	int32_t tC[17];

	(void)state;
	assert_int_equal(kvmm_create(&c, &m), 0);
	iota(tA, 17, 100);
	iota(tC, 17, 900);
	s = new_seq(m);
	grow(m, s, tA, 16);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	s = new_seq(m);
	grow(m, s, tC, 16);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	s = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, s, tA, 17, &hit), 0);
	assert_int_equal(hit, 16);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	export_and_close(m, &buf, &bytes, &fd);
	m = adopt(fd, BS, NP);
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), 0);
	assert_int_equal(n, 8);
	assert_int_equal(kvmm_cache_evict(m, 1, &dropped), 0);
	assert_int_equal(dropped, 1);
	s = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, s, tA, 17, &hit), 0);
	assert_int_equal(hit, 16);
	expect_content(m, s, tA);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	s = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, s, tC, 17, &hit), 0);
	assert_int_equal(hit, 12); /* C's last page was the one dropped */
	expect_content(m, s, tC);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	check(m);
	assert_null(kvmm_destroy(m));
	free(buf);
}

static void test_layout_mismatch_refused(void **state)
{
	struct kvmm *m;
	void *buf;
	size_t bytes;
	int fd, fd2;
	uint32_t live, n = 77;

	(void)state;
	m = fixture(&live);
	export_and_close(m, &buf, &bytes, &fd);
	/* Another block size over the same bytes: 8 tokens of 8 bytes a page. */
	fd2 = dup(fd);
	m = adopt(fd2, 2 * BS, NP / 2);
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), -ESTALE);
	assert_int_equal(n, 77);
	check(m);
	assert_null(kvmm_destroy(m));
	/* Fewer pages of the same size: refused by the import... */
	fd2 = dup(fd);
	{
		struct kvmm_config c = cfg_of(BS, 1);

		/* ...and the memfd is too large for a pool of NP / 2 pages. */
		assert_int_equal(kvmm_create_adopt(&c, NULL, fd2, NP / 2, &m), -EBADFD);
		close(fd2);
	}
	/* A pool without prefix caching cannot take entries. */
	{
		struct kvmm_config c = cfg_of(BS, 1);

		c.prefix_cache = 0;
		assert_int_equal(kvmm_create_adopt(&c, NULL, fd, NP, &m), 0);
		assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), -EOPNOTSUPP);
		check(m);
		assert_null(kvmm_destroy(m));
	}
	free(buf);
}

/* Flipping any single byte is caught (by the checksum, or a field check
 * before it), and nothing changes in the pool. */
static void test_corrupt_bytes_refused(void **state)
{
	struct kvmm *m;
	void *buf;
	size_t bytes;
	int fd;
	uint32_t live, n;
	struct kvmm_persist_info info;
	struct kvmm_stats st;

	(void)state;
	m = fixture(&live);
	export_and_close(m, &buf, &bytes, &fd);
	m = adopt(fd, BS, NP);
	for (size_t i = 0; i < bytes; i++) {
		uint8_t *p = buf;

		for (int bit = 0; bit < 8; bit += 3) {
			p[i] ^= (uint8_t)(1u << bit);
			int r = kvmm_persist_parse(buf, bytes, &info);
			if (r != -EBADMSG && r != -EPROTO)
				fail_msg("byte %zu bit %d: parse returned %d", i, bit, r);
			r = kvmm_prefix_import(m, buf, bytes, &n);
			if (r != -EBADMSG && r != -EPROTO)
				fail_msg("byte %zu bit %d: import returned %d", i, bit, r);
			p[i] ^= (uint8_t)(1u << bit);
		}
	}
	/* Truncated, extended, empty, absent. */
	for (size_t cut = 0; cut < bytes; cut += 7)
		assert_int_equal(kvmm_persist_parse(buf, cut, &info), -EBADMSG);
	{
		uint8_t *big = calloc(1, bytes + 8);

		memcpy(big, buf, bytes);
		assert_int_equal(kvmm_persist_parse(big, bytes + 8, &info), -EBADMSG);
		free(big);
	}
	assert_int_equal(kvmm_persist_parse(NULL, 0, &info), -EINVAL);
	kvmm_get_stats(m, &st);
	assert_int_equal(st.pages_free, NP);
	check(m);
	/* The untouched buffer still imports. */
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), 0);
	assert_int_equal(n, 5);
	check(m);
	assert_null(kvmm_destroy(m));
	free(buf);
}

/* Entries crafted with a valid checksum: each hostile case is refused and
 * the pool is left with every page free. */
enum craft { PAGE_OUT_OF_RANGE, PAGE_TWICE, PARENT_FORWARD, PARENT_SELF, PARENT_NEGATIVE, DUP_TOKENS, RESERVED,
	     COUNT_TOO_LARGE, SCOPE_CROSS, VERSION };

static void craft(uint8_t *b, size_t bytes, enum craft what)
{
	size_t e0 = HDR_BYTES + ((strlen(OWNER) + 7) & ~(size_t)7);
	int32_t v;
	uint32_t u;

	switch (what) {
	case PAGE_OUT_OF_RANGE:
		u = NP;
		memcpy(b + e0 + 2 * ENTRY_BYTES + 4, &u, 4);
		break;
	case PAGE_TWICE:
		memcpy(b + e0 + 3 * ENTRY_BYTES + 4, b + e0 + 1 * ENTRY_BYTES + 4, 4);
		break;
	case PARENT_FORWARD:
		v = 4;
		memcpy(b + e0 + 2 * ENTRY_BYTES, &v, 4);
		break;
	case PARENT_SELF:
		v = 2;
		memcpy(b + e0 + 2 * ENTRY_BYTES, &v, 4);
		break;
	case PARENT_NEGATIVE:
		v = -7;
		memcpy(b + e0 + 1 * ENTRY_BYTES, &v, 4);
		break;
	case DUP_TOKENS: {
		/* entry 4 made a twin of entry 3: same parent, same tokens */
		uint32_t page;

		memcpy(&page, b + e0 + 4 * ENTRY_BYTES + 4, 4);
		memcpy(b + e0 + 4 * ENTRY_BYTES, b + e0 + 3 * ENTRY_BYTES, ENTRY_BYTES);
		memcpy(b + e0 + 4 * ENTRY_BYTES + 4, &page, 4);
		break;
	}
	case RESERVED:
		u = 1;
		memcpy(b + e0 + 12, &u, 4);
		break;
	case COUNT_TOO_LARGE:
		u = NP + 1;
		memcpy(b + 48, &u, 4); /* n_entries */
		break;
	case SCOPE_CROSS: {
		/* entry 1 (a child) claims another scope than its parent's */
		uint64_t sc = 0x5c09e;

		memcpy(b + e0 + 1 * ENTRY_BYTES + 16, &sc, 8);
		break;
	}
	case VERSION:
		u = KVMM_PERSIST_VERSION + 1;
		memcpy(b + 8, &u, 4);
		break;
	}
	assert_int_equal(kvmm_debug_persist_checksum(b, bytes), 0);
}

static void test_hostile_entries_refused(void **state)
{
	struct kvmm *m;
	void *buf;
	size_t bytes;
	int fd;
	uint32_t live, n;
	struct kvmm_stats st;
	static const int want[] = {
		[PAGE_OUT_OF_RANGE] = -EBADMSG, [PAGE_TWICE] = -EBADMSG, [PARENT_FORWARD] = -EBADMSG,
		[PARENT_SELF] = -EBADMSG,       [PARENT_NEGATIVE] = -EBADMSG, [DUP_TOKENS] = -EBADMSG,
		[RESERVED] = -EBADMSG,          [COUNT_TOO_LARGE] = -EBADMSG, [SCOPE_CROSS] = -EBADMSG,
		[VERSION] = -EPROTO,
	};

	(void)state;
	m = fixture(&live);
	export_and_close(m, &buf, &bytes, &fd);
	m = adopt(fd, BS, NP);
	for (int w = PAGE_OUT_OF_RANGE; w <= VERSION; w++) {
		uint8_t *b = malloc(bytes);

		memcpy(b, buf, bytes);
		craft(b, bytes, (enum craft)w);
		n = 99;
		if (kvmm_prefix_import(m, b, bytes, &n) != want[w])
			fail_msg("case %d: not refused as expected", w);
		assert_int_equal(n, 99);
		kvmm_get_stats(m, &st);
		assert_int_equal(st.pages_free, NP);
		assert_int_equal(st.pages_cached, 0);
		check(m);
		free(b);
	}
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), 0);
	check(m);
	assert_null(kvmm_destroy(m));
	free(buf);
}

static int dev_read(void *ud, uint32_t page, void *host) { return -EIO; }
static int dev_write(void *ud, uint32_t page, const void *host) { return -EIO; }
static int dev_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n) { return -EIO; }

static void test_memfds_sealed(void **state)
{
	struct kvmm *m;
	void *buf, *back = NULL;
	size_t bytes, nb = 0;
	int fd, ifd, raw;
	uint32_t live;
	struct kvmm_config c = cfg_of(BS, 1);

	(void)state;
	m = fixture(&live);
	export_and_close(m, &buf, &bytes, &fd);
	assert_int_equal(kvmm_persist_memfd(buf, bytes, &ifd), 0);
	assert_true(write(ifd, "x", 1) < 0); /* sealed */
	assert_int_equal(kvmm_persist_read_memfd(ifd, bytes - 1, &back, &nb), -EFBIG);
	assert_int_equal(kvmm_persist_read_memfd(ifd, 1 << 20, &back, &nb), 0);
	assert_int_equal(nb, bytes);
	assert_memory_equal(back, buf, bytes);
	free(back);
	close(ifd);
	/* An unsealed memfd with the same bytes could change under the reader:
	 * refused. So is a pipe. */
	raw = memfd_create("x", MFD_CLOEXEC);
	assert_true(write(raw, buf, bytes) == (ssize_t)bytes);
	assert_int_equal(kvmm_persist_read_memfd(raw, 1 << 20, &back, &nb), -EPERM);
	/* A pool memfd without the shrink seal is refused, so is a short one. */
	assert_int_equal(ftruncate(raw, (off_t)NP * BS * TB), 0);
	assert_int_equal(kvmm_create_adopt(&c, NULL, raw, NP, &m), -EPERM);
	close(raw);
	{
		int p[2];

		assert_int_equal(pipe(p), 0);
		assert_int_equal(kvmm_persist_read_memfd(p[0], 1 << 20, &back, &nb), -EBADF);
		close(p[0]);
		close(p[1]);
	}
	assert_int_equal(kvmm_create_adopt(&c, NULL, fd, NP + 1, &m), -EBADFD);
	/* A device pool cannot adopt a host memfd. */
	c.page_ops.read = dev_read;
	c.page_ops.write = dev_write;
	c.page_ops.copy = dev_copy;
	assert_int_equal(kvmm_create_adopt(&c, NULL, fd, NP, &m), -EOPNOTSUPP);
	close(fd);
	free(buf);
}

/* Demoted entries live in a swap file that dies with the process: left
 * out, and so is everything below them. */
static void test_demoted_entries_left_out(void **state)
{
	struct kvmm_config c = cfg_of(BS, NP);
	struct kvmm_swap_io *io = NULL;
	struct kvmm *m = NULL;
	void *buf;
	size_t bytes;
	int fd;
	uint32_t a, n, hit, s;
	int32_t t[17];

	(void)state;
	assert_int_equal(kvmm_swap_io_mem_new((uint64_t)8 * BS * TB, &io), 0);
	assert_int_equal(kvmm_create_with_io(&c, io, &m), 0);
	iota(t, 17, 7);
	a = new_seq(m);
	grow(m, a, t, 16);
	assert_int_equal(kvmm_seq_free(m, a), 0);
	/* Demoting the two coldest takes the tail pages 3 and 2. */
	assert_int_equal(kvmm_cache_demote(m, 2, &n), 0);
	assert_int_equal(n, 2);
	export_and_close(m, &buf, &bytes, &fd);
	m = adopt(fd, BS, NP);
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), 0);
	assert_int_equal(n, 2);
	s = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, s, t, 17, &hit), 0);
	assert_int_equal(hit, 8);
	expect_content(m, s, t);
	assert_int_equal(kvmm_seq_free(m, s), 0);
	check(m);
	assert_null(kvmm_destroy(m));
	free(buf);
}

/* An empty index round-trips to nothing; a prefix-less pool exports none. */
static void test_empty_index(void **state)
{
	struct kvmm_config c = cfg_of(BS, NP);
	struct kvmm *m = NULL;
	void *buf;
	size_t bytes;
	int fd;
	uint32_t n = 9;
	struct kvmm_persist_info info;

	(void)state;
	c.prefix_cache = 0;
	assert_int_equal(kvmm_create(&c, &m), 0);
	export_and_close(m, &buf, &bytes, &fd);
	assert_int_equal(kvmm_persist_parse(buf, bytes, &info), 0);
	assert_int_equal(info.n_entries, 0);
	m = adopt(fd, BS, NP);
	assert_int_equal(kvmm_prefix_import(m, buf, bytes, &n), 0);
	assert_int_equal(n, 0);
	check(m);
	assert_null(kvmm_destroy(m));
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_round_trip_keeps_scopes),
		cmocka_unit_test(test_round_trip_keeps_recency),
		cmocka_unit_test(test_layout_mismatch_refused),
		cmocka_unit_test(test_corrupt_bytes_refused),
		cmocka_unit_test(test_hostile_entries_refused),
		cmocka_unit_test(test_memfds_sealed),
		cmocka_unit_test(test_demoted_entries_left_out),
		cmocka_unit_test(test_empty_index),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
