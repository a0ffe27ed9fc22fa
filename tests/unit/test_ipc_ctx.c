/*
 * tests/unit/test_ipc_ctx.c — the context-policy block of GENERATE and
 * SESSION_OPEN (ipc/ipc.h): round trips, its place in the payload (after
 * the stop area, before an inline prompt), every field checked, frames
 * without the block unchanged, and DONE's context_dropped_tokens.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ipc.h"

static _Alignas(64) uint8_t fbuf[IPC_MAX_FRAME_BYTES];

static int decode_gen(ssize_t len, struct ipc_generate_msg *d)
{
	struct ipc_frame f = { .payload = fbuf + IPC_HDR_BYTES };
	assert_true(len > 0);
	int r = ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr);
	return r < 0 ? r : ipc_decode_generate(&f, d);
}

static struct ipc_generate_msg base_msg(const char *prompt)
{
	struct ipc_generate_msg m = { .g = { .max_tokens = 4000, .top_p = 1.0f, .repeat_penalty = 1.0f,
					     .prompt_bytes = (uint32_t)strlen(prompt), .n_stop = 1 } };
	m.stop[0] = "END";
	m.stop_len[0] = 3;
	m.prompt = prompt;
	return m;
}

static void test_generate_context_roundtrip(void **state)
{
	(void)state;
	const char *prompt = "stream on";
	struct ipc_generate_msg m = base_msg(prompt), d;

	/* without the block: unchanged size, zero block decoded */
	ssize_t plain = ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m);
	assert_int_equal(decode_gen(plain, &d), 0);
	assert_int_equal(d.ctx.policy, IPC_CTX_ERROR);
	assert_int_equal(plain, IPC_HDR_BYTES + sizeof(struct ipc_generate) + 2 + 3 + strlen(prompt));

	m.g.gen_flags |= IPC_GEN_CONTEXT;
	m.ctx = (struct ipc_gen_context){ IPC_CTX_SINKS, 1000, 4, 0 };
	ssize_t len = ipc_encode_generate(fbuf, sizeof(fbuf), 2, &m);
	assert_int_equal(len, plain + (ssize_t)sizeof(struct ipc_gen_context));
	assert_int_equal(decode_gen(len, &d), 0);
	assert_int_equal(d.ctx.policy, IPC_CTX_SINKS);
	assert_int_equal(d.ctx.window_tokens, 1000);
	assert_int_equal(d.ctx.sink_tokens, 4);
	assert_memory_equal(d.prompt, prompt, strlen(prompt)); /* the prompt follows the block */
	assert_int_equal(d.stop_len[0], 3);
	/* where the block sits: right after the stop area */
	struct ipc_gen_context at;
	memcpy(&at, fbuf + IPC_HDR_BYTES + sizeof(struct ipc_generate) + 2 + 3, sizeof(at));
	assert_int_equal(at.policy, IPC_CTX_SINKS);

	/* in the ring: the block is still in the frame */
	m.g.gen_flags |= IPC_GEN_PROMPT_IN_RING;
	m.g.prompt_bytes = 1u << 20;
	len = ipc_encode_generate(fbuf, sizeof(fbuf), 3, &m);
	assert_int_equal(decode_gen(len, &d), 0);
	assert_null(d.prompt);
	assert_int_equal(d.ctx.window_tokens, 1000);
}

static void test_generate_context_refused(void **state)
{
	(void)state;
	struct ipc_generate_msg m = base_msg("x"), d;
	const struct { struct ipc_gen_context c; int err; } bad[] = {
		{ { IPC_CTX_POLICY_MAX + 1, 0, 0, 0 }, -EINVAL },
		{ { IPC_CTX_SINKS, 0, 0, 1 }, -EPROTO },
		{ { IPC_CTX_SLIDING_WINDOW, 0, 4, 0 }, -EINVAL },    /* sinks without the sinks policy */
		{ { IPC_CTX_TRUNCATE_OLDEST, 64, 0, 0 }, -EINVAL },  /* a window without a window policy */
		{ { IPC_CTX_SINKS, IPC_MAX_CONTEXT_TOKENS + 1, 0, 0 }, -E2BIG },
		{ { IPC_CTX_SINKS, 0, IPC_MAX_CONTEXT_TOKENS + 1, 0 }, -E2BIG },
	};
	m.g.gen_flags |= IPC_GEN_CONTEXT;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		m.ctx = bad[i].c;
		/* the encoder refuses what the decoder would */
		assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m), bad[i].err);
		assert_int_equal(ipc_gen_context_check(&bad[i].c), bad[i].err);
	}
	/* a frame whose flag promises the block but is 16 bytes short */
	m.ctx = (struct ipc_gen_context){ IPC_CTX_SLIDING_WINDOW, 0, 0, 0 };
	m.g.gen_flags &= ~IPC_GEN_CONTEXT;
	ssize_t len = ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m);
	assert_true(len > 0);
	struct ipc_generate g;
	memcpy(&g, fbuf + IPC_HDR_BYTES, sizeof(g));
	g.gen_flags |= IPC_GEN_CONTEXT;
	memcpy(fbuf + IPC_HDR_BYTES, &g, sizeof(g));
	assert_int_equal(decode_gen(len, &d), -EBADMSG);
}

