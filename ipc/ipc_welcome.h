/*
 * ipc/ipc_welcome.h — the handshake's payloads: HELLO (the client's
 * version, capabilities and name) and WELCOME (the daemon's version, the
 * model and pool it serves, the limits it applies, and the two fds of the
 * client's channel), with the versions from which each later field is
 * sent. Included by ipc.h.
 *
 * WELCOME grows by version: a field is filled only for clients that say a
 * version that reads it (HELLO's client_version), and from kvd 0.11.0 the
 * payload itself is longer for such clients (IPC_WELCOME_V080_BYTES is all
 * an older one accepts).
 */
#ifndef KVD_IPC_WELCOME_H
#define KVD_IPC_WELCOME_H

#include <stddef.h>
#include <stdint.h>

#define IPC_CAP_RING_PROMPT 0x1u /* client: uploads text through the ring */
#define IPC_CAP_SESSIONS    0x2u /* server: sessions supported */
#define IPC_CAP_ALL         0x3u

struct ipc_hello {
	uint32_t client_version;              /* (major << 16) | (minor << 8) | patch */
	uint32_t capabilities;                /* IPC_CAP_* the client understands */
	char client_name[IPC_CLIENT_NAME_BYTES]; /* for logs: NUL-terminated and -padded, no control characters */
};

/* Indices of the fds in a WELCOME frame. */
#define IPC_WELCOME_FD_MEMFD     0 /* the sealed shared-memory channel */
#define IPC_WELCOME_FD_WAKE      1 /* the client's end of the wake-up socket pair
				    * (AF_UNIX SOCK_DGRAM): a datagram sent on it
				    * wakes the server; the server's datagrams
				    * make it readable to wake the client */
#define IPC_WELCOME_N_FDS        2

struct ipc_welcome {
	uint32_t server_version;  /* (major << 16) | (minor << 8) | patch */
	uint32_t capabilities;    /* IPC_CAP_* */
	uint64_t client_id;       /* the server's name for this connection */
	uint32_t n_vocab;
	uint32_t n_ctx;           /* effective context: min(model, max_model_len) */
	uint32_t block_size;      /* tokens per KV page */
	uint32_t n_layers;
	uint32_t n_kv_heads;
	uint32_t head_dim;
	uint32_t kv_dtype_bytes;  /* bytes per K or V element */
	uint32_t max_text_bytes;  /* this server's prompt limit, <= IPC_MAX_TEXT_BYTES */
	uint32_t max_requests;    /* requests in flight per client */
	uint32_t max_gen_tokens;  /* max_tokens limit, <= IPC_MAX_GEN_TOKENS */
	uint32_t shm_bytes;       /* size of the memfd */
	uint32_t kv_type;         /* the KV element type (kernels/backend.h enum kvd_kv_type) + 1, for
				   * clients of IPC_KV_TYPE_CLIENT_VERSION or later; 0 for older
				   * ones, whose reserved field it was, and from older servers */
	uint64_t kv_bytes_per_token;
	uint64_t pool_bytes;      /* KV pool size */
	char model_name[IPC_MODEL_NAME_BYTES]; /* NUL-terminated and -padded, no control characters */
	/* The model file's base name without ".gguf" (at most IPC_MODEL_ID_BYTES - 1
	 * bytes, cut at a character boundary; control characters become '_'),
	 * NUL-terminated and -padded: a short, stable id for the model. Sent to
	 * clients of IPC_MODEL_ID_CLIENT_VERSION or later; all zeros for older
	 * ones, whose reserved field it was, and from older servers. */
	char model_id[IPC_MODEL_ID_BYTES];
	/* Sent to clients of IPC_CHAT_FORMAT_CLIENT_VERSION or later only (kvd
	 * 0.11.0): older ones accept exactly IPC_WELCOME_V080_BYTES, and a
	 * client reads a WELCOME of that size from an older daemon as these
	 * fields all zero. */
	/* The chat template's family, which says how the model writes a tool
	 * call (kvd_chat_render): "chatml", "llama3", "llama2", "zephyr",
	 * "gemma", "mistral"; "" when the model has no template kvd renders.
	 * NUL-terminated and -padded. */
	char chat_format[IPC_CHAT_FORMAT_BYTES];
	uint32_t reserved[4];     /* zero */
};
/* The WELCOME of kvd 0.8.0 to 0.10.0, and what older clients get. */
#define IPC_WELCOME_V080_BYTES ((uint32_t)offsetof(struct ipc_welcome, chat_format))

/* kvd 0.11.0: ipc_welcome.chat_format and the longer WELCOME, sent to clients
 * saying this version or later. */
#define IPC_CHAT_FORMAT_CLIENT_VERSION ((0u << 16) | (11u << 8) | 0u)
/* kvd 0.8.0: ipc_welcome.model_id, sent to clients saying this version or later. */
#define IPC_MODEL_ID_CLIENT_VERSION ((0u << 16) | (8u << 8) | 0u)
/* kvd 0.5.0: ipc_welcome.kv_type, sent to clients saying this version or later. */
#define IPC_KV_TYPE_CLIENT_VERSION ((0u << 16) | (5u << 8) | 0u)
/* the largest kv_type a WELCOME may carry (unknown later types are shown as
 * their byte size only) */
#define IPC_KV_TYPE_MAX 64u

#endif /* KVD_IPC_WELCOME_H */
