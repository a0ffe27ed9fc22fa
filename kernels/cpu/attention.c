/*
 * kernels/cpu/attention.c — attention of the CPU forward pass
 * (kernels/cpu/cpu_backend.c) over K/V in pages, and its scratch.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "grow.h"

#define ATTN_CHUNK 128 /* positions per attention chunk (see below) */
#define ATTN_TILE 16   /* tokens of one sequence sharing a pass over K/V */
#define ATTN_PF_ALL_ROWS_Q 8 /* attn_rows_q: a call of at most this many rows prefetches its chunk */
#define ATTN_WHOLE_MIN 4 /* chunks a thread from which a few tokens' f16/bf16 attention takes whole chunks */
#define ATTN_SPLIT_MAX_T_Q 4 /* quantized K/V: steps of at most this many tokens split by chunk */

/* one forward step's attention, for the workers */
struct attn_step {
	struct cpu_attn *c;
	const struct kvd_batch *b;
	int T;
	int layer;
	int window;   /* a sliding-window layer sees this many positions; 0: all */
};

/* Floats of a kernel's scratch (attn_rows_fn) for up to nr rows over a
 * chunk. */
static size_t attn_sc_floats(const struct cpu_attn *c, int nr)
{
	return ATTN_ROWS_SCRATCH(nr, c->hp->head_dim);
}

/* Floats of attention scratch per thread for items of up to nc chunks:
 * the helpers' path keeps a chunk's scores and every chunk's partials of
 * one token; the tiled path keeps the kernel's scratch and the partials
 * of a tile's tokens. */
static size_t attn_scratch_per(const struct cpu_attn *c, int nc)
{
	const struct kvd_hparams *hp = c->hp;
	size_t n_rep = (size_t)(hp->n_head / hp->n_head_kv), hd = (size_t)hp->head_dim;
	size_t plain = attn_sc_floats(c, (int)n_rep) + n_rep * (2 + hd * (size_t)nc) + n_rep * 2 * (size_t)nc;
	size_t tiled = attn_sc_floats(c, ATTN_TILE * (int)n_rep) + ATTN_TILE * (size_t)nc * n_rep * (hd + 2);
	size_t heads = attn_sc_floats(c, hp->n_head); /* attn_chunk_heads */
	size_t m = plain > tiled ? plain : tiled;
	return m > heads ? m : heads;
}

/*
 * Attention, split by absolute position into chunks of ATTN_CHUNK: for each
 * (token, KV head, chunk) a partial result (per query head of the group:
 * the chunk's max score m, sum of exp(score - m) l, and sum of
 * exp(score - m) * V o), then a merge over the chunks in order. The chunks
 * depend only on positions, never on pages, batch or threads, so the
 * arithmetic of a token is always the same; how the work is spread over
 * threads (whole tokens per thread when there are many, chunks per thread
 * when there are few, as in a long single-stream decode) does not change it.
 * K and V rows of a KV head are read once for its whole query group.
 *
 * Where the CPU has the tiled kernel for the head size (attn_rows_fn,
 * kernels/cpu/attn_avx512.c), a chunk goes through it, and a prefill's
 * consecutive tokens share each chunk's pass (attn_tile_item); otherwise
 * the chunk is computed here from the f16 helpers. Either way a given
 * build computes a token's attention one way only. K/V stored as bf16 go
 * through the bfloat16 kernel (kernels/cpu/attn_bf16.c) where the CPU has
 * AVX-512 BF16, else through the AVX2 kernel widening them to floats
 * (attn_avx2.c). K/V stored in another type (f32, q8_0, q4_0, and bf16
 * without AVX2: kvquant.h) go through attn_rows_q, the same contract over the
 * stored rows, in every build and both paths (a prefill's tokens sharing
 * chunks, or one token's chunks alone).
 */

struct attn_part {
	float m, l;
};

/* The K row of position p of a sequence in layer `layer` (V follows at
 * v_offset): in its page, or, for a released page (only global layers reach
 * those: cpu_attn_check_pages), in its packed page's slot. */
static inline const char *kv_row(const struct cpu_attn *c, int layer, const struct kvd_batch_seq *sq, int p)
{
	const struct kvd_kv_layout *L = &c->kv.layout;
	int bs = (int)L->block_size;
	int32_t e = sq->pages[p / bs];
	size_t off = (size_t)(p % bs) * L->token_stride;

	if (e >= 0)
		return (const char *)c->kv.base + (size_t)e * L->page_bytes + (size_t)layer * L->layer_stride + off;
	return (const char *)c->kv.base + (size_t)kvd_packed_page(e) * L->page_bytes +
	       ((size_t)kvd_packed_slot(e) * c->n_global + (size_t)c->glob_idx[layer]) * L->layer_stride + off;
}

/* Where K and V of KV head g live for positions p0 .. p0 + n - 1 of a
 * sequence, in the pages (read in place). */
