/*
 * kernels/cpu/cpu_backend.c — the Llama forward pass on the CPU, over a
 * batch of sequences whose K/V live in pages.
 *
 * One forward() call takes any mix of prefill chunks and single-token
 * decodes. All the batch's tokens are laid out as rows of one activation
 * matrix, so every weight matrix is streamed from memory once per step
 * whatever the batch size; attention (kernels/cpu/attention.c) then runs per
 * (token, KV head), reading K/V straight from the pages named by that
 * token's sequence's page table.
 *
 * Determinism: every output element is computed by the same code path with
 * the same reduction order whatever the batch's shape, the thread count, the
 * chunking of a prompt or the pages' physical placement: matrix products
 * split work by output row, each (row, token) dot product runs over the
 * whole row in block order, and attention walks positions 0..p in order
 * with no dependence on page boundaries. So a sequence's logits are
 * bit-identical alone or in any batch.
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

#include "attention.h"
#include "backend.h"
#include "kvquant.h"
#include "kvshift.h"
#include "ops.h"
#include "threadpool.h"

#define CPU_MAX_BATCH_TOKENS (1 << 16)

/* The departures from the Llama base this forward pass computes (see
 * kernels/backend.h): all of them. The Llama path is unchanged by them:
 * each applies only when the model's description uses it. */
#define CPU_FEATURES KVD_FEAT_ALL
/* attention keeps one running max per query head of a group */
#define CPU_MAX_GROUP 64

struct cpu_ctx {
	struct tp *pool;
	struct cpu_kernels k;
	const struct kvd_model_weights *w;
	float attn_scale; /* Q.K multiplier: hp.attn_scale, or 1/sqrt(head_dim) */
	struct kvd_paged_view kv;
	int kv_attached;

	/* weights repacked for the tiled kernels (see gemm_avx512.c): one
	 * anonymous mapping, and per matrix its packed data or NULL when the
	 * matrix is used as stored; PK_* per layer, then the output matrix */
	void *pack_mem;
	size_t pack_len;
	const void **packed;

	/* per-step scratch, grown as needed */
	int cap_tokens;
	float *x;       /* [T][n_embd] residual stream */
	float *xn;      /* [T][max(n_embd, n_ff)] normalised input of a matmul */
	struct q8_block *xq; /* [T][max(n_embd, n_ff) / 32] */
	float *q;       /* [T][n_head * head_dim] */
	float *kk;      /* [T][kv_dim] */
	float *vv;      /* [T][kv_dim] */
	float *att;     /* [T][n_head * head_dim] */
	float *gate;    /* [T][n_ff] */
	float *up;      /* [T][n_ff] */
	int32_t *tok_seq; /* [T] sequence index of each row */
	int32_t *tok_pos; /* [T] position of each row */
	float *rope;      /* [T][head_dim]: cos, sin of each rotated pair */
	float *rope_alt;  /* the same for the RoPE used before (per-layer RoPE) */
	struct cpu_attn attn; /* attention and its scratch (attention.c) */
	float *logit_rows;/* [T][n_embd] normalised rows that want logits */
	int32_t *logit_src;/* [T] row index feeding each logit row */
	float *logits_tmp;/* [T][n_vocab] when callers want rows laid out differently */
	int cap_logit_rows;
};

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

enum { PK_Q, PK_K, PK_V, PK_O, PK_GATE, PK_UP, PK_DOWN, PK_PER_LAYER };

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
	cpu_gemm_pack(t->type, t->data, t->row_bytes, t->rows, t->cols, (void *)j->c->packed[i]);
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
 * q6_K by 30%; once a matrix is
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
		size_t b = c->k.gemm[t->type] || c->k.gemmf[t->type] ? cpu_gemm_packed_bytes(t->type, t->rows, t->cols) : 0;
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
		size_t b = c->k.gemm[t->type] || c->k.gemmf[t->type] ? cpu_gemm_packed_bytes(t->type, t->rows, t->cols) : 0;
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
	c->w = NULL;
	c->attn_scale = w->hp.attn_scale > 0 ? w->hp.attn_scale : 1.0f / sqrtf((float)w->hp.head_dim);
	r = pack_weights(c, w);
	if (r < 0) {
		free_packed(c);
		return r;
	}
	cpu_attn_setup(&c->attn, c->pool, &c->k, &w->hp, c->attn_scale);
	r = cpu_attn_set_packing(&c->attn, w);
	if (r < 0) {
		free_packed(c);
		return r;
	}
	c->w = w;
	return 0;
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

