/*
 * kernels/cpu/gemm_avx2.c — the tiled quantized matrix products of
 * gemm_avx512.c for CPUs with AVX2 but without AVX-512 VNNI, over the same
 * packed weights (layout in gemm_avx512.c) but for q6_K's.
 *
 * A 256-bit vector holds 8 of a group's 16 rows, so a group is done as two
 * halves of 8 rows. Per block and token, the unsigned weight bytes times
 * the broadcast signed activation bytes go through vpmaddubsw (pairs to
 * int16) and vpmaddwd (to int32):
 *   q4_0, q4_1: each int16 pair sum is at most 2 * 15 * 127, so the eight
 *               of a block add up in int16 without overflow (<= 30480),
 *               then one vpmaddwd;
 *   q8_0:       the stored bytes are flipped back to signed, and |w| times
 *               x with w's sign keeps each pair within int16 (<= 32512);
 *   q5_1, q5_K, q6_K: unsigned bytes of at most 63, each pair within
 *               int16 (<= 16002), widened to int32 per vector (q5_K,
 *               q6_K: per two vectors, two pairs <= 32004); q5_K's
 *               and q6_K's are packed as 4 + 1 and 4 + 2 bits here
 *               (CPU_PACK_Q5_SPLIT, CPU_PACK_Q6_SPLIT: 0.70 and 0.82
 *               bytes a weight, about the file's, against the byte of the
 *               VNNI kernel's layout) and joined in registers;
 *   q4_K:       as q4_0 and q4_1, per sub-block of 32.
 * Float weights run the VNNI file's two FMA chains per lane.
 * Either way the block's int32 sum is exact — the same integer the VNNI
 * kernel forms (for the K-quants, the super-block's sums S and M, the
 * sub-block scales applied in integers: half_k) — and the float steps per
 * lane are the VNNI kernel's, so both produce the same bits.
 */
#include <string.h>

#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 8")
#define SUB_COLS 4 /* tokens per pass: the accumulators fit the 16 registers */
/* An accumulator's chain of additions stays a chain: the compiler would
 * otherwise regroup it into a tree, holding every product of a block at
 * once in more than the 16 registers and spilling them (a third of the
 * tile's time) */
#define KEEP(v) __asm__("" : "+x"(v))

enum gemm_kind { K_Q4_0, K_Q4_1, K_Q8_0, K_Q5_1, K_Q4_K, K_Q5_K, K_Q6_K, K_F32, K_F16, K_BF16 };

/* Tiles of one or two tokens prefetch the weights this many bytes ahead of
 * the block they read, by kind and vendor (pf_amd, set once by
 * cpu_kernels_init_gemm_avx2). GEMM_PF_DIST with prefetcht0 elsewhere; on
 * AMD cores (measured on Zen 2, bench/tile_bench --rows 65536 --tokens 1
 * --chunk 1 and kvd_bench decode) prefetchnta, and the distance depends on
 * the kernel: the 512-byte blocks of q8_0 and q5_1 and the float rows
 * stream fastest 512 bytes ahead (4 KiB: 12-14 % slower), q4_0 and q4_1
 * 1 KiB, while the K-quants, which read each super-block's scales 2 KiB
 * past its first quants, need 16 KiB (4 KiB: 5-16 % slower). */
static const int pf_dist[2][K_BF16 + 1] = {
	{GEMM_PF_DIST, GEMM_PF_DIST, GEMM_PF_DIST, GEMM_PF_DIST, GEMM_PF_DIST, GEMM_PF_DIST, GEMM_PF_DIST,
	 GEMM_PF_DIST, GEMM_PF_DIST, GEMM_PF_DIST},
	{1024, 1024, 512, 512, 16384, 16384, 16384, 512, 512, 512},
};
static int pf_amd;

