/*
 * bench/tile_bench.c — the CPU backend's tiled matrix products alone, on
 * one thread, with the weights and activations in cache: the compute rate a
 * kernel reaches where nothing waits for memory (what prefill and batched
 * decode run into), one JSON object per weight type.
 *
 *   tile_bench [--isa best|avx512|avx2|generic] [--cols K] [--rows N]
 *              [--tokens T] [--chunk C] [--reps R] [TYPE...]
 *
 * TYPE: q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q5_K q6_K (default: all of them).
 * N rows (default 32) of K columns (default 2048) of random quants with
 * finite scales, packed as the kernel set in use reads them
 * (cpu_gemm_pack), times T activation rows (default 256) quantized as the
 * engine quantizes them (one scale per 256 for the K-quants), C tokens per call (default 8, GEMM_COLS: what the
 * engine's matrix product passes; 1 is decode's shape; 16 takes the AMX
 * tiles where the set has them, as the engine does) and 16 rows
 * (GEMM_ROWS) per call, token chunks outer and row groups inner (the
 * engine's order within a strip of 32 rows). Prints the best of R
 * (default 7) passes as multiply-adds per second, and a checksum of the
 * outputs (the same bits for every kernel set that claims them).
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const struct {
	const char *name;
	enum kvd_wtype type;
	int64_t elems;  /* elements of a stored block */
	int d_at, m_at; /* offsets of its f16 scales (-1: none) */
} types[] = {
	{"q4_0", KVD_WTYPE_Q4_0, 32, 0, -1},  {"q4_1", KVD_WTYPE_Q4_1, 32, 0, 2},  {"q5_0", KVD_WTYPE_Q5_0, 32, 0, -1},
	{"q5_1", KVD_WTYPE_Q5_1, 32, 0, 2},   {"q8_0", KVD_WTYPE_Q8_0, 32, 0, -1}, {"q4_K", KVD_WTYPE_Q4_K, 256, 0, 2},
	{"q5_K", KVD_WTYPE_Q5_K, 256, 0, 2},  {"q6_K", KVD_WTYPE_Q6_K, 256, 208, -1},
};
#define N_TYPES (sizeof types / sizeof types[0])

static uint32_t rng = 12345;
static uint32_t next(void)
{
	rng = rng * 1103515245u + 12345u;
	return rng >> 8;
}

