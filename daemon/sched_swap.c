/*
 * daemon/sched_swap.c — the scheduler's side of swap I/O failures: kvmm's
 * incident reports charged to the request they hit, logged once, and the
 * recompute that follows counted as a fallback.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kvmm.h"
#include "log.h"
#include "sched_impl.h"

/* kvmm's report of a swap operation whose transfers failed: charge it to
 * the request whose sequence it was (or whose prefix was being read back),
 * and log it, once. Every such failure of a sequence's swap-out or swap-in
 * ends in recomputing its KV (preempt(), resume_swapped()), and a failed
 * promotion leaves the prefix pages from the failure on to the request's
 * prefill: both are what the log line promises. A failed demotion only
 * leaves cached pages in memory (demote_ahead() counts it). */
void sched_on_swap_error(void *ud, const struct kvmm_swap_incident *inc)
{
	struct kvd_sched *s = ud;
	struct req *r = NULL;
	const char *what, *then;
	char cause[96];

	s->st.swap_incidents++;
	for (size_t i = 0; inc->seq >= 0 && i < s->n_reqs; i++)
		if (s->reqs[i]->has_seq && s->reqs[i]->seq == (uint32_t)inc->seq)
			r = s->reqs[i];
	if (inc->what == KVMM_SWAP_PROMOTE && s->attaching) {
		r = s->attaching; /* recomputed in its prefill: a fallback already */
		r->res.swap_fallback_recomputes++;
		s->st.swap_fallback_recomputes++;
	} else if (r) {
		r->swap_failed = 1; /* preempt() or resume_swapped() counts the fallback */
	}
	if (r)
		r->res.swap_errors += inc->pages_failed;
	switch (inc->what) {
	case KVMM_SWAP_SEQ_OUT:
		what = "writing a preempted request's KV to the swap file";
		then = "its KV is dropped and will be recomputed";
		break;
	case KVMM_SWAP_SEQ_IN:
		what = "reading a preempted request's KV back from the swap file";
		then = "its KV will be recomputed";
		break;
	case KVMM_SWAP_PROMOTE:
		what = "reading cached prefix pages back from the swap file";
		then = "they will be recomputed";
		break;
	default:
		what = "writing cached prefix pages to the swap file";
		then = "they stay in memory";
		break;
	}
	if (inc->what == KVMM_SWAP_DEMOTE) {
		/* tried again every step: one line until a demotion works again */
		if (s->demote_failing)
			return;
		s->demote_failing = 1;
		then = "they stay in memory (further demotion failures are not logged until one succeeds)";
	}
	if (inc->short_transfers == inc->pages_failed)
		snprintf(cause, sizeof(cause), "short %s", inc->op == KVMM_IO_READ ? "read" : "write");
	else
		snprintf(cause, sizeof(cause), "%s", strerror(-inc->error));
	log_warning("swap I/O error: %s failed for %u of %u pages (%s); %s [incident %" PRIu64 "]", what,
		    inc->pages_failed, inc->pages, cause, then, s->st.swap_incidents);
}

/* After a failed swap-out or swap-in: when kvmm reported an I/O error for
 * r's sequence, the recompute that follows is a fallback; count it. */
void sched_count_fallback(struct kvd_sched *s, struct req *r)
{
	if (!r->swap_failed)
		return;
	r->swap_failed = 0;
	r->res.swap_fallback_recomputes++;
	s->st.swap_fallback_recomputes++;
}
