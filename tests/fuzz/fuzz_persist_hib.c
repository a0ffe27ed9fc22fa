/*
 * tests/fuzz/fuzz_persist_hib.c — libFuzzer target for the reader of the
 * hibernation file (kvmm/hibernate.c), which comes from disk and is never
 * trusted.
 *
 * Input: one control byte (bit 0: recompute the header's and the index's
 * checksums after the fuzzer's changes, so that the checks behind them are
 * reached; bits 1-2: the block size of the receiving pool, 1, 2, 4 or 8
 * tokens of 8 bytes), then the file's bytes, copied into memory of exactly
 * their size (reading past them is an ASan error). A file that opens is
 * adopted into a fresh pool of 16 pages, two pages a call.
 *
 * Promises checked: open returns 0, -EBADMSG or -EPROTO; adoption ends
 * (at most one call per entry and one more), with 0 or -ESTALE (another
 * layout, nothing entered); every entry is counted once as adopted,
 * present, refused or skipped; the pool's cached pages are the adopted
 * ones; kvmm_check() stays clean. Sanitizers catch the rest.
 */
#include <errno.h>
#include <stdio.h>

#include "kvmm.h"
#include "fuzz_util.h"

#define POOL_PAGES 16
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
	struct kvmm_hib_progress p = {0};
	struct kvmm_hib_info info;
	struct kvmm_stats st;
	struct kvmm_hib *h = NULL;
	struct kvmm *m = NULL;
	const char *why = NULL;
	uint8_t *buf;
	uint32_t bs, calls = 0;
	int r;

	if (size < 1)
		return 0;
	bs = 1u << ((data[0] >> 1) & 3);
	buf = malloc(size - 1 ? size - 1 : 1);
	if (!buf)
		return 0;
	memcpy(buf, data + 1, size - 1);
	if (data[0] & 1)
		(void)kvmm_debug_hib_checksum(buf, size - 1);
	r = kvmm_hib_open_mem(buf, size - 1, &h, &why);
	CHECK(r == 0 || r == -EBADMSG || r == -EPROTO || r == -ENOMEM);
	CHECK(r == 0 || r == -ENOMEM || why != NULL);
	if (r < 0)
		goto out;
	CHECK(kvmm_hib_info(h, &info) == 0);
	c.page_bytes = (size_t)bs * TOKEN_BYTES;
	c.block_size = bs;
	c.pool_bytes = (uint64_t)POOL_PAGES * c.page_bytes;
	c.max_seqs = 4;
	c.prefix_cache = 1;
	if (kvmm_create(&c, &m) < 0)
		goto out;
	while ((r = kvmm_hib_adopt(m, h, 2, &p)) == 1)
		CHECK(++calls <= info.n_entries + 1);
	CHECK(r == 0 || r == -ESTALE || r == -ENOMEM);
	kvmm_get_stats(m, &st);
	CHECK(kvmm_check(m, NULL, 0) == 0);
	if (r == -ESTALE) {
		CHECK(info.block_size != bs || info.page_bytes != c.page_bytes);
		CHECK(st.pages_cached == 0 && st.pages_free == POOL_PAGES);
	} else if (r == 0) {
		CHECK(p.adopted + p.present + p.refused + p.skipped == info.n_entries);
		CHECK(p.adopted <= POOL_PAGES && st.pages_cached == p.adopted);
	}
out:
	kvmm_hib_close(h);
	kvmm_destroy(m);
	free(buf);
	return 0;
}

/* ---- seeds: real files (KVD_FUZZ_WRITE_SEEDS=DIR) ---------------------------------- */

/* Two prompts sharing their first page in scopes 1 and 2, saved. */
static void seed(const char *dir, const char *name, uint32_t bs, int fix_checksum)
{
	struct kvmm_config c = {
		.page_bytes = (size_t)bs * TOKEN_BYTES, .block_size = bs,
		.pool_bytes = (uint64_t)POOL_PAGES * bs * TOKEN_BYTES, .max_seqs = 4, .prefix_cache = 1,
	};
	struct kvmm *m = NULL;
	int32_t a[8], b[8];
	uint32_t s1, s2;
	char path[4096], tmp[] = "/tmp/kvd-fuzz-hib-XXXXXX";
	uint8_t ctl = (uint8_t)(fix_checksum | (__builtin_ctz(bs) << 1)), *bytes;
	FILE *f;
	long n;

	for (int i = 0; i < 8; i++) {
		a[i] = 10 + i;
		b[i] = i < (int)bs ? a[i] : 300 + i;
	}
	CHECK(mkdtemp(tmp) != NULL);
	CHECK(kvmm_create(&c, &m) == 0);
	CHECK(kvmm_seq_new(m, &s1) == 0 && kvmm_seq_new(m, &s2) == 0);
	CHECK(kvmm_seq_set_scope(m, s1, 1) == 0 && kvmm_seq_set_scope(m, s2, 2) == 0);
	CHECK(kvmm_commit(m, &(struct kvmm_grow){s1, 2 * bs, a}, 1) == 0 && kvmm_seq_publish(m, s1) == 0);
	CHECK(kvmm_seq_free(m, s1) == 0);
	CHECK(kvmm_commit(m, &(struct kvmm_grow){s2, 2 * bs, b}, 1) == 0 && kvmm_seq_publish(m, s2) == 0);
	snprintf(path, sizeof(path), "%s/f", tmp);
	CHECK(kvmm_hib_save(m, path, "owner", 5, 1ull << 20, 0, NULL) == 0);
	f = fopen(path, "rb");
	CHECK(f != NULL);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	bytes = malloc((size_t)n);
	CHECK(bytes && fread(bytes, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	unlink(path);
	rmdir(tmp);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	CHECK(f != NULL);
	CHECK(fwrite(&ctl, 1, 1, f) == 1 && fwrite(bytes, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	free(bytes);
	kvmm_destroy(m);
}

static void write_seeds(const char *dir)
{
	seed(dir, "bs4-fixsum", 4, 1);
	seed(dir, "bs1", 1, 0);
}
