/*
 * kernels/cpu/kvshift.c — kv_shift for the CPU backend: cached keys moved to
 * new positions by rotating them again.
 *
 * The forward pass stores keys after RoPE (kernels/backend.h, kvd_layer_desc):
 * pair i of a key at position p is rotated by the angle
 *   a_i(p) = rope_freq_scale * p * rope_theta^(-2i/head_dim) / freq_factor_i,
 * pairs being (2i, 2i+1) (normal) or (i, i + head_dim/2) (NEOX). The angle is
 * linear in p, so a key rotated at p becomes the key rotated at p + delta by
 * one more rotation by a_i(delta). The cos/sin table is computed in double,
 * as the forward pass computes its own, the rotation in float from the f16
 * (bf16, f32) key, and the result is rounded back to the cache's type: the
 * shifted key differs from a key computed at p + delta directly by that
 * rounding of one extra step.
 */
#include "kvshift.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "ops.h"

/* cos and sin of pair i's angle at position pos for one layer's RoPE:
 * positions times pos_scale (linear scaling), pair i's frequency divided by
 * freq_factors[i] (Llama 3.x rope_freqs; NULL for none). The forward pass
 * rotates with these tables too, so a shift by delta is the same rotation
 * a key computed delta positions later got. */
void cpu_rope_table(float *cs, int hd, int32_t pos, float theta, float pos_scale, const float *freq_factors)
{
	for (int i = 0; i < hd / 2; i++) {
		double th = (double)pos * pos_scale * pow((double)theta, -2.0 * i / hd);
		if (freq_factors)
			th /= freq_factors[i];
		cs[2 * i] = (float)cos(th);
		cs[2 * i + 1] = (float)sin(th);
	}
}

/* one head of a K row of 16-bit elements: f16, or bf16 when bf is set */
static void rotate_head(uint16_t *k, int hd, const float *cs, enum kvd_rope_style style, int bf)
{
	for (int i = 0; i < hd / 2; i++) {
		int a = style == KVD_ROPE_NEOX ? i : 2 * i;
		int b = style == KVD_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
		float x0 = bf ? cpu_bf16_to_f32(k[a]) : cpu_fp16_to_f32(k[a]);
		float x1 = bf ? cpu_bf16_to_f32(k[b]) : cpu_fp16_to_f32(k[b]);
		float c = cs[2 * i], s = cs[2 * i + 1];
		float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
		k[a] = bf ? cpu_f32_to_bf16(y0) : cpu_f32_to_fp16(y0);
		k[b] = bf ? cpu_f32_to_bf16(y1) : cpu_f32_to_fp16(y1);
	}
}

/* one head of an f32 K row */
static void rotate_head_f32(float *k, int hd, const float *cs, enum kvd_rope_style style)
{
	for (int i = 0; i < hd / 2; i++) {
		int a = style == KVD_ROPE_NEOX ? i : 2 * i;
		int b = style == KVD_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
		float x0 = k[a], x1 = k[b], c = cs[2 * i], s = cs[2 * i + 1];

		k[a] = x0 * c - x1 * s;
		k[b] = x0 * s + x1 * c;
	}
}

/* f16, bf16 and f32 rows. The block-quantized types are not re-rotated: each
 * shift would quantize the kept keys again, so their error would grow with
 * every drop of a long generation. */
int cpu_kv_shift_supports(enum kvd_kv_type t)
{
	return t == KVD_KV_F16 || t == KVD_KV_BF16 || t == KVD_KV_F32;
}

int cpu_kv_shift(const struct kvd_model_weights *w, const struct kvd_paged_view *kv, const int32_t *pages,
		 uint32_t n_pages, uint32_t n_tokens, int32_t delta)
{
	struct kvd_program *p = NULL;
	int r = kvd_program_build(w, &p);
	if (r < 0)
		return r;
	r = cpu_kv_shift_program(p, &w->hp, kv, pages, n_pages, n_tokens, delta);
	kvd_program_free(p);
	return r;
}

int cpu_kv_shift_program(const struct kvd_program *p, const struct kvd_hparams *hp, const struct kvd_paged_view *kv,
			 const int32_t *pages, uint32_t n_pages, uint32_t n_tokens, int32_t delta)
{
	const struct kvd_kv_layout *L = &kv->layout;
	int hd = hp->head_dim;
	float *cs;

	if (!kv->base || hd <= 0 || hd % 2)
		return -EINVAL;
	/* rows of plain elements only (cpu_kv_shift_supports) */
	if (!cpu_kv_shift_supports(L->type) || L->token_stride != (size_t)L->kv_dim * (L->type == KVD_KV_F32 ? 4 : 2) ||
	    L->kv_dim != (uint32_t)(hp->n_head_kv * hd))
		return -ENOTSUP;
	if (n_tokens > (uint64_t)n_pages * L->block_size)
		return -EINVAL;
	for (uint32_t i = 0; i < (n_tokens + L->block_size - 1) / L->block_size; i++)
		if (pages[i] < 0 || (uint32_t)pages[i] >= kv->n_pages)
			return -EINVAL;
	if (delta == 0 || n_tokens == 0)
		return 0;
	cs = malloc(sizeof(float) * (size_t)hd);
	if (!cs)
		return -ENOMEM;
	for (int i = 0; i < p->n_ops; i++) {
		const struct kvd_op *op = &p->ops[i];
		int l = op->layer;
		if (op->kind != KVD_OP_ROPE)
			continue;
		cpu_rope_table(cs, hd, delta, op->theta, op->freq_scale, op->freqs);
		for (uint32_t t = 0; t < n_tokens; t++) {
			char *row = (char *)kv->base + (size_t)pages[t / L->block_size] * L->page_bytes +
				    (size_t)l * L->layer_stride + (size_t)(t % L->block_size) * L->token_stride;
			for (int h = 0; h < hp->n_head_kv; h++)
				if (L->type == KVD_KV_F32)
					rotate_head_f32((float *)row + (size_t)h * hd, hd, cs, hp->rope_style);
				else
					rotate_head((uint16_t *)row + (size_t)h * hd, hd, cs, hp->rope_style,
						    L->type == KVD_KV_BF16);
		}
	}
	free(cs);
	return 0;
}
