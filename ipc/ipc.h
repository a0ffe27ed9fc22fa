/*
 * ipc/ipc.h — kvd's wire protocol: framing over a Unix SOCK_SEQPACKET
 * socket, a private shared-memory channel per client (two single-producer
 * single-consumer byte rings in a sealed memfd, woken through a datagram
 * socket pair),
 * fd passing and peer credentials.
 *
 * Both ends use this header: the daemon's server (an epoll loop) and
 * libkvclient. Nothing here knows about models or the KV cache; payloads
 * carry plain numbers and text.
 *
 * ---- Framing --------------------------------------------------------------
 *
 * A message is one datagram on the socket, or one record in a ring:
 *
 *     struct ipc_hdr (24 bytes) | payload (hdr.length bytes)
 *
 * Integers and floats are in the host's native byte order and format: the
 * protocol is local to one machine (a Unix socket and shared memory), so
 * both ends always agree. Payload structs have explicit sizes and no
 * implicit padding (static_assert in ipc/frame.c); variable parts follow
 * the fixed struct, unpadded. Every field is validated against the named
 * limits below before anyone acts on it: the peer may be hostile.
 *
 * ---- Conversation ---------------------------------------------------------
 *
 *   client                                   server
 *   HELLO  ------------------ socket ----->
 *          <----------------- socket ------  WELCOME  + 2 fds (memfd,
 *                                            client end of the wake-up pair)
 *   GENERATE (prompt inline) -- socket --->
 *     or GENERATE (IPC_GEN_PROMPT_IN_RING) on the socket and its text as
 *     PROMPT_DATA records on the client->server ring
 *          <------------------ ring -------  TOKEN, TOKEN, ..., DONE
 *   CANCEL ------------------ socket ----->  (DONE with IPC_FINISH_CANCELLED)
 *   STATS / TOKENIZE / SESSION_* / PS / PING / KVMAP / HIST / LEDGER on the
 *   socket; each reply on the socket carries the request's id.
 *
 * Request ids are chosen by the client: non-zero, unique among its live
 * requests (a counter is enough). 0 means "the connection": an ERROR with
 * request id 0 is about the connection, which the server then closes.
 *
 * Ordering rules the two ends rely on:
 *  - A GENERATE's stream events (TOKEN..., then exactly one terminal DONE
 *    or ERROR) travel through the server->client ring, in order. The
 *    server may instead answer a GENERATE it rejects before producing any
 *    event with one ERROR frame on the socket. Before acting on a terminal
 *    socket frame for a request, the client drains the ring (the server
 *    pushes ring records before it sends a socket frame, so everything
 *    earlier is visible by then).
 *  - Text uploads (GENERATE or TOKENIZE with the *_IN_RING flag) are
 *    consumed by the server in the order of their socket frames: the
 *    client finishes one upload before it sends the next frame announcing
 *    another. PROMPT_DATA records carry the request id and byte offset;
 *    the server checks both. The server consumes exactly the announced
 *    number of bytes for every upload it accepted, even if it then rejects
 *    or cancels the request, so the ring stays in step. The server pops
 *    upload records only while an accepted upload is incomplete.
 *  - CANCEL of an unknown or finished request is ignored (no reply).
 *
 * ---- Rings and wake-ups ---------------------------------------------------
 *
 * See ipc_ring_* below. A side never sleeps on a ring without first
 * announcing it in the ring's waiting flag, and the other side sends the
 * sleeper a wake-up only when it sees the flag set: no system call per
 * record while both sides are busy, and no lost wake-up (the protocol is
 * proved in ipc/ring.c). Nothing spins.
 *
 * Wake-ups travel over an AF_UNIX SOCK_DGRAM socket pair, not a shared
 * eventfd: the daemon keeps its end, so it alone holds that open file
 * description, and the client's end is a different one. File status flags
 * (O_NONBLOCK) live in the description, so nothing a client does to the
 * fds it received can turn a daemon-side call into a blocking one; on top
 * of that every daemon-side send and receive on a socket a client can
 * reach passes MSG_DONTWAIT, which holds per call whatever the flags are.
 * A datagram pair (not SEQPACKET) because a client's shutdown() of its
 * end does not reach the daemon's end, so it cannot make it hang up or
 * report end of file forever. (Protocol version 1 handed over the
 * daemon's own eventfds; a client clearing O_NONBLOCK on them and filling
 * the counter blocked the daemon's write, and with it every client.)
 *
 * ---- Conventions ----------------------------------------------------------
 *
 * Functions return >= 0 on success and a negative errno value on failure;
 * ret_* outputs are untouched on failure unless a contract says otherwise.
 * No function logs, takes a global lock or keeps global state: any number
 * of threads may use distinct objects. One struct ipc_ring or ipc_chan is
 * used by one thread at a time.
 *
 * Validation errors, used consistently:
 *   -EBADMSG          malformed: bad magic, short header, hdr.length not
 *                     matching the bytes received, payload too short or its
 *                     inner lengths inconsistent, missing fds
 *   -EPROTONOSUPPORT  hdr.version is not IPC_PROTO_VERSION
 *   -ENOMSG           unknown message type
 *   -EPROTO           a known type where it may not appear (wrong direction
 *                     or wrong transport), unknown flag bits, non-zero
 *                     reserved fields, a ring whose indices are corrupt
 *   -E2BIG            a frame, text or count beyond its named limit
 *   -ETOOMANYREFS     more fds than the message type carries
 *   -EINVAL           a value out of its range (NaN temperature, ...)
 */
#ifndef KVD_IPC_H
#define KVD_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* ---- constants and limits ----------------------------------------------- */

#define IPC_MAGIC            0x3144564bu /* bytes "KVD1" in a little-endian dump */
#define IPC_PROTO_VERSION    2 /* 2: WELCOME hands over a wake-up socket, not eventfds */

#define IPC_HDR_BYTES        24u
#define IPC_MAX_FRAME_BYTES  65536u      /* header + payload, socket and ring */
#define IPC_MAX_PAYLOAD_BYTES (IPC_MAX_FRAME_BYTES - IPC_HDR_BYTES)
#define IPC_MAX_FDS          2u          /* most fds one frame carries (WELCOME) */

