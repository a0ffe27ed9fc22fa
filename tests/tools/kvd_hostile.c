/*
 * tests/tools/kvd_hostile.c — a deliberately hostile local client for
 * kvd's integration tests, built on ipc/ alone. Each mode does one thing a
 * well-behaved client never does and keeps doing it until killed or until
 * --seconds have passed; the test script checks meanwhile that other
 * clients are still served and that SIGTERM still stops the daemon.
 *
 *   kvd_hostile [-s SOCK] [--seconds N] nonblock
 *       HELLO, then on every fd WELCOME handed over: clear O_NONBLOCK
 *       (the file status flags belong to the open file description, so
 *       this reaches whoever shares it), fill every counter or queue the
 *       daemon writes to, race the daemon for every read it makes
 *       (a thread writing and reading back in a loop), announce sleep on
 *       the token ring and start a long GENERATE whose tokens are never
 *       read. Prints "ATTACKING" on stdout once all of that is in place.
 *   kvd_hostile [-s SOCK] [--seconds N] hold COUNT [--hello]
 *       Open COUNT connections (saying HELLO on each with --hello) and
 *       keep them open and silent. Prints "HELD n refused m" once done
 *       (a connection counts as refused when the daemon answered it with
 *       an ERROR frame or closed it), and at the end "CLOSED_BY_DAEMON k":
 *       how many of the held ones the daemon had closed by then.
 *   kvd_hostile [-s SOCK] [--seconds N] upload-hang
 *       HELLO, then a GENERATE whose prompt is announced for the ring but
 *       never sent, so the request stays in flight (state "uploading").
 *       Prints "UPLOADING", keeps silent for N seconds, then prints
 *       "OPEN" or "CLOSED" (whether the daemon had closed the connection).
 *   kvd_hostile [-s SOCK] [--seconds N] flood
 *       Keep the socket full of TOKENIZE (count only) requests, reading
 *       the replies as they come. Prints "FLOODING" once started and
 *       "REPLIES n" on exit (after --seconds, or at once on SIGTERM).
 *   kvd_hostile [-s SOCK] [--seconds N] watch
 *       HELLO, print "WELCOMED", then wait (silent) for the daemon to end
 *       the connection: prints each ERROR it sends and "CLOSED"; exit 0
 *       when it closed within N seconds, 1 when it did not.
 *   kvd_hostile [-s SOCK] stream PID N PROMPT
 *       Not hostile: the measuring side of the fairness test. HELLO, then
 *       one raw greedy GENERATE of N tokens, read to its end; prints
 *       "WALL_US CPU_TICKS": the time from sending GENERATE to reading
 *       DONE, and the CPU time (user + system, /proc/PID/stat) process PID
 *       (kvd) used meanwhile. Exit 1 unless exactly N tokens came.
 *   kvd_hostile [-s SOCK] stream-gap PID N PROMPT
 *       stream, printing "WALL_US CPU_TICKS MAX_GAP_US": also the longest
 *       wait between two TOKEN records after the first one.
 *   kvd_hostile [-s SOCK] hello-twice
 *       HELLO, WELCOME, HELLO again: prints the ERROR it gets back and
 *       "CLOSED" when the daemon then ends the connection (exit 0), exit 1
 *       when the connection stays usable (a PING is answered).
 *
 * Exit status 0 unless the setup itself failed (1).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ipc.h"

static const char *sock_path;
static volatile sig_atomic_t stop_requested; /* SIGTERM: finish the mode and report */
static unsigned run_seconds = 30;
static _Alignas(8) uint8_t rbuf[IPC_MAX_FRAME_BYTES];

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int print_error_frame(const struct ipc_frame *f)
{
	struct ipc_error_msg em;
	if (ipc_decode_error(f, &em) < 0) {
		printf("ERROR (undecodable)\n");
		return -1;
	}
	printf("ERROR code=%d request=%" PRIu64 " %.*s\n", em.code, f->hdr.request_id, (int)em.msg_bytes, em.msg);
	return em.code;
}

