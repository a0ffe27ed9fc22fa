/*
 * kernels/cpu/cpu_forward.c — one step of the CPU backend: the executor of
 * the forward program (kernels/program.h) over a batch of sequences whose
 * K/V live in pages.
 *
 * One forward() call takes any mix of prefill chunks and single-token
 * decodes. All the batch's tokens are laid out as rows of one activation
 * matrix, so every weight matrix is streamed from memory once per step
 * whatever the batch size; attention (kernels/cpu/attention.c) then runs per
 * (token, KV head), reading K/V straight from the pages named by that
 * token's sequence's page table.
 *
 * The executor walks the program. Each run of consecutive row-local
 * operations (norms, biases, Q/K norms, RoPE, the KV store, residual adds,
 * the GLU) is one parallel pass over the rows, every row taking the run's
 * operations in order; the pass also writes the q8 form of the input of
 * the matrix product that follows when that product reads it. Products,
 * attention, the embedding and the logits are one call each. There is no
 * layer loop here: the program is the layer structure.
 *
 * Buffers: y (a sublayer's output) is kept in xn's rows: the program reads
 * y only until the residual add, and writes xn only after it.
 *
 * Determinism: every output element is computed by the same code path with
 * the same reduction order whatever the batch's shape, the thread count, the
 * chunking of a prompt or the pages' physical placement: matrix products
 * split work by output row, each (row, token) dot product runs over the
 * whole row in block order, and attention walks positions 0..p in order
 * with no dependence on page boundaries. So a sequence's logits are
 * bit-identical alone or in any batch.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "grow.h"
#include "kvquant.h"
#include "kvshift.h"

/* which activation the q8 scratch (xq) holds */
enum xq_src { XQ_NONE, XQ_XN, XQ_GATE, XQ_ATT };

/* The step as the executor's pieces see it. */
struct fwd {
	struct cpu_ctx *c;
	const struct kvd_batch *b;
	int T;
	int n_logit_rows;
	/* the row run being executed, and what its pass quantizes after it */
	const struct kvd_op *run;
	int n_run;
	enum xq_src quant;
	enum xq_src xq_holds;
	/* ... with one scale per 256 (quantize_q8k): quant_k for the pass's,
	 * xq_k for what xq holds */
	int quant_k, xq_k;
	/* c->rope holds the table of (rope_th, rope_sc, rope_fr) when
	 * rope_ok; c->rope_alt that of the (alt_*) when alt_ok: a model
	 * alternating between two RoPEs (Gemma 3's local and global layers)
	 * computes each once a step */
	float rope_th, rope_sc, alt_th, alt_sc;
	const float *rope_fr, *alt_fr;
	int rope_ok, alt_ok;
};

static int ensure_scratch(struct cpu_ctx *c, int T, int max_pos, int n_logit_rows)
{
	const struct kvd_hparams *hp = &c->w->hp;
	int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	int64_t wide = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
	if (qd > wide)
		wide = qd;

	if (T > c->cap_tokens) {
		int n = T < 16 ? 16 : T;
		GROW(c->x, n * (int64_t)hp->n_embd);
		GROW(c->xn, n * wide);
		GROW(c->xq, n * q8_row_len(wide));
		GROW(c->q, n * qd);
		GROW(c->kk, n * kvd);
		GROW(c->vv, n * kvd);
		GROW(c->att, n * qd);
		GROW(c->gate, n * (int64_t)hp->n_ff);
		GROW(c->up, n * (int64_t)hp->n_ff);
		GROW(c->tok_seq, n);
		GROW(c->tok_pos, n);
		GROW(c->rope, n * (int64_t)hp->head_dim);
		GROW(c->rope_alt, n * (int64_t)hp->head_dim);
		c->cap_tokens = n;
	}
	if (n_logit_rows > c->cap_logit_rows) {
		GROW(c->logit_rows, n_logit_rows * (int64_t)hp->n_embd);
		GROW(c->logit_src, n_logit_rows);
		GROW(c->logits_tmp, n_logit_rows * (int64_t)hp->n_vocab);
		c->cap_logit_rows = n_logit_rows;
	}
	return cpu_attn_reserve(&c->attn, max_pos);
}

