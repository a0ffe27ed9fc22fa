/*
 * daemon/hist.h — fixed-bucket latency histograms (time to first token,
 * inter-token latency), the shape Prometheus scrapes: a count per bucket,
 * the number of samples and their sum. Bounds are the same for every
 * histogram and every daemon, so scrapes of different runs compare.
 */
#ifndef KVD_HIST_H
#define KVD_HIST_H

#include <stdint.h>

#define KVD_HIST_BOUNDS 17 /* finite upper bounds; one more bucket above them */

/* The upper bounds in ns, increasing: 0.25 ms .. 60 s. */
extern const uint64_t kvd_hist_bounds_ns[KVD_HIST_BOUNDS];

struct kvd_hist {
	uint64_t count;
	uint64_t sum_ns;
	uint64_t bucket[KVD_HIST_BOUNDS + 1]; /* bucket[i]: (bound[i-1], bound[i]]; the last: above all */
};

/* Count one sample of ns nanoseconds. */
void kvd_hist_add(struct kvd_hist *h, uint64_t ns);

#endif
