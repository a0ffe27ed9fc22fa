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
#include <sys/uio.h> /* struct iovec, for kvmm_swap_io_ops */

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
	/* Optional, device pools only, both or neither: n pages in one call,
	 * page pages[i] to (read_n) or from (write_n) host + i * page_bytes,
	 * complete on return. With them a swap batch (up to
	 * KVMM_SWAP_QUEUE_DEPTH pages) costs the device one call and one
	 * synchronisation instead of one per page; read/write stay required. */
	int (*read_n)(void *ud, const uint32_t *pages, uint32_t n, void *host_dst);
	int (*write_n)(void *ud, const uint32_t *pages, uint32_t n, const void *host_src);
	/* Required when kvmm_config.pack_slots is 1 .. KVMM_PACK_MAX (else
	 * unused): copy the share of page src that outlives its release (the
	 * layers without a window) into slot `slot` of packed page dst. */
	int (*pack)(void *ud, uint32_t dst, uint32_t slot, uint32_t src);
	void *ud;
};

/* kvmm_config.pack_slots: what kvmm_seq_release() keeps of a page. */
#define KVMM_PACK_MAX  255u        /* most slots a packed page may have */
#define KVMM_PACK_NONE 0xffffffffu /* nothing: a released page is simply freed */

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
	/* kvmm_seq_release(): 0, it is refused (-EOPNOTSUPP); 1 ..
	 * KVMM_PACK_MAX, the kept share of that many released pages shares
	 * one packed page (page_ops.pack required); KVMM_PACK_NONE, released
	 * pages are freed whole. */
	uint32_t pack_slots;
	struct kvmm_page_ops page_ops;
};

struct kvmm;

/* Create the pool. Returns 0, -EINVAL for a bad config, -ENOMEM when the
 * pool cannot be mapped, or the error of creating the swap file.
 * max_seqs 0 means KVMM_MAX_SEQS. page_ops.read and .write are both set (a
 * device pool: kvmm maps no host pool, kvmm_pool_base() is NULL and
 * page_ops.copy is required) or both NULL (a host pool in a memfd);
 * page_ops.read_n and .write_n are both NULL or, in a device pool, both set
 * (-EINVAL otherwise). Pages
 * are handed out lowest first from a fresh pool (shuffle_seed 0) and
 * last-freed first after that, which keeps hot pages in cache. */
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
/* A child sharing every page of parent (refcount +1 each). -ENOSPC; -ENOENT
 * for an unknown or swapped-out parent. */
int kvmm_seq_fork(struct kvmm *m, uint32_t parent, uint32_t *ret_child);
/* Drop the sequence; its pages lose one reference each. Full pages known to
 * the prefix index stay cached on the LRU list; others return to the free
 * list. -ENOENT for an unknown id. Also valid for a swapped-out sequence,
 * whose swap slots are freed (no I/O). */
int kvmm_seq_free(struct kvmm *m, uint32_t seq);
/* Tokens the sequence holds K/V slots for; 0 for unknown ids. */
uint32_t kvmm_seq_len(const struct kvmm *m, uint32_t seq);
/* The sequence's page table (physical page per logical page), valid until
 * the next call that changes the sequence; NULL for an unknown id. For a
 * swapped-out sequence, -1 stands for every page that is in the swap file. */
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
 * shared partial pages, against free plus reclaimable pages. Changes no
 * page, sequence or counter (m is not const: the scan marks sequences to
 * find one named twice).
 * Returns 0 and the pages it needs, -ENOMEM when it does not fit, -ENOENT
 * for an unknown or swapped-out sequence, -EINVAL for a sequence named
 * twice, -EOVERFLOW for a length past UINT32_MAX tokens. A grow of 0 tokens
 * is a no-op; tokens may be NULL, but then the pages it fills are never
 * indexed.
 */
int kvmm_plan(struct kvmm *m, const struct kvmm_grow *g, size_t n, uint32_t *ret_pages_needed);
/*
 * Perform the step: append the tokens, allocating pages as sequences grow
 * into them and copying any shared page about to be written (through
 * page_ops.copy). All or nothing: returns 0, or an error with the
 * sequences unchanged (-ENOMEM if it did not fit, the errors of kvmm_plan,
 * or the copy callback's error; a failed copy may still have reclaimed
 * cached pages to make room). Cached prefix pages are reclaimed (here, in
 * attach and in swap-in) only when the free list is empty: the colder page
 * goes first, and never before its cached descendants in the index (tails
 * before heads); reclaiming a page drops the index entries below it, which
 * no lookup could reach any more.
 */
int kvmm_commit(struct kvmm *m, const struct kvmm_grow *g, size_t n);
/*
 * The K/V of everything appended so far is now written: enter the
 * sequence's newly completed full pages into the prefix index (no-op when
 * prefix caching is off). Call after the forward pass succeeded. A
 * just-completed page may be replaced by an identical page already in the
 * index (same tokens after the same prefix), freeing the duplicate; the page
 * table changes accordingly. -ENOENT for an unknown or swapped-out sequence.
 */
int kvmm_seq_publish(struct kvmm *m, uint32_t seq);

/*
 * Context policies (sliding window, attention sinks): drop the n_drop full
 * logical pages first .. first + n_drop - 1 from inside the sequence. Its
 * later pages move down by n_drop places and its length shrinks by n_drop *
 * block_size tokens; those later pages become private first, because the
 * caller rewrites their content (re-rotates their keys to the new
 * positions): a page another sequence maps is copied through
 * page_ops.copy, a page only this one maps leaves the prefix index (with
 * its cached descendants) if it was there. The sequence is never indexed again
 * (its content no longer matches its tokens' natural prefix); pages before
 * `first` are untouched and stay shared. The dropped pages lose one
 * reference each (cached or freed as in kvmm_seq_free).
 * Returns 0; -ENOENT for an unknown or swapped-out sequence; -EINVAL when
 * n_drop is 0 or the range is not made of full pages below the last page
 * (first + n_drop < n_pages, or == n_pages with a page-aligned length);
 * -ENOMEM when the copies do not fit (nothing changed); or the copy
 * callback's error, after which the sequence is consistent for kvmm but
 * holds mixed content and should be freed.
 */
