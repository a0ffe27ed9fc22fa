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
	enum kvd_cpu_isa cpu_isa; /* widest instruction set of the CPU backend (0: the best
	                          * the CPU has); $KVD_CPU_NO_AVX512 lowers it to AVX2 and
	                          * $KVD_CPU_GENERIC to portable C (read at open) */
	uint32_t block_size;     /* tokens per KV page, 1 .. KVMM_MAX_BLOCK_SIZE (kv.block_size) */
	enum kvd_kv_type kv_type; /* K/V element type (kv.cache_type); 0 is f16 */
	int kv_type_auto;         /* kv.cache_type = auto: bf16 where the backend answers that
				   * it is its fast type for the model's head size
				   * (KVD_CAPQ_KV_FAST: the CPU with bfloat16 products), else
				   * f16 (so f16 on the CUDA plug-in); kv_type unused */
	uint64_t kv_pool_bytes;  /* 0: kv_pool_fraction of available memory */
	double kv_pool_fraction; /* of available memory, when kv_pool_bytes is 0 (kv.pool_size) */
	uint32_t max_seqs;       /* 0: 256 */
	int prefix_cache;
	int keep_local;          /* never release the pages windowed layers are done
	                          * with (kv.release_local = no); see kvd_engine_step */
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

/*
 * Load the model, start the backend, create the pool. Returns 0 or -errno
 * with one line in err.
 *
 * Backends are tried in one order, the device plug-in first and the CPU
 * last ("auto"; "cpu" and "cuda" name one), and each is asked the
 * capability query (kernels/backend.h) about everything the model and the
 * configuration need — its weight types, model features, attention shape,
 * KV type — before its load. One that lacks something, or cannot start,
 * gives way to the next, and kvd_engine_backend_note() says why, naming the
 * missing capability ("cuda backend: KV cache type q8_0 is not implemented
 * on the GPU"); when none is left that is the error (-ENOTSUP, or -ENODEV
 * for a device that cannot start).
 */
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

/* Speculative decoding's draft model (spec_draft.h): a second engine the
 * target engine e owns from the call on (closed with it; a draft already
 * set is closed). NULL takes none. The scheduler finds it here. */
void kvd_engine_set_draft(struct kvd_engine *e, struct kvd_engine *draft);
/* The draft engine set, or NULL. */
struct kvd_engine *kvd_engine_draft(const struct kvd_engine *e);

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
	int keep_local; /* this sequence's pages are never released (a window
	                 * policy drops pages itself: kvd_engine_seq_evict) */
	int defer_publish; /* the pages this step fills are not entered into the
	                    * prefix index: the caller may cut the tail back
	                    * (kvmm_seq_truncate, speculative decoding's rejected
	                    * drafts) and then calls kvmm_seq_publish itself;
	                    * released pages stop before the step's first token */
};

/* Pages the step would need; 0, or -ENOMEM when it does not fit now. */
int kvd_engine_plan(const struct kvd_engine *e, const struct kvd_engine_item *items, size_t n, uint32_t *ret_pages);
/*
 * Run one step. Returns 0; -ENOMEM when the pages are not there (nothing
 * changed); -EINVAL for bad items (unknown sequence, token out of range,
 * a sequence twice); or the backend's error, in which case the step's
 * sequences hold unwritten slots and must be freed by the caller.
 *
 * Local-window layers (Gemma 3's five of six, Mistral's every layer): after
 * the step, each sequence's pages that every windowed layer is done with
 * (all positions p with p + widest window <= its length, whole pages) are
 * released (kvmm_seq_release): their global layers' K/V moves into packed
 * pages and the rest is freed, so a long context costs its global layers
 * plus one window. Logits do not change (the windowed layers never look
 * there again). Only with a backend that has KVD_CAP_PACKED_KV (with a
 * device pool, packed pages are filled through the host: page_read,
 * page_write), unless the engine's keep_local or the item's is set;
 * kvd_engine_release_info() says whether it is on.
 */
int kvd_engine_step(struct kvd_engine *e, const struct kvd_engine_item *items, size_t n);

/* Whether steps release windowed layers' pages (see kvd_engine_step): 1 and
 * the packing (slots per packed page, 0 when nothing is kept; the widest
 * window), or 0. */
