/*
 * daemon/model/tokenizer.h — the model's own tokenizer, built from GGUF
 * metadata (tokenizer.ggml.*), and its chat template.
 *
 * Supported: byte-level BPE (tokenizer.ggml.model = "gpt2") with the
 * pre-tokenizer the file names (tokenizer.ggml.pre: "smollm", "llama-bpe",
 * "gpt2", "default", "qwen2", "falcon", ... — the regexes llama.cpp uses
 * for these names, done by hand), and SentencePiece-style BPE ("llama":
 * token scores, U+2581 for spaces, <0xXX> byte fallback). Token ids match
 * llama.cpp's for valid UTF-8; invalid UTF-8 is kept byte for byte.
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

/* Limits on what a file's tokenizer metadata may claim. */
#define KVD_TOKENIZER_MAX_VOCAB       (1 << 22)   /* tokens */
#define KVD_TOKENIZER_MAX_TOKEN_BYTES 4096u       /* one token's text */
#define KVD_TOKENIZER_MAX_MERGES      (1u << 22)  /* BPE merges */
#define KVD_CHAT_TEMPLATE_MAX_BYTES   (1u << 20)  /* longer templates are not recognised */

/*
 * Build the tokenizer from the file's metadata. Returns 0, -ENOTSUP for an
 * unknown tokenizer model or pre-tokenizer, -EBADMSG for inconsistent
 * metadata (missing tokens array, merge naming an unknown token or one
 * whose result is not a token, ids out of range, token_type or scores of
 * the wrong length, more tokens, merges or token bytes than the limits
 * above), -ENOMEM. On failure writes "<path>: <problem>" into err.
 * *ret is set only on success.
 * The tokenizer copies what it needs; the file may be closed afterwards.
 * A missing tokenizer.ggml.pre means "default"; a missing or unrecognised
 * chat template is not an error (see kvd_chat_render).
 */
int kvd_tokenizer_from_gguf(const struct gguf_file *f, struct kvd_tokenizer **ret, char *err, size_t errlen);

/* Free; accepts NULL; returns NULL. */
struct kvd_tokenizer *kvd_tokenizer_free(struct kvd_tokenizer *t);

int32_t kvd_tokenizer_n_vocab(const struct kvd_tokenizer *t);
int32_t kvd_tokenizer_bos(const struct kvd_tokenizer *t); /* -1 if none */
int32_t kvd_tokenizer_eos(const struct kvd_tokenizer *t); /* -1 if none */
/* End-of-turn token: tokenizer.ggml.eot_token_id, else the first of
 * <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|> ... that the
 * vocabulary has; -1 if none. */
int32_t kvd_tokenizer_eot(const struct kvd_tokenizer *t);
/* True for end-of-generation tokens: EOS, EOT, EOM and every token spelled
 * <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>,
 * <|end_of_text|>, <EOT>, <end_of_utterance>. False for ids out of range. */
int kvd_tokenizer_is_eog(const struct kvd_tokenizer *t, int32_t id);
/* True when the file asks for BOS to be prepended (tokenizer.ggml.add_bos_token). */
int kvd_tokenizer_add_bos(const struct kvd_tokenizer *t);
/* Token type (KVD_TOKEN_*), or 0 for an id out of range. */
int kvd_tokenizer_token_type(const struct kvd_tokenizer *t, int32_t id);
/* The token's text as the vocabulary spells it (byte-level or U+2581
 * form, not NUL-terminated), owned by t; NULL for an id out of range. */
const char *kvd_tokenizer_token_text(const struct kvd_tokenizer *t, int32_t id, size_t *ret_len);
/* The most bytes kvd_token_to_bytes() gives for any token. */
size_t kvd_tokenizer_max_token_bytes(const struct kvd_tokenizer *t);

