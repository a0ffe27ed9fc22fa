/*
 * kernels/cpu/kvquant.c — K/V rows in f32, q8_0 and q4_0 (kvquant.h): the
 * row store of the forward pass, the row load of tests and tools, and the
 * dot and axpy products attention runs on rows in place.
 *
 * The products are written once, over 8-lane GCC vectors, and compiled
 * twice: portable (SSE2 on x86-64) and with AVX2 enabled. The operations
 * and their order are those kvquant.h states in both, so the two give the
 * same bits; AVX2 only makes them faster (one 256-bit instruction where
 * SSE2 needs two, and a wider int8 -> float conversion).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvquant.h"
#include "ops.h"

#define QB KVD_KV_QBLOCK

/* 8-lane vectors pass by value only between always-inline helpers of this
 * file, never across an ABI boundary */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int8_t v8b __attribute__((vector_size(8), aligned(1)));

#define INLINE static inline __attribute__((always_inline))

/* IEEE half to single (exact) */
INLINE float h2f(const uint8_t *p)
{
	uint16_t h = (uint16_t)(p[0] | (uint16_t)(p[1] << 8));
	uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
	float f;
	if (e == 0) {
		f = (float)m * 0x1p-24f;
		return s ? -f : f;
	}
	bits = e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112) << 23) | (m << 13);
	memcpy(&f, &bits, 4);
	return f;
}

