/*
 * kvmm/swap.c — moving pages between the pool and the swap store: whole
 * sequences (preemption: kvmm_seq_swap_out / kvmm_seq_swap_in) and cached
 * prefix pages (demotion to a second cache tier and promotion on a hit).
 *
 * The store is divided into slots of page_bytes rounded up to the store's
 * alignment; a stack of free slots hands them out. Transfers go straight
 * from and to pool pages when the pool is host memory with aligned pages
 * (the pool is then registered with the store in chunks of at most 1 GiB, so
 * io_uring uses fixed buffers); otherwise through a few bounce buffers, via
 * page_ops for a device pool: one batched read_n/write_n per chunk when the
 * owner gives them, so the device synchronises once per chunk, else one
 * read/write per page. Every transfer either completes in
 * full or counts as failed, and each operation is undone when one of its
 * transfers fails, so an I/O error costs the sequence (or cache entry)
 * concerned and nothing else.
 *
 * A swapped-out sequence remembers, per logical page, its slot and the index
 * node (with generation) the page had. Swap-in maps a page straight from the
 * index when that node is still resident (no read), reattaches read pages to
 * their node when it was demoted meanwhile, and re-enters them into the
 * index when it was dropped, so the sequence's chain stays indexed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmm_impl.h"

#define POOL_CHUNK_MAX (1ull << 30) /* io_uring's limit for one fixed buffer */
#define BOUNCE_BYTES_MAX (32u << 20)
#define REQS_CAP 256u

int kvmm_swap_init(struct kvmm *m, struct kvmm_swap_io *io)
{
	uint64_t slots;

	if (!io)
		return 0;
	if (!io->ops || io->ops->version != KVMM_SWAP_IO_VERSION || !io->ops->rw || !io->ops->destroy ||
	    io->align == 0 || (io->align & (io->align - 1)))
		return -EINVAL;
	m->slot_bytes = (m->page_bytes + io->align - 1) / io->align * io->align;
	slots = io->size_bytes / m->slot_bytes;
	if (slots == 0)
		return -ENOSPC;
	if (slots > INT32_MAX / 2)
		slots = INT32_MAX / 2;
	m->n_slots = (uint32_t)slots;
	m->slot_free = malloc((size_t)slots * sizeof(*m->slot_free));
	m->slot_tokens = malloc((size_t)slots * m->bs * sizeof(int32_t));
	m->reqs_cap = REQS_CAP;
	m->reqs = calloc(m->reqs_cap, sizeof(*m->reqs));
	if (!m->slot_free || !m->slot_tokens || !m->reqs)
		goto nomem;
	for (uint32_t i = 0; i < m->n_slots; i++)
		m->slot_free[i] = (int32_t)(m->n_slots - 1 - i); /* lowest slot on top */
	m->n_slot_free = m->n_slots;

	m->io_from_pool = !m->device_pool && m->page_bytes % io->align == 0 && (uintptr_t)m->pool % io->align == 0;
	if (m->io_from_pool) {
		uint64_t pool_bytes = (uint64_t)m->n_pages * m->page_bytes;

		m->pool_chunk_bytes = POOL_CHUNK_MAX / m->page_bytes * m->page_bytes;
		if (io->ops->register_buffers && m->pool_chunk_bytes > 0) {
			uint32_t nc = (uint32_t)((pool_bytes + m->pool_chunk_bytes - 1) / m->pool_chunk_bytes);
			struct iovec *iov = calloc(nc, sizeof(*iov));

			if (!iov)
				goto nomem;
			for (uint32_t c = 0; c < nc; c++) {
				uint64_t off = (uint64_t)c * m->pool_chunk_bytes;

				iov[c].iov_base = (char *)m->pool + off;
				iov[c].iov_len = pool_bytes - off < m->pool_chunk_bytes ? pool_bytes - off : m->pool_chunk_bytes;
			}
			if (io->ops->register_buffers(io, iov, nc) == 0)
				m->pool_buf_index = 0;
			free(iov);
		}
	} else {
		size_t al = io->align < 4096 ? 4096 : io->align;
		uint64_t nb = BOUNCE_BYTES_MAX / m->slot_bytes;

		m->n_bounce = (uint32_t)(nb < 1 ? 1 : nb > KVMM_SWAP_QUEUE_DEPTH ? KVMM_SWAP_QUEUE_DEPTH : nb);
		m->bounce = aligned_alloc(al, (m->n_bounce * m->slot_bytes + al - 1) / al * al);
		if (!m->bounce)
			goto nomem;
		memset(m->bounce, 0, m->n_bounce * m->slot_bytes);
		if (io->ops->register_buffers) {
			struct iovec iov = {m->bounce, m->n_bounce * m->slot_bytes};

			if (io->ops->register_buffers(io, &iov, 1) == 0)
				m->bounce_buf_index = 0;
		}
	}
	m->io = io;
	return 0;
nomem:
	kvmm_swap_free(m);
	return -ENOMEM;
}