int kvmm_seq_drop_pages(struct kvmm *m, uint32_t seq, uint32_t first, uint32_t n_drop);

/*
 * Cut the sequence back to its first n_tokens tokens, as if the later ones
 * had never been appended (speculative decoding discards the K/V of
 * rejected draft tokens this way). Logical pages wholly past n_tokens lose
 * one reference each (freed, or cached as in kvmm_seq_free); a partly kept
 * last page keeps its first n_tokens % block_size slots, and when another
 * sequence shares it, its content stays as it is (the next write copies
 * it). Only unpublished positions may go: the prefix index never sees a
 * cut token, so the engine's step must leave publishing to the caller
 * (kvd_engine_item.defer_publish), who calls kvmm_seq_publish after the
 * cut. Returns 0 (n_tokens >= the length is a no-op); -ENOENT for an
 * unknown or swapped-out sequence; -EBUSY when n_tokens would cut into
 * pages already published (kvmm_seq_publish) or released.
 */
int kvmm_seq_truncate(struct kvmm *m, uint32_t seq, uint32_t n_tokens);

/*
 * Release (models whose layers mostly attend over a window, e.g. Gemma 3's
 * five local layers of six): once every windowed layer is done with a
 * logical page (all its positions are older than the widest window before
 * any position still to come), most of the page is dead; only the layers
 * without a window (the global layers) still read it. kvmm_seq_release()
 * frees the oldest such pages, logical pages n_released .. upto - 1, after
 * keeping that live share: with pack_slots = k, the share of logical page
 * i goes to slot i % k of the packed page that the page table holds at
 * position i - i % k (allocated when slot 0 is released, copied first if
 * it is shared, e.g. with a fork); every other released position holds
 * KVMM_RELEASED. With KVMM_PACK_NONE nothing is kept and every released
 * position holds KVMM_RELEASED. The sequence keeps its length and
 * positions; released pages are the prefix 0 .. n_released - 1 of its
 * page table and never come back (an indexed page released stays cached in
 * the prefix index for other prompts; the sequence's later pages stay
 * indexed but nothing is published under a released page).
 *
 * upto may not pass the pages already published (kvmm_seq_publish), so a
 * page is offered to the prefix index before it is released. Best effort
 * on memory: when a packed page is needed and none is available, it stops
 * there. *ret_released (may be NULL): the sequence's released pages after
 * the call. Returns 0; -ENOENT for an unknown or swapped-out sequence;
 * -EOPNOTSUPP when pack_slots is 0; -EINVAL when upto is past the
 * published pages; or the pack or copy callback's error (the pages
 * released until then stay released, the sequence is consistent).
 */
#define KVMM_RELEASED (-2)
int kvmm_seq_release(struct kvmm *m, uint32_t seq, uint32_t upto, uint32_t *ret_released);
/* Released logical pages of the sequence (0 for unknown ids). */
uint32_t kvmm_seq_released(const struct kvmm *m, uint32_t seq);
/* Pages the sequence maps: its page table's entries that are not
 * KVMM_RELEASED, packed pages included (for a swapped-out sequence, what
 * swap-in maps again); 0 for unknown ids. */
uint32_t kvmm_seq_pages_held(const struct kvmm *m, uint32_t seq);

/* ---- prefix cache -------------------------------------------------------- */

/*
 * Map into the empty sequence `seq` every page of tokens[0..n) already in the
 * prefix index (refcount +1 each; cached pages leave the LRU list), and return
 * the number of tokens whose K/V is thereby present. The hit is at most n - 1
 * so that at least one token remains to compute; when that leaves the last
 * mapped page partly beyond the hit, it stays shared and is copied on the
 * next write. Tokens are compared on every hit, so a hash collision never
 * maps a wrong page. Hits on pages adopted from an earlier run (kvmm_prefix_import,
 * kvmm_hib_adopt) are counted in kvmm_stats.adopted_hit_* and in the sequence's
 * record (adopted_tokens, adopted_pages; kvmm_seq_ledger).
 * -ENOENT; -EBUSY if seq is not empty or is swapped out.
 */
int kvmm_prefix_attach(struct kvmm *m, uint32_t seq, const int32_t *tokens, uint32_t n, uint32_t *ret_hit_tokens);

/*
 * Put the empty sequence `seq` in an owner scope of the prefix index: its
 * lookups (kvmm_prefix_attach) find only pages published in the same scope,
 * and the pages it publishes serve only sequences of that scope, so the
 * cache never tells one owner (a user, a tenant) whether another computed a
 * prompt — no hit, no shorter prefill, no deduplication across scopes. A new
 * sequence is in scope 0; a fork inherits its parent's scope. The caller
 * picks scopes (one per uid, say, or 0 for a machine-wide cache). The same
 * tokens in two scopes are two chains and take two sets of pages.
 * -ENOENT; -EBUSY when the sequence holds tokens or is swapped out.
 */
int kvmm_seq_set_scope(struct kvmm *m, uint32_t seq, uint64_t scope);

/* No known requester: the evictor of a page dropped explicitly
 * (kvmm_cache_evict, kvmm_cache_drop_all, a drop of pages) or reclaimed
 * for an allocation no sequence asked for (hibernation restore). */
#define KVMM_OWNER_NONE UINT32_MAX
/*
 * Name the requester of `seq` (a uid, say): when an allocation for it
 * reclaims a cached prefix page, the index remembers this owner with the
 * page's key, and a later lookup that recomputes that page reports it
 * (kvmm_seq_record.evicted_prefix_by). Any time; a new sequence has
 * KVMM_OWNER_NONE, a fork inherits its parent's owner. -ENOENT.
 */
