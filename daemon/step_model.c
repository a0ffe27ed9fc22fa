/*
 * daemon/step_model.c — the scheduler's step-time model (step_model.h).
 */
#include <math.h>

#include "step_model.h"

#define EWMA_SHIFT     2       /* the decode estimate moves 1/4 of the way to each sample */
#define FIT_DECAY      0.875   /* weight of the prefill fit's history per step */
#define FIT_DECAY_LONG 0.99    /* and of the slow sums added to it (about 100 steps) */
#define FIT_MIN        3       /* prefill steps measured before a and b are fitted */
#define PAIR_PRIOR     1024.0  /* otherwise b = a / this */
#define ERR_ALPHA      (1.0 / 16) /* weight of a new sample in the error's mean and variance */
#define FIT_COND       1e-2    /* det / (s_tt s_ww) = 1 - corr(t, w)^2 below this: t and w
                                * too alike (chunks of one size at slowly growing depth) */

static uint64_t ewma(uint64_t avg, uint64_t sample)
{
	if (!avg)
		return sample ? sample : 1;
	return avg + (((int64_t)sample - (int64_t)avg) >> EWMA_SHIFT);
}

void kvd_step_model_decode(struct kvd_step_model *m, uint64_t dt_ns)
{
	m->decode_ns = ewma(m->decode_ns, dt_ns);
}

/* Solve the weighted least squares for a and b from the decayed sums. A
 * fit from fewer than FIT_MIN steps, ill-conditioned (the samples' t and w
 * nearly proportional, as when every chunk is of one size at slowly
 * growing depth) or with a negative coefficient falls back to the prior
 * that a token's attention costs its matrix products at depth PAIR_PRIOR
 * (b = a / PAIR_PRIOR), with a fitted to the samples under that ratio, so
 * the depth the samples were taken at is not counted twice. */
static void refit(struct kvd_step_model *m)
{
	double tt = m->s_tt + m->l_tt, tw = m->s_tw + m->l_tw, ww = m->s_ww + m->l_ww;
	double ty = m->s_ty + m->l_ty, wy = m->s_wy + m->l_wy;
	double det = tt * ww - tw * tw;
	double a = 0, b = 0;

	if (m->n >= FIT_MIN && tt > 0 && ww > 0 && det > FIT_COND * tt * ww) {
		a = (ty * ww - wy * tw) / det;
		b = (wy * tt - ty * tw) / det;
	}
	if (!(a > 0 && b >= 0)) {
		/* one parameter: cost = a * (t + w / PAIR_PRIOR), a by least
		 * squares on x = t + w / PAIR_PRIOR from the same sums */
		double xx = tt + 2 * tw / PAIR_PRIOR + ww / (PAIR_PRIOR * PAIR_PRIOR);
		double xy = ty + wy / PAIR_PRIOR;
		a = xx > 0 ? xy / xx : 0;
		b = a / PAIR_PRIOR;
	}
	if (!(a > 0))
		a = 1; /* a measured step: never "unknown" again */
	m->a = a;
	m->b = b;
}

/* The step time less the decode estimate (the decodes the step carried,
 * or for a step of prefill alone the fixed cost of a step, which the
 * estimate of a decode step stands for) is one sample of a * t + b * w.
 * Until a decode step has been measured there is nothing to subtract, and
 * the sample would charge that fixed cost to the tokens: it is skipped. */
void kvd_step_model_prefill(struct kvd_step_model *m, double t, double w, uint64_t dt_ns)
{
	uint64_t dec = m->decode_ns;
	if (!dec || t <= 0)
		return;
	double y = dt_ns > dec ? (double)(dt_ns - dec) : 1;
	if (m->a > 0) {
		/* how far this step was from what the model said before it */
		double r = (double)dt_ns / ((double)dec + m->a * t + m->b * w);
		if (!m->n_err) {
			m->err_mean = r;
			m->err_var = 0;
		} else {
			double d = r - m->err_mean;
			m->err_mean += ERR_ALPHA * d;
			m->err_var = (1 - ERR_ALPHA) * (m->err_var + ERR_ALPHA * d * d);
		}
		m->n_err++;
	}
	m->s_tt = m->s_tt * FIT_DECAY + t * t;
	m->s_tw = m->s_tw * FIT_DECAY + t * w;
	m->s_ww = m->s_ww * FIT_DECAY + w * w;
	m->s_ty = m->s_ty * FIT_DECAY + t * y;
	m->s_wy = m->s_wy * FIT_DECAY + w * y;
	m->l_tt = m->l_tt * FIT_DECAY_LONG + t * t;
	m->l_tw = m->l_tw * FIT_DECAY_LONG + t * w;
	m->l_ww = m->l_ww * FIT_DECAY_LONG + w * w;
	m->l_ty = m->l_ty * FIT_DECAY_LONG + t * y;
	m->l_wy = m->l_wy * FIT_DECAY_LONG + w * y;
	m->n++;
	refit(m);
}

double kvd_step_model_margin(const struct kvd_step_model *m)
{
	if (m->n_err < KVD_STEP_MARGIN_MIN)
		return 1;
	double q = m->err_mean + 2 * sqrt(m->err_var);
	return q < 1 ? 1 : q > KVD_STEP_MARGIN_MAX ? KVD_STEP_MARGIN_MAX : q;
}

double kvd_step_model_left(const struct kvd_step_model *m, uint64_t target_ns)
{
	double t = (double)target_ns / kvd_step_model_margin(m);
	return t > (double)m->decode_ns ? t - (double)m->decode_ns : 0;
}

static double cost(const struct kvd_step_model *m, uint32_t n, uint32_t p0)
{
	return m->a * n + m->b * kvd_step_pairs(n, p0);
}

uint32_t kvd_step_model_cap(const struct kvd_step_model *m, double left_ns, uint32_t p0, uint32_t most)
{
	if (left_ns <= 0)
		return 0;
	if (m->a <= 0)
		return most < KVD_STEP_PROBE_CHUNK ? most : KVD_STEP_PROBE_CHUNK;
	/* cost(n) increases with n: bisect for the largest n within left_ns */
	uint32_t lo = 0, hi = most;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo + 1) / 2;
		if (cost(m, mid, p0) <= left_ns)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

double kvd_step_model_charge(const struct kvd_step_model *m, double left_ns, uint32_t n, uint32_t p0)
{
	return m->a > 0 ? cost(m, n, p0) : left_ns;
}
