/*
 * tests/unit/test_kvclient.c — libkvclient end to end against a fake kvd.
 *
 * The fake server is a thread speaking the real protocol through ipc/ on
 * one end of a socketpair (or an abstract listening socket): it answers
 * HELLO with WELCOME and a real shared-memory channel, and GENERATE with a
 * token stream scripted by the prompt ("hello", "forever", "vanish", ...).
 * It validates everything the library sends with the ipc decoders, so the
 * tests check the client's encoding as well as its handling of streams,
 * cancellation, error frames, back-pressure on both rings, and a daemon
 * that disappears mid-stream (-ECONNRESET, never a hang).
 *
 * Checks inside the server thread record the first failing line; each
 * test asserts it is 0 after joining. The binary runs under alarm().
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc.h"
#include "kvclient.h"

/* ---- the fake daemon --------------------------------------------------------- */

enum hello_mode { HELLO_OK, HELLO_WRONG_VERSION, HELLO_DENY };

struct fake_cfg {
	uint32_t c2s_bytes, s2c_bytes; /* 0: defaults */
	enum hello_mode hello;
	int listen_fd;                 /* >= 0: accept one client from it first */
	bool loop;                     /* with listen_fd: serve clients one after another until stop */
	uint32_t server_version;       /* in WELCOME; 0: 0.1.0 (before chat turns) */
};

struct pending {
	struct pending *next;
	size_t len;
	_Alignas(8) uint8_t buf[];
};

struct fake {
	struct fake_cfg cfg;
	int fd;
	struct ipc_chan *ch;
	pthread_t th;
	int failed_line;
	atomic_int cancels;
	atomic_bool stop;              /* ends the accept loop */
	bool gone;                     /* the client went away or we quit */
	uint64_t cancelled[64];
	int n_cancelled;
	struct pending *pending;       /* frames read while streaming */
	/* an upload in progress */
	bool up_active;
	uint64_t up_id;
	int up_kind;                   /* IPC_MSG_GENERATE or IPC_MSG_TOKENIZE */
	uint32_t up_total, up_have, up_tok_flags;
	char *up_data;
	/* what the last GENERATE asked for (under lock: the test reads it) */
	pthread_mutex_t lock;
	struct ipc_generate last_gen;
	char last_stop[IPC_MAX_STOP_STRINGS][IPC_MAX_STOP_BYTES + 1];
	char last_system[256];
	_Alignas(64) uint8_t sbuf[IPC_MAX_FRAME_BYTES];
	_Alignas(64) uint8_t rbuf[IPC_MAX_FRAME_BYTES];
	_Alignas(64) uint8_t obuf[IPC_MAX_FRAME_BYTES];
};

#define SRV_CHECK(s, cond)                                                                                   \
	do {                                                                                                 \
		if (!(cond) && !(s)->failed_line) {                                                          \
			(s)->failed_line = __LINE__;                                                         \
			fprintf(stderr, "fake server: check failed at line %d: %s\n", __LINE__, #cond);     \
		}                                                                                            \
	} while (0)

static const struct ipc_stats fake_stats = {
	.pages_total = 1000, .pages_free = 600, .pages_used = 300, .pages_shared = 50, .pages_cached = 100,
	.pages_swapped = 7, .page_bytes = 368640, .block_size = 16, .kv_bytes_per_token = 23040,
	.pool_bytes = 1000ull * 368640, .tokens_resident = 4700, .slack_tokens = 100, .prefix_lookups = 12,
	.prefix_query_tokens = 900, .prefix_hit_tokens = 300, .requests_running = 3, .requests_waiting = 2,
	.requests_swapped = 1, .requests_completed = 99, .clients = 4, .sessions = 1, .steps = 1234,
	.uptime_ns = 5000000000ull, .gram_checked = 5, .gram_masked = 6,
};
/* STATS_REPLY's length the fake server sends (0: this build's whole struct) */
static _Atomic size_t g_stats_reply_bytes;
#define FAKE_PS_ENTRIES 2000u
#define FAKE_SESSION 42u
#define FAKE_MAX_TEXT (8u << 20)

static bool was_cancelled(struct fake *s, uint64_t id)
{
	for (int i = 0; i < s->n_cancelled; i++)
		if (s->cancelled[i] == id)
			return true;
	return false;
}

/* Socket send that waits for room (the socket is non-blocking). */
static int fsendv(struct fake *s, uint16_t type, uint32_t flags, uint64_t id, const struct iovec *v, int n,
		  const int *fds, unsigned n_fds)
{
	for (;;) {
		int r = ipc_sendv(s->fd, type, flags, id, v, n, fds, n_fds);
		if (r != -EAGAIN)
			return r;
		struct pollfd p = { .fd = s->fd, .events = POLLOUT };
		poll(&p, 1, 1000);
	}
}

static int fsend(struct fake *s, uint16_t type, uint32_t flags, uint64_t id, const void *p, size_t n)
{
	struct iovec v = { (void *)p, n };
	return fsendv(s, type, flags, id, &v, n ? 1 : 0, NULL, 0);
}

/* Read socket frames without blocking: CANCEL is noted at once, anything
 * else is kept for the main loop. Returns -ECONNRESET when the client left. */
static int poll_socket(struct fake *s)
{
	struct ipc_frame f;
	for (;;) {
		int r = ipc_recv(s->fd, s->sbuf, sizeof(s->sbuf), IPC_FROM_CLIENT, &f);
		if (r == -EAGAIN)
			return 0;
		if (r == -ECONNRESET) {
			s->gone = true;
			return r;
		}
		SRV_CHECK(s, r == 0);
		if (r < 0)
			return r;
		if (f.hdr.type == IPC_MSG_CANCEL) {
			atomic_fetch_add(&s->cancels, 1);
			if (s->n_cancelled < 64)
				s->cancelled[s->n_cancelled++] = f.hdr.request_id;
			continue;
		}
		size_t len = IPC_HDR_BYTES + f.hdr.length;
		struct pending *p = malloc(sizeof(*p) + len), **tail = &s->pending;
		memcpy(p->buf, s->sbuf, len);
		p->len = len;
		p->next = NULL;
		while (*tail)
			tail = &(*tail)->next;
		*tail = p;
	}
}

/* Push one ring record, sleeping (with the flag protocol) while full. */
static int push_rec_f(struct fake *s, uint16_t type, uint32_t flags, uint64_t id, const void *p1, size_t n1,
		      const void *p2, size_t n2)
{
	for (;;) {
		int r = ipc_chan_send(s->ch, type, flags, id, p1, n1, p2, n2);
		if (r == 0) {
			ipc_chan_wake_peer(s->ch);
			return 0;
		}
		SRV_CHECK(s, r == -EAGAIN);
		if (r != -EAGAIN)
			return r;
		ipc_chan_wake_peer(s->ch);
		r = ipc_chan_prepare_wait(s->ch, IPC_WAIT_TX, (uint32_t)(n1 + n2));
		SRV_CHECK(s, r >= 0);
		if (r == 0) {
			struct pollfd p[2] = { { .fd = s->fd, .events = 0 },
					       { .fd = ipc_chan_wait_fd(s->ch), .events = POLLIN } };
			poll(p, 2, 10000);
			ipc_chan_ack(s->ch);
			if (p[0].revents & (POLLHUP | POLLERR)) {
				s->gone = true;
				return -ECONNRESET;
			}
		}
	}
}

static int push_rec(struct fake *s, uint16_t type, uint64_t id, const void *p1, size_t n1, const void *p2, size_t n2)
{
	return push_rec_f(s, type, 0, id, p1, n1, p2, n2);
}

/* Samples and log-probabilities, as kvd streams them: n samples, sample i
 * with i + 1 tokens ("s<i>t<k>", id 100 * i + k), interleaved; with the
 * flag each token has 1 + top entries: itself at -0.5 - k, then ids
 * 900 + j at -1 - j with the piece "a<j>"; each sample ends with its own
 * DONE (sample 0 by eos, the others by length). "badsample": a record for
 * sample n. */
static void run_samples(struct fake *s, uint64_t id, bool hostile)
{
	const struct ipc_generate *g = &s->last_gen;
	uint32_t n = g->n_samples > 1 ? g->n_samples : 1, top = g->top_logprobs;
	bool lp = g->gen_flags & IPC_GEN_LOGPROBS;
	uint8_t buf[4096], area[2048];

	for (uint32_t k = 0; k < n; k++)
		for (uint32_t i = 0; i < n; i++) {
			if (k > i)
				continue;
			char text[32], pieces[1 + IPC_MAX_TOP_LOGPROBS][16];
			int32_t ids[1 + IPC_MAX_TOP_LOGPROBS];
			float vals[1 + IPC_MAX_TOP_LOGPROBS];
			const char *pp[1 + IPC_MAX_TOP_LOGPROBS];
			uint32_t pl[1 + IPC_MAX_TOP_LOGPROBS];
			size_t alen = 0;
			snprintf(text, sizeof(text), "s%ut%u", i, k);
			int32_t tid = (int32_t)(100 * i + k);
			for (uint32_t j = 0; j <= top; j++) {
				ids[j] = j ? (int32_t)(900 + j) : tid;
				vals[j] = j ? -1.0f - (float)j : -0.5f - (float)k;
				if (j)
					snprintf(pieces[j], sizeof(pieces[j]), "a%u", j);
				else
					snprintf(pieces[j], sizeof(pieces[j]), "T");
				pp[j] = pieces[j];
				pl[j] = (uint32_t)strlen(pieces[j]);
			}
			if (lp)
				SRV_CHECK(s, ipc_token_lp_put(area, sizeof(area), &alen, 1 + top, ids, vals, pp, pl) == 0);
			struct ipc_token t = { .index = k, .n_tokens = 1, .n_ids = 1, .text_bytes = (uint32_t)strlen(text) };
			struct ipc_sample sm = { .sample = hostile ? n : i, .n_top = (uint16_t)(lp ? top : 0),
						 .lp_flags = lp ? IPC_LP_PRESENT : 0 };
			ssize_t len = ipc_encode_token_sample(buf, sizeof(buf), &t, &sm, &tid, text, area, (uint32_t)alen);
			if (hostile) { /* what the encoder refuses, on the wire by hand */
				memcpy(buf, &t, sizeof(t));
				memcpy(buf + sizeof(t), &sm, sizeof(sm));
				memcpy(buf + sizeof(t) + sizeof(sm), &tid, 4);
				memcpy(buf + sizeof(t) + sizeof(sm) + 4, text, t.text_bytes);
				len = (ssize_t)(sizeof(t) + sizeof(sm) + 4 + t.text_bytes);
			}
			SRV_CHECK(s, len > 0);
			if (push_rec_f(s, IPC_MSG_TOKEN, IPC_F_SAMPLE, id, buf, (size_t)len, NULL, 0) < 0 || hostile)
				return;
			if (k == i) {
				struct ipc_done d = { .finish_reason = i ? IPC_FINISH_LENGTH : IPC_FINISH_EOS,
						      .prompt_tokens = 5, .cached_tokens = 2, .generated_tokens = i + 1,
						      .decode_ns = 1000u * (i + 1), .total_ns = 5000u + i };
				struct ipc_sample ds = { .sample = i };
				push_rec_f(s, IPC_MSG_DONE, IPC_F_SAMPLE, id, &d, sizeof(d), &ds, sizeof(ds));
			}
		}
}

static int push_token(struct fake *s, uint64_t id, uint32_t index, int32_t tid, bool want_ids, const char *text)
{
	struct ipc_token t = { .index = index, .n_tokens = 1, .n_ids = want_ids ? 1 : 0,
			       .text_bytes = (uint32_t)strlen(text) };
	uint8_t b[sizeof(t) + 4 + 256];
	size_t n = sizeof(t);
	memcpy(b, &t, sizeof(t));
	if (want_ids) {
		memcpy(b + n, &tid, 4);
		n += 4;
	}
	return push_rec(s, IPC_MSG_TOKEN, id, b, n, text, t.text_bytes);
}

static int push_done(struct fake *s, uint64_t id, uint32_t reason, uint32_t prompt, uint32_t generated)
{
	struct ipc_done d = { .finish_reason = reason, .prompt_tokens = prompt, .cached_tokens = prompt / 2,
			      .generated_tokens = generated, .queue_ns = 1000, .ttft_ns = 2000000,
			      .decode_ns = generated ? 1000000ull * generated : 0, .total_ns = 9000000 };
	return push_rec(s, IPC_MSG_DONE, id, &d, sizeof(d), NULL, 0);
}

static uint64_t fnv(const char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
	return h;
}

static bool starts(const char *p, size_t n, const char *lit)
{
	size_t l = strlen(lit);
	return n >= l && memcmp(p, lit, l) == 0;
}

/* The scripted behaviours, chosen by the prompt. */
static void run_generate(struct fake *s, uint64_t id, const char *prompt, size_t len)
{
	bool ids = s->last_gen.gen_flags & IPC_GEN_WANT_IDS;
	char text[256];

	if (s->last_gen.gen_flags & IPC_GEN_CHAT_TURNS) { /* the turn list, checked as kvd checks it */
		snprintf(text, sizeof(text), "turns=%d len=%zu sum=%016llx", ipc_chat_turns_check(prompt, len), len,
			 (unsigned long long)fnv(prompt, len));
		push_token(s, id, 0, 1, ids, text);
		push_done(s, id, IPC_FINISH_LENGTH, (uint32_t)len, 1);
		return;
	}

	if (starts(prompt, len, "samples") || starts(prompt, len, "badsample")) {
		run_samples(s, id, starts(prompt, len, "badsample"));
	} else if (starts(prompt, len, "hello")) {
		const char *parts[] = { "Hel", "lo", " world", "!" };
		for (uint32_t i = 0; i < 4; i++)
			if (push_token(s, id, i, 10 + (int32_t)i, ids, parts[i]) < 0)
				return;
		push_done(s, id, IPC_FINISH_EOS, (uint32_t)len, 4);
	} else if (starts(prompt, len, "stop")) {
		push_token(s, id, 0, 1, ids, "a");
		push_done(s, id, IPC_FINISH_STOP, (uint32_t)len, 1);
	} else if (starts(prompt, len, "error-context")) {
		SRV_CHECK(s, ipc_send_error(s->fd, id, IPC_ERR_CONTEXT, "prompt of 9000 tokens exceeds n_ctx 8192") == 0);
	} else if (starts(prompt, len, "midfail")) {
		push_token(s, id, 0, 1, ids, "a");
		push_token(s, id, 1, 2, ids, "b");
		SRV_CHECK(s, ipc_chan_send_error(s->ch, id, -EIO, "engine exploded") == 0);
		ipc_chan_wake_peer(s->ch);
	} else if (starts(prompt, len, "vanish")) {
		for (uint32_t i = 0; i < 3; i++)
			push_token(s, id, i, 1, ids, "v");
		s->gone = true; /* the main loop closes everything and exits */
	} else if (starts(prompt, len, "shutdown")) {
		push_token(s, id, 0, 1, ids, "s");
		SRV_CHECK(s, ipc_send_error(s->fd, 0, IPC_ERR_SHUTDOWN, "kvd is stopping") == 0);
		s->gone = true;
	} else if (starts(prompt, len, "forever")) {
		uint32_t i;
		for (i = 0; i < 20000; i++) {
			if (poll_socket(s) < 0)
				return;
			if (was_cancelled(s, id))
				break;
			if (push_token(s, id, i, 5, ids, "x") < 0)
				return;
			usleep(1000);
		}
		push_done(s, id, i < 20000 ? IPC_FINISH_CANCELLED : IPC_FINISH_LENGTH, (uint32_t)len, i);
	} else if (starts(prompt, len, "many:")) {
		uint32_t n = (uint32_t)strtoul(prompt + 5, NULL, 10), i;
		for (i = 0; i < n; i++) {
			if ((i & 63) == 0 && (poll_socket(s) < 0 || was_cancelled(s, id)))
				break;
			snprintf(text, sizeof(text), "t%u;", i);
			if (push_token(s, id, i, (int32_t)i, ids, text) < 0)
				return;
		}
		if (!s->gone)
			push_done(s, id, i == n ? IPC_FINISH_LENGTH : IPC_FINISH_CANCELLED, (uint32_t)len, i);
	} else if (starts(prompt, len, "silent")) {
		/* never answers */
	} else if (starts(prompt, len, "params")) {
		const struct ipc_generate *g = &s->last_gen;
		snprintf(text, sizeof(text), "max=%u temp=%.2f top_p=%.2f top_k=%d min_p=%.2f rep=%.2f last=%d seed=%llu "
			 "session=%llu flags=%x stops=%u",
			 g->max_tokens, g->temperature, g->top_p, g->top_k, g->min_p, g->repeat_penalty, g->repeat_last_n,
			 (unsigned long long)g->seed, (unsigned long long)g->session_id, g->gen_flags, g->n_stop);
		push_token(s, id, 0, 1, ids, text);
		push_done(s, id, IPC_FINISH_LENGTH, (uint32_t)len, 1);
	} else {
		snprintf(text, sizeof(text), "len=%zu sum=%016llx", len, (unsigned long long)fnv(prompt, len));
		push_token(s, id, 0, 1, ids, text);
		push_done(s, id, IPC_FINISH_LENGTH, (uint32_t)len, 1);
	}
}

static void run_tokenize(struct fake *s, uint64_t id, uint32_t flags, const char *text, size_t len)
{
	if (starts(text, len, "tok-error")) {
		SRV_CHECK(s, ipc_send_error(s->fd, id, -EINVAL, "the tokenizer refuses this text") == 0);
		return;
	}
	/* Token ids: BOS = 1 when asked, then one id per byte. */
	uint32_t bos = (flags & IPC_TOK_ADD_BOS) ? 1 : 0;
	uint32_t total = (uint32_t)len + bos;
	if (flags & IPC_TOK_COUNT_ONLY) {
		struct ipc_tokenize_reply r = { .n_tokens = total };
		SRV_CHECK(s, fsend(s, IPC_MSG_TOKENIZE_REPLY, 0, id, &r, sizeof(r)) == 0);
		return;
	}
	uint32_t off = 0;
	do {
		uint32_t n = total - off < IPC_MAX_IDS_PER_FRAME ? total - off : IPC_MAX_IDS_PER_FRAME;
		struct ipc_tokenize_reply r = { .n_tokens = total, .offset = off, .n_ids = n };
		int32_t *ids = (int32_t *)(void *)s->obuf;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t k = off + i;
			ids[i] = bos && k == 0 ? 1 : (int32_t)(uint8_t)text[k - bos];
		}
		struct iovec v[2] = { { &r, sizeof(r) }, { ids, 4u * n } };
		SRV_CHECK(s, fsendv(s, IPC_MSG_TOKENIZE_REPLY, off + n < total ? IPC_F_MORE : 0, id, v, 2, NULL, 0) == 0);
		off += n;
	} while (off < total);
}

