/*
 * daemon/model/tokenizer_impl.h — what the tokenizer's files share, private
 * to them: the tokenizer object, its lookup helpers, and the scratch state
 * of one kvd_tokenize() call with the entry points of its stages.
 *
 *   tokenizer.c         kvd_tokenize (special tokens, fragments), detokenizing, accessors
 *   tokenizer_load.c    building the object from GGUF metadata
 *   tokenizer_pretok.c  the pre-tokenizer passes of byte-level vocabularies
 *   tokenizer_bpe.c     byte-level BPE merges of one pre-token
 *   tokenizer_spm.c     SentencePiece BPE of one fragment
 *   tokenizer_chat.c    chat template rendering and the tokens of a conversation
 */
#ifndef KVD_TOKENIZER_IMPL_H
#define KVD_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer.h"

enum tok_model { MODEL_BPE, MODEL_SPM };

/* One "find all matches" pass of a pre-tokenizer (see match()). */
enum pre_pass {
	PASS_GPT2,          /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
	PASS_LLAMA3,        /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
	PASS_QWEN2,         /* the same with \p{N} instead of \p{N}{1,3} */
	PASS_NUMBER,        /* \p{N} */
	PASS_NUMBER_RUN,    /* \p{N}+ */
	PASS_DIGITS3,       /* [0-9][0-9][0-9] */
	PASS_PUNCT_DEFAULT, /* [\p{P}\$\+<=>\^~\|]+ */
	PASS_PUNCT_FALCON,  /* [\p{P}\$\+<=>\^~\|`]+ */
	PASS_NEWLINE,       /* [\r\n] */
	PASS_SP_LETTERS,    /* \s?\p{L}+ */
	PASS_SP_PUNCT,      /* \s?\p{P}+ */
	PASS_CJK,           /* [\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+ */
	PASS_DS_LETTERS,    /* \s?[A-Za-z\u00b5\u00c0-...]+: DeepSeek LLM's cased letters (ascii \s) */
	PASS_DS_PUNCT,      /* \s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+ */
	PASS_TRAILING_SP,   /* \s+$ */
};
#define MAX_PASSES 6

/* CHAT_MISTRAL: Mistral's [INST] template with tools ([AVAILABLE_TOOLS]);
 * [INST] templates without them are CHAT_LLAMA2. */
enum chat_family { CHAT_UNKNOWN, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_ZEPHYR, CHAT_GEMMA, CHAT_MISTRAL };

/* Per-token flag bits. */
#define TOKF_EOG     0x01u /* ends a generation */
#define TOKF_SPECIAL 0x02u /* matched in text (CONTROL, USER, UNKNOWN) */
#define TOKF_PARSE   0x04u /* ... only when parse_special (CONTROL, UNKNOWN) */
#define TOKF_HIDDEN  0x08u /* rendered only with render_special */
#define TOKF_MARKER  0x10u /* a chat template's marker: never matched in message content */

/*
 * The markers chat templates put around messages. Each is the token the
 * vocabulary has for its text (a CONTROL, USER or UNKNOWN token), looked up
 * once at load, or -1 where the vocabulary has none and the marker is plain
 * text of the template (Llama-2's "[INST]" is always text; Zephyr's
 * "<|user|>" is text in vocabularies without such a token).
 */
enum chat_marker {
	MK_IM_START,     /* ChatML */
	MK_IM_END,
	MK_START_HEADER, /* Llama 3 */
	MK_END_HEADER,
	MK_EOT_ID,
	MK_SOT,          /* Gemma */
	MK_EOT,
	MK_BOS,          /* the BOS token's text, else "<s>" (Llama-2's later user turns) */
	MK_EOS,          /* the EOS token's text, else "</s>" */
	MK_EOS_PHI3,     /* the EOS token's text, else "<|endoftext|>" (Phi-3's closing) */
	MK_Z_SYSTEM,     /* Zephyr and Phi-3 */
	MK_Z_USER,
	MK_Z_ASSISTANT,
	MK_Z_END,        /* "<|end|>" (Phi-3) */
	MK_ENDOFTEXT,    /* "<|endoftext|>" (Zephyr) */
	MK_INST,         /* Mistral: "[INST]", "[/INST]" and the tool markers */
	MK_INST_END,
	MK_AVAIL_TOOLS,
	MK_AVAIL_TOOLS_END,
	MK_TOOL_CALLS,
	MK_TOOL_RESULTS,
	MK_TOOL_RESULTS_END,
	MK_COUNT
};

