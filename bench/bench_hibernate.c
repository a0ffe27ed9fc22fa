/*
 * bench/bench_hibernate.c — how fast kvmm writes its cached prefix pages to
 * the hibernation file at a stop, and reads them back at a start.
 *
 *   build/bench/bench_hibernate DIR [MIB] [save]
 *
 * A pool of SmolLM2-135M's page size (368,640 bytes: 30 layers x 3 KV heads
 * x 64 x K,V x 2 bytes x 16 tokens) is filled with MIB (default 256) of
 * cached pages in chains of 64, their bytes random; kvmm_hib_save() writes
 * them to DIR/bench-prefix-cache with persist_size = MIB, then a fresh pool
 * opens and adopts the file (checksums included). Prints one line each:
 * "publish: ..." (the CPU time kvmm_seq_publish takes per page, its
 * checksum included), "save: N pages, B bytes, T ms, R MiB/s", "save cpu: ..." (the CPU time
 * of the whole process during the save, helper threads and io_uring workers
 * included, per MiB written) and "adopt: ..." ("save" as the third
 * argument: the save only, for profiling it). bench/hibernate.sh
 * runs it beside fio on the same directory. Write rates through the page
 * cache (no O_DIRECT) measure memory, not the disk: the line says which.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kvmm.h"

#define PAGE_BYTES 368640u
#define BS 16u
#define CHAIN_PAGES 64u

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CPU time of the whole process (helper threads and io_uring workers
 * included: they are its threads), in ns. */
static uint64_t cpu_ns(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

static struct kvmm *pool(uint32_t n_pages)
{
	struct kvmm_config c = {
		.page_bytes = PAGE_BYTES, .block_size = BS, .pool_bytes = (uint64_t)n_pages * PAGE_BYTES,
		.max_seqs = 64, .prefix_cache = 1,
	};
	struct kvmm *m = NULL;
	int r = kvmm_create(&c, &m);

	if (r < 0) {
		fprintf(stderr, "kvmm_create: %s\n", strerror(-r));
		exit(1);
	}
	return m;
}

int main(int argc, char **argv)
{
	uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 256, t0, c0, pub_ns = 0;
	int save_only = argc > 3 && strcmp(argv[3], "save") == 0;
	uint32_t n_pages = (uint32_t)(mib * 1048576ull / PAGE_BYTES), made = 0;
	struct kvmm_hib_save_stats st;
	struct kvmm_hib_progress p = {0};
	struct kvmm_hib *h = NULL;
	struct kvmm *m, *m2;
	char path[4096];
	int32_t *tok;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	const char *why = NULL;
	int r;

	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR [MIB] [save]\n", argv[0]);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/bench-prefix-cache", argv[1]);
	unlink(path);
	m = pool(n_pages + 8);
	tok = malloc((size_t)CHAIN_PAGES * BS * sizeof(*tok));
	for (uint32_t chain = 0; made < n_pages; chain++) {
		uint32_t s, len = (n_pages - made < CHAIN_PAGES ? n_pages - made : CHAIN_PAGES) * BS, np;
		const int32_t *pages;

		for (uint32_t i = 0; i < len; i++)
			tok[i] = (int32_t)(chain * 100000 + i);
		if (kvmm_seq_new(m, &s) < 0 || kvmm_commit(m, &(struct kvmm_grow){s, len, tok}, 1) < 0)
			return 1;
		pages = kvmm_seq_pages(m, s, &np);
		for (uint32_t i = 0; i < np; i++) {
			uint64_t *w = (uint64_t *)((char *)kvmm_pool_base(m) + (size_t)pages[i] * PAGE_BYTES);

			for (size_t k = 0; k < PAGE_BYTES / 8; k++) {
				rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
				w[k] = rng;
			}
		}
		t0 = thread_cpu_ns();
		if (kvmm_seq_publish(m, s) < 0)
			return 1;
		pub_ns += thread_cpu_ns() - t0;
		if (kvmm_seq_free(m, s) < 0)
			return 1;
		made += np;
	}
	printf("publish: %.1f us CPU per page (each page's checksum is taken as it enters the index)\n",
	       (double)pub_ns / 1e3 / (made ? made : 1));
	c0 = cpu_ns();
	r = kvmm_hib_save(m, path, "bench", 5, mib * 1048576ull + 16 * 4096 + (uint64_t)n_pages * 128, 0, &st);
	if (r < 0) {
		fprintf(stderr, "kvmm_hib_save: %s\n", strerror(-r));
		return 1;
	}
	printf("save: %u pages, %llu bytes, %.1f ms, %.0f MiB/s (%s, %s, %u pages hashed)\n", st.pages_written,
	       (unsigned long long)st.bytes, (double)st.ns / 1e6, (double)st.bytes / 1048576.0 / ((double)st.ns / 1e9),
	       st.direct ? "O_DIRECT" : "page cache", st.preallocated ? "preallocated" : "not preallocated",
	       st.pages_hashed);
	c0 = cpu_ns() - c0;
	printf("save cpu: %.1f ms, %.3f ms per MiB (all threads, user and system)\n", (double)c0 / 1e6,
	       (double)c0 / 1e6 / ((double)st.bytes / 1048576.0));
	if (save_only) {
		unlink(path);
		kvmm_destroy(m);
		free(tok);
		return 0;
	}
	m2 = pool(n_pages + 8);
	t0 = now_ns();
	r = kvmm_hib_open(path, &h, &why);
	if (r < 0) {
		fprintf(stderr, "kvmm_hib_open: %s\n", why ? why : strerror(-r));
		return 1;
	}
	printf("open: %.2f ms (header and index: what delays READY=1)\n", (double)(now_ns() - t0) / 1e6);
	while ((r = kvmm_hib_adopt(m2, h, 0, &p)) == 1)
		;
	printf("adopt: %u pages, %.1f ms, %.0f MiB/s, refused %u\n", p.adopted, (double)(now_ns() - t0) / 1e6,
	       (double)p.adopted * PAGE_BYTES / 1048576.0 / ((double)(now_ns() - t0) / 1e9), p.refused);
	kvmm_hib_close(h);
	unlink(path);
	kvmm_destroy(m);
	kvmm_destroy(m2);
	free(tok);
	return r < 0;
}
