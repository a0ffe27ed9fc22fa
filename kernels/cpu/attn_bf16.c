/*
 * kernels/cpu/attn_bf16.c — one chunk of attention over K/V stored as
 * bfloat16 ([kv] cache_type = bf16), with the AVX-512 BF16 products
 * (vdpbf16ps: two bfloat16 products added into a float lane per
 * instruction, twice the multiply-adds of an f32 FMA).
 *
 * The arithmetic, for each row r over the first len[r] positions:
 *   q'  = the query rounded to bfloat16 (nearest even)
 *   s_p = (q' . k_p) * scale   in 128-bit lane L of a group of four
 *         positions and float lane i, the products of elements 8j + 2i and
 *         8j + 2i + 1 added in for j = 0, 1, ... in order (vdpbf16ps); the
 *         four lanes of a position then added as (0 + 2) + (1 + 3);
 *   m   = max s_p, e_p = bf16(exp(s_p - m)) (the f32 path's vector exp,
 *         then rounded to bfloat16 like the query);
 *   l   = sum e_p (16 float lanes, then a fixed tree), of the rounded values
 *         the output is made of;
 *   o   = sum e_p v_p, positions in pairs (2t, 2t + 1) from the chunk's
 *         first (vdpbf16ps again), pairs in order.
 * Products of two bfloat16 values are exact in a float, so the only
 * roundings are those of the queries and weights to bfloat16 and of the
 * float sums; the instruction treats subnormal inputs as zero. Every (row,
 * position) value goes through the same operations whichever block it is
 * computed in, and a row's weights past its length are zeros (pairs are
 * formed by absolute position, a zero weight adds a zero to a sum that is
 * never -0), so a token's attention is bit-identical alone, in a batch or
 * in a prefill tile, as on the other paths.
 */
#include "ops.h"
#include "vexp.h"
#include "attn_util.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#define UNROLL _Pragma("GCC unroll 16")
#define PF 16 /* rows prefetched this many positions ahead */

static const uint16_t zero_row[256];

/* Positions p .. p + 15 (k[i] for i < n, zeros past it): group g (four
 * positions), vector j at ks + (g * HD / 8 + j) * 32 holds in 128-bit lane
 * L elements 8j .. 8j + 7 of position p + 4g + L. */
TGT static inline __attribute__((always_inline)) void stage16(const int HD, const uint16_t *const *k, int off, int p,
							      int n, uint16_t *ks)
{
	if (p + 16 + PF <= n)
		UNROLL for (int i = 0; i < 16; i++)
			UNROLL for (int b = 0; b < HD * 2; b += 64)
				_mm_prefetch((const char *)(k[p + PF + i] + off) + b, _MM_HINT_T0);
	UNROLL for (int g = 0; g < 4; g++) {
		const uint16_t *r[4];
		UNROLL for (int L = 0; L < 4; L++) r[L] = p + 4 * g + L < n ? k[p + 4 * g + L] + off : zero_row;
		for (int d0 = 0; d0 < HD; d0 += 32) {
			/* four rows' 32 elements, their 128-bit lanes transposed */
			__m512i r0 = _mm512_loadu_si512((const void *)(r[0] + d0));
			__m512i r1 = _mm512_loadu_si512((const void *)(r[1] + d0));
			__m512i r2 = _mm512_loadu_si512((const void *)(r[2] + d0));
			__m512i r3 = _mm512_loadu_si512((const void *)(r[3] + d0));
			__m512i x0 = _mm512_shuffle_i32x4(r0, r1, 0x44), x1 = _mm512_shuffle_i32x4(r0, r1, 0xee);
			__m512i x2 = _mm512_shuffle_i32x4(r2, r3, 0x44), x3 = _mm512_shuffle_i32x4(r2, r3, 0xee);
			uint16_t *o = ks + ((size_t)g * (HD / 8) + d0 / 8) * 32;
			_mm512_storeu_si512((void *)o, _mm512_shuffle_i32x4(x0, x2, 0x88));
			_mm512_storeu_si512((void *)(o + 32), _mm512_shuffle_i32x4(x0, x2, 0xdd));
			_mm512_storeu_si512((void *)(o + 64), _mm512_shuffle_i32x4(x1, x3, 0x88));
			_mm512_storeu_si512((void *)(o + 96), _mm512_shuffle_i32x4(x1, x3, 0xdd));
		}
	}
}

