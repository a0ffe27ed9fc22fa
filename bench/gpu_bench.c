/*
 * bench/gpu_bench.c — kvd's CUDA backend measured through its ops table,
 * the way the engine drives it: decode tokens/s by batch size, achieved HBM
 * bandwidth against the card's peak, prefill tokens/s, and swap bandwidth
 * device -> host -> file. Each figure is one JSON object on stdout; a
 * human-readable line goes to stderr.
 *
 *   gpu_bench [--plugin PATH] [--model GGUF | --shape smollm2-135m|llama-8b]
 *             [--wtype q4_0|q8_0|q4_1|f16|q4_k_m] [--batches 1,8,32,128]
 *             [--prompt 128] [--steps 32] [--prefill 2048]
 *             [--swap-file PATH] [--swap-mib 512] [--cpu-peer]
 *
 * --shape builds a random-weight model of that shape in memory (matrices of
 * one random pattern per shape, shared by all layers on the host; each
 * layer still gets its own device copy), so no model file is needed: the
 * speed of a forward pass does not depend on the weights' values.
 *
 * Decode: B sequences each prefilled with --prompt tokens, then --steps
 * decode steps of all B, timed; once with logits returned to the host (what
 * the engine does, B x n_vocab floats a step) and once without. HBM bytes a
 * step = the weights the backend reads (fp16 copies, or the stored ones
 * when B <= KVD_CUDA_GEMV_MAX_TOKENS) + the K/V of every sequence's
 * context; the fraction is against the peak from the device's
 * memory clock and bus width, and against a device-to-device cudaMemcpy
 * measured in the same run (the runtime is dlopen()ed for both, so the
 * benchmark stays C and links no CUDA).
 *
 * --wtype q4_k_m is the mix of a Q4_K_M file: Q4_K matrices, Q6_K for wv,
 * w_down and the (tied) embedding.
 *
 * --cpu-peer also runs batch 1 and 8 decode on the CPU backend, for the
 * ratio against a peer measured in the same run.
 *
 * --backend cpu runs the same measurements on the CPU backend (no device
 * figures; the swap figures are then memcpy()s).
 *
 * Exit status: 0, 77 when there is no GPU (or no plug-in), 1 on errors.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/ops.h"
#include "model.h"

#define BS 16

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the CUDA runtime, for device figures only ------------------------------ */

struct rt {
	int (*get_attr)(int *v, int attr, int dev);
	int (*malloc_)(void **p, size_t n);
	int (*free_)(void *p);
	int (*memcpy_)(void *d, const void *s, size_t n, int kind);
	int (*sync)(void);
};

