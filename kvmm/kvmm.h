/*
 * kvmm/kvmm.h — the KV cache as virtual memory.
 *
 * kvmm owns a pool of fixed-size pages (a page = the K and V of block_size
 * consecutive tokens for every layer, laid out by the engine; kvmm only
 * knows its size), per-sequence page tables, refcounts with copy-on-write,
 * the prefix index with its LRU cache of unused pages, swap to a host file,
 * and the ledger of where every KV byte goes. It knows nothing of models,
 * kernels or sockets: content moves through callbacks the engine provides
 * (page copy for copy-on-write; page read/write when the pool is not
 * host-addressable).
 *
 * Sequences are named by small integer ids handed out by kvmm_seq_new().
 * A sequence's *length* is the number of tokens whose K/V slots it owns;
 * logical page i covers tokens [i*block_size, (i+1)*block_size).
 *
 * Memory changes are planned, then committed (as in llama.cpp's memory
 * modules): kvmm_plan() says whether a whole batch step fits without
 * changing anything, kvmm_commit() then performs it and cannot fail for
 * lack of pages. A step therefore never fails halfway.
 *
 * Threading: a struct kvmm has one owner thread (the engine); no function
 * takes a lock. Other processes read statistics through the shared
 * metadata mapping (see kvmm_stats_fd) without blocking the owner.
 *
 * Errors are negative errno values; ret_* outputs are untouched on failure.
 */
#ifndef KVD_KVMM_H
#define KVD_KVMM_H

#include <stddef.h>
#include <stdint.h>

#define KVMM_MAX_BLOCK_SIZE 1024
#define KVMM_MAX_SEQS       (1u << 16)

/* Callbacks into whoever owns page content (the engine, over a backend). */
struct kvmm_page_ops {
	/* Copy the first n_tokens token slots of page src into page dst
	 * (copy-on-write). NULL: kvmm memcpy()s whole pages in its host pool. */
	int (*copy)(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens);
	/* Device pools only (NULL for a host pool): stage a page to/from host
	 * memory for swap. */
	int (*read)(void *ud, uint32_t page, void *host_dst);
	int (*write)(void *ud, uint32_t page, const void *host_src);
	void *ud;
};

struct kvmm_config {
	size_t page_bytes;       /* bytes of one page (> 0) */
	uint32_t block_size;     /* tokens per page, 1 .. KVMM_MAX_BLOCK_SIZE */
	uint64_t pool_bytes;     /* pool size; 0: use pool_fraction */
	double pool_fraction;    /* of MemAvailable, when pool_bytes is 0 */
	uint32_t max_seqs;       /* live sequences at most, <= KVMM_MAX_SEQS */
	int prefix_cache;        /* index full pages for prefix sharing */
	uint64_t shuffle_seed;   /* != 0: free pages are handed out in a
	                          * pseudo-random order (tests of placement
	                          * independence); 0: lowest page first */
	const char *swap_path;   /* NULL: no swap */
	uint64_t swap_bytes;
	struct kvmm_page_ops page_ops;
};

struct kvmm;

/* Create the pool. Returns 0, -EINVAL for a bad config, -ENOMEM when the
 * pool cannot be mapped, or the error of creating the swap file. */
int kvmm_create(const struct kvmm_config *cfg, struct kvmm **ret);
/* Free everything; accepts NULL; returns NULL. */
struct kvmm *kvmm_destroy(struct kvmm *m);

void *kvmm_pool_base(const struct kvmm *m);
uint32_t kvmm_n_pages(const struct kvmm *m);
size_t kvmm_page_bytes(const struct kvmm *m);
uint32_t kvmm_block_size(const struct kvmm *m);
/* Pages available to new allocations: free plus reclaimable cached pages. */
uint32_t kvmm_available_pages(const struct kvmm *m);

/* ---- sequences ---------------------------------------------------------- */

/* A new empty sequence. -ENOSPC when max_seqs are live. */
int kvmm_seq_new(struct kvmm *m, uint32_t *ret_seq);
/* A child sharing every page of parent (refcount +1 each). -ENOSPC, -ENOENT. */
int kvmm_seq_fork(struct kvmm *m, uint32_t parent, uint32_t *ret_child);
/* Drop the sequence; its pages lose one reference each. Full pages known to
 * the prefix index stay cached on the LRU list; others return to the free
 * list. -ENOENT for an unknown id. Also valid for a swapped-out sequence. */
