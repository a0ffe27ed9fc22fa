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
 * The heads kernel (attn_heads8) runs the same steps for a chunk of every
 * KV head at once, scores position by position through the heads and V
 * sums four positions at a time through them, so that the rows are read
 * in address order, with each position's lines prefetched head by head.
 * Every (row, position) value follows one sequence of operations whatever
 * the tile, so a row's result is bit-identical alone, in a batch, in a
 * prefill tile or in the heads kernel — the property kvd's determinism
 * rests on. The bits differ
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

/* Scores of query rows qr[0 .. RS - 1] at positions p0 .. p0 + P - 1 (RS,
 * P: 4, 2 or 2, 2 or 1, 8), position p's K row at k[p] + koff (slots past
 * n read the last position and are never used), stored at out[rr] + p0
 * for rr < ns; four sums (two rows at two positions, or a row at four)
 * share one fixed 8 -> 1 reduction. */
TGT static inline __attribute__((always_inline)) void scores_blk(const int HD, const int BF, const int RS, const int P,
								 const float *const *qr, const uint16_t *const *k,
								 int koff, int p0, int n, __m128 vs, float *const *out,
								 int ns)
{
	const int V = HD / 8;
	__m256 acc[4][8]; /* RS x P of them (fixed bounds: not a VLA) */
	UNROLL for (int i = 0; i < P; i++) {
		const uint16_t *kr = k[p0 + i < n ? p0 + i : n - 1] + koff;
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
				if (rr < ns)
					_mm_storeu_ps(out[rr] + p0 + i, _mm_mul_ps(reduce4(acc[rr] + i), vs));
		return;
	}
	/* lanes: (row 2h, p0), (2h, p0 + 1), (2h + 1, p0), (2h + 1, p0 + 1) */
	UNROLL for (int h = 0; h < RS / 2; h++) {
		const __m256 four[4] = {acc[2 * h][0], acc[2 * h][1], acc[2 * h + 1][0], acc[2 * h + 1][1]};
		__m128 s4 = _mm_mul_ps(reduce4(four), vs);
		if (2 * h < ns)
			_mm_storel_pi((__m64 *)(void *)(out[2 * h] + p0), s4);
		if (2 * h + 1 < ns)
			_mm_storeh_pi((__m64 *)(void *)(out[2 * h + 1] + p0), s4);
	}
}

/* Scores of rows r .. r + RS - 1 (those below nr; the others repeat row
 * r and are not stored) against positions [0, their longest len), P
 * positions at a time (scores_blk). */
