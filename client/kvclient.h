/*
 * kvclient.h — libkvclient, the C client library of kvd.
 *
 * kvd is a local daemon that keeps one language model loaded and serves
 * text generation to processes on the same machine. This library connects
 * to it over a Unix socket, streams generated tokens back through shared
 * memory, and exposes the daemon's tokenizer, sessions and statistics.
 *
 *     #include <kvclient.h>          cc app.c $(pkg-config --cflags --libs kvclient)
 *
 *     static int print_token(void *ud, const struct kvc_event *ev)
 *     {
 *             fwrite(ev->text, 1, ev->text_len, stdout);
 *             return 0;                          // non-zero cancels
 *     }
 *
 *     kvc_client *c;
 *     int r = kvc_connect(NULL, &c);             // $KVD_SOCKET or /run/kvd/kvd.sock
 *     if (r < 0) { fprintf(stderr, "kvd: %s\n", kv_strerror(r)); exit(1); }
 *     struct kvc_gen_params p;
 *     kvc_gen_params_init(&p);
 *     p.max_tokens = 64;
 *     r = kvc_generate(c, "Why is the sky blue?", KVC_NTS, &p, print_token, NULL, NULL);
 *     kvc_close(c);
 *
 * ---- Conventions -------------------------------------------------------
 *
 * Errors. Functions returning int return >= 0 on success and a negative
 * code on failure: either a negative errno value (-ENOMEM, -ECONNRESET,
 * -ETIMEDOUT, -E2BIG, ...) or one of the kvd codes KVC_ERR_* below.
 * kv_strerror() turns any code into a message. Output parameters (ret_*)
 * are written only on success unless a function says otherwise. The
 * library never prints, never exits, and never raises SIGPIPE.
 *
 * Ownership. Handles are created by kvc_connect*() / kvc_request_start()
 * and released by kvc_close() / kvc_request_finish(), which accept NULL
 * and return NULL. Memory returned through ret_* pointers of
 * kvc_tokenize() and kvc_ps() belongs to the caller: release it with
 * kvc_free(). Pointers inside events and results are owned by the library
 * and valid only as long as stated.
 *
 * Threads. A kvc_client and the kvc_requests made from it form one unit
 * that must be used by one thread at a time: the library takes no locks.
 * Different clients are fully independent, so a program that generates
 * from several threads opens one client per thread (connections are cheap:
 * one socket and one shared-memory mapping). The single exception is
 * kvc_cancel(), which may be called at any time from any thread or from a
 * signal handler, concurrently with anything but kvc_close() of the same
 * client: it only sends one datagram and is async-signal-safe.
 *
 * Blocking. Calls wait for the daemon in poll(); they never spin. A daemon
 * that exits or crashes is noticed at once (-ECONNRESET), never as a hang.
 * How long a call waits for a reply or the next token is bounded by
 * kvc_set_timeout() (default: no bound for generation events, which may
 * legitimately queue behind other work; the handshake in kvc_connect*() is
 * bounded by KVC_CONNECT_TIMEOUT_MS). Signals interrupting poll() are
 * ignored (the wait resumes); use kvc_cancel() from a handler to stop a
 * generation.
 *
 * ABI. Only the functions below are exported from libkvclient.so (soname
 * libkvclient.so.0); everything else is hidden. Structs that callers
 * allocate (kvc_gen_params, kvc_result, kvc_stats, kvc_ps_entry) and
 * kvc_info have a fixed size and end in reserved fields, so later versions
 * add members without changing their size; initialize kvc_gen_params with
 * kvc_gen_params_init(). Structs the library hands out by pointer
 * (kvc_event) may grow at the end. The library version is in
 * KVC_VERSION_* (compile time) and kvc_version() (run time); the protocol
 * version is checked in the handshake (KVC_ERR_VERSION).
 */
#ifndef KVCLIENT_H
#define KVCLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KVC_EXPORT __attribute__((visibility("default")))
#else
#define KVC_EXPORT
#endif

/* ---- version ----------------------------------------------------------- */

#define KVC_VERSION_MAJOR 0
#define KVC_VERSION_MINOR 11
#define KVC_VERSION_PATCH 0
#define KVC_VERSION_STRING "0.11.0"
/* One number, comparable: (major << 16) | (minor << 8) | patch.
 * 0.2.0 added conversations (kvc_gen_params.messages, struct kvc_chat_msg).
 * 0.3.0 added parallel samples and log-probabilities (kvc_gen_params.n_samples,
 * .top_logprobs, KVC_GEN_LOGPROBS, kvc_event.sample and .logprobs,
 * kvc_request_sample_result()).
 * 0.4.0 added kvc_stats.pages_packed and .pages_released.
 * 0.5.0 added kvc_info.kv_cache_type.
 * 0.6.0 added kvc_gen_params.tenant (cache scopes) and .priority.
 * 0.7.0 added structured output (kvc_gen_params.constraint, struct
 * kvc_constraint), kvc_stats.adopted_hit_tokens and kvc_cache_save() /
 * kvc_cache_drop().
 * 0.8.0 added kvc_info.model_id, kvc_stats_get() (kvc_stats() became a
 * macro over it, so struct kvc_stats can grow) and kvc_stats.gram_checked
 * and .gram_masked.
 * 0.9.0 added speculative decoding's counters (kvc_stats.spec_*,
 * kvc_result.spec_drafted_tokens and .spec_accepted_tokens), the
 * per-request opt-out KVC_GEN_NO_SPECULATE, and the tool roles of
 * conversations ("tools", "tool_calls", "tool" in struct kvc_chat_msg),
 * rendered in the model family's own tool format.
 * 0.10.0 added kvc_stats.spec_mode, .spec_draft_pages_total,
 * .spec_draft_pages_used and .spec_draft_reclaims (the drafter in use and
 * the draft model's pool).
 * 0.11.0 added kvc_info.chat_format and the "call_open" turn of
 * conversations (a reply that begins with a tool call, in the family's
 * shape). */
#define KVC_VERSION ((KVC_VERSION_MAJOR << 16) | (KVC_VERSION_MINOR << 8) | KVC_VERSION_PATCH)

/* The version of the library actually loaded, as KVC_VERSION. */
KVC_EXPORT unsigned kvc_version(void);
/* The same as a string ("0.4.0"); static, never NULL. */
KVC_EXPORT const char *kvc_version_string(void);

