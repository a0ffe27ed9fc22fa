/*
 * daemon/sched_fair.c — sharing the engine fairly between owners.
 *
 * kvd is shared by every user of a machine, so the scheduler shares the
 * engine the way a fair CPU scheduler shares cores: between owners (a uid,
 * or a tenant a trusted gateway forwards; params.owner), not between
 * requests or connections, so one owner opening more of them buys it
 * nothing. Each owner has a virtual time, the engine time charged to it:
 *
 *   * order: each step serves owners from the one furthest behind, so its
 *     swapped requests resume, its prefill chunks are cut and its waiting
 *     requests are admitted before those of an owner ahead of it; within
 *     an owner, lower priority values go first, then older requests;
 *   * time: an owner that ran ahead of another contending owner by more
 *     than SCHED_FAIR_SLICE_NS sits steps out (its sequences stay resident,
 *     they only skip a decode) until the other caught up, so a short
 *     request's stream keeps at least its share of the engine's time
 *     however many sequences another owner runs beside it;
 *   * caps: with n owners contending, each is held to max_num_seqs / n
 *     sequences and 1/n of the pool's pages while another owner waits; an
 *     owner alone (or whose neighbours want nothing) takes all of both;
 *   * preemption: when a step does not fit, the sequence given up is the
 *     lowest-priority, youngest one of the owner furthest over its share.
 *
 * A step's measured time is charged to the owners of its items: the part
 * of a step every batch pays (reading the weights) shared equally by the
 * owners in it, the rest by tokens, as fitted from decode steps
 * (sched_cost_fit). So where batching is nearly free (a GPU) sharing a
 * step costs the small owner no more than running alone and nobody is
 * held back, and where every token costs (a CPU) the flooding owner pays
 * for its batch. A new owner starts at the least virtual time of the
 * others, and no owner lags more than SCHED_FAIR_LAG_NS behind the one
 * furthest ahead, so idling banks no credit to spend in a burst later.
 *
 * With a single owner nothing here changes a step: the order is priority
 * then arrival, nobody is throttled, the youngest is preempted first.
 * Outputs never depend on any of it (a sequence's tokens are the same
 * whatever the schedule).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmm.h"
#include "sched_impl.h"
#include "step_model.h"

#define SCHED_FAIR_SLICE_NS  10000000.0   /* an owner may run this far ahead of another */
#define SCHED_FAIR_LAG_NS    1000000000.0 /* no owner is kept further behind than this */
#define SCHED_FAIR_FIT_DECAY 0.95         /* weight of the cost fit's history per decode step */
#define SCHED_FAIR_FIT_COND  1e-2         /* batch sizes too alike to tell fixed from per-token cost */

static int owner_index(struct kvd_sched *s, uint64_t id, uint32_t *ret)
{
	for (size_t i = 0; i < s->n_owners; i++)
		if (s->owners[i].id == id) {
			*ret = (uint32_t)i;
			return 0;
		}
	if (s->n_owners == s->cap_owners) {
		size_t cap = s->cap_owners ? s->cap_owners * 2 : 8;
		struct sched_owner *o = realloc(s->owners, cap * sizeof(*o));
		if (!o)
			return -ENOMEM;
		s->owners = o;
		s->cap_owners = cap;
	}
	s->owners[s->n_owners] = (struct sched_owner){ .id = id, .vtime_ns = NAN };
	*ret = (uint32_t)s->n_owners++;
	return 0;
}

/* owners: the one behind first (ties: by id, so the order is stable) */
static int cmp_owner(const void *a, const void *b)
{
	const struct sched_owner *x = a, *y = b;

	if (x->vtime_ns != y->vtime_ns)
		return x->vtime_ns < y->vtime_ns ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* requests: their owner's place, then priority, then arrival, then the
 * array's order (a request's samples share its arrival) */
