/*
 * kernels/cuda/cuda_forward.cu — one step of the CUDA plug-in: the batch
 * checked and staged (tokens, positions, page tables, attention items) in
 * one host-to-device copy, then the forward program (kernels/program.h,
 * built at load) executed on the compute stream, the logits of the rows
 * that want them copied back. forward() returns when the step is complete.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_ctx.h"

void cu_free_scratch(struct cu_ctx *c)
{
	dfree(c->x);
	dfree(c->y);
	c->y = NULL;
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
		GROW_D(c->y, n * ne * sizeof(float));
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
		for (int p = 0; p < used; p++) {
			int32_t e = s->pages[p];
			if (e >= 0) {
				if ((uint32_t)e >= c->n_pages)
					return -EINVAL;
				continue;
			}
			/* released (kernels/backend.h): every windowed layer's
			 * window of the first new token must lie past it, and a
			 * packed entry's page and slot be in range */
			if (!c->max_window || (int64_t)(p + 1) * bs + c->max_window > (int64_t)s->pos0 + 1)
				return -EINVAL;
			if (e == KVD_PAGE_RELEASED ? c->n_global != 0
						   : !kvd_page_is_packed(e) || !c->n_global ||
							     kvd_packed_page(e) >= c->n_pages || kvd_packed_slot(e) >= c->pack_slots)
				return -EINVAL;
		}
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

/* What a step's layers share: the batch on the device, and which RoPE
 * table c->rope holds (rope_base 0: none yet). */
struct cu_step {
	int T;
	const int32_t *d_pos, *d_poff, *d_pages;
	const struct cu_attn_item *d_dec;
	int n_dec;
	const struct cu_attn_item *d_pre;
	int n_pre;
	struct cu_kv kv;
	float rope_base, rope_scale;
};

/* A sublayer's output projection (W16 / R, cols wide, input X) into the
 * residual: added to it directly, or through y and its post-norm. */
static int out_proj(struct cu_ctx *c, const __half *W16, const struct cu_raw *R, int cols, const __half *X, int T,
		    const float *post, float eps)
{
	int ne = c->hp.n_embd, r;

	if (!post)
		return proj(c, W16, R, ne, cols, X, cols, T, c->x, ne, 1.0f);
	r = proj(c, W16, R, ne, cols, X, cols, T, c->y, ne, 0.0f);
	if (r < 0)
		return r;
	return cuda_errno(cu_rmsnorm_add(c->x, c->y, T, ne, post, eps, c->s));
}

/*
 * The forward program (kernels/program.h) on the compute stream. Fusions,
 * each of operations the builder emits next to each other: EMBED takes an
 * EMBD_SCALE after it as its scale; ROPE and the KV_STORE after it are one
 * kernel; ATTN_OUT and DOWN add into the residual stream in their GEMM
 * (beta 1) when RESIDUAL follows, or through y and one post-norm-and-add
 * kernel when POST_NORM, RESIDUAL follow. The program's gate after GLU is
 * c->h (fp16, the down projection's input). An operation's vectors (norm
 * weights, biases, Q/K norms) are c->op_vec[i], uploaded at load; its
 * matrices are its layer's (cu_layer). A kind or an order this executor
 * lacks is -ENOTSUP, never a silent skip.
 */
