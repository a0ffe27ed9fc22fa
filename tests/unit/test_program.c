/*
 * tests/unit/test_program.c — the forward program (kernels/program.h): the
 * operations kvd_program_build() emits for each family's description (the
 * Llama base, Qwen 2 biases, Qwen 3 / Gemma 3 per-head norms, Gemma 3's
 * sandwich norms, GeGLU, windows and two RoPE bases, Llama 3's rope_freqs
 * and linear scaling), in the order kernels/backend.h's kvd_layer_desc
 * states, with the values resolved once and the weights named; and the
 * kind mask a backend checks its executor against at load.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"

#define NL 3

/* A description with NL layers; the tensors' data only has to be non-NULL
 * where a tensor is present (the builder reads no weight). */
struct model {
	struct kvd_model_weights w;
	struct kvd_layer_weights layers[NL];
};

static float dummy[64];

static void vec(struct kvd_tensor *t)
{
	t->data = dummy;
	t->type = KVD_WTYPE_F32;
	t->rows = 1;
}

static void llama(struct model *m)
{
	memset(m, 0, sizeof(*m));
	m->w.hp.n_layer = NL;
	m->w.hp.n_embd = 64;
	m->w.hp.n_head = 2;
	m->w.hp.n_head_kv = 1;
	m->w.hp.head_dim = 32;
	m->w.hp.n_ff = 128;
	m->w.hp.n_vocab = 100;
	m->w.hp.rms_eps = 1e-5f;
	m->w.hp.rope_theta = 10000.0f;
	m->w.layers = m->layers;
	vec(&m->w.output_norm);
	m->w.tok_embd.data = dummy;
	m->w.output.data = dummy;
	for (int l = 0; l < NL; l++) {
		struct kvd_layer_weights *L = &m->layers[l];
		vec(&L->attn_norm);
		vec(&L->ffn_norm);
		L->wq.data = L->wk.data = L->wv.data = L->wo.data = dummy;
		L->w_gate.data = L->w_up.data = L->w_down.data = dummy;
	}
}

static const enum kvd_op_kind llama_layer[] = {
	KVD_OP_NORM, KVD_OP_QKV, KVD_OP_ROPE, KVD_OP_KV_STORE, KVD_OP_ATTENTION, KVD_OP_ATTN_OUT, KVD_OP_RESIDUAL,
	KVD_OP_NORM, KVD_OP_GATE_UP, KVD_OP_GLU, KVD_OP_DOWN, KVD_OP_RESIDUAL,
};

static const enum kvd_op_kind gemma_layer[] = {
	KVD_OP_NORM, KVD_OP_QKV, KVD_OP_QK_NORM, KVD_OP_ROPE, KVD_OP_KV_STORE, KVD_OP_ATTENTION, KVD_OP_ATTN_OUT,
	KVD_OP_POST_NORM, KVD_OP_RESIDUAL, KVD_OP_NORM, KVD_OP_GATE_UP, KVD_OP_GLU, KVD_OP_DOWN, KVD_OP_POST_NORM,
	KVD_OP_RESIDUAL,
};

/* The first op of `kind` at or after layer l's start, or NULL. */
static const struct kvd_op *find(const struct kvd_program *p, int l, enum kvd_op_kind kind)
{
	for (int i = p->layer_first[l]; i < p->layer_first[l + 1]; i++)
		if (p->ops[i].kind == kind)
			return &p->ops[i];
	return NULL;
}

static void check_layer(const struct kvd_program *p, int l, const enum kvd_op_kind *want, int n)
{
	assert_int_equal(p->layer_first[l + 1] - p->layer_first[l], n);
	for (int i = 0; i < n; i++) {
		const struct kvd_op *op = &p->ops[p->layer_first[l] + i];
		if (op->kind != want[i])
			fail_msg("layer %d op %d: %s, want %s", l, i, kvd_op_kind_name(op->kind), kvd_op_kind_name(want[i]));
		assert_int_equal(op->layer, l);
	}
}

