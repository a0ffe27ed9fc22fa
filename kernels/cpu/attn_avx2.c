/*
 * kernels/cpu/attn_avx2.c — the attention kernel of attn_avx512.c for CPUs
 * with AVX2 and FMA but without AVX-512, over 8-lane vectors.
 *
 * Same contract (ops.h, attn_rows_fn) and the same structure:
 *   scores   four query rows share each K row's conversion (a last two
 *            rows, or a last row, go together or alone), and four sums
 *            (two rows at two positions, or one row at four) share one
 *            fixed 8 -> 1 reduction (three hadds and a 128-bit add, the
 *            same for every slot);
 *   softmax  max and a vector exp over 8 lanes, then a fixed 8 -> 1 tree;
 *   output   V rows in position order into blocks of four rows times 16
 *            columns (a last one or two rows: 32 columns), the block's
 *            rows sharing each V vector's conversion.
 * On cores where an f16 -> f32 conversion of 8 lanes costs several FMAs'
 * time (vcvtph2ps on 128-bit-datapath cores), converting each K and V
 * vector once per query group rather than per two or three rows is what
 * sets the kernel's speed.
 * Every (row, position) value follows one sequence of operations whatever
 * the tile, so a row's result is bit-identical alone, in a batch or in a
 * prefill tile — the property kvd's determinism rests on. The bits differ
 * from the AVX-512 kernel's (other reduction trees, another exp).
 */
#include "ops.h"
#include "vexp.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 16")
/* positions ahead whose K and V rows are prefetched (see attn_avx512.c) */
#define ATTN_PF 16

/* out lane j = sum of the 8 lanes of a[j] (j < 4), by the same tree for
 * every j: adjacent pairs, pairs of pairs, then the two 128-bit halves. */
TGT static inline __m128 reduce4(const __m256 a[4])
{
	__m256 h01 = _mm256_hadd_ps(a[0], a[1]);
	__m256 h23 = _mm256_hadd_ps(a[2], a[3]);
	__m256 h = _mm256_hadd_ps(h01, h23);
	return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* fixed order: 8 -> 4 -> 2 -> 1 */
TGT static inline float hsum8(__m256 v)
{
	__m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	b = _mm_add_ps(b, _mm_movehl_ps(b, b));
	b = _mm_add_ss(b, _mm_movehdup_ps(b));
	return _mm_cvtss_f32(b);
}

/* 8 stored elements as floats: f16 (BF = 0) or bfloat16 (BF = 1, exact:
 * the bits moved to a float's top half) */
TGT static inline __attribute__((always_inline)) __m256 load16x8(const int BF, const uint16_t *p)
{
	__m128i h = _mm_loadu_si128((const __m128i *)p);
	if (BF)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	return _mm256_cvtph_ps(h);
}

/* first `left` lanes set (all when left >= 8), as a blend mask */
TGT static inline __m256 tail8(int left)
{
	const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx));
}

/* Scores of rows r .. r + RS - 1 (those below nr; the others repeat row
 * r and are not stored) against positions [0, their longest len), P
 * positions at a time (RS, P: 4, 2 or 2, 2 or 1, 8); four sums (two rows
 * at two positions, or a row at four) share one fixed 8 -> 1 reduction. Slots
 * past the longest row's end read the last position and are never used. */
