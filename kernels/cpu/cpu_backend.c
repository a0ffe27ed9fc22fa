/*
 * kernels/cpu/cpu_backend.c — the CPU backend: weights bound in place and
 * repacked for the tiled kernels, the matrix products every step runs, the
 * KV pages (copy, swap, re-rotation), the capability query and the ops
 * table. One step, the executor of the forward program that load() builds
 * (kernels/program.h), is kernels/cpu/cpu_forward.c.
 *
 * Threading: a persistent pool (kernels/cpu/threadpool.h); the engine thread
 * drives it, so the context is used from one thread at a time.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_impl.h"
#include "kvquant.h"
#include "kvshift.h"

static int cpu_init(const struct kvd_backend_config *cfg, void **ret_ctx)
{
	struct cpu_ctx *c = calloc(1, sizeof(*c));
	int n = cfg ? cfg->n_threads : 0;
	int r;

	if (!c)
		return -ENOMEM;
	if (n <= 0) {
		long on = sysconf(_SC_NPROCESSORS_ONLN);
		n = on > 0 ? (int)on : 1;
	}
	if (n > 256)
		n = 256;
	cpu_kernels_init_isa(&c->k, cfg ? cfg->cpu_isa : KVD_CPU_ISA_BEST);
	r = tp_create(n, &c->pool);
	if (r < 0) {
		free(c);
		return r;
	}
	*ret_ctx = c;
	return 0;
}

static void free_scratch(struct cpu_ctx *c)
{
	free(c->x); free(c->xn); free(c->xq); free(c->q); free(c->kk); free(c->vv);
	free(c->att); free(c->gate); free(c->up); free(c->tok_seq); free(c->tok_pos); free(c->rope);
	free(c->rope_alt);
	free(c->logit_rows); free(c->logit_src); free(c->logits_tmp);
	c->x = c->xn = c->q = c->kk = c->vv = c->att = c->gate = c->up = NULL;
	c->logit_rows = c->logits_tmp = c->rope = c->rope_alt = NULL;
	c->xq = NULL;
	c->tok_seq = c->tok_pos = c->logit_src = NULL;
	c->cap_tokens = 0;
	c->cap_logit_rows = 0;
}


static void free_packed(struct cpu_ctx *c)
{
	if (c->pack_mem)
		munmap(c->pack_mem, c->pack_len);
	free(c->packed);
	c->pack_mem = NULL;
	c->pack_len = 0;
	c->packed = NULL;
}

static const struct kvd_tensor *pk_tensor(const struct kvd_model_weights *w, int i)
{
	const struct kvd_layer_weights *L;
	if (i == w->hp.n_layer * PK_PER_LAYER)
		return &w->output;
	L = &w->layers[i / PK_PER_LAYER];
	switch (i % PK_PER_LAYER) {
	case PK_Q: return &L->wq;
	case PK_K: return &L->wk;
	case PK_V: return &L->wv;
	case PK_O: return &L->wo;
	case PK_GATE: return &L->w_gate;
	case PK_UP: return &L->w_up;
	default: return &L->w_down;
	}
}

struct pack_job {
	struct cpu_ctx *c;
	const struct kvd_model_weights *w;
};

static void pack_one(void *arg, uint32_t i, int tid)
{
	const struct pack_job *j = arg;
	const struct kvd_tensor *t = pk_tensor(j->w, (int)i);
	(void)tid;
	if (!j->c->packed[i])
		return;
	cpu_gemm_pack(t->type, t->data, t->row_bytes, t->rows, t->cols, (void *)j->c->packed[i],
		      j->c->k.pack_flags);
#ifdef MADV_PAGEOUT
	/* (a tied embedding table too: the few token rows a step reads
	 * fault back in) */
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t pmask = (uintptr_t)(pg > 0 ? pg : 4096) - 1;
	uintptr_t a0 = ((uintptr_t)t->data + pmask) & ~pmask;
	uintptr_t a1 = ((uintptr_t)t->data + (size_t)t->rows * t->row_bytes) & ~pmask;
	if (a1 > a0)
		madvise((void *)a0, a1 - a0, MADV_PAGEOUT);
