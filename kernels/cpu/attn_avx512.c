/*
 * kernels/cpu/attn_avx512.c — one chunk of attention for a tile of query
 * rows with AVX-512: the rows of a KV head's query group, and in a prefill
 * several consecutive tokens of one sequence, share one pass over the
 * chunk's K and V rows (stored f16 in the pages).
 *
 * For each row r, over the first len[r] positions of the chunk:
 *   s_p = (q_r . k_p) * scale         16-lane FMAs over the head, then a
 *                                     fixed 16 -> 1 reduction tree
 *   m   = max s_p,  e_p = exp(s_p - m) (vector exp, below),
 *   l   = sum e_p  (16 lanes, then a fixed tree),
 *   o   = sum e_p v_p in position order, 16 lanes at a time.
 * K and V are read in place from the pages (no staging copy) and converted
 * in registers; a K row's conversion serves three query rows (two for head
 * size 128), a V row's up to six. Scores are computed four positions at a
 * time, but every (row, position) value goes through the same operations
 * whichever slot it occupies, and a row never uses positions past its own
 * length, so a row's result does not depend on the other rows of the tile
 * or on its place in it: a token's attention is bit-identical alone, in a
 * batch, or in a prefill tile.
 */
#include "ops.h"
#include "vexp.h"
#include "attn_util.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#define UNROLL _Pragma("GCC unroll 16")
/* K and V rows are prefetched this many positions ahead: the rows of a
 * chunk lie in several pages, where hardware prefetchers stop */
#ifndef ATTN_PF
#define ATTN_PF 16
#endif
/* and a tile of at most this many rows prefetches its whole chunk first */
#ifndef ATTN_PF_ALL_ROWS
#define ATTN_PF_ALL_ROWS 8
#endif
/* a tile of at least this many rows converts its chunk's K and V once */
#ifndef ATTN_STAGE_MIN_ROWS
#define ATTN_STAGE_MIN_ROWS 12
#endif

/* Level 1 and 2 of the reduction for positions a[0..3]: lanes i + 8, then
 * i + 4 are added in; 128-bit lane k of the result holds position k's four
 * partial sums (lane j: (a[i] + a[i + 8]) + (a[i + 4] + a[i + 12]), i = j). */
TGT static inline __m512 reduce4_half(const __m512 a[4])
{
	__m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xee));
	__m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xee));
	return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xdd));
}

/* Level 3 and 4 over four groups t[g] of reduce4_half (positions 4g + k):
 * partials (j = 0 + j = 2) + (j = 1 + j = 3), the same tree for every
 * position; out lane p = position p. */
TGT static inline __m512 reduce16_rest(const __m512 t[4])
{
	const __m512i ord = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
	__m512 u0 = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x44), _mm512_shuffle_ps(t[0], t[1], 0xee));
	__m512 u1 = _mm512_add_ps(_mm512_shuffle_ps(t[2], t[3], 0x44), _mm512_shuffle_ps(t[2], t[3], 0xee));
	__m512 w = _mm512_add_ps(_mm512_shuffle_ps(u0, u1, 0x88), _mm512_shuffle_ps(u0, u1, 0xdd));
	return _mm512_permutexvar_ps(ord, w);
}

/* Scores of nr rows against positions [0, max len): RS rows at a time share
 * each K row's conversion, 4 positions at a time share the first half of a
 * reduction, 16 its second half. Every position's score is the same tree
 * (lanes i + 8, i + 4, i + 2, i + 1 added in) whichever slot it occupies.
 * Slots past the longest row's end read the last position and are never
 * used (the scores rows are padded to 16). */
