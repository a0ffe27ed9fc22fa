/*
 * client/kvc_cache.c — libkvclient's administrator calls on the prefix
 * cache: kvc_cache_save (write the daemon's hibernation file now) and
 * kvc_cache_drop (empty the cache and remove that file), one CACHE request
 * each. The daemon decides who may (root and server.admin_groups); the
 * library only refuses to ask a daemon too old to know the message.
 */
#include <errno.h>
#include <string.h>

#include "kvclient.h"
#include "ipc.h"
#include "kvc_impl.h"

#pragma GCC visibility push(hidden)

static int cache_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ipc_cache_reply *o = arg;
	(void)c;

	if (f->hdr.type != IPC_MSG_CACHE_REPLY || ipc_decode_cache_reply(f, o) < 0)
		return -EPROTO;
	return 1;
}

static int cache_call(kvc_client *c, uint32_t op, struct kvc_cache_result *ret)
{
	struct ipc_cache_req q = { .op = op };
	struct iovec iov = { &q, sizeof(q) };
	struct ipc_cache_reply rep;
	int r;

	if (!c || !ret)
		return -EINVAL;
	if (c->info.server_version < IPC_CACHE_SERVER_VERSION)
		return -EOPNOTSUPP;
	r = ctl_call(c, IPC_MSG_CACHE, &iov, 1, NULL, 0, cache_reply, &rep);
	if (r == -ENOMSG)
		r = -EOPNOTSUPP;
	if (r == 0 && rep.op != op)
		r = -EPROTO;
	if (r < 0)
		return r;
	*ret = (struct kvc_cache_result){
		.pages = rep.pages,
		.candidates = rep.candidates,
		.bytes = rep.bytes,
		.ns = rep.ns,
		.timed_out = rep.timed_out,
		.file_removed = rep.file_removed,
	};
	return 0;
}

#pragma GCC visibility pop

int kvc_cache_save(kvc_client *c, struct kvc_cache_result *ret)
{
	return cache_call(c, IPC_CACHE_SAVE, ret);
}

int kvc_cache_drop(kvc_client *c, struct kvc_cache_result *ret)
{
	return cache_call(c, IPC_CACHE_DROP, ret);
}
