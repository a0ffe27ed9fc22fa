/*
 * daemon/model/grammar_match.c — running a compiled grammar over bytes and
 * tokens: the per-sequence state, the vocabulary's prefix tree and the
 * allowed-token mask.
 *
 * The parser is a set of pushdown stacks (llama.cpp's scheme, over bytes).
 * While matching, stacks live in the scratch as linked frames {pos, parent}
 * so a step shares every frame below the top; a stack's top always sits on
 * a byte set. Advancing by byte b keeps each stack whose top set holds b,
 * moves it one element on and expands: at an alternative's end it returns
 * into its parent frame, at a rule reference it branches into each of the
 * rule's alternatives (a reference in tail position does not grow the
 * stack). Equal stacks are kept once. The work per byte, the number of
 * stacks and their depth are bounded (grammar.h); a path that exceeds them
 * is dropped the same way in every entry point.
 *
 * The mask walks the vocabulary's byte-prefix tree in preorder, keeping
 * one stack set per tree depth: a node's set is its parent's advanced by
 * one byte, an empty set skips the whole subtree, and frames made below a
 * node are released when the walk moves to its sibling (the scratch is a
 * stack allocator per depth). Tokens sharing a prefix therefore share its
 * matching.
 *
 * On top of that, transitions are memoized per scratch: a stack set is
 * flattened into its canonical words (the same form as kvd_gram_state)
 * and numbered, and (set, byte) -> set is kept in a table, a DFA over
 * stack sets built lazily. Inside a JSON string nearly every token leads
 * back to the same few sets, so after the first mask most tree nodes cost
 * one table lookup. The memo computes exactly what the direct walk does
 * (it runs the same advance on the same stacks); it is bounded
 * (DFA_MAX_STATES, DFA_MAX_WORDS) and, when full, dropped and the direct
 * walk used. It holds a reference to its grammar so the grammar's address
 * cannot be reused while it describes it. It also keeps each state's
 * finished mask (for one vocabulary at a time, DFA_MAX_MASK_BYTES in all),
 * so a state met again — the next character of a plain string, another
 * sequence of the batch at the same key — is answered by a copy.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "tokenizer.h"

#define NONE   UINT32_MAX   /* no parent frame */
#define ACCEPT UINT32_MAX   /* a top: the empty stack (complete) */
#define REFLATTEN_BYTES 64  /* accept_bytes compacts its frames this often */
#define VOCAB_MAX_TOKENS (1 << 22)
#define VOCAB_MAX_TOKEN_BYTES 4096u

struct frame {
	uint32_t pos, parent, depth;
};

/* Memo of stack-set transitions (a lazily built DFA over whole stack sets):
 * state i is a flattened set at pool[off[i]] = {n_stacks, n_words,
 * words...}; rows[i][b] is 0 (not computed), 1 (dead) or the next state + 2.
 * masks[i] (NULL until computed) is state i's whole allowed-token mask for
 * the vocabulary numbered mask_vocab: {count, words...}. A mask is a pure
 * function of (grammar, vocabulary, stack set), and the memo is bound to
 * one grammar and its masks to one vocabulary, so a stored mask is exactly
 * the one the walk would compute; they are dropped with the states. */
#define DFA_MAX_STATES 16384u
#define DFA_MAX_WORDS  (1u << 22)
#define DFA_MAX_MASK_BYTES (16u << 20) /* stored masks, all states together */
#define DFA_UNKNOWN 0u
#define DFA_DEAD    1u

struct dfa {
	struct kvd_grammar *g;  /* held (a reference) while states refer to it */
	uint32_t *pool;
	uint32_t n_pool, cap_pool;
	uint32_t *off;
	uint32_t n_states, cap_states;
	uint32_t *tab;          /* open addressing by content: state + 1 */
	uint32_t tab_cap;
	uint32_t **rows;
	uint32_t cap_rows;
	uint32_t **masks;
	uint32_t cap_masks;
	uint64_t mask_vocab;    /* kvd_gram_vocab.id the masks are for */
	size_t mask_bytes;
	uint32_t n_masks;       /* masks kept now */
	uint64_t mask_hits;     /* masks answered from masks[], ever */
};

struct kvd_gram_scratch {
	struct dfa dfa;
	struct kvd_gram_state tmp;
	struct frame *fr;
	uint32_t n_fr, cap_fr;
	uint32_t *tops;
	uint32_t n_tops, cap_tops;
	uint32_t *work;     /* (pos, parent, depth) triples */
	uint32_t cap_work;
	uint32_t *stamp;    /* per element: generation it was last a top in */
	uint32_t cap_stamp, gen;
	struct {
		uint32_t off, n, fr_mark;
	} *lvl;
	uint32_t cap_lvl;
	uint32_t *chain;    /* flatten's path buffer */
	uint32_t cap_chain;
};