/* Prefetch the lines of the n bytes at p plus the kind's distance. */
TGT static inline __attribute__((always_inline)) void prefetch_ahead(enum gemm_kind kind, int amd, const uint8_t *p,
								      size_t n)
{
	const char *a = (const char *)p + pf_dist[amd][kind];
	UNROLL for (size_t o = 0; o < n; o += 64) {
		if (amd)
			_mm_prefetch(a + o, _MM_HINT_NTA);
		else
			_mm_prefetch(a + o, _MM_HINT_T0);
	}
}

TGT static inline __attribute__((always_inline)) __m256i bcast4(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return _mm256_set1_epi32(v);
}

/* The result of a half's accumulators: rows 0..R-1 of 8. */
TGT static inline __attribute__((always_inline)) void store_half(float *y, int R, __m256 acc)
{
	if (R >= 8) {
		_mm256_storeu_ps(y, acc);
	} else {
		float tmp[8];
		_mm256_storeu_ps(tmp, acc);
		for (int r = 0; r < R; r++)
			y[r] = tmp[r];
	}
}

/* Rows h*8 .. h*8+7 of a group times C tokens; with HH = 2 (h = 0) both
 * halves in one pass over the weights, each lane's steps as with HH = 1. */
TGT static inline __attribute__((always_inline)) void half(enum gemm_kind kind, const uint8_t *wp, int64_t nb,
							    const int h0, int R, const struct q8_block *xq, size_t ldq,
							    const int C, float *y, size_t ldy, const int HH)
{
	const size_t gb = kind == K_Q8_0 ? GEMM_ROWS * 34 : kind == K_Q5_1 ? GEMM_ROWS * 36
			  : kind == K_Q4_1 ? GEMM_ROWS * 20 : GEMM_ROWS * 18;
	const int qbytes = kind == K_Q8_0 || kind == K_Q5_1 ? 512 : 256;
	const int has_m = kind == K_Q4_1 || kind == K_Q5_1;
	const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
	const int amd = __atomic_load_n(&pf_amd, __ATOMIC_RELAXED);
	__m256 acc2[2][SUB_COLS];

	UNROLL for (int hh = 0; hh < HH; hh++)
		UNROLL for (int t = 0; t < C; t++)
			acc2[hh][t] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++, wp += gb) {
		if (C <= 2 && h0 == 0)
			prefetch_ahead(kind, amd, wp, gb);
		UNROLL for (int hh = 0; hh < HH; hh++) {
		const int h = h0 + hh;
		__m256 *acc = acc2[hh];
		__m256i is[SUB_COLS];
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
					KEEP(is[t]);
				}
			}
		} else if (kind == K_Q5_1) {
			UNROLL for (int t = 0; t < C; t++)
				is[t] = _mm256_setzero_si256();
			UNROLL for (int j = 0; j < 8; j++) {
				__m256i w = _mm256_loadu_si256((const __m256i *)(wp + 64 * j + 32 * h));
				UNROLL for (int t = 0; t < C; t++) {
					__m256i p = _mm256_maddubs_epi16(w, bcast4(xq[(size_t)t * ldq + b].q + 4 * j));
					is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(p, ones));
					KEEP(is[t]);
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
					KEEP(s16[t]);
					s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(wh, bcast4(q + 16 + 4 * j)));
					KEEP(s16[t]);
				}
			}
			UNROLL for (int t = 0; t < C; t++) {
				is[t] = _mm256_madd_epi16(s16[t], ones);
				if (kind == K_Q4_0)
					is[t] = _mm256_sub_epi32(is[t], _mm256_set1_epi32(8 * q8_row_sums(xq + (size_t)t * ldq, nb)[b]));
			}
		}
		__m256 wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + qbytes + 16 * h)));
		__m256 wm = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + qbytes + 32 + 16 * h)))
				  : _mm256_setzero_ps();
		UNROLL for (int t = 0; t < C; t++) {
			const struct q8_block *x = xq + (size_t)t * ldq + b;
			acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(wd, _mm256_set1_ps(x->d)), acc[t]);
			if (has_m)
				acc[t] = _mm256_fmadd_ps(wm, _mm256_set1_ps(x->s), acc[t]);
		}
		}
	}
	UNROLL for (int hh = 0; hh < HH; hh++)
		if (R > 8 * hh)
			UNROLL for (int t = 0; t < C; t++)
				store_half(y + (size_t)t * ldy + 8 * hh, R - 8 * hh, acc2[hh][t]);
}

