/*
 * daemon/model/grammar_sample.c — kvd_gram_sample (sampler.h): the
 * check-first fast paths (greedy's argmax, seeded top-k's candidates) and
 * the masked draw.
 */
#include "grammar.h"
#include "sampler.h"

#include <errno.h>
#include <string.h>

struct check_ctx {
	const struct kvd_grammar *g;
	const struct kvd_gram_vocab *v;
	struct kvd_gram_scratch *scr;
	const struct kvd_gram_state *st;
};

static int check_cb(void *ud, int32_t token)
{
	const struct check_ctx *c = ud;
	if (token >= kvd_gram_vocab_n_tokens(c->v))
		return 0; /* past the vocabulary: never allowed */
	return kvd_gram_check(c->g, c->v, c->scr, c->st, token);
}

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
	{
		/* exact: see kvd_sampler_sample_checked (greedy: the next best
		 * candidates in order); nothing drawn when it cannot say */
		struct check_ctx c = { g, v, scr, st };
		int32_t t;
		r = kvd_sampler_sample_checked(smp, logits, history, n_history, check_cb, &c, &t);
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