static int send_hello(int fd)
{
	struct ipc_hello h = { .client_version = 0x000100, .capabilities = IPC_CAP_RING_PROMPT };
	snprintf(h.client_name, sizeof(h.client_name), "kvd_hostile");
	return ipc_send(fd, IPC_MSG_HELLO, 0, 0, &h, sizeof(h), NULL, 0);
}

/* Wait up to ms for a frame; 0 with *f, -ETIMEDOUT, or -errno. */
static int recv_timeout(int fd, struct ipc_frame *f, int ms)
{
	struct pollfd p = { fd, POLLIN, 0 };
	int r = poll(&p, 1, ms);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	memset(f, 0, sizeof(*f));
	return ipc_recv(fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, f);
}

/* ---- nonblock ------------------------------------------------------------------ */

struct racer {
	int fd;
	atomic_bool stop;
};

/* Write to the fd (so the daemon is woken) and read it back at once, so
 * that the daemon's own read, if it shares the description, finds nothing
 * and blocks. Our fd is blocking now: a read may wait until the daemon or
 * we write again, which is the point. */
static void *race_reads(void *arg)
{
	struct racer *rc = arg;
	uint64_t v = 1;
	int type = 0;
	socklen_t tl = sizeof(type);
	bool is_sock = getsockopt(rc->fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0;

	while (!atomic_load(&rc->stop)) {
		if (is_sock)
			(void)!send(rc->fd, &v, sizeof(v), MSG_DONTWAIT);
		else
			(void)!write(rc->fd, &v, sizeof(v));
		struct pollfd p = { rc->fd, POLLIN, 0 };
		if (poll(&p, 1, 1) > 0)
			(void)!read(rc->fd, &v, sizeof(v));
		v = 1;
	}
	return NULL;
}

/* Make the daemon's next write to fd block if it shares the description:
 * an eventfd's counter to its maximum, a socket's queue to the brim. */
static void fill(int fd)
{
	int type = 0;
	socklen_t tl = sizeof(type);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0) {
		uint64_t v = 1;
		for (int i = 0; i < 1 << 20; i++)
			if (send(fd, &v, sizeof(v), MSG_DONTWAIT) < 0)
				break;
		return;
	}
	struct pollfd p = { fd, POLLOUT, 0 };
	if (poll(&p, 1, 0) > 0) {
		uint64_t v = UINT64_MAX - 1; /* the largest value an eventfd holds */
		(void)!write(fd, &v, sizeof(v));
	}
}

