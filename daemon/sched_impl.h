/*
 * daemon/sched_impl.h — the scheduler's private state, shared by sched.c
 * (batching, admission, preemption), sched_session.c (kept sessions, stats,
 * listing) and sched_samples.c (parallel samples forked from one prompt).
 * Nothing outside these files includes it.
 */
#ifndef KVD_SCHED_IMPL_H
#define KVD_SCHED_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "grammar.h"
#include "sched.h"
#include "spec.h"
#include "spec_draft.h"
#include "step_model.h"

enum req_state {
	RS_WAITING = 0,  /* no sequence yet (or dropped for recompute) */
	RS_RUNNING = 1,  /* resident, in the batch */
	RS_SWAPPED = 2,  /* preempted to the swap file */
	RS_SESSION = 3,  /* finished, KV kept for the session's next turn */
};

struct req {
	uint64_t id;
	uint64_t session;
	uint64_t arrival;
	enum req_state state;
	int32_t *toks;
	uint32_t n_toks, cap_toks;
	uint32_t n_prompt;       /* tokens of this turn's prompt */
	uint32_t n_history;      /* tokens before this turn (sessions) */
	uint32_t n_computed;     /* tokens whose K/V is in the sequence */
	uint32_t n_generated;
	uint32_t max_tokens;
	uint32_t seq;
	int has_seq;
	int ignore_eos;
	uint32_t idle_s;         /* session idle time; 0: the config's */
	int admitted_now;        /* admitted during the step being built */
	uint32_t sample, n_samples; /* this one's index; the request's count (>= 1) */
	int forked;              /* the samples exist (or n_samples is 1) */
	int logprobs;
	uint32_t top_logprobs;
	struct kvd_sampler_params sp; /* the request's, for the samples' samplers */
	uint64_t cache_scope;    /* kvd_request_params.cache_scope: its sequences' prefix-index scope */
	int windowed;            /* a window policy: w applies, the KV holds toks[0, sink), toks[sink + n_dropped, n_computed) */
	struct kvd_window w;
	uint32_t n_dropped;
	int swap_failed;         /* kvmm reported an I/O error on its sequence */
	struct kvd_sampler *sampler;
	float *logits;
	/* constraint (params.grammar): a reference, the vocabulary, and the
	 * parse state after the tokens generated so far; gram NULL: none */
	struct kvd_grammar *gram;
	const struct kvd_gram_vocab *gvocab;
	struct kvd_gram_state gst;
	/* the step's draw (sched_draw.c), made before any token is reported:
	 * drawn set, drawn_rc and drawn_tok are what sched_next_token gave */
	int drawn, drawn_fast, drawn_rc;
	int32_t drawn_tok;
	struct kvd_request_result res;
	uint64_t t_submit, t_admit, t_first, t_last, t_used;
	uint64_t last_step;      /* s->st.steps of the last step it took part in (ledger) */
	uint64_t queue_compute_ns; /* of its wait in the queue, steps memory did not keep it out of */
	uint64_t owner;          /* params.owner: whose share it draws on */
	int32_t priority;        /* params.priority: lower goes first within its owner */
	uint32_t oi;             /* its owner's index in s->owners (valid during a step) */
	/* speculative decoding (spec.h): the draft the step being run scores
	 * after toks[n_toks - 1] (also at toks[n_toks ..]); spec_cut: its KV
	 * may hold rejected drafts past n_computed until verification is done */
	int32_t draft[KVD_SPEC_MAX_DRAFT];
	uint32_t n_draft;
	int spec_cut;
	int no_spec;             /* the request opted out (kvd_request_params.no_speculate) */
	struct kvd_spec_seq spec; /* what its draft length is learnt from (spec.h) */
	struct kvd_spec_dseq dseq; /* its draft model's sequence (spec_draft.h) */
	uint32_t dwant;          /* this step: draft tokens the draft model is to fill in */
	int dcatch;              /* this step: its draft sequence catches up, no draft */
};

/*
 * One owner (a uid, or a gateway's tenant) with live requests: the unit
 * the scheduler shares the engine between (sched_fair.c). vtime_ns is the
 * engine time charged to it, the way a fair CPU scheduler keeps a virtual
 * runtime: the owner furthest behind goes first, and one that ran ahead of
 * another contending owner by more than SCHED_FAIR_SLICE_NS sits steps out
 * until the other caught up. The counts are made afresh each step.
 */
