/*
 * kvmm/hibernate_io.c — the page writes of a hibernation save
 * (kvmm_hib_save in hibernate.c): the pages go to the file through io_uring,
 * up to HIB_QUEUE_DEPTH in flight, while helper threads take the checksums
 * the pages lack beside the writes, so neither waits for the other (the
 * slower of the two sets the pace; on a machine with idle cores, the
 * writes). Pages indexed in this run carry theirs already (kvmm_page.sum),
 * so usually nothing is left to hash.
 */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvmm_impl.h"

#define HIB_HASH_THREADS_MAX 8

/* The checksums the pages lack (todo[0 .. n_todo), ascending request
 * numbers), taken by helper threads while the owner thread writes (the
 * pages are only read, by the device and by them): handing out todo
 * entries in order, so once `limit` is lowered to the requests written and
 * every helper is joined, the sums of all todo requests below it are there. */
struct hash_job {
	const struct iovec *iov;
	size_t bytes;
	uint64_t *sums;
	const uint32_t *todo;
	uint32_t n_todo;
	_Atomic uint32_t next;  /* the next todo entry to take */
	_Atomic uint32_t limit; /* requests to hash below: n, lowered to those written */
	pthread_t tid[HIB_HASH_THREADS_MAX];
	uint32_t n_threads;
};

static void *hash_run(void *arg)
{
	struct hash_job *j = arg;

	for (;;) {
		/* Relaxed: each entry goes to one taker only; the join orders
		 * the sums for the owner thread. */
		uint32_t k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed), i;

		if (k >= j->n_todo)
			break;
		i = j->todo[k];
		if (i >= atomic_load_explicit(&j->limit, memory_order_relaxed))
			break;
		j->sums[i] = hib_sum(j->iov[i].iov_base, j->bytes);
	}
	return NULL;
}

/* Start helpers (fewer, or none, when threads cannot be made: the owner
 * thread then hashes everything in hash_finish). */
static void hash_start(struct hash_job *j, const struct iovec *iov, size_t bytes, uint64_t *sums, const uint32_t *todo,
		       uint32_t n_todo, uint32_t n)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t want = cpus > 1 ? (uint32_t)(cpus - 1) : 1;

	if (want > HIB_HASH_THREADS_MAX)
		want = HIB_HASH_THREADS_MAX;
	if (want > n_todo / 4)
		want = n_todo / 4; /* a few pages: not worth a thread */
	j->iov = iov;
	j->bytes = bytes;
	j->sums = sums;
	j->todo = todo;
	j->n_todo = n_todo;
	atomic_init(&j->next, 0);
	atomic_init(&j->limit, n);
	j->n_threads = 0;
	while (j->n_threads < want && pthread_create(&j->tid[j->n_threads], NULL, hash_run, j) == 0)
		j->n_threads++;
}

/* Only the requests below `written` are needed now: help hash them, join. */
static void hash_finish(struct hash_job *j, uint32_t written)
{
	atomic_store_explicit(&j->limit, written, memory_order_relaxed);
	hash_run(j);
	for (uint32_t t = 0; t < j->n_threads; t++)
		pthread_join(j->tid[t], NULL);
}

/* Reap the completions there are, after waiting for one: ok[i] for each
 * write done in full, the first error in *err. Returns how many were
 * reaped, or the wait's error. */
static int reap(struct io_uring *ring, const struct iovec *iov, uint32_t n, uint8_t *ok, int *err)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	int r = io_uring_submit_and_wait(ring, 1);

	if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
		return r;
	io_uring_for_each_cqe(ring, head, cqe) {
		uint64_t i = io_uring_cqe_get_data64(cqe);

		if (i < n && cqe->res == (int)iov[i].iov_len)
			ok[i] = 1;
		else if (i < n && !*err)
			*err = cqe->res < 0 ? cqe->res : -EIO;
		seen++;
	}
	io_uring_cq_advance(ring, seen);
	return (int)seen;
}

/*
 * Write the n requests (any order, up to HIB_QUEUE_DEPTH in flight);
 * submission stops once deadline_ns passes (0: none). Meanwhile helper
 * threads take the checksums of the pages that have none yet (sums[todo[k]],
 * over sum_bytes), so the writes never wait for the hashing: whichever of
 * the two is slower sets the pace. Returns how many of the first requests
 * completed in full, one after another; their checksums are in sums[].
 */
uint32_t hib_write_pages(struct io_uring *ring, int fd, const struct iovec *iov, const uint64_t *off, uint32_t n,
			 uint64_t deadline_ns, size_t sum_bytes, uint64_t *sums, const uint32_t *todo, uint32_t n_todo,
			 int *ret_err)
{
	uint8_t *ok = calloc(n ? n : 1, 1);
	uint32_t next = 0, inflight = 0, good = 0;
	struct hash_job job;
	bool stop = false;

	*ret_err = 0;
	if (!ok) {
		*ret_err = -ENOMEM;
		return 0;
	}
	hash_start(&job, iov, sum_bytes, sums, todo, n_todo, n);
	while (inflight || (next < n && !stop)) {
		uint32_t queued = 0;
		int r;

		if (deadline_ns && kvmm_now_ns() >= deadline_ns)
			stop = true;
		while (!stop && next < n && inflight < HIB_QUEUE_DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

			if (!sqe)
				break;
			io_uring_prep_write(sqe, fd, iov[next].iov_base, (unsigned)iov[next].iov_len, off[next]);
			io_uring_sqe_set_data64(sqe, next);
			next++;
			inflight++;
			queued++;
		}
		if (!inflight)
			break; /* the deadline passed before anything more was queued */
		r = reap(ring, iov, n, ok, ret_err); /* submits what was queued */
		if (r < 0) {
			if (!*ret_err)
				*ret_err = r;
			break;
		}
		inflight -= (uint32_t)r;
		if (*ret_err)
			stop = true;
	}
	/* Reap what is in flight before its buffers go away. */
	while (inflight) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(ring, &cqe) != 0)
			break;
		io_uring_cqe_seen(ring, cqe);
		inflight--;
	}
	while (good < n && ok[good])
		good++;
	hash_finish(&job, good);
	free(ok);
	return good;
}