struct tnode {
	uint32_t end;       /* first node after this subtree */
	uint32_t tok_first; /* into vocab->sorted */
	uint16_t depth;     /* 1 for the root's children */
	uint16_t tok_n;
	uint8_t byte;
};

struct kvd_gram_vocab {
	uint64_t id;        /* unique over the process's vocabularies (never reused) */
	int32_t n;
	uint8_t *kinds;
	uint32_t *off;      /* n + 1 */
	uint8_t *bytes;
	struct tnode *nodes;
	uint32_t n_nodes;
	int32_t *sorted;    /* TEXT tokens in byte order */
	int32_t *ends;
	uint32_t n_ends;
};

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	uint32_t nc = *cap ? *cap : 64;
	while (nc < need) {
		if (nc > UINT32_MAX / 2)
			return -ENOMEM;
		nc *= 2;
	}
	void *np = realloc(*p, (size_t)nc * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = nc;
	return 0;
}

struct kvd_gram_scratch *kvd_gram_scratch_new(void)
{
	return calloc(1, sizeof(struct kvd_gram_scratch));
}

void kvd_gram_scratch_stats(const struct kvd_gram_scratch *s, uint64_t *ret_mask_hits, uint32_t *ret_masks_kept)
{
	if (ret_mask_hits)
		*ret_mask_hits = s->dfa.mask_hits;
	if (ret_masks_kept)
		*ret_masks_kept = s->dfa.n_masks;
}

static void dfa_reset(struct dfa *d)
{
	for (uint32_t i = 0; i < d->n_states; i++) {
		free(d->rows[i]);
		free(d->masks[i]);
	}
	d->mask_bytes = 0;
	d->n_masks = 0;
	kvd_grammar_unref(d->g);
	d->g = NULL;
	d->n_states = 0;
	d->n_pool = 0;
	if (d->tab)
		memset(d->tab, 0, (size_t)d->tab_cap * sizeof(uint32_t));
}

struct kvd_gram_scratch *kvd_gram_scratch_free(struct kvd_gram_scratch *s)
{
	if (!s)
		return NULL;
	dfa_reset(&s->dfa);
	free(s->dfa.pool);
	free(s->dfa.off);
	free(s->dfa.tab);
	free(s->dfa.rows);
	free(s->dfa.masks);
	kvd_gram_state_fini(&s->tmp);
	free(s->fr);
	free(s->tops);
	free(s->work);
	free(s->stamp);
	free(s->lvl);
	free(s->chain);
	free(s);
	return NULL;
}

static int new_frame(struct kvd_gram_scratch *s, uint32_t pos, uint32_t parent, uint32_t depth, uint32_t *ret)
{
	if (s->n_fr == s->cap_fr && grow((void **)&s->fr, &s->cap_fr, s->n_fr + 1, sizeof(*s->fr)))
		return -ENOMEM;
	s->fr[s->n_fr] = (struct frame){pos, parent, depth};
	*ret = s->n_fr++;
	return 0;
}

static int same_stack(const struct kvd_gram_scratch *s, uint32_t a, uint32_t b)
{
	while (a != b) {
		if (a == NONE || b == NONE || s->fr[a].pos != s->fr[b].pos || s->fr[a].depth != s->fr[b].depth)
			return 0;
		a = s->fr[a].parent;
		b = s->fr[b].parent;
	}
	return 1;
}

/* Add a top to the set being built at tops[start..n_tops). */
static int add_top(struct kvd_gram_scratch *s, uint32_t start, uint32_t top)
{
	uint32_t key = top == ACCEPT ? 0 : s->fr[top].pos + 1;
	if (key < s->cap_stamp && s->stamp[key] == s->gen) {
		for (uint32_t i = start; i < s->n_tops; i++) {
			uint32_t t = s->tops[i];
			if (t == top || (t != ACCEPT && top != ACCEPT && same_stack(s, t, top)))
				return 0;
		}
	} else if (key < s->cap_stamp) {
		s->stamp[key] = s->gen;
	}
	if (s->n_tops - start >= KVD_GRAMMAR_MAX_STACKS)
		return -E2BIG;
	if (s->n_tops == s->cap_tops && grow((void **)&s->tops, &s->cap_tops, s->n_tops + 1, sizeof(uint32_t)))
		return -ENOMEM;
	s->tops[s->n_tops++] = top;
	return 0;
}

/* Expand a stack whose next element is pos (parent frame `parent` of depth
 * pdepth) until every branch's top sits on a byte set or is complete;
 * append the tops to the set at tops[start..). *work counts expansions. */
