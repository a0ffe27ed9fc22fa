/*
 * daemon/model/grammar_regex.c — regular expressions and choice lists
 * translated into GBNF.
 *
 * The regex subset: literals, escapes (\n \t \r \f \v \0 \xHH \uHHHH and
 * escaped punctuation), classes [a-z] and [^...], the shorthands \d \w \s
 * and their negations, `.` (any character but a newline), groups ( ),
 * (?: ) and named groups, alternation |, quantifiers * + ? {m} {m,} {m,n}
 * (lazy forms match the same strings), ^ at the very start and $ at the
 * very end. Anything else (backreferences, lookaround, \b, flags,
 * possessive quantifiers, anchors inside) is refused with its position.
 * Shorthands give ASCII sets (\d is [0-9]); a negated set that names a
 * shorthand is limited to ASCII, so every string the grammar allows also
 * matches under Python's Unicode-aware re.
 *
 * As a constraint the whole output must match (anchors are implied). Inside
 * a JSON Schema's "pattern" the match is a search (an unanchored side may
 * have anything before / after it) and the text sits in a JSON string:
 * characters JSON reserves (quote, backslash, controls) are written as
 * their escapes when literal and left out of classes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define MAX_CP 0x10FFFFu

struct rset {
	uint32_t *r;  /* lo, hi pairs */
	uint32_t n, cap;
	int oom;
};

static void rs_add(struct rset *s, uint32_t lo, uint32_t hi)
{
	if (s->n + 1 > s->cap) {
		uint32_t nc = s->cap ? s->cap * 2 : 16;
		uint32_t *np = realloc(s->r, (size_t)nc * 2 * sizeof(uint32_t));
		if (!np) {
			s->oom = 1;
			return;
		}
		s->r = np;
		s->cap = nc;
	}
	s->r[2 * s->n] = lo;
	s->r[2 * s->n + 1] = hi;
	s->n++;
}

