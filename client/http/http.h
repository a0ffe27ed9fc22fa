/*
 * client/http/http.h — kvd-http's internal interface, shared by its files.
 *
 * kvd-http is the OpenAI-compatible HTTP gateway of kvd. It is a client of
 * the daemon like any other program: it reaches kvd only through
 * libkvclient (kvclient.h). Its parts:
 *
 *   request.c  turns an untrusted JSON body into a checked generation
 *              request (jansson does all parsing) and builds the JSON of
 *              responses, stream chunks and OpenAI error objects; it knows
 *              nothing of HTTP or of kvd, so a fuzz target can drive it alone;
 *   structured.c  its structured-output and tool fields (constraints, the tool
 *              turns kvd renders, the generic format), likewise free of HTTP and kvd;
 *   routes.c   the route table and dispatch;
 *   toolcall.c a model's text read back as tool calls (and their stream);
 *   config.c   configuration file ([http] keys) and command line;
 *   server.c   the HTTP server (libmicrohttpd, one thread per connection),
 *              request deadlines, and the bridge to kvd;
 *   pool.c     the few kvd connections (kvc_client) every request shares;
 *   main.c     start-up: listening socket or socket activation, signals.
 */
#ifndef KVD_HTTP_H
#define KVD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kvclient.h"

/* ---- limits (named; the configurable ones have defaults here) ---------------- */

#define HTTP_DEFAULT_LISTEN          "127.0.0.1:8484"
#define HTTP_DEFAULT_MAX_BODY        (1u << 20)  /* bytes of a request body */
#define HTTP_DEFAULT_MAX_HEADER      (32u << 10) /* bytes of request line + headers */
#define HTTP_DEFAULT_MAX_CONNECTIONS 256
#define HTTP_DEFAULT_MAX_PER_IP      0           /* 0: no per-address bound */
#define HTTP_DEFAULT_CLIENT_TIMEOUT  60          /* s without progress on a connection */
#define HTTP_DEFAULT_MAX_TOKENS      256         /* when a request names none */
#define HTTP_DEFAULT_KVD_CONNECTIONS 4           /* kvd connections carrying every request */
#define HTTP_MAX_KVD_CONNECTIONS     64
#define HTTP_DEFAULT_MAX_QUEUED      256         /* requests waiting for room on them */
#define HTTP_DEFAULT_REQUEST_TIMEOUT 30          /* s to receive a request's headers and body */
#define HTTP_MAX_STOP                8           /* stop strings per request (kvd's bound) */
#define HTTP_MAX_STOP_BYTES          256         /* bytes of one stop string (kvd's bound) */
#define HTTP_MAX_MESSAGES            KVC_MAX_CHAT_MSGS /* entries of a messages array */
#define HTTP_MAX_MODEL_ID            128         /* bytes of a model name */
#define HTTP_MAX_JSON_DEPTH          32          /* nesting of a request body */
#define HTTP_MAX_API_KEY             512         /* bytes of one API key */
#define HTTP_MAX_API_KEYS            64          /* keys in the API key file */
#define HTTP_MAX_CACHE_SALT          48          /* bytes of a request's cache_salt */
#define HTTP_MAX_N                   KVC_MAX_SAMPLES      /* choices of one request ('n') */
#define HTTP_MAX_TOP_LOGPROBS        KVC_MAX_TOP_LOGPROBS /* 'top_logprobs' (chat), 'logprobs' (completions) */
#define HTTP_MAX_TOOLS               128         /* entries of 'tools' */
#define HTTP_MAX_TOOL_NAME           64          /* bytes of a function name (OpenAI's bound) */
#define HTTP_TOOL_TURNS_VERSION      0x000900u   /* kvd that renders tool roles itself (0.9.0) */
#define HTTP_CALL_OPEN_VERSION       0x000b00u   /* kvd that names its chat format and opens calls (0.11.0) */
#define HTTP_MAX_PARALLEL_CALLS      8           /* calls a forced parallel answer holds at most */
#define HTTP_MAX_ERROR_POINTER       128         /* bytes of a schema error's JSON pointer */

