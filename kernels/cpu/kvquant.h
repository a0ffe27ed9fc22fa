/*
 * kernels/cpu/kvquant.h — K/V rows in the f32, bf16, q8_0 and q4_0 element types
 * of kernels/backend.h (enum kvd_kv_type): storing a row into a page,
 * reading one back, and the two products attention needs, computed on the
 * stored rows in place (nothing is staged per page): for f32 and bf16 each
 * 32-element block is converted to floats in registers and scaled once;
 * for q8_0 and q4_0 the scores are integer products against the query
 * quantized to int8 and the weighted V sums integer products against the
 * weights quantized to int16 (kernels/cpu/kvq_int8.c, kvq_vsum.c).
 *
 * Exact arithmetic, the same in every build (so the portable, AVX2 and
 * AVX-512 versions give the same bits, and a token's attention does not depend on
 * the instruction set the CPU backend picked), with fma(a, b, c) = a * b + c
 * rounded once:
 *
 *   dot, query row q against a K row k of n elements, per block b of 32
 *   with scale d_b (1 for f32 and bf16) and elements k_i as floats (quants exactly),
 *   for lanes l = 0..7 (elements relative to the block):
 *     p_l = fma(q_{l+24}, k_{l+24}, fma(q_{l+16}, k_{l+16}, fma(q_{l+8}, k_{l+8}, q_l k_l)))
 *     acc_l = fma(d_b, p_l, acc_l)                  (acc_l = 0 before block 0)
 *     result = ((acc_0 + acc_1) + (acc_2 + acc_3)) + ((acc_4 + acc_5) + (acc_6 + acc_7))
 *   dot of q8_0 and q4_0 K rows (head sizes up to 256; larger ones as
 *   above): the query row quantized per block b (cpu_kvq_quant_query) to
 *   integers qi_i with scale e_b = amax_b / 127, and with k_i the stored
 *   quants (q4_0: the nibble minus 8), d_b the block's scale:
 *     s_b = sum_i qi_i k_i                          (exact, in integers)
 *     acc = fma(e_b * d_b, s_b, acc)                (acc = 0 before block 0)
 *     result = acc
 *   axpy, y += a * v for a V row v of f32 or bf16, per block b:
 *     y_i = fma(a * d_b, v_i, y_i)
 *   weighted V sum of q8_0 and q4_0 rows, y += sum_p a_p v_p over a row's
 *   positions p in groups of KVQ_VSUM_GROUP (from the first), per group
 *   and block b, with v_{p,i} the stored quants and d_{p,b} the scales:
 *     x_p = a_p * d_{p,b}                    (NaN counts as 0)
 *     P = max_p |x_p|; if P < 2^-96 or P is not finite, nothing is added
 *     u_p = nearest-even integer to x_p * (32767 / P)    (|u_p| <= 32767)
 *     S_i = sum_p u_p v_{p,i}                (exact, in integers)
 *     y_i = fma(P / 32767, S_i, y_i)
 *   (the weights' error is at most P / 65534 each; two products a lane
 *   per instruction instead of a float multiply-add per element)
 *
 * No other multiply and add is contracted: the sources are ISO C, whose
 * default forbids it.
 */
#ifndef KVD_CPU_KVQUANT_H
#define KVD_CPU_KVQUANT_H

#include <stdint.h>
#include <string.h>

#include "backend.h"

/* The IEEE half at p (little-endian bytes, e.g. a q8_0/q4_0 block's scale)
 * as a single (exact). */
static inline float cpu_kvq_h2f(const uint8_t *p)
{
	uint16_t h = (uint16_t)(p[0] | (uint16_t)(p[1] << 8));
	uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
	float f;
	if (e == 0) {
		f = (float)m * 0x1p-24f;
		return s ? -f : f;
	}
	bits = e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112) << 23) | (m << 13);
	memcpy(&f, &bits, 4);
	return f;
}

/* Store n floats (n a multiple of 32 for the quantized types) as one row of
 * type t at dst (kvd_kv_row_bytes(t, n) bytes). f16 rounds to nearest
 * even. Portable C, one version for every CPU. */