/* ---- error codes (besides negative errno values) -------------------------- */

#define KVC_ERR_VERSION  (-1001) /* the daemon speaks another protocol version */
#define KVC_ERR_CONTEXT  (-1002) /* prompt + max_tokens exceed the model's context window */
#define KVC_ERR_SHUTDOWN (-1003) /* the daemon is shutting down */
#define KVC_ERR_LIMIT    (-1004) /* a per-client limit was reached (too many requests in flight) */
#define KVC_ERR_ENGINE   (-1005) /* the model or compute backend failed */
#define KVC_ERR_SESSION  (-1006) /* unknown, expired or busy session */
#define KVC_ERR_DENIED   (-1007) /* this user or group may not use the daemon */

/*
 * A message for any code this library returns: negative errno values give
 * the system's description ("Connection reset by peer"), KVC_ERR_* their
 * own, 0 "Success", anything else "Unknown error". The string is static
 * (never NULL, never to be freed) and the function is thread-safe.
 */
KVC_EXPORT const char *kv_strerror(int code);

/* ---- connecting --------------------------------------------------------------- */

#define KVC_DEFAULT_SOCKET     "/run/kvd/kvd.sock"
#define KVC_SOCKET_ENV         "KVD_SOCKET"
#define KVC_CONNECT_TIMEOUT_MS 10000

typedef struct kvc_client kvc_client;
typedef struct kvc_request kvc_request;

/*
 * Connect to the daemon and perform the handshake (protocol version check,
 * shared-memory setup). path: the socket's path, or "@name" for an
 * abstract socket; NULL means $KVD_SOCKET when set and non-empty, else
 * KVC_DEFAULT_SOCKET.
 *
 * Returns 0 and the client in *ret. Failures: -ENOENT or -ECONNREFUSED (no
 * daemon listens there), -EACCES (socket permissions), KVC_ERR_DENIED (the
 * daemon refused this user), KVC_ERR_VERSION (incompatible daemon),
 * -ETIMEDOUT (no answer within KVC_CONNECT_TIMEOUT_MS), -EPROTO (the peer
 * is not a kvd or sent something malformed), -ENAMETOOLONG, -ENOMEM.
 */
KVC_EXPORT int kvc_connect(const char *path, kvc_client **ret);

/*
 * Like kvc_connect() over an already connected SOCK_SEQPACKET socket (from
 * socketpair(), a supervisor, a test). On success the client owns fd and
 * closes it in kvc_close(); on failure the caller still owns it. The fd's
 * O_NONBLOCK flag is set.
 */
KVC_EXPORT int kvc_connect_fd(int fd, kvc_client **ret);

/*
 * Disconnect. Requests still running are cancelled by the disconnection
 * (the daemon frees their memory at once) and every kvc_request of this
 * client is freed: their handles become invalid. Accepts NULL; returns NULL.
 */
KVC_EXPORT kvc_client *kvc_close(kvc_client *c);

/*
 * Bound every later wait of this client for a reply or an event to
 * timeout_ms milliseconds (< 0: wait without bound, the default). A wait
 * that runs out returns -ETIMEDOUT; the request or call it belonged to is
 * not cancelled by that (kvc_generate() does cancel its request). One
 * exception: a timeout while a large prompt or text is still being
 * uploaded through shared memory ends the connection, since the daemon
 * expects the rest of it; later calls then return -ETIMEDOUT. Returns 0.
 */
KVC_EXPORT int kvc_set_timeout(kvc_client *c, int timeout_ms);

/* What the daemon said about itself and its model in the handshake. */
struct kvc_info {
	unsigned server_version;      /* as KVC_VERSION */
	char model_name[64];          /* NUL-terminated */
	uint32_t n_vocab;
	uint32_t n_ctx;               /* usable context length, tokens */
	uint32_t block_size;          /* tokens per KV page */
	uint32_t n_layers;
	uint32_t n_kv_heads;
	uint32_t head_dim;
	uint32_t kv_dtype_bytes;      /* bytes per K or V element */
	uint32_t max_prompt_bytes;    /* longest prompt or tokenize text accepted */
	uint32_t max_requests;        /* requests in flight per client */
	uint32_t max_tokens;          /* largest max_tokens accepted */
	uint64_t kv_bytes_per_token;  /* 2 * n_layers * n_kv_heads * head_dim * kv_dtype_bytes */
	uint64_t pool_bytes;          /* KV pool size */
	uint64_t client_id;           /* the daemon's name for this connection (see kvc_ps) */
	char kv_cache_type[8];        /* the KV element type ([kv] cache_type: "f16", "bf16", "q8_0",
	                               * "q4_0", "f32"; 0.5.0, "" from older daemons) */
	char model_id[32];            /* a short, stable id: the model file's base name without
	                               * ".gguf" (at most 31 bytes; 0.8.0, "" from older daemons) */
	char chat_format[16];         /* the chat template's family, which says how the model
	                               * writes a tool call: "chatml", "llama3", "llama2", "zephyr",
	                               * "gemma", "mistral"; "" when kvd renders no conversations for
	                               * the model, and from daemons before 0.11.0 */
	uint64_t reserved[1];
};
/* Valid until kvc_close(); never NULL. */
KVC_EXPORT const struct kvc_info *kvc_server_info(const kvc_client *c);

/*
 * The KV element types this library knows, for i = 0, 1, ... in turn: the
 * type's name as kvc_info.kv_cache_type spells it ("f16", "f32", "q8_0",
 * "q4_0", "bf16"; static, never freed), with *ret_block_elems elements
 * stored in *ret_block_bytes bytes (f16: 1 in 2; q8_0: 32 in 34). NULL
 * past the last type, the outputs then untouched. Either output may be
 * NULL. (0.8.0)
 */
KVC_EXPORT const char *kvc_kv_type(unsigned i, uint32_t *ret_block_elems, uint32_t *ret_block_bytes);

/*
 * The message the daemon attached to the last error it returned to a call
 * on this client (for example why a tokenize request was refused), or ""
 * when there was none. Valid until the next call on the client.
 */
KVC_EXPORT const char *kvc_last_message(const kvc_client *c);

/* ---- generation parameters --------------------------------------------------- */

