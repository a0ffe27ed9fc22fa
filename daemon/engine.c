/*
 * daemon/engine.c — one batch step: plan pages, commit, forward, publish.
 */
#include "engine.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvmm.h"
#include "model.h"

#define ENGINE_MAX_ITEMS 4096
#define PLUGIN_ENTRY "kvd_backend_plugin_entry"
#define CUDA_PLUGIN_NAME "libkvd-cuda.so"

struct kvd_engine {
	struct kvd_model *model;       /* NULL when opened on a given backend */
	struct kvd_hparams hp;
	struct kvd_model_weights w;    /* what load got without a model: hp only */
	const struct kvd_backend_ops *ops;
	void *be;
	void *plugin;          /* dlopen handle of a device plug-in, or NULL */
	char note[PATH_MAX + 128]; /* why a requested device backend is not used */
	struct kvmm *kv;
	struct kvd_kv_layout layout;
	int pool_adopted;      /* kvd_engine_pool_adopted() */
	/* releasing windowed layers' pages (kvd_engine_step) */
	int release;           /* on */
	uint32_t pack_slots, n_global, max_window;
	int32_t *glob_layer;   /* the layers without a window, n_global of them */
	/* step scratch */
	struct kvmm_grow *grow;
	struct kvd_batch_seq *bseq;
	size_t cap_items;
	int32_t *ptab;         /* page tables with released entries, as the backend takes them */
	size_t cap_ptab;
};

static int engine_page_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct kvd_engine *e = ud;
	return e->ops->page_copy(e->be, dst, src, n_tokens);
}

/* Slot `slot` of packed page dst := the global layers of page src (host
 * pool; the layout of kvd_kv_pack_slots in kernels/backend.h). */
static int engine_page_pack(void *ud, uint32_t dst, uint32_t slot, uint32_t src)
{
	struct kvd_engine *e = ud;
	const struct kvd_kv_layout *L = &e->layout;
	char *base = kvmm_pool_base(e->kv);

	for (uint32_t g = 0; g < e->n_global; g++)
		memcpy(base + (size_t)dst * L->page_bytes + ((size_t)slot * e->n_global + g) * L->layer_stride,
		       base + (size_t)src * L->page_bytes + (size_t)e->glob_layer[g] * L->layer_stride, L->layer_stride);
	return 0;
}

static int engine_page_read(void *ud, uint32_t page, void *host_dst)
{
	struct kvd_engine *e = ud;
	return e->ops->page_read(e->be, page, host_dst);
}

static int engine_page_write(void *ud, uint32_t page, const void *host_src)
{
	struct kvd_engine *e = ud;
	return e->ops->page_write(e->be, page, host_src);
}

static int engine_pages_read(void *ud, const uint32_t *pages, uint32_t n, void *host_dst)
{
	struct kvd_engine *e = ud;
	return e->ops->pages_read(e->be, pages, n, host_dst);
}

static int engine_pages_write(void *ud, const uint32_t *pages, uint32_t n, const void *host_src)
{
	struct kvd_engine *e = ud;
	return e->ops->pages_write(e->be, pages, n, host_src);
}

/* Where the CUDA plug-in lives: $KVD_CUDA_PLUGIN, else next to the
 * executable's lib directories (installed: PREFIX/lib/kvd/, build tree:
 * build/lib/). */
static int plugin_path(char *buf, size_t cap, int i)
{
	char exe[PATH_MAX];
	ssize_t n;
	const char *env = getenv("KVD_CUDA_PLUGIN");

	if (env && *env)
		return i == 0 ? snprintf(buf, cap, "%s", env) >= (int)cap ? -1 : 0 : -1;
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return -1;
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	if (!slash)
		return -1;
	*slash = 0;
	switch (i) {
	case 0: return snprintf(buf, cap, "%s/../lib/kvd/%s", exe, CUDA_PLUGIN_NAME) >= (int)cap ? -1 : 0;
	case 1: return snprintf(buf, cap, "%s/../lib/%s", exe, CUDA_PLUGIN_NAME) >= (int)cap ? -1 : 0;
	}
	return -1;
}

