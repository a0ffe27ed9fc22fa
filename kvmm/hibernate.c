/*
 * kvmm/hibernate.c — the prefix cache written to a file at a clean stop
 * and adopted from it at a later start (hibernation), when neither the
 * process nor the pool memfd survives (a stop, a reboot, an upgrade).
 *
 * Saving picks the cached prefix pages hottest first (pages mapped by live
 * sequences, then the LRU order), each with every ancestor it needs to be
 * reachable, up to a byte budget, and writes their contents through
 * io_uring (O_DIRECT where the file system takes it) to a new file created
 * exclusively under a temporary name, its blocks allocated first; the index
 * and the header follow, the file is synced and renamed over the final
 * name. A page's checksum is the one kept since it entered the index
 * (kvmm_page.sum, pool.c); only pages without one are hashed at the save. A deadline stops the
 * page writes: the index then describes the pages already written, which
 * is always a closed set (an entry comes after its parent in the file).
 *
 * Adopting is incremental, on the owner thread, between other work: each
 * step takes a batch of entries, reads their pages into free pool pages,
 * checks every page's content checksum against the index, and only then
 * enters it into the prefix index (cold, at the LRU tail). A page whose
 * content does not match, whose parent was refused or reclaimed since, or
 * for which no free page is left, is never entered. Until a page is
 * entered, no lookup can find it, so a request served during adoption
 * simply computes what is not there yet.
 *
 * The file is never trusted: magic, version, sizes, a checksum over the
 * header and one over the index, every entry's parent and scope are checked
 * before anything is used (kvmm_hib_open_mem is the parser, and the fuzz
 * target's entry). Owner scopes are kept, so a prefix serves after the
 * restart exactly the owners it served before. The page writes themselves
 * (io_uring, missing checksums on helper threads) are in hibernate_io.c.
 *
 * Layout (native byte order; the magic fails to match on another one):
 *   [0, KVMM_HIB_ALIGN)          struct hib_hdr, zero padded
 *   [index_offset, +index_bytes) the owner's bytes padded to 8, then
 *                                n_entries of struct hib_entry, each followed
 *                                by block_size int32 tokens
 *   [data_offset + i * slot_bytes, +page_bytes) entry i's page content
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvmm_impl.h"

#define HIB_MAGIC 0x314e524842445a4bull /* "KZDBHRN1" */
#define HIB_TMP_SUFFIX ".tmp"

struct hib_hdr {
	uint64_t magic;
	uint32_t version;     /* KVMM_HIB_VERSION */
	uint32_t hdr_bytes;   /* sizeof(struct hib_hdr) */
	uint64_t page_bytes;
	uint64_t slot_bytes;  /* page_bytes rounded up to KVMM_HIB_ALIGN */
	uint32_t block_size;
	uint32_t n_entries;
	uint32_t owner_bytes;
	uint32_t entry_bytes; /* sizeof(struct hib_entry) + 4 * block_size */
	uint64_t index_offset;
	uint64_t index_bytes;
	uint64_t data_offset;
	uint64_t file_bytes;  /* data_offset + n_entries * slot_bytes */
	uint64_t index_sum;   /* hib_sum() of the index region */
	uint64_t hdr_sum;     /* hib_sum() of this header with this field 0 */
};

struct hib_entry {
	int32_t parent;    /* entry index (< this one's), or -1 for a root */
	uint32_t reserved; /* 0 */
	uint64_t scope;    /* owner scope; a child's is its parent's */
	uint64_t page_sum; /* hib_sum() of the page's content */
};

_Static_assert(sizeof(struct hib_hdr) == 96, "hibernation header layout");
_Static_assert(sizeof(struct hib_entry) == 24, "hibernation entry layout");

struct kvmm_hib {
	struct hib_hdr h;
	uint8_t *index;       /* index_bytes, malloc()ed */
	const uint8_t *mem;   /* kvmm_hib_open_mem: the whole file, else NULL */
	int fd;               /* kvmm_hib_open: the file, else -1 */
	struct io_uring ring;
	bool ring_ok;
	uint32_t next;        /* first entry not yet considered */
	int32_t *node_of;     /* entry -> node entered for it, or -1 */
	uint32_t *gen_of;     /* that node's generation then */
	bool started, done;
};

static uint64_t round_up(uint64_t n, uint64_t a)
{
	return (n + a - 1) / a * a;
}