#endif
}

/*
 * Repack every matrix for the tiled kernels when this CPU has them. The
 * packed copy is as large as the stored one for q4_0, q4_1, q8_0 and the
 * float types, about 3% larger for q4_K, and larger where quants are
 * widened to bytes: q5_0 (packed as q8_0) and q5_1 by half, q5_K by 57%,
 * q6_K by 30% (as large as stored for the AVX2 kernel's 4 + 2 bits); once a matrix is
 * packed, its stored pages are handed back to the kernel (MADV_PAGEOUT: a
 * residency hint that never changes their contents — a file mapping
 * rereads, anonymous memory would swap) so peak memory stays near one copy.
 */
static int pack_weights(struct cpu_ctx *c, const struct kvd_model_weights *w)
{
	int n = w->hp.n_layer * PK_PER_LAYER + 1;
	size_t total = 0, off = 0;
	int any = 0;

	c->packed = calloc((size_t)n, sizeof(*c->packed));
	if (!c->packed)
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		const struct kvd_tensor *t = pk_tensor(w, i);
		size_t b = c->k.gemm[t->type] || c->k.gemmf[t->type]
				   ? cpu_gemm_packed_bytes(t->type, t->rows, t->cols, c->k.pack_flags)
				   : 0;
		total += (b + 63) & ~(size_t)63;
		any |= b != 0;
	}
	if (!any)
		return 0;
	c->pack_len = (total + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
	c->pack_mem = mmap(NULL, c->pack_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c->pack_mem == MAP_FAILED) {
		c->pack_mem = NULL;
		return -ENOMEM;
	}
	madvise(c->pack_mem, c->pack_len, MADV_HUGEPAGE);
	for (int i = 0; i < n; i++) {
		const struct kvd_tensor *t = pk_tensor(w, i);
		size_t b = c->k.gemm[t->type] || c->k.gemmf[t->type]
				   ? cpu_gemm_packed_bytes(t->type, t->rows, t->cols, c->k.pack_flags)
				   : 0;
		if (!b)
			continue;
		c->packed[i] = (char *)c->pack_mem + off;
		off += (b + 63) & ~(size_t)63;
	}
	struct pack_job j = {c, w};
	tp_for(c->pool, pack_one, &j, (uint32_t)n);
	return 0;
}

static void cpu_destroy(void *ctx)
{
	struct cpu_ctx *c = ctx;
	if (!c)
		return;
	tp_destroy(c->pool);
	kvd_program_free(c->prog);
	free_packed(c);
	free_scratch(c);
	cpu_attn_free(&c->attn);
	free(c);
}

static int cpu_load(void *ctx, const struct kvd_model_weights *w)
{
	struct cpu_ctx *c = ctx;
	int r;

	r = kvd_model_weights_check_features(w, CPU_MAX_GROUP, CPU_FEATURES);
	if (r < 0)
		return r == -ENOTSUP ? r : -EINVAL;
	free_packed(c);
	kvd_program_free(c->prog);
	c->prog = NULL;
	c->w = NULL;
	r = kvd_program_build(w, &c->prog);
	if (r < 0)
		return r;
	if (kvd_program_missing(c->prog, CPU_OP_KINDS)) {
		r = -ENOTSUP;
		goto fail;
	}
	c->attn_scale = c->prog->attn_scale;
	r = pack_weights(c, w);
	if (r < 0)
		goto fail;
	cpu_attn_setup(&c->attn, c->pool, &c->k, &w->hp, c->attn_scale);
	r = cpu_attn_set_packing(&c->attn, w);
	if (r < 0)
		goto fail;
	c->w = w;
	return 0;
fail:
	free_packed(c);
	kvd_program_free(c->prog);
	c->prog = NULL;
	return r;
}