static void start_upload(struct fake *s, uint64_t id, int kind, uint32_t total, uint32_t tok_flags)
{
	SRV_CHECK(s, !s->up_active);
	s->up_active = true;
	s->up_id = id;
	s->up_kind = kind;
	s->up_total = total;
	s->up_have = 0;
	s->up_tok_flags = tok_flags;
	s->up_data = malloc(total);
}

/* Consume upload records; run the request once its text is complete. */
static void pump_upload(struct fake *s)
{
	struct ipc_frame f;

	while (s->up_active && !s->gone) {
		int r = ipc_chan_recv(s->ch, s->rbuf, sizeof(s->rbuf), &f);
		if (r == -EAGAIN) {
			ipc_chan_wake_peer(s->ch);
			if (ipc_chan_prepare_wait(s->ch, IPC_WAIT_RX, 0) == 0)
				return; /* the main loop sleeps on the wake-up socket */
			continue;
		}
		SRV_CHECK(s, r == 0);
		if (r < 0)
			return;
		SRV_CHECK(s, f.hdr.type == IPC_MSG_PROMPT_DATA && f.hdr.request_id == s->up_id);
		struct ipc_prompt_data_msg m;
		SRV_CHECK(s, ipc_decode_prompt_data(&f, &m) == 0);
		SRV_CHECK(s, m.offset == s->up_have && m.bytes <= s->up_total - s->up_have);
		memcpy(s->up_data + s->up_have, m.data, m.bytes);
		s->up_have += m.bytes;
		if (s->up_have == s->up_total) {
			s->up_active = false;
			ipc_chan_wake_peer(s->ch);
			if (s->up_kind == IPC_MSG_GENERATE)
				run_generate(s, s->up_id, s->up_data, s->up_total);
			else
				run_tokenize(s, s->up_id, s->up_tok_flags, s->up_data, s->up_total);
			free(s->up_data);
			s->up_data = NULL;
		}
	}
	ipc_chan_wake_peer(s->ch);
}

