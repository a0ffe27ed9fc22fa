/*
 * daemon/server_impl.h — what the files of the server share (server.c,
 * conn.c, stream.c, handlers.c, session.c, admin.c): its limits, its
 * objects and the functions one file calls in another. Private to daemon/;
 * everyone else uses server.h.
 *
 * Objects and their lifetimes:
 *   client   one connection: its socket, its shared-memory channel, its
 *            requests, its text uploads (a FIFO in socket-frame order, as the
 *            protocol fixes) and its sessions. Freed at the end of the epoll
 *            batch in which it closed, so no event of the same batch can
 *            reach freed memory.
 *   greq     one GENERATE, from the frame to its terminal ring record. Its
 *            address is its id in the scheduler (unique while it lives, and
 *            it lives until the scheduler's on_done). Tokens the scheduler
 *            produces are queued on it and pushed when the ring has room, so
 *            a slow reader only gets bigger TOKEN records, never a stall of
 *            the others. When its client goes away it is cancelled at once
 *            (its pages are freed by kvd_sched_cancel) and freed.
 *   session  a conversation whose KV the scheduler keeps between turns;
 *            owned by the user (uid) that opened it, not by a connection, so
 *            one-shot clients can continue it; closed on request or after
 *            its idle timeout. A turn whose client goes away is cancelled,
 *            and the session stays as it was before that turn.
 */
#ifndef KVD_SERVER_IMPL_H
#define KVD_SERVER_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "hist.h"
#include "ipc.h"
#include "ledger.h"
#include "sched.h"
#include "server.h"

#define SRV_MAX_EVENTS       64
/*
 * Fairness between the control plane and the streams. One loop turn runs
 * one scheduler step, which moves every running stream by one token, so
 * whatever else a turn does delays every stream. Per client and turn, at
 * most SRV_TURN_FRAMES socket frames and SRV_TURN_BYTES of them are
 * handled, and SRV_TURN_CLIENT_NS of work, busy or not, so a newcomer's
 * HELLO or GENERATE waits at most that much per flooding connection even
 * while no stream runs; the sockets of a turn are read least recently
 * read first (sort_events), so no connection waits behind the same others
 * turn after turn. And while
 * the scheduler has work, the time a client's frames cost is charged
 * against a share of the step time, kept per user (uid: all of a user's
 * connections draw on one account, struct user_share): after each step
 * every user earns SRV_CTL_SHARE_PERMILLE/1000 of the step's duration, and
 * a user whose frames have cost more than it earned (plus SRV_CTL_BURST_NS
 * it may run ahead) is not read until it has earned that back. So one user
 * flooding TOKENIZE (or anything else), over any number of connections,
 * adds at most about that share to each stream's time per token; an idle
 * scheduler throttles nobody, and a user sending the odd request never
 * waits, since it has no debt.
 */
#define SRV_TURN_FRAMES        16
#define SRV_TURN_BYTES         (256u << 10)
#define SRV_TURN_CLIENT_NS     1000000ull      /* 1 ms of control work per client and turn */
#define SRV_CTL_SHARE_PERMILLE 30              /* 3% of the step time per user */
#define SRV_CTL_BURST_NS       10000000ull     /* 10 ms a client may run ahead */
#define SRV_STATUS_NS        1000000000ull
#define SRV_EXPIRE_NS        1000000000ull
#define SRV_FINAL_FLUSH_NS   2000000000ull /* after cancelling on shutdown, wait this long for rings */
#define SRV_SNDBUF_BYTES     (1 << 20)
#define SRV_GRAM_CACHE_ENTRIES 64          /* compiled constraints kept (by content) */
#define SRV_GRAM_CACHE_BYTES   (64u << 20) /* and their bytes at most */
#define SRV_MAX_GROUPS       256
#define SRV_MAX_SESSIONS_PER_USER 256
#define SRV_MAX_QUEUED_UPLOADS 64 /* ring uploads a client may announce ahead */
/* Ring uploads (texts over the inline limit) are tokenized by the worker
 * (tokwork.h), so a megabyte of text never stalls the loop. A user has at
 * most this many texts with it at once; its further uploads wait unread in
 * its ring (client.tok_wait) until one comes back. */
