/*
 * ipc/ipc_context.h — context policies on the wire: the block that follows
 * GENERATE (IPC_GEN_CONTEXT) or SESSION_OPEN (IPC_SESSION_CONTEXT), and its
 * helpers. Included by ipc.h; not used on its own.
 */
#ifndef KVD_IPC_CONTEXT_H
#define KVD_IPC_CONTEXT_H

#include <stdint.h>

/*
 * What happens when a request (or a session's next turn) would not fit in
 * the context window. IPC_CTX_ERROR refuses it (IPC_ERR_CONTEXT), as
 * without the block. IPC_CTX_TRUNCATE_OLDEST (sessions only) drops the
 * session's oldest turns, keeping the system prompt, until the turn fits.
 * IPC_CTX_SLIDING_WINDOW keeps the last window_tokens tokens (at least; the
 * KV is dropped a page at a time) and IPC_CTX_SINKS also keeps the first
 * sink_tokens tokens (StreamingLLM's attention sinks, rounded up to whole
 * pages); with these two, generation may run past the context: the KV of
 * older tokens is freed as it leaves the window. The DONE record says how
 * many tokens of context were dropped.
 */
enum ipc_context_policy {
	IPC_CTX_ERROR = 0,
	IPC_CTX_TRUNCATE_OLDEST = 1,
	IPC_CTX_SLIDING_WINDOW = 2,
	IPC_CTX_SINKS = 3,
	IPC_CTX_POLICY_MAX = 3,
};
struct ipc_gen_context {
	uint32_t policy;          /* enum ipc_context_policy */
	uint32_t window_tokens;   /* sliding-window, sinks: 0 = as large as the context allows */
	uint32_t sink_tokens;     /* sinks: 0 = 4; else 0 */
	uint32_t reserved0;
};
#define IPC_MAX_CONTEXT_TOKENS (1u << 24) /* window_tokens, sink_tokens at most */
/* "error", "truncate-oldest", "sliding-window", "sinks", or NULL. */
const char *ipc_context_policy_name(uint32_t policy);
/* The policy named by name (exact), or -EINVAL. */
int ipc_context_policy_parse(const char *name);

/* A context block's fields: policy known, sizes within IPC_MAX_CONTEXT_TOKENS,
 * sink_tokens only with IPC_CTX_SINKS, window only with a window policy. */
int ipc_gen_context_check(const struct ipc_gen_context *c);

#endif /* KVD_IPC_CONTEXT_H */
