/*
 * daemon/model/grammar_gbnf.c — llama.cpp's GBNF notation parsed and lowered
 * into the byte-level grammar the matcher runs.
 *
 * Accepted: rules `name ::= alternatives` (names of letters, digits, '-' and
 * '_'; the start rule is `root`), alternation `|`, grouping `( )`, postfix
 * `*` `+` `?` `{m}` `{m,}` `{m,n}`, "string literals" and [character
 * classes] ([^...] negated, ranges a-z) with escapes \n \r \t \\ \" \[ \]
 * \- \xHH \uHHHH \UHHHHHHHH, `.` (any character), and # comments. As in
 * llama.cpp a rule ends at a newline unless inside parentheses; a line
 * starting with `|` continues the previous rule.
 *
 * Lowering: repetitions become generated rules (X* is R ::= X R | ε, with
 * the recursion in tail position so it needs no stack growth; X{m,n} is m
 * copies then a chain of n - m optional rules). Characters are code points
 * in the notation and bytes in the result: a class is split into its UTF-8
 * byte-range sequences (surrogates never match), one byte set when they
 * are all single bytes, else a generated rule with one alternative per
 * sequence. Checks after lowering: every referenced rule is defined, `root`
 * exists, no rule is left-recursive (reaches itself without consuming a
 * byte: the matcher's expansion would not end), and no rule expands into
 * more than KVD_GRAMMAR_MAX_STACKS stacks at once. Each is an error with
 * the position of the rule at fault.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "unicode.h"

#define IT_END GE_END
#define IT_CP  GE_SET          /* | index of a code point set */
#define REP_INF UINT32_MAX
#define MAX_CP 0x10FFFFu

struct u32vec {
	uint32_t *p;
	uint32_t n, cap;
};

struct prule {
	const char *name;      /* into the text; NULL for generated rules */
	uint32_t name_len;
	uint32_t owner;        /* the named rule a generated one belongs to */
	int defined;
	size_t off;            /* first use, or definition once defined */
	struct u32vec body;    /* items, each alternative ended by IT_END */
};

struct cpset {
	uint32_t off, n;       /* ranges[off .. off + 2n): lo, hi pairs */
};

struct gp {
	const char *t;
	size_t n, pos;
	struct prule *rules;
	uint32_t n_rules, cap_rules;
	uint32_t *names;       /* open-addressing table of named rules (index + 1) */
	uint32_t names_cap;
	struct u32vec ranges;
	struct cpset *sets;
	uint32_t n_sets, cap_sets;
	uint64_t n_items;
	uint32_t depth;
	uint32_t cur;          /* named rule being parsed */
	struct kvd_grammar_error *err;
	int rc;
};

static int vec_push(struct u32vec *v, uint32_t x)
{
	if (v->n == v->cap) {
		uint32_t nc = v->cap ? v->cap * 2 : 8;
		uint32_t *np = realloc(v->p, (size_t)nc * sizeof(*np));
		if (!np)
			return -ENOMEM;
		v->p = np;
		v->cap = nc;
	}
	v->p[v->n++] = x;
	return 0;
}

static int gp_fail(struct gp *p, size_t off, int rc, const char *fmt, const char *a)
{
	if (p->rc)
		return p->rc;
	p->rc = rc;
	if (p->err) {
		uint32_t line, col;
		gram_line_col(p->t, off, &line, &col);
		char m[256];
		snprintf(m, sizeof(m), fmt, a ? a : "");
		gram_err(p->err, line, col, NULL, "%u:%u: %s", line, col, m);
	}
	return rc;
}

static int oom(struct gp *p)
{
	return gp_fail(p, p->pos, -ENOMEM, "out of memory%s", "");
}

static int budget(struct gp *p, uint64_t items)
{
	p->n_items += items;
	if (p->n_items > KVD_GRAMMAR_MAX_ELEMS)
		return gp_fail(p, p->pos, -E2BIG, "grammar too large after expansion (limit %s elements)", "1048576");
	return 0;
}

