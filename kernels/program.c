/*
 * kernels/program.c — the one builder of the forward pass (program.h):
 * kvd_model_weights in, the list of operations every backend executes out.
 *
 * Each departure from the Llama base is one line here: an optional tensor
 * (biases, Q/K norms, post-norms) emits its operation where the layer has
 * it, a descriptor value (window, activation) is copied into its
 * operation, and the values backends used to derive each on their own are
 * resolved once (a layer's RoPE base and scaling, the attention scale, the
 * embedding scale). Linked into libkernels and, hidden, into each device
 * plug-in.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "program.h"

static const char *const kind_names[KVD_OP_KIND_END] = {
	[KVD_OP_EMBED] = "embed",
	[KVD_OP_EMBD_SCALE] = "embd_scale",
	[KVD_OP_NORM] = "norm",
	[KVD_OP_QKV] = "qkv",
	[KVD_OP_QKV_BIAS] = "qkv_bias",
	[KVD_OP_QK_NORM] = "qk_norm",
	[KVD_OP_ROPE] = "rope",
	[KVD_OP_KV_STORE] = "kv_store",
	[KVD_OP_ATTENTION] = "attention",
	[KVD_OP_ATTN_OUT] = "attn_out",
	[KVD_OP_POST_NORM] = "post_norm",
	[KVD_OP_RESIDUAL] = "residual",
	[KVD_OP_GATE_UP] = "gate_up",
	[KVD_OP_GLU] = "glu",
	[KVD_OP_DOWN] = "down",
	[KVD_OP_OUTPUT_NORM] = "output_norm",
	[KVD_OP_LOGITS] = "logits",
};

const char *kvd_op_kind_name(enum kvd_op_kind k)
{
	return k > 0 && k < KVD_OP_KIND_END && kind_names[k] ? kind_names[k] : "?";
}

/* Ops of a layer at most, and of the prologue plus the epilogue. */
#define OPS_PER_LAYER 16
#define OPS_OUTSIDE 4

struct builder {
	struct kvd_program *p;
	int32_t layer;
};

static struct kvd_op *emit(struct builder *b, enum kvd_op_kind kind)
{
	struct kvd_op *op = &b->p->ops[b->p->n_ops++];
	op->kind = kind;
	op->layer = b->layer;
	b->p->kinds |= 1u << kind;
	return op;
}

static void emit_w(struct builder *b, enum kvd_op_kind kind, const struct kvd_tensor *w0, float eps)
{
	struct kvd_op *op = emit(b, kind);
	op->w[0] = w0;
	op->eps = eps;
}

/* A sublayer's end: its output y, post-normalised where the model has
 * such a norm, added to the residual stream. */
static void emit_residual(struct builder *b, const struct kvd_model_weights *w, const struct kvd_tensor *post)
{
	if (post->data)
		emit_w(b, KVD_OP_POST_NORM, post, w->hp.rms_eps);
	emit(b, KVD_OP_RESIDUAL);
}

static void emit_layer(struct builder *b, const struct kvd_model_weights *w, const struct kvd_layer_weights *L)
{
	const struct kvd_hparams *hp = &w->hp;
	/* a model without the RoPE departures rotates every layer by the
	 * base RoPE, whatever its descriptors' fields hold (they may be 0) */
	int rope_ext = (w->features & (KVD_FEAT_LAYER_ROPE | KVD_FEAT_ROPE_FREQS | KVD_FEAT_ROPE_LINEAR)) != 0;
	struct kvd_op *op;

	/* attention */
	emit_w(b, KVD_OP_NORM, &L->attn_norm, hp->rms_eps);
	op = emit(b, KVD_OP_QKV);
	op->w[0] = &L->wq;
	op->w[1] = &L->wk;
	op->w[2] = &L->wv;
	if ((L->bq.data || L->bk.data || L->bv.data)) {
		op = emit(b, KVD_OP_QKV_BIAS);
		op->w[0] = L->bq.data ? &L->bq : NULL;
		op->w[1] = L->bk.data ? &L->bk : NULL;
		op->w[2] = L->bv.data ? &L->bv : NULL;
	}
	if ((L->q_norm.data || L->k_norm.data)) {
		op = emit(b, KVD_OP_QK_NORM);
		op->w[0] = L->q_norm.data ? &L->q_norm : NULL;
		op->w[1] = L->k_norm.data ? &L->k_norm : NULL;
		op->eps = hp->rms_eps;
	}
	op = emit(b, KVD_OP_ROPE);
	op->theta = rope_ext && L->d.rope_theta > 0 ? L->d.rope_theta : hp->rope_theta;
	op->freq_scale = rope_ext && L->d.rope_freq_scale > 0 ? L->d.rope_freq_scale : 1.0f;
	op->freqs = rope_ext ? (const float *)w->rope_freqs.data : NULL;
	op->style = hp->rope_style;
	emit(b, KVD_OP_KV_STORE);
	op = emit(b, KVD_OP_ATTENTION);
	op->scale = b->p->attn_scale;
	op->window = L->d.window;
	emit_w(b, KVD_OP_ATTN_OUT, &L->wo, 0);
	emit_residual(b, w, &L->post_attn_norm);

	/* feed-forward */
	emit_w(b, KVD_OP_NORM, &L->ffn_norm, hp->rms_eps);
	op = emit(b, KVD_OP_GATE_UP);
	op->w[0] = &L->w_gate;
	op->w[1] = &L->w_up;
	op = emit(b, KVD_OP_GLU);
	op->act = L->d.act;
	emit_w(b, KVD_OP_DOWN, &L->w_down, 0);
	emit_residual(b, w, &L->post_ffn_norm);
}

int kvd_program_build(const struct kvd_model_weights *w, struct kvd_program **ret)
{
	const struct kvd_hparams *hp = &w->hp;
	struct kvd_program *p;
	struct builder b;
	size_t cap;

	if (hp->n_layer <= 0 || !w->layers || hp->head_dim <= 0)
		return -EINVAL;
	cap = (size_t)hp->n_layer * OPS_PER_LAYER + OPS_OUTSIDE;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->ops = calloc(cap, sizeof(*p->ops));
	p->layer_first = calloc((size_t)hp->n_layer + 1, sizeof(*p->layer_first));
	if (!p->ops || !p->layer_first) {
		kvd_program_free(p);
		return -ENOMEM;
	}
	p->n_layer = hp->n_layer;
	p->attn_scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim);
	b.p = p;

	b.layer = -1;
	emit(&b, KVD_OP_EMBED)->w[0] = &w->tok_embd;
	if ((w->features & KVD_FEAT_EMBD_SCALE) && hp->embd_scale > 0)
		emit(&b, KVD_OP_EMBD_SCALE)->scale = hp->embd_scale;
	for (int32_t l = 0; l < hp->n_layer; l++) {
		b.layer = l;
		p->layer_first[l] = p->n_ops;
		emit_layer(&b, w, &w->layers[l]);
	}
	b.layer = -1;
	p->layer_first[hp->n_layer] = p->n_ops;
	emit_w(&b, KVD_OP_OUTPUT_NORM, &w->output_norm, hp->rms_eps);
	emit_w(&b, KVD_OP_LOGITS, &w->output, 0);
	*ret = p;
	return 0;
}

void kvd_program_free(struct kvd_program *p)
{
	if (!p)
		return;
	free(p->ops);
	free(p->layer_first);
	free(p);
}
