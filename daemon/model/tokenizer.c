/*
 * daemon/model/tokenizer.c — the model's tokenizer, built from GGUF metadata
 * (contracts in tokenizer.h).
 *
 * Two tokenizer models:
 *
 *  - "gpt2": byte-level BPE. Text is first cut at special tokens, then each
 *    piece goes through the pre-tokenizer the file names (a fixed list of
 *    "find all matches" passes, each a hand-written matcher for one of the
 *    regexes these vocabularies were trained with), then every pre-token is
 *    merged from its bytes by rank: a binary heap of adjacent pairs keyed by
 *    (rank, position), rank looked up in a hash map of (left id, right id).
 *    Bytes map to the GPT-2 printable-unicode alphabet only to find the 256
 *    base tokens; merging works on ids.
 *  - "llama": SentencePiece-style BPE. Spaces become U+2581, characters are
 *    merged greedily by the score of the token their concatenation forms,
 *    and characters left without a token fall back to <0xXX> byte tokens.
 *
 * The behaviour follows llama.cpp's (the reference kvd is tested against),
 * except that invalid UTF-8 is tokenized byte for byte instead of being
 * replaced by U+FFFD, so decode(encode(x)) == x for any bytes x, and that
 * special tokens are matched leftmost-longest.
 *
 * Everything built at load is immutable; each kvd_tokenize() call owns its
 * scratch memory, so one tokenizer serves any number of threads.
 */
#include "tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "unicode.h"

/* ---- the object ---------------------------------------------------------- */

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

enum chat_family { CHAT_UNKNOWN, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_ZEPHYR, CHAT_GEMMA };

/* Per-token flag bits. */
#define TOKF_EOG     0x01u /* ends a generation */
#define TOKF_SPECIAL 0x02u /* matched in text (CONTROL, USER, UNKNOWN) */
#define TOKF_PARSE   0x04u /* ... only when parse_special (CONTROL, UNKNOWN) */
#define TOKF_HIDDEN  0x08u /* rendered only with render_special */

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
};

/* ---- small helpers ------------------------------------------------------- */

