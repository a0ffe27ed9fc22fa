/*
 * tests/unit/test_grammar.c — the constraint engine (daemon/model/grammar*.c,
 * jsonschema.c): GBNF parsing and its errors, regexes and choices, JSON
 * Schema translation and refusals, the limits a hostile grammar meets, the
 * matcher's state (copy, save/load), masks against per-token checks, and
 * the compile cache.
 *
 * The schema suite walks each schema's grammar with the default model's
 * real vocabulary (SmolLM2, 49k tokens): random allowed tokens until the
 * constraint is complete, then checks that the text parses as JSON and
 * validates against the schema with a small validator written here (it
 * shares nothing with the translator). Walks that reach the step cap are
 * cut, not judged. Mask timing is printed, never asserted.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "gguf.h"
#include "grammar.h"
#include "grammar_impl.h"
#include "tokenizer.h"

#define MODEL_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ---- helpers --------------------------------------------------------------- */

static struct kvd_gram_scratch *scr;

static struct kvd_grammar *compile_ok(enum kvd_grammar_kind kind, const char *text)
{
	struct kvd_grammar *g = NULL;
	struct kvd_grammar_error e;
	int rc = kvd_grammar_compile(kind, text, strlen(text), &g, &e);
	if (rc)
		print_error("compile failed (%d): %s\n  for: %s\n", rc, e.msg, text);
	assert_int_equal(rc, 0);
	return g;
}

/* 1: text is a complete sentence; 0: a prefix; -ENOENT: rejected */
static int match(const struct kvd_grammar *g, const char *text)
{
	struct kvd_gram_state st = {0};
	assert_int_equal(kvd_gram_state_init(g, scr, &st), 0);
	int rc = kvd_gram_accept_bytes(g, scr, &st, (const uint8_t *)text, strlen(text));
	if (rc == 0)
		rc = kvd_gram_is_complete(&st);
	kvd_gram_state_fini(&st);
	return rc;
}

struct mcase {
	const char *text;
	int want;
};

static void check_cases(enum kvd_grammar_kind kind, const char *src, const struct mcase *c, size_t n)
{
	struct kvd_grammar *g = compile_ok(kind, src);
	for (size_t i = 0; i < n; i++) {
		int got = match(g, c[i].text);
		if (got != c[i].want)
			print_error("grammar %s\n  text '%s': got %d, want %d\n", src, c[i].text, got, c[i].want);
		assert_int_equal(got, c[i].want);
	}
	kvd_grammar_unref(g);
}

#define CASES(kind, src, ...)                                                          \
	do {                                                                           \
		static const struct mcase cs_[] = {__VA_ARGS__};                       \
		check_cases(kind, src, cs_, sizeof(cs_) / sizeof(cs_[0]));             \
	} while (0)

#define REJ (-ENOENT)

/* ---- GBNF -------------------------------------------------------------------- */

static void test_gbnf_basics(void **state)
{
	(void)state;
	CASES(KVD_GRAMMAR_GBNF, "root ::= \"a\" [b-d]+ (\"x\" | \"yz\")?",
	      {"a", 0}, {"ab", 1}, {"abdcx", 1}, {"abyz", 1}, {"aby", 0}, {"abxx", REJ}, {"ae", REJ}, {"", 0});
	/* comments, newlines inside groups, continuation lines, repetition */
	CASES(KVD_GRAMMAR_GBNF,
	      "# a comment\nroot ::= item{2,3} # trailing\nitem ::= [^a-z]\n   | \"é\"\n",
	      {"ÉÉ", 1}, {"éé", 1}, {"XYZ", 1}, {"XYZW", REJ}, {"X", 0}, {"aa", REJ});
	CASES(KVD_GRAMMAR_GBNF, "root ::= (\n  \"a\" |\n  \"b\"\n)* \"!\"", {"!", 1}, {"abba!", 1}, {"abc", REJ});
	CASES(KVD_GRAMMAR_GBNF, "root ::= \"x\"{3}", {"xx", 0}, {"xxx", 1}, {"xxxx", REJ});
	CASES(KVD_GRAMMAR_GBNF, "root ::= \"ab\"{2,}", {"ab", 0}, {"abab", 1}, {"ababab", 1}, {"aba", 0});
	CASES(KVD_GRAMMAR_GBNF, "root ::= [0-9]{0,2} \".\"", {".", 1}, {"12.", 1}, {"123", REJ});
	/* escapes */
	CASES(KVD_GRAMMAR_GBNF, "root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\\\\\\\"\" [\\]\\-]",
	      {"Aé😀\n\t\\\"]", 1}, {"Aé😀\n\t\\\"-", 1}, {"Aé😀\n\t\\\"x", REJ});
	/* '.' is one whole character; a class never matches half of one or a surrogate */
	CASES(KVD_GRAMMAR_GBNF, "root ::= . \"|\"", {"a|", 1}, {"日|", 1}, {"😀|", 1}, {"\xed\xa0\x80|", REJ},
	      {"\xc3|", REJ});
	CASES(KVD_GRAMMAR_GBNF, "root ::= [^\"\\\\]*", {"abc日本", 1}, {"a\"", REJ}, {"\xff", REJ});
	/* nested references, right recursion (balanced parentheses) */
	CASES(KVD_GRAMMAR_GBNF, "root ::= p\np ::= \"(\" p* \")\"", {"()", 1}, {"(()())", 1}, {"(()", 0}, {"())", REJ});
	/* an empty class never matches (and needs no ranges at all) */
	CASES(KVD_GRAMMAR_GBNF, "root ::= [] | \"a\"", {"a", 1}, {"b", REJ}, {"", 0});
	/* an empty literal and an empty alternative */
	CASES(KVD_GRAMMAR_GBNF, "root ::= \"\" | \"a\"", {"", 1}, {"a", 1}, {"b", REJ});
}

struct ecase {
	const char *src;
	int rc;
	uint32_t line, col;
	const char *msg;
};

