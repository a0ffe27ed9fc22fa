/*
 * ipc/frame.c — kvd's message format: the type table (who may send what,
 * over which transport, with which fixed payload and fds), header
 * validation, frame building, and the payload decoders that check every
 * field against the limits in ipc.h.
 *
 * Decoders copy fixed structs out with memcpy (payloads need not be
 * aligned) and return pointers into the caller's buffer for variable
 * parts. Nothing here allocates.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "ipc.h"

#pragma GCC visibility push(hidden)

/* ---- layout guarantees: explicit sizes, no implicit padding ------------- */

static_assert(sizeof(struct ipc_hdr) == IPC_HDR_BYTES, "ipc_hdr size");
static_assert(offsetof(struct ipc_hdr, request_id) == 16, "ipc_hdr layout");
static_assert(sizeof(struct ipc_hello) == 40, "ipc_hello size");
static_assert(offsetof(struct ipc_welcome, kv_bytes_per_token) == 64, "ipc_welcome layout");
static_assert(offsetof(struct ipc_welcome, model_name) == 80, "ipc_welcome layout");
static_assert(offsetof(struct ipc_welcome, model_id) == 144, "ipc_welcome layout");
static_assert(offsetof(struct ipc_welcome, chat_format) == 176 && IPC_WELCOME_V080_BYTES == 176,
	      "ipc_welcome layout");
static_assert(sizeof(struct ipc_welcome) == 208, "ipc_welcome size");
static_assert(sizeof(struct ipc_generate) == 64, "ipc_generate size");
static_assert(offsetof(struct ipc_generate, seed) == 32, "ipc_generate layout");
static_assert(offsetof(struct ipc_generate, n_stop) == 56, "ipc_generate layout");
static_assert(sizeof(struct ipc_prompt_data) == 8, "ipc_prompt_data size");
static_assert(sizeof(struct ipc_token) == 16, "ipc_token size");
static_assert(sizeof(struct ipc_done) == 56, "ipc_done size");
static_assert(offsetof(struct ipc_done, queue_ns) == 24, "ipc_done layout");
static_assert(sizeof(struct ipc_error) == 8, "ipc_error size");
static_assert(IPC_STATS_V070_BYTES == 40 * 8, "ipc_stats: 0.7.0's fields are fixed");
static_assert(sizeof(struct ipc_stats) == 54 * 8 && sizeof(struct ipc_stats) <= IPC_MAX_STATS_BYTES, "ipc_stats size");
static_assert(sizeof(struct ipc_tokenize) == 8, "ipc_tokenize size");
static_assert(sizeof(struct ipc_tokenize_reply) == 16, "ipc_tokenize_reply size");
static_assert(sizeof(struct ipc_session_open) == 8, "ipc_session_open size");
static_assert(sizeof(struct ipc_gen_context) == 16, "ipc_gen_context size");
static_assert(sizeof(struct ipc_session) == 8, "ipc_session size");
static_assert(sizeof(struct ipc_ping) == 8, "ipc_ping size");
static_assert(sizeof(struct ipc_ps_entry) == 72, "ipc_ps_entry size");
static_assert(offsetof(struct ipc_ps_entry, pid) == 32, "ipc_ps_entry layout");
static_assert(sizeof(struct ipc_ps_reply) == 8, "ipc_ps_reply size");
static_assert(sizeof(struct ipc_sample) == 8, "ipc_sample size");
static_assert(sizeof(struct ipc_logprob) == 12, "ipc_logprob size");
static_assert(IPC_MAX_SAMPLES <= UINT8_MAX && IPC_MAX_TOP_LOGPROBS <= UINT8_MAX, "limits fit their u8 fields");
/* The daemon sends a record with log-probabilities as soon as it has one
 * token's worth: one token with all its entries, maximal pieces and a
 * maximal text fits the smallest ring's largest record. */
static_assert(IPC_HDR_BYTES + sizeof(struct ipc_token) + sizeof(struct ipc_sample) + 4 + IPC_MAX_TOKEN_TEXT_BYTES +
			      (1 + IPC_MAX_TOP_LOGPROBS) * (sizeof(struct ipc_logprob) + IPC_MAX_PIECE_BYTES) <=
		      IPC_RING_MIN_BYTES / 2,
	      "a one-token TOKEN record with log-probabilities fits the smallest ring");
static_assert(IPC_MAX_INLINE_TEXT_BYTES + IPC_MAX_SYSTEM_BYTES +
		      IPC_MAX_STOP_STRINGS * (2 + IPC_MAX_STOP_BYTES) + sizeof(struct ipc_generate) <=
	      IPC_MAX_PAYLOAD_BYTES, "a maximal GENERATE fits one frame");
static_assert(sizeof(struct ipc_token) + IPC_MAX_TOKENS_PER_RECORD * 4 + IPC_MAX_TOKEN_TEXT_BYTES + IPC_HDR_BYTES <=
		      IPC_RING_MIN_BYTES / 2, "a maximal TOKEN record fits the smallest ring");

/* ---- the type table ------------------------------------------------------- */

struct type_info {
	const char *name;
	unsigned where;    /* IPC_FROM_* | IPC_VIA_* allowed */
	uint32_t fixed;    /* fixed payload struct size */
	bool variable;     /* payload may extend beyond `fixed` */
	uint32_t flags;    /* header flag bits the type defines */
	unsigned n_fds;    /* exact number of fds */
	uint32_t sample;   /* bytes IPC_F_SAMPLE adds to `fixed` (a struct ipc_sample) */
	uint32_t spec;     /* bytes IPC_F_SPEC adds to it (a struct ipc_done_spec) */
};

#define C2S_SOCK (IPC_FROM_CLIENT | IPC_VIA_SOCKET)
#define S2C_SOCK (IPC_FROM_SERVER | IPC_VIA_SOCKET)