TGT static inline __attribute__((always_inline)) void scores_t(const int HD, const int RS, int nr,
							       const float *const *q, const int *len,
							       const uint16_t *const *k, const float *kf, int n,
							       float scale, float *sc, int ld)
{
	enum { MAXV = 16, MAXRS = 3, P = 4, G = 4 };
	const int V = HD / 16;
	const __m512 vscale = _mm512_set1_ps(scale);
	for (int r = 0; r < nr; r += RS) {
		__m512 qv[MAXRS][MAXV];
		int lr = 0;
		UNROLL for (int rr = 0; rr < RS; rr++) {
			int row = r + rr < nr ? r + rr : r;
			lr = len[row] > lr ? len[row] : lr;
			UNROLL for (int j = 0; j < V; j++)
				qv[rr][j] = _mm512_loadu_ps(q[row] + 16 * j);
		}
		for (int p16 = 0; p16 < lr; p16 += P * G) {
			__m512 t[MAXRS][G];
			UNROLL for (int g = 0; g < G; g++) {
				int p0 = p16 + P * g;
				__m512 acc[MAXRS][P];
				if (!kf && p0 + ATTN_PF + P <= n)
					UNROLL for (int i = 0; i < P; i++)
						UNROLL for (int b = 0; b < HD * 2; b += 64)
							_mm_prefetch((const char *)k[p0 + ATTN_PF + i] + b, _MM_HINT_T0);
				UNROLL for (int i = 0; i < P; i++) {
					const int pi = p0 + i < n ? p0 + i : n - 1;
					UNROLL for (int j = 0; j < V; j++) {
						__m512 kv = kf ? _mm512_loadu_ps(kf + (size_t)pi * HD + 16 * j)
							       : _mm512_cvtph_ps(_mm256_loadu_si256(
									 (const __m256i *)(k[pi] + 16 * j)));
						UNROLL for (int rr = 0; rr < RS; rr++)
							acc[rr][i] = j ? _mm512_fmadd_ps(qv[rr][j], kv, acc[rr][i]) : _mm512_mul_ps(qv[rr][0], kv);
					}
				}
				UNROLL for (int rr = 0; rr < RS; rr++)
					t[rr][g] = reduce4_half(acc[rr]);
			}
			UNROLL for (int rr = 0; rr < RS; rr++) {
				if (r + rr >= nr)
					continue;
				_mm512_storeu_ps(sc + (size_t)(r + rr) * ld + p16, _mm512_mul_ps(reduce16_rest(t[rr]), vscale));
			}
		}
	}
}

/* scores_t for a head too large for a row's query to stay in registers
 * (256): up to four rows share each K row's conversion, their query
 * vectors read from memory (L1) at each use. Every (row, position) score
 * is the same chain of multiply-adds and the same reduction tree as in
 * scores_t, whatever the rows beside it. */
TGT static inline __attribute__((always_inline)) void scores_wide(const int HD, int nr, const float *const *q,
								  const int *len, const uint16_t *const *k, int n,
								  float scale, float *sc, int ld)
{
	enum { RS = 4, P = 4, G = 4 };
	const int V = HD / 16;
	const __m512 vscale = _mm512_set1_ps(scale);
	for (int r = 0; r < nr; r += RS) {
		const float *qr[RS];
		int lr = 0;
		UNROLL for (int rr = 0; rr < RS; rr++) {
			int row = r + rr < nr ? r + rr : r;
			lr = len[row] > lr ? len[row] : lr;
			qr[rr] = q[row];
		}
		for (int p16 = 0; p16 < lr; p16 += P * G) {
			__m512 t[RS][G];
			for (int g = 0; g < G; g++) {
				int p0 = p16 + P * g;
				__m512 acc[RS][P];
				const uint16_t *kr[P];
				if (p0 + ATTN_PF + P <= n)
					UNROLL for (int i = 0; i < P; i++)
						UNROLL for (int b = 0; b < HD * 2; b += 64)
							_mm_prefetch((const char *)k[p0 + ATTN_PF + i] + b, _MM_HINT_T0);
				UNROLL for (int i = 0; i < P; i++)
					kr[i] = k[p0 + i < n ? p0 + i : n - 1];
				UNROLL for (int j = 0; j < V; j++) {
					__m512 kv[P];
					UNROLL for (int i = 0; i < P; i++)
						kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr[i] + 16 * j)));
					UNROLL for (int rr = 0; rr < RS; rr++) {
						__m512 qv = _mm512_loadu_ps(qr[rr] + 16 * j);
						UNROLL for (int i = 0; i < P; i++)
							acc[rr][i] = j ? _mm512_fmadd_ps(qv, kv[i], acc[rr][i]) : _mm512_mul_ps(qv, kv[i]);
					}
				}
				UNROLL for (int rr = 0; rr < RS; rr++)
					t[rr][g] = reduce4_half(acc[rr]);
			}
			UNROLL for (int rr = 0; rr < RS; rr++) {
				if (r + rr >= nr)
					continue;
				_mm512_storeu_ps(sc + (size_t)(r + rr) * ld + p16, _mm512_mul_ps(reduce16_rest(t[rr]), vscale));
			}
		}
	}
}