#define KVC_GEN_RAW      0x1u /* complete the prompt as given; default: apply the model's chat template */
#define KVC_GEN_WANT_IDS 0x2u /* events carry token ids (kvc_event.ids) */
/* With KVC_GEN_RAW: texts of special tokens in the prompt ("<|im_start|>",
 * "<|endoftext|>") become those tokens; without it they are plain text.
 * Only with KVC_GEN_RAW (-EINVAL otherwise). A daemon older than this flag
 * refuses the request as a protocol error. */
#define KVC_GEN_PARSE_SPECIAL 0x8u
/* Events carry each token's log-probability and its top_logprobs likeliest
 * alternatives (kvc_event.logprobs; see "Samples and log-probabilities"). */
#define KVC_GEN_LOGPROBS 0x20u
/* No speculative decoding for this request, whatever the daemon's
 * [speculative] mode (0.9.0). Speculation never changes an output; this
 * only chooses the plain path's speed. A daemon older than 0.9.0 never
 * speculates: the flag is not sent to it (it would refuse it), and the
 * request goes as asked. */
#define KVC_GEN_NO_SPECULATE 0x400u

/*
 * One turn of a conversation (kvc_gen_params.messages): role "system",
 * "user" or "assistant", content its NUL-terminated text. Both strings stay
 * the caller's; the library copies them while the request is sent.
 * Tools (0.9.0; -EOPNOTSUPP from an older daemon): the daemon renders them
 * in the model family's own tool format (Qwen's <tool_call> blocks in
 * ChatML, Llama 3.1's JSON calls and ipython turns, Mistral's
 * [AVAILABLE_TOOLS] / [TOOL_CALLS] / [TOOL_RESULTS], and a generic format
 * in <tool_call> blocks for the other templates), so control tokens that
 * format needs come from the template, never from text:
 *   "tools"      content is a JSON array of functions {"name",
 *                "description"?, "parameters"?}; at most one such turn,
 *                first or right after a leading system turn, and followed
 *                by a user turn;
 *   "tool_calls" content is a JSON array of the assistant's calls {"id"?,
 *                "name", "arguments": {...}}; it follows the assistant's
 *                text turn of the same reply, or stands for the reply;
 *   "tool"       content is one tool result; the results after a
 *                "tool_calls" turn answer its calls in order.
 *   "call_open"  (0.11.0; -EOPNOTSUPP from an older daemon) content "",
 *                the last message, after a "user" or "tool" one, in a
 *                conversation with tools: the reply begins with a tool
 *                call. The prompt ends with what the family writes before
 *                a call's JSON (chatml and the generic format of llama2,
 *                zephyr and gemma: "<tool_call>\n", then the call object
 *                {"name", "arguments"}; mistral: its [TOOL_CALLS] token,
 *                then a JSON array of such objects; llama3: nothing, the
 *                call object {"name", "parameters"} is the whole reply), so
 *                a constraint to a call of that shape (a forced call) is
 *                written the way the model was trained to write it.
 *                kvc_info.chat_format names the family.
 * The last message is a "user" or a "tool" one (or "call_open" after one).
 */
struct kvc_chat_msg {
	const char *role;
	const char *content;
};
#define KVC_MAX_CHAT_MSGS 1024 /* messages one request may carry */

#define KVC_SEED_RANDOM  UINT64_MAX /* let the daemon pick the seed */
#define KVC_NTS          ((size_t)-1) /* "the text is NUL-terminated" as a length */

/*
 * Structured output (0.7.0): what the generated text must be. The daemon
 * compiles the constraint (compiled constraints are cached by content, so
 * repeating one costs nothing more) and sampling draws only tokens it
 * allows: greedy picks the likeliest allowed token, seeded sampling samples
 * exactly as it would from logits with every disallowed token at -inf (the
 * same seed gives the same text). Log-probabilities (KVC_GEN_LOGPROBS) stay
 * the model's own distribution. The model's end token is allowed only where
 * the constraint may end. Generation ends with KVC_FINISH_EOS when the
 * constraint is complete and no further token is possible, or when the end
 * token is drawn where the constraint allows ending: the text is then a
 * valid instance. KVC_FINISH_LENGTH means max_tokens cut it (the text is not
 * valid); stop strings still apply (KVC_FINISH_STOP: cut too). With
 * n_samples each sample obeys it; with a session it applies to this turn's
 * generated text only (the next turn has its own or none).
 * Errors: -EINVAL before sending for a bad kind, non-zero flags or
 * reserved, a missing text (except JSON_OBJECT); -E2BIG over
 * KVC_MAX_CONSTRAINT_BYTES; -EOPNOTSUPP when the daemon is older than
 * 0.7.0. From the daemon (kvc_result.error and error_message): -EINVAL for a
 * syntax or schema error, with error_message "constraint: " followed by
 * where ("LINE:COL: " in the text, or the schema part's JSON pointer) and
 * what; -ENOTSUP for a feature that cannot be honoured exactly (the message
 * names the keyword); -E2BIG over the daemon's [limits] max_constraint_bytes
 * or its grammar size limits.
 */
enum kvc_constraint_kind {
	KVC_CONSTRAINT_GBNF = 1,        /* a grammar in llama.cpp's GBNF notation; start rule "root" */
	KVC_CONSTRAINT_JSON_SCHEMA = 2, /* a JSON Schema document (JSON text) */
	KVC_CONSTRAINT_JSON_OBJECT = 3, /* any JSON object; text may be NULL */
	KVC_CONSTRAINT_REGEX = 4,       /* a regular expression the whole output matches */
	KVC_CONSTRAINT_CHOICE = 5,      /* a JSON array of strings: the output is one of them */
};
struct kvc_constraint {
	uint32_t kind;        /* enum kvc_constraint_kind */
	uint32_t flags;       /* zero */
	const char *text;     /* the constraint's text (len bytes, or KVC_NTS) */
	size_t len;
	uint64_t reserved[2]; /* zero */
};
#define KVC_MAX_CONSTRAINT_BYTES (1u << 20)

