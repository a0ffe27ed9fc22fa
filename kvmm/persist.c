/*
 * kvmm/persist.c — the prefix index handed from one run of the pool's owner
 * to the next, with the pool memfd itself: export writes the resident part
 * of the index (which page holds which tokens after which parent, and how
 * recently each was used) into a flat buffer; import validates such a
 * buffer completely and re-enters its pages into a fresh pool that adopted
 * the same memfd (kvmm_create_adopt), as cached pages on the LRU list.
 *
 * The buffer is never trusted: it may come back from a service manager's
 * file-descriptor store, and whoever could write to it could write anything.
 * Every size, count and index in it is checked before use, a checksum
 * covers it all (against corruption, not forgery: the memfd carrying it is
 * sealed against writes before it is handed over, and read through seals
 * that say so), and an import either enters every entry or none.
 *
 * What is not carried over: demoted entries (their swap file is unlinked
 * and goes away with the process) and everything below them in the tree,
 * which no lookup could reach; sequences, so page refcounts start at 0 and
 * every imported page is cached (reclaimable); counters and the ledger.
 *
 * Layout (native byte order; the magic fails to match on another one):
 *   struct persist_hdr, the owner's bytes padded to 8, then n_entries
 *   entries of struct persist_entry followed by block_size int32 tokens.
 *   Entries come in tree pre-order, so a parent precedes its children.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmm_impl.h"

#define PERSIST_MAGIC 0x5844495050564b4bull /* "KKVPPIDX" */

struct persist_hdr {
	uint64_t magic;
	uint32_t version;     /* KVMM_PERSIST_VERSION */
	uint32_t hdr_bytes;   /* sizeof(struct persist_hdr) */
	uint64_t total_bytes; /* of the whole buffer */
	uint64_t checksum;    /* persist_sum() of the buffer with this field 0 */
	uint64_t page_bytes;
	uint32_t block_size;
	uint32_t n_pages;     /* of the pool it describes */
	uint32_t n_entries;
	uint32_t owner_bytes;
	uint32_t entry_bytes; /* sizeof(struct persist_entry) + 4 * block_size */
	uint32_t reserved;    /* 0 */
};

struct persist_entry {
	int32_t parent; /* entry index (< this one's), or -1 for a root */
	uint32_t page;
	uint32_t rank;  /* recency: 0 mapped by a sequence, then 1 = hottest cached */
	uint32_t reserved; /* 0 */
	uint64_t scope; /* owner scope (kvmm_seq_set_scope); a child's is its parent's */
};

_Static_assert(sizeof(struct persist_hdr) == 64, "persist header layout");
_Static_assert(sizeof(struct persist_entry) == 24, "persist entry layout");

static size_t pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