/* ---- row-local operations ------------------------------------------------ */

/* x[i] += y[i] (the residual stream), four lanes at a time: the same
 * float sums as the scalar loop */
typedef float v4f __attribute__((vector_size(16), aligned(4)));
typedef int32_t v4i __attribute__((vector_size(16)));

static void add_row(float *x, const float *y, int64_t n)
{
	int64_t i = 0;
	for (; i + 4 <= n; i += 4) {
		v4f a, b;
		memcpy(&a, x + i, sizeof(a));
		memcpy(&b, y + i, sizeof(b));
		a += b;
		memcpy(x + i, &a, sizeof(a));
	}
	for (; i < n; i++)
		x[i] += y[i];
}

/* Rotate the pairs of one head vector by a token's rope table: each
 * rotated value a product, a product and a sum or difference, as
 * x0 * cs - x1 * sn and x0 * sn + x1 * cs; four lanes at a time. */
static void rope_head(float *v, int hd, const float *tab, enum kvd_rope_style style)
{
	int i = 0;
	if (style == KVD_ROPE_NEOX) {
		/* pair i is (i, i + hd / 2): the halves as vectors, the table
		 * de-interleaved */
		for (; i + 4 <= hd / 2; i += 4) {
			v4f t0, t1, x0, x1;
			memcpy(&t0, tab + 2 * i, sizeof(t0));
			memcpy(&t1, tab + 2 * i + 4, sizeof(t1));
			memcpy(&x0, v + i, sizeof(x0));
			memcpy(&x1, v + i + hd / 2, sizeof(x1));
			v4f cs = __builtin_shuffle(t0, t1, (v4i){0, 2, 4, 6});
			v4f sn = __builtin_shuffle(t0, t1, (v4i){1, 3, 5, 7});
			v4f y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
			memcpy(v + i, &y0, sizeof(y0));
			memcpy(v + i + hd / 2, &y1, sizeof(y1));
		}
	} else {
		/* pair i is (2i, 2i + 1), laid out as the table's (cos, sin) */
		for (; i + 2 <= hd / 2; i += 2) {
			v4f t, x;
			memcpy(&t, tab + 2 * i, sizeof(t));
			memcpy(&x, v + 2 * i, sizeof(x));
			v4f a = __builtin_shuffle(x, (v4i){0, 0, 2, 2}) * t;
			v4f b = __builtin_shuffle(x, (v4i){1, 1, 3, 3}) * __builtin_shuffle(t, (v4i){1, 0, 3, 2});
			v4f y = __builtin_shuffle(a - b, a + b, (v4i){0, 5, 2, 7});
			memcpy(v + 2 * i, &y, sizeof(y));
		}
	}
	for (; i < hd / 2; i++) {
		float cs = tab[2 * i], sn = tab[2 * i + 1];
		int a = style == KVD_ROPE_NEOX ? i : 2 * i;
		int b = style == KVD_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
		float x0 = v[a], x1 = v[b];
		v[a] = x0 * cs - x1 * sn;
		v[b] = x0 * sn + x1 * cs;
	}
}

static void add_vec(float *x, const struct kvd_tensor *b, int64_t n)
{
	const float *v = b->data;
	for (int64_t i = 0; i < n; i++)
		x[i] += v[i];
}

