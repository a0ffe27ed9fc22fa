/*
 * tests/unit/test_ipc.c — kvd's wire protocol: frames encode and decode
 * back to what went in; every malformed frame is rejected with its
 * documented error; the socket layer passes fds, survives oversized and
 * empty datagrams and reports a vanished peer; the SPSC rings keep every
 * byte under a two-thread stress with blocking wake-ups, wrap around
 * correctly (also across u32 index overflow) and refuse corrupt indices
 * and lengths written by a hostile peer; the shared-memory channel is
 * sealed and its layout checked on attach.
 *
 * The whole binary runs under alarm(): a lost wake-up shows as a failure,
 * not a hang.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc.h"

/* Layout facts of ipc/chan.c that the hostile-peer tests poke at. */
#define SHM_C2S_CTL  128
#define SHM_S2C_CTL  256
#define SHM_HDR_PAGE 4096

static _Alignas(64) uint8_t fbuf[IPC_MAX_FRAME_BYTES];
static _Alignas(64) uint8_t rbuf[IPC_MAX_FRAME_BYTES];

static int count_fds(void)
{
	int n = 0;
	for (int fd = 0; fd < 1024; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			n++;
	return n;
}

/* Build a frame with one payload part and check it as `from` over `via`. */
static int check1(uint16_t type, uint32_t flags, const void *p, size_t n, unsigned from, unsigned via,
		  struct ipc_frame *f)
{
	struct iovec v = { (void *)p, n };
	ssize_t len = ipc_frame_build(fbuf, sizeof(fbuf), type, flags, 77, &v, n ? 1 : 0);
	assert_true(len >= (ssize_t)IPC_HDR_BYTES);
	memset(f, 0, sizeof(*f));
	f->payload = fbuf + IPC_HDR_BYTES;
	return ipc_frame_check(fbuf, (size_t)len, 0, from, via, &f->hdr);
}

/* ---- round trips ------------------------------------------------------------ */

static void test_roundtrip_fixed(void **state)
{
	(void)state;
	struct ipc_frame f;

	struct ipc_hello h = { .client_version = 0x000100, .capabilities = IPC_CAP_RING_PROMPT };
	strcpy(h.client_name, "kvctl");
	assert_int_equal(check1(IPC_MSG_HELLO, 0, &h, sizeof(h), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(f.hdr.request_id, 77);
	struct ipc_hello h2;
	assert_int_equal(ipc_decode_hello(&f, &h2), 0);
	assert_memory_equal(&h, &h2, sizeof(h));

	struct ipc_done d = { .finish_reason = IPC_FINISH_STOP, .prompt_tokens = 10, .cached_tokens = 4,
			      .generated_tokens = 7, .queue_ns = 1, .ttft_ns = 2, .decode_ns = 3, .total_ns = 6 };
	assert_int_equal(check1(IPC_MSG_DONE, 0, &d, sizeof(d), IPC_FROM_SERVER, IPC_VIA_RING, &f), 0);
	struct ipc_done d2;
	assert_int_equal(ipc_decode_done(&f, &d2), 0);
	assert_memory_equal(&d, &d2, sizeof(d));

	struct ipc_stats s = { .pages_total = 100, .pages_free = 50, .pages_used = 30, .pages_shared = 5,
			       .pages_cached = 20, .prefix_query_tokens = 9, .prefix_hit_tokens = 3,
			       .requests_running = 2 };
	assert_int_equal(check1(IPC_MSG_STATS_REPLY, 0, &s, sizeof(s), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), 0);
	struct ipc_stats s2;
	assert_int_equal(ipc_decode_stats(&f, &s2), 0);
	assert_memory_equal(&s, &s2, sizeof(s));

	struct ipc_session ss = { .session_id = 42 }, ss2;
	for (uint16_t t = IPC_MSG_SESSION_OPENED; t <= IPC_MSG_SESSION_CLOSED; t++) {
		unsigned from = t == IPC_MSG_SESSION_CLOSE ? IPC_FROM_CLIENT : IPC_FROM_SERVER;
		assert_int_equal(check1(t, 0, &ss, sizeof(ss), from, IPC_VIA_SOCKET, &f), 0);
		assert_int_equal(ipc_decode_session(&f, &ss2), 0);
		assert_int_equal(ss2.session_id, 42);
	}
	struct ipc_session_open so = { .idle_timeout_s = 30 }, so2;
	assert_int_equal(check1(IPC_MSG_SESSION_OPEN, 0, &so, sizeof(so), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(ipc_decode_session_open(&f, &so2), 0);
	assert_int_equal(so2.idle_timeout_s, 30);

	struct ipc_ping p = { .nonce = 0x1234567890ull }, p2;
	assert_int_equal(check1(IPC_MSG_PING, 0, &p, sizeof(p), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(check1(IPC_MSG_PONG, 0, &p, sizeof(p), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(ipc_decode_ping(&f, &p2), 0);
	assert_int_equal(p2.nonce, p.nonce);

	assert_int_equal(check1(IPC_MSG_CANCEL, 0, NULL, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(check1(IPC_MSG_STATS, 0, NULL, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(check1(IPC_MSG_PS, 0, NULL, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	assert_string_equal(ipc_type_name(IPC_MSG_GENERATE), "GENERATE");
	assert_string_equal(ipc_type_name(999), "?");
	assert_string_equal(ipc_finish_name(IPC_FINISH_LENGTH), "length");
}

static void test_roundtrip_welcome_with_fds(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	struct ipc_chan *ch;
	assert_int_equal(ipc_chan_create(NULL, &ch), 0);
	int fds[IPC_WELCOME_N_FDS];
	assert_int_equal(ipc_chan_fds(ch, fds), 0);
	struct ipc_welcome w = { .server_version = 0x000100, .capabilities = IPC_CAP_SESSIONS, .client_id = 9,
				 .n_vocab = 49152, .n_ctx = 8192, .block_size = 16, .n_layers = 30,
				 .n_kv_heads = 3, .head_dim = 64, .kv_dtype_bytes = 2,
				 .max_text_bytes = IPC_MAX_TEXT_BYTES, .max_requests = 8, .max_gen_tokens = 4096,
				 .shm_bytes = ipc_chan_shm_bytes(ch), .kv_bytes_per_token = 23040, .pool_bytes = 1 << 30 };
	strcpy(w.model_name, "SmolLM2-135M-Instruct");
	assert_int_equal(ipc_send(sv[0], IPC_MSG_WELCOME, 0, 1, &w, sizeof(w), fds, IPC_WELCOME_N_FDS), 0);
	struct ipc_frame f;
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f), 0);
	assert_int_equal(f.hdr.type, IPC_MSG_WELCOME);
	assert_int_equal(f.n_fds, IPC_WELCOME_N_FDS);
	struct ipc_welcome w2;
	assert_int_equal(ipc_decode_welcome(&f, &w2), 0);
	assert_memory_equal(&w, &w2, sizeof(w));
	struct ipc_chan *cl;
	/* WELCOME carrying the wrong number of fds is malformed. */
	assert_int_equal(ipc_send(sv[0], IPC_MSG_WELCOME, 0, 1, &w, sizeof(w), fds, 1), 0);
	struct ipc_frame f1;
	assert_int_equal(ipc_recv(sv[1], fbuf, sizeof(fbuf), IPC_FROM_SERVER, &f1), -EBADMSG);
	/* Once handed over, the server's copies are gone. */
	ipc_chan_handed_over(ch);
	assert_int_equal(ipc_chan_fds(ch, fds), -EBADF);
	assert_int_equal(ipc_chan_attach(f.fds[IPC_WELCOME_FD_MEMFD], f.fds[IPC_WELCOME_FD_WAKE], &cl), 0);
	assert_int_equal(ipc_chan_shm_bytes(cl), w.shm_bytes);
	ipc_chan_free(cl);
	ipc_chan_free(ch);
	close(sv[0]);
	close(sv[1]);
}

static void test_roundtrip_generate(void **state)
{
	(void)state;
	const char *sys = "You are terse.";
	const char *prompt = "Why is the sky blue?";
	struct ipc_generate_msg m = { .g = { .gen_flags = IPC_GEN_WANT_IDS, .max_tokens = 64, .temperature = 0.0f,
					     .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.1f, .top_k = 40,
					     .repeat_last_n = 64, .seed = 7, .session_id = 3,
					     .prompt_bytes = (uint32_t)strlen(prompt),
					     .system_bytes = (uint32_t)strlen(sys), .n_stop = 2 } };
	m.system = sys;
	m.stop[0] = "\n\n";
	m.stop_len[0] = 2;
	m.stop[1] = "END";
	m.stop_len[1] = 3;
	m.prompt = prompt;
	ssize_t len = ipc_encode_generate(fbuf, sizeof(fbuf), 5, &m);
	assert_true(len > 0);
	struct ipc_frame f = { .payload = fbuf + IPC_HDR_BYTES };
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	struct ipc_generate_msg d;
	assert_int_equal(ipc_decode_generate(&f, &d), 0);
	assert_int_equal(d.g.max_tokens, 64);
	assert_int_equal(d.g.seed, 7);
	assert_int_equal(d.g.stop_bytes, 2 + 2 + 2 + 3);
	assert_memory_equal(d.system, sys, strlen(sys));
	assert_int_equal(d.g.n_stop, 2);
	assert_int_equal(d.stop_len[1], 3);
	assert_memory_equal(d.stop[1], "END", 3);
	assert_memory_equal(d.prompt, prompt, strlen(prompt));

	/* In-ring variant: no prompt bytes in the frame. */
	m.g.gen_flags |= IPC_GEN_PROMPT_IN_RING;
	m.g.prompt_bytes = 5u << 20;
	len = ipc_encode_generate(fbuf, sizeof(fbuf), 6, &m);
	assert_true(len > 0);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr), 0);
	assert_int_equal(ipc_decode_generate(&f, &d), 0);
	assert_null(d.prompt);
	assert_int_equal(d.g.prompt_bytes, 5u << 20);
}

static void test_roundtrip_variable(void **state)
{
	(void)state;
	struct ipc_frame f;
	uint8_t pl[256];

	/* TOKEN with ids and text */
	struct ipc_token t = { .index = 10, .n_tokens = 2, .n_ids = 2, .text_bytes = 5 };
	int32_t ids[2] = { 123, -1 + 457 };
	memcpy(pl, &t, sizeof(t));
	memcpy(pl + sizeof(t), ids, sizeof(ids));
	memcpy(pl + sizeof(t) + sizeof(ids), "hello", 5);
	assert_int_equal(check1(IPC_MSG_TOKEN, 0, pl, sizeof(t) + 8 + 5, IPC_FROM_SERVER, IPC_VIA_RING, &f), 0);
	struct ipc_token_msg tm;
	assert_int_equal(ipc_decode_token(&f, &tm), 0);
	assert_int_equal(tm.t.index, 10);
	assert_int_equal(ipc_token_id(&tm, 0), 123);
	assert_int_equal(ipc_token_id(&tm, 1), 456);
	assert_memory_equal(tm.text, "hello", 5);

	/* ERROR */
	struct ipc_error e = { .code = IPC_ERR_CONTEXT, .msg_bytes = 3 };
	memcpy(pl, &e, sizeof(e));
	memcpy(pl + sizeof(e), "abc", 3);
	assert_int_equal(check1(IPC_MSG_ERROR, 0, pl, sizeof(e) + 3, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), 0);
	struct ipc_error_msg em;
	assert_int_equal(ipc_decode_error(&f, &em), 0);
	assert_int_equal(em.code, IPC_ERR_CONTEXT);
	assert_memory_equal(em.msg, "abc", 3);

	/* PROMPT_DATA */
	struct ipc_prompt_data pd = { .offset = 100, .bytes = 4 };
	memcpy(pl, &pd, sizeof(pd));
	memcpy(pl + sizeof(pd), "text", 4);
	assert_int_equal(check1(IPC_MSG_PROMPT_DATA, 0, pl, sizeof(pd) + 4, IPC_FROM_CLIENT, IPC_VIA_RING, &f), 0);
	struct ipc_prompt_data_msg pm;
	assert_int_equal(ipc_decode_prompt_data(&f, &pm), 0);
	assert_int_equal(pm.offset, 100);
	assert_memory_equal(pm.data, "text", 4);

	/* TOKENIZE and its reply */
	struct ipc_tokenize tk = { .tok_flags = IPC_TOK_ADD_BOS, .text_bytes = 3 };
	memcpy(pl, &tk, sizeof(tk));
	memcpy(pl + sizeof(tk), "abc", 3);
	assert_int_equal(check1(IPC_MSG_TOKENIZE, 0, pl, sizeof(tk) + 3, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	struct ipc_tokenize_msg tkm;
	assert_int_equal(ipc_decode_tokenize(&f, &tkm), 0);
	assert_memory_equal(tkm.text, "abc", 3);
	struct ipc_tokenize_reply tr = { .n_tokens = 5, .offset = 3, .n_ids = 2 };
	memcpy(pl, &tr, sizeof(tr));
	memcpy(pl + sizeof(tr), ids, sizeof(ids));
	assert_int_equal(check1(IPC_MSG_TOKENIZE_REPLY, 0, pl, sizeof(tr) + 8, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f),
			 0);
	struct ipc_tokenize_reply_msg trm;
	assert_int_equal(ipc_decode_tokenize_reply(&f, &trm), 0);
	assert_false(trm.more);
	assert_int_equal(ipc_reply_id(&trm, 1), 456);
	assert_int_equal(check1(IPC_MSG_TOKENIZE_REPLY, IPC_F_MORE, pl, sizeof(tr) + 8, IPC_FROM_SERVER,
				IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(ipc_decode_tokenize_reply(&f, &trm), 0);
	assert_true(trm.more);

	/* PS_REPLY */
	struct ipc_ps_reply pr = { .n_total = 1, .n_entries = 1 };
	struct ipc_ps_entry pe = { .request_id = 5, .client_id = 2, .pid = 100, .uid = 1000,
				   .state = IPC_REQ_RUNNING, .pages = 4, .pages_shared = 1, .prompt_tokens = 30,
				   .cached_tokens = 16, .generated_tokens = 3, .max_tokens = 64 };
	memcpy(pl, &pr, sizeof(pr));
	memcpy(pl + sizeof(pr), &pe, sizeof(pe));
	assert_int_equal(check1(IPC_MSG_PS_REPLY, 0, pl, sizeof(pr) + sizeof(pe), IPC_FROM_SERVER, IPC_VIA_SOCKET,
				&f), 0);
	struct ipc_ps_reply_msg pm2;
	assert_int_equal(ipc_decode_ps_reply(&f, &pm2), 0);
	struct ipc_ps_entry pe2;
	ipc_ps_entry_at(&pm2, 0, &pe2);
	assert_memory_equal(&pe, &pe2, sizeof(pe));
}

/* ---- header validation ------------------------------------------------------------- */

static void test_reject_header(void **state)
{
	(void)state;
	struct ipc_hdr h = { .magic = IPC_MAGIC, .version = IPC_PROTO_VERSION, .type = IPC_MSG_CANCEL,
			     .request_id = 5 };
	struct ipc_hdr got;
	uint8_t buf[64] = { 0 };

	memcpy(buf, &h, sizeof(h));
	assert_int_equal(ipc_frame_check(buf, sizeof(h), 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &got), 0);

	/* truncated header */
	assert_int_equal(ipc_frame_check(buf, 10, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &got), -EBADMSG);
	assert_int_equal(got.request_id, 0);
	/* bad magic: the header is still reported, for the ERROR reply */
	struct ipc_hdr b = h;
	b.magic ^= 1;
	memcpy(buf, &b, sizeof(b));
	assert_int_equal(ipc_frame_check(buf, sizeof(b), 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &got), -EBADMSG);
	assert_int_equal(got.request_id, 5);
	/* wrong version */
	b = h;
	b.version = IPC_PROTO_VERSION + 1;
	memcpy(buf, &b, sizeof(b));
	assert_int_equal(ipc_frame_check(buf, sizeof(b), 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL), -EPROTONOSUPPORT);
	/* length mismatch both ways */
	b = h;
	b.length = 4;
	memcpy(buf, &b, sizeof(b));
	assert_int_equal(ipc_frame_check(buf, sizeof(b), 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL), -EBADMSG);
	assert_int_equal(ipc_frame_check(buf, sizeof(b) + 8, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL), -EBADMSG);
	/* oversized: declared beyond the limit, or more bytes than a frame holds */
	b.length = IPC_MAX_PAYLOAD_BYTES + 1;
	memcpy(buf, &b, sizeof(b));
	assert_int_equal(ipc_frame_check(buf, sizeof(b), 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL), -E2BIG);
	assert_int_equal(ipc_frame_check(fbuf, IPC_MAX_FRAME_BYTES + 1, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL) < 0,
			 1);
	/* unknown types */
	uint16_t bad_types[] = { 0, IPC_MSG_TYPE_MAX + 1, 0xffff };
	for (size_t i = 0; i < sizeof(bad_types) / sizeof(bad_types[0]); i++) {
		b = h;
		b.type = bad_types[i];
		memcpy(buf, &b, sizeof(b));
		assert_int_equal(ipc_frame_check(buf, sizeof(b), 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL), -ENOMSG);
	}
	/* wrong direction / transport */
	struct ipc_frame f;
	struct ipc_done d = { .finish_reason = IPC_FINISH_EOS };
	assert_int_equal(check1(IPC_MSG_DONE, 0, &d, sizeof(d), IPC_FROM_CLIENT, IPC_VIA_RING, &f), -EPROTO);
	assert_int_equal(check1(IPC_MSG_CANCEL, 0, NULL, 0, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), -EPROTO);
	assert_int_equal(check1(IPC_MSG_CANCEL, 0, NULL, 0, IPC_FROM_CLIENT, IPC_VIA_RING, &f), -EPROTO);
	struct ipc_token t = { .n_tokens = 1 };
	assert_int_equal(check1(IPC_MSG_TOKEN, 0, &t, sizeof(t), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), -EPROTO);
	/* unknown flag bits */
	assert_int_equal(check1(IPC_MSG_CANCEL, IPC_F_MORE, NULL, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), -EPROTO);
	assert_int_equal(check1(IPC_MSG_CANCEL, 0x80, NULL, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), -EPROTO);
	/* truncated payload of a fixed type, and excess bytes */
	assert_int_equal(check1(IPC_MSG_DONE, 0, &d, sizeof(d) - 4, IPC_FROM_SERVER, IPC_VIA_RING, &f), -EBADMSG);
	uint8_t big[sizeof(d) + 8] = { 0 };
	memcpy(big, &d, sizeof(d));
	assert_int_equal(check1(IPC_MSG_DONE, 0, big, sizeof(big), IPC_FROM_SERVER, IPC_VIA_RING, &f), -EBADMSG);
	assert_int_equal(check1(IPC_MSG_TOKEN, 0, &t, 8, IPC_FROM_SERVER, IPC_VIA_RING, &f), -EBADMSG);
	assert_int_equal(check1(IPC_MSG_CANCEL, 0, "x", 1, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), -EBADMSG);
	/* fds: too many for the type, too few */
	struct ipc_hello hel = { 0 };
	strcpy(hel.client_name, "x");
	struct iovec v = { &hel, sizeof(hel) };
	ssize_t len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_HELLO, 0, 1, &v, 1);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 1, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL), -ETOOMANYREFS);
	struct ipc_welcome w = { 0 };
	v = (struct iovec){ &w, sizeof(w) };
	len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_WELCOME, 0, 1, &v, 1);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 1, IPC_FROM_SERVER, IPC_VIA_SOCKET, NULL), -EBADMSG);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 3, IPC_FROM_SERVER, IPC_VIA_SOCKET, NULL), -ETOOMANYREFS);
	assert_int_equal(ipc_frame_check(fbuf, (size_t)len, 2, IPC_FROM_SERVER, IPC_VIA_SOCKET, NULL), 0);
	/* frames larger than the caller's buffer are refused when built */
	assert_int_equal(ipc_frame_build(buf, 30, IPC_MSG_HELLO, 0, 1, &v, 1), -E2BIG);
}

/* A valid GENERATE to mutate. */
static struct ipc_generate good_gen(void)
{
	return (struct ipc_generate){ .max_tokens = 16, .temperature = 0.7f, .top_p = 0.9f, .min_p = 0.05f,
				      .repeat_penalty = 1.0f, .top_k = 40, .repeat_last_n = 64,
				      .seed = IPC_SEED_RANDOM, .prompt_bytes = 2 };
}

static int gen_check(const struct ipc_generate *g, const void *tail, size_t tail_len)
{
	struct iovec v[2] = { { (void *)g, sizeof(*g) }, { (void *)tail, tail_len } };
	ssize_t len = ipc_frame_build(fbuf, sizeof(fbuf), IPC_MSG_GENERATE, 0, 1, v, 2);
	struct ipc_frame f = { .payload = fbuf + IPC_HDR_BYTES };
	int r = ipc_frame_check(fbuf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr);
	if (r < 0)
		return r;
	struct ipc_generate_msg m;
	return ipc_decode_generate(&f, &m);
}

static void test_reject_generate(void **state)
{
	(void)state;
	struct ipc_generate g = good_gen();
	assert_int_equal(gen_check(&g, "hi", 2), 0);

	g = good_gen(); g.temperature = NAN;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.temperature = -1.0f;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.temperature = INFINITY;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.top_p = 0.0f;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.min_p = 1.0f;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.repeat_penalty = 0.0f;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.top_k = -1;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.max_tokens = 0;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.max_tokens = IPC_MAX_GEN_TOKENS + 1;
	assert_int_equal(gen_check(&g, "hi", 2), -E2BIG);
	g = good_gen(); g.gen_flags = IPC_GEN_ALL + 1;
	assert_int_equal(gen_check(&g, "hi", 2), -EPROTO);
	/* samples and log-probabilities: bounded, the alternatives only with the flag, no session */
	g = good_gen(); g.n_samples = IPC_MAX_SAMPLES; g.gen_flags = IPC_GEN_LOGPROBS; g.top_logprobs = IPC_MAX_TOP_LOGPROBS;
	assert_int_equal(gen_check(&g, "hi", 2), 0);
	g = good_gen(); g.n_samples = IPC_MAX_SAMPLES + 1;
	assert_int_equal(gen_check(&g, "hi", 2), -E2BIG);
	g = good_gen(); g.n_samples = 255;
	assert_int_equal(gen_check(&g, "hi", 2), -E2BIG);
	g = good_gen(); g.gen_flags = IPC_GEN_LOGPROBS; g.top_logprobs = IPC_MAX_TOP_LOGPROBS + 1;
	assert_int_equal(gen_check(&g, "hi", 2), -E2BIG);
	g = good_gen(); g.top_logprobs = 3; /* without IPC_GEN_LOGPROBS */
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	g = good_gen(); g.n_samples = 2; g.session_id = 9;
	assert_int_equal(gen_check(&g, "hi", 2), -EINVAL);
	/* prompt_bytes disagreeing with the frame */
	g = good_gen(); g.prompt_bytes = 3;
	assert_int_equal(gen_check(&g, "hi", 2), -EBADMSG);
	/* inline prompt beyond the inline limit */
	g = good_gen(); g.prompt_bytes = IPC_MAX_INLINE_TEXT_BYTES + 1;
	assert_int_equal(gen_check(&g, fbuf, 0), -E2BIG);
	/* total prompt beyond the protocol limit */
	g = good_gen(); g.prompt_bytes = IPC_MAX_TEXT_BYTES + 1; g.gen_flags = IPC_GEN_PROMPT_IN_RING;
	assert_int_equal(gen_check(&g, NULL, 0), -E2BIG);
	/* in-ring with inline bytes present */
	g = good_gen(); g.gen_flags = IPC_GEN_PROMPT_IN_RING;
	assert_int_equal(gen_check(&g, "hi", 2), -EBADMSG);
	/* system prompt with a raw completion */
	g = good_gen(); g.gen_flags = IPC_GEN_RAW; g.system_bytes = 1;
	assert_int_equal(gen_check(&g, "shi", 3), -EINVAL);
	g = good_gen(); g.system_bytes = IPC_MAX_SYSTEM_BYTES + 1;
	assert_int_equal(gen_check(&g, "hi", 2), -E2BIG);

	/* stop strings: too many, empty, too long, area inconsistent */
	uint8_t area[64];
	g = good_gen(); g.n_stop = IPC_MAX_STOP_STRINGS + 1;
	assert_int_equal(gen_check(&g, "hi", 2), -E2BIG);
	uint16_t l0 = 0;
	memcpy(area, &l0, 2);
	memcpy(area + 2, "hi", 2);
	g = good_gen(); g.n_stop = 1; g.stop_bytes = 2;
	assert_int_equal(gen_check(&g, area, 4), -EINVAL);
	uint16_t l5 = 5;
	memcpy(area, &l5, 2);
	memcpy(area + 2, "abc", 3);
	memcpy(area + 5, "hi", 2);
	g = good_gen(); g.n_stop = 1; g.stop_bytes = 5; /* says 5 bytes of string, area holds 3 */
	assert_int_equal(gen_check(&g, area, 7), -EBADMSG);
	uint16_t l3 = 3;
	memcpy(area, &l3, 2);
	g = good_gen(); g.n_stop = 1; g.stop_bytes = 6; /* one spare byte in the area */
	memcpy(area + 2, "abcX", 4);
	memcpy(area + 6, "hi", 2);
	assert_int_equal(gen_check(&g, area, 8), -EBADMSG);
	g = good_gen(); g.n_stop = 2; g.stop_bytes = 5; /* second string missing */
	memcpy(area + 2, "abc", 3);
	memcpy(area + 5, "hi", 2);
	assert_int_equal(gen_check(&g, area, 7), -EBADMSG);
	uint8_t longstop[2 + IPC_MAX_STOP_BYTES + 1 + 2];
	uint16_t ll = IPC_MAX_STOP_BYTES + 1;
	memcpy(longstop, &ll, 2);
	memset(longstop + 2, 'a', ll);
	memcpy(longstop + 2 + ll, "hi", 2);
	g = good_gen(); g.n_stop = 1; g.stop_bytes = 2 + ll;
	assert_int_equal(gen_check(&g, longstop, sizeof(longstop)), -E2BIG);

	/* The encoder refuses what the decoder would. */
	struct ipc_generate_msg m = { .g = good_gen() };
	m.prompt = "hi";
	m.g.temperature = NAN;
	assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m), -EINVAL);
	m.g = good_gen();
	m.g.n_stop = 1;
	m.stop[0] = "";
	m.stop_len[0] = 0;
	assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m), -EINVAL);
}

/* One turn record by hand: role, padding, announced length and text. */
static size_t turn_rec(uint8_t *out, uint8_t role, uint8_t pad, uint32_t bytes, const char *text, size_t text_len)
{
	out[0] = role;
	out[1] = pad;
	out[2] = out[3] = 0;
	memcpy(out + 4, &bytes, 4);
	memcpy(out + 8, text, text_len);
	return 8 + text_len;
}

static void test_chat_turns(void **state)
{
	(void)state;
	const struct ipc_chat_turn turns[] = {
		{ IPC_CHAT_SYSTEM, 9, "Be brief." },
		{ IPC_CHAT_USER, 2, "Hi" },
		{ IPC_CHAT_ASSISTANT, 0, "" },
		{ IPC_CHAT_USER, 5, "Again" },
	};
	uint8_t buf[256];

	/* size query, then the exact layout: u8 role, 3 zero bytes, u32 bytes, text */
	ssize_t n = ipc_chat_turns_encode(NULL, 0, turns, 4);
	assert_int_equal(n, 4 * 8 + 9 + 2 + 0 + 5);
	assert_int_equal(ipc_chat_turns_encode(buf, 10, turns, 4), n); /* too small: size, nothing written */
	memset(buf, 0xee, sizeof(buf));
	assert_int_equal(ipc_chat_turns_encode(buf, sizeof(buf), turns, 4), n);
	uint8_t want[] = { 1, 0, 0, 0, 9, 0, 0, 0, 'B', 'e', ' ', 'b', 'r', 'i', 'e', 'f', '.',
			   2, 0, 0, 0, 2, 0, 0, 0, 'H', 'i', 3, 0, 0, 0, 0, 0, 0, 0,
			   2, 0, 0, 0, 5, 0, 0, 0, 'A', 'g', 'a', 'i', 'n' };
	assert_int_equal(sizeof(want), (size_t)n);
	assert_memory_equal(buf, want, sizeof(want));
	assert_int_equal(ipc_chat_turns_check(buf, (size_t)n), 4);
	size_t off = 0;
	struct ipc_chat_turn t;
	for (int i = 0; i < 4; i++) {
		assert_int_equal(ipc_chat_turn_next(buf, (size_t)n, &off, &t), 1);
		assert_int_equal(t.role, turns[i].role);
		assert_int_equal(t.bytes, turns[i].bytes);
		assert_memory_equal(t.text, turns[i].text, t.bytes);
	}
	assert_int_equal(ipc_chat_turn_next(buf, (size_t)n, &off, &t), 0);
	assert_string_equal(ipc_chat_role_name(IPC_CHAT_ASSISTANT), "assistant");
	assert_string_equal(ipc_chat_role_name(IPC_CHAT_TOOL_CALLS), "tool_calls");
	assert_string_equal(ipc_chat_role_name(IPC_CHAT_CALL_OPEN), "call_open");
	assert_int_equal(ipc_chat_role_parse("call_open", 9), IPC_CHAT_CALL_OPEN);
	assert_null(ipc_chat_role_name(8));
	assert_int_equal(ipc_chat_role_parse("user", 4), IPC_CHAT_USER);
	assert_int_equal(ipc_chat_role_parse("users", 5), 0);
	assert_int_equal(ipc_chat_role_parse("tool", 4), IPC_CHAT_TOOL);
	assert_int_equal(ipc_chat_role_parse("ipython", 7), 0);

	/* encoder refusals */
	struct ipc_chat_turn bad = { 8, 1, "x" };
	assert_int_equal(ipc_chat_turns_encode(NULL, 0, &bad, 1), -EINVAL);
	bad = (struct ipc_chat_turn){ IPC_CHAT_USER, 3, "a\0b" };
	assert_int_equal(ipc_chat_turns_encode(NULL, 0, &bad, 1), -EINVAL);
	assert_int_equal(ipc_chat_turns_encode(NULL, 0, turns, IPC_MAX_CHAT_TURNS + 1), -E2BIG);
	bad = (struct ipc_chat_turn){ IPC_CHAT_USER, IPC_MAX_TEXT_BYTES, "" };
	struct ipc_chat_turn two[2] = { bad, bad };
	two[0].bytes = two[1].bytes = IPC_MAX_TEXT_BYTES / 2; /* with the heads, past the limit */
	static char big[IPC_MAX_TEXT_BYTES / 2];
	memset(big, 'a', sizeof(big));
	two[0].text = two[1].text = big;
	assert_int_equal(ipc_chat_turns_encode(NULL, 0, two, 2), -E2BIG);

	/* decoder refusals, record by record */
	uint8_t r[64];
	size_t k;
	k = turn_rec(r, IPC_CHAT_USER, 1, 2, "hi", 2); /* padding not zero */
	assert_int_equal(ipc_chat_turns_check(r, k), -EPROTO);
	k = turn_rec(r, 0, 0, 2, "hi", 2); /* role 0 */
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	k = turn_rec(r, 8, 0, 2, "hi", 2); /* role past call_open */
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	k = turn_rec(r, IPC_CHAT_USER, 0, 3, "hi", 2); /* text runs past the end */
	assert_int_equal(ipc_chat_turns_check(r, k), -EBADMSG);
	k = turn_rec(r, IPC_CHAT_USER, 0, 0xffffffffu, "hi", 2); /* huge length */
	assert_int_equal(ipc_chat_turns_check(r, k), -EBADMSG);
	k = turn_rec(r, IPC_CHAT_USER, 0, 2, "hi", 2);
	assert_int_equal(ipc_chat_turns_check(r, k - 3), -EBADMSG); /* truncated text */
	assert_int_equal(ipc_chat_turns_check(r, 5), -EBADMSG);     /* truncated head */
	k = turn_rec(r, IPC_CHAT_USER, 0, 3, "h\0i", 3); /* NUL in the text */
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	assert_int_equal(ipc_chat_turns_check(r, 0), -EINVAL); /* no turns */
	k = turn_rec(r, IPC_CHAT_USER, 0, 2, "hi", 2);
	k += turn_rec(r + k, IPC_CHAT_ASSISTANT, 0, 2, "yo", 2); /* last turn not the user's */
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	k = turn_rec(r, IPC_CHAT_SYSTEM, 0, 2, "be", 2); /* only a system turn */
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	/* a call-open turn: last, empty, after a user or tool turn */
	k = turn_rec(r, IPC_CHAT_USER, 0, 2, "hi", 2);
	k += turn_rec(r + k, IPC_CHAT_CALL_OPEN, 0, 0, "", 0);
	assert_int_equal(ipc_chat_turns_check(r, k), 2);
	k = turn_rec(r, IPC_CHAT_TOOL, 0, 2, "21", 2);
	k += turn_rec(r + k, IPC_CHAT_CALL_OPEN, 0, 0, "", 0);
	assert_int_equal(ipc_chat_turns_check(r, k), 2);
	k = turn_rec(r, IPC_CHAT_USER, 0, 2, "hi", 2);
	k += turn_rec(r + k, IPC_CHAT_CALL_OPEN, 0, 1, "x", 1); /* with text */
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	k = turn_rec(r, IPC_CHAT_CALL_OPEN, 0, 0, "", 0); /* alone */
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	k = turn_rec(r, IPC_CHAT_ASSISTANT, 0, 2, "yo", 2); /* after the assistant */
	k += turn_rec(r + k, IPC_CHAT_CALL_OPEN, 0, 0, "", 0);
	assert_int_equal(ipc_chat_turns_check(r, k), -EINVAL);
	/* more than IPC_MAX_CHAT_TURNS empty user turns */
	static uint8_t many[(IPC_MAX_CHAT_TURNS + 1) * 8];
	for (unsigned i = 0; i <= IPC_MAX_CHAT_TURNS; i++)
		turn_rec(many + 8 * i, IPC_CHAT_USER, 0, 0, "", 0);
	assert_int_equal(ipc_chat_turns_check(many, sizeof(many)), -E2BIG);
	assert_int_equal(ipc_chat_turns_check(many, sizeof(many) - 8), (int)IPC_MAX_CHAT_TURNS);

	/* A GENERATE carrying turns inline: validated with the frame. */
	struct ipc_generate g = good_gen();
	g.gen_flags = IPC_GEN_CHAT_TURNS;
	g.prompt_bytes = (uint32_t)n;
	assert_int_equal(gen_check(&g, buf, (size_t)n), 0);
	k = turn_rec(r, IPC_CHAT_USER, 1, 2, "hi", 2);
	g.prompt_bytes = (uint32_t)k;
	assert_int_equal(gen_check(&g, r, k), -EPROTO); /* a bad record refuses the frame */
	k = turn_rec(r, IPC_CHAT_ASSISTANT, 0, 2, "hi", 2);
	assert_int_equal(gen_check(&g, r, k), -EINVAL);
	/* turns exclude raw text, a separate system text and sessions */
	g = good_gen(); g.gen_flags = IPC_GEN_CHAT_TURNS | IPC_GEN_RAW; g.prompt_bytes = (uint32_t)n;
	assert_int_equal(gen_check(&g, buf, (size_t)n), -EINVAL);
	g = good_gen(); g.gen_flags = IPC_GEN_CHAT_TURNS; g.session_id = 5; g.prompt_bytes = (uint32_t)n;
	assert_int_equal(gen_check(&g, buf, (size_t)n), -EINVAL);
	uint8_t sys_then[256];
	sys_then[0] = 'S';
	memcpy(sys_then + 1, buf, (size_t)n);
	g = good_gen(); g.gen_flags = IPC_GEN_CHAT_TURNS; g.system_bytes = 1; g.prompt_bytes = (uint32_t)n;
	assert_int_equal(gen_check(&g, sys_then, (size_t)n + 1), -EINVAL);
	/* through the ring: only the size is known with the frame; the
	 * receiver checks the list once it has arrived */
	g = good_gen(); g.gen_flags = IPC_GEN_CHAT_TURNS | IPC_GEN_PROMPT_IN_RING; g.prompt_bytes = 100000;
	assert_int_equal(gen_check(&g, NULL, 0), 0);
	/* the encoder checks an inline list like the decoder */
	struct ipc_generate_msg m = { .g = good_gen() };
	m.g.gen_flags = IPC_GEN_CHAT_TURNS;
	k = turn_rec(r, IPC_CHAT_ASSISTANT, 0, 2, "hi", 2);
	m.g.prompt_bytes = (uint32_t)k;
	m.prompt = (const char *)r;
	assert_int_equal(ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m), -EINVAL);
	m.g.prompt_bytes = (uint32_t)n;
	m.prompt = (const char *)buf;
	assert_true(ipc_encode_generate(fbuf, sizeof(fbuf), 1, &m) > 0);
}

/* ---- samples and log-probabilities (IPC_F_SAMPLE) ------------------------------ */

static int token_check(uint32_t flags, const void *p, size_t n, struct ipc_token_msg *m)
{
	struct ipc_frame f;
	int r = check1(IPC_MSG_TOKEN, flags, p, n, IPC_FROM_SERVER, IPC_VIA_RING, &f);
	return r < 0 ? r : ipc_decode_token(&f, m);
}

/* A TOKEN payload of 2 tokens of sample 3, each with 1 + 2 entries. */
static size_t sample_token(uint8_t *buf, size_t cap)
{
	static uint8_t area[512];
	size_t alen = 0;
	const int32_t ids0[3] = { 7, 7, 9 }, ids1[3] = { 12, 5, 12 };
	const float lp0[3] = { -0.25f, -0.25f, -1.5f }, lp1[3] = { -3.0f, -0.1f, -3.0f };
	const char *pc0[3] = { " Paris", " Paris", "\xe2\x82" }, *pc1[3] = { ".", "", "." };
	const uint32_t pl0[3] = { 6, 6, 2 }, pl1[3] = { 1, 0, 1 };
	assert_int_equal(ipc_token_lp_put(area, sizeof(area), &alen, 3, ids0, lp0, pc0, pl0), 0);
	assert_int_equal(ipc_token_lp_put(area, sizeof(area), &alen, 3, ids1, lp1, pc1, pl1), 0);
	assert_int_equal(alen, 2 * 3 * sizeof(struct ipc_logprob) + 14 + 2);
	struct ipc_token t = { .index = 4, .n_tokens = 2, .n_ids = 2, .text_bytes = 7 };
	struct ipc_sample sm = { .sample = 3, .n_top = 2, .lp_flags = IPC_LP_PRESENT };
	const int32_t ids[2] = { 7, 12 };
	ssize_t len = ipc_encode_token_sample(buf, cap, &t, &sm, ids, " Paris.", area, (uint32_t)alen);
	assert_true(len > 0);
	return (size_t)len;
}

static void test_sample_frames(void **state)
{
	(void)state;
	uint8_t pl[1024];
	struct ipc_token_msg m;
	struct ipc_token_lp tl;
	size_t n = sample_token(pl, sizeof(pl)), off = 0;

	assert_int_equal(token_check(IPC_F_SAMPLE, pl, n, &m), 0);
	assert_true(m.has_sample);
	assert_int_equal(m.s.sample, 3);
	assert_int_equal(m.t.n_tokens, 2);
	assert_int_equal(ipc_token_id(&m, 1), 12);
	assert_memory_equal(m.text, " Paris.", 7);
	assert_int_equal(ipc_token_lp_next(&m, &off, &tl), 1);
	assert_int_equal(tl.n, 3);
	assert_int_equal(tl.e[0].id, 7);
	assert_true(tl.e[2].logprob == -1.5f);
	assert_int_equal(tl.e[2].piece_bytes, 2);
	assert_memory_equal(tl.piece[2], "\xe2\x82", 2);
	assert_memory_equal(tl.piece[1], " Paris", 6);
	assert_int_equal(ipc_token_lp_next(&m, &off, &tl), 1);
	assert_int_equal(tl.e[1].id, 5);
	assert_int_equal(tl.e[1].piece_bytes, 0);
	assert_memory_equal(tl.piece[2], ".", 1);
	assert_int_equal(ipc_token_lp_next(&m, &off, &tl), 0);

	/* the same record without the flag is malformed (bytes beyond the text) */
	assert_int_equal(token_check(0, pl, n, &m), -EBADMSG);
	/* hostile fields, each on its own */
	uint8_t bad[1024];
	size_t lp_at = sizeof(struct ipc_token) + sizeof(struct ipc_sample) + 8 + 7;
	struct ipc_sample sm;
	struct ipc_logprob e;
#define MUTATE_SAMPLE(field, value, want)                                                                 \
	do {                                                                                              \
		memcpy(bad, pl, n);                                                                       \
		memcpy(&sm, bad + sizeof(struct ipc_token), sizeof(sm));                                 \
		sm.field = value;                                                                         \
		memcpy(bad + sizeof(struct ipc_token), &sm, sizeof(sm));                                 \
		if (want)                                                                                 \
			assert_int_equal(token_check(IPC_F_SAMPLE, bad, n, &m), want);                    \
		else                                                                                      \
			assert_int_not_equal(token_check(IPC_F_SAMPLE, bad, n, &m), 0);                   \
	} while (0)
	MUTATE_SAMPLE(sample, IPC_MAX_SAMPLES, -E2BIG);
	MUTATE_SAMPLE(sample, UINT32_MAX, -E2BIG);
	MUTATE_SAMPLE(n_top, IPC_MAX_TOP_LOGPROBS + 1, -E2BIG);
	MUTATE_SAMPLE(n_top, 3, 0); /* the area read with the wrong count: refused, whatever it then finds */
	MUTATE_SAMPLE(n_top, 1, 0);
	MUTATE_SAMPLE(n_top, 0, 0);
	MUTATE_SAMPLE(lp_flags, 0x2 | IPC_LP_PRESENT, -EPROTO);
	MUTATE_SAMPLE(lp_flags, 0, -EINVAL); /* alternatives announced without an area */
#define MUTATE_ENTRY(field, value, want)                                                                  \
	do {                                                                                              \
		memcpy(bad, pl, n);                                                                       \
		memcpy(&e, bad + lp_at + sizeof(e), sizeof(e));                                           \
		e.field = value;                                                                          \
		memcpy(bad + lp_at + sizeof(e), &e, sizeof(e));                                           \
		assert_int_equal(token_check(IPC_F_SAMPLE, bad, n, &m), want);                            \
	} while (0)
	MUTATE_ENTRY(logprob, NAN, -EINVAL);
	MUTATE_ENTRY(logprob, 0.5f, -EINVAL);
	MUTATE_ENTRY(logprob, -INFINITY, 0);
	MUTATE_ENTRY(id, -1, -EINVAL);
	MUTATE_ENTRY(reserved0, 1, -EPROTO);
	MUTATE_ENTRY(piece_bytes, IPC_MAX_PIECE_BYTES + 1, -E2BIG);
	MUTATE_ENTRY(piece_bytes, 60000, -E2BIG);
	memcpy(bad, pl, n); /* pieces no longer where the entries say: refused, whatever is read instead */
	memcpy(&e, bad + lp_at + sizeof(e), sizeof(e));
	e.piece_bytes = 7;
	memcpy(bad + lp_at + sizeof(e), &e, sizeof(e));
	assert_int_not_equal(token_check(IPC_F_SAMPLE, bad, n, &m), 0);
#undef MUTATE_SAMPLE
#undef MUTATE_ENTRY
	/* cut short anywhere in the area, or one byte more */
	for (size_t k = lp_at; k < n; k++)
		assert_int_not_equal(token_check(IPC_F_SAMPLE, pl, k, &m), 0);
	memcpy(bad, pl, n);
	bad[n] = 0;
	assert_int_equal(token_check(IPC_F_SAMPLE, bad, n + 1, &m), -EBADMSG);
	/* a flagged record without log-probabilities */
	struct ipc_token t = { .index = 0, .n_tokens = 1, .n_ids = 0, .text_bytes = 2 };
	struct ipc_sample s0 = { .sample = 15 };
	ssize_t len = ipc_encode_token_sample(bad, sizeof(bad), &t, &s0, NULL, "hi", NULL, 0);
	assert_true(len > 0);
	assert_int_equal(token_check(IPC_F_SAMPLE, bad, (size_t)len, &m), 0);
	assert_int_equal(m.s.sample, 15);
	off = 0;
	assert_int_equal(ipc_token_lp_next(&m, &off, &tl), 0);
	/* the encoder refuses what the decoder would */
	s0.sample = 16;
	assert_int_equal(ipc_encode_token_sample(bad, sizeof(bad), &t, &s0, NULL, "hi", NULL, 0), -E2BIG);
	/* lp_put bounds */
	size_t alen = 0;
	const int32_t one_id = 1;
	const float one_lp = -1.0f;
	const char *one_piece = "x";
	const uint32_t one_len = 1;
	assert_int_equal(ipc_token_lp_put(bad, 4, &alen, 1, &one_id, &one_lp, &one_piece, &one_len), -E2BIG);
	assert_int_equal(alen, 0);
	assert_int_equal(ipc_token_lp_put(bad, sizeof(bad), &alen, 0, &one_id, &one_lp, &one_piece, &one_len), -EINVAL);

	/* DONE with IPC_F_SAMPLE: exact size, index bounded, no TOKEN-only fields */
	struct ipc_frame f;
	struct ipc_done d = { .finish_reason = IPC_FINISH_LENGTH, .prompt_tokens = 5, .generated_tokens = 3 }, dd;
	struct ipc_sample ds = { .sample = 2 }, got;
	memcpy(bad, &d, sizeof(d));
	memcpy(bad + sizeof(d), &ds, sizeof(ds));
	assert_int_equal(check1(IPC_MSG_DONE, IPC_F_SAMPLE, bad, sizeof(d) + sizeof(ds), IPC_FROM_SERVER, IPC_VIA_RING, &f), 0);
	assert_int_equal(ipc_decode_done_sample(&f, &dd, &got), 0);
	assert_int_equal(got.sample, 2);
	assert_int_equal(dd.generated_tokens, 3);
	assert_int_equal(ipc_decode_done(&f, &dd), 0);
	check1(IPC_MSG_DONE, 0, bad, sizeof(d) + sizeof(ds), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_done(&f, &dd), -EBADMSG); /* trailing bytes without the flag */
	check1(IPC_MSG_DONE, IPC_F_SAMPLE, bad, sizeof(d), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_done(&f, &dd), -EBADMSG); /* the flag without its struct */
	check1(IPC_MSG_DONE, 0, bad, sizeof(d), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_done_sample(&f, &dd, &got), 0);
	assert_int_equal(got.sample, 0);
	ds.sample = IPC_MAX_SAMPLES;
	memcpy(bad + sizeof(d), &ds, sizeof(ds));
	check1(IPC_MSG_DONE, IPC_F_SAMPLE, bad, sizeof(d) + sizeof(ds), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_done(&f, &dd), -E2BIG);
	ds = (struct ipc_sample){ .sample = 1, .n_top = 1 };
	memcpy(bad + sizeof(d), &ds, sizeof(ds));
	check1(IPC_MSG_DONE, IPC_F_SAMPLE, bad, sizeof(d) + sizeof(ds), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_done(&f, &dd), -EPROTO);
	/* the flag means nothing on other types */
	assert_int_equal(check1(IPC_MSG_ERROR, IPC_F_SAMPLE, bad, sizeof(struct ipc_error), IPC_FROM_SERVER,
				IPC_VIA_RING, &f),
			 -EPROTO);

	/* DONE with IPC_F_SPEC (0.9.0): after the ipc_sample when both are set,
	 * exact size, no more accepted than drafted, zero without the flag */
	struct ipc_done_spec sp = { .drafted_tokens = 9, .accepted_tokens = 7 }, gsp;
	ds = (struct ipc_sample){ .sample = 1 };
	memcpy(bad + sizeof(d), &ds, sizeof(ds));
	memcpy(bad + sizeof(d) + sizeof(ds), &sp, sizeof(sp));
	assert_int_equal(check1(IPC_MSG_DONE, IPC_F_SAMPLE | IPC_F_SPEC, bad, sizeof(d) + sizeof(ds) + sizeof(sp),
				IPC_FROM_SERVER, IPC_VIA_RING, &f),
			 0);
	assert_int_equal(ipc_decode_done_spec(&f, &dd, &got, &gsp), 0);
	assert_int_equal(got.sample, 1);
	assert_int_equal(gsp.drafted_tokens, 9);
	assert_int_equal(gsp.accepted_tokens, 7);
	assert_int_not_equal(check1(IPC_MSG_DONE, IPC_F_SAMPLE | IPC_F_SPEC, bad, sizeof(d) + sizeof(ds), IPC_FROM_SERVER,
				    IPC_VIA_RING, &f),
			     0); /* the flag without its block */
	memcpy(bad + sizeof(d), &sp, sizeof(sp));
	assert_int_equal(check1(IPC_MSG_DONE, IPC_F_SPEC, bad, sizeof(d) + sizeof(sp), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(ipc_decode_done_spec(&f, &dd, NULL, &gsp), 0);
	assert_int_equal(gsp.accepted_tokens, 7);
	assert_int_equal(ipc_decode_done(&f, &dd), 0); /* an older reader's call still works */
	sp.accepted_tokens = 10;
	memcpy(bad + sizeof(d), &sp, sizeof(sp));
	check1(IPC_MSG_DONE, IPC_F_SPEC, bad, sizeof(d) + sizeof(sp), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_done_spec(&f, &dd, NULL, &gsp), -EINVAL);
	check1(IPC_MSG_DONE, 0, bad, sizeof(d), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_done_spec(&f, &dd, NULL, &gsp), 0);
	assert_int_equal(gsp.drafted_tokens, 0);
	assert_int_equal(check1(IPC_MSG_TOKEN, IPC_F_SPEC, bad, sizeof(struct ipc_token), IPC_FROM_SERVER, IPC_VIA_RING,
				&f),
			 -EPROTO); /* DONE's flag only */

	/* PS entries: the sample index is bounded */
	struct {
		struct ipc_ps_reply r;
		struct ipc_ps_entry e;
	} ps = { { 1, 1 }, { .state = IPC_REQ_RUNNING, .sample = IPC_MAX_SAMPLES - 1 } };
	struct ipc_ps_reply_msg pm;
	check1(IPC_MSG_PS_REPLY, 0, &ps, sizeof(ps), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_ps_reply(&f, &pm), 0);
	ps.e.sample = IPC_MAX_SAMPLES;
	check1(IPC_MSG_PS_REPLY, 0, &ps, sizeof(ps), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_ps_reply(&f, &pm), -E2BIG);
}

static void test_reject_payloads(void **state)
{
	(void)state;
	struct ipc_frame f;
	uint8_t pl[128];

	/* HELLO: name not NUL-terminated, non-printable, junk after the NUL */
	struct ipc_hello h;
	memset(&h, 'a', sizeof(h));
	h.client_version = 1;
	h.capabilities = 0;
	struct ipc_hello hh;
	assert_int_equal(check1(IPC_MSG_HELLO, 0, &h, sizeof(h), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(ipc_decode_hello(&f, &hh), -EBADMSG);
	memset(h.client_name, 0, sizeof(h.client_name));
	h.client_name[0] = '\n';
	check1(IPC_MSG_HELLO, 0, &h, sizeof(h), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_hello(&f, &hh), -EBADMSG);
	h.client_name[0] = 'x';
	h.client_name[5] = 'y';
	check1(IPC_MSG_HELLO, 0, &h, sizeof(h), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_hello(&f, &hh), -EBADMSG);
	h.client_name[5] = 0;
	h.capabilities = 0x80;
	check1(IPC_MSG_HELLO, 0, &h, sizeof(h), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_hello(&f, &hh), -EPROTO);

	/* WELCOME: reserved fields, impossible limits */
	struct ipc_welcome w = { .shm_bytes = 1, .block_size = 16, .max_requests = 1 }, ww;
	strcpy(w.model_name, "Sm\xc3\xb6lLM \xe2\x80\x94 135M"); /* UTF-8 names pass */
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), 0);
	w.model_name[2] = '\t';
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), -EBADMSG);
	memset(w.model_name, 0, sizeof(w.model_name));
	w.model_name[0] = 'm';
	/* model_id (0.8.0, the reserved field before): a NUL-padded name */
	strcpy(w.model_id, "SmolLM2-135M-Instruct.Q4_1");
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), 0);
	assert_string_equal(ww.model_id, "SmolLM2-135M-Instruct.Q4_1");
	w.model_id[30] = 'x'; /* garbage after the NUL */
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), -EBADMSG);
	memset(w.model_id, 0, sizeof(w.model_id));
	/* chat_format (0.11.0): the longer WELCOME; 0.8.0's size reads as no
	 * format; a later daemon's longer one is read as far as known */
	strcpy(w.chat_format, "chatml");
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), 0);
	assert_string_equal(ww.chat_format, "chatml");
	check1(IPC_MSG_WELCOME, 0, &w, IPC_WELCOME_V080_BYTES, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), 0);
	assert_string_equal(ww.chat_format, "");
	assert_string_equal(ww.model_name, "m");
	uint8_t longer[sizeof(w) + 16] = { 0 };
	memcpy(longer, &w, sizeof(w));
	check1(IPC_MSG_WELCOME, 0, longer, sizeof(longer), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), 0);
	assert_string_equal(ww.chat_format, "chatml");
	assert_int_equal(check1(IPC_MSG_WELCOME, 0, &w, IPC_WELCOME_V080_BYTES - 4, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f),
			 -EBADMSG);
	w.chat_format[10] = 'x'; /* garbage after the NUL */
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), -EBADMSG);
	memset(w.chat_format, 0, sizeof(w.chat_format));
	memset(w.model_id, 'x', sizeof(w.model_id)); /* no NUL */
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), -EBADMSG);
	memset(w.model_id, 0, sizeof(w.model_id));
	/* kv_type: a kvd_kv_type + 1 up to IPC_KV_TYPE_MAX (0.5.0) */
	w.kv_type = 5;
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), 0);
	assert_int_equal(ww.kv_type, 5);
	w.kv_type = IPC_KV_TYPE_MAX + 1;
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), -EPROTO);
	w.kv_type = 0;
	w.max_text_bytes = IPC_MAX_TEXT_BYTES + 1;
	check1(IPC_MSG_WELCOME, 0, &w, sizeof(w), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_welcome(&f, &ww), -E2BIG);

	/* TOKEN: ids count, limits, lengths */
	struct ipc_token_msg tm;
	struct ipc_token t = { .n_tokens = 2, .n_ids = 1 };
	check1(IPC_MSG_TOKEN, 0, &t, sizeof(t), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	memcpy(pl, &t, sizeof(t));
	check1(IPC_MSG_TOKEN, 0, pl, sizeof(t) + 4, IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_token(&f, &tm), -EBADMSG);
	t = (struct ipc_token){ .n_tokens = 0 };
	check1(IPC_MSG_TOKEN, 0, &t, sizeof(t), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_token(&f, &tm), -EBADMSG);
	t = (struct ipc_token){ .n_tokens = IPC_MAX_TOKENS_PER_RECORD + 1 };
	check1(IPC_MSG_TOKEN, 0, &t, sizeof(t), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_token(&f, &tm), -E2BIG);
	t = (struct ipc_token){ .n_tokens = 1, .text_bytes = 10 };
	memcpy(pl, &t, sizeof(t));
	check1(IPC_MSG_TOKEN, 0, pl, sizeof(t) + 9, IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_token(&f, &tm), -EBADMSG);
	t = (struct ipc_token){ .n_tokens = 1, .index = IPC_MAX_GEN_TOKENS };
	check1(IPC_MSG_TOKEN, 0, &t, sizeof(t), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_token(&f, &tm), -E2BIG);

	/* ERROR: codes outside the accepted ranges, message length */
	struct ipc_error_msg em;
	int32_t bad_codes[] = { 0, 5, -IPC_ERR_BASE, IPC_ERR_LAST - 1, INT32_MIN };
	for (size_t i = 0; i < sizeof(bad_codes) / sizeof(bad_codes[0]); i++) {
		struct ipc_error e = { .code = bad_codes[i] };
		check1(IPC_MSG_ERROR, 0, &e, sizeof(e), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
		assert_int_equal(ipc_decode_error(&f, &em), -EINVAL);
	}
	struct ipc_error e = { .code = -EIO, .msg_bytes = 4 };
	memcpy(pl, &e, sizeof(e));
	check1(IPC_MSG_ERROR, 0, pl, sizeof(e) + 3, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_error(&f, &em), -EBADMSG);
	e.msg_bytes = IPC_MAX_ERROR_MSG_BYTES + 1;
	memcpy(fbuf + 1000, &e, sizeof(e));
	check1(IPC_MSG_ERROR, 0, fbuf + 1000, sizeof(e) + e.msg_bytes, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_error(&f, &em), -E2BIG);

	/* DONE: reason, error consistency, counts */
	struct ipc_done d = { .finish_reason = 9 }, dd;
	check1(IPC_MSG_DONE, 0, &d, sizeof(d), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_done(&f, &dd), -EINVAL);
	d = (struct ipc_done){ .finish_reason = IPC_FINISH_ERROR };
	check1(IPC_MSG_DONE, 0, &d, sizeof(d), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_done(&f, &dd), -EINVAL);
	d = (struct ipc_done){ .finish_reason = IPC_FINISH_EOS, .prompt_tokens = 1, .cached_tokens = 2 };
	check1(IPC_MSG_DONE, 0, &d, sizeof(d), IPC_FROM_SERVER, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_done(&f, &dd), -EINVAL);

	/* STATS: impossible counts, reserved */
	struct ipc_stats s = { .pages_total = 10, .pages_free = 11 }, ss;
	check1(IPC_MSG_STATS_REPLY, 0, &s, sizeof(s), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_stats(&f, &ss), -EINVAL);
	s = (struct ipc_stats){ .prefix_query_tokens = 1, .prefix_hit_tokens = 2 };
	check1(IPC_MSG_STATS_REPLY, 0, &s, sizeof(s), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_stats(&f, &ss), -EINVAL);

	/* TOKENIZE and reply */
	struct ipc_tokenize_msg tkm;
	struct ipc_tokenize tk = { .tok_flags = 0x100 };
	check1(IPC_MSG_TOKENIZE, 0, &tk, sizeof(tk), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_tokenize(&f, &tkm), -EPROTO);
	tk = (struct ipc_tokenize){ .text_bytes = 5 };
	check1(IPC_MSG_TOKENIZE, 0, &tk, sizeof(tk), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_tokenize(&f, &tkm), -EBADMSG);
	tk = (struct ipc_tokenize){ .tok_flags = IPC_TOK_TEXT_IN_RING, .text_bytes = 0 };
	check1(IPC_MSG_TOKENIZE, 0, &tk, sizeof(tk), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_tokenize(&f, &tkm), -EINVAL);
	struct ipc_tokenize_reply_msg trm;
	struct ipc_tokenize_reply tr = { .n_tokens = 2, .offset = 2, .n_ids = 1 };
	memcpy(pl, &tr, sizeof(tr));
	check1(IPC_MSG_TOKENIZE_REPLY, 0, pl, sizeof(tr) + 4, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_tokenize_reply(&f, &trm), -EBADMSG);

	/* PROMPT_DATA: empty, beyond the text limit, length mismatch */
	struct ipc_prompt_data_msg pm;
	struct ipc_prompt_data pd = { .offset = 0, .bytes = 0 };
	check1(IPC_MSG_PROMPT_DATA, 0, &pd, sizeof(pd), IPC_FROM_CLIENT, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_prompt_data(&f, &pm), -EBADMSG);
	pd = (struct ipc_prompt_data){ .offset = IPC_MAX_TEXT_BYTES - 1, .bytes = 2 };
	memcpy(pl, &pd, sizeof(pd));
	check1(IPC_MSG_PROMPT_DATA, 0, pl, sizeof(pd) + 2, IPC_FROM_CLIENT, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_prompt_data(&f, &pm), -E2BIG);
	pd = (struct ipc_prompt_data){ .offset = 0, .bytes = 3 };
	memcpy(pl, &pd, sizeof(pd));
	check1(IPC_MSG_PROMPT_DATA, 0, pl, sizeof(pd) + 2, IPC_FROM_CLIENT, IPC_VIA_RING, &f);
	assert_int_equal(ipc_decode_prompt_data(&f, &pm), -EBADMSG);

	/* SESSION ids, PS entries */
	struct ipc_session zero = { 0 }, sz;
	check1(IPC_MSG_SESSION_CLOSE, 0, &zero, sizeof(zero), IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_session(&f, &sz), -EINVAL);
	struct ipc_ps_reply pr = { .n_total = 1, .n_entries = 2 };
	check1(IPC_MSG_PS_REPLY, 0, &pr, sizeof(pr), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	struct ipc_ps_reply_msg prm;
	assert_int_equal(ipc_decode_ps_reply(&f, &prm), -EBADMSG);
	pr = (struct ipc_ps_reply){ .n_total = 1, .n_entries = 1 };
	struct ipc_ps_entry pe = { .state = 99 };
	memcpy(pl, &pr, sizeof(pr));
	memcpy(pl + sizeof(pr), &pe, sizeof(pe));
	check1(IPC_MSG_PS_REPLY, 0, pl, sizeof(pr) + sizeof(pe), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f);
	assert_int_equal(ipc_decode_ps_reply(&f, &prm), -EINVAL);
}

/* ---- sockets -------------------------------------------------------------------------- */

/* STATS_REPLY grows (0.8.0): 0.7.0's length reads with the newer fields 0,
 * a newer daemon's longer reply reads up to the fields known, and lengths
 * outside [IPC_STATS_V070_BYTES, IPC_MAX_STATS_BYTES] or not a multiple of
 * 8 are refused. */
static void test_stats_length_tolerant(void **state)
{
	(void)state;
	struct ipc_frame f;
	struct ipc_stats s, got;
	uint64_t wide[IPC_MAX_STATS_BYTES / 8 + 1];

	/* an older daemon's reply: exactly 0.7.0's fields */
	memset(&s, 0, sizeof(s));
	s.pages_total = 8;
	s.adopted_hit_tokens = 0;
	s.steps = 3;
	assert_int_equal(check1(IPC_MSG_STATS_REPLY, 0, &s, IPC_STATS_V070_BYTES, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f),
			 0);
	memset(&got, 0xff, sizeof(got));
	assert_int_equal(ipc_decode_stats(&f, &got), 0);
	assert_int_equal(got.pages_total, 8);
	assert_int_equal(got.steps, 3);
	assert_int_equal(got.gram_checked, 0);
	assert_int_equal(got.gram_masked, 0);

	/* this version's reply */
	s.gram_checked = 11;
	s.gram_masked = 12;
	assert_int_equal(check1(IPC_MSG_STATS_REPLY, 0, &s, sizeof(s), IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(ipc_decode_stats(&f, &got), 0);
	assert_int_equal(got.gram_checked, 11);
	assert_int_equal(got.gram_masked, 12);

	/* a newer daemon's: counters past ours are ignored */
	memset(wide, 0x5a, sizeof(wide));
	memcpy(wide, &s, sizeof(s));
	assert_int_equal(check1(IPC_MSG_STATS_REPLY, 0, wide, sizeof(s) + 3 * 8, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f),
			 0);
	memset(&got, 0, sizeof(got));
	assert_int_equal(ipc_decode_stats(&f, &got), 0);
	assert_memory_equal(&got, &s, sizeof(s));
	assert_int_equal(check1(IPC_MSG_STATS_REPLY, 0, wide, IPC_MAX_STATS_BYTES, IPC_FROM_SERVER, IPC_VIA_SOCKET,
				&f),
			 0);
	assert_int_equal(ipc_decode_stats(&f, &got), 0);
	assert_memory_equal(&got, &s, sizeof(s));

	/* too long, not whole counters, shorter than 0.7.0's */
	assert_int_equal(check1(IPC_MSG_STATS_REPLY, 0, wide, IPC_MAX_STATS_BYTES + 8, IPC_FROM_SERVER, IPC_VIA_SOCKET,
				&f),
			 0);
	assert_int_equal(ipc_decode_stats(&f, &got), -EBADMSG);
	assert_int_equal(check1(IPC_MSG_STATS_REPLY, 0, wide, sizeof(s) + 4, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f), 0);
	assert_int_equal(ipc_decode_stats(&f, &got), -EBADMSG);
	assert_int_not_equal(check1(IPC_MSG_STATS_REPLY, 0, &s, IPC_STATS_V070_BYTES - 8, IPC_FROM_SERVER,
				    IPC_VIA_SOCKET, &f),
			     0);
}

static void test_socket_fds_and_limits(void **state)
{
	(void)state;
	int sv[2], efd[5];
	struct ipc_frame f;

	signal(SIGPIPE, SIG_DFL); /* a SIGPIPE would kill the test: MSG_NOSIGNAL must prevent it */
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	for (int i = 0; i < 5; i++)
		efd[i] = eventfd(0, EFD_CLOEXEC);
	int before = count_fds();

	/* Too many fds on a raw datagram: refused, and every fd closed. */
	struct ipc_hello h = { 0 };
	strcpy(h.client_name, "t");
	assert_int_equal(ipc_send(sv[0], IPC_MSG_HELLO, 0, 3, &h, sizeof(h), efd, IPC_MAX_FDS), 0);
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -ETOOMANYREFS);
	assert_int_equal(f.hdr.request_id, 3);
	assert_int_equal(f.n_fds, 0);
	assert_int_equal(count_fds(), before);
	{
		union {
			char b[CMSG_SPACE(sizeof(int) * 5)];
			struct cmsghdr a;
		} ctl;
		struct ipc_hdr hh = { .magic = IPC_MAGIC, .version = IPC_PROTO_VERSION, .type = IPC_MSG_CANCEL,
				      .request_id = 4 };
		struct iovec v = { &hh, sizeof(hh) };
		struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * 5);
		memcpy(CMSG_DATA(c), efd, sizeof(int) * 5);
		assert_int_equal(sendmsg(sv[0], &m, 0), sizeof(hh));
		assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -ETOOMANYREFS);
		assert_int_equal(count_fds(), before);
	}

	/* Oversized datagram: -E2BIG, and the connection goes on. */
	static uint8_t huge[IPC_MAX_FRAME_BYTES + 100];
	struct ipc_hdr hh = { .magic = IPC_MAGIC, .version = IPC_PROTO_VERSION, .type = IPC_MSG_CANCEL,
			      .length = sizeof(huge) - IPC_HDR_BYTES, .request_id = 8 };
	memcpy(huge, &hh, sizeof(hh));
	int sz = 1 << 20;
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	assert_int_equal(send(sv[0], huge, sizeof(huge), 0), sizeof(huge));
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -E2BIG);
	assert_int_equal(f.hdr.request_id, 8);
	/* Truncated datagram, then an empty one. */
	assert_int_equal(send(sv[0], huge, 10, 0), 10);
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -EBADMSG);
	assert_int_equal(send(sv[0], huge, 0, 0), 0);
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -EBADMSG);
	/* Still usable. */
	assert_int_equal(ipc_send(sv[0], IPC_MSG_CANCEL, 0, 9, NULL, 0, NULL, 0), 0);
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), 0);
	assert_int_equal(f.hdr.request_id, 9);
	/* Misuse of the API. */
	assert_int_equal(ipc_recv(sv[1], rbuf, 100, IPC_FROM_CLIENT, &f), -EINVAL);
	assert_int_equal(ipc_send(sv[0], IPC_MSG_CANCEL, 0, 9, NULL, 0, efd, IPC_MAX_FDS + 1), -EINVAL);
	assert_int_equal(ipc_send(sv[0], IPC_MSG_ERROR, 0, 9, huge, IPC_MAX_PAYLOAD_BYTES + 1, NULL, 0), -E2BIG);
	assert_int_equal(ipc_send_error(sv[0], 1, 5, "positive codes are not errors"), -EINVAL);

	/* Error frame helper, with a long message truncated to the limit. */
	char longmsg[IPC_MAX_ERROR_MSG_BYTES + 50];
	memset(longmsg, 'm', sizeof(longmsg) - 1);
	longmsg[sizeof(longmsg) - 1] = 0;
	assert_int_equal(ipc_send_error(sv[1], 12, IPC_ERR_SHUTDOWN, longmsg), 0);
	assert_int_equal(ipc_recv(sv[0], rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f), 0);
	struct ipc_error_msg em;
	assert_int_equal(ipc_decode_error(&f, &em), 0);
	assert_int_equal(em.code, IPC_ERR_SHUTDOWN);
	assert_int_equal(em.msg_bytes, IPC_MAX_ERROR_MSG_BYTES);

	/* Non-blocking receive with nothing queued. */
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -EAGAIN);

	/* The peer vanishes: end of file is -ECONNRESET, sending is -EPIPE. */
	close(sv[0]);
	assert_int_equal(ipc_recv(sv[1], rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -ECONNRESET);
	assert_int_equal(ipc_send(sv[1], IPC_MSG_PONG, 0, 1, &hh, 8, NULL, 0), -EPIPE);
	close(sv[1]);
	for (int i = 0; i < 5; i++)
		close(efd[i]);
}