/* A 64-bit checksum, word at a time, with the checksum field read as 0. */
static uint64_t persist_sum(const uint8_t *p, size_t n)
{
	const size_t skip = offsetof(struct persist_hdr, checksum);
	uint64_t h = 0x6b76642d70657273ull ^ n;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t v;

		memcpy(&v, p + i, 8);
		if (i == skip)
			v = 0;
		h = (h ^ v) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	for (; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return h;
}

int kvmm_debug_persist_checksum(void *buf, size_t bytes)
{
	uint64_t sum;

	if (!buf || bytes < sizeof(struct persist_hdr))
		return -EINVAL;
	sum = persist_sum(buf, bytes);
	memcpy((uint8_t *)buf + offsetof(struct persist_hdr, checksum), &sum, sizeof(sum));
	return 0;
}

/* ---- export ----------------------------------------------------------------------- */

static bool exportable(const struct kvmm *m, int32_t n)
{
	const struct kvmm_node *nd = &m->nodes[n];

	return (nd->flags & NODE_LIVE) && !(nd->flags & NODE_BUSY) && nd->page >= 0;
}

int kvmm_prefix_export(const struct kvmm *m, const void *owner, size_t owner_bytes, void **ret_buf,
		       size_t *ret_bytes)
{
	struct persist_hdr h = {0};
	uint32_t *rank = NULL, n_entries = 0, r = 1;
	int32_t *entry_of = NULL;
	size_t entry_bytes = sizeof(struct persist_entry) + (size_t)m->bs * sizeof(int32_t), total;
	uint8_t *buf = NULL, *ep;

	if (owner_bytes > KVMM_PERSIST_OWNER_MAX || (owner_bytes && !owner) || !ret_buf || !ret_bytes)
		return -EINVAL;
	if (m->device_pool)
		return -EOPNOTSUPP;
	if (m->prefix && m->n_nodes) {
		rank = calloc(m->n_nodes, sizeof(*rank));
		entry_of = malloc((size_t)m->n_nodes * sizeof(*entry_of));
		if (!rank || !entry_of)
			goto nomem;
		for (uint32_t i = 0; i < m->n_nodes; i++)
			entry_of[i] = -1;
		for (int32_t n = m->res_lru.head; n >= 0; n = m->nodes[n].lru_next)
			rank[n] = r++;
		/* Count what a pre-order walk emits: resident nodes whose
		 * ancestors are all resident. */
		for (uint32_t i = 0; i < m->n_nodes; i++) {
			int32_t v = (int32_t)i;

			if (!exportable(m, v))
				continue;
			while (v >= 0 && exportable(m, v))
				v = m->nodes[v].parent;
			if (v < 0)
				n_entries++;
		}
	}
	total = sizeof(h) + pad8(owner_bytes) + (size_t)n_entries * entry_bytes;
	buf = calloc(1, total);
	if (!buf)
		goto nomem;
	if (owner_bytes)
		memcpy(buf + sizeof(h), owner, owner_bytes);
	ep = buf + sizeof(h) + pad8(owner_bytes);
	n_entries = 0;
	/* Pre-order from every root, iteratively (prefixes can be deep),
	 * skipping the subtree under any node that is not resident. */
	for (uint32_t root = 0; m->prefix && root < m->n_nodes; root++) {
		int32_t v = (int32_t)root;

		if (!(m->nodes[v].flags & NODE_LIVE) || m->nodes[v].parent >= 0)
			continue;
		for (;;) {
			const struct kvmm_node *nd = &m->nodes[v];
			bool emit = exportable(m, v);

			if (emit) {
				struct persist_entry e = {
					.parent = nd->parent >= 0 ? entry_of[nd->parent] : -1,
					.page = (uint32_t)nd->page,
					.rank = page_ref(m, nd->page) ? 0 : rank[v],
					.scope = nd->scope,
				};

				memcpy(ep, &e, sizeof(e));
				memcpy(ep + sizeof(e), &m->page_tokens[(size_t)nd->page * m->bs],
				       (size_t)m->bs * sizeof(int32_t));
				ep += entry_bytes;
				entry_of[v] = (int32_t)n_entries++;
			}
			if (emit && nd->first_child >= 0) {
				v = nd->first_child;
				continue;
			}
			while (v != (int32_t)root && m->nodes[v].next_sib < 0)
				v = m->nodes[v].parent;
			if (v == (int32_t)root)
				break;
			v = m->nodes[v].next_sib;
		}
	}
	h = (struct persist_hdr){
		.magic = PERSIST_MAGIC,
		.version = KVMM_PERSIST_VERSION,
		.hdr_bytes = sizeof(h),
		.total_bytes = total,
		.page_bytes = m->page_bytes,
		.block_size = m->bs,
		.n_pages = m->n_pages,
		.n_entries = n_entries,
		.owner_bytes = (uint32_t)owner_bytes,
		.entry_bytes = (uint32_t)entry_bytes,
	};
	memcpy(buf, &h, sizeof(h));
	h.checksum = persist_sum(buf, total);
	memcpy(buf + offsetof(struct persist_hdr, checksum), &h.checksum, sizeof(h.checksum));
	free(rank);
	free(entry_of);
	*ret_buf = buf;
	*ret_bytes = total;
	return 0;
nomem:
	free(rank);
	free(entry_of);
	free(buf);
	return -ENOMEM;
}

/* ---- parse and import ---------------------------------------------------------------- */

int kvmm_persist_parse(const void *buf, size_t bytes, struct kvmm_persist_info *ret)
{
	struct persist_hdr h;
	uint64_t want;

	if (!buf || !ret)
		return -EINVAL;
	if (bytes < sizeof(h))
		return -EBADMSG;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != PERSIST_MAGIC || h.hdr_bytes != sizeof(h))
		return -EBADMSG;
	if (h.version != KVMM_PERSIST_VERSION)
		return -EPROTO;
	if (h.total_bytes != bytes || h.reserved != 0)
		return -EBADMSG;
	if (h.block_size == 0 || h.block_size > KVMM_MAX_BLOCK_SIZE || h.page_bytes == 0 || h.n_pages == 0 ||
	    h.n_pages > (uint32_t)INT32_MAX - 1 || h.n_entries > h.n_pages || h.owner_bytes > KVMM_PERSIST_OWNER_MAX ||
	    h.entry_bytes != sizeof(struct persist_entry) + (uint64_t)h.block_size * sizeof(int32_t))
		return -EBADMSG;
	/* No overflow: n_entries < 2^31 and entry_bytes <= 16 + 4 * 1024. */
	want = sizeof(h) + pad8(h.owner_bytes) + (uint64_t)h.n_entries * h.entry_bytes;
	if (want != bytes)
		return -EBADMSG;
	if (persist_sum(buf, bytes) != h.checksum)
		return -EBADMSG;
	*ret = (struct kvmm_persist_info){
		.version = h.version,
		.block_size = h.block_size,
		.page_bytes = h.page_bytes,
		.n_pages = h.n_pages,
		.n_entries = h.n_entries,
		.owner = h.owner_bytes ? (const uint8_t *)buf + sizeof(h) : NULL,
		.owner_bytes = h.owner_bytes,
	};
	return 0;
}

