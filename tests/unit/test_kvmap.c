/*
 * tests/unit/test_kvmap.c — the KV map: kvmm's metadata memfd as the daemon
 * describes it (kvd_kvmap_describe, daemon/admin.c) and libkvclient reads it
 * (kvc_kvmap_attach_fd / kvc_kvmap_read, client/kvc_kvmap.c).
 *
 *   - the fd a client receives cannot be written, resized, hole-punched,
 *     mapped writable or resealed by it (kvmm reads the page words back);
 *   - a child process's snapshot equals the owner's view: every page's state
 *     against kvmm_page_state(), the counts against kvmm_get_stats(), with
 *     private, shared (refcount 2 and 3), cached and swapped pages present;
 *   - a reader never returns a copy taken while kvmm is inside a call, and
 *     snapshots taken while another thread keeps forking and freeing are
 *     never a mix of the states before and after a call;
 *   - a device pool (the CUDA plug-in's) has the same map;
 *   - the reader refuses a file that is not what the description says, and
 *     the wire decoder a description that does not fit its file;
 *   - and the decoders of the other views' payloads (HIST_REPLY, LEDGER,
 *     LEDGER_REPLY) refuse what a broken peer could send.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvmm.h"
#include "kvmm/kvmm_impl.h" /* kvmm_shm_begin/end: a call in progress */
#include "client/kvc_impl.h"
#include "daemon/kvmap.h"

#define BS 4
#define TB 8 /* bytes per token slot */

static struct kvmm *make(uint32_t n_pages, uint32_t n_slots)
{
	struct kvmm_config c = {
		.page_bytes = BS * TB,
		.block_size = BS,
		.pool_bytes = (uint64_t)n_pages * BS * TB,
		.max_seqs = 64,
		.prefix_cache = 1,
	};
	struct kvmm_swap_io *io = NULL;
	struct kvmm *m = NULL;

	if (n_slots) {
		assert_int_equal(kvmm_swap_io_mem_new((uint64_t)n_slots * BS * TB, &io), 0);
		assert_int_equal(kvmm_create_with_io(&c, io, &m), 0);
	} else {
		assert_int_equal(kvmm_create(&c, &m), 0);
	}
	return m;
}

static void grow(struct kvmm *m, uint32_t seq, const int32_t *t, uint32_t n)
{
	struct kvmm_grow g = { seq, n, t };

	assert_int_equal(kvmm_commit(m, &g, 1), 0);
	assert_int_equal(kvmm_seq_publish(m, seq), 0);
}

static uint32_t new_seq(struct kvmm *m)
{
	uint32_t s;

	assert_int_equal(kvmm_seq_new(m, &s), 0);
	return s;
}

static kvc_kvmap *attach(struct kvmm *m)
{
	struct ipc_kvmap d;
	kvc_kvmap *km = NULL;

	kvd_kvmap_describe(m, &d);
	assert_int_equal(kvc_kvmap_attach_fd(kvmm_stats_fd(m), &d, &km), 0);
	return km;
}

/* The state kvc_kvmap_read should give page p, from kvmm's own accessors. */
static uint32_t expected_state(const struct kvmm *m, uint32_t p)
{
	uint32_t w = kvmm_page_state(m, p);

	if (w & KVMM_PAGE_FREE)
		return KVC_PAGE_FREE;
	if (kvmm_page_refcount(m, p) == 0) {
		assert_true(w & KVMM_PAGE_INDEXED);
		return KVC_PAGE_CACHED;
	}
	return kvmm_page_refcount(m, p);
}

static void test_fd_is_read_only_for_receivers(void **state)
{
	struct kvmm *m = make(16, 0);
	int fd = kvmm_stats_fd(m);
	long pg = sysconf(_SC_PAGESIZE);
	char b = 1;
	void *p;

	(void)state;
	assert_int_equal(kvmm_stats_fd_sealed(m), 1);
	/* no writable shared mapping, and a read-only one cannot become one */
	assert_true(mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	p = mmap(NULL, (size_t)pg, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal(mprotect(p, (size_t)pg, PROT_READ | PROT_WRITE), -1);
	munmap(p, (size_t)pg);
	/* no write, resize, hole punch or new seal through the fd */
	assert_int_equal(pwrite(fd, &b, 1, 0), -1);
	assert_int_equal(ftruncate(fd, 0), -1);
	assert_int_equal(ftruncate(fd, 1 << 20), -1);
	assert_int_equal(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, pg), -1);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
	/* a private writable mapping writes only its own copy */
	p = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 0xff, (size_t)pg);
	munmap(p, (size_t)pg);
	{
		kvc_kvmap *km = attach(m);
		struct kvc_kvmap_counts k;

		assert_int_equal(kvc_kvmap_read(km, NULL, &k), 0);
		assert_int_equal(k.pages_free, 16);
		kvc_kvmap_close(km);
	}
	assert_null(kvmm_destroy(m));
}

