/*
 * client/kvclient.c — libkvclient: a connection to kvd. Connecting (the
 * socket and the HELLO/WELCOME handshake), closing, the per-call timeout,
 * the server's description and the last error message; the checks that
 * kvclient.h's codes are the wire's.
 *
 * The rest of the library, over the struct definitions in kvc_impl.h:
 * kvc_io.c (the token ring, the socket, pump(), uploads and control calls),
 * kvc_generate.c (generation requests and their event streams) and
 * kvc_admin.c (stats, tokenize, sessions, ps, ping).
 *
 * No locks: a client is used by one thread at a time (see kvclient.h);
 * kvc_cancel() touches nothing but the socket fd.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvclient.h"
#include "ipc.h"
#include "kvc_impl.h"

/* Everything defined from here on is internal unless kvclient.h declared
 * it with KVC_EXPORT (an explicit attribute beats the pragma). */
#pragma GCC visibility push(hidden)

static_assert(KVC_ERR_VERSION == IPC_ERR_VERSION && KVC_ERR_CONTEXT == IPC_ERR_CONTEXT &&
		      KVC_ERR_SHUTDOWN == IPC_ERR_SHUTDOWN && KVC_ERR_LIMIT == IPC_ERR_LIMIT &&
		      KVC_ERR_ENGINE == IPC_ERR_ENGINE && KVC_ERR_SESSION == IPC_ERR_SESSION &&
		      KVC_ERR_DENIED == IPC_ERR_DENIED,
	      "kvclient.h error codes are the wire codes");
static_assert((int)KVC_FINISH_EOS == (int)IPC_FINISH_EOS && (int)KVC_FINISH_ERROR == (int)IPC_FINISH_ERROR &&
		      (int)KVC_FINISH_CANCELLED == (int)IPC_FINISH_CANCELLED,
	      "finish reasons are the wire values");
static_assert((int)KVC_REQ_WAITING == (int)IPC_REQ_WAITING && (int)KVC_REQ_UPLOADING == (int)IPC_REQ_UPLOADING,
	      "request states are the wire values");
static_assert(KVC_TOK_ADD_BOS == IPC_TOK_ADD_BOS && KVC_TOK_PARSE_SPECIAL == IPC_TOK_PARSE_SPECIAL,
	      "tokenize flags are the wire flags");
static_assert(KVC_GEN_RAW == IPC_GEN_RAW && KVC_GEN_WANT_IDS == IPC_GEN_WANT_IDS &&
		      KVC_GEN_PARSE_SPECIAL == IPC_GEN_PARSE_SPECIAL,
	      "generate flags");
static_assert(sizeof(((struct kvc_result *)0)->error_message) == IPC_MAX_ERROR_MSG_BYTES + 1, "error message");
static_assert(sizeof(((struct kvc_info *)0)->model_name) == IPC_MODEL_NAME_BYTES, "model name");
static_assert(sizeof(((struct kvc_info *)0)->model_id) == IPC_MODEL_ID_BYTES, "model id");

/* ---- connecting ----------------------------------------------------------------------------- */

unsigned kvc_version(void)
{
	return KVC_VERSION;
}

const char *kvc_version_string(void)
{
	return KVC_VERSION_STRING;
}

static void fill_info(struct kvc_info *i, const struct ipc_welcome *w)
{
	memset(i, 0, sizeof(*i));
	i->server_version = w->server_version;
	memcpy(i->model_name, w->model_name, sizeof(i->model_name));
	memcpy(i->model_id, w->model_id, sizeof(i->model_id)); /* zeros from older daemons */
	_Static_assert(sizeof(i->chat_format) == sizeof(w->chat_format), "chat_format fits");
	memcpy(i->chat_format, w->chat_format, sizeof(i->chat_format)); /* zeros likewise */
	i->n_vocab = w->n_vocab;
	i->n_ctx = w->n_ctx;
	i->block_size = w->block_size;
	i->n_layers = w->n_layers;
	i->n_kv_heads = w->n_kv_heads;
	i->head_dim = w->head_dim;
	i->kv_dtype_bytes = w->kv_dtype_bytes;
	i->max_prompt_bytes = w->max_text_bytes;
	i->max_requests = w->max_requests;
	i->max_tokens = w->max_gen_tokens;
	i->kv_bytes_per_token = w->kv_bytes_per_token;
	i->pool_bytes = w->pool_bytes;
	i->client_id = w->client_id;
	const char *kt = ipc_kv_type_name(w->kv_type);
	if (kt)
		memcpy(i->kv_cache_type, kt, strlen(kt) + 1); /* at most "q8_0" */
}

const char *kvc_kv_type(unsigned i, uint32_t *ret_block_elems, uint32_t *ret_block_bytes)
{
#define KV_TYPE_ROW(v, name, be, bb) { name, be, bb },
	static const struct {
		const char *name;
		uint32_t block_elems, block_bytes;
	} types[] = { IPC_KV_TYPES(KV_TYPE_ROW) };
#undef KV_TYPE_ROW

	if (i >= sizeof(types) / sizeof(types[0]))
		return NULL;
	if (ret_block_elems)
		*ret_block_elems = types[i].block_elems;
	if (ret_block_bytes)
		*ret_block_bytes = types[i].block_bytes;
	return types[i].name;
}

