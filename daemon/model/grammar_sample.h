/*
 * daemon/model/grammar_sample.h — sampling under a constraint: the step
 * that joins the sampler (sampler.h) and the grammar matcher (grammar.h).
 *
 * A constrained sequence draws exactly what its sampler would draw from
 * logits with every token the constraint does not allow at -inf. The
 * allowed set is a bitmap over the vocabulary; computing it walks the
 * vocabulary's prefix tree, so it is avoided where that is exact:
 *
 *  - greedy (temperature 0 or top_k 1): the argmax over the allowed tokens
 *    is the unconstrained argmax whenever that token is allowed, so the
 *    sampler picks first and kvd_gram_check (cost: one token's bytes)
 *    confirms it; only when it is refused is the mask built and the
 *    argmax taken over it. No random numbers are drawn either way.
 *  - seeded sampling: always the mask. A draw picks the token at which the
 *    cumulative mass of the truncated, renormalised candidates passes
 *    u * total; removing a disallowed token changes the top-k set (others
 *    move in), the top-p mass it is cut against and min-p's p_max, and so
 *    the total and every cumulative position after it. The token the
 *    unmasked draw picked can then differ from the masked draw's even
 *    when it is allowed, so checking it would not be exact. (It would be
 *    only when every candidate of the unmasked top-k set is allowed —
 *    rare under a grammar, and with top-k off that set is the whole
 *    vocabulary.) The one uniform draw is consumed as the unmasked path
 *    consumes it, so a sequence's RNG stream does not depend on the mask.
 *
 * Functions here keep no state; the caller owns the sampler, scratch,
 * state and mask buffer (one sequence's, or the scheduler's for the step).
 */
#ifndef KVD_GRAMMAR_SAMPLE_H
#define KVD_GRAMMAR_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "sampler.h"

/*
 * Draw the next token of a sequence whose constraint is at st. mask is the
 * caller's buffer of mask_words words, at least (n_vocab + 31) / 32 for the
 * sampler's n_vocab and at least kvd_gram_vocab_mask_words(v) (ids past the
 * vocabulary's are never allowed). *ret_fast (may be NULL) says whether the
 * greedy check answered without a mask. Returns 0 with *ret_token, -ENOENT
 * when the constraint allows no token at all (stuck: the caller ends the
 * sequence), -ENOMEM.
 */
int kvd_gram_sample(struct kvd_sampler *smp, const float *logits, const int32_t *history, size_t n_history,
		    const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *scr,
		    const struct kvd_gram_state *st, uint32_t *mask, size_t mask_words, int32_t *ret_token,
		    int *ret_fast);

#endif