static int expand(const struct kvd_grammar *g, struct kvd_gram_scratch *s, uint32_t pos, uint32_t parent,
		  uint32_t pdepth, uint32_t start, uint32_t *work)
{
	uint32_t nw = 0;
	int rc;
	if (grow((void **)&s->work, &s->cap_work, 3, sizeof(uint32_t)))
		return -ENOMEM;
	s->work[nw++] = pos;
	s->work[nw++] = parent;
	s->work[nw++] = pdepth;
	while (nw) {
		pdepth = s->work[--nw];
		parent = s->work[--nw];
		pos = s->work[--nw];
		for (;;) {
			uint32_t e = g->elems[pos];
			if (e == GE_END) {
				if (parent == NONE) {
					if ((rc = add_top(s, start, ACCEPT)))
						return rc;
					break;
				}
				const struct frame *f = &s->fr[parent];
				pos = f->pos;
				pdepth = f->depth - 1;
				parent = f->parent;
				continue;
			}
			if (GE_IS_SET(e)) {
				uint32_t t;
				if (pdepth + 1 > KVD_GRAMMAR_MAX_DEPTH)
					break; /* too deep: this path is dropped */
				if ((rc = new_frame(s, pos, parent, pdepth + 1, &t)) || (rc = add_top(s, start, t)))
					return rc;
				break;
			}
			if (++*work > KVD_GRAMMAR_MAX_STEP_WORK)
				return -E2BIG;
			uint32_t cont = parent, d = pdepth;
			if (g->elems[pos + 1] != GE_END) {
				if (pdepth + 1 > KVD_GRAMMAR_MAX_DEPTH)
					break;
				if ((rc = new_frame(s, pos + 1, parent, pdepth + 1, &cont)))
					return rc;
				d = pdepth + 1;
			}
			uint32_t a0 = g->rule_alt[e], a1 = g->rule_alt[e + 1];
			if (grow((void **)&s->work, &s->cap_work, nw + 3 * (a1 - a0), sizeof(uint32_t)))
				return -ENOMEM;
			for (uint32_t a = a1; a > a0; a--) {
				s->work[nw++] = g->alts[a - 1];
				s->work[nw++] = cont;
				s->work[nw++] = d;
			}
			break;
		}
	}
	return 0;
}

static int begin_set(const struct kvd_grammar *g, struct kvd_gram_scratch *s)
{
	if (s->cap_stamp < g->n_elems + 1) {
		uint32_t old = s->cap_stamp;
		if (grow((void **)&s->stamp, &s->cap_stamp, g->n_elems + 1, sizeof(uint32_t)))
			return -ENOMEM;
		memset(s->stamp + old, 0, (size_t)(s->cap_stamp - old) * sizeof(uint32_t));
	}
	if (++s->gen == 0) {
		memset(s->stamp, 0, (size_t)s->cap_stamp * sizeof(uint32_t));
		s->gen = 1;
	}
	return 0;
}

/* The set tops[from..from+n) advanced by byte b, appended at n_tops.
 * Returns the new set's size, or -E2BIG / -ENOMEM. */
static int advance(const struct kvd_grammar *g, struct kvd_gram_scratch *s, uint32_t from, uint32_t n, uint8_t b)
{
	uint32_t start = s->n_tops, work = 0;
	int rc = begin_set(g, s);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t t = s->tops[from + i];
		if (t == ACCEPT)
			continue;
		struct frame f = s->fr[t];
		if (!gram_set_has(g->sets[g->elems[f.pos] & ~GE_SET], b))
			continue;
		if ((rc = expand(g, s, f.pos + 1, f.parent, f.depth - 1, start, &work)))
			return rc;
	}
	return (int)(s->n_tops - start);
}

/* Rebuild the frames of st in s (from scratch); the set is tops[0..n). */
static int load(const struct kvd_gram_state *st, struct kvd_gram_scratch *s, uint32_t *ret_n)
{
	s->n_fr = 0;
	s->n_tops = 0;
	const uint32_t *w = st->words;
	for (uint32_t k = 0; k < st->n_stacks; k++) {
		uint32_t depth = *w++, parent = NONE;
		for (uint32_t i = 0; i < depth; i++)
			if (new_frame(s, w[i], parent, i + 1, &parent))
				return -ENOMEM;
		w += depth;
		if (s->n_tops == s->cap_tops && grow((void **)&s->tops, &s->cap_tops, s->n_tops + 1, sizeof(uint32_t)))
			return -ENOMEM;
		s->tops[s->n_tops++] = depth ? parent : ACCEPT;
	}
	*ret_n = s->n_tops;
	return 0;
}

/* Write the set tops[from..from+n) into st. */
static int flatten(struct kvd_gram_scratch *s, uint32_t from, uint32_t n, struct kvd_gram_state *st)
{
	uint64_t words = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t t = s->tops[from + i];
		words += 1 + (t == ACCEPT ? 0 : s->fr[t].depth);
	}
	if (words > UINT32_MAX / 2)
		return -E2BIG;
	if (words > st->cap_words) {
		uint32_t *nw = realloc(st->words, (size_t)words * sizeof(uint32_t));
		if (!nw)
			return -ENOMEM;
		st->words = nw;
		st->cap_words = (uint32_t)words;
	}
	uint32_t o = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t t = s->tops[from + i];
		uint32_t d = t == ACCEPT ? 0 : s->fr[t].depth;
		st->words[o++] = d;
		for (uint32_t k = d; k > 0; k--) {
			st->words[o + k - 1] = s->fr[t].pos;
			t = s->fr[t].parent;
		}
		o += d;
	}
	st->n_stacks = n;
	st->n_words = o;
	return 0;
}