static int mode_nonblock(void)
{
	struct ipc_frame f;
	struct ipc_welcome w;
	struct ipc_chan *chan = NULL;
	int fd, r;

	r = ipc_connect(sock_path, &fd);
	if (r < 0 || send_hello(fd) < 0) {
		fprintf(stderr, "connect/HELLO failed\n");
		return 1;
	}
	r = recv_timeout(fd, &f, 10000);
	if (r < 0 || f.hdr.type != IPC_MSG_WELCOME || ipc_decode_welcome(&f, &w) < 0) {
		fprintf(stderr, "no WELCOME (%d)\n", r);
		return 1;
	}
	unsigned n_fds = f.n_fds;
	int fds[IPC_MAX_FDS];
	memcpy(fds, f.fds, sizeof(fds));
	/* A channel handle on the same fds (duplicated, so that attaching,
	 * which may set O_NONBLOCK on its copies, does not matter). */
	int dup_fds[IPC_MAX_FDS];
	for (unsigned i = 0; i < n_fds; i++)
		dup_fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
#if IPC_WELCOME_N_FDS == 2
	r = ipc_chan_attach(dup_fds[0], dup_fds[1], &chan);
#else
	r = ipc_chan_attach(dup_fds[0], dup_fds[1], dup_fds[2], &chan);
#endif
	if (r < 0) {
		fprintf(stderr, "attach: %s\n", strerror(-r));
		return 1;
	}
	/* Every fd we hold: blocking from now on. */
	for (unsigned i = 0; i < n_fds; i++) {
		int fl = fcntl(fds[i], F_GETFL);
		if (fl >= 0)
			fcntl(fds[i], F_SETFL, fl & ~O_NONBLOCK);
	}
	/* Fill what the daemon writes, race what it reads. With one wake-up
	 * fd for both directions, it gets both treatments. */
	static struct racer racers[IPC_MAX_FDS];
	pthread_t th[IPC_MAX_FDS];
	unsigned n_th = 0;
	for (unsigned i = 1; i < n_fds; i++) {
		fill(fds[i]);
		racers[i].fd = fds[i];
		if (pthread_create(&th[n_th], NULL, race_reads, &racers[i]) == 0)
			n_th++;
	}
	/* Announce sleep on the token ring, then ask for a long stream we
	 * never read: every record the daemon pushes wants to wake us. */
	ipc_chan_prepare_wait(chan, IPC_WAIT_RX, 0);
	static _Alignas(8) uint8_t gb[IPC_MAX_FRAME_BYTES];
	struct ipc_generate_msg m = { 0 };
	m.g.gen_flags = IPC_GEN_RAW;
	m.g.max_tokens = w.n_ctx > 64 ? w.n_ctx - 32 : 16;
	m.g.top_p = 1.0f;
	m.g.repeat_penalty = 1.0f;
	m.prompt = "hostile";
	m.g.prompt_bytes = 7;
	ssize_t n = ipc_encode_generate(gb, sizeof(gb), 1, &m);
	if (n < 0 || send(fd, gb, (size_t)n, MSG_NOSIGNAL) != n) {
		fprintf(stderr, "GENERATE: %s\n", n < 0 ? strerror((int)-n) : strerror(errno));
		return 1;
	}
	printf("ATTACKING fds=%u\n", n_fds);
	fflush(stdout);
	uint64_t end = now_ms() + run_seconds * 1000ull;
	while (now_ms() < end) {
		/* keep the sleep flag up and the counters full */
		ipc_chan_prepare_wait(chan, IPC_WAIT_RX, 0);
		for (unsigned i = 1; i < n_fds; i++)
			fill(fds[i]);
		usleep(2000);
	}
	for (unsigned i = 1; i < n_fds; i++)
		atomic_store(&racers[i].stop, true);
	/* the racers may sit in a blocking read: do not join, just leave */
	_exit(0);
}

/* ---- hold ------------------------------------------------------------------------ */

static int mode_hold(unsigned count, bool hello)
{
	int *fds = calloc(count, sizeof(int));
	unsigned n = 0, held = 0, refused = 0;
	struct ipc_frame f;

	if (!fds)
		return 1;
	for (unsigned i = 0; i < count; i++) {
		int fd;
		if (ipc_connect(sock_path, &fd) < 0 || (hello && send_hello(fd) < 0)) {
			refused++;
			continue;
		}
		if (hello) {
			/* WELCOME or an ERROR always comes */
			int r = recv_timeout(fd, &f, 10000);
			if (r == 0 && f.hdr.type == IPC_MSG_WELCOME) {
				ipc_frame_close_fds(&f);
				fds[held++] = fd;
				continue;
			}
			if (r == 0 && f.hdr.type == IPC_MSG_ERROR && refused == 0)
				print_error_frame(&f);
			if (r == 0)
				ipc_frame_close_fds(&f);
			close(fd);
			refused++;
			continue;
		}
		fds[n++] = fd;
	}
	if (!hello) {
		/* A refused connection gets its ERROR at once; give a loaded
		 * machine a second, then sort them out. */
		usleep(1000000);
		for (unsigned i = 0; i < n; i++) {
			struct pollfd p = { fds[i], POLLIN, 0 };
			if (poll(&p, 1, 0) == 0) {
				fds[held++] = fds[i];
				continue;
			}
			if (recv_timeout(fds[i], &f, 0) == 0) {
				if (f.hdr.type == IPC_MSG_ERROR && refused == 0)
					print_error_frame(&f);
				ipc_frame_close_fds(&f);
			}
			close(fds[i]);
			refused++;
		}
	}
	printf("HELD %u refused %u\n", held, refused);
	fflush(stdout);
	uint64_t end = now_ms() + run_seconds * 1000ull;
	while (now_ms() < end)
		usleep(50000);
	unsigned closed = 0;
	for (unsigned i = 0; i < held; i++) {
		struct pollfd p = { fds[i], POLLIN | POLLRDHUP, 0 };
		if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP)))
			closed++;
		close(fds[i]);
	}
	printf("CLOSED_BY_DAEMON %u\n", closed);
	free(fds);
	return 0;
}

