/*
 * tests/unit/test_model.c — the model description (daemon/model/model.h,
 * kernels/backend.h) built from hand-written GGUF metadata.
 *
 * Each test writes a tiny GGUF file (f32 tensors of zeros, no tokenizer)
 * into a private temporary directory, opens it with gguf_open and builds the
 * description with kvd_model_weights_from_gguf: per-layer windows, RoPE
 * bases and scales, activations, optional tensors and feature bits for
 * llama (plain, Llama 3.x rope_freqs, linear scaling, Mistral window),
 * qwen2, qwen3 and gemma3; then the refusals, each of which must return
 * -ENOTSUP (or -EBADMSG) with a message naming the key or tensor; and
 * the packing of released pages for windowed models, with the CPU backend's
 * checks of page tables that hold them.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "gguf.h"
#include "model.h"
#include "program.h"

/* ---- a tiny GGUF writer: metadata and f32 tensors ---- */

#include "gguf_writer.h"

#define MAX_T 256

struct spec {
	const char *arch;
	struct wbuf kv;
	uint64_t n_kv;
	char *tname[MAX_T];
	uint64_t ne0[MAX_T], ne1[MAX_T];
	int n_t;
};

static void kv_u32(struct spec *s, const char *key, uint32_t v)
{
	w_str(&s->kv, key);
	w_u32(&s->kv, GGUF_VT_UINT32);
	w_u32(&s->kv, v);
	s->n_kv++;
}

static void kv_f32(struct spec *s, const char *key, float v)
{
	w_str(&s->kv, key);
	w_u32(&s->kv, GGUF_VT_FLOAT32);
	w_bytes(&s->kv, &v, 4);
	s->n_kv++;
}

static void kv_str(struct spec *s, const char *key, const char *v)
{
	w_str(&s->kv, key);
	w_u32(&s->kv, GGUF_VT_STRING);
	w_str(&s->kv, v);
	s->n_kv++;
}

/* "%s.<suffix>" with the architecture. */
static const char *akey(const struct spec *s, const char *suffix)
{
	static char k[128];
	snprintf(k, sizeof(k), "%s.%s", s->arch, suffix);
	return k;
}

static void tensor(struct spec *s, uint64_t ne0, uint64_t ne1, const char *fmt, ...)
{
	char name[96];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	assert_true(s->n_t < MAX_T);
	s->tname[s->n_t] = strdup(name);
	s->ne0[s->n_t] = ne0;
	s->ne1[s->n_t] = ne1;
	s->n_t++;
}

/* Drops the tensor called name (it must exist). */
static void drop_tensor(struct spec *s, const char *name)
{
	for (int i = 0; i < s->n_t; i++)
		if (!strcmp(s->tname[i], name)) {
			free(s->tname[i]);
			memmove(&s->tname[i], &s->tname[i + 1], (size_t)(s->n_t - i - 1) * sizeof(s->tname[0]));
			memmove(&s->ne0[i], &s->ne0[i + 1], (size_t)(s->n_t - i - 1) * sizeof(s->ne0[0]));
			memmove(&s->ne1[i], &s->ne1[i + 1], (size_t)(s->n_t - i - 1) * sizeof(s->ne1[0]));
			s->n_t--;
			return;
		}
	fail_msg("no tensor %s", name);
}

/* Shape of the test models: 2 query heads of 32 over n_embd 64 (unless
 * head_dim says otherwise), one KV head, FFN 96, 16 tokens. */
#define E 64
#define H 2
#define HKV 1
#define FF 96
#define V 16

/* The Llama-base metadata and tensors of `arch` with n_layer layers and
 * head size hd. */
