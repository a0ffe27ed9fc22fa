/*
 * kernels/cuda/cuda_backend.cu — kvd's CUDA backend, a plug-in shared
 * object (libkvd-cuda.so) that the engine dlopen()s and reaches through one
 * symbol, kvd_backend_plugin_entry(), which returns the const ops table of
 * kernels/backend.h with name "cuda".
 *
 * What lives where:
 *  - weights: at load every matrix is dequantized on the device to fp16
 *    (row-major, as stored), wq/wk/wv concatenated into one matrix and
 *    w_gate/w_up into another, so each step runs one GEMM per group through
 *    cublasGemmEx (fp16 inputs, f32 accumulation and output). The token
 *    embedding stays in its stored type and rows are dequantized on lookup.
 *    Norm weights stay f32. With KVD_CUDA_GEMV_MAX_TOKENS=N (1..8) the
 *    matrices are also kept in their stored type, and steps of at most N
 *    tokens (decode) run a dequantizing GEMV over them instead, reading
 *    a quarter of the bytes for q4 weights.
 *  - KV: a device pool of the view's n_pages pages in the f16 layout of
 *    kernels/backend.h (the capability query says no to the other element
 *    types; `backend = auto` then serves them on the CPU). When the view has a host mapping (kvmm's memfd),
 *    it is registered as pinned memory: the host tier that page_read and
 *    page_write (swap) move pages to and from, by DMA on a copy stream of
 *    their own. The host mapping is never the authoritative copy.
 *  - a step: embedding -> per layer [RMSNorm -> QKV GEMM -> RoPE + K/V
 *    stored into pages -> paged attention -> wo GEMM added to the residual
 *    -> RMSNorm -> gate/up GEMM -> SwiGLU -> down GEMM added to the
 *    residual] -> final RMSNorm of the rows that want logits -> output GEMM
 *    -> logits copied to the caller. All on one compute stream; forward()
 *    returns when the step is complete.
 *
 * Numerics: activations enter GEMMs as fp16 and accumulate in f32; the
 * residual stream, norms, RoPE and softmax are f32. Results differ from the
 * CPU backend (which multiplies quantized weights with 8-bit activations)
 * within the tolerance stated in tests/unit/test_cuda.c, and cuBLAS may
 * choose algorithms by shape, so a sequence's logits may change in the last
 * bits with its batch-mates.
 *
 * Errors: every CUDA and cuBLAS call is checked; allocation failures give
 * -ENOMEM, anything else from the device -EIO, a missing driver or GPU at
 * init -ENODEV. After -EIO from forward the context should be destroyed
 * (a device fault poisons the whole CUDA context).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend.h"
}

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
	float *attn_norm, *ffn_norm;
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
	int q_dim, kv_dim;
	struct cu_layer *layers;
	void *tok_embd;
	int embd_type;
	size_t embd_row_bytes;
	__half *output;
	float *output_norm;
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

	/* step scratch (device) */
	int cap_T;
	float *x, *qkv, *gu, *rope;
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

static int cuda_errno(cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	(void)cudaGetLastError(); /* clear a non-sticky error */
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static int blas_errno(cublasStatus_t st)
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

static void dfree(void *p)
{
	if (p)
		(void)cudaFree(p);
}

/* ---- init / destroy -------------------------------------------------------- */

static void free_weights(struct cu_ctx *c)
{
	if (c->layers) {
		for (int l = 0; l < c->hp.n_layer; l++) {
			struct cu_layer *L = &c->layers[l];
			dfree(L->rq.data);
			dfree(L->rk.data);
			dfree(L->rv.data);
			dfree(L->ro.data);
			dfree(L->rg.data);
			dfree(L->ru.data);
			dfree(L->rd.data);
			dfree(L->wqkv);
			dfree(L->wo);
			dfree(L->wgu);
			dfree(L->wdown);
			dfree(L->attn_norm);
			dfree(L->ffn_norm);
		}
		free(c->layers);
		c->layers = NULL;
	}
	if (c->rout_owned)
		dfree(c->rout.data);
	memset(&c->rout, 0, sizeof(c->rout));
	c->rout_owned = 0;
	dfree(c->tok_embd);
	dfree(c->output);
	dfree(c->output_norm);
	c->tok_embd = NULL;
	c->output = NULL;
	c->output_norm = NULL;
	c->loaded = 0;
	c->weight_bytes = 0;
}

static void free_scratch(struct cu_ctx *c)
{
	dfree(c->x);
	dfree(c->qkv);
	dfree(c->gu);
	dfree(c->rope);
	dfree(c->xn);
	dfree(c->att);
	dfree(c->h);
	c->x = c->qkv = c->gu = c->rope = NULL;
	c->xn = c->att = c->h = NULL;
	c->cap_T = 0;
	dfree(c->logits_d);
	if (c->logits_h)
		(void)cudaFreeHost(c->logits_h);
	c->logits_d = c->logits_h = NULL;
	c->cap_nl = 0;
	if (c->stage_h)
		(void)cudaFreeHost(c->stage_h);
	dfree(c->stage_d);
	c->stage_h = c->stage_d = NULL;
	c->cap_stage = 0;
}

static void free_kv(struct cu_ctx *c)
{
	dfree(c->pool);
	c->pool = NULL;
	if (c->host_registered)
		(void)cudaHostUnregister(c->host_base);
	c->host_registered = 0;
	c->host_base = NULL;
	dfree(c->swap_d);
	dfree(c->swap_pages_d);
	c->swap_d = NULL;
	c->swap_pages_d = NULL;
	c->kv_attached = 0;
}

static void cuda_destroy(void *ctx)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	if (!c)
		return;
	(void)cudaSetDevice(c->device);
	if (c->s)
		(void)cudaStreamSynchronize(c->s);
	if (c->copy_s)
		(void)cudaStreamSynchronize(c->copy_s);
	free_kv(c);
	free_scratch(c);
	free_weights(c);
	if (c->blas)
		(void)cublasDestroy(c->blas);
	if (c->ev)
		(void)cudaEventDestroy(c->ev);
	if (c->copy_s)
		(void)cudaStreamDestroy(c->copy_s);
	if (c->s)
		(void)cudaStreamDestroy(c->s);
	(void)cudaGetLastError();
	free(c);
}

