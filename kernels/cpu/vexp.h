/*
 * kernels/cpu/vexp.h — exp(x) for x <= 0 over 8 (AVX2) and 16 (AVX-512)
 * lanes: Cephes' single-precision polynomial, about 1 ulp, one set of
 * coefficients for both widths.
 *
 * x = n ln2 + r with n = round(x / ln2) and ln2 split in two (C1 + C2) so
 * that r is exact; exp(r) = 1 + r + r^2 (P0 r^5 + ... + P5); times 2^n.
 */
#ifndef KVD_CPU_VEXP_H
#define KVD_CPU_VEXP_H

#if defined(__x86_64__)
#include <immintrin.h>

#define VEXP_LOG2E 1.44269504088896341f
#define VEXP_C1 0.693359375f
#define VEXP_C2 -2.12194440e-4f
#define VEXP_P0 1.9875691500e-4f
#define VEXP_P1 1.3981999507e-3f
#define VEXP_P2 8.3334519073e-3f
#define VEXP_P3 4.1665795894e-2f
#define VEXP_P4 1.6666665459e-1f
#define VEXP_P5 5.0000001201e-1f

/* Inputs are clamped at -87, where exp is about 1.6e-38, so that the power
 * of two is built in the exponent field without going subnormal. */
__attribute__((target("avx2,fma"))) static inline __m256 exp_neg8(__m256 x)
{
	x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(VEXP_LOG2E)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VEXP_C1), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VEXP_C2), r);
	__m256 p = _mm256_set1_ps(VEXP_P0);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_P1));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_P2));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_P3));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_P4));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEXP_P5));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Below -103 the result is 0 (scalef handles the subnormal range). */
__attribute__((target("avx512f,fma"))) static inline __m512 exp_neg16(__m512 x)
{
	x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(VEXP_LOG2E)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VEXP_C1), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VEXP_C2), r);
	__m512 p = _mm512_set1_ps(VEXP_P0);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_P1));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_P2));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_P3));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_P4));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEXP_P5));
	p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
	return _mm512_scalef_ps(p, n);
}
#endif

#endif