static void base(struct spec *s, const char *arch, int n_layer, int hd)
{
	memset(s, 0, sizeof(*s));
	s->arch = arch;
	kv_str(s, "general.architecture", arch);
	kv_u32(s, akey(s, "embedding_length"), E);
	kv_u32(s, akey(s, "block_count"), (uint32_t)n_layer);
	kv_u32(s, akey(s, "attention.head_count"), H);
	kv_u32(s, akey(s, "attention.head_count_kv"), HKV);
	kv_u32(s, akey(s, "feed_forward_length"), FF);
	kv_u32(s, akey(s, "context_length"), 256);
	kv_f32(s, akey(s, "attention.layer_norm_rms_epsilon"), 1e-6f);
	if (hd != E / H)
		kv_u32(s, akey(s, "attention.key_length"), (uint32_t)hd);
	tensor(s, E, V, "token_embd.weight");
	tensor(s, E, 1, "output_norm.weight");
	for (int l = 0; l < n_layer; l++) {
		tensor(s, E, 1, "blk.%d.attn_norm.weight", l);
		tensor(s, E, H * hd, "blk.%d.attn_q.weight", l);
		tensor(s, E, HKV * hd, "blk.%d.attn_k.weight", l);
		tensor(s, E, HKV * hd, "blk.%d.attn_v.weight", l);
		tensor(s, H * hd, E, "blk.%d.attn_output.weight", l);
		tensor(s, E, 1, "blk.%d.ffn_norm.weight", l);
		tensor(s, E, FF, "blk.%d.ffn_gate.weight", l);
		tensor(s, E, FF, "blk.%d.ffn_up.weight", l);
		tensor(s, FF, E, "blk.%d.ffn_down.weight", l);
	}
}

struct fixture {
	char dir[64];
	char path[128];
	struct gguf_file *f;
	struct kvd_model_weights w;
	char err[512];
};

/* Writes s to the fixture's file (freeing s) and opens it. */
static void write_spec(struct fixture *fx, struct spec *s)
{
	struct wbuf out = {0}, ti = {0};
	uint64_t off = 0;
	for (int i = 0; i < s->n_t; i++) {
		w_str(&ti, s->tname[i]);
		w_u32(&ti, s->ne1[i] > 1 ? 2 : 1);
		w_u64(&ti, s->ne0[i]);
		if (s->ne1[i] > 1)
			w_u64(&ti, s->ne1[i]);
		w_u32(&ti, GGML_DT_F32);
		w_u64(&ti, off);
		off += (s->ne0[i] * s->ne1[i] * 4 + 31) / 32 * 32;
	}
	w_bytes(&out, "GGUF", 4);
	w_u32(&out, 3);
	w_u64(&out, (uint64_t)s->n_t);
	w_u64(&out, s->n_kv);
	w_bytes(&out, s->kv.p, s->kv.n);
	w_bytes(&out, ti.p, ti.n);
	while (out.n % 32)
		w_bytes(&out, "", 1);
	uint8_t zero[256] = {0};
	for (uint64_t left = off; left > 0;) {
		size_t k = left > sizeof(zero) ? sizeof(zero) : (size_t)left;
		w_bytes(&out, zero, k);
		left -= k;
	}
	FILE *fp = fopen(fx->path, "wb");
	assert_non_null(fp);
	assert_int_equal(fwrite(out.p, 1, out.n, fp), out.n);
	assert_int_equal(fclose(fp), 0);
	free(out.p);
	free(ti.p);
	free(s->kv.p);
	for (int i = 0; i < s->n_t; i++)
		free(s->tname[i]);
	fx->f = gguf_close(fx->f);
	assert_int_equal(gguf_open(fx->path, &fx->f, fx->err, sizeof(fx->err)), 0);
}

/* Builds the description; returns its result. */
static int describe(struct fixture *fx, struct spec *s)
{
	write_spec(fx, s);
	kvd_model_weights_release(&fx->w);
	fx->err[0] = 0;
	return kvd_model_weights_from_gguf(fx->f, &fx->w, NULL, fx->err, sizeof(fx->err));
}

/* The description must be refused with r, and the message name `what`. */
static void expect_refused(struct fixture *fx, struct spec *s, int r, const char *what)
{
	assert_int_equal(describe(fx, s), r);
	if (!strstr(fx->err, what) || strncmp(fx->err, fx->path, strlen(fx->path)))
		fail_msg("message '%s' should start with the path and name '%s'", fx->err, what);
	assert_null(fx->w.layers);
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	snprintf(fx->dir, sizeof(fx->dir), "/tmp/kvd-test-model.XXXXXX");
	if (!fx || !mkdtemp(fx->dir))
		return -1;
	snprintf(fx->path, sizeof(fx->path), "%s/m.gguf", fx->dir);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	kvd_model_weights_release(&fx->w);
	gguf_close(fx->f);
	unlink(fx->path);
	rmdir(fx->dir);
	free(fx);
	return 0;
}

static void assert_close(float a, float b)
{
	if (fabsf(a - b) > 1e-6f * fmaxf(1.0f, fabsf(b)))
		fail_msg("%g != %g", (double)a, (double)b);
}