/* One row-local operation on row t. */
static void row_op(const struct fwd *f, const struct kvd_op *op, int t)
{
	struct cpu_ctx *c = f->c;
	const struct kvd_hparams *hp = &c->w->hp;
	int hd = hp->head_dim;
	int64_t ne = hp->n_embd, nff = hp->n_ff, qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd;
	float *x = c->x + t * ne, *xn = c->xn + t * ne;
	float *q = c->q + t * qd, *k = c->kk + t * kvd, *v = c->vv + t * kvd;

	switch (op->kind) {
	case KVD_OP_EMBD_SCALE:
		for (int64_t e = 0; e < ne; e++)
			x[e] *= op->scale;
		break;
	case KVD_OP_NORM:
		c->k.rmsnorm(xn, x, op->w[0]->data, ne, op->eps);
		break;
	case KVD_OP_QKV_BIAS:
		if (op->w[0])
			add_vec(q, op->w[0], qd);
		if (op->w[1])
			add_vec(k, op->w[1], kvd);
		if (op->w[2])
			add_vec(v, op->w[2], kvd);
		break;
	case KVD_OP_QK_NORM:
		for (int h = 0; op->w[0] && h < hp->n_head; h++)
			c->k.rmsnorm(q + h * hd, q + h * hd, op->w[0]->data, hd, op->eps);
		for (int h = 0; op->w[1] && h < hp->n_head_kv; h++)
			c->k.rmsnorm(k + h * hd, k + h * hd, op->w[1]->data, hd, op->eps);
		break;
	case KVD_OP_ROPE: {
		const float *tab = c->rope + (int64_t)t * hd;
		for (int h = 0; h < hp->n_head; h++)
			rope_head(q + h * hd, hd, tab, op->style);
		for (int h = 0; h < hp->n_head_kv; h++)
			rope_head(k + h * hd, hd, tab, op->style);
		break;
	}
	case KVD_OP_KV_STORE: {
		const struct kvd_kv_layout *L = &c->kv.layout;
		const struct kvd_batch_seq *sq = &f->b->seqs[c->tok_seq[t]];
		int pos = c->tok_pos[t];
		int32_t page = sq->pages[pos / (int)L->block_size];
		char *base = (char *)c->kv.base + (size_t)page * L->page_bytes + (size_t)op->layer * L->layer_stride +
			     (size_t)(pos % (int)L->block_size) * L->token_stride;
		if (L->type == KVD_KV_F16) {
			c->k.store_f16((uint16_t *)base, k, kvd);
			c->k.store_f16((uint16_t *)(base + L->v_offset), v, kvd);
		} else {
			cpu_kvq_store_row(L->type, base, k, kvd);
			cpu_kvq_store_row(L->type, base + L->v_offset, v, kvd);
		}
		break;
	}
	case KVD_OP_POST_NORM:
		c->k.rmsnorm(xn, xn, op->w[0]->data, ne, op->eps);
		break;
	case KVD_OP_RESIDUAL:
		add_row(x, xn, ne);
		break;
	case KVD_OP_GLU: {
		float *g = c->gate + t * nff;
		if (op->act == KVD_ACT_GELU_TANH) /* GeGLU: tanh-approximated GELU of the gate times up */
			c->k.geglu(g, c->up + t * nff, nff);
		else
			c->k.swiglu(g, c->up + t * nff, nff);
		break;
	}
	default:
		/* kvd_op_row_local() names only the kinds above */
		break;
	}
}

/* The run's operations on each of the worker's rows, then the q8 form of
 * the product's input that follows. */
static void row_worker(void *arg, int ith, int nth)
{
	const struct fwd *f = arg;
	struct cpu_ctx *c = f->c;
	int64_t ne = c->w->hp.n_embd, nff = c->w->hp.n_ff;
	for (int t = ith; t < f->T; t += nth) {
		for (int i = 0; i < f->n_run; i++)
			row_op(f, &f->run[i], t);
		void (*quant)(const float *, struct q8_block *, int64_t) = f->quant_k ? c->k.quantize_q8k
										     : c->k.quantize_q8;
		if (f->quant == XQ_XN)
			quant(c->xn + t * ne, c->xq + t * q8_row_len(ne), ne);
		else if (f->quant == XQ_GATE)
			quant(c->gate + t * nff, c->xq + t * q8_row_len(nff), nff);
	}
}

/* Every row's RoPE table (cos, sin of each pair at its position). */
struct rope_job {
	struct cpu_ctx *c;
	int T;
	const struct kvd_op *op;
};

static void rope_worker(void *arg, int ith, int nth)
{
	const struct rope_job *j = arg;
	struct cpu_ctx *c = j->c;
	int hd = c->w->hp.head_dim;
	for (int t = ith; t < j->T; t += nth)
		cpu_rope_table(c->rope + (int64_t)t * hd, hd, c->tok_pos[t], j->op->theta, j->op->freq_scale,
			       j->op->freqs);
}

