/*
 * bench/bench_kvmm.c — kvmm's figures, each against its target or a peer
 * measured in the same run:
 *
 *  1. page slack (allocated but unused KV) as a % of allocated KV, for a mix
 *     of request lengths drawn from long-tailed distributions, decoded one
 *     token per step (target < 4%, the level PagedAttention reports);
 *  2. pages held by 32 sequences sharing a 1024-token prefix, against the
 *     ideal of one copy of the prefix plus each sequence's own pages (target
 *     <= 1.05x), warm (prefix attached from the cache) and cold (all 32
 *     prefill the prefix in the same batch; publish deduplicates);
 *  3. sequence swap-out and swap-in bandwidth through kvmm's io_uring store,
 *     against fio with ioengine=io_uring on the same file system, same block
 *     size (one page) and queue depth (target >= 70% of fio);
 *  4. nanoseconds per page allocation + free (through commit / free);
 *  5. nanoseconds per page of prefix lookup (attach of a cached prompt).
 *
 *   build/bench/bench_kvmm [--dir DIR] [--swap-mib N] [--seq-pages N] [--rounds N] [--no-fio]
 *
 * DIR (default $KVD_BENCH_DIR, else /var/tmp) holds the swap file and fio's
 * file; both are removed at the end. Pages have SmolLM2-135M's geometry
 * (30 layers, 3 KV heads of 64, f16, 16 tokens: 368,640 bytes).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvmm.h"

#define BS 16
#define SMOL_PAGE_BYTES (30u * 2 * 3 * 64 * 2 * BS) /* 368,640 */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_state = 0x6b76642d62656e63ull;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double unif(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

/* Long-tailed lengths: log-normal with the given median, clipped. */
static uint32_t lognormal(double median, double sigma, uint32_t lo, uint32_t hi)
{
	double u1 = unif() + 1e-12, u2 = unif();
	double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
	double v = median * exp(sigma * z);

	return v < lo ? lo : v > hi ? hi : (uint32_t)v;
}

static void die(const char *what, int r)
{
	fprintf(stderr, "bench_kvmm: %s: %s\n", what, strerror(-r));
	exit(1);
}

#define TRY(what, call)                \
	do {                           \
		int r_ = (call);       \
		if (r_ < 0)            \
			die(what, r_); \
	} while (0)

struct row {
	char figure[64], value[32], target[24], ratio[24];
};
static struct row rows[16];
static int n_rows;

static void row(const char *figure, const char *value, const char *target, const char *ratio)
{
	struct row *r = &rows[n_rows++];

	snprintf(r->figure, sizeof(r->figure), "%s", figure);
	snprintf(r->value, sizeof(r->value), "%s", value);
	snprintf(r->target, sizeof(r->target), "%s", target);
	snprintf(r->ratio, sizeof(r->ratio), "%s", ratio);
}

static struct kvmm *make(size_t page_bytes, uint32_t n_pages, int prefix)
{
	struct kvmm_config c = {
		.page_bytes = page_bytes,
		.block_size = BS,
		.pool_bytes = (uint64_t)n_pages * page_bytes,
		.max_seqs = 4096,
		.prefix_cache = prefix,
	};
	struct kvmm *m;

	TRY("kvmm_create", kvmm_create(&c, &m));
	return m;
}

static int32_t *random_tokens(uint32_t n, int32_t salt)
{
	int32_t *t = malloc(n * sizeof(*t));

	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)(rnd() % 49152) ^ salt;
	return t;
}

static void grow(struct kvmm *m, uint32_t seq, const int32_t *t, uint32_t n)
{
	struct kvmm_grow g = {seq, n, t};

	TRY("kvmm_commit", kvmm_commit(m, &g, 1));
}

/* ---- 1. slack -------------------------------------------------------------------------- */

static void bench_slack(void)
{
	enum { N = 1000 };
	struct kvmm *m = make(1024, 200000, 0);
	uint32_t seq[N], prompt[N], gen[N], max_gen = 0;
	uint64_t tokens = 0;
	struct kvmm_ledger l;
	int32_t tok[4096] = {0};
	char v[32], ratio[24];
	double slack;

	for (int i = 0; i < N; i++) {
		prompt[i] = lognormal(300, 1.0, 4, 4096);
		gen[i] = lognormal(200, 1.0, 1, 2048);
		max_gen = gen[i] > max_gen ? gen[i] : max_gen;
		TRY("seq_new", kvmm_seq_new(m, &seq[i]));
		grow(m, seq[i], tok, prompt[i]);
		tokens += prompt[i] + gen[i];
	}
	/* Decode one token per step for every sequence still generating. */
	for (uint32_t step = 0; step < max_gen; step++) {
		static struct kvmm_grow g[N];
		size_t n = 0;

		for (int i = 0; i < N; i++)
			if (step < gen[i])
				g[n++] = (struct kvmm_grow){seq[i], 1, tok};
		TRY("commit", kvmm_commit(m, g, n));
	}
	kvmm_get_ledger(m, &l);
	slack = 100.0 * (1.0 - (double)l.kv_bytes_useful / (double)l.kv_bytes_allocated);
	snprintf(v, sizeof(v), "%.2f %%", slack);
	snprintf(ratio, sizeof(ratio), "%.2f", slack / 4.0);
	row("page slack, 1000 requests (log-normal lengths)", v, "< 4 %", ratio);
	printf("  slack: %d requests, %" PRIu64 " tokens, mean %.0f tokens, %" PRIu64 " pages of %d tokens\n", N, tokens,
	       (double)tokens / N, l.kv_bytes_allocated / 1024, BS);
	kvmm_destroy(m);
}