static void test_snapshot_in_child_matches_owner(void **state)
{
	struct kvmm *m = make(24, 8);
	uint32_t a = new_seq(m), b, c, d = new_seq(m), e = new_seq(m), hit, n;
	int32_t t[32], u[32];
	uint32_t *theirs;
	struct kvc_kvmap_counts k;
	struct kvmm_stats st;
	int pfd[2], ws;
	pid_t pid;

	(void)state;
	for (int i = 0; i < 32; i++)
		t[i] = i, u[i] = 1000 + i;
	grow(m, a, t, 10);                               /* pages 0-1 full, 2 partial */
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);    /* refcount 2 */
	assert_int_equal(kvmm_seq_fork(m, a, &c), 0);    /* refcount 3 */
	assert_int_equal(kvmm_seq_free(m, c), 0);        /* back to 2 */
	assert_int_equal(kvmm_seq_fork(m, b, &c), 0);    /* 3 again */
	grow(m, c, t + 10, 6);                           /* c copies its partial page: private pages */
	grow(m, d, u, 12);                               /* d: 3 full private pages */
	assert_int_equal(kvmm_seq_finish(m, d, NULL), 0); /* cached: 3 pages */
	grow(m, e, u + 16, 8);
	assert_int_equal(kvmm_seq_swap_out(m, e), 0);    /* swapped: 2 */
	d = new_seq(m);
	assert_int_equal(kvmm_prefix_attach(m, d, u, 9, &hit), 0); /* 2 of the cached back in use */
	assert_int_equal(hit, 8);

	kvc_kvmap *km = attach(m);
	n = kvc_kvmap_info(km)->n_pages;
	assert_int_equal(n, 24);
	assert_int_equal(kvc_kvmap_info(km)->swap_slots, 8);
	assert_int_equal(kvc_kvmap_info(km)->block_size, BS);
	theirs = calloc(n, sizeof(*theirs));
	assert_non_null(theirs);
	assert_int_equal(pipe(pfd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* another process: only the fd and the description */
		int r = kvc_kvmap_read(km, theirs, &k);

		if (write(pfd[1], &r, sizeof(r)) != sizeof(r) || write(pfd[1], &k, sizeof(k)) != sizeof(k) ||
		    write(pfd[1], theirs, n * sizeof(*theirs)) != (ssize_t)(n * sizeof(*theirs)))
			_exit(2);
		_exit(0);
	}
	{
		int r;

		assert_int_equal(read(pfd[0], &r, sizeof(r)), sizeof(r));
		assert_int_equal(r, 0);
		assert_int_equal(read(pfd[0], &k, sizeof(k)), sizeof(k));
		assert_int_equal(read(pfd[0], theirs, n * sizeof(*theirs)), (ssize_t)(n * sizeof(*theirs)));
	}
	assert_int_equal(waitpid(pid, &ws, 0), pid);
	assert_int_equal(WEXITSTATUS(ws), 0);
	close(pfd[0]);
	close(pfd[1]);
	for (uint32_t p = 0; p < n; p++)
		if (theirs[p] != expected_state(m, p))
			fail_msg("page %u: map %#x, kvmm %#x", p, theirs[p], expected_state(m, p));
	kvmm_get_stats(m, &st);
	assert_int_equal(k.pages_free, st.pages_free);
	assert_int_equal(k.pages_private + k.pages_shared, st.pages_used);
	assert_int_equal(k.pages_shared, st.pages_shared);
	assert_int_equal(k.pages_cached, st.pages_cached);
	assert_int_equal(k.pages_swapped, st.pages_swapped);
	assert_int_equal(k.pages_demoted, st.pages_demoted);
	/* every kind is there, so none of the equalities is 0 == 0 */
	assert_true(k.pages_private > 0 && k.pages_cached > 0 && k.pages_swapped > 0 && k.pages_free > 0);
	assert_int_equal(k.refcount_max, 3);
	assert_int_equal(k.pages_shared, 3); /* the two full pages at 3, the partial at 2 */
	free(theirs);
	kvc_kvmap_close(km);
	assert_null(kvmm_destroy(m));
}

