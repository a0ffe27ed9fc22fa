/*
 * kernels/cpu/threadpool.h — the CPU backend's persistent worker threads.
 *
 * tp_run() runs fn(arg, ith, nth) on every thread of the pool (the calling
 * thread is thread 0) and returns when all have finished. Dispatch and join
 * spin briefly and then sleep on a futex, so back-to-back parallel regions
 * (a few hundred per decoded token) cost about a microsecond each while an
 * idle pool costs no CPU.
 *
 * One thread drives a pool; tp_run is not reentrant.
 */
#ifndef KVD_CPU_THREADPOOL_H
#define KVD_CPU_THREADPOOL_H

struct tp;
typedef void (*tp_fn)(void *arg, int ith, int nth);

/* n_threads >= 1. Returns 0 or -errno. */
int tp_create(int n_threads, struct tp **ret);
/* Stops and joins the workers; accepts NULL; returns NULL. */
struct tp *tp_destroy(struct tp *p);
int tp_size(const struct tp *p);
void tp_run(struct tp *p, tp_fn fn, void *arg);

#endif
