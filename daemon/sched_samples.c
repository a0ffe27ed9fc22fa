/*
 * daemon/sched_samples.c — parallel samples of one prompt.
 *
 * A request for n samples runs as one request (sample 0) until its prompt
 * is computed; then, before its first token is sampled, its sequence is
 * forked n - 1 times (kvmm_seq_fork: every page shared, the partly filled
 * last page copied by kvmm on the first write into it, so the prompt's KV
 * exists once), and each child gets a copy of the logits and its own
 * sampler (and a copy of the constraint's parse state, when it has one).
 * From then on every sample is an ordinary request of the
 * scheduler under the same id, found by pointer where that matters.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmm.h"
#include "sched_impl.h"

/* A request that ends before its samples were forked: report the others
 * as ending the same way, with nothing generated. */
void done_unforked(const struct kvd_sched_events *ev, const struct req *r)
{
	if (r->forked || !ev->on_done)
		return;
	for (uint32_t i = 1; i < r->n_samples; i++) {
		struct kvd_request_result res = r->res;
		res.sample = i;
		res.generated_tokens = 0;
		res.ttft_ns = res.decode_ns = 0;
		res.ledger = NULL;
		ev->on_done(ev->ud, r->id, &res);
	}
}

/* Sequences a running request stands for: its samples until they are forked. */
uint32_t slots(const struct req *r)
{
	return r->forked ? 1 : r->n_samples;
}

/* Sample i of p: a copy of its state after the prompt, forking its
 * sequence. A failed fork leaves the child waiting, to recompute its
 * prompt (through the prefix cache) like a preempted request. NULL when
 * out of memory. */
static struct req *fork_child(const struct sched_fork *x, struct req *p, uint32_t i)
{
	struct req *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	struct kvd_sampler_params sp = p->sp;
	sp.seed = kvd_sample_seed(p->sp.seed, i);
	c->sampler = kvd_sampler_new(&sp, x->n_vocab);
	c->logits = malloc((size_t)x->n_vocab * sizeof(float));
	if (!c->sampler || !c->logits || reserve_toks(c, p->cap_toks) < 0) {
		req_free(c);
		return NULL;
	}
	if (p->gram) { /* the constraint's state after the prompt: its start */
		c->gram = kvd_grammar_ref(p->gram);
		c->gvocab = p->gvocab;
		if (kvd_gram_state_copy(&c->gst, &p->gst) < 0) {
			req_free(c);
			return NULL;
		}
	}
	memcpy(c->logits, p->logits, (size_t)x->n_vocab * sizeof(float));
	memcpy(c->toks, p->toks, p->n_toks * sizeof(*c->toks));
	c->id = p->id;
	c->arrival = p->arrival;
	c->n_toks = p->n_toks;
	c->n_prompt = p->n_prompt;
	c->max_tokens = p->max_tokens;
	c->ignore_eos = p->ignore_eos;
	c->sample = i;
	c->n_samples = p->n_samples;
	c->forked = 1;
	c->logprobs = p->logprobs;
	c->no_spec = p->no_spec;
	c->top_logprobs = p->top_logprobs;
	c->sp = sp;
	c->owner = p->owner;
	c->priority = p->priority;
	c->res.prompt_tokens = p->res.prompt_tokens;
	c->res.cached_tokens = p->res.cached_tokens;
	c->res.adopted_tokens = p->res.adopted_tokens;
	c->res.adopted_pages = p->res.adopted_pages;
	c->t_submit = p->t_submit;
	c->t_admit = p->t_admit;
	if (kvmm_seq_fork(x->kv, p->seq, &c->seq) == 0) {
		c->has_seq = 1;
		c->n_computed = p->n_computed;
		c->state = RS_RUNNING;
		x->st->samples_forked++;
	} else {
		c->state = RS_WAITING;
	}
	return c;
}

uint32_t fork_samples(const struct sched_fork *x, struct req *p, struct req **kids, size_t room)
{
	uint32_t n = 0;

	p->forked = 1;
	for (uint32_t i = 1; i < p->n_samples; i++) {
		struct req *c = n < room ? fork_child(x, p, i) : NULL;
		if (!c) {
			/* this sample cannot be made: it ends at once */
			struct kvd_request_result res = { .finish = KVD_FINISH_ERROR, .error = -ENOMEM,
							  .prompt_tokens = p->res.prompt_tokens,
							  .cached_tokens = p->res.cached_tokens,
							  .sample = i, .n_samples = p->n_samples };
			x->st->requests_done++;
			if (x->ev->on_done)
				x->ev->on_done(x->ev->ud, p->id, &res);
			continue;
		}
		kids[n++] = c;
	}
	return n;
}
