/*
 * ipc/ipc_owner.h — GENERATE's optional blocks: whom a request belongs to
 * and how it ranks among its owner's requests, the tenant (IPC_GEN_TENANT)
 * and the priority (IPC_GEN_PRIORITY), and what its output must be, the
 * constraint (IPC_GEN_CONSTRAINT). Included by ipc.h.
 */
#ifndef KVD_IPC_OWNER_H
#define KVD_IPC_OWNER_H

#include <stdint.h>

/*
 * Tenant (IPC_GEN_TENANT): a name, chosen by the client, that divides the
 * client's own owner scope further. The daemon keys its prefix cache by
 * owner scope (by default one per uid: [kv] prefix_sharing), so a cached
 * prompt serves only requests of the scope that computed it; a tenant makes
 * a sub-scope inside that (a gateway serving many API keys under one uid
 * names one tenant per key and cache_salt). It can only narrow sharing: a
 * tenant never reaches another uid's cache, whatever its name. 1 ..
 * IPC_MAX_TENANT_BYTES bytes without NUL, the rest of the field zero.
 * Daemons before IPC_TENANT_SERVER_VERSION refuse the flag (-EPROTO).
 */
#define IPC_MAX_TENANT_BYTES 64u
#define IPC_TENANT_SERVER_VERSION ((0u << 16) | (6u << 8) | 0u) /* kvd 0.6.0 */
struct ipc_gen_tenant {
	uint32_t bytes;                    /* 1 .. IPC_MAX_TENANT_BYTES */
	uint32_t reserved;                 /* 0 */
	char name[IPC_MAX_TENANT_BYTES];   /* bytes bytes, no NUL; zero after them */
};
/* The block's form: length in range, no NUL in the name, zeros after it
 * and in reserved. 0, -EINVAL or -EPROTO (non-zero padding). */
int ipc_gen_tenant_check(const struct ipc_gen_tenant *t);

/*
 * Priority (IPC_GEN_PRIORITY): among the requests of one owner, a lower
 * value is admitted and resumed first and preempted last (vLLM's
 * `priority`); 0 is the default. It never ranks a request against another
 * owner's: owners share the machine fairly whatever their priorities.
 * IPC_MIN_PRIORITY .. IPC_MAX_PRIORITY; reserved 0. Daemons before
 * IPC_TENANT_SERVER_VERSION refuse the flag (-EPROTO).
 */
#define IPC_MIN_PRIORITY (-1000000)
#define IPC_MAX_PRIORITY 1000000
struct ipc_gen_priority {
	int32_t priority;
	uint32_t reserved;                 /* 0 */
};
/* 0, -ERANGE for a value out of range, -EPROTO for non-zero reserved. */
int ipc_gen_priority_check(const struct ipc_gen_priority *p);

/*
 * Constraint (IPC_GEN_CONSTRAINT): the generated text must be a sentence of
 * a grammar (GBNF), an instance of a JSON Schema, any JSON object, a match
 * of a regular expression or one of a list of strings. kind is enum
 * ipc_constraint_kind; text_bytes of the constraint's text follow the
 * block when the prompt is inline (after the priority block, before the
 * prompt), or, with IPC_GEN_PROMPT_IN_RING, are uploaded right after the
 * prompt: the upload is then prompt_bytes + text_bytes long, prompt first.
 * text_bytes is 1 .. IPC_MAX_CONSTRAINT_BYTES (0 allowed for JSON_OBJECT);
 * flags and reserved are 0. The daemon compiles the text (and may refuse
 * it: -EINVAL with "constraint: " and the compiler's message, -ENOTSUP,
 * -E2BIG past its [limits] max_constraint_bytes). Daemons before
 * IPC_CONSTRAINT_SERVER_VERSION refuse the flag (-EPROTO): libkvclient sends
 * it only to newer ones.
 */
#define IPC_MAX_CONSTRAINT_BYTES (1u << 20)
#define IPC_CONSTRAINT_SERVER_VERSION ((0u << 16) | (7u << 8) | 0u) /* kvd 0.7.0 */
enum ipc_constraint_kind {
	IPC_CONSTRAINT_GBNF = 1,
	IPC_CONSTRAINT_JSON_SCHEMA = 2,
	IPC_CONSTRAINT_JSON_OBJECT = 3,
	IPC_CONSTRAINT_REGEX = 4,
	IPC_CONSTRAINT_CHOICE = 5,
};
struct ipc_gen_constraint {
	uint32_t kind;                     /* enum ipc_constraint_kind */
	uint32_t flags;                    /* 0 */
	uint32_t text_bytes;               /* the text's length */
	uint32_t reserved;                 /* 0 */
};
/* The block's form: kind known, length in range, zeros. 0, -EINVAL (kind,
 * an empty text for a kind that needs one), -E2BIG, -EPROTO (non-zero
 * flags or reserved). */
int ipc_gen_constraint_check(const struct ipc_gen_constraint *k);

#endif /* KVD_IPC_OWNER_H */
