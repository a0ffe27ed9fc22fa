/*
 * daemon/model/tokenizer_pretok.c — the pre-tokenizers of byte-level BPE
 * vocabularies. Each is a fixed list of "find all matches" passes (enum
 * pre_pass), every pass a hand-written matcher for one of the regexes these
 * vocabularies were trained with, as llama.cpp applies them: the matches and
 * the text between them become the pieces of the next pass, and the pieces
 * of the last pass are merged by tok_bpe_word().
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdlib.h>

#include "unicode.h"

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
		return 0; /* split in tok_pre_split(), in one backward scan */
	}
	return 0;
}

/* Run pass `k` over s[a..b): matches and the text between them become
 * pieces for the next pass; after the last pass, words for BPE. */
int tok_pre_split(struct tok_call *c, unsigned k, const unsigned char *s, size_t a, size_t b)
{
	const struct kvd_tokenizer *t = c->t;
	int r;
	if (k == t->n_passes)
		return tok_past_max(c) ? -ECANCELED : tok_bpe_word(c, s + a, b - a);
	if (t->passes[k] == PASS_TRAILING_SP) {
		/* \s+$: the piece's trailing white space (ASCII bytes, so a
		 * backward byte scan never lands inside a character) */
		size_t e = b;
		while (e > a && ascii_space(s[e - 1]))
			e--;
		if (e > a && (r = tok_pre_split(c, k + 1, s, a, e)) < 0)
			return r;
		return e < b ? tok_pre_split(c, k + 1, s, e, b) : 0;
	}
	size_t pos = a, gap = a;
	while (pos < b) {
		size_t m = match(t->passes[k], s, pos, b);
		if (m == 0) {
			pos += cp_at(s, pos, b).len;
			continue;
		}
		if (gap < pos && (r = tok_pre_split(c, k + 1, s, gap, pos)) < 0)
			return r;
		if ((r = tok_pre_split(c, k + 1, s, pos, pos + m)) < 0)
			return r;
		pos += m;
		gap = pos;
	}
	if (gap < b && (r = tok_pre_split(c, k + 1, s, gap, b)) < 0)
		return r;
	return 0;
}
