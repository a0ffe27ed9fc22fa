/*
 * bench/kvd_bench.c — kvd's engine measured directly, one figure per run,
 * printed as one JSON object so scripts/bench can set it beside llama.cpp's.
 *
 *   kvd_bench --model M --threads N decode --depth D [--tokens T]
 *       single-stream decode tokens/s after a D-token context
 *   kvd_bench --model M --threads N prefill --tokens P
 *       prefill tokens/s (time to first token) of a P-token prompt, after
 *       one untimed prefill of another P-token prompt (as llama-bench's
 *       warm-up run, and as a running daemon is warm: the scratch of a
 *       P-token step grown and the pool's pages touched once); the JSON
 *       gives the cold figure too (cold_tokens_per_s)
 *   kvd_bench --model M --threads N batch --seqs S [--depth D] [--tokens T]
 *       aggregate decode tokens/s of S sequences decoded together
 *   kvd_bench --model M --threads N prefix --tokens P [--suffix K]
 *       time to first token for a prompt whose P-token prefix is cached
 *       (after a first request with the same prefix), against cold
 *   kvd_bench [--threads N] triad [--mib N]
 *       memory bandwidth, STREAM triad a[i] = b[i] + s * c[i] over N
 *       threads, best of 5
 *   kvd_bench [--threads N] read [--mib N]
 *       read bandwidth: one N MiB array summed over N threads, best of 5
 *       (the traffic of a decode step's weights), the best of the hardware
 *       prefetchers alone (plain_gb_per_s) and with software prefetches
 *       (prefetchnta 512, 1,024 or 4,096 bytes ahead, prefetcht0 512 or
 *       2,048: which one, `prefetch`)
 *
 *   kvd_bench [--threads N] peak
 *       compute ceilings over N threads at once, multiply-adds per second
 *       (GMAC/s) of the instructions the matrix products are built on:
 *       f32 FMA (ymm, and zmm where AVX-512 is), AVX2's vpmaddubsw alone
 *       and with the vpmaddwd that widens its sums (one of each per 32
 *       products: the ceiling of an exact int8 dot that widens every
 *       product vector, as q8_0's does), AVX-512 VNNI's vpdpbusd; int8_gmacs
 *       is the int8 peak of the kernel set in use (VNNI, else vpmaddubsw).
 *       prefill, decode and batch print macs_per_token (macs_per_token()),
 *       so that tokens/s times it sets a figure against these peaks
 *
 * --cache-type f16|bf16|q8_0|q4_0|f32 (before the figure) sets the K/V element
 * type (default f16). --fast-depth (decode, batch): the first D - 1
 * positions of each context are only allocated (kvmm_commit), their K/V
 * left as the pool holds them (zeros), and the last one is computed: the
 * decode figure at depth D without the minutes a long prefill takes (a
 * decode step's work does not depend on the values it reads; the
 * generated tokens are then meaningless). Those pages are filled with
 * pseudo-random K/V rows stored in the cache's type, so that every page is
 * real, distinct memory (untouched pages of the pool's memfd could all be
 * read from one zero page, and caches would flatter the figure).
 *
 * --probe (decode, batch): the read probe (as `read`, --mib N, default 1024)
 * just before and just after the timed steps, in the same process, so that
 * the step's reads per second (reads_gb_per_s: bytes_per_step times steps
 * per second) can be set against the bandwidth of the same window
 * (probe_before_gb_per_s, probe_after_gb_per_s; this host's moves by half
 * within minutes).
 *
 * Prompts are deterministic pseudo-random token ids (the same ones the
 * llama.cpp side uses, from the same generator: x = x * 1103515245 + 12345,
 * id = 100 + (x >> 8) % (n_vocab - 200)). Greedy decoding, EOS ignored.
 * Peak RSS (ru_maxrss) is reported with every figure; decode and batch
 * figures also give cpu_seconds, the process's CPU time over the timed
 * steps (with --threads 1, the figure least moved by other load).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cpu/kvquant.h"
#include "daemon/engine.h"
#include "kvmm.h"
#include "model.h"
#include "sampler.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (every thread): with --threads 1 a figure
 * that other programs' load on the machine shifts far less than the wall
 * clock's */