int kvd_gram_state_init(const struct kvd_grammar *g, struct kvd_gram_scratch *s, struct kvd_gram_state *st)
{
	uint32_t work = 0;
	int rc;
	s->n_fr = 0;
	s->n_tops = 0;
	if ((rc = begin_set(g, s)))
		return rc;
	for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
		if ((rc = expand(g, s, g->alts[a], NONE, 0, 0, &work)))
			return rc;
	return flatten(s, 0, s->n_tops, st);
}

int kvd_gram_state_copy(struct kvd_gram_state *dst, const struct kvd_gram_state *src)
{
	if (src->n_words > dst->cap_words) {
		uint32_t *nw = realloc(dst->words, (size_t)src->n_words * sizeof(uint32_t));
		if (!nw)
			return -ENOMEM;
		dst->words = nw;
		dst->cap_words = src->n_words;
	}
	if (src->n_words)
		memcpy(dst->words, src->words, (size_t)src->n_words * sizeof(uint32_t));
	dst->n_words = src->n_words;
	dst->n_stacks = src->n_stacks;
	return 0;
}

void kvd_gram_state_fini(struct kvd_gram_state *st)
{
	free(st->words);
	memset(st, 0, sizeof(*st));
}

int kvd_gram_state_load(const struct kvd_grammar *g, const uint32_t *words, uint32_t n_words,
			struct kvd_gram_state *st)
{
	uint32_t o = 0, n = 0;
	while (o < n_words) {
		uint32_t d = words[o++];
		if (d > KVD_GRAMMAR_MAX_DEPTH || d > n_words - o || ++n > KVD_GRAMMAR_MAX_STACKS)
			return -EINVAL;
		for (uint32_t i = 0; i < d; i++)
			if (words[o + i] >= g->n_elems || g->elems[words[o + i]] == GE_END)
				return -EINVAL;
		if (d && !GE_IS_SET(g->elems[words[o + d - 1]]))
			return -EINVAL;
		o += d;
	}
	struct kvd_gram_state tmp = {.n_stacks = n, .n_words = n_words, .words = (uint32_t *)words};
	return kvd_gram_state_copy(st, &tmp);
}

int kvd_gram_is_complete(const struct kvd_gram_state *st)
{
	const uint32_t *w = st->words;
	for (uint32_t k = 0; k < st->n_stacks; k++) {
		if (*w == 0)
			return 1;
		w += 1 + *w;
	}
	return 0;
}

int kvd_gram_can_continue(const struct kvd_gram_state *st)
{
	const uint32_t *w = st->words;
	for (uint32_t k = 0; k < st->n_stacks; k++) {
		if (*w != 0)
			return 1;
		w += 1 + *w;
	}
	return 0;
}

/* Advance the loaded set tops[0..*n) by bytes, compacting as it goes; the
 * result is again at tops[0..*n). Returns 0, -ENOENT, -E2BIG, -ENOMEM. */
static int run_bytes(const struct kvd_grammar *g, struct kvd_gram_scratch *s, uint32_t *n, const uint8_t *b,
		     size_t len)
{
	uint32_t from = 0;
	for (size_t i = 0; i < len; i++) {
		int r = advance(g, s, from, *n, b[i]);
		if (r < 0)
			return r;
		if (r == 0)
			return -ENOENT;
		from = s->n_tops - (uint32_t)r;
		*n = (uint32_t)r;
	}
	memmove(s->tops, s->tops + from, (size_t)*n * sizeof(uint32_t));
	s->n_tops = *n;
	return 0;
}

int kvd_gram_accept_bytes(const struct kvd_grammar *g, struct kvd_gram_scratch *s, struct kvd_gram_state *st,
			  const uint8_t *bytes, size_t len)
{
	uint32_t n;
	int rc = load(st, s, &n);
	if (rc)
		return rc;
	for (size_t done = 0; done < len;) {
		size_t k = len - done < REFLATTEN_BYTES ? len - done : REFLATTEN_BYTES;
		if ((rc = run_bytes(g, s, &n, bytes + done, k)))
			return rc;
		done += k;
		if (done < len) {
			/* drop the frames no stack uses any more */
			struct kvd_gram_state tmp = {0};
			rc = flatten(s, 0, n, &tmp);
			if (!rc)
				rc = load(&tmp, s, &n);
			kvd_gram_state_fini(&tmp);
			if (rc)
				return rc;
		}
	}
	return flatten(s, 0, n, st);
}