static void test_gbnf_errors(void **state)
{
	(void)state;
	static const struct ecase cases[] = {
		{"root ::= foo", -EINVAL, 1, 10, "undefined rule 'foo'"},
		{"root ::= \"a\"\nroot ::= \"b\"", -EINVAL, 2, 1, "defined twice"},
		{"item ::= \"a\"", -EINVAL, 1, 13, "no rule named 'root'"},
		{"root := \"a\"", -EINVAL, 1, 6, "expected '::='"},
		{"root ::= \"abc", -EINVAL, 1, 10, "unterminated string"},
		{"root ::= [a-", -EINVAL, 1, 10, "unterminated character class"},
		{"root ::= [z-a]", -EINVAL, 1, 13, "out of order"},
		{"root ::= (\"a\"", -EINVAL, 1, 14, "expected ')'"},
		{"root ::= \"a\" )", -EINVAL, 1, 14, "unexpected character ')'"},
		{"root ::= * \"a\"", -EINVAL, 1, 10, "nothing to repeat"},
		{"root ::= \"a\"{3,2}", -EINVAL, 1, 13, "n < m"},
		{"root ::= \"a\"{2", -EINVAL, 1, 15, "expected '}'"},
		{"root ::= \"\\q\"", -EINVAL, 1, 11, "unknown escape"},
		{"root ::= \"\\u12\"", -EINVAL, 1, 11, "hex digits"},
		{"root ::= \"a\"\n\n  x ::= \"b\" \"c\n", -EINVAL, 3, 13, "unterminated string"},
		{"root ::= root \"a\" | \"b\"", -EINVAL, 1, 1, "left-recursive"},
		{"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", -EINVAL, 2, 1, "left-recursive"},
		{"root ::= (\"a\"?)*", -EINVAL, 1, 1, "left-recursive"},
		{"root ::= \"a\"{5000}", -E2BIG, 1, 14, "repetition bound"},
		{"root ::= \"\xff\"", -EINVAL, 1, 11, "invalid UTF-8"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct kvd_grammar *g = NULL;
		struct kvd_grammar_error e;
		const struct ecase *c = &cases[i];
		int rc = kvd_grammar_compile(KVD_GRAMMAR_GBNF, c->src, strlen(c->src), &g, &e);
		if (rc != c->rc || e.line != c->line || e.col != c->col || !strstr(e.msg, c->msg))
			print_error("case %zu '%s': rc %d at %u:%u '%s'; want %d at %u:%u '%s'\n", i, c->src, rc, e.line,
				    e.col, e.msg, c->rc, c->line, c->col, c->msg);
		assert_int_equal(rc, c->rc);
		assert_int_equal(e.line, c->line);
		assert_int_equal(e.col, c->col);
		assert_non_null(strstr(e.msg, c->msg));
		assert_null(g);
	}
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Grammars built to stall or blow up a naive engine are refused by a named
 * limit (or matched within the per-step limits), never run away. */
static void test_hostile_grammars(void **state)
{
	(void)state;
	struct sbuf b = {0};
	struct kvd_grammar *g = NULL;
	struct kvd_grammar_error e;
	/* 1. groups nested beyond the limit */
	sb_puts(&b, "root ::= ");
	for (int i = 0; i < 100; i++)
		sb_putc(&b, '(');
	sb_puts(&b, "\"a\"");
	for (int i = 0; i < 100; i++)
		sb_putc(&b, ')');
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, b.p, b.len, &g, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "nested too deeply"));
	/* 2. exponential ambiguity: each rule doubles the stacks */
	b.len = 0;
	sb_puts(&b, "root ::= r0\n");
	for (int i = 0; i < 40; i++)
		sb_printf(&b, "r%d ::= r%d | r%d\n", i, i + 1, i + 1);
	sb_puts(&b, "r40 ::= \"x\"\n");
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, b.p, b.len, &g, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "too ambiguous"));
	/* 3. a nullable unit under a long repetition expands through every
	 * copy at once: refused; nested repetitions of a non-empty unit compile
	 * linearly (units become rules) */
	double t0 = now_ms();
	const char *nest = "root ::= ((\"a\"{0,4000}){0,4000}){0,4000}";
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, nest, strlen(nest), &g, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "too ambiguous"));
	nest = "root ::= ((\"a\"{1,4000} \",\"){1,4000}){0,4000}";
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, nest, strlen(nest), &g, &e), 0);
	assert_int_equal(match(g, "aaa,a,"), 1);
	kvd_grammar_unref(g);
	/* 4. too many repetitions in total: the element budget */
	b.len = 0;
	sb_puts(&b, "root ::= ");
	for (int i = 0; i < 300; i++)
		sb_puts(&b, "[a-z]{4000} ");
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, b.p, b.len, &g, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "too large"));
	/* 5. a chain of 10000 rules: no recursion in the compiler or the
	 * matcher; 30000 exceed the expansion work allowed per byte */
	for (int len = 10000; len <= 30000; len += 20000) {
		b.len = 0;
		sb_puts(&b, "root ::= c0\n");
		for (int i = 0; i < len; i++)
			sb_printf(&b, "c%d ::= c%d\n", i, i + 1);
		sb_printf(&b, "c%d ::= \"z\"\n", len);
		int rc = kvd_grammar_compile(KVD_GRAMMAR_GBNF, b.p, b.len, &g, &e);
		if (len == 10000) {
			assert_int_equal(rc, 0);
			assert_int_equal(match(g, "z"), 1);
			kvd_grammar_unref(g);
		} else {
			assert_int_equal(rc, -E2BIG);
			assert_non_null(strstr(e.msg, "parse stacks"));
		}
	}
	/* 6. more rules than the limit */
	b.len = 0;
	sb_puts(&b, "root ::= \"a\"\n");
	for (int i = 0; i < 33000; i++)
		sb_printf(&b, "x%d ::= \"a\"\n", i);
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, b.p, b.len, &g, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "too many rules"));
	/* 7. text over the size limit */
	char *big = malloc(KVD_GRAMMAR_MAX_TEXT_BYTES + 2);
	memset(big, ' ', KVD_GRAMMAR_MAX_TEXT_BYTES + 1);
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_GBNF, big, KVD_GRAMMAR_MAX_TEXT_BYTES + 1, &g, &e), -E2BIG);
	free(big);
	/* 8. run-time depth: nesting beyond the stack limit is refused, shallow
	 * nesting still matches */
	g = compile_ok(KVD_GRAMMAR_GBNF, "root ::= \"(\" root \")\" | \"x\"");
	b.len = 0;
	for (int i = 0; i < 2000; i++)
		sb_putc(&b, '(');
	assert_int_equal(match(g, b.p), -ENOENT);
	assert_int_equal(match(g, "((((x))))"), 1);
	kvd_grammar_unref(g);
	/* 9. run-time ambiguity: (a|a|...)* keeps one stack per distinct path */
	g = compile_ok(KVD_GRAMMAR_GBNF, "root ::= (\"a\" | \"a\" | [a] | \"a\" \"a\"?)*");
	b.len = 0;
	for (int i = 0; i < 5000; i++)
		sb_putc(&b, 'a');
	assert_int_equal(match(g, b.p), 1);
	kvd_grammar_unref(g);
	double t1 = now_ms();
	print_message("hostile grammars: refused or matched in %.1f ms\n", t1 - t0);
	sb_free(&b);
}

/* ---- regex and choices ---------------------------------------------------------- */

static void test_regex(void **state)
{
	(void)state;
	CASES(KVD_GRAMMAR_REGEX, "[a-c]+\\d{2}(foo|bar)?", {"abc12", 1}, {"abc12foo", 1}, {"a1", 0}, {"x12", REJ});
	CASES(KVD_GRAMMAR_REGEX, "^(?:\\+1[- ])?\\(?\\d{3}\\)?[- ]\\d{4}$", {"+1 (555) 1234", 1}, {"555-1234", 1},
	      {"5551234", REJ});
	CASES(KVD_GRAMMAR_REGEX, "a.c", {"abc", 1}, {"a日c", 1}, {"a\nc", REJ});
	CASES(KVD_GRAMMAR_REGEX, "[^\\d]x", {"ax", 1}, {"1x", REJ}, {"éx", REJ} /* ASCII-limited */);
	CASES(KVD_GRAMMAR_REGEX, "[^0-9]x", {"éx", 1}, {"1x", REJ});
	CASES(KVD_GRAMMAR_REGEX, "\\w+@\\w+\\.(com|org)", {"me@site.org", 1}, {"me@site.net", REJ});
	CASES(KVD_GRAMMAR_REGEX, "x{2,3}?y{,}", {"xx", 0}, {"xxy{,}", 1});
	CASES(KVD_GRAMMAR_REGEX, "(?P<year>[0-9]{4})-(?<m>[0-9]{2})", {"2024-05", 1});
	CASES(KVD_GRAMMAR_REGEX, "[]a]|\\.", {"]", 1}, {"a", 1}, {".", 1}, {"b", REJ});
	/* in a schema: search semantics inside a JSON string */
	CASES(KVD_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"ab+c\"}", {"\"xxabbbcyy\"", 1}, {"\"abc\"", 1},
	      {"\"ac\"", REJ}, {"\"a\\\"bc\"", REJ});
	CASES(KVD_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^a\\\\n$\"}", {"\"a\\n\"", 1}, {"\"an\"", REJ});
	static const struct ecase bad[] = {
		{"(a", -EINVAL, 1, 1, "missing ')'"},
		{"a)", -EINVAL, 1, 2, "unbalanced"},
		{"(?=a)", -ENOTSUP, 1, 1, "lookaround"},
		{"(a)\\1", -ENOTSUP, 1, 4, "backreference"},
		{"\\bword", -ENOTSUP, 1, 1, "word boundaries"},
		{"a^b", -ENOTSUP, 1, 2, "'^'"},
		{"a$b", -ENOTSUP, 1, 2, "'$'"},
		{"a**", -EINVAL, 1, 3, "multiple repeat"},
		{"a{9999}", -E2BIG, 1, 2, "repetition bound"},
		{"[abc", -EINVAL, 1, 1, "unterminated"},
		{"a*+", -ENOTSUP, 1, 3, "possessive"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvd_grammar *g = NULL;
		struct kvd_grammar_error e;
		int rc = kvd_grammar_compile(KVD_GRAMMAR_REGEX, bad[i].src, strlen(bad[i].src), &g, &e);
		if (rc != bad[i].rc || e.col != bad[i].col || !strstr(e.msg, bad[i].msg))
			print_error("regex '%s': %d '%s'\n", bad[i].src, rc, e.msg);
		assert_int_equal(rc, bad[i].rc);
		assert_int_equal(e.line, bad[i].line);
		assert_int_equal(e.col, bad[i].col);
		assert_non_null(strstr(e.msg, bad[i].msg));
	}
}

static void test_choices(void **state)
{
	(void)state;
	CASES(KVD_GRAMMAR_CHOICE, "[\"yes\", \"no\", \"maybe\", \"n\\\"o\\\\\", \"日本\", \"\"]", {"yes", 1}, {"no", 1},
	      {"may", 0}, {"maybe", 1}, {"n\"o\\", 1}, {"日本", 1}, {"", 1}, {"nope", REJ});
	struct kvd_grammar *g = NULL;
	struct kvd_grammar_error e;
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_CHOICE, "[\"a\", 3]", 8, &g, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "1:7: choices: element 1 is not a string"));
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_CHOICE, "[]", 2, &g, &e), -EINVAL);
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_CHOICE, "{\"a\":1}", 7, &g, &e), -EINVAL);
}