static int cuda_init(const struct kvd_backend_config *cfg, void **ret_ctx)
{
	struct cu_ctx *c;
	int n = 0, dev = cfg ? cfg->device : 0, optin = 0;
	int r;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
		(void)cudaGetLastError();
		return -ENODEV;
	}
	if (dev < 0 || dev >= n)
		return -ENODEV;
	c = (struct cu_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->device = dev;
	{
		/* KVD_CUDA_GEMV_MAX_TOKENS=N (0..8): decode steps of up to N
		 * tokens use the dequantizing GEMV instead of cuBLAS on fp16 */
		const char *g = getenv("KVD_CUDA_GEMV_MAX_TOKENS");
		int v = g ? atoi(g) : 0;
		c->gemv_max_t = v < 0 ? 0 : v > CU_GEMV_MAX_T ? CU_GEMV_MAX_T : v;
	}
	r = cuda_errno(cudaSetDevice(dev));
	if (r < 0) {
		free(c);
		return -ENODEV;
	}
	CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
	c->smem_optin = (size_t)optin;
	CK(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&c->copy_s, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming));
	CKB(cublasCreate(&c->blas));
	CKB(cublasSetStream(c->blas, c->s));
	*ret_ctx = c;
	return 0;
fail:
	cuda_destroy(c);
	return r;
}

/* ---- load ---------------------------------------------------------------------- */

static int cu_type_ok(enum kvd_wtype t)
{
	return t == KVD_WTYPE_F32 || t == KVD_WTYPE_F16 || t == KVD_WTYPE_BF16 || t == KVD_WTYPE_Q4_0 ||
	       t == KVD_WTYPE_Q4_1 || t == KVD_WTYPE_Q8_0;
}