/* Load and start the CUDA plug-in. 0 with e->ops/e->be set, or -errno with
 * the reason in e->note. */
static int try_cuda(struct kvd_engine *e, const struct kvd_backend_config *bc)
{
	char path[PATH_MAX];
	const struct kvd_backend_ops *(*entry)(void);
	const struct kvd_backend_ops *ops;
	void *h = NULL;
	int r;

	for (int i = 0; !h && plugin_path(path, sizeof(path), i) == 0; i++)
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(e->note, sizeof(e->note), "cuda backend: plug-in %s not found or not loadable", CUDA_PLUGIN_NAME);
		return -ENOENT;
	}
	*(void **)&entry = dlsym(h, PLUGIN_ENTRY);
	ops = entry ? entry() : NULL;
	if (!ops || kvd_backend_ops_check(ops) < 0) {
		snprintf(e->note, sizeof(e->note), "cuda backend: %s: %s", path,
			 !ops ? "no " PLUGIN_ENTRY " entry point"
			 : ops->version != KVD_BACKEND_ABI_VERSION ? "backend ABI version mismatch"
								  : "backend table lacks slots its capabilities promise");
		dlclose(h);
		return -ELIBBAD;
	}
	r = ops->init(bc, &e->be);
	if (r < 0) {
		snprintf(e->note, sizeof(e->note), "cuda backend: %s", r == -ENODEV ? "no usable GPU or driver"
											: strerror(-r));
		dlclose(h);
		return r;
	}
	e->ops = ops;
	e->plugin = h;
	return 0;
}

static int start_cpu(struct kvd_engine *e, const struct kvd_backend_config *bc, char *err, size_t errlen)
{
	int r = kvd_cpu_backend.init(bc, &e->be);
	if (r < 0) {
		snprintf(err, errlen, "%s backend: cannot start: %s", kvd_cpu_backend.name, strerror(-r));
		return r;
	}
	e->ops = &kvd_cpu_backend;
	return 0;
}

/* "auto" with a plug-in that cannot serve this model: drop the plug-in and
 * start the CPU backend instead (e->note says why). */
static int fall_back_to_cpu(struct kvd_engine *e, const struct kvd_backend_config *bc, char *err, size_t errlen)
{
	e->ops->destroy(e->be);
	e->be = NULL;
	dlclose(e->plugin);
	e->plugin = NULL;
	e->ops = NULL;
	return start_cpu(e, bc, err, errlen);
}

/* The KV pool laid out for e->hp, attached to the started backend, swapping
 * to *swap_io when there is one (which kvmm then owns: *swap_io becomes NULL).
 * 0 or -errno with one line in err. */
