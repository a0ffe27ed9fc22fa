/*
 * daemon/spec.h — speculative decoding by prompt lookup: the drafter.
 *
 * A sequence that copies spans of its own context (quoting a document,
 * rewriting given code, repeating a conversation) can be decoded several
 * tokens per step: the last few tokens are looked up earlier in the
 * sequence's own tokens (prompt and output) and what followed them there
 * is proposed as a draft. The scheduler scores [last token, draft] in one
 * step and keeps exactly the tokens its sampler would have drawn one at a
 * time (sched.c: the verification); the KV of rejected drafts is cut back
 * through kvmm (kvmm_seq_truncate). The drafter is a pure function of the
 * tokens, so it needs no state to fork, swap or preempt.
 */
#ifndef KVD_SPEC_H
#define KVD_SPEC_H

#include <stdint.h>

#define KVD_SPEC_MAX_DRAFT     16u /* [speculative] draft_tokens at most */
#define KVD_SPEC_MAX_MIN_MATCH 16u /* [speculative] min_match at most */
#define KVD_SPEC_LOOKBACK      8192u /* tokens searched back for a match at most */

/* The acceptance histogram: verify steps by the run of draft tokens they
 * accepted, in KVD_SPEC_RUN_BUCKETS buckets: 0, 1, 2-3, 4-7, 8-16. */
#define KVD_SPEC_RUN_BUCKETS 5u
static inline unsigned kvd_spec_run_bucket(uint32_t accepted)
{
	return accepted == 0 ? 0u : accepted == 1 ? 1u : accepted < 4 ? 2u : accepted < 8 ? 3u : 4u;
}

enum kvd_spec_mode {
	KVD_SPEC_OFF = 0,
	KVD_SPEC_LOOKUP = 1, /* n-gram match against the sequence's own tokens */
	KVD_SPEC_AUTO = 2,   /* lookup, each draft token only where its measured worth beats its measured cost;
			      * with a draft model loaded, the draft model where lookup finds no match */
	KVD_SPEC_DRAFT = 3,  /* a draft model (spec_draft.h) drafts greedily */
};

/* "off", "lookup", "auto" or "draft" ([speculative] mode); -EINVAL for
 * anything else. */
int kvd_spec_mode_parse(const char *name, enum kvd_spec_mode *ret);
const char *kvd_spec_mode_name(enum kvd_spec_mode m);

struct kvd_spec_config {
	enum kvd_spec_mode mode;
	uint32_t draft_tokens; /* 1 .. KVD_SPEC_MAX_DRAFT: tokens drafted per step at most */
	uint32_t min_match;    /* 1 .. KVD_SPEC_MAX_MIN_MATCH: n-gram length that must match */
};

/*
 * Draft up to max_draft tokens after toks[0..n): find the most recent
 * earlier place (within the last KVD_SPEC_LOOKBACK tokens) where the last
 * min_match tokens occurred, and copy what followed it there, up to
 * max_draft tokens and never past toks[n - 1]. Returns how many tokens
 * were written to draft (0: no match, or n too short, or max_draft or
 * min_match 0).
 */
uint32_t kvd_spec_draft(const int32_t *toks, uint32_t n, uint32_t min_match, uint32_t max_draft, int32_t *draft);

/*
 * Draft length, learnt per sequence from its own verify steps. miss is an
 * exponentially weighted average (weight KVD_SPEC_EWMA) of the share of
 * its drafts rejected, so p = 1 - miss estimates the chance that a draft
 * token is accepted, and draft token i (1-based) is accepted with about
 * p^i: a draft is as long as p^i stays above the threshold the scheduler
 * gives (what a draft token costs against what a token is worth, see
 * kvd_spec_threshold), at least 1 and at most the configured length.
 * After KVD_SPEC_MISSES verify steps in a row that accepted nothing the
 * sequence stops drafting for `backoff` decodes (KVD_SPEC_PAUSE_MIN,
 * doubling with each further back-off up to KVD_SPEC_PAUSE_MAX) and then
 * probes again; a step that accepts anything ends the back-off. Before its
 * first verify step a sequence is taken to have a miss rate of
 * KVD_SPEC_MISS_PRIOR (so a free-text sequence's first drafts are short,
 * and a copying one's grow to full length within a few steps). All zero is
 * the starting state, so it needs no constructor; it is copied with a
 * forked sample and, being plain data, survives preemption and swap.
 */