static int fail(char *err, size_t errlen, const struct gguf_file *f, int r, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int fail(char *err, size_t errlen, const struct gguf_file *f, int r, const char *fmt, ...)
{
	if (err && errlen > 0) {
		int n = snprintf(err, errlen, "%s: ", gguf_path(f));
		if (n >= 0 && (size_t)n < errlen) {
			va_list ap;
			va_start(ap, fmt);
			vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
			va_end(ap);
			gguf_strip_controls(err + n);
		}
	}
	return r;
}

static uint32_t hash_bytes(const void *p, size_t n)
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
static int32_t text_lookup(const struct kvd_tokenizer *t, const void *s, size_t n)
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

static const struct merge_slot *merge_lookup(const struct kvd_tokenizer *t, int32_t a, int32_t b)
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
static uint32_t byte_to_cp(unsigned b)
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
static int cp_to_byte(uint32_t cp)
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

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static bool mem_contains(const char *s, size_t n, const char *needle)
{
	return memmem(s, n, needle, strlen(needle)) != NULL;
}

/* ---- loading ------------------------------------------------------------- */

struct kvd_tokenizer *kvd_tokenizer_free(struct kvd_tokenizer *t)
{
	if (!t)
		return NULL;
	free(t->text);
	free(t->text_off);
	free(t->dec);
	free(t->dec_off);
	free(t->type);
	free(t->flags);
	free(t->score);
	free(t->text_map);
	free(t->merge_map);
	free(t->special);
	free(t->chat_system);
	free(t);
	return NULL;
}

static int set_pre(struct kvd_tokenizer *t, const char *pre, size_t n)
{
#define PRE_IS(name) (n == strlen(name) && memcmp(pre, name, n) == 0)
	if (!pre || PRE_IS("default")) {
		t->passes[0] = PASS_PUNCT_DEFAULT;
		t->passes[1] = PASS_GPT2;
		t->passes[2] = PASS_NUMBER_RUN;
		t->passes[3] = PASS_DIGITS3;
		t->n_passes = 4;
	} else if (PRE_IS("smollm") || PRE_IS("starcoder") || PRE_IS("refact") || PRE_IS("command-r") ||
		   PRE_IS("codeshell") || PRE_IS("exaone") || PRE_IS("minerva-7b")) {
		t->passes[0] = PASS_NUMBER;
		t->passes[1] = PASS_GPT2;
		t->n_passes = 2;
	} else if (PRE_IS("gpt2") || PRE_IS("gpt-2") || PRE_IS("phi-2") || PRE_IS("roberta-bpe") ||
		   PRE_IS("jina-es") || PRE_IS("jina-de") || PRE_IS("jina-v2-es") || PRE_IS("jina-v2-de") ||
		   PRE_IS("jina-v2-code") || PRE_IS("mpt") || PRE_IS("olmo") || PRE_IS("jais")) {
		t->passes[0] = PASS_GPT2;
		t->n_passes = 1;
	} else if (PRE_IS("llama3") || PRE_IS("llama-v3") || PRE_IS("llama-bpe") || PRE_IS("falcon3")) {
		t->passes[0] = PASS_LLAMA3;
		t->n_passes = 1;
		t->ignore_merges = true;
	} else if (PRE_IS("dbrx") || PRE_IS("smaug-bpe")) {
		t->passes[0] = PASS_LLAMA3;
		t->n_passes = 1;
	} else if (PRE_IS("qwen2") || PRE_IS("stablelm2") || PRE_IS("deepseek-r1-qwen")) {
		t->passes[0] = PASS_QWEN2;
		t->n_passes = 1;
	} else if (PRE_IS("deepseek-coder")) {
		t->passes[0] = PASS_NEWLINE;
		t->passes[1] = PASS_SP_LETTERS;
		t->passes[2] = PASS_SP_PUNCT;
		t->passes[3] = PASS_CJK;
		t->passes[4] = PASS_NUMBER;
		t->n_passes = 5;
	} else if (PRE_IS("deepseek-llm")) {
		t->passes[0] = PASS_NEWLINE;
		t->passes[1] = PASS_DS_LETTERS;
		t->passes[2] = PASS_DS_PUNCT;
		t->passes[3] = PASS_TRAILING_SP;
		t->passes[4] = PASS_CJK;
		t->passes[5] = PASS_NUMBER_RUN;
		t->n_passes = 6;
	} else if (PRE_IS("falcon")) {
		t->passes[0] = PASS_PUNCT_FALCON;
		t->passes[1] = PASS_GPT2;
		t->passes[2] = PASS_DIGITS3;
		t->n_passes = 3;
	} else {
		return -ENOTSUP;
	}
	return 0;
#undef PRE_IS
}

/* An optional token id key: absent -> -1; present and out of range -> error. */
static int get_token_id(const struct gguf_file *f, const char *key, int32_t n_vocab, int32_t *ret,
			char *err, size_t errlen)
{
	uint32_t v;
	int r = gguf_get_u32(f, key, &v);
	if (r == -ENOENT) {
		*ret = -1;
		return 0;
	}
	if (r < 0) {
		int32_t s;
		if (gguf_get_i32(f, key, &s) == 0 && s == -1) {
			*ret = -1;
			return 0;
		}
		return fail(err, errlen, f, -EBADMSG, "%s is not a token id", key);
	}
	if (v >= (uint32_t)n_vocab)
		return fail(err, errlen, f, -EBADMSG, "%s = %u is out of range (vocabulary of %d)", key, v,
			    n_vocab);
	*ret = (int32_t)v;
	return 0;
}

static int load_tokens(struct kvd_tokenizer *t, const struct gguf_file *f, char *err, size_t errlen)
{
	enum gguf_vtype vt;
	uint64_t n;
	int r = gguf_get_arr(f, "tokenizer.ggml.tokens", &vt, &n);
	if (r < 0 || vt != GGUF_VT_STRING || n == 0)
		return fail(err, errlen, f, -EBADMSG, "no tokenizer.ggml.tokens string array");
	if (n > KVD_TOKENIZER_MAX_VOCAB)
		return fail(err, errlen, f, -EBADMSG, "vocabulary of %llu tokens exceeds the limit of %d",
			    (unsigned long long)n, KVD_TOKENIZER_MAX_VOCAB);
	t->n_vocab = (int32_t)n;

	uint64_t total = 0;
	for (uint64_t i = 0; i < n; i++) {
		const char *s;
		size_t len;
		if (gguf_arr_str(f, "tokenizer.ggml.tokens", i, &s, &len) < 0)
			return fail(err, errlen, f, -EBADMSG, "token %llu unreadable", (unsigned long long)i);
		if (len > KVD_TOKENIZER_MAX_TOKEN_BYTES)
			return fail(err, errlen, f, -EBADMSG, "token %llu is %zu bytes long (limit %u)",
				    (unsigned long long)i, len, KVD_TOKENIZER_MAX_TOKEN_BYTES);
		total += len;
	}
	if (total >= UINT32_MAX / 4)
		return fail(err, errlen, f, -EBADMSG, "token texts total %llu bytes", (unsigned long long)total);

	t->text = malloc(total + 1);
	t->text_off = malloc((n + 1) * sizeof(*t->text_off));
	t->type = malloc(n);
	t->flags = calloc(n, 1);
	if (!t->text || !t->text_off || !t->type || !t->flags)
		return -ENOMEM;
	uint32_t off = 0;
	for (uint64_t i = 0; i < n; i++) {
		const char *s;
		size_t len;
		gguf_arr_str(f, "tokenizer.ggml.tokens", i, &s, &len);
		t->text_off[i] = off;
		memcpy(t->text + off, s, len);
		off += (uint32_t)len;
	}
	t->text_off[n] = off;

	/* Types: absent means every token is normal. */
	r = gguf_get_arr(f, "tokenizer.ggml.token_type", &vt, &n);
	if (r == 0 && n != (uint64_t)t->n_vocab)
		return fail(err, errlen, f, -EBADMSG, "tokenizer.ggml.token_type has %llu entries for %d tokens",
			    (unsigned long long)n, t->n_vocab);
	for (int32_t i = 0; i < t->n_vocab; i++) {
		int32_t ty = KVD_TOKEN_NORMAL;
		if (r == 0 && gguf_arr_i32(f, "tokenizer.ggml.token_type", (uint64_t)i, &ty) < 0)
			return fail(err, errlen, f, -EBADMSG, "tokenizer.ggml.token_type is not an integer array");
		if (ty == 0)
			ty = KVD_TOKEN_NORMAL; /* "undefined" in older converters */
		if (ty < KVD_TOKEN_NORMAL || ty > KVD_TOKEN_BYTE)
			return fail(err, errlen, f, -EBADMSG, "token %d has unknown type %d", i, ty);
		t->type[i] = (uint8_t)ty;
	}

	/* Text map, at most half full. */
	uint32_t cap = 16;
	while (cap < 2u * (uint32_t)t->n_vocab)
		cap <<= 1;
	t->text_map = malloc(cap * sizeof(*t->text_map));
	if (!t->text_map)
		return -ENOMEM;
	for (uint32_t i = 0; i < cap; i++)
		t->text_map[i].id = -1;
	t->text_mask = cap - 1;
	for (int32_t id = 0; id < t->n_vocab; id++) {
		size_t len;
		const char *s = tok_text(t, id, &len);
		uint32_t h = hash_bytes(s, len);
		uint32_t i = h & t->text_mask;
		bool dup = false;
		for (; t->text_map[i].id >= 0; i = (i + 1) & t->text_mask) {
			size_t l2;
			const char *s2 = tok_text(t, t->text_map[i].id, &l2);
			if (t->text_map[i].hash == h && l2 == len && memcmp(s, s2, len) == 0) {
				dup = true; /* the first id with a text wins */
				break;
			}
		}
		if (!dup) {
			t->text_map[i].hash = h;
			t->text_map[i].id = id;
		}
	}
	return 0;
}

static int load_merges(struct kvd_tokenizer *t, const struct gguf_file *f, char *err, size_t errlen)
{
	enum gguf_vtype vt;
	uint64_t n;
	if (gguf_get_arr(f, "tokenizer.ggml.merges", &vt, &n) < 0 || vt != GGUF_VT_STRING)
		return fail(err, errlen, f, -EBADMSG, "no tokenizer.ggml.merges string array");
	if (n > KVD_TOKENIZER_MAX_MERGES)
		return fail(err, errlen, f, -EBADMSG, "%llu merges exceed the limit of %u",
			    (unsigned long long)n, KVD_TOKENIZER_MAX_MERGES);
	uint32_t bits = 4;
	while ((1ull << bits) < 2 * n)
		bits++;
	t->merge_bits = bits;
	t->merge_map = malloc(((size_t)1 << bits) * sizeof(*t->merge_map));
	if (!t->merge_map)
		return -ENOMEM;
	for (size_t i = 0; i < ((size_t)1 << bits); i++)
		t->merge_map[i].key = MERGE_EMPTY;

	char cat[2 * KVD_TOKENIZER_MAX_TOKEN_BYTES];
	uint32_t mask = (1u << bits) - 1;
	for (uint64_t i = 0; i < n; i++) {
		const char *s;
		size_t len;
		if (gguf_arr_str(f, "tokenizer.ggml.merges", i, &s, &len) < 0)
			return fail(err, errlen, f, -EBADMSG, "merge %llu unreadable", (unsigned long long)i);
		/* "left right": split at the first space after the first byte. */
		const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
		if (!sp)
			return fail(err, errlen, f, -EBADMSG, "merge %llu '%.*s' is not two tokens",
				    (unsigned long long)i, (int)(len < 64 ? len : 64), s);
		size_t la = (size_t)(sp - s), lb = len - la - 1;
		int32_t a = text_lookup(t, s, la), b = text_lookup(t, sp + 1, lb);
		int32_t ab = -1;
		if (a >= 0 && b >= 0 && la + lb <= sizeof(cat)) {
			memcpy(cat, s, la);
			memcpy(cat + la, sp + 1, lb);
			ab = text_lookup(t, cat, la + lb);
		}
		if (ab < 0)
			return fail(err, errlen, f, -EBADMSG, "merge %llu '%.*s' names an unknown token",
				    (unsigned long long)i, (int)(len < 64 ? len : 64), s);
		uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
		uint32_t j = merge_hash(key, bits);
		while (t->merge_map[j].key != MERGE_EMPTY && t->merge_map[j].key != key)
			j = (j + 1) & mask;
		if (t->merge_map[j].key == key)
			continue; /* a repeated merge keeps its first (best) rank */
		t->merge_map[j].key = key;
		t->merge_map[j].rank = (int32_t)i;
		t->merge_map[j].result = ab;
	}
	return 0;
}

/* Each token's output bytes: byte-level tokens decoded, SPM spaces
 * restored, byte tokens as their byte, others as their text. */
static int build_decoded(struct kvd_tokenizer *t)
{
	size_t total = t->text_off[t->n_vocab]; /* decoding never grows a text */
	t->dec = malloc(total + 1);
	t->dec_off = malloc(((size_t)t->n_vocab + 1) * sizeof(*t->dec_off));
	if (!t->dec || !t->dec_off)
		return -ENOMEM;
	uint32_t o = 0;
	for (int32_t id = 0; id < t->n_vocab; id++) {
		size_t len;
		const char *s = tok_text(t, id, &len);
		int ty = t->type[id];
		t->dec_off[id] = o;
		if (ty == KVD_TOKEN_NORMAL && t->model == MODEL_BPE) {
			for (size_t i = 0; i < len;) {
				uint32_t cp;
				size_t l = kvd_utf8_decode_lenient((const unsigned char *)s + i, len - i, &cp);
				int b = cp_to_byte(cp);
				if (b >= 0 && l > 0) {
					t->dec[o++] = (char)b;
				} else {
					memcpy(t->dec + o, s + i, l); /* outside the alphabet: as is */
					o += (uint32_t)l;
				}
				i += l;
			}
		} else if (ty == KVD_TOKEN_NORMAL && t->model == MODEL_SPM) {
			for (size_t i = 0; i < len;) {
				if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
					t->dec[o++] = ' ';
					i += 3;
				} else {
					t->dec[o++] = s[i++];
				}
			}
		} else if (ty == KVD_TOKEN_BYTE) {
			int hi = len == 6 ? hex_value(s[3]) : -1, lo = len == 6 ? hex_value(s[4]) : -1;
			if (hi >= 0 && lo >= 0 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
				t->dec[o++] = (char)(hi << 4 | lo);
			} else {
				memcpy(t->dec + o, s, len);
				o += (uint32_t)len;
			}
		} else if (ty != KVD_TOKEN_UNUSED) {
			memcpy(t->dec + o, s, len);
			o += (uint32_t)len;
		}
		if (ty == KVD_TOKEN_CONTROL || ty == KVD_TOKEN_UNKNOWN)
			t->flags[id] |= TOKF_HIDDEN;
		size_t dl = o - t->dec_off[id];
		if (dl > t->max_token_bytes)
			t->max_token_bytes = dl;
	}
	t->dec_off[t->n_vocab] = o;
	return 0;
}

