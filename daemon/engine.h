/*
 * daemon/engine.h — where the model, a compute backend and kvmm meet.
 *
 * The engine owns one loaded model, one backend context and one kvmm pool
 * laid out for that model. It runs one batch step at a time: it asks kvmm
 * for the pages the step needs (planned first, then committed, so a step
 * never fails halfway for lack of memory), hands the backend a paged view
 * and each sequence's page table, and, once the forward pass has written the
 * new tokens' K/V, lets kvmm index the pages that became full.
 *
 * Policy (who runs, who waits, who is swapped) is the scheduler's, not the
 * engine's. One thread drives an engine. An engine can also be opened
 * without a model, over a given backend table and hyper-parameters, so the
 * scheduler above it can be tested with a stub backend.
 */
#ifndef KVD_ENGINE_H
#define KVD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

struct kvd_engine;
struct kvd_model;
struct kvmm;
struct kvmm_swap_io;

struct kvd_engine_config {
	const char *model_path;
	const char *backend;     /* "cpu", "cuda" or "auto" (NULL: auto). cuda and
	                          * auto dlopen() libkvd-cuda.so ($KVD_CUDA_PLUGIN,
	                          * else ../lib/kvd/ or ../lib/ beside the
	                          * executable); auto falls back to the CPU */
	int n_threads;           /* <= 0: one per online CPU */
	uint32_t block_size;     /* tokens per KV page, 1 .. KVMM_MAX_BLOCK_SIZE (kv.block_size) */
	enum kvd_kv_type kv_type; /* K/V element type (kv.cache_type); 0 is f16 */
	uint64_t kv_pool_bytes;  /* 0: kv_pool_fraction of available memory */
	double kv_pool_fraction; /* of available memory, when kv_pool_bytes is 0 (kv.pool_size) */
	uint32_t max_seqs;       /* 0: 256 */
	int prefix_cache;
	uint64_t shuffle_seed;   /* kvmm page placement (tests) */
	const char *swap_path;   /* NULL: no swap */
	uint64_t swap_bytes;
	struct kvmm_swap_io *swap_io; /* a swap store the caller opened (then
	                          * swap_path is ignored); the engine owns it
	                          * from the call on, on failure too */
	/* Optional: a KV pool memfd kept from an earlier run. Called once the
	 * pool's layout is known, before it is created, with the backend's
	 * name, whether that backend keeps the pool in device memory (nothing
	 * can then be adopted) and the configured pool size (0: a fraction).
	 * Returns a memfd of *ret_n_pages pages to adopt (kvmm_create_adopt;
	 * the engine owns it from then on), or -1 for a fresh pool. */
	int (*pool_adopt)(void *ud, const struct kvd_kv_layout *layout, const char *backend, int device_pool,
			  uint64_t pool_bytes, uint32_t *ret_n_pages);
	void *pool_adopt_ud;
};

/* Load the model, start the backend, create the pool. Returns 0 or -errno
 * with one line in err. */
int kvd_engine_open(const struct kvd_engine_config *cfg, struct kvd_engine **ret, char *err, size_t errlen);
/*
 * The same over a backend table the caller gives and bare hyper-parameters,
 * without a model file: the backend's load gets weights holding only *hp
 * (every tensor empty), so a backend that computes without weights — a
 * test stub — can run real steps over a real kvmm pool. cfg->model_path
 * and cfg->backend are ignored; the pool is laid out from hp (n_layer,
 * n_head_kv, head_dim) and cfg->block_size. kvd_engine_model() is NULL on
 * such an engine. Returns 0, -EINVAL for a NULL ops or hp, a table that
 * kvd_backend_ops_check() refuses, or hp without
 * n_vocab, n_layer, n_head_kv or head_dim, or the backend's or kvmm's
 * error, with one line in err.
 */
int kvd_engine_open_backend(const struct kvd_engine_config *cfg, const struct kvd_backend_ops *ops,
			    const struct kvd_hparams *hp, struct kvd_engine **ret, char *err, size_t errlen);
/* Accepts NULL; returns NULL. */
struct kvd_engine *kvd_engine_close(struct kvd_engine *e);

/* The loaded model; NULL on an engine from kvd_engine_open_backend. */
const struct kvd_model *kvd_engine_model(const struct kvd_engine *e);
struct kvmm *kvd_engine_kvmm(struct kvd_engine *e);
const struct kvd_kv_layout *kvd_engine_kv_layout(const struct kvd_engine *e);
const char *kvd_engine_backend_name(const struct kvd_engine *e);
/* Why a device backend asked for by "auto" is not in use (for the log), or
 * NULL. With "cuda" the same reason is kvd_engine_open's error instead. */
const char *kvd_engine_backend_note(const struct kvd_engine *e);
int32_t kvd_engine_n_vocab(const struct kvd_engine *e);
/* 1 when the pool was adopted from the memfd cfg->pool_adopt returned, 0
 * when there was none (a fresh pool), or kvmm_create_adopt's error when
 * that memfd was refused (the pool is then a fresh one). */
int kvd_engine_pool_adopted(const struct kvd_engine *e);

/* One sequence's part of a step: tokens appended at its current length.
 * logits: NULL, or n_vocab floats for the last token (n_tokens * n_vocab
 * when all_logits). */
struct kvd_engine_item {
	uint32_t seq;
	const int32_t *tokens;
	int32_t n_tokens;
	float *logits;
	int all_logits;
};

/* Pages the step would need; 0, or -ENOMEM when it does not fit now. */
int kvd_engine_plan(const struct kvd_engine *e, const struct kvd_engine_item *items, size_t n, uint32_t *ret_pages);
/*
 * Run one step. Returns 0; -ENOMEM when the pages are not there (nothing
 * changed); -EINVAL for bad items (unknown sequence, token out of range,
 * a sequence twice); or the backend's error, in which case the step's
 * sequences hold unwritten slots and must be freed by the caller.
 */
int kvd_engine_step(struct kvd_engine *e, const struct kvd_engine_item *items, size_t n);

#endif
