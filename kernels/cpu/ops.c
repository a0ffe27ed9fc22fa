/*
 * kernels/cpu/ops.c — conversions, activation quantization and row dot
 * products for the CPU backend, in portable C and in AVX2/FMA/F16C.
 *
 * Block formats (ggml's, as stored in GGUF), 32 elements per block:
 *   q4_0: f16 d, 16 bytes of nibbles; x = (q - 8) * d
 *   q4_1: f16 d, f16 m, 16 bytes of nibbles; x = q * d + m
 *   q8_0: f16 d, 32 int8; x = q * d
 * Nibble j of byte i: low nibble is element i, high nibble element i + 16.
 */
#include "ops.h"
#include "vexp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

struct blk_q4_0 {
	uint16_t d;
	uint8_t qs[QK / 2];
};
struct blk_q4_1 {
	uint16_t d, m;
	uint8_t qs[QK / 2];
};
struct blk_q8_0 {
	uint16_t d;
	int8_t qs[QK];
};
_Static_assert(sizeof(struct blk_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct blk_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(struct blk_q8_0) == 34, "q8_0 block");

/* q5_0: f16 d, 4 bytes qh, 16 bytes of nibbles; element j (j < 16) is the
 * low nibble of byte j with bit j of qh as its fifth bit, element 16 + j
 * the high nibble with bit 16 + j; value = (q - 16) * d.
 * q5_1: f16 d, f16 m, then the same; value = q * d + m. */
struct blk_q5_0 {
	uint16_t d;
	uint8_t qh[4];
	uint8_t qs[QK / 2];
};
struct blk_q5_1 {
	uint16_t d, m;
	uint8_t qh[4];
	uint8_t qs[QK / 2];
};
_Static_assert(sizeof(struct blk_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(struct blk_q5_1) == 24, "q5_1 block");

void cpu_q5_block_quants(const uint8_t qh4[4], const uint8_t *qs, uint8_t q[QK])
{
	uint32_t qh;
	memcpy(&qh, qh4, 4);
	for (int j = 0; j < QK / 2; j++) {
		q[j] = (uint8_t)((qs[j] & 0xf) | (((qh >> j) & 1) << 4));
		q[j + QK / 2] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + QK / 2)) & 1) << 4));
	}
}

/*
 * K-quants: super-blocks of QK_K = 256 elements (ggml-common.h layouts).
 *   q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for eight
 *         sub-blocks of 32, 128 bytes of nibbles; value = d*sc*q - dmin*m.
 *         Sub-blocks 2i and 2i+1 are the low and high nibbles of bytes
 *         32i .. 32i+31.
 *   q5_K: as q4_K with 32 bytes qh between scales and nibbles: bit 2i of
 *         qh[l] is the fifth bit of element l of sub-block 2i, bit 2i+1
 *         that of element l of sub-block 2i+1.
 *   q6_K: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8
 *         scales for sub-blocks of 16, f16 d; value = d*sc*(q - 32). Each
 *         half of 128 elements takes ql[0..63] and qh[0..31]: elements
 *         l, l+32, l+64, l+96 (l < 32) are ql[l] low, ql[l+32] low, ql[l]
 *         high, ql[l+32] high nibbles with qh[l] bits 0-1, 2-3, 4-5, 6-7.
 * kq_unpack turns one super-block into element-order integer quants and
 * float scales, the one place these layouts are read; dequantization and
 * the dot products both go through it.
 */