static int check_weights(const struct kvd_model_weights *w)
{
	const struct kvd_hparams *hp = &w->hp;
	int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	int r = kvd_model_weights_check(w, CU_ATTN_MAX_ROWS) < 0 ? -EINVAL : 0;

	/* cuBLAS takes int dimensions; kernels index rows with int */
	if (qd + 2 * kvd > (1 << 30) || 2 * (int64_t)hp->n_ff > (1 << 30))
		r = -EINVAL;
	if (r)
		return -EINVAL;
	/* the device kernels read the 32-element block types only */
	if (!cu_type_ok(w->tok_embd.type) || !cu_type_ok(w->output.type))
		return -ENOTSUP;
	for (int l = 0; l < hp->n_layer; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		const struct kvd_tensor *m[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
		for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
			if (!cu_type_ok(m[i]->type))
				return -ENOTSUP;
	}
	return 0;
}

static size_t tensor_bytes(const struct kvd_tensor *t)
{
	return (size_t)t->rows * t->row_bytes;
}

static int dalloc(void **p, size_t bytes, size_t *count)
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

/* Upload t and dequantize it into dst: through the raw staging buffer, or,
 * with keep (GEMV path), through a device copy in the stored type that
 * stays. */
static int upload_f16(struct cu_ctx *c, const struct kvd_tensor *t, void *raw_d, __half *dst, struct cu_raw *keep)
{
	int r;
	if (keep) {
		r = dalloc(&keep->data, tensor_bytes(t), &c->weight_bytes);
		if (r < 0)
			goto fail;
		keep->type = t->type;
		keep->row_bytes = t->row_bytes;
		keep->rows = (int)t->rows;
		keep->cols = (int)t->cols;
		raw_d = keep->data;
	}
	CK(cudaMemcpyAsync(raw_d, t->data, tensor_bytes(t), cudaMemcpyHostToDevice, c->s));
	CK(cu_dequant_f16(raw_d, t->type, t->rows, t->cols, t->row_bytes, dst, c->s));
	return 0;
fail:
	return r;
}

#define DALLOC(ptr, bytes)                                                        \
	do {                                                                      \
		r = dalloc((void **)&(ptr), (bytes), &c->weight_bytes);            \
		if (r < 0)                                                        \
			goto fail;                                                \
	} while (0)

static int upload_f32(struct cu_ctx *c, const struct kvd_tensor *t, float **ret)
{
	int r;
	float *d = NULL;
	DALLOC(d, tensor_bytes(t));
	CK(cudaMemcpyAsync(d, t->data, tensor_bytes(t), cudaMemcpyHostToDevice, c->s));
	*ret = d;
	return 0;
fail:
	dfree(d);
	return r;
}

/* Largest number of tokens per prefill attention block whose shared
 * memory fits; 0 if not even one does. */
static int choose_bq(struct cu_ctx *c, int n_rep, int hd)
{
	size_t budget = c->smem_optin < CU_ATTN_SMEM_BUDGET ? c->smem_optin : CU_ATTN_SMEM_BUDGET;
	for (int bq = CU_ATTN_MAX_ROWS / n_rep; bq >= 1; bq--)
		if (cu_attn_smem_bytes(bq * n_rep, hd) <= budget)
			return bq;
	if (cu_attn_smem_bytes(n_rep, hd) <= c->smem_optin)
		return 1;
	return 0;
}

static int cuda_load(void *ctx, const struct kvd_model_weights *w)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	const struct kvd_hparams *hp = &w->hp;
	void *raw = NULL;
	size_t raw_bytes = 0;
	int64_t ne, qd, kvd, nff;
	int r;

	if (c->loaded)
		return -EALREADY;
	r = check_weights(w);
	if (r < 0)
		return r;
	CK(cudaSetDevice(c->device));
	c->hp = *hp;
	ne = hp->n_embd;
	qd = (int64_t)hp->n_head * hp->head_dim;
	kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	nff = hp->n_ff;
	c->q_dim = (int)qd;
	c->kv_dim = (int)kvd;
	c->bq = choose_bq(c, hp->n_head / hp->n_head_kv, hp->head_dim);
	if (!c->bq) {
		r = -ENOTSUP;
		goto fail;
	}
	if (cu_attn_smem_bytes(c->bq * (hp->n_head / hp->n_head_kv), hp->head_dim) > (48u << 10))
		CK(cu_attn_set_smem(cu_attn_smem_bytes(c->bq * (hp->n_head / hp->n_head_kv), hp->head_dim)));

	/* one raw staging buffer, as large as the largest stored matrix */
	raw_bytes = tensor_bytes(&w->output);
	for (int l = 0; l < hp->n_layer; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		const struct kvd_tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
		for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
			if (tensor_bytes(ts[i]) > raw_bytes)
				raw_bytes = tensor_bytes(ts[i]);
	}
	r = dalloc(&raw, raw_bytes, NULL);
	if (r < 0)
		goto fail;

	c->layers = (struct cu_layer *)calloc((size_t)hp->n_layer, sizeof(*c->layers));
	if (!c->layers) {
		r = -ENOMEM;
		goto fail;
	}
	for (int l = 0; l < hp->n_layer; l++) {
		const struct kvd_layer_weights *W = &w->layers[l];
		struct cu_layer *L = &c->layers[l];
		DALLOC(L->wqkv, (size_t)(qd + 2 * kvd) * ne * sizeof(__half));
		DALLOC(L->wo, (size_t)ne * qd * sizeof(__half));
		DALLOC(L->wgu, (size_t)2 * nff * ne * sizeof(__half));
		DALLOC(L->wdown, (size_t)ne * nff * sizeof(__half));
		int g = c->gemv_max_t > 0;
		r = upload_f16(c, &W->wq, raw, L->wqkv, g ? &L->rq : NULL);
		if (!r)
			r = upload_f16(c, &W->wk, raw, L->wqkv + (size_t)qd * ne, g ? &L->rk : NULL);
		if (!r)
			r = upload_f16(c, &W->wv, raw, L->wqkv + (size_t)(qd + kvd) * ne, g ? &L->rv : NULL);
		if (!r)
			r = upload_f16(c, &W->wo, raw, L->wo, g ? &L->ro : NULL);
		if (!r)
			r = upload_f16(c, &W->w_gate, raw, L->wgu, g ? &L->rg : NULL);
		if (!r)
			r = upload_f16(c, &W->w_up, raw, L->wgu + (size_t)nff * ne, g ? &L->ru : NULL);
		if (!r)
			r = upload_f16(c, &W->w_down, raw, L->wdown, g ? &L->rd : NULL);
		if (!r)
			r = upload_f32(c, &W->attn_norm, &L->attn_norm);
		if (!r)
			r = upload_f32(c, &W->ffn_norm, &L->ffn_norm);
		if (r < 0)
			goto fail;
	}
	DALLOC(c->output, (size_t)hp->n_vocab * ne * sizeof(__half));
	{
		int keep = c->gemv_max_t > 0 && w->output.data != w->tok_embd.data;
		r = upload_f16(c, &w->output, raw, c->output, keep ? &c->rout : NULL);
		if (r < 0)
			goto fail;
		c->rout_owned = keep;
	}
	r = upload_f32(c, &w->output_norm, &c->output_norm);
	if (r < 0)
		goto fail;
	DALLOC(c->tok_embd, tensor_bytes(&w->tok_embd));
	CK(cudaMemcpyAsync(c->tok_embd, w->tok_embd.data, tensor_bytes(&w->tok_embd), cudaMemcpyHostToDevice, c->s));
	c->embd_type = w->tok_embd.type;
	c->embd_row_bytes = w->tok_embd.row_bytes;
	if (c->gemv_max_t > 0 && !c->rout_owned) { /* tied: the embedding is the output */
		c->rout.data = c->tok_embd;
		c->rout.type = w->tok_embd.type;
		c->rout.row_bytes = w->tok_embd.row_bytes;
		c->rout.rows = (int)w->tok_embd.rows;
		c->rout.cols = (int)w->tok_embd.cols;
	}
	CK(cudaStreamSynchronize(c->s));
	dfree(raw);
	c->loaded = 1;
	return 0;
fail:
	if (c->s)
		(void)cudaStreamSynchronize(c->s);
	dfree(raw);
	free_weights(c);
	(void)cudaGetLastError();
	return r;
}