static int make_pool(struct kvd_engine *e, const struct kvd_engine_config *cfg, struct kvmm_swap_io **swap_io,
		     char *err, size_t errlen)
{
	struct kvmm_config kc = {0};
	int r;

	if (cfg->block_size < 1 || cfg->block_size > KVMM_MAX_BLOCK_SIZE) {
		snprintf(err, errlen, "KV block size %u: must be 1 .. %u tokens", cfg->block_size, KVMM_MAX_BLOCK_SIZE);
		return -EINVAL;
	}
	enum kvd_kv_type kt = cfg->kv_type;
	if (cfg->kv_type_auto)
		kt = e->ops == &kvd_cpu_backend && kvd_cpu_bf16_attention(e->hp.head_dim) ? KVD_KV_BF16 : KVD_KV_F16;
	if (kvd_kv_layout_init_type(&e->layout, &e->hp, cfg->block_size, kt) < 0) {
		const char *tn = kvd_kv_type_name(kt);
		if (tn)
			snprintf(err, errlen, "KV cache type %s needs a head size that is a multiple of %d; this model's is %d",
				 tn, KVD_KV_QBLOCK, e->hp.head_dim);
		else
			snprintf(err, errlen, "KV cache type %d is unknown", (int)kt);
		return -EINVAL;
	}
	kc.page_bytes = e->layout.page_bytes;
	kc.block_size = e->layout.block_size;
	kc.pool_bytes = cfg->kv_pool_bytes;
	kc.pool_fraction = cfg->kv_pool_fraction;
	kc.max_seqs = cfg->max_seqs ? cfg->max_seqs : 256;
	kc.prefix_cache = cfg->prefix_cache;
	kc.shuffle_seed = cfg->shuffle_seed;
	kc.swap_path = cfg->swap_path;
	kc.swap_bytes = cfg->swap_bytes;
	kc.page_ops.copy = engine_page_copy;
	kc.page_ops.ud = e;
	if (e->model && !cfg->keep_local && (e->ops->caps & KVD_CAP_PACKED_KV) &&
	    !(e->ops->caps & KVD_CAP_DEVICE_POOL)) {
		const struct kvd_model_weights *mw = kvd_model_weights(e->model);
		e->pack_slots = kvd_kv_pack_slots(mw, &e->n_global, &e->max_window);
		if (e->max_window && e->n_global < (uint32_t)mw->hp.n_layer) {
			e->glob_layer = malloc(sizeof(*e->glob_layer) * (e->n_global ? e->n_global : 1));
			if (!e->glob_layer) {
				snprintf(err, errlen, "out of memory");
				return -ENOMEM;
			}
			for (int32_t l = 0, g = 0; l < mw->hp.n_layer; l++)
				if (mw->layers[l].d.window <= 0)
					e->glob_layer[g++] = l;
			e->release = 1;
			kc.pack_slots = e->pack_slots ? e->pack_slots : KVMM_PACK_NONE;
			kc.page_ops.pack = engine_page_pack;
		}
	}
	if (e->ops->caps & KVD_CAP_DEVICE_POOL) {
		/* the pool lives in device memory, kvmm keeps only its
		 * bookkeeping and moves pages through the backend (a swap batch
		 * in one call when the backend can); without an explicit size
		 * it takes a fraction of what is free after the weights */
		kc.page_ops.read = engine_page_read;
		kc.page_ops.write = engine_page_write;
		if (e->ops->caps & KVD_CAP_BATCHED_SWAP) {
			kc.page_ops.read_n = engine_pages_read;
			kc.page_ops.write_n = engine_pages_write;
		}
		if (!kc.pool_bytes) {
			uint32_t pages = 0;
			double frac = cfg->kv_pool_fraction > 0 ? cfg->kv_pool_fraction : 0.9;
			r = e->ops->suggest_pool_pages(e->be, e->layout.page_bytes, frac, &pages);
			if (r < 0 || pages == 0) {
				snprintf(err, errlen, "%s backend: cannot size the KV pool: %s", e->ops->name,
					 r < 0 ? strerror(-r) : "no device memory left after the weights");
				return r < 0 ? r : -ENOMEM;
			}
			kc.pool_bytes = (uint64_t)pages * e->layout.page_bytes;
		}
	}
	if (kc.pool_bytes && kc.pool_bytes < e->layout.page_bytes) {
		/* kvmm would refuse it with a bare -EINVAL: say what is wrong */
		snprintf(err, errlen,
			 "KV pool: %llu bytes is smaller than one page (%zu bytes: %u tokens of this model's KV); "
			 "kv.pool_size (--pool-size) must be at least that",
			 (unsigned long long)kc.pool_bytes, e->layout.page_bytes, e->layout.block_size);
		return -EINVAL;
	}
	if (cfg->pool_adopt) {
		uint32_t n_pages = 0;
		int fd = cfg->pool_adopt(cfg->pool_adopt_ud, &e->layout, e->ops->name, kc.page_ops.read != NULL,
					 kc.pool_bytes, &n_pages);

		if (fd >= 0) {
			r = kvmm_create_adopt(&kc, *swap_io, fd, n_pages, &e->kv);
			e->pool_adopted = r < 0 ? r : 1;
			if (r < 0)
				close(fd);
		}
	}
	r = e->kv ? 0 : kvmm_create_with_io(&kc, *swap_io, &e->kv);
	if (r == 0)
		*swap_io = NULL;
	if (r == 0 && kvmm_n_pages(e->kv) > KVD_PACKED_MAX_PAGES)
		e->release = 0; /* packed entries name pages below that */
	if (r < 0) {
		snprintf(err, errlen, "KV pool: cannot create (%llu bytes, pages of %zu bytes): %s",
			 (unsigned long long)cfg->kv_pool_bytes, e->layout.page_bytes, strerror(-r));
		return r;
	}
	struct kvd_paged_view view = {
		.base = kvmm_pool_base(e->kv),
		.n_pages = kvmm_n_pages(e->kv),
		.layout = e->layout,
	};
	r = e->ops->attach_kv(e->be, &view);
	if (r == -ENOTSUP) {
		snprintf(err, errlen, "%s backend: KV cache type %s is not implemented (kv.cache_type)", e->ops->name,
			 kvd_kv_type_name(e->layout.type));
		return r;
	}
	if (r < 0) {
		snprintf(err, errlen, "%s backend: cannot attach the KV pool: %s", e->ops->name, strerror(-r));
		return r;
	}
	return 0;
}

