/*
 * kernels/cpu/ops.c — conversions, activation quantization and row dot
 * products for the CPU backend in portable C, and the choice of kernels
 * for the CPU at hand (the AVX2/FMA/F16C versions are in ops_avx2.c).
 *
 * Block formats (ggml's, as stored in GGUF), 32 elements per block:
 *   q4_0: f16 d, 16 bytes of nibbles; x = (q - 8) * d
 *   q4_1: f16 d, f16 m, 16 bytes of nibbles; x = q * d + m
 *   q8_0: f16 d, 32 int8; x = q * d
 * Nibble j of byte i: low nibble is element i, high nibble element i + 16.
 */
#include "blocks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
/* q4_K/q5_K: value = scale[j] * q - min[j] over sub-blocks of 32;
 * q6_K: value = scale[j] * q over sub-blocks of 16 (min unused). */
struct kq_unpacked {
	int8_t q[QK_K];
	float scale[QK_K / 16];
	float min[QK_K / 32];
};

/* sub-block j's 6-bit scale and min from the 12 packed bytes */
void cpu_kq_scale_min(const uint8_t *q, int j, int *sc, int *m)
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
		cpu_kq_scale_min(b4->scales, j, &s, &m);
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
float cpu_kq_dot(enum kvd_wtype t, const void *w, const struct q8_block *xq, int64_t n)
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

uint16_t cpu_f32_to_bf16(float f)
{
	uint32_t bits;
	memcpy(&bits, &f, 4);
	if ((bits & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((bits >> 16) | 0x40u);
	return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
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

/* Block b of a row of nb blocks (xb its 32 floats) with scale d and
 * inverse id. */
static void q8_block_of(const float *xb, float d, float id, struct q8_block *y, int64_t b, int64_t nb)
{
	int sum = 0, half = 0;
	for (int i = 0; i < QK; i++) {
		int q = (int)nearbyintf(xb[i] * id);
		y[b].q[i] = (int8_t)q;
		sum += q;
		if (i == QK / 2 - 1)
			half = sum;
	}
	y[b].d = d;
	y[b].s = d * (float)sum;
	((int32_t *)(void *)(y + nb))[b] = sum;
	((int32_t *)(void *)(y + nb))[nb + b] = half;
}

/* quantize_q8 (span 32) and quantize_q8k (span 256): one scale per span */
static void quantize_span_generic(const float *x, struct q8_block *y, int64_t n, int64_t span)
{
	for (int64_t s0 = 0; s0 < n / QK * QK; s0 += span) {
		int64_t e = s0 + span < n / QK * QK ? s0 + span : n / QK * QK;
		float amax = 0;
		for (int64_t i = s0; i < e; i++)
			amax = fmaxf(amax, fabsf(x[i]));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		for (int64_t b = s0 / QK; b < e / QK; b++)
			q8_block_of(x + b * QK, d, id, y, b, n / QK);
	}
}

static void quantize_q8_generic(const float *x, struct q8_block *y, int64_t n)
{
	quantize_span_generic(x, y, n, QK);
}

static void quantize_q8k_generic(const float *x, struct q8_block *y, int64_t n)
{
	quantize_span_generic(x, y, n, 256);
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
	return cpu_kq_dot(KVD_WTYPE_Q4_K, w, xq, n);
}

static float dot_q5_K_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	(void)x;
	return cpu_kq_dot(KVD_WTYPE_Q5_K, w, xq, n);
}

static float dot_q6_K_generic(const void *w, const float *x, const struct q8_block *xq, int64_t n)
{
	(void)x;
	return cpu_kq_dot(KVD_WTYPE_Q6_K, w, xq, n);
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

void cpu_swiglu_generic(float *g, const float *u, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* 0.5 x (1 + tanh(z)) = x sigmoid(2 z) = x / (1 + exp(-2 z)) */

void cpu_geglu_generic(float *g, const float *u, int64_t n)
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


/* RMS norm (struct cpu_kernels): plain C, in the order every vector
 * version follows; no reassociation by the compiler. */
void cpu_rmsnorm_generic(float *dst, const float *x, const float *g, int64_t n, float eps)
{
	double p[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			p[j] += (double)x[i + j] * x[i + j];
	for (int j = 0; i < n; i++, j++)
		p[j] += (double)x[i] * x[i];
	double ss = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
	float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
	for (i = 0; i < n; i++)
		dst[i] = x[i] * scale * g[i];
}

enum cpu_vendor cpu_vendor(void)
{
#if defined(__x86_64__)
	unsigned a, b, c, d;
	__asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
	if (b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu) /* "GenuineIntel" */
		return CPU_VENDOR_INTEL;
	if (b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u) /* "AuthenticAMD" */
		return CPU_VENDOR_AMD;
#endif
	return CPU_VENDOR_OTHER;
}

void cpu_kernels_init(struct cpu_kernels *k, int force_generic)
{
	cpu_kernels_init_isa(k, force_generic ? KVD_CPU_ISA_GENERIC : KVD_CPU_ISA_BEST);
}

void cpu_kernels_init_isa(struct cpu_kernels *k, enum kvd_cpu_isa isa)
{
	memset(k, 0, sizeof(*k));
	k->isa = "generic";
	k->isa_level = isa == KVD_CPU_ISA_GENERIC ? 0 : isa == KVD_CPU_ISA_AVX2 ? 1 : isa == KVD_CPU_ISA_AVX512 ? 2 : 3;
	k->dot[KVD_WTYPE_F32] = dot_f32_generic;
	k->dot[KVD_WTYPE_F16] = dot_f16_generic;
	k->dot[KVD_WTYPE_BF16] = dot_bf16_generic;
	k->dot[KVD_WTYPE_Q4_0] = dot_q4_0_generic;
	k->dot[KVD_WTYPE_Q4_1] = dot_q4_1_generic;
	k->dot[KVD_WTYPE_Q8_0] = dot_q8_0_generic;
	k->dot[KVD_WTYPE_Q5_0] = dot_q5_0_generic;
	k->dot[KVD_WTYPE_Q5_1] = dot_q5_1_generic;
	/* K-quants (ops_avx2.c replaces these where the CPU has AVX2) */
	k->dot[KVD_WTYPE_Q4_K] = dot_q4_K_generic;
	k->dot[KVD_WTYPE_Q5_K] = dot_q5_K_generic;
	k->dot[KVD_WTYPE_Q6_K] = dot_q6_K_generic;
	k->quantize_q8 = quantize_q8_generic;
	k->quantize_q8k = quantize_q8k_generic;
	k->dot_f32_f16 = dot_f32_f16_generic;
	k->axpy_f16 = axpy_f16_generic;
	k->dot4_f32_f16 = dot4_f32_f16_generic;
	k->axpyn_f16 = axpyn_f16_generic;
	k->store_f16 = store_f16_generic;
	k->swiglu = cpu_swiglu_generic;
	k->geglu = cpu_geglu_generic;
	k->rmsnorm = cpu_rmsnorm_generic;
#if defined(__x86_64__)
	if (k->isa_level >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("f16c")) {
		cpu_kernels_init_avx2(k);
		/* the tiled AVX-512 VNNI kernels, where the CPU has them */
		if (k->isa_level >= 2 && cpu_kernels_init_gemm_avx512(k)) {
			k->attn_rows_for = cpu_attn_rows_avx512;
			if (k->isa_level >= 3 && cpu_kernels_init_gemm_amx(k))
				k->isa = "avx512-vnni+amx";
		} else {
			cpu_kernels_init_gemm_avx2(k);
			k->attn_rows_for = cpu_attn_rows_avx2;
		}
	}
#endif
}
