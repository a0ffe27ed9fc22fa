/*
 * ipc/ipc_spec.h — what the wire says about speculative decoding (kvd
 * 0.9.0, IPC_SPEC_VERSION): the DONE block with a request's drafted and
 * accepted tokens, and (in ipc.h) the STATS counters and the GENERATE
 * opt-out flag IPC_GEN_NO_SPECULATE.
 *
 * Speculation never changes an output, so all of it is observation and
 * choice of speed: a daemon sends IPC_F_SPEC only to clients of
 * IPC_SPEC_VERSION or later (older ones accept no unknown DONE flag), and
 * libkvclient sends IPC_GEN_NO_SPECULATE only to daemons of that version
 * (older ones refuse unknown GENERATE flags as a protocol error).
 *
 * STATS (struct ipc_stats, from IPC_SPEC_VERSION; 0 from older daemons):
 *   spec_verify_steps     decodes that carried a draft (each verified in one step)
 *   spec_drafted_tokens   draft tokens scored
 *   spec_accepted_tokens  of those, the ones accepted: emitted without a step of their own
 *   spec_runs_0 .. _8_16  verify steps by the run of drafts they accepted:
 *                         0, 1, 2-3, 4-7, 8-16 (their sum is spec_verify_steps)
 * For a client that is not an administrator they are its own uid's
 * requests' (finished ones), as the prefix counters are.
 *
 * From IPC_SPEC_DRAFT_STATS_VERSION (kvd 0.10.0), machine-wide for every
 * client (the configuration and the draft pool's occupancy, as the main
 * pool's pages are shown):
 *   spec_mode               the drafter in use: IPC_SPEC_MODE_OFF .. _AUTO
 *                           (0: a daemon that does not say)
 *   spec_draft_pages_total  the draft model's own KV pool, in its pages
 *                           (0: no draft model loaded)
 *   spec_draft_pages_used   of those, held by draft sequences
 *   spec_draft_reclaims     draft sequences given up so that an owner under
 *                           its share of the draft pool could draft
 */
#ifndef KVD_IPC_SPEC_H
#define KVD_IPC_SPEC_H

#include <stdint.h>

#define IPC_SPEC_VERSION ((0u << 16) | (9u << 8) | 0u) /* kvd 0.9.0 */
#define IPC_SPEC_DRAFT_STATS_VERSION ((0u << 16) | (10u << 8) | 0u) /* kvd 0.10.0 */

/* ipc_stats.spec_mode */
#define IPC_SPEC_MODE_OFF    1u
#define IPC_SPEC_MODE_LOOKUP 2u
#define IPC_SPEC_MODE_DRAFT  3u
#define IPC_SPEC_MODE_AUTO   4u

/* With IPC_F_SPEC, after struct ipc_done (and its struct ipc_sample, if any). */
struct ipc_done_spec {
	uint32_t drafted_tokens;  /* the request's (sample's) draft tokens scored */
	uint32_t accepted_tokens; /* of those, accepted: <= drafted_tokens */
};

struct ipc_frame;
struct ipc_done;
struct ipc_sample;
/* ipc_decode_done_sample() (ipc_samples.h) that also gives the struct
 * ipc_done_spec of a DONE with IPC_F_SPEC (zeroed without the flag);
 * ret_sample and ret_spec may be NULL. -EINVAL for more accepted than
 * drafted tokens; otherwise as ipc_decode_done_sample(). */
int ipc_decode_done_spec(const struct ipc_frame *f, struct ipc_done *ret, struct ipc_sample *ret_sample,
			 struct ipc_done_spec *ret_spec);

#endif
