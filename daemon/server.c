/*
 * daemon/server.c — the epoll loop, client connections and sessions.
 *
 * Everything runs on one thread. The loop alternates: look at the sockets
 * (epoll_wait with timeout 0 while the scheduler has work, blocking when it
 * has none), then one scheduler step, then push what the step produced into
 * the clients' rings. A client therefore never waits more than one step for
 * its control messages to be answered.
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
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "engine.h"
#include "ipc.h"
#include "kvmm.h"
#include "ledger.h"
#include "log.h"
#include "model.h"
#include "request.h"
#include "sched.h"

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
#define SRV_MAX_GROUPS       256
#define SRV_MAX_SESSIONS_PER_USER 256
#define SRV_MAX_QUEUED_UPLOADS 64 /* ring uploads a client may announce ahead */
#define SRV_HELLO_TIMEOUT_NS 10000000000ull /* a connection must say HELLO this soon */
#define SRV_LINGER_NS        1000000000ull  /* a refused connection stays open this long for its ERROR */
#define SRV_MAX_LINGERING    64 /* refused connections kept lingering at once; beyond, closed at once */

enum src_kind { SRC_LISTEN = 1, SRC_SIGNAL, SRC_SOCK, SRC_CHAN };

struct ep_src {
	enum src_kind kind;
	void *p;
};

struct client;
struct session;

enum greq_state { GR_UPLOADING, GR_SCHED };

struct tok_ent {
	int32_t id;
	uint32_t text_bytes;
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
	bool cancel_on_upload;        /* CANCEL arrived while uploading */
	bool shutdown;                /* ended by the daemon's shutdown */
	uint64_t t_recv, t_submit;
	/* stream, queued until the ring takes it */
	struct tok_ent *toks;
	uint32_t n_toks, cap_toks, n_sent;
	char *text;
	uint32_t text_bytes, text_cap;
	bool finished;                /* on_done seen: `done` is the terminal record */
	struct ipc_done done;
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
};

/* One user's (uid's) share of the event loop: all its connections draw on
 * one account, so opening more connections buys no more loop time. */