/* Position p's V row as floats into vv (vf: the staged rows, else the f16
 * row converted, the row ATTN_PF ahead requested while pe allows) */
TGT static inline __attribute__((always_inline)) void v_row(const int HD, int p, int pe, const uint16_t *const *v,
							    const float *vf, __m512 *vv)
{
	if (!vf && p + ATTN_PF < pe)
		UNROLL for (int b = 0; b < HD * 2; b += 64)
			_mm_prefetch((const char *)v[p + ATTN_PF] + b, _MM_HINT_T0);
	UNROLL for (int j = 0; j < HD / 16; j++)
		vv[j] = vf ? _mm512_loadu_ps(vf + (size_t)p * HD + 16 * j)
			   : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v[p] + 16 * j)));
}

/* acc[rr] += e[rr][p] * v[p] for positions [p0, p1) and rows rr < NT (all
 * RT rows when NT is 0), V rows converted once per position. */
TGT static inline __attribute__((always_inline)) void pv_rows(const int HD, const int RT, const int NT, int p0,
							      int p1, int pe, const uint16_t *const *v, const float *vf,
							      const float *e0, int n16, __m512 acc[][16])
{
	enum { MAXV = 16 };
	const int V = HD / 16;
	for (int p = p0; p < p1; p++) {
		__m512 vv[MAXV];
		v_row(HD, p, pe, v, vf, vv);
		UNROLL for (int rr = 0; rr < RT; rr++) {
			if (NT && rr >= NT)
				break;
			__m512 e = _mm512_set1_ps(e0[(size_t)rr * n16 + p]);
			UNROLL for (int j = 0; j < V; j++)
				acc[rr][j] = _mm512_fmadd_ps(e, vv[j], acc[rr][j]);
		}
	}
}

/* acc[rr] += e[rr][p] * vv for the rows rr < nt of R whose length takes in
 * position p (len: the rows' lengths, e0: their weights, n16 apart) */
TGT static inline __attribute__((always_inline)) void acc_rows_at(const int R, const int NV, int nt, int p,
								  const int *len, const float *e0, int n16,
								  const __m512 *vv, __m512 acc[][16])
{
	UNROLL for (int rr = 0; rr < R; rr++) {
		if (rr < nt && p < len[rr]) {
			__m512 e = _mm512_set1_ps(e0[(size_t)rr * n16 + p]);
			UNROLL for (int j = 0; j < NV; j++)
				acc[rr][j] = _mm512_fmadd_ps(e, vv[j], acc[rr][j]);
		}
	}
}

/* o[r] = sum e[r][p] v[p] for the nr rows, for a head too large for a
 * row's accumulators and a V row's conversion to stay in registers (256):
 * a quarter of the head (64 lanes) at a time, so that one conversion of
 * a V row's quarter serves up to RQ rows. Each output lane is the same
 * chain of multiply-adds over positions in order as in pv_rows. */
TGT static inline __attribute__((always_inline)) void pv_quarters(const int HD, int nr, const int *len,
								  const uint16_t *const *v, const float *sc,
								  int n16, float *const *o)
{
	enum { RQ = 4, VQ = 4 };
	for (int r0 = 0; r0 < nr; r0 += RQ) {
		int nt = nr - r0 < RQ ? nr - r0 : RQ, pe = 0, pc = 1 << 30;
		for (int rr = 0; rr < nt; rr++) {
			pe = len[r0 + rr] > pe ? len[r0 + rr] : pe;
			pc = len[r0 + rr] < pc ? len[r0 + rr] : pc;
		}
		const float *e0 = sc + (size_t)r0 * n16;
		for (int d0 = 0; d0 < HD; d0 += 16 * VQ) {
			__m512 acc[RQ][16]; /* (VQ of 16 used) */
			UNROLL for (int rr = 0; rr < RQ; rr++) UNROLL for (int j = 0; j < VQ; j++) acc[rr][j] = _mm512_setzero_ps();
			for (int p = 0; p < pe; p++) {
				__m512 vv[VQ];
				if (p + ATTN_PF < pe)
					_mm_prefetch((const char *)(v[p + ATTN_PF] + d0), _MM_HINT_T0),
						_mm_prefetch((const char *)(v[p + ATTN_PF] + d0) + 64, _MM_HINT_T0);
				UNROLL for (int j = 0; j < VQ; j++)
					vv[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v[p] + d0 + 16 * j)));
				if (nt == RQ && p < pc) {
					UNROLL for (int rr = 0; rr < RQ; rr++) {
						__m512 e = _mm512_set1_ps(e0[(size_t)rr * n16 + p]);
						UNROLL for (int j = 0; j < VQ; j++)
							acc[rr][j] = _mm512_fmadd_ps(e, vv[j], acc[rr][j]);
					}
				} else {
					acc_rows_at(RQ, VQ, nt, p, len + r0, e0, n16, vv, acc);
				}
			}
			UNROLL for (int rr = 0; rr < RQ; rr++)
				if (rr < nt)
					UNROLL for (int j = 0; j < VQ; j++)
						_mm512_storeu_ps(o[r0 + rr] + d0 + 16 * j, acc[rr][j]);
		}
	}
}