static void handle_frame(struct fake *s, const struct ipc_frame *f)
{
	uint64_t id = f->hdr.request_id;

	switch (f->hdr.type) {
	case IPC_MSG_GENERATE: {
		struct ipc_generate_msg m;
		int r = ipc_decode_generate(f, &m);
		SRV_CHECK(s, r == 0);
		if (r < 0)
			return;
		pthread_mutex_lock(&s->lock);
		s->last_gen = m.g;
		for (unsigned i = 0; i < m.g.n_stop; i++) {
			memcpy(s->last_stop[i], m.stop[i], m.stop_len[i]);
			s->last_stop[i][m.stop_len[i]] = 0;
		}
		size_t sl = m.g.system_bytes < sizeof(s->last_system) - 1 ? m.g.system_bytes : sizeof(s->last_system) - 1;
		memcpy(s->last_system, m.system, sl);
		s->last_system[sl] = 0;
		pthread_mutex_unlock(&s->lock);
		if (m.g.gen_flags & IPC_GEN_PROMPT_IN_RING) {
			SRV_CHECK(s, m.g.prompt_bytes <= FAKE_MAX_TEXT);
			start_upload(s, id, IPC_MSG_GENERATE, m.g.prompt_bytes, 0);
			pump_upload(s);
		} else {
			run_generate(s, id, m.prompt, m.g.prompt_bytes);
		}
		return;
	}
	case IPC_MSG_TOKENIZE: {
		struct ipc_tokenize_msg m;
		int r = ipc_decode_tokenize(f, &m);
		SRV_CHECK(s, r == 0);
		if (r < 0)
			return;
		if (m.t.tok_flags & IPC_TOK_TEXT_IN_RING) {
			start_upload(s, id, IPC_MSG_TOKENIZE, m.t.text_bytes, m.t.tok_flags);
			pump_upload(s);
		} else {
			run_tokenize(s, id, m.t.tok_flags, m.text, m.t.text_bytes);
		}
		return;
	}
	case IPC_MSG_STATS:
		SRV_CHECK(s, fsend(s, IPC_MSG_STATS_REPLY, 0, id, &fake_stats,
				   g_stats_reply_bytes ? g_stats_reply_bytes : sizeof(fake_stats)) == 0);
		return;
	case IPC_MSG_SESSION_OPEN: {
		struct ipc_session_open o;
		SRV_CHECK(s, ipc_decode_session_open(f, &o) == 0);
		struct ipc_session ss = { .session_id = FAKE_SESSION };
		SRV_CHECK(s, fsend(s, IPC_MSG_SESSION_OPENED, 0, id, &ss, sizeof(ss)) == 0);
		return;
	}
	case IPC_MSG_SESSION_CLOSE: {
		struct ipc_session ss;
		SRV_CHECK(s, ipc_decode_session(f, &ss) == 0);
		if (ss.session_id == FAKE_SESSION)
			SRV_CHECK(s, fsend(s, IPC_MSG_SESSION_CLOSED, 0, id, &ss, sizeof(ss)) == 0);
		else
			SRV_CHECK(s, ipc_send_error(s->fd, id, IPC_ERR_SESSION, "no such session") == 0);
		return;
	}
	case IPC_MSG_PS: {
		uint32_t off = 0;
		while (off < FAKE_PS_ENTRIES) {
			uint32_t n = FAKE_PS_ENTRIES - off < IPC_MAX_PS_PER_FRAME ? FAKE_PS_ENTRIES - off : IPC_MAX_PS_PER_FRAME;
			struct ipc_ps_reply r = { .n_total = FAKE_PS_ENTRIES, .n_entries = n };
			struct ipc_ps_entry *e = (struct ipc_ps_entry *)(void *)s->obuf;
			for (uint32_t i = 0; i < n; i++)
				e[i] = (struct ipc_ps_entry){ .request_id = off + i + 1, .client_id = 7, .pid = 1000 + off + i,
							      .uid = 1000, .state = IPC_REQ_RUNNING, .pages = 10,
							      .pages_shared = 3, .prompt_tokens = 40, .cached_tokens = 16,
							      .generated_tokens = off + i, .max_tokens = 100000 };
			struct iovec v[2] = { { &r, sizeof(r) }, { e, n * sizeof(*e) } };
			off += n;
			SRV_CHECK(s, fsendv(s, IPC_MSG_PS_REPLY, off < FAKE_PS_ENTRIES ? IPC_F_MORE : 0, id, v, 2, NULL, 0) == 0);
		}
		return;
	}
	case IPC_MSG_PING: {
		struct ipc_ping p;
		SRV_CHECK(s, ipc_decode_ping(f, &p) == 0);
		SRV_CHECK(s, fsend(s, IPC_MSG_PONG, 0, id, &p, sizeof(p)) == 0);
		return;
	}
	default:
		SRV_CHECK(s, !"unexpected frame type");
	}
}

static void handshake(struct fake *s)
{
	struct ipc_frame f;
	struct pollfd p = { .fd = s->fd, .events = POLLIN };

	poll(&p, 1, 10000);
	int r = ipc_recv(s->fd, s->sbuf, sizeof(s->sbuf), IPC_FROM_CLIENT, &f);
	SRV_CHECK(s, r == 0 && f.hdr.type == IPC_MSG_HELLO);
	struct ipc_hello h;
	SRV_CHECK(s, r == 0 && ipc_decode_hello(&f, &h) == 0);
	SRV_CHECK(s, h.client_version == KVC_VERSION && (h.capabilities & IPC_CAP_RING_PROMPT));

	if (s->cfg.hello == HELLO_DENY) {
		ipc_send_error(s->fd, 0, IPC_ERR_DENIED, "uid 1000 is not in AllowUsers");
		s->gone = true;
		return;
	}
	struct ipc_chan_config cc = { .c2s_bytes = s->cfg.c2s_bytes, .s2c_bytes = s->cfg.s2c_bytes };
	SRV_CHECK(s, ipc_chan_create(&cc, &s->ch) == 0);
	struct ipc_welcome w = { .server_version = s->cfg.server_version ? s->cfg.server_version : 0x000100, .capabilities = IPC_CAP_SESSIONS, .client_id = 7,
				 .n_vocab = 49152, .n_ctx = 8192, .block_size = 16, .n_layers = 30, .n_kv_heads = 3,
				 .head_dim = 64, .kv_dtype_bytes = 4, .max_text_bytes = FAKE_MAX_TEXT,
				 .max_requests = 8, .max_gen_tokens = 200000, .shm_bytes = ipc_chan_shm_bytes(s->ch),
				 .kv_bytes_per_token = 46080, .pool_bytes = 1ull << 30 };
	strcpy(w.model_name, "fake-model");
	int fds[IPC_WELCOME_N_FDS];
	SRV_CHECK(s, ipc_chan_fds(s->ch, fds) == 0);
	if (s->cfg.hello == HELLO_WRONG_VERSION) {
		struct iovec v = { &w, sizeof(w) };
		ssize_t n = ipc_frame_build(s->obuf, sizeof(s->obuf), IPC_MSG_WELCOME, 0, f.hdr.request_id, &v, 1);
		uint16_t ver = IPC_PROTO_VERSION + 1;
		memcpy(s->obuf + 4, &ver, 2);
		SRV_CHECK(s, send(s->fd, s->obuf, (size_t)n, MSG_NOSIGNAL) == n);
		s->gone = true;
		return;
	}
	struct iovec v = { &w, sizeof(w) };
	SRV_CHECK(s, fsendv(s, IPC_MSG_WELCOME, 0, f.hdr.request_id, &v, 1, fds, IPC_WELCOME_N_FDS) == 0);
	ipc_chan_handed_over(s->ch);
}

/* One connection, from HELLO to its end. */
static void serve_conn(struct fake *s)
{
	struct ipc_frame f;

	s->gone = false;
	s->n_cancelled = 0;
	s->up_active = false;
	handshake(s);
	while (!s->gone) {
		/* Frames that arrived while streaming first, then the socket. */
		while (s->pending && !s->gone) {
			struct pending *p = s->pending;
			s->pending = p->next;
			f.hdr = *(struct ipc_hdr *)(void *)p->buf;
			f.payload = p->buf + IPC_HDR_BYTES;
			f.n_fds = 0;
			handle_frame(s, &f);
			free(p);
		}
		if (poll_socket(s) < 0)
			break;
		if (s->pending)
			continue;
		if (s->up_active)
			pump_upload(s);
		if (s->gone || s->pending)
			continue;
		struct pollfd p[2] = { { .fd = s->fd, .events = POLLIN },
				       { .fd = ipc_chan_wait_fd(s->ch), .events = POLLIN } };
		poll(p, 2, 20000);
		ipc_chan_ack(s->ch);
	}
	while (s->pending) {
		struct pending *p = s->pending;
		s->pending = p->next;
		free(p);
	}
	free(s->up_data);
	ipc_chan_free(s->ch);
	s->ch = NULL;
	if (s->fd >= 0)
		close(s->fd); /* the client sees the connection end */
	s->fd = -1;
}

static void *fake_main(void *arg)
{
	struct fake *s = arg;

	if (s->cfg.listen_fd < 0) {
		serve_conn(s);
		return NULL;
	}
	do {
		struct pollfd p = { .fd = s->cfg.listen_fd, .events = POLLIN };
		if (poll(&p, 1, s->cfg.loop ? 100 : 10000) != 1)
			continue;
		int r = ipc_accept(s->cfg.listen_fd, &s->fd);
		if (r == -EAGAIN)
			continue;
		SRV_CHECK(s, r == 0);
		serve_conn(s);
	} while (s->cfg.loop && !atomic_load(&s->stop));
	return NULL;
}

static struct fake *fake_new(const struct fake_cfg *cfg)
{
	struct fake *s = aligned_alloc(64, (sizeof(struct fake) + 63) & ~(size_t)63);
	memset(s, 0, sizeof(*s));
	if (cfg)
		s->cfg = *cfg;
	else
		s->cfg.listen_fd = -1;
	s->fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	return s;
}

/* Start a fake daemon on a socketpair and connect a client to it. */
static struct fake *fake_start(const struct fake_cfg *cfg, kvc_client **ret_c, int expect)
{
	int sv[2];
	struct fake *s = fake_new(cfg);
	s->cfg.listen_fd = -1;
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	s->fd = sv[0];
	fcntl(s->fd, F_SETFL, O_NONBLOCK);
	assert_int_equal(pthread_create(&s->th, NULL, fake_main, s), 0);
	int r = kvc_connect_fd(sv[1], ret_c);
	assert_int_equal(r, expect);
	if (r < 0) {
		close(sv[1]);
		*ret_c = NULL;
	}
	return s;
}

static void fake_finish(struct fake *s, kvc_client *c)
{
	kvc_close(c);
	pthread_join(s->th, NULL);
	int line = s->failed_line;
	free(s);
	assert_int_equal(line, 0);
}

/* ---- helpers on the client side -------------------------------------------------- */

struct collect {
	char text[1 << 16];
	size_t len;
	int32_t ids[64];
	uint32_t n_ids;
	uint32_t events;
	uint32_t stop_after; /* cancel by returning 1 at this event (0: never) */
};