static uint64_t pad8(uint64_t n)
{
	return (n + 7) & ~(uint64_t)7;
}

/* A 64-bit checksum, four independent lanes so a page is hashed at memory
 * speed rather than at the latency of one multiply chain. */
uint64_t hib_sum(const void *buf, size_t n)
{
	const uint8_t *p = buf;
	uint64_t a = 0x6b76642d68696221ull ^ n, b = 0x9e3779b97f4a7c15ull, c = 0xbf58476d1ce4e5b9ull,
		 d = 0x94d049bb133111ebull;
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		uint64_t v[4];

		memcpy(v, p + i, 32);
		a = (a ^ v[0]) * 0x9e3779b97f4a7c15ull;
		b = (b ^ v[1]) * 0xff51afd7ed558ccdull;
		c = (c ^ v[2]) * 0xc4ceb9fe1a85ec53ull;
		d = (d ^ v[3]) * 0x100000001b3ull;
		a ^= a >> 29;
		b ^= b >> 31;
		c ^= c >> 27;
		d ^= d >> 33;
	}
	for (; i < n; i++)
		a = (a ^ p[i]) * 0x100000001b3ull;
	a ^= b * 0x9e3779b97f4a7c15ull;
	a ^= c * 0xff51afd7ed558ccdull;
	a ^= d * 0xc4ceb9fe1a85ec53ull;
	a ^= a >> 33;
	a *= 0xff51afd7ed558ccdull;
	a ^= a >> 33;
	return a;
}

static uint64_t hdr_sum_of(const struct hib_hdr *h)
{
	struct hib_hdr c = *h;

	c.hdr_sum = 0;
	return hib_sum(&c, sizeof(c));
}

static const uint8_t *entry_at(const struct kvmm_hib *h, uint32_t i)
{
	return h->index + pad8(h->h.owner_bytes) + (size_t)i * h->h.entry_bytes;
}

static void entry_get(const struct kvmm_hib *h, uint32_t i, struct hib_entry *ret)
{
	memcpy(ret, entry_at(h, i), sizeof(*ret));
}

int kvmm_debug_hib_checksum(void *buf, size_t bytes)
{
	struct hib_hdr h;

	if (!buf || bytes < sizeof(h))
		return -EINVAL;
	memcpy(&h, buf, sizeof(h));
	if (h.index_offset > bytes || h.index_bytes > bytes - h.index_offset)
		return -EINVAL;
	h.index_sum = hib_sum((const uint8_t *)buf + h.index_offset, h.index_bytes);
	h.hdr_sum = hdr_sum_of(&h);
	memcpy(buf, &h, sizeof(h));
	return 0;
}

/* ---- save ------------------------------------------------------------------------ */

static bool resident_chain(const struct kvmm *m, int32_t v)
{
	for (; v >= 0; v = m->nodes[v].parent) {
		const struct kvmm_node *nd = &m->nodes[v];

		if (!(nd->flags & NODE_LIVE) || (nd->flags & NODE_BUSY) || nd->page < 0)
			return false;
	}
	return true;
}

struct ranked {
	uint32_t rank;
	int32_t node;
};

static int cmp_hot_first(const void *a, const void *b)
{
	const struct ranked *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->node < y->node ? -1 : x->node > y->node;
}

/*
 * The nodes to write, in file order: hottest first, each preceded by the
 * ancestors it needs that are not in yet, at most max_entries. *ret_order
 * (malloc()ed) holds node ids; *ret_candidates the resident chains' count.
 */
