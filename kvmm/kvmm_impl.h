/*
 * kvmm/kvmm_impl.h — kvmm's private structures, shared by the files of the
 * kvmm folder only.
 *
 * Who keeps what:
 *  - pool.c: creation, the memfd pool, the metadata memfd with its counters
 *    and sequence lock, the free list, the ledger and the invariant checker;
 *  - seq.c: sequences, page tables, plan/commit with copy-on-write;
 *  - prefix.c: the prefix index (a tree of nodes in a hash table), the LRU
 *    lists of the two cache tiers, eviction, publish and attach;
 *  - swap.c: swap slots, sequence swap-out/in, demotion and promotion;
 *  - swap_io.c: the swap stores (io_uring file, memory, fault layer);
 *  - persist.c: export and import of the prefix index across restarts;
 *  - hibernate.c, hibernate_io.c: the prefix cache in a file (hibernation);
 *  - release.c: releasing the windowed layers' dead pages (kvmm_seq_release).
 *
 * Ids are int32: pages, nodes and slots are indices into arrays, -1 is none.
 * A page's refcount lives in its state word in the metadata memfd (so other
 * processes can see it); everything else about it lives here.
 *
 * Index invariant: a resident sequence that maps an indexed page at a
 * published logical position i > 0 also maps that node's parent at i - 1.
 * So an unreferenced node usually has only unreferenced descendants. Two
 * exceptions: a swapped-out sequence keeps its shared pages but released its
 * private ones, and a fork sibling may still map, at positions it has not
 * published yet, a page another sibling published under a deduplicated
 * parent. Dropping a subtree therefore frees unreferenced pages and merely
 * un-indexes referenced ones, which never changes what a sequence maps.
 * A third: a sequence with released pages (release.c) maps its first kept
 * page without the released one before it; once that one leaves the cache,
 * its kept pages leave the index with it, and a fork sibling that
 * deduplicated one of them may index the next under its twin.
 * (Lookups stay exact whatever the shape: tokens are compared on every hit.)
 *
 * Released pages: positions 0 .. n_released - 1 of a page table hold
 * KVMM_RELEASED, except that with pack_slots = k the position of every
 * k-th one (i % k == 0) holds the packed page of its group: a page like any
 * other for references, swap and forks (fill = block size, never indexed,
 * its tokens -1).
 */
#ifndef KVD_KVMM_IMPL_H
#define KVD_KVMM_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvmm.h"

/* ---- metadata memfd ------------------------------------------------------- */

#define KVMM_SHM_MAGIC   0x4b564d4du /* "KVMM" */
#define KVMM_SHM_VERSION 1u

/* Counter words of the metadata memfd. The first group is struct
 * kvmm_stats (current values and counters), the second struct kvmm_ledger. */
enum kvmm_word {
	W_PAGES_FREE,
	W_PAGES_USED,
	W_PAGES_SHARED,
	W_PAGES_CACHED,
	W_PAGES_DEMOTED,
	W_SLOTS_USED,
	W_SEQS_LIVE,
	W_SEQS_SWAPPED,
	W_TOKENS_RESIDENT,
	W_FILL_USED, /* token slots written in referenced pages */
	W_PREFIX_LOOKUPS,
	W_PREFIX_QUERY_TOKENS,
	W_PREFIX_HIT_TOKENS,
	W_SEQS_CREATED,
	W_SEQS_FINISHED,
	W_PROMPT_TOKENS,
	W_GENERATED_TOKENS,
	W_RETAINED_TOKENS,
	W_PAGES_ALLOCATED,
	W_COW_COPIES,
	W_EVICT_RECLAIM,
	W_EVICT_EXPLICIT,
	W_EVICT_ORPHAN,
	W_DEMOTED,
	W_PROMOTED,
	W_DEMOTED_DROPPED,
	W_DEDUP,
	W_SWAP_OUT_SEQS,
	W_SWAP_IN_SEQS,
	W_SWAP_OUT_PAGES,
	W_SWAP_IN_PAGES,
	W_SWAP_REMAPPED,
	W_SWAP_WRITE_BYTES,
	W_SWAP_READ_BYTES,
	W_SWAP_WRITE_NS,
	W_SWAP_READ_NS,
	W_SWAP_ERRORS,
	W_STEPS,
	W_KV_READ_TOTAL,
	W_KV_READ_LAST,
	W_MEM_WAIT_NS,
	W_COMPUTE_NS,
	W_PAGES_ADOPTED,
	W_PAGES_PACKED,   /* packed pages referenced now (kvmm_seq_release) */
	W_PAGES_RELEASED, /* logical pages released, cumulative */
	W_PAGES_ADOPTED_FILE,     /* of W_PAGES_ADOPTED: from a hibernation file */
	W_ADOPTED_HIT_PAGES,      /* prefix hits on adopted pages (either way), pages */
	W_ADOPTED_HIT_TOKENS,     /* and their tokens */
	W_ADOPTED_FILE_HIT_TOKENS, /* of those tokens: on pages from a hibernation file */
	W__COUNT
};

