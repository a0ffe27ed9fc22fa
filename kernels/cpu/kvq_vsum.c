/*
 * kernels/cpu/kvq_vsum.c — the weighted V sums of attention over q8_0 and
 * q4_0 V rows in integers, as kernels/cpu/kvquant.h states them: per group
 * of positions and block, the softmax weights times the blocks' scales
 * quantized to int16 against their largest, the sums over positions exact
 * in int32, one float multiply-add per element at the end. Portable C one
 * position at a time; AVX2 (vpmaddwd) and AVX-512 (vpdpwssd with VNNI,
 * else vpmaddwd) two positions at a time, each pair's quants interleaved
 * as 16-bit words so that one instruction multiplies both by their
 * weights. Integer sums are exact in any order, and the float operations
 * are the same in all three, so every version gives the same bits.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvq_int8.h"

#define QB KVD_KV_QBLOCK
#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* The weighted V sums over q8_0 and q4_0 rows in integers, as kvquant.h
 * states them, one position at a time. */
void cpu_kvq8_accum_generic(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			    const unsigned char *const *v, int hd)
{
	size_t bb = kvq8_blk_bytes(t);
	float p[KVQ_VSUM_GROUP];
	for (int r = 0; r < nr; r++)
		for (int g0 = 0; g0 < len[r]; g0 += KVQ_VSUM_GROUP) {
			int gn = len[r] - g0 < KVQ_VSUM_GROUP ? len[r] - g0 : KVQ_VSUM_GROUP;
			for (int b = 0; b < hd / QB; b++) {
				float P = 0;
				for (int i = 0; i < gn; i++) {
					float x = w[(size_t)r * ldw + g0 + i] * cpu_kvq_h2f(v[g0 + i] + (size_t)b * bb);
					p[i] = x == x ? x : 0.0f;
					if (fabsf(p[i]) > P)
						P = fabsf(p[i]);
				}
				if (!(P >= 0x1p-96f && P <= 0x1.fffffep127f))
					continue; /* nothing to add */
				float sc = KVQ_VSUM_UMAX / P, e = P / KVQ_VSUM_UMAX;
				int32_t S[QB] = {0};
				for (int i = 0; i < gn; i++) {
					int32_t u = (int32_t)rintf(p[i] * sc);
					const uint8_t *blk = v[g0 + i] + (size_t)b * bb;
					if (t == KVD_KV_Q8_0)
						for (int j = 0; j < QB; j++)
							S[j] += u * (int8_t)blk[2 + j];
					else
						for (int j = 0; j < QB / 2; j++) {
							S[j] += u * ((blk[2 + j] & 15) - 8);
							S[j + QB / 2] += u * ((blk[2 + j] >> 4) - 8);
						}
				}
				float *y = o[r] + b * QB;
				for (int j = 0; j < QB; j++)
					y[j] = fmaf(e, (float)S[j], y[j]);
			}
		}
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* V block blk's elements 16h .. 16h + 15 (q4_0: nibbles minus 8) as 16
 * int16 */
AVX2 INLINE __m256i v_words_avx2(const int Q8, const uint8_t *blk, int h)
{
	__m128i x;
	if (Q8) {
		x = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * h));
	} else {
		const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
		x = _mm_loadu_si128((const __m128i *)(blk + 2));
		x = _mm_sub_epi8(_mm_and_si128(h ? _mm_srli_epi16(x, 4) : x, m), e);
	}
	return _mm256_cvtepi8_epi16(x);
}

