/*
 * kvmm/pool.c — the page pool: creation and teardown, the memfd holding the
 * pages, the metadata memfd that other processes read, the free list and
 * page references, statistics, the ledger, and the invariant checker.
 *
 * The pool is one memfd mapping (MFD_HUGETLB when the kernel has huge pages
 * reserved, else normal pages with MADV_HUGEPAGE asked for), page p at
 * p * page_bytes, so one page is one contiguous swap unit. The free list is
 * intrusive and singly linked through the page metadata, in the manner of
 * memcached's slab free lists; with a shuffle seed the pool starts in a
 * random permutation and each allocation takes one of the first few free
 * pages at random, so physical placement is scrambled for tests.
 *
 * The metadata memfd carries the counters of struct kvmm_stats and struct
 * kvmm_ledger plus one state word per page. The owner updates them with
 * relaxed atomic stores inside a sequence lock taken by every public call
 * that changes state; readers in other processes (libkvclient's KV map, which
 * the daemon hands this fd with kvmm_meta_layout()'s description) copy them
 * and retry when the lock moved, so the owner never waits for a reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "kvmm_impl.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define HUGE_PAGE_BYTES (2u << 20)
#define SHUFFLE_WINDOW 8 /* a shuffled pool hands out one of the first 8 free pages */

uint64_t kvmm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- sequence lock ------------------------------------------------------------ */

void kvmm_shm_begin(struct kvmm *m)
{
	if (m->shm_depth++ > 0)
		return;
	m->shm_seq++;
	atomic_store_explicit(&m->shm->seq, m->shm_seq, memory_order_relaxed);
	/* Orders the odd sequence store before every counter store that
	 * follows: a reader that sees any of them sees the lock taken. */
	atomic_thread_fence(memory_order_release);
}

void kvmm_shm_end(struct kvmm *m)
{
	if (--m->shm_depth > 0)
		return;
	m->shm_seq++;
	/* Release: every counter store above is visible before the even value. */
	atomic_store_explicit(&m->shm->seq, m->shm_seq, memory_order_release);
}

/* ---- free list and references ------------------------------------------------- */

int32_t page_alloc(struct kvmm *m)
{
	int32_t p, *link;
	uint32_t k;

	if (m->free_head < 0 && !index_reclaim_one(m, W_EVICT_RECLAIM))
		return -1;
	link = &m->free_head;
	if (m->rng) {
		uint64_t n_free = ctr_get(m, W_PAGES_FREE);

		k = (uint32_t)(splitmix64(&m->rng) % (n_free < SHUFFLE_WINDOW ? n_free : SHUFFLE_WINDOW));
		while (k-- > 0 && m->pg[*link].next >= 0)
			link = &m->pg[*link].next;
	}
	p = *link;
	*link = m->pg[p].next;
	m->pg[p].next = -1;
	m->pg[p].sum_ok = false;
	ctr_sub(m, W_PAGES_FREE, 1);
	page_word_set(m, p, 0);
	ctr_add(m, W_PAGES_ALLOCATED, 1);
	return p;
}

void page_free(struct kvmm *m, int32_t p)
{
	if (m->pg[p].packed) {
		m->pg[p].packed = false;
		ctr_sub(m, W_PAGES_PACKED, 1);
	}
	m->pg[p].next = m->free_head;
	m->pg[p].fill = 0;
	m->pg[p].sum_ok = false;
	m->free_head = p;
	page_word_set(m, p, KVMM_PAGE_FREE);
	ctr_add(m, W_PAGES_FREE, 1);
}

void page_get(struct kvmm *m, int32_t p)
{
	uint32_t w = page_word(m, p), ref = w & KVMM_PAGE_REF_MASK;

	if (ref == 0) {
		int32_t n = m->pg[p].node;

		if (n >= 0 && !(m->nodes[n].flags & NODE_BUSY))
			lru_remove(m, &m->res_lru, n);
		ctr_add(m, W_PAGES_USED, 1);
		ctr_add(m, W_FILL_USED, m->pg[p].fill);
	} else if (ref == 1) {
		ctr_add(m, W_PAGES_SHARED, 1);
	}
	page_word_set(m, p, w + 1);
}

void page_put(struct kvmm *m, int32_t p)
{
	uint32_t w = page_word(m, p) - 1, ref = w & KVMM_PAGE_REF_MASK;

	page_word_set(m, p, w);
	if (ref == 1) {
		ctr_sub(m, W_PAGES_SHARED, 1);
	} else if (ref == 0) {
		ctr_sub(m, W_PAGES_USED, 1);
		ctr_sub(m, W_FILL_USED, m->pg[p].fill);
		if (m->pg[p].node >= 0)
			lru_push(m, &m->res_lru, m->pg[p].node);
		else
			page_free(m, p);
	}
}