/* The tenant block: after the context block, before an inline prompt; every
 * malformed form refused by encoder and decoder alike. */
static void test_generate_tenant(void **state)
{
	(void)state;
	const char *prompt = "scoped";
	struct ipc_generate_msg m = base_msg(prompt), d;
	ssize_t plain = ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m);

	assert_int_equal(decode_gen(plain, &d), 0);
	assert_int_equal(d.tenant.bytes, 0);
	m.g.gen_flags |= IPC_GEN_TENANT | IPC_GEN_CONTEXT;
	m.ctx = (struct ipc_gen_context){ IPC_CTX_SLIDING_WINDOW, 64, 0, 0 };
	m.tenant.bytes = 5;
	memcpy(m.tenant.name, "key-1", 5);
	ssize_t len = ipc_encode_generate(fbuf, sizeof(fbuf), 2, &m);
	assert_int_equal(len, plain + (ssize_t)(sizeof(struct ipc_gen_context) + sizeof(struct ipc_gen_tenant)));
	assert_int_equal(decode_gen(len, &d), 0);
	assert_int_equal(d.tenant.bytes, 5);
	assert_memory_equal(d.tenant.name, "key-1", 5);
	assert_int_equal(d.ctx.window_tokens, 64);
	assert_memory_equal(d.prompt, prompt, strlen(prompt));
	struct ipc_gen_tenant at;
	memcpy(&at, fbuf + IPC_HDR_BYTES + sizeof(struct ipc_generate) + 2 + 3 + sizeof(struct ipc_gen_context),
	       sizeof(at));
	assert_int_equal(at.bytes, 5);

	/* a full-length name is fine */
	m.tenant.bytes = IPC_MAX_TENANT_BYTES;
	memset(m.tenant.name, 'x', IPC_MAX_TENANT_BYTES);
	assert_true(ipc_encode_generate(fbuf, sizeof(fbuf), 3, &m) > 0);
	/* refused: empty, too long, a NUL inside, bytes after the name, reserved */
	struct ipc_gen_tenant bad[5] = { { 0 } };
	int want[5] = { -EINVAL, -EINVAL, -EINVAL, -EPROTO, -EPROTO };
	bad[1].bytes = IPC_MAX_TENANT_BYTES + 1;
	bad[2].bytes = 3, memcpy(bad[2].name, "a\0b", 3);
	bad[3].bytes = 2, memcpy(bad[3].name, "ab\0z", 4);
	bad[4].bytes = 1, bad[4].name[0] = 'a', bad[4].reserved = 1;
	for (int i = 0; i < 5; i++) {
		m.tenant = bad[i];
		assert_int_equal(ipc_gen_tenant_check(&bad[i]), want[i]);
		assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 4, &m), want[i]);
	}
	/* the flag without the block */
	m.g.gen_flags &= ~IPC_GEN_TENANT;
	len = ipc_encode_generate(fbuf, sizeof(fbuf), 5, &m);
	struct ipc_generate g;
	memcpy(&g, fbuf + IPC_HDR_BYTES, sizeof(g));
	g.gen_flags |= IPC_GEN_TENANT;
	memcpy(fbuf + IPC_HDR_BYTES, &g, sizeof(g));
	assert_int_equal(decode_gen(len, &d), -EBADMSG);
}