static void kv_rows(const struct cpu_attn *c, int layer, const struct kvd_batch_seq *sq, int g, int p0, int n,
		    const uint16_t **kp, const uint16_t **vp)
{
	const struct kvd_kv_layout *L = &c->kv.layout;
	int hd = c->hp->head_dim;
	for (int i = 0; i < n; i++) {
		const char *pb = kv_row(c, layer, sq, p0 + i);
		kp[i] = (const uint16_t *)pb + g * hd;
		vp[i] = (const uint16_t *)(pb + L->v_offset) + g * hd;
	}
}

/* The same for a K/V type other than f16: the rows of KV head g as bytes. */
static void kv_rows_q(const struct cpu_attn *c, int layer, const struct kvd_batch_seq *sq, int g, int p0, int n,
		      const unsigned char **kp, const unsigned char **vp)
{
	const struct kvd_kv_layout *L = &c->kv.layout;
	size_t hb = kvd_kv_row_bytes(L->type, (uint32_t)c->hp->head_dim);
	for (int i = 0; i < n; i++) {
		const char *pb = kv_row(c, layer, sq, p0 + i);
		kp[i] = (const unsigned char *)pb + g * hb;
		vp[i] = (const unsigned char *)pb + L->v_offset + g * hb;
	}
}

/* The tiled kernel over rows of 16-bit elements for the cache's type (f16,
 * or bf16 where the CPU has the bfloat16 products), or NULL. */
static attn_rows_fn rows_fn(const struct cpu_attn *c)
{
	return c->kv.layout.type == KVD_KV_F16 ? c->rows : c->kv.layout.type == KVD_KV_BF16 ? c->rows_bf16 : NULL;
}

/* The kernel of rows_fn(c) over a chunk of every KV head (attn_heads_fn),
 * or NULL. */
static attn_heads_fn heads_fn(const struct cpu_attn *c)
{
	if (c->hp->n_head > ATTN_HEADS_MAX_ROWS)
		return NULL;
	return c->kv.layout.type == KVD_KV_F16 ? c->heads : c->kv.layout.type == KVD_KV_BF16 ? c->heads_bf16 : NULL;
}

/* Whether K/V go through attn_rows_q (kvquant.h): the types without a
 * kernel of their own here. */
static int via_kvq(const struct cpu_attn *c)
{
	return c->kv.layout.type != KVD_KV_F16 && !rows_fn(c);
}

/* Whether prefill tokens share chunks (attn_tile_item): with a tiled
 * kernel, and always for the other K/V types (attn_rows_q). */
static int tiled(const struct cpu_attn *c)
{
	return c->kv.layout.type != KVD_KV_F16 || rows_fn(c);
}

/* The attn_rows_fn contract (ops.h) for K/V of a type other than f16
 * (kvquant.h): nr query rows over one chunk's K and V rows (bytes, read in
 * place), row r seeing the first len[r]; ml[r][0] = max score, ml[r][1] =
 * sum of exp(score - max), o[r] = the weighted V sum. Each (row, position)
 * score and each row's sums are the same whatever the other rows, so a
 * token's result is the same alone (attn_chunk_q) or in a prefill tile. sc:
 * nr * ATTN_CHUNK floats. */
static void attn_rows_q(const struct cpu_attn *c, int nr, const float *const *qp, const int *len,
			const unsigned char *const *kp, const unsigned char *const *vp, float *const *ml,
			float *const *op, float *sc)
{
	enum kvd_kv_type kt = c->kv.layout.type;
	int hd = c->hp->head_dim, n = 0;
	size_t rb = kvd_kv_row_bytes(kt, (uint32_t)hd);

	for (int r = 0; r < nr; r++)
		n = len[r] > n ? len[r] : n;
	/* few rows (a decode's query group): the chunk's K and V rows, one
	 * per position in pages all over memory, are requested into L2 at
	 * once so that their misses overlap (a prefill tile finds them there
	 * already), as the tiled f16 kernel does */
	if (nr <= ATTN_PF_ALL_ROWS_Q)
		for (int i = 0; i < n; i++)
			for (size_t o = 0; o < rb + 63; o += 64) {
				__builtin_prefetch(kp[i] + (o < rb ? o : rb - 1), 0, 2);
				__builtin_prefetch(vp[i] + (o < rb ? o : rb - 1), 0, 2);
			}
	if (c->qq_live) {
		/* the rows quantized at the step's start: q's row index */
		const struct kvq_qrow *qr[ATTN_TILE * 64];
		for (int r = 0; r < nr; r++)
			qr[r] = c->qq + (qp[r] - c->q) / hd;
		c->kq.scores_i8(kt, qr, nr, kp, n, hd, c->scale, sc, ATTN_CHUNK);
	} else {
		c->kq.scores(kt, qp, nr, kp, n, hd, c->scale, sc, ATTN_CHUNK);
	}
	for (int r = 0; r < nr; r++) {
		float m = -INFINITY, sum = 0, *sr = sc + (size_t)r * ATTN_CHUNK;
		if (kt == KVD_KV_Q8_0 || kt == KVD_KV_Q4_0) { /* vectorised (kvquant.h) */
			c->kq.softmax(sr, len[r], &ml[r][0], &ml[r][1]);
			memset(op[r], 0, sizeof(float) * (size_t)hd);
			continue;
		}
		for (int i = 0; i < len[r]; i++)
			if (sr[i] > m)
				m = sr[i];
		for (int i = 0; i < len[r]; i++) {
			float e = expf(sr[i] - m);
			sr[i] = e;
			sum += e;
		}
		ml[r][0] = m;
		ml[r][1] = sum;
		memset(op[r], 0, sizeof(float) * (size_t)hd);
	}
	c->kq.accum(kt, op, nr, len, sc, ATTN_CHUNK, vp, hd);
}