int kvmm_seq_set_owner(struct kvmm *m, uint32_t seq, uint32_t owner);

/* ---- swap ------------------------------------------------------------------ */

/* Write the sequence's private pages to the swap file and free them; shared
 * pages stay resident and referenced. A page only this sequence maps but
 * the prefix index knows is written too, and also stays cached in memory.
 * -ENOSPC when swap is full, -ENODEV without a swap store, -EALREADY when
 * already swapped out, -EIO and friends from the device; on error the
 * sequence is unchanged and resident. */
int kvmm_seq_swap_out(struct kvmm *m, uint32_t seq);
/* Read them back into fresh pages; a page still cached in memory is mapped
 * back without a read, and pages read are re-entered into the prefix index.
 * -ENOMEM when they do not fit (nothing changed); -EALREADY when resident;
 * an I/O error leaves the sequence swapped out with its swapped copy
 * intact, so a later swap-in can still succeed. */
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
	uint32_t pages_demoted;      /* of pages_swapped: demoted prefix pages */
	uint32_t swap_slots;         /* capacity of the swap file, in pages */
	uint32_t seqs_swapped;       /* of seqs_live: swapped out */
	uint32_t pages_packed;       /* of pages_used: packed pages (kvmm_seq_release) */
	uint64_t pages_released;     /* logical pages released so far */
	/* Prefix hits that landed on pages adopted from an earlier run (the
	 * fd-store hand-over or a hibernation file, NODE_ADOPTED), every hit
	 * counted (a page hit twice counts twice); file_hit_tokens: of
	 * adopted_hit_tokens, those on pages from a hibernation file. */
	uint64_t adopted_hit_pages;
	uint64_t adopted_hit_tokens;
	uint64_t adopted_file_hit_tokens;
	uint64_t pages_adopted_file; /* of kvmm_ledger.pages_adopted: from a hibernation file */
};
void kvmm_get_stats(const struct kvmm *m, struct kvmm_stats *ret);


/* ---- pool and metadata ---------------------------------------------------- */

/* The memfd holding a host pool (page p at offset p * page_bytes), or -1 for
 * a device pool. Owned by kvmm; dup() it to keep it. */
int kvmm_pool_fd(const struct kvmm *m);
/* 1 when the host pool got MFD_HUGETLB pages, 0 when it uses normal pages
 * (with MADV_HUGEPAGE asked for). */
int kvmm_pool_hugetlb(const struct kvmm *m);

/*
 * The metadata memfd: a header, the pool counters and ledger (struct
 * kvmm_stats and struct kvmm_ledger) under a sequence lock, and one 32-bit
 * state word per page (refcount and flags, see KVMM_PAGE_*). kvmm reads the
 * page words back (they hold the refcounts), so the file is sealed against
 * resizing, hole punching and new writable mappings (F_SEAL_FUTURE_WRITE,
 * Linux 5.1 and later; kvmm_stats_fd_sealed() says whether it is): a process
 * handed this fd (SCM_RIGHTS) can then map it read-only and no one but kvmm
 * can change it. Owned by kvmm; dup() it to keep it.
 */
int kvmm_stats_fd(const struct kvmm *m);
/* 1 when the metadata memfd carries every seal above (it may be handed to
 * another process), 0 when the kernel refused F_SEAL_FUTURE_WRITE. */
int kvmm_stats_fd_sealed(const struct kvmm *m);

/*
 * Where a reader finds things in the metadata memfd, in byte offsets from
 * its start, so that its owner can describe the file to a process it hands
 * the fd to. The reader copies what it needs between two reads of the
 * sequence lock (u64 at seq_offset, odd while kvmm updates: load it with
 * acquire, copy, fence with acquire, load it again; equal and even means
 * the copy is consistent). Counter words are u64; word_slots_used and
 * word_pages_demoted index the two a page map needs (struct kvmm_stats
 * pages_swapped and pages_demoted). Page state words are u32 (KVMM_PAGE_*).
 */
struct kvmm_meta_layout {
	uint64_t file_bytes;
	uint64_t seq_offset;
	uint64_t words_offset;
	uint64_t page_words_offset;
	uint32_t n_words;
	uint32_t n_pages;
	uint32_t swap_slots;
	uint32_t word_slots_used;
	uint32_t word_pages_demoted;
};
void kvmm_meta_layout(const struct kvmm *m, struct kvmm_meta_layout *ret);

/* Bits of a page state word in the metadata memfd. */
#define KVMM_PAGE_REF_MASK 0x00ffffffu /* sequences referencing the page */
#define KVMM_PAGE_INDEXED  0x01000000u /* the page is in the prefix index */
#define KVMM_PAGE_FREE     0x02000000u /* on the free list */
#define KVMM_PAGE_PACKED   0x04000000u /* a packed page (kvmm_seq_release) */

/* Refcount of a page (sequences mapping it), 0 for free, cached or out of
 * range. For tests and tools. */
uint32_t kvmm_page_refcount(const struct kvmm *m, uint32_t page);
/* The page's state word (refcount | KVMM_PAGE_* flags), 0
 * out of range. For tests and tools. */
uint32_t kvmm_page_state(const struct kvmm *m, uint32_t page);

/* ---- ledger ---------------------------------------------------------------- */

