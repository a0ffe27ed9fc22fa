/*
 * client/kvclient.c — libkvclient: a connection to kvd, the generation
 * requests running on it, and the control calls (stats, tokenize,
 * sessions, ps, ping).
 *
 * One connection is a socket (control frames both ways) plus a shared
 * memory channel (prompt uploads out, the token stream in). Everything is
 * driven from pump(): it drains the token ring into per-request event
 * queues, reads socket frames when poll() says so, and sleeps in poll()
 * on the socket and the channel's wake-up socket — after announcing the
 * sleep in the ring's waiting flag, so the daemon sends a wake-up only when
 * this process really sleeps. Callers wait for a condition (a request has
 * an event, a control reply arrived, the upload ring has room) by passing
 * it to pump().
 *
 * No locks: a client is used by one thread at a time (see kvclient.h);
 * kvc_cancel() touches nothing but the socket fd.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvclient.h"
#include "ipc.h"

/* Everything defined from here on is internal unless kvclient.h declared
 * it with KVC_EXPORT (an explicit attribute beats the pragma). */
#pragma GCC visibility push(hidden)

static_assert(KVC_ERR_VERSION == IPC_ERR_VERSION && KVC_ERR_CONTEXT == IPC_ERR_CONTEXT &&
		      KVC_ERR_SHUTDOWN == IPC_ERR_SHUTDOWN && KVC_ERR_LIMIT == IPC_ERR_LIMIT &&
		      KVC_ERR_ENGINE == IPC_ERR_ENGINE && KVC_ERR_SESSION == IPC_ERR_SESSION &&
		      KVC_ERR_DENIED == IPC_ERR_DENIED,
	      "kvclient.h error codes are the wire codes");
static_assert((int)KVC_FINISH_EOS == (int)IPC_FINISH_EOS && (int)KVC_FINISH_ERROR == (int)IPC_FINISH_ERROR &&
		      (int)KVC_FINISH_CANCELLED == (int)IPC_FINISH_CANCELLED,
	      "finish reasons are the wire values");
static_assert((int)KVC_REQ_WAITING == (int)IPC_REQ_WAITING && (int)KVC_REQ_UPLOADING == (int)IPC_REQ_UPLOADING,
	      "request states are the wire values");
static_assert(KVC_TOK_ADD_BOS == IPC_TOK_ADD_BOS && KVC_TOK_PARSE_SPECIAL == IPC_TOK_PARSE_SPECIAL,
	      "tokenize flags are the wire flags");
static_assert(KVC_GEN_RAW == IPC_GEN_RAW && KVC_GEN_WANT_IDS == IPC_GEN_WANT_IDS &&
		      KVC_GEN_PARSE_SPECIAL == IPC_GEN_PARSE_SPECIAL,
	      "generate flags");
static_assert(sizeof(((struct kvc_result *)0)->error_message) == IPC_MAX_ERROR_MSG_BYTES + 1, "error message");
static_assert(sizeof(((struct kvc_info *)0)->model_name) == IPC_MODEL_NAME_BYTES, "model name");

#define MSG_CAP (IPC_MAX_ERROR_MSG_BYTES + 1)
/* Token ids a hostile or broken daemon may make us allocate for one text. */
#define MAX_TOKENIZE_IDS (IPC_MAX_TEXT_BYTES + 64u)
#define MAX_PS_ENTRIES   (1u << 20)

struct evnode {
	struct evnode *next;
	struct kvc_event ev;
	_Alignas(8) unsigned char data[]; /* ids, then text and a NUL */
};

struct kvc_request {
	kvc_client *c;
	kvc_request *prev, *next;   /* the client's list */
	uint64_t id;
	struct evnode *head, *tail; /* events not yet returned */
	struct evnode *cur;         /* returned by the last kvc_request_next() */
	bool finished;              /* the terminal event arrived (result valid) */
	int status;                 /* 0, -ECANCELED or the error; when finished */
	struct kvc_result result;
};

typedef int (*ctl_fn)(kvc_client *c, const struct ipc_frame *f, void *arg);

struct kvc_client {
	int fd;
	struct ipc_chan *ch;
	struct kvc_info info;
	uint64_t next_id;
	kvc_request *reqs;
	int dead;                   /* 0, or why the connection is unusable */
	int timeout_ms;
	/* The control call in progress (one at a time). */
	uint64_t ctl_id;
	ctl_fn ctl;
	void *ctl_arg;
	bool ctl_done;
	int ctl_status;
	char last_msg[MSG_CAP];
	uint8_t *sockbuf;           /* one socket frame */
	uint8_t *ringbuf;           /* one ring record (separate: ring drains nest in socket handling) */
	uint8_t *txbuf;             /* a GENERATE being encoded */
};

/* ---- small helpers ------------------------------------------------------------ */

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t deadline_in(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : now_ns() + (int64_t)timeout_ms * 1000000;
}

/* poll() timeout until deadline: -1 without one, rounded up otherwise. */
static int remaining_ms(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t left = deadline - now_ns();
	if (left <= 0)
		return 0;
	int64_t ms = (left + 999999) / 1000000;
	return ms > 1000000000 ? 1000000000 : (int)ms;
}

static bool expired(int64_t deadline)
{
	return deadline >= 0 && now_ns() >= deadline;
}