/* v_weights (below) with AVX2: the same operations on 8 lanes */
AVX2 INLINE float v_weights_avx2(const float *w, const float *dv, int lr, int gn, float *pb, int16_t *u)
{
	const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 mx = _mm256_setzero_ps();
	for (int i0 = 0; i0 < lr; i0 += 8) {
		__m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(lr - i0), idx);
		__m256 p = _mm256_mul_ps(_mm256_maskload_ps(w + i0, live), _mm256_maskload_ps(dv + i0, live));
		p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q));
		_mm256_storeu_ps(pb + i0, p);
		mx = _mm256_max_ps(mx, _mm256_and_ps(p, absm));
	}
	__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	float P = _mm_cvtss_f32(m4);
	int ok = P >= 0x1p-96f && P <= 0x1.fffffep127f;
	__m256 s = _mm256_set1_ps(ok ? KVQ_VSUM_UMAX / P : 0.0f);
	for (int i0 = 0; i0 < gn + 1; i0 += 8) {
		__m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(ok ? lr - i0 : 0), idx);
		__m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskload_ps(pb + i0, live), s));
		_mm_storeu_si128((__m128i *)(u + i0), _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
	}
	return ok ? P / KVQ_VSUM_UMAX : 0.0f;
}

/* Rows 0 .. NT - 1 (NT <= 4, compile-time, as Q8), block b, the group of
 * positions g0 .. g0 + gn - 1: the rows' int16 weights, then for each half
 * of the block the positions two at a time (vpmaddwd on the pair's
 * interleaved words), the rows' 8 accumulators in registers */
AVX2 INLINE void vsum_group_avx2(const int NT, const int Q8, float *const *o, const int *len, const float *w, int ldw,
				 const unsigned char *const *v, int b, size_t bb, size_t rb, int g0, int gn, int n)
{
	_Alignas(32) float dv[KVQ_VSUM_GROUP + 8], pb[KVQ_VSUM_GROUP + 8];
	_Alignas(32) int16_t u[4][KVQ_VSUM_GROUP + 16];
	float e[4];
	for (int i = 0; i < gn; i++) {
		const uint8_t *x = v[g0 + i] + (size_t)b * bb;
		dv[i] = _cvtsh_ss((unsigned short)(x[0] | x[1] << 8));
	}
	UNROLL for (int rr = 0; rr < NT; rr++) {
		int lr = len[rr] - g0 < 0 ? 0 : len[rr] - g0 > gn ? gn : len[rr] - g0;
		e[rr] = v_weights_avx2(w + (size_t)rr * ldw + g0, dv, lr, gn, pb, u[rr]);
	}
	for (int h = 0; h < 2; h++) {
		__m256i acc[4][2];
		UNROLL for (int rr = 0; rr < NT; rr++)
			acc[rr][0] = acc[rr][1] = _mm256_setzero_si256();
		for (int i = 0; i < gn; i += 2) {
			const uint8_t *va = v[g0 + i], *vb = v[g0 + (i + 1 < gn ? i + 1 : i)];
			if (b == 0 && h == 0 && g0 + i + 16 < n) {
				for (size_t x = 0; x < rb; x += 64)
					_mm_prefetch((const char *)v[g0 + i + 16] + x, _MM_HINT_T0);
				if (g0 + i + 17 < n)
					for (size_t x = 0; x < rb; x += 64)
						_mm_prefetch((const char *)v[g0 + i + 17] + x, _MM_HINT_T0);
			}
			__m256i A = v_words_avx2(Q8, va + (size_t)b * bb, h), B = v_words_avx2(Q8, vb + (size_t)b * bb, h);
			__m256i lo = _mm256_unpacklo_epi16(A, B), hi = _mm256_unpackhi_epi16(A, B);
			UNROLL for (int rr = 0; rr < NT; rr++) {
				int32_t pair;
				memcpy(&pair, &u[rr][i], 4);
				__m256i uw = _mm256_set1_epi32(pair);
				acc[rr][0] = _mm256_add_epi32(acc[rr][0], _mm256_madd_epi16(lo, uw));
				acc[rr][1] = _mm256_add_epi32(acc[rr][1], _mm256_madd_epi16(hi, uw));
			}
		}
		/* lo's dword 4L + m is element 8L + m of the half, hi's 8L + 4 + m */
		UNROLL for (int rr = 0; rr < NT; rr++) {
			if (e[rr] == 0.0f)
				continue;
			float *y = o[rr] + b * QB + 16 * h;
			__m256 ev = _mm256_set1_ps(e[rr]);
			__m256i s0 = _mm256_permute2x128_si256(acc[rr][0], acc[rr][1], 0x20);
			__m256i s1 = _mm256_permute2x128_si256(acc[rr][0], acc[rr][1], 0x31);
			_mm256_storeu_ps(y, _mm256_fmadd_ps(ev, _mm256_cvtepi32_ps(s0), _mm256_loadu_ps(y)));
			_mm256_storeu_ps(y + 8, _mm256_fmadd_ps(ev, _mm256_cvtepi32_ps(s1), _mm256_loadu_ps(y + 8)));
		}
	}
}

