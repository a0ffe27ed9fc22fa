/*
 * kernels/cpu/ops.h — the CPU backend's numeric building blocks: half and
 * bfloat conversions, 8-bit activation quantization, and the row dot
 * products that read weights in their stored (quantized) form.
 *
 * Quantized weights (q4_0, q4_1, q8_0) are multiplied with activations
 * quantized per block of 32 to int8 (scale d = max|x| / 127, q = round to
 * nearest even of x / d), as llama.cpp does; the integer part of each
 * block's dot product is exact, and float accumulation happens in a fixed
 * order, so a row's result depends only on the row and the activation, never
 * on which other rows or tokens are computed alongside it. The K-quants
 * (q4_K, q5_K, q6_K) take activations whose scale is shared by each
 * super-block of 256 (quantize_q8k, llama.cpp's Q8_K granularity), so that
 * their tiled kernels apply the sub-block scales to exact integer sums and
 * convert one sum per super-block.
 *
 * Each entry point has a portable C version and, where the CPU has them,
 * AVX2/FMA/F16C versions; cpu_kernels_init() picks once per backend.
 */
#ifndef KVD_CPU_OPS_H
#define KVD_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#define QK 32 /* elements per quantization block */

/* An activation block: scale, scale * sum of quants, 32 int8 quants. */
struct q8_block {
	float d;
	float s;
	int8_t q[QK];
};

float cpu_fp16_to_f32(uint16_t h);
uint16_t cpu_f32_to_fp16(float f); /* round to nearest even */
float cpu_bf16_to_f32(uint16_t h);
/* round to nearest even; a NaN stays a (quiet) NaN of the same sign */
uint16_t cpu_f32_to_bf16(float f);

/* A quantized activation row of n elements is its n/32 q8_blocks followed
 * by each block's integer sum of quants (int32, for the offsets of q4_0
 * and q8_0 weights in the tiled kernels), then each block's sum over its
 * first 16 quants (int32, for q6_K's offsets, whose scales change every 16
 * elements); this is its length in q8_block units (the row stride): the
 * (2 nb + 9) / 10 trailing blocks (40 bytes: ten int32 each) hold both. */
static inline int64_t q8_row_len(int64_t n)
{
	int64_t nb = n / QK;
	return nb + (2 * nb + 9) / 10;
}

static inline const int32_t *q8_row_sums(const struct q8_block *row, int64_t nb)
{
	return (const int32_t *)(const void *)(row + nb);
}

static inline const int32_t *q8_row_half_sums(const struct q8_block *row, int64_t nb)
{
	return q8_row_sums(row, nb) + nb;
}

/* Dot product of one weight row (n elements, stored type) with one
 * activation row given both as floats and as q8 blocks (n / 32 of them). */
typedef float (*vec_dot_fn)(const void *w, const float *x, const struct q8_block *xq, int64_t n);

/* The tiled kernels work on weights repacked by cpu_gemm_pack (layout in
 * gemm_avx512.c): one call multiplies a group of GEMM_ROWS rows (the first R
 * valid), nb blocks long, with C <= GEMM_COLS activation rows (q8 rows,
 * ldq blocks apart): y[t * ldy + r] for r < R. Each (row, token) result is
 * bit-identical whatever R and C. */
#define GEMM_ROWS 16
#define GEMM_COLS 8
/* With one or two tokens a tile streams weights faster than one core's
 * hardware prefetchers fetch them (they stop at every 4 KiB page): the
 * kernels prefetch this many bytes ahead of the group block they read. */
#ifndef GEMM_PF_DIST
#define GEMM_PF_DIST 4096
#endif
typedef void (*gemm_fn)(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int C, float *y,
			size_t ldy);
/* gemm for ntile tiles of GEMM16_COLS tokens (ldq blocks apart, tile i
 * at xq + i * 16 * ldq, its results at y + i * 16 * ldy), with the same
 * bits (gemm_amx.c); 0, or -ENOMEM with nothing written (use gemm). */
