/*
 * tests/fuzz/fuzz_server.c — libFuzzer target for what a local client can
 * make the daemon do: the handshake, every request on the socket, uploads
 * and hostile writes through the shared-memory channel, with the real
 * server (daemon/server.c), scheduler and engine running the seed model
 * (tests/fuzz/corpus/fuzz_model/seed-model.gguf, one layer: a step takes
 * microseconds).
 *
 * The server runs on its own thread for the whole fuzzing session,
 * listening on an abstract socket; each input is one client connection
 * driven by a small program:
 *   0 HELLO       capabilities byte
 *   1 RAW         u16 length, bytes sent as one datagram as they are
 *   2 FRAME       type, flags, request id (bytes), u16 length, payload:
 *                 a well-formed header around any payload
 *   3 RING        type, request id, u16 length, payload: one record on the
 *                 client->server ring (after WELCOME)
 *   4 POKE        u32 offset, byte: written anywhere in the shared memory
 *   5 SYNC        PING, then read everything until its PONG
 *   6 HOSTILE_FDS bits, an attack on what WELCOME handed over (the
 *                 client's end of the wake-up socket pair): clear
 *                 O_NONBLOCK on it (1); fill its send buffer, that is the
 *                 daemon's receive queue, with wake-up datagrams (2);
 *                 announce sleep on the token ring, again after every
 *                 later command, and never read the ring or the wake-up
 *                 socket again, so the daemon's wake-ups pile up in this
 *                 end's queue (4); shutdown() it (8).
 *                 From the first command 6 on, wake-ups are never
 *                 acknowledged (received) either.
 * and a final SYNC. Replies are read and checked as libkvclient checks
 * them (ipc_recv: the server's frames must be well-formed).
 *
 * Promises checked: everything the server sends on the socket passes
 * ipc_frame_check as a server frame and decodes; a connection the server
 * ends says why first (an ERROR with request id 0) or simply closes after
 * shared-memory corruption; and the daemon keeps serving: whenever a
 * connection ended, or stayed open without answering the final PING within
 * SYNC_MS, a fresh client must get WELCOME and PONG within LIVENESS_MS, or
 * the input is reported as a hang (trap); after a command 6 that check runs
 * while the hostile connection is still open, its attack in place. Every
 * QUIET_EVERY inputs the daemon must be back to no running request, no
 * session (those seen are closed first; the idle timeout is 1 s here for
 * the rest), no page in use and no client but the one asking: connections,
 * requests, sessions and pages do not leak.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include "ipc.h"
#include "daemon/engine.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "fuzz_util.h"

#define LIVENESS_MS 5000
#define SYNC_MS     2000
#define MAX_CMDS    64

static char sock_path[64];
static struct kvd_engine *engine;
static struct kvd_server *server;
static int sig_wr = -1;
static uint8_t rx[IPC_MAX_FRAME_BYTES] __attribute__((aligned(64)));
static uint8_t ring_rx[IPC_MAX_FRAME_BYTES] __attribute__((aligned(64)));

struct conn {
	int fd;
	struct ipc_chan *chan;
	uint8_t *shm;
	size_t shm_bytes;
	bool closed;        /* EOF, or an ERROR about the connection */
	bool conn_error;    /* that ERROR came */
	uint64_t ping_nonce;
	int wfd;            /* dup of the WELCOME wake-up end (same open file) */
	bool hostile;       /* command 6 ran: wake-ups are never received */
	bool mute;          /* command 6 bit 4: the token ring is never read */
};

/* Command 6 bits. */
#define HOSTILE_BLOCKING 0x1u /* clear O_NONBLOCK on the wake-up end */
#define HOSTILE_FILL     0x2u /* fill the daemon's receive queue */
#define HOSTILE_MUTE     0x4u /* announce sleep, never read again */
#define HOSTILE_SHUTDOWN 0x8u /* shutdown(SHUT_RDWR) the wake-up end */
/* Wake-up datagrams sent by one fill: far beyond any socket queue
 * (net.unix.max_dgram_qlen, the send buffer), still bounded. */
