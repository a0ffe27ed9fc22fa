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

/* ---- sched.c ---- */
void req_free(struct req *r);
int reserve_toks(struct req *r, uint32_t n);

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
