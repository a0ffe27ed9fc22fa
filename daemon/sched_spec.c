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

/* The draft model, made from the engine's draft engine on first use. */
static struct kvd_spec_drafter *spec_drafter(struct kvd_sched *s)
{
	if (!s->drafter_tried) {
		struct kvd_engine *de = kvd_engine_draft(s->e);
		s->drafter_tried = 1;
		if (de && !(s->drafter = kvd_spec_drafter_new(de)))
			log_warning("speculative decoding: out of memory for the draft model's drafter; not drafting with it");
	}
	return s->drafter;
}

int sched_spec_measured(const struct kvd_sched *s)
{
	return s->cfg.spec.mode == KVD_SPEC_AUTO || s->cfg.spec.mode == KVD_SPEC_DRAFT;
}

/*
 * mode = auto's and draft's threshold for a step of n decodes: the acceptance a draft
 * token needs to pay for itself. It costs draft_ns (measured over drafting
 * steps, the draft model's time included); accepted, it saves its
 * sequence's part of a later decode step: the fixed part shared by the n
 * sequences plus its own per-token part (the plain decode steps' fit of
 * sched_fair.c). So one stream drafts freely, and a wide batch, where
 * the per-token part dominates, only where drafts are nearly always
 * accepted. Before both fits exist: spec.c's own estimate.
 */
static double spec_auto_threshold(const struct kvd_sched *s, uint32_t n)
{
	const struct kvd_spec_cost *c = &s->spec_cost;
	if (c->n_drafting >= KVD_SPEC_COST_MIN_STEPS && c->draft_ns > 0 && s->fit.token_ns > 0)
		return c->draft_ns / (s->fit.fixed_ns / (n ? n : 1) + s->fit.token_ns);
	return kvd_spec_threshold(c, n);
}

void sched_spec_begin(struct kvd_sched *s, uint64_t target_ns)
{
	uint32_t decodes = 0, pending = 0;

	if (s->cfg.spec.mode == KVD_SPEC_DRAFT && !spec_drafter(s) && !s->drafter_warned) {
		s->drafter_warned = 1;
		log_warning("speculative decoding: mode draft, but no draft model is loaded "
			    "([speculative] draft_model takes effect at a restart); not drafting");
	}

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
	/* lookup: the fixed threshold (the operator chose to draft, and a
	 * lookup costs only the rows it adds); auto and draft: the measured
	 * one, the draft model's time included (it runs k steps for every
	 * drafting sequence, so a wide batch would pay more than it saves:
	 * 32 streams ran at 0.46x of off on the fixed threshold) */
	s->spec_threshold = sched_spec_measured(s) ? spec_auto_threshold(s, decodes) : KVD_SPEC_LOOKUP_THRESHOLD;
	/* a fit that has declined every draft for a while is measured again,
	 * a few draft tokens a step (spec.h) */
	if (sched_spec_measured(s) && s->spec_threshold >= 1.0 && kvd_spec_cost_reprobe(&s->spec_cost)) {
		kvd_spec_cost_forget(&s->spec_cost);
		s->spec_threshold = spec_auto_threshold(s, decodes);
	}
	/* max_step_ms: where other streams share the step, drafts get only
	 * what the decodes leave of it (a stream alone waits for nobody but
	 * itself, and its accepted drafts are what its wait buys) */
	if (target_ns && decodes > 1) {
		double left = kvd_step_model_left(&s->model, target_ns), per = sched_spec_token_ns(s);
		double room = per > 0 ? left / per : KVD_STEP_PROBE_CHUNK;
		s->spec_room = room <= 0 ? 0 : room < SCHED_SPEC_STEP_TOKENS ? (uint32_t)room : SCHED_SPEC_STEP_TOKENS;
	}
	if (sched_spec_measured(s) && s->spec_cost.relearning && s->spec_room > KVD_SPEC_REPROBE_TOKENS)
		s->spec_room = KVD_SPEC_REPROBE_TOKENS;
}

double sched_spec_token_ns(const struct kvd_sched *s)
{
	if (sched_spec_measured(s) && s->spec_cost.n_drafting >= KVD_SPEC_COST_MIN_STEPS && s->spec_cost.draft_ns > 0)
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
	kvd_spec_cost_step(&s->spec_cost, drafted, dt_ns + s->spec_draft_ns); /* a draft's cost is both models' */
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
		    kvd_gram_accept_token(r->gram, r->gvocab, sched_gram_scratch(s), &s->spec_gst, t) < 0)
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

	r->n_draft = r->dwant = 0;
	r->dcatch = 0;
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
	uint32_t want = k;
	k = c->mode == KVD_SPEC_DRAFT ? 0 : kvd_spec_draft(r->toks, r->n_toks, c->min_match, k, r->draft);
	if (k && r->gram)
		k = spec_gram_cut(s, r, k);
	if (!k && (c->mode == KVD_SPEC_DRAFT || c->mode == KVD_SPEC_AUTO) && spec_drafter(s)) {
		/* the draft model's turn: k places now (so the step is planned
		 * with them), its tokens at sched_spec_bind; a draft sequence far
		 * behind catches up there first, drafting nothing this step */
		/* a draft sequence that would outgrow its owner's share of the
		 * draft pool is not kept: it would be cut out again and again */
		uint64_t total;
		kvd_spec_drafter_pages(s->drafter, &total, NULL);
		if (kvd_spec_drafter_pages_for(s->drafter, r->n_toks + want) > (s->spec_dshare ? s->spec_dshare : total)) {
			kvd_spec_dseq_drop(s->drafter, &r->dseq);
			return;
		}
		if (kvd_spec_dseq_sync(s->drafter, &r->dseq, r->toks, r->n_toks) > KVD_SPEC_CATCHUP_TOKENS) {
			r->dcatch = 1;
			return;
		}
		k = want;
		for (uint32_t j = 0; j < k; j++)
			r->draft[j] = r->toks[r->n_toks - 1];
		r->dwant = k;
	}
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

