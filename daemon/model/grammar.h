/*
 * daemon/model/grammar.h — constraints on what a sequence may generate:
 * grammars in llama.cpp's GBNF notation, JSON Schemas, regular expressions
 * and lists of choices, compiled into one byte-level grammar, and a matcher
 * that says which tokens of a vocabulary may come next.
 *
 * Pieces:
 *  - kvd_grammar: a compiled constraint, immutable and reference-counted,
 *    shared by every sequence (and every thread) that uses it. Every kind is
 *    lowered to the same form: rules whose alternatives are sequences of
 *    byte sets and rule references. Unicode character classes are split into
 *    their UTF-8 byte sequences at compile time, so the matcher only sees
 *    bytes and a token boundary may fall anywhere inside a character.
 *  - kvd_gram_state: one sequence's position in the grammar (the set of
 *    pushdown stacks still alive), a plain struct with an explicit copy, so
 *    it is forked with its sequence and kept (or serialised) across
 *    preemption and swap. It depends on nothing else.
 *  - kvd_gram_vocab: the vocabulary's byte strings arranged once per
 *    tokenizer as a byte-prefix tree, walked with the parser state so that
 *    tokens sharing a prefix are checked once.
 *  - kvd_gram_scratch: reusable working memory for the matcher (one per
 *    thread that computes masks), so the hot path allocates nothing once
 *    warm.
 *  - kvd_gram_cache: compiled constraints by content, bounded.
 *
 * Errors are negative errno values. Compilation reports what is wrong in a
 * kvd_grammar_error: a line:column in the text (GBNF, regex, the schema's
 * JSON syntax) or a JSON pointer and the keyword (schema features that
 * cannot be honoured exactly are refused, never approximated loosely: every
 * text the constraint lets through is valid, though not every valid text
 * need be reachable — e.g. object properties come in the schema's order).
 *
 * Limits (named below) bound every size a user controls: text length, rule
 * and element counts after expansion, nesting, repetition bounds, alive
 * stacks and stack depth, and the work done per byte. A grammar that would
 * exceed them is refused at compile time where that can be known, and a
 * path that exceeds them at run time is treated as not matching (mask and
 * check agree, since both run the same code).
 */
#ifndef KVD_GRAMMAR_H
#define KVD_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

struct kvd_tokenizer;

/* ---- limits --------------------------------------------------------------- */
#define KVD_GRAMMAR_MAX_TEXT_BYTES  (1u << 20) /* constraint text as given */
#define KVD_GRAMMAR_MAX_RULES       32768u     /* rules after expansion */
#define KVD_GRAMMAR_MAX_ELEMS       (1u << 20) /* elements after expansion */
#define KVD_GRAMMAR_MAX_NESTING     64u        /* (groups), JSON depth, $ref chain */
#define KVD_GRAMMAR_MAX_REPEAT      4096u      /* m and n of {m,n} */
#define KVD_GRAMMAR_MAX_STACKS      1024u      /* alive parse stacks */
#define KVD_GRAMMAR_MAX_DEPTH       1024u      /* frames in one stack */
#define KVD_GRAMMAR_MAX_STEP_WORK   16384u     /* expansions per byte */
#define KVD_JSONSCHEMA_MAX_PROPERTIES 512u     /* properties of one object */
#define KVD_JSONSCHEMA_MAX_ENUM     4096u      /* values of one enum */
#define KVD_GRAMMAR_MAX_CHOICES     1024u      /* strings in a choice list */

/* ---- compiling ----------------------------------------------------------- */
enum kvd_grammar_kind {
	KVD_GRAMMAR_GBNF = 1,        /* llama.cpp GBNF; the start rule is "root" */
	KVD_GRAMMAR_JSON_SCHEMA = 2, /* a JSON Schema document */
	KVD_GRAMMAR_JSON_OBJECT = 3, /* any JSON object; the text is ignored */
	KVD_GRAMMAR_REGEX = 4,       /* a regex the whole output must match */
	KVD_GRAMMAR_CHOICE = 5,      /* a JSON array of strings: output is one of them */
};

/* Where and why compilation failed. line/col (1-based) point into the text
 * when known (0 otherwise); pointer is the JSON pointer of the schema part
 * at fault ("" for the root, empty when not a schema problem). msg holds the
 * whole message, e.g. "3:14: expected '::='" or
 * "/properties/age: keyword 'multipleOf' is not supported". */
#define KVD_GRAMMAR_ERR_MAX 384
struct kvd_grammar_error {
	uint32_t line, col;
	char pointer[160];
	char msg[KVD_GRAMMAR_ERR_MAX];
};

struct kvd_grammar;