static void client_name(char out[IPC_CLIENT_NAME_BYTES])
{
	const char *s = program_invocation_short_name;
	size_t n = 0;

	memset(out, 0, IPC_CLIENT_NAME_BYTES);
	for (; s && *s && n < IPC_CLIENT_NAME_BYTES - 1; s++)
		out[n++] = (*s >= 0x20 && *s <= 0x7e) ? *s : '?';
}

/* HELLO, then wait for WELCOME (or an ERROR explaining the refusal). */
static int handshake(kvc_client *c)
{
	struct ipc_hello h = { .client_version = KVC_VERSION, .capabilities = IPC_CAP_RING_PROMPT };
	struct iovec v = { &h, sizeof(h) };
	int64_t deadline = deadline_in(KVC_CONNECT_TIMEOUT_MS);
	struct ipc_frame f;
	int r;

	client_name(h.client_name);
	r = send_frame(c, IPC_MSG_HELLO, 0, &v, 1, deadline);
	if (r < 0)
		return c->dead ? c->dead : r;
	for (;;) {
		r = ipc_recv(c->fd, c->sockbuf, IPC_MAX_FRAME_BYTES, IPC_FROM_SERVER, &f);
		if (r == -EAGAIN) {
			if (expired(deadline))
				return -ETIMEDOUT;
			struct pollfd p = { .fd = c->fd, .events = POLLIN };
			if (poll(&p, 1, remaining_ms(deadline)) < 0 && errno != EINTR)
				return -errno;
			continue;
		}
		if (r == -EPROTONOSUPPORT)
			return KVC_ERR_VERSION;
		if (r == -ECONNRESET || r == -EPIPE)
			return -ECONNRESET;
		if (r < 0)
			return -EPROTO;
		break;
	}
	if (f.hdr.type == IPC_MSG_ERROR) {
		struct ipc_error_msg e;
		r = ipc_decode_error(&f, &e) < 0 ? -EPROTO : e.code;
		if (r != -EPROTO)
			set_msg(c->last_msg, e.msg, e.msg_bytes);
		return r;
	}
	if (f.hdr.type != IPC_MSG_WELCOME) {
		ipc_frame_close_fds(&f);
		return -EPROTO;
	}
	struct ipc_welcome w;
	r = ipc_decode_welcome(&f, &w);
	if (r == 0)
		r = ipc_chan_attach(f.fds[IPC_WELCOME_FD_MEMFD], f.fds[IPC_WELCOME_FD_WAKE], &c->ch);
	if (r < 0) {
		ipc_frame_close_fds(&f);
		return -EPROTO;
	}
	f.n_fds = 0; /* the channel owns them now */
	if (ipc_chan_shm_bytes(c->ch) != w.shm_bytes)
		return -EPROTO;
	fill_info(&c->info, &w);
	return 0;
}

static kvc_client *client_free(kvc_client *c)
{
	while (c->reqs)
		kvc_request_finish(c->reqs);
	ipc_chan_free(c->ch);
	free(c->sockbuf);
	free(c->ringbuf);
	free(c->txbuf);
	free(c);
	return NULL;
}

int kvc_connect_fd(int fd, kvc_client **ret)
{
	int type = 0;
	socklen_t len = sizeof(type);

	if (!ret)
		return -EINVAL;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0)
		return -errno;
	if (type != SOCK_SEQPACKET)
		return -EPROTOTYPE;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;

	kvc_client *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = fd;
	c->timeout_ms = -1;
	c->sockbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	c->ringbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	c->txbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	int r = -ENOMEM;
	if (!c->sockbuf || !c->ringbuf || !c->txbuf)
		goto fail;
	if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		r = -errno;
		goto fail;
	}
	r = handshake(c);
	if (r < 0)
		goto fail;
	*ret = c;
	return 0;

fail:
	if (!(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl); /* the caller gets its fd back as it was */
	client_free(c);
	return r;
}

int kvc_connect(const char *path, kvc_client **ret)
{
	int fd, r;

	if (!ret)
		return -EINVAL;
	if (!path) {
		path = getenv(KVC_SOCKET_ENV);
		if (!path || !*path)
			path = KVC_DEFAULT_SOCKET;
	}
	r = ipc_connect(path, &fd);
	if (r < 0)
		return r;
	r = kvc_connect_fd(fd, ret);
	if (r < 0)
		close(fd);
	return r;
}

kvc_client *kvc_close(kvc_client *c)
{
	if (!c)
		return NULL;
	int fd = c->fd;
	client_free(c);
	close(fd);
	return NULL;
}

int kvc_set_timeout(kvc_client *c, int timeout_ms)
{
	c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
	return 0;
}

const struct kvc_info *kvc_server_info(const kvc_client *c)
{
	return &c->info;
}

const char *kvc_last_message(const kvc_client *c)
{
	return c->last_msg;
}