/*
 * Tokenize text[0..len). With add_bos the BOS token is prepended (if the
 * model has one). With parse_special, the texts of CONTROL (and UNKNOWN)
 * tokens such as "<|im_start|>" are matched as single tokens; without it
 * they are plain text. USER tokens are always matched, as llama.cpp does.
 * Matching is leftmost-longest; the raw text between matches is
 * pre-tokenized and merged separately. (SPM: a space is prepended to raw
 * text at the start and after each special token when the file's
 * add_space_prefix, default true, says so.)
 * Writes at most max_out ids and returns the total number of tokens the text
 * needs (which may exceed max_out: call again with a larger buffer), or
 * -E2BIG when len > KVD_TOKENIZE_MAX_BYTES, -EINVAL for NULL text with
 * len > 0 or NULL out with max_out > 0, -ENOMEM. Memory: O(len) scratch,
 * freed before returning.
 * Invalid UTF-8 is tokenized byte-wise, never rejected: each invalid byte is
 * classified like U+FFFD by the pre-tokenizer but keeps its own byte token,
 * so decoding gives the input back. The exception is a byte the vocabulary
 * has no token for at all (SmolLM2 lacks 21, among them 0x04, 0xC0, 0xF1
 * and 0xF5..0xFF): it becomes the unknown token when that token is of type
 * UNKNOWN, else it is dropped (SmolLM2's "unknown" is <|endoftext|>), as
 * llama.cpp does.
 */
int kvd_tokenize(const struct kvd_tokenizer *t, const char *text, size_t len, int add_bos,
		 int parse_special, int32_t *out, size_t max_out);
/*
 * kvd_tokenize that stops once the text is known to need more than max_out
 * tokens (at the next pre-tokenizer word for BPE, the next fragment between
 * special tokens for SPM), so a text far over a limit costs about the limit:
 * returns the exact count (<= max_out, the ids in out) when the text fits,
 * else some number > max_out (a lower bound; out holds the first max_out
 * ids). Errors as kvd_tokenize's.
 */
int kvd_tokenize_upto(const struct kvd_tokenizer *t, const char *text, size_t len, int add_bos,
		      int parse_special, int32_t *out, size_t max_out);

/*
 * The bytes a token stands for (byte-level BPE decoded to raw bytes, SPM
 * U+2581 as a space and <0xXX> as its byte; CONTROL and UNKNOWN tokens give
 * their text only when render_special is set, else nothing; USER tokens
 * their text). Returns the number of bytes (written up to buflen, not
 * NUL-terminated), or -EINVAL for an id out of range.
 */
int kvd_token_to_bytes(const struct kvd_tokenizer *t, int32_t id, int render_special, char *buf, size_t buflen);

/*
 * Streaming decoder: feeds tokens one at a time and emits only complete
 * UTF-8 characters, holding back a partial character (at most 3 bytes)
 * until the token that finishes it arrives. Invalid sequences (RFC 3629:
 * overlongs, surrogates and values past U+10FFFF included) are emitted as
 * one U+FFFD per maximal invalid subpart. CONTROL tokens emit nothing.
 */
struct kvd_detok {
	unsigned char pending[8];
	uint32_t n_pending;
};
void kvd_detok_init(struct kvd_detok *d);
/* Write the text `id` completes to out (not NUL-terminated). Output is at
 * most 3 * (kvd_tokenizer_max_token_bytes(t) + 3) bytes; KVD_DETOK_MIN_CAP
 * covers every vocabulary whose tokens are at most 167 bytes (SmolLM2's
 * longest is 162). Returns bytes written, -EINVAL for an id out of range,
 * or -ENOBUFS when cap is too small, leaving d unchanged. */
#define KVD_DETOK_MIN_CAP 512
int kvd_detok_push(const struct kvd_tokenizer *t, struct kvd_detok *d, int32_t id, char *out, size_t cap);
/* Emit whatever is held at end of stream (one U+FFFD when something is
 * held: it can only be an incomplete character) and reset d. Returns bytes
 * written (0 or 3) or -ENOBUFS when cap < 3. */
int kvd_detok_flush(struct kvd_detok *d, char *out, size_t cap);

/* ---- chat template ----------------------------------------------------- */

struct kvd_chat_msg {
	const char *role;    /* "system", "user", "assistant", "tools", "tool_calls", "tool", "call_open" */
	const char *content;
};

/*
 * Tool turns (roles as IPC_CHAT_TOOLS, _TOOL_CALLS, _TOOL):
 *   "tools"      a JSON array of functions {"name", "description"?,
 *                "parameters"?}: at most one such turn, the first or right
 *                after a leading system turn, and followed by a user turn;
 *   "tool_calls" a JSON array of calls {"id"?, "name", "arguments": {...}},
 *                the assistant's reply (after its text, when the message
 *                before is the same reply's assistant turn);
 *   "tool"       one tool result; the results after a "tool_calls" turn
 *                answer its calls in order;
 *   "call_open"  empty, the last turn, after a user or tool turn, in a
 *                conversation with tools: the reply begins with a call
 *                (below: what each family writes before the call's JSON
 *                ends the prompt).
 * Each family renders them in its own tool format (see kvd_chat_render).
 * Whether msgs are well formed: 0, or -EINVAL with the reason in why
 * (cap bytes, may be NULL) — a NULL role or content, an unknown role, a
 * tools or tool_calls turn that is not the JSON described.
 */
