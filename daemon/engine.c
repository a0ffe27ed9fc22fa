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
	char *pack_buf;        /* device pool: the two pages a pack moves through the host */
	/* step scratch */
	struct kvmm_grow *grow;
	struct kvd_batch_seq *bseq;
	size_t cap_items;
	int32_t *ptab;         /* page tables with released entries, as the backend takes them */
	size_t cap_ptab;
	struct kvd_engine *draft; /* speculative decoding's draft model, owned (kvd_engine_set_draft) */
};

static int engine_page_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct kvd_engine *e = ud;
	return e->ops->page_copy(e->be, dst, src, n_tokens);
}

/* Slot `slot` of packed page dst := the global layers of page src (the
 * layout of kvd_kv_pack_slots in kernels/backend.h): in place in a host
 * pool; for a device pool through the host, both pages read
 * (page_read), the slot filled and dst written back (page_write). */
static int engine_page_pack(void *ud, uint32_t dst, uint32_t slot, uint32_t src)
{
	struct kvd_engine *e = ud;
	const struct kvd_kv_layout *L = &e->layout;
	char *base = kvmm_pool_base(e->kv);
	uint32_t pd = dst, ps = src;
	int r;

	if (e->ops->caps & KVD_CAP_DEVICE_POOL) {
		if (!e->pack_buf && !(e->pack_buf = malloc(2 * L->page_bytes)))
			return -ENOMEM;
		base = e->pack_buf;
		pd = 0;
		ps = 1;
		r = e->ops->page_read(e->be, dst, base);
		if (r == 0)
			r = e->ops->page_read(e->be, src, base + L->page_bytes);
		if (r < 0)
			return r;
	}
	for (uint32_t g = 0; g < e->n_global; g++)
		memcpy(base + (size_t)pd * L->page_bytes + ((size_t)slot * e->n_global + g) * L->layer_stride,
		       base + (size_t)ps * L->page_bytes + (size_t)e->glob_layer[g] * L->layer_stride, L->layer_stride);
	if (e->ops->caps & KVD_CAP_DEVICE_POOL)
		return e->ops->page_write(e->be, dst, base);
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

/* The device plug-in's table: dlopen()ed where plugin_path() says, its
 * version and slots checked. 0 with *ret_ops and *ret_handle (the caller
 * dlclose()s it), or -errno with the reason in why. */
static int plugin_open(const struct kvd_backend_ops **ret_ops, void **ret_handle, char *why, size_t cap)
{
	char path[PATH_MAX];
	const struct kvd_backend_ops *(*entry)(void);
	const struct kvd_backend_ops *ops;
	void *h = NULL;

	for (int i = 0; !h && plugin_path(path, sizeof(path), i) == 0; i++)
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(why, cap, "cuda backend: plug-in %s not found or not loadable", CUDA_PLUGIN_NAME);
		return -ENOENT;
	}
	*(void **)&entry = dlsym(h, PLUGIN_ENTRY);
	ops = entry ? entry() : NULL;
	if (!ops || kvd_backend_ops_check(ops) < 0) {
		/* the version is read first, and no slot past what it defines */
		snprintf(why, cap, "cuda backend: %s: %s", path,
			 !ops ? "no " PLUGIN_ENTRY " entry point"
			 : ops->version < KVD_BACKEND_ABI_MIN || ops->version > KVD_BACKEND_ABI_VERSION
				 ? "backend table version not readable by this kvd"
				 : "backend table lacks slots its capabilities promise");
		dlclose(h);
		return -ELIBBAD;
	}
	*ret_ops = ops;
	*ret_handle = h;
	return 0;
}

/* A backend the engine may try: its table and, for a plug-in, the handle. */
struct engine_cand {
	const struct kvd_backend_ops *ops;
	void *handle;
};

/* The one question to the started backend (kernels/backend.h). */
static int engine_supports(const struct kvd_engine *e, const struct kvd_cap_query *q)
{
	return kvd_backend_supports(e->ops, e->be, q);
}

/* The KV element type of the pool on the started backend: the configured
 * one, or for cache_type auto bf16 where the backend says it is its fast
 * type for this head size, else f16. */
