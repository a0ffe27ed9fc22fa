/*
 * daemon/model/sampler.h — turning logits into the next token, and deciding
 * when a generation stops.
 *
 * The chain, in order: repetition penalty over the last repeat_last_n tokens
 * of the sequence, then (unless greedy) temperature, top-k, top-p, min-p, and
 * a draw from the remaining distribution with a per-sequence PRNG seeded
 * from `seed`: the same seed and the same logits give the same tokens.
 * temperature == 0 means greedy (argmax, lowest id on ties).
 *
 * Semantics, so results can be reproduced elsewhere:
 *   - repetition penalty (llama.cpp's): each distinct id among the last
 *     repeat_last_n history tokens has its logit l replaced by
 *     l > 0 ? l / repeat_penalty : l * repeat_penalty;
 *   - candidates are ordered by logit, ties by lower id; top_k == 1 is
 *     therefore exactly greedy, whatever the temperature;
 *   - top-p keeps the shortest prefix of that order whose softmax mass
 *     (over the top-k survivors, after temperature) reaches top_p;
 *   - min-p keeps tokens with p >= min_p * p_max;
 *   - the PRNG is xoshiro256** seeded through splitmix64(seed); each draw
 *     uses one 64-bit output (53 bits as a double in [0, 1)).
 * NaN logits count as -inf. Cost per token: O(n_vocab) plus
 * O(n_vocab log top_k) worst case for top-k (a heap), no allocation.
 *
 * A kvd_sampler belongs to one sequence; not thread safe.
 */
#ifndef KVD_SAMPLER_H
#define KVD_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#define KVD_SAMPLER_MAX_STOPS    8     /* stop strings per request */
#define KVD_SAMPLER_MAX_STOP_LEN 256   /* bytes per stop string */
#define KVD_SAMPLER_MAX_VOCAB    (1 << 20)

struct kvd_sampler_params {
	float temperature;    /* 0 = greedy; default 0.8 */
	int32_t top_k;        /* <= 0: off; default 40 */
	float top_p;          /* >= 1: off; default 0.95 */
	float min_p;          /* <= 0: off; default 0.05 */
	float repeat_penalty; /* 1: off; default 1.0 */
	int32_t repeat_last_n;/* tokens looked back; default 64 */
	uint64_t seed;
};

/* Fill the defaults listed above (seed 0). */
void kvd_sampler_params_default(struct kvd_sampler_params *p);
/* 0, or -EINVAL naming nothing: temperature < 0, top_p <= 0, min_p >= 1,
 * repeat_penalty <= 0, repeat_last_n < 0, and NaN in any float field are
 * rejected. */
int kvd_sampler_params_check(const struct kvd_sampler_params *p);

struct kvd_sampler;
/* NULL on out of memory (or invalid params: check them first; or n_vocab
 * outside 1 .. KVD_SAMPLER_MAX_VOCAB). Copies *p. Memory: about 12 bytes per
 * vocabulary entry. */
struct kvd_sampler *kvd_sampler_new(const struct kvd_sampler_params *p, int32_t n_vocab);
struct kvd_sampler *kvd_sampler_free(struct kvd_sampler *s);

/*
 * Pick the next token from logits[n_vocab]. `history` holds the sequence's
 * tokens so far (prompt and generated), used by the repetition penalty.
 * The logits array is not modified. History ids outside [0, n_vocab) are
 * ignored. Returns a token id in [0, n_vocab).
 */
int32_t kvd_sampler_sample(struct kvd_sampler *s, const float *logits, const int32_t *history, size_t n_history);

/*
 * The same over the allowed tokens only: mask is a bitmap over n_vocab
 * (bit i of mask[i / 32] is token i; NULL allows all). The result is
 * exactly kvd_sampler_sample's over logits with every disallowed token set
 * to -inf — same order, same truncation, the same one RNG draw when not
 * greedy — except when every allowed logit is -inf (or NaN), where the
 * lowest allowed id is returned instead of a disallowed one. Used for
 * constrained decoding (kvd_gram_sample below).
 */