int kvd_chat_check(const struct kvd_chat_msg *msgs, size_t n_msgs, char *why, size_t cap);

/*
 * Render messages with the model's chat template (tokenizer.chat_template).
 * The family is recognised from the template text and rendered the way its
 * reference template does (checked against jinja2 renderings):
 *  - ChatML (<|im_start|>): "<|im_start|>role\ncontent<|im_end|>\n" per
 *    message. When the template spells a default system message as a plain
 *    literal ("<|im_start|>system\n...<|im_end|>", as SmolLM2's does), it is
 *    rendered first whenever there are messages and the first is not a
 *    system turn.
 *  - Llama-3 (<|start_header_id|>): "<|start_header_id|>role<|end_header_id|>
 *    \n\n" + content stripped + "<|eot_id|>".
 *  - Llama-2 ([INST]): Llama-2-chat's format; a leading system message
 *    becomes a <<SYS>> block in the first user turn (or, for [INST]
 *    templates without <<SYS>>, a paragraph before it); later user turns
 *    start with the BOS text; add_assistant changes nothing (a prompt ends
 *    after " [/INST]" anyway); system messages after the first are dropped.
 *  - Zephyr (<|user|> and <|assistant|>): "<|role|>\ncontent" + end + "\n",
 *    end being <|end|> (Phi-3), the EOS text (templates using eos_token) or
 *    <|endoftext|>; the reply prompt only follows at least one message
 *    (Phi-3: always, and without it the EOS text closes the conversation).
 *  - Gemma (<start_of_turn>): "<start_of_turn>user\n" or
 *    "<start_of_turn>model\n" (for assistant) + content stripped +
 *    "<end_of_turn>\n"; a leading system message + "\n\n" starts the first
 *    turn, a later one is a user turn (Gemma's template refuses
 *    conversations that do not alternate user, assistant, ...; kvd renders
 *    them all the same).
 *  - Mistral ([INST] with [AVAILABLE_TOOLS], as Mistral-7B-Instruct-v0.3's):
 *    "[INST] content[/INST]" per user turn (a leading system message goes
 *    into the last one when it is the last message: "[INST] system\n\n
 *    content[/INST]"), " content" stripped + EOS per assistant turn.
 * Tools, per family (tool turns as described above kvd_chat_check):
 *  - ChatML (Qwen 2.5 / 3's own format, also the generic one): the tools
 *    in the system turn (after the system message, or the template's
 *    default one, and a blank line) as "# Tools ... <tools>\n" one
 *    {"type": "function", "function": {...}} per line "\n</tools> ...";
 *    calls as "\n<tool_call>\n{"name": "f", "arguments": {...}}\n
 *    </tool_call>" after the assistant's text; results as a user turn of
 *    "<tool_response>\nresult\n</tool_response>" blocks (consecutive
 *    results share it, one per line).
 *  - Gemma, Llama 2, Zephyr (no tool format of their own): the same texts,
 *    in the family's system (or first user), model and user turns.
 *  - Llama 3 (Llama 3.1's template, tools in the first user message): a
 *    system turn "Environment: ipython\nCutting Knowledge Date: December
 *    2023\nToday Date: 26 Jul 2024\n\n" + the system message; the first
 *    user turn starts with the instructions and each tool as JSON indented
 *    by 4; a call is the assistant's whole turn, {"name": "f",
 *    "parameters": {...}} (several: joined by "; "); a result is an
 *    "ipython" turn holding the result as a JSON string.
 *  - A last "call_open" turn ends the prompt (always with the reply's
 *    prompt, add_assistant or not) with the family's call opener: ChatML,
 *    Gemma and Zephyr "<tool_call>\n", Llama 2 " <tool_call>\n" (then the
 *    call object {"name", "arguments"}); Llama 3 nothing (the call object
 *    {"name", "parameters"} is the reply); Mistral its [TOOL_CALLS] token
 *    (then the JSON array of call objects).
 *  - Mistral: "[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]" before the last
 *    user turn, "[TOOL_CALLS] [{"name": ..., "arguments": ..., "id":
 *    "…"}]" + EOS, "[TOOL_RESULTS] {"content": result, "call_id": "…"}
 *    [/TOOL_RESULTS]"; ids are 9 letters and digits (the last 9 of the
 *    call's id, else the call's number in the conversation, 0-padded).
 * JSON is written as Python's json.dumps writes it (", " and ": ",
 * non-ASCII as is), the way the reference templates' tojson does.
 * A model without a template gets Gemma's turns when its vocabulary has
 * <start_of_turn> and <end_of_turn> control tokens (Gemma 3 files carry no
 * template), plain ChatML otherwise. The BOS token is never rendered at
 * the start. With add_assistant the prompt ends where the assistant's reply
 * begins.
 * The text is for reading (logs, tests against the reference templates):
 * a prompt is made with kvd_chat_tokenize(), never by tokenizing this text
 * with parse_special, which would turn marker text inside a message into
 * control tokens. Rendering needs no marker tokens: vocabularies that lack
 * them still render.
 * Returns the length of the rendered text (written like snprintf: at most
 * cap - 1 bytes and a NUL when cap > 0; out may be NULL when cap is 0),
 * -ENOTSUP for a template it does not recognise, -EINVAL for messages
 * kvd_chat_check() refuses, -E2BIG past
 * INT_MAX bytes, -ENOMEM.
 */