static enum kvd_kv_type engine_kv_type(const struct kvd_engine *e, const struct kvd_engine_config *cfg)
{
	struct kvd_cap_query q = {.kind = KVD_CAPQ_KV_FAST, .kv_type = KVD_KV_BF16, .head_dim = e->hp.head_dim};

	if (!cfg->kv_type_auto)
		return cfg->kv_type;
	return engine_supports(e, &q) ? KVD_KV_BF16 : KVD_KV_F16;
}

/* Whether the started backend implements what the model and cfg need: 0,
 * or -ENOTSUP with the first capability it lacks in *ret_q. Weight types,
 * then model features (lowest bit first), the attention shape, the KV type
 * (when the type fits the head size at all; make_pool says so otherwise). */
static int engine_check_caps(const struct kvd_engine *e, const struct kvd_model_weights *mw,
			     const struct kvd_engine_config *cfg, struct kvd_cap_query *ret_q)
{
	const struct kvd_hparams *hp = &mw->hp;
	struct kvd_kv_layout l;
	struct kvd_cap_query q;

	for (int32_t i = -2; i < hp->n_layer * 7; i++) {
		const struct kvd_layer_weights *L = i >= 0 ? &mw->layers[i / 7] : NULL;
		const struct kvd_tensor *m[] = {L ? &L->wq : NULL, L ? &L->wk : NULL, L ? &L->wv : NULL,
						L ? &L->wo : NULL, L ? &L->w_gate : NULL, L ? &L->w_up : NULL,
						L ? &L->w_down : NULL};
		const struct kvd_tensor *t = i == -2 ? &mw->tok_embd : i == -1 ? &mw->output : m[i % 7];
		q = (struct kvd_cap_query){.kind = KVD_CAPQ_WEIGHT_TYPE, .wtype = t->type};
		if (!engine_supports(e, &q))
			goto missing;
	}
	for (uint32_t bit = 1; bit && bit <= mw->features; bit <<= 1) {
		q = (struct kvd_cap_query){.kind = KVD_CAPQ_MODEL_FEATURE, .feature = bit};
		if ((mw->features & bit) && !engine_supports(e, &q))
			goto missing;
	}
	q = (struct kvd_cap_query){.kind = KVD_CAPQ_ATTENTION, .head_dim = hp->head_dim,
				   .n_rep = hp->n_head_kv > 0 ? hp->n_head / hp->n_head_kv : 0};
	if (!engine_supports(e, &q))
		goto missing;
	q = (struct kvd_cap_query){.kind = KVD_CAPQ_KV_TYPE, .kv_type = engine_kv_type(e, cfg), .head_dim = hp->head_dim};
	if (kvd_kv_layout_init_type(&l, hp, 16, q.kv_type) == 0 && !engine_supports(e, &q))
		goto missing;
	return 0;
missing:
	*ret_q = q;
	return -ENOTSUP;
}

/*
 * Start one candidate backend (handle: its plug-in, or NULL), ask it what
 * the model and cfg need, load the model. 0 with e->ops, e->be, e->plugin
 * and e->hp set. On failure the candidate is gone (destroyed, its plug-in
 * closed), why says what happened and *ret_next whether the next candidate
 * may serve instead: yes for -ENOTSUP (a capability it lacks, named, or an
 * ABI 3 load refusing the weight types) and for an init error (-ENODEV: no
 * device); no for another -errno from load, which is the open's error.
 */