static void test_llama_base(void **state)
{
	struct model m;
	struct kvd_program *p = NULL;
	(void)state;
	llama(&m);
	/* a Llama-base description may leave its descriptor fields 0, or hold
	 * values its feature word does not announce: the base RoPE either way */
	m.layers[1].d.rope_theta = 5.0f;
	m.layers[1].d.rope_freq_scale = 0.25f;
	assert_int_equal(kvd_program_build(&m.w, &p), 0);
	assert_int_equal(p->ops[0].kind, KVD_OP_EMBED);
	assert_ptr_equal(p->ops[0].w[0], &m.w.tok_embd);
	assert_int_equal(p->layer_first[0], 1); /* no embedding scale */
	for (int l = 0; l < NL; l++) {
		check_layer(p, l, llama_layer, (int)(sizeof(llama_layer) / sizeof(llama_layer[0])));
		const struct kvd_op *rope = find(p, l, KVD_OP_ROPE), *att = find(p, l, KVD_OP_ATTENTION);
		assert_true(rope->theta == 10000.0f && rope->freq_scale == 1.0f && rope->freqs == NULL);
		assert_true(att->window == 0 && att->scale == 1.0f / sqrtf(32.0f));
		assert_int_equal(find(p, l, KVD_OP_GLU)->act, KVD_ACT_SILU);
		const struct kvd_op *qkv = find(p, l, KVD_OP_QKV), *gu = find(p, l, KVD_OP_GATE_UP);
		assert_ptr_equal(qkv->w[0], &m.layers[l].wq);
		assert_ptr_equal(qkv->w[1], &m.layers[l].wk);
		assert_ptr_equal(qkv->w[2], &m.layers[l].wv);
		assert_ptr_equal(find(p, l, KVD_OP_ATTN_OUT)->w[0], &m.layers[l].wo);
		assert_ptr_equal(gu->w[0], &m.layers[l].w_gate);
		assert_ptr_equal(gu->w[1], &m.layers[l].w_up);
		assert_ptr_equal(find(p, l, KVD_OP_DOWN)->w[0], &m.layers[l].w_down);
		/* the first norm is the attention's, the second the FFN's */
		assert_ptr_equal(p->ops[p->layer_first[l]].w[0], &m.layers[l].attn_norm);
		assert_ptr_equal(p->ops[p->layer_first[l] + 7].w[0], &m.layers[l].ffn_norm);
		assert_true(p->ops[p->layer_first[l]].eps == 1e-5f);
	}
	assert_int_equal(p->n_ops, p->layer_first[NL] + 2);
	assert_int_equal(p->ops[p->n_ops - 2].kind, KVD_OP_OUTPUT_NORM);
	assert_ptr_equal(p->ops[p->n_ops - 2].w[0], &m.w.output_norm);
	assert_int_equal(p->ops[p->n_ops - 1].kind, KVD_OP_LOGITS);
	assert_ptr_equal(p->ops[p->n_ops - 1].w[0], &m.w.output);
	assert_int_equal(p->ops[p->n_ops - 1].layer, -1);
	assert_false(p->kinds & (1u << KVD_OP_QKV_BIAS | 1u << KVD_OP_QK_NORM | 1u << KVD_OP_POST_NORM));
	kvd_program_free(p);
}

/* Gemma 3: embedding scale, per-head norms, sandwich norms, GeGLU, local
 * layers with a window and their own RoPE base between global ones. */
static void test_gemma3(void **state)
{
	struct model m;
	struct kvd_program *p = NULL;
	(void)state;
	llama(&m);
	m.w.hp.embd_scale = 8.0f;
	m.w.hp.attn_scale = 0.0625f;
	m.w.hp.rope_theta = 1e6f;
	m.w.features = KVD_FEAT_EMBD_SCALE | KVD_FEAT_ATTN_SCALE | KVD_FEAT_QK_NORM | KVD_FEAT_POST_NORM |
		       KVD_FEAT_GELU | KVD_FEAT_WINDOW | KVD_FEAT_LAYER_ROPE;
	for (int l = 0; l < NL; l++) {
		struct kvd_layer_weights *L = &m.layers[l];
		int local = l != NL - 1;
		vec(&L->q_norm);
		vec(&L->k_norm);
		vec(&L->post_attn_norm);
		vec(&L->post_ffn_norm);
		L->d.act = KVD_ACT_GELU_TANH;
		L->d.window = local ? 512 : 0;
		L->d.rope_theta = local ? 10000.0f : 1e6f;
		L->d.rope_freq_scale = 1.0f;
	}
	assert_int_equal(kvd_program_build(&m.w, &p), 0);
	assert_int_equal(p->ops[1].kind, KVD_OP_EMBD_SCALE);
	assert_true(p->ops[1].scale == 8.0f);
	assert_true(p->attn_scale == 0.0625f);
	for (int l = 0; l < NL; l++) {
		int local = l != NL - 1;
		check_layer(p, l, gemma_layer, (int)(sizeof(gemma_layer) / sizeof(gemma_layer[0])));
		const struct kvd_op *qk = find(p, l, KVD_OP_QK_NORM);
		assert_ptr_equal(qk->w[0], &m.layers[l].q_norm);
		assert_ptr_equal(qk->w[1], &m.layers[l].k_norm);
		assert_true(find(p, l, KVD_OP_ROPE)->theta == (local ? 10000.0f : 1e6f));
		assert_int_equal(find(p, l, KVD_OP_ATTENTION)->window, local ? 512 : 0);
		assert_true(find(p, l, KVD_OP_ATTENTION)->scale == 0.0625f);
		assert_int_equal(find(p, l, KVD_OP_GLU)->act, KVD_ACT_GELU_TANH);
		/* the post-norms follow their sublayer's product */
		assert_ptr_equal(p->ops[p->layer_first[l] + 7].w[0], &m.layers[l].post_attn_norm);
		assert_ptr_equal(p->ops[p->layer_first[l] + 13].w[0], &m.layers[l].post_ffn_norm);
	}
	kvd_program_free(p);
}

