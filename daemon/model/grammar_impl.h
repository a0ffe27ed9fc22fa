/*
 * daemon/model/grammar_impl.h — what the constraint engine's files share:
 * the compiled grammar's layout, a growable string, the error helper and
 * the small JSON reader the schema converter and the choice list use.
 * Private to daemon/model/grammar*.c and jsonschema.c.
 */
#ifndef KVD_GRAMMAR_IMPL_H
#define KVD_GRAMMAR_IMPL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/*
 * Compiled grammar. elems[] holds every rule's alternatives, each a run of
 * elements ended by GE_END. An element is GE_END, a byte set (GE_SET |
 * index into sets) or a rule reference (the rule's index, < GE_SET).
 * Rule r's alternatives start at alts[rule_alt[r] .. rule_alt[r + 1]).
 */
#define GE_END 0xFFFFFFFFu
#define GE_SET 0x80000000u
#define GE_IS_SET(e) (((e) & GE_SET) && (e) != GE_END)

struct kvd_grammar {
	atomic_int refs;
	uint32_t root;
	uint32_t n_rules;
	uint32_t n_alts;
	uint32_t n_elems;
	uint32_t n_sets;
	uint32_t *rule_alt;  /* n_rules + 1 */
	uint32_t *alts;      /* n_alts: element index of each alternative's start */
	uint32_t *elems;     /* n_elems */
	uint8_t (*sets)[32]; /* n_sets 256-bit byte sets */
	size_t bytes;
};

static inline int gram_set_has(const uint8_t *set, uint8_t b)
{
	return (set[b >> 3] >> (b & 7)) & 1;
}

/* Check a lowered grammar (grammar_check.c): 0, -EINVAL (rule *ret_rule is
 * left-recursive), -E2BIG (rule *ret_rule expands into too many stacks),
 * -ENOMEM. */
int gram_check(const struct kvd_grammar *g, uint32_t *ret_rule);

/* Compile GBNF text (grammar_gbnf.c). */
int gram_compile_gbnf(const char *text, size_t len, struct kvd_grammar **ret, struct kvd_grammar_error *err);

/* ---- growable string ---------------------------------------------------- */
struct sbuf {
	char *p;
	size_t len, cap;
	int oom;   /* sticky: an append failed */
};
void sb_putn(struct sbuf *b, const char *s, size_t n);
void sb_puts(struct sbuf *b, const char *s);
void sb_putc(struct sbuf *b, char c);
void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s[0..n) as the inside of a GBNF "..." literal (escaping). */
void sb_gbnf_lit(struct sbuf *b, const char *s, size_t n);
/* Append code point cp escaped for a GBNF [...] class. */
void sb_gbnf_class_cp(struct sbuf *b, uint32_t cp);
void sb_free(struct sbuf *b);

/* Fill err: position (0 = unknown), pointer (NULL = none), message. */
void gram_err(struct kvd_grammar_error *err, uint32_t line, uint32_t col, const char *pointer, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* line:col (1-based) of byte offset off in text. */
void gram_line_col(const char *text, size_t off, uint32_t *ret_line, uint32_t *ret_col);

/* Decode one UTF-8 character of s[0..n); returns its length (>= 1) and sets
 * *cp, or 0 for invalid UTF-8. */
size_t gram_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* Encode cp (<= 0x10FFFF) into out (4 bytes); returns the length. */
size_t gram_utf8_encode(uint32_t cp, uint8_t *out);

/* ---- JSON reader ----------------------------------------------------------- */
enum jv_type { JV_NULL, JV_FALSE, JV_TRUE, JV_NUM, JV_STR, JV_ARR, JV_OBJ };

/* A JSON value. Strings are decoded UTF-8 (s, n bytes, NUL-terminated),
 * numbers keep their text in s. Arrays have n values in kids; objects n
 * members with keys in kids[2i] and values in kids[2i + 1]. */
struct jv {
	enum jv_type type;
	uint32_t n;
	const char *s;
	struct jv *kids;
	uint32_t off;   /* byte offset in the source text */
};

struct jdoc;
/* Parse text[0..len) (one value, whitespace around). Returns 0 and sets
 * *ret, -EINVAL (err: line:col and what), -E2BIG (nesting beyond
 * KVD_GRAMMAR_MAX_NESTING or text beyond KVD_GRAMMAR_MAX_TEXT_BYTES),
 * -ENOMEM. */
int jdoc_parse(const char *text, size_t len, struct jdoc **ret, struct kvd_grammar_error *err);
const struct jv *jdoc_root(const struct jdoc *d);
struct jdoc *jdoc_free(struct jdoc *d);
/* The member called key (NUL-terminated) of object o, or NULL. */
const struct jv *jv_get(const struct jv *o, const char *key);
/* Append v written as compact JSON. */
void jv_write(struct sbuf *b, const struct jv *v);
/* Whether two values are equal as JSON values (numbers compared as
 * doubles, objects regardless of member order). */
int jv_equal(const struct jv *a, const struct jv *b);

/* Schema (jsonschema.c) and regex / choices (grammar_regex.c) to GBNF text,
 * appended to out. */
int gram_schema_to_gbnf(const char *text, size_t len, int object_only, struct sbuf *out,
			struct kvd_grammar_error *err);
/* Regex to GBNF: the rule body that matches the pattern. in_json: the body
 * sits inside a JSON string literal (characters the JSON syntax reserves
 * are written as escapes or left out), and search semantics apply (an
 * unanchored side may be preceded / followed by anything). */
int gram_regex_body(const char *re, size_t len, int in_json, struct sbuf *out, struct kvd_grammar_error *err);
int gram_regex_to_gbnf(const char *text, size_t len, struct sbuf *out, struct kvd_grammar_error *err);
int gram_choices_to_gbnf(const char *text, size_t len, struct sbuf *out, struct kvd_grammar_error *err);

#endif