int kvmm_seq_free(struct kvmm *m, uint32_t seq);
/* Tokens the sequence holds K/V slots for; 0 for unknown ids. */
uint32_t kvmm_seq_len(const struct kvmm *m, uint32_t seq);
/* The sequence's page table (physical page per logical page), valid until
 * the next call that changes the sequence; NULL for an unknown id. */
const int32_t *kvmm_seq_pages(const struct kvmm *m, uint32_t seq, uint32_t *ret_n_pages);

/* ---- growth: plan, then commit ----------------------------------------- */

/* One sequence's growth in a step: n_tokens new token ids appended. */
struct kvmm_grow {
	uint32_t seq;
	uint32_t n_tokens;
	const int32_t *tokens;
};

/*
 * Would this whole step fit? Counts new pages and copy-on-write copies of
 * shared partial pages, against free plus reclaimable pages. Changes nothing.
 * Returns 0 and the pages it needs, -ENOMEM when it does not fit, -ENOENT
 * for an unknown or swapped-out sequence.
 */
int kvmm_plan(const struct kvmm *m, const struct kvmm_grow *g, size_t n, uint32_t *ret_pages_needed);
/*
 * Perform the step: append the tokens, allocating pages as sequences grow
 * into them and copying any shared page about to be written (through
 * page_ops.copy). All or nothing: returns 0, or an error with nothing
 * changed (-ENOMEM if it did not fit, or the copy callback's error).
 */
int kvmm_commit(struct kvmm *m, const struct kvmm_grow *g, size_t n);
/*
 * The K/V of everything appended so far is now written: enter the
 * sequence's newly completed full pages into the prefix index (no-op when
 * prefix caching is off). Call after the forward pass succeeded.
 */
int kvmm_seq_publish(struct kvmm *m, uint32_t seq);

/* ---- prefix cache -------------------------------------------------------- */

/*
 * Map into the empty sequence `seq` every page of tokens[0..n) already in the
 * prefix index (refcount +1 each; cached pages leave the LRU list), and return
 * the number of tokens whose K/V is thereby present. The hit is at most n - 1
 * so that at least one token remains to compute; when that leaves the last
 * mapped page partly beyond the hit, it stays shared and is copied on the
 * next write. Tokens are compared on every hit, so a hash collision never
 * maps a wrong page. -ENOENT, -EBUSY if seq is not empty.
 */
int kvmm_prefix_attach(struct kvmm *m, uint32_t seq, const int32_t *tokens, uint32_t n, uint32_t *ret_hit_tokens);

/* ---- swap ------------------------------------------------------------------ */

/* Write the sequence's private pages to the swap file and free them; shared
 * pages stay resident and referenced. -ENOSPC when swap is full, -EIO and
 * friends from the device; on error the sequence is unchanged and resident. */
int kvmm_seq_swap_out(struct kvmm *m, uint32_t seq);
/* Read them back into fresh pages. -ENOMEM when they do not fit (nothing
 * changed); an I/O error leaves the sequence swapped out. */
int kvmm_seq_swap_in(struct kvmm *m, uint32_t seq);
int kvmm_seq_is_swapped(const struct kvmm *m, uint32_t seq);

/* ---- statistics ------------------------------------------------------------ */

struct kvmm_stats {
	uint32_t pages_total;
	uint32_t pages_free;
	uint32_t pages_used;     /* referenced by at least one sequence */
	uint32_t pages_shared;   /* referenced by two or more */
	uint32_t pages_cached;   /* unreferenced, kept by the prefix index */
	uint32_t pages_swapped;  /* pages' worth of content in the swap file */
	uint64_t page_bytes;
	uint32_t block_size;
	uint32_t seqs_live;
	uint64_t tokens_resident;    /* sum of resident sequences' lengths */
	uint64_t prefix_lookups;
	uint64_t prefix_query_tokens;
	uint64_t prefix_hit_tokens;
	uint64_t pages_evicted;      /* cached pages reclaimed */
	uint64_t cow_copies;
	uint64_t swap_out_pages, swap_in_pages;
};
void kvmm_get_stats(const struct kvmm *m, struct kvmm_stats *ret);

#endif /* KVD_KVMM_H */
