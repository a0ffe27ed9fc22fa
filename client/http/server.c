/*
 * client/http/server.c — kvd-http's HTTP server and its bridge to kvd.
 *
 * libmicrohttpd runs one thread per HTTP connection. A generation request
 * takes a slot on one of a few shared kvd connections (pool.c: kvd counts
 * connections per user, and kvd-http is one user), waiting in a bounded
 * queue when all are full (429 beyond it), starts its request there, and
 * reads its events under a short timeout (HTTP_POLL_MS). Between events the
 * thread looks at the HTTP socket: a client that hung up is noticed within
 * HTTP_POLL_MS even while kvd is still queueing or prefilling, and its
 * request is cancelled in kvd at once (kvd frees its pages on the cancel).
 * A stream whose client stops reading — its bytes wait unacknowledged for
 * client_timeout — is cut and cancelled the same way.
 *
 * A failure on a pooled kvd connection (kvd closed it after its
 * idle_timeout, or restarted) is retried once on a fresh connection, before
 * anything was answered, and the stale connections are dropped; /health and
 * /metrics do the same, so a quiet spell never shows as an outage.
 *
 * Every request has an absolute deadline, request_timeout, for its headers
 * and body (a watchdog thread; libmicrohttpd's own timeout only bounds the
 * silence between bytes, which trickling clients never reach).
 *
 * A streamed response is sent only after kvd has produced the first event
 * or refused the request, so refusals still get their real status (400,
 * 413, 429, 503) instead of an error buried in a 200 stream.
 *
 * No state crosses requests except the shared kvd connections (a request
 * reads only its own events there) and the counters for /metrics.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "kvclient.h"
#include "kvc_metrics.h"
#include "server.h"
#include "server_impl.h"

/* ---- small helpers ------------------------------------------------------------------ */

static void log_msg(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_msg(int prio, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "<%d>kvd-http: ", prio);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int out_append(struct conn *c, const char *s, size_t n)
{
	if (c->out_len + n + 1 > c->out_cap) {
		size_t cap = c->out_cap ? c->out_cap : 4096;
		while (cap < c->out_len + n + 1)
			cap *= 2;
		char *p = realloc(c->out, cap);
		if (!p)
			return -ENOMEM;
		c->out = p;
		c->out_cap = cap;
	}
	memcpy(c->out + c->out_len, s, n);
	c->out_len += n;
	c->out[c->out_len] = '\0';
	return 0;
}

int out_take(struct conn *c, char *s, size_t n)
{
	if (!s)
		return -ENOMEM;
	int r = out_append(c, s, n);
	free(s);
	return r;
}

/* Append one stream chunk (see http_chunk_sse). */
static int out_chunk(struct conn *c, bool role_only, const char *text, size_t len, const char *finish,
		     const struct http_usage *u, bool usage_null)
{
	size_t n = 0;
	char *sse = http_chunk_sse(c->req.endpoint, c->id, c->created, c->model, role_only, text, len, finish, u,
				   usage_null, &n);
	return out_take(c, sse, n);
}

void count_status(struct http_server *s, int status)
{
	size_t i;
	for (i = 0; i < N_STATUS && counted_status[i] != status; i++)
		;
	atomic_fetch_add(&s->responses[i], 1);
}

enum MHD_Result send_body(struct MHD_Connection *con, struct http_server *s, int status, const char *type,
				 const char *body, size_t len)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (status == 401)
		MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	enum MHD_Result x = MHD_queue_response(con, (unsigned)status, r);
	MHD_destroy_response(r);
	count_status(s, status);
	return x;
}

enum MHD_Result send_json(struct MHD_Connection *con, struct http_server *s, int status, char *json)
{
	if (!json)
		return send_body(con, s, 500, "application/json",
				 "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}", 61);
	enum MHD_Result x = send_body(con, s, status, "application/json", json, strlen(json));
	free(json);
	return x;
}

enum MHD_Result send_error(struct MHD_Connection *con, struct http_server *s, const struct http_error *e)
{
	return send_json(con, s, e->status, http_error_json(e));
}

