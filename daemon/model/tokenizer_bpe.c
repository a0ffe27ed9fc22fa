/*
 * daemon/model/tokenizer_bpe.c — byte-level BPE of one pre-token: its bytes
 * map to the 256 base tokens, then adjacent pairs merge by rank (a binary
 * heap of pairs keyed by (rank, position), the rank looked up in the merge
 * map of (left id, right id)) until no pair has a merge.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "unicode.h"

static inline bool cand_less(struct bpe_cand x, struct bpe_cand y)
{
	return x.rank < y.rank || (x.rank == y.rank && x.left < y.left);
}

DEFINE_CAND_HEAP(bpe, struct bpe_cand, cand_less)

static void bpe_push(struct tok_call *c, int32_t left)
{
	const struct kvd_tokenizer *t = c->t;
	struct bpe_sym *sym = c->sym;
	if (left < 0)
		return;
	int32_t right = sym[left].next;
	if (right < 0 || sym[left].id < 0 || sym[right].id < 0)
		return;
	const struct merge_slot *m = merge_lookup(t, sym[left].id, sym[right].id);
	if (!m)
		return;
	bpe_heap_add(c, (struct bpe_cand){ m->rank, left });
}

/* One pre-token p[0..n) of a byte-level vocabulary. */
int tok_bpe_word(struct tok_call *c, const unsigned char *p, size_t n)
{
	const struct kvd_tokenizer *t = c->t;
	if (n == 0)
		return 0;
	if (n == 1) {
		emit_symbol(c, t->byte_tok[p[0]]);
		return 0;
	}
	if (t->ignore_merges) {
		if (tok_grow((void **)&c->buf, &c->buf_cap, 2 * n, 1) < 0)
			return -ENOMEM;
		size_t l = 0;
		for (size_t i = 0; i < n; i++)
			l += kvd_utf8_encode(byte_to_cp(p[i]), c->buf + l);
		int32_t id = text_lookup(t, c->buf, l);
		if (id >= 0) {
			emit(c, id);
			return 0;
		}
	}
	if (n > INT32_MAX / 4)
		return -E2BIG;
	if (tok_grow(&c->sym, &c->sym_cap, n, sizeof(struct bpe_sym)) < 0 ||
	    tok_grow(&c->heap, &c->heap_cap, 3 * n, sizeof(struct bpe_cand)) < 0)
		return -ENOMEM;
	struct bpe_sym *sym = c->sym;
	for (size_t i = 0; i < n; i++) {
		sym[i].id = t->byte_tok[p[i]];
		sym[i].prev = (int32_t)i - 1;
		sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
	}
	c->heap_n = 0;
	for (size_t i = 0; i + 1 < n; i++)
		bpe_push(c, (int32_t)i);
	while (c->heap_n) {
		struct bpe_cand b = bpe_pop(c);
		int32_t l = b.left, r = sym[l].next;
		/* Stale when either side has changed since the pair was queued. */
		if (sym[l].id < 0 || r < 0 || sym[r].id < 0)
			continue;
		const struct merge_slot *m = merge_lookup(t, sym[l].id, sym[r].id);
		if (!m || m->rank != b.rank)
			continue;
		sym[l].id = m->result;
		sym[l].next = sym[r].next;
		if (sym[r].next >= 0)
			sym[sym[r].next].prev = l;
		sym[r].id = -2;
		bpe_push(c, sym[l].prev);
		bpe_push(c, l);
	}
	for (int32_t i = 0; i >= 0; i = sym[i].next)
		emit_symbol(c, sym[i].id);
	return 0;
}
