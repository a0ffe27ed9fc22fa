/*
 * kernels/cpu/gemm_avx512.c — quantized matrix products with AVX-512 VNNI:
 * a tile of up to GEMM_R weight rows times up to GEMM_C activation rows
 * (tokens) per call, for q4_0, q4_1 and q8_0 weights against q8 activations.
 *
 * Every (row, token) pair owns one 16-lane float accumulator and sees the
 * same sequence of operations whatever the tile's shape: blocks are taken
 * two at a time (a missing second block of an odd count is zero, not a
 * different code path), the integer products of a pair are summed exactly
 * by vpdpbusd, converted to float once, multiplied by the pair's combined
 * scales and accumulated with one fused multiply-add; the 16 lanes are
 * reduced in a fixed order at the end. So a token's result is bit-identical
 * in a 4x4 prefill tile, in a single-token decode, or in any tail tile —
 * what kvd's determinism rests on.
 *
 * Cost per (row, token, pair of blocks): one vpdpbusd, one convert, one
 * multiply, one or two FMAs; unpacking weights is shared by the tile's
 * tokens and loading activations by its rows.
 */
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512vbmi,f16c,fma")))

struct b40 { uint16_t d; uint8_t qs[16]; };
struct b41 { uint16_t d, m; uint8_t qs[16]; };
struct b80 { uint16_t d; int8_t qs[32]; };

/* lanes 0..7 = x, lanes 8..15 = y */
TGT static inline __m512 halves(float x, float y)
{
	return _mm512_insertf32x8(_mm512_set1_ps(x), _mm256_set1_ps(y), 1);
}

TGT static inline __m256i unpack_nib(const uint8_t *qs)
{
	__m128i a = _mm_loadu_si128((const __m128i *)qs);
	return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(a, 4), a), _mm256_set1_epi8(0x0f));
}

TGT static inline __m512i join(__m256i lo, __m256i hi)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

TGT static inline float hsum16(__m512 v)
{
	/* fixed order: 16 -> 8 -> 4 -> 2 -> 1 */
	__m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
	__m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
	b = _mm_add_ps(b, _mm_movehl_ps(b, b));
	b = _mm_add_ss(b, _mm_movehdup_ps(b));
	return _mm_cvtss_f32(b);
}

/* Activation operands of one token for blocks (b, b+1). */
struct act_pair {
	__m512i q;   /* 64 int8 quants; the second half zero past the last block */
	__m512 d;    /* scales, per half */
	__m512 aux;  /* q4_1: s/8 per half (sum term); q4_0 / q8_0: unused */
	__m512i corr;/* q4_0: 8 * sum(q) lanes; q8_0: 128 * sum(q) lanes */
};

enum gemm_kind { K_Q4_0, K_Q4_1, K_Q8_0 };

/* A token's operands for blocks (b, b+1), from the pairs after its row's
 * blocks (struct q8_pair, laid out by the quantizer). */
TGT static inline __attribute__((always_inline)) void load_act(enum gemm_kind kind, const struct q8_block *row,
								int64_t nb, int64_t b, struct act_pair *a)
{
	const struct q8_pair *p = (const struct q8_pair *)(row + nb) + b / 2;
	a->q = _mm512_loadu_si512(p->q);
	a->d = _mm512_loadu_ps(p->d);
	if (kind == K_Q4_1)
		a->aux = _mm512_loadu_ps(p->aux);
	else if (kind == K_Q4_0)
		a->corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), a->q);
	else
		a->corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), a->q);
}

/* One tile, with R, C and the weight type compile-time constants so that
 * the accumulators live in registers; instantiated for every shape below. */
#define UNROLL _Pragma("GCC unroll 4")
#ifndef PF_DIST
#define PF_DIST 2048 /* bytes ahead of the rows being read */
#endif
#define DEF_TILE(KIND, ...)                                                                                \
	TGT static inline __attribute__((always_inline)) void tile_##KIND(                                   \
		const void *w, size_t rb, const int R, const struct q8_block *xq, size_t ldq, const int C,       \
		int64_t n, float *y, size_t ldy)                                                                 \
	{                                                                                                        \
		__m512 acc[GEMM_R][GEMM_C];                                                                      \
		int64_t nb = n / QK;                                                                             \
		UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < C; t++) acc[r][t] =                \
			_mm512_setzero_ps();                                                                     \
		for (int64_t b = 0; b < nb; b += 2) {                                                            \
			int two = b + 1 < nb;                                                                    \
			struct act_pair ap[GEMM_C];                                                              \
			UNROLL for (int t = 0; t < C; t++) load_act(KIND, xq + (size_t)t * ldq, nb, b, &ap[t]); \
			UNROLL for (int r = 0; r < R; r++)                                                       \
			{                                                                                        \
				const char *wr = (const char *)w + (size_t)r * rb;                               \
				_mm_prefetch(wr + PF_DIST + b * (int64_t)(rb / nb), _MM_HINT_T0);                \
				__m512i q;                                                                       \
				__m512 wd, wm = _mm512_setzero_ps();                                             \
				__VA_ARGS__                                                                      \
				(void)wm;                                                                        \
				UNROLL for (int t = 0; t < C; t++)                                               \
				{                                                                                \
					__m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, ap[t].q);    \
					if (KIND != K_Q4_1)                                                      \
						dp = _mm512_sub_epi32(dp, ap[t].corr);                           \
					__m512 p = _mm512_cvtepi32_ps(dp);                                       \
					acc[r][t] = _mm512_fmadd_ps(p, _mm512_mul_ps(wd, ap[t].d), acc[r][t]);   \
					if (KIND == K_Q4_1)                                                      \
						acc[r][t] = _mm512_fmadd_ps(wm, ap[t].aux, acc[r][t]);           \
				}                                                                                \
			}                                                                                        \
		}                                                                                                \
		UNROLL for (int t = 0; t < C; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] =   \
			hsum16(acc[r][t]);                                                                       \
	}