/* 8 lanes' 8-bit integer scales as int16 pairs (s, s) per 32-bit lane */
TGT static inline __attribute__((always_inline)) __m256i scale16(const uint8_t *p)
{
	__m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
	return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}

/* K-quants: rows h*8 .. h*8+7 of a group times C tokens; HH as half().
 * The VNNI kernel's integer sums S and M (gemm_avx512.c) and its two
 * float steps per super-block: the pairs of vpmaddubsw go through
 * vpmaddwd against the sub-block's scale instead of ones (q4_K, q5_K:
 * sc * pair sum, exact), q6_K's two halves (their offset included) are
 * multiplied by their scales in int32. */
TGT static inline __attribute__((always_inline)) void half_k(enum gemm_kind kind, const uint8_t *wp, int64_t nb,
							      const int h0, int R, const struct q8_block *xq, size_t ldq,
							      const int C, float *y, size_t ldy, const int HH)
{
	const int qb = kind == K_Q4_K ? 256 : kind == K_Q6_K ? 384 : 320;
	const size_t gsb = kind == K_Q4_K ? GSB_Q4_K : kind == K_Q5_K ? GSB_Q5_KS : GSB_Q6_KS;
	const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
	const __m256i top = _mm256_set1_epi8(kind == K_Q6_K ? 0x30 : 0x10);
	const int amd = __atomic_load_n(&pf_amd, __ATOMIC_RELAXED);
	__m256 acc2[2][SUB_COLS];

	UNROLL for (int hh = 0; hh < HH; hh++)
		UNROLL for (int t = 0; t < C; t++)
			acc2[hh][t] = _mm256_setzero_ps();
	for (int64_t s = 0; s < nb / 8; s++, wp += gsb) {
		const uint8_t *tail = wp + 8 * qb;
		__m256i is2[2][SUB_COLS]; /* S per half and token */
		UNROLL for (int hh = 0; hh < HH; hh++)
			UNROLL for (int t = 0; t < C; t++)
				is2[hh][t] = _mm256_setzero_si256();
		for (int j = 0; j < 8; j++) {
			const int64_t b = 8 * s + j;
			if (C <= 2 && h0 == 0)
				prefetch_ahead(kind, amd, wp + gsb / 8 * j, gsb / 8);
			UNROLL for (int hh = 0; hh < HH; hh++) {
			const int h = h0 + hh;
			__m256i *is = is2[hh];
			const uint8_t *wq = wp + (size_t)qb * j + 32 * h;
			if (kind == K_Q4_K) {
				__m256i s16[SUB_COLS];
				UNROLL for (int t = 0; t < C; t++)
					s16[t] = _mm256_setzero_si256();
				UNROLL for (int v = 0; v < 4; v++) {
					__m256i raw = _mm256_loadu_si256((const __m256i *)(wq + 64 * v));
					__m256i wl = _mm256_and_si256(raw, lo4);
					__m256i wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
					UNROLL for (int t = 0; t < C; t++) {
						const int8_t *q = xq[(size_t)t * ldq + b].q;
						s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(wl, bcast4(q + 4 * v)));
						KEEP(s16[t]);
						s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(wh, bcast4(q + 16 + 4 * v)));
						KEEP(s16[t]);
					}
				}
				const __m256i sc = scale16(tail + 16 * j + 8 * h);
				UNROLL for (int t = 0; t < C; t++)
					is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(s16[t], sc));
			} else {
				/* q5_K: pairs against the scale into is; q6_K: ia, ib
				 * (elements 0..15, 16..31) from their offsets, scaled
				 * after */
				__m256i ia[SUB_COLS], ib[SUB_COLS];
				const __m256i sc = kind == K_Q5_K ? scale16(tail + 16 * j + 8 * h) : ones;
				UNROLL for (int t = 0; t < C; t++) {
					if (kind == K_Q6_K) {
						const struct q8_block *row = xq + (size_t)t * ldq;
						int32_t s0 = q8_row_half_sums(row, nb)[b], s1 = q8_row_sums(row, nb)[b] - s0;
						ia[t] = _mm256_set1_epi32(-32 * s0);
						ib[t] = _mm256_set1_epi32(-32 * s1);
					}
				}
				/* the top bits of elements 0..15 (hb0) and 16..31 (hb1:
				 * q6_K's; q5_K's are in hb0 too, bits 4..7) */
				__m256i hb0 = _mm256_loadu_si256((const __m256i *)(wq + 256)), hb1 = hb0;
				if (kind == K_Q6_K)
					hb1 = _mm256_loadu_si256((const __m256i *)(wq + 320));
				/* two vectors' products added in int16 before widening:
				 * each pair sum is at most 2 * 63 * 127, two of them
				 * 32004 */
				UNROLL for (int v2 = 0; v2 < 4; v2 += 2) {
					__m256i w0[2], w1[2];
					UNROLL for (int u = 0; u < 2; u++) {
						/* the low nibbles as q4_K's, the top bits moved to
						 * bit 4 (q5_K: bits v and 4 + v; q6_K: bits 2v, 2v+1) */
						const int v = v2 + u;
						__m256i raw = _mm256_loadu_si256((const __m256i *)(wq + 64 * v)), t0, t1;
						if (kind == K_Q6_K && v < 2) {
							t0 = _mm256_slli_epi16(hb0, 4 - 2 * v);
							t1 = _mm256_slli_epi16(hb1, 4 - 2 * v);
						} else if (kind == K_Q6_K) {
							t0 = v == 2 ? hb0 : _mm256_srli_epi16(hb0, 2);
							t1 = v == 2 ? hb1 : _mm256_srli_epi16(hb1, 2);
						} else {
							t0 = _mm256_slli_epi16(hb0, 4 - v);
							t1 = v ? _mm256_srli_epi16(hb0, v) : hb0;
						}
						w0[u] = _mm256_or_si256(_mm256_and_si256(raw, lo4), _mm256_and_si256(t0, top));
						w1[u] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4),
									_mm256_and_si256(t1, top));
					}
					UNROLL for (int t = 0; t < C; t++) {
						const int8_t *q = xq[(size_t)t * ldq + b].q;
						__m256i pa = _mm256_add_epi16(_mm256_maddubs_epi16(w0[0], bcast4(q + 4 * v2)),
									      _mm256_maddubs_epi16(w0[1], bcast4(q + 4 * v2 + 4)));
						__m256i pb = _mm256_add_epi16(_mm256_maddubs_epi16(w1[0], bcast4(q + 16 + 4 * v2)),
									      _mm256_maddubs_epi16(w1[1], bcast4(q + 20 + 4 * v2)));
						if (kind == K_Q6_K) {
							ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(pa, ones));
							KEEP(ia[t]);
							ib[t] = _mm256_add_epi32(ib[t], _mm256_madd_epi16(pb, ones));
							KEEP(ib[t]);
						} else {
							is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(pa, sc));
							KEEP(is[t]);
							is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(pb, sc));
							KEEP(is[t]);
						}
					}
				}
				if (kind == K_Q6_K) {
					const __m256i s0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(tail + 32 * j + 8 * h)));
					const __m256i s1 =
						_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(tail + 32 * j + 16 + 8 * h)));
					UNROLL for (int t = 0; t < C; t++) {
						is[t] = _mm256_add_epi32(is[t], _mm256_mullo_epi32(ia[t], s0));
						is[t] = _mm256_add_epi32(is[t], _mm256_mullo_epi32(ib[t], s1));
					}
				}
			}
			}
		}
		UNROLL for (int hh = 0; hh < HH; hh++) {
			const int h = h0 + hh;
			const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tail + 256 + 16 * h)));
			__m256i mp[4];
			if (kind != K_Q6_K) /* mins of sub-blocks 2k, 2k+1 as int16 pairs per lane */
				UNROLL for (int k = 0; k < 4; k++) {
					__m256i a0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(tail + 128 + 32 * k + 8 * h)));
					__m256i a1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(tail + 144 + 32 * k + 8 * h)));
					mp[k] = _mm256_or_si256(a0, _mm256_slli_epi32(a1, 16));
				}
			UNROLL for (int t = 0; t < C; t++) {
				const struct q8_block *row = xq + (size_t)t * ldq;
				const __m256 dx = _mm256_set1_ps(row[8 * s].d);
				acc2[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is2[hh][t]), _mm256_mul_ps(d, dx), acc2[hh][t]);
				if (kind != K_Q6_K) {
					const __m256 dmin =
						_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tail + 288 + 16 * h)));
					const int32_t *xs = q8_row_sums(row, nb) + 8 * s;
					__m256i ms = _mm256_setzero_si256();
					UNROLL for (int k = 0; k < 4; k++)
						ms = _mm256_add_epi32(
							ms, _mm256_madd_epi16(mp[k], _mm256_set1_epi32((int32_t)(
											     (uint32_t)(uint16_t)xs[2 * k] |
											     (uint32_t)xs[2 * k + 1] << 16))));
					acc2[hh][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dmin, dx), acc2[hh][t]);
				}
			}
		}
	}
	UNROLL for (int hh = 0; hh < HH; hh++)
		if (R > 8 * hh)
			UNROLL for (int t = 0; t < C; t++)
				store_half(y + (size_t)t * ldy + 8 * hh, R - 8 * hh, acc2[hh][t]);
}