/* ---- what loads ---- */

static void test_llama_base(void **state)
{
	struct fixture *fx = *state;
	struct spec s;
	base(&s, "llama", 2, 32);
	kv_f32(&s, "llama.rope.freq_base", 50000.0f);
	assert_int_equal(describe(fx, &s), 0);
	const struct kvd_model_weights *w = &fx->w;
	assert_int_equal(w->features, 0);
	assert_int_equal(w->hp.rope_style, KVD_ROPE_NORM);
	assert_int_equal(w->hp.head_dim, 32);
	assert_close(w->hp.embd_scale, 1.0f);
	assert_close(w->hp.attn_scale, 1.0f / sqrtf(32.0f));
	assert_close(w->hp.rms_eps, 1e-6f);
	assert_true(w->output.data == w->tok_embd.data); /* tied */
	assert_null(w->rope_freqs.data);
	for (int l = 0; l < 2; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		assert_int_equal(L->d.act, KVD_ACT_SILU);
		assert_int_equal(L->d.window, 0);
		assert_close(L->d.rope_theta, 50000.0f);
		assert_close(L->d.rope_freq_scale, 1.0f);
		assert_null(L->bq.data);
		assert_null(L->q_norm.data);
		assert_null(L->post_attn_norm.data);
	}
	assert_int_equal(kvd_model_weights_check(w, 64), 0);
}

static void test_llama3_rope_mistral_window(void **state)
{
	struct fixture *fx = *state;
	struct spec s;
	base(&s, "llama", 2, 32);
	tensor(&s, 16, 1, "rope_freqs.weight");
	kv_str(&s, "llama.rope.scaling.type", "linear");
	kv_f32(&s, "llama.rope.scaling.factor", 4.0f);
	kv_u32(&s, "llama.attention.sliding_window", 8);
	assert_int_equal(describe(fx, &s), 0);
	const struct kvd_model_weights *w = &fx->w;
	assert_non_null(w->rope_freqs.data);
	assert_int_equal(w->rope_freqs.cols, 16);
	assert_int_equal(w->features, KVD_FEAT_ROPE_FREQS | KVD_FEAT_ROPE_LINEAR | KVD_FEAT_WINDOW);
	for (int l = 0; l < 2; l++) {
		assert_int_equal(w->layers[l].d.window, 8);
		assert_close(w->layers[l].d.rope_freq_scale, 0.25f);
		assert_close(w->layers[l].d.rope_theta, 10000.0f);
	}
	/* a Llama-base backend refuses it, one implementing the features does not */
	assert_int_equal(kvd_model_weights_check(w, 64), -ENOTSUP);
	assert_int_equal(kvd_model_weights_check_features(w, 64, w->features), 0);
	assert_string_equal(kvd_feature_name(w->features & ~KVD_FEAT_ROPE_FREQS), "sliding-window attention");
}

static void test_qwen2_biases(void **state)
{
	struct fixture *fx = *state;
	struct spec s;
	base(&s, "qwen2", 2, 32);
	for (int l = 0; l < 2; l++) {
		tensor(&s, H * 32, 1, "blk.%d.attn_q.bias", l);
		tensor(&s, HKV * 32, 1, "blk.%d.attn_k.bias", l);
		tensor(&s, HKV * 32, 1, "blk.%d.attn_v.bias", l);
	}
	tensor(&s, E, V, "output.weight");
	kv_f32(&s, "qwen2.rope.freq_base", 1e6f);
	assert_int_equal(describe(fx, &s), 0);
	const struct kvd_model_weights *w = &fx->w;
	assert_int_equal(w->hp.rope_style, KVD_ROPE_NEOX);
	assert_int_equal(w->features, KVD_FEAT_QKV_BIAS);
	assert_true(w->output.data != w->tok_embd.data);
	for (int l = 0; l < 2; l++) {
		assert_non_null(w->layers[l].bq.data);
		assert_int_equal(w->layers[l].bq.cols, H * 32);
		assert_int_equal(w->layers[l].bk.cols, HKV * 32);
		assert_non_null(w->layers[l].bv.data);
		assert_close(w->layers[l].d.rope_theta, 1e6f);
	}
	assert_int_equal(kvd_model_weights_check_features(w, 64, KVD_FEAT_QKV_BIAS), 0);
	/* in the forward program: the biases right after the projections, the
	 * NEOX RoPE at the file's base */
	struct kvd_program *p = NULL;
	assert_int_equal(kvd_program_build(w, &p), 0);
	for (int l = 0; l < 2; l++) {
		const struct kvd_op *op = &p->ops[p->layer_first[l]];
		assert_int_equal(op[1].kind, KVD_OP_QKV);
		assert_int_equal(op[2].kind, KVD_OP_QKV_BIAS);
		assert_ptr_equal(op[2].w[0], &w->layers[l].bq);
		assert_ptr_equal(op[2].w[2], &w->layers[l].bv);
		assert_int_equal(op[3].kind, KVD_OP_ROPE);
		assert_int_equal(op[3].style, KVD_ROPE_NEOX);
		assert_close(op[3].theta, 1e6f);
	}
	kvd_program_free(p);

	/* some biases without the others */
	base(&s, "qwen2", 1, 32);
	tensor(&s, H * 32, 1, "blk.0.attn_q.bias");
	expect_refused(fx, &s, -ENOTSUP, "layer 0");
}