static int is_word(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static void skip_space(struct gp *p, int newline_ok)
{
	while (p->pos < p->n) {
		char c = p->t[p->pos];
		if (c == ' ' || c == '\t' || c == '\r' || (newline_ok && c == '\n')) {
			p->pos++;
		} else if (c == '#') {
			while (p->pos < p->n && p->t[p->pos] != '\n')
				p->pos++;
		} else {
			break;
		}
	}
}

static char peek(const struct gp *p)
{
	return p->pos < p->n ? p->t[p->pos] : 0;
}

static int new_rule(struct gp *p, const char *name, uint32_t len, size_t off, uint32_t *ret)
{
	if (p->n_rules >= KVD_GRAMMAR_MAX_RULES)
		return gp_fail(p, off, -E2BIG, "too many rules (limit %s)", "32768");
	if (p->n_rules == p->cap_rules) {
		uint32_t nc = p->cap_rules ? p->cap_rules * 2 : 64;
		struct prule *nr = realloc(p->rules, (size_t)nc * sizeof(*nr));
		if (!nr)
			return oom(p);
		p->rules = nr;
		p->cap_rules = nc;
	}
	struct prule *r = &p->rules[p->n_rules];
	memset(r, 0, sizeof(*r));
	r->name = name;
	r->name_len = len;
	r->owner = name ? p->n_rules : p->cur;
	r->defined = name == NULL; /* generated rules are defined as they are made */
	r->off = off;
	*ret = p->n_rules++;
	return 0;
}

static uint32_t name_hash(const char *s, uint32_t n)
{
	uint32_t h = 2166136261u;
	for (uint32_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 16777619u;
	return h;
}

/* The named rule `name`, created (undefined) on first use. */
static int rule_by_name(struct gp *p, const char *name, uint32_t len, size_t off, uint32_t *ret)
{
	if (p->names_cap == 0 || (p->n_rules + 1) * 2 > p->names_cap) {
		uint32_t nc = p->names_cap ? p->names_cap * 2 : 256;
		uint32_t *nt = calloc(nc, sizeof(*nt));
		if (!nt)
			return oom(p);
		for (uint32_t i = 0; i < p->names_cap; i++) {
			uint32_t e = p->names[i];
			if (!e)
				continue;
			const struct prule *r = &p->rules[e - 1];
			uint32_t h = name_hash(r->name, r->name_len) & (nc - 1);
			while (nt[h])
				h = (h + 1) & (nc - 1);
			nt[h] = e;
		}
		free(p->names);
		p->names = nt;
		p->names_cap = nc;
	}
	uint32_t h = name_hash(name, len) & (p->names_cap - 1);
	while (p->names[h]) {
		const struct prule *r = &p->rules[p->names[h] - 1];
		if (r->name_len == len && memcmp(r->name, name, len) == 0) {
			*ret = p->names[h] - 1;
			return 0;
		}
		h = (h + 1) & (p->names_cap - 1);
	}
	int rc = new_rule(p, name, len, off, ret);
	if (rc)
		return rc;
	p->names[h] = *ret + 1;
	return 0;
}

/* Sort and merge ranges[from..) into a new set; returns its index via ret. */
static int range_cmp(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int add_set(struct gp *p, uint32_t from, int negate, uint32_t *ret)
{
	uint32_t n = (p->ranges.n - from) / 2, m = 0;
	uint32_t *r = n ? p->ranges.p + from : NULL; /* an empty class may have no ranges at all */
	if (n)
		qsort(r, n, 2 * sizeof(uint32_t), range_cmp);
	for (uint32_t i = 0; i < n; i++) {
		if (m && r[2 * i] <= r[2 * (m - 1) + 1] + 1) {
			if (r[2 * i + 1] > r[2 * (m - 1) + 1])
				r[2 * (m - 1) + 1] = r[2 * i + 1];
		} else {
			r[2 * m] = r[2 * i];
			r[2 * m + 1] = r[2 * i + 1];
			m++;
		}
	}
	p->ranges.n = from + 2 * m;
	if (negate) {
		/* complement in place through a copy */
		uint32_t *c = malloc((size_t)(m + 1) * 2 * sizeof(uint32_t));
		if (!c)
			return oom(p);
		uint32_t k = 0, next = 0;
		for (uint32_t i = 0; i < m; i++) {
			if (r[2 * i] > next) {
				c[2 * k] = next;
				c[2 * k + 1] = r[2 * i] - 1;
				k++;
			}
			next = r[2 * i + 1] + 1;
		}
		if (next <= MAX_CP) {
			c[2 * k] = next;
			c[2 * k + 1] = MAX_CP;
			k++;
		}
		p->ranges.n = from;
		for (uint32_t i = 0; i < 2 * k; i++)
			if (vec_push(&p->ranges, c[i])) {
				free(c);
				return oom(p);
			}
		free(c);
		m = k;
	}
	if (p->n_sets == p->cap_sets) {
		uint32_t nc = p->cap_sets ? p->cap_sets * 2 : 64;
		struct cpset *ns = realloc(p->sets, (size_t)nc * sizeof(*ns));
		if (!ns)
			return oom(p);
		p->sets = ns;
		p->cap_sets = nc;
	}
	p->sets[p->n_sets].off = from;
	p->sets[p->n_sets].n = m;
	*ret = p->n_sets++;
	return 0;
}

static int push_cp_set(struct gp *p, struct u32vec *out, uint32_t lo, uint32_t hi)
{
	uint32_t from = p->ranges.n, s;
	if (vec_push(&p->ranges, lo) || vec_push(&p->ranges, hi))
		return oom(p);
	int rc = add_set(p, from, 0, &s);
	if (rc)
		return rc;
	if (budget(p, 1) || vec_push(out, IT_CP | s))
		return p->rc ? p->rc : oom(p);
	return 0;
}

/* One character of a literal or class, escapes decoded. */
static int parse_char(struct gp *p, uint32_t *cp)
{
	size_t at = p->pos;
	if (p->pos >= p->n)
		return gp_fail(p, at, -EINVAL, "unexpected end of grammar%s", "");
	if (p->t[p->pos] == '\\') {
		p->pos++;
		if (p->pos >= p->n)
			return gp_fail(p, at, -EINVAL, "unfinished escape%s", "");
		char c = p->t[p->pos++];
		int digits = 0;
		switch (c) {
		case 'n': *cp = '\n'; return 0;
		case 'r': *cp = '\r'; return 0;
		case 't': *cp = '\t'; return 0;
		case 'f': *cp = '\f'; return 0;
		case 'v': *cp = '\v'; return 0;
		case '0': *cp = 0; return 0;
		case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'': case '.':
			*cp = (uint8_t)c;
			return 0;
		case 'x': digits = 2; break;
		case 'u': digits = 4; break;
		case 'U': digits = 8; break;
		default:
			return gp_fail(p, at, -EINVAL, "unknown escape '\\%s'", (char[]){c, 0});
		}
		uint32_t v = 0;
		for (int i = 0; i < digits; i++) {
			int h = p->pos < p->n ? kvd_hex_digit(p->t[p->pos]) : -1;
			if (h < 0)
				return gp_fail(p, at, -EINVAL, "escape needs hex digits%s", "");
			v = v * 16 + (uint32_t)h;
			p->pos++;
		}
		if (v > MAX_CP)
			return gp_fail(p, at, -EINVAL, "code point beyond U+10FFFF%s", "");
		*cp = v;
		return 0;
	}
	size_t l = gram_utf8_decode((const uint8_t *)p->t + p->pos, p->n - p->pos, cp);
	if (!l)
		return gp_fail(p, at, -EINVAL, "invalid UTF-8%s", "");
	p->pos += l;
	return 0;
}

static int parse_literal(struct gp *p, struct u32vec *out)
{
	size_t at = p->pos++;
	while (p->pos < p->n && p->t[p->pos] != '"') {
		if (p->t[p->pos] == '\n')
			return gp_fail(p, at, -EINVAL, "unterminated string literal%s", "");
		uint32_t cp;
		int rc = parse_char(p, &cp);
		if (rc)
			return rc;
		rc = push_cp_set(p, out, cp, cp);
		if (rc)
			return rc;
	}
	if (p->pos >= p->n)
		return gp_fail(p, at, -EINVAL, "unterminated string literal%s", "");
	p->pos++;
	return 0;
}

static int parse_class(struct gp *p, struct u32vec *out)
{
	size_t at = p->pos++;
	int negate = 0;
	if (peek(p) == '^') {
		negate = 1;
		p->pos++;
	}
	uint32_t from = p->ranges.n, s;
	while (p->pos < p->n && p->t[p->pos] != ']') {
		if (p->t[p->pos] == '\n')
			return gp_fail(p, at, -EINVAL, "unterminated character class%s", "");
		uint32_t lo, hi;
		int rc = parse_char(p, &lo);
		if (rc)
			return rc;
		hi = lo;
		if (p->pos + 1 < p->n && p->t[p->pos] == '-' && p->t[p->pos + 1] != ']') {
			p->pos++;
			size_t rat = p->pos;
			rc = parse_char(p, &hi);
			if (rc)
				return rc;
			if (hi < lo)
				return gp_fail(p, rat, -EINVAL, "character range out of order%s", "");
		}
		if (vec_push(&p->ranges, lo) || vec_push(&p->ranges, hi))
			return oom(p);
	}
	if (p->pos >= p->n)
		return gp_fail(p, at, -EINVAL, "unterminated character class%s", "");
	p->pos++;
	int rc = add_set(p, from, negate, &s);
	if (rc)
		return rc;
	if (budget(p, 1) || vec_push(out, IT_CP | s))
		return p->rc ? p->rc : oom(p);
	return 0;
}

static int parse_uint(struct gp *p, uint32_t *v)
{
	size_t at = p->pos;
	uint64_t x = 0;
	if (p->pos >= p->n || p->t[p->pos] < '0' || p->t[p->pos] > '9')
		return gp_fail(p, at, -EINVAL, "expected a number%s", "");
	while (p->pos < p->n && p->t[p->pos] >= '0' && p->t[p->pos] <= '9') {
		x = x * 10 + (uint64_t)(p->t[p->pos++] - '0');
		if (x > KVD_GRAMMAR_MAX_REPEAT)
			return gp_fail(p, at, -E2BIG, "repetition bound over the limit (%s)", "4096");
	}
	*v = (uint32_t)x;
	return 0;
}

/* out[from..) is the unit a quantifier applies to: replace it by the
 * repetition {min,max}. */
static int repeat(struct gp *p, struct u32vec *out, uint32_t from, uint32_t min, uint32_t max)
{
	uint32_t x, r;
	int rc;
	if (out->n - from == 1) {
		x = out->p[from];
	} else {
		if ((rc = new_rule(p, NULL, 0, p->pos, &x)))
			return rc;
		for (uint32_t i = from; i < out->n; i++)
			if (vec_push(&p->rules[x].body, out->p[i]))
				return oom(p);
		if (vec_push(&p->rules[x].body, IT_END))
			return oom(p);
	}
	out->n = from;
	uint64_t opt = max == REP_INF ? 1 : max - min;
	if ((rc = budget(p, min + opt * 4)))
		return rc;
	for (uint32_t i = 0; i < min; i++)
		if (vec_push(out, x))
			return oom(p);
	if (max == REP_INF) {
		if ((rc = new_rule(p, NULL, 0, p->pos, &r)))
			return rc;
		struct u32vec *b = &p->rules[r].body;
		if (vec_push(b, x) || vec_push(b, r) || vec_push(b, IT_END) || vec_push(b, IT_END))
			return oom(p);
		return vec_push(out, r) ? oom(p) : 0;
	}
	uint32_t prev = IT_END;
	for (uint32_t k = min; k < max; k++) {
		if ((rc = new_rule(p, NULL, 0, p->pos, &r)))
			return rc;
		struct u32vec *b = &p->rules[r].body;
		if (vec_push(b, x) || (prev != IT_END && vec_push(b, prev)) || vec_push(b, IT_END) ||
		    vec_push(b, IT_END))
			return oom(p);
		prev = r;
	}
	if (prev != IT_END && vec_push(out, prev))
		return oom(p);
	return 0;
}

static int parse_alternates(struct gp *p, struct u32vec *out, int nested);

static int parse_sequence(struct gp *p, struct u32vec *out, int nested)
{
	uint32_t last = out->n;
	int rc;
	for (;;) {
		char c = peek(p);
		size_t at = p->pos;
		if (c == '"') {
			last = out->n;
			rc = parse_literal(p, out);
		} else if (c == '[') {
			last = out->n;
			rc = parse_class(p, out);
		} else if (c == '.') {
			last = out->n;
			p->pos++;
			rc = push_cp_set(p, out, 0, MAX_CP);
		} else if (c == '(') {
			last = out->n;
			if (++p->depth > KVD_GRAMMAR_MAX_NESTING)
				return gp_fail(p, at, -E2BIG, "groups nested too deeply (limit %s)", "64");
			p->pos++;
			skip_space(p, 1);
			struct u32vec sub = {0};
			uint32_t g;
			rc = parse_alternates(p, &sub, 1);
			if (!rc && peek(p) != ')')
				rc = gp_fail(p, p->pos, -EINVAL, "expected ')'%s", "");
			if (!rc)
				rc = new_rule(p, NULL, 0, at, &g);
			if (!rc) {
				p->pos++;
				p->rules[g].body = sub;
				sub.p = NULL;
				rc = vec_push(out, g) ? oom(p) : 0;
			}
			free(sub.p);
			p->depth--;
		} else if (is_word(c)) {
			last = out->n;
			size_t s = p->pos;
			while (p->pos < p->n && is_word(p->t[p->pos]))
				p->pos++;
			uint32_t r;
			rc = rule_by_name(p, p->t + s, (uint32_t)(p->pos - s), s, &r);
			if (!rc)
				rc = budget(p, 1) ? p->rc : (vec_push(out, r) ? oom(p) : 0);
		} else if (c == '*' || c == '+' || c == '?' || c == '{') {
			if (out->n == last)
				return gp_fail(p, at, -EINVAL, "'%s' has nothing to repeat", (char[]){c, 0});
			uint32_t min = 0, max = REP_INF;
			p->pos++;
			if (c == '+')
				min = 1;
			else if (c == '?')
				max = 1;
			else if (c == '{') {
				skip_space(p, nested);
				if ((rc = parse_uint(p, &min)))
					return rc;
				skip_space(p, nested);
				if (peek(p) == ',') {
					p->pos++;
					skip_space(p, nested);
					if (peek(p) != '}' && (rc = parse_uint(p, &max)))
						return rc;
					skip_space(p, nested);
				} else {
					max = min;
				}
				if (peek(p) != '}')
					return gp_fail(p, p->pos, -EINVAL, "expected '}'%s", "");
				p->pos++;
				if (max < min)
					return gp_fail(p, at, -EINVAL, "repetition {m,n} with n < m%s", "");
			}
			rc = repeat(p, out, last, min, max);
		} else {
			return 0;
		}
		if (rc)
			return rc;
		skip_space(p, nested);
	}
}

static int parse_alternates(struct gp *p, struct u32vec *out, int nested)
{
	for (;;) {
		int rc = parse_sequence(p, out, nested);
		if (rc)
			return rc;
		if (budget(p, 1) || vec_push(out, IT_END))
			return p->rc ? p->rc : oom(p);
		if (peek(p) != '|' && !nested) {
			size_t save = p->pos;
			skip_space(p, 1);
			if (peek(p) != '|') {
				p->pos = save;
				return 0;
			}
		}
		if (peek(p) != '|')
			return 0;
		p->pos++;
		skip_space(p, 1);
	}
}

static int parse_grammar(struct gp *p)
{
	skip_space(p, 1);
	while (p->pos < p->n) {
		size_t s = p->pos;
		while (p->pos < p->n && is_word(p->t[p->pos]))
			p->pos++;
		if (p->pos == s)
			return gp_fail(p, s, -EINVAL, "expected a rule name%s", "");
		uint32_t r;
		int rc = rule_by_name(p, p->t + s, (uint32_t)(p->pos - s), s, &r);
		if (rc)
			return rc;
		if (p->rules[r].defined) {
			char nm[64];
			snprintf(nm, sizeof(nm), "%.*s", (int)(p->pos - s), p->t + s);
			return gp_fail(p, s, -EINVAL, "rule '%s' defined twice", nm);
		}
		skip_space(p, 0);
		if (p->n - p->pos < 3 || memcmp(p->t + p->pos, "::=", 3) != 0)
			return gp_fail(p, p->pos, -EINVAL, "expected '::='%s", "");
		p->pos += 3;
		skip_space(p, 1);
		p->cur = r;
		struct u32vec body = {0};
		rc = parse_alternates(p, &body, 0);
		if (rc) {
			free(body.p);
			return rc;
		}
		p->rules[r].body = body;
		p->rules[r].defined = 1;
		p->rules[r].off = s;
		skip_space(p, 0);
		if (p->pos < p->n && p->t[p->pos] != '\n')
			return gp_fail(p, p->pos, -EINVAL, "unexpected character '%s'",
				       (char[]){p->t[p->pos] >= 0x20 && p->t[p->pos] < 0x7f ? p->t[p->pos] : '?', 0});
		skip_space(p, 1);
	}
	return 0;
}

/* ---- lowering to bytes ------------------------------------------------------ */

struct lower {
	struct gp *p;
	struct u32vec *body;     /* per final rule */
	uint32_t n_rules, cap_rules;
	uint8_t (*sets)[32];
	uint32_t n_sets, cap_sets;
	uint32_t *set_tab;       /* open addressing over sets (index + 1) */
	uint32_t set_tab_cap;
	uint32_t *helper;        /* per code point set: its lowered element, or IT_END */
};

struct u8seq {
	uint8_t n, lo[4], hi[4];
};

struct seqs {
	struct u8seq s[64];
	uint32_t n;
};

/* Split [lo, hi] into UTF-8 byte-range sequences (surrogates left out). */
static void utf8_split(uint32_t lo, uint32_t hi, struct seqs *out)
{
	static const uint32_t maxv[] = {0x7F, 0x7FF, 0xFFFF};
	if (lo > hi)
		return;
	if (lo <= 0xDFFF && hi >= 0xD800) {
		if (lo < 0xD800)
			utf8_split(lo, 0xD7FF, out);
		if (hi > 0xDFFF)
			utf8_split(0xE000, hi, out);
		return;
	}
	for (int i = 0; i < 3; i++)
		if (lo <= maxv[i] && hi > maxv[i]) {
			utf8_split(lo, maxv[i], out);
			utf8_split(maxv[i] + 1, hi, out);
			return;
		}
	uint8_t a[4], b[4];
	size_t n = gram_utf8_encode(lo, a);
	gram_utf8_encode(hi, b);
	for (size_t i = 1; i < n; i++) {
		uint32_t m = (1u << (6 * i)) - 1;
		if ((lo & ~m) != (hi & ~m)) {
			if ((lo & m) != 0) {
				utf8_split(lo, lo | m, out);
				utf8_split((lo | m) + 1, hi, out);
				return;
			}
			if ((hi & m) != m) {
				utf8_split(lo, (hi & ~m) - 1, out);
				utf8_split(hi & ~m, hi, out);
				return;
			}
		}
	}
	if (out->n >= sizeof(out->s) / sizeof(out->s[0]))
		return; /* cannot happen: a range splits into at most ~20 */
	struct u8seq *s = &out->s[out->n++];
	s->n = (uint8_t)n;
	memcpy(s->lo, a, n);
	memcpy(s->hi, b, n);
}

static uint32_t set_hash(const uint8_t *s)
{
	uint32_t h = 2166136261u;
	for (int i = 0; i < 32; i++)
		h = (h ^ s[i]) * 16777619u;
	return h;
}

/* Intern a byte set; returns its element (GE_SET | index) or IT_END on OOM. */
static uint32_t intern_set(struct lower *l, const uint8_t *set)
{
	if ((l->n_sets + 1) * 2 > l->set_tab_cap) {
		uint32_t nc = l->set_tab_cap ? l->set_tab_cap * 2 : 512;
		uint32_t *nt = calloc(nc, sizeof(*nt));
		if (!nt)
			return IT_END;
		for (uint32_t i = 0; i < l->n_sets; i++) {
			uint32_t h = set_hash(l->sets[i]) & (nc - 1);
			while (nt[h])
				h = (h + 1) & (nc - 1);
			nt[h] = i + 1;
		}
		free(l->set_tab);
		l->set_tab = nt;
		l->set_tab_cap = nc;
	}
	uint32_t h = set_hash(set) & (l->set_tab_cap - 1);
	while (l->set_tab[h]) {
		if (memcmp(l->sets[l->set_tab[h] - 1], set, 32) == 0)
			return GE_SET | (l->set_tab[h] - 1);
		h = (h + 1) & (l->set_tab_cap - 1);
	}
	if (l->n_sets == l->cap_sets) {
		uint32_t nc = l->cap_sets ? l->cap_sets * 2 : 64;
		uint8_t(*ns)[32] = realloc(l->sets, (size_t)nc * 32);
		if (!ns)
			return IT_END;
		l->sets = ns;
		l->cap_sets = nc;
	}
	memcpy(l->sets[l->n_sets], set, 32);
	l->set_tab[h] = l->n_sets + 1;
	return GE_SET | l->n_sets++;
}

static uint32_t range_set(struct lower *l, uint8_t lo, uint8_t hi)
{
	uint8_t s[32] = {0};
	for (unsigned b = lo; b <= hi; b++)
		s[b >> 3] |= (uint8_t)(1u << (b & 7));
	return intern_set(l, s);
}

static int lower_new_rule(struct lower *l, uint32_t *ret)
{
	if (l->n_rules >= KVD_GRAMMAR_MAX_RULES)
		return gp_fail(l->p, 0, -E2BIG, "too many rules after lowering (limit %s)", "32768");
	if (l->n_rules == l->cap_rules) {
		uint32_t nc = l->cap_rules * 2;
		struct u32vec *nb = realloc(l->body, (size_t)nc * sizeof(*nb));
		if (!nb)
			return oom(l->p);
		l->body = nb;
		l->cap_rules = nc;
	}
	memset(&l->body[l->n_rules], 0, sizeof(l->body[0]));
	*ret = l->n_rules++;
	return 0;
}

/* Append the lowering of code point set `si` to out. */
static int lower_cpset(struct lower *l, uint32_t si, struct u32vec *out)
{
	struct gp *p = l->p;
	const struct cpset *cs = &p->sets[si];
	const uint32_t *r = cs->n ? p->ranges.p + cs->off : NULL;
	if (cs->n == 1 && r[0] == r[1] && (r[0] < 0xD800 || r[0] > 0xDFFF)) {
		uint8_t b[4];
		size_t n = gram_utf8_encode(r[0], b);
		for (size_t i = 0; i < n; i++) {
			uint32_t e = range_set(l, b[i], b[i]);
			if (e == IT_END || vec_push(out, e))
				return oom(p);
		}
		return budget(p, n);
	}
	if (l->helper[si] != IT_END)
		return vec_push(out, l->helper[si]) ? oom(p) : 0;
	struct seqs sq;
	uint8_t one[32] = {0};
	int have_one = 0, have_multi = 0;
	for (uint32_t k = 0; k < cs->n; k++) {
		sq.n = 0;
		utf8_split(r[2 * k], r[2 * k + 1], &sq);
		for (uint32_t i = 0; i < sq.n; i++)
			if (sq.s[i].n == 1) {
				for (unsigned b = sq.s[i].lo[0]; b <= sq.s[i].hi[0]; b++)
					one[b >> 3] |= (uint8_t)(1u << (b & 7));
				have_one = 1;
			} else {
				have_multi = 1;
			}
	}
	uint32_t e;
	if (!have_multi) {
		/* all single bytes (or nothing at all: a set that never matches) */
		e = intern_set(l, one);
		if (e == IT_END)
			return oom(p);
	} else {
		uint32_t h = 0;
		int rc = lower_new_rule(l, &h);
		if (rc)
			return rc;
		struct u32vec *b = &l->body[h];
		if (have_one) {
			uint32_t s1 = intern_set(l, one);
			if (s1 == IT_END || vec_push(b, s1) || vec_push(b, IT_END))
				return oom(p);
		}
		for (uint32_t k = 0; k < cs->n; k++) {
			sq.n = 0;
			utf8_split(r[2 * k], r[2 * k + 1], &sq);
			for (uint32_t i = 0; i < sq.n; i++) {
				if (sq.s[i].n == 1)
					continue;
				b = &l->body[h];
				for (uint32_t j = 0; j < sq.s[i].n; j++) {
					uint32_t x = range_set(l, sq.s[i].lo[j], sq.s[i].hi[j]);
					if (x == IT_END || vec_push(b, x))
						return oom(p);
				}
				if (vec_push(b, IT_END))
					return oom(p);
				if ((rc = budget(p, sq.s[i].n + 1)))
					return rc;
			}
		}
		e = h;
	}
	l->helper[si] = e;
	return vec_push(out, e) ? oom(p) : 0;
}

/* ---- checks ------------------------------------------------------------------ */

static int rule_fail(struct gp *p, uint32_t r, int rc, const char *what)
{
	uint32_t owner = r < p->n_rules ? p->rules[r].owner : 0;
	const struct prule *o = owner < p->n_rules ? &p->rules[owner] : NULL;
	char m[200];
	if (o && o->name)
		snprintf(m, sizeof(m), "rule '%.*s'%s %s", (int)(o->name_len > 64 ? 64 : o->name_len), o->name,
			 owner == r ? "" : " (a group or repetition in it)", what);
	else
		snprintf(m, sizeof(m), "a rule %s", what);
	return gp_fail(p, o ? o->off : 0, rc, "%s", m);
}

static void grammar_free(struct kvd_grammar *g)
{
	kvd_grammar_unref(g);
}

static int build(struct gp *p, struct kvd_grammar **ret)
{
	struct lower l = {.p = p};
	struct kvd_grammar *g = NULL;
	int rc = 0;
	uint32_t root = IT_END;
	for (uint32_t r = 0; r < p->n_rules; r++) {
		if (!p->rules[r].defined) {
			char nm[64];
			snprintf(nm, sizeof(nm), "%.*s", (int)(p->rules[r].name_len > 60 ? 60 : p->rules[r].name_len),
				 p->rules[r].name);
			return gp_fail(p, p->rules[r].off, -EINVAL, "undefined rule '%s'", nm);
		}
		if (p->rules[r].name && p->rules[r].name_len == 4 && memcmp(p->rules[r].name, "root", 4) == 0)
			root = r;
	}
	if (root == IT_END)
		return gp_fail(p, p->n, -EINVAL, "no rule named 'root'%s", "");
	l.cap_rules = p->n_rules + 16;
	l.body = calloc(l.cap_rules, sizeof(*l.body));
	l.helper = malloc(((size_t)p->n_sets + 1) * sizeof(uint32_t));
	if (!l.body || !l.helper) {
		rc = oom(p);
		goto out;
	}
	for (uint32_t i = 0; i < p->n_sets; i++)
		l.helper[i] = IT_END;
	l.n_rules = p->n_rules;
	for (uint32_t r = 0; r < p->n_rules && !rc; r++) {
		const struct u32vec *src = &p->rules[r].body;
		struct u32vec out = {0};
		for (uint32_t i = 0; i < src->n && !rc; i++) {
			uint32_t it = src->p[i];
			if (it != IT_END && (it & IT_CP))
				rc = lower_cpset(&l, it & ~IT_CP, &out);
			else
				rc = vec_push(&out, it) ? oom(p) : 0;
		}
		l.body[r] = out;
	}
	if (rc)
		goto out;
	g = calloc(1, sizeof(*g));
	if (!g) {
		rc = oom(p);
		goto out;
	}
	atomic_init(&g->refs, 1);
	g->root = root;
	g->n_rules = l.n_rules;
	uint64_t ne = 0, na = 0;
	for (uint32_t r = 0; r < l.n_rules; r++) {
		ne += l.body[r].n;
		for (uint32_t i = 0; i < l.body[r].n; i++)
			na += l.body[r].p[i] == IT_END;
	}
	if (ne > KVD_GRAMMAR_MAX_ELEMS) {
		rc = gp_fail(p, 0, -E2BIG, "grammar too large after lowering (limit %s elements)", "1048576");
		goto out;
	}
	g->n_elems = (uint32_t)ne;
	g->n_alts = (uint32_t)na;
	g->rule_alt = malloc(((size_t)l.n_rules + 1) * sizeof(uint32_t));
	g->alts = malloc((size_t)na * sizeof(uint32_t) + 4);
	g->elems = malloc((size_t)ne * sizeof(uint32_t) + 4);
	g->sets = malloc((size_t)l.n_sets * 32 + 32);
	if (!g->rule_alt || !g->alts || !g->elems || !g->sets) {
		rc = oom(p);
		goto out;
	}
	g->n_sets = l.n_sets;
	if (l.n_sets)
		memcpy(g->sets, l.sets, (size_t)l.n_sets * 32);
	uint32_t ea = 0, aa = 0;
	for (uint32_t r = 0; r < l.n_rules; r++) {
		g->rule_alt[r] = aa;
		int start = 1;
		for (uint32_t i = 0; i < l.body[r].n; i++) {
			if (start)
				g->alts[aa++] = ea;
			g->elems[ea++] = l.body[r].p[i];
			start = l.body[r].p[i] == IT_END;
		}
	}
	g->rule_alt[l.n_rules] = aa;
	g->bytes = sizeof(*g) + ((size_t)l.n_rules + 1 + na + ne) * sizeof(uint32_t) + (size_t)l.n_sets * 32;
	uint32_t bad = 0;
	rc = gram_check(g, &bad);
	if (rc == -EINVAL)
		rc = rule_fail(p, bad, rc, "is left-recursive (reaches itself without consuming input)");
	else if (rc == -E2BIG)
		rc = rule_fail(p, bad, rc, "is too ambiguous (expands into more than 1024 parse stacks)");
	else if (rc)
		rc = oom(p);
out:
	if (l.body)
		for (uint32_t r = 0; r < l.n_rules; r++)
			free(l.body[r].p);
	free(l.body);
	free(l.helper);
	free(l.sets);
	free(l.set_tab);
	if (rc) {
		grammar_free(g);
		return rc;
	}
	*ret = g;
	return 0;
}

int gram_compile_gbnf(const char *text, size_t len, struct kvd_grammar **ret, struct kvd_grammar_error *err)
{
	struct gp p = {.t = text, .n = len, .err = err};
	int rc;
	if (len > KVD_GRAMMAR_MAX_TEXT_BYTES) {
		gram_err(err, 0, 0, NULL, "grammar text longer than %u bytes", KVD_GRAMMAR_MAX_TEXT_BYTES);
		return -E2BIG;
	}
	rc = parse_grammar(&p);
	if (!rc)
		rc = build(&p, ret);
	for (uint32_t r = 0; r < p.n_rules; r++)
		free(p.rules[r].body.p);
	free(p.rules);
	free(p.names);
	free(p.ranges.p);
	free(p.sets);
	return rc;
}
