/*
 * daemon/model/jsonschema_impl.h — what the JSON Schema translator's two
 * files share: the translation context and its helpers (jsonschema.c), and
 * the per-type generators (jsonschema_types.c). Private to them.
 */
#ifndef KVD_JSONSCHEMA_IMPL_H
#define KVD_JSONSCHEMA_IMPL_H

#include "grammar_impl.h"

#define PTR_MAX 1024

struct memo {
	const struct jv *node;
	uint32_t rule;
};

struct sc {
	const char *text;
	const struct jv *root;
	struct sbuf *out;
	uint32_t n_rules;
	struct memo *memo;
	uint32_t n_memo, cap_memo;
	uint32_t depth;
	char ptr[PTR_MAX];
	size_t ptr_len;
	struct kvd_grammar_error *err;
	int rc;
};

/* Record the first error: "#<pointer>: <message>"; returns rc. */
int js_fail(struct sc *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Append a segment to the current JSON pointer; returns what to restore. */
size_t js_ptr_push(struct sc *c, const char *seg, size_t n);
size_t js_ptr_push_idx(struct sc *c, uint32_t i);
void js_ptr_pop(struct sc *c, size_t old);
/* The rule for a schema (translated once per node; recursion through
 * $ref reuses the rule). */
int js_gen(struct sc *c, const struct jv *node, uint32_t *ret_rule);
/* A non-negative integer keyword (<= KVD_GRAMMAR_MAX_REPEAT), dflt when absent. */
int js_count_kw(struct sc *c, const struct jv *node, const char *kw, uint32_t dflt, uint32_t *ret);
/* Append a GBNF repetition {lo,hi} (hi UINT32_MAX: unbounded). */
void js_rep(struct sbuf *b, uint32_t lo, uint32_t hi);
/* Rule bodies for one type of a schema (jsonschema_types.c). */
int js_gen_integer(struct sc *c, const struct jv *node, struct sbuf *b);
int js_gen_string(struct sc *c, const struct jv *node, struct sbuf *b);
int js_gen_array(struct sc *c, const struct jv *node, struct sbuf *b);

#endif