/* ---- JSON Schema: refusals ---------------------------------------------------------- */

struct refusal {
	const char *schema;
	int rc;
	const char *msg;   /* must appear in the message */
	const char *pointer;
};

static void test_schema_refusals(void **state)
{
	(void)state;
	static const struct refusal cases[] = {
		{"{\"type\":\"number\",\"maximum\":0}", -ENOTSUP, "keyword 'maximum' is supported for integers only", ""},
		{"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":2}}}", -ENOTSUP,
		 "keyword 'multipleOf'", "/properties/a"},
		{"{\"type\":\"string\",\"format\":\"email\"}", -ENOTSUP, "'format' value 'email'", "/format"},
		{"{\"type\":\"string\",\"pattern\":\"(?=x)\"}", -ENOTSUP, "keyword 'pattern'", "/pattern"},
		{"{\"$ref\":\"https://example.com/s.json\"}", -ENOTSUP, "only references within the document", ""},
		{"{\"$ref\":\"#/$defs/missing\"}", -EINVAL, "does not resolve", ""},
		{"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", -EINVAL,
		 "chain loops", ""},
		{"{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", -ENOTSUP, "keyword 'oneOf'", "/oneOf"},
		{"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}}},{\"type\":\"object\"}]}", -ENOTSUP,
		 "may both match", "/oneOf"},
		{"{\"allOf\":[{\"type\":\"object\"},{\"required\":[\"a\"]}]}", -ENOTSUP, "keyword 'allOf'", "/allOf"},
		{"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", -ENOTSUP, "keyword 'items' as a list", "/items"},
		{"{\"type\":\"array\",\"uniqueItems\":true}", -ENOTSUP, "keyword 'uniqueItems'", ""},
		{"{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}", -ENOTSUP, "keyword 'patternProperties'", ""},
		{"{\"not\":{\"type\":\"string\"}}", -ENOTSUP, "keyword 'not'", ""},
		{"{\"type\":\"objekt\"}", -EINVAL, "unknown type 'objekt'", "/type"},
		{"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"if\":{}}}}}", -ENOTSUP,
		 "keyword 'if'", "/properties/a/items"},
		{"{\"type\":\"string\",\"minLength\":-1}", -EINVAL, "'minLength' must be a non-negative integer", ""},
		{"{\"type\":\"string\",\"maxLength\":100000}", -E2BIG, "'maxLength' over the limit", ""},
		{"{\"type\":\"object\",\"required\":[\"x\"],\"additionalProperties\":false}", -EINVAL,
		 "required property 'x'", "/required"},
		{"{\"enum\":[1,2],\"type\":\"string\"}", -EINVAL, "no value satisfies", ""},
		{"{\"anyOf\":[{\"type\":\"string\"}],\"minLength\":2}", -ENOTSUP, "'minLength' beside 'anyOf'", ""},
		{"{\"type\":\"string\", \"minLength\": 3,}", -EINVAL, "1:34: JSON: expected a member name", ""},
		{"false", -ENOTSUP, "admits nothing", ""},
		{"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/properties/a\"}}}", -EINVAL, "chain loops",
		 "/properties/a"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct refusal *c = &cases[i];
		struct kvd_grammar *g = NULL;
		struct kvd_grammar_error e;
		int rc = kvd_grammar_compile(KVD_GRAMMAR_JSON_SCHEMA, c->schema, strlen(c->schema), &g, &e);
		if (rc != c->rc || !strstr(e.msg, c->msg) || strcmp(e.pointer, c->pointer) != 0)
			print_error("schema %s\n  got %d '%s' at '%s'; want %d '%s' at '%s'\n", c->schema, rc, e.msg,
				    e.pointer, c->rc, c->msg, c->pointer);
		assert_int_equal(rc, c->rc);
		assert_non_null(strstr(e.msg, c->msg));
		assert_string_equal(e.pointer, c->pointer);
		assert_null(g);
	}
}

/* ---- a small JSON Schema validator, independent of the translator ------------------- */

static const struct jv *v_resolve(const struct jv *root, const char *ref)
{
	const struct jv *cur = root;
	if (ref[0] != '#')
		return NULL;
	const char *p = ref + 1;
	while (*p == '/' && cur) {
		char seg[128];
		size_t n = 0;
		p++;
		while (*p && *p != '/' && n < sizeof(seg) - 1)
			seg[n++] = *p++;
		seg[n] = 0;
		cur = jv_get(cur, seg);
	}
	return cur;
}

static size_t utf8_len(const char *s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((uint8_t)s[i] & 0xC0) != 0x80;
	return k;
}