/* ---- KV pool -------------------------------------------------------------------- */

static int cuda_attach_kv(void *ctx, const struct kvd_paged_view *view)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	const struct kvd_kv_layout *vl = &view->layout;
	struct kvd_kv_layout want;
	size_t bytes;
	int r;

	if (!c->loaded || c->kv_attached)
		return -EINVAL;
	/* the kernels read and write f16 K/V only (cuda_supports says so; the
	 * engine never attaches another): refused before anything is allocated */
	if (vl->type != KVD_KV_F16)
		return -ENOTSUP;
	kvd_kv_layout_init(&want, &c->hp, vl->block_size);
	if (vl->block_size == 0 || view->n_pages == 0 || vl->n_layer != want.n_layer || vl->kv_dim != want.kv_dim ||
	    vl->token_stride != want.token_stride || vl->v_offset != want.v_offset ||
	    vl->layer_stride != want.layer_stride || vl->page_bytes != want.page_bytes)
		return -EINVAL;
	CK(cudaSetDevice(c->device));
	bytes = (size_t)view->n_pages * vl->page_bytes;
	r = dalloc((void **)&c->pool, bytes, NULL);
	if (r < 0)
		goto fail;
	CK(cudaMemsetAsync(c->pool, 0, bytes, c->s));
	CK(cudaStreamSynchronize(c->s));
	c->L = *vl;
	c->n_pages = view->n_pages;
	if (view->base) {
		/* the host tier: pinned so that swap copies are DMA; where the
		 * mapping cannot be registered, copies still work (staged by
		 * the driver), only slower */
		if (cudaHostRegister(view->base, bytes, cudaHostRegisterDefault) == cudaSuccess)
			c->host_registered = 1;
		else
			(void)cudaGetLastError();
		c->host_base = view->base;
		c->host_bytes = bytes;
	}
	c->kv_attached = 1;
	return 0;
fail:
	free_kv(c);
	return r;
}

/* ---- forward -------------------------------------------------------------------- */

#define GROW_D(ptr, bytes)                                   \
	do {                                                 \
		dfree(ptr);                                  \
		(ptr) = NULL;                                \
		r = dalloc((void **)&(ptr), (bytes), NULL);  \
		if (r < 0)                                   \
			goto fail;                           \
	} while (0)

static int ensure_scratch(struct cu_ctx *c, int T, int n_logit_rows, size_t stage_ints)
{
	const struct kvd_hparams *hp = &c->hp;
	size_t ne = (size_t)hp->n_embd, nff = (size_t)hp->n_ff, qd = (size_t)c->q_dim, kvd = (size_t)c->kv_dim;
	size_t wide = ne > qd ? ne : qd;
	int r = 0;

	if (T > c->cap_T) {
		size_t n = (size_t)(T < 16 ? 16 : T);
		c->cap_T = 0;
		GROW_D(c->x, n * ne * sizeof(float));
		GROW_D(c->qkv, n * (qd + 2 * kvd) * sizeof(float));
		GROW_D(c->gu, n * 2 * nff * sizeof(float));
		GROW_D(c->rope, n * (size_t)hp->head_dim * sizeof(float));
		GROW_D(c->xn, n * wide * sizeof(__half));
		GROW_D(c->att, n * qd * sizeof(__half));
		GROW_D(c->h, n * nff * sizeof(__half));
		c->cap_T = (int)n;
	}
	if (n_logit_rows > c->cap_nl) {
		size_t n = (size_t)n_logit_rows;
		c->cap_nl = 0;
		GROW_D(c->logits_d, n * (size_t)hp->n_vocab * sizeof(float));
		if (c->logits_h)
			(void)cudaFreeHost(c->logits_h);
		c->logits_h = NULL;
		CK(cudaMallocHost((void **)&c->logits_h, n * (size_t)hp->n_vocab * sizeof(float)));
		c->cap_nl = (int)n;
	}
	if (stage_ints > c->cap_stage) {
		size_t n = stage_ints < 4096 ? 4096 : stage_ints * 2;
		c->cap_stage = 0;
		GROW_D(c->stage_d, n * sizeof(int32_t));
		if (c->stage_h)
			(void)cudaFreeHost(c->stage_h);
		c->stage_h = NULL;
		CK(cudaMallocHost((void **)&c->stage_h, n * sizeof(int32_t)));
		c->cap_stage = n;
	}
	return 0;
fail:
	return r;
}