#define KVMM_SHM_WORDS 64 /* room for W__COUNT to grow without a version bump */
_Static_assert(W__COUNT <= KVMM_SHM_WORDS, "metadata words overflow");

/*
 * The head of the metadata memfd. Constant fields are written before the
 * memfd is sealed and never change; `seq` is the sequence lock (odd while the
 * owner updates) and `words` the counters; per-page state words follow at
 * page_words_offset.
 */
struct kvmm_shm {
	uint32_t magic;
	uint32_t version;
	uint32_t hdr_bytes;
	uint32_t n_words;
	uint32_t n_pages;
	uint32_t block_size;
	uint64_t page_bytes;
	uint64_t page_words_offset;
	uint64_t total_bytes;
	uint32_t swap_slots;
	uint32_t pad;
	_Atomic uint64_t seq;
	_Atomic uint64_t words[KVMM_SHM_WORDS];
};

/* ---- pages, nodes, sequences ----------------------------------------------- */

struct kvmm_page {
	int32_t next;  /* free list link */
	int32_t node;  /* prefix index node, or -1 */
	uint32_t fill; /* token slots holding K/V */
	uint32_t pending; /* plan scratch: writers in this step; 0 between calls */
	bool packed;      /* holds released pages' kept share (release.c) */
	/* The hibernation checksum of the page's content (hib_sum), valid only
	 * while sum_ok: set when the page enters the prefix index (its content
	 * is immutable from then on) or once a save has taken it, cleared when
	 * the page leaves the index, is allocated or freed. A save re-hashes
	 * only pages without one (page_set_indexed, kvmm_hib_save). */
	bool sum_ok;
	uint64_t sum;
};

#define NODE_LIVE 0x1u
#define NODE_BUSY 0x2u /* being demoted: on no list, not evictable */
/* Entered by adoption, not computed in this run: from the fd-store hand-over
 * (persist.c) or from a hibernation file (hibernate.c). Kept for the node's
 * life (a demotion and promotion keep the content), cleared when it is freed. */
#define NODE_ADOPTED_FDS  0x4u
#define NODE_ADOPTED_FILE 0x8u
#define NODE_ADOPTED (NODE_ADOPTED_FDS | NODE_ADOPTED_FILE)

struct kvmm_node {
	uint64_t key;
	uint64_t scope; /* the owner scope of the chain (kvmm_seq_set_scope) */
	int32_t parent, first_child, next_sib, prev_sib;
	int32_t hnext;
	int32_t page;  /* resident page, or -1 */
	int32_t slot;  /* demoted to this swap slot, or -1 */
	int32_t lru_prev, lru_next;
	uint32_t gen;  /* bumped each time the node is freed */
	uint32_t flags;
};

/* An LRU list threaded through nodes: head is the most recently used. */
struct kvmm_lru {
	int32_t head, tail;
	uint32_t n;
};

/* Where a swapped-out sequence's logical page went. */
struct kvmm_swp {
	int32_t slot; /* swap slot, or -1: the page stayed resident (shared) */
	int32_t node; /* its index node when it was swapped, or -1 */
	uint32_t gen; /* that node's generation then */
};