/* ---- transition memo ------------------------------------------------------------ */

static uint32_t words_hash(const uint32_t *w, uint32_t n_stacks, uint32_t n)
{
	uint32_t h = 2166136261u ^ n_stacks;
	for (uint32_t i = 0; i < n; i++)
		h = (h ^ w[i]) * 16777619u;
	return h;
}

/* Use the memo for g (dropping what it held for another grammar). */
static void dfa_bind(struct dfa *d, const struct kvd_grammar *g)
{
	if (d->g == g)
		return;
	dfa_reset(d);
	/* the reference keeps g's address from being reused by another grammar
	 * while the memo's states describe it */
	d->g = kvd_grammar_ref((struct kvd_grammar *)g);
}

/* The state id of a flattened set; -E2BIG when the memo is full, -ENOMEM. */
static int dfa_intern(struct dfa *d, uint32_t n_stacks, const uint32_t *w, uint32_t n)
{
	uint32_t h = words_hash(w, n_stacks, n);
	if (d->tab_cap) {
		for (uint32_t k = h & (d->tab_cap - 1); d->tab[k]; k = (k + 1) & (d->tab_cap - 1)) {
			const uint32_t *e = d->pool + d->off[d->tab[k] - 1];
			if (e[0] == n_stacks && e[1] == n && memcmp(e + 2, w, (size_t)n * sizeof(uint32_t)) == 0)
				return (int)(d->tab[k] - 1);
		}
	}
	if (d->n_states >= DFA_MAX_STATES || d->n_pool + n + 2 > DFA_MAX_WORDS)
		return -E2BIG;
	if ((d->n_states + 1) * 2 > d->tab_cap) {
		uint32_t nc = d->tab_cap ? d->tab_cap * 2 : 1024;
		uint32_t *nt = calloc(nc, sizeof(uint32_t));
		if (!nt)
			return -ENOMEM;
		for (uint32_t i = 0; i < d->n_states; i++) {
			const uint32_t *e = d->pool + d->off[i];
			uint32_t k = words_hash(e + 2, e[0], e[1]) & (nc - 1);
			while (nt[k])
				k = (k + 1) & (nc - 1);
			nt[k] = i + 1;
		}
		free(d->tab);
		d->tab = nt;
		d->tab_cap = nc;
	}
	if (grow((void **)&d->pool, &d->cap_pool, d->n_pool + n + 2, sizeof(uint32_t)) ||
	    grow((void **)&d->off, &d->cap_states, d->n_states + 1, sizeof(uint32_t)) ||
	    grow((void **)&d->rows, &d->cap_rows, d->n_states + 1, sizeof(uint32_t *)) ||
	    grow((void **)&d->masks, &d->cap_masks, d->n_states + 1, sizeof(uint32_t *)))
		return -ENOMEM;
	uint32_t id = d->n_states++;
	d->off[id] = d->n_pool;
	d->pool[d->n_pool++] = n_stacks;
	d->pool[d->n_pool++] = n;
	memcpy(d->pool + d->n_pool, w, (size_t)n * sizeof(uint32_t));
	d->n_pool += n;
	d->rows[id] = NULL;
	d->masks[id] = NULL;
	uint32_t k = h & (d->tab_cap - 1);
	while (d->tab[k])
		k = (k + 1) & (d->tab_cap - 1);
	d->tab[k] = id + 1;
	return (int)id;
}

/* State id after byte b from state id: >= 0, -ENOENT (dead: no stack takes
 * b, or a limit was hit: the same as the direct path), -E2BIG (memo
 * full), -ENOMEM. */
static int dfa_step(const struct kvd_grammar *g, struct kvd_gram_scratch *s, uint32_t id, uint8_t b)
{
	struct dfa *d = &s->dfa;
	uint32_t *row = d->rows[id];
	if (row && row[b] != DFA_UNKNOWN)
		return row[b] == DFA_DEAD ? -ENOENT : (int)(row[b] - 2);
	if (!row) {
		row = d->rows[id] = calloc(256, sizeof(uint32_t));
		if (!row)
			return -ENOMEM;
	}
	const uint32_t *e = d->pool + d->off[id];
	struct kvd_gram_state view = {.n_stacks = e[0], .n_words = e[1], .words = (uint32_t *)(e + 2)};
	uint32_t n;
	int r = load(&view, s, &n);
	if (r)
		return r;
	r = advance(g, s, 0, n, b);
	if (r == -E2BIG || r == 0) {
		row[b] = DFA_DEAD;
		return -ENOENT;
	}
	if (r < 0)
		return r;
	if ((r = flatten(s, s->n_tops - (uint32_t)r, (uint32_t)r, &s->tmp)))
		return r;
	r = dfa_intern(d, s->tmp.n_stacks, s->tmp.words, s->tmp.n_words);
	if (r < 0)
		return r;
	d->rows[id][b] = (uint32_t)r + 2;
	return r;
}