#define SRV_TOKW_USER_JOBS   2
#define SRV_HELLO_TIMEOUT_NS 10000000000ull /* a connection must say HELLO this soon */
#define SRV_LINGER_NS        1000000000ull  /* a refused connection stays open this long for its ERROR */
#define SRV_MAX_LINGERING    64 /* refused connections kept lingering at once; beyond, closed at once */

enum src_kind { SRC_LISTEN = 1, SRC_SIGNAL, SRC_SOCK, SRC_CHAN, SRC_TOKW };

struct ep_src {
	enum src_kind kind;
	void *p;
};

struct client;
struct session;

/* GR_TOKENIZING: its prompt is with the tokenizer worker (job tok_seq) */
enum greq_state { GR_UPLOADING, GR_TOKENIZING, GR_SCHED };

struct tok_ent {
	int32_t id;
	uint32_t text_bytes;
};

struct gtok {
	int32_t id;
	uint32_t text_bytes;
	uint32_t lp_bytes;            /* its log-probability entries (in gsample.lp) */
};

/* One sample's stream of a request that streams with IPC_F_SAMPLE
 * (samples or log-probabilities; see "Samples" in ipc/ipc.h). */
struct gsample {
	struct kvd_request *rq;       /* its text (stop strings, detokenizer) */
	struct gtok *toks;
	uint32_t n_toks, cap_toks, n_sent;
	char *text;
	uint32_t text_bytes, text_cap;
	uint8_t *lp;                  /* queued tokens' log-probability entries, in order */
	size_t lp_bytes, lp_cap;
	bool finished, done_sent;
	struct ipc_done done;
	struct ipc_done_spec done_spec;
};
struct gsamples {
	uint32_t n, n_done;
	bool logprobs;
	uint32_t top_logprobs;
	struct gsample s[];
};

struct greq {
	struct greq *next, *prev;     /* the client's requests, oldest first */
	struct client *c;             /* NULL once the client is gone */
	uint64_t id;                  /* the client's request id */
	enum greq_state state;
	struct ipc_generate g;
	char *system;                 /* NUL-terminated copy */
	char *stop_buf;
	const char *stops[IPC_MAX_STOP_STRINGS];
	struct session *sess;
	struct kvd_ledger_who who;    /* the requester, as admitted (outlives c) */
	struct kvd_request *rq;       /* its text stream, from submit on */
	bool cancel_on_upload;        /* CANCEL arrived while uploading or tokenizing */
	uint64_t tok_seq;             /* GR_TOKENIZING: the worker's job for it */
	bool shutdown;                /* ended by the daemon's shutdown */
	uint64_t closed_session;      /* its session (this id) was closed while it ran: ends with ERROR */
	uint64_t t_recv, t_submit;
	/* stream, queued until the ring takes it */
	struct tok_ent *toks;
	uint32_t n_toks, cap_toks, n_sent;
	char *text;
	uint32_t text_bytes, text_cap;
	bool finished;                /* on_done seen: `done` is the terminal record */
	struct ipc_done done;
	struct ipc_done_spec done_spec; /* sent after done (IPC_F_SPEC) to clients of IPC_SPEC_VERSION */
	struct gsamples *xs;          /* IPC_F_SAMPLE stream (samples.c); NULL: the plain one above */
	/* context policy (ctxpolicy.c): the request's block, else its session's */
	struct ipc_gen_context ctx;
	struct ipc_gen_tenant tenant; /* with IPC_GEN_TENANT: narrows its cache scope */
	int32_t priority;             /* IPC_GEN_PRIORITY's, else 0 */
	uint32_t turn_start;          /* session turns: history tokens before this turn */
	uint32_t head_tokens;         /* a first turn: tokens truncate-oldest keeps */
	uint32_t trunc_turns, trunc_tokens; /* what truncate-oldest removed for it */
	struct ipc_gen_constraint cons; /* with IPC_GEN_CONSTRAINT (kind 0: none) */
	char *cons_text;              /* its text (cons.text_bytes; NULL for 0), until the worker takes it */
};

