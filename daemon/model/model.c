/*
 * daemon/model/model.c — binding a GGUF file's tensors to the forward pass.
 *
 * Every tensor the Llama forward needs is looked up by its GGUF name,
 * checked for shape and type against the hyper-parameters, and handed to the
 * backend as a kvd_tensor that points into the read-only mapping. Nothing is
 * dequantized or copied here.
 */
#include "model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_DIM    (1 << 20)

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
static int bind(struct kvd_model *m, const char *name, int64_t cols, int64_t rows, int optional,
		struct kvd_tensor *ret, char *err, size_t errlen)
{
	const char *path = gguf_path(m->gguf);
	const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
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
	return 0;
}

static int get_dim(struct kvd_model *m, const char *key, int optional, int32_t *ret, char *err, size_t errlen)
{
	uint32_t v;
	int r = gguf_get_u32(m->gguf, key, &v);
	if (r == -ENOENT && optional)
		return 0;
	if (r < 0)
		return fail(err, errlen, -EBADMSG, gguf_path(m->gguf), "%s metadata key '%s'",
			    r == -ENOENT ? "missing" : "bad type for", key);
	if (v == 0 || v > MODEL_MAX_DIM)
		return fail(err, errlen, -EBADMSG, gguf_path(m->gguf), "'%s' = %u is out of range", key, v);
	*ret = (int32_t)v;
	return 0;
}

