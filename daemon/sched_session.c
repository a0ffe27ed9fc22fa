/*
 * daemon/sched_session.c — the scheduler's finished sessions (kept KV
 * between turns: close, truncate, expire, reclaim under memory pressure)
 * and what it reports (idle, stats, the request list).
 */
#include <errno.h>
#include <string.h>

#include "kvmm.h"
#include "sched_impl.h"

int kvd_sched_session_close(struct kvd_sched *s, uint64_t session)
{
	size_t i;
	struct req *r = sched_find_session(s, session, &i);
	if (!r)
		return -ENOENT;
	if (r->state != RS_SESSION)
		return -EBUSY;
	sched_remove_at(s, i);
	sched_drop_seq(s, r);
	req_free(r);
	return 0;
}

int kvd_sched_session_truncate(struct kvd_sched *s, uint64_t session, uint32_t keep, uint32_t drop)
{
	struct req *r = sched_find_session(s, session, NULL);

	if (!r)
		return -ENOENT;
	if (r->state != RS_SESSION)
		return -EBUSY;
	if (!drop || (uint64_t)keep + drop > r->n_toks)
		return -EINVAL;
	memmove(r->toks + keep, r->toks + keep + drop, (r->n_toks - keep - drop) * sizeof(*r->toks));
	r->n_toks -= drop;
	sched_drop_seq(s, r);
	return 0;
}

int kvd_sched_session_tokens(const struct kvd_sched *s, uint64_t session)
{
	struct req *r = sched_find_session(s, session, NULL);
	if (!r || r->state != RS_SESSION)
		return -ENOENT;
	return (int)r->n_toks;
}

int kvd_sched_session_touch(struct kvd_sched *s, uint64_t session)
{
	struct req *r = sched_find_session(s, session, NULL);
	if (!r || r->state != RS_SESSION)
		return -ENOENT;
	r->t_used = sched_now_ns(s);
	return 0;
}

int kvd_sched_session_last_token(const struct kvd_sched *s, uint64_t session)
{
	struct req *r = sched_find_session(s, session, NULL);
	if (!r || r->state != RS_SESSION || !r->n_toks)
		return -ENOENT;
	return r->toks[r->n_toks - 1];
}

/* Give up the KV of the least recently used idle session that still holds
 * pages; its tokens stay, to be recomputed by its next turn. Returns 1 when
 * one was dropped, 0 when none holds pages. */
int sched_reclaim_session(struct kvd_sched *s)
{
	struct req *v = NULL;
	for (size_t i = 0; i < s->n_reqs; i++) {
		struct req *r = s->reqs[i];
		if (r->state == RS_SESSION && r->has_seq && (!v || r->t_used < v->t_used))
			v = r;
	}
	if (!v)
		return 0;
	sched_drop_seq(s, v);
	return 1;
}

int kvd_sched_expire_sessions(struct kvd_sched *s)
{
	uint64_t t = sched_now_ns(s);
	int n = 0;

	for (size_t i = 0; i < s->n_reqs;) {
		struct req *r = s->reqs[i];
		uint64_t idle_ns = (uint64_t)(r->idle_s ? r->idle_s : s->cfg.session_idle_s) * 1000000000ull;
		if (r->state == RS_SESSION && idle_ns && t - r->t_used > idle_ns) {
			uint64_t session = r->session;
			sched_remove_at(s, i);
			sched_drop_seq(s, r);
			req_free(r);
			n++;
			if (s->ev.on_session_expired)
				s->ev.on_session_expired(s->ev.ud, session);
			continue;
		}
		i++;
	}
	return n;
}

int kvd_sched_idle(const struct kvd_sched *s)
{
	for (size_t i = 0; i < s->n_reqs; i++)
		if (s->reqs[i]->state != RS_SESSION)
			return 0;
	return 1;
}

void kvd_sched_get_stats(const struct kvd_sched *s, struct kvd_sched_stats *ret)
{
	struct kvd_sched_stats st = s->st;
	st.running = st.waiting = st.swapped = st.sessions = 0;
	for (size_t i = 0; i < s->n_reqs; i++) {
		switch (s->reqs[i]->state) {
		case RS_WAITING: st.waiting++; break;
		case RS_RUNNING: st.running++; break;
		case RS_SWAPPED: st.swapped++; break;
		case RS_SESSION: st.sessions++; break;
		}
	}
	st.spec_mode = (int)s->cfg.spec.mode;
	struct kvd_engine *de = kvd_engine_draft(s->e);
	if (de) {
		struct kvmm_stats ks;
		kvmm_get_stats(kvd_engine_kvmm(de), &ks);
		st.spec_draft_pages_total = ks.pages_total;
		st.spec_draft_pages_used = ks.pages_used;
	}
	*ret = st;
}

size_t kvd_sched_list(const struct kvd_sched *s, struct kvd_sched_req_info *out, size_t cap)
{
	size_t n = 0;
	uint64_t t = sched_now_ns(s);
	for (size_t i = 0; i < s->n_reqs && n < cap; i++) {
		const struct req *r = s->reqs[i];
		if (r->state == RS_SESSION)
			continue;
		uint32_t np = 0, shared = 0;
		if (r->has_seq && r->state == RS_RUNNING) {
			const int32_t *pt = kvmm_seq_pages(s->kv, r->seq, &np);
			for (uint32_t k = 0; pt && k < np; k++)
				shared += pt[k] >= 0 && kvmm_page_refcount(s->kv, (uint32_t)pt[k]) > 1;
		}
		out[n++] = (struct kvd_sched_req_info){
			.req_id = r->id,
			.session = r->session,
			.state = r->state == RS_WAITING ? 0 : r->state == RS_SWAPPED ? 3 : r->n_computed + 1 < r->n_toks ? 1 : 2,
			.prompt_tokens = r->n_prompt,
			.cached_tokens = r->res.cached_tokens,
			.generated_tokens = r->n_generated,
			.max_tokens = r->max_tokens,
			.kv_tokens = r->n_computed - r->n_dropped,
			.pages = np,
			.pages_shared = shared,
			.age_ns = t - r->t_submit,
			.sample = r->sample,
		};
	}
	return n;
}
