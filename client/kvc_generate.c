/*
 * client/kvc_generate.c — libkvclient's generation requests: parameters,
 * the conversation as the wire's turn list, starting a request (GENERATE
 * and its prompt upload), the event stream, the result, cancel, and the
 * blocking kvc_generate().
 */
#include <assert.h>
#include <stddef.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kvclient.h"
#include "ipc.h"
#include "kvc_impl.h"

/* Everything defined from here on is internal unless kvclient.h declared
 * it with KVC_EXPORT (an explicit attribute beats the pragma). */
#pragma GCC visibility push(hidden)

/* ---- generation -------------------------------------------------------------------------- */

void kvc_gen_params_init(struct kvc_gen_params *p)
{
	memset(p, 0, sizeof(*p));
	p->max_tokens = 256;
	p->temperature = 0.8f;
	p->top_p = 0.95f;
	p->top_k = 40;
	p->min_p = 0.05f;
	p->repeat_penalty = 1.0f;
	p->repeat_last_n = 64;
	p->seed = KVC_SEED_RANDOM;
}

const char *kvc_finish_name(int reason)
{
	return ipc_finish_name((uint32_t)reason);
}

const char *kvc_req_state_name(int state)
{
	return ipc_req_state_name((uint32_t)state);
}

static_assert(KVC_MAX_CHAT_MSGS == IPC_MAX_CHAT_TURNS, "message count limit is the wire's");
static_assert(KVC_MIN_PRIORITY == IPC_MIN_PRIORITY && KVC_MAX_PRIORITY == IPC_MAX_PRIORITY, "priority range is the wire's");
static_assert(sizeof(void *) != 8 || sizeof(struct kvc_gen_params) == 136, "kvc_gen_params keeps its size");
static_assert(sizeof(void *) != 8 || offsetof(struct kvc_gen_params, constraint) == 128, "kvc_gen_params layout");
static_assert(KVC_MAX_CONSTRAINT_BYTES == IPC_MAX_CONSTRAINT_BYTES, "constraint limit is the wire's");
static_assert((int)KVC_CONSTRAINT_GBNF == (int)IPC_CONSTRAINT_GBNF &&
		      (int)KVC_CONSTRAINT_JSON_SCHEMA == (int)IPC_CONSTRAINT_JSON_SCHEMA &&
		      (int)KVC_CONSTRAINT_JSON_OBJECT == (int)IPC_CONSTRAINT_JSON_OBJECT &&
		      (int)KVC_CONSTRAINT_REGEX == (int)IPC_CONSTRAINT_REGEX &&
		      (int)KVC_CONSTRAINT_CHOICE == (int)IPC_CONSTRAINT_CHOICE,
	      "constraint kinds are the wire's");

/* The constraint block of p's constraint (none: 0 and nothing set): its
 * checks before anything is sent. */
static int build_constraint(const kvc_client *c, const struct kvc_constraint *k, struct ipc_generate_msg *m)
{
	if (!k)
		return 0;
	if (k->kind < KVC_CONSTRAINT_GBNF || k->kind > KVC_CONSTRAINT_CHOICE || k->flags || k->reserved[0] ||
	    k->reserved[1])
		return -EINVAL;
	if (!k->text && (k->kind != KVC_CONSTRAINT_JSON_OBJECT || (k->len && k->len != KVC_NTS)))
		return -EINVAL;
	size_t len = !k->text ? 0 : k->len == KVC_NTS ? strnlen(k->text, KVC_MAX_CONSTRAINT_BYTES + 1) : k->len;
	if (len > KVC_MAX_CONSTRAINT_BYTES)
		return -E2BIG;
	if (len == 0 && k->kind != KVC_CONSTRAINT_JSON_OBJECT)
		return -EINVAL;
	if (c->info.server_version < IPC_CONSTRAINT_SERVER_VERSION)
		return -EOPNOTSUPP;
	m->g.gen_flags |= IPC_GEN_CONSTRAINT;
	m->cons = (struct ipc_gen_constraint){ .kind = k->kind, .text_bytes = (uint32_t)len };
	m->cons_text = len ? k->text : NULL;
	return 0;
}
static_assert(KVC_GEN_NO_SPECULATE == IPC_GEN_NO_SPECULATE, "the opt-out flag is the wire's");
static_assert(KVC_GEN_LOGPROBS == IPC_GEN_LOGPROBS && KVC_MAX_SAMPLES == IPC_MAX_SAMPLES &&
		      KVC_MAX_TOP_LOGPROBS == IPC_MAX_TOP_LOGPROBS,
	      "flags and limits are the wire's");