static void test_socket_listen_connect_cred(void **state)
{
	(void)state;
	char dir[] = "/tmp/kvd-test-ipc-XXXXXX";
	char path[128];
	int lfd, cfd, afd;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/kvd.sock", dir);

	assert_int_equal(ipc_listen(path, 0660, 4, &lfd), 0);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0660);
	/* A second daemon on a live socket is refused. */
	int lfd2;
	assert_int_equal(ipc_listen(path, 0, 4, &lfd2), -EADDRINUSE);
	/* Its probe shows up as a connection that is already closed. */
	assert_int_equal(ipc_accept(lfd, &afd), 0);
	struct ipc_frame f;
	assert_int_equal(ipc_recv(afd, rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), -ECONNRESET);
	close(afd);
	assert_int_equal(ipc_accept(lfd, &afd), -EAGAIN);
	assert_int_equal(ipc_connect(path, &cfd), 0);
	assert_int_equal(ipc_accept(lfd, &afd), 0);
	assert_true(fcntl(afd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(afd, F_GETFD) & FD_CLOEXEC);

	struct ipc_peer_cred pc;
	assert_int_equal(ipc_peer_cred(afd, &pc), 0);
	assert_int_equal(pc.pid, getpid());
	assert_int_equal(pc.uid, getuid());
	assert_int_equal(pc.gid, getgid());
	gid_t groups[256];
	size_t ng = 0;
	int r = ipc_peer_groups(afd, groups, 256, &ng);
	assert_true(r == 0 || r == -ENOPROTOOPT);
	if (r == 0) {
		assert_int_equal(ng, (size_t)getgroups(0, NULL));
		size_t need = 0;
		if (ng > 0) { /* too small a buffer reports the size needed */
			assert_int_equal(ipc_peer_groups(afd, groups, 0, &need), -ERANGE);
			assert_int_equal(need, ng);
		}
	}

	/* Frames pass both ways. */
	struct ipc_ping p = { .nonce = 5 };
	assert_int_equal(ipc_send(cfd, IPC_MSG_PING, 0, 1, &p, sizeof(p), NULL, 0), 0);
	struct pollfd pf = { .fd = afd, .events = POLLIN };
	assert_int_equal(poll(&pf, 1, 5000), 1);
	assert_int_equal(ipc_recv(afd, rbuf, sizeof(rbuf), IPC_FROM_CLIENT, &f), 0);
	assert_int_equal(f.hdr.type, IPC_MSG_PING);
	close(cfd);
	close(afd);
	close(lfd);

	/* A stale socket file (nobody listening) is replaced. */
	assert_int_equal(ipc_connect(path, &cfd), -ECONNREFUSED);
	assert_int_equal(ipc_listen(path, 0, 4, &lfd), 0);
	close(lfd);
	unlink(path);
	/* Something that is not a socket is never removed. */
	int regular = open(path, O_CREAT | O_WRONLY, 0600);
	close(regular);
	assert_int_equal(ipc_listen(path, 0, 4, &lfd), -EEXIST);
	unlink(path);
	rmdir(dir);

	/* Abstract namespace and bad paths. */
	char abs[64];
	snprintf(abs, sizeof(abs), "@kvd-test-ipc-%d", (int)getpid());
	assert_int_equal(ipc_listen(abs, 0, 4, &lfd), 0);
	assert_int_equal(ipc_connect(abs, &cfd), 0);
	close(cfd);
	close(lfd);
	assert_int_equal(ipc_connect(abs, &cfd), -ECONNREFUSED);
	char longp[200];
	memset(longp, 'x', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = 0;
	assert_int_equal(ipc_connect(longp, &cfd), -ENAMETOOLONG);
	assert_int_equal(ipc_connect("/nonexistent/kvd.sock", &cfd), -ENOENT);
}

/* ---- rings ------------------------------------------------------------------------------ */

struct ring_mem {
	void *ctl;
	uint8_t *data;
	uint32_t cap;
};

static struct ring_mem ring_mem_new(uint32_t cap)
{
	struct ring_mem m = { .cap = cap };
	m.ctl = aligned_alloc(64, IPC_RING_CTL_BYTES);
	m.data = aligned_alloc(64, cap);
	ipc_ring_format(m.ctl);
	memset(m.data, 0xee, cap);
	return m;
}

static void ring_mem_free(struct ring_mem *m)
{
	free(m->ctl);
	free(m->data);
}

/* The shared indices, as a hostile peer would write them. */
static uint32_t *shared_head(struct ring_mem *m)
{
	return (uint32_t *)m->ctl;
}
static uint32_t *shared_tail(struct ring_mem *m)
{
	return (uint32_t *)((uint8_t *)m->ctl + 64);
}

static int push1(struct ipc_ring *r, const void *p, size_t n)
{
	struct iovec v = { (void *)p, n };
	return ipc_ring_push(r, &v, 1);
}

static void test_ring_basic(void **state)
{
	(void)state;
	struct ring_mem m = ring_mem_new(256);
	struct ipc_ring *p, *c;
	char buf[256];

	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 200, IPC_RING_PRODUCER, &p), -EINVAL); /* > cap/2 */
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 200, 64, IPC_RING_PRODUCER, &p), -EINVAL);  /* not 2^n */
	assert_int_equal(ipc_ring_attach((uint8_t *)m.ctl + 8, m.data, 256, 64, IPC_RING_PRODUCER, &p), -EINVAL);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_PRODUCER, &p), 0);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);

	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), -EAGAIN);
	assert_int_equal(push1(p, "", 0), -EMSGSIZE);
	assert_int_equal(push1(p, buf, 129), -EMSGSIZE);
	assert_int_equal(push1(p, "abc", 3), 0);
	struct iovec v[3] = { { "de", 2 }, { "", 0 }, { "fgh", 3 } };
	assert_int_equal(ipc_ring_push(p, v, 3), 0);
	assert_int_equal(ipc_ring_used_bytes(c), 8 + 16);
	assert_int_equal(ipc_ring_pop(c, buf, 2), -EMSGSIZE); /* not consumed */
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 3);
	assert_memory_equal(buf, "abc", 3);
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 5);
	assert_memory_equal(buf, "defgh", 5);
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), -EAGAIN);

	/* Fill: 100-byte records take 104 bytes; two fit in 256. */
	memset(buf, 'x', 100);
	assert_int_equal(push1(p, buf, 100), 0);
	assert_int_equal(push1(p, buf, 100), 0);
	assert_int_equal(push1(p, buf, 100), -EAGAIN);
	assert_int_equal(ipc_ring_free_bytes(p), 256 - 208);
	assert_int_equal(push1(p, buf, 44), 0); /* exactly the rest */
	assert_int_equal(ipc_ring_free_bytes(p), 0);
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 100);
	assert_int_equal(push1(p, buf, 100), 0); /* wraps */
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 100);
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 44);
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 100);
	assert_int_equal(ipc_ring_used_bytes(c), 0);

	ipc_ring_free(p);
	ipc_ring_free(c);
	ring_mem_free(&m);
}

