/*
 * kernels/cpu/kvquant.c — K/V rows in f32, bf16, q8_0 and q4_0 (kvquant.h): the
 * row store of the forward pass, the row load of tests and tools, and the
 * dot and axpy products attention runs on rows in place.
 *
 * The products are written once, over 8-lane GCC vectors, and compiled
 * twice: portable and with AVX2 and FMA; an AVX-512 version (at the end)
 * runs two of those 8-lane computations per instruction. The operations
 * and their order are those kvquant.h states in all three, so they give
 * the same bits: a fused multiply-add is fmaf() in the portable build
 * (correctly rounded in software where the CPU lacks one) and vfmadd in
 * the others, and every reduction follows the one tree. The row store is
 * portable C only (one row per token and layer: not worth a second build).
 * q8_0 and q4_0 scores (and, on AVX-512, their weighted V sums) are the
 * integer-product kernels of kvq_int8.c, installed from here.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvq_int8.h"
#include "kvquant.h"
#include "ops.h"

#define QB KVD_KV_QBLOCK

/* 8-lane vectors pass by value only between always-inline helpers of this
 * file, never across an ABI boundary */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int8_t v8b __attribute__((vector_size(8), aligned(1)));

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")


static void put_h(uint8_t *p, float f)
{
	uint16_t h = cpu_f32_to_fp16(f);
	p[0] = (uint8_t)(h & 0xff);
	p[1] = (uint8_t)(h >> 8);
}

/* ---- store and load ----------------------------------------------------- */

static void quantize_q8_0(uint8_t *dst, const float *x)
{
	float amax = 0;
	for (int i = 0; i < QB; i++) {
		float a = fabsf(x[i]);
		if (a > amax)
			amax = a;
	}
	float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
	put_h(dst, d);
	for (int i = 0; i < QB; i++) {
		float v = x[i] * id;
		/* |v| <= 127 up to rounding; NaN (a broken model) stores 0 */
		int q = v == v ? (int)roundf(v) : 0;
		dst[2 + i] = (uint8_t)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
	}
}