/* Four groups' lanes (16 positions) of one row to its 16 scores in
 * position order, times scale (as in attn_avx512.c). */
TGT static inline __m512 reduce_groups(__m512 a, __m512 b, __m512 c, __m512 d, __m512 vs)
{
	const __m512i ord = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
	__m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
	__m512 y = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
	__m512 z = _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xee));
	return _mm512_mul_ps(_mm512_permutexvar_ps(ord, z), vs);
}

/* Scores of R rows (bfloat16 queries qb[0 .. R-1]) against the 16 staged
 * positions ks, stored at sc + p. */
TGT static inline __attribute__((always_inline)) void scores16(const int HD, const int R, const uint16_t *const *qb,
							       const uint16_t *ks, int p, __m512 vs, float *sc,
							       int ld)
{
	__m512 acc[3][4];
	UNROLL for (int rr = 0; rr < R; rr++) UNROLL for (int g = 0; g < 4; g++) acc[rr][g] = _mm512_setzero_ps();
	_Pragma("GCC unroll 4") for (int j = 0; j < HD / 8; j++) {
		__m512i u[4];
		UNROLL for (int g = 0; g < 4; g++)
			u[g] = _mm512_loadu_si512((const void *)(ks + ((size_t)g * (HD / 8) + j) * 32));
		UNROLL for (int rr = 0; rr < R; rr++) {
			__m512i qv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qb[rr] + 8 * j)));
			UNROLL for (int g = 0; g < 4; g++)
				acc[rr][g] = _mm512_dpbf16_ps(acc[rr][g], (__m512bh)qv, (__m512bh)u[g]);
		}
	}
	UNROLL for (int rr = 0; rr < R; rr++)
		_mm512_storeu_ps(sc + (size_t)rr * ld + p, reduce_groups(acc[rr][0], acc[rr][1], acc[rr][2], acc[rr][3], vs));
}

/* scores16 for R <= 3 rows (a decode's query group) over positions
 * p .. p + 15 (those below n) straight from the K rows (each at element
 * off): each group's vectors built in registers as stage16 builds them,
 * the same products in the same order. */
