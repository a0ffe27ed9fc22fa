/*
 * kernels/cpu/kvq_int8.c — attention scores over q8_0 and q4_0 K rows with
 * integer products, and their softmax (the weighted V sums over those
 * rows: kvq_vsum.c).
 *
 * A score is q . k for a query row q (floats) and a K row k (blocks of 32
 * quants with an f16 scale). Converting every K block to floats costs
 * more than reading it, so, as llama.cpp does, the query is quantized
 * once per block to int8 with one float scale (cpu_kvq_quant_query), each
 * block's dot is an exact integer sum, and only the per-block scaling is
 * float (kvquant.h states the arithmetic). Integer sums are exact in any
 * order, so each instruction set sums its way and every version gives the
 * same bits:
 *   - portable C, one product at a time;
 *   - AVX2: _mm256_maddubs_epi16 over |k| and q carrying k's sign (q8_0)
 *     or over the unsigned nibbles (q4_0, minus 8 sum(q) after);
 *   - AVX-512 VNNI: 16 positions at a time, their K blocks transposed so
 *     that lane p of register m holds bytes 4m..4m+3 of position p; then
 *     _mm512_dpbusd_epi32 against the query's dword m broadcast gives a
 *     position per lane with no horizontal sums. q8_0 K is signed, so the
 *     query goes in unsigned as q + 128 and 128 sum(k) (one dpbusd per K
 *     register, shared by all rows) is taken off; q4_0 K is unsigned (its
 *     nibbles) and the query signed, minus 8 sum(q) per block.
 * The float part (the per-block scale and the running sum over blocks) is
 * the same operations in all three, vectorised over positions.
 *
 * A step quantizes its query rows once (kvq_quant_fn, attention.c) and the
 * scores of every chunk take them as they are (kvq_scores_i8_fn): a decode
 * at depth 8,192 has 64 chunks a head. The float-row entry points quantize
 * and call the same code. A decode's query group (4 rows or fewer) keeps
 * each row's running sum over blocks in a register with AVX-512.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvq_int8.h"
#include "ops.h"

#define QB KVD_KV_QBLOCK
#define QROWS 16 /* query rows quantized at a time */
#define MAXB (KVQ_INT8_MAX_HD / QB)
#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")


void cpu_kvq_quant_query(const float *x, int n, int8_t *qs, float *d, int32_t *sum)
{
	for (int b = 0; b < n / QB; b++) {
		const float *xb = x + b * QB;
		float amax = 0;
		int32_t s = 0;
		for (int i = 0; i < QB; i++) {
			float a = fabsf(xb[i]);
			if (a > amax)
				amax = a;
		}
		float db = amax / 127.0f, id = db != 0 ? 1.0f / db : 0.0f;
		for (int i = 0; i < QB; i++) {
			float v = xb[i] * id;
			/* roundf(v) (ties away from zero) without the call: v minus
			 * its truncation is exact; NaN (a broken model) gives 0 */
			v = v == v ? (v > 128.0f ? 128.0f : v < -128.0f ? -128.0f : v) : 0.0f;
			int q = (int)v;
			float f = v - (float)q;
			q += f >= 0.5f ? 1 : f <= -0.5f ? -1 : 0;
			q = q > 127 ? 127 : q < -127 ? -127 : q;
			qs[b * QB + i] = (int8_t)q;
			s += q;
		}
		d[b] = db;
		sum[b] = s;
	}
}

static void quant_rows(const float *const *q, int m, int hd, struct kvq_qrow *qr)
{
	for (int r = 0; r < m; r++) {
		cpu_kvq_quant_query(q[r], hd, qr[r].qs, qr[r].d, qr[r].sum);
		for (int i = 0; i < hd; i++)
			qr[r].qu[i] = (uint8_t)(qr[r].qs[i] + 128);
	}
}

/* The float-row entry points: the rows quantized QROWS at a time, then the
 * integer products (scores_i8, an i8 version below) */
typedef void (*quant_rows_fn)(const float *const *q, int m, int hd, struct kvq_qrow *qr);
static void scores_via(quant_rows_fn quant, kvq_scores_i8_fn i8, enum kvd_kv_type t, const float *const *q, int nr,
		       const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc)
{
	struct kvq_qrow qr[QROWS];
	const struct kvq_qrow *qp[QROWS];
	for (int r = 0; r < QROWS; r++)
		qp[r] = &qr[r];
	for (int r0 = 0; r0 < nr; r0 += QROWS) {
		int m = nr - r0 < QROWS ? nr - r0 : QROWS;
		quant(q + r0, m, hd, qr);
		i8(t, qp, m, k, n, hd, scale, sc + (size_t)r0 * ldsc, ldsc);
	}
}

