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
#define HTTP_WATCHDOG_MS      200   /* how often request deadlines are looked at */
#define HTTP_PUMP_MS          10    /* longest wait of a lane's pumper before it hands out others' events */
#define HTTP_CANCEL_WAIT_MS   2000  /* waiting for kvd to confirm a cancelled request */
#define HTTP_STREAM_SNDBUF    (16u << 10) /* a stream's socket buffer (the kernel doubles it): a client
					     * that stops reading is noticed after this much */
#define HTTP_THREAD_STACK     (512u << 10)

/* A row of the route table (routes.c): what a path and method lead to. */
struct conn;
typedef enum MHD_Result (*route_fn)(struct MHD_Connection *con, struct conn *c, const char *url);
struct route {
	const char *path;   /* the exact path, or its beginning when prefix */
	bool prefix;        /* path followed by at least one more byte (/v1/models/ID) */
	const char *method; /* "GET" or "POST" */
	bool auth;          /* needs an API key when api_key_file is set */
	int endpoint;       /* generation routes: enum http_endpoint; else 0 */
	route_fn handler;   /* answers once the whole body is in */
	const char *help;   /* --help's description; '\n' starts a continuation line */
};

/* status codes counted for /metrics */
static const int counted_status[] = { 200, 400, 401, 404, 405, 413, 429, 500, 503 };
#define N_STATUS (sizeof(counted_status) / sizeof(counted_status[0]))

struct http_server {
	struct http_config cfg;
	struct MHD_Daemon *mhd;
	char api_keys[HTTP_MAX_API_KEYS][HTTP_MAX_API_KEY + 1]; /* api_key_file's, one a line */
	size_t api_key_len[HTTP_MAX_API_KEYS];
	size_t n_api_keys;
	long started;

	pthread_mutex_t lock; /* guards the lanes and queue below, the model's names, n_ctx */
	pthread_cond_t slot_cv; /* a lane slot was freed (or a connect ended) */
	struct lane *lanes[HTTP_MAX_KVD_CONNECTIONS];
	size_t n_lanes;
	uint32_t n_connecting;
	uint32_t n_queued;    /* requests waiting for a lane slot */
	uint64_t next_serial;
	char model[HTTP_MAX_MODEL_ID];      /* the id served: model_id, else kvd's model id */
	char model_name[HTTP_MAX_MODEL_ID]; /* the model's general.name, as kvd reports it */
	char model_file[HTTP_MAX_MODEL_ID]; /* kvd's model id (the file's base name); "" from kvd < 0.8.0 */
	uint32_t n_ctx;       /* kvd's context window, tokens (0 until known) */

	/* request deadlines: every connection, watched by one thread */
	pthread_mutex_t track_lock;
	pthread_cond_t track_cv;  /* stop the watchdog */
	struct track *tracks;
	bool stopping;
	bool watchdog_running;
	pthread_t watchdog;
	atomic_uint_fast64_t request_timeouts;        /* connections cut by request_timeout */
	atomic_uint_fast64_t unread_streams;          /* streams cut: the client stopped reading */

	atomic_uint_fast64_t responses[N_STATUS + 1]; /* last: other codes */
	atomic_uint_fast64_t generations[3];          /* by endpoint */
	atomic_uint_fast64_t active_generations;
	atomic_uint_fast64_t disconnects;             /* generations cancelled by a client leaving */
	atomic_uint_fast64_t prompt_tokens, cached_tokens, completion_tokens;
	atomic_uint_fast64_t id_counter;
};

/* One HTTP connection, for request_timeout (under track_lock). */
struct track {
	struct track *next, *prev;
	int fd;
	int64_t since_ms;   /* the connection's start, or its last answer's end */
	bool answering;     /* the request is in: no deadline until answered */
	bool cut;
};

/* A request on a lane: its mailbox (pool.c). */
struct lane_req {
	struct lane_req *next, *prev;
	kvc_request *kr;
	bool want, has, ended;
	int rc;                     /* what kvc_request_next() returned */
	const struct kvc_event *ev; /* with rc 1 */
	char msg[256];              /* kvd's message when the start failed */
};

struct lane;

struct conn {
	struct http_server *s;
	const struct route *route; /* its row of the route table */
	bool authorized;
	char *body;
	size_t body_len;
	bool body_too_large;
	size_t body_dropped;

	/* a generation */
	struct http_gen_req req;
	int key_index;      /* the API key it came with (0 .. n_api_keys - 1), -1 without keys */
	char tenant[KVC_MAX_TENANT_BYTES + 1]; /* its kvd cache tenant ("" none): key and cache_salt */
	struct lane *lane;  /* the kvd connection carrying it (pool.c) */
	uint32_t weight;    /* its slots there: kvd's count (samples) */
	struct lane_req lr; /* its request on the lane */
	kvc_request *kr;    /* lr.kr */
	bool kr_done;       /* kvd ended the request (any way) */
	int sock;           /* the HTTP client's socket */
	char id[48];
	long created;
	char model[HTTP_MAX_MODEL_ID];
	bool counted_active;
	int64_t last_check_ms; /* when the HTTP socket was last looked at */
	bool streaming;     /* the stream's 200 is queued: watch the client read it */
	uint64_t acked;     /* the stream's bytes the client's TCP has acknowledged */
	int64_t stuck_since_ms; /* since when bytes wait unacknowledged (0: none wait) */