/* Pool-wide counters, cumulative since kvmm_create() unless said otherwise. */
struct kvmm_ledger {
	uint64_t seqs_created;
	uint64_t seqs_finished;
	/* Tokens of finished sequences, by kind (see kvmm_seq_set_prompt_tokens). */
	uint64_t prompt_tokens;
	uint64_t generated_tokens;
	uint64_t retained_tokens;      /* left in the prefix index at the finish */
	uint64_t shared_prefix_tokens; /* taken from the prefix cache (all seqs) */
	/* Now: KV held for sequences, and what of it holds tokens. */
	uint64_t kv_bytes_allocated;   /* referenced pages * page_bytes */
	uint64_t kv_bytes_useful;      /* tokens written into them * token bytes */
	uint64_t pages_allocated;      /* handed out (new pages and CoW copies) */
	uint64_t cow_copies;
	/* Cached prefix pages leaving memory, by cause. */
	uint64_t pages_evicted_reclaim;  /* dropped to satisfy an allocation */
	uint64_t pages_evicted_explicit; /* dropped by kvmm_cache_evict() */
	uint64_t pages_evicted_orphan;   /* dropped with an ancestor (unreachable) */
	uint64_t pages_demoted;          /* written to swap, kept in the index */
	uint64_t pages_promoted;         /* read back from swap on a prefix hit */
	uint64_t demoted_dropped;        /* swap-tier entries dropped for room */
	uint64_t pages_deduplicated;     /* publish found an identical page */
	/* Sequence swap (preemption). */
	uint64_t swap_out_seqs, swap_in_seqs;
	uint64_t swap_out_pages, swap_in_pages;
	uint64_t swap_in_remapped_pages; /* came back from the cache, no read */
	uint64_t swap_write_bytes, swap_read_bytes; /* all swap I/O */
	uint64_t swap_write_ns, swap_read_ns;
	uint64_t swap_errors;            /* failed page transfers */
	/* Steps and the KV they read: every step reads each growing sequence's
	 * whole KV once (decode attention), (len + n_tokens) * token bytes. */
	uint64_t steps;
	uint64_t kv_read_bytes_total;
	uint64_t kv_read_bytes_last_step;
	/* Reported by the scheduler (kvmm_seq_add_time). */
	uint64_t mem_wait_ns, compute_ns;
	/* Cached prefix pages taken over from an earlier run (kvmm_prefix_import). */
	uint64_t pages_adopted;
};
/* Fill *ret with the pool ledger. */
void kvmm_get_ledger(const struct kvmm *m, struct kvmm_ledger *ret);


/* One sequence's ledger; kvmm_seq_finish() returns the last one. */
struct kvmm_seq_record {
	uint32_t seq;
	uint32_t len_tokens;           /* K/V slots held */
	uint32_t prompt_tokens;
	uint32_t generated_tokens;
	uint32_t shared_prefix_tokens; /* from the prefix cache */
	uint32_t adopted_tokens;       /* of those, on pages adopted from an earlier run */
	uint32_t adopted_pages;        /* the pages they are on */
	uint32_t retained_tokens;      /* left in the prefix index (at finish) */
	uint32_t pages;                /* pages it maps (kvmm_seq_pages_held) */
	uint32_t pages_peak;
	uint64_t kv_bytes_allocated;   /* pages * page_bytes */
	uint64_t kv_bytes_useful;      /* len_tokens * token bytes (released
	                                * tokens: their packed share) */
	uint32_t slack_tokens;         /* pages * block_size - len_tokens */
	uint32_t pages_allocated;      /* new pages and CoW copies, lifetime */
	uint32_t cow_copies;
	uint32_t swap_outs, swap_ins;
	uint32_t swap_out_pages, swap_in_pages, swap_in_remapped_pages;
	uint32_t swap_errors;
	uint64_t swap_bytes, swap_ns;
	uint64_t steps;
	uint64_t kv_read_bytes;        /* over its steps, as in kvmm_ledger */
	uint64_t kv_read_bytes_max_step; /* the most of it one step read */
	uint64_t mem_wait_ns, compute_ns;
	uint64_t lifetime_ns;          /* creation to now / to the finish */
	uint32_t dropped_tokens;       /* removed by kvmm_seq_drop_pages (context policies) */
	uint32_t drops;                /* kvmm_seq_drop_pages calls */
	uint32_t released_tokens;      /* of len_tokens: in released pages (kvmm_seq_release) */
	uint32_t packed_pages;         /* of pages: packed pages holding their kept share */
	/* Of the prompt's tokens not found in the prefix index, those on pages
	 * whose identical content (same owner scope, same tokens, same chain)
	 * the index had held and dropped (evicted, or demoted and dropped), so
	 * they are recomputed: counted from the first miss while the dropped
	 * chain continues. The index remembers the last dropped keys only
	 * (about 2 per pool page, at least 512 and at most 32,768), so an
	 * eviction long ago may go uncounted. */
	uint32_t evicted_prefix_tokens;
	/* The owner (kvmm_seq_set_owner) whose allocation evicted the first
	 * page of evicted_prefix_tokens; KVMM_OWNER_NONE when they are 0, when
	 * that page was dropped explicitly, or when the allocation had no
	 * sequence. All the tokens are charged to this one evictor. */
	uint32_t evicted_prefix_by;
};

/* Tokens at positions < n_prompt_tokens are the prompt, later ones are
 * generated (ledger only). Until called, every token counts as prompt.
 * -ENOENT for an unknown id. */
int kvmm_seq_set_prompt_tokens(struct kvmm *m, uint32_t seq, uint32_t n_prompt_tokens);
/* Add time the sequence spent waiting for KV memory and in compute (ledger
 * only; the scheduler measures both). -ENOENT for an unknown id. */
int kvmm_seq_add_time(struct kvmm *m, uint32_t seq, uint64_t mem_wait_ns, uint64_t compute_ns);
/* The ledger of a live sequence so far. -ENOENT for an unknown id. */
int kvmm_seq_ledger(const struct kvmm *m, uint32_t seq, struct kvmm_seq_record *ret);
/* kvmm_seq_free(), filling *ret_record (may be NULL) with the sequence's
 * final ledger, for the per-request ledger log. -ENOENT for an unknown id. */