static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long peak_rss_kib(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

static void prompt_ids(int32_t *out, int n, int32_t n_vocab, uint32_t seed)
{
	uint32_t x = seed;
	for (int i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		out[i] = 100 + (int32_t)((x >> 8) % (uint32_t)(n_vocab - 200));
	}
}

struct triad_arg {
	double *a, *b, *c;
	size_t lo, hi;
	uint64_t sum;
	int pf; /* read: prefetch this many bytes ahead, > 0 non-temporal, < 0 into all levels */
};

static void *triad_part(void *p)
{
	struct triad_arg *t = p;
	for (size_t i = t->lo; i < t->hi; i++)
		t->a[i] = t->b[i] + 3.0 * t->c[i];
	return NULL;
}

/* the read-only probe: what a decode step does to its weights, every byte
 * read once and nothing written back (four independent 16-byte sums, so that the
 * loads, not the additions' chain, set the pace), with the hardware
 * prefetchers alone or also a software prefetch a fixed distance ahead (on
 * some cores that reads 10-20 % more, and the kernels use it) */
typedef uint64_t u64x2 __attribute__((vector_size(16)));

static void *read_part(void *p)
{
	struct triad_arg *t = p;
	const u64x2 *v = (const u64x2 *)t->b;
	u64x2 s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0;
	/* in 64-byte lines, each slice's bounds rounded down to one */
	size_t lo = t->lo / 8 * 4, hi = t->hi / 8 * 4;
	const size_t ahead = (size_t)(t->pf < 0 ? -t->pf : t->pf) / 16;
	for (size_t i = lo; i < hi; i += 4) {
		if (t->pf > 0)
			__builtin_prefetch(v + i + ahead, 0, 0);
		else if (t->pf < 0)
			__builtin_prefetch(v + i + ahead, 0, 3);
		s0 += v[i];
		s1 += v[i + 1];
		s2 += v[i + 2];
		s3 += v[i + 3];
	}
	s0 += s1 + s2 + s3;
	t->sum = s0[0] + s0[1];
	return NULL;
}

static double bandwidth(size_t mib, int threads, int read_only, int pf);

/* The read bandwidth, the best the machine gives: with the hardware
 * prefetchers alone (*plain) and with software prefetches of either kind
 * at a few distances (*best_pf: 0 none, > 0 prefetchnta, < 0 prefetcht0
 * that many bytes ahead). -1 when the memory cannot be had. */
static double read_probe(size_t mib, int threads, double *plain, int *best_pf)
{
	static const int pfs[] = {512, 1024, 4096, -512, -2048};
	double gbs = bandwidth(mib, threads, 1, 0);
	*plain = gbs;
	*best_pf = 0;
	for (size_t i = 0; gbs >= 0 && i < sizeof pfs / sizeof pfs[0]; i++) {
		double g = bandwidth(mib, threads, 1, pfs[i]);
		if (g > gbs) {
			gbs = g;
			*best_pf = pfs[i];
		}
	}
	return gbs;
}

/* Memory bandwidth over `threads` threads (each its own slice), best of 5:
 * STREAM triad a = b + 3c over three arrays of mib/3 MiB together, or
 * (read_only) a sum over one array of mib MiB, prefetching pf bytes ahead
 * (read_part). */
static double bandwidth(size_t mib, int threads, int read_only, int pf)
{
	size_t n = mib * (1u << 20) / sizeof(double) / (read_only ? 1 : 3);
	double *a = read_only ? NULL : malloc(n * sizeof(double));
	double *b = malloc(n * sizeof(double)), *c = read_only ? NULL : malloc(n * sizeof(double));
	double best = 0;
	pthread_t th[64];
	struct triad_arg ta[64];
	void *(*part)(void *) = read_only ? read_part : triad_part;
	uint64_t sum = 0;
	if (!b || (!read_only && (!a || !c)) || threads < 1 || threads > 64) {
		free(a);
		free(b);
		free(c);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		if (!read_only) {
			a[i] = 0;
			c[i] = 1.0;
		}
		b[i] = (double)i;
	}
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_s();
		for (int k = 0; k < threads; k++) {
			ta[k] = (struct triad_arg){a, b, c, n * (size_t)k / (size_t)threads,
						   n * (size_t)(k + 1) / (size_t)threads, 0, pf};
			if (k)
				pthread_create(&th[k], NULL, part, &ta[k]);
		}
		part(&ta[0]);
		for (int k = 1; k < threads; k++)
			pthread_join(th[k], NULL);
		double dt = now_s() - t0;
		double gbs = (read_only ? 1.0 : 3.0) * n * sizeof(double) / dt / 1e9;
		if (gbs > best)
			best = gbs;
		for (int k = 0; k < threads; k++)
			sum += ta[k].sum;
	}
	volatile double sink = read_only ? (double)sum : a[n / 2];
	(void)sink;
	free(a);
	free(b);
	free(c);
	return best;
}