static void quantize_q4_0(uint8_t *dst, const float *x)
{
	float amax = 0, max = 0;
	for (int i = 0; i < QB; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
	put_h(dst, d);
	for (int j = 0; j < QB / 2; j++) {
		float a = x[j] * id + 8.5f, b = x[j + QB / 2] * id + 8.5f;
		int qa = a >= 0 ? (a < 15 ? (int)a : 15) : 0; /* also NaN -> 0 */
		int qb = b >= 0 ? (b < 15 ? (int)b : 15) : 0;
		dst[2 + j] = (uint8_t)(qa | qb << 4);
	}
}

void cpu_kvq_store_row(enum kvd_kv_type t, void *dst, const float *src, int n)
{
	uint8_t *d = dst;
	switch (t) {
	case KVD_KV_F16:
		for (int i = 0; i < n; i++)
			put_h(d + 2 * i, src[i]);
		break;
	case KVD_KV_F32:
		memcpy(dst, src, sizeof(float) * (size_t)n);
		break;
	case KVD_KV_BF16:
		for (int i = 0; i < n; i++) {
			uint16_t h = cpu_f32_to_bf16(src[i]);
			d[2 * i] = (uint8_t)(h & 0xff);
			d[2 * i + 1] = (uint8_t)(h >> 8);
		}
		break;
	case KVD_KV_Q8_0:
		for (int b = 0; b < n / QB; b++)
			quantize_q8_0(d + (size_t)b * 34, src + b * QB);
		break;
	case KVD_KV_Q4_0:
		for (int b = 0; b < n / QB; b++)
			quantize_q4_0(d + (size_t)b * 18, src + b * QB);
		break;
	}
}

void cpu_kvq_load_row(enum kvd_kv_type t, const void *src, float *dst, int n)
{
	const uint8_t *s = src;
	switch (t) {
	case KVD_KV_F16:
		for (int i = 0; i < n; i++)
			dst[i] = cpu_kvq_h2f(s + 2 * i);
		break;
	case KVD_KV_F32:
		memcpy(dst, src, sizeof(float) * (size_t)n);
		break;
	case KVD_KV_BF16:
		for (int i = 0; i < n; i++)
			dst[i] = cpu_bf16_to_f32((uint16_t)(s[2 * i] | (uint16_t)(s[2 * i + 1] << 8)));
		break;
	case KVD_KV_Q8_0:
		for (int b = 0; b < n / QB; b++) {
			const uint8_t *blk = s + (size_t)b * 34;
			float d = cpu_kvq_h2f(blk);
			for (int i = 0; i < QB; i++)
				dst[b * QB + i] = d * (float)(int8_t)blk[2 + i];
		}
		break;
	case KVD_KV_Q4_0:
		for (int b = 0; b < n / QB; b++) {
			const uint8_t *blk = s + (size_t)b * 18;
			float d = cpu_kvq_h2f(blk);
			for (int j = 0; j < QB / 2; j++) {
				dst[b * QB + j] = d * (float)((blk[2 + j] & 15) - 8);
				dst[b * QB + j + QB / 2] = d * (float)((blk[2 + j] >> 4) - 8);
			}
		}
		break;
	}
}

/* ---- the products --------------------------------------------------------- */

INLINE size_t block_bytes(enum kvd_kv_type t)
{
	return t == KVD_KV_Q8_0 ? 34 : t == KVD_KV_Q4_0 ? 18 : t == KVD_KV_BF16 ? QB * 2 : QB * sizeof(float);
}

INLINE v8f ld8(const float *p)
{
	v8f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* Block blk of type t as its scale *d (1 for f32 and bf16) and 32 floats in kf[4]
 * (quants converted exactly), portable C. */
typedef void (*block_fn)(enum kvd_kv_type t, const uint8_t *blk, v8f kf[4], float *d);

INLINE void block_floats_generic(enum kvd_kv_type t, const uint8_t *blk, v8f kf[4], float *d)
{
	if (t == KVD_KV_BF16) {
		for (int i = 0; i < QB; i++)
			kf[i / 8][i % 8] = cpu_bf16_to_f32((uint16_t)(blk[2 * i] | (uint16_t)(blk[2 * i + 1] << 8)));
		*d = 1.0f;
		return;
	}
	if (t == KVD_KV_F32) {
		UNROLL for (int j = 0; j < 4; j++)
			kf[j] = ld8((const float *)(const void *)blk + 8 * j);
		*d = 1.0f;
		return;
	}
	*d = cpu_kvq_h2f(blk);
	if (t == KVD_KV_Q4_0) {
		for (int j = 0; j < QB / 2; j++) {
			kf[j / 8][j % 8] = (float)((blk[2 + j] & 15) - 8);
			kf[2 + j / 8][j % 8] = (float)((blk[2 + j] >> 4) - 8);
		}
		return;
	}
	for (int i = 0; i < QB; i++)
		kf[i / 8][i % 8] = (float)(int8_t)blk[2 + i];
}

/* The arithmetic both builds share, as three primitives each build
 * provides: fma8 (a * b + c per lane, one rounding: fmaf in the portable
 * build), hsum8x8 (lane j of the result: the sum of vector a[j]'s lanes by
 * the tree ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))) and conv
 * (block_floats). */
typedef v8f (*fma8_fn)(v8f a, v8f b, v8f c);
typedef v8f (*hsum8x8_fn)(const v8f *a);

INLINE v8f fma8_generic(v8f a, v8f b, v8f c)
{
	v8f r;
	for (int l = 0; l < 8; l++)
		r[l] = fmaf(a[l], b[l], c[l]);
	return r;
}

INLINE v8f hsum8x8_generic(const v8f *a)
{
	v8f r;
	for (int j = 0; j < 8; j++) {
		const v8f x = a[j];
		r[j] = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
	}
	return r;
}

/* K and V rows are prefetched this many positions ahead: a chunk's rows lie
 * in several pages, where hardware prefetchers stop */
#define KVQ_PF 16

INLINE void prefetch_row(const unsigned char *r, size_t bytes)
{
	for (size_t o = 0; o < bytes; o += 64)
		__builtin_prefetch(r + o, 0, 3);
}

/* Scores of NT rows (a compile-time count, so that the accumulators stay
 * in registers) for positions [0, n), eight positions sharing one
 * reduction (the last group padded by repeating position n - 1, whose
 * extra copies are not stored). */
INLINE void scores_rows(const int NT, block_fn conv, fma8_fn fma8, hsum8x8_fn hsum, enum kvd_kv_type t,
			const float *const *q, const unsigned char *const *k, int n, int hd, float scale, float *const *sc)
{
	size_t bb = block_bytes(t), rb = bb * (size_t)(hd / QB);
	int nb = hd / QB;
	for (int i0 = 0; i0 < n; i0 += 8) {
		v8f part[4][8];
		for (int j = 0; j < 8; j++) {
			int i = i0 + j < n ? i0 + j : n - 1;
			const unsigned char *kr = k[i];
			if (i + KVQ_PF < n)
				prefetch_row(k[i + KVQ_PF], rb);
			v8f acc[4];
			UNROLL for (int rr = 0; rr < NT; rr++)
				acc[rr] = (v8f){0};
			for (int b = 0; b < nb; b++) {
				v8f kf[4];
				float d;
				conv(t, kr + (size_t)b * bb, kf, &d);
				v8f dv = (v8f){0} + d;
				UNROLL for (int rr = 0; rr < NT; rr++) {
					const float *qb = q[rr] + b * QB;
					v8f p = ld8(qb) * kf[0];
					p = fma8(ld8(qb + 8), kf[1], p);
					p = fma8(ld8(qb + 16), kf[2], p);
					p = fma8(ld8(qb + 24), kf[3], p);
					acc[rr] = fma8(dv, p, acc[rr]);
				}
			}
			UNROLL for (int rr = 0; rr < NT; rr++)
				part[rr][j] = acc[rr];
		}
		int m = n - i0 < 8 ? n - i0 : 8;
		UNROLL for (int rr = 0; rr < NT; rr++) {
			v8f sv = hsum(part[rr]) * scale;
			memcpy(sc[rr] + i0, &sv, sizeof(float) * (size_t)m);
		}
	}
}

/* sc[r * ldsc + i] = (q_r . k_i) * scale for positions i < n (see kvquant.h
 * for the arithmetic), rows r < nr, up to four sharing each K block's
 * conversion */
INLINE void scores_body(block_fn conv, fma8_fn fma8, hsum8x8_fn hsum, enum kvd_kv_type t, const float *const *q,
			int nr, const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc)
{
	for (int r0 = 0; r0 < nr; r0 += 4) {
		float *scr[4];
		for (int rr = 0; rr < 4; rr++)
			scr[rr] = sc + (size_t)(r0 + rr) * ldsc;
		switch (nr - r0 < 4 ? nr - r0 : 4) {
		case 1: scores_rows(1, conv, fma8, hsum, t, q + r0, k, n, hd, scale, scr); break;
		case 2: scores_rows(2, conv, fma8, hsum, t, q + r0, k, n, hd, scale, scr); break;
		case 3: scores_rows(3, conv, fma8, hsum, t, q + r0, k, n, hd, scale, scr); break;
		default: scores_rows(4, conv, fma8, hsum, t, q + r0, k, n, hd, scale, scr); break;
		}
	}
}

/* o[rr] += w[rr * ldw + i] * v_i for NT rows (compile-time), positions
 * i < len[rr] in order, block b of each V row */
INLINE void accum_rows(const int NT, block_fn conv, fma8_fn fma8, enum kvd_kv_type t, float *const *o,
		       const int *len, const float *w, int ldw, const unsigned char *const *v, int b, size_t bb,
		       size_t rb)
{
	int n = 0, nc = len[0];
	for (int rr = 0; rr < NT; rr++) {
		n = len[rr] > n ? len[rr] : n;
		nc = len[rr] < nc ? len[rr] : nc;
	}
	v8f acc[3][4];
	UNROLL for (int rr = 0; rr < NT; rr++)
		UNROLL for (int j = 0; j < 4; j++)
			acc[rr][j] = ld8(o[rr] + b * QB + 8 * j);
	for (int i = 0; i < n; i++) {
		v8f vf[4];
		float d;
		if (b == 0 && i + KVQ_PF < n)
			prefetch_row(v[i + KVQ_PF], rb);
		conv(t, v[i] + (size_t)b * bb, vf, &d);
		UNROLL for (int rr = 0; rr < NT; rr++) {
			if (i >= nc && i >= len[rr]) /* past this row's end */
				continue;
			v8f a = (v8f){0} + w[(size_t)rr * ldw + i] * d;
			UNROLL for (int j = 0; j < 4; j++)
				acc[rr][j] = fma8(a, vf[j], acc[rr][j]);
		}
	}
	UNROLL for (int rr = 0; rr < NT; rr++)
		memcpy(o[rr] + b * QB, acc[rr], sizeof(acc[rr]));
}

/* o_r += w[r * ldw + i] * v_i for positions i < len[r] in order, rows r < nr:
 * per block, y = fma(w * d, v, y); up to three rows share each conversion */
INLINE void accum_body(block_fn conv, fma8_fn fma8, enum kvd_kv_type t, float *const *o, int nr, const int *len,
		       const float *w, int ldw, const unsigned char *const *v, int hd)
{
	size_t bb = block_bytes(t), rb = bb * (size_t)(hd / QB);
	for (int b = 0; b < hd / QB; b++) {
		for (int r0 = 0; r0 < nr; r0 += 3) {
			const float *wr = w + (size_t)r0 * ldw;
			switch (nr - r0 < 3 ? nr - r0 : 3) {
			case 1: accum_rows(1, conv, fma8, t, o + r0, len + r0, wr, ldw, v, b, bb, rb); break;
			case 2: accum_rows(2, conv, fma8, t, o + r0, len + r0, wr, ldw, v, b, bb, rb); break;
			default: accum_rows(3, conv, fma8, t, o + r0, len + r0, wr, ldw, v, b, bb, rb); break;
			}
		}
	}
}

/* q8_0 and q4_0 K rows go through the integer products (kvq_int8.c) */
INLINE int int8_scores(enum kvd_kv_type t, int hd)
{
	return (t == KVD_KV_Q8_0 || t == KVD_KV_Q4_0) && hd <= KVQ_INT8_MAX_HD;
}

static void scores_generic(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			   int hd, float scale, float *sc, int ldsc)
{
	if (int8_scores(t, hd)) {
		cpu_kvq8_scores_generic(t, q, nr, k, n, hd, scale, sc, ldsc);
		return;
	}
	scores_body(block_floats_generic, fma8_generic, hsum8x8_generic, t, q, nr, k, n, hd, scale, sc, ldsc);
}

static void accum_generic(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			  const unsigned char *const *v, int hd)
{
	if (t == KVD_KV_Q8_0 || t == KVD_KV_Q4_0) {
		cpu_kvq8_accum_generic(t, o, nr, len, w, ldw, v, hd);
		return;
	}
	accum_body(block_floats_generic, fma8_generic, t, o, nr, len, w, ldw, v, hd);
}

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))