int kvmm_seq_finish(struct kvmm *m, uint32_t seq, struct kvmm_seq_record *ret_record);
/* Format a record as one line of JSON (no newline) into buf. Returns the
 * length, or -ENOBUFS when size is too small (buf then holds a prefix). */
int kvmm_seq_record_json(const struct kvmm_seq_record *r, char *buf, size_t size);

/* ---- cache tiers ------------------------------------------------------------ */

/*
 * Drop up to n_pages cached (unreferenced, indexed) pages to the free list,
 * coldest first and tails before heads. A dropped page takes its cached
 * descendants with it, so *ret_dropped may exceed n_pages by a few.
 * Returns 0.
 */
int kvmm_cache_evict(struct kvmm *m, uint32_t n_pages, uint32_t *ret_dropped);
/*
 * Empty the prefix cache (kvctl cache drop): every cached page (resident,
 * unreferenced) goes to the free list and every demoted one leaves the swap
 * file, with their index entries. Pages sequences map stay mapped (a
 * referenced page under a dropped one is only un-indexed). *ret_dropped
 * (may be NULL): cached and demoted pages dropped. Returns 0.
 */
int kvmm_cache_drop_all(struct kvmm *m, uint32_t *ret_dropped);
/*
 * Demote up to n_pages of the coldest cached pages to the swap file: each is
 * written (many in flight), freed, and stays in the prefix index, so a later
 * hit reads it back (promotion) instead of recomputing it. Makes room in the
 * swap file by dropping its coldest demoted entries; never touches swapped
 * sequences' slots. Meant for the scheduler to call ahead of pressure; the
 * allocation paths themselves never write. Returns 0 and the count demoted
 * (0 without a swap store); on an I/O error the pages whose write failed
 * stay cached in memory, the others are demoted, and the error is returned.
 */
int kvmm_cache_demote(struct kvmm *m, uint32_t n_pages, uint32_t *ret_demoted);

/* ---- swap storage interface -------------------------------------------------- */

/*
 * kvmm reaches its swap file only through this interface (in the manner of
 * SQLite's VFS), so tests can put a fault-injecting layer in between. An
 * implementation embeds struct kvmm_swap_io first in its own struct.
 * All transfers are whole pages to slot offsets; buffers, offsets and lengths
 * are multiples of io->align.
 */
#define KVMM_SWAP_IO_VERSION 1
#define KVMM_SWAP_QUEUE_DEPTH 32 /* transfers in flight in the io_uring store */

enum { KVMM_IO_READ = 0, KVMM_IO_WRITE = 1 };

struct kvmm_io_req {
	uint32_t op;       /* KVMM_IO_READ or KVMM_IO_WRITE */
	int32_t buf_index; /* registered buffer containing buf, or -1 */
	void *buf;
	size_t len;
	uint64_t offset;   /* bytes into the store */
	int64_t result;    /* out: bytes transferred, or -errno */
};

struct kvmm_swap_io;
struct kvmm_swap_io_ops {
	int version;      /* KVMM_SWAP_IO_VERSION */
	const char *name;
	/* Perform the n transfers, in any order and overlapping, and set every
	 * request's result. A short transfer is reported as such (result <
	 * len); kvmm treats it as -EIO. Returns 0 when every result is set, or
	 * a negative errno when the store itself failed (results then all
	 * hold that error). */
	int (*rw)(struct kvmm_swap_io *io, struct kvmm_io_req *reqs, uint32_t n);
	/* Optional: buffers kvmm will transfer from/to (buf_index refers to
	 * them); the store may pin them. Failure is not an error for kvmm, which
	 * then passes buf_index -1. */
	int (*register_buffers)(struct kvmm_swap_io *io, const struct iovec *iov, uint32_t n);
	/* Close and free the store. */
	void (*destroy)(struct kvmm_swap_io *io);
};

#define KVMM_SWAP_DIRECT    0x1u /* file opened O_DIRECT */
#define KVMM_SWAP_FIXEDBUFS 0x2u /* buffers registered with the kernel */

struct kvmm_swap_io {
	const struct kvmm_swap_io_ops *ops;
	uint64_t size_bytes; /* usable bytes */
	uint32_t align;      /* required alignment, a power of two */
	uint32_t flags;      /* KVMM_SWAP_* */
};

/* Flags of kvmm_swap_io_uring_open(). */
#define KVMM_SWAP_OPEN_NO_DIRECT 0x1u /* do not try O_DIRECT */
#define KVMM_SWAP_OPEN_UNLINK    0x2u /* unlink the path once open (anonymous) */

/*
 * The swap file: created by this call, mode 0600, at a path that must not
 * exist (O_CREAT | O_EXCL, so an existing file, directory or symbolic link,
 * dangling or not, is refused with -EEXIST and left untouched: kvd never
 * truncates, overwrites or unlinks a file it did not create). It is then
 * preallocated to bytes with fallocate() (ftruncate where the file system
 * does not implement it; a file system without the room fails with -ENOSPC
 * and the new file is removed), switched to O_DIRECT where the file system
 * allows it (tmpfs and some others refuse it: the file is then used through
 * the page cache and KVMM_SWAP_DIRECT stays clear), and driven by an io_uring
 * of KVMM_SWAP_QUEUE_DEPTH entries with the file and (when the memlock limit
 * allows) the buffers registered. With KVMM_SWAP_OPEN_UNLINK the path is
 * unlinked right after the create (only while it still names the new file),
 * before anything is written.
 *
 * Returns 0, -EINVAL for bytes 0 (or below one O_DIRECT block) or an empty
 * path, -EEXIST for an existing path, or the error of open, fallocate or
 * io_uring_queue_init. ret_failed_step (may be NULL) is set on failure only,
 * to the KVMM_SWAP_STEP_* that failed, so the caller can say which it was.
 */