static int run(const struct cpu_kernels *k, size_t ti, int64_t K, int64_t rows, int T, int C, int reps)
{
	enum kvd_wtype t = types[ti].type;
	if (!k->gemm[t]) {
		fprintf(stderr, "tile_bench: %s has no tiled kernel in the %s set\n", types[ti].name, k->isa);
		return -1;
	}
	size_t rb = kvd_wtype_row_bytes(t, K);
	size_t pb = cpu_gemm_packed_bytes(t, rows, K, k->pack_flags);
	size_t gb = cpu_gemm_group_block_bytes(t, k->pack_flags) * (size_t)(K / QK);
	int64_t ldq = q8_row_len(K);
	uint8_t *src = malloc(rb * (size_t)rows);
	void *wp = aligned_alloc(64, (pb + 63) / 64 * 64);
	float *x = malloc(sizeof *x * (size_t)(K * T));
	struct q8_block *xq = malloc(sizeof *xq * (size_t)(ldq * T));
	float *y = calloc((size_t)(rows * T), sizeof *y);
	int rc = -1;
	if (!src || !wp || !x || !xq || !y)
		goto out;
	for (size_t i = 0; i < rb * (size_t)rows; i++)
		src[i] = (uint8_t)next();
	uint16_t d = cpu_f32_to_fp16(1.0f / 256);
	size_t block = kvd_wtype_row_bytes(t, types[ti].elems);
	for (size_t o = 0; o + block <= rb * (size_t)rows; o += block) {
		memcpy(src + o + types[ti].d_at, &d, 2);
		if (types[ti].m_at >= 0)
			memcpy(src + o + types[ti].m_at, &d, 2);
	}
	cpu_gemm_pack(t, src, rb, rows, K, wp, k->pack_flags);
	for (int64_t i = 0; i < K * T; i++)
		x[i] = (float)((int)(next() % 2001) - 1000) / 500.0f;
	for (int i = 0; i < T; i++)
		(wtype_wants_q8k(t) ? k->quantize_q8k : k->quantize_q8)(x + K * i, xq + ldq * i, K);
	double best = 1e30;
	for (int r = 0; r < reps; r++) {
		double t0 = now_s();
		int i0 = 0;
		if (C == GEMM16_COLS && k->gemm16[t] && T >= GEMM16_COLS) {
			/* as the engine calls it: a group of rows with all its tiles */
			for (int64_t g = 0; g < rows; g += GEMM_ROWS) {
				int R = rows - g < GEMM_ROWS ? (int)(rows - g) : GEMM_ROWS;
				k->gemm16[t]((const char *)wp + (size_t)(g / GEMM_ROWS) * gb, K / QK, R, xq, (size_t)ldq,
					     T / GEMM16_COLS, y + g, (size_t)rows);
			}
			i0 = T / GEMM16_COLS * GEMM16_COLS;
		}
		for (int i = i0; i < T; i += C) {
			int c = T - i < C ? T - i : C;
			if (c > GEMM_COLS)
				c = GEMM_COLS;
			for (int64_t g = 0; g < rows; g += GEMM_ROWS) {
				int R = rows - g < GEMM_ROWS ? (int)(rows - g) : GEMM_ROWS;
				k->gemm[t]((const char *)wp + (size_t)(g / GEMM_ROWS) * gb, K / QK, R, xq + i * ldq,
					   (size_t)ldq, c, y + i * rows + g, (size_t)rows);
			}
		}
		double dt = now_s() - t0;
		if (dt < best)
			best = dt;
	}
	double sum = 0;
	for (int64_t i = 0; i < rows * T; i++)
		sum += y[i];
	printf("{\"figure\":\"tile\",\"isa\":\"%s\",\"type\":\"%s\",\"cols\":%lld,\"rows\":%lld,\"tokens\":%d,"
	       "\"chunk\":%d,\"gmac_per_s\":%.2f,\"checksum\":%.9g}\n",
	       k->isa, types[ti].name, (long long)K, (long long)rows, T, C, (double)rows * K * T / best / 1e9, sum);
	rc = 0;
out:
	free(src);
	free(wp);
	free(x);
	free(xq);
	free(y);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"isa", 1, 0, 'i'},   {"cols", 1, 0, 'k'}, {"rows", 1, 0, 'n'},
					     {"tokens", 1, 0, 't'}, {"chunk", 1, 0, 'c'}, {"reps", 1, 0, 'r'},
					     {0, 0, 0, 0}};
	enum kvd_cpu_isa isa = KVD_CPU_ISA_BEST;
	long long K = 2048, rows = 32;
	int T = 256, C = GEMM_COLS, reps = 7, o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'i':
			if (!strcmp(optarg, "generic"))
				isa = KVD_CPU_ISA_GENERIC;
			else if (!strcmp(optarg, "avx512"))
				isa = KVD_CPU_ISA_AVX512;
			else if (!strcmp(optarg, "avx2"))
				isa = KVD_CPU_ISA_AVX2;
			else if (!strcmp(optarg, "best"))
				isa = KVD_CPU_ISA_BEST;
			else
				goto usage;
			break;
		case 'k': K = atoll(optarg); break;
		case 'n': rows = atoll(optarg); break;
		case 't': T = atoi(optarg); break;
		case 'c': C = atoi(optarg); break;
		case 'r': reps = atoi(optarg); break;
		default: goto usage;
		}
	}
	if (K <= 0 || K % 256 || rows <= 0 || T <= 0 || C < 1 || (C > GEMM_COLS && C != GEMM16_COLS) || reps < 1) {
		fprintf(stderr,
			"tile_bench: --cols must be a positive multiple of 256, --chunk 1..%d or %d, the rest positive\n",
			GEMM_COLS, GEMM16_COLS);
		return 2;
	}
	struct cpu_kernels k;
	cpu_kernels_init_isa(&k, isa);
	int rc = 0, any = 0;
	for (int a = optind; a < argc; a++) {
		size_t i = 0;
		while (i < N_TYPES && strcmp(argv[a], types[i].name))
			i++;
		if (i == N_TYPES) {
			fprintf(stderr, "tile_bench: unknown type %s\n", argv[a]);
			return 2;
		}
		rc |= run(&k, i, K, rows, T, C, reps);
		any = 1;
	}
	for (size_t i = 0; !any && i < N_TYPES; i++)
		rc |= run(&k, i, K, rows, T, C, reps);
	return rc ? 1 : 0;
usage:
	fprintf(stderr, "usage: see the comment at the top of bench/tile_bench.c\n");
	return 2;
}
