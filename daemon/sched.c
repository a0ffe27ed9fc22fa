/*
 * daemon/sched.c — continuous batching over the engine.
 *
 * Prefill and decode are the same operation here: a request holds its
 * tokens (history + prompt + generated) and how many of them are already in
 * its KV (n_computed); each step computes the next chunk toks[n_computed..]
 * of every running request, a decode being a chunk of one. Logits are asked
 * for only when a chunk reaches the end of the known tokens, and then the
 * next token is sampled.
 *
 * Requests live in one array ordered by arrival; "youngest" means latest
 * arrival. Preempted requests keep their place, so they resume before any
 * request that arrived after them (no starvation).
 *
 * A session is a finished request kept in the array (RS_SESSION) with its
 * tokens and, while memory allows, its sequence; its next turn reuses the
 * same object. Under memory pressure idle sessions give up their pages
 * first (least recently used first), before any running request is
 * preempted; their next turn recomputes them.
 *
 * Each finished request's KV ledger (kvmm_seq_finish) is handed to on_done
 * for the per-request ledger log.
 *
 * Parallel samples: a request for n samples runs as one request (sample 0)
 * until its prompt is computed; then, before its first token is sampled,
 * fork_samples() forks its sequence n - 1 times (kvmm_seq_fork: every page
 * shared, a partly filled last page copied by kvmm on the first write into
 * it) and adds the children right after it in the array, with its arrival,
 * each with a copy of the logits and its own sampler. From then on every
 * sample is an ordinary request under the same id (found by pointer, not
 * id, where it matters); cancel ends them all.
 */
#include "sched.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "step_model.h"
#include "kvmm.h"
#include "log.h"
#include "sched_impl.h"

#define SCHED_DEMOTE_RESERVE_DIV 16 /* keep 1/16 of the pool free ahead of a step */
#define SCHED_DEMOTE_BATCH       32 /* pages demoted in one step at most */
#define SCHED_MIN_CHUNK           4 /* prefill beside decodes never shrinks below this */
#define SCHED_FAIR_MIN_CHUNK     64 /* nor, for the owner furthest behind, below this */

