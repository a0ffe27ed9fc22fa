/*
 * daemon/sched.h — iteration-level continuous batching.
 *
 * Every step decodes one token for each running sequence and spends the
 * rest of the per-step token budget on (chunked) prefill of sequences that
 * are still reading their prompt; finished sequences leave and waiting ones
 * join at any step. Admission and preemption are decided from kvmm's pages:
 * a request is admitted when the pages its next chunk needs are available
 * (prefix-cache hits need none), and when a step does not fit, a running
 * sequence is preempted — swapped out when a swap file exists, otherwise
 * dropped and recomputed later — and resumes, before any newer request of
 * its owner is admitted, once enough pages are free again (with a margin,
 * so it is not swapped straight back out). The engine is shared between
 * owners (params.owner; daemon/sched_fair.c): owners are served from the
 * one that has had the least engine time, one that ran ahead of another
 * sits steps out, each is held to its share of sequences and pages while
 * another waits, and the sequence preempted is the lowest-priority,
 * youngest one of the owner furthest over its share (with one owner: the
 * youngest). With a swap file, a step that
 * would eat into the last free pages first demotes the coldest cached
 * prefix pages to swap (kvmm_cache_demote), so the allocation finds free
 * pages and a later hit reads the prefix back instead of recomputing it.
 * Outputs do not depend on any of this: a resumed sequence continues
 * exactly where it stopped. A swap-out or swap-in that fails (I/O error,
 * short transfer, full disk) falls back to recomputing the request's KV
 * from its tokens; the scheduler logs each such incident once and counts
 * it in its stats and in the request's result.
 *
 * The scheduler deals only in tokens and pages: it samples, reports each
 * sampled token to its caller, who decides whether a stop string has
 * appeared (the text of a request lives in daemon/request.c), and keeps
 * per-request timing on a clock its creator may supply. It never needs a
 * model: only an engine (kvd_engine_open_backend runs one over a stub
 * backend). It reports through callbacks and is driven by one thread (the
 * daemon's main loop); nothing here blocks.
 */
#ifndef KVD_SCHED_H
#define KVD_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "hist.h"
#include "sampler.h"
#include "spec.h"

struct kvd_engine;
struct kvd_sched;
struct kvmm_seq_record;
struct kvd_grammar;
struct kvd_gram_vocab;

struct kvd_sched_config {
	uint32_t max_num_seqs;        /* running + prefilling at most */
	uint32_t max_tokens_per_step; /* token budget of one step */
	uint32_t max_model_len;       /* prompt + max_tokens at most (<= model context) */
	uint32_t max_waiting;         /* queued requests at most */
	uint32_t session_idle_s;      /* sessions unused this long are closed (unless a
	                               * request set its own); 0: never */
	uint32_t max_step_ms;         /* a step carrying decodes takes about this long at
	                               * most (its prefill share is cut to fit); 0: no limit */
	struct kvd_spec_config spec;  /* speculative decoding ([speculative]); mode 0: off */
	uint32_t draw_threads;        /* threads drawing a step's tokens at once (masks
	                               * and sampling, sched_draw.c); 0 or 1: the
	                               * scheduler's thread alone. Set at creation. */
};

enum kvd_finish {
	KVD_FINISH_NONE = 0,
	KVD_FINISH_EOS,
	KVD_FINISH_LENGTH,
	KVD_FINISH_STOP,
	KVD_FINISH_CANCELLED,
	KVD_FINISH_ERROR,
};