/* The memo's id for st, resetting the memo once when it is full. */
static int dfa_start(const struct kvd_grammar *g, struct kvd_gram_scratch *s, const struct kvd_gram_state *st)
{
	dfa_bind(&s->dfa, g);
	int r = dfa_intern(&s->dfa, st->n_stacks, st->words, st->n_words);
	if (r == -E2BIG) {
		dfa_reset(&s->dfa);
		dfa_bind(&s->dfa, g);
		r = dfa_intern(&s->dfa, st->n_stacks, st->words, st->n_words);
	}
	return r;
}

static int token_bytes(const struct kvd_gram_vocab *v, int32_t token, const uint8_t **b, size_t *len)
{
	if (token < 0 || token >= v->n)
		return -EINVAL;
	*b = v->bytes + v->off[token];
	*len = v->off[token + 1] - v->off[token];
	return v->kinds[token];
}

int kvd_gram_accept_token(const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *s,
			  struct kvd_gram_state *st, int32_t token)
{
	const uint8_t *b;
	size_t len;
	int kind = token_bytes(v, token, &b, &len);
	if (kind < 0)
		return kind;
	if (kind == KVD_GRAM_TOKEN_END)
		return kvd_gram_is_complete(st) ? 0 : -ENOENT;
	if (kind != KVD_GRAM_TOKEN_TEXT)
		return -ENOENT;
	return kvd_gram_accept_bytes(g, s, st, b, len);
}

int kvd_gram_check(const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *s,
		   const struct kvd_gram_state *st, int32_t token)
{
	const uint8_t *b;
	size_t len;
	uint32_t n;
	int kind = token_bytes(v, token, &b, &len);
	if (kind < 0)
		return 0;
	if (kind == KVD_GRAM_TOKEN_END)
		return kvd_gram_is_complete(st);
	if (kind != KVD_GRAM_TOKEN_TEXT)
		return 0;
	int id = dfa_start(g, s, st);
	for (size_t i = 0; id >= 0 && i < len; i++)
		id = dfa_step(g, s, (uint32_t)id, b[i]);
	if (id >= 0 || id == -ENOENT || id == -ENOMEM)
		return id == -ENOMEM ? id : id >= 0;
	/* the memo is full: match directly */
	int rc = load(st, s, &n);
	if (rc)
		return rc;
	rc = run_bytes(g, s, &n, b, len);
	return rc == -ENOMEM ? rc : rc == 0;
}

static uint32_t mask_ends(const struct kvd_gram_vocab *v, const struct kvd_gram_state *st, uint32_t *mask)
{
	uint32_t count = 0;
	memset(mask, 0, kvd_gram_vocab_mask_words(v) * sizeof(uint32_t));
	if (kvd_gram_is_complete(st))
		for (uint32_t i = 0; i < v->n_ends; i++) {
			mask[v->ends[i] >> 5] |= 1u << (v->ends[i] & 31);
			count++;
		}
	return count;
}

/* Keep mask (count allowed) as state id's, within DFA_MAX_MASK_BYTES
 * (beyond it masks are simply not kept). */
static void mask_store(struct dfa *d, const struct kvd_gram_vocab *v, uint32_t id, const uint32_t *mask,
		       uint32_t count)
{
	size_t words = kvd_gram_vocab_mask_words(v), bytes = (words + 1) * sizeof(uint32_t);
	if (d->mask_vocab != v->id) {
		for (uint32_t i = 0; i < d->n_states; i++) {
			free(d->masks[i]);
			d->masks[i] = NULL;
		}
		d->mask_bytes = 0;
		d->n_masks = 0;
		d->mask_vocab = v->id;
	}
	if (d->masks[id] || d->mask_bytes + bytes > DFA_MAX_MASK_BYTES)
		return;
	uint32_t *m = malloc(bytes);
	if (!m)
		return; /* only a cache: the next mask is walked again */
	m[0] = count;
	memcpy(m + 1, mask, words * sizeof(uint32_t));
	d->masks[id] = m;
	d->mask_bytes += bytes;
	d->n_masks++;
}

/* The walk over memoized transitions (or state id's stored mask); -E2BIG
 * when the memo filled up. */