int kvd_chat_render(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n_msgs,
		    int add_assistant, char *out, size_t cap);

/* kvd_chat_tokenize() flags. */
#define KVD_CHAT_ADD_ASSISTANT 0x1u /* end where the assistant's reply begins */
#define KVD_CHAT_ADD_BOS       0x2u /* the BOS token first, when the model has one */
#define KVD_CHAT_AFTER_FIRST   0x4u /* only what follows msgs[0]'s content */
#define KVD_CHAT_UPTO_MAX      0x8u /* stop once more than max_out tokens are needed, as
				     * kvd_tokenize_upto: the result is then a lower bound > max_out */

/*
 * The tokens of the conversation kvd_chat_render() renders: the template's
 * markers (<|im_start|>, <|im_end|>; <|start_header_id|>,
 * <|end_header_id|>, <|eot_id|>; <start_of_turn>, <end_of_turn>; Zephyr's
 * and Phi-3's role tokens; BOS and EOS where Llama 2 and Zephyr put them)
 * as their token ids, looked up once at load, and everything between two
 * markers (template text and message contents) as one fragment of text in
 * which no CONTROL or UNKNOWN token and no marker is matched (other USER
 * tokens are, as in kvd_tokenize()). So chat content is text: a message
 * spelling "<|im_end|><|im_start|>system" cannot forge a turn, and for a
 * conversation without marker text the tokens equal those of its rendered
 * text tokenized with parse_special. A marker the vocabulary has no token
 * for is template text (Llama 2's "[INST]", Zephyr's "<|user|>" in most
 * vocabularies).
 * With KVD_CHAT_AFTER_FIRST only the tokens after msgs[0]'s content come
 * out (what a template puts after a message and before the next ones, for
 * continuing a session); -ENOENT when msgs[0]'s content is not rendered
 * verbatim (a family that strips it, a Llama 2 system block).
 * Writes at most max_out ids and returns the total needed (call again with
 * a larger buffer when it exceeds max_out), -ENOTSUP when the template is
 * not recognised or needs a marker token the vocabulary lacks (a file whose
 * template is ChatML, Llama 3 or Gemma without those tokens;
 * kvd_tokenizer_chat_problem() says which), -EINVAL as kvd_chat_render()
 * or for NULL out with max_out > 0, -E2BIG past KVD_TOKENIZE_MAX_BYTES of
 * text, -ENOMEM. Memory: O(rendered length) scratch, freed before return.
 */
int kvd_chat_tokenize(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n_msgs,
		      unsigned flags, int32_t *out, size_t max_out);

/* The family kvd_chat_render() renders this model's conversations in, as
 * WELCOME names it: "chatml", "llama3", "llama2", "zephyr", "gemma",
 * "mistral"; "" when kvd_chat_tokenize() refuses them. Static, never NULL. */
const char *kvd_tokenizer_chat_format(const struct kvd_tokenizer *t);

/* Why kvd_chat_tokenize() refuses this model's conversations (a sentence
 * naming the template and the missing token, owned by t), or NULL when it
 * does not. */
const char *kvd_tokenizer_chat_problem(const struct kvd_tokenizer *t);

#endif /* KVD_TOKENIZER_H */
