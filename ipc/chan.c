/*
 * ipc/chan.c — the private shared-memory channel between kvd and one
 * client: a sealed memfd with two rings (client->server for uploaded text,
 * server->client for the token stream) and a datagram socket pair for
 * wake-ups.
 *
 * Memory layout (offsets in the header, checked by the client):
 *
 *   0      struct shm_hdr (64 bytes)
 *   128    control block of the client->server ring (IPC_RING_CTL_BYTES)
 *   256    control block of the server->client ring
 *   4096   client->server data (c2s_bytes)
 *   ...    server->client data (s2c_bytes)
 *
 * The server creates and seals it (no shrink, no grow, no further seals):
 * a client's mapping can never fault because the server truncated the
 * file, and vice versa. Each side trusts only its own copy of the layout.
 *
 * Wake-ups: an AF_UNIX SOCK_DGRAM socketpair. The server keeps one end and
 * hands the other over in WELCOME, then closes its copy of it. The two ends
 * are distinct open file descriptions, so a client changing the file
 * status flags of its end (O_NONBLOCK) changes nothing for the server's;
 * and every send/recv here passes MSG_DONTWAIT anyway, so neither side can
 * be made to block by the other: a wake-up that finds the peer's queue
 * full is not needed (one is pending there already), and draining stops
 * at an empty queue or after IPC_CHAN_ACK_MAX datagrams. A datagram pair
 * rather than SEQPACKET: a peer's shutdown() of a SOCK_DGRAM end does not
 * propagate, so it cannot leave our end reporting hang-up in a loop. The
 * payload of a wake-up datagram means nothing; it is never read.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc.h"

#pragma GCC visibility push(hidden)

#define SHM_MAGIC      0x4d48534bu /* "KSHM" */
#define SHM_HDR_PAGE   4096u
#define SHM_C2S_CTL    128u
#define SHM_S2C_CTL    256u
#define SHM_SEALS      (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct shm_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t total_bytes;
	uint32_t c2s_ctl_off;
	uint32_t c2s_data_off;
	uint32_t c2s_bytes;
	uint32_t s2c_ctl_off;
	uint32_t s2c_data_off;
	uint32_t s2c_bytes;
	uint32_t reserved[7];
};
static_assert(sizeof(struct shm_hdr) == 64, "shm header size");

struct ipc_chan {
	bool server;
	int memfd;        /* -1 on the server after the hand-over */
	int wake_fd;      /* this side's end of the pair: sleep on it, send on it */
	int peer_wake_fd; /* server only, until the hand-over: the client's end */
	void *map;
	size_t map_bytes;
	struct ipc_ring *tx;
	struct ipc_ring *rx;
};

static uint32_t max_record_for(uint32_t cap)
{
	return cap / 2 < IPC_MAX_FRAME_BYTES ? cap / 2 : IPC_MAX_FRAME_BYTES;
}

static bool ring_size_ok(uint32_t n)
{
	return n >= IPC_RING_MIN_BYTES && n <= IPC_RING_MAX_BYTES && (n & (n - 1)) == 0;
}

struct ipc_chan *ipc_chan_free(struct ipc_chan *c)
{
	if (!c)
		return NULL;
	ipc_ring_free(c->tx);
	ipc_ring_free(c->rx);
	if (c->map)
		munmap(c->map, c->map_bytes);
	if (c->memfd >= 0)
		close(c->memfd);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	if (c->peer_wake_fd >= 0)
		close(c->peer_wake_fd);
	free(c);
	return NULL;
}

static int attach_rings(struct ipc_chan *c, const struct shm_hdr *h)
{
	uint8_t *base = c->map;
	struct ipc_ring *c2s_r, *s2c_r;
	int r;

	r = ipc_ring_attach(base + h->c2s_ctl_off, base + h->c2s_data_off, h->c2s_bytes, max_record_for(h->c2s_bytes),
			    c->server ? IPC_RING_CONSUMER : IPC_RING_PRODUCER, &c2s_r);
	if (r < 0)
		return r;
	r = ipc_ring_attach(base + h->s2c_ctl_off, base + h->s2c_data_off, h->s2c_bytes, max_record_for(h->s2c_bytes),
			    c->server ? IPC_RING_PRODUCER : IPC_RING_CONSUMER, &s2c_r);
	if (r < 0) {
		ipc_ring_free(c2s_r);
		return r;
	}
	c->tx = c->server ? s2c_r : c2s_r;
	c->rx = c->server ? c2s_r : s2c_r;
	return 0;
}