enum {
	KVMM_SWAP_STEP_ARGS = 0,        /* the arguments */
	KVMM_SWAP_STEP_CREATE = 1,      /* creating the file */
	KVMM_SWAP_STEP_PREALLOCATE = 2, /* reserving its space */
	KVMM_SWAP_STEP_RING = 3,        /* O_DIRECT probe and io_uring set-up */
};
int kvmm_swap_io_file_open(const char *path, uint64_t bytes, uint32_t flags, struct kvmm_swap_io **ret,
			   int *ret_failed_step);
/* kvmm_swap_io_file_open() without the failed step. */
int kvmm_swap_io_uring_open(const char *path, uint64_t bytes, uint32_t flags, struct kvmm_swap_io **ret);
/* A store in anonymous memory (tests, benchmarks of kvmm alone). */
int kvmm_swap_io_mem_new(uint64_t bytes, struct kvmm_swap_io **ret);

/* Fault injection. Requests that match ops_mask are counted; after `after`
 * of them pass, the next ones fail (count of them, or all when count is 0):
 * error < 0 reports that errno (writes are not performed; reads are, and the
 * buffer is then scribbled over), error == KVMM_IO_FAULT_SHORT transfers
 * half the length (aligned down) and reports that. */
#define KVMM_IO_FAULT_SHORT 1
struct kvmm_io_fault {
	uint64_t after;
	uint32_t ops_mask; /* (1 << KVMM_IO_READ) | (1 << KVMM_IO_WRITE); 0: both */
	uint32_t count;
	int error;
};
/* Wrap inner (which the wrapper then owns, also on failure) in a layer that
 * injects faults when armed. Passes everything through until armed. */
int kvmm_swap_io_fault_new(struct kvmm_swap_io *inner, struct kvmm_swap_io **ret);
/* Arm (f non-NULL) or disarm (NULL) a fault layer. -EINVAL if io is not one. */
int kvmm_swap_io_fault_arm(struct kvmm_swap_io *io, const struct kvmm_io_fault *f);
/* Faults injected so far by a fault layer (0 for other stores). */
uint64_t kvmm_swap_io_fault_count(const struct kvmm_swap_io *io);
/* Destroy a store not handed to kvmm; accepts NULL; returns NULL. */
struct kvmm_swap_io *kvmm_swap_io_free(struct kvmm_swap_io *io);

/*
 * Swap from cfg->swap_path (kvmm_create): the file is created with
 * kvmm_swap_io_uring_open(path, swap_bytes, KVMM_SWAP_OPEN_UNLINK), so the
 * path must not exist (-EEXIST otherwise), the file is anonymous once open
 * and its space (and the KV data in it) goes away with the process, even
 * after a crash; swap_path only chooses the file system.
 * A host pool whose pages are multiples of the store's alignment is
 * registered with io_uring (pinned, hence resident from the start) when the
 * memlock limit allows; otherwise transfers are unregistered, and pages of
 * other sizes go through a few bounce buffers.
 *
 * kvmm_create() with an explicit swap store instead of cfg->swap_path (which
 * is then ignored); io may be NULL for kvmm_create()'s behaviour. On success
 * kvmm owns io and frees it in kvmm_destroy(); on failure the caller still
 * owns it. Slots are page_bytes rounded up to io->align.
 */
int kvmm_create_with_io(const struct kvmm_config *cfg, struct kvmm_swap_io *io, struct kvmm **ret);

/*
 * Swap I/O errors. Every failed transfer already costs only the operation
 * concerned (the sequence stays resident or swapped out intact, the cache
 * entry stays in memory or is dropped) and is counted in kvmm_ledger
 * .swap_errors; kvmm does not log. So that its owner can say so once per
 * incident, kvmm calls a handler once for every operation in which at least
 * one transfer failed, after its own state is consistent again and before the
 * operation returns its error. The handler runs on the owner thread and must
 * not call back into kvmm functions that change anything.
 */
enum {
	KVMM_SWAP_SEQ_OUT = 1, /* kvmm_seq_swap_out(): the sequence stays resident */
	KVMM_SWAP_SEQ_IN = 2,  /* kvmm_seq_swap_in(): it stays swapped out */
	KVMM_SWAP_DEMOTE = 3,  /* kvmm_cache_demote(): the pages stay cached */
	KVMM_SWAP_PROMOTE = 4, /* a prefix hit on demoted pages: the chain is cut there */
};
struct kvmm_swap_incident {
	uint32_t what;            /* KVMM_SWAP_* */
	uint32_t op;              /* KVMM_IO_READ or KVMM_IO_WRITE */
	int64_t seq;              /* the sequence (SEQ_OUT, SEQ_IN), else -1 */
	int error;                /* the first failure's -errno; a short transfer is -EIO */
	uint32_t pages;           /* page transfers in the operation */
	uint32_t pages_failed;    /* of those, failed (>= 1) */
	uint32_t short_transfers; /* of the failed ones, short (fewer bytes than asked) */
};
typedef void (*kvmm_swap_error_fn)(void *ud, const struct kvmm_swap_incident *incident);
/* Install (fn non-NULL) or remove the handler; one at a time. */
void kvmm_set_swap_error_handler(struct kvmm *m, kvmm_swap_error_fn fn, void *ud);

/* Swap slots in the store, and how many hold nothing. */
uint32_t kvmm_swap_slots(const struct kvmm *m);
uint32_t kvmm_swap_slots_free(const struct kvmm *m);

/* ---- hand-over across restarts (persist.c) ----------------------------------------- */

/*
 * A host pool lives in a memfd (kvmm_pool_fd) that can outlive its process
 * (in a service manager's file-descriptor store). Its cached prefixes can be
 * taken over by the next run: the old owner exports the prefix index into a
 * buffer (kvmm_prefix_export, then kvmm_persist_memfd for a sealed memfd);
 * the new one creates its pool over the same memfd (kvmm_create_adopt) and
 * imports the index (kvmm_prefix_import). The buffer also carries the
 * owner's own bytes (its fingerprint of model and layout), which kvmm only
 * stores; the owner compares them (kvmm_persist_parse) before adopting.
 * No page content is ever in the buffer.
 */