static int engine_try_backend(struct kvd_engine *e, const struct kvd_backend_ops *ops, void *handle,
			      const struct kvd_backend_config *bc, const struct kvd_engine_config *cfg, char *why,
			      size_t cap, int *ret_next)
{
	const struct kvd_model_weights *mw = kvd_model_weights(e->model);
	const char *where = ops->caps & KVD_CAP_DEVICE_POOL ? " on the GPU" : "";
	struct kvd_cap_query q;
	char what[160];
	int r = ops->init(bc, &e->be);

	*ret_next = 1;
	if (r < 0) {
		snprintf(why, cap, "%s backend: %s", ops->name, r == -ENODEV ? "no usable GPU or driver" : strerror(-r));
		e->be = NULL;
		goto fail;
	}
	e->ops = ops;
	e->hp = *kvd_model_hparams(e->model);
	r = engine_check_caps(e, mw, cfg, &q);
	if (r < 0) {
		snprintf(why, cap, "%s backend: %s is not implemented%s", ops->name, kvd_cap_describe(&q, what, sizeof(what)),
			 where);
		if (q.kind == KVD_CAPQ_KV_TYPE)
			snprintf(why + strlen(why), cap - strlen(why), " (kv.cache_type)");
		goto fail;
	}
	r = ops->load(e->be, mw);
	if (r == -ENOTSUP)
		snprintf(why, cap, "%s backend: this model's weight types are not implemented%s", ops->name, where);
	else if (r < 0)
		snprintf(why, cap, "%s: %s backend rejected the weights: %s", kvd_model_path(e->model), ops->name,
			 strerror(-r));
	*ret_next = r == -ENOTSUP;
	if (r < 0)
		goto fail;
	e->plugin = handle;
	return 0;
fail:
	if (e->be)
		ops->destroy(e->be);
	e->be = NULL;
	e->ops = NULL;
	if (handle)
		dlclose(handle);
	return r;
}

/* The widest instruction set the CPU backend may use: cfg's, lowered by
 * $KVD_CPU_GENERIC, $KVD_CPU_NO_AVX512 or $KVD_CPU_NO_AMX (switches for tests and
 * debugging, read here once so that every program built on the engine
 * honours them; the backend itself reads only its config). */
static enum kvd_cpu_isa engine_cpu_isa(const struct kvd_engine_config *cfg)
{
	enum kvd_cpu_isa isa = cfg->cpu_isa;