/* The priority block: after the tenant block; range and reserved checked. */
static void test_generate_priority(void **state)
{
	(void)state;
	struct ipc_generate_msg m = base_msg("ranked"), d;
	ssize_t plain = ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m);

	m.g.gen_flags |= IPC_GEN_PRIORITY | IPC_GEN_TENANT;
	m.tenant.bytes = 1;
	m.tenant.name[0] = 't';
	m.prio.priority = -7;
	ssize_t len = ipc_encode_generate(fbuf, sizeof(fbuf), 2, &m);
	assert_int_equal(len, plain + (ssize_t)(sizeof(struct ipc_gen_tenant) + sizeof(struct ipc_gen_priority)));
	assert_int_equal(decode_gen(len, &d), 0);
	assert_int_equal(d.prio.priority, -7);
	assert_int_equal(d.tenant.name[0], 't');
	assert_memory_equal(d.prompt, "ranked", 6);
	m.prio.priority = IPC_MAX_PRIORITY + 1;
	assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 3, &m), -ERANGE);
	m.prio.priority = IPC_MIN_PRIORITY - 1;
	assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 3, &m), -ERANGE);
	m.prio = (struct ipc_gen_priority){ 1, 1 };
	assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 3, &m), -EPROTO);
	/* an unknown flag above it is refused */
	m.prio = (struct ipc_gen_priority){ 1, 0 };
	m.g.gen_flags |= IPC_GEN_ALL + 1u;
	assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 4, &m), -EPROTO);
}

/* The constraint block: after the priority block, its text after the
 * inline prompt (none in the frame when the prompt is in the ring); kind,
 * length, flags and reserved checked. */
static void test_generate_constraint(void **state)
{
	(void)state;
	struct ipc_generate_msg m = base_msg("shaped"), d;
	ssize_t plain = ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m);
	static const char schema[] = "{\"type\":\"object\"}";

	m.g.gen_flags |= IPC_GEN_CONSTRAINT | IPC_GEN_PRIORITY;
	m.prio.priority = 3;
	m.cons = (struct ipc_gen_constraint){ .kind = IPC_CONSTRAINT_JSON_SCHEMA, .text_bytes = sizeof(schema) - 1 };
	m.cons_text = schema;
	ssize_t len = ipc_encode_generate(fbuf, sizeof(fbuf), 2, &m);
	assert_int_equal(len, plain + (ssize_t)(sizeof(struct ipc_gen_priority) + sizeof(struct ipc_gen_constraint) +
						sizeof(schema) - 1));
	assert_int_equal(decode_gen(len, &d), 0);
	assert_int_equal(d.prio.priority, 3);
	assert_int_equal(d.cons.kind, IPC_CONSTRAINT_JSON_SCHEMA);
	assert_int_equal(d.cons.text_bytes, sizeof(schema) - 1);
	assert_memory_equal(d.prompt, "shaped", 6);
	assert_memory_equal(d.cons_text, schema, sizeof(schema) - 1);
	/* in the ring: neither prompt nor text in the frame */
	m.g.gen_flags |= IPC_GEN_PROMPT_IN_RING;
	len = ipc_encode_generate(fbuf, sizeof(fbuf), 3, &m);
	assert_int_equal(len, plain - 6 + (ssize_t)(sizeof(struct ipc_gen_priority) + sizeof(struct ipc_gen_constraint)));
	assert_int_equal(decode_gen(len, &d), 0);
	assert_null(d.prompt);
	assert_null(d.cons_text);
	assert_int_equal(d.cons.text_bytes, sizeof(schema) - 1);
	m.g.gen_flags &= ~IPC_GEN_PROMPT_IN_RING;
	/* json_object may come without text; the others may not */
	m.cons = (struct ipc_gen_constraint){ .kind = IPC_CONSTRAINT_JSON_OBJECT };
	len = ipc_encode_generate(fbuf, sizeof(fbuf), 4, &m);
	assert_true(len > 0);
	assert_int_equal(decode_gen(len, &d), 0);
	assert_int_equal(d.cons.text_bytes, 0);
	struct ipc_gen_constraint bad[] = {
		{ .kind = IPC_CONSTRAINT_GBNF },
		{ .kind = 0, .text_bytes = 1 },
		{ .kind = IPC_CONSTRAINT_CHOICE + 1, .text_bytes = 1 },
		{ .kind = IPC_CONSTRAINT_REGEX, .text_bytes = IPC_MAX_CONSTRAINT_BYTES + 1 },
		{ .kind = IPC_CONSTRAINT_REGEX, .text_bytes = 1, .flags = 1 },
		{ .kind = IPC_CONSTRAINT_REGEX, .text_bytes = 1, .reserved = 1 },
	};
	int want[] = { -EINVAL, -EINVAL, -EINVAL, -E2BIG, -EPROTO, -EPROTO };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(ipc_gen_constraint_check(&bad[i]), want[i]);
	/* a text length that does not match the frame */
	m.cons = (struct ipc_gen_constraint){ .kind = IPC_CONSTRAINT_REGEX, .text_bytes = 3 };
	m.cons_text = "a+b";
	len = ipc_encode_generate(fbuf, sizeof(fbuf), 5, &m);
	assert_true(len > 0);
	struct ipc_gen_constraint k;
	size_t at = (size_t)len - 3 - 6 - sizeof(k);
	memcpy(&k, fbuf + at, sizeof(k));
	assert_int_equal(k.text_bytes, 3);
	k.text_bytes = 4;
	memcpy(fbuf + at, &k, sizeof(k));
	assert_int_equal(decode_gen(len, &d), -EBADMSG);
}

