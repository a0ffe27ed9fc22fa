/*
 * daemon/model/model.c — one description of a model, built from a GGUF file.
 *
 * Each supported architecture (llama, qwen2, qwen3, gemma3) is a row of
 * facts: RoPE pairing, activation, which optional tensors it may or must
 * have, embedding scale, and how its layers alternate between local
 * (sliding-window) and global attention. From those and the file's metadata
 * every layer gets a kvd_layer_desc, and every tensor is looked up by its
 * GGUF name, checked for shape and type, and handed to the backends as a
 * kvd_tensor pointing into the read-only mapping (nothing is dequantized or
 * copied). A key or tensor that would change the computation in a way the
 * description cannot express (mixture of experts, partial or YaRN RoPE,
 * logit soft-capping, an output bias, ...) refuses the file and is named in
 * the message: a tensor the description does not use is never ignored.
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_DIM    (1 << 20)

/* Layer patterns longer than this are not plausible. */
#define MODEL_MAX_SWA_PATTERN 64

struct kvd_model {
	struct gguf_file *gguf;
	struct kvd_tokenizer *tok;
	struct kvd_model_weights w;
	char name[256];
	size_t weight_bytes;
};

static int fail(char *err, size_t errlen, int r, const char *path, const char *fmt, ...)
{
	if (errlen) {
		va_list ap;
		int n = snprintf(err, errlen, "%s: ", path);
		if (n >= 0 && (size_t)n < errlen) {
			va_start(ap, fmt);
			vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
			va_end(ap);
			gguf_strip_controls(err + n);
		}
	}
	return r;
}

static int map_type(uint32_t t, enum kvd_wtype *ret)
{
	switch (t) {
	case GGML_DT_F32: *ret = KVD_WTYPE_F32; return 0;
	case GGML_DT_F16: *ret = KVD_WTYPE_F16; return 0;
	case GGML_DT_BF16: *ret = KVD_WTYPE_BF16; return 0;
	case GGML_DT_Q4_0: *ret = KVD_WTYPE_Q4_0; return 0;
	case GGML_DT_Q4_1: *ret = KVD_WTYPE_Q4_1; return 0;
	case GGML_DT_Q5_0: *ret = KVD_WTYPE_Q5_0; return 0;
	case GGML_DT_Q5_1: *ret = KVD_WTYPE_Q5_1; return 0;
	case GGML_DT_Q8_0: *ret = KVD_WTYPE_Q8_0; return 0;
	case GGML_DT_Q4_K: *ret = KVD_WTYPE_Q4_K; return 0;
	case GGML_DT_Q5_K: *ret = KVD_WTYPE_Q5_K; return 0;
	case GGML_DT_Q6_K: *ret = KVD_WTYPE_Q6_K; return 0;
	}
	return -ENOTSUP;
}

/* Bind tensor `name` with ne[0] == cols and ne[1] == rows (rows == 1 for a
 * vector). optional: absent is not an error (ret->data stays NULL). */
struct binder {
	const struct gguf_file *f;
	uint8_t *used;        /* per tensor index */
	size_t weight_bytes;
};

static int bind(struct binder *m, const char *name, int64_t cols, int64_t rows, int optional,
		struct kvd_tensor *ret, char *err, size_t errlen)
{
	const char *path = gguf_path(m->f);
	const struct gguf_tensor *t = gguf_find_tensor(m->f, name);
	enum kvd_wtype wt;

	if (!t) {
		if (optional)
			return 0;
		return fail(err, errlen, -EBADMSG, path, "missing tensor '%s'", name);
	}
	if (map_type(t->type, &wt) < 0)
		return fail(err, errlen, -ENOTSUP, path,
			    "tensor '%s' has type %s, which kvd cannot compute (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K)",
			    name, ggml_dtype_name(t->type));
	int64_t trows = 1;
	for (uint32_t d = 1; d < t->n_dims; d++)
		trows *= (int64_t)t->ne[d];
	if ((int64_t)t->ne[0] != cols || trows != rows || (rows > 1 && t->n_dims != 2))
		return fail(err, errlen, -EBADMSG, path, "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]",
			    name, (unsigned long long)t->ne[0], (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1),
			    (long long)cols, (long long)rows);
	if (rows == 1 && wt != KVD_WTYPE_F32)
		return fail(err, errlen, -ENOTSUP, path, "norm tensor '%s' has type %s, expected f32", name,
			    ggml_dtype_name(t->type));
	ret->data = t->data;
	ret->type = wt;
	ret->cols = cols;
	ret->rows = rows;
	ret->row_bytes = kvd_wtype_row_bytes(wt, cols);
	if (ret->row_bytes == 0 || ret->row_bytes * (uint64_t)rows != t->nbytes)
		return fail(err, errlen, -EBADMSG, path, "tensor '%s': row length %lld does not fit type %s", name,
			    (long long)cols, kvd_wtype_name(wt));
	m->weight_bytes += t->nbytes;
	m->used[t - gguf_tensor_at(m->f, 0)] = 1;
	return 0;
}