/* The conversation in p as the wire's turn list, in a fresh buffer
 * (*ret, free()d by the caller); its size in *ret_len. */
static int encode_turns(const kvc_client *c, const struct kvc_gen_params *p, char **ret, size_t *ret_len)
{
	struct ipc_chat_turn *t;
	ssize_t n;
	char *buf = NULL;

	if (!p->messages || p->n_messages == 0) /* one without the other: an empty conversation */
		return -EINVAL;
	if (p->n_messages > KVC_MAX_CHAT_MSGS)
		return -E2BIG;
	if ((p->flags & (KVC_GEN_RAW | KVC_GEN_PARSE_SPECIAL)) || p->system || p->session_id)
		return -EINVAL;
	if (c->info.server_version < IPC_CHAT_TURNS_SERVER_VERSION)
		return -EOPNOTSUPP;
	t = calloc(p->n_messages, sizeof(*t));
	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < p->n_messages; i++) {
		const struct kvc_chat_msg *m = &p->messages[i];
		if (!m->role || !m->content) {
			n = -EINVAL;
			goto out;
		}
		size_t len = strlen(m->content);
		if (len > IPC_MAX_TEXT_BYTES) {
			n = -E2BIG;
			goto out;
		}
		t[i] = (struct ipc_chat_turn){ ipc_chat_role_parse(m->role, strlen(m->role)), (uint32_t)len, m->content };
		if (!t[i].role) {
			n = -EINVAL;
			goto out;
		}
		if ((t[i].role >= IPC_CHAT_TOOLS && c->info.server_version < IPC_CHAT_TOOLS_SERVER_VERSION) ||
		    (t[i].role == IPC_CHAT_CALL_OPEN && c->info.server_version < IPC_CHAT_CALL_OPEN_SERVER_VERSION)) {
			n = -EOPNOTSUPP;
			goto out;
		}
	}
	uint32_t last = t[p->n_messages - 1].role;
	if (last == IPC_CHAT_CALL_OPEN) /* the reply's start, after the turn it answers */
		last = p->n_messages > 1 && t[p->n_messages - 1].bytes == 0 ? t[p->n_messages - 2].role : 0;
	if (last != IPC_CHAT_USER && last != IPC_CHAT_TOOL) {
		n = -EINVAL;
		goto out;
	}
	n = ipc_chat_turns_encode(NULL, 0, t, p->n_messages);
	if (n < 0)
		goto out;
	if ((size_t)n > c->info.max_prompt_bytes) {
		n = -E2BIG;
		goto out;
	}
	buf = malloc((size_t)n);
	if (!buf) {
		n = -ENOMEM;
		goto out;
	}
	ipc_chat_turns_encode(buf, (size_t)n, t, p->n_messages);
	*ret = buf;
	*ret_len = (size_t)n;
out:
	free(t);
	return n < 0 ? (int)n : 0;
}