static int mode_upload_hang(void)
{
	struct ipc_frame f;
	int fd, r;
	static _Alignas(8) uint8_t gb[IPC_MAX_FRAME_BYTES];

	r = ipc_connect(sock_path, &fd);
	if (r < 0 || send_hello(fd) < 0)
		return 1;
	r = recv_timeout(fd, &f, 10000);
	if (r < 0 || f.hdr.type != IPC_MSG_WELCOME) {
		fprintf(stderr, "no WELCOME\n");
		return 1;
	}
	ipc_frame_close_fds(&f);
	struct ipc_generate_msg m = { 0 };
	m.g.gen_flags = IPC_GEN_RAW | IPC_GEN_PROMPT_IN_RING;
	m.g.max_tokens = 8;
	m.g.top_p = 1.0f;
	m.g.repeat_penalty = 1.0f;
	m.g.prompt_bytes = 100;
	ssize_t n = ipc_encode_generate(gb, sizeof(gb), 77, &m);
	if (n < 0 || send(fd, gb, (size_t)n, MSG_NOSIGNAL) != n)
		return 1;
	printf("UPLOADING\n");
	fflush(stdout);
	usleep(run_seconds * 1000000u);
	struct pollfd p = { fd, POLLIN | POLLRDHUP, 0 };
	bool closed = poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP));
	printf("%s\n", closed ? "CLOSED" : "OPEN");
	close(fd);
	return 0;
}

/* ---- flood ------------------------------------------------------------------------ */

static int mode_flood(void)
{
	struct ipc_frame f;
	int fd, r;
	static char text[IPC_MAX_INLINE_TEXT_BYTES];
	uint64_t replies = 0, sent = 0, rid = 1;

	r = ipc_connect(sock_path, &fd);
	if (r < 0 || send_hello(fd) < 0) {
		fprintf(stderr, "connect/HELLO failed\n");
		return 1;
	}
	r = recv_timeout(fd, &f, 10000);
	if (r < 0 || f.hdr.type != IPC_MSG_WELCOME) {
		fprintf(stderr, "no WELCOME\n");
		return 1;
	}
	ipc_frame_close_fds(&f);
	/* Text that costs the tokenizer real work per byte. */
	for (size_t i = 0; i < sizeof(text); i++)
		text[i] = "the quick brown fox jumps over the lazy dog 0123456789 "[i % 55];
	struct ipc_tokenize t = { .tok_flags = IPC_TOK_COUNT_ONLY, .text_bytes = sizeof(text) };
	struct iovec v[2] = { { &t, sizeof(t) }, { text, sizeof(text) } };
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	printf("FLOODING\n");
	fflush(stdout);
	uint64_t end = now_ms() + run_seconds * 1000ull;
	while (now_ms() < end && !stop_requested) {
		/* keep the daemon's queue full, but read replies so that it
		 * never has a reason to drop us */
		while (sent - replies < 256 && ipc_sendv(fd, IPC_MSG_TOKENIZE, 0, rid, v, 2, NULL, 0) == 0) {
			sent++;
			rid++;
		}
		struct pollfd p = { fd, POLLIN, 0 };
		if (poll(&p, 1, 5) <= 0)
			continue;
		while (ipc_recv(fd, rbuf, sizeof(rbuf), IPC_FROM_SERVER, &f) == 0) {
			if (f.hdr.type == IPC_MSG_TOKENIZE_REPLY)
				replies++;
			ipc_frame_close_fds(&f);
		}
	}
	printf("REPLIES %" PRIu64 "\n", replies);
	fflush(stdout);
	close(fd);
	return 0;
}

/* ---- watch ------------------------------------------------------------------------ */