/* What an architecture is, beyond its metadata. */
struct arch_info {
	const char *name;
	enum kvd_rope_style rope_style;
	enum kvd_act act;
	unsigned bias : 1;      /* bq/bk/bv allowed (bound when present) */
	unsigned qk_norm : 1;   /* attn_q_norm / attn_k_norm required */
	unsigned post_norm : 1; /* post_attention_norm / post_ffw_norm required */
	unsigned embd_sqrt : 1; /* embeddings scaled by sqrt(n_embd) */
	unsigned swa_key : 1;   /* {arch}.attention.sliding_window applies */
	uint32_t swa_pattern;   /* 0: every layer alike; n: layer l is global iff (l + 1) % n == 0 */
	float swa_rope_base;    /* RoPE base of local layers (0: the global one) */
};

static const struct arch_info arch_table[] = {
	/* Llama 1-3.x, Mistral (sliding_window applies to every layer), SmolLM */
	{"llama", KVD_ROPE_NORM, KVD_ACT_SILU, 1, 0, 0, 0, 1, 0, 0},
	/* Qwen 2 / 2.5, DeepSeek-R1-Distill-Qwen: Q/K/V biases, NEOX RoPE */
	{"qwen2", KVD_ROPE_NEOX, KVD_ACT_SILU, 1, 0, 0, 0, 0, 0, 0},
	/* Qwen 3 (dense): per-head Q/K RMSNorm, head size set by key_length */
	{"qwen3", KVD_ROPE_NEOX, KVD_ACT_SILU, 0, 1, 0, 0, 0, 0, 0},
	/* Gemma 3: five local layers (window, base 10000) then one global */
	{"gemma3", KVD_ROPE_NEOX, KVD_ACT_GELU_TANH, 0, 1, 1, 1, 1, 6, 10000.0f},
};

static int get_dim(const struct gguf_file *f, const char *key, int optional, int32_t *ret, char *err,
		   size_t errlen)
{
	uint32_t v;
	int r = gguf_get_u32(f, key, &v);
	if (r == -ENOENT && optional)
		return 0;
	if (r < 0)
		return fail(err, errlen, -EBADMSG, gguf_path(f), "%s metadata key '%s'",
			    r == -ENOENT ? "missing" : "bad type for", key);
	if (v == 0 || v > MODEL_MAX_DIM)
		return fail(err, errlen, -EBADMSG, gguf_path(f), "'%s' = %u is out of range", key, v);
	*ret = (int32_t)v;
	return 0;
}

/* Optional positive float key: 0 and *ret untouched when absent. */
static int get_pos_f32(const struct gguf_file *f, const char *key, float *ret, char *err, size_t errlen)
{
	float v;
	int r = gguf_get_f32(f, key, &v);
	if (r == -ENOENT)
		return 0;
	if (r < 0 || !(v > 0) || v > 1e30f)
		return fail(err, errlen, -EBADMSG, gguf_path(f), "%s metadata key '%s'",
			    r < 0 ? "bad type for" : "out-of-range value of", key);
	*ret = v;
	return 0;
}

/* Keys whose presence means a computation kvd does not describe. A value
 * of 0 (or an empty string) is the same as absence. */