AVX2 void cpu_kvq8_accum_avx2(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			 const unsigned char *const *v, int hd)
{
	size_t bb = kvq8_blk_bytes(t), rb = bb * (size_t)(hd / QB);
	int n = 0, q8 = t == KVD_KV_Q8_0;
	for (int r = 0; r < nr; r++)
		n = len[r] > n ? len[r] : n;
	for (int g0 = 0; g0 < n; g0 += KVQ_VSUM_GROUP) {
		int gn = n - g0 < KVQ_VSUM_GROUP ? n - g0 : KVQ_VSUM_GROUP;
		for (int b = 0; b < hd / QB; b++)
			for (int r0 = 0; r0 < nr; r0 += 4) {
				const float *wr = w + (size_t)r0 * ldw;
#define VSUM2(NT)                                                                                              \
	do {                                                                                                   \
		if (q8)                                                                                        \
			vsum_group_avx2(NT, 1, o + r0, len + r0, wr, ldw, v, b, bb, rb, g0, gn, n);            \
		else                                                                                           \
			vsum_group_avx2(NT, 0, o + r0, len + r0, wr, ldw, v, b, bb, rb, g0, gn, n);            \
	} while (0)
				switch (nr - r0 < 4 ? nr - r0 : 4) {
				case 1: VSUM2(1); break;
				case 2: VSUM2(2); break;
				case 3: VSUM2(3); break;
				default: VSUM2(4); break;
				}
#undef VSUM2
			}
	}
}

#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* ---- the weighted V sums in integers, AVX-512 (kvquant.h states them) ---- */

/* V block blk (32 quants; q4_0 the nibbles minus 8) as 32 int16, element
 * j in word j */
A512 INLINE __m512i v_words(const int Q8, const uint8_t *blk)
{
	if (Q8)
		return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 2)));
	const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
	__m128i y = _mm_loadu_si128((const __m128i *)(blk + 2));
	__m128i lo = _mm_sub_epi8(_mm_and_si128(y, m), e), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(y, 4), m), e);
	return _mm512_cvtepi8_epi16(_mm256_set_m128i(hi, lo));
}

/* A row's weights of one block over a group of gn positions (lr of them
 * before the row's end): p_i = w_i d_i, P = max |p_i| (NaN as 0), u_i =
 * nearest-even integer of p_i (32767 / P) as int16 (0 past lr, and at gn
 * when gn is odd). Returns P / 32767, or 0 when P is 0, below 2^-96 or
 * not finite (the group adds nothing). */
