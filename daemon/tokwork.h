/*
 * daemon/tokwork.h — the tokenizer worker: one thread that turns long
 * texts (prompts and TOKENIZE texts that came through the upload ring) into
 * tokens, so that a megabyte of text never stalls the event loop and with
 * it every other user's stream.
 *
 * The tokenizer is read-only after load (each call owns its scratch
 * memory), so the worker shares it with the loop without a lock. A job
 * carries everything it needs — its text, its system prompt, its flags —
 * and names its request by ids (connection id, request id, a sequence
 * number), never by pointer: the connection or the request may be gone
 * when the job completes, and the loop looks them up again then.
 *
 * Jobs wait in one queue per owner (uid), served round robin, so one
 * user's backlog delays another user's text by at most one job. How many
 * jobs an owner may have out is the caller's rule; kvd_tokwork_owner_jobs
 * says how many it has. Completed jobs come back on a list the loop takes
 * when the worker's eventfd (kvd_tokwork_fd) is readable.
 *
 * Threads: every function but kvd_tokwork_run is for the loop's thread
 * alone; the queue and the done list are guarded by the worker's mutex,
 * taken inside these functions.
 */
#ifndef KVD_TOKWORK_H
#define KVD_TOKWORK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvd_tokenizer;
struct kvd_tokwork;
struct kvd_grammar;
struct kvd_gram_cache;

enum tokw_kind {
	TOKW_RAW,        /* kvd_request_tokenize: GENERATE with IPC_GEN_RAW, and TOKENIZE */
	TOKW_CHAT_TURN,  /* kvd_request_chat_turn over system + text */
	TOKW_CHAT_TURNS, /* kvd_request_chat_turns: text is the list of turns */
};

/* Nothing stops the tokenizer early. */
#define TOKW_NO_BOUND SIZE_MAX

struct tokw_job {
	struct tokw_job *next;
	/* set by the submitter */
	uint64_t owner;               /* fairness key (uid) */
	uint64_t client_id, req_id, seq;
	bool tokenize;                /* a TOKENIZE (else a GENERATE's prompt) */
	enum tokw_kind kind;
	char *text;                   /* NUL-terminated; owned by the job */
	size_t len;
	char *system;                 /* TOKW_CHAT_TURN; owned by the job (may be NULL) */
	bool add_bos, parse_special, continuation;
	int32_t last_token;           /* TOKW_CHAT_TURN continuation */
	uint32_t tok_flags;           /* TOKENIZE's */
	size_t stop_after;            /* stop once more tokens than this (TOKW_NO_BOUND: never) */
	/* A GENERATE's constraint, compiled after its prompt is tokenized
	 * (through gram_cache, which is thread safe): cons_kind 0 for none. */
	uint32_t cons_kind;           /* enum kvd_grammar_kind */
	char *cons_text;              /* cons_len bytes (may be NULL for 0); owned by the job */
	size_t cons_len;
	struct kvd_gram_cache *gram_cache; /* borrowed */
	/* set by kvd_tokwork_run */
	int n;                        /* tokens, or a negative errno */
	bool stopped;                 /* stopped early: n > stop_after, and the text has more */
	int32_t *ids;                 /* n ids; owned by the job */
	char why[256];                /* the chat kinds' reason when n < 0 */
	struct kvd_grammar *grammar;  /* the compiled constraint (a reference; owned by the job) */
	int gram_rc;                  /* 0, or kvd_grammar_compile's error */
	int gram_hit;                 /* it came from the cache */
	char gram_why[384];           /* the compiler's message when gram_rc < 0 */
	uint64_t cpu_ns;              /* the worker thread's CPU time for it */
};

/* Accepts NULL; frees text, system, ids and cons_text too and drops the
 * grammar's reference; returns NULL. */
struct tokw_job *tokw_job_free(struct tokw_job *j);

/* Tokenize j on the calling thread (any thread: the tokenizer is
 * read-only): sets j->n, j->stopped, j->ids, j->why (not j->cpu_ns); then,
 * when the prompt is usable and j has a constraint, compiles it: j->grammar
 * or j->gram_rc and j->gram_why. */
void kvd_tokwork_run(const struct kvd_tokenizer *tok, struct tokw_job *j);

/* Start the worker over tok (borrowed; must outlive it). Returns 0,
 * -ENOMEM, or a negative errno from eventfd or pthread_create; *ret
 * untouched on failure. */
int kvd_tokwork_new(const struct kvd_tokenizer *tok, struct kvd_tokwork **ret);

/* Stop and join the worker (a job it is running is finished first) and
 * free every job still queued or done. Accepts NULL; returns NULL. */
struct kvd_tokwork *kvd_tokwork_free(struct kvd_tokwork *w);

/* The eventfd that becomes readable when jobs have completed. */
int kvd_tokwork_fd(const struct kvd_tokwork *w);

/* Queue j (ownership moves to the worker until kvd_tokwork_take_done
 * gives it back). Returns 0, or -ENOMEM (j stays the caller's). */
int kvd_tokwork_submit(struct kvd_tokwork *w, struct tokw_job *j);

/* The completed jobs, oldest first, as a list through ->next (the caller
 * frees them with tokw_job_free); NULL when none. Clears the eventfd. */
struct tokw_job *kvd_tokwork_take_done(struct kvd_tokwork *w);

/* Jobs of owner submitted and not yet taken back. */
uint32_t kvd_tokwork_owner_jobs(struct kvd_tokwork *w, uint64_t owner);

#endif