static int mode_watch(void)
{
	struct ipc_frame f;
	int fd, r;

	r = ipc_connect(sock_path, &fd);
	if (r < 0 || send_hello(fd) < 0)
		return 1;
	r = recv_timeout(fd, &f, 10000);
	if (r < 0 || f.hdr.type != IPC_MSG_WELCOME) {
		if (r == 0 && f.hdr.type == IPC_MSG_ERROR)
			print_error_frame(&f);
		fprintf(stderr, "no WELCOME\n");
		return 1;
	}
	ipc_frame_close_fds(&f);
	printf("WELCOMED\n");
	fflush(stdout);
	uint64_t end = now_ms() + run_seconds * 1000ull;
	for (;;) {
		uint64_t t = now_ms();
		if (t >= end) {
			printf("still open after %u s\n", run_seconds);
			return 1;
		}
		r = recv_timeout(fd, &f, (int)(end - t));
		if (r == -ECONNRESET) {
			printf("CLOSED\n");
			return 0;
		}
		if (r == 0 && f.hdr.type == IPC_MSG_ERROR)
			print_error_frame(&f);
		if (r == 0)
			ipc_frame_close_fds(&f);
		fflush(stdout);
	}
}

/* ---- stream ------------------------------------------------------------------------ */

/* utime + stime of a process, in clock ticks; -1 when unreadable. */
static long long cpu_ticks(const char *pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%s/stat", pid);
	FILE *fp = fopen(path, "r");
	if (!fp)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	buf[n] = 0;
	char *p = strrchr(buf, ')'); /* after the command name */
	unsigned long long ut, st;
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	return (long long)(ut + st);
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int mode_stream(const char *pid, uint32_t n_tokens, const char *prompt, bool gaps)
{
	uint64_t t_last = 0, max_gap = 0;
	struct ipc_frame f;
	struct ipc_welcome w;
	struct ipc_chan *chan;
	int fd, r;
	static _Alignas(8) uint8_t gb[IPC_MAX_FRAME_BYTES];

	r = ipc_connect(sock_path, &fd);
	if (r < 0 || send_hello(fd) < 0)
		return 1;
	r = recv_timeout(fd, &f, 10000);
	if (r < 0 || f.hdr.type != IPC_MSG_WELCOME || ipc_decode_welcome(&f, &w) < 0)
		return 1;
	if (ipc_chan_attach(f.fds[IPC_WELCOME_FD_MEMFD], f.fds[IPC_WELCOME_FD_WAKE], &chan) < 0)
		return 1;
	struct ipc_generate_msg m = { 0 };
	m.g.gen_flags = IPC_GEN_RAW;
	m.g.max_tokens = n_tokens;
	m.g.top_p = 1.0f;
	m.g.repeat_penalty = 1.0f;
	m.prompt = prompt;
	m.g.prompt_bytes = (uint32_t)strlen(prompt);
	ssize_t len = ipc_encode_generate(gb, sizeof(gb), 1, &m);
	if (len < 0)
		return 1;
	long long c0 = cpu_ticks(pid);
	uint64_t t0 = now_us();
	if (send(fd, gb, (size_t)len, MSG_NOSIGNAL) != len)
		return 1;
	for (;;) {
		r = ipc_chan_recv(chan, rbuf, sizeof(rbuf), &f);
		if (r == 0) {
			ipc_chan_wake_peer(chan);
			if (f.hdr.type == IPC_MSG_TOKEN) {
				uint64_t t = now_us();
				if (t_last && t - t_last > max_gap)
					max_gap = t - t_last;
				t_last = t;
				continue;
			}
			if (f.hdr.type != IPC_MSG_DONE)
				return 1;
			struct ipc_done d;
			if (ipc_decode_done(&f, &d) < 0)
				return 1;
			long long c1 = cpu_ticks(pid);
			uint64_t t1 = now_us();
			if (d.generated_tokens != n_tokens || c0 < 0 || c1 < 0) {
				fprintf(stderr, "generated %u of %u tokens\n", d.generated_tokens, n_tokens);
				return 1;
			}
			if (gaps)
				printf("%" PRIu64 " %lld %" PRIu64 "\n", t1 - t0, c1 - c0, max_gap);
			else
				printf("%" PRIu64 " %lld\n", t1 - t0, c1 - c0);
			return 0;
		}
		if (r != -EAGAIN)
			return 1;
		struct pollfd p[2] = { { fd, POLLIN, 0 }, { ipc_chan_wait_fd(chan), POLLIN, 0 } };
		r = ipc_chan_prepare_wait(chan, IPC_WAIT_RX, 0);
		if (r > 0)
			continue;
		if (r < 0 || poll(p, 2, 30000) <= 0 || (p[0].revents & (POLLIN | POLLHUP)))
			return 1; /* a socket frame here is an ERROR: fail */
		ipc_chan_ack(chan);
	}
}

/* ---- hello-twice ------------------------------------------------------------------ */

static int mode_hello_twice(void)
{
	struct ipc_frame f;
	int fd, r;

	r = ipc_connect(sock_path, &fd);
	if (r < 0 || send_hello(fd) < 0)
		return 1;
	r = recv_timeout(fd, &f, 10000);
	if (r < 0 || f.hdr.type != IPC_MSG_WELCOME) {
		fprintf(stderr, "no WELCOME\n");
		return 1;
	}
	ipc_frame_close_fds(&f);
	if (send_hello(fd) < 0)
		return 1;
	struct ipc_ping ping = { .nonce = 42 };
	(void)ipc_send(fd, IPC_MSG_PING, 0, 7, &ping, sizeof(ping), NULL, 0); /* may fail: closed already */
	bool got_error = false;
	for (;;) {
		r = recv_timeout(fd, &f, 3000);
		if (r == -ECONNRESET) {
			printf("CLOSED\n");
			return got_error ? 0 : 1;
		}
		if (r < 0) {
			printf("still open (%s)\n", strerror(-r));
			return 1;
		}
		if (f.hdr.type == IPC_MSG_ERROR) {
			got_error = print_error_frame(&f) != 0 && f.hdr.request_id == 0;
		} else if (f.hdr.type == IPC_MSG_PONG) {
			printf("PONG: the connection is still served\n");
			return 1;
		}
		ipc_frame_close_fds(&f);
	}
}

static void on_term(int sig)
{
	(void)sig;
	stop_requested = 1;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "seconds", required_argument, NULL, 't' },
		{ "hello", no_argument, NULL, 'H' },
		{ 0 },
	};
	bool hello = false;
	int o;

	sock_path = getenv("KVD_SOCKET");
	struct sigaction sa = { .sa_handler = on_term };
	sigaction(SIGTERM, &sa, NULL);
	while ((o = getopt_long(argc, argv, "+s:t:H", lo, NULL)) != -1) {
		switch (o) {
		case 's': sock_path = optarg; break;
		case 't': run_seconds = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'H': hello = true; break;
		default: return 1;
		}
	}
	if (!sock_path || optind >= argc) {
		fprintf(stderr, "usage: kvd_hostile [-s SOCK] [--seconds N] nonblock|hold N [--hello]|flood|hello-twice\n");
		return 1;
	}
	const char *mode = argv[optind];
	if (!strcmp(mode, "nonblock"))
		return mode_nonblock();
	if (!strcmp(mode, "hold") && optind + 1 < argc) {
		for (int i = optind + 2; i < argc; i++)
			if (!strcmp(argv[i], "--hello"))
				hello = true;
		return mode_hold((unsigned)strtoul(argv[optind + 1], NULL, 10), hello);
	}
	if (!strcmp(mode, "flood"))
		return mode_flood();
	if (!strcmp(mode, "stream") && optind + 3 < argc)
		return mode_stream(argv[optind + 1], (uint32_t)strtoul(argv[optind + 2], NULL, 10), argv[optind + 3], false);
	if (!strcmp(mode, "stream-gap") && optind + 3 < argc)
		return mode_stream(argv[optind + 1], (uint32_t)strtoul(argv[optind + 2], NULL, 10), argv[optind + 3], true);
	if (!strcmp(mode, "upload-hang"))
		return mode_upload_hang();
	if (!strcmp(mode, "watch"))
		return mode_watch();
	if (!strcmp(mode, "hello-twice"))
		return mode_hello_twice();
	fprintf(stderr, "unknown mode %s\n", mode);
	return 1;
}