static int build_generate(const kvc_client *c, const char *prompt, size_t len, const struct kvc_gen_params *p,
			  bool turns, struct ipc_generate_msg *m)
{
	memset(m, 0, sizeof(*m));
	if (p->flags & ~(KVC_GEN_RAW | KVC_GEN_WANT_IDS | KVC_GEN_PARSE_SPECIAL | KVC_GEN_LOGPROBS | KVC_GEN_NO_SPECULATE))
		return -EINVAL;
	/* (a daemon older than the opt-out never speculates: the flag is
	 * honoured by not sending it, which that daemon would refuse) */
	bool no_spec = (p->flags & KVC_GEN_NO_SPECULATE) && c->info.server_version >= IPC_SPEC_VERSION;
	if (p->n_samples > KVC_MAX_SAMPLES || p->top_logprobs > KVC_MAX_TOP_LOGPROBS ||
	    (p->top_logprobs && !(p->flags & KVC_GEN_LOGPROBS)) || (p->n_samples > 1 && p->session_id))
		return -EINVAL;
	if ((p->n_samples > 1 || (p->flags & KVC_GEN_LOGPROBS)) && c->info.server_version < IPC_SAMPLES_SERVER_VERSION)
		return -EOPNOTSUPP;
	if ((p->flags & KVC_GEN_PARSE_SPECIAL) && !(p->flags & KVC_GEN_RAW))
		return -EINVAL;
	if (p->n_stop > IPC_MAX_STOP_STRINGS)
		return -E2BIG;
	if (p->n_stop && !p->stop)
		return -EINVAL;
	if (len > IPC_MAX_TEXT_BYTES || len > c->info.max_prompt_bytes)
		return -E2BIG;
	/* the announced limit is the context's; a window policy may run past it */
	bool windowed = p->context_policy == KVC_CONTEXT_SLIDING_WINDOW || p->context_policy == KVC_CONTEXT_SINKS;
	if (p->max_tokens > c->info.max_tokens && c->info.max_tokens && !windowed)
		return -E2BIG;
	m->g.gen_flags = (p->flags & ~(uint32_t)KVC_GEN_NO_SPECULATE) | (no_spec ? IPC_GEN_NO_SPECULATE : 0) |
			 (turns ? IPC_GEN_CHAT_TURNS : 0);
	m->g.max_tokens = p->max_tokens;
	m->g.temperature = p->temperature;
	m->g.top_p = p->top_p;
	m->g.top_k = p->top_k;
	m->g.min_p = p->min_p;
	m->g.repeat_penalty = p->repeat_penalty;
	m->g.repeat_last_n = p->repeat_last_n;
	m->g.seed = p->seed;
	m->g.session_id = p->session_id;
	m->g.n_samples = (uint8_t)p->n_samples;
	m->g.top_logprobs = (uint8_t)p->top_logprobs;
	m->g.prompt_bytes = (uint32_t)len;
	if (p->system) {
		size_t n = strlen(p->system);
		if (n > IPC_MAX_SYSTEM_BYTES)
			return -E2BIG;
		m->system = p->system;
		m->g.system_bytes = (uint32_t)n;
	}
	m->g.n_stop = (uint16_t)p->n_stop;
	for (size_t i = 0; i < p->n_stop; i++) {
		if (!p->stop[i])
			return -EINVAL;
		size_t n = strlen(p->stop[i]);
		if (n == 0)
			return -EINVAL;
		if (n > IPC_MAX_STOP_BYTES)
			return -E2BIG;
		m->stop[i] = p->stop[i];
		m->stop_len[i] = (uint16_t)n;
	}
	if (p->context_policy != KVC_CONTEXT_ERROR || p->context_window || p->context_sinks) {
		m->g.gen_flags |= IPC_GEN_CONTEXT;
		m->ctx = (struct ipc_gen_context){ p->context_policy, p->context_window, p->context_sinks, 0 };
		int r = ipc_gen_context_check(&m->ctx);
		if (r < 0 || p->reserved_ctx)
			return r < 0 ? r : -EINVAL;
	}
	if (p->tenant) {
		size_t n = strnlen(p->tenant, IPC_MAX_TENANT_BYTES + 1);

		if (n == 0 || n > IPC_MAX_TENANT_BYTES)
			return -EINVAL;
		if (c->info.server_version < IPC_TENANT_SERVER_VERSION)
			return -EOPNOTSUPP;
		m->g.gen_flags |= IPC_GEN_TENANT;
		m->tenant.bytes = (uint32_t)n;
		memcpy(m->tenant.name, p->tenant, n);
	}
	if (p->priority || p->reserved_prio) {
		if (p->reserved_prio)
			return -EINVAL;
		if (p->priority < KVC_MIN_PRIORITY || p->priority > KVC_MAX_PRIORITY)
			return -ERANGE;
		if (c->info.server_version < IPC_TENANT_SERVER_VERSION)
			return -EOPNOTSUPP;
		m->g.gen_flags |= IPC_GEN_PRIORITY;
		m->prio.priority = p->priority;
	}
	int r = build_constraint(c, p->constraint, m);
	if (r < 0)
		return r;
	/* Prompt and constraint text go inline together when they fit, else
	 * both through the ring (the constraint's text after the prompt). */
	if (len > IPC_MAX_INLINE_TEXT_BYTES || len + m->cons.text_bytes > IPC_MAX_INLINE_TEXT_BYTES)
		m->g.gen_flags |= IPC_GEN_PROMPT_IN_RING;
	else
		m->prompt = prompt;
	return 0;
}