/* The compute ceilings the matrix products run into: each thread issues
 * one instruction again and again into 12 independent accumulators (so
 * that only its throughput, not its latency, sets the pace), written in
 * assembly so that no compiler folds or reorders it. Multiply-adds per
 * instruction: vfmadd231ps 8 (ymm) or 16 (zmm); vpmaddubsw 32 (ymm: 32
 * byte products into 16 int16 pair sums); vpmaddubsw followed by the
 * vpmaddwd that widens its pairs to int32, 32 per pair of instructions
 * (what an exact int8 dot costs on AVX2 where every product vector must be
 * widened, as q8_0's must); vpdpbusd 64 (zmm, AVX-512 VNNI: products
 * summed into int32 in one instruction). */
enum peak_kind { PK_FMA_YMM, PK_MADDUBS, PK_MADDUBS_WD, PK_FMA_ZMM, PK_DPBUSD, PK_N };

static const struct {
	const char *name;
	int macs; /* per iteration of the loop below: 12 accumulators */
} peak_kinds[PK_N] = {
	{"f32_fma_ymm", 12 * 8}, {"int8_maddubs", 12 * 32}, {"int8_maddubs_maddwd", 12 * 32},
	{"f32_fma_zmm", 12 * 16}, {"int8_vnni", 12 * 64},
};

struct peak_arg {
	enum peak_kind kind;
	long iters;
};

#define R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define CLOBBER12 "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"

#if defined(__x86_64__)
#define I_FMA_Y(i) "vfmadd231ps %%ymm12, %%ymm13, %%ymm" #i "\n\t"
#define I_MUB(i) "vpmaddubsw %%ymm12, %%ymm13, %%ymm" #i "\n\t"
#define I_MUBWD(i) "vpmaddubsw %%ymm12, %%ymm13, %%ymm" #i "\n\tvpmaddwd %%ymm" #i ", %%ymm13, %%ymm" #i "\n\t"
#define I_FMA_Z(i) "vfmadd231ps %%zmm12, %%zmm13, %%zmm" #i "\n\t"
#define I_DPB(i) "vpdpbusd %%zmm12, %%zmm13, %%zmm" #i "\n\t"
#define PEAK_LOOP(PRE, BODY)                                                                        \
	__asm__ volatile(PRE "1:\n\t" R12(BODY) "dec %0\n\tjnz 1b\n\tvzeroupper" : "+r"(n) : : CLOBBER12, \
			 "xmm12", "xmm13", "cc")