TGT static inline __attribute__((always_inline)) __m256 load_f(enum gemm_kind kind, const uint8_t *p)
{
	if (kind == K_F32)
		return _mm256_loadu_ps((const float *)(const void *)p);
	__m128i hv = _mm_loadu_si128((const __m128i *)p);
	if (kind == K_F16)
		return _mm256_cvtph_ps(hv);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hv), 16));
}

/* Float weights: rows h*8 .. h*8+7 of a group times C float tokens. */
TGT static inline __attribute__((always_inline)) void half_f(enum gemm_kind kind, const uint8_t *wp, int64_t nb,
							      const int h0, int R, const float *x, size_t ldx, const int C,
							      float *y, size_t ldy, const int HH)
{
	const size_t cb = kind == K_F32 ? 64 : 32; /* bytes of a column */
	const int amd = __atomic_load_n(&pf_amd, __ATOMIC_RELAXED);
	__m256 a0[2][SUB_COLS], a1[2][SUB_COLS];

	UNROLL for (int hh = 0; hh < HH; hh++)
		UNROLL for (int t = 0; t < C; t++) {
			a0[hh][t] = _mm256_setzero_ps();
			a1[hh][t] = _mm256_setzero_ps();
		}
	for (int64_t i = 0; i < nb * QK; i += 2, wp += 2 * cb) {
		if (C <= 2 && h0 == 0)
			prefetch_ahead(kind, amd, wp, 2 * cb);
		UNROLL for (int hh = 0; hh < HH; hh++) {
			const uint8_t *wh = wp + cb / 2 * (size_t)(h0 + hh);
			__m256 w0 = load_f(kind, wh), w1 = load_f(kind, wh + cb);
			UNROLL for (int t = 0; t < C; t++) {
				const float *xt = x + (size_t)t * ldx + i;
				a0[hh][t] = _mm256_fmadd_ps(w0, _mm256_set1_ps(xt[0]), a0[hh][t]);
				a1[hh][t] = _mm256_fmadd_ps(w1, _mm256_set1_ps(xt[1]), a1[hh][t]);
			}
		}
	}
	UNROLL for (int hh = 0; hh < HH; hh++)
		if (R > 8 * hh)
			UNROLL for (int t = 0; t < C; t++)
				store_half(y + (size_t)t * ldy + 8 * hh, R - 8 * hh, _mm256_add_ps(a0[hh][t], a1[hh][t]));
}