static int digits(const char *s, int n)
{
	for (int i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return 0;
	return 1;
}

static int valid_date(const char *s, size_t n)
{
	static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	if (n != 10 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' || !digits(s + 8, 2))
		return 0;
	int y = atoi(s), m = (s[5] - '0') * 10 + s[6] - '0', d = (s[8] - '0') * 10 + s[9] - '0';
	int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
	return y >= 1 && m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 ? 28 + leap : mdays[m - 1]);
}

static int valid_time(const char *s, size_t n)
{
	if (n < 9 || !digits(s, 2) || s[2] != ':' || !digits(s + 3, 2) || s[5] != ':' || !digits(s + 6, 2))
		return 0;
	if (atoi(s) > 23 || atoi(s + 3) > 59 || atoi(s + 6) > 59)
		return 0;
	size_t i = 8;
	if (s[i] == '.') {
		size_t k = ++i;
		while (i < n && s[i] >= '0' && s[i] <= '9')
			i++;
		if (i == k)
			return 0;
	}
	if (i < n && (s[i] == 'Z' || s[i] == 'z'))
		return i + 1 == n;
	if (i + 6 != n || (s[i] != '+' && s[i] != '-') || !digits(s + i + 1, 2) || s[i + 3] != ':' ||
	    !digits(s + i + 4, 2))
		return 0;
	return atoi(s + i + 1) <= 23 && atoi(s + i + 4) <= 59;
}

static int valid_uuid(const char *s, size_t n)
{
	if (n != 36)
		return 0;
	for (size_t i = 0; i < 36; i++) {
		int dash = i == 8 || i == 13 || i == 18 || i == 23;
		char c = s[i];
		if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
			return 0;
	}
	return 1;
}

static int is_type(const struct jv *v, const char *t)
{
	if (!strcmp(t, "null")) return v->type == JV_NULL;
	if (!strcmp(t, "boolean")) return v->type == JV_TRUE || v->type == JV_FALSE;
	if (!strcmp(t, "number")) return v->type == JV_NUM;
	if (!strcmp(t, "integer")) {
		if (v->type != JV_NUM) return 0;
		double d = strtod(v->s, NULL);
		return isfinite(d) && d == floor(d);
	}
	if (!strcmp(t, "string")) return v->type == JV_STR;
	if (!strcmp(t, "array")) return v->type == JV_ARR;
	if (!strcmp(t, "object")) return v->type == JV_OBJ;
	return 0;
}

static int validate(const struct jv *root, const struct jv *s, const struct jv *v)
{
	if (s->type == JV_TRUE)
		return 1;
	if (s->type != JV_OBJ)
		return 0;
	const struct jv *k;
	if ((k = jv_get(s, "$ref")) && !validate(root, v_resolve(root, k->s), v))
		return 0;
	if ((k = jv_get(s, "type"))) {
		int ok = 0;
		if (k->type == JV_STR)
			ok = is_type(v, k->s);
		for (uint32_t i = 0; k->type == JV_ARR && i < k->n; i++)
			ok |= is_type(v, k->kids[i].s);
		if (!ok)
			return 0;
	}
	if ((k = jv_get(s, "const")) && !jv_equal(k, v))
		return 0;
	if ((k = jv_get(s, "enum"))) {
		int ok = 0;
		for (uint32_t i = 0; i < k->n; i++)
			ok |= jv_equal(&k->kids[i], v);
		if (!ok)
			return 0;
	}
	if ((k = jv_get(s, "anyOf"))) {
		int ok = 0;
		for (uint32_t i = 0; i < k->n; i++)
			ok |= validate(root, &k->kids[i], v);
		if (!ok)
			return 0;
	}
	if ((k = jv_get(s, "oneOf"))) {
		int n = 0;
		for (uint32_t i = 0; i < k->n; i++)
			n += validate(root, &k->kids[i], v);
		if (n != 1)
			return 0;
	}
	if ((k = jv_get(s, "allOf")))
		for (uint32_t i = 0; i < k->n; i++)
			if (!validate(root, &k->kids[i], v))
				return 0;
	if (v->type == JV_NUM) {
		double x = strtod(v->s, NULL);
		if ((k = jv_get(s, "minimum")) && x < strtod(k->s, NULL))
			return 0;
		if ((k = jv_get(s, "maximum")) && x > strtod(k->s, NULL))
			return 0;
		if ((k = jv_get(s, "exclusiveMinimum")) && x <= strtod(k->s, NULL))
			return 0;
		if ((k = jv_get(s, "exclusiveMaximum")) && x >= strtod(k->s, NULL))
			return 0;
	}
	if (v->type == JV_STR) {
		size_t len = utf8_len(v->s, v->n);
		if ((k = jv_get(s, "minLength")) && len < (size_t)atoi(k->s))
			return 0;
		if ((k = jv_get(s, "maxLength")) && len > (size_t)atoi(k->s))
			return 0;
		if ((k = jv_get(s, "format"))) {
			if (!strcmp(k->s, "date") && !valid_date(v->s, v->n))
				return 0;
			if (!strcmp(k->s, "time") && !valid_time(v->s, v->n))
				return 0;
			if (!strcmp(k->s, "date-time") &&
			    !(v->n > 11 && valid_date(v->s, 10) && (v->s[10] == 'T' || v->s[10] == 't') &&
			      valid_time(v->s + 11, v->n - 11)))
				return 0;
			if (!strcmp(k->s, "uuid") && !valid_uuid(v->s, v->n))
				return 0;
		}
		/* "pattern" is checked by the pattern-specific cases of each schema */
	}
	if (v->type == JV_ARR) {
		if ((k = jv_get(s, "minItems")) && v->n < (uint32_t)atoi(k->s))
			return 0;
		if ((k = jv_get(s, "maxItems")) && v->n > (uint32_t)atoi(k->s))
			return 0;
		if ((k = jv_get(s, "items")))
			for (uint32_t i = 0; i < v->n; i++)
				if (!validate(root, k, &v->kids[i]))
					return 0;
	}
	if (v->type == JV_OBJ) {
		const struct jv *props = jv_get(s, "properties"), *add = jv_get(s, "additionalProperties");
		for (uint32_t i = 0; i < v->n; i++) {
			for (uint32_t j = 0; j < i; j++)
				if (!strcmp(v->kids[2 * i].s, v->kids[2 * j].s))
					return 0; /* duplicate key */
			const struct jv *ps = props ? jv_get(props, v->kids[2 * i].s) : NULL;
			if (ps ? !validate(root, ps, &v->kids[2 * i + 1])
			       : add && (add->type == JV_FALSE || !validate(root, add, &v->kids[2 * i + 1])))
				return 0;
		}
		if ((k = jv_get(s, "required")))
			for (uint32_t i = 0; i < k->n; i++)
				if (!jv_get(v, k->kids[i].s))
					return 0;
	}
	return 1;
}

/* ---- the schema suite ------------------------------------------------------------------ */

struct scase {
	const char *name;
	const char *schema;
	const char *good[4];  /* texts that must match completely */
	const char *bad[4];   /* texts that must be rejected or incomplete */
};

static const struct scase SUITE[] = {
	{"person", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
		   "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
	 {"{\"name\":\"Ann\",\"age\":31}", "{ \"name\" : \"\", \"age\" : -4 }"},
	 {"{\"age\":3,\"name\":\"x\"}", "{\"name\":\"x\"}", "{\"name\":\"x\",\"age\":1.5}", "{\"name\":1,\"age\":1}"}},
	{"weather_tool", "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City\"},"
			 "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"location\"]}",
	 {"{\"location\":\"Paris\",\"unit\":\"celsius\"}", "{\"location\":\"Oslo\"}", "{\"location\":\"x\",\"extra\":[1]}"},
	 {"{\"location\":\"x\",\"unit\":\"kelvin\"}", "{\"unit\":\"celsius\"}"}},
	{"openai_strict", "{\"type\":\"object\",\"properties\":{\"steps\":{\"type\":\"array\",\"items\":{\"type\":\"object\","
			  "\"properties\":{\"explanation\":{\"type\":\"string\"},\"output\":{\"type\":\"string\"}},"
			  "\"required\":[\"explanation\",\"output\"],\"additionalProperties\":false}},"
			  "\"final_answer\":{\"type\":\"string\"}},\"required\":[\"steps\",\"final_answer\"],"
			  "\"additionalProperties\":false}",
	 {"{\"steps\":[],\"final_answer\":\"4\"}", "{\"steps\":[{\"explanation\":\"a\",\"output\":\"b\"}],\"final_answer\":\"\"}"},
	 {"{\"steps\":[{}],\"final_answer\":\"4\"}"}},
	{"nullable_union", "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":[\"string\",\"null\"]}},\"required\":[\"v\"],"
			   "\"additionalProperties\":false}",
	 {"{\"v\":null}", "{\"v\":\"s\"}"}, {"{\"v\":1}"}},
	{"pydantic_optional", "{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\"},\"nick\":{\"anyOf\":[{\"type\":"
			      "\"string\"},{\"type\":\"null\"}],\"default\":null,\"title\":\"Nick\"}},\"required\":[\"name\"],"
			      "\"title\":\"User\",\"type\":\"object\"}",
	 {"{\"name\":\"a\",\"nick\":null}", "{\"name\":\"a\"}"}, {"{\"nick\":null}"}},
	{"pydantic_enum_defs", "{\"$defs\":{\"Color\":{\"enum\":[\"red\",\"green\"],\"title\":\"Color\",\"type\":\"string\"}},"
			       "\"properties\":{\"color\":{\"$ref\":\"#/$defs/Color\"}},\"required\":[\"color\"],\"type\":\"object\"}",
	 {"{\"color\":\"red\"}"}, {"{\"color\":\"blue\"}"}},
	{"definitions_ref", "{\"definitions\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},"
			    "\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"],\"additionalProperties\":false}},"
			    "\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/pt\"},\"maxItems\":3}",
	 {"[]", "[{\"x\":1,\"y\":-2.5e3}]"}, {"[{\"x\":1}]", "[{\"x\":1,\"y\":1},{\"x\":1,\"y\":1},{\"x\":1,\"y\":1},{\"x\":1,\"y\":1}]"}},
	{"recursive_tree", "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
			   "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
			   "\"required\":[\"value\",\"children\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
	 {"{\"value\":1,\"children\":[{\"value\":2,\"children\":[]}]}"}, {"{\"value\":1}"}},
	{"enum_mixed", "{\"enum\":[\"a\",1,null,true,{\"k\":[1,2]},[\"x\"]]}",
	 {"\"a\"", "1", "null", "{\"k\":[1,2]}"}, {"2", "\"b\"", "false"}},
	{"const_version", "{\"type\":\"object\",\"properties\":{\"version\":{\"const\":\"v1\"},\"data\":{}},"
			  "\"required\":[\"version\",\"data\"],\"additionalProperties\":false}",
	 {"{\"version\":\"v1\",\"data\":{\"any\":[true]}}"}, {"{\"version\":\"v2\",\"data\":1}"}},
	{"string_lengths", "{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}",
	 {"\"ab\"", "\"日本語\"", "\"\\n\\u00e9x\""}, {"\"a\"", "\"abcdef\""}},
	{"array_bounds", "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}",
	 {"[1,2]", "[1, 2, 3, 4]"}, {"[1]", "[1,2,3,4,5]", "[1,\"2\"]"}},
	{"array_any", "{\"type\":\"array\"}", {"[]", "[1,\"a\",[null],{}]"}, {"{}"}},
	{"date", "{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-28\"", "\"1999-12-31\""},
	 {"\"2024-02-30\"", "\"2024-13-01\"", "\"0000-01-01\""}},
	{"time", "{\"type\":\"string\",\"format\":\"time\"}", {"\"23:59:59Z\"", "\"08:00:00.123+02:00\""},
	 {"\"24:00:00Z\"", "\"08:00:00\""}},
	{"date_time", "{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-05-01T12:30:00Z\""},
	 {"\"2024-05-01 12:30:00Z\""}},
	{"uuid", "{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""},
	 {"\"123e4567e89b12d3a456426614174000\""}},
	{"pattern_sku", "{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{4}$\"}", {"\"ABC-1234\""},
	 {"\"AB-1234\"", "\"ABC-12345\"", "\"xABC-1234\""}},
	{"pattern_prefix", "{\"type\":\"string\",\"pattern\":\"^x\"}", {"\"xyz\"", "\"x\""}, {"\"ax\""}},
	{"pattern_quote", "{\"type\":\"string\",\"pattern\":\"^say \\\"hi\\\"\\\\.$\"}", {"\"say \\\"hi\\\".\""},
	 {"\"say hi.\""}},
	{"anyof_types", "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"integer\"},{\"type\":\"boolean\"}]}",
	 {"\"abc\"", "42", "false"}, {"\"abcd\"", "1.5", "null"}},
	{"oneof_types", "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":{\"type\":\"string\"}}]}",
	 {"\"a\"", "[\"a\",\"b\"]"}, {"1"}},
	{"oneof_discriminated", "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},"
				"\"r\":{\"type\":\"number\"}},\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},"
				"{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"rect\"},\"w\":{\"type\":\"number\"},"
				"\"h\":{\"type\":\"number\"}},\"required\":[\"kind\",\"w\",\"h\"],\"additionalProperties\":false}]}",
	 {"{\"kind\":\"circle\",\"r\":1}", "{\"kind\":\"rect\",\"w\":1,\"h\":2}"}, {"{\"kind\":\"circle\",\"w\":1,\"h\":2}"}},
	{"oneof_enums", "{\"oneOf\":[{\"enum\":[\"a\",\"b\"]},{\"enum\":[\"c\"]}]}", {"\"a\"", "\"c\""}, {"\"d\""}},
	{"allof_single", "{\"allOf\":[{\"$ref\":\"#/$defs/x\"}],\"description\":\"wrapped\",\"$defs\":{\"x\":{\"type\":\"boolean\"}}}",
	 {"true"}, {"1"}},
	{"additional_schema", "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"],"
			      "\"additionalProperties\":{\"type\":\"string\"}}",
	 {"{\"id\":1}", "{\"id\":1,\"tag\":\"x\",\"idx\":\"y\"}"}, {"{\"id\":1,\"tag\":2}", "{\"id\":1,\"id\":2}"}},
	{"map_of_numbers", "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}",
	 {"{}", "{\"a\":1,\"b\":2.5}"}, {"{\"a\":\"x\"}"}},
	{"optional_only", "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"}},"
			  "\"additionalProperties\":false}",
	 {"{}", "{\"b\":null}", "{\"a\":true,\"b\":null}"}, {"{\"c\":1}", "{\"a\":true,}"}},
	{"required_unlisted", "{\"type\":\"object\",\"required\":[\"token\"]}", {"{\"token\":[1]}"}, {"{}"}},
	{"nested_address", "{\"type\":\"object\",\"properties\":{\"address\":{\"type\":\"object\",\"properties\":"
			   "{\"street\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},"
			   "\"required\":[\"street\",\"zip\"],\"additionalProperties\":false},\"tags\":{\"type\":\"array\","
			   "\"items\":{\"type\":\"string\",\"enum\":[\"home\",\"work\"]},\"maxItems\":2}},"
			   "\"required\":[\"address\"],\"additionalProperties\":false}",
	 {"{\"address\":{\"street\":\"Main\",\"zip\":\"12345\"},\"tags\":[\"home\"]}"},
	 {"{\"address\":{\"street\":\"Main\",\"zip\":\"1234\"}}"}},
	{"typeless_any", "{\"description\":\"anything\"}", {"1", "\"x\"", "[{}]", "null"}, {"nul"}},
	{"bounded_ints", "{\"type\":\"object\",\"properties\":{\"page\":{\"type\":\"integer\",\"minimum\":1},"
			 "\"per_page\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":100},\"offset\":{\"type\":\"integer\","
			 "\"exclusiveMinimum\":-10,\"exclusiveMaximum\":0}},\"required\":[\"page\",\"per_page\",\"offset\"],"
			 "\"additionalProperties\":false}",
	 {"{\"page\":1,\"per_page\":100,\"offset\":-9}"}, {"{\"page\":0,\"per_page\":1,\"offset\":-1}",
	  "{\"page\":1,\"per_page\":101,\"offset\":-1}", "{\"page\":1,\"per_page\":1,\"offset\":0}"}},
	{"numbers", "{\"type\":\"object\",\"properties\":{\"price\":{\"type\":\"number\"},\"qty\":{\"type\":\"integer\"},"
		    "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"price\",\"qty\",\"ok\"],\"additionalProperties\":false}",
	 {"{\"price\":-0.5,\"qty\":0,\"ok\":false}", "{\"price\":1e5,\"qty\":-12,\"ok\":true}"},
	 {"{\"price\":01,\"qty\":0,\"ok\":false}", "{\"price\":1,\"qty\":1.0,\"ok\":false}"}},
	{"nullable_ignored", "{\"type\":\"string\",\"nullable\":true}", {"\"s\""}, {"null", "1"}},
	{"tool_call_args", "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"minLength\":1},"
			   "\"limit\":{\"type\":\"integer\"},\"filters\":{\"type\":\"array\",\"items\":{\"type\":\"object\","
			   "\"properties\":{\"field\":{\"type\":\"string\"},\"op\":{\"enum\":[\"eq\",\"lt\",\"gt\"]},"
			   "\"value\":{\"type\":[\"string\",\"number\",\"boolean\"]}},\"required\":[\"field\",\"op\",\"value\"],"
			   "\"additionalProperties\":false}}},\"required\":[\"query\"],\"additionalProperties\":false}",
	 {"{\"query\":\"q\",\"filters\":[{\"field\":\"a\",\"op\":\"eq\",\"value\":true}]}"},
	 {"{\"query\":\"\"}", "{\"query\":\"q\",\"filters\":[{\"field\":\"a\",\"op\":\"ne\",\"value\":1}]}"}},
	{"unicode_keys", "{\"type\":\"object\",\"properties\":{\"名前\":{\"type\":\"string\"},\"a\\\"b\":{\"type\":\"integer\"}},"
			 "\"required\":[\"名前\",\"a\\\"b\"],\"additionalProperties\":false}",
	 {"{\"名前\":\"x\",\"a\\\"b\":1}"}, {"{\"名前\":\"x\"}"}},
};

