/*
 * daemon/conn.c — client connections: accept and the peer checks
 * (allowed users and groups, admins), the connection limits, the handshake,
 * fairness between users (a share of the loop per uid), reading and
 * dispatching socket frames, lingering after a refusal, and closing.
 */
#include "server_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"
#include "kvmm.h"
#include "log.h"
#include "model.h"
#include "tokenizer.h"

/* ---- small helpers -------------------------------------------------------- */

int ep_add(struct kvd_server *srv, int fd, struct ep_src *src)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = src };
	return epoll_ctl(srv->ep, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/* A reply on the socket. A client whose socket buffer is full is not
 * reading its replies; it is dropped rather than let it stall the loop. */
int sock_send(struct client *c, uint16_t type, uint32_t flags, uint64_t rid, const void *p, size_t n)
{
	return sock_send_fds(c, type, flags, rid, p, n, NULL, 0);
}

int sock_send_fds(struct client *c, uint16_t type, uint32_t flags, uint64_t rid, const void *p, size_t n,
		  const int *fds, unsigned n_fds)
{
	int r = ipc_send_nowait(c->fd, type, flags, rid, p, n, fds, n_fds);
	if (r == -EAGAIN)
		client_close(c, "socket buffer full (client does not read its replies)");
	else if (r < 0 && r != -EPIPE && r != -ECONNRESET)
		log_debug("client %" PRIu64 ": send: %s", c->id, strerror(-r));
	return r;
}

void sock_error(struct client *c, uint64_t rid, int32_t code, const char *fmt, ...)
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


/* ---- the handshake ---------------------------------------------------------- */

/* WELCOME's model id from the model file's path: the base name without
 * ".gguf", cut to the field at a UTF-8 character boundary, control
 * characters as '_'. */
static void model_id_from_path(const char *path, char out[IPC_MODEL_ID_BYTES])
{
	const char *base = strrchr(path, '/');
	size_t n;

	base = base ? base + 1 : path;
	n = strlen(base);
	if (n > 5 && !strcmp(base + n - 5, ".gguf"))
		n -= 5;
	if (n > IPC_MODEL_ID_BYTES - 1) {
		n = IPC_MODEL_ID_BYTES - 1;
		while (n > 0 && ((unsigned char)base[n] & 0xc0) == 0x80)
			n--; /* base[n] continues a character: cut before it */
	}
	memset(out, 0, IPC_MODEL_ID_BYTES);
	for (size_t i = 0; i < n; i++)
		out[i] = (unsigned char)base[i] < 0x20 || base[i] == 0x7f ? '_' : base[i];
}

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
	w.server_version = srv->server_version;
	w.capabilities = IPC_CAP_SESSIONS;
	w.client_id = c->id;
	w.n_vocab = (uint32_t)hp->n_vocab;
	w.n_ctx = srv->n_ctx;
	w.block_size = lay->block_size;
	w.n_layers = (uint32_t)hp->n_layer;
	w.n_kv_heads = (uint32_t)hp->n_head_kv;
	w.head_dim = (uint32_t)hp->head_dim;
	/* whole bytes per element, rounded up for the quantized types, whose
	 * exact cost (scales included) is kv_bytes_per_token */
	w.kv_dtype_bytes = (uint32_t)((kvd_kv_row_bytes(lay->type, lay->kv_dim) + lay->kv_dim - 1) / lay->kv_dim);
	w.max_text_bytes = (uint32_t)srv->cfg.max_prompt_bytes;
	w.max_requests = srv->cfg.max_requests_per_client;
	w.max_gen_tokens = srv->n_ctx < IPC_MAX_GEN_TOKENS ? srv->n_ctx : IPC_MAX_GEN_TOKENS;
	w.shm_bytes = ipc_chan_shm_bytes(c->chan);
	w.kv_bytes_per_token = lay->page_bytes / lay->block_size;
	if (h.client_version >= IPC_KV_TYPE_CLIENT_VERSION) /* older clients check it is zero */
		w.kv_type = (uint32_t)lay->type + 1;
	w.pool_bytes = (uint64_t)kvmm_n_pages(srv->kv) * kvmm_page_bytes(srv->kv);
	snprintf(w.model_name, sizeof(w.model_name), "%s", kvd_model_name(kvd_engine_model(srv->e)));
	if (h.client_version >= IPC_MODEL_ID_CLIENT_VERSION) /* older clients check it is zero */
		model_id_from_path(srv->cfg.model, w.model_id);
	size_t wlen = IPC_WELCOME_V080_BYTES; /* all an older client accepts */
	if (h.client_version >= IPC_CHAT_FORMAT_CLIENT_VERSION) {
		snprintf(w.chat_format, sizeof(w.chat_format), "%s",
			 kvd_tokenizer_chat_format(kvd_model_tokenizer(kvd_engine_model(srv->e))));
		wlen = sizeof(w);
	}
	r = ipc_chan_fds(c->chan, fds);
	if (r == 0)
		r = ipc_send_nowait(c->fd, IPC_MSG_WELCOME, 0, 0, &w, wlen, fds, IPC_WELCOME_N_FDS);
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
	c->client_version = h.client_version;
	h.client_name[IPC_CLIENT_NAME_BYTES - 1] = 0;
	log_debug("client %" PRIu64 " (pid %d uid %u) says hello as '%s' version %u.%u.%u", c->id, (int)c->cred.pid,
		  (unsigned)c->cred.uid, h.client_name, h.client_version >> 16, (h.client_version >> 8) & 0xff,
		  h.client_version & 0xff);
}