#define GEMM16_COLS 16
typedef int (*gemm16_fn)(const void *wp, int64_t nb, int R, const struct q8_block *xq, size_t ldq, int ntile,
			 float *y, size_t ldy);
/* The same for float weights (f32, f16, bf16) times float activation rows
 * (ldx floats apart), nb = columns / 32. */
typedef void (*gemmf_fn)(const void *wp, int64_t nb, int R, const float *x, size_t ldx, int C, float *y, size_t ldy);

/* Bytes of one packed group block of type t (0: t is not packed), of a
 * whole packed matrix, and the packing itself (portable C). pack: the
 * layout's variant, what the kernel set in use reads (cpu_kernels.pack_flags):
 * CPU_PACK_Q6_SPLIT keeps q6_K's quants as 4 + 2 bits (the AVX2 and the
 * AVX-512 kernels), CPU_PACK_Q5_SPLIT q5_K's as 4 + 1 (the AVX2 kernel),
 * instead of a byte each (q5_K on AVX-512, whose AMX tiles read bytes). */
#define CPU_PACK_Q6_SPLIT 1u
#define CPU_PACK_Q5_SPLIT 2u
/* Bytes of a K-quant group super-block (256 columns of 16 rows): quants,
 * then 256 bytes of integer scales (and mins), then f16 d (and dmin);
 * _KS: the split layouts. */
#define GSB_Q4_K (8 * 256 + 256 + 64)
#define GSB_Q5_K (8 * 512 + 256 + 64)
#define GSB_Q6_K (8 * 512 + 256 + 32)
#define GSB_Q5_KS (8 * 320 + 256 + 64)
#define GSB_Q6_KS (8 * 384 + 256 + 32)
size_t cpu_gemm_group_block_bytes(enum kvd_wtype t, unsigned pack);
size_t cpu_gemm_packed_bytes(enum kvd_wtype t, int64_t rows, int64_t cols, unsigned pack);
/* The 32 five-bit quants (0..31) of a q5_0/q5_1 block in element order,
 * from its 4 bytes qh and 16 bytes of nibbles. */
void cpu_q5_block_quants(const uint8_t qh[4], const uint8_t *qs, uint8_t q[32]);
/* One K-quant super-block (256 elements) as integers: q[i] the unsigned
 * quant of element i (q4_K 0..15, q5_K 0..31, q6_K 0..63, the latter to be
 * offset by -32), sc[j] and mn[j] the 6-bit scale and min of sub-block j of
 * 32 (q4_K, q5_K) or sc[j] the int8 scale of sub-block j of 16 (q6_K, as
 * uint8 bits), and the f16 d and dmin (0 for q6_K). */
void kq_block_ints(enum kvd_wtype t, const void *blk, uint8_t q[256], uint8_t sc[16], uint8_t mn[8], uint16_t *d,
		   uint16_t *dmin);
void cpu_gemm_pack(enum kvd_wtype t, const void *src, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
		   unsigned pack);
/* The stored bytes of row r (row_bytes of them) back from a matrix packed
 * by cpu_gemm_pack, exactly as they were; returns 0, or -1 for the types
 * whose packing does not keep their bytes (q5_0, q5_1, the K-quants). */
int cpu_gemm_unpack_row(enum kvd_wtype t, const void *packed, int64_t cols, int64_t r, void *row);

/* Attention of nr query rows over one chunk of at most 128 positions (K
 * and V rows in f16, k[p] and v[p] pointing at position p's head): row r
 * (query q[r]) sees the first len[r] >= 1 positions. Writes ml[r][0] = max
 * score, ml[r][1] = sum of exp(score - max), o[r] = that sum's weighted V
 * rows (unnormalised). scratch: ATTN_ROWS_SCRATCH(nr, head size) floats
 * (room for the chunk's K and V rows as floats included). A row's result
 * depends only on its query, its length and the keys and values it sees. */
#define ATTN_ROWS_SCRATCH(nr, hd) \
	((size_t)(nr) * (128 + (size_t)(hd) / 2) + 16 * (size_t)(hd) + 2 * 128 * (size_t)(hd))
