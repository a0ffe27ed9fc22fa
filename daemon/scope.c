/*
 * daemon/scope.c — owner scopes of the prefix cache.
 *
 * kvmm keys its prefix index within a 64-bit scope (kvmm_seq_set_scope) and
 * compares scopes exactly, so two scopes never share a page. Which requests
 * share a scope is decided here, from [kv] prefix_sharing and what the
 * kernel says about the caller (SO_PEERCRED), never from what a client
 * claims: "user" gives each uid its own scope, "group" each primary gid,
 * "all" one machine-wide scope. A tenant the client names (IPC_GEN_TENANT)
 * divides that scope further and can never reach outside it: the scope is
 * a hash of (mode, id, tenant) with every field length-prefixed, so no
 * choice of tenant by uid B produces uid A's scope input.
 *
 * The hash is SHA-256 (FIPS 180-4), truncated to 64 bits: a client chooses
 * tenant names freely, so finding a name whose scope equals another
 * owner's must cost a second preimage of SHA-256 (2^64 work for 64 bits),
 * not the few multiplications an ordinary hash function's inverse takes.
 * It runs once per request, on at most 100 bytes.
 */
#include "scope.h"

#include <errno.h>
#include <string.h>

#include "ipc.h"

static const uint32_t K256[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror32(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

static void sha256_block(uint32_t h[8], const uint8_t *p)
{
	uint32_t w[64], a, b, c, d, e, f, g, k;

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);

		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = k + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
		uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));

		k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
	}
	h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void kvd_sha256(const void *data, size_t len, uint8_t ret_digest[32])
{
	uint32_t h[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	const uint8_t *p = data;
	uint8_t tail[128] = { 0 };
	size_t n = len, t;

	for (; n >= 64; n -= 64, p += 64)
		sha256_block(h, p);
	memcpy(tail, p, n);
	tail[n] = 0x80;
	t = n + 9 <= 64 ? 64 : 128;
	for (int i = 0; i < 8; i++)
		tail[t - 1 - i] = (uint8_t)(((uint64_t)len * 8) >> (8 * i));
	sha256_block(h, tail);
	if (t == 128)
		sha256_block(h, tail + 64);
	for (int i = 0; i < 8; i++) {
		ret_digest[4 * i] = (uint8_t)(h[i] >> 24);
		ret_digest[4 * i + 1] = (uint8_t)(h[i] >> 16);
		ret_digest[4 * i + 2] = (uint8_t)(h[i] >> 8);
		ret_digest[4 * i + 3] = (uint8_t)h[i];
	}
}

int kvd_prefix_sharing_parse(const char *name)
{
	if (!strcmp(name, "user"))
		return KVD_SHARE_USER;
	if (!strcmp(name, "group"))
		return KVD_SHARE_GROUP;
	if (!strcmp(name, "all"))
		return KVD_SHARE_ALL;
	return -EINVAL;
}

uint64_t kvd_cache_scope(int sharing, uint32_t uid, uint32_t gid, const char *tenant, size_t tenant_len)
{
	uint8_t buf[16 + 4 + 4 + 4 + IPC_MAX_TENANT_BYTES], dig[32];
	uint32_t id = sharing == KVD_SHARE_GROUP ? gid : sharing == KVD_SHARE_USER ? uid : 0;
	uint32_t tl = (uint32_t)tenant_len;
	uint64_t scope = 0;
	size_t n = 0;

	if (sharing == KVD_SHARE_ALL && tenant_len == 0)
		return 0; /* the machine-wide scope: kvmm's default */
	if (tenant_len > IPC_MAX_TENANT_BYTES)
		tl = IPC_MAX_TENANT_BYTES;
	memcpy(buf, "kvd-cache-scope", 16); /* with its NUL */
	n = 16;
	buf[n++] = (uint8_t)sharing, buf[n++] = 0, buf[n++] = 0, buf[n++] = 0;
	memcpy(buf + n, &id, 4), n += 4;
	memcpy(buf + n, &tl, 4), n += 4;
	if (tl)
		memcpy(buf + n, tenant, tl), n += tl;
	kvd_sha256(buf, n, dig);
	memcpy(&scope, dig, 8);
	return scope ? scope : 1; /* 0 stays the machine-wide scope's alone */
}
