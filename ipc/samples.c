/*
 * ipc/samples.c — building and walking the log-probability area of a TOKEN
 * record with IPC_F_SAMPLE (ipc_samples.h). The area is validated by
 * ipc_decode_token() in frame.c; these helpers only read what it accepted
 * or write what it will accept.
 */
#include <errno.h>
#include <string.h>

#include "ipc.h"

#pragma GCC visibility push(hidden)

int ipc_token_lp_next(const struct ipc_token_msg *m, size_t *off, struct ipc_token_lp *ret)
{
	if (!m->lp || *off >= m->lp_bytes)
		return 0;
	/* the area was validated by ipc_decode_token: no checks needed here */
	const uint8_t *p = m->lp + *off;
	uint32_t n = 1u + m->s.n_top;
	ret->n = n;
	memcpy(ret->e, p, n * sizeof(struct ipc_logprob));
	const char *piece = (const char *)p + n * sizeof(struct ipc_logprob);
	for (uint32_t i = 0; i < n; i++) {
		ret->piece[i] = piece;
		piece += ret->e[i].piece_bytes;
	}
	*off = (size_t)((const uint8_t *)piece - m->lp);
	return 1;
}

int ipc_token_lp_put(uint8_t *buf, size_t cap, size_t *len, uint32_t n, const int32_t *ids, const float *logprobs,
		     const char *const *pieces, const uint32_t *piece_bytes)
{
	size_t need = (size_t)n * sizeof(struct ipc_logprob);

	if (n == 0 || n > 1 + IPC_MAX_TOP_LOGPROBS)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		need += piece_bytes[i] < IPC_MAX_PIECE_BYTES ? piece_bytes[i] : IPC_MAX_PIECE_BYTES;
	if (*len > cap || cap - *len < need)
		return -E2BIG;
	uint8_t *p = buf + *len;
	for (uint32_t i = 0; i < n; i++) {
		struct ipc_logprob e = {
			.id = ids[i],
			.logprob = logprobs[i],
			.piece_bytes = (uint16_t)(piece_bytes[i] < IPC_MAX_PIECE_BYTES ? piece_bytes[i] : IPC_MAX_PIECE_BYTES),
		};
		memcpy(p, &e, sizeof(e));
		p += sizeof(e);
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t k = piece_bytes[i] < IPC_MAX_PIECE_BYTES ? piece_bytes[i] : IPC_MAX_PIECE_BYTES;
		if (k)
			memcpy(p, pieces[i], k);
		p += k;
	}
	*len += need;
	return 0;
}

ssize_t ipc_encode_token_sample(void *buf, size_t cap, const struct ipc_token *t, const struct ipc_sample *s,
				const int32_t *ids, const char *text, const void *lp, uint32_t lp_bytes)
{
	uint64_t len = (uint64_t)sizeof(*t) + sizeof(*s) + 4ull * t->n_ids + t->text_bytes + lp_bytes;
	if (len > cap || len > IPC_MAX_PAYLOAD_BYTES)
		return -E2BIG;
	uint8_t *p = buf;
	memcpy(p, t, sizeof(*t));
	memcpy(p + sizeof(*t), s, sizeof(*s));
	p += sizeof(*t) + sizeof(*s);
	if (t->n_ids)
		memcpy(p, ids, 4u * t->n_ids);
	p += 4u * t->n_ids;
	if (t->text_bytes)
		memcpy(p, text, t->text_bytes);
	p += t->text_bytes;
	if (lp_bytes)
		memcpy(p, lp, lp_bytes);
	struct ipc_frame f = { .hdr = { .magic = IPC_MAGIC, .version = IPC_PROTO_VERSION, .type = IPC_MSG_TOKEN,
					.length = (uint32_t)len, .flags = IPC_F_SAMPLE },
			       .payload = buf };
	struct ipc_token_msg m;
	int r = ipc_decode_token(&f, &m);
	return r < 0 ? r : (ssize_t)len;
}