int kvd_engine_open(const struct kvd_engine_config *cfg, struct kvd_engine **ret, char *err, size_t errlen)
{
	struct kvd_engine *e;
	struct kvd_backend_config bc = {0};
	struct kvmm_swap_io *swap_io = cfg->swap_io; /* ours until kvmm takes it */
	int r;

	if (errlen)
		err[0] = 0;
	e = calloc(1, sizeof(*e));
	if (!e) {
		kvmm_swap_io_free(swap_io);
		return -ENOMEM;
	}
	r = kvd_model_load(cfg->model_path, &e->model, err, errlen);
	if (r < 0)
		goto fail;

	const char *want = cfg->backend ? cfg->backend : "auto";
	bc.n_threads = cfg->n_threads;
	if (strcmp(want, "cpu") && strcmp(want, "auto") && strcmp(want, "cuda")) {
		snprintf(err, errlen, "unknown backend '%s' (cpu, cuda or auto)", want);
		r = -EINVAL;
		goto fail;
	}
	/* "auto" looks for the NVIDIA driver before loading the plug-in: dlopen
	 * of cuBLAS alone maps hundreds of MiB, for nothing on a CPU machine. */
	if (!strcmp(want, "auto") && access("/proc/driver/nvidia/version", F_OK) != 0 &&
	    access("/dev/nvidiactl", F_OK) != 0 && !getenv("KVD_CUDA_PLUGIN")) {
		snprintf(e->note, sizeof(e->note), "cuda backend: no NVIDIA driver on this machine");
	} else if (strcmp(want, "cpu")) {
		r = try_cuda(e, &bc);
		if (r < 0 && !strcmp(want, "cuda")) {
			snprintf(err, errlen, "%s", e->note);
			r = -ENODEV;
			goto fail;
		}
	}
	if (!e->ops && (r = start_cpu(e, &bc, err, errlen)) < 0)
		goto fail;
	const struct kvd_model_weights *mw = kvd_model_weights(e->model);
	uint32_t missing = mw->features & ~e->ops->features;
	r = missing ? -ENOTSUP : e->ops->load(e->be, mw);
	if (r == -ENOTSUP && e->plugin && !strcmp(want, "auto")) {
		/* weight types or model features the device cannot compute:
		 * "auto" serves on the CPU instead, and says so */
		if (missing)
			snprintf(e->note, sizeof(e->note), "cuda backend: %s is not implemented on the GPU",
				 kvd_feature_name(missing));
		else
			snprintf(e->note, sizeof(e->note), "cuda backend: this model's weight types are not supported on the GPU");
		if ((r = fall_back_to_cpu(e, &bc, err, errlen)) < 0)
			goto fail;
		missing = mw->features & ~e->ops->features;
		r = missing ? -ENOTSUP : e->ops->load(e->be, mw);
	}
	if (missing) {
		snprintf(err, errlen, "%s: the model needs %s, which the %s backend does not implement",
			 kvd_model_path(e->model), kvd_feature_name(missing), e->ops->name);
		goto fail;
	}
	if (r < 0) {
		snprintf(err, errlen, "%s: %s backend rejected the weights: %s", kvd_model_path(e->model), e->ops->name,
			 strerror(-r));
		goto fail;
	}
	e->hp = *kvd_model_hparams(e->model);
	if (e->plugin && !cfg->kv_type_auto && cfg->kv_type != KVD_KV_F16) {
		/* ask the device whether it implements the KV element type
		 * (backend.h: a view of no pages only checks the layout) */
		struct kvd_paged_view probe = {0};
		if (kvd_kv_layout_init_type(&probe.layout, &e->hp, cfg->block_size, cfg->kv_type) == 0 &&
		    e->ops->attach_kv(e->be, &probe) == -ENOTSUP) {
			snprintf(e->note, sizeof(e->note), "cuda backend: KV cache type %s is not implemented on the GPU",
				 kvd_kv_type_name(cfg->kv_type));
			if (strcmp(want, "auto")) {
				snprintf(err, errlen, "%s (kv.cache_type = f16 or backend = cpu serve it)", e->note);
				r = -ENOTSUP;
				goto fail;
			}
			if ((r = fall_back_to_cpu(e, &bc, err, errlen)) < 0)
				goto fail;
			r = e->ops->load(e->be, mw);
			if (r < 0) {
				snprintf(err, errlen, "%s: %s backend rejected the weights: %s", kvd_model_path(e->model),
					 e->ops->name, strerror(-r));
				goto fail;
			}
		}
	}
	r = make_pool(e, cfg, &swap_io, err, errlen);
	if (r < 0)
		goto fail;
	*ret = e;
	return 0;
fail:
	kvmm_swap_io_free(swap_io);
	kvd_engine_close(e);
	return r;
}

