/*
 * client/kvc_admin.c — libkvclient's control calls: stats, tokenize and
 * count, sessions, ps and ping, each one control frame and its reply
 * handler; kvc_free() for what they return.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kvclient.h"
#include "ipc.h"
#include "kvc_impl.h"
#include "kvc_metrics.h"

/* The STATS reply and struct kvc_stats carry the same fields, at the same
 * offsets, as client/kvc_metrics.h lists: a field added to one and not to
 * the list (or the other) fails the build here. */
#define SAME_FIELD(field, ...) \
	_Static_assert(offsetof(struct ipc_stats, field) == offsetof(struct kvc_stats, field), \
		       "struct ipc_stats and struct kvc_stats disagree on " #field);
KVC_STATS_METRICS(SAME_FIELD)
#undef SAME_FIELD
_Static_assert(sizeof(struct kvc_stats) == KVC_STATS_N_METRICS * sizeof(uint64_t),
	       "struct kvc_stats has a member client/kvc_metrics.h does not list");
_Static_assert(sizeof(struct ipc_stats) == sizeof(struct kvc_stats),
	       "struct ipc_stats and struct kvc_stats differ in size");
/* struct kvc_stats as libkvclient 0.7.0 declared it: what the kvc_stats symbol fills */
#define KVC_STATS_V070_BYTES ((size_t)IPC_STATS_V070_BYTES)
_Static_assert(offsetof(struct kvc_stats, gram_checked) == KVC_STATS_V070_BYTES, "0.7.0's struct kvc_stats");

/* Everything defined from here on is internal unless kvclient.h declared
 * it with KVC_EXPORT (an explicit attribute beats the pragma). */
#pragma GCC visibility push(hidden)

/* ---- control calls ------------------------------------------------------------------------- */

static int stats_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct kvc_stats *o = arg;
	struct ipc_stats s;
	(void)c;

	if (f->hdr.type != IPC_MSG_STATS_REPLY || ipc_decode_stats(f, &s) < 0)
		return -EPROTO;
	memset(o, 0, sizeof(*o));
#define COPY(field, ...) o->field = s.field;
	KVC_STATS_METRICS(COPY)
#undef COPY
	return 1;
}

int kvc_stats_get(kvc_client *c, struct kvc_stats *ret, size_t size)
{
	struct kvc_stats s;

	if (!c || !ret || size == 0 || size % sizeof(uint64_t))
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_STATS, NULL, 0, NULL, 0, stats_reply, &s);
	if (r == 0)
		memcpy(ret, &s, size < sizeof(s) ? size : sizeof(s));
	return r;
}

/* The kvc_stats symbol, which programs built before kvc_stats() became a
 * macro call: their struct kvc_stats was 0.7.0's. */
#undef kvc_stats
int kvc_stats(kvc_client *c, struct kvc_stats *ret)
{
	return kvc_stats_get(c, ret, KVC_STATS_V070_BYTES);
}

struct tok_acc {
	bool count_only;
	bool started;
	uint32_t total;
	uint32_t n;
	int32_t *ids;
};

static int tokenize_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct tok_acc *a = arg;
	struct ipc_tokenize_reply_msg m;
	(void)c;

	if (f->hdr.type != IPC_MSG_TOKENIZE_REPLY || ipc_decode_tokenize_reply(f, &m) < 0)
		return -EPROTO;
	if (!a->started) {
		if (m.r.n_tokens > MAX_TOKENIZE_IDS)
			return -EPROTO;
		a->started = true;
		a->total = m.r.n_tokens;
		if (!a->count_only && a->total) {
			a->ids = malloc(sizeof(int32_t) * a->total);
			if (!a->ids)
				return -ENOMEM;
		}
	}
	if (m.r.n_tokens != a->total || m.r.offset != a->n || (a->count_only && m.r.n_ids))
		return -EPROTO;
	for (uint32_t i = 0; i < m.r.n_ids; i++)
		a->ids[a->n + i] = ipc_reply_id(&m, i);
	a->n += m.r.n_ids;
	if (m.more)
		return 0;
	if (!a->count_only && a->n != a->total)
		return -EPROTO;
	return 1;
}