int ipc_chan_create(const struct ipc_chan_config *cfg, struct ipc_chan **ret)
{
	uint32_t c2s = cfg && cfg->c2s_bytes ? cfg->c2s_bytes : IPC_RING_DEFAULT_C2S_BYTES;
	uint32_t s2c = cfg && cfg->s2c_bytes ? cfg->s2c_bytes : IPC_RING_DEFAULT_S2C_BYTES;
	int r;

	if (!ring_size_ok(c2s) || !ring_size_ok(s2c))
		return -EINVAL;
	struct ipc_chan *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->server = true;
	c->memfd = c->wake_fd = c->peer_wake_fd = -1;
	struct shm_hdr h = {
		.magic = SHM_MAGIC,
		.version = IPC_PROTO_VERSION,
		.total_bytes = SHM_HDR_PAGE + c2s + s2c,
		.c2s_ctl_off = SHM_C2S_CTL,
		.c2s_data_off = SHM_HDR_PAGE,
		.c2s_bytes = c2s,
		.s2c_ctl_off = SHM_S2C_CTL,
		.s2c_data_off = SHM_HDR_PAGE + c2s,
		.s2c_bytes = s2c,
	};
	c->map_bytes = h.total_bytes;

	c->memfd = memfd_create("kvd-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (c->memfd < 0)
		goto fail_errno;
	if (ftruncate(c->memfd, (off_t)c->map_bytes) < 0)
		goto fail_errno;
	if (fcntl(c->memfd, F_ADD_SEALS, SHM_SEALS) < 0)
		goto fail_errno;
	c->map = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd, 0);
	if (c->map == MAP_FAILED) {
		c->map = NULL;
		goto fail_errno;
	}
	/* A fresh memfd reads as zeroes; formatting states the intent. */
	memcpy(c->map, &h, sizeof(h));
	ipc_ring_format((uint8_t *)c->map + SHM_C2S_CTL);
	ipc_ring_format((uint8_t *)c->map + SHM_S2C_CTL);
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
		goto fail_errno;
	c->wake_fd = sv[0];
	c->peer_wake_fd = sv[1];
	r = attach_rings(c, &h);
	if (r < 0)
		goto fail;
	*ret = c;
	return 0;

fail_errno:
	r = -errno;
fail:
	ipc_chan_free(c);
	return r;
}

/* Is fd an AF_UNIX datagram socket? (Its flags do not matter: every
 * call on it passes MSG_DONTWAIT.) */
static int check_wake_socket(int fd)
{
	int v = 0;
	socklen_t len = sizeof(v);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) < 0)
		return errno == ENOTSOCK ? -EINVAL : -errno;
	if (v != AF_UNIX)
		return -EINVAL;
	len = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) < 0)
		return -errno;
	return v == SOCK_DGRAM ? 0 : -EINVAL;
}

static bool region_ok(uint32_t off, uint32_t len, uint32_t lo, uint32_t hi, uint32_t align)
{
	return off % align == 0 && off >= lo && off <= hi && len <= hi - off;
}

static bool overlap(uint32_t a, uint32_t alen, uint32_t b, uint32_t blen)
{
	return a < b + blen && b < a + alen;
}

static int check_layout(const struct shm_hdr *h, uint64_t file_bytes)
{
	if (h->magic != SHM_MAGIC || h->version != IPC_PROTO_VERSION)
		return -EBADMSG;
	if (h->total_bytes != file_bytes || file_bytes < SHM_HDR_PAGE)
		return -EBADMSG;
	if (!ring_size_ok(h->c2s_bytes) || !ring_size_ok(h->s2c_bytes))
		return -EBADMSG;
	/* Control blocks in the header page after the header; data areas
	 * after the header page; nothing overlaps. */
	if (!region_ok(h->c2s_ctl_off, IPC_RING_CTL_BYTES, 64, SHM_HDR_PAGE, 64) ||
	    !region_ok(h->s2c_ctl_off, IPC_RING_CTL_BYTES, 64, SHM_HDR_PAGE, 64) ||
	    overlap(h->c2s_ctl_off, IPC_RING_CTL_BYTES, h->s2c_ctl_off, IPC_RING_CTL_BYTES))
		return -EBADMSG;
	if (!region_ok(h->c2s_data_off, h->c2s_bytes, SHM_HDR_PAGE, h->total_bytes, 64) ||
	    !region_ok(h->s2c_data_off, h->s2c_bytes, SHM_HDR_PAGE, h->total_bytes, 64) ||
	    overlap(h->c2s_data_off, h->c2s_bytes, h->s2c_data_off, h->s2c_bytes))
		return -EBADMSG;
	for (size_t i = 0; i < sizeof(h->reserved) / sizeof(h->reserved[0]); i++)
		if (h->reserved[i])
			return -EBADMSG;
	return 0;
}

