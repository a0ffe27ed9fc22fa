/*
 * kernels/cpu/gemm_avx2.c — the tiled quantized matrix products of
 * gemm_avx512.c for CPUs with AVX2 but without AVX-512 VNNI, over the same
 * packed weights (layout in gemm_avx512.c).
 *
 * A 256-bit vector holds 8 of a group's 16 rows, so a group is done as two
 * halves of 8 rows. Per block and token, the unsigned weight bytes times
 * the broadcast signed activation bytes go through vpmaddubsw (pairs to
 * int16) and vpmaddwd (to int32):
 *   q4_0, q4_1: each int16 pair sum is at most 2 * 15 * 127, so the eight
 *               of a block add up in int16 without overflow (<= 30480),
 *               then one vpmaddwd;
 *   q8_0:       the stored bytes are flipped back to signed, and |w| times
 *               x with w's sign keeps each pair within int16 (<= 32512).
 * Either way the block's int32 sum is exact — the same integer the VNNI
 * kernel forms — and the float steps per lane are the VNNI kernel's, so
 * both produce the same bits.
 */
#include <string.h>

#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 8")
#define SUB_COLS 4 /* tokens per pass: the accumulators fit the 16 registers */

enum gemm_kind { K_Q4_0, K_Q4_1, K_Q8_0 };

TGT static inline __attribute__((always_inline)) __m256i bcast4(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return _mm256_set1_epi32(v);
}

/* Rows h*8 .. h*8+7 of a group times C tokens. */
TGT static inline __attribute__((always_inline)) void half(enum gemm_kind kind, const uint8_t *wp, int64_t nb,
							    int h, int R, const struct q8_block *xq, size_t ldq,
							    const int C, float *y, size_t ldy)
{
	const size_t gb = kind == K_Q8_0 ? GEMM_ROWS * 34 : kind == K_Q4_1 ? GEMM_ROWS * 20 : GEMM_ROWS * 18;
	const int qbytes = kind == K_Q8_0 ? 512 : 256;
	const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
	__m256 acc[SUB_COLS];

	UNROLL for (int t = 0; t < C; t++)
		acc[t] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++, wp += gb) {
		__m256i is[SUB_COLS];
		if (C <= 2 && h == 0) {
			UNROLL for (size_t o = 0; o < gb; o += 64)
				_mm_prefetch((const char *)wp + GEMM_PF_DIST + o, _MM_HINT_T0);
		}
		if (kind == K_Q8_0) {
			UNROLL for (int t = 0; t < C; t++)
				is[t] = _mm256_setzero_si256();
			UNROLL for (int j = 0; j < 8; j++) {
				__m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wp + 64 * j + 32 * h)), flip);
				__m256i aw = _mm256_abs_epi8(w);
				UNROLL for (int t = 0; t < C; t++) {
					__m256i x = bcast4(xq[(size_t)t * ldq + b].q + 4 * j);
					__m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
					is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(p, ones));
				}
			}
		} else {
			__m256i s16[SUB_COLS];
			UNROLL for (int t = 0; t < C; t++)
				s16[t] = _mm256_setzero_si256();
			UNROLL for (int j = 0; j < 4; j++) {
				__m256i raw = _mm256_loadu_si256((const __m256i *)(wp + 64 * j + 32 * h));
				__m256i wl = _mm256_and_si256(raw, lo4);
				__m256i wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
				UNROLL for (int t = 0; t < C; t++) {
					const int8_t *q = xq[(size_t)t * ldq + b].q;
					s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(wl, bcast4(q + 4 * j)));
					s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(wh, bcast4(q + 16 + 4 * j)));
				}
			}
			UNROLL for (int t = 0; t < C; t++) {
				is[t] = _mm256_madd_epi16(s16[t], ones);
				if (kind == K_Q4_0)
					is[t] = _mm256_sub_epi32(is[t], _mm256_set1_epi32(8 * q8_row_sums(xq + (size_t)t * ldq, nb)[b]));
			}
		}
		__m256 wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + qbytes + 16 * h)));
		__m256 wm = kind == K_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + qbytes + 32 + 16 * h)))
					   : _mm256_setzero_ps();
		UNROLL for (int t = 0; t < C; t++) {
			const struct q8_block *x = xq + (size_t)t * ldq + b;
			acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(wd, _mm256_set1_ps(x->d)), acc[t]);
			if (kind == K_Q4_1)
				acc[t] = _mm256_fmadd_ps(wm, _mm256_set1_ps(x->s), acc[t]);
		}
	}
	UNROLL for (int t = 0; t < C; t++) {
		if (R >= 8) {
			_mm256_storeu_ps(y + (size_t)t * ldy, acc[t]);
		} else {
			float tmp[8];
			_mm256_storeu_ps(tmp, acc[t]);
			for (int r = 0; r < R; r++)
				y[(size_t)t * ldy + r] = tmp[r];
		}
	}
}