#define QK_K 256
struct blk_q4_K {
	uint16_t d, dmin;
	uint8_t scales[12];
	uint8_t qs[QK_K / 2];
};
struct blk_q5_K {
	uint16_t d, dmin;
	uint8_t scales[12];
	uint8_t qh[QK_K / 8];
	uint8_t qs[QK_K / 2];
};
struct blk_q6_K {
	uint8_t ql[QK_K / 2];
	uint8_t qh[QK_K / 4];
	int8_t scales[QK_K / 16];
	uint16_t d;
};
_Static_assert(sizeof(struct blk_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(struct blk_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(struct blk_q6_K) == 210, "q6_K block");

/* q4_K/q5_K: value = scale[j] * q - min[j] over sub-blocks of 32;
 * q6_K: value = scale[j] * q over sub-blocks of 16 (min unused). */
struct kq_unpacked {
	int8_t q[QK_K];
	float scale[QK_K / 16];
	float min[QK_K / 32];
};

/* sub-block j's 6-bit scale and min from the 12 packed bytes */
static void kq_scale_min(const uint8_t *q, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

void kq_block_ints(enum kvd_wtype t, const void *blk, uint8_t q[QK_K], uint8_t sc[16], uint8_t mn[8], uint16_t *d,
		   uint16_t *dmin)
{
	if (t == KVD_WTYPE_Q6_K) {
		const struct blk_q6_K *b = blk;
		for (int h = 0; h < 2; h++) {
			const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
			uint8_t *qq = q + 128 * h;
			for (int l = 0; l < 32; l++) {
				qq[l] = (uint8_t)((ql[l] & 0xf) | ((qh[l] & 3) << 4));
				qq[l + 32] = (uint8_t)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4));
				qq[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
				qq[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
			}
		}
		memcpy(sc, b->scales, QK_K / 16);
		memset(mn, 0, QK_K / 32);
		*d = b->d;
		*dmin = 0;
		return;
	}
	/* q4_K and q5_K share the head */
	const struct blk_q4_K *b4 = blk;
	const struct blk_q5_K *b5 = blk;
	const uint8_t *qs = t == KVD_WTYPE_Q5_K ? b5->qs : b4->qs;
	for (int j = 0; j < QK_K / 32; j++) {
		int s, m, shift = (j & 1) * 4;
		const uint8_t *src = qs + 32 * (j / 2);
		kq_scale_min(b4->scales, j, &s, &m);
		sc[j] = (uint8_t)s;
		mn[j] = (uint8_t)m;
		for (int l = 0; l < 32; l++) {
			int v = (src[l] >> shift) & 0xf;
			if (t == KVD_WTYPE_Q5_K)
				v |= ((b5->qh[l] >> j) & 1) << 4;
			q[32 * j + l] = (uint8_t)v;
		}
	}
	memset(sc + QK_K / 32, 0, QK_K / 32);
	*d = b4->d;
	*dmin = b4->dmin;
}

static void kq_unpack(enum kvd_wtype t, const void *blk, struct kq_unpacked *u)
{
	uint8_t q[QK_K], sc[16], mn[8];
	uint16_t dh, dminh;
	kq_block_ints(t, blk, q, sc, mn, &dh, &dminh);
	float d = cpu_fp16_to_f32(dh), dmin = cpu_fp16_to_f32(dminh);
	if (t == KVD_WTYPE_Q6_K) {
		for (int i = 0; i < QK_K; i++)
			u->q[i] = (int8_t)(q[i] - 32);
		for (int j = 0; j < QK_K / 16; j++)
			u->scale[j] = d * (float)(int8_t)sc[j];
		return;
	}
	for (int i = 0; i < QK_K; i++)
		u->q[i] = (int8_t)q[i];
	for (int j = 0; j < QK_K / 32; j++) {
		u->scale[j] = d * (float)sc[j];
		u->min[j] = dmin * (float)mn[j];
	}
}

static size_t kq_block_bytes(enum kvd_wtype t)
{
	return t == KVD_WTYPE_Q4_K ? sizeof(struct blk_q4_K)
	       : t == KVD_WTYPE_Q5_K ? sizeof(struct blk_q5_K) : sizeof(struct blk_q6_K);
}

static void kq_dequantize(enum kvd_wtype t, const void *src, float *dst, int64_t n)
{
	struct kq_unpacked u;
	for (int64_t b = 0; b < n / QK_K; b++) {
		kq_unpack(t, (const char *)src + (size_t)b * kq_block_bytes(t), &u);
		float *y = dst + b * QK_K;
		if (t == KVD_WTYPE_Q6_K)
			for (int i = 0; i < QK_K; i++)
				y[i] = u.scale[i / 16] * (float)u.q[i];
		else
			for (int i = 0; i < QK_K; i++)
				y[i] = u.scale[i / 32] * (float)u.q[i] - u.min[i / 32];
	}
}

/* Against q8 activations (blocks of 32): exact int32 sums per sub-block,
 * scaled once per sub-block. */
static float kq_dot(enum kvd_wtype t, const void *w, const struct q8_block *xq, int64_t n)
{
	struct kq_unpacked u;
	float acc = 0;
	for (int64_t b = 0; b < n / QK_K; b++) {
		kq_unpack(t, (const char *)w + (size_t)b * kq_block_bytes(t), &u);
		const struct q8_block *x = xq + b * (QK_K / QK);
		for (int j = 0; j < QK_K / QK; j++) {
			int s0 = 0, s1 = 0;
			for (int i = 0; i < 16; i++) {
				s0 += u.q[32 * j + i] * x[j].q[i];
				s1 += u.q[32 * j + 16 + i] * x[j].q[16 + i];
			}
			if (t == KVD_WTYPE_Q6_K)
				acc += x[j].d * (u.scale[2 * j] * (float)s0 + u.scale[2 * j + 1] * (float)s1);
			else
				acc += u.scale[j] * x[j].d * (float)(s0 + s1) - u.min[j] * x[j].s;
		}
	}
	return acc;
}

/* ---- conversions ------------------------------------------------------- */

float cpu_fp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t bits;
	float f;

	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else { /* subnormal: normalise */
			int e = -1;
			do {
				e++;
				man <<= 1;
			} while (!(man & 0x400));
			man &= 0x3ff;
			bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
		}
	} else if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t cpu_f32_to_fp16(float f)
{
	uint32_t x;
	uint32_t sign, exp, man;

	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000;
	exp = (x >> 23) & 0xff;
	man = x & 0x7fffff;
	if (exp == 0xff) /* inf or nan */
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
	int32_t e = (int32_t)exp - 127 + 15;
	if (e >= 0x1f)
		return (uint16_t)(sign | 0x7c00);
	if (e <= 0) { /* subnormal or zero in half */
		if (e < -10)
			return (uint16_t)sign;
		man |= 0x800000;
		uint32_t shift = (uint32_t)(14 - e);
		uint32_t half = man >> shift;
		uint32_t rem = man & ((1u << shift) - 1);
		uint32_t mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
	uint32_t rem = man & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
		half++; /* may carry into the exponent, which is correct */
	return (uint16_t)half;
}

float cpu_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

void cpu_dequantize_row(enum kvd_wtype t, const void *src, float *dst, int64_t n)
{
	int64_t i, b;

	switch (t) {
	case KVD_WTYPE_F32:
		memcpy(dst, src, (size_t)n * 4);
		break;
	case KVD_WTYPE_F16: {
		const uint16_t *s = src;
		for (i = 0; i < n; i++)
			dst[i] = cpu_fp16_to_f32(s[i]);
		break;
	}
	case KVD_WTYPE_BF16: {
		const uint16_t *s = src;
		for (i = 0; i < n; i++)
			dst[i] = cpu_bf16_to_f32(s[i]);
		break;
	}
	case KVD_WTYPE_Q4_0: {
		const struct blk_q4_0 *s = src;
		for (b = 0; b < n / QK; b++) {
			float d = cpu_fp16_to_f32(s[b].d);
			for (i = 0; i < QK / 2; i++) {
				dst[b * QK + i] = ((s[b].qs[i] & 0xf) - 8) * d;
				dst[b * QK + i + QK / 2] = ((s[b].qs[i] >> 4) - 8) * d;
			}
		}
		break;
	}
	case KVD_WTYPE_Q4_1: {
		const struct blk_q4_1 *s = src;
		for (b = 0; b < n / QK; b++) {
			float d = cpu_fp16_to_f32(s[b].d), m = cpu_fp16_to_f32(s[b].m);
			for (i = 0; i < QK / 2; i++) {
				dst[b * QK + i] = (s[b].qs[i] & 0xf) * d + m;
				dst[b * QK + i + QK / 2] = (s[b].qs[i] >> 4) * d + m;
			}
		}
		break;
	}
	case KVD_WTYPE_Q8_0: {
		const struct blk_q8_0 *s = src;
		for (b = 0; b < n / QK; b++) {
			float d = cpu_fp16_to_f32(s[b].d);
			for (i = 0; i < QK; i++)
				dst[b * QK + i] = s[b].qs[i] * d;
		}
		break;
	}
	case KVD_WTYPE_Q5_0: {
		const struct blk_q5_0 *s = src;
		uint8_t q[QK];
		for (b = 0; b < n / QK; b++) {
			float d = cpu_fp16_to_f32(s[b].d);
			cpu_q5_block_quants(s[b].qh, s[b].qs, q);
			for (i = 0; i < QK; i++)
				dst[b * QK + i] = ((int)q[i] - 16) * d;
		}
		break;
	}
	case KVD_WTYPE_Q5_1: {
		const struct blk_q5_1 *s = src;
		uint8_t q[QK];
		for (b = 0; b < n / QK; b++) {
			float d = cpu_fp16_to_f32(s[b].d), m = cpu_fp16_to_f32(s[b].m);
			cpu_q5_block_quants(s[b].qh, s[b].qs, q);
			for (i = 0; i < QK; i++)
				dst[b * QK + i] = q[i] * d + m;
		}
		break;
	}
	case KVD_WTYPE_Q4_K:
	case KVD_WTYPE_Q5_K:
	case KVD_WTYPE_Q6_K:
		kq_dequantize(t, src, dst, n);
		break;
	}
}

/* ---- portable versions ------------------------------------------------- */

static void quantize_q8_generic(const float *x, struct q8_block *y, int64_t n)
{
	for (int64_t b = 0; b < n / QK; b++) {
		const float *xb = x + b * QK;
		float amax = 0;
		int sum = 0, half = 0;
		for (int i = 0; i < QK; i++)
			amax = fmaxf(amax, fabsf(xb[i]));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		for (int i = 0; i < QK; i++) {
			int q = (int)nearbyintf(xb[i] * id);
			y[b].q[i] = (int8_t)q;
			sum += q;
			if (i == QK / 2 - 1)
				half = sum;
		}
		y[b].d = d;
		y[b].s = d * (float)sum;
		((int32_t *)(void *)(y + n / QK))[b] = sum;
		((int32_t *)(void *)(y + n / QK))[n / QK + b] = half;
	}
}

static float dot_f32_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const float *a = w;
	float acc = 0;
	(void)xq;
	for (int64_t i = 0; i < n; i++)
		acc += a[i] * x[i];
	return acc;
}

static float dot_f16_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const uint16_t *a = w;
	float acc = 0;
	(void)xq;
	for (int64_t i = 0; i < n; i++)
		acc += cpu_fp16_to_f32(a[i]) * x[i];
	return acc;
}

static float dot_bf16_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const uint16_t *a = w;
	float acc = 0;
	(void)xq;
	for (int64_t i = 0; i < n; i++)
		acc += cpu_bf16_to_f32(a[i]) * x[i];
	return acc;
}