static const struct type_info types[IPC_MSG_TYPE_MAX + 1] = {
	[IPC_MSG_HELLO] = { "HELLO", C2S_SOCK, sizeof(struct ipc_hello), false, 0, 0 },
	[IPC_MSG_WELCOME] = { "WELCOME", S2C_SOCK, IPC_WELCOME_V080_BYTES, true, 0, IPC_WELCOME_N_FDS },
	[IPC_MSG_GENERATE] = { "GENERATE", C2S_SOCK, sizeof(struct ipc_generate), true, 0, 0 },
	[IPC_MSG_PROMPT_DATA] = { "PROMPT_DATA", IPC_FROM_CLIENT | IPC_VIA_RING, sizeof(struct ipc_prompt_data),
				  true, 0, 0 },
	[IPC_MSG_TOKEN] = { "TOKEN", IPC_FROM_SERVER | IPC_VIA_RING, sizeof(struct ipc_token), true, IPC_F_SAMPLE, 0,
			    sizeof(struct ipc_sample) },
	[IPC_MSG_DONE] = { "DONE", IPC_FROM_SERVER | IPC_VIA_RING | IPC_VIA_SOCKET, sizeof(struct ipc_done),
			   false, IPC_F_SAMPLE | IPC_F_SPEC, 0, sizeof(struct ipc_sample), sizeof(struct ipc_done_spec) },
	[IPC_MSG_CANCEL] = { "CANCEL", C2S_SOCK, 0, false, 0, 0 },
	[IPC_MSG_ERROR] = { "ERROR", IPC_FROM_SERVER | IPC_VIA_SOCKET | IPC_VIA_RING, sizeof(struct ipc_error),
			    true, 0, 0 },
	[IPC_MSG_STATS] = { "STATS", C2S_SOCK, 0, false, 0, 0 },
	[IPC_MSG_STATS_REPLY] = { "STATS_REPLY", S2C_SOCK, IPC_STATS_V070_BYTES, true, 0, 0 },
	[IPC_MSG_TOKENIZE] = { "TOKENIZE", C2S_SOCK, sizeof(struct ipc_tokenize), true, 0, 0 },
	[IPC_MSG_TOKENIZE_REPLY] = { "TOKENIZE_REPLY", S2C_SOCK, sizeof(struct ipc_tokenize_reply), true,
				     IPC_F_MORE, 0 },
	[IPC_MSG_SESSION_OPEN] = { "SESSION_OPEN", C2S_SOCK, sizeof(struct ipc_session_open), true, 0, 0 },
	[IPC_MSG_SESSION_OPENED] = { "SESSION_OPENED", S2C_SOCK, sizeof(struct ipc_session), false, 0, 0 },
	[IPC_MSG_SESSION_CLOSE] = { "SESSION_CLOSE", C2S_SOCK, sizeof(struct ipc_session), false, 0, 0 },
	[IPC_MSG_SESSION_CLOSED] = { "SESSION_CLOSED", S2C_SOCK, sizeof(struct ipc_session), false, 0, 0 },
	[IPC_MSG_PING] = { "PING", C2S_SOCK, sizeof(struct ipc_ping), false, 0, 0 },
	[IPC_MSG_PONG] = { "PONG", S2C_SOCK, sizeof(struct ipc_ping), false, 0, 0 },
	[IPC_MSG_PS] = { "PS", C2S_SOCK, 0, false, 0, 0 },
	[IPC_MSG_PS_REPLY] = { "PS_REPLY", S2C_SOCK, sizeof(struct ipc_ps_reply), true, IPC_F_MORE, 0 },
	[IPC_MSG_KVMAP] = { "KVMAP", C2S_SOCK, 0, false, 0, 0 },
	[IPC_MSG_KVMAP_REPLY] = { "KVMAP_REPLY", S2C_SOCK, sizeof(struct ipc_kvmap), false, 0, 1 },
	[IPC_MSG_HIST] = { "HIST", C2S_SOCK, 0, false, 0, 0 },
	[IPC_MSG_HIST_REPLY] = { "HIST_REPLY", S2C_SOCK, sizeof(struct ipc_hist_reply), false, 0, 0 },
	[IPC_MSG_LEDGER] = { "LEDGER", C2S_SOCK, sizeof(struct ipc_ledger_req), false, 0, 0 },
	[IPC_MSG_LEDGER_REPLY] = { "LEDGER_REPLY", S2C_SOCK, sizeof(struct ipc_ledger_reply), true, IPC_F_MORE, 0 },
	[IPC_MSG_CACHE] = { "CACHE", C2S_SOCK, sizeof(struct ipc_cache_req), false, 0, 0 },
	[IPC_MSG_CACHE_REPLY] = { "CACHE_REPLY", S2C_SOCK, sizeof(struct ipc_cache_reply), false, 0, 0 },
};

const char *ipc_type_name(uint32_t type)
{
	if (type == 0 || type > IPC_MSG_TYPE_MAX || !types[type].name)
		return "?";
	return types[type].name;
}

const char *ipc_finish_name(uint32_t reason)
{
	switch (reason) {
	case IPC_FINISH_EOS: return "eos";
	case IPC_FINISH_LENGTH: return "length";
	case IPC_FINISH_STOP: return "stop";
	case IPC_FINISH_CANCELLED: return "cancelled";
	case IPC_FINISH_ERROR: return "error";
	}
	return "?";
}

const char *ipc_req_state_name(uint32_t state)
{
	switch (state) {
	case IPC_REQ_WAITING: return "waiting";
	case IPC_REQ_PREFILL: return "prefill";
	case IPC_REQ_RUNNING: return "running";
	case IPC_REQ_SWAPPED: return "swapped";
	case IPC_REQ_UPLOADING: return "uploading";
	}
	return "?";
}

bool ipc_error_code_valid(int32_t code)
{
	if (code <= -1 && code > -IPC_ERR_BASE)
		return true;
	return code <= -(IPC_ERR_BASE + 1) && code >= IPC_ERR_LAST;
}

/* ---- header validation ------------------------------------------------------ */

int ipc_frame_check(const void *buf, size_t n, unsigned n_fds, unsigned from, unsigned via,
		    struct ipc_hdr *ret_hdr)
{
	struct ipc_hdr h;

