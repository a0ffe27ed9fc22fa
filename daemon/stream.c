/*
 * daemon/stream.c — a request's life after the frame: the scheduler's
 * callbacks (on_token, on_done), the tokens and text queued on each request
 * until its client's ring takes them, the uploads read from the ring, and
 * the list of clients with pending work (flush_dirty).
 */
#include "server_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "request.h"
#include "tokwork.h"

/* ---- requests -------------------------------------------------------------- */

struct greq *greq_free(struct greq *gr)
{
	if (!gr)
		return NULL;
	if (gr->sess && gr->sess->busy == gr)
		gr->sess->busy = NULL; /* a turn that never reached the scheduler */
	free(gr->system);
	free(gr->stop_buf);
	free(gr->cons_text);
	kvd_request_free(gr->rq);
	free(gr->toks);
	free(gr->text);
	gsamples_free(gr->xs);
	free(gr);
	return NULL;
}

void greq_unlink(struct client *c, struct greq *gr)
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
	c->n_inflight -= greq_weight(&gr->g);
}

struct greq *greq_find(struct client *c, uint64_t id)
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

enum kvd_token_verdict on_token(void *ud, uint64_t req_id, int32_t token, enum kvd_finish ending)
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

int sched_is_eog(void *ud, int32_t token)
{
	struct kvd_server *srv = ud;
	return kvd_request_is_eog(srv->tok, token);
}

static const char *finish_name(enum kvd_finish f)
{
	return ipc_finish_name(finish_to_ipc(f));
}