static float dot_q4_0_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q4_0 *a = w;
	float acc = 0;
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		int s = 0;
		for (int i = 0; i < QK / 2; i++) {
			s += ((a[b].qs[i] & 0xf) - 8) * xq[b].q[i];
			s += ((a[b].qs[i] >> 4) - 8) * xq[b].q[i + QK / 2];
		}
		acc += cpu_fp16_to_f32(a[b].d) * xq[b].d * (float)s;
	}
	return acc;
}

static float dot_q4_1_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q4_1 *a = w;
	float acc = 0, summs = 0;
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		int s = 0;
		for (int i = 0; i < QK / 2; i++) {
			s += (a[b].qs[i] & 0xf) * xq[b].q[i];
			s += (a[b].qs[i] >> 4) * xq[b].q[i + QK / 2];
		}
		acc += cpu_fp16_to_f32(a[b].d) * xq[b].d * (float)s;
		summs += cpu_fp16_to_f32(a[b].m) * xq[b].s;
	}
	return acc + summs;
}

static float dot_q5_0_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q5_0 *a = w;
	uint8_t q[QK];
	float acc = 0;
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		int s = 0;
		cpu_q5_block_quants(a[b].qh, a[b].qs, q);
		for (int i = 0; i < QK; i++)
			s += ((int)q[i] - 16) * xq[b].q[i];
		acc += cpu_fp16_to_f32(a[b].d) * xq[b].d * (float)s;
	}
	return acc;
}