void kvmm_swap_free(struct kvmm *m)
{
	if (m->io)
		m->io->ops->destroy(m->io);
	m->io = NULL;
	free(m->slot_free);
	free(m->slot_tokens);
	free(m->reqs);
	free(m->bounce);
	m->slot_free = NULL;
	m->slot_tokens = NULL;
	m->reqs = NULL;
	m->bounce = NULL;
	m->n_slots = m->n_slot_free = 0;
}

uint32_t kvmm_swap_slots(const struct kvmm *m) { return m->n_slots; }
uint32_t kvmm_swap_slots_free(const struct kvmm *m) { return m->n_slot_free; }

int32_t slot_alloc(struct kvmm *m)
{
	if (m->n_slot_free == 0)
		return -1;
	ctr_add(m, W_SLOTS_USED, 1);
	return m->slot_free[--m->n_slot_free];
}

void slot_free(struct kvmm *m, int32_t slot)
{
	m->slot_free[m->n_slot_free++] = slot;
	ctr_sub(m, W_SLOTS_USED, 1);
}

void kvmm_set_swap_error_handler(struct kvmm *m, kvmm_swap_error_fn fn, void *ud)
{
	m->on_swap_error = fn;
	m->on_swap_error_ud = ud;
}

/* Tell the owner about an operation whose transfers failed (once each). */
static void report(struct kvmm *m, struct kvmm_swap_incident *inc, uint32_t what, int64_t seq)
{
	if (!inc->pages_failed || !m->on_swap_error)
		return;
	inc->what = what;
	inc->seq = seq;
	m->on_swap_error(m->on_swap_error_ud, inc);
}

/*
 * A device pool with batched page_ops: one read_n of `cnt` pages into the
 * bounce buffers, each landing at its slot (read_n packs them page_bytes
 * apart; when slots are larger, spread them from the last one down, where
 * no move overwrites a page not yet moved). 0 or the callback's error.
 */
static int stage_out_batch(struct kvmm *m, const int32_t *pages, uint32_t cnt)
{
	uint32_t list[KVMM_SWAP_QUEUE_DEPTH];
	int r;

	for (uint32_t j = 0; j < cnt; j++)
		list[j] = (uint32_t)pages[j];
	r = m->page_ops.read_n(m->page_ops.ud, list, cnt, m->bounce);
	if (r < 0)
		return r;
	if (m->slot_bytes != m->page_bytes)
		for (uint32_t j = cnt; j-- > 1;)
			memmove((char *)m->bounce + (size_t)j * m->slot_bytes,
				(char *)m->bounce + (size_t)j * m->page_bytes, m->page_bytes);
	return 0;
}

/*
 * The reverse for the pages of a chunk whose reads succeeded (res 0): pack
 * their bounce buffers page_bytes apart from the start, in order (each move
 * goes to a lower or equal address, so none overwrites a page not yet moved),
 * and hand them to the device in one write_n. On its failure every one of
 * them takes its error.
 */
