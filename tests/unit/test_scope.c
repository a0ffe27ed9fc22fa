/*
 * tests/unit/test_scope.c — prefix-cache owner scopes (daemon/scope.c):
 * SHA-256 against FIPS 180-4's and hashlib's digests (every padding
 * boundary), [kv] prefix_sharing's names, and which (mode, uid, gid,
 * tenant) inputs share a scope and which never do.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/scope.h"

static void hex(const uint8_t d[32], char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void test_sha256_vectors(void **state)
{
	static const struct { const char *msg; size_t n_a; const char *want; } v[] = {
		{ "", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
		{ "abc", 0, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
		{ "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 0,
		  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
		/* runs of 'a' across the one- and two-block padding boundaries */
		{ NULL, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318" },
		{ NULL, 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a" },
		{ NULL, 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34" },
		{ NULL, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb" },
		{ NULL, 119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb" },
		{ NULL, 120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c" },
		{ NULL, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0" },
	};
	uint8_t d[32];
	char h[65];

	(void)state;
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		char *buf = NULL;
		const char *msg = v[i].msg;
		size_t n = msg ? strlen(msg) : v[i].n_a;

		if (!msg) {
			buf = malloc(n);
			assert_non_null(buf);
			memset(buf, 'a', n);
			msg = buf;
		}
		kvd_sha256(msg, n, d);
		hex(d, h);
		if (strcmp(h, v[i].want))
			fail_msg("sha256 of %zu bytes: %s, want %s", n, h, v[i].want);
		free(buf);
	}
}

static void test_sharing_names(void **state)
{
	(void)state;
	assert_int_equal(kvd_prefix_sharing_parse("user"), KVD_SHARE_USER);
	assert_int_equal(kvd_prefix_sharing_parse("group"), KVD_SHARE_GROUP);
	assert_int_equal(kvd_prefix_sharing_parse("all"), KVD_SHARE_ALL);
	assert_int_equal(kvd_prefix_sharing_parse("User"), -EINVAL);
	assert_int_equal(kvd_prefix_sharing_parse(""), -EINVAL);
}

static void test_scopes(void **state)
{
	(void)state;
	const uint64_t u1 = kvd_cache_scope(KVD_SHARE_USER, 1000, 100, NULL, 0);

	/* user: the uid decides, not the gid */
	assert_true(u1 != 0);
	assert_int_equal(kvd_cache_scope(KVD_SHARE_USER, 1000, 200, NULL, 0), u1);
	assert_true(kvd_cache_scope(KVD_SHARE_USER, 1001, 100, NULL, 0) != u1);
	/* group: the gid decides, and a group's scope is not a user's of the same number */
	const uint64_t g1 = kvd_cache_scope(KVD_SHARE_GROUP, 1000, 100, NULL, 0);
	assert_int_equal(kvd_cache_scope(KVD_SHARE_GROUP, 2000, 100, NULL, 0), g1);
	assert_true(kvd_cache_scope(KVD_SHARE_GROUP, 1000, 101, NULL, 0) != g1);
	assert_true(kvd_cache_scope(KVD_SHARE_GROUP, 0, 1000, NULL, 0) != u1);
	/* all: one scope, kvmm's default */
	assert_int_equal(kvd_cache_scope(KVD_SHARE_ALL, 1000, 100, NULL, 0), 0);
	assert_int_equal(kvd_cache_scope(KVD_SHARE_ALL, 5, 5, NULL, 0), 0);
	/* tenants narrow: same tenant, same scope; another tenant, another uid
	 * with that tenant, or no tenant: other scopes */
	const uint64_t t1 = kvd_cache_scope(KVD_SHARE_USER, 1000, 100, "key-1", 5);
	assert_int_equal(kvd_cache_scope(KVD_SHARE_USER, 1000, 100, "key-1", 5), t1);
	assert_true(t1 != u1 && t1 != 0);
	assert_true(kvd_cache_scope(KVD_SHARE_USER, 1000, 100, "key-2", 5) != t1);
	assert_true(kvd_cache_scope(KVD_SHARE_USER, 1001, 100, "key-1", 5) != t1);
	assert_true(kvd_cache_scope(KVD_SHARE_USER, 1000, 100, "key-1x", 6) != t1);
	assert_true(kvd_cache_scope(KVD_SHARE_ALL, 1000, 100, "key-1", 5) != 0);
	assert_true(kvd_cache_scope(KVD_SHARE_ALL, 1000, 100, "key-1", 5) != t1);
	/* a tenant's bytes cannot spell another uid: the fields are
	 * length-prefixed, so "uid 1001" is not reachable from uid 1000 */
	{
		uint32_t other = 1001;
		char fake[4 + 4 + 4];

		memcpy(fake, &other, 4);
		memset(fake + 4, 0, 8);
		for (size_t n = 1; n <= sizeof(fake); n++)
			assert_true(kvd_cache_scope(KVD_SHARE_USER, 1000, 100, fake, n) !=
				    kvd_cache_scope(KVD_SHARE_USER, 1001, 100, NULL, 0));
	}
	/* many uids and tenants: no two equal */
	{
		enum { N = 4096 };
		uint64_t *v = malloc(2 * N * sizeof(*v));
		char t[16];

		assert_non_null(v);
		for (uint32_t i = 0; i < N; i++) {
			v[i] = kvd_cache_scope(KVD_SHARE_USER, i, 0, NULL, 0);
			snprintf(t, sizeof(t), "t%u", i);
			v[N + i] = kvd_cache_scope(KVD_SHARE_USER, 7, 0, t, strlen(t));
		}
		for (uint32_t i = 0; i < 2 * N; i++)
			for (uint32_t j = i + 1; j < 2 * N; j++)
				if (v[i] == v[j])
					fail_msg("scopes %u and %u collide", i, j);
		free(v);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha256_vectors),
		cmocka_unit_test(test_sharing_names),
		cmocka_unit_test(test_scopes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