uint64_t sched_now_ns(const struct kvd_sched *s)
{
	struct timespec ts;

	if (s->ev.now_ns)
		return s->ev.now_ns(s->ev.ud);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int kvd_sched_create(const struct kvd_sched_config *cfg, struct kvd_engine *e, const struct kvd_sched_events *ev,
		     struct kvd_sched **ret)
{
	struct kvd_sched *s;

	if (!cfg->max_num_seqs || !cfg->max_tokens_per_step || !cfg->max_model_len)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	if (!s->cfg.max_waiting)
		s->cfg.max_waiting = 4096;
	s->e = e;
	s->kv = kvd_engine_kvmm(e);
	s->ev = *ev;
	s->n_vocab = kvd_engine_n_vocab(e);
	s->block_size = kvd_engine_kv_layout(e)->block_size;
	kvmm_set_swap_error_handler(s->kv, sched_on_swap_error, s);
	*ret = s;
	return 0;
}

/* Pages a sequence of `tokens` tokens holds at most. Where steps release
 * the pages windowed layers are done with (kvd_engine_step), that is one
 * window and a step's tokens of whole pages, and the packed pages of the
 * rest; else every page. */
uint64_t sched_pages_bound(const struct kvd_sched *s, uint64_t tokens, int windowed)
{
	uint64_t all = (tokens + s->block_size - 1) / s->block_size, live, rel;
	uint32_t slots = 0, win = 0;

	if (windowed || !kvd_engine_release_info(s->e, &slots, &win))
		return all;
	live = ((uint64_t)win + s->cfg.max_tokens_per_step + 2 * s->block_size - 1) / s->block_size + 1;
	if (live >= all)
		return all;
	rel = all - live;
	return live + (slots ? (rel + slots - 1) / slots : 0);
}

void req_gram_release(struct req *r)
{
	r->gram = kvd_grammar_unref(r->gram);
	r->gvocab = NULL;
	kvd_gram_state_fini(&r->gst);
}

struct kvd_gram_scratch *sched_gram_scratch(struct kvd_sched *s)
{
	if (!s->lane.gs)
		s->lane.gs = kvd_gram_scratch_new();
	return s->lane.gs;
}

void sched_lane_fini(struct sched_lane *L)
{
	kvd_gram_scratch_free(L->gs);
	free(L->mask);
	*L = (struct sched_lane){ 0 };
}

void req_free(struct req *r)
{
	if (!r)
		return;
	req_gram_release(r);
	kvd_sampler_free(r->sampler);
	free(r->toks);
	free(r->logits);
	free(r);
}

static int find_ptr(const struct kvd_sched *s, const struct req *r, size_t *ret_i)
{
	for (size_t i = 0; i < s->n_reqs; i++)
		if (s->reqs[i] == r) {
			*ret_i = i;
			return 1;
		}
	return 0;
}

void sched_drop_seq(struct kvd_sched *s, struct req *r)
{
	sched_spec_forget(s, r);
	if (r->has_seq) {
		kvmm_seq_free(s->kv, r->seq);
		r->has_seq = 0;
	}
	r->n_computed = r->n_dropped = 0;
}

void sched_remove_at(struct kvd_sched *s, size_t i)
{
	memmove(&s->reqs[i], &s->reqs[i + 1], (s->n_reqs - i - 1) * sizeof(*s->reqs));
	s->n_reqs--;
}

struct req *sched_find(const struct kvd_sched *s, uint64_t id, size_t *ret_i)
{
	for (size_t i = 0; i < s->n_reqs; i++)
		if (s->reqs[i]->id == id && s->reqs[i]->state != RS_SESSION) {
			if (ret_i)
				*ret_i = i;
			return s->reqs[i];
		}
	return NULL;
}

struct req *sched_find_session(const struct kvd_sched *s, uint64_t session, size_t *ret_i)
{
	for (size_t i = 0; i < s->n_reqs; i++)
		if (s->reqs[i]->session == session) {
			if (ret_i)
				*ret_i = i;
			return s->reqs[i];
		}
	return NULL;
}

/* The request is over: report, then keep its KV as a session or drop it. */
void sched_finish(struct kvd_sched *s, struct req *r, enum kvd_finish why, int error)
{
	size_t i;
	uint64_t t = sched_now_ns(s);
	struct kvmm_seq_record rec;

	if (r->spec_cut) /* ended while its drafts were verified */
		sched_spec_cut_back(s, r);
	sched_spec_forget(s, r);
	r->res.sample = r->sample;
	r->res.n_samples = r->n_samples;
	r->res.finish = why;
	r->res.error = error;
	r->res.context_dropped_tokens = r->n_dropped; /* what the KV no longer holds, replays counted once */
	r->res.generated_tokens = r->n_generated;
	if (r->t_first)
		r->res.decode_ns = r->t_last - r->t_first;
	if (r->t_admit)
		r->res.queue_ns = r->t_admit - r->t_submit;
	s->st.requests_done++;
	req_gram_release(r); /* a constraint covers one request (a session's turn) */
	if (find_ptr(s, r, &i))
		sched_remove_at(s, i);
	r->res.ledger = NULL;
	if (r->session && (why == KVD_FINISH_ERROR || why == KVD_FINISH_CANCELLED) && r->n_history > 0) {
		/* roll the session back to the end of its previous turn: its KV
		 * (which holds part of this turn) goes, its tokens stay, and the
		 * next turn recomputes them, through the prefix cache mostly */
		if (r->has_seq && !kvmm_seq_is_swapped(s->kv, r->seq) && kvmm_seq_finish(s->kv, r->seq, &rec) == 0) {
			r->has_seq = 0;
			r->res.ledger = &rec;
		}
		sched_drop_seq(s, r);
		r->n_toks = r->n_history;
		r->state = RS_SESSION;
		r->t_used = t;
		free(r->logits);
		r->logits = NULL;
		r->sampler = kvd_sampler_free(r->sampler);
		s->reqs[s->n_reqs++] = r;
		if (s->ev.on_done)
			s->ev.on_done(s->ev.ud, r->id, &r->res);
		r->res.ledger = NULL;
		return;
	}
	if (r->session && why != KVD_FINISH_ERROR && why != KVD_FINISH_CANCELLED && r->state == RS_RUNNING &&
	    r->has_seq) {
		/* keep it: the last sampled token is not computed yet */
		r->state = RS_SESSION;
		r->t_used = t;
		free(r->logits);
		r->logits = NULL;
		r->sampler = kvd_sampler_free(r->sampler);
		s->reqs[s->n_reqs++] = r; /* capacity: it was just removed */
		if (kvmm_seq_ledger(s->kv, r->seq, &rec) == 0)
			r->res.ledger = &rec;
		if (s->ev.on_done)
			s->ev.on_done(s->ev.ud, r->id, &r->res);
		r->res.ledger = NULL;
		return;
	}
	if (r->has_seq && !kvmm_seq_is_swapped(s->kv, r->seq) && kvmm_seq_finish(s->kv, r->seq, &rec) == 0) {
		r->has_seq = 0;
		r->res.ledger = &rec;
	}
	sched_drop_seq(s, r);
	if (s->ev.on_done)
		s->ev.on_done(s->ev.ud, r->id, &r->res);
	r->res.ledger = NULL;
	done_unforked(&s->ev, r);
	req_free(r);
}

struct kvd_sched *kvd_sched_destroy(struct kvd_sched *s)
{
	if (!s)
		return NULL;
	kvmm_set_swap_error_handler(s->kv, NULL, NULL);
	while (s->n_reqs) {
		struct req *r = s->reqs[s->n_reqs - 1];
		if (r->state == RS_SESSION) {
			s->n_reqs--;
			sched_drop_seq(s, r);
			req_free(r);
		} else {
			sched_finish(s, r, KVD_FINISH_CANCELLED, 0);
		}
	}
	free(s->reqs);
	free(s->items);
	free(s->item_req);
	free(s->cand);
	sched_fair_free(s);
	sched_draw_fini(s);
	sched_lane_fini(&s->lane);
	sched_spec_free(s);
	free(s);
	return NULL;
}

int reserve_toks(struct req *r, uint32_t n)
{
	if (n <= r->cap_toks)
		return 0;
	uint32_t cap = r->cap_toks ? r->cap_toks : 64;
	while (cap < n)
		cap *= 2;
	int32_t *t = realloc(r->toks, (size_t)cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	r->toks = t;
	r->cap_toks = cap;
	return 0;
}

static int ensure_items(struct kvd_sched *s, size_t n)
{
	if (n <= s->cap_items)
		return 0;
	struct kvd_engine_item *it = realloc(s->items, n * sizeof(*it));
	if (!it)
		return -ENOMEM;
	s->items = it;
	struct req **ir = realloc(s->item_req, n * sizeof(*ir));
	if (!ir)
		return -ENOMEM;
	s->item_req = ir;
	struct req **cd = realloc(s->cand, n * sizeof(*cd));
	if (!cd)
		return -ENOMEM;
	s->cand = cd;
	s->cap_items = n;
	return 0;
}

/* Give up a running request's pages so others can proceed: swap it out
 * when there is a swap file, else drop its KV to recompute it later. */
static void preempt(struct kvd_sched *s, struct req *r)
{
	s->st.preemptions++;
	r->res.preemptions++;
	sched_spec_forget(s, r);
	if (r->has_seq && kvmm_seq_swap_out(s->kv, r->seq) == 0) {
		r->state = RS_SWAPPED;
		r->res.swaps++;
		return;
	}
	sched_count_fallback(s, r);
	r->res.recompute_tokens += r->n_computed;
	sched_drop_seq(s, r);
	r->state = RS_WAITING;
}

/* Undo an admission made while building this step. */
static void unadmit(struct kvd_sched *s, struct req *r)
{
	sched_drop_seq(s, r);
	r->state = RS_WAITING;
	r->admitted_now = 0;
	r->t_admit = 0;
	r->res.cached_tokens = 0;
	r->res.adopted_tokens = r->res.adopted_pages = 0;
}

/* An owner that holds its share of sequences or pages while another
 * owner waits gets no more until that one is served (sched_fair.c). */
static int owner_capped(const struct kvd_sched *s, const struct sched_owner *o, uint32_t more_seqs)
{
	uint32_t seqs = sched_fair_seq_share(s), pages = sched_fair_page_share(s);
	int hungry = 0; /* another owner waits, under its own share */

	if (s->n_owners <= 1)
		return 0;
	for (size_t i = 0; i < s->n_owners; i++) {
		const struct sched_owner *q = &s->owners[i];
		hungry |= q != o && q->waiting && q->running < seqs && q->pages < pages;
	}
	return hungry && (o->running + more_seqs > seqs || o->pages >= pages);
}

/* Try to bring swapped requests back, each owner's oldest first, owners
 * in fair order, while the pool has their pages plus a margin for the
 * running ones to keep growing. */
static void resume_swapped(struct kvd_sched *s, uint32_t n_running)
{
	uint32_t stopped = UINT32_MAX; /* the owner whose next swapped one did not fit */

	for (size_t i = 0; i < s->n_order; i++) {
		struct req *r = s->order[i].r;
		struct sched_owner *o = &s->owners[r->oi];
		if (r->state != RS_SWAPPED || r->oi == stopped)
			continue;
		if (s->n_owners > 1 && (o->throttled || owner_capped(s, o, 1) || n_running + 1 > s->cfg.max_num_seqs)) {
			stopped = r->oi; /* nobody of its younger ones jumps ahead either */
			continue;
		}
		uint32_t held = kvmm_seq_pages_held(s->kv, r->seq);
		uint32_t need = held + n_running + 1; /* what swap-in maps */
		if (need > kvmm_n_pages(s->kv))
			need = kvmm_n_pages(s->kv); /* alone it always fits (checked at submit) */
		if (kvmm_available_pages(s->kv) < need)
			return; /* the pool is short: nobody younger jumps ahead */
		int rc = kvmm_seq_swap_in(s->kv, r->seq);
		if (rc == -ENOMEM)
			return;
		if (rc < 0) {
			/* its swapped K/V is lost: recompute from the tokens */
			sched_count_fallback(s, r);
			sched_drop_seq(s, r);
			r->state = RS_WAITING;
			continue;
		}
		r->state = RS_RUNNING;
		o->waiting--;
		o->running++;
		o->pages += held;
		n_running++;
	}
}

int sched_draw_token(struct kvd_sched *s, struct req *r, struct sched_lane *L, int32_t *ret, int *ret_fast)
{
	if (!r->gram) {
		*ret = kvd_sampler_sample(r->sampler, r->logits, r->toks, r->n_toks);
		return 0;
	}
	size_t words = ((size_t)s->n_vocab + 31) / 32, vw = kvd_gram_vocab_mask_words(r->gvocab);
	if (vw > words)
		words = vw;
	if (words > L->words) {
		uint32_t *m = realloc(L->mask, words * sizeof(*m));
		if (!m)
			return -ENOMEM;
		L->mask = m;
		L->words = words;
	}
	if (!L->gs && !(L->gs = kvd_gram_scratch_new()))
		return -ENOMEM;
	*ret_fast = 0;
	return kvd_gram_sample(r->sampler, r->logits, r->toks, r->n_toks, r->gram, r->gvocab, L->gs, &r->gst, L->mask,
			       L->words, ret, ret_fast);
}

/* Count a constrained draw: checked only, or masked for. */
static void count_draw(struct kvd_sched *s, const struct req *r, int fast)
{
	if (r->gram)
		fast ? s->st.gram_checked++ : s->st.gram_masked++;
}

int sched_next_token(struct kvd_sched *s, struct req *r, int32_t *ret)
{
	int fast = 0;
	int rc = sched_draw_token(s, r, &s->lane, ret, &fast);
	if (rc == 0)
		count_draw(s, r, fast);
	return rc;
}

int sched_emit_token(struct kvd_sched *s, struct req *r, int32_t t)
{
	int rc;
	int eog = s->ev.is_eog && s->ev.is_eog(s->ev.ud, t);
	int complete = 0; /* the constraint is complete and nothing can follow */
	if (r->gram && !eog) {
		rc = kvd_gram_accept_token(r->gram, r->gvocab, sched_gram_scratch(s), &r->gst, t);
		if (rc < 0) { /* the mask and the matcher disagree, or memory */
			sched_finish(s, r, KVD_FINISH_ERROR, rc == -ENOENT ? -EPROTO : rc);
			return 1;
		}
		complete = !kvd_gram_can_continue(&r->gst);
	}
	struct kvd_logprobs lp;
	int with_lp = r->logprobs && kvd_logprobs_compute(r->logits, s->n_vocab, t, r->top_logprobs, &lp) == 0;
	uint64_t now = sched_now_ns(s);
	enum kvd_finish ending = KVD_FINISH_NONE;
	enum kvd_token_verdict verdict = KVD_TOKEN_CONTINUE;

	r->toks[r->n_toks++] = t;
	r->n_generated++;
	s->st.tokens_generated++;
	if (!r->t_first) {
		r->t_first = now;
		r->res.ttft_ns = now - r->t_submit;
	} else {
		kvd_hist_add(&s->st.itl, now - r->t_last);
	}
	r->t_last = now;
	if (eog && (!r->ignore_eos || r->gram))
		ending = KVD_FINISH_EOS;
	else if (complete)
		ending = KVD_FINISH_EOS; /* on a text token: its text is the output's end */
	else if (r->n_generated == r->max_tokens)
		ending = KVD_FINISH_LENGTH;
	if (s->ev.on_sample_token) {
		struct kvd_token_event ev = { r->sample, t, ending, with_lp ? &lp : NULL };
		verdict = s->ev.on_sample_token(s->ev.ud, r->id, &ev);
	} else if (s->ev.on_token) {
		verdict = s->ev.on_token(s->ev.ud, r->id, t, ending);
	}
	if (ending == KVD_FINISH_EOS)
		sched_finish(s, r, KVD_FINISH_EOS, 0);
	else if (verdict == KVD_TOKEN_STOP)
		sched_finish(s, r, KVD_FINISH_STOP, 0);
	else if (ending == KVD_FINISH_LENGTH)
		sched_finish(s, r, KVD_FINISH_LENGTH, 0);
	else
		return 0;
	return 1;
}

/* Sample and report one new token; end the request when it ends here. */
static void emit(struct kvd_sched *s, struct req *r)
{
	int32_t t;
	int rc;
	if (r->drawn) { /* drawn with the step's others (sched_draw_step) */
		r->drawn = 0;
		t = r->drawn_tok;
		if ((rc = r->drawn_rc) == 0)
			count_draw(s, r, r->drawn_fast);
	} else {
		rc = sched_next_token(s, r, &t);
	}
	if (rc < 0) {
		sched_finish(s, r, KVD_FINISH_ERROR, rc);
		return;
	}
	(void)sched_emit_token(s, r, t);
}

/* p's prompt is computed and its logits are in: fork the other samples
 * (sched_samples.c), right after p in the array, then every sample has
 * its first token. */
static void start_samples(struct kvd_sched *s, struct req *p)
{
	struct req *kids[KVD_MAX_SAMPLES];
	size_t at;

	if (s->n_reqs + p->n_samples > s->cap_reqs) {
		size_t cap = s->cap_reqs;
		while (cap < s->n_reqs + p->n_samples)
			cap *= 2;
		struct req **nr = realloc(s->reqs, cap * sizeof(*nr));
		if (nr) {
			s->reqs = nr;
			s->cap_reqs = cap;
		}
	}
	struct sched_fork x = { s->kv, s->n_vocab, &s->ev, &s->st };
	uint32_t n = fork_samples(&x, p, kids, s->cap_reqs - s->n_reqs);
	if (find_ptr(s, p, &at)) {
		at++;
		memmove(&s->reqs[at + n], &s->reqs[at], (s->n_reqs - at) * sizeof(*s->reqs));
		memcpy(&s->reqs[at], kids, n * sizeof(*kids));
		s->n_reqs += n;
	}
	emit(s, p); /* may finish and free p */
	for (uint32_t i = 0; i < n; i++)
		if (kids[i]->state == RS_RUNNING)
			emit(s, kids[i]);
}

/*
 * Demotion ahead of pressure, like a kernel's low watermark: the allocation
 * paths reclaim cached prefix pages by dropping them when the free list runs
 * dry, so before a step that would eat into the last free pages the coldest
 * cached pages are written to the swap file instead (kvmm_cache_demote) and
 * freed; they stay in the prefix index and a later hit reads them back
 * rather than recomputing them. The step's own need plus a reserve of
 * 1/SCHED_DEMOTE_RESERVE_DIV of the pool is kept free; at most
 * SCHED_DEMOTE_BATCH pages a step bound the I/O one step waits for. Without
 * a swap file, or with nothing cached, it does nothing. An I/O error leaves
 * the pages cached in memory (kvmm counts it); the step goes on.
 */
static void demote_ahead(struct kvd_sched *s, uint32_t need)
{
	struct kvmm_stats st;
	uint32_t got = 0;

	kvmm_get_stats(s->kv, &st);
	if (!st.swap_slots || !st.pages_cached)
		return;
	uint32_t reserve = st.pages_total / SCHED_DEMOTE_RESERVE_DIV;
	uint32_t want = need + (reserve ? reserve : 1);
	if (st.pages_free >= want)
		return;
	want -= st.pages_free;
	if (want > SCHED_DEMOTE_BATCH)
		want = SCHED_DEMOTE_BATCH;
	if (kvmm_cache_demote(s->kv, want, &got) < 0)
		s->st.demote_errors++;
	else if (got)
		s->demote_failing = 0;
	s->st.pages_demoted += got;
}

/* The step being built: its items and what is left of its budgets. */
struct step_plan {
	size_t n_items;
	uint32_t budget;         /* tokens */
	uint32_t n_running;      /* sequences in the batch (slots) */
	int timed;               /* decodes are in it and max_step_ms bounds it */
	double left_ns;          /* what its prefill chunks may still cost, when timed */
	uint32_t prefill_taken;
	int starved;             /* a window waits for copies of shared pages */
	int mem_closed;          /* memory kept a request out (kvmm's slots, a give-up): for the ledger */
	int admit_closed;        /* no more admissions: sequences, time or kvmm's slots */
	uint32_t drafted;        /* draft tokens in it (speculative decoding) */
};

/* Take r's next chunk (phase 0: a decode, 1: a running request's prefill,
 * 2: one just admitted) into the step, within the budgets. */
static void plan_chunk(struct kvd_sched *s, struct step_plan *pl, struct req *r, int phase)
{
	uint32_t pending = r->n_toks - r->n_computed;
	uint32_t take = pending < pl->budget ? pending : pl->budget, dropped = 0;

	if (r->windowed) { /* drop what leaves the window; stop at its next edge */
		int wr = kvd_engine_window_prepare(s->e, r->seq, &r->w, take, &take, &dropped);
		if (wr < 0) { /* -ENOMEM: try again next step; else it fails below */
			r->res.error = wr == -ENOMEM ? 0 : wr;
			pl->starved = pl->starved || wr == -ENOMEM;
			return;
		}
		r->n_dropped += dropped;
	}
	if (pl->timed && phase > 0) {
		uint32_t cap = kvd_step_model_cap(&s->model, pl->left_ns, r->n_computed, take);
		/* the owner furthest behind reads a short prompt in one step,
		 * whatever the others' decodes cost */
		uint32_t least = s->n_owners > 1 && r->oi == 0 ? SCHED_FAIR_MIN_CHUNK : SCHED_MIN_CHUNK;
		if (pl->prefill_taken + cap < least) /* never below a minimum chunk */
			cap = least - pl->prefill_taken;
		if (cap == 0 && phase == 1)
			return;
		if (cap == 0)
			cap = 1; /* admitted this step: at least one token */
		take = cap < take ? cap : take;
		pl->left_ns -= kvd_step_model_charge(&s->model, pl->left_ns, take, r->n_computed);
		pl->prefill_taken += take;
	}
	s->items[pl->n_items] = (struct kvd_engine_item){
		.seq = r->seq,
		.tokens = r->toks + r->n_computed,
		.n_tokens = (int32_t)take,
		.logits = take == pending ? r->logits : NULL,
		.keep_local = r->windowed, /* its policy drops pages itself */
	};
	s->item_req[pl->n_items++] = r;
	pl->budget -= take;
}

/* Phase 0: one decode for each running request that has a token to
 * compute, owners in fair order (a throttled owner's sit this step out),
 * with a draft where speculation is on. */
static void plan_decodes(struct kvd_sched *s, struct step_plan *pl, uint64_t target_ns)
{
	if (s->cfg.spec.mode != KVD_SPEC_OFF)
		sched_spec_begin(s, target_ns);
	for (size_t i = 0; i < s->n_order && pl->budget > 0; i++) {
		struct req *r = s->order[i].r;
		if (r->state == RS_RUNNING && r->n_toks - r->n_computed == 1 && !s->owners[r->oi].throttled) {
			size_t before = pl->n_items;
			plan_chunk(s, pl, r, 0);
			if (pl->n_items > before && s->cfg.spec.mode != KVD_SPEC_OFF)
				sched_spec_draft(s, r, &s->items[before], (uint32_t)(s->n_order - i - 1), &pl->budget,
						 &pl->drafted);
		}
	}
}

/* Phase 1, for one owner's requests order[b, e): the next prefill chunk
 * of each running request still reading its prompt. */
static void plan_prefills(struct kvd_sched *s, struct step_plan *pl, size_t b, size_t e)
{
	for (size_t i = b; i < e && pl->budget > 0; i++) {
		struct req *r = s->order[i].r;
		if (r->state == RS_RUNNING && r->n_toks - r->n_computed != 1 && !s->owners[r->oi].throttled)
			plan_chunk(s, pl, r, 1);
	}
}

/* Admit r: a sequence, and whatever the prefix cache has. 0, or -ENOSPC
 * when kvmm has no sequence for it. */
static int admit(struct kvd_sched *s, struct req *r)
{
	if (kvmm_seq_new(s->kv, &r->seq) < 0 && (!sched_reclaim_session(s) || kvmm_seq_new(s->kv, &r->seq) < 0))
		return -ENOSPC;
	r->has_seq = 1;
	r->n_computed = 0;
	uint32_t hit = 0, n_look = r->n_toks; /* windows: what is there before any drop */
	if (r->windowed && n_look > kvd_window_cap(&r->w, s->block_size))
		n_look = kvd_window_cap(&r->w, s->block_size);
	s->attaching = r; /* a failed promotion is charged to r */
	kvmm_seq_set_scope(s->kv, r->seq, r->cache_scope);
	/* the evictor the ledger names: a uid (a tenant's owner is no uid) */
	kvmm_seq_set_owner(s->kv, r->seq, r->owner >> 32 ? KVMM_OWNER_NONE : (uint32_t)r->owner);
	int ar = kvmm_prefix_attach(s->kv, r->seq, r->toks, n_look, &hit);
	s->attaching = NULL;
	if (ar == 0)
		r->n_computed = hit;
	if (!r->res.preemptions) {
		struct kvmm_seq_record rec;

		r->res.cached_tokens = hit;
		r->res.adopted_tokens = r->res.adopted_pages = 0;
		if (ar == 0 && kvmm_seq_ledger(s->kv, r->seq, &rec) == 0) {
			r->res.adopted_tokens = rec.adopted_tokens;
			r->res.adopted_pages = rec.adopted_pages;
		}
	}
	r->state = RS_RUNNING;
	r->admitted_now = 1;
	r->t_admit = sched_now_ns(s);
	kvmm_seq_set_prompt_tokens(s->kv, r->seq, r->n_history + r->n_prompt);
	return 0;
}

/* Phase 2, for one owner's requests order[b, e): admit waiting requests,
 * its best first, while sequences, the step's time and the owner's share
 * allow; one of its swapped requests blocks its later admissions. */
static void plan_admissions(struct kvd_sched *s, struct step_plan *pl, size_t b, size_t e)
{
	int blocked = 0;

	for (size_t i = b; i < e && pl->budget > 0 && !pl->admit_closed; i++) {
		struct req *r = s->order[i].r;
		struct sched_owner *o = &s->owners[r->oi];
		if (r->state == RS_SWAPPED)
			blocked = 1;
		if (r->state != RS_WAITING || blocked)
			continue;
		if (o->throttled || owner_capped(s, o, slots(r)))
			return;
		if (pl->n_running >= s->cfg.max_num_seqs ||
		    (pl->n_running && pl->n_running + slots(r) > s->cfg.max_num_seqs) ||
		    (pl->timed && pl->left_ns <= 0 && pl->prefill_taken >= SCHED_MIN_CHUNK)) { /* admit next step */
			pl->admit_closed = 1;
			return;
		}
		if (admit(s, r) < 0) {
			pl->admit_closed = pl->mem_closed = 1;
			return;
		}
		pl->n_running += slots(r);
		o->running += slots(r);
		o->waiting--;
		plan_chunk(s, pl, r, 2);
	}
}

/* Give up r (resident) to make room: counted off its owner's share. */
static void give_up(struct kvd_sched *s, struct req *r)
{
	struct sched_owner *o = &s->owners[r->oi];
	uint32_t held = r->has_seq ? kvmm_seq_pages_held(s->kv, r->seq) : 0;

	o->pages -= held < o->pages ? held : o->pages;
	o->running -= slots(r) < o->running ? slots(r) : o->running;
	o->waiting++;
	if (r->admitted_now)
		unadmit(s, r);
	else
		preempt(s, r);
}

/* Before the step: an owner under its share of sequences with a request
 * waiting gets room, taken from the owner furthest over its share, when
 * max_num_seqs is what keeps it out (pages are made room for when the
 * step is fitted). */
static void make_room_for_share(struct kvd_sched *s, uint32_t *n_running)
{
	uint32_t share = sched_fair_seq_share(s);
	uint32_t done = UINT32_MAX;

	if (s->n_owners <= 1)
		return;
	for (size_t i = 0; i < s->n_order; i++) {
		struct req *r = s->order[i].r;
		struct sched_owner *o = &s->owners[r->oi];
		if (r->oi == done || r->state == RS_RUNNING)
			continue;
		done = r->oi; /* its first waiting or swapped request speaks for it */
		if (o->running + slots(r) > share)
			continue;
		while (*n_running + slots(r) > s->cfg.max_num_seqs) {
			size_t n = 0;
			for (size_t k = 0; k < s->n_order; k++) {
				struct req *c = s->order[k].r;
				if (c->state == RS_RUNNING && s->owners[c->oi].running > share)
					s->cand[n++] = c;
			}
			if (!n)
				break;
			struct req *v = s->cand[sched_fair_victim(s, s->cand, n, 1)];
			*n_running -= slots(v);
			give_up(s, v);
		}
	}
}

/* Build the step: decodes, then each owner's prefill chunks and
 * admissions, owners in fair order. */
static void plan_step(struct kvd_sched *s, struct step_plan *pl)
{
	/* with n owners contending, a step is 1/n of the bound: the others'
	 * streams ride along in more, shorter steps */
	uint64_t target = (uint64_t)s->cfg.max_step_ms * 1000000u / (s->n_owners > 1 ? s->n_owners : 1);
	plan_decodes(s, pl, target);
	if (pl->n_items && s->cfg.max_step_ms) {
		pl->timed = 1; /* the drafts' time first: they are the decodes' */
		pl->left_ns = kvd_step_model_left(&s->model, target) - pl->drafted * sched_spec_token_ns(s);
	}
	for (size_t b = 0, e; b < s->n_order && pl->budget > 0; b = e) {
		for (e = b + 1; e < s->n_order && s->order[e].r->oi == s->order[b].r->oi; e++)
			;
		plan_prefills(s, pl, b, e);
		plan_admissions(s, pl, b, e);
	}
}

/* The step does not fit in the pool: give up a request and say whether
 * the step goes on (1), is abandoned (0) or failed (-ENOMEM, a request
 * alone too big for the pool). One owner: the youngest item; several: the
 * resident request of the owner furthest over its page share. */
static int fit_give_up(struct kvd_sched *s, struct step_plan *pl)
{
	size_t v = 0, n = 0;
	struct req *victim;

	pl->mem_closed = 1;
	if (s->n_owners <= 1) {
		for (size_t i = 1; i < pl->n_items; i++)
			if (s->item_req[i]->arrival > s->item_req[v]->arrival)
				v = i;
		victim = s->item_req[v];
	} else {
		for (size_t i = 0; i < s->n_reqs; i++)
			if (s->reqs[i]->state == RS_RUNNING)
				s->cand[n++] = s->reqs[i];
		victim = s->cand[sched_fair_victim(s, s->cand, n, 0)];
		for (v = 0; v < pl->n_items && s->item_req[v] != victim; v++)
			;
	}
	if (v < pl->n_items && pl->n_items == 1 && !victim->admitted_now) {
		/* alone and still too big for the whole pool */
		uint32_t resident = 0;
		for (size_t i = 0; i < s->n_reqs; i++)
			resident += s->reqs[i]->state == RS_RUNNING;
		if (resident <= 1) {
			sched_finish(s, victim, KVD_FINISH_ERROR, -ENOMEM);
			return -ENOMEM;
		}
	}
	give_up(s, victim);
	if (v == pl->n_items)
		return 1; /* not in the step: its pages are free now */
	s->items[v] = s->items[pl->n_items - 1];
	s->item_req[v] = s->item_req[pl->n_items - 1];
	pl->n_items--;
	if (pl->n_items)
		return 1;
	/* nothing fits: preempt the youngest resident request (one owner),
	 * the fairest victim (several) */
	struct req *y = NULL;
	n = 0;
	for (size_t i = 0; i < s->n_reqs; i++)
		if (s->reqs[i]->state == RS_RUNNING) {
			s->cand[n++] = s->reqs[i];
			if (!y || s->reqs[i]->arrival > y->arrival)
				y = s->reqs[i];
		}
	if (s->n_owners > 1 && n)
		y = s->cand[sched_fair_victim(s, s->cand, n, 0)];
	if (y)
		give_up(s, y);
	return 0;
}

int kvd_sched_step(struct kvd_sched *s)
{
	struct step_plan pl = { .budget = s->cfg.max_tokens_per_step };
	uint32_t n_running = 0;
	int rc;

	rc = ensure_items(s, s->n_reqs + 1);
	if (rc < 0)
		return rc;
	rc = sched_fair_begin(s);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < s->n_reqs; i++)
		n_running += s->reqs[i]->state == RS_RUNNING;
	resume_swapped(s, n_running);
	for (size_t i = 0; i < s->n_reqs; i++)
		pl.n_running += s->reqs[i]->state == RS_RUNNING ? slots(s->reqs[i]) : 0;
	make_room_for_share(s, &pl.n_running);
	plan_step(s, &pl);
	if (!pl.n_items && !pl.starved) {
		int any = 0;
		for (size_t i = 0; i < s->n_owners; i++)
			any |= s->owners[i].throttled;
		if (any) { /* the owners behind had nothing to run now: no one waits */
			sched_fair_unthrottle(s);
			pl = (struct step_plan){ .budget = s->cfg.max_tokens_per_step, .n_running = pl.n_running };
			plan_step(s, &pl);
		}
	}
	size_t n_items = pl.n_items;
	int starved = pl.starved;
	for (size_t i = 0; i < s->n_reqs;) /* a window its KV could not follow */
		if (s->reqs[i]->state == RS_RUNNING && s->reqs[i]->res.error < 0)
			sched_finish(s, s->reqs[i], KVD_FINISH_ERROR, s->reqs[i]->res.error);
		else
			i++;
	struct req *w = NULL; /* windows all waiting for copies of shared pages: drop the youngest's KV */
	for (size_t i = 0; !n_items && starved && i < s->n_reqs; i++)
		if (s->reqs[i]->state == RS_RUNNING && (!w || s->reqs[i]->arrival > w->arrival))
			w = s->reqs[i];
	if (w) { /* (not a swap-out: that keeps the shared pages) */
		s->st.preemptions++;
		w->res.preemptions++;
		w->res.recompute_tokens += w->n_computed;
		sched_drop_seq(s, w);
		w->state = RS_WAITING;
	}
	if (!n_items)
		return 0;

	/* does it fit? if not, give up requests until it does */
	uint32_t need = 0;
	for (;;) {
		rc = kvd_engine_plan(s->e, s->items, pl.n_items, &need);
		if (rc != -ENOMEM)
			break;
		if (sched_spec_strip(s, pl.n_items, &pl.budget, &pl.drafted)) /* drafts go before anyone is preempted */
			continue;
		if (sched_reclaim_session(s))
			continue;
		rc = fit_give_up(s, &pl);
		if (rc <= 0)
			return rc;
	}
	n_items = pl.n_items;
	for (size_t i = 0; i < n_items; i++)
		s->item_req[i]->admitted_now = 0;
	if (rc < 0)
		goto fail;
	demote_ahead(s, need);
	sched_spec_bind(s, pl.n_items, &pl.budget, &pl.drafted);
	uint64_t t0 = sched_now_ns(s);
	rc = kvd_engine_step(s->e, s->items, n_items);
	if (rc < 0)
		goto fail;
	uint64_t t1 = sched_now_ns(s);
	s->st.steps++;
	sched_learn_step_time(s, n_items, t1 - t0);
	if (sched_spec_measured(s))
		sched_spec_step_done(s, n_items, t1 - t0);
	sched_fair_charge(s, n_items, t1 - t0);
	for (size_t i = 0; i < n_items; i++) {
		struct req *r = s->item_req[i];
		uint64_t wait = 0;
		if (!r->res.preemptions && r->n_computed == r->res.cached_tokens && r->t_admit)
			wait = r->t_admit - r->t_submit; /* first chunk: time queued for memory */
		wait = wait > r->queue_compute_ns ? wait - r->queue_compute_ns : 0;
		r->queue_compute_ns = 0; /* (counted once) */
		kvmm_seq_add_time(s->kv, r->seq, wait, t1 - t0);
		r->res.batch_width_sum += n_items;
		r->res.batch_steps++;
		r->last_step = s->st.steps;
		r->n_computed += (uint32_t)s->items[i].n_tokens;
		if (r->n_generated == 0 || (s->items[i].n_tokens > 1 && !s->items[i].all_logits))
			s->st.tokens_prefilled += (uint64_t)s->items[i].n_tokens;
	}
	for (size_t i = 0; i < s->n_reqs; i++) { /* runnable, left out of this step: waiting for compute */
		struct req *q = s->reqs[i];
		int queued = q->state == RS_WAITING && !q->res.preemptions && !pl.mem_closed;
		uint64_t from = s->t_step_end > q->t_submit ? s->t_step_end : q->t_submit; /* this step and the gap before */
		if ((q->state == RS_RUNNING || queued) && q->last_step != s->st.steps && t1 > from) {
			q->res.compute_wait_ns += t1 - from;
			q->queue_compute_ns += queued ? t1 - from : 0;
		}
	}
	s->t_step_end = t1;
	sched_draw_step(s, n_items); /* the plain decodes' tokens, drawn together, reported in order below */
	/* emit after the bookkeeping: emit may finish and free requests */
	for (size_t i = 0; i < n_items; i++)
		if (sched_item_draws(s, i))
			emit(s, s->item_req[i]);
		else if (s->items[i].logits && !s->item_req[i]->forked)
			start_samples(s, s->item_req[i]);
		else if (s->items[i].logits)
			sched_spec_verify(s, s->item_req[i], s->items[i].logits);
	return (int)n_items;
fail:
	for (size_t i = 0; i < n_items; i++)
		sched_finish(s, s->item_req[i], KVD_FINISH_ERROR, rc);
	return rc;
}
