/*
 * bench/attn_bench.c — the CPU backend's attention kernel (attn_rows_fn,
 * kernels/cpu/ops.h) alone, on one thread: one query group's pass over a
 * chunk of 128 positions, as a decode step makes it for each (KV head,
 * chunk), one JSON object per run.
 *
 *   attn_bench [--isa best|avx2] [--type f16|bf16|q8_0|q4_0] [--hd 64|128|256]
 *              [--rows NR] [--heads H] [--chunks C] [--reps R] [--whole]
 *
 * NR query rows (default 4: a Llama 3.2 group) over K and V rows of head
 * size hd (default 64) laid out as the KV pool lays out one layer (pages of
 * 16 tokens, each page's K rows then its V rows, a token's row holding H
 * heads, default 8): C chunks (default 1, which stays in cache; 512 spans
 * 64 MiB at hd 64, beyond any cache, as a decode at depth reads them), each
 * chunk's heads one after another, a pass covering at least 4,096 chunks
 * (the span again and again). Prints the best of R (default 5) passes as
 * nanoseconds per position of a group and the bytes of K and V read per
 * second. --whole: each chunk's heads in one call of the heads kernel
 * (attn_heads_fn, position by position through the heads) instead of one
 * call a head. q8_0 and q4_0 rows go through the quantized cache's products
 * (kvquant.h: query rows quantized once, scores, softmax, V sums) as
 * kernels/cpu/attention.c calls them for a query group, its prefetch of
 * the chunk's rows included.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/kvquant.h"
#include "cpu/ops.h"

#define CHUNK 128
#define PAGE_TOKENS 16

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint32_t rng = 12345;
static float frand(void)
{
	rng = rng * 1103515245u + 12345u;
	return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* never called: marks the quantized path */
static void kvq_rows(int nr, const float *const *q, const int *len, const uint16_t *const *k,
		     const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	(void)nr, (void)q, (void)len, (void)k, (void)v, (void)scale, (void)ml, (void)o, (void)scratch;
}

/* A query group over one chunk of q8_0 or q4_0 rows, as attention.c's
 * attn_rows_q makes it for a decode: the chunk's rows requested into L2,
 * the scores, each row's softmax, the V sums. */
static void kvq_group(const struct kvq_kernels *kq, enum kvd_kv_type t, int hd, int nr, const float *const *q,
		      const struct kvq_qrow *const *qq, const unsigned char *const *k, const unsigned char *const *v,
		      float *const *ml, float *const *o, float *sc)
{
	size_t rb = kvd_kv_row_bytes(t, (uint32_t)hd);
	int len[64];
	for (int i = 0; i < CHUNK; i++)
		for (size_t b = 0; b < rb + 63; b += 64) {
			__builtin_prefetch(k[i] + (b < rb ? b : rb - 1), 0, 2);
			__builtin_prefetch(v[i] + (b < rb ? b : rb - 1), 0, 2);
		}
	if (qq)
		kq->scores_i8(t, qq, nr, k, CHUNK, hd, 0.125f, sc, CHUNK);
	else
		kq->scores(t, q, nr, k, CHUNK, hd, 0.125f, sc, CHUNK);
	for (int r = 0; r < nr; r++) {
		kq->softmax(sc + (size_t)r * CHUNK, CHUNK, &ml[r][0], &ml[r][1]);
		memset(o[r], 0, sizeof(float) * (size_t)hd);
		len[r] = CHUNK;
	}
	kq->accum(t, o, nr, len, sc, CHUNK, v, hd);
}