TGT static inline __attribute__((always_inline)) void scores_rows(const int HD, const int BF, const int RS, const int P,
								  int r,
								  int nr, const float *const *q, const int *len,
								  const uint16_t *const *k, int n, float scale, float *sc,
								  int ld)
{
	const int V = HD / 8;
	const __m128 vs = _mm_set1_ps(scale);
	const float *qr[4];
	int lr = 0;
	UNROLL for (int rr = 0; rr < RS; rr++) {
		int row = r + rr < nr ? r + rr : r;
		qr[rr] = q[row];
		lr = len[row] > lr ? len[row] : lr;
	}
	for (int p0 = 0; p0 < lr; p0 += P) {
		__m256 acc[4][8]; /* RS x P of them (fixed bounds: not a VLA) */
		if (p0 + ATTN_PF + P <= n)
			UNROLL for (int i = 0; i < P; i++)
				UNROLL for (int b = 0; b < HD * 2; b += 64)
					_mm_prefetch((const char *)k[p0 + ATTN_PF + i] + b, _MM_HINT_T0);
		UNROLL for (int i = 0; i < P; i++) {
			const uint16_t *kr = k[p0 + i < n ? p0 + i : n - 1];
			UNROLL for (int j = 0; j < V; j++) {
				__m256 kv = load16x8(BF, kr + 8 * j);
				UNROLL for (int rr = 0; rr < RS; rr++) {
					__m256 qv = _mm256_loadu_ps(qr[rr] + 8 * j);
					acc[rr][i] = j ? _mm256_fmadd_ps(qv, kv, acc[rr][i]) : _mm256_mul_ps(qv, kv);
				}
			}
		}
		if (P >= 4) {
			UNROLL for (int rr = 0; rr < RS; rr++)
				UNROLL for (int i = 0; i < P; i += 4)
					if (r + rr < nr)
						_mm_storeu_ps(sc + (size_t)(r + rr) * ld + p0 + i,
							      _mm_mul_ps(reduce4(acc[rr] + i), vs));
			continue;
		}
		/* lanes: (row 2h, p0), (2h, p0 + 1), (2h + 1, p0), (2h + 1, p0 + 1) */
		UNROLL for (int h = 0; h < RS / 2; h++) {
			const __m256 four[4] = {acc[2 * h][0], acc[2 * h][1], acc[2 * h + 1][0], acc[2 * h + 1][1]};
			__m128 s4 = _mm_mul_ps(reduce4(four), vs);
			if (r + 2 * h < nr)
				_mm_storel_pi((__m64 *)(void *)(sc + (size_t)(r + 2 * h) * ld + p0), s4);
			if (r + 2 * h + 1 < nr)
				_mm_storeh_pi((__m64 *)(void *)(sc + (size_t)(r + 2 * h + 1) * ld + p0), s4);
		}
	}
}

/* Scores of nr rows: four rows at a time share each K row's conversion
 * (one vcvtph2ps feeds four FMAs: on some AVX2 cores the conversion, not
 * the FMA, is the slower of the two), then a last two rows together or a
 * last row alone. Which rows share a pass never changes a score's arithmetic. */
TGT static inline __attribute__((always_inline)) void scores8(const int HD, const int BF, int nr, const float *const *q,
							      const int *len, const uint16_t *const *k, int n,
							      float scale, float *sc, int ld)
{
	int r = 0;
	for (; nr - r >= 3; r += 4)
		scores_rows(HD, BF, 4, 2, r, nr, q, len, k, n, scale, sc, ld);
	if (nr - r == 2)
		scores_rows(HD, BF, 2, 2, r, nr, q, len, k, n, scale, sc, ld);
	else if (nr - r == 1)
		scores_rows(HD, BF, 1, 8, r, nr, q, len, k, n, scale, sc, ld);
}

/* The weighted V sums of rows r0 .. r0 + nt - 1 (nt <= RT) in blocks of
 * CB vectors: the block's rows share each V vector's conversion. */
TGT static inline __attribute__((always_inline)) void vsums_rows(const int HD, const int BF, const int RT,
								 const int CB, int r0, int nt, const int *len,
								 const uint16_t *const *v, const float *sc, int ld,
								 float *const *o)
{
	int pe = 0;
	for (int rr = 0; rr < nt; rr++)
		pe = len[r0 + rr] > pe ? len[r0 + rr] : pe;
	for (int c0 = 0; c0 < HD; c0 += 8 * CB) {
		__m256 acc[4][4]; /* RT x CB of them (fixed bounds: not a VLA) */
		UNROLL for (int rr = 0; rr < RT; rr++) UNROLL for (int j = 0; j < CB; j++) acc[rr][j] = _mm256_setzero_ps();
		for (int p = 0; p < pe; p++) {
			__m256 vv[4];
			if (c0 == 0 && p + ATTN_PF < pe)
				UNROLL for (int b = 0; b < HD * 2; b += 64)
					_mm_prefetch((const char *)v[p + ATTN_PF] + b, _MM_HINT_T0);
			UNROLL for (int j = 0; j < CB; j++)
				vv[j] = load16x8(BF, v[p] + c0 + 8 * j);
			UNROLL for (int rr = 0; rr < RT; rr++) {
				if (rr < nt && p < len[r0 + rr]) {
					__m256 e = _mm256_set1_ps(sc[(size_t)(r0 + rr) * ld + p]);
					UNROLL for (int j = 0; j < CB; j++)
						acc[rr][j] = _mm256_fmadd_ps(e, vv[j], acc[rr][j]);
				}
			}
		}
		UNROLL for (int rr = 0; rr < RT; rr++)
			if (rr < nt)
				UNROLL for (int j = 0; j < CB; j++)
					_mm256_storeu_ps(o[r0 + rr] + c0 + 8 * j, acc[rr][j]);
	}
}

