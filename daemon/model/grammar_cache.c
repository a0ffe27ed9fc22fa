/*
 * daemon/model/grammar_cache.c — the front door of the constraint engine:
 * compiling any kind of constraint (each is translated to GBNF text, then
 * compiled by grammar_gbnf.c), and the compile cache keyed by content.
 *
 * The cache maps (kind, text) to a compiled grammar: a 64-bit FNV-1a hash
 * picks the bucket, the stored text is compared byte for byte, so two
 * texts with the same hash never share a grammar. It is bounded by entries
 * and by the bytes the grammars hold; the least recently used entry goes
 * first. Entries hold a reference; a grammar handed out stays valid after
 * its entry is dropped.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

static const char JSON_OBJECT_SCHEMA[] = "{\"type\":\"object\"}";

int kvd_grammar_to_gbnf(enum kvd_grammar_kind kind, const char *text, size_t len, char **ret_text,
			struct kvd_grammar_error *err)
{
	struct sbuf b = {0};
	int rc;
	if (err)
		memset(err, 0, sizeof(*err));
	if (!text && len)
		return -EINVAL;
	if (len > KVD_GRAMMAR_MAX_TEXT_BYTES) {
		gram_err(err, 0, 0, NULL, "constraint text longer than %u bytes", KVD_GRAMMAR_MAX_TEXT_BYTES);
		return -E2BIG;
	}
	switch (kind) {
	case KVD_GRAMMAR_GBNF:
		sb_putn(&b, text ? text : "", len);
		rc = 0;
		break;
	case KVD_GRAMMAR_JSON_SCHEMA:
		rc = gram_schema_to_gbnf(text, len, 0, &b, err);
		break;
	case KVD_GRAMMAR_JSON_OBJECT:
		rc = gram_schema_to_gbnf(JSON_OBJECT_SCHEMA, sizeof(JSON_OBJECT_SCHEMA) - 1, 1, &b, err);
		break;
	case KVD_GRAMMAR_REGEX:
		rc = gram_regex_to_gbnf(text, len, &b, err);
		break;
	case KVD_GRAMMAR_CHOICE:
		rc = gram_choices_to_gbnf(text, len, &b, err);
		break;
	default:
		gram_err(err, 0, 0, NULL, "unknown constraint kind %d", (int)kind);
		return -EINVAL;
	}
	if (!rc && (b.oom || !b.p))
		rc = b.oom ? -ENOMEM : (sb_puts(&b, ""), b.oom ? -ENOMEM : 0);
	if (rc) {
		sb_free(&b);
		return rc;
	}
	*ret_text = b.p;
	return 0;
}

int kvd_grammar_compile(enum kvd_grammar_kind kind, const char *text, size_t len, struct kvd_grammar **ret,
			struct kvd_grammar_error *err)
{
	char *gbnf = NULL;
	struct kvd_grammar *g = NULL;
	struct kvd_gram_scratch *s = NULL;
	struct kvd_gram_state st = {0};
	int rc = kvd_grammar_to_gbnf(kind, text, len, &gbnf, err);
	if (rc)
		return rc;
	rc = gram_compile_gbnf(gbnf, strlen(gbnf), &g, err);
	if (rc && kind != KVD_GRAMMAR_GBNF && err && rc != -ENOMEM) {
		/* a translation the GBNF compiler refuses hit one of its limits */
		char m[KVD_GRAMMAR_ERR_MAX];
		snprintf(m, sizeof(m), "%s", err->msg);
		gram_err(err, 0, 0, "", "constraint too large or ambiguous once translated: %s", m);
	}
	if (rc)
		goto out;
	/* the start must fit the matcher's limits */
	s = kvd_gram_scratch_new();
	if (!s) {
		rc = -ENOMEM;
		goto out;
	}
	rc = kvd_gram_state_init(g, s, &st);
	if (rc == -E2BIG)
		gram_err(err, 0, 0, NULL, "the grammar's start expands beyond %u parse stacks", KVD_GRAMMAR_MAX_STACKS);
out:
	kvd_gram_state_fini(&st);
	kvd_gram_scratch_free(s);
	free(gbnf);
	if (rc) {
		kvd_grammar_unref(g);
		return rc;
	}
	*ret = g;
	return 0;
}

/* ---- cache ------------------------------------------------------------------ */