static void test_qwen3_qk_norm_head_size(void **state)
{
	struct fixture *fx = *state;
	struct spec s;
	base(&s, "qwen3", 2, 48); /* head size 48 != 64 / 2 */
	for (int l = 0; l < 2; l++) {
		tensor(&s, 48, 1, "blk.%d.attn_q_norm.weight", l);
		tensor(&s, 48, 1, "blk.%d.attn_k_norm.weight", l);
	}
	assert_int_equal(describe(fx, &s), 0);
	const struct kvd_model_weights *w = &fx->w;
	assert_int_equal(w->hp.head_dim, 48);
	assert_int_equal(w->hp.rope_style, KVD_ROPE_NEOX);
	assert_int_equal(w->features, KVD_FEAT_QK_NORM);
	assert_int_equal(w->layers[1].wq.rows, H * 48);
	assert_int_equal(w->layers[1].wo.cols, H * 48);
	assert_int_equal(w->layers[1].k_norm.cols, 48);
	assert_close(w->hp.attn_scale, 1.0f / sqrtf(48.0f));
	assert_int_equal(kvd_model_weights_check_features(w, 64, KVD_FEAT_QK_NORM), 0);

	/* the norms are required */
	base(&s, "qwen3", 2, 48);
	tensor(&s, 48, 1, "blk.0.attn_q_norm.weight");
	tensor(&s, 48, 1, "blk.0.attn_k_norm.weight");
	tensor(&s, 48, 1, "blk.1.attn_q_norm.weight");
	expect_refused(fx, &s, -EBADMSG, "blk.1.attn_k_norm.weight");
}

static void gemma3_spec(struct spec *s, int n_layer)
{
	base(s, "gemma3", n_layer, 48);
	kv_f32(s, "gemma3.rope.freq_base", 1e6f);
	kv_u32(s, "gemma3.attention.sliding_window", 5);
	for (int l = 0; l < n_layer; l++) {
		tensor(s, 48, 1, "blk.%d.attn_q_norm.weight", l);
		tensor(s, 48, 1, "blk.%d.attn_k_norm.weight", l);
		tensor(s, E, 1, "blk.%d.post_attention_norm.weight", l);
		tensor(s, E, 1, "blk.%d.post_ffw_norm.weight", l);
	}
}