/*
 * Compile text[0..len) of the given kind. Returns 0 and sets *ret (one
 * reference, the caller's), or: -EINVAL for a syntax or schema error,
 * -ENOTSUP for a feature that cannot be honoured exactly, -E2BIG when a
 * limit above is exceeded, -ENOMEM. On failure *ret is untouched and err
 * (may be NULL) says where and why. Takes O(len + expanded size) time; no
 * input makes it loop or recurse without bound.
 */
int kvd_grammar_compile(enum kvd_grammar_kind kind, const char *text, size_t len, struct kvd_grammar **ret,
			struct kvd_grammar_error *err);

/* The GBNF text a JSON Schema, regex or choice list is translated into
 * before compilation (for debugging and tests). Returns 0 with a malloc'ed
 * NUL-terminated string in *ret_text (the caller frees), or the errors of
 * kvd_grammar_compile. */
int kvd_grammar_to_gbnf(enum kvd_grammar_kind kind, const char *text, size_t len, char **ret_text,
			struct kvd_grammar_error *err);

/* Take another reference; returns g. Thread safe. */
struct kvd_grammar *kvd_grammar_ref(struct kvd_grammar *g);
/* Drop a reference, freeing on the last; accepts NULL; returns NULL. */
struct kvd_grammar *kvd_grammar_unref(struct kvd_grammar *g);
/* Bytes the compiled grammar holds (for the cache's accounting). */
size_t kvd_grammar_bytes(const struct kvd_grammar *g);
uint32_t kvd_grammar_n_rules(const struct kvd_grammar *g);

/* ---- the vocabulary ------------------------------------------------------ */
enum kvd_gram_token_kind {
	KVD_GRAM_TOKEN_TEXT = 0,    /* its bytes are matched against the grammar */
	KVD_GRAM_TOKEN_END = 1,     /* end of generation: allowed only when complete */
	KVD_GRAM_TOKEN_NEVER = 2,   /* control/special/empty: never allowed */
};

struct kvd_gram_vocab;

/*
 * Build the matcher's view of a vocabulary of n_tokens tokens: token i is
 * bytes[i][0..lens[i]) of kind kinds[i] (kinds may be NULL: all TEXT; a TEXT
 * token with no bytes is treated as NEVER). Copies what it needs. Returns 0
 * and sets *ret, -EINVAL (n_tokens < 1 or > 1<<22, a length over 4096, NULL
 * bytes for a non-empty token), -ENOMEM. Memory: about 16 bytes per trie
 * node plus the token bytes.
 */
int kvd_gram_vocab_new(int32_t n_tokens, const uint8_t *const *bytes, const uint32_t *lens, const uint8_t *kinds,
		       struct kvd_gram_vocab **ret);
/* The same for a model's tokenizer: token bytes from kvd_token_to_bytes
 * (specials not rendered); end-of-generation tokens (kvd_tokenizer_is_eog)
 * are END, other CONTROL, UNKNOWN and UNUSED tokens NEVER. */
int kvd_gram_vocab_from_tokenizer(const struct kvd_tokenizer *t, struct kvd_gram_vocab **ret);
struct kvd_gram_vocab *kvd_gram_vocab_free(struct kvd_gram_vocab *v);
int32_t kvd_gram_vocab_n_tokens(const struct kvd_gram_vocab *v);
/* Words of the bitmap kvd_gram_allowed_mask writes: (n_tokens + 31) / 32. */
size_t kvd_gram_vocab_mask_words(const struct kvd_gram_vocab *v);

/* ---- per-sequence state --------------------------------------------------- */
/*
 * The parse position: n_stacks stacks flattened into words[0..n_words) as
 * [depth, pos_0 .. pos_{depth-1}] each, bottom first (a depth of 0 is the
 * empty stack: the constraint is complete on that path). Positions index the
 * grammar's element array, so a state is meaningful only with the grammar
 * it was made from. Plain data: it can be written out and read back
 * (kvd_gram_state_load validates it against the grammar).
 */
struct kvd_gram_state {
	uint32_t n_stacks;
	uint32_t n_words;
	uint32_t cap_words;
	uint32_t *words;
};

/* Working memory for the matcher; one per thread, usable with any grammar
 * (it keeps a memo of the last grammar's transitions, and a reference to
 * that grammar, until used with another one or freed; at most about 56 MiB
 * in all). The memo also keeps whole masks by parse state (for the last
 * vocabulary used), so sequences of one constraint that meet the same
 * state — inside a string, a number, at the same key — pay for its mask
 * once; a kept mask is bit for bit the one a fresh walk computes. Free
 * with _free. */
