/*
 * kvmm/prefix.c — the prefix index: every full page a sequence publishes
 * becomes a node keyed by hash(parent node's key, the page's tokens), so the
 * nodes form a tree (a trie of pages) kept in a chained hash table. A lookup
 * matches the key, the parent node and every token, so a hash collision can
 * never map a wrong page; since the parent is itself matched exactly, a hit
 * is exact by induction from the root.
 *
 * A node is in one of two tiers: resident (it owns a page) or demoted (its
 * content sits in a swap slot). Resident nodes whose page no sequence maps
 * are "cached" and sit on the resident LRU list; demoted nodes sit on the
 * swap LRU list. Reclaim takes the coldest node of a list but descends to a
 * cached child first while there is one, so tails of a prefix go before its
 * head; dropping a node drops its subtree, which no lookup could reach.
 *
 * The index also remembers, in a small set-associative table, the keys of the
 * last pages it dropped (evicted, demoted then dropped, or orphaned with an
 * ancestor). A lookup that misses on a remembered key is a prefix the pool
 * held and gave up: the tokens of that page are recomputed although an
 * identical prefix had been cached, and the sequence's ledger counts them
 * (kvmm_seq_record.evicted_prefix_tokens). Keys carry the owner's scope, so
 * one owner's eviction never counts against another's miss. With each key
 * the table keeps who evicted it: the owner (kvmm_seq_set_owner) of the
 * sequence whose allocation reclaimed the page, the root of the dropped
 * subtree and its orphans alike; KVMM_OWNER_NONE for an explicit drop
 * (kvmm_cache_evict, kvmm_cache_drop_all, a sequence's drop of pages) or an
 * allocation for no sequence. A lookup reports the evictor of the first
 * remembered page it recomputes (kvmm_seq_record.evicted_prefix_by).
 *
 * Also here: kvmm_seq_publish, kvmm_prefix_attach, kvmm_cache_evict and
 * kvmm_cache_drop_all.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmm_impl.h"

#define ROOT_KEY 0x6b76642d6b766d6dull /* "kvd-kvmm" */

int kvmm_index_init(struct kvmm *m)
{
	uint32_t nb = 16;

	m->res_lru = m->swp_lru = (struct kvmm_lru){-1, -1, 0};
	m->evictor = KVMM_OWNER_NONE;
	if (!m->prefix)
		return 0;
	m->n_nodes = m->n_pages + m->n_slots;
	while (nb < m->n_nodes && nb < (1u << 30))
		nb <<= 1;
	m->nodes = malloc((size_t)m->n_nodes * sizeof(*m->nodes));
	m->buckets = malloc((size_t)nb * sizeof(*m->buckets));
	if (!m->nodes || !m->buckets)
		return -ENOMEM;
	m->bucket_mask = nb - 1;
	for (uint32_t i = 0; i < nb; i++)
		m->buckets[i] = -1;
	m->node_free = -1;
	for (uint32_t i = m->n_nodes; i-- > 0;) {
		m->nodes[i] = (struct kvmm_node){.hnext = m->node_free};
		m->node_free = (int32_t)i;
	}
	/* Eviction memory: two entries (key and evictor, 16 bytes) per node,
	 * in sets of KVMM_EVICTED_WAYS, a power of two of them, bounded. */
	nb = KVMM_EVICTED_MIN;
	while (nb < 2 * (uint64_t)m->n_nodes && nb < KVMM_EVICTED_MAX)
		nb <<= 1;
	m->evicted = calloc(nb, sizeof(*m->evicted));
	if (!m->evicted)
		return -ENOMEM;
	m->evicted_mask = nb / KVMM_EVICTED_WAYS - 1;
	return 0;
}

void kvmm_index_free(struct kvmm *m)
{
	free(m->nodes);
	free(m->buckets);
	free(m->evicted);
	m->nodes = NULL;
	m->buckets = NULL;
	m->evicted = NULL;
}

/* ---- eviction memory ------------------------------------------------------------- */