static int collect_cb(void *ud, const struct kvc_event *ev)
{
	struct collect *c = ud;
	c->events++;
	if (c->len + ev->text_len < sizeof(c->text)) {
		memcpy(c->text + c->len, ev->text, ev->text_len);
		c->len += ev->text_len;
		c->text[c->len] = 0;
	}
	assert_int_equal(ev->text[ev->text_len], '\0');
	for (uint32_t i = 0; ev->ids && i < ev->n_tokens && c->n_ids < 64; i++)
		c->ids[c->n_ids++] = ev->ids[i];
	return c->stop_after && c->events >= c->stop_after;
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_version_and_strerror(void **state)
{
	(void)state;
	assert_int_equal(kvc_version(), KVC_VERSION);
	assert_string_equal(kvc_version_string(), KVC_VERSION_STRING);
	char v[32];
	snprintf(v, sizeof(v), "%d.%d.%d", KVC_VERSION_MAJOR, KVC_VERSION_MINOR, KVC_VERSION_PATCH);
	assert_string_equal(v, KVC_VERSION_STRING);
	assert_string_equal(kv_strerror(0), "Success");
	assert_string_equal(kv_strerror(-ECONNRESET), "Connection reset by peer");
	assert_string_equal(kv_strerror(-ENOENT), "No such file or directory");
	assert_non_null(strstr(kv_strerror(KVC_ERR_CONTEXT), "context"));
	assert_non_null(strstr(kv_strerror(KVC_ERR_VERSION), "protocol"));
	int codes[] = { KVC_ERR_VERSION, KVC_ERR_CONTEXT, KVC_ERR_SHUTDOWN, KVC_ERR_LIMIT,
			KVC_ERR_ENGINE, KVC_ERR_SESSION, KVC_ERR_DENIED };
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		assert_string_not_equal(kv_strerror(codes[i]), "Unknown error");
	assert_string_equal(kv_strerror(-99999), "Unknown error");
	assert_string_equal(kv_strerror(5), "Unknown error");
	assert_string_equal(kvc_finish_name(KVC_FINISH_STOP), "stop");
	assert_string_equal(kvc_req_state_name(KVC_REQ_SWAPPED), "swapped");
}

static void test_connect_info_ping(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	const struct kvc_info *i = kvc_server_info(c);
	assert_string_equal(i->model_name, "fake-model");
	assert_int_equal(i->n_ctx, 8192);
	assert_int_equal(i->n_layers, 30);
	assert_int_equal(i->kv_bytes_per_token, 46080);
	assert_int_equal(i->max_prompt_bytes, FAKE_MAX_TEXT);
	assert_int_equal(i->client_id, 7);
	uint64_t rtt = 0;
	assert_int_equal(kvc_ping(c, &rtt), 0);
	assert_true(rtt > 0);
	assert_int_equal(kvc_ping(c, NULL), 0);
	fake_finish(s, c);
}

static void test_generate_callback(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct kvc_gen_params p;
	kvc_gen_params_init(&p);
	p.flags = KVC_GEN_WANT_IDS;
	struct collect col = { 0 };
	struct kvc_result res;
	assert_int_equal(kvc_generate(c, "hello there", KVC_NTS, &p, collect_cb, &col, &res), 0);
	assert_string_equal(col.text, "Hello world!");
	assert_int_equal(col.events, 4);
	assert_int_equal(col.n_ids, 4);
	for (int k = 0; k < 4; k++)
		assert_int_equal(col.ids[k], 10 + k);
	assert_int_equal(res.finish_reason, KVC_FINISH_EOS);
	assert_int_equal(res.error, 0);
	assert_int_equal(res.prompt_tokens, 11);
	assert_int_equal(res.cached_tokens, 5);
	assert_int_equal(res.generated_tokens, 4);
	assert_int_equal(res.ttft_ns, 2000000);

	/* Without WANT_IDS, no ids; a stop-string finish is success too. */
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, "stop", 4, NULL, collect_cb, &col, &res), 0);
	assert_int_equal(col.n_ids, 0);
	assert_int_equal(res.finish_reason, KVC_FINISH_STOP);
	/* A NULL callback just runs the request. */
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), 0);
	fake_finish(s, c);
}

static void test_params_on_the_wire(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct kvc_gen_params p;
	kvc_gen_params_init(&p);
	assert_int_equal(p.max_tokens, 256);
	assert_true(p.seed == KVC_SEED_RANDOM);
	const char *stops[] = { "\n\n", "User:" };
	p.max_tokens = 77;
	p.temperature = 0.0f;
	p.top_k = 5;
	p.seed = 1234;
	p.session_id = FAKE_SESSION;
	p.system = "Be brief.";
	p.stop = stops;
	p.n_stop = 2;
	struct collect col = { 0 };
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, collect_cb, &col, NULL), 0);
	assert_string_equal(col.text, "max=77 temp=0.00 top_p=0.95 top_k=5 min_p=0.05 rep=1.00 last=64 seed=1234 "
				      "session=42 flags=0 stops=2");
	pthread_mutex_lock(&s->lock);
	char stop0[IPC_MAX_STOP_BYTES + 1], stop1[IPC_MAX_STOP_BYTES + 1], sys[256];
	snprintf(stop0, sizeof(stop0), "%s", s->last_stop[0]);
	snprintf(stop1, sizeof(stop1), "%s", s->last_stop[1]);
	snprintf(sys, sizeof(sys), "%s", s->last_system);
	pthread_mutex_unlock(&s->lock);
	assert_string_equal(stop0, "\n\n");
	assert_string_equal(stop1, "User:");
	assert_string_equal(sys, "Be brief.");

	/* Bad parameters are refused before anything is sent. */
	const char *nine[9] = { "a", "b", "c", "d", "e", "f", "g", "h", "i" };
	p.stop = nine;
	p.n_stop = 9;
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, NULL, NULL, NULL), -E2BIG);
	const char *empty[] = { "" };
	p.stop = empty;
	p.n_stop = 1;
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	char longstop[300];
	memset(longstop, 's', 299);
	longstop[299] = 0;
	const char *lp[] = { longstop };
	p.stop = lp;
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, NULL, NULL, NULL), -E2BIG);
	kvc_gen_params_init(&p);
	p.flags = KVC_GEN_RAW;
	p.system = "sys";
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	kvc_gen_params_init(&p);
	p.temperature = NAN;
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	kvc_gen_params_init(&p);
	p.max_tokens = 0;
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	kvc_gen_params_init(&p);
	p.flags = 0x80;
	assert_int_equal(kvc_generate(c, "params", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	size_t big = FAKE_MAX_TEXT + 1;
	char *huge = malloc(big);
	memset(huge, 'a', big);
	assert_int_equal(kvc_generate(c, huge, big, NULL, NULL, NULL, NULL), -E2BIG);
	free(huge);
	/* The connection is still fine. */
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), 0);
	fake_finish(s, c);
}

/* Samples and log-probabilities: the events of each sample, their
 * log-probabilities with the pieces, each sample's result and the
 * request's; bad parameters never leave the client; a record for a sample
 * the request does not have ends the connection. */
