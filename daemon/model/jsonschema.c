/*
 * daemon/model/jsonschema.c — a JSON Schema translated into GBNF, so every
 * output the grammar allows validates against the schema.
 *
 * Honoured: type (one or a list; without it the type is inferred from the
 * keywords, or any value), enum, const, properties with required and
 * additionalProperties (false, true or a schema; extra keys are ones the
 * listed properties do not name, written without escapes), items with
 * minItems / maxItems, minLength / maxLength, pattern (grammar_regex.c's
 * subset, search semantics), format date, time, date-time and uuid, anyOf,
 * oneOf where its branches cannot overlap (distinct types, distinct
 * constants, or objects told apart by a required constant property),
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum for integers
 * (the range written out digit by digit), allOf of one schema, $ref to "#..." pointers in the document ($defs,
 * definitions, or any other place; recursive schemas become recursive
 * rules). Annotations (title, description, default,
 * examples, ...) and unknown keywords are ignored, as the specification
 * says. Keywords that constrain but cannot be honoured exactly (bounds on
 * non-integer numbers, multipleOf, patternProperties, uniqueItems, not, if, ...) are refused
 * with the keyword and its JSON pointer. OpenAPI's "nullable" is not JSON
 * Schema and is ignored like any unknown keyword (a validator would refuse
 * the null it allows).
 *
 * Output shape: properties in the schema's order, required ones first;
 * whitespace between tokens limited to one space or a newline and up to 20
 * indentation characters; numbers of bounded length. Every output is valid
 * even though not every valid document is reachable.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "jsonschema_impl.h"

#define MAX_GEN_DEPTH 256     /* schemas nested through properties, items and $refs */
#define MAX_EXCLUDED_NAME 256 /* code points of a name excluded from extra keys */

static const char PREAMBLE[] =
	"ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
	"jhex ::= [0-9a-fA-F]\n"
	"jesc ::= [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] jhex jhex jhex | [dD] [0-7] jhex jhex )\n"
	"jchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" jesc\n"
	"jkchar ::= [^\"\\\\\\x00-\\x1F]\n"
	"jstring ::= \"\\\"\" jchar* \"\\\"\"\n"
	"jint ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
	"jnumber ::= jint ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
	"jbool ::= \"true\" | \"false\"\n"
	"jnull ::= \"null\"\n"
	"jvalue ::= jobject | jarray | jstring | jnumber | jbool | jnull\n"
	"jobject ::= \"{\" ws ( jstring ws \":\" ws jvalue ( ws \",\" ws jstring ws \":\" ws jvalue )* ws )? \"}\"\n"
	"jarray ::= \"[\" ws ( jvalue ( ws \",\" ws jvalue )* ws )? \"]\"\n"
	"jdate ::= [1-9] [0-9]{3} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )"
	" | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" )"
	" | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )\n"
	"jtime ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )?"
	" ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
	"juuid ::= jhex{8} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{12}\n";

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ANY = 127 };

