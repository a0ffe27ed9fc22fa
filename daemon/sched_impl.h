/*
 * daemon/sched_impl.h — the scheduler's private state, shared by sched.c
 * (batching, admission, preemption) and sched_samples.c (parallel samples
 * forked from one prompt). Nothing outside these two files includes it.
 */
#ifndef KVD_SCHED_IMPL_H
#define KVD_SCHED_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "sched.h"

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
	int swap_failed;         /* kvmm reported an I/O error on its sequence */
	struct kvd_sampler *sampler;
	float *logits;
	struct kvd_request_result res;
	uint64_t t_submit, t_admit, t_first, t_last, t_used;
};

struct kvd_sched {
	struct kvd_sched_config cfg;
	struct kvd_engine *e;
	struct kvmm *kv;
	struct kvd_sched_events ev;
	int32_t n_vocab;
	uint32_t block_size;
	struct req **reqs; /* by arrival */
	size_t n_reqs, cap_reqs;
	uint64_t arrivals;
	struct kvd_sched_stats st;
	/* Step-time model for max_step_ms: moving averages of a step that only
	 * decodes and of one prefill token's share of a step (0: not measured
	 * yet), both from measured steps, so the budget follows the machine. */
	uint64_t est_decode_ns, est_token_ns;
	/* step scratch */
	struct kvd_engine_item *items;
	struct req **item_req;
	size_t cap_items;
	struct req *attaching;  /* whose prefix kvmm_prefix_attach is looking up */
	int demote_failing;     /* the last demotion failed (logged once until one works) */
};

/* ---- sched.c ---- */
void req_free(struct req *r);
int reserve_toks(struct req *r, uint32_t n);

/* ---- sched_samples.c ---- */
/* 1 and *ret_i when r is in the array. */
int find_ptr(const struct kvd_sched *s, const struct req *r, size_t *ret_i);
/* Sequences a running request stands for: its samples until they are forked. */
uint32_t slots(const struct req *r);
/* r ends before its samples were forked: report the other samples as
 * ending the same way (on_done), with nothing generated. */
void done_unforked(struct kvd_sched *s, const struct req *r);
/*
 * p's prompt is computed and its logits are in: fork the other n_samples - 1
 * samples (kvmm_seq_fork), placed right after p in the array with p's
 * arrival, each with a copy of the logits and a sampler seeded
 * kvd_sample_seed(seed, i). A sample that cannot be made (out of memory)
 * ends at once with ERROR (on_done). Returns how many were made, in kids;
 * none has sampled yet (the caller emits p's first token, then theirs).
 */
uint32_t fork_samples(struct kvd_sched *s, struct req *p, struct req **kids);

#endif