static int run_program(struct cu_ctx *c, struct cu_step *st, const int32_t *d_tok, const int32_t *d_lsrc, int NL)
{
	const struct kvd_hparams *hp = &c->hp;
	const struct kvd_program *p = c->prog;
	int ne = hp->n_embd, qd = c->q_dim, kvd = c->kv_dim, nff = hp->n_ff, hd = hp->head_dim, T = st->T;
	int n_rep = hp->n_head / hp->n_head_kv, ld_qkv = qd + 2 * kvd;
	int r = 0;

	for (int i = 0; i < p->n_ops; i++) {
		const struct kvd_op *op = &p->ops[i];
		enum kvd_op_kind nk = i + 1 < p->n_ops ? p->ops[i + 1].kind : KVD_OP_KIND_END;
		enum kvd_op_kind nk2 = i + 2 < p->n_ops ? p->ops[i + 2].kind : KVD_OP_KIND_END;
		const struct cu_layer *L = op->layer >= 0 ? &c->layers[op->layer] : NULL;
		float *const *vec = c->op_vec[i];
		struct cu_kv kv = st->kv;

		switch (op->kind) {
		case KVD_OP_EMBED: {
			float scale = nk == KVD_OP_EMBD_SCALE ? p->ops[i + 1].scale : 1.0f;
			i += nk == KVD_OP_EMBD_SCALE;
			CK(cu_embed(c->tok_embd, c->embd_type, c->embd_row_bytes, d_tok, T, ne, scale, c->x, c->s));
			break;
		}
		case KVD_OP_NORM:
			CK(cu_rmsnorm(c->x, NULL, T, ne, vec[0], op->eps, c->xn, c->s));
			break;
		case KVD_OP_QKV:
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
			break;
		case KVD_OP_QKV_BIAS:
			CK(cu_add_bias(c->qkv, ld_qkv, T, qd, kvd, vec[0], vec[1], vec[2], c->s));
			break;
		case KVD_OP_QK_NORM:
			CK(cu_head_norm(c->qkv, ld_qkv, T, hp->n_head, hp->n_head_kv, hd, vec[0], vec[1], op->eps,
					c->s));
			break;
		case KVD_OP_ROPE:
			if (nk != KVD_OP_KV_STORE)
				return -ENOTSUP;
			/* the table of this layer's (base, scale): computed again
			 * only where it differs from the previous layer's */
			if (st->rope_base != op->theta || st->rope_scale != op->freq_scale) {
				CK(cu_rope_table(st->d_pos, T, hd, op->theta, op->freq_scale,
						 op->freqs ? c->rope_freqs : NULL, c->rope, c->s));
				st->rope_base = op->theta;
				st->rope_scale = op->freq_scale;
			}
			kv.layer_g = c->glob_idx[op->layer];
			CK(cu_rope_store(c->qkv, ld_qkv, c->rope, st->d_pos, st->d_poff, st->d_pages, kv, op->layer,
					 hp->n_head, hp->n_head_kv, hd, op->style == KVD_ROPE_NEOX, T, c->s));
			i++;
			break;
		case KVD_OP_ATTENTION:
			/* the packed region a released page keeps of the layer */
			kv.layer_g = c->glob_idx[op->layer];
			CK(cu_attention(c->qkv, ld_qkv, c->att, st->d_dec, st->n_dec, st->d_pages, kv, op->layer,
					hp->n_head, hp->n_head_kv, hd, n_rep, op->scale, op->window, c->s));
			CK(cu_attention(c->qkv, ld_qkv, c->att, st->d_pre, st->n_pre, st->d_pages, kv, op->layer,
					hp->n_head, hp->n_head_kv, hd, c->bq * n_rep, op->scale, op->window, c->s));
			break;
		case KVD_OP_ATTN_OUT:
		case KVD_OP_DOWN: {
			int down = op->kind == KVD_OP_DOWN, cols = down ? nff : qd;
			const __half *W16 = down ? L->wdown : L->wo, *X = down ? c->h : c->att;
			const struct cu_raw *R = down ? &L->rd : &L->ro;
			if (nk == KVD_OP_RESIDUAL) {
				r = out_proj(c, W16, R, cols, X, T, NULL, 0);
				i += 1;
			} else if (nk == KVD_OP_POST_NORM && nk2 == KVD_OP_RESIDUAL) {
				r = out_proj(c, W16, R, cols, X, T, c->op_vec[i + 1][0], p->ops[i + 1].eps);
				i += 2;
			} else {
				return -ENOTSUP;
			}
			if (r < 0)
				goto fail;
			break;
		}
		case KVD_OP_GATE_UP:
			if (T <= c->gemv_max_t && L->rg.data) {
				r = proj(c, NULL, &L->rg, nff, ne, c->xn, ne, T, c->gu, 2 * nff, 0.0f);
				if (!r)
					r = proj(c, NULL, &L->ru, nff, ne, c->xn, ne, T, c->gu + nff, 2 * nff, 0.0f);
			} else {
				r = gemm(c, L->wgu, 2 * nff, ne, c->xn, ne, T, c->gu, 2 * nff, 0.0f);
			}
			if (r < 0)
				goto fail;
			break;
		case KVD_OP_GLU:
			CK(cu_glu(c->gu, T, nff, op->act == KVD_ACT_GELU_TANH, c->h, c->s));
			break;
		case KVD_OP_OUTPUT_NORM:
			if (NL > 0)
				CK(cu_rmsnorm(c->x, d_lsrc, NL, ne, vec[0], op->eps, c->xn, c->s));
			break;
		case KVD_OP_LOGITS:
			if (NL <= 0)
				break;
			r = proj(c, c->output, &c->rout, hp->n_vocab, ne, c->xn, ne, NL, c->logits_d, hp->n_vocab, 0.0f);
			if (r < 0)
				goto fail;
			CK(cudaMemcpyAsync(c->logits_h, c->logits_d, (size_t)NL * hp->n_vocab * sizeof(float),
					   cudaMemcpyDeviceToHost, c->s));
			break;
		default:
			/* EMBD_SCALE, KV_STORE, POST_NORM, RESIDUAL away from
			 * the operation they fuse with, or a kind unknown here */
			return -ENOTSUP;
		}
	}
fail:
	return r;
}

int cuda_forward(void *ctx, const struct kvd_batch *b)
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
		struct cu_kv kv;
		kv.base = c->pool;
		kv.block_size = (int32_t)c->L.block_size;
		kv.kv_dim = (int32_t)c->L.kv_dim;
		kv.type = (int32_t)c->L.type;
		kv.head_bytes = (int32_t)kvd_kv_row_bytes(c->L.type, (uint32_t)hp->head_dim);
		kv.n_global = (int32_t)c->n_global;
		kv.layer_g = -1;
		kv.token_stride = (int64_t)c->L.token_stride;
		kv.v_offset = (int64_t)c->L.v_offset;
		kv.layer_stride = (int64_t)c->L.layer_stride;
		kv.page_bytes = (int64_t)c->L.page_bytes;

		struct cu_step st = {T, d_pos, d_poff, d_pages, d_dec, n_dec, d_pre, n_pre, kv, 0.0f, 0.0f};
		r = run_program(c, &st, d_tok, d_lsrc, NL);
		if (r < 0)
			goto fail;
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