static int refuse_keys(const struct gguf_file *f, const char *a, char *err, size_t errlen)
{
	static const struct {
		const char *suffix, *what;
	} keys[] = {
		{"expert_count", "mixture of experts"},
		{"expert_used_count", "mixture of experts"},
		{"attn_logit_softcapping", "attention logit soft-capping"},
		{"final_logit_softcapping", "final logit soft-capping"},
		{"attention.clamp_kqv", "clamped Q/K/V"},
		{"attention.layer_norm_epsilon", "LayerNorm (not RMSNorm)"},
		{"rope.scaling.attn_factor", "RoPE attention factor"},
		{"logit_scale", "logit scaling"},
		{"residual_scale", "residual scaling"},
		{"embedding_scale", "embedding scaling key"},
		{"attention.scale", "attention scale key"},
	};
	char key[128];
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		snprintf(key, sizeof(key), "%s.%s", a, keys[i].suffix);
		int idx = gguf_find_key(f, key);
		if (idx < 0)
			continue;
		uint64_t u;
		float x;
		if ((gguf_get_u64(f, key, &u) == 0 && u == 0) || (gguf_get_f32(f, key, &x) == 0 && x == 0))
			continue;
		return fail(err, errlen, -ENOTSUP, gguf_path(f), "metadata key '%s': %s is not supported", key,
			    keys[i].what);
	}
	return 0;
}

/* RoPE scaling: none or linear (freq_scale = 1 / factor). */
static int rope_scaling(const struct gguf_file *f, const char *a, float *ret_scale, char *err, size_t errlen)
{
	char key[128];
	const char *s;
	size_t n;
	float factor = 0;

	*ret_scale = 1.0f;
	snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
	int r = gguf_get_str(f, key, &s, &n);
	if (r == -EINVAL)
		return fail(err, errlen, -EBADMSG, gguf_path(f), "bad type for metadata key '%s'", key);
	if (r == 0 && !(n == 4 && !memcmp(s, "none", 4)) && !(n == 6 && !memcmp(s, "linear", 6)))
		return fail(err, errlen, -ENOTSUP, gguf_path(f),
			    "metadata key '%s' = '%.*s': only none and linear RoPE scaling are supported", key,
			    (int)(n > 32 ? 32 : n), s);
	int linear = r == 0 && n == 6;
	snprintf(key, sizeof(key), "%s.rope.scaling.factor", a);
	if ((r = get_pos_f32(f, key, &factor, err, errlen)) < 0)
		return r;
	if (factor == 0) { /* the older key */
		snprintf(key, sizeof(key), "%s.rope.scale_linear", a);
		if ((r = get_pos_f32(f, key, &factor, err, errlen)) < 0)
			return r;
		if (factor > 0)
			linear = 1;
	}
	if (linear && factor == 0)
		return fail(err, errlen, -EBADMSG, gguf_path(f), "linear RoPE scaling without '%s.rope.scaling.factor'", a);
	if (linear)
		*ret_scale = 1.0f / factor;
	return 0;
}

/* The features a description uses, as kernels/backend.h defines them. */
static uint32_t features_of(const struct kvd_model_weights *w)
{
	const struct kvd_hparams *hp = &w->hp;
	uint32_t ft = 0;
	if (hp->embd_scale != 1.0f)
		ft |= KVD_FEAT_EMBD_SCALE;
	if (hp->attn_scale != 1.0f / sqrtf((float)hp->head_dim))
		ft |= KVD_FEAT_ATTN_SCALE;
	if (w->rope_freqs.data)
		ft |= KVD_FEAT_ROPE_FREQS;
	for (int l = 0; l < hp->n_layer; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		if (L->bq.data || L->bk.data || L->bv.data)
			ft |= KVD_FEAT_QKV_BIAS;
		if (L->q_norm.data || L->k_norm.data)
			ft |= KVD_FEAT_QK_NORM;
		if (L->post_attn_norm.data || L->post_ffn_norm.data)
			ft |= KVD_FEAT_POST_NORM;
		if (L->d.act != KVD_ACT_SILU)
			ft |= KVD_FEAT_GELU;
		if (L->d.window > 0)
			ft |= KVD_FEAT_WINDOW;
		if (L->d.rope_theta != hp->rope_theta)
			ft |= KVD_FEAT_LAYER_ROPE;
		if (L->d.rope_freq_scale != 1.0f)
			ft |= KVD_FEAT_ROPE_LINEAR;
	}
	return ft;
}

void kvd_model_weights_release(struct kvd_model_weights *w)
{
	if (!w)
		return;
	free(w->layers);
	memset(w, 0, sizeof(*w));
}