struct kvd_request_params {
	struct kvd_sampler_params sampling;
	uint32_t max_tokens;          /* generated tokens at most (>= 1) */
	int ignore_eos;               /* keep going past end-of-generation tokens */
	uint64_t session;             /* 0: none; else continue / keep this session */
	uint32_t session_idle_s;      /* the session closes after this long unused;
	                               * 0: the config's session_idle_s */
	/* Parallel samples: 0 or 1 is one; 2 .. KVD_MAX_SAMPLES forks the
	 * sequence once the prompt is computed (its full pages shared, a
	 * partly filled last page copied on first write), each sample i then
	 * decoding on its own with the seed kvd_sample_seed(sampling.seed, i).
	 * Not with a session. Each sample counts as a sequence against
	 * max_num_seqs from admission on. */
	uint32_t n_samples;
	int logprobs;                 /* report log-probabilities with each token */
	int no_speculate;             /* no speculative decoding for it, whatever [speculative] mode says */
	uint32_t top_logprobs;        /* alternatives with them, 0 .. KVD_LOGPROBS_MAX_TOP */
	/* Context policy (enum kvd_ctx_policy). The window policies drop the
	 * oldest KV as the request runs (engine.h says how); truncate-oldest is
	 * the caller's (kvd_sched_session_truncate) and acts here as ERROR. */
	uint32_t ctx_policy;
	uint32_t ctx_window;          /* window policies: tokens; 0 = as many as fit */
	uint32_t ctx_sinks;           /* KVD_CTX_SINKS: first tokens kept; 0 = 4 */
	/* Who the request belongs to. owner: the unit the scheduler shares the
	 * machine between (a uid; a tenant that a trusted gateway forwards
	 * gets an owner of its own). cache_scope: the prefix-index scope its
	 * pages are published in and looked up from (kvmm_seq_set_scope), so a
	 * cached page serves only requests of the same scope. */
	uint64_t owner;
	uint64_t cache_scope;
	/* Within one owner, requests with a lower priority are admitted and
	 * resumed first and preempted last (vLLM's `priority`); 0 is the
	 * default. Between owners it counts for nothing: the machine is
	 * shared between owners first (sched_fair.c). */
	int32_t priority;
	/* A constraint on the generated text (grammar.h), or NULL. The
	 * scheduler takes its own reference; gram_vocab (borrowed: it must
	 * outlive the request) is the model's vocabulary it is matched
	 * against. Each sequence keeps its own parse state (forked with its
	 * samples, untouched by preemption and swap: only a sampled token
	 * advances it, never a recomputation), draws only allowed tokens
	 * (kvd_gram_sample, sampler.h), and ends with EOS when the
	 * constraint is complete and nothing can follow, or when an
	 * end-of-generation token is drawn (allowed only where the constraint
	 * may end; ignore_eos does not apply). With a session it applies to
	 * this turn only. */
	struct kvd_grammar *grammar;
	const struct kvd_gram_vocab *gram_vocab;
};

#define KVD_MAX_SAMPLES 16

/* A sampled token, for on_sample_token. */
struct kvd_token_event {
	uint32_t sample;              /* 0 .. n_samples - 1 */
	int32_t token;
	enum kvd_finish ending;       /* as on_token's */
	const struct kvd_logprobs *lp; /* with params.logprobs, else NULL; valid during the call */
};

/* The values are the wire's (enum ipc_context_policy). */
enum kvd_ctx_policy {
	KVD_CTX_ERROR = 0,
	KVD_CTX_TRUNCATE_OLDEST = 1,
	KVD_CTX_SLIDING_WINDOW = 2,
	KVD_CTX_SINKS = 3,
};

/* What on_token answers: go on, or stop now (a stop string appeared). */
enum kvd_token_verdict {
	KVD_TOKEN_CONTINUE = 0,
	KVD_TOKEN_STOP = 1,
};

struct kvd_request_result {
	enum kvd_finish finish;
	int error;                    /* negative errno when finish == ERROR */
	uint32_t prompt_tokens;       /* tokens of this request's prompt */
	uint32_t cached_tokens;       /* of which came from the prefix cache or session */
	uint32_t adopted_tokens;      /* of those, found in pages adopted from an earlier run */
	uint32_t adopted_pages;       /* the pages they were found in */
	uint32_t generated_tokens;
	uint64_t queue_ns;            /* submit -> admitted */
	uint64_t ttft_ns;             /* submit -> first token */
	uint64_t decode_ns;           /* first token -> last token */
	uint32_t preemptions;
	uint32_t swaps;
	uint32_t swap_errors;         /* page transfers of its KV to/from swap that failed */
	uint32_t swap_fallback_recomputes; /* times its KV was recomputed because of them */
	/* The KV ledger of the request's sequence (kvmm_seq_finish, or the
	 * live record of a kept session); NULL when it never had one. Valid
	 * only during on_done. */
	const struct kvmm_seq_record *ledger;
	uint32_t sample;              /* which sample this result is (0 for one-sample requests) */
	uint32_t n_samples;           /* the request's samples (>= 1): on_done comes once for each */
	uint32_t context_dropped_tokens; /* window policies: tokens of the context (a session's
	                                  * history included) whose K/V was dropped by the end */
	uint32_t context_truncated_turns; /* set by the caller: turns truncate-oldest removed */
	uint32_t context_policy;          /* set by the caller (enum kvd_ctx_policy), for the ledger */
	uint32_t context_window, context_sinks; /* set by the caller: the policy's tokens (0: default) */
	/* For the ledger: time it was runnable in steps that left it out
	 * (waiting for compute): admitted and holding its KV, or queued for
	 * its first admission in a step that memory closed to no one (its
	 * sequence slots, the step's budget or its owner's share kept it
	 * out); that part is not in the sequence's mem_wait_ns. The sequences of the
	 * steps it took part in, summed, and those steps; tokens whose K/V a
	 * preemption dropped, to be recomputed. */
	uint64_t compute_wait_ns;
	uint64_t batch_width_sum;
	uint32_t batch_steps;
	uint32_t recompute_tokens;
	/* Speculative decoding: its decodes that carried a draft (verify
	 * steps), the draft tokens scored and of those the ones accepted, and
	 * its verify steps by accepted run (kvd_spec_run_bucket). */
	uint32_t spec_verify_steps, spec_drafted_tokens, spec_accepted_tokens;
	uint32_t spec_runs[KVD_SPEC_RUN_BUCKETS];
};