#define IPC_MAX_TEXT_BYTES       (16u << 20) /* prompt or tokenize text, total */
#define IPC_MAX_INLINE_TEXT_BYTES 32768u     /* text carried inside the socket frame */
#define IPC_MAX_SYSTEM_BYTES     16384u      /* chat system prompt (always inline) */
#define IPC_MAX_STOP_STRINGS     8u
#define IPC_MAX_STOP_BYTES       256u        /* each stop string, 1 .. this */
#define IPC_MAX_GEN_TOKENS       (1u << 20)  /* max_tokens of one request */
#define IPC_MAX_TOP_K            (1 << 20)
#define IPC_MAX_REPEAT_LAST_N    (1 << 20)
#define IPC_MAX_TEMPERATURE      100.0f
#define IPC_MAX_REPEAT_PENALTY   100.0f
#define IPC_MAX_TOKENS_PER_RECORD 256u       /* tokens one TOKEN record covers */
#define IPC_MAX_TOKEN_TEXT_BYTES 4096u       /* text bytes in one TOKEN record */
#define IPC_MAX_ERROR_MSG_BYTES  512u
#define IPC_MAX_SAMPLES          16u         /* samples of one GENERATE (ipc_generate.n_samples) */
#define IPC_MAX_TOP_LOGPROBS     20u         /* alternatives per token (ipc_generate.top_logprobs) */
#define IPC_MAX_PIECE_BYTES      128u        /* bytes of one token's text in a log-probability entry */
#define IPC_MODEL_NAME_BYTES     64u         /* NUL-padded field */
#define IPC_MODEL_ID_BYTES       32u         /* NUL-padded field (ipc_welcome.model_id) */
#define IPC_CHAT_FORMAT_BYTES    16u         /* NUL-padded field (ipc_welcome.chat_format) */
#define IPC_CLIENT_NAME_BYTES    32u         /* NUL-padded field */
/* Token ids in one TOKENIZE_REPLY frame, PS entries in one PS_REPLY. */
#define IPC_MAX_IDS_PER_FRAME    ((IPC_MAX_PAYLOAD_BYTES - 16u) / 4u)
#define IPC_MAX_PS_PER_FRAME     ((IPC_MAX_PAYLOAD_BYTES - 8u) / 72u)

/* Shared-memory channel. Ring capacities are powers of two in this range. */
#define IPC_RING_MIN_BYTES       16384u
#define IPC_RING_MAX_BYTES       (64u << 20)
#define IPC_RING_DEFAULT_C2S_BYTES (1u << 20)   /* client -> server: prompts */
#define IPC_RING_DEFAULT_S2C_BYTES (256u << 10) /* server -> client: tokens */
#define IPC_RING_CTL_BYTES       128u  /* shared control block of one ring */
#define IPC_RING_ALIGN           8u    /* record alignment inside a ring */

/* Seed meaning "let the server choose one". */
#define IPC_SEED_RANDOM          UINT64_MAX

/* ---- error codes beyond errno (negative on the wire and in returns) ------ */

#define IPC_ERR_BASE      1000
#define IPC_ERR_VERSION   (-1001) /* protocol version not supported by the peer */
#define IPC_ERR_CONTEXT   (-1002) /* prompt + max_tokens exceed the context window */
#define IPC_ERR_SHUTDOWN  (-1003) /* the daemon is shutting down */
#define IPC_ERR_LIMIT     (-1004) /* a per-client limit was reached (requests in flight, ...) */
#define IPC_ERR_ENGINE    (-1005) /* the model or compute backend failed */
#define IPC_ERR_SESSION   (-1006) /* unknown, expired or busy session */
#define IPC_ERR_DENIED    (-1007) /* this user or group may not use the daemon */
#define IPC_ERR_LAST      (-1007)
/* Codes accepted in ERROR frames and DONE.error: errno values -1 ..
 * -(IPC_ERR_BASE - 1) and the kvd codes IPC_ERR_LAST .. -(IPC_ERR_BASE + 1). */
bool ipc_error_code_valid(int32_t code);

/* ---- header and message types -------------------------------------------- */

struct ipc_hdr {
	uint32_t magic;      /* IPC_MAGIC */
	uint16_t version;    /* IPC_PROTO_VERSION */
	uint16_t type;       /* enum ipc_type */
	uint32_t length;     /* payload bytes after the header */
	uint32_t flags;      /* IPC_F_*; bits a type does not define must be 0 */
	uint64_t request_id; /* chosen by the client; 0 = the connection */
};

/* Header flags. */
#define IPC_F_MORE 0x1u /* TOKENIZE_REPLY, PS_REPLY: more frames follow */
#define IPC_F_SAMPLE 0x2u /* TOKEN, DONE: a struct ipc_sample follows the fixed struct */
#define IPC_F_SPEC   0x4u /* DONE: a struct ipc_done_spec follows (after the struct ipc_sample, if any) */

/* Where a message may travel (checked by ipc_frame_check). */
#define IPC_FROM_CLIENT 0x1u
#define IPC_FROM_SERVER 0x2u
#define IPC_VIA_SOCKET  0x4u
#define IPC_VIA_RING    0x8u

enum ipc_type {
	IPC_MSG_HELLO = 1,           /* c->s socket  struct ipc_hello */
	IPC_MSG_WELCOME = 2,         /* s->c socket  struct ipc_welcome + 2 fds */
	IPC_MSG_GENERATE = 3,        /* c->s socket  struct ipc_generate + system + stops + [prompt] */
	IPC_MSG_PROMPT_DATA = 4,     /* c->s ring    struct ipc_prompt_data + bytes */
	IPC_MSG_TOKEN = 5,           /* s->c ring    struct ipc_token + ids + text */
	IPC_MSG_DONE = 6,            /* s->c ring    struct ipc_done */
	IPC_MSG_CANCEL = 7,          /* c->s socket  empty */
	IPC_MSG_ERROR = 8,           /* s->c socket or ring: struct ipc_error + message */
	IPC_MSG_STATS = 9,           /* c->s socket  empty */
	IPC_MSG_STATS_REPLY = 10,    /* s->c socket  struct ipc_stats */
	IPC_MSG_TOKENIZE = 11,       /* c->s socket  struct ipc_tokenize + [text] */
	IPC_MSG_TOKENIZE_REPLY = 12, /* s->c socket  struct ipc_tokenize_reply + ids; IPC_F_MORE */
	IPC_MSG_SESSION_OPEN = 13,   /* c->s socket  struct ipc_session_open */
	IPC_MSG_SESSION_OPENED = 14, /* s->c socket  struct ipc_session */
	IPC_MSG_SESSION_CLOSE = 15,  /* c->s socket  struct ipc_session */
	IPC_MSG_SESSION_CLOSED = 16, /* s->c socket  struct ipc_session */
	IPC_MSG_PING = 17,           /* c->s socket  struct ipc_ping */
	IPC_MSG_PONG = 18,           /* s->c socket  struct ipc_ping (echoed) */
	IPC_MSG_PS = 19,             /* c->s socket  empty */
	IPC_MSG_PS_REPLY = 20,       /* s->c socket  struct ipc_ps_reply + entries; IPC_F_MORE;
				      * all users' requests for administrators, else the caller's uid's */
	IPC_MSG_KVMAP = 21,          /* c->s socket  empty */
	IPC_MSG_KVMAP_REPLY = 22,    /* s->c socket  struct ipc_kvmap + 1 fd (the KV map memfd, read-only) */
	IPC_MSG_HIST = 23,           /* c->s socket  empty */
	IPC_MSG_HIST_REPLY = 24,     /* s->c socket  struct ipc_hist_reply */
	IPC_MSG_LEDGER = 25,         /* c->s socket  struct ipc_ledger_req */
	IPC_MSG_LEDGER_REPLY = 26,   /* s->c socket  struct ipc_ledger_reply + records; IPC_F_MORE;
				      * all users' records for administrators, else the caller's uid's */
	IPC_MSG_CACHE = 27,          /* c->s socket  struct ipc_cache_req (administrators only) */
	IPC_MSG_CACHE_REPLY = 28,    /* s->c socket  struct ipc_cache_reply */
	IPC_MSG_TYPE_MAX = 28,
};