	assert(from == IPC_FROM_CLIENT || from == IPC_FROM_SERVER);
	assert(via == IPC_VIA_SOCKET || via == IPC_VIA_RING);
	if (n < IPC_HDR_BYTES) {
		if (ret_hdr)
			memset(ret_hdr, 0, sizeof(*ret_hdr));
		return -EBADMSG;
	}
	memcpy(&h, buf, sizeof(h));
	if (ret_hdr)
		*ret_hdr = h;
	if (h.magic != IPC_MAGIC)
		return -EBADMSG;
	if (h.version != IPC_PROTO_VERSION)
		return -EPROTONOSUPPORT;
	if (n > IPC_MAX_FRAME_BYTES || h.length > IPC_MAX_PAYLOAD_BYTES)
		return -E2BIG;
	if (h.length != n - IPC_HDR_BYTES)
		return -EBADMSG;
	if (h.type == 0 || h.type > IPC_MSG_TYPE_MAX || !types[h.type].name)
		return -ENOMSG;
	const struct type_info *t = &types[h.type];
	if (!(t->where & from) || !(t->where & via))
		return -EPROTO;
	if (h.flags & ~t->flags)
		return -EPROTO;
	uint32_t fixed = t->fixed + ((h.flags & IPC_F_SAMPLE) ? t->sample : 0) + ((h.flags & IPC_F_SPEC) ? t->spec : 0);
	if (h.length < fixed || (!t->variable && h.length != fixed))
		return -EBADMSG;
	if (n_fds > t->n_fds)
		return -ETOOMANYREFS;
	if (n_fds < t->n_fds)
		return -EBADMSG;
	return 0;
}

ssize_t ipc_frame_build(void *buf, size_t cap, uint16_t type, uint32_t flags, uint64_t request_id,
			const struct iovec *parts, int n_parts)
{
	size_t len = 0;

	for (int i = 0; i < n_parts; i++) {
		if (parts[i].iov_len > IPC_MAX_PAYLOAD_BYTES - len)
			return -E2BIG;
		len += parts[i].iov_len;
	}
	if (IPC_HDR_BYTES + len > cap)
		return -E2BIG;
	struct ipc_hdr h = {
		.magic = IPC_MAGIC,
		.version = IPC_PROTO_VERSION,
		.type = type,
		.length = (uint32_t)len,
		.flags = flags,
		.request_id = request_id,
	};
	uint8_t *p = buf;
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	for (int i = 0; i < n_parts; i++) {
		if (parts[i].iov_len)
			memcpy(p, parts[i].iov_base, parts[i].iov_len);
		p += parts[i].iov_len;
	}
	return (ssize_t)(IPC_HDR_BYTES + len);
}

/* ---- decoders ------------------------------------------------------------------ */

/* A name field: text without control characters (UTF-8 passes), a NUL
 * within the field, and only NULs after it. */
static bool nul_terminated_name(const char *s, size_t cap)
{
	size_t i;

	for (i = 0; i < cap && s[i]; i++)
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
			return false;
	if (i == cap)
		return false;
	for (; i < cap; i++) /* NUL padding, so nothing leaks and compares are exact */
		if (s[i])
			return false;
	return true;
}

int ipc_decode_hello(const struct ipc_frame *f, struct ipc_hello *ret)
{
	struct ipc_hello h;

	assert(f->hdr.type == IPC_MSG_HELLO && f->hdr.length == sizeof(h));
	memcpy(&h, f->payload, sizeof(h));
	if (h.capabilities & ~IPC_CAP_ALL)
		return -EPROTO;
	if (!nul_terminated_name(h.client_name, sizeof(h.client_name)))
		return -EBADMSG;
	*ret = h;
	return 0;
}

int ipc_decode_welcome(const struct ipc_frame *f, struct ipc_welcome *ret)
{
	struct ipc_welcome w = { 0 };

	assert(f->hdr.type == IPC_MSG_WELCOME && f->hdr.length >= IPC_WELCOME_V080_BYTES);
	/* 0.8.0 to 0.10.0 send the first part only; a later daemon may send
	 * more than this client knows */
	memcpy(&w, f->payload, f->hdr.length < sizeof(w) ? f->hdr.length : sizeof(w));
	if (w.capabilities & ~IPC_CAP_ALL)
		return -EPROTO;
	if (w.kv_type > IPC_KV_TYPE_MAX)
		return -EPROTO;
	if (!nul_terminated_name(w.model_name, sizeof(w.model_name)) ||
	    !nul_terminated_name(w.model_id, sizeof(w.model_id)) ||
	    !nul_terminated_name(w.chat_format, sizeof(w.chat_format)))
		return -EBADMSG;
	if (w.max_text_bytes > IPC_MAX_TEXT_BYTES || w.max_gen_tokens > IPC_MAX_GEN_TOKENS)
		return -E2BIG;
	if (w.shm_bytes == 0 || w.block_size == 0 || w.max_requests == 0)
		return -EINVAL;
	*ret = w;
	return 0;
}

static bool in_range(float v, float lo, float hi)
{
	return isfinite(v) && v >= lo && v <= hi;
}

