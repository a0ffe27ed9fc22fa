/*
 * daemon/handlers.c — the request handlers: GENERATE (checks, upload of a
 * long prompt through the ring, submission to the scheduler), CANCEL and
 * TOKENIZE.
 */
#include "server_impl.h"
#include "scope.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "grammar.h"
#include "kvmm.h"
#include "log.h"
#include "request.h"
#include "tokwork.h"

/* ---- generate ---------------------------------------------------------------- */

static void tokenize_reply(struct client *c, uint64_t rid, uint32_t flags, const char *text, size_t len);
static void tokenize_submit(struct client *c, struct upload *u);

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

/* Whom the scheduler shares the machine between: the client's uid, or for a
 * trusted gateway ([server] gateway_users) the tenant it names, as an id
 * with the top bit set so it is never a uid. */
static uint64_t request_owner(const struct kvd_server *srv, const struct client *c, const struct greq *gr)
{
	if (gr->g.gen_flags & IPC_GEN_TENANT)
		for (size_t i = 0; i < srv->cfg.n_gateway_uids; i++)
			if (srv->cfg.gateway_uids[i] == c->cred.uid)
				return kvd_cache_scope(KVD_SHARE_USER, c->cred.uid, 0, gr->tenant.name, gr->tenant.bytes) |
				       1ull << 63;
	return c->cred.uid;
}

/* Before tokenizing, and again when the tokens come back from the worker:
 * a CANCEL meanwhile, shutdown, the session's state. Sets *hist, *cont and
 * *last (the session's history tokens, whether this turn continues it,
 * its last token). Returns false when gr has been answered (and freed or
 * finished). */
static bool generate_check(struct client *c, struct greq *gr, int *hist, bool *cont, int32_t *last)
{
	struct kvd_server *srv = c->srv;

	*hist = 0;
	*cont = false;
	*last = -1;
	if (gr->cancel_on_upload) {
		gr->state = GR_SCHED;
		gr->finished = true;
		gr->done = (struct ipc_done){ .finish_reason = IPC_FINISH_CANCELLED, .total_ns = now_ns() - gr->t_recv };
		client_mark_dirty(c);
		return false;
	}
	if (srv->stopping) {
		reject(c, gr, IPC_ERR_SHUTDOWN, "kvd is shutting down");
		return false;
	}
	if (gr->sess) {
		*hist = kvd_sched_session_tokens(srv->sched, gr->sess->id);
		if (*hist < 0)
			*hist = 0;
		*cont = gr->sess->turns > 0;
		if (*cont && *hist == 0) {
			reject(c, gr, IPC_ERR_SESSION, "session %" PRIu64 " has expired", gr->sess->id);
			return false;
		}
		if (*cont)
			*last = kvd_sched_session_last_token(srv->sched, gr->sess->id);
	}
	return true;
}

static void generate_continue(struct client *c, struct greq *gr, struct tokw_job *j);

/* The prompt is complete (prompt: prompt[len] == 0, malloc'd; ownership
 * moves here): the checks, then tokenizing — on the worker for a prompt
 * that came through the upload ring (in_ring), here for an inline one —
 * then generate_continue. */