static float dot_q5_1_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q5_1 *a = w;
	uint8_t q[QK];
	float acc = 0, summs = 0;
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		int s = 0;
		cpu_q5_block_quants(a[b].qh, a[b].qs, q);
		for (int i = 0; i < QK; i++)
			s += q[i] * xq[b].q[i];
		acc += cpu_fp16_to_f32(a[b].d) * xq[b].d * (float)s;
		summs += cpu_fp16_to_f32(a[b].m) * xq[b].s;
	}
	return acc + summs;
}

static float dot_q4_K_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	(void)x;
	return kq_dot(KVD_WTYPE_Q4_K, w, xq, n);
}

static float dot_q5_K_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	(void)x;
	return kq_dot(KVD_WTYPE_Q5_K, w, xq, n);
}

static float dot_q6_K_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	(void)x;
	return kq_dot(KVD_WTYPE_Q6_K, w, xq, n);
}

static float dot_q8_0_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q8_0 *a = w;
	float acc = 0;
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		int s = 0;
		for (int i = 0; i < QK; i++)
			s += a[b].qs[i] * xq[b].q[i];
		acc += cpu_fp16_to_f32(a[b].d) * xq[b].d * (float)s;
	}
	return acc;
}

static float dot_f32_f16_generic(const float *q, const uint16_t *k, int n)
{
	float acc = 0;
	for (int i = 0; i < n; i++)
		acc += q[i] * cpu_fp16_to_f32(k[i]);
	return acc;
}

static void axpy_f16_generic(float *y, float a, const uint16_t *v, int n)
{
	for (int i = 0; i < n; i++)
		y[i] += a * cpu_fp16_to_f32(v[i]);
}

static void dot4_f32_f16_generic(const float *q, const uint16_t *const k[4], int n, float out[4])
{
	for (int j = 0; j < 4; j++)
		out[j] = dot_f32_f16_generic(q, k[j], n);
}