/* Item i drafts k tokens fewer than planned (the draft model gave fewer). */
static void spec_shrink(struct kvd_sched *s, size_t i, uint32_t k, uint32_t *budget, uint32_t *drafted)
{
	struct kvd_engine_item *it = &s->items[i];
	struct req *r = s->item_req[i];

	r->n_draft -= k;
	it->n_tokens -= (int32_t)k;
	*budget += k;
	*drafted -= k;
	if (!r->n_draft) { /* a plain decode after all */
		it->all_logits = it->defer_publish = 0;
		it->logits = r->logits;
	}
}

/* Each owner's draft-pool pages (o->dpages); returns how many owners hold
 * some or have an item among s->item_req[0, n_items) that drafts. */
static uint32_t spec_owner_dpages(struct kvd_sched *s, size_t n_items)
{
	uint32_t n = 0;

	for (size_t i = 0; i < s->n_owners; i++)
		s->owners[i].dpages = 0;
	for (size_t i = 0; i < s->n_reqs; i++) {
		const struct req *r = s->reqs[i];
		if (r->state != RS_SESSION && r->dseq.has)
			s->owners[r->oi].dpages += kvd_spec_dseq_pages(s->drafter, &r->dseq);
	}
	for (size_t o = 0; o < s->n_owners; o++) {
		int drafting = s->owners[o].dpages > 0;
		for (size_t i = 0; i < n_items && !drafting; i++)
			drafting = s->item_req[i]->oi == o && (s->item_req[i]->dwant || s->item_req[i]->dcatch);
		n += drafting;
	}
	return n;
}

/* The draft pool is divided by owner as the step's time is: a job that
 * was left out for lack of draft pages while its owner holds less than
 * its share (the pool over the owners drafting) takes pages from the
 * owner furthest over its share, that owner's largest draft sequences
 * first. Draft sequences are a cache, so this costs their owner a
 * catch-up, never an output. */
static void spec_draft_reclaim(struct kvd_sched *s, size_t n, uint32_t n_drafting)
{
	int needy = 0;

	if (n_drafting < 2)
		return;
	uint64_t share = s->spec_dshare;
	for (size_t jn = 0; jn < n && !needy; jn++) {
		const struct req *r = s->item_req[s->djob_item[jn]];
		needy = !s->djobs[jn].n_fed && s->owners[r->oi].dpages < share; /* left out */
	}
	if (!needy)
		return;
	struct sched_owner *q = NULL;
	for (size_t i = 0; i < s->n_owners; i++)
		if (s->owners[i].dpages > share && (!q || s->owners[i].dpages > q->dpages))
			q = &s->owners[i];
	while (q && q->dpages > share) {
		struct req *big = NULL;
		uint32_t big_pages = 0;
		for (size_t i = 0; i < s->n_reqs; i++) {
			struct req *r = s->reqs[i];
			uint32_t p;
			if (r->state == RS_SESSION || !r->dseq.has || &s->owners[r->oi] != q)
				continue;
			p = kvd_spec_dseq_pages(s->drafter, &r->dseq);
			if (!big || p > big_pages) {
				big = r;
				big_pages = p;
			}
		}
		if (!big)
			break;
		kvd_spec_dseq_drop(s->drafter, &big->dseq);
		q->dpages -= big_pages < q->dpages ? big_pages : q->dpages;
		s->st.spec_draft_reclaims++;
	}
}

/* The draft model fills in the drafts planned for it (sched_spec_draft),
 * all drafting requests batched; draft sequences that only catch up ride
 * along. The jobs go in the order of their owners' draft pages, fewest
 * first, so a pool too full for all of them leaves out the owner holding
 * most; then idle draft sequences are dropped and an owner under its
 * share takes pages from the one furthest over it (spec_draft_reclaim).
 * The draft model's time is charged to the owners (their virtual time,
 * as a step's is) and to the requests' ledger records, by the tokens it
 * computed for each. */