struct kvc_gen_params {
	uint32_t max_tokens;      /* tokens to generate at most; default 256 */
	float temperature;        /* 0 = greedy (deterministic); default 0.8 */
	float top_p;              /* nucleus mass in (0, 1]; 1 = off; default 0.95 */
	int32_t top_k;            /* keep the k likeliest; 0 = off; default 40 */
	float min_p;              /* drop p < min_p * p_max, [0, 1); 0 = off; default 0.05 */
	float repeat_penalty;     /* > 0; 1 = off (default) */
	int32_t repeat_last_n;    /* tokens the penalty looks back at; default 64 */
	uint32_t flags;           /* KVC_GEN_*; default 0 */
	uint64_t seed;            /* sampling seed; default KVC_SEED_RANDOM */
	uint64_t session_id;      /* continue this session (kvc_session_open); 0 = none */
	const char *system;       /* chat system prompt (NUL-terminated) or NULL; not with KVC_GEN_RAW */
	const char *const *stop;  /* n_stop NUL-terminated stop strings, each 1..256 bytes */
	size_t n_stop;            /* 0 .. 8 */
	const struct kvc_chat_msg *messages; /* a whole conversation, or NULL (default): see below */
	size_t n_messages;        /* 0 .. KVC_MAX_CHAT_MSGS */
	uint32_t n_samples;       /* samples of the prompt: 0 or 1 (default) one; 2 .. KVC_MAX_SAMPLES */
	uint32_t top_logprobs;    /* with KVC_GEN_LOGPROBS: alternatives per token, 0 .. KVC_MAX_TOP_LOGPROBS */
	uint32_t context_policy;  /* enum kvc_context_policy; default KVC_CONTEXT_ERROR */
	uint32_t context_window;  /* sliding-window, sinks: tokens kept at least; 0 = as many as fit */
	uint32_t context_sinks;   /* sinks: first tokens kept (rounded up to KV pages); 0 = 4 */
	uint32_t reserved_ctx;    /* zero */
	/* Cache tenant (0.6.0), NUL-terminated, 1 .. KVC_MAX_TENANT_BYTES bytes,
	 * or NULL (default). kvd serves a request from cached prompt pages only
	 * within its owner scope — by default the calling uid — and a tenant
	 * narrows that scope: requests with different tenants (or one with and
	 * one without) never share cached pages, nor learn from cached_tokens
	 * or timing whether the other computed a prompt. A gateway serving many
	 * users under one uid names one tenant per user (kvd-http: per API key
	 * and per cache_salt). -EINVAL for an empty or over-long name;
	 * -EOPNOTSUPP when the daemon is older than 0.6.0. */
	const char *tenant;
	/* Priority (0.6.0) among the caller's own requests: a lower value is
	 * admitted first and preempted last, as vLLM's `priority`; 0 is the
	 * default. It never ranks a request against other users' (they share
	 * the machine fairly). KVC_MIN_PRIORITY .. KVC_MAX_PRIORITY, else
	 * -ERANGE; -EOPNOTSUPP when non-zero and the daemon is older than 0.6.0. */
	int32_t priority;
	uint32_t reserved_prio;   /* zero */
	const struct kvc_constraint *constraint; /* (0.7.0) or NULL: see struct kvc_constraint */
};
#define KVC_MAX_TENANT_BYTES 64
#define KVC_MIN_PRIORITY (-1000000)
#define KVC_MAX_PRIORITY 1000000

#define KVC_MAX_SAMPLES      16
#define KVC_MAX_TOP_LOGPROBS 20

/*
 * Samples and log-probabilities. With n_samples = N >= 2 the daemon
 * generates N independent continuations of the prompt: it computes the
 * prompt once and shares its KV pages between the samples (copy-on-write;
 * `kvctl ps` shows one line per sample and the pages they share). Events
 * of the samples interleave; kvc_event.sample says whose an event is, and
 * each sample's index counts its own tokens. Sample 0 samples with `seed`,
 * sample i >= 1 with SplitMix64's output function of seed + i *
 * 0x9e3779b97f4a7c15, so a seeded request is reproducible and its sample 0
 * is what a one-sample request with that seed gives. Each sample counts
 * as one request against kvc_server_info()->max_requests. The request
 * ends when every sample has ended: kvc_request_sample_result() has each
 * one's outcome, kvc_request_result() the whole request's (see there).
 * With KVC_GEN_LOGPROBS each event also carries, per token, its
 * log-probability and the top_logprobs likeliest alternatives: natural
 * logs of the softmax of the model's logits before repetition penalty,
 * temperature, top-k/top-p/min-p (the model's own distribution, as
 * OpenAI reports it). Refused before anything is sent with -EINVAL:
 * n_samples above KVC_MAX_SAMPLES, top_logprobs above KVC_MAX_TOP_LOGPROBS
 * or without KVC_GEN_LOGPROBS, several samples with a session_id;
 * -EOPNOTSUPP: the daemon is older than samples (kvd 0.3.0).
 */

/*
 * Context policies: what happens when a request would not fit the model's
 * context window (kvc_result.context_dropped_tokens says what was dropped).
 *   KVC_CONTEXT_ERROR            refuse it (KVC_ERR_CONTEXT): the default
 *   KVC_CONTEXT_TRUNCATE_OLDEST  sessions: drop the oldest turns, keep the
 *                                system prompt, until the new turn fits
 *   KVC_CONTEXT_SLIDING_WINDOW   keep the last context_window tokens; older
 *                                KV is freed, generation may run past the
 *                                context
 *   KVC_CONTEXT_SINKS            the same, also keeping the first
 *                                context_sinks tokens (StreamingLLM)
 * The window policies need a backend that can re-rotate cached keys (the
 * CPU backend); the daemon refuses them otherwise (-EOPNOTSUPP, with a
 * message). Sending one to a daemon older than them gives -EPROTO.
 */
enum kvc_context_policy {
	KVC_CONTEXT_ERROR = 0,
	KVC_CONTEXT_TRUNCATE_OLDEST = 1,
	KVC_CONTEXT_SLIDING_WINDOW = 2,
	KVC_CONTEXT_SINKS = 3,
};
/* "error", "truncate-oldest", "sliding-window", "sinks", or NULL; static. */
KVC_EXPORT const char *kvc_context_policy_name(uint32_t policy);
/* The policy named by name, or -EINVAL. */
KVC_EXPORT int kvc_context_policy_parse(const char *name);