static void axpyn_f16_generic(float *y, int ldy, const float *a, int nr, const uint16_t *v, int n)
{
	for (int r = 0; r < nr; r++)
		axpy_f16_generic(y + (size_t)r * ldy, a[r], v, n);
}

static void swiglu_generic(float *g, const float *u, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* 0.5 x (1 + tanh(z)) = x sigmoid(2 z) = x / (1 + exp(-2 z)) */
#define GELU_2K 1.5957691216f /* 2 sqrt(2 / pi) */
#define GELU_C 0.044715f

static void geglu_generic(float *g, const float *u, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		float x = g[i];
		float y = GELU_2K * (x + GELU_C * x * x * x);
		g[i] = x / (1.0f + expf(-y)) * u[i];
	}
}

static void store_f16_generic(uint16_t *dst, const float *src, int n)
{
	for (int i = 0; i < n; i++)
		dst[i] = cpu_f32_to_fp16(src[i]);
}

/* ---- AVX2 / FMA / F16C ------------------------------------------------- */

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* VEX-encoded half -> float: calling the portable converter (SSE code)
 * from AVX code would pay for AVX/SSE state transitions on every block. */
AVX2 static inline float h2f(uint16_t h)
{
	return _cvtsh_ss(h);
}

AVX2 static inline float hsum_ps(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
	lo = _mm_add_ps(lo, hi);
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles in lanes 0..15, high in 16..31. */
AVX2 static inline __m256i nibbles_32(const uint8_t *qs)
{
	__m128i t = _mm_loadu_si128((const __m128i *)qs);
	__m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
	return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

/* Sum of products of unsigned bytes a and signed bytes b, as 8 floats. */
AVX2 static inline __m256 mul_sum_us8(__m256i a, __m256i b)
{
	__m256i p16 = _mm256_maddubs_epi16(a, b);
	__m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
	return _mm256_cvtepi32_ps(p32);
}

/* Signed x signed, via |a| and sign-transferred b (no -128 in quants). */
AVX2 static inline __m256 mul_sum_i8(__m256i a, __m256i b)
{
	return mul_sum_us8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

AVX2 static void quantize_q8_avx2(const float *x, struct q8_block *y, int64_t n)
{
	const __m256 signbit = _mm256_set1_ps(-0.0f);
	for (int64_t b = 0; b < n / QK; b++) {
		const float *xb = x + b * QK;
		__m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
		__m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
		__m256 m = _mm256_andnot_ps(signbit, v0);
		m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, v1));
		m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, v2));
		m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, v3));
		__m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
		m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
		m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
		float amax = _mm_cvtss_f32(m4);
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		__m256 mul = _mm256_set1_ps(id);
		const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
		__m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), rnd));
		__m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), rnd));
		__m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), rnd));
		__m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), rnd));
		__m256i h01 = _mm256_add_epi32(i0, i1);
		__m256i sum = _mm256_add_epi32(h01, _mm256_add_epi32(i2, i3));
		__m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
		s4 = _mm_hadd_epi32(s4, s4);
		s4 = _mm_hadd_epi32(s4, s4);
		__m128i h4 = _mm_add_epi32(_mm256_castsi256_si128(h01), _mm256_extracti128_si256(h01, 1));
		h4 = _mm_hadd_epi32(h4, h4);
		h4 = _mm_hadd_epi32(h4, h4);
		/* pack to int8 in element order */
		i0 = _mm256_packs_epi32(i0, i1);
		i2 = _mm256_packs_epi32(i2, i3);
		i0 = _mm256_packs_epi16(i0, i2);
		i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
		_mm256_storeu_si256((__m256i *)y[b].q, i0);
		int isum = _mm_cvtsi128_si32(s4);
		y[b].d = d;
		y[b].s = d * (float)isum;
		((int32_t *)(void *)(y + n / QK))[b] = isum;
		((int32_t *)(void *)(y + n / QK))[n / QK + b] = _mm_cvtsi128_si32(h4);
	}
}

AVX2 static float dot_q4_0_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q4_0 *a = w;
	__m256 acc = _mm256_setzero_ps();
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		__m256 d = _mm256_set1_ps(h2f(a[b].d) * xq[b].d);
		__m256i qx = _mm256_sub_epi8(nibbles_32(a[b].qs), _mm256_set1_epi8(8));
		__m256i qy = _mm256_loadu_si256((const __m256i *)xq[b].q);
		acc = _mm256_fmadd_ps(d, mul_sum_i8(qx, qy), acc);
	}
	return hsum_ps(acc);
}