int kvd_model_weights_from_gguf(const struct gguf_file *f, struct kvd_model_weights *ret, size_t *ret_bytes,
				char *err, size_t errlen)
{
	const char *path = gguf_path(f);
	const struct arch_info *ai = NULL;
	struct kvd_model_weights w = {0};
	struct kvd_hparams *hp = &w.hp;
	struct binder b = { .f = f };
	char key[128];
	const char *s;
	size_t slen;
	int r;

	if (gguf_get_str(f, "general.architecture", &s, &slen) < 0)
		return fail(err, errlen, -EBADMSG, path, "missing general.architecture");
	for (size_t i = 0; i < sizeof(arch_table) / sizeof(arch_table[0]); i++)
		if (slen == strlen(arch_table[i].name) && !memcmp(s, arch_table[i].name, slen))
			ai = &arch_table[i];
	if (!ai)
		return fail(err, errlen, -ENOTSUP, path,
			    "architecture '%.*s' is not supported (kvd runs llama, qwen2, qwen3, gemma3)",
			    (int)(slen > 64 ? 64 : slen), s);
	const char *a = ai->name;
#define KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", a, suffix), key)
	if ((r = get_dim(f, KEY("embedding_length"), 0, &hp->n_embd, err, errlen)) < 0 ||
	    (r = get_dim(f, KEY("block_count"), 0, &hp->n_layer, err, errlen)) < 0 ||
	    (r = get_dim(f, KEY("attention.head_count"), 0, &hp->n_head, err, errlen)) < 0 ||
	    (r = get_dim(f, KEY("feed_forward_length"), 0, &hp->n_ff, err, errlen)) < 0)
		return r;
	if ((r = refuse_keys(f, a, err, errlen)) < 0)
		return r;
	hp->n_head_kv = hp->n_head;
	hp->head_dim = hp->n_embd / hp->n_head;
	hp->n_ctx_train = 2048;
	int32_t v_dim = 0;
	if ((r = get_dim(f, KEY("attention.head_count_kv"), 1, &hp->n_head_kv, err, errlen)) < 0 ||
	    (r = get_dim(f, KEY("attention.key_length"), 1, &hp->head_dim, err, errlen)) < 0 ||
	    (r = get_dim(f, KEY("attention.value_length"), 1, &v_dim, err, errlen)) < 0 ||
	    (r = get_dim(f, KEY("context_length"), 1, &hp->n_ctx_train, err, errlen)) < 0)
		return r;
	if (v_dim && v_dim != hp->head_dim)
		return fail(err, errlen, -ENOTSUP, path, "metadata key '%s' = %d differs from the key length %d", KEY("attention.value_length"),
			    v_dim, hp->head_dim);
	if (hp->n_layer > MODEL_MAX_LAYERS || hp->n_head % hp->n_head_kv || hp->head_dim % 2 ||
	    (int64_t)hp->n_head * hp->head_dim > MODEL_MAX_DIM)
		return fail(err, errlen, -EBADMSG, path, "inconsistent attention shape: %d heads, %d KV heads, head size %d",
			    hp->n_head, hp->n_head_kv, hp->head_dim);
	int32_t rope_dim = hp->head_dim;
	if ((r = get_dim(f, KEY("rope.dimension_count"), 1, &rope_dim, err, errlen)) < 0)
		return r;
	if (rope_dim != hp->head_dim)
		return fail(err, errlen, -ENOTSUP, path, "metadata key '%s' = %d: partial rotary embedding (%d of %d) is not supported",
			    KEY("rope.dimension_count"), rope_dim, rope_dim, hp->head_dim);
	hp->rms_eps = 1e-5f;
	hp->rope_theta = 10000.0f;
	if ((r = get_pos_f32(f, KEY("attention.layer_norm_rms_epsilon"), &hp->rms_eps, err, errlen)) < 0 ||
	    (r = get_pos_f32(f, KEY("rope.freq_base"), &hp->rope_theta, err, errlen)) < 0)
		return r;
	hp->rope_style = ai->rope_style;
	hp->embd_scale = ai->embd_sqrt ? sqrtf((float)hp->n_embd) : 1.0f;
	float qpas = 0;
	if ((r = get_pos_f32(f, KEY("attention.query_pre_attn_scalar"), &qpas, err, errlen)) < 0)
		return r;
	hp->attn_scale = 1.0f / sqrtf(qpas > 0 ? qpas : (float)hp->head_dim);

	/* per-layer attention: window and RoPE */
	int32_t window = 0;
	uint32_t pattern = ai->swa_pattern;
	float swa_base = ai->swa_rope_base, rope_scale;
	if ((r = get_dim(f, KEY("attention.sliding_window"), 1, &window, err, errlen)) < 0)
		return r;
	if (window && !ai->swa_key)
		return fail(err, errlen, -ENOTSUP, path, "metadata key '%s' is not supported for %s", key, a);
	if (pattern && !window)
		return fail(err, errlen, -EBADMSG, path, "missing metadata key '%s'", KEY("attention.sliding_window"));
	int32_t pat = 0;
	if ((r = get_dim(f, KEY("attention.sliding_window_pattern"), 1, &pat, err, errlen)) < 0)
		return r;
	if (pat) {
		if (!ai->swa_pattern || pat > MODEL_MAX_SWA_PATTERN)
			return fail(err, errlen, -ENOTSUP, path, "metadata key '%s' = %d is not supported for %s", key, pat, a);
		pattern = (uint32_t)pat;
	}
	if ((r = get_pos_f32(f, KEY("rope.freq_base_swa"), &swa_base, err, errlen)) < 0)
		return r;
	if ((r = rope_scaling(f, a, &rope_scale, err, errlen)) < 0)
		return r;

	const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
	if (!emb || emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > MODEL_MAX_DIM * 4)
		return fail(err, errlen, -EBADMSG, path, "missing or malformed tensor 'token_embd.weight'");
	hp->n_vocab = (int32_t)emb->ne[1];
	if (gguf_n_tensors(f) > 0 && !(b.used = calloc((size_t)gguf_n_tensors(f), 1)))
		return fail(err, errlen, -ENOMEM, path, "out of memory");

	int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	if ((r = bind(&b, "token_embd.weight", hp->n_embd, hp->n_vocab, 0, &w.tok_embd, err, errlen)) < 0 ||
	    (r = bind(&b, "output_norm.weight", hp->n_embd, 1, 0, &w.output_norm, err, errlen)) < 0 ||
	    (r = bind(&b, "output.weight", hp->n_embd, hp->n_vocab, 1, &w.output, err, errlen)) < 0 ||
	    (r = bind(&b, "rope_freqs.weight", hp->head_dim / 2, 1, 1, &w.rope_freqs, err, errlen)) < 0)
		goto out;
	if (!w.output.data)
		w.output = w.tok_embd; /* tied embeddings */
	w.layers = calloc((size_t)hp->n_layer, sizeof(*w.layers));
	if (!w.layers) {
		r = fail(err, errlen, -ENOMEM, path, "out of memory");
		goto out;
	}
	for (int l = 0; l < hp->n_layer; l++) {
		struct kvd_layer_weights *L = &w.layers[l];
		int local = pattern && (uint32_t)(l + 1) % pattern != 0;
		if (!ai->swa_pattern && window)
			local = 1; /* Mistral: every layer */
		L->d.act = ai->act;
		L->d.window = local ? window : 0;
		L->d.rope_theta = local && swa_base > 0 ? swa_base : hp->rope_theta;
		L->d.rope_freq_scale = local && ai->swa_pattern ? 1.0f : rope_scale;
		struct {
			const char *suffix;
			int64_t cols, rows;
			int optional;
			struct kvd_tensor *dst;
		} spec[] = {
			{"attn_norm.weight", hp->n_embd, 1, 0, &L->attn_norm},
			{"attn_q.weight", hp->n_embd, qd, 0, &L->wq},
			{"attn_k.weight", hp->n_embd, kvd, 0, &L->wk},
			{"attn_v.weight", hp->n_embd, kvd, 0, &L->wv},
			{"attn_output.weight", qd, hp->n_embd, 0, &L->wo},
			{"ffn_norm.weight", hp->n_embd, 1, 0, &L->ffn_norm},
			{"ffn_gate.weight", hp->n_embd, hp->n_ff, 0, &L->w_gate},
			{"ffn_up.weight", hp->n_embd, hp->n_ff, 0, &L->w_up},
			{"ffn_down.weight", hp->n_ff, hp->n_embd, 0, &L->w_down},
			{"attn_q.bias", qd, 1, 1, ai->bias ? &L->bq : NULL},
			{"attn_k.bias", kvd, 1, 1, ai->bias ? &L->bk : NULL},
			{"attn_v.bias", kvd, 1, 1, ai->bias ? &L->bv : NULL},
			{"attn_q_norm.weight", hp->head_dim, 1, 0, ai->qk_norm ? &L->q_norm : NULL},
			{"attn_k_norm.weight", hp->head_dim, 1, 0, ai->qk_norm ? &L->k_norm : NULL},
			{"post_attention_norm.weight", hp->n_embd, 1, 0, ai->post_norm ? &L->post_attn_norm : NULL},
			{"post_ffw_norm.weight", hp->n_embd, 1, 0, ai->post_norm ? &L->post_ffn_norm : NULL},
		};
		for (size_t i = 0; i < sizeof(spec) / sizeof(spec[0]); i++) {
			char name[64];
			if (!spec[i].dst)
				continue; /* not part of this architecture: refused below if present */
			snprintf(name, sizeof(name), "blk.%d.%s", l, spec[i].suffix);
			r = bind(&b, name, spec[i].cols, spec[i].rows, spec[i].optional, spec[i].dst, err, errlen);
			if (r < 0)
				goto out;
		}
		if (ai->bias && (!L->bq.data != !L->bk.data || !L->bq.data != !L->bv.data)) {
			r = fail(err, errlen, -ENOTSUP, path, "layer %d has some of the Q/K/V biases but not all", l);
			goto out;
		}
	}
	for (int i = 0; i < gguf_n_tensors(f); i++)
		if (!b.used[i]) {
			r = fail(err, errlen, -ENOTSUP, path, "tensor '%s' is not part of kvd's description of %s",
				 gguf_tensor_at(f, i)->name, a);
			goto out;
		}
#undef KEY
	w.features = features_of(&w);
	*ret = w;
	if (ret_bytes)
		*ret_bytes = b.weight_bytes;
	free(b.used);
	return 0;
out:
	free(b.used);
	kvd_model_weights_release(&w);
	return r;
}