#define ZERO_Y "vpxor %%xmm12, %%xmm12, %%xmm12\n\tvpxor %%xmm13, %%xmm13, %%xmm13\n\t"
#endif

static void *peak_part(void *p)
{
	struct peak_arg *a = p;
	long n = a->iters;
#if defined(__x86_64__)
	switch (a->kind) {
	case PK_FMA_YMM: PEAK_LOOP(ZERO_Y, I_FMA_Y); break;
	case PK_MADDUBS: PEAK_LOOP(ZERO_Y, I_MUB); break;
	case PK_MADDUBS_WD: PEAK_LOOP(ZERO_Y, I_MUBWD); break;
	case PK_FMA_ZMM: PEAK_LOOP(ZERO_Y, I_FMA_Z); break;
	case PK_DPBUSD: PEAK_LOOP(ZERO_Y, I_DPB); break;
	default: break;
	}
#else
	(void)n;
#endif
	return NULL;
}

static int peak_supported(enum peak_kind k)
{
#if defined(__x86_64__)
	switch (k) {
	case PK_FMA_YMM: return __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
	case PK_MADDUBS:
	case PK_MADDUBS_WD: return __builtin_cpu_supports("avx2");
	case PK_FMA_ZMM: return __builtin_cpu_supports("avx512f");
	case PK_DPBUSD: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
	default: return 0;
	}
#else
	(void)k;
	return 0;
#endif
}

/* Multiply-adds per second of kind k over `threads` threads at once, best
 * of 5 runs of about a tenth of a second each; -1 when the CPU lacks it. */
static double peak_rate(enum peak_kind k, int threads)
{
	if (!peak_supported(k) || threads < 1 || threads > 64)
		return -1;
	pthread_t th[64];
	struct peak_arg pa[64];
	long iters = 1000;
	double best = 0;
	for (;;) { /* about 0.1 s on one thread */
		struct peak_arg one = {k, iters};
		double t0 = now_s();
		peak_part(&one);
		double dt = now_s() - t0;
		if (dt > 0.02 || iters > (1L << 40)) {
			iters = (long)(iters * (0.1 / (dt > 0 ? dt : 1e-9))) + 1;
			break;
		}
		iters *= 4;
	}
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_s();
		for (int i = 0; i < threads; i++) {
			pa[i] = (struct peak_arg){k, iters};
			if (i)
				pthread_create(&th[i], NULL, peak_part, &pa[i]);
		}
		peak_part(&pa[0]);
		for (int i = 1; i < threads; i++)
			pthread_join(th[i], NULL);
		double r = (double)threads * (double)iters * peak_kinds[k].macs / (now_s() - t0);
		if (r > best)
			best = r;
	}
	return best;
}

/* Every row of the sequence's first n_pages pages: pseudo-random K/V in
 * the pool's type (see --fast-depth). */
static int fill_pages(struct kvd_engine *e, uint32_t seq, uint32_t n_tokens)
{
	struct kvmm *kv = kvd_engine_kvmm(e);
	const struct kvd_kv_layout *L = kvd_engine_kv_layout(e);
	uint32_t np = 0;
	const int32_t *pages = kvmm_seq_pages(kv, seq, &np);
	float *row = malloc(sizeof(float) * L->kv_dim);
	uint32_t x = 12345;
	if (!row || !pages)
		return free(row), -1;
	for (uint32_t p = 0; p < np && p * L->block_size < n_tokens; p++) {
		char *page = (char *)kvmm_pool_base(kv) + (size_t)pages[p] * L->page_bytes;
		for (uint32_t r = 0; r < 2 * L->n_layer * L->block_size; r++) {
			for (uint32_t i = 0; i < L->kv_dim; i++) {
				x = x * 1103515245u + 12345u;
				row[i] = (float)((int)(x >> 16) % 2001 - 1000) / 500.0f;
			}
			cpu_kvq_store_row(L->type, page + (size_t)r * L->token_stride, row, (int)L->kv_dim);
		}
	}
	free(row);
	return 0;
}

