/*
 * kernels/program.h — the forward pass as data: one list of typed
 * operations, built once from the model description (kvd_model_weights:
 * hyper-parameters, feature bits, each layer's kvd_layer_desc and the
 * weights bound in place), that every backend executes.
 *
 * Why: a model's layer structure (norm placement, biases, per-head Q/K
 * norms, RoPE base and scaling, attention window, GeGLU or SwiGLU, post-
 * norms, embedding scale) is decided here, in one builder, and nowhere
 * else. A backend implements each operation kind and walks the list; it
 * may fuse adjacent operations (the CPU backend runs every run of
 * consecutive row-local operations in one parallel pass over the rows; the
 * CUDA plug-in folds a residual add into the GEMM before it), but it never
 * has a layer loop of its own. Adding a model feature is: one operation
 * kind below, the builder line that emits it (program.c), and one
 * implementation per backend (its executor's case for that kind).
 *
 * The program reads and writes a few named activations of the step's T
 * token rows (the batch's tokens, sequence after sequence):
 *
 *   h     [T][n_embd]          the residual stream
 *   xn    [T][n_embd]          a sublayer's normalised input
 *   q, k, v                    [T][n_head * head_dim], [T][kv_dim] twice
 *   att   [T][n_head * head_dim] attention's output
 *   y     [T][n_embd]          a sublayer's output before the residual add
 *   gate, up [T][n_ff]         the FFN's projections; GLU leaves its result in gate
 *   logit rows                 the rows of h whose sequence wants logits
 *
 * A backend may keep two of them in one buffer where the program never
 * needs both at once (the CPU backend keeps y in xn's rows). Each kind
 * says which it reads and writes; "row-local" kinds read and write only the
 * token's own rows (no other token, no matrix product), so a backend may
 * run any run of them row by row.
 *
 * The program owns no weights: its tensor pointers point into the
 * kvd_model_weights it was built from, valid as long as that is (until the
 * backend's destroy). Built by kernels/program.c, which is linked into
 * libkernels and into each device plug-in (hidden there: a plug-in uses
 * its own copy, never the daemon's).
 */
#ifndef KVD_PROGRAM_H
#define KVD_PROGRAM_H

#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A plug-in links its own copy of the builder; hidden, so that it binds to
 * that copy and never to the daemon's. */
#define KVD_PROGRAM_HIDDEN __attribute__((visibility("hidden")))

enum kvd_op_kind {
	/* h = tok_embd[token] (the step's tokens). */
	KVD_OP_EMBED = 1,
	/* row-local: h *= scale (KVD_FEAT_EMBD_SCALE). */
	KVD_OP_EMBD_SCALE,
	/* row-local: xn = rmsnorm(h) * w[0] (a sublayer's input norm). */
	KVD_OP_NORM,
	/* q = w[0] xn, k = w[1] xn, v = w[2] xn. */
	KVD_OP_QKV,
	/* row-local: q += w[0], k += w[1], v += w[2], each where present
	 * (data non-NULL) (KVD_FEAT_QKV_BIAS). */
	KVD_OP_QKV_BIAS,
	/* row-local: every head of q normalised by w[0], of k by w[1] (each
	 * where present; weights of head_dim) (KVD_FEAT_QK_NORM). */
	KVD_OP_QK_NORM,
	/* row-local: every head of q and k rotated at the token's position p
	 * by theta_i = freq_scale * p * theta^(-2i/head_dim) / freqs[i]
	 * (freqs NULL: 1), pairs as `style` says. */
	KVD_OP_ROPE,
	/* row-local: k and v stored into the token's KV slot of `layer`, in
	 * the pool's element type. */
	KVD_OP_KV_STORE,
	/* att = softmax(scale * q.k over the keys of `layer` at positions j
	 * with p - window < j <= p (window 0: 0 <= j <= p)) v, per query head
	 * with its group's KV head. */
	KVD_OP_ATTENTION,
	/* y = w[0] att. */
	KVD_OP_ATTN_OUT,
	/* row-local: y = rmsnorm(y) * w[0] (KVD_FEAT_POST_NORM). */
	KVD_OP_POST_NORM,
	/* row-local: h += y. */
	KVD_OP_RESIDUAL,
	/* gate = w[0] xn, up = w[1] xn. */
	KVD_OP_GATE_UP,
	/* row-local: gate = act(gate) * up, act as `act` says (KVD_ACT_SILU:
	 * SwiGLU; KVD_ACT_GELU_TANH: GeGLU). */
	KVD_OP_GLU,
	/* y = w[0] gate. */
	KVD_OP_DOWN,
	/* logit rows = rmsnorm(h's rows that want logits) * w[0]. */
	KVD_OP_OUTPUT_NORM,
	/* logits = w[0] logit rows, each to its sequence's buffer. */
	KVD_OP_LOGITS,
	KVD_OP_KIND_END
};