void page_set_fill(struct kvmm *m, int32_t p, uint32_t fill)
{
	if (page_ref(m, p) > 0)
		ctr_set(m, W_FILL_USED, ctr_get(m, W_FILL_USED) - m->pg[p].fill + fill);
	m->pg[p].fill = fill;
}

void page_set_packed(struct kvmm *m, int32_t p)
{
	if (!m->pg[p].packed) {
		m->pg[p].packed = true;
		ctr_add(m, W_PAGES_PACKED, 1);
	}
	page_word_set(m, p, page_word(m, p) | KVMM_PAGE_PACKED);
	page_set_fill(m, p, m->bs);
	for (uint32_t t = 0; t < m->bs; t++)
		m->page_tokens[(size_t)p * m->bs + t] = -1;
}

void page_set_indexed(struct kvmm *m, int32_t p, int32_t node)
{
	uint32_t w = page_word(m, p);

	m->pg[p].node = node;
	page_word_set(m, p, node >= 0 ? w | KVMM_PAGE_INDEXED : w & ~KVMM_PAGE_INDEXED);
	/* An indexed page never changes (writes go to a copy), so its
	 * hibernation checksum is taken once, here, and a stop re-hashes
	 * nothing; about 60 us for a 360 KiB page, once per bs tokens. */
	if (node < 0)
		m->pg[p].sum_ok = false;
	else if (!m->pg[p].sum_ok && !m->sum_defer && !m->device_pool) {
		m->pg[p].sum = hib_sum(page_ptr(m, p), m->page_bytes);
		m->pg[p].sum_ok = true;
	}
}

/* ---- creation -------------------------------------------------------------------- */

static int mem_available_bytes(uint64_t *ret)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	unsigned long long kb;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
			fclose(f);
			*ret = (uint64_t)kb * 1024;
			return 0;
		}
	}
	fclose(f);
	return -ENOENT;
}