static void test_gemma3(void **state)
{
	struct fixture *fx = *state;
	struct spec s;
	gemma3_spec(&s, 7);
	kv_f32(&s, "gemma3.attention.query_pre_attn_scalar", 64.0f);
	assert_int_equal(describe(fx, &s), 0);
	const struct kvd_model_weights *w = &fx->w;
	assert_int_equal(w->hp.rope_style, KVD_ROPE_NEOX);
	assert_close(w->hp.embd_scale, 8.0f); /* sqrt(64) */
	assert_close(w->hp.attn_scale, 0.125f); /* 1/sqrt(64), not 1/sqrt(48) */
	assert_int_equal(w->features, KVD_FEAT_QK_NORM | KVD_FEAT_POST_NORM | KVD_FEAT_GELU | KVD_FEAT_WINDOW |
					      KVD_FEAT_LAYER_ROPE | KVD_FEAT_EMBD_SCALE | KVD_FEAT_ATTN_SCALE);
	for (int l = 0; l < 7; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		int global = l == 5; /* five local layers, then one global */
		assert_int_equal(L->d.act, KVD_ACT_GELU_TANH);
		assert_int_equal(L->d.window, global ? 0 : 5);
		assert_close(L->d.rope_theta, global ? 1e6f : 10000.0f);
		assert_non_null(L->post_attn_norm.data);
		assert_non_null(L->post_ffn_norm.data);
		assert_int_equal(L->q_norm.cols, 48);
	}
	assert_int_equal(kvd_model_weights_check(w, 64), -ENOTSUP);
	assert_int_equal(kvd_model_weights_check_features(w, 64, KVD_FEAT_ALL), 0);

	/* the forward program every backend runs (kernels/program.h) has each
	 * departure where the description puts it: the embedding scale, per
	 * layer the Q/K norms before RoPE, the sandwich norms after each
	 * product, GeGLU, the local layers' window and base */
	struct kvd_program *p = NULL;
	assert_int_equal(kvd_program_build(w, &p), 0);
	assert_int_equal(p->ops[1].kind, KVD_OP_EMBD_SCALE);
	assert_close(p->ops[1].scale, 8.0f);
	for (int l = 0; l < 7; l++) {
		static const enum kvd_op_kind want[] = {
			KVD_OP_NORM, KVD_OP_QKV, KVD_OP_QK_NORM, KVD_OP_ROPE, KVD_OP_KV_STORE, KVD_OP_ATTENTION,
			KVD_OP_ATTN_OUT, KVD_OP_POST_NORM, KVD_OP_RESIDUAL, KVD_OP_NORM, KVD_OP_GATE_UP, KVD_OP_GLU,
			KVD_OP_DOWN, KVD_OP_POST_NORM, KVD_OP_RESIDUAL,
		};
		const struct kvd_op *op = &p->ops[p->layer_first[l]];
		int global = l == 5;
		assert_int_equal(p->layer_first[l + 1] - p->layer_first[l], (int)(sizeof(want) / sizeof(want[0])));
		for (unsigned i = 0; i < sizeof(want) / sizeof(want[0]); i++)
			assert_int_equal(op[i].kind, want[i]);
		assert_close(op[3].theta, global ? 1e6f : 10000.0f);
		assert_int_equal(op[5].window, global ? 0 : 5);
		assert_close(op[5].scale, 0.125f);
		assert_int_equal(op[11].act, KVD_ACT_GELU_TANH);
		assert_ptr_equal(op[7].w[0], &w->layers[l].post_attn_norm);
	}
	kvd_program_free(p);

	/* the attention scale defaults to 1/sqrt(head size); the local RoPE
	 * base and the pattern may be given by keys; linear scaling applies to
	 * global layers only */
	gemma3_spec(&s, 4);
	kv_f32(&s, "gemma3.rope.freq_base_swa", 20000.0f);
	kv_u32(&s, "gemma3.attention.sliding_window_pattern", 2);
	kv_str(&s, "gemma3.rope.scaling.type", "linear");
	kv_f32(&s, "gemma3.rope.scaling.factor", 8.0f);
	assert_int_equal(describe(fx, &s), 0);
	assert_close(fx->w.hp.attn_scale, 1.0f / sqrtf(48.0f));
	for (int l = 0; l < 4; l++) {
		int global = l % 2 == 1;
		assert_int_equal(fx->w.layers[l].d.window, global ? 0 : 5);
		assert_close(fx->w.layers[l].d.rope_theta, global ? 1e6f : 20000.0f);
		assert_close(fx->w.layers[l].d.rope_freq_scale, global ? 0.125f : 1.0f);
	}

	/* post norms are required; the window too */
	gemma3_spec(&s, 2);
	drop_tensor(&s, "blk.1.post_ffw_norm.weight");
	expect_refused(fx, &s, -EBADMSG, "blk.1.post_ffw_norm.weight");
	base(&s, "gemma3", 1, 48);
	tensor(&s, 48, 1, "blk.0.attn_q_norm.weight");
	expect_refused(fx, &s, -EBADMSG, "gemma3.attention.sliding_window");
}

/* ---- what is refused, and the message names it ---- */