enum upload_kind { UP_GENERATE, UP_TOKENIZE, UP_DISCARD };

struct upload {
	struct upload *next;
	enum upload_kind kind;
	uint64_t req_id;
	uint32_t total, got;
	char *buf;                    /* total + 1 bytes (NUL-terminated) */
	struct greq *gr;              /* UP_GENERATE */
	uint32_t tok_flags;           /* UP_TOKENIZE */
	int32_t err_code;             /* UP_DISCARD: the ERROR to send once consumed */
	char err_msg[256];
};

struct session {
	struct session *next;         /* the server's sessions */
	uint64_t id;
	uint32_t idle_timeout_s;
	uint64_t last_used_ns;
	uint32_t turns;               /* completed turns */
	struct greq *busy;            /* a turn in flight */
	uid_t owner;                  /* SO_PEERCRED uid of the client that opened it */
	uint64_t opener;              /* id of the connection that opened it */
	struct ipc_gen_context ctx;   /* the session's context policy (SESSION_OPEN) */
	bool ctx_set;                 /* opened with one; else the server's default */
	uint32_t head_tokens;         /* history tokens truncate-oldest always keeps
	                               * (up to the end of the system prompt) */
	uint32_t *turn_start;         /* history offset where each completed turn began */
	uint32_t n_turn_start, cap_turn_start;
};

/* One user's (uid's) share of the event loop: all its connections draw on
 * one account, so opening more connections buys no more loop time. */
struct user_share {
	struct user_share *next;
	uid_t uid;
	uint32_t refs;                /* connections pointing here */
	uint64_t ctl_until;           /* control time used, on srv->ctl_earned_ns's scale */
};

/* What one uid's own requests got from the prefix cache: STATS shows these,
 * not the machine's, to a client that is not an admin. Kept for up to
 * SRV_MAX_USER_COUNTERS uids (later ones count nothing) for the daemon's
 * life, so they do not reset when a user's last connection closes. */
#define SRV_MAX_USER_COUNTERS 4096
struct user_counters {
	uid_t uid;
	uint64_t prefix_lookups, prefix_query_tokens, prefix_hit_tokens;
	uint64_t adopted_hit_tokens; /* of prefix_hit_tokens: on pages adopted from an earlier run */
	/* speculative decoding of its finished requests (ipc_spec.h's STATS counters) */
	uint64_t spec_verify_steps, spec_drafted_tokens, spec_accepted_tokens;
	uint64_t spec_runs[KVD_SPEC_RUN_BUCKETS];
};

struct client {
	struct client *next, *prev;
	struct kvd_server *srv;
	struct ep_src sock_src, chan_src;
	int fd;
	uint64_t id;
	struct ipc_peer_cred cred;
	struct ipc_chan *chan;
	bool welcomed;
	bool closing;
	bool lingering;               /* sent a connection ERROR; closing soon */
	bool admitted;                /* holds one of the max_clients slots */
	bool admin;                   /* root or a member of server.admin_groups */
	uint64_t t_accept;
	uint32_t client_version;      /* HELLO's */
	uint64_t last_active_ns;      /* last frame received (idle timeout) */
	struct user_share *share;     /* its user's share of the loop (fairness) */
	bool sock_paused;             /* over its share: socket out of epoll's read set */
	bool up_paused;               /* over its share: its upload ring is not read (resume_paused) */
	bool tok_wait;                /* its user has SRV_TOKW_USER_JOBS texts with the worker: ring not read */
	uint64_t turn;                /* the loop turn turn_ns counts; last turn it was read */
	uint64_t turn_ns;             /* control time used in that turn */
	uint64_t linger_deadline;
	struct greq *reqs, *reqs_tail;
	uint32_t n_inflight;
	struct upload *up_head, *up_tail;
	uint32_t n_uploads;
	uint32_t tx_need;             /* payload bytes of the record that did not fit; 0: none */
	bool dirty;
	struct client *dirty_next;
	struct client *free_next;
};