/* block_floats_generic with AVX2 conversions (the same values: int8 and
 * int32 to float are exact) */
AVX2 INLINE void block_floats_avx2(enum kvd_kv_type t, const uint8_t *blk, v8f kf[4], float *d)
{
	__m128i lo, hi;
	if (t == KVD_KV_BF16) {
		UNROLL for (int j = 0; j < 4; j++)
			kf[j] = (v8f)_mm256_castsi256_ps(_mm256_slli_epi32(
				_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + 16 * j))), 16));
		*d = 1.0f;
		return;
	}
	if (t == KVD_KV_F32) {
		UNROLL for (int j = 0; j < 4; j++)
			kf[j] = ld8((const float *)(const void *)blk + 8 * j);
		*d = 1.0f;
		return;
	}
	*d = cpu_kvq_h2f(blk);
	if (t == KVD_KV_Q4_0) {
		const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
		__m128i x = _mm_loadu_si128((const __m128i *)(blk + 2));
		lo = _mm_sub_epi8(_mm_and_si128(x, m), e);
		hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m), e);
	} else {
		lo = _mm_loadu_si128((const __m128i *)(blk + 2));
		hi = _mm_loadu_si128((const __m128i *)(blk + 18));
	}
	kf[0] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
	kf[1] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
	kf[2] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
	kf[3] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