static void generate_start(struct client *c, struct greq *gr, char *prompt, size_t len, bool in_ring)
{
	struct kvd_server *srv = c->srv;
	bool chat = !(gr->g.gen_flags & IPC_GEN_RAW);
	bool cont;
	int hist;
	int32_t last;
	struct tokw_job *j = NULL;

	if (!generate_check(c, gr, &hist, &cont, &last))
		goto out;
	if (chat && !(gr->g.gen_flags & IPC_GEN_CHAT_TURNS) && memchr(prompt, 0, len)) {
		reject(c, gr, -EINVAL, "the prompt contains a NUL byte (not allowed in chat mode)");
		goto out;
	}
	_Static_assert(KVD_VERSION_NUM >= IPC_CHAT_TURNS_SERVER_VERSION, "clients gate turns on the version");
	_Static_assert(KVD_VERSION_NUM >= IPC_CHAT_TOOLS_SERVER_VERSION, "clients gate tool turns on the version");
	j = calloc(1, sizeof(*j));
	if (!j || (chat && !(j->system = strdup(gr->system)))) {
		reject(c, gr, -ENOMEM, "out of memory");
		goto out;
	}
	j->owner = c->cred.uid;
	j->client_id = c->id;
	j->req_id = gr->id;
	j->seq = gr->tok_seq = ++srv->next_tok_seq;
	j->kind = gr->g.gen_flags & IPC_GEN_CHAT_TURNS ? TOKW_CHAT_TURNS : chat ? TOKW_CHAT_TURN : TOKW_RAW;
	j->text = prompt;
	prompt = NULL;
	j->len = len;
	j->continuation = cont;
	j->last_token = last;
	j->add_bos = !cont;
	j->parse_special = !!(gr->g.gen_flags & IPC_GEN_PARSE_SPECIAL);
	if (gr->cons.kind) { /* compiled on the worker after the prompt, through the shared cache */
		_Static_assert(IPC_CONSTRAINT_GBNF == (int)KVD_GRAMMAR_GBNF && IPC_CONSTRAINT_JSON_SCHEMA ==
			       (int)KVD_GRAMMAR_JSON_SCHEMA && IPC_CONSTRAINT_JSON_OBJECT == (int)KVD_GRAMMAR_JSON_OBJECT &&
			       IPC_CONSTRAINT_REGEX == (int)KVD_GRAMMAR_REGEX && IPC_CONSTRAINT_CHOICE ==
			       (int)KVD_GRAMMAR_CHOICE, "constraint kinds are the wire's");
		_Static_assert(IPC_MAX_CONSTRAINT_BYTES <= KVD_GRAMMAR_MAX_TEXT_BYTES, "the wire's limit is the compiler's");
		j->cons_kind = gr->cons.kind;
		j->cons_text = gr->cons_text;
		gr->cons_text = NULL;
		j->cons_len = gr->cons.text_bytes;
		j->gram_cache = srv->gram_cache;
		in_ring = true; /* compiling may take a while: never on the loop */
	}
	/* Without a window policy a prompt over n_ctx - max_tokens can never
	 * run (truncate-oldest drops history, never the new turn): stop
	 * tokenizing past that, so a huge prompt costs about the context. */
	if (gr->ctx.policy == IPC_CTX_SLIDING_WINDOW || gr->ctx.policy == IPC_CTX_SINKS)
		j->stop_after = TOKW_NO_BOUND;
	else
		j->stop_after = gr->g.max_tokens < srv->n_ctx ? srv->n_ctx - gr->g.max_tokens : 0;
	if (in_ring) {
		int r = kvd_tokwork_submit(srv->tokw, j);
		if (r < 0) {
			reject(c, gr, r, "cannot tokenize the prompt: %s", strerror(-r));
			goto out;
		}
		gr->state = GR_TOKENIZING;
		return;
	}
	kvd_tokwork_run(srv->tok, j);
	generate_continue(c, gr, j);
out:
	tokw_job_free(j);
	free(prompt);
}