/* Y[T][rows] (row stride ldy, f32) = beta * Y + X[T][cols] (fp16, row stride
 * ldx) times W^T, W fp16 row-major [rows][cols]. */
static int gemm(struct cu_ctx *c, const __half *W, int rows, int cols, const __half *X, int ldx, int T, float *Y,
		int ldy, float beta)
{
	const float alpha = 1.0f;
	return blas_errno(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, cols, &alpha, W, CUDA_R_16F, cols,
				       X, CUDA_R_16F, ldx, &beta, Y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
				       CUBLAS_GEMM_DEFAULT));
}

/* A projection: the dequantizing GEMV on the stored weights when the step
 * is small enough and they are kept, else cuBLAS on the fp16 copy. */
static int proj(struct cu_ctx *c, const __half *W16, const struct cu_raw *R, int rows, int cols, const __half *X,
		int ldx, int T, float *Y, int ldy, float beta)
{
	if (R && R->data && T <= c->gemv_max_t && cols % 32 == 0)
		return cuda_errno(cu_gemv(R->data, R->type, R->row_bytes, rows, cols, X, ldx, T, Y, ldy, beta, c->s));
	return gemm(c, W16, rows, cols, X, ldx, T, Y, ldy, beta);
}

static int validate_batch(const struct cu_ctx *c, const struct kvd_batch *b, int *ret_T, int *ret_nl,
			  size_t *ret_pages)
{
	int T = 0, nl = 0;
	size_t np = 0;
	uint32_t bs = c->L.block_size;

	for (int i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		int64_t end = (int64_t)s->pos0 + s->n_tokens;
		if (s->n_tokens <= 0 || s->pos0 < 0 || !s->tokens || !s->pages)
			return -EINVAL;
		if (end > (int64_t)s->n_pages * bs || T + (int64_t)s->n_tokens > CU_MAX_BATCH_TOKENS)
			return -E2BIG;
		int used = (int)((end + bs - 1) / bs);
		for (int p = 0; p < used; p++)
			if (s->pages[p] < 0 || (uint32_t)s->pages[p] >= c->n_pages)
				return -EINVAL;
		for (int t = 0; t < s->n_tokens; t++)
			if (s->tokens[t] < 0 || s->tokens[t] >= c->hp.n_vocab)
				return -EINVAL;
		T += s->n_tokens;
		np += (size_t)used;
		if (s->logits)
			nl += s->all_logits ? s->n_tokens : 1;
	}
	*ret_T = T;
	*ret_nl = nl;
	*ret_pages = np;
	return 0;
}

