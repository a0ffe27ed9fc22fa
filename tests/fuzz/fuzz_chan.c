/*
 * tests/fuzz/fuzz_chan.c — libFuzzer target for the client's side of the
 * shared-memory channel (ipc/chan.c): ipc_chan_attach() on a memfd whose
 * size and contents the server chose, then the stream the client reads
 * from it (ipc_chan_recv and the TOKEN / DONE / ERROR decoders) and the
 * uploads it writes into it.
 *
 * Input: a u32 file size (clamped to MAX_FILE), then patches applied to a
 * zeroed file of that size: [u32 offset][u16 length][bytes], in order.
 * The file is sealed as the server seals it, and attached with one end
 * of a fresh AF_UNIX datagram socket pair as the wake-up socket (the other
 * end plays the server's, so wake-ups the client sends land somewhere).
 * The seed corpus holds real channels (KVD_FUZZ_WRITE_SEEDS=DIR writes
 * them: ipc_chan_create() plus server records, as patches).
 *
 * Promises checked: attach either fails with -EBADMSG/-EPROTO (and leaves
 * the fds to the caller) or gives a channel whose reads and writes stay in
 * the mapping; every frame ipc_chan_recv returns passed ipc_frame_check as
 * a ring message from the server; decoders' pointers stay in the record.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>

#include "ipc.h"
#include "fuzz_util.h"

#define MAX_FILE (4096u + 2u * 65536u)
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static uint8_t rxbuf[IPC_MAX_FRAME_BYTES] __attribute__((aligned(64)));

static int read_le(const uint8_t **p, const uint8_t *end, unsigned n, uint32_t *ret)
{
	if ((size_t)(end - *p) < n)
		return -1;
	uint32_t v = 0;
	for (unsigned i = 0; i < n; i++)
		v |= (uint32_t)(*p)[i] << (8 * i);
	*p += n;
	*ret = v;
	return 0;
}

static void client_reads(struct ipc_chan *c)
{
	for (int k = 0; k < 64; k++) {
		struct ipc_frame f;
		int r = ipc_chan_recv(c, rxbuf, sizeof(rxbuf), &f);
		if (r == -EAGAIN || r == -EPROTO)
			return;
		if (r < 0)
			continue; /* a bad record is consumed */
		CHECK(f.hdr.length <= IPC_MAX_PAYLOAD_BYTES && f.payload == rxbuf + IPC_HDR_BYTES);
		switch (f.hdr.type) {
		case IPC_MSG_TOKEN: {
			struct ipc_token_msg m;
			if (ipc_decode_token(&f, &m) == 0)
				CHECK((const uint8_t *)m.text + m.t.text_bytes <= f.payload + f.hdr.length);
			break;
		}
		case IPC_MSG_DONE: {
			struct ipc_done d;
			(void)ipc_decode_done(&f, &d);
			break;
		}
		case IPC_MSG_ERROR: {
			struct ipc_error_msg m;
			if (ipc_decode_error(&f, &m) == 0)
				CHECK((const uint8_t *)m.msg + m.msg_bytes <= f.payload + f.hdr.length);
			break;
		}
		default:
			CHECK(0); /* nothing else may come from the server by ring */
		}
	}
}

static void client_writes(struct ipc_chan *c)
{
	static const char text[] = "an upload through the ring";
	struct ipc_prompt_data d = { 0, sizeof(text) - 1 };
	for (int k = 0; k < 8; k++) {
		int room = ipc_chan_tx_room(c, sizeof(d) + d.bytes);
		int r = ipc_chan_send(c, IPC_MSG_PROMPT_DATA, 0, 1, &d, sizeof(d), text, d.bytes);
		CHECK(r == 0 || r == -EAGAIN || r == -EPROTO || r == -EMSGSIZE);
		if (room == 1)
			CHECK(r == 0);
		if (r < 0)
			break;
		d.offset += d.bytes;
	}
	(void)ipc_chan_prepare_wait(c, IPC_WAIT_RX | IPC_WAIT_TX, 64);
	(void)ipc_chan_ack(c);
	(void)ipc_chan_wake_peer(c);
}