/* The prompt's tokens are in j: check the context, submit. */
static void generate_continue(struct client *c, struct greq *gr, struct tokw_job *j)
{
	struct kvd_server *srv = c->srv;
	struct kvd_request_params p = { 0 };
	int32_t *ids = NULL;
	int n = j->n, r, hist;
	bool chat = !(gr->g.gen_flags & IPC_GEN_RAW);
	bool cont;
	int32_t last;

	if (!generate_check(c, gr, &hist, &cont, &last))
		return;
	if (cont != j->continuation) { /* the session went or expired while the worker had the prompt */
		reject(c, gr, IPC_ERR_SESSION, "the request's session ended while its prompt was being tokenized");
		return;
	}
	if (n < 0) {
		if (j->kind != TOKW_RAW)
			reject(c, gr, n, "%s", j->why);
		else
			reject(c, gr, n, "cannot tokenize the prompt: %s", strerror(-n));
		return;
	}
	if (j->kind == TOKW_CHAT_TURN)
		log_debug("request %" PRIu64 ": chat turn%s: %d tokens", gr->id, cont ? " (continuation)" : "", n);
	if (!j->stopped && j->gram_rc < 0) {
		reject(c, gr, j->gram_rc, "constraint: %s", j->gram_why);
		return;
	}
	ids = j->ids;
	j->ids = NULL;
	if (n == 0) {
		free(ids);
		reject(c, gr, -EINVAL, "the prompt is empty");
		return;
	}
	if (j->stopped) { /* more than the context can hold even without history: n is a lower bound */
		free(ids);
		reject(c, gr, IPC_ERR_CONTEXT,
		       "%sat least %d prompt tokens + max_tokens %u = %" PRIu64 " exceeds the context window of %u tokens",
		       hist ? "session history + " : "", hist + n, gr->g.max_tokens,
		       (uint64_t)hist + (uint64_t)n + gr->g.max_tokens, srv->n_ctx);
		return;
	}
	/* context policies (ctxpolicy.c): a first turn notes what truncation
	 * keeps; a turn that does not fit drops the session's oldest turns;
	 * the window policies let the history run past the context */
	bool windowed = gr->ctx.policy == IPC_CTX_SLIDING_WINDOW || gr->ctx.policy == IPC_CTX_SINKS;
	if (gr->sess && !cont)
		gr->head_tokens = chat ? ctx_first_turn_head(srv, gr->system, ids, (uint32_t)n) : 0;
	if (!windowed && gr->sess && cont && gr->ctx.policy == IPC_CTX_TRUNCATE_OLDEST &&
	    (uint64_t)hist + (uint64_t)n + gr->g.max_tokens > srv->n_ctx) {
		char why[256];
		uint32_t h = (uint32_t)hist;
		if (ctx_truncate_oldest(srv, gr, &h, (uint64_t)hist + (uint64_t)n + gr->g.max_tokens, why, sizeof(why)) < 0) {
			free(ids);
			reject(c, gr, IPC_ERR_CONTEXT, "session history + %d prompt tokens + max_tokens %u exceed the "
			       "context window of %u tokens, and truncate-oldest cannot help: %s",
			       hist + n, gr->g.max_tokens, srv->n_ctx, why);
			return;
		}
		log_info("request %" PRIu64 ": session %" PRIu64 ": truncate-oldest dropped %u turn(s), %u tokens",
			 gr->id, gr->sess->id, gr->trunc_turns, gr->trunc_tokens);
		hist = (int)h;
	}
	gr->turn_start = (uint32_t)hist;
	if (!windowed && (uint64_t)hist + (uint64_t)n + gr->g.max_tokens > srv->n_ctx) {
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
	p.n_samples = greq_weight(&gr->g);
	p.logprobs = !!(gr->g.gen_flags & IPC_GEN_LOGPROBS);
	p.no_speculate = !!(gr->g.gen_flags & IPC_GEN_NO_SPECULATE);
	p.top_logprobs = gr->g.top_logprobs;
	p.session = gr->sess ? gr->sess->id : 0;
	p.session_idle_s = gr->sess ? gr->sess->idle_timeout_s : 0;
	ctx_request_params(gr, &p);
	p.owner = request_owner(srv, c, gr);
	p.priority = gr->priority;
	p.grammar = j->grammar; /* the scheduler takes its own reference */
	p.gram_vocab = j->grammar ? srv->gram_vocab : NULL;
	p.cache_scope = kvd_cache_scope(kvd_prefix_sharing_parse(srv->cfg.prefix_sharing), c->cred.uid, c->cred.gid,
					gr->g.gen_flags & IPC_GEN_TENANT ? gr->tenant.name : NULL,
					gr->g.gen_flags & IPC_GEN_TENANT ? gr->tenant.bytes : 0);
	r = kvd_request_new(srv->tok, gr->stops, gr->g.n_stop, &gr->rq);
	if (r == 0)
		r = gsamples_setup(srv, gr);
	if (r < 0) {
		free(ids);
		reject(c, gr, r, "request refused: %s", strerror(-r));
		return;
	}
	if (p.n_samples > 1 && p.ctx_policy != KVD_CTX_ERROR) {
		/* samples fork one sequence; a window policy drops per sequence */
		free(ids);
		reject(c, gr, -EINVAL, "%u samples cannot be combined with context policy %s (one sample, or the "
		       "default policy error)", p.n_samples, ipc_context_policy_name(p.ctx_policy));
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
		if (windowed) {
			char why[IPC_MAX_ERROR_MSG_BYTES];
			reject(c, gr, IPC_ERR_CONTEXT, "%s", ctx_refusal(srv, gr, r, why, sizeof(why)));
			return;
		}
		reject(c, gr, IPC_ERR_CONTEXT, "prompt + max_tokens exceeds max_model_len (%u tokens)", srv->n_ctx);
		return;
	case -ENOTSUP: {
		char why[IPC_MAX_ERROR_MSG_BYTES];
		reject(c, gr, -EOPNOTSUPP, "%s", ctx_refusal(srv, gr, r, why, sizeof(why)));
		return;
	}
	case -ENOSPC:
		reject(c, gr, -ENOSPC, "%d prompt tokens + max_tokens %u need more KV pages than the whole pool has (%u)",
		       hist + n, gr->g.max_tokens, kvmm_n_pages(srv->kv));
		return;
	case -EBUSY:
		reject(c, gr, IPC_ERR_LIMIT, "the request queue is full (scheduler.max_waiting = %u)",
		       srv->cfg.max_waiting);
		return;
	case -ERANGE:
		reject(c, gr, IPC_ERR_LIMIT, "%u samples exceed scheduler.max_num_seqs (%u sequences at once)",
		       p.n_samples, srv->cfg.max_num_seqs);
		return;
	default:
		reject(c, gr, r, "request refused: %s", strerror(-r));
		return;
	}
}

void upload_free(struct upload *u)
{
	free(u->buf);
	free(u);
}

void upload_done(struct client *c)
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
	case UP_GENERATE: { /* the buffer goes with the prompt, to the worker */
		struct greq *gr = u->gr;
		uint32_t n = gr->g.prompt_bytes;
		if (gr->cons.kind && gr->cons.text_bytes) { /* the constraint's text follows the prompt */
			gr->cons_text = u->buf ? malloc(gr->cons.text_bytes) : NULL;
			if (!gr->cons_text) {
				reject(c, gr, -ENOMEM, "out of memory");
				break;
			}
			memcpy(gr->cons_text, u->buf + n, gr->cons.text_bytes);
			u->buf[n] = 0;
		}
		generate_start(c, gr, u->buf, n, true);
		u->buf = NULL;
		break;
	}
	case UP_TOKENIZE:
		tokenize_submit(c, u);
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

void handle_generate(struct client *c, const struct ipc_frame *f)
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
	bool has_cons = m.g.gen_flags & IPC_GEN_CONSTRAINT;
	/* the upload: the prompt, then the constraint's text (ipc_owner.h) */
	uint32_t up = in_ring ? m.g.prompt_bytes + (has_cons ? m.cons.text_bytes : 0) : 0;
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
	/* each sample counts as a request in flight */
	if (c->n_inflight + greq_weight(&m.g) > srv->cfg.max_requests_per_client) {
		refuse_upload(c, rid, up, IPC_ERR_LIMIT,
			      "%u samples count as %u requests; with %u in flight that exceeds "
			      "server.max_requests_per_client = %u",
			      greq_weight(&m.g), greq_weight(&m.g), c->n_inflight, srv->cfg.max_requests_per_client);
		return;
	}
	if (m.g.prompt_bytes > srv->cfg.max_prompt_bytes) {
		refuse_upload(c, rid, up, IPC_ERR_LIMIT,
			      "prompt of %u bytes exceeds this server's limit of %" PRIu64 " bytes (server.max_prompt_bytes)",
			      m.g.prompt_bytes, srv->cfg.max_prompt_bytes);
		return;
	}
	if (has_cons && m.cons.text_bytes > srv->cfg.max_constraint_bytes) {
		refuse_upload(c, rid, up, -E2BIG,
			      "constraint: %u bytes exceed this server's limit of %" PRIu64 " bytes (limits.max_constraint_bytes)",
			      m.cons.text_bytes, srv->cfg.max_constraint_bytes);
		return;
	}
	if (has_cons && !srv->gram_vocab) {
		refuse_upload(c, rid, up, -ENOTSUP, "constraint: not available with this model's vocabulary");
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
	if (m.g.gen_flags & IPC_GEN_TENANT)
		gr->tenant = m.tenant;
	if (m.g.gen_flags & IPC_GEN_PRIORITY)
		gr->priority = m.prio.priority;
	if (has_cons) {
		gr->cons = m.cons;
		if (!in_ring && m.cons.text_bytes) {
			gr->cons_text = malloc(m.cons.text_bytes);
			if (!gr->cons_text)
				goto oom;
			memcpy(gr->cons_text, m.cons_text, m.cons.text_bytes);
		}
	}
	if (m.g.gen_flags & IPC_GEN_CONTEXT)
		gr->ctx = m.ctx;
	else if (sess && sess->ctx_set)
		gr->ctx = sess->ctx;
	else
		ctx_server_default(srv, &gr->ctx);
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
	c->n_inflight += greq_weight(&gr->g);
	if (in_ring && m.g.prompt_bytes > 0) {
		gr->state = GR_UPLOADING;
		if (upload_add(c, UP_GENERATE, rid, up, gr, 0, 0, NULL) < 0)
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
	generate_start(c, gr, prompt, m.g.prompt_bytes, false);
	return;
oom:
	if (gr)
		greq_free(gr);
	srv->requests_rejected++;
	ledger_rejected(c, rid, -ENOMEM, "out of memory");
	sock_error(c, rid, -ENOMEM, "out of memory");
}

void handle_cancel(struct client *c, uint64_t rid)
{
	struct greq *gr = greq_find(c, rid);
	if (!gr || gr->finished)
		return;
	if (gr->state == GR_UPLOADING || gr->state == GR_TOKENIZING) {
		gr->cancel_on_upload = true; /* answered when its tokens come back */
		return;
	}
	kvd_sched_cancel(c->srv->sched, (uint64_t)(uintptr_t)gr);
}

/* ---- other requests ---------------------------------------------------------- */

/* TOKENIZE's reply: n ids (or n < 0, the error) in TOKENIZE_REPLY frames. */
static void tokenize_send(struct client *c, uint64_t rid, uint32_t flags, int n, const int32_t *ids)
{
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
}

static void tokenize_reply(struct client *c, uint64_t rid, uint32_t flags, const char *text, size_t len)
{
	int32_t *ids = NULL;
	int n = kvd_request_tokenize(c->srv->tok, text, len, !!(flags & IPC_TOK_ADD_BOS),
				     !!(flags & IPC_TOK_PARSE_SPECIAL), KVD_REQUEST_ALL, &ids);
	tokenize_send(c, rid, flags, n, ids);
	free(ids);
}

/* A TOKENIZE text from the ring goes to the worker with its buffer (taken
 * from u); the reply goes when it comes back (tokw_collect). */
static void tokenize_submit(struct client *c, struct upload *u)
{
	struct tokw_job *j = calloc(1, sizeof(*j));
	int r;

	if (!j) {
		sock_error(c, u->req_id, -ENOMEM, "out of memory");
		return;
	}
	j->owner = c->cred.uid;
	j->client_id = c->id;
	j->req_id = u->req_id;
	j->seq = ++c->srv->next_tok_seq;
	j->tokenize = true;
	j->kind = TOKW_RAW;
	j->text = u->buf;
	j->len = u->total;
	j->add_bos = !!(u->tok_flags & IPC_TOK_ADD_BOS);
	j->parse_special = !!(u->tok_flags & IPC_TOK_PARSE_SPECIAL);
	j->tok_flags = u->tok_flags;
	j->stop_after = TOKW_NO_BOUND; /* a count is exact */
	r = kvd_tokwork_submit(c->srv->tokw, j);
	if (r < 0) {
		j->text = NULL; /* still the upload's */
		tokw_job_free(j);
		sock_error(c, u->req_id, r, "cannot tokenize: %s", strerror(-r));
		return;
	}
	u->buf = NULL;
}

static struct client *client_by_id(struct kvd_server *srv, uint64_t id)
{
	for (struct client *c = srv->clients; c; c = c->next)
		if (c->id == id)
			return c->closing || c->lingering ? NULL : c;
	return NULL;
}

void tokw_collect(struct kvd_server *srv)
{
	bool busy = !kvd_sched_idle(srv->sched);
	struct tokw_job *list = kvd_tokwork_take_done(srv->tokw);

	while (list) {
		struct tokw_job *j = list;
		list = j->next;
		struct client *c = client_by_id(srv, j->client_id);
		if (c) {
			client_charge(c, j->cpu_ns, busy);
		} else if (busy) { /* gone: its user pays, if it is still connected */
			for (struct user_share *u = srv->shares; u; u = u->next)
				if (u->uid == (uid_t)j->owner) {
					uint64_t earned = srv->ctl_earned_ns;
					u->ctl_until = (u->ctl_until > earned ? u->ctl_until : earned) + j->cpu_ns;
					break;
				}
		}
		if (c && j->tokenize) {
			tokenize_send(c, j->req_id, j->tok_flags, j->n, j->ids);
		} else if (c) {
			struct greq *gr = greq_find(c, j->req_id);
			if (gr && gr->state == GR_TOKENIZING && gr->tok_seq == j->seq) {
				generate_continue(c, gr, j);
			}
		}
		/* its user may send the next text */
		for (struct client *w = srv->clients; w; w = w->next)
			if (w->tok_wait && w->cred.uid == (uid_t)j->owner && !w->closing) {
				w->tok_wait = false;
				client_mark_dirty(w);
			}
		tokw_job_free(j);
	}
}

void handle_tokenize(struct client *c, const struct ipc_frame *f)
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
