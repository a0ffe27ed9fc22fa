/*
 * daemon/step_model.h — how long a scheduler step will take, learnt from
 * the steps measured, for the step budget ([scheduler] max_step_ms).
 *
 * The step budget: a step that carries decodes of running streams must not
 * keep them waiting longer than max_step_ms, so the prefill that shares it
 * (chunks of prompts being read, admissions) gets only the time the decodes
 * leave. A prefill chunk of n tokens at positions p0 .. p0 + n - 1 is
 * modelled as costing
 *
 *     a * n + b * w,   w = n * p0 + n * (n - 1) / 2
 *
 * where w counts the (query, earlier key) pairs its attention reads: the
 * matrix products grow with n, attention with n times the depth, so the
 * last chunks of a long prompt cost several times the first ones per token
 * and a per-token average alone lets steps overrun as the prompt deepens.
 * a and b are fitted by least squares, exponentially weighted
 * (FIT_DECAY per step, step_model.c), over the prefill share (step time less the
 * decodes' estimate) of measured steps, plus the same sums decaying slowly
 * (FIT_DECAY_LONG): a prompt's chunks all lie at one depth range, and a fit
 * that had forgotten the shallow chunks of earlier prompts would meet the
 * next prompt's first chunks far outside what it was fitted on. Until a prefill step has been
 * measured a probe chunk is used; a step with nothing to decode keeps the
 * whole max_tokens_per_step, so a prompt alone is read at full speed.
 * Chunking never changes results (a sequence's logits do not depend on how
 * its prompt was split), so this trades only latency between requests.
 *
 * max_step_ms is a bound, not an average: on a shared machine the same step
 * takes a varying time, so each prefill step's measured time is compared
 * with what the model predicted for it, and steps are planned to
 * max_step_ms divided by the margin that spread calls for (mean + 2
 * standard deviations of measured / predicted, at least 1, at most
 * STEP_MARGIN_MAX): about 1.05 on a quiet machine, more where neighbours
 * take the CPU in bursts.
 */
#ifndef KVD_STEP_MODEL_H
#define KVD_STEP_MODEL_H

#include <stdint.h>

#define KVD_STEP_PROBE_CHUNK 16 /* prefill beside decodes before the cost of a token is known */

struct kvd_step_model {
	uint64_t decode_ns;                       /* moving average of a step of decodes only */
	double s_tt, s_tw, s_ww, s_ty, s_wy;      /* decayed least-squares sums over prefill steps */
	double l_tt, l_tw, l_ww, l_ty, l_wy;      /* the same, decaying slowly (FIT_DECAY_LONG) */
	double a, b;                              /* ns per token and per pair; a == 0: not measured */
	uint64_t n;                               /* prefill steps measured */
	double err_mean, err_var;                 /* measured / predicted time of prefill steps:
	                                           * exponentially weighted mean and variance */
	uint64_t n_err;                           /* prefill steps compared with a prediction */
};

/* Attention pairs of a chunk of n tokens at positions p0 .. p0 + n - 1. */
static inline double kvd_step_pairs(uint32_t n, uint32_t p0)
{
	return (double)n * p0 + (double)n * (n - 1) / 2;
}

/* A measured step of decodes only. */
void kvd_step_model_decode(struct kvd_step_model *m, uint64_t dt_ns);
/* A measured step with prefill chunks of t tokens and w pairs in all. */
void kvd_step_model_prefill(struct kvd_step_model *m, double t, double w, uint64_t dt_ns);
/* What a step of target_ns leaves for prefill beside its decodes, after
 * the margin for the spread of step times (kvd_step_model_margin). */
double kvd_step_model_left(const struct kvd_step_model *m, uint64_t target_ns);
/* The margin steps are planned with: 1 until KVD_STEP_MARGIN_MIN prefill
 * steps have been compared with their prediction. */
double kvd_step_model_margin(const struct kvd_step_model *m);
#define KVD_STEP_MARGIN_MIN 8
#define KVD_STEP_MARGIN_MAX 1.6
/* The most tokens (<= most) a chunk at p0 can take within left_ns; before
 * any prefill step has been measured, one probe chunk. */
uint32_t kvd_step_model_cap(const struct kvd_step_model *m, double left_ns, uint32_t p0, uint32_t most);
/* The time a chunk of n tokens at p0 is charged against left_ns (all of it
 * before the model is measured: one probe chunk per step). */
double kvd_step_model_charge(const struct kvd_step_model *m, double left_ns, uint32_t n, uint32_t p0);

#endif /* KVD_STEP_MODEL_H */