/* HD (head size) is 64, 128 or 256; BF: K and V stored as bfloat16, else
 * f16. */
TGT static inline __attribute__((always_inline)) void attn_rows8(const int HD, const int BF, int nr,
								 const float *const *q, const int *len,
								 const uint16_t *const *k,
								 const uint16_t *const *v, float scale,
								 float *const *ml, float *const *o, float *scratch)
{
	int n = 0;
	for (int r = 0; r < nr; r++)
		n = len[r] > n ? len[r] : n;
	const int n16 = (n + 15) & ~15;
	float *sc = scratch; /* nr x n16 scores, then weights */

	scores8(HD, BF, nr, q, len, k, n, scale, sc, n16);

	for (int r = 0; r < nr; r++) {
		float *s = sc + (size_t)r * n16;
		__m256 mx = _mm256_set1_ps(-INFINITY);
		for (int p0 = 0; p0 < len[r]; p0 += 8)
			mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, _mm256_loadu_ps(s + p0)), tail8(len[r] - p0));
		__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
		m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
		m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
		float M = _mm_cvtss_f32(m4);
		__m256 vm = _mm256_set1_ps(M), sum = _mm256_setzero_ps();
		for (int p0 = 0; p0 < len[r]; p0 += 8) {
			__m256 e = _mm256_and_ps(exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + p0), vm)), tail8(len[r] - p0));
			_mm256_storeu_ps(s + p0, e);
			sum = _mm256_add_ps(sum, e);
		}
		ml[r][0] = M;
		ml[r][1] = hsum8(sum);
	}

	/* four rows (three) share each V vector's conversion, two vectors
	 * at a time; a last one or two rows four vectors at a time */
	int r0 = 0;
	for (; nr - r0 >= 3; r0 += 4)
		vsums_rows(HD, BF, 4, 2, r0, nr - r0 < 4 ? nr - r0 : 4, len, v, sc, n16, o);
	if (r0 < nr)
		vsums_rows(HD, BF, 2, 4, r0, nr - r0, len, v, sc, n16, o);
}

#define ATTN_ENTRY(NAME, HD, BF)                                                                             \
	TGT static void NAME(int nr, const float *const *q, const int *len, const uint16_t *const *k,              \
			     const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch) \
	{                                                                                                     \
		attn_rows8(HD, BF, nr, q, len, k, v, scale, ml, o, scratch);                                  \
	}
ATTN_ENTRY(attn_rows8_64, 64, 0)
ATTN_ENTRY(attn_rows8_128, 128, 0)
ATTN_ENTRY(attn_rows8_256, 256, 0)
ATTN_ENTRY(attn_rows8_bf16_64, 64, 1)
ATTN_ENTRY(attn_rows8_bf16_128, 128, 1)
ATTN_ENTRY(attn_rows8_bf16_256, 256, 1)

static int have_avx2(void)
{
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

attn_rows_fn cpu_attn_rows_avx2(int hd)
{
	if (!have_avx2())
		return NULL;
	return hd == 64 ? attn_rows8_64 : hd == 128 ? attn_rows8_128 : hd == 256 ? attn_rows8_256 : NULL;
}

attn_rows_fn cpu_attn_rows_bf16_avx2(int hd)
{
	if (!have_avx2())
		return NULL;
	return hd == 64 ? attn_rows8_bf16_64 : hd == 128 ? attn_rows8_bf16_128 : hd == 256 ? attn_rows8_bf16_256 : NULL;
}
#else
attn_rows_fn cpu_attn_rows_avx2(int hd)
{
	(void)hd;
	return NULL;
}

attn_rows_fn cpu_attn_rows_bf16_avx2(int hd)
{
	(void)hd;
	return NULL;
}
#endif