static int select_nodes(const struct kvmm *m, uint64_t max_entries, int32_t **ret_order, uint32_t *ret_n,
			uint32_t *ret_candidates)
{
	struct ranked *cand = NULL;
	int32_t *order = NULL, *file_idx = NULL, *stack = NULL;
	uint32_t n_cand = 0, n = 0, r = 1;
	uint32_t *rank = NULL;

	if (!m->prefix || !m->n_nodes) {
		*ret_order = NULL;
		*ret_n = *ret_candidates = 0;
		return 0;
	}
	cand = malloc((size_t)m->n_nodes * sizeof(*cand));
	order = malloc((size_t)m->n_nodes * sizeof(*order));
	file_idx = malloc((size_t)m->n_nodes * sizeof(*file_idx));
	stack = malloc((size_t)m->n_nodes * sizeof(*stack));
	rank = calloc(m->n_nodes, sizeof(*rank));
	if (!cand || !order || !file_idx || !stack || !rank) {
		free(cand);
		free(order);
		free(file_idx);
		free(stack);
		free(rank);
		return -ENOMEM;
	}
	for (int32_t v = m->res_lru.head; v >= 0; v = m->nodes[v].lru_next)
		rank[v] = r++;
	for (uint32_t i = 0; i < m->n_nodes; i++) {
		file_idx[i] = -1;
		if (!resident_chain(m, (int32_t)i))
			continue;
		/* Mapped by a sequence: hotter than anything cached. */
		cand[n_cand++] = (struct ranked){page_ref(m, m->nodes[i].page) ? 0 : rank[i], (int32_t)i};
	}
	qsort(cand, n_cand, sizeof(*cand), cmp_hot_first);
	for (uint32_t c = 0; c < n_cand; c++) {
		uint32_t depth = 0;

		for (int32_t v = cand[c].node; v >= 0 && file_idx[v] < 0; v = m->nodes[v].parent)
			stack[depth++] = v;
		if (!depth)
			continue;
		if (n + depth > max_entries)
			continue; /* a shorter chain further down may still fit */
		while (depth) { /* top-down: a parent precedes its children */
			depth--;
			file_idx[stack[depth]] = 0;
			order[n++] = stack[depth];
		}
	}
	free(cand);
	free(file_idx);
	free(stack);
	free(rank);
	*ret_order = order;
	*ret_n = n;
	*ret_candidates = n_cand;
	return 0;
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

int kvmm_hib_save(const struct kvmm *m, const char *path, const void *owner, size_t owner_bytes,
		  uint64_t max_bytes, uint64_t deadline_ns, struct kvmm_hib_save_stats *ret)
{
	struct kvmm_hib_save_stats st = {0};
	struct hib_hdr h = {0};
	struct io_uring ring;
	bool ring_ok = false, direct = true, created = false;
	int32_t *order = NULL, *file_idx = NULL;
	struct iovec *iov = NULL;
	uint32_t *todo = NULL, n_todo = 0;
	uint64_t *off = NULL, *sums = NULL, slot_bytes, entry_bytes, per_entry, fixed, max_entries, reserve;
	uint8_t *meta = NULL, *bounce = NULL;
	char *tmp = NULL;
	struct stat lst;
	uint32_t n = 0, good = 0;
	uint64_t t0 = kvmm_now_ns();
	int fd = -1, r, werr = 0;

	if (!m || !path || !*path || owner_bytes > KVMM_PERSIST_OWNER_MAX || (owner_bytes && !owner))
		return -EINVAL;
	if (m->device_pool)
		return -EOPNOTSUPP;
	if (lstat(path, &lst) == 0 && !S_ISREG(lst.st_mode))
		return S_ISLNK(lst.st_mode) ? -ELOOP : -EISDIR;
	slot_bytes = round_up(m->page_bytes, KVMM_HIB_ALIGN);
	entry_bytes = sizeof(struct hib_entry) + (uint64_t)m->bs * sizeof(int32_t);
	per_entry = slot_bytes + entry_bytes;
	fixed = KVMM_HIB_ALIGN + pad8(owner_bytes) + KVMM_HIB_ALIGN;
	max_entries = max_bytes > fixed ? (max_bytes - fixed) / per_entry : 0;
	r = select_nodes(m, max_entries, &order, &n, &st.candidates);
	if (r < 0)
		return r;
	file_idx = malloc(((size_t)m->n_nodes + 1) * sizeof(*file_idx));
	iov = malloc(((size_t)n + 1) * sizeof(*iov));
	off = malloc(((size_t)n + 1) * sizeof(*off));
	tmp = malloc(strlen(path) + sizeof(HIB_TMP_SUFFIX));
	if (!file_idx || !iov || !off || !tmp) {
		r = -ENOMEM;
		goto out;
	}
	sprintf(tmp, "%s%s", path, HIB_TMP_SUFFIX);
	h.index_offset = KVMM_HIB_ALIGN;
	reserve = round_up(pad8(owner_bytes) + (uint64_t)n * entry_bytes, KVMM_HIB_ALIGN);
	h.data_offset = h.index_offset + reserve;
	/* A temporary file left by a save that died midway is ours to remove
	 * (a regular file of kvd's user); anything else there is refused. */
	if (lstat(tmp, &lst) == 0 && S_ISREG(lst.st_mode) && lst.st_uid == geteuid())
		unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_DIRECT, 0600);
	if (fd < 0 && errno == EINVAL) { /* a file system without O_DIRECT */
		direct = false;
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	}
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	created = true;
	/* Allocate the whole file first: an O_DIRECT write past the end of the
	 * file (or into a hole) takes the inode lock exclusively and, on ext4,
	 * completes synchronously, so io_uring hands each one to a worker
	 * thread and they run one at a time; into allocated blocks they are
	 * queued to the device together. Where the file system cannot allocate
	 * ahead, the writes still work, only slower (the truncation below sets
	 * the final size either way). */
	if (n && fallocate(fd, 0, 0, (off_t)(h.data_offset + (uint64_t)n * slot_bytes)) == 0)
		st.preallocated = true;
	r = io_uring_queue_init(HIB_QUEUE_DEPTH, &ring, 0);
	if (r < 0)
		goto out;
	ring_ok = true;
	/* Pages go straight from the pool when O_DIRECT can take them there,
	 * else through one bounce copy each (aligned, so O_DIRECT still works). */
	if (direct && slot_bytes != m->page_bytes) {
		if (posix_memalign((void **)&bounce, KVMM_HIB_ALIGN, (size_t)(n ? n : 1) * slot_bytes)) {
			bounce = NULL;
			r = -ENOMEM;
			goto out;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		const void *src = page_ptr(m, m->nodes[order[i]].page);

		if (bounce) {
			memcpy(bounce + (size_t)i * slot_bytes, src, m->page_bytes);
			memset(bounce + (size_t)i * slot_bytes + m->page_bytes, 0, slot_bytes - m->page_bytes);
			iov[i] = (struct iovec){bounce + (size_t)i * slot_bytes, slot_bytes};
		} else {
			iov[i] = (struct iovec){(void *)src, m->page_bytes};
		}
		off[i] = h.data_offset + (uint64_t)i * slot_bytes;
	}
	sums = malloc(((size_t)n + 1) * sizeof(*sums));
	todo = malloc(((size_t)n + 1) * sizeof(*todo));
	if (!sums || !todo) {
		r = -ENOMEM;
		goto out;
	}
	/* Pages indexed in this run carry their checksum (taken when they
	 * entered the index, immutable since); only the others are hashed. */
	for (uint32_t i = 0; i < n; i++) {
		const struct kvmm_page *pg = &m->pg[m->nodes[order[i]].page];

		if (pg->sum_ok)
			sums[i] = pg->sum;
		else
			todo[n_todo++] = i;
	}
	st.pages_hashed = n_todo;
	good = hib_write_pages(&ring, fd, iov, off, n, deadline_ns, m->page_bytes, sums, todo, n_todo, &werr);
	st.timed_out = good < n && !werr;
	/* Keep the checksums just taken, so the next save need not (the pages
	 * are indexed and immutable; the owner thread is here, nothing changed
	 * them meanwhile). m is const for the index; this is a cache beside it. */
	for (uint32_t k = 0; k < n_todo && todo[k] < good; k++) {
		struct kvmm_page *pg = &m->pg[m->nodes[order[todo[k]]].page];

		pg->sum = sums[todo[k]];
		pg->sum_ok = true;
	}
	/* The index describes the pages written: a prefix of the file order,
	 * closed under parents. */
	h.index_bytes = pad8(owner_bytes) + (uint64_t)good * entry_bytes;
	meta = aligned_alloc(KVMM_HIB_ALIGN, KVMM_HIB_ALIGN + reserve);
	if (!meta) {
		r = -ENOMEM;
		goto out;
	}
	memset(meta, 0, KVMM_HIB_ALIGN + reserve);
	if (owner_bytes)
		memcpy(meta + KVMM_HIB_ALIGN, owner, owner_bytes);
	for (uint32_t i = 0; i < good; i++) {
		const struct kvmm_node *nd = &m->nodes[order[i]];
		uint8_t *ep = meta + KVMM_HIB_ALIGN + pad8(owner_bytes) + (size_t)i * entry_bytes;
		struct hib_entry e = {
			.parent = nd->parent >= 0 ? file_idx[nd->parent] : -1,
			.scope = nd->scope,
			.page_sum = sums[i],
		};

		file_idx[order[i]] = (int32_t)i;
		memcpy(ep, &e, sizeof(e));
		memcpy(ep + sizeof(e), &m->page_tokens[(size_t)nd->page * m->bs], (size_t)m->bs * sizeof(int32_t));
	}
	h.magic = HIB_MAGIC;
	h.version = KVMM_HIB_VERSION;
	h.hdr_bytes = sizeof(h);
	h.page_bytes = m->page_bytes;
	h.slot_bytes = slot_bytes;
	h.block_size = m->bs;
	h.n_entries = good;
	h.owner_bytes = (uint32_t)owner_bytes;
	h.entry_bytes = (uint32_t)entry_bytes;
	h.file_bytes = h.data_offset + (uint64_t)good * slot_bytes;
	h.index_sum = hib_sum(meta + KVMM_HIB_ALIGN, h.index_bytes);
	h.hdr_sum = hdr_sum_of(&h);
	memcpy(meta, &h, sizeof(h));
	r = pwrite_all(fd, meta, KVMM_HIB_ALIGN + reserve, 0);
	if (r == 0 && ftruncate(fd, (off_t)h.file_bytes) < 0)
		r = -errno;
	if (r == 0 && fdatasync(fd) < 0)
		r = -errno;
	if (r == 0 && werr && !good)
		r = werr; /* nothing at all could be written */
	if (r < 0)
		goto out;
	/* Replace only a regular file (or nothing): checked again just before. */
	if (lstat(path, &lst) == 0 && !S_ISREG(lst.st_mode)) {
		r = S_ISLNK(lst.st_mode) ? -ELOOP : -EISDIR;
		goto out;
	}
	if (rename(tmp, path) < 0) {
		r = -errno;
		goto out;
	}
	created = false;
	st.pages_written = good;
	st.bytes = h.file_bytes;
	st.write_error = werr;
	st.direct = direct;
	r = 0;
out:
	if (ring_ok)
		io_uring_queue_exit(&ring);
	if (fd >= 0)
		close(fd);
	if (created)
		unlink(tmp);
	st.ns = kvmm_now_ns() - t0;
	if (r == 0 && ret)
		*ret = st;
	free(order);
	free(file_idx);
	free(iov);
	free(off);
	free(sums);
	free(todo);
	free(meta);
	free(bounce);
	free(tmp);
	return r;
}

/* ---- open and parse ------------------------------------------------------------------- */

static int fail(const char **ret_why, const char *why, int r)
{
	if (ret_why)
		*ret_why = why;
	return r;
}

/* Header checks: everything that needs no index. */
static int check_hdr(const struct hib_hdr *h, uint64_t file_bytes, const char **ret_why)
{
	if (h->magic != HIB_MAGIC || h->hdr_bytes != sizeof(*h))
		return fail(ret_why, "not a kvd cache file (magic)", -EBADMSG);
	if (hdr_sum_of(h) != h->hdr_sum)
		return fail(ret_why, "header checksum mismatch", -EBADMSG);
	if (h->version != KVMM_HIB_VERSION)
		return fail(ret_why, "another file format version", -EPROTO);
	if (h->block_size == 0 || h->block_size > KVMM_MAX_BLOCK_SIZE || h->page_bytes == 0 ||
	    h->page_bytes > KVMM_HIB_MAX_PAGE_BYTES || h->slot_bytes != round_up(h->page_bytes, KVMM_HIB_ALIGN) ||
	    h->owner_bytes > KVMM_PERSIST_OWNER_MAX ||
	    h->entry_bytes != sizeof(struct hib_entry) + (uint64_t)h->block_size * sizeof(int32_t) ||
	    h->index_offset != KVMM_HIB_ALIGN || h->index_bytes > KVMM_HIB_MAX_INDEX_BYTES ||
	    h->index_bytes != pad8(h->owner_bytes) + (uint64_t)h->n_entries * h->entry_bytes ||
	    h->data_offset < h->index_offset + h->index_bytes || h->data_offset % KVMM_HIB_ALIGN ||
	    h->data_offset > KVMM_HIB_MAX_INDEX_BYTES + 2 * KVMM_HIB_ALIGN)
		return fail(ret_why, "inconsistent header (sizes)", -EBADMSG);
	/* No overflow: n_entries < 2^32, slot_bytes <= 2^31 + 4 KiB. */
	if (h->file_bytes != h->data_offset + (uint64_t)h->n_entries * h->slot_bytes)
		return fail(ret_why, "inconsistent header (file size)", -EBADMSG);
	if (file_bytes < h->file_bytes)
		return fail(ret_why, "truncated", -EBADMSG);
	return 0;
}

/* Index checks: the checksum, then every entry's parent and scope. */
static int check_index(const struct kvmm_hib *h, const char **ret_why)
{
	if (hib_sum(h->index, h->h.index_bytes) != h->h.index_sum)
		return fail(ret_why, "index checksum mismatch", -EBADMSG);
	for (uint32_t i = 0; i < h->h.n_entries; i++) {
		struct hib_entry e, pe;

		entry_get(h, i, &e);
		if (e.reserved || e.parent < -1 || (e.parent >= 0 && (uint32_t)e.parent >= i))
			return fail(ret_why, "invalid index entry (parent)", -EBADMSG);
		if (e.parent >= 0) {
			entry_get(h, (uint32_t)e.parent, &pe);
			if (pe.scope != e.scope)
				return fail(ret_why, "invalid index entry (a chain crossing owner scopes)", -EBADMSG);
		}
	}
	return 0;
}

static struct kvmm_hib *hib_new(void)
{
	struct kvmm_hib *h = calloc(1, sizeof(*h));

	if (h)
		h->fd = -1;
	return h;
}

int kvmm_hib_open_mem(const void *buf, size_t bytes, struct kvmm_hib **ret, const char **ret_why)
{
	struct kvmm_hib *h;
	int r;

	if (!buf || !ret)
		return -EINVAL;
	if (bytes < sizeof(struct hib_hdr))
		return fail(ret_why, "truncated (no header)", -EBADMSG);
	h = hib_new();
	if (!h)
		return -ENOMEM;
	memcpy(&h->h, buf, sizeof(h->h));
	r = check_hdr(&h->h, bytes, ret_why);
	if (r < 0)
		goto fail;
	h->index = malloc(h->h.index_bytes ? h->h.index_bytes : 1);
	if (!h->index) {
		r = -ENOMEM;
		goto fail;
	}
	memcpy(h->index, (const uint8_t *)buf + h->h.index_offset, h->h.index_bytes);
	r = check_index(h, ret_why);
	if (r < 0)
		goto fail;
	h->mem = buf;
	*ret = h;
	return 0;
fail:
	kvmm_hib_close(h);
	return r;
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t got = pread(fd, p, n, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return got < 0 ? -errno : -ENODATA;
		p += got;
		n -= (size_t)got;
		off += (uint64_t)got;
	}
	return 0;
}

int kvmm_hib_open(const char *path, struct kvmm_hib **ret, const char **ret_why)
{
	struct kvmm_hib *h = NULL;
	struct stat st;
	int fd, r;

	if (!path || !*path || !ret)
		return -EINVAL;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		return fail(ret_why, r == -ELOOP ? "the path is a symbolic link" : r == -ENOENT ? "no file" : "cannot open it", r);
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto fail_fd;
	}
	if (!S_ISREG(st.st_mode)) {
		r = fail(ret_why, "not a regular file", -EBADF);
		goto fail_fd;
	}
	if (st.st_uid != geteuid() || (st.st_mode & 077)) {
		r = fail(ret_why, "not owned by kvd's user with mode 0600", -EPERM);
		goto fail_fd;
	}
	h = hib_new();
	if (!h) {
		r = -ENOMEM;
		goto fail_fd;
	}
	h->fd = fd;
	if ((uint64_t)st.st_size < sizeof(h->h)) {
		r = fail(ret_why, "truncated (no header)", -EBADMSG);
		goto fail;
	}
	r = pread_all(fd, &h->h, sizeof(h->h), 0);
	if (r == 0)
		r = check_hdr(&h->h, (uint64_t)st.st_size, ret_why);
	if (r < 0)
		goto fail;
	h->index = malloc(h->h.index_bytes ? h->h.index_bytes : 1);
	if (!h->index) {
		r = -ENOMEM;
		goto fail;
	}
	r = pread_all(fd, h->index, h->h.index_bytes, h->h.index_offset);
	if (r < 0) {
		fail(ret_why, "cannot read the index", r);
		goto fail;
	}
	r = check_index(h, ret_why);
	if (r < 0)
		goto fail;
	r = io_uring_queue_init(HIB_QUEUE_DEPTH, &h->ring, 0);
	if (r < 0) {
		fail(ret_why, "cannot set up io_uring", r);
		goto fail;
	}
	h->ring_ok = true;
	*ret = h;
	return 0;
fail_fd:
	close(fd);
	return r;
fail:
	kvmm_hib_close(h);
	return r;
}