/* Name of a type for logs ("GENERATE"), "?" when unknown. Never NULL. */
const char *ipc_type_name(uint32_t type);

/* ---- payloads ------------------------------------------------------------ */

#include "ipc_welcome.h" /* HELLO and WELCOME: capabilities, versions, the model's description */

/* GENERATE flags (struct ipc_generate.gen_flags). */
#define IPC_GEN_RAW            0x1u /* complete the text as given; default: chat template */
#define IPC_GEN_WANT_IDS       0x2u /* TOKEN records carry token ids */
#define IPC_GEN_PROMPT_IN_RING 0x4u /* prompt follows as PROMPT_DATA records */
#define IPC_GEN_PARSE_SPECIAL  0x8u /* with IPC_GEN_RAW: special-token texts become special tokens */
#define IPC_GEN_CHAT_TURNS     0x10u /* the prompt is a list of chat turns (see below) */
#define IPC_GEN_LOGPROBS       0x20u /* TOKEN records carry log-probabilities (ipc_samples.h) */
#define IPC_GEN_CONTEXT        0x40u /* a struct ipc_gen_context follows the stop area */
#define IPC_GEN_TENANT         0x80u /* a struct ipc_gen_tenant follows (ipc_owner.h) */
#define IPC_GEN_PRIORITY       0x100u /* a struct ipc_gen_priority follows (ipc_owner.h) */
#define IPC_GEN_CONSTRAINT     0x200u /* a struct ipc_gen_constraint follows (ipc_owner.h) */
#define IPC_GEN_NO_SPECULATE   0x400u /* no speculative decoding for this request (IPC_SPEC_VERSION) */
#define IPC_GEN_ALL            0x7ffu

struct ipc_generate {
	uint32_t gen_flags;       /* IPC_GEN_* */
	uint32_t max_tokens;      /* 1 .. IPC_MAX_GEN_TOKENS */
	float temperature;        /* 0 (greedy) .. IPC_MAX_TEMPERATURE */
	float top_p;              /* (0, 1]; 1 = off */
	float min_p;              /* [0, 1); 0 = off */
	float repeat_penalty;     /* (0, IPC_MAX_REPEAT_PENALTY]; 1 = off */
	int32_t top_k;            /* 0 (off) .. IPC_MAX_TOP_K */
	int32_t repeat_last_n;    /* 0 .. IPC_MAX_REPEAT_LAST_N */
	uint64_t seed;            /* IPC_SEED_RANDOM: server's choice */
	uint64_t session_id;      /* 0: none */
	uint32_t prompt_bytes;    /* 0 .. IPC_MAX_TEXT_BYTES (inline: .. IPC_MAX_INLINE_TEXT_BYTES) */
	uint32_t system_bytes;    /* 0 .. IPC_MAX_SYSTEM_BYTES; chat mode only */
	uint16_t n_stop;          /* 0 .. IPC_MAX_STOP_STRINGS */
	uint8_t n_samples;        /* 0 or 1: one sample; 2 .. IPC_MAX_SAMPLES (ipc_samples.h) */
	uint8_t top_logprobs;     /* 0 .. IPC_MAX_TOP_LOGPROBS alternatives; only with IPC_GEN_LOGPROBS */
	uint32_t stop_bytes;      /* size of the stop area: per string u16 length + bytes */
};
/* Payload: struct ipc_generate | system text | stop area | [struct ipc_gen_context
 * with IPC_GEN_CONTEXT] | [struct ipc_gen_tenant with IPC_GEN_TENANT] |
 * [struct ipc_gen_priority with IPC_GEN_PRIORITY] | [struct ipc_gen_constraint
 * with IPC_GEN_CONSTRAINT] | prompt (inline only) | [constraint text, inline
 * only; with IPC_GEN_PROMPT_IN_RING it is uploaded after the prompt]. */

/* Tenant, priority and constraint blocks: ipc_owner.h. */
#include "ipc_owner.h"

/* Context policies: struct ipc_gen_context and its helpers. */
#include "ipc_context.h"

/* Chat turns (IPC_GEN_CHAT_TURNS): ipc_chat.h. */
#include "ipc_chat.h"

struct ipc_prompt_data {
	uint32_t offset;          /* of these bytes within the upload */
	uint32_t bytes;           /* >= 1; the record's remaining payload */
};

struct ipc_token {
	uint32_t index;           /* position of the first token in the generation */
	uint32_t n_tokens;        /* 1 .. IPC_MAX_TOKENS_PER_RECORD */
	uint32_t n_ids;           /* 0, or n_tokens when IPC_GEN_WANT_IDS was set */
	uint32_t text_bytes;      /* 0 .. IPC_MAX_TOKEN_TEXT_BYTES */
};
/* With IPC_F_SAMPLE (samples, log-probabilities: ipc_samples.h) this follows
 * struct ipc_token (and struct ipc_done). */
struct ipc_sample {
	uint32_t sample;          /* 0 .. IPC_MAX_SAMPLES - 1 */
	uint16_t n_top;           /* TOKEN: alternatives per token, 0 .. IPC_MAX_TOP_LOGPROBS; DONE: 0 */
	uint16_t lp_flags;        /* TOKEN: IPC_LP_*; DONE: 0 */
};
/* Payload: struct ipc_token | int32 ids[n_ids] | text. Text is the
 * detokenized output; a partial UTF-8 character may be held back until a
 * later record, and text already checked against stop strings. */

enum ipc_finish {
	IPC_FINISH_EOS = 1,       /* the model ended its turn */
	IPC_FINISH_LENGTH = 2,    /* max_tokens reached */
	IPC_FINISH_STOP = 3,      /* a stop string matched (not included in the text) */
	IPC_FINISH_CANCELLED = 4, /* CANCEL, or the client went away */
	IPC_FINISH_ERROR = 5,     /* see ipc_done.error */
};
const char *ipc_finish_name(uint32_t reason); /* "eos", ..., "?" */