AVX2 INLINE v8f fma8_avx2(v8f a, v8f b, v8f c)
{
	return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}

/* hsum8x8_generic's tree for eight vectors at once: horizontal adds pair
 * lanes (x0 + x1, x2 + x3), then the pairs, then the two 128-bit halves */
AVX2 INLINE v8f hsum8x8_avx2(const v8f *a)
{
	__m256 h01 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]), h23 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
	__m256 h45 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]), h67 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
	__m256 g0 = _mm256_hadd_ps(h01, h23), g1 = _mm256_hadd_ps(h45, h67);
	/* g0: lanes 0-3 the first halves of vectors 0-3, lanes 4-7 their second halves */
	return (v8f)_mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

AVX2 static void scores_avx2(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			     int hd, float scale, float *sc, int ldsc)
{
	if (int8_scores(t, hd)) {
		cpu_kvq8_scores_avx2(t, q, nr, k, n, hd, scale, sc, ldsc);
		return;
	}
	scores_body(block_floats_avx2, fma8_avx2, hsum8x8_avx2, t, q, nr, k, n, hd, scale, sc, ldsc);
}

/* Elements 16h .. 16h + 15 of a block as two 8-lane vectors (the lanes of
 * vectors 2h and 2h + 1 of block_floats_avx2), and the block's scale. */
