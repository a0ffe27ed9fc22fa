/*
 * client/kvc_io.c — libkvclient's transport: the token ring, the socket,
 * waiting for a condition, prompt uploads and control calls.
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
 */
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvclient.h"
#include "ipc.h"
#include "kvc_impl.h"

/* Everything defined from here on is internal unless kvclient.h declared
 * it with KVC_EXPORT (an explicit attribute beats the pragma). */
#pragma GCC visibility push(hidden)

/* ---- small helpers ------------------------------------------------------------ */

int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t deadline_in(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : now_ns() + (int64_t)timeout_ms * 1000000;
}

/* poll() timeout until deadline: -1 without one, rounded up otherwise. */
int remaining_ms(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t left = deadline - now_ns();
	if (left <= 0)
		return 0;
	int64_t ms = (left + 999999) / 1000000;
	return ms > 1000000000 ? 1000000000 : (int)ms;
}

bool expired(int64_t deadline)
{
	return deadline >= 0 && now_ns() >= deadline;
}

void set_msg(char *dst, const char *src, size_t n)
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
		r->result.context_dropped_tokens = d->context_dropped_tokens;
		r->result.spec_drafted_tokens = r->spec.drafted_tokens;
		r->result.spec_accepted_tokens = r->spec.accepted_tokens;
	}
	/* samples that had no DONE of their own end as the request did */
	for (uint32_t i = 0; r->sample_res && i < r->n_samples; i++)
		if (!r->sample_done[i]) {
			r->sample_res[i] = r->result;
			r->sample_done[i] = 1;
		}
}

static int result_rank(int reason)
{
	return reason == KVC_FINISH_ERROR ? 2 : reason == KVC_FINISH_CANCELLED ? 1 : 0;
}