struct ipc_done {
	uint32_t finish_reason;   /* enum ipc_finish */
	int32_t error;            /* 0, or a valid error code with IPC_FINISH_ERROR */
	uint32_t prompt_tokens;   /* after templating */
	uint32_t cached_tokens;   /* of those, found in the prefix cache or session */
	uint32_t generated_tokens;
	uint32_t context_dropped_tokens; /* dropped by the request's context policy:
	                                  * the turns truncate-oldest removed, or the
	                                  * tokens (a session's history included) a
	                                  * window left behind; 0 under IPC_CTX_ERROR */
	uint64_t queue_ns;        /* received -> admitted */
	uint64_t ttft_ns;         /* received -> first token produced */
	uint64_t decode_ns;       /* first token -> last token */
	uint64_t total_ns;        /* received -> finished */
};

#include "ipc_spec.h" /* speculative decoding: DONE's IPC_F_SPEC block, IPC_SPEC_VERSION */

struct ipc_error {
	int32_t code;             /* ipc_error_code_valid() */
	uint32_t msg_bytes;       /* 0 .. IPC_MAX_ERROR_MSG_BYTES, no NUL on the wire */
};
/* Payload: struct ipc_error | message. */

/* Pool and scheduler counters. Key names match `kvctl stats --json`. */
struct ipc_stats {
	uint64_t pages_total;
	uint64_t pages_free;
	uint64_t pages_used;          /* referenced by at least one sequence */
	uint64_t pages_shared;        /* referenced by two or more */
	uint64_t pages_cached;        /* unreferenced, kept by the prefix index */
	uint64_t pages_swapped;       /* pages' worth of content in the swap file */
	uint64_t page_bytes;
	uint64_t block_size;
	uint64_t kv_bytes_per_token;
	uint64_t pool_bytes;
	uint64_t tokens_resident;     /* tokens whose K/V are in the pool */
	uint64_t slack_tokens;        /* allocated but unused token slots in partial pages */
	uint64_t prefix_lookups;
	uint64_t prefix_query_tokens;
	uint64_t prefix_hit_tokens;
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
	uint64_t steps;
	uint64_t uptime_ns;
	uint64_t ledger_records_dropped; /* ledger records that could not be written */
	uint64_t swap_errors;         /* swap page transfers that failed (I/O error, short, full) */
	uint64_t swap_fallback_recomputes; /* requests' KV recomputed because swap I/O failed */
	uint64_t pages_demoted;       /* of pages_swapped: cached prefix pages kept in swap (a cache tier) */
	uint64_t samples_forked;      /* sequences forked from a prompt for parallel samples */
	uint64_t pages_adopted;       /* cached prefix pages adopted from the previous run at start */
	/* since IPC_RELEASE_SERVER_VERSION (zero for older clients, whose reserved fields they are) */
	uint64_t pages_packed;        /* of pages_used: packed pages holding released pages' global layers */
	uint64_t pages_released;      /* pages windowed layers were done with, released ([kv] release_local) */
	/* since IPC_CACHE_SERVER_VERSION (zero for older clients: their reserved field) */
	uint64_t adopted_hit_tokens;  /* of prefix_hit_tokens: on pages adopted from an earlier run */
	/* The reply grows from here (IPC_STATS_GROW_VERSION): the fields below
	 * are sent only to clients of that version or later. */
	uint64_t gram_checked;        /* constrained tokens the greedy check alone answered (fast path) */
	uint64_t gram_masked;         /* constrained tokens drawn over a full mask of allowed tokens */
	uint64_t spec_verify_steps, spec_drafted_tokens, spec_accepted_tokens; /* IPC_SPEC_VERSION: ipc_spec.h */
	uint64_t spec_runs_0, spec_runs_1, spec_runs_2_3, spec_runs_4_7, spec_runs_8_16;
	/* IPC_SPEC_DRAFT_STATS_VERSION (ipc_spec.h; 0 from older daemons): the drafter and its pool */
	uint64_t spec_mode, spec_draft_pages_total, spec_draft_pages_used, spec_draft_reclaims;
};
/*
 * STATS_REPLY's length. Up to kvd 0.7.0 the reply was exactly
 * IPC_STATS_V070_BYTES (its reserved fields since filled). From
 * IPC_STATS_GROW_VERSION on it may be any multiple of 8 bytes from
 * IPC_STATS_V070_BYTES to IPC_MAX_STATS_BYTES, new counters appended at its
 * end: a reader takes the fields it knows that the reply holds, and reads
 * the ones the reply is too short for as 0 (ipc_decode_stats). The daemon
 * sends a client older than IPC_STATS_GROW_VERSION exactly
 * IPC_STATS_V070_BYTES, which is all such a client accepts.
 */
#define IPC_STATS_GROW_VERSION ((0u << 16) | (8u << 8) | 0u) /* kvd 0.8.0 */
#define IPC_STATS_V070_BYTES   ((uint32_t)offsetof(struct ipc_stats, gram_checked))
#define IPC_MAX_STATS_BYTES    4096u

/*
 * The KV element types on the wire, the list libkvclient and its programs
 * know them by: X(kv_type, name, block_elems, block_bytes), kv_type being
 * WELCOME's (enum kvd_kv_type + 1, whose values are fixed), block_elems
 * elements stored in block_bytes bytes. ipc sees no kernels header, so this
 * is the wire's own list; tests/unit/test_kvtypes.c checks that it and
 * kernels/backend.h's KVD_KV_TYPES agree row for row.
 */
#define IPC_KV_TYPES(X) \
	X(1, "f16", 1, 2) \
	X(2, "f32", 1, 4) \
	X(3, "q8_0", 32, 34) \
	X(4, "q4_0", 32, 18) \
	X(5, "bf16", 1, 2)

/* The name of a WELCOME kv_type, or NULL for 0 and types this build does
 * not know. */
static inline const char *ipc_kv_type_name(uint32_t kv_type)
{
#define IPC_KV_NAME_(v, name, be, bb) \
	case v: return name;
	switch (kv_type) { IPC_KV_TYPES(IPC_KV_NAME_) }
#undef IPC_KV_NAME_
	return NULL;
}
/* kvd 0.4.0: ipc_stats.pages_packed and .pages_released. */
#define IPC_RELEASE_SERVER_VERSION ((0u << 16) | (4u << 8) | 0u)

#define IPC_TOK_ADD_BOS       0x1u /* prepend BOS when the model has one */
#define IPC_TOK_PARSE_SPECIAL 0x2u /* match special-token texts */
#define IPC_TOK_COUNT_ONLY    0x4u /* reply carries the count, no ids */
#define IPC_TOK_TEXT_IN_RING  0x8u /* text follows as PROMPT_DATA records */
#define IPC_TOK_ALL           0xfu

struct ipc_tokenize {
	uint32_t tok_flags;       /* IPC_TOK_* */
	uint32_t text_bytes;      /* 0 .. IPC_MAX_TEXT_BYTES (inline: .. IPC_MAX_INLINE_TEXT_BYTES) */
};
/* Payload: struct ipc_tokenize | text (inline only). */