/* kvq_quant_fn over nr rows at x (stride hd) through a quant_rows_fn */
static void quant_via(quant_rows_fn quant, const float *x, int nr, int hd, struct kvq_qrow *out)
{
	const float *q[QROWS];
	for (int r0 = 0; r0 < nr; r0 += QROWS) {
		int m = nr - r0 < QROWS ? nr - r0 : QROWS;
		for (int r = 0; r < m; r++)
			q[r] = x + (size_t)(r0 + r) * hd;
		quant(q, m, hd, out + r0);
	}
}

void cpu_kvq8_quant_generic(const float *x, int nr, int hd, struct kvq_qrow *out)
{
	quant_via(quant_rows, x, nr, hd, out);
}

/* block b's integer dot: sum_i q_i k_i over the stored quants (q4_0: the
 * nibble minus 8) */
static int32_t idot_generic(enum kvd_kv_type t, const uint8_t *blk, const int8_t *q)
{
	int32_t s = 0;
	if (t == KVD_KV_Q8_0) {
		for (int i = 0; i < QB; i++)
			s += (int32_t)q[i] * (int8_t)blk[2 + i];
		return s;
	}
	for (int j = 0; j < QB / 2; j++)
		s += (int32_t)q[j] * ((blk[2 + j] & 15) - 8) + (int32_t)q[j + QB / 2] * ((blk[2 + j] >> 4) - 8);
	return s;
}

void cpu_kvq8_scores_i8_generic(enum kvd_kv_type t, const struct kvq_qrow *const *qr, int nr,
				const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc)
{
	size_t bb = kvq8_blk_bytes(t);
	int nb = hd / QB;

	for (int r = 0; r < nr; r++)
		for (int p = 0; p < n; p++) {
			float acc = 0;
			for (int b = 0; b < nb; b++) {
				const uint8_t *blk = k[p] + (size_t)b * bb;
				float dd = qr[r]->d[b] * cpu_kvq_h2f(blk);
				acc = fmaf(dd, (float)idot_generic(t, blk, qr[r]->qs + b * QB), acc);
			}
			sc[(size_t)r * ldsc + p] = acc * scale;
		}
}

void cpu_kvq8_scores_generic(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			     int hd, float scale, float *sc, int ldsc)
{
	scores_via(quant_rows, cpu_kvq8_scores_i8_generic, t, q, nr, k, n, hd, scale, sc, ldsc);
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* the 8 positions' integer dots of one row, from their 8-lane partials */
AVX2 INLINE __m256i hsum8x8_epi32(const __m256i *a)
{
	__m256i h01 = _mm256_hadd_epi32(a[0], a[1]), h23 = _mm256_hadd_epi32(a[2], a[3]);
	__m256i h45 = _mm256_hadd_epi32(a[4], a[5]), h67 = _mm256_hadd_epi32(a[6], a[7]);
	__m256i g0 = _mm256_hadd_epi32(h01, h23), g1 = _mm256_hadd_epi32(h45, h67);
	return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* K block as 32 unsigned bytes and what to apply to q: q8_0 |k| (q takes
 * k's sign), q4_0 the nibbles in element order */
AVX2 INLINE __m256i k_bytes_avx2(enum kvd_kv_type t, const uint8_t *blk)
{
	if (t == KVD_KV_Q8_0)
		return _mm256_loadu_si256((const __m256i *)(blk + 2));
	__m128i x = _mm_loadu_si128((const __m128i *)(blk + 2)), m = _mm_set1_epi8(15);
	return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

/* cpu_kvq_quant_query with AVX2, the same operations on 8 lanes (so the
 * same bits; amax ignores NaN as the scalar comparison does), and qu =
 * qs + 128 (which the AVX-512 scores read) */
AVX2 static void quant_rows_avx2(const float *const *q, int m, int hd, struct kvq_qrow *qr)
{
	const __m256 lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(128.0f), half = _mm256_set1_ps(0.5f);
	const __m256 mhalf = _mm256_set1_ps(-0.5f), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256i q127 = _mm256_set1_epi32(127), qm127 = _mm256_set1_epi32(-127);
	for (int r = 0; r < m; r++)
		for (int b = 0; b < hd / QB; b++) {
			__m256 x[4], amax8 = _mm256_setzero_ps();
			UNROLL for (int j = 0; j < 4; j++) {
				x[j] = _mm256_loadu_ps(q[r] + b * QB + 8 * j);
				__m256 a = _mm256_and_ps(x[j], absm);
				/* max_ps returns its second operand when either is NaN */
				amax8 = _mm256_max_ps(a, amax8);
			}
			__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
			m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
			m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
			float amax = _mm_cvtss_f32(m4);
			float db = amax / 127.0f, id = db != 0 ? 1.0f / db : 0.0f;
			__m256i sum = _mm256_setzero_si256(), qi[4];
			UNROLL for (int j = 0; j < 4; j++) {
				__m256 v = _mm256_mul_ps(x[j], _mm256_set1_ps(id));
				v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
				v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
				__m256i t = _mm256_cvttps_epi32(v);
				__m256 f = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
				/* the compare masks are -1 where true */
				t = _mm256_sub_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(f, half, _CMP_GE_OQ)));
				t = _mm256_add_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(f, mhalf, _CMP_LE_OQ)));
				qi[j] = _mm256_min_epi32(_mm256_max_epi32(t, qm127), q127);
				sum = _mm256_add_epi32(sum, qi[j]);
			}
			/* 32 int32 to 32 int8 in element order: the packs work per
			 * 128-bit lane, a dword permutation puts them back */
			__m256i w = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
			w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
			_mm256_storeu_si256((__m256i *)(qr[r].qs + b * QB), w);
			_mm256_storeu_si256((__m256i *)(qr[r].qu + b * QB), _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)));
			__m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
			s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
			s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
			qr[r].d[b] = db;
			qr[r].sum[b] = _mm_cvtsi128_si32(s4);
		}
}