static uint64_t xs(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static void fill_record(uint8_t *b, size_t n, uint64_t seq)
{
	uint64_t s = seq * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(xs(&s) >> 56);
}

/* Wrap-around with every record size, and across u32 index overflow. */
static void wrap_run(uint32_t start)
{
	struct ring_mem m = ring_mem_new(256);
	struct ipc_ring *p, *c;
	uint8_t in[128], out[128];
	uint64_t rng = 12345;

	*shared_head(&m) = start;
	*shared_tail(&m) = start;
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_PRODUCER, &p), 0);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);
	uint64_t pushed = 0, popped = 0;
	for (int round = 0; round < 20000; round++) {
		/* push a burst until full, pop a random number */
		for (;;) {
			size_t n = 1 + xs(&rng) % 128;
			fill_record(in, n, pushed);
			int r = push1(p, in, n);
			if (r == -EAGAIN)
				break;
			assert_int_equal(r, 0);
			pushed++;
		}
		int k = (int)(1 + xs(&rng) % 4);
		for (int i = 0; i < k && popped < pushed; i++) {
			ssize_t n = ipc_ring_pop(c, out, sizeof(out));
			assert_true(n > 0);
			uint8_t want[128];
			fill_record(want, (size_t)n, popped);
			assert_memory_equal(out, want, (size_t)n);
			popped++;
		}
	}
	assert_true(pushed > 20000);
	ipc_ring_free(p);
	ipc_ring_free(c);
	ring_mem_free(&m);
}

