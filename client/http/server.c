/*
 * client/http/server.c — kvd-http's HTTP server and its bridge to kvd.
 *
 * libmicrohttpd runs one thread per HTTP connection. A generation request
 * takes a kvd connection (kvc_client) from a small pool — libkvclient
 * wants one client per thread, and a pooled one saves the handshake —,
 * starts the request, and reads its events with kvc_request_next() under a
 * short timeout (HTTP_POLL_MS). Between events the thread looks at the
 * HTTP socket: a client that hung up is noticed within HTTP_POLL_MS even
 * while kvd is still queueing or prefilling, and its request is cancelled
 * in kvd at once (kvc_request_finish + closing that kvd connection, so the
 * daemon frees the pages immediately). A client that stops reading is
 * closed by libmicrohttpd after client_timeout seconds without progress,
 * with the same effect.
 *
 * A streamed response is sent only after kvd has produced the first event
 * or refused the request, so refusals still get their real status (400,
 * 413, 429, 503) instead of an error buried in a 200 stream.
 *
 * No state crosses requests except the pool of idle kvd connections (each
 * returned only after its request ended normally, so nothing of one
 * request can be read by the next) and the counters for /metrics.
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
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "kvclient.h"
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

static enum MHD_Result send_body(struct MHD_Connection *con, struct http_server *s, int status, const char *type,
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

static enum MHD_Result send_error(struct MHD_Connection *con, struct http_server *s, const struct http_error *e)
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
			  "log-probabilities 0.3.0");
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

/* ---- the pool of kvd connections ------------------------------------------------------- */