/* ---- configuration ------------------------------------------------------------ */

struct http_config {
	char listen[256];          /* "host:port", "[v6]:port" */
	char kvd_socket[256];      /* "" = $KVD_SOCKET or kvd's default */
	char api_key_file[256];    /* "" = no key */
	char model_id[HTTP_MAX_MODEL_ID]; /* "" = the name kvd reports */
	uint32_t max_body_bytes;
	uint32_t max_header_bytes;
	uint32_t max_connections;
	uint32_t max_connections_per_ip;
	uint32_t client_timeout_s;
	uint32_t default_max_tokens;
	uint32_t backlog;
	uint32_t kvd_connections;
	uint32_t max_queued;
	uint32_t request_timeout_s;
};

/* Defaults above. */
void http_config_defaults(struct http_config *cfg);

/*
 * Apply key = value of section [http] (section NULL or "http"). Returns 0,
 * -ENOENT for an unknown key, -EINVAL for a bad value, -E2BIG for a value
 * too long; *ret_msg (may be NULL) gets a static explanation on failure.
 */
int http_config_set(struct http_config *cfg, const char *section, const char *key, const char *value,
		    const char **ret_msg);

/* Read an ini file into cfg. Returns 0, -ENOENT/-EACCES when it cannot be
 * opened, or -EINVAL with *ret_line set to the first bad line and *ret_msg
 * to why. */
int http_config_load(struct http_config *cfg, const char *path, int *ret_line, const char **ret_msg);

/* The help text listing every key (for --help and the documentation). */
extern const char http_config_help[];

/* ---- requests ------------------------------------------------------------------ */

enum http_endpoint {
	HTTP_EP_CHAT = 1,        /* POST /v1/chat/completions */
	HTTP_EP_COMPLETIONS = 2, /* POST /v1/completions */
};

/* An OpenAI-style error: HTTP status, error.type, error.param, error.code,
 * error.message. */
struct http_error {
	int status;
	const char *type;  /* "invalid_request_error", ... (static) */
	const char *code;  /* static or NULL */
	char param[64];    /* "" = null */
	char message[512];
	/* where a grammar or schema is wrong (extra fields of the error object):
	 * line and column (0: none), or the schema part's JSON pointer */
	uint32_t line, column;
	bool has_pointer;
	char pointer[HTTP_MAX_ERROR_POINTER];
};