static int cpu_attach_kv(void *ctx, const struct kvd_paged_view *view)
{
	struct cpu_ctx *c = ctx;
	const struct kvd_hparams *hp;
	struct kvd_kv_layout want;

	if (!c->w)
		return -EINVAL;
	hp = &c->w->hp;
	/* every element type is implemented; the strides must be the type's */
	if (!view->base || view->layout.block_size == 0 ||
	    kvd_kv_layout_init_type(&want, hp, view->layout.block_size, view->layout.type) < 0 ||
	    view->layout.n_layer != want.n_layer || view->layout.kv_dim != want.kv_dim ||
	    view->layout.token_stride != want.token_stride || view->layout.v_offset != want.v_offset ||
	    view->layout.layer_stride != want.layer_stride || view->layout.page_bytes != want.page_bytes)
		return -EINVAL;
	c->kv = *view;
	c->kv_attached = 1;
	return 0;
}


/* ---- parallel pieces ----------------------------------------------------- */

#define MM_ROW_TILE 32 /* a multiple of GEMM_ROWS */
#ifndef MM_TOKEN_BYTES
#define MM_TOKEN_BYTES (128 << 10)
#endif
#ifndef MM_SPAN_BYTES
#define MM_SPAN_BYTES (384 << 10)
#endif
#ifndef MM_CHUNK_BYTES
#define MM_CHUNK_BYTES (512 << 10)
#endif

/* Rows [r0, r1) of a product on the tiles of GEMM_COLS tokens: the range
 * in spans of MM_SPAN_BYTES of weights, and for each span the tokens in
 * blocks of MM_TOKEN_BYTES of activations, every strip of MM_ROW_TILE rows
 * of the span passing over a block while both stay in L2. Token by token
 * over each strip instead, a prefill's activations (1-5 MB) came from L3
 * again for every strip: with both cores doing so, one of them ran its
 * tiles a fifth slower (tile_bench --cols 3072 --tokens 512 --rows 64 as
 * two processes pinned to the two cores of a Zen 4 host: 143 and 176
 * GMAC/s, against 177 each alone). Prefill 512 on 2 threads, median of 6
 * alternating rounds: 1B Q4_K_M 1.04x, 3B 1.00x (its chunks of rows are
 * large already). Each (row, token) result is the same bits in any order;
 * a decode's one block passes the strips in address order as before. */
static void mm_range_blocked(const struct mm_job *j, int64_t r0, int64_t r1, gemm_fn gemm, gemmf_fn gemmf,
			     int64_t nb, size_t gbytes)
{
	size_t tok_bytes = gemm ? (size_t)j->ldq * sizeof(struct q8_block) : (size_t)j->ldx * sizeof(float);
	int tb = (int)(MM_TOKEN_BYTES / tok_bytes) / GEMM_COLS * GEMM_COLS;
	if (tb < GEMM_COLS)
		tb = GEMM_COLS;
	/* rows a pass over a token block: as many strips as MM_SPAN_BYTES of
	 * weights */
	int64_t span = (int64_t)(MM_SPAN_BYTES / (gbytes * (MM_ROW_TILE / GEMM_ROWS))) * MM_ROW_TILE;
	if (span < MM_ROW_TILE)
		span = MM_ROW_TILE;
	for (int64_t s0 = r0; s0 < r1; s0 += span) {
		int64_t s1 = s0 + span < r1 ? s0 + span : r1;
		for (int t0 = 0; t0 < j->T; t0 += tb) {
			int t1 = t0 + tb < j->T ? t0 + tb : j->T;
			for (int64_t rt = s0; rt < s1; rt += MM_ROW_TILE) {
				int64_t re = rt + MM_ROW_TILE < s1 ? rt + MM_ROW_TILE : s1;
				for (int t = t0; t < t1; t += GEMM_COLS) {
					int C = t1 - t < GEMM_COLS ? t1 - t : GEMM_COLS;
					for (int64_t r = rt; r < re; r += GEMM_ROWS) {
						int R = re - r < GEMM_ROWS ? (int)(re - r) : GEMM_ROWS;
						const char *g = (const char *)j->wp + (size_t)(r / GEMM_ROWS) * gbytes;
						if (gemm)
							gemm(g, nb, R, j->xq + t * j->ldq, (size_t)j->ldq, C,
							     j->y + t * j->ldy + r, (size_t)j->ldy);
						else
							gemmf(g, nb, R, j->x + t * j->ldx, (size_t)j->ldx, C,
							      j->y + t * j->ldy + r, (size_t)j->ldy);
					}
				}
			}
		}
	}
}

