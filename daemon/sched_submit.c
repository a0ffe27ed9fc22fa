/*
 * daemon/sched_submit.c — requests entering and leaving the scheduler from
 * outside a step: kvd_sched_submit (a new request, or a session's next
 * turn, checked against the context and the pool before it is queued),
 * kvd_sched_cancel and kvd_sched_set_config. The step itself is sched.c.
 */
#include "sched.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kvmm.h"
#include "log.h"
#include "sched_impl.h"

int kvd_sched_submit(struct kvd_sched *s, uint64_t req_id, const int32_t *prompt, uint32_t n_prompt,
		     const struct kvd_request_params *p)
{
	struct req *r = NULL, *sess = NULL;
	size_t si = 0, waiting = 0;
	uint32_t hist = 0;
	int rc;

	uint32_t n_samples = p->n_samples ? p->n_samples : 1;

	if (!n_prompt || !p->max_tokens)
		return -EINVAL;
	if (kvd_sampler_params_check(&p->sampling) < 0)
		return -EINVAL;
	/* samples fork one sequence: not with a session's, nor under a window
	 * policy (its drops are per sequence) */
	if (n_samples > KVD_MAX_SAMPLES || (n_samples > 1 && (p->session || p->ctx_policy != KVD_CTX_ERROR)) ||
	    p->top_logprobs > KVD_LOGPROBS_MAX_TOP ||
	    (int32_t)p->top_logprobs > s->n_vocab)
		return -EINVAL;
	if (p->grammar && !p->gram_vocab)
		return -EINVAL;
	if (n_samples > s->cfg.max_num_seqs)
		return -ERANGE;
	for (uint32_t i = 0; i < n_prompt; i++)
		if (prompt[i] < 0 || prompt[i] >= s->n_vocab)
			return -EINVAL;
	if (sched_find(s, req_id, NULL))
		return -EEXIST;
	for (size_t i = 0; i < s->n_reqs; i++)
		waiting += s->reqs[i]->state == RS_WAITING;
	if (waiting >= s->cfg.max_waiting)
		return -EBUSY;
	if (p->session) {
		sess = sched_find_session(s, p->session, &si);
		if (sess && sess->state != RS_SESSION)
			return -EBUSY; /* a turn of this session is still running */
		if (sess)
			hist = sess->n_toks;
	}
	struct kvd_window w = {0};
	int windowed = p->ctx_policy == KVD_CTX_SLIDING_WINDOW || p->ctx_policy == KVD_CTX_SINKS;
	uint64_t kv_need = (uint64_t)hist + n_prompt + p->max_tokens;
	if (windowed) {
		if (!kvd_engine_can_shift(s->e))
			return -ENOTSUP;
		if (kvd_window_make(s->block_size, s->cfg.max_model_len, p->ctx_policy == KVD_CTX_SINKS, p->ctx_sinks,
				    p->ctx_window, &w) < 0)
			return -E2BIG;
		kv_need = kv_need < kvd_window_cap(&w, s->block_size) ? kv_need : kvd_window_cap(&w, s->block_size);
	} else if (kv_need > s->cfg.max_model_len) {
		return -E2BIG;
	}
	/* alone: the prompt's full pages once, the rest of each sample's own */
	uint64_t all = sched_pages_bound(s, kv_need, windowed), full = (hist + n_prompt) / s->block_size;
	if (full > all)
		full = all;
	if (all + (uint64_t)(n_samples - 1) * (all - full) > kvmm_n_pages(s->kv))
		return -ENOSPC;
	if (s->n_reqs == s->cap_reqs) {
		size_t cap = s->cap_reqs ? s->cap_reqs * 2 : 64;
		struct req **nr = realloc(s->reqs, cap * sizeof(*nr));
		if (!nr)
			return -ENOMEM;
		s->reqs = nr;
		s->cap_reqs = cap;
	}
	if (sess) {
		/* the session's request object becomes this turn */
		r = sess;
		sched_remove_at(s, si);
		memset(&r->res, 0, sizeof(r->res));
		r->n_history = hist;
	} else {
		r = calloc(1, sizeof(*r));
		if (!r)
			return -ENOMEM;
	}
	rc = reserve_toks(r, hist + n_prompt + p->max_tokens); /* (bounded by the wire's limits) */
	if (rc < 0)
		goto fail;
	r->sampler = kvd_sampler_new(&p->sampling, s->n_vocab);
	r->logits = malloc((size_t)s->n_vocab * sizeof(float));
	if (!r->sampler || !r->logits) {
		rc = -ENOMEM;
		goto fail;
	}
	req_gram_release(r); /* (a session's object: its last turn's is gone already) */
	if (p->grammar) {
		r->gram = kvd_grammar_ref(p->grammar);
		r->gvocab = p->gram_vocab;
		rc = sched_gram_scratch(s) ? kvd_gram_state_init(r->gram, sched_gram_scratch(s), &r->gst) : -ENOMEM;
		if (rc < 0)
			goto fail;
	}
	memcpy(r->toks + hist, prompt, n_prompt * sizeof(*prompt));
	r->n_toks = hist + n_prompt;
	r->id = req_id;
	r->session = p->session;
	r->n_prompt = n_prompt;
	r->n_generated = 0;
	r->max_tokens = p->max_tokens;
	r->ignore_eos = p->ignore_eos;
	r->idle_s = p->session_idle_s;
	r->sample = 0;
	r->n_samples = n_samples;
	r->forked = n_samples == 1;
	r->logprobs = p->logprobs;
	r->no_spec = p->no_speculate;
	r->top_logprobs = p->top_logprobs;
	r->sp = p->sampling;
	r->cache_scope = p->cache_scope;
	r->owner = p->owner;
	r->priority = p->priority;
	if (r->windowed != windowed || memcmp(&r->w, &w, sizeof(w)))
		sched_drop_seq(s, r); /* a session's KV kept under another policy is not this one's */
	r->windowed = windowed;
	r->w = w;
	r->t_submit = sched_now_ns(s);
	r->t_admit = r->t_first = r->t_last = 0;
	/* a session turn computes over its history too: report the whole
	 * context, with the history the session kept as cached */
	r->res.prompt_tokens = hist + n_prompt;
	r->res.cached_tokens = sess ? r->n_computed : 0;
	if (!sess || !r->has_seq) {
		r->state = RS_WAITING; /* (a session whose pages were given up recomputes) */
	} else {
		r->state = RS_RUNNING; /* its sequence is resident */
		r->t_admit = r->t_submit;
		kvmm_seq_set_prompt_tokens(s->kv, r->seq, r->n_toks);
		s->st.session_lookups++;
		s->st.session_query_tokens += r->n_toks;
		s->st.session_hit_tokens += r->n_computed;
	}
	r->arrival = ++s->arrivals;
	s->reqs[s->n_reqs++] = r;
	return 0;
fail:
	if (sess) {
		/* put the session back untouched */
		req_gram_release(r);
		r->sampler = kvd_sampler_free(r->sampler);
		free(r->logits);
		r->logits = NULL;
		s->reqs[s->n_reqs++] = r;
	} else {
		req_free(r);
	}
	return rc;
}

int kvd_sched_cancel(struct kvd_sched *s, uint64_t req_id)
{
	struct req *r = sched_find(s, req_id, NULL);
	if (!r)
		return -ENOENT;
	do
		sched_finish(s, r, KVD_FINISH_CANCELLED, 0);
	while ((r = sched_find(s, req_id, NULL)));
	return 0;
}

void kvd_sched_set_config(struct kvd_sched *s, const struct kvd_sched_config *cfg)
{
	if (cfg->max_num_seqs)
		s->cfg.max_num_seqs = cfg->max_num_seqs;
	if (cfg->max_tokens_per_step)
		s->cfg.max_tokens_per_step = cfg->max_tokens_per_step;
	if (cfg->max_model_len)
		s->cfg.max_model_len = cfg->max_model_len;
	if (cfg->max_waiting)
		s->cfg.max_waiting = cfg->max_waiting;
	s->cfg.session_idle_s = cfg->session_idle_s;
	s->cfg.max_step_ms = cfg->max_step_ms;
	s->cfg.spec = cfg->spec;
}