static struct kvd_tokenizer *open_tokenizer(void)
{
	struct gguf_file *f = NULL;
	struct kvd_tokenizer *t = NULL;
	char err[512];
	if (gguf_open(MODEL_PATH, &f, err, sizeof(err)) < 0)
		return NULL;
	int r = kvd_tokenizer_from_gguf(f, &t, err, sizeof(err));
	gguf_close(f);
	return r < 0 ? NULL : t;
}

static struct kvd_tokenizer *tok;
static struct kvd_gram_vocab *vocab;

static int setup_vocab(void **state)
{
	(void)state;
	tok = open_tokenizer();
	if (tok)
		assert_int_equal(kvd_gram_vocab_from_tokenizer(tok, &vocab), 0);
	return 0;
}

static int teardown_vocab(void **state)
{
	(void)state;
	vocab = kvd_gram_vocab_free(vocab);
	tok = kvd_tokenizer_free(tok);
	return 0;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static int is_end(int32_t t)
{
	return kvd_tokenizer_is_eog(tok, t);
}

/* Compare the mask with a check of every token, and the check with a real
 * accept on a copy of the state. */
static void check_mask_against_tokens(const struct kvd_grammar *g, const struct kvd_gram_state *st,
				      const uint32_t *mask)
{
	int32_t n = kvd_gram_vocab_n_tokens(vocab);
	struct kvd_gram_state cp = {0};
	for (int32_t t = 0; t < n; t++) {
		int bit = (mask[t >> 5] >> (t & 31)) & 1;
		int ok = kvd_gram_check(g, vocab, scr, st, t);
		if (bit != ok)
			print_error("token %d: mask %d, check %d\n", t, bit, ok);
		assert_int_equal(bit, ok);
		{
			assert_int_equal(kvd_gram_state_copy(&cp, st), 0);
			int rc = kvd_gram_accept_token(g, vocab, scr, &cp, t);
			assert_int_equal(rc == 0, ok);
		}
	}
	kvd_gram_state_fini(&cp);
}

/* Random walk: allowed tokens until complete (END drawn), at most max_steps;
 * after half the budget prefer tokens that close something. Returns 1 and
 * the text when complete, 0 when cut. */
static int walk(const struct kvd_grammar *g, struct sbuf *text, int max_steps, int cross_check, double *mask_ms,
		int *n_masks)
{
	struct kvd_gram_state st = {0};
	size_t words = kvd_gram_vocab_mask_words(vocab);
	uint32_t *mask = malloc(words * sizeof(uint32_t));
	int32_t *allowed = malloc((size_t)kvd_gram_vocab_n_tokens(vocab) * sizeof(int32_t));
	char buf[4096];
	int done = 0;
	assert_int_equal(kvd_gram_state_init(g, scr, &st), 0);
	text->len = 0;
	sb_puts(text, "");
	for (int step = 0; step < max_steps && !done; step++) {
		double t0 = now_ms();
		int n = kvd_gram_allowed_mask(g, vocab, scr, &st, mask);
		*mask_ms += now_ms() - t0;
		(*n_masks)++;
		assert_true(n > 0); /* the constraint never gets stuck */
		if (cross_check && step % 7 == 3)
			check_mask_against_tokens(g, &st, mask);
		uint32_t na = 0, nclose = 0;
		int end_ok = 0;
		for (int32_t t = 0; t < kvd_gram_vocab_n_tokens(vocab); t++)
			if ((mask[t >> 5] >> (t & 31)) & 1) {
				if (is_end(t)) {
					end_ok = 1;
					continue;
				}
				allowed[na++] = t;
			}
		assert_int_equal(end_ok, kvd_gram_is_complete(&st));
		if (end_ok && (na == 0 || rnd() % 3 == 0 || step > max_steps / 3)) {
			done = 1;
			break;
		}
		int32_t pick = allowed[rnd() % na];
		if (step > max_steps / 3 && rnd() % 4) {
			/* prefer closers: tokens made only of structure and short text */
			for (uint32_t i = 0; i < na; i++) {
				int l = kvd_token_to_bytes(tok, allowed[i], 0, buf, sizeof(buf));
				int closer = l > 0 && l <= 2 && strpbrk(buf, "\"}]") && memchr(buf, '"', (size_t)l) == buf + l - 1 ? 1
					     : l == 1 && strchr("}]\"", buf[0]);
				if (closer)
					allowed[nclose++] = allowed[i];
			}
			if (nclose)
				pick = allowed[rnd() % nclose];
		}
		assert_int_equal(kvd_gram_check(g, vocab, scr, &st, pick), 1);
		assert_int_equal(kvd_gram_accept_token(g, vocab, scr, &st, pick), 0);
		int l = kvd_token_to_bytes(tok, pick, 0, buf, sizeof(buf));
		assert_true(l > 0);
		sb_putn(text, buf, (size_t)l);
	}
	free(mask);
	free(allowed);
	kvd_gram_state_fini(&st);
	return done;
}

static void test_schema_suite(void **state)
{
	(void)state;
	size_t n = sizeof(SUITE) / sizeof(SUITE[0]);
	assert_true(n >= 30);
	/* fixed positive and negative texts: no vocabulary needed */
	for (size_t i = 0; i < n; i++) {
		struct kvd_grammar *g = compile_ok(KVD_GRAMMAR_JSON_SCHEMA, SUITE[i].schema);
		for (int k = 0; k < 4 && SUITE[i].good[k]; k++) {
			int m = match(g, SUITE[i].good[k]);
			if (m != 1)
				print_error("%s: good text %s gave %d\n", SUITE[i].name, SUITE[i].good[k], m);
			assert_int_equal(m, 1);
		}
		for (int k = 0; k < 4 && SUITE[i].bad[k]; k++) {
			int m = match(g, SUITE[i].bad[k]);
			if (m == 1)
				print_error("%s: bad text %s accepted\n", SUITE[i].name, SUITE[i].bad[k]);
			assert_int_not_equal(m, 1);
		}
		kvd_grammar_unref(g);
	}
	if (!vocab) {
		print_message("%s not found: random walks skipped\n", MODEL_PATH);
		skip();
	}
	struct sbuf text = {0};
	double mask_ms = 0;
	int n_masks = 0, complete = 0, cut = 0;
	const int walks = 4;
	/* KVD_GRAMMAR_DUMP=FILE: every valid walk as a JSON line {name, schema,
	 * doc}, for tests/integration/t_grammar_schema.sh to validate again
	 * with Python's jsonschema */
	FILE *dump = getenv("KVD_GRAMMAR_DUMP") ? fopen(getenv("KVD_GRAMMAR_DUMP"), "w") : NULL;
	for (size_t i = 0; i < n; i++) {
		struct kvd_grammar *g = compile_ok(KVD_GRAMMAR_JSON_SCHEMA, SUITE[i].schema);
		struct jdoc *sd = NULL;
		assert_int_equal(jdoc_parse(SUITE[i].schema, strlen(SUITE[i].schema), &sd, NULL), 0);
		int ok_here = 0;
		for (int w = 0; w < walks; w++) {
			if (!walk(g, &text, 200, i % 6 == 0 && w == 0, &mask_ms, &n_masks)) {
				cut++;
				continue;
			}
			struct jdoc *d = NULL;
			struct kvd_grammar_error e;
			int rc = jdoc_parse(text.p, text.len, &d, &e);
			if (rc)
				print_error("%s: walk produced invalid JSON (%s): %s\n", SUITE[i].name, e.msg, text.p);
			assert_int_equal(rc, 0);
			int v = validate(jdoc_root(sd), jdoc_root(sd), jdoc_root(d));
			if (!v)
				print_error("%s: walk produced an invalid document: %s\n", SUITE[i].name, text.p);
			assert_true(v);
			if (getenv("KVD_GRAMMAR_SHOW"))
				print_message("%-20s %s\n", SUITE[i].name, text.p);
			/* raw newlines can only be whitespace between tokens: one line per document */
			for (size_t k = 0; dump && k < text.len; k++)
				if (text.p[k] == '\n')
					text.p[k] = ' ';
			if (dump)
				fprintf(dump, "{\"name\":\"%s\",\"schema\":%s,\"doc\":%s}\n", SUITE[i].name, SUITE[i].schema,
					text.p);
			jdoc_free(d);
			complete++;
			ok_here++;
		}
		if (!ok_here)
			print_error("%s: no walk completed\n", SUITE[i].name);
		assert_true(ok_here > 0);
		jdoc_free(sd);
		kvd_grammar_unref(g);
	}
	if (dump)
		fclose(dump);
	print_message("schema suite: %zu schemas, %d walks complete and valid, %d cut at the step cap; "
		      "mask %.3f ms mean over %d masks (49k vocabulary)\n",
		      n, complete, cut, mask_ms / n_masks, n_masks);
	sb_free(&text);
}


/* Integer bounds: every integer in [-2100, 2100] (and a few far ones)
 * matches exactly when it lies in the range, over many random ranges. */
static void test_integer_ranges(void **state)
{
	(void)state;
	static const char *fixed[] = {
		"{\"type\":\"integer\",\"minimum\":0}", "{\"type\":\"integer\",\"maximum\":-7}",
		"{\"type\":\"integer\",\"exclusiveMinimum\":9,\"exclusiveMaximum\":100}",
		"{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":1000}", "{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":3.5}",
		"{\"type\":\"integer\",\"minimum\":5,\"maximum\":5}", "{\"type\":\"integer\",\"minimum\":-5,\"maximum\":-5}",
		"{\"type\":\"integer\",\"minimum\":-1e20}",
	};
	char schema[256], num[32];
	for (int k = 0; k < 48; k++) {
		long long lo = -3000 + (long long)(rnd() % 6000), hi = lo + (long long)(rnd() % 3000);
		int has_lo = 1, has_hi = 1;
		if (k < 8) {
			snprintf(schema, sizeof(schema), "%s", fixed[k]);
		} else {
			has_lo = k % 5 != 0;
			has_hi = k % 7 != 0;
			snprintf(schema, sizeof(schema), "{\"type\":\"integer\"%s%.0lld%s%.0lld}", has_lo ? ",\"minimum\":" : "",
				 has_lo ? lo : 0, has_hi ? ",\"maximum\":" : "", has_hi ? hi : 0);
			/* %.0lld prints nothing for 0: write 0 explicitly */
			if (has_lo && lo == 0)
				snprintf(schema, sizeof(schema), "{\"type\":\"integer\",\"minimum\":0%s%.0lld}",
					 has_hi ? ",\"maximum\":" : "", has_hi ? hi : 0);
			if (has_hi && hi == 0)
				snprintf(schema, sizeof(schema), "{\"type\":\"integer\"%s%.0lld,\"maximum\":0}",
					 has_lo ? ",\"minimum\":" : "", has_lo ? lo : 0);
		}
		struct jdoc *d = NULL;
		assert_int_equal(jdoc_parse(schema, strlen(schema), &d, NULL), 0);
		struct kvd_grammar *g = compile_ok(KVD_GRAMMAR_JSON_SCHEMA, schema);
		for (long long n = -2100; n <= 2100; n++) {
			long long x = n;
			if (n == -2100)
				x = -123456789012LL;
			if (n == 2100)
				x = 99999999999999LL;
			snprintf(num, sizeof(num), "%lld", x);
			struct jdoc *vd = NULL;
			assert_int_equal(jdoc_parse(num, strlen(num), &vd, NULL), 0);
			int want = validate(jdoc_root(d), jdoc_root(d), jdoc_root(vd)), got = match(g, num) == 1;
			if (want != got)
				print_error("%s: %s: grammar %d, validator %d\n", schema, num, got, want);
			assert_int_equal(got, want);
			jdoc_free(vd);
		}
		jdoc_free(d);
		kvd_grammar_unref(g);
	}
	struct kvd_grammar *g = NULL;
	struct kvd_grammar_error e;
	const char *bad = "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}";
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_JSON_SCHEMA, bad, strlen(bad), &g, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "no integer lies between"));
	bad = "{\"type\":\"number\",\"minimum\":0}";
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_JSON_SCHEMA, bad, strlen(bad), &g, &e), -ENOTSUP);
	assert_non_null(strstr(e.msg, "keyword 'minimum' is supported for integers only"));
	bad = "{\"type\":\"integer\",\"exclusiveMinimum\":true,\"minimum\":1}";
	assert_int_equal(kvd_grammar_compile(KVD_GRAMMAR_JSON_SCHEMA, bad, strlen(bad), &g, &e), -ENOTSUP);
	assert_string_equal(e.pointer, "/exclusiveMinimum");
}