static void mm_range(const struct mm_job *j, int64_t r0, int64_t r1)
{
	vec_dot_fn dot = j->c->k.dot[j->w->type];
	const char *wbase = j->w->data;
	size_t rb = j->w->row_bytes;
	int64_t n = j->w->cols;

	gemm_fn gemm = j->xq && j->wp ? j->c->k.gemm[j->w->type] : NULL;
	gemmf_fn gemmf = !j->xq && j->wp ? j->c->k.gemmf[j->w->type] : NULL;
	gemm16_fn gemm16 = gemm ? j->c->k.gemm16[j->w->type] : NULL;
	if (gemm || gemmf) {
		/* strips of MM_ROW_TILE rows stay in L1 while all tokens pass
		 * over them, GEMM16_COLS tokens at a time where gemm16 has them
		 * (the same bits), else GEMM_COLS */
		int64_t nb = n / QK;
		size_t gbytes = cpu_gemm_group_block_bytes(j->w->type, j->c->k.pack_flags) * (size_t)nb;
		if (!gemm16 || j->T < GEMM16_COLS) {
			mm_range_blocked(j, r0, r1, gemm, gemmf, nb, gbytes);
			return;
		}
		for (int64_t rt = r0; rt < r1; rt += MM_ROW_TILE) {
			int64_t re = rt + MM_ROW_TILE < r1 ? rt + MM_ROW_TILE : r1;
			int t = 0, ntile = gemm16 ? j->T / GEMM16_COLS : 0, ok = 1;
			/* each group of rows with all the tiles of 16 tokens */
			for (int64_t r = rt; ntile && r < re; r += GEMM_ROWS) {
				int R = re - r < GEMM_ROWS ? (int)(re - r) : GEMM_ROWS;
				const char *g = (const char *)j->wp + (size_t)(r / GEMM_ROWS) * gbytes;
				if (gemm16(g, nb, R, j->xq, (size_t)j->ldq, ntile, j->y + r, (size_t)j->ldy) < 0) {
					ok = 0; /* out of memory for its scratch: the tiles of 8 below */
					break;
				}
			}
			if (ntile && ok)
				t = ntile * GEMM16_COLS;
			for (; t < j->T; t += GEMM_COLS) {
				int C = j->T - t < GEMM_COLS ? j->T - t : GEMM_COLS;
				for (int64_t r = rt; r < re; r += GEMM_ROWS) {
					int R = re - r < GEMM_ROWS ? (int)(re - r) : GEMM_ROWS;
					const char *g = (const char *)j->wp + (size_t)(r / GEMM_ROWS) * gbytes;
					if (gemm)
						gemm(g, nb, R, j->xq + t * j->ldq, (size_t)j->ldq, C, j->y + t * j->ldy + r,
						     (size_t)j->ldy);
					else
						gemmf(g, nb, R, j->x + t * j->ldx, (size_t)j->ldx, C, j->y + t * j->ldy + r,
						      (size_t)j->ldy);
				}
			}
		}
		return;
	}
	/* Tile rows so a tile of weights stays in cache across all tokens. */
	for (int64_t rt = r0; rt < r1; rt += MM_ROW_TILE) {
		int64_t re = rt + MM_ROW_TILE < r1 ? rt + MM_ROW_TILE : r1;
		for (int t = 0; t < j->T; t++) {
			const float *xr = j->x + t * j->ldx;
			const struct q8_block *qr = j->xq ? j->xq + t * j->ldq : NULL;
			float *yr = j->y + t * j->ldy;
			for (int64_t r = rt; r < re; r++)
				yr[r] = dot(wbase + r * rb, xr, qr, n);
		}
	}
}

