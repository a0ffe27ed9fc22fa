/*
 * kernels/cuda/cuda_impl.h — private to the CUDA plug-in: the device
 * kernels' launch functions (kernels.cu, kernels_quant.cu, kernels_attn.cu)
 * as the host side (cuda_forward.cu, cuda_load.cu) calls them.
 *
 * Every launch function only enqueues work on the given stream and returns
 * the launch status (cudaGetLastError()); errors of the kernels themselves
 * surface at the next synchronisation. Symbols are hidden: the plug-in
 * exports nothing but kvd_backend_plugin_entry.
 *
 * Device layouts used throughout:
 *   weights     fp16, row-major [rows][cols] (dequantized at load), and
 *               for the GEMV path in their stored type (kernels_quant.cu)
 *   x           f32 [T][n_embd], the residual stream
 *   qkv         f32 [T][q_dim + 2 kv_dim]: Q heads, then K heads, then V
 *   att         fp16 [T][q_dim], attention output (input of wo)
 *   rope table  f32 [T][head_dim]: cos, sin of pair i at 2i, 2i + 1
 *   KV pool     the page layout of kernels/backend.h, in device memory,
 *               rows of any of its element types (cuda_kv.h)
 */
#ifndef KVD_CUDA_IMPL_H
#define KVD_CUDA_IMPL_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#define KVD_HIDDEN __attribute__((visibility("hidden")))

/* enum kvd_wtype values (kernels/backend.h), for device code. */
#define WT_F32 0
#define WT_F16 1
#define WT_Q4_0 2
#define WT_Q4_1 3
#define WT_Q5_0 6
#define WT_Q5_1 7
#define WT_Q8_0 8
#define WT_Q4_K 12
#define WT_Q5_K 13
#define WT_Q6_K 14
#define WT_BF16 30

/* Key positions per tile of the attention kernel. */
#define CU_ATTN_TILE 32
/* Threads per block of the attention kernel. */
#define CU_ATTN_THREADS 128

/* The KV pool as the kernels see it (kernels/backend.h layout). */
struct cu_kv {
	char *base;
	int32_t block_size;
	int32_t kv_dim;
	int32_t type;       /* enum kvd_kv_type of the K and V rows */
	int32_t head_bytes; /* bytes of one head's elements in a row */
	/* released pages (kernels/backend.h, KVD_CAP_PACKED_KV): layers without
	 * a window, and which of them the layer being computed is (-1: it has
	 * a window, and never reaches a released page) */
	int32_t n_global;
	int32_t layer_g;
	int64_t token_stride;
	int64_t v_offset;
	int64_t layer_stride;
	int64_t page_bytes;
};

/* The address of token `pos`'s K row for `layer` in the page table at
 * pages (V is v_offset further). A released entry kvd_page_packed(page,
 * slot) (the forward pass checked it, and only a layer without a window
 * reads one) is layer region slot * n_global + layer_g of that page. */
static __device__ __forceinline__ char *kv_row(const struct cu_kv &kv, const int32_t *pages, int layer, int pos)
{
	int32_t e = pages[pos / kv.block_size];
	int64_t page = e, region = layer;
	if (e < 0) {
		uint32_t v = (uint32_t)(-(int64_t)e - 3);
		page = v >> 8;
		region = (int64_t)(v & 255u) * kv.n_global + kv.layer_g;
	}
	return kv.base + page * kv.page_bytes + region * kv.layer_stride +
	       (int64_t)(pos % kv.block_size) * kv.token_stride;
}

/*
 * One block's work in the attention kernel: n_q consecutive new tokens of
 * one sequence (rows t0 .. t0 + n_q - 1 of the batch, at positions pos0 ..
 * pos0 + n_q - 1), whose page table starts at pages[page_off].
 */
struct cu_attn_item {
	int32_t t0;
	int32_t n_q;
	int32_t pos0;
	int32_t page_off;
};

/* Bytes of dynamic shared memory the attention kernel needs for rows query
 * rows (tokens x query heads of one group) of head_dim hd over a pool of
 * KV element type kv_type. */
KVD_HIDDEN size_t cu_attn_smem_bytes(int rows, int hd, int kv_type);
/* Allow the attention kernel up to `bytes` of dynamic shared memory. */
KVD_HIDDEN cudaError_t cu_attn_set_smem(size_t bytes);

/* dst[r][c] = element (r, c) of a stored weight matrix (kvd_wtype `type`,
 * row r at src + r * row_bytes), as fp16. */
KVD_HIDDEN cudaError_t cu_dequant_f16(const void *src, int type, int64_t rows, int64_t cols, size_t row_bytes,
				      __half *dst, cudaStream_t s);
/* x[t][c] = scale * element c of row tok[t] of the stored embedding table. */
KVD_HIDDEN cudaError_t cu_embed(const void *table, int type, size_t row_bytes, const int32_t *tok, int T, int n,
				float scale, float *x, cudaStream_t s);