void on_done(void *ud, uint64_t req_id, const struct kvd_request_result *res_sched)
{
	struct kvd_server *srv = ud;
	struct greq *gr = (struct greq *)(uintptr_t)req_id;
	uint64_t t = now_ns();
	uint64_t pre = gr->t_submit - gr->t_recv; /* upload and tokenization */
	struct kvd_request_result res_all = *res_sched, *res = &res_all;

	/* what truncate-oldest removed before submitting counts as dropped too */
	res_all.context_dropped_tokens += gr->trunc_tokens;
	res_all.context_truncated_turns = gr->trunc_turns;
	res_all.context_policy = gr->ctx.policy;
	res_all.context_window = gr->ctx.window_tokens;
	res_all.context_sinks = gr->ctx.sink_tokens;

	kvd_ledger_request(srv->ledger, &gr->who, gr->id, gr->sess ? gr->sess->id : 0, finish_name(res->finish), res);
	if (res->sample == 0) { /* the samples share one prompt */
		srv->prompt_tokens_total += res->prompt_tokens;
		user_counters_add(srv, gr->who.uid, res->prompt_tokens, res->cached_tokens, res->adopted_tokens);
	}
	user_counters_add_spec(srv, gr->who.uid, res);
	gr->done_spec = (struct ipc_done_spec){ res->spec_drafted_tokens, res->spec_accepted_tokens };
	srv->generated_tokens_total += res->generated_tokens;
	if (res->generated_tokens) /* time to first token as the client sees it: from the GENERATE */
		kvd_hist_add(&srv->ttft, res->ttft_ns + pre);
	if (gr->sess) {
		struct session *s = gr->sess;
		s->busy = NULL;
		s->last_used_ns = t;
		/* a cancelled or failed turn leaves the session as it was */
		if (res->finish != KVD_FINISH_CANCELLED && res->finish != KVD_FINISH_ERROR) {
			s->turns++;
			ctx_turn_done(s, gr);
		}
		gr->sess = NULL; /* the session may go before this request's last record */
	}
	gr->done = (struct ipc_done){
		.finish_reason = finish_to_ipc(res->finish),
		.error = res->finish == KVD_FINISH_ERROR ? (ipc_error_code_valid(res->error) ? res->error : IPC_ERR_ENGINE) : 0,
		.prompt_tokens = res->prompt_tokens,
		.cached_tokens = res->cached_tokens,
		.generated_tokens = res->generated_tokens,
		.context_dropped_tokens = res->context_dropped_tokens,
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
	if (gr->xs && res->sample < gr->xs->n) {
		gr->xs->s[res->sample].finished = true;
		gr->xs->s[res->sample].done = gr->done;
		gr->xs->s[res->sample].done_spec = gr->done_spec;
		if (++gr->xs->n_done < gr->xs->n) {
			if (gr->c)
				client_mark_dirty(gr->c);
			return; /* the others are still running */
		}
	}
	gr->finished = true;
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

	if (gr->xs)
		return samples_flush(c, gr);
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
	bool spec = c->client_version >= IPC_SPEC_VERSION; /* older clients know no IPC_F_SPEC */
	if (gr->shutdown) {
		r = ipc_chan_send_error(c->chan, gr->id, IPC_ERR_SHUTDOWN, "kvd is shutting down; request ended");
	} else if (gr->closed_session && gr->done.finish_reason == IPC_FINISH_CANCELLED) {
		char msg[96];
		snprintf(msg, sizeof(msg), "session %" PRIu64 " was closed during this turn; the turn was cancelled",
			 gr->closed_session);
		r = ipc_chan_send_error(c->chan, gr->id, IPC_ERR_SESSION, msg);
	} else
		r = ipc_chan_send(c->chan, IPC_MSG_DONE, spec ? IPC_F_SPEC : 0, gr->id, &gr->done, sizeof(gr->done),
				  spec ? &gr->done_spec : NULL, spec ? sizeof(gr->done_spec) : 0);
	if (r == -EAGAIN) {
		c->tx_need = sizeof(struct ipc_done) + sizeof(struct ipc_done_spec) > sizeof(struct ipc_error) + IPC_MAX_ERROR_MSG_BYTES
				     ? sizeof(struct ipc_done) + sizeof(struct ipc_done_spec)
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


/* Pop upload records while an upload is incomplete. What they cost —
 * copying, and rendering and tokenizing a finished upload — is charged to
 * the client's user like its socket frames (client_charge), and a user
 * over its share of the step time stops being read here (up_paused) until
 * resume_paused finds it has earned that back: work that comes through
 * the ring buys no more of the loop than work on the socket. A finished
 * upload is tokenized by the worker (upload_done), whose CPU time is
 * charged the same way when it is done (tokw_collect); while the user has
 * SRV_TOKW_USER_JOBS texts there, nothing more is read (tok_wait), so the
 * ring, not the daemon, holds a flood. Returns 0, or
 * a negative errno after which the connection is closed. */
static int uploads_pump(struct client *c, bool busy)
{
	struct kvd_server *srv = c->srv;
	struct ipc_frame f;
	struct ipc_prompt_data_msg pd;
	int r;
	uint64_t t_charged = now_ns();

	c->tok_wait = false;
	while (c->up_head && !c->closing) {
		struct upload *u = c->up_head;
		uint64_t t = now_ns();
		client_charge(c, t - t_charged, busy);
		t_charged = t;
		if (client_throttled(c, busy)) {
			if (!c->up_paused) {
				c->up_paused = true;
				srv->n_paused++;
			}
			return 0;
		}
		if (u->kind != UP_DISCARD && kvd_tokwork_owner_jobs(srv->tokw, c->cred.uid) >= SRV_TOKW_USER_JOBS) {
			c->tok_wait = true; /* tokw_collect wakes it */
			return 0;
		}
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
	if (!c->closing)
		client_charge(c, now_ns() - t_charged, busy);
	return 0;
}

/* Everything a client waits on: uploads, queued stream records. */
void client_service(struct client *c)
{
	int r;

	if (!c->chan || c->lingering)
		return;
	bool busy = !kvd_sched_idle(c->srv->sched);
	for (int round = 0; round < 8 && !c->closing; round++) {
		r = c->up_paused ? 0 : uploads_pump(c, busy);
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
		/* (a paused upload is taken up again by resume_paused, a
		 * waiting one by tokw_collect) */
		unsigned what = (upload_pending(c) && !c->up_paused && !c->tok_wait ? IPC_WAIT_RX : 0) |
				(c->tx_need ? IPC_WAIT_TX : 0);
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

void client_mark_dirty(struct client *c)
{
	if (c->dirty || c->closing)
		return;
	c->dirty = true;
	c->dirty_next = c->srv->dirty;
	c->srv->dirty = c;
}

void flush_dirty(struct kvd_server *srv)
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