static void stage_in_batch(struct kvmm *m, const int32_t *pages, const uint32_t *map, uint32_t nq, int *res)
{
	uint32_t list[KVMM_SWAP_QUEUE_DEPTH];
	uint32_t n = 0;
	int r;

	for (uint32_t k = 0; k < nq; k++) {
		char *dst = (char *)m->bounce + (size_t)n * m->page_bytes;

		if (res[map[k]] != 0)
			continue;
		if ((char *)m->reqs[k].buf != dst)
			memmove(dst, m->reqs[k].buf, m->page_bytes);
		list[n++] = (uint32_t)pages[map[k]];
	}
	if (n == 0)
		return;
	r = m->page_ops.write_n(m->page_ops.ud, list, n, m->bounce);
	if (r < 0)
		for (uint32_t k = 0; k < nq; k++)
			if (res[map[k]] == 0)
				res[map[k]] = r;
}

/*
 * Move page pages[j] to (op WRITE) or from (READ) slot slots[j], j < n, and set
 * res[j] to 0 or a negative errno (a short transfer is -EIO). Returns the
 * first error or 0. Counts bytes, time and errors in the ledger, and fills
 * *inc (op, first error, pages, failed and short ones) for report().
 *
 * Pages go by chunks: up to reqs_cap straight from the pool, or up to
 * n_bounce through the bounce buffers. A device pool with batched page_ops
 * stages each chunk with one call (one device synchronisation per chunk);
 * without them, one read or write per page.
 */
static int xfer(struct kvmm *m, uint32_t op, const int32_t *pages, const int32_t *slots, uint32_t n, int *res,
		struct kvmm_swap_incident *inc)
{
	uint32_t chunk = m->io_from_pool ? m->reqs_cap : m->n_bounce;
	bool batched = m->device_pool && m->page_ops.read_n;
	uint32_t map[REQS_CAP];
	uint64_t t0 = kvmm_now_ns(), bytes = 0, errors = 0;
	uint32_t shorts = 0;
	int first = 0;

	for (uint32_t base = 0; base < n; base += chunk) {
		uint32_t cnt = n - base < chunk ? n - base : chunk, nq = 0;
		int r, staged = 0;

		if (op == KVMM_IO_WRITE && batched)
			staged = stage_out_batch(m, pages + base, cnt);
		for (uint32_t j = 0; j < cnt; j++) {
			struct kvmm_io_req *q = &m->reqs[nq];
			int32_t p = pages[base + j];

			res[base + j] = 0;
			q->op = op;
			q->offset = (uint64_t)slots[base + j] * m->slot_bytes;
			q->result = 0;
			if (m->io_from_pool) {
				size_t off = (size_t)p * m->page_bytes;

				q->buf = (char *)m->pool + off;
				q->len = m->page_bytes;
				q->buf_index = m->pool_buf_index >= 0 ? (int32_t)(off / m->pool_chunk_bytes) : -1;
			} else {
				q->buf = (char *)m->bounce + (size_t)j * m->slot_bytes;
				q->len = m->slot_bytes;
				q->buf_index = m->bounce_buf_index;
				if (op == KVMM_IO_WRITE) {
					int rr = 0;

					if (batched)
						rr = staged;
					else if (m->device_pool)
						rr = m->page_ops.read(m->page_ops.ud, (uint32_t)p, q->buf);
					else
						memcpy(q->buf, page_ptr(m, p), m->page_bytes);
					if (rr < 0) {
						res[base + j] = rr;
						continue;
					}
				}
			}
			map[nq++] = base + j;
		}
		r = nq ? m->io->ops->rw(m->io, m->reqs, nq) : 0;
		for (uint32_t k = 0; k < nq; k++) {
			struct kvmm_io_req *q = &m->reqs[k];
			uint32_t j = map[k];

			if (r < 0) {
				res[j] = r;
			} else if (q->result != (int64_t)q->len) {
				res[j] = q->result < 0 ? (int)q->result : -EIO;
				shorts += q->result >= 0;
			}
			if (res[j] == 0 && op == KVMM_IO_READ && !m->io_from_pool && !batched) {
				if (m->device_pool)
					res[j] = m->page_ops.write(m->page_ops.ud, (uint32_t)pages[j], q->buf);
				else
					memcpy(page_ptr(m, pages[j]), q->buf, m->page_bytes);
				if (res[j] > 0)
					res[j] = 0;
			}
		}
		if (op == KVMM_IO_READ && batched)
			stage_in_batch(m, pages, map, nq, res);
		for (uint32_t k = 0; k < nq; k++)
			if (res[map[k]] == 0)
				bytes += m->reqs[k].len;
	}
	for (uint32_t j = 0; j < n; j++)
		if (res[j] < 0) {
			errors++;
			if (!first)
				first = res[j];
		}
	ctr_add(m, op == KVMM_IO_WRITE ? W_SWAP_WRITE_BYTES : W_SWAP_READ_BYTES, bytes);
	ctr_add(m, op == KVMM_IO_WRITE ? W_SWAP_WRITE_NS : W_SWAP_READ_NS, kvmm_now_ns() - t0);
	ctr_add(m, W_SWAP_ERRORS, errors);
	*inc = (struct kvmm_swap_incident){
		.op = op, .error = first, .pages = n, .pages_failed = (uint32_t)errors, .short_transfers = shorts,
	};
	return first;
}

