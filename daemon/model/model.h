/*
 * daemon/model/model.h — a model as kvd serves it: the GGUF mapping, its
 * description (hyper-parameters and one kvd_layer_desc per layer, see
 * kernels/backend.h), its weight matrices bound in place (never copied or
 * dequantized), and its tokenizer. Architectures: llama (with Llama 3.x
 * rope_freqs, linear RoPE scaling, Mistral's sliding window), qwen2, qwen3,
 * gemma3.
 *
 * A kvd_model is immutable after kvd_model_load() and may be shared by any
 * number of threads.
 */
#ifndef KVD_MODEL_H
#define KVD_MODEL_H

#include <stddef.h>

#include "backend.h"

struct kvd_model;
struct kvd_tokenizer;
struct gguf_file;

/*
 * Load `path`. Checks the architecture, every hyper-parameter, the
 * presence, shape and type of every tensor the forward pass needs, and
 * builds the tokenizer. Returns 0, or -errno with one line in err naming
 * the file and the problem: -ENOENT/-EACCES (cannot open), -EBADMSG
 * (malformed file or metadata), -ENOTSUP (architecture, weight type or
 * tokenizer kvd cannot run), -ENOMEM, and the other errors of gguf_open()
 * (-EOVERFLOW past a GGUF limit, -EPROTONOSUPPORT for another GGUF
 * version, -EISDIR/-EINVAL for what is not a regular file).
 */
int kvd_model_load(const char *path, struct kvd_model **ret, char *err, size_t errlen);
/*
 * The description alone: build *ret from an open GGUF file (hyper-parameters,
 * per-layer descriptions, features, tensors bound into f's mapping, which must
 * outlive *ret). *ret_bytes (may be NULL) gets the bytes of tensor data bound.
 * Errors as kvd_model_load; -ENOTSUP names the key or tensor refused. *ret is
 * set only on success; free it with kvd_model_weights_release().
 */
int kvd_model_weights_from_gguf(const struct gguf_file *f, struct kvd_model_weights *ret, size_t *ret_bytes,
				char *err, size_t errlen);
/* Frees the layer array of a description built above and zeroes it; accepts NULL. */
void kvd_model_weights_release(struct kvd_model_weights *w);

/* Accepts NULL; returns NULL. */
struct kvd_model *kvd_model_free(struct kvd_model *m);

const struct kvd_model_weights *kvd_model_weights(const struct kvd_model *m);
const struct kvd_hparams *kvd_model_hparams(const struct kvd_model *m);
const struct kvd_tokenizer *kvd_model_tokenizer(const struct kvd_model *m);
const struct gguf_file *kvd_model_gguf(const struct kvd_model *m);
/* general.name, or the file's base name. */
const char *kvd_model_name(const struct kvd_model *m);
const char *kvd_model_path(const struct kvd_model *m);
/* Bytes of weights (all tensors' data) in the mapping. */
size_t kvd_model_weight_bytes(const struct kvd_model *m);

#endif
