/*
 * daemon/model/grammar_sample.c — kvd_gram_sample (sampler.h): the greedy
 * check-first fast path and the masked draw.
 */
#include "grammar.h"
#include "sampler.h"

#include <errno.h>
#include <string.h>

int kvd_gram_sample(struct kvd_sampler *smp, const float *logits, const int32_t *history, size_t n_history,
		    const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *scr,
		    const struct kvd_gram_state *st, uint32_t *mask, size_t mask_words, int32_t *ret_token,
		    int *ret_fast)
{
	size_t vw = kvd_gram_vocab_mask_words(v);
	int r;

	if (ret_fast)
		*ret_fast = 0;
	if (kvd_sampler_is_greedy(smp)) {
		/* exact: see the header; greedy consumes no random numbers */
		int32_t t = kvd_sampler_sample(smp, logits, history, n_history);
		r = kvd_gram_check(g, v, scr, st, t);
		if (r < 0)
			return r;
		if (r == 1) {
			if (ret_fast)
				*ret_fast = 1;
			*ret_token = t;
			return 0;
		}
	}
	if (mask_words < vw)
		return -EINVAL;
	r = kvd_gram_allowed_mask(g, v, scr, st, mask);
	if (r < 0)
		return r;
	if (r == 0)
		return -ENOENT;
	if (mask_words > vw)
		memset(mask + vw, 0, (mask_words - vw) * sizeof(*mask));
	/* the vocabulary's last word may have bits past its tokens: they are 0 */
	*ret_token = kvd_sampler_sample_masked(smp, logits, history, n_history, mask);
	return 0;
}
