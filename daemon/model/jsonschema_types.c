/*
 * daemon/model/jsonschema_types.c — the JSON Schema translator's rule
 * bodies for integers (bounds written out digit by digit: every integer in
 * the range and no other, without leading zeros or "-0"), strings
 * (formats, patterns, lengths counted in characters: each jchar is one
 * code point since surrogate escapes are excluded) and arrays (items and
 * their count).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jsonschema_impl.h"

/* ---- integer ranges ------------------------------------------------------------ */

#define INT_DIGITS 16   /* jint's longest: [1-9][0-9]{0,15} */
#define INT_INF 10000000000000000LL  /* 10^16: beyond what jint writes */

/* Decimal strings x <= y of equal length n: the numbers between, digit by
 * digit. */
static void same_len(struct sbuf *b, const char *x, const char *y, size_t n)
{
	if (n == 0) {
		sb_puts(b, "\"\"");
		return;
	}
	if (x[0] == y[0]) {
		sb_printf(b, "\"%c\" ", x[0]);
		same_len(b, x + 1, y + 1, n - 1);
		return;
	}
	int x_low = 1, y_high = 1;
	for (size_t i = 1; i < n; i++) {
		x_low &= x[i] == '0';
		y_high &= y[i] == '9';
	}
	char nines[INT_DIGITS + 1], zeros[INT_DIGITS + 1];
	memset(nines, '9', n);
	memset(zeros, '0', n);
	sb_puts(b, "( ");
	char lo = x[0], hi = y[0];
	int alt = 0;
	if (!x_low) {
		sb_printf(b, "\"%c\" ( ", x[0]);
		same_len(b, x + 1, nines, n - 1);
		sb_puts(b, " )");
		lo++;
		alt = 1;
	}
	int y_split = !y_high;
	if (y_split)
		hi--;
	if (lo <= hi) {
		sb_printf(b, "%s[%c-%c]", alt ? " | " : "", lo, hi);
		if (n > 1)
			sb_printf(b, " [0-9]{%zu}", n - 1);
		alt = 1;
	}
	if (y_split) {
		sb_printf(b, "%s\"%c\" ( ", alt ? " | " : "", y[0]);
		same_len(b, zeros, y + 1, n - 1);
		sb_puts(b, " )");
	}
	sb_puts(b, " )");
}

/* Non-negative integers in [a, b] (b == INT_INF: no upper bound). */
static void uint_range(struct sbuf *b, long long a, long long hi)
{
	char xs[32], ys[32];
	int la = snprintf(xs, sizeof(xs), "%lld", a);
	int lb = hi >= INT_INF ? INT_DIGITS : snprintf(ys, sizeof(ys), "%lld", hi);
	sb_puts(b, "( ");
	int first = 1;
	long long p = 1; /* 10^(l-1) */
	for (int l = 1; l < la; l++)
		p *= 10;
	for (int l = la; l <= lb; l++, p *= 10) {
		long long lo_l = l == 1 ? 0 : p, hi_l = p * 10 - 1;
		long long x = a > lo_l ? a : lo_l, y = hi < hi_l ? hi : hi_l;
		if (x > y)
			continue;
		char sx[32], sy[32];
		snprintf(sx, sizeof(sx), "%lld", x);
		snprintf(sy, sizeof(sy), "%lld", y);
		sb_puts(b, first ? "" : " | ");
		first = 0;
		same_len(b, sx, sy, (size_t)l);
	}
	sb_puts(b, " )");
}

/* A bound keyword's value, if present: *ret as the nearest integer inside
 * (ceil for lower bounds, floor for upper ones), clamped to +-INT_INF. */
static int int_bound(struct sc *c, const struct jv *node, const char *kw, int lower, int exclusive, long long *ret,
		     int *ret_have)
{
	const struct jv *v = jv_get(node, kw);
	*ret_have = 0;
	if (!v)
		return 0;
	size_t o = js_ptr_push(c, kw, strlen(kw));
	int rc = 0;
	if (v->type != JV_NUM) {
		rc = js_fail(c, v->type == JV_TRUE || v->type == JV_FALSE ? -ENOTSUP : -EINVAL,
			   "'%s' must be a number (draft-4 boolean forms are not supported)", kw);
	} else {
		double d = strtod(v->s, NULL);
		double r = lower ? (exclusive ? floor(d) + 1 : ceil(d)) : (exclusive ? ceil(d) - 1 : floor(d));
		*ret = r <= -(double)INT_INF ? -INT_INF : r >= (double)INT_INF ? INT_INF : (long long)r;
		*ret_have = 1;
	}
	js_ptr_pop(c, o);
	return rc;
}