static int32_t special_first_byte(const struct kvd_tokenizer *t, int32_t id)
{
	return (unsigned char)t->text[t->text_off[id]];
}

static int cmp_special(const void *pa, const void *pb, void *arg)
{
	const struct kvd_tokenizer *t = arg;
	int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
	int32_t fa = special_first_byte(t, a), fb = special_first_byte(t, b);
	if (fa != fb)
		return fa < fb ? -1 : 1;
	uint32_t la = t->text_off[a + 1] - t->text_off[a], lb = t->text_off[b + 1] - t->text_off[b];
	if (la != lb)
		return la > lb ? -1 : 1;
	return a < b ? -1 : a > b;
}

static int build_specials(struct kvd_tokenizer *t)
{
	size_t n = 0;
	for (int32_t id = 0; id < t->n_vocab; id++) {
		int ty = t->type[id];
		if ((ty == KVD_TOKEN_CONTROL || ty == KVD_TOKEN_USER || ty == KVD_TOKEN_UNKNOWN) &&
		    t->text_off[id + 1] > t->text_off[id]) {
			t->flags[id] |= TOKF_SPECIAL | (ty == KVD_TOKEN_USER ? 0 : TOKF_PARSE);
			n++;
		}
	}
	t->special = malloc((n ? n : 1) * sizeof(*t->special));
	if (!t->special)
		return -ENOMEM;
	n = 0;
	for (int32_t id = 0; id < t->n_vocab; id++)
		if (t->flags[id] & TOKF_SPECIAL)
			t->special[n++] = id;
	qsort_r(t->special, n, sizeof(*t->special), cmp_special, t);
	size_t j = 0;
	for (unsigned c = 0; c < 256; c++) {
		t->special_start[c] = (uint32_t)j;
		while (j < n && special_first_byte(t, t->special[j]) == (int32_t)c)
			j++;
	}
	t->special_start[256] = (uint32_t)n;
	for (unsigned c = 0; c < 256; c++)
		t->special_starts[c] = t->special_start[c + 1] > t->special_start[c];
	return 0;
}

static void build_byte_tokens(struct kvd_tokenizer *t)
{
	for (unsigned b = 0; b < 256; b++) {
		int32_t id = -1;
		if (t->model == MODEL_BPE) {
			char s[4];
			size_t l = kvd_utf8_encode(byte_to_cp(b), s);
			id = text_lookup(t, s, l);
		} else {
			char s[8];
			snprintf(s, sizeof(s), "<0x%02X>", b);
			id = text_lookup(t, s, 6);
			if (id < 0 && b < 0x80) {
				s[0] = (char)b;
				id = text_lookup(t, s, 1);
			}
		}
		t->byte_tok[b] = id;
	}
}

/* End-of-generation tokens: the ids the file names, plus tokens whose text
 * marks the end of a turn in well-known vocabularies. */
static void build_eog(struct kvd_tokenizer *t, int32_t eom)
{
	/* In order of preference for EOT when the file names none. */
	static const char *const eot_texts[] = {
		"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
		"_<EOT>", "<end_of_utterance>",
	};
	static const char *const other_eog_texts[] = { "<|eom_id|>", "<|end_of_text|>" };
	for (size_t i = 0; i < sizeof(eot_texts) / sizeof(eot_texts[0]); i++) {
		int32_t id = text_lookup(t, eot_texts[i], strlen(eot_texts[i]));
		if (id < 0)
			continue;
		t->flags[id] |= TOKF_EOG;
		if (t->eot < 0)
			t->eot = id;
	}
	for (size_t i = 0; i < sizeof(other_eog_texts) / sizeof(other_eog_texts[0]); i++) {
		int32_t id = text_lookup(t, other_eog_texts[i], strlen(other_eog_texts[i]));
		if (id >= 0)
			t->flags[id] |= TOKF_EOG;
	}
	if (t->eos >= 0)
		t->flags[t->eos] |= TOKF_EOG;
	if (t->eot >= 0)
		t->flags[t->eot] |= TOKF_EOG;
	if (eom >= 0)
		t->flags[eom] |= TOKF_EOG;
}

/* The ChatML default system message: the literal text a template puts
 * between "<|im_start|>system\n" and "<|im_end|>" when that text is a plain
 * string (no expressions). Jinja string escapes are undone. */
static int find_chatml_system(struct kvd_tokenizer *t, const char *tp, size_t n)
{
	static const char head[] = "<|im_start|>system";
	const char *end = tp + n;
	for (const char *p = memmem(tp, n, head, sizeof(head) - 1); p;
	     p = memmem(p + 1, (size_t)(end - p - 1), head, sizeof(head) - 1)) {
		const char *q = p + sizeof(head) - 1;
		if (q < end && *q == '\n')
			q += 1;
		else if (end - q >= 2 && q[0] == '\\' && q[1] == 'n')
			q += 2;
		else
			continue;
		const char *stop = memmem(q, (size_t)(end - q), "<|im_end|>", 10);
		if (!stop || stop == q)
			continue;
		char *msg = malloc((size_t)(stop - q) + 1);
		if (!msg)
			return -ENOMEM;
		size_t m = 0;
		bool ok = true;
		for (const char *c = q; c < stop && ok; c++) {
			if (*c == '\\' && c + 1 < stop) {
				c++;
				switch (*c) {
				case 'n': msg[m++] = '\n'; break;
				case 't': msg[m++] = '\t'; break;
				case '\\': case '\'': case '"': msg[m++] = *c; break;
				default: ok = false; break;
				}
			} else if (*c == '\'' || *c == '"' || *c == '{' || *c == '}') {
				ok = false; /* not one plain literal */
			} else {
				msg[m++] = *c;
			}
		}
		if (!ok) {
			free(msg);
			continue;
		}
		msg[m] = '\0';
		t->chat_system = msg;
		t->chat_system_len = m;
		return 0;
	}
	return 0;
}

