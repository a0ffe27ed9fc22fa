/*
 * tests/tools/kvd_raw.c — a protocol-level test client for kvd, built on
 * ipc/ alone (not libkvclient), so integration tests can both use the
 * daemon normally and send it frames no well-behaved client would.
 *
 *   kvd_raw [-s SOCK] hello
 *   kvd_raw [-s SOCK] generate [--raw] [--ring] [--ids] [-n N] [--system S]
 *                     [--temperature T] [--seed S] [--stop S] [--hang] [--turns] PROMPT
 *   kvd_raw [-s SOCK] session PROMPT [PROMPT ...]   (one session, one turn each)
 *   kvd_raw [-s SOCK] stats                         (JSON, keys as kvctl stats --json,
 *                                                    and reply_bytes: the reply's length)
 *   kvd_raw [-s SOCK] tokenize TEXT                 (ids, special tokens parsed)
 *   kvd_raw [-s SOCK] ps                            (live requests, one per line)
 *   kvd_raw [-s SOCK] attack KIND [--bytes N]
 *
 * generate streams the text to stdout and prints one line to stderr at the
 * end: "DONE finish=eos prompt=.. cached=.. generated=.." or
 * "ERROR code=.. msg"; exit 0 for DONE, 2 for ERROR, 1 for anything else.
 * --hang prints "STREAMING" to stderr after the first token and then stops
 * reading (for tests that kill a client mid-stream); --slow MS sleeps after
 * every record it reads (a slow reader); --pause MS stops reading for MS
 * after the first record; --cancel-after N sends CANCEL after N tokens.
 * --turns sends PROMPT as chat turns (IPC_GEN_CHAT_TURNS): "R:text|R:text..."
 * with R the role's wire number, written as given, unchecked (with --ring
 * even a list the encoder would refuse reaches the daemon).
 * KVD_RAW_CLIENT_VERSION (e.g. 0x000300) is the version HELLO says instead of
 * this build's.
 * attack sends one bad thing and expects an ERROR frame back: it prints
 * "ERROR code=.. msg" and exits 0, or exits 1 when none came. KIND: badmagic
 * short badlen unknown-type version reserved oversized-prompt garbage-ring
 * no-hello flood (64 GENERATEs on one connection). After attacks that must not cost the connection (badlen with a
 * request id, unknown-type, reserved, oversized-prompt) it also checks that
 * a PING on the same connection is still answered.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc.h"

static const char *sock_path;
static _Alignas(8) uint8_t rbuf[IPC_MAX_FRAME_BYTES];

struct conn {
	int fd;
	struct ipc_chan *chan;
	struct ipc_welcome w;
	uint32_t welcome_bytes; /* the WELCOME's payload length */
};

static int print_error_frame(const struct ipc_frame *f)
{
	struct ipc_error_msg em;
	if (ipc_decode_error(f, &em) < 0) {
		fprintf(stderr, "ERROR (undecodable)\n");
		return -1;
	}
	fprintf(stderr, "ERROR code=%d request=%" PRIu64 " %.*s\n", em.code, f->hdr.request_id, (int)em.msg_bytes,
		em.msg);
	return em.code;
}

/* Connect and say hello. Returns 0, or 2 when the server answered with an
 * ERROR (printed), 1 for other failures. */
