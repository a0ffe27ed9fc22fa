/*
 * kernels/cpu/cpu_impl.h — private to the CPU backend: the context its two
 * files share (cpu_backend.c: init, weights and their packing, the matrix
 * products, KV pages, the capability query and the ops table;
 * cpu_forward.c: one step, the executor of the forward program) and the
 * product helpers the executor calls.
 */
#ifndef KVD_CPU_IMPL_H
#define KVD_CPU_IMPL_H

#include <stdint.h>

#include "attention.h"
#include "backend.h"
#include "ops.h"
#include "program.h"
#include "threadpool.h"

#define CPU_MAX_BATCH_TOKENS (1 << 16)

/* The departures from the Llama base this forward pass computes (see
 * kernels/backend.h): all of them. The Llama path is unchanged by them:
 * each applies only when the model's description uses it. */
#define CPU_FEATURES KVD_FEAT_ALL
/* attention keeps one running max per query head of a group */
#define CPU_MAX_GROUP 64

struct cpu_ctx {
	struct tp *pool;
	struct cpu_kernels k;
	const struct kvd_model_weights *w;
	struct kvd_program *prog; /* the forward pass (kernels/program.h), built at load */
	float attn_scale; /* Q.K multiplier: hp.attn_scale, or 1/sqrt(head_dim) */
	struct kvd_paged_view kv;
	int kv_attached;

	/* weights repacked for the tiled kernels (see gemm_avx512.c): one
	 * anonymous mapping, and per matrix its packed data or NULL when the
	 * matrix is used as stored; PK_* per layer, then the output matrix */
	void *pack_mem;
	size_t pack_len;
	const void **packed;

	/* per-step scratch, grown as needed */
	int cap_tokens;
	float *x;       /* [T][n_embd] residual stream */
	float *xn;      /* [T][max(n_embd, n_ff)] normalised input of a matmul */
	struct q8_block *xq; /* [T][max(n_embd, n_ff) / 32] */
	float *q;       /* [T][n_head * head_dim] */
	float *kk;      /* [T][kv_dim] */
	float *vv;      /* [T][kv_dim] */
	float *att;     /* [T][n_head * head_dim] */
	float *gate;    /* [T][n_ff] */
	float *up;      /* [T][n_ff] */
	int32_t *tok_seq; /* [T] sequence index of each row */
	int32_t *tok_pos; /* [T] position of each row */
	float *rope;      /* [T][head_dim]: cos, sin of each rotated pair */
	float *rope_alt;  /* the same for the RoPE used before (per-layer RoPE) */
	struct cpu_attn attn; /* attention and its scratch (attention.c) */
	float *logit_rows;/* [T][n_embd] normalised rows that want logits */
	int32_t *logit_src;/* [T] row index feeding each logit row */
	float *logits_tmp;/* [T][n_vocab] when callers want rows laid out differently */
	int cap_logit_rows;
};

/* The matrices of a layer in c->packed, PK_PER_LAYER per layer, then the
 * output matrix. */
enum { PK_Q, PK_K, PK_V, PK_O, PK_GATE, PK_UP, PK_DOWN, PK_PER_LAYER };

/* Y[t][r] = dot(W row r, X row t) for rows split across threads. The
 * activation rows are given as floats (ldx) and, for quantized weights, as
 * q8 blocks (ldq blocks per row). Output row stride ldy. */
struct mm_job {
	const struct cpu_ctx *c;
	const struct kvd_tensor *w;
	int T;
	const float *x;
	int64_t ldx;
	const struct q8_block *xq;
	int64_t ldq;
	float *y;
	int64_t ldy;
	const void *wp; /* packed weights (tiled kernels) or NULL */
};

/*
 * Several matrices sharing one input, as one parallel region. Rows are cut
 * into chunks handed out by the pool (tp_for), so a thread that the OS
 * preempts holds up at most the chunk it is on: the others take the rest
 * (static halves would make every step wait for the slowest thread). A
 * chunk's results do not depend on who computes it.
 */
#define MM_MAX_JOBS 3

struct mm_multi {
	struct mm_job jobs[MM_MAX_JOBS];
	int n;
	int64_t chunk_rows[MM_MAX_JOBS];
	int first[MM_MAX_JOBS + 1];   /* first chunk of each job; first[n] = total */
};

/* Run the jobs of m as one parallel region (cpu_backend.c). */
void be_mm_run(struct cpu_ctx *c, struct mm_multi *m);
/* y = w x for T rows: xq (q8 rows of ldq blocks) is read when w is
 * quantized, x (ldx floats a row) otherwise; wp its packed copy or NULL. */
void be_matmul(struct cpu_ctx *c, const struct kvd_tensor *w, const void *wp, int T, const float *x, int64_t ldx,
	       const struct q8_block *xq, int64_t ldq, float *y, int64_t ldy);
/* xq = the q8 form of T rows of n floats (x row stride ldx, xq ldq
 * blocks): with one scale per 256 (quantize_q8k) where k, else per 32. */
void be_quantize_rows(struct cpu_ctx *c, const float *x, int64_t ldx, struct q8_block *xq, int64_t ldq, int T,
		      int64_t n, int k);
/* fn over T rows of activations: inline for one or two rows, where a
 * parallel region costs more than the work; every worker's rows are
 * computed the same way either way. */
void be_run_rows(struct cpu_ctx *c, tp_fn fn, void *arg, int T);
/* The operation kinds (1 << kind bits) the executor implements: all. */
#define CPU_OP_KINDS KVD_OP_KINDS_ALL
/* The ops table's forward slot (cpu_forward.c). */
int be_forward(void *ctx, const struct kvd_batch *b);

#endif /* KVD_CPU_IMPL_H */
