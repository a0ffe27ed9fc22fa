/*
 * kernels/cpu/threadpool.h — the CPU backend's persistent worker threads.
 *
 * tp_for() runs fn(arg, i, tid) for every i in [0, n) on the pool's threads
 * (the caller takes part) and returns when all n calls have finished. tid is
 * the index of the thread making the call, for per-thread scratch. Each
 * thread claims the chunks of its own contiguous share of [0, n) in order,
 * then what is left of the others' shares, so a thread the OS does not
 * schedule delays nothing: the others take its share. Dispatch and join spin briefly
 * and then sleep on a futex, so back-to-back parallel regions (a few hundred
 * per decoded token) cost about a microsecond each while an idle pool costs
 * no CPU.
 *
 * tp_run() is tp_for() with one chunk per thread: fn(arg, ith, nth) for
 * ith in [0, nth), each ith run exactly once (by whichever thread claims it,
 * so per-ith scratch stays private to the call).
 *
 * One thread drives a pool; tp_run is not reentrant.
 */
#ifndef KVD_CPU_THREADPOOL_H
#define KVD_CPU_THREADPOOL_H

#include <stdint.h>

struct tp;
typedef void (*tp_fn)(void *arg, int ith, int nth);
typedef void (*tp_for_fn)(void *arg, uint32_t i, int tid);

/* n_threads >= 1. Returns 0 or -errno. */
int tp_create(int n_threads, struct tp **ret);
/* Stops and joins the workers; accepts NULL; returns NULL. */
struct tp *tp_destroy(struct tp *p);
int tp_size(const struct tp *p);
void tp_run(struct tp *p, tp_fn fn, void *arg);
void tp_for(struct tp *p, tp_for_fn fn, void *arg, uint32_t n);

#endif