/* ---- state, vocabulary, cache ------------------------------------------------------------ */

/* A synthetic vocabulary: tokens that split a UTF-8 character, END and
 * NEVER tokens, duplicates. */
static void test_synthetic_vocab(void **state)
{
	(void)state;
	static const char *toks[] = {"{", "\"", "\xc3", "\xa9", "é", "\"}", "a", "ab", "ab", "", "<ctl>", "</s>", "}"};
	static const uint8_t kinds[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, KVD_GRAM_TOKEN_NEVER, KVD_GRAM_TOKEN_END, 0};
	const size_t n = sizeof(toks) / sizeof(toks[0]);
	const uint8_t *bytes[16];
	uint32_t lens[16];
	for (size_t i = 0; i < n; i++) {
		bytes[i] = (const uint8_t *)toks[i];
		lens[i] = (uint32_t)strlen(toks[i]);
	}
	struct kvd_gram_vocab *v = NULL;
	assert_int_equal(kvd_gram_vocab_new((int32_t)n, bytes, lens, kinds, &v), 0);
	struct kvd_grammar *g = compile_ok(KVD_GRAMMAR_GBNF, "root ::= \"{\\\"\" [^\"]* \"\\\"}\"");
	struct kvd_gram_state st = {0}, fork = {0};
	uint32_t mask[1];
	assert_int_equal(kvd_gram_state_init(g, scr, &st), 0);
	assert_int_equal(kvd_gram_allowed_mask(g, v, scr, &st, mask), 1);
	assert_int_equal(mask[0], 1u << 0);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 0), 0);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 1), 0);
	/* inside the string: halves of é, é, a, ab (twice), the closer; never
	 * the empty, control or END token */
	assert_int_equal(kvd_gram_allowed_mask(g, v, scr, &st, mask), 9);
	assert_int_equal(mask[0], (1u << 0) | (1u << 1) | (1u << 2) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7) |
					  (1u << 8) | (1u << 12));
	assert_int_equal(kvd_gram_state_copy(&fork, &st), 0);
	/* the first half of é: only the second half may follow */
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 2), 0);
	assert_int_equal(kvd_gram_allowed_mask(g, v, scr, &st, mask), 1);
	assert_int_equal(mask[0], 1u << 3);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 6), -ENOENT);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 3), 0);
	/* the fork is unaffected */
	assert_int_equal(kvd_gram_check(g, v, scr, &fork, 6), 1);
	assert_int_equal(kvd_gram_check(g, v, scr, &fork, 3), 0);
	/* END only once complete */
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 11), -ENOENT);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 5), 0);
	assert_true(kvd_gram_is_complete(&st));
	assert_false(kvd_gram_can_continue(&st));
	assert_int_equal(kvd_gram_allowed_mask(g, v, scr, &st, mask), 1);
	assert_int_equal(mask[0], 1u << 11);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 11), 0);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 10), -ENOENT);
	assert_int_equal(kvd_gram_accept_token(g, v, scr, &st, 99), -EINVAL);
	/* save and load: words written out and read back give the same mask */
	uint32_t m1[1], m2[1];
	struct kvd_gram_state loaded = {0};
	assert_int_equal(kvd_gram_state_load(g, fork.words, fork.n_words, &loaded), 0);
	assert_int_equal(kvd_gram_allowed_mask(g, v, scr, &fork, m1), kvd_gram_allowed_mask(g, v, scr, &loaded, m2));
	assert_int_equal(m1[0], m2[0]);
	/* a corrupted state is refused */
	uint32_t bad[3] = {2, 0, 999999};
	assert_int_equal(kvd_gram_state_load(g, bad, 3, &loaded), -EINVAL);
	uint32_t bad2[2] = {5, 0};
	assert_int_equal(kvd_gram_state_load(g, bad2, 2, &loaded), -EINVAL);
	kvd_gram_state_fini(&loaded);
	kvd_gram_state_fini(&fork);
	kvd_gram_state_fini(&st);
	kvd_grammar_unref(g);
	kvd_gram_vocab_free(v);
	assert_int_equal(kvd_gram_vocab_new(0, bytes, lens, kinds, &v), -EINVAL);
}