struct kvd_spec_seq {
	float miss;          /* EWMA of rejected / drafted (learnt: after the first verify step) */
	uint32_t learnt;     /* verify steps learnt from (saturates) */
	uint32_t misses;     /* verify steps in a row that accepted nothing */
	uint32_t pause;      /* decodes left before it drafts again */
	uint32_t backoff;    /* the last pause's length (0: none yet) */
};
#define KVD_SPEC_EWMA      0.3f
#define KVD_SPEC_MISS_PRIOR 0.5f
#define KVD_SPEC_MISSES    3u
#define KVD_SPEC_PAUSE_MIN 8u
#define KVD_SPEC_PAUSE_MAX 256u
/* The threshold where no cost is measured ([speculative] mode = lookup):
 * a draft token accepted one time in ten pays on a memory-bound step. */
#define KVD_SPEC_LOOKUP_THRESHOLD 0.1

/* How many tokens q drafts at this decode, 0 .. max (0 while it backs
 * off: the decode counts towards the pause's end). threshold >= 1: none. */
uint32_t kvd_spec_next_len(struct kvd_spec_seq *q, uint32_t max, double threshold);
/* A verify step of q's scored k > 0 drafts and accepted the first run. */
void kvd_spec_learn(struct kvd_spec_seq *q, uint32_t k, uint32_t run);

/*
 * What draft tokens cost, measured ([speculative] mode = auto): the time
 * of steps of decodes only (prefill makes a step's time another story) is
 * fitted as plain + per_draft * drafted by exponentially weighted least
 * squares (weight KVD_SPEC_COST_DECAY per step), so plain follows the
 * batch as it changes and per_draft is the time one more draft token adds.
 * A step of B decodes makes B tokens in plain ns; a draft token accepted
 * with probability q makes q tokens in per_draft ns more, so it pays when
 * q > B * per_draft / plain: kvd_spec_threshold. Wide batches and
 * compute-bound steps (per_draft near plain / B) draft little or nothing.
 */
struct kvd_spec_cost {
	double s1, sd, sdd, sy, sdy; /* decayed sums over decode steps (d: draft tokens, y: ns) */
	double plain_ns, draft_ns;   /* the fit; draft_ns 0: not measured yet */
	uint32_t n_drafting;         /* steps with drafts folded in (saturates) */
	uint32_t since_draft;        /* decode steps since the last one with drafts (saturates) */
	uint32_t reprobe_after;      /* since_draft at which the fit is measured again (0: KVD_SPEC_REPROBE_STEPS) */
	int relearning;              /* measuring again: KVD_SPEC_REPROBE_TOKENS a step until the fit is in use */
};
#define KVD_SPEC_COST_DECAY 0.97
#define KVD_SPEC_COST_MIN_STEPS 8u /* drafting steps before the fit is used */
/*
 * A fit that declines every draft is never measured again, and a few steps
 * slowed by other load on the machine can make it do so. So after
 * KVD_SPEC_REPROBE_STEPS decode steps without drafts the fit is forgotten
 * and measured again (KVD_SPEC_COST_MIN_STEPS drafting steps at the lookup
 * threshold, each with at most KVD_SPEC_REPROBE_TOKENS draft tokens); where
 * the new fit declines too, the next time is twice as far, up to
 * KVD_SPEC_REPROBE_MAX steps, so a batch too wide to draft pays for
 * almost none.
 */
#define KVD_SPEC_REPROBE_STEPS 64u
#define KVD_SPEC_REPROBE_MAX 4096u
#define KVD_SPEC_REPROBE_TOKENS 4u
/* Fold in a step of decodes only that carried `drafted` draft tokens. */
void kvd_spec_cost_step(struct kvd_spec_cost *c, uint32_t drafted, uint64_t dt_ns);
/* The threshold for a step of n_decodes decodes; KVD_SPEC_LOOKUP_THRESHOLD
 * until the fit is measured. */
double kvd_spec_threshold(const struct kvd_spec_cost *c, uint32_t n_decodes);
/* 1 when the fit is in use and no step has carried drafts for the
 * re-probe interval: time to kvd_spec_cost_forget it. */
int kvd_spec_cost_reprobe(const struct kvd_spec_cost *c);
/* Drop the fit and measure it again (relearning), the next re-probe twice
 * as far off. */
void kvd_spec_cost_forget(struct kvd_spec_cost *c);

#endif