int ipc_decode_generate(const struct ipc_frame *f, struct ipc_generate_msg *ret)
{
	struct ipc_generate_msg m;
	const struct ipc_generate *g = &m.g;

	assert(f->hdr.type == IPC_MSG_GENERATE && f->hdr.length >= sizeof(m.g));
	memset(&m, 0, sizeof(m));
	memcpy(&m.g, f->payload, sizeof(m.g));
	if (g->gen_flags & ~IPC_GEN_ALL)
		return -EPROTO;
	if (g->n_samples > IPC_MAX_SAMPLES || g->top_logprobs > IPC_MAX_TOP_LOGPROBS)
		return -E2BIG;
	if (g->top_logprobs && !(g->gen_flags & IPC_GEN_LOGPROBS))
		return -EINVAL; /* alternatives come only with log-probabilities */
	if (g->n_samples > 1 && g->session_id)
		return -EINVAL; /* a session continues one sequence */
	if (g->max_tokens == 0)
		return -EINVAL;
	if (g->max_tokens > IPC_MAX_GEN_TOKENS)
		return -E2BIG;
	if (!in_range(g->temperature, 0.0f, IPC_MAX_TEMPERATURE) || !(isfinite(g->top_p) && g->top_p > 0.0f && g->top_p <= 1.0f) ||
	    !(isfinite(g->min_p) && g->min_p >= 0.0f && g->min_p < 1.0f) ||
	    !(isfinite(g->repeat_penalty) && g->repeat_penalty > 0.0f && g->repeat_penalty <= IPC_MAX_REPEAT_PENALTY))
		return -EINVAL;
	if (g->top_k < 0 || g->top_k > IPC_MAX_TOP_K || g->repeat_last_n < 0 || g->repeat_last_n > IPC_MAX_REPEAT_LAST_N)
		return -EINVAL;
	if (g->n_stop > IPC_MAX_STOP_STRINGS || g->system_bytes > IPC_MAX_SYSTEM_BYTES || g->prompt_bytes > IPC_MAX_TEXT_BYTES)
		return -E2BIG;
	if (g->stop_bytes > IPC_MAX_STOP_STRINGS * (2 + IPC_MAX_STOP_BYTES))
		return -E2BIG;
	if (g->system_bytes && (g->gen_flags & IPC_GEN_RAW))
		return -EINVAL; /* a system prompt needs the chat template */
	if ((g->gen_flags & IPC_GEN_PARSE_SPECIAL) && !(g->gen_flags & IPC_GEN_RAW))
		return -EINVAL; /* the chat template is rendered by the daemon */
	bool turns = g->gen_flags & IPC_GEN_CHAT_TURNS;
	if (turns && ((g->gen_flags & IPC_GEN_RAW) || g->system_bytes || g->session_id))
		return -EINVAL; /* turns are rendered whole: no raw text, separate system text or session */
	bool in_ring = g->gen_flags & IPC_GEN_PROMPT_IN_RING;
	if (!in_ring && g->prompt_bytes > IPC_MAX_INLINE_TEXT_BYTES)
		return -E2BIG;
	if (in_ring && g->prompt_bytes == 0)
		return -EINVAL;
	bool has_ctx = g->gen_flags & IPC_GEN_CONTEXT;
	bool has_tenant = g->gen_flags & IPC_GEN_TENANT;
	bool has_prio = g->gen_flags & IPC_GEN_PRIORITY;
	bool has_cons = g->gen_flags & IPC_GEN_CONSTRAINT;
	/* All sizes are bounded above, so these sums cannot overflow. The
	 * constraint block sits at a known offset; its text's length is needed
	 * for the frame's. */
	uint64_t cons_at = (uint64_t)sizeof(m.g) + g->system_bytes + g->stop_bytes + (has_ctx ? sizeof(m.ctx) : 0) +
			   (has_tenant ? sizeof(m.tenant) : 0) + (has_prio ? sizeof(m.prio) : 0);
	if (has_cons) {
		if (cons_at + sizeof(m.cons) > f->hdr.length)
			return -EBADMSG;
		memcpy(&m.cons, (const uint8_t *)f->payload + cons_at, sizeof(m.cons));
		int r = ipc_gen_constraint_check(&m.cons);
		if (r < 0)
			return r;
	}
	uint64_t expect = cons_at + (has_cons ? sizeof(m.cons) + (in_ring ? 0 : m.cons.text_bytes) : 0) +
			  (in_ring ? 0 : g->prompt_bytes);
	if (expect != f->hdr.length)
		return -EBADMSG;

	const char *p = (const char *)f->payload + sizeof(m.g);
	m.system = p;
	p += g->system_bytes;
	const char *stop_end = p + g->stop_bytes;
	for (unsigned i = 0; i < g->n_stop; i++) {
		uint16_t len;
		if (stop_end - p < 2)
			return -EBADMSG;
		memcpy(&len, p, 2);
		p += 2;
		if (len == 0)
			return -EINVAL;
		if (len > IPC_MAX_STOP_BYTES)
			return -E2BIG;
		if (stop_end - p < len)
			return -EBADMSG;
		m.stop[i] = p;
		m.stop_len[i] = len;
		p += len;
	}
	if (p != stop_end)
		return -EBADMSG;
	if (has_ctx) {
		memcpy(&m.ctx, p, sizeof(m.ctx));
		p += sizeof(m.ctx);
		int r = ipc_gen_context_check(&m.ctx);
		if (r < 0)
			return r;
	}
	if (has_tenant) {
		memcpy(&m.tenant, p, sizeof(m.tenant));
		p += sizeof(m.tenant);
		int r = ipc_gen_tenant_check(&m.tenant);
		if (r < 0)
			return r;
	}
	if (has_prio) {
		memcpy(&m.prio, p, sizeof(m.prio));
		p += sizeof(m.prio);
		int r = ipc_gen_priority_check(&m.prio);
		if (r < 0)
			return r;
	}
	if (has_cons)
		p += sizeof(m.cons);
	if (turns && !in_ring) {
		int r = ipc_chat_turns_check(p, g->prompt_bytes);
		if (r < 0)
			return r;
	}
	m.prompt = in_ring ? NULL : p;
	if (has_cons && !in_ring)
		m.cons_text = p + g->prompt_bytes;
	*ret = m;
	return 0;
}