/* ---- 2. prefix sharing ---------------------------------------------------------------------- */

static void bench_prefix_sharing(void)
{
	enum { SEQS = 32, PREFIX = 1024, SUFFIX = 40, GEN = 100 };
	const uint32_t own_pages = (PREFIX + SUFFIX + GEN + BS - 1) / BS - PREFIX / BS;
	const uint32_t ideal = PREFIX / BS + SEQS * own_pages;
	int32_t *prefix = random_tokens(PREFIX, 0);
	char v[32], t[24], ratio[24];

	for (int cold = 0; cold < 2; cold++) {
		struct kvmm *m = make(1024, 4096, 1);
		uint32_t seq[SEQS];
		struct kvmm_stats st;

		for (int i = 0; i < SEQS; i++) {
			int32_t *p = malloc((PREFIX + SUFFIX) * sizeof(int32_t));
			uint32_t hit = 0;

			memcpy(p, prefix, PREFIX * sizeof(int32_t));
			for (int j = 0; j < SUFFIX; j++)
				p[PREFIX + j] = 50000 + i * 100 + j;
			TRY("seq_new", kvmm_seq_new(m, &seq[i]));
			if (!cold)
				TRY("attach", kvmm_prefix_attach(m, seq[i], p, PREFIX + SUFFIX, &hit));
			grow(m, seq[i], p + hit, PREFIX + SUFFIX - hit);
			if (!cold)
				TRY("publish", kvmm_seq_publish(m, seq[i]));
			free(p);
		}
		if (cold) /* the whole batch was computed, then published */
			for (int i = 0; i < SEQS; i++)
				TRY("publish", kvmm_seq_publish(m, seq[i]));
		for (int s = 0; s < GEN; s++)
			for (int i = 0; i < SEQS; i++) {
				int32_t tok = 7 + s;

				grow(m, seq[i], &tok, 1);
				TRY("publish", kvmm_seq_publish(m, seq[i]));
			}
		kvmm_get_stats(m, &st);
		snprintf(v, sizeof(v), "%u pages", st.pages_used);
		snprintf(t, sizeof(t), "<= %.0f (1.05x)", ideal * 1.05);
		snprintf(ratio, sizeof(ratio), "%.3fx ideal", (double)st.pages_used / ideal);
		row(cold ? "32 seqs, 1024-tok prefix, cold batch (dedup)" : "32 seqs, 1024-tok prefix, attached", v, t,
		    ratio);
		kvmm_destroy(m);
	}
	printf("  prefix: ideal = %u prefix pages + 32 x %u own pages (%u-token suffix, %u generated) = %u\n",
	       PREFIX / BS, own_pages, SUFFIX, GEN, ideal);
	free(prefix);
}

/* ---- 3. swap bandwidth vs fio --------------------------------------------------------------------- */

/* fio's bandwidth in bytes/s for one job, from its JSON output. */
static double run_fio(const char *file, const char *rw, uint64_t bytes, bool direct)
{
	char cmd[1024], *out = NULL, *p;
	size_t cap = 0, len = 0;
	double bw = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd),
		 "fio --name=kvmm --filename=%s --rw=%s --bs=%u --size=%" PRIu64
		 " --ioengine=io_uring --iodepth=%d --direct=%d --fixedbufs --registerfiles --output-format=json "
		 "2>/dev/null",
		 file, rw, SMOL_PAGE_BYTES, bytes, KVMM_SWAP_QUEUE_DEPTH, direct ? 1 : 0);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			cap = cap ? cap * 2 : 65536;
			out = realloc(out, cap);
		}
		size_t n = fread(out + len, 1, 4096, f);

		if (n == 0)
			break;
		len += n;
	}
	if (pclose(f) != 0 || !out) {
		free(out);
		return -1;
	}
	out[len] = 0;
	p = strstr(out, strcmp(rw, "write") == 0 ? "\"write\" : {" : "\"read\" : {");
	if (p)
		p = strstr(p, "\"bw_bytes\"");
	if (p && (p = strchr(p, ':')))
		bw = strtod(p + 1, NULL);
	free(out);
	return bw;
}

