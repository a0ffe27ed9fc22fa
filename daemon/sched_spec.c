/*
 * daemon/sched_spec.c — speculative decoding in the scheduler: a decode
 * grows by a draft (spec.h's prompt lookup), the step scores it with one
 * logits row per token, and verification keeps exactly the tokens plain
 * decoding would have produced.
 *
 * Exactness rests on two things. The arithmetic: a sequence's logits do
 * not depend on how its tokens were batched, so row j of the drafting step
 * is bit for bit what a plain decode would have seen once the first j
 * drafts were accepted. The sampler: each emitted token is drawn by the
 * same call as in plain decoding (the same history, one RNG draw per
 * emitted token, none for a draft that is never reached). The KV of the
 * rejected drafts is cut back (kvmm_seq_truncate) before the pages the
 * accepted tokens filled are published, so the cache, the ledger and the
 * prefix index look as if the tokens had come one step at a time.
 *
 * Requests with a constraint, with logprobs or under a window policy are
 * not drafted for (in this version), nor is a request's last token.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kvmm.h"
#include "log.h"
#include "sched_impl.h"
#include "spec.h"

/* Draft tokens one step carries at most, all sequences together: a wide
 * batch is compute-bound already, and its logits rows (n_vocab floats
 * each) stay bounded. */
#define SCHED_SPEC_STEP_TOKENS 64

void sched_spec_draft(struct kvd_sched *s, struct req *r, struct kvd_engine_item *it, uint32_t left, uint32_t *budget,
		      uint32_t *drafted)
{
	const struct kvd_spec_config *c = &s->cfg.spec;
	uint32_t k = c->draft_tokens, room = r->max_tokens - r->n_generated;

	r->n_draft = 0;
	if (c->mode == KVD_SPEC_OFF || !it->logits || it->n_tokens != 1 || r->gram || r->logprobs || r->windowed ||
	    !r->forked || !r->n_generated || room <= 1 || *budget <= left)
		return;
	if (k > room - 1) /* never past max_tokens, so never past the context */
		k = room - 1;
	if (k > *budget - left) /* one token left for each decode still to plan */
		k = *budget - left;
	if (k > KVD_SPEC_MAX_DRAFT)
		k = KVD_SPEC_MAX_DRAFT;
	if (k > SCHED_SPEC_STEP_TOKENS - *drafted)
		k = SCHED_SPEC_STEP_TOKENS - *drafted;
	if (!k || reserve_toks(r, r->n_toks + k) < 0)
		return;
	it->tokens = r->toks + r->n_computed; /* (reserve_toks may move them) */
	k = kvd_spec_draft(r->toks, r->n_toks, c->min_match, k, r->draft);
	if (!k)
		return;
	memcpy(r->toks + r->n_toks, r->draft, k * sizeof(*r->draft));
	r->n_draft = k;
	it->n_tokens += (int32_t)k;
	it->all_logits = 1;
	it->defer_publish = 1;
	*budget -= k;
	*drafted += k;
}

int sched_spec_strip(struct kvd_sched *s, size_t n_items, uint32_t *budget, uint32_t *drafted)
{
	int any = 0;

	for (size_t i = 0; i < n_items; i++) {
		struct kvd_engine_item *it = &s->items[i];
		if (!it->all_logits)
			continue;
		s->item_req[i]->n_draft = 0;
		*budget += (uint32_t)it->n_tokens - 1;
		it->n_tokens = 1;
		it->all_logits = it->defer_publish = 0;
		it->logits = s->item_req[i]->logits;
		any = 1;
	}
	*drafted = 0;
	return any;
}

void sched_spec_bind(struct kvd_sched *s, size_t n_items, uint32_t *budget, uint32_t *drafted)
{
	size_t rows = 0;

	for (size_t i = 0; i < n_items; i++)
		rows += s->items[i].all_logits ? (size_t)s->items[i].n_tokens : 0;
	if (rows > s->cap_spec_rows) {
		float *l = realloc(s->spec_logits, rows * (size_t)s->n_vocab * sizeof(*l));
		if (!l) {
			sched_spec_strip(s, n_items, budget, drafted); /* plain decodes need no rows */
			return;
		}
		s->spec_logits = l;
		s->cap_spec_rows = rows;
	}
	rows = 0;
	for (size_t i = 0; i < n_items; i++)
		if (s->items[i].all_logits) {
			s->items[i].logits = s->spec_logits + rows * (size_t)s->n_vocab;
			rows += (size_t)s->items[i].n_tokens;
		}
}

void sched_spec_cut_back(struct kvd_sched *s, struct req *r)
{
	r->spec_cut = 0;
	if (!r->has_seq || kvmm_seq_is_swapped(s->kv, r->seq))
		return;
	if (kvmm_seq_truncate(s->kv, r->seq, r->n_computed) < 0 || kvmm_seq_publish(s->kv, r->seq) < 0)
		log_warning("speculative decoding: cutting request %" PRIu64 "'s KV back failed", r->id);
}

void sched_spec_verify(struct kvd_sched *s, struct req *r, const float *rows)
{
	uint32_t k = r->n_draft, base = r->n_toks;

	r->n_draft = 0;
	r->spec_cut = 1;
	s->st.spec_verifies++;
	s->st.spec_drafted += k;
	for (uint32_t j = 0; j <= k; j++) {
		int32_t t;
		memcpy(r->logits, rows + (size_t)j * (size_t)s->n_vocab, (size_t)s->n_vocab * sizeof(*r->logits));
		r->n_computed = base + j; /* as after a plain decode of toks[base + j - 1] */
		int rc = sched_next_token(s, r, &t);
		if (rc < 0) {
			sched_finish(s, r, KVD_FINISH_ERROR, rc);
			return;
		}
		int accepted = j < k && t == r->draft[j];
		s->st.spec_accepted += (uint64_t)accepted;
		if (sched_emit_token(s, r, t))
			return; /* ended: sched_finish cut the KV back */
		if (!accepted)
			break;
	}
	sched_spec_cut_back(s, r);
}

void sched_spec_free(struct kvd_sched *s)
{
	free(s->spec_logits);
	s->spec_logits = NULL;
	if (s->st.spec_verifies)
		log_info("speculative decoding: %" PRIu64 " tokens drafted in %" PRIu64 " steps, %" PRIu64 " accepted",
			 s->st.spec_drafted, s->st.spec_verifies, s->st.spec_accepted);
}