#define KVMM_PERSIST_VERSION   2u /* 2: entries carry their owner scope */
#define KVMM_PERSIST_OWNER_MAX 1024u /* bytes of owner data at most */

/*
 * Serialise the resident part of the prefix index: for each indexed page,
 * its parent, page number, tokens and recency; demoted entries and whatever
 * hangs below them are left out (their swap file dies with the process).
 * Pages mapped by live sequences are included (they are full and published,
 * so their content is final); refcounts are not. owner (owner_bytes <=
 * KVMM_PERSIST_OWNER_MAX) is copied in. *ret_buf is malloc()ed, the caller
 * frees it. -EINVAL, -ENOMEM, -EOPNOTSUPP for a device pool. With prefix
 * caching off the buffer holds no entries.
 */
int kvmm_prefix_export(const struct kvmm *m, const void *owner, size_t owner_bytes, void **ret_buf,
		       size_t *ret_bytes);

/* What an exported buffer says about itself. owner points into the buffer. */
struct kvmm_persist_info {
	uint32_t version;
	uint32_t block_size;
	uint64_t page_bytes;
	uint32_t n_pages;     /* of the pool it was exported from */
	uint32_t n_entries;
	const void *owner;    /* NULL when owner_bytes is 0 */
	uint32_t owner_bytes;
};
/*
 * Check a buffer's structure (magic, sizes, counts, checksum) without a
 * pool. Any byte string may be passed: returns 0, -EBADMSG for anything
 * malformed or corrupt, -EPROTO for another format version.
 */
int kvmm_persist_parse(const void *buf, size_t bytes, struct kvmm_persist_info *ret);

/*
 * Enter the buffer's pages into the prefix index of a fresh pool (no
 * sequence created, nothing allocated) as cached pages, most recently used
 * first as they were. Every entry is validated first (parents before
 * children, pages in range and each once, no two entries for the same
 * tokens under one parent); all or nothing. Only meaningful over the memfd
 * the buffer was exported from (kvmm_create_adopt): kvmm cannot check page
 * content. Returns 0 and the pages adopted; the errors of
 * kvmm_persist_parse; -ESTALE when block size, page size or page count
 * differ from this pool's; -EBUSY for a pool already in use; -EOPNOTSUPP
 * for a device pool, or prefix caching off with entries to import; -ENOMEM.
 * Counted in kvmm_ledger.pages_adopted.
 */
int kvmm_prefix_import(struct kvmm *m, const void *buf, size_t bytes, uint32_t *ret_pages);

/*
 * kvmm_create_with_io() over an existing pool memfd instead of a new one:
 * n_pages pages of cfg->page_bytes (cfg->pool_bytes and pool_fraction are
 * ignored). The fd must be a regular file sealed against shrinking
 * (F_SEAL_SHRINK, as kvmm seals its own pools, so nobody can truncate it
 * under the mapping) and hold n_pages pages (a hugetlb memfd may be larger
 * by less than one huge page). On success kvmm owns pool_fd (and io); on
 * failure the caller still owns both. Every page starts free: import the
 * index next. -EINVAL for a bad config or n_pages, -EOPNOTSUPP for a device
 * pool (page_ops.read set), -EPERM for an fd without the seal, -EBADFD for
 * one of the wrong size or kind, or the errors of kvmm_create_with_io.
 */
int kvmm_create_adopt(const struct kvmm_config *cfg, struct kvmm_swap_io *io, int pool_fd, uint32_t n_pages,
		      struct kvmm **ret);

/* A sealed memfd (no write, grow, shrink or new seal) holding bytes of buf.
 * 0 and the fd (close-on-exec), or -errno. */
int kvmm_persist_memfd(const void *buf, size_t bytes, int *ret_fd);
/* Read such a memfd into a malloc()ed buffer. The fd is trusted only as far
 * as its seals go: -EPERM unless it is a memfd sealed against writing,
 * growing and shrinking (its content can then not change while or after it
 * is read), -EFBIG when empty or larger than max_bytes, -EBADF for no
 * regular file, or read's error. */
int kvmm_persist_read_memfd(int fd, size_t max_bytes, void **ret_buf, size_t *ret_bytes);

/* Tests and fuzzing only: recompute the checksum of an exported buffer
 * after changing it, so that validation past the checksum is reached.
 * -EINVAL when bytes is too short for a header. */
int kvmm_debug_persist_checksum(void *buf, size_t bytes);

/* ---- hibernation to a file (hibernate.c) ------------------------------------------- */

/*
 * When the pool memfd cannot outlive the process (a stop, a reboot), the
 * cached prefixes can still survive in a file: kvmm_hib_save() writes the
 * hottest resident prefix pages (LRU order; pages mapped by sequences
 * first), each with the ancestors that make it reachable, their tokens,
 * owner scopes and a content checksum per page, plus the owner's bytes (its
 * fingerprint, which kvmm only stores). A later run opens the file
 * (kvmm_hib_open), compares the owner bytes itself, and adopts the pages a
 * batch at a time (kvmm_hib_adopt) between other work: a page enters the
 * prefix index only after its content matched its checksum, so no lookup
 * ever finds a page that is not there yet or is not what the index says.
 * Host pools only. Library code: nothing is logged; reasons are returned.
 */
#define KVMM_HIB_VERSION         1u
#define KVMM_HIB_ALIGN           4096u        /* header, index and page slots: O_DIRECT blocks */
#define KVMM_HIB_BATCH           32u          /* pages read per kvmm_hib_adopt() call at most */
#define KVMM_HIB_MAX_PAGE_BYTES  (1ull << 31) /* larger pages in a file are refused */
#define KVMM_HIB_MAX_INDEX_BYTES (1ull << 31) /* larger indexes are refused */

