/*
 * daemon/model/tokenizer_load.c — building a kvd_tokenizer from a GGUF
 * file's metadata (tokenizer.ggml.*): token texts, types and scores, the
 * BPE merge map, the pre-tokenizer the file names, special and byte
 * tokens, end-of-generation tokens, each token's decoded bytes, and which
 * chat template family (with its default system message) the file carries,
 * with the tokens of that family's markers.
 * Every count, length and id the file claims is checked against the named
 * limits in tokenizer.h before use.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "unicode.h"

/* ---- helpers ------------------------------------------------------------- */

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
			int hi = len == 6 ? kvd_hex_digit(s[3]) : -1, lo = len == 6 ? kvd_hex_digit(s[4]) : -1;
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
	} else if (mem_contains(tp, n, "[INST]") && mem_contains(tp, n, "[AVAILABLE_TOOLS]")) {
		t->chat = CHAT_MISTRAL;
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
	tok_chat_markers(t, gguf_get_str(f, "tokenizer.chat_template", &s, &n) == 0 && n > 0);

	*ret = t;
	return 0;
out:
	if (r == -ENOMEM)
		fail(err, errlen, f, r, "out of memory building the tokenizer");
	kvd_tokenizer_free(t);
	return r;
}
