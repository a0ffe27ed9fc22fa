/*
 * client/http/routes.c — kvd-http's route table and request dispatch.
 *
 * One row per route (path, method, whether it needs the API key, handler,
 * help line) drives everything a path decides: which handler answers, the
 * 404 for a path no row has, the 405 with an Allow header listing the
 * methods the rows of that path accept, which routes skip the key check
 * (/health, for probes), and the route list of --help. Adding an endpoint
 * is adding a row.
 *
 * libmicrohttpd calls http_on_request() several times per request: once
 * with the headers (route, method, key and Content-Length are decided
 * there, before any body is read), once per piece of body, and once more
 * when the body is complete, when the route's handler answers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "kvclient.h"
#include "server.h"
#include "server_impl.h"

#define HTTP_ALLOW_BYTES 64 /* the Allow header's value: the methods of one path */

static const struct route routes[] = {
	{ .path = "/v1/chat/completions", .method = "POST", .auth = true, .endpoint = HTTP_EP_CHAT,
	  .handler = generate,
	  .help = "a conversation: system (or developer), user\n"
		  "and assistant turns, the last one a user\n"
		  "(or tool) message, rendered by kvd with the\n"
		  "model's chat template (earlier turns come\n"
		  "from kvd's prefix cache); tools" },
	{ .path = "/v1/completions", .method = "POST", .auth = true, .endpoint = HTTP_EP_COMPLETIONS,
	  .handler = generate, .help = "a raw prompt" },
	{ .path = "/v1/models", .method = "GET", .auth = true, .handler = models, .help = "the served model" },
	{ .path = "/v1/models/", .prefix = true, .method = "GET", .auth = true, .handler = models,
	  .help = "one model by its id (404 for another)" },
	{ .path = "/health", .method = "GET", .auth = false, .handler = health,
	  .help = "200 when kvd answers (needs no API key)" },
	{ .path = "/metrics", .method = "GET", .auth = true, .handler = metrics,
	  .help = "counters, Prometheus text" },
};
#define N_ROUTES (sizeof(routes) / sizeof(routes[0]))

static bool path_matches(const struct route *r, const char *url)
{
	if (!r->prefix)
		return strcmp(url, r->path) == 0;
	size_t n = strlen(r->path);
	return strncmp(url, r->path, n) == 0 && url[n] != '\0';
}

/* The row for url and method; NULL when none, with allow set to the
 * methods url's rows accept ("" when no row has url: a 404). */
static const struct route *route_find(const char *url, const char *method, char allow[HTTP_ALLOW_BYTES])
{
	allow[0] = '\0';
	for (size_t i = 0; i < N_ROUTES; i++) {
		if (!path_matches(&routes[i], url))
			continue;
		if (!strcmp(method, routes[i].method))
			return &routes[i];
		size_t n = strlen(allow);
		snprintf(allow + n, HTTP_ALLOW_BYTES - n, "%s%s", n ? ", " : "", routes[i].method);
	}
	return NULL;
}

void http_routes_help(FILE *f)
{
	for (size_t i = 0; i < N_ROUTES; i++) {
		const char *h = routes[i].help;
		char path[40];

		snprintf(path, sizeof(path), "%s%s", routes[i].path, routes[i].prefix ? "ID" : "");
		fprintf(f, "    %-4s %-26s ", routes[i].method, path);
		for (; *h; h++) {
			fputc(*h, f);
			if (*h == '\n')
				fprintf(f, "%36s", "");
		}
		fputc('\n', f);
	}
}

/* A 405: the error object and the Allow header. */
static enum MHD_Result method_not_allowed(struct MHD_Connection *con, struct http_server *s, const char *url,
					  const char *allow)
{
	struct http_error e;

	http_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.200s accepts %s only", url, allow);
	char *json = http_error_json(&e);
	if (!json)
		return send_json(con, s, 405, NULL);
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(json);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	enum MHD_Result x = MHD_queue_response(con, 405, r);
	MHD_destroy_response(r);
	count_status(s, 405);
	return x;
}

/* Which API key the Authorization header carries: its index, -1 when no key
 * is configured, -2 when it matches none. Every key is compared in full,
 * in time that does not depend on which one (if any) matches. */
static int key_match(const struct http_server *s, struct MHD_Connection *con)
{
	int found = -2;

	if (!s->n_api_keys)
		return -1;
	const char *h = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncmp(h, "Bearer ", 7) != 0)
		return -2;
	h += 7;
	size_t n = strlen(h);
	for (size_t k = 0; k < s->n_api_keys; k++) {
		unsigned char diff = n != s->api_key_len[k];
		for (size_t i = 0; i < s->api_key_len[k]; i++)
			diff |= (unsigned char)(s->api_keys[k][i] ^ (i < n ? h[i] : 0));
		found = diff == 0 ? (int)k : found;
	}
	return found;
}

/* The headers are in: route, method, key and declared length are decided
 * before any body is read. MHD_YES to read the body. */
static enum MHD_Result on_headers(struct http_server *s, struct MHD_Connection *con, struct conn *c,
				  const char *url, const char *method)
{
	struct http_error e;
	char allow[HTTP_ALLOW_BYTES];

	c->route = route_find(url, method, allow);
	if (!c->route && !allow[0]) {
		http_fail(&e, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %.16s %.200s",
			  method, url);
		return send_error(con, s, &e);
	}
	if (!c->route)
		return method_not_allowed(con, s, url, allow);
	c->key_index = key_match(s, con);
	if (c->route->auth && c->key_index == -2) {
		http_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
			  "Incorrect or missing API key: send \"Authorization: Bearer KEY\"");
		return send_error(con, s, &e);
	}
	const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (!strcmp(method, "POST") && cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
		http_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
			  "the request body is larger than %u bytes (max_body_bytes)", s->cfg.max_body_bytes);
		return send_error(con, s, &e);
	}
	return MHD_YES;
}

enum MHD_Result http_on_request(void *cls, struct MHD_Connection *con, const char *url, const char *method,
				const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	struct http_server *s = cls;
	struct conn *c = *con_cls;
	struct http_error e;
	(void)version;

	if (!c) {
		c = calloc(1, sizeof(*c));
		if (!c)
			return MHD_NO;
		c->s = s;
		c->sock = -1;
		*con_cls = c;
		return on_headers(s, con, c, url, method);
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
	if (!c->route)
		return MHD_NO; /* answered (404, 405, 401, 413) with the headers */
	track_mark(s, con, true);
	return c->route->handler(con, c, url);
}