TGT static inline __attribute__((always_inline)) void scores_rows(const int HD, const int BF, const int RS, const int P,
								  int r,
								  int nr, const float *const *q, const int *len,
								  const uint16_t *const *k, int n, float scale, float *sc,
								  int ld)
{
	const __m128 vs = _mm_set1_ps(scale);
	const float *qr[4];
	float *out[4];
	int lr = 0;
	UNROLL for (int rr = 0; rr < RS; rr++) {
		int row = r + rr < nr ? r + rr : r;
		qr[rr] = q[row];
		out[rr] = sc + (size_t)row * ld;
		lr = len[row] > lr ? len[row] : lr;
	}
	for (int p0 = 0; p0 < lr; p0 += P) {
		if (p0 + ATTN_PF + P <= n)
			UNROLL for (int i = 0; i < P; i++)
				UNROLL for (int b = 0; b < HD * 2; b += 64)
					_mm_prefetch((const char *)k[p0 + ATTN_PF + i] + b, _MM_HINT_T0);
		scores_blk(HD, BF, RS, P, qr, k, 0, p0, n, vs, out, nr - r);
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
								 const uint16_t *const *v, int voff, const float *sc,
								 int ld, float *const *o)
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
					_mm_prefetch((const char *)(v[p + ATTN_PF] + voff) + b, _MM_HINT_T0);
			UNROLL for (int j = 0; j < CB; j++)
				vv[j] = load16x8(BF, v[p] + voff + c0 + 8 * j);
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

/* vsums_rows's sums over positions [pb, pe) of rows that see them all,
 * added to the sums in o (pb > 0) or starting them (pb == 0): each sum
 * takes its positions in order whatever the blocks, so the same bits as
 * vsums_rows's one pass. */
TGT static inline __attribute__((always_inline)) void vsums_blk(const int HD, const int BF, const int RT,
								const int CB, int r0, int nt,
								const uint16_t *const *v, int voff, const float *sc,
								int ld, float *const *o, int pb, int pe)
{
	for (int c0 = 0; c0 < HD; c0 += 8 * CB) {
		__m256 acc[4][4]; /* RT x CB of them (fixed bounds: not a VLA) */
		UNROLL for (int rr = 0; rr < RT; rr++)
			UNROLL for (int j = 0; j < CB; j++)
				acc[rr][j] = pb && rr < nt ? _mm256_loadu_ps(o[r0 + rr] + c0 + 8 * j) : _mm256_setzero_ps();
		for (int p = pb; p < pe; p++) {
			__m256 vv[4];
			UNROLL for (int j = 0; j < CB; j++)
				vv[j] = load16x8(BF, v[p] + voff + c0 + 8 * j);
			UNROLL for (int rr = 0; rr < RT; rr++) {
				if (rr < nt) {
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

/* Row r of sc (stride ld): its first len[r] scores become exp(score -
 * max), ml[r] = (max, their sum); for r < nr. */
TGT static inline __attribute__((always_inline)) void softmax_rows(int nr, const int *len, float *sc, int ld,
								   float *const *ml)
{
	for (int r = 0; r < nr; r++) {
		float *s = sc + (size_t)r * ld;
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
}

/* The weighted V sums of nr rows (their weights in sc, stride ld), V rows
 * at v[p] + voff: four rows (three) share each V vector's conversion, two
 * vectors at a time; a last one or two rows four vectors at a time. */
TGT static inline __attribute__((always_inline)) void vsums8(const int HD, const int BF, int nr, const int *len,
							     const uint16_t *const *v, int voff, const float *sc,
							     int ld, float *const *o)
{
	int r0 = 0;
	for (; nr - r0 >= 3; r0 += 4)
		vsums_rows(HD, BF, 4, 2, r0, nr - r0 < 4 ? nr - r0 : 4, len, v, voff, sc, ld, o);
	if (r0 < nr)
		vsums_rows(HD, BF, 2, 4, r0, nr - r0, len, v, voff, sc, ld, o);
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

	softmax_rows(nr, len, sc, n16, ml);

	vsums8(HD, BF, nr, len, v, 0, sc, n16, o);
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

/* attn_heads8: positions ahead whose K rows the scores prefetch, head by
 * head (a burst of a whole position's rows at once leaves most of them
 * undone); positions of V taken a block at a time, and how far ahead their
 * rows are prefetched */
#ifndef ATTN_HEADS_PF
#define ATTN_HEADS_PF 8
#endif
#ifndef ATTN_HEADS_VB
#define ATTN_HEADS_VB 4
#endif
#ifndef ATTN_HEADS_VPF
#define ATTN_HEADS_VPF 4
#endif
#ifndef HEADS_KHINT
#define HEADS_KHINT _MM_HINT_NTA
#endif
#ifndef HEADS_VHINT
#define HEADS_VHINT _MM_HINT_NTA
#endif

/* attn_heads_fn (ops.h): G heads' query groups over one chunk, position
 * by position through the heads, so that a token's K row (and V row) of
 * every head is read in address order; each head's scores, softmax and V
 * sums are those of attn_rows8 (scores_blk, softmax_rows, vsums8: the same
 * operations for every (row, position)), so its results are the same
 * bits. The V rows are requested while the scores are computed, so each
 * head's V sums find them in cache. */
TGT static inline __attribute__((always_inline)) void attn_heads8(const int HD, const int BF, int G, int nr, int n,
								  const float *const *q, const uint16_t *const *k,
								  const uint16_t *const *v, float scale,
								  float *const *ml, float *const *o, float *scratch)
{
	const int n16 = (n + 15) & ~15;
	const __m128 vs = _mm_set1_ps(scale);
	float *sc = scratch; /* G * nr x n16 scores, then weights */
	int lens[ATTN_HEADS_MAX_ROWS];

	for (int i = 0; i < G * nr; i++)
		lens[i] = n;
	for (int p0 = 0; p0 < n; p0 += 8) {
		for (int g = 0; g < G; g++) {
			if (p0 + ATTN_HEADS_PF + 8 <= n)
				UNROLL for (int i = 0; i < 8; i++)
					UNROLL for (int b = 0; b < HD * 2; b += 64)
						_mm_prefetch((const char *)(k[p0 + ATTN_HEADS_PF + i] + g * HD) + b, HEADS_KHINT);
			const float *const *qg = q + g * nr;
			float *sg = sc + (size_t)g * nr * n16;
			const float *qr[4];
			float *out[4];
			int r = 0;
			for (; nr - r >= 3; r += 4) {
				UNROLL for (int rr = 0; rr < 4; rr++) {
					int row = r + rr < nr ? r + rr : r;
					qr[rr] = qg[row];
					out[rr] = sg + (size_t)row * n16;
				}
				UNROLL for (int pp = 0; pp < 8; pp += 2)
					scores_blk(HD, BF, 4, 2, qr, k, g * HD, p0 + pp, n, vs, out, nr - r);
			}
			if (nr - r == 2) {
				UNROLL for (int rr = 0; rr < 2; rr++) {
					qr[rr] = qg[r + rr];
					out[rr] = sg + (size_t)(r + rr) * n16;
				}
				UNROLL for (int pp = 0; pp < 8; pp += 2)
					scores_blk(HD, BF, 2, 2, qr, k, g * HD, p0 + pp, n, vs, out, 2);
			} else if (nr - r == 1) {
				qr[0] = qg[r];
				out[0] = sg + (size_t)r * n16;
				scores_blk(HD, BF, 1, 8, qr, k, g * HD, p0, n, vs, out, 1);
			}
		}
	}
	softmax_rows(G * nr, lens, sc, n16, ml);
	for (int pb = 0; pb < n; pb += ATTN_HEADS_VB) {
		int pe = pb + ATTN_HEADS_VB < n ? pb + ATTN_HEADS_VB : n;
		for (int g = 0; g < G; g++) {
			const float *sg = sc + (size_t)g * nr * n16;
			float *const *og = o + g * nr;
			if (pb + ATTN_HEADS_VPF + ATTN_HEADS_VB <= n)
				UNROLL for (int i = 0; i < ATTN_HEADS_VB; i++)
					UNROLL for (int b = 0; b < HD * 2; b += 64)
						_mm_prefetch((const char *)(v[pb + ATTN_HEADS_VPF + i] + g * HD) + b, HEADS_VHINT);
			int r0 = 0;
			for (; nr - r0 >= 3; r0 += 4)
				vsums_blk(HD, BF, 4, 2, r0, nr - r0 < 4 ? nr - r0 : 4, v, g * HD, sg, n16, og, pb, pe);
			if (r0 < nr)
				vsums_blk(HD, BF, 2, 4, r0, nr - r0, v, g * HD, sg, n16, og, pb, pe);
		}
	}
}

#define HEADS_ENTRY(NAME, HD, BF)                                                                             \
	TGT static void NAME(int G, int nr, int n, const float *const *q, const uint16_t *const *k,             \
			     const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch) \
	{                                                                                                     \
		attn_heads8(HD, BF, G, nr, n, q, k, v, scale, ml, o, scratch);                                 \
	}
HEADS_ENTRY(attn_heads8_64, 64, 0)
HEADS_ENTRY(attn_heads8_128, 128, 0)
HEADS_ENTRY(attn_heads8_256, 256, 0)
HEADS_ENTRY(attn_heads8_bf16_64, 64, 1)
HEADS_ENTRY(attn_heads8_bf16_128, 128, 1)
HEADS_ENTRY(attn_heads8_bf16_256, 256, 1)

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

attn_heads_fn cpu_attn_heads_avx2(int hd, int bf16)
{
	if (!have_avx2())
		return NULL;
	if (bf16)
		return hd == 64 ? attn_heads8_bf16_64 : hd == 128 ? attn_heads8_bf16_128 : hd == 256 ? attn_heads8_bf16_256 : NULL;
	return hd == 64 ? attn_heads8_64 : hd == 128 ? attn_heads8_128 : hd == 256 ? attn_heads8_256 : NULL;
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

attn_heads_fn cpu_attn_heads_avx2(int hd, int bf16)
{
	(void)hd;
	(void)bf16;
	return NULL;
}
#endif
