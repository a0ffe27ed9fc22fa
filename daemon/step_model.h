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
 * decodes' estimate) of measured steps. Until a prefill step has been
 * measured a probe chunk is used; a step with nothing to decode keeps the
 * whole max_tokens_per_step, so a prompt alone is read at full speed.
 * Chunking never changes results (a sequence's logits do not depend on how
 * its prompt was split), so this trades only latency between requests.
 */
#ifndef KVD_STEP_MODEL_H
#define KVD_STEP_MODEL_H

#include <stdint.h>

#define KVD_STEP_PROBE_CHUNK 16 /* prefill beside decodes before the cost of a token is known */

struct kvd_step_model {
	uint64_t decode_ns;                       /* moving average of a step of decodes only */
	double s_tt, s_tw, s_ww, s_ty, s_wy;      /* decayed least-squares sums over prefill steps */
	double a, b;                              /* ns per token and per pair; a == 0: not measured */
	uint64_t n;                               /* prefill steps measured */
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
/* What a step of target_ns leaves for prefill beside its decodes. */
double kvd_step_model_left(const struct kvd_step_model *m, uint64_t target_ns);
/* The most tokens (<= most) a chunk at p0 can take within left_ns; before
 * any prefill step has been measured, one probe chunk. */
uint32_t kvd_step_model_cap(const struct kvd_step_model *m, double left_ns, uint32_t p0, uint32_t most);
/* The time a chunk of n tokens at p0 is charged against left_ns (all of it
 * before the model is measured: one probe chunk per step). */
double kvd_step_model_charge(const struct kvd_step_model *m, double left_ns, uint32_t n, uint32_t p0);

#endif /* KVD_STEP_MODEL_H */