static int cuda_forward(void *ctx, const struct kvd_batch *b)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	const struct kvd_hparams *hp = &c->hp;
	int T, NL, n_dec = 0, n_pre = 0, r;
	size_t n_pg, o_tok, o_pos, o_poff, o_lsrc, o_dec, o_pre, o_pages, n_words;

	if (!c->loaded || !c->kv_attached || !b)
		return -EINVAL;
	if (b->n_seqs <= 0)
		return 0;
	r = validate_batch(c, b, &T, &NL, &n_pg);
	if (r < 0)
		return r;
	CK(cudaSetDevice(c->device));

	/* attention items: decodes (one token) and prefill tiles of bq tokens */
	for (int i = 0; i < b->n_seqs; i++) {
		int n = b->seqs[i].n_tokens;
		for (int j = 0; j < n; j += c->bq) {
			if (n - j == 1)
				n_dec++;
			else
				n_pre++;
		}
	}

	/* host staging, int32 words: tokens, positions, page-table offsets,
	 * logit rows, decode items, prefill items, page tables */
	o_tok = 0;
	o_pos = o_tok + (size_t)T;
	o_poff = o_pos + (size_t)T;
	o_lsrc = o_poff + (size_t)T;
	o_dec = o_lsrc + (size_t)NL;
	o_pre = o_dec + 4 * (size_t)n_dec;
	o_pages = o_pre + 4 * (size_t)n_pre;
	n_words = o_pages + n_pg;
	r = ensure_scratch(c, T, NL, n_words);
	if (r < 0)
		goto fail;
	{
		int32_t *hs = c->stage_h;
		struct cu_attn_item *dec = (struct cu_attn_item *)(hs + o_dec);
		struct cu_attn_item *pre = (struct cu_attn_item *)(hs + o_pre);
		int t = 0, lr = 0, id = 0, ip = 0;
		size_t poff = 0;
		for (int i = 0; i < b->n_seqs; i++) {
			const struct kvd_batch_seq *s = &b->seqs[i];
			int used = (int)(((int64_t)s->pos0 + s->n_tokens + c->L.block_size - 1) / c->L.block_size);
			memcpy(hs + o_pages + poff, s->pages, (size_t)used * sizeof(int32_t));
			for (int j = 0; j < s->n_tokens; j += c->bq) {
				struct cu_attn_item it;
				it.t0 = t + j;
				it.n_q = s->n_tokens - j < c->bq ? s->n_tokens - j : c->bq;
				it.pos0 = s->pos0 + j;
				it.page_off = (int32_t)poff;
				if (it.n_q == 1)
					dec[id++] = it;
				else
					pre[ip++] = it;
			}
			for (int j = 0; j < s->n_tokens; j++) {
				hs[o_tok + t + j] = s->tokens[j];
				hs[o_pos + t + j] = s->pos0 + j;
				hs[o_poff + t + j] = (int32_t)poff;
			}
			if (s->logits)
				for (int j = s->all_logits ? 0 : s->n_tokens - 1; j < s->n_tokens; j++)
					hs[o_lsrc + lr++] = t + j;
			t += s->n_tokens;
			poff += (size_t)used;
		}
	}
	CK(cudaMemcpyAsync(c->stage_d, c->stage_h, n_words * sizeof(int32_t), cudaMemcpyHostToDevice, c->s));
	{
		const int32_t *d_tok = c->stage_d + o_tok, *d_pos = c->stage_d + o_pos, *d_poff = c->stage_d + o_poff;
		const int32_t *d_lsrc = c->stage_d + o_lsrc, *d_pages = c->stage_d + o_pages;
		const struct cu_attn_item *d_dec = (const struct cu_attn_item *)(c->stage_d + o_dec);
		const struct cu_attn_item *d_pre = (const struct cu_attn_item *)(c->stage_d + o_pre);
		int ne = hp->n_embd, qd = c->q_dim, kvd = c->kv_dim, nff = hp->n_ff, hd = hp->head_dim;
		int n_rep = hp->n_head / hp->n_head_kv, ld_qkv = qd + 2 * kvd;
		struct cu_kv kv;
		kv.base = c->pool;
		kv.block_size = (int32_t)c->L.block_size;
		kv.kv_dim = (int32_t)c->L.kv_dim;
		kv.token_stride = (int64_t)c->L.token_stride;
		kv.v_offset = (int64_t)c->L.v_offset;
		kv.layer_stride = (int64_t)c->L.layer_stride;
		kv.page_bytes = (int64_t)c->L.page_bytes;

		CK(cu_embed(c->tok_embd, c->embd_type, c->embd_row_bytes, d_tok, T, ne, c->x, c->s));
		CK(cu_rope_table(d_pos, T, hd, hp->rope_theta, c->rope, c->s));
		for (int l = 0; l < hp->n_layer; l++) {
			const struct cu_layer *L = &c->layers[l];
			CK(cu_rmsnorm(c->x, NULL, T, ne, L->attn_norm, hp->rms_eps, c->xn, c->s));
			if (T <= c->gemv_max_t && L->rq.data) {
				r = proj(c, NULL, &L->rq, qd, ne, c->xn, ne, T, c->qkv, ld_qkv, 0.0f);
				if (!r)
					r = proj(c, NULL, &L->rk, kvd, ne, c->xn, ne, T, c->qkv + qd, ld_qkv, 0.0f);
				if (!r)
					r = proj(c, NULL, &L->rv, kvd, ne, c->xn, ne, T, c->qkv + qd + kvd, ld_qkv, 0.0f);
			} else {
				r = gemm(c, L->wqkv, ld_qkv, ne, c->xn, ne, T, c->qkv, ld_qkv, 0.0f);
			}
			if (r < 0)
				goto fail;
			CK(cu_rope_store(c->qkv, ld_qkv, c->rope, d_pos, d_poff, d_pages, kv, l, hp->n_head,
					 hp->n_head_kv, hd, hp->rope_style == KVD_ROPE_NEOX, T, c->s));
			CK(cu_attention(c->qkv, ld_qkv, c->att, d_dec, n_dec, d_pages, kv, l, hp->n_head, hp->n_head_kv,
					hd, n_rep, c->s));
			CK(cu_attention(c->qkv, ld_qkv, c->att, d_pre, n_pre, d_pages, kv, l, hp->n_head, hp->n_head_kv,
					hd, c->bq * n_rep, c->s));
			r = proj(c, L->wo, &L->ro, ne, qd, c->att, qd, T, c->x, ne, 1.0f);
			if (r < 0)
				goto fail;
			CK(cu_rmsnorm(c->x, NULL, T, ne, L->ffn_norm, hp->rms_eps, c->xn, c->s));
			if (T <= c->gemv_max_t && L->rg.data) {
				r = proj(c, NULL, &L->rg, nff, ne, c->xn, ne, T, c->gu, 2 * nff, 0.0f);
				if (!r)
					r = proj(c, NULL, &L->ru, nff, ne, c->xn, ne, T, c->gu + nff, 2 * nff, 0.0f);
			} else {
				r = gemm(c, L->wgu, 2 * nff, ne, c->xn, ne, T, c->gu, 2 * nff, 0.0f);
			}
			if (r < 0)
				goto fail;
			CK(cu_swiglu(c->gu, T, nff, c->h, c->s));
			r = proj(c, L->wdown, &L->rd, ne, nff, c->h, nff, T, c->x, ne, 1.0f);
			if (r < 0)
				goto fail;
		}
		if (NL > 0) {
			CK(cu_rmsnorm(c->x, d_lsrc, NL, ne, c->output_norm, hp->rms_eps, c->xn, c->s));
			r = proj(c, c->output, &c->rout, hp->n_vocab, ne, c->xn, ne, NL, c->logits_d, hp->n_vocab, 0.0f);
			if (r < 0)
				goto fail;
			CK(cudaMemcpyAsync(c->logits_h, c->logits_d, (size_t)NL * hp->n_vocab * sizeof(float),
					   cudaMemcpyDeviceToHost, c->s));
		}
	}
	CK(cudaStreamSynchronize(c->s));
	if (NL > 0) {
		size_t lr = 0;
		for (int i = 0; i < b->n_seqs; i++) {
			const struct kvd_batch_seq *s = &b->seqs[i];
			if (!s->logits)
				continue;
			size_t n = s->all_logits ? (size_t)s->n_tokens : 1;
			memcpy(s->logits, c->logits_h + lr * hp->n_vocab, n * hp->n_vocab * sizeof(float));
			lr += n;
		}
	}
	return 0;
