/*
 * kernels/cuda/cuda_backend.cu — kvd's CUDA backend, a plug-in shared
 * object (libkvd-cuda.so) that the engine dlopen()s and reaches through one
 * symbol, kvd_backend_plugin_entry(), which returns the const ops table of
 * kernels/backend.h with name "cuda". This file holds init and destroy,
 * the KV pool, page moves, the capability query and the table;
 * cuda_load.cu the weights, cuda_forward.cu a step, kernels*.cu the
 * device kernels, cuda_ctx.h the context they share.
 *
 * What lives where:
 *  - weights: every type of kernels/backend.h (F32, F16, BF16, Q8_0,
 *    Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K). At load every matrix is
 *    dequantized on the device to fp16
 *    (row-major, as stored), wq/wk/wv concatenated into one matrix and
 *    w_gate/w_up into another, so each step runs one GEMM per group through
 *    cublasGemmEx (fp16 inputs, f32 accumulation and output). The token
 *    embedding stays in its stored type and rows are dequantized on lookup.
 *    Norm weights stay f32. With KVD_CUDA_GEMV_MAX_TOKENS=N (1..8) the
 *    matrices are also kept in their stored type, and steps of at most N
 *    tokens (decode) run a dequantizing GEMV over them instead, reading
 *    a quarter of the bytes for q4 weights.
 *  - KV: a device pool of the view's n_pages pages in the layout of
 *    kernels/backend.h, of any of its element types (f16, f32, bf16, q8_0,
 *    q4_0: stored and read as the CPU backend stores them, byte for byte,
 *    cuda_kv.h), so page copies and swap move bytes whatever the type.
 *    kv_shift re-rotates cached keys of f16, bf16 and f32 pools (the
 *    block-quantized ones are refused, as on the CPU: every shift would
 *    quantize the kept keys again). Page tables may hold released pages
 *    (KVD_CAP_PACKED_KV: Gemma 3's local layers done with a page): the
 *    layers without a window read such a page's K/V from its slot of a
 *    packed page, which the engine fills through page_read / page_write.
 *    When the view has a host mapping (kvmm's memfd),
 *    it is registered as pinned memory: the host tier that page_read and
 *    page_write (swap) move pages to and from, by DMA on a copy stream of
 *    their own. The host mapping is never the authoritative copy.
 *  - a step: the forward program (kernels/program.h), built at load from
 *    the model description, executed on one compute stream
 *    (cuda_forward.cu): RMSNorms, the QKV and gate/up GEMMs (or the
 *    dequantizing GEMV for small steps), biases, per-head Q/K norms, RoPE
 *    with the K/V store, paged attention, the wo and down GEMMs adding
 *    into the residual (through the post-norms where the model has them),
 *    SwiGLU or GeGLU, the logits. forward() returns when the step is
 *    complete.
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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ctx.h"

/* ---- init / destroy -------------------------------------------------------- */