static void test_refusals(void **state)
{
	struct fixture *fx = *state;
	struct spec s;

	base(&s, "phi3", 1, 32);
	expect_refused(fx, &s, -ENOTSUP, "'phi3'");

	base(&s, "qwen2", 1, 32);
	kv_u32(&s, "qwen2.expert_count", 8);
	expect_refused(fx, &s, -ENOTSUP, "qwen2.expert_count");

	base(&s, "llama", 1, 32);
	kv_u32(&s, "llama.rope.dimension_count", 16);
	expect_refused(fx, &s, -ENOTSUP, "llama.rope.dimension_count");

	base(&s, "llama", 1, 32);
	kv_str(&s, "llama.rope.scaling.type", "yarn");
	expect_refused(fx, &s, -ENOTSUP, "llama.rope.scaling.type");

	base(&s, "gemma3", 1, 48);
	kv_f32(&s, "gemma3.final_logit_softcapping", 30.0f);
	expect_refused(fx, &s, -ENOTSUP, "gemma3.final_logit_softcapping");

	base(&s, "llama", 1, 32);
	kv_u32(&s, "llama.attention.value_length", 64);
	expect_refused(fx, &s, -ENOTSUP, "llama.attention.value_length");

	/* a tensor the description does not use is never ignored */
	base(&s, "llama", 2, 32);
	tensor(&s, E, 1, "blk.1.attn_output.bias");
	expect_refused(fx, &s, -ENOTSUP, "blk.1.attn_output.bias");

	base(&s, "qwen2", 1, 32);
	tensor(&s, E, 4, "blk.0.ffn_gate_inp.weight");
	expect_refused(fx, &s, -ENOTSUP, "blk.0.ffn_gate_inp.weight");

	base(&s, "qwen2", 1, 32); /* Q/K norms are not part of qwen2 */
	tensor(&s, 32, 1, "blk.0.attn_q_norm.weight");
	expect_refused(fx, &s, -ENOTSUP, "blk.0.attn_q_norm.weight");

	base(&s, "qwen3", 1, 32); /* nor biases of qwen3 */
	tensor(&s, 32, 1, "blk.0.attn_q_norm.weight");
	tensor(&s, 32, 1, "blk.0.attn_k_norm.weight");
	tensor(&s, H * 32, 1, "blk.0.attn_q.bias");
	expect_refused(fx, &s, -ENOTSUP, "blk.0.attn_q.bias");

	base(&s, "qwen3", 1, 32); /* a sliding window is llama's and gemma3's only */
	tensor(&s, 32, 1, "blk.0.attn_q_norm.weight");
	tensor(&s, 32, 1, "blk.0.attn_k_norm.weight");
	kv_u32(&s, "qwen3.attention.sliding_window", 4);
	expect_refused(fx, &s, -ENOTSUP, "qwen3.attention.sliding_window");

	base(&s, "llama", 1, 32); /* rope_freqs of the wrong length */
	tensor(&s, 32, 1, "rope_freqs.weight");
	expect_refused(fx, &s, -EBADMSG, "rope_freqs.weight");
}

/* ---- released pages (KVD_CAP_PACKED_KV): the packing and the CPU
 * backend's checks of page tables that hold them ---- */

static int forward_with(void *ctx, const int32_t *pages, int32_t n_pages, int32_t pos0)
{
	int32_t tok = 3;
	struct kvd_batch_seq sq = {.tokens = &tok, .n_tokens = 1, .pos0 = pos0, .pages = pages, .n_pages = n_pages};
	struct kvd_batch b = {1, &sq};
	return kvd_cpu_backend.forward(ctx, &b);
}