int32_t kvd_sampler_sample_masked(struct kvd_sampler *s, const float *logits, const int32_t *history,
				  size_t n_history, const uint32_t *mask);
/*
 * The masked draw without the mask, where that is exact: for a sampler
 * with top-k truncation (0 < top_k < n_vocab, not greedy) the unmasked
 * top-k candidates are passed to allowed_fn (1: allowed, 0: not, < 0: an
 * error); when every one is allowed the draw goes on over them and equals
 * kvd_sampler_sample_masked's for any mask that allows them (proof in
 * sampler.c), consuming the same random number. A greedy sampler asks
 * about its best KVD_SAMPLER_GREEDY_CHECK_K candidates in order (after
 * the repetition penalty) and picks the first allowed one: the masked
 * argmax. Returns 1 with *ret_token; 0 when it cannot say (a top-k
 * candidate refused, no top-k, or none of greedy's allowed: nothing
 * drawn, the sampler as before, so the caller builds the mask and calls
 * kvd_sampler_sample_masked); or allowed_fn's negative error.
 */
#define KVD_SAMPLER_GREEDY_CHECK_K 32
int kvd_sampler_sample_checked(struct kvd_sampler *s, const float *logits, const int32_t *history,
			       size_t n_history, int (*allowed_fn)(void *ud, int32_t token), void *ud,
			       int32_t *ret_token);
/* Whether s picks the argmax (temperature 0 or top_k 1): it draws no
 * random numbers, and the likeliest token wins whatever the rest are. */
int kvd_sampler_is_greedy(const struct kvd_sampler *s);

/*
 * Parallel samples: sample i of a request seeded with `seed` uses
 * kvd_sample_seed(seed, i): seed itself for i = 0 (so sample 0 equals a
 * one-sample request with that seed), else SplitMix64's output function
 * applied to seed + i * 0x9e3779b97f4a7c15 (mod 2^64).
 */
uint64_t kvd_sample_seed(uint64_t seed, uint32_t i);

/*
 * Log-probabilities of one position: the log-softmax of the model's logits
 * as they come (before repetition penalty, temperature and truncation, like
 * OpenAI's), computed in double: logprob(id) = l[id] - (m + log sum exp(l - m)),
 * m the largest logit; NaN logits count as -inf. `token`'s value and the
 * n_top largest (by logit, ties by lower id, the sampler's order).
 */
#define KVD_LOGPROBS_MAX_TOP 20
struct kvd_logprobs {
	int32_t token;
	float logprob;
	uint32_t n_top;
	int32_t top_id[KVD_LOGPROBS_MAX_TOP];
	float top_logprob[KVD_LOGPROBS_MAX_TOP];
};
/* 0, or -EINVAL for token outside [0, n_vocab), n_top > KVD_LOGPROBS_MAX_TOP
 * or n_top > n_vocab. O(n_vocab * log n_top) at worst, no allocation. */
int kvd_logprobs_compute(const float *logits, int32_t n_vocab, int32_t token, uint32_t n_top,
			 struct kvd_logprobs *ret);

/*
 * Stop strings: the generated text is fed as it streams; kvd_stop_feed
 * reports when one of the strings has appeared and how much of the text
 * must be held back because it could be the start of a stop string.
 * The result does not depend on how the text is split into chunks: the
 * stop that completes first (earliest end; on a tie, the one starting
 * first) wins, exactly as if the text had been fed one byte at a time.
 * A kvd_stop is plain data (no allocation, nothing to free).
 */
struct kvd_stop {
	uint32_t n;
	char str[KVD_SAMPLER_MAX_STOPS][KVD_SAMPLER_MAX_STOP_LEN];
	uint32_t len[KVD_SAMPLER_MAX_STOPS];
	char tail[KVD_SAMPLER_MAX_STOP_LEN]; /* held-back text */
	uint32_t n_tail;
};
/* Copies the n strings (n == 0: nothing ever stops; text passes through).
 * -E2BIG for too many or too long strings, -EINVAL for an empty one or
 * strs NULL with n > 0; st is untouched on failure. */
