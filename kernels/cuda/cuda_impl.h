/*
 * kernels/cuda/cuda_impl.h — private to the CUDA plug-in: the device
 * kernels' launch functions (kernels.cu) as the backend (cuda_backend.cu)
 * calls them.
 *
 * Every launch function only enqueues work on the given stream and returns
 * the launch status (cudaGetLastError()); errors of the kernels themselves
 * surface at the next synchronisation. Symbols are hidden: the plug-in
 * exports nothing but kvd_backend_plugin_entry.
 *
 * Device layouts used throughout:
 *   weights     fp16, row-major [rows][cols] (dequantized at load)
 *   x           f32 [T][n_embd], the residual stream
 *   qkv         f32 [T][q_dim + 2 kv_dim]: Q heads, then K heads, then V
 *   att         fp16 [T][q_dim], attention output (input of wo)
 *   rope table  f32 [T][head_dim]: cos, sin of pair i at 2i, 2i + 1
 *   KV pool     the page layout of kernels/backend.h, in device memory
 */
#ifndef KVD_CUDA_IMPL_H
#define KVD_CUDA_IMPL_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#define KVD_HIDDEN __attribute__((visibility("hidden")))

/* Key positions per tile of the attention kernel. */
#define CU_ATTN_TILE 32
/* Threads per block of the attention kernel. */
#define CU_ATTN_THREADS 128

/* The KV pool as the kernels see it (kernels/backend.h layout). */
struct cu_kv {
	char *base;
	int32_t block_size;
	int32_t kv_dim;
	int64_t token_stride;
	int64_t v_offset;
	int64_t layer_stride;
	int64_t page_bytes;
};

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
 * rows (tokens x query heads of one group) of head_dim hd. */
KVD_HIDDEN size_t cu_attn_smem_bytes(int rows, int hd);
/* Allow the attention kernel up to `bytes` of dynamic shared memory. */
KVD_HIDDEN cudaError_t cu_attn_set_smem(size_t bytes);

/* dst[r][c] = element (r, c) of a stored weight matrix (kvd_wtype `type`,
 * row r at src + r * row_bytes), as fp16. */
KVD_HIDDEN cudaError_t cu_dequant_f16(const void *src, int type, int64_t rows, int64_t cols, size_t row_bytes,
				      __half *dst, cudaStream_t s);
/* x[t][c] = element c of row tok[t] of the stored embedding table. */
KVD_HIDDEN cudaError_t cu_embed(const void *table, int type, size_t row_bytes, const int32_t *tok, int T, int n,
				float *x, cudaStream_t s);
/* out[i][:] = fp16(rmsnorm(x[src(i)][:]) * g), src(i) = idx ? idx[i] : i. */
KVD_HIDDEN cudaError_t cu_rmsnorm(const float *x, const int32_t *idx, int n_rows, int n, const float *g,
				  float eps, __half *out, cudaStream_t s);
/* tab[t][2i], tab[t][2i+1] = cos, sin of pos[t] * base^(-2i/hd), in double. */
KVD_HIDDEN cudaError_t cu_rope_table(const int32_t *pos, int T, int hd, float base, float *tab, cudaStream_t s);
/* RoPE on Q (in place) and K of every row of qkv, then K and V stored as
 * fp16 into the token's slot of its page for `layer`. */
KVD_HIDDEN cudaError_t cu_rope_store(float *qkv, int ld, const float *tab, const int32_t *tok_pos,
				     const int32_t *tok_pageoff, const int32_t *pages, struct cu_kv kv, int layer,
				     int n_head, int n_head_kv, int hd, int neox, int T, cudaStream_t s);
/*
 * Attention for every item x KV head: causal softmax(q k^T / sqrt(hd)) v
 * over positions 0 .. own position, K/V read through the page tables,
 * each K/V tile loaded once for all the item's tokens and the whole query
 * group of the KV head; online softmax, no score matrix in global memory.
 * rows_max = max n_q * n_rep of the items (sizes shared memory).
 */
KVD_HIDDEN cudaError_t cu_attention(const float *qkv, int ld, __half *att, const struct cu_attn_item *items,
				    int n_items, const int32_t *pages, struct cu_kv kv, int layer, int n_head,
				    int n_head_kv, int hd, int rows_max, cudaStream_t s);
/* h[t][i] = fp16(silu(gu[t][i]) * gu[t][n_ff + i]). */
KVD_HIDDEN cudaError_t cu_swiglu(const float *gu, int T, int n_ff, __half *h, cudaStream_t s);
/* Most tokens the dequantizing GEMV takes in one launch. */
#define CU_GEMV_MAX_T 8
/*
 * Y[t][r] = beta * Y[t][r] + dot(row r of W, X[t]) for t < T (<= CU_GEMV_MAX_T),
 * reading W in its stored type (kvd_wtype `type`, cols a multiple of 32),
 * dequantizing in f32 on the fly: each weight byte is read once per step
 * for all T tokens. X fp16 with row stride ldx, Y f32 with row stride ldy.
 */
KVD_HIDDEN cudaError_t cu_gemv(const void *W, int type, size_t row_bytes, int rows, int cols, const __half *X,
			       int ldx, int T, float *Y, int ldy, float beta, cudaStream_t s);
/* dst + i * page_bytes <- pool page pages[i] (gather), i < n. */
KVD_HIDDEN cudaError_t cu_pages_gather(const char *pool, size_t page_bytes, const uint32_t *pages, int n,
				       char *dst, cudaStream_t s);
/* pool page pages[i] <- src + i * page_bytes (scatter). */
KVD_HIDDEN cudaError_t cu_pages_scatter(char *pool, size_t page_bytes, const uint32_t *pages, int n,
					const char *src, cudaStream_t s);

#endif