static void free_kv(struct cu_ctx *c)
{
	dfree(c->pool);
	c->pool = NULL;
	free(c->shift_tab_h);
	dfree(c->shift_tab_d);
	dfree(c->shift_pages_d);
	c->shift_tab_h = NULL;
	c->shift_tab_d = NULL;
	c->shift_pages_d = NULL;
	c->cap_shift_pages = 0;
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
	cu_free_scratch(c);
	cu_free_weights(c);
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
	/* an element type the kernels do not know, or a quantized one whose
	 * blocks do not tile a head: refused before anything is allocated */
	if (kvd_kv_layout_init_type(&want, &c->hp, vl->block_size, vl->type) < 0)
		return kvd_kv_type_name(vl->type) ? -EINVAL : -ENOTSUP;
	if (vl->block_size == 0 || view->n_pages == 0 || vl->n_layer != want.n_layer || vl->kv_dim != want.kv_dim ||
	    vl->token_stride != want.token_stride || vl->v_offset != want.v_offset ||
	    vl->layer_stride != want.layer_stride || vl->page_bytes != want.page_bytes)
		return -EINVAL;
	{
		/* the prefill attention's block size for this type's tiles */
		int bq = cu_choose_bq(c, c->hp.n_head / c->hp.n_head_kv, c->hp.head_dim, vl->type);
		if (!bq)
			return -ENOTSUP;
		c->bq = bq;
	}
	CK(cudaSetDevice(c->device));
	r = cu_attn_smem_allow(c, vl->type);
	if (r < 0)
		goto fail;
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

/* ---- kv_shift ------------------------------------------------------------------- */

/* The element types whose keys kv_shift re-rotates: the CPU's set
 * (kernels/cpu/kvshift.c). The block-quantized types are not: each shift
 * would quantize the kept keys again, so their error would grow with every
 * drop of a long generation. */
static int cu_kv_shift_type(enum kvd_kv_type t)
{
	return t == KVD_KV_F16 || t == KVD_KV_BF16 || t == KVD_KV_F32;
}

/* cos and sin of pair i's angle at position pos, as kernels/cpu/kvshift.c's
 * cpu_rope_table computes them (in double, on the host), so that a shift
 * rotates by the very angles the CPU's does. */
static void shift_table(float *cs, int hd, int32_t pos, float theta, float pos_scale, const float *freq_factors)
{
	for (int i = 0; i < hd / 2; i++) {
		double th = (double)pos * pos_scale * pow((double)theta, -2.0 * i / hd);
		if (freq_factors)
			th /= freq_factors[i];
		cs[2 * i] = (float)cos(th);
		cs[2 * i + 1] = (float)sin(th);
	}
}

static int cuda_kv_shift(void *ctx, const int32_t *pages, uint32_t n_pages, uint32_t n_tokens, int32_t delta)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	const struct kvd_hparams *hp = &c->hp;
	const struct kvd_kv_layout *L = &c->L;
	int hd = hp->head_dim, r;
	uint32_t used;

	if (!c->kv_attached)
		return -EINVAL;
	if (!cu_kv_shift_type(L->type))
		return -ENOTSUP;
	if (n_tokens > (uint64_t)n_pages * L->block_size || (n_tokens && !pages))
		return -EINVAL;
	used = (n_tokens + L->block_size - 1) / L->block_size;
	for (uint32_t i = 0; i < used; i++)
		if (pages[i] < 0 || (uint32_t)pages[i] >= c->n_pages)
			return -EINVAL;
	if (delta == 0 || n_tokens == 0)
		return 0;
	CK(cudaSetDevice(c->device));
	if (!c->shift_tab_h) {
		size_t bytes = sizeof(float) * (size_t)hp->n_layer * hd;
		c->shift_tab_h = (float *)malloc(bytes);
		if (!c->shift_tab_h)
			return -ENOMEM;
		r = dalloc((void **)&c->shift_tab_d, bytes, NULL);
		if (r < 0)
			goto fail;
	}
	if (used > c->cap_shift_pages) {
		dfree(c->shift_pages_d);
		c->shift_pages_d = NULL;
		c->cap_shift_pages = 0;
		r = dalloc((void **)&c->shift_pages_d, sizeof(int32_t) * used, NULL);
		if (r < 0)
			goto fail;
		c->cap_shift_pages = used;
	}
	/* each layer's RoPE exactly as its forward applies it: the program's */
	for (int i = 0; i < c->prog->n_ops; i++) {
		const struct kvd_op *op = &c->prog->ops[i];
		if (op->kind == KVD_OP_ROPE)
			shift_table(c->shift_tab_h + (size_t)op->layer * hd, hd, delta, op->theta, op->freq_scale,
				    op->freqs);
	}
	/* on the compute stream: ordered after the steps before, and before
	 * the ones after (the host arrays are copied before this returns) */
	CK(cudaMemcpyAsync(c->shift_tab_d, c->shift_tab_h, sizeof(float) * (size_t)hp->n_layer * hd,
			   cudaMemcpyHostToDevice, c->s));
	CK(cudaMemcpyAsync(c->shift_pages_d, pages, sizeof(int32_t) * used, cudaMemcpyHostToDevice, c->s));
	{
		struct cu_kv kv;
		kv.base = c->pool;
		kv.block_size = (int32_t)L->block_size;
		kv.kv_dim = (int32_t)L->kv_dim;
		kv.type = (int32_t)L->type;
		kv.head_bytes = (int32_t)kvd_kv_row_bytes(L->type, (uint32_t)hd);
		kv.n_global = 0; /* no released entry reaches the kernel (checked above) */
		kv.layer_g = -1;
		kv.token_stride = (int64_t)L->token_stride;
		kv.v_offset = (int64_t)L->v_offset;
		kv.layer_stride = (int64_t)L->layer_stride;
		kv.page_bytes = (int64_t)L->page_bytes;
		CK(cu_kv_shift(kv, c->shift_pages_d, (int)n_tokens, hp->n_layer, hp->n_head_kv, hd,
			       hp->rope_style == KVD_ROPE_NEOX, c->shift_tab_d, c->s));
	}
	CK(cudaStreamSynchronize(c->s));
	return 0;
fail:
	(void)cudaStreamSynchronize(c->s);
	return r;
}

/* The capability query (kernels/backend.h): what the plug-in computes, in
 * one place; load and attach_kv refuse the same things as a defensive
 * check. */
static int cuda_supports(void *ctx, const struct kvd_cap_query *q)
{
	struct cu_ctx *c = (struct cu_ctx *)ctx;
	struct kvd_hparams hp;

	switch (q->kind) {
	case KVD_CAPQ_WEIGHT_TYPE: return cu_type_ok(q->wtype);
	case KVD_CAPQ_MODEL_FEATURE: return q->feature && !(q->feature & ~CU_FEATURES);
	case KVD_CAPQ_ATTENTION:
		return q->head_dim > 0 && q->head_dim % 2 == 0 && q->n_rep >= 1 && q->n_rep <= CU_ATTN_MAX_ROWS &&
		       cu_choose_bq(c, q->n_rep, q->head_dim, KVD_KV_F16) != 0;
	case KVD_CAPQ_KV_TYPE:
		/* every type of kernels/backend.h whose rows tile the head
		 * size (the quantized ones: a multiple of 32), with room for
		 * one query row's tile of it */
		memset(&hp, 0, sizeof(hp));
		hp.n_head_kv = 1;
		hp.head_dim = q->head_dim;
		{
			struct kvd_kv_layout l;
			return q->head_dim > 0 && q->head_dim % 2 == 0 &&
			       kvd_kv_layout_init_type(&l, &hp, 1, q->kv_type) == 0 &&
			       cu_choose_bq(c, 1, q->head_dim, q->kv_type) != 0;
		}
	case KVD_CAPQ_KV_SHIFT: return cu_kv_shift_type(q->kv_type);
	case KVD_CAPQ_RELEASED_PAGES: return 1; /* KVD_CAP_PACKED_KV */
	default: return 0; /* f16 the fastest KV type (KV_FAST says no to all) */
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
	KVD_CAP_DEVICE_POOL | KVD_CAP_BATCHED_SWAP | KVD_CAP_PACKED_KV,
	cuda_kv_shift,
	cuda_supports,
};

extern "C" __attribute__((visibility("default"))) const struct kvd_backend_ops *kvd_backend_plugin_entry(void)
{
	return &cuda_ops;
}
