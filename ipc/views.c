/*
 * ipc/views.c — the payload decoders of KVMAP_REPLY, HIST_REPLY, LEDGER and
 * LEDGER_REPLY (see ipc_views.h); their types are in frame.c's table.
 */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "ipc.h"

#pragma GCC visibility push(hidden)

static_assert(sizeof(struct ipc_kvmap) == 96, "ipc_kvmap size");
static_assert(sizeof(struct ipc_hist) == 24 + 8 * (2 * IPC_HIST_MAX_BOUNDS + 1), "ipc_hist size");
static_assert(sizeof(struct ipc_hist_reply) == 2 * sizeof(struct ipc_hist) + 32, "ipc_hist_reply size");
static_assert(sizeof(struct ipc_ledger_req) == 8, "ipc_ledger_req size");
static_assert(sizeof(struct ipc_ledger_reply) == 8, "ipc_ledger_reply size");
static_assert(sizeof(struct ipc_ledger_reply) + 8 + IPC_LEDGER_MAX_LINE_BYTES <= IPC_MAX_PAYLOAD_BYTES,
	      "the longest ledger record fits one frame");

/* [off, off + len) inside [0, file) */
static bool region_in(uint64_t off, uint64_t len, uint64_t file)
{
	return off <= file && len <= file - off;
}

int ipc_decode_kvmap(const struct ipc_frame *f, struct ipc_kvmap *ret)
{
	struct ipc_kvmap k;

	assert(f->hdr.type == IPC_MSG_KVMAP_REPLY && f->hdr.length == sizeof(k));
	memcpy(&k, f->payload, sizeof(k));
	for (size_t i = 0; i < sizeof(k.reserved) / sizeof(k.reserved[0]); i++)
		if (k.reserved[i])
			return -EPROTO;
	if (k.n_pages == 0 || k.n_pages > IPC_KVMAP_MAX_PAGES || k.n_words == 0 || k.n_words > IPC_KVMAP_MAX_WORDS ||
	    k.block_size == 0 || k.page_bytes == 0)
		return -EINVAL;
	if (k.word_slots_used >= k.n_words || k.word_pages_demoted >= k.n_words)
		return -EINVAL;
	if (k.seq_offset % 8 || k.words_offset % 8 || k.page_words_offset % 4)
		return -EINVAL;
	if (!region_in(k.seq_offset, 8, k.file_bytes) || !region_in(k.words_offset, 8ull * k.n_words, k.file_bytes) ||
	    !region_in(k.page_words_offset, 4ull * k.n_pages, k.file_bytes))
		return -EINVAL;
	*ret = k;
	return 0;
}

static int check_hist(const struct ipc_hist *h)
{
	uint64_t sum = 0;

	if (h->reserved0)
		return -EPROTO;
	if (h->n_bounds == 0 || h->n_bounds > IPC_HIST_MAX_BOUNDS)
		return -EINVAL;
	for (uint32_t i = 0; i < IPC_HIST_MAX_BOUNDS; i++) {
		if (i >= h->n_bounds && h->bound_ns[i])
			return -EINVAL;
		if (i > 0 && i < h->n_bounds && h->bound_ns[i] <= h->bound_ns[i - 1])
			return -EINVAL;
	}
	for (uint32_t i = 0; i <= IPC_HIST_MAX_BOUNDS; i++) {
		if (i > h->n_bounds && h->bucket[i])
			return -EINVAL;
		if (h->bucket[i] > UINT64_MAX - sum)
			return -EINVAL;
		sum += h->bucket[i];
	}
	return sum == h->count ? 0 : -EINVAL;
}

int ipc_decode_hist(const struct ipc_frame *f, struct ipc_hist_reply *ret)
{
	struct ipc_hist_reply h;
	int r;

	assert(f->hdr.type == IPC_MSG_HIST_REPLY && f->hdr.length == sizeof(h));
	memcpy(&h, f->payload, sizeof(h));
	for (size_t i = 0; i < sizeof(h.reserved) / sizeof(h.reserved[0]); i++)
		if (h.reserved[i])
			return -EPROTO;
	if ((r = check_hist(&h.ttft)) < 0 || (r = check_hist(&h.itl)) < 0)
		return r;
	*ret = h;
	return 0;
}