const char *kvc_context_policy_name(uint32_t policy)
{
	return ipc_context_policy_name(policy);
}

int kvc_context_policy_parse(const char *name)
{
	return ipc_context_policy_parse(name);
}

int kvc_request_start(kvc_client *c, const char *prompt, size_t prompt_len, const struct kvc_gen_params *p,
		      kvc_request **ret)
{
	struct kvc_gen_params defaults;
	struct ipc_generate_msg m;

	if (!c || !ret || (!prompt && prompt_len))
		return -EINVAL;
	if (c->dead)
		return c->dead;
	if (!p) {
		kvc_gen_params_init(&defaults);
		p = &defaults;
	}
	if (!prompt)
		prompt = "";
	if (prompt_len == KVC_NTS)
		prompt_len = strlen(prompt);
	char *turns = NULL; /* the conversation, encoded: sent as the prompt */
	bool with_turns = p->n_messages > 0 || p->messages;
	if (with_turns) {
		if (prompt_len)
			return -EINVAL;
		int e = encode_turns(c, p, &turns, &prompt_len);
		if (e < 0)
			return e;
		prompt = turns;
	}
	int r = build_generate(c, prompt, prompt_len, p, with_turns, &m);
	if (r < 0) {
		free(turns);
		return r;
	}
	kvc_request *q = calloc(1, sizeof(*q));
	if (!q) {
		free(turns);
		return -ENOMEM;
	}
	q->c = c;
	q->id = ++c->next_id;
	q->n_samples = p->n_samples > 1 ? p->n_samples : 1;
	q->logprobs = p->flags & KVC_GEN_LOGPROBS;
	q->top_logprobs = p->top_logprobs;
	q->ext = q->n_samples > 1 || q->logprobs;
	if (q->ext) {
		q->sample_res = calloc(q->n_samples, sizeof(*q->sample_res));
		q->sample_done = calloc(q->n_samples, 1);
		if (!q->sample_res || !q->sample_done) {
			free(q->sample_res);
			free(q->sample_done);
			free(q);
			free(turns);
			return -ENOMEM;
		}
	}
	if ((m.g.gen_flags & IPC_GEN_PROMPT_IN_RING) && m.cons.text_bytes) {
		/* one upload: the prompt, then the constraint's text */
		char *both = malloc(prompt_len + m.cons.text_bytes);
		if (!both) {
			free(q->sample_res);
			free(q->sample_done);
			free(q);
			free(turns);
			return -ENOMEM;
		}
		memcpy(both, prompt, prompt_len);
		memcpy(both + prompt_len, m.cons_text, m.cons.text_bytes);
		free(turns);
		turns = both;
		prompt = both;
		prompt_len += m.cons.text_bytes;
		m.prompt = NULL;
	}
	r = (int)ipc_encode_generate(c->txbuf, IPC_MAX_FRAME_BYTES, q->id, &m);
	if (r < 0) {
		free(q->sample_res);
		free(q->sample_done);
		free(q);
		free(turns);
		return r == -EBADMSG || r == -EPROTO ? -EINVAL : r;
	}
	/* Send the checked payload through the regular path, which adds the
	 * same header again. */
	struct iovec v = { c->txbuf + IPC_HDR_BYTES, (size_t)r - IPC_HDR_BYTES };
	/* Register first: a reply may arrive while the upload runs. */
	q->next = c->reqs;
	if (c->reqs)
		c->reqs->prev = q;
	c->reqs = q;
	r = send_frame(c, IPC_MSG_GENERATE, q->id, &v, 1, deadline_in(c->timeout_ms));
	if (r == 0 && (m.g.gen_flags & IPC_GEN_PROMPT_IN_RING))
		r = upload(c, q->id, prompt, prompt_len);
	free(turns);
	if (r < 0) {
		kvc_request_finish(q);
		return r;
	}
	*ret = q;
	return 0;
}