struct churn {
	struct kvmm *m;
	uint32_t a;      /* 10 full pages */
	atomic_int stop;
	atomic_ulong rounds;
};

/* Fork the sequence, grow the child into a page of its own, free it, and
 * again: between two kvmm calls the pool is in one of three states (a's 10
 * pages private; shared by two; shared, plus the child's private page), and
 * each call changes 10 page words one by one, so a copy that mixed two
 * states shows a count of shared pages other than 0 or 10. */
static void *churn_main(void *arg)
{
	struct churn *ch = arg;
	int32_t t = 5;

	while (!atomic_load(&ch->stop)) {
		uint32_t b;
		struct kvmm_grow g;

		assert_int_equal(kvmm_seq_fork(ch->m, ch->a, &b), 0);
		g = (struct kvmm_grow){ b, 1, &t };
		assert_int_equal(kvmm_commit(ch->m, &g, 1), 0);
		assert_int_equal(kvmm_seq_free(ch->m, b), 0);
		atomic_fetch_add(&ch->rounds, 1);
	}
	return NULL;
}

static void test_snapshots_while_the_pool_changes(void **state)
{
	struct churn ch = { .m = make(64, 0) };
	kvc_kvmap *km = attach(ch.m);
	uint32_t pages[64];
	unsigned ok = 0, busy = 0, seen[3] = { 0 };
	int32_t t[40];
	pthread_t th;

	(void)state;
	for (int i = 0; i < 40; i++)
		t[i] = i;
	ch.a = new_seq(ch.m);
	grow(ch.m, ch.a, t, 40);
	assert_int_equal(pthread_create(&th, NULL, churn_main, &ch), 0);
	while (atomic_load(&ch.rounds) < 10)
		sched_yield();
	/* read while the writer runs 5000 more rounds */
	unsigned long until = atomic_load(&ch.rounds) + 5000;
	for (int i = 0; atomic_load(&ch.rounds) < until || i < 1000; i++) {
		struct kvc_kvmap_counts k;
		int r = kvc_kvmap_read(km, pages, &k);

		if (r == -EAGAIN) {
			busy++;
			continue;
		}
		assert_int_equal(r, 0);
		ok++;
		assert_int_equal(k.pages_free + k.pages_private + k.pages_shared + k.pages_cached, 64);
		for (int p = 0; p < 64; p++)
			if (!(pages[p] == KVC_PAGE_FREE || (pages[p] >= 1 && pages[p] <= 2)))
				fail_msg("snapshot %d: page %d in state %#x", i, p, pages[p]);
		if (k.pages_private == 10 && k.pages_shared == 0)
			seen[0]++;
		else if (k.pages_private == 0 && k.pages_shared == 10)
			seen[1]++;
		else if (k.pages_private == 1 && k.pages_shared == 10)
			seen[2]++;
		else
			fail_msg("snapshot %d mixes states: %u private, %u shared pages", i, k.pages_private,
				 k.pages_shared);
	}
	atomic_store(&ch.stop, 1);
	assert_int_equal(pthread_join(th, NULL), 0);
	print_message("%u consistent snapshots (%u alone, %u forked, %u grown), %u gave up (EAGAIN), %lu writer "
		      "rounds\n",
		      ok, seen[0], seen[1], seen[2], busy, atomic_load(&ch.rounds));
	assert_true(ok > 0);
	kvc_kvmap_close(km);
	assert_null(kvmm_destroy(ch.m));
}

/* A device pool (the CUDA plug-in's: pages in device memory, reached
 * through callbacks) keeps its metadata in the same host memfd: the map
 * works there as well. */
static char dev_mem[16 * BS * TB];
static int dev_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n)
{
	(void)ud;
	memcpy(dev_mem + dst * BS * TB, dev_mem + src * BS * TB, n * TB);
	return 0;
}
static int dev_read(void *ud, uint32_t page, void *host)
{
	(void)ud;
	memcpy(host, dev_mem + page * BS * TB, BS * TB);
	return 0;
}
static int dev_write(void *ud, uint32_t page, const void *host)
{
	(void)ud;
	memcpy(dev_mem + page * BS * TB, host, BS * TB);
	return 0;
}