static void bench_swap(const char *dir, uint64_t swap_mib, uint32_t pages_per_seq, int rounds, bool use_fio)
{
	uint64_t want = swap_mib << 20;
	uint32_t n_seqs = (uint32_t)(want / ((uint64_t)pages_per_seq * SMOL_PAGE_BYTES));
	uint32_t n_pages = n_seqs * pages_per_seq;
	uint64_t bytes = (uint64_t)n_pages * SMOL_PAGE_BYTES;
	char swap_path[4096], fio_path[4096], v[32], t[24], ratio[24];
	struct kvmm_config c = {
		.page_bytes = SMOL_PAGE_BYTES,
		.block_size = BS,
		.pool_bytes = (uint64_t)(n_pages + 4) * SMOL_PAGE_BYTES,
		.max_seqs = 256,
		.swap_path = swap_path,
		.swap_bytes = bytes + (8u << 20),
	};
	double best_out = 0, best_in = 0, fio_w = 0, fio_r = 0;
	struct kvmm *m;
	uint32_t *seq = calloc(n_seqs, sizeof(*seq));
	int32_t *tok = calloc(pages_per_seq * BS, sizeof(int32_t));
	struct kvmm_stats st;
	struct kvmm_ledger l;
	bool direct;

	(void)l;
	if (n_seqs == 0) {
		fprintf(stderr, "bench_kvmm: --swap-mib too small\n");
		exit(2);
	}
	snprintf(swap_path, sizeof(swap_path), "%s/kvmm-bench-swap.%d", dir, (int)getpid());
	snprintf(fio_path, sizeof(fio_path), "%s/kvmm-bench-fio.%d", dir, (int)getpid());
	TRY("kvmm_create (swap)", kvmm_create(&c, &m));
	for (uint32_t i = 0; i < n_seqs; i++) {
		uint32_t np;
		const int32_t *pg;

		TRY("seq_new", kvmm_seq_new(m, &seq[i]));
		grow(m, seq[i], tok, pages_per_seq * BS);
		pg = kvmm_seq_pages(m, seq[i], &np);
		for (uint32_t j = 0; j < np; j++) /* touch: resident before timing */
			memset((char *)kvmm_pool_base(m) + (size_t)pg[j] * SMOL_PAGE_BYTES, (int)(i + j), SMOL_PAGE_BYTES);
	}
	kvmm_get_ledger(m, &l);
	{
		/* Ask a store what it gets here: O_DIRECT is refused on some file
		 * systems, and fio must then run buffered too. */
		struct kvmm_swap_io *probe = NULL;

		direct = false;
		if (kvmm_swap_io_uring_open(fio_path, 1 << 20, 0, &probe) == 0) {
			direct = probe->flags & KVMM_SWAP_DIRECT;
			kvmm_swap_io_free(probe);
		}
		unlink(fio_path);
	}
	/* Rounds alternate kvmm and fio so both see the same device weather. */
	for (int r = 0; r < rounds; r++) {
		uint64_t t0 = now_ns(), t1, t2;

		for (uint32_t i = 0; i < n_seqs; i++)
			TRY("swap_out", kvmm_seq_swap_out(m, seq[i]));
		t1 = now_ns();
		if (use_fio)
			fio_w = fmax(fio_w, run_fio(fio_path, "write", bytes, direct));
		t2 = now_ns();
		for (uint32_t i = 0; i < n_seqs; i++)
			TRY("swap_in", kvmm_seq_swap_in(m, seq[i]));
		best_out = fmax(best_out, (double)bytes / ((double)(t1 - t0) / 1e9));
		best_in = fmax(best_in, (double)bytes / ((double)(now_ns() - t2) / 1e9));
		if (getenv("KVMM_BENCH_VERBOSE"))
			printf("  round %d: out %.0f MB/s, in %.0f MB/s, fio w %.0f r %.0f (best so far)\n", r,
			       (double)bytes / ((double)(t1 - t0) / 1e3), (double)bytes / ((double)(now_ns() - t2) / 1e3),
			       fio_w / 1e6, fio_r / 1e6);
		if (use_fio)
			fio_r = fmax(fio_r, run_fio(fio_path, "read", bytes, direct));
	}
	kvmm_get_stats(m, &st);
	kvmm_destroy(m);
	unlink(swap_path);
	unlink(fio_path);
	printf("  swap: %u sequences x %u pages of %u bytes = %.0f MiB each way, %s, best of %d; file in %s\n", n_seqs,
	       pages_per_seq, SMOL_PAGE_BYTES, bytes / 1048576.0, direct ? "O_DIRECT" : "buffered (no O_DIRECT)", rounds,
	       dir);
	snprintf(v, sizeof(v), "%.0f MB/s", best_out / 1e6);
	if (fio_w > 0) {
		snprintf(t, sizeof(t), ">= %.0f (70%% fio)", 0.7 * fio_w / 1e6);
		snprintf(ratio, sizeof(ratio), "%.2f of fio %.0f", best_out / fio_w, fio_w / 1e6);
	} else {
		snprintf(t, sizeof(t), ">= 70%% of fio");
		snprintf(ratio, sizeof(ratio), "fio n/a");
	}
	row("swap-out bandwidth (io_uring, 1 page/IO, QD32)", v, t, ratio);
	snprintf(v, sizeof(v), "%.0f MB/s", best_in / 1e6);
	if (fio_r > 0) {
		snprintf(t, sizeof(t), ">= %.0f (70%% fio)", 0.7 * fio_r / 1e6);
		snprintf(ratio, sizeof(ratio), "%.2f of fio %.0f", best_in / fio_r, fio_r / 1e6);
	} else {
		snprintf(t, sizeof(t), ">= 70%% of fio");
		snprintf(ratio, sizeof(ratio), "fio n/a");
	}
	row("swap-in bandwidth (io_uring, 1 page/IO, QD32)", v, t, ratio);
	free(seq);
	free(tok);
}