/* The entry points: PFX_KIND_CC runs FN for CC tokens, HH halves per pass
 * (half_*: one half, h = 0 or 1; both_*: both, h = 0). */
#define ENTRY_Q(PFX, FN, KIND, CC, HH)                                                                        \
	TGT static void PFX##_##KIND##_##CC(const uint8_t *wp, int64_t nb, int h, int R, const struct q8_block *xq, \
					    size_t ldq, float *y, size_t ldy)                                    \
	{                                                                                                     \
		FN(KIND, wp, nb, h, R, xq, ldq, CC, y, ldy, HH);                                             \
	}
#define ENTRY_F(PFX, KIND, CC, HH)                                                                            \
	TGT static void PFX##_##KIND##_##CC(const uint8_t *wp, int64_t nb, int h, int R, const float *x, size_t ldx, \
					    float *y, size_t ldy)                                                \
	{                                                                                                     \
		half_f(KIND, wp, nb, h, R, x, ldx, CC, y, ldy, HH);                                          \
	}
#define INST(KIND, CC) ENTRY_Q(half, half, KIND, CC, 1)
#define INSTQ(KIND, CC) ENTRY_Q(half, half_k, KIND, CC, 1)
#define INSTF(KIND, CC) ENTRY_F(half, KIND, CC, 1)
#define INSTK(KIND) INST(KIND, 1) INST(KIND, 2) INST(KIND, 3) INST(KIND, 4)
#define INST4(I, KIND) I(KIND, 1) I(KIND, 2) I(KIND, 3) I(KIND, 4)
INSTK(K_Q4_0)
INSTK(K_Q4_1)
INSTK(K_Q8_0)
INSTK(K_Q5_1)
INST4(INSTQ, K_Q4_K)
INST4(INSTQ, K_Q5_K)
INST4(INSTQ, K_Q6_K)
INST4(INSTF, K_F32)
INST4(INSTF, K_F16)
INST4(INSTF, K_BF16)