/* Callbacks, all optional, all given ud. None may call back into the
 * scheduler. */
struct kvd_sched_events {
	/* A sampled token. Every generated token is reported, the
	 * end-of-generation one included. `ending` says how the request ends
	 * with this token unless the answer is KVD_TOKEN_STOP: KVD_FINISH_NONE
	 * (more will follow), KVD_FINISH_EOS (an end-of-generation token: the
	 * request ends with EOS whatever the answer) or KVD_FINISH_LENGTH (the
	 * max_tokens-th token). KVD_TOKEN_STOP ends the request with
	 * KVD_FINISH_STOP (unless ending is EOS). NULL: always continue. */
	enum kvd_token_verdict (*on_token)(void *ud, uint64_t req_id, int32_t token, enum kvd_finish ending);
	/* The request (one sample of it) is over; called exactly once per
	 * accepted request and sample (res->sample, res->n_samples). A request
	 * that ends before its samples were forked (cancelled, failed) reports
	 * every sample, with no tokens. */
	void (*on_done)(void *ud, uint64_t req_id, const struct kvd_request_result *res);
	/* Whether a token ends generation (the model's end-of-generation
	 * tokens); NULL: none does, generation ends only by length or stop. */
	int (*is_eog)(void *ud, int32_t token);
	/* The clock for every time the scheduler keeps (timings, session
	 * idleness), in ns; NULL: CLOCK_MONOTONIC. Must not go backwards. */
	uint64_t (*now_ns)(void *ud);
	/* An idle session was closed by kvd_sched_expire_sessions. */
	void (*on_session_expired)(void *ud, uint64_t session);
	void *ud;
	/* When set, called instead of on_token, with the sample index and the
	 * log-probabilities a request asked for; same contract otherwise. */
	enum kvd_token_verdict (*on_sample_token)(void *ud, uint64_t req_id, const struct kvd_token_event *ev);
};

struct kvd_sched_stats {
	uint32_t running;     /* sequences in the batch (decoding or prefilling) */
	uint32_t waiting;     /* accepted, not admitted yet */
	uint32_t swapped;     /* preempted, waiting to resume */
	uint32_t sessions;    /* idle sessions holding KV */
	uint64_t steps;
	uint64_t tokens_prefilled;
	uint64_t tokens_generated;
	uint64_t preemptions;
	uint64_t requests_done;
	uint64_t pages_demoted;   /* cached prefix pages written to swap ahead of pressure */
	uint64_t demote_errors;   /* demotions that failed on I/O (the pages stayed cached) */
	uint64_t swap_incidents;  /* swap operations that had failed transfers (each logged once) */
	uint64_t swap_fallback_recomputes; /* requests' KV recomputed after a failed swap-out or swap-in */
	/* Session turns that continued from their kept KV (no prefix lookup in
	 * kvmm): the context they brought and the history they reused, counted
	 * as prefix lookups and hits in the daemon's stats. */
	uint64_t session_lookups, session_query_tokens, session_hit_tokens;
	struct kvd_hist itl;      /* inter-token latency: the gap before each token after a
	                           * request's first (time to first token is the server's,
	                           * which sees the request arrive) */
	uint64_t samples_forked;  /* sequences forked for parallel samples */
	/* Constrained tokens drawn: answered by the greedy check alone, and
	 * drawn over a full mask of the allowed tokens. */
	uint64_t gram_checked, gram_masked;
	/* Tokens drawn on the draw pool (several of a step at once, sched_draw.c). */
	uint64_t draws_parallel;
	/* Speculative decoding: decodes that carried a draft, the draft tokens
	 * scored, and of those the ones accepted (emitted without a step of
	 * their own). */
	uint64_t spec_verifies, spec_drafted, spec_accepted;
	uint64_t spec_runs[KVD_SPEC_RUN_BUCKETS]; /* verify steps by accepted run (kvd_spec_run_bucket) */
	/* The mode in effect, the draft model's pool (pages; 0 without a
	 * draft model) and the draft sequences given up to an owner under
	 * its share of that pool. */
	int spec_mode;            /* enum kvd_spec_mode */
	uint64_t spec_draft_pages_total, spec_draft_pages_used;
	uint64_t spec_draft_reclaims;
};