struct kvmm_seq {
	bool live, swapped, unkeyed;
	uint64_t scope;         /* prefix-index scope (kvmm_seq_set_scope) */
	uint32_t owner;         /* requester identity (kvmm_seq_set_owner) */
	uint32_t len;
	uint32_t n_pages, cap;
	int32_t *pages;
	struct kvmm_swp *swp; /* n_pages entries while swapped out */
	uint32_t n_published; /* logical pages already offered to the index */
	uint32_t prompt_tokens; /* UINT32_MAX: not told */
	uint32_t mark;          /* plan epoch */
	/* ledger */
	uint32_t shared_prefix_tokens;
	uint32_t adopted_pages, adopted_tokens; /* of shared_prefix_tokens: on adopted pages */
	uint32_t pages_peak, pages_allocated, cow_copies;
	uint32_t swap_outs, swap_ins, swap_out_pages, swap_in_pages, swap_in_remapped, swap_errors;
	uint64_t swap_bytes, swap_ns, steps, kv_read_bytes, mem_wait_ns, compute_ns;
	uint64_t kv_read_bytes_max;       /* the most one step read */
	uint64_t created_ns;
	uint32_t dropped_tokens, drops; /* kvmm_seq_drop_pages */
	uint32_t evicted_prefix_tokens; /* prefix tokens missed on dropped pages (prefix.c) */
	uint32_t evicted_prefix_by;     /* owner whose allocation dropped the first of them */
	uint32_t n_released, n_packed;  /* kvmm_seq_release: leading pages released, packed pages held */
};

struct kvmm {
	uint32_t bs;
	uint32_t n_pages;
	size_t page_bytes;
	struct kvmm_page_ops page_ops;
	bool device_pool;
	bool sum_defer; /* page_set_indexed leaves the checksum to the next save */
	bool prefix;
	uint32_t pack_slots; /* kvmm_config.pack_slots */

	int pool_fd;
	void *pool;
	size_t pool_map_bytes;
	bool hugetlb;

	int meta_fd;
	struct kvmm_shm *shm;
	size_t shm_bytes;
	_Atomic uint32_t *pw; /* page state words */
	uint64_t shm_seq;
	int shm_depth;

	struct kvmm_page *pg;
	int32_t *page_tokens; /* n_pages * bs */
	int32_t free_head;
	uint64_t rng; /* shuffle state, 0: no shuffle */

	struct kvmm_seq *seqs;
	uint32_t max_seqs;
	uint32_t *free_ids;
	uint32_t n_free_ids;
	uint32_t plan_epoch;  /* marks of the sequences a kvmm_plan/commit scan has seen */

	/* prefix index */
	struct kvmm_node *nodes;
	uint32_t n_nodes;
	int32_t node_free;
	int32_t *buckets;
	uint32_t bucket_mask;
	uint64_t key_mask;
	struct kvmm_lru res_lru; /* resident, unreferenced */
	struct kvmm_lru swp_lru; /* demoted */
	struct kvmm_evicted *evicted; /* keys of dropped pages, in sets (prefix.c) */
	uint32_t evictor;        /* owner the page being allocated is for, else KVMM_OWNER_NONE */
	uint32_t evicted_mask;   /* sets - 1 */

	/* swap */
	struct kvmm_swap_io *io;
	uint32_t n_slots;
	size_t slot_bytes;
	int32_t *slot_free;
	uint32_t n_slot_free;
	int32_t *slot_tokens; /* n_slots * bs */
	bool io_from_pool;    /* transfers straight from/to pool pages */
	int32_t pool_buf_index; /* first registered pool chunk, or -1 */
	size_t pool_chunk_bytes;
	void *bounce;
	uint32_t n_bounce;
	int32_t bounce_buf_index; /* or -1 */
	struct kvmm_io_req *reqs; /* KVMM_SWAP_QUEUE_DEPTH * 4 scratch */
	uint32_t reqs_cap;
	kvmm_swap_error_fn on_swap_error; /* or NULL */
	void *on_swap_error_ud;
};

/* ---- pool.c ------------------------------------------------------------------ */

uint64_t kvmm_now_ns(void);

static inline uint64_t ctr_get(const struct kvmm *m, enum kvmm_word w)
{
	return atomic_load_explicit(&m->shm->words[w], memory_order_relaxed);
}
/* Single writer: a relaxed load and store, no read-modify-write needed; the
 * sequence lock around the public call orders them for readers. */
static inline void ctr_set(struct kvmm *m, enum kvmm_word w, uint64_t v)
{
	atomic_store_explicit(&m->shm->words[w], v, memory_order_relaxed);
}
static inline void ctr_add(struct kvmm *m, enum kvmm_word w, uint64_t d)
{
	ctr_set(m, w, ctr_get(m, w) + d);
}
static inline void ctr_sub(struct kvmm *m, enum kvmm_word w, uint64_t d)
{
	ctr_set(m, w, ctr_get(m, w) - d);
}