int kvd_model_load(const char *path, struct kvd_model **ret, char *err, size_t errlen)
{
	struct kvd_model *m;
	struct kvd_hparams *hp;
	const char *s;
	size_t slen;
	int r;

	m = calloc(1, sizeof(*m));
	if (!m)
		return fail(err, errlen, -ENOMEM, path, "out of memory");
	r = gguf_open(path, &m->gguf, err, errlen);
	if (r < 0)
		goto out;

	r = gguf_get_str(m->gguf, "general.architecture", &s, &slen);
	if (r < 0) {
		r = fail(err, errlen, -EBADMSG, path, "missing general.architecture");
		goto out;
	}
	if (slen != 5 || memcmp(s, "llama", 5) != 0) {
		r = fail(err, errlen, -ENOTSUP, path, "architecture '%.*s' is not supported (kvd runs llama)",
			 (int)(slen > 64 ? 64 : slen), s);
		goto out;
	}
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

	hp = &m->w.hp;
	if ((r = get_dim(m, "llama.embedding_length", 0, &hp->n_embd, err, errlen)) < 0 ||
	    (r = get_dim(m, "llama.block_count", 0, &hp->n_layer, err, errlen)) < 0 ||
	    (r = get_dim(m, "llama.attention.head_count", 0, &hp->n_head, err, errlen)) < 0 ||
	    (r = get_dim(m, "llama.feed_forward_length", 0, &hp->n_ff, err, errlen)) < 0)
		goto out;
	hp->n_head_kv = hp->n_head;
	hp->head_dim = hp->n_embd / hp->n_head;
	hp->n_ctx_train = 2048;
	if ((r = get_dim(m, "llama.attention.head_count_kv", 1, &hp->n_head_kv, err, errlen)) < 0 ||
	    (r = get_dim(m, "llama.attention.key_length", 1, &hp->head_dim, err, errlen)) < 0 ||
	    (r = get_dim(m, "llama.context_length", 1, &hp->n_ctx_train, err, errlen)) < 0)
		goto out;
	if (hp->n_layer > MODEL_MAX_LAYERS || hp->n_head % hp->n_head_kv || hp->head_dim % 2 ||
	    (int64_t)hp->n_head * hp->head_dim > MODEL_MAX_DIM) {
		r = fail(err, errlen, -EBADMSG, path, "inconsistent attention shape: %d heads, %d KV heads, head size %d",
			 hp->n_head, hp->n_head_kv, hp->head_dim);
		goto out;
	}
	int32_t rope_dim = hp->head_dim;
	if ((r = get_dim(m, "llama.rope.dimension_count", 1, &rope_dim, err, errlen)) < 0)
		goto out;
	if (rope_dim != hp->head_dim) {
		r = fail(err, errlen, -ENOTSUP, path, "partial rotary embedding (%d of %d) is not supported", rope_dim,
			 hp->head_dim);
		goto out;
	}
	hp->rms_eps = 1e-5f;
	hp->rope_theta = 10000.0f;
	if (gguf_get_f32(m->gguf, "llama.attention.layer_norm_rms_epsilon", &hp->rms_eps) == -EINVAL ||
	    gguf_get_f32(m->gguf, "llama.rope.freq_base", &hp->rope_theta) == -EINVAL || !(hp->rms_eps > 0) ||
	    !(hp->rope_theta > 0)) {
		r = fail(err, errlen, -EBADMSG, path, "bad rms epsilon or rope frequency base");
		goto out;
	}
	hp->rope_style = KVD_ROPE_NORM;

	const struct gguf_tensor *emb = gguf_find_tensor(m->gguf, "token_embd.weight");
	if (!emb || emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > MODEL_MAX_DIM * 4) {
		r = fail(err, errlen, -EBADMSG, path, "missing or malformed tensor 'token_embd.weight'");
		goto out;
	}
	hp->n_vocab = (int32_t)emb->ne[1];

	int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	struct kvd_model_weights *w = &m->w;
	if ((r = bind(m, "token_embd.weight", hp->n_embd, hp->n_vocab, 0, &w->tok_embd, err, errlen)) < 0 ||
	    (r = bind(m, "output_norm.weight", hp->n_embd, 1, 0, &w->output_norm, err, errlen)) < 0 ||
	    (r = bind(m, "output.weight", hp->n_embd, hp->n_vocab, 1, &w->output, err, errlen)) < 0)
		goto out;
	if (!w->output.data)
		w->output = w->tok_embd; /* tied embeddings */
	w->layers = calloc((size_t)hp->n_layer, sizeof(*w->layers));
	if (!w->layers) {
		r = fail(err, errlen, -ENOMEM, path, "out of memory");
		goto out;
	}
	for (int l = 0; l < hp->n_layer; l++) {
		struct kvd_layer_weights *L = &w->layers[l];
		struct {
			const char *suffix;
			int64_t cols, rows;
			struct kvd_tensor *dst;
		} spec[] = {
			{"attn_norm", hp->n_embd, 1, &L->attn_norm},
			{"attn_q", hp->n_embd, qd, &L->wq},
			{"attn_k", hp->n_embd, kvd, &L->wk},
			{"attn_v", hp->n_embd, kvd, &L->wv},
			{"attn_output", qd, hp->n_embd, &L->wo},
			{"ffn_norm", hp->n_embd, 1, &L->ffn_norm},
			{"ffn_gate", hp->n_embd, hp->n_ff, &L->w_gate},
			{"ffn_up", hp->n_embd, hp->n_ff, &L->w_up},
			{"ffn_down", hp->n_ff, hp->n_embd, &L->w_down},
		};
		for (size_t i = 0; i < sizeof(spec) / sizeof(spec[0]); i++) {
			char name[64];
			snprintf(name, sizeof(name), "blk.%d.%s.weight", l, spec[i].suffix);
			r = bind(m, name, spec[i].cols, spec[i].rows, 0, spec[i].dst, err, errlen);
			if (r < 0)
				goto out;
		}
	}

	r = kvd_tokenizer_from_gguf(m->gguf, &m->tok, err, errlen);
	if (r < 0)
		goto out;
	if (kvd_tokenizer_n_vocab(m->tok) > hp->n_vocab) {
		r = fail(err, errlen, -EBADMSG, path, "tokenizer has %d tokens but the embedding only %d rows",
			 kvd_tokenizer_n_vocab(m->tok), hp->n_vocab);
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
	free(m->w.layers);
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
