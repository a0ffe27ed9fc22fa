/*
 * kernels/cpu/threadpool.c — persistent workers woken by a generation
 * counter.
 *
 * The driver publishes (fn, arg), then increments `gen` with release order;
 * a worker that observes the new generation with acquire order therefore
 * sees fn and arg. Each worker decrements `pending` (acq_rel) when done; the
 * driver's acquire load of pending == 0 makes all workers' writes visible
 * to it. Waiters spin for a bounded time, then sleep on the futex word.
 */
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

struct tp_worker {
	struct tp *pool;
	int ith;
	pthread_t thread;
};

struct tp {
	int n;
	struct tp_worker *workers;
	tp_fn fn;
	void *arg;
	_Atomic uint32_t gen;      /* futex word workers sleep on */
	_Atomic uint32_t pending;  /* workers still running the current job */
	_Atomic uint32_t driver_sleeping; /* futex word the driver sleeps on */
	_Atomic uint32_t sleepers; /* workers inside (or entering) futex_wait */
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

static void *tp_main(void *p)
{
	struct tp_worker *w = p;
	struct tp *pool = w->pool;
	uint32_t seen = 0;

	for (;;) {
		uint32_t g;
		int spins = 0;
		/* Acquire: pairs with the driver's release increment of gen, so
		 * fn, arg and stop written before it are visible here. */
		while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen) {
			if (++spins < TP_SPIN_ITERS)
				cpu_relax();
			else {
				/* Dekker with tp_run: either the driver sees
				 * sleepers > 0 and wakes us, or its gen increment
				 * precedes our futex check, which then returns. */
				atomic_fetch_add_explicit(&pool->sleepers, 1, memory_order_seq_cst);
				futex_wait(&pool->gen, seen);
				atomic_fetch_sub_explicit(&pool->sleepers, 1, memory_order_relaxed);
			}
		}
		seen = g;
		if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
			return NULL;
		pool->fn(pool->arg, w->ith, pool->n);
		/* Our writes happen-before the driver's acquire of pending == 0.
		 * seq_cst pairs with the driver's store of driver_sleeping
		 * (Dekker): it either sees our decrement or we see its flag. */
		if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_seq_cst) == 1 &&
		    atomic_load_explicit(&pool->driver_sleeping, memory_order_seq_cst))
			futex_wake(&pool->pending, 1);
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
	p->workers = calloc((size_t)n_threads, sizeof(*p->workers));
	if (!p->workers) {
		free(p);
		return -ENOMEM;
	}
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
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	futex_wake(&p->gen, INT_MAX);
	for (i = 1; i < p->n; i++)
		pthread_join(p->workers[i].thread, NULL);
	free(p->workers);
	free(p);
	return NULL;
}

int tp_size(const struct tp *p)
{
	return p->n;
}

void tp_run(struct tp *p, tp_fn fn, void *arg)
{
	uint32_t left;
	int spins = 0;

	if (p->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	p->fn = fn;
	p->arg = arg;
	atomic_store_explicit(&p->pending, (uint32_t)(p->n - 1), memory_order_relaxed);
	/* Publishes fn, arg and pending to workers that acquire gen; seq_cst
	 * for the Dekker pairing with a worker going to sleep. */
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst))
		futex_wake(&p->gen, INT_MAX);
	fn(arg, 0, p->n);
	while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0) {
		if (++spins < TP_SPIN_ITERS) {
			cpu_relax();
			continue;
		}
		atomic_store_explicit(&p->driver_sleeping, 1, memory_order_seq_cst);
		/* Re-check after announcing sleep: a worker that finished in
		 * between saw driver_sleeping == 0 and did not wake us. */
		left = atomic_load_explicit(&p->pending, memory_order_seq_cst);
		if (left)
			futex_wait(&p->pending, left);
		atomic_store_explicit(&p->driver_sleeping, 0, memory_order_relaxed);
	}
}