AVX2 static float dot_q4_1_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q4_1 *a = w;
	__m256 acc = _mm256_setzero_ps();
	float summs = 0;
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		summs += h2f(a[b].m) * xq[b].s;
		__m256 d = _mm256_set1_ps(h2f(a[b].d) * xq[b].d);
		__m256i qx = nibbles_32(a[b].qs);
		__m256i qy = _mm256_loadu_si256((const __m256i *)xq[b].q);
		acc = _mm256_fmadd_ps(d, mul_sum_us8(qx, qy), acc);
	}
	return hsum_ps(acc) + summs;
}

AVX2 static inline int hsum_epi32_128(__m128i v)
{
	v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
	v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 1));
	return _mm_cvtsi128_si32(v);
}

/* The K-quant dots below form the same exact integer sums as kq_dot and
 * then the same float operations in the same order, so their results are
 * bit-identical to the portable ones. */
/* q4_K (five = 0) and q5_K (five = 1) */
AVX2 static inline __attribute__((always_inline)) float dot_q45_K_avx2(const void *w, const struct q8_block *xq,
									int64_t n, const int five)
{
	const size_t bb = five ? sizeof(struct blk_q5_K) : sizeof(struct blk_q4_K);
	const __m256i lo4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
	float acc = 0;
	for (int64_t b = 0; b < n / QK_K; b++) {
		const struct blk_q4_K *a = (const struct blk_q4_K *)(const void *)((const char *)w + (size_t)b * bb);
		const struct blk_q5_K *a5 = (const struct blk_q5_K *)(const void *)a;
		const uint8_t *qs = five ? a5->qs : a->qs;
		float d = h2f(a->d), dmin = h2f(a->dmin);
		const struct q8_block *xb = xq + b * (QK_K / QK);
		__m256i qh = five ? _mm256_loadu_si256((const __m256i *)a5->qh) : _mm256_setzero_si256();
		for (int i = 0; i < 4; i++) {
			__m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
			__m256i q[2] = {_mm256_and_si256(raw, lo4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4)};
			for (int h = 0; h < 2; h++) {
				int j = 2 * i + h, sc, m;
				__m256i qj = q[h];
				if (five) /* bit j of each qh byte is the fifth bit */
					qj = _mm256_or_si256(qj, _mm256_slli_epi16(_mm256_and_si256(
						_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), one), 4));
				kq_scale_min(a->scales, j, &sc, &m);
				__m256i p = _mm256_madd_epi16(
					_mm256_maddubs_epi16(qj, _mm256_loadu_si256((const __m256i *)xb[j].q)), ones);
				int si = hsum_epi32_128(_mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
				float scale = d * (float)sc, mn = dmin * (float)m;
				acc += scale * xb[j].d * (float)si - mn * xb[j].s;
			}
		}
	}
	return acc;
}

AVX2 static float dot_q4_K_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	(void)x;
	return dot_q45_K_avx2(w, xq, n, 0);
}

AVX2 static float dot_q5_K_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	(void)x;
	return dot_q45_K_avx2(w, xq, n, 1);
}

AVX2 static float dot_q6_K_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q6_K *a = w;
	const __m256i lo4 = _mm256_set1_epi8(0x0f), lo2 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
	const __m256i k32 = _mm256_set1_epi8(32);
	float acc = 0;
	(void)x;
	for (int64_t b = 0; b < n / QK_K; b++) {
		float d = h2f(a[b].d);
		const struct q8_block *xb = xq + b * (QK_K / QK);
		for (int h = 0; h < 2; h++) {
			__m256i ql0 = _mm256_loadu_si256((const __m256i *)(a[b].ql + 64 * h));
			__m256i ql1 = _mm256_loadu_si256((const __m256i *)(a[b].ql + 64 * h + 32));
			__m256i qh = _mm256_loadu_si256((const __m256i *)(a[b].qh + 32 * h));
			/* elements 32k .. 32k+31 of this half, unsigned (q + 32) */
			__m256i e[4] = {
				_mm256_or_si256(_mm256_and_si256(ql0, lo4), _mm256_slli_epi16(_mm256_and_si256(qh, lo2), 4)),
				_mm256_or_si256(_mm256_and_si256(ql1, lo4),
						_mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), lo2), 4)),
				_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), lo4),
						_mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), lo2), 4)),
				_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), lo4),
						_mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), lo2), 4)),
			};
			for (int k = 0; k < 4; k++) {
				int j = 4 * h + k;
				__m256i xv = _mm256_loadu_si256((const __m256i *)xb[j].q);
				__m256i p = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(e[k], xv), ones),
							     _mm256_madd_epi16(_mm256_maddubs_epi16(k32, xv), ones));
				int s0 = hsum_epi32_128(_mm256_castsi256_si128(p));
				int s1 = hsum_epi32_128(_mm256_extracti128_si256(p, 1));
				float sc0 = d * (float)a[b].scales[2 * j], sc1 = d * (float)a[b].scales[2 * j + 1];
				acc += xb[j].d * (sc0 * (float)s0 + sc1 * (float)s1);
			}
		}
	}
	return acc;
}