int kvc_request_next(kvc_request *r, const struct kvc_event **ret_ev)
{
	if (!r || !ret_ev)
		return -EINVAL;
	free(r->cur);
	r->cur = NULL;
	if (!r->head && !r->finished) {
		int s = pump(r->c, req_ready, r, deadline_in(r->c->timeout_ms), false, 0);
		if (s < 0 && !req_ready(r->c, r))
			return s;
	}
	if (r->head) {
		r->cur = r->head;
		r->head = r->head->next;
		if (!r->head)
			r->tail = NULL;
		*ret_ev = &r->cur->ev;
		return 1;
	}
	return r->status;
}

uint64_t kvc_request_id(const kvc_request *r)
{
	return r->id;
}

const struct kvc_result *kvc_request_result(const kvc_request *r)
{
	return r->finished && !r->head ? &r->result : NULL;
}

const struct kvc_result *kvc_request_sample_result(const kvc_request *r, uint32_t i)
{
	if (!r || !r->finished || r->head || i >= r->n_samples)
		return NULL;
	return r->sample_res ? &r->sample_res[i] : &r->result;
}

kvc_request *kvc_request_finish(kvc_request *r)
{
	if (!r)
		return NULL;
	kvc_client *c = r->c;
	if (!r->finished && !c->dead)
		kvc_cancel(c, r->id);
	if (r->prev)
		r->prev->next = r->next;
	else
		c->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
	free(r->cur);
	while (r->head) {
		struct evnode *e = r->head;
		r->head = e->next;
		free(e);
	}
	free(r->sample_res);
	free(r->sample_done);
	free(r);
	return NULL;
}

int kvc_cancel(kvc_client *c, uint64_t request_id)
{
	/* Async-signal-safe: a stack frame and one send(); no allocation, no
	 * client state but the fd, which is constant for the client's life. */
	struct ipc_hdr h = {
		.magic = IPC_MAGIC,
		.version = IPC_PROTO_VERSION,
		.type = IPC_MSG_CANCEL,
		.request_id = request_id,
	};
	if (!c || request_id == 0)
		return -EINVAL;
	int saved = errno;
	ssize_t n = send(c->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
	int r = n == (ssize_t)sizeof(h) ? 0 : n >= 0 ? -EIO : errno == EWOULDBLOCK ? -EAGAIN : -errno;
	errno = saved;
	return r;
}

int kvc_generate(kvc_client *c, const char *prompt, size_t prompt_len, const struct kvc_gen_params *p,
		 kvc_token_fn fn, void *userdata, struct kvc_result *ret_result)
{
	kvc_request *q;
	const struct kvc_event *ev;
	bool cancelled = false;
	int r;

	r = kvc_request_start(c, prompt, prompt_len, p, &q);
	if (r < 0)
		return r;
	while ((r = kvc_request_next(q, &ev)) == 1) {
		if (!cancelled && fn && fn(userdata, ev) != 0) {
			cancelled = true;
			kvc_cancel(c, q->id);
		}
	}
	if (ret_result) {
		const struct kvc_result *res = kvc_request_result(q);
		if (res) {
			*ret_result = *res;
		} else { /* timed out: the request is abandoned below */
			memset(ret_result, 0, sizeof(*ret_result));
			ret_result->finish_reason = KVC_FINISH_ERROR;
			ret_result->error = r;
		}
	}
	kvc_request_finish(q);
	return cancelled ? -ECANCELED : r;
}
