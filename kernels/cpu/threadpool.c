/*
 * kernels/cpu/threadpool.c — persistent workers sharing out chunks of work.
 *
 * A job is n chunks, cut into one contiguous range per thread (slot s:
 * chunks [s n / nth, (s + 1) n / nth)). Each slot has its own claim word
 * (generation << 32 | next chunk of the range) on its own cache line.
 * Every thread takes chunks by compare-and-swap from its own slot first,
 * in order, then from the others' (thread tid tries slots tid, tid + 1,
 * ... wrapping), and adds the number of chunks it ran to `done` once, when
 * it finds none left anywhere. So a thread runs, as long as nothing holds
 * it up, one contiguous run of chunks (for a matrix product: one stream of
 * weights, whose prefetches carry on from chunk to chunk) with claims that
 * stay in its own cache; the ends of the ranges are shared out as the
 * threads get there. The driver returns when done == n. It never waits for
 * a worker that has not woken up: if the OS does not schedule a worker,
 * the driver (and any other worker) simply takes its chunks. On a machine
 * shared with other loads this turns a preempted thread from a stall of a
 * whole time slice per step into, at worst, one chunk's delay.
 *
 * Publishing a job (driver):
 *   1. every slot's claim = (g << 32) | EXHAUSTED (release) — no chunk of
 *      the old or new job can be taken while the job's fields change;
 *   2. write fn, arg, n (relaxed atomics);
 *   3. done = 0; every slot's claim = (g << 32) | its first chunk
 *      (release) — the job is open;
 *   4. gen = g (seq_cst), futex wake if a worker sleeps.
 * Taking a chunk (anyone): load a slot's claim (acquire); if its low half
 * is a chunk index below the slot's end for the job's n, read fn/arg and
 * CAS the claim to index + 1. A successful CAS proves the job was still
 * open, hence that the fields read after the acquire load belong to it
 * (they only change after step 1 of the next job, which would have made
 * the CAS fail). The job cannot close before a thread's chunks are
 * counted, so all the chunks one call of work() runs belong to one job
 * (a thread that has run none may find the next job open in a later slot
 * and run that job's chunks: they are its only ones). The count is added
 * with release order; the driver's acquire load of done == n makes every
 * chunk's writes visible to it.
 */
#include "backend.h"
#include "threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TP_SPIN_ITERS 2000
#define TP_EXHAUSTED 0xffffffffu

struct tp_worker {
	struct tp *pool;
	int ith;
	pthread_t thread;
};

/* one thread's range of the open job */
struct tp_slot {
	_Alignas(64) _Atomic uint64_t claim; /* generation << 32 | next chunk */
};

struct tp {
	int n;
	struct tp_worker *workers;
	struct tp_slot *slots;     /* n of them */
	uint32_t next_gen;         /* driver only */
	/* the job, read together by whoever takes a chunk */
	_Alignas(64) _Atomic(tp_for_fn) fn;
	_Atomic(void *) arg;
	_Atomic uint32_t n_chunks;
	/* each thread adds the chunks it ran once, when it finds none left */
	_Alignas(64) _Atomic uint32_t done; /* futex word */
	_Atomic uint32_t driver_sleeping;
	/* read in a loop by idle workers: written once per job */
	_Alignas(64) _Atomic uint32_t gen; /* futex word workers sleep on */
	_Atomic uint32_t sleepers;         /* workers inside (or entering) futex_wait */
	_Atomic int stop;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* the first chunk of slot s of a job of n chunks over nth slots */
static inline uint32_t slot_start(int s, uint32_t n, int nth)
{
	return (uint32_t)((uint64_t)n * (uint64_t)s / (uint64_t)nth);
}

/* Take and run chunks of the open job until none is left. tid: the
 * calling thread's index. */
static void work(struct tp *p, int tid)
{
	uint32_t ran = 0, n = 0;

	for (int k = 0; k < p->n; k++) {
		int s = tid + k < p->n ? tid + k : tid + k - p->n;
		_Atomic uint64_t *claim = &p->slots[s].claim;
		for (;;) {
			uint64_t c = atomic_load_explicit(claim, memory_order_acquire);
			uint32_t idx = (uint32_t)c;
			if (idx == TP_EXHAUSTED)
				break;
			uint32_t nc = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
			if (idx >= slot_start(s + 1, nc, p->n))
				break;
			tp_for_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
			void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
			if (!atomic_compare_exchange_weak_explicit(claim, &c, c + 1, memory_order_acq_rel,
								   memory_order_relaxed))
				continue;
			/* the CAS proved nc is this job's: every chunk this
			 * call runs belongs to one job, which stays open
			 * until they are counted */
			n = nc;
			fn(arg, idx, tid);
			ran++;
		}
	}
	/* seq_cst: Dekker with the driver's driver_sleeping store */
	if (ran && atomic_fetch_add_explicit(&p->done, ran, memory_order_seq_cst) + ran == n &&
	    atomic_load_explicit(&p->driver_sleeping, memory_order_seq_cst))
		futex_wake(&p->done, 1);
}

static void *tp_main(void *arg)
{
	struct tp_worker *w = arg;
	struct tp *pool = w->pool;
	uint32_t seen = 0;

	for (;;) {
		uint32_t g;
		int spins = 0;
		while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen) {
			if (++spins < TP_SPIN_ITERS) {
				cpu_relax();
			} else {
				/* Dekker with tp_for: either the driver sees
				 * sleepers > 0 and wakes us, or its gen store
				 * precedes our futex check, which then returns. */
				atomic_fetch_add_explicit(&pool->sleepers, 1, memory_order_seq_cst);
				futex_wait(&pool->gen, seen);
				atomic_fetch_sub_explicit(&pool->sleepers, 1, memory_order_relaxed);
			}
		}
		seen = g;
		if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
			return NULL;
		work(pool, w->ith);
	}
}