static void test_device_pool(void **state)
{
	struct kvmm_config c = {
		.page_bytes = BS * TB, .block_size = BS, .pool_bytes = 16 * BS * TB, .max_seqs = 8, .prefix_cache = 1,
		.page_ops = { .copy = dev_copy, .read = dev_read, .write = dev_write },
	};
	struct kvmm *m = NULL;
	struct kvc_kvmap_counts k;
	uint32_t a, b, pages[16];
	int32_t t[10] = { 0 };

	(void)state;
	assert_int_equal(kvmm_create(&c, &m), 0);
	assert_null(kvmm_pool_base(m));
	assert_int_equal(kvmm_stats_fd_sealed(m), 1);
	a = new_seq(m);
	grow(m, a, t, 10);
	assert_int_equal(kvmm_seq_fork(m, a, &b), 0);
	kvc_kvmap *km = attach(m);
	assert_int_equal(kvc_kvmap_read(km, pages, &k), 0);
	assert_int_equal(k.pages_shared, 3);
	assert_int_equal(k.pages_free, 13);
	for (uint32_t p = 0; p < 16; p++)
		assert_int_equal(pages[p], expected_state(m, p));
	kvc_kvmap_close(km);
	assert_null(kvmm_destroy(m));
}

/* While kvmm is inside a call (the lock odd), no copy is consistent: the
 * reader gives up with -EAGAIN rather than return what it saw; once the
 * call ends it reads the new state. */
static void test_reader_waits_out_the_lock(void **state)
{
	struct kvmm *m = make(16, 0);
	kvc_kvmap *km = attach(m);
	struct kvc_kvmap_counts k;
	uint32_t a, pages[16];
	int32_t t[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

	(void)state;
	a = new_seq(m);
	kvmm_shm_begin(m); /* a call in progress: what follows is not published yet */
	grow(m, a, t, 8);
	assert_int_equal(kvc_kvmap_read(km, pages, &k), -EAGAIN);
	kvmm_shm_end(m);
	assert_int_equal(kvc_kvmap_read(km, pages, &k), 0);
	assert_int_equal(k.pages_private, 2);
	assert_int_equal(pages[0], 1);
	assert_int_equal(k.pages_free, 14);
	kvc_kvmap_close(km);
	assert_null(kvmm_destroy(m));
}

static void test_reader_refuses_what_does_not_fit(void **state)
{
	struct kvmm *m = make(16, 0);
	struct ipc_kvmap d, bad;
	kvc_kvmap *km = NULL;
	int fd;

	(void)state;
	kvd_kvmap_describe(m, &d);
	/* an unsealed memfd of the right size */
	fd = memfd_create("not-kvmm", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)d.file_bytes), 0);
	assert_int_equal(kvc_kvmap_attach_fd(fd, &d, &km), -EPROTO);
	close(fd);
	/* a description larger than the file */
	bad = d;
	bad.file_bytes = d.file_bytes + 4096;
	assert_int_equal(kvc_kvmap_attach_fd(kvmm_stats_fd(m), &bad, &km), -EPROTO);
	assert_null(km);
	assert_null(kvc_kvmap_close(NULL));
	assert_null(kvmm_destroy(m));
}

/* Build a KVMAP_REPLY frame around d and decode it. */
static int decode(const struct ipc_kvmap *d)
{
	uint8_t buf[IPC_HDR_BYTES + sizeof(*d)];
	struct iovec iov = { (void *)d, sizeof(*d) };
	struct ipc_frame f = { 0 };
	struct ipc_kvmap out;

	assert_int_equal(ipc_frame_build(buf, sizeof(buf), IPC_MSG_KVMAP_REPLY, 0, 7, &iov, 1), (ssize_t)sizeof(buf));
	assert_int_equal(ipc_frame_check(buf, sizeof(buf), 1, IPC_FROM_SERVER, IPC_VIA_SOCKET, &f.hdr), 0);
	f.payload = buf + IPC_HDR_BYTES;
	return ipc_decode_kvmap(&f, &out);
}