static int map_pool(struct kvmm *m, uint64_t bytes)
{
	int fd;
	void *p;

	/* Huge pages first: they only exist when the administrator reserved
	 * some (vm.nr_hugepages); mmap then fails with ENOMEM and we fall back. */
	fd = memfd_create("kvd-kv-pool", MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING);
	if (fd >= 0) {
		uint64_t hb = (bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;

		if (ftruncate(fd, (off_t)hb) == 0) {
			(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
			p = mmap(NULL, hb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (p != MAP_FAILED) {
				m->pool_fd = fd;
				m->pool = p;
				m->pool_map_bytes = hb;
				m->hugetlb = true;
				return 0;
			}
		}
		close(fd);
	}
	fd = memfd_create("kvd-kv-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0) {
		int r = -errno;

		close(fd);
		return r == -EFBIG ? -ENOMEM : r;
	}
	/* Sealed at its size: whoever else holds it later (a service
	 * manager's fd store) cannot truncate it under a mapping. */
	(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return -ENOMEM;
	}
	/* Transparent huge pages for shmem are often off (shmem_enabled); the
	 * advice is then a no-op and its failure is no error. */
	(void)madvise(p, bytes, MADV_HUGEPAGE);
	m->pool_fd = fd;
	m->pool = p;
	m->pool_map_bytes = bytes;
	return 0;
}

/* Map an existing pool memfd (kvmm_create_adopt). The caller keeps fd on
 * failure. */
static int adopt_pool(struct kvmm *m, int fd, uint64_t bytes)
{
	struct stat st;
	struct statfs sf;
	int seals;
	void *p;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EBADFD;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return -EPERM;
	if (fstatfs(fd, &sf) < 0)
		return -errno;
	m->hugetlb = sf.f_type == HUGETLBFS_MAGIC;
	if ((uint64_t)st.st_size < bytes || (uint64_t)st.st_size - bytes >= (m->hugetlb ? HUGE_PAGE_BYTES : 1))
		return -EBADFD;
	p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	if (!m->hugetlb)
		(void)madvise(p, (size_t)st.st_size, MADV_HUGEPAGE);
	m->pool_fd = fd;
	m->pool = p;
	m->pool_map_bytes = (size_t)st.st_size;
	return 0;
}

static int map_meta(struct kvmm *m)
{
	size_t hdr = (sizeof(struct kvmm_shm) + 63) & ~(size_t)63;
	size_t bytes = hdr + (size_t)m->n_pages * sizeof(uint32_t);
	long pgsz = sysconf(_SC_PAGESIZE);
	struct kvmm_shm *s;
	int fd, r;

	bytes = (bytes + (size_t)pgsz - 1) / (size_t)pgsz * (size_t)pgsz;
	fd = memfd_create("kvd-kv-meta", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	s = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (s == MAP_FAILED) {
		close(fd);
		return -ENOMEM;
	}
	s->magic = KVMM_SHM_MAGIC;
	s->version = KVMM_SHM_VERSION;
	s->hdr_bytes = (uint32_t)sizeof(struct kvmm_shm);
	s->n_words = KVMM_SHM_WORDS;
	s->n_pages = m->n_pages;
	s->block_size = m->bs;
	s->page_bytes = m->page_bytes;
	s->page_words_offset = hdr;
	s->total_bytes = bytes;
	/* Our writable mapping stays; nobody can add another, resize the file
	 * or remove the seals. Kernels before 5.1 lack FUTURE_WRITE: the fd
	 * then stays private (kvmm_stats_fd_sealed() says 0). */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0)
		(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
	m->meta_fd = fd;
	m->shm = s;
	m->shm_bytes = bytes;
	m->pw = (_Atomic uint32_t *)((char *)s + hdr);
	return 0;
}

static int check_config(const struct kvmm_config *cfg)
{
	if (!cfg || cfg->page_bytes == 0 || cfg->block_size == 0 || cfg->block_size > KVMM_MAX_BLOCK_SIZE)
		return -EINVAL;
	if (cfg->max_seqs > KVMM_MAX_SEQS)
		return -EINVAL;
	if (cfg->pool_bytes == 0 && !(cfg->pool_fraction > 0 && cfg->pool_fraction <= 1))
		return -EINVAL;
	if (!cfg->page_ops.read != !cfg->page_ops.write)
		return -EINVAL;
	if (cfg->page_ops.read && !cfg->page_ops.copy)
		return -EINVAL;
	if (!cfg->page_ops.read_n != !cfg->page_ops.write_n || (cfg->page_ops.read_n && !cfg->page_ops.read))
		return -EINVAL;
	if (cfg->pack_slots > KVMM_PACK_MAX && cfg->pack_slots != KVMM_PACK_NONE)
		return -EINVAL;
	if (cfg->pack_slots && cfg->pack_slots != KVMM_PACK_NONE && !cfg->page_ops.pack)
		return -EINVAL;
	return 0;
}

static int create(const struct kvmm_config *cfg, struct kvmm_swap_io *io, int adopt_fd, uint32_t adopt_pages,
		  struct kvmm **ret)
{
	struct kvmm *m;
	uint64_t pool_bytes, n_pages;
	int r = check_config(cfg);

	if (r < 0)
		return r;
	pool_bytes = cfg->pool_bytes;
	if (adopt_fd >= 0) {
		if (cfg->page_ops.read)
			return -EOPNOTSUPP;
		if (adopt_pages == 0)
			return -EINVAL;
		pool_bytes = (uint64_t)adopt_pages * cfg->page_bytes;
	} else if (pool_bytes == 0) {
		uint64_t avail;

		r = mem_available_bytes(&avail);
		if (r < 0)
			return r;
		pool_bytes = (uint64_t)((double)avail * cfg->pool_fraction);
	}
	n_pages = pool_bytes / cfg->page_bytes;
	if (n_pages == 0 || n_pages > (uint64_t)INT32_MAX - 1 || n_pages * cfg->block_size > (uint64_t)SIZE_MAX / 8)
		return -EINVAL;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->pool_fd = m->meta_fd = -1;
	m->free_head = -1;
	m->bs = cfg->block_size;
	m->n_pages = (uint32_t)n_pages;
	m->page_bytes = cfg->page_bytes;
	m->page_ops = cfg->page_ops;
	m->device_pool = cfg->page_ops.read != NULL;
	m->prefix = cfg->prefix_cache != 0;
	m->pack_slots = cfg->pack_slots;
	m->max_seqs = cfg->max_seqs ? cfg->max_seqs : KVMM_MAX_SEQS;
	m->key_mask = UINT64_MAX;
	m->pool_buf_index = m->bounce_buf_index = -1;

	if (adopt_fd >= 0) {
		r = adopt_pool(m, adopt_fd, n_pages * cfg->page_bytes);
		if (r < 0)
			goto fail;
	} else if (!m->device_pool) {
		r = map_pool(m, n_pages * cfg->page_bytes);
		if (r < 0)
			goto fail;
	}
	r = map_meta(m);
	if (r < 0)
		goto fail;
	r = -ENOMEM;
	m->pg = malloc(n_pages * sizeof(*m->pg));
	m->page_tokens = malloc(n_pages * m->bs * sizeof(int32_t));
	m->seqs = calloc(m->max_seqs, sizeof(*m->seqs));
	m->free_ids = malloc(m->max_seqs * sizeof(*m->free_ids));
	if (!m->pg || !m->page_tokens || !m->seqs || !m->free_ids)
		goto fail;
	for (uint32_t i = 0; i < m->max_seqs; i++)
		m->free_ids[i] = m->max_seqs - 1 - i; /* lowest id on top */
	m->n_free_ids = m->max_seqs;

	/* Free list: ascending, or a seeded permutation. */
	{
		int32_t *order = malloc(n_pages * sizeof(*order));

		if (!order)
			goto fail;
		for (uint32_t i = 0; i < n_pages; i++)
			order[i] = (int32_t)i;
		if (cfg->shuffle_seed) {
			uint64_t st = cfg->shuffle_seed;

			for (uint32_t i = (uint32_t)n_pages - 1; i > 0; i--) {
				uint32_t j = (uint32_t)(splitmix64(&st) % (i + 1));
				int32_t t = order[i];

				order[i] = order[j];
				order[j] = t;
			}
			m->rng = splitmix64(&st) | 1;
		}
		for (uint32_t i = (uint32_t)n_pages; i-- > 0;) {
			int32_t p = order[i];

			m->pg[p] = (struct kvmm_page){.next = m->free_head, .node = -1};
			m->free_head = p;
			page_word_set(m, p, KVMM_PAGE_FREE);
		}
		free(order);
	}
	ctr_set(m, W_PAGES_FREE, n_pages);

	if (io) {
		r = kvmm_swap_init(m, io);
		if (r < 0)
			goto fail;
	} else if (cfg->swap_path) {
		struct kvmm_swap_io *fio = NULL;

		/* Unlinked once open: the space, and the KV data written there,
		 * go away with the process, even when it crashes. */
		r = kvmm_swap_io_uring_open(cfg->swap_path, cfg->swap_bytes, KVMM_SWAP_OPEN_UNLINK, &fio);
		if (r < 0)
			goto fail;
		r = kvmm_swap_init(m, fio);
		if (r < 0) {
			kvmm_swap_io_free(fio);
			goto fail;
		}
	}
	r = kvmm_index_init(m);
	if (r < 0)
		goto fail;
	m->shm->swap_slots = m->n_slots;
	*ret = m;
	return 0;
fail:
	if (io && m->io == io)
		m->io = NULL; /* the caller keeps its store on failure */
	if (adopt_fd >= 0 && m->pool_fd == adopt_fd)
		m->pool_fd = -1; /* and its pool memfd */
	kvmm_destroy(m);
	return r;
}

int kvmm_create_with_io(const struct kvmm_config *cfg, struct kvmm_swap_io *io, struct kvmm **ret)
{
	return create(cfg, io, -1, 0, ret);
}

int kvmm_create_adopt(const struct kvmm_config *cfg, struct kvmm_swap_io *io, int pool_fd, uint32_t n_pages,
		      struct kvmm **ret)
{
	if (pool_fd < 0)
		return -EBADF;
	return create(cfg, io, pool_fd, n_pages, ret);
}

int kvmm_create(const struct kvmm_config *cfg, struct kvmm **ret)
{
	return kvmm_create_with_io(cfg, NULL, ret);
}

struct kvmm *kvmm_destroy(struct kvmm *m)
{
	if (!m)
		return NULL;
	if (m->seqs)
		for (uint32_t i = 0; i < m->max_seqs; i++) {
			free(m->seqs[i].pages);
			free(m->seqs[i].swp);
		}
	kvmm_swap_free(m);
	kvmm_index_free(m);
	if (m->pool)
		munmap(m->pool, m->pool_map_bytes);
	if (m->pool_fd >= 0)
		close(m->pool_fd);
	if (m->shm)
		munmap(m->shm, m->shm_bytes);
	if (m->meta_fd >= 0)
		close(m->meta_fd);
	free(m->pg);
	free(m->page_tokens);
	free(m->seqs);
	free(m->free_ids);
	free(m);
	return NULL;
}

void *kvmm_pool_base(const struct kvmm *m) { return m->pool; }
uint32_t kvmm_n_pages(const struct kvmm *m) { return m->n_pages; }
size_t kvmm_page_bytes(const struct kvmm *m) { return m->page_bytes; }
uint32_t kvmm_block_size(const struct kvmm *m) { return m->bs; }
uint32_t kvmm_available_pages(const struct kvmm *m) { return avail_pages(m); }
int kvmm_pool_fd(const struct kvmm *m) { return m->pool_fd; }
int kvmm_pool_hugetlb(const struct kvmm *m) { return m->hugetlb; }
int kvmm_stats_fd(const struct kvmm *m) { return m->meta_fd; }

int kvmm_stats_fd_sealed(const struct kvmm *m)
{
	const int all = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
	int seals = fcntl(m->meta_fd, F_GET_SEALS);

	return seals >= 0 && (seals & all) == all;
}

void kvmm_meta_layout(const struct kvmm *m, struct kvmm_meta_layout *ret)
{
	*ret = (struct kvmm_meta_layout){
		.file_bytes = m->shm_bytes,
		.seq_offset = offsetof(struct kvmm_shm, seq),
		.words_offset = offsetof(struct kvmm_shm, words),
		.page_words_offset = m->shm->page_words_offset,
		.n_words = KVMM_SHM_WORDS,
		.n_pages = m->n_pages,
		.swap_slots = m->n_slots,
		.word_slots_used = W_SLOTS_USED,
		.word_pages_demoted = W_PAGES_DEMOTED,
	};
}

uint32_t kvmm_page_refcount(const struct kvmm *m, uint32_t page)
{
	return page < m->n_pages ? page_ref(m, (int32_t)page) : 0;
}

uint32_t kvmm_page_state(const struct kvmm *m, uint32_t page)
{
	return page < m->n_pages ? page_word(m, (int32_t)page) : 0;
}

/* ---- statistics and ledger --------------------------------------------------------- */

static void stats_from_words(const uint64_t *w, const struct kvmm_shm *h, struct kvmm_stats *s)
{
	*s = (struct kvmm_stats){
		.pages_total = h->n_pages,
		.pages_free = (uint32_t)w[W_PAGES_FREE],
		.pages_used = (uint32_t)w[W_PAGES_USED],
		.pages_shared = (uint32_t)w[W_PAGES_SHARED],
		.pages_cached = (uint32_t)w[W_PAGES_CACHED],
		.pages_swapped = (uint32_t)w[W_SLOTS_USED],
		.page_bytes = h->page_bytes,
		.block_size = h->block_size,
		.seqs_live = (uint32_t)w[W_SEQS_LIVE],
		.tokens_resident = w[W_TOKENS_RESIDENT],
		.prefix_lookups = w[W_PREFIX_LOOKUPS],
		.prefix_query_tokens = w[W_PREFIX_QUERY_TOKENS],
		.prefix_hit_tokens = w[W_PREFIX_HIT_TOKENS],
		.pages_evicted = w[W_EVICT_RECLAIM] + w[W_EVICT_EXPLICIT] + w[W_EVICT_ORPHAN],
		.cow_copies = w[W_COW_COPIES],
		.swap_out_pages = w[W_SWAP_OUT_PAGES],
		.swap_in_pages = w[W_SWAP_IN_PAGES],
		.pages_demoted = (uint32_t)w[W_PAGES_DEMOTED],
		.swap_slots = h->swap_slots,
		.seqs_swapped = (uint32_t)w[W_SEQS_SWAPPED],
		.pages_packed = (uint32_t)w[W_PAGES_PACKED],
		.pages_released = w[W_PAGES_RELEASED],
		.adopted_hit_pages = w[W_ADOPTED_HIT_PAGES],
		.adopted_hit_tokens = w[W_ADOPTED_HIT_TOKENS],
		.adopted_file_hit_tokens = w[W_ADOPTED_FILE_HIT_TOKENS],
		.pages_adopted_file = w[W_PAGES_ADOPTED_FILE],
	};
}

static void ledger_from_words(const uint64_t *w, const struct kvmm_shm *h, struct kvmm_ledger *l)
{
	*l = (struct kvmm_ledger){
		.seqs_created = w[W_SEQS_CREATED],
		.seqs_finished = w[W_SEQS_FINISHED],
		.prompt_tokens = w[W_PROMPT_TOKENS],
		.generated_tokens = w[W_GENERATED_TOKENS],
		.retained_tokens = w[W_RETAINED_TOKENS],
		.shared_prefix_tokens = w[W_PREFIX_HIT_TOKENS],
		.kv_bytes_allocated = w[W_PAGES_USED] * h->page_bytes,
		.kv_bytes_useful = w[W_FILL_USED] * h->page_bytes / h->block_size,
		.pages_allocated = w[W_PAGES_ALLOCATED],
		.cow_copies = w[W_COW_COPIES],
		.pages_evicted_reclaim = w[W_EVICT_RECLAIM],
		.pages_evicted_explicit = w[W_EVICT_EXPLICIT],
		.pages_evicted_orphan = w[W_EVICT_ORPHAN],
		.pages_demoted = w[W_DEMOTED],
		.pages_promoted = w[W_PROMOTED],
		.demoted_dropped = w[W_DEMOTED_DROPPED],
		.pages_deduplicated = w[W_DEDUP],
		.swap_out_seqs = w[W_SWAP_OUT_SEQS],
		.swap_in_seqs = w[W_SWAP_IN_SEQS],
		.swap_out_pages = w[W_SWAP_OUT_PAGES],
		.swap_in_pages = w[W_SWAP_IN_PAGES],
		.swap_in_remapped_pages = w[W_SWAP_REMAPPED],
		.swap_write_bytes = w[W_SWAP_WRITE_BYTES],
		.swap_read_bytes = w[W_SWAP_READ_BYTES],
		.swap_write_ns = w[W_SWAP_WRITE_NS],
		.swap_read_ns = w[W_SWAP_READ_NS],
		.swap_errors = w[W_SWAP_ERRORS],
		.steps = w[W_STEPS],
		.kv_read_bytes_total = w[W_KV_READ_TOTAL],
		.kv_read_bytes_last_step = w[W_KV_READ_LAST],
		.mem_wait_ns = w[W_MEM_WAIT_NS],
		.compute_ns = w[W_COMPUTE_NS],
		.pages_adopted = w[W_PAGES_ADOPTED],
	};
}

static void owner_words(const struct kvmm *m, uint64_t *w)
{
	for (int i = 0; i < W__COUNT; i++)
		w[i] = ctr_get(m, (enum kvmm_word)i);
}

void kvmm_get_stats(const struct kvmm *m, struct kvmm_stats *ret)
{
	uint64_t w[W__COUNT];

	owner_words(m, w);
	stats_from_words(w, m->shm, ret);
}

void kvmm_get_ledger(const struct kvmm *m, struct kvmm_ledger *ret)
{
	uint64_t w[W__COUNT];

	owner_words(m, w);
	ledger_from_words(w, m->shm, ret);
}

/* ---- invariant checker ------------------------------------------------------------- */

struct why {
	char *buf;
	size_t size;
};

static int fail(struct why *w, const char *fmt, ...)
{
	va_list ap;

	if (w->buf && w->size) {
		va_start(ap, fmt);
		vsnprintf(w->buf, w->size, fmt, ap);
		va_end(ap);
	}
	return -EUCLEAN;
}

#define CHECK(cond, ...)                                  \
	do {                                              \
		if (!(cond)) {                            \
			r = fail(&why, __VA_ARGS__);      \
			goto out;                         \
		}                                         \
	} while (0)

int kvmm_check(const struct kvmm *m, char *why_buf, size_t why_size)
{
	struct why why = {why_buf, why_size};
	uint32_t *refs = calloc(m->n_pages, sizeof(*refs));
	uint8_t *seen = calloc(m->n_pages + 1, 1);
	uint8_t *slot_seen = calloc(m->n_slots + 1, 1);
	uint32_t n_free = 0, n_used = 0, n_shared = 0, n_cached = 0, n_demoted = 0, slots_used = 0, n_packed = 0;
	uint64_t tokens_resident = 0, fill_used = 0;
	uint32_t live = 0, swapped = 0;
	int r = 0;

	if (!refs || !seen || !slot_seen) {
		r = -ENOMEM;
		goto out;
	}
	CHECK(m->shm_depth == 0, "sequence lock held outside a call");
	/* Free list. */
	for (int32_t p = m->free_head; p >= 0; p = m->pg[p].next) {
		CHECK((uint32_t)p < m->n_pages, "free list: page %d out of range", p);
		CHECK(!seen[p], "free list: page %d twice (cycle)", p);
		seen[p] = 1;
		CHECK(page_word(m, p) == KVMM_PAGE_FREE, "free page %d has state word %#x", p, page_word(m, p));
		CHECK(m->pg[p].node < 0, "free page %d is indexed", p);
		n_free++;
	}
	CHECK(n_free == ctr_get(m, W_PAGES_FREE), "free list holds %u pages, counter says %" PRIu64, n_free,
	      ctr_get(m, W_PAGES_FREE));
	/* Sequences: page tables and references. */
	for (uint32_t id = 0; id < m->max_seqs; id++) {
		const struct kvmm_seq *s = &m->seqs[id];
		uint32_t want;

		if (!s->live)
			continue;
		live++;
		want = (uint32_t)(((uint64_t)s->len + m->bs - 1) / m->bs);
		CHECK(s->n_pages == want, "seq %u: %u pages for %u tokens", id, s->n_pages, s->len);
		CHECK(s->n_published <= s->len / m->bs, "seq %u: %u published pages for %u tokens", id,
		      s->n_published, s->len);
		CHECK(s->n_released <= s->n_published, "seq %u: %u released pages, %u published", id, s->n_released, s->n_published);
		CHECK(s->n_packed == (m->pack_slots && m->pack_slots != KVMM_PACK_NONE
					      ? (s->n_released + m->pack_slots - 1) / m->pack_slots : 0),
		      "seq %u: %u packed pages for %u released", id, s->n_packed, s->n_released);
		if (s->swapped)
			swapped++;
		else
			tokens_resident += s->len;
		for (uint32_t i = 0; i < s->n_pages; i++) {
			int32_t p = s->pages[i];

			if (s->swapped && s->swp[i].slot >= 0) {
				int32_t sl = s->swp[i].slot;

				CHECK(p == -1, "seq %u: swapped page %u still maps %d", id, i, p);
				CHECK((uint32_t)sl < m->n_slots, "seq %u: slot %d out of range", id, sl);
				CHECK(!slot_seen[sl], "slot %d owned twice", sl);
				slot_seen[sl] = 1;
				slots_used++;
				continue;
			}
			if (i < s->n_released && !seq_packed_at(m, s, i)) {
				CHECK(p == KVMM_RELEASED, "seq %u: released page %u maps %d", id, i, p);
				continue;
			}
			CHECK(p >= 0 && (uint32_t)p < m->n_pages, "seq %u: page %u maps %d", id, i, p);
			CHECK(page_ref(m, p) > 0, "seq %u maps page %d with refcount 0", id, p);
			refs[p]++;
			for (uint32_t j = 0; j < i; j++)
				CHECK(s->pages[j] != p, "seq %u maps page %d twice", id, p);
			CHECK(m->pg[p].packed == seq_packed_at(m, s, i), "seq %u: page %d at %u: packed %d", id, p, i,
			      (int)m->pg[p].packed);
			CHECK(!m->pg[p].packed || m->pg[p].node < 0, "seq %u: packed page %d is indexed", id, p);
			if (m->pg[p].node >= 0) {
				const struct kvmm_node *nd = &m->nodes[m->pg[p].node];

				/* The index invariant of kvmm_impl.h. */
				CHECK(s->swapped || i == 0 || i >= s->n_published || s->n_released ||
					      (nd->parent >= 0 && m->pg[s->pages[i - 1]].node == nd->parent),
				      "seq %u: indexed page %d at %u without its parent before it", id, p, i);
				CHECK(i > 0 || nd->parent < 0, "seq %u: indexed page %d at 0 has a parent", id, p);
			}
			if (i + 1 < s->n_pages || s->len % m->bs == 0)
				CHECK(m->pg[p].fill == m->bs, "seq %u: full page %d has fill %u", id, p, m->pg[p].fill);
			else
				CHECK(m->pg[p].fill >= s->len % m->bs, "seq %u: last page %d fill %u < %u", id, p,
				      m->pg[p].fill, s->len % m->bs);
		}
	}
	CHECK(live == ctr_get(m, W_SEQS_LIVE), "%u live seqs, counter says %" PRIu64, live, ctr_get(m, W_SEQS_LIVE));
	CHECK(swapped == ctr_get(m, W_SEQS_SWAPPED), "%u swapped seqs, counter says %" PRIu64, swapped,
	      ctr_get(m, W_SEQS_SWAPPED));
	CHECK(tokens_resident == ctr_get(m, W_TOKENS_RESIDENT), "tokens resident %" PRIu64 " vs counter %" PRIu64,
	      tokens_resident, ctr_get(m, W_TOKENS_RESIDENT));
	for (uint32_t p = 0; p < m->n_pages; p++) {
		uint32_t ref = page_ref(m, (int32_t)p);

		CHECK(ref == refs[p], "page %u: refcount %u, but %u page-table references", p, ref, refs[p]);
		CHECK(!!(page_word(m, (int32_t)p) & KVMM_PAGE_INDEXED) == (m->pg[p].node >= 0),
		      "page %u: indexed flag disagrees", p);
		CHECK(m->pg[p].fill <= m->bs, "page %u: fill %u", p, m->pg[p].fill);
		CHECK(m->pg[p].packed == !!(page_word(m, (int32_t)p) & KVMM_PAGE_PACKED), "page %u: packed flag disagrees",
		      p);
		CHECK(!m->pg[p].packed || ref > 0, "page %u: packed but unreferenced", p);
		n_packed += m->pg[p].packed;
		if (ref > 0) {
			n_used++;
			fill_used += m->pg[p].fill;
			CHECK(!seen[p], "page %u referenced and free", p);
		}
		if (ref > 1)
			n_shared++;
		if (ref == 0 && m->pg[p].node >= 0)
			n_cached++;
		if (ref == 0 && m->pg[p].node < 0)
			CHECK(seen[p], "page %u leaked: unreferenced, unindexed, not free", p);
		if (m->pg[p].node >= 0)
			CHECK(m->nodes[m->pg[p].node].page == (int32_t)p, "page %u: node %d points elsewhere", p,
			      m->pg[p].node);
		/* A kept hibernation checksum is never stale: only indexed
		 * (immutable) pages have one, and it matches their bytes. */
		CHECK(!m->pg[p].sum_ok || m->pg[p].node >= 0, "page %u: a checksum kept but not indexed", p);
		CHECK(!m->pg[p].sum_ok || m->device_pool || hib_sum(page_ptr(m, (int32_t)p), m->page_bytes) == m->pg[p].sum,
		      "page %u: its kept checksum does not match its content (written while indexed)", p);
	}
	CHECK(n_packed == ctr_get(m, W_PAGES_PACKED), "packed %u vs counter %" PRIu64, n_packed,
	      ctr_get(m, W_PAGES_PACKED));
	CHECK(n_used == ctr_get(m, W_PAGES_USED), "used %u vs counter %" PRIu64, n_used, ctr_get(m, W_PAGES_USED));
	CHECK(n_shared == ctr_get(m, W_PAGES_SHARED), "shared %u vs counter %" PRIu64, n_shared,
	      ctr_get(m, W_PAGES_SHARED));
	CHECK(n_cached == ctr_get(m, W_PAGES_CACHED) && n_cached == m->res_lru.n, "cached %u vs counter %" PRIu64
	      " / lru %u", n_cached, ctr_get(m, W_PAGES_CACHED), m->res_lru.n);
	CHECK(fill_used == ctr_get(m, W_FILL_USED), "fill %" PRIu64 " vs counter %" PRIu64, fill_used,
	      ctr_get(m, W_FILL_USED));
	CHECK(n_free + n_used + n_cached == m->n_pages, "free %u + used %u + cached %u != %u pages", n_free, n_used,
	      n_cached, m->n_pages);

	/* Index: LRU lists. */
	{
		uint32_t k = 0;
		int32_t prev = -1;

		for (int32_t n = m->res_lru.head; n >= 0; prev = n, n = m->nodes[n].lru_next) {
			const struct kvmm_node *nd = &m->nodes[n];

			CHECK(++k <= m->n_nodes, "resident LRU has a cycle");
			CHECK(nd->lru_prev == prev, "resident LRU: bad back link at node %d", n);
			CHECK(nd->page >= 0 && page_ref(m, nd->page) == 0, "resident LRU: node %d not a cached page", n);
		}
		CHECK(prev == m->res_lru.tail && k == m->res_lru.n, "resident LRU: tail or count wrong");
		k = 0;
		prev = -1;
		for (int32_t n = m->swp_lru.head; n >= 0; prev = n, n = m->nodes[n].lru_next) {
			const struct kvmm_node *nd = &m->nodes[n];

			CHECK(++k <= m->n_nodes, "swap LRU has a cycle");
			CHECK(nd->lru_prev == prev, "swap LRU: bad back link at node %d", n);
			CHECK(nd->page < 0 && nd->slot >= 0, "swap LRU: node %d not demoted", n);
		}
		CHECK(prev == m->swp_lru.tail && k == m->swp_lru.n, "swap LRU: tail or count wrong");
	}
	/* Index: nodes, tree, hash chains. */
	for (uint32_t n = 0; n < m->n_nodes; n++) {
		const struct kvmm_node *nd = &m->nodes[n];
		uint32_t chain = 0;
		bool found = false;

		if (!(nd->flags & NODE_LIVE))
			continue;
		CHECK(!(nd->flags & NODE_BUSY), "node %u busy outside a call", n);
		CHECK((nd->page >= 0) != (nd->slot >= 0), "node %u: page %d slot %d", n, nd->page, nd->slot);
		if (nd->page >= 0) {
			CHECK(m->pg[nd->page].node == (int32_t)n, "node %u: page %d not linked back", n, nd->page);
			CHECK(m->pg[nd->page].fill == m->bs, "node %u: page %d not full", n, nd->page);
		} else {
			CHECK((uint32_t)nd->slot < m->n_slots && !slot_seen[nd->slot], "node %u: slot %d bad or shared",
			      n, nd->slot);
			slot_seen[nd->slot] = 1;
			slots_used++;
			n_demoted++;
		}
		CHECK(nd->key == node_key(m, nd->parent, nd->scope, node_tokens(m, (int32_t)n)), "node %u: key mismatch", n);
		CHECK(nd->parent < 0 || m->nodes[nd->parent].scope == nd->scope, "node %u: scope differs from its parent's", n);
		for (int32_t c = m->buckets[nd->key & m->bucket_mask]; c >= 0; c = m->nodes[c].hnext) {
			CHECK(++chain <= m->n_nodes, "hash chain cycle");
			if (c == (int32_t)n)
				found = true;
		}
		CHECK(found, "node %u missing from its hash chain", n);
		if (nd->parent >= 0) {
			const struct kvmm_node *pa = &m->nodes[nd->parent];
			bool child = false;

			CHECK(pa->flags & NODE_LIVE, "node %u: dead parent %d", n, nd->parent);
			for (int32_t c = pa->first_child; c >= 0; c = m->nodes[c].next_sib)
				if (c == (int32_t)n)
					child = true;
			CHECK(child, "node %u not among its parent's children", n);
		}
		for (int32_t c = nd->first_child; c >= 0; c = m->nodes[c].next_sib)
			CHECK(m->nodes[c].parent == (int32_t)n && (m->nodes[c].flags & NODE_LIVE),
			      "node %u: bad child %d", n, c);
	}
	CHECK(n_demoted == ctr_get(m, W_PAGES_DEMOTED) && n_demoted == m->swp_lru.n, "demoted %u vs counter %" PRIu64,
	      n_demoted, ctr_get(m, W_PAGES_DEMOTED));
	/* Slots. */
	for (uint32_t i = 0; i < m->n_slot_free; i++) {
		int32_t sl = m->slot_free[i];

		CHECK((uint32_t)sl < m->n_slots && !slot_seen[sl], "free slot %d bad or in use", sl);
		slot_seen[sl] = 1;
	}
	CHECK(slots_used == ctr_get(m, W_SLOTS_USED), "slots used %u vs counter %" PRIu64, slots_used,
	      ctr_get(m, W_SLOTS_USED));
	CHECK(slots_used + m->n_slot_free == m->n_slots, "slots leaked: %u used + %u free != %u", slots_used,
	      m->n_slot_free, m->n_slots);
out:
	free(refs);
	free(seen);
	free(slot_seen);
	return r;
}