struct ranked {
	uint32_t rank;
	int32_t node;
};

/* Coldest first: larger rank, then later entry. */
static int cmp_cold_first(const void *a, const void *b)
{
	const struct ranked *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank > y->rank ? -1 : 1;
	return x->node > y->node ? -1 : x->node < y->node;
}

static bool pool_is_fresh(const struct kvmm *m)
{
	return ctr_get(m, W_PAGES_FREE) == m->n_pages && ctr_get(m, W_SEQS_LIVE) == 0 && m->res_lru.n == 0 &&
	       m->swp_lru.n == 0;
}

int kvmm_prefix_import(struct kvmm *m, const void *buf, size_t bytes, uint32_t *ret_pages)
{
	struct kvmm_persist_info info;
	const uint8_t *ep;
	int32_t *node_of = NULL;
	uint8_t *taken = NULL;
	struct ranked *order = NULL;
	uint32_t n = 0;
	int r;

	r = kvmm_persist_parse(buf, bytes, &info);
	if (r < 0)
		return r;
	if (m->device_pool)
		return -EOPNOTSUPP;
	if (info.block_size != m->bs || info.page_bytes != m->page_bytes || info.n_pages != m->n_pages)
		return -ESTALE;
	if (!m->prefix)
		return info.n_entries ? -EOPNOTSUPP : 0;
	if (!pool_is_fresh(m))
		return -EBUSY;
	ep = (const uint8_t *)buf + sizeof(struct persist_hdr) + pad8(info.owner_bytes);
	/* First pass: everything that needs no index. */
	taken = calloc(m->n_pages, 1);
	node_of = malloc(((size_t)info.n_entries + 1) * sizeof(*node_of));
	order = malloc(((size_t)info.n_entries + 1) * sizeof(*order));
	if (!taken || !node_of || !order) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < info.n_entries; i++) {
		struct persist_entry e;

		memcpy(&e, ep + (size_t)i * (sizeof(e) + m->bs * sizeof(int32_t)), sizeof(e));
		if (e.parent < -1 || (e.parent >= 0 && (uint32_t)e.parent >= i) || e.page >= m->n_pages ||
		    taken[e.page] || e.reserved != 0) {
			r = -EBADMSG;
			goto out;
		}
		taken[e.page] = 1;
	}
	kvmm_shm_begin(m);
	/* The free list without the imported pages, lowest first. */
	m->free_head = -1;
	for (uint32_t p = m->n_pages; p-- > 0;) {
		if (taken[p])
			continue;
		m->pg[p].next = m->free_head;
		m->free_head = (int32_t)p;
	}
	ctr_set(m, W_PAGES_FREE, m->n_pages - info.n_entries);
	/* Hashing every page here would delay readiness: the next hibernation
	 * save takes the checksums these pages still lack. */
	m->sum_defer = true;
	for (n = 0; n < info.n_entries; n++) {
		const uint8_t *rec = ep + (size_t)n * (sizeof(struct persist_entry) + m->bs * sizeof(int32_t));
		struct persist_entry e;
		int32_t parent, p;

		memcpy(&e, rec, sizeof(e));
		parent = e.parent >= 0 ? node_of[e.parent] : -1;
		p = (int32_t)e.page;
		memcpy(&m->page_tokens[(size_t)p * m->bs], rec + sizeof(e), m->bs * sizeof(int32_t));
		if (parent >= 0 && m->nodes[parent].scope != e.scope) {
			r = -EBADMSG; /* a chain crossing scopes */
			break;
		}
		if (index_lookup(m, parent, e.scope, &m->page_tokens[(size_t)p * m->bs]) >= 0) {
			r = -EBADMSG; /* the same tokens twice under one parent */
			break;
		}
		m->pg[p] = (struct kvmm_page){.next = -1, .node = -1, .fill = m->bs};
		page_word_set(m, p, 0);
		node_of[n] = index_insert(m, parent, e.scope, p, -1);
		m->nodes[node_of[n]].flags |= NODE_ADOPTED_FDS;
		order[n] = (struct ranked){e.rank, node_of[n]};
	}
	m->sum_defer = false;
	if (r < 0) {
		/* Undo: drop every root entered (subtrees go with them, their
		 * pages to the free list), then free the pages never entered. */
		uint64_t orphans = ctr_get(m, W_EVICT_ORPHAN);

		for (uint32_t i = 0; i < n; i++)
			if (m->nodes[node_of[i]].parent < 0)
				index_drop_subtree(m, node_of[i], W_EVICT_ORPHAN);
		ctr_set(m, W_EVICT_ORPHAN, orphans);
		for (uint32_t i = n; i < info.n_entries; i++) {
			struct persist_entry e;

			memcpy(&e, ep + (size_t)i * (sizeof(e) + m->bs * sizeof(int32_t)), sizeof(e));
			page_free(m, (int32_t)e.page);
		}
		n = 0;
		kvmm_shm_end(m);
		goto out;
	}
	/* Recency as it was: the coldest pushed first ends at the tail. */
	qsort(order, n, sizeof(*order), cmp_cold_first);
	m->res_lru = (struct kvmm_lru){-1, -1, 0};
	for (uint32_t i = 0; i < n; i++)
		lru_push(m, &m->res_lru, order[i].node);
	ctr_add(m, W_PAGES_ADOPTED, n);
	kvmm_shm_end(m);