ssize_t ipc_encode_generate(void *buf, size_t cap, uint64_t request_id, const struct ipc_generate_msg *m)
{
	struct ipc_generate g = m->g;
	uint16_t lens[IPC_MAX_STOP_STRINGS];
	struct iovec iov[7 + 2 * IPC_MAX_STOP_STRINGS + 1];
	int n = 0;

	if (g.n_stop > IPC_MAX_STOP_STRINGS)
		return -E2BIG;
	g.stop_bytes = 0;
	for (unsigned i = 0; i < g.n_stop; i++)
		g.stop_bytes += 2u + m->stop_len[i];
	iov[n++] = (struct iovec){ (void *)&g, sizeof(g) };
	if (g.system_bytes)
		iov[n++] = (struct iovec){ (void *)m->system, g.system_bytes };
	for (unsigned i = 0; i < g.n_stop; i++) {
		lens[i] = m->stop_len[i];
		iov[n++] = (struct iovec){ &lens[i], 2 };
		iov[n++] = (struct iovec){ (void *)m->stop[i], m->stop_len[i] };
	}
	if (g.gen_flags & IPC_GEN_CONTEXT)
		iov[n++] = (struct iovec){ (void *)&m->ctx, sizeof(m->ctx) };
	if (g.gen_flags & IPC_GEN_TENANT)
		iov[n++] = (struct iovec){ (void *)&m->tenant, sizeof(m->tenant) };
	if (g.gen_flags & IPC_GEN_PRIORITY)
		iov[n++] = (struct iovec){ (void *)&m->prio, sizeof(m->prio) };
	if (g.gen_flags & IPC_GEN_CONSTRAINT)
		iov[n++] = (struct iovec){ (void *)&m->cons, sizeof(m->cons) };
	if (!(g.gen_flags & IPC_GEN_PROMPT_IN_RING) && g.prompt_bytes) {
		if (g.prompt_bytes > IPC_MAX_INLINE_TEXT_BYTES)
			return -E2BIG;
		iov[n++] = (struct iovec){ (void *)m->prompt, g.prompt_bytes };
	}
	if ((g.gen_flags & IPC_GEN_CONSTRAINT) && !(g.gen_flags & IPC_GEN_PROMPT_IN_RING) && m->cons.text_bytes)
		iov[n++] = (struct iovec){ (void *)m->cons_text, m->cons.text_bytes };
	ssize_t len = ipc_frame_build(buf, cap, IPC_MSG_GENERATE, 0, request_id, iov, n);
	if (len < 0)
		return len;

	/* Check our own output exactly as the server will. */
	struct ipc_frame f = { .payload = (const uint8_t *)buf + IPC_HDR_BYTES };
	int r = ipc_frame_check(buf, (size_t)len, 0, IPC_FROM_CLIENT, IPC_VIA_SOCKET, &f.hdr);
	if (r < 0)
		return r;
	struct ipc_generate_msg check;
	r = ipc_decode_generate(&f, &check);
	return r < 0 ? r : len;
}

static_assert(sizeof(struct ipc_gen_tenant) == 8 + IPC_MAX_TENANT_BYTES, "ipc_gen_tenant layout");

int ipc_gen_tenant_check(const struct ipc_gen_tenant *t)
{
	if (t->bytes == 0 || t->bytes > IPC_MAX_TENANT_BYTES)
		return -EINVAL;
	if (memchr(t->name, 0, t->bytes))
		return -EINVAL;
	if (t->reserved)
		return -EPROTO;
	for (uint32_t i = t->bytes; i < IPC_MAX_TENANT_BYTES; i++)
		if (t->name[i])
			return -EPROTO;
	return 0;
}

static_assert(sizeof(struct ipc_gen_priority) == 8, "ipc_gen_priority layout");

int ipc_gen_priority_check(const struct ipc_gen_priority *p)
{
	if (p->priority < IPC_MIN_PRIORITY || p->priority > IPC_MAX_PRIORITY)
		return -ERANGE;
	return p->reserved ? -EPROTO : 0;
}

static_assert(sizeof(struct ipc_gen_constraint) == 16, "ipc_gen_constraint layout");

int ipc_gen_constraint_check(const struct ipc_gen_constraint *k)
{
	if (k->kind < IPC_CONSTRAINT_GBNF || k->kind > IPC_CONSTRAINT_CHOICE)
		return -EINVAL;
	if (k->text_bytes > IPC_MAX_CONSTRAINT_BYTES)
		return -E2BIG;
	if (k->text_bytes == 0 && k->kind != IPC_CONSTRAINT_JSON_OBJECT)
		return -EINVAL;
	return k->flags || k->reserved ? -EPROTO : 0;
}

/* ---- chat turns ------------------------------------------------------------------ */

static_assert(IPC_CHAT_TURN_HEAD_BYTES == 8, "turn head: u8 role, u8 pad[3], u32 bytes");
static_assert((uint64_t)IPC_MAX_CHAT_TURNS * IPC_CHAT_TURN_HEAD_BYTES < IPC_MAX_TEXT_BYTES,
	      "a maximal turn count fits the prompt limit");

const char *ipc_chat_role_name(uint32_t role)
{
	switch (role) {
	case IPC_CHAT_SYSTEM: return "system";
	case IPC_CHAT_USER: return "user";
	case IPC_CHAT_ASSISTANT: return "assistant";
	case IPC_CHAT_TOOLS: return "tools";
	case IPC_CHAT_TOOL_CALLS: return "tool_calls";
	case IPC_CHAT_TOOL: return "tool";
	case IPC_CHAT_CALL_OPEN: return "call_open";
	}
	return NULL;
}

uint32_t ipc_chat_role_parse(const char *name, size_t len)
{
	for (uint32_t r = IPC_CHAT_SYSTEM; r <= IPC_CHAT_CALL_OPEN; r++) {
		const char *s = ipc_chat_role_name(r);
		if (strlen(s) == len && !memcmp(s, name, len))
			return r;
	}
	return 0;
}

int ipc_chat_turn_next(const void *buf, size_t len, size_t *off, struct ipc_chat_turn *ret)
{
	const uint8_t *b = buf;
	uint32_t bytes;

	if (*off >= len)
		return 0;
	if (len - *off < IPC_CHAT_TURN_HEAD_BYTES)
		return -EBADMSG;
	const uint8_t *h = b + *off;
	if (h[1] || h[2] || h[3])
		return -EPROTO;
	if (!ipc_chat_role_name(h[0]))
		return -EINVAL;
	memcpy(&bytes, h + 4, 4);
	if (bytes > len - *off - IPC_CHAT_TURN_HEAD_BYTES)
		return -EBADMSG;
	const char *text = (const char *)h + IPC_CHAT_TURN_HEAD_BYTES;
	if (memchr(text, 0, bytes))
		return -EINVAL;
	ret->role = h[0];
	ret->bytes = bytes;
	ret->text = text;
	*off += IPC_CHAT_TURN_HEAD_BYTES + bytes;
	return 1;
}