struct sched_owner {
	uint64_t id;
	double vtime_ns;
	uint32_t live;           /* requests (samples) waiting, running or swapped */
	uint32_t waiting;        /* of which waiting or swapped */
	uint32_t running;        /* sequences in the batch (slots) */
	uint32_t pages;          /* pages its resident sequences hold */
	int contending;          /* has work a step could do: running, waiting or swapped */
	int throttled;           /* ran ahead: its requests sit this step out */
	uint32_t step_tokens;    /* tokens of its items in the step being built */
	uint32_t dpages;         /* draft-pool pages its requests' draft sequences hold (sched_spec.c) */
};

/* A request's place in a step's fair order (sched_fair.c). */
struct sched_slot {
	struct req *r;
	uint32_t idx;            /* its index in s->reqs */
};

/* A decode step's time as fixed + per_token * tokens, fitted from the
 * steps measured (sched_fair.c): the fixed part (reading the weights) is
 * shared by every owner in a step, so an owner pays it only in part, and a
 * batch that costs about as much as one sequence (a GPU) is not cut up. */
struct sched_cost_fit {
	double s1, sn, snn, sy, sny; /* decayed least-squares sums over decode steps */
	double fixed_ns, token_ns;   /* token_ns == 0: not fitted (charge by tokens) */
};

/* What one thread draws tokens with (sched_next_token): the matcher's
 * scratch and a mask, made on first use. */
struct sched_lane {
	struct kvd_gram_scratch *gs;
	uint32_t *mask;
	size_t words;
};

/* The scheduler; its functions are in sched.c, sched_session.c (sessions,
 * listing) and sched_samples.c. */
struct kvd_sched {
	struct kvd_sched_config cfg;
	uint64_t t_step_end;     /* when the last step ended (ledger: waits for compute) */
	struct kvd_engine *e;
	struct kvmm *kv;
	struct kvd_sched_events ev;
	int32_t n_vocab;
	uint32_t block_size;
	struct req **reqs; /* by arrival */
	size_t n_reqs, cap_reqs;
	uint64_t arrivals;
	struct kvd_sched_stats st;
	/* step-time model for max_step_ms (step_model.h), from measured steps */
	struct kvd_step_model model;
	/* step scratch */
	struct kvd_engine_item *items;
	struct req **item_req;
	struct req **cand;      /* preemption candidates */
	size_t cap_items;
	struct req *attaching;  /* whose prefix kvmm_prefix_attach is looking up */
	int demote_failing;     /* the last demotion failed (logged once until one works) */
	/* fair sharing between owners (sched_fair.c) */
	struct sched_owner *owners;
	size_t n_owners, cap_owners;
	uint32_t n_contending;  /* owners with work this step (>= 1 when there is any) */
	struct sched_cost_fit fit;
	struct sched_slot *order; /* this step's requests in fair order */
	size_t n_order, cap_order;
	/* constrained sampling: the scheduler thread's lane (its scratch
	 * also serves every constraint update, which run on this thread) */
	struct sched_lane lane;
	/* a step's draws in parallel (sched_draw.c): the pool, made on the
	 * first step with two draws, and its other threads' lanes */
	struct kvd_pool *draw_tp;
	struct sched_lane *draw_lanes; /* [tp_size(draw_tp)]; [0] unused (the lane above) */
	int draw_tried;          /* the pool was tried (made or failed) */
	struct req **draws;      /* this step's drawing requests */
	size_t cap_draws;
	/* speculative decoding: one logits row per token of the drafting
	 * items of a step (theirs back to back) */
	float *spec_logits;
	size_t cap_spec_rows;
	struct kvd_spec_cost spec_cost; /* what draft tokens cost (mode auto) */
	struct kvd_gram_state spec_gst; /* a constrained draft's check runs on this copy of the state */
	double spec_threshold;   /* this step's: a draft token must be accepted more often (kvd_spec_next_len) */
	uint32_t spec_room;      /* this step's draft tokens at most (SCHED_SPEC_STEP_TOKENS, max_step_ms) */
	/* the draft model (spec_draft.h), made on the first step from the
	 * engine's draft engine (kvd_engine_draft) */
	struct kvd_spec_drafter *drafter;
	int drafter_tried, drafter_warned;
	struct kvd_spec_djob *djobs;
	size_t *djob_item;       /* each job's item in the step */
	size_t cap_djobs;
	uint64_t spec_draft_ns;  /* the draft model's time in this step */
	uint32_t spec_dshare;    /* an owner's share of the draft pool, in pages, at the last draft (0: none yet) */
};