static void test_samples_and_logprobs(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(&(struct fake_cfg){ .server_version = IPC_SAMPLES_SERVER_VERSION }, &c, 0);
	struct kvc_gen_params p;
	kvc_gen_params_init(&p);
	p.n_samples = 3;
	p.flags = KVC_GEN_LOGPROBS | KVC_GEN_WANT_IDS;
	p.top_logprobs = 2;
	kvc_request *q;
	const struct kvc_event *ev;
	uint32_t next[3] = { 0 };
	char text[3][64] = { "", "", "" };
	assert_int_equal(kvc_request_start(c, "samples", KVC_NTS, &p, &q), 0);
	int r;
	while ((r = kvc_request_next(q, &ev)) == 1) {
		assert_true(ev->sample < 3);
		assert_int_equal(ev->index, next[ev->sample]); /* each sample's own order */
		next[ev->sample] += ev->n_tokens;
		strncat(text[ev->sample], ev->text, ev->text_len);
		assert_non_null(ev->logprobs);
		for (uint32_t t = 0; t < ev->n_tokens; t++) {
			const struct kvc_token_logprobs *tl = &ev->logprobs[t];
			uint32_t k = ev->index + t;
			assert_int_equal(tl->token.id, ev->ids[t]);
			assert_int_equal(tl->token.id, (int32_t)(100 * ev->sample + k));
			assert_true(tl->token.logprob == -0.5f - (float)k);
			assert_int_equal(tl->token.n_bytes, 1);
			assert_memory_equal(tl->token.bytes, "T", 1);
			assert_int_equal(tl->n_top, 2);
			for (uint32_t j = 0; j < 2; j++) {
				char want[8];
				snprintf(want, sizeof(want), "a%u", j + 1);
				assert_int_equal(tl->top[j].id, 901 + (int32_t)j);
				assert_true(tl->top[j].logprob == -2.0f - (float)j);
				assert_int_equal(tl->top[j].n_bytes, 2);
				assert_memory_equal(tl->top[j].bytes, want, 2);
			}
		}
	}
	assert_int_equal(r, 0);
	assert_string_equal(text[0], "s0t0");
	assert_string_equal(text[1], "s1t0s1t1");
	assert_string_equal(text[2], "s2t0s2t1s2t2");
	for (uint32_t i = 0; i < 3; i++) {
		const struct kvc_result *sr = kvc_request_sample_result(q, i);
		assert_non_null(sr);
		assert_int_equal(sr->finish_reason, i ? KVC_FINISH_LENGTH : KVC_FINISH_EOS);
		assert_int_equal(sr->generated_tokens, i + 1);
	}
	assert_null(kvc_request_sample_result(q, 3));
	const struct kvc_result *res = kvc_request_result(q);
	assert_int_equal(res->generated_tokens, 6);
	assert_int_equal(res->prompt_tokens, 5);
	assert_int_equal(res->finish_reason, KVC_FINISH_EOS); /* sample 0's: no sample failed */
	assert_int_equal(res->decode_ns, 3000);
	kvc_request_finish(q);

	/* one sample with log-probabilities but no alternatives, through the callback form */
	kvc_gen_params_init(&p);
	p.flags = KVC_GEN_LOGPROBS;
	struct collect col = { 0 };
	struct kvc_result rr;
	assert_int_equal(kvc_generate(c, "samples", KVC_NTS, &p, collect_cb, &col, &rr), 0);
	assert_string_equal(col.text, "s0t0");
	assert_int_equal(rr.generated_tokens, 1);

	/* refused before sending */
	kvc_gen_params_init(&p);
	p.n_samples = KVC_MAX_SAMPLES + 1;
	assert_int_equal(kvc_generate(c, "samples", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	kvc_gen_params_init(&p);
	p.top_logprobs = 2; /* without KVC_GEN_LOGPROBS */
	assert_int_equal(kvc_generate(c, "samples", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	p.flags = KVC_GEN_LOGPROBS;
	p.top_logprobs = KVC_MAX_TOP_LOGPROBS + 1;
	assert_int_equal(kvc_generate(c, "samples", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
	kvc_gen_params_init(&p);
	p.n_samples = 2;
	p.session_id = FAKE_SESSION;
	assert_int_equal(kvc_generate(c, "samples", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);

	/* a hostile daemon: a record for sample 2 of a 2-sample request */
	kvc_gen_params_init(&p);
	p.n_samples = 2;
	assert_int_equal(kvc_generate(c, "badsample", KVC_NTS, &p, NULL, NULL, NULL), -EPROTO);
	fake_finish(s, c);

	/* a daemon older than samples: -EOPNOTSUPP, nothing sent */
	s = fake_start(&(struct fake_cfg){ .server_version = IPC_CHAT_TURNS_SERVER_VERSION }, &c, 0);
	kvc_gen_params_init(&p);
	p.n_samples = 2;
	assert_int_equal(kvc_generate(c, "samples", KVC_NTS, &p, NULL, NULL, NULL), -EOPNOTSUPP);
	kvc_gen_params_init(&p);
	p.flags = KVC_GEN_LOGPROBS;
	assert_int_equal(kvc_generate(c, "samples", KVC_NTS, &p, NULL, NULL, NULL), -EOPNOTSUPP);
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), 0);
	fake_finish(s, c);
}

/* A constraint (kvc_gen_params.constraint) is checked before sending and
 * sent only to a daemon of 0.7.0 or later. */
static void test_constraint_gate(void **state)
{
	(void)state;
	for (int newer = 0; newer < 2; newer++) {
		kvc_client *c;
		struct fake_cfg cfg = { .listen_fd = -1,
					.server_version = newer ? IPC_CONSTRAINT_SERVER_VERSION : IPC_TENANT_SERVER_VERSION };
		struct fake *s = fake_start(&cfg, &c, 0);
		struct kvc_gen_params p;
		struct kvc_constraint k = { .kind = KVC_CONSTRAINT_REGEX, .text = "[a-z]+", .len = KVC_NTS };
		kvc_gen_params_init(&p);
		p.constraint = &k;
		assert_int_equal(kvc_generate(c, "hello", KVC_NTS, &p, NULL, NULL, NULL), newer ? 0 : -EOPNOTSUPP);
		if (newer) {
			pthread_mutex_lock(&s->lock);
			uint32_t flags = s->last_gen.gen_flags;
			pthread_mutex_unlock(&s->lock);
			assert_true(flags & IPC_GEN_CONSTRAINT);
		}
		/* refused before anything is sent, whatever the daemon */
		struct kvc_constraint bad[] = {
			{ .kind = 0, .text = "x", .len = 1 },
			{ .kind = KVC_CONSTRAINT_CHOICE + 1, .text = "x", .len = 1 },
			{ .kind = KVC_CONSTRAINT_GBNF, .flags = 1, .text = "x", .len = 1 },
			{ .kind = KVC_CONSTRAINT_GBNF, .text = "x", .len = 1, .reserved = { 0, 1 } },
			{ .kind = KVC_CONSTRAINT_GBNF, .text = NULL, .len = 0 },
			{ .kind = KVC_CONSTRAINT_REGEX, .text = "", .len = KVC_NTS },
		};
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			p.constraint = &bad[i];
			assert_int_equal(kvc_generate(c, "hello", KVC_NTS, &p, NULL, NULL, NULL), -EINVAL);
		}
		struct kvc_constraint huge = { .kind = KVC_CONSTRAINT_GBNF, .text = "x", .len = KVC_MAX_CONSTRAINT_BYTES + 1 };
		p.constraint = &huge;
		assert_int_equal(kvc_generate(c, "hello", KVC_NTS, &p, NULL, NULL, NULL), -E2BIG);
		/* json_object needs no text */
		struct kvc_constraint obj = { .kind = KVC_CONSTRAINT_JSON_OBJECT };
		p.constraint = &obj;
		assert_int_equal(kvc_generate(c, "hello", KVC_NTS, &p, NULL, NULL, NULL), newer ? 0 : -EOPNOTSUPP);
		fake_finish(s, c);
	}
}

/* A conversation (kvc_gen_params.messages) goes out as the wire's turn
 * list, inline or through the ring, and bad ones never leave the client. */
static void test_chat_messages(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake_cfg cfg = { .listen_fd = -1, .server_version = IPC_CHAT_TURNS_SERVER_VERSION };
	struct fake *s = fake_start(&cfg, &c, 0);
	struct kvc_gen_params p;
	kvc_gen_params_init(&p);
	assert_null(p.messages);
	assert_int_equal(p.n_messages, 0);
	assert_null(p.tenant);
	assert_int_equal((uint64_t)(uintptr_t)p.constraint | (uint64_t)p.priority | p.reserved_prio | p.n_samples | p.top_logprobs | p.context_policy | p.context_window |
				 p.context_sinks, 0);
	if (sizeof(void *) == 8)
		assert_int_equal(sizeof(p), 136); /* the ABI: members came from the reserved space */

	const struct kvc_chat_msg conv[] = {
		{ "system", "Be brief." }, { "user", "Name a colour." }, { "assistant", "Blue." }, { "user", "Another?" },
	};
	const struct ipc_chat_turn turns[] = {
		{ IPC_CHAT_SYSTEM, 9, "Be brief." }, { IPC_CHAT_USER, 14, "Name a colour." },
		{ IPC_CHAT_ASSISTANT, 5, "Blue." }, { IPC_CHAT_USER, 8, "Another?" },
	};
	uint8_t enc[256];
	ssize_t n = ipc_chat_turns_encode(enc, sizeof(enc), turns, 4);
	assert_true(n > 0);
	p.messages = conv;
	p.n_messages = 4;
	p.temperature = 0;
	struct collect col = { 0 };
	assert_int_equal(kvc_generate(c, NULL, 0, &p, collect_cb, &col, NULL), 0);
	char want[128];
	snprintf(want, sizeof(want), "turns=4 len=%zd sum=%016llx", n, (unsigned long long)fnv((char *)enc, (size_t)n));
	assert_string_equal(col.text, want);
	pthread_mutex_lock(&s->lock);
	uint32_t flags = s->last_gen.gen_flags, sys = s->last_gen.system_bytes;
	pthread_mutex_unlock(&s->lock);
	assert_int_equal(flags, IPC_GEN_CHAT_TURNS);
	assert_int_equal(sys, 0);
	/* an empty prompt given as "" (length 0) is the same as NULL */
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, "", 0, &p, collect_cb, &col, NULL), 0);
	assert_string_equal(col.text, want);

	/* A conversation beyond the inline limit travels through the ring. */
	size_t big = IPC_MAX_INLINE_TEXT_BYTES + 5000;
	char *text = malloc(big + 1);
	memset(text, 'w', big);
	text[big] = 0;
	const struct kvc_chat_msg bigconv[] = { { "user", text }, { "assistant", "ok" }, { "user", "more" } };
	const struct ipc_chat_turn bigturns[] = { { IPC_CHAT_USER, (uint32_t)big, text }, { IPC_CHAT_ASSISTANT, 2, "ok" },
						  { IPC_CHAT_USER, 4, "more" } };
	ssize_t bn = ipc_chat_turns_encode(NULL, 0, bigturns, 3);
	uint8_t *benc = malloc((size_t)bn);
	assert_int_equal(ipc_chat_turns_encode(benc, (size_t)bn, bigturns, 3), bn);
	p.messages = bigconv;
	p.n_messages = 3;
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, NULL, 0, &p, collect_cb, &col, NULL), 0);
	snprintf(want, sizeof(want), "turns=3 len=%zd sum=%016llx", bn, (unsigned long long)fnv((char *)benc, (size_t)bn));
	assert_string_equal(col.text, want);
	pthread_mutex_lock(&s->lock);
	flags = s->last_gen.gen_flags;
	pthread_mutex_unlock(&s->lock);
	assert_int_equal(flags, IPC_GEN_CHAT_TURNS | IPC_GEN_PROMPT_IN_RING);
	free(benc);
	free(text);

	/* Refusals, before anything is sent. */
	struct kvc_gen_params q = p;
	q.messages = conv;
	q.n_messages = 4;
	assert_int_equal(kvc_generate(c, "also a prompt", KVC_NTS, &q, NULL, NULL, NULL), -EINVAL);
	q.system = "sys";
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	q = p; q.messages = conv; q.n_messages = 4; q.session_id = FAKE_SESSION;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	q = p; q.messages = conv; q.n_messages = 4; q.flags = KVC_GEN_RAW;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	q = p; q.messages = NULL; q.n_messages = 2;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	q = p; q.messages = conv; q.n_messages = 0; /* an empty conversation, not a prompt */
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, &q, NULL, NULL, NULL), -EINVAL);
	q = p; q.messages = conv; q.n_messages = 3; /* ends with the assistant's */
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	/* tool roles need kvd 0.9.0: refused for this older daemon, unsent */
	const struct kvc_chat_msg tool[] = { { "tool", "42" }, { "user", "x" } };
	q = p; q.messages = tool; q.n_messages = 2;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EOPNOTSUPP);
	const struct kvc_chat_msg badrole[] = { { "ipython", "42" }, { "user", "x" } };
	q = p; q.messages = badrole; q.n_messages = 2;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	const struct kvc_chat_msg nulls[] = { { "user", NULL } };
	q = p; q.messages = nulls; q.n_messages = 1;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	const struct kvc_chat_msg noroles[] = { { NULL, "x" } };
	q = p; q.messages = noroles; q.n_messages = 1;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EINVAL);
	struct kvc_chat_msg *lots = calloc(KVC_MAX_CHAT_MSGS + 1, sizeof(*lots));
	for (size_t i = 0; i <= KVC_MAX_CHAT_MSGS; i++)
		lots[i] = (struct kvc_chat_msg){ "user", "x" };
	q = p; q.messages = lots; q.n_messages = KVC_MAX_CHAT_MSGS + 1;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -E2BIG);
	q.n_messages = KVC_MAX_CHAT_MSGS; /* the limit itself is fine */
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, NULL, 0, &q, collect_cb, &col, NULL), 0);
	assert_non_null(strstr(col.text, "turns=1024 "));
	free(lots);
	/* texts plus heads beyond the daemon's max_prompt_bytes */
	char *huge = malloc(FAKE_MAX_TEXT);
	memset(huge, 'h', FAKE_MAX_TEXT - 8);
	huge[FAKE_MAX_TEXT - 8] = 0; /* exactly the limit with one head */
	const struct kvc_chat_msg at_limit[] = { { "user", huge } };
	q = p; q.messages = at_limit; q.n_messages = 1;
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, NULL, 0, &q, collect_cb, &col, NULL), 0);
	assert_non_null(strstr(col.text, "turns=1 "));
	const struct kvc_chat_msg over[] = { { "system", "s" }, { "user", huge } };
	q.messages = over; q.n_messages = 2;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -E2BIG);
	free(huge);
	/* The connection is still fine. */
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), 0);
	fake_finish(s, c);

	/* A daemon older than chat turns is never sent one: the flag would be
	 * refused, and a ring upload left unconsumed. */
	s = fake_start(NULL, &c, 0);
	q = p; q.messages = conv; q.n_messages = 4;
	assert_int_equal(kvc_generate(c, NULL, 0, &q, NULL, NULL, NULL), -EOPNOTSUPP);
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), 0);
	fake_finish(s, c);
}

static void test_blocking_interleaved(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	kvc_request *r1, *r2;
	const struct kvc_event *ev;
	int r;

	assert_int_equal(kvc_request_start(c, "hello", KVC_NTS, NULL, &r1), 0);
	assert_int_equal(kvc_request_start(c, "many:500", KVC_NTS, NULL, &r2), 0);
	assert_true(kvc_request_id(r1) != kvc_request_id(r2));
	assert_null(kvc_request_result(r2));
	/* Read the second request first: the first one's events wait in its queue. */
	uint32_t n = 0;
	char want[32];
	while ((r = kvc_request_next(r2, &ev)) == 1) {
		assert_int_equal(ev->request_id, kvc_request_id(r2));
		assert_int_equal(ev->index, n);
		snprintf(want, sizeof(want), "t%u;", n);
		assert_string_equal(ev->text, want);
		n++;
	}
	assert_int_equal(r, 0);
	assert_int_equal(n, 500);
	assert_int_equal(kvc_request_result(r2)->finish_reason, KVC_FINISH_LENGTH);
	assert_int_equal(kvc_request_result(r2)->generated_tokens, 500);
	assert_int_equal(kvc_request_next(r2, &ev), 0); /* stays finished */

	char text[64] = "";
	while ((r = kvc_request_next(r1, &ev)) == 1)
		strcat(text, ev->text);
	assert_int_equal(r, 0);
	assert_string_equal(text, "Hello world!");
	assert_int_equal(kvc_request_result(r1)->finish_reason, KVC_FINISH_EOS);
	assert_null(kvc_request_finish(r1));
	assert_null(kvc_request_finish(r2));
	assert_null(kvc_request_finish(NULL));
	fake_finish(s, c);
}

static void test_cancel_from_callback(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct collect col = { .stop_after = 5 };
	struct kvc_result res;
	assert_int_equal(kvc_generate(c, "forever", KVC_NTS, NULL, collect_cb, &col, &res), -ECANCELED);
	assert_int_equal(col.events, 5); /* nothing delivered after the callback said stop */
	assert_int_equal(res.finish_reason, KVC_FINISH_CANCELLED);
	assert_true(res.generated_tokens >= 5);
	assert_int_equal(atomic_load(&s->cancels), 1);
	/* The client carries on. */
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, collect_cb, &col, NULL), 0);
	assert_string_equal(col.text, "Hello world!");
	fake_finish(s, c);
}