#define GROW(ptr, n)                                                  \
	do {                                                          \
		void *np_ = realloc((ptr), (size_t)(n) * sizeof(*(ptr))); \
		if (!np_)                                             \
			return -ENOMEM;                               \
		(ptr) = np_;                                          \
	} while (0)

static int ensure_scratch(struct cpu_ctx *c, int T, int max_pos, int n_logit_rows)
{
	const struct kvd_hparams *hp = &c->w->hp;
	int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	int64_t wide = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
	if (qd > wide)
		wide = qd;

	if (T > c->cap_tokens) {
		int n = T < 16 ? 16 : T;
		GROW(c->x, n * (int64_t)hp->n_embd);
		GROW(c->xn, n * wide);
		GROW(c->xq, n * q8_row_len(wide));
		GROW(c->q, n * qd);
		GROW(c->kk, n * kvd);
		GROW(c->vv, n * kvd);
		GROW(c->att, n * qd);
		GROW(c->gate, n * (int64_t)hp->n_ff);
		GROW(c->up, n * (int64_t)hp->n_ff);
		GROW(c->tok_seq, n);
		GROW(c->tok_pos, n);
		GROW(c->rope, n * (int64_t)hp->head_dim);
		GROW(c->rope_alt, n * (int64_t)hp->head_dim);
		c->cap_tokens = n;
	}
	if (n_logit_rows > c->cap_logit_rows) {
		GROW(c->logit_rows, n_logit_rows * (int64_t)hp->n_embd);
		GROW(c->logit_src, n_logit_rows);
		GROW(c->logits_tmp, n_logit_rows * (int64_t)hp->n_vocab);
		c->cap_logit_rows = n_logit_rows;
	}
	return cpu_attn_reserve(&c->attn, max_pos);
}

/* ---- parallel pieces ----------------------------------------------------- */

/* Y[t][r] = dot(W row r, X row t) for rows split across threads. The
 * activation rows are given as floats (ldx) and, for quantized weights, as
 * q8 blocks (ldq blocks per row). Output row stride ldy. */
struct mm_job {
	const struct cpu_ctx *c;
	const struct kvd_tensor *w;
	int T;
	const float *x;
	int64_t ldx;
	const struct q8_block *xq;
	int64_t ldq;
	float *y;
	int64_t ldy;
	const void *wp; /* packed weights (tiled kernels) or NULL */
};

#define MM_ROW_TILE 32 /* a multiple of GEMM_ROWS */
#ifndef MM_CHUNK_BYTES
#define MM_CHUNK_BYTES (512 << 10)
#endif