struct kvmm_hib_save_stats {
	uint32_t candidates;    /* resident prefix pages that could have been written */
	uint32_t pages_written; /* in the file */
	uint64_t bytes;         /* the file's size */
	uint64_t ns;            /* the whole save, create to rename */
	int timed_out;          /* the deadline stopped the page writes */
	int write_error;        /* a page write failed (-errno), the pages before it kept */
	int direct;             /* written with O_DIRECT */
	uint32_t pages_hashed;  /* of the pages chosen, those whose checksum was not known yet */
	int preallocated;       /* the file's blocks were allocated before the writes */
};

/*
 * Write the cache to path: created as path".tmp" (O_CREAT | O_EXCL |
 * O_NOFOLLOW, mode 0600; a leftover ".tmp" regular file of this user is
 * removed first), synced, then renamed over path. At most max_bytes in the
 * file; page writes stop at deadline_ns (kvmm_now_ns() clock, CLOCK_MONOTONIC;
 * 0: none) and the file then holds the pages written by then. The file's
 * blocks are allocated before the writes where the file system can. Reads
 * the pool only, and keeps beside each page the checksum it had to take
 * (call from the owner thread). Returns 0 and stats (may be NULL);
 * -EINVAL; -EOPNOTSUPP for a device pool; -ELOOP when path is a symbolic
 * link, -EISDIR when it is anything but a regular file (left untouched);
 * -ENOMEM; or the error of open, io_uring, write, fdatasync or rename (the
 * temporary file is then removed and path untouched).
 */
int kvmm_hib_save(const struct kvmm *m, const char *path, const void *owner, size_t owner_bytes,
		  uint64_t max_bytes, uint64_t deadline_ns, struct kvmm_hib_save_stats *ret);

struct kvmm_hib;

/*
 * Open a cache file and check everything but page contents: a regular file
 * (O_NOFOLLOW: a symbolic link is -ELOOP), of this process's effective uid
 * with no group or other permission bits (-EPERM), magic, header checksum,
 * version (-EPROTO), sizes, the index checksum, every entry's parent and
 * scope (-EBADMSG), and the file long enough for every page (-EBADMSG,
 * "truncated"). *ret_why (may be NULL) is set on failure to a static phrase
 * naming the reason. Returns 0 and the handle (close with kvmm_hib_close),
 * -ENOENT without a file, -ENOMEM, or open's error.
 */
int kvmm_hib_open(const char *path, struct kvmm_hib **ret, const char **ret_why);
/* The same over a file's bytes in memory (tests, fuzzing): buf must stay
 * valid while the handle is used. */
int kvmm_hib_open_mem(const void *buf, size_t bytes, struct kvmm_hib **ret, const char **ret_why);
/* Accepts NULL; returns NULL. */
struct kvmm_hib *kvmm_hib_close(struct kvmm_hib *h);
/* The owner's bytes as saved (NULL when none), valid while h is open. */
const void *kvmm_hib_owner(const struct kvmm_hib *h, uint32_t *ret_bytes);

struct kvmm_hib_info {
	uint32_t version, block_size;
	uint64_t page_bytes;
	uint32_t n_entries;
	uint32_t next_entry; /* entries considered by kvmm_hib_adopt so far */
	uint64_t file_bytes;
};
int kvmm_hib_info(const struct kvmm_hib *h, struct kvmm_hib_info *ret);

/* What kvmm_hib_adopt() did, added to the caller's totals. */
struct kvmm_hib_progress {
	uint32_t adopted; /* entered into the prefix index (kvmm_ledger.pages_adopted too) */
	uint32_t present; /* already in the index (computed again meanwhile) */
	uint32_t refused; /* content did not match the checksum: never entered */
	uint32_t skipped; /* parent refused or reclaimed, read failed, or no free page left */
};
/*
 * Adopt the next batch (up to max_pages, at most KVMM_HIB_BATCH; 0 means
 * that) of the file's entries into m, which may be serving already: pages
 * come from the free list only (the cache of this run is never reclaimed
 * for them; once the free list is empty the rest is skipped), are read and
 * checked, and enter the index cold (at the LRU tail) in the scope they
 * were saved in. Owner thread only. Returns 1 while entries remain, 0 when
 * all are done, -ESTALE when the file's block size or page size differ from
 * m's, -EOPNOTSUPP for a device pool or prefix caching off, -ENOMEM, or a
 * read error of the ring (the rest is then skipped).
 */
int kvmm_hib_adopt(struct kvmm *m, struct kvmm_hib *h, uint32_t max_pages, struct kvmm_hib_progress *ret);
/* Tests and fuzzing only: recompute the header's and the index's checksums
 * of a cache file in memory after changing it (page checksums stay), so
 * that the checks behind them are reached. -EINVAL when bytes is too short
 * for a header or the index lies outside buf. */
int kvmm_debug_hib_checksum(void *buf, size_t bytes);

/* ---- checking ------------------------------------------------------------------ */

/*
 * Verify every internal invariant (free list, refcounts against page tables,
 * LRU lists, index tree and hash chains, swap slots, counters). Returns 0, or
 * -EUCLEAN with a description of the first violation in why (may be NULL).
 * O(pages + slots + mapped pages): for tests and debugging.
 */
int kvmm_check(const struct kvmm *m, char *why, size_t why_size);
/* Tests only: keep just the low `bits` bits (1..64) of prefix keys, so that
 * hash collisions are common and the token comparison is exercised. Call
 * before anything is published. -EINVAL for bits outside 1..64. */
int kvmm_debug_set_hash_bits(struct kvmm *m, unsigned bits);

#endif /* KVD_KVMM_H */