static int rt_open(struct rt *rt)
{
	const char *names[] = {"libcudart.so.13", "libcudart.so", "/usr/local/cuda/lib64/libcudart.so.13",
			       "/usr/local/cuda/lib64/libcudart.so", NULL};
	void *h = NULL;
	for (int i = 0; names[i] && !h; i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return -ENOENT;
	*(void **)&rt->get_attr = dlsym(h, "cudaDeviceGetAttribute");
	*(void **)&rt->malloc_ = dlsym(h, "cudaMalloc");
	*(void **)&rt->free_ = dlsym(h, "cudaFree");
	*(void **)&rt->memcpy_ = dlsym(h, "cudaMemcpy");
	*(void **)&rt->sync = dlsym(h, "cudaDeviceSynchronize");
	return rt->get_attr && rt->malloc_ && rt->free_ && rt->memcpy_ && rt->sync ? 0 : -ENOENT;
}

/* Peak HBM bytes/s from the memory clock (kHz, attribute 36) and bus width
 * (bits, attribute 37), double data rate. */
static double peak_bw(struct rt *rt)
{
	int clk = 0, bus = 0;
	if (rt->get_attr(&clk, 36, 0) || rt->get_attr(&bus, 37, 0))
		return 0;
	return 2.0 * clk * 1e3 * bus / 8.0;
}

/* Device-to-device copy bandwidth (read + write bytes / s), best of 5. */
static double memcpy_bw(struct rt *rt)
{
	size_t n = 1ull << 30;
	void *a = NULL, *b = NULL;
	double best = 0;
	if (rt->malloc_(&a, n) || rt->malloc_(&b, n))
		return 0;
	rt->memcpy_(b, a, n, 3);
	rt->sync();
	for (int i = 0; i < 5; i++) {
		double t0 = now_s();
		rt->memcpy_(b, a, n, 3 /* device to device */);
		rt->sync();
		double bw = 2.0 * n / (now_s() - t0);
		if (bw > best)
			best = bw;
	}
	rt->free_(a);
	rt->free_(b);
	return best;
}

/* ---- models ---------------------------------------------------------------------- */

static uint64_t rng = 0x853c49e6748fea9bull;
static uint64_t rnd64(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* rows x cols of type t, random, values of magnitude about sqrt(3 / cols). */
static struct kvd_tensor gen_tensor(enum kvd_wtype t, int64_t cols, int64_t rows)
{
	struct kvd_tensor ts = {.type = t, .cols = cols, .rows = rows, .row_bytes = kvd_wtype_row_bytes(t, cols)};
	size_t bytes = ts.row_bytes * (size_t)rows;
	uint8_t *p = malloc(bytes + 8);
	float a = sqrtf(3.0f / (float)cols);
	if (!p) {
		fprintf(stderr, "gpu_bench: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < bytes; i += 8) {
		uint64_t v = rnd64();
		memcpy(p + i, &v, 8);
	}
	if (t == KVD_WTYPE_F32) {
		for (size_t i = 0; i < (size_t)cols * rows; i++)
			((float *)p)[i] = a * (2.0f * (float)(rnd64() >> 40) / 16777216.0f - 1.0f);
	} else if (t == KVD_WTYPE_F16) {
		for (size_t i = 0; i < (size_t)cols * rows; i++)
			((uint16_t *)p)[i] = cpu_f32_to_fp16(a * (2.0f * (float)(rnd64() >> 40) / 16777216.0f - 1.0f));
	} else if (t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q6_K) {
		/* random quants and 6-bit scales; d (and dmin) of magnitude a */
		size_t bb = t == KVD_WTYPE_Q4_K ? 144 : 210;
		uint16_t d = cpu_f32_to_fp16(t == KVD_WTYPE_Q4_K ? a / (15.0f * 32.0f) : a / (32.0f * 32.0f));
		uint16_t dmin = cpu_f32_to_fp16(a / 64.0f);
		for (size_t b = 0; b < bytes / bb; b++) {
			if (t == KVD_WTYPE_Q4_K) {
				memcpy(p + b * bb, &d, 2);
				memcpy(p + b * bb + 2, &dmin, 2);
			} else {
				for (int j = 0; j < 16; j++)
					p[b * bb + 192 + j] &= 0x3f;
				memcpy(p + b * bb + 208, &d, 2);
			}
		}
	} else {
		size_t bb = t == KVD_WTYPE_Q4_0 ? 18 : t == KVD_WTYPE_Q4_1 ? 20 : 34;
		uint16_t d = cpu_f32_to_fp16(t == KVD_WTYPE_Q8_0 ? a / 127.0f : a / 8.0f);
		uint16_t m = cpu_f32_to_fp16(-a);
		for (size_t b = 0; b < bytes / bb; b++) {
			memcpy(p + b * bb, &d, 2);
			if (t == KVD_WTYPE_Q4_1)
				memcpy(p + b * bb + 2, &m, 2);
		}
	}
	ts.data = p;
	return ts;
}

static struct kvd_tensor gen_norm(int64_t n)
{
	struct kvd_tensor t = {.type = KVD_WTYPE_F32, .cols = n, .rows = 1, .row_bytes = (size_t)n * 4};
	float *g = malloc((size_t)n * 4);
	for (int64_t i = 0; i < n; i++)
		g[i] = 1.0f;
	t.data = g;
	return t;
}

static int gen_model(const char *shape, enum kvd_wtype wt, struct kvd_model_weights *w)
{
	struct kvd_hparams *hp = &w->hp;
	enum kvd_wtype et;
	memset(w, 0, sizeof(*w));
	if (!strcmp(shape, "smollm2-135m")) {
		*hp = (struct kvd_hparams){.n_vocab = 49152, .n_embd = 576, .n_layer = 30, .n_head = 9, .n_head_kv = 3,
					   .head_dim = 64, .n_ff = 1536, .n_ctx_train = 8192, .rms_eps = 1e-5f,
					   .rope_theta = 100000.0f, .rope_style = KVD_ROPE_NORM};
		et = KVD_WTYPE_Q8_0;
	} else if (!strcmp(shape, "llama-8b")) {
		*hp = (struct kvd_hparams){.n_vocab = 128256, .n_embd = 4096, .n_layer = 32, .n_head = 32, .n_head_kv = 8,
					   .head_dim = 128, .n_ff = 14336, .n_ctx_train = 8192, .rms_eps = 1e-5f,
					   .rope_theta = 500000.0f, .rope_style = KVD_ROPE_NORM};
		et = wt;
	} else {
		return -EINVAL;
	}
	int64_t ne = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	/* Q4_K_M: Q6_K for V, the FFN's down projection and the embedding */
	enum kvd_wtype wt6 = wt == KVD_WTYPE_Q4_K ? KVD_WTYPE_Q6_K : wt;
	if (wt == KVD_WTYPE_Q4_K)
		et = KVD_WTYPE_Q6_K;
	struct kvd_tensor wq = gen_tensor(wt, ne, qd), wk = gen_tensor(wt, ne, kvd), wv = gen_tensor(wt6, ne, kvd);
	struct kvd_tensor wo = gen_tensor(wt, qd, ne), wg = gen_tensor(wt, ne, hp->n_ff), wu = gen_tensor(wt, ne, hp->n_ff);
	struct kvd_tensor wd = gen_tensor(wt6, hp->n_ff, ne), nrm = gen_norm(ne);
	w->tok_embd = gen_tensor(et, ne, hp->n_vocab);
	w->output = w->tok_embd; /* tied */
	w->output_norm = nrm;
	w->layers = calloc((size_t)hp->n_layer, sizeof(*w->layers));
	for (int l = 0; l < hp->n_layer; l++)
		w->layers[l] = (struct kvd_layer_weights){.attn_norm = nrm, .wq = wq, .wk = wk, .wv = wv, .wo = wo,
							  .ffn_norm = nrm, .w_gate = wg, .w_up = wu, .w_down = wd};
	return 0;
}

/* Bytes of the fp16 matrices a forward pass reads once per step. */
static double weight_bytes_f16(const struct kvd_hparams *hp)
{
	double ne = hp->n_embd, qd = (double)hp->n_head * hp->head_dim, kvd = (double)hp->n_head_kv * hp->head_dim;
	double per_layer = ne * (qd + 2 * kvd) + qd * ne + 3 * ne * hp->n_ff;
	return 2.0 * (hp->n_layer * per_layer + (double)hp->n_vocab * ne);
}

/* Bytes of the stored matrices (what the dequantizing GEMV reads). */
static double weight_bytes_stored(const struct kvd_model_weights *w)
{
	double b = (double)w->output.rows * w->output.row_bytes;
	for (int l = 0; l < w->hp.n_layer; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		const struct kvd_tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
		for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
			b += (double)ts[i]->rows * ts[i]->row_bytes;
	}
	return b;
}

/* Steps of up to this many tokens read the stored weights (the plug-in's
 * KVD_CUDA_GEMV_MAX_TOKENS), larger ones the fp16 copies. */
static int gemv_max_tokens(void)
{
	const char *g = getenv("KVD_CUDA_GEMV_MAX_TOKENS");
	return g ? atoi(g) : 0;
}

/* ---- runs ------------------------------------------------------------------------------ */

struct run {
	const struct kvd_backend_ops *ops;
	void *ctx;
	const struct kvd_model_weights *w;
	struct kvd_kv_layout L;
	void *host; /* host tier */
	uint32_t n_pages;
	int pages_per_seq;
};

static int run_open(struct run *r, const struct kvd_backend_ops *ops, const struct kvd_model_weights *w, uint32_t n_pages,
		    int pages_per_seq, int threads)
{
	struct kvd_backend_config cfg = {.n_threads = threads, .device = 0};
	int e;
	memset(r, 0, sizeof(*r));
	r->ops = ops;
	r->w = w;
	r->pages_per_seq = pages_per_seq;
	e = ops->init(&cfg, &r->ctx);
	if (e < 0)
		return e;
	double t0 = now_s();
	e = ops->load(r->ctx, w);
	if (e < 0)
		return e;
	fprintf(stderr, "%s: weights loaded in %.2f s\n", ops->name, now_s() - t0);
	kvd_kv_layout_init(&r->L, &w->hp, BS);
	r->n_pages = n_pages;
	r->host = mmap(NULL, (size_t)n_pages * r->L.page_bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (r->host == MAP_FAILED)
		return -errno;
	struct kvd_paged_view v = {.base = r->host, .n_pages = n_pages, .layout = r->L};
	return ops->attach_kv(r->ctx, &v);
}

static void run_close(struct run *r)
{
	if (r->ctx)
		r->ops->destroy(r->ctx);
	if (r->host && r->host != MAP_FAILED)
		munmap(r->host, (size_t)r->n_pages * r->L.page_bytes);
}

/* One step for B sequences: n tokens each at position pos. */
static int step(struct run *r, int B, int n, int pos, float *logits, int32_t *toks, int32_t *pages,
		struct kvd_batch_seq *bs)
{
	int32_t nv = r->w->hp.n_vocab;
	for (int i = 0; i < B; i++) {
		for (int j = 0; j < n; j++)
			toks[(size_t)i * n + j] = 100 + (int32_t)(rnd64() % (uint64_t)(nv - 200));
		bs[i] = (struct kvd_batch_seq){.tokens = toks + (size_t)i * n, .n_tokens = n, .pos0 = pos,
					       .pages = pages + (size_t)i * r->pages_per_seq, .n_pages = r->pages_per_seq,
					       .logits = logits ? logits + (size_t)i * nv : NULL};
	}
	struct kvd_batch b = {.n_seqs = B, .seqs = bs};
	return r->ops->forward(r->ctx, &b);
}

static const char *label;

static int bench_decode(struct run *r, int B, int prompt, int steps, double peak, double copy_bw)
{
	const struct kvd_hparams *hp = &r->w->hp;
	int32_t *pages = malloc(sizeof(int32_t) * (size_t)B * r->pages_per_seq);
	int32_t *toks = malloc(sizeof(int32_t) * (size_t)B * prompt);
	struct kvd_batch_seq *bs = malloc(sizeof(*bs) * (size_t)B);
	float *logits = malloc(sizeof(float) * (size_t)B * hp->n_vocab);
	int e = 0;
	if (!pages || !toks || !bs || !logits)
		return -ENOMEM;
	for (int i = 0; i < B * r->pages_per_seq; i++)
		pages[i] = i;
	double t0 = now_s();
	e = step(r, B, prompt, 0, logits, toks, pages, bs);
	double t_pre = now_s() - t0;
	for (int with_logits = 1; with_logits >= 0 && e == 0; with_logits--) {
		int pos = prompt + (with_logits ? 0 : steps + 2);
		e = step(r, B, 1, pos, with_logits ? logits : NULL, toks, pages, bs); /* warm-up */
		pos++;
		e = e ? e : step(r, B, 1, pos++, with_logits ? logits : NULL, toks, pages, bs);
		t0 = now_s();
		double kv_tokens = 0;
		for (int s = 0; s < steps && e == 0; s++, pos++) {
			e = step(r, B, 1, pos, with_logits ? logits : NULL, toks, pages, bs);
			kv_tokens += (double)B * (pos + 1);
		}
		double dt = now_s() - t0;
		if (e)
			break;
		double step_s = dt / steps;
		double kv_bytes = kv_tokens / steps * 2.0 * hp->n_layer * r->L.kv_dim * 2.0;
		double wbytes = B <= gemv_max_tokens() ? weight_bytes_stored(r->w) : weight_bytes_f16(hp);
		double bytes = strcmp(r->ops->name, "cuda") ? 0 : wbytes + kv_bytes;
		double bw = bytes / step_s;
		printf("{\"figure\":\"decode\",\"backend\":\"%s\",\"model\":\"%s\",\"batch\":%d,\"context\":%d,"
		       "\"logits_to_host\":%d,\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"hbm_gb_per_s\":%.1f,"
		       "\"hbm_frac_of_peak\":%.3f,\"hbm_frac_of_memcpy\":%.3f,\"prefill_tokens_per_s\":%.0f}\n",
		       r->ops->name, label, B, prompt, with_logits, step_s * 1e3, B / step_s, bw / 1e9,
		       peak > 0 ? bw / peak : 0, copy_bw > 0 ? bw / copy_bw : 0, (double)B * prompt / t_pre);
		fprintf(stderr, "%-5s %-22s batch %4d%s: %8.1f tok/s, step %.2f ms, %.0f GB/s (%.0f%% of peak)\n",
			r->ops->name, label, B, with_logits ? " +logits" : "        ", B / step_s, step_s * 1e3, bw / 1e9,
			peak > 0 ? 100 * bw / peak : 0);
		fflush(stdout);
	}
	free(pages);
	free(toks);
	free(bs);
	free(logits);
	return e;
}

static int bench_prefill(struct run *r, int n)
{
	int32_t *pages = malloc(sizeof(int32_t) * (size_t)r->pages_per_seq);
	int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
	float *logits = malloc(sizeof(float) * (size_t)r->w->hp.n_vocab);
	struct kvd_batch_seq bs;
	double best = 1e30;
	int e = 0;
	if (!pages || !toks || !logits)
		return -ENOMEM;
	for (int i = 0; i < r->pages_per_seq; i++)
		pages[i] = i;
	for (int rep = 0; rep < 3 && e == 0; rep++) {
		double t0 = now_s();
		e = step(r, 1, n, 0, logits, toks, pages, &bs);
		double dt = now_s() - t0;
		if (rep > 0 && dt < best) /* the first run warms up */
			best = dt;
	}
	if (!e) {
		printf("{\"figure\":\"prefill\",\"backend\":\"%s\",\"model\":\"%s\",\"tokens\":%d,\"seconds\":%.4f,"
		       "\"tokens_per_s\":%.0f}\n", r->ops->name, label, n, best, n / best);
		fprintf(stderr, "%-5s %-22s prefill %d tokens: %.0f tok/s (%.1f ms)\n", r->ops->name, label, n, n / best,
			best * 1e3);
	}
	free(pages);
	free(toks);
	free(logits);
	return e;
}

/* Swap-out: pages device -> host tier (pinned), one page_read each and one
 * batched pages_read (gather), device -> pageable memory, host -> file. */
static int bench_swap(struct run *r, size_t mib, const char *file)
{
	size_t pb = r->L.page_bytes;
	uint32_t n = (uint32_t)(mib * (1u << 20) / pb);
	if (n > r->n_pages)
		n = r->n_pages;
	if (n == 0)
		return 0;
	uint32_t *list = malloc(sizeof(uint32_t) * n);
	char *pageable = malloc((size_t)n * pb);
	int e = 0;
	if (!list || !pageable)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		list[i] = (i * 7919u) % r->n_pages; /* scattered */
	double bytes = (double)n * pb;

	double t0 = now_s();
	for (uint32_t i = 0; i < n && !e; i++)
		e = r->ops->page_read(r->ctx, list[i], (char *)r->host + (size_t)list[i] * pb);
	double t_pinned = now_s() - t0;
	t0 = now_s();
	int batched = (r->ops->caps & KVD_CAP_BATCHED_SWAP) != 0;
	if (!e && batched)
		e = r->ops->pages_read(r->ctx, list, n, r->host);
	double t_gather = batched ? now_s() - t0 : 0;
	t0 = now_s();
	for (uint32_t i = 0; i < n && !e; i++)
		e = r->ops->page_read(r->ctx, list[i], pageable + (size_t)i * pb);
	double t_pageable = now_s() - t0;
	t0 = now_s();
	if (!e && batched)
		e = r->ops->pages_write(r->ctx, list, n, r->host);
	double t_scatter = batched ? now_s() - t0 : 0;
	double t_file = 0;
	if (!e && file) {
		int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0600);
		if (fd < 0)
			fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd >= 0) {
			t0 = now_s();
			size_t off = 0, total = (size_t)n * pb, chunk = 8u << 20;
			while (off < total) {
				size_t k = total - off < chunk ? total - off : chunk;
				ssize_t w = pwrite(fd, (char *)r->host + off, k, (off_t)off);
				if (w <= 0)
					break;
				off += (size_t)w;
			}
			fdatasync(fd);
			t_file = now_s() - t0;
			close(fd);
			unlink(file);
		}
	}
	if (!e) {
		printf("{\"figure\":\"swap\",\"model\":\"%s\",\"pages\":%u,\"page_bytes\":%zu,"
		       "\"d2h_pinned_page_gb_per_s\":%.2f,\"d2h_gather_gb_per_s\":%.2f,\"d2h_pageable_page_gb_per_s\":%.2f,"
		       "\"h2d_scatter_gb_per_s\":%.2f,\"host_to_file_gb_per_s\":%.2f}\n",
		       label, n, pb, bytes / t_pinned / 1e9, t_gather > 0 ? bytes / t_gather / 1e9 : 0,
		       bytes / t_pageable / 1e9, t_scatter > 0 ? bytes / t_scatter / 1e9 : 0, t_file > 0 ? bytes / t_file / 1e9 : 0);
		fprintf(stderr, "swap %s: %u pages of %zu B: d2h page-by-page pinned %.1f GB/s, gather %.1f GB/s, "
			"pageable %.1f GB/s; h2d scatter %.1f GB/s; host->file %.2f GB/s\n", label, n, pb,
			bytes / t_pinned / 1e9, t_gather > 0 ? bytes / t_gather / 1e9 : 0, bytes / t_pageable / 1e9,
			t_scatter > 0 ? bytes / t_scatter / 1e9 : 0, t_file > 0 ? bytes / t_file / 1e9 : 0);
	}
	free(list);
	free(pageable);
	return e;
}

int main(int argc, char **argv)
{
	const char *plugin = getenv("KVD_CUDA_PLUGIN"), *model = NULL, *shape = NULL, *swap_file = NULL;
	enum kvd_wtype wt = KVD_WTYPE_Q4_0;
	int batches[16] = {1, 8, 32, 128}, n_b = 4, prompt = 128, steps = 32, prefill = 2048, cpu_peer = 0;
	size_t swap_mib = 512;

	int use_cpu = 0; /* --backend cpu: the same runs on the CPU backend */
	if (!plugin || !*plugin)
		plugin = "build/lib/libkvd-cuda.so";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--cpu-peer")) {
			cpu_peer = 1;
			continue;
		}
		if (!v) {
			fprintf(stderr, "gpu_bench: %s needs a value (see bench/gpu_bench.c)\n", a);
			return 1;
		}
		i++;
		if (!strcmp(a, "--plugin")) plugin = v;
		else if (!strcmp(a, "--model")) model = v;
		else if (!strcmp(a, "--shape")) shape = v;
		else if (!strcmp(a, "--prompt")) prompt = atoi(v);
		else if (!strcmp(a, "--steps")) steps = atoi(v);
		else if (!strcmp(a, "--prefill")) prefill = atoi(v);
		else if (!strcmp(a, "--swap-file")) swap_file = v;
		else if (!strcmp(a, "--swap-mib")) swap_mib = (size_t)atol(v);
		else if (!strcmp(a, "--backend")) use_cpu = !strcmp(v, "cpu");
		else if (!strcmp(a, "--wtype")) {
			wt = !strcmp(v, "q8_0") ? KVD_WTYPE_Q8_0 : !strcmp(v, "q4_1") ? KVD_WTYPE_Q4_1 :
			     !strcmp(v, "f16") ? KVD_WTYPE_F16 : !strcmp(v, "q4_k_m") ? KVD_WTYPE_Q4_K : KVD_WTYPE_Q4_0;
		} else if (!strcmp(a, "--batches")) {
			n_b = 0;
			for (char *s = (char *)v; *s && n_b < 16; s++) {
				batches[n_b++] = (int)strtol(s, &s, 10);
				if (!*s)
					break;
			}
		} else {
			fprintf(stderr, "gpu_bench: unknown option %s\n", a);
			return 1;
		}
	}
	if (prompt < 1 || steps < 1 || prefill < 1) {
		fprintf(stderr, "gpu_bench: --prompt, --steps, --prefill must be >= 1\n");
		return 1;
	}

	const struct kvd_backend_ops *ops = &kvd_cpu_backend;
	void *h = use_cpu ? NULL : dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
	if (!h && !use_cpu) {
		fprintf(stderr, "gpu_bench: skipped: cannot load %s: %s\n", plugin, dlerror());
		return 77;
	}
	if (h) {
		const struct kvd_backend_ops *(*entry)(void);
		*(void **)&entry = dlsym(h, "kvd_backend_plugin_entry");
		ops = entry ? entry() : NULL;
		if (!ops || ops->version != KVD_BACKEND_ABI_VERSION) {
			fprintf(stderr, "gpu_bench: %s: no entry or ABI mismatch\n", plugin);
			return 1;
		}
	}
	{
		struct kvd_backend_config cfg = {.device = 0};
		void *ctx;
		int e = ops->init(&cfg, &ctx);
		if (e == -ENODEV) {
			fprintf(stderr, "gpu_bench: skipped: no GPU\n");
			return 77;
		}
		if (e < 0) {
			fprintf(stderr, "gpu_bench: %s init: %s\n", ops->name, strerror(-e));
			return 1;
		}
		ops->destroy(ctx);
	}

	struct kvd_model *km = NULL;
	struct kvd_model_weights gw;
	const struct kvd_model_weights *w;
	char lab[128];
	if (model) {
		char err[256];
		int e = kvd_model_load(model, &km, err, sizeof(err));
		if (e < 0) {
			fprintf(stderr, "gpu_bench: %s\n", err);
			return 1;
		}
		w = kvd_model_weights(km);
		snprintf(lab, sizeof(lab), "%s", kvd_model_name(km));
	} else {
		if (!shape)
			shape = "llama-8b";
		if (gen_model(shape, wt, &gw) < 0) {
			fprintf(stderr, "gpu_bench: unknown shape %s\n", shape);
			return 1;
		}
		w = &gw;
		snprintf(lab, sizeof(lab), "%s-%s-random", shape, kvd_wtype_name(w->layers[0].wq.type));
	}
	label = lab;

	struct rt rt;
	double peak = 0, copy_bw = 0;
	if (!use_cpu && rt_open(&rt) == 0) {
		peak = peak_bw(&rt);
		copy_bw = memcpy_bw(&rt);
	}
	printf("{\"figure\":\"device\",\"hbm_peak_gb_per_s\":%.1f,\"d2d_memcpy_gb_per_s\":%.1f,"
	       "\"fp16_weight_bytes\":%.0f}\n", peak / 1e9, copy_bw / 1e9, weight_bytes_f16(&w->hp));
	fprintf(stderr, "device: HBM peak %.0f GB/s, d2d memcpy %.0f GB/s; %s: fp16 weights %.2f GB\n", peak / 1e9,
		copy_bw / 1e9, lab, weight_bytes_f16(&w->hp) / 1e9);

	int max_b = 1;
	for (int i = 0; i < n_b; i++)
		if (batches[i] > max_b)
			max_b = batches[i];
	int ctx_tokens = prompt + 2 * steps + 8;
	if (prefill > ctx_tokens)
		ctx_tokens = prefill;
	int pps = (ctx_tokens + BS - 1) / BS;
	/* pages: the widest batch's contexts (prefill reuses the first) */
	uint32_t n_pages = (uint32_t)(max_b * ((prompt + 2 * steps + 8 + BS - 1) / BS) + pps);
	struct run r;
	int e = run_open(&r, ops, w, n_pages, pps, 0);
	if (e < 0) {
		fprintf(stderr, "gpu_bench: %s: %s\n", ops->name, strerror(-e));
		return 1;
	}
	/* sequences of a batch take consecutive runs of pages_per_seq pages:
	 * shrink the per-sequence run to what decode needs */
	r.pages_per_seq = (prompt + 2 * steps + 8 + BS - 1) / BS;
	for (int i = 0; i < n_b && !e; i++)
		e = bench_decode(&r, batches[i], prompt, steps, peak, copy_bw);
	r.pages_per_seq = pps;
	if (!e)
		e = bench_prefill(&r, prefill);
	if (!e)
		e = bench_swap(&r, swap_mib, swap_file);
	run_close(&r);
	if (e < 0) {
		fprintf(stderr, "gpu_bench: %s: %s\n", ops->name, strerror(-e));
		return 1;
	}

	if (cpu_peer && !use_cpu) {
		struct run c;
		uint32_t cp = (uint32_t)(8 * ((prompt + 2 * steps + 8 + BS - 1) / BS));
		e = run_open(&c, &kvd_cpu_backend, w, cp, (prompt + 2 * steps + 8 + BS - 1) / BS, 0);
		for (int b = 1; b <= 8 && !e; b *= 8)
			e = bench_decode(&c, b, prompt, steps < 8 ? steps : 8, 0, 0);
		run_close(&c);
		if (e < 0)
			fprintf(stderr, "gpu_bench: cpu peer: %s\n", strerror(-e));
	}
	kvd_model_free(km);
	return 0;
}
