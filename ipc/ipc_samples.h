/*
 * ipc/ipc_samples.h — part of the wire protocol, included at the end of
 * ipc/ipc.h (include that): parallel samples and log-probabilities.
 *
 * ipc_generate.n_samples = N >= 2 asks for N independent continuations
 * of one prompt: the daemon computes the prompt once and forks its KV (full pages shared, a partly filled last page copied on a
 * sample's first write). Sample 0 samples with the request's seed, sample
 * i >= 1 with SplitMix64's output function of seed + i * 0x9e3779b97f4a7c15
 * (mod 2^64): reproducible, and sample 0 is what a one-sample request with
 * that seed gives. Not with a session (-EINVAL). IPC_GEN_LOGPROBS adds to
 * each token its log-probability and the top_logprobs likeliest tokens:
 * log-softmax of the model's logits before repetition penalty, temperature
 * and truncation (as OpenAI's).
 * Such a request (N >= 2 or the flag) streams TOKEN records with
 * IPC_F_SAMPLE, each covering tokens of one sample (index counting that
 * sample's tokens; samples interleave):
 *     struct ipc_token | struct ipc_sample | ids | text | [log-probabilities]
 * With IPC_LP_PRESENT the area holds, per token in order, 1 + n_top struct
 * ipc_logprob (the sampled token first, then the alternatives, likeliest
 * first, ties by lower id) followed by their pieces' bytes in entry order;
 * a piece is the token's raw bytes (maybe part of a UTF-8 character; a
 * control token's text), cut to IPC_MAX_PIECE_BYTES. Each sample ends with
 * its own DONE with IPC_F_SAMPLE (struct ipc_done | struct ipc_sample, n_top
 * and lp_flags 0); the request is over after N of them, or at an ERROR,
 * which ends every sample.
 * Compatibility as for chat turns (ipc.h): older daemons refuse these fields
 * (-EPROTO), so libkvclient sends them only to a daemon of at least
 * IPC_SAMPLES_SERVER_VERSION (else -EOPNOTSUPP).
 */
#ifndef KVD_IPC_SAMPLES_H
#define KVD_IPC_SAMPLES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define IPC_SAMPLES_SERVER_VERSION ((0u << 16) | (3u << 8) | 0u)
#define IPC_LP_PRESENT 0x1u        /* ipc_sample.lp_flags: the record has a log-probability area */

struct ipc_logprob {
	int32_t id;               /* token id */
	float logprob;            /* <= 0 (-inf allowed), not NaN */
	uint16_t piece_bytes;     /* 0 .. IPC_MAX_PIECE_BYTES */
	uint16_t reserved0;
};

/* One token's log-probabilities out of a decoded TOKEN record. */
struct ipc_token_lp {
	uint32_t n;                                   /* 1 + n_top */
	struct ipc_logprob e[1 + IPC_MAX_TOP_LOGPROBS]; /* [0]: the sampled token */
	const char *piece[1 + IPC_MAX_TOP_LOGPROBS];  /* e[i].piece_bytes bytes, into the frame */
};
/* Walk the area of a decoded record: start with *off = 0; returns 1 with
 * the next token's entries, 0 after the last (or without an area). */
int ipc_token_lp_next(const struct ipc_token_msg *m, size_t *off, struct ipc_token_lp *ret);
/* Append one token's n entries (ids, logprobs, pieces cut to
 * IPC_MAX_PIECE_BYTES) to an area in buf[*len .. cap). 0, -EINVAL for n
 * outside 1 .. 1 + IPC_MAX_TOP_LOGPROBS, -E2BIG when they do not fit. */
int ipc_token_lp_put(uint8_t *buf, size_t cap, size_t *len, uint32_t n, const int32_t *ids, const float *logprobs,
		     const char *const *pieces, const uint32_t *piece_bytes);
/* A TOKEN payload with IPC_F_SAMPLE (no header: ipc_chan_send() adds it)
 * in buf[0 .. cap): t | s | ids | text | lp. Checked with the decoder;
 * returns the payload size or a validation error. */
ssize_t ipc_encode_token_sample(void *buf, size_t cap, const struct ipc_token *t, const struct ipc_sample *s,
				const int32_t *ids, const char *text, const void *lp, uint32_t lp_bytes);

/* ipc_decode_done() that also gives the struct ipc_sample of a DONE with
 * IPC_F_SAMPLE in *ret_sample (may be NULL; zero without the flag). */
int ipc_decode_done_sample(const struct ipc_frame *f, struct ipc_done *ret, struct ipc_sample *ret_sample);

#endif /* KVD_IPC_SAMPLES_H */