/* kvd's answer code → an OpenAI error. msg: kvd's explanation or "". */
void map_kvd_error(int code, const char *msg, struct http_error *e)
{
	const char *why = msg && msg[0] ? msg : kv_strerror(code);

	switch (code) {
	case KVC_ERR_CONTEXT:
		http_fail(e, 400, "invalid_request_error", "context_length_exceeded", "messages", "%s", why);
		break;
	case -EINVAL:
	case -ERANGE:
		http_fail(e, 400, "invalid_request_error", NULL, NULL, "%s", why);
		break;
	case -E2BIG:
		http_fail(e, 413, "invalid_request_error", "request_too_large", NULL, "%s", why);
		break;
	case -EOPNOTSUPP: /* features gated on kvd's version */
		http_fail(e, 400, "invalid_request_error", "unsupported_parameter", NULL,
			  "this kvd is too old: earlier conversation turns need 0.2.0, 'n' > 1 and "
			  "log-probabilities 0.3.0, structured output and forced tool calls 0.7.0");
		break;
	case KVC_ERR_LIMIT:
		http_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL, "kvd is at capacity: %s", why);
		break;
	case KVC_ERR_SHUTDOWN:
	case KVC_ERR_DENIED:
	case KVC_ERR_VERSION:
	case -ENOENT:
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -EPIPE:
	case -EACCES:
	case -ETIMEDOUT:
	case -EPROTO:
		http_fail(e, 503, "server_error", "service_unavailable", NULL, "kvd is unavailable: %s", why);
		break;
	default:
		http_fail(e, 500, "server_error", NULL, NULL, "kvd failed the request: %s", why);
		break;
	}
}

/* kvd's refusal of c's request: a constraint's error as the 400 of its field. */
static void kvd_error(const struct conn *c, int code, const char *msg, struct http_error *e)
{
	if (c->req.constraint.kind && msg && !strncmp(msg, "constraint: ", 12))
		http_constraint_error(&c->req, msg, e);
	else
		map_kvd_error(code, msg, e);
}

/* The served model's name ("" when kvd was never reached and none is configured). */
void served_model(struct http_server *s, char out[HTTP_MAX_MODEL_ID])
{
	pthread_mutex_lock(&s->lock);
	snprintf(out, HTTP_MAX_MODEL_ID, "%s", s->model);
	pthread_mutex_unlock(&s->lock);
	if (!out[0]) {
		struct lane *l;
		uint32_t w = 0;
		if (pool_acquire(s, &w, 0, -1, &l) == 0) {
			pool_release(s, l, 0, false);
			pthread_mutex_lock(&s->lock);
			snprintf(out, HTTP_MAX_MODEL_ID, "%s", s->model);
			pthread_mutex_unlock(&s->lock);
		}
	}
}

void served_model_names(struct http_server *s, struct http_model_names *ret)
{
	memset(ret, 0, sizeof(*ret));
	served_model(s, ret->names[0]);
	if (!ret->names[0][0])
		return;
	pthread_mutex_lock(&s->lock);
	const char *alias[] = { s->model_name, s->model_file };
	size_t n = 1;
	for (size_t i = 0; i < sizeof(alias) / sizeof(alias[0]); i++) {
		if (!alias[i][0] || model_name_accepted(ret, alias[i]))
			continue;
		snprintf(ret->names[n++], HTTP_MAX_MODEL_ID, "%s", alias[i]);
	}
	pthread_mutex_unlock(&s->lock);
}

bool model_name_accepted(const struct http_model_names *n, const char *want)
{
	for (size_t i = 0; i < HTTP_MODEL_N_NAMES; i++)
		if (n->names[i][0] && !strcmp(n->names[i], want))
			return true;
	return false;
}

/* ---- generation ------------------------------------------------------------------------ */

/* Has the HTTP client hung up? (Pipelined bytes are not a hang-up.) */
bool client_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
	if (fd < 0 || poll(&p, 1, 0) <= 0)
		return false;
	if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
		return true;
	if (p.revents & POLLIN) {
		char b;
		return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
	}
	return false;
}