/* o[r] = sum e[r][p] v[p] for the nr rows (weights e in sc, rows n16
 * apart), RT rows at a time (vf: the V rows as floats, else converted per
 * position). */
TGT static inline __attribute__((always_inline)) void pv_all(const int HD, const int RT, int nr, const int *len,
							     int n, const uint16_t *const *v, const float *vf,
							     const float *sc, int n16, float *const *o)
{
	enum { MAXV = 16 };
	const int V = HD / 16;
	for (int r0 = 0; r0 < nr; r0 += RT) {
		__m512 acc[6][MAXV];
		int nt = nr - r0 < RT ? nr - r0 : RT, pe = 0, pc = n;
		for (int rr = 0; rr < nt; rr++) {
			pe = len[r0 + rr] > pe ? len[r0 + rr] : pe;
			pc = len[r0 + rr] < pc ? len[r0 + rr] : pc;
		}
		const float *e0 = sc + (size_t)r0 * n16;
		UNROLL for (int rr = 0; rr < RT; rr++) UNROLL for (int j = 0; j < V; j++) acc[rr][j] = _mm512_setzero_ps();
		/* positions every row of the group uses: no per-position tests
		 * (a full group without per-row tests either) */
		if (nt == RT)
			pv_rows(HD, RT, 0, 0, pc, pe, v, vf, e0, n16, acc);
		else
			pv_rows(HD, RT, nt, 0, pc, pe, v, vf, e0, n16, acc);
		for (int p = pc; p < pe; p++) {
			__m512 vv[MAXV];
			v_row(HD, p, pe, v, vf, vv);
			acc_rows_at(RT, V, nt, p, len + r0, e0, n16, vv, acc);
		}
		UNROLL for (int rr = 0; rr < RT; rr++)
			if (rr < nt)
				UNROLL for (int j = 0; j < V; j++)
					_mm512_storeu_ps(o[r0 + rr] + 16 * j, acc[rr][j]);
	}
}

/* HD (head size) is 64, 128 or 256; RS rows share each K row's conversion,
 * RT rows each V row's (256: pv_quarters instead). */