A512 INLINE float v_weights(const float *w, const float *dv, int lr, int gn, float *pb, int16_t *u)
{
	__m512 mx = _mm512_setzero_ps();
	for (int i0 = 0; i0 < lr; i0 += 16) {
		__mmask16 mk = lr - i0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (lr - i0)) - 1);
		__m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, w + i0), _mm512_maskz_loadu_ps(mk, dv + i0));
		p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), p);
		_mm512_storeu_ps(pb + i0, p);
		mx = _mm512_max_ps(mx, _mm512_abs_ps(p));
	}
	float P = _mm512_reduce_max_ps(mx);
	int ok = P >= 0x1p-96f && P <= 0x1.fffffep127f;
	__m512 s = _mm512_set1_ps(ok ? KVQ_VSUM_UMAX / P : 0.0f);
	for (int i0 = 0; i0 < gn + 1; i0 += 16) {
		int m = lr - i0;
		__mmask16 mk = !ok || m <= 0 ? 0 : m >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1);
		__m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, pb + i0), s));
		_mm256_storeu_si256((__m256i *)(u + i0), _mm512_cvtsepi32_epi16(q));
	}
	return ok ? P / KVQ_VSUM_UMAX : 0.0f;
}

/* Rows 0 .. NT - 1 (NT <= 4), blocks b0 .. b0 + NB2 - 1 (NB2 <= 2), over
 * the group of positions g0 .. g0 + gn - 1 (gn <= KVQ_VSUM_GROUP): the
 * rows' int16 weights, then the positions two at a time, each pair's V
 * words interleaved (dword lane m of lo/hi holding elements of both) and
 * multiplied by the pair of weights (vpdpwssd, or vpmaddwd with VNNI 0):
 * exact integer sums, one conversion to floats at the end. NT, NB2, Q8 and
 * VNNI compile-time. */
A512 INLINE void vsum_group(const int NT, const int NB2, const int Q8, const int VNNI, float *const *o, const int *len,
			    const float *w, int ldw, const unsigned char *const *v, int b0, size_t bb, size_t rb,
			    int g0, int gn, int n)
{
	_Alignas(64) float dv[2][KVQ_VSUM_GROUP + 16], pb[KVQ_VSUM_GROUP + 16];
	_Alignas(64) int16_t u[4][2][KVQ_VSUM_GROUP + 32];
	float e[4][2];
	for (int i = 0; i < gn; i++)
		UNROLL for (int h = 0; h < NB2; h++) {
			const uint8_t *x = v[g0 + i] + (size_t)(b0 + h) * bb;
			dv[h][i] = _cvtsh_ss((unsigned short)(x[0] | x[1] << 8));
		}
	UNROLL for (int rr = 0; rr < NT; rr++) {
		int lr = len[rr] - g0 < 0 ? 0 : len[rr] - g0 > gn ? gn : len[rr] - g0;
		UNROLL for (int h = 0; h < NB2; h++)
			e[rr][h] = v_weights(w + (size_t)rr * ldw + g0, dv[h], lr, gn, pb, u[rr][h]);
	}
	__m512i acc[4][2][2];
	UNROLL for (int rr = 0; rr < NT; rr++)
		UNROLL for (int h = 0; h < NB2; h++)
			acc[rr][h][0] = acc[rr][h][1] = _mm512_setzero_si512();
	for (int i = 0; i < gn; i += 2) {
		const uint8_t *va = v[g0 + i], *vb = v[g0 + (i + 1 < gn ? i + 1 : i)];
		if (b0 == 0 && g0 + i + 16 < n) {
			for (size_t x = 0; x < rb; x += 64)
				_mm_prefetch((const char *)v[g0 + i + 16] + x, _MM_HINT_T0);
			if (g0 + i + 17 < n)
				for (size_t x = 0; x < rb; x += 64)
					_mm_prefetch((const char *)v[g0 + i + 17] + x, _MM_HINT_T0);
		}
		UNROLL for (int h = 0; h < NB2; h++) {
			__m512i A = v_words(Q8, va + (size_t)(b0 + h) * bb), B = v_words(Q8, vb + (size_t)(b0 + h) * bb);
			__m512i lo = _mm512_unpacklo_epi16(A, B), hi = _mm512_unpackhi_epi16(A, B);
			UNROLL for (int rr = 0; rr < NT; rr++) {
				int32_t pair;
				memcpy(&pair, &u[rr][h][i], 4);
				__m512i uw = _mm512_set1_epi32(pair);
				if (VNNI) {
					acc[rr][h][0] = _mm512_dpwssd_epi32(acc[rr][h][0], lo, uw);
					acc[rr][h][1] = _mm512_dpwssd_epi32(acc[rr][h][1], hi, uw);
				} else {
					acc[rr][h][0] = _mm512_add_epi32(acc[rr][h][0], _mm512_madd_epi16(lo, uw));
					acc[rr][h][1] = _mm512_add_epi32(acc[rr][h][1], _mm512_madd_epi16(hi, uw));
				}
			}
		}
	}
	/* lo's dword 4L + m is element 8L + m, hi's 8L + 4 + m */
	const __m512i i0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), i1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
	UNROLL for (int rr = 0; rr < NT; rr++)
		UNROLL for (int h = 0; h < NB2; h++) {
			if (e[rr][h] == 0.0f)
				continue;
			float *y = o[rr] + (b0 + h) * QB;
			__m512 ev = _mm512_set1_ps(e[rr][h]);
			__m512i s0 = _mm512_permutex2var_epi64(acc[rr][h][0], i0, acc[rr][h][1]);
			__m512i s1 = _mm512_permutex2var_epi64(acc[rr][h][0], i1, acc[rr][h][1]);
			_mm512_storeu_ps(y, _mm512_fmadd_ps(ev, _mm512_cvtepi32_ps(s0), _mm512_loadu_ps(y)));
			_mm512_storeu_ps(y + 16, _mm512_fmadd_ps(ev, _mm512_cvtepi32_ps(s1), _mm512_loadu_ps(y + 16)));
		}
}