AVX2 INLINE void half_floats_avx2(enum kvd_kv_type t, const uint8_t *blk, int h, __m256 kf[2], float *d)
{
	__m128i x;
	if (t == KVD_KV_BF16) {
		UNROLL for (int j = 0; j < 2; j++)
			kf[j] = _mm256_castsi256_ps(_mm256_slli_epi32(
				_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + 32 * h + 16 * j))), 16));
		*d = 1.0f;
		return;
	}
	if (t == KVD_KV_F32) {
		UNROLL for (int j = 0; j < 2; j++)
			kf[j] = _mm256_loadu_ps((const float *)(const void *)blk + 16 * h + 8 * j);
		*d = 1.0f;
		return;
	}
	*d = cpu_kvq_h2f(blk);
	if (t == KVD_KV_Q4_0) {
		const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
		x = _mm_loadu_si128((const __m128i *)(blk + 2));
		x = _mm_sub_epi8(_mm_and_si128(h ? _mm_srli_epi16(x, 4) : x, m), e);
	} else {
		x = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * h));
	}
	kf[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
	kf[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
}

/* accum_rows for four rows over half h of block b: the four rows share
 * each conversion of 16 elements (8 accumulators), where three rows over
 * a whole block would take 12 and a fourth row a second conversion. The
 * same operations per element as accum_rows. */
AVX2 INLINE void accum_rows4h_avx2(enum kvd_kv_type t, float *const *o, const int *len, const float *w, int ldw,
				   const unsigned char *const *v, int b, int h, size_t bb, size_t rb)
{
	int n = 0, nc = len[0];
	for (int rr = 0; rr < 4; rr++) {
		n = len[rr] > n ? len[rr] : n;
		nc = len[rr] < nc ? len[rr] : nc;
	}
	__m256 acc[4][2];
	UNROLL for (int rr = 0; rr < 4; rr++)
		UNROLL for (int j = 0; j < 2; j++)
			acc[rr][j] = _mm256_loadu_ps(o[rr] + b * QB + 16 * h + 8 * j);
	for (int i = 0; i < n; i++) {
		__m256 vf[2];
		float d;
		if (b == 0 && h == 0 && i + KVQ_PF < n)
			prefetch_row(v[i + KVQ_PF], rb);
		half_floats_avx2(t, v[i] + (size_t)b * bb, h, vf, &d);
		UNROLL for (int rr = 0; rr < 4; rr++) {
			if (i >= nc && i >= len[rr]) /* past this row's end */
				continue;
			/* 0 + w d, as accum_rows forms it (the sign of a zero too) */
			__m256 a = _mm256_add_ps(_mm256_setzero_ps(), _mm256_set1_ps(w[(size_t)rr * ldw + i] * d));
			UNROLL for (int j = 0; j < 2; j++)
				acc[rr][j] = _mm256_fmadd_ps(a, vf[j], acc[rr][j]);
		}
	}
	UNROLL for (int rr = 0; rr < 4; rr++)
		UNROLL for (int j = 0; j < 2; j++)
			_mm256_storeu_ps(o[rr] + b * QB + 16 * h + 8 * j, acc[rr][j]);
}

/* accum_body with groups of four rows by half blocks, the last one to
 * three rows as there */
AVX2 static void accum_avx2(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			    const unsigned char *const *v, int hd)
{
	if (t == KVD_KV_Q8_0 || t == KVD_KV_Q4_0) {
		cpu_kvq8_accum_avx2(t, o, nr, len, w, ldw, v, hd);
		return;
	}
	size_t bb = block_bytes(t), rb = bb * (size_t)(hd / QB);
	for (int b = 0; b < hd / QB; b++) {
		int r0 = 0;
		for (; nr - r0 >= 4; r0 += 4)
			for (int h = 0; h < 2; h++)
				accum_rows4h_avx2(t, o + r0, len + r0, w + (size_t)r0 * ldw, ldw, v, b, h, bb, rb);
		const float *wr = w + (size_t)r0 * ldw;
		switch (nr - r0) {
		case 0: break;
		case 1: accum_rows(1, block_floats_avx2, fma8_avx2, t, o + r0, len + r0, wr, ldw, v, b, bb, rb); break;
		case 2: accum_rows(2, block_floats_avx2, fma8_avx2, t, o + r0, len + r0, wr, ldw, v, b, bb, rb); break;
		default: accum_rows(3, block_floats_avx2, fma8_avx2, t, o + r0, len + r0, wr, ldw, v, b, bb, rb); break;
		}
	}
}

/* ---- AVX-512: two 8-lane computations per instruction ---------------------
 *
 * The same arithmetic lane for lane: in the scores, the two halves of a
 * 16-lane register hold two positions (each half the 8 lanes of the
 * portable code, q broadcast to both), in the weighted sums two rows (each
 * half one row's 8 lanes, V broadcast to both); a row that has ended is
 * masked out instead of skipped. So every (row, position) goes through the
 * same roundings as in the other builds. */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))