static void test_decoder_checks_the_description(void **state)
{
	struct kvmm *m = make(16, 0);
	struct ipc_kvmap d, b;
	uint8_t buf[IPC_HDR_BYTES + sizeof(d)];

	(void)state;
	kvd_kvmap_describe(m, &d);
	assert_int_equal(decode(&d), 0);
	b = d, b.page_words_offset = d.file_bytes - 4; /* page words past the end */
	assert_int_equal(decode(&b), -EINVAL);
	b = d, b.seq_offset = 3; /* misaligned */
	assert_int_equal(decode(&b), -EINVAL);
	b = d, b.word_slots_used = d.n_words;
	assert_int_equal(decode(&b), -EINVAL);
	b = d, b.n_pages = 0;
	assert_int_equal(decode(&b), -EINVAL);
	b = d, b.reserved[2] = 1;
	assert_int_equal(decode(&b), -EPROTO);
	b = d, b.words_offset = UINT64_MAX - 7; /* overflowing region */
	assert_int_equal(decode(&b), -EINVAL);
	/* exactly one fd, from the server, on the socket */
	struct iovec iov = { &d, sizeof(d) };
	assert_int_equal(ipc_frame_build(buf, sizeof(buf), IPC_MSG_KVMAP_REPLY, 0, 7, &iov, 1), (ssize_t)sizeof(buf));
	assert_int_equal(ipc_frame_check(buf, sizeof(buf), 0, IPC_FROM_SERVER, IPC_VIA_SOCKET, NULL), -EBADMSG);
	assert_int_equal(ipc_frame_check(buf, sizeof(buf), 1, IPC_FROM_CLIENT, IPC_VIA_SOCKET, NULL), -EPROTO);
	assert_null(kvmm_destroy(m));
}

/* ---- the other views' payloads: HIST_REPLY, LEDGER, LEDGER_REPLY ------------------ */

static void frame_of(uint16_t type, unsigned from, const void *p, size_t n, uint8_t *buf, struct ipc_frame *f)
{
	struct iovec iov = { (void *)p, n };

	memset(f, 0, sizeof(*f));
	assert_int_equal(ipc_frame_build(buf, IPC_MAX_FRAME_BYTES, type, 0, 9, &iov, 1), (ssize_t)(IPC_HDR_BYTES + n));
	assert_int_equal(ipc_frame_check(buf, IPC_HDR_BYTES + n, 0, from, IPC_VIA_SOCKET, &f->hdr), 0);
	f->payload = buf + IPC_HDR_BYTES;
}

static void test_hist_decoder(void **state)
{
	static uint8_t buf[IPC_MAX_FRAME_BYTES];
	struct ipc_hist_reply h = { 0 }, b, out;
	struct ipc_frame f;

	(void)state;
	h.ttft.n_bounds = h.itl.n_bounds = 3;
	for (int i = 0; i < 3; i++)
		h.ttft.bound_ns[i] = h.itl.bound_ns[i] = 1000u << i;
	h.ttft.bucket[0] = 2, h.ttft.bucket[3] = 1, h.ttft.count = 3, h.ttft.sum_ns = 12345;
	frame_of(IPC_MSG_HIST_REPLY, IPC_FROM_SERVER, &h, sizeof(h), buf, &f);
	assert_int_equal(ipc_decode_hist(&f, &out), 0);
	assert_memory_equal(&out, &h, sizeof(h));
	b = h, b.ttft.count = 4; /* not the sum of the buckets */
	frame_of(IPC_MSG_HIST_REPLY, IPC_FROM_SERVER, &b, sizeof(b), buf, &f);
	assert_int_equal(ipc_decode_hist(&f, &out), -EINVAL);
	b = h, b.itl.bound_ns[2] = b.itl.bound_ns[1]; /* not increasing */
	frame_of(IPC_MSG_HIST_REPLY, IPC_FROM_SERVER, &b, sizeof(b), buf, &f);
	assert_int_equal(ipc_decode_hist(&f, &out), -EINVAL);
	b = h, b.ttft.bucket[5] = 1, b.ttft.count = 4; /* a bucket past the last bound's +Inf */
	frame_of(IPC_MSG_HIST_REPLY, IPC_FROM_SERVER, &b, sizeof(b), buf, &f);
	assert_int_equal(ipc_decode_hist(&f, &out), -EINVAL);
	b = h, b.itl.n_bounds = IPC_HIST_MAX_BOUNDS + 1;
	frame_of(IPC_MSG_HIST_REPLY, IPC_FROM_SERVER, &b, sizeof(b), buf, &f);
	assert_int_equal(ipc_decode_hist(&f, &out), -EINVAL);
	b = h, b.reserved[0] = 1;
	frame_of(IPC_MSG_HIST_REPLY, IPC_FROM_SERVER, &b, sizeof(b), buf, &f);
	assert_int_equal(ipc_decode_hist(&f, &out), -EPROTO);
}

