/*
 * kernels/cpu/ops_avx512.c — multi-row dot products for quantized weights
 * with AVX-512 VNNI (vpdpbusd), used for the weight types of the default
 * model class (q4_0, q4_1, q8_0).
 *
 * A call computes up to DOTN_MAX_ROWS rows against one activation row.
 * Each row keeps its own accumulator and sees exactly the same sequence of
 * operations whatever the number of rows computed alongside it, so results
 * do not depend on how the matrix product groups rows (determinism across
 * batch shapes). Rows are interleaved only to give the CPU independent
 * work and to load each activation block once for all of them.
 *
 * Two blocks (64 weights) are processed per step: their int8 products are
 * summed exactly in int32 lanes by vpdpbusd (unsigned weights x signed
 * activations; q4_0 and q8_0 weights are offset to unsigned and corrected
 * with the activation block sums), converted to float once, scaled by the
 * two blocks' combined scales and accumulated.
 */
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")))

struct blk4_0 {
	uint16_t d;
	uint8_t qs[16];
};
struct blk4_1 {
	uint16_t d, m;
	uint8_t qs[16];
};
struct blk8_0 {
	uint16_t d;
	int8_t qs[32];
};

AVX512 static inline __m512i nib64(const uint8_t *qa, const uint8_t *qb)
{
	__m128i a = _mm_loadu_si128((const __m128i *)qa), b = _mm_loadu_si128((const __m128i *)qb);
	__m256i ea = _mm256_set_m128i(_mm_srli_epi16(a, 4), a);
	__m256i eb = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
	__m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(ea), eb, 1);
	return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

AVX512 static inline __m512i act64(const struct q8_block *x)
{
	__m256i a = _mm256_loadu_si256((const __m256i *)x[0].q), b = _mm256_loadu_si256((const __m256i *)x[1].q);
	return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

AVX512 static inline __m512 pair_scale(float s0, float s1)
{
	return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
}

AVX512 static inline float h2f512(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* Single-block tail with 256-bit lanes (odd block counts). */
AVX512 static inline __m256i nib32(const uint8_t *q)
{
	__m128i a = _mm_loadu_si128((const __m128i *)q);
	return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(a, 4), a), _mm256_set1_epi8(0x0f));
}

AVX512 static void dotn_q4_1_avx512(const void *w, size_t rb, int nr, const float *x, const struct q8_block *xq,
				    int64_t n, float *out)
{
	__m512 acc[DOTN_MAX_ROWS];
	float summs[DOTN_MAX_ROWS];
	int64_t nb = n / QK, b;
	(void)x;
	for (int r = 0; r < nr; r++) {
		acc[r] = _mm512_setzero_ps();
		summs[r] = 0;
	}
	for (b = 0; b + 2 <= nb; b += 2) {
		__m512i a = act64(xq + b);
		for (int r = 0; r < nr; r++) {
			const struct blk4_1 *wb = (const struct blk4_1 *)((const char *)w + r * rb) + b;
			__m512i q = nib64(wb[0].qs, wb[1].qs);
			__m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a));
			__m512 s = pair_scale(h2f512(wb[0].d) * xq[b].d, h2f512(wb[1].d) * xq[b + 1].d);
			acc[r] = _mm512_fmadd_ps(p, s, acc[r]);
			summs[r] += h2f512(wb[0].m) * xq[b].s + h2f512(wb[1].m) * xq[b + 1].s;
		}
	}
	for (int r = 0; r < nr; r++) {
		float t = _mm512_reduce_add_ps(acc[r]);
		if (b < nb) {
			const struct blk4_1 *wb = (const struct blk4_1 *)((const char *)w + r * rb) + b;
			__m256i q = nib32(wb->qs);
			__m256i a = _mm256_loadu_si256((const __m256i *)xq[b].q);
			__m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a));
			__m256 s = _mm256_set1_ps(h2f512(wb->d) * xq[b].d);
			__m256 v = _mm256_mul_ps(p, s);
			__m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
			h = _mm_add_ps(h, _mm_movehl_ps(h, h));
			h = _mm_add_ss(h, _mm_movehdup_ps(h));
			t += _mm_cvtss_f32(h);
			summs[r] += h2f512(wb->m) * xq[b].s;
		}
		out[r] = t + summs[r];
	}
}