AVX2 static float dot_q8_0_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const struct blk_q8_0 *a = w;
	__m256 acc = _mm256_setzero_ps();
	(void)x;
	for (int64_t b = 0; b < n / QK; b++) {
		__m256 d = _mm256_set1_ps(h2f(a[b].d) * xq[b].d);
		__m256i qx = _mm256_loadu_si256((const __m256i *)a[b].qs);
		__m256i qy = _mm256_loadu_si256((const __m256i *)xq[b].q);
		acc = _mm256_fmadd_ps(d, mul_sum_i8(qx, qy), acc);
	}
	return hsum_ps(acc);
}

AVX2 static float dot_f32_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const float *a = w;
	__m256 acc = _mm256_setzero_ps();
	int64_t i = 0;
	(void)xq;
	for (; i + 8 <= n; i += 8)
		acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc);
	float s = hsum_ps(acc);
	for (; i < n; i++)
		s += a[i] * x[i];
	return s;
}

AVX2 static float dot_f16_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const uint16_t *a = w;
	__m256 acc = _mm256_setzero_ps();
	int64_t i = 0;
	(void)xq;
	for (; i + 8 <= n; i += 8) {
		__m256 wa = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
		acc = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x + i), acc);
	}
	float s = hsum_ps(acc);
	for (; i < n; i++)
		s += h2f(a[i]) * x[i];
	return s;
}

AVX2 static float dot_bf16_avx2(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	const uint16_t *a = w;
	__m256 acc = _mm256_setzero_ps();
	int64_t i = 0;
	(void)xq;
	for (; i + 8 <= n; i += 8) {
		__m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(a + i)));
		__m256 wa = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
		acc = _mm256_fmadd_ps(wa, _mm256_loadu_ps(x + i), acc);
	}
	float s = hsum_ps(acc);
	for (; i < n; i++)
		s += cpu_bf16_to_f32(a[i]) * x[i];
	return s;
}

AVX2 static float dot_f32_f16_avx2(const float *q, const uint16_t *k, int n)
{
	__m256 acc = _mm256_setzero_ps();
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
		acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, acc);
	}
	float s = hsum_ps(acc);
	for (; i < n; i++)
		s += q[i] * h2f(k[i]);
	return s;
}

AVX2 static void axpy_f16_avx2(float *y, float a, const uint16_t *v, int n)
{
	__m256 av = _mm256_set1_ps(a);
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, vv, _mm256_loadu_ps(y + i)));
	}
	for (; i < n; i++)
		y[i] += a * h2f(v[i]);
}

AVX2 static void dot4_f32_f16_avx2(const float *q, const uint16_t *const k[4], int n, float out[4])
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 qv = _mm256_loadu_ps(q + i);
		a0 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[0] + i))), a0);
		a1 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[1] + i))), a1);
		a2 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[2] + i))), a2);
		a3 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[3] + i))), a3);
	}
	/* reduce the four accumulators together: (a0+a1 pairs, a2+a3 pairs) */
	__m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
	__m256 h = _mm256_hadd_ps(h01, h23);
	__m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
	_mm_storeu_ps(out, r);
	for (; i < n; i++)
		for (int j = 0; j < 4; j++)
			out[j] += q[i] * h2f(k[j][i]);
}

AVX2 static void axpyn_f16_avx2(float *y, int ldy, const float *a, int nr, const uint16_t *v, int n)
{
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
		for (int r = 0; r < nr; r++) {
			float *yr = y + (size_t)r * ldy + i;
			_mm256_storeu_ps(yr, _mm256_fmadd_ps(_mm256_set1_ps(a[r]), vv, _mm256_loadu_ps(yr)));
		}
	}
	for (; i < n; i++)
		for (int r = 0; r < nr; r++)
			y[(size_t)r * ldy + i] += a[r] * h2f(v[i]);
}

/* silu(g) = g / (1 + exp(-g)), from e = exp(-|g|) only:
 * g / (1 + e) for g >= 0, g * e / (1 + e) below */