static void put_h(uint8_t *p, float f)
{
	uint16_t h = f32_to_fp16(f);
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

void kvq_store_row(enum kvd_kv_type t, void *dst, const float *src, int n)
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

void kvq_load_row(enum kvd_kv_type t, const void *src, float *dst, int n)
{
	const uint8_t *s = src;
	switch (t) {
	case KVD_KV_F16:
		for (int i = 0; i < n; i++)
			dst[i] = h2f(s + 2 * i);
		break;
	case KVD_KV_F32:
		memcpy(dst, src, sizeof(float) * (size_t)n);
		break;
	case KVD_KV_Q8_0:
		for (int b = 0; b < n / QB; b++) {
			const uint8_t *blk = s + (size_t)b * 34;
			float d = h2f(blk);
			for (int i = 0; i < QB; i++)
				dst[b * QB + i] = d * (float)(int8_t)blk[2 + i];
		}
		break;
	case KVD_KV_Q4_0:
		for (int b = 0; b < n / QB; b++) {
			const uint8_t *blk = s + (size_t)b * 18;
			float d = h2f(blk);
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
	return t == KVD_KV_Q8_0 ? 34 : t == KVD_KV_Q4_0 ? 18 : QB * sizeof(float);
}

INLINE v8f ld8(const float *p)
{
	v8f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* Block blk of type t as its scale *d (1 for f32) and 32 floats in kf[4]
 * (quants converted exactly), portable C. */
typedef void (*block_fn)(enum kvd_kv_type t, const uint8_t *blk, v8f kf[4], float *d);

INLINE void block_floats_generic(enum kvd_kv_type t, const uint8_t *blk, v8f kf[4], float *d)
{
	if (t == KVD_KV_F32) {
		for (int j = 0; j < 4; j++)
			kf[j] = ld8((const float *)(const void *)blk + 8 * j);
		*d = 1.0f;
		return;
	}
	*d = h2f(blk);
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

INLINE float hsum8_generic(const v8f *pa)
{
	const v8f a = *pa;
	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

typedef float (*hsum_fn)(const v8f *a);


/* sc[r * ldsc + i] = (q_r . k_i) * scale for positions i < n (see kvquant.h
 * for the order), rows r < nr: four rows at a time share each K block's
 * conversion, their accumulators held in registers */
INLINE void scores_body(block_fn conv, hsum_fn hsum, enum kvd_kv_type t, const float *q, int ldq, int nr,
			const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc)
{
	size_t bb = block_bytes(t);
	int nb = hd / QB;
	for (int r0 = 0; r0 < nr; r0 += 4) {
		int nt = nr - r0 < 4 ? nr - r0 : 4;
		const float *qr = q + (size_t)r0 * ldq;
		for (int i = 0; i < n; i++) {
			v8f acc[4] = {{0}, {0}, {0}, {0}};
			for (int b = 0; b < nb; b++) {
				v8f kf[4];
				float d;
				conv(t, k[i] + (size_t)b * bb, kf, &d);
				for (int rr = 0; rr < 4; rr++) {
					if (rr >= nt)
						break;
					const float *qb = qr + (size_t)rr * ldq + b * QB;
					v8f p = ld8(qb) * kf[0] + ld8(qb + 8) * kf[1];
					p = p + ld8(qb + 16) * kf[2];
					p = p + ld8(qb + 24) * kf[3];
					acc[rr] = acc[rr] + d * p;
				}
			}
			for (int rr = 0; rr < nt; rr++)
				sc[(size_t)(r0 + rr) * ldsc + i] = hsum(&acc[rr]) * scale;
		}
	}
}

/* o_r += w[r * ldw + i] * v_i for positions i < n in order, rows r < nr */
INLINE void accum_body(block_fn conv, enum kvd_kv_type t, float *o, int ldo, int nr, const float *w, int ldw,
		       const unsigned char *const *v, int n, int hd)
{
	size_t bb = block_bytes(t);
	int nb = hd / QB;
	for (int b = 0; b < nb; b++) {
		for (int r0 = 0; r0 < nr; r0 += 4) {
			int nt = nr - r0 < 4 ? nr - r0 : 4;
			v8f acc[4][4];
			for (int rr = 0; rr < nt; rr++)
				for (int j = 0; j < 4; j++)
					acc[rr][j] = ld8(o + (size_t)(r0 + rr) * ldo + b * QB + 8 * j);
			for (int i = 0; i < n; i++) {
				v8f vf[4];
				float d;
				conv(t, v[i] + (size_t)b * bb, vf, &d);
				for (int rr = 0; rr < 4; rr++) {
					if (rr >= nt)
						break;
					float a = w[(size_t)(r0 + rr) * ldw + i] * d;
					for (int j = 0; j < 4; j++)
						acc[rr][j] = acc[rr][j] + a * vf[j];
				}
			}
			for (int rr = 0; rr < nt; rr++)
				memcpy(o + (size_t)(r0 + rr) * ldo + b * QB, acc[rr], sizeof(acc[rr]));
		}
	}
}

static void scores_generic(enum kvd_kv_type t, const float *q, int ldq, int nr, const unsigned char *const *k, int n,
			   int hd, float scale, float *sc, int ldsc)
{
	scores_body(block_floats_generic, hsum8_generic, t, q, ldq, nr, k, n, hd, scale, sc, ldsc);
}

static void accum_generic(enum kvd_kv_type t, float *o, int ldo, int nr, const float *w, int ldw,
			  const unsigned char *const *v, int n, int hd)
{
	accum_body(block_floats_generic, t, o, ldo, nr, w, ldw, v, n, hd);
}

#if defined(__x86_64__)
#include <immintrin.h>
/* no "fma": a multiply and an add stay two roundings, as in the portable build */
#define AVX2 __attribute__((target("avx2")))

/* block_floats_generic with AVX2 conversions (the same values: int8 and
 * int32 to float are exact) */
AVX2 INLINE void block_floats_avx2(enum kvd_kv_type t, const uint8_t *blk, v8f kf[4], float *d)
{
	__m128i lo, hi;
	if (t == KVD_KV_F32) {
		for (int j = 0; j < 4; j++)
			kf[j] = ld8((const float *)(const void *)blk + 8 * j);
		*d = 1.0f;
		return;
	}
	*d = h2f(blk);
	if (t == KVD_KV_Q4_0) {
		const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
		__m128i x = _mm_loadu_si128((const __m128i *)(blk + 2));
		lo = _mm_sub_epi8(_mm_and_si128(x, m), e);
		hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m), e);
	} else {
		lo = _mm_loadu_si128((const __m128i *)(blk + 2));
		hi = _mm_loadu_si128((const __m128i *)(blk + 18));
	}
	__m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
	__m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
	__m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
	__m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
	kf[0] = (v8f)f0;
	kf[1] = (v8f)f1;
	kf[2] = (v8f)f2;
	kf[3] = (v8f)f3;
}

/* hsum8_generic's tree: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) */
AVX2 INLINE float hsum8_avx2(const v8f *pa)
{
	__m256 v = (__m256)*pa;
	__m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	h = _mm_add_ps(h, _mm_movehl_ps(h, h));
	h = _mm_add_ss(h, _mm_movehdup_ps(h));
	return _mm_cvtss_f32(h);
}

AVX2 static void scores_avx2(enum kvd_kv_type t, const float *q, int ldq, int nr, const unsigned char *const *k, int n,
			     int hd, float scale, float *sc, int ldsc)
{
	scores_body(block_floats_avx2, hsum8_avx2, t, q, ldq, nr, k, n, hd, scale, sc, ldsc);
}

AVX2 static void accum_avx2(enum kvd_kv_type t, float *o, int ldo, int nr, const float *w, int ldw,
			    const unsigned char *const *v, int n, int hd)
{
	accum_body(block_floats_avx2, t, o, ldo, nr, w, ldw, v, n, hd);
}
#endif

void kvq_kernels_init(struct kvq_kernels *k, int allow_simd)
{
	k->isa = "generic";
	k->scores = scores_generic;
	k->accum = accum_generic;
#if defined(__x86_64__)
	if (allow_simd && __builtin_cpu_supports("avx2")) {
		k->isa = "avx2";
		k->scores = scores_avx2;
		k->accum = accum_avx2;
	}
#else
	(void)allow_simd;
#endif
}