static void test_cancel_blocking(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	kvc_request *q;
	const struct kvc_event *ev;
	int r, n = 0;

	assert_int_equal(kvc_request_start(c, "forever", KVC_NTS, NULL, &q), 0);
	while ((r = kvc_request_next(q, &ev)) == 1) {
		if (++n == 3)
			assert_int_equal(kvc_cancel(c, kvc_request_id(q)), 0);
	}
	assert_int_equal(r, -ECANCELED);
	assert_int_equal(kvc_request_result(q)->finish_reason, KVC_FINISH_CANCELLED);
	assert_true(n >= 3);
	assert_int_equal(kvc_request_next(q, &ev), -ECANCELED);
	kvc_request_finish(q);
	/* Cancelling an unknown id is harmless. */
	assert_int_equal(kvc_cancel(c, 987654), 0);
	assert_int_equal(kvc_cancel(c, 0), -EINVAL);
	assert_int_equal(kvc_ping(c, NULL), 0);
	fake_finish(s, c);
}

struct canceller {
	kvc_client *c;
	uint64_t id;
};

static void *cancel_later(void *arg)
{
	struct canceller *k = arg;
	usleep(50000);
	kvc_cancel(k->c, k->id);
	return NULL;
}

static void test_cancel_from_thread(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	kvc_request *q;
	const struct kvc_event *ev;
	pthread_t th;
	int r;

	assert_int_equal(kvc_request_start(c, "forever", KVC_NTS, NULL, &q), 0);
	struct canceller k = { c, kvc_request_id(q) };
	assert_int_equal(pthread_create(&th, NULL, cancel_later, &k), 0);
	int64_t t0 = mono_ms();
	while ((r = kvc_request_next(q, &ev)) == 1)
		;
	assert_int_equal(r, -ECANCELED);
	assert_true(mono_ms() - t0 < 10000);
	pthread_join(th, NULL);
	kvc_request_finish(q);
	fake_finish(s, c);
}

static void test_finish_abandons_request(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake_cfg cfg = { .s2c_bytes = IPC_RING_MIN_BYTES, .listen_fd = -1 };
	struct fake *s = fake_start(&cfg, &c, 0);
	kvc_request *q;
	const struct kvc_event *ev;

	assert_int_equal(kvc_request_start(c, "many:100000", KVC_NTS, NULL, &q), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(kvc_request_next(q, &ev), 1);
	kvc_request_finish(q); /* cancels; later events are dropped */
	struct collect col = { 0 };
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, collect_cb, &col, NULL), 0);
	assert_string_equal(col.text, "Hello world!");
	assert_true(atomic_load(&s->cancels) >= 1);
	fake_finish(s, c);
}

static void test_error_frames(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct collect col = { 0 };
	struct kvc_result res;

	/* Rejected at once, on the socket. */
	assert_int_equal(kvc_generate(c, "error-context", KVC_NTS, NULL, collect_cb, &col, &res), KVC_ERR_CONTEXT);
	assert_int_equal(col.events, 0);
	assert_int_equal(res.finish_reason, KVC_FINISH_ERROR);
	assert_int_equal(res.error, KVC_ERR_CONTEXT);
	assert_string_equal(res.error_message, "prompt of 9000 tokens exceeds n_ctx 8192");

	/* Failed mid-stream, through the ring: earlier tokens still arrive. */
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, "midfail", KVC_NTS, NULL, collect_cb, &col, &res), -EIO);
	assert_string_equal(col.text, "ab");
	assert_string_equal(res.error_message, "engine exploded");

	/* Blocking form: the same code, and the result explains. */
	kvc_request *q;
	const struct kvc_event *ev;
	assert_int_equal(kvc_request_start(c, "error-context", KVC_NTS, NULL, &q), 0);
	assert_int_equal(kvc_request_next(q, &ev), KVC_ERR_CONTEXT);
	assert_int_equal(kvc_request_result(q)->error, KVC_ERR_CONTEXT);
	kvc_request_finish(q);

	/* Errors of control calls carry the daemon's message too. */
	int32_t *ids;
	size_t n;
	assert_int_equal(kvc_tokenize(c, "tok-error", KVC_NTS, 0, &ids, &n), -EINVAL);
	assert_string_equal(kvc_last_message(c), "the tokenizer refuses this text");
	assert_int_equal(kvc_session_close(c, 7), KVC_ERR_SESSION);
	assert_string_equal(kvc_last_message(c), "no such session");

	/* None of that broke the connection. */
	memset(&col, 0, sizeof(col));
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, collect_cb, &col, NULL), 0);
	assert_string_equal(col.text, "Hello world!");
	fake_finish(s, c);
}

static void test_server_vanishes(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct collect col = { 0 };
	struct kvc_result res;
	int64_t t0 = mono_ms();

	assert_int_equal(kvc_generate(c, "vanish", KVC_NTS, NULL, collect_cb, &col, &res), -ECONNRESET);
	assert_true(mono_ms() - t0 < 10000);
	assert_string_equal(col.text, "vvv"); /* what was sent before the end still arrives */
	assert_int_equal(res.finish_reason, KVC_FINISH_ERROR);
	assert_int_equal(res.error, -ECONNRESET);
	/* Everything afterwards fails the same way, at once. */
	struct kvc_stats st;
	assert_int_equal(kvc_stats(c, &st), -ECONNRESET);
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), -ECONNRESET);
	kvc_request *q;
	assert_int_equal(kvc_request_start(c, "hello", KVC_NTS, NULL, &q), -ECONNRESET);
	fake_finish(s, c);

	/* Blocking form, with the client waiting in poll() when it happens. */
	s = fake_start(NULL, &c, 0);
	const struct kvc_event *ev;
	int r, n = 0;
	assert_int_equal(kvc_request_start(c, "vanish", KVC_NTS, NULL, &q), 0);
	while ((r = kvc_request_next(q, &ev)) == 1)
		n++;
	assert_int_equal(r, -ECONNRESET);
	assert_int_equal(n, 3);
	kvc_request_finish(q);
	fake_finish(s, c);
}

static void test_shutdown_error(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct kvc_result res;
	assert_int_equal(kvc_generate(c, "shutdown", KVC_NTS, NULL, NULL, NULL, &res), KVC_ERR_SHUTDOWN);
	assert_string_equal(res.error_message, "kvd is stopping");
	assert_int_equal(kvc_ping(c, NULL), KVC_ERR_SHUTDOWN);
	fake_finish(s, c);
}

static void test_timeout(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct kvc_result res;

	assert_int_equal(kvc_set_timeout(c, 200), 0);
	int64_t t0 = mono_ms();
	assert_int_equal(kvc_generate(c, "silent", KVC_NTS, NULL, NULL, NULL, &res), -ETIMEDOUT);
	int64_t dt = mono_ms() - t0;
	assert_true(dt >= 190 && dt < 5000);
	assert_int_equal(res.error, -ETIMEDOUT);
	/* Blocking form: a timeout leaves the request alive. */
	kvc_request *q;
	const struct kvc_event *ev;
	assert_int_equal(kvc_request_start(c, "silent", KVC_NTS, NULL, &q), 0);
	assert_int_equal(kvc_request_next(q, &ev), -ETIMEDOUT);
	assert_null(kvc_request_result(q));
	kvc_request_finish(q);
	kvc_set_timeout(c, -1);
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), 0);
	fake_finish(s, c);
}

static void test_large_prompt_through_ring(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake_cfg cfg = { .c2s_bytes = IPC_RING_MIN_BYTES, .listen_fd = -1 };
	struct fake *s = fake_start(&cfg, &c, 0);
	size_t len = 3u << 20;
	char *prompt = malloc(len);
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		prompt[i] = (char)('a' + x % 26);
	}
	struct collect col = { 0 };
	struct kvc_result res;
	assert_int_equal(kvc_generate(c, prompt, len, NULL, collect_cb, &col, &res), 0);
	char want[64];
	snprintf(want, sizeof(want), "len=%zu sum=%016llx", len, (unsigned long long)fnv(prompt, len));
	assert_string_equal(col.text, want);
	assert_int_equal(res.prompt_tokens, len);

	/* Just above the inline limit, and several uploads in a row. */
	for (size_t l = IPC_MAX_INLINE_TEXT_BYTES - 1; l <= IPC_MAX_INLINE_TEXT_BYTES + 70000; l += 35001) {
		memset(&col, 0, sizeof(col));
		assert_int_equal(kvc_generate(c, prompt, l, NULL, collect_cb, &col, NULL), 0);
		snprintf(want, sizeof(want), "len=%zu sum=%016llx", l, (unsigned long long)fnv(prompt, l));
		assert_string_equal(col.text, want);
	}
	free(prompt);
	fake_finish(s, c);
}

static void test_many_tokens_backpressure(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake_cfg cfg = { .s2c_bytes = IPC_RING_MIN_BYTES, .listen_fd = -1 };
	struct fake *s = fake_start(&cfg, &c, 0);
	kvc_request *q;
	const struct kvc_event *ev;
	struct kvc_gen_params p;
	char want[32];
	int r;
	uint32_t n = 0;

	kvc_gen_params_init(&p);
	p.flags = KVC_GEN_WANT_IDS;
	p.max_tokens = 100000;
	assert_int_equal(kvc_request_start(c, "many:100000", KVC_NTS, &p, &q), 0);
	while ((r = kvc_request_next(q, &ev)) == 1) {
		assert_int_equal(ev->index, n);
		assert_int_equal(ev->n_tokens, 1);
		assert_int_equal(ev->ids[0], (int32_t)n);
		snprintf(want, sizeof(want), "t%u;", n);
		assert_string_equal(ev->text, want);
		n++;
	}
	assert_int_equal(r, 0);
	assert_int_equal(n, 100000);
	kvc_request_finish(q);
	fake_finish(s, c);
}

static void test_tokenize_count(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	int32_t *ids;
	size_t n;

	assert_int_equal(kvc_tokenize(c, "abc", KVC_NTS, KVC_TOK_ADD_BOS, &ids, &n), 0);
	assert_int_equal(n, 4);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 'a');
	assert_int_equal(ids[3], 'c');
	kvc_free(ids);
	assert_int_equal(kvc_tokenize(c, "", 0, 0, &ids, &n), 0);
	assert_int_equal(n, 0);
	assert_null(ids);
	assert_int_equal(kvc_tokenize(c, "x", 1, 0x80, &ids, &n), -EINVAL);

	/* Large: uploaded through the ring, answered in several frames. */
	size_t len = 100000;
	char *text = malloc(len);
	for (size_t i = 0; i < len; i++)
		text[i] = (char)(32 + i % 90);
	assert_int_equal(kvc_tokenize(c, text, len, 0, &ids, &n), 0);
	assert_int_equal(n, len);
	for (size_t i = 0; i < len; i++)
		if (ids[i] != (int32_t)(uint8_t)text[i])
			fail_msg("id %zu: %d != %d", i, ids[i], text[i]);
	kvc_free(ids);
	assert_int_equal(kvc_count_tokens(c, text, len, KVC_TOK_ADD_BOS, &n), 0);
	assert_int_equal(n, len + 1);
	assert_int_equal(kvc_count_tokens(c, "hello", KVC_NTS, 0, &n), 0);
	assert_int_equal(n, 5);
	free(text);
	fake_finish(s, c);
}