static void fill_params(const struct conn *c, const struct kvc_info *info, struct kvc_gen_params *p)
{
	const struct http_gen_req *q = &c->req;

	kvc_gen_params_init(p);
	p->max_tokens = q->has_max_tokens ? q->max_tokens : c->s->cfg.default_max_tokens;
	if (!q->has_max_tokens && info->max_tokens && p->max_tokens > info->max_tokens)
		p->max_tokens = info->max_tokens;
	if (q->has_temperature)
		p->temperature = (float)q->temperature;
	if (q->has_top_p)
		p->top_p = (float)q->top_p;
	if (q->has_top_k)
		p->top_k = q->top_k;
	if (q->has_min_p)
		p->min_p = (float)q->min_p;
	if (q->has_repeat_penalty)
		p->repeat_penalty = (float)q->repeat_penalty;
	if (q->has_seed)
		p->seed = q->seed;
	if (q->endpoint == HTTP_EP_COMPLETIONS)
		p->flags |= KVC_GEN_RAW;
	else
		p->system = q->system;
	p->messages = q->messages;
	p->n_messages = q->n_messages;
	if (q->tool_turns && info->server_version >= HTTP_TOOL_TURNS_VERSION) {
		/* kvd renders tools in the model's own format; an older kvd gets
		 * them in the generic format, as text */
		p->system = NULL;
		p->messages = q->tool_turns;
		p->n_messages = q->n_tool_turns;
	}
	p->stop = (const char *const *)q->stop;
	p->n_stop = q->n_stop;
	p->n_samples = q->n;
	if (q->no_speculate)
		p->flags |= KVC_GEN_NO_SPECULATE;
	if (q->logprobs) {
		p->flags |= KVC_GEN_LOGPROBS | KVC_GEN_WANT_IDS;
		p->top_logprobs = q->top_logprobs;
	}
	if (c->tenant[0])
		p->tenant = c->tenant;
	p->priority = q->priority;
	if (q->constraint.kind)
		p->constraint = &q->constraint;
}

/* The request's cache tenant in kvd: its API key (by its line in the key
 * file) and its cache_salt, so requests share cached prompt pages only when
 * both are the same; "" (the gateway's whole scope) with neither. The
 * key's text is never sent. Also kvd's fairness owner when kvd trusts
 * kvd-http's user ([server] gateway_users). */
static void set_tenant(struct conn *c)
{
	const char *salt = c->req.cache_salt;

	_Static_assert(4 + 1 + HTTP_MAX_CACHE_SALT + 1 <= sizeof(c->tenant), "tenant fits");
	if (c->key_index >= 0 && salt)
		snprintf(c->tenant, sizeof(c->tenant), "k%d/%s", c->key_index, salt);
	else if (c->key_index >= 0)
		snprintf(c->tenant, sizeof(c->tenant), "k%d", c->key_index);
	else if (salt)
		snprintf(c->tenant, sizeof(c->tenant), "/%s", salt);
	else
		c->tenant[0] = '\0';
}

/* Send the request to kvd on a lane of serial >= min_serial: 0, or an
 * error code with e filled. */
