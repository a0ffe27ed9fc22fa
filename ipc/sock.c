/*
 * ipc/sock.c — kvd's socket transport: SOCK_SEQPACKET Unix sockets (one
 * datagram = one frame, message boundaries kept, connection-oriented so a
 * vanished peer is noticed), fd passing with SCM_RIGHTS, and the peer's
 * credentials. Paths starting with '@' name the abstract namespace, which
 * tests use to avoid files.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ipc.h"

#pragma GCC visibility push(hidden)

/* SCM_RIGHTS descriptors looked at in one receive: more than any frame
 * carries, so that "too many" is seen as such rather than as truncation. */
#define RECV_FDS_MAX 8

static int make_addr(const char *path, struct sockaddr_un *sa, socklen_t *ret_len)
{
	size_t len = strlen(path);

	if (len == 0)
		return -EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (len >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	memcpy(sa->sun_path, path, len);
	if (path[0] == '@') {
		sa->sun_path[0] = '\0'; /* abstract: no NUL terminator counted */
		*ret_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	} else {
		*ret_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
	}
	return 0;
}

/* Is somebody accepting on this path? 1 yes, 0 no (stale), <0 error. */
static int socket_is_live(const struct sockaddr_un *sa, socklen_t len)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int r = connect(fd, (const struct sockaddr *)sa, len);
	int e = errno;
	close(fd);
	if (r == 0)
		return 1;
	if (e == ECONNREFUSED)
		return 0;
	return -e;
}

int ipc_listen(const char *path, mode_t mode, int backlog, int *ret_fd)
{
	struct sockaddr_un sa;
	socklen_t len;
	int fd, r;

	r = make_addr(path, &sa, &len);
	if (r < 0)
		return r;
	if (path[0] != '@') {
		struct stat st;
		if (lstat(path, &st) == 0) {
			if (!S_ISSOCK(st.st_mode))
				return -EEXIST; /* never remove something that is not ours */
			r = socket_is_live(&sa, len);
			if (r > 0)
				return -EADDRINUSE;
			if (r < 0)
				return r;
			if (unlink(path) < 0 && errno != ENOENT)
				return -errno;
		}
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, len) < 0)
		goto fail;
	if (mode && path[0] != '@' && chmod(path, mode) < 0)
		goto fail_unlink;
	if (listen(fd, backlog > 0 ? backlog : SOMAXCONN) < 0)
		goto fail_unlink;
	*ret_fd = fd;
	return 0;

fail_unlink:
	r = -errno;
	if (path[0] != '@')
		unlink(path);
	close(fd);
	return r;
fail:
	r = -errno;
	close(fd);
	return r;
}

int ipc_accept(int listen_fd, int *ret_fd)
{
	for (;;) {
		int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			*ret_fd = fd;
			return 0;
		}
		if (errno == EINTR)
			continue;
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	}
}

int ipc_connect(const char *path, int *ret_fd)
{
	struct sockaddr_un sa;
	socklen_t len;
	int r = make_addr(path, &sa, &len);
	if (r < 0)
		return r;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	while (connect(fd, (struct sockaddr *)&sa, len) < 0) {
		if (errno == EINTR)
			continue;
		r = -errno;
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

int ipc_peer_cred(int fd, struct ipc_peer_cred *ret)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	if (len != sizeof(uc))
		return -EIO;
	ret->pid = uc.pid;
	ret->uid = uc.uid;
	ret->gid = uc.gid;
	return 0;
}

int ipc_peer_groups(int fd, gid_t *groups, size_t cap, size_t *ret_n)
{
	socklen_t len = (socklen_t)(cap * sizeof(gid_t));

	if (cap > (size_t)INT32_MAX / sizeof(gid_t))
		return -EINVAL;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) {
		if (errno == ERANGE)
			*ret_n = len / sizeof(gid_t);
		return -errno;
	}
	*ret_n = len / sizeof(gid_t);
	return 0;
}

/* ---- send ------------------------------------------------------------------- */

#define SEND_IOV_MAX 32

