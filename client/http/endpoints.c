/*
 * client/http/endpoints.c — kvd-http's endpoints other than generation:
 * GET /v1/models and /v1/models/ID, /health (a ping to kvd through the
 * pool, retried once on a fresh connection) and /metrics (kvd's STATS
 * rendered from the one counter list, kvc_metrics.h, plus the gateway's
 * own kvd_http_* families).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "kvclient.h"
#include "kvc_metrics.h"
#include "server.h"
#include "server_impl.h"

enum MHD_Result models(struct MHD_Connection *con, struct conn *c, const char *url)
{
	struct http_model_names names;
	const char *m = names.names[0];
	struct http_error e;

	served_model_names(c->s, &names);
	if (!m[0]) {
		map_kvd_error(-ECONNREFUSED, "cannot connect to kvd", &e);
		return send_error(con, c->s, &e);
	}
	pthread_mutex_lock(&c->s->lock);
	json_int_t n_ctx = c->s->n_ctx;
	pthread_mutex_unlock(&c->s->lock);
	/* max_model_len: the context window, as vLLM names it */
	/* aliases: the other names a request may give (kvd's own field, beside OpenAI's) */
	json_t *aliases = json_array();
	for (size_t i = 1; aliases && i < HTTP_MODEL_N_NAMES; i++)
		if (names.names[i][0])
			json_array_append_new(aliases, json_string(names.names[i]));
	json_t *model = json_pack("{s:s, s:s, s:I, s:s, s:I, s:o}", "id", m, "object", "model", "created",
				  (json_int_t)c->s->started, "owned_by", "kvd", "max_model_len", n_ctx, "aliases",
				  aliases);
	if (c->route->prefix) {
		const char *want = url + strlen("/v1/models/");
		if (!model_name_accepted(&names, want)) {
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

/* A control call (fn on a lane's client); a failure on a pooled
 * connection is retried once on a fresh one. */
static int control(struct http_server *s, int (*fn)(kvc_client *, void *), void *arg)
{
	uint64_t min_serial = 0;
	int r = 0;
	for (int attempt = 0; attempt < 2; attempt++) {
		struct lane *l;
		uint32_t w = 0;
		r = pool_acquire(s, &w, min_serial, -1, &l);
		if (r < 0)
			return r;
		r = fn(lane_lock(l, HTTP_CTL_TIMEOUT_MS), arg);
		lane_unlock(l);
		pool_release(s, l, 0, r < 0);
		if (r == 0)
			break;
		min_serial = pool_serial(s);
	}
	return r;
}

static int do_ping(kvc_client *kc, void *arg)
{
	(void)arg;
	return kvc_ping(kc, NULL);
}

enum MHD_Result health(struct MHD_Connection *con, struct conn *c, const char *url)
{
	char buf[512];
	int r = control(c->s, do_ping, NULL);
	if (r == 0)
		return send_body(con, c->s, 200, "application/json", "{\"status\":\"ok\"}", 15);
	json_t *o = json_pack("{s:s, s:s}", "status", "unavailable", "error", kv_strerror(r));
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	snprintf(buf, sizeof(buf), "%s", s ? s : "{\"status\":\"unavailable\"}");
	free(s);
	return send_body(con, c->s, 503, "application/json", buf, strlen(buf));
}

/* What /metrics reads from kvd, on one lane's connection. */
struct kvd_scrape {
	struct kvc_stats st;
	struct kvc_histograms h;
	bool have_h;                  /* false from a daemon older than the histograms */
	struct kvc_info info;
};

static int do_scrape(kvc_client *kc, void *arg)
{
	struct kvd_scrape *sc = arg;
	int r = kvc_stats(kc, &sc->st);
	if (r < 0)
		return r;
	r = kvc_histograms(kc, &sc->h);
	if (r < 0 && r != -EOPNOTSUPP)
		return r;
	sc->have_h = r == 0;
	sc->info = *kvc_server_info(kc);
	return 0;
}

/* kvd's families, rendered from client/kvc_metrics.h exactly as kvctl stats
 * --prometheus renders them; a malloc'd string, or NULL without memory. */
static char *render_kvd_metrics(const struct kvd_scrape *sc)
{
	char *text = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&text, &n);
	if (!f)
		return NULL;
	kvc_metrics_prometheus(f, &sc->st, sc->have_h ? &sc->h : NULL, &sc->info);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

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

enum MHD_Result metrics(struct MHD_Connection *con, struct conn *c, const char *url)
{
	struct http_server *s = c->s;
	char *b = NULL;
	size_t len = 0, cap = 0;
	struct kvd_scrape sc;
	int r = control(s, do_scrape, &sc);
	int x = 0;

	x |= mprintf(&b, &len, &cap, "# HELP kvd_up 1 when kvd answered the statistics query\n# TYPE kvd_up gauge\n"
		     "kvd_up %d\n", r == 0);
	if (r == 0) {
		char *kvd = render_kvd_metrics(&sc);
		x |= kvd ? mprintf(&b, &len, &cap, "%s", kvd) : -ENOMEM;
		free(kvd);
	}
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
		     "# HELP kvd_http_request_timeouts_total connections closed because a request's headers and body took longer than request_timeout\n"
		     "# TYPE kvd_http_request_timeouts_total counter\nkvd_http_request_timeouts_total %" PRIuFAST64 "\n"
		     "# HELP kvd_http_unread_streams_total streams cut because the client read nothing for client_timeout\n"
		     "# TYPE kvd_http_unread_streams_total counter\nkvd_http_unread_streams_total %" PRIuFAST64 "\n"
		     "# HELP kvd_http_prompt_tokens_total prompt tokens of finished generations\n"
		     "# TYPE kvd_http_prompt_tokens_total counter\nkvd_http_prompt_tokens_total %" PRIuFAST64 "\n"
		     "# HELP kvd_http_cached_tokens_total of those, reused from kvd's prefix cache\n"
		     "# TYPE kvd_http_cached_tokens_total counter\nkvd_http_cached_tokens_total %" PRIuFAST64 "\n"
		     "# HELP kvd_http_completion_tokens_total tokens generated for HTTP clients\n"
		     "# TYPE kvd_http_completion_tokens_total counter\nkvd_http_completion_tokens_total %" PRIuFAST64 "\n",
		     atomic_load(&s->generations[HTTP_EP_CHAT]), atomic_load(&s->generations[HTTP_EP_COMPLETIONS]),
		     atomic_load(&s->active_generations), atomic_load(&s->disconnects), atomic_load(&s->request_timeouts),
		     atomic_load(&s->unread_streams), atomic_load(&s->prompt_tokens),
		     atomic_load(&s->cached_tokens), atomic_load(&s->completion_tokens));
	if (x < 0) {
		free(b);
		return MHD_NO;
	}
	enum MHD_Result q = send_body(con, s, 200, "text/plain; version=0.0.4; charset=utf-8", b, len);
	free(b);
	return q;
}