int kvd_engine_open_backend(const struct kvd_engine_config *cfg, const struct kvd_backend_ops *ops,
			    const struct kvd_hparams *hp, struct kvd_engine **ret, char *err, size_t errlen)
{
	struct kvd_engine *e;
	struct kvd_backend_config bc = { .n_threads = cfg->n_threads };
	struct kvmm_swap_io *swap_io = cfg->swap_io; /* ours until kvmm takes it */
	int r;

	if (errlen)
		err[0] = 0;
	if (!ops || !hp || hp->n_vocab <= 0 || hp->n_layer <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0) {
		snprintf(err, errlen, "backend or hyper-parameters missing");
		kvmm_swap_io_free(swap_io);
		return -EINVAL;
	}
	if (kvd_backend_ops_check(ops) < 0) {
		snprintf(err, errlen, "%s backend: not a backend table of ABI %d with the slots its capabilities promise",
			 ops->name ? ops->name : "unnamed", KVD_BACKEND_ABI_VERSION);
		kvmm_swap_io_free(swap_io);
		return -EINVAL;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		kvmm_swap_io_free(swap_io);
		return -ENOMEM;
	}
	e->hp = *hp;
	e->w.hp = *hp;
	r = ops->init(&bc, &e->be);
	if (r < 0) {
		snprintf(err, errlen, "%s backend: cannot start: %s", ops->name, strerror(-r));
		goto fail;
	}
	e->ops = ops;
	r = ops->load(e->be, &e->w);
	if (r < 0) {
		snprintf(err, errlen, "%s backend: load: %s", ops->name, strerror(-r));
		goto fail;
	}
	r = make_pool(e, cfg, &swap_io, err, errlen);
	if (r < 0)
		goto fail;
	*ret = e;
	return 0;
fail:
	kvmm_swap_io_free(swap_io);
	kvd_engine_close(e);
	return r;
}

struct kvd_engine *kvd_engine_close(struct kvd_engine *e)
{
	if (!e)
		return NULL;
	kvmm_destroy(e->kv);
	if (e->ops)
		e->ops->destroy(e->be);
	if (e->plugin)
		dlclose(e->plugin);
	kvd_model_free(e->model);
	free(e->glob_layer);
	free(e->ptab);
	free(e->grow);
	free(e->bseq);
	free(e);
	return NULL;
}