	/* bytes waiting to be sent (stream) or the collected text (non-stream) */
	char *out;
	size_t out_len, out_off, out_cap;
	bool stream_ended;  /* the last bytes ([DONE]) are in out */
	struct http_choices *ch; /* several choices or log-probabilities (choices.c); NULL: one plain choice */
	char *tool_text;    /* a stream with tools: its text so far (toolcall.c) */
	size_t tool_len;
	size_t tool_sent;   /* of which sent: as content (auto), as the call's arguments (forced) */
	bool tool_seen;     /* auto: a <tool_call> began; forced: not a call's shape. Held to the end */
	bool call_open;     /* forced: the call's first delta is sent */
	char tool_call_id[40]; /* its id */
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
/* Answer with len bytes of body (copied) of the given content type. */
enum MHD_Result send_body(struct MHD_Connection *con, struct http_server *s, int status, const char *type,
			  const char *body, size_t len);
enum MHD_Result send_error(struct MHD_Connection *con, struct http_server *s, const struct http_error *e);
/* The model id served (the configured model_id, else the model id kvd reports (the model
 * file's base name without ".gguf"), else, from kvd older than 0.8.0, the model's general.name;
 * "" when kvd cannot be reached). */
void served_model(struct http_server *s, char out[HTTP_MAX_MODEL_ID]);

/* The names a request's "model" may give: the id served, then its aliases (general.name and the
 * model file's base name, "" when unknown or the same as an earlier one). */
#define HTTP_MODEL_N_NAMES 3
struct http_model_names {
	char names[HTTP_MODEL_N_NAMES][HTTP_MAX_MODEL_ID]; /* [0]: the id, "" when kvd cannot be reached */
};
void served_model_names(struct http_server *s, struct http_model_names *ret);
/* Whether want is one of n's names (exact, case-sensitive). */
bool model_name_accepted(const struct http_model_names *n, const char *want);
void add_usage(struct conn *c, const struct kvc_result *res, struct http_usage *u);
/* The request's next event: 1 with *ret_ev, 0 at its end (*ret_code), -ECONNABORTED
 * when the HTTP client left. */
int next_event(struct conn *c, const struct kvc_event **ret_ev, int *ret_code);
void ended_error(struct conn *c, int code, struct http_error *e);

/* Generation: POST /v1/chat/completions and /v1/completions. */
enum MHD_Result generate(struct MHD_Connection *con, struct conn *c, const char *url);
/* The request is in (answering: its deadline stops) or answered (its clock restarts). */
void track_mark(struct http_server *s, struct MHD_Connection *con, bool answering);

/* ---- routes.c: the route table and dispatch ---- */
/* libmicrohttpd's access handler (cls: the server). */
enum MHD_Result http_on_request(void *cls, struct MHD_Connection *con, const char *url, const char *method,
				const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls);

/* ---- endpoints.c: /v1/models, /health, /metrics ---- */
enum MHD_Result models(struct MHD_Connection *con, struct conn *c, const char *url);
enum MHD_Result health(struct MHD_Connection *con, struct conn *c, const char *url);
enum MHD_Result metrics(struct MHD_Connection *con, struct conn *c, const char *url);

/* Has the HTTP client on fd hung up? */
bool client_gone(int fd);

/* ---- pool.c: kvd connections shared by HTTP requests ---- */
/* A connection-level error (the lane is unusable; one retry on a fresh one). */
bool kvd_conn_error(int code);
/* The serial the next new connection gets: pass it as min_serial to insist
 * on a connection made after now. */
uint64_t pool_serial(struct http_server *s);
/* A slot of *weight requests on a lane of serial >= min_serial (weight 0: a
 * control call, never queued). Waits in the queue while every lane is full
 * (watching the HTTP client on sock, unless -1). *weight may shrink to
 * kvd's per-connection limit. 0 and *ret; -EBUSY when the queue is full
 * (max_queued); -ECONNABORTED when the HTTP client left; kvc_connect()'s
 * errors. */
int pool_acquire(struct http_server *s, uint32_t *weight, uint64_t min_serial, int sock, struct lane **ret);
/* Give the slot back; broken: the connection failed (drop it, and every
 * other one nobody uses). */
void pool_release(struct http_server *s, struct lane *l, uint32_t weight, bool broken);
/* Close every lane (the server stops; no request left). */
void pool_close(struct http_server *s);
/* The lane's client for a control call (timeout_ms set) until lane_unlock. */
kvc_client *lane_lock(struct lane *l, int timeout_ms);
void lane_unlock(struct lane *l);
/* Start a request on the lane (as kvc_request_start); lr->msg gets kvd's
 * message on failure. */
int lane_start(struct lane *l, const char *prompt, size_t len, const struct kvc_gen_params *p, struct lane_req *lr);
/* Its next event within wait_ms: 1 and *ret_ev (valid until the next
 * call); -EAGAIN when none came; otherwise the request ended with that code
 * (kvc_request_next's: 0, -ECANCELED, an error), as again on later calls. */
int lane_next(struct lane *l, struct lane_req *lr, int wait_ms, const struct kvc_event **ret_ev);
/* kvc_request_result() once ended, else NULL. */
const struct kvc_result *lane_result(struct lane_req *lr);
/* Release the request; one still running is cancelled and kvd's
 * confirmation awaited (wait_ms at most). Returns true when the lane
 * should be dropped. */
bool lane_end(struct lane *l, struct lane_req *lr, int wait_ms);

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

/* ---- toolcall.c: the text of a request with tools read back as calls ---- */
/* The non-streamed response once the request ended normally: tool_calls
 * when the text (c->out) holds any, else plain content (malloc'd JSON;
 * NULL: out of memory). */
char *tools_response(struct conn *c, const struct kvc_result *res);
/* Streaming: one event's text (auto: sent as content up to where a
 * <tool_call> may begin; forced: held); at the end (code 0) the rest of
 * the content, the calls' deltas, the finish and usage chunks. 0 or
 * -ENOMEM. */
int tools_stream_event(struct conn *c, const struct kvc_event *ev);
int tools_stream_finish(struct conn *c, const struct kvc_result *res);

#endif