static inline uint32_t page_word(const struct kvmm *m, int32_t p)
{
	return atomic_load_explicit(&m->pw[p], memory_order_relaxed);
}
static inline void page_word_set(struct kvmm *m, int32_t p, uint32_t w)
{
	atomic_store_explicit(&m->pw[p], w, memory_order_relaxed);
}
static inline uint32_t page_ref(const struct kvmm *m, int32_t p)
{
	return page_word(m, p) & KVMM_PAGE_REF_MASK;
}

/* Sequence lock around every public call that changes state (nests). */
void kvmm_shm_begin(struct kvmm *m);
void kvmm_shm_end(struct kvmm *m);

static inline uint64_t tok_bytes(const struct kvmm *m, uint64_t n_tokens)
{
	return n_tokens * m->page_bytes / m->bs;
}

static inline struct kvmm_seq *seq_get(const struct kvmm *m, uint32_t id)
{
	if (id >= m->max_seqs || !m->seqs[id].live)
		return NULL;
	return &m->seqs[id];
}

static inline void *page_ptr(const struct kvmm *m, int32_t p)
{
	return (char *)m->pool + (size_t)p * m->page_bytes;
}

/* Pages obtainable now: free plus cached (resident, unreferenced). */
static inline uint32_t avail_pages(const struct kvmm *m)
{
	return (uint32_t)(ctr_get(m, W_PAGES_FREE) + m->res_lru.n);
}

/* Take a page (free list first, else reclaim the best cached victim). The
 * page has refcount 0 and is on no list; -1 when none is left. A prefix
 * page reclaimed for it is remembered as evicted by m->evictor. */
int32_t page_alloc(struct kvmm *m);
/* page_alloc for a page of sequence s: its owner is the evictor of any
 * prefix page reclaimed to make room. */
static inline int32_t page_alloc_for(struct kvmm *m, const struct kvmm_seq *s)
{
	int32_t p;

	m->evictor = s->owner;
	p = page_alloc(m);
	m->evictor = KVMM_OWNER_NONE;
	return p;
}
/* Return an unreferenced, unindexed page to the free list. */
void page_free(struct kvmm *m, int32_t p);
/* Add a reference; takes a cached page off its LRU list. */
void page_get(struct kvmm *m, int32_t p);
/* Drop a reference; at zero an indexed page becomes cached (LRU head), any
 * other page goes back to the free list. */
void page_put(struct kvmm *m, int32_t p);
/* Set how many token slots of a page hold K/V. */
void page_set_fill(struct kvmm *m, int32_t p, uint32_t fill);
void page_set_indexed(struct kvmm *m, int32_t p, int32_t node);
/* Mark a referenced, unindexed page as a packed page (release.c): full,
 * no tokens, counted in W_PAGES_PACKED until freed. */
void page_set_packed(struct kvmm *m, int32_t p);

/* ---- prefix.c ----------------------------------------------------------------- */

/* Bounds of the eviction memory, in remembered page keys (8 bytes each),
 * and the keys per set (prefix.c). */
/* One remembered key and the owner whose allocation dropped its page
 * (KVMM_OWNER_NONE: an explicit drop, or an allocation for no sequence).
 * 16 bytes; the bounds keep the table at 8 KiB to 512 KiB. */
struct kvmm_evicted {
	uint64_t key;
	uint32_t by;
	uint32_t unused;
};
#define KVMM_EVICTED_MIN 512u
#define KVMM_EVICTED_MAX (1u << 15)
#define KVMM_EVICTED_WAYS 4u
int kvmm_index_init(struct kvmm *m);
void kvmm_index_free(struct kvmm *m);
/* A node's key: a root's starts from its scope, a child's from its parent's
 * key (and a child's scope is always its parent's). */
uint64_t node_key(const struct kvmm *m, int32_t parent, uint64_t scope, const int32_t *tokens);
/* The node for (scope, parent, tokens) or -1; scope and tokens compared, so
 * neither a hash collision nor another scope's chain is ever returned. */
int32_t index_lookup(const struct kvmm *m, int32_t parent, uint64_t scope, const int32_t *tokens);
/* New node for page (or slot when page is -1) under parent (a root of
 * `scope` when parent is -1, else scope must be the parent's); tokens are
 * the page's (or slot's). Returns the node (never fails: capacity is pages
 * + slots). */
