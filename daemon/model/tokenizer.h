/*
 * daemon/model/tokenizer.h — the model's own tokenizer, built from GGUF
 * metadata (tokenizer.ggml.*), and its chat template.
 *
 * Supported: byte-level BPE (tokenizer.ggml.model = "gpt2") with the
 * pre-tokenizer the file names (tokenizer.ggml.pre: "smollm", "llama-bpe",
 * "gpt2", "default", ...), and SentencePiece-style BPE ("llama"). Special
 * and control tokens are matched verbatim in text when parse_special is set.
 *
 * A kvd_tokenizer is immutable after creation and may be used from any
 * number of threads at once. A kvd_detok (streaming decoder) belongs to one
 * sequence and one thread.
 */
#ifndef KVD_TOKENIZER_H
#define KVD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct kvd_tokenizer;

/* Token attribute bits (from tokenizer.ggml.token_type). */
#define KVD_TOKEN_NORMAL  1
#define KVD_TOKEN_UNKNOWN 2
#define KVD_TOKEN_CONTROL 3
#define KVD_TOKEN_USER    4
#define KVD_TOKEN_UNUSED  5
#define KVD_TOKEN_BYTE    6

/* Longest text accepted by kvd_tokenize(), bytes. */
#define KVD_TOKENIZE_MAX_BYTES (64u << 20)

/*
 * Build the tokenizer from the file's metadata. Returns 0, -ENOTSUP for an
 * unknown tokenizer model or pre-tokenizer, -EBADMSG for inconsistent
 * metadata (missing tokens array, merge naming an unknown token, ids out of
 * range), -ENOMEM. On failure writes "<path>: <problem>" into err.
 * The tokenizer copies what it needs; the file may be closed afterwards.
 */
int kvd_tokenizer_from_gguf(const struct gguf_file *f, struct kvd_tokenizer **ret, char *err, size_t errlen);

/* Free; accepts NULL; returns NULL. */
struct kvd_tokenizer *kvd_tokenizer_free(struct kvd_tokenizer *t);

int32_t kvd_tokenizer_n_vocab(const struct kvd_tokenizer *t);
int32_t kvd_tokenizer_bos(const struct kvd_tokenizer *t); /* -1 if none */
int32_t kvd_tokenizer_eos(const struct kvd_tokenizer *t); /* -1 if none */
/* True for end-of-generation tokens (EOS, EOT, <|im_end|>, <|endoftext|> ...). */
int kvd_tokenizer_is_eog(const struct kvd_tokenizer *t, int32_t id);
/* True when the file asks for BOS to be prepended (tokenizer.ggml.add_bos_token). */
int kvd_tokenizer_add_bos(const struct kvd_tokenizer *t);
/* Token type (KVD_TOKEN_*), or 0 for an id out of range. */
int kvd_tokenizer_token_type(const struct kvd_tokenizer *t, int32_t id);

/*
 * Tokenize text[0..len). With add_bos the BOS token is prepended (if the
 * model has one). With parse_special, special/control token texts such as
 * "<|im_start|>" are matched as single tokens; without it they are plain text.
 * Writes at most max_out ids and returns the total number of tokens the text
 * needs (which may exceed max_out: call again with a larger buffer), or
 * -E2BIG when len > KVD_TOKENIZE_MAX_BYTES, -ENOMEM.
 * Invalid UTF-8 is tokenized byte-wise, never rejected.
 */
int kvd_tokenize(const struct kvd_tokenizer *t, const char *text, size_t len, int add_bos,
		 int parse_special, int32_t *out, size_t max_out);

/*
 * The bytes a token stands for (byte-level BPE decoded to raw bytes; control
 * tokens give their text only when render_special is set, else nothing).
 * Returns the number of bytes (written up to buflen), or -EINVAL for an id
 * out of range.
 */
int kvd_token_to_bytes(const struct kvd_tokenizer *t, int32_t id, int render_special, char *buf, size_t buflen);

/*
 * Streaming decoder: feeds tokens one at a time and emits only complete
 * UTF-8 characters, holding back a partial character until the token that
 * finishes it arrives. Invalid sequences are emitted as U+FFFD.
 */
struct kvd_detok {
	unsigned char pending[8];
	uint32_t n_pending;
};
void kvd_detok_init(struct kvd_detok *d);
/* Append the text of `id` to out (capacity cap >= 64 always suffices for
 * one token plus held bytes: callers pass at least KVD_DETOK_MIN_CAP).
 * Returns bytes written or -EINVAL / -ENOBUFS. */
#define KVD_DETOK_MIN_CAP 512
int kvd_detok_push(const struct kvd_tokenizer *t, struct kvd_detok *d, int32_t id, char *out, size_t cap);
/* Emit whatever is held at end of stream (as U+FFFD if incomplete). */
int kvd_detok_flush(struct kvd_detok *d, char *out, size_t cap);

/* ---- chat template ----------------------------------------------------- */

struct kvd_chat_msg {
	const char *role;    /* "system", "user", "assistant" */
	const char *content;
};

/*
 * Render messages with the model's chat template (tokenizer.chat_template).
 * Recognised families: ChatML (<|im_start|>role\n...<|im_end|>\n), Llama-3
 * (<|start_header_id|>), Llama-2 ([INST]), Zephyr (<|user|>). A model
 * without a template gets ChatML. With add_assistant the prompt ends where
 * the assistant's reply begins. Returns the length of the rendered text
 * (written NUL-terminated when it fits in cap, like snprintf) or -ENOTSUP
 * for a template it cannot render, -EINVAL for a bad role.
 * For ChatML the default system message of the model's template (if any)
 * is used when messages carry no system turn.
 */
int kvd_chat_render(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n_msgs,
		    int add_assistant, char *out, size_t cap);

#endif /* KVD_TOKENIZER_H */