int ipc_chan_attach(int memfd, int wake_fd, struct ipc_chan **ret)
{
	struct stat st;
	struct shm_hdr h;
	int r;

	int seals = fcntl(memfd, F_GET_SEALS);
	if (seals < 0)
		return errno == EINVAL ? -EINVAL : -errno;
	if ((seals & SHM_SEALS) != SHM_SEALS)
		return -EPERM;
	if (fstat(memfd, &st) < 0)
		return -errno;
	if (st.st_size < (off_t)SHM_HDR_PAGE || (uint64_t)st.st_size > SHM_HDR_PAGE + 2ull * IPC_RING_MAX_BYTES)
		return -EBADMSG;
	r = check_wake_socket(wake_fd);
	if (r < 0)
		return r;

	struct ipc_chan *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->server = false;
	c->memfd = c->wake_fd = c->peer_wake_fd = -1; /* adopted only on success */
	c->map_bytes = (size_t)st.st_size;
	c->map = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (c->map == MAP_FAILED) {
		r = -errno;
		c->map = NULL;
		goto fail;
	}
	memcpy(&h, c->map, sizeof(h)); /* one private copy, validated, then used */
	r = check_layout(&h, (uint64_t)st.st_size);
	if (r < 0)
		goto fail;
	r = attach_rings(c, &h);
	if (r < 0)
		goto fail;
	c->memfd = memfd;
	c->wake_fd = wake_fd;
	*ret = c;
	return 0;

fail:
	ipc_chan_free(c);
	return r;
}

int ipc_chan_fds(const struct ipc_chan *c, int ret_fds[IPC_WELCOME_N_FDS])
{
	if (!c->server || c->memfd < 0 || c->peer_wake_fd < 0)
		return -EBADF;
	ret_fds[IPC_WELCOME_FD_MEMFD] = c->memfd;
	ret_fds[IPC_WELCOME_FD_WAKE] = c->peer_wake_fd;
	return 0;
}

void ipc_chan_handed_over(struct ipc_chan *c)
{
	if (!c->server)
		return;
	if (c->memfd >= 0)
		close(c->memfd); /* the mapping stays */
	if (c->peer_wake_fd >= 0)
		close(c->peer_wake_fd);
	c->memfd = c->peer_wake_fd = -1;
}

uint32_t ipc_chan_shm_bytes(const struct ipc_chan *c)
{
	return (uint32_t)c->map_bytes;
}

int ipc_chan_wait_fd(const struct ipc_chan *c)
{
	return c->wake_fd;
}

uint32_t ipc_chan_tx_max_payload(const struct ipc_chan *c)
{
	return ipc_ring_max_record(c->tx) - IPC_HDR_BYTES;
}

int ipc_chan_tx_room(struct ipc_chan *c, uint32_t tx_payload)
{
	if (tx_payload > ipc_chan_tx_max_payload(c))
		return -EMSGSIZE;
	ssize_t room = ipc_ring_free_bytes(c->tx);
	if (room < 0)
		return (int)room;
	return (size_t)room >= ipc_ring_record_bytes(IPC_HDR_BYTES + tx_payload);
}

int ipc_chan_send(struct ipc_chan *c, uint16_t type, uint32_t flags, uint64_t request_id,
		  const void *p1, size_t n1, const void *p2, size_t n2)
{
	uint32_t max = ipc_chan_tx_max_payload(c);

	if (n1 > max || n2 > max - n1)
		return -EMSGSIZE;
	struct ipc_hdr h = {
		.magic = IPC_MAGIC,
		.version = IPC_PROTO_VERSION,
		.type = type,
		.length = (uint32_t)(n1 + n2),
		.flags = flags,
		.request_id = request_id,
	};
	struct iovec v[3] = { { &h, sizeof(h) }, { (void *)p1, n1 }, { (void *)p2, n2 } };
	return ipc_ring_push(c->tx, v, 3);
}