static void mm_plan(struct mm_multi *m, int nth)
{
	m->first[0] = 0;
	for (int i = 0; i < m->n; i++) {
		int64_t rows = m->jobs[i].w->rows;
		/* about 8 chunks per thread, whole tiles (rounded to the nearest
		 * tile: rounding up turns 576 rows on 2 threads into 9 chunks,
		 * one thread doing 5) */
		int64_t cr = (rows / (8 * (int64_t)nth) + MM_ROW_TILE / 2) / MM_ROW_TILE * MM_ROW_TILE;
		/* and at most MM_CHUNK_BYTES of weights: the last chunk of a
		 * large matrix (the output one) would otherwise keep the other
		 * threads waiting for a sixteenth of it */
		int64_t cap = MM_CHUNK_BYTES / (int64_t)m->jobs[i].w->row_bytes / MM_ROW_TILE * MM_ROW_TILE;
		if (cr > cap)
			cr = cap;
		if (cr < MM_ROW_TILE)
			cr = MM_ROW_TILE;
		m->chunk_rows[i] = cr;
		m->first[i + 1] = m->first[i] + (int)((rows + cr - 1) / cr);
	}
}

static void mm_chunk(void *arg, uint32_t k, int tid)
{
	const struct mm_multi *m = arg;
	int job = 0;
	(void)tid;
	while ((int)k >= m->first[job + 1])
		job++;
	const struct mm_job *j = &m->jobs[job];
	int64_t r0 = (int64_t)((int)k - m->first[job]) * m->chunk_rows[job];
	int64_t r1 = r0 + m->chunk_rows[job] < j->w->rows ? r0 + m->chunk_rows[job] : j->w->rows;
	mm_range(j, r0, r1);
}

void be_mm_run(struct cpu_ctx *c, struct mm_multi *m)
{
	mm_plan(m, tp_size(c->pool));
	tp_for(c->pool, mm_chunk, m, (uint32_t)m->first[m->n]);
}

/* Quantize rows of an activation matrix, split across threads. */
struct q8_job {
	const struct cpu_ctx *c;
	const float *x;
	int64_t ldx;
	struct q8_block *xq;
	int64_t ldq;
	int T;
	int64_t n;
	int k;
};

static void q8_worker(void *arg, int ith, int nth)
{
	const struct q8_job *j = arg;
	void (*quant)(const float *, struct q8_block *, int64_t) = j->k ? j->c->k.quantize_q8k : j->c->k.quantize_q8;
	for (int t = ith; t < j->T; t += nth)
		quant(j->x + t * j->ldx, j->xq + t * j->ldq, j->n);
}

void be_run_rows(struct cpu_ctx *c, tp_fn fn, void *arg, int T)
{
	if (T <= 2)
		fn(arg, 0, 1);
	else
		tp_run(c->pool, fn, arg);
}

void be_quantize_rows(struct cpu_ctx *c, const float *x, int64_t ldx, struct q8_block *xq, int64_t ldq, int T,
		      int64_t n, int k)
{
	struct q8_job j = {c, x, ldx, xq, ldq, T, n, k};
	be_run_rows(c, q8_worker, &j, T);
}

void be_matmul(struct cpu_ctx *c, const struct kvd_tensor *w, const void *wp, int T, const float *x, int64_t ldx,
	       const struct q8_block *xq, int64_t ldq, float *y, int64_t ldy)
{
	struct mm_multi m = {.jobs = {{c, w, T, x, ldx, wtype_is_quantized(w->type) ? xq : NULL, ldq, y, ldy, wp}},
			     .n = 1};
	be_mm_run(c, &m);
}