struct kvmm_hib *kvmm_hib_close(struct kvmm_hib *h)
{
	if (!h)
		return NULL;
	if (h->ring_ok)
		io_uring_queue_exit(&h->ring);
	if (h->fd >= 0)
		close(h->fd);
	free(h->index);
	free(h->node_of);
	free(h->gen_of);
	free(h);
	return NULL;
}

const void *kvmm_hib_owner(const struct kvmm_hib *h, uint32_t *ret_bytes)
{
	if (ret_bytes)
		*ret_bytes = h ? h->h.owner_bytes : 0;
	return h && h->h.owner_bytes ? h->index : NULL;
}

int kvmm_hib_info(const struct kvmm_hib *h, struct kvmm_hib_info *ret)
{
	if (!h || !ret)
		return -EINVAL;
	*ret = (struct kvmm_hib_info){
		.version = h->h.version,
		.block_size = h->h.block_size,
		.page_bytes = h->h.page_bytes,
		.n_entries = h->h.n_entries,
		.file_bytes = h->h.file_bytes,
		.next_entry = h->next,
	};
	return 0;
}

/* ---- adopt -------------------------------------------------------------------------- */

/* The node entered for entry i if it is still the same one, else -1. */
static int32_t node_still(const struct kvmm *m, const struct kvmm_hib *h, int32_t i)
{
	int32_t n = h->node_of[i];

	if (n < 0 || !(m->nodes[n].flags & NODE_LIVE) || m->nodes[n].gen != h->gen_of[i])
		return -1;
	return n;
}

