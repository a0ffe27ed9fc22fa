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
 * A constrained request's draft is cut where its constraint refuses a
 * token (spec_gram_cut); verification draws each token under the
 * constraint and advances its parse state over the emitted tokens only,
 * exactly as plain decoding does. Log-probabilities come from the same
 * logits rows, so they are the plain path's too. Requests under a window
 * policy are not drafted for (in this version), nor is a request's last
 * token.
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

/* Prompt tokens waiting to be read (prefill chunks to come, admissions)
 * from which a step is compute-bound and drafts give way to them. */
#define SCHED_SPEC_PREFILL_TOKENS 64

void sched_spec_begin(struct kvd_sched *s, uint64_t target_ns)
{
	uint32_t decodes = 0, pending = 0;

	for (size_t i = 0; i < s->n_reqs; i++) {
		const struct req *r = s->reqs[i];
		uint32_t n = r->n_toks - r->n_computed;
		if (r->state == RS_RUNNING && n == 1 && r->n_generated)
			decodes++;
		else if (r->state == RS_RUNNING || r->state == RS_WAITING)
			pending += n;
	}
	s->spec_room = SCHED_SPEC_STEP_TOKENS;
	if (pending >= SCHED_SPEC_PREFILL_TOKENS) { /* a long prefill takes the step: compute-bound */
		s->spec_threshold = 1.0;
		return;
	}
	s->spec_threshold = s->cfg.spec.mode == KVD_SPEC_AUTO ? kvd_spec_threshold(&s->spec_cost, decodes)
							      : KVD_SPEC_LOOKUP_THRESHOLD;
	/* max_step_ms: where other streams share the step, drafts get only
	 * what the decodes leave of it (a stream alone waits for nobody but
	 * itself, and its accepted drafts are what its wait buys) */
	if (target_ns && decodes > 1) {
		double left = kvd_step_model_left(&s->model, target_ns), per = sched_spec_token_ns(s);
		double room = per > 0 ? left / per : KVD_STEP_PROBE_CHUNK;
		s->spec_room = room <= 0 ? 0 : room < SCHED_SPEC_STEP_TOKENS ? (uint32_t)room : SCHED_SPEC_STEP_TOKENS;
	}
}

double sched_spec_token_ns(const struct kvd_sched *s)
{
	if (s->cfg.spec.mode == KVD_SPEC_AUTO && s->spec_cost.n_drafting >= KVD_SPEC_COST_MIN_STEPS &&
	    s->spec_cost.draft_ns > 0)
		return s->spec_cost.draft_ns;
	return s->model.a; /* a draft token is scored as a prefill token is (0: not measured) */
}

void sched_spec_step_done(struct kvd_sched *s, size_t n_items, uint64_t dt_ns)
{
	uint32_t drafted = 0;

	for (size_t i = 0; i < n_items; i++) {
		const struct req *r = s->item_req[i];
		const struct kvd_engine_item *it = &s->items[i];
		if (it->all_logits)
			drafted += (uint32_t)it->n_tokens - 1;
		else if (it->n_tokens != 1 || !r->n_generated)
			return; /* prefill in it: not a step of decodes */
	}
	kvd_spec_cost_step(&s->spec_cost, drafted, dt_ns);
}

/* A constrained sequence's draft of k tokens, cut before the first token
 * its constraint refuses there (it could never be accepted: the sampler
 * draws only allowed tokens), before an end-of-generation token, and
 * after a token that completes the constraint. The check runs on a copy
 * of the parse state: r's own advances only over the tokens emitted
 * (sched_emit_token), as without speculation. Returns the tokens kept. */