int tp_create(int n_threads, struct tp **ret)
{
	struct tp *p;
	int i, r;

	if (n_threads < 1)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->n = n_threads;
	p->slots = aligned_alloc(_Alignof(struct tp_slot), (size_t)n_threads * sizeof(*p->slots));
	p->workers = calloc((size_t)n_threads, sizeof(*p->workers));
	if (!p->workers || !p->slots) {
		free(p->workers);
		free(p->slots);
		free(p);
		return -ENOMEM;
	}
	for (i = 0; i < n_threads; i++)
		atomic_init(&p->slots[i].claim, TP_EXHAUSTED);
	for (i = 1; i < n_threads; i++) {
		p->workers[i].pool = p;
		p->workers[i].ith = i;
		r = pthread_create(&p->workers[i].thread, NULL, tp_main, &p->workers[i]);
		if (r) {
			p->n = i; /* join only those started */
			tp_destroy(p);
			return -r;
		}
	}
	*ret = p;
	return 0;
}

struct tp *tp_destroy(struct tp *p)
{
	int i;

	if (!p)
		return NULL;
	atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_seq_cst);
	futex_wake(&p->gen, INT_MAX);
	for (i = 1; i < p->n; i++)
		pthread_join(p->workers[i].thread, NULL);
	free(p->workers);
	free(p->slots);
	free(p);
	return NULL;
}

int tp_size(const struct tp *p)
{
	return p->n;
}

void tp_for(struct tp *p, tp_for_fn fn, void *arg, uint32_t n)
{
	uint32_t d;
	int spins = 0;

	if (n == 0)
		return;
	if (p->n == 1 || n == 1) {
		for (uint32_t i = 0; i < n; i++)
			fn(arg, i, 0);
		return;
	}
	uint64_t g = ++p->next_gen;
	for (int s = 0; s < p->n; s++)
		atomic_store_explicit(&p->slots[s].claim, g << 32 | TP_EXHAUSTED, memory_order_release);
	atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
	atomic_store_explicit(&p->n_chunks, n, memory_order_relaxed);
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	for (int s = 0; s < p->n; s++)
		atomic_store_explicit(&p->slots[s].claim, g << 32 | slot_start(s, n, p->n), memory_order_release);
	atomic_store_explicit(&p->gen, (uint32_t)g, memory_order_seq_cst);
	if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst))
		futex_wake(&p->gen, INT_MAX);
	work(p, 0);
	while ((d = atomic_load_explicit(&p->done, memory_order_acquire)) != n) {
		if (++spins < TP_SPIN_ITERS) {
			cpu_relax();
			continue;
		}
		atomic_store_explicit(&p->driver_sleeping, 1, memory_order_seq_cst);
		d = atomic_load_explicit(&p->done, memory_order_seq_cst);
		if (d != n)
			futex_wait(&p->done, d);
		atomic_store_explicit(&p->driver_sleeping, 0, memory_order_relaxed);
	}
	/* close the job so late workers find nothing to take */
	for (int s = 0; s < p->n; s++)
		atomic_store_explicit(&p->slots[s].claim, g << 32 | TP_EXHAUSTED, memory_order_release);
}

struct run_adapter {
	tp_fn fn;
	void *arg;
	int nth;
};

static void run_chunk(void *arg, uint32_t i, int tid)
{
	const struct run_adapter *a = arg;
	(void)tid;
	a->fn(a->arg, (int)i, a->nth);
}

void tp_run(struct tp *p, tp_fn fn, void *arg)
{
	struct run_adapter a = {fn, arg, p->n};
	tp_for(p, run_chunk, &a, (uint32_t)p->n);
}

/* kernels/backend.h's host pool is this pool. */
int kvd_pool_create(int n_threads, struct kvd_pool **ret)
{
	return tp_create(n_threads, (struct tp **)ret);
}

struct kvd_pool *kvd_pool_destroy(struct kvd_pool *p)
{
	return (struct kvd_pool *)tp_destroy((struct tp *)p);
}

int kvd_pool_size(const struct kvd_pool *p)
{
	return tp_size((const struct tp *)p);
}

void kvd_pool_for(struct kvd_pool *p, kvd_pool_fn fn, void *arg, uint32_t n)
{
	tp_for((struct tp *)p, fn, arg, n);
}
