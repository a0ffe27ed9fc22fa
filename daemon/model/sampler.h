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
 * A kvd_sampler belongs to one sequence; not thread safe.
 */
#ifndef KVD_SAMPLER_H
#define KVD_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#define KVD_SAMPLER_MAX_STOPS    8     /* stop strings per request */
#define KVD_SAMPLER_MAX_STOP_LEN 256   /* bytes per stop string */

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
 * repeat_penalty <= 0 are rejected. */
int kvd_sampler_params_check(const struct kvd_sampler_params *p);

struct kvd_sampler;
/* NULL on out of memory (or invalid params: check them first). */
struct kvd_sampler *kvd_sampler_new(const struct kvd_sampler_params *p, int32_t n_vocab);
struct kvd_sampler *kvd_sampler_free(struct kvd_sampler *s);

/*
 * Pick the next token from logits[n_vocab]. `history` holds the sequence's
 * tokens so far (prompt and generated), used by the repetition penalty.
 * The logits array is not modified. Returns a token id >= 0.
 */
int32_t kvd_sampler_sample(struct kvd_sampler *s, const float *logits, const int32_t *history, size_t n_history);

/*
 * Stop strings: the generated text is fed as it streams; kvd_stop_feed
 * reports when one of the strings has appeared and how much of the text
 * must be held back because it could be the start of a stop string.
 */
struct kvd_stop {
	uint32_t n;
	char str[KVD_SAMPLER_MAX_STOPS][KVD_SAMPLER_MAX_STOP_LEN];
	uint32_t len[KVD_SAMPLER_MAX_STOPS];
	char tail[KVD_SAMPLER_MAX_STOP_LEN]; /* held-back text */
	uint32_t n_tail;
};
/* -E2BIG for too many or too long strings, -EINVAL for an empty one. */
int kvd_stop_init(struct kvd_stop *st, const char *const *strs, size_t n);
/*
 * Feed `len` new bytes. Writes to out the bytes that are now certain to be
 * emitted (cap must be >= len + KVD_SAMPLER_MAX_STOP_LEN) and sets *ret_hit
 * when a stop string completed (the output then ends just before it).
 * Returns the number of bytes written.
 */
size_t kvd_stop_feed(struct kvd_stop *st, const char *text, size_t len, char *out, size_t cap, int *ret_hit);
/* End of generation without a hit: release the held-back bytes. */
size_t kvd_stop_flush(struct kvd_stop *st, char *out, size_t cap);

#endif /* KVD_SAMPLER_H */