static uint32_t spec_gram_cut(struct kvd_sched *s, struct req *r, uint32_t k)
{
	if (!sched_gram_scratch(s) || kvd_gram_state_copy(&s->spec_gst, &r->gst) < 0)
		return 0;
	for (uint32_t j = 0; j < k; j++) {
		int32_t t = r->draft[j];
		if ((s->ev.is_eog && s->ev.is_eog(s->ev.ud, t)) ||
		    kvd_gram_accept_token(r->gram, r->gvocab, s->gscratch, &s->spec_gst, t) < 0)
			return j;
		if (!kvd_gram_can_continue(&s->spec_gst))
			return j + 1;
	}
	return k;
}

void sched_spec_draft(struct kvd_sched *s, struct req *r, struct kvd_engine_item *it, uint32_t left, uint32_t *budget,
		      uint32_t *drafted)
{
	const struct kvd_spec_config *c = &s->cfg.spec;
	uint32_t k, room = r->max_tokens - r->n_generated;

	r->n_draft = 0;
	if (c->mode == KVD_SPEC_OFF || r->no_spec || !it->logits || it->n_tokens != 1 || r->windowed || !r->forked ||
	    !r->n_generated || room <= 1 || *budget <= left)
		return;
	k = kvd_spec_next_len(&r->spec, c->draft_tokens, s->spec_threshold);
	if (k > room - 1) /* never past max_tokens, so never past the context */
		k = room - 1;
	if (k > *budget - left) /* one token left for each decode still to plan */
		k = *budget - left;
	if (k > KVD_SPEC_MAX_DRAFT)
		k = KVD_SPEC_MAX_DRAFT;
	if (k > s->spec_room - *drafted) /* s->spec_room >= *drafted */
		k = s->spec_room - *drafted;
	if (!k || reserve_toks(r, r->n_toks + k) < 0)
		return;
	it->tokens = r->toks + r->n_computed; /* (reserve_toks may move them) */
	k = kvd_spec_draft(r->toks, r->n_toks, c->min_match, k, r->draft);
	if (k && r->gram)
		k = spec_gram_cut(s, r, k);
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

/* r's verify step has accepted one more draft token (run of them so far:
 * run, now run + 1). The histograms count the step in its run's bucket
 * all along (from run 0 at the start), so they are right wherever an
 * emitted token ends the request. */
static void spec_accept_one(struct kvd_sched *s, struct req *r, uint32_t run)
{
	s->st.spec_accepted++;
	s->st.spec_runs[kvd_spec_run_bucket(run)]--;
	s->st.spec_runs[kvd_spec_run_bucket(run + 1)]++;
	r->res.spec_accepted_tokens++;
	r->res.spec_runs[kvd_spec_run_bucket(run)]--;
	r->res.spec_runs[kvd_spec_run_bucket(run + 1)]++;
}

void sched_spec_verify(struct kvd_sched *s, struct req *r, const float *rows)
{
	uint32_t k = r->n_draft, base = r->n_toks;

	r->n_draft = 0;
	r->spec_cut = 1;
	s->st.spec_verifies++;
	s->st.spec_drafted += k;
	r->res.spec_verify_steps++;
	r->res.spec_drafted_tokens += k;
	s->st.spec_runs[0]++;
	r->res.spec_runs[0]++;
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
		if (accepted) /* counted first: emitting may end and free r */
			spec_accept_one(s, r, j);
		if (sched_emit_token(s, r, t))
			return; /* ended: sched_finish cut the KV back */
		if (!accepted) { /* j drafts accepted (j == k: all of them) */
			kvd_spec_learn(&r->spec, k, j);
			break;
		}
	}
	sched_spec_cut_back(s, r);
}

void sched_spec_free(struct kvd_sched *s)
{
	free(s->spec_logits);
	s->spec_logits = NULL;
	kvd_gram_state_fini(&s->spec_gst);
	if (s->st.spec_verifies)
		log_info("speculative decoding: %" PRIu64 " tokens drafted in %" PRIu64 " steps, %" PRIu64 " accepted",
			 s->st.spec_drafted, s->st.spec_verifies, s->st.spec_accepted);
}