int ipc_chat_turns_check(const void *buf, size_t len)
{
	struct ipc_chat_turn t = { 0 };
	uint32_t before = 0; /* the role of the turn before the last */
	size_t off = 0;
	int n = 0, r;

	if (len > IPC_MAX_TEXT_BYTES)
		return -E2BIG;
	while ((r = ipc_chat_turn_next(buf, len, &off, &t)) > 0) {
		if ((unsigned)++n > IPC_MAX_CHAT_TURNS)
			return -E2BIG;
		if (off < len)
			before = t.role;
	}
	if (r < 0)
		return r;
	if (n == 0)
		return -EINVAL;
	if (t.role == IPC_CHAT_CALL_OPEN)
		t.role = n > 1 && t.bytes == 0 ? before : 0;
	if (t.role != IPC_CHAT_USER && t.role != IPC_CHAT_TOOL)
		return -EINVAL;
	return n;
}

ssize_t ipc_chat_turns_encode(void *buf, size_t cap, const struct ipc_chat_turn *turns, size_t n)
{
	uint64_t total = 0;

	if (n > IPC_MAX_CHAT_TURNS)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		if (!ipc_chat_role_name(turns[i].role) || (turns[i].bytes && !turns[i].text))
			return -EINVAL;
		if (turns[i].bytes > IPC_MAX_TEXT_BYTES)
			return -E2BIG;
		if (turns[i].bytes && memchr(turns[i].text, 0, turns[i].bytes))
			return -EINVAL;
		total += IPC_CHAT_TURN_HEAD_BYTES + turns[i].bytes;
		if (total > IPC_MAX_TEXT_BYTES)
			return -E2BIG;
	}
	if (total > cap)
		return (ssize_t)total;
	uint8_t *p = buf;
	for (size_t i = 0; i < n; i++) {
		uint8_t head[IPC_CHAT_TURN_HEAD_BYTES] = { (uint8_t)turns[i].role };
		memcpy(head + 4, &turns[i].bytes, 4);
		memcpy(p, head, sizeof(head));
		if (turns[i].bytes)
			memcpy(p + sizeof(head), turns[i].text, turns[i].bytes);
		p += sizeof(head) + turns[i].bytes;
	}
	return (ssize_t)total;
}

int ipc_decode_prompt_data(const struct ipc_frame *f, struct ipc_prompt_data_msg *ret)
{
	struct ipc_prompt_data d;

	assert(f->hdr.type == IPC_MSG_PROMPT_DATA && f->hdr.length >= sizeof(d));
	memcpy(&d, f->payload, sizeof(d));
	if (d.bytes == 0)
		return -EBADMSG;
	if (d.bytes != f->hdr.length - sizeof(d))
		return -EBADMSG;
	if (d.offset >= IPC_MAX_TEXT_BYTES || d.bytes > IPC_MAX_TEXT_BYTES - d.offset)
		return -E2BIG;
	ret->offset = d.offset;
	ret->bytes = d.bytes;
	ret->data = (const char *)f->payload + sizeof(d);
	return 0;
}

/* Check a log-probability area of n_tokens tokens with n_top alternatives each. */
static int check_lp_area(const uint8_t *p, size_t len, uint32_t n_tokens, uint32_t n_top)
{
	size_t off = 0;
	uint32_t n = 1 + n_top;

	for (uint32_t t = 0; t < n_tokens; t++) {
		size_t pieces = 0;
		if (len - off < (size_t)n * sizeof(struct ipc_logprob))
			return -EBADMSG;
		for (uint32_t i = 0; i < n; i++) {
			struct ipc_logprob e;
			memcpy(&e, p + off + i * sizeof(e), sizeof(e));
			if (e.reserved0)
				return -EPROTO;
			if (e.id < 0 || isnan(e.logprob) || e.logprob > 0.0f)
				return -EINVAL;
			if (e.piece_bytes > IPC_MAX_PIECE_BYTES)
				return -E2BIG;
			pieces += e.piece_bytes;
		}
		off += (size_t)n * sizeof(struct ipc_logprob);
		if (len - off < pieces)
			return -EBADMSG;
		off += pieces;
	}
	return off == len ? 0 : -EBADMSG;
}

int ipc_decode_token(const struct ipc_frame *f, struct ipc_token_msg *ret)
{
	struct ipc_token t;
	struct ipc_sample s = { 0 };
	bool ext = f->hdr.flags & IPC_F_SAMPLE;
	size_t head = sizeof(t) + (ext ? sizeof(s) : 0);

	assert(f->hdr.type == IPC_MSG_TOKEN && f->hdr.length >= sizeof(t));
	memcpy(&t, f->payload, sizeof(t));
	if (t.n_tokens == 0 || (t.n_ids != 0 && t.n_ids != t.n_tokens))
		return -EBADMSG;
	if (t.n_tokens > IPC_MAX_TOKENS_PER_RECORD || t.text_bytes > IPC_MAX_TOKEN_TEXT_BYTES)
		return -E2BIG;
	if (t.index > IPC_MAX_GEN_TOKENS || t.n_tokens > IPC_MAX_GEN_TOKENS - t.index)
		return -E2BIG;
	if (ext) {
		if (f->hdr.length < head)
			return -EBADMSG;
		memcpy(&s, f->payload + sizeof(t), sizeof(s));
		if (s.lp_flags & ~IPC_LP_PRESENT)
			return -EPROTO;
		if (s.sample >= IPC_MAX_SAMPLES || s.n_top > IPC_MAX_TOP_LOGPROBS)
			return -E2BIG;
		if (s.n_top && !(s.lp_flags & IPC_LP_PRESENT))
			return -EINVAL;
	}
	uint64_t fixed = (uint64_t)head + 4ull * t.n_ids + t.text_bytes;
	if (fixed > f->hdr.length || (!(s.lp_flags & IPC_LP_PRESENT) && fixed != f->hdr.length))
		return -EBADMSG;
	const uint8_t *lp = f->payload + fixed;
	uint32_t lp_bytes = f->hdr.length - (uint32_t)fixed;
	if (s.lp_flags & IPC_LP_PRESENT) {
		int r = check_lp_area(lp, lp_bytes, t.n_tokens, s.n_top);
		if (r < 0)
			return r;
	}
	ret->t = t;
	ret->ids = f->payload + head;
	ret->text = (const char *)f->payload + head + 4u * t.n_ids;
	ret->has_sample = ext;
	ret->s = s;
	ret->lp = (s.lp_flags & IPC_LP_PRESENT) ? lp : NULL;
	ret->lp_bytes = (s.lp_flags & IPC_LP_PRESENT) ? lp_bytes : 0;
	return 0;
}