static int kvd_get(struct http_server *s, kvc_client **ret)
{
	pthread_mutex_lock(&s->lock);
	if (s->n_pool) {
		*ret = s->pool[--s->n_pool];
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	pthread_mutex_unlock(&s->lock);
	kvc_client *c;
	int r = kvc_connect(s->cfg.kvd_socket[0] ? s->cfg.kvd_socket : NULL, &c);
	if (r < 0)
		return r;
	pthread_mutex_lock(&s->lock);
	if (!s->model[0])
		snprintf(s->model, sizeof(s->model), "%s", kvc_server_info(c)->model_name);
	s->n_ctx = kvc_server_info(c)->n_ctx;
	pthread_mutex_unlock(&s->lock);
	*ret = c;
	return 0;
}

/* Give back a connection whose requests have all ended. */
static void kvd_put(struct http_server *s, kvc_client *c)
{
	if (!c)
		return;
	kvc_set_timeout(c, -1);
	pthread_mutex_lock(&s->lock);
	if (s->n_pool < HTTP_KVD_POOL_MAX) {
		s->pool[s->n_pool++] = c;
		c = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	kvc_close(c);
}

/* The served model's name ("" when kvd was never reached and none is configured). */
static void served_model(struct http_server *s, char out[HTTP_MAX_MODEL_ID])
{
	pthread_mutex_lock(&s->lock);
	snprintf(out, HTTP_MAX_MODEL_ID, "%s", s->model);
	pthread_mutex_unlock(&s->lock);
	if (!out[0]) {
		kvc_client *c;
		if (kvd_get(s, &c) == 0) {
			kvd_put(s, c);
			pthread_mutex_lock(&s->lock);
			snprintf(out, HTTP_MAX_MODEL_ID, "%s", s->model);
			pthread_mutex_unlock(&s->lock);
		}
	}
}

/* ---- generation ------------------------------------------------------------------------ */

/* Has the HTTP client hung up? (Pipelined bytes are not a hang-up.) */
static bool client_gone(int fd)
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
	p->stop = (const char *const *)q->stop;
	p->n_stop = q->n_stop;
	p->n_samples = q->n;
	if (q->logprobs) {
		p->flags |= KVC_GEN_LOGPROBS | KVC_GEN_WANT_IDS;
		p->top_logprobs = q->top_logprobs;
	}
}

/* Send the request to kvd: 0, or an error code with e filled. */
static int start_generation(struct conn *c, struct http_error *e)
{
	struct http_server *s = c->s;
	struct kvc_gen_params p;

	for (int attempt = 0; attempt < 2; attempt++) {
		int r = kvd_get(s, &c->kc);
		if (r < 0) {
			map_kvd_error(r, "", e);
			return r;
		}
		const struct kvc_info *info = kvc_server_info(c->kc);
		fill_params(c, info, &p);
		if (info->max_tokens && p.max_tokens > info->max_tokens) {
			http_fail(e, 400, "invalid_request_error", "context_length_exceeded",
				  "max_tokens",
				  "'max_tokens' is %u; the model's context window holds %u tokens", p.max_tokens,
				  info->max_tokens);
			kvd_put(s, c->kc);
			c->kc = NULL;
			return -E2BIG;
		}
		kvc_set_timeout(c->kc, HTTP_START_TIMEOUT_MS);
		r = kvc_request_start(c->kc, c->req.prompt, c->req.prompt_len, &p, &c->kr);
		if (r == 0) {
			kvc_set_timeout(c->kc, HTTP_POLL_MS);
			return 0;
		}
		char msg[256];
		snprintf(msg, sizeof(msg), "%s", kvc_last_message(c->kc));
		c->kc = kvc_close(c->kc);
		/* a pooled connection may predate a kvd restart: one fresh try */
		if ((r == -ECONNRESET || r == -EPIPE) && attempt == 0)
			continue;
		if (r == -E2BIG)
			http_fail(e, 413, "invalid_request_error", "request_too_large", "messages",
				  "the prompt is larger than kvd accepts (%s)", msg[0] ? msg : "max_prompt_bytes");
		else
			map_kvd_error(r, msg, e);
		return r;
	}
	return -ECONNRESET;
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
		int r = kvc_request_next(c->kr, ret_ev);
		if (r == 1 || r == -ETIMEDOUT) {
			int64_t now = mono_ms();
			if (r == -ETIMEDOUT || now - c->last_check_ms >= HTTP_POLL_MS) {
				c->last_check_ms = now;
				if (client_gone(c->sock))
					return -ECONNABORTED;
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
		map_kvd_error(res && res->error ? res->error : code, res ? res->error_message : "", e);
}

/* Append the stream's closing events after the request ended with code. */
static int stream_close(struct conn *c, int code)
{
	const struct kvc_result *res = kvc_request_result(c->kr);
	int r = 0;

	if (code == 0 && res && c->ch) {
		r = choices_stream_finish(c);
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

static enum MHD_Result generate(struct MHD_Connection *con, struct conn *c)
{
	struct http_server *s = c->s;
	struct http_error e;
	const union MHD_ConnectionInfo *ci;

	if (http_parse_gen_request(c->route == ROUTE_CHAT ? HTTP_EP_CHAT : HTTP_EP_COMPLETIONS, c->body, c->body_len,
				   &c->req, &e) < 0)
		return send_error(con, s, &e);
	served_model(s, c->model);
	if (!c->model[0]) {
		map_kvd_error(-ECONNREFUSED, "cannot connect to kvd", &e);
		return send_error(con, s, &e);
	}
	if (c->req.model && strcmp(c->req.model, c->model) != 0) {
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
	if (start_generation(c, &e) < 0)
		return send_error(con, s, &e);
	atomic_fetch_add(&s->generations[c->req.endpoint], 1);
	atomic_fetch_add(&s->active_generations, 1);
	c->counted_active = true;

	/* the first event, or the refusal */
	const struct kvc_event *ev;
	int code = 0;
	int r = next_event(c, &ev, &code);
	if (r < 0)
		return MHD_NO; /* the client left: close, the completion callback cancels */
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
	struct http_usage u;
	add_usage(c, res, &u);
	return send_json(con, s, 200, http_response_json(c->req.endpoint, c->id, c->created, c->model, c->out ? c->out : "",
							  c->out_len, http_finish_reason(res->finish_reason), &u));
}

/* ---- the other endpoints ------------------------------------------------------------------- */

static enum MHD_Result models(struct MHD_Connection *con, struct conn *c, const char *url)
{
	char m[HTTP_MAX_MODEL_ID];
	struct http_error e;

	served_model(c->s, m);
	if (!m[0]) {
		map_kvd_error(-ECONNREFUSED, "cannot connect to kvd", &e);
		return send_error(con, c->s, &e);
	}
	pthread_mutex_lock(&c->s->lock);
	json_int_t n_ctx = c->s->n_ctx;
	pthread_mutex_unlock(&c->s->lock);
	/* max_model_len: the context window, as vLLM names it */
	json_t *model = json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", m, "object", "model", "created",
				  (json_int_t)c->s->started, "owned_by", "kvd", "max_model_len", n_ctx);
	if (c->route == ROUTE_MODEL) {
		const char *want = url + strlen("/v1/models/");
		if (strcmp(want, m) != 0) {
			json_decref(model);
			http_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
				  "The model '%.200s' does not exist", want);
			return send_error(con, c->s, &e);
		}
		char *s = model ? json_dumps(model, JSON_COMPACT) : NULL;
		json_decref(model);
		return send_json(con, c->s, 200, s);
	}
	json_t *list = json_pack("{s:s, s:[o]}", "object", "list", "data", model);
	char *s = list ? json_dumps(list, JSON_COMPACT) : NULL;
	json_decref(list);
	return send_json(con, c->s, 200, s);
}

static enum MHD_Result health(struct MHD_Connection *con, struct conn *c)
{
	kvc_client *kc;
	char buf[512];
	int r = kvd_get(c->s, &kc);
	if (r == 0) {
		kvc_set_timeout(kc, HTTP_CTL_TIMEOUT_MS);
		r = kvc_ping(kc, NULL);
		if (r == 0)
			kvd_put(c->s, kc);
		else
			kvc_close(kc);
	}
	if (r == 0)
		return send_body(con, c->s, 200, "application/json", "{\"status\":\"ok\"}", 15);
	json_t *o = json_pack("{s:s, s:s}", "status", "unavailable", "error", kv_strerror(r));
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	snprintf(buf, sizeof(buf), "%s", s ? s : "{\"status\":\"unavailable\"}");
	free(s);
	return send_body(con, c->s, 503, "application/json", buf, strlen(buf));
}

struct metric {
	const char *name, *help;
	size_t off;
	bool counter;
};
#define M(field, counter, help) { #field, help, offsetof(struct kvc_stats, field), counter }
static const struct metric kvd_metrics[] = {
	M(pages_total, false, "pages in the KV pool"),
	M(pages_free, false, "free KV pages"),
	M(pages_used, false, "KV pages referenced by at least one sequence"),
	M(pages_shared, false, "KV pages referenced by two or more sequences"),
	M(pages_cached, false, "unreferenced KV pages kept for prefix reuse"),
	M(pages_swapped, false, "pages' worth of KV content in the swap file"),
	M(page_bytes, false, "bytes of one KV page"),
	M(block_size, false, "tokens per KV page"),
	M(pool_bytes, false, "KV pool size in bytes"),
	M(tokens_resident, false, "tokens whose K/V are in the pool"),
	M(slack_tokens, false, "unused token slots in partly filled pages"),
	M(prefix_lookups, true, "prefix cache lookups"),
	M(prefix_query_tokens, true, "prompt tokens looked up in the prefix cache"),
	M(prefix_hit_tokens, true, "prompt tokens found in the prefix cache"),
	M(pages_evicted, true, "KV pages evicted"),
	M(cow_copies, true, "copy-on-write page copies"),
	M(swap_out_pages, true, "pages written to swap"),
	M(swap_in_pages, true, "pages read back from swap"),
	M(swap_bytes, false, "swap file capacity in bytes"),
	M(requests_running, false, "requests running"),
	M(requests_waiting, false, "requests waiting for admission"),
	M(requests_swapped, false, "requests swapped out"),
	M(requests_completed, true, "requests completed"),
	M(requests_rejected, true, "requests rejected"),
	M(clients, false, "connected kvd clients"),
	M(sessions, false, "open sessions"),
	M(prompt_tokens_total, true, "prompt tokens processed"),
	M(generated_tokens_total, true, "tokens generated"),
	M(steps, true, "scheduler steps run"),
};

static int mprintf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int mprintf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
		va_end(ap);
		if (n < 0)
			return -EINVAL;
		if (*buf && *len + (size_t)n < *cap) {
			*len += (size_t)n;
			return 0;
		}
		size_t ncap = (*cap ? *cap * 2 : 8192) + (size_t)n;
		char *p = realloc(*buf, ncap);
		if (!p)
			return -ENOMEM;
		*buf = p;
		*cap = ncap;
	}
}

static enum MHD_Result metrics(struct MHD_Connection *con, struct conn *c)
{
	struct http_server *s = c->s;
	char *b = NULL;
	size_t len = 0, cap = 0;
	struct kvc_stats st;
	kvc_client *kc;
	int r = kvd_get(s, &kc);
	int x = 0;

	if (r == 0) {
		kvc_set_timeout(kc, HTTP_CTL_TIMEOUT_MS);
		r = kvc_stats(kc, &st);
		if (r == 0)
			kvd_put(s, kc);
		else
			kvc_close(kc);
	}
	x |= mprintf(&b, &len, &cap, "# HELP kvd_up 1 when kvd answered the statistics query\n# TYPE kvd_up gauge\n"
		     "kvd_up %d\n", r == 0);
	for (size_t i = 0; r == 0 && i < sizeof(kvd_metrics) / sizeof(kvd_metrics[0]); i++) {
		const struct metric *m = &kvd_metrics[i];
		uint64_t v = *(const uint64_t *)((const char *)&st + m->off);
		size_t nl = strlen(m->name);
		bool has_total = nl > 6 && !strcmp(m->name + nl - 6, "_total");
		const char *sfx = m->counter && !has_total ? "_total" : "";
		x |= mprintf(&b, &len, &cap, "# HELP kvd_%s%s %s\n# TYPE kvd_%s%s %s\nkvd_%s%s %" PRIu64 "\n", m->name, sfx,
			     m->help, m->name, sfx, m->counter ? "counter" : "gauge", m->name, sfx, v);
	}
	if (r == 0)
		x |= mprintf(&b, &len, &cap, "# HELP kvd_uptime_seconds time since kvd started\n"
			     "# TYPE kvd_uptime_seconds gauge\nkvd_uptime_seconds %.3f\n", (double)st.uptime_ns / 1e9);
	x |= mprintf(&b, &len, &cap, "# HELP kvd_http_responses_total HTTP responses sent, by status\n"
		     "# TYPE kvd_http_responses_total counter\n");
	for (size_t i = 0; i <= N_STATUS; i++) {
		char code[8];
		snprintf(code, sizeof(code), "%d", i < N_STATUS ? counted_status[i] : 0);
		x |= mprintf(&b, &len, &cap, "kvd_http_responses_total{code=\"%s\"} %" PRIuFAST64 "\n",
			     i < N_STATUS ? code : "other", atomic_load(&s->responses[i]));
	}
	x |= mprintf(&b, &len, &cap,
		     "# HELP kvd_http_generations_total generation requests sent to kvd, by endpoint\n"
		     "# TYPE kvd_http_generations_total counter\n"
		     "kvd_http_generations_total{endpoint=\"chat\"} %" PRIuFAST64 "\n"
		     "kvd_http_generations_total{endpoint=\"completions\"} %" PRIuFAST64 "\n"
		     "# HELP kvd_http_active_generations generations in progress\n"
		     "# TYPE kvd_http_active_generations gauge\nkvd_http_active_generations %" PRIuFAST64 "\n"
		     "# HELP kvd_http_client_disconnects_total generations cancelled because the HTTP client left\n"
		     "# TYPE kvd_http_client_disconnects_total counter\nkvd_http_client_disconnects_total %" PRIuFAST64 "\n"
		     "# HELP kvd_http_prompt_tokens_total prompt tokens of finished generations\n"
		     "# TYPE kvd_http_prompt_tokens_total counter\nkvd_http_prompt_tokens_total %" PRIuFAST64 "\n"
		     "# HELP kvd_http_cached_tokens_total of those, reused from kvd's prefix cache\n"
		     "# TYPE kvd_http_cached_tokens_total counter\nkvd_http_cached_tokens_total %" PRIuFAST64 "\n"
		     "# HELP kvd_http_completion_tokens_total tokens generated for HTTP clients\n"
		     "# TYPE kvd_http_completion_tokens_total counter\nkvd_http_completion_tokens_total %" PRIuFAST64 "\n",
		     atomic_load(&s->generations[HTTP_EP_CHAT]), atomic_load(&s->generations[HTTP_EP_COMPLETIONS]),
		     atomic_load(&s->active_generations), atomic_load(&s->disconnects), atomic_load(&s->prompt_tokens),
		     atomic_load(&s->cached_tokens), atomic_load(&s->completion_tokens));
	if (x < 0) {
		free(b);
		return MHD_NO;
	}
	enum MHD_Result q = send_body(con, s, 200, "text/plain; version=0.0.4; charset=utf-8", b, len);
	free(b);
	return q;
}

/* ---- request dispatch -------------------------------------------------------------------- */

static enum route route_of(const char *url, bool *ret_post)
{
	*ret_post = false;
	if (!strcmp(url, "/v1/chat/completions")) {
		*ret_post = true;
		return ROUTE_CHAT;
	}
	if (!strcmp(url, "/v1/completions")) {
		*ret_post = true;
		return ROUTE_COMPLETIONS;
	}
	if (!strcmp(url, "/v1/models"))
		return ROUTE_MODELS;
	if (!strncmp(url, "/v1/models/", 11) && url[11])
		return ROUTE_MODEL;
	if (!strcmp(url, "/health"))
		return ROUTE_HEALTH;
	if (!strcmp(url, "/metrics"))
		return ROUTE_METRICS;
	return ROUTE_NONE;
}

/* Constant-time comparison of the Authorization header with the key. */
static bool key_ok(const struct http_server *s, struct MHD_Connection *con)
{
	if (!s->api_key_len)
		return true;
	const char *h = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncmp(h, "Bearer ", 7) != 0)
		return false;
	h += 7;
	size_t n = strlen(h);
	unsigned char diff = n != s->api_key_len;
	for (size_t i = 0; i < s->api_key_len; i++)
		diff |= (unsigned char)(s->api_key[i] ^ (i < n ? h[i] : 0));
	return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *con, const char *url, const char *method,
				  const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	struct http_server *s = cls;
	struct conn *c = *con_cls;
	struct http_error e;
	(void)version;

	if (!c) {
		/* the headers are in: decide what can be decided before the body */
		c = calloc(1, sizeof(*c));
		if (!c)
			return MHD_NO;
		c->s = s;
		c->sock = -1;
		*con_cls = c;
		bool post;
		c->route = route_of(url, &post);
		if (c->route == ROUTE_NONE) {
			http_fail(&e, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %.16s %.200s",
				  method, url);
			return send_error(con, s, &e);
		}
		if (strcmp(method, post ? "POST" : "GET") != 0) {
			http_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
				  "%.200s accepts %s only", url, post ? "POST" : "GET");
			return send_error(con, s, &e);
		}
		if (c->route != ROUTE_HEALTH && !key_ok(s, con)) {
			http_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
				  "Incorrect or missing API key: send \"Authorization: Bearer KEY\"");
			return send_error(con, s, &e);
		}
		const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (post && cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
			http_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
				  "the request body is larger than %u bytes (max_body_bytes)", s->cfg.max_body_bytes);
			return send_error(con, s, &e);
		}
		return MHD_YES;
	}
	if (*upload_data_size) {
		size_t n = *upload_data_size;
		*upload_data_size = 0;
		if (c->body_too_large || c->body_len + n > s->cfg.max_body_bytes) {
			/* a chunked body outgrew the limit: libmicrohttpd answers
			 * only once the upload ended, so the rest is read and
			 * dropped, up to as much again; beyond that the
			 * connection is closed without an answer */
			c->body_too_large = true;
			c->body_dropped += n;
			return c->body_dropped > s->cfg.max_body_bytes ? MHD_NO : MHD_YES;
		}
		char *p = realloc(c->body, c->body_len + n + 1);
		if (!p)
			return MHD_NO;
		memcpy(p + c->body_len, upload_data, n);
		c->body = p;
		c->body_len += n;
		return MHD_YES;
	}
	if (c->body_too_large) {
		http_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
			  "the request body is larger than %u bytes (max_body_bytes)", s->cfg.max_body_bytes);
		return send_error(con, s, &e);
	}
	switch (c->route) {
	case ROUTE_CHAT:
	case ROUTE_COMPLETIONS:
		return generate(con, c);
	case ROUTE_MODELS:
	case ROUTE_MODEL:
		return models(con, c, url);
	case ROUTE_HEALTH:
		return health(con, c);
	case ROUTE_METRICS:
		return metrics(con, c);
	default:
		return MHD_NO;
	}
}