/* Qwen 2: q/k/v biases where the layer has them (here only layer 1), each
 * of the three named or NULL. */
static void test_qwen2_bias(void **state)
{
	struct model m;
	struct kvd_program *p = NULL;
	(void)state;
	llama(&m);
	m.w.features = KVD_FEAT_QKV_BIAS;
	vec(&m.layers[1].bq);
	vec(&m.layers[1].bv);
	assert_int_equal(kvd_program_build(&m.w, &p), 0);
	assert_null(find(p, 0, KVD_OP_QKV_BIAS));
	assert_null(find(p, 2, KVD_OP_QKV_BIAS));
	const struct kvd_op *b = find(p, 1, KVD_OP_QKV_BIAS);
	assert_non_null(b);
	assert_int_equal(b - p->ops, p->layer_first[1] + 2); /* right after qkv */
	assert_ptr_equal(b->w[0], &m.layers[1].bq);
	assert_null(b->w[1]);
	assert_ptr_equal(b->w[2], &m.layers[1].bv);
	kvd_program_free(p);
}

/* Llama 3.x: rope_freqs and linear scaling resolved into every RoPE. */
static void test_llama3_rope(void **state)
{
	struct model m;
	struct kvd_program *p = NULL;
	(void)state;
	llama(&m);
	m.w.features = KVD_FEAT_ROPE_FREQS | KVD_FEAT_ROPE_LINEAR;
	vec(&m.w.rope_freqs);
	for (int l = 0; l < NL; l++)
		m.layers[l].d.rope_freq_scale = 0.125f; /* rope_theta left 0: the model's */
	assert_int_equal(kvd_program_build(&m.w, &p), 0);
	for (int l = 0; l < NL; l++) {
		const struct kvd_op *r = find(p, l, KVD_OP_ROPE);
		assert_true(r->theta == 10000.0f && r->freq_scale == 0.125f);
		assert_ptr_equal(r->freqs, dummy);
		assert_int_equal(r->style, KVD_ROPE_NORM);
	}
	kvd_program_free(p);
}

/* The kind mask: the CPU executor's covers every kind; a backend lacking
 * one is told which; a model without layers is refused. */
static void test_kinds(void **state)
{
	struct model m;
	struct kvd_program *p = NULL;
	(void)state;
	llama(&m);
	m.w.features = KVD_FEAT_QK_NORM;
	vec(&m.layers[0].q_norm);
	assert_int_equal(kvd_program_build(&m.w, &p), 0);
	assert_int_equal(kvd_program_missing(p, KVD_OP_KINDS_ALL), 0);
	assert_int_equal(kvd_program_missing(p, KVD_OP_KINDS_ALL & ~(1u << KVD_OP_QK_NORM)), KVD_OP_QK_NORM);
	assert_int_equal(kvd_program_missing(p, KVD_OP_KINDS_ALL & ~(1u << KVD_OP_POST_NORM)), 0);
	assert_string_equal(kvd_op_kind_name(KVD_OP_QK_NORM), "qk_norm");
	assert_string_equal(kvd_op_kind_name((enum kvd_op_kind)99), "?");
	/* row-local kinds are the ones between products */
	assert_true(kvd_op_row_local(KVD_OP_ROPE) && kvd_op_row_local(KVD_OP_KV_STORE));
	assert_false(kvd_op_row_local(KVD_OP_QKV) || kvd_op_row_local(KVD_OP_ATTENTION) ||
		     kvd_op_row_local(KVD_OP_OUTPUT_NORM));
	kvd_program_free(p);
	m.w.hp.n_layer = 0;
	p = NULL;
	assert_int_equal(kvd_program_build(&m.w, &p), -EINVAL);
	assert_null(p);
	kvd_program_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_llama_base), cmocka_unit_test(test_gemma3), cmocka_unit_test(test_qwen2_bias),
		cmocka_unit_test(test_llama3_rope), cmocka_unit_test(test_kinds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