/*
 * Conversations. With n_messages > 0 the request's prompt is the
 * conversation messages[0 .. n_messages), in order, rendered by the daemon
 * with the model's chat template and ending where the assistant's next
 * reply begins; the prompt argument of kvc_generate() / kvc_request_start()
 * must then be NULL or empty. Re-send the whole conversation with every
 * request (append the reply and the next user message): its earlier turns
 * render to the same tokens each time, so the daemon finds them in its
 * prefix cache (kvc_result.cached_tokens grows with the conversation)
 * without keeping any state for it. Refused before anything is sent, with
 * -EINVAL: messages without n_messages or the reverse, a NULL role or content, a
 * role other than "system", "user", "assistant", "tools", "tool_calls",
 * "tool", a last message that is not "user" or "tool", a prompt as well, system, session_id or KVC_GEN_RAW /
 * KVC_GEN_PARSE_SPECIAL set with them (the system prompt is a "system"
 * message; a session would be a second history); -E2BIG: more than
 * KVC_MAX_CHAT_MSGS messages, or their texts plus 8 bytes per message
 * beyond kvc_server_info()->max_prompt_bytes; -EOPNOTSUPP: the daemon is
 * older than conversations (kvd 0.2.0); -ENOMEM.
 */

/* Fill *p with the defaults listed above (and zero the reserved fields). */
KVC_EXPORT void kvc_gen_params_init(struct kvc_gen_params *p);

/* ---- events and results ---------------------------------------------------------- */

enum kvc_event_type {
	KVC_EVENT_TOKEN = 1, /* text produced by one or more tokens */
};

/* One token with its log-probability (KVC_GEN_LOGPROBS). */
struct kvc_logprob {
	int32_t id;
	float logprob;            /* natural log, <= 0; -INFINITY for an impossible token */
	const char *bytes;        /* the token's raw bytes (possibly part of a UTF-8 character; at most
				   * 128, a longer token cut), not NUL-terminated */
	size_t n_bytes;
};
struct kvc_token_logprobs {
	struct kvc_logprob token; /* the token generated */
	size_t n_top;             /* kvc_gen_params.top_logprobs */
	const struct kvc_logprob *top; /* the likeliest tokens there, most likely first (ties: lower id) */
};

struct kvc_event {
	int type;                 /* enum kvc_event_type */
	uint64_t request_id;
	const char *text;         /* text_len bytes of UTF-8, NUL-terminated for convenience */
	size_t text_len;          /* may be 0: a partial character is held back until complete */
	uint32_t index;           /* position of this event's first token in the generation (its sample's) */
	uint32_t n_tokens;        /* tokens this event covers (>= 1) */
	const int32_t *ids;       /* n_tokens ids with KVC_GEN_WANT_IDS, else NULL */
	/* since 0.3.0 */
	uint32_t sample;          /* the sample this event belongs to (0 with one sample) */
	const struct kvc_token_logprobs *logprobs; /* n_tokens entries with KVC_GEN_LOGPROBS, else NULL */
};

enum kvc_finish {
	KVC_FINISH_EOS = 1,       /* the model ended its answer */
	KVC_FINISH_LENGTH = 2,    /* max_tokens reached */
	KVC_FINISH_STOP = 3,      /* a stop string matched (it is not part of the text) */
	KVC_FINISH_CANCELLED = 4, /* kvc_cancel(), a callback asking to stop, or kvc_request_finish() */
	KVC_FINISH_ERROR = 5,     /* see error and error_message */
};
/* "eos", "length", "stop", "cancelled", "error", or "?"; static. */
KVC_EXPORT const char *kvc_finish_name(int reason);

struct kvc_result {
	int finish_reason;        /* enum kvc_finish */
	int error;                /* 0, or the code with KVC_FINISH_ERROR */
	char error_message[513];  /* the daemon's explanation, NUL-terminated; "" if none */
	uint32_t prompt_tokens;   /* prompt length in tokens, after the chat template */
	uint32_t cached_tokens;   /* of those, reused from the prefix cache or the session */
	uint32_t generated_tokens;
	uint64_t queue_ns;        /* arrival -> admission */
	uint64_t ttft_ns;         /* arrival -> first token (time to first token) */
	uint64_t decode_ns;       /* first token -> last token */
	uint64_t total_ns;        /* arrival -> end */
	uint32_t context_dropped_tokens; /* tokens of context its policy dropped: the
	                                  * oldest turns (truncate-oldest) or the tokens
	                                  * (a session's history included) left behind
	                                  * the window; 0 under the default */
	uint32_t reserved32;
	/* Speculative decoding (0.9.0; 0 from older daemons, or none): draft
	 * tokens scored for it and of those the ones accepted (for a request
	 * with samples: all its samples'). The output is the same either way. */
	uint32_t spec_drafted_tokens;
	uint32_t spec_accepted_tokens;
	uint64_t reserved[6];
};

/* ---- generation: callback form -------------------------------------------------- */

/*
 * Called for every event, in order, on the calling thread. Return 0 to go
 * on; any other value cancels the request: the library tells the daemon,
 * delivers no further events and kvc_generate() returns -ECANCELED. ev and
 * what it points to are valid only during the call.
 */
typedef int (*kvc_token_fn)(void *userdata, const struct kvc_event *ev);

/*
 * Generate a continuation of prompt (prompt_len bytes, or KVC_NTS) with
 * params p (NULL: defaults), calling fn for each event, and return when the
 * request has ended.
 *
 * Returns 0 when the generation finished (end of answer, max_tokens or a
 * stop string: see ret_result->finish_reason); -ECANCELED when it was
 * cancelled (fn returned non-zero, or kvc_cancel()); a kvd or errno code
 * the daemon reported for the request (KVC_ERR_CONTEXT, -EINVAL, ...);
 * -ECONNRESET when the daemon went away; -ETIMEDOUT (see kvc_set_timeout,
 * the request is then cancelled); and, before anything is sent, -EINVAL
 * for bad parameters, -E2BIG for a prompt longer than
 * kvc_server_info()->max_prompt_bytes or too many/too long stop strings.
 *
 * ret_result (may be NULL) is filled whenever the request was sent,
 * including on errors reported by the daemon and on connection loss
 * (finish_reason KVC_FINISH_ERROR); untouched when nothing was sent.
 * Prompts of any size up to the limit are accepted: large ones travel
 * through shared memory.
 */
KVC_EXPORT int kvc_generate(kvc_client *c, const char *prompt, size_t prompt_len, const struct kvc_gen_params *p,
			    kvc_token_fn fn, void *userdata, struct kvc_result *ret_result);

/* ---- generation: blocking-read form ------------------------------------------------ */