/* The table is set-associative: a key lives in one of the KVMM_EVICTED_WAYS
 * slots of the set its low bits name. Remembering a key already there does
 * nothing; otherwise it takes an empty slot of its set, or replaces one
 * chosen by its high bits, so the table never grows and forgets old
 * evictions first, roughly. Key 0 marks an empty slot, so a page whose key
 * is 0 is not remembered (one key in 2^64). A lookup answers "seen" only
 * for an equal key: the count is exact up to key collisions, and an
 * eviction pushed out of its set goes uncounted. A key remembered again
 * takes the newer evictor: the page was computed again and dropped again. */
static void evicted_remember(struct kvmm *m, uint64_t key, uint32_t by)
{
	struct kvmm_evicted *set;

	if (!m->evicted || !key)
		return;
	set = &m->evicted[(key & m->evicted_mask) * KVMM_EVICTED_WAYS];
	for (uint32_t w = 0; w < KVMM_EVICTED_WAYS; w++)
		if (set[w].key == key) {
			set[w].by = by;
			return;
		}
	for (uint32_t w = 0; w < KVMM_EVICTED_WAYS; w++)
		if (!set[w].key) {
			set[w] = (struct kvmm_evicted){.key = key, .by = by};
			return;
		}
	set[(key >> 61) % KVMM_EVICTED_WAYS] = (struct kvmm_evicted){.key = key, .by = by};
}

/* The remembered entry of key, or NULL. */
static const struct kvmm_evicted *evicted_seen(const struct kvmm *m, uint64_t key)
{
	const struct kvmm_evicted *set;

	if (!m->evicted || !key)
		return NULL;
	set = &m->evicted[(key & m->evicted_mask) * KVMM_EVICTED_WAYS];
	for (uint32_t w = 0; w < KVMM_EVICTED_WAYS; w++)
		if (set[w].key == key)
			return &set[w];
	return NULL;
}

int kvmm_debug_set_hash_bits(struct kvmm *m, unsigned bits)
{
	if (bits < 1 || bits > 64)
		return -EINVAL;
	m->key_mask = bits == 64 ? UINT64_MAX : (1ull << bits) - 1;
	return 0;
}

/* ---- keys and lookups ------------------------------------------------------------ */

/* A scope's root key: the murmur3 finalizer of the scope mixed into the
 * root constant, so the chains of two scopes never share a key by design
 * (index_lookup still compares the scope). */
static uint64_t root_key(uint64_t scope)
{
	uint64_t h = ROOT_KEY ^ scope;

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return scope ? h : ROOT_KEY;
}