int kvd_engine_release_info(const struct kvd_engine *e, uint32_t *ret_pack_slots, uint32_t *ret_max_window);

/* ---- context windows (sliding window, attention sinks) ----------------------- *
 *
 * How positions are handled: keys are cached after RoPE. When a window
 * policy drops the oldest window page of a sequence, every later token
 * moves down by one page's worth of positions, and the backend re-rotates
 * the moved keys by the same negative delta (kv_shift in kernels/backend.h),
 * so the cache always holds the surviving tokens at contiguous positions
 * 0 .. len - 1, as if they had been computed there, and positions never pass
 * sink + max_window tokens: a stream can run far past the model's context.
 * Values carry no position and stay as computed; so do the K/V of deeper
 * layers, which were computed while the dropped tokens were still visible
 * (StreamingLLM's semantics).
 *
 * Eviction is page-granular and happens at fixed points of the stream: a
 * sequence's first sink_pages pages are kept for ever (the attention sinks:
 * the first tokens rounded up to whole pages; 0 for a plain sliding
 * window), and the window after them grows to max_window tokens; before a
 * token would make it max_window + 1, its oldest page goes. A token thus
 * sees the sinks and between max_window - block_size + 1 and max_window
 * window tokens (itself included). Because the points depend only on the
 * stream position, a prompt cut into chunks at most as long as the room
 * left (kvd_engine_window_prepare) gives the same result as token by token.
 */
struct kvd_window {
	uint32_t sink_pages;  /* pages at the start that are never dropped */
	uint32_t max_window;  /* window tokens after them at most, >= block_size */
};
/* The most tokens a sequence under w holds (and its positions' bound). */
static inline uint32_t kvd_window_cap(const struct kvd_window *w, uint32_t block_size)
{
	return w->sink_pages * block_size + w->max_window;
}

/*
 * The window of a policy: sinks_on with `sinks` first tokens (0: 4) kept as
 * whole pages, the last `window` tokens (0: as many as fit) seen by every
 * token at least, all positions below max_len. 0, or -E2BIG when the sinks
 * and the window do not fit in max_len (sinks rounded up to pages, plus
 * the window, plus block_size - 1 tokens of page-granular slack).
 */
int kvd_window_make(uint32_t block_size, uint32_t max_len, int sinks_on, uint32_t sinks, uint32_t window,
		    struct kvd_window *ret);

/* Whether the backend can re-rotate cached keys (kv_shift) of this pool's
 * KV element type, as its answer to KVD_CAPQ_KV_SHIFT says: the window
 * policies need it. */
int kvd_engine_can_shift(const struct kvd_engine *e);
/* Why it cannot, for a refusal: the missing capability and the backend
 * ("re-rotating cached keys (kv_shift) of a q8_0 KV cache, which the cpu
 * backend does not implement ..."), written to buf (cap bytes); returns
 * buf. */
const char *kvd_engine_shift_refusal(const struct kvd_engine *e, char *buf, size_t cap);
/*
 * Drop n_drop pages of seq after its first `first` pages and re-rotate the
 * keys of the pages that moved down by -n_drop * block_size positions.
 * 0; -ENOTSUP when kvd_engine_can_shift() says no (nothing changed); the
 * errors of kvmm_seq_drop_pages (-ENOMEM: nothing changed); or the
 * backend's error, after which the sequence must be freed.
 */
int kvd_engine_seq_evict(struct kvd_engine *e, uint32_t seq, uint32_t first, uint32_t n_drop);
/*
 * Before appending up to `want` tokens to seq under window w: drop the
 * oldest window page when the window is full (see above), and return in
 * *ret_room how many tokens may be appended in this step (1 .. want) so
 * that no token passes an eviction point. *ret_dropped (may be NULL) gets
 * the tokens dropped now. Errors as kvd_engine_seq_evict, and -EINVAL for
 * a window below one page.
 */
int kvd_engine_window_prepare(struct kvd_engine *e, uint32_t seq, const struct kvd_window *w, uint32_t want,
			      uint32_t *ret_room, uint32_t *ret_dropped);

#endif