/* The f16 scales (the first two bytes) of 8 blocks as floats (exact). */
AVX2 INLINE __m256 scales8_avx2(const uint8_t *const *blk, size_t off)
{
#define H16(j) (short)(blk[j][off] | blk[j][off + 1] << 8)
	return _mm256_cvtph_ps(_mm_setr_epi16(H16(0), H16(1), H16(2), H16(3), H16(4), H16(5), H16(6), H16(7)));
#undef H16
}

/* Rows r0 .. r0 + NR - 1 (NR <= 4, compile-time) of qr against positions
 * [0, n), eight at a time: each position's unsigned operand (q8_0 |k|, q4_0
 * the nibbles) is formed once for the rows, in L1 scratch, the rows'
 * accumulators stay in registers. */
AVX2 INLINE void scores_rows_avx2(const int NR, enum kvd_kv_type t, const struct kvq_qrow *const *qr, int r0,
				  const unsigned char *const *k, int n, int nb, float scale, float *sc, int ldsc)
{
	const size_t bb = kvq8_blk_bytes(t);
	const __m256i ones = _mm256_set1_epi16(1);
	const __m256 vscale = _mm256_set1_ps(scale);
	_Alignas(32) uint8_t ku[8][32];
	_Alignas(32) int8_t ks[8][32];

	for (int i0 = 0; i0 < n; i0 += 8) {
		int cnt = n - i0 < 8 ? n - i0 : 8;
		const uint8_t *kr[8];
		UNROLL for (int j = 0; j < 8; j++)
			kr[j] = k[i0 + j < n ? i0 + j : n - 1];
		for (int j = 0; j < 8 && i0 + j + 16 < n; j++)
			_mm_prefetch((const char *)k[i0 + j + 16], _MM_HINT_T0),
				_mm_prefetch((const char *)k[i0 + j + 16] + 64, _MM_HINT_T0);
		__m256 acc[4];
		UNROLL for (int r = 0; r < NR; r++)
			acc[r] = _mm256_setzero_ps();
		for (int b = 0; b < nb; b++) {
			UNROLL for (int j = 0; j < 8; j++) {
				__m256i kb = k_bytes_avx2(t, kr[j] + (size_t)b * bb);
				_mm256_store_si256((__m256i *)ku[j], t == KVD_KV_Q8_0 ? _mm256_sign_epi8(kb, kb) : kb);
				if (t == KVD_KV_Q8_0)
					_mm256_store_si256((__m256i *)ks[j], kb);
			}
			__m256 vdk = scales8_avx2(kr, (size_t)b * bb);
			UNROLL for (int r = 0; r < NR; r++) {
				const struct kvq_qrow *q = qr[r0 + r];
				__m256i qv = _mm256_loadu_si256((const __m256i *)(q->qs + b * QB)), part[8];
				UNROLL for (int j = 0; j < 8; j++) {
					__m256i u = _mm256_load_si256((const __m256i *)ku[j]);
					__m256i sq = t == KVD_KV_Q8_0
						     ? _mm256_sign_epi8(qv, _mm256_load_si256((const __m256i *)ks[j]))
						     : qv;
					part[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, sq), ones);
				}
				__m256i is = hsum8x8_epi32(part);
				if (t == KVD_KV_Q4_0)
					is = _mm256_sub_epi32(is, _mm256_set1_epi32(8 * q->sum[b]));
				__m256 dd = _mm256_mul_ps(_mm256_set1_ps(q->d[b]), vdk);
				acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(is), acc[r]);
			}
		}
		UNROLL for (int r = 0; r < NR; r++) {
			__m256 o = _mm256_mul_ps(acc[r], vscale);
			float *dst = sc + (size_t)(r0 + r) * ldsc + i0;
			if (cnt == 8) {
				_mm256_storeu_ps(dst, o);
			} else {
				float tmp[8];
				_mm256_storeu_ps(tmp, o);
				memcpy(dst, tmp, sizeof(float) * (size_t)cnt);
			}
		}
	}
}