/* Block b of the rows of two positions, as 16-lane vectors: lanes 0-7 of
 * kf[m] are elements 8m..8m+7 of the first, lanes 8-15 of the second; dv
 * their scales. */
AVX512 INLINE void block2_floats_avx512(enum kvd_kv_type t, const uint8_t *b0, const uint8_t *b1, __m512 kf[4],
					 __m512 *dv)
{
	if (t == KVD_KV_BF16) {
		UNROLL for (int m = 0; m < 4; m++) {
			__m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 16 * m))),
							    _mm_loadu_si128((const __m128i *)(b1 + 16 * m)), 1);
			kf[m] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
		}
		*dv = _mm512_set1_ps(1.0f);
		return;
	}
	if (t == KVD_KV_F32) {
		UNROLL for (int m = 0; m < 4; m++)
			kf[m] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)(const void *)b0 + 8 * m)),
						   _mm256_loadu_ps((const float *)(const void *)b1 + 8 * m), 1);
		*dv = _mm512_set1_ps(1.0f);
		return;
	}
	*dv = _mm512_insertf32x8(_mm512_set1_ps(cpu_kvq_h2f(b0)), _mm256_set1_ps(cpu_kvq_h2f(b1)), 1);
	__m128i lo0, hi0, lo1, hi1;
	if (t == KVD_KV_Q4_0) {
		const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
		__m128i x0 = _mm_loadu_si128((const __m128i *)(b0 + 2)), x1 = _mm_loadu_si128((const __m128i *)(b1 + 2));
		lo0 = _mm_sub_epi8(_mm_and_si128(x0, m), e);
		hi0 = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x0, 4), m), e);
		lo1 = _mm_sub_epi8(_mm_and_si128(x1, m), e);
		hi1 = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x1, 4), m), e);
	} else {
		lo0 = _mm_loadu_si128((const __m128i *)(b0 + 2));
		hi0 = _mm_loadu_si128((const __m128i *)(b0 + 18));
		lo1 = _mm_loadu_si128((const __m128i *)(b1 + 2));
		hi1 = _mm_loadu_si128((const __m128i *)(b1 + 18));
	}
	kf[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi64(lo0, lo1)));
	kf[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi64(lo0, lo1)));
	kf[2] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi64(hi0, hi1)));
	kf[3] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi64(hi0, hi1)));
}

