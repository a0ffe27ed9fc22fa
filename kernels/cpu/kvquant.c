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

/* Block blk of type t as its scale *d (1 for f32) and 32 floats in kf[4]
 * (quants converted exactly). */
INLINE void block_floats(enum kvd_kv_type t, const uint8_t *blk, v8f kf[4], float *d)
{
	if (t == KVD_KV_F32) {
		memcpy(kf, blk, 4 * sizeof(v8f));
		*d = 1.0f;
		return;
	}
	const int8_t *q = (const int8_t *)(blk + 2);
	int8_t un[QB];
	*d = h2f(blk);
	if (t == KVD_KV_Q4_0) {
		for (int j = 0; j < QB / 2; j++) {
			un[j] = (int8_t)((blk[2 + j] & 15) - 8);
			un[j + QB / 2] = (int8_t)((blk[2 + j] >> 4) - 8);
		}
		q = un;
	}
	for (int j = 0; j < 4; j++) {
		v8b b;
		memcpy(&b, q + 8 * j, sizeof(b));
		kf[j] = __builtin_convertvector(b, v8f);
	}
}

INLINE float hsum8(const v8f *v)
{
	const v8f a = *v;
	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

INLINE void dotn_body(enum kvd_kv_type t, const float *q, int ldq, int nr, const void *k, int n, float *out)
{
	v8f acc[64];
	size_t bb = block_bytes(t);
	for (int r = 0; r < nr; r++)
		acc[r] = (v8f){0};
	for (int b = 0; b < n / QB; b++) {
		v8f kf[4];
		float d;
		block_floats(t, (const uint8_t *)k + (size_t)b * bb, kf, &d);
		for (int r = 0; r < nr; r++) {
			v8f qv[4];
			memcpy(qv, q + (size_t)r * ldq + b * QB, sizeof(qv));
			v8f p = qv[0] * kf[0] + qv[1] * kf[1];
			p = p + qv[2] * kf[2];
			p = p + qv[3] * kf[3];
			acc[r] = acc[r] + d * p;
		}
	}
	for (int r = 0; r < nr; r++)
		out[r] = hsum8(&acc[r]);
}

INLINE void axpyn_body(enum kvd_kv_type t, float *y, int ldy, const float *a, int nr, const void *v, int n)
{
	size_t bb = block_bytes(t);
	for (int b = 0; b < n / QB; b++) {
		v8f vf[4];
		float d;
		block_floats(t, (const uint8_t *)v + (size_t)b * bb, vf, &d);
		for (int r = 0; r < nr; r++) {
			float w = a[r] * d;
			float *yr = y + (size_t)r * ldy + b * QB;
			v8f yv[4];
			memcpy(yv, yr, sizeof(yv));
			for (int j = 0; j < 4; j++)
				yv[j] = yv[j] + w * vf[j];
			memcpy(yr, yv, sizeof(yv));
		}
	}
}

static void dotn_generic(enum kvd_kv_type t, const float *q, int ldq, int nr, const void *k, int n, float *out)
{
	dotn_body(t, q, ldq, nr, k, n, out);
}

static void axpyn_generic(enum kvd_kv_type t, float *y, int ldy, const float *a, int nr, const void *v, int n)
{
	axpyn_body(t, y, ldy, a, nr, v, n);
}

#if defined(__x86_64__)
/* no "fma": a multiply and an add stay two roundings, as in the portable build */
#define AVX2 __attribute__((target("avx2")))
AVX2 static void dotn_avx2(enum kvd_kv_type t, const float *q, int ldq, int nr, const void *k, int n, float *out)
{
	dotn_body(t, q, ldq, nr, k, n, out);
}

AVX2 static void axpyn_avx2(enum kvd_kv_type t, float *y, int ldy, const float *a, int nr, const void *v, int n)
{
	axpyn_body(t, y, ldy, a, nr, v, n);
}
#endif

void kvq_kernels_init(struct kvq_kernels *k, int allow_simd)
{
	k->isa = "generic";
	k->dotn = dotn_generic;
	k->axpyn = axpyn_generic;
#if defined(__x86_64__)
	if (allow_simd && __builtin_cpu_supports("avx2")) {
		k->isa = "avx2";
		k->dotn = dotn_avx2;
		k->axpyn = axpyn_avx2;
	}
#else
	(void)allow_simd;
#endif
}