out:
	free(taken);
	free(node_of);
	free(order);
	if (r == 0 && ret_pages)
		*ret_pages = n;
	return r;
}

/* ---- memfds ---------------------------------------------------------------------------- */

#define PERSIST_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

int kvmm_persist_memfd(const void *buf, size_t bytes, int *ret_fd)
{
	const uint8_t *p = buf;
	size_t done = 0;
	int fd, r;

	if (!buf || !bytes || !ret_fd)
		return -EINVAL;
	fd = memfd_create("kvd-prefix-index", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	while (done < bytes) {
		ssize_t w = write(fd, p + done, bytes - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			r = w < 0 ? -errno : -EIO;
			goto fail;
		}
		done += (size_t)w;
	}
	if (fcntl(fd, F_ADD_SEALS, PERSIST_SEALS) < 0) {
		r = -errno;
		goto fail;
	}
	*ret_fd = fd;
	return 0;
fail:
	close(fd);
	return r;
}

int kvmm_persist_read_memfd(int fd, size_t max_bytes, void **ret_buf, size_t *ret_bytes)
{
	struct stat st;
	uint8_t *buf;
	size_t done = 0, n;
	int seals;

	if (fd < 0 || !ret_buf || !ret_bytes)
		return -EINVAL;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EBADF;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return errno == EINVAL ? -EPERM : -errno; /* not a memfd at all */
	if ((seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW))
		return -EPERM;
	if (st.st_size <= 0 || (uint64_t)st.st_size > max_bytes)
		return -EFBIG;
	n = (size_t)st.st_size;
	buf = malloc(n);
	if (!buf)
		return -ENOMEM;
	while (done < n) {
		ssize_t got = pread(fd, buf + done, n - done, (off_t)done);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			int r = got < 0 ? -errno : -EIO;

			free(buf);
			return r;
		}
		done += (size_t)got;
	}
	*ret_buf = buf;
	*ret_bytes = n;
	return 0;
}