fail:
	(void)cudaStreamSynchronize(c->s);
	(void)cudaGetLastError();
	return r;
}

/* ---- pages ------------------------------------------------------------------------ */

static int cuda_page_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	const struct kvd_kv_layout *L = &c->L;
	int r;

	if (!c->kv_attached || dst >= c->n_pages || src >= c->n_pages || n_tokens > L->block_size)
		return -EINVAL;
	if (dst == src || n_tokens == 0)
		return 0;
	CK(cudaSetDevice(c->device));
	/* a page is 2 * n_layer blocks (K, V of each layer) v_offset apart;
	 * copy the first n_tokens rows of each, on the compute stream so the
	 * copy is ordered with the steps around it */
	CK(cudaMemcpy2DAsync(c->pool + (size_t)dst * L->page_bytes, L->v_offset, c->pool + (size_t)src * L->page_bytes,
			     L->v_offset, (size_t)n_tokens * L->token_stride, 2 * (size_t)L->n_layer,
			     cudaMemcpyDeviceToDevice, c->s));
	CK(cudaStreamSynchronize(c->s));
	return 0;
fail:
	return r;
}

/* Make the copy stream wait for everything enqueued on the compute stream. */
static int copy_after_compute(struct cu_ctx *c)
{
	int r;
	CK(cudaEventRecord(c->ev, c->s));
	CK(cudaStreamWaitEvent(c->copy_s, c->ev, 0));
	return 0;
fail:
	return r;
}

static int cuda_page_read(void *ctx, uint32_t page, void *host_dst)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	int r;

	if (!c->kv_attached || page >= c->n_pages || !host_dst)
		return -EINVAL;
	CK(cudaSetDevice(c->device));
	r = copy_after_compute(c);
	if (r < 0)
		goto fail;
	CK(cudaMemcpyAsync(host_dst, c->pool + (size_t)page * c->L.page_bytes, c->L.page_bytes, cudaMemcpyDeviceToHost,
			   c->copy_s));
	CK(cudaStreamSynchronize(c->copy_s));
	return 0;
fail:
	(void)cudaStreamSynchronize(c->copy_s);
	return r;
}

static int cuda_page_write(void *ctx, uint32_t page, const void *host_src)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	int r;

	if (!c->kv_attached || page >= c->n_pages || !host_src)
		return -EINVAL;
	CK(cudaSetDevice(c->device));
	r = copy_after_compute(c);
	if (r < 0)
		goto fail;
	CK(cudaMemcpyAsync(c->pool + (size_t)page * c->L.page_bytes, host_src, c->L.page_bytes, cudaMemcpyHostToDevice,
			   c->copy_s));
	CK(cudaStreamSynchronize(c->copy_s));
	return 0;
fail:
	(void)cudaStreamSynchronize(c->copy_s);
	return r;
}

static int ensure_swap_stage(struct cu_ctx *c, uint32_t *ret_per_chunk)
{
	size_t per = CU_SWAP_STAGE_BYTES / c->L.page_bytes;
	int r;
	if (per < 1)
		per = 1;
	if (per > 65535)
		per = 65535; /* grid.y of the gather kernel */
	if (!c->swap_d) {
		r = dalloc((void **)&c->swap_d, per * c->L.page_bytes, NULL);
		if (r < 0)
			return r;
		r = dalloc((void **)&c->swap_pages_d, per * sizeof(uint32_t), NULL);
		if (r < 0) {
			dfree(c->swap_d);
			c->swap_d = NULL;
			return r;
		}
	}
	*ret_per_chunk = (uint32_t)per;
	return 0;
}