static int cmp_range(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void rs_norm(struct rset *s)
{
	if (!s->n)
		return;
	qsort(s->r, s->n, 2 * sizeof(uint32_t), cmp_range);
	uint32_t m = 0;
	for (uint32_t i = 0; i < s->n; i++) {
		if (m && s->r[2 * i] <= s->r[2 * m - 1] + 1) {
			if (s->r[2 * i + 1] > s->r[2 * m - 1])
				s->r[2 * m - 1] = s->r[2 * i + 1];
		} else {
			s->r[2 * m] = s->r[2 * i];
			s->r[2 * m + 1] = s->r[2 * i + 1];
			m++;
		}
	}
	s->n = m;
}

static void rs_negate(struct rset *s)
{
	struct rset o = {0};
	uint32_t next = 0;
	rs_norm(s);
	for (uint32_t i = 0; i < s->n; i++) {
		if (s->r[2 * i] > next)
			rs_add(&o, next, s->r[2 * i] - 1);
		next = s->r[2 * i + 1] + 1;
	}
	if (next <= MAX_CP)
		rs_add(&o, next, MAX_CP);
	o.oom |= s->oom;
	free(s->r);
	*s = o;
}

/* s := s ∩ [lo, hi] for each pair of `with` (normalized, sorted) */
static void rs_intersect(struct rset *s, const uint32_t *with, uint32_t nw)
{
	struct rset o = {0};
	rs_norm(s);
	for (uint32_t i = 0; i < s->n; i++)
		for (uint32_t j = 0; j < nw; j++) {
			uint32_t lo = s->r[2 * i] > with[2 * j] ? s->r[2 * i] : with[2 * j];
			uint32_t hi = s->r[2 * i + 1] < with[2 * j + 1] ? s->r[2 * i + 1] : with[2 * j + 1];
			if (lo <= hi)
				rs_add(&o, lo, hi);
		}
	o.oom |= s->oom;
	free(s->r);
	*s = o;
}

static const uint32_t JSON_RAW[] = {0x20, 0x21, 0x23, 0x5B, 0x5D, MAX_CP};
static const uint32_t ASCII[] = {0, 0x7F};

struct rp {
	const char *t;
	size_t n, pos;
	int in_json;
	uint32_t depth;
	struct sbuf *out;
	struct kvd_grammar_error *err;
	int rc;
	int anchored_start, anchored_end;
};

static int rfail(struct rp *p, size_t at, int rc, const char *what)
{
	if (p->rc)
		return p->rc;
	p->rc = rc;
	uint32_t line, col;
	gram_line_col(p->t, at, &line, &col);
	gram_err(p->err, line, col, NULL, "%u:%u: regex: %s", line, col, what);
	return rc;
}

/* Emit a literal code point as a GBNF unit. */
static void emit_cp(struct rp *p, uint32_t cp)
{
	uint8_t b[4];
	size_t n = gram_utf8_encode(cp, b);
	sb_putc(p->out, '"');
	if (p->in_json && (cp == '"' || cp == '\\' || cp < 0x20)) {
		static const char *esc[0x20] = {['\b'] = "b", ['\f'] = "f", ['\n'] = "n", ['\r'] = "r", ['\t'] = "t"};
		if (cp < 0x20 && esc[cp])
			sb_printf(p->out, "\\\\%s", esc[cp]);
		else if (cp < 0x20)
			sb_printf(p->out, "\\\\u%04x", cp);
		else
			sb_printf(p->out, "\\\\\\%c", (char)cp);
	} else {
		sb_gbnf_lit(p->out, (const char *)b, n);
	}
	sb_putc(p->out, '"');
}

static void emit_set(struct rp *p, struct rset *s)
{
	if (p->in_json)
		rs_intersect(s, JSON_RAW, 3);
	rs_norm(s);
	if (s->n == 0) {
		sb_puts(p->out, "[^\\x00-\\U0010FFFF]"); /* matches nothing */
		return;
	}
	sb_putc(p->out, '[');
	for (uint32_t i = 0; i < s->n; i++) {
		sb_gbnf_class_cp(p->out, s->r[2 * i]);
		if (s->r[2 * i + 1] != s->r[2 * i]) {
			sb_putc(p->out, '-');
			sb_gbnf_class_cp(p->out, s->r[2 * i + 1]);
		}
	}
	sb_putc(p->out, ']');
}

/* \d \w \s into s (negated ones complemented within ASCII); 1 if c was a
 * shorthand */
static int shorthand(char c, struct rset *s)
{
	struct rset t = {0};
	switch (c) {
	case 'd': case 'D':
		rs_add(&t, '0', '9');
		break;
	case 'w': case 'W':
		rs_add(&t, '0', '9');
		rs_add(&t, 'A', 'Z');
		rs_add(&t, 'a', 'z');
		rs_add(&t, '_', '_');
		break;
	case 's': case 'S':
		rs_add(&t, '\t', '\r');
		rs_add(&t, ' ', ' ');
		break;
	default:
		return 0;
	}
	if (c >= 'A' && c <= 'Z') {
		rs_negate(&t);
		rs_intersect(&t, ASCII, 1);
	}
	for (uint32_t i = 0; i < t.n; i++)
		rs_add(s, t.r[2 * i], t.r[2 * i + 1]);
	s->oom |= t.oom;
	free(t.r);
	return 1;
}

static int hexv(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* An escape after '\' (p->pos at the letter): a code point, or a shorthand
 * added to *sh (returns 1). in_class: \b is backspace. */
static int escape(struct rp *p, int in_class, uint32_t *cp, struct rset *sh)
{
	size_t at = p->pos - 1;
	if (p->pos >= p->n)
		return rfail(p, at, -EINVAL, "pattern ends with '\\'");
	char c = p->t[p->pos++];
	if (shorthand(c, sh))
		return 1;
	switch (c) {
	case 'n': *cp = '\n'; return 0;
	case 't': *cp = '\t'; return 0;
	case 'r': *cp = '\r'; return 0;
	case 'f': *cp = '\f'; return 0;
	case 'v': *cp = '\v'; return 0;
	case '0': *cp = 0; return 0;
	case 'b':
		if (in_class) {
			*cp = '\b';
			return 0;
		}
		return rfail(p, at, -ENOTSUP, "word boundaries (\\b) are not supported");
	case 'x': case 'u': {
		int nd = c == 'x' ? 2 : 4;
		uint32_t v = 0;
		for (int i = 0; i < nd; i++) {
			int h = p->pos < p->n ? hexv(p->t[p->pos]) : -1;
			if (h < 0)
				return rfail(p, at, -EINVAL, "escape needs hex digits");
			v = v * 16 + (uint32_t)h;
			p->pos++;
		}
		if (v >= 0xD800 && v <= 0xDFFF)
			return rfail(p, at, -ENOTSUP, "surrogate code points are not supported");
		*cp = v;
		return 0;
	}
	default:
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
			return rfail(p, at, -ENOTSUP, "this escape (backreference, \\p, \\A, \\Z, ...) is not supported");
		*cp = (uint8_t)c;
		if ((uint8_t)c >= 0x80) {
			size_t l = gram_utf8_decode((const uint8_t *)p->t + p->pos - 1, p->n - p->pos + 1, cp);
			if (!l)
				return rfail(p, at, -EINVAL, "invalid UTF-8");
			p->pos += l - 1;
		}
		return 0;
	}
}

static int next_cp(struct rp *p, uint32_t *cp)
{
	size_t l = gram_utf8_decode((const uint8_t *)p->t + p->pos, p->n - p->pos, cp);
	if (!l)
		return rfail(p, p->pos, -EINVAL, "invalid UTF-8");
	p->pos += l;
	return 0;
}

static int parse_class(struct rp *p)
{
	size_t at = p->pos++;
	struct rset s = {0};
	int neg = 0, used_shorthand = 0, rc = 0, first = 1;
	if (p->pos < p->n && p->t[p->pos] == '^') {
		neg = 1;
		p->pos++;
	}
	for (;;) {
		if (p->pos >= p->n) {
			rc = rfail(p, at, -EINVAL, "unterminated character class");
			goto out;
		}
		if (p->t[p->pos] == ']' && !first) {
			p->pos++;
			break;
		}
		first = 0;
		uint32_t lo, hi;
		if (p->t[p->pos] == '\\') {
			p->pos++;
			int r = escape(p, 1, &lo, &s);
			if (r < 0) {
				rc = r;
				goto out;
			}
			if (r == 1) {
				used_shorthand = 1;
				continue;
			}
		} else if ((rc = next_cp(p, &lo))) {
			goto out;
		}
		hi = lo;
		if (p->pos + 1 < p->n && p->t[p->pos] == '-' && p->t[p->pos + 1] != ']') {
			size_t rat = p->pos++;
			struct rset dummy = {0};
			int r = 0;
			if (p->t[p->pos] == '\\') {
				p->pos++;
				r = escape(p, 1, &hi, &dummy);
			} else {
				r = next_cp(p, &hi);
			}
			free(dummy.r);
			if (r < 0) {
				rc = r;
				goto out;
			}
			if (r == 1) {
				rc = rfail(p, rat, -ENOTSUP, "a shorthand cannot end a range");
				goto out;
			}
			if (hi < lo) {
				rc = rfail(p, rat, -EINVAL, "character range out of order");
				goto out;
			}
		}
		rs_add(&s, lo, hi);
	}
	if (neg) {
		rs_negate(&s);
		if (used_shorthand)
			rs_intersect(&s, ASCII, 1);
	}
	if (s.oom) {
		rc = -ENOMEM;
		goto out;
	}
	emit_set(p, &s);
out:
	free(s.r);
	return rc;
}

static int parse_alt(struct rp *p);

/* Quantifier at p->pos, if any: written after the unit. Returns 1 if one was
 * there, 0 if not, negative on error. */
static int quantifier(struct rp *p)
{
	size_t at = p->pos;
	if (p->pos >= p->n)
		return 0;
	char c = p->t[p->pos];
	if (c == '*' || c == '+' || c == '?') {
		p->pos++;
		sb_putc(p->out, c);
	} else if (c == '{') {
		size_t q = p->pos + 1;
		uint64_t m = 0, n = 0;
		int have_m = 0, have_n = 0, comma = 0;
		while (q < p->n && p->t[q] >= '0' && p->t[q] <= '9') {
			m = m * 10 + (uint64_t)(p->t[q++] - '0');
			have_m = 1;
			if (m > KVD_GRAMMAR_MAX_REPEAT)
				return rfail(p, at, -E2BIG, "repetition bound over the limit (4096)");
		}
		if (q < p->n && p->t[q] == ',') {
			comma = 1;
			q++;
			while (q < p->n && p->t[q] >= '0' && p->t[q] <= '9') {
				n = n * 10 + (uint64_t)(p->t[q++] - '0');
				have_n = 1;
				if (n > KVD_GRAMMAR_MAX_REPEAT)
					return rfail(p, at, -E2BIG, "repetition bound over the limit (4096)");
			}
		}
		if (q >= p->n || p->t[q] != '}' || !have_m)
			return 0; /* not a quantifier: a literal '{' (as Python reads it) */
		if (have_n && n < m)
			return rfail(p, at, -EINVAL, "repetition {m,n} with n < m");
		p->pos = q + 1;
		if (!comma)
			sb_printf(p->out, "{%llu}", (unsigned long long)m);
		else if (have_n)
			sb_printf(p->out, "{%llu,%llu}", (unsigned long long)m, (unsigned long long)n);
		else
			sb_printf(p->out, "{%llu,}", (unsigned long long)m);
	} else {
		return 0;
	}
	if (p->pos < p->n && p->t[p->pos] == '?')
		p->pos++; /* lazy: the same strings */
	else if (p->pos < p->n && p->t[p->pos] == '+')
		return rfail(p, p->pos, -ENOTSUP, "possessive quantifiers are not supported");
	if (p->pos < p->n && (p->t[p->pos] == '*' || p->t[p->pos] == '+' || p->t[p->pos] == '?' ||
			      p->t[p->pos] == '{'))
		return rfail(p, p->pos, -EINVAL, "multiple repeat");
	return 1;
}

static int parse_seq(struct rp *p)
{
	sb_putc(p->out, '(');
	while (p->pos < p->n) {
		char c = p->t[p->pos];
		size_t at = p->pos;
		int rc = 0;
		if (c == '|' || c == ')')
			break;
		sb_putc(p->out, ' ');
		if (c == '(') {
			if (++p->depth > KVD_GRAMMAR_MAX_NESTING)
				return rfail(p, at, -E2BIG, "groups nested too deeply (limit 64)");
			p->pos++;
			if (p->pos < p->n && p->t[p->pos] == '?') {
				if (p->pos + 1 < p->n && p->t[p->pos + 1] == ':') {
					p->pos += 2;
				} else if (p->pos + 2 < p->n && (p->t[p->pos + 1] == 'P' || p->t[p->pos + 1] == '<') &&
					   p->t[p->pos + (p->t[p->pos + 1] == 'P' ? 2 : 1)] == '<' &&
					   !(p->t[p->pos + 1] == '<' && (p->t[p->pos + 2] == '=' || p->t[p->pos + 2] == '!'))) {
					size_t q = p->pos + (p->t[p->pos + 1] == 'P' ? 3 : 2);
					while (q < p->n && p->t[q] != '>')
						q++;
					if (q >= p->n)
						return rfail(p, at, -EINVAL, "unterminated group name");
					p->pos = q + 1;
				} else {
					return rfail(p, at, -ENOTSUP, "lookaround, flags and other (?...) groups are not supported");
				}
			}
			rc = parse_alt(p);
			if (rc)
				return rc;
			if (p->pos >= p->n || p->t[p->pos] != ')')
				return rfail(p, at, -EINVAL, "missing ')'");
			p->pos++;
			p->depth--;
		} else if (c == '[') {
			if ((rc = parse_class(p)))
				return rc;
		} else if (c == '.') {
			struct rset s = {0};
			p->pos++;
			rs_add(&s, 0, '\n' - 1);
			rs_add(&s, '\n' + 1, MAX_CP);
			if (!s.oom)
				emit_set(p, &s);
			rc = s.oom ? -ENOMEM : 0;
			free(s.r);
			if (rc)
				return rc;
		} else if (c == '\\') {
			struct rset s = {0};
			uint32_t cp;
			p->pos++;
			int r = escape(p, 0, &cp, &s);
			if (r == 1)
				emit_set(p, &s);
			else if (r == 0)
				emit_cp(p, cp);
			free(s.r);
			if (r < 0)
				return r;
		} else if (c == '^') {
			if (at != 0)
				return rfail(p, at, -ENOTSUP, "'^' is supported only at the start of the pattern");
			p->anchored_start = 1;
			p->pos++;
			continue;
		} else if (c == '$') {
			if (at != p->n - 1)
				return rfail(p, at, -ENOTSUP, "'$' is supported only at the end of the pattern");
			p->anchored_end = 1;
			p->pos++;
			continue;
		} else if (c == '*' || c == '+' || c == '?') {
			return rfail(p, at, -EINVAL, "nothing to repeat");
		} else {
			uint32_t cp;
			if ((rc = next_cp(p, &cp)))
				return rc;
			emit_cp(p, cp);
		}
		rc = quantifier(p);
		if (rc < 0)
			return rc;
	}
	sb_putc(p->out, ')');
	return 0;
}

static int parse_alt(struct rp *p)
{
	sb_putc(p->out, '(');
	for (;;) {
		int rc = parse_seq(p);
		if (rc)
			return rc;
		if (p->pos < p->n && p->t[p->pos] == '|') {
			if (p->depth == 0 && (p->anchored_start || p->anchored_end))
				return rfail(p, p->pos, -ENOTSUP, "anchors with a top-level '|' are not supported");
			p->pos++;
			sb_puts(p->out, " | ");
			continue;
		}
		break;
	}
	sb_putc(p->out, ')');
	return 0;
}

int gram_regex_body(const char *re, size_t len, int in_json, struct sbuf *out, struct kvd_grammar_error *err)
{
	struct rp p = {.t = re, .n = len, .in_json = in_json, .err = err};
	struct sbuf body = {0};
	p.out = &body;
	int rc = parse_alt(&p);
	if (!rc && p.pos < p.n)
		rc = rfail(&p, p.pos, -EINVAL, "unbalanced ')'");
	if (!rc) {
		if (in_json && !p.anchored_start)
			sb_puts(out, "jchar* ");
		sb_putn(out, body.p ? body.p : "", body.len);
		if (in_json && !p.anchored_end)
			sb_puts(out, " jchar*");
	}
	if (!rc && body.oom)
		rc = -ENOMEM;
	sb_free(&body);
	return rc;
}

int gram_regex_to_gbnf(const char *text, size_t len, struct sbuf *out, struct kvd_grammar_error *err)
{
	sb_puts(out, "root ::= ");
	int rc = gram_regex_body(text, len, 0, out, err);
	sb_putc(out, '\n');
	return rc;
}

int gram_choices_to_gbnf(const char *text, size_t len, struct sbuf *out, struct kvd_grammar_error *err)
{
	struct jdoc *d = NULL;
	int rc = jdoc_parse(text, len, &d, err);
	if (rc)
		return rc;
	const struct jv *a = jdoc_root(d);
	if (a->type != JV_ARR || a->n == 0) {
		gram_err(err, 1, 1, NULL, "choices: expected a non-empty JSON array of strings");
		rc = -EINVAL;
		goto out;
	}
	if (a->n > KVD_GRAMMAR_MAX_CHOICES) {
		gram_err(err, 1, 1, NULL, "choices: more than %u strings", KVD_GRAMMAR_MAX_CHOICES);
		rc = -E2BIG;
		goto out;
	}
	sb_puts(out, "root ::= ");
	for (uint32_t i = 0; i < a->n; i++) {
		const struct jv *s = &a->kids[i];
		if (s->type != JV_STR) {
			uint32_t line, col;
			gram_line_col(text, s->off, &line, &col);
			gram_err(err, line, col, NULL, "%u:%u: choices: element %u is not a string", line, col, i);
			rc = -EINVAL;
			goto out;
		}
		if (i)
			sb_puts(out, " | ");
		sb_putc(out, '"');
		sb_gbnf_lit(out, s->s, s->n);
		sb_putc(out, '"');
	}
	sb_putc(out, '\n');
out:
	jdoc_free(d);
	return rc;
}
