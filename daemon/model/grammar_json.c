/*
 * daemon/model/grammar_json.c — the small pieces the constraint compilers
 * share: a growable string with GBNF escaping, error formatting, UTF-8, and
 * a JSON reader (a DOM in one arena) for JSON Schemas and choice lists.
 *
 * The reader takes RFC 8259 JSON: one value, strings decoded to UTF-8
 * (escapes included; a lone surrogate escape and invalid UTF-8 are
 * errors), numbers kept as their text, nesting bounded by
 * KVD_GRAMMAR_MAX_NESTING. Errors carry line:column.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

/* ---- sbuf ----------------------------------------------------------------- */

void sb_putn(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t nc = b->cap ? b->cap : 256;
		while (nc < b->len + n + 1)
			nc *= 2;
		char *np = realloc(b->p, nc);
		if (!np) {
			b->oom = 1;
			return;
		}
		b->p = np;
		b->cap = nc;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

void sb_puts(struct sbuf *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

void sb_putc(struct sbuf *b, char c)
{
	sb_putn(b, &c, 1);
}

void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	sb_putn(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

void sb_gbnf_lit(struct sbuf *b, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		if (c == '"' || c == '\\')
			sb_printf(b, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			sb_printf(b, "\\x%02X", c);
		else
			sb_putc(b, (char)c);
	}
}

void sb_gbnf_class_cp(struct sbuf *b, uint32_t cp)
{
	if (cp < 0x20 || cp == 0x7f || cp == '[' || cp == ']' || cp == '\\' || cp == '^' || cp == '-' || cp == '"')
		sb_printf(b, "\\x%02X", cp);
	else if (cp < 0x80)
		sb_putc(b, (char)cp);
	else if (cp < 0x10000)
		sb_printf(b, "\\u%04X", cp);
	else
		sb_printf(b, "\\U%08X", cp);
}

void sb_free(struct sbuf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

void gram_err(struct kvd_grammar_error *err, uint32_t line, uint32_t col, const char *pointer, const char *fmt, ...)
{
	if (!err)
		return;
	err->line = line;
	err->col = col;
	snprintf(err->pointer, sizeof(err->pointer), "%s", pointer ? pointer : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
}

void gram_line_col(const char *text, size_t off, uint32_t *ret_line, uint32_t *ret_col)
{
	uint32_t line = 1, col = 1;
	for (size_t i = 0; i < off; i++) {
		if (text[i] == '\n') {
			line++;
			col = 1;
		} else if (((uint8_t)text[i] & 0xC0) != 0x80) {
			col++;
		}
	}
	*ret_line = line;
	*ret_col = col;
}

size_t gram_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
	if (n == 0)
		return 0;
	uint8_t c = s[0];
	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	size_t len;
	uint32_t v, min;
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
		v = c & 0x1F;
		min = 0x80;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		v = c & 0x0F;
		min = 0x800;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		v = c & 0x07;
		min = 0x10000;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		v = (v << 6) | (s[i] & 0x3F);
	}
	if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
		return 0;
	*cp = v;
	return len;
}

size_t gram_utf8_encode(uint32_t cp, uint8_t *out)
{
	if (cp < 0x80) {
		out[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t)(0xC0 | (cp >> 6));
		out[1] = (uint8_t)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (uint8_t)(0xE0 | (cp >> 12));
		out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (uint8_t)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (uint8_t)(0xF0 | (cp >> 18));
	out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (uint8_t)(0x80 | (cp & 0x3F));
	return 4;
}

/* ---- JSON reader ------------------------------------------------------------ */

struct chunk {
	struct chunk *next;
	size_t used, cap;
	_Alignas(16) unsigned char mem[];
};

struct jdoc {
	struct chunk *chunks;
	struct jv root;
};

struct jp {
	const char *t;
	size_t n, pos;
	struct jdoc *d;
	uint32_t depth;
	struct kvd_grammar_error *err;
	int rc;
};

static void *jalloc(struct jdoc *d, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	struct chunk *c = d->chunks;
	if (!c || c->cap - c->used < n) {
		size_t cap = n > 16384 ? n : 16384;
		c = malloc(sizeof(*c) + cap);
		if (!c)
			return NULL;
		c->cap = cap;
		c->used = 0;
		c->next = d->chunks;
		d->chunks = c;
	}
	void *p = c->mem + c->used;
	c->used += n;
	return p;
}

static int jfail(struct jp *p, int rc, const char *what)
{
	if (p->rc)
		return p->rc;
	p->rc = rc;
	uint32_t line, col;
	gram_line_col(p->t, p->pos, &line, &col);
	gram_err(p->err, line, col, NULL, "%u:%u: JSON: %s", line, col, what);
	return rc;
}

static void jws(struct jp *p)
{
	while (p->pos < p->n && (p->t[p->pos] == ' ' || p->t[p->pos] == '\t' || p->t[p->pos] == '\n' ||
				 p->t[p->pos] == '\r'))
		p->pos++;
}

static int jhex4(struct jp *p, uint32_t *v)
{
	*v = 0;
	if (p->n - p->pos < 4)
		return jfail(p, -EINVAL, "bad \\u escape");
	for (int i = 0; i < 4; i++) {
		char c = p->t[p->pos++];
		int h = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
			: (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
		if (h < 0)
			return jfail(p, -EINVAL, "bad \\u escape");
		*v = *v * 16 + (uint32_t)h;
	}
	return 0;
}

static int jstring(struct jp *p, struct jv *v)
{
	size_t start = ++p->pos, end = start;
	while (end < p->n && p->t[end] != '"') {
		if (p->t[end] == '\\')
			end++;
		end++;
	}
	if (end >= p->n)
		return jfail(p, -EINVAL, "unterminated string");
	char *out = jalloc(p->d, end - start + 1);
	if (!out)
		return jfail(p, -ENOMEM, "out of memory");
	size_t o = 0;
	while (p->pos < end) {
		uint8_t c = (uint8_t)p->t[p->pos];
		if (c < 0x20)
			return jfail(p, -EINVAL, "control character in string");
		if (c != '\\') {
			uint32_t cp;
			size_t l = gram_utf8_decode((const uint8_t *)p->t + p->pos, end - p->pos, &cp);
			if (!l)
				return jfail(p, -EINVAL, "invalid UTF-8 in string");
			memcpy(out + o, p->t + p->pos, l);
			o += l;
			p->pos += l;
			continue;
		}
		p->pos++;
		char e = p->t[p->pos++];
		uint32_t cp;
		switch (e) {
		case '"': out[o++] = '"'; continue;
		case '\\': out[o++] = '\\'; continue;
		case '/': out[o++] = '/'; continue;
		case 'b': out[o++] = '\b'; continue;
		case 'f': out[o++] = '\f'; continue;
		case 'n': out[o++] = '\n'; continue;
		case 'r': out[o++] = '\r'; continue;
		case 't': out[o++] = '\t'; continue;
		case 'u':
			if (jhex4(p, &cp))
				return p->rc;
			if (cp >= 0xD800 && cp <= 0xDBFF) {
				uint32_t lo;
				if (p->n - p->pos < 6 || p->t[p->pos] != '\\' || p->t[p->pos + 1] != 'u')
					return jfail(p, -EINVAL, "lone surrogate escape");
				p->pos += 2;
				if (jhex4(p, &lo))
					return p->rc;
				if (lo < 0xDC00 || lo > 0xDFFF)
					return jfail(p, -EINVAL, "lone surrogate escape");
				cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			} else if (cp >= 0xDC00 && cp <= 0xDFFF) {
				return jfail(p, -EINVAL, "lone surrogate escape");
			}
			o += gram_utf8_encode(cp, (uint8_t *)out + o);
			continue;
		default:
			return jfail(p, -EINVAL, "bad escape in string");
		}
	}
	out[o] = 0;
	p->pos = end + 1;
	v->type = JV_STR;
	v->s = out;
	v->n = (uint32_t)o;
	return 0;
}

static int jnumber(struct jp *p, struct jv *v)
{
	size_t s = p->pos;
	const char *t = p->t;
	if (p->pos < p->n && t[p->pos] == '-')
		p->pos++;
	if (p->pos < p->n && t[p->pos] == '0')
		p->pos++;
	else if (p->pos < p->n && t[p->pos] >= '1' && t[p->pos] <= '9')
		while (p->pos < p->n && t[p->pos] >= '0' && t[p->pos] <= '9')
			p->pos++;
	else
		return jfail(p, -EINVAL, "unexpected character");
	if (p->pos < p->n && t[p->pos] == '.') {
		p->pos++;
		if (p->pos >= p->n || t[p->pos] < '0' || t[p->pos] > '9')
			return jfail(p, -EINVAL, "bad number");
		while (p->pos < p->n && t[p->pos] >= '0' && t[p->pos] <= '9')
			p->pos++;
	}
	if (p->pos < p->n && (t[p->pos] == 'e' || t[p->pos] == 'E')) {
		p->pos++;
		if (p->pos < p->n && (t[p->pos] == '+' || t[p->pos] == '-'))
			p->pos++;
		if (p->pos >= p->n || t[p->pos] < '0' || t[p->pos] > '9')
			return jfail(p, -EINVAL, "bad number");
		while (p->pos < p->n && t[p->pos] >= '0' && t[p->pos] <= '9')
			p->pos++;
	}
	char *out = jalloc(p->d, p->pos - s + 1);
	if (!out)
		return jfail(p, -ENOMEM, "out of memory");
	memcpy(out, t + s, p->pos - s);
	out[p->pos - s] = 0;
	v->type = JV_NUM;
	v->s = out;
	v->n = (uint32_t)(p->pos - s);
	return 0;
}

static int jvalue(struct jp *p, struct jv *v);

static int jcontainer(struct jp *p, struct jv *v, int obj)
{
	if (++p->depth > KVD_GRAMMAR_MAX_NESTING)
		return jfail(p, -E2BIG, "nested too deeply");
	p->pos++;
	struct jv *tmp = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	jws(p);
	if (p->pos < p->n && p->t[p->pos] == (obj ? '}' : ']')) {
		p->pos++;
		goto done;
	}
	for (;;) {
		if (n + 2 > cap) {
			cap = cap ? cap * 2 : 8;
			struct jv *nt = realloc(tmp, cap * sizeof(*nt));
			if (!nt) {
				rc = jfail(p, -ENOMEM, "out of memory");
				goto out;
			}
			tmp = nt;
		}
		jws(p);
		memset(&tmp[n], 0, 2 * sizeof(*tmp));
		if (obj) {
			if (p->pos >= p->n || p->t[p->pos] != '"') {
				rc = jfail(p, -EINVAL, "expected a member name");
				goto out;
			}
			tmp[n].off = (uint32_t)p->pos;
			if ((rc = jstring(p, &tmp[n])))
				goto out;
			n++;
			jws(p);
			if (p->pos >= p->n || p->t[p->pos] != ':') {
				rc = jfail(p, -EINVAL, "expected ':'");
				goto out;
			}
			p->pos++;
			jws(p);
		}
		if ((rc = jvalue(p, &tmp[n])))
			goto out;
		n++;
		jws(p);
		if (p->pos < p->n && p->t[p->pos] == ',') {
			p->pos++;
			continue;
		}
		if (p->pos < p->n && p->t[p->pos] == (obj ? '}' : ']')) {
			p->pos++;
			break;
		}
		rc = jfail(p, -EINVAL, obj ? "expected ',' or '}'" : "expected ',' or ']'");
		goto out;
	}
done:
	v->type = obj ? JV_OBJ : JV_ARR;
	v->n = (uint32_t)(obj ? n / 2 : n);
	if (n) {
		v->kids = jalloc(p->d, n * sizeof(*tmp));
		if (!v->kids) {
			rc = jfail(p, -ENOMEM, "out of memory");
			goto out;
		}
		memcpy(v->kids, tmp, n * sizeof(*tmp));
	}
out:
	free(tmp);
	p->depth--;
	return rc;
}

static int jvalue(struct jp *p, struct jv *v)
{
	jws(p);
	v->off = (uint32_t)p->pos;
	if (p->pos >= p->n)
		return jfail(p, -EINVAL, "unexpected end of text");
	char c = p->t[p->pos];
	if (c == '{' || c == '[')
		return jcontainer(p, v, c == '{');
	if (c == '"')
		return jstring(p, v);
	static const struct {
		const char *w;
		enum jv_type t;
	} words[] = {{"null", JV_NULL}, {"true", JV_TRUE}, {"false", JV_FALSE}};
	for (size_t i = 0; i < 3; i++) {
		size_t l = strlen(words[i].w);
		if (p->n - p->pos >= l && memcmp(p->t + p->pos, words[i].w, l) == 0) {
			p->pos += l;
			v->type = words[i].t;
			return 0;
		}
	}
	return jnumber(p, v);
}

int jdoc_parse(const char *text, size_t len, struct jdoc **ret, struct kvd_grammar_error *err)
{
	if (len > KVD_GRAMMAR_MAX_TEXT_BYTES) {
		gram_err(err, 0, 0, NULL, "JSON text longer than %u bytes", KVD_GRAMMAR_MAX_TEXT_BYTES);
		return -E2BIG;
	}
	struct jdoc *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	struct jp p = {.t = text, .n = len, .d = d, .err = err};
	int rc = jvalue(&p, &d->root);
	if (!rc) {
		jws(&p);
		if (p.pos < p.n)
			rc = jfail(&p, -EINVAL, "text after the value");
	}
	if (rc) {
		jdoc_free(d);
		return rc;
	}
	*ret = d;
	return 0;
}

const struct jv *jdoc_root(const struct jdoc *d)
{
	return &d->root;
}

struct jdoc *jdoc_free(struct jdoc *d)
{
	if (!d)
		return NULL;
	for (struct chunk *c = d->chunks, *n; c; c = n) {
		n = c->next;
		free(c);
	}
	free(d);
	return NULL;
}

const struct jv *jv_get(const struct jv *o, const char *key)
{
	if (!o || o->type != JV_OBJ)
		return NULL;
	size_t kl = strlen(key);
	for (uint32_t i = 0; i < o->n; i++)
		if (o->kids[2 * i].n == kl && memcmp(o->kids[2 * i].s, key, kl) == 0)
			return &o->kids[2 * i + 1];
	return NULL;
}

static void jv_write_str(struct sbuf *b, const char *s, size_t n)
{
	sb_putc(b, '"');
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		if (c == '"' || c == '\\')
			sb_printf(b, "\\%c", c);
		else if (c == '\n')
			sb_puts(b, "\\n");
		else if (c == '\t')
			sb_puts(b, "\\t");
		else if (c == '\r')
			sb_puts(b, "\\r");
		else if (c < 0x20)
			sb_printf(b, "\\u%04x", c);
		else
			sb_putc(b, (char)c);
	}
	sb_putc(b, '"');
}

void jv_write(struct sbuf *b, const struct jv *v)
{
	switch (v->type) {
	case JV_NULL: sb_puts(b, "null"); break;
	case JV_TRUE: sb_puts(b, "true"); break;
	case JV_FALSE: sb_puts(b, "false"); break;
	case JV_NUM: sb_putn(b, v->s, v->n); break;
	case JV_STR: jv_write_str(b, v->s, v->n); break;
	case JV_ARR:
		sb_putc(b, '[');
		for (uint32_t i = 0; i < v->n; i++) {
			if (i)
				sb_putc(b, ',');
			jv_write(b, &v->kids[i]);
		}
		sb_putc(b, ']');
		break;
	case JV_OBJ:
		sb_putc(b, '{');
		for (uint32_t i = 0; i < v->n; i++) {
			if (i)
				sb_putc(b, ',');
			jv_write_str(b, v->kids[2 * i].s, v->kids[2 * i].n);
			sb_putc(b, ':');
			jv_write(b, &v->kids[2 * i + 1]);
		}
		sb_putc(b, '}');
		break;
	}
}

int jv_equal(const struct jv *a, const struct jv *b)
{
	if (a->type == JV_NUM && b->type == JV_NUM)
		return strtod(a->s, NULL) == strtod(b->s, NULL);
	if (a->type != b->type || a->n != b->n)
		return 0;
	switch (a->type) {
	case JV_STR:
		return memcmp(a->s, b->s, a->n) == 0;
	case JV_ARR:
		for (uint32_t i = 0; i < a->n; i++)
			if (!jv_equal(&a->kids[i], &b->kids[i]))
				return 0;
		return 1;
	case JV_OBJ:
		for (uint32_t i = 0; i < a->n; i++) {
			const struct jv *o = jv_get(b, a->kids[2 * i].s);
			if (!o || !jv_equal(&a->kids[2 * i + 1], o))
				return 0;
		}
		return 1;
	default:
		return 1;
	}
}