void cpu_kvq_store_row(enum kvd_kv_type t, void *dst, const float *src, int n);

/* The n floats a stored row of type t holds (the exact stored values). */
void cpu_kvq_load_row(enum kvd_kv_type t, const void *src, float *dst, int n);

/* A query row x of n floats (n a multiple of 32) as int8 per block of 32,
 * as the q8_0 and q4_0 scores use it: e_b = amax_b / 127 (d[b]), qs_i =
 * round(x_i / e_b) (x_i * (1 / e_b), ties away from zero, clamped to
 * +-127; 0 for a zero block or NaN), sum[b] = the block's sum of qs. */
void cpu_kvq_quant_query(const float *x, int n, int8_t *qs, float *d, int32_t *sum);

/* Scores of nr query rows q[r] against n K rows k[i] (one head each: hd
 * elements, a multiple of 32) of type t != f16: sc[r * ldsc + i] =
 * dot(q[r], k[i]) * scale, the dot as stated above. */
typedef void (*kvq_scores_fn)(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k,
			      int n, int hd, float scale, float *sc, int ldsc);
/* For rows r < nr: o[r] += w[r * ldw + i] * v[i] for positions i < len[r]
 * (f32, bf16: in position order, each an axpy as stated above; q8_0,
 * q4_0: the integer weighted V sum stated above), v[i] V rows of one head
 * (hd elements) of type t != f16. */
typedef void (*kvq_accum_fn)(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			     const unsigned char *const *v, int hd);

/* The softmax of a chunk's n scores of one row in place (s[i] becomes
 * exp(s[i] - max)), with *ret_m the max and *ret_l the sum: for q8_0 and
 * q4_0 caches (kernels/cpu/kvq_int8.c states the arithmetic: a polynomial
 * exp and 16 partial sums, the same bits in every version). */
typedef void (*kvq_softmax_fn)(float *s, int n, float *ret_m, float *ret_l);

/* The integer V sums stated above: positions a group covers, and the
 * largest weight's integer. */
#define KVQ_VSUM_GROUP 256
#define KVQ_VSUM_UMAX 32767.0f

/* The largest head the integer scores take (struct kvq_qrow); larger
 * heads go through the float products. */
#define KVQ_INT8_MAX_HD 256

/* A query row as the q8_0 and q4_0 scores use it (cpu_kvq_quant_query):
 * its int8 quants qs, qu = qs + 128 (as unsigned bytes), and per block of
 * 32 the scale d and the sum of the quants. */
struct kvq_qrow {
	int8_t qs[KVQ_INT8_MAX_HD];
	uint8_t qu[KVQ_INT8_MAX_HD];
	float d[KVQ_INT8_MAX_HD / 32];
	int32_t sum[KVQ_INT8_MAX_HD / 32];
};

/* nr query rows at x (hd floats apart, hd <= KVQ_INT8_MAX_HD and a
 * multiple of 32) quantized into out[0 .. nr - 1]. */
typedef void (*kvq_quant_fn)(const float *x, int nr, int hd, struct kvq_qrow *out);
/* kvq_scores_fn for t q8_0 or q4_0 (hd <= KVQ_INT8_MAX_HD) over query rows
 * already quantized (quant): a query quantized once serves every chunk
 * of its context; the same bits as scores. */
typedef void (*kvq_scores_i8_fn)(enum kvd_kv_type t, const struct kvq_qrow *const *q, int nr,
				 const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc);

struct kvq_kernels {
	const char *isa; /* "avx512", "avx2" or "generic" */
	kvq_scores_fn scores;
	kvq_quant_fn quant;
	kvq_scores_i8_fn scores_i8;
	kvq_accum_fn accum;
	kvq_softmax_fn softmax;
};

/* The versions for this CPU, up to `level`: 2 AVX-512 (with AVX2 and FMA),
 * 1 AVX2 and FMA, 0 portable C. All give identical bits. */
void cpu_kvq_kernels_init(struct kvq_kernels *k, int level);

#endif
