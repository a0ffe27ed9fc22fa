/*
 * client/kvc_kvmap.c — libkvclient's views into the daemon's bookkeeping:
 * the KV map (the page pool's metadata memfd, mapped read-only and read
 * under its sequence lock), the latency histograms and the last ledger
 * records.
 *
 * The map's file comes from the daemon with a description of where things
 * are in it (struct ipc_kvmap); nothing of either is trusted before it is
 * checked against the file itself: its seals (so the daemon cannot shrink
 * it under our mapping and make us fault), its size, and every offset. The
 * page words are copied out under the sequence lock and only then decoded,
 * so a torn or hostile value can give a wrong picture, never a bad access.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvclient.h"
#include "ipc.h"
#include "kvc_impl.h"

#pragma GCC visibility push(hidden)

#define KVMAP_TRIES 1000 /* consistent copies attempted before -EAGAIN */
#define KVMAP_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct kvc_kvmap {
	struct kvc_kvmap_info info;
	struct ipc_kvmap desc;
	const uint8_t *base;  /* the whole file, PROT_READ */
	size_t map_bytes;
	uint32_t *scratch;    /* page words of one copy */
};

int kvc_kvmap_attach_fd(int fd, const struct ipc_kvmap *d, kvc_kvmap **ret)
{
	struct stat st;
	kvc_kvmap *m;
	int seals;
	void *p;

	if (fstat(fd, &st) < 0)
		return -errno;
	seals = fcntl(fd, F_GET_SEALS);
	/* Only a sealed file cannot be shrunk under our mapping (SIGBUS). */
	if (!S_ISREG(st.st_mode) || seals < 0 || (seals & KVMAP_SEALS) != KVMAP_SEALS)
		return -EPROTO;
	if (d->file_bytes == 0 || d->file_bytes > (uint64_t)st.st_size || d->file_bytes > SIZE_MAX)
		return -EPROTO;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->scratch = malloc((size_t)d->n_pages * sizeof(uint32_t));
	if (!m->scratch) {
		free(m);
		return -ENOMEM;
	}
	p = mmap(NULL, (size_t)d->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		int r = -errno;
		free(m->scratch);
		free(m);
		return r;
	}
	m->base = p;
	m->map_bytes = (size_t)d->file_bytes;
	m->desc = *d;
	m->info = (struct kvc_kvmap_info){
		.n_pages = d->n_pages,
		.block_size = d->block_size,
		.page_bytes = d->page_bytes,
		.swap_slots = d->swap_slots,
	};
	*ret = m;
	return 0;
}

static int kvmap_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	kvc_kvmap **out = arg;
	struct ipc_kvmap d;
	(void)c;

	if (f->hdr.type != IPC_MSG_KVMAP_REPLY || f->n_fds != 1 || ipc_decode_kvmap(f, &d) < 0)
		return -EPROTO;
	/* the frame's fd is closed after this call; the mapping keeps the file */
	return kvc_kvmap_attach_fd(f->fds[0], &d, out) < 0 ? -EPROTO : 1;
}

int kvc_kvmap_open(kvc_client *c, kvc_kvmap **ret)
{
	kvc_kvmap *m = NULL;
	int r;

	if (!c || !ret)
		return -EINVAL;
	r = ctl_call(c, IPC_MSG_KVMAP, NULL, 0, NULL, 0, kvmap_reply, &m);
	if (r == -ENOMSG)
		r = -EOPNOTSUPP; /* a daemon older than the map */
	if (r < 0) {
		kvc_kvmap_close(m); /* a reply that came but was judged late */
		return r;
	}
	if (!m)
		return -EPROTO;
	*ret = m;
	return 0;
}

kvc_kvmap *kvc_kvmap_close(kvc_kvmap *m)
{
	if (!m)
		return NULL;
	if (m->base)
		munmap((void *)m->base, m->map_bytes);
	free(m->scratch);
	free(m);
	return NULL;
}