static void set_msg(char *dst, const char *src, size_t n)
{
	if (n > MSG_CAP - 1)
		n = MSG_CAP - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

static kvc_request *find_req(kvc_client *c, uint64_t id)
{
	for (kvc_request *r = c->reqs; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

static void req_end(kvc_request *r, int status, int reason, int error, const char *msg, size_t msg_len,
		    const struct ipc_done *d)
{
	if (r->finished)
		return;
	r->finished = true;
	r->status = status;
	r->result.finish_reason = reason;
	r->result.error = error;
	set_msg(r->result.error_message, msg ? msg : "", msg ? msg_len : 0);
	if (d) {
		r->result.prompt_tokens = d->prompt_tokens;
		r->result.cached_tokens = d->cached_tokens;
		r->result.generated_tokens = d->generated_tokens;
		r->result.queue_ns = d->queue_ns;
		r->result.ttft_ns = d->ttft_ns;
		r->result.decode_ns = d->decode_ns;
		r->result.total_ns = d->total_ns;
	}
}

/* The connection is unusable from now on: every request and the control
 * call in progress end with err (and the daemon's message, if it sent
 * one). Keeps the first cause. */
static void fail_conn_msg(kvc_client *c, int err, const char *msg, size_t msg_len)
{
	if (c->dead)
		return;
	c->dead = err;
	set_msg(c->last_msg, msg ? msg : "", msg ? msg_len : 0);
	for (kvc_request *r = c->reqs; r; r = r->next)
		req_end(r, err, KVC_FINISH_ERROR, err, msg, msg_len, NULL);
	if (c->ctl_id && !c->ctl_done) {
		c->ctl_done = true;
		c->ctl_status = err;
	}
}

static void fail_conn(kvc_client *c, int err)
{
	fail_conn_msg(c, err, NULL, 0);
}

/* ---- the token ring ---------------------------------------------------------------- */

static int enqueue_token(kvc_request *r, const struct ipc_token_msg *m)
{
	size_t ids_bytes = 4u * m->t.n_ids;
	struct evnode *e = malloc(sizeof(*e) + ids_bytes + m->t.text_bytes + 1);
	if (!e)
		return -ENOMEM;
	e->next = NULL;
	memcpy(e->data, m->ids, ids_bytes);
	char *text = (char *)e->data + ids_bytes;
	memcpy(text, m->text, m->t.text_bytes);
	text[m->t.text_bytes] = '\0';
	e->ev = (struct kvc_event){
		.type = KVC_EVENT_TOKEN,
		.request_id = r->id,
		.text = text,
		.text_len = m->t.text_bytes,
		.index = m->t.index,
		.n_tokens = m->t.n_tokens,
		.ids = m->t.n_ids ? (const int32_t *)(void *)e->data : NULL,
	};
	if (r->tail)
		r->tail->next = e;
	else
		r->head = e;
	r->tail = e;
	return 0;
}

/* A request ends by DONE, or by ERROR with a code and message. */
static void end_by_done(kvc_request *r, const struct ipc_done *d)
{
	int status = d->finish_reason == IPC_FINISH_CANCELLED ? -ECANCELED
		     : d->finish_reason == IPC_FINISH_ERROR   ? d->error
							      : 0;
	req_end(r, status, (int)d->finish_reason, d->error, NULL, 0, d);
}

static void end_by_error(kvc_request *r, const struct ipc_error_msg *e)
{
	req_end(r, e->code, KVC_FINISH_ERROR, e->code, e->msg, e->msg_bytes, NULL);
}

static int handle_ring_frame(kvc_client *c, const struct ipc_frame *f)
{
	kvc_request *r = find_req(c, f->hdr.request_id);

	switch (f->hdr.type) {
	case IPC_MSG_TOKEN: {
		struct ipc_token_msg m;
		if (ipc_decode_token(f, &m) < 0)
			return -EPROTO;
		if (!r || r->finished)
			return 0; /* a request given up with kvc_request_finish() */
		if (enqueue_token(r, &m) < 0) {
			req_end(r, -ENOMEM, KVC_FINISH_ERROR, -ENOMEM, NULL, 0, NULL);
			kvc_cancel(c, r->id);
		}
		return 0;
	}
	case IPC_MSG_DONE: {
		struct ipc_done d;
		if (ipc_decode_done(f, &d) < 0)
			return -EPROTO;
		if (r)
			end_by_done(r, &d);
		return 0;
	}
	case IPC_MSG_ERROR: {
		struct ipc_error_msg e;
		if (ipc_decode_error(f, &e) < 0)
			return -EPROTO;
		if (f->hdr.request_id == 0) {
			fail_conn_msg(c, e.code, e.msg, e.msg_bytes);
		} else if (r) {
			end_by_error(r, &e);
		}
		return 0;
	}
	}
	return -EPROTO; /* ipc_frame_check admits nothing else from the ring */
}

/* Move every record from the ring into request queues. Returns the
 * number of records, or a negative code after failing the connection. */
static int drain_ring(kvc_client *c)
{
	struct ipc_frame f;
	int n = 0, r;

	if (!c->ch)
		return 0;
	for (;;) {
		r = ipc_chan_recv(c->ch, c->ringbuf, IPC_MAX_FRAME_BYTES, &f);
		if (r == -EAGAIN)
			break;
		if (r < 0 || handle_ring_frame(c, &f) < 0) {
			fail_conn(c, -EPROTO);
			return -EPROTO;
		}
		n++;
	}
	/* Consumed records free room the daemon may be waiting for. */
	if (n)
		ipc_chan_wake_peer(c->ch);
	return n;
}

/* ---- the socket ------------------------------------------------------------------------ */

static int handle_sock_frame(kvc_client *c, const struct ipc_frame *f)
{
	uint64_t id = f->hdr.request_id;
	kvc_request *r;

	switch (f->hdr.type) {
	case IPC_MSG_ERROR: {
		struct ipc_error_msg e;
		if (ipc_decode_error(f, &e) < 0)
			return -EPROTO;
		if (id == 0) {
			drain_ring(c);
			fail_conn_msg(c, e.code, e.msg, e.msg_bytes);
		} else if (c->ctl_id && id == c->ctl_id) {
			if (!c->ctl_done) {
				set_msg(c->last_msg, e.msg, e.msg_bytes);
				c->ctl_done = true;
				c->ctl_status = e.code;
			}
		} else if ((r = find_req(c, id)) && !r->finished) {
			/* Everything the daemon put in the ring before this
			 * frame is there now: deliver it first. */
			drain_ring(c);
			end_by_error(r, &e);
		}
		return 0;
	}
	case IPC_MSG_DONE: {
		struct ipc_done d;
		if (ipc_decode_done(f, &d) < 0)
			return -EPROTO;
		if ((r = find_req(c, id)) && !r->finished) {
			drain_ring(c);
			end_by_done(r, &d);
		}
		return 0;
	}
	case IPC_MSG_WELCOME:
		return -EPROTO;
	default:
		if (c->ctl_id && id == c->ctl_id && !c->ctl_done) {
			int s = c->ctl(c, f, c->ctl_arg);
			if (s != 0) {
				c->ctl_done = true;
				c->ctl_status = s < 0 ? s : 0;
			}
		}
		return 0; /* a late reply to a call that timed out */
	}
}

static int drain_socket(kvc_client *c)
{
	struct ipc_frame f;

	for (;;) {
		int r = ipc_recv(c->fd, c->sockbuf, IPC_MAX_FRAME_BYTES, IPC_FROM_SERVER, &f);
		if (r == -EAGAIN)
			return 0;
		if (r < 0) {
			bool gone = r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN;
			drain_ring(c); /* what was sent before the end is still valid */
			fail_conn(c, gone ? -ECONNRESET : -EPROTO);
			return c->dead;
		}
		r = handle_sock_frame(c, &f);
		ipc_frame_close_fds(&f);
		if (r < 0) {
			fail_conn(c, r);
			return r;
		}
		if (c->dead)
			return c->dead;
	}
}

/* Send one frame on the (non-blocking) socket, waiting for room until
 * the deadline. */
static int send_frame(kvc_client *c, uint16_t type, uint64_t id, const struct iovec *iov, int n_iov, int64_t deadline)
{
	for (;;) {
		int r = ipc_sendv(c->fd, type, 0, id, iov, n_iov, NULL, 0);
		if (r != -EAGAIN) {
			if (r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN) {
				drain_socket(c); /* an ERROR explaining why may be waiting */
				fail_conn(c, -ECONNRESET);
				return c->dead;
			}
			return r;
		}
		if (expired(deadline))
			return -ETIMEDOUT;
		struct pollfd p = { .fd = c->fd, .events = POLLOUT };
		if (poll(&p, 1, remaining_ms(deadline)) < 0 && errno != EINTR)
			return -errno;
	}
}

/* ---- waiting ------------------------------------------------------------------------------ */

typedef bool (*cond_fn)(kvc_client *c, void *arg);

/*
 * Process traffic until cond holds (0), the connection dies (its error:
 * note that fail_conn ends every request and control call, so their
 * conditions then hold too), or the deadline passes (-ETIMEDOUT).
 * want_tx: also wake up when the upload ring has room for tx_payload.
 */
static int pump(kvc_client *c, cond_fn cond, void *arg, int64_t deadline, bool want_tx, uint32_t tx_payload)
{
	for (;;) {
		if (cond(c, arg))
			return 0;
		if (c->dead)
			return c->dead;
		drain_ring(c);
		if (cond(c, arg))
			return 0;
		if (c->dead)
			return c->dead;
		if (expired(deadline))
			return -ETIMEDOUT;

		int ready = ipc_chan_prepare_wait(c->ch, IPC_WAIT_RX | (want_tx ? IPC_WAIT_TX : 0), tx_payload);
		if (ready < 0) {
			fail_conn(c, -EPROTO);
			continue;
		}
		/* When something is ready, still look at the socket, without
		 * sleeping, so a busy ring cannot starve control replies. */
		struct pollfd p[2] = {
			{ .fd = c->fd, .events = POLLIN },
			{ .fd = ipc_chan_wait_fd(c->ch), .events = POLLIN },
		};
		int n = poll(p, 2, ready ? 0 : remaining_ms(deadline));
		int e = errno;
		ipc_chan_ack(c->ch);
		if (n < 0) {
			if (e == EINTR)
				continue;
			return -e;
		}
		if (p[0].revents)
			drain_socket(c);
	}
}

static bool req_ready(kvc_client *c, void *arg)
{
	kvc_request *r = arg;
	(void)c;
	return r->head || r->finished;
}

static bool ctl_ready(kvc_client *c, void *arg)
{
	(void)arg;
	return c->ctl_done;
}

static bool tx_ready(kvc_client *c, void *arg)
{
	return ipc_chan_tx_room(c->ch, *(uint32_t *)arg) != 0; /* room, or broken: stop waiting */
}

/* Push text as PROMPT_DATA records of request id. The daemon counts on
 * every announced byte, so a failure here ends the connection. */
static int upload(kvc_client *c, uint64_t id, const char *text, size_t len)
{
	uint32_t max = ipc_chan_tx_max_payload(c->ch) - (uint32_t)sizeof(struct ipc_prompt_data);
	size_t off = 0;

	while (off < len) {
		uint32_t n = len - off < max ? (uint32_t)(len - off) : max;
		struct ipc_prompt_data d = { .offset = (uint32_t)off, .bytes = n };
		int r = ipc_chan_send(c->ch, IPC_MSG_PROMPT_DATA, 0, id, &d, sizeof(d), text + off, n);
		if (r == -EAGAIN) {
			uint32_t need = (uint32_t)sizeof(d) + n;
			ipc_chan_wake_peer(c->ch);
			r = pump(c, tx_ready, &need, deadline_in(c->timeout_ms), true, need);
			if (r < 0) {
				fail_conn(c, r);
				return r;
			}
			if (ipc_chan_tx_room(c->ch, need) < 0) {
				fail_conn(c, -EPROTO);
				return -EPROTO;
			}
			continue;
		}
		if (r < 0) {
			fail_conn(c, -EPROTO);
			return -EPROTO;
		}
		ipc_chan_wake_peer(c->ch);
		off += n;
	}
	return 0;
}

/*
 * A control call: send the frame (and upload text if given), then process
 * traffic until fn says the reply is complete. fn returns 0 for "more
 * frames follow", 1 for done, a negative code for a bad reply.
 */
static int ctl_call(kvc_client *c, uint16_t type, const struct iovec *iov, int n_iov, const char *up, size_t up_len,
		    ctl_fn fn, void *arg)
{
	if (c->dead)
		return c->dead;
	assert(c->ctl_id == 0);
	c->last_msg[0] = '\0';
	c->ctl_id = ++c->next_id;
	c->ctl = fn;
	c->ctl_arg = arg;
	c->ctl_done = false;
	c->ctl_status = 0;
	int64_t deadline = deadline_in(c->timeout_ms);
	int r = send_frame(c, type, c->ctl_id, iov, n_iov, deadline);
	if (r == 0 && up)
		r = upload(c, c->ctl_id, up, up_len);
	if (r == 0)
		r = pump(c, ctl_ready, NULL, deadline, false, 0);
	if (r == 0)
		r = c->ctl_status;
	c->ctl_id = 0;
	c->ctl = NULL;
	return r;
}

/* ---- connecting ----------------------------------------------------------------------------- */

unsigned kvc_version(void)
{
	return KVC_VERSION;
}

const char *kvc_version_string(void)
{
	return KVC_VERSION_STRING;
}

static void fill_info(struct kvc_info *i, const struct ipc_welcome *w)
{
	memset(i, 0, sizeof(*i));
	i->server_version = w->server_version;
	memcpy(i->model_name, w->model_name, sizeof(i->model_name));
	i->n_vocab = w->n_vocab;
	i->n_ctx = w->n_ctx;
	i->block_size = w->block_size;
	i->n_layers = w->n_layers;
	i->n_kv_heads = w->n_kv_heads;
	i->head_dim = w->head_dim;
	i->kv_dtype_bytes = w->kv_dtype_bytes;
	i->max_prompt_bytes = w->max_text_bytes;
	i->max_requests = w->max_requests;
	i->max_tokens = w->max_gen_tokens;
	i->kv_bytes_per_token = w->kv_bytes_per_token;
	i->pool_bytes = w->pool_bytes;
	i->client_id = w->client_id;
}

static void client_name(char out[IPC_CLIENT_NAME_BYTES])
{
	const char *s = program_invocation_short_name;
	size_t n = 0;

	memset(out, 0, IPC_CLIENT_NAME_BYTES);
	for (; s && *s && n < IPC_CLIENT_NAME_BYTES - 1; s++)
		out[n++] = (*s >= 0x20 && *s <= 0x7e) ? *s : '?';
}

/* HELLO, then wait for WELCOME (or an ERROR explaining the refusal). */
static int handshake(kvc_client *c)
{
	struct ipc_hello h = { .client_version = KVC_VERSION, .capabilities = IPC_CAP_RING_PROMPT };
	struct iovec v = { &h, sizeof(h) };
	int64_t deadline = deadline_in(KVC_CONNECT_TIMEOUT_MS);
	struct ipc_frame f;
	int r;

	client_name(h.client_name);
	r = send_frame(c, IPC_MSG_HELLO, 0, &v, 1, deadline);
	if (r < 0)
		return c->dead ? c->dead : r;
	for (;;) {
		r = ipc_recv(c->fd, c->sockbuf, IPC_MAX_FRAME_BYTES, IPC_FROM_SERVER, &f);
		if (r == -EAGAIN) {
			if (expired(deadline))
				return -ETIMEDOUT;
			struct pollfd p = { .fd = c->fd, .events = POLLIN };
			if (poll(&p, 1, remaining_ms(deadline)) < 0 && errno != EINTR)
				return -errno;
			continue;
		}
		if (r == -EPROTONOSUPPORT)
			return KVC_ERR_VERSION;
		if (r == -ECONNRESET || r == -EPIPE)
			return -ECONNRESET;
		if (r < 0)
			return -EPROTO;
		break;
	}
	if (f.hdr.type == IPC_MSG_ERROR) {
		struct ipc_error_msg e;
		r = ipc_decode_error(&f, &e) < 0 ? -EPROTO : e.code;
		if (r != -EPROTO)
			set_msg(c->last_msg, e.msg, e.msg_bytes);
		return r;
	}
	if (f.hdr.type != IPC_MSG_WELCOME) {
		ipc_frame_close_fds(&f);
		return -EPROTO;
	}
	struct ipc_welcome w;
	r = ipc_decode_welcome(&f, &w);
	if (r == 0)
		r = ipc_chan_attach(f.fds[IPC_WELCOME_FD_MEMFD], f.fds[IPC_WELCOME_FD_WAKE], &c->ch);
	if (r < 0) {
		ipc_frame_close_fds(&f);
		return -EPROTO;
	}
	f.n_fds = 0; /* the channel owns them now */
	if (ipc_chan_shm_bytes(c->ch) != w.shm_bytes)
		return -EPROTO;
	fill_info(&c->info, &w);
	return 0;
}

static kvc_client *client_free(kvc_client *c)
{
	while (c->reqs)
		kvc_request_finish(c->reqs);
	ipc_chan_free(c->ch);
	free(c->sockbuf);
	free(c->ringbuf);
	free(c->txbuf);
	free(c);
	return NULL;
}

int kvc_connect_fd(int fd, kvc_client **ret)
{
	int type = 0;
	socklen_t len = sizeof(type);

	if (!ret)
		return -EINVAL;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0)
		return -errno;
	if (type != SOCK_SEQPACKET)
		return -EPROTOTYPE;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;

	kvc_client *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = fd;
	c->timeout_ms = -1;
	c->sockbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	c->ringbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	c->txbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	int r = -ENOMEM;
	if (!c->sockbuf || !c->ringbuf || !c->txbuf)
		goto fail;
	if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		r = -errno;
		goto fail;
	}
	r = handshake(c);
	if (r < 0)
		goto fail;
	*ret = c;
	return 0;

fail:
	if (!(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl); /* the caller gets its fd back as it was */
	client_free(c);
	return r;
}

int kvc_connect(const char *path, kvc_client **ret)
{
	int fd, r;

	if (!ret)
		return -EINVAL;
	if (!path) {
		path = getenv(KVC_SOCKET_ENV);
		if (!path || !*path)
			path = KVC_DEFAULT_SOCKET;
	}
	r = ipc_connect(path, &fd);
	if (r < 0)
		return r;
	r = kvc_connect_fd(fd, ret);
	if (r < 0)
		close(fd);
	return r;
}

kvc_client *kvc_close(kvc_client *c)
{
	if (!c)
		return NULL;
	int fd = c->fd;
	client_free(c);
	close(fd);
	return NULL;
}

int kvc_set_timeout(kvc_client *c, int timeout_ms)
{
	c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
	return 0;
}

const struct kvc_info *kvc_server_info(const kvc_client *c)
{
	return &c->info;
}

const char *kvc_last_message(const kvc_client *c)
{
	return c->last_msg;
}

/* ---- generation -------------------------------------------------------------------------- */

void kvc_gen_params_init(struct kvc_gen_params *p)
{
	memset(p, 0, sizeof(*p));
	p->max_tokens = 256;
	p->temperature = 0.8f;
	p->top_p = 0.95f;
	p->top_k = 40;
	p->min_p = 0.05f;
	p->repeat_penalty = 1.0f;
	p->repeat_last_n = 64;
	p->seed = KVC_SEED_RANDOM;
}

const char *kvc_finish_name(int reason)
{
	return ipc_finish_name((uint32_t)reason);
}

const char *kvc_req_state_name(int state)
{
	return ipc_req_state_name((uint32_t)state);
}

static_assert(KVC_MAX_CHAT_MSGS == IPC_MAX_CHAT_TURNS, "message count limit is the wire's");
static_assert(sizeof(void *) != 8 || sizeof(struct kvc_gen_params) == 136, "kvc_gen_params keeps its size");

/* The conversation in p as the wire's turn list, in a fresh buffer
 * (*ret, free()d by the caller); its size in *ret_len. */
static int encode_turns(const kvc_client *c, const struct kvc_gen_params *p, char **ret, size_t *ret_len)
{
	struct ipc_chat_turn *t;
	ssize_t n;
	char *buf = NULL;

	if (!p->messages || p->n_messages == 0) /* one without the other: an empty conversation */
		return -EINVAL;
	if (p->n_messages > KVC_MAX_CHAT_MSGS)
		return -E2BIG;
	if ((p->flags & (KVC_GEN_RAW | KVC_GEN_PARSE_SPECIAL)) || p->system || p->session_id)
		return -EINVAL;
	if (c->info.server_version < IPC_CHAT_TURNS_SERVER_VERSION)
		return -EOPNOTSUPP;
	t = calloc(p->n_messages, sizeof(*t));
	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < p->n_messages; i++) {
		const struct kvc_chat_msg *m = &p->messages[i];
		if (!m->role || !m->content) {
			n = -EINVAL;
			goto out;
		}
		size_t len = strlen(m->content);
		if (len > IPC_MAX_TEXT_BYTES) {
			n = -E2BIG;
			goto out;
		}
		t[i] = (struct ipc_chat_turn){ ipc_chat_role_parse(m->role, strlen(m->role)), (uint32_t)len, m->content };
		if (!t[i].role) {
			n = -EINVAL;
			goto out;
		}
	}
	if (t[p->n_messages - 1].role != IPC_CHAT_USER) {
		n = -EINVAL;
		goto out;
	}
	n = ipc_chat_turns_encode(NULL, 0, t, p->n_messages);
	if (n < 0)
		goto out;
	if ((size_t)n > c->info.max_prompt_bytes) {
		n = -E2BIG;
		goto out;
	}
	buf = malloc((size_t)n);
	if (!buf) {
		n = -ENOMEM;
		goto out;
	}
	ipc_chat_turns_encode(buf, (size_t)n, t, p->n_messages);
	*ret = buf;
	*ret_len = (size_t)n;
out:
	free(t);
	return n < 0 ? (int)n : 0;
}

static int build_generate(const kvc_client *c, const char *prompt, size_t len, const struct kvc_gen_params *p,
			  bool turns, struct ipc_generate_msg *m)
{
	memset(m, 0, sizeof(*m));
	if (p->flags & ~(KVC_GEN_RAW | KVC_GEN_WANT_IDS | KVC_GEN_PARSE_SPECIAL))
		return -EINVAL;
	if ((p->flags & KVC_GEN_PARSE_SPECIAL) && !(p->flags & KVC_GEN_RAW))
		return -EINVAL;
	if (p->n_stop > IPC_MAX_STOP_STRINGS)
		return -E2BIG;
	if (p->n_stop && !p->stop)
		return -EINVAL;
	if (len > IPC_MAX_TEXT_BYTES || len > c->info.max_prompt_bytes)
		return -E2BIG;
	if (p->max_tokens > c->info.max_tokens && c->info.max_tokens)
		return -E2BIG;
	m->g.gen_flags = p->flags | (turns ? IPC_GEN_CHAT_TURNS : 0);
	m->g.max_tokens = p->max_tokens;
	m->g.temperature = p->temperature;
	m->g.top_p = p->top_p;
	m->g.top_k = p->top_k;
	m->g.min_p = p->min_p;
	m->g.repeat_penalty = p->repeat_penalty;
	m->g.repeat_last_n = p->repeat_last_n;
	m->g.seed = p->seed;
	m->g.session_id = p->session_id;
	m->g.prompt_bytes = (uint32_t)len;
	if (p->system) {
		size_t n = strlen(p->system);
		if (n > IPC_MAX_SYSTEM_BYTES)
			return -E2BIG;
		m->system = p->system;
		m->g.system_bytes = (uint32_t)n;
	}
	m->g.n_stop = (uint16_t)p->n_stop;
	for (size_t i = 0; i < p->n_stop; i++) {
		if (!p->stop[i])
			return -EINVAL;
		size_t n = strlen(p->stop[i]);
		if (n == 0)
			return -EINVAL;
		if (n > IPC_MAX_STOP_BYTES)
			return -E2BIG;
		m->stop[i] = p->stop[i];
		m->stop_len[i] = (uint16_t)n;
	}
	if (len > IPC_MAX_INLINE_TEXT_BYTES)
		m->g.gen_flags |= IPC_GEN_PROMPT_IN_RING;
	else
		m->prompt = prompt;
	return 0;
}

int kvc_request_start(kvc_client *c, const char *prompt, size_t prompt_len, const struct kvc_gen_params *p,
		      kvc_request **ret)
{
	struct kvc_gen_params defaults;
	struct ipc_generate_msg m;

	if (!c || !ret || (!prompt && prompt_len))
		return -EINVAL;
	if (c->dead)
		return c->dead;
	if (!p) {
		kvc_gen_params_init(&defaults);
		p = &defaults;
	}
	if (!prompt)
		prompt = "";
	if (prompt_len == KVC_NTS)
		prompt_len = strlen(prompt);
	char *turns = NULL; /* the conversation, encoded: sent as the prompt */
	bool with_turns = p->n_messages > 0 || p->messages;
	if (with_turns) {
		if (prompt_len)
			return -EINVAL;
		int e = encode_turns(c, p, &turns, &prompt_len);
		if (e < 0)
			return e;
		prompt = turns;
	}
	int r = build_generate(c, prompt, prompt_len, p, with_turns, &m);
	if (r < 0) {
		free(turns);
		return r;
	}
	kvc_request *q = calloc(1, sizeof(*q));
	if (!q) {
		free(turns);
		return -ENOMEM;
	}
	q->c = c;
	q->id = ++c->next_id;
	r = (int)ipc_encode_generate(c->txbuf, IPC_MAX_FRAME_BYTES, q->id, &m);
	if (r < 0) {
		free(q);
		free(turns);
		return r == -EBADMSG || r == -EPROTO ? -EINVAL : r;
	}
	/* Send the checked payload through the regular path, which adds the
	 * same header again. */
	struct iovec v = { c->txbuf + IPC_HDR_BYTES, (size_t)r - IPC_HDR_BYTES };
	/* Register first: a reply may arrive while the upload runs. */
	q->next = c->reqs;
	if (c->reqs)
		c->reqs->prev = q;
	c->reqs = q;
	r = send_frame(c, IPC_MSG_GENERATE, q->id, &v, 1, deadline_in(c->timeout_ms));
	if (r == 0 && (m.g.gen_flags & IPC_GEN_PROMPT_IN_RING))
		r = upload(c, q->id, prompt, prompt_len);
	free(turns);
	if (r < 0) {
		kvc_request_finish(q);
		return r;
	}
	*ret = q;
	return 0;
}

int kvc_request_next(kvc_request *r, const struct kvc_event **ret_ev)
{
	if (!r || !ret_ev)
		return -EINVAL;
	free(r->cur);
	r->cur = NULL;
	if (!r->head && !r->finished) {
		int s = pump(r->c, req_ready, r, deadline_in(r->c->timeout_ms), false, 0);
		if (s < 0 && !req_ready(r->c, r))
			return s;
	}
	if (r->head) {
		r->cur = r->head;
		r->head = r->head->next;
		if (!r->head)
			r->tail = NULL;
		*ret_ev = &r->cur->ev;
		return 1;
	}
	return r->status;
}

uint64_t kvc_request_id(const kvc_request *r)
{
	return r->id;
}

const struct kvc_result *kvc_request_result(const kvc_request *r)
{
	return r->finished && !r->head ? &r->result : NULL;
}

kvc_request *kvc_request_finish(kvc_request *r)
{
	if (!r)
		return NULL;
	kvc_client *c = r->c;
	if (!r->finished && !c->dead)
		kvc_cancel(c, r->id);
	if (r->prev)
		r->prev->next = r->next;
	else
		c->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
	free(r->cur);
	while (r->head) {
		struct evnode *e = r->head;
		r->head = e->next;
		free(e);
	}
	free(r);
	return NULL;
}

int kvc_cancel(kvc_client *c, uint64_t request_id)
{
	/* Async-signal-safe: a stack frame and one send(); no allocation, no
	 * client state but the fd, which is constant for the client's life. */
	struct ipc_hdr h = {
		.magic = IPC_MAGIC,
		.version = IPC_PROTO_VERSION,
		.type = IPC_MSG_CANCEL,
		.request_id = request_id,
	};
	if (!c || request_id == 0)
		return -EINVAL;
	int saved = errno;
	ssize_t n = send(c->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
	int r = n == (ssize_t)sizeof(h) ? 0 : n >= 0 ? -EIO : errno == EWOULDBLOCK ? -EAGAIN : -errno;
	errno = saved;
	return r;
}

int kvc_generate(kvc_client *c, const char *prompt, size_t prompt_len, const struct kvc_gen_params *p,
		 kvc_token_fn fn, void *userdata, struct kvc_result *ret_result)
{
	kvc_request *q;
	const struct kvc_event *ev;
	bool cancelled = false;
	int r;

	r = kvc_request_start(c, prompt, prompt_len, p, &q);
	if (r < 0)
		return r;
	while ((r = kvc_request_next(q, &ev)) == 1) {
		if (!cancelled && fn && fn(userdata, ev) != 0) {
			cancelled = true;
			kvc_cancel(c, q->id);
		}
	}
	if (ret_result) {
		const struct kvc_result *res = kvc_request_result(q);
		if (res) {
			*ret_result = *res;
		} else { /* timed out: the request is abandoned below */
			memset(ret_result, 0, sizeof(*ret_result));
			ret_result->finish_reason = KVC_FINISH_ERROR;
			ret_result->error = r;
		}
	}
	kvc_request_finish(q);
	return cancelled ? -ECANCELED : r;
}

/* ---- control calls ------------------------------------------------------------------------- */

static int stats_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct kvc_stats *o = arg;
	struct ipc_stats s;
	(void)c;

	if (f->hdr.type != IPC_MSG_STATS_REPLY || ipc_decode_stats(f, &s) < 0)
		return -EPROTO;
	memset(o, 0, sizeof(*o));
	o->pages_total = s.pages_total;
	o->pages_free = s.pages_free;
	o->pages_used = s.pages_used;
	o->pages_shared = s.pages_shared;
	o->pages_cached = s.pages_cached;
	o->pages_swapped = s.pages_swapped;
	o->page_bytes = s.page_bytes;
	o->block_size = s.block_size;
	o->kv_bytes_per_token = s.kv_bytes_per_token;
	o->pool_bytes = s.pool_bytes;
	o->tokens_resident = s.tokens_resident;
	o->slack_tokens = s.slack_tokens;
	o->prefix_lookups = s.prefix_lookups;
	o->prefix_query_tokens = s.prefix_query_tokens;
	o->prefix_hit_tokens = s.prefix_hit_tokens;
	o->pages_evicted = s.pages_evicted;
	o->cow_copies = s.cow_copies;
	o->swap_out_pages = s.swap_out_pages;
	o->swap_in_pages = s.swap_in_pages;
	o->swap_bytes = s.swap_bytes;
	o->requests_running = s.requests_running;
	o->requests_waiting = s.requests_waiting;
	o->requests_swapped = s.requests_swapped;
	o->requests_completed = s.requests_completed;
	o->requests_rejected = s.requests_rejected;
	o->clients = s.clients;
	o->sessions = s.sessions;
	o->prompt_tokens_total = s.prompt_tokens_total;
	o->generated_tokens_total = s.generated_tokens_total;
	o->steps = s.steps;
	o->uptime_ns = s.uptime_ns;
	o->ledger_records_dropped = s.ledger_records_dropped;
	o->swap_errors = s.swap_errors;
	o->swap_fallback_recomputes = s.swap_fallback_recomputes;
	return 1;
}

int kvc_stats(kvc_client *c, struct kvc_stats *ret)
{
	struct kvc_stats s;

	if (!c || !ret)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_STATS, NULL, 0, NULL, 0, stats_reply, &s);
	if (r == 0)
		*ret = s;
	return r;
}