static int conn_open(struct conn *c, bool say_hello)
{
	struct ipc_frame f;
	int r = ipc_connect(sock_path, &c->fd);
	if (r < 0) {
		fprintf(stderr, "connect %s: %s\n", sock_path, strerror(-r));
		return 1;
	}
	if (!say_hello)
		return 0;
	struct ipc_hello h = { .client_version = IPC_CHAT_FORMAT_CLIENT_VERSION, .capabilities = IPC_CAP_RING_PROMPT };
	/* KVD_RAW_CLIENT_VERSION=0x000300: say an older version (tests of what
	 * the daemon holds back from older clients) */
	if (getenv("KVD_RAW_CLIENT_VERSION"))
		h.client_version = (uint32_t)strtoul(getenv("KVD_RAW_CLIENT_VERSION"), NULL, 0);
	snprintf(h.client_name, sizeof(h.client_name), "kvd_raw");
	r = ipc_send(c->fd, IPC_MSG_HELLO, 0, 0, &h, sizeof(h), NULL, 0);
	if (r < 0) {
		fprintf(stderr, "send HELLO: %s\n", strerror(-r));
		return 1;
	}
	r = ipc_recv(c->fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f);
	if (r < 0) {
		fprintf(stderr, "recv WELCOME: %s\n", strerror(-r));
		return 1;
	}
	if (f.hdr.type == IPC_MSG_ERROR) {
		print_error_frame(&f);
		return 2;
	}
	c->welcome_bytes = f.hdr.length;
	if (f.hdr.type != IPC_MSG_WELCOME || ipc_decode_welcome(&f, &c->w) < 0) {
		fprintf(stderr, "expected WELCOME, got %s\n", ipc_type_name(f.hdr.type));
		return 1;
	}
	r = ipc_chan_attach(f.fds[IPC_WELCOME_FD_MEMFD], f.fds[IPC_WELCOME_FD_WAKE], &c->chan);
	if (r < 0) {
		fprintf(stderr, "attach: %s\n", strerror(-r));
		return 1;
	}
	return 0;
}

/* Wait for the next event about request rid: a ring record or a socket
 * frame. Returns 0 with *f filled, or -errno. */
static int next_event(struct conn *c, struct ipc_frame *f)
{
	for (;;) {
		int r = ipc_chan_recv(c->chan, rbuf, sizeof(rbuf), f);
		if (r == 0) {
			ipc_chan_wake_peer(c->chan); /* the server may wait for room */
			return 0;
		}
		if (r != -EAGAIN)
			return r;
		struct pollfd p[2] = { { c->fd, POLLIN, 0 }, { ipc_chan_wait_fd(c->chan), POLLIN, 0 } };
		r = poll(p, 1, 0);
		if (r > 0 && (p[0].revents & (POLLIN | POLLHUP))) {
			/* a socket frame: the ring was filled before it, so drain it first */
			r = ipc_chan_recv(c->chan, rbuf, sizeof(rbuf), f);
			if (r == 0)
				return 0;
			return ipc_recv(c->fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, f);
		}
		r = ipc_chan_prepare_wait(c->chan, IPC_WAIT_RX, 0);
		if (r > 0)
			continue;
		if (r < 0)
			return r;
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			return -errno;
		ipc_chan_ack(c->chan);
	}
}

/* Upload text through the ring as PROMPT_DATA records for rid. */
static int upload(struct conn *c, uint64_t rid, const char *text, uint32_t len)
{
	uint32_t off = 0, chunk = 16384;
	while (off < len) {
		uint32_t n = len - off < chunk ? len - off : chunk;
		struct ipc_prompt_data pd = { .offset = off, .bytes = n };
		int r = ipc_chan_send(c->chan, IPC_MSG_PROMPT_DATA, 0, rid, &pd, sizeof(pd), text + off, n);
		if (r == -EAGAIN) {
			ipc_chan_wake_peer(c->chan);
			r = ipc_chan_prepare_wait(c->chan, IPC_WAIT_TX, sizeof(pd) + n);
			if (r == 0) {
				struct pollfd p = { ipc_chan_wait_fd(c->chan), POLLIN, 0 };
				poll(&p, 1, 1000);
				ipc_chan_ack(c->chan);
			}
			continue;
		}
		if (r < 0)
			return r;
		off += n;
	}
	ipc_chan_wake_peer(c->chan);
	return 0;
}

struct gen_opts {
	bool raw, ring, ids, hang, turns;
	unsigned slow_ms;     /* sleep after each record (a slow reader) */
	unsigned cancel_after; /* send CANCEL after this many tokens; 0: never */
	unsigned pause_ms;     /* stop reading this long after the first record */
	uint32_t max_tokens;
	const char *system;
	float temperature;
	uint64_t seed;
	const char *stop;
	uint64_t session;
};