/* ---- 4 and 5. costs --------------------------------------------------------------------------------- */

static void bench_costs(void)
{
	enum { PAGES = 64, ITERS = 20000, LOOKUPS = 20000 };
	struct kvmm *m = make(1024, 4096, 1);
	int32_t tok[BS] = {0}, *prompt = random_tokens(PAGES * BS + 1, 0);
	uint64_t t0, total = 0;
	uint32_t s, hit;
	char v[32];

	/* Page by page growth to 64 pages, then free: one allocation and one
	 * free per page, through the public calls the engine uses. */
	t0 = now_ns();
	for (int it = 0; it < ITERS; it++) {
		TRY("seq_new", kvmm_seq_new(m, &s));
		for (int p = 0; p < PAGES; p++)
			grow(m, s, tok, BS);
		TRY("seq_free", kvmm_seq_free(m, s));
	}
	snprintf(v, sizeof(v), "%.1f ns", (double)(now_ns() - t0) / ((double)ITERS * PAGES));
	row("page alloc+free (commit of 16 tokens, free)", v, "-", "-");

	/* Prefix lookup: a cached 64-page prompt attached, 64 pages mapped. */
	TRY("seq_new", kvmm_seq_new(m, &s));
	grow(m, s, prompt, PAGES * BS);
	TRY("publish", kvmm_seq_publish(m, s));
	TRY("seq_free", kvmm_seq_free(m, s));
	for (int it = 0; it < LOOKUPS; it++) {
		TRY("seq_new", kvmm_seq_new(m, &s));
		t0 = now_ns();
		TRY("attach", kvmm_prefix_attach(m, s, prompt, PAGES * BS + 1, &hit));
		total += now_ns() - t0;
		if (hit != PAGES * BS)
			die("attach missed", -EPROTO);
		TRY("seq_free", kvmm_seq_free(m, s));
	}
	snprintf(v, sizeof(v), "%.1f ns", (double)total / ((double)LOOKUPS * PAGES));
	row("prefix lookup per page (hash+compare+map)", v, "-", "-");
	kvmm_destroy(m);
	free(prompt);
}

int main(int argc, char **argv)
{
	const char *dir = getenv("KVD_BENCH_DIR");
	uint64_t swap_mib = 1024;
	uint32_t seq_pages = 256; /* 4096-token sequences */
	int rounds = 5;
	bool use_fio = true;

	if (!dir || !*dir)
		dir = "/var/tmp";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--swap-mib") && i + 1 < argc)
			swap_mib = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--seq-pages") && i + 1 < argc)
			seq_pages = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--no-fio"))
			use_fio = false;
		else {
			fprintf(stderr, "usage: %s [--dir DIR] [--swap-mib N] [--seq-pages N] [--rounds N] [--no-fio]\n", argv[0]);
			return 2;
		}
	}
	if (use_fio && system("command -v fio >/dev/null 2>&1") != 0) {
		fprintf(stderr, "bench_kvmm: fio not found (apt-get install fio); swap figures without a peer\n");
		use_fio = false;
	}
	printf("kvmm benchmark\n");
	bench_slack();
	bench_prefix_sharing();
	bench_swap(dir, swap_mib, seq_pages ? seq_pages : 1, rounds < 1 ? 1 : rounds, use_fio);
	bench_costs();
	printf("\n%-48s %-14s %-20s %s\n", "figure", "value", "target", "ratio");
	for (int i = 0; i < n_rows; i++)
		printf("%-48s %-14s %-20s %s\n", rows[i].figure, rows[i].value, rows[i].target, rows[i].ratio);
	return 0;
}