#define HOSTILE_FILL_MAX 65536

/* Sessions the fuzzed clients opened (SESSION_OPENED seen): closed by the
 * quiescence check, since they belong to the user, not the connection. */
#define MAX_SEEN_SESSIONS 4096
static uint64_t seen_sessions[MAX_SEEN_SESSIONS];
static unsigned n_seen_sessions;

static void *serve(void *arg)
{
	kvd_server_run(server);
	return NULL;
}

static void write_seeds(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char model[4096], err[512];
	struct kvd_config cfg;
	int pfd[2], listen_fd;

	kvd_log_level = 0;
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	signal(SIGPIPE, SIG_IGN);
	const char *dir = getenv("KVD_FUZZ_WRITE_SEEDS");
	if (dir && *dir) {
		write_seeds(dir);
		exit(0);
	}
	fuzz_data_path("tests/fuzz/corpus/fuzz_model/seed-model.gguf", model, sizeof(model));
	struct kvd_engine_config ec = {
		.model_path = model, .backend = "cpu", .n_threads = 1, .block_size = 16,
		.kv_pool_bytes = 256 << 10, .max_seqs = 64, .prefix_cache = 1,
	};
	if (kvd_engine_open(&ec, &engine, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz_server: %s (run from the repository root)\n", err);
		exit(1);
	}
	kvd_config_defaults(&cfg);
	cfg.max_model_len = 64;
	cfg.token_ring_bytes = IPC_RING_MIN_BYTES;
	cfg.drain_timeout_s = 0;
	cfg.max_clients = 64;
	cfg.session_idle_s = 1; /* sessions (and their pages) outlive connections: not for long */
	cfg.log_level = 0;
	snprintf(sock_path, sizeof(sock_path), "@kvd-fuzz-server-%d", (int)getpid());
	if (ipc_listen(sock_path, 0, 64, &listen_fd) < 0 || pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0) {
		fprintf(stderr, "fuzz_server: cannot listen on %s\n", sock_path);
		exit(1);
	}
	/* The "signalfd" is a pipe: nothing here stops the server. */
	sig_wr = pfd[1];
	if (kvd_server_create(&cfg, engine, listen_fd, pfd[0], NULL, &server) < 0) {
		fprintf(stderr, "fuzz_server: cannot create the server\n");
		exit(1);
	}
	pthread_t th;
	if (pthread_create(&th, NULL, serve, NULL) != 0)
		exit(1);
	pthread_detach(th);
	return 0;
}

static int wait_readable(int fd, int ms)
{
	struct pollfd p = { fd, POLLIN, 0 };
	int r;
	do
		r = poll(&p, 1, ms);
	while (r < 0 && errno == EINTR);
	return r;
}

/* One server frame from the socket: checked like libkvclient checks it. */
static int read_frame(struct conn *c, int ms)
{
	if (c->closed)
		return -ECONNRESET;
	if (wait_readable(c->fd, ms) <= 0)
		return -EAGAIN;
	struct ipc_frame f;
	int r = ipc_recv(c->fd, rx, sizeof(rx), IPC_FROM_SERVER, &f);
	if (r == -ECONNRESET) {
		c->closed = true;
		return r;
	}
	CHECK(r == 0); /* the server sends only well-formed frames */
	switch (f.hdr.type) {
	case IPC_MSG_WELCOME: {
		struct ipc_welcome w;
		CHECK(ipc_decode_welcome(&f, &w) == 0 && c->chan == NULL);
		int memfd = f.fds[IPC_WELCOME_FD_MEMFD];
		c->shm = mmap(NULL, w.shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
		CHECK(c->shm != MAP_FAILED);
		c->shm_bytes = w.shm_bytes;
		c->wfd = fcntl(f.fds[IPC_WELCOME_FD_WAKE], F_DUPFD_CLOEXEC, 0);
		CHECK(c->wfd >= 0);
		CHECK(ipc_chan_attach(memfd, f.fds[IPC_WELCOME_FD_WAKE], &c->chan) == 0);
		f.n_fds = 0;
		break;
	}
	case IPC_MSG_ERROR: {
		struct ipc_error_msg m;
		CHECK(ipc_decode_error(&f, &m) == 0);
		if (f.hdr.request_id == 0) {
			c->conn_error = true;
			c->closed = true;
		}
		break;
	}
	case IPC_MSG_PONG: {
		struct ipc_ping p;
		CHECK(ipc_decode_ping(&f, &p) == 0);
		if (p.nonce == c->ping_nonce)
			c->ping_nonce = 0;
		break;
	}
	case IPC_MSG_STATS_REPLY: {
		struct ipc_stats s;
		CHECK(ipc_decode_stats(&f, &s) == 0);
		break;
	}
	case IPC_MSG_TOKENIZE_REPLY: {
		struct ipc_tokenize_reply_msg m;
		CHECK(ipc_decode_tokenize_reply(&f, &m) == 0);
		break;
	}
	case IPC_MSG_SESSION_OPENED:
	case IPC_MSG_SESSION_CLOSED: {
		struct ipc_session s;
		CHECK(ipc_decode_session(&f, &s) == 0);
		if (f.hdr.type == IPC_MSG_SESSION_OPENED && n_seen_sessions < MAX_SEEN_SESSIONS)
			seen_sessions[n_seen_sessions++] = s.session_id;
		break;
	}
	case IPC_MSG_PS_REPLY: {
		struct ipc_ps_reply_msg m;
		CHECK(ipc_decode_ps_reply(&f, &m) == 0);
		break;
	}
	case IPC_MSG_DONE: {
		struct ipc_done d;
		CHECK(ipc_decode_done(&f, &d) == 0);
		break;
	}
	case IPC_MSG_KVMAP_REPLY: {
		struct ipc_kvmap k;
		CHECK(ipc_decode_kvmap(&f, &k) == 0 && f.n_fds == 1);
		break;
	}
	case IPC_MSG_HIST_REPLY: {
		struct ipc_hist_reply h;
		CHECK(ipc_decode_hist(&f, &h) == 0);
		break;
	}
	case IPC_MSG_LEDGER_REPLY: {
		struct ipc_ledger_reply_msg m;
		CHECK(ipc_decode_ledger_reply(&f, &m) == 0);
		break;
	}
	default:
		CHECK(0);
	}
	ipc_frame_close_fds(&f);
	return 0;
}

static void drain_ring(struct conn *c)
{
	if (!c->chan)
		return;
	if (c->mute) { /* keep announcing sleep: every push wants to wake us */
		(void)ipc_chan_prepare_wait(c->chan, IPC_WAIT_RX, 0);
		return;
	}
	if (!c->hostile)
		ipc_chan_ack(c->chan);
	for (int k = 0; k < 4096; k++) {
		struct ipc_frame f;
		int r = ipc_chan_recv(c->chan, ring_rx, sizeof(ring_rx), &f);
		if (r < 0)
			break; /* empty, or broken by our own pokes */
	}
	ipc_chan_wake_peer(c->chan);
}

/* PING and read until its PONG, the end of the connection, or SYNC_MS. */
static void sync_conn(struct conn *c, uint64_t nonce)
{
	if (c->closed)
		return;
	struct ipc_ping p = { nonce | 1 };
	if (ipc_send(c->fd, IPC_MSG_PING, 0, 1, &p, sizeof(p), NULL, 0) < 0) {
		c->closed = true;
		return;
	}
	c->ping_nonce = p.nonce;
	for (int waited = 0; c->ping_nonce && !c->closed && waited < SYNC_MS;) {
		drain_ring(c);
		int r = read_frame(c, 10);
		if (r == -EAGAIN)
			waited += 10;
	}
	drain_ring(c);
}

static void conn_close(struct conn *c)
{
	ipc_chan_free(c->chan);
	if (c->shm && c->shm != MAP_FAILED)
		munmap(c->shm, c->shm_bytes);
	if (c->fd >= 0)
		close(c->fd);
	if (c->wfd >= 0)
		close(c->wfd);
}

/* A fresh client gets WELCOME and PONG: the daemon still serves. */
static void check_alive(void)
{
	struct conn c = { .fd = -1, .wfd = -1 };
	CHECK(ipc_connect(sock_path, &c.fd) == 0);
	struct ipc_hello h = { .client_version = 1, .capabilities = IPC_CAP_RING_PROMPT, .client_name = "liveness" };
	CHECK(ipc_send(c.fd, IPC_MSG_HELLO, 0, 0, &h, sizeof(h), NULL, 0) == 0);
	for (int waited = 0; !c.chan && waited < LIVENESS_MS; waited += 10)
		if (read_frame(&c, 10) == -ECONNRESET)
			break;
	CHECK(c.chan != NULL);
	struct ipc_ping p = { 0x600d };
	CHECK(ipc_send(c.fd, IPC_MSG_PING, 0, 7, &p, sizeof(p), NULL, 0) == 0);
	c.ping_nonce = p.nonce;
	for (int waited = 0; c.ping_nonce && !c.closed && waited < LIVENESS_MS;)
		if (read_frame(&c, 10) == -EAGAIN)
			waited += 10;
	CHECK(c.ping_nonce == 0);
	conn_close(&c);
}

/*
 * Every QUIET_EVERY inputs: once the fuzzed connections are closed, the
 * daemon must drop back to one client (this one), no request running or
 * waiting, and no page in use — nothing a client did outlives it.
 */
#define QUIET_EVERY 512
#define QUIET_MS    4000

static void check_quiescent(void)
{
	struct conn c = { .fd = -1, .wfd = -1 };
	struct ipc_stats st = { 0 };
	CHECK(ipc_connect(sock_path, &c.fd) == 0);
	struct ipc_hello h = { .client_version = 1, .client_name = "quiet" };
	CHECK(ipc_send(c.fd, IPC_MSG_HELLO, 0, 0, &h, sizeof(h), NULL, 0) == 0);
	for (unsigned i = 0; i < n_seen_sessions; i++) { /* replies are read below, before STATS_REPLY */
		struct ipc_session sc = { seen_sessions[i] };
		CHECK(ipc_send(c.fd, IPC_MSG_SESSION_CLOSE, 0, 100 + i, &sc, sizeof(sc), NULL, 0) == 0);
		if (i % 64 == 63) { /* keep the socket buffers from filling */
			struct ipc_frame f;
			while (wait_readable(c.fd, 0) > 0 && ipc_recv(c.fd, rx, sizeof(rx), IPC_FROM_SERVER, &f) == 0)
				ipc_frame_close_fds(&f);
		}
	}
	n_seen_sessions = 0;
	for (int waited = 0; waited < QUIET_MS; waited += 50) {
		struct ipc_frame f;
		CHECK(ipc_send(c.fd, IPC_MSG_STATS, 0, 9, NULL, 0, NULL, 0) == 0);
		for (;;) { /* WELCOME first, then the reply */
			CHECK(wait_readable(c.fd, LIVENESS_MS) > 0);
			CHECK(ipc_recv(c.fd, rx, sizeof(rx), IPC_FROM_SERVER, &f) == 0);
			ipc_frame_close_fds(&f);
			if (f.hdr.type == IPC_MSG_STATS_REPLY)
				break;
		}
		CHECK(ipc_decode_stats(&f, &st) == 0);
		if (st.clients == 1 && st.requests_running == 0 && st.requests_waiting == 0 && st.pages_used == 0 &&
		    st.sessions == 0)
			break;
		usleep(50000);
	}
	if (!(st.clients == 1 && st.requests_running == 0 && st.requests_waiting == 0 && st.pages_used == 0 &&
	      st.sessions == 0))
		fprintf(stderr, "fuzz_server: not quiet after %d ms: %llu clients, %llu running, %llu waiting, "
			"%llu swapped, %llu pages used, %llu sessions\n", QUIET_MS, (unsigned long long)st.clients,
			(unsigned long long)st.requests_running, (unsigned long long)st.requests_waiting,
			(unsigned long long)st.requests_swapped, (unsigned long long)st.pages_used,
			(unsigned long long)st.sessions);
	CHECK(st.clients == 1 && st.requests_running == 0 && st.requests_waiting == 0 && st.pages_used == 0 &&
	      st.sessions == 0);
	conn_close(&c);
}

/*
 * Command 6: what a client can do to the one fd of the daemon's it
 * reaches, its end of the wake-up socket pair. (Protocol 1 handed over
 * the daemon's own eventfds: clearing O_NONBLOCK and filling the counter
 * blocked the daemon's write, and every client with it.) None of this
 * may stall the daemon: its end is a different open file, every call it
 * makes passes MSG_DONTWAIT, and a datagram end's shutdown() stays local.
 */
static void hostile(struct conn *c, unsigned how)
{
	if (!c->chan)
		return;
	c->hostile = true;
	if (how & HOSTILE_BLOCKING) {
		int fl = fcntl(c->wfd, F_GETFL);
		if (fl >= 0)
			fcntl(c->wfd, F_SETFL, fl & ~O_NONBLOCK);
	}
	if (how & HOSTILE_FILL) {
		uint8_t b[8] = { 0 };
		for (int i = 0; i < HOSTILE_FILL_MAX; i++)
			if (send(c->wfd, b, sizeof(b), MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EINTR)
				break; /* EAGAIN: the daemon's queue is full */
	}
	if (how & HOSTILE_MUTE) {
		(void)ipc_chan_prepare_wait(c->chan, IPC_WAIT_RX, 0);
		c->mute = true;
	}
	if (how & HOSTILE_SHUTDOWN)
		shutdown(c->wfd, SHUT_RDWR);
}

struct in {
	const uint8_t *p, *end;
};

static unsigned u8(struct in *s)
{
	return s->p < s->end ? *s->p++ : 0;
}

static unsigned u16(struct in *s)
{
	unsigned v = u8(s);
	return v | u8(s) << 8;
}

static const uint8_t *bytes(struct in *s, size_t *len)
{
	if (*len > (size_t)(s->end - s->p))
		*len = (size_t)(s->end - s->p);
	const uint8_t *b = s->p;
	s->p += *len;
	return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in s = { data, data + size };
	struct conn c = { .fd = -1, .wfd = -1 };
	static uint64_t nonce;

	if (ipc_connect(sock_path, &c.fd) < 0) {
		check_alive();
		return 0;
	}
	for (int k = 0; k < MAX_CMDS && s.p < s.end && !c.closed; k++) {
		unsigned op = u8(&s) % 7;
		switch (op) {
		case 0: {
			struct ipc_hello h = { .client_version = 1, .capabilities = u8(&s) & IPC_CAP_ALL,
					       .client_name = "fuzz" };
			if (ipc_send(c.fd, IPC_MSG_HELLO, 0, 0, &h, sizeof(h), NULL, 0) < 0)
				c.closed = true;
			break;
		}
		case 1: {
			size_t len = u16(&s);
			const uint8_t *b = bytes(&s, &len);
			if (send(c.fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
				c.closed = true;
			break;
		}
		case 2: {
			unsigned type = u8(&s), flags = u8(&s), rid = u8(&s);
			size_t len = u16(&s);
			const uint8_t *b = bytes(&s, &len);
			int r = ipc_send(c.fd, (uint16_t)type, flags, rid, b, len, NULL, 0);
			if (r < 0 && r != -EAGAIN && r != -E2BIG)
				c.closed = true;
			break;
		}
		case 3: {
			unsigned type = u8(&s), rid = u8(&s);
			size_t len = u16(&s);
			const uint8_t *b = bytes(&s, &len);
			if (!c.chan)
				break;
			(void)ipc_chan_send(c.chan, (uint16_t)type, 0, rid, b, len, NULL, 0);
			ipc_chan_wake_peer(c.chan);
			break;
		}
		case 4: {
			uint32_t off = u16(&s) | (uint32_t)u16(&s) << 16;
			unsigned v = u8(&s);
			if (c.shm)
				c.shm[off % c.shm_bytes] = (uint8_t)v;
			break;
		}
		case 5:
			sync_conn(&c, ++nonce << 1);
			break;
		case 6: /* attack the wake-up socket end WELCOME handed over */
			hostile(&c, u8(&s));
			break;
		}
		/* read what is there already, so the server's socket never fills */
		while (!c.closed && read_frame(&c, 0) == 0)
			;
		drain_ring(&c);
	}
	sync_conn(&c, ++nonce << 1);
	/* attacked, ended, or open but no PONG within SYNC_MS: is the daemon
	 * stuck? A hostile connection is checked with its attack in place. */
	bool suspect = c.hostile || c.closed || c.ping_nonce;
	if (c.hostile)
		check_alive();
	conn_close(&c);
	if (suspect)
		check_alive();
	static unsigned n_inputs;
	if (++n_inputs % QUIET_EVERY == 0)
		check_quiescent();
	return 0;
}

/* ---- seeds: the programs a well-behaved client runs -------------------- */

struct out {
	FILE *fp;
};

static void w8(struct out *o, unsigned v)
{
	fputc((int)(v & 0xff), o->fp);
}

static void w16(struct out *o, unsigned v)
{
	w8(o, v);
	w8(o, v >> 8);
}

static void w_frame(struct out *o, unsigned type, unsigned rid, const void *p, size_t n)
{
	w8(o, 2);
	w8(o, type);
	w8(o, 0);
	w8(o, rid);
	w16(o, (unsigned)n);
	fwrite(p, 1, n, o->fp);
}

static void w_ring(struct out *o, unsigned type, unsigned rid, const void *p, size_t n)
{
	w8(o, 3);
	w8(o, type);
	w8(o, rid);
	w16(o, (unsigned)n);
	fwrite(p, 1, n, o->fp);
}

static void w_generate(struct out *o, unsigned rid, const char *prompt, uint32_t flags, uint64_t session,
		       const char *system, const char *stop)
{
	static uint8_t buf[IPC_MAX_FRAME_BYTES];
	struct ipc_generate_msg m = { 0 };
	m.g.gen_flags = flags;
	m.g.max_tokens = 8;
	m.g.top_p = 1.0f;
	m.g.repeat_penalty = 1.0f;
	m.g.seed = 42;
	m.g.session_id = session;
	m.g.prompt_bytes = (uint32_t)strlen(prompt);
	m.prompt = prompt;
	if (system) {
		m.system = system;
		m.g.system_bytes = (uint32_t)strlen(system);
	}
	if (stop) {
		m.g.n_stop = 1;
		m.stop[0] = stop;
		m.stop_len[0] = (uint16_t)strlen(stop);
	}
	ssize_t n = ipc_encode_generate(buf, sizeof(buf), rid, &m);
	if (n < 0)
		exit(1);
	w_frame(o, IPC_MSG_GENERATE, rid, buf + IPC_HDR_BYTES, (size_t)n - IPC_HDR_BYTES);
	if (flags & IPC_GEN_PROMPT_IN_RING) {
		uint8_t rec[256];
		struct ipc_prompt_data d = { 0, m.g.prompt_bytes };
		memcpy(rec, &d, sizeof(d));
		memcpy(rec + sizeof(d), prompt, d.bytes);
		w_ring(o, IPC_MSG_PROMPT_DATA, rid, rec, sizeof(d) + d.bytes);
	}
}

static struct out seed_open(const char *dir, const char *name)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	struct out o = { fopen(path, "wb") };
	if (!o.fp)
		exit(1);
	w8(&o, 0); /* HELLO */
	w8(&o, IPC_CAP_RING_PROMPT);
	w8(&o, 5); /* SYNC: WELCOME is in */
	return o;
}

static void write_seeds(const char *dir)
{
	struct out o = seed_open(dir, "generate");
	w_generate(&o, 1, "Why is the sky blue?", 0, 0, "Be brief.", "\n\n");
	w_generate(&o, 2, "Once upon a time", IPC_GEN_RAW | IPC_GEN_WANT_IDS, 0, NULL, NULL);
	w8(&o, 5);
	fclose(o.fp);

	o = seed_open(dir, "ring-upload");
	w_generate(&o, 3, "A prompt sent through the shared-memory ring.", IPC_GEN_PROMPT_IN_RING | IPC_GEN_RAW, 0,
		   NULL, NULL);
	struct ipc_tokenize t = { IPC_TOK_TEXT_IN_RING | IPC_TOK_ADD_BOS, 11 };
	w_frame(&o, IPC_MSG_TOKENIZE, 4, &t, sizeof(t));
	uint8_t rec[64];
	struct ipc_prompt_data d = { 0, 11 };
	memcpy(rec, &d, sizeof(d));
	memcpy(rec + sizeof(d), "hello world", 11);
	w_ring(&o, IPC_MSG_PROMPT_DATA, 4, rec, sizeof(d) + 11);
	w8(&o, 5);
	fclose(o.fp);

	o = seed_open(dir, "requests");
	struct {
		struct ipc_tokenize t;
		char text[32];
	} tk = { { IPC_TOK_PARSE_SPECIAL, 24 }, "<|im_start|>user\nhi there" };
	w_frame(&o, IPC_MSG_TOKENIZE, 5, &tk, sizeof(tk.t) + 24);
	w_frame(&o, IPC_MSG_STATS, 6, NULL, 0);
	w_frame(&o, IPC_MSG_PS, 7, NULL, 0);
	struct ipc_session_open so = { 0, 30 };
	w_frame(&o, IPC_MSG_SESSION_OPEN, 8, &so, sizeof(so));
	w8(&o, 5);
	w_generate(&o, 9, "Hello", 0, 1, NULL, NULL);
	w_frame(&o, IPC_MSG_CANCEL, 9, NULL, 0);
	struct ipc_session sc = { 1 };
	w_frame(&o, IPC_MSG_SESSION_CLOSE, 10, &sc, sizeof(sc));
	w8(&o, 5);
	fclose(o.fp);

	o = seed_open(dir, "views");
	w_frame(&o, IPC_MSG_KVMAP, 11, NULL, 0);
	w_frame(&o, IPC_MSG_HIST, 12, NULL, 0);
	w_generate(&o, 13, "Hello", 0, 0, NULL, NULL);
	w8(&o, 5);
	struct ipc_ledger_req lq = { .max_records = 3 };
	w_frame(&o, IPC_MSG_LEDGER, 14, &lq, sizeof(lq));
	w8(&o, 5);
	fclose(o.fp);

	/* The attacks of command 6 in place while two streams go to a client
	 * that never reads them; the daemon must still serve a fresh client. */
	o = seed_open(dir, "hostile-fds-blocking");
	w8(&o, 6);
	w8(&o, HOSTILE_BLOCKING | HOSTILE_FILL | HOSTILE_MUTE);
	w_generate(&o, 1, "Why is the sky blue?", 0, 0, "Be brief.", "\n\n");
	w_generate(&o, 2, "Once upon a time", IPC_GEN_RAW | IPC_GEN_WANT_IDS, 0, NULL, NULL);
	w8(&o, 5);
	fclose(o.fp);

	o = seed_open(dir, "hostile-fds-shutdown");
	w8(&o, 6);
	w8(&o, HOSTILE_BLOCKING | HOSTILE_FILL | HOSTILE_MUTE | HOSTILE_SHUTDOWN);
	w_generate(&o, 1, "Why is the sky blue?", 0, 0, "Be brief.", "\n\n");
	w_generate(&o, 2, "Once upon a time", IPC_GEN_RAW | IPC_GEN_WANT_IDS, 0, NULL, NULL);
	w8(&o, 5);
	fclose(o.fp);

	o = seed_open(dir, "poke");
	w_generate(&o, 11, "Poking the ring", IPC_GEN_PROMPT_IN_RING, 0, NULL, NULL);
	w8(&o, 4); /* the c2s ring's head, in the header page */
	w16(&o, 128);
	w16(&o, 0);
	w8(&o, 0x55);
	w8(&o, 5);
	fclose(o.fp);
}