static int cpu_page_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct cpu_ctx *c = ctx;
	const struct kvd_kv_layout *L = &c->kv.layout;
	char *base = c->kv.base;

	if (!c->kv_attached || dst >= c->kv.n_pages || src >= c->kv.n_pages || n_tokens > L->block_size)
		return -EINVAL;
	if (dst == src || n_tokens == 0)
		return 0;
	for (uint32_t l = 0; l < L->n_layer; l++) {
		size_t off = (size_t)l * L->layer_stride;
		size_t n = (size_t)n_tokens * L->token_stride;
		memcpy(base + (size_t)dst * L->page_bytes + off, base + (size_t)src * L->page_bytes + off, n);
		memcpy(base + (size_t)dst * L->page_bytes + off + L->v_offset,
		       base + (size_t)src * L->page_bytes + off + L->v_offset, n);
	}
	return 0;
}

static int cpu_page_read(void *ctx, uint32_t page, void *host_dst)
{
	struct cpu_ctx *c = ctx;
	if (!c->kv_attached || page >= c->kv.n_pages)
		return -EINVAL;
	memcpy(host_dst, (char *)c->kv.base + (size_t)page * c->kv.layout.page_bytes, c->kv.layout.page_bytes);
	return 0;
}

static int cpu_page_write(void *ctx, uint32_t page, const void *host_src)
{
	struct cpu_ctx *c = ctx;
	if (!c->kv_attached || page >= c->kv.n_pages)
		return -EINVAL;
	memcpy((char *)c->kv.base + (size_t)page * c->kv.layout.page_bytes, host_src, c->kv.layout.page_bytes);
	return 0;
}

static int cpu_kv_shift_op(void *ctx, const int32_t *pages, uint32_t n_pages, uint32_t n_tokens, int32_t delta)
{
	struct cpu_ctx *c = ctx;

	if (!c->kv_attached || !c->w)
		return -EINVAL;
	return cpu_kv_shift_program(c->prog, &c->w->hp, &c->kv, pages, n_pages, n_tokens, delta);
}

/* The capability query (kernels/backend.h): every answer of this backend
 * is here, so the engine never learns one another way. */
static int cpu_supports(void *ctx, const struct kvd_cap_query *q)
{
	struct cpu_ctx *c = ctx;

	switch (q->kind) {
	case KVD_CAPQ_WEIGHT_TYPE:
		/* the dot kernels exist for every type the loader binds */
		return (int)q->wtype >= 0 && (int)q->wtype <= KVD_WTYPE_BF16 && c->k.dot[q->wtype] != NULL;
	case KVD_CAPQ_MODEL_FEATURE:
		return q->feature && !(q->feature & ~CPU_FEATURES);
	case KVD_CAPQ_ATTENTION:
		return q->head_dim > 0 && q->head_dim % 2 == 0 && q->n_rep >= 1 && q->n_rep <= CPU_MAX_GROUP;
	case KVD_CAPQ_KV_TYPE:
		/* every element type (the quantized ones in whole blocks per head) */
		return kvd_kv_row_bytes(q->kv_type, (uint32_t)(q->head_dim > 0 ? q->head_dim : 0)) != 0;
	case KVD_CAPQ_KV_FAST:
		/* bf16 with bfloat16 products (AVX-512 BF16, allowed by cpu_isa,
		 * a head size it has the kernel for) beats f16 at f16's size */
		return q->kv_type == KVD_KV_BF16 && c->k.isa_level >= 2 && strcmp(c->k.isa, "generic") &&
		       cpu_attn_rows_bf16(q->head_dim) != NULL;
	case KVD_CAPQ_KV_SHIFT:
		return cpu_kv_shift_supports(q->kv_type);
	case KVD_CAPQ_RELEASED_PAGES:
		return 1;
	}
	return 0;
}

const struct kvd_backend_ops kvd_cpu_backend = {
	.name = "cpu",
	.version = KVD_BACKEND_ABI_VERSION,
	.caps = KVD_CAP_PACKED_KV,
	.init = cpu_init,
	.load = cpu_load,
	.attach_kv = cpu_attach_kv,
	.forward = be_forward,
	.page_copy = cpu_page_copy,
	.page_read = cpu_page_read,
	.page_write = cpu_page_write,
	.destroy = cpu_destroy,
	.kv_shift = cpu_kv_shift_op,
	.supports = cpu_supports,
};