struct tok_acc {
	bool count_only;
	bool started;
	uint32_t total;
	uint32_t n;
	int32_t *ids;
};

static int tokenize_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct tok_acc *a = arg;
	struct ipc_tokenize_reply_msg m;
	(void)c;

	if (f->hdr.type != IPC_MSG_TOKENIZE_REPLY || ipc_decode_tokenize_reply(f, &m) < 0)
		return -EPROTO;
	if (!a->started) {
		if (m.r.n_tokens > MAX_TOKENIZE_IDS)
			return -EPROTO;
		a->started = true;
		a->total = m.r.n_tokens;
		if (!a->count_only && a->total) {
			a->ids = malloc(sizeof(int32_t) * a->total);
			if (!a->ids)
				return -ENOMEM;
		}
	}
	if (m.r.n_tokens != a->total || m.r.offset != a->n || (a->count_only && m.r.n_ids))
		return -EPROTO;
	for (uint32_t i = 0; i < m.r.n_ids; i++)
		a->ids[a->n + i] = ipc_reply_id(&m, i);
	a->n += m.r.n_ids;
	if (m.more)
		return 0;
	if (!a->count_only && a->n != a->total)
		return -EPROTO;
	return 1;
}

static int do_tokenize(kvc_client *c, const char *text, size_t len, unsigned flags, bool count_only,
		       struct tok_acc *a)
{
	if (!c || (!text && len) || (flags & ~(KVC_TOK_ADD_BOS | KVC_TOK_PARSE_SPECIAL)))
		return -EINVAL;
	if (!text)
		text = "";
	if (len == KVC_NTS)
		len = strlen(text);
	if (len > IPC_MAX_TEXT_BYTES || len > c->info.max_prompt_bytes)
		return -E2BIG;
	struct ipc_tokenize t = { .tok_flags = flags | (count_only ? IPC_TOK_COUNT_ONLY : 0), .text_bytes = (uint32_t)len };
	bool in_ring = len > IPC_MAX_INLINE_TEXT_BYTES;
	if (in_ring)
		t.tok_flags |= IPC_TOK_TEXT_IN_RING;
	struct iovec v[2] = { { &t, sizeof(t) }, { (void *)text, in_ring ? 0 : len } };
	memset(a, 0, sizeof(*a));
	a->count_only = count_only;
	int r = ctl_call(c, IPC_MSG_TOKENIZE, v, in_ring || !len ? 1 : 2, in_ring ? text : NULL, len, tokenize_reply, a);
	if (r < 0) {
		free(a->ids);
		a->ids = NULL;
	}
	return r;
}