/* Run one generation; returns the exit status described at the top. */
static int run_generate(struct conn *c, uint64_t rid, const struct gen_opts *o, const char *prompt)
{
	struct ipc_generate_msg m = { 0 };
	static _Alignas(8) uint8_t fb[IPC_MAX_FRAME_BYTES];
	struct ipc_frame f;
	bool first = true;
	unsigned records = 0, max_batch = 0, n_tok = 0;
	bool cancelled = false;

	static char turns[IPC_MAX_INLINE_TEXT_BYTES * 4];
	uint32_t prompt_len = (uint32_t)strlen(prompt);
	if (o->turns) { /* "R:text|R:text": records written as given */
		size_t k = 0;
		for (const char *p = prompt; *p;) {
			const char *end = strchr(p, '|');
			size_t item = end ? (size_t)(end - p) : strlen(p);
			const char *colon = memchr(p, ':', item);
			if (!colon || k + 8 + item > sizeof(turns)) {
				fprintf(stderr, "--turns: bad turn list\n");
				return 1;
			}
			uint32_t bytes = (uint32_t)(item - (size_t)(colon + 1 - p));
			memset(turns + k, 0, 8);
			turns[k] = (char)strtoul(p, NULL, 10);
			memcpy(turns + k + 4, &bytes, 4);
			memcpy(turns + k + 8, colon + 1, bytes);
			k += 8 + bytes;
			p += item + (end ? 1 : 0);
		}
		prompt = turns;
		prompt_len = (uint32_t)k;
	}
	m.g.gen_flags = (o->raw ? IPC_GEN_RAW : 0) | (o->ids ? IPC_GEN_WANT_IDS : 0) | (o->ring ? IPC_GEN_PROMPT_IN_RING : 0) |
			(o->turns ? IPC_GEN_CHAT_TURNS : 0);
	m.g.max_tokens = o->max_tokens;
	m.g.temperature = o->temperature;
	m.g.top_p = 1.0f;
	m.g.repeat_penalty = 1.0f;
	m.g.seed = o->seed;
	m.g.session_id = o->session;
	m.g.prompt_bytes = prompt_len;
	if (o->system) {
		m.system = o->system;
		m.g.system_bytes = (uint32_t)strlen(o->system);
	}
	if (o->stop) {
		m.g.n_stop = 1;
		m.stop[0] = o->stop;
		m.stop_len[0] = (uint16_t)strlen(o->stop);
	}
	m.prompt = prompt;
	ssize_t n = ipc_encode_generate(fb, sizeof(fb), rid, &m);
	if (n < 0) {
		fprintf(stderr, "encode GENERATE: %s\n", strerror((int)-n));
		return 1;
	}
	if (send(c->fd, fb, (size_t)n, MSG_NOSIGNAL) != n) {
		perror("send GENERATE");
		return 1;
	}
	if (o->ring && upload(c, rid, prompt, m.g.prompt_bytes) < 0) {
		fprintf(stderr, "upload failed\n");
		return 1;
	}
	for (;;) {
		int r = next_event(c, &f);
		if (r < 0) {
			fprintf(stderr, "connection: %s\n", strerror(-r));
			return 1;
		}
		if (f.hdr.request_id != rid)
			continue;
		if (o->slow_ms)
			usleep(o->slow_ms * 1000u);
		if (f.hdr.type == IPC_MSG_TOKEN) {
			struct ipc_token_msg tm;
			if (ipc_decode_token(&f, &tm) < 0) {
				fprintf(stderr, "bad TOKEN\n");
				return 1;
			}
			fwrite(tm.text, 1, tm.t.text_bytes, stdout);
			records++;
			if (tm.t.n_tokens > max_batch)
				max_batch = tm.t.n_tokens;
			if (o->ids)
				for (uint32_t i = 0; i < tm.t.n_ids; i++)
					fprintf(stderr, "id %d\n", ipc_token_id(&tm, i));
			fflush(stdout);
			n_tok += tm.t.n_tokens;
			if (o->cancel_after && !cancelled && n_tok >= o->cancel_after) {
				ipc_send(c->fd, IPC_MSG_CANCEL, 0, rid, NULL, 0, NULL, 0);
				cancelled = true;
			}
			if (first && o->pause_ms)
				usleep(o->pause_ms * 1000u);
			if (first && o->hang) {
				fprintf(stderr, "STREAMING\n");
				for (;;)
					pause();
			}
			first = false;
		} else if (f.hdr.type == IPC_MSG_DONE) {
			struct ipc_done d;
			struct ipc_done_spec sp;
			if (ipc_decode_done_spec(&f, &d, NULL, &sp) < 0) {
				fprintf(stderr, "bad DONE\n");
				return 1;
			}
			fprintf(stderr,
				"DONE finish=%s error=%d prompt=%u cached=%u generated=%u ttft_ms=%.1f total_ms=%.1f "
				"records=%u max_tokens_per_record=%u spec_block=%d drafted=%u accepted=%u\n",
				ipc_finish_name(d.finish_reason), d.error, d.prompt_tokens, d.cached_tokens,
				d.generated_tokens, (double)d.ttft_ns / 1e6, (double)d.total_ns / 1e6, records, max_batch,
				!!(f.hdr.flags & IPC_F_SPEC), sp.drafted_tokens, sp.accepted_tokens);
			return 0;
		} else if (f.hdr.type == IPC_MSG_ERROR) {
			print_error_frame(&f);
			return 2;
		}
	}
}