struct run {
	struct kvd_engine *e;
	struct kvmm *kv;
	int32_t n_vocab;
	float *logits;
};

/* Multiply-adds of one token's matrix products (what the int8 and f32
 * peaks bound): per layer q, k, v, o and the FFN's three matrices, and
 * attention's q.k and weighted V sums over ctx positions of every query
 * head (every layer taken as full causal: a windowed layer at a depth past
 * its window does fewer); and the output matrix for the share of tokens
 * that want logits (1 in a decode, 1 / P in a P-token prefill). Norms,
 * RoPE and softmax are left out: no multiply-adds of a matrix. */
static double macs_per_token(const struct kvd_hparams *hp, double ctx, double logit_share)
{
	double d = hp->n_embd, qd = (double)hp->n_head * hp->head_dim, kd = (double)hp->n_head_kv * hp->head_dim;
	double layer = 2 * d * qd + 2 * d * kd + 3 * d * hp->n_ff + 2 * qd * ctx;
	return hp->n_layer * layer + logit_share * d * hp->n_vocab;
}

/* Prefill `n` tokens into seq in chunks of `chunk`; logits of the last. */
static int prefill(struct run *R, uint32_t seq, const int32_t *toks, int n, int chunk)
{
	for (int p = 0; p < n; p += chunk) {
		int take = n - p < chunk ? n - p : chunk;
		struct kvd_engine_item it = {.seq = seq, .tokens = toks + p, .n_tokens = take,
					     .logits = p + take == n ? R->logits : NULL};
		int r = kvd_engine_step(R->e, &it, 1);
		if (r < 0)
			return r;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, 0, 'm'}, {"threads", required_argument, 0, 'j'},
		{"depth", required_argument, 0, 'd'}, {"tokens", required_argument, 0, 'n'},
		{"seqs", required_argument, 0, 's'},  {"suffix", required_argument, 0, 'k'},
		{"mib", required_argument, 0, 'M'},   {"chunk", required_argument, 0, 'c'},
		{"cache-type", required_argument, 0, 'K'}, {"fast-depth", no_argument, 0, 'F'},
		{"probe", no_argument, 0, 'P'},
		{0, 0, 0, 0},
	};
	const char *model = NULL;
	int threads = 1, depth = 128, tokens = 64, seqs = 1, suffix = 16, chunk = 512;
	size_t mib = 1024;
	enum kvd_kv_type kv_type = KVD_KV_F16;
	int c, fast_depth = 0, probe = 0;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'j': threads = atoi(optarg); break;
		case 'd': depth = atoi(optarg); break;
		case 'n': tokens = atoi(optarg); break;
		case 's': seqs = atoi(optarg); break;
		case 'k': suffix = atoi(optarg); break;
		case 'M': mib = (size_t)atol(optarg); break;
		case 'c': chunk = atoi(optarg); break;
		case 'F': fast_depth = 1; break;
		case 'P': probe = 1; break;
		case 'K':
			if (kvd_kv_type_parse(optarg, &kv_type) < 0) {
				fprintf(stderr, "kvd_bench: --cache-type: '%s' is not f16, bf16, q8_0, q4_0 or f32\n", optarg);
				return 2;
			}
			break;
		default:
			fprintf(stderr, "usage: see the comment at the top of bench/kvd_bench.c\n");
			return 2;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "kvd_bench: which figure? decode | prefill | batch | prefix | triad | read | peak\n");
		return 2;
	}
	const char *what = argv[optind];
	if (!strcmp(what, "triad") || !strcmp(what, "read")) {
		int ro = !strcmp(what, "read"), best_pf = 0;
		double plain = 0, gbs = ro ? read_probe(mib, threads, &plain, &best_pf) : bandwidth(mib, threads, 0, 0);
		if (gbs < 0) {
			fprintf(stderr, "kvd_bench: %s: cannot allocate %zu MiB (or --threads out of 1..64)\n", what, mib);
			return 1;
		}
		if (!ro) {
			printf("{\"figure\":\"triad\",\"threads\":%d,\"mib\":%zu,\"gb_per_s\":%.3f}\n", threads, mib, gbs);
			return 0;
		}
		printf("{\"figure\":\"read\",\"threads\":%d,\"mib\":%zu,\"gb_per_s\":%.3f,\"plain_gb_per_s\":%.3f,"
		       "\"prefetch\":\"%s%d\"}\n",
		       threads, mib, gbs, plain, best_pf > 0 ? "nta" : best_pf < 0 ? "t0" : "none",
		       best_pf < 0 ? -best_pf : best_pf);
		return 0;
	}
	if (!strcmp(what, "peak")) {
		if (threads < 1 || threads > 64) {
			fprintf(stderr, "kvd_bench: peak: --threads 1..64\n");
			return 2;
		}
		double r[PK_N];
		for (int k = 0; k < PK_N; k++)
			r[k] = peak_rate((enum peak_kind)k, threads);
		/* the int8 peak of the kernel set in use: VNNI's where the CPU
		 * has it (gemm_avx512.c), else AVX2's vpmaddubsw */
		double int8 = r[PK_DPBUSD] > 0 ? r[PK_DPBUSD] : r[PK_MADDUBS];
		if (int8 <= 0) {
			fprintf(stderr, "kvd_bench: peak: this CPU has neither AVX2 nor AVX-512 VNNI\n");
			return 1;
		}
		printf("{\"figure\":\"peak\",\"threads\":%d,\"int8_kind\":\"%s\",\"int8_gmacs\":%.2f", threads,
		       r[PK_DPBUSD] > 0 ? "vnni" : "maddubs", int8 / 1e9);
		for (int k = 0; k < PK_N; k++)
			if (r[k] > 0)
				printf(",\"%s_gmacs\":%.2f", peak_kinds[k].name, r[k] / 1e9);
		printf("}\n");
		return 0;
	}
	if (!model || seqs < 1 || seqs > 256 || tokens < 1 || depth < 1) {
		fprintf(stderr, "kvd_bench: --model is required; --seqs 1..256\n");
		return 2;
	}
	char err[512];
	struct kvd_engine_config ec = {
		.model_path = model,
		.n_threads = threads,
		.block_size = 16,
		.kv_type = kv_type,
		.max_seqs = 512,
		.prefix_cache = !strcmp(what, "prefix"),
	};
	/* pool: what the figure needs plus room */
	{
		struct kvd_model *m;
		if (kvd_model_load(model, &m, err, sizeof(err)) < 0) {
			fprintf(stderr, "kvd_bench: %s\n", err);
			return 1;
		}
		struct kvd_kv_layout l;
		if (kvd_kv_layout_init_type(&l, kvd_model_hparams(m), 16, kv_type) < 0) {
			fprintf(stderr, "kvd_bench: cache type %s does not fit this model's head size\n",
				kvd_kv_type_name(kv_type));
			kvd_model_free(m);
			return 1;
		}
		long tok = (long)seqs * (depth + tokens + 16) + 2L * (tokens + suffix + 32);
		ec.kv_pool_bytes = (uint64_t)(tok / 16 + 64) * l.page_bytes;
		kvd_model_free(m);
	}
	struct run R = {0};
	if (kvd_engine_open(&ec, &R.e, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvd_bench: %s\n", err);
		return 1;
	}
	R.kv = kvd_engine_kvmm(R.e);
	R.n_vocab = kvd_engine_n_vocab(R.e);
	R.logits = malloc(sizeof(float) * (size_t)R.n_vocab * (size_t)seqs);
	int maxlen = depth + tokens + suffix + 64; /* per prompt row */
	int32_t *toks = malloc(sizeof(int32_t) * (size_t)maxlen * (size_t)(seqs + 1));
	int rc = 1;

	if (!strcmp(what, "prefill")) {
		uint32_t s, w;
		/* the warm-up: other tokens, so that nothing of it is reused */
		prompt_ids(toks, tokens, R.n_vocab, 2);
		kvmm_seq_new(R.kv, &w);
		double t0 = now_s();
		if (prefill(&R, w, toks, tokens, chunk) < 0)
			goto out;
		double cold = now_s() - t0;
		kvmm_seq_free(R.kv, w);
		prompt_ids(toks, tokens, R.n_vocab, 1);
		kvmm_seq_new(R.kv, &s);
		t0 = now_s();
		if (prefill(&R, s, toks, tokens, chunk) < 0)
			goto out;
		double dt = now_s() - t0;
		/* token i attends to i + 1 positions; logits of the last only */
		double macs = macs_per_token(kvd_model_hparams(kvd_engine_model(R.e)), (tokens + 1) / 2.0, 1.0 / tokens);
		printf("{\"figure\":\"prefill\",\"tokens\":%d,\"threads\":%d,\"seconds\":%.6f,\"tokens_per_s\":%.3f,"
		       "\"cold_tokens_per_s\":%.3f,\"macs_per_token\":%.0f,\"peak_rss_kib\":%ld}\n",
		       tokens, threads, dt, tokens / dt, tokens / cold, macs, peak_rss_kib());
	} else if (!strcmp(what, "decode") || !strcmp(what, "batch")) {
		uint32_t sid[256];
		struct kvd_engine_item it[256];
		int32_t next[256];
		/* greedy, through the daemon's sampler */
		struct kvd_sampler_params sp;
		kvd_sampler_params_default(&sp);
		sp.temperature = 0;
		struct kvd_sampler *smp = kvd_sampler_new(&sp, R.n_vocab);
		if (!smp)
			goto out;
		for (int i = 0; i < seqs; i++) {
			prompt_ids(toks + (size_t)i * maxlen, depth, R.n_vocab, 1 + (uint32_t)i);
			kvmm_seq_new(R.kv, &sid[i]);
			if (fast_depth && depth > 1) {
				struct kvmm_grow g = {sid[i], (uint32_t)depth - 1, toks + (size_t)i * maxlen};
				if (kvmm_commit(R.kv, &g, 1) < 0 || kvmm_seq_publish(R.kv, sid[i]) < 0 ||
				    fill_pages(R.e, sid[i], (uint32_t)depth - 1) < 0) {
					kvd_sampler_free(smp);
					goto out;
				}
			}
			int skip = fast_depth && depth > 1 ? depth - 1 : 0;
			if (prefill(&R, sid[i], toks + (size_t)i * maxlen + skip, depth - skip, chunk) < 0) {
				kvd_sampler_free(smp);
				goto out;
			}
			next[i] = kvd_sampler_sample(smp, R.logits, NULL, 0);
		}
		/* --probe: the read probe just before and just after the timed
		 * steps, the same window of this host's bandwidth */
		double pb = 0, pa = 0, plain;
		int pf;
		if (probe && (pb = read_probe(mib, threads, &plain, &pf)) < 0) {
			fprintf(stderr, "kvd_bench: --probe: cannot allocate %zu MiB\n", mib);
			kvd_sampler_free(smp);
			goto out;
		}
		double t0 = now_s(), c0 = cpu_s();
		for (int step = 0; step < tokens; step++) {
			for (int i = 0; i < seqs; i++)
				it[i] = (struct kvd_engine_item){.seq = sid[i], .tokens = &next[i], .n_tokens = 1,
								 .logits = R.logits + (size_t)i * R.n_vocab};
			if (kvd_engine_step(R.e, it, (size_t)seqs) < 0) {
				kvd_sampler_free(smp);
				goto out;
			}
			for (int i = 0; i < seqs; i++)
				next[i] = kvd_sampler_sample(smp, R.logits + (size_t)i * R.n_vocab, NULL, 0);
		}
		double dt = now_s() - t0, dc = cpu_s() - c0;
		kvd_sampler_free(smp);
		if (probe && (pa = read_probe(mib, threads, &plain, &pf)) < 0) {
			fprintf(stderr, "kvd_bench: --probe: cannot allocate %zu MiB\n", mib);
			goto out;
		}
		/* bytes one decode step must read: every weight once, plus each
		 * sequence's K and V at its mean depth during the run */
		const struct kvd_kv_layout *L = kvd_engine_kv_layout(R.e);
		double kv_tok = (double)L->page_bytes / L->block_size;
		double step_bytes = (double)kvd_model_weight_bytes(kvd_engine_model(R.e)) +
				    kv_tok * seqs * (depth + tokens / 2.0);
		/* a generated token's products: at the mean depth, with logits */
		double macs = macs_per_token(kvd_model_hparams(kvd_engine_model(R.e)), depth + (tokens + 1) / 2.0, 1);
		printf("{\"figure\":\"%s\",\"cache_type\":\"%s\",\"depth\":%d,\"seqs\":%d,\"tokens\":%d,\"threads\":%d,\"seconds\":%.6f,"
		       "\"tokens_per_s\":%.3f,\"cpu_seconds\":%.6f,\"bytes_per_step\":%.0f,\"macs_per_token\":%.0f,"
		       "\"fast_depth\":%s,\"peak_rss_kib\":%ld",
		       what, kvd_kv_type_name(L->type), depth, seqs, tokens, threads, dt, (double)tokens * seqs / dt, dc,
		       step_bytes, macs, fast_depth ? "true" : "false", peak_rss_kib());
		if (probe)
			printf(",\"probe_before_gb_per_s\":%.3f,\"probe_after_gb_per_s\":%.3f,\"reads_gb_per_s\":%.3f",
			       pb, pa, step_bytes * tokens / dt / 1e9);
		printf("}\n");
	} else if (!strcmp(what, "prefix")) {
		/* cold: prefix + suffix A; warm: same prefix + suffix B */
		uint32_t a, b;
		int n = tokens + suffix;
		int32_t *pa = toks, *pb = toks + maxlen;
		prompt_ids(pa, tokens, R.n_vocab, 7);
		memcpy(pb, pa, sizeof(int32_t) * (size_t)tokens);
		prompt_ids(pa + tokens, suffix, R.n_vocab, 8);
		prompt_ids(pb + tokens, suffix, R.n_vocab, 9);
		kvmm_seq_new(R.kv, &a);
		double t0 = now_s();
		if (prefill(&R, a, pa, n, chunk) < 0)
			goto out;
		double cold = now_s() - t0;
		kvmm_seq_free(R.kv, a); /* its full pages stay cached */
		kvmm_seq_new(R.kv, &b);
		t0 = now_s();
		uint32_t hit = 0;
		kvmm_prefix_attach(R.kv, b, pb, (uint32_t)n, &hit);
		if (prefill(&R, b, pb + hit, n - (int)hit, chunk) < 0)
			goto out;
		double warm = now_s() - t0;
		printf("{\"figure\":\"prefix\",\"prefix_tokens\":%d,\"suffix_tokens\":%d,\"hit_tokens\":%u,\"threads\":%d,"
		       "\"cold_s\":%.6f,\"warm_s\":%.6f,\"warm_over_cold\":%.4f,\"peak_rss_kib\":%ld}\n",
		       tokens, suffix, hit, threads, cold, warm, warm / cold, peak_rss_kib());
	} else {
		fprintf(stderr, "kvd_bench: unknown figure '%s'\n", what);
		goto out;
	}
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "kvd_bench: %s failed\n", what);
	free(toks);
	free(R.logits);
	kvd_engine_close(R.e);
	return rc;
}