int32_t ipc_token_id(const struct ipc_token_msg *m, uint32_t i)
{
	int32_t id;

	assert(i < m->t.n_ids);
	memcpy(&id, m->ids + 4u * i, 4);
	return id;
}

int ipc_decode_done_spec(const struct ipc_frame *f, struct ipc_done *ret, struct ipc_sample *ret_sample,
			 struct ipc_done_spec *ret_spec)
{
	struct ipc_done d;
	struct ipc_sample s = { 0 };
	struct ipc_done_spec sp = { 0 };
	bool ext = f->hdr.flags & IPC_F_SAMPLE, spec = f->hdr.flags & IPC_F_SPEC;

	assert(f->hdr.type == IPC_MSG_DONE && f->hdr.length >= sizeof(d));
	if (f->hdr.length != sizeof(d) + (ext ? sizeof(s) : 0) + (spec ? sizeof(sp) : 0))
		return -EBADMSG;
	memcpy(&d, f->payload, sizeof(d));
	if (spec) {
		memcpy(&sp, f->payload + sizeof(d) + (ext ? sizeof(s) : 0), sizeof(sp));
		if (sp.accepted_tokens > sp.drafted_tokens)
			return -EINVAL;
	}
	if (ext) {
		memcpy(&s, f->payload + sizeof(d), sizeof(s));
		if (s.n_top || s.lp_flags)
			return -EPROTO;
		if (s.sample >= IPC_MAX_SAMPLES)
			return -E2BIG;
	}
	if (d.finish_reason < IPC_FINISH_EOS || d.finish_reason > IPC_FINISH_ERROR)
		return -EINVAL;
	if ((d.finish_reason == IPC_FINISH_ERROR) != (d.error != 0))
		return -EINVAL;
	if (d.error && !ipc_error_code_valid(d.error))
		return -EINVAL;
	if (d.cached_tokens > d.prompt_tokens || d.generated_tokens > IPC_MAX_GEN_TOKENS)
		return -EINVAL;
	*ret = d;
	if (ret_sample)
		*ret_sample = s;
	if (ret_spec)
		*ret_spec = sp;
	return 0;
}

int ipc_decode_done_sample(const struct ipc_frame *f, struct ipc_done *ret, struct ipc_sample *ret_sample)
{
	return ipc_decode_done_spec(f, ret, ret_sample, NULL);
}

int ipc_decode_done(const struct ipc_frame *f, struct ipc_done *ret)
{
	return ipc_decode_done_sample(f, ret, NULL);
}

int ipc_decode_error(const struct ipc_frame *f, struct ipc_error_msg *ret)
{
	struct ipc_error e;

	assert(f->hdr.type == IPC_MSG_ERROR && f->hdr.length >= sizeof(e));
	memcpy(&e, f->payload, sizeof(e));
	if (!ipc_error_code_valid(e.code))
		return -EINVAL;
	if (e.msg_bytes > IPC_MAX_ERROR_MSG_BYTES)
		return -E2BIG;
	if (e.msg_bytes != f->hdr.length - sizeof(e))
		return -EBADMSG;
	ret->code = e.code;
	ret->msg_bytes = e.msg_bytes;
	ret->msg = (const char *)f->payload + sizeof(e);
	return 0;
}

int ipc_decode_stats(const struct ipc_frame *f, struct ipc_stats *ret)
{
	struct ipc_stats s;

	assert(f->hdr.type == IPC_MSG_STATS_REPLY && f->hdr.length >= IPC_STATS_V070_BYTES);
	if (f->hdr.length > IPC_MAX_STATS_BYTES || f->hdr.length % sizeof(uint64_t))
		return -EBADMSG;
	memset(&s, 0, sizeof(s)); /* fields an older daemon does not send read as 0 */
	memcpy(&s, f->payload, f->hdr.length < sizeof(s) ? f->hdr.length : sizeof(s));
	/* Counts that cannot hold in any pool mean a corrupt reply. */
	if (s.pages_free > s.pages_total || s.pages_used > s.pages_total || s.pages_cached > s.pages_total ||
	    s.pages_shared > s.pages_used || s.pages_packed > s.pages_used)
		return -EINVAL;
	if (s.prefix_hit_tokens > s.prefix_query_tokens || s.adopted_hit_tokens > s.prefix_hit_tokens ||
	    s.spec_accepted_tokens > s.spec_drafted_tokens)
		return -EINVAL;
	*ret = s;
	return 0;
}

int ipc_decode_tokenize(const struct ipc_frame *f, struct ipc_tokenize_msg *ret)
{
	struct ipc_tokenize t;

	assert(f->hdr.type == IPC_MSG_TOKENIZE && f->hdr.length >= sizeof(t));
	memcpy(&t, f->payload, sizeof(t));
	if (t.tok_flags & ~IPC_TOK_ALL)
		return -EPROTO;
	if (t.text_bytes > IPC_MAX_TEXT_BYTES)
		return -E2BIG;
	bool in_ring = t.tok_flags & IPC_TOK_TEXT_IN_RING;
	if (in_ring) {
		if (t.text_bytes == 0)
			return -EINVAL;
		if (f->hdr.length != sizeof(t))
			return -EBADMSG;
		ret->text = NULL;
	} else {
		if (t.text_bytes > IPC_MAX_INLINE_TEXT_BYTES)
			return -E2BIG;
		if (f->hdr.length != sizeof(t) + t.text_bytes)
			return -EBADMSG;
		ret->text = (const char *)f->payload + sizeof(t);
	}
	ret->t = t;
	return 0;
}