static int mask_memo(const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *s,
		     const struct kvd_gram_state *st, uint32_t *mask)
{
	int id = dfa_start(g, s, st);
	if (id < 0)
		return id;
	const uint32_t *kept = s->dfa.mask_vocab == v->id ? s->dfa.masks[id] : NULL;
	if (kept) {
		s->dfa.mask_hits++;
		memcpy(mask, kept + 1, kvd_gram_vocab_mask_words(v) * sizeof(uint32_t));
		return (int)kept[0];
	}
	uint32_t start = (uint32_t)id, count = mask_ends(v, st, mask);
	if (grow((void **)&s->lvl, &s->cap_lvl, VOCAB_MAX_TOKEN_BYTES + 1, sizeof(*s->lvl)))
		return -ENOMEM;
	s->lvl[0].off = (uint32_t)id;
	const struct tnode *nodes = v->nodes;
	for (uint32_t i = 0; i < v->n_nodes;) {
		const struct tnode *nd = &nodes[i];
		/* a transition known already is read here, without the call */
		uint32_t from = s->lvl[nd->depth - 1].off;
		const uint32_t *row = s->dfa.rows[from];
		uint32_t x = row ? row[nd->byte] : DFA_UNKNOWN;
		int r = x > DFA_DEAD ? (int)(x - 2) : x == DFA_DEAD ? -ENOENT : dfa_step(g, s, from, nd->byte);
		if (r == -ENOENT) {
			i = nd->end;
			continue;
		}
		if (r < 0)
			return r;
		s->lvl[nd->depth].off = (uint32_t)r;
		for (uint32_t k = 0; k < nd->tok_n; k++) {
			int32_t t = v->sorted[nd->tok_first + k];
			mask[t >> 5] |= 1u << (t & 31);
		}
		count += nd->tok_n;
		i++;
	}
	mask_store(&s->dfa, v, start, mask, count);
	return (int)count;
}

int kvd_gram_allowed_mask(const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *s,
			  const struct kvd_gram_state *st, uint32_t *mask)
{
	uint32_t n0, count;
	int rc = mask_memo(g, v, s, st, mask);
	if (rc != -E2BIG)
		return rc;
	/* the memo filled up within this walk: start it afresh next time and
	 * walk directly now */
	dfa_reset(&s->dfa);
	count = mask_ends(v, st, mask);
	if ((rc = load(st, s, &n0)))
		return rc;
	if (grow((void **)&s->lvl, &s->cap_lvl, VOCAB_MAX_TOKEN_BYTES + 1, sizeof(*s->lvl)))
		return -ENOMEM;
	s->lvl[0].off = 0;
	s->lvl[0].n = n0;
	s->lvl[0].fr_mark = s->n_fr;
	const struct tnode *nodes = v->nodes;
	for (uint32_t i = 0; i < v->n_nodes;) {
		const struct tnode *nd = &nodes[i];
		uint32_t d = nd->depth;
		s->n_fr = s->lvl[d - 1].fr_mark;
		s->n_tops = s->lvl[d - 1].off + s->lvl[d - 1].n;
		int r = advance(g, s, s->lvl[d - 1].off, s->lvl[d - 1].n, nd->byte);
		if (r == -ENOMEM)
			return r;
		if (r <= 0) {
			i = nd->end;
			continue;
		}
		s->lvl[d].off = s->n_tops - (uint32_t)r;
		s->lvl[d].n = (uint32_t)r;
		s->lvl[d].fr_mark = s->n_fr;
		for (uint32_t k = 0; k < nd->tok_n; k++) {
			int32_t t = v->sorted[nd->tok_first + k];
			mask[t >> 5] |= 1u << (t & 31);
		}
		count += nd->tok_n;
		i++;
	}
	return (int)count;
}

/* ---- vocabulary ------------------------------------------------------------- */

static int cmp_tok(const void *a, const void *b, void *ctx)
{
	const struct kvd_gram_vocab *v = ctx;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
	int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
	if (c)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x < y ? -1 : x > y;
}