AVX2 void cpu_kvq8_scores_i8_avx2(enum kvd_kv_type t, const struct kvq_qrow *const *qr, int nr,
				  const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc)
{
	int nb = hd / QB;
	for (int r = 0; r < nr; r += 4) {
		int left = nr - r;
		if (left >= 4)
			scores_rows_avx2(4, t, qr, r, k, n, nb, scale, sc, ldsc);
		else if (left == 3)
			scores_rows_avx2(3, t, qr, r, k, n, nb, scale, sc, ldsc);
		else if (left == 2)
			scores_rows_avx2(2, t, qr, r, k, n, nb, scale, sc, ldsc);
		else
			scores_rows_avx2(1, t, qr, r, k, n, nb, scale, sc, ldsc);
	}
}

AVX2 void cpu_kvq8_scores_avx2(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			  int hd, float scale, float *sc, int ldsc)
{
	scores_via(quant_rows_avx2, cpu_kvq8_scores_i8_avx2, t, q, nr, k, n, hd, scale, sc, ldsc);
}

void cpu_kvq8_quant_avx2(const float *x, int nr, int hd, struct kvq_qrow *out)
{
	quant_via(quant_rows_avx2, x, nr, hd, out);
}

#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* One stage of the 16 x 8 (or 16 x 4) dword transpose: registers a and
 * a | 1 << s trade lane bit s for register bit s. */
A512 INLINE void tstage(__m512i *z, int nreg, int s, __m512i i0, __m512i i1)
{
	UNROLL for (int a = 0; a < nreg; a++) {
		if (a & (1 << s))
			continue;
		__m512i A = z[a], B = z[a | (1 << s)];
		z[a] = _mm512_permutex2var_epi32(A, i0, B);
		z[a | (1 << s)] = _mm512_permutex2var_epi32(A, i1, B);
	}
}

/* cpu_kvq_quant_query with AVX-512, the same operations on 16 lanes (so
 * the same bits; amax ignores NaN as the scalar comparison does), and
 * qu = qs + 128 */