/* Read the pages of the n entries into pages[], from the file or memory. */
static int read_pages(struct kvmm *m, struct kvmm_hib *h, const uint32_t *ent, const int32_t *pages, uint32_t n,
		      uint8_t *ok)
{
	uint32_t next = 0, inflight = 0, done = 0;

	if (h->mem) {
		for (uint32_t i = 0; i < n; i++) {
			memcpy(page_ptr(m, pages[i]), h->mem + h->h.data_offset + (uint64_t)ent[i] * h->h.slot_bytes,
			       h->h.page_bytes);
			ok[i] = 1;
		}
		return 0;
	}
	while (done < n) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		int r;

		while (next < n && inflight < HIB_QUEUE_DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&h->ring);

			if (!sqe)
				break;
			io_uring_prep_read(sqe, h->fd, page_ptr(m, pages[next]), (unsigned)h->h.page_bytes,
					   h->h.data_offset + (uint64_t)ent[next] * h->h.slot_bytes);
			io_uring_sqe_set_data64(sqe, next);
			next++;
			inflight++;
		}
		r = io_uring_submit_and_wait(&h->ring, 1);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
			/* No read may land in a page after it is freed: wait for
			 * every one in flight; if even that fails, -EDEADLK
			 * tells the caller to keep the pages out of use. */
			while (inflight && io_uring_wait_cqe(&h->ring, &cqe) == 0) {
				io_uring_cqe_seen(&h->ring, cqe);
				inflight--;
			}
			return inflight ? -EDEADLK : r;
		}
		io_uring_for_each_cqe(&h->ring, head, cqe) {
			uint64_t i = io_uring_cqe_get_data64(cqe);

			if (i < n)
				ok[i] = cqe->res == (int)h->h.page_bytes;
			seen++;
		}
		io_uring_cq_advance(&h->ring, seen);
		done += seen;
		inflight -= seen;
	}
	return 0;
}