static void test_ring_wraparound(void **state)
{
	(void)state;
	wrap_run(0);
	wrap_run(0xffffff00u); /* free-running indices overflow u32 */
}

static void test_ring_hostile(void **state)
{
	(void)state;
	struct ring_mem m = ring_mem_new(256);
	struct ipc_ring *p, *c;
	char buf[256];

	/* Corrupt indices at attach time. */
	*shared_head(&m) = 300;
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), -EPROTO);
	*shared_head(&m) = 4;
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), -EPROTO);
	ipc_ring_format(m.ctl);

	/* Consumer: head far beyond the tail. */
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);
	*shared_head(&m) = 256 + 8;
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), -EPROTO);
	*shared_head(&m) = 0; /* even if repaired: the ring stays broken */
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), -EPROTO);
	assert_int_equal(ipc_ring_consumer_prepare_sleep(c), -EPROTO);
	ipc_ring_free(c);

	/* Consumer: head behind the tail (wraps to a huge count), misaligned. */
	ipc_ring_format(m.ctl);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);
	*shared_head(&m) = (uint32_t)-8;
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), -EPROTO);
	ipc_ring_free(c);
	ipc_ring_format(m.ctl);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);
	*shared_head(&m) = 12;
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), -EPROTO);
	ipc_ring_free(c);

	/* Consumer: length words that lie. */
	uint32_t lens[] = { 0, 129, 0xffffffffu, 20 /* > bytes in use */ };
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		ipc_ring_format(m.ctl);
		assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);
		memcpy(m.data, &lens[i], 4);
		*shared_head(&m) = 16;
		assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), -EPROTO);
		ipc_ring_free(c);
	}

	/* Producer: tail beyond its head, misaligned tail. */
	ipc_ring_format(m.ctl);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_PRODUCER, &p), 0);
	assert_int_equal(push1(p, "abc", 3), 0);
	*shared_tail(&m) = 64;
	assert_int_equal(push1(p, "abc", 3), -EPROTO);
	assert_int_equal(ipc_ring_free_bytes(p), -EPROTO);
	assert_int_equal(ipc_ring_producer_prepare_sleep(p, 8), -EPROTO);
	ipc_ring_free(p);
	ipc_ring_format(m.ctl);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_PRODUCER, &p), 0);
	assert_int_equal(push1(p, "abc", 3), 0);
	*shared_tail(&m) = 3;
	assert_int_equal(push1(p, "abc", 3), -EPROTO);
	ipc_ring_free(p);

	/* A peer rewriting our own index changes nothing: we never read it back. */
	ipc_ring_format(m.ctl);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_PRODUCER, &p), 0);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);
	assert_int_equal(push1(p, "abcd", 4), 0);
	*shared_head(&m) = 200; /* consumer would see garbage, the producer must not care */
	*shared_head(&m) = 8;   /* restore what the consumer should see */
	assert_int_equal(push1(p, "efgh", 4), 0); /* producer republishes 16 */
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 4);
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "efgh", 4);
	ipc_ring_free(p);
	ipc_ring_free(c);
	ring_mem_free(&m);
}