/* One or two tokens, both halves in one pass (decode): a weight line is used
 * whole as it arrives, the stream from memory never waits for a second
 * pass over the group (which would find it in L2 with nothing fetched
 * ahead meanwhile). */
#define BOTH(KIND, CC) ENTRY_Q(both, half, KIND, CC, 2)
#define BOTHK(KIND, CC) ENTRY_Q(both, half_k, KIND, CC, 2)
#define BOTHF(KIND, CC) ENTRY_F(both, KIND, CC, 2)
#define BOTH2(I, KIND) I(KIND, 1) I(KIND, 2)
BOTH2(BOTH, K_Q4_0)
BOTH2(BOTH, K_Q4_1)
BOTH2(BOTH, K_Q8_0)
BOTH2(BOTH, K_Q5_1)
BOTH2(BOTHK, K_Q4_K)
BOTH2(BOTHK, K_Q5_K)
BOTH2(BOTHK, K_Q6_K)

typedef void (*half_fn)(const uint8_t *wp, int64_t nb, int h, int R, const struct q8_block *xq, size_t ldq,
			float *y, size_t ldy);
#define PAIR(KIND) {both_##KIND##_1, both_##KIND##_2}
static const half_fn boths[7][2] = {PAIR(K_Q4_0), PAIR(K_Q4_1), PAIR(K_Q8_0), PAIR(K_Q5_1),
				    PAIR(K_Q4_K), PAIR(K_Q5_K), PAIR(K_Q6_K)};
#define TABLE(KIND) {half_##KIND##_1, half_##KIND##_2, half_##KIND##_3, half_##KIND##_4}
static const half_fn halves[7][SUB_COLS] = {TABLE(K_Q4_0), TABLE(K_Q4_1), TABLE(K_Q8_0), TABLE(K_Q5_1),
					    TABLE(K_Q4_K), TABLE(K_Q5_K), TABLE(K_Q6_K)};
typedef void (*halff_fn)(const uint8_t *wp, int64_t nb, int h, int R, const float *x, size_t ldx, float *y,
			 size_t ldy);
