/*
 * kernels/cpu/kvshift.h — re-rotation of cached keys by a position delta
 * (the CPU backend's kv_shift, see kernels/backend.h).
 */
#ifndef KVD_CPU_KVSHIFT_H
#define KVD_CPU_KVSHIFT_H

#include <stdint.h>

#include "backend.h"
#include "program.h"

/* cos, sin of each pair's angle at position pos for one layer's RoPE
 * (kvshift.c); hd / 2 pairs into cs[0 .. hd). */
void cpu_rope_table(float *cs, int hd, int32_t pos, float theta, float pos_scale, const float *freq_factors);

/* Whether cpu_kv_shift re-rotates pools of element type t: f16, bf16 and
 * f32 (rows of plain elements; the block types would be quantized again at
 * every shift). The CPU backend's answer to KVD_CAPQ_KV_SHIFT. */
int cpu_kv_shift_supports(enum kvd_kv_type t);

/*
 * Rotate the keys of the first n_tokens token slots of pages[0 .. n_pages)
 * of the pool `kv` by delta positions, for every layer of w, as the forward
 * pass's RoPE would have rotated them delta positions later: each layer's
 * RoPE is its ROPE operation in the forward program of w (kernels/
 * program.h), so the shift and the forward pass read one description.
 * Pools of a type cpu_kv_shift_supports() takes only (-ENOTSUP otherwise);
 * -EINVAL for a page out of range or n_tokens beyond the pages; -ENOMEM;
 * 0 on success (nothing changed on failure).
 */
int cpu_kv_shift(const struct kvd_model_weights *w, const struct kvd_paged_view *kv, const int32_t *pages,
		 uint32_t n_pages, uint32_t n_tokens, int32_t delta);
/* The same with the program p already built from w (the backend's, from
 * load). */
int cpu_kv_shift_program(const struct kvd_program *p, const struct kvd_hparams *hp, const struct kvd_paged_view *kv,
			 const int32_t *pages, uint32_t n_pages, uint32_t n_tokens, int32_t delta);

#endif
