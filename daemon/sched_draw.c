/*
 * daemon/sched_draw.c — a step's next tokens drawn in parallel.
 *
 * After a step, every item that decodes plainly (not a prompt whose samples
 * are still to be forked, not a speculative verification, whose tokens
 * depend on one another) draws its next token from its own logits, sampler
 * and constraint state. Nothing one draw reads is written by another: the
 * compiled constraint and the vocabulary's trie are immutable, the sampler
 * and the parse state are the request's. So the draws of a batch run at
 * once on a small pool of threads (kvd_sched_config.draw_threads), each
 * thread with its own matcher scratch and mask (struct sched_lane), before
 * any token is reported; the reports (emit in sched.c: the constraint's
 * update, stop strings, the events) stay on the scheduler's thread in the
 * batch's order. A draw gives the same token on any thread, so outputs do
 * not depend on the pool's size.
 *
 * This is where a 262k vocabulary's masks and a seeded sampler's softmax go
 * on a wide batch: 32 of them one after another are a sizeable part of a
 * step while the engine's threads sit idle. The pool is kernels/backend.h's
 * host pool (the CPU backend's worker pool type), a second instance: the
 * engine's and this one never run at the same time (one thread drives both
 * in turn), and an idle pool sleeps on a futex.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kvmm.h"
#include "log.h"
#include "sched_impl.h"

#define SCHED_DRAW_MAX_THREADS 64

struct draw_job {
	struct kvd_sched *s;
	struct req **reqs;
};

static void draw_one(void *arg, uint32_t i, int tid)
{
	struct draw_job *j = arg;
	struct req *r = j->reqs[i];
	struct sched_lane *L = tid ? &j->s->draw_lanes[tid] : &j->s->lane;

	r->drawn_fast = 0;
	r->drawn_rc = sched_draw_token(j->s, r, L, &r->drawn_tok, &r->drawn_fast);
	r->drawn = 1;
}

/* The pool, made once: NULL when draw_threads is one or it cannot be made
 * (the draws then run on the scheduler's thread, as before it existed). */
static struct kvd_pool *draw_pool(struct kvd_sched *s)
{
	if (s->draw_tried)
		return s->draw_tp;
	s->draw_tried = 1;
	uint32_t n = s->cfg.draw_threads > SCHED_DRAW_MAX_THREADS ? SCHED_DRAW_MAX_THREADS : s->cfg.draw_threads;
	if (n < 2)
		return NULL;
	struct sched_lane *lanes = calloc(n, sizeof(*lanes));
	int rc = lanes ? kvd_pool_create((int)n, &s->draw_tp) : -ENOMEM;
	if (rc < 0) {
		free(lanes);
		s->draw_tp = NULL;
		log_warning("sched: no pool to draw tokens on (%d threads): %s; they are drawn one at a time", (int)n,
			    strerror(-rc));
		return NULL;
	}
	s->draw_lanes = lanes;
	return s->draw_tp;
}

static int grow_draws(struct kvd_sched *s, size_t n)
{
	struct req **d = realloc(s->draws, n * sizeof(*d));
	if (!d)
		return 0; /* drawn one at a time in emit */
	s->draws = d;
	s->cap_draws = n;
	return 1;
}

void sched_draw_step(struct kvd_sched *s, size_t n_items)
{
	size_t n = 0;

	if (s->cfg.draw_threads < 2 || n_items < 2 || (s->cap_draws < n_items && !grow_draws(s, n_items)))
		return;
	for (size_t i = 0; i < n_items; i++)
		if (sched_item_draws(s, i))
			s->draws[n++] = s->item_req[i];
	struct kvd_pool *p = n > 1 ? draw_pool(s) : NULL;
	if (!p)
		return; /* each drawn in emit */
	struct draw_job j = { s, s->draws };
	kvd_pool_for(p, draw_one, &j, (uint32_t)n);
	s->st.draws_parallel += n;
}

void sched_draw_fini(struct kvd_sched *s)
{
	if (s->draw_tp) {
		int n = kvd_pool_size(s->draw_tp);
		s->draw_tp = kvd_pool_destroy(s->draw_tp);
		for (int i = 1; i < n; i++)
			sched_lane_fini(&s->draw_lanes[i]);
	}
	free(s->draw_lanes);
	s->draw_lanes = NULL;
	free(s->draws);
	s->draws = NULL;
	s->cap_draws = 0;
}