/* Fill e and return -EINVAL (for "return http_fail(e, ...)"). */
int http_fail(struct http_error *e, int status, const char *type, const char *code, const char *param,
	      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* What 'tool_choice' asks for. */
enum http_tool_mode {
	HTTP_TOOLS_NONE = 0,  /* no tools, or tool_choice "none" (they are still rendered): text comes back */
	HTTP_TOOLS_AUTO,      /* the model may call one: calls are parsed from its text */
	HTTP_TOOLS_REQUIRED,  /* it must call one of them: the output is constrained to a call */
	HTTP_TOOLS_NAMED,     /* it must call tool_name: constrained likewise */
};

/* A checked generation request. Strings are owned (free with
 * http_gen_req_clear); the absent ones are NULL. */
/*
 * How a forced call is written, by the model family kvd names
 * (kvc_info.chat_format, kvd 0.11.0):
 *   BARE     the call object {"name", "arguments"} alone (a JSON array of
 *            them with parallel_tool_calls): what kvd before 0.11.0 gets
 *   TAGGED   ChatML (Qwen) and the generic format: the prompt ends with
 *            "<tool_call>\n" (a "call_open" turn), then the call object;
 *            with parallel_tool_calls, BARE's array
 *   LLAMA3   {"name", "parameters"}: the whole reply (an array of them
 *            with parallel_tool_calls)
 *   MISTRAL  the prompt ends with [TOOL_CALLS], then a JSON array of one
 *            call object (1 to HTTP_MAX_PARALLEL_CALLS with
 *            parallel_tool_calls)
 */
enum http_call_shape { HTTP_CALL_BARE, HTTP_CALL_TAGGED, HTTP_CALL_LLAMA3, HTTP_CALL_MISTRAL };

struct http_gen_req {
	int endpoint;
	char *model;
	char *cache_salt;        /* vLLM's cache_salt: prompt pages are shared only within it */
	char *system;            /* chat: the system (or developer) message */
	char *prompt;            /* chat: the user message; completions: the prompt */
	size_t prompt_len;
	struct kvc_chat_msg *messages; /* chat with more turns than system + user: all of them (contents
					* owned), and system and prompt NULL */
	size_t n_messages;
	/* the same conversation with tools, tool calls or results in kvd's tool
	 * roles (kvd 0.9.0 renders them in the model's own format); NULL
	 * without them. Contents owned. */
	struct kvc_chat_msg *tool_turns;
	size_t n_tool_turns;
	bool stream;
	bool include_usage;      /* stream_options.include_usage */
	bool has_max_tokens, has_temperature, has_top_p, has_seed, has_top_k, has_min_p, has_repeat_penalty;
	uint32_t max_tokens;
	double temperature, top_p, min_p, repeat_penalty;
	int32_t top_k;
	uint64_t seed;
	char *stop[HTTP_MAX_STOP];
	size_t n_stop;
	uint32_t n;              /* choices, 1 .. HTTP_MAX_N (0: not given, one) */
	bool logprobs;           /* chat: 'logprobs': true; completions: 'logprobs': K given */
	bool no_speculate;       /* 'speculative': false (KVC_GEN_NO_SPECULATE) */
	uint32_t top_logprobs;   /* chat: 'top_logprobs'; completions: 'logprobs' K */
	int32_t priority;        /* vLLM's 'priority': lower first among the gateway tenant's requests */

	/* structured output (structured.c): at most one constraint */
	struct kvc_constraint constraint; /* kind 0: none; text points at constraint_text */
	char *constraint_text;
	const char *constraint_param; /* the field it came from, for errors (static) */

	/* tools (structured.c); the functions are rendered into the messages */
	enum http_tool_mode tool_mode;
	json_t *tools;           /* the functions: [{"name","description"?,"parameters"}], or NULL */
	char *tool_name;         /* HTTP_TOOLS_NAMED: the function */
	bool parallel_tool_calls; /* 'parallel_tool_calls' (default true): more than one call kept */
	bool parallel_forced;     /* 'parallel_tool_calls' true given with a forced call: one or more */
	enum http_call_shape call_shape; /* how a forced call is written (http_set_call_shape) */
	bool call_open_turn;      /* tool_turns ends with a "call_open" turn */
};


/*
 * Parse and check a request body for endpoint ep. Every parameter the
 * gateway cannot honour exactly — including other servers' extras that
 * change what is generated, and 'priority' — is refused with a 400 naming
 * it (never ignored silently); a body nested deeper than
 * HTTP_MAX_JSON_DEPTH is refused; other unknown keys (metadata such as
 * 'user') are ignored, as OpenAI-compatible servers do. Returns 0 with
 * *ret filled, or -EINVAL with *err filled (ret then holds nothing to
 * free). body need not be NUL-terminated.
 */
int http_parse_gen_request(int ep, const char *body, size_t len, struct http_gen_req *ret, struct http_error *err);
void http_gen_req_clear(struct http_gen_req *r);

/* ---- structured output and tools (structured.c) -------------------------------- */

/*
 * The constraint fields of body o: response_format (text, json_object,
 * json_schema), llama.cpp's grammar and json_schema, vLLM's guided_json,
 * guided_regex, guided_choice, guided_grammar. More than one → a 400 naming
 * both. 0 with r->constraint set (kind 0 for none), or -EINVAL/-ENOMEM with
 * e filled.
 */
int http_parse_constraint(json_t *o, struct http_gen_req *r, struct http_error *e);

/*
 * tools, tool_choice, parallel_tool_calls of a chat body. With tool_choice
 * required or a named function the output is constrained to a call (a JSON
 * Schema built from the functions' parameters), so a constraint given too
 * is refused. 0, or -EINVAL/-ENOMEM with e filled.
 */
int http_parse_tools(json_t *o, struct http_gen_req *r, struct http_error *e);

/* The call shape for a kvd of server_version naming chat_format. */
enum http_call_shape http_call_shape_for(unsigned server_version, const char *chat_format);
/*
 * A forced call's constraint (and, where the shape has one, the closing
 * "call_open" turn of r->tool_turns) for shape; nothing for a request
 * without a forced call. 0, or -ENOMEM with e filled.
 */
int http_set_call_shape(struct http_gen_req *r, enum http_call_shape shape, struct http_error *e);
/* Whether a forced answer is a JSON array of calls (not one object). */
bool http_forced_array(const struct http_gen_req *r);

/*
 * The text of a message of the conversation as kvd's chat template sees it:
 * an assistant message's tool_calls appended to its content as
 * <tool_call> blocks, a tool message's content inside <tool_response>.
 * *ret (malloc'd) and *ret_len; 0 or -EINVAL/-ENOMEM with e filled.
 */
int http_render_tool_calls(json_t *msg, size_t idx, const char *content, size_t len, char **ret, size_t *ret_len,
			   struct http_error *e);
int http_render_tool_response(const char *content, size_t len, char **ret, size_t *ret_len, struct http_error *e);

/* The text of a message's content (a string, or text parts joined),
 * malloc'd in *ret; 0 or -EINVAL/-ENOMEM with e filled (request.c). */
int http_content_text(json_t *c, size_t idx, char **ret, size_t *ret_len, struct http_error *e);

/*
 * The conversation messages (already checked by the messages parser) in
 * kvd's tool roles, into r->tool_turns, when it has tools, tool calls or
 * tool results: a "tools" turn (r->tools) before the first user turn, an
 * assistant message's tool_calls as a "tool_calls" turn after its text,
 * each tool message a "tool" turn, the results after one assistant
 * message ordered as its calls (by tool_call_id). 0, or -EINVAL (a call's
 * arguments that are not a JSON object) / -ENOMEM with e filled.
 */
int http_tool_turns(json_t *messages, struct http_gen_req *r, struct http_error *e);

/* The system-message block that lists r->tools and says how to call them
 * (malloc'd text; NULL: out of memory). */
char *http_render_tools_block(const struct http_gen_req *r);

/* A constraint error from kvd (message "constraint: WHERE: WHAT") as the
 * 400 of the field the constraint came from, with line/column or pointer. */
void http_constraint_error(const struct http_gen_req *r, const char *msg, struct http_error *e);

/* ---- responses ------------------------------------------------------------------- */

/* A JSON string of text that should be UTF-8 (invalid bytes become U+FFFD);
 * NULL when out of memory. */
json_t *http_text_json(const char *s, size_t n);

/* The JSON text of an error object: {"error":{"message","type","param","code"}}, and
 * "line"/"column" or "pointer" when set.
 * Returns malloc'd NUL-terminated text or NULL (out of memory). */
char *http_error_json(const struct http_error *e);

/* What one generation produced, for the final JSON. */
struct http_usage {
	uint32_t prompt_tokens, cached_tokens, completion_tokens;
};

/* "stop" or "length" from kvd's finish reason (enum kvc_finish values). */
const char *http_finish_reason(int kvc_finish);

/* The non-streaming response. text: text_len bytes. NULL: out of memory. */
char *http_response_json(int ep, const char *id, long created, const char *model, const char *text, size_t text_len,
			 const char *finish, const struct http_usage *u);

/*
 * One server-sent event "data: {...}\n\n" of a stream, malloc'd, *ret_len
 * set. role_only: the first chat chunk (delta.role). finish non-NULL: the
 * last chunk of the choice. usage non-NULL: the usage chunk (choices []).
 * with_usage_null: include_usage is on, so other chunks carry "usage":null.
 */
char *http_chunk_sse(int ep, const char *id, long created, const char *model, bool role_only, const char *text,
		     size_t text_len, const char *finish, const struct http_usage *usage, bool with_usage_null,
		     size_t *ret_len);

#endif /* KVD_HTTP_H */