/* Make a read page the resident copy of demoted node x. */
static void attach_to_demoted(struct kvmm *m, int32_t x, int32_t p)
{
	struct kvmm_node *nd = &m->nodes[x];

	lru_remove(m, &m->swp_lru, x);
	slot_free(m, nd->slot);
	nd->slot = -1;
	nd->page = p;
	page_set_indexed(m, p, x);
}

int swap_promote_nodes(struct kvmm *m, const int32_t *nodes, uint32_t n, uint32_t *ret_ok)
{
	int32_t *pages = malloc((size_t)n * 2 * sizeof(int32_t));
	int *res = malloc((size_t)n * sizeof(int));
	uint32_t n_alloc = 0, ok = 0;
	struct kvmm_swap_incident inc = {0};
	int r = 0;

	if (!pages || !res) {
		free(pages);
		free(res);
		*ret_ok = 0;
		return -ENOMEM;
	}
	for (; n_alloc < n; n_alloc++) {
		int32_t p = page_alloc(m);

		if (p < 0)
			break;
		pages[n_alloc] = p;
		pages[n + n_alloc] = m->nodes[nodes[n_alloc]].slot;
	}
	if (n_alloc > 0)
		xfer(m, KVMM_IO_READ, pages, pages + n, n_alloc, res, &inc);
	while (ok < n_alloc && res[ok] == 0)
		ok++;
	for (uint32_t j = 0; j < n_alloc; j++) {
		int32_t p = pages[j], x = nodes[j];

		if (j >= ok) {
			page_free(m, p);
			continue;
		}
		memcpy(&m->page_tokens[(size_t)p * m->bs], &m->slot_tokens[(size_t)m->nodes[x].slot * m->bs],
		       m->bs * sizeof(int32_t));
		m->pg[p].fill = m->bs;
		attach_to_demoted(m, x, p);
		lru_push(m, &m->res_lru, x); /* cached until the caller takes it */
		ctr_add(m, W_PROMOTED, 1);
	}
	if (ok < n)
		r = ok < n_alloc ? res[ok] : -ENOMEM;
	free(pages);
	free(res);
	*ret_ok = ok;
	report(m, &inc, KVMM_SWAP_PROMOTE, -1);
	return r;
}

/* ---- sequences ---------------------------------------------------------------------- */