struct chat_mark {
	const char *text; /* static, or a token text of the tokenizer */
	uint32_t len;
	int32_t id;       /* the token, or -1: plain text */
};

/* Longest text of chat_problem, the reason chat is refused. */
#define CHAT_PROBLEM_MAX 160

/* Open-addressing map from token text to id. */
struct text_slot {
	uint32_t hash;
	int32_t id; /* -1: empty */
};

/* Open-addressing map from (left id, right id) to merge rank and result. */
struct merge_slot {
	uint64_t key; /* left << 32 | right; MERGE_EMPTY when free */
	int32_t rank;
	int32_t result;
};
#define MERGE_EMPTY UINT64_MAX

struct kvd_tokenizer {
	enum tok_model model;
	int32_t n_vocab;

	char *text;          /* token texts, concatenated */
	uint32_t *text_off;  /* n_vocab + 1 offsets into text */
	char *dec;           /* each token's bytes as kvd_token_to_bytes gives them */
	uint32_t *dec_off;   /* n_vocab + 1 offsets into dec */
	uint8_t *type;       /* KVD_TOKEN_* */
	uint8_t *flags;      /* TOKF_* */
	float *score;        /* SPM merge scores (NULL for BPE) */
	size_t max_token_bytes;

	struct text_slot *text_map;
	uint32_t text_mask;
	struct merge_slot *merge_map;
	uint32_t merge_bits;

	int32_t byte_tok[256]; /* token of each raw byte, -1 if none */

	/* Special tokens by first byte, longest first within a byte. */
	int32_t *special;
	uint32_t special_start[257];
	bool special_starts[256]; /* some special token starts with this byte */

	enum pre_pass passes[MAX_PASSES];
	unsigned n_passes;
	bool ignore_merges;    /* a pre-token that is itself a token is taken whole */
	bool add_space_prefix; /* SPM: a space before text that starts a fragment */
	bool add_bos;

	int32_t bos, eos, eot, unk;

	enum chat_family chat;
	char *chat_system;     /* ChatML default system message, or NULL */
	size_t chat_system_len;
	bool l2_sys; /* Llama-2 template with a <<SYS>> block */
	enum { ZEPHYR_END_ENDOFTEXT, ZEPHYR_END_EOS, ZEPHYR_END_PHI3 } zephyr_end; /* what ends a turn */
	struct chat_mark chat_mk[MK_COUNT];
	/* Why conversations cannot be tokenized ("" when they can): the
	 * template names a marker the vocabulary has no token for. */
	char chat_problem[CHAT_PROBLEM_MAX];
};

/* ---- lookups ------------------------------------------------------------- */

static inline uint32_t hash_bytes(const void *p, size_t n)
{
	/* FNV-1a, 32 bits: token texts are short. */
	const unsigned char *s = p;
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ s[i]) * 16777619u;
	return h;
}

static inline const char *tok_text(const struct kvd_tokenizer *t, int32_t id, size_t *ret_len)
{
	*ret_len = t->text_off[id + 1] - t->text_off[id];
	return t->text + t->text_off[id];
}

/* Token id of text[0..n), or -1. */
static inline int32_t text_lookup(const struct kvd_tokenizer *t, const void *s, size_t n)
{
	uint32_t h = hash_bytes(s, n);
	for (uint32_t i = h & t->text_mask;; i = (i + 1) & t->text_mask) {
		const struct text_slot *sl = &t->text_map[i];
		if (sl->id < 0)
			return -1;
		if (sl->hash == h) {
			size_t len;
			const char *tx = tok_text(t, sl->id, &len);
			if (len == n && memcmp(tx, s, n) == 0)
				return sl->id;
		}
	}
}