struct ipc_tokenize_reply {
	uint32_t n_tokens;        /* total for the text */
	uint32_t offset;          /* index of ids[0] within the whole */
	uint32_t n_ids;           /* in this frame, 0 .. IPC_MAX_IDS_PER_FRAME */
	uint32_t reserved0;
};
/* Payload: struct ipc_tokenize_reply | int32 ids[n_ids]. Frames of one
 * reply arrive in order; all but the last carry IPC_F_MORE. */

/*
 * Sessions. A session keeps one conversation's KV cache between GENERATEs
 * that name it (ipc_generate.session_id): each turn prefills only its new
 * text. It belongs to the user (SO_PEERCRED uid) that opened it, not to
 * the connection: any connection of that user may continue or close it,
 * so one-shot clients (kvctl generate --session ID) can hold a
 * conversation. It ends with SESSION_CLOSE or after idle_timeout_s
 * without use (the server may lower the value to its own bound). One turn
 * at a time: a GENERATE naming a session busy with another gets
 * IPC_ERR_SESSION, as does an unknown, expired or foreign id.
 */
#define IPC_SESSION_CONTEXT 0x1u /* a struct ipc_gen_context follows: the session's
				  * context policy (a turn's own block overrides it) */
struct ipc_session_open {
	uint32_t flags;           /* IPC_SESSION_* */
	uint32_t idle_timeout_s;  /* 0: the server's default */
};
/* Payload: struct ipc_session_open | [struct ipc_gen_context with IPC_SESSION_CONTEXT]. */

struct ipc_session {
	uint64_t session_id;      /* non-zero */
};

struct ipc_ping {
	uint64_t nonce;           /* echoed in PONG */
};

enum ipc_req_state {
	IPC_REQ_WAITING = 1,      /* queued, no pages yet */
	IPC_REQ_PREFILL = 2,
	IPC_REQ_RUNNING = 3,      /* decoding */
	IPC_REQ_SWAPPED = 4,
	IPC_REQ_UPLOADING = 5,    /* prompt still arriving */
};
const char *ipc_req_state_name(uint32_t state); /* "waiting", ..., "?" */

struct ipc_ps_entry {
	uint64_t request_id;      /* the client's id */
	uint64_t client_id;       /* as in that client's WELCOME */
	uint64_t session_id;
	uint64_t age_ns;          /* since the GENERATE arrived */
	uint32_t pid;             /* SO_PEERCRED of the client */
	uint32_t uid;
	uint32_t state;           /* enum ipc_req_state */
	uint32_t pages;           /* pages in its page table */
	uint32_t pages_shared;    /* of those, shared with other sequences */
	uint32_t prompt_tokens;
	uint32_t cached_tokens;
	uint32_t generated_tokens;
	uint32_t max_tokens;
	uint32_t sample;          /* sample index (ipc_samples.h); clients older than IPC_SAMPLES_SERVER_VERSION
				   * (HELLO) required 0 here: they get only sample 0's entries */
};

struct ipc_ps_reply {
	uint32_t n_total;         /* entries in the whole reply */
	uint32_t n_entries;       /* in this frame, 0 .. IPC_MAX_PS_PER_FRAME */
};
/* Payload: struct ipc_ps_reply | struct ipc_ps_entry[n_entries]. */

/* ---- frames -------------------------------------------------------------- */

/* A received, header-validated frame. payload points into the caller's
 * buffer; fds are owned by the caller once ipc_recv() succeeds. */
struct ipc_frame {
	struct ipc_hdr hdr;
	const uint8_t *payload;   /* hdr.length bytes */
	int fds[IPC_MAX_FDS];
	unsigned n_fds;
};

/*
 * Validate a whole message held in buf[0 .. n) that arrived with n_fds
 * descriptors, from the given side (IPC_FROM_CLIENT or IPC_FROM_SERVER)
 * over the given transport (IPC_VIA_SOCKET or IPC_VIA_RING): header magic,
 * version, length == n - IPC_HDR_BYTES <= IPC_MAX_PAYLOAD_BYTES, known
 * type, direction and transport allowed for the type, flag bits, the
 * type's fixed payload size (exact for fixed-size types, minimum for
 * variable ones) and fd count. Payload contents are checked by the
 * ipc_decode_*() functions. Returns 0 or one of the validation errors in
 * the file comment. On failure *ret_hdr (if not NULL) still receives the
 * header bytes when n >= IPC_HDR_BYTES (zeroes otherwise), so that a server
 * can echo request_id in its ERROR reply.
 */
int ipc_frame_check(const void *buf, size_t n, unsigned n_fds, unsigned from, unsigned via,
		    struct ipc_hdr *ret_hdr);

/*
 * Build a frame in buf[0 .. cap): header plus the concatenation of the
 * parts. Returns the frame's total size, -E2BIG when it exceeds cap or
 * IPC_MAX_FRAME_BYTES. Does not validate the payload.
 */
ssize_t ipc_frame_build(void *buf, size_t cap, uint16_t type, uint32_t flags, uint64_t request_id,
			const struct iovec *parts, int n_parts);

/* ---- socket transport ---------------------------------------------------- */

/*
 * Listen on a SOCK_SEQPACKET Unix socket at path ("@name" for the abstract
 * namespace). A stale socket file (nobody accepting) is replaced; a live
 * one gives -EADDRINUSE (the probe that found it live appears to that
 * daemon as a connection closed at once). mode != 0 is applied with
 * chmod(). The socket is
 * non-blocking and close-on-exec. Returns 0 and the fd, -ENAMETOOLONG, or
 * the errno of socket/bind/listen.
 */
int ipc_listen(const char *path, mode_t mode, int backlog, int *ret_fd);

/* accept4() a connection: non-blocking, close-on-exec. -EAGAIN when none
 * is pending; other accept errors as -errno. */
int ipc_accept(int listen_fd, int *ret_fd);

/* Connect to path ("@name": abstract). The fd is blocking and
 * close-on-exec. -ENOENT / -ECONNREFUSED / -EACCES when no daemon listens
 * or it is not ours to use, -ENAMETOOLONG. */
int ipc_connect(const char *path, int *ret_fd);

struct ipc_peer_cred {
	pid_t pid;
	uid_t uid;
	gid_t gid;
};
/* SO_PEERCRED of a connected socket (as of connect()). */
int ipc_peer_cred(int fd, struct ipc_peer_cred *ret);
/* SO_PEERGROUPS: the peer's supplementary groups. Writes up to cap ids and
 * sets *ret_n to the total; -ERANGE when cap was too small (then *ret_n
 * holds the size needed and nothing else is written). */
int ipc_peer_groups(int fd, gid_t *groups, size_t cap, size_t *ret_n);

/*
 * Send one frame: header built from the arguments, payload gathered from
 * iov (may be NULL with n_iov 0), fds passed with SCM_RIGHTS (duplicated
 * into the peer; still owned by the caller). MSG_NOSIGNAL: a vanished peer
 * gives -EPIPE, never SIGPIPE. Returns 0; -EAGAIN on a non-blocking socket
 * whose buffer is full (nothing sent: retry on EPOLLOUT); -E2BIG beyond
 * IPC_MAX_FRAME_BYTES; -EINVAL for n_fds > IPC_MAX_FDS; other -errno.
 * Interrupted sends are retried.
 */
int ipc_sendv(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const struct iovec *iov, int n_iov,
	      const int *fds, unsigned n_fds);
/* ipc_sendv() with one contiguous payload. */
int ipc_send(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const void *payload, size_t len,
	     const int *fds, unsigned n_fds);
/* An ERROR frame: code (ipc_error_code_valid) and a message, truncated to
 * IPC_MAX_ERROR_MSG_BYTES (msg may be NULL). */
int ipc_send_error(int fd, uint64_t request_id, int32_t code, const char *msg);

/*
 * Receive one frame into buf (cap >= IPC_MAX_FRAME_BYTES, 8-byte aligned;
 * else -EINVAL) and validate it with ipc_frame_check(from, IPC_VIA_SOCKET).
 * Returns 0 with *ret filled (fds received with MSG_CMSG_CLOEXEC, now the
 * caller's); -EAGAIN when a non-blocking socket has nothing; -ECONNRESET
 * when the peer closed the connection (end of file) or reset it; -E2BIG
 * for a datagram longer than IPC_MAX_FRAME_BYTES (discarded by the kernel:
 * the connection stays usable); -ETOOMANYREFS when the control data was
 * truncated; any validation error. On every failure, fds that arrived are
 * closed, ret->n_fds is 0, and ret->hdr holds the header as in
 * ipc_frame_check() (the one documented exception to "untouched on
 * failure"). Interrupted receives are retried.
 */
int ipc_recv(int fd, void *buf, size_t cap, unsigned from, struct ipc_frame *ret);

/* The same four with MSG_DONTWAIT on every call: they never block,
 * whatever the socket's file status flags say (-EAGAIN instead). The
 * daemon uses only these, so that its event loop cannot be made to wait
 * on a socket by anything a client does. */
int ipc_sendv_nowait(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const struct iovec *iov,
		     int n_iov, const int *fds, unsigned n_fds);
int ipc_send_nowait(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const void *payload, size_t len,
		    const int *fds, unsigned n_fds);
int ipc_send_error_nowait(int fd, uint64_t request_id, int32_t code, const char *msg);
int ipc_recv_nowait(int fd, void *buf, size_t cap, unsigned from, struct ipc_frame *ret);

/* Close the frame's fds (those the caller did not take) and zero n_fds. */
void ipc_frame_close_fds(struct ipc_frame *f);

/* ---- payload decoders ------------------------------------------------------
 *
 * Each checks the payload of a frame already passed by ipc_frame_check()
 * (type asserted) and returns 0 with *ret filled — pointers into the
 * frame's payload, valid as long as its buffer — or a validation error.
 * Strings pointed to are not NUL-terminated unless stated; lengths are
 * given. Copy the payload before decoding when it lives in shared memory
 * (ipc_chan_recv does).
 */

int ipc_decode_hello(const struct ipc_frame *f, struct ipc_hello *ret);
/* Checks limits against the protocol's, reserved fields, and the names
 * (client_name, model_name: a NUL inside the field, only NULs after it, no
 * control characters; UTF-8 is allowed). Copies the struct. */
int ipc_decode_welcome(const struct ipc_frame *f, struct ipc_welcome *ret);

struct ipc_generate_msg {
	struct ipc_generate g;
	const char *system;                        /* g.system_bytes bytes */
	const char *stop[IPC_MAX_STOP_STRINGS];    /* g.n_stop strings */
	uint16_t stop_len[IPC_MAX_STOP_STRINGS];
	const char *prompt;                        /* inline prompt; NULL when in ring */
	struct ipc_gen_context ctx;                /* with IPC_GEN_CONTEXT; zero otherwise */
	struct ipc_gen_tenant tenant;              /* with IPC_GEN_TENANT; zero otherwise */
	struct ipc_gen_priority prio;              /* with IPC_GEN_PRIORITY; zero otherwise */
	struct ipc_gen_constraint cons;            /* with IPC_GEN_CONSTRAINT; zero otherwise */
	const char *cons_text;                     /* its inline text (cons.text_bytes); NULL when in ring */
};
int ipc_decode_generate(const struct ipc_frame *f, struct ipc_generate_msg *ret);
/*
 * Encode a GENERATE frame into buf (cap bytes). m->g.stop_bytes is
 * computed; everything else is taken as given and the result is checked
 * with the decoder, so nothing is sent that the server would reject on
 * form. When g.gen_flags has IPC_GEN_PROMPT_IN_RING m->prompt and
 * m->cons_text are ignored (both travel through the upload ring).
 * Returns the frame size or a validation error.
 */
ssize_t ipc_encode_generate(void *buf, size_t cap, uint64_t request_id, const struct ipc_generate_msg *m);

/* Chat turn lists: ipc_chat.h. */

struct ipc_prompt_data_msg {
	uint32_t offset;
	uint32_t bytes;
	const char *data;
};
int ipc_decode_prompt_data(const struct ipc_frame *f, struct ipc_prompt_data_msg *ret);

struct ipc_token_msg {
	struct ipc_token t;
	const uint8_t *ids;    /* n_ids int32 values, possibly unaligned: use ipc_token_id() */
	const char *text;      /* t.text_bytes */
	/* IPC_F_SAMPLE (else has_sample false, s zero, no area) */
	bool has_sample;
	struct ipc_sample s;
	const uint8_t *lp;     /* the log-probability area (validated), lp_bytes long */
	uint32_t lp_bytes;
};
/* Validates the log-probability area too: entry counts, ids >= 0,
 * log-probabilities (not NaN, <= 0), piece lengths, reserved fields. */
int ipc_decode_token(const struct ipc_frame *f, struct ipc_token_msg *ret);
int32_t ipc_token_id(const struct ipc_token_msg *m, uint32_t i);

int ipc_decode_done(const struct ipc_frame *f, struct ipc_done *ret);

struct ipc_error_msg {
	int32_t code;
	uint32_t msg_bytes;
	const char *msg;
};
int ipc_decode_error(const struct ipc_frame *f, struct ipc_error_msg *ret);

/* A STATS_REPLY of any length the frame check let through (IPC_STATS_V070_BYTES
 * .. IPC_MAX_STATS_BYTES): the fields of struct ipc_stats the reply holds,
 * the rest 0; bytes past the struct (a newer daemon's counters) are ignored.
 * -EBADMSG for a length that is not a multiple of 8 or over
 * IPC_MAX_STATS_BYTES, -EINVAL for counts no pool can hold. */
int ipc_decode_stats(const struct ipc_frame *f, struct ipc_stats *ret);

struct ipc_tokenize_msg {
	struct ipc_tokenize t;
	const char *text;      /* inline text; NULL when in ring */
};
int ipc_decode_tokenize(const struct ipc_frame *f, struct ipc_tokenize_msg *ret);

struct ipc_tokenize_reply_msg {
	struct ipc_tokenize_reply r;
	const uint8_t *ids;    /* r.n_ids int32 values (ipc_reply_id) */
	bool more;             /* IPC_F_MORE */
};
int ipc_decode_tokenize_reply(const struct ipc_frame *f, struct ipc_tokenize_reply_msg *ret);
int32_t ipc_reply_id(const struct ipc_tokenize_reply_msg *m, uint32_t i);

int ipc_decode_session_open(const struct ipc_frame *f, struct ipc_session_open *ret);
/* SESSION_OPEN with its optional context block (*ret_ctx zero without one). */
int ipc_decode_session_open_ctx(const struct ipc_frame *f, struct ipc_session_open *ret,
				struct ipc_gen_context *ret_ctx);
/* SESSION_OPENED, SESSION_CLOSE, SESSION_CLOSED: session_id != 0. */
int ipc_decode_session(const struct ipc_frame *f, struct ipc_session *ret);
/* PING, PONG. */
int ipc_decode_ping(const struct ipc_frame *f, struct ipc_ping *ret);

struct ipc_ps_reply_msg {
	struct ipc_ps_reply r;
	const uint8_t *entries; /* r.n_entries entries (ipc_ps_entry_at) */
	bool more;
};
int ipc_decode_ps_reply(const struct ipc_frame *f, struct ipc_ps_reply_msg *ret);
void ipc_ps_entry_at(const struct ipc_ps_reply_msg *m, uint32_t i, struct ipc_ps_entry *ret);

/* ---- SPSC byte rings ---------------------------------------------------------
 *
 * One producer and one consumer, in the same or in different processes,
 * sharing a control block (IPC_RING_CTL_BYTES, 64-byte aligned) and a data
 * area of `capacity` bytes (a power of two, >= 64). Records are
 * variable-length byte strings (1 .. the ring's max record): each is
 * stored as a u32 length and the bytes, padded to IPC_RING_ALIGN, and may
 * wrap around the end of the area. head and tail are free-running u32
 * byte counters.
 *
 * Each side keeps its own index privately (the shared copy is only
 * published) and bounds-checks the peer's index and every length it reads:
 * a corrupt ring gives -EPROTO, from then on on every call (the ring is
 * marked broken), never an out-of-bounds access. Records are copied out
 * before anyone looks at them.
 *
 * Sleeping without lost wake-ups (see ring.c for the argument):
 *   consumer: r = ipc_ring_consumer_prepare_sleep(); if r == 0, sleep until
 *             woken (poll its wake-up fd), then ipc_ring_consumer_end_sleep();
 *             if r > 0 data is there: pop instead of sleeping.
 *   producer: after pushing a batch, if ipc_ring_producer_should_wake()
 *             returns true, send the consumer a wake-up.
 * And symmetrically for a producer waiting for space
 * (ipc_ring_producer_prepare_sleep / ipc_ring_consumer_should_wake).
 */

struct ipc_ring;

enum ipc_ring_role { IPC_RING_PRODUCER = 1, IPC_RING_CONSUMER = 2 };

/* Zero a control block before either side attaches (the creator does it). */
void ipc_ring_format(void *ctl);

/*
 * A handle on a ring for one role. ctl and data stay owned by the caller
 * and must outlive the handle. max_record: the longest record this side
 * accepts or sends, 1 .. capacity / 2 (records are bounded so that a
 * waiting producer always makes progress). The handle starts from the
 * indices found in ctl (validated). Returns 0, -EINVAL for bad arguments,
 * -EPROTO for corrupt indices, -ENOMEM.
 */
int ipc_ring_attach(void *ctl, void *data, uint32_t capacity, uint32_t max_record, enum ipc_ring_role role,
		    struct ipc_ring **ret);
/* Free the handle (not the memory); accepts NULL; returns NULL. */
struct ipc_ring *ipc_ring_free(struct ipc_ring *r);

/*
 * Producer: append one record gathered from iov. Returns 0; -EAGAIN when
 * it does not fit now (nothing written); -EMSGSIZE when longer than the
 * max record or empty; -EPROTO when the consumer's index is corrupt.
 * Does not wake the consumer: see ipc_ring_producer_should_wake().
 */
int ipc_ring_push(struct ipc_ring *r, const struct iovec *iov, int n_iov);
/*
 * Consumer: copy the oldest record into buf and consume it. Returns its
 * length; -EAGAIN when the ring is empty; -EMSGSIZE when cap is smaller
 * than the record (not consumed); -EPROTO for a corrupt index or length.
 */
ssize_t ipc_ring_pop(struct ipc_ring *r, void *buf, size_t cap);

/* Bytes readable / free, as this side sees them now (a hint; -EPROTO on
 * corruption). Free space needed by a record of n bytes: ipc_ring_record_bytes(n). */
ssize_t ipc_ring_used_bytes(struct ipc_ring *r);
ssize_t ipc_ring_free_bytes(struct ipc_ring *r);
static inline uint32_t ipc_ring_record_bytes(uint32_t n)
{
	return (4u + n + IPC_RING_ALIGN - 1) & ~(IPC_RING_ALIGN - 1);
}
uint32_t ipc_ring_capacity(const struct ipc_ring *r);
uint32_t ipc_ring_max_record(const struct ipc_ring *r);

/* Consumer: announce sleep. 1: data is present (flag withdrawn, do not
 * sleep); 0: flag set, sleep until woken; -EPROTO. */
int ipc_ring_consumer_prepare_sleep(struct ipc_ring *r);
void ipc_ring_consumer_end_sleep(struct ipc_ring *r);
/* Producer: announce sleep until a record of `record_len` bytes fits.
 * 1: it fits now (flag withdrawn); 0: sleep; -EPROTO; -EMSGSIZE. */
int ipc_ring_producer_prepare_sleep(struct ipc_ring *r, uint32_t record_len);
void ipc_ring_producer_end_sleep(struct ipc_ring *r);
/* Producer, after publishing records: true when the consumer announced
 * sleep (the flag is cleared here, so one wake-up per sleep). */
bool ipc_ring_producer_should_wake(struct ipc_ring *r);
/* Consumer, after consuming records: true when the producer waits for space. */
bool ipc_ring_consumer_should_wake(struct ipc_ring *r);

/* ---- the per-client channel ---------------------------------------------------
 *
 * A memfd (sealed with F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so neither
 * side can make the other's mapping fault) holding a header page with the
 * layout and both rings' control blocks, then the client->server ring
 * (prompts) and the server->client ring (tokens), plus an AF_UNIX
 * SOCK_DGRAM socket pair for wake-ups: each side sleeps on its own end
 * (readable when the peer sent a datagram) and wakes the peer by sending
 * one byte on it. One wake-up fd per side serves both of its rings: woken,
 * a side rechecks everything it waits for. Every send and receive on the
 * pair passes MSG_DONTWAIT: it never blocks, whatever the peer did to its
 * own end (see "Rings and wake-ups" above).
 *
 * Server (epoll): ipc_chan_create(); send WELCOME with ipc_chan_fds();
 * add ipc_chan_wait_fd() to epoll (EPOLLIN). When it fires: ipc_chan_ack(),
 * then pop upload records (ipc_chan_recv) and push queued stream records
 * (ipc_chan_send...), then ipc_chan_wake_peer(). When it still waits for
 * upload data or for ring space, call ipc_chan_prepare_wait() before going
 * back to epoll_wait(), and loop at once if it returns > 0.
 * Client: ipc_chan_attach() on the WELCOME fds; same pattern with poll().
 */

struct ipc_chan;

struct ipc_chan_config {
	uint32_t c2s_bytes;   /* 0: IPC_RING_DEFAULT_C2S_BYTES */
	uint32_t s2c_bytes;   /* 0: IPC_RING_DEFAULT_S2C_BYTES */
};

/* Server side: create the memfd, map and seal it, create the socket pair.
 * cfg may be NULL. -EINVAL for capacities that are not powers of two in
 * [IPC_RING_MIN_BYTES, IPC_RING_MAX_BYTES]; -ENOMEM; -EMFILE etc. */
int ipc_chan_create(const struct ipc_chan_config *cfg, struct ipc_chan **ret);

/*
 * Client side: map the channel from the WELCOME fds. Checks that memfd is
 * a memfd sealed against shrinking, growing and resealing, that its size
 * and header describe a sane layout (power-of-two ring sizes in range,
 * regions inside the file and not overlapping); afterwards only the ring
 * indices are read from shared memory, never the layout again. On success
 * the channel owns both fds; on failure the caller still does.
 * -EBADMSG for a bad layout, -EPERM for missing seals, -EINVAL for a
 * descriptor that is not a memfd or a wake_fd that is not an AF_UNIX
 * SOCK_DGRAM socket, -ENOMEM.
 */
int ipc_chan_attach(int memfd, int wake_fd, struct ipc_chan **ret);

/* Unmap, close the fds; accepts NULL; returns NULL. */
struct ipc_chan *ipc_chan_free(struct ipc_chan *c);

/* Server: the fds to send in WELCOME, in IPC_WELCOME_FD_* order (still
 * owned by the channel); -EBADF after ipc_chan_handed_over(). */
int ipc_chan_fds(const struct ipc_chan *c, int ret_fds[IPC_WELCOME_N_FDS]);
/* Server: WELCOME went out; close the channel's copies of the fds it
 * carried (the mapping and the server's wake-up end stay). The client's
 * end of the pair then lives only in the client, so a client that exits
 * leaves nothing behind, and sends to it fail instead of queueing. */
void ipc_chan_handed_over(struct ipc_chan *c);
/* Size of the memfd (for ipc_welcome.shm_bytes). */
uint32_t ipc_chan_shm_bytes(const struct ipc_chan *c);
/* The fd this side sleeps on (readable when woken): its end of the pair. */
int ipc_chan_wait_fd(const struct ipc_chan *c);
/* Largest payload one ring record of this side's transmit ring can carry
 * (ring max record - IPC_HDR_BYTES). */
uint32_t ipc_chan_tx_max_payload(const struct ipc_chan *c);

/* 1 when a message with tx_payload payload bytes fits the transmit ring
 * now, 0 when not, -EPROTO for a broken ring, -EMSGSIZE when it never will. */
int ipc_chan_tx_room(struct ipc_chan *c, uint32_t tx_payload);

/*
 * Push one message (header built here, payload = p1 then p2; either may be
 * empty) onto this side's transmit ring. Returns 0; -EAGAIN when full
 * (nothing pushed); -EMSGSIZE beyond the max record; -EPROTO for a broken
 * ring. Wakes nobody: call ipc_chan_wake_peer() after a batch.
 */
int ipc_chan_send(struct ipc_chan *c, uint16_t type, uint32_t flags, uint64_t request_id,
		  const void *p1, size_t n1, const void *p2, size_t n2);
/* Server: a TOKEN record (ids may be NULL with n_ids 0). */
int ipc_chan_send_token(struct ipc_chan *c, uint64_t request_id, uint32_t index, uint32_t n_tokens,
			const int32_t *ids, uint32_t n_ids, const char *text, uint32_t text_bytes);
/* Server: an ERROR record. */
int ipc_chan_send_error(struct ipc_chan *c, uint64_t request_id, int32_t code, const char *msg);

/*
 * Pop one message from this side's receive ring into buf (cap >=
 * ipc_chan's max record, 8-byte aligned: IPC_MAX_FRAME_BYTES always
 * suffices) and validate it as a ring message from the peer. Returns 0 and
 * *ret (payload pointing into buf); -EAGAIN when empty; -EPROTO for a
 * broken ring; any validation error (the bad record is consumed; the peer
 * is misbehaving and the connection should be dropped).
 */
int ipc_chan_recv(struct ipc_chan *c, void *buf, size_t cap, struct ipc_frame *ret);

#define IPC_WAIT_RX 0x1u /* data on the receive ring */
#define IPC_WAIT_TX 0x2u /* room on the transmit ring for a tx_payload-byte message */
/*
 * Announce that this side will sleep on ipc_chan_wait_fd() until the
 * conditions in `what` may hold. Returns > 0 when one already holds (do
 * not sleep: the flags are withdrawn), 0 when the caller may sleep,
 * -EPROTO for a broken ring.
 */
int ipc_chan_prepare_wait(struct ipc_chan *c, unsigned what, uint32_t tx_payload);
/* After waking (or instead of sleeping): withdraw this side's waiting
 * flags and receive pending wake-ups (at most IPC_CHAN_ACK_MAX; any more
 * leave the fd readable, costing one spare wake-up, never a block).
 * Returns 0 or -errno of recv(). */
#define IPC_CHAN_ACK_MAX 64
int ipc_chan_ack(struct ipc_chan *c);
/*
 * After sending and/or receiving a batch: if the peer sleeps waiting for
 * data on our transmit ring or for room on our receive ring, send it a
 * wake-up (once). Returns 1 when a wake-up was sent or one is already
 * queued for the peer (its end's queue is full), 0 when none was needed,
 * -errno when send() failed otherwise (-ECONNREFUSED: the peer's end is
 * closed).
 */
int ipc_chan_wake_peer(struct ipc_chan *c);

/* KVMAP, HIST and LEDGER payloads (kvctl stats --map / --prometheus, kvctl ledger) */
#include "ipc_views.h"

/* samples and log-probabilities: the IPC_F_SAMPLE stream and its helpers */
#include "ipc_samples.h"

#endif /* KVD_IPC_H */