int kvd_stop_init(struct kvd_stop *st, const char *const *strs, size_t n);
/*
 * Feed `len` new bytes. Writes to out the bytes that are now certain to be
 * emitted (cap must be >= len + KVD_SAMPLER_MAX_STOP_LEN) and sets *ret_hit
 * when a stop string completed (the output then ends just before it).
 * Returns the number of bytes written; out[0 .. cap) may be used as
 * scratch beyond that. After a hit the held-back text is dropped, the
 * state is as after init, and the caller is expected to stop feeding.
 */
size_t kvd_stop_feed(struct kvd_stop *st, const char *text, size_t len, char *out, size_t cap, int *ret_hit);
/* End of generation without a hit: release the held-back bytes (at most
 * KVD_SAMPLER_MAX_STOP_LEN - 1; cap must hold them) and clear them. */
size_t kvd_stop_flush(struct kvd_stop *st, char *out, size_t cap);

/*
 * Sampling under a constraint (grammar.h; daemon/model/grammar_sample.c):
 * the step that joins the sampler and the grammar matcher.
 *
 * A constrained sequence draws exactly what its sampler would draw from
 * logits with every token the constraint does not allow at -inf. The
 * allowed set is a bitmap over the vocabulary; computing it walks the
 * vocabulary's prefix tree, so it is avoided where that is exact:
 *
 *  - greedy (temperature 0 or top_k 1): the argmax over the allowed tokens
 *    is the unconstrained argmax whenever that token is allowed, so the
 *    sampler picks first and kvd_gram_check (cost: one token's bytes)
 *    confirms it; when it is refused, the next best candidates are
 *    checked in order (kvd_sampler_sample_checked: the first allowed of
 *    the best KVD_SAMPLER_GREEDY_CHECK_K is the masked argmax), and only
 *    when none is allowed is the mask built and the argmax taken over it.
 *    No random numbers are drawn either way.
 *  - seeded sampling with top-k: the unmasked top-k candidates are
 *    checked (k tokens' bytes); when every one is allowed the masked
 *    top-k is the same set in the same order and the draw over it is the
 *    masked draw exactly (kvd_sampler_sample_checked). Otherwise the mask.
 *    Checking only the sampled token would not be exact: a draw picks the
 *    token at which the cumulative mass of the truncated, renormalised
 *    candidates passes u * total, and removing a disallowed candidate
 *    changes the top-k set (others move in), the top-p mass it is cut
 *    against and min-p's p_max, so the total and every cumulative position
 *    after it. Without top-k the candidate set is the whole vocabulary:
 *    always the mask. The one uniform draw is consumed as the unmasked
 *    path consumes it, so a sequence's RNG stream does not depend on the
 *    mask.
 *
 * Functions here keep no state; the caller owns the sampler, scratch,
 * state and mask buffer (one sequence's, or the scheduler's for the step).
 */
struct kvd_grammar;
struct kvd_gram_vocab;
struct kvd_gram_scratch;
struct kvd_gram_state;
/*
 * Draw the next token of a sequence whose constraint is at st. mask is the
 * caller's buffer of mask_words words, at least (n_vocab + 31) / 32 for the
 * sampler's n_vocab and at least kvd_gram_vocab_mask_words(v) (ids past the
 * vocabulary's are never allowed). *ret_fast (may be NULL) says whether a
 * check (greedy's, or seeded top-k's) answered without a mask. Returns 0 with *ret_token, -ENOENT
 * when the constraint allows no token at all (stuck: the caller ends the
 * sequence), -EINVAL when mask_words is too small for v, -ENOMEM.
 */
int kvd_gram_sample(struct kvd_sampler *smp, const float *logits, const int32_t *history, size_t n_history,
		    const struct kvd_grammar *g, const struct kvd_gram_vocab *v, struct kvd_gram_scratch *scr,
		    const struct kvd_gram_state *st, uint32_t *mask, size_t mask_words, int32_t *ret_token,
		    int *ret_fast);

#endif /* KVD_SAMPLER_H */