struct kvd_server {
	struct kvd_config cfg;
	struct kvd_engine *e;
	struct kvmm *kv;
	const struct kvd_tokenizer *tok;
	struct kvd_sched *sched;
	struct kvd_server_hooks hooks;
	int ep;
	int listen_fd;
	int sig_fd;
	struct ep_src listen_src, sig_src, tokw_src;
	struct kvd_tokwork *tokw;     /* the tokenizer worker (tokwork.h) */
	/* constraints (grammar.h): compiled on the worker, through one cache
	 * by content; the model's vocabulary as the matcher sees it, built
	 * once at start (NULL: the model's tokenizer could not give one, and
	 * constrained requests are refused) */
	struct kvd_gram_cache *gram_cache;
	struct kvd_gram_vocab *gram_vocab;
	uint64_t next_tok_seq;
	struct client *clients;
	uint32_t n_clients;           /* every connection, lingering ones too */
	uint32_t n_admitted;          /* connections holding a slot */
	uint32_t n_lingering;
	uint64_t ctl_earned_ns;       /* control time each client has earned (fairness) */
	uint32_t n_paused;            /* clients with sock_paused, and with up_paused */
	uint64_t turn;                /* loop turns so far */
	struct user_share *shares;    /* one per uid with a connection */
	struct client *dirty;
	struct client *to_free;
	uint64_t next_client_id, next_session_id;
	struct session *sessions;     /* owned by users, not connections */
	uint32_t n_sessions;
	uint32_t n_uploading;
	uint32_t n_ctx;
	void *rxbuf;                  /* IPC_MAX_FRAME_BYTES, 8-aligned */
	struct kvd_ledger *ledger;
	/* counters */
	uint64_t t_start;
	uint64_t requests_rejected;
	uint64_t prompt_tokens_total, generated_tokens_total;
	struct user_counters *ucount; /* per-uid prefix-cache counters (admin.c) */
	uint32_t n_ucount, cap_ucount;
	struct kvd_hist ttft;         /* GENERATE received -> first token, per request that produced one */
	/* systemd */
	uint64_t watchdog_ns, next_watchdog, next_status, next_expire;
	char last_status[256];
	uint64_t accept_paused_until; /* 0: accepting */
	/* shutdown */
	bool stopping, cancelled_all;
	/* fault injection for tests (kvd_server_hooks.fault_peercred) */
	bool fault_peercred;
	uint32_t server_version; /* WELCOME's: KVD_VERSION_NUM, or the test build's fault_server_version */
	uint64_t drain_deadline, final_deadline;
};

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- conn.c: connections ------------------------------------------------- */
int ep_add(struct kvd_server *srv, int fd, struct ep_src *src);
int sock_send(struct client *c, uint16_t type, uint32_t flags, uint64_t rid, const void *p, size_t n);
/* sock_send() passing fds (SCM_RIGHTS; still the caller's). */
int sock_send_fds(struct client *c, uint16_t type, uint32_t flags, uint64_t rid, const void *p, size_t n,
		  const int *fds, unsigned n_fds);