static int start_generation(struct conn *c, uint64_t min_serial, struct http_error *e)
{
	struct http_server *s = c->s;
	struct kvc_gen_params p;

	for (int attempt = 0; attempt < 2; attempt++) {
		c->weight = c->req.n > 1 ? c->req.n : 1;
		int r = pool_acquire(s, &c->weight, min_serial, c->sock, &c->lane);
		if (r == -EBUSY) {
			http_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
				  "kvd-http is at capacity: %u requests are waiting already (max_queued)", s->cfg.max_queued);
			return r;
		}
		if (r < 0) {
			c->lane = NULL;
			map_kvd_error(r, "", e);
			return r;
		}
		const struct kvc_info *info = kvc_server_info(lane_lock(c->lane, -1));
		lane_unlock(c->lane);
		/* a forced call in the shape of the family this kvd names */
		if ((r = http_set_call_shape(&c->req, http_call_shape_for(info->server_version, info->chat_format), e)) < 0) {
			pool_release(s, c->lane, c->weight, false);
			c->lane = NULL;
			return r;
		}
		fill_params(c, info, &p);
		if (info->max_tokens && p.max_tokens > info->max_tokens) {
			http_fail(e, 400, "invalid_request_error", "context_length_exceeded",
				  "max_tokens",
				  "'max_tokens' is %u; the model's context window holds %u tokens", p.max_tokens,
				  info->max_tokens);
			pool_release(s, c->lane, c->weight, false);
			c->lane = NULL;
			return -E2BIG;
		}
		bool turns = p.messages && p.messages == c->req.tool_turns; /* the whole conversation */
		r = lane_start(c->lane, turns ? NULL : c->req.prompt, turns ? 0 : c->req.prompt_len, &p, &c->lr);
		if (r == 0) {
			c->kr = c->lr.kr;
			return 0;
		}
		/* a refusal before sending says nothing of the connection; any
		 * other failure of a pooled one (kvd closed it when idle, or
		 * restarted) gets one try on a fresh connection */
		bool local = r == -EINVAL || r == -E2BIG || r == -ENOMEM;
		pool_release(s, c->lane, c->weight, !local);
		c->lane = NULL;
		if (!local && attempt == 0) {
			min_serial = pool_serial(s);
			continue;
		}
		if (r == -E2BIG && strncmp(c->lr.msg, "constraint: ", 12) != 0)
			http_fail(e, 413, "invalid_request_error", "request_too_large",
				  c->req.endpoint == HTTP_EP_CHAT ? "messages" : "prompt",
				  "the prompt is larger than kvd accepts (%s)", c->lr.msg[0] ? c->lr.msg : "max_prompt_bytes");
		else
			kvd_error(c, r, c->lr.msg, e);
		return r;
	}
	return -ECONNRESET;
}

/* Release the request and its slot (the request cancelled if still running). */
static void end_generation(struct conn *c)
{
	if (!c->lane)
		return;
	bool broken = lane_end(c->lane, &c->lr, HTTP_CANCEL_WAIT_MS);
	c->kr = NULL;
	pool_release(c->s, c->lane, c->weight, broken);
	c->lane = NULL;
}

void add_usage(struct conn *c, const struct kvc_result *res, struct http_usage *u)
{
	u->prompt_tokens = res->prompt_tokens;
	u->cached_tokens = res->cached_tokens;
	u->completion_tokens = res->generated_tokens;
	atomic_fetch_add(&c->s->prompt_tokens, res->prompt_tokens);
	atomic_fetch_add(&c->s->cached_tokens, res->cached_tokens);
	atomic_fetch_add(&c->s->completion_tokens, res->generated_tokens);
}

static int64_t mono_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/*
 * Has the stream's client read nothing for client_timeout? Bytes it has not
 * acknowledged waiting in the socket while its acknowledged count stands
 * still mean its receive window is shut: it is not reading. (Once the
 * socket buffer is full too, libmicrohttpd's own timeout ends it likewise.)
 */
static bool stream_unread(struct conn *c, int64_t now)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	int outq = 0;

	if (!c->streaming || c->sock < 0 || ioctl(c->sock, SIOCOUTQ, &outq) < 0 ||
	    getsockopt(c->sock, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 ||
	    len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked))
		return false;
	if (outq <= 0 || ti.tcpi_bytes_acked != c->acked) {
		c->acked = ti.tcpi_bytes_acked;
		c->stuck_since_ms = outq > 0 ? now : 0;
		return false;
	}
	if (!c->stuck_since_ms)
		c->stuck_since_ms = now;
	return now - c->stuck_since_ms >= (int64_t)c->s->cfg.client_timeout_s * 1000;
}