/* attn_chunk for K/V of a type other than f16: the group's rows through
 * attn_rows_q. */
static void attn_chunk_q(const struct cpu_attn *c, const struct attn_step *s, int t, int g, int p0, int p1,
			 struct attn_part *pm, float *po, float *sc)
{
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv, qd = hp->n_head * hd;
	const float *q = c->q + (int64_t)t * qd + (int64_t)g * n_rep * hd;
	int n = p1 - p0;
	const unsigned char *kp[ATTN_CHUNK], *vp[ATTN_CHUNK];
	const float *qp[64] = {0};
	float *op[64] = {0}, *mlp[64] = {0};
	int len[64] = {0};

	kv_rows_q(c, s->layer, &s->b->seqs[c->tok_seq[t]], g, p0, n, kp, vp);
	for (int r = 0; r < n_rep; r++) {
		qp[r] = q + r * hd;
		op[r] = po + r * hd;
		mlp[r] = &pm[r].m;
		len[r] = n;
	}
	attn_rows_q(c, n_rep, qp, len, kp, vp, mlp, op, sc);
}

/* One chunk [p0, p1) of token t's attention for KV head g: writes n_rep
 * (m, l) pairs to pm and n_rep * hd floats to po. sc: the thread's
 * scratch (attn_scratch_per). */
static void attn_chunk(const struct cpu_attn *c, const struct attn_step *s, int t, int g, int p0, int p1,
		       struct attn_part *pm, float *po, float *sc)
{
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv, qd = hp->n_head * hd;
	const float *q = c->q + (int64_t)t * qd + (int64_t)g * n_rep * hd;
	float scale = c->scale;
	int n = p1 - p0;
	const uint16_t *kp[ATTN_CHUNK], *vp[ATTN_CHUNK];
	attn_rows_fn rows = rows_fn(c);

	if (via_kvq(c)) {
		attn_chunk_q(c, s, t, g, p0, p1, pm, po, sc);
		return;
	}
	kv_rows(c, s->layer, &s->b->seqs[c->tok_seq[t]], g, p0, n, kp, vp);
	if (rows) {
		const float *qp[64];
		float *mlp[64], *op[64];
		int len[64];
		for (int r = 0; r < n_rep; r++) {
			qp[r] = q + r * hd;
			len[r] = n;
			mlp[r] = &pm[r].m;
			op[r] = po + r * hd;
		}
		rows(n_rep, qp, len, kp, vp, scale, mlp, op, sc);
		return;
	}
	for (int r = 0; r < n_rep; r++)
		pm[r].m = -INFINITY;
	/* scores, four positions at a time (the last group padded by repeating
	 * its last position): which positions share a group depends only on
	 * the positions, so a query's scores never depend on anything else */
	for (int i = 0; i < n; i += 4) {
		const uint16_t *k[4];
		for (int j = 0; j < 4; j++)
			k[j] = kp[i + j < n ? i + j : n - 1];
		for (int r = 0; r < n_rep; r++) {
			float v4[4];
			c->k.dot4_f32_f16(q + r * hd, k, hd, v4);
			for (int j = 0; j < 4 && i + j < n; j++) {
				float v = v4[j] * scale;
				sc[r * ATTN_CHUNK + i + j] = v;
				if (v > pm[r].m)
					pm[r].m = v;
			}
		}
	}
	for (int r = 0; r < n_rep; r++) {
		float sum = 0;
		for (int i = 0; i < n; i++) {
			float e = expf(sc[r * ATTN_CHUNK + i] - pm[r].m);
			sc[r * ATTN_CHUNK + i] = e;
			sum += e;
		}
		pm[r].l = sum;
		memset(po + r * hd, 0, sizeof(float) * (size_t)hd);
	}
	for (int i = 0; i < n; i++) {
		float w[64];
		for (int r = 0; r < n_rep; r++)
			w[r] = sc[r * ATTN_CHUNK + i];
		c->k.axpyn_f16(po, hd, w, n_rep, vp[i], hd);
	}
}

/* y[i] += a * x[i], a multiply then an add per element (no fused
 * multiply-add: the same bits as the scalar loop), eight lanes at a time */
typedef float v8f __attribute__((vector_size(32), aligned(4)));

static void axpy_f32(float *restrict y, float a, const float *restrict x, int n)
{
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		v8f yv, xv;
		memcpy(&yv, y + i, sizeof(yv));
		memcpy(&xv, x + i, sizeof(xv));
		yv += a * xv;
		memcpy(y + i, &yv, sizeof(yv));
	}
	for (; i < n; i++)
		y[i] += a * x[i];
}