int ipc_decode_ledger_req(const struct ipc_frame *f, struct ipc_ledger_req *ret)
{
	struct ipc_ledger_req q;

	assert(f->hdr.type == IPC_MSG_LEDGER && f->hdr.length == sizeof(q));
	memcpy(&q, f->payload, sizeof(q));
	if (q.flags)
		return -EPROTO;
	if (q.max_records > IPC_LEDGER_MAX_RECORDS)
		return -E2BIG;
	*ret = q;
	return 0;
}

int ipc_decode_cache_req(const struct ipc_frame *f, struct ipc_cache_req *ret)
{
	struct ipc_cache_req q;

	assert(f->hdr.type == IPC_MSG_CACHE && f->hdr.length == sizeof(q));
	memcpy(&q, f->payload, sizeof(q));
	if (q.flags || (q.op != IPC_CACHE_SAVE && q.op != IPC_CACHE_DROP))
		return -EPROTO;
	*ret = q;
	return 0;
}

int ipc_decode_cache_reply(const struct ipc_frame *f, struct ipc_cache_reply *ret)
{
	struct ipc_cache_reply r;

	assert(f->hdr.type == IPC_MSG_CACHE_REPLY && f->hdr.length == sizeof(r));
	memcpy(&r, f->payload, sizeof(r));
	if (r.reserved || (r.op != IPC_CACHE_SAVE && r.op != IPC_CACHE_DROP) || r.file_removed > 1 || r.timed_out > 1)
		return -EPROTO;
	if (r.op == IPC_CACHE_SAVE && r.pages > r.candidates)
		return -EINVAL;
	*ret = r;
	return 0;
}

int ipc_decode_ledger_reply(const struct ipc_frame *f, struct ipc_ledger_reply_msg *ret)
{
	struct ipc_ledger_reply r;
	const uint8_t *p;
	size_t len, off = 0;

	assert(f->hdr.type == IPC_MSG_LEDGER_REPLY && f->hdr.length >= sizeof(r));
	memcpy(&r, f->payload, sizeof(r));
	if (r.n_records > r.n_total || r.n_total > IPC_LEDGER_MAX_RECORDS)
		return -EBADMSG;
	p = f->payload + sizeof(r);
	len = f->hdr.length - sizeof(r);
	for (uint32_t i = 0; i < r.n_records; i++) {
		uint32_t bytes;
		size_t size;

		if (len - off < 8)
			return -EBADMSG;
		memcpy(&bytes, p + off + 4, 4);
		if (bytes == 0 || bytes > IPC_LEDGER_MAX_LINE_BYTES)
			return -E2BIG;
		size = ipc_ledger_record_size(bytes);
		if (len - off < size)
			return -EBADMSG;
		if (memchr(p + off + 8, '\n', bytes) || memchr(p + off + 8, 0, bytes))
			return -EINVAL;
		for (size_t k = 8 + bytes; k < size; k++)
			if (p[off + k])
				return -EPROTO;
		off += size;
	}
	if (off != len)
		return -EBADMSG;
	ret->r = r;
	ret->records = p;
	ret->records_bytes = len;
	ret->more = f->hdr.flags & IPC_F_MORE;
	return 0;
}

int ipc_ledger_record_next(const struct ipc_ledger_reply_msg *m, size_t *off, struct ipc_ledger_record *ret)
{
	if (*off >= m->records_bytes)
		return 0;
	memcpy(&ret->uid, m->records + *off, 4);
	memcpy(&ret->bytes, m->records + *off + 4, 4);
	ret->json = (const char *)m->records + *off + 8;
	*off += ipc_ledger_record_size(ret->bytes);
	return 1;
}