/* One operation. The fields a kind does not name are zero. */
struct kvd_op {
	enum kvd_op_kind kind;
	int32_t layer;                /* the layer it belongs to; -1 before the first and after the last */
	const struct kvd_tensor *w[3]; /* its weights, as the kind says (NULL where absent) */
	float eps;                    /* NORM, QK_NORM, POST_NORM, OUTPUT_NORM: rms_eps */
	float scale;                  /* EMBD_SCALE: the factor; ATTENTION: the score scale */
	/* ROPE */
	float theta;                  /* the layer's base */
	float freq_scale;             /* 1: no linear scaling */
	const float *freqs;           /* head_dim / 2 frequency divisors, or NULL */
	enum kvd_rope_style style;
	int32_t window;               /* ATTENTION: 0 full causal, else the last `window` positions */
	enum kvd_act act;             /* GLU */
};

struct kvd_program {
	int32_t n_ops;
	struct kvd_op *ops;      /* n_ops entries */
	int32_t n_layer;
	int32_t *layer_first;    /* [n_layer + 1]: index of layer l's first op; [n_layer]: the epilogue's */
	uint32_t kinds;          /* bit k set when kind k occurs */
	float attn_scale;        /* every ATTENTION op's scale */
};

/* Whether an operation of kind k reads and writes only its token's rows
 * (see the kinds above). */
static inline int kvd_op_row_local(enum kvd_op_kind k)
{
	switch (k) {
	case KVD_OP_EMBD_SCALE:
	case KVD_OP_NORM:
	case KVD_OP_QKV_BIAS:
	case KVD_OP_QK_NORM:
	case KVD_OP_ROPE:
	case KVD_OP_KV_STORE:
	case KVD_OP_POST_NORM:
	case KVD_OP_RESIDUAL:
	case KVD_OP_GLU: return 1;
	default: return 0;
	}
}

/* Every kind, as a mask of (1 << kind) bits. */
#define KVD_OP_KINDS_ALL (((1u << KVD_OP_KIND_END) - 1) & ~1u)

/* The first kind p uses outside `implemented` (a mask of 1 << kind bits),
 * or 0 when the executor implements all of them: a backend asks at load
 * and refuses (-ENOTSUP) a program it cannot run, instead of skipping an
 * operation. */
static inline enum kvd_op_kind kvd_program_missing(const struct kvd_program *p, uint32_t implemented)
{
	uint32_t m = p->kinds & ~implemented;
	for (int k = 1; k < KVD_OP_KIND_END; k++)
		if (m & (1u << k))
			return (enum kvd_op_kind)k;
	return (enum kvd_op_kind)0;
}

/* The kind's name ("qk_norm"), for messages and dumps; "?" if unknown. */
const char *kvd_op_kind_name(enum kvd_op_kind k) KVD_PROGRAM_HIDDEN;

/*
 * Build the program of w (which kvd_model_weights_check_features() has
 * accepted): the prologue (EMBED, EMBD_SCALE where the model scales), per
 * layer NORM, QKV, [QKV_BIAS], [QK_NORM], ROPE, KV_STORE, ATTENTION,
 * ATTN_OUT, [POST_NORM], RESIDUAL, NORM, GATE_UP, GLU, DOWN, [POST_NORM],
 * RESIDUAL, and the epilogue OUTPUT_NORM, LOGITS. An optional operation
 * is emitted where the layer has its tensors (bias, Q/K norm, post-norm);
 * the RoPE departures and the embedding scale where w->features has their
 * bits (a Llama-base description may leave those fields 0). 0 with *ret set (free
 * it with kvd_program_free), -ENOMEM, or -EINVAL for a model without
 * layers. w must outlive the program.
 */
int kvd_program_build(const struct kvd_model_weights *w, struct kvd_program **ret) KVD_PROGRAM_HIDDEN;

/* Free a program; accepts NULL. */
void kvd_program_free(struct kvd_program *p) KVD_PROGRAM_HIDDEN;

#ifdef __cplusplus
}
#endif

#endif /* KVD_PROGRAM_H */