int ipc_decode_tokenize_reply(const struct ipc_frame *f, struct ipc_tokenize_reply_msg *ret)
{
	struct ipc_tokenize_reply r;

	assert(f->hdr.type == IPC_MSG_TOKENIZE_REPLY && f->hdr.length >= sizeof(r));
	memcpy(&r, f->payload, sizeof(r));
	if (r.reserved0)
		return -EPROTO;
	if (r.n_ids > IPC_MAX_IDS_PER_FRAME)
		return -E2BIG;
	if (r.offset > r.n_tokens || r.n_ids > r.n_tokens - r.offset)
		return -EBADMSG;
	if (f->hdr.length != sizeof(r) + 4ull * r.n_ids)
		return -EBADMSG;
	ret->r = r;
	ret->ids = f->payload + sizeof(r);
	ret->more = f->hdr.flags & IPC_F_MORE;
	return 0;
}

int32_t ipc_reply_id(const struct ipc_tokenize_reply_msg *m, uint32_t i)
{
	int32_t id;

	assert(i < m->r.n_ids);
	memcpy(&id, m->ids + 4u * i, 4);
	return id;
}

int ipc_decode_session_open_ctx(const struct ipc_frame *f, struct ipc_session_open *ret,
				struct ipc_gen_context *ret_ctx)
{
	struct ipc_session_open s;
	struct ipc_gen_context c = {0};

	assert(f->hdr.type == IPC_MSG_SESSION_OPEN && f->hdr.length >= sizeof(s));
	memcpy(&s, f->payload, sizeof(s));
	if (s.flags & ~IPC_SESSION_CONTEXT)
		return -EPROTO;
	if (f->hdr.length != sizeof(s) + (s.flags & IPC_SESSION_CONTEXT ? sizeof(c) : 0))
		return -EBADMSG;
	if (s.flags & IPC_SESSION_CONTEXT) {
		memcpy(&c, f->payload + sizeof(s), sizeof(c));
		int r = ipc_gen_context_check(&c);
		if (r < 0)
			return r;
	}
	*ret = s;
	if (ret_ctx)
		*ret_ctx = c;
	return 0;
}

int ipc_decode_session_open(const struct ipc_frame *f, struct ipc_session_open *ret)
{
	return ipc_decode_session_open_ctx(f, ret, NULL);
}

int ipc_gen_context_check(const struct ipc_gen_context *c)
{
	if (c->reserved0)
		return -EPROTO;
	if (c->policy > IPC_CTX_POLICY_MAX)
		return -EINVAL;
	if (c->window_tokens > IPC_MAX_CONTEXT_TOKENS || c->sink_tokens > IPC_MAX_CONTEXT_TOKENS)
		return -E2BIG;
	if (c->sink_tokens && c->policy != IPC_CTX_SINKS)
		return -EINVAL;
	if (c->window_tokens && c->policy != IPC_CTX_SINKS && c->policy != IPC_CTX_SLIDING_WINDOW)
		return -EINVAL;
	return 0;
}

static const char *const ctx_policy_names[] = {"error", "truncate-oldest", "sliding-window", "sinks"};

const char *ipc_context_policy_name(uint32_t policy)
{
	return policy <= IPC_CTX_POLICY_MAX ? ctx_policy_names[policy] : NULL;
}

int ipc_context_policy_parse(const char *name)
{
	for (int i = 0; i <= (int)IPC_CTX_POLICY_MAX; i++)
		if (name && !strcmp(name, ctx_policy_names[i]))
			return i;
	return -EINVAL;
}

int ipc_decode_session(const struct ipc_frame *f, struct ipc_session *ret)
{
	struct ipc_session s;

	assert((f->hdr.type == IPC_MSG_SESSION_OPENED || f->hdr.type == IPC_MSG_SESSION_CLOSE ||
		f->hdr.type == IPC_MSG_SESSION_CLOSED) &&
	       f->hdr.length == sizeof(s));
	memcpy(&s, f->payload, sizeof(s));
	if (s.session_id == 0)
		return -EINVAL;
	*ret = s;
	return 0;
}

int ipc_decode_ping(const struct ipc_frame *f, struct ipc_ping *ret)
{
	assert((f->hdr.type == IPC_MSG_PING || f->hdr.type == IPC_MSG_PONG) && f->hdr.length == sizeof(*ret));
	memcpy(ret, f->payload, sizeof(*ret));
	return 0;
}

int ipc_decode_ps_reply(const struct ipc_frame *f, struct ipc_ps_reply_msg *ret)
{
	struct ipc_ps_reply r;

	assert(f->hdr.type == IPC_MSG_PS_REPLY && f->hdr.length >= sizeof(r));
	memcpy(&r, f->payload, sizeof(r));
	if (r.n_entries > IPC_MAX_PS_PER_FRAME)
		return -E2BIG;
	if (r.n_entries > r.n_total)
		return -EBADMSG;
	if (f->hdr.length != sizeof(r) + (uint64_t)r.n_entries * sizeof(struct ipc_ps_entry))
		return -EBADMSG;
	for (uint32_t i = 0; i < r.n_entries; i++) {
		struct ipc_ps_entry e;
		memcpy(&e, f->payload + sizeof(r) + i * sizeof(e), sizeof(e));
		if (e.sample >= IPC_MAX_SAMPLES)
			return -E2BIG;
		if (e.state < IPC_REQ_WAITING || e.state > IPC_REQ_UPLOADING || e.pages_shared > e.pages ||
		    e.cached_tokens > e.prompt_tokens)
			return -EINVAL;
	}
	ret->r = r;
	ret->entries = f->payload + sizeof(r);
	ret->more = f->hdr.flags & IPC_F_MORE;
	return 0;
}

void ipc_ps_entry_at(const struct ipc_ps_reply_msg *m, uint32_t i, struct ipc_ps_entry *ret)
{
	assert(i < m->r.n_entries);
	memcpy(ret, m->entries + (size_t)i * sizeof(*ret), sizeof(*ret));
}