A512 static void quant_rows_avx512(const float *const *q, int m, int hd, struct kvq_qrow *qr)
{
	const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(128.0f), half = _mm512_set1_ps(0.5f);
	const __m512 mhalf = _mm512_set1_ps(-0.5f);
	const __m512i one = _mm512_set1_epi32(1), q127 = _mm512_set1_epi32(127), qm127 = _mm512_set1_epi32(-127);
	for (int r = 0; r < m; r++)
		for (int b = 0; b < hd / QB; b++) {
			__m512 x[2] = {_mm512_loadu_ps(q[r] + b * QB), _mm512_loadu_ps(q[r] + b * QB + 16)};
			__m512 a0 = _mm512_abs_ps(x[0]), a1 = _mm512_abs_ps(x[1]);
			a0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a0, a0, _CMP_ORD_Q), a0);
			a1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a1, a1, _CMP_ORD_Q), a1);
			float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
			float db = amax / 127.0f, id = db != 0 ? 1.0f / db : 0.0f;
			__m512i sum = _mm512_setzero_si512();
			for (int h = 0; h < 2; h++) {
				__m512 v = _mm512_mul_ps(x[h], _mm512_set1_ps(id));
				v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
				v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
				__m512i qi = _mm512_cvttps_epi32(v);
				__m512 f = _mm512_sub_ps(v, _mm512_cvtepi32_ps(qi));
				qi = _mm512_mask_add_epi32(qi, _mm512_cmp_ps_mask(f, half, _CMP_GE_OQ), qi, one);
				qi = _mm512_mask_sub_epi32(qi, _mm512_cmp_ps_mask(f, mhalf, _CMP_LE_OQ), qi, one);
				qi = _mm512_min_epi32(_mm512_max_epi32(qi, qm127), q127);
				sum = _mm512_add_epi32(sum, qi);
				__m128i b8 = _mm512_cvtepi32_epi8(qi);
				_mm_storeu_si128((__m128i *)(qr[r].qs + b * QB + 16 * h), b8);
				_mm_storeu_si128((__m128i *)(qr[r].qu + b * QB + 16 * h), _mm_xor_si128(b8, _mm_set1_epi8((char)0x80)));
			}
			qr[r].d[b] = db;
			qr[r].sum[b] = _mm512_reduce_add_epi32(sum);
		}
}

/* The 16 positions' K rows kr, block b as 8 registers: lane p of z[m]
 * holds bytes 4m..4m+3 of position p's block (q4_0: z[m] the low
 * nibbles' bytes 4m.., z[4 + m] the high ones', as bytes 0..15); corr the
 * positions' sums 128 sum(k) (q8_0) */
A512 INLINE void k_block16(const int Q8, const uint8_t *const *kr, int b, size_t bb, const __m512i *ix0,
			   const __m512i *ix1, __m512i z[8], __m512i *corr)
{
	const __m512i c128 = _mm512_set1_epi32((int)0x80808080u), nib = _mm512_set1_epi32(0x0f0f0f0f);
	if (Q8) {
		/* z[j]: position j in lanes 0-7, j + 8 in lanes 8-15 */
		UNROLL for (int j = 0; j < 8; j++)
			z[j] = _mm512_inserti64x4(
				_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(kr[j] + (size_t)b * bb + 2))),
				_mm256_loadu_si256((const __m256i *)(kr[j + 8] + (size_t)b * bb + 2)), 1);
		UNROLL for (int s = 0; s < 3; s++)
			tstage(z, 8, s, ix0[s], ix1[s]);
		/* two chains: the sum is exact whatever its order */
		__m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
		UNROLL for (int j = 0; j < 8; j += 2) {
			c0 = _mm512_dpbusd_epi32(c0, c128, z[j]);
			c1 = _mm512_dpbusd_epi32(c1, c128, z[j + 1]);
		}
		*corr = _mm512_add_epi32(c0, c1);
		return;
	}
	/* z[j]: positions j, j + 4, j + 8, j + 12 by 128-bit lane */
	UNROLL for (int j = 0; j < 4; j++) {
		__m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(kr[j] + (size_t)b * bb + 2)));
		x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(kr[j + 4] + (size_t)b * bb + 2)), 1);
		x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(kr[j + 8] + (size_t)b * bb + 2)), 2);
		z[j] = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(kr[j + 12] + (size_t)b * bb + 2)), 3);
	}
	UNROLL for (int s = 0; s < 2; s++)
		tstage(z, 4, s, ix0[s], ix1[s]);
	/* elements 4m.. (low nibbles), 16 + 4m.. (high) */
	UNROLL for (int j = 0; j < 4; j++) {
		z[4 + j] = _mm512_and_si512(_mm512_srli_epi32(z[j], 4), nib);
		z[j] = _mm512_and_si512(z[j], nib);
	}
	*corr = _mm512_setzero_si512();
}