/* Combine nc chunk partials, in chunk order, into token t's output. */
static void attn_merge(const struct cpu_attn *c, int t, int g, int nc, const struct attn_part *pm, const float *po)
{
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv, qd = hp->n_head * hd;
	float *out = c->att + (int64_t)t * qd + (int64_t)g * n_rep * hd;

	for (int r = 0; r < n_rep; r++) {
		float M = -INFINITY, Lsum = 0;
		float *o = out + r * hd;
		for (int ci = 0; ci < nc; ci++)
			if (pm[ci * n_rep + r].m > M)
				M = pm[ci * n_rep + r].m;
		memset(o, 0, sizeof(float) * (size_t)hd);
		for (int ci = 0; ci < nc; ci++) {
			float w = expf(pm[ci * n_rep + r].m - M);
			const float *src = po + ((size_t)ci * n_rep + r) * hd;
			Lsum += pm[ci * n_rep + r].l * w;
			axpy_f32(o, w, src, hd);
		}
		float inv = 1.0f / Lsum;
		for (int i = 0; i < hd; i++)
			o[i] *= inv;
	}
}

static int n_chunks(int pos)
{
	return pos / ATTN_CHUNK + 1;
}

/* one past the last position of chunk ci that a token at pos sees */
static int chunk_end(int ci, int pos)
{
	int e = (ci + 1) * ATTN_CHUNK;
	return pos + 1 < e ? pos + 1 : e;
}

/* Many (token, KV head) items: each thread does whole items, chunk by chunk
 * into its own scratch, then merges. */
static void attn_worker_items(void *arg, int ith, int nth)
{
	const struct attn_step *s = arg;
	struct cpu_attn *c = s->c;
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv;
	int n_items = s->T * hp->n_head_kv;
	float *base = c->scores + (size_t)ith * attn_scratch_per(c, c->cap_chunks);
	float *sc = base;
	float *po = sc + attn_sc_floats(c, n_rep);
	struct attn_part *pm = (struct attn_part *)(po + (size_t)n_rep * hd * (size_t)c->cap_chunks);

	for (int it = ith; it < n_items; it += nth) {
		int t = it / hp->n_head_kv, g = it % hp->n_head_kv;
		int pos = c->tok_pos[t], nc = n_chunks(pos);
		for (int ci = 0; ci < nc; ci++) {
			attn_chunk(c, s, t, g, ci * ATTN_CHUNK, chunk_end(ci, pos), pm + (size_t)ci * n_rep,
				   po + (size_t)ci * n_rep * hd, sc);
		}
		attn_merge(c, t, g, nc, pm, po);
	}
}

/* Few items (a short batch over long contexts): threads claim chunks of
 * all items one at a time; whoever finishes an item's last chunk merges
 * it (the merge reads the partials in chunk order, so who merges does not
 * matter). One parallel region per layer. */
struct attn_split {
	const struct attn_step *s;
	int n_items;
	int *item_first;      /* first global chunk index of each item, then total */
	atomic_int *left;     /* chunks of each item not yet done */
	int whole;            /* an index takes a chunk of all KV heads */
};

/* The item holding global chunk index gk: the last whose first index is
 * at most gk (item_first ascends). */