int kvmm_seq_swap_out(struct kvmm *m, uint32_t seq)
{
	struct kvmm_seq *s = seq_get(m, seq);
	uint32_t k = 0, j = 0;
	int32_t *arr = NULL;
	int *res = NULL;
	uint64_t t0 = kvmm_now_ns();
	struct kvmm_swap_incident inc;
	int r;

	if (!s)
		return -ENOENT;
	if (s->swapped)
		return -EALREADY;
	if (!m->io)
		return -ENODEV;
	for (uint32_t i = 0; i < s->n_pages; i++)
		if (s->pages[i] >= 0 && page_ref(m, s->pages[i]) == 1)
			k++;
	if (k > m->n_slot_free + m->swp_lru.n)
		return -ENOSPC;
	free(s->swp);
	s->swp = malloc((s->n_pages ? s->n_pages : 1) * sizeof(*s->swp));
	arr = malloc((k ? k : 1) * 2 * sizeof(*arr));
	res = malloc((k ? k : 1) * sizeof(*res));
	if (!s->swp || !arr || !res) {
		r = -ENOMEM;
		goto out;
	}
	kvmm_shm_begin(m);
	/* Sequence data outranks demoted cache entries: drop the coldest
	 * ones until the slots are there. */
	while (m->n_slot_free < k)
		index_drop_subtree(m, lru_victim(m, &m->swp_lru), W_EVICT_ORPHAN);
	for (uint32_t i = 0; i < s->n_pages; i++)
		if (s->pages[i] >= 0 && page_ref(m, s->pages[i]) == 1) {
			arr[j] = s->pages[i];
			arr[k + j] = slot_alloc(m);
			j++;
		}
	r = xfer(m, KVMM_IO_WRITE, arr, arr + k, k, res, &inc);
	if (r < 0) {
		for (j = 0; j < k; j++)
			slot_free(m, arr[k + j]);
		s->swap_errors++;
		kvmm_shm_end(m);
		report(m, &inc, KVMM_SWAP_SEQ_OUT, seq);
		goto out;
	}
	/* Written: release the pages, tails first so heads stay warmer in the
	 * cache (private indexed pages stay cached until reclaimed). */
	j = k;
	for (uint32_t i = s->n_pages; i-- > 0;) {
		int32_t p = s->pages[i];

		if (p < 0 || page_ref(m, p) != 1) { /* released, or shared */
			s->swp[i] = (struct kvmm_swp){-1, -1, 0};
			continue;
		}
		j--;
		s->swp[i].slot = arr[k + j];
		s->swp[i].node = m->pg[p].node;
		s->swp[i].gen = m->pg[p].node >= 0 ? m->nodes[m->pg[p].node].gen : 0;
		memcpy(&m->slot_tokens[(size_t)arr[k + j] * m->bs], &m->page_tokens[(size_t)p * m->bs],
		       m->bs * sizeof(int32_t));
		s->pages[i] = -1;
		page_put(m, p);
	}
	s->swapped = true;
	s->swap_outs++;
	s->swap_out_pages += k;
	s->swap_bytes += (uint64_t)k * m->slot_bytes;
	s->swap_ns += kvmm_now_ns() - t0;
	ctr_add(m, W_SEQS_SWAPPED, 1);
	ctr_sub(m, W_TOKENS_RESIDENT, s->len);
	ctr_add(m, W_SWAP_OUT_SEQS, 1);
	ctr_add(m, W_SWAP_OUT_PAGES, k);
	kvmm_shm_end(m);
	free(arr);
	free(res);
	return 0;
out:
	free(s->swp);
	s->swp = NULL;
	free(arr);
	free(res);
	return r;
}

enum { SW_RESIDENT, SW_REMAP, SW_READ };

static bool swp_node_alive(const struct kvmm *m, const struct kvmm_swp *e)
{
	return e->node >= 0 && (m->nodes[e->node].flags & NODE_LIVE) && m->nodes[e->node].gen == e->gen;
}