/* STATS replies of any length (0.8.0): an older daemon's 320 bytes read
 * with the newer counters 0; kvc_stats_get() fills only the caller's size,
 * and the kvc_stats symbol (programs built before the macro) 0.7.0's. */
static void test_stats_sizes(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct kvc_stats st;

	g_stats_reply_bytes = 0;
	assert_int_equal(kvc_stats(c, &st), 0);
	assert_int_equal(st.gram_checked, 5);
	assert_int_equal(st.gram_masked, 6);
	memset(&st, 0xaa, sizeof(st));
	assert_int_equal(kvc_stats_get(c, &st, offsetof(struct kvc_stats, gram_checked)), 0);
	assert_int_equal(st.pages_total, 1000);
	assert_int_equal(st.gram_checked, 0xaaaaaaaaaaaaaaaaull); /* past the caller's struct: untouched */
	memset(&st, 0xaa, sizeof(st));
	assert_int_equal((kvc_stats)(c, &st), 0);
	assert_int_equal(st.steps, 1234);
	assert_int_equal(st.gram_masked, 0xaaaaaaaaaaaaaaaaull);
	assert_int_equal(kvc_stats_get(c, &st, 0), -EINVAL);
	assert_int_equal(kvc_stats_get(c, &st, 12), -EINVAL);

	g_stats_reply_bytes = offsetof(struct kvc_stats, gram_checked); /* a 0.7.0 daemon */
	memset(&st, 0xaa, sizeof(st));
	assert_int_equal(kvc_stats(c, &st), 0);
	assert_int_equal(st.pages_total, 1000);
	assert_int_equal(st.uptime_ns, 5000000000ull);
	assert_int_equal(st.gram_checked, 0);
	assert_int_equal(st.gram_masked, 0);
	g_stats_reply_bytes = 0;
	fake_finish(s, c);
}

static void test_stats_ps_sessions(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake *s = fake_start(NULL, &c, 0);
	struct kvc_stats st;

	assert_int_equal(kvc_stats(c, &st), 0);
	assert_int_equal(st.pages_total, 1000);
	assert_int_equal(st.pages_free, 600);
	assert_int_equal(st.pages_used, 300);
	assert_int_equal(st.pages_shared, 50);
	assert_int_equal(st.pages_cached, 100);
	assert_int_equal(st.pages_swapped, 7);
	assert_int_equal(st.page_bytes, 368640);
	assert_int_equal(st.kv_bytes_per_token, 23040);
	assert_int_equal(st.prefix_query_tokens, 900);
	assert_int_equal(st.prefix_hit_tokens, 300);
	assert_int_equal(st.requests_running, 3);
	assert_int_equal(st.requests_waiting, 2);
	assert_int_equal(st.requests_swapped, 1);
	assert_int_equal(st.uptime_ns, 5000000000ull);

	struct kvc_ps_entry *e;
	size_t n;
	assert_int_equal(kvc_ps(c, &e, &n), 0);
	assert_int_equal(n, FAKE_PS_ENTRIES);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(e[i].request_id, i + 1);
		assert_int_equal(e[i].pid, 1000 + i);
		assert_int_equal(e[i].state, KVC_REQ_RUNNING);
	}
	kvc_free(e);

	uint64_t sid;
	assert_int_equal(kvc_session_open(c, 60, &sid), 0);
	assert_int_equal(sid, FAKE_SESSION);
	assert_int_equal(kvc_session_close(c, sid), 0);
	assert_int_equal(kvc_session_close(c, 0), -EINVAL);
	fake_finish(s, c);
}

static void test_handshake_refusals(void **state)
{
	(void)state;
	kvc_client *c;
	struct fake_cfg cfg = { .hello = HELLO_WRONG_VERSION, .listen_fd = -1 };
	struct fake *s = fake_start(&cfg, &c, KVC_ERR_VERSION);
	fake_finish(s, NULL);
	cfg.hello = HELLO_DENY;
	s = fake_start(&cfg, &c, KVC_ERR_DENIED);
	fake_finish(s, NULL);

	/* Not a SEQPACKET socket. */
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(kvc_connect_fd(sv[0], &c), -EPROTOTYPE);
	close(sv[0]);
	close(sv[1]);
	/* The peer is gone before it answers. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	close(sv[0]);
	int r = kvc_connect_fd(sv[1], &c);
	assert_true(r == -ECONNRESET);
	assert_true(fcntl(sv[1], F_GETFD) >= 0); /* still the caller's */
	close(sv[1]);
}

static void test_connect_by_path_and_env(void **state)
{
	(void)state;
	char path[64];
	int lfd;
	kvc_client *c;

	snprintf(path, sizeof(path), "@kvd-test-kvclient-%d", (int)getpid());
	assert_int_equal(ipc_listen(path, 0, 4, &lfd), 0);
	struct fake_cfg cfg = { .listen_fd = lfd };
	struct fake *s = fake_new(&cfg);
	assert_int_equal(pthread_create(&s->th, NULL, fake_main, s), 0);
	setenv(KVC_SOCKET_ENV, path, 1);
	assert_int_equal(kvc_connect(NULL, &c), 0);
	assert_string_equal(kvc_server_info(c)->model_name, "fake-model");
	assert_int_equal(kvc_generate(c, "hello", KVC_NTS, NULL, NULL, NULL, NULL), 0);
	fake_finish(s, c);
	close(lfd);

	/* Nobody listens any more; bad paths. */
	assert_int_equal(kvc_connect(NULL, &c), -ECONNREFUSED);
	setenv(KVC_SOCKET_ENV, "/nonexistent/kvd.sock", 1);
	assert_int_equal(kvc_connect(NULL, &c), -ENOENT);
	setenv(KVC_SOCKET_ENV, "", 1); /* empty: the default path */
	int r = kvc_connect(NULL, &c);
	if (r == 0)
		kvc_close(c); /* a real kvd runs on this machine */
	else
		assert_true(r == -ENOENT || r == -ECONNREFUSED || r == -EACCES);
	unsetenv(KVC_SOCKET_ENV);
	assert_int_equal(kvc_connect("@kvd-test-nobody-listens", &c), -ECONNREFUSED);
	assert_int_equal(kvc_close(NULL), NULL);
}

/* ---- kvctl, end to end ------------------------------------------------------------------------
 *
 * The built kvctl ($KVD_BUILD/bin/kvctl, default build/bin/kvctl) runs as
 * a child process against a fake daemon that serves one connection after
 * another on an abstract socket. Skipped when the binary is not built.
 */

static char kvctl_path[4096];

static bool have_kvctl(void)
{
	const char *b = getenv("KVD_BUILD");
	snprintf(kvctl_path, sizeof(kvctl_path), "%s/bin/kvctl", b && *b ? b : "build");
	if (access(kvctl_path, X_OK) == 0)
		return true;
	print_message("skipped: %s is not built (make all; make asan builds only the tests)\n", kvctl_path);
	return false;
}

struct run {
	int status; /* exit status, or 128 + signal */
	char out[1 << 20];
	size_t out_len;
	char err[1 << 14];
	size_t err_len;
};
static struct run g_run;

/* Run kvctl with args (NULL-terminated), feeding input (may be NULL). With
 * sigint, send SIGINT once some output has arrived. */
static int run_kvctl(const char *input, bool sigint, const char *const *args)
{
	struct run *r = &g_run;
	int in[2], out[2], err[2];
	const char *argv[64] = { "kvctl" };
	size_t n = 1;

	for (; args[n - 1] && n < 63; n++)
		argv[n] = args[n - 1];
	argv[n] = NULL;
	memset(r, 0, sizeof(*r));
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	assert_int_equal(pipe2(err, O_CLOEXEC), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		dup2(err[1], 2);
		execv(kvctl_path, (char *const *)argv);
		_exit(126);
	}
	close(in[0]);
	close(out[1]);
	close(err[1]);
	if (input) {
		size_t len = strlen(input), off = 0;
		while (off < len) {
			ssize_t w = write(in[1], input + off, len - off);
			if (w <= 0)
				break;
			off += (size_t)w;
		}
	}
	close(in[1]);
	bool out_open = true, err_open = true, sent = false;
	while (out_open || err_open) {
		struct pollfd p[2] = { { .fd = out_open ? out[0] : -1, .events = POLLIN },
				       { .fd = err_open ? err[0] : -1, .events = POLLIN } };
		if (poll(p, 2, 20000) <= 0)
			fail_msg("kvctl %s: no output for 20 s (%zu bytes so far; stderr: %s)", args[0], r->out_len, r->err);
		if (p[0].revents) {
			ssize_t k = read(out[0], r->out + r->out_len, sizeof(r->out) - 1 - r->out_len);
			if (k <= 0)
				out_open = false;
			else
				r->out_len += (size_t)k;
		}
		if (p[1].revents) {
			ssize_t k = read(err[0], r->err + r->err_len, sizeof(r->err) - 1 - r->err_len);
			if (k <= 0)
				err_open = false;
			else
				r->err_len += (size_t)k;
		}
		if (sigint && !sent && r->out_len > 0) {
			kill(pid, SIGINT);
			sent = true;
		}
	}
	close(out[0]);
	close(err[0]);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	r->out[r->out_len] = 0;
	r->err[r->err_len] = 0;
	r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	return r->status;
}

#define KVCTL(input, ...) run_kvctl(input, false, (const char *const[]){ __VA_ARGS__, NULL })

/* The integer value of "key": in JSON text, or fail. */
static uint64_t json_u64(const char *json, const char *key)
{
	char pat[128];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *p = strstr(json, pat);
	if (!p)
		fail_msg("no key %s in %s", key, json);
	p += strlen(pat);
	if (*p < '0' || *p > '9')
		fail_msg("key %s is not an integer in %s", key, json);
	return strtoull(p, NULL, 10);
}

struct daemon {
	struct fake *s;
	char path[64];
};

static void daemon_start(struct daemon *d)
{
	static int seq;
	int lfd;
	snprintf(d->path, sizeof(d->path), "@kvd-test-kvctl-%d-%d", (int)getpid(), seq++);
	assert_int_equal(ipc_listen(d->path, 0, 8, &lfd), 0);
	struct fake_cfg cfg = { .listen_fd = lfd, .loop = true };
	d->s = fake_new(&cfg);
	assert_int_equal(pthread_create(&d->s->th, NULL, fake_main, d->s), 0);
}

static void daemon_stop(struct daemon *d)
{
	atomic_store(&d->s->stop, true);
	pthread_join(d->s->th, NULL);
	close(d->s->cfg.listen_fd);
	int line = d->s->failed_line;
	free(d->s);
	assert_int_equal(line, 0);
}

