/*
 * daemon/model/model.h — a Llama-family model as kvd serves it: the GGUF
 * mapping, its hyper-parameters, its weight matrices bound in place (never
 * copied or dequantized), and its tokenizer.
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
 * Load `path`. Checks the architecture (llama), every hyper-parameter, the
 * presence, shape and type of every tensor the forward pass needs, and
 * builds the tokenizer. Returns 0, or -errno with one line in err naming
 * the file and the problem: -ENOENT/-EACCES (cannot open), -EBADMSG
 * (malformed file or metadata), -ENOTSUP (architecture, weight type or
 * tokenizer kvd cannot run), -ENOMEM, and the other errors of gguf_open()
 * (-EOVERFLOW past a GGUF limit, -EPROTONOSUPPORT for another GGUF
 * version, -EISDIR/-EINVAL for what is not a regular file).
 */
int kvd_model_load(const char *path, struct kvd_model **ret, char *err, size_t errlen);
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