static void test_released_pages(void **state)
{
	struct fixture *fx = *state;
	struct spec s;
	uint32_t n_global = 0, max_window = 0;

	/* the encoding of a released page's entry */
	int32_t e = kvd_page_packed(KVD_PACKED_MAX_PAGES - 1, 255);
	assert_true(kvd_page_is_packed(e));
	assert_int_equal(kvd_packed_page(e), KVD_PACKED_MAX_PAGES - 1);
	assert_int_equal(kvd_packed_slot(e), 255);
	assert_int_equal(kvd_packed_page(kvd_page_packed(0, 0)), 0);
	assert_false(kvd_page_is_packed(KVD_PAGE_RELEASED));
	assert_false(kvd_page_is_packed(-1));
	assert_false(kvd_page_is_packed(0));

	/* Gemma 3, seven layers: six local (window 5), layer 5 global */
	gemma3_spec(&s, 7);
	assert_int_equal(describe(fx, &s), 0);
	assert_int_equal(kvd_kv_pack_slots(&fx->w, &n_global, &max_window), 7);
	assert_int_equal(n_global, 1);
	assert_int_equal(max_window, 5);
	assert_true(kvd_cpu_backend.caps & KVD_CAP_PACKED_KV);

	void *ctx = NULL;
	struct kvd_backend_config bc = {.n_threads = 1};
	struct kvd_kv_layout L;
	assert_int_equal(kvd_cpu_backend.init(&bc, &ctx), 0);
	assert_int_equal(kvd_cpu_backend.load(ctx, &fx->w), 0);
	kvd_kv_layout_init(&L, &fx->w.hp, 4);
	void *pool = calloc(16, L.page_bytes);
	assert_non_null(pool);
	struct kvd_paged_view view = {pool, 16, L};
	assert_int_equal(kvd_cpu_backend.attach_kv(ctx, &view), 0);

	/* one token at position 20 (pages of 4: pages 0..5); its windowed
	 * layers see positions 16..20, so pages 0..3 may be released */
	int32_t ok[6] = {kvd_page_packed(8, 0), kvd_page_packed(8, 1), kvd_page_packed(8, 2), kvd_page_packed(8, 3), 4, 5};
	assert_int_equal(forward_with(ctx, ok, 6, 20), 0);
	int32_t t[6];
	memcpy(t, ok, sizeof(t));
	t[4] = kvd_page_packed(8, 4); /* positions 16..19: a windowed layer still reads them */
	assert_int_equal(forward_with(ctx, t, 6, 20), -EINVAL);
	memcpy(t, ok, sizeof(t));
	t[0] = KVD_PAGE_RELEASED; /* the global layer still reads page 0 */
	assert_int_equal(forward_with(ctx, t, 6, 20), -EINVAL);
	t[0] = kvd_page_packed(8, 7); /* seven slots */
	assert_int_equal(forward_with(ctx, t, 6, 20), -EINVAL);
	t[0] = kvd_page_packed(16, 0); /* past the pool */
	assert_int_equal(forward_with(ctx, t, 6, 20), -EINVAL);
	t[0] = -1;
	assert_int_equal(forward_with(ctx, t, 6, 20), -EINVAL);
	kvd_cpu_backend.destroy(ctx);

	/* without a window nothing is ever released */
	base(&s, "llama", 2, 32);
	assert_int_equal(describe(fx, &s), 0);
	assert_int_equal(kvd_kv_pack_slots(&fx->w, &n_global, &max_window), 0);
	assert_int_equal(max_window, 0);
	ctx = NULL;
	assert_int_equal(kvd_cpu_backend.init(&bc, &ctx), 0);
	assert_int_equal(kvd_cpu_backend.load(ctx, &fx->w), 0);
	kvd_kv_layout_init(&L, &fx->w.hp, 4);
	view = (struct kvd_paged_view){pool, (uint32_t)(16 * view.layout.page_bytes / L.page_bytes), L};
	assert_int_equal(kvd_cpu_backend.attach_kv(ctx, &view), 0);
	int32_t plain[6] = {0, 1, 2, 3, 4, 5};
	assert_int_equal(forward_with(ctx, plain, 6, 20), 0);
	plain[0] = kvd_page_packed(6, 0);
	assert_int_equal(forward_with(ctx, plain, 6, 20), -EINVAL);
	kvd_cpu_backend.destroy(ctx);
	free(pool);
}

static void test_feature_names(void **state)
{
	(void)state;
	assert_string_equal(kvd_feature_name(0), "none");
	assert_string_equal(kvd_feature_name(KVD_FEAT_QKV_BIAS | KVD_FEAT_GELU), "q/k/v biases");
	assert_string_equal(kvd_feature_name(KVD_FEAT_ATTN_SCALE), "attention scale other than 1/sqrt(head size)");
	for (unsigned i = 0; (1u << i) & KVD_FEAT_ALL; i++)
		assert_string_not_equal(kvd_feature_name(1u << i), "unknown feature");
	assert_string_equal(kvd_feature_name(KVD_FEAT_ALL + 1), "unknown feature");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_llama_base, setup, teardown),
		cmocka_unit_test_setup_teardown(test_llama3_rope_mistral_window, setup, teardown),
		cmocka_unit_test_setup_teardown(test_qwen2_biases, setup, teardown),
		cmocka_unit_test_setup_teardown(test_qwen3_qk_norm_head_size, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gemma3, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
		cmocka_unit_test_setup_teardown(test_released_pages, setup, teardown),
		cmocka_unit_test(test_feature_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