static const halff_fn halves_f[3][SUB_COLS] = {TABLE(K_F32), TABLE(K_F16), TABLE(K_BF16)};
BOTH2(BOTHF, K_F32)
BOTH2(BOTHF, K_F16)
BOTH2(BOTHF, K_BF16)
static const halff_fn boths_f[3][2] = {PAIR(K_F32), PAIR(K_F16), PAIR(K_BF16)};

static inline void run_f(enum gemm_kind kind, const void *wp, int64_t nb, int R, const float *x, size_t ldx, int C,
			 float *y, size_t ldy)
{
	if (C <= 2 && R > 8) {
		boths_f[kind - K_F32][C - 1](wp, nb, 0, R, x, ldx, y, ldy);
		return;
	}
	for (int t = 0; t < C; t += SUB_COLS) {
		int c = C - t < SUB_COLS ? C - t : SUB_COLS;
		for (int h = 0; h < 2 && 8 * h < R; h++)
			halves_f[kind - K_F32][c - 1](wp, nb, h, R - 8 * h, x + (size_t)t * ldx, ldx,
						      y + (size_t)t * ldy + 8 * h, ldy);
	}
}

static inline void run(enum gemm_kind kind, const void *wp, int64_t nb, int R, const struct q8_block *xq,
		       size_t ldq, int C, float *y, size_t ldy)
{
	if (C <= 2 && R > 8) {
		boths[kind][C - 1](wp, nb, 0, R, xq, ldq, y, ldy);
		return;
	}
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

#define ENTRY(T, KIND)                                                                                            \
	static void gemm_##T(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int C, float *y, \
			     size_t ldy)                                                                          \
	{                                                                                                         \
		run(KIND, wp, nb, R, xq, ldq, C, y, ldy);                                                         \
	}
#define ENTRYF(T, KIND)                                                                                        \
	static void gemm_##T(const void *wp, int64_t nb, int R, const float *x, size_t ldx, int C, float *y,     \
			     size_t ldy)                                                                         \
	{                                                                                                       \
		run_f(KIND, wp, nb, R, x, ldx, C, y, ldy);                                                      \
	}
ENTRY(q5_1, K_Q5_1)
ENTRY(q4_K, K_Q4_K)
ENTRY(q5_K, K_Q5_K)
ENTRY(q6_K, K_Q6_K)
ENTRYF(f32, K_F32)
ENTRYF(f16, K_F16)
ENTRYF(bf16, K_BF16)

int cpu_kernels_init_gemm_avx2(struct cpu_kernels *k)
{
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
		return 0;
	k->gemm[KVD_WTYPE_Q4_0] = gemm_q4_0;
	k->gemm[KVD_WTYPE_Q4_1] = gemm_q4_1;
	k->gemm[KVD_WTYPE_Q8_0] = gemm_q8_0;
	k->gemm[KVD_WTYPE_Q5_0] = gemm_q8_0; /* packed as q8_0 (cpu_gemm_pack) */
	k->gemm[KVD_WTYPE_Q5_1] = gemm_q5_1;
	k->gemm[KVD_WTYPE_Q4_K] = gemm_q4_K;
	k->gemm[KVD_WTYPE_Q5_K] = gemm_q5_K;
	k->gemm[KVD_WTYPE_Q6_K] = gemm_q6_K;
	k->gemmf[KVD_WTYPE_F32] = gemm_f32;
	k->gemmf[KVD_WTYPE_F16] = gemm_f16;
	k->gemmf[KVD_WTYPE_BF16] = gemm_bf16;
	k->pack_flags = CPU_PACK_Q6_SPLIT | CPU_PACK_Q5_SPLIT; /* q6_K as 4 + 2 bits, q5_K as 4 + 1 */
	/* the prefetch distances above */
	__atomic_store_n(&pf_amd, cpu_vendor() == CPU_VENDOR_AMD, __ATOMIC_RELAXED);
	return 1;
}
#else
int cpu_kernels_init_gemm_avx2(struct cpu_kernels *k)
{
	(void)k;
	return 0;
}
#endif