/* The key of a page of tokens under a parent whose key is h. */
static uint64_t key_after(const struct kvmm *m, uint64_t h, const int32_t *tokens)
{
	uint32_t i = 0;

	/* Two tokens per multiply; the murmur3 finalizer spreads the bits. */
	for (; i + 1 < m->bs; i += 2) {
		uint64_t v = (uint64_t)(uint32_t)tokens[i] | (uint64_t)(uint32_t)tokens[i + 1] << 32;

		h = (h ^ v) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	if (i < m->bs)
		h = ((h ^ (uint32_t)tokens[i]) * 0x9e3779b97f4a7c15ull) ^ m->bs;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h & m->key_mask;
}

uint64_t node_key(const struct kvmm *m, int32_t parent, uint64_t scope, const int32_t *tokens)
{
	return key_after(m, parent >= 0 ? m->nodes[parent].key : root_key(scope), tokens);
}

const int32_t *node_tokens(const struct kvmm *m, int32_t n)
{
	const struct kvmm_node *nd = &m->nodes[n];

	return nd->page >= 0 ? &m->page_tokens[(size_t)nd->page * m->bs] : &m->slot_tokens[(size_t)nd->slot * m->bs];
}

int32_t index_lookup(const struct kvmm *m, int32_t parent, uint64_t scope, const int32_t *tokens)
{
	uint64_t key = node_key(m, parent, scope, tokens);

	for (int32_t c = m->buckets[key & m->bucket_mask]; c >= 0; c = m->nodes[c].hnext) {
		const struct kvmm_node *nd = &m->nodes[c];

		if (nd->key == key && nd->parent == parent && nd->scope == scope &&
		    memcmp(node_tokens(m, c), tokens, m->bs * sizeof(int32_t)) == 0)
			return c;
	}
	return -1;
}

/* ---- LRU lists ------------------------------------------------------------------------ */

static void lru_count(struct kvmm *m, const struct kvmm_lru *l)
{
	if (l == &m->res_lru)
		ctr_set(m, W_PAGES_CACHED, l->n);
	else
		ctr_set(m, W_PAGES_DEMOTED, l->n);
}

void lru_push(struct kvmm *m, struct kvmm_lru *l, int32_t n)
{
	struct kvmm_node *nd = &m->nodes[n];

	nd->lru_prev = -1;
	nd->lru_next = l->head;
	if (l->head >= 0)
		m->nodes[l->head].lru_prev = n;
	else
		l->tail = n;
	l->head = n;
	l->n++;
	lru_count(m, l);
}

void lru_push_cold(struct kvmm *m, struct kvmm_lru *l, int32_t n)
{
	struct kvmm_node *nd = &m->nodes[n];

	nd->lru_next = -1;
	nd->lru_prev = l->tail;
	if (l->tail >= 0)
		m->nodes[l->tail].lru_next = n;
	else
		l->head = n;
	l->tail = n;
	l->n++;
	lru_count(m, l);
}

void lru_remove(struct kvmm *m, struct kvmm_lru *l, int32_t n)
{
	struct kvmm_node *nd = &m->nodes[n];

	if (nd->lru_prev >= 0)
		m->nodes[nd->lru_prev].lru_next = nd->lru_next;
	else
		l->head = nd->lru_next;
	if (nd->lru_next >= 0)
		m->nodes[nd->lru_next].lru_prev = nd->lru_prev;
	else
		l->tail = nd->lru_prev;
	nd->lru_prev = nd->lru_next = -1;
	l->n--;
	lru_count(m, l);
}

static bool in_tier(const struct kvmm *m, const struct kvmm_lru *l, int32_t c)
{
	const struct kvmm_node *nd = &m->nodes[c];

	if (nd->flags & NODE_BUSY)
		return false;
	if (l == &m->res_lru)
		return nd->page >= 0 && page_ref(m, nd->page) == 0;
	return nd->page < 0;
}

int32_t lru_victim(const struct kvmm *m, const struct kvmm_lru *l)
{
	int32_t v = l->tail;

	if (v < 0)
		return -1;
	for (;;) {
		int32_t c = m->nodes[v].first_child;

		while (c >= 0 && !in_tier(m, l, c))
			c = m->nodes[c].next_sib;
		if (c < 0)
			return v;
		v = c;
	}
}

/* ---- insertion and removal ------------------------------------------------------------- */

int32_t index_insert(struct kvmm *m, int32_t parent, uint64_t scope, int32_t page, int32_t slot)
{
	int32_t n = m->node_free;
	struct kvmm_node *nd;
	uint64_t key;

	/* Capacity is pages + slots and every node holds one of them. */
	assert(parent < 0 || m->nodes[parent].scope == scope);
	m->node_free = m->nodes[n].hnext;
	nd = &m->nodes[n];
	*nd = (struct kvmm_node){
		.scope = scope,
		.parent = parent, .first_child = -1, .next_sib = -1, .prev_sib = -1,
		.page = page, .slot = slot, .lru_prev = -1, .lru_next = -1,
		.gen = nd->gen, .flags = NODE_LIVE,
	};
	key = node_key(m, parent, scope, node_tokens(m, n));
	nd->key = key;
	nd->hnext = m->buckets[key & m->bucket_mask];
	m->buckets[key & m->bucket_mask] = n;
	if (parent >= 0) {
		struct kvmm_node *pa = &m->nodes[parent];

		nd->next_sib = pa->first_child;
		if (pa->first_child >= 0)
			m->nodes[pa->first_child].prev_sib = n;
		pa->first_child = n;
	}
	if (page >= 0) {
		page_set_indexed(m, page, n);
		if (page_ref(m, page) == 0)
			lru_push(m, &m->res_lru, n);
	} else {
		lru_push(m, &m->swp_lru, n);
	}
	return n;
}

static void node_release(struct kvmm *m, int32_t n)
{
	struct kvmm_node *nd = &m->nodes[n];
	int32_t *link = &m->buckets[nd->key & m->bucket_mask];

	while (*link != n)
		link = &m->nodes[*link].hnext;
	*link = nd->hnext;
	if (nd->prev_sib >= 0)
		m->nodes[nd->prev_sib].next_sib = nd->next_sib;
	else if (nd->parent >= 0)
		m->nodes[nd->parent].first_child = nd->next_sib;
	if (nd->next_sib >= 0)
		m->nodes[nd->next_sib].prev_sib = nd->prev_sib;
	nd->flags = 0;
	nd->gen++;
	nd->page = nd->slot = -1;
	nd->hnext = m->node_free;
	m->node_free = n;
}

/* Drop one node without children, remembering its key as evicted by `by`.
 * Returns 1 when a page was freed. */
static uint32_t drop_leaf(struct kvmm *m, int32_t n, enum kvmm_word cause, uint32_t by)
{
	struct kvmm_node *nd = &m->nodes[n];
	uint32_t freed = 0;

	if (nd->page >= 0) {
		int32_t p = nd->page;

		page_set_indexed(m, p, -1);
		if (page_ref(m, p) == 0) {
			lru_remove(m, &m->res_lru, n);
			page_free(m, p);
			ctr_add(m, cause, 1);
			evicted_remember(m, nd->key, by);
			freed = 1;
		}
	} else {
		lru_remove(m, &m->swp_lru, n);
		slot_free(m, nd->slot);
		ctr_add(m, W_DEMOTED_DROPPED, 1);
		evicted_remember(m, nd->key, by);
	}
	node_release(m, n);
	return freed;
}

uint32_t index_drop_subtree(struct kvmm *m, int32_t root, enum kvmm_word cause)
{
	/* Only a reclaim for an allocation has a requester to blame. */
	uint32_t freed = 0, by = cause == W_EVICT_RECLAIM ? m->evictor : KVMM_OWNER_NONE;
	int32_t v = root;

	/* Post-order without recursion: prefixes can be thousands of pages deep. */
	for (;;) {
		int32_t parent;
		bool last;

		while (m->nodes[v].first_child >= 0)
			v = m->nodes[v].first_child;
		parent = m->nodes[v].parent;
		last = v == root;
		freed += drop_leaf(m, v, last ? cause : W_EVICT_ORPHAN, by);
		if (last)
			return freed;
		v = parent;
	}
}

bool index_reclaim_one(struct kvmm *m, enum kvmm_word cause)
{
	int32_t v;

	if (!m->prefix)
		return false;
	v = lru_victim(m, &m->res_lru);
	if (v < 0)
		return false;
	index_drop_subtree(m, v, cause);
	return true;
}

int32_t index_publish_page(struct kvmm *m, struct kvmm_seq *s, uint32_t i, int32_t p)
{
	int32_t parent = -1, x;

	if (m->pg[p].node >= 0)
		return p; /* mapped from the index, or shared with a fork that published it */
	if (i > 0) {
		if (i - 1 < s->n_released)
			return p; /* the page above was released: no key to hang this on */
		parent = m->pg[s->pages[i - 1]].node;
		if (parent < 0)
			return p; /* the chain above is not indexed: no key to hang this on */
	}
	x = index_lookup(m, parent, s->scope, &m->page_tokens[(size_t)p * m->bs]);
	if (x < 0) {
		index_insert(m, parent, s->scope, p, -1);
		return p;
	}
	ctr_add(m, W_DEDUP, 1);
	if (m->nodes[x].page >= 0)
		return m->nodes[x].page;
	/* A demoted twin: our page becomes its resident copy, no read needed. */
	lru_remove(m, &m->swp_lru, x);
	slot_free(m, m->nodes[x].slot);
	m->nodes[x].slot = -1;
	m->nodes[x].page = p;
	page_set_indexed(m, p, x);
	return p;
}

/* ---- public calls ---------------------------------------------------------------------- */

int kvmm_seq_publish(struct kvmm *m, uint32_t seq)
{
	struct kvmm_seq *s = seq_get(m, seq);
	uint32_t full;

	if (!s || s->swapped)
		return -ENOENT;
	full = s->len / m->bs;
	if (!m->prefix || s->unkeyed) {
		s->n_published = full;
		return 0;
	}
	kvmm_shm_begin(m);
	for (uint32_t i = s->n_published; i < full; i++) {
		int32_t p = s->pages[i], q = index_publish_page(m, s, i, p);

		if (q != p) {
			page_get(m, q);
			s->pages[i] = q;
			page_put(m, p);
		}
	}
	s->n_published = full;
	kvmm_shm_end(m);
	return 0;
}

/* After a walk that matched k pages of at most limit: the tokens of the
 * pages from k on whose keys the index dropped, up to the first it did not
 * (or the last the prompt could have taken, n - 1 tokens). s->pages[0..k)
 * hold the matched node ids. *ret_by gets the evictor of the first of
 * them (KVMM_OWNER_NONE when there is none). */
static uint32_t evicted_run(const struct kvmm *m, const struct kvmm_seq *s, const int32_t *tokens, uint32_t n,
			    uint32_t k, uint32_t limit, uint32_t *ret_by)
{
	uint64_t h = k > 0 ? m->nodes[s->pages[k - 1]].key : root_key(s->scope);
	uint32_t j = k, from = k * m->bs, to;

	*ret_by = KVMM_OWNER_NONE;
	for (; j < limit; j++) {
		const struct kvmm_evicted *e;

		h = key_after(m, h, tokens + (size_t)j * m->bs);
		e = evicted_seen(m, h);
		if (!e)
			break;
		if (j == k)
			*ret_by = e->by;
	}
	to = j * m->bs < n - 1 ? j * m->bs : n - 1;
	if (to <= from) {
		*ret_by = KVMM_OWNER_NONE;
		return 0;
	}
	return to - from;
}

int kvmm_prefix_attach(struct kvmm *m, uint32_t seq, const int32_t *tokens, uint32_t n, uint32_t *ret_hit_tokens)
{
	struct kvmm_seq *s = seq_get(m, seq);
	uint32_t k = 0, hit = 0, n_map = 0, limit;
	int32_t parent = -1;
	int r;

	if (!s)
		return -ENOENT;
	if (s->len || s->n_pages || s->swapped)
		return -EBUSY;
	if (n > 0 && !tokens)
		return -EINVAL;
	kvmm_shm_begin(m);
	ctr_add(m, W_PREFIX_LOOKUPS, 1);
	ctr_add(m, W_PREFIX_QUERY_TOKENS, n);
	if (!m->prefix || n < 2)
		goto done;
	/* Only whole blocks of the prompt can match, and n - 1 tokens at most
	 * are taken, so ceil((n - 1) / bs) pages at most are mapped. */
	limit = n / m->bs;
	if (limit > (n - 1 + m->bs - 1) / m->bs)
		limit = (n - 1 + m->bs - 1) / m->bs;
	r = seq_reserve(s, limit);
	if (r < 0) {
		kvmm_shm_end(m);
		return r;
	}
	/* Walk the tree; node ids wait in the page table for now. */
	for (; k < limit; k++) {
		int32_t x = index_lookup(m, parent, s->scope, tokens + (size_t)k * m->bs);

		if (x < 0)
			break;
		s->pages[k] = x;
		parent = x;
	}
	s->evicted_prefix_tokens = evicted_run(m, s, tokens, n, k, limit, &s->evicted_prefix_by);
	/* Pin the resident ones first so reading the demoted ones cannot
	 * reclaim them, then promote the demoted ones (one batch of reads). */
	{
		uint32_t n_dem = 0, ok = 0, cut = k;
		int32_t failed = -1;

		for (uint32_t j = 0; j < k; j++) {
			struct kvmm_node *nd = &m->nodes[s->pages[j]];

			if (nd->page >= 0)
				page_get(m, nd->page);
			else
				n_dem++;
		}
		if (n_dem > 0) {
			int32_t *dem = malloc(n_dem * sizeof(*dem));
			uint32_t d = 0;

			if (dem) {
				for (uint32_t j = 0; j < k; j++)
					if (m->nodes[s->pages[j]].page < 0)
						dem[d++] = s->pages[j];
				m->evictor = s->owner; /* promotions allocate for s */
				r = swap_promote_nodes(m, dem, n_dem, &ok);
				m->evictor = KVMM_OWNER_NONE;
				if (ok < n_dem) {
					/* The chain stops at the first demoted node that
					 * did not come back; a failed read drops it. */
					for (uint32_t j = 0; j < k; j++)
						if (s->pages[j] == dem[ok]) {
							cut = j;
							break;
						}
					if (r != -ENOMEM)
						failed = dem[ok];
				}
				free(dem);
			} else {
				for (uint32_t j = 0; j < k; j++)
					if (m->nodes[s->pages[j]].page < 0) {
						cut = j;
						break;
					}
			}
		}
		/* Before the cut: take the promoted pages (cached until now).
		 * From the cut on: nothing was promoted, unpin the resident ones,
		 * tails first so heads stay warmer. */
		for (uint32_t j = 0; j < cut; j++) {
			int32_t p = m->nodes[s->pages[j]].page;

			if (page_ref(m, p) == 0)
				page_get(m, p);
		}
		for (uint32_t j = k; j-- > cut;) {
			int32_t p = m->nodes[s->pages[j]].page;

			if (p >= 0)
				page_put(m, p);
		}
		if (failed >= 0)
			index_drop_subtree(m, failed, W_EVICT_ORPHAN);
		k = cut;
	}
	hit = k * m->bs < n - 1 ? k * m->bs : n - 1;
	n_map = (hit + m->bs - 1) / m->bs;
	assert(n_map == k); /* limit above already cut the walk there */
	s->adopted_pages = s->adopted_tokens = 0;
	for (uint32_t j = 0; j < n_map; j++) {
		const struct kvmm_node *nd = &m->nodes[s->pages[j]];

		if (nd->flags & NODE_ADOPTED) {
			uint32_t t = hit - j * m->bs < m->bs ? hit - j * m->bs : m->bs;

			s->adopted_pages++;
			s->adopted_tokens += t;
			if (nd->flags & NODE_ADOPTED_FILE)
				ctr_add(m, W_ADOPTED_FILE_HIT_TOKENS, t);
		}
		s->pages[j] = nd->page;
	}
	ctr_add(m, W_ADOPTED_HIT_PAGES, s->adopted_pages);
	ctr_add(m, W_ADOPTED_HIT_TOKENS, s->adopted_tokens);
	s->n_pages = n_map;
	s->len = hit;
	s->n_published = hit / m->bs;
	s->shared_prefix_tokens = hit;
	if (n_map > s->pages_peak)
		s->pages_peak = n_map;
	ctr_add(m, W_TOKENS_RESIDENT, hit);
	ctr_add(m, W_PREFIX_HIT_TOKENS, hit);
done:
	kvmm_shm_end(m);
	*ret_hit_tokens = hit;
	return 0;
}

int kvmm_cache_evict(struct kvmm *m, uint32_t n_pages, uint32_t *ret_dropped)
{
	uint32_t dropped = 0;

	kvmm_shm_begin(m);
	while (dropped < n_pages && m->prefix) {
		int32_t v = lru_victim(m, &m->res_lru);

		if (v < 0)
			break;
		dropped += index_drop_subtree(m, v, W_EVICT_EXPLICIT);
	}
	kvmm_shm_end(m);
	if (ret_dropped)
		*ret_dropped = dropped;
	return 0;
}

int kvmm_cache_drop_all(struct kvmm *m, uint32_t *ret_dropped)
{
	uint64_t before;

	kvmm_shm_begin(m);
	before = ctr_get(m, W_PAGES_CACHED) + ctr_get(m, W_PAGES_DEMOTED);
	while (m->prefix) {
		int32_t v = lru_victim(m, &m->res_lru);

		if (v < 0)
			v = lru_victim(m, &m->swp_lru);
		if (v < 0)
			break;
		index_drop_subtree(m, v, W_EVICT_EXPLICIT);
	}
	if (ret_dropped)
		*ret_dropped = (uint32_t)(before - ctr_get(m, W_PAGES_CACHED) - ctr_get(m, W_PAGES_DEMOTED));
	kvmm_shm_end(m);
	return 0;
}