int kvmm_seq_swap_in(struct kvmm *m, uint32_t seq)
{
	struct kvmm_seq *s = seq_get(m, seq);
	uint32_t need = 0, n_read = 0, n_remap = 0;
	uint8_t *kind;
	int32_t *arr;
	int *res;
	int r;
	uint64_t t0 = kvmm_now_ns();
	struct kvmm_swap_incident inc;

	if (!s)
		return -ENOENT;
	if (!s->swapped)
		return -EALREADY;
	kind = malloc(s->n_pages + 1);
	arr = malloc((s->n_pages + 1) * 2 * sizeof(*arr));
	res = malloc((s->n_pages + 1) * sizeof(*res));
	if (!kind || !arr || !res) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < s->n_pages; i++) {
		const struct kvmm_swp *e = &s->swp[i];

		kind[i] = SW_RESIDENT;
		if (e->slot < 0)
			continue;
		if (swp_node_alive(m, e) && m->nodes[e->node].page >= 0) {
			kind[i] = SW_REMAP;
			if (page_ref(m, m->nodes[e->node].page) == 0)
				need++;
		} else {
			kind[i] = SW_READ;
			need++;
		}
	}
	if (need > avail_pages(m)) {
		r = -ENOMEM;
		goto out;
	}
	kvmm_shm_begin(m);
	/* Remaps first: taken pages leave the LRU, so the allocations below
	 * cannot reclaim them. */
	for (uint32_t i = 0; i < s->n_pages; i++)
		if (kind[i] == SW_REMAP) {
			s->pages[i] = m->nodes[s->swp[i].node].page;
			page_get(m, s->pages[i]);
			n_remap++;
		}
	for (uint32_t i = 0; i < s->n_pages; i++)
		if (kind[i] == SW_READ) {
			int32_t p = page_alloc_for(m, s);

			page_get(m, p);
			s->pages[i] = p;
			arr[n_read] = p;
			arr[s->n_pages + n_read] = s->swp[i].slot;
			n_read++;
		}
	r = xfer(m, KVMM_IO_READ, arr, arr + s->n_pages, n_read, res, &inc);
	if (r < 0) {
		for (uint32_t i = s->n_pages; i-- > 0;)
			if (kind[i] != SW_RESIDENT) {
				page_put(m, s->pages[i]);
				s->pages[i] = -1;
			}
		s->swap_errors++;
		kvmm_shm_end(m);
		report(m, &inc, KVMM_SWAP_SEQ_IN, seq);
		goto out;
	}
	for (uint32_t i = 0; i < s->n_pages; i++) {
		struct kvmm_swp *e = &s->swp[i];
		int32_t p = s->pages[i];

		if (kind[i] == SW_RESIDENT) {
			/* A page only swapped-out sequences held may have lost its
			 * index entry with an ancestor: enter it again. */
			if (m->prefix && i < s->n_published && i >= s->n_released && !s->unkeyed &&
			    m->pg[p].node < 0) {
				int32_t q = index_publish_page(m, s, i, p);

				if (q != p) {
					page_get(m, q);
					s->pages[i] = q;
					page_put(m, p);
				}
			}
			continue;
		}
		if (kind[i] == SW_READ) {
			uint32_t fill = (i + 1 == s->n_pages && s->len % m->bs) ? s->len % m->bs : m->bs;

			memcpy(&m->page_tokens[(size_t)p * m->bs], &m->slot_tokens[(size_t)e->slot * m->bs],
			       m->bs * sizeof(int32_t));
			/* An indexed page is always full, even where this sequence
			 * uses only part of it (a capped prefix hit). */
			page_set_fill(m, p, e->node >= 0 ? m->bs : fill);
			if (seq_packed_at(m, s, i)) {
				page_set_packed(m, p); /* never indexed */
			} else if (swp_node_alive(m, e)) {
				/* Demoted while we were out: our copy is its content. */
				attach_to_demoted(m, e->node, p);
			} else if (m->prefix && i < s->n_published && i >= s->n_released && !s->unkeyed) {
				/* Its node was dropped: enter the page again, or map a
				 * twin someone indexed since. */
				int32_t q = index_publish_page(m, s, i, p);

				if (q != p) {
					page_get(m, q);
					s->pages[i] = q;
					page_put(m, p);
				}
			}
		}
	}
	/* Slots go back last page first, so the next swap-out takes them in
	 * ascending order again: sequential offsets in the file. */
	for (uint32_t i = s->n_pages; i-- > 0;)
		if (s->swp[i].slot >= 0)
			slot_free(m, s->swp[i].slot);
	free(s->swp);
	s->swp = NULL;
	s->swapped = false;
	s->swap_ins++;
	s->swap_in_pages += n_read;
	s->swap_in_remapped += n_remap;
	s->swap_bytes += (uint64_t)n_read * m->slot_bytes;
	s->swap_ns += kvmm_now_ns() - t0;
	ctr_sub(m, W_SEQS_SWAPPED, 1);
	ctr_add(m, W_TOKENS_RESIDENT, s->len);
	ctr_add(m, W_SWAP_IN_SEQS, 1);
	ctr_add(m, W_SWAP_IN_PAGES, n_read);
	ctr_add(m, W_SWAP_REMAPPED, n_remap);
	kvmm_shm_end(m);
	r = 0;