/* Row qr's integer dots of block b with the 16 positions of z (k_block16) */
A512 INLINE __m512i row_idots16(const int Q8, const struct kvq_qrow *qr, int b, const __m512i z[8], __m512i corr)
{
	__m512i a0, a1 = _mm512_setzero_si512();
	const int32_t *qd;
	if (Q8) {
		qd = (const int32_t *)(const void *)(qr->qu + b * QB);
		a0 = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
		UNROLL for (int j = 0; j < 8; j += 2) {
			a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(qd[j]), z[j]);
			a1 = _mm512_dpbusd_epi32(a1, _mm512_set1_epi32(qd[j + 1]), z[j + 1]);
		}
	} else {
		qd = (const int32_t *)(const void *)(qr->qs + b * QB);
		a0 = _mm512_set1_epi32(-8 * qr->sum[b]);
		UNROLL for (int j = 0; j < 8; j += 2) {
			a0 = _mm512_dpbusd_epi32(a0, z[j], _mm512_set1_epi32(qd[j]));
			a1 = _mm512_dpbusd_epi32(a1, z[j + 1], _mm512_set1_epi32(qd[j + 1]));
		}
	}
	return _mm512_add_epi32(a0, a1);
}

/* The 16 positions' block scales (f16 at the start of each block b) as
 * floats; off_lo/off_hi: the rows' offsets from kr[0] */
A512 INLINE __m512 k_scales16(const uint8_t *const *kr, int b, size_t bb, __m512i off_lo, __m512i off_hi)
{
	const uint8_t *b0 = kr[0] + (size_t)b * bb;
	__m256i g_lo = _mm512_i64gather_epi32(off_lo, (const void *)b0, 1);
	__m256i g_hi = _mm512_i64gather_epi32(off_hi, (const void *)b0, 1);
	return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(g_lo), g_hi, 1)));
}

/* Positions i0 .. i0 + 15 of the n K rows k (rb bytes each; past n, the
 * last row again) into kr, the next 16 rows requested into L1, and the
 * rows' offsets from kr[0] (k_scales16's gather); returns the mask of the
 * positions that exist */
A512 INLINE __mmask16 k_rows16(const unsigned char *const *k, int n, int i0, size_t rb, const uint8_t **kr,
			       __m512i *off_lo, __m512i *off_hi)
{
	int cnt = n - i0 < 16 ? n - i0 : 16;
	for (int j = 0; j < 16; j++)
		kr[j] = k[i0 + j < n ? i0 + j : n - 1];
	for (int j = 0; j < 16 && i0 + j + 16 < n; j++)
		for (size_t o = 0; o < rb; o += 64)
			_mm_prefetch((const char *)k[i0 + j + 16] + o, _MM_HINT_T0);
	__m512i base = _mm512_set1_epi64((long long)(uintptr_t)kr[0]);
	*off_lo = _mm512_sub_epi64(_mm512_loadu_si512((const void *)kr), base);
	*off_hi = _mm512_sub_epi64(_mm512_loadu_si512((const void *)(kr + 8)), base);
	return (__mmask16)((1u << cnt) - 1);
}

/* A decode's query group (NT <= 4 rows, compile-time, as Q8): each row's
 * running sum over blocks stays in a register (the same operations as the
 * general path below: acc = fma(e_b d_b, s_b, acc) from +0, then * scale) */
A512 INLINE void scores_few(const int NT, const int Q8, const struct kvq_qrow *const *qr, const unsigned char *const *k, int n,
			    int nb, size_t bb, float scale, float *sc, int ldsc, const __m512i *ix0, const __m512i *ix1)
{
	const __m512 vscale = _mm512_set1_ps(scale);
	for (int i0 = 0; i0 < n; i0 += 16) {
		const uint8_t *kr[16];
		__m512i off_lo, off_hi;
		__mmask16 live = k_rows16(k, n, i0, bb * (size_t)nb, kr, &off_lo, &off_hi);
		__m512 acc[4];
		UNROLL for (int r = 0; r < NT; r++)
			acc[r] = _mm512_setzero_ps();
		for (int b = 0; b < nb; b++) {
			__m512i z[8], corr;
			__m512 dk = k_scales16(kr, b, bb, off_lo, off_hi);
			k_block16(Q8, kr, b, bb, ix0, ix1, z, &corr);
			UNROLL for (int r = 0; r < NT; r++) {
				__m512 s = _mm512_cvtepi32_ps(row_idots16(Q8, qr[r], b, z, corr));
				__m512 dd = _mm512_mul_ps(_mm512_set1_ps(qr[r]->d[b]), dk);
				acc[r] = _mm512_fmadd_ps(dd, s, acc[r]);
			}
		}
		UNROLL for (int r = 0; r < NT; r++)
			_mm512_mask_storeu_ps(sc + (size_t)r * ldsc + i0, live, _mm512_mul_ps(acc[r], vscale));
	}
}