TGT static inline __attribute__((always_inline)) void scores_direct16(const int HD, const int R,
								      const uint16_t *const *qb, const uint16_t *const *k,
								      int off, int p, int n, __m512 vs, float *sc, int ld)
{
	{
		__m512 acc[3][4];
		UNROLL for (int rr = 0; rr < R; rr++) UNROLL for (int g = 0; g < 4; g++) acc[rr][g] = _mm512_setzero_ps();
		if (p + 16 + PF <= n)
			UNROLL for (int i = 0; i < 16; i++)
				UNROLL for (int b = 0; b < HD * 2; b += 64)
					_mm_prefetch((const char *)(k[p + PF + i] + off) + b, _MM_HINT_T0);
		const uint16_t *r[16];
		UNROLL for (int i = 0; i < 16; i++) r[i] = p + i < n ? k[p + i] + off : zero_row;
		for (int d0 = 0; d0 < HD; d0 += 32) {
			/* four rows' 32 elements, their 128-bit lanes transposed:
			 * u[g][m] lane L = row 4g + L's elements d0 + 8m .. + 7 */
			__m512i u[4][4];
			UNROLL for (int g = 0; g < 4; g++) {
				__m512i r0 = _mm512_loadu_si512((const void *)(r[4 * g] + d0));
				__m512i r1 = _mm512_loadu_si512((const void *)(r[4 * g + 1] + d0));
				__m512i r2 = _mm512_loadu_si512((const void *)(r[4 * g + 2] + d0));
				__m512i r3 = _mm512_loadu_si512((const void *)(r[4 * g + 3] + d0));
				__m512i x0 = _mm512_shuffle_i32x4(r0, r1, 0x44), x1 = _mm512_shuffle_i32x4(r0, r1, 0xee);
				__m512i x2 = _mm512_shuffle_i32x4(r2, r3, 0x44), x3 = _mm512_shuffle_i32x4(r2, r3, 0xee);
				u[g][0] = _mm512_shuffle_i32x4(x0, x2, 0x88);
				u[g][1] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
				u[g][2] = _mm512_shuffle_i32x4(x1, x3, 0x88);
				u[g][3] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
			}
			UNROLL for (int m = 0; m < 4; m++)
				UNROLL for (int rr = 0; rr < R; rr++) {
					__m512i qv = _mm512_broadcast_i32x4(
						_mm_loadu_si128((const __m128i *)(qb[rr] + d0 + 8 * m)));
					UNROLL for (int g = 0; g < 4; g++)
						acc[rr][g] = _mm512_dpbf16_ps(acc[rr][g], (__m512bh)qv, (__m512bh)u[g][m]);
				}
		}
		UNROLL for (int rr = 0; rr < R; rr++)
			_mm512_storeu_ps(sc + (size_t)rr * ld + p, reduce_groups(acc[rr][0], acc[rr][1], acc[rr][2], acc[rr][3], vs));
	}
}

/* o[rr] = sum over position pairs below pe of the rows' bfloat16 weights
 * (w[rr], pairs as 32-bit words) times V, for RT rows (NT of them live,
 * the others' weights are zeros), the head by 32-element blocks. */
TGT static inline __attribute__((always_inline)) void pv_block(const int HD, const int RT, int nt, int pe,
							       const uint16_t *const *v, int off, int n,
							       const uint16_t *const *w, float *const *o)
{
	enum { MAXA = 16 };
	const int A = HD / 16; /* accumulators per row: lo and hi of each 32-element block */
	__m512 acc[6][MAXA];
	UNROLL for (int rr = 0; rr < RT; rr++) UNROLL for (int a = 0; a < A; a++) acc[rr][a] = _mm512_setzero_ps();
	for (int p = 0; p < pe; p += 2) {
		const uint16_t *v0 = v[p] + off, *v1 = p + 1 < n ? v[p + 1] + off : zero_row;
		if (p + PF + 1 < n)
			UNROLL for (int b = 0; b < HD * 2; b += 64) {
				_mm_prefetch((const char *)(v[p + PF] + off) + b, _MM_HINT_T0);
				_mm_prefetch((const char *)(v[p + PF + 1] + off) + b, _MM_HINT_T0);
			}
		__m512i wv[6];
		UNROLL for (int rr = 0; rr < RT; rr++) {
			uint32_t pair;
			memcpy(&pair, w[rr < nt ? rr : 0] + p, 4);
			wv[rr] = _mm512_set1_epi32((int)pair);
		}
		UNROLL for (int d0 = 0; d0 < HD; d0 += 32) {
			__m512i a = _mm512_loadu_si512((const void *)(v0 + d0)), b = _mm512_loadu_si512((const void *)(v1 + d0));
			__m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
			UNROLL for (int rr = 0; rr < RT; rr++) {
				acc[rr][d0 / 16] = _mm512_dpbf16_ps(acc[rr][d0 / 16], (__m512bh)lo, (__m512bh)wv[rr]);
				acc[rr][d0 / 16 + 1] = _mm512_dpbf16_ps(acc[rr][d0 / 16 + 1], (__m512bh)hi, (__m512bh)wv[rr]);
			}
		}
	}
	/* lane 4k + i of lo: element 8k + i of the block; of hi: 8k + 4 + i */
	const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
	const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
	UNROLL for (int rr = 0; rr < RT; rr++) {
		if (rr >= nt)
			break;
		UNROLL for (int d0 = 0; d0 < HD; d0 += 32) {
			_mm512_storeu_ps(o[rr] + d0, _mm512_permutex2var_ps(acc[rr][d0 / 16], i0, acc[rr][d0 / 16 + 1]));
			_mm512_storeu_ps(o[rr] + d0 + 16,
					 _mm512_permutex2var_ps(acc[rr][d0 / 16], i1, acc[rr][d0 / 16 + 1]));
		}
	}
}


