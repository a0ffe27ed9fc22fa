/*
 * daemon/scope.h — which requests may share cached prompt pages (scope.c).
 */
#ifndef KVD_SCOPE_H
#define KVD_SCOPE_H

#include <stddef.h>
#include <stdint.h>

/* [kv] prefix_sharing */
enum kvd_prefix_sharing {
	KVD_SHARE_USER = 1,  /* one scope per uid (the default) */
	KVD_SHARE_GROUP = 2, /* one per primary gid */
	KVD_SHARE_ALL = 3,   /* one for the machine: leaks across users */
};

/* "user", "group" or "all" → enum kvd_prefix_sharing, else -EINVAL. */
int kvd_prefix_sharing_parse(const char *name);

/*
 * The prefix-cache scope of a request by (uid, gid) under `sharing`, narrowed
 * by a tenant of tenant_len bytes (0: none; at most IPC_MAX_TENANT_BYTES are
 * read). Never 0 except for "all" without a tenant (kvmm's default scope).
 * Distinct inputs give distinct scopes but with 2^-64 odds, and finding a
 * tenant that gives a chosen scope costs a SHA-256 second preimage.
 */
uint64_t kvd_cache_scope(int sharing, uint32_t uid, uint32_t gid, const char *tenant, size_t tenant_len);

/* SHA-256 of data[0 .. len) (FIPS 180-4). */
void kvd_sha256(const void *data, size_t len, uint8_t ret_digest[32]);

#endif /* KVD_SCOPE_H */