/* c->rope made the table of op's RoPE: kept when it is already, swapped
 * with c->rope_alt when that one is, else computed. */
static void rope_prepare(struct fwd *f, const struct kvd_op *op)
{
	struct cpu_ctx *c = f->c;
	if (f->rope_ok && op->theta == f->rope_th && op->freq_scale == f->rope_sc && op->freqs == f->rope_fr)
		return;
	float *tab = c->rope;
	c->rope = c->rope_alt;
	c->rope_alt = tab;
	if (!f->alt_ok || op->theta != f->alt_th || op->freq_scale != f->alt_sc || op->freqs != f->alt_fr) {
		struct rope_job rj = {c, f->T, op};
		be_run_rows(c, rope_worker, &rj, f->T);
	}
	f->alt_ok = f->rope_ok;
	f->alt_th = f->rope_th;
	f->alt_sc = f->rope_sc;
	f->alt_fr = f->rope_fr;
	f->rope_th = op->theta;
	f->rope_sc = op->freq_scale;
	f->rope_fr = op->freqs;
	f->rope_ok = 1;
}

static int any_quantized(const struct kvd_op *op)
{
	for (int i = 0; i < 3; i++)
		if (op->w[i] && wtype_is_quantized(op->w[i]->type))
			return 1;
	return 0;
}

/* Whether op's products take their activations with one scale per 256:
 * where any of its matrices is a K-quant (whose tiles need them; the
 * others' kernels take such rows too, with the coarser scale). */
static int wants_q8k(const struct kvd_op *op)
{
	for (int i = 0; i < 3; i++)
		if (op->w[i] && wtype_wants_q8k(op->w[i]->type))
			return 1;
	return 0;
}

/* What a row run's pass quantizes for the operation after it. */
static enum xq_src quant_for(const struct kvd_op *next)
{
	if (!next || !any_quantized(next))
		return XQ_NONE;
	switch (next->kind) {
	case KVD_OP_QKV:
	case KVD_OP_GATE_UP: return XQ_XN;
	case KVD_OP_DOWN: return XQ_GATE;
	default: return XQ_NONE;
	}
}

/* ---- the other operations ------------------------------------------------ */

/* xq made the q8 form of activation src (n floats a row) when op reads it. */
static void need_q8(struct fwd *f, const struct kvd_op *op, enum xq_src src, const float *x, int64_t n)
{
	int k = wants_q8k(op);
	if (!any_quantized(op) || (f->xq_holds == src && f->xq_k == k))
		return;
	be_quantize_rows(f->c, x, n, f->c->xq, q8_row_len(n), f->T, n, k);
	f->xq_holds = src;
	f->xq_k = k;
}

static void op_embed(struct fwd *f, const struct kvd_op *op)
{
	struct cpu_ctx *c = f->c;
	const struct kvd_model_weights *w = c->w;
	const struct kvd_tensor *te = op->w[0];
	int64_t ne = w->hp.n_embd;
	/* a tied table is read from the output matrix's packed copy where
	 * that keeps the stored bytes (its own pages were handed back after
	 * packing, and each token's row would fault in from the file) */
	const void *emb_packed = w->output.data == te->data ? c->packed[w->hp.n_layer * PK_PER_LAYER] : NULL;
	int t = 0;
	for (int i = 0; i < f->b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &f->b->seqs[i];
		for (int j = 0; j < s->n_tokens; j++, t++) {
			const void *row = (const char *)te->data + (size_t)s->tokens[j] * te->row_bytes;
			/* xn's row is free until the first norm, and holds n_embd
			 * floats: as many bytes as any stored row */
			void *tmp = c->xn + (int64_t)t * ne;
			if (emb_packed && cpu_gemm_unpack_row(te->type, emb_packed, ne, s->tokens[j], tmp) == 0)
				row = tmp;
			cpu_dequantize_row(te->type, row, c->x + (int64_t)t * ne, ne);
		}
	}
}

/* A product job: y (row stride ldy) = w x, x the activation src of n
 * floats a row (and its q8 form in xq where w is quantized). */