int ipc_chan_send_token(struct ipc_chan *c, uint64_t request_id, uint32_t index, uint32_t n_tokens,
			const int32_t *ids, uint32_t n_ids, const char *text, uint32_t text_bytes)
{
	struct ipc_token t = { .index = index, .n_tokens = n_tokens, .n_ids = n_ids, .text_bytes = text_bytes };
	struct ipc_hdr h = {
		.magic = IPC_MAGIC,
		.version = IPC_PROTO_VERSION,
		.type = IPC_MSG_TOKEN,
		.length = (uint32_t)(sizeof(t) + 4ull * n_ids + text_bytes),
		.request_id = request_id,
	};
	if (n_tokens == 0 || n_tokens > IPC_MAX_TOKENS_PER_RECORD || (n_ids && n_ids != n_tokens) ||
	    text_bytes > IPC_MAX_TOKEN_TEXT_BYTES)
		return -EINVAL;
	struct iovec v[4] = {
		{ &h, sizeof(h) }, { &t, sizeof(t) }, { (void *)ids, 4u * n_ids }, { (void *)text, text_bytes },
	};
	return ipc_ring_push(c->tx, v, 4);
}

int ipc_chan_send_error(struct ipc_chan *c, uint64_t request_id, int32_t code, const char *msg)
{
	size_t n = msg ? strnlen(msg, IPC_MAX_ERROR_MSG_BYTES) : 0;
	struct ipc_error e = { .code = code, .msg_bytes = (uint32_t)n };

	if (!ipc_error_code_valid(code))
		return -EINVAL;
	return ipc_chan_send(c, IPC_MSG_ERROR, 0, request_id, &e, sizeof(e), msg, n);
}

int ipc_chan_recv(struct ipc_chan *c, void *buf, size_t cap, struct ipc_frame *ret)
{
	if ((uintptr_t)buf & 7)
		return -EINVAL;
	ssize_t n = ipc_ring_pop(c->rx, buf, cap);
	if (n < 0)
		return (int)n;
	struct ipc_hdr h;
	int r = ipc_frame_check(buf, (size_t)n, 0, c->server ? IPC_FROM_CLIENT : IPC_FROM_SERVER, IPC_VIA_RING, &h);
	if (r < 0)
		return r;
	ret->hdr = h;
	ret->payload = (const uint8_t *)buf + IPC_HDR_BYTES;
	ret->n_fds = 0;
	return 0;
}

int ipc_chan_prepare_wait(struct ipc_chan *c, unsigned what, uint32_t tx_payload)
{
	int r;

	if (what & IPC_WAIT_RX) {
		r = ipc_ring_consumer_prepare_sleep(c->rx);
		if (r != 0)
			return r;
	}
	if (what & IPC_WAIT_TX) {
		r = ipc_ring_producer_prepare_sleep(c->tx, IPC_HDR_BYTES + tx_payload);
		if (r != 0) {
			if (what & IPC_WAIT_RX)
				ipc_ring_consumer_end_sleep(c->rx);
			return r;
		}
	}
	return 0;
}

int ipc_chan_ack(struct ipc_chan *c)
{
	uint8_t v[8];

	ipc_ring_consumer_end_sleep(c->rx);
	ipc_ring_producer_end_sleep(c->tx);
	/* Bounded: a peer that sends wake-ups in a loop keeps our end
	 * readable (a spare wake-up next time), never keeps us here. */
	for (unsigned i = 0; i < IPC_CHAN_ACK_MAX;) {
		if (recv(c->wake_fd, v, sizeof(v), MSG_DONTWAIT | MSG_TRUNC) >= 0) {
			i++;
			continue;
		}
		if (errno == EINTR)
			continue;
		return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
	}
	return 0;
}

int ipc_chan_wake_peer(struct ipc_chan *c)
{
	/* Both checks run (no short circuit): each clears its own flag. */
	bool w = ipc_ring_producer_should_wake(c->tx);
	w |= ipc_ring_consumer_should_wake(c->rx);
	if (!w)
		return 0;
	uint8_t one = 1;
	for (;;) {
		if (send(c->wake_fd, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
			return 1;
		if (errno == EINTR)
			continue;
		/* EAGAIN: the peer's queue is full, so wake-ups it has not
		 * received are pending there: it will wake anyway. */
		return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : -errno;
	}
}