static void test_session_open_context(void **state)
{
	(void)state;
	struct ipc_session_open so = { .flags = IPC_SESSION_CONTEXT, .idle_timeout_s = 60 };
	struct ipc_gen_context c = { IPC_CTX_TRUNCATE_OLDEST, 0, 0, 0 }, got;
	struct iovec v[2] = { { &so, sizeof(so) }, { &c, sizeof(c) } };
	struct ipc_session_open dso;
	struct ipc_frame f = { .payload = fbuf + IPC_HDR_BYTES };

	ssize_t len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_SESSION_OPEN, 0, 1, v, 2);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	assert_int_equal(ipc_decode_session_open_ctx(&f, &dso, &got), 0);
	assert_int_equal(got.policy, IPC_CTX_TRUNCATE_OLDEST);
	assert_int_equal(dso.idle_timeout_s, 60);
	/* the flag without the block, the block without the flag, unknown flags */
	len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_SESSION_OPEN, 0, 1, v, 1);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	assert_int_equal(ipc_decode_session_open_ctx(&f, &dso, &got), -EBADMSG);
	so.flags = 0;
	len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_SESSION_OPEN, 0, 1, v, 2);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	assert_int_equal(ipc_decode_session_open_ctx(&f, &dso, &got), -EBADMSG);
	so.flags = 0x2;
	len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_SESSION_OPEN, 0, 1, v, 1);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	assert_int_equal(ipc_decode_session_open(&f, &dso), -EPROTO);
	/* a bad block */
	so.flags = IPC_SESSION_CONTEXT;
	c.sink_tokens = 4;
	len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_SESSION_OPEN, 0, 1, v, 2);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	assert_int_equal(ipc_decode_session_open_ctx(&f, &dso, &got), -EINVAL);
	/* the old form still decodes */
	so.flags = 0;
	len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_SESSION_OPEN, 0, 1, v, 1);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	assert_int_equal(ipc_decode_session_open_ctx(&f, &dso, &got), 0);
	assert_int_equal(got.policy, IPC_CTX_ERROR);
}

static void test_done_context_dropped(void **state)
{
	(void)state;
	struct ipc_done d = { .finish_reason = IPC_FINISH_LENGTH, .prompt_tokens = 10, .generated_tokens = 4000,
			      .context_dropped_tokens = 3500 }, got;
	struct iovec v = { &d, sizeof(d) };
	struct ipc_frame f = { .payload = fbuf + IPC_HDR_BYTES };
	ssize_t len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_DONE, 0, 1, &v, 1);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_SERVER, IPC_VIA_RING, &f.hdr), 0);
	assert_int_equal(ipc_decode_done(&f, &got), 0);
	assert_int_equal(got.context_dropped_tokens, 3500);
}

static void test_policy_names(void **state)
{
	(void)state;
	for (uint32_t p = 0; p <= IPC_CTX_POLICY_MAX; p++)
		assert_int_equal(ipc_context_policy_parse(ipc_context_policy_name(p)), (int)p);
	assert_string_equal(ipc_context_policy_name(IPC_CTX_SINKS), "sinks");
	assert_null(ipc_context_policy_name(IPC_CTX_POLICY_MAX + 1));
	assert_int_equal(ipc_context_policy_parse("Sinks"), -EINVAL);
	assert_int_equal(ipc_context_policy_parse(NULL), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_generate_context_roundtrip),
		cmocka_unit_test(test_generate_context_refused),
		cmocka_unit_test(test_generate_tenant),
		cmocka_unit_test(test_generate_priority),
		cmocka_unit_test(test_generate_constraint),
		cmocka_unit_test(test_session_open_context),
		cmocka_unit_test(test_done_context_dropped),
		cmocka_unit_test(test_policy_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
