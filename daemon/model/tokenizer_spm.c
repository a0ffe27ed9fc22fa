/*
 * daemon/model/tokenizer_spm.c — SentencePiece-style BPE of one raw
 * fragment: spaces become U+2581, characters merge greedily by the score of
 * the token their concatenation forms, and characters left without a token
 * fall back to <0xXX> byte tokens.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

static inline bool spm_better(struct spm_cand x, struct spm_cand y)
{
	return x.score > y.score || (x.score == y.score && x.left < y.left);
}

DEFINE_CAND_HEAP(spm, struct spm_cand, spm_better)

static void spm_push(struct tok_call *c, int32_t left, int32_t right)
{
	const struct kvd_tokenizer *t = c->t;
	struct spm_sym *sym = c->sym;
	if (left < 0 || right < 0)
		return;
	uint32_t len = sym[left].len + sym[right].len;
	int32_t id = text_lookup(t, c->buf + sym[left].off, len);
	if (id < 0)
		return;
	spm_heap_add(c, (struct spm_cand){ t->score[id], left, right, len });
}

static const uint8_t utf8_len_by_nibble[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };

/* One raw fragment of an SPM vocabulary: spaces become U+2581 (and one is
 * prepended when asked), then characters merge by best token score. */
int tok_spm_fragment(struct tok_call *c, const char *s, size_t n, bool prefix_space)
{
	const struct kvd_tokenizer *t = c->t;
	if (n > (SIZE_MAX - 3) / 3 || 3 * n + 3 > INT32_MAX)
		return -E2BIG;
	if (tok_grow((void **)&c->buf, &c->buf_cap, 3 * n + 3, 1) < 0)
		return -ENOMEM;
	size_t l = 0;
	if (prefix_space) {
		memcpy(c->buf, "\xE2\x96\x81", 3);
		l = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(c->buf + l, "\xE2\x96\x81", 3);
			l += 3;
		} else {
			c->buf[l++] = s[i];
		}
	}
	size_t ns = 0;
	for (size_t i = 0; i < l;)
		i += utf8_len_by_nibble[(unsigned char)c->buf[i] >> 4], ns++;
	if (tok_grow(&c->sym, &c->sym_cap, ns, sizeof(struct spm_sym)) < 0 ||
	    tok_grow(&c->heap, &c->heap_cap, 3 * ns, sizeof(struct spm_cand)) < 0)
		return -ENOMEM;
	struct spm_sym *sym = c->sym;
	size_t k = 0;
	for (size_t i = 0; i < l; k++) {
		size_t cl = utf8_len_by_nibble[(unsigned char)c->buf[i] >> 4];
		if (cl > l - i)
			cl = l - i;
		sym[k].off = (uint32_t)i;
		sym[k].len = (uint32_t)cl;
		sym[k].prev = (int32_t)k - 1;
		i += cl;
		sym[k].next = i < l ? (int32_t)k + 1 : -1;
	}
	c->heap_n = 0;
	for (size_t i = 1; i < ns; i++)
		spm_push(c, (int32_t)i - 1, (int32_t)i);
	while (c->heap_n) {
		struct spm_cand b = spm_pop(c);
		struct spm_sym *L = &sym[b.left], *R = &sym[b.right];
		if (L->len == 0 || R->len == 0 || L->next != b.right || L->len + R->len != b.len)
			continue;
		L->len += R->len;
		R->len = 0;
		L->next = R->next;
		if (R->next >= 0)
			sym[R->next].prev = b.left;
		spm_push(c, L->prev, b.left);
		spm_push(c, b.left, L->next);
	}
	for (int32_t i = ns ? 0 : -1; i >= 0; i = sym[i].next) {
		int32_t id = text_lookup(t, c->buf + sym[i].off, sym[i].len);
		if (id >= 0) {
			emit(c, id);
			continue;
		}
		/* A character without a token: its bytes, as byte tokens. */
		for (uint32_t j = 0; j < sym[i].len; j++)
			emit_symbol(c, t->byte_tok[(unsigned char)c->buf[sym[i].off + j]]);
	}
	return 0;
}