AVX512 INLINE __m512 bcast8(const float *p)
{
	return _mm512_broadcast_f32x8(_mm256_loadu_ps(p));
}

AVX512 INLINE void scores_rows_avx512(const int NT, enum kvd_kv_type t, const float *const *q,
				      const unsigned char *const *k, int n, int hd, float scale, float *const *sc)
{
	size_t bb = block_bytes(t), rb = bb * (size_t)(hd / QB);
	int nb = hd / QB;
	for (int i0 = 0; i0 < n; i0 += 8) {
		v8f part[4][8];
		for (int j = 0; j < 8; j += 2) {
			int ia = i0 + j < n ? i0 + j : n - 1, ib = i0 + j + 1 < n ? i0 + j + 1 : n - 1;
			if (ib + KVQ_PF < n) {
				prefetch_row(k[ia + KVQ_PF], rb);
				prefetch_row(k[ib + KVQ_PF], rb);
			}
			__m512 acc[4];
			UNROLL for (int rr = 0; rr < NT; rr++)
				acc[rr] = _mm512_setzero_ps();
			for (int b = 0; b < nb; b++) {
				__m512 kf[4], dv;
				block2_floats_avx512(t, k[ia] + (size_t)b * bb, k[ib] + (size_t)b * bb, kf, &dv);
				UNROLL for (int rr = 0; rr < NT; rr++) {
					const float *qb = q[rr] + b * QB;
					__m512 p = _mm512_mul_ps(bcast8(qb), kf[0]);
					p = _mm512_fmadd_ps(bcast8(qb + 8), kf[1], p);
					p = _mm512_fmadd_ps(bcast8(qb + 16), kf[2], p);
					p = _mm512_fmadd_ps(bcast8(qb + 24), kf[3], p);
					acc[rr] = _mm512_fmadd_ps(dv, p, acc[rr]);
				}
			}
			UNROLL for (int rr = 0; rr < NT; rr++) {
				part[rr][j] = (v8f)_mm512_castps512_ps256(acc[rr]);
				part[rr][j + 1] = (v8f)_mm512_extractf32x8_ps(acc[rr], 1);
			}
		}
		int m = n - i0 < 8 ? n - i0 : 8;
		UNROLL for (int rr = 0; rr < NT; rr++) {
			v8f sv = hsum8x8_avx2(part[rr]) * scale;
			memcpy(sc[rr] + i0, &sv, sizeof(float) * (size_t)m);
		}
	}
}

AVX512 static void scores_avx512(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k,
				 int n, int hd, float scale, float *sc, int ldsc)
{
	if (int8_scores(t, hd)) {
		/* without VNNI, the AVX2 integer products (the same bits) */
		if (cpu_kvq8_have_vnni())
			cpu_kvq8_scores_avx512(t, q, nr, k, n, hd, scale, sc, ldsc);
		else
			cpu_kvq8_scores_avx2(t, q, nr, k, n, hd, scale, sc, ldsc);
		return;
	}
	for (int r0 = 0; r0 < nr; r0 += 4) {
		float *scr[4];
		for (int rr = 0; rr < 4; rr++)
			scr[rr] = sc + (size_t)(r0 + rr) * ldsc;
		switch (nr - r0 < 4 ? nr - r0 : 4) {
		case 1: scores_rows_avx512(1, t, q + r0, k, n, hd, scale, scr); break;
		case 2: scores_rows_avx512(2, t, q + r0, k, n, hd, scale, scr); break;
		case 3: scores_rows_avx512(3, t, q + r0, k, n, hd, scale, scr); break;
		default: scores_rows_avx512(4, t, q + r0, k, n, hd, scale, scr); break;
		}
	}
}