const struct kvc_kvmap_info *kvc_kvmap_info(const kvc_kvmap *m)
{
	return &m->info;
}

static uint64_t load_u64(const uint8_t *p)
{
	return atomic_load_explicit((const _Atomic uint64_t *)(const void *)p, memory_order_relaxed);
}

int kvc_kvmap_read(kvc_kvmap *m, uint32_t *pages, struct kvc_kvmap_counts *ret)
{
	const struct ipc_kvmap *d = &m->desc;
	const _Atomic uint64_t *seq = (const _Atomic uint64_t *)(const void *)(m->base + d->seq_offset);
	const _Atomic uint32_t *pw = (const _Atomic uint32_t *)(const void *)(m->base + d->page_words_offset);
	const uint8_t *words = m->base + d->words_offset;
	struct kvc_kvmap_counts k;
	uint64_t slots_used = 0, demoted = 0;
	int tries;

	for (tries = 0; tries < KVMAP_TRIES; tries++) {
		/* Acquire: everything read below is at least as new as s1. */
		uint64_t s1 = atomic_load_explicit(seq, memory_order_acquire), s2;

		if (s1 & 1) {
			sched_yield(); /* the daemon is inside a call: let it finish */
			continue;
		}
		for (uint32_t i = 0; i < d->n_pages; i++)
			m->scratch[i] = atomic_load_explicit(&pw[i], memory_order_relaxed);
		slots_used = load_u64(words + 8u * d->word_slots_used);
		demoted = load_u64(words + 8u * d->word_pages_demoted);
		/* Orders the loads above before the second load of the lock: if
		 * the daemon changed anything we copied, s2 shows it moved. */
		atomic_thread_fence(memory_order_acquire);
		s2 = atomic_load_explicit(seq, memory_order_relaxed);
		if (s1 == s2)
			break;
		if (tries % 16 == 15)
			sched_yield();
	}
	if (tries == KVMAP_TRIES)
		return -EAGAIN;
	memset(&k, 0, sizeof(k));
	for (uint32_t i = 0; i < d->n_pages; i++) {
		uint32_t w = m->scratch[i], ref = w & IPC_KVMAP_PAGE_REF_MASK, st;

		if (w & IPC_KVMAP_PAGE_FREE) {
			st = KVC_PAGE_FREE;
			k.pages_free++;
		} else if (ref == 0) {
			/* unreferenced and not free: kept by the prefix index, or
			 * (never between two kvmm calls) on its way somewhere */
			st = w & IPC_KVMAP_PAGE_INDEXED ? KVC_PAGE_CACHED : 0;
			k.pages_cached += st == KVC_PAGE_CACHED;
		} else {
			st = ref;
			if (ref == 1)
				k.pages_private++;
			else
				k.pages_shared++;
			if (ref > k.refcount_max)
				k.refcount_max = ref;
		}
		if (pages)
			pages[i] = st;
	}
	k.pages_swapped = slots_used > d->swap_slots ? d->swap_slots : (uint32_t)slots_used;
	k.pages_demoted = demoted > k.pages_swapped ? k.pages_swapped : (uint32_t)demoted;
	if (ret)
		*ret = k;
	return 0;
}

/* ---- histograms ---------------------------------------------------------------------------- */

static void hist_from_wire(const struct ipc_hist *w, struct kvc_histogram *h)
{
	_Static_assert(KVC_HIST_MAX_BOUNDS == IPC_HIST_MAX_BOUNDS, "histogram sizes");
	memset(h, 0, sizeof(*h));
	h->n_bounds = w->n_bounds;
	h->count = w->count;
	h->sum_ns = w->sum_ns;
	memcpy(h->bound_ns, w->bound_ns, sizeof(h->bound_ns));
	memcpy(h->bucket, w->bucket, sizeof(h->bucket));
}