int kvc_tokenize(kvc_client *c, const char *text, size_t len, unsigned flags, int32_t **ret_ids, size_t *ret_n)
{
	struct tok_acc a;

	if (!ret_ids || !ret_n)
		return -EINVAL;
	int r = do_tokenize(c, text, len, flags, false, &a);
	if (r < 0)
		return r;
	*ret_ids = a.ids;
	*ret_n = a.n;
	return 0;
}

int kvc_count_tokens(kvc_client *c, const char *text, size_t len, unsigned flags, size_t *ret_n)
{
	struct tok_acc a;

	if (!ret_n)
		return -EINVAL;
	int r = do_tokenize(c, text, len, flags, true, &a);
	if (r < 0)
		return r;
	*ret_n = a.total;
	return 0;
}

static int session_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ipc_session s;
	uint16_t want = *(uint64_t *)arg ? IPC_MSG_SESSION_CLOSED : IPC_MSG_SESSION_OPENED;
	(void)c;

	if (f->hdr.type != want || ipc_decode_session(f, &s) < 0)
		return -EPROTO;
	if (want == IPC_MSG_SESSION_CLOSED && s.session_id != *(uint64_t *)arg)
		return -EPROTO;
	*(uint64_t *)arg = s.session_id;
	return 1;
}

int kvc_session_open(kvc_client *c, uint32_t idle_timeout_s, uint64_t *ret_session_id)
{
	struct ipc_session_open o = { .idle_timeout_s = idle_timeout_s };
	struct iovec v = { &o, sizeof(o) };
	uint64_t id = 0; /* 0: expecting SESSION_OPENED */

	if (!c || !ret_session_id)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_SESSION_OPEN, &v, 1, NULL, 0, session_reply, &id);
	if (r == 0)
		*ret_session_id = id;
	return r;
}