typedef void (*attn_rows_fn)(int nr, const float *const *q, const int *len, const uint16_t *const *k,
			     const uint16_t *const *v, float scale, float *const *ml, float *const *o, float *scratch);
/* The AVX-512 version for head size hd, or NULL (other sizes, other CPUs). */
attn_rows_fn cpu_attn_rows_avx512(int hd);
/* The same with AVX2 and FMA (8 lanes; other bits than AVX-512's). */
attn_rows_fn cpu_attn_rows_avx2(int hd);
/* The same for K/V stored as bfloat16 (uint16_t rows of that type), with
 * AVX-512 BF16 products (kernels/cpu/attn_bf16.c for the arithmetic), or
 * NULL (other head sizes, other CPUs). */
attn_rows_fn cpu_attn_rows_bf16(int hd);
/* The AVX2 kernel over bf16 K/V rows (each element widened to a float
 * exactly, then the f16 kernel's float arithmetic), or NULL. */
attn_rows_fn cpu_attn_rows_bf16_avx2(int hd);
/* attn_rows_fn's work for G KV heads of one chunk at once, as a decode
 * step deep in its context makes it: position p's K and V rows of head g
 * at k[p] + g * hd and v[p] + g * hd (a token's heads side by side, as the
 * KV pool stores them), head g's nr query rows q[g * nr + r], all seeing
 * the chunk's n positions, results to ml[g * nr + r] and o[g * nr + r].
 * Read a head at a time, a position's rows give each head 1/G of their
 * cache lines, an order memory serves at about half the speed of address
 * order (Zen 2: 6.5-7.3 GB/s against 14.5-15.7 from one core); this one
 * reads them in address order. Each head's results are the same bits as
 * attn_rows_fn's for its rows. G * nr <= ATTN_HEADS_MAX_ROWS; scratch:
 * ATTN_ROWS_SCRATCH(G * nr, hd) floats. */
#define ATTN_HEADS_MAX_ROWS 64
typedef void (*attn_heads_fn)(int G, int nr, int n, const float *const *q, const uint16_t *const *k,
			      const uint16_t *const *v, float scale, float *const *ml, float *const *o,
			      float *scratch);
/* The AVX2 one over f16 (bf16 = 0) or bfloat16 rows, or NULL (head sizes
 * other than 64, 128 and 256; CPUs without AVX2) */
attn_heads_fn cpu_attn_heads_avx2(int hd, int bf16);
/* The one of cpu_attn_rows_bf16 (AVX-512 BF16 products), or NULL */
attn_heads_fn cpu_attn_heads_bf16(int hd);

