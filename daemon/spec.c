/*
 * daemon/spec.c — prompt-lookup drafting for speculative decoding
 * (spec.h). The search walks back from the most recent candidate: the
 * latest occurrence of the n-gram is the one most likely to continue the
 * way the sequence goes now (the span being copied). A step's cost is
 * O(KVD_SPEC_LOOKBACK * min_match) comparisons at most, next to a forward
 * pass that reads every weight.
 */
#include "spec.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static const char *const spec_mode_names[] = {
	[KVD_SPEC_OFF] = "off", [KVD_SPEC_LOOKUP] = "lookup", [KVD_SPEC_AUTO] = "auto", [KVD_SPEC_DRAFT] = "draft",
};

int kvd_spec_mode_parse(const char *name, enum kvd_spec_mode *ret)
{
	for (unsigned i = 0; i < sizeof(spec_mode_names) / sizeof(spec_mode_names[0]); i++)
		if (name && !strcmp(name, spec_mode_names[i])) {
			*ret = (enum kvd_spec_mode)i;
			return 0;
		}
	return -EINVAL;
}

const char *kvd_spec_mode_name(enum kvd_spec_mode m)
{
	return (unsigned)m < sizeof(spec_mode_names) / sizeof(spec_mode_names[0]) ? spec_mode_names[m] : "?";
}

uint32_t kvd_spec_draft(const int32_t *toks, uint32_t n, uint32_t min_match, uint32_t max_draft, int32_t *draft)
{
	if (!min_match || !max_draft || n <= min_match)
		return 0;
	const int32_t *key = toks + n - min_match;
	uint32_t lo = n > KVD_SPEC_LOOKBACK ? n - KVD_SPEC_LOOKBACK : 0;

	/* candidate starts i: the match toks[i, i + min_match) ends before
	 * the key starts overlapping its own end, so a draft follows it */
	for (uint32_t i = n - min_match; i-- > lo;) {
		if (toks[i] != key[0] || memcmp(toks + i, key, min_match * sizeof(*toks)) != 0)
			continue;
		uint32_t from = i + min_match, k = n - from;
		if (k > max_draft)
			k = max_draft;
		memcpy(draft, toks + from, k * sizeof(*draft));
		return k;
	}
	return 0;
}

uint32_t kvd_spec_next_len(struct kvd_spec_seq *q, uint32_t max, double threshold)
{
	if (q->pause) {
		q->pause--;
		return 0;
	}
	if (!max || threshold >= 1.0)
		return 0;
	double p = 1.0 - (double)(q->learnt ? q->miss : KVD_SPEC_MISS_PRIOR);
	if (p >= 1.0 || threshold <= 0.0)
		return max;
	if (p <= threshold) /* not even the first token pays: probe with one */
		return 1;
	/* the longest i with p^i > threshold */
	double i = floor(log(threshold) / log(p));
	return i >= (double)max ? max : i < 1.0 ? 1u : (uint32_t)i;
}

void kvd_spec_learn(struct kvd_spec_seq *q, uint32_t k, uint32_t run)
{
	if (!k)
		return;
	if (!q->learnt)
		q->miss = KVD_SPEC_MISS_PRIOR;
	if (q->learnt < UINT32_MAX)
		q->learnt++;
	q->miss += KVD_SPEC_EWMA * ((float)(k - run) / (float)k - q->miss);
	if (run) {
		q->misses = 0;
		q->backoff = 0;
		return;
	}
	if (++q->misses < KVD_SPEC_MISSES)
		return;
	q->misses = 0;
	q->backoff = q->backoff ? 2 * q->backoff : KVD_SPEC_PAUSE_MIN;
	if (q->backoff > KVD_SPEC_PAUSE_MAX)
		q->backoff = KVD_SPEC_PAUSE_MAX;
	q->pause = q->backoff;
}

void kvd_spec_cost_step(struct kvd_spec_cost *c, uint32_t drafted, uint64_t dt_ns)
{
	double d = KVD_SPEC_COST_DECAY, x = drafted, y = (double)dt_ns;

	c->s1 = c->s1 * d + 1;
	c->sd = c->sd * d + x;
	c->sdd = c->sdd * d + x * x;
	c->sy = c->sy * d + y;
	c->sdy = c->sdy * d + x * y;
	if (drafted && c->n_drafting < UINT32_MAX)
		c->n_drafting++;
	if (drafted) {
		c->since_draft = 0;
		if (c->n_drafting >= KVD_SPEC_COST_MIN_STEPS) {
			if (!c->relearning) /* the fit in use drafts: the next re-probe is near again */
				c->reprobe_after = 0;
			c->relearning = 0;
		}
	} else if (c->since_draft < UINT32_MAX) {
		c->since_draft++;
	}
	double det = c->s1 * c->sdd - c->sd * c->sd;
	if (det <= 1e-3 * c->s1 * c->sdd) /* drafts of one length only, or none: no slope yet */
		return;
	double slope = (c->s1 * c->sdy - c->sd * c->sy) / det;
	double plain = (c->sy - slope * c->sd) / c->s1;
	if (!(plain > 0))
		return;
	c->plain_ns = plain;
	c->draft_ns = slope > 0 ? slope : 0;
}

int kvd_spec_cost_reprobe(const struct kvd_spec_cost *c)
{
	return c->n_drafting >= KVD_SPEC_COST_MIN_STEPS &&
	       c->since_draft >= (c->reprobe_after ? c->reprobe_after : KVD_SPEC_REPROBE_STEPS);
}

void kvd_spec_cost_forget(struct kvd_spec_cost *c)
{
	uint32_t next = c->reprobe_after ? 2 * c->reprobe_after : 2 * KVD_SPEC_REPROBE_STEPS;
	*c = (struct kvd_spec_cost){ .reprobe_after = next < KVD_SPEC_REPROBE_MAX ? next : KVD_SPEC_REPROBE_MAX,
				     .relearning = 1 };
}

double kvd_spec_threshold(const struct kvd_spec_cost *c, uint32_t n_decodes)
{
	if (c->n_drafting < KVD_SPEC_COST_MIN_STEPS || c->plain_ns <= 0)
		return KVD_SPEC_LOOKUP_THRESHOLD;
	return (double)(n_decodes ? n_decodes : 1) * c->draft_ns / c->plain_ns;
}