int js_fail(struct sc *c, int rc, const char *fmt, ...)
{
	if (c->rc)
		return c->rc;
	c->rc = rc;
	char m[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	gram_err(c->err, 0, 0, c->ptr, "#%s: %s", c->ptr, m);
	return rc;
}

/* Append a pointer segment (escaped); returns the length to restore. */
size_t js_ptr_push(struct sc *c, const char *seg, size_t n)
{
	size_t old = c->ptr_len;
	if (c->ptr_len + 1 < PTR_MAX)
		c->ptr[c->ptr_len++] = '/';
	for (size_t i = 0; i < n && c->ptr_len + 2 < PTR_MAX; i++) {
		if (seg[i] == '~' || seg[i] == '/') {
			c->ptr[c->ptr_len++] = '~';
			c->ptr[c->ptr_len++] = seg[i] == '~' ? '0' : '1';
		} else {
			c->ptr[c->ptr_len++] = seg[i];
		}
	}
	c->ptr[c->ptr_len] = 0;
	return old;
}

size_t js_ptr_push_idx(struct sc *c, uint32_t i)
{
	char b[16];
	int n = snprintf(b, sizeof(b), "%u", i);
	return js_ptr_push(c, b, (size_t)n);
}

void js_ptr_pop(struct sc *c, size_t old)
{
	c->ptr_len = old;
	c->ptr[old] = 0;
}

/* Keywords: what each one means here. */
enum kw_class { KW_HANDLED, KW_ANNOTATION, KW_REFUSED };
static const struct {
	const char *name;
	enum kw_class cls;
} KEYWORDS[] = {
	{"type", KW_HANDLED}, {"enum", KW_HANDLED}, {"const", KW_HANDLED}, {"properties", KW_HANDLED},
	{"required", KW_HANDLED}, {"additionalProperties", KW_HANDLED}, {"items", KW_HANDLED},
	{"minItems", KW_HANDLED}, {"maxItems", KW_HANDLED}, {"minLength", KW_HANDLED}, {"maxLength", KW_HANDLED},
	{"pattern", KW_HANDLED}, {"format", KW_HANDLED}, {"anyOf", KW_HANDLED}, {"oneOf", KW_HANDLED},
	{"allOf", KW_HANDLED}, {"$ref", KW_HANDLED},
	{"$defs", KW_ANNOTATION}, {"definitions", KW_ANNOTATION}, {"title", KW_ANNOTATION},
	{"description", KW_ANNOTATION}, {"default", KW_ANNOTATION}, {"examples", KW_ANNOTATION},
	{"$schema", KW_ANNOTATION}, {"$id", KW_ANNOTATION}, {"$comment", KW_ANNOTATION},
	{"deprecated", KW_ANNOTATION}, {"readOnly", KW_ANNOTATION}, {"writeOnly", KW_ANNOTATION},
	{"$anchor", KW_ANNOTATION}, {"contentMediaType", KW_ANNOTATION}, {"contentEncoding", KW_ANNOTATION},
	{"discriminator", KW_ANNOTATION}, {"strict", KW_ANNOTATION},
	{"minimum", KW_HANDLED}, {"maximum", KW_HANDLED}, {"exclusiveMinimum", KW_HANDLED},
	{"exclusiveMaximum", KW_HANDLED}, {"multipleOf", KW_REFUSED}, {"not", KW_REFUSED}, {"if", KW_REFUSED},
	{"then", KW_REFUSED}, {"else", KW_REFUSED}, {"dependentRequired", KW_REFUSED},
	{"dependentSchemas", KW_REFUSED}, {"dependencies", KW_REFUSED}, {"patternProperties", KW_REFUSED},
	{"propertyNames", KW_REFUSED}, {"unevaluatedProperties", KW_REFUSED}, {"unevaluatedItems", KW_REFUSED},
	{"contains", KW_REFUSED}, {"minContains", KW_REFUSED}, {"maxContains", KW_REFUSED},
	{"minProperties", KW_REFUSED}, {"maxProperties", KW_REFUSED}, {"prefixItems", KW_REFUSED},
	{"additionalItems", KW_REFUSED}, {"$dynamicRef", KW_REFUSED}, {"$recursiveRef", KW_REFUSED},
	{"uniqueItems", KW_REFUSED},
};

static int kw_find(const char *k)
{
	for (size_t i = 0; i < sizeof(KEYWORDS) / sizeof(KEYWORDS[0]); i++)
		if (strcmp(KEYWORDS[i].name, k) == 0)
			return (int)i;
	return -1;
}


static uint32_t new_rule_id(struct sc *c)
{
	return c->n_rules++;
}

static void emit_rule(struct sc *c, uint32_t id, const struct sbuf *body)
{
	sb_printf(c->out, "s%u ::= ", id);
	if (body->len)
		sb_putn(c->out, body->p, body->len);
	else
		sb_puts(c->out, "\"\""); /* empty: the body would continue on the next line */
	sb_putc(c->out, '\n');
	if (body->oom)
		c->out->oom = 1;
}

/* A JSON value as a GBNF literal unit. */
static void lit_value(struct sbuf *b, const struct jv *v)
{
	struct sbuf t = {0};
	jv_write(&t, v);
	sb_putc(b, '"');
	sb_gbnf_lit(b, t.p ? t.p : "", t.len);
	sb_putc(b, '"');
	if (t.oom)
		b->oom = 1;
	sb_free(&t);
}

static void lit_key(struct sbuf *b, const char *s, uint32_t n)
{
	struct jv k = {.type = JV_STR, .s = s, .n = n};
	lit_value(b, &k);
}

static int value_types(const struct jv *v)
{
	switch (v->type) {
	case JV_NULL: return T_NULL;
	case JV_TRUE: case JV_FALSE: return T_BOOL;
	case JV_NUM: {
		double d = strtod(v->s, NULL);
		return (isfinite(d) && d == floor(d)) ? (T_INT | T_NUM) : T_NUM;
	}
	case JV_STR: return T_STR;
	case JV_ARR: return T_ARR;
	default: return T_OBJ;
	}
}

static int type_bit(const char *s)
{
	static const char *names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
	for (int i = 0; i < 7; i++)
		if (strcmp(s, names[i]) == 0)
			return 1 << i;
	return 0;
}

/* The "type" keyword as a bit set (0 when absent). */
static int declared_types(struct sc *c, const struct jv *node, int *ret)
{
	const struct jv *t = jv_get(node, "type");
	*ret = 0;
	if (!t)
		return 0;
	size_t o = js_ptr_push(c, "type", 4);
	int rc = 0;
	if (t->type == JV_STR) {
		*ret = type_bit(t->s);
		if (!*ret)
			rc = js_fail(c, -EINVAL, "unknown type '%.40s'", t->s);
	} else if (t->type == JV_ARR && t->n) {
		for (uint32_t i = 0; i < t->n && !rc; i++) {
			int b = t->kids[i].type == JV_STR ? type_bit(t->kids[i].s) : 0;
			if (!b)
				rc = js_fail(c, -EINVAL, "'type' lists something that is not a type name");
			*ret |= b;
		}
	} else {
		rc = js_fail(c, -EINVAL, "'type' must be a type name or a list of them");
	}
	js_ptr_pop(c, o);
	return rc;
}

/* A non-negative integer keyword value, <= KVD_GRAMMAR_MAX_REPEAT. */
int js_count_kw(struct sc *c, const struct jv *node, const char *kw, uint32_t dflt, uint32_t *ret)
{
	const struct jv *v = jv_get(node, kw);
	*ret = dflt;
	if (!v)
		return 0;
	double d = v->type == JV_NUM ? strtod(v->s, NULL) : -1;
	if (!(d >= 0) || d != floor(d))
		return js_fail(c, -EINVAL, "'%s' must be a non-negative integer", kw);
	if (d > KVD_GRAMMAR_MAX_REPEAT)
		return js_fail(c, -E2BIG, "'%s' over the limit (%u)", kw, KVD_GRAMMAR_MAX_REPEAT);
	*ret = (uint32_t)d;
	return 0;
}

void js_rep(struct sbuf *b, uint32_t lo, uint32_t hi)
{
	if (hi == UINT32_MAX) {
		if (lo == 0)
			sb_putc(b, '*');
		else if (lo == 1)
			sb_putc(b, '+');
		else
			sb_printf(b, "{%u,}", lo);
	} else if (lo == hi) {
		sb_printf(b, "{%u}", lo);
	} else {
		sb_printf(b, "{%u,%u}", lo, hi);
	}
}


static const char *const NUMBER_BOUNDS[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

/* Rule for keys that are none of names[0..n) (sorted, each NUL-terminated,
 * sharing their first `off` bytes): a string body without escapes. */
static int gen_not_names(struct sc *c, const char **names, uint32_t n, size_t off, uint32_t depth, uint32_t *ret)
{
	struct sbuf b = {0};
	uint32_t id = new_rule_id(c);
	int rc = 0, terminal = 0;
	if (depth > MAX_EXCLUDED_NAME)
		return js_fail(c, -E2BIG, "a property name is too long to exclude from additionalProperties");
	/* a character none of the names continues with, then anything */
	struct sbuf cls = {0};
	sb_puts(&cls, "[^\"\\\\\\x00-\\x1F");
	for (uint32_t i = 0; i < n;) {
		uint32_t cp;
		const uint8_t *s = (const uint8_t *)names[i] + off;
		size_t l = gram_utf8_decode(s, strlen((const char *)s), &cp);
		if (!l) {
			terminal = 1;
			i++;
			continue;
		}
		uint32_t j = i;
		while (j < n && strncmp(names[j] + off, (const char *)s, l) == 0)
			j++;
		if (cp >= 0x20 && cp != '"' && cp != '\\') {
			uint32_t sub;
			sb_gbnf_class_cp(&cls, cp);
			if ((rc = gen_not_names(c, names + i, j - i, off + l, depth + 1, &sub)))
				break;
			if (b.len)
				sb_puts(&b, " | ");
			sb_putc(&b, '"');
			sb_gbnf_lit(&b, (const char *)s, l);
			sb_printf(&b, "\" s%u", sub);
		}
		i = j;
	}
	sb_puts(&cls, "]");
	if (!rc) {
		if (b.len)
			sb_puts(&b, " | ");
		sb_putn(&b, cls.p, cls.len);
		sb_puts(&b, " jkchar*");
		if (!terminal) {
			/* the empty key body: first, as a rule cannot end with '|' */
			struct sbuf e = {0};
			sb_puts(&e, "| ");
			sb_putn(&e, b.p, b.len);
			sb_free(&b);
			b = e;
		}
		emit_rule(c, id, &b);
		*ret = id;
	}
	sb_free(&b);
	sb_free(&cls);
	return rc;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

struct prop {
	const char *name;
	uint32_t len;
	const struct jv *schema; /* NULL: any value */
	int required;
};

static int gen_object(struct sc *c, const struct jv *node, struct sbuf *b)
{
	const struct jv *props = jv_get(node, "properties"), *req = jv_get(node, "required");
	const struct jv *add = jv_get(node, "additionalProperties");
	struct prop *pl = NULL;
	const char **names = NULL;
	uint32_t np = 0, *kv = NULL, add_rule = 0;
	int rc = 0, add_any = !add || add->type == JV_TRUE, add_none = add && add->type == JV_FALSE;
	struct sbuf t = {0};
	if (props && props->type != JV_OBJ)
		return js_fail(c, -EINVAL, "'properties' must be an object");
	if (req && req->type != JV_ARR)
		return js_fail(c, -EINVAL, "'required' must be a list of names");
	uint32_t cap = (props ? props->n : 0) + (req ? req->n : 0);
	if (cap > KVD_JSONSCHEMA_MAX_PROPERTIES)
		return js_fail(c, -E2BIG, "more than %u properties", KVD_JSONSCHEMA_MAX_PROPERTIES);
	pl = calloc(cap + 1, sizeof(*pl));
	kv = calloc(cap + 1, sizeof(*kv));
	names = calloc(cap + 1, sizeof(*names));
	if (!pl || !kv || !names) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; props && i < props->n; i++)
		pl[np++] = (struct prop){props->kids[2 * i].s, props->kids[2 * i].n, &props->kids[2 * i + 1], 0};
	for (uint32_t i = 0; req && i < req->n; i++) {
		const struct jv *r = &req->kids[i];
		if (r->type != JV_STR) {
			size_t o = js_ptr_push(c, "required", 8);
			rc = js_fail(c, -EINVAL, "'required' must be a list of names");
			js_ptr_pop(c, o);
			goto out;
		}
		uint32_t k = 0;
		while (k < np && !(pl[k].len == r->n && memcmp(pl[k].name, r->s, r->n) == 0))
			k++;
		if (k == np) {
			if (add_none) {
				size_t o = js_ptr_push(c, "required", 8);
				rc = js_fail(c, -EINVAL, "required property '%.60s' is not allowed by additionalProperties false",
					   r->s);
				js_ptr_pop(c, o);
				goto out;
			}
			pl[np++] = (struct prop){r->s, r->n, add_any ? NULL : add, 0};
		}
		pl[k].required = 1;
	}
	/* one rule per member: "name" ws ":" ws value */
	for (uint32_t i = 0; i < np; i++) {
		uint32_t v = 0;
		if (pl[i].schema) {
			size_t o = props && pl[i].schema != add ? js_ptr_push(c, "properties", 10) : c->ptr_len;
			size_t o2 = js_ptr_push(c, pl[i].name, pl[i].len);
			rc = js_gen(c, pl[i].schema, &v);
			js_ptr_pop(c, o2);
			js_ptr_pop(c, o);
			if (rc)
				goto out;
		}
		struct sbuf m = {0};
		lit_key(&m, pl[i].name, pl[i].len);
		if (pl[i].schema)
			sb_printf(&m, " ws \":\" ws s%u", v);
		else
			sb_puts(&m, " ws \":\" ws jvalue");
		kv[i] = new_rule_id(c);
		emit_rule(c, kv[i], &m);
		sb_free(&m);
		names[i] = pl[i].name;
	}
	if (!add_none) {
		uint32_t v = 0, keys;
		if (!add_any) {
			size_t o = js_ptr_push(c, "additionalProperties", 20);
			rc = js_gen(c, add, &v);
			js_ptr_pop(c, o);
			if (rc)
				goto out;
		}
		qsort(names, np, sizeof(*names), cmp_str);
		if ((rc = gen_not_names(c, names, np, 0, 0, &keys)))
			goto out;
		struct sbuf m = {0};
		if (add_any)
			sb_printf(&m, "\"\\\"\" s%u \"\\\"\" ws \":\" ws jvalue", keys);
		else
			sb_printf(&m, "\"\\\"\" s%u \"\\\"\" ws \":\" ws s%u", keys, v);
		add_rule = new_rule_id(c);
		emit_rule(c, add_rule, &m);
		sb_free(&m);
	}
	/* tails: T_k = ( ws "," ws opt_k )? T_k+1, the last one the extras */
	uint32_t n_opt = 0, *opt = calloc(np + 1, sizeof(uint32_t)), *tail = calloc(np + 2, sizeof(uint32_t));
	if (!opt || !tail) {
		free(opt);
		free(tail);
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < np; i++)
		if (!pl[i].required)
			opt[n_opt++] = kv[i];
	tail[n_opt] = new_rule_id(c);
	if (!add_none)
		sb_printf(&t, "( ws \",\" ws s%u )*", add_rule);
	emit_rule(c, tail[n_opt], &t);
	for (uint32_t k = n_opt; k > 0; k--) {
		t.len = 0;
		sb_printf(&t, "( ws \",\" ws s%u )? s%u", opt[k - 1], tail[k]);
		tail[k - 1] = new_rule_id(c);
		emit_rule(c, tail[k - 1], &t);
	}
	int first = 1, n_req = 0;
	for (uint32_t i = 0; i < np; i++)
		if (pl[i].required) {
			if (first)
				sb_printf(b, "\"{\" ws s%u", kv[i]);
			else
				sb_printf(b, " ws \",\" ws s%u", kv[i]);
			first = 0;
			n_req++;
		}
	if (n_req) {
		sb_printf(b, " s%u ws \"}\"", tail[0]);
	} else {
		sb_puts(b, "\"{\" ws ( (");
		int alt = 0;
		for (uint32_t k = 0; k < n_opt; k++, alt = 1)
			sb_printf(b, "%s s%u s%u", alt ? " |" : "", opt[k], tail[k + 1]);
		if (!add_none)
			sb_printf(b, "%s s%u s%u", alt ? " |" : "", add_rule, tail[n_opt]), alt = 1;
		if (!alt)
			b->len -= 3, b->p[b->len] = 0, sb_puts(b, "\"}\"");
		else
			sb_puts(b, " ) ws )? \"}\"");
	}
	free(opt);
	free(tail);
out:
	sb_free(&t);
	free(pl);
	free(kv);
	free(names);
	return rc;
}

/* Keywords beside anyOf/oneOf/allOf/$ref/enum/const that would also
 * constrain: refused rather than combined. allow: the ones that may stay. */
static int only_annotations(struct sc *c, const struct jv *node, const char *with, const char *const *allow)
{
	for (uint32_t i = 0; i < node->n; i++) {
		const char *k = node->kids[2 * i].s;
		int w = kw_find(k);
		if (w < 0 || KEYWORDS[w].cls == KW_ANNOTATION || strcmp(k, with) == 0)
			continue;
		int ok = 0;
		for (const char *const *a = allow; a && *a; a++)
			ok |= strcmp(*a, k) == 0;
		if (!ok)
			return js_fail(c, -ENOTSUP, "keyword '%s' beside '%s' is not supported", k, with);
	}
	return 0;
}

static const struct jv *resolve_ref(struct sc *c, const struct jv *ref)
{
	if (ref->type != JV_STR || ref->n == 0 || ref->s[0] != '#') {
		js_fail(c, -ENOTSUP, "keyword '$ref' to '%.80s': only references within the document (#/...) are supported",
		      ref->type == JV_STR ? ref->s : "?");
		return NULL;
	}
	const struct jv *cur = c->root;
	const char *p = ref->s + 1, *end = ref->s + ref->n;
	if (p < end && *p != '/') {
		js_fail(c, -ENOTSUP, "keyword '$ref' to '%.80s': anchors are not supported", ref->s);
		return NULL;
	}
	while (p < end) {
		p++;
		char seg[256];
		size_t n = 0;
		while (p < end && *p != '/' && n + 1 < sizeof(seg)) {
			if (*p == '~' && p + 1 < end && (p[1] == '0' || p[1] == '1')) {
				seg[n++] = p[1] == '0' ? '~' : '/';
				p += 2;
			} else {
				seg[n++] = *p++;
			}
		}
		seg[n] = 0;
		const struct jv *next = NULL;
		if (cur->type == JV_OBJ) {
			next = jv_get(cur, seg);
		} else if (cur->type == JV_ARR) {
			char *e;
			unsigned long i = strtoul(seg, &e, 10);
			if (*seg && !*e && i < cur->n)
				next = &cur->kids[i];
		}
		if (!next) {
			js_fail(c, -EINVAL, "keyword '$ref': '%.80s' does not resolve in the document", ref->s);
			return NULL;
		}
		cur = next;
	}
	return cur;
}

/* Types a branch can produce, and its constants if it is an enum/const. */
static int branch_types(struct sc *c, const struct jv *s, const struct jv **ret_vals, uint32_t *ret_n)
{
	for (int hop = 0; s->type == JV_OBJ && jv_get(s, "$ref") && hop < (int)KVD_GRAMMAR_MAX_NESTING; hop++) {
		const struct jv *t = resolve_ref(c, jv_get(s, "$ref"));
		if (!t)
			return -1;
		s = t;
	}
	*ret_vals = NULL;
	*ret_n = 0;
	if (s->type != JV_OBJ)
		return T_ANY;
	const struct jv *e = jv_get(s, "enum"), *k = jv_get(s, "const");
	if (k) {
		*ret_vals = k;
		*ret_n = 1;
		return value_types(k);
	}
	if (e && e->type == JV_ARR) {
		int t = 0;
		for (uint32_t i = 0; i < e->n; i++)
			t |= value_types(&e->kids[i]);
		*ret_vals = e->kids;
		*ret_n = e->n;
		return t;
	}
	int t;
	if (declared_types(c, s, &t))
		return -1;
	if (t && (t & T_NUM))
		t |= T_INT;
	return t ? t : T_ANY;
}

/* A required property whose value is one constant: its name and value. */
static const struct jv *discriminator(struct sc *c, const struct jv *s, const char *name)
{
	const struct jv *props = jv_get(s, "properties"), *req = jv_get(s, "required");
	if (!props || !req || req->type != JV_ARR)
		return NULL;
	int is_req = 0;
	for (uint32_t i = 0; i < req->n; i++)
		is_req |= req->kids[i].type == JV_STR && strcmp(req->kids[i].s, name) == 0;
	const struct jv *p = jv_get(props, name), *vals;
	uint32_t n;
	if (!is_req || !p || branch_types(c, p, &vals, &n) < 0 || n != 1)
		return NULL;
	return vals;
}

static int branches_disjoint(struct sc *c, const struct jv *a, const struct jv *b)
{
	const struct jv *va, *vb;
	uint32_t na, nb;
	int ta = branch_types(c, a, &va, &na), tb = branch_types(c, b, &vb, &nb);
	if (ta < 0 || tb < 0)
		return -1;
	if ((ta & tb) == 0)
		return 1;
	if (va && vb) {
		for (uint32_t i = 0; i < na; i++)
			for (uint32_t j = 0; j < nb; j++)
				if (jv_equal(&va[i], &vb[j]))
					return 0;
		return 1;
	}
	for (int hop = 0; a->type == JV_OBJ && jv_get(a, "$ref") && hop < 64; hop++)
		a = resolve_ref(c, jv_get(a, "$ref"));
	for (int hop = 0; b->type == JV_OBJ && jv_get(b, "$ref") && hop < 64; hop++)
		b = resolve_ref(c, jv_get(b, "$ref"));
	if (ta == T_OBJ && tb == T_OBJ && a && b && a->type == JV_OBJ) {
		const struct jv *props = jv_get(a, "properties");
		for (uint32_t i = 0; props && props->type == JV_OBJ && i < props->n; i++) {
			const struct jv *da = discriminator(c, a, props->kids[2 * i].s);
			const struct jv *db = da ? discriminator(c, b, props->kids[2 * i].s) : NULL;
			if (da && db && !jv_equal(da, db))
				return 1;
		}
	}
	return 0;
}

static int gen_body(struct sc *c, const struct jv *node, struct sbuf *b)
{
	int rc;
	if (node->type == JV_TRUE) {
		sb_puts(b, "jvalue");
		return 0;
	}
	if (node->type == JV_FALSE)
		return js_fail(c, -ENOTSUP, "schema 'false' admits nothing");
	if (node->type != JV_OBJ)
		return js_fail(c, -EINVAL, "a schema must be an object or a boolean");
	for (uint32_t i = 0; i < node->n; i++) {
		int w = kw_find(node->kids[2 * i].s);
		if (w >= 0 && KEYWORDS[w].cls == KW_REFUSED) {
			const struct jv *v = &node->kids[2 * i + 1];
			if (strcmp(KEYWORDS[w].name, "uniqueItems") == 0 && v->type == JV_FALSE)
				continue;
			return js_fail(c, -ENOTSUP, "keyword '%s' is not supported", KEYWORDS[w].name);
		}
	}
	const struct jv *ref = jv_get(node, "$ref");
	if (ref) {
		if ((rc = only_annotations(c, node, "$ref", NULL)))
			return rc;
		/* a chain of bare $refs must reach a schema with content */
		const struct jv *t = node;
		for (uint32_t hop = 0; t->type == JV_OBJ && jv_get(t, "$ref"); hop++) {
			if (hop >= KVD_GRAMMAR_MAX_NESTING)
				return js_fail(c, -EINVAL, "keyword '$ref' chain loops or is longer than %u", KVD_GRAMMAR_MAX_NESTING);
			if (!(t = resolve_ref(c, jv_get(t, "$ref"))))
				return c->rc;
		}
		uint32_t r;
		const struct jv *target = resolve_ref(c, ref);
		if (!target)
			return c->rc;
		size_t o = js_ptr_push(c, "$ref", 4);
		rc = js_gen(c, target, &r);
		js_ptr_pop(c, o);
		if (!rc)
			sb_printf(b, "s%u", r);
		return rc;
	}
	int types;
	if ((rc = declared_types(c, node, &types)))
		return rc;
	const struct jv *en = jv_get(node, "enum"), *cn = jv_get(node, "const");
	if (en || cn) {
		static const char *const allow[] = {"type", "enum", "const", NULL};
		if ((rc = only_annotations(c, node, en ? "enum" : "const", allow)))
			return rc;
		if (en && (en->type != JV_ARR || en->n == 0)) {
			size_t o = js_ptr_push(c, "enum", 4);
			rc = js_fail(c, -EINVAL, "'enum' must be a non-empty list");
			js_ptr_pop(c, o);
			return rc;
		}
		if (en && en->n > KVD_JSONSCHEMA_MAX_ENUM)
			return js_fail(c, -E2BIG, "keyword 'enum' has more than %u values", KVD_JSONSCHEMA_MAX_ENUM);
		const struct jv *vals = cn ? cn : en->kids;
		uint32_t n = cn ? 1 : en->n, kept = 0;
		for (uint32_t i = 0; i < n; i++) {
			if (cn && en) {
				int in = 0;
				for (uint32_t j = 0; j < en->n; j++)
					in |= jv_equal(cn, &en->kids[j]);
				if (!in)
					continue;
			}
			if (types && !(value_types(&vals[i]) & types))
				continue;
			sb_puts(b, kept++ ? " | " : "");
			lit_value(b, &vals[i]);
		}
		if (!kept)
			return js_fail(c, -EINVAL, "keyword '%s': no value satisfies the schema", en ? "enum" : "const");
		return 0;
	}
	const struct jv *any = jv_get(node, "anyOf"), *one = jv_get(node, "oneOf"), *all = jv_get(node, "allOf");
	if (any || one || all) {
		const char *kw = any ? "anyOf" : one ? "oneOf" : "allOf";
		const struct jv *list = any ? any : one ? one : all;
		if ((any != NULL) + (one != NULL) + (all != NULL) > 1)
			return js_fail(c, -ENOTSUP, "keywords anyOf, oneOf and allOf together are not supported");
		if ((rc = only_annotations(c, node, kw, NULL)))
			return rc;
		size_t o = js_ptr_push(c, kw, strlen(kw));
		if (list->type != JV_ARR || list->n == 0)
			rc = js_fail(c, -EINVAL, "'%s' must be a non-empty list of schemas", kw);
		else if (all && list->n != 1)
			rc = js_fail(c, -ENOTSUP, "keyword 'allOf' with more than one schema is not supported");
		for (uint32_t i = 0; one && !rc && i < list->n; i++)
			for (uint32_t j = i + 1; !rc && j < list->n; j++) {
				int d = branches_disjoint(c, &list->kids[i], &list->kids[j]);
				if (d < 0)
					rc = c->rc;
				else if (!d)
					rc = js_fail(c, -ENOTSUP,
						   "keyword 'oneOf': branches %u and %u may both match, so exactly-one cannot be "
						   "guaranteed (use anyOf)", i, j);
			}
		sb_puts(b, "( ");
		for (uint32_t i = 0; !rc && i < list->n; i++) {
			uint32_t r;
			size_t o2 = js_ptr_push_idx(c, i);
			rc = js_gen(c, &list->kids[i], &r);
			js_ptr_pop(c, o2);
			sb_printf(b, "%ss%u", i ? " | " : "", r);
		}
		sb_puts(b, " )");
		js_ptr_pop(c, o);
		return rc;
	}
	if (!types) {
		int obj = jv_get(node, "properties") || jv_get(node, "required") || jv_get(node, "additionalProperties");
		int arr = jv_get(node, "items") || jv_get(node, "minItems") || jv_get(node, "maxItems");
		int str = jv_get(node, "minLength") || jv_get(node, "maxLength") || jv_get(node, "pattern") ||
			  jv_get(node, "format");
		if (obj + arr + str > 1)
			return js_fail(c, -ENOTSUP, "keywords of several types without 'type' are not supported");
		types = obj ? T_OBJ : arr ? T_ARR : str ? T_STR : 0;
		if (!types) {
			sb_puts(b, "jvalue");
			return 0;
		}
	}
	if ((types & T_NUM) && (types & T_INT))
		types &= ~T_INT;
	int alt = 0;
	sb_puts(b, "( ");
	for (int bit = 1; bit <= T_OBJ && !rc; bit <<= 1) {
		if (!(types & bit))
			continue;
		if (alt++)
			sb_puts(b, " | ");
		switch (bit) {
		case T_NULL: sb_puts(b, "jnull"); break;
		case T_BOOL: sb_puts(b, "jbool"); break;
		case T_INT: rc = js_gen_integer(c, node, b); break;
		case T_NUM:
			for (size_t k = 0; k < 4 && !rc; k++)
				if (jv_get(node, NUMBER_BOUNDS[k]))
					rc = js_fail(c, -ENOTSUP, "keyword '%s' is supported for integers only", NUMBER_BOUNDS[k]);
			sb_puts(b, "jnumber");
			break;
		case T_STR: rc = js_gen_string(c, node, b); break;
		case T_ARR: rc = js_gen_array(c, node, b); break;
		default: rc = gen_object(c, node, b); break;
		}
	}
	sb_puts(b, " )");
	return rc;
}

int js_gen(struct sc *c, const struct jv *node, uint32_t *ret_rule)
{
	for (uint32_t i = 0; i < c->n_memo; i++)
		if (c->memo[i].node == node) {
			*ret_rule = c->memo[i].rule;
			return 0;
		}
	if (++c->depth > MAX_GEN_DEPTH)
		return js_fail(c, -E2BIG, "schemas nested (through properties, items and $refs) deeper than %u",
			     MAX_GEN_DEPTH);
	uint32_t id = new_rule_id(c);
	if (c->n_memo == c->cap_memo) {
		uint32_t nc = c->cap_memo ? c->cap_memo * 2 : 32;
		struct memo *nm = realloc(c->memo, (size_t)nc * sizeof(*nm));
		if (!nm)
			return -ENOMEM;
		c->memo = nm;
		c->cap_memo = nc;
	}
	c->memo[c->n_memo++] = (struct memo){node, id};
	struct sbuf b = {0};
	int rc = gen_body(c, node, &b);
	if (!rc) {
		emit_rule(c, id, &b);
		*ret_rule = id;
	}
	sb_free(&b);
	c->depth--;
	return rc;
}

int gram_schema_to_gbnf(const char *text, size_t len, int object_only, struct sbuf *out,
			struct kvd_grammar_error *err)
{
	struct jdoc *d = NULL;
	int rc;
	sb_puts(out, PREAMBLE);
	if (object_only) {
		sb_puts(out, "root ::= jobject\n");
		return out->oom ? -ENOMEM : 0;
	}
	if ((rc = jdoc_parse(text, len, &d, err)))
		return rc;
	struct sc c = {.text = text, .root = jdoc_root(d), .out = out, .err = err};
	uint32_t r;
	rc = js_gen(&c, c.root, &r);
	if (!rc)
		sb_printf(out, "root ::= s%u\n", r);
	if (!rc && out->oom)
		rc = -ENOMEM;
	free(c.memo);
	jdoc_free(d);
	return rc;
}