static int cmp_slot(const void *a, const void *b)
{
	const struct sched_slot *x = a, *y = b;

	if (x->r->oi != y->r->oi)
		return x->r->oi < y->r->oi ? -1 : 1;
	if (x->r->priority != y->r->priority)
		return x->r->priority < y->r->priority ? -1 : 1;
	if (x->r->arrival != y->r->arrival)
		return x->r->arrival < y->r->arrival ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

int sched_fair_begin(struct kvd_sched *s)
{
	double vmin = INFINITY, vmax = -INFINITY;
	size_t k = 0;

	if (s->cap_order < s->n_reqs) {
		size_t cap = s->cap_order ? s->cap_order : 64;
		while (cap < s->n_reqs)
			cap *= 2;
		struct sched_slot *o = realloc(s->order, cap * sizeof(*o));
		if (!o)
			return -ENOMEM;
		s->order = o;
		s->cap_order = cap;
	}
	for (size_t i = 0; i < s->n_owners; i++) {
		struct sched_owner *o = &s->owners[i];
		o->live = o->waiting = o->running = o->pages = 0;
		o->contending = o->throttled = 0;
		o->step_tokens = 0;
	}
	for (size_t i = 0; i < s->n_reqs; i++) {
		struct req *r = s->reqs[i];
		if (r->state == RS_SESSION)
			continue;
		uint32_t oi;
		int rc = owner_index(s, r->owner, &oi);
		if (rc < 0)
			return rc;
		s->owners[oi].live++;
		s->owners[oi].waiting += r->state == RS_WAITING || r->state == RS_SWAPPED;
	}
	/* forget the owners with nothing live; the rest keep their time */
	for (size_t i = 0; i < s->n_owners; i++)
		if (s->owners[i].live)
			s->owners[k++] = s->owners[i];
	s->n_owners = k;
	for (size_t i = 0; i < s->n_owners; i++)
		if (!isnan(s->owners[i].vtime_ns)) {
			vmin = fmin(vmin, s->owners[i].vtime_ns);
			vmax = fmax(vmax, s->owners[i].vtime_ns);
		}
	if (isinf(vmin))
		vmin = vmax = 0;
	for (size_t i = 0; i < s->n_owners; i++) {
		struct sched_owner *o = &s->owners[i];
		if (isnan(o->vtime_ns))
			o->vtime_ns = vmin; /* a newcomer: level with the one furthest behind */
		if (o->vtime_ns < vmax - SCHED_FAIR_LAG_NS)
			o->vtime_ns = vmax - SCHED_FAIR_LAG_NS;
	}
	vmin = INFINITY;
	for (size_t i = 0; i < s->n_owners; i++)
		vmin = fmin(vmin, s->owners[i].vtime_ns);
	s->n_contending = (uint32_t)s->n_owners;
	for (size_t i = 0; i < s->n_owners; i++) {
		s->owners[i].vtime_ns -= vmin; /* keep the numbers small */
		s->owners[i].throttled = s->n_owners > 1 && s->owners[i].vtime_ns > SCHED_FAIR_SLICE_NS;
	}
	qsort(s->owners, s->n_owners, sizeof(*s->owners), cmp_owner);
	s->n_order = 0;
	for (size_t i = 0; i < s->n_reqs; i++) {
		struct req *r = s->reqs[i];
		if (r->state == RS_SESSION)
			continue;
		uint32_t oi = 0;
		(void)owner_index(s, r->owner, &oi); /* present: no allocation */
		r->oi = oi;
		struct sched_owner *o = &s->owners[oi];
		o->contending = 1;
		if (r->state == RS_RUNNING) {
			o->running += slots(r);
			if (r->has_seq)
				o->pages += kvmm_seq_pages_held(s->kv, r->seq);
		}
		s->order[s->n_order++] = (struct sched_slot){ .r = r, .idx = (uint32_t)i };
	}
	qsort(s->order, s->n_order, sizeof(*s->order), cmp_slot);
	return 0;
}

void sched_fair_unthrottle(struct kvd_sched *s)
{
	for (size_t i = 0; i < s->n_owners; i++)
		s->owners[i].throttled = 0;
}

uint32_t sched_fair_seq_share(const struct kvd_sched *s)
{
	uint32_t n = s->n_contending ? s->n_contending : 1, share = s->cfg.max_num_seqs / n;
	return share ? share : 1;
}

uint32_t sched_fair_page_share(const struct kvd_sched *s)
{
	uint32_t n = s->n_contending ? s->n_contending : 1, share = kvmm_n_pages(s->kv) / n;
	return share ? share : 1;
}

size_t sched_fair_victim(struct kvd_sched *s, struct req *const *cand, size_t n, int by_seqs)
{
	double share = by_seqs ? sched_fair_seq_share(s) : sched_fair_page_share(s);
	size_t v = 0;
	double v_over = 0;

	for (size_t i = 0; i < n; i++) {
		const struct req *r = cand[i];
		const struct sched_owner *o = &s->owners[r->oi];
		double over = (by_seqs ? o->running : o->pages) / share;
		if (s->n_owners <= 1)
			over = 0; /* one owner: the youngest, as ever */
		if (i == 0) {
			v_over = over;
			continue;
		}
		const struct req *w = cand[v];
		if (over != v_over) {
			if (over > v_over) {
				v = i;
				v_over = over;
			}
			continue;
		}
		if (r->oi != w->oi)
			continue;
		if (r->priority != w->priority ? r->priority > w->priority : r->arrival > w->arrival) {
			v = i;
			v_over = over;
		}
	}
	return v;
}

static int is_decode(const struct req *r, int32_t n_tokens)
{
	return n_tokens == 1 && r->n_computed + 1 == r->n_toks && r->n_generated;
}

/* Fold a decode step of n tokens that took dt into the cost fit. */
static void fit_decode(struct sched_cost_fit *f, double n, double dt)
{
	double d = SCHED_FAIR_FIT_DECAY;

	f->s1 = f->s1 * d + 1;
	f->sn = f->sn * d + n;
	f->snn = f->snn * d + n * n;
	f->sy = f->sy * d + dt;
	f->sny = f->sny * d + n * dt;
	double det = f->s1 * f->snn - f->sn * f->sn;
	double fixed = 0, tok = 0;
	if (det > SCHED_FAIR_FIT_COND * f->s1 * f->snn) {
		fixed = (f->sy * f->snn - f->sn * f->sny) / det;
		tok = (f->s1 * f->sny - f->sn * f->sy) / det;
	}
	if (!(fixed >= 0 && tok > 0)) {
		/* one batch size so far, or noise: every token alike */
		fixed = 0;
		tok = f->sn > 0 ? f->sy / f->sn : 0;
	}
	f->fixed_ns = fixed;
	f->token_ns = tok;
}

/* Fold a measured step into the step-time model (step_model.h): a step of
 * decodes only is a decode sample; otherwise its prefill chunks' tokens and
 * attention pairs, counted before the items' n_computed advance (so
 * r->n_computed is each chunk's p0). */
void sched_learn_step_time(struct kvd_sched *s, size_t n_items, uint64_t dt)
{
	double t = 0, w = 0;

	for (size_t i = 0; i < n_items; i++) {
		const struct req *r = s->item_req[i];
		uint32_t n = (uint32_t)s->items[i].n_tokens;
		if (n == 1 && r->n_computed + 1 == r->n_toks && r->n_generated)
			continue; /* a decode: in the decode estimate */
		t += n;
		w += kvd_step_pairs(n, r->n_computed);
	}
	if (t == 0)
		kvd_step_model_decode(&s->model, dt);
	else
		kvd_step_model_prefill(&s->model, t, w, dt);
}

void sched_fair_charge(struct kvd_sched *s, size_t n_items, uint64_t dt_ns)
{
	uint32_t tokens = 0, in_step = 0;
	int decodes_only = 1;

	for (size_t i = 0; i < n_items; i++) {
		const struct req *r = s->item_req[i];
		int32_t n = s->items[i].n_tokens;
		struct sched_owner *o = &s->owners[r->oi];
		if (!o->step_tokens)
			in_step++;
		o->step_tokens += (uint32_t)n;
		tokens += (uint32_t)n;
		decodes_only = decodes_only && is_decode(r, n);
	}
	if (!tokens)
		return;
	if (decodes_only && dt_ns)
		fit_decode(&s->fit, tokens, (double)dt_ns);
	/* a clock that did not move (tests): one microsecond a token */
	double dt = dt_ns ? (double)dt_ns : 1000.0 * tokens;
	/* the fixed part is a decode step's: a step carrying prefill is paid by tokens */
	double fixed = decodes_only && s->fit.token_ns > 0 ? s->fit.fixed_ns : 0;
	double tok = s->fit.token_ns > 0 ? s->fit.token_ns : 1;
	double total = fixed + tok * tokens;
	for (size_t i = 0; i < s->n_owners; i++) {
		struct sched_owner *o = &s->owners[i];
		if (!o->step_tokens)
			continue;
		o->vtime_ns += dt * (fixed / in_step + tok * o->step_tokens) / total;
		o->step_tokens = 0;
	}
}

void sched_fair_free(struct kvd_sched *s)
{
	free(s->owners);
	s->owners = NULL;
	s->n_owners = s->cap_owners = 0;
	free(s->order);
	s->order = NULL;
	s->n_order = s->cap_order = 0;
}