static int sendv_impl(int fd, int msg_flags, uint16_t type, uint32_t flags, uint64_t request_id,
		      const struct iovec *iov, int n_iov, const int *fds, unsigned n_fds)
{
	struct iovec v[SEND_IOV_MAX + 1];
	size_t len = 0;

	if (n_iov < 0 || n_iov > SEND_IOV_MAX || n_fds > IPC_MAX_FDS)
		return -EINVAL;
	for (int i = 0; i < n_iov; i++) {
		if (iov[i].iov_len > IPC_MAX_PAYLOAD_BYTES - len)
			return -E2BIG;
		len += iov[i].iov_len;
		v[i + 1] = iov[i];
	}
	struct ipc_hdr h = {
		.magic = IPC_MAGIC,
		.version = IPC_PROTO_VERSION,
		.type = type,
		.length = (uint32_t)len,
		.flags = flags,
		.request_id = request_id,
	};
	v[0] = (struct iovec){ &h, sizeof(h) };

	union {
		char buf[CMSG_SPACE(sizeof(int) * IPC_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = { .msg_iov = v, .msg_iovlen = (size_t)n_iov + 1 };
	if (n_fds) {
		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
	}
	for (;;) {
		ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | msg_flags);
		if (n >= 0)
			return (size_t)n == IPC_HDR_BYTES + len ? 0 : -EIO; /* SEQPACKET: all or nothing */
		if (errno == EINTR)
			continue;
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	}
}

int ipc_sendv(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const struct iovec *iov, int n_iov,
	      const int *fds, unsigned n_fds)
{
	return sendv_impl(fd, 0, type, flags, request_id, iov, n_iov, fds, n_fds);
}

int ipc_sendv_nowait(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const struct iovec *iov,
		     int n_iov, const int *fds, unsigned n_fds)
{
	return sendv_impl(fd, MSG_DONTWAIT, type, flags, request_id, iov, n_iov, fds, n_fds);
}

int ipc_send(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const void *payload, size_t len,
	     const int *fds, unsigned n_fds)
{
	struct iovec v = { (void *)payload, len };
	return sendv_impl(fd, 0, type, flags, request_id, &v, len ? 1 : 0, fds, n_fds);
}

int ipc_send_nowait(int fd, uint16_t type, uint32_t flags, uint64_t request_id, const void *payload, size_t len,
		    const int *fds, unsigned n_fds)
{
	struct iovec v = { (void *)payload, len };
	return sendv_impl(fd, MSG_DONTWAIT, type, flags, request_id, &v, len ? 1 : 0, fds, n_fds);
}

static int send_error_impl(int fd, int msg_flags, uint64_t request_id, int32_t code, const char *msg)
{
	size_t n = msg ? strnlen(msg, IPC_MAX_ERROR_MSG_BYTES) : 0;
	struct ipc_error e = { .code = code, .msg_bytes = (uint32_t)n };
	struct iovec v[2] = { { &e, sizeof(e) }, { (void *)msg, n } };

	if (!ipc_error_code_valid(code))
		return -EINVAL;
	return sendv_impl(fd, msg_flags, IPC_MSG_ERROR, 0, request_id, v, n ? 2 : 1, NULL, 0);
}

int ipc_send_error(int fd, uint64_t request_id, int32_t code, const char *msg)
{
	return send_error_impl(fd, 0, request_id, code, msg);
}

int ipc_send_error_nowait(int fd, uint64_t request_id, int32_t code, const char *msg)
{
	return send_error_impl(fd, MSG_DONTWAIT, request_id, code, msg);
}

/* ---- receive ----------------------------------------------------------------- */

void ipc_frame_close_fds(struct ipc_frame *f)
{
	for (unsigned i = 0; i < f->n_fds; i++)
		if (f->fds[i] >= 0)
			close(f->fds[i]);
	f->n_fds = 0;
}

/* recvmsg() returned 0: an empty datagram, or the end of the connection? */
static int zero_read(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
	if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP)))
		return -ECONNRESET;
	return -EBADMSG;
}

static int recv_impl(int fd, int msg_flags, void *buf, size_t cap, unsigned from, struct ipc_frame *ret)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * RECV_FDS_MAX)];
		struct cmsghdr align;
	} ctl;
	struct iovec v = { buf, IPC_MAX_FRAME_BYTES };
	int fds[RECV_FDS_MAX];
	unsigned n_fds = 0;
	ssize_t n;
	int r;

	ret->n_fds = 0;
	memset(&ret->hdr, 0, sizeof(ret->hdr));
	if (cap < IPC_MAX_FRAME_BYTES || ((uintptr_t)buf & 7))
		return -EINVAL;
	struct msghdr msg = {
		.msg_iov = &v,
		.msg_iovlen = 1,
		.msg_control = ctl.buf,
		.msg_controllen = sizeof(ctl.buf),
	};
	for (;;) {
		n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | msg_flags);
		if (n >= 0)
			break;
		if (errno == EINTR)
			continue;
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	}
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int x;
			memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (n_fds < RECV_FDS_MAX)
				fds[n_fds++] = x;
			else
				close(x);
		}
	}

	if (n == 0 && n_fds == 0)
		r = zero_read(fd);
	else if (msg.msg_flags & MSG_TRUNC) {
		memcpy(&ret->hdr, buf, sizeof(ret->hdr)); /* n == IPC_MAX_FRAME_BYTES here */
		r = -E2BIG;
	}
	else if (msg.msg_flags & MSG_CTRUNC)
		r = -ETOOMANYREFS;
	else
		r = ipc_frame_check(buf, (size_t)n, n_fds, from, IPC_VIA_SOCKET, &ret->hdr);
	if (r < 0) {
		for (unsigned i = 0; i < n_fds; i++)
			close(fds[i]);
		return r;
	}
	ret->payload = (const uint8_t *)buf + IPC_HDR_BYTES;
	for (unsigned i = 0; i < n_fds; i++)
		ret->fds[i] = fds[i];
	ret->n_fds = n_fds;
	return 0;
}

int ipc_recv(int fd, void *buf, size_t cap, unsigned from, struct ipc_frame *ret)
{
	return recv_impl(fd, 0, buf, cap, from, ret);
}

int ipc_recv_nowait(int fd, void *buf, size_t cap, unsigned from, struct ipc_frame *ret)
{
	return recv_impl(fd, MSG_DONTWAIT, buf, cap, from, ret);
}