int kvd_sched_create(const struct kvd_sched_config *cfg, struct kvd_engine *e, const struct kvd_sched_events *ev,
		     struct kvd_sched **ret);
/* Cancels everything still queued or running (on_done with CANCELLED) and
 * frees; accepts NULL; returns NULL. */
struct kvd_sched *kvd_sched_destroy(struct kvd_sched *s);

/*
 * Queue a request. The prompt is copied. Returns 0; -E2BIG when history +
 * prompt + max_tokens exceeds max_model_len (without a window policy), or
 * when a window policy's sinks and window do not fit in it; -ENOTSUP for a
 * window policy the backend cannot do (no kv_shift); -ENOSPC when it could not fit
 * in the whole KV pool even alone; -EINVAL for an empty prompt, a token
 * out of range or bad sampling parameters, n_samples above KVD_MAX_SAMPLES,
 * samples with a session or top_logprobs above KVD_LOGPROBS_MAX_TOP, a
 * grammar without gram_vocab;
 * -ERANGE for n_samples above max_num_seqs; -EBUSY when the queue is full
 * or the session is in use; -EEXIST for a duplicate request id; -ENOMEM.
 * On success on_done will be called exactly once.
 * With params->session != 0 the sequence is kept after a request that
 * ends normally (eos, length, stop) under that id, and a later request
 * naming it continues from there: its prompt is only the new text. A
 * cancelled or failed turn leaves the session as it was before that turn
 * (a first turn leaves nothing). An idle session's KV pages
 * may be given up under memory pressure; its tokens are kept, and the
 * next turn recomputes them (through the prefix cache where it can).
 */
int kvd_sched_submit(struct kvd_sched *s, uint64_t req_id, const int32_t *prompt, uint32_t n_prompt,
		     const struct kvd_request_params *params);
/* Cancel a queued or running request, every sample of it (on_done with
 * CANCELLED, its pages freed at once). -ENOENT if unknown. */
int kvd_sched_cancel(struct kvd_sched *s, uint64_t req_id);
/* truncate-oldest: remove tokens [keep, keep + drop) of an idle session's
 * history and give up its KV (the next turn recomputes the rest, the kept
 * head through the prefix cache). -ENOENT; -EBUSY while a turn runs;
 * -EINVAL for drop 0 or a range past the history. */
int kvd_sched_session_truncate(struct kvd_sched *s, uint64_t session, uint32_t keep, uint32_t drop);
/* Drop a session and its pages. -ENOENT, -EBUSY while a request uses it. */
int kvd_sched_session_close(struct kvd_sched *s, uint64_t session);
/* Tokens a session holds (history a next turn continues), or -ENOENT when
 * the scheduler keeps nothing under that id. */
int kvd_sched_session_tokens(const struct kvd_sched *s, uint64_t session);
/* The session is in use now (a turn is on its way): its idle time starts
 * again. 0, or -ENOENT when the scheduler keeps nothing under that id. */
int kvd_sched_session_touch(struct kvd_sched *s, uint64_t session);
/* The session's last token (what ended the previous turn), -ENOENT. */
int kvd_sched_session_last_token(const struct kvd_sched *s, uint64_t session);
/* Apply new limits (SIGHUP). max_model_len may only shrink below the
 * model's context; running requests keep what they were admitted with. */
void kvd_sched_set_config(struct kvd_sched *s, const struct kvd_sched_config *cfg);

/* Run one step. Returns the number of sequences that advanced (0: idle),
 * or a negative errno for an engine failure (affected requests finish with
 * ERROR; the scheduler stays usable). */
int kvd_sched_step(struct kvd_sched *s);
/* True when nothing is queued or running. */
int kvd_sched_idle(const struct kvd_sched *s);
void kvd_sched_get_stats(const struct kvd_sched *s, struct kvd_sched_stats *ret);
/* Close the idle sessions unused for longer than their idle time (the
 * request's session_idle_s, else the config's; 0 for both: never), by the
 * events' clock: their pages and tokens go and on_session_expired is
 * called for each. A session with a turn running is never idle. Returns
 * how many were closed. Call from the main loop now and then. */
int kvd_sched_expire_sessions(struct kvd_sched *s);

/* Walk live requests (for `kvctl ps`). */
struct kvd_sched_req_info {
	uint64_t req_id;
	uint64_t session;
	int state;               /* 0 waiting, 1 prefill, 2 decode, 3 swapped */
	uint32_t prompt_tokens, cached_tokens, generated_tokens, max_tokens, kv_tokens;
	uint32_t pages, pages_shared;
	uint64_t age_ns;
	uint32_t sample;         /* one entry per sample of a request, once forked */
};
size_t kvd_sched_list(const struct kvd_sched *s, struct kvd_sched_req_info *out, size_t cap);

#endif