int main(int argc, char **argv)
{
	const char *isa = "best", *type = "f16";
	int hd = 64, nr = 4, heads = 8, chunks = 1, reps = 5, whole = 0;
	static const struct option opts[] = {{"isa", 1, 0, 'i'},   {"type", 1, 0, 't'},   {"hd", 1, 0, 'd'},
					     {"rows", 1, 0, 'r'},  {"heads", 1, 0, 'H'},  {"chunks", 1, 0, 'c'},
					     {"reps", 1, 0, 'R'},  {"whole", 0, 0, 'w'},  {0, 0, 0, 0}};
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (o) {
		case 'i': isa = optarg; break;
		case 't': type = optarg; break;
		case 'd': hd = atoi(optarg); break;
		case 'r': nr = atoi(optarg); break;
		case 'H': heads = atoi(optarg); break;
		case 'c': chunks = atoi(optarg); break;
		case 'R': reps = atoi(optarg); break;
		case 'w': whole = 1; break;
		default: fprintf(stderr, "usage: see the comment at the top of bench/attn_bench.c\n"); return 2;
		}
	}
	int bf = !strcmp(type, "bf16");
	enum kvd_kv_type qt = !strcmp(type, "q8_0") ? KVD_KV_Q8_0 : !strcmp(type, "q4_0") ? KVD_KV_Q4_0 : KVD_KV_F16;
	if ((!bf && qt == KVD_KV_F16 && strcmp(type, "f16")) || (qt != KVD_KV_F16 && whole) || (hd != 64 && hd != 128 && hd != 256) || nr < 1 || nr > 64 || heads < 1 ||
	    chunks < 1 || reps < 1 || (strcmp(isa, "best") && strcmp(isa, "avx2"))) {
		fprintf(stderr, "attn_bench: bad arguments (see the comment at the top of bench/attn_bench.c)\n");
		return 2;
	}
	struct cpu_kernels k;
	cpu_kernels_init_isa(&k, strcmp(isa, "avx2") ? KVD_CPU_ISA_BEST : KVD_CPU_ISA_AVX2);
	attn_rows_fn f = NULL;
	struct kvq_kernels kq;
	cpu_kvq_kernels_init(&kq, strcmp(isa, "avx2") ? 2 : 1);
	if (qt != KVD_KV_F16)
		f = kvq_rows; /* any non-NULL: the quantized path below */
	else if (bf)
		f = strcmp(isa, "avx2") && cpu_attn_rows_bf16(hd) ? cpu_attn_rows_bf16(hd) : cpu_attn_rows_bf16_avx2(hd);
	else if (k.attn_rows_for)
		f = k.attn_rows_for(hd);
	if (!f) {
		fprintf(stderr, "attn_bench: no %s attention kernel for head size %d in the %s set\n", type, hd, k.isa);
		return 1;
	}
	/* the heads kernel matching f bit for bit */
	attn_heads_fn fh = !whole ? NULL : bf && f == cpu_attn_rows_bf16(hd) ? cpu_attn_heads_bf16(hd)
								: cpu_attn_heads_avx2(hd, bf);
	if (whole && (!fh || heads * nr > ATTN_HEADS_MAX_ROWS)) {
		fprintf(stderr, "attn_bench: no heads kernel for %d heads of %d rows, %s, head size %d\n", heads, nr,
			type, hd);
		return 1;
	}

	size_t hb = qt != KVD_KV_F16 ? kvd_kv_row_bytes(qt, (uint32_t)hd) : (size_t)hd * 2; /* a head's row */
	size_t row = (size_t)heads * hb, page = 2 * PAGE_TOKENS * row;
	size_t npos = (size_t)chunks * CHUNK, bytes = npos / PAGE_TOKENS * page;
	uint16_t *mem = aligned_alloc(4096, bytes);
	int nq = whole ? heads * nr : nr; /* query rows of one call */
	float *q = malloc(sizeof(float) * (size_t)nq * hd), *o = malloc(sizeof(float) * (size_t)nq * hd);
	float *ml = malloc(sizeof(float) * 2 * (size_t)nq);
	float *scratch = malloc(sizeof(float) * ATTN_ROWS_SCRATCH(nq, hd));
	if (!mem || !q || !o || !ml || !scratch) {
		fprintf(stderr, "attn_bench: out of memory\n");
		return 1;
	}
	if (qt != KVD_KV_F16) {
		float x[256];
		for (size_t r = 0; r < bytes / hb; r++) {
			for (int i = 0; i < hd; i++)
				x[i] = frand();
			cpu_kvq_store_row(qt, (char *)mem + r * hb, x, hd);
		}
	} else {
		for (size_t i = 0; i < bytes / 2; i++)
			mem[i] = bf ? cpu_f32_to_bf16(frand()) : cpu_f32_to_fp16(frand());
	}
	for (int i = 0; i < nq * hd; i++)
		q[i] = frand();
	const float *qp[64];
	float *op[64], *mlp[64];
	int len[64];
	for (int r = 0; r < nq; r++) {
		qp[r] = q + (size_t)r * hd;
		op[r] = o + (size_t)r * hd;
		mlp[r] = ml + 2 * r;
		len[r] = CHUNK;
	}
	/* the query rows quantized once, as attention.c does per step */
	struct kvq_qrow *qrows = malloc(sizeof(*qrows) * (size_t)nq);
	const struct kvq_qrow *qq[ATTN_HEADS_MAX_ROWS];
	if (!qrows) {
		fprintf(stderr, "attn_bench: out of memory\n");
		return 1;
	}
	kq.quant(q, nq, hd, qrows);
	for (int r = 0; r < nq; r++)
		qq[r] = &qrows[r];
	const uint16_t *kp[CHUNK], *vp[CHUNK];
	double best = 1e30, check = 0;
	int laps = chunks >= 4096 ? 1 : (4096 + chunks - 1) / chunks;
	for (int rep = 0; rep < reps; rep++) {
		double t0 = now_s();
		for (int lap = 0; lap < laps; lap++) {
			for (int c = 0; c < chunks; c++)
				for (int g = 0; g < (whole ? 1 : heads); g++) {
					for (int i = 0; i < CHUNK; i++) {
						size_t p = (size_t)c * CHUNK + i;
						const char *pg = (const char *)mem + p / PAGE_TOKENS * page;
						kp[i] = (const uint16_t *)(pg + p % PAGE_TOKENS * row + (size_t)g * hb);
						vp[i] = (const uint16_t *)(pg + PAGE_TOKENS * row + p % PAGE_TOKENS * row +
									   (size_t)g * hb);
					}
					if (qt != KVD_KV_F16)
						kvq_group(&kq, qt, hd, nr, qp, hd <= KVQ_INT8_MAX_HD ? qq : NULL,
							  (const unsigned char *const *)kp,
							  (const unsigned char *const *)vp, mlp, op, scratch);
					else if (whole)
						fh(heads, nr, CHUNK, qp, kp, vp, 0.125f, mlp, op, scratch);
					else
						f(nr, qp, len, kp, vp, 0.125f, mlp, op, scratch);
					check += o[0] + ml[1];
				}
		}
		double t = now_s() - t0;
		if (t < best)
			best = t;
	}
	double per = best / ((double)laps * chunks * heads * CHUNK);
	printf("{\"figure\":\"attn\",\"isa\":\"%s\",\"type\":\"%s\",\"hd\":%d,\"rows\":%d,\"heads\":%d,\"chunks\":%d,"
	       "\"whole\":%d,\"ns_per_position\":%.2f,\"kv_gb_per_s\":%.2f,\"check\":%.6g}\n",
	       k.isa, type, hd, nr, heads, chunks, whole, per * 1e9, 2.0 * hb / per / 1e9, check / reps / laps);
	free(mem);
	free(qrows);
	free(q);
	free(o);
	free(ml);
	free(scratch);
	return 0;
}