#define INST(KIND, CC)                                                                                        \
	TGT static void half_##KIND##_##CC(const uint8_t *wp, int64_t nb, int h, int R, const struct q8_block *xq, \
					   size_t ldq, float *y, size_t ldy)                                     \
	{                                                                                                     \
		half(KIND, wp, nb, h, R, xq, ldq, CC, y, ldy);                                               \
	}
#define INSTK(KIND) INST(KIND, 1) INST(KIND, 2) INST(KIND, 3) INST(KIND, 4)
INSTK(K_Q4_0)
INSTK(K_Q4_1)
INSTK(K_Q8_0)

typedef void (*half_fn)(const uint8_t *wp, int64_t nb, int h, int R, const struct q8_block *xq, size_t ldq,
			float *y, size_t ldy);
#define TABLE(KIND) {half_##KIND##_1, half_##KIND##_2, half_##KIND##_3, half_##KIND##_4}
static const half_fn halves[3][SUB_COLS] = {TABLE(K_Q4_0), TABLE(K_Q4_1), TABLE(K_Q8_0)};

static inline void run(enum gemm_kind kind, const void *wp, int64_t nb, int R, const struct q8_block *xq,
		       size_t ldq, int C, float *y, size_t ldy)
{
	for (int t = 0; t < C; t += SUB_COLS) {
		int c = C - t < SUB_COLS ? C - t : SUB_COLS;
		for (int h = 0; h < 2 && 8 * h < R; h++)
			halves[kind][c - 1](wp, nb, h, R - 8 * h, xq + (size_t)t * ldq, ldq, y + (size_t)t * ldy + 8 * h,
					    ldy);
	}
}

static void gemm_q4_0(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int C, float *y,
		      size_t ldy)
{
	run(K_Q4_0, wp, nb, R, xq, ldq, C, y, ldy);
}

static void gemm_q4_1(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int C, float *y,
		      size_t ldy)
{
	run(K_Q4_1, wp, nb, R, xq, ldq, C, y, ldy);
}

static void gemm_q8_0(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int C, float *y,
		      size_t ldy)
{
	run(K_Q8_0, wp, nb, R, xq, ldq, C, y, ldy);
}

int cpu_kernels_init_gemm_avx2(struct cpu_kernels *k)
{
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
		return 0;
	k->gemm[KVD_WTYPE_Q4_0] = gemm_q4_0;
	k->gemm[KVD_WTYPE_Q4_1] = gemm_q4_1;
	k->gemm[KVD_WTYPE_Q8_0] = gemm_q8_0;
	k->gemm[KVD_WTYPE_Q5_0] = gemm_q8_0; /* packed as q8_0 (gemm_pack) */
	return 1;
}
#else
int cpu_kernels_init_gemm_avx2(struct cpu_kernels *k)
{
	(void)k;
	return 0;
}
#endif
