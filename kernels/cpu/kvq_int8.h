/*
 * kernels/cpu/kvq_int8.h — the integer-product attention kernels over q8_0
 * and q4_0 K/V rows (kernels/cpu/kvq_int8.c: scores and softmax;
 * kvq_vsum.c: weighted V sums), which kvquant.c installs
 * for those types. Private to kernels/cpu; the arithmetic is stated in
 * kvquant.h.
 */
#ifndef KVD_CPU_KVQ_INT8_H
#define KVD_CPU_KVQ_INT8_H

#include "kvquant.h"

/* A q8_0 or q4_0 block's bytes: the f16 scale and 32 quants */
static inline size_t kvq8_blk_bytes(enum kvd_kv_type t)
{
	return t == KVD_KV_Q8_0 ? 34 : 18;
}

/* kvq_scores_fn for t q8_0 or q4_0 and hd <= KVQ_INT8_MAX_HD, in portable
 * C, with AVX2 and with AVX-512 VNNI: the same bits. */
void cpu_kvq8_scores_generic(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			     int hd, float scale, float *sc, int ldsc);
/* kvq_quant_fn and kvq_scores_i8_fn in portable C, with AVX2 and with
 * AVX-512 (VNNI for the scores): the same bits. */
void cpu_kvq8_quant_generic(const float *x, int nr, int hd, struct kvq_qrow *out);
void cpu_kvq8_scores_i8_generic(enum kvd_kv_type t, const struct kvq_qrow *const *qr, int nr,
				const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc);
/* kvq_accum_fn for t q8_0 or q4_0: the weighted V sums in integers
 * (kvquant.h), in portable C. */
void cpu_kvq8_accum_generic(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			    const unsigned char *const *v, int hd);
/* The softmax of n scores of a q8_0/q4_0 chunk in place (s_i becomes
 * e_i), its max and sum, as kvquant.c states it; portable, AVX2 and
 * AVX-512 versions with the same bits. */
void cpu_kvq8_softmax_generic(float *s, int n, float *ret_m, float *ret_l);
#if defined(__x86_64__)
void cpu_kvq8_softmax_avx2(float *s, int n, float *ret_m, float *ret_l);
void cpu_kvq8_softmax_avx512(float *s, int n, float *ret_m, float *ret_l);
void cpu_kvq8_scores_avx2(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			  int hd, float scale, float *sc, int ldsc);
void cpu_kvq8_scores_avx512(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			    int hd, float scale, float *sc, int ldsc);
void cpu_kvq8_quant_avx2(const float *x, int nr, int hd, struct kvq_qrow *out);
void cpu_kvq8_quant_avx512(const float *x, int nr, int hd, struct kvq_qrow *out);
void cpu_kvq8_scores_i8_avx2(enum kvd_kv_type t, const struct kvq_qrow *const *qr, int nr,
			     const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc);
void cpu_kvq8_scores_i8_avx512(enum kvd_kv_type t, const struct kvq_qrow *const *qr, int nr,
			       const unsigned char *const *k, int n, int hd, float scale, float *sc, int ldsc);
/* kvq_accum_fn for t q8_0 or q4_0 with AVX2 (vpmaddwd) and AVX-512
 * (vpdpwssd where the CPU has VNNI): the same bits as the portable one. */
void cpu_kvq8_accum_avx2(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			 const unsigned char *const *v, int hd);
void cpu_kvq8_accum_avx512(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			   const unsigned char *const *v, int hd);
/* Whether this CPU runs cpu_kvq8_scores_avx512 (AVX-512 with VNNI). */
int cpu_kvq8_have_vnni(void);
#endif

#endif
