/*
 * daemon/spec.h — speculative decoding by prompt lookup: the drafter.
 *
 * A sequence that copies spans of its own context (quoting a document,
 * rewriting given code, repeating a conversation) can be decoded several
 * tokens per step: the last few tokens are looked up earlier in the
 * sequence's own tokens (prompt and output) and what followed them there
 * is proposed as a draft. The scheduler scores [last token, draft] in one
 * step and keeps exactly the tokens its sampler would have drawn one at a
 * time (sched.c: the verification); the KV of rejected drafts is cut back
 * through kvmm (kvmm_seq_truncate). The drafter is a pure function of the
 * tokens, so it needs no state to fork, swap or preempt.
 */
#ifndef KVD_SPEC_H
#define KVD_SPEC_H

#include <stdint.h>

#define KVD_SPEC_MAX_DRAFT     16u /* [speculative] draft_tokens at most */
#define KVD_SPEC_MAX_MIN_MATCH 16u /* [speculative] min_match at most */
#define KVD_SPEC_LOOKBACK      8192u /* tokens searched back for a match at most */

enum kvd_spec_mode {
	KVD_SPEC_OFF = 0,
	KVD_SPEC_LOOKUP = 1, /* n-gram match against the sequence's own tokens */
};

struct kvd_spec_config {
	enum kvd_spec_mode mode;
	uint32_t draft_tokens; /* 1 .. KVD_SPEC_MAX_DRAFT: tokens drafted per step at most */
	uint32_t min_match;    /* 1 .. KVD_SPEC_MAX_MIN_MATCH: n-gram length that must match */
};

/*
 * Draft up to max_draft tokens after toks[0..n): find the most recent
 * earlier place (within the last KVD_SPEC_LOOKBACK tokens) where the last
 * min_match tokens occurred, and copy what followed it there, up to
 * max_draft tokens and never past toks[n - 1]. Returns how many tokens
 * were written to draft (0: no match, or n too short, or max_draft or
 * min_match 0).
 */
uint32_t kvd_spec_draft(const int32_t *toks, uint32_t n, uint32_t min_match, uint32_t max_draft, int32_t *draft);

#endif