static void write_seeds(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = getenv("KVD_FUZZ_WRITE_SEEDS");
	if (dir && *dir) {
		write_seeds(dir);
		exit(0);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *end = data + size;
	uint32_t file_bytes;
	char path[64];

	if (read_le(&p, end, 4, &file_bytes) < 0)
		return 0;
	if (file_bytes > MAX_FILE)
		file_bytes = MAX_FILE;
	int memfd = fuzz_memfd("", 0, path, sizeof(path));
	if (memfd < 0)
		return 0;
	int sv[2] = { -1, -1 };
	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0 ||
	    ftruncate(memfd, file_bytes) < 0)
		goto out;
	for (;;) {
		uint32_t off, len;
		if (read_le(&p, end, 4, &off) < 0 || read_le(&p, end, 2, &len) < 0)
			break;
		if ((size_t)(end - p) < len)
			len = (uint32_t)(end - p);
		if ((uint64_t)off + len <= file_bytes && len && pwrite(memfd, p, len, off) != (ssize_t)len)
			goto out;
		p += len;
	}
	if (fcntl(memfd, F_ADD_SEALS, SEALS) < 0)
		goto out;

	struct ipc_chan *c = NULL;
	int r = ipc_chan_attach(memfd, sv[0], &c);
	if (r < 0) {
		CHECK(r == -EBADMSG || r == -EPROTO);
		goto out;
	}
	CHECK(ipc_chan_shm_bytes(c) == file_bytes);
	client_reads(c);
	client_writes(c);
	client_reads(c);
	ipc_chan_free(c); /* closes memfd and sv[0] */
	close(sv[1]);
	return 0;
out:
	close(memfd);
	for (int i = 0; i < 2; i++)
		if (sv[i] >= 0)
			close(sv[i]);
	return 0;
}

/* ---- seeds: real channels with server records, as patch lists ---------- */

static void put(FILE *fp, uint32_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		fputc((int)((v >> (8 * i)) & 0xff), fp);
}

static void dump_seed(const char *dir, const char *name, int memfd, uint32_t bytes)
{
	char path[4096];
	uint8_t *m = malloc(bytes);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *fp = fopen(path, "wb");
	if (!m || !fp || pread(memfd, m, bytes, 0) != (ssize_t)bytes)
		exit(1);
	put(fp, bytes, 4);
	for (uint32_t off = 0; off < bytes;) { /* non-zero runs of <= 65535 bytes */
		if (!m[off]) {
			off++;
			continue;
		}
		uint32_t len = 0;
		while (off + len < bytes && len < 65535 && (m[off + len] || (off + len + 1 < bytes && m[off + len + 1])))
			len++;
		put(fp, off, 4);
		put(fp, len, 2);
		fwrite(m + off, 1, len, fp);
		off += len;
	}
	fclose(fp);
	free(m);
}

static void write_seeds(const char *dir)
{
	struct ipc_chan_config cc = { .c2s_bytes = IPC_RING_MIN_BYTES, .s2c_bytes = IPC_RING_MIN_BYTES };
	struct ipc_chan *srv;
	int fds[IPC_WELCOME_N_FDS];

	if (ipc_chan_create(&cc, &srv) < 0)
		exit(1);
	ipc_chan_fds(srv, fds);
	dump_seed(dir, "empty", fds[IPC_WELCOME_FD_MEMFD], ipc_chan_shm_bytes(srv));
	int32_t ids[3] = { 17, 42, 99 };
	ipc_chan_send_token(srv, 1, 0, 3, ids, 3, "Hello", 5);
	ipc_chan_send_token(srv, 1, 3, 1, NULL, 0, " world", 6);
	struct ipc_done d = { .finish_reason = IPC_FINISH_LENGTH, .prompt_tokens = 5, .generated_tokens = 4 };
	ipc_chan_send(srv, IPC_MSG_DONE, 0, 1, &d, sizeof(d), NULL, 0);
	ipc_chan_send_error(srv, 2, IPC_ERR_SHUTDOWN, "kvd is shutting down");
	dump_seed(dir, "stream", fds[IPC_WELCOME_FD_MEMFD], ipc_chan_shm_bytes(srv));
	/* wrap around the end of the ring */
	char big[3000];
	memset(big, 'x', sizeof(big));
	struct ipc_chan *cli;
	int m2 = dup(fds[IPC_WELCOME_FD_MEMFD]), w2 = dup(fds[IPC_WELCOME_FD_WAKE]);
	if (ipc_chan_attach(m2, w2, &cli) < 0)
		exit(1);
	for (int k = 0; k < 7; k++) {
		ipc_chan_send_token(srv, 3, (uint32_t)k, 1, NULL, 0, big, sizeof(big));
		struct ipc_frame f;
		ipc_chan_recv(cli, rxbuf, sizeof(rxbuf), &f);
	}
	dump_seed(dir, "wrapped", fds[IPC_WELCOME_FD_MEMFD], ipc_chan_shm_bytes(srv));
	ipc_chan_free(cli);
	ipc_chan_free(srv);
}