/* out[i][:] = fp16(rmsnorm(x[src(i)][:]) * g), src(i) = idx ? idx[i] : i. */
KVD_HIDDEN cudaError_t cu_rmsnorm(const float *x, const int32_t *idx, int n_rows, int n, const float *g,
				  float eps, __half *out, cudaStream_t s);
/* x[t][:] += fp32(rmsnorm(y[t][:]) * g) for t < n_rows (post-norms). */
KVD_HIDDEN cudaError_t cu_rmsnorm_add(float *x, const float *y, int n_rows, int n, const float *g, float eps,
				      cudaStream_t s);
/* Every row of qkv (row stride ld: q_dim Q, kv_dim K, kv_dim V elements)
 * plus the biases bq, bk, bv, each optional (NULL: none). */
KVD_HIDDEN cudaError_t cu_add_bias(float *qkv, int ld, int T, int q_dim, int kv_dim, const float *bq,
				   const float *bk, const float *bv, cudaStream_t s);
/* Each Q head (q_norm) and K head (k_norm) of every row of qkv RMS-normed
 * in place over its hd elements; a NULL norm leaves its heads as they are. */
KVD_HIDDEN cudaError_t cu_head_norm(float *qkv, int ld, int T, int n_head, int n_head_kv, int hd, const float *q_norm,
				    const float *k_norm, float eps, cudaStream_t s);
/* tab[t][2i], tab[t][2i+1] = cos, sin of pos[t] * pos_scale * base^(-2i/hd)
 * / freqs[i] (freqs: device vector of hd/2, or NULL for 1), in double. */
KVD_HIDDEN cudaError_t cu_rope_table(const int32_t *pos, int T, int hd, float base, float pos_scale,
				     const float *freqs, float *tab, cudaStream_t s);
/* RoPE on Q and K of every row of qkv (in place), then K and V stored in
 * the pool's element type (kv.type) into the token's slot of its page for
 * `layer`. */
KVD_HIDDEN cudaError_t cu_rope_store(float *qkv, int ld, const float *tab, const int32_t *tok_pos,
				     const int32_t *tok_pageoff, const int32_t *pages, struct cu_kv kv, int layer,
				     int n_head, int n_head_kv, int hd, int neox, int T, cudaStream_t s);
/*
 * Attention for every item x KV head: causal softmax(scale q k^T) v over
 * positions 0 .. own position (window > 0: only the last `window` of
 * them), K/V read through the page tables,
 * each K/V tile loaded once for all the item's tokens and the whole query
 * group of the KV head; online softmax, no score matrix in global memory.
 * rows_max = max n_q * n_rep of the items (sizes shared memory).
 */
KVD_HIDDEN cudaError_t cu_attention(const float *qkv, int ld, __half *att, const struct cu_attn_item *items,
				    int n_items, const int32_t *pages, struct cu_kv kv, int layer, int n_head,
				    int n_head_kv, int hd, int rows_max, float scale, int window, cudaStream_t s);
/* h[t][i] = fp16(act(gu[t][i]) * gu[t][n_ff + i]), act silu, or with gelu
 * the tanh-approximated GELU. */
KVD_HIDDEN cudaError_t cu_glu(const float *gu, int T, int n_ff, int gelu, __half *h, cudaStream_t s);
/* Most tokens the dequantizing GEMV takes in one launch. */
#define CU_GEMV_MAX_T 8
/*
 * Y[t][r] = beta * Y[t][r] + dot(row r of W, X[t]) for t < T (<= CU_GEMV_MAX_T),
 * reading W in its stored type (any kvd_wtype, cols a multiple of 32),
 * dequantizing in f32 on the fly: each weight byte is read once per step
 * for all T tokens. X fp16 with row stride ldx, Y f32 with row stride ldy.
 */
KVD_HIDDEN cudaError_t cu_gemv(const void *W, int type, size_t row_bytes, int rows, int cols, const __half *X,
			       int ldx, int T, float *Y, int ldy, float beta, cudaStream_t s);
/*
 * kv_shift: the K rows of tokens 0 .. n_tokens - 1 of the page table pages
 * (device, one entry per block_size tokens), every layer and KV head,
 * rotated once more by the angles of tab[layer][2i], tab[layer][2i+1] (cos,
 * sin of pair i; pairs (2i, 2i+1), or (i, i + hd/2) with neox), in float
 * from the stored f16, bf16 or f32 element and rounded back to it. V rows
 * are untouched.
 */
KVD_HIDDEN cudaError_t cu_kv_shift(struct cu_kv kv, const int32_t *pages, int n_tokens, int n_layer, int n_head_kv,
				   int hd, int neox, const float *tab, cudaStream_t s);
/* dst + i * page_bytes <- pool page pages[i] (gather), i < n. */
KVD_HIDDEN cudaError_t cu_pages_gather(const char *pool, size_t page_bytes, const uint32_t *pages, int n,
				       char *dst, cudaStream_t s);
/* pool page pages[i] <- src + i * page_bytes (scatter). */
KVD_HIDDEN cudaError_t cu_pages_scatter(char *pool, size_t page_bytes, const uint32_t *pages, int n,
					const char *src, cudaStream_t s);

#endif