static int load_chat_template(struct kvd_tokenizer *t, const struct gguf_file *f)
{
	const char *tp;
	size_t n;
	if (gguf_get_str(f, "tokenizer.chat_template", &tp, &n) < 0 || n == 0) {
		/* No template: Gemma's turns when the vocabulary has them as
		 * control tokens (Gemma 3 files come without a template), else
		 * plain ChatML. */
		int32_t so = text_lookup(t, "<start_of_turn>", 15), eo = text_lookup(t, "<end_of_turn>", 13);
		t->chat = so >= 0 && eo >= 0 && t->type[so] == KVD_TOKEN_CONTROL && t->type[eo] == KVD_TOKEN_CONTROL ? CHAT_GEMMA
													  : CHAT_CHATML;
		return 0;
	}
	if (n > KVD_CHAT_TEMPLATE_MAX_BYTES) {
		t->chat = CHAT_UNKNOWN;
		return 0;
	}
	if (mem_contains(tp, n, "<|im_start|>")) {
		t->chat = CHAT_CHATML;
		return find_chatml_system(t, tp, n);
	}
	if (mem_contains(tp, n, "<start_of_turn>") && mem_contains(tp, n, "<end_of_turn>")) {
		t->chat = CHAT_GEMMA;
	} else if (mem_contains(tp, n, "<|start_header_id|>") && mem_contains(tp, n, "<|end_header_id|>")) {
		t->chat = CHAT_LLAMA3;
	} else if (mem_contains(tp, n, "[INST]")) {
		t->chat = CHAT_LLAMA2;
		t->l2_sys = mem_contains(tp, n, "<<SYS>>");
	} else if (mem_contains(tp, n, "<|user|>") && mem_contains(tp, n, "<|assistant|>")) {
		t->chat = CHAT_ZEPHYR;
		/* A turn ends with <|end|> in Phi-3's variant, with the EOS token's
		 * text when the template says eos_token, else with <|endoftext|>. */
		if (mem_contains(tp, n, "<|end|>"))
			t->zephyr_end = ZEPHYR_END_PHI3;
		else if (mem_contains(tp, n, "eos_token") && t->eos >= 0)
			t->zephyr_end = ZEPHYR_END_EOS;
		else
			t->zephyr_end = ZEPHYR_END_ENDOFTEXT;
	} else {
		t->chat = CHAT_UNKNOWN;
	}
	return 0;
}

int kvd_tokenizer_from_gguf(const struct gguf_file *f, struct kvd_tokenizer **ret, char *err, size_t errlen)
{
	const char *s;
	size_t n;
	int r;

	if (err && errlen)
		err[0] = '\0';
	struct kvd_tokenizer *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;

	if (gguf_get_str(f, "tokenizer.ggml.model", &s, &n) < 0) {
		r = fail(err, errlen, f, -EBADMSG, "no tokenizer.ggml.model");
		goto out;
	}
	if (n == 4 && memcmp(s, "gpt2", 4) == 0) {
		t->model = MODEL_BPE;
	} else if (n == 5 && memcmp(s, "llama", 5) == 0) {
		t->model = MODEL_SPM;
	} else {
		r = fail(err, errlen, f, -ENOTSUP, "tokenizer model '%.*s' is not supported", (int)(n < 64 ? n : 64), s);
		goto out;
	}
	if (t->model == MODEL_BPE) {
		const char *pre = NULL;
		size_t pn = 0;
		if (gguf_get_str(f, "tokenizer.ggml.pre", &pre, &pn) < 0)
			pre = NULL;
		if (set_pre(t, pre, pn) < 0) {
			r = fail(err, errlen, f, -ENOTSUP, "pre-tokenizer '%.*s' is not supported",
				 (int)(pn < 64 ? pn : 64), pre);
			goto out;
		}
	}

	if ((r = load_tokens(t, f, err, errlen)) < 0)
		goto out;
	if (t->model == MODEL_BPE && (r = load_merges(t, f, err, errlen)) < 0)
		goto out;
	if (t->model == MODEL_SPM) {
		enum gguf_vtype vt;
		uint64_t ns;
		t->score = calloc((size_t)t->n_vocab, sizeof(*t->score));
		if (!t->score) {
			r = -ENOMEM;
			goto out;
		}
		if (gguf_get_arr(f, "tokenizer.ggml.scores", &vt, &ns) == 0) {
			if (ns != (uint64_t)t->n_vocab) {
				r = fail(err, errlen, f, -EBADMSG, "tokenizer.ggml.scores has %llu entries for %d tokens",
					 (unsigned long long)ns, t->n_vocab);
				goto out;
			}
			for (int32_t i = 0; i < t->n_vocab; i++)
				if (gguf_arr_f32(f, "tokenizer.ggml.scores", (uint64_t)i, &t->score[i]) < 0) {
					r = fail(err, errlen, f, -EBADMSG, "tokenizer.ggml.scores is not a float array");
					goto out;
				}
		}
	}

	int32_t eom = -1;
	if ((r = get_token_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err, errlen)) < 0 ||
	    (r = get_token_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err, errlen)) < 0 ||
	    (r = get_token_id(f, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err, errlen)) < 0 ||
	    (r = get_token_id(f, "tokenizer.ggml.eom_token_id", t->n_vocab, &eom, err, errlen)) < 0 ||
	    (r = get_token_id(f, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err, errlen)) < 0)
		goto out;

	int b;
	t->add_bos = t->model == MODEL_SPM;
	if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) == 0)
		t->add_bos = b;
	t->add_space_prefix = t->model == MODEL_SPM;
	if (gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b) == 0)
		t->add_space_prefix = b;

	if ((r = build_decoded(t)) < 0 || (r = build_specials(t)) < 0)
		goto out;
	build_byte_tokens(t);
	build_eog(t, eom);
	if ((r = load_chat_template(t, f)) < 0)
		goto out;

	*ret = t;
	return 0;
out:
	if (r == -ENOMEM)
		fail(err, errlen, f, r, "out of memory building the tokenizer");
	kvd_tokenizer_free(t);
	return r;
}

/* ---- accessors ----------------------------------------------------------- */

int32_t kvd_tokenizer_n_vocab(const struct kvd_tokenizer *t) { return t->n_vocab; }
int32_t kvd_tokenizer_bos(const struct kvd_tokenizer *t) { return t->bos; }
int32_t kvd_tokenizer_eos(const struct kvd_tokenizer *t) { return t->eos; }
int32_t kvd_tokenizer_eot(const struct kvd_tokenizer *t) { return t->eot; }
int kvd_tokenizer_add_bos(const struct kvd_tokenizer *t) { return t->add_bos; }
size_t kvd_tokenizer_max_token_bytes(const struct kvd_tokenizer *t) { return t->max_token_bytes; }

int kvd_tokenizer_is_eog(const struct kvd_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_EOG);
}

int kvd_tokenizer_token_type(const struct kvd_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}