static int do_tokenize(kvc_client *c, const char *text, size_t len, unsigned flags, bool count_only,
		       struct tok_acc *a)
{
	if (!c || (!text && len) || (flags & ~(KVC_TOK_ADD_BOS | KVC_TOK_PARSE_SPECIAL)))
		return -EINVAL;
	if (!text)
		text = "";
	if (len == KVC_NTS)
		len = strlen(text);
	if (len > IPC_MAX_TEXT_BYTES || len > c->info.max_prompt_bytes)
		return -E2BIG;
	struct ipc_tokenize t = { .tok_flags = flags | (count_only ? IPC_TOK_COUNT_ONLY : 0), .text_bytes = (uint32_t)len };
	bool in_ring = len > IPC_MAX_INLINE_TEXT_BYTES;
	if (in_ring)
		t.tok_flags |= IPC_TOK_TEXT_IN_RING;
	struct iovec v[2] = { { &t, sizeof(t) }, { (void *)text, in_ring ? 0 : len } };
	memset(a, 0, sizeof(*a));
	a->count_only = count_only;
	int r = ctl_call(c, IPC_MSG_TOKENIZE, v, in_ring || !len ? 1 : 2, in_ring ? text : NULL, len, tokenize_reply, a);
	if (r < 0) {
		free(a->ids);
		a->ids = NULL;
	}
	return r;
}

int kvc_tokenize(kvc_client *c, const char *text, size_t len, unsigned flags, int32_t **ret_ids, size_t *ret_n)
{
	struct tok_acc a;

	if (!ret_ids || !ret_n)
		return -EINVAL;
	int r = do_tokenize(c, text, len, flags, false, &a);
	if (r < 0)
		return r;
	*ret_ids = a.ids;
	*ret_n = a.n;
	return 0;
}

int kvc_count_tokens(kvc_client *c, const char *text, size_t len, unsigned flags, size_t *ret_n)
{
	struct tok_acc a;

	if (!ret_n)
		return -EINVAL;
	int r = do_tokenize(c, text, len, flags, true, &a);
	if (r < 0)
		return r;
	*ret_n = a.total;
	return 0;
}

static int session_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ipc_session s;
	uint16_t want = *(uint64_t *)arg ? IPC_MSG_SESSION_CLOSED : IPC_MSG_SESSION_OPENED;
	(void)c;

	if (f->hdr.type != want || ipc_decode_session(f, &s) < 0)
		return -EPROTO;
	if (want == IPC_MSG_SESSION_CLOSED && s.session_id != *(uint64_t *)arg)
		return -EPROTO;
	*(uint64_t *)arg = s.session_id;
	return 1;
}

int kvc_session_open(kvc_client *c, uint32_t idle_timeout_s, uint64_t *ret_session_id)
{
	struct ipc_session_open o = { .idle_timeout_s = idle_timeout_s };
	struct iovec v = { &o, sizeof(o) };
	uint64_t id = 0; /* 0: expecting SESSION_OPENED */

	if (!c || !ret_session_id)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_SESSION_OPEN, &v, 1, NULL, 0, session_reply, &id);
	if (r == 0)
		*ret_session_id = id;
	return r;
}