TGT static inline __attribute__((always_inline)) void attn_rows_t(const int HD, const int RS, const int RT, int nr,
								  const float *const *q, const int *len,
								  const uint16_t *const *k, const uint16_t *const *v,
								  float scale, float *const *ml, float *const *o,
								  float *scratch)
{
	enum { MAXV = 16 };
	const int V = HD / 16;
	int n = 0;
	for (int r = 0; r < nr; r++)
		n = len[r] > n ? len[r] : n;
	const int n16 = (n + 15) & ~15;
	float *sc = scratch; /* nr x n16 scores, then weights */
	/* a prefill tile's many rows: the chunk's K and V rows converted to
	 * floats once (ATTN_STAGE_FLOATS of the scratch, past the scores),
	 * where each K row's conversion otherwise served RS rows and each V
	 * row's RT: for 48 rows of 128 those conversions took 28 % of the
	 * kernel's time. The same values (the conversion is exact), the same
	 * operations on them: the same bits. */
	float *kf = NULL, *vf = NULL;
	if (HD != 256 && nr >= ATTN_STAGE_MIN_ROWS && n <= 128) {
		kf = scratch + (size_t)nr * 128;
		vf = kf + (size_t)128 * HD;
		for (int p = 0; p < n; p++) {
			if (p + ATTN_PF < n)
				UNROLL for (int b = 0; b < HD * 2; b += 64) {
					_mm_prefetch((const char *)k[p + ATTN_PF] + b, _MM_HINT_T0);
					_mm_prefetch((const char *)v[p + ATTN_PF] + b, _MM_HINT_T0);
				}
			UNROLL for (int j = 0; j < V; j++) {
				_mm512_storeu_ps(kf + (size_t)p * HD + 16 * j,
						 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k[p] + 16 * j))));
				_mm512_storeu_ps(vf + (size_t)p * HD + 16 * j,
						 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v[p] + 16 * j))));
			}
		}
	}

	/* few rows (a decode's query group): the chunk's K and V rows, in
	 * pages all over memory, are requested into L2 at once, so their
	 * misses overlap instead of each waiting out the short distance of
	 * the prefetches below (a prefill tile finds them there already) */
	if (nr <= ATTN_PF_ALL_ROWS) {
		for (int p = 0; p < n; p++)
			UNROLL for (int b = 0; b < HD * 2; b += 64)
				_mm_prefetch((const char *)k[p] + b, _MM_HINT_T1);
		for (int p = 0; p < n; p++)
			UNROLL for (int b = 0; b < HD * 2; b += 64)
				_mm_prefetch((const char *)v[p] + b, _MM_HINT_T1);
	}

	if (HD == 256)
		scores_wide(HD, nr, q, len, k, n, scale, sc, n16);
	else
		scores_t(HD, RS, nr, q, len, k, kf, n, scale, sc, n16);

	for (int r = 0; r < nr; r++) {
		float *s = sc + (size_t)r * n16;
		__m512 mx = _mm512_set1_ps(-INFINITY);
		for (int p0 = 0; p0 < len[r]; p0 += 16)
			mx = _mm512_mask_max_ps(mx, attn_tail_mask(len[r] - p0), mx, _mm512_loadu_ps(s + p0));
		float M = _mm512_reduce_max_ps(mx);
		__m512 vm = _mm512_set1_ps(M), sum = _mm512_setzero_ps();
		for (int p0 = 0; p0 < len[r]; p0 += 16) {
			__m512 e = _mm512_maskz_mov_ps(attn_tail_mask(len[r] - p0), exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + p0), vm)));
			_mm512_storeu_ps(s + p0, e);
			sum = _mm512_add_ps(sum, e);
		}
		ml[r][0] = M;
		ml[r][1] = attn_hsum16(sum);
	}

	if (HD == 256) {
		pv_quarters(HD, nr, len, v, sc, n16, o);
		return;
	}
	pv_all(HD, RT, nr, len, n, v, vf, sc, n16, o);
}

TGT static void attn_rows_64(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			     const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	attn_rows_t(64, 3, 6, nr, q, len, k, v, scale, ml, o, scratch);
}

TGT static void attn_rows_128(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			      const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	attn_rows_t(128, 2, 2, nr, q, len, k, v, scale, ml, o, scratch);
}

/* head size 256 (Gemma 3): a row's query fills 16 registers, so scores one
 * row at a time; V rows by quarters for four rows (pv_quarters) */
TGT static void attn_rows_256(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			      const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	attn_rows_t(256, 1, 1, nr, q, len, k, v, scale, ml, o, scratch);
}

attn_rows_fn cpu_attn_rows_avx512(int hd)
{
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq") ||
	    !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") ||
	    !__builtin_cpu_supports("f16c") || !__builtin_cpu_supports("fma"))
		return NULL;
	return hd == 64 ? attn_rows_64 : hd == 128 ? attn_rows_128 : hd == 256 ? attn_rows_256 : NULL;
}
#else
/* head size 256 (Gemma 3): a row's query and accumulator fill 16 registers
 * each, so one row at a time */
TGT static void attn_rows_256(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			      const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch)
{
	attn_rows_t(256, 1, 1, nr, q, len, k, v, scale, ml, o, scratch);
}

attn_rows_fn cpu_attn_rows_avx512(int hd)
{
	(void)hd;
	return NULL;
}
#endif
