/*
 * kernels/cuda/cuda_ctx.h — private to the CUDA plug-in: the context that
 * its host-side files share (cuda_backend.cu: init, KV pool, pages, the
 * capability query and the ops table; cuda_load.cu: weights and the
 * forward program; cuda_forward.cu: one step, the program's executor), the
 * limits they size things by, and the
 * error mapping every CUDA and cuBLAS call goes through.
 *
 * Errors: allocation failures are -ENOMEM, anything else from the device
 * -EIO (cuda_errno, blas_errno). CK / CKB check a call and jump to the
 * function's `fail:` label with r set.
 */
#ifndef KVD_CUDA_CTX_H
#define KVD_CUDA_CTX_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend.h"
}
#include "program.h"

#include "cuda_impl.h"

#define CU_MAX_BATCH_TOKENS (1 << 16)
/* Most query rows (tokens x group heads) one prefill attention block takes. */
#define CU_ATTN_MAX_ROWS 64
/* Shared memory the attention kernel may use per block. */
#define CU_ATTN_SMEM_BUDGET (96u << 10)
/* Device memory kept free for activations and cuBLAS when sizing the pool. */
#define CU_POOL_RESERVE_BYTES (512ull << 20)
/* Largest device staging buffer for batched swap (gather/scatter). */
#define CU_SWAP_STAGE_BYTES (64ull << 20)

/* A matrix kept on the device in its stored type, for the GEMV path. */
struct cu_raw {
	void *data; /* NULL when not kept */
	int type;
	size_t row_bytes;
	int rows, cols;
};

struct cu_layer {
	__half *wqkv;  /* [q_dim + 2 kv_dim][n_embd] */
	__half *wo;    /* [n_embd][q_dim] */
	__half *wgu;   /* [2 n_ff][n_embd]: gate rows, then up rows */
	__half *wdown; /* [n_embd][n_ff] */
	struct cu_raw rq, rk, rv, ro, rg, ru, rd; /* GEMV path only */
};

struct cu_ctx {
	int device;
	cudaStream_t s;      /* compute */
	cudaStream_t copy_s; /* swap copies */
	cudaEvent_t ev;      /* orders copy_s after compute work */
	cublasHandle_t blas;
	size_t smem_optin;

	/* weights */
	int loaded;
	struct kvd_hparams hp;
	struct kvd_program *prog;          /* the forward pass, built at load (kernels/program.h) */
	int q_dim, kv_dim;
	struct cu_layer *layers;
	void *tok_embd;
	int embd_type;
	size_t embd_row_bytes;
	__half *output;
	/* [prog->n_ops][3]: the device copy of each operation's f32 vectors
	 * (norm weights, biases, Q/K norms; NULL where it names none) */
	float *(*op_vec)[3];
	float *rope_freqs;  /* [head_dim / 2] frequency divisors, or NULL */
	/* released pages: each layer's index among the layers without a
	 * window (-1 for a windowed one), their count, the packed page's slots
	 * and the widest window (kvd_kv_pack_slots) */
	int32_t *glob_idx;
	uint32_t n_global, pack_slots, max_window;
	size_t weight_bytes;
	int bq; /* tokens per prefill attention block */
	/* steps of at most gemv_max_t tokens run their projections through
	 * the dequantizing GEMV on the stored weights (0: always cuBLAS) */
	int gemv_max_t;
	struct cu_raw rout; /* output matrix, stored type (GEMV path) */
	int rout_owned;     /* 0: rout.data is tok_embd (tied) */

	/* KV */
	int kv_attached;
	struct kvd_kv_layout L;
	uint32_t n_pages;
	char *pool;
	void *host_base;
	size_t host_bytes;
	int host_registered;
	/* kv_shift: the rotation table [n_layer][head_dim] and the page list */
	float *shift_tab_h, *shift_tab_d;
	int32_t *shift_pages_d;
	uint32_t cap_shift_pages;

	/* step scratch (device) */
	int cap_T;
	float *x, *qkv, *gu, *rope;
	float *y; /* [T][n_embd]: a sublayer's output before its post-norm */
	__half *xn, *att, *h;
	int cap_nl;
	float *logits_d;
	float *logits_h; /* pinned */
	size_t cap_stage;
	int32_t *stage_h; /* pinned */
	int32_t *stage_d;
	/* swap staging */
	char *swap_d;
	uint32_t *swap_pages_d;
};

static inline int cuda_errno(cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	(void)cudaGetLastError(); /* clear a non-sticky error */
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static inline int blas_errno(cublasStatus_t st)
{
	if (st == CUBLAS_STATUS_SUCCESS)
		return 0;
	return st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
}

#define CK(call)                                   \
	do {                                       \
		r = cuda_errno(call);              \
		if (r < 0)                         \
			goto fail;                 \
	} while (0)

#define CKB(call)                                  \
	do {                                       \
		r = blas_errno(call);              \
		if (r < 0)                         \
			goto fail;                 \
	} while (0)

static inline void dfree(void *p)
{
	if (p)
		(void)cudaFree(p);
}

static inline int dalloc(void **p, size_t bytes, size_t *count)
{
	cudaError_t e = cudaMalloc(p, bytes);
	if (e != cudaSuccess) {
		*p = NULL;
		return cuda_errno(e);
	}
	if (count)
		*count += bytes;
	return 0;
}

/* ---- across the plug-in's files ------------------------------------------- */

/* The model features (KVD_FEAT_*) the plug-in computes: all of them. */
#define CU_FEATURES KVD_FEAT_ALL
/* The forward program's operation kinds (1 << kind bits) its executor
 * implements (cuda_forward.cu): all of them. */
#define CU_OP_KINDS KVD_OP_KINDS_ALL

/* Whether the device kernels read weight type t (cuda_load.cu). */
KVD_HIDDEN int cu_type_ok(enum kvd_wtype t);
/* Largest number of tokens per prefill attention block whose shared
 * memory fits over a pool of KV element type kv_type (enum kvd_kv_type);
 * 0 if not even one does (cuda_load.cu). */
KVD_HIDDEN int cu_choose_bq(struct cu_ctx *c, int n_rep, int hd, int kv_type);
/* Let the attention kernel take the shared memory of c->bq tokens of the
 * model over kv_type (cuda_load.cu). */
KVD_HIDDEN int cu_attn_smem_allow(struct cu_ctx *c, int kv_type);
/* The ops table's load slot (cuda_load.cu). */
KVD_HIDDEN int cuda_load(void *ctx, const struct kvd_model_weights *w);
/* Free every weight buffer; the context is then unloaded (cuda_load.cu). */
KVD_HIDDEN void cu_free_weights(struct cu_ctx *c);
/* The ops table's forward slot (cuda_forward.cu). */
KVD_HIDDEN int cuda_forward(void *ctx, const struct kvd_batch *b);
/* Free the step scratch buffers (cuda_forward.cu). */
KVD_HIDDEN void cu_free_scratch(struct cu_ctx *c);

#endif
