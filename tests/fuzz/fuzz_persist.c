/*
 * tests/fuzz/fuzz_persist.c — libFuzzer target for the prefix index handed
 * over across restarts (kvmm/persist.c), which comes back from outside the
 * process and is never trusted.
 *
 * Input: one control byte (bit 0: recompute the checksum after the fuzzer's
 * changes, so that the entry checks behind it are reached; bits 1-2: the
 * block size of the receiving pool, 1, 2, 4 or 8 tokens), then the buffer.
 * The buffer is copied into memory of exactly its size, so reading past it
 * is an ASan error. Each input goes to a fresh pool of 64 pages.
 *
 * Promises checked: parse and import agree (an import succeeds only on a
 * buffer that parses, for a pool of its layout); a successful import enters
 * exactly n_entries pages, all cached, and leaves kvmm_check() clean; every
 * entry's token block then hits in a prefix lookup from its root; the pool
 * exports again to a buffer that parses with the same entry count; a
 * refused import leaves every page free. Sanitizers catch the rest.
 */
#include <errno.h>

#include "kvmm.h"
#include "fuzz_util.h"

#define POOL_PAGES 64
#define TOKEN_BYTES 8

static void write_seeds(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = getenv("KVD_FUZZ_WRITE_SEEDS");

	if (dir && *dir) {
		write_seeds(dir);
		exit(0);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvmm_config c = {0};
	struct kvmm_persist_info info;
	struct kvmm_stats st;
	struct kvmm *m = NULL;
	uint8_t *buf;
	uint32_t bs, n = 0;
	int parsed, r;

	if (size < 1)
		return 0;
	bs = 1u << ((data[0] >> 1) & 3);
	buf = malloc(size - 1 ? size - 1 : 1);
	if (!buf)
		return 0;
	memcpy(buf, data + 1, size - 1);
	if (data[0] & 1)
		(void)kvmm_debug_persist_checksum(buf, size - 1);
	parsed = kvmm_persist_parse(buf, size - 1, &info);
	CHECK(parsed == 0 || parsed == -EBADMSG || parsed == -EPROTO);
	if (parsed == 0) {
		CHECK(info.n_entries <= info.n_pages && info.block_size >= 1 && info.block_size <= KVMM_MAX_BLOCK_SIZE);
		CHECK(info.owner_bytes <= KVMM_PERSIST_OWNER_MAX);
		CHECK(!info.owner_bytes || ((const uint8_t *)info.owner >= buf &&
					    (const uint8_t *)info.owner + info.owner_bytes <= buf + size - 1));
	}
	c.page_bytes = (size_t)bs * TOKEN_BYTES;
	c.block_size = bs;
	c.pool_bytes = (uint64_t)POOL_PAGES * c.page_bytes;
	c.max_seqs = 4;
	c.prefix_cache = 1;
	if (kvmm_create(&c, &m) < 0)
		goto out;
	r = kvmm_prefix_import(m, buf, size - 1, &n);
	kvmm_get_stats(m, &st);
	CHECK(kvmm_check(m, NULL, 0) == 0);
	if (r < 0) {
		CHECK(st.pages_free == POOL_PAGES && st.pages_cached == 0);
		if (parsed < 0)
			CHECK(r == parsed);
		goto out;
	}
	CHECK(parsed == 0 && info.block_size == bs && info.n_pages == POOL_PAGES);
	CHECK(n == info.n_entries && st.pages_cached == n && st.pages_free == POOL_PAGES - n);
	{
		void *again = NULL;
		size_t again_bytes = 0;
		struct kvmm_persist_info info2;
		uint32_t seq, hit;

		CHECK(kvmm_prefix_export(m, NULL, 0, &again, &again_bytes) == 0);
		CHECK(kvmm_persist_parse(again, again_bytes, &info2) == 0 && info2.n_entries == n);
		free(again);
		/* A root entry's tokens, plus one, hit its whole page. */
		if (n > 0 && kvmm_seq_new(m, &seq) == 0) {
			const uint8_t *e0 = buf + 64 + ((info.owner_bytes + 7) & ~7u);
			int32_t parent, toks[9];

			/* The first entry is a root: its parent can only be -1. */
			memcpy(&parent, e0, 4);
			CHECK(parent == -1);
			memcpy(toks, e0 + 16, bs * sizeof(int32_t));
			toks[bs] = 0;
			CHECK(kvmm_prefix_attach(m, seq, toks, bs + 1, &hit) == 0);
			CHECK(hit == bs);
			CHECK(kvmm_seq_free(m, seq) == 0);
			CHECK(kvmm_check(m, NULL, 0) == 0);
		}
	}
out:
	kvmm_destroy(m);
	free(buf);
	return 0;
}

/* ---- seeds: real exports (KVD_FUZZ_WRITE_SEEDS=DIR) ------------------------------- */

/* A pool of POOL_PAGES pages of block size bs holding two prompts that share
 * their first page, one finished (cached) and one live, exported. */
static void seed(const char *dir, const char *name, uint32_t bs, int fix_checksum)
{
	struct kvmm_config c = {
		.page_bytes = (size_t)bs * TOKEN_BYTES, .block_size = bs,
		.pool_bytes = (uint64_t)POOL_PAGES * bs * TOKEN_BYTES, .max_seqs = 4, .prefix_cache = 1,
	};
	struct kvmm *m = NULL;
	int32_t a[24], b[24];
	uint32_t s1, s2;
	void *buf = NULL;
	size_t bytes = 0;
	char path[4096];
	uint8_t ctl = (uint8_t)(fix_checksum | (__builtin_ctz(bs) << 1));
	FILE *f;

	for (int i = 0; i < 24; i++) {
		a[i] = 10 + i;
		b[i] = i < (int)bs ? a[i] : 300 + i;
	}
	CHECK(kvmm_create(&c, &m) == 0);
	CHECK(kvmm_seq_new(m, &s1) == 0 && kvmm_seq_new(m, &s2) == 0);
	CHECK(kvmm_commit(m, &(struct kvmm_grow){s1, 24, a}, 1) == 0 && kvmm_seq_publish(m, s1) == 0);
	CHECK(kvmm_seq_free(m, s1) == 0);
	CHECK(kvmm_commit(m, &(struct kvmm_grow){s2, 24, b}, 1) == 0 && kvmm_seq_publish(m, s2) == 0);
	CHECK(kvmm_prefix_export(m, "owner", 5, &buf, &bytes) == 0);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	CHECK(f != NULL);
	CHECK(fwrite(&ctl, 1, 1, f) == 1 && fwrite(buf, 1, bytes, f) == bytes);
	fclose(f);
	free(buf);
	kvmm_destroy(m);
}

static void write_seeds(const char *dir)
{
	seed(dir, "bs4", 4, 0);
	seed(dir, "bs4-fixsum", 4, 1);
	seed(dir, "bs1-fixsum", 1, 1);
	seed(dir, "bs8", 8, 0);
}