static inline uint32_t merge_hash(uint64_t key, uint32_t bits)
{
	return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static inline const struct merge_slot *merge_lookup(const struct kvd_tokenizer *t, int32_t a, int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint32_t mask = (1u << t->merge_bits) - 1;
	for (uint32_t i = merge_hash(key, t->merge_bits);; i = (i + 1) & mask) {
		const struct merge_slot *sl = &t->merge_map[i];
		if (sl->key == key)
			return sl;
		if (sl->key == MERGE_EMPTY)
			return NULL;
	}
}

/* GPT-2's byte-to-unicode alphabet: printable bytes stand for themselves,
 * the 68 others for U+0100.. in byte order. */
static inline uint32_t byte_to_cp(unsigned b)
{
	if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
		return b;
	if (b <= 0x20)
		return 0x100 + b;
	if (b <= 0xA0)
		return 0x100 + 33 + (b - 0x7F);
	return 0x100 + 67; /* 0xAD */
}

/* Inverse of byte_to_cp; -1 for a code point outside the alphabet. */
static inline int cp_to_byte(uint32_t cp)
{
	if (cp < 0x100)
		return ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || cp >= 0xAE) ? (int)cp : -1;
	if (cp >= 0x100 + 68)
		return -1;
	unsigned n = cp - 0x100;
	if (n <= 32)
		return (int)n;
	if (n <= 66)
		return (int)(0x7F + n - 33);
	return 0xAD;
}

/* ---- tokenizing: shared state of one call -------------------------------- */

struct bpe_sym {
	int32_t id;   /* -1: a byte without a token; -2: merged away */
	int32_t prev, next;
};

struct bpe_cand {
	int32_t rank;
	int32_t left;
};

struct spm_sym {
	uint32_t off, len; /* into the escaped text; len 0: merged away */
	int32_t prev, next;
};

struct spm_cand {
	float score;
	int32_t left, right;
	uint32_t len;
};

struct tok_call {
	const struct kvd_tokenizer *t;
	int32_t *out;
	size_t max_out;
	size_t n_out;
	bool stop_past_max;  /* stop (-ECANCELED inside) once n_out > max_out */
	void *sym;   /* bpe_sym[] or spm_sym[] */
	size_t sym_cap;
	void *heap;  /* bpe_cand[] or spm_cand[] */
	size_t heap_cap, heap_n;
	char *buf;
	size_t buf_cap;
};

/* PFX_heap_add / PFX_pop: a binary heap of T in c->heap whose top is the
 * element that BEFORE(x, y) puts first (both merge loops use one). */
#define DEFINE_CAND_HEAP(PFX, T, BEFORE)                             \
	static void PFX##_heap_add(struct tok_call *c, T v)           \
	{                                                             \
		T *h = c->heap;                                       \
		size_t i = c->heap_n++;                               \
		while (i > 0) {                                       \
			size_t parent = (i - 1) / 2;                  \
			if (!BEFORE(v, h[parent]))                    \
				break;                                \
			h[i] = h[parent];                             \
			i = parent;                                   \
		}                                                     \
		h[i] = v;                                             \
	}                                                             \
	static T PFX##_pop(struct tok_call *c)                        \
	{                                                             \
		T *h = c->heap;                                       \
		T top = h[0], v = h[--c->heap_n];                     \
		size_t n = c->heap_n, i = 0;                          \
		for (;;) {                                            \
			size_t l = 2 * i + 1;                         \
			if (l >= n)                                   \
				break;                                \
			if (l + 1 < n && BEFORE(h[l + 1], h[l]))      \
				l++;                                  \
			if (!BEFORE(h[l], v))                         \
				break;                                \
			h[i] = h[l];                                  \
			i = l;                                        \
		}                                                     \
		if (n)                                                \
			h[i] = v;                                     \
		return top;                                           \
	}

static inline void emit(struct tok_call *c, int32_t id)
{
	if (c->n_out < c->max_out)
		c->out[c->n_out] = id;
	c->n_out++;
}

/* A symbol without a token (a byte the vocabulary cannot spell) becomes
 * the unknown token when the vocabulary has a real one, else nothing, as
 * in llama.cpp: SmolLM2's "unknown" is <|endoftext|>, which must not
 * appear in the middle of a prompt. */
static inline void emit_symbol(struct tok_call *c, int32_t id)
{
	if (id >= 0)
		emit(c, id);
	else if (c->t->unk >= 0 && c->t->type[c->t->unk] == KVD_TOKEN_UNKNOWN)
		emit(c, c->t->unk);
}