/* Rows r and r + 1 of the weighted V sum, block b: one row per half. */
AVX512 static void accum_pair_avx512(enum kvd_kv_type t, float *o0, float *o1, int len0, int len1, const float *w0,
				     const float *w1, const unsigned char *const *v, int b, size_t bb, size_t rb)
{
	int n = len0 > len1 ? len0 : len1;
	__m512 acc[4];
	UNROLL for (int j = 0; j < 4; j++)
		acc[j] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(o0 + b * QB + 8 * j)),
					    _mm256_loadu_ps(o1 + b * QB + 8 * j), 1);
	for (int i = 0; i < n; i++) {
		v8f vf[4];
		float d;
		if (b == 0 && i + KVQ_PF < n)
			prefetch_row(v[i + KVQ_PF], rb);
		block_floats_avx2(t, v[i] + (size_t)b * bb, vf, &d);
		/* a row past its end keeps its lanes (masked) */
		__mmask16 live = (__mmask16)((i < len0 ? 0x00ff : 0) | (i < len1 ? 0xff00 : 0));
		__m512 a = _mm512_insertf32x8(_mm512_set1_ps(w0[i] * d), _mm256_set1_ps(w1[i] * d), 1);
		UNROLL for (int j = 0; j < 4; j++)
			acc[j] = _mm512_mask3_fmadd_ps(a, _mm512_broadcast_f32x8((__m256)vf[j]), acc[j], live);
	}
	UNROLL for (int j = 0; j < 4; j++) {
		_mm256_storeu_ps(o0 + b * QB + 8 * j, _mm512_castps512_ps256(acc[j]));
		_mm256_storeu_ps(o1 + b * QB + 8 * j, _mm512_extractf32x8_ps(acc[j], 1));
	}
}

AVX512 static void accum_avx512(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
				const unsigned char *const *v, int hd)
{
	if (t == KVD_KV_Q8_0 || t == KVD_KV_Q4_0) {
		cpu_kvq8_accum_avx512(t, o, nr, len, w, ldw, v, hd);
		return;
	}
	size_t bb = block_bytes(t), rb = bb * (size_t)(hd / QB);
	for (int b = 0; b < hd / QB; b++) {
		int r = 0;
		for (; r + 2 <= nr; r += 2)
			accum_pair_avx512(t, o[r], o[r + 1], len[r], len[r + 1], w + (size_t)r * ldw,
					  w + (size_t)(r + 1) * ldw, v, b, bb, rb);
		if (r < nr) /* the odd row: the 8-lane code, the same arithmetic */
			accum_rows(1, block_floats_avx2, fma8_avx2, t, o + r, len + r, w + (size_t)r * ldw, ldw, v, b, bb, rb);
	}
}
#endif

void cpu_kvq_kernels_init(struct kvq_kernels *k, int level)
{
	k->isa = "generic";
	k->scores = scores_generic;
	k->accum = accum_generic;
	k->softmax = cpu_kvq8_softmax_generic;
	k->quant = cpu_kvq8_quant_generic;
	k->scores_i8 = cpu_kvq8_scores_i8_generic;
#if defined(__x86_64__)
	if (level >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		k->isa = "avx2";
		k->scores = scores_avx2;
		k->accum = accum_avx2;
		k->softmax = cpu_kvq8_softmax_avx2;
		k->quant = cpu_kvq8_quant_avx2;
		k->scores_i8 = cpu_kvq8_scores_i8_avx2;
	}
	if (level >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma")) {
		k->isa = "avx512";
		k->scores = scores_avx512;
		k->accum = accum_avx512;
		k->softmax = cpu_kvq8_softmax_avx512;
		/* without VNNI, the AVX2 integer products (the same bits) */
		if (cpu_kvq8_have_vnni()) {
			k->quant = cpu_kvq8_quant_avx512;
			k->scores_i8 = cpu_kvq8_scores_i8_avx512;
		}
	}
#else
	(void)level;
#endif
}