static struct mm_job mm_job_of(const struct fwd *f, const struct kvd_tensor *w, int pk, const float *x, int64_t n,
			       float *y, int64_t ldy)
{
	struct cpu_ctx *c = f->c;
	struct mm_job j = {c, w, f->T, x, n, wtype_is_quantized(w->type) ? c->xq : NULL, q8_row_len(n), y, ldy,
			   c->packed[pk]};
	return j;
}

static void op_logits(struct fwd *f, const struct kvd_op *op)
{
	struct cpu_ctx *c = f->c;
	const struct kvd_batch *b = f->b;
	const struct kvd_hparams *hp = &c->w->hp;
	int64_t ne = hp->n_embd;
	int n = f->n_logit_rows;

	if (wtype_is_quantized(op->w[0]->type))
		be_quantize_rows(c, c->logit_rows, ne, c->xq, q8_row_len(ne), n, ne, wants_q8k(op));
	/* one pass over the output matrix for every row that wants logits,
	 * then each sequence's rows to its buffer */
	float *out = c->logits_tmp;
	if (n == 1) {
		for (int i = 0; i < b->n_seqs; i++)
			if (b->seqs[i].logits)
				out = b->seqs[i].logits;
	}
	be_matmul(c, op->w[0], c->packed[hp->n_layer * PK_PER_LAYER], n, c->logit_rows, ne, c->xq, q8_row_len(ne), out,
		  hp->n_vocab);
	if (out != c->logits_tmp)
		return;
	int lr = 0;
	for (int i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		if (!s->logits)
			continue;
		int k = s->all_logits ? s->n_tokens : 1;
		memcpy(s->logits, c->logits_tmp + (size_t)lr * hp->n_vocab, sizeof(float) * (size_t)k * hp->n_vocab);
		lr += k;
	}
}

/* One operation that is not row-local. */
static int exec_op(struct fwd *f, const struct kvd_op *op)
{
	struct cpu_ctx *c = f->c;
	const struct kvd_hparams *hp = &c->w->hp;
	int64_t ne = hp->n_embd, nff = hp->n_ff, qd = (int64_t)hp->n_head * hp->head_dim;
	int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	int pk = op->layer * PK_PER_LAYER;
	int T = f->T;

	switch (op->kind) {
	case KVD_OP_EMBED:
		op_embed(f, op);
		f->xq_holds = XQ_NONE;
		return 0;
	case KVD_OP_QKV: {
		need_q8(f, op, XQ_XN, c->xn, ne);
		struct mm_multi m = {
			.jobs = {mm_job_of(f, op->w[0], pk + PK_Q, c->xn, ne, c->q, qd),
				 mm_job_of(f, op->w[1], pk + PK_K, c->xn, ne, c->kk, kvd),
				 mm_job_of(f, op->w[2], pk + PK_V, c->xn, ne, c->vv, kvd)},
			.n = 3,
		};
		be_mm_run(c, &m);
		return 0;
	}
	case KVD_OP_ATTENTION:
		f->xq_holds = XQ_NONE;
		return cpu_attn_run(&c->attn, &c->kv, f->b, op->layer, op->window, T, c->tok_seq, c->tok_pos, c->q,
				    c->att);
	case KVD_OP_ATTN_OUT:
		need_q8(f, op, XQ_ATT, c->att, qd);
		be_matmul(c, op->w[0], c->packed[pk + PK_O], T, c->att, qd, c->xq, q8_row_len(qd), c->xn, ne);
		return 0;
	case KVD_OP_GATE_UP: {
		need_q8(f, op, XQ_XN, c->xn, ne);
		struct mm_multi m = {
			.jobs = {mm_job_of(f, op->w[0], pk + PK_GATE, c->xn, ne, c->gate, nff),
				 mm_job_of(f, op->w[1], pk + PK_UP, c->xn, ne, c->up, nff)},
			.n = 2,
		};
		be_mm_run(c, &m);
		return 0;
	}
	case KVD_OP_DOWN:
		need_q8(f, op, XQ_GATE, c->gate, nff);
		be_matmul(c, op->w[0], c->packed[pk + PK_DOWN], T, c->gate, nff, c->xq, q8_row_len(nff), c->xn, ne);
		return 0;
	case KVD_OP_OUTPUT_NORM: {
		/* the rows that want logits, in batch order */
		int lr = 0, t = 0;
		for (int i = 0; i < f->b->n_seqs; i++) {
			const struct kvd_batch_seq *s = &f->b->seqs[i];
			if (s->logits)
				for (int j = s->all_logits ? 0 : s->n_tokens - 1; j < s->n_tokens; j++)
					c->logit_src[lr++] = t + j;
			t += s->n_tokens;
		}
		for (int i = 0; i < f->n_logit_rows; i++)
			c->k.rmsnorm(c->logit_rows + (int64_t)i * ne, c->x + (int64_t)c->logit_src[i] * ne,
				     op->w[0]->data, ne, op->eps);
		return 0;
	}
	case KVD_OP_LOGITS:
		op_logits(f, op);
		return 0;
	default:
		/* a kind this executor lacks: kvd_program_build emits none */
		return -ENOTSUP;
	}
}

