/*
 * kernels/cpu/attn_util.h — small AVX-512 helpers the attention kernels
 * (attn_avx512.c, attn_bf16.c) share. Their target is the subset both
 * files compile for, so they inline into either.
 */
#ifndef KVD_CPU_ATTN_UTIL_H
#define KVD_CPU_ATTN_UTIL_H

#if defined(__x86_64__)
#include <immintrin.h>

#define ATTN_UTIL_TGT __attribute__((target("avx512f,avx512dq,avx512vl")))

/* the sum of v's lanes in a fixed order: 16 -> 8 -> 4 -> 2 -> 1 */
ATTN_UTIL_TGT static inline float attn_hsum16(__m512 v)
{
	__m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
	__m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
	b = _mm_add_ps(b, _mm_movehl_ps(b, b));
	b = _mm_add_ss(b, _mm_movehdup_ps(b));
	return _mm_cvtss_f32(b);
}

/* the first min(left, 16) lanes */
ATTN_UTIL_TGT static inline __mmask16 attn_tail_mask(int left)
{
	return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}
#endif

#endif
