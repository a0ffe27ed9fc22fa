/*
 * client/http/server_impl.h — what server.c (the HTTP server, the pool of
 * kvd connections, the single-choice answer) shares with choices.c (answers
 * with several choices or log-probabilities). Private to client/http/.
 */
#ifndef KVD_HTTP_SERVER_IMPL_H
#define KVD_HTTP_SERVER_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include <microhttpd.h>

#include "http.h"

#define HTTP_POLL_MS          100   /* longest wait for kvd before looking at the HTTP client again */
#define HTTP_START_TIMEOUT_MS 30000 /* sending a request (and a large prompt) to kvd */
#define HTTP_CTL_TIMEOUT_MS   5000  /* stats / ping for /metrics and /health */
#define HTTP_KVD_POOL_MAX     64    /* idle kvd connections kept */
#define HTTP_THREAD_STACK     (512u << 10)

enum route {
	ROUTE_NONE = 0,
	ROUTE_CHAT,
	ROUTE_COMPLETIONS,
	ROUTE_MODELS,
	ROUTE_MODEL,
	ROUTE_HEALTH,
	ROUTE_METRICS,
};

/* status codes counted for /metrics */
static const int counted_status[] = { 200, 400, 401, 404, 405, 413, 429, 500, 503 };
#define N_STATUS (sizeof(counted_status) / sizeof(counted_status[0]))

struct http_server {
	struct http_config cfg;
	struct MHD_Daemon *mhd;
	char api_key[HTTP_MAX_API_KEY + 1];
	size_t api_key_len;
	long started;

	pthread_mutex_t lock; /* guards pool, n_pool, model */
	kvc_client *pool[HTTP_KVD_POOL_MAX];
	size_t n_pool;
	char model[HTTP_MAX_MODEL_ID];
	uint32_t n_ctx;       /* kvd's context window, tokens (0 until known) */

	atomic_uint_fast64_t responses[N_STATUS + 1]; /* last: other codes */
	atomic_uint_fast64_t generations[3];          /* by endpoint */
	atomic_uint_fast64_t active_generations;
	atomic_uint_fast64_t disconnects;             /* generations cancelled by a client leaving */
	atomic_uint_fast64_t prompt_tokens, cached_tokens, completion_tokens;
	atomic_uint_fast64_t id_counter;
};

struct conn {
	struct http_server *s;
	enum route route;
	bool authorized;
	char *body;
	size_t body_len;
	bool body_too_large;
	size_t body_dropped;

	/* a generation */
	struct http_gen_req req;
	kvc_client *kc;
	kvc_request *kr;
	bool kr_done;       /* kvd ended the request (any way) */
	int sock;           /* the HTTP client's socket */
	char id[48];
	long created;
	char model[HTTP_MAX_MODEL_ID];
	bool counted_active;
	int64_t last_check_ms; /* when the HTTP socket was last looked at */

	/* bytes waiting to be sent (stream) or the collected text (non-stream) */
	char *out;
	size_t out_len, out_off, out_cap;
	bool stream_ended;  /* the last bytes ([DONE]) are in out */
	struct http_choices *ch; /* several choices or log-probabilities (choices.c); NULL: one plain choice */
};

struct http_choices;

/* ---- server.c ---- */
int out_append(struct conn *c, const char *s, size_t n);
/* Append s (malloc'd, n bytes; NULL: out of memory) and free it. */
int out_take(struct conn *c, char *s, size_t n);
void count_status(struct http_server *s, int status);
/* Answer with json (malloc'd, freed here; NULL: a 500). */
enum MHD_Result send_json(struct MHD_Connection *con, struct http_server *s, int status, char *json);
void map_kvd_error(int code, const char *msg, struct http_error *e);
void add_usage(struct conn *c, const struct kvc_result *res, struct http_usage *u);
/* The request's next event: 1 with *ret_ev, 0 at its end (*ret_code), -ECONNABORTED
 * when the HTTP client left. */
int next_event(struct conn *c, const struct kvc_event **ret_ev, int *ret_code);
void ended_error(struct conn *c, int code, struct http_error *e);

/* ---- choices.c ---- */
/* The request wants the choices path: n > 1 or log-probabilities. */
bool choices_wanted(const struct http_gen_req *q);
/* Set up conn's per-choice state (0, -ENOMEM). */
int choices_init(struct conn *c);
void choices_free(struct conn *c);
/* Streaming: the chat role chunks of every choice; one event's chunk; the
 * closing chunks (per-choice finish, usage, [DONE]) of a request ended with
 * code 0. Each appends to c->out: 0 or -ENOMEM. */
int choices_stream_open(struct conn *c);
int choices_stream_event(struct conn *c, const struct kvc_event *ev);
int choices_stream_finish(struct conn *c);
/* Non-streaming: file an event; the whole response (malloc'd JSON, NULL:
 * out of memory) once the request ended normally. */
int choices_collect(struct conn *c, const struct kvc_event *ev);
char *choices_response(struct conn *c);

#endif