AVX2 static void swiglu_avx2(float *g, const float *u, int64_t n)
{
	const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(g + i);
		__m256 e = exp_neg8(_mm256_or_ps(x, sign));
		__m256 num = _mm256_blendv_ps(one, e, x); /* sign bit of x selects e */
		__m256 s = _mm256_div_ps(num, _mm256_add_ps(one, e));
		_mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(u + i)));
	}
	swiglu_generic(g + i, u + i, n - i);
}

/* GeGLU as sigmoid(y), y = 2 z, from e = exp(-|y|) as swiglu_avx2 does */
AVX2 static void geglu_avx2(float *g, const float *u, int64_t n)
{
	const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
	const __m256 k2 = _mm256_set1_ps(GELU_2K), c = _mm256_set1_ps(GELU_C);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(g + i);
		__m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
		__m256 y = _mm256_mul_ps(k2, _mm256_fmadd_ps(c, x3, x));
		__m256 e = exp_neg8(_mm256_or_ps(y, sign));
		__m256 num = _mm256_blendv_ps(one, e, y); /* sign bit of y selects e */
		__m256 s = _mm256_div_ps(num, _mm256_add_ps(one, e));
		_mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(u + i)));
	}
	geglu_generic(g + i, u + i, n - i);
}

AVX2 static void store_f16_avx2(uint16_t *dst, const float *src, int n)
{
	int i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		dst[i] = cpu_f32_to_fp16(src[i]);
}
#endif /* __x86_64__ */

void cpu_kernels_init(struct cpu_kernels *k, int force_generic)
{
	memset(k, 0, sizeof(*k));
	k->isa = "generic";
	k->dot[KVD_WTYPE_F32] = dot_f32_generic;
	k->dot[KVD_WTYPE_F16] = dot_f16_generic;
	k->dot[KVD_WTYPE_BF16] = dot_bf16_generic;
	k->dot[KVD_WTYPE_Q4_0] = dot_q4_0_generic;
	k->dot[KVD_WTYPE_Q4_1] = dot_q4_1_generic;
	k->dot[KVD_WTYPE_Q8_0] = dot_q8_0_generic;
	k->dot[KVD_WTYPE_Q5_0] = dot_q5_0_generic;
	k->dot[KVD_WTYPE_Q5_1] = dot_q5_1_generic;
	/* K-quants: the portable code on every CPU */
	k->dot[KVD_WTYPE_Q4_K] = dot_q4_K_generic;
	k->dot[KVD_WTYPE_Q5_K] = dot_q5_K_generic;
	k->dot[KVD_WTYPE_Q6_K] = dot_q6_K_generic;
	k->quantize_q8 = quantize_q8_generic;
	k->dot_f32_f16 = dot_f32_f16_generic;
	k->axpy_f16 = axpy_f16_generic;
	k->dot4_f32_f16 = dot4_f32_f16_generic;
	k->axpyn_f16 = axpyn_f16_generic;
	k->store_f16 = store_f16_generic;
	k->swiglu = swiglu_generic;
	k->geglu = geglu_generic;
#if defined(__x86_64__)
	if (!force_generic && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("f16c")) {
		k->isa = "avx2";
		k->dot[KVD_WTYPE_F32] = dot_f32_avx2;
		k->dot[KVD_WTYPE_F16] = dot_f16_avx2;
		k->dot[KVD_WTYPE_BF16] = dot_bf16_avx2;
		k->dot[KVD_WTYPE_Q4_0] = dot_q4_0_avx2;
		k->dot[KVD_WTYPE_Q4_1] = dot_q4_1_avx2;
		k->dot[KVD_WTYPE_Q8_0] = dot_q8_0_avx2;
		k->dot[KVD_WTYPE_Q4_K] = dot_q4_K_avx2;
		k->dot[KVD_WTYPE_Q5_K] = dot_q5_K_avx2;
		k->dot[KVD_WTYPE_Q6_K] = dot_q6_K_avx2;
		k->quantize_q8 = quantize_q8_avx2;
		k->dot_f32_f16 = dot_f32_f16_avx2;
		k->axpy_f16 = axpy_f16_avx2;
		k->dot4_f32_f16 = dot4_f32_f16_avx2;
		k->axpyn_f16 = axpyn_f16_avx2;
		k->store_f16 = store_f16_avx2;
		k->swiglu = swiglu_avx2;
		k->geglu = geglu_avx2;
		/* the tiled AVX-512 VNNI kernels, where the CPU has them */
		if (!getenv("KVD_CPU_NO_AVX512") && cpu_kernels_init_gemm_avx512(k)) {
			k->attn_rows_for = cpu_attn_rows_avx512;
		} else {
			cpu_kernels_init_gemm_avx2(k);
			k->attn_rows_for = cpu_attn_rows_avx2;
		}
	}
#endif
}
