/*
 * daemon/samples.c — the stream of a request that asked for several samples
 * or for log-probabilities: per sample, its text (stop strings and
 * detokenizer of its own), its queued tokens and their log-probability
 * entries, and its terminal DONE; all pushed as IPC_F_SAMPLE records (see
 * "Samples" in ipc/ipc.h). The request's greq lives until every sample's
 * DONE went out (or the one ERROR that ends them all on shutdown).
 */
#include "server_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "request.h"

_Static_assert(KVD_VERSION_NUM >= IPC_SAMPLES_SERVER_VERSION, "clients gate samples on the version");

uint32_t greq_weight(const struct ipc_generate *g)
{
	return g->n_samples > 1 ? g->n_samples : 1;
}

void gsamples_free(struct gsamples *xs)
{
	if (!xs)
		return;
	for (uint32_t i = 0; i < xs->n; i++) {
		kvd_request_free(xs->s[i].rq);
		free(xs->s[i].toks);
		free(xs->s[i].text);
		free(xs->s[i].lp);
	}
	free(xs);
}

int gsamples_setup(struct kvd_server *srv, struct greq *gr)
{
	uint32_t n = greq_weight(&gr->g);

	if (n == 1 && !(gr->g.gen_flags & IPC_GEN_LOGPROBS))
		return 0;
	struct gsamples *xs = calloc(1, sizeof(*xs) + n * sizeof(xs->s[0]));
	if (!xs)
		return -ENOMEM;
	xs->n = n;
	xs->logprobs = gr->g.gen_flags & IPC_GEN_LOGPROBS;
	xs->top_logprobs = gr->g.top_logprobs;
	for (uint32_t i = 0; i < n; i++) {
		int r = kvd_request_new(srv->tok, gr->stops, gr->g.n_stop, &xs->s[i].rq);
		if (r < 0) {
			gsamples_free(xs);
			return r;
		}
	}
	gr->xs = xs;
	return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap : 16;
	while (c < need)
		c *= 2;
	void *q = realloc(*p, c * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = c;
	return 0;
}

/* Append token's log-probability entries to x->lp; their size. */
static int queue_logprobs(struct kvd_server *srv, struct gsample *x, const struct kvd_logprobs *lp, size_t *ret)
{
	int32_t ids[1 + IPC_MAX_TOP_LOGPROBS];
	float vals[1 + IPC_MAX_TOP_LOGPROBS];
	char pieces[1 + IPC_MAX_TOP_LOGPROBS][IPC_MAX_PIECE_BYTES];
	const char *pp[1 + IPC_MAX_TOP_LOGPROBS];
	uint32_t plen[1 + IPC_MAX_TOP_LOGPROBS];
	uint32_t n = 1 + (lp->n_top < IPC_MAX_TOP_LOGPROBS ? lp->n_top : IPC_MAX_TOP_LOGPROBS);
	size_t need = 0;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = i ? lp->top_id[i - 1] : lp->token;
		vals[i] = i ? lp->top_logprob[i - 1] : lp->logprob;
		if (vals[i] > 0.0f)
			vals[i] = 0.0f; /* rounding of a certain token */
		int k = kvd_request_token_piece(srv->tok, ids[i], pieces[i], IPC_MAX_PIECE_BYTES);
		plen[i] = k > 0 ? (uint32_t)k : 0;
		pp[i] = pieces[i];
		need += sizeof(struct ipc_logprob) + plen[i];
	}
	size_t cap = x->lp_cap;
	void *buf = x->lp;
	if (grow(&buf, &cap, x->lp_bytes + need, 1) < 0)
		return -ENOMEM;
	x->lp = buf;
	x->lp_cap = cap;
	size_t before = x->lp_bytes;
	int r = ipc_token_lp_put(x->lp, x->lp_cap, &x->lp_bytes, n, ids, vals, pp, plen);
	if (r < 0)
		return r;
	*ret = x->lp_bytes - before;
	return 0;
}

enum kvd_token_verdict on_sample_token(void *ud, uint64_t req_id, const struct kvd_token_event *ev)
{
	struct kvd_server *srv = ud;
	struct greq *gr = (struct greq *)(uintptr_t)req_id;

	if (!gr->xs)
		return on_token(ud, req_id, ev->token, ev->ending);
	struct gsample *x = &gr->xs->s[ev->sample];
	const char *text;
	size_t len, lpb = 0;
	enum kvd_token_verdict v = kvd_request_token(x->rq, ev->token, ev->ending, &text, &len);

	if (!gr->c)
		return v;
	size_t cap = x->cap_toks;
	void *toks = x->toks;
	if (grow(&toks, &cap, (size_t)x->n_toks + 1, sizeof(*x->toks)) < 0)
		goto oom;
	x->toks = toks;
	x->cap_toks = (uint32_t)cap;
	cap = x->text_cap;
	void *tx = x->text;
	if (grow(&tx, &cap, (size_t)x->text_bytes + len + 1, 1) < 0)
		goto oom;
	x->text = tx;
	x->text_cap = (uint32_t)cap;
	if (gr->xs->logprobs && ev->lp && queue_logprobs(srv, x, ev->lp, &lpb) < 0)
		goto oom;
	if (len)
		memcpy(x->text + x->text_bytes, text, len);
	x->text_bytes += (uint32_t)len;
	x->toks[x->n_toks++] = (struct gtok){ ev->token, (uint32_t)len, (uint32_t)lpb };
	client_mark_dirty(gr->c);
	return v;
oom:
	log_error("out of memory queueing a token for client %" PRIu64, gr->c->id);
	return v;
}