/* One sample's DONE (IPC_F_SAMPLE); the request ends with the last. */
static int sample_done(kvc_request *r, const struct ipc_done *d, uint32_t sample, const struct ipc_done_spec *sp)
{
	if (!r->ext || sample >= r->n_samples || r->sample_done[sample])
		return -EPROTO;
	struct kvc_result *x = &r->sample_res[sample];
	x->spec_drafted_tokens = sp->drafted_tokens;
	x->spec_accepted_tokens = sp->accepted_tokens;
	r->spec.drafted_tokens += sp->drafted_tokens; /* the request's: its samples' sum */
	r->spec.accepted_tokens += sp->accepted_tokens;
	x->finish_reason = (int)d->finish_reason;
	x->error = d->error;
	x->prompt_tokens = d->prompt_tokens;
	x->cached_tokens = d->cached_tokens;
	x->generated_tokens = d->generated_tokens;
	x->queue_ns = d->queue_ns;
	x->ttft_ns = d->ttft_ns;
	x->decode_ns = d->decode_ns;
	x->total_ns = d->total_ns;
	r->sample_done[sample] = 1;
	if (++r->n_done < r->n_samples)
		return 0;
	/* the whole request: see kvc_request_result() in kvclient.h */
	struct ipc_done all = *d;
	const struct kvc_result *worst = &r->sample_res[0];
	all.generated_tokens = 0;
	for (uint32_t i = 0; i < r->n_samples; i++) {
		const struct kvc_result *y = &r->sample_res[i];
		all.generated_tokens += y->generated_tokens;
		if (y->decode_ns > all.decode_ns)
			all.decode_ns = y->decode_ns;
		if (y->total_ns > all.total_ns)
			all.total_ns = y->total_ns;
		if (result_rank(y->finish_reason) > result_rank(worst->finish_reason))
			worst = y;
	}
	all.prompt_tokens = r->sample_res[0].prompt_tokens;
	all.cached_tokens = r->sample_res[0].cached_tokens;
	all.queue_ns = r->sample_res[0].queue_ns;
	all.ttft_ns = r->sample_res[0].ttft_ns;
	all.finish_reason = (uint32_t)worst->finish_reason;
	all.error = worst->error;
	int status = all.finish_reason == IPC_FINISH_CANCELLED ? -ECANCELED
		     : all.finish_reason == IPC_FINISH_ERROR   ? all.error
							       : 0;
	req_end(r, status, (int)all.finish_reason, all.error, NULL, 0, &all);
	return 0;
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

/* The record's shape must be what the request asked for. */
static bool token_fits_request(const kvc_request *r, const struct ipc_token_msg *m)
{
	if (m->has_sample != r->ext)
		return false;
	if (!r->ext)
		return true;
	return m->s.sample < r->n_samples && !!m->lp == r->logprobs && (!m->lp || m->s.n_top == r->top_logprobs);
}

static int enqueue_token(kvc_request *r, const struct ipc_token_msg *m)
{
	size_t ids_bytes = 4u * m->t.n_ids;
	uint32_t per = 1u + m->s.n_top;
	/* the log-probabilities: n_tokens kvc_token_logprobs, then their top
	 * entries, then a copy of the wire's area (the pieces point into it) */
	size_t lpt_bytes = m->lp ? m->t.n_tokens * sizeof(struct kvc_token_logprobs) : 0;
	size_t lpe_bytes = m->lp ? (size_t)m->t.n_tokens * m->s.n_top * sizeof(struct kvc_logprob) : 0;
	size_t ids_pad = (ids_bytes + 7) & ~(size_t)7; /* the structs after the ids are 8-aligned */
	size_t text_at = ids_pad + lpt_bytes + lpe_bytes;
	struct evnode *e = malloc(sizeof(*e) + text_at + m->t.text_bytes + 1 + m->lp_bytes);
	if (!e)
		return -ENOMEM;
	e->next = NULL;
	memcpy(e->data, m->ids, ids_bytes);
	char *text = (char *)e->data + text_at;
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
		.sample = m->s.sample,
	};
	if (m->lp) {
		struct kvc_token_logprobs *lt = (struct kvc_token_logprobs *)(void *)(e->data + ids_pad);
		struct kvc_logprob *le = (struct kvc_logprob *)(void *)(e->data + ids_pad + lpt_bytes);
		uint8_t *area = (uint8_t *)text + m->t.text_bytes + 1;
		memcpy(area, m->lp, m->lp_bytes);
		struct ipc_token_msg local = *m;
		local.lp = area; /* pieces then point into our copy */
		struct ipc_token_lp tl;
		size_t off = 0;
		for (uint32_t t = 0; t < m->t.n_tokens && ipc_token_lp_next(&local, &off, &tl) > 0; t++) {
			for (uint32_t i = 0; i < per; i++) {
				struct kvc_logprob v = { tl.e[i].id, tl.e[i].logprob, tl.piece[i], tl.e[i].piece_bytes };
				if (i == 0)
					lt[t].token = v;
				else
					le[(size_t)t * m->s.n_top + i - 1] = v;
			}
			lt[t].n_top = m->s.n_top;
			lt[t].top = m->s.n_top ? &le[(size_t)t * m->s.n_top] : NULL;
		}
		e->ev.logprobs = lt;
	}
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
		if (!token_fits_request(r, &m))
			return -EPROTO;
		if (enqueue_token(r, &m) < 0) {
			req_end(r, -ENOMEM, KVC_FINISH_ERROR, -ENOMEM, NULL, 0, NULL);
			kvc_cancel(c, r->id);
		}
		return 0;
	}
	case IPC_MSG_DONE: {
		struct ipc_done d;
		struct ipc_sample smp;
		struct ipc_done_spec sp;
		if (ipc_decode_done_spec(f, &d, &smp, &sp) < 0)
			return -EPROTO;
		if (r && !r->finished && (f->hdr.flags & IPC_F_SAMPLE))
			return sample_done(r, &d, smp.sample, &sp);
		if (r && !r->finished)
			r->spec = sp;
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
		struct ipc_sample smp;
		struct ipc_done_spec sp;
		if (ipc_decode_done_spec(f, &d, &smp, &sp) < 0)
			return -EPROTO;
		if ((r = find_req(c, id)) && !r->finished) {
			drain_ring(c);
			if (f->hdr.flags & IPC_F_SAMPLE)
				return sample_done(r, &d, smp.sample, &sp);
			r->spec = sp;
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
int send_frame(kvc_client *c, uint16_t type, uint64_t id, const struct iovec *iov, int n_iov, int64_t deadline)
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

/*
 * Process traffic until cond holds (0), the connection dies (its error:
 * note that fail_conn ends every request and control call, so their
 * conditions then hold too), or the deadline passes (-ETIMEDOUT).
 * want_tx: also wake up when the upload ring has room for tx_payload.
 */
int pump(kvc_client *c, cond_fn cond, void *arg, int64_t deadline, bool want_tx, uint32_t tx_payload)
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

bool req_ready(kvc_client *c, void *arg)
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
int upload(kvc_client *c, uint64_t id, const char *text, size_t len)
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
int ctl_call(kvc_client *c, uint16_t type, const struct iovec *iov, int n_iov, const char *up, size_t up_len,
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
