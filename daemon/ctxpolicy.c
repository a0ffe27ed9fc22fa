/*
 * daemon/ctxpolicy.c — context policies on the server side: which policy a
 * request runs under (its own GENERATE block, else its session's), the
 * truncate-oldest policy of sessions, and the messages of refusals.
 *
 * truncate-oldest works on turn boundaries in a session's token history:
 * the first turn's head (the template's system block, up to and including
 * its end-of-turn token) is kept for ever, and whole turns after it are
 * removed, oldest first, until the new turn and its max_tokens fit. A turn
 * boundary is where a continuation turn's text begins: right after the
 * assistant's end-of-turn token, so the history stays a well-formed
 * conversation (system block, then the kept turns). When the template has
 * no separate system block (its system text lives inside the first user
 * turn), the whole first turn is kept instead. The KV of a truncated
 * session is recomputed (its head comes from the prefix cache).
 *
 * The window policies (sliding-window, sinks) are the scheduler's and the
 * engine's (daemon/engine.h); here they are only passed on.
 */
#include "server_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "request.h"
#include "tokenizer.h"

void ctx_request_params(const struct greq *gr, struct kvd_request_params *p)
{
	p->ctx_policy = gr->ctx.policy;
	p->ctx_window = gr->ctx.window_tokens;
	p->ctx_sinks = gr->ctx.sink_tokens;
}

void ctx_server_default(const struct kvd_server *srv, struct ipc_gen_context *ret)
{
	int policy = ipc_context_policy_parse(srv->cfg.context_policy); /* checked by the config parser */

	*ret = (struct ipc_gen_context){0};
	if (policy <= 0)
		return;
	ret->policy = (uint32_t)policy;
	if (policy == IPC_CTX_SLIDING_WINDOW || policy == IPC_CTX_SINKS)
		ret->window_tokens = srv->cfg.context_window;
	if (policy == IPC_CTX_SINKS)
		ret->sink_tokens = srv->cfg.context_sinks;
}

static uint32_t common_prefix(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb)
{
	uint32_t i = 0;
	while (i < na && i < nb && a[i] == b[i])
		i++;
	return i;
}

/* Tokens of the first turn rendered with `user` instead of the real text,
 * and their common prefix with ids; UINT32_MAX when it cannot be rendered. */
static uint32_t prefix_with(struct kvd_server *srv, const char *system, const char *user, const int32_t *ids,
			    uint32_t n)
{
	int32_t *alt = NULL;
	int m = kvd_request_chat_turn(srv->tok, system, user, 0, -1, KVD_REQUEST_ALL, &alt, NULL, 0);
	uint32_t p = UINT32_MAX;

	if (m >= 0)
		p = common_prefix(ids, n, alt, (uint32_t)m);
	free(alt);
	return p;
}

uint32_t ctx_first_turn_head(struct kvd_server *srv, const char *system, const int32_t *ids, uint32_t n)
{
	/* what the first turn shares with the same turn for other user texts
	 * is the template's part before the user text (two probes: the real
	 * text may equal one) */
	uint32_t a = prefix_with(srv, system, "a", ids, n), b = prefix_with(srv, system, "b", ids, n);
	uint32_t p = a < b ? a : b;

	if (p == UINT32_MAX)
		return UINT32_MAX;
	for (uint32_t i = p; i-- > 0;)
		if (kvd_request_is_eog(srv->tok, ids[i]))
			return i + 1; /* the system block, with its end-of-turn token */
	if (system && *system)
		return UINT32_MAX; /* no separate system block: keep the whole first turn */
	return n && ids[0] == kvd_tokenizer_bos(kvd_model_tokenizer(kvd_engine_model(srv->e))) ? 1 : 0;
}

int ctx_truncate_oldest(struct kvd_server *srv, struct greq *gr, uint32_t *hist, uint64_t need, char *why,
			size_t why_cap)
{
	struct session *s = gr->sess;
	uint32_t keep, first = 1, k, end, inside = 0, out = 0;

	if (!s || gr->ctx.policy != IPC_CTX_TRUNCATE_OLDEST || !s->n_turn_start) {
		snprintf(why, why_cap, "no earlier turn to drop");
		return -E2BIG;
	}
	/* turn_start[0] is 0 (the first turn), turn_start[k] the start of
	 * turn k; the range dropped is [keep, a later turn's start or hist) */
	keep = s->head_tokens;
	if (keep == UINT32_MAX) { /* no separate system block: the first turn stays */
		if (s->n_turn_start < 2) {
			snprintf(why, why_cap, "the first turn, which holds the system prompt, is kept");
			return -E2BIG;
		}
		keep = s->turn_start[1];
		first = 2;
	}
	for (k = first; k < s->n_turn_start; k++)
		if (s->turn_start[k] > keep && need - (s->turn_start[k] - keep) <= srv->n_ctx)
			break;
	end = k < s->n_turn_start ? s->turn_start[k] : *hist;
	if (end <= keep || need - (end - keep) > srv->n_ctx) {
		snprintf(why, why_cap, "even without its earlier turns the session needs %llu tokens",
			 (unsigned long long)(need - (end > keep ? end - keep : 0)));
		return -E2BIG;
	}
	int r = kvd_sched_session_truncate(srv->sched, s->id, keep, end - keep);
	if (r < 0) {
		snprintf(why, why_cap, "cannot truncate the session: %s", strerror(-r));
		return r;
	}
	/* forget the boundaries removed, move the later ones down */
	for (uint32_t i = 0; i < s->n_turn_start; i++) {
		uint32_t b = s->turn_start[i];
		if (b > keep && b < end) {
			inside++;
			continue;
		}
		s->turn_start[out++] = b >= end ? b - (end - keep) : b;
	}
	s->n_turn_start = out;
	gr->trunc_turns += inside + 1; /* the turn cut at keep, and those begun inside */
	gr->trunc_tokens += end - keep;
	*hist -= end - keep;
	return 0;
}

void ctx_turn_done(struct session *s, const struct greq *gr)
{
	if (s->n_turn_start == s->cap_turn_start) {
		uint32_t cap = s->cap_turn_start ? 2 * s->cap_turn_start : 16;
		uint32_t *t = realloc(s->turn_start, cap * sizeof(*t));
		if (!t)
			return; /* truncation then sees fewer boundaries: it drops more at once */
		s->turn_start = t;
		s->cap_turn_start = cap;
	}
	if (s->n_turn_start == 0)
		s->head_tokens = gr->head_tokens;
	s->turn_start[s->n_turn_start++] = gr->turn_start;
}

const char *ctx_refusal(struct kvd_server *srv, const struct greq *gr, int r, char *buf, size_t cap)
{
	const char *name = ipc_context_policy_name(gr->ctx.policy);

	char why[256];

	if (r == -ENOTSUP)
		snprintf(buf, cap, "context policy %s needs %s", name, kvd_engine_shift_refusal(srv->e, why, sizeof(why)));
	else if (r == -E2BIG)
		snprintf(buf, cap,
			 "context policy %s: %u sink and %u window tokens (0: default) do not fit the context of %u "
			 "tokens with the KV page size of %u",
			 name, gr->ctx.sink_tokens, gr->ctx.window_tokens, srv->n_ctx,
			 kvd_engine_kv_layout(srv->e)->block_size);
	else
		snprintf(buf, cap, "context policy %s: %s", name, strerror(-r));
	return buf;
}