/* ---- sched.c ---- */
void req_free(struct req *r);
/* Drop r's constraint (its reference and parse state); accepts none. */
void req_gram_release(struct req *r);
/* The scheduler's matcher scratch, made on first use; NULL: out of memory. */
struct kvd_gram_scratch *sched_gram_scratch(struct kvd_sched *s);
int reserve_toks(struct req *r, uint32_t n);
/* The request (or, with samples, its first sample) with id, and its index. */
struct req *sched_find(const struct kvd_sched *s, uint64_t id, size_t *ret_i);
/* End r: on_done, its sequence freed (or kept for its session). */
void sched_finish(struct kvd_sched *s, struct req *r, enum kvd_finish why, int error);
/* Pages a sequence of this many tokens may need at most (windows: its cap). */
uint64_t sched_pages_bound(const struct kvd_sched *s, uint64_t tokens, int windowed);
uint64_t sched_now_ns(const struct kvd_sched *s);
/* the finished session of that id (and its index), or NULL */
struct req *sched_find_session(const struct kvd_sched *s, uint64_t session, size_t *ret_i);
/* take reqs[i] out of the array (not freed) */
void sched_remove_at(struct kvd_sched *s, size_t i);
/* give up r's sequence and its pages, if it has one */
void sched_drop_seq(struct kvd_sched *s, struct req *r);

/* r's next token: its sampler's draw, under its constraint if it has one
 * (kvd_gram_sample, sampler.h), with lane L's scratch and mask; *ret_fast
 * is set when the sampled token was only checked, not masked for (untouched
 * without a constraint). 0, -ENOENT (the constraint allows nothing),
 * -ENOMEM. Reads and writes r and L only, so draws of different requests
 * with different lanes may run at once. */
int sched_draw_token(struct kvd_sched *s, struct req *r, struct sched_lane *L, int32_t *ret, int *ret_fast);
/* The same on the scheduler's own lane, counting the draw in the stats. */
int sched_next_token(struct kvd_sched *s, struct req *r, int32_t *ret);

/* ---- sched_draw.c: a step's draws in parallel ---- */
/* Item i of the step just run reports one plainly drawn token (emit):
 * it has logits, its samples are forked, it is no speculative
 * verification. The step's draws and its reports both choose by this. */
static inline int sched_item_draws(const struct kvd_sched *s, size_t i)
{
	return s->items[i].logits && s->item_req[i]->forked && !s->items[i].all_logits;
}
/* Draw the next token of each of the step's n_items items that decodes
 * plainly (into each request's drawn fields), at once on the draw pool;
 * nothing when the pool is one thread or fewer than two items draw. */
void sched_draw_step(struct kvd_sched *s, size_t n_items);
/* Stops the pool and frees the lanes. */
void sched_draw_fini(struct kvd_sched *s);
/* Frees a lane's scratch and mask. */
void sched_lane_fini(struct sched_lane *L);
/* Report t, r's next token (drawn by sched_next_token); end the request
 * when it ends here. Returns 1 when it ended (r may be freed), else 0. */
int sched_emit_token(struct kvd_sched *s, struct req *r, int32_t t);

/* ---- sched_spec.c: speculative decoding ---- */
/* Before a step's decodes are planned: whether and how much its decodes
 * may draft (no drafts when a long prefill waits; the measured threshold
 * with modes auto and draft; with target_ns, max_step_ms' step, only as many draft
 * tokens as the decodes leave time for). */
void sched_spec_begin(struct kvd_sched *s, uint64_t target_ns);
/* The time one draft token adds to a step, as measured (0: not yet). */
double sched_spec_token_ns(const struct kvd_sched *s);
/* A step ran in dt_ns: a step of decodes only is folded into the cost fit. */
void sched_spec_step_done(struct kvd_sched *s, size_t n_items, uint64_t dt_ns);
/* Whether the mode drafts on measured costs (auto and draft; lookup keeps
 * the fixed threshold), folding each step in (sched_spec_step_done). */
int sched_spec_measured(const struct kvd_sched *s);
/* r's decode, the step's item `it` (one token, logits), grows by a
 * prompt-lookup draft when r may speculate (not opted out, no window
 * policy; its samples forked; more than one token to go), leaving
 * one token of *budget to each of the `left` decodes (at most) still to plan and
 * keeping the step's *drafted tokens under a bound. The item then asks for
 * all logits and leaves publishing to verification. */
void sched_spec_draft(struct kvd_sched *s, struct req *r, struct kvd_engine_item *it, uint32_t left, uint32_t *budget,
		      uint32_t *drafted);
/* Turn the drafting items among items[0, n) back into plain decodes (the
 * step does not fit); 1 when there was one. */