/* The connection's request is over (answered, failed, or the client left). */
static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct http_server *s = cls;
	struct conn *c = *con_cls;
	(void)con;
	(void)toe;

	if (!c)
		return;
	*con_cls = NULL;
	if (c->kr && !c->kr_done) {
		/* the HTTP client left (or the server stops) mid-generation:
		 * cancel, and drop the kvd connection so the daemon frees
		 * the request's pages at once */
		atomic_fetch_add(&s->disconnects, 1);
		c->kr = kvc_request_finish(c->kr);
		c->kc = kvc_close(c->kc);
	}
	c->kr = kvc_request_finish(c->kr);
	kvd_put(s, c->kc);
	if (c->counted_active)
		atomic_fetch_sub(&s->active_generations, 1);
	choices_free(c);
	http_gen_req_clear(&c->req);
	free(c->body);
	free(c->out);
	free(c);
}

static int read_key(struct http_server *s)
{
	FILE *f = fopen(s->cfg.api_key_file, "re");
	if (!f)
		return -errno;
	size_t n = fread(s->api_key, 1, sizeof(s->api_key), f);
	int err = ferror(f) ? -EIO : 0;
	fclose(f);
	if (err)
		return err;
	while (n && (s->api_key[n - 1] == '\n' || s->api_key[n - 1] == '\r' || s->api_key[n - 1] == ' '))
		n--;
	if (n == 0 || n > HTTP_MAX_API_KEY)
		return -EINVAL;
	s->api_key[n] = '\0';
	s->api_key_len = n;
	return 0;
}