static void mm_range(const struct mm_job *j, int64_t r0, int64_t r1)
{
	vec_dot_fn dot = j->c->k.dot[j->w->type];
	const char *wbase = j->w->data;
	size_t rb = j->w->row_bytes;
	int64_t n = j->w->cols;

	gemm_fn gemm = j->xq && j->wp ? j->c->k.gemm[j->w->type] : NULL;
	gemmf_fn gemmf = !j->xq && j->wp ? j->c->k.gemmf[j->w->type] : NULL;
	if (gemm || gemmf) {
		/* strips of MM_ROW_TILE rows stay in L1 while all tokens pass
		 * over them, GEMM_COLS tokens at a time */
		int64_t nb = n / QK;
		size_t gbytes = cpu_gemm_group_block_bytes(j->w->type) * (size_t)nb;
		for (int64_t rt = r0; rt < r1; rt += MM_ROW_TILE) {
			int64_t re = rt + MM_ROW_TILE < r1 ? rt + MM_ROW_TILE : r1;
			for (int t = 0; t < j->T; t += GEMM_COLS) {
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

/*
 * Several matrices sharing one input, as one parallel region. Rows are cut
 * into chunks handed out by the pool (tp_for), so a thread that the OS
 * preempts holds up at most the chunk it is on: the others take the rest
 * (static halves would make every step wait for the slowest thread). A
 * chunk's results do not depend on who computes it.
 */
#define MM_MAX_JOBS 3

struct mm_multi {
	struct mm_job jobs[MM_MAX_JOBS];
	int n;
	int64_t chunk_rows[MM_MAX_JOBS];
	int first[MM_MAX_JOBS + 1];   /* first chunk of each job; first[n] = total */
};

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

static void mm_run(struct cpu_ctx *c, struct mm_multi *m)
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
};

static void q8_worker(void *arg, int ith, int nth)
{
	const struct q8_job *j = arg;
	for (int t = ith; t < j->T; t += nth)
		j->c->k.quantize_q8(j->x + t * j->ldx, j->xq + t * j->ldq, j->n);
}

/* fn over T rows of activations: inline for one or two rows, where a
 * parallel region costs more than the work; every worker's rows are
 * computed the same way either way. */
static void run_rows(struct cpu_ctx *c, tp_fn fn, void *arg, int T)
{
	if (T <= 2)
		fn(arg, 0, 1);
	else
		tp_run(c->pool, fn, arg);
}

static void quantize_rows(struct cpu_ctx *c, const float *x, int64_t ldx, struct q8_block *xq, int64_t ldq,
			  int T, int64_t n)
{
	struct q8_job j = {c, x, ldx, xq, ldq, T, n};
	run_rows(c, q8_worker, &j, T);
}

static void matmul(struct cpu_ctx *c, const struct kvd_tensor *w, const void *wp, int T, const float *x,
		   int64_t ldx, const struct q8_block *xq, int64_t ldq, float *y, int64_t ldy)
{
	struct mm_multi m = {.jobs = {{c, w, T, x, ldx, wtype_is_quantized(w->type) ? xq : NULL, ldq, y, ldy, wp}},
			     .n = 1};
	mm_run(c, &m);
}

/* x[i] += y[i] (the residual stream), four lanes at a time: the same
 * float sums as the scalar loop */
typedef float v4f __attribute__((vector_size(16), aligned(4)));
typedef int32_t v4i __attribute__((vector_size(16)));

static void add_row(float *x, const float *y, int64_t n)
{
	int64_t i = 0;
	for (; i + 4 <= n; i += 4) {
		v4f a, b;
		memcpy(&a, x + i, sizeof(a));
		memcpy(&b, y + i, sizeof(b));
		a += b;
		memcpy(x + i, &a, sizeof(a));
	}
	for (; i < n; i++)
		x[i] += y[i];
}

/* cos and sin of pair i's angle at position pos, computed in double once
 * per token and step. */
static void rope_table(float *cs, int hd, int pos, float theta_base)
{
	for (int i = 0; i < hd / 2; i++) {
		double th = (double)pos * pow((double)theta_base, -2.0 * i / hd);
		cs[2 * i] = (float)cos(th);
		cs[2 * i + 1] = (float)sin(th);
	}
}

/* Rotate the pairs of one head vector by a token's rope table: each
 * rotated value a product, a product and a sum or difference, as
 * x0 * cs - x1 * sn and x0 * sn + x1 * cs; four lanes at a time. */
static void rope_head(float *v, int hd, const float *tab, enum kvd_rope_style style)
{
	int i = 0;
	if (style == KVD_ROPE_NEOX) {
		/* pair i is (i, i + hd / 2): the halves as vectors, the table
		 * de-interleaved */
		for (; i + 4 <= hd / 2; i += 4) {
			v4f t0, t1, x0, x1;
			memcpy(&t0, tab + 2 * i, sizeof(t0));
			memcpy(&t1, tab + 2 * i + 4, sizeof(t1));
			memcpy(&x0, v + i, sizeof(x0));
			memcpy(&x1, v + i + hd / 2, sizeof(x1));
			v4f cs = __builtin_shuffle(t0, t1, (v4i){0, 2, 4, 6});
			v4f sn = __builtin_shuffle(t0, t1, (v4i){1, 3, 5, 7});
			v4f y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
			memcpy(v + i, &y0, sizeof(y0));
			memcpy(v + i + hd / 2, &y1, sizeof(y1));
		}
	} else {
		/* pair i is (2i, 2i + 1), laid out as the table's (cos, sin) */
		for (; i + 2 <= hd / 2; i += 2) {
			v4f t, x;
			memcpy(&t, tab + 2 * i, sizeof(t));
			memcpy(&x, v + 2 * i, sizeof(x));
			v4f a = __builtin_shuffle(x, (v4i){0, 0, 2, 2}) * t;
			v4f b = __builtin_shuffle(x, (v4i){1, 1, 3, 3}) * __builtin_shuffle(t, (v4i){1, 0, 3, 2});
			v4f y = __builtin_shuffle(a - b, a + b, (v4i){0, 5, 2, 7});
			memcpy(v + 2 * i, &y, sizeof(y));
		}
	}
	for (; i < hd / 2; i++) {
		float cs = tab[2 * i], sn = tab[2 * i + 1];
		int a = style == KVD_ROPE_NEOX ? i : 2 * i;
		int b = style == KVD_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
		float x0 = v[a], x1 = v[b];
		v[a] = x0 * cs - x1 * sn;
		v[b] = x0 * sn + x1 * cs;
	}
}

struct step {
	struct cpu_ctx *c;
	const struct kvd_batch *b;
	int T;
	int layer;
};

/* RoPE on Q and K, then K and V stored into their pages in the pool's
 * element type (f16, or kvquant.h's). */
static void rope_store_worker(void *arg, int ith, int nth)
{
	const struct step *s = arg;
	struct cpu_ctx *c = s->c;
	const struct kvd_hparams *hp = &c->w->hp;
	const struct kvd_kv_layout *L = &c->kv.layout;
	int hd = hp->head_dim, kvd = hp->n_head_kv * hd, qd = hp->n_head * hd;

	for (int t = ith; t < s->T; t += nth) {
		const struct kvd_batch_seq *sq = &s->b->seqs[c->tok_seq[t]];
		int pos = c->tok_pos[t];
		float *q = c->q + (int64_t)t * qd, *k = c->kk + (int64_t)t * kvd, *v = c->vv + (int64_t)t * kvd;
		const float *tab = c->rope + (int64_t)t * hd;
		const struct kvd_layer_weights *Lw = &c->w->layers[s->layer];
		if (Lw->bq.data) {
			const float *bq = Lw->bq.data, *bk = Lw->bk.data, *bv = Lw->bv.data;
			for (int i = 0; i < qd; i++)
				q[i] += bq[i];
			for (int i = 0; i < kvd; i++) {
				k[i] += bk[i];
				v[i] += bv[i];
			}
		}
		if (Lw->q_norm.data) {
			for (int h = 0; h < hp->n_head; h++)
				c->k.rmsnorm(q + h * hd, q + h * hd, Lw->q_norm.data, hd, hp->rms_eps);
			for (int h = 0; h < hp->n_head_kv; h++)
				c->k.rmsnorm(k + h * hd, k + h * hd, Lw->k_norm.data, hd, hp->rms_eps);
		}
		for (int h = 0; h < hp->n_head; h++)
			rope_head(q + h * hd, hd, tab, hp->rope_style);
		for (int h = 0; h < hp->n_head_kv; h++)
			rope_head(k + h * hd, hd, tab, hp->rope_style);
		int32_t page = sq->pages[pos / (int)L->block_size];
		char *base = (char *)c->kv.base + (size_t)page * L->page_bytes + (size_t)s->layer * L->layer_stride +
			     (size_t)(pos % (int)L->block_size) * L->token_stride;
		if (L->type == KVD_KV_F16) {
			c->k.store_f16((uint16_t *)base, k, kvd);
			c->k.store_f16((uint16_t *)(base + L->v_offset), v, kvd);
		} else {
			cpu_kvq_store_row(L->type, base, k, kvd);
			cpu_kvq_store_row(L->type, base + L->v_offset, v, kvd);
		}
	}
}

/* Per row: with `residual`, a sublayer's output in xn (normalised by
 * `post` first where the model has such a norm) is added to x; then, with
 * g, xn = rmsnorm(x) * g and its q8 form. */
struct norm_job {
	struct cpu_ctx *c;
	const float *g;
	int T;
	int quantize;
	int residual;
	const float *post;
};

static void norm_worker(void *arg, int ith, int nth)
{
	const struct norm_job *j = arg;
	struct cpu_ctx *c = j->c;
	const struct kvd_hparams *hp = &c->w->hp;
	int64_t n = hp->n_embd;
	for (int t = ith; t < j->T; t += nth) {
		float *x = c->x + t * n, *xn = c->xn + t * n;
		if (j->residual) {
			if (j->post)
				c->k.rmsnorm(xn, xn, j->post, n, hp->rms_eps);
			add_row(x, xn, n);
		}
		if (!j->g)
			continue;
		c->k.rmsnorm(xn, x, j->g, n, hp->rms_eps);
		if (j->quantize)
			c->k.quantize_q8(xn, c->xq + t * q8_row_len(n), n);
	}
}

static void norm_rows(struct cpu_ctx *c, const struct kvd_tensor *g, int T, int quantize)
{
	struct norm_job j = {c, g->data, T, quantize, 0, NULL};
	run_rows(c, norm_worker, &j, T);
}

/* x += post-norm(xn), then (g non-NULL) xn = rmsnorm(x) * g, quantized:
 * one parallel region for the end of a sublayer and the next one's input. */
static void residual_norm_rows(struct cpu_ctx *c, const float *post, const float *g, int T)
{
	struct norm_job j = {c, g, T, 1, 1, post};
	run_rows(c, norm_worker, &j, T);
}

/* Every row's RoPE table (cos, sin of each pair at its position) for
 * (theta, pos_scale); ext: through cpu_rope_table (per-layer RoPE, scaled
 * positions, frequency factors), else rope_table. */
struct rope_job {
	struct cpu_ctx *c;
	int T;
	int ext;
	float theta, scale;
};

static void rope_worker(void *arg, int ith, int nth)
{
	const struct rope_job *j = arg;
	struct cpu_ctx *c = j->c;
	int hd = c->w->hp.head_dim;
	for (int t = ith; t < j->T; t += nth) {
		if (j->ext)
			cpu_rope_table(c->rope + (int64_t)t * hd, hd, c->tok_pos[t], j->theta, j->scale,
				       c->w->rope_freqs.data);
		else
			rope_table(c->rope + (int64_t)t * hd, hd, c->tok_pos[t], j->theta);
	}
}

/* h = silu(gate) * up, in place into gate; then its q8 form. */
struct swiglu_job {
	struct cpu_ctx *c;
	int T;
	int quantize;
	int gelu;
};

static void swiglu_worker(void *arg, int ith, int nth)
{
	const struct swiglu_job *j = arg;
	struct cpu_ctx *c = j->c;
	int64_t n = c->w->hp.n_ff;
	for (int t = ith; t < j->T; t += nth) {
		float *g = c->gate + t * n;
		const float *u = c->up + t * n;
		if (j->gelu) /* GeGLU: tanh-approximated GELU of the gate times up */
			c->k.geglu(g, u, n);
		else
			c->k.swiglu(g, u, n);
		if (j->quantize)
			c->k.quantize_q8(g, c->xq + t * q8_row_len(n), n);
	}
}

static int cpu_forward(void *ctx, const struct kvd_batch *b)
{
	struct cpu_ctx *c = ctx;
	const struct kvd_model_weights *w = c->w;
	const struct kvd_hparams *hp;
	int T = 0, max_pos = 0, n_logit_rows = 0;
	int r;

	if (!w || !c->kv_attached)
		return -EINVAL;
	hp = &w->hp;
	if (b->n_seqs <= 0)
		return 0;
	for (int i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		int64_t end = (int64_t)s->pos0 + s->n_tokens;
		if (s->n_tokens <= 0 || s->pos0 < 0 || !s->tokens || !s->pages)
			return -EINVAL;
		if (end > (int64_t)s->n_pages * c->kv.layout.block_size || T + (int64_t)s->n_tokens > CPU_MAX_BATCH_TOKENS)
			return -E2BIG;
		if (cpu_attn_check_pages(&c->attn, &c->kv, s) < 0)
			return -EINVAL;
		for (int t = 0; t < s->n_tokens; t++)
			if (s->tokens[t] < 0 || s->tokens[t] >= hp->n_vocab)
				return -EINVAL;
		T += s->n_tokens;
		if (end - 1 > max_pos)
			max_pos = (int)(end - 1);
		if (s->logits)
			n_logit_rows += s->all_logits ? s->n_tokens : 1;
	}
	r = ensure_scratch(c, T, max_pos, n_logit_rows);
	if (r < 0)
		return r;

	/* embeddings and the row -> (sequence, position) map; a tied table
	 * is read from the output matrix's packed copy where that keeps the
	 * stored bytes (its own pages were handed back after packing, and
	 * each token's row would fault in from the file) */
	const void *emb_packed = w->output.data == w->tok_embd.data ? c->packed[hp->n_layer * PK_PER_LAYER] : NULL;
	int t = 0;
	for (int i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		for (int j = 0; j < s->n_tokens; j++, t++) {
			c->tok_seq[t] = i;
			c->tok_pos[t] = s->pos0 + j;
			const void *row = (const char *)w->tok_embd.data + (size_t)s->tokens[j] * w->tok_embd.row_bytes;
			/* xn's row is free until the first norm, and holds n_embd
			 * floats: as many bytes as any stored row */
			void *tmp = c->xn + (int64_t)t * hp->n_embd;
			if (emb_packed && cpu_gemm_unpack_row(w->tok_embd.type, emb_packed, hp->n_embd, s->tokens[j], tmp) == 0)
				row = tmp;
			cpu_dequantize_row(w->tok_embd.type, row, c->x + (int64_t)t * hp->n_embd, hp->n_embd);
			if (w->features & KVD_FEAT_EMBD_SCALE)
				for (int64_t e = 0; e < hp->n_embd; e++)
					c->x[(int64_t)t * hp->n_embd + e] *= hp->embd_scale;
		}
	}

	int64_t ne = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	int64_t nff = hp->n_ff;
	/* the RoPE table in c->rope is for (rope_th, rope_sc): recomputed at a
	 * layer whose RoPE differs (never for a Llama-base model) */
	int rope_ext = (w->features & (KVD_FEAT_LAYER_ROPE | KVD_FEAT_ROPE_FREQS | KVD_FEAT_ROPE_LINEAR)) != 0;
	float rope_th = hp->rope_theta, rope_sc = 1.0f;
	int rope_fresh = !rope_ext;
	/* c->rope_alt holds the table for (alt_th, alt_sc) when alt_ok: a
	 * model alternating between two RoPEs (Gemma 3's local and global
	 * layers) computes each once a step */
	float alt_th = 0, alt_sc = 0;
	int alt_ok = 0;
	if (!rope_ext) {
		struct rope_job rj = {c, T, 0, hp->rope_theta, 1.0f};
		run_rows(c, rope_worker, &rj, T);
	}
	for (int l = 0; l < hp->n_layer; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		const void *const *pk = c->packed + (size_t)l * PK_PER_LAYER;
		struct step st = {c, b, T, l};

		if (rope_ext) {
			float th = L->d.rope_theta > 0 ? L->d.rope_theta : hp->rope_theta;
			float sc = L->d.rope_freq_scale > 0 ? L->d.rope_freq_scale : 1.0f;
			if (!rope_fresh || th != rope_th || sc != rope_sc) {
				float *tab = c->rope;
				c->rope = c->rope_alt;
				c->rope_alt = tab;
				if (!alt_ok || th != alt_th || sc != alt_sc) {
					struct rope_job rj = {c, T, 1, th, sc};
					run_rows(c, rope_worker, &rj, T);
				}
				alt_ok = rope_fresh;
				alt_th = rope_th;
				alt_sc = rope_sc;
				rope_th = th;
				rope_sc = sc;
				rope_fresh = 1;
			}
		}

		if (l == 0)
			norm_rows(c, &L->attn_norm, T, 1);
		struct mm_multi qkv = {
			.jobs = {
				{c, &L->wq, T, c->xn, ne, wtype_is_quantized(L->wq.type) ? c->xq : NULL, q8_row_len(ne), c->q, qd, pk[PK_Q]},
				{c, &L->wk, T, c->xn, ne, wtype_is_quantized(L->wk.type) ? c->xq : NULL, q8_row_len(ne), c->kk, kvd, pk[PK_K]},
				{c, &L->wv, T, c->xn, ne, wtype_is_quantized(L->wv.type) ? c->xq : NULL, q8_row_len(ne), c->vv, kvd, pk[PK_V]},
			},
			.n = 3,
		};
		mm_run(c, &qkv);
		run_rows(c, rope_store_worker, &st, T);
		r = cpu_attn_run(&c->attn, &c->kv, b, l, c->w->layers[l].d.window, T, c->tok_seq, c->tok_pos, c->q, c->att);
		if (r < 0)
			return r;

		/* output projection, added to the residual */
		quantize_rows(c, c->att, qd, c->xq, q8_row_len(qd), T, qd);
		matmul(c, &L->wo, pk[PK_O], T, c->att, qd, c->xq, q8_row_len(qd), c->xn, ne);
		residual_norm_rows(c, L->post_attn_norm.data, L->ffn_norm.data, T);
		struct mm_multi gu = {
			.jobs = {
				{c, &L->w_gate, T, c->xn, ne, wtype_is_quantized(L->w_gate.type) ? c->xq : NULL, q8_row_len(ne), c->gate, nff, pk[PK_GATE]},
				{c, &L->w_up, T, c->xn, ne, wtype_is_quantized(L->w_up.type) ? c->xq : NULL, q8_row_len(ne), c->up, nff, pk[PK_UP]},
			},
			.n = 2,
		};
		mm_run(c, &gu);
		struct swiglu_job sj = {c, T, wtype_is_quantized(L->w_down.type), L->d.act == KVD_ACT_GELU_TANH};
		run_rows(c, swiglu_worker, &sj, T);
		matmul(c, &L->w_down, pk[PK_DOWN], T, c->gate, nff, c->xq, q8_row_len(nff), c->xn, ne);
		/* and the next layer's input */
		residual_norm_rows(c, L->post_ffn_norm.data, l + 1 < hp->n_layer ? w->layers[l + 1].attn_norm.data : NULL, T);
	}

	/* logits for the rows that want them */
	if (!n_logit_rows)
		return 0;
	int lr = 0;
	t = 0;
	for (int i = 0; i < b->n_seqs; i++) {
		const struct kvd_batch_seq *s = &b->seqs[i];
		if (s->logits) {
			int first = s->all_logits ? 0 : s->n_tokens - 1;
			for (int j = first; j < s->n_tokens; j++)
				c->logit_src[lr++] = t + j;
		}
		t += s->n_tokens;
	}
	for (int i = 0; i < n_logit_rows; i++)
		c->k.rmsnorm(c->logit_rows + (int64_t)i * ne, c->x + (int64_t)c->logit_src[i] * ne,
			    w->output_norm.data, ne, hp->rms_eps);
	if (wtype_is_quantized(w->output.type))
		quantize_rows(c, c->logit_rows, ne, c->xq, q8_row_len(ne), n_logit_rows, ne);
	/* one pass over the output matrix for every row that wants logits,
	 * then each sequence's rows to its buffer */
	float *out = c->logits_tmp;
	if (n_logit_rows == 1) {
		for (int i = 0; i < b->n_seqs; i++)
			if (b->seqs[i].logits)
				out = b->seqs[i].logits;
	}
	matmul(c, &w->output, c->packed[hp->n_layer * PK_PER_LAYER], n_logit_rows, c->logit_rows, ne, c->xq, q8_row_len(ne), out, hp->n_vocab);
	if (out == c->logits_tmp) {
		lr = 0;
		for (int i = 0; i < b->n_seqs; i++) {
			const struct kvd_batch_seq *s = &b->seqs[i];
			if (!s->logits)
				continue;
			int n = s->all_logits ? s->n_tokens : 1;
			memcpy(s->logits, c->logits_tmp + (size_t)lr * hp->n_vocab, sizeof(float) * (size_t)n * hp->n_vocab);
			lr += n;
		}
	}
	return 0;
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
	return cpu_kv_shift(c->w, &c->kv, pages, n_pages, n_tokens, delta);
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
	.forward = cpu_forward,
	.page_copy = cpu_page_copy,
	.page_read = cpu_page_read,
	.page_write = cpu_page_write,
	.destroy = cpu_destroy,
	.kv_shift = cpu_kv_shift_op,
	.supports = cpu_supports,
};