#define VSUM_T(NT, NB2)                                                                                        \
	do {                                                                                                   \
		if (q8 && vnni)                                                                                \
			vsum_group(NT, NB2, 1, 1, o + r0, len + r0, wr, ldw, v, b0, bb, rb, g0, gn, n);        \
		else if (q8)                                                                                   \
			vsum_group(NT, NB2, 1, 0, o + r0, len + r0, wr, ldw, v, b0, bb, rb, g0, gn, n);        \
		else if (vnni)                                                                                 \
			vsum_group(NT, NB2, 0, 1, o + r0, len + r0, wr, ldw, v, b0, bb, rb, g0, gn, n);        \
		else                                                                                           \
			vsum_group(NT, NB2, 0, 0, o + r0, len + r0, wr, ldw, v, b0, bb, rb, g0, gn, n);        \
	} while (0)
#define VSUM_NT(NB2)                                                                                           \
	do {                                                                                                   \
		switch (nr - r0 < 4 ? nr - r0 : 4) {                                                           \
		case 1: VSUM_T(1, NB2); break;                                                                 \
		case 2: VSUM_T(2, NB2); break;                                                                 \
		case 3: VSUM_T(3, NB2); break;                                                                 \
		default: VSUM_T(4, NB2); break;                                                                \
		}                                                                                              \
	} while (0)

A512 void cpu_kvq8_accum_avx512(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			   const unsigned char *const *v, int hd)
{
	size_t bb = kvq8_blk_bytes(t), rb = bb * (size_t)(hd / QB);
	int nb = hd / QB, n = 0, q8 = t == KVD_KV_Q8_0, vnni = cpu_kvq8_have_vnni();
	for (int r = 0; r < nr; r++)
		n = len[r] > n ? len[r] : n;
	for (int g0 = 0; g0 < n; g0 += KVQ_VSUM_GROUP) {
		int gn = n - g0 < KVQ_VSUM_GROUP ? n - g0 : KVQ_VSUM_GROUP;
		for (int b0 = 0; b0 < nb; b0 += 2) {
			for (int r0 = 0; r0 < nr; r0 += 4) {
				const float *wr = w + (size_t)r0 * ldw;
				if (nb - b0 >= 2)
					VSUM_NT(2);
				else
					VSUM_NT(1);
			}
		}
	}
}

#endif