int js_gen_integer(struct sc *c, const struct jv *node, struct sbuf *b)
{
	long long lo = -INT_INF, hi = INT_INF, v;
	int have, rc;
	static const struct {
		const char *kw;
		int lower, exclusive;
	} bounds[] = {{"minimum", 1, 0}, {"exclusiveMinimum", 1, 1}, {"maximum", 0, 0}, {"exclusiveMaximum", 0, 1}};
	int any = 0;
	for (size_t i = 0; i < 4; i++) {
		if ((rc = int_bound(c, node, bounds[i].kw, bounds[i].lower, bounds[i].exclusive, &v, &have)))
			return rc;
		any |= have;
		if (have && bounds[i].lower && v > lo)
			lo = v;
		if (have && !bounds[i].lower && v < hi)
			hi = v;
	}
	if (!any) {
		sb_puts(b, "jint");
		return 0;
	}
	if (lo > hi || lo >= INT_INF || hi <= -INT_INF)
		return js_fail(c, -EINVAL, "keywords minimum/maximum: no integer lies between the bounds");
	sb_puts(b, "( ");
	int alt = 0;
	if (lo < 0) {
		/* negatives: -[max(1, -hi) .. -lo] */
		long long a = hi < 0 ? -hi : 1, z = lo <= -INT_INF ? INT_INF : -lo;
		sb_puts(b, "\"-\" ");
		uint_range(b, a, z);
		alt = 1;
	}
	if (hi >= 0) {
		if (alt)
			sb_puts(b, " | ");
		uint_range(b, lo > 0 ? lo : 0, hi);
	}
	sb_puts(b, " )");
	return 0;
}


int js_gen_string(struct sc *c, const struct jv *node, struct sbuf *b)
{
	const struct jv *fmt = jv_get(node, "format"), *pat = jv_get(node, "pattern");
	uint32_t lo, hi;
	int rc;
	if ((rc = js_count_kw(c, node, "minLength", 0, &lo)) || (rc = js_count_kw(c, node, "maxLength", UINT32_MAX, &hi)))
		return rc;
	int has_len = jv_get(node, "minLength") || jv_get(node, "maxLength");
	if (fmt) {
		size_t o = js_ptr_push(c, "format", 6);
		const char *rule = NULL;
		if (fmt->type == JV_STR) {
			if (strcmp(fmt->s, "date") == 0)
				rule = "jdate";
			else if (strcmp(fmt->s, "time") == 0)
				rule = "jtime";
			else if (strcmp(fmt->s, "date-time") == 0)
				rule = "jdate \"T\" jtime";
			else if (strcmp(fmt->s, "uuid") == 0)
				rule = "juuid";
		}
		if (!rule)
			rc = js_fail(c, -ENOTSUP, "keyword 'format' value '%.40s' is not supported (date, time, date-time, uuid are)",
				   fmt->type == JV_STR ? fmt->s : "?");
		else if (pat || has_len)
			rc = js_fail(c, -ENOTSUP, "keyword 'format' cannot be combined with pattern or length limits");
		js_ptr_pop(c, o);
		if (rc)
			return rc;
		sb_printf(b, "\"\\\"\" %s \"\\\"\"", rule);
		return 0;
	}
	if (pat) {
		size_t o = js_ptr_push(c, "pattern", 7);
		if (pat->type != JV_STR)
			rc = js_fail(c, -EINVAL, "'pattern' must be a string");
		else if (has_len)
			rc = js_fail(c, -ENOTSUP, "keyword 'pattern' cannot be combined with minLength/maxLength");
		if (!rc) {
			struct kvd_grammar_error re;
			sb_puts(b, "\"\\\"\" ");
			rc = gram_regex_body(pat->s, pat->n, 1, b, &re);
			if (rc)
				rc = js_fail(c, rc, "keyword 'pattern': %s", re.msg);
			sb_puts(b, " \"\\\"\"");
		}
		js_ptr_pop(c, o);
		return rc;
	}
	if (hi != UINT32_MAX && hi < lo)
		return js_fail(c, -EINVAL, "maxLength is below minLength");
	if (!has_len) {
		sb_puts(b, "jstring");
		return 0;
	}
	sb_puts(b, "\"\\\"\" jchar");
	js_rep(b, lo, hi);
	sb_puts(b, " \"\\\"\"");
	return 0;
}

int js_gen_array(struct sc *c, const struct jv *node, struct sbuf *b)
{
	const struct jv *items = jv_get(node, "items");
	uint32_t lo, hi, item = 0;
	int rc, any = 1;
	if ((rc = js_count_kw(c, node, "minItems", 0, &lo)) || (rc = js_count_kw(c, node, "maxItems", UINT32_MAX, &hi)))
		return rc;
	if (hi != UINT32_MAX && hi < lo)
		return js_fail(c, -EINVAL, "maxItems is below minItems");
	if (items && items->type != JV_TRUE) {
		size_t o = js_ptr_push(c, "items", 5);
		if (items->type == JV_ARR)
			rc = js_fail(c, -ENOTSUP, "keyword 'items' as a list (tuples) is not supported");
		else if (items->type == JV_FALSE)
			rc = hi = 0;
		else
			rc = js_gen(c, items, &item), any = 0;
		js_ptr_pop(c, o);
		if (rc)
			return rc;
	}
	char it[16];
	snprintf(it, sizeof(it), any ? "jvalue" : "s%u", item);
	if (hi == 0) {
		sb_puts(b, "\"[\" ws \"]\"");
		return 0;
	}
	sb_printf(b, "\"[\" ws %s%s ( ws \",\" ws %s )", lo ? "" : "( ", it, it);
	js_rep(b, lo ? lo - 1 : 0, hi == UINT32_MAX ? UINT32_MAX : hi - 1);
	sb_puts(b, lo ? " ws \"]\"" : " ws )? \"]\"");
	return 0;
}