int kvd_gram_vocab_new(int32_t n_tokens, const uint8_t *const *bytes, const uint32_t *lens, const uint8_t *kinds,
		       struct kvd_gram_vocab **ret)
{
	if (n_tokens < 1 || n_tokens > VOCAB_MAX_TOKENS || !bytes || !lens)
		return -EINVAL;
	uint64_t total = 0;
	for (int32_t i = 0; i < n_tokens; i++) {
		if (lens[i] > VOCAB_MAX_TOKEN_BYTES || (lens[i] && !bytes[i]) ||
		    (kinds && kinds[i] > KVD_GRAM_TOKEN_NEVER))
			return -EINVAL;
		total += lens[i];
	}
	struct kvd_gram_vocab *v = calloc(1, sizeof(*v));
	int rc = -ENOMEM;
	if (!v)
		return -ENOMEM;
	static _Atomic uint64_t next_id = 1;
	v->id = atomic_fetch_add(&next_id, 1);
	v->n = n_tokens;
	v->kinds = malloc((size_t)n_tokens);
	v->off = malloc(((size_t)n_tokens + 1) * sizeof(uint32_t));
	v->bytes = malloc((size_t)total + 1);
	v->sorted = malloc((size_t)n_tokens * sizeof(int32_t));
	v->ends = malloc((size_t)n_tokens * sizeof(int32_t));
	v->nodes = malloc((size_t)total * sizeof(struct tnode) + sizeof(struct tnode));
	uint32_t *open = malloc((VOCAB_MAX_TOKEN_BYTES + 1) * sizeof(uint32_t));
	if (!v->kinds || !v->off || !v->bytes || !v->sorted || !v->ends || !v->nodes || !open)
		goto fail;
	uint32_t o = 0, ns = 0;
	for (int32_t i = 0; i < n_tokens; i++) {
		uint8_t k = kinds ? kinds[i] : KVD_GRAM_TOKEN_TEXT;
		if (k == KVD_GRAM_TOKEN_TEXT && lens[i] == 0)
			k = KVD_GRAM_TOKEN_NEVER;
		v->kinds[i] = k;
		v->off[i] = o;
		if (lens[i])
			memcpy(v->bytes + o, bytes[i], lens[i]);
		o += lens[i];
		if (k == KVD_GRAM_TOKEN_TEXT)
			v->sorted[ns++] = i;
		else if (k == KVD_GRAM_TOKEN_END)
			v->ends[v->n_ends++] = i;
	}
	v->off[n_tokens] = o;
	qsort_r(v->sorted, ns, sizeof(int32_t), cmp_tok, v);
	uint32_t cur = 0, nn = 0;
	const uint8_t *prev = NULL;
	uint32_t prev_len = 0;
	for (uint32_t k = 0; k < ns; k++) {
		int32_t t = v->sorted[k];
		const uint8_t *b = v->bytes + v->off[t];
		uint32_t l = v->off[t + 1] - v->off[t], c = 0;
		while (prev && c < l && c < prev_len && b[c] == prev[c])
			c++;
		for (; cur > c; cur--)
			v->nodes[open[cur]].end = nn;
		for (uint32_t d = c + 1; d <= l; d++) {
			v->nodes[nn] = (struct tnode){.depth = (uint16_t)d, .byte = b[d - 1], .tok_first = 0, .tok_n = 0};
			open[d] = nn++;
		}
		cur = l;
		struct tnode *end = &v->nodes[open[l]];
		if (end->tok_n == 0)
			end->tok_first = k;
		end->tok_n++;
		prev = b;
		prev_len = l;
	}
	for (; cur > 0; cur--)
		v->nodes[open[cur]].end = nn;
	v->n_nodes = nn;
	free(open);
	*ret = v;
	return 0;
fail:
	free(open);
	kvd_gram_vocab_free(v);
	return rc;
}

int kvd_gram_vocab_from_tokenizer(const struct kvd_tokenizer *t, struct kvd_gram_vocab **ret)
{
	int32_t n = kvd_tokenizer_n_vocab(t);
	int rc = -ENOMEM;
	if (n < 1)
		return -EINVAL;
	uint8_t **bytes = calloc((size_t)n, sizeof(*bytes));
	uint32_t *lens = calloc((size_t)n, sizeof(*lens));
	uint8_t *kinds = calloc((size_t)n, 1);
	char buf[VOCAB_MAX_TOKEN_BYTES];
	if (!bytes || !lens || !kinds)
		goto out;
	for (int32_t i = 0; i < n; i++) {
		int type = kvd_tokenizer_token_type(t, i);
		if (kvd_tokenizer_is_eog(t, i)) {
			kinds[i] = KVD_GRAM_TOKEN_END;
			continue;
		}
		if (type == KVD_TOKEN_CONTROL || type == KVD_TOKEN_UNKNOWN || type == KVD_TOKEN_UNUSED) {
			kinds[i] = KVD_GRAM_TOKEN_NEVER;
			continue;
		}
		int l = kvd_token_to_bytes(t, i, 0, buf, sizeof(buf));
		if (l < 0 || (size_t)l > sizeof(buf)) {
			kinds[i] = KVD_GRAM_TOKEN_NEVER;
			continue;
		}
		bytes[i] = malloc((size_t)l + 1);
		if (!bytes[i])
			goto out;
		memcpy(bytes[i], buf, (size_t)l);
		lens[i] = (uint32_t)l;
	}
	rc = kvd_gram_vocab_new(n, (const uint8_t *const *)bytes, lens, kinds, ret);
out:
	if (bytes)
		for (int32_t i = 0; i < n; i++)
			free(bytes[i]);
	free(bytes);
	free(lens);
	free(kinds);
	return rc;
}

struct kvd_gram_vocab *kvd_gram_vocab_free(struct kvd_gram_vocab *v)
{
	if (!v)
		return NULL;
	free(v->kinds);
	free(v->off);
	free(v->bytes);
	free(v->nodes);
	free(v->sorted);
	free(v->ends);
	free(v);
	return NULL;
}

int32_t kvd_gram_vocab_n_tokens(const struct kvd_gram_vocab *v)
{
	return v->n;
}

size_t kvd_gram_vocab_mask_words(const struct kvd_gram_vocab *v)
{
	return ((size_t)v->n + 31) / 32;
}