int kvmm_hib_adopt(struct kvmm *m, struct kvmm_hib *h, uint32_t max_pages, struct kvmm_hib_progress *ret)
{
	uint32_t ent[KVMM_HIB_BATCH], n = 0;
	int32_t pages[KVMM_HIB_BATCH];
	uint8_t ok[KVMM_HIB_BATCH];
	uint32_t adopted = 0;
	int r = 0;

	if (!m || !h || !ret)
		return -EINVAL;
	if (m->device_pool)
		return -EOPNOTSUPP;
	if (h->h.block_size != m->bs || h->h.page_bytes != m->page_bytes)
		return -ESTALE;
	if (!m->prefix)
		return -EOPNOTSUPP;
	if (!h->started) {
		h->node_of = malloc(((size_t)h->h.n_entries + 1) * sizeof(*h->node_of));
		h->gen_of = malloc(((size_t)h->h.n_entries + 1) * sizeof(*h->gen_of));
		if (!h->node_of || !h->gen_of)
			return -ENOMEM;
		for (uint32_t i = 0; i < h->h.n_entries; i++)
			h->node_of[i] = -1;
		h->started = true;
	}
	if (max_pages == 0 || max_pages > KVMM_HIB_BATCH)
		max_pages = KVMM_HIB_BATCH;
	kvmm_shm_begin(m);
	/* Pick the batch: entries whose parent is (or may become, in this
	 * batch) in the index, each with a free page. Never reclaims. */
	while (!h->done && n < max_pages && h->next < h->h.n_entries) {
		uint32_t i = h->next;
		struct hib_entry e;
		const int32_t *tok = (const int32_t *)(entry_at(h, i) + sizeof(e));
		int32_t pn = -1, ex;

		entry_get(h, i, &e);
		if (e.parent >= 0) {
			bool pending = false;

			for (uint32_t k = 0; k < n && !pending; k++)
				pending = ent[k] == (uint32_t)e.parent;
			if (pending)
				goto take; /* decided when its parent is */
			pn = node_still(m, h, e.parent);
			if (pn < 0) {
				h->next++, ret->skipped++;
				continue;
			}
		}
		ex = index_lookup(m, pn, e.scope, tok);
		if (ex >= 0) { /* computed again meanwhile: the same content */
			h->node_of[i] = ex;
			h->gen_of[i] = m->nodes[ex].gen;
			h->next++, ret->present++;
			continue;
		}
take:
		if (m->free_head < 0) {
			h->done = true; /* the pool is full: the rest stays out */
			ret->skipped += h->h.n_entries - h->next;
			break;
		}
		pages[n] = page_alloc(m);
		ent[n++] = i;
		h->next++;
	}
	if (n) {
		memset(ok, 0, n);
		r = read_pages(m, h, ent, pages, n, ok);
	}
	/* Enter what was read and matches, parents first (file order). */
	for (uint32_t k = 0; k < n; k++) {
		struct hib_entry e;
		const int32_t *tok = (const int32_t *)(entry_at(h, ent[k]) + sizeof(e));
		int32_t p = pages[k], pn = -1, node;

		entry_get(h, ent[k], &e);
		if (e.parent >= 0)
			pn = node_still(m, h, e.parent);
		if (r == -EDEADLK) {
			ret->skipped++; /* a read may still land there: never reused */
			continue;
		}
		if (r < 0 || !ok[k] || (e.parent >= 0 && pn < 0)) {
			page_free(m, p);
			ret->skipped++;
			continue;
		}
		if (hib_sum(page_ptr(m, p), m->page_bytes) != e.page_sum) {
			page_free(m, p);
			ret->refused++;
			continue;
		}
		if (index_lookup(m, pn, e.scope, tok) >= 0) {
			page_free(m, p); /* cannot happen within a batch; kept exact */
			ret->present++;
			continue;
		}
		memcpy(&m->page_tokens[(size_t)p * m->bs], tok, (size_t)m->bs * sizeof(int32_t));
		/* The checksum just verified is the page's: kept for the next save. */
		m->pg[p] = (struct kvmm_page){.next = -1, .node = -1, .fill = m->bs, .sum_ok = true, .sum = e.page_sum};
		node = index_insert(m, pn, e.scope, p, -1);
		m->nodes[node].flags |= NODE_ADOPTED_FILE;
		/* Cold: whatever this run used already stays hotter. */
		lru_remove(m, &m->res_lru, node);
		lru_push_cold(m, &m->res_lru, node);
		h->node_of[ent[k]] = node;
		h->gen_of[ent[k]] = m->nodes[node].gen;
		adopted++;
	}
	ret->adopted += adopted;
	ctr_add(m, W_PAGES_ADOPTED, adopted);
	ctr_add(m, W_PAGES_ADOPTED_FILE, adopted);
	if (h->next >= h->h.n_entries)
		h->done = true;
	kvmm_shm_end(m);
	if (r < 0) {
		h->done = true;
		return r;
	}
	return h->done ? 0 : 1;
}