int be_forward(void *ctx, const struct kvd_batch *b)
{
	struct cpu_ctx *c = ctx;
	const struct kvd_program *p = c->prog;
	const struct kvd_hparams *hp;
	struct fwd f = {0};
	int T = 0, max_pos = 0, n_logit_rows = 0;
	int r;

	if (!c->w || !p || !c->kv_attached)
		return -EINVAL;
	hp = &c->w->hp;
	if (b->n_seqs <= 0)
		return 0;
	for (int i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		int64_t end = (int64_t)s->pos0 + s->n_tokens;
		if (s->n_tokens <= 0 || s->pos0 < 0 || !s->tokens || !s->pages)
			return -EINVAL;
		if (end > (int64_t)s->n_pages * c->kv.layout.block_size || T + (int64_t)s->n_tokens > CPU_MAX_BATCH_TOKENS)
			return -E2BIG;
		if (cpu_attn_check_pages(&c->attn, &c->kv, s) < 0)
			return -EINVAL;
		for (int t = 0; t < s->n_tokens; t++)
			if (s->tokens[t] < 0 || s->tokens[t] >= hp->n_vocab)
				return -EINVAL;
		T += s->n_tokens;
		if (end - 1 > max_pos)
			max_pos = (int)(end - 1);
		if (s->logits)
			n_logit_rows += s->all_logits ? s->n_tokens : 1;
	}
	r = ensure_scratch(c, T, max_pos, n_logit_rows);
	if (r < 0)
		return r;
	/* the row -> (sequence, position) map */
	for (int i = 0, t = 0; i < b->n_seqs; i++)
		for (int j = 0; j < b->seqs[i].n_tokens; j++, t++) {
			c->tok_seq[t] = i;
			c->tok_pos[t] = b->seqs[i].pos0 + j;
		}

	f.c = c;
	f.b = b;
	f.T = T;
	f.n_logit_rows = n_logit_rows;
	for (int i = 0; i < p->n_ops;) {
		const struct kvd_op *op = &p->ops[i];
		if (kvd_op_row_local(op->kind)) {
			int j = i;
			for (; j < p->n_ops && kvd_op_row_local(p->ops[j].kind); j++)
				if (p->ops[j].kind == KVD_OP_ROPE)
					rope_prepare(&f, &p->ops[j]); /* (one per layer, between two products) */
			f.run = op;
			f.n_run = j - i;
			f.quant = quant_for(j < p->n_ops ? &p->ops[j] : NULL);
			f.quant_k = f.quant != XQ_NONE && wants_q8k(&p->ops[j]);
			be_run_rows(c, row_worker, &f, T);
			f.xq_holds = f.quant;
			f.xq_k = f.quant_k;
			i = j;
			continue;
		}
		if ((op->kind == KVD_OP_OUTPUT_NORM || op->kind == KVD_OP_LOGITS) && !n_logit_rows) {
			i++;
			continue;
		}
		r = exec_op(&f, op);
		if (r < 0)
			return r;
		i++;
	}
	return 0;
}