static int cmd_stats(struct conn *c)
{
	struct ipc_frame f;
	struct ipc_stats s;
	if (ipc_send(c->fd, IPC_MSG_STATS, 0, 1, NULL, 0, NULL, 0) < 0 ||
	    ipc_recv(c->fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f) < 0 || f.hdr.type != IPC_MSG_STATS_REPLY ||
	    ipc_decode_stats(&f, &s) < 0) {
		fprintf(stderr, "STATS failed\n");
		return 1;
	}
#define F(k) printf("%s\"" #k "\":%" PRIu64, first ? "" : ",", (uint64_t)s.k), first = 0
	int first = 1;
	printf("{");
	F(pages_total); F(pages_free); F(pages_used); F(pages_shared); F(pages_cached); F(pages_swapped);
	F(page_bytes); F(block_size); F(kv_bytes_per_token); F(pool_bytes); F(tokens_resident); F(slack_tokens);
	F(prefix_lookups); F(prefix_query_tokens); F(prefix_hit_tokens); F(pages_evicted); F(cow_copies);
	F(swap_out_pages); F(swap_in_pages); F(swap_bytes); F(requests_running); F(requests_waiting);
	F(requests_swapped); F(requests_completed); F(requests_rejected); F(clients); F(sessions);
	F(prompt_tokens_total); F(generated_tokens_total); F(steps); F(uptime_ns);
	F(ledger_records_dropped); F(swap_errors); F(swap_fallback_recomputes); F(pages_demoted);
	F(samples_forked); F(pages_adopted); F(pages_packed); F(pages_released);
	F(adopted_hit_tokens); F(gram_checked); F(gram_masked);
	F(spec_verify_steps); F(spec_drafted_tokens); F(spec_accepted_tokens); F(spec_mode);
	F(spec_draft_pages_total); F(spec_draft_pages_used); F(spec_draft_reclaims);
	printf(",\"reply_bytes\":%" PRIu32 "}\n", f.hdr.length); /* the reply's length on the wire */
#undef F
	return 0;
}

/* Expect an ERROR on the socket (within 5 s). Returns 0 when one came. */
static int expect_error(struct conn *c)
{
	struct ipc_frame f;
	struct pollfd p = { c->fd, POLLIN, 0 };
	for (;;) {
		if (poll(&p, 1, 5000) <= 0) {
			fprintf(stderr, "no reply within 5 s\n");
			return 1;
		}
		int r = ipc_recv(c->fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f);
		if (r < 0) {
			fprintf(stderr, "no ERROR frame: %s\n", strerror(-r));
			return 1;
		}
		if (f.hdr.type == IPC_MSG_ERROR) {
			print_error_frame(&f);
			return 0;
		}
	}
}

static int ping_ok(struct conn *c)
{
	struct ipc_frame f;
	struct ipc_ping p = { .nonce = 0x1234 }, q;
	if (ipc_send(c->fd, IPC_MSG_PING, 0, 99, &p, sizeof(p), NULL, 0) < 0 ||
	    ipc_recv(c->fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f) < 0 || f.hdr.type != IPC_MSG_PONG ||
	    ipc_decode_ping(&f, &q) < 0 || q.nonce != p.nonce) {
		fprintf(stderr, "PING after the error was not answered\n");
		return 1;
	}
	fprintf(stderr, "PONG: connection still served\n");
	return 0;
}