/* The nr query rows to bfloat16 (nearest even), HD apart at qb */
TGT static inline __attribute__((always_inline)) void queries_bf16(const int HD, int nr, const float *const *q,
								   uint16_t *qb)
{
	for (int r = 0; r < nr; r++)
		UNROLL for (int d = 0; d < HD; d += 32)
			_mm512_storeu_si512((void *)(qb + (size_t)r * HD + d),
					    (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q[r] + d + 16), _mm512_loadu_ps(q[r] + d)));
}

/* Each row's scores (n16 apart at sc) to its weights: exp, rounded to
 * bfloat16 in place (row r's weights over the first half of its scores),
 * zeros up to n16; ml[r] = (max, sum of the rounded weights) */
TGT static void weights_bf16(int nr, const int *len, float *sc, int n16, float *const *ml)
{
	for (int r = 0; r < nr; r++) {
		float *s = sc + (size_t)r * n16;
		uint16_t *w = (uint16_t *)s;
		__m512 mx = _mm512_set1_ps(-INFINITY);
		for (int p0 = 0; p0 < len[r]; p0 += 16)
			mx = _mm512_mask_max_ps(mx, attn_tail_mask(len[r] - p0), mx, _mm512_loadu_ps(s + p0));
		float M = _mm512_reduce_max_ps(mx);
		__m512 vm = _mm512_set1_ps(M), sum = _mm512_setzero_ps();
		int p0 = 0;
		for (; p0 < len[r]; p0 += 16) {
			__m512 e = _mm512_maskz_mov_ps(attn_tail_mask(len[r] - p0), exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + p0), vm)));
			__m256i eb = (__m256i)_mm512_cvtneps_pbh(e);
			sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(eb), 16)));
			_mm256_storeu_si256((__m256i *)(w + p0), eb);
		}
		for (; p0 < n16; p0 += 16)
			_mm256_storeu_si256((__m256i *)(w + p0), _mm256_setzero_si256());
		ml[r][0] = M;
		ml[r][1] = attn_hsum16(sum);
	}
}

/* The V sums of nr rows (weights n16 apart at sc) over V rows at element
 * off, RT rows a pass */
TGT static inline __attribute__((always_inline)) void pv_rows(const int HD, const int RT, int nr, const int *len,
							      const uint16_t *const *v, int off, int n, const float *sc,
							      int n16, float *const *o)
{
	for (int r0 = 0; r0 < nr; r0 += RT) {
		int nt = nr - r0 < RT ? nr - r0 : RT, pe = 0;
		const uint16_t *w[6];
		for (int rr = 0; rr < RT; rr++)
			w[rr] = (const uint16_t *)(sc + (size_t)(r0 + (rr < nt ? rr : 0)) * n16);
		for (int rr = 0; rr < nt; rr++)
			pe = len[r0 + rr] > pe ? len[r0 + rr] : pe;
		/* as many rows as the pass has: a decode's group of three does
		 * not pay for six */
		switch (nt) {
		case 1: pv_block(HD, 1, 1, pe, v, off, n, w, o + r0); break;
		case 2: pv_block(HD, RT < 2 ? RT : 2, nt, pe, v, off, n, w, o + r0); break;
		case 3: pv_block(HD, RT < 3 ? RT : 3, nt, pe, v, off, n, w, o + r0); break;
		case 4: pv_block(HD, RT < 4 ? RT : 4, nt, pe, v, off, n, w, o + r0); break;
		case 5: pv_block(HD, RT < 5 ? RT : 5, nt, pe, v, off, n, w, o + r0); break;
		default: pv_block(HD, RT, nt, pe, v, off, n, w, o + r0); break;
		}
	}
}