int32_t index_insert(struct kvmm *m, int32_t parent, uint64_t scope, int32_t page, int32_t slot);
const int32_t *node_tokens(const struct kvmm *m, int32_t n);
/* Drop node n and its whole subtree: unreferenced resident pages go to the
 * free list, demoted entries free their slots, referenced pages are only
 * un-indexed. cause is the ledger word for n itself when resident;
 * descendants count as orphans, demoted entries as demoted_dropped. Returns
 * the number of pages freed. */
uint32_t index_drop_subtree(struct kvmm *m, int32_t n, enum kvmm_word cause);
/* Reclaim one cached page to the free list (best victim). false if none. */
bool index_reclaim_one(struct kvmm *m, enum kvmm_word cause);
void lru_push(struct kvmm *m, struct kvmm_lru *l, int32_t n);
void lru_push_cold(struct kvmm *m, struct kvmm_lru *l, int32_t n);
void lru_remove(struct kvmm *m, struct kvmm_lru *l, int32_t n);
/* The best victim on a list: the coldest, descending to a child in the same
 * tier while it has one (tails before heads). */
int32_t lru_victim(const struct kvmm *m, const struct kvmm_lru *l);
/* Offer a resident page of a sequence at logical position i to the index:
 * returns the page the sequence should map there (itself, or an identical
 * indexed page it was deduplicated against; the caller swaps references). */
int32_t index_publish_page(struct kvmm *m, struct kvmm_seq *s, uint32_t i, int32_t p);

/* ---- swap.c --------------------------------------------------------------------- */

int kvmm_swap_init(struct kvmm *m, struct kvmm_swap_io *io);
void kvmm_swap_free(struct kvmm *m);
int32_t slot_alloc(struct kvmm *m);
void slot_free(struct kvmm *m, int32_t slot);
/* Read a demoted node back into memory. 0, -ENOMEM (no page) or I/O error
 * (the node is then dropped). */
int swap_promote_nodes(struct kvmm *m, const int32_t *nodes, uint32_t n, uint32_t *ret_ok);

/* ---- seq.c ------------------------------------------------------------------------ */

int seq_reserve(struct kvmm_seq *s, uint32_t n_pages);
/* Copy-on-write of the first n_tokens slots of src into dst (and their tokens). */
int cow_copy(struct kvmm *m, int32_t dst, int32_t src, uint32_t n_tokens);

/* ---- hibernate.c, hibernate_io.c ----------------------------------------------------- */

#define HIB_QUEUE_DEPTH KVMM_SWAP_QUEUE_DEPTH

struct io_uring;
struct iovec;
/* The hibernation file's 64-bit checksum of n bytes (hibernate.c). */
uint64_t hib_sum(const void *buf, size_t n);
/* Write the n requests through ring, up to HIB_QUEUE_DEPTH in flight; no new
 * submission once deadline_ns passes (0: none); for each request todo[k]
 * (ascending; the pages without a known checksum) sums[todo[k]] gets the
 * checksum of its first sum_bytes, taken by helper threads meanwhile; the
 * other sums[] are the caller's. Returns how many of the first requests
 * completed in full, one after another (their sums are set); *ret_err the
 * first error, or 0. Every request in flight is reaped before it returns.
 * (hibernate_io.c) */
uint32_t hib_write_pages(struct io_uring *ring, int fd, const struct iovec *iov, const uint64_t *off, uint32_t n,
			 uint64_t deadline_ns, size_t sum_bytes, uint64_t *sums, const uint32_t *todo, uint32_t n_todo,
			 int *ret_err);

/* ---- release.c ---------------------------------------------------------------------- */

/* Pages s maps: its page table less the released positions, packed
 * pages included (for a swapped-out sequence, what swap-in maps again). */
static inline uint32_t seq_held(const struct kvmm_seq *s)
{
	return s->n_pages - s->n_released + s->n_packed;
}

/* Whether position i of s's page table holds a packed page. */
static inline bool seq_packed_at(const struct kvmm *m, const struct kvmm_seq *s, uint32_t i)
{
	return i < s->n_released && m->pack_slots != KVMM_PACK_NONE && i % m->pack_slots == 0;
}

#endif /* KVD_KVMM_IMPL_H */