A512 void cpu_kvq8_scores_i8_avx512(enum kvd_kv_type t, const struct kvq_qrow *const *qr, int nr,
				    const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc)
{
	size_t bb = kvq8_blk_bytes(t);
	int nb = hd / QB, q8 = t == KVD_KV_Q8_0;
	const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	__m512i ix0[3], ix1[3];
	for (int s = 0; s < 3; s++) {
		/* out0 lane x: from register (bit s of x), lane x with bit s 0;
		 * out1 the same with bit s 1 */
		__m512i bit = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(iota, s), _mm512_set1_epi32(1)), 4);
		ix0[s] = _mm512_or_si512(_mm512_andnot_si512(_mm512_set1_epi32(1 << s), iota), bit);
		ix1[s] = _mm512_or_si512(_mm512_or_si512(iota, _mm512_set1_epi32(1 << s)), bit);
	}
	const __m512 vscale = _mm512_set1_ps(scale);

	if (nr <= 4) {
#define SCORES_FEW(NT)                                                                                         \
	do {                                                                                                   \
		if (q8)                                                                                        \
			scores_few(NT, 1, qr, k, n, nb, bb, scale, sc, ldsc, ix0, ix1);                        \
		else                                                                                           \
			scores_few(NT, 0, qr, k, n, nb, bb, scale, sc, ldsc, ix0, ix1);                        \
	} while (0)
		switch (nr) {
		case 1: SCORES_FEW(1); break;
		case 2: SCORES_FEW(2); break;
		case 3: SCORES_FEW(3); break;
		default: SCORES_FEW(4); break;
		}
#undef SCORES_FEW
		return;
	}
	/* more rows (a prefill tile's): each block's transpose serves them
	 * all, the running sums in sc */
	for (int i0 = 0; i0 < n; i0 += 16) {
		const uint8_t *kr[16];
		__m512i off_lo, off_hi;
		__mmask16 live = k_rows16(k, n, i0, bb * (size_t)nb, kr, &off_lo, &off_hi);
		for (int b = 0; b < nb; b++) {
			__m512i z[8], corr;
			__m512 dk = k_scales16(kr, b, bb, off_lo, off_hi);
			if (q8)
				k_block16(1, kr, b, bb, ix0, ix1, z, &corr);
			else
				k_block16(0, kr, b, bb, ix0, ix1, z, &corr);
			for (int r = 0; r < nr; r++) {
				__m512i acc = q8 ? row_idots16(1, qr[r], b, z, corr) : row_idots16(0, qr[r], b, z, corr);
				float *out = sc + (size_t)r * ldsc + i0;
				__m512 dd = _mm512_mul_ps(_mm512_set1_ps(qr[r]->d[b]), dk);
				__m512 prev = b ? _mm512_maskz_loadu_ps(live, out) : _mm512_setzero_ps();
				__m512 a = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(acc), prev);
				_mm512_mask_storeu_ps(out, live, b == nb - 1 ? _mm512_mul_ps(a, vscale) : a);
			}
		}
	}
}

A512 void cpu_kvq8_scores_avx512(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			    int hd, float scale, float *sc, int ldsc)
{
	scores_via(quant_rows_avx512, cpu_kvq8_scores_i8_avx512, t, q, nr, k, n, hd, scale, sc, ldsc);
}

void cpu_kvq8_quant_avx512(const float *x, int nr, int hd, struct kvq_qrow *out)
{
	quant_via(quant_rows_avx512, x, nr, hd, out);
}

int cpu_kvq8_have_vnni(void)
{
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
	       __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}
#endif

/* ---- the softmax of a q8_0/q4_0 chunk's scores ----------------------------
 *
 * m = max s_i; e_i = expq(s_i - m), Cephes' polynomial as
 * kernels/cpu/vexp.h's exp_neg8 computes it (inputs clamped at -87, the
 * power of two built in the exponent), with fma(a, b, c) rounded once; l =
 * the sum of e_i over 16 partial sums (partial j: elements j, j + 16, ...
 * in order), folded 16 -> 8 -> 4 -> 2 -> 1 (lanes j and j + 8, then j + 4,
 * j + 2, j + 1). The same bits in every version. */