static int split_item(const struct attn_split *a, int gk)
{
	int lo = 0, hi = a->n_items - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (a->item_first[mid] <= gk)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

static void split_one(const struct attn_split *a, int gk, int tid)
{
	const struct attn_step *s = a->s;
	struct cpu_attn *c = s->c;
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv, hkv = hp->n_head_kv;
	int lo = split_item(a, gk);
	/* a token's items (its KV heads) have the same chunks; its indexes
	 * take them chunk by chunk, the heads of a chunk one after another,
	 * so that cache lines two heads' rows share are read once (rows of
	 * q8_0 and q4_0 are not whole lines). Which thread computes a chunk,
	 * and when, never changes its arithmetic. */
	int t = lo / hkv, f0 = a->item_first[t * hkv], pos = c->tok_pos[t];
	int ci = (gk - f0) / hkv, g = (gk - f0) % hkv, it = t * hkv + g;
	int gc = a->item_first[it] + ci;
	attn_chunk(c, s, t, g, ci * ATTN_CHUNK, chunk_end(ci, pos), c->attn_pm + (size_t)gc * n_rep,
		   c->attn_po + (size_t)gc * n_rep * hd,
		   c->scores + (size_t)tid * attn_scratch_per(c, c->cap_chunks));
	if (atomic_fetch_sub_explicit(&a->left[it], 1, memory_order_acq_rel) == 1) {
		int f = a->item_first[it];
		attn_merge(c, t, g, n_chunks(pos), c->attn_pm + (size_t)f * n_rep, c->attn_po + (size_t)f * n_rep * hd);
	}
}

/* Whole index k (a->whole) through the heads kernel: the chunk of every
 * KV head of its token in one call (attn_heads_fn, the same bits as
 * split_one's head by head), then each head's count and merge as there. */
static void split_heads(const struct attn_split *a, attn_heads_fn heads, int k, int tid)
{
	const struct attn_step *s = a->s;
	struct cpu_attn *c = s->c;
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv, hkv = hp->n_head_kv, qd = hp->n_head * hd;
	int gk = k * hkv, lo = split_item(a, gk); /* head 0 of the token */
	int t = lo / hkv, f0 = a->item_first[t * hkv], pos = c->tok_pos[t];
	int ci = (gk - f0) / hkv, p0 = ci * ATTN_CHUNK, n = chunk_end(ci, pos) - p0;
	const uint16_t *kp[ATTN_CHUNK], *vp[ATTN_CHUNK];
	const float *qp[ATTN_HEADS_MAX_ROWS] = {0};
	float *mlp[ATTN_HEADS_MAX_ROWS] = {0}, *op[ATTN_HEADS_MAX_ROWS] = {0};

	kv_rows(c, s->layer, &s->b->seqs[c->tok_seq[t]], 0, p0, n, kp, vp);
	for (int g = 0; g < hkv; g++) {
		int gc = a->item_first[t * hkv + g] + ci;
		for (int r = 0; r < n_rep; r++) {
			qp[g * n_rep + r] = c->q + (int64_t)t * qd + (int64_t)(g * n_rep + r) * hd;
			mlp[g * n_rep + r] = &c->attn_pm[(size_t)gc * n_rep + r].m;
			op[g * n_rep + r] = c->attn_po + ((size_t)gc * n_rep + r) * hd;
		}
	}
	heads(hkv, n_rep, n, qp, kp, vp, c->scale, mlp, op,
	      c->scores + (size_t)tid * attn_scratch_per(c, c->cap_chunks));
	for (int g = 0; g < hkv; g++) {
		int it = t * hkv + g;
		if (atomic_fetch_sub_explicit(&a->left[it], 1, memory_order_acq_rel) == 1) {
			int f = a->item_first[it];
			attn_merge(c, t, g, n_chunks(pos), c->attn_pm + (size_t)f * n_rep,
				   c->attn_po + (size_t)f * n_rep * hd);
		}
	}
}

/* Whole index k over K/V of a quantized type: the chunk's rows found once
 * (kv_rows_q for head 0; head g's lie g rows of a head further on), then
 * the heads in turn through attn_rows_q, each head's count and merge as in
 * split_one. */
static void split_heads_q(const struct attn_split *a, int k, int tid)
{
	const struct attn_step *s = a->s;
	struct cpu_attn *c = s->c;
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv, hkv = hp->n_head_kv, qd = hp->n_head * hd;
	size_t hb = kvd_kv_row_bytes(c->kv.layout.type, (uint32_t)hd);
	int gk = k * hkv, lo = split_item(a, gk);
	int t = lo / hkv, f0 = a->item_first[t * hkv], pos = c->tok_pos[t];
	int ci = (gk - f0) / hkv, p0 = ci * ATTN_CHUNK, n = chunk_end(ci, pos) - p0;
	const unsigned char *kq0[ATTN_CHUNK], *vq0[ATTN_CHUNK], *kq[ATTN_CHUNK], *vq[ATTN_CHUNK];
	const float *qp[64] = {0};
	float *mlp[64] = {0}, *op[64] = {0};
	int len[64] = {0};
	float *sc = c->scores + (size_t)tid * attn_scratch_per(c, c->cap_chunks);

	kv_rows_q(c, s->layer, &s->b->seqs[c->tok_seq[t]], 0, p0, n, kq0, vq0);
	for (int g = 0; g < hkv; g++) {
		int it = t * hkv + g, gc = a->item_first[it] + ci;
		for (int i = 0; i < n; i++) {
			kq[i] = kq0[i] + (size_t)g * hb;
			vq[i] = vq0[i] + (size_t)g * hb;
		}
		for (int r = 0; r < n_rep; r++) {
			qp[r] = c->q + (int64_t)t * qd + (int64_t)(g * n_rep + r) * hd;
			mlp[r] = &c->attn_pm[(size_t)gc * n_rep + r].m;
			op[r] = c->attn_po + ((size_t)gc * n_rep + r) * hd;
			len[r] = n;
		}
		attn_rows_q(c, n_rep, qp, len, kq, vq, mlp, op, sc);
		if (atomic_fetch_sub_explicit(&a->left[it], 1, memory_order_acq_rel) == 1) {
			int f = a->item_first[it];
			attn_merge(c, t, g, n_chunks(pos), c->attn_pm + (size_t)f * n_rep,
				   c->attn_po + (size_t)f * n_rep * hd);
		}
	}
}

/* Index k: one chunk of one KV head, or (a->whole) one chunk of all of a
 * token's KV heads, k * n_head_kv .. k * n_head_kv + n_head_kv - 1. */
static void attn_chunk_task(void *arg, uint32_t k, int tid)
{
	const struct attn_split *a = arg;
	struct cpu_attn *c = a->s->c;
	int hkv = c->hp->n_head_kv;
	if (!a->whole) {
		split_one(a, (int)k, tid);
		return;
	}
	if (via_kvq(c)) {
		split_heads_q(a, (int)k, tid);
		return;
	}
	attn_heads_fn heads = heads_fn(c);
	if (heads) {
		split_heads(a, heads, (int)k, tid);
		return;
	}
	for (int g = 0; g < hkv; g++)
		split_one(a, (int)k * hkv + g, tid);
}

/* Tiled items: (tile, KV head), a tile being up to ATTN_TILE consecutive
 * tokens of one sequence. For each chunk, the tile's tokens that reach it
 * (each up to its own position) go through the kernel together, so the
 * chunk's K and V rows are converted once for all of them; each token's
 * partials are then merged as in the other paths. */
struct attn_tiles {
	const struct attn_step *s;
	int n_tiles;
	const int *first;
};

static void attn_tile_item(void *arg, uint32_t k, int tid)
{
	const struct attn_tiles *a = arg;
	const struct attn_step *s = a->s;
	struct cpu_attn *c = s->c;
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv, qd = hp->n_head * hd;
	/* the last tiles first: later positions cost more */
	int ti = a->n_tiles - 1 - (int)(k / (uint32_t)hp->n_head_kv), g = (int)(k % (uint32_t)hp->n_head_kv);
	int t0 = a->first[ti], nt = a->first[ti + 1] - t0;
	int last = c->tok_pos[t0 + nt - 1], nc = n_chunks(last);
	const struct kvd_batch_seq *sq = &s->b->seqs[c->tok_seq[t0]];
	float scale = c->scale;
	float *kscr = c->scores + (size_t)tid * attn_scratch_per(c, c->cap_chunks);
	float *part = kscr + attn_sc_floats(c, ATTN_TILE * n_rep);
	size_t tok_stride = (size_t)c->cap_chunks * n_rep * (hd + 2);
	const uint16_t *kp[ATTN_CHUNK], *vp[ATTN_CHUNK];
	const float *qp[ATTN_TILE * 64];
	float *mlp[ATTN_TILE * 64], *op[ATTN_TILE * 64];
	int len[ATTN_TILE * 64];

	const unsigned char *kq[ATTN_CHUNK], *vq[ATTN_CHUNK];
	int quant = via_kvq(c);
	attn_rows_fn rows = rows_fn(c);

	for (int ci = 0; ci < nc; ci++) {
		int p0 = ci * ATTN_CHUNK, n = chunk_end(ci, last) - p0, nr = 0;
		if (quant)
			kv_rows_q(c, s->layer, sq, g, p0, n, kq, vq);
		else
			kv_rows(c, s->layer, sq, g, p0, n, kp, vp);
		for (int tt = 0; tt < nt; tt++) {
			int pos = c->tok_pos[t0 + tt];
			if (pos < p0)
				continue;
			struct attn_part *pm = (struct attn_part *)(part + tt * tok_stride);
			float *po = (float *)(pm + (size_t)c->cap_chunks * n_rep);
			for (int r = 0; r < n_rep; r++, nr++) {
				qp[nr] = c->q + (int64_t)(t0 + tt) * qd + (int64_t)(g * n_rep + r) * hd;
				len[nr] = chunk_end(ci, pos) - p0;
				mlp[nr] = &pm[ci * n_rep + r].m;
				op[nr] = po + ((size_t)ci * n_rep + r) * hd;
			}
		}
		if (quant)
			attn_rows_q(c, nr, qp, len, kq, vq, mlp, op, kscr);
		else
			rows(nr, qp, len, kp, vp, scale, mlp, op, kscr);
	}
	for (int tt = 0; tt < nt; tt++) {
		const struct attn_part *pm = (const struct attn_part *)(part + tt * tok_stride);
		attn_merge(c, t0 + tt, g, n_chunks(c->tok_pos[t0 + tt]), pm,
			   (const float *)(pm + (size_t)c->cap_chunks * n_rep));
	}
}

/* A sliding-window layer: token t at pos sees positions lo = max(0, pos -
 * window + 1) .. pos, in the same absolute chunks as full attention with
 * the first clipped at lo (so the arithmetic depends on positions only, as
 * everywhere); whole (token, KV head) items per thread. */
static void attn_worker_window(void *arg, int ith, int nth)
{
	const struct attn_step *s = arg;
	struct cpu_attn *c = s->c;
	const struct kvd_hparams *hp = c->hp;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv;
	int W = s->window;
	int n_items = s->T * hp->n_head_kv;
	float *sc = c->scores + (size_t)ith * attn_scratch_per(c, c->cap_chunks);
	float *po = sc + attn_sc_floats(c, n_rep);
	struct attn_part *pm = (struct attn_part *)(po + (size_t)n_rep * hd * (size_t)c->cap_chunks);

	for (int it = ith; it < n_items; it += nth) {
		int t = it / hp->n_head_kv, g = it % hp->n_head_kv;
		int pos = c->tok_pos[t], lo = pos - W + 1 > 0 ? pos - W + 1 : 0;
		int ci0 = lo / ATTN_CHUNK, nc = n_chunks(pos);
		for (int ci = ci0; ci < nc; ci++) {
			int p0 = ci * ATTN_CHUNK > lo ? ci * ATTN_CHUNK : lo;
			attn_chunk(c, s, t, g, p0, chunk_end(ci, pos), pm + (size_t)(ci - ci0) * n_rep,
				   po + (size_t)(ci - ci0) * n_rep * hd, sc);
		}
		attn_merge(c, t, g, nc - ci0, pm, po);
	}
}

static int attention(struct cpu_attn *c, const struct attn_step *s)
{
	const struct kvd_hparams *hp = c->hp;
	int n_items = s->T * hp->n_head_kv, nth = tp_size(c->pool);

	if (s->window > 0) {
		tp_run(c->pool, attn_worker_window, (void *)s);
		return 0;
	}

	/* a few tokens over quantized K/V go through the split path, whose
	 * order reads the rows of a chunk's KV heads together (attn_chunk_task) */
	int few_q = via_kvq(c) && s->T <= ATTN_SPLIT_MAX_T_Q;
	/* and so do a few tokens over f16 or bf16 K/V deep in their contexts,
	 * a thread taking a chunk of all KV heads at a time (attn_split.whole:
	 * 1B shape at depth 8,192 on Zen 2, 7-9 % faster than a head's chunks
	 * across the threads; quantized rows, which are not whole lines, were
	 * not faster so), through the heads kernel where there is one
	 * (split_heads: the chunk's rows in address order, another 16-19 %) */
	int deep_chunks = 0;
	if (s->T <= ATTN_SPLIT_MAX_T_Q)
		for (int t = 0; t < s->T; t++)
			deep_chunks += n_chunks(c->tok_pos[t]);
	int deep_any = s->T <= ATTN_SPLIT_MAX_T_Q && deep_chunks >= ATTN_WHOLE_MIN * nth;
	int deep = !via_kvq(c) && deep_any;
	if (n_items >= 2 * nth && tiled(c) && !few_q && !deep) {
		int nt = 0;
		if (s->T + 1 > c->cap_tiles) {
			GROW(c->tile_first, s->T + 1);
			c->cap_tiles = s->T + 1;
		}
		for (int t = 0; t < s->T; t++)
			if (t == 0 || t - c->tile_first[nt - 1] == ATTN_TILE || c->tok_seq[t] != c->tok_seq[t - 1] ||
			    c->tok_pos[t] != c->tok_pos[t - 1] + 1)
				c->tile_first[nt++] = t;
		c->tile_first[nt] = s->T;
		struct attn_tiles a = {s, nt, c->tile_first};
		tp_for(c->pool, attn_tile_item, &a, (uint32_t)(nt * hp->n_head_kv));
		return 0;
	}
	if (n_items >= 2 * nth && !few_q && !deep) {
		tp_run(c->pool, attn_worker_items, (void *)s);
		return 0;
	}

	int total = 0;
	int hd = hp->head_dim, n_rep = hp->n_head / hp->n_head_kv;
	if (n_items > c->cap_items) {
		GROW(c->item_first, n_items + 1);
		GROW(c->item_left, n_items);
		c->cap_items = n_items;
	}
	for (int it = 0; it < n_items; it++) {
		int nc = n_chunks(c->tok_pos[it / hp->n_head_kv]);
		c->item_first[it] = total;
		atomic_init(&c->item_left[it], nc);
		total += nc;
	}
	c->item_first[n_items] = total;
	if (total > c->cap_split) {
		GROW(c->attn_pm, (size_t)total * n_rep);
		GROW(c->attn_po, (size_t)total * n_rep * hd);
		c->cap_split = total;
	}
	/* whole chunks: the rows of a position's KV heads lie together, so
	 * a core reads a chunk's K and V rows of every head in turn (q8_0 and
	 * q4_0 too, their row pointers found once a chunk: split_heads_q) */
	struct attn_split a = {s, n_items, c->item_first, c->item_left, deep_any};
	tp_for(c->pool, attn_chunk_task, &a, (uint32_t)(deep_any ? total / hp->n_head_kv : total));
	return 0;
}


void cpu_attn_setup(struct cpu_attn *c, struct tp *pool, const struct cpu_kernels *k, const struct kvd_hparams *hp,
		    float scale)
{
	cpu_attn_free(c);
	c->scale = scale;
	c->pool = pool;
	c->k = *k;
	c->hp = hp;
	c->rows = k->attn_rows_for ? k->attn_rows_for(hp->head_dim) : NULL;
	/* the instruction sets the backend's config allows (cpu_isa); a CPU
	 * without AVX2 has the portable kernels only */
	int level = !strcmp(k->isa, "generic") ? 0 : k->isa_level;
	cpu_kvq_kernels_init(&c->kq, level);
	c->rows_bf16 = level >= 2 ? cpu_attn_rows_bf16(hp->head_dim) : NULL;
	if (!c->rows_bf16 && level >= 1)
		c->rows_bf16 = cpu_attn_rows_bf16_avx2(hp->head_dim);
	/* the heads kernel where the per-head one is a kernel it matches bit
	 * for bit: AVX2's, or the bfloat16 products' */
	c->heads = c->rows && c->rows == cpu_attn_rows_avx2(hp->head_dim) ? cpu_attn_heads_avx2(hp->head_dim, 0) : NULL;
	c->heads_bf16 = !c->rows_bf16 ? NULL
			: c->rows_bf16 == cpu_attn_rows_bf16_avx2(hp->head_dim) ? cpu_attn_heads_avx2(hp->head_dim, 1)
			: c->rows_bf16 == cpu_attn_rows_bf16(hp->head_dim) ? cpu_attn_heads_bf16(hp->head_dim)
									    : NULL;
}

int cpu_attn_reserve(struct cpu_attn *c, int max_pos)
{
	if (max_pos / ATTN_CHUNK + 1 > c->cap_chunks) {
		int nc = max_pos / ATTN_CHUNK + 1 < 16 ? 16 : max_pos / ATTN_CHUNK + 1;
		GROW(c->scores, attn_scratch_per(c, nc) * (size_t)tp_size(c->pool));
		c->cap_chunks = nc;
	}
	return 0;
}

/* Rows [16k, 16k + 16) of the step's queries quantized (quant_rows) */
struct quant_job {
	struct cpu_attn *c;
	int rows;
};

static void quant_rows_task(void *arg, uint32_t k, int tid)
{
	const struct quant_job *j = arg;
	int r0 = (int)k * 16, m = j->rows - r0 < 16 ? j->rows - r0 : 16, hd = j->c->hp->head_dim;
	(void)tid;
	j->c->kq.quant(j->c->q + (size_t)r0 * hd, m, hd, j->c->qq + r0);
}

/* q8_0/q4_0 K (integer scores): the step's query rows quantized once,
 * for every chunk of their contexts (attn_rows_q). 0 or -ENOMEM. */
static int quant_rows(struct cpu_attn *c, int T)
{
	enum kvd_kv_type kt = c->kv.layout.type;
	int hd = c->hp->head_dim, rows = T * c->hp->n_head;

	c->qq_live = via_kvq(c) && (kt == KVD_KV_Q8_0 || kt == KVD_KV_Q4_0) && hd <= KVQ_INT8_MAX_HD;
	if (!c->qq_live)
		return 0;
	if (rows > c->cap_qq) {
		struct kvq_qrow *n = realloc(c->qq, sizeof(*n) * (size_t)rows);
		if (!n) {
			c->qq_live = 0;
			return -ENOMEM;
		}
		c->qq = n;
		c->cap_qq = rows;
	}
	struct quant_job j = {c, rows};
	if (rows <= 64)
		c->kq.quant(c->q, rows, hd, c->qq);
	else
		tp_for(c->pool, quant_rows_task, &j, (uint32_t)((rows + 15) / 16));
	return 0;
}

int cpu_attn_run(struct cpu_attn *c, const struct kvd_paged_view *kv, const struct kvd_batch *b, int layer, int window,
		 int T, const int32_t *tok_seq, const int32_t *tok_pos, const float *q, float *att)
{
	struct attn_step s = {c, b, T, layer, window};
	c->kv = *kv;
	c->tok_seq = tok_seq;
	c->tok_pos = tok_pos;
	c->q = q;
	c->att = att;
	int rc = quant_rows(c, T);
	if (rc)
		return rc;
	return attention(c, &s);
}

int cpu_attn_set_packing(struct cpu_attn *c, const struct kvd_model_weights *w)
{
	int32_t *gi = malloc(sizeof(*gi) * (size_t)(w->hp.n_layer > 0 ? w->hp.n_layer : 1));
	int32_t g = 0;

	if (!gi)
		return -ENOMEM;
	for (int l = 0; l < w->hp.n_layer; l++)
		gi[l] = w->layers[l].d.window > 0 ? -1 : g++;
	free(c->glob_idx);
	c->glob_idx = gi;
	c->pack_slots = kvd_kv_pack_slots(w, &c->n_global, &c->max_window);
	return 0;
}

int cpu_attn_check_pages(const struct cpu_attn *c, const struct kvd_paged_view *kv, const struct kvd_batch_seq *s)
{
	int64_t bs = kv->layout.block_size, end = (int64_t)s->pos0 + s->n_tokens;

	for (int64_t p = 0; p < (end + bs - 1) / bs; p++) {
		int32_t e = s->pages[p];

		if (e >= 0) {
			if ((uint32_t)e >= kv->n_pages)
				return -EINVAL;
			continue;
		}
		/* released: every windowed layer's window of the first new
		 * token (positions > pos0 - max_window) must lie past it */
		if (!c->max_window || (p + 1) * bs + c->max_window > (int64_t)s->pos0 + 1)
			return -EINVAL;
		if (e == KVD_PAGE_RELEASED ? c->n_global != 0
					   : !kvd_page_is_packed(e) || !c->n_global || kvd_packed_page(e) >= kv->n_pages ||
						     kvd_packed_slot(e) >= c->pack_slots)
			return -EINVAL;
	}
	return 0;
}

void cpu_attn_free(struct cpu_attn *c)
{
	free(c->glob_idx);
	free(c->scores);
	free(c->tile_first);
	free(c->item_first);
	free(c->item_left);
	free(c->attn_pm);
	free(c->attn_po);
	free(c->qq);
	memset(c, 0, sizeof(*c));
}
