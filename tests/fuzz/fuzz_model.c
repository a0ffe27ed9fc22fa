/*
 * tests/fuzz/fuzz_model.c — libFuzzer target for model loading
 * (daemon/model/model.c): the GGUF reader and then every check kvd makes
 * before it serves a file — architecture, hyper-parameters, the shape and
 * type of every tensor, the tokenizer built from the metadata.
 *
 * Input: the file (seed: tests/fuzz/corpus/fuzz_model/seed-model.gguf, the
 * smallest complete model, from tests/fuzz/make_seed_model.py).
 *
 * Promises checked: a rejected file gives -EBADMSG, -ENOTSUP, -EOVERFLOW,
 * -EPROTONOSUPPORT or -ENOMEM and one line of message naming the file
 * (text quoted from the file cannot break it in two); an accepted one has
 * a name without control characters (it is sent in every WELCOME),
 * consistent hyper-parameters (heads divide, head_dim even, the tokenizer's vocabulary
 * no larger than the embedding), and every tensor the forward pass reads —
 * rows × row_bytes from its data pointer — lies inside the file's mapping
 * (its first and last bytes are read). Tokenizing a fixed text gives ids
 * inside the vocabulary, and each id decodes.
 */
#include <errno.h>

#include "gguf.h"
#include "model.h"
#include "tokenizer.h"
#include "backend.h"
#include "fuzz_util.h"

static const uint8_t *map_lo, *map_hi;

static void tensor_ok(const struct kvd_tensor *t, int64_t cols, int64_t rows)
{
	CHECK(t->data != NULL && t->cols == cols && t->rows == rows && t->row_bytes > 0);
	const uint8_t *p = t->data;
	uint64_t bytes = (uint64_t)t->rows * t->row_bytes;
	CHECK(p >= map_lo && p <= map_hi && bytes <= (uint64_t)(map_hi - p));
	volatile uint8_t x = p[0];
	x = p[bytes - 1];
	(void)x;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64], err[512];
	int fd = fuzz_memfd(data, size, path, sizeof(path));
	if (fd < 0)
		return 0;
	struct kvd_model *m = NULL;
	err[0] = 0;
	int r = kvd_model_load(path, &m, err, sizeof(err));
	if (r < 0) {
		CHECK(m == NULL);
		CHECK(r == -EBADMSG || r == -ENOTSUP || r == -ENOMEM || r == -EOVERFLOW || r == -EPROTONOSUPPORT);
		CHECK(strstr(err, path) != NULL && strchr(err, '\n') == NULL);
		close(fd);
		return 0;
	}
	CHECK(r == 0 && m != NULL);
	/* The name goes into every WELCOME, whose decoder refuses control
	 * characters: a name with one would lock every client out. */
	const char *name = kvd_model_name(m);
	CHECK(name != NULL && name[0] != 0);
	for (const char *q = name; *q; q++)
		CHECK((unsigned char)*q >= 0x20 && *q != 0x7f);
	const struct gguf_file *f = kvd_model_gguf(m);
	map_lo = gguf_map_base(f);
	map_hi = map_lo + gguf_map_size(f);
	const struct kvd_hparams *hp = kvd_model_hparams(m);
	CHECK(hp->n_layer >= 1 && hp->n_head >= 1 && hp->n_head_kv >= 1 && hp->n_head % hp->n_head_kv == 0);
	CHECK(hp->head_dim >= 2 && hp->head_dim % 2 == 0 && hp->n_embd >= 1 && hp->n_ff >= 1 && hp->n_vocab >= 1);
	const struct kvd_model_weights *w = kvd_model_weights(m);
	int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	tensor_ok(&w->tok_embd, hp->n_embd, hp->n_vocab);
	tensor_ok(&w->output_norm, hp->n_embd, 1);
	tensor_ok(&w->output, hp->n_embd, hp->n_vocab);
	for (int l = 0; l < hp->n_layer; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		tensor_ok(&L->attn_norm, hp->n_embd, 1);
		tensor_ok(&L->wq, hp->n_embd, qd);
		tensor_ok(&L->wk, hp->n_embd, kvd);
		tensor_ok(&L->wv, hp->n_embd, kvd);
		tensor_ok(&L->wo, qd, hp->n_embd);
		tensor_ok(&L->ffn_norm, hp->n_embd, 1);
		tensor_ok(&L->w_gate, hp->n_embd, hp->n_ff);
		tensor_ok(&L->w_up, hp->n_embd, hp->n_ff);
		tensor_ok(&L->w_down, hp->n_ff, hp->n_embd);
	}
	CHECK(kvd_model_weight_bytes(m) <= gguf_map_size(f));

	const struct kvd_tokenizer *t = kvd_model_tokenizer(m);
	int32_t nv = kvd_tokenizer_n_vocab(t);
	CHECK(nv >= 1 && nv <= hp->n_vocab);
	static const char text[] = "<|im_start|>user\nHello, wörld! 123 \xff\xfe<|im_end|>";
	int32_t ids[256];
	int n = kvd_tokenize(t, text, sizeof(text) - 1, 1, 1, ids, 256);
	CHECK(n >= 0 || n == -ENOMEM);
	char buf[KVD_TOKENIZER_MAX_TOKEN_BYTES * 4 + 16];
	for (int i = 0; i < n && i < 256; i++) {
		CHECK(ids[i] >= 0 && ids[i] < nv);
		int k = kvd_token_to_bytes(t, ids[i], 1, buf, sizeof(buf));
		CHECK(k >= 0 && (size_t)k < sizeof(buf));
	}
	CHECK(kvd_model_free(m) == NULL);
	close(fd);
	return 0;
}