/* kvd_tokenize() with the special tokens whose flags have a bit of
 * no_match left unmatched (plain text): TOKF_PARSE for parse_special = 0,
 * TOKF_PARSE | TOKF_MARKER for a chat message's content. */
int tok_tokenize(const struct kvd_tokenizer *t, const char *text, size_t len, bool add_bos, unsigned no_match,
		 int32_t *out, size_t max_out);
/* tok_tokenize that stops at the next word (BPE) or fragment (SPM) once more
 * than max_out tokens are known to be needed: returns the count when the
 * text fits in max_out, else a number > max_out (a lower bound). */
int tok_tokenize_upto(const struct kvd_tokenizer *t, const char *text, size_t len, bool add_bos, unsigned no_match,
		      int32_t *out, size_t max_out);
/* The stop of tok_tokenize_upto reached: the pre-tokenizer's walk ends. */
static inline bool tok_past_max(const struct tok_call *c)
{
	return c->stop_past_max && c->n_out > c->max_out;
}
/* Look up the chat template's markers and flag their tokens (at load, once
 * t->chat and the special tokens are known). */
void tok_chat_markers(struct kvd_tokenizer *t, bool have_template);

/* ---- chat rendering (tokenizer_chat.c, tokenizer_chat_tools.c) ---------- */

/* A marker that is a token, at text offset off (grow mode only). */
struct mark_at {
	size_t off;
	uint32_t len;
	int32_t id;
};

/*
 * The rendering under way: text written like snprintf into out[0..cap)
 * (len counts everything), or, with grow, into a buffer of its own that
 * grows, with the markers noted. first_end is where msgs[0]'s content ends
 * when it was rendered verbatim (first_done); a conversation with tool
 * turns (tools) has no such point.
 */
struct render {
	const struct kvd_tokenizer *t;
	char *out;
	size_t cap;
	size_t len;
	bool grow;
	int err; /* -ENOMEM once growing failed */
	struct mark_at *marks;
	size_t n_marks, marks_cap;
	bool first_done;
	size_t first_end;
	bool tools;
};
/* Template text (or message content) s[0..n) / NUL-terminated s. */
void chat_put(struct render *b, const char *s, size_t n);
void chat_str(struct render *b, const char *s);
/* One of the template's markers: its text, noted as its token when the
 * vocabulary has one. */
void chat_mark(struct render *b, enum chat_marker m);
/* s[0..*n) without leading and trailing white space, as Python's str.strip(). */
const char *chat_strip(const char *s, size_t *n);
/* The conversation msgs (roles system, user, assistant and, for Llama 3,
 * ipython) in the family's own turns; verbatim[i] (verbatim may be NULL)
 * keeps message i's content unstripped where the family strips it. */
int tok_chat_render_plain(struct render *b, const struct kvd_chat_msg *msgs, size_t n_msgs, bool add_assistant,
			  const bool *verbatim);
/* Whether msgs hold a tool role ("tools", "tool_calls", "tool"). */
bool tok_chat_has_tools(const struct kvd_chat_msg *msgs, size_t n_msgs);
/* A conversation with tool roles in the family's tool format
 * (tokenizer_chat_tools.c); every Mistral conversation. 0, -EINVAL (a
 * malformed tool turn), -ENOMEM. */
int tok_chat_render_tools(struct render *b, const struct kvd_chat_msg *msgs, size_t n_msgs, bool add_assistant);

/* Grow *p (of *cap elements of elem bytes) to hold need: 0 or -ENOMEM. */
int tok_grow(void **p, size_t *cap, size_t need, size_t elem);
/* Run pre-tokenizer pass k over s[a..b) and the passes after it; the
 * pieces of the last pass go to tok_bpe_word(). 0 or -errno. */
int tok_pre_split(struct tok_call *c, unsigned k, const unsigned char *s, size_t a, size_t b);
/* Byte-level BPE of one pre-token p[0..n): its token ids emitted. 0 or -errno. */
int tok_bpe_word(struct tok_call *c, const unsigned char *p, size_t n);
/* SentencePiece BPE of one raw fragment (a space prepended when
 * prefix_space): its token ids emitted. 0 or -errno. */
int tok_spm_fragment(struct tok_call *c, const char *s, size_t n, bool prefix_space);

#endif /* KVD_TOKENIZER_IMPL_H */
