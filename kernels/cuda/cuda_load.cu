/*
 * kernels/cuda/cuda_load.cu — the CUDA plug-in's weights: the model's
 * check against what the device kernels implement, and the upload. Every
 * matrix is dequantized on the device to fp16 (row-major, as stored), wq,
 * wk, wv concatenated into one matrix and w_gate, w_up into another, so a
 * step runs one cuBLAS GEMM per group; with the GEMV path on
 * (KVD_CUDA_GEMV_MAX_TOKENS) the stored copies stay too. The token
 * embedding stays in its stored type; norm weights are f32.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ctx.h"

void cu_free_weights(struct cu_ctx *c)
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
	dfree(c->rope_freqs);
	c->rope_freqs = NULL;
	free(c->glob_idx);
	c->glob_idx = NULL;
	if (c->op_vec && c->prog)
		for (int i = 0; i < c->prog->n_ops; i++)
			for (int k = 0; k < 3; k++)
				dfree(c->op_vec[i][k]);
	free(c->op_vec);
	c->op_vec = NULL;
	kvd_program_free(c->prog);
	c->prog = NULL;
	c->tok_embd = NULL;
	c->output = NULL;
	c->loaded = 0;
	c->weight_bytes = 0;
}


/* ---- load ---------------------------------------------------------------------- */

int cu_type_ok(enum kvd_wtype t)
{
	/* every type of kernels/backend.h (kernels_quant.cu reads them all) */
	return kvd_wtype_row_bytes(t, 256) != 0;
}

static int check_weights(const struct kvd_model_weights *w)
{
	const struct kvd_hparams *hp = &w->hp;
	int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	int r = kvd_model_weights_check_features(w, CU_ATTN_MAX_ROWS, CU_FEATURES);

	if (r == -ENOTSUP)
		return r;
	r = r < 0 ? -EINVAL : 0;

	/* cuBLAS takes int dimensions; kernels index rows with int */
	if (qd + 2 * kvd > (1 << 30) || 2 * (int64_t)hp->n_ff > (1 << 30))
		r = -EINVAL;
	if (r)
		return -EINVAL;
	/* a type the kernels do not read is refused (the query says so first) */
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

/*
 * Every f32 vector an operation of the program names (norm weights,
 * biases, Q/K norms, post-norms), uploaded once: the executor finds
 * operation i's at c->op_vec[i], so an operation with vector weights needs
 * no upload line of its own here.
 */
static int upload_op_vectors(struct cu_ctx *c)
{
	const struct kvd_program *p = c->prog;
	int r;

	c->op_vec = (float *(*)[3])calloc((size_t)p->n_ops, sizeof(*c->op_vec));
	if (!c->op_vec)
		return -ENOMEM;
	for (int i = 0; i < p->n_ops; i++)
		for (int k = 0; k < 3; k++) {
			const struct kvd_tensor *t = p->ops[i].w[k];
			if (!t || !t->data || t->rows != 1 || t->type != KVD_WTYPE_F32)
				continue;
			r = upload_f32(c, t, &c->op_vec[i][k]);
			if (r < 0)
				return r;
		}
	return 0;
}

/* Largest number of tokens per prefill attention block whose shared
 * memory fits; 0 if not even one does. */
int cu_choose_bq(struct cu_ctx *c, int n_rep, int hd, int kv_type)
{
	size_t budget = c->smem_optin < CU_ATTN_SMEM_BUDGET ? c->smem_optin : CU_ATTN_SMEM_BUDGET;
	for (int bq = CU_ATTN_MAX_ROWS / n_rep; bq >= 1; bq--)
		if (cu_attn_smem_bytes(bq * n_rep, hd, kv_type) <= budget)
			return bq;
	if (cu_attn_smem_bytes(n_rep, hd, kv_type) <= c->smem_optin)
		return 1;
	return 0;
}

int cu_attn_smem_allow(struct cu_ctx *c, int kv_type)
{
	size_t bytes = cu_attn_smem_bytes(c->bq * (c->hp.n_head / c->hp.n_head_kv), c->hp.head_dim, kv_type);
	/* above the 48 KiB every kernel may take, the kernel must opt in */
	return bytes > (48u << 10) ? cuda_errno(cu_attn_set_smem(bytes)) : 0;
}

int cuda_load(void *ctx, const struct kvd_model_weights *w)
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
	r = kvd_program_build(w, &c->prog);
	if (r < 0)
		goto fail;
	if (kvd_program_missing(c->prog, CU_OP_KINDS)) {
		r = -ENOTSUP;
		goto fail;
	}
	ne = hp->n_embd;
	qd = (int64_t)hp->n_head * hp->head_dim;
	kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	nff = hp->n_ff;
	c->q_dim = (int)qd;
	c->kv_dim = (int)kvd;
	c->glob_idx = (int32_t *)malloc(sizeof(int32_t) * (size_t)hp->n_layer);
	if (!c->glob_idx) {
		r = -ENOMEM;
		goto fail;
	}
	for (int l = 0, g = 0; l < hp->n_layer; l++)
		c->glob_idx[l] = w->layers[l].d.window > 0 ? -1 : g++;
	c->pack_slots = kvd_kv_pack_slots(w, &c->n_global, &c->max_window);
	/* the f16 pool's block size; attach_kv chooses again for its type */
	c->bq = cu_choose_bq(c, hp->n_head / hp->n_head_kv, hp->head_dim, KVD_KV_F16);
	if (!c->bq) {
		r = -ENOTSUP;
		goto fail;
	}
	r = cu_attn_smem_allow(c, KVD_KV_F16);
	if (r < 0)
		goto fail;

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
		if (r < 0)
			goto fail;
	}
	if (w->rope_freqs.data) {
		r = upload_f32(c, &w->rope_freqs, &c->rope_freqs);
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
	r = upload_op_vectors(c);
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
	cu_free_weights(c);
	(void)cudaGetLastError();
	return r;
}