/* n pages to or from one contiguous host buffer, through a device staging
 * buffer filled by the gather kernel (or emptied by the scatter kernel). */
static int pages_move(struct cu_ctx *c, const uint32_t *pages, uint32_t n, char *host, int to_host)
{
	uint32_t per;
	int r;

	if (!c->kv_attached || (n && (!pages || !host)))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (pages[i] >= c->n_pages)
			return -EINVAL;
	if (!n)
		return 0;
	CK(cudaSetDevice(c->device));
	r = ensure_swap_stage(c, &per);
	if (r < 0)
		return r;
	r = copy_after_compute(c);
	if (r < 0)
		goto fail;
	for (uint32_t i0 = 0; i0 < n; i0 += per) {
		uint32_t k = n - i0 < per ? n - i0 : per;
		size_t bytes = (size_t)k * c->L.page_bytes;
		char *h = host + (size_t)i0 * c->L.page_bytes;
		/* the page list is small: a synchronous copy keeps the host
		 * array's lifetime simple */
		CK(cudaMemcpyAsync(c->swap_pages_d, pages + i0, k * sizeof(uint32_t), cudaMemcpyHostToDevice, c->copy_s));
		if (to_host) {
			CK(cu_pages_gather(c->pool, c->L.page_bytes, c->swap_pages_d, (int)k, c->swap_d, c->copy_s));
			CK(cudaMemcpyAsync(h, c->swap_d, bytes, cudaMemcpyDeviceToHost, c->copy_s));
		} else {
			CK(cudaMemcpyAsync(c->swap_d, h, bytes, cudaMemcpyHostToDevice, c->copy_s));
			CK(cu_pages_scatter(c->pool, c->L.page_bytes, c->swap_pages_d, (int)k, c->swap_d, c->copy_s));
		}
		CK(cudaStreamSynchronize(c->copy_s));
	}
	return 0;
fail:
	(void)cudaStreamSynchronize(c->copy_s);
	return r;
}

static int cuda_pages_read(void *ctx, const uint32_t *pages, uint32_t n, void *host_dst)
{
	return pages_move((struct cu_ctx *)ctx, pages, n, (char *)host_dst, 1);
}

static int cuda_pages_write(void *ctx, const uint32_t *pages, uint32_t n, const void *host_src)
{
	return pages_move((struct cu_ctx *)ctx, pages, n, (char *)host_src, 0);
}

static int cuda_suggest_pool_pages(void *ctx, size_t page_bytes, double fraction, uint32_t *ret_pages)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	size_t free_b = 0, total_b = 0;
	int r;

	if (!page_bytes || !(fraction > 0.0 && fraction <= 1.0) || !ret_pages)
		return -EINVAL;
	CK(cudaSetDevice(c->device));
	CK(cudaMemGetInfo(&free_b, &total_b));
	{
		double avail = free_b > CU_POOL_RESERVE_BYTES ? (double)(free_b - CU_POOL_RESERVE_BYTES) : 0.0;
		double pages = avail * fraction / (double)page_bytes;
		*ret_pages = pages >= 4294967295.0 ? UINT32_MAX : (uint32_t)pages;
	}
	return 0;
fail:
	return r;
}

/* The capability query (kernels/backend.h): what the plug-in computes, in
 * one place; load and attach_kv refuse the same things as a defensive
 * check. */
static int cuda_supports(void *ctx, const struct kvd_cap_query *q)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;

	switch (q->kind) {
	case KVD_CAPQ_WEIGHT_TYPE: return cu_type_ok(q->wtype);
	case KVD_CAPQ_MODEL_FEATURE: return 0; /* the Llama base only */
	case KVD_CAPQ_ATTENTION:
		return q->head_dim > 0 && q->head_dim % 2 == 0 && q->n_rep >= 1 && q->n_rep <= CU_ATTN_MAX_ROWS &&
		       choose_bq(c, q->n_rep, q->head_dim) != 0;
	case KVD_CAPQ_KV_TYPE: return q->kv_type == KVD_KV_F16; /* the kernels read and write f16 K/V */
	default: return 0; /* no kv_shift, no released pages, f16 the only (so fastest) KV type */
	}
}

/* Positional, in the order of struct kvd_backend_ops. */
static const struct kvd_backend_ops cuda_ops = {
	"cuda",
	KVD_BACKEND_ABI_VERSION,
	cuda_init,
	cuda_load,
	cuda_attach_kv,
	cuda_forward,
	cuda_page_copy,
	cuda_page_read,
	cuda_page_write,
	cuda_destroy,
	cuda_suggest_pool_pages,
	cuda_pages_read,
	cuda_pages_write,
	0, /* features (ABI 3): the query answers instead */
	KVD_CAP_DEVICE_POOL | KVD_CAP_BATCHED_SWAP,
	NULL, /* kv_shift */
	cuda_supports,
};

extern "C" __attribute__((visibility("default"))) const struct kvd_backend_ops *kvd_backend_plugin_entry(void)
{
	return &cuda_ops;
}