int http_server_start(const struct http_config *cfg, int listen_fd, struct http_server **ret)
{
	struct http_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->started = (long)time(NULL);
	pthread_mutex_init(&s->lock, NULL);
	snprintf(s->model, sizeof(s->model), "%s", cfg->model_id);
	if (cfg->api_key_file[0]) {
		int r = read_key(s);
		if (r < 0) {
			pthread_mutex_destroy(&s->lock);
			free(s);
			return r;
		}
	}
	s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
					  MHD_USE_ITC,
				  0, NULL, NULL, on_request, s,
				  MHD_OPTION_LISTEN_SOCKET, listen_fd,
				  MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
				  MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->client_timeout_s,
				  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)cfg->max_header_bytes,
				  MHD_OPTION_THREAD_STACK_SIZE, (size_t)HTTP_THREAD_STACK,
				  MHD_OPTION_END);
	if (!s->mhd) {
		log_msg(3, "the HTTP server did not start");
		pthread_mutex_destroy(&s->lock);
		free(s);
		return -EIO;
	}
	*ret = s;
	return 0;
}

struct http_server *http_server_stop(struct http_server *s)
{
	if (!s)
		return NULL;
	int fd = MHD_quiesce_daemon(s->mhd);
	MHD_stop_daemon(s->mhd);
	if (fd >= 0)
		close(fd);
	for (size_t i = 0; i < s->n_pool; i++)
		kvc_close(s->pool[i]);
	pthread_mutex_destroy(&s->lock);
	free(s);
	return NULL;
}
