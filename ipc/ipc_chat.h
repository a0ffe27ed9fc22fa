/*
 * ipc/ipc_chat.h — chat turn lists, the prompt of a GENERATE with
 * IPC_GEN_CHAT_TURNS: their layout and the functions that walk, check and
 * encode them. Included by ipc.h.
 */
#ifndef KVD_IPC_CHAT_H
#define KVD_IPC_CHAT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Chat turns (IPC_GEN_CHAT_TURNS). The prompt — inline or uploaded through
 * the ring, as any prompt, and counted in prompt_bytes against the same
 * limits — is not text but a list of 1 .. IPC_MAX_CHAT_TURNS records, each
 *
 *     u8 role (enum ipc_chat_role) | u8 pad[3] (zero) | u32 bytes | text
 *
 * (8-byte head, then `bytes` bytes of text without NUL, unpadded: the next
 * record follows at once; the records fill prompt_bytes exactly). The
 * daemon renders them, in order, with the model's chat template and ends
 * the prompt where the assistant's reply begins; the last turn must be a
 * user turn or a tool turn. A whole conversation is re-sent with every request: its
 * earlier turns render to the same tokens each time, so they are found in
 * the prefix cache. With this flag: no IPC_GEN_RAW / IPC_GEN_PARSE_SPECIAL
 * (the template is the daemon's), no system text (a system turn carries
 * it), no session (the turns are the history).
 *
 * Compatibility: the protocol version stays 2. A daemon older than this
 * flag refuses it with -EPROTO (unknown gen_flags bits) before it reads
 * the payload, so it is never misread; a version bump would instead cut
 * every existing client off from a newer daemon for an addition old
 * clients never use. A refused GENERATE whose prompt was announced for the
 * ring leaves that upload unconsumed, so libkvclient sends turns only to a
 * daemon whose WELCOME.server_version is at least
 * IPC_CHAT_TURNS_SERVER_VERSION (kvd 0.2.0) and refuses the request itself
 * (-EOPNOTSUPP) otherwise.
 */
enum ipc_chat_role {
	IPC_CHAT_SYSTEM = 1,
	IPC_CHAT_USER = 2,
	IPC_CHAT_ASSISTANT = 3,
	/* Tools (kvd 0.9.0): rendered by the daemon in the model family's own
	 * tool format (kvd_chat_render). */
	IPC_CHAT_TOOLS = 4,      /* the functions the model may call: a JSON array of
				  * {"name", "description"?, "parameters"?} objects */
	IPC_CHAT_TOOL_CALLS = 5, /* the assistant's calls (after its text turn, if any, in
				  * the same reply): a JSON array of {"id"?, "name",
				  * "arguments" (an object)} */
	IPC_CHAT_TOOL = 6,       /* one tool result (the text the tool returned); the
				  * results after a TOOL_CALLS turn answer its calls in order */
	/* kvd 0.11.0: the reply begins with a tool call. Empty text; the last
	 * turn, after a user or tool turn, in a conversation with a TOOLS
	 * turn. The prompt then ends with what the family writes before a
	 * call's JSON (ChatML and the generic format: "<tool_call>\n";
	 * Mistral: its [TOOL_CALLS] token; Llama 3: nothing, a call is the
	 * whole reply), so a client constraining the reply to a call (a forced
	 * tool call) has the model write it in its own shape. */
	IPC_CHAT_CALL_OPEN = 7,
};
#define IPC_CHAT_TURN_HEAD_BYTES      8u
#define IPC_MAX_CHAT_TURNS            1024u
#define IPC_CHAT_TURNS_SERVER_VERSION ((0u << 16) | (2u << 8) | 0u)
/*
 * Tool roles (IPC_CHAT_TOOLS, _TOOL_CALLS, _TOOL): a daemon older than
 * them refuses the role (-EINVAL) after the prompt was uploaded, so
 * libkvclient sends them only to a daemon whose WELCOME.server_version is
 * at least this (kvd 0.9.0) and refuses the request itself (-EOPNOTSUPP)
 * otherwise.
 */
#define IPC_CHAT_TOOLS_SERVER_VERSION ((0u << 16) | (9u << 8) | 0u)
/* IPC_CHAT_CALL_OPEN likewise: sent only to kvd 0.11.0 or later. */
#define IPC_CHAT_CALL_OPEN_SERVER_VERSION ((0u << 16) | (11u << 8) | 0u)

/* "system", "user", "assistant", "tools", "tool_calls", "tool", "call_open", or NULL
 * for another value. */
const char *ipc_chat_role_name(uint32_t role);
/* The role named by name[0 .. len) (exact, lower case), or 0 when none. */
uint32_t ipc_chat_role_parse(const char *name, size_t len);

struct ipc_chat_turn {
	uint32_t role;         /* enum ipc_chat_role */
	uint32_t bytes;
	const char *text;      /* bytes bytes, no NUL, not NUL-terminated */
};
/*
 * Walk a turn list buf[0 .. len) (a whole IPC_GEN_CHAT_TURNS prompt):
 * start with *off = 0; each call returns 1 with the turn at *off in *ret
 * (text pointing into buf) and advances *off, 0 at the end of the list.
 * -EBADMSG for a head or text that runs past len, -EPROTO for non-zero
 * padding, -EINVAL for an unknown role or a NUL in the text. Validates one
 * record per call: use ipc_chat_turns_check() first for the whole list.
 */
int ipc_chat_turn_next(const void *buf, size_t len, size_t *off, struct ipc_chat_turn *ret);
/*
 * Check a whole turn list: every record as ipc_chat_turn_next() does, at
 * least one turn (-EINVAL when empty), at most IPC_MAX_CHAT_TURNS (-E2BIG),
 * the last one a user or tool turn, or a call-open turn right after one
 * (-EINVAL). Returns the number of turns.
 */
int ipc_chat_turns_check(const void *buf, size_t len);
/*
 * Encode n turns into buf (cap bytes; buf may be NULL with cap 0 to learn
 * the size). Returns the encoded size (> cap: nothing written), -EINVAL
 * for an unknown role or a NUL in a text, -E2BIG for more than
 * IPC_MAX_CHAT_TURNS turns or more than IPC_MAX_TEXT_BYTES in all. The
 * encoding is not checked for a final user turn: the daemon decides.
 */
ssize_t ipc_chat_turns_encode(void *buf, size_t cap, const struct ipc_chat_turn *turns, size_t n);

#endif /* KVD_IPC_CHAT_H */