int kvc_session_close(kvc_client *c, uint64_t session_id)
{
	struct ipc_session s = { .session_id = session_id };
	struct iovec v = { &s, sizeof(s) };
	uint64_t id = session_id;

	if (!c || session_id == 0)
		return -EINVAL;
	return ctl_call(c, IPC_MSG_SESSION_CLOSE, &v, 1, NULL, 0, session_reply, &id);
}

struct ps_acc {
	bool started;
	uint32_t total;
	uint32_t n;
	struct kvc_ps_entry *e;
};

static int ps_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ps_acc *a = arg;
	struct ipc_ps_reply_msg m;
	(void)c;

	if (f->hdr.type != IPC_MSG_PS_REPLY || ipc_decode_ps_reply(f, &m) < 0)
		return -EPROTO;
	if (!a->started) {
		if (m.r.n_total > MAX_PS_ENTRIES)
			return -EPROTO;
		a->started = true;
		a->total = m.r.n_total;
		if (a->total) {
			a->e = calloc(a->total, sizeof(*a->e));
			if (!a->e)
				return -ENOMEM;
		}
	}
	if (m.r.n_total != a->total || m.r.n_entries > a->total - a->n)
		return -EPROTO;
	for (uint32_t i = 0; i < m.r.n_entries; i++) {
		struct ipc_ps_entry w;
		struct kvc_ps_entry *o = &a->e[a->n + i];
		ipc_ps_entry_at(&m, i, &w);
		o->request_id = w.request_id;
		o->client_id = w.client_id;
		o->session_id = w.session_id;
		o->age_ns = w.age_ns;
		o->pid = w.pid;
		o->uid = w.uid;
		o->state = w.state;
		o->pages = w.pages;
		o->pages_shared = w.pages_shared;
		o->prompt_tokens = w.prompt_tokens;
		o->cached_tokens = w.cached_tokens;
		o->generated_tokens = w.generated_tokens;
		o->max_tokens = w.max_tokens;
	}
	a->n += m.r.n_entries;
	if (m.more)
		return 0;
	return a->n == a->total ? 1 : -EPROTO;
}

int kvc_ps(kvc_client *c, struct kvc_ps_entry **ret_entries, size_t *ret_n)
{
	struct ps_acc a = { 0 };

	if (!c || !ret_entries || !ret_n)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_PS, NULL, 0, NULL, 0, ps_reply, &a);
	if (r < 0) {
		free(a.e);
		return r;
	}
	*ret_entries = a.e;
	*ret_n = a.n;
	return 0;
}

static int pong_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ipc_ping p;
	(void)c;

	if (f->hdr.type != IPC_MSG_PONG || ipc_decode_ping(f, &p) < 0 || p.nonce != *(uint64_t *)arg)
		return -EPROTO;
	return 1;
}

int kvc_ping(kvc_client *c, uint64_t *ret_rtt_ns)
{
	int64_t t0 = now_ns();
	struct ipc_ping p = { .nonce = (uint64_t)t0 };
	struct iovec v = { &p, sizeof(p) };

	if (!c)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_PING, &v, 1, NULL, 0, pong_reply, &p.nonce);
	if (r == 0 && ret_rtt_ns)
		*ret_rtt_ns = (uint64_t)(now_ns() - t0);
	return r;
}

void kvc_free(void *p)
{
	free(p);
}