/* ---- connections ------------------------------------------------------------ */

bool peer_allowed(struct kvd_server *srv, int fd, const struct ipc_peer_cred *cr)
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
bool peer_is_admin(struct kvd_server *srv, int fd, const struct ipc_peer_cred *cr)
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

void handle_accept(struct kvd_server *srv)
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
void client_linger(struct client *c, const char *why)
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
void client_close(struct client *c, const char *why)
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
	if (c->up_paused) {
		c->up_paused = false;
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

void free_closed(struct kvd_server *srv)
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
bool client_throttled(const struct client *c, bool busy)
{
	return busy && c->share->ctl_until > c->srv->ctl_earned_ns + SRV_CTL_BURST_NS;
}

/* Has the client used its time in this loop turn? */
static bool client_turn_used(const struct client *c)
{
	return c->turn == c->srv->turn && c->turn_ns >= SRV_TURN_CLIENT_NS;
}

/* Charge a client (and its user) for control work that took cost_ns. */
void client_charge(struct client *c, uint64_t cost_ns, bool busy)
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
void resume_paused(struct kvd_server *srv)
{
	bool busy = !kvd_sched_idle(srv->sched);
	for (struct client *c = srv->clients, *next; c && srv->n_paused; c = next) {
		next = c->next;
		if (c->sock_paused && !client_throttled(c, busy))
			client_resume(c);
		if (c->up_paused && !c->closing && !client_throttled(c, busy)) {
			c->up_paused = false;
			srv->n_paused--;
			client_service(c); /* its uploads, where it left them */
		}
	}
}

void handle_sock(struct client *c, uint32_t events)
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
			fill_stats(srv, c, &st);
			if (c->client_version < IPC_SAMPLES_SERVER_VERSION) /* fields after 0.2's are its reserved zeros */
				st.samples_forked = st.pages_adopted = 0;
			if (c->client_version < IPC_RELEASE_SERVER_VERSION) /* and after 0.3's */
				st.pages_packed = st.pages_released = 0;
			if (c->client_version < IPC_CACHE_SERVER_VERSION) /* and after 0.5's */
				st.adopted_hit_tokens = 0;
			/* older clients take exactly 0.7.0's reply; newer ones any length */
			sock_send(c, IPC_MSG_STATS_REPLY, 0, rid, &st,
				  c->client_version < IPC_STATS_GROW_VERSION ? IPC_STATS_V070_BYTES : sizeof(st));
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
		case IPC_MSG_KVMAP:
			handle_kvmap(c, rid);
			break;
		case IPC_MSG_HIST:
			handle_hist(c, rid);
			break;
		case IPC_MSG_LEDGER:
			handle_ledger(c, &f);
			break;
		case IPC_MSG_CACHE:
			handle_cache(c, &f);
			break;
		default:
			sock_error(c, rid, -EPROTO, "%s is not a request", ipc_type_name(f.hdr.type));
			break;
		}
	}
}