/*
 * Send a generation request and return at once with its handle; read its
 * events with kvc_request_next(). Several requests of one client may run
 * at the same time (up to kvc_server_info()->max_requests); events of each
 * are queued separately, so they may be read in any order — a request
 * whose events are not read keeps them in memory until they are.
 * Errors as for kvc_generate() before sending; *ret untouched on failure.
 */
KVC_EXPORT int kvc_request_start(kvc_client *c, const char *prompt, size_t prompt_len,
				 const struct kvc_gen_params *p, kvc_request **ret);

/*
 * Wait for the request's next event. Returns 1 with *ret_ev set (valid
 * until the next call on this request); 0 when the request finished
 * normally; -ECANCELED when it ended cancelled; another negative code when
 * it failed (as for kvc_generate) — in those three cases the result is in
 * kvc_request_result(), and later calls return the same value again.
 * -ETIMEDOUT leaves the request running: call again to keep waiting.
 */
KVC_EXPORT int kvc_request_next(kvc_request *r, const struct kvc_event **ret_ev);

/* The request's id (for kvc_cancel and kvc_ps). */
KVC_EXPORT uint64_t kvc_request_id(const kvc_request *r);

/* The outcome once kvc_request_next() returned <= 0 (other than
 * -ETIMEDOUT); NULL before. Valid until kvc_request_finish(). With several
 * samples: generated_tokens is their sum, prompt_tokens and cached_tokens
 * the prompt's (counted once), decode_ns and total_ns the longest sample's;
 * finish_reason is an error or cancellation of any sample when there was
 * one, else sample 0's. */
KVC_EXPORT const struct kvc_result *kvc_request_result(const kvc_request *r);
/* Sample i's own outcome (finish_reason, generated_tokens, ...), under
 * the same conditions; NULL also for i beyond the request's samples.
 * kvc_request_sample_result(r, 0) of a one-sample request is
 * kvc_request_result(r). */
KVC_EXPORT const struct kvc_result *kvc_request_sample_result(const kvc_request *r, uint32_t i);

/*
 * Release the request. If it is still running it is cancelled and its
 * remaining events are discarded without waiting. Accepts NULL; returns NULL.
 */
KVC_EXPORT kvc_request *kvc_request_finish(kvc_request *r);

/*
 * Ask the daemon to stop request request_id of client c. The request then
 * ends with KVC_FINISH_CANCELLED (unless it finished first): its reader
 * sees -ECANCELED. Callable from any thread or signal handler (see
 * "Threads" above); it does not wait. Returns 0 (also for ids that are
 * unknown or already finished: the daemon ignores those), -EAGAIN when the
 * socket buffer is full (rare: retry), -ECONNRESET / -EPIPE when the
 * connection is gone.
 */
KVC_EXPORT int kvc_cancel(kvc_client *c, uint64_t request_id);

/* ---- sessions ---------------------------------------------------------------------- */

/*
 * A session keeps a conversation's KV cache in the daemon between
 * requests: pass its id in kvc_gen_params.session_id and each request
 * continues from the previous one, so only the new text is processed. A
 * session belongs to the user that opened it, not to the connection: it
 * survives kvc_close(), and any client of the same user may continue or
 * close it. It ends with kvc_session_close() or after idle_timeout_s
 * seconds unused (0: the daemon's default, which also bounds larger
 * values). One request at a time per session.
 * Returns 0 and the id; KVC_ERR_LIMIT when too many sessions are open;
 * -EOPNOTSUPP when the daemon has no sessions.
 */
KVC_EXPORT int kvc_session_open(kvc_client *c, uint32_t idle_timeout_s, uint64_t *ret_session_id);
/* kvc_session_open() with the session's context policy (enum
 * kvc_context_policy, window and sinks as in kvc_gen_params), which every
 * turn uses unless its kvc_gen_params name one. -EINVAL for a bad policy;
 * -EPROTO from a daemon older than context policies. */
KVC_EXPORT int kvc_session_open_policy(kvc_client *c, uint32_t idle_timeout_s, uint32_t context_policy,
				       uint32_t context_window, uint32_t context_sinks, uint64_t *ret_session_id);
/* Close it and free its memory. KVC_ERR_SESSION when unknown or expired. */
KVC_EXPORT int kvc_session_close(kvc_client *c, uint64_t session_id);

/* ---- tokenizer ------------------------------------------------------------------------ */

#define KVC_TOK_ADD_BOS       0x1u /* prepend the model's BOS token, if it has one */
#define KVC_TOK_PARSE_SPECIAL 0x2u /* "<|im_start|>" and the like become special tokens */

/*
 * Tokenize text (len bytes or KVC_NTS) with the model's tokenizer. Returns
 * 0, an array of *ret_n ids in *ret_ids (free with kvc_free; NULL when
 * *ret_n is 0). -E2BIG beyond max_prompt_bytes, -ENOMEM.
 */
KVC_EXPORT int kvc_tokenize(kvc_client *c, const char *text, size_t len, unsigned flags, int32_t **ret_ids,
			    size_t *ret_n);
/* Count the tokens of text without transferring them. */
KVC_EXPORT int kvc_count_tokens(kvc_client *c, const char *text, size_t len, unsigned flags, size_t *ret_n);

/* ---- statistics ------------------------------------------------------------------------ */