/* Sleep protocol: flags, withdrawal and the wake decision. */
static void test_ring_sleep_flags(void **state)
{
	(void)state;
	struct ring_mem m = ring_mem_new(256);
	struct ipc_ring *p, *c;
	char buf[128];

	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_PRODUCER, &p), 0);
	assert_int_equal(ipc_ring_attach(m.ctl, m.data, 256, 128, IPC_RING_CONSUMER, &c), 0);
	assert_false(ipc_ring_producer_should_wake(p)); /* nobody sleeps */
	assert_int_equal(ipc_ring_consumer_prepare_sleep(c), 0);
	assert_int_equal(push1(p, "x", 1), 0);
	assert_true(ipc_ring_producer_should_wake(p));
	assert_false(ipc_ring_producer_should_wake(p)); /* one wake-up per sleep */
	ipc_ring_consumer_end_sleep(c);
	assert_int_equal(ipc_ring_consumer_prepare_sleep(c), 1); /* data there: don't sleep */
	assert_false(ipc_ring_producer_should_wake(p));          /* flag was withdrawn */
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 1);

	memset(buf, 'y', sizeof(buf));
	assert_int_equal(push1(p, buf, 120), 0);
	assert_int_equal(push1(p, buf, 120), 0);
	assert_int_equal(ipc_ring_producer_prepare_sleep(p, 120), 0);
	assert_int_equal(ipc_ring_producer_prepare_sleep(p, 129), -EMSGSIZE);
	assert_int_equal(ipc_ring_pop(c, buf, sizeof(buf)), 120);
	assert_true(ipc_ring_consumer_should_wake(c));
	assert_false(ipc_ring_consumer_should_wake(c));
	assert_int_equal(ipc_ring_producer_prepare_sleep(p, 120), 1);
	ipc_ring_free(p);
	ipc_ring_free(c);
	ring_mem_free(&m);
}