/* q4_1 weights: value = d * q + m with q unsigned 0..15. The m * s term of
 * a block is spread over its 8 lanes as m * (s / 8) (exact scaling). */
DEF_TILE(K_Q4_1, {
	/* both blocks (40 bytes) in one masked load, then byte permutes: one
	 * to lay out [qs0, qs0, qs1, qs1] for the nibble split, one to gather
	 * [d0, m0, d1, m1] for the scales; a missing second block reads as 0 */
	const struct b41 *blk = (const struct b41 *)wr + b;
	__m512i raw = _mm512_maskz_loadu_epi8(two ? (__mmask64)0xffffffffffull : (__mmask64)0xfffffull, blk);
	__m512i v = _mm512_permutexvar_epi8(_mm512_set_epi8(39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24,
							     39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24,
							     19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,
							     19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4),
					    raw);
	v = _mm512_mask_srli_epi16(v, (__mmask32)0xff00ff00u, v, 4);
	q = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
	__m512i dm = _mm512_permutexvar_epi8(_mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
							      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
							      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
							      0, 0, 0, 0, 0, 0, 0, 0, 23, 22, 21, 20, 3, 2, 1, 0),
					     raw);
	__m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm512_castsi512_si128(dm)));
	wd = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), f);
	wm = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), f);
})
DEF_TILE(K_Q4_0, {
	const struct b40 *blk = (const struct b40 *)wr + b;
	uint32_t dd = blk[0].d | (uint32_t)(two ? blk[1].d : 0) << 16;
	__m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)));
	q = join(unpack_nib(blk[0].qs), two ? unpack_nib(blk[1].qs) : _mm256_setzero_si256());
	wd = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), f);
})
/* q8_0: signed weights offset by 128 to unsigned (x ^ 0x80). */
DEF_TILE(K_Q8_0, {
	const struct b80 *blk = (const struct b80 *)wr + b;
	__m256i lo = _mm256_loadu_si256((const __m256i *)blk[0].qs);
	__m256i hi = two ? _mm256_loadu_si256((const __m256i *)blk[1].qs) : _mm256_set1_epi8((char)0x80);
	q = _mm512_xor_si512(join(lo, hi), _mm512_set1_epi8((char)0x80));
	uint32_t dd = blk[0].d | (uint32_t)(two ? blk[1].d : 0) << 16;
	__m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)));
	wd = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), f);
})

#define INST1(KIND, RR, CC)                                                                                     \
	TGT static void gemm_##KIND##_##RR##_##CC(const void *w, size_t rb, const struct q8_block *xq, size_t ldq, \
						   int64_t n, float *y, size_t ldy)                              \
	{                                                                                                       \
		tile_##KIND(w, rb, RR, xq, ldq, CC, n, y, ldy);                                                  \
	}
#define INSTR(KIND, RR) INST1(KIND, RR, 1) INST1(KIND, RR, 2) INST1(KIND, RR, 3) INST1(KIND, RR, 4)
#define INSTK(KIND) INSTR(KIND, 1) INSTR(KIND, 2) INSTR(KIND, 3) INSTR(KIND, 4)
INSTK(K_Q4_0)
INSTK(K_Q4_1)
INSTK(K_Q8_0)

typedef void (*tile_fn)(const void *w, size_t rb, const struct q8_block *xq, size_t ldq, int64_t n, float *y,
			size_t ldy);
#define ROW(KIND, RR) {gemm_##KIND##_##RR##_1, gemm_##KIND##_##RR##_2, gemm_##KIND##_##RR##_3, gemm_##KIND##_##RR##_4}
#define TABLE(KIND) {ROW(KIND, 1), ROW(KIND, 2), ROW(KIND, 3), ROW(KIND, 4)}
static const tile_fn tiles_q4_0[GEMM_R][GEMM_C] = TABLE(K_Q4_0);
static const tile_fn tiles_q4_1[GEMM_R][GEMM_C] = TABLE(K_Q4_1);
static const tile_fn tiles_q8_0[GEMM_R][GEMM_C] = TABLE(K_Q8_0);

static void gemm_q4_1(const void *w, size_t rb, int R, const struct q8_block *xq, size_t ldq, int C, int64_t n,
		      float *y, size_t ldy)
{
	tiles_q4_1[R - 1][C - 1](w, rb, xq, ldq, n, y, ldy);
}

static void gemm_q4_0(const void *w, size_t rb, int R, const struct q8_block *xq, size_t ldq, int C, int64_t n,
		      float *y, size_t ldy)
{
	tiles_q4_0[R - 1][C - 1](w, rb, xq, ldq, n, y, ldy);
}

static void gemm_q8_0(const void *w, size_t rb, int R, const struct q8_block *xq, size_t ldq, int C, int64_t n,
		      float *y, size_t ldy)
{
	tiles_q8_0[R - 1][C - 1](w, rb, xq, ldq, n, y, ldy);
}

int cpu_kernels_init_gemm_avx512(struct cpu_kernels *k)
{
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
	    !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni") ||
	    !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vbmi") ||
	    !__builtin_cpu_supports("f16c") || !__builtin_cpu_supports("fma"))
		return 0;
	k->gemm[KVD_WTYPE_Q4_0] = gemm_q4_0;
	k->gemm[KVD_WTYPE_Q4_1] = gemm_q4_1;
	k->gemm[KVD_WTYPE_Q8_0] = gemm_q8_0;
	k->isa = "avx512-vnni";
	return 1;
}
#else
int cpu_kernels_init_gemm_avx512(struct cpu_kernels *k)
{
	(void)k;
	return 0;
}
#endif