struct kvd_gram_scratch;
struct kvd_gram_scratch *kvd_gram_scratch_new(void);  /* NULL: out of memory */
struct kvd_gram_scratch *kvd_gram_scratch_free(struct kvd_gram_scratch *s);
/* Masks answered from kept ones since s was made, and masks kept now
 * (either pointer may be NULL). */
void kvd_gram_scratch_stats(const struct kvd_gram_scratch *s, uint64_t *ret_mask_hits, uint32_t *ret_masks_kept);

/* Set st to the grammar's start. st must be zeroed or finished before.
 * Returns 0, -E2BIG (the start alone exceeds the stack limits), -ENOMEM. */
int kvd_gram_state_init(const struct kvd_grammar *g, struct kvd_gram_scratch *s, struct kvd_gram_state *st);
/* dst becomes a copy of src (dst zeroed or holding an earlier state, whose
 * memory is reused). Returns 0 or -ENOMEM (dst unchanged). */
int kvd_gram_state_copy(struct kvd_gram_state *dst, const struct kvd_gram_state *src);
/* Free the state's memory and zero it; accepts a zeroed state. */
void kvd_gram_state_fini(struct kvd_gram_state *st);
/* Rebuild a state from words written out earlier (n_words of them),
 * checking every position against g. Returns 0, -EINVAL (not a state of
 * this grammar), -ENOMEM. */
int kvd_gram_state_load(const struct kvd_grammar *g, const uint32_t *words, uint32_t n_words,
			struct kvd_gram_state *st);

/* True when the text so far is a complete sentence of the grammar. */
int kvd_gram_is_complete(const struct kvd_gram_state *st);
/* True when some non-empty continuation is still possible. */
int kvd_gram_can_continue(const struct kvd_gram_state *st);

/*
 * Advance by bytes[0..len). Returns 0, -ENOENT when the bytes do not fit
 * the grammar (st unchanged), -E2BIG when a limit was hit on the way (st
 * unchanged), -ENOMEM.
 */
int kvd_gram_accept_bytes(const struct kvd_grammar *g, struct kvd_gram_scratch *s, struct kvd_gram_state *st,
			  const uint8_t *bytes, size_t len);

/*
 * Advance by one token. TEXT tokens advance by their bytes; an END token is
 * accepted (st unchanged) only when st is complete; NEVER tokens and ids
 * out of range are refused. Returns 0, -ENOENT (not allowed, st unchanged),
 * -E2BIG, -ENOMEM, -EINVAL (id out of range).
 */
int kvd_gram_accept_token(const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *s,
			  struct kvd_gram_state *st, int32_t token);

/* Whether token may come next (1) or not (0), without changing st; the
 * answer equals the token's bit in kvd_gram_allowed_mask. Negative errno
 * only for -ENOMEM. Cost: the token's length, not the vocabulary's. */
int kvd_gram_check(const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *s,
		   const struct kvd_gram_state *st, int32_t token);

/*
 * Write the set of tokens that may come next as a bitmap (bit i of
 * mask[i / 32] is token i), kvd_gram_vocab_mask_words(v) words. END tokens
 * are set exactly when st is complete. Returns the number of allowed tokens
 * (0 means the constraint is stuck: the caller ends the sequence) or
 * -ENOMEM. Walks the vocabulary's prefix tree, so shared prefixes are
 * matched once and subtrees that cannot match are skipped.
 */
int kvd_gram_allowed_mask(const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *s,
			  const struct kvd_gram_state *st, uint32_t *mask);

/* ---- compile cache -------------------------------------------------------- */
struct kvd_gram_cache;
/* A cache holding at most max_entries grammars and max_bytes of them
 * (least recently used are dropped first). NULL on out of memory. Thread
 * safe (one mutex). */
struct kvd_gram_cache *kvd_gram_cache_new(uint32_t max_entries, size_t max_bytes);
struct kvd_gram_cache *kvd_gram_cache_free(struct kvd_gram_cache *c);
/*
 * The compiled grammar for (kind, text): from the cache when the same kind
 * and text were compiled before (compared byte for byte, not only by hash),
 * else compiled and kept. Returns 0 with a new reference in *ret, or
 * kvd_grammar_compile's errors (failures are not cached). *ret_hit (may be
 * NULL) says whether it came from the cache.
 */
int kvd_gram_cache_get(struct kvd_gram_cache *c, enum kvd_grammar_kind kind, const char *text, size_t len,
		       struct kvd_grammar **ret, int *ret_hit, struct kvd_grammar_error *err);
/* Entries and bytes held now. */
void kvd_gram_cache_stats(struct kvd_gram_cache *c, uint32_t *ret_entries, size_t *ret_bytes);

#endif