/* ---- SPSC stress with blocking wake-ups ---------------------------------------------------------- */

#define STRESS_RECORDS 2000000u
#define STRESS_WAIT_MS 20000 /* a lost wake-up ends as a failure, not a hang */

struct stress {
	struct ring_mem m;
	struct ipc_ring *p, *c;
	int efd_cons;    /* the consumer sleeps on it */
	int efd_prod;    /* the producer sleeps on it */
	uint64_t sum_in; /* checksum of everything pushed */
	uint64_t prod_sleeps, prod_wakes;
	int prod_err;
};

static uint64_t mix(uint64_t h, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static int sleep_on(int efd)
{
	struct pollfd pf = { .fd = efd, .events = POLLIN };
	int r = poll(&pf, 1, STRESS_WAIT_MS);
	if (r != 1)
		return -ETIMEDOUT;
	uint64_t v;
	if (read(efd, &v, 8) != 8)
		return -EIO;
	return 0;
}

static void *stress_producer(void *arg)
{
	struct stress *s = arg;
	uint8_t rec[200];
	uint64_t rng = 99, h = 0xcbf29ce484222325ull;

	for (uint64_t i = 0; i < STRESS_RECORDS; i++) {
		size_t n = 8 + xs(&rng) % 120;
		memcpy(rec, &i, 8);
		fill_record(rec + 8, n - 8, i);
		h = mix(h, rec, n);
		for (;;) {
			int r = push1(s->p, rec, n);
			if (r == 0)
				break;
			if (r != -EAGAIN) {
				s->prod_err = r;
				return NULL;
			}
			/* Full: make sure the consumer is awake, then sleep. */
			if (ipc_ring_producer_should_wake(s->p))
				eventfd_write(s->efd_cons, 1);
			r = ipc_ring_producer_prepare_sleep(s->p, (uint32_t)n);
			if (r == 0) {
				s->prod_sleeps++;
				r = sleep_on(s->efd_prod);
				ipc_ring_producer_end_sleep(s->p);
				if (r < 0) {
					s->prod_err = r;
					return NULL;
				}
			}
		}
		/* Batch wake-ups: check every 16 records, and at the end. */
		if ((i & 15) == 15 && ipc_ring_producer_should_wake(s->p)) {
			s->prod_wakes++;
			eventfd_write(s->efd_cons, 1);
		}
	}
	if (ipc_ring_producer_should_wake(s->p))
		eventfd_write(s->efd_cons, 1);
	s->sum_in = h;
	return NULL;
}

static void test_ring_spsc_stress(void **state)
{
	(void)state;
	struct stress s = { .m = ring_mem_new(4096) };
	uint8_t rec[256];
	uint64_t h = 0xcbf29ce484222325ull, cons_sleeps = 0;
	pthread_t th;

	s.efd_cons = eventfd(0, EFD_NONBLOCK);
	s.efd_prod = eventfd(0, EFD_NONBLOCK);
	assert_int_equal(ipc_ring_attach(s.m.ctl, s.m.data, 4096, 256, IPC_RING_PRODUCER, &s.p), 0);
	assert_int_equal(ipc_ring_attach(s.m.ctl, s.m.data, 4096, 256, IPC_RING_CONSUMER, &s.c), 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(pthread_create(&th, NULL, stress_producer, &s), 0);

	for (uint64_t i = 0; i < STRESS_RECORDS; i++) {
		ssize_t n;
		for (;;) {
			n = ipc_ring_pop(s.c, rec, sizeof(rec));
			if (n != -EAGAIN)
				break;
			if (ipc_ring_consumer_should_wake(s.c))
				eventfd_write(s.efd_prod, 1);
			int r = ipc_ring_consumer_prepare_sleep(s.c);
			if (r == 0) {
				cons_sleeps++;
				r = sleep_on(s.efd_cons);
				ipc_ring_consumer_end_sleep(s.c);
				if (r < 0)
					fail_msg("consumer: no wake-up at record %llu (lost wake-up?)",
						 (unsigned long long)i);
			}
		}
		assert_true(n >= 8);
		uint64_t seq;
		memcpy(&seq, rec, 8);
		assert_int_equal(seq, i); /* in order, none lost or duplicated */
		h = mix(h, rec, (size_t)n);
		if ((i & 15) == 15 && ipc_ring_consumer_should_wake(s.c))
			eventfd_write(s.efd_prod, 1);
	}
	if (ipc_ring_consumer_should_wake(s.c))
		eventfd_write(s.efd_prod, 1);
	pthread_join(th, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_int_equal(s.prod_err, 0);
	assert_int_equal(h, s.sum_in);
	assert_int_equal(ipc_ring_pop(s.c, rec, sizeof(rec)), -EAGAIN);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("# spsc stress: %u records in %.2f s (%.1f M/s); consumer slept %llu times, producer %llu, "
	       "batched wake-ups %llu\n",
	       STRESS_RECORDS, secs, STRESS_RECORDS / secs / 1e6, (unsigned long long)cons_sleeps,
	       (unsigned long long)s.prod_sleeps, (unsigned long long)s.prod_wakes);
	ipc_ring_free(s.p);
	ipc_ring_free(s.c);
	close(s.efd_cons);
	close(s.efd_prod);
	ring_mem_free(&s.m);
}

/* ---- the shared-memory channel -------------------------------------------------------------------- */

static void test_chan_roundtrip(void **state)
{
	(void)state;
	struct ipc_chan *srv, *cli;
	int fds[IPC_WELCOME_N_FDS], dfds[IPC_WELCOME_N_FDS];
	struct ipc_frame f;

	assert_int_equal(ipc_chan_create(&(struct ipc_chan_config){ .c2s_bytes = 100000 }, &srv), -EINVAL);
	assert_int_equal(ipc_chan_create(&(struct ipc_chan_config){ .s2c_bytes = 8192 }, &srv), -EINVAL);
	assert_int_equal(ipc_chan_create(&(struct ipc_chan_config){ .c2s_bytes = 65536, .s2c_bytes = 16384 }, &srv), 0);
	ipc_chan_fds(srv, fds);
	int seals = fcntl(fds[0], F_GET_SEALS);
	assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_int_equal(ftruncate(fds[0], 1 << 20), -1); /* really sealed */
	for (int i = 0; i < IPC_WELCOME_N_FDS; i++)
		dfds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
	assert_int_equal(ipc_chan_attach(dfds[0], dfds[1], &cli), 0);
	assert_int_equal(ipc_chan_tx_max_payload(cli), 32768 - IPC_HDR_BYTES);
	assert_int_equal(ipc_chan_tx_max_payload(srv), 8192 - IPC_HDR_BYTES);

	/* client -> server upload record */
	struct ipc_prompt_data pd = { .offset = 0, .bytes = 5 };
	assert_int_equal(ipc_chan_recv(srv, rbuf, sizeof(rbuf), &f), -EAGAIN);
	assert_int_equal(ipc_chan_prepare_wait(srv, IPC_WAIT_RX, 0), 0); /* server may sleep */
	assert_int_equal(ipc_chan_send(cli, IPC_MSG_PROMPT_DATA, 0, 3, &pd, sizeof(pd), "hello", 5), 0);
	assert_int_equal(ipc_chan_wake_peer(cli), 1);
	assert_int_equal(ipc_chan_wake_peer(cli), 0);
	struct pollfd pf = { .fd = ipc_chan_wait_fd(srv), .events = POLLIN };
	assert_int_equal(poll(&pf, 1, 1000), 1);
	assert_int_equal(ipc_chan_ack(srv), 0);
	assert_int_equal(poll(&pf, 1, 0), 0);
	assert_int_equal(ipc_chan_recv(srv, rbuf, sizeof(rbuf), &f), 0);
	assert_int_equal(f.hdr.type, IPC_MSG_PROMPT_DATA);
	assert_int_equal(f.hdr.request_id, 3);
	struct ipc_prompt_data_msg pm;
	assert_int_equal(ipc_decode_prompt_data(&f, &pm), 0);
	assert_memory_equal(pm.data, "hello", 5);
	/* A client may not send server messages through its ring. */
	struct ipc_done d = { .finish_reason = IPC_FINISH_EOS };
	assert_int_equal(ipc_chan_send(cli, IPC_MSG_DONE, 0, 3, &d, sizeof(d), NULL, 0), 0);
	assert_int_equal(ipc_chan_recv(srv, rbuf, sizeof(rbuf), &f), -EPROTO);

	/* server -> client token stream, until full, with the sleep protocol */
	int32_t ids[1] = { 42 };
	int sent = 0;
	for (;;) {
		int r = ipc_chan_send_token(srv, 3, (uint32_t)sent, 1, ids, 1, "tok", 3);
		if (r == -EAGAIN)
			break;
		assert_int_equal(r, 0);
		sent++;
	}
	assert_true(sent > 100);
	assert_int_equal(ipc_chan_tx_room(srv, 28), 0);
	assert_int_equal(ipc_chan_prepare_wait(srv, IPC_WAIT_TX, 28), 0);
	for (int i = 0; i < sent; i++) {
		assert_int_equal(ipc_chan_recv(cli, rbuf, sizeof(rbuf), &f), 0);
		struct ipc_token_msg tm;
		assert_int_equal(ipc_decode_token(&f, &tm), 0);
		assert_int_equal(tm.t.index, (uint32_t)i);
		assert_int_equal(ipc_token_id(&tm, 0), 42);
		if (i == 0)
			assert_int_equal(ipc_chan_wake_peer(cli), 1); /* the server waits for room */
	}
	assert_int_equal(poll(&pf, 1, 1000), 1);
	ipc_chan_ack(srv);
	assert_int_equal(ipc_chan_tx_room(srv, 28), 1);
	assert_int_equal(ipc_chan_send_error(srv, 3, -EIO, "boom"), 0);
	assert_int_equal(ipc_chan_send_error(srv, 3, 17, "bad"), -EINVAL);
	assert_int_equal(ipc_chan_send_token(srv, 3, 0, 0, NULL, 0, "", 0), -EINVAL);
	assert_int_equal(ipc_chan_send(srv, IPC_MSG_DONE, 0, 3, fbuf, 9000, NULL, 0), -EMSGSIZE);
	assert_int_equal(ipc_chan_recv(cli, rbuf, sizeof(rbuf), &f), 0);
	struct ipc_error_msg em;
	assert_int_equal(ipc_decode_error(&f, &em), 0);
	assert_int_equal(em.code, -EIO);

	/* A hostile client scribbles on the upload ring's head. */
	uint8_t *shm = mmap(NULL, ipc_chan_shm_bytes(srv), PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	assert_true(shm != MAP_FAILED);
	*(volatile uint32_t *)(shm + SHM_C2S_CTL) = 0xdeadbee8u;
	assert_int_equal(ipc_chan_recv(srv, rbuf, sizeof(rbuf), &f), -EPROTO);
	assert_int_equal(ipc_chan_prepare_wait(srv, IPC_WAIT_RX, 0), -EPROTO);
	munmap(shm, ipc_chan_shm_bytes(srv));

	ipc_chan_free(cli);
	ipc_chan_free(srv);
}

/* A memfd laid out like a channel, with one header field changed. */
static int forged_memfd(size_t size, const void *hdr, size_t hdr_len, unsigned seals)
{
	int fd = memfd_create("forged", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(pwrite(fd, hdr, hdr_len, 0), (ssize_t)hdr_len);
	if (seals)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

static void test_chan_attach_rejects(void **state)
{
	(void)state;
	struct ipc_chan *srv, *cli;
	int fds[IPC_WELCOME_N_FDS];
	uint32_t hdr[16];
	const unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

	assert_int_equal(ipc_chan_create(NULL, &srv), 0);
	ipc_chan_fds(srv, fds);
	size_t size = ipc_chan_shm_bytes(srv);
	assert_int_equal(pread(fds[0], hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
	int before = count_fds();

	/* Not a memfd. */
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	assert_int_equal(ipc_chan_attach(pipefd[0], fds[1], &cli), -EINVAL);
	/* A wake-up fd that is not an AF_UNIX datagram socket. */
	assert_int_equal(ipc_chan_attach(fds[0], pipefd[0], &cli), -EINVAL);
	int efd = eventfd(0, EFD_CLOEXEC), sp[2];
	assert_int_equal(ipc_chan_attach(fds[0], efd, &cli), -EINVAL);
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
	assert_int_equal(ipc_chan_attach(fds[0], sp[0], &cli), -EINVAL);
	close(sp[0]);
	close(sp[1]);
	close(efd);
	close(pipefd[0]);
	close(pipefd[1]);
	/* Unsealed, or only partly sealed. */
	int fd = forged_memfd(size, hdr, sizeof(hdr), 0);
	assert_int_equal(ipc_chan_attach(fd, fds[1], &cli), -EPERM);
	close(fd);
	fd = forged_memfd(size, hdr, sizeof(hdr), F_SEAL_SHRINK | F_SEAL_SEAL);
	assert_int_equal(ipc_chan_attach(fd, fds[1], &cli), -EPERM);
	close(fd);
	/* A faithful copy is accepted (the test's forgery works). */
	fd = forged_memfd(size, hdr, sizeof(hdr), seals);
	assert_int_equal(ipc_chan_attach(fd, fcntl(fds[1], F_DUPFD_CLOEXEC, 0), &cli), 0);
	ipc_chan_free(cli);
	/* Each field of the layout broken in turn. Fields: magic, version,
	 * total, c2s ctl, c2s data, c2s bytes, s2c ctl, s2c data, s2c bytes. */
	struct {
		int field;
		uint32_t value;
	} bad[] = {
		{ 0, 0x12345678 }, { 1, 1 }, { 2, 4096 }, { 3, 4090 }, { 3, 0 }, { 3, 256 } /* overlaps s2c */,
		{ 4, 0 } /* in the header page */, { 4, (uint32_t)size } /* beyond the end */, { 5, 12345 },
		{ 5, 4096 } /* below the minimum */, { 6, 72 } /* misaligned */, { 7, 4096 } /* overlaps c2s */,
		{ 8, 1u << 30 }, { 9, 1 } /* reserved */,
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint32_t h2[16];
		memcpy(h2, hdr, sizeof(h2));
		h2[bad[i].field] = bad[i].value;
		fd = forged_memfd(size, h2, sizeof(h2), seals);
		int r = ipc_chan_attach(fd, fds[1], &cli);
		if (r != -EBADMSG)
			fail_msg("layout field %d = %u: got %d, want -EBADMSG", bad[i].field, bad[i].value, r);
		close(fd);
	}
	/* Corrupt ring indices in an otherwise good channel. */
	uint8_t page[4096];
	memset(page, 0, sizeof(page));
	memcpy(page, hdr, sizeof(hdr));
	uint32_t bogus = 12345;
	memcpy(page + SHM_S2C_CTL, &bogus, 4);
	fd = forged_memfd(size, page, sizeof(page), seals);
	assert_int_equal(ipc_chan_attach(fd, fds[1], &cli), -EPROTO);
	close(fd);
	/* Failures leave the caller's fds alone and leak nothing. */
	assert_int_equal(count_fds(), before);
	assert_true(fcntl(fds[1], F_GETFD) >= 0);
	ipc_chan_free(srv);
}

/*
 * A hostile client owns its end of the wake-up pair outright: it clears
 * O_NONBLOCK on it, floods the server's end with wake-ups, never reads the
 * ones it gets, shuts its end down and finally closes it. No server-side
 * call may block or spin on any of that (alarm() ends a hang), and the
 * server's fd must not report a hang-up that would keep epoll firing.
 */
static void test_chan_hostile_wake_fd(void **state)
{
	(void)state;
	struct ipc_chan *srv, *cli;
	int fds[IPC_WELCOME_N_FDS];

	assert_int_equal(ipc_chan_create(NULL, &srv), 0);
	assert_int_equal(ipc_chan_fds(srv, fds), 0);
	int memfd = fcntl(fds[0], F_DUPFD_CLOEXEC, 0), wake = fcntl(fds[1], F_DUPFD_CLOEXEC, 0);
	ipc_chan_handed_over(srv);
	assert_int_equal(ipc_chan_attach(memfd, wake, &cli), 0);
	int fl = fcntl(wake, F_GETFL);
	assert_int_equal(fcntl(wake, F_SETFL, fl & ~O_NONBLOCK), 0);
	/* The server's end has its own file status flags. */
	assert_true(fcntl(ipc_chan_wait_fd(srv), F_GETFL) & O_NONBLOCK);

	/* Flood the server's end until the kernel refuses more. */
	uint64_t v = 1;
	int sent = 0;
	while (send(wake, &v, sizeof(v), MSG_DONTWAIT) > 0)
		sent++;
	assert_true(sent > 0);
	/* The server drains a bounded number per ack and never blocks. */
	for (int i = 0; i <= sent / IPC_CHAN_ACK_MAX; i++)
		assert_int_equal(ipc_chan_ack(srv), 0);
	assert_int_equal(ipc_chan_ack(srv), 0); /* nothing left: still returns */

	/* The client asks to be woken for every record and never reads its
	 * wake-ups: the server's sends fill the client's queue, then find it
	 * full, and still return at once. */
	int32_t id = 1;
	for (int i = 0; i < 2048; i++) {
		if (ipc_chan_prepare_wait(cli, IPC_WAIT_RX, 0) != 0) {
			/* data present: read one record to keep going */
			struct ipc_frame f;
			assert_int_equal(ipc_chan_recv(cli, rbuf, sizeof(rbuf), &f), 0);
			continue;
		}
		assert_int_equal(ipc_chan_send_token(srv, 1, (uint32_t)i, 1, &id, 1, "x", 1), 0);
		assert_int_equal(ipc_chan_wake_peer(srv), 1);
	}

	/* shutdown() of the client's end does not reach the server's end. */
	assert_int_equal(shutdown(wake, SHUT_RDWR), 0);
	assert_int_equal(ipc_chan_ack(srv), 0);
	struct pollfd pf = { .fd = ipc_chan_wait_fd(srv), .events = POLLIN | POLLRDHUP };
	assert_int_equal(poll(&pf, 1, 0), 0);
	/* Closing it: a wake-up it asked for fails at once (no queueing,
	 * no block), and the server's end still reports nothing. */
	struct ipc_frame f;
	while (ipc_chan_recv(cli, rbuf, sizeof(rbuf), &f) == 0)
		;
	assert_int_equal(ipc_chan_prepare_wait(cli, IPC_WAIT_RX, 0), 0);
	ipc_chan_free(cli);
	assert_int_equal(poll(&pf, 1, 0), 0);
	assert_int_equal(ipc_chan_send_token(srv, 1, 0, 1, &id, 1, "x", 1), 0);
	assert_int_equal(ipc_chan_wake_peer(srv), -ECONNREFUSED);
	ipc_chan_free(srv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_fixed),
		cmocka_unit_test(test_roundtrip_welcome_with_fds),
		cmocka_unit_test(test_roundtrip_generate),
		cmocka_unit_test(test_roundtrip_variable),
		cmocka_unit_test(test_reject_header),
		cmocka_unit_test(test_reject_generate),
		cmocka_unit_test(test_chat_turns),
		cmocka_unit_test(test_reject_payloads),
		cmocka_unit_test(test_stats_length_tolerant),
		cmocka_unit_test(test_sample_frames),
		cmocka_unit_test(test_socket_fds_and_limits),
		cmocka_unit_test(test_socket_listen_connect_cred),
		cmocka_unit_test(test_ring_basic),
		cmocka_unit_test(test_ring_wraparound),
		cmocka_unit_test(test_ring_hostile),
		cmocka_unit_test(test_ring_sleep_flags),
		cmocka_unit_test(test_ring_spsc_stress),
		cmocka_unit_test(test_chan_roundtrip),
		cmocka_unit_test(test_chan_attach_rejects),
		cmocka_unit_test(test_chan_hostile_wake_fd),
	};
	alarm(240);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