/* The scores of nr rows (bfloat16 queries HD apart at qb, lengths len)
 * over positions p .. p + 15, K rows at element off: a decode's group of
 * at most three straight from the rows, more through the staged block ks */
TGT static inline __attribute__((always_inline)) void scores_block(const int HD, int nr, const int *len,
								   const uint16_t *qb, const uint16_t *const *k, int off,
								   int p, int n, __m512 vs, float *sc, int n16, uint16_t *ks)
{
	if (nr <= 3) {
		const uint16_t *qr[3];
		UNROLL for (int rr = 0; rr < 3; rr++) qr[rr] = qb + (size_t)(rr < nr ? rr : 0) * HD;
		switch (nr) {
		case 1: scores_direct16(HD, 1, qr, k, off, p, n, vs, sc, n16); break;
		case 2: scores_direct16(HD, 2, qr, k, off, p, n, vs, sc, n16); break;
		default: scores_direct16(HD, 3, qr, k, off, p, n, vs, sc, n16); break;
		}
		return;
	}
	stage16(HD, k, off, p, n, ks);
	for (int r = 0; r < nr; r += 3) {
		int R = nr - r < 3 ? nr - r : 3, lr = 0;
		for (int rr = 0; rr < R; rr++)
			lr = len[r + rr] > lr ? len[r + rr] : lr;
		if (p >= lr)
			continue;
		const uint16_t *qr[3];
		UNROLL for (int rr = 0; rr < 3; rr++) qr[rr] = qb + (size_t)(r + (rr < R ? rr : 0)) * HD;
		float *s = sc + (size_t)r * n16;
		if (R == 3)
			scores16(HD, 3, qr, ks, p, vs, s, n16);
		else if (R == 2)
			scores16(HD, 2, qr, ks, p, vs, s, n16);
		else
			scores16(HD, 1, qr, ks, p, vs, s, n16);
	}
}

/* scratch (ATTN_ROWS_SCRATCH): nr x n16 scores (then the weights, as
 * bfloat16, over the first half of each row), 16 staged positions, the
 * rows' bfloat16 queries. RT rows share each pass over V. */
TGT static inline __attribute__((always_inline)) void attn_bf16_t(const int HD, const int RT, int nr,
								  const float *const *q, const int *len,
								  const uint16_t *const *k, const uint16_t *const *v,
								  float scale, float *const *ml, float *const *o,
								  float *scratch)
{
	int n = 0;
	for (int r = 0; r < nr; r++)
		n = len[r] > n ? len[r] : n;
	const int n16 = (n + 15) & ~15;
	float *sc = scratch;
	uint16_t *ks = (uint16_t *)(sc + (size_t)nr * n16);
	uint16_t *qb = ks + 16 * (size_t)HD;

	if (nr <= 8) /* a decode's query group: the chunk's rows into L2 at once */
		for (int p = 0; p < n; p++)
			UNROLL for (int b = 0; b < HD * 2; b += 64) {
				_mm_prefetch((const char *)k[p] + b, _MM_HINT_T1);
				_mm_prefetch((const char *)v[p] + b, _MM_HINT_T1);
			}
	queries_bf16(HD, nr, q, qb);
	const __m512 vs = _mm512_set1_ps(scale);
	for (int p = 0; p < n; p += 16)
		scores_block(HD, nr, len, qb, k, 0, p, n, vs, sc, n16, ks);
	weights_bf16(nr, len, sc, n16, ml);
	pv_rows(HD, RT, nr, len, v, 0, n, sc, n16, o);
}