static void test_cache(void **state)
{
	(void)state;
	struct kvd_gram_cache *c = kvd_gram_cache_new(2, 64u << 20);
	struct kvd_grammar *a, *b, *x;
	struct kvd_grammar_error e;
	int hit = -1;
	const char *s1 = "{\"type\":\"string\"}", *s2 = "{\"type\":\"integer\"}", *s3 = "{\"type\":\"boolean\"}";
	double t0 = now_ms();
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_JSON_SCHEMA, s1, strlen(s1), &a, &hit, &e), 0);
	double t1 = now_ms();
	assert_int_equal(hit, 0);
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_JSON_SCHEMA, s1, strlen(s1), &b, &hit, &e), 0);
	double t2 = now_ms();
	assert_int_equal(hit, 1);
	assert_ptr_equal(a, b);
	print_message("cache: compile %.3f ms, hit %.4f ms\n", t1 - t0, t2 - t1);
	kvd_grammar_unref(b);
	/* same text, other kind: not the same entry */
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_GBNF, "root ::= \"x\"", 12, &x, &hit, &e), 0);
	assert_int_equal(hit, 0);
	kvd_grammar_unref(x);
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_REGEX, "root ::= \"x\"", 12, &x, &hit, &e), 0);
	assert_int_equal(hit, 0);
	kvd_grammar_unref(x);
	/* bounded: two entries; s1 was least recently used and is gone, the
	 * grammar handed out stays valid */
	uint32_t n;
	size_t bytes;
	kvd_gram_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 2);
	assert_true(bytes > 0);
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_JSON_SCHEMA, s1, strlen(s1), &b, &hit, &e), 0);
	assert_int_equal(hit, 0);
	assert_ptr_not_equal(a, b);
	assert_int_equal(match(a, "\"ok\""), 1);
	kvd_grammar_unref(a);
	kvd_grammar_unref(b);
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_JSON_SCHEMA, s2, strlen(s2), &b, &hit, &e), 0);
	kvd_grammar_unref(b);
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_JSON_SCHEMA, s3, strlen(s3), &b, &hit, &e), 0);
	kvd_grammar_unref(b);
	kvd_gram_cache_stats(c, &n, &bytes);
	assert_int_equal(n, 2);
	/* errors are returned, not cached */
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_GBNF, "root ::= ", 9, &b, &hit, &e), 0);
	kvd_grammar_unref(b);
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_GBNF, "root ::= q", 10, &b, &hit, &e), -EINVAL);
	assert_int_equal(kvd_gram_cache_get(c, KVD_GRAMMAR_GBNF, "root ::= q", 10, &b, &hit, &e), -EINVAL);
	/* a byte budget smaller than any grammar: nothing kept, still served */
	struct kvd_gram_cache *tiny = kvd_gram_cache_new(8, 16);
	assert_int_equal(kvd_gram_cache_get(tiny, KVD_GRAMMAR_JSON_SCHEMA, s1, strlen(s1), &b, &hit, &e), 0);
	kvd_gram_cache_stats(tiny, &n, &bytes);
	assert_int_equal(n, 0);
	kvd_grammar_unref(b);
	kvd_gram_cache_free(tiny);
	kvd_gram_cache_free(c);
}