/*
 * Wait for the request's next event. Returns 1 with *ret_ev, 0 when the
 * request ended (normally or not: kvc_request_result() says), -ECONNABORTED
 * when the HTTP client hung up meanwhile. kr_done is set on the end. The
 * HTTP socket is looked at every HTTP_POLL_MS whether kvd is silent (a
 * queued or prefilling request) or busy (tokens arriving faster than that,
 * for a non-streamed answer that writes nothing until the end).
 */
int next_event(struct conn *c, const struct kvc_event **ret_ev, int *ret_code)
{
	for (;;) {
		int r = lane_next(c->lane, &c->lr, HTTP_POLL_MS, ret_ev);
		if (r == 1 || r == -EAGAIN) {
			int64_t now = mono_ms();
			if (r == -EAGAIN || now - c->last_check_ms >= HTTP_POLL_MS) {
				c->last_check_ms = now;
				if (client_gone(c->sock))
					return -ECONNABORTED;
				if (stream_unread(c, now)) {
					atomic_fetch_add(&c->s->unread_streams, 1);
					return -ECONNABORTED;
				}
			}
			if (r == 1)
				return 1;
			continue;
		}
		c->kr_done = true;
		*ret_code = r;
		return 0;
	}
}

/* The error of an ended request: its code, and kvd's message. */
void ended_error(struct conn *c, int code, struct http_error *e)
{
	const struct kvc_result *res = kvc_request_result(c->kr);
	if (code == -ECANCELED)
		http_fail(e, 503, "server_error", "service_unavailable", NULL, "the request was cancelled in kvd");
	else
		kvd_error(c, res && res->error ? res->error : code, res ? res->error_message : "", e);
	/* the context holds the completions endpoint's prompt, not messages */
	if (c->req.endpoint == HTTP_EP_COMPLETIONS && !strcmp(e->param, "messages"))
		snprintf(e->param, sizeof(e->param), "prompt");
}

/* Append the stream's closing events after the request ended with code. */
static int stream_close(struct conn *c, int code)
{
	const struct kvc_result *res = kvc_request_result(c->kr);
	int r = 0;

	if (code == 0 && res && c->ch) {
		r = choices_stream_finish(c);
	} else if (code == 0 && res && c->req.tool_mode) {
		r = tools_stream_finish(c, res);
	} else if (code == 0 && res) {
		struct http_usage u;
		add_usage(c, res, &u);
		r = out_chunk(c, false, NULL, 0, http_finish_reason(res->finish_reason), NULL, c->req.include_usage);
		if (r == 0 && c->req.include_usage)
			r = out_chunk(c, false, NULL, 0, NULL, &u, false);
	} else {
		struct http_error e;
		ended_error(c, code, &e);
		char *j = http_error_json(&e);
		if (j) {
			r = out_append(c, "data: ", 6);
			if (r == 0)
				r = out_append(c, j, strlen(j));
			if (r == 0)
				r = out_append(c, "\n\n", 2);
			free(j);
		}
	}
	if (r == 0)
		r = out_append(c, "data: [DONE]\n\n", 14);
	c->stream_ended = true;
	return r;
}

static int stream_event(struct conn *c, const struct kvc_event *ev)
{
	if (c->ch)
		return choices_stream_event(c, ev);
	if (c->req.tool_mode)
		return tools_stream_event(c, ev);
	if (ev->text_len == 0)
		return 0;
	return out_chunk(c, false, ev->text, ev->text_len, NULL, NULL, c->req.include_usage);
}