int kvc_session_open_policy(kvc_client *c, uint32_t idle_timeout_s, uint32_t context_policy, uint32_t context_window,
			    uint32_t context_sinks, uint64_t *ret_session_id)
{
	struct ipc_session_open o = { .flags = IPC_SESSION_CONTEXT, .idle_timeout_s = idle_timeout_s };
	struct ipc_gen_context ctx = { context_policy, context_window, context_sinks, 0 };
	struct iovec v[2] = { { &o, sizeof(o) }, { &ctx, sizeof(ctx) } };
	uint64_t id = 0; /* 0: expecting SESSION_OPENED */

	if (!c || !ret_session_id || ipc_gen_context_check(&ctx) < 0)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_SESSION_OPEN, v, 2, NULL, 0, session_reply, &id);
	if (r == 0)
		*ret_session_id = id;
	return r;
}

int kvc_session_close(kvc_client *c, uint64_t session_id)
{
	struct ipc_session s = { .session_id = session_id };
	struct iovec v = { &s, sizeof(s) };
	uint64_t id = session_id;

	if (!c || session_id == 0)
		return -EINVAL;
	return ctl_call(c, IPC_MSG_SESSION_CLOSE, &v, 1, NULL, 0, session_reply, &id);
}

struct ps_acc {
	bool started;
	uint32_t total;
	uint32_t n;
	struct kvc_ps_entry *e;
};

static int ps_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ps_acc *a = arg;
	struct ipc_ps_reply_msg m;
	(void)c;

	if (f->hdr.type != IPC_MSG_PS_REPLY || ipc_decode_ps_reply(f, &m) < 0)
		return -EPROTO;
	if (!a->started) {
		if (m.r.n_total > MAX_PS_ENTRIES)
			return -EPROTO;
		a->started = true;
		a->total = m.r.n_total;
		if (a->total) {
			a->e = calloc(a->total, sizeof(*a->e));
			if (!a->e)
				return -ENOMEM;
		}
	}
	if (m.r.n_total != a->total || m.r.n_entries > a->total - a->n)
		return -EPROTO;
	for (uint32_t i = 0; i < m.r.n_entries; i++) {
		struct ipc_ps_entry w;
		struct kvc_ps_entry *o = &a->e[a->n + i];
		ipc_ps_entry_at(&m, i, &w);
		o->request_id = w.request_id;
		o->client_id = w.client_id;
		o->session_id = w.session_id;
		o->age_ns = w.age_ns;
		o->pid = w.pid;
		o->uid = w.uid;
		o->state = w.state;
		o->pages = w.pages;
		o->pages_shared = w.pages_shared;
		o->prompt_tokens = w.prompt_tokens;
		o->cached_tokens = w.cached_tokens;
		o->generated_tokens = w.generated_tokens;
		o->max_tokens = w.max_tokens;
		o->sample = w.sample;
	}
	a->n += m.r.n_entries;
	if (m.more)
		return 0;
	return a->n == a->total ? 1 : -EPROTO;
}

int kvc_ps(kvc_client *c, struct kvc_ps_entry **ret_entries, size_t *ret_n)
{
	struct ps_acc a = { 0 };

	if (!c || !ret_entries || !ret_n)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_PS, NULL, 0, NULL, 0, ps_reply, &a);
	if (r < 0) {
		free(a.e);
		return r;
	}
	*ret_entries = a.e;
	*ret_n = a.n;
	return 0;
}

static int pong_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ipc_ping p;
	(void)c;

	if (f->hdr.type != IPC_MSG_PONG || ipc_decode_ping(f, &p) < 0 || p.nonce != *(uint64_t *)arg)
		return -EPROTO;
	return 1;
}

int kvc_ping(kvc_client *c, uint64_t *ret_rtt_ns)
{
	int64_t t0 = now_ns();
	struct ipc_ping p = { .nonce = (uint64_t)t0 };
	struct iovec v = { &p, sizeof(p) };

	if (!c)
		return -EINVAL;
	int r = ctl_call(c, IPC_MSG_PING, &v, 1, NULL, 0, pong_reply, &p.nonce);
	if (r == 0 && ret_rtt_ns)
		*ret_rtt_ns = (uint64_t)(now_ns() - t0);
	return r;
}

void kvc_free(void *p)
{
	free(p);
}
