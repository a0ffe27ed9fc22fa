/*
 * kernels/cpu/kvq_int8.h — the integer-product attention kernels over q8_0
 * and q4_0 K/V rows (kernels/cpu/kvq_int8.c), which kvquant.c installs
 * for those types. Private to kernels/cpu; the arithmetic is stated in
 * kvquant.h.
 */
#ifndef KVD_CPU_KVQ_INT8_H
#define KVD_CPU_KVQ_INT8_H

#include "kvquant.h"

/* The largest head the integer scores take (a query row's quants live on
 * the stack); larger heads go through the float products. */
#define KVQ_INT8_MAX_HD 256

/* kvq_scores_fn for t q8_0 or q4_0 and hd <= KVQ_INT8_MAX_HD, in portable
 * C, with AVX2 and with AVX-512 VNNI: the same bits. */
void cpu_kvq8_scores_generic(enum kvd_kv_type t, const float *const *q, int nr, const unsigned char *const *k, int n,
			     int hd, float scale, float *sc, int ldsc);
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
/* kvq_accum_fn for t q8_0 or q4_0 with AVX2: one conversion of each half
 * V block serves four rows (the same bits as every version). */
void cpu_kvq8_accum_avx2(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			 const unsigned char *const *v, int hd);
/* kvq_accum_fn for t q8_0 or q4_0 with AVX-512: one conversion of a V
 * row's two blocks serves four rows (the same bits as every version). */
void cpu_kvq8_accum_avx512(enum kvd_kv_type t, float *const *o, int nr, const int *len, const float *w, int ldw,
			   const unsigned char *const *v, int hd);
/* Whether this CPU runs cpu_kvq8_scores_avx512 (AVX-512 with VNNI). */
int cpu_kvq8_have_vnni(void);
#endif

#endif