/* q4_0: x = (q - 8) d; sum (q - 8) a = sum q a - 8 sum a, with sum a = s / d
 * kept exact as an integer from the activation quants. */
AVX512 static void dotn_q4_0_avx512(const void *w, size_t rb, int nr, const float *x, const struct q8_block *xq,
				    int64_t n, float *out)
{
	__m512 acc[DOTN_MAX_ROWS];
	int64_t nb = n / QK, b;
	const __m512i eight = _mm512_set1_epi8(8);
	(void)x;
	for (int r = 0; r < nr; r++)
		acc[r] = _mm512_setzero_ps();
	for (b = 0; b + 2 <= nb; b += 2) {
		__m512i a = act64(xq + b);
		/* 8 * sum(a) per block, as int32 lanes that sum to it */
		__m512i corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, a);
		for (int r = 0; r < nr; r++) {
			const struct blk4_0 *wb = (const struct blk4_0 *)((const char *)w + r * rb) + b;
			__m512i q = nib64(wb[0].qs, wb[1].qs);
			__m512i d = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a), corr);
			__m512 s = pair_scale(h2f512(wb[0].d) * xq[b].d, h2f512(wb[1].d) * xq[b + 1].d);
			acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[r]);
		}
	}
	for (int r = 0; r < nr; r++) {
		float t = _mm512_reduce_add_ps(acc[r]);
		if (b < nb) {
			const struct blk4_0 *wb = (const struct blk4_0 *)((const char *)w + r * rb) + b;
			int s = 0;
			for (int i = 0; i < 16; i++)
				s += ((wb->qs[i] & 0xf) - 8) * xq[b].q[i] + ((wb->qs[i] >> 4) - 8) * xq[b].q[i + 16];
			t += h2f512(wb->d) * xq[b].d * (float)s;
		}
		out[r] = t;
	}
}

/* q8_0: signed x signed; weights offset by 128 to unsigned, corrected by
 * 128 * sum(a). */
AVX512 static void dotn_q8_0_avx512(const void *w, size_t rb, int nr, const float *x, const struct q8_block *xq,
				    int64_t n, float *out)
{
	__m512 acc[DOTN_MAX_ROWS];
	int64_t nb = n / QK, b;
	const __m512i off = _mm512_set1_epi8((char)0x80);
	(void)x;
	for (int r = 0; r < nr; r++)
		acc[r] = _mm512_setzero_ps();
	for (b = 0; b + 2 <= nb; b += 2) {
		__m512i a = act64(xq + b);
		__m512i corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, a);
		for (int r = 0; r < nr; r++) {
			const struct blk8_0 *wb = (const struct blk8_0 *)((const char *)w + r * rb) + b;
			__m256i w0 = _mm256_loadu_si256((const __m256i *)wb[0].qs);
			__m256i w1 = _mm256_loadu_si256((const __m256i *)wb[1].qs);
			__m512i q = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1), off);
			__m512i d = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a), corr);
			__m512 s = pair_scale(h2f512(wb[0].d) * xq[b].d, h2f512(wb[1].d) * xq[b + 1].d);
			acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[r]);
		}
	}
	for (int r = 0; r < nr; r++) {
		float t = _mm512_reduce_add_ps(acc[r]);
		if (b < nb) {
			const struct blk8_0 *wb = (const struct blk8_0 *)((const char *)w + r * rb) + b;
			int s = 0;
			for (int i = 0; i < 32; i++)
				s += wb->qs[i] * xq[b].q[i];
			t += h2f512(wb->d) * xq[b].d * (float)s;
		}
		out[r] = t;
	}
}

int cpu_kernels_init_avx512(struct cpu_kernels *k)
{
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
	    !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni") ||
	    !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("f16c") || !__builtin_cpu_supports("fma"))
		return 0;
	k->dotn[KVD_WTYPE_Q4_1] = dotn_q4_1_avx512;
	k->dotn[KVD_WTYPE_Q4_0] = dotn_q4_0_avx512;
	k->dotn[KVD_WTYPE_Q8_0] = dotn_q8_0_avx512;
	k->isa = "avx512-vnni";
	return 1;
}
#else
int cpu_kernels_init_avx512(struct cpu_kernels *k)
{
	(void)k;
	return 0;
}
#endif
