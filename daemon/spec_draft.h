/*
 * daemon/spec_draft.h — speculative decoding with a draft model: a second,
 * smaller GGUF with the target's vocabulary ([speculative] draft_model),
 * run as its own engine (engine.h) with its own small KV pool, drafting k
 * tokens greedily for the target to verify (sched_spec.c).
 *
 * Each drafting request has a draft sequence in the draft engine's pool
 * (struct kvd_spec_dseq). Its KV is a cache of the request's tokens: at
 * each draft it is cut back to the longest prefix that still agrees with
 * the request's tokens (the drafts the target rejected go), catches up on
 * the tokens the target accepted since (one prefill chunk), and then
 * drafts one token per draft-engine step, all drafting requests batched
 * in each step. Anything that would make that cache wrong or costly —
 * preemption, swap, a window policy, an exhausted draft pool, an engine
 * error — drops the draft sequence (kvd_spec_dseq_drop); it catches up
 * again at a later draft. A request never fails for its draft.
 *
 * One thread (the scheduler's) drives a drafter.
 */
#ifndef KVD_SPEC_DRAFT_H
#define KVD_SPEC_DRAFT_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

struct kvd_engine;
struct kvd_model;
struct kvd_spec_drafter;

/* Tokens a draft sequence catches up on in one step at most: a request far
 * ahead of its draft (a long prompt, a resumed one) reads them in chunks,
 * without drafting, so one step never carries a long draft prefill. */
#define KVD_SPEC_CATCHUP_TOKENS 256u

/* A request's draft sequence; all zero: none (no constructor needed). It
 * holds positions [0, n): the request's tokens [0, base) and then tail. */
struct kvd_spec_dseq {
	int has;
	uint32_t seq;    /* in the draft engine's kvmm */
	uint32_t n;      /* tokens in its KV */
	uint32_t base;
	uint32_t n_tail;
	int32_t tail[KVD_SPEC_MAX_DRAFT]; /* its own drafts past base, as computed */
};

/* One request's part of a draft: its tokens toks[0, n_toks) (the last one
 * not yet computed by the target), at most k drafts wanted (0: catch up
 * only). out gets the drafts, n_out of them. */
struct kvd_spec_djob {
	struct kvd_spec_dseq *d;
	const int32_t *toks;
	uint32_t n_toks;
	uint32_t k;
	int32_t *out;    /* k tokens of room */
	uint32_t n_out;
	uint32_t n_fed;  /* out: tokens the draft engine computed for it in this run */
};

/*
 * Whether draft can draft for target: the same logits width (n_vocab),
 * the same tokenizer vocabulary (every token's text and type), and the
 * same BOS, EOS and end-of-turn tokens. 0, or -EINVAL with one line in err
 * naming the first difference.
 */
int kvd_spec_vocab_check(const struct kvd_model *target, const struct kvd_model *draft, char *err, size_t errlen);

/*
 * Open path as target's draft model (kvd_engine_set_draft): an engine like
 * base (threads, CPU instruction set, block size) on target's backend and
 * K/V type, with a pool of pool_bytes, no prefix cache, no swap; its
 * vocabulary must be target's (kvd_spec_vocab_check). 0, or -errno with
 * one line in err (nothing is set then).
 */
struct kvd_engine_config;
int kvd_spec_draft_open(struct kvd_engine *target, const char *path, uint64_t pool_bytes,
			const struct kvd_engine_config *base, char *err, size_t errlen);

/*
 * A drafter over the draft engine de (not owned: the target engine owns
 * it, kvd_engine_set_draft). NULL: out of memory. Freeing accepts NULL;
 * the draft sequences must have been dropped first.
 */
struct kvd_spec_drafter *kvd_spec_drafter_new(struct kvd_engine *de);
struct kvd_spec_drafter *kvd_spec_drafter_free(struct kvd_spec_drafter *dr);
/* The draft model's name (for the log and STATS) and context length. */
const char *kvd_spec_drafter_model(const struct kvd_spec_drafter *dr);
uint32_t kvd_spec_drafter_n_ctx(const struct kvd_spec_drafter *dr);

/*
 * Cut d back to the longest prefix that agrees with toks[0, n_toks) and
 * return how many tokens it lags behind (n_toks when it has no sequence).
 * A cut that fails drops it.
 */
uint32_t kvd_spec_dseq_sync(struct kvd_spec_drafter *dr, struct kvd_spec_dseq *d, const int32_t *toks,
			    uint32_t n_toks);
/* Give up d's sequence and pages; accepts one without. */
void kvd_spec_dseq_drop(struct kvd_spec_drafter *dr, struct kvd_spec_dseq *d);
/* Pages a draft sequence of n_tokens tokens takes in the draft pool. */
uint32_t kvd_spec_drafter_pages_for(const struct kvd_spec_drafter *dr, uint32_t n_tokens);
/* Pages d's sequence holds in the draft pool (0 without one). */
uint32_t kvd_spec_dseq_pages(const struct kvd_spec_drafter *dr, const struct kvd_spec_dseq *d);
/* The draft pool's pages: all of them, and (ret_used may be NULL: then
 * cheap, for the scheduler's every step) those held by draft sequences. */
void kvd_spec_drafter_pages(const struct kvd_spec_drafter *dr, uint64_t *ret_total, uint64_t *ret_used);

/*
 * Draft for jobs[0, n): each job's sequence (made where it has none)
 * catches up on its tokens and, when it lags by at most
 * KVD_SPEC_CATCHUP_TOKENS and k > 0, drafts up to k tokens by argmax
 * (stopping after a token is_eog says ends generation; is_eog may be
 * NULL), batched across the jobs, k draft-engine steps at most. A job
 * that does not fit the draft pool (the last jobs of jobs[] are left out
 * first), or whose sequence no slot is left for, drafts nothing (n_out 0)
 * and its sequence stays as it is, for a later run; the others go on.
 * Returns how many jobs were left out for lack of draft pages or
 * sequences (the caller may drop idle draft sequences and draft again
 * next time), or -ENOMEM for scratch memory (nothing drafted, sequences
 * kept or dropped, all consistent).
 */
int kvd_spec_drafter_run(struct kvd_spec_drafter *dr, struct kvd_spec_djob *jobs, size_t n,
			 int (*is_eog)(void *ud, int32_t t), void *ud);

#endif