/* KV-cache and scheduler counters. Names match `kvctl stats --json`. */
struct kvc_stats {
	uint64_t pages_total;         /* pages in the KV pool */
	uint64_t pages_free;
	uint64_t pages_used;          /* referenced by at least one sequence */
	uint64_t pages_shared;        /* of those, referenced by two or more */
	uint64_t pages_cached;        /* unreferenced, kept for prefix reuse */
	uint64_t pages_swapped;       /* pages' worth of content in the swap file */
	uint64_t page_bytes;
	uint64_t block_size;          /* tokens per page */
	uint64_t kv_bytes_per_token;
	uint64_t pool_bytes;
	uint64_t tokens_resident;     /* tokens whose K/V are in the pool */
	uint64_t slack_tokens;        /* unused token slots in partly filled pages */
	uint64_t prefix_lookups;
	uint64_t prefix_query_tokens; /* prompt tokens looked up in the prefix cache */
	uint64_t prefix_hit_tokens;   /* of those, found */
	uint64_t pages_evicted;
	uint64_t cow_copies;
	uint64_t swap_out_pages;
	uint64_t swap_in_pages;
	uint64_t swap_bytes;          /* swap file capacity */
	uint64_t requests_running;
	uint64_t requests_waiting;
	uint64_t requests_swapped;
	uint64_t requests_completed;
	uint64_t requests_rejected;
	uint64_t clients;
	uint64_t sessions;
	uint64_t prompt_tokens_total;
	uint64_t generated_tokens_total;
	uint64_t steps;               /* scheduler steps run */
	uint64_t uptime_ns;
	uint64_t ledger_records_dropped; /* per-request ledger records that could not be written */
	uint64_t swap_errors;         /* swap page transfers that failed (I/O error, short, full) */
	uint64_t swap_fallback_recomputes; /* requests' KV recomputed because swap I/O failed */
	uint64_t pages_demoted;       /* of pages_swapped: cached prefix pages kept in swap (a cache
	                               * tier, read back on a prefix hit); the rest belong to
	                               * preempted requests */
	uint64_t samples_forked;      /* sequences forked from a prompt for parallel samples (0.3.0) */
	uint64_t pages_adopted;       /* cached prefix pages adopted from the previous run at start
	                               * (systemd's fd store; 0.3.0) */
	uint64_t pages_packed;        /* of pages_used: packed pages holding released pages' global layers
	                               * ([kv] release_local; 0.4.0, 0 from older daemons) */
	uint64_t pages_released;      /* pages windowed layers were done with, released (0.4.0) */
	uint64_t adopted_hit_tokens;  /* of prefix_hit_tokens: found in pages adopted from an earlier
	                               * run (fd store or hibernation file; 0.6.0, 0 from older daemons) */
	/* 0.8.0 (0 from older daemons): the struct grows from here, see kvc_stats_get() */
	uint64_t gram_checked;        /* constrained tokens the greedy check alone answered */
	uint64_t gram_masked;         /* constrained tokens drawn over a full mask of allowed tokens */
	/* 0.9.0 (0 from older daemons): speculative decoding. Decodes that
	 * carried a draft (verify steps), draft tokens scored, of those the
	 * ones accepted, and the verify steps by the run of drafts they
	 * accepted (0, 1, 2-3, 4-7, 8-16). For a client that is not an
	 * administrator, its own uid's finished requests'. */
	uint64_t spec_verify_steps;
	uint64_t spec_drafted_tokens;
	uint64_t spec_accepted_tokens;
	uint64_t spec_runs_0, spec_runs_1, spec_runs_2_3, spec_runs_4_7, spec_runs_8_16;
	/* since 0.10.0 (0 from older daemons) */
	uint64_t spec_mode;              /* 1 off, 2 lookup, 3 draft, 4 auto (kvc_spec_mode_name); 0: not said */
	uint64_t spec_draft_pages_total; /* the draft model's KV pool in pages; 0: none loaded */
	uint64_t spec_draft_pages_used;  /* of those, held by draft sequences */
	uint64_t spec_draft_reclaims;    /* draft sequences given up to an owner under its share of that pool */
};
KVC_EXPORT int kvc_stats(kvc_client *c, struct kvc_stats *ret);
/*
 * kvc_stats() for a struct kvc_stats of size bytes (sizeof as the caller
 * was compiled): fills min(size, the library's sizeof(struct kvc_stats))
 * bytes of *ret, counters the daemon does not send as 0, and leaves bytes
 * past the library's struct untouched. kvc_stats() is a macro over it
 * (0.8.0), so a program built with a newer header than the library it runs
 * with, or an older one, gets the fields both know; the kvc_stats symbol
 * itself fills 0.7.0's struct, for programs built before the macro.
 * -EINVAL when size is 0 or not a multiple of 8; else as kvc_stats().
 */
KVC_EXPORT int kvc_stats_get(kvc_client *c, struct kvc_stats *ret, size_t size);
#define kvc_stats(c, ret) kvc_stats_get((c), (ret), sizeof(*(ret)))

enum kvc_req_state {
	KVC_REQ_WAITING = 1,
	KVC_REQ_PREFILL = 2,
	KVC_REQ_RUNNING = 3,
	KVC_REQ_SWAPPED = 4,
	KVC_REQ_UPLOADING = 5,
};
/* "waiting", "prefill", "running", "swapped", "uploading", "?"; static. */
KVC_EXPORT const char *kvc_req_state_name(int state);

/* One live request in the daemon (see kvc_ps for whose). */
struct kvc_ps_entry {
	uint64_t request_id;          /* the owning client's id for it */
	uint64_t client_id;           /* that client's kvc_info.client_id */
	uint64_t session_id;
	uint64_t age_ns;
	uint32_t pid;                 /* of the client process */
	uint32_t uid;
	uint32_t state;               /* enum kvc_req_state */
	uint32_t pages;               /* KV pages in its page table */
	uint32_t pages_shared;        /* of those, shared with other sequences */
	uint32_t prompt_tokens;
	uint32_t cached_tokens;
	uint32_t generated_tokens;
	uint32_t max_tokens;
	uint32_t sample;              /* which sample of its request (since 0.3.0; see n_samples) */
	uint64_t reserved[4];
};
/* The daemon's live requests: *ret_entries (kvc_free) holds *ret_n entries.
 * Every user's for root and members of the daemon's server.admin_groups;
 * for anyone else only the requests of their own uid. */
KVC_EXPORT int kvc_ps(kvc_client *c, struct kvc_ps_entry **ret_entries, size_t *ret_n);

/* Round trip to the daemon; *ret_rtt_ns (may be NULL) gets its duration. */
KVC_EXPORT int kvc_ping(kvc_client *c, uint64_t *ret_rtt_ns);

/* ---- the KV map ------------------------------------------------------------------------ */

/*
 * The daemon's page pool, page by page, for pictures of it (kvctl stats
 * --map). kvc_kvmap_open() asks the daemon for its KV manager's metadata
 * (a memfd the daemon keeps up to date and hands out sealed read-only) and
 * maps it; kvc_kvmap_read() then copies a consistent snapshot without any
 * message to the daemon and without ever making it wait, as often as the
 * caller likes. The map stays valid after kvc_close() (it then shows the
 * pool as it was when the daemon's connection ended, or until the daemon
 * exits). Everyone may open it, as everyone may read kvc_stats(): it shows
 * the state of each page, never whose it is.
 *
 * Returns 0; -EOPNOTSUPP when the daemon is older than the map or cannot
 * seal it; -EPROTO when what it sent does not describe a sane sealed file;
 * -ENOMEM; the errors of a control call.
 */