int kvd_model_load(const char *path, struct kvd_model **ret, char *err, size_t errlen)
{
	struct kvd_model *m;
	const char *s;
	size_t slen;
	int r;

	m = calloc(1, sizeof(*m));
	if (!m)
		return fail(err, errlen, -ENOMEM, path, "out of memory");
	r = gguf_open(path, &m->gguf, err, errlen);
	if (r < 0)
		goto out;
	r = kvd_model_weights_from_gguf(m->gguf, &m->w, &m->weight_bytes, err, errlen);
	if (r < 0)
		goto out;
	if (gguf_get_str(m->gguf, "general.name", &s, &slen) == 0 && slen > 0) {
		snprintf(m->name, sizeof(m->name), "%.*s", (int)(slen > 200 ? 200 : slen), s);
		/* it goes into every WELCOME, which refuses control characters */
		gguf_strip_controls(m->name);
		if (!m->name[0]) /* the name began with a NUL */
			snprintf(m->name, sizeof(m->name), "unnamed");
	} else {
		const char *b = strrchr(path, '/');
		snprintf(m->name, sizeof(m->name), "%s", b ? b + 1 : path);
	}
	r = kvd_tokenizer_from_gguf(m->gguf, &m->tok, err, errlen);
	if (r < 0)
		goto out;
	if (kvd_tokenizer_n_vocab(m->tok) > m->w.hp.n_vocab) {
		r = fail(err, errlen, -EBADMSG, path, "tokenizer has %d tokens but the embedding only %d rows",
			 kvd_tokenizer_n_vocab(m->tok), m->w.hp.n_vocab);
		goto out;
	}
	*ret = m;
	return 0;
out:
	kvd_model_free(m);
	return r;
}

struct kvd_model *kvd_model_free(struct kvd_model *m)
{
	if (!m)
		return NULL;
	kvd_tokenizer_free(m->tok);
	kvd_model_weights_release(&m->w);
	gguf_close(m->gguf);
	free(m);
	return NULL;
}

const struct kvd_model_weights *kvd_model_weights(const struct kvd_model *m) { return &m->w; }
const struct kvd_hparams *kvd_model_hparams(const struct kvd_model *m) { return &m->w.hp; }
const struct kvd_tokenizer *kvd_model_tokenizer(const struct kvd_model *m) { return m->tok; }
const struct gguf_file *kvd_model_gguf(const struct kvd_model *m) { return m->gguf; }
const char *kvd_model_name(const struct kvd_model *m) { return m->name; }
const char *kvd_model_path(const struct kvd_model *m) { return gguf_path(m->gguf); }
size_t kvd_model_weight_bytes(const struct kvd_model *m) { return m->weight_bytes; }