int sched_spec_strip(struct kvd_sched *s, size_t n_items, uint32_t *budget, uint32_t *drafted);
/* Before the step: point each drafting item's logits at its rows of
 * s->spec_logits (grown as needed; out of memory: drafts stripped). */
void sched_spec_bind(struct kvd_sched *s, size_t n_items, uint32_t *budget, uint32_t *drafted);
/* After the step: exact verification of r's draft from its logits rows
 * (sched_spec.c says how); may finish and free r. */
void sched_spec_verify(struct kvd_sched *s, struct req *r, const float *rows);
/* r's KV past n_computed (rejected drafts) goes and the pages its accepted
 * tokens filled are published (also called by sched_finish while a
 * verification runs). */
void sched_spec_cut_back(struct kvd_sched *s, struct req *r);
/* r's draft sequence goes (preemption, swap, the end): the draft model's
 * KV is a cache, caught up again at a later draft. */
void sched_spec_forget(struct kvd_sched *s, struct req *r);
/* At the end: the logits rows and the drafter go, and one log line says
 * how many tokens were drafted and accepted. */
void sched_spec_free(struct kvd_sched *s);

/* ---- sched_fair.c ---- */
/* Count each owner's live requests, sequences and pages, forget owners
 * with none, place a new one at the least virtual time of the others,
 * mark who contends and who ran too far ahead, and put the requests in
 * fair order (s->order: owners by virtual time, then priority, then
 * arrival). -ENOMEM. */
int sched_fair_begin(struct kvd_sched *s);
/* Lift every owner's throttle (a step that would otherwise do nothing). */
void sched_fair_unthrottle(struct kvd_sched *s);
/* The owner's fair share of sequences (max_num_seqs) and of the pool's
 * pages among the owners contending now: the cap it is held to only while
 * another owner waits. */
uint32_t sched_fair_seq_share(const struct kvd_sched *s);
uint32_t sched_fair_page_share(const struct kvd_sched *s);
/* The request to give up first among cand[0..n): from the owner furthest
 * over its page share (over its sequence share when by_seqs), then the
 * lowest priority, then the youngest. With one owner: the youngest. */
size_t sched_fair_victim(struct kvd_sched *s, struct req *const *cand, size_t n, int by_seqs);
/* Charge a step that took dt_ns to the owners of its items, and learn the
 * step's cost from it (decode steps). */
void sched_fair_charge(struct kvd_sched *s, size_t n_items, uint64_t dt_ns);
/* Fold a step of the items s->items[0, n_items) that took dt_ns into the
 * step-time model (step_model.h), before their n_computed advance. */
void sched_learn_step_time(struct kvd_sched *s, size_t n_items, uint64_t dt_ns);
/* sched_swap.c: kvmm's swap-error handler (ud is the scheduler), and the
 * fallback count after a failed swap-out or swap-in of r's sequence */
void sched_on_swap_error(void *ud, const struct kvmm_swap_incident *inc);
void sched_count_fallback(struct kvd_sched *s, struct req *r);
void sched_fair_free(struct kvd_sched *s);

/* ---- sched_session.c ---- */
/* Give up the KV of the least recently used idle session that still holds
 * pages; 1 when one was dropped, 0 when none holds pages. */
int sched_reclaim_session(struct kvd_sched *s);

/* ---- sched_samples.c ---- */
/* What forking needs of the scheduler (sched.c fills it in). */
struct sched_fork {
	struct kvmm *kv;
	int32_t n_vocab;
	const struct kvd_sched_events *ev;
	struct kvd_sched_stats *st;   /* samples_forked, requests_done */
};
/* Sequences a running request stands for: its samples until they are forked. */
uint32_t slots(const struct req *r);
/* r ends before its samples were forked: report the other samples as
 * ending the same way (on_done), with nothing generated. */
void done_unforked(const struct kvd_sched_events *ev, const struct req *r);
/*
 * p's prompt is computed and its logits are in: make the other
 * n_samples - 1 samples (at most room of them), each with p's arrival, a
 * copy of the logits, a sampler seeded kvd_sample_seed(seed, i) and a fork
 * of p's sequence (kvmm_seq_fork; a failed fork leaves the child waiting,
 * to recompute its prompt like a preempted request). A sample that cannot
 * be made (out of memory, no room) ends at once with ERROR (on_done).
 * Returns how many were made, in kids, for the caller to place right after
 * p; none has sampled yet.
 */
uint32_t fork_samples(const struct sched_fork *x, struct req *p, struct req **kids, size_t room);

#endif