struct centry {
	struct centry *prev, *next;  /* LRU: head is the most recent */
	uint64_t hash;
	enum kvd_grammar_kind kind;
	size_t len;
	char *text;
	struct kvd_grammar *g;
	size_t bytes;
};

struct kvd_gram_cache {
	pthread_mutex_t lock;
	uint32_t max_entries, n;
	size_t max_bytes, bytes;
	struct centry *head, *tail;
};

static uint64_t fnv1a(enum kvd_grammar_kind kind, const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	h = (h ^ (uint8_t)kind) * 1099511628211ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h;
}

struct kvd_gram_cache *kvd_gram_cache_new(uint32_t max_entries, size_t max_bytes)
{
	struct kvd_gram_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (pthread_mutex_init(&c->lock, NULL)) {
		free(c);
		return NULL;
	}
	c->max_entries = max_entries;
	c->max_bytes = max_bytes;
	return c;
}

static void unlink_entry(struct kvd_gram_cache *c, struct centry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		c->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		c->tail = e->prev;
	e->prev = e->next = NULL;
}

static void push_front(struct kvd_gram_cache *c, struct centry *e)
{
	e->prev = NULL;
	e->next = c->head;
	if (c->head)
		c->head->prev = e;
	c->head = e;
	if (!c->tail)
		c->tail = e;
}

static void drop_entry(struct kvd_gram_cache *c, struct centry *e)
{
	unlink_entry(c, e);
	c->n--;
	c->bytes -= e->bytes;
	kvd_grammar_unref(e->g);
	free(e->text);
	free(e);
}

struct kvd_gram_cache *kvd_gram_cache_free(struct kvd_gram_cache *c)
{
	if (!c)
		return NULL;
	while (c->head)
		drop_entry(c, c->head);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return NULL;
}

int kvd_gram_cache_get(struct kvd_gram_cache *c, enum kvd_grammar_kind kind, const char *text, size_t len,
		       struct kvd_grammar **ret, int *ret_hit, struct kvd_grammar_error *err)
{
	if (!text && len)
		return -EINVAL;
	uint64_t h = fnv1a(kind, text ? text : "", len);
	pthread_mutex_lock(&c->lock);
	for (struct centry *e = c->head; e; e = e->next)
		if (e->hash == h && e->kind == kind && e->len == len && (len == 0 || memcmp(e->text, text, len) == 0)) {
			unlink_entry(c, e);
			push_front(c, e);
			*ret = kvd_grammar_ref(e->g);
			pthread_mutex_unlock(&c->lock);
			if (ret_hit)
				*ret_hit = 1;
			return 0;
		}
	pthread_mutex_unlock(&c->lock);
	/* compiled outside the lock: two threads may both compile one text;
	 * the second insert finds the first and keeps it */
	struct kvd_grammar *g;
	int rc = kvd_grammar_compile(kind, text, len, &g, err);
	if (rc)
		return rc;
	if (ret_hit)
		*ret_hit = 0;
	struct centry *e = calloc(1, sizeof(*e));
	char *copy = malloc(len + 1);
	size_t bytes = kvd_grammar_bytes(g) + len + sizeof(*e);
	if (!e || !copy || bytes > c->max_bytes || c->max_entries == 0) {
		free(e);
		free(copy);
		*ret = g; /* not cached, still usable */
		return 0;
	}
	if (len)
		memcpy(copy, text, len);
	copy[len] = 0;
	*e = (struct centry){.hash = h, .kind = kind, .len = len, .text = copy, .g = kvd_grammar_ref(g), .bytes = bytes};
	pthread_mutex_lock(&c->lock);
	for (struct centry *o = c->head; o; o = o->next)
		if (o->hash == h && o->kind == kind && o->len == len && (len == 0 || memcmp(o->text, text, len) == 0)) {
			drop_entry(c, o);
			break;
		}
	while (c->head && (c->n + 1 > c->max_entries || c->bytes + bytes > c->max_bytes))
		drop_entry(c, c->tail);
	push_front(c, e);
	c->n++;
	c->bytes += bytes;
	pthread_mutex_unlock(&c->lock);
	*ret = g;
	return 0;
}

void kvd_gram_cache_stats(struct kvd_gram_cache *c, uint32_t *ret_entries, size_t *ret_bytes)
{
	pthread_mutex_lock(&c->lock);
	if (ret_entries)
		*ret_entries = c->n;
	if (ret_bytes)
		*ret_bytes = c->bytes;
	pthread_mutex_unlock(&c->lock);
}