	if (getenv("KVD_CPU_NO_AMX") && isa == KVD_CPU_ISA_BEST)
		isa = KVD_CPU_ISA_AVX512;
	if (getenv("KVD_CPU_NO_AVX512") && (isa == KVD_CPU_ISA_BEST || isa == KVD_CPU_ISA_AVX512))
		isa = KVD_CPU_ISA_AVX2;
	if (getenv("KVD_CPU_GENERIC"))
		isa = KVD_CPU_ISA_GENERIC;
	return isa;
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
	enum kvd_kv_type kt = engine_kv_type(e, cfg);
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
	struct kvd_cap_query rel = {.kind = KVD_CAPQ_RELEASED_PAGES};
	if (e->model && !cfg->keep_local && engine_supports(e, &rel)) {
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
	struct engine_cand cand[2];
	int n_cand = 0;
	char why[sizeof(e->note)] = "";

	bc.n_threads = cfg->n_threads;
	bc.cpu_isa = engine_cpu_isa(cfg);
	if (strcmp(want, "cpu") && strcmp(want, "auto") && strcmp(want, "cuda")) {
		snprintf(err, errlen, "unknown backend '%s' (cpu, cuda or auto)", want);
		r = -EINVAL;
		goto fail;
	}
	/* The candidates, in the one order they are tried: the plug-in
	 * first, the CPU last (unless one was asked for by name). "auto"
	 * looks for the NVIDIA driver before loading the plug-in: dlopen of
	 * cuBLAS alone maps hundreds of MiB, for nothing on a CPU machine. */
	if (!strcmp(want, "auto") && access("/proc/driver/nvidia/version", F_OK) != 0 &&
	    access("/dev/nvidiactl", F_OK) != 0 && !getenv("KVD_CUDA_PLUGIN")) {
		snprintf(e->note, sizeof(e->note), "cuda backend: no NVIDIA driver on this machine");
	} else if (strcmp(want, "cpu")) {
		r = plugin_open(&cand[n_cand].ops, &cand[n_cand].handle, why, sizeof(why));
		if (r == 0)
			n_cand++;
		else if (!strcmp(want, "cuda")) {
			snprintf(err, errlen, "%s", why);
			r = -ENODEV;
			goto fail;
		} else
			snprintf(e->note, sizeof(e->note), "%s", why);
	}
	if (strcmp(want, "cuda"))
		cand[n_cand++] = (struct engine_cand){&kvd_cpu_backend, NULL};
	/* the one fallback path: a candidate that lacks what the model or the
	 * configuration needs, or cannot start, gives way to the next, and the
	 * note says why a device backend is not in use */
	for (int i = 0; i < n_cand; i++) {
		int next = 0;
		r = engine_try_backend(e, cand[i].ops, cand[i].handle, &bc, cfg, why, sizeof(why), &next);
		if (r == 0)
			break;
		if (cand[i].handle)
			snprintf(e->note, sizeof(e->note), "%s", why);
		if (i + 1 == n_cand || !next) {
			for (int j = i + 1; j < n_cand; j++)
				if (cand[j].handle)
					dlclose(cand[j].handle);
			snprintf(err, errlen, "%s", why);
			if (!strcmp(want, "cuda") && r != -ENOTSUP)
				r = -ENODEV;
			else if (!strcmp(want, "cuda"))
				snprintf(err + strlen(err), errlen - strlen(err), "; backend = cpu serves it");
			goto fail;
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
	struct kvd_backend_config bc = { .n_threads = cfg->n_threads, .cpu_isa = engine_cpu_isa(cfg) };
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
		snprintf(err, errlen, "%s backend: not a backend table of ABI %d .. %d with the slots its capabilities promise",
			 ops->name ? ops->name : "unnamed", KVD_BACKEND_ABI_MIN, KVD_BACKEND_ABI_VERSION);
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
	kvd_engine_close(e->draft);
	kvmm_destroy(e->kv);
	if (e->ops)
		e->ops->destroy(e->be);
	if (e->plugin)
		dlclose(e->plugin);
	kvd_model_free(e->model);
	free(e->glob_layer);
	free(e->pack_buf);
	free(e->ptab);
	free(e->grow);
	free(e->bseq);
	free(e);
	return NULL;
}

void kvd_engine_set_draft(struct kvd_engine *e, struct kvd_engine *draft)
{
	if (e->draft != draft)
		kvd_engine_close(e->draft);
	e->draft = draft;
}
struct kvd_engine *kvd_engine_draft(const struct kvd_engine *e) { return e->draft; }
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
		r = items[i].defer_publish ? 0 : kvmm_seq_publish(e->kv, items[i].seq);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; e->release && i < n; i++) {
		uint32_t len = kvmm_seq_len(e->kv, items[i].seq);
		/* a tail the caller may cut back (speculative drafts) does not
		 * count: only the step's first token is sure to stay, and a page
		 * released for positions that are then cut would be one the
		 * next token still reads */
		if (items[i].defer_publish)
			len = (uint32_t)e->bseq[i].pos0 + 1;
		if (items[i].keep_local || len < e->max_window + e->layout.block_size)
			continue;
		/* page k is dead once (k + 1) * block_size + max_window <= len */
		uint32_t upto = (len - e->max_window) / e->layout.block_size;
		if (items[i].defer_publish && upto > (uint32_t)e->bseq[i].pos0 / e->layout.block_size)
			upto = (uint32_t)e->bseq[i].pos0 / e->layout.block_size; /* published before the step */
		r = kvmm_seq_release(e->kv, items[i].seq, upto, NULL);
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
	struct kvd_cap_query q = {.kind = KVD_CAPQ_KV_SHIFT, .kv_type = e->layout.type};

	return kvd_backend_has_kv_shift(e->ops) && engine_supports(e, &q);
}

const char *kvd_engine_shift_refusal(const struct kvd_engine *e, char *buf, size_t cap)
{
	struct kvd_cap_query q = {.kind = KVD_CAPQ_KV_SHIFT, .kv_type = e->layout.type};
	char what[160];

	snprintf(buf, cap, "%s, which the %s backend does not implement%s", kvd_cap_describe(&q, what, sizeof(what)),
		 e->ops->name,
		 !kvd_backend_has_kv_shift(e->ops) ? "" : " (kv.cache_type chooses the type)");
	return buf;
}

int kvd_engine_seq_evict(struct kvd_engine *e, uint32_t seq, uint32_t first, uint32_t n_drop)
{
	uint32_t bs = e->layout.block_size, np = 0, len;
	const int32_t *pages;
	int r;

	if (!kvd_engine_can_shift(e))
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
