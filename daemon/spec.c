/*
 * daemon/spec.c — prompt-lookup drafting for speculative decoding
 * (spec.h). The search walks back from the most recent candidate: the
 * latest occurrence of the n-gram is the one most likely to continue the
 * way the sequence goes now (the span being copied). A step's cost is
 * O(KVD_SPEC_LOOKBACK * min_match) comparisons at most, next to a forward
 * pass that reads every weight.
 */
#include "spec.h"

#include <string.h>

uint32_t kvd_spec_draft(const int32_t *toks, uint32_t n, uint32_t min_match, uint32_t max_draft, int32_t *draft)
{
	if (!min_match || !max_draft || n <= min_match)
		return 0;
	const int32_t *key = toks + n - min_match;
	uint32_t lo = n > KVD_SPEC_LOOKBACK ? n - KVD_SPEC_LOOKBACK : 0;

	/* candidate starts i: the match toks[i, i + min_match) ends before
	 * the key starts overlapping its own end, so a draft follows it */
	for (uint32_t i = n - min_match; i-- > lo;) {
		if (toks[i] != key[0] || memcmp(toks + i, key, min_match * sizeof(*toks)) != 0)
			continue;
		uint32_t from = i + min_match, k = n - from;
		if (k > max_draft)
			k = max_draft;
		memcpy(draft, toks + from, k * sizeof(*draft));
		return k;
	}
	return 0;
}