/* libmicrohttpd asks for the next bytes of a stream; block until there are some. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct conn *c = cls;
	(void)pos;

	while (c->out_off == c->out_len) {
		c->out_off = c->out_len = 0;
		if (c->stream_ended)
			return MHD_CONTENT_READER_END_OF_STREAM;
		const struct kvc_event *ev;
		int code = 0;
		int r = next_event(c, &ev, &code);
		if (r < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		r = r == 1 ? stream_event(c, ev) : stream_close(c, code);
		if (r < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
	size_t n = c->out_len - c->out_off < max ? c->out_len - c->out_off : max;
	memcpy(buf, c->out + c->out_off, n);
	c->out_off += n;
	return (ssize_t)n;
}

enum MHD_Result generate(struct MHD_Connection *con, struct conn *c, const char *url)
{
	(void)url;
	struct http_server *s = c->s;
	struct http_error e;
	const union MHD_ConnectionInfo *ci;

	if (http_parse_gen_request(c->route->endpoint, c->body, c->body_len,
				   &c->req, &e) < 0)
		return send_error(con, s, &e);
	if (c->req.constraint.kind && kvc_version() < ((0 << 16) | (7 << 8))) {
		http_fail(&e, 400, "invalid_request_error", "unsupported_parameter", c->req.constraint_param,
			  "'%s' needs structured output, which this kvd-http's libkvclient (%s) predates (0.7.0)",
			  c->req.constraint_param, KVC_VERSION_STRING);
		return send_error(con, s, &e);
	}
	set_tenant(c);
	struct http_model_names names;
	served_model_names(s, &names);
	snprintf(c->model, sizeof(c->model), "%s", names.names[0]);
	if (!c->model[0]) {
		map_kvd_error(-ECONNREFUSED, "cannot connect to kvd", &e);
		return send_error(con, s, &e);
	}
	if (c->req.model && !model_name_accepted(&names, c->req.model)) {
		http_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
			  "The model '%s' does not exist; this server serves '%s'", c->req.model, c->model);
		return send_error(con, s, &e);
	}
	ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
	c->sock = ci ? ci->connect_fd : -1;
	uint64_t rnd = 0;
	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
		rnd = (uint64_t)time(NULL);
	snprintf(c->id, sizeof(c->id), "%s-%016" PRIx64 "%08" PRIxFAST64,
		 c->req.endpoint == HTTP_EP_CHAT ? "chatcmpl" : "cmpl", rnd, atomic_fetch_add(&s->id_counter, 1) & 0xffffffff);
	c->created = (long)time(NULL);

	if (choices_wanted(&c->req) && choices_init(c) < 0)
		return MHD_NO;
	/* the first event, or the refusal; a connection that fails before
	 * either (kvd closed it when idle just then) gets one fresh retry */
	const struct kvc_event *ev;
	int code = 0, r = 0;
	for (int attempt = 0; attempt < 2; attempt++) {
		uint64_t fresh = attempt ? pool_serial(s) : 0;
		if (start_generation(c, fresh, &e) < 0)
			return send_error(con, s, &e);
		code = 0;
		r = next_event(c, &ev, &code);
		if (r < 0)
			return MHD_NO; /* the client left: close, the completion callback cancels */
		if (r == 1 || !kvd_conn_error(code) || attempt == 1)
			break;
		end_generation(c);
		c->kr_done = false;
	}
	atomic_fetch_add(&s->generations[c->req.endpoint], 1);
	atomic_fetch_add(&s->active_generations, 1);
	c->counted_active = true;
	if (r == 0 && code != 0) {
		ended_error(c, code, &e);
		return send_error(con, s, &e);
	}

	if (c->req.stream) {
		/* chat streams open with the role; completions with the first text */
		int x = c->ch ? choices_stream_open(c)
			: c->req.endpoint == HTTP_EP_CHAT ? out_chunk(c, true, "", 0, NULL, NULL, c->req.include_usage) : 0;
		if (x == 0)
			x = r == 1 ? stream_event(c, ev) : stream_close(c, code);
		if (x < 0)
			return MHD_NO;
		struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, c, NULL);
		if (!resp)
			return MHD_NO;
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		MHD_add_response_header(resp, "X-Accel-Buffering", "no");
		/* a small, fixed buffer: a client that stops reading shows soon */
		int sndbuf = HTTP_STREAM_SNDBUF;
		if (c->sock >= 0)
			setsockopt(c->sock, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		c->streaming = true;
		enum MHD_Result q = MHD_queue_response(con, MHD_HTTP_OK, resp);
		MHD_destroy_response(resp);
		count_status(s, 200);
		return q;
	}

	/* non-streaming: collect the text, then answer */
	while (r == 1) {
		if ((c->ch ? choices_collect(c, ev) : out_append(c, ev->text, ev->text_len)) < 0)
			return MHD_NO;
		r = next_event(c, &ev, &code);
		if (r < 0)
			return MHD_NO;
	}
	if (code != 0) {
		ended_error(c, code, &e);
		return send_error(con, s, &e);
	}
	if (c->ch)
		return send_json(con, s, 200, choices_response(c));
	const struct kvc_result *res = kvc_request_result(c->kr);
	if (c->req.tool_mode)
		return send_json(con, s, 200, tools_response(c, res));
	struct http_usage u;
	add_usage(c, res, &u);
	return send_json(con, s, 200, http_response_json(c->req.endpoint, c->id, c->created, c->model, c->out ? c->out : "",
							  c->out_len, http_finish_reason(res->finish_reason), &u));
}