static void spec_model_drafts(struct kvd_sched *s, size_t n_items, uint32_t *budget, uint32_t *drafted)
{
	size_t n = 0;
	uint64_t t0 = sched_now_ns(s);

	s->spec_draft_ns = 0;
	for (size_t i = 0; i < n_items; i++) {
		struct req *r = s->item_req[i];
		if ((r->dwant && s->items[i].all_logits) || r->dcatch)
			n++;
	}
	if (!n || !s->drafter)
		goto out;
	if (n > s->cap_djobs) {
		struct kvd_spec_djob *j = realloc(s->djobs, n * sizeof(*j));
		if (!j)
			goto out;
		s->djobs = j;
		size_t *ji = realloc(s->djob_item, n * sizeof(*ji));
		if (!ji)
			goto out;
		s->djob_item = ji;
		s->cap_djobs = n;
	}
	uint32_t n_drafting = spec_owner_dpages(s, n_items);
	uint64_t total;
	kvd_spec_drafter_pages(s->drafter, &total, NULL);
	s->spec_dshare = (uint32_t)(total / (n_drafting ? n_drafting : 1));
	n = 0;
	for (size_t i = 0; i < n_items; i++) {
		struct req *r = s->item_req[i];
		int wants = r->dwant && s->items[i].all_logits;
		if (!wants && !r->dcatch)
			continue;
		/* insertion by the owner's draft pages, stable */
		uint32_t mine = s->owners[r->oi].dpages;
		size_t at = n;
		while (at && s->owners[s->item_req[s->djob_item[at - 1]]->oi].dpages > mine)
			at--;
		memmove(&s->djobs[at + 1], &s->djobs[at], (n - at) * sizeof(*s->djobs));
		memmove(&s->djob_item[at + 1], &s->djob_item[at], (n - at) * sizeof(*s->djob_item));
		s->djobs[at] = (struct kvd_spec_djob){
			.d = &r->dseq, .toks = r->toks, .n_toks = r->n_toks, .k = wants ? r->dwant : 0, .out = r->draft,
		};
		s->djob_item[at] = i;
		n++;
	}
	int left_out = kvd_spec_drafter_run(s->drafter, s->djobs, n, s->ev.is_eog, s->ev.ud);
	uint64_t fed = 0, dt = sched_now_ns(s) - t0;
	for (size_t jn = 0; jn < n; jn++) {
		size_t i = s->djob_item[jn];
		struct req *r = s->item_req[i];
		uint32_t got = left_out < 0 ? 0 : s->djobs[jn].n_out;
		fed += s->djobs[jn].n_fed;
		if (!(r->dwant && s->items[i].all_logits))
			continue;
		if (got && r->gram) {
			uint32_t made = got;
			got = spec_gram_cut(s, r, got);
			if (!got) /* the constraint refused every draft: learnt as a rejected one, to back off */
				kvd_spec_learn(&r->spec, made, 0);
		}
		memcpy(r->toks + r->n_toks, r->draft, got * sizeof(*r->draft));
		if (got < r->dwant)
			spec_shrink(s, i, r->dwant - got, budget, drafted);
	}
	for (size_t jn = 0; fed && jn < n; jn++) {
		struct req *r = s->item_req[s->djob_item[jn]];
		double ns = (double)dt * s->djobs[jn].n_fed / (double)fed;
		s->owners[r->oi].vtime_ns += ns;
		kvmm_seq_add_time(s->kv, r->seq, 0, (uint64_t)ns);
	}
	if (left_out > 0) { /* make room for the next drafts */
		for (size_t i = 0; i < s->n_reqs; i++) {
			struct req *r = s->reqs[i];
			if (r->dseq.has && !r->dwant && !r->dcatch)
				kvd_spec_dseq_drop(s->drafter, &r->dseq);
		}
		spec_owner_dpages(s, 0);
		spec_draft_reclaim(s, n, n_drafting);
	}
out:
	for (size_t i = 0; i < n_items; i++) {
		s->item_req[i]->dwant = 0;
		s->item_req[i]->dcatch = 0;
	}
	s->spec_draft_ns = sched_now_ns(s) - t0;
}

void sched_spec_bind(struct kvd_sched *s, size_t n_items, uint32_t *budget, uint32_t *drafted)
{
	size_t rows = 0;

	spec_model_drafts(s, n_items, budget, drafted);

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

void sched_spec_forget(struct kvd_sched *s, struct req *r)
{
	if (s->drafter)
		kvd_spec_dseq_drop(s->drafter, &r->dseq);
}

void sched_spec_free(struct kvd_sched *s)
{
	for (size_t i = 0; i < s->n_reqs; i++) /* (every request has ended by now) */
		sched_spec_forget(s, s->reqs[i]);
	s->drafter = kvd_spec_drafter_free(s->drafter);
	free(s->djobs);
	free(s->djob_item);
	s->djobs = NULL;
	free(s->spec_logits);
	s->spec_logits = NULL;
	kvd_gram_state_fini(&s->spec_gst);
	if (s->st.spec_verifies)
		log_info("speculative decoding: %" PRIu64 " tokens drafted in %" PRIu64 " steps, %" PRIu64 " accepted",
			 s->st.spec_drafted, s->st.spec_verifies, s->st.spec_accepted);
}