/* Push sample x's queued tokens. 1: all went; 0: the ring is full; < 0. */
static int flush_one(struct client *c, struct greq *gr, uint32_t si, struct gsample *x)
{
	bool want_ids = gr->g.gen_flags & IPC_GEN_WANT_IDS;
	uint32_t max_payload = ipc_chan_tx_max_payload(c->chan);
	uint8_t buf[IPC_MAX_PAYLOAD_BYTES];
	int32_t ids[IPC_MAX_TOKENS_PER_RECORD];
	uint32_t text_off = 0, i = 0;
	size_t lp_off = 0;
	int r = 0;

	while (i < x->n_toks) {
		uint32_t k = 0, tb = 0;
		size_t lpb = 0, fixed = sizeof(struct ipc_token) + sizeof(struct ipc_sample);
		while (i + k < x->n_toks && k < IPC_MAX_TOKENS_PER_RECORD &&
		       tb + x->toks[i + k].text_bytes <= IPC_MAX_TOKEN_TEXT_BYTES &&
		       fixed + (want_ids ? 4u * (k + 1) : 0) + tb + x->toks[i + k].text_bytes + lpb +
				       x->toks[i + k].lp_bytes <=
			       max_payload) {
			ids[k] = x->toks[i + k].id;
			tb += x->toks[i + k].text_bytes;
			lpb += x->toks[i + k].lp_bytes;
			k++;
		}
		if (k == 0)
			return -EMSGSIZE; /* cannot happen: one token always fits (static_assert in ipc) */
		struct ipc_token t = { .index = x->n_sent, .n_tokens = k, .n_ids = want_ids ? k : 0, .text_bytes = tb };
		struct ipc_sample s = { .sample = si,
					.n_top = (uint16_t)(gr->xs->logprobs ? gr->xs->top_logprobs : 0),
					.lp_flags = gr->xs->logprobs ? IPC_LP_PRESENT : 0 };
		ssize_t len = ipc_encode_token_sample(buf, sizeof(buf), &t, &s, ids, x->text + text_off,
						      x->lp ? x->lp + lp_off : NULL, (uint32_t)lpb);
		if (len < 0)
			return (int)len;
		r = ipc_chan_send(c->chan, IPC_MSG_TOKEN, IPC_F_SAMPLE, gr->id, buf, (size_t)len, NULL, 0);
		if (r == -EAGAIN) {
			c->tx_need = (uint32_t)len;
			break;
		}
		if (r < 0)
			return r;
		x->n_sent += k;
		text_off += tb;
		lp_off += lpb;
		i += k;
	}
	if (i) {
		memmove(x->toks, x->toks + i, (x->n_toks - i) * sizeof(*x->toks));
		x->n_toks -= i;
		memmove(x->text, x->text + text_off, x->text_bytes - text_off);
		x->text_bytes -= text_off;
		if (x->lp) { /* (none without log-probabilities) */
			memmove(x->lp, x->lp + lp_off, x->lp_bytes - lp_off);
			x->lp_bytes -= lp_off;
		}
	}
	if (r == -EAGAIN)
		return 0;
	if (!x->finished || x->done_sent || gr->shutdown)
		return 1;
	struct {
		struct ipc_sample s;
		struct ipc_done_spec sp;
	} ext = { .s = { .sample = si }, .sp = x->done_spec };
	_Static_assert(sizeof(ext) == sizeof(ext.s) + sizeof(ext.sp), "DONE's blocks follow each other unpadded");
	bool spec = c->client_version >= IPC_SPEC_VERSION; /* older clients know no IPC_F_SPEC */
	size_t ext_bytes = spec ? sizeof(ext) : sizeof(ext.s);
	r = ipc_chan_send(c->chan, IPC_MSG_DONE, IPC_F_SAMPLE | (spec ? IPC_F_SPEC : 0), gr->id, &x->done,
			  sizeof(x->done), &ext, ext_bytes);
	if (r == -EAGAIN) {
		c->tx_need = sizeof(x->done) + ext_bytes;
		return 0;
	}
	if (r < 0)
		return r;
	x->done_sent = true;
	return 1;
}

int samples_flush(struct client *c, struct greq *gr)
{
	uint32_t sent = 0;

	for (uint32_t i = 0; i < gr->xs->n; i++) {
		int r = flush_one(c, gr, i, &gr->xs->s[i]);
		if (r <= 0)
			return r;
		sent += gr->xs->s[i].done_sent;
	}
	if (!gr->finished)
		return 1;
	if (gr->shutdown) {
		int r = ipc_chan_send_error(c->chan, gr->id, IPC_ERR_SHUTDOWN, "kvd is shutting down; request ended");
		if (r == -EAGAIN) {
			c->tx_need = sizeof(struct ipc_error) + IPC_MAX_ERROR_MSG_BYTES;
			return 0;
		}
		if (r < 0)
			return r;
	} else if (sent < gr->xs->n) {
		return 1;
	}
	greq_unlink(c, gr);
	greq_free(gr);
	c->last_active_ns = now_ns(); /* idle from the end of its last request */
	return 1;
}
