/*
 * kernels/cpu/gemm_kq512.h — the integer steps of the K-quant tiles that
 * gemm_avx512.c (VNNI) and gemm_amx.c (AMX tiles) share, so that both form
 * the same sums M (layout and arithmetic in gemm_avx512.c's header).
 * Include after <immintrin.h>, x86-64 only.
 */
#ifndef KVD_CPU_GEMM_KQ512_H
#define KVD_CPU_GEMM_KQ512_H

#include <stdint.h>

#define KQ512_TGT __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* A group super-block's mins (tail + 128: lane r of sub-block j at byte
 * 16 j + r) as int16 pairs per lane: mp[k] holds sub-blocks 2k and 2k+1. */
KQ512_TGT static inline __attribute__((always_inline)) void kq512_min_pairs(const uint8_t *tail, __m512i mp[4])
{
	_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
		__m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(tail + 128 + 32 * k)));
		__m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(tail + 144 + 32 * k)));
		mp[k] = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
	}
}

/* M of one token: sum over the 8 sub-blocks of min * the token's integer
 * sum over the sub-block (xs[0..7], |xs| <= 32 * 127: int16), exact. */
KQ512_TGT static inline __attribute__((always_inline)) __m512i kq512_min_sum(const __m512i mp[4], const int32_t *xs)
{
	__m512i ms = _mm512_setzero_si512();
	_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
		ms = _mm512_dpwssd_epi32(
			ms, mp[k], _mm512_set1_epi32((int32_t)((uint32_t)(uint16_t)xs[2 * k] | (uint32_t)xs[2 * k + 1] << 16)));
	return ms;
}

#endif