void sock_error(struct client *c, uint64_t rid, int32_t code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
bool peer_allowed(struct kvd_server *srv, int fd, const struct ipc_peer_cred *cr);
bool peer_is_admin(struct kvd_server *srv, int fd, const struct ipc_peer_cred *cr);
void handle_accept(struct kvd_server *srv);
void client_linger(struct client *c, const char *why);
void client_close(struct client *c, const char *why);
void free_closed(struct kvd_server *srv);
void resume_paused(struct kvd_server *srv);
/* Has the client's user used its share of the step time? (busy: the
 * scheduler has work; an idle one throttles nobody) */
bool client_throttled(const struct client *c, bool busy);
/* Charge a client (and its user) for work done for it that took cost_ns:
 * socket frames, and what its ring uploads cost (copying, rendering,
 * tokenizing). */
void client_charge(struct client *c, uint64_t cost_ns, bool busy);
void handle_sock(struct client *c, uint32_t events);

/* ---- stream.c: the stream back to clients, uploads ----------------------- */
struct greq *greq_free(struct greq *gr);
void greq_unlink(struct client *c, struct greq *gr);
struct greq *greq_find(struct client *c, uint64_t id);
enum kvd_token_verdict on_token(void *ud, uint64_t req_id, int32_t token, enum kvd_finish ending);
int sched_is_eog(void *ud, int32_t token);
void on_done(void *ud, uint64_t req_id, const struct kvd_request_result *res);
void client_service(struct client *c);
void client_mark_dirty(struct client *c);
void flush_dirty(struct kvd_server *srv);

/* ---- handlers.c: GENERATE, CANCEL, TOKENIZE ------------------------------ */
void upload_free(struct upload *u);
void upload_done(struct client *c);
void handle_generate(struct client *c, const struct ipc_frame *f);
void handle_cancel(struct client *c, uint64_t rid);
void handle_tokenize(struct client *c, const struct ipc_frame *f);
/* Take the tokenizer worker's completed jobs: charge each one's CPU time
 * to its owner (the client, else its user's share if it still has one),
 * continue its GENERATE or send its TOKENIZE reply when the request is
 * still there, and let its user's waiting uploads go on. */
void tokw_collect(struct kvd_server *srv);

/* ---- samples.c: the IPC_F_SAMPLE stream (samples, log-probabilities) ------ */
/* Requests in flight a GENERATE counts as against max_requests_per_client:
 * one per sample. */
uint32_t greq_weight(const struct ipc_generate *g);
/* Give gr its per-sample streams when its GENERATE asks for them (0, -ENOMEM,
 * or kvd_request_new's error). */
int gsamples_setup(struct kvd_server *srv, struct greq *gr);
void gsamples_free(struct gsamples *xs);
enum kvd_token_verdict on_sample_token(void *ud, uint64_t req_id, const struct kvd_token_event *ev);
/* greq_flush for a request with xs: same contract. */
int samples_flush(struct client *c, struct greq *gr);

/* ---- session.c: sessions and timeouts ------------------------------------ */
void session_free(struct kvd_server *srv, struct session *s);
/* ctxpolicy.c: context policies of requests and sessions */
void ctx_request_params(const struct greq *gr, struct kvd_request_params *p);
void ctx_server_default(const struct kvd_server *srv, struct ipc_gen_context *ret);
uint32_t ctx_first_turn_head(struct kvd_server *srv, const char *system, const int32_t *ids, uint32_t n);
int ctx_truncate_oldest(struct kvd_server *srv, struct greq *gr, uint32_t *hist, uint64_t need, char *why,
			size_t why_cap);
void ctx_turn_done(struct session *s, const struct greq *gr);
const char *ctx_refusal(struct kvd_server *srv, const struct greq *gr, int r, char *buf, size_t cap);
void handle_session_open(struct client *c, const struct ipc_frame *f);
void handle_session_close(struct client *c, const struct ipc_frame *f);
void expire_sessions(struct kvd_server *srv, uint64_t t);
void on_session_expired(void *ud, uint64_t session);

/* ---- admin.c: STATS, PS, KVMAP, HIST, LEDGER ------------------------------ */
/* STATS as client c may see it: the pool and the scheduler for everyone; the
 * prefix-cache counters machine-wide for an admin, else the caller's uid's
 * own (user_counters), so no one learns from them whether another user's
 * prompts hit the cache. */
void fill_stats(struct kvd_server *srv, const struct client *c, struct ipc_stats *st);
/* Count a finished request's prompt and cache hit for its uid. */
void user_counters_add(struct kvd_server *srv, uid_t uid, uint64_t query_tokens, uint64_t hit_tokens,
		       uint64_t adopted_hit_tokens);
/* ... and its speculative decoding (drafted, accepted, acceptance runs). */
void user_counters_add_spec(struct kvd_server *srv, uid_t uid, const struct kvd_request_result *res);
void handle_ps(struct client *c, uint64_t rid);
void handle_kvmap(struct client *c, uint64_t rid);
void handle_hist(struct client *c, uint64_t rid);
void handle_ledger(struct client *c, const struct ipc_frame *f);
/* CACHE: administrators only (IPC_ERR_DENIED otherwise); runs the server's
 * cache hook and replies CACHE_REPLY, or an ERROR with the hook's reason. */
void handle_cache(struct client *c, const struct ipc_frame *f);

#endif