/* json_object mode: any object, nothing else. */
static void test_json_object(void **state)
{
	(void)state;
	CASES(KVD_GRAMMAR_JSON_OBJECT, "", {"{}", 1}, {"{\"a\":[1,{\"b\":\"\\u00e9\"}]}", 1}, {"[1]", REJ}, {"\"x\"", REJ},
	      {"{\"a\"}", REJ});
}

/* The mask in the worst place (inside a free string, most tokens allowed)
 * and in a typical structural place, printed for the record. */
static void test_mask_timing(void **state)
{
	(void)state;
	if (!vocab)
		skip();
	struct kvd_grammar *g = compile_ok(KVD_GRAMMAR_JSON_SCHEMA, SUITE[0].schema);
	struct kvd_gram_state st = {0};
	uint32_t *mask = malloc(kvd_gram_vocab_mask_words(vocab) * sizeof(uint32_t));
	static const char *prefixes[] = {"", "{\"name\":\"", "{\"name\":\"Ann\",\"age\":"};
	for (size_t p = 0; p < 3; p++) {
		assert_int_equal(kvd_gram_state_init(g, scr, &st), 0);
		assert_int_equal(kvd_gram_accept_bytes(g, scr, &st, (const uint8_t *)prefixes[p], strlen(prefixes[p])), 0);
		int n = 0;
		double t0 = now_ms();
		for (int k = 0; k < 20; k++)
			n = kvd_gram_allowed_mask(g, vocab, scr, &st, mask);
		double ms = (now_ms() - t0) / 20;
		print_message("mask after '%s': %d of %d tokens allowed, %.3f ms\n", prefixes[p], n,
			      kvd_gram_vocab_n_tokens(vocab), ms);
		assert_true(n > 0);
	}
	free(mask);
	kvd_gram_state_fini(&st);
	kvd_grammar_unref(g);
}

/* Masks kept by parse state in the scratch equal freshly computed ones
 * (a new scratch each time, nothing kept) over random walks of several
 * grammars, with two grammars and two vocabularies taking turns on one
 * scratch; repeated states are answered from what was kept. */
static void test_mask_cache(void **state)
{
	(void)state;
	if (!vocab)
		skip();
	static const struct {
		enum kvd_grammar_kind kind;
		const char *text;
	} G[] = {
		{KVD_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
					  "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
					  "{\"type\":\"string\"}}},\"required\":[\"name\",\"age\"]}"},
		{KVD_GRAMMAR_JSON_OBJECT, ""},
		{KVD_GRAMMAR_GBNF, "root ::= (\"ab\" | [a-z]+ \" \" | \"{\" root? \"}\")+ \".\""},
		{KVD_GRAMMAR_REGEX, "[A-Z][a-z]{2,8}( [0-9]+)?"},
		{KVD_GRAMMAR_CHOICE, "[\"yes\",\"no\",\"maybe not\"]"},
	};
	const size_t ng = sizeof(G) / sizeof(G[0]);
	/* a second vocabulary: a few ASCII tokens, so its masks differ */
	static const char *small[] = {"a", "b", "ab", "{", "}", " ", ".", "\"", "1", "yes", "no", "Abc", "</s>"};
	static const uint8_t small_kinds[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, KVD_GRAM_TOKEN_END};
	const uint8_t *sb[13];
	uint32_t sl[13];
	for (int i = 0; i < 13; i++) {
		sb[i] = (const uint8_t *)small[i];
		sl[i] = (uint32_t)strlen(small[i]);
	}
	struct kvd_gram_vocab *v2 = NULL;
	assert_int_equal(kvd_gram_vocab_new(13, sb, sl, small_kinds, &v2), 0);
	size_t words = kvd_gram_vocab_mask_words(vocab);
	uint32_t *kept = malloc(words * sizeof(uint32_t)), *fresh = malloc(words * sizeof(uint32_t));
	int32_t *allowed = malloc((size_t)kvd_gram_vocab_n_tokens(vocab) * sizeof(int32_t));
	struct kvd_gram_scratch *s = kvd_gram_scratch_new();
	assert_non_null(kept);
	assert_non_null(fresh);
	assert_non_null(allowed);
	assert_non_null(s);
	uint64_t hits0 = 0, hits1 = 0;
	uint32_t n_kept = 0;
	kvd_gram_scratch_stats(s, &hits0, &n_kept);
	assert_int_equal(n_kept, 0);
	size_t compared = 0;
	for (size_t gi = 0; gi < ng; gi++) {
		struct kvd_grammar *g = compile_ok(G[gi].kind, G[gi].text);
		struct kvd_grammar *other = compile_ok(G[(gi + 1) % ng].kind, G[(gi + 1) % ng].text);
		for (int w = 0; w < 6; w++) {
			struct kvd_gram_state st = {0}, ost = {0};
			assert_int_equal(kvd_gram_state_init(g, s, &st), 0);
			assert_int_equal(kvd_gram_state_init(other, s, &ost), 0);
			for (int step = 0; step < 40; step++) {
				/* twice from the long-lived scratch (the second from what
				 * was kept), once from a new one */
				for (int rep = 0; rep < 2; rep++) {
					struct kvd_gram_scratch *f = kvd_gram_scratch_new();
					assert_non_null(f);
					int nk = kvd_gram_allowed_mask(g, vocab, s, &st, kept);
					int nf = kvd_gram_allowed_mask(g, vocab, f, &st, fresh);
					kvd_gram_scratch_free(f);
					assert_int_equal(nk, nf);
					assert_memory_equal(kept, fresh, words * sizeof(uint32_t));
					compared++;
				}
				/* the other grammar and the other vocabulary take a turn */
				if (step % 5 == 0) {
					uint32_t m2[1], m2f[1];
					struct kvd_gram_scratch *f = kvd_gram_scratch_new();
					assert_non_null(f);
					assert_int_equal(kvd_gram_allowed_mask(g, v2, s, &st, m2),
							 kvd_gram_allowed_mask(g, v2, f, &st, m2f));
					assert_int_equal(m2[0], m2f[0]);
					assert_true(kvd_gram_allowed_mask(other, vocab, s, &ost, kept) >= 0);
					kvd_gram_scratch_free(f);
				}
				int na = kvd_gram_allowed_mask(g, vocab, s, &st, kept);
				assert_true(na > 0);
				uint32_t k = 0;
				int end_ok = 0;
				for (int32_t t = 0; t < kvd_gram_vocab_n_tokens(vocab); t++)
					if (kept[t >> 5] >> (t & 31) & 1) {
						if (is_end(t))
							end_ok = 1;
						else
							allowed[k++] = t;
					}
				if (k == 0 || (end_ok && rnd() % 8 == 0))
					break;
				assert_int_equal(kvd_gram_accept_token(g, vocab, s, &st, allowed[rnd() % k]), 0);
			}
			kvd_gram_state_fini(&st);
			kvd_gram_state_fini(&ost);
		}
		kvd_grammar_unref(other);
		kvd_grammar_unref(g);
	}
	kvd_gram_scratch_stats(s, &hits1, &n_kept);
	/* every second mask of a state came from what was kept */
	assert_true(hits1 - hits0 >= compared / 2);
	assert_true(compared > 100);
	kvd_gram_scratch_free(s);
	kvd_gram_vocab_free(v2);
	free(kept);
	free(fresh);
	free(allowed);
}

int main(void)
{
	scr = kvd_gram_scratch_new();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gbnf_basics),
		cmocka_unit_test(test_gbnf_errors),
		cmocka_unit_test(test_hostile_grammars),
		cmocka_unit_test(test_regex),
		cmocka_unit_test(test_choices),
		cmocka_unit_test(test_json_object),
		cmocka_unit_test(test_schema_refusals),
		cmocka_unit_test(test_synthetic_vocab),
		cmocka_unit_test(test_cache),
		cmocka_unit_test(test_integer_ranges),
		cmocka_unit_test(test_schema_suite),
		cmocka_unit_test(test_mask_timing),
		cmocka_unit_test(test_mask_cache),
	};
	int rc = cmocka_run_group_tests(tests, setup_vocab, teardown_vocab);
	kvd_gram_scratch_free(scr);
	return rc;
}