struct cpu_kernels {
	const char *isa; /* "avx512-vnni+amx", "avx512-vnni", "avx2" or "generic": what was installed */
	int isa_level;   /* what the backend allows (0 portable C, 1 AVX2 at most,
	                  * 2 AVX-512 at most, 3 AMX tiles too
	                  * 2 AVX-512 too): kernels chosen later follow it */
	vec_dot_fn dot[KVD_WTYPE_BF16 + 1]; /* by enum kvd_wtype */
	gemm_fn gemm[KVD_WTYPE_BF16 + 1];     /* NULL: use dot row by row on unpacked weights */
	gemmf_fn gemmf[KVD_WTYPE_BF16 + 1];   /* float weights: NULL likewise */
	gemm16_fn gemm16[KVD_WTYPE_BF16 + 1]; /* tiles of 16 tokens with gemm's bits, or NULL */
	unsigned pack_flags; /* the packed layout gemm reads (CPU_PACK_*, cpu_gemm_pack) */
	/* quantize n floats to a q8 row: n/32 blocks, then their sums */
	void (*quantize_q8)(const float *x, struct q8_block *y, int64_t n);
	/* the same with one scale per 256 elements (a shorter tail: one for
	 * the tail): d = max|x| over the 256 / 127, every one of their 8
	 * blocks holding that d, the quants and sums formed as above. What
	 * the K-quants' tiled kernels read (each super-block's d from its
	 * first block); the other kernels take such a row as any other. */
	void (*quantize_q8k)(const float *x, struct q8_block *y, int64_t n);
	/* sum_i q[i] * k[i] with k stored as f16 */
	float (*dot_f32_f16)(const float *q, const uint16_t *k, int n);
	/* y[i] += a * v[i] with v stored as f16 */
	void (*axpy_f16)(float *y, float a, const uint16_t *v, int n);
	/* out[j] = sum_i q[i] * k[j][i] for four f16 rows at once */
	void (*dot4_f32_f16)(const float *q, const uint16_t *const k[4], int n, float out[4]);
	/* y[r * ldy + i] += a[r] * v[i] for r < nr: one f16 row, converted
	 * once, into nr accumulators (the query heads of a KV group) */
	void (*axpyn_f16)(float *y, int ldy, const float *a, int nr, const uint16_t *v, int n);
	/* the attention kernel for a head size, or NULL: attention then runs
	 * on the helpers above */
	attn_rows_fn (*attn_rows_for)(int hd);
	/* dst[i] = f16(src[i]) */
	void (*store_f16)(uint16_t *dst, const float *src, int n);
	/* g[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)) */
	void (*swiglu)(float *g, const float *u, int64_t n);
	/* g = gelu_tanh(g) * u (GeGLU), gelu_tanh(x) = x * sigmoid(2 z),
	 * z = sqrt(2 / pi) (x + 0.044715 x^3), which equals the tanh form */
	void (*geglu)(float *g, const float *u, int64_t n);
	/* dst[i] = x[i] * s * g[i] (dst may be x), s = 1 / sqrt(mean of x^2
	 * + eps); the sum of squares in double over 8 interleaved partial
	 * sums (partial j: elements j, j + 8, ...), combined as ((p0 + p4) +
	 * (p2 + p6)) + ((p1 + p5) + (p3 + p7)): every version the same bits */
	void (*rmsnorm)(float *dst, const float *x, const float *g, int64_t n, float eps);
};

/* Fill the table for this CPU, using no instruction set beyond `isa`
 * (struct kvd_backend_config.cpu_isa). */
void cpu_kernels_init_isa(struct cpu_kernels *k, enum kvd_cpu_isa isa);
/* The same with force_generic: KVD_CPU_ISA_GENERIC, else KVD_CPU_ISA_BEST. */
void cpu_kernels_init(struct cpu_kernels *k, int force_generic);
/* Install the AVX-512 VNNI tiled kernels (used for every batch shape, so
 * results stay shape-independent); returns 1 if the CPU has them. */
int cpu_kernels_init_gemm_avx512(struct cpu_kernels *k);
/* The same tiled kernels with AVX2 only (bit-identical results). */
int cpu_kernels_init_gemm_avx2(struct cpu_kernels *k);
/* Beside the AVX-512 ones (their packed layout): gemm16, the same
 * products for tiles of 16 tokens on AMX-INT8 (bit-identical); returns 1
 * if the CPU has AMX and the kernel allows this process to use it. */
int cpu_kernels_init_gemm_amx(struct cpu_kernels *k);

/* The CPU's vendor (CPUID leaf 0), for the tiles' prefetch hints and
 * distances, which are measured per vendor. */
enum cpu_vendor { CPU_VENDOR_OTHER, CPU_VENDOR_INTEL, CPU_VENDOR_AMD };
enum cpu_vendor cpu_vendor(void);

/* Whether a weight type needs quantized activations. */
static inline int wtype_is_quantized(enum kvd_wtype t)
{
	return t == KVD_WTYPE_Q4_0 || t == KVD_WTYPE_Q4_1 || t == KVD_WTYPE_Q5_0 || t == KVD_WTYPE_Q5_1 ||
	       t == KVD_WTYPE_Q8_0 || t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K;
}

/* Whether a weight type's kernels read activations with one scale per
 * super-block of 256 (quantize_q8k). */
static inline int wtype_wants_q8k(enum kvd_wtype t)
{
	return t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K;
}

/* Decode n elements of a stored row to floats (embedding lookups). */
void cpu_dequantize_row(enum kvd_wtype t, const void *src, float *dst, int64_t n);

#endif