out:
	free(kind);
	free(arr);
	free(res);
	return r;
}

int kvmm_seq_is_swapped(const struct kvmm *m, uint32_t seq)
{
	const struct kvmm_seq *s = seq_get(m, seq);

	return s ? s->swapped : 0;
}

/* ---- cache tier ---------------------------------------------------------------------- */

int kvmm_cache_demote(struct kvmm *m, uint32_t n_pages, uint32_t *ret_demoted)
{
	uint32_t want, done = 0;
	int32_t arr[2 * REQS_CAP];
	int res[REQS_CAP];
	struct kvmm_swap_incident inc[1] = {{0}};
	int r = 0;

	if (!m->io || !m->prefix) {
		if (ret_demoted)
			*ret_demoted = 0;
		return 0;
	}
	kvmm_shm_begin(m);
	want = n_pages < m->res_lru.n ? n_pages : m->res_lru.n;
	/* Room first, by dropping the coldest demoted entries (which may free
	 * cached pages below them too), then the victims, so neither step
	 * disturbs the other. */
	while (m->n_slot_free < want && m->swp_lru.n > 0) {
		index_drop_subtree(m, lru_victim(m, &m->swp_lru), W_EVICT_ORPHAN);
		if (want > m->res_lru.n)
			want = m->res_lru.n;
	}
	if (want > m->n_slot_free)
		want = m->n_slot_free;
	while (done < want && r == 0) {
		uint32_t cnt = want - done < REQS_CAP ? want - done : REQS_CAP;
		int32_t nodes[REQS_CAP];

		for (uint32_t j = 0; j < cnt; j++) {
			int32_t v = m->res_lru.tail;

			lru_remove(m, &m->res_lru, v);
			m->nodes[v].flags |= NODE_BUSY;
			nodes[j] = v;
			arr[j] = m->nodes[v].page;
			arr[REQS_CAP + j] = slot_alloc(m);
		}
		r = xfer(m, KVMM_IO_WRITE, arr, arr + REQS_CAP, cnt, res, inc);
		for (uint32_t j = 0; j < cnt; j++) {
			int32_t v = nodes[j], p = arr[j], sl = arr[REQS_CAP + j];
			struct kvmm_node *nd = &m->nodes[v];

			nd->flags &= ~NODE_BUSY;
			if (res[j] < 0) {
				slot_free(m, sl);
				lru_push_cold(m, &m->res_lru, v);
				continue;
			}
			memcpy(&m->slot_tokens[(size_t)sl * m->bs], &m->page_tokens[(size_t)p * m->bs],
			       m->bs * sizeof(int32_t));
			nd->page = -1;
			nd->slot = sl;
			page_set_indexed(m, p, -1);
			page_free(m, p);
			lru_push(m, &m->swp_lru, v);
			ctr_add(m, W_DEMOTED, 1);
			done++;
		}
		if (r < 0)
			break;
	}
	kvmm_shm_end(m);
	if (r < 0) {
		report(m, inc, KVMM_SWAP_DEMOTE, -1);
		return r;
	}
	if (ret_demoted)
		*ret_demoted = done;
	return 0;
}
