/*
 * kernels/cpu/attention.h — attention of the CPU forward pass over K/V in
 * pages (kernels/cpu/attention.c): for every row of a step, its query
 * heads against positions 0..pos of its sequence, split into fixed chunks
 * of positions so that a token's result is bit-identical whatever the
 * batch, the chunking of its prompt, the pages or the threads.
 */
#ifndef KVD_CPU_ATTENTION_H
#define KVD_CPU_ATTENTION_H

#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"
#include "kvquant.h"
#include "ops.h"
#include "threadpool.h"

struct attn_part;

/* The attention state of a CPU context: the kernels, the model's shape and
 * scratch grown as needed. Zero-initialised before the first setup. */
struct cpu_attn {
	struct tp *pool;
	struct cpu_kernels k;
	const struct kvd_hparams *hp;
	attn_rows_fn rows;    /* the tiled attention kernel (f16 K/V), or NULL */
	attn_rows_fn rows_bf16; /* the same for bf16 K/V (AVX-512 BF16, else AVX2), or NULL */
	/* the kernels of rows and rows_bf16 over a chunk of every KV head at
	 * once (attn_heads_fn: the same bits for each head), where they exist */
	attn_heads_fn heads, heads_bf16;
	struct kvq_kernels kq; /* products over K/V rows of the other types */
	float scale;          /* scores are q·k times this */
	/* the step being computed (cpu_attn_run) */
	struct kvd_paged_view kv;
	const int32_t *tok_seq, *tok_pos; /* [T] sequence index, position */
	const float *q;       /* [T][n_head * head_dim] */
	/* q8_0/q4_0 K with the integer scores: q's rows quantized once a
	 * step (kvq_quant_fn), row i of q at qq[i], when qq_live */
	struct kvq_qrow *qq;
	int cap_qq, qq_live;
	float *att;           /* [T][n_head * head_dim] output */
	/* scratch */
	int *tile_first;      /* tiled attention: first row of each tile, then T */
	int cap_tiles;
	int cap_chunks;       /* attention chunks per item the scratch holds */
	float *scores;        /* per thread: scores, chunk partials */
	int *item_first;      /* split attention: first chunk of each item */
	atomic_int *item_left; /* split attention: chunks of each item to go */
	int cap_items;
	struct attn_part *attn_pm; /* split attention: partials of every chunk */
	float *attn_po;
	int cap_split;
	/* released pages (KVD_CAP_PACKED_KV): per layer, its index among the
	 * layers without a window, or -1; the packing of the model */
	int32_t *glob_idx;
	uint32_t n_global, pack_slots, max_window;
};

/* For a loaded model (drops any scratch): its kernels, pool and shape. */
void cpu_attn_setup(struct cpu_attn *a, struct tp *pool, const struct cpu_kernels *k, const struct kvd_hparams *hp,
		    float scale);
/* For the model just set up: where its global layers' K/V of released
 * pages live (kvd_kv_pack_slots). 0 or -ENOMEM. */
int cpu_attn_set_packing(struct cpu_attn *a, const struct kvd_model_weights *w);
/* Whether s's page table entries covering positions 0 .. pos0 + n_tokens - 1
 * are pages of the view, or released pages the step may hold (see
 * KVD_CAP_PACKED_KV): 0 or -EINVAL. */
int cpu_attn_check_pages(const struct cpu_attn *a, const struct kvd_paged_view *kv, const struct kvd_batch_seq *s);
/* Grow the scratch for positions up to max_pos; 0 or -ENOMEM. */
int cpu_attn_reserve(struct cpu_attn *a, int max_pos);
/* att = attention of the T rows (query q, sequence tok_seq, position
 * tok_pos; K/V of layer already stored for every position up to each) over
 * the batch's pages; 0 or -ENOMEM. */
int cpu_attn_run(struct cpu_attn *a, const struct kvd_paged_view *kv, const struct kvd_batch *b, int layer, int window,
		 int T, const int32_t *tok_seq, const int32_t *tok_pos, const float *q, float *att);
/* Free the scratch and clear the state. */
void cpu_attn_free(struct cpu_attn *a);

#endif