const struct kvd_model *kvd_engine_model(const struct kvd_engine *e) { return e->model; }
struct kvmm *kvd_engine_kvmm(struct kvd_engine *e) { return e->kv; }
const struct kvd_kv_layout *kvd_engine_kv_layout(const struct kvd_engine *e) { return &e->layout; }
const char *kvd_engine_backend_name(const struct kvd_engine *e) { return e->ops->name; }
const char *kvd_engine_backend_note(const struct kvd_engine *e) { return e->note[0] ? e->note : NULL; }
int kvd_engine_pool_adopted(const struct kvd_engine *e)
{
	return e->pool_adopted;
}

int32_t kvd_engine_n_vocab(const struct kvd_engine *e) { return e->hp.n_vocab; }

static int ensure_items(struct kvd_engine *e, size_t n)
{
	if (n <= e->cap_items)
		return 0;
	struct kvmm_grow *g = realloc(e->grow, n * sizeof(*g));
	if (!g)
		return -ENOMEM;
	e->grow = g;
	struct kvd_batch_seq *b = realloc(e->bseq, n * sizeof(*b));
	if (!b)
		return -ENOMEM;
	e->bseq = b;
	e->cap_items = n;
	return 0;
}

static int check_items(const struct kvd_engine *e, const struct kvd_engine_item *items, size_t n)
{
	int32_t n_vocab = kvd_engine_n_vocab(e);

	if (n > ENGINE_MAX_ITEMS)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		if (items[i].n_tokens <= 0 || !items[i].tokens)
			return -EINVAL;
		for (int32_t t = 0; t < items[i].n_tokens; t++)
			if (items[i].tokens[t] < 0 || items[i].tokens[t] >= n_vocab)
				return -EINVAL;
		for (size_t j = 0; j < i; j++)
			if (items[j].seq == items[i].seq)
				return -EINVAL;
	}
	return 0;
}

int kvd_engine_plan(const struct kvd_engine *e, const struct kvd_engine_item *items, size_t n, uint32_t *ret_pages)
{
	struct kvmm_grow g[64];
	struct kvmm_grow *gp = g;
	int r = check_items(e, items, n);

	if (r < 0)
		return r;
	if (n > 64) {
		gp = malloc(n * sizeof(*gp));
		if (!gp)
			return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		gp[i] = (struct kvmm_grow){items[i].seq, (uint32_t)items[i].n_tokens, items[i].tokens};
	r = kvmm_plan(e->kv, gp, n, ret_pages);
	if (gp != g)
		free(gp);
	return r;
}

int kvd_engine_step(struct kvd_engine *e, const struct kvd_engine_item *items, size_t n)
{
	int r;

	if (n == 0)
		return 0;
	r = check_items(e, items, n);
	if (r < 0)
		return r;
	r = ensure_items(e, n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		e->grow[i] = (struct kvmm_grow){items[i].seq, (uint32_t)items[i].n_tokens, items[i].tokens};
		e->bseq[i].pos0 = (int32_t)kvmm_seq_len(e->kv, items[i].seq);
	}
	r = kvmm_commit(e->kv, e->grow, n);
	if (r < 0)
		return r;
	size_t n_ptab = 0;
	for (size_t i = 0; e->release && i < n; i++)
		if (kvmm_seq_released(e->kv, items[i].seq)) {
			uint32_t np = 0;
			(void)kvmm_seq_pages(e->kv, items[i].seq, &np);
			n_ptab += np;
		}
	if (n_ptab > e->cap_ptab) {
		int32_t *t = realloc(e->ptab, n_ptab * sizeof(*t));
		if (!t)
			return -ENOMEM; /* the step's sequences hold unwritten slots */
		e->ptab = t;
		e->cap_ptab = n_ptab;
	}
	n_ptab = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t np = 0;
		const int32_t *pages = kvmm_seq_pages(e->kv, items[i].seq, &np);
		uint32_t rel = e->release ? kvmm_seq_released(e->kv, items[i].seq) : 0;
		if (rel) {
			/* released entries as the backend reads them: each one's
			 * packed page and slot */
			int32_t *t = e->ptab + n_ptab;
			for (uint32_t k = 0; k < np; k++)
				t[k] = k >= rel ? pages[k]
				       : e->pack_slots ? kvd_page_packed((uint32_t)pages[k - k % e->pack_slots],
									 k % e->pack_slots)
						       : KVD_PAGE_RELEASED;
			pages = t;
			n_ptab += np;
		}
		e->bseq[i].tokens = items[i].tokens;
		e->bseq[i].n_tokens = items[i].n_tokens;
		e->bseq[i].pages = pages;
		e->bseq[i].n_pages = (int32_t)np;
		e->bseq[i].all_logits = items[i].all_logits;
		e->bseq[i].logits = items[i].logits;
	}
	struct kvd_batch b = {(int32_t)n, e->bseq};
	r = e->ops->forward(e->be, &b);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		r = kvmm_seq_publish(e->kv, items[i].seq);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; e->release && i < n; i++) {
		uint32_t len = kvmm_seq_len(e->kv, items[i].seq);
		if (items[i].keep_local || len < e->max_window + e->layout.block_size)
			continue;
		/* page k is dead once (k + 1) * block_size + max_window <= len */
		r = kvmm_seq_release(e->kv, items[i].seq, (len - e->max_window) / e->layout.block_size, NULL);
		if (r < 0)
			return r;
	}
	return 0;
}

