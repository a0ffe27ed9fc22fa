/*
 * kernels/cpu/ops_avx2.c — the row kernels of ops.c in AVX2/FMA/F16C:
 * conversions, activation quantization, row dot products for every weight
 * type, the f16 helpers of attention and the activations.
 */
#include "blocks.h"
#include "vexp.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

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

/* max |x| over 32 floats */
AVX2 static inline float amax32(const float *xb)
{
	const __m256 signbit = _mm256_set1_ps(-0.0f);
	__m256 m = _mm256_andnot_ps(signbit, _mm256_loadu_ps(xb));
	m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, _mm256_loadu_ps(xb + 8)));
	m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, _mm256_loadu_ps(xb + 16)));
	m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, _mm256_loadu_ps(xb + 24)));
	__m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	return _mm_cvtss_f32(m4);
}

/* Block b of a row of nb blocks (xb its 32 floats) with scale d and
 * inverse id: ops.c's q8_block_of. */
AVX2 static inline void q8_block_avx2(const float *xb, float d, float id, struct q8_block *y, int64_t b, int64_t nb)
{
	__m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
	__m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
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
	((int32_t *)(void *)(y + nb))[b] = isum;
	((int32_t *)(void *)(y + nb))[nb + b] = _mm_cvtsi128_si32(h4);
}

/* one scale per span of 32 (quantize_q8) or 256 (quantize_q8k) */
AVX2 static inline void quantize_span_avx2(const float *x, struct q8_block *y, int64_t n, int64_t span)
{
	const int64_t nb = n / QK, bs = span / QK;
	for (int64_t b0 = 0; b0 < nb; b0 += bs) {
		int64_t e = b0 + bs < nb ? b0 + bs : nb;
		float amax = 0;
		for (int64_t b = b0; b < e; b++)
			amax = fmaxf(amax, amax32(x + b * QK));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		for (int64_t b = b0; b < e; b++)
			q8_block_avx2(x + b * QK, d, id, y, b, nb);
	}
}

AVX2 static void quantize_q8_avx2(const float *x, struct q8_block *y, int64_t n)
{
	quantize_span_avx2(x, y, n, QK);
}

AVX2 static void quantize_q8k_avx2(const float *x, struct q8_block *y, int64_t n)
{
	quantize_span_avx2(x, y, n, 256);
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

/* The K-quant dots below form the same exact integer sums as cpu_kq_dot and
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
				cpu_kq_scale_min(a->scales, j, &sc, &m);
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
	cpu_swiglu_generic(g + i, u + i, n - i);
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
	cpu_geglu_generic(g + i, u + i, n - i);
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

/* cpu_rmsnorm_generic's arithmetic: partial sums 0..3 and 4..7 are the
 * lanes of two double vectors (a product, then a sum, no FMA), the same
 * tree, then x * s * g as two products */
AVX2 static void rmsnorm_avx2(float *dst, const float *x, const float *g, int64_t n, float eps)
{
	__m256d p03 = _mm256_setzero_pd(), p47 = _mm256_setzero_pd();
	double p[8];
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
		p03 = _mm256_add_pd(p03, _mm256_mul_pd(a, a));
		p47 = _mm256_add_pd(p47, _mm256_mul_pd(b, b));
	}
	_mm256_storeu_pd(p, p03);
	_mm256_storeu_pd(p + 4, p47);
	for (int j = 0; i < n; i++, j++)
		p[j] += (double)x[i] * x[i];
	double ss = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
	float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
	const __m256 vs = _mm256_set1_ps(scale);
	for (i = 0; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(g + i)));
	for (; i < n; i++)
		dst[i] = x[i] * scale * g[i];
}

void cpu_kernels_init_avx2(struct cpu_kernels *k)
{
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
	k->quantize_q8k = quantize_q8k_avx2;
	k->dot_f32_f16 = dot_f32_f16_avx2;
	k->axpy_f16 = axpy_f16_avx2;
	k->dot4_f32_f16 = dot4_f32_f16_avx2;
	k->axpyn_f16 = axpyn_f16_avx2;
	k->store_f16 = store_f16_avx2;
	k->swiglu = swiglu_avx2;
	k->geglu = geglu_avx2;
	k->rmsnorm = rmsnorm_avx2;
}
#endif /* __x86_64__ */