const char *kvd_tokenizer_token_text(const struct kvd_tokenizer *t, int32_t id, size_t *ret_len)
{
	if (id < 0 || id >= t->n_vocab)
		return NULL;
	return tok_text(t, id, ret_len);
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

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t n = *cap ? *cap : 64;
	while (n < need)
		n *= 2;
	void *q = realloc(*p, n * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

/* ---- pre-tokenizer passes ------------------------------------------------ */

struct cpi {
	uint32_t cp;
	unsigned flags;
	unsigned len; /* 0 past the end */
};

#define OUT_OF_RANGE 0xFFFFFFFFu

/* The character at s[pos..end): a pass never looks past its piece. */
static inline struct cpi cp_at(const unsigned char *s, size_t pos, size_t end)
{
	struct cpi c = { OUT_OF_RANGE, 0, 0 };
	if (pos >= end)
		return c;
	if (s[pos] < 0x80) {
		c.cp = s[pos];
		c.len = 1;
	} else {
		c.len = (unsigned)kvd_utf8_decode_lenient(s + pos, end - pos, &c.cp);
	}
	c.flags = kvd_unicode_flags(c.cp);
	return c;
}

#define F_LNS (KVD_CPF_LETTER | KVD_CPF_NUMBER | KVD_CPF_SPACE)

static inline unsigned ascii_lower(unsigned c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's 't 're 've 'm 'll 'd at s[pos] (which is '\''), case-folded or not. */
static size_t match_contraction(const unsigned char *s, size_t pos, size_t end, bool fold)
{
	if (pos + 1 >= end)
		return 0;
	unsigned a = fold ? ascii_lower(s[pos + 1]) : s[pos + 1];
	if (a == 's' || a == 't' || a == 'm' || a == 'd')
		return 2;
	if (pos + 2 < end) {
		unsigned b = fold ? ascii_lower(s[pos + 2]) : s[pos + 2];
		if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
			return 3;
	}
	return 0;
}

/* Trailing white space: \s+(?!\S) leaves the last space of a run to the
 * word that follows; a run at the end of the piece is taken whole. */
static size_t match_spaces(const unsigned char *s, size_t pos, size_t end, bool newline_rule)
{
	size_t p = pos, last = pos, after_rn = 0;
	unsigned k = 0;
	for (;;) {
		struct cpi x = cp_at(s, p, end);
		if (!(x.flags & KVD_CPF_SPACE))
			break;
		if (x.cp == '\r' || x.cp == '\n')
			after_rn = p + 1;
		last = p;
		p += x.len;
		k++;
	}
	if (newline_rule && after_rn)
		return after_rn - pos; /* \s*[\r\n]+ */
	if (k > 1 && p < end)
		return last - pos;     /* \s+(?!\S) */
	return p - pos;                /* \s+ (0 if none) */
}

static size_t match_gpt2(const unsigned char *s, size_t pos, size_t end)
{
	struct cpi c = cp_at(s, pos, end);
	size_t m;
	if (c.cp == '\'' && (m = match_contraction(s, pos, end, false)))
		return m;
	unsigned f2 = c.cp == ' ' ? cp_at(s, pos + 1, end).flags : c.flags;
	unsigned want = 0;
	if (f2 & KVD_CPF_LETTER)
		want = KVD_CPF_LETTER;
	else if (f2 & KVD_CPF_NUMBER)
		want = KVD_CPF_NUMBER;
	if (want || (!(f2 & F_LNS) && f2)) {
		size_t p = pos + (c.cp == ' ');
		for (;;) {
			struct cpi x = cp_at(s, p, end);
			if (want ? !(x.flags & want) : ((x.flags & F_LNS) || !x.flags))
				break;
			p += x.len;
		}
		return p - pos;
	}
	m = match_spaces(s, pos, end, false);
	return m ? m : c.len;
}

static size_t match_llama3(const unsigned char *s, size_t pos, size_t end, unsigned max_digits)
{
	struct cpi c = cp_at(s, pos, end);
	size_t m;
	if (c.cp == '\'' && (m = match_contraction(s, pos, end, true)))
		return m;
	/* [^\r\n\p{L}\p{N}]?\p{L}+ */
	if (!(c.cp == '\r' || c.cp == '\n' || (c.flags & KVD_CPF_NUMBER)) &&
	    ((c.flags & KVD_CPF_LETTER) || (cp_at(s, pos + c.len, end).flags & KVD_CPF_LETTER))) {
		size_t p = pos + c.len;
		for (struct cpi x; (x = cp_at(s, p, end)).flags & KVD_CPF_LETTER;)
			p += x.len;
		return p - pos;
	}
	/* \p{N}{1,max_digits} */
	if (c.flags & KVD_CPF_NUMBER) {
		size_t p = pos;
		unsigned k = 0;
		for (struct cpi x; k < max_digits && ((x = cp_at(s, p, end)).flags & KVD_CPF_NUMBER); k++)
			p += x.len;
		return p - pos;
	}
	/* ?[^\s\p{L}\p{N}]+[\r\n]* */
	unsigned f2 = c.cp == ' ' ? cp_at(s, pos + 1, end).flags : c.flags;
	if (!(f2 & F_LNS) && c.flags) {
		size_t p = pos + (c.cp == ' ');
		for (struct cpi x; (x = cp_at(s, p, end)).flags && !(x.flags & F_LNS);)
			p += x.len;
		while (p < end && (s[p] == '\r' || s[p] == '\n'))
			p++;
		return p - pos;
	}
	m = match_spaces(s, pos, end, true);
	return m ? m : c.len;
}

static bool punct_run_char(struct cpi x, bool backtick)
{
	if (x.flags & KVD_CPF_PUNCT)
		return true;
	switch (x.cp) {
	case '$': case '+': case '<': case '=': case '>': case '^': case '~': case '|':
		return true;
	case '`':
		return backtick;
	default:
		return false;
	}
}

/* DeepSeek LLM's letter class: inclusive code point ranges, sorted. */
static const uint32_t ds_letters[][2] = {
	{0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
	{0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D},
	{0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5},
	{0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
	{0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A},
	{0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57},
	{0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4},
	{0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3},
	{0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
	{0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124},
	{0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139},
	{0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B},
	{0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B},
	{0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06},
	{0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3},
	{0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

static bool in_ranges(uint32_t cp, const uint32_t (*r)[2], size_t n)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (cp < r[mid][0])
			hi = mid;
		else if (cp > r[mid][1])
			lo = mid + 1;
		else
			return true;
	}
	return false;
}

static bool ds_letter(uint32_t cp)
{
	return in_ranges(cp, ds_letters, sizeof(ds_letters) / sizeof(ds_letters[0]));
}

static bool ds_punct(uint32_t cp)
{
	return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x7E) || (cp >= 0xFF01 && cp <= 0xFF0F) ||
	       (cp >= 0xFF1A && cp <= 0xFF5E) || (cp >= 0x2018 && cp <= 0x201F) || (cp >= 0x3000 && cp <= 0x3002);
}

static bool cjk(uint32_t cp)
{
	return (cp >= 0x0800 && cp <= 0x9FA5) || (cp >= 0xAC00 && cp <= 0xD7FF);
}

static bool ascii_space(uint32_t cp)
{
	return cp == ' ' || (cp >= '\t' && cp <= '\r');
}

/* \s?X+ at pos, X given by in_class (on code points) and \s by space. */
static size_t match_sp_run(const unsigned char *s, size_t pos, size_t end, bool (*in_class)(struct cpi),
			   bool unicode_space)
{
	struct cpi c = cp_at(s, pos, end);
	size_t p = pos;
	if ((unicode_space ? (c.flags & KVD_CPF_SPACE) != 0 : ascii_space(c.cp)) && !in_class(c)) {
		struct cpi d = cp_at(s, pos + c.len, end);
		if (!d.len || !in_class(d))
			return 0;
		p += c.len;
	}
	for (struct cpi x; (x = cp_at(s, p, end)).len && in_class(x);)
		p += x.len;
	return p - pos;
}

static bool cls_letter(struct cpi x) { return (x.flags & KVD_CPF_LETTER) != 0; }
static bool cls_punct(struct cpi x) { return (x.flags & KVD_CPF_PUNCT) != 0; }
static bool cls_ds_letter(struct cpi x) { return ds_letter(x.cp); }
static bool cls_ds_punct(struct cpi x) { return ds_punct(x.cp); }

/* Length of the match of `pass` starting exactly at s[pos], 0 for none. */
static size_t match(enum pre_pass pass, const unsigned char *s, size_t pos, size_t end)
{
	size_t p = pos;
	struct cpi x;
	switch (pass) {
	case PASS_GPT2:
		return match_gpt2(s, pos, end);
	case PASS_LLAMA3:
		return match_llama3(s, pos, end, 3);
	case PASS_QWEN2:
		return match_llama3(s, pos, end, 1);
	case PASS_NUMBER:
		x = cp_at(s, pos, end);
		return (x.flags & KVD_CPF_NUMBER) ? x.len : 0;
	case PASS_NUMBER_RUN:
		while ((x = cp_at(s, p, end)).flags & KVD_CPF_NUMBER)
			p += x.len;
		return p - pos;
	case PASS_DIGITS3:
		if (end - pos >= 3 && (unsigned)(s[pos] - '0') < 10u && (unsigned)(s[pos + 1] - '0') < 10u &&
		    (unsigned)(s[pos + 2] - '0') < 10u)
			return 3;
		return 0;
	case PASS_PUNCT_DEFAULT:
	case PASS_PUNCT_FALCON:
		while ((x = cp_at(s, p, end)).len && punct_run_char(x, pass == PASS_PUNCT_FALCON))
			p += x.len;
		return p - pos;
	case PASS_NEWLINE:
		return pos < end && (s[pos] == '\r' || s[pos] == '\n');
	case PASS_SP_LETTERS:
		return match_sp_run(s, pos, end, cls_letter, true);
	case PASS_SP_PUNCT:
		return match_sp_run(s, pos, end, cls_punct, true);
	case PASS_DS_LETTERS:
		return match_sp_run(s, pos, end, cls_ds_letter, false);
	case PASS_DS_PUNCT:
		return match_sp_run(s, pos, end, cls_ds_punct, false);
	case PASS_CJK:
		while ((x = cp_at(s, p, end)).len && cjk(x.cp))
			p += x.len;
		return p - pos;
	case PASS_TRAILING_SP:
		return 0; /* split in pre_split(), in one backward scan */
	}
	return 0;
}

static int bpe_word(struct tok_call *c, const unsigned char *p, size_t n);

/* Run pass `k` over s[a..b): matches and the text between them become
 * pieces for the next pass; after the last pass, words for BPE. */
static int pre_split(struct tok_call *c, unsigned k, const unsigned char *s, size_t a, size_t b)
{
	const struct kvd_tokenizer *t = c->t;
	int r;
	if (k == t->n_passes)
		return bpe_word(c, s + a, b - a);
	if (t->passes[k] == PASS_TRAILING_SP) {
		/* \s+$: the piece's trailing white space (ASCII bytes, so a
		 * backward byte scan never lands inside a character) */
		size_t e = b;
		while (e > a && ascii_space(s[e - 1]))
			e--;
		if (e > a && (r = pre_split(c, k + 1, s, a, e)) < 0)
			return r;
		return e < b ? pre_split(c, k + 1, s, e, b) : 0;
	}
	size_t pos = a, gap = a;
	while (pos < b) {
		size_t m = match(t->passes[k], s, pos, b);
		if (m == 0) {
			pos += cp_at(s, pos, b).len;
			continue;
		}
		if (gap < pos && (r = pre_split(c, k + 1, s, gap, pos)) < 0)
			return r;
		if ((r = pre_split(c, k + 1, s, pos, pos + m)) < 0)
			return r;
		pos += m;
		gap = pos;
	}
	if (gap < b && (r = pre_split(c, k + 1, s, gap, b)) < 0)
		return r;
	return 0;
}

/* ---- byte-level BPE ------------------------------------------------------ */

static inline bool cand_less(struct bpe_cand x, struct bpe_cand y)
{
	return x.rank < y.rank || (x.rank == y.rank && x.left < y.left);
}

DEFINE_CAND_HEAP(bpe, struct bpe_cand, cand_less)

static void bpe_push(struct tok_call *c, int32_t left)
{
	const struct kvd_tokenizer *t = c->t;
	struct bpe_sym *sym = c->sym;
	if (left < 0)
		return;
	int32_t right = sym[left].next;
	if (right < 0 || sym[left].id < 0 || sym[right].id < 0)
		return;
	const struct merge_slot *m = merge_lookup(t, sym[left].id, sym[right].id);
	if (!m)
		return;
	bpe_heap_add(c, (struct bpe_cand){ m->rank, left });
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

/* One pre-token p[0..n) of a byte-level vocabulary. */
static int bpe_word(struct tok_call *c, const unsigned char *p, size_t n)
{
	const struct kvd_tokenizer *t = c->t;
	if (n == 0)
		return 0;
	if (n == 1) {
		emit_symbol(c, t->byte_tok[p[0]]);
		return 0;
	}
	if (t->ignore_merges) {
		if (grow((void **)&c->buf, &c->buf_cap, 2 * n, 1) < 0)
			return -ENOMEM;
		size_t l = 0;
		for (size_t i = 0; i < n; i++)
			l += kvd_utf8_encode(byte_to_cp(p[i]), c->buf + l);
		int32_t id = text_lookup(t, c->buf, l);
		if (id >= 0) {
			emit(c, id);
			return 0;
		}
	}
	if (n > INT32_MAX / 4)
		return -E2BIG;
	if (grow(&c->sym, &c->sym_cap, n, sizeof(struct bpe_sym)) < 0 ||
	    grow(&c->heap, &c->heap_cap, 3 * n, sizeof(struct bpe_cand)) < 0)
		return -ENOMEM;
	struct bpe_sym *sym = c->sym;
	for (size_t i = 0; i < n; i++) {
		sym[i].id = t->byte_tok[p[i]];
		sym[i].prev = (int32_t)i - 1;
		sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
	}
	c->heap_n = 0;
	for (size_t i = 0; i + 1 < n; i++)
		bpe_push(c, (int32_t)i);
	while (c->heap_n) {
		struct bpe_cand b = bpe_pop(c);
		int32_t l = b.left, r = sym[l].next;
		/* Stale when either side has changed since the pair was queued. */
		if (sym[l].id < 0 || r < 0 || sym[r].id < 0)
			continue;
		const struct merge_slot *m = merge_lookup(t, sym[l].id, sym[r].id);
		if (!m || m->rank != b.rank)
			continue;
		sym[l].id = m->result;
		sym[l].next = sym[r].next;
		if (sym[r].next >= 0)
			sym[sym[r].next].prev = l;
		sym[r].id = -2;
		bpe_push(c, sym[l].prev);
		bpe_push(c, l);
	}
	for (int32_t i = 0; i >= 0; i = sym[i].next)
		emit_symbol(c, sym[i].id);
	return 0;
}

/* ---- SentencePiece BPE --------------------------------------------------- */

static inline bool spm_better(struct spm_cand x, struct spm_cand y)
{
	return x.score > y.score || (x.score == y.score && x.left < y.left);
}

DEFINE_CAND_HEAP(spm, struct spm_cand, spm_better)

static void spm_push(struct tok_call *c, int32_t left, int32_t right)
{
	const struct kvd_tokenizer *t = c->t;
	struct spm_sym *sym = c->sym;
	if (left < 0 || right < 0)
		return;
	uint32_t len = sym[left].len + sym[right].len;
	int32_t id = text_lookup(t, c->buf + sym[left].off, len);
	if (id < 0)
		return;
	spm_heap_add(c, (struct spm_cand){ t->score[id], left, right, len });
}

static const uint8_t utf8_len_by_nibble[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };

/* One raw fragment of an SPM vocabulary: spaces become U+2581 (and one is
 * prepended when asked), then characters merge by best token score. */
static int spm_fragment(struct tok_call *c, const char *s, size_t n, bool prefix_space)
{
	const struct kvd_tokenizer *t = c->t;
	if (n > (SIZE_MAX - 3) / 3 || 3 * n + 3 > INT32_MAX)
		return -E2BIG;
	if (grow((void **)&c->buf, &c->buf_cap, 3 * n + 3, 1) < 0)
		return -ENOMEM;
	size_t l = 0;
	if (prefix_space) {
		memcpy(c->buf, "\xE2\x96\x81", 3);
		l = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(c->buf + l, "\xE2\x96\x81", 3);
			l += 3;
		} else {
			c->buf[l++] = s[i];
		}
	}
	size_t ns = 0;
	for (size_t i = 0; i < l;)
		i += utf8_len_by_nibble[(unsigned char)c->buf[i] >> 4], ns++;
	if (grow(&c->sym, &c->sym_cap, ns, sizeof(struct spm_sym)) < 0 ||
	    grow(&c->heap, &c->heap_cap, 3 * ns, sizeof(struct spm_cand)) < 0)
		return -ENOMEM;
	struct spm_sym *sym = c->sym;
	size_t k = 0;
	for (size_t i = 0; i < l; k++) {
		size_t cl = utf8_len_by_nibble[(unsigned char)c->buf[i] >> 4];
		if (cl > l - i)
			cl = l - i;
		sym[k].off = (uint32_t)i;
		sym[k].len = (uint32_t)cl;
		sym[k].prev = (int32_t)k - 1;
		i += cl;
		sym[k].next = i < l ? (int32_t)k + 1 : -1;
	}
	c->heap_n = 0;
	for (size_t i = 1; i < ns; i++)
		spm_push(c, (int32_t)i - 1, (int32_t)i);
	while (c->heap_n) {
		struct spm_cand b = spm_pop(c);
		struct spm_sym *L = &sym[b.left], *R = &sym[b.right];
		if (L->len == 0 || R->len == 0 || L->next != b.right || L->len + R->len != b.len)
			continue;
		L->len += R->len;
		R->len = 0;
		L->next = R->next;
		if (R->next >= 0)
			sym[R->next].prev = b.left;
		spm_push(c, L->prev, b.left);
		spm_push(c, b.left, L->next);
	}
	for (int32_t i = ns ? 0 : -1; i >= 0; i = sym[i].next) {
		int32_t id = text_lookup(t, c->buf + sym[i].off, sym[i].len);
		if (id >= 0) {
			emit(c, id);
			continue;
		}
		/* A character without a token: its bytes, as byte tokens. */
		for (uint32_t j = 0; j < sym[i].len; j++)
			emit_symbol(c, t->byte_tok[(unsigned char)c->buf[sym[i].off + j]]);
	}
	return 0;
}

/* ---- kvd_tokenize -------------------------------------------------------- */

/* Longest special token whose text starts at s[0..n), or -1. */
static int32_t match_special(const struct kvd_tokenizer *t, const char *s, size_t n, bool parse_special,
			     size_t *ret_len)
{
	unsigned c0 = (unsigned char)s[0];
	for (uint32_t i = t->special_start[c0]; i < t->special_start[c0 + 1]; i++) {
		int32_t id = t->special[i];
		if (!parse_special && (t->flags[id] & TOKF_PARSE))
			continue;
		size_t len;
		const char *tx = tok_text(t, id, &len);
		if (len <= n && memcmp(tx, s, len) == 0) {
			*ret_len = len;
			return id;
		}
	}
	return -1;
}

/* Raw text between special tokens. Every such fragment starts the text or
 * follows a special token, which is where SPM prepends its space. */
static int raw_fragment(struct tok_call *c, const char *s, size_t n)
{
	if (n == 0)
		return 0;
	if (c->t->model == MODEL_SPM)
		return spm_fragment(c, s, n, c->t->add_space_prefix);
	return pre_split(c, 0, (const unsigned char *)s, 0, n);
}

int kvd_tokenize(const struct kvd_tokenizer *t, const char *text, size_t len, int add_bos,
		 int parse_special, int32_t *out, size_t max_out)
{
	if (len > KVD_TOKENIZE_MAX_BYTES)
		return -E2BIG;
	if ((!text && len) || (!out && max_out))
		return -EINVAL;

	struct tok_call c = { .t = t, .out = out, .max_out = max_out };
	int r = 0;
	if (add_bos && t->bos >= 0)
		emit(&c, t->bos);

	/* Cut the text at special tokens; what lies between is raw text. */
	size_t frag = 0;
	for (size_t pos = 0; pos < len;) {
		size_t sl;
		int32_t id;
		if (!t->special_starts[(unsigned char)text[pos]] ||
		    (id = match_special(t, text + pos, len - pos, parse_special, &sl)) < 0) {
			pos++;
			continue;
		}
		if (pos > frag && (r = raw_fragment(&c, text + frag, pos - frag)) < 0)
			goto out;
		emit(&c, id);
		pos += sl;
		frag = pos;
	}
	if (len > frag)
		r = raw_fragment(&c, text + frag, len - frag);
out:
	free(c.sym);
	free(c.heap);
	free(c.buf);
	if (r < 0)
		return r;
	return c.n_out > INT_MAX ? -E2BIG : (int)c.n_out;
}

/* ---- detokenizing -------------------------------------------------------- */

int kvd_token_to_bytes(const struct kvd_tokenizer *t, int32_t id, int render_special, char *buf, size_t buflen)
{
	if (id < 0 || id >= t->n_vocab)
		return -EINVAL;
	if ((t->flags[id] & TOKF_HIDDEN) && !render_special)
		return 0;
	size_t n = t->dec_off[id + 1] - t->dec_off[id];
	if (buf && buflen)
		memcpy(buf, t->dec + t->dec_off[id], n < buflen ? n : buflen);
	return (int)n;
}

void kvd_detok_init(struct kvd_detok *d)
{
	memset(d, 0, sizeof(*d));
}

int kvd_detok_push(const struct kvd_tokenizer *t, struct kvd_detok *d, int32_t id, char *out, size_t cap)
{
	if (id < 0 || id >= t->n_vocab || d->n_pending > 3)
		return -EINVAL;
	size_t tl = 0;
	const char *tb = "";
	if (!(t->flags[id] & TOKF_HIDDEN)) {
		tl = t->dec_off[id + 1] - t->dec_off[id];
		tb = t->dec + t->dec_off[id];
	}
	/* Work on held bytes + token bytes; commit only when all output fits. */
	unsigned char work[KVD_TOKENIZER_MAX_TOKEN_BYTES + 8];
	size_t total = d->n_pending + tl;
	memcpy(work, d->pending, d->n_pending);
	memcpy(work + d->n_pending, tb, tl);

	size_t pos = 0, o = 0;
	while (pos < total) {
		uint32_t cp;
		int r = kvd_utf8_decode_strict(work + pos, total - pos, &cp);
		if (r == 0)
			break; /* an incomplete character at the end: hold it */
		if (r > 0) {
			if (o + (size_t)r > cap)
				return -ENOBUFS;
			memcpy(out + o, work + pos, (size_t)r);
			o += (size_t)r;
			pos += (size_t)r;
		} else {
			if (o + 3 > cap)
				return -ENOBUFS;
			memcpy(out + o, "\xEF\xBF\xBD", 3);
			o += 3;
			pos += (size_t)-r;
		}
	}
	d->n_pending = (uint32_t)(total - pos);
	memcpy(d->pending, work + pos, d->n_pending);
	return (int)o;
}

int kvd_detok_flush(struct kvd_detok *d, char *out, size_t cap)
{
	if (d->n_pending == 0)
		return 0;
	if (cap < 3)
		return -ENOBUFS;
	memcpy(out, "\xEF\xBF\xBD", 3);
	d->n_pending = 0;
	return 3;
}

/* ---- chat templates ------------------------------------------------------ */

struct sbuf {
	char *out;
	size_t cap;
	size_t len;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->len < b->cap) {
		size_t room = b->cap - b->len;
		memcpy(b->out + b->len, s, n < room ? n : room);
	}
	b->len += n;
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

/* Python's str.isspace(), which Jinja's trim and str.strip() use. */
static bool py_space(uint32_t cp)
{
	return (cp >= 0x1C && cp <= 0x1F) || (kvd_unicode_flags(cp) & KVD_CPF_SPACE);
}

/* s[0..n) without leading and trailing white space, as str.strip(). */
static const char *py_strip(const char *s, size_t *n)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t a = 0, b = *n;
	while (a < b) {
		uint32_t cp;
		size_t l = kvd_utf8_decode_lenient(u + a, b - a, &cp);
		if (!py_space(cp))
			break;
		a += l;
	}
	while (b > a) {
		size_t k = b - 1;
		while (k > a && (u[k] & 0xC0) == 0x80 && b - k < 4)
			k--;
		uint32_t cp;
		size_t l = kvd_utf8_decode_lenient(u + k, b - k, &cp);
		if (l != b - k || !py_space(cp))
			break;
		b = k;
	}
	*n = b - a;
	return s + a;
}

static void sb_stripped(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);
	s = py_strip(s, &n);
	sb_put(b, s, n);
}

static void sb_eos(struct sbuf *b, const struct kvd_tokenizer *t, const char *fallback)
{
	size_t el;
	if (t->eos >= 0 && t->text_off[t->eos + 1] > t->text_off[t->eos]) {
		const char *e = tok_text(t, t->eos, &el);
		sb_put(b, e, el);
	} else {
		sb_str(b, fallback);
	}
}

/*
 * Llama-2-chat: a leading system message goes into the first user turn as
 * a <<SYS>> block, each user turn is "[INST] content [/INST]" (stripped,
 * with BOS text before every turn but the first), each assistant turn
 * " content </s>". Without <<SYS>> in the template the system text opens
 * the first user turn, followed by a blank line.
 */
static int render_llama2(struct sbuf *b, const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs,
			 size_t n_msgs)
{
	const char *sys = NULL;
	size_t i = 0, users = 0;
	if (n_msgs && strcmp(msgs[0].role, "system") == 0)
		sys = msgs[i++].content;
	for (; i < n_msgs; i++) {
		if (strcmp(msgs[i].role, "user") == 0) {
			if (users++ > 0) {
				if (t->bos >= 0) {
					size_t bl;
					const char *bos = tok_text(t, t->bos, &bl);
					sb_put(b, bos, bl);
				} else {
					sb_str(b, "<s>");
				}
			}
			sb_str(b, "[INST] ");
			if (sys && users == 1) {
				/* The template strips the combined text: build it first. */
				size_t sl = strlen(sys), cl = strlen(msgs[i].content);
				char *all = malloc(sl + cl + 32);
				if (!all)
					return -ENOMEM;
				int n = sprintf(all, t->l2_sys ? "<<SYS>>\n%s\n<</SYS>>\n\n%s" : "%s\n\n%s", sys,
						msgs[i].content);
				size_t al = (size_t)n;
				const char *s = py_strip(all, &al);
				sb_put(b, s, al);
				free(all);
			} else {
				sb_stripped(b, msgs[i].content);
			}
			sb_str(b, " [/INST]");
		} else if (strcmp(msgs[i].role, "assistant") == 0) {
			sb_str(b, " ");
			sb_stripped(b, msgs[i].content);
			sb_str(b, " ");
			sb_eos(b, t, "</s>");
		}
		/* A system message after the first turn has no place in this format. */
	}
	return 0;
}

int kvd_chat_render(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n_msgs,
		    int add_assistant, char *out, size_t cap)
{
	if (!msgs && n_msgs)
		return -EINVAL;
	for (size_t i = 0; i < n_msgs; i++) {
		const char *role = msgs[i].role;
		if (!role || !msgs[i].content ||
		    (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")))
			return -EINVAL;
	}
	if (!out)
		cap = 0;
	struct sbuf b = { out, cap, 0 };
	int r;

	switch (t->chat) {
	case CHAT_CHATML:
		if (n_msgs && t->chat_system && strcmp(msgs[0].role, "system") != 0) {
			sb_str(&b, "<|im_start|>system\n");
			sb_put(&b, t->chat_system, t->chat_system_len);
			sb_str(&b, "<|im_end|>\n");
		}
		for (size_t i = 0; i < n_msgs; i++) {
			sb_str(&b, "<|im_start|>");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "\n");
			sb_str(&b, msgs[i].content);
			sb_str(&b, "<|im_end|>\n");
		}
		if (add_assistant)
			sb_str(&b, "<|im_start|>assistant\n");
		break;
	case CHAT_LLAMA3:
		for (size_t i = 0; i < n_msgs; i++) {
			sb_str(&b, "<|start_header_id|>");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "<|end_header_id|>\n\n");
			sb_stripped(&b, msgs[i].content);
			sb_str(&b, "<|eot_id|>");
		}
		if (add_assistant)
			sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case CHAT_LLAMA2:
		if ((r = render_llama2(&b, t, msgs, n_msgs)) < 0)
			return r;
		break;
	case CHAT_GEMMA: {
		/* A leading system message becomes the first turn's prefix
		 * (content + "\n\n"); assistant turns are "model" turns, any
		 * other (a later system message) a user turn. Gemma's template
		 * refuses conversations that do not alternate user, assistant,
		 * ...; they are rendered here all the same. */
		size_t i0 = n_msgs && !strcmp(msgs[0].role, "system") ? 1 : 0;
		for (size_t i = i0; i < n_msgs; i++) {
			bool model = !strcmp(msgs[i].role, "assistant");
			sb_str(&b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
			if (i == i0 && i0) {
				sb_str(&b, msgs[0].content);
				sb_str(&b, "\n\n");
			}
			sb_stripped(&b, msgs[i].content);
			sb_str(&b, "<end_of_turn>\n");
		}
		if (add_assistant)
			sb_str(&b, "<start_of_turn>model\n");
		break;
	}
	case CHAT_ZEPHYR:
		for (size_t i = 0; i < n_msgs; i++) {
			sb_str(&b, "<|");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "|>\n");
			sb_str(&b, msgs[i].content);
			if (t->zephyr_end == ZEPHYR_END_EOS)
				sb_eos(&b, t, "</s>");
			else
				sb_str(&b, t->zephyr_end == ZEPHYR_END_PHI3 ? "<|end|>" : "<|endoftext|>");
			sb_str(&b, "\n");
		}
		if (t->zephyr_end == ZEPHYR_END_PHI3) {
			/* Phi-3 closes a conversation without a reply prompt with EOS. */
			if (add_assistant)
				sb_str(&b, "<|assistant|>\n");
			else
				sb_eos(&b, t, "<|endoftext|>");
		} else if (add_assistant && n_msgs) {
			/* Zephyr asks for the reply inside its message loop. */
			sb_str(&b, "<|assistant|>\n");
		}
		break;
	default:
		return -ENOTSUP;
	}
	if (cap)
		out[b.len < cap ? b.len : cap - 1] = '\0';
	return b.len > INT_MAX ? -E2BIG : (int)b.len;
}