/* ---- request deadlines ------------------------------------------------------------------- */

/*
 * libmicrohttpd's connection timeout restarts with every byte, so a client
 * that trickles a header line every few seconds would hold a connection
 * (and, 256 of them, every slot) forever. Each connection is tracked from
 * its start; a request whose headers and body are not all in within
 * request_timeout seconds of that start (or of the previous answer's end,
 * on a kept-alive connection) has its socket shut down by the watchdog
 * thread, and libmicrohttpd closes it. The close notification removes the
 * entry under track_lock before the socket is closed, so the watchdog
 * never shuts down a reused descriptor.
 */
static struct track *track_of(struct MHD_Connection *con)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? ci->socket_context : NULL;
}

/* The request is in (answering) or answered (restart the clock). */
void track_mark(struct http_server *s, struct MHD_Connection *con, bool answering)
{
	pthread_mutex_lock(&s->track_lock);
	struct track *t = track_of(con);
	if (t) {
		t->answering = answering;
		t->since_ms = mono_ms();
	}
	pthread_mutex_unlock(&s->track_lock);
}

static void on_connection(void *cls, struct MHD_Connection *con, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct http_server *s = cls;

	pthread_mutex_lock(&s->track_lock);
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
		struct track *t = calloc(1, sizeof(*t));
		if (t && ci) {
			t->fd = ci->connect_fd;
			t->since_ms = mono_ms();
			t->next = s->tracks;
			if (s->tracks)
				s->tracks->prev = t;
			s->tracks = t;
			*socket_context = t;
		} else {
			free(t); /* out of memory: this connection has only the idle timeout */
		}
	} else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
		struct track *t = *socket_context;
		if (t->prev)
			t->prev->next = t->next;
		else
			s->tracks = t->next;
		if (t->next)
			t->next->prev = t->prev;
		free(t);
		*socket_context = NULL;
	}
	pthread_mutex_unlock(&s->track_lock);
}

static void *watchdog(void *arg)
{
	struct http_server *s = arg;
	int64_t limit_ms = (int64_t)s->cfg.request_timeout_s * 1000;

	pthread_mutex_lock(&s->track_lock);
	while (!s->stopping) {
		int64_t now = mono_ms();
		for (struct track *t = s->tracks; t; t = t->next) {
			if (t->answering || t->cut || now - t->since_ms <= limit_ms)
				continue;
			shutdown(t->fd, SHUT_RDWR);
			t->cut = true;
			atomic_fetch_add(&s->request_timeouts, 1);
		}
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += HTTP_WATCHDOG_MS * 1000000L;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->track_cv, &s->track_lock, &until);
	}
	pthread_mutex_unlock(&s->track_lock);
	return NULL;
}

/* The connection's request is over (answered, failed, or the client left). */
static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct http_server *s = cls;
	struct conn *c = *con_cls;

	track_mark(s, con, false);
	if (!c)
		return;
	if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED && c->streaming && !c->stream_ended)
		atomic_fetch_add(&s->unread_streams, 1);
	*con_cls = NULL;
	if (c->kr && !c->kr_done) {
		/* the HTTP client left (or the server stops) mid-generation:
		 * cancel it in kvd, which frees its pages at once */
		atomic_fetch_add(&s->disconnects, 1);
	}
	end_generation(c);
	if (c->counted_active)
		atomic_fetch_sub(&s->active_generations, 1);
	choices_free(c);
	free(c->tool_text);
	http_gen_req_clear(&c->req);
	free(c->body);
	free(c->out);
	free(c);
}