static int hist_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct kvc_histograms *o = arg;
	struct ipc_hist_reply h;
	(void)c;

	if (f->hdr.type != IPC_MSG_HIST_REPLY || ipc_decode_hist(f, &h) < 0)
		return -EPROTO;
	memset(o, 0, sizeof(*o));
	hist_from_wire(&h.ttft, &o->ttft);
	hist_from_wire(&h.itl, &o->itl);
	return 1;
}

int kvc_histograms(kvc_client *c, struct kvc_histograms *ret)
{
	struct kvc_histograms h;
	int r;

	if (!c || !ret)
		return -EINVAL;
	r = ctl_call(c, IPC_MSG_HIST, NULL, 0, NULL, 0, hist_reply, &h);
	if (r == -ENOMSG)
		return -EOPNOTSUPP;
	if (r == 0)
		*ret = h;
	return r;
}

/* ---- ledger -------------------------------------------------------------------------------- */

struct ledger_acc {
	bool started;
	uint32_t total, n;
	size_t text_bytes;
	struct { uint32_t uid, len; char *json; } *recs; /* json: malloc'd until packed */
};

static int ledger_reply(kvc_client *c, const struct ipc_frame *f, void *arg)
{
	struct ledger_acc *a = arg;
	struct ipc_ledger_reply_msg m;
	struct ipc_ledger_record rec;
	size_t off = 0;
	(void)c;

	if (f->hdr.type != IPC_MSG_LEDGER_REPLY || ipc_decode_ledger_reply(f, &m) < 0)
		return -EPROTO;
	if (!a->started) {
		a->started = true;
		a->total = m.r.n_total;
		a->recs = calloc(a->total ? a->total : 1, sizeof(*a->recs));
		if (!a->recs)
			return -ENOMEM;
	}
	if (m.r.n_total != a->total || m.r.n_records > a->total - a->n)
		return -EPROTO;
	while (ipc_ledger_record_next(&m, &off, &rec) == 1) {
		char *s = malloc((size_t)rec.bytes + 1);
		if (!s)
			return -ENOMEM;
		memcpy(s, rec.json, rec.bytes);
		s[rec.bytes] = 0;
		a->recs[a->n].uid = rec.uid;
		a->recs[a->n].len = rec.bytes;
		a->recs[a->n].json = s;
		a->text_bytes += (size_t)rec.bytes + 1;
		a->n++;
	}
	if (m.more)
		return 0;
	return a->n == a->total ? 1 : -EPROTO;
}

int kvc_ledger(kvc_client *c, unsigned max_records, struct kvc_ledger_record **ret_records, size_t *ret_n)
{
	struct ledger_acc a = { 0 };
	struct ipc_ledger_req q = { .max_records = max_records };
	struct iovec iov = { &q, sizeof(q) };
	struct kvc_ledger_record *out = NULL;
	int r;

	if (!c || !ret_records || !ret_n)
		return -EINVAL;
	if (max_records > IPC_LEDGER_MAX_RECORDS)
		return -E2BIG;
	r = ctl_call(c, IPC_MSG_LEDGER, &iov, 1, NULL, 0, ledger_reply, &a);
	if (r == -ENOMSG)
		r = -EOPNOTSUPP;
	if (r == 0) {
		/* one block: the array, then the texts */
		out = malloc(a.n * sizeof(*out) + a.text_bytes + 1);
		if (!out)
			r = -ENOMEM;
	}
	if (r == 0) {
		char *text = (char *)(out + a.n);
		for (uint32_t i = 0; i < a.n; i++) {
			memcpy(text, a.recs[i].json, (size_t)a.recs[i].len + 1);
			out[i] = (struct kvc_ledger_record){ a.recs[i].uid, a.recs[i].len, text };
			text += a.recs[i].len + 1;
		}
		*ret_records = out;
		*ret_n = a.n;
	}
	for (uint32_t i = 0; i < a.n; i++)
		free(a.recs[i].json);
	free(a.recs);
	return r;
}