int kvd_engine_release_info(const struct kvd_engine *e, uint32_t *ret_pack_slots, uint32_t *ret_max_window)
{
	if (!e->release)
		return 0;
	if (ret_pack_slots)
		*ret_pack_slots = e->pack_slots;
	if (ret_max_window)
		*ret_max_window = e->max_window;
	return 1;
}

/* ---- context windows ---------------------------------------------------------- */

int kvd_window_make(uint32_t block_size, uint32_t max_len, int sinks_on, uint32_t sinks, uint32_t window,
		    struct kvd_window *ret)
{
	uint64_t sink_pages = sinks_on ? ((uint64_t)(sinks ? sinks : 4) + block_size - 1) / block_size : 0;
	uint64_t room = (uint64_t)max_len, used = sink_pages * block_size + block_size - 1;

	if (used >= room)
		return -E2BIG;
	if (!window)
		window = (uint32_t)(room - used);
	if (used + window > room)
		return -E2BIG;
	*ret = (struct kvd_window){ (uint32_t)sink_pages, window + block_size - 1 };
	return 0;
}

int kvd_engine_can_shift(const struct kvd_engine *e)
{
	return e->ops->kv_shift != NULL && e->layout.type == KVD_KV_F16;
}

int kvd_engine_seq_evict(struct kvd_engine *e, uint32_t seq, uint32_t first, uint32_t n_drop)
{
	uint32_t bs = e->layout.block_size, np = 0, len;
	const int32_t *pages;
	int r;

	if (!e->ops->kv_shift)
		return -ENOTSUP;
	r = kvmm_seq_drop_pages(e->kv, seq, first, n_drop);
	if (r < 0)
		return r;
	pages = kvmm_seq_pages(e->kv, seq, &np);
	len = kvmm_seq_len(e->kv, seq);
	if (!pages || np <= first)
		return 0; /* nothing after the dropped pages */
	return e->ops->kv_shift(e->be, pages + first, np - first, len - first * bs, -(int32_t)(n_drop * bs));
}

int kvd_engine_window_prepare(struct kvd_engine *e, uint32_t seq, const struct kvd_window *w, uint32_t want,
			      uint32_t *ret_room, uint32_t *ret_dropped)
{
	uint32_t bs = e->layout.block_size, len = kvmm_seq_len(e->kv, seq), dropped = 0;
	uint64_t cap = kvd_window_cap(w, bs), room;
	int r;

	if (w->max_window < bs || want == 0)
		return -EINVAL;
	if (len >= cap) {
		/* full (or past it, only if a caller appended more): back to one
		 * page below the cap */
		uint32_t n = (uint32_t)((len - cap) / bs + 1);
		r = kvd_engine_seq_evict(e, seq, w->sink_pages, n);
		if (r < 0)
			return r;
		dropped = n * bs;
		len -= dropped;
	}
	room = cap - len;
	*ret_room = room < want ? (uint32_t)room : want;
	if (ret_dropped)
		*ret_dropped = dropped;
	return 0;
}
