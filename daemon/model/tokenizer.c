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
 * The code is split by concern (tokenizer_impl.h lists the files); this
 * one cuts text at special tokens and hands the fragments between them to
 * the model's stages, and turns tokens back into bytes.
 *
 * Everything built at load is immutable; each kvd_tokenize() call owns its
 * scratch memory, so one tokenizer serves any number of threads.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

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

/* ---- scratch ------------------------------------------------------------- */

int tok_grow(void **p, size_t *cap, size_t need, size_t elem)
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

/* ---- kvd_tokenize -------------------------------------------------------- */

/* Longest special token whose text starts at s[0..n), or -1; tokens with a
 * flag in no_match are left out. */
static int32_t match_special(const struct kvd_tokenizer *t, const char *s, size_t n, unsigned no_match,
			     size_t *ret_len)
{
	unsigned c0 = (unsigned char)s[0];
	for (uint32_t i = t->special_start[c0]; i < t->special_start[c0 + 1]; i++) {
		int32_t id = t->special[i];
		if (t->flags[id] & no_match)
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
	if (tok_past_max(c))
		return -ECANCELED;
	if (c->t->model == MODEL_SPM)
		return tok_spm_fragment(c, s, n, c->t->add_space_prefix);
	return tok_pre_split(c, 0, (const unsigned char *)s, 0, n);
}

int kvd_tokenize(const struct kvd_tokenizer *t, const char *text, size_t len, int add_bos,
		 int parse_special, int32_t *out, size_t max_out)
{
	return tok_tokenize(t, text, len, add_bos, parse_special ? 0 : TOKF_PARSE, out, max_out);
}

static int tokenize_call(const struct kvd_tokenizer *t, const char *text, size_t len, bool add_bos,
			 unsigned no_match, int32_t *out, size_t max_out, bool stop_past_max)
{
	if (len > KVD_TOKENIZE_MAX_BYTES)
		return -E2BIG;
	if ((!text && len) || (!out && max_out))
		return -EINVAL;

	struct tok_call c = { .t = t, .out = out, .max_out = max_out, .stop_past_max = stop_past_max };
	int r = 0;
	if (add_bos && t->bos >= 0)
		emit(&c, t->bos);

	/* Cut the text at special tokens; what lies between is raw text. */
	size_t frag = 0;
	for (size_t pos = 0; pos < len;) {
		size_t sl;
		int32_t id;
		if (!t->special_starts[(unsigned char)text[pos]] ||
		    (id = match_special(t, text + pos, len - pos, no_match, &sl)) < 0) {
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
	if (r == -ECANCELED && stop_past_max)
		r = 0; /* stopped past max_out: n_out is a lower bound above it */
	if (r < 0)
		return r;
	return c.n_out > INT_MAX ? -E2BIG : (int)c.n_out;
}

int tok_tokenize(const struct kvd_tokenizer *t, const char *text, size_t len, bool add_bos, unsigned no_match,
		 int32_t *out, size_t max_out)
{
	return tokenize_call(t, text, len, add_bos, no_match, out, max_out, false);
}

int tok_tokenize_upto(const struct kvd_tokenizer *t, const char *text, size_t len, bool add_bos, unsigned no_match,
		      int32_t *out, size_t max_out)
{
	return tokenize_call(t, text, len, add_bos, no_match, out, max_out, true);
}

int kvd_tokenize_upto(const struct kvd_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
		      int32_t *out, size_t max_out)
{
	return tok_tokenize_upto(t, text, len, add_bos, parse_special ? 0 : TOKF_PARSE, out, max_out);
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