static int cmd_attack(const char *kind, uint32_t bytes)
{
	struct conn c = { 0 };
	uint8_t b[IPC_MAX_FRAME_BYTES];
	struct ipc_hdr h = { .magic = IPC_MAGIC, .version = IPC_PROTO_VERSION };
	bool keep = false;
	int r;

	bool hello = strcmp(kind, "version") && strcmp(kind, "no-hello");
	r = conn_open(&c, hello);
	if (r)
		return r;
	if (!strcmp(kind, "badmagic")) {
		h.magic = 0xdeadbeef;
		h.type = IPC_MSG_PING;
		h.length = 8;
		h.request_id = 3;
		memcpy(b, &h, sizeof(h));
		memset(b + sizeof(h), 0, 8);
		r = (int)send(c.fd, b, sizeof(h) + 8, 0);
	} else if (!strcmp(kind, "short")) {
		r = (int)send(c.fd, "KVD1short", 9, 0);
	} else if (!strcmp(kind, "badlen")) {
		h.type = IPC_MSG_PING;
		h.length = 100; /* but 8 bytes follow */
		h.request_id = 5;
		memcpy(b, &h, sizeof(h));
		memset(b + sizeof(h), 0, 8);
		r = (int)send(c.fd, b, sizeof(h) + 8, 0);
		keep = true;
	} else if (!strcmp(kind, "unknown-type")) {
		h.type = 99;
		h.request_id = 7;
		memcpy(b, &h, sizeof(h));
		r = (int)send(c.fd, b, sizeof(h), 0);
		keep = true;
	} else if (!strcmp(kind, "version")) {
		struct ipc_hello hl = { .client_version = 0x000100 };
		h.version = IPC_PROTO_VERSION + 1;
		h.type = IPC_MSG_HELLO;
		h.length = sizeof(hl);
		memcpy(b, &h, sizeof(h));
		memcpy(b + sizeof(h), &hl, sizeof(hl));
		r = (int)send(c.fd, b, sizeof(h) + sizeof(hl), 0);
	} else if (!strcmp(kind, "no-hello")) {
		r = ipc_send(c.fd, IPC_MSG_STATS, 0, 1, NULL, 0, NULL, 0);
	} else if (!strcmp(kind, "reserved")) {
		struct ipc_generate_msg m = { 0 };
		m.g.max_tokens = 4;
		m.g.top_p = 1;
		m.g.repeat_penalty = 1;
		m.g.prompt_bytes = 2;
		m.prompt = "hi";
		ssize_t n = ipc_encode_generate(b, sizeof(b), 11, &m);
		if (n < 0)
			return 1;
		/* a field out of its range: 255 samples (the byte that was reserved before samples) */
		((struct ipc_generate *)(b + IPC_HDR_BYTES))->n_samples = 255;
		r = (int)send(c.fd, b, (size_t)n, 0);
		keep = true;
	} else if (!strcmp(kind, "oversized-prompt")) {
		struct ipc_generate_msg m = { 0 };
		char *p = malloc(bytes + 1);
		memset(p, 'a', bytes);
		p[bytes] = 0;
		m.g.max_tokens = 4;
		m.g.top_p = 1;
		m.g.repeat_penalty = 1;
		m.g.prompt_bytes = bytes;
		m.prompt = p;
		ssize_t n = ipc_encode_generate(b, sizeof(b), 13, &m);
		if (n < 0) {
			fprintf(stderr, "encode: %s\n", strerror((int)-n));
			return 1;
		}
		r = (int)send(c.fd, b, (size_t)n, 0);
		free(p);
		keep = true;
	} else if (!strcmp(kind, "flood")) {
		/* more GENERATEs in flight than the per-client limit */
		struct ipc_generate_msg m = { 0 };
		m.g.gen_flags = IPC_GEN_RAW;
		m.g.max_tokens = 400;
		m.g.top_p = 1;
		m.g.repeat_penalty = 1;
		m.g.prompt_bytes = 5;
		m.prompt = "flood";
		for (uint64_t id = 1; id <= 64; id++) {
			ssize_t n = ipc_encode_generate(b, sizeof(b), id, &m);
			if (n < 0 || send(c.fd, b, (size_t)n, 0) != n)
				return 1;
		}
		r = 0;
	} else if (!strcmp(kind, "garbage-ring")) {
		uint8_t junk[64];
		memset(junk, 0x5a, sizeof(junk));
		struct ipc_generate_msg m = { 0 };
		m.g.gen_flags = IPC_GEN_PROMPT_IN_RING;
		m.g.max_tokens = 4;
		m.g.top_p = 1;
		m.g.repeat_penalty = 1;
		m.g.prompt_bytes = 100;
		ssize_t n = ipc_encode_generate(b, sizeof(b), 17, &m);
		if (n < 0)
			return 1;
		send(c.fd, b, (size_t)n, 0);
		struct ipc_prompt_data pd = { .offset = 50, .bytes = 10 }; /* wrong offset */
		ipc_chan_send(c.chan, IPC_MSG_PROMPT_DATA, 0, 17, &pd, sizeof(pd), junk, 10);
		ipc_chan_wake_peer(c.chan);
		r = 0;
	} else {
		fprintf(stderr, "unknown attack '%s'\n", kind);
		return 64;
	}
	if (r < 0) {
		perror("send");
		return 1;
	}
	r = expect_error(&c);
	if (r == 0 && keep)
		r = ping_ok(&c);
	return r;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' }, { "raw", no_argument, NULL, 'r' },
		{ "ring", no_argument, NULL, 'R' },         { "ids", no_argument, NULL, 'i' },
		{ "max-tokens", required_argument, NULL, 'n' }, { "system", required_argument, NULL, 'S' },
		{ "temperature", required_argument, NULL, 'T' }, { "seed", required_argument, NULL, 'e' },
		{ "stop", required_argument, NULL, 'p' },   { "hang", no_argument, NULL, 'H' },
		{ "bytes", required_argument, NULL, 'b' },  { "slow", required_argument, NULL, 'w' },
		{ "cancel-after", required_argument, NULL, 'C' }, { "pause", required_argument, NULL, 'P' },
		{ "turns", no_argument, NULL, 'U' }, { 0 },
	};
	struct gen_opts o = { .max_tokens = 32, .seed = 1 };
	uint32_t bytes = 4096;
	int c;

	sock_path = getenv("KVD_SOCKET") ? getenv("KVD_SOCKET") : "/run/kvd/kvd.sock";
	while ((c = getopt_long(argc, argv, "+s:n:", lo, NULL)) != -1) {
		switch (c) {
		case 's': sock_path = optarg; break;
		case 'r': o.raw = true; break;
		case 'R': o.ring = true; break;
		case 'i': o.ids = true; break;
		case 'n': o.max_tokens = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'S': o.system = optarg; break;
		case 'T': o.temperature = strtof(optarg, NULL); break;
		case 'e': o.seed = strtoull(optarg, NULL, 0); break;
		case 'p': o.stop = optarg; break;
		case 'H': o.hang = true; break;
		case 'b': bytes = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'w': o.slow_ms = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'C': o.cancel_after = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'P': o.pause_ms = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'U': o.turns = true; break;
		default: return 64;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "usage: kvd_raw [-s SOCK] hello|generate|session|stats|attack ...\n");
		return 64;
	}
	const char *cmd = argv[optind++];
	/* options may also follow the command */
	while ((c = getopt_long(argc, argv, "+s:n:", lo, NULL)) != -1) {
		switch (c) {
		case 's': sock_path = optarg; break;
		case 'r': o.raw = true; break;
		case 'R': o.ring = true; break;
		case 'i': o.ids = true; break;
		case 'n': o.max_tokens = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'S': o.system = optarg; break;
		case 'T': o.temperature = strtof(optarg, NULL); break;
		case 'e': o.seed = strtoull(optarg, NULL, 0); break;
		case 'p': o.stop = optarg; break;
		case 'H': o.hang = true; break;
		case 'b': bytes = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'w': o.slow_ms = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'C': o.cancel_after = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'P': o.pause_ms = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'U': o.turns = true; break;
		default: return 64;
		}
	}
	if (!strcmp(cmd, "attack"))
		return optind < argc ? cmd_attack(argv[optind], bytes) : 64;
	struct conn cn = { 0 };
	int r = conn_open(&cn, true);
	if (r)
		return r;
	if (!strcmp(cmd, "hello")) {
		printf("WELCOME client %" PRIu64 " model '%s' n_ctx %u block %u pool %" PRIu64
		       " bytes %u chat_format '%s' kv_type %u\n",
		       cn.w.client_id, cn.w.model_name, cn.w.n_ctx, cn.w.block_size, cn.w.pool_bytes, cn.welcome_bytes,
		       cn.w.chat_format, cn.w.kv_type);
		return 0;
	}
	if (!strcmp(cmd, "stats"))
		return cmd_stats(&cn);
	if (!strcmp(cmd, "generate"))
		return optind < argc ? run_generate(&cn, 1, &o, argv[optind]) : 64;
	if (!strcmp(cmd, "tokenize")) {
		if (optind >= argc)
			return 64;
		static _Alignas(8) uint8_t tb[IPC_MAX_FRAME_BYTES];
		struct ipc_tokenize t = { .tok_flags = IPC_TOK_PARSE_SPECIAL, .text_bytes = (uint32_t)strlen(argv[optind]) };
		struct ipc_frame f;
		memcpy(tb, &t, sizeof(t));
		memcpy(tb + sizeof(t), argv[optind], t.text_bytes);
		if (ipc_send(cn.fd, IPC_MSG_TOKENIZE, 0, 5, tb, sizeof(t) + t.text_bytes, NULL, 0) < 0)
			return 1;
		for (;;) {
			struct ipc_tokenize_reply_msg m;
			if (ipc_recv(cn.fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f) < 0)
				return 1;
			if (f.hdr.type == IPC_MSG_ERROR)
				return print_error_frame(&f), 2;
			if (f.hdr.type != IPC_MSG_TOKENIZE_REPLY || ipc_decode_tokenize_reply(&f, &m) < 0)
				return 1;
			for (uint32_t i = 0; i < m.r.n_ids; i++)
				printf("%s%d", m.r.offset + i ? " " : "", ipc_reply_id(&m, i));
			if (!m.more)
				break;
		}
		printf("\n");
		return 0;
	}
	if (!strcmp(cmd, "ps")) {
		struct ipc_frame f;
		if (ipc_send(cn.fd, IPC_MSG_PS, 0, 6, NULL, 0, NULL, 0) < 0)
			return 1;
		for (;;) {
			struct ipc_ps_reply_msg m;
			if (ipc_recv(cn.fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f) < 0 || f.hdr.type != IPC_MSG_PS_REPLY ||
			    ipc_decode_ps_reply(&f, &m) < 0)
				return 1;
			for (uint32_t i = 0; i < m.r.n_entries; i++) {
				struct ipc_ps_entry e;
				ipc_ps_entry_at(&m, i, &e);
				printf("client=%" PRIu64 " request=%" PRIu64 " pid=%u uid=%u state=%s pages=%u shared=%u prompt=%u "
				       "generated=%u/%u\n",
				       e.client_id, e.request_id, e.pid, e.uid, ipc_req_state_name(e.state), e.pages, e.pages_shared,
				       e.prompt_tokens, e.generated_tokens, e.max_tokens);
			}
			if (!m.more)
				break;
		}
		return 0;
	}
	if (!strcmp(cmd, "session")) {
		struct ipc_session_open so = { 0 };
		struct ipc_session s;
		struct ipc_frame f;
		if (ipc_send(cn.fd, IPC_MSG_SESSION_OPEN, 0, 1, &so, sizeof(so), NULL, 0) < 0 ||
		    ipc_recv(cn.fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f) < 0 || f.hdr.type != IPC_MSG_SESSION_OPENED ||
		    ipc_decode_session(&f, &s) < 0) {
			fprintf(stderr, "SESSION_OPEN failed\n");
			return 1;
		}
		o.session = s.session_id;
		for (int i = optind; i < argc; i++) {
			r = run_generate(&cn, (uint64_t)(i + 10), &o, argv[i]);
			printf("\n---\n");
			if (r)
				return r;
		}
		if (ipc_send(cn.fd, IPC_MSG_SESSION_CLOSE, 0, 2, &s, sizeof(s), NULL, 0) < 0 ||
		    ipc_recv(cn.fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f) < 0 || f.hdr.type != IPC_MSG_SESSION_CLOSED) {
			fprintf(stderr, "SESSION_CLOSE failed\n");
			return 1;
		}
		return 0;
	}
	fprintf(stderr, "unknown command '%s'\n", cmd);
	return 64;
}