/* api_key_file: one key a line (trailing blanks dropped; empty lines and
 * lines starting with '#' skipped), 1 to HTTP_MAX_API_KEYS distinct keys of
 * at most HTTP_MAX_API_KEY bytes. Each key is a cache tenant of its own.
 * -errno of the open, -EIO, or -EINVAL (none, too many, too long, twice). */
static int read_key(struct http_server *s)
{
	FILE *f = fopen(s->cfg.api_key_file, "re");
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int r = 0;

	if (!f)
		return -errno;
	s->n_api_keys = 0;
	while (r == 0 && (len = getline(&line, &cap, f)) >= 0) {
		size_t n = (size_t)len;

		while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
			n--;
		if (n == 0 || line[0] == '#')
			continue;
		if (n > HTTP_MAX_API_KEY || s->n_api_keys == HTTP_MAX_API_KEYS || memchr(line, 0, n)) {
			r = -EINVAL;
			break;
		}
		for (size_t k = 0; k < s->n_api_keys; k++)
			if (s->api_key_len[k] == n && !memcmp(s->api_keys[k], line, n))
				r = -EINVAL;
		memcpy(s->api_keys[s->n_api_keys], line, n);
		s->api_keys[s->n_api_keys][n] = '\0';
		s->api_key_len[s->n_api_keys++] = n;
	}
	if (r == 0 && ferror(f))
		r = -EIO;
	if (r == 0 && s->n_api_keys == 0)
		r = -EINVAL;
	free(line);
	fclose(f);
	return r;
}

static void server_free(struct http_server *s)
{
	if (s->watchdog_running) {
		pthread_mutex_lock(&s->track_lock);
		s->stopping = true;
		pthread_cond_broadcast(&s->track_cv);
		pthread_mutex_unlock(&s->track_lock);
		pthread_join(s->watchdog, NULL);
	}
	pool_close(s);
	pthread_cond_destroy(&s->track_cv);
	pthread_mutex_destroy(&s->track_lock);
	pthread_cond_destroy(&s->slot_cv);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

int http_server_start(const struct http_config *cfg, int listen_fd, struct http_server **ret)
{
	struct http_server *s = calloc(1, sizeof(*s));
	int r = 0;

	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->started = (long)time(NULL);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->slot_cv, NULL);
	pthread_mutex_init(&s->track_lock, NULL);
	pthread_cond_init(&s->track_cv, NULL);
	snprintf(s->model, sizeof(s->model), "%s", cfg->model_id);
	if (cfg->api_key_file[0] && (r = read_key(s)) < 0)
		goto fail;
	r = -pthread_create(&s->watchdog, NULL, watchdog, s);
	if (r < 0)
		goto fail;
	s->watchdog_running = true;
	s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
					  MHD_USE_ITC,
				  0, NULL, NULL, http_on_request, s,
				  MHD_OPTION_LISTEN_SOCKET, listen_fd,
				  MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				  MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
				  MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->client_timeout_s,
				  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)cfg->max_header_bytes,
				  MHD_OPTION_THREAD_STACK_SIZE, (size_t)HTTP_THREAD_STACK,
				  MHD_OPTION_END);
	if (!s->mhd) {
		log_msg(3, "the HTTP server did not start");
		r = -EIO;
		goto fail;
	}
	*ret = s;
	return 0;
fail:
	server_free(s);
	return r;
}

struct http_server *http_server_stop(struct http_server *s)
{
	if (!s)
		return NULL;
	int fd = MHD_quiesce_daemon(s->mhd);
	MHD_stop_daemon(s->mhd);
	if (fd >= 0)
		close(fd);
	server_free(s);
	return NULL;
}
