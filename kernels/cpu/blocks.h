/*
 * kernels/cpu/blocks.h — the quantized block formats as stored in GGUF
 * (ggml's layouts; see ops.c for what each field means) and the helpers
 * that the portable (ops.c) and AVX2 (ops_avx2.c) row kernels share.
 * Private to kernels/cpu.
 */
#ifndef KVD_CPU_BLOCKS_H
#define KVD_CPU_BLOCKS_H

#include "ops.h"

struct blk_q4_0 {
	uint16_t d;
	uint8_t qs[QK / 2];
};
struct blk_q4_1 {
	uint16_t d, m;
	uint8_t qs[QK / 2];
};
struct blk_q8_0 {
	uint16_t d;
	int8_t qs[QK];
};
_Static_assert(sizeof(struct blk_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct blk_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(struct blk_q8_0) == 34, "q8_0 block");

/* q5_0: f16 d, 4 bytes qh, 16 bytes of nibbles; element j (j < 16) is the
 * low nibble of byte j with bit j of qh as its fifth bit, element 16 + j
 * the high nibble with bit 16 + j; value = (q - 16) * d.
 * q5_1: f16 d, f16 m, then the same; value = q * d + m. */
struct blk_q5_0 {
	uint16_t d;
	uint8_t qh[4];
	uint8_t qs[QK / 2];
};
struct blk_q5_1 {
	uint16_t d, m;
	uint8_t qh[4];
	uint8_t qs[QK / 2];
};
_Static_assert(sizeof(struct blk_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(struct blk_q5_1) == 24, "q5_1 block");

#define QK_K 256
struct blk_q4_K {
	uint16_t d, dmin;
	uint8_t scales[12];
	uint8_t qs[QK_K / 2];
};
struct blk_q5_K {
	uint16_t d, dmin;
	uint8_t scales[12];
	uint8_t qh[QK_K / 8];
	uint8_t qs[QK_K / 2];
};
struct blk_q6_K {
	uint8_t ql[QK_K / 2];
	uint8_t qh[QK_K / 4];
	int8_t scales[QK_K / 16];
	uint16_t d;
};
_Static_assert(sizeof(struct blk_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(struct blk_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(struct blk_q6_K) == 210, "q6_K block");

/* sub-block j's 6-bit scale and min from a q4_K/q5_K block's 12 packed bytes */
void cpu_kq_scale_min(const uint8_t *q, int j, int *sc, int *m);
/* a K-quant row (n elements) against q8 activations */
float cpu_kq_dot(enum kvd_wtype t, const void *w, const struct q8_block *xq, int64_t n);
/* the portable activations, which the vector versions use for their tails */
void cpu_swiglu_generic(float *g, const float *u, int64_t n);
void cpu_geglu_generic(float *g, const float *u, int64_t n);
void cpu_rmsnorm_generic(float *dst, const float *x, const float *g, int64_t n, float eps);
#define GELU_2K 1.5957691216f /* 2 sqrt(2 / pi) */
#define GELU_C 0.044715f

#if defined(__x86_64__)
/* the AVX2/FMA/F16C row kernels (ops_avx2.c) into k; the caller has
 * checked the CPU */
void cpu_kernels_init_avx2(struct cpu_kernels *k);
#endif

#endif /* KVD_CPU_BLOCKS_H */