typedef struct kvc_kvmap kvc_kvmap;
KVC_EXPORT int kvc_kvmap_open(kvc_client *c, kvc_kvmap **ret);
/* Unmap; accepts NULL; returns NULL. */
KVC_EXPORT kvc_kvmap *kvc_kvmap_close(kvc_kvmap *m);

struct kvc_kvmap_info {
	uint32_t n_pages;             /* pages in the pool (cells of the map) */
	uint32_t block_size;          /* tokens per page */
	uint64_t page_bytes;
	uint32_t swap_slots;          /* pages the swap file holds at most (0: no swap) */
	uint32_t reserved0;
	uint64_t reserved[4];
};
/* Valid until kvc_kvmap_close(); never NULL. */
KVC_EXPORT const struct kvc_kvmap_info *kvc_kvmap_info(const kvc_kvmap *m);

/* A page's state in kvc_kvmap_read()'s pages[]: a number of sequences
 * mapping it (1: private, >= 2: shared), or one of these. (0, a page in
 * between, is never part of a consistent snapshot: a reader that shows one
 * has found a bug.) */
#define KVC_PAGE_FREE   UINT32_MAX          /* on the free list */
#define KVC_PAGE_CACHED (UINT32_MAX - 1)    /* unused, kept on the LRU for prefix reuse */

struct kvc_kvmap_counts {
	uint32_t pages_free;
	uint32_t pages_private;       /* mapped by one sequence */
	uint32_t pages_shared;        /* by two or more */
	uint32_t pages_cached;
	uint32_t pages_swapped;       /* pages in the swap file, demoted ones included (kvc_stats) */
	uint32_t pages_demoted;       /* of those, cached prefix pages (a cache tier) */
	uint32_t refcount_max;        /* the most sequences any page has */
	uint32_t reserved0;
	uint64_t reserved[4];
};
/*
 * Copy one consistent snapshot: pages (may be NULL) gets
 * kvc_kvmap_info()->n_pages states, *ret (may be NULL) the counts, which
 * add up to n_pages (free + private + shared + cached) and equal
 * kvc_stats()' for the same moment. Returns 0, or -EAGAIN when the daemon
 * changed the pool during every one of many tries (it never waits for a
 * reader; try again).
 */
KVC_EXPORT int kvc_kvmap_read(kvc_kvmap *m, uint32_t *pages, struct kvc_kvmap_counts *ret);

/* ---- latency histograms --------------------------------------------------------------- */

#define KVC_HIST_MAX_BOUNDS 24
struct kvc_histogram {
	uint32_t n_bounds;            /* finite upper bounds */
	uint32_t reserved0;
	uint64_t count;               /* samples */
	uint64_t sum_ns;              /* their sum */
	uint64_t bound_ns[KVC_HIST_MAX_BOUNDS];    /* increasing, n_bounds of them */
	uint64_t bucket[KVC_HIST_MAX_BOUNDS + 1];  /* samples in (bound[i-1], bound[i]]; [n_bounds]: above */
};
struct kvc_histograms {
	struct kvc_histogram ttft;    /* arrival -> first token, one sample per request that produced one */
	struct kvc_histogram itl;     /* inter-token latency: one sample per token after a request's first */
	uint64_t reserved[8];
};
/* The daemon's histograms since it started. -EOPNOTSUPP from a daemon older
 * than them. */
KVC_EXPORT int kvc_histograms(kvc_client *c, struct kvc_histograms *ret);

/* ---- the per-request ledger ----------------------------------------------------------- */

struct kvc_ledger_record {
	uint32_t uid;                 /* of the requester */
	uint32_t len;                 /* of json */
	const char *json;             /* one JSON object, as in the daemon's ledger file; NUL-terminated */
};
/*
 * The last max_records (0: all the daemon keeps, up to 1024 since it
 * started) per-request ledger records, oldest first: every user's for root
 * and members of the daemon's server.admin_groups, for anyone else only
 * their own uid's; at most 512 KiB of them (the newest that fit). *ret_records (one block: kvc_free) holds *ret_n.
 * -EOPNOTSUPP from a daemon older than this call; -E2BIG for max_records
 * over 1024.
 */
KVC_EXPORT int kvc_ledger(kvc_client *c, unsigned max_records, struct kvc_ledger_record **ret_records,
			  size_t *ret_n);

/* ---- the prefix cache, for administrators ------------------------------------------------ */

/* What kvc_cache_save / kvc_cache_drop did. */
struct kvc_cache_result {
	uint64_t pages;        /* save: pages written to the file; drop: cached pages dropped */
	uint64_t candidates;   /* save: cached pages there were to write (the rest was past
	                        * [kv] persist_size or persist_timeout) */
	uint64_t bytes;        /* save: bytes of the file */
	uint64_t ns;           /* time the daemon took */
	uint32_t timed_out;    /* save: 1 when [kv] persist_timeout stopped the writes */
	uint32_t file_removed; /* drop: 1 when a cache file was removed */
	uint64_t reserved[2];
};
/*
 * Write the daemon's cache file ([kv] persist_path) now, while it serves,
 * as it does at a clean stop: hottest pages first, up to [kv] persist_size,
 * replacing the file only once the new one is complete. A later start
 * adopts it even after a crash. Blocks while the daemon writes (its other
 * requests wait meanwhile). For root and members of [server] admin_groups:
 * KVC_ERR_DENIED for anyone else; -EOPNOTSUPP when no persist_path is set,
 * with prefix caching off or the pool in device memory, and from a daemon
 * older than this call; kvc_last_message() has the daemon's words.
 */
KVC_EXPORT int kvc_cache_save(kvc_client *c, struct kvc_cache_result *ret);
/*
 * Empty the prefix cache: every cached page no request is using is dropped
 * (pages of running requests stay theirs), every user's, and the cache file
 * is removed, so neither this run nor the next start serves them again.
 * Errors as for kvc_cache_save (dropping works without a persist_path).
 */
KVC_EXPORT int kvc_cache_drop(kvc_client *c, struct kvc_cache_result *ret);

/* Release memory returned by this library; accepts NULL. */
KVC_EXPORT void kvc_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* KVCLIENT_H */