struct user_share {
	struct user_share *next;
	uid_t uid;
	uint32_t refs;                /* connections pointing here */
	uint64_t ctl_until;           /* control time used, on srv->ctl_earned_ns's scale */
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
	uint64_t last_active_ns;      /* last frame received (idle timeout) */
	struct user_share *share;     /* its user's share of the loop (fairness) */
	bool sock_paused;             /* over its share: socket out of epoll's read set */
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
	struct ep_src listen_src, sig_src;
	struct client *clients;
	uint32_t n_clients;           /* every connection, lingering ones too */
	uint32_t n_admitted;          /* connections holding a slot */
	uint32_t n_lingering;
	uint64_t ctl_earned_ns;       /* control time each client has earned (fairness) */
	uint32_t n_paused;            /* clients with sock_paused */
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
	/* systemd */
	uint64_t watchdog_ns, next_watchdog, next_status, next_expire;
	char last_status[256];
	uint64_t accept_paused_until; /* 0: accepting */
	/* shutdown */
	bool stopping, cancelled_all;
	/* fault injection for tests (KVD_TEST_FAULTS, builds without NDEBUG) */
	bool fault_peercred;
	uint64_t drain_deadline, final_deadline;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void client_close(struct client *c, const char *why);
static void client_linger(struct client *c, const char *why);
static void client_unadmit(struct client *c);
static void client_mark_dirty(struct client *c);
static void tokenize_reply(struct client *c, uint64_t rid, uint32_t flags, const char *text, size_t len);

/* ---- small helpers -------------------------------------------------------- */

static int ep_add(struct kvd_server *srv, int fd, struct ep_src *src)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = src };
	return epoll_ctl(srv->ep, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/* A reply on the socket. A client whose socket buffer is full is not
 * reading its replies; it is dropped rather than let it stall the loop. */
static int sock_send(struct client *c, uint16_t type, uint32_t flags, uint64_t rid, const void *p, size_t n)
{
	int r = ipc_send_nowait(c->fd, type, flags, rid, p, n, NULL, 0);
	if (r == -EAGAIN)
		client_close(c, "socket buffer full (client does not read its replies)");
	else if (r < 0 && r != -EPIPE && r != -ECONNRESET)
		log_debug("client %" PRIu64 ": send: %s", c->id, strerror(-r));
	return r;
}

static void sock_error(struct client *c, uint64_t rid, int32_t code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void sock_error(struct client *c, uint64_t rid, int32_t code, const char *fmt, ...)
{
	char msg[IPC_MAX_ERROR_MSG_BYTES];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (!ipc_error_code_valid(code))
		code = -EIO;
	log_debug("client %" PRIu64 " (pid %d): request %" PRIu64 ": error %d: %s", c->id, (int)c->cred.pid, rid,
		  (int)code, msg);
	if (c->fd >= 0 && !c->closing && !c->lingering) {
		int r = ipc_send_error_nowait(c->fd, rid, code, msg);
		if (r == -EAGAIN)
			client_close(c, "socket buffer full");
	}
}

/* ---- requests -------------------------------------------------------------- */

static struct greq *greq_free(struct greq *gr)
{
	if (!gr)
		return NULL;
	if (gr->sess && gr->sess->busy == gr)
		gr->sess->busy = NULL; /* a turn that never reached the scheduler */
	free(gr->system);
	free(gr->stop_buf);
	kvd_request_free(gr->rq);
	free(gr->toks);
	free(gr->text);
	free(gr);
	return NULL;
}

static void greq_unlink(struct client *c, struct greq *gr)
{
	if (gr->prev)
		gr->prev->next = gr->next;
	else
		c->reqs = gr->next;
	if (gr->next)
		gr->next->prev = gr->prev;
	else
		c->reqs_tail = gr->prev;
	gr->next = gr->prev = NULL;
	c->n_inflight--;
}

static struct greq *greq_find(struct client *c, uint64_t id)
{
	for (struct greq *gr = c->reqs; gr; gr = gr->next)
		if (gr->id == id)
			return gr;
	return NULL;
}

static enum ipc_finish finish_to_ipc(enum kvd_finish f)
{
	switch (f) {
	case KVD_FINISH_EOS: return IPC_FINISH_EOS;
	case KVD_FINISH_LENGTH: return IPC_FINISH_LENGTH;
	case KVD_FINISH_STOP: return IPC_FINISH_STOP;
	case KVD_FINISH_CANCELLED: return IPC_FINISH_CANCELLED;
	default: return IPC_FINISH_ERROR;
	}
}

static enum kvd_token_verdict on_token(void *ud, uint64_t req_id, int32_t token, enum kvd_finish ending)
{
	struct greq *gr = (struct greq *)(uintptr_t)req_id;
	const char *text;
	size_t len;
	enum kvd_token_verdict v = kvd_request_token(gr->rq, token, ending, &text, &len);
	(void)ud;

	if (!gr->c)
		return v;
	if (gr->n_toks == gr->cap_toks) {
		uint32_t cap = gr->cap_toks ? gr->cap_toks * 2 : 16;
		struct tok_ent *t = realloc(gr->toks, cap * sizeof(*t));
		if (!t)
			goto oom;
		gr->toks = t;
		gr->cap_toks = cap;
	}
	if (!gr->text || gr->text_bytes + len > gr->text_cap) { /* never NULL once a token is queued */
		uint32_t cap = gr->text_cap ? gr->text_cap : 256;
		while (cap < gr->text_bytes + len)
			cap *= 2;
		char *t = realloc(gr->text, cap);
		if (!t)
			goto oom;
		gr->text = t;
		gr->text_cap = cap;
	}
	if (len)
		memcpy(gr->text + gr->text_bytes, text, len);
	gr->text_bytes += (uint32_t)len;
	gr->toks[gr->n_toks++] = (struct tok_ent){ token, (uint32_t)len };
	client_mark_dirty(gr->c);
	return v;
oom:
	log_error("out of memory queueing a token for client %" PRIu64, gr->c->id);
	return v;
}

static int sched_is_eog(void *ud, int32_t token)
{
	struct kvd_server *srv = ud;
	return kvd_request_is_eog(srv->tok, token);
}

static const char *finish_name(enum kvd_finish f)
{
	return ipc_finish_name(finish_to_ipc(f));
}

static void on_done(void *ud, uint64_t req_id, const struct kvd_request_result *res)
{
	struct kvd_server *srv = ud;
	struct greq *gr = (struct greq *)(uintptr_t)req_id;
	uint64_t t = now_ns();
	uint64_t pre = gr->t_submit - gr->t_recv; /* upload and tokenization */

	kvd_ledger_request(srv->ledger, &gr->who, gr->id, gr->sess ? gr->sess->id : 0, finish_name(res->finish), res);
	srv->prompt_tokens_total += res->prompt_tokens;
	srv->generated_tokens_total += res->generated_tokens;
	if (gr->sess) {
		struct session *s = gr->sess;
		s->busy = NULL;
		s->last_used_ns = t;
		/* a cancelled or failed turn leaves the session as it was */
		if (res->finish != KVD_FINISH_CANCELLED && res->finish != KVD_FINISH_ERROR)
			s->turns++;
		gr->sess = NULL; /* the session may go before this request's last record */
	}
	gr->finished = true;
	gr->done = (struct ipc_done){
		.finish_reason = finish_to_ipc(res->finish),
		.error = res->finish == KVD_FINISH_ERROR ? (ipc_error_code_valid(res->error) ? res->error : IPC_ERR_ENGINE) : 0,
		.prompt_tokens = res->prompt_tokens,
		.cached_tokens = res->cached_tokens,
		.generated_tokens = res->generated_tokens,
		.queue_ns = res->queue_ns + pre,
		.ttft_ns = res->ttft_ns ? res->ttft_ns + pre : 0,
		.decode_ns = res->decode_ns,
		.total_ns = t - gr->t_recv,
	};
	if (res->finish == KVD_FINISH_ERROR)
		log_warning("request %" PRIu64 " of client %" PRIu64 " failed: %s", gr->id, gr->c ? gr->c->id : 0,
			    strerror(-res->error));
	else
		log_debug("request %" PRIu64 " of client %" PRIu64 ": %s; prompt %u tokens (%u cached), %u generated, "
			  "ttft %.1f ms, %.1f tokens/s, %u preemptions",
			  gr->id, gr->c ? gr->c->id : 0, finish_name(res->finish), res->prompt_tokens, res->cached_tokens,
			  res->generated_tokens, (double)gr->done.ttft_ns / 1e6,
			  res->decode_ns && res->generated_tokens > 1
				  ? (double)(res->generated_tokens - 1) * 1e9 / (double)res->decode_ns
				  : 0.0,
			  res->preemptions);
	if (!gr->c) {
		greq_free(gr);
		return;
	}
	client_mark_dirty(gr->c);
}

/* ---- pushing the stream into a client's ring ------------------------------ */

/* Push what is queued for gr. Returns 1 when all of it went (and gr was
 * freed if it finished), 0 when the ring is full (c->tx_need set), or a
 * negative errno for a broken ring. */
static int greq_flush(struct client *c, struct greq *gr)
{
	bool want_ids = gr->g.gen_flags & IPC_GEN_WANT_IDS;
	int32_t ids[IPC_MAX_TOKENS_PER_RECORD];
	uint32_t text_off = 0, i = 0;
	int r = 0;

	while (i < gr->n_toks) {
		uint32_t k = 0, tb = 0;
		while (i + k < gr->n_toks && k < IPC_MAX_TOKENS_PER_RECORD &&
		       tb + gr->toks[i + k].text_bytes <= IPC_MAX_TOKEN_TEXT_BYTES) {
			ids[k] = gr->toks[i + k].id;
			tb += gr->toks[i + k].text_bytes;
			k++;
		}
		r = ipc_chan_send_token(c->chan, gr->id, gr->n_sent, k, want_ids ? ids : NULL, want_ids ? k : 0,
					gr->text + text_off, tb);
		if (r == -EAGAIN) {
			c->tx_need = (uint32_t)(sizeof(struct ipc_token) + (want_ids ? 4u * k : 0) + tb);
			break;
		}
		if (r < 0)
			return r;
		gr->n_sent += k;
		text_off += tb;
		i += k;
	}
	if (i) {
		memmove(gr->toks, gr->toks + i, (gr->n_toks - i) * sizeof(*gr->toks));
		gr->n_toks -= i;
		memmove(gr->text, gr->text + text_off, gr->text_bytes - text_off);
		gr->text_bytes -= text_off;
	}
	if (r == -EAGAIN)
		return 0;
	if (!gr->finished)
		return 1;
	if (gr->shutdown)
		r = ipc_chan_send_error(c->chan, gr->id, IPC_ERR_SHUTDOWN, "kvd is shutting down; request ended");
	else
		r = ipc_chan_send(c->chan, IPC_MSG_DONE, 0, gr->id, &gr->done, sizeof(gr->done), NULL, 0);
	if (r == -EAGAIN) {
		c->tx_need = sizeof(struct ipc_done) > sizeof(struct ipc_error) + IPC_MAX_ERROR_MSG_BYTES
				     ? sizeof(struct ipc_done)
				     : sizeof(struct ipc_error) + IPC_MAX_ERROR_MSG_BYTES;
		return 0;
	}
	if (r < 0)
		return r;
	greq_unlink(c, gr);
	greq_free(gr);
	c->last_active_ns = now_ns(); /* idle from the end of its last request */
	return 1;
}

static bool upload_pending(const struct client *c)
{
	return c->up_head != NULL;
}

static void upload_done(struct client *c);

/* Pop upload records while an upload is incomplete. Returns 0, or a
 * negative errno after which the connection is closed. */
static int uploads_pump(struct client *c)
{
	struct kvd_server *srv = c->srv;
	struct ipc_frame f;
	struct ipc_prompt_data_msg pd;
	int r;

	while (c->up_head && !c->closing) {
		struct upload *u = c->up_head;
		r = ipc_chan_recv(c->chan, srv->rxbuf, IPC_MAX_FRAME_BYTES, &f);
		if (r == -EAGAIN)
			return 0;
		if (r < 0) {
			sock_error(c, 0, r, "bad record on the upload ring: %s", strerror(-r));
			return r;
		}
		if (f.hdr.type != IPC_MSG_PROMPT_DATA || (r = ipc_decode_prompt_data(&f, &pd)) < 0) {
			sock_error(c, 0, -EPROTO, "upload ring: expected PROMPT_DATA");
			return -EPROTO;
		}
		if (f.hdr.request_id != u->req_id || pd.offset != u->got || pd.bytes > u->total - u->got) {
			sock_error(c, 0, -EPROTO,
				   "upload ring: PROMPT_DATA for request %" PRIu64 " at offset %u (%u bytes); expected "
				   "request %" PRIu64 " at offset %u of %u",
				   f.hdr.request_id, pd.offset, pd.bytes, u->req_id, u->got, u->total);
			return -EPROTO;
		}
		if (!u->buf && u->kind != UP_DISCARD) { /* memory only once the bytes come */
			u->buf = malloc((size_t)u->total + 1);
			if (!u->buf) {
				sock_error(c, 0, -ENOMEM, "out of memory for a %u-byte upload", u->total);
				return -ENOMEM;
			}
		}
		if (u->buf)
			memcpy(u->buf + u->got, pd.data, pd.bytes);
		u->got += pd.bytes;
		if (u->got == u->total)
			upload_done(c);
	}
	return 0;
}

/* Everything a client waits on: uploads, queued stream records. */
static void client_service(struct client *c)
{
	int r;

	if (!c->chan || c->lingering)
		return;
	for (int round = 0; round < 8 && !c->closing; round++) {
		r = uploads_pump(c);
		if (r < 0) {
			client_linger(c, "protocol error on the upload ring");
			return;
		}
		c->tx_need = 0;
		for (struct greq *gr = c->reqs, *next; gr; gr = next) {
			next = gr->next;
			if (gr->state != GR_SCHED)
				continue;
			r = greq_flush(c, gr);
			if (r < 0) {
				client_close(c, "token ring broken");
				return;
			}
			if (r == 0)
				break;
		}
		if (ipc_chan_wake_peer(c->chan) < 0) {
			client_close(c, "cannot wake the client");
			return;
		}
		unsigned what = (upload_pending(c) ? IPC_WAIT_RX : 0) | (c->tx_need ? IPC_WAIT_TX : 0);
		if (!what)
			return;
		r = ipc_chan_prepare_wait(c->chan, what, c->tx_need);
		if (r == 0)
			return; /* the client's next wake-up brings us back */
		if (r < 0) {
			client_close(c, "channel broken");
			return;
		}
	}
	/* still progressing after several rounds: come back after the next step */
	client_mark_dirty(c);
}

static void client_mark_dirty(struct client *c)
{
	if (c->dirty || c->closing)
		return;
	c->dirty = true;
	c->dirty_next = c->srv->dirty;
	c->srv->dirty = c;
}

static void flush_dirty(struct kvd_server *srv)
{
	struct client *list = srv->dirty;
	srv->dirty = NULL;
	while (list) {
		struct client *c = list;
		list = c->dirty_next;
		c->dirty = false;
		if (!c->closing)
			client_service(c);
	}
}

/* ---- generate ---------------------------------------------------------------- */

static void reject(struct client *c, struct greq *gr, int32_t code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void reject(struct client *c, struct greq *gr, int32_t code, const char *fmt, ...)
{
	char msg[IPC_MAX_ERROR_MSG_BYTES];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->srv->requests_rejected++;
	kvd_ledger_rejected(c->srv->ledger, &gr->who, gr->id, gr->sess ? gr->sess->id : 0, code, msg);
	sock_error(c, gr->id, code, "%s", msg);
	greq_unlink(c, gr);
	greq_free(gr);
}

/* The prompt is complete: tokenize, check the context, submit. */
static void generate_start(struct client *c, struct greq *gr, const char *prompt, size_t len)
{
	struct kvd_server *srv = c->srv;
	struct kvd_request_params p = { 0 };
	int32_t *ids = NULL;
	char *text = NULL;
	int n, r, hist = 0;
	bool chat = !(gr->g.gen_flags & IPC_GEN_RAW);
	bool cont = false;
	int32_t last = -1;

	if (gr->cancel_on_upload) {
		gr->state = GR_SCHED;
		gr->finished = true;
		gr->done = (struct ipc_done){ .finish_reason = IPC_FINISH_CANCELLED, .total_ns = now_ns() - gr->t_recv };
		client_mark_dirty(c);
		return;
	}
	if (srv->stopping) {
		reject(c, gr, IPC_ERR_SHUTDOWN, "kvd is shutting down");
		return;
	}
	if (gr->sess) {
		hist = kvd_sched_session_tokens(srv->sched, gr->sess->id);
		if (hist < 0)
			hist = 0;
		cont = gr->sess->turns > 0;
		if (cont && hist == 0) {
			reject(c, gr, IPC_ERR_SESSION, "session %" PRIu64 " has expired", gr->sess->id);
			return;
		}
		if (cont)
			last = kvd_sched_session_last_token(srv->sched, gr->sess->id);
	}
	if (gr->g.gen_flags & IPC_GEN_CHAT_TURNS) { /* no session: the turns are the history */
		_Static_assert(KVD_VERSION_NUM >= IPC_CHAT_TURNS_SERVER_VERSION, "clients gate turns on the version");
		char why[256];
		n = kvd_request_render_turns(srv->tok, prompt, len, &text, why, sizeof(why));
		if (n < 0) {
			reject(c, gr, n, "%s", why);
			return;
		}
		n = kvd_request_tokenize(srv->tok, text, (size_t)n, 1, 1, &ids);
		free(text);
	} else if (chat) {
		if (memchr(prompt, 0, len)) {
			reject(c, gr, -EINVAL, "the prompt contains a NUL byte (not allowed in chat mode)");
			return;
		}
		n = kvd_request_render_turn(srv->tok, gr->system, prompt, cont, last, &text);
		if (n < 0) {
			reject(c, gr, n, "cannot render the model's chat template: %s", strerror(-n));
			return;
		}
		if (kvd_log_level >= KVD_LOG_DEBUG)
			log_debug("request %" PRIu64 ": chat turn%s: %.*s", gr->id, cont ? " (continuation)" : "",
				  n > 400 ? 400 : n, text);
		n = kvd_request_tokenize(srv->tok, text, (size_t)n, !cont, 1, &ids);
		free(text);
	} else {
		n = kvd_request_tokenize(srv->tok, prompt, len, !cont, !!(gr->g.gen_flags & IPC_GEN_PARSE_SPECIAL),
					 &ids);
	}
	if (n < 0) {
		reject(c, gr, n, "cannot tokenize the prompt: %s", strerror(-n));
		return;
	}
	if (n == 0) {
		free(ids);
		reject(c, gr, -EINVAL, "the prompt is empty");
		return;
	}
	if ((uint64_t)hist + (uint64_t)n + gr->g.max_tokens > srv->n_ctx) {
		free(ids);
		reject(c, gr, IPC_ERR_CONTEXT,
		       "%s%d prompt tokens + max_tokens %u = %" PRIu64 " exceeds the context window of %u tokens",
		       hist ? "session history + " : "", hist + n, gr->g.max_tokens,
		       (uint64_t)hist + (uint64_t)n + gr->g.max_tokens, srv->n_ctx);
		return;
	}
	p.sampling = (struct kvd_sampler_params){
		.temperature = gr->g.temperature,
		.top_k = gr->g.top_k,
		.top_p = gr->g.top_p,
		.min_p = gr->g.min_p,
		.repeat_penalty = gr->g.repeat_penalty,
		.repeat_last_n = gr->g.repeat_last_n,
		.seed = gr->g.seed,
	};
	if (gr->g.seed == IPC_SEED_RANDOM && getrandom(&p.sampling.seed, sizeof(p.sampling.seed), 0) < 0)
		p.sampling.seed = now_ns();
	p.max_tokens = gr->g.max_tokens;
	p.session = gr->sess ? gr->sess->id : 0;
	p.session_idle_s = gr->sess ? gr->sess->idle_timeout_s : 0;
	r = kvd_request_new(srv->tok, gr->stops, gr->g.n_stop, &gr->rq);
	if (r < 0) {
		free(ids);
		reject(c, gr, r, "request refused: %s", strerror(-r));
		return;
	}
	gr->t_submit = now_ns();
	r = kvd_sched_submit(srv->sched, (uint64_t)(uintptr_t)gr, ids, (uint32_t)n, &p);
	free(ids);
	switch (r) {
	case 0:
		gr->state = GR_SCHED;
		return;
	case -E2BIG:
		reject(c, gr, IPC_ERR_CONTEXT, "prompt + max_tokens exceeds max_model_len (%u tokens)", srv->n_ctx);
		return;
	case -ENOSPC:
		reject(c, gr, -ENOSPC, "%d prompt tokens + max_tokens %u need more KV pages than the whole pool has (%u)",
		       hist + n, gr->g.max_tokens, kvmm_n_pages(srv->kv));
		return;
	case -EBUSY:
		reject(c, gr, IPC_ERR_LIMIT, "the request queue is full (scheduler.max_waiting = %u)",
		       srv->cfg.max_waiting);
		return;
	default:
		reject(c, gr, r, "request refused: %s", strerror(-r));
		return;
	}
}

static void upload_free(struct upload *u)
{
	free(u->buf);
	free(u);
}

static void upload_done(struct client *c)
{
	struct upload *u = c->up_head;
	c->up_head = u->next;
	if (!c->up_head)
		c->up_tail = NULL;
	c->srv->n_uploading--;
	c->n_uploads--;
	if (u->buf)
		u->buf[u->total] = 0;
	switch (u->kind) {
	case UP_GENERATE:
		generate_start(c, u->gr, u->buf, u->total);
		break;
	case UP_TOKENIZE:
		tokenize_reply(c, u->req_id, u->tok_flags, u->buf, u->total);
		break;
	case UP_DISCARD:
		sock_error(c, u->req_id, u->err_code, "%s", u->err_msg);
		break;
	}
	upload_free(u);
}

/* Queue an upload of `total` bytes (total > 0). kind UP_DISCARD swallows
 * the bytes and then sends the stored error. The buffer is allocated when
 * the first bytes arrive. Returns 0; -EMFILE when the client announced
 * more uploads than it may have queued, -ENOMEM: the ring cannot be kept
 * in step then, so the connection is ended (ERROR with request id 0). */
static int upload_add(struct client *c, enum upload_kind kind, uint64_t rid, uint32_t total, struct greq *gr,
		      uint32_t tok_flags, int32_t err_code, const char *err_msg)
{
	if (c->n_uploads >= SRV_MAX_QUEUED_UPLOADS) {
		sock_error(c, 0, IPC_ERR_LIMIT, "more than %u ring uploads announced and not sent", SRV_MAX_QUEUED_UPLOADS);
		client_linger(c, "too many uploads queued");
		return -EMFILE;
	}
	struct upload *u = calloc(1, sizeof(*u));
	if (!u) {
		sock_error(c, 0, -ENOMEM, "out of memory");
		client_linger(c, "out of memory");
		return -ENOMEM;
	}
	u->kind = kind;
	u->req_id = rid;
	u->total = total;
	u->gr = gr;
	u->tok_flags = tok_flags;
	u->err_code = err_code;
	if (err_msg)
		snprintf(u->err_msg, sizeof(u->err_msg), "%s", err_msg);
	if (c->up_tail)
		c->up_tail->next = u;
	else
		c->up_head = u;
	c->up_tail = u;
	c->srv->n_uploading++;
	c->n_uploads++;
	return 0;
}

/* Record a request refused before it had a greq, with its sender's identity. */
static void ledger_rejected(struct client *c, uint64_t rid, int32_t code, const char *msg)
{
	struct kvd_ledger_who who = { c->id, (int32_t)c->cred.pid, (uint32_t)c->cred.uid };
	kvd_ledger_rejected(c->srv->ledger, &who, rid, 0, code, msg);
}

/* An upload that is refused: consume its bytes, then send the error. */
static void refuse_upload(struct client *c, uint64_t rid, uint32_t bytes, int32_t code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static void refuse_upload(struct client *c, uint64_t rid, uint32_t bytes, int32_t code, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->srv->requests_rejected++;
	ledger_rejected(c, rid, code, msg);
	if (!bytes)
		sock_error(c, rid, code, "%s", msg);
	else if (upload_add(c, UP_DISCARD, rid, bytes, NULL, 0, code, msg) == 0)
		client_mark_dirty(c);
}

static void handle_generate(struct client *c, const struct ipc_frame *f)
{
	struct kvd_server *srv = c->srv;
	struct ipc_generate_msg m;
	uint64_t rid = f->hdr.request_id;
	int r = ipc_decode_generate(f, &m);
	bool in_ring;
	struct greq *gr;
	struct session *sess = NULL;

	if (r < 0) {
		srv->requests_rejected++;
		ledger_rejected(c, rid, r, "malformed GENERATE");
		sock_error(c, rid, r, "malformed GENERATE: %s", strerror(-r));
		return;
	}
	in_ring = m.g.gen_flags & IPC_GEN_PROMPT_IN_RING;
	uint32_t up = in_ring ? m.g.prompt_bytes : 0;
	if (srv->stopping) {
		refuse_upload(c, rid, up, IPC_ERR_SHUTDOWN, "kvd is shutting down");
		return;
	}
	if (greq_find(c, rid)) {
		refuse_upload(c, rid, up, -EEXIST, "request id %" PRIu64 " is already in use", rid);
		return;
	}
	if (c->n_inflight >= srv->cfg.max_requests_per_client) {
		refuse_upload(c, rid, up, IPC_ERR_LIMIT, "too many requests in flight (server.max_requests_per_client = %u)",
			      srv->cfg.max_requests_per_client);
		return;
	}
	if (m.g.prompt_bytes > srv->cfg.max_prompt_bytes) {
		refuse_upload(c, rid, up, IPC_ERR_LIMIT,
			      "prompt of %u bytes exceeds this server's limit of %" PRIu64 " bytes (server.max_prompt_bytes)",
			      m.g.prompt_bytes, srv->cfg.max_prompt_bytes);
		return;
	}
	if (m.g.session_id) {
		for (sess = srv->sessions; sess && (sess->id != m.g.session_id || sess->owner != c->cred.uid);
		     sess = sess->next)
			;
		if (!sess) {
			refuse_upload(c, rid, up, IPC_ERR_SESSION, "unknown session %" PRIu64 " (expired, closed, or not yours)",
				      m.g.session_id);
			return;
		}
		if (sess->busy) {
			refuse_upload(c, rid, up, IPC_ERR_SESSION, "session %" PRIu64 " is busy with another turn",
				      m.g.session_id);
			return;
		}
	}
	if (!in_ring && m.g.prompt_bytes == 0) {
		srv->requests_rejected++;
		ledger_rejected(c, rid, -EINVAL, "the prompt is empty");
		sock_error(c, rid, -EINVAL, "the prompt is empty");
		return;
	}
	gr = calloc(1, sizeof(*gr));
	if (!gr)
		goto oom;
	gr->c = c;
	gr->who = (struct kvd_ledger_who){ c->id, (int32_t)c->cred.pid, (uint32_t)c->cred.uid };
	gr->id = rid;
	gr->g = m.g;
	gr->t_recv = now_ns();
	gr->system = strndup(m.system ? m.system : "", m.g.system_bytes);
	if (!gr->system)
		goto oom;
	if (m.g.n_stop) {
		size_t tot = 0;
		for (unsigned i = 0; i < m.g.n_stop; i++)
			tot += m.stop_len[i] + 1u;
		gr->stop_buf = malloc(tot);
		if (!gr->stop_buf)
			goto oom;
		char *p = gr->stop_buf;
		for (unsigned i = 0; i < m.g.n_stop; i++) {
			memcpy(p, m.stop[i], m.stop_len[i]);
			p[m.stop_len[i]] = 0;
			gr->stops[i] = p;
			p += m.stop_len[i] + 1u;
		}
	}
	gr->sess = sess;
	if (sess) {
		sess->busy = gr;
		sess->last_used_ns = gr->t_recv;
		kvd_sched_session_touch(c->srv->sched, sess->id);
	}
	/* link first: generate_start() may unlink it again */
	gr->prev = c->reqs_tail;
	if (c->reqs_tail)
		c->reqs_tail->next = gr;
	else
		c->reqs = gr;
	c->reqs_tail = gr;
	c->n_inflight++;
	if (in_ring && m.g.prompt_bytes > 0) {
		gr->state = GR_UPLOADING;
		if (upload_add(c, UP_GENERATE, rid, m.g.prompt_bytes, gr, 0, 0, NULL) < 0)
			return; /* the connection is ending; its requests go with it */
		client_mark_dirty(c);
		return;
	}
	if (in_ring) { /* empty upload */
		reject(c, gr, -EINVAL, "the prompt is empty");
		return;
	}
	char *prompt = malloc((size_t)m.g.prompt_bytes + 1);
	if (!prompt) {
		reject(c, gr, -ENOMEM, "out of memory");
		return;
	}
	memcpy(prompt, m.prompt, m.g.prompt_bytes);
	prompt[m.g.prompt_bytes] = 0;
	generate_start(c, gr, prompt, m.g.prompt_bytes);
	free(prompt);
	return;
oom:
	if (gr)
		greq_free(gr);
	srv->requests_rejected++;
	ledger_rejected(c, rid, -ENOMEM, "out of memory");
	sock_error(c, rid, -ENOMEM, "out of memory");
}

static void handle_cancel(struct client *c, uint64_t rid)
{
	struct greq *gr = greq_find(c, rid);
	if (!gr || gr->finished)
		return;
	if (gr->state == GR_UPLOADING) {
		gr->cancel_on_upload = true;
		return;
	}
	kvd_sched_cancel(c->srv->sched, (uint64_t)(uintptr_t)gr);
}

/* ---- other requests ---------------------------------------------------------- */

static void tokenize_reply(struct client *c, uint64_t rid, uint32_t flags, const char *text, size_t len)
{
	struct kvd_server *srv = c->srv;
	int32_t *ids = NULL;
	int n = kvd_request_tokenize(srv->tok, text, len, !!(flags & IPC_TOK_ADD_BOS), !!(flags & IPC_TOK_PARSE_SPECIAL),
				     &ids);
	uint8_t buf[IPC_MAX_PAYLOAD_BYTES];
	uint32_t off = 0;

	if (n < 0) {
		sock_error(c, rid, n, "cannot tokenize: %s", strerror(-n));
		return;
	}
	do {
		struct ipc_tokenize_reply tr = { .n_tokens = (uint32_t)n, .offset = off };
		uint32_t k = (flags & IPC_TOK_COUNT_ONLY) ? 0 : (uint32_t)n - off;
		if (k > IPC_MAX_IDS_PER_FRAME)
			k = IPC_MAX_IDS_PER_FRAME;
		tr.n_ids = k;
		memcpy(buf, &tr, sizeof(tr));
		memcpy(buf + sizeof(tr), ids + off, (size_t)k * 4);
		off += k;
		bool more = !(flags & IPC_TOK_COUNT_ONLY) && off < (uint32_t)n;
		if (sock_send(c, IPC_MSG_TOKENIZE_REPLY, more ? IPC_F_MORE : 0, rid, buf, sizeof(tr) + (size_t)k * 4) < 0)
			break;
		if (!more)
			break;
	} while (1);
	free(ids);
}

static void handle_tokenize(struct client *c, const struct ipc_frame *f)
{
	struct ipc_tokenize_msg m;
	int r = ipc_decode_tokenize(f, &m);
	uint64_t rid = f->hdr.request_id;

	if (r < 0) {
		sock_error(c, rid, r, "malformed TOKENIZE: %s", strerror(-r));
		return;
	}
	bool in_ring = m.t.tok_flags & IPC_TOK_TEXT_IN_RING;
	if (m.t.text_bytes > c->srv->cfg.max_prompt_bytes) {
		refuse_upload(c, rid, in_ring ? m.t.text_bytes : 0, IPC_ERR_LIMIT,
			      "text of %u bytes exceeds this server's limit of %" PRIu64 " bytes (server.max_prompt_bytes)",
			      m.t.text_bytes, c->srv->cfg.max_prompt_bytes);
		return;
	}
	if (in_ring && m.t.text_bytes > 0) {
		if (upload_add(c, UP_TOKENIZE, rid, m.t.text_bytes, NULL, m.t.tok_flags, 0, NULL) == 0)
			client_mark_dirty(c);
		return;
	}
	tokenize_reply(c, rid, m.t.tok_flags, m.text ? m.text : "", in_ring ? 0 : m.t.text_bytes);
}

static void fill_stats(struct kvd_server *srv, struct ipc_stats *st)
{
	struct kvmm_stats ks;
	struct kvmm_ledger led;
	struct kvd_sched_stats ss;

	kvmm_get_stats(srv->kv, &ks);
	kvmm_get_ledger(srv->kv, &led);
	kvd_sched_get_stats(srv->sched, &ss);
	memset(st, 0, sizeof(*st));
	st->pages_total = ks.pages_total;
	st->pages_free = ks.pages_free;
	st->pages_used = ks.pages_used;
	st->pages_shared = ks.pages_shared;
	st->pages_cached = ks.pages_cached;
	st->pages_swapped = ks.pages_swapped;
	st->page_bytes = ks.page_bytes;
	st->block_size = ks.block_size;
	st->kv_bytes_per_token = ks.block_size ? ks.page_bytes / ks.block_size : 0;
	st->pool_bytes = (uint64_t)ks.pages_total * ks.page_bytes;
	st->tokens_resident = ks.tokens_resident;
	if (st->kv_bytes_per_token && led.kv_bytes_allocated > led.kv_bytes_useful)
		st->slack_tokens = (led.kv_bytes_allocated - led.kv_bytes_useful) / st->kv_bytes_per_token;
	st->prefix_lookups = ks.prefix_lookups;
	st->prefix_query_tokens = ks.prefix_query_tokens;
	st->prefix_hit_tokens = ks.prefix_hit_tokens;
	st->pages_evicted = ks.pages_evicted;
	st->cow_copies = ks.cow_copies;
	st->swap_out_pages = ks.swap_out_pages;
	st->swap_in_pages = ks.swap_in_pages;
	st->swap_bytes = (uint64_t)ks.swap_slots * ks.page_bytes;
	st->requests_running = ss.running;
	st->requests_waiting = ss.waiting + srv->n_uploading;
	st->requests_swapped = ss.swapped;
	st->requests_completed = ss.requests_done;
	st->requests_rejected = srv->requests_rejected;
	st->clients = srv->n_clients;
	st->sessions = srv->n_sessions;
	st->prompt_tokens_total = srv->prompt_tokens_total;
	st->generated_tokens_total = srv->generated_tokens_total;
	st->steps = ss.steps;
	st->uptime_ns = now_ns() - srv->t_start;
	st->ledger_records_dropped = kvd_ledger_dropped(srv->ledger);
	st->swap_errors = led.swap_errors;
	st->swap_fallback_recomputes = ss.swap_fallback_recomputes;
}

static void handle_ps(struct client *c, uint64_t rid)
{
	struct kvd_server *srv = c->srv;
	size_t cap = 64, n;
	struct kvd_sched_req_info *info;
	struct ipc_ps_entry *ent;
	size_t n_ent = 0;
	uint64_t t = now_ns();

	for (;;) {
		info = malloc(cap * sizeof(*info));
		if (!info)
			goto oom;
		n = kvd_sched_list(srv->sched, info, cap);
		if (n < cap)
			break;
		free(info);
		cap *= 4;
	}
	ent = calloc(n + srv->n_uploading + 1, sizeof(*ent));
	if (!ent) {
		free(info);
		goto oom;
	}
	static const uint32_t state_map[] = { IPC_REQ_WAITING, IPC_REQ_PREFILL, IPC_REQ_RUNNING, IPC_REQ_SWAPPED };
	/* Administrators see everyone's requests; others only their own
	 * (pids, session ids and sizes of other users' work are private). */
	for (size_t i = 0; i < n; i++) {
		struct greq *gr = (struct greq *)(uintptr_t)info[i].req_id;
		if (!c->admin && (!gr->c || gr->c->cred.uid != c->cred.uid))
			continue;
		ent[n_ent++] = (struct ipc_ps_entry){
			.request_id = gr->id,
			.client_id = gr->c ? gr->c->id : 0,
			.session_id = info[i].session,
			.age_ns = t - gr->t_recv,
			.pid = gr->c ? (uint32_t)gr->c->cred.pid : 0,
			.uid = gr->c ? (uint32_t)gr->c->cred.uid : 0,
			.state = state_map[info[i].state & 3],
			.pages = info[i].pages,
			.pages_shared = info[i].pages_shared,
			.prompt_tokens = info[i].prompt_tokens,
			.cached_tokens = info[i].cached_tokens,
			.generated_tokens = info[i].generated_tokens,
			.max_tokens = info[i].max_tokens,
		};
	}
	for (struct client *o = srv->clients; o; o = o->next)
		for (struct upload *u = o->up_head; u && n_ent < n + srv->n_uploading; u = u->next)
			if (u->kind == UP_GENERATE && (c->admin || o->cred.uid == c->cred.uid))
				ent[n_ent++] = (struct ipc_ps_entry){
					.request_id = u->req_id,
					.client_id = o->id,
					.session_id = u->gr->sess ? u->gr->sess->id : 0,
					.age_ns = t - u->gr->t_recv,
					.pid = (uint32_t)o->cred.pid,
					.uid = (uint32_t)o->cred.uid,
					.state = IPC_REQ_UPLOADING,
					.max_tokens = u->gr->g.max_tokens,
				};
	free(info);
	size_t off = 0;
	do {
		uint8_t buf[IPC_MAX_PAYLOAD_BYTES];
		size_t k = n_ent - off;
		if (k > IPC_MAX_PS_PER_FRAME)
			k = IPC_MAX_PS_PER_FRAME;
		struct ipc_ps_reply pr = { .n_total = (uint32_t)n_ent, .n_entries = (uint32_t)k };
		memcpy(buf, &pr, sizeof(pr));
		memcpy(buf + sizeof(pr), ent + off, k * sizeof(*ent));
		off += k;
		if (sock_send(c, IPC_MSG_PS_REPLY, off < n_ent ? IPC_F_MORE : 0, rid, buf, sizeof(pr) + k * sizeof(*ent)) < 0)
			break;
	} while (off < n_ent);
	free(ent);
	return;
oom:
	sock_error(c, rid, -ENOMEM, "out of memory");
}

static void session_free(struct kvd_server *srv, struct session *s)
{
	if (s->busy) {
		struct greq *gr = s->busy;
		gr->sess = NULL;
		s->busy = NULL;
		if (gr->state == GR_SCHED && !gr->finished)
			kvd_sched_cancel(srv->sched, (uint64_t)(uintptr_t)gr);
	}
	kvd_sched_session_close(srv->sched, s->id);
	srv->n_sessions--;
	free(s);
}

static void handle_session_open(struct client *c, const struct ipc_frame *f)
{
	struct kvd_server *srv = c->srv;
	struct ipc_session_open so;
	int r = ipc_decode_session_open(f, &so);

	if (r < 0) {
		sock_error(c, f->hdr.request_id, r, "malformed SESSION_OPEN: %s", strerror(-r));
		return;
	}
	uint32_t n = 0;
	for (struct session *s = srv->sessions; s; s = s->next)
		n += s->owner == c->cred.uid;
	if (n >= SRV_MAX_SESSIONS_PER_USER) {
		sock_error(c, f->hdr.request_id, IPC_ERR_LIMIT, "too many open sessions for uid %u (%u)",
			   (unsigned)c->cred.uid, n);
		return;
	}
	struct session *s = calloc(1, sizeof(*s));
	if (!s) {
		sock_error(c, f->hdr.request_id, -ENOMEM, "out of memory");
		return;
	}
	s->id = ++srv->next_session_id;
	s->idle_timeout_s = so.idle_timeout_s ? so.idle_timeout_s : srv->cfg.session_idle_s;
	if (srv->cfg.session_idle_s && s->idle_timeout_s > srv->cfg.session_idle_s)
		s->idle_timeout_s = srv->cfg.session_idle_s; /* the server's bound */
	s->last_used_ns = now_ns();
	s->owner = c->cred.uid;
	s->opener = c->id;
	s->next = srv->sessions;
	srv->sessions = s;
	srv->n_sessions++;
	struct ipc_session reply = { .session_id = s->id };
	sock_send(c, IPC_MSG_SESSION_OPENED, 0, f->hdr.request_id, &reply, sizeof(reply));
}

static void handle_session_close(struct client *c, const struct ipc_frame *f)
{
	struct ipc_session sm;
	int r = ipc_decode_session(f, &sm);

	if (r < 0) {
		sock_error(c, f->hdr.request_id, r, "malformed SESSION_CLOSE: %s", strerror(-r));
		return;
	}
	for (struct session **pp = &c->srv->sessions; *pp; pp = &(*pp)->next) {
		if ((*pp)->id == sm.session_id && (*pp)->owner == c->cred.uid) {
			struct session *s = *pp;
			*pp = s->next;
			session_free(c->srv, s);
			sock_send(c, IPC_MSG_SESSION_CLOSED, 0, f->hdr.request_id, &sm, sizeof(sm));
			return;
		}
	}
	sock_error(c, f->hdr.request_id, IPC_ERR_SESSION, "unknown session %" PRIu64, sm.session_id);
}

/* Holding nothing (no request, upload or session it opened) and silent
 * for server.idle_timeout? */
static bool client_idle(const struct client *c, uint64_t t)
{
	const struct kvd_server *srv = c->srv;

	if (!srv->cfg.idle_timeout_s || c->n_inflight || c->up_head)
		return false;
	if (t - c->last_active_ns <= (uint64_t)srv->cfg.idle_timeout_s * 1000000000ull)
		return false;
	for (const struct session *s = srv->sessions; s; s = s->next)
		if (s->opener == c->id)
			return false;
	return true;
}

static void expire_sessions(struct kvd_server *srv, uint64_t t)
{
	for (struct client *c = srv->clients, *next; c; c = next) {
		next = c->next;
		if (c->lingering && t >= c->linger_deadline)
			client_close(c, "linger time over");
		else if (!c->welcomed && !c->lingering && t - c->t_accept > SRV_HELLO_TIMEOUT_NS) {
			sock_error(c, 0, -ETIMEDOUT, "no HELLO within %llu s", SRV_HELLO_TIMEOUT_NS / 1000000000ull);
			client_linger(c, "no HELLO in time");
		} else if (c->welcomed && !c->lingering && !c->closing && client_idle(c, t)) {
			sock_error(c, 0, -ETIMEDOUT, "idle for %u s (server.idle_timeout)", srv->cfg.idle_timeout_s);
			client_linger(c, "idle");
		}
	}
	kvd_sched_expire_sessions(srv->sched); /* those it holds: on_session_expired */
	for (struct session **pp = &srv->sessions; *pp;) {
		struct session *s = *pp;
		if (!s->busy && s->idle_timeout_s && t - s->last_used_ns > (uint64_t)s->idle_timeout_s * 1000000000ull &&
		    kvd_sched_session_tokens(srv->sched, s->id) < 0) {
			log_info("session %" PRIu64 " of uid %u expired after %us idle", s->id, (unsigned)s->owner,
				 s->idle_timeout_s);
			*pp = s->next;
			session_free(srv, s);
			continue;
		}
		pp = &s->next;
	}
}

/* The scheduler closed an idle session: forget it here too. A turn still
 * uploading keeps the object; it will find the session expired. */
static void on_session_expired(void *ud, uint64_t session)
{
	struct kvd_server *srv = ud;

	for (struct session **pp = &srv->sessions; *pp; pp = &(*pp)->next) {
		struct session *s = *pp;
		if (s->id != session)
			continue;
		if (s->busy)
			return;
		log_info("session %" PRIu64 " of uid %u expired after %us idle", s->id, (unsigned)s->owner,
			 s->idle_timeout_s);
		*pp = s->next;
		srv->n_sessions--;
		free(s);
		return;
	}
}

/* ---- the handshake ---------------------------------------------------------- */

static void handle_hello(struct client *c, const struct ipc_frame *f)
{
	struct kvd_server *srv = c->srv;
	const struct kvd_hparams *hp = kvd_model_hparams(kvd_engine_model(srv->e));
	const struct kvd_kv_layout *lay = kvd_engine_kv_layout(srv->e);
	struct ipc_hello h;
	struct ipc_welcome w = { 0 };
	int fds[IPC_WELCOME_N_FDS];
	int r = ipc_decode_hello(f, &h);

	if (r < 0) {
		sock_error(c, 0, r, "malformed HELLO: %s", strerror(-r));
		client_linger(c, "malformed HELLO");
		return;
	}
	struct ipc_chan_config cc = { .s2c_bytes = srv->cfg.token_ring_bytes };
	r = ipc_chan_create(&cc, &c->chan);
	if (r < 0) {
		sock_error(c, 0, r, "cannot create the shared-memory channel: %s", strerror(-r));
		client_close(c, "channel creation failed");
		return;
	}
	w.server_version = KVD_VERSION_NUM;
	w.capabilities = IPC_CAP_SESSIONS;
	w.client_id = c->id;
	w.n_vocab = (uint32_t)hp->n_vocab;
	w.n_ctx = srv->n_ctx;
	w.block_size = lay->block_size;
	w.n_layers = (uint32_t)hp->n_layer;
	w.n_kv_heads = (uint32_t)hp->n_head_kv;
	w.head_dim = (uint32_t)hp->head_dim;
	w.kv_dtype_bytes = 2;
	w.max_text_bytes = (uint32_t)srv->cfg.max_prompt_bytes;
	w.max_requests = srv->cfg.max_requests_per_client;
	w.max_gen_tokens = srv->n_ctx < IPC_MAX_GEN_TOKENS ? srv->n_ctx : IPC_MAX_GEN_TOKENS;
	w.shm_bytes = ipc_chan_shm_bytes(c->chan);
	w.kv_bytes_per_token = lay->page_bytes / lay->block_size;
	w.pool_bytes = (uint64_t)kvmm_n_pages(srv->kv) * kvmm_page_bytes(srv->kv);
	snprintf(w.model_name, sizeof(w.model_name), "%s", kvd_model_name(kvd_engine_model(srv->e)));
	r = ipc_chan_fds(c->chan, fds);
	if (r == 0)
		r = ipc_send_nowait(c->fd, IPC_MSG_WELCOME, 0, 0, &w, sizeof(w), fds, IPC_WELCOME_N_FDS);
	if (r < 0) {
		client_close(c, "cannot send WELCOME");
		return;
	}
	/* The client's copies are its own now; ours would only keep its end
	 * of the wake-up pair alive after it has gone. */
	ipc_chan_handed_over(c->chan);
	c->chan_src = (struct ep_src){ SRC_CHAN, c };
	r = ep_add(srv, ipc_chan_wait_fd(c->chan), &c->chan_src);
	if (r < 0) {
		client_close(c, "epoll");
		return;
	}
	c->welcomed = true;
	h.client_name[IPC_CLIENT_NAME_BYTES - 1] = 0;
	log_debug("client %" PRIu64 " (pid %d uid %u) says hello as '%s' version %u.%u.%u", c->id, (int)c->cred.pid,
		  (unsigned)c->cred.uid, h.client_name, h.client_version >> 16, (h.client_version >> 8) & 0xff,
		  h.client_version & 0xff);
}

/* ---- connections ------------------------------------------------------------ */

static bool peer_allowed(struct kvd_server *srv, int fd, const struct ipc_peer_cred *cr)
{
	gid_t groups[SRV_MAX_GROUPS];
	size_t n = 0;

	if (cr->uid == 0)
		return true;
	if (!srv->cfg.n_allowed_uids && !srv->cfg.n_allowed_gids)
		return true;
	for (size_t i = 0; i < srv->cfg.n_allowed_uids; i++)
		if (srv->cfg.allowed_uids[i] == cr->uid)
			return true;
	for (size_t i = 0; i < srv->cfg.n_allowed_gids; i++)
		if (srv->cfg.allowed_gids[i] == cr->gid)
			return true;
	if (srv->cfg.n_allowed_gids && ipc_peer_groups(fd, groups, SRV_MAX_GROUPS, &n) == 0)
		for (size_t k = 0; k < n; k++)
			for (size_t i = 0; i < srv->cfg.n_allowed_gids; i++)
				if (srv->cfg.allowed_gids[i] == groups[k])
					return true;
	return false;
}

/* The user's share of the loop, created on its first connection; NULL
 * when out of memory. */
static struct user_share *share_get(struct kvd_server *srv, uid_t uid)
{
	struct user_share *u;
	for (u = srv->shares; u; u = u->next)
		if (u->uid == uid)
			break;
	if (!u) {
		u = calloc(1, sizeof(*u));
		if (!u)
			return NULL;
		u->uid = uid;
		u->next = srv->shares;
		srv->shares = u;
	}
	u->refs++;
	return u;
}

static void share_put(struct kvd_server *srv, struct user_share *share)
{
	if (!share || --share->refs)
		return;
	for (struct user_share **pp = &srv->shares; *pp; pp = &(*pp)->next)
		if (*pp == share) {
			*pp = share->next;
			break;
		}
	free(share);
}

/* Root, or a member (primary or supplementary group) of server.admin_groups. */
static bool peer_is_admin(struct kvd_server *srv, int fd, const struct ipc_peer_cred *cr)
{
	gid_t groups[SRV_MAX_GROUPS];
	size_t n = 0;

	if (cr->uid == 0)
		return true;
	for (size_t i = 0; i < srv->cfg.n_admin_gids; i++)
		if (srv->cfg.admin_gids[i] == cr->gid)
			return true;
	if (srv->cfg.n_admin_gids && ipc_peer_groups(fd, groups, SRV_MAX_GROUPS, &n) == 0)
		for (size_t k = 0; k < n; k++)
			for (size_t i = 0; i < srv->cfg.n_admin_gids; i++)
				if (srv->cfg.admin_gids[i] == groups[k])
					return true;
	return false;
}

static void handle_accept(struct kvd_server *srv)
{
	for (int k = 0; k < 64; k++) {
		int fd, r = ipc_accept(srv->listen_fd, &fd);
		if (r == -EAGAIN)
			return;
		if (r < 0) {
			if (r == -EMFILE || r == -ENFILE) {
				/* out of descriptors: stop listening for a moment
				 * rather than spin on a readable listening socket */
				log_warning("accept: %s; not accepting for 100 ms", strerror(-r));
				epoll_ctl(srv->ep, EPOLL_CTL_DEL, srv->listen_fd, NULL);
				srv->accept_paused_until = now_ns() + 100000000ull;
			}
			return;
		}
		struct client *c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			return;
		}
		/* Without the peer's credentials nobody can tell who this is:
		 * it is refused below, and never looks like uid 0 (root)
		 * meanwhile. */
		int cred_r = srv->fault_peercred ? -EIO : ipc_peer_cred(fd, &c->cred);
		if (cred_r < 0)
			c->cred = (struct ipc_peer_cred){ .pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1 };
		c->share = share_get(srv, c->cred.uid);
		if (!c->share) {
			close(fd);
			free(c);
			return;
		}
		c->srv = srv;
		c->fd = fd;
		c->id = ++srv->next_client_id;
		c->t_accept = now_ns();
		int sndbuf = SRV_SNDBUF_BYTES;
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		c->next = srv->clients;
		if (srv->clients)
			srv->clients->prev = c;
		srv->clients = c;
		srv->n_clients++;
		c->sock_src = (struct ep_src){ SRC_SOCK, c };
		if (ep_add(srv, fd, &c->sock_src) < 0) {
			client_close(c, "epoll");
			continue;
		}
		if (cred_r < 0) {
			log_warning("refused a connection: cannot read its credentials (SO_PEERCRED): %s",
				    strerror(-cred_r));
			sock_error(c, 0, IPC_ERR_DENIED, "kvd cannot read this connection's credentials");
			client_linger(c, "no credentials");
			continue;
		}
		if (!peer_allowed(srv, fd, &c->cred)) {
			log_notice("refused a connection from pid %d uid %u gid %u: not in server.allowed_users/groups",
				   (int)c->cred.pid, (unsigned)c->cred.uid, (unsigned)c->cred.gid);
			sock_error(c, 0, IPC_ERR_DENIED, "uid %u may not use kvd (server.allowed_users / allowed_groups)",
				   (unsigned)c->cred.uid);
			client_linger(c, "denied");
			continue;
		}
		/* Slots: the last admin_reserved_clients of max_clients are
		 * for administrators only, and no other user may hold more
		 * than max_clients_per_user, so that one user cannot lock
		 * everyone out, and `kvctl stats` or a stop always get in. */
		c->admin = peer_is_admin(srv, fd, &c->cred);
		uint32_t slots = srv->cfg.max_clients;
		if (!c->admin)
			slots = slots > srv->cfg.admin_reserved_clients ? slots - srv->cfg.admin_reserved_clients : 0;
		if (srv->n_admitted >= slots) {
			sock_error(c, 0, IPC_ERR_LIMIT, "too many clients (server.max_clients = %u, %u of them for administrators)",
				   srv->cfg.max_clients, srv->cfg.admin_reserved_clients);
			client_linger(c, "too many clients");
			continue;
		}
		if (!c->admin) {
			uint32_t mine = 0;
			for (struct client *o = srv->clients; o; o = o->next)
				mine += o->admitted && o->cred.uid == c->cred.uid;
			if (mine >= srv->cfg.max_clients_per_user) {
				sock_error(c, 0, IPC_ERR_LIMIT, "uid %u has %u connections open (server.max_clients_per_user = %u)",
					   (unsigned)c->cred.uid, mine, srv->cfg.max_clients_per_user);
				client_linger(c, "too many connections for this user");
				continue;
			}
		}
		c->admitted = true;
		srv->n_admitted++;
		c->last_active_ns = c->t_accept;
		log_debug("client %" PRIu64 " connected: pid %d uid %u", c->id, (int)c->cred.pid, (unsigned)c->cred.uid);
	}
}

/* Cancel the client's requests at once (their pages go back in this call),
 * drop its uploads and close its sessions. Idempotent. */
static void client_drop_work(struct client *c)
{
	struct kvd_server *srv = c->srv;

	while (c->up_head) {
		struct upload *u = c->up_head;
		c->up_head = u->next;
		srv->n_uploading--;
		c->n_uploads--;
		upload_free(u);
	}
	c->up_tail = NULL;
	while (c->reqs) {
		struct greq *gr = c->reqs;
		greq_unlink(c, gr);
		gr->c = NULL;
		if (gr->state == GR_SCHED && !gr->finished)
			kvd_sched_cancel(srv->sched, (uint64_t)(uintptr_t)gr); /* on_done frees it */
		else
			greq_free(gr);
	}
	if (c->chan)
		epoll_ctl(srv->ep, EPOLL_CTL_DEL, ipc_chan_wait_fd(c->chan), NULL);
}

/* Give the connection's slot back (idempotent). */
static void client_unadmit(struct client *c)
{
	if (!c->admitted)
		return;
	c->admitted = false;
	c->srv->n_admitted--;
}

/*
 * After an ERROR about the connection (request id 0): stop serving it, but
 * keep the socket open until the client hangs up (or a second passes), so
 * that the ERROR is read rather than lost to a reset when frames the client
 * already sent are still queued.
 */
static void client_linger(struct client *c, const char *why)
{
	if (c->closing || c->lingering)
		return;
	client_unadmit(c);
	if (c->srv->n_lingering >= SRV_MAX_LINGERING) {
		/* a flood of refused connections must not hold fds for long */
		client_close(c, why);
		return;
	}
	log_debug("client %" PRIu64 ": %s; closing", c->id, why);
	c->lingering = true;
	c->srv->n_lingering++;
	c->linger_deadline = now_ns() + SRV_LINGER_NS;
	client_drop_work(c);
}

/* Close the connection (requests cancelled, sessions closed) and free it
 * after the epoll batch. */
static void client_close(struct client *c, const char *why)
{
	struct kvd_server *srv = c->srv;

	if (c->closing)
		return;
	c->closing = true;
	client_unadmit(c);
	if (c->sock_paused) {
		c->sock_paused = false;
		srv->n_paused--;
	}
	if (c->lingering)
		srv->n_lingering--;
	log_debug("client %" PRIu64 " closed: %s", c->id, why);
	client_drop_work(c);
	if (c->fd >= 0) {
		epoll_ctl(srv->ep, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
		c->fd = -1;
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		srv->clients = c->next;
	if (c->next)
		c->next->prev = c->prev;
	srv->n_clients--;
	c->free_next = srv->to_free;
	srv->to_free = c;
}

static void free_closed(struct kvd_server *srv)
{
	while (srv->to_free) {
		struct client *c = srv->to_free;
		srv->to_free = c->free_next;
		/* it may still sit on the dirty list */
		for (struct client **pp = &srv->dirty; *pp; pp = &(*pp)->dirty_next)
			if (*pp == c) {
				*pp = c->dirty_next;
				break;
			}
		ipc_chan_free(c->chan);
		share_put(srv, c->share);
		free(c);
	}
}

/* A frame the protocol layer refused: answer it, and close the connection
 * when what arrived cannot be trusted to belong to a request. */
static void frame_error(struct client *c, int r, const struct ipc_frame *f)
{
	bool hdr_ok = f->hdr.magic == IPC_MAGIC && f->hdr.version == IPC_PROTO_VERSION;
	uint64_t rid = hdr_ok ? f->hdr.request_id : 0;

	c->srv->requests_rejected++;
	switch (r) {
	case -EPROTONOSUPPORT:
		sock_error(c, 0, IPC_ERR_VERSION, "protocol version %u is not supported (kvd speaks version %u)",
			   f->hdr.version, IPC_PROTO_VERSION);
		client_linger(c, "protocol version");
		return;
	case -ENOMSG:
		sock_error(c, rid, -ENOMSG, "unknown message type %u", f->hdr.type);
		break;
	case -E2BIG:
		sock_error(c, rid, -E2BIG, "frame longer than %u bytes or beyond a limit", IPC_MAX_FRAME_BYTES);
		break;
	case -EPROTO:
		sock_error(c, rid, -EPROTO, "%s not allowed here (direction, transport, flags or reserved fields)",
			   ipc_type_name(f->hdr.type));
		break;
	case -ETOOMANYREFS:
		sock_error(c, rid, -ETOOMANYREFS, "unexpected file descriptors");
		break;
	default:
		sock_error(c, rid, r, "malformed frame: %s", strerror(-r));
		break;
	}
	if (!rid)
		client_linger(c, "malformed frame");
}

/* Has the client's user used its share of the step time (see
 * SRV_CTL_SHARE_PERMILLE)? */
static bool client_throttled(const struct client *c, bool busy)
{
	return busy && c->share->ctl_until > c->srv->ctl_earned_ns + SRV_CTL_BURST_NS;
}

/* Has the client used its time in this loop turn? */
static bool client_turn_used(const struct client *c)
{
	return c->turn == c->srv->turn && c->turn_ns >= SRV_TURN_CLIENT_NS;
}

/* Charge a client (and its user) for control work that took cost_ns. */
static void client_charge(struct client *c, uint64_t cost_ns, bool busy)
{
	struct user_share *u = c->share;
	if (c->turn != c->srv->turn) {
		c->turn = c->srv->turn;
		c->turn_ns = 0;
	}
	c->turn_ns += cost_ns;
	if (busy) {
		uint64_t earned = c->srv->ctl_earned_ns;
		u->ctl_until = (u->ctl_until > earned ? u->ctl_until : earned) + cost_ns;
	}
}

static void handle_sock_frames(struct client *c, bool busy, uint64_t *t_charged);

/* Take a throttled client's socket out of epoll's read set, so that its
 * waiting frames do not make every epoll_wait return at once; hang-ups
 * are still reported (then it is read, to see the end). */
static void client_pause(struct client *c)
{
	struct epoll_event ev = { .events = 0, .data.ptr = &c->sock_src };
	if (c->sock_paused || epoll_ctl(c->srv->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		return;
	c->sock_paused = true;
	c->srv->n_paused++;
}

static void client_resume(struct client *c)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &c->sock_src };
	if (!c->sock_paused)
		return;
	c->sock_paused = false;
	c->srv->n_paused--;
	if (c->fd >= 0 && epoll_ctl(c->srv->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		client_close(c, "epoll");
}

/* After a step: read again from clients that have earned their share
 * back, or from everyone when the scheduler ran out of work. */
static void resume_paused(struct kvd_server *srv)
{
	bool busy = !kvd_sched_idle(srv->sched);
	for (struct client *c = srv->clients, *next; c && srv->n_paused; c = next) {
		next = c->next;
		if (c->sock_paused && !client_throttled(c, busy))
			client_resume(c);
	}
}

static void handle_sock(struct client *c, uint32_t events)
{
	bool busy = !kvd_sched_idle(c->srv->sched);

	if (!(events & (EPOLLHUP | EPOLLERR))) {
		if (client_throttled(c, busy)) {
			client_pause(c);
			return;
		}
		if (client_turn_used(c))
			return; /* still readable: epoll reports it next turn */
	}
	uint64_t t_charged = now_ns();
	handle_sock_frames(c, busy, &t_charged);
	if (!c->closing)
		client_charge(c, now_ns() - t_charged, busy);
}

/* Frames of one turn; *t_charged: up to when the client was charged. */
static void handle_sock_frames(struct client *c, bool busy, uint64_t *t_charged)
{
	struct kvd_server *srv = c->srv;
	struct ipc_frame f;
	size_t bytes = 0;

	for (int k = 0; k < SRV_TURN_FRAMES && bytes < SRV_TURN_BYTES && !c->closing; k++) {
		if (k) { /* stop as soon as the turn's time or the share is used up */
			uint64_t t = now_ns();
			client_charge(c, t - *t_charged, busy);
			*t_charged = t;
			if (client_turn_used(c) || client_throttled(c, busy))
				return;
		}
		memset(&f, 0, sizeof(f));
		int r = ipc_recv_nowait(c->fd, srv->rxbuf, IPC_MAX_FRAME_BYTES, IPC_FROM_CLIENT, &f);
		if (r == -EAGAIN)
			return;
		bytes += IPC_HDR_BYTES + (r == 0 ? f.hdr.length : 0);
		if (r == -ECONNRESET) {
			client_close(c, "disconnected");
			return;
		}
		if (c->lingering) { /* read and drop until the client hangs up */
			if (r == 0)
				ipc_frame_close_fds(&f);
			continue;
		}
		if (r < 0) {
			frame_error(c, r, &f);
			continue;
		}
		ipc_frame_close_fds(&f);
		c->last_active_ns = now_ns();
		if (!c->welcomed) {
			if (f.hdr.type != IPC_MSG_HELLO) {
				sock_error(c, 0, -EPROTO, "HELLO expected, got %s", ipc_type_name(f.hdr.type));
				client_linger(c, "no HELLO");
				return;
			}
			handle_hello(c, &f);
			continue;
		}
		uint64_t rid = f.hdr.request_id;
		switch (f.hdr.type) {
		case IPC_MSG_HELLO:
			/* The handshake happens once; a second one is a
			 * protocol violation about the connection. */
			sock_error(c, 0, -EPROTO, "HELLO sent twice");
			client_linger(c, "second HELLO");
			return;
		case IPC_MSG_GENERATE:
			if (!rid) {
				sock_error(c, 0, -EINVAL, "GENERATE needs a non-zero request id");
				client_linger(c, "request id 0");
				return;
			}
			handle_generate(c, &f);
			break;
		case IPC_MSG_CANCEL:
			handle_cancel(c, rid);
			break;
		case IPC_MSG_STATS: {
			struct ipc_stats st;
			fill_stats(srv, &st);
			sock_send(c, IPC_MSG_STATS_REPLY, 0, rid, &st, sizeof(st));
			break;
		}
		case IPC_MSG_TOKENIZE:
			handle_tokenize(c, &f);
			break;
		case IPC_MSG_SESSION_OPEN:
			handle_session_open(c, &f);
			break;
		case IPC_MSG_SESSION_CLOSE:
			handle_session_close(c, &f);
			break;
		case IPC_MSG_PING: {
			struct ipc_ping p;
			if (ipc_decode_ping(&f, &p) < 0)
				sock_error(c, rid, -EBADMSG, "malformed PING");
			else
				sock_send(c, IPC_MSG_PONG, 0, rid, &p, sizeof(p));
			break;
		}
		case IPC_MSG_PS:
			handle_ps(c, rid);
			break;
		default:
			sock_error(c, rid, -EPROTO, "%s is not a request", ipc_type_name(f.hdr.type));
			break;
		}
	}
}

/* ---- configuration, signals, systemd ---------------------------------------- */

static struct kvd_sched_config sched_config(const struct kvd_config *cfg, uint32_t n_ctx)
{
	return (struct kvd_sched_config){
		.max_num_seqs = cfg->max_num_seqs,
		.max_tokens_per_step = cfg->max_tokens_per_step,
		.max_model_len = n_ctx,
		.max_waiting = cfg->max_waiting,
		.session_idle_s = cfg->session_idle_s,
		.max_step_ms = cfg->max_step_ms,
	};
}

static void apply_reload(struct kvd_server *srv, const struct kvd_config *n)
{
	struct kvd_config *o = &srv->cfg;
#define RESTART(field, name)                                                                       \
	do {                                                                                       \
		if (memcmp(&o->field, &n->field, sizeof(o->field)))                               \
			log_warning("reload: %s changed; it takes effect only after a restart", name); \
	} while (0)
	RESTART(model, "model.path");
	RESTART(backend, "engine.backend");
	RESTART(threads, "engine.threads");
	RESTART(pool_bytes, "kv.pool_size");
	RESTART(pool_fraction, "kv.pool_size");
	RESTART(block_size, "kv.block_size");
	RESTART(prefix_caching, "kv.prefix_caching");
	RESTART(swap_file, "kv.swap_file");
	RESTART(swap_bytes, "kv.swap_size");
	RESTART(max_model_len, "scheduler.max_model_len");
	RESTART(socket, "server.socket");
	RESTART(socket_mode, "server.socket_mode");
	RESTART(socket_group, "server.socket_group");
#undef RESTART
	struct kvd_config keep = *o;
	*o = *n;
	/* restart-only fields keep their running values */
	memcpy(o->model, keep.model, sizeof(o->model));
	memcpy(o->backend, keep.backend, sizeof(o->backend));
	o->threads = keep.threads;
	o->pool_bytes = keep.pool_bytes;
	o->pool_fraction = keep.pool_fraction;
	o->block_size = keep.block_size;
	o->prefix_caching = keep.prefix_caching;
	memcpy(o->swap_file, keep.swap_file, sizeof(o->swap_file));
	o->swap_bytes = keep.swap_bytes;
	o->max_model_len = keep.max_model_len;
	memcpy(o->socket, keep.socket, sizeof(o->socket));
	o->socket_mode = keep.socket_mode;
	memcpy(o->socket_group, keep.socket_group, sizeof(o->socket_group));
	kvd_log_level = o->log_level;
	struct kvd_sched_config sc = sched_config(o, srv->n_ctx);
	kvd_sched_set_config(srv->sched, &sc);
	kvd_ledger_reopen(srv->ledger, o->ledger_log); /* always: logrotate renames, then sends SIGHUP */
	/* The allow-list holds for connections already open, too. */
	for (struct client *c = srv->clients, *next; c; c = next) {
		next = c->next;
		if (c->closing || c->lingering)
			continue;
		c->admin = peer_is_admin(srv, c->fd, &c->cred);
		if (peer_allowed(srv, c->fd, &c->cred))
			continue;
		log_notice("reload: closing client %" PRIu64 " (pid %d uid %u): no longer in server.allowed_users/groups",
			   c->id, (int)c->cred.pid, (unsigned)c->cred.uid);
		sock_error(c, 0, IPC_ERR_DENIED, "uid %u may no longer use kvd (server.allowed_users / allowed_groups)",
			   (unsigned)c->cred.uid);
		client_linger(c, "denied after reload");
	}
	log_notice("configuration reloaded: log level %d, max_num_seqs %u, max_tokens_per_step %u, "
		   "max_requests_per_client %u, max_prompt_bytes %" PRIu64 ", %zu allowed users, %zu allowed groups",
		   o->log_level, o->max_num_seqs, o->max_tokens_per_step, o->max_requests_per_client, o->max_prompt_bytes,
		   o->n_allowed_uids, o->n_allowed_gids);
}

static void begin_stop(struct kvd_server *srv, const char *why)
{
	uint64_t t = now_ns();
	if (srv->stopping) {
		log_notice("%s again: ending running requests now", why);
		srv->drain_deadline = t;
		return;
	}
	srv->stopping = true;
	srv->drain_deadline = t + (uint64_t)srv->cfg.drain_timeout_s * 1000000000ull;
	if (srv->listen_fd >= 0) {
		epoll_ctl(srv->ep, EPOLL_CTL_DEL, srv->listen_fd, NULL);
		close(srv->listen_fd);
		srv->listen_fd = -1;
	}
	sd_notify(0, "STOPPING=1\nSTATUS=draining: finishing running requests");
	log_notice("%s: draining (new requests refused; running ones get up to %us)", why, srv->cfg.drain_timeout_s);
}

static void handle_signal(struct kvd_server *srv)
{
	struct signalfd_siginfo si;
	while (read(srv->sig_fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		switch (si.ssi_signo) {
		case SIGTERM:
		case SIGINT:
			begin_stop(srv, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
			break;
		case SIGHUP: {
			struct kvd_config n;
			sd_notify(0, "RELOADING=1");
			if (!srv->hooks.reload || srv->hooks.reload(srv->hooks.ud, &n) < 0)
				log_error("reload failed; the running configuration stays");
			else
				apply_reload(srv, &n);
			sd_notify(0, "READY=1");
			break;
		}
		default:
			break;
		}
	}
}

static uint32_t live_requests(const struct kvd_server *srv)
{
	uint32_t n = 0;
	for (const struct client *c = srv->clients; c; c = c->next)
		n += c->n_inflight;
	return n;
}

/* Shutdown: past the drain deadline, end what still runs with an ERROR
 * IPC_ERR_SHUTDOWN record (uploads get it on the socket). */
static void cancel_all(struct kvd_server *srv)
{
	uint32_t n = 0;
	for (struct client *c = srv->clients; c; c = c->next) {
		for (struct greq *gr = c->reqs, *next; gr; gr = next) {
			next = gr->next;
			if (gr->state == GR_UPLOADING) {
				sock_error(c, gr->id, IPC_ERR_SHUTDOWN, "kvd is shutting down; request not started");
				if (c->closing)
					break;
				greq_unlink(c, gr);
				greq_free(gr);
				n++;
			} else if (!gr->finished) {
				gr->shutdown = true;
				kvd_sched_cancel(srv->sched, (uint64_t)(uintptr_t)gr);
				n++;
			}
		}
		while (c->up_head) { /* nobody will read these any more */
			struct upload *u = c->up_head;
			c->up_head = u->next;
			srv->n_uploading--;
			c->n_uploads--;
			upload_free(u);
		}
		c->up_tail = NULL;
		client_mark_dirty(c);
	}
	if (n)
		log_notice("drain timeout: ended %u request(s) with a shutdown error", n);
}

static void update_status(struct kvd_server *srv)
{
	struct kvmm_stats ks;
	struct kvd_sched_stats ss;
	char buf[256];

	kvmm_get_stats(srv->kv, &ks);
	kvd_sched_get_stats(srv->sched, &ss);
	snprintf(buf, sizeof(buf), "STATUS=%s: %u running, %u waiting, %u swapped, %u/%u pages, %u clients",
		 srv->stopping ? "draining" : "serving", ss.running, ss.waiting + srv->n_uploading, ss.swapped,
		 ks.pages_used, ks.pages_total, srv->n_clients);
	if (strcmp(buf, srv->last_status)) {
		sd_notify(0, buf);
		memcpy(srv->last_status, buf, sizeof(buf));
	}
}

int kvd_server_create(const struct kvd_config *cfg, struct kvd_engine *e, int listen_fd, int sig_fd,
		      const struct kvd_server_hooks *hooks, struct kvd_server **ret)
{
	struct kvd_server *srv = calloc(1, sizeof(*srv));
	int r;

	if (!srv) {
		close(listen_fd);
		close(sig_fd);
		return -ENOMEM;
	}
	srv->cfg = *cfg;
	srv->e = e;
	srv->kv = kvd_engine_kvmm(e);
	srv->tok = kvd_model_tokenizer(kvd_engine_model(e));
	srv->listen_fd = listen_fd;
	srv->sig_fd = sig_fd;
	srv->ep = -1;
	if (hooks)
		srv->hooks = *hooks;
	srv->t_start = now_ns();
#ifndef NDEBUG
	/* Test builds only: comma-separated faults to inject ("peercred":
	 * every SO_PEERCRED read fails). */
	const char *faults = getenv("KVD_TEST_FAULTS");
	srv->fault_peercred = faults && strstr(faults, "peercred");
	if (srv->fault_peercred)
		log_warning("KVD_TEST_FAULTS: reading peer credentials fails on purpose");
#endif
	uint32_t n_train = (uint32_t)kvd_model_hparams(kvd_engine_model(e))->n_ctx_train;
	if (!n_train)
		n_train = 2048;
	srv->n_ctx = cfg->max_model_len && cfg->max_model_len < n_train ? cfg->max_model_len : n_train;
	srv->rxbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	if (!srv->rxbuf) {
		r = -ENOMEM;
		goto fail;
	}
	struct kvd_sched_config sc = sched_config(cfg, srv->n_ctx);
	struct kvd_sched_events ev = {
		.on_token = on_token,
		.on_done = on_done,
		.is_eog = sched_is_eog,
		.on_session_expired = on_session_expired,
		.ud = srv,
	};
	r = kvd_sched_create(&sc, e, &ev, &srv->sched);
	if (r < 0)
		goto fail;
	srv->ep = epoll_create1(EPOLL_CLOEXEC);
	if (srv->ep < 0) {
		r = -errno;
		goto fail;
	}
	srv->listen_src = (struct ep_src){ SRC_LISTEN, srv };
	srv->sig_src = (struct ep_src){ SRC_SIGNAL, srv };
	if ((r = ep_add(srv, listen_fd, &srv->listen_src)) < 0 || (r = ep_add(srv, sig_fd, &srv->sig_src)) < 0)
		goto fail;
	r = kvd_ledger_new(cfg->ledger_log, &srv->ledger);
	if (r < 0)
		goto fail;
	*ret = srv;
	return 0;
fail:
	kvd_server_free(srv);
	return r;
}

struct kvd_server *kvd_server_free(struct kvd_server *srv)
{
	if (!srv)
		return NULL;
	while (srv->clients)
		client_close(srv->clients, "server exit");
	free_closed(srv);
	while (srv->sessions) {
		struct session *s = srv->sessions;
		srv->sessions = s->next;
		session_free(srv, s);
	}
	srv->sched = kvd_sched_destroy(srv->sched);
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	if (srv->sig_fd >= 0)
		close(srv->sig_fd);
	if (srv->ep >= 0)
		close(srv->ep);
	srv->ledger = kvd_ledger_free(srv->ledger);
	free(srv->rxbuf);
	free(srv);
	return NULL;
}

/* Client sockets least recently read first (everything else keeps its
 * place ahead of them): level-triggered epoll reports ready fds in the
 * same order every turn, so without this the first connections of a turn
 * could use up a user's share every time and starve the others. */
static uint64_t event_key(const struct epoll_event *ev)
{
	const struct ep_src *src = ev->data.ptr;
	return src->kind == SRC_SOCK ? 1 + ((const struct client *)src->p)->turn : 0;
}

static void sort_events(struct epoll_event *evs, int n)
{
	for (int i = 1; i < n; i++) { /* insertion sort: n <= SRV_MAX_EVENTS, mostly sorted */
		struct epoll_event e = evs[i];
		uint64_t k = event_key(&e);
		int j = i;
		while (j > 0 && event_key(&evs[j - 1]) > k) {
			evs[j] = evs[j - 1];
			j--;
		}
		evs[j] = e;
	}
}

static int ms_until(uint64_t t, uint64_t deadline)
{
	if (deadline <= t)
		return 0;
	uint64_t ms = (deadline - t + 999999) / 1000000;
	return ms > 60000 ? 60000 : (int)ms;
}

int kvd_server_run(struct kvd_server *srv)
{
	struct epoll_event evs[SRV_MAX_EVENTS];
	uint64_t usec = 0;
	bool progress = true;

	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
		srv->watchdog_ns = usec * 1000ull / 2;
	sd_notify(0, "READY=1");
	update_status(srv);
	srv->next_status = now_ns() + SRV_STATUS_NS;
	srv->next_watchdog = now_ns();
	srv->next_expire = now_ns() + SRV_EXPIRE_NS;
	for (;;) {
		uint64_t t = now_ns();
		srv->turn++;
		if (srv->watchdog_ns && t >= srv->next_watchdog) {
			sd_notify(0, "WATCHDOG=1");
			srv->next_watchdog = t + srv->watchdog_ns;
		}
		if (t >= srv->next_status) {
			update_status(srv);
			srv->next_status = t + SRV_STATUS_NS;
		}
		if (t >= srv->next_expire) {
			expire_sessions(srv, t);
			srv->next_expire = t + SRV_EXPIRE_NS;
		}
		if (srv->accept_paused_until && t >= srv->accept_paused_until) {
			srv->accept_paused_until = 0;
			if (srv->listen_fd >= 0 && ep_add(srv, srv->listen_fd, &srv->listen_src) < 0)
				log_error("cannot listen again: %m");
		}
		if (srv->stopping) {
			if (!live_requests(srv))
				break;
			if (!srv->cancelled_all && t >= srv->drain_deadline) {
				cancel_all(srv);
				srv->cancelled_all = true;
				srv->final_deadline = t + SRV_FINAL_FLUSH_NS;
				flush_dirty(srv);
				continue;
			}
			if (srv->cancelled_all && t >= srv->final_deadline) {
				log_warning("shutdown: %u request(s) could not deliver their last records", live_requests(srv));
				break;
			}
		}

		int timeout;
		bool busy = !kvd_sched_idle(srv->sched);
		if (srv->dirty || (busy && progress)) {
			timeout = 0;
		} else {
			uint64_t next = srv->next_status < srv->next_expire ? srv->next_status : srv->next_expire;
			if (srv->watchdog_ns && srv->next_watchdog < next)
				next = srv->next_watchdog;
			if (srv->accept_paused_until && srv->accept_paused_until < next)
				next = srv->accept_paused_until;
			if (srv->stopping) {
				uint64_t d = srv->cancelled_all ? srv->final_deadline : srv->drain_deadline;
				if (d < next)
					next = d;
			}
			timeout = ms_until(t, next);
			if (busy && timeout > 5)
				timeout = 5; /* work that made no progress: retry soon */
		}
		int n = epoll_wait(srv->ep, evs, SRV_MAX_EVENTS, timeout);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("epoll_wait: %m");
			return -errno;
		}
		sort_events(evs, n);
		for (int i = 0; i < n; i++) {
			struct ep_src *src = evs[i].data.ptr;
			switch (src->kind) {
			case SRC_LISTEN:
				if (!srv->stopping)
					handle_accept(srv);
				break;
			case SRC_SIGNAL:
				handle_signal(srv);
				break;
			case SRC_SOCK: {
				struct client *c = src->p;
				if (!c->closing)
					handle_sock(c, evs[i].events);
				break;
			}
			case SRC_CHAN: {
				struct client *c = src->p;
				if (!c->closing) {
					ipc_chan_ack(c->chan);
					client_service(c);
				}
				break;
			}
			}
		}
		free_closed(srv);
		if (!kvd_sched_idle(srv->sched)) {
			uint64_t t_step = now_ns();
			int r = kvd_sched_step(srv->sched);
			srv->ctl_earned_ns += (now_ns() - t_step) * SRV_CTL_SHARE_PERMILLE / 1000;
			progress = r != 0;
			if (r < 0)
				log_error("scheduler step failed: %s", strerror(-r));
		}
		if (srv->n_paused)
			resume_paused(srv);
		flush_dirty(srv);
		free_closed(srv);
	}
	sd_notify(0, "STOPPING=1\nSTATUS=stopped");
	log_notice("stopped");
	return 0;
}