/* A LEDGER_REPLY payload of the given records (n_total = n). */
static size_t ledger_payload(uint8_t *p, const char *const *lines, uint32_t n)
{
	struct ipc_ledger_reply r = { n, n };
	size_t off = sizeof(r);

	memcpy(p, &r, sizeof(r));
	for (uint32_t i = 0; i < n; i++) {
		uint32_t uid = 1000 + i, len = (uint32_t)strlen(lines[i]);
		memcpy(p + off, &uid, 4);
		memcpy(p + off + 4, &len, 4);
		memcpy(p + off + 8, lines[i], len);
		memset(p + off + 8 + len, 0, ipc_ledger_record_size(len) - 8 - len);
		off += ipc_ledger_record_size(len);
	}
	return off;
}

static void test_ledger_decoders(void **state)
{
	static uint8_t buf[IPC_MAX_FRAME_BYTES], p[4096];
	const char *lines[] = { "{\"a\":1}", "{\"request_id\":22}" }, *bad[] = { "{\n}" };
	struct ipc_ledger_reply_msg m;
	struct ipc_ledger_record rec;
	struct ipc_ledger_req q = { .max_records = 5 }, qo;
	struct ipc_frame f;
	size_t n, off = 0;

	(void)state;
	n = ledger_payload(p, lines, 2);
	frame_of(IPC_MSG_LEDGER_REPLY, IPC_FROM_SERVER, p, n, buf, &f);
	assert_int_equal(ipc_decode_ledger_reply(&f, &m), 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(ipc_ledger_record_next(&m, &off, &rec), 1);
		assert_int_equal(rec.uid, 1000 + i);
		assert_int_equal(rec.bytes, strlen(lines[i]));
		assert_memory_equal(rec.json, lines[i], rec.bytes);
	}
	assert_int_equal(ipc_ledger_record_next(&m, &off, &rec), 0);
	/* one record fewer than announced in this frame */
	frame_of(IPC_MSG_LEDGER_REPLY, IPC_FROM_SERVER, p, n - ipc_ledger_record_size((uint32_t)strlen(lines[1])), buf,
		 &f);
	assert_int_equal(ipc_decode_ledger_reply(&f, &m), -EBADMSG);
	/* a length running past the frame */
	n = ledger_payload(p, lines, 1);
	frame_of(IPC_MSG_LEDGER_REPLY, IPC_FROM_SERVER, p, n - 8, buf, &f);
	assert_int_equal(ipc_decode_ledger_reply(&f, &m), -EBADMSG);
	/* non-zero padding */
	p[8 + 8 + strlen(lines[0])] = 'x';
	frame_of(IPC_MSG_LEDGER_REPLY, IPC_FROM_SERVER, p, n, buf, &f);
	assert_int_equal(ipc_decode_ledger_reply(&f, &m), -EPROTO);
	/* a newline inside a record */
	n = ledger_payload(p, bad, 1);
	frame_of(IPC_MSG_LEDGER_REPLY, IPC_FROM_SERVER, p, n, buf, &f);
	assert_int_equal(ipc_decode_ledger_reply(&f, &m), -EINVAL);
	/* the request */
	frame_of(IPC_MSG_LEDGER, IPC_FROM_CLIENT, &q, sizeof(q), buf, &f);
	assert_int_equal(ipc_decode_ledger_req(&f, &qo), 0);
	assert_int_equal(qo.max_records, 5);
	q.max_records = IPC_LEDGER_MAX_RECORDS + 1;
	frame_of(IPC_MSG_LEDGER, IPC_FROM_CLIENT, &q, sizeof(q), buf, &f);
	assert_int_equal(ipc_decode_ledger_req(&f, &qo), -E2BIG);
	q = (struct ipc_ledger_req){ .flags = 1 };
	frame_of(IPC_MSG_LEDGER, IPC_FROM_CLIENT, &q, sizeof(q), buf, &f);
	assert_int_equal(ipc_decode_ledger_req(&f, &qo), -EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fd_is_read_only_for_receivers),
		cmocka_unit_test(test_snapshot_in_child_matches_owner),
		cmocka_unit_test(test_snapshots_while_the_pool_changes),
		cmocka_unit_test(test_reader_waits_out_the_lock),
		cmocka_unit_test(test_device_pool),
		cmocka_unit_test(test_reader_refuses_what_does_not_fit),
		cmocka_unit_test(test_decoder_checks_the_description),
		cmocka_unit_test(test_hist_decoder),
		cmocka_unit_test(test_ledger_decoders),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