static void test_kvctl_generate(void **state)
{
	(void)state;
	if (!have_kvctl())
		skip();
	struct daemon d;
	daemon_start(&d);
	const char *S = d.path;

	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--raw", "hello"), 0);
	assert_string_equal(g_run.out, "Hello world!\n");
	assert_int_equal(KVCTL(NULL, "--socket", S, "generate", "--no-newline", "hello", "--max-tokens", "9"), 0);
	assert_string_equal(g_run.out, "Hello world!");
	/* The prompt from stdin, with "-" or without operands. */
	assert_int_equal(KVCTL("hello\n", "generate", "--socket", S), 0);
	assert_string_equal(g_run.out, "Hello world!\n");
	assert_int_equal(KVCTL("hello", "generate", "--socket", S, "-"), 0);
	assert_string_equal(g_run.out, "Hello world!\n");

	/* One JSON object. */
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--json", "--temperature", "0", "--stop", "END",
			       "--stop", "\n\n", "--system", "Be brief.", "--seed", "7", "hello"), 0);
	assert_non_null(strstr(g_run.out, "\"text\":\"Hello world!\""));
	assert_non_null(strstr(g_run.out, "\"token_ids\":[10,11,12,13]"));
	assert_non_null(strstr(g_run.out, "\"finish_reason\":\"eos\""));
	assert_non_null(strstr(g_run.out, "\"model\":\"fake-model\""));
	assert_int_equal(json_u64(g_run.out, "generated_tokens"), 4);
	assert_int_equal(json_u64(g_run.out, "prompt_tokens"), 5);
	assert_int_equal(json_u64(g_run.out, "cached_tokens"), 2);
	assert_non_null(strstr(g_run.out, "\"ttft_ms\":2.000"));
	assert_non_null(strstr(g_run.out, "\"tokens_per_s\":750.00")); /* 4 tokens, 4 ms of decode after the first */
	pthread_mutex_lock(&d.s->lock);
	struct ipc_generate g = d.s->last_gen;
	pthread_mutex_unlock(&d.s->lock);
	assert_int_equal(g.n_stop, 2);
	assert_true(g.temperature == 0.0f);
	assert_int_equal(g.seed, 7);
	assert_true(g.gen_flags & IPC_GEN_WANT_IDS);

	/* Refusals, failures and a vanished daemon have distinct statuses. */
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "error-context"), 4);
	assert_non_null(strstr(g_run.err, "exceeds n_ctx 8192"));
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--json", "error-context"), 4);
	assert_non_null(strstr(g_run.out, "\"error\":{\"code\":-1002,\"message\":\"prompt of 9000"));
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "midfail"), 1);
	assert_string_equal(g_run.out, "ab\n");
	assert_non_null(strstr(g_run.err, "engine exploded"));
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "vanish"), 5);
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "shutdown"), 5);
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--timeout", "0.2", "silent"), 5);
	/* Ctrl-C cancels the request. */
	assert_int_equal(run_kvctl(NULL, true, (const char *const[]){ "generate", "--socket", S, "forever", NULL }), 130);
	assert_true(atomic_load(&d.s->cancels) >= 1);

	/* Usage errors. */
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--max-tokens", "abc", "hello"), 2);
	assert_non_null(strstr(g_run.err, "--max-tokens"));
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--raw", "--system", "x", "hello"), 2);
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--top-p", "1.5", "hello"), 2);
	assert_int_equal(KVCTL(NULL, "generate", "--socket", S, "--bogus", "hello"), 2);
	assert_int_equal(KVCTL("", "generate", "--socket", S), 2); /* empty prompt */
	assert_int_equal(KVCTL(NULL, "frobnicate"), 2);
	assert_int_equal(KVCTL(NULL, "--timeout", "x", "stats"), 2);
	/* No daemon there. */
	assert_int_equal(KVCTL(NULL, "generate", "--socket", "@kvd-test-nobody", "hello"), 3);
	assert_non_null(strstr(g_run.err, "cannot connect"));
	daemon_stop(&d);
}

static void test_kvctl_commands(void **state)
{
	(void)state;
	if (!have_kvctl())
		skip();
	struct daemon d;
	daemon_start(&d);
	const char *S = d.path;

	/* stats --json: the keys scripts depend on, as integers. */
	assert_int_equal(KVCTL(NULL, "stats", "--socket", S, "--json"), 0);
	static const char *keys[] = { "pages_total", "pages_free", "pages_used", "pages_shared", "pages_cached",
				      "pages_swapped", "page_bytes", "kv_bytes_per_token", "prefix_query_tokens",
				      "prefix_hit_tokens", "requests_running", "requests_waiting", "requests_swapped" };
	uint64_t want[] = { 1000, 600, 300, 50, 100, 7, 368640, 23040, 900, 300, 3, 2, 1 };
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		assert_int_equal(json_u64(g_run.out, keys[i]), want[i]);
	assert_int_equal(KVCTL(NULL, "stats", "--socket", S), 0);
	assert_non_null(strstr(g_run.out, "shared"));
	/* the text table: the prefix cache's hit tokens with their share of those looked up */
	const char *found = strstr(g_run.out, "tokens found");
	assert_non_null(found);
	assert_non_null(strstr(found, "300 tokens"));
	assert_non_null(strstr(found, "33.3% of tokens looked up"));
	assert_int_equal(run_kvctl(NULL, true, (const char *const[]){ "stats", "--socket", S, "--watch", "0.05", NULL }),
			 0);
	assert_int_equal(KVCTL(NULL, "stats", "--socket", S, "--watch", "0", NULL), 2);

	/* tokenize and count. */
	assert_int_equal(KVCTL(NULL, "tokenize", "--socket", S, "abc"), 0);
	assert_string_equal(g_run.out, "97 98 99\n");
	assert_int_equal(KVCTL(NULL, "tokenize", "--socket", S, "--bos", "--json", "ab"), 0);
	assert_string_equal(g_run.out, "{\"tokens\":[1,97,98],\"count\":3}\n");
	assert_int_equal(KVCTL("abc", "count", "--socket", S), 0);
	assert_string_equal(g_run.out, "3\n");
	assert_int_equal(KVCTL(NULL, "count", "--socket", S, "--bos", "--json", "abc"), 0);
	assert_string_equal(g_run.out, "{\"count\":4,\"bytes\":3}\n");
	assert_int_equal(KVCTL(NULL, "tokenize", "--socket", S, "tok-error"), 4);
	assert_non_null(strstr(g_run.err, "refuses"));

	/* plan: offline figures, and the loaded model's. */
	assert_int_equal(KVCTL(NULL, "plan", "--layers", "30", "--kv-heads", "3", "--head-dim", "64", "--context",
			       "4096", "--memory", "1G", "--json"), 0);
	assert_int_equal(json_u64(g_run.out, "kv_bytes_per_token"), 23040);
	assert_int_equal(json_u64(g_run.out, "page_bytes"), 368640);
	assert_int_equal(json_u64(g_run.out, "pages_per_request"), 256);
	assert_int_equal(json_u64(g_run.out, "bytes_per_request"), 94371840);
	assert_int_equal(json_u64(g_run.out, "sequences"), 11);
	assert_int_equal(KVCTL(NULL, "plan", "--layers", "32", "--kv-heads", "8", "--head-dim", "128"), 0);
	assert_non_null(strstr(g_run.out, "131072 B")); /* Llama-3-8B: 128 KiB per token */
	assert_int_equal(KVCTL(NULL, "plan", "--socket", S, "--json"), 0);
	assert_int_equal(json_u64(g_run.out, "kv_bytes_per_token"), 46080);
	assert_int_equal(json_u64(g_run.out, "context_tokens"), 8192);
	assert_int_equal(json_u64(g_run.out, "pages_per_request"), 512);
	assert_int_equal(json_u64(g_run.out, "sequences"), 2);
	assert_int_equal(KVCTL(NULL, "plan", "--layers", "30"), 2);
	assert_int_equal(KVCTL(NULL, "plan", "--layers", "30", "--kv-heads", "3", "--head-dim", "64", "--memory", "lots"),
			 2);

	/* ps */
	assert_int_equal(KVCTL(NULL, "ps", "--socket", S), 0);
	size_t lines = 0;
	for (const char *p = g_run.out; *p; p++)
		lines += *p == '\n';
	assert_int_equal(lines, FAKE_PS_ENTRIES + 1);
	assert_non_null(strstr(g_run.out, "running"));
	assert_int_equal(KVCTL(NULL, "ps", "--socket", S, "--json"), 0);
	assert_non_null(strstr(g_run.out, "\"request_id\":2000,"));

	/* session */
	assert_int_equal(KVCTL(NULL, "session", "--socket", S, "open", "--idle", "30"), 0);
	assert_string_equal(g_run.out, "42\n");
	assert_int_equal(KVCTL(NULL, "session", "--socket", S, "close", "42"), 0);
	assert_int_equal(KVCTL(NULL, "session", "--socket", S, "close", "7"), 4);
	assert_int_equal(KVCTL(NULL, "session", "--socket", S, "reopen"), 2);

	/* version, with and without a daemon */
	assert_int_equal(KVCTL(NULL, "version", "--socket", S), 0);
	assert_non_null(strstr(g_run.out, "kvctl " KVC_VERSION_STRING));
	assert_non_null(strstr(g_run.out, "kvd 0.1.0, model fake-model"));
	assert_int_equal(KVCTL(NULL, "version", "--socket", "@kvd-test-nobody", "--json"), 3);
	assert_non_null(strstr(g_run.out, "\"kvd\":null"));
	assert_int_equal(KVCTL(NULL, "--version"), 0);

	/* KVD_SOCKET is honoured. */
	setenv(KVC_SOCKET_ENV, S, 1);
	assert_int_equal(KVCTL(NULL, "count", "hello"), 0);
	assert_string_equal(g_run.out, "5\n");
	unsetenv(KVC_SOCKET_ENV);

	/* Every command documents itself. */
	static const char *cmds[] = { "generate", "stats", "tokenize", "count", "plan", "ps", "session", "version" };
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		assert_int_equal(KVCTL(NULL, cmds[i], "--help"), 0);
		assert_non_null(strstr(g_run.out, "SYNOPSIS"));
		assert_non_null(strstr(g_run.out, "EXIT STATUS"));
		assert_int_equal(KVCTL(NULL, "help", cmds[i]), 0);
	}
	assert_int_equal(KVCTL(NULL, "--help"), 0);
	daemon_stop(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_version_and_strerror),
		cmocka_unit_test(test_connect_info_ping),
		cmocka_unit_test(test_generate_callback),
		cmocka_unit_test(test_params_on_the_wire),
		cmocka_unit_test(test_samples_and_logprobs),
		cmocka_unit_test(test_chat_messages),
		cmocka_unit_test(test_constraint_gate),
		cmocka_unit_test(test_blocking_interleaved),
		cmocka_unit_test(test_cancel_from_callback),
		cmocka_unit_test(test_cancel_blocking),
		cmocka_unit_test(test_cancel_from_thread),
		cmocka_unit_test(test_finish_abandons_request),
		cmocka_unit_test(test_error_frames),
		cmocka_unit_test(test_server_vanishes),
		cmocka_unit_test(test_shutdown_error),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_large_prompt_through_ring),
		cmocka_unit_test(test_many_tokens_backpressure),
		cmocka_unit_test(test_tokenize_count),
		cmocka_unit_test(test_stats_ps_sessions),
		cmocka_unit_test(test_stats_sizes),
		cmocka_unit_test(test_handshake_refusals),
		cmocka_unit_test(test_connect_by_path_and_env),
		cmocka_unit_test(test_kvctl_generate),
		cmocka_unit_test(test_kvctl_commands),
	};
	signal(SIGPIPE, SIG_IGN);
	alarm(240);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