/* attn_heads_fn (ops.h) with attn_bf16_t's arithmetic: G heads' query
 * groups over one chunk, the scores block by block (16 positions) through
 * the heads, so that each block's K rows are read whole, in address
 * order, and each block's V rows requested into L2 as its scores are
 * made, for the V sums, head by head, to find them there. Each head's rows
 * go through attn_bf16_t's steps (scores_block, weights_bf16, pv_rows),
 * so its results are the same bits. */
TGT static inline __attribute__((always_inline)) void heads_bf16_t(const int HD, const int RT, int G, int nr, int n,
								   const float *const *q, const uint16_t *const *k,
								   const uint16_t *const *v, float scale,
								   float *const *ml, float *const *o, float *scratch)
{
	const int n16 = (n + 15) & ~15, NR = G * nr;
	float *sc = scratch;
	uint16_t *ks = (uint16_t *)(sc + (size_t)NR * n16);
	uint16_t *qb = ks + 16 * (size_t)HD;
	int len[ATTN_HEADS_MAX_ROWS];

	for (int r = 0; r < NR; r++)
		len[r] = n;
	queries_bf16(HD, NR, q, qb);
	const __m512 vs = _mm512_set1_ps(scale);
	for (int p = 0; p < n; p += 16)
		for (int g = 0; g < G; g++) {
			for (int i = p; i < p + 16 && i < n; i++)
				UNROLL for (int b = 0; b < HD * 2; b += 64)
					_mm_prefetch((const char *)(v[i] + g * HD) + b, _MM_HINT_T1);
			scores_block(HD, nr, len, qb + (size_t)g * nr * HD, k, g * HD, p, n, vs,
				     sc + (size_t)g * nr * n16, n16, ks);
		}
	weights_bf16(NR, len, sc, n16, ml);
	for (int g = 0; g < G; g++)
		pv_rows(HD, RT, nr, len, v, g * HD, n, sc + (size_t)g * nr * n16, n16, o + g * nr);
}

TGT static void attn_bf16_64(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			     const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	attn_bf16_t(64, 6, nr, q, len, k, v, scale, ml, o, scratch);
}

TGT static void attn_bf16_128(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			      const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	attn_bf16_t(128, 3, nr, q, len, k, v, scale, ml, o, scratch);
}

TGT static void attn_bf16_256(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			      const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	attn_bf16_t(256, 1, nr, q, len, k, v, scale, ml, o, scratch);
}

#define HEADS_ENTRY(NAME, HD, RT)                                                                             \
	TGT static void NAME(int G, int nr, int n, const float *const *q, const uint16_t *const *k,             \
			     const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch) \
	{                                                                                                     \
		heads_bf16_t(HD, RT, G, nr, n, q, k, v, scale, ml, o, scratch);                                \
	}
HEADS_ENTRY(heads_bf16_64, 64, 6)
HEADS_ENTRY(heads_bf16_128, 128, 3)
HEADS_ENTRY(heads_bf16_256, 256, 1)

static int have_bf16(void)
{
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
	       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
	       __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma");
}

attn_heads_fn cpu_attn_heads_bf16(int hd)
{
	if (!have_bf16())
		return NULL;
	return hd == 64 ? heads_bf16_64 : hd == 128 ? heads_bf16_128 : hd == 256 ? heads_bf16_256 : NULL;
}

attn_rows_fn cpu_attn_rows_bf16(int hd)
{
	if (!have_bf16())
		return NULL;
	return hd == 64 ? attn_bf16_64 : hd == 128 ? attn_bf16_128 : hd == 256 ? attn_bf16_256 : NULL;
}
#else
attn_rows_fn cpu_attn_rows_bf16(int hd)
{
	(void)hd;
	return NULL;
}

attn_heads_fn cpu_attn_heads_bf16(int hd)
{
	(void)hd;
	return NULL;
}
#endif
