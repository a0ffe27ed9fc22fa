/*
 * daemon/hist.c — fixed-bucket latency histograms (see hist.h).
 */
#include "hist.h"

/* Prometheus-style 1-2.5-5 steps, from what a GPU's decode step takes to a
 * long prompt's prefill on a slow CPU. */
const uint64_t kvd_hist_bounds_ns[KVD_HIST_BOUNDS] = {
	250000ull,     500000ull,     1000000ull,    2500000ull,    5000000ull,     10000000ull,
	25000000ull,   50000000ull,   100000000ull,  250000000ull,  500000000ull,   1000000000ull,
	2500000000ull, 5000000000ull, 10000000000ull, 25000000000ull, 60000000000ull,
};

void kvd_hist_add(struct kvd_hist *h, uint64_t ns)
{
	unsigned i = 0;

	while (i < KVD_HIST_BOUNDS && ns > kvd_hist_bounds_ns[i])
		i++;
	h->bucket[i]++;
	h->count++;
	h->sum_ns += ns;
}
