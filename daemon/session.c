/*
 * daemon/session.c — sessions (SESSION_OPEN / SESSION_CLOSE, owned by a
 * uid, not a connection) and the once-a-second timeouts: idle and silent
 * connections, lingering ones, idle sessions.
 */
#include "server_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void session_free(struct kvd_server *srv, struct session *s)
{
	if (s->busy) {
		struct greq *gr = s->busy;
		gr->sess = NULL;
		s->busy = NULL;
		if (gr->state == GR_SCHED && !gr->finished) {
			gr->closed_session = s->id; /* the client hears why its turn ended */
			kvd_sched_cancel(srv->sched, (uint64_t)(uintptr_t)gr);
		}
	}
	kvd_sched_session_close(srv->sched, s->id);
	srv->n_sessions--;
	free(s->turn_start);
	free(s);
}

void handle_session_open(struct client *c, const struct ipc_frame *f)
{
	struct kvd_server *srv = c->srv;
	struct ipc_session_open so;
	struct ipc_gen_context ctx;
	int r = ipc_decode_session_open_ctx(f, &so, &ctx);

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
	s->ctx = ctx;
	s->ctx_set = so.flags & IPC_SESSION_CONTEXT;
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

void handle_session_close(struct client *c, const struct ipc_frame *f)
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

void expire_sessions(struct kvd_server *srv, uint64_t t)
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
void on_session_expired(void *ud, uint64_t session)
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
		free(s->turn_start);
		free(s);
		return;
	}
}