#define SM_LOG2E 1.44269504088896341f
#define SM_C1 0.693359375f
#define SM_C2 -2.12194440e-4f

static float expq_generic(float x)
{
	x = x > -87.0f ? x : -87.0f;
	float n = rintf(x * SM_LOG2E);
	float r = fmaf(-n, SM_C1, x);
	r = fmaf(-n, SM_C2, r);
	float p = 1.9875691500e-4f;
	p = fmaf(p, r, 1.3981999507e-3f);
	p = fmaf(p, r, 8.3334519073e-3f);
	p = fmaf(p, r, 4.1665795894e-2f);
	p = fmaf(p, r, 1.6666665459e-1f);
	p = fmaf(p, r, 5.0000001201e-1f);
	p = fmaf(p, r * r, r + 1.0f);
	uint32_t bits = (uint32_t)((int)n + 127) << 23;
	float e;
	memcpy(&e, &bits, 4);
	return p * e;
}

static float fold16(const float *p)
{
	float a[8], b[4];
	for (int j = 0; j < 8; j++)
		a[j] = p[j] + p[j + 8];
	for (int j = 0; j < 4; j++)
		b[j] = a[j] + a[j + 4];
	return (b[0] + b[2]) + (b[1] + b[3]);
}

void cpu_kvq8_softmax_generic(float *s, int n, float *ret_m, float *ret_l)
{
	float m = -INFINITY, part[16] = {0};
	for (int i = 0; i < n; i++)
		m = s[i] > m ? s[i] : m;
	for (int i = 0; i < n; i++) {
		s[i] = expq_generic(s[i] - m);
		part[i % 16] += s[i];
	}
	*ret_m = m;
	*ret_l = fold16(part);
}

#if defined(__x86_64__)
AVX2 INLINE __m256 expq8(__m256 x)
{
	x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(SM_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SM_C1), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SM_C2), r);
	__m256 p = _mm256_set1_ps(1.9875691500e-4f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AVX2 void cpu_kvq8_softmax_avx2(float *s, int n, float *ret_m, float *ret_l)
{
	float part[16];
	/* the max 8 lanes at a time, as the AVX-512 version takes it 16 (a
	 * scalar chain of compares was a third of a decode's softmax) */
	__m256 mx = _mm256_set1_ps(-INFINITY);
	const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	for (int i = 0; i < n; i += 8) {
		__m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), idx);
		__m256 x = _mm256_maskload_ps(s + i, live);
		mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, x), _mm256_castsi256_ps(live));
	}
	__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	float m = _mm_cvtss_f32(m4);
	__m256 vm = _mm256_set1_ps(m), p0 = _mm256_setzero_ps(), p1 = _mm256_setzero_ps();
	int i = 0;
	for (; i + 16 <= n; i += 16) {
		__m256 e0 = expq8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
		__m256 e1 = expq8(_mm256_sub_ps(_mm256_loadu_ps(s + i + 8), vm));
		_mm256_storeu_ps(s + i, e0);
		_mm256_storeu_ps(s + i + 8, e1);
		p0 = _mm256_add_ps(p0, e0);
		p1 = _mm256_add_ps(p1, e1);
	}
	_mm256_storeu_ps(part, p0);
	_mm256_storeu_ps(part + 8, p1);
	for (; i < n; i++) { /* the tail: the portable code's lanes */
		s[i] = expq_generic(s[i] - m);
		part[i % 16] += s[i];
	}
	*ret_m = m;
	*ret_l = fold16(part);
}

A512 INLINE __m512 expq16(__m512 x)
{
	x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SM_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SM_C1), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SM_C2), r);
	__m512 p = _mm512_set1_ps(1.9875691500e-4f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
	p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
	__m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
	return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

A512 void cpu_kvq8_softmax_avx512(float *s, int n, float *ret_m, float *ret_l)
{
	__m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
	for (int i = 0; i < n; i += 16) {
		__mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + i));
	}
	float m = _mm512_reduce_max_ps(mx);
	__m512 vm = _mm512_set1_ps(m);
	for (int i = 0; i < n; i += 16) {
		__mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		__m512 e = _mm512_maskz_mov_ps(k, expq16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), vm)));
		_mm512_mask_storeu_ps(s + i, k, e);
		sum = _mm512_add_ps(sum, e);
	}
	float part[16];
	_mm512_storeu_ps(part, sum);
	*ret_m = m;
	*ret_l = fold16(part);
}
#endif
