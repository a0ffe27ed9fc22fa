/*
 * kvmm/seq.c — sequences and their page tables: creation, fork, free, and
 * growth planned then committed.
 *
 * A page may be written in place only when the writing sequence is its only
 * user and it is not in the prefix index (indexed pages are immutable: other
 * requests may map them at any time). Otherwise the write goes to a fresh
 * copy first (copy-on-write, through page_ops.copy). Planning counts those
 * copies and the new pages of a whole step against free plus reclaimable
 * pages; within one step, a shared page written by several of its users is
 * copied for all but the last, exactly as commit will do.
 *
 * Also here: cutting a sequence's tail back (kvmm_seq_truncate), and the
 * per-sequence ledger and its record.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmm_impl.h"

#define STACK_GROWS 64

int seq_reserve(struct kvmm_seq *s, uint32_t n_pages)
{
	uint32_t cap;
	int32_t *p;

	if (n_pages <= s->cap)
		return 0;
	cap = s->cap ? s->cap : 8;
	while (cap < n_pages)
		cap = cap > UINT32_MAX / 2 ? n_pages : cap * 2;
	p = realloc(s->pages, (size_t)cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	s->pages = p;
	s->cap = cap;
	return 0;
}

static void seq_reset(struct kvmm_seq *s)
{
	int32_t *pages = s->pages;
	uint32_t cap = s->cap;

	free(s->swp);
	*s = (struct kvmm_seq){.pages = pages, .cap = cap}; /* keep the table's memory */
}

static int seq_take(struct kvmm *m, uint32_t *ret)
{
	uint32_t id;
	struct kvmm_seq *s;

	if (m->n_free_ids == 0)
		return -ENOSPC;
	id = m->free_ids[--m->n_free_ids];
	s = &m->seqs[id];
	seq_reset(s);
	s->live = true;
	s->prompt_tokens = UINT32_MAX;
	s->owner = s->evicted_prefix_by = KVMM_OWNER_NONE;
	s->created_ns = kvmm_now_ns();
	ctr_add(m, W_SEQS_LIVE, 1);
	ctr_add(m, W_SEQS_CREATED, 1);
	*ret = id;
	return 0;
}

int kvmm_seq_new(struct kvmm *m, uint32_t *ret_seq)
{
	int r;

	kvmm_shm_begin(m);
	r = seq_take(m, ret_seq);
	kvmm_shm_end(m);
	return r;
}

int kvmm_seq_fork(struct kvmm *m, uint32_t parent, uint32_t *ret_child)
{
	struct kvmm_seq *p = seq_get(m, parent), *c;
	uint32_t id;
	int r;

	if (!p || p->swapped)
		return -ENOENT;
	if (m->n_free_ids == 0)
		return -ENOSPC;
	id = m->free_ids[m->n_free_ids - 1];
	r = seq_reserve(&m->seqs[id], p->n_pages);
	if (r < 0)
		return r;
	kvmm_shm_begin(m);
	seq_take(m, &id);
	c = &m->seqs[id];
	if (p->n_pages)
		memcpy(c->pages, p->pages, (size_t)p->n_pages * sizeof(*c->pages));
	for (uint32_t i = 0; i < p->n_pages; i++)
		if (p->pages[i] >= 0)
			page_get(m, p->pages[i]);
	c->n_pages = c->pages_peak = p->n_pages;
	c->n_released = p->n_released;
	c->n_packed = p->n_packed;
	c->len = p->len;
	c->n_published = p->n_published;
	c->unkeyed = p->unkeyed;
	c->scope = p->scope;
	c->owner = p->owner;
	c->prompt_tokens = p->prompt_tokens;
	ctr_add(m, W_TOKENS_RESIDENT, c->len);
	kvmm_shm_end(m);
	*ret_child = id;
	return 0;
}

static void fill_record(const struct kvmm *m, const struct kvmm_seq *s, uint32_t id, struct kvmm_seq_record *r)
{
	uint32_t total = s->len + s->dropped_tokens; /* tokens the sequence has seen */
	uint32_t prompt = s->prompt_tokens < total ? s->prompt_tokens : total;
	uint32_t released = s->n_released * m->bs;
	uint32_t held = seq_held(s);
	uint64_t useful = tok_bytes(m, s->len - released);

	if (m->pack_slots && m->pack_slots != KVMM_PACK_NONE)
		useful += (uint64_t)s->n_released * (m->page_bytes / m->pack_slots);

	*r = (struct kvmm_seq_record){
		.seq = id,
		.len_tokens = s->len,
		.prompt_tokens = prompt,
		.generated_tokens = total - prompt,
		.shared_prefix_tokens = s->shared_prefix_tokens,
		.adopted_tokens = s->adopted_tokens,
		.adopted_pages = s->adopted_pages,
		.pages = held,
		.pages_peak = s->pages_peak,
		.kv_bytes_allocated = (uint64_t)held * m->page_bytes,
		.kv_bytes_useful = useful,
		.slack_tokens = (uint32_t)((uint64_t)s->n_pages * m->bs - s->len),
		.pages_allocated = s->pages_allocated,
		.cow_copies = s->cow_copies,
		.swap_outs = s->swap_outs,
		.swap_ins = s->swap_ins,
		.swap_out_pages = s->swap_out_pages,
		.swap_in_pages = s->swap_in_pages,
		.swap_in_remapped_pages = s->swap_in_remapped,
		.swap_errors = s->swap_errors,
		.swap_bytes = s->swap_bytes,
		.swap_ns = s->swap_ns,
		.steps = s->steps,
		.kv_read_bytes = s->kv_read_bytes,
		.kv_read_bytes_max_step = s->kv_read_bytes_max,
		.mem_wait_ns = s->mem_wait_ns,
		.compute_ns = s->compute_ns,
		.lifetime_ns = kvmm_now_ns() - s->created_ns,
		.dropped_tokens = s->dropped_tokens,
		.drops = s->drops,
		.evicted_prefix_tokens = s->evicted_prefix_tokens,
		.evicted_prefix_by = s->evicted_prefix_by,
		.released_tokens = released,
		.packed_pages = s->n_packed,
	};
}

int kvmm_seq_finish(struct kvmm *m, uint32_t seq, struct kvmm_seq_record *ret_record)
{
	struct kvmm_seq *s = seq_get(m, seq);
	struct kvmm_seq_record rec;
	uint32_t retained = 0;

	if (!s)
		return -ENOENT;
	fill_record(m, s, seq, &rec);
	kvmm_shm_begin(m);
	/* Tails first: their pages enter the LRU before the heads, so the heads
	 * (shared by more future prompts) stay warmer. */
	for (uint32_t i = s->n_pages; i-- > 0;) {
		int32_t p = s->pages[i];

		if (s->swapped && s->swp[i].slot >= 0) {
			if (s->swp[i].node >= 0 && (m->nodes[s->swp[i].node].flags & NODE_LIVE) &&
			    m->nodes[s->swp[i].node].gen == s->swp[i].gen && (i + 1) * (uint64_t)m->bs <= s->len)
				retained++;
			slot_free(m, s->swp[i].slot);
			continue;
		}
		if (p < 0)
			continue; /* released */
		if (m->pg[p].node >= 0 && (i + 1) * (uint64_t)m->bs <= s->len)
			retained++;
		page_put(m, p);
	}
	rec.retained_tokens = retained * m->bs;
	if (s->swapped)
		ctr_sub(m, W_SEQS_SWAPPED, 1);
	else
		ctr_sub(m, W_TOKENS_RESIDENT, s->len);
	ctr_sub(m, W_SEQS_LIVE, 1);
	ctr_add(m, W_SEQS_FINISHED, 1);
	ctr_add(m, W_PROMPT_TOKENS, rec.prompt_tokens);
	ctr_add(m, W_GENERATED_TOKENS, rec.generated_tokens);
	ctr_add(m, W_RETAINED_TOKENS, rec.retained_tokens);
	seq_reset(s);
	m->free_ids[m->n_free_ids++] = seq;
	kvmm_shm_end(m);
	if (ret_record)
		*ret_record = rec;
	return 0;
}

int kvmm_seq_free(struct kvmm *m, uint32_t seq)
{
	return kvmm_seq_finish(m, seq, NULL);
}

uint32_t kvmm_seq_len(const struct kvmm *m, uint32_t seq)
{
	const struct kvmm_seq *s = seq_get(m, seq);

	return s ? s->len : 0;
}

const int32_t *kvmm_seq_pages(const struct kvmm *m, uint32_t seq, uint32_t *ret_n_pages)
{
	const struct kvmm_seq *s = seq_get(m, seq);

	static const int32_t empty[1] = {-1};

	if (!s)
		return NULL;
	*ret_n_pages = s->n_pages;
	return s->pages ? s->pages : empty; /* NULL means "unknown id" only */
}

/* ---- plan and commit ------------------------------------------------------------------ */

/*
 * Check a step and count the pages it needs. cow[k] (when non-NULL) is set
 * to whether grow k copies its last page first. The per-page `pending`
 * counters model the references that earlier copies in the same step
 * release; they are zero again on return.
 */
static int scan_step(struct kvmm *m, const struct kvmm_grow *g, size_t n, bool *cow, uint32_t *ret_needed)
{
	uint64_t needed = 0;
	uint32_t epoch = ++m->plan_epoch;
	int r = 0;
	size_t k;

	if (epoch == 0) { /* wrapped: clear stale marks */
		for (uint32_t i = 0; i < m->max_seqs; i++)
			m->seqs[i].mark = 0;
		epoch = ++m->plan_epoch;
	}
	for (k = 0; k < n; k++) {
		struct kvmm_seq *s = seq_get(m, g[k].seq);
		uint32_t len, pages_after;

		if (cow)
			cow[k] = false;
		if (!s || s->swapped) {
			r = -ENOENT;
			break;
		}
		if (s->mark == epoch) {
			r = -EINVAL;
			break;
		}
		s->mark = epoch;
		if (g[k].n_tokens == 0)
			continue;
		len = s->len;
		if ((uint64_t)len + g[k].n_tokens > UINT32_MAX) {
			r = -EOVERFLOW;
			break;
		}
		if (len % m->bs) {
			int32_t p = s->pages[len / m->bs];

			if (page_ref(m, p) - m->pg[p].pending > 1 || m->pg[p].node >= 0) {
				needed++;
				m->pg[p].pending++;
				if (cow)
					cow[k] = true;
			}
		}
		pages_after = (uint32_t)(((uint64_t)len + g[k].n_tokens + m->bs - 1) / m->bs);
		needed += pages_after - s->n_pages;
	}
	/* Undo the pending marks of the grows scanned. */
	for (size_t i = 0; i < k; i++) {
		const struct kvmm_seq *s = seq_get(m, g[i].seq);

		if (s && !s->swapped && g[i].n_tokens && s->len % m->bs)
			m->pg[s->pages[s->len / m->bs]].pending = 0;
	}
	if (r < 0)
		return r;
	if (needed > avail_pages(m))
		return -ENOMEM;
	*ret_needed = (uint32_t)needed;
	return 0;
}

int kvmm_plan(struct kvmm *m, const struct kvmm_grow *g, size_t n, uint32_t *ret_pages_needed)
{
	uint32_t needed;
	int r = scan_step(m, g, n, NULL, &needed);

	if (r < 0)
		return r;
	*ret_pages_needed = needed;
	return 0;
}

int cow_copy(struct kvmm *m, int32_t dst, int32_t src, uint32_t n_tokens)
{
	if (m->page_ops.copy) {
		int r = m->page_ops.copy(m->page_ops.ud, (uint32_t)dst, (uint32_t)src, n_tokens);

		if (r < 0)
			return r;
	} else {
		memcpy(page_ptr(m, dst), page_ptr(m, src), m->page_bytes);
	}
	memcpy(&m->page_tokens[(size_t)dst * m->bs], &m->page_tokens[(size_t)src * m->bs], n_tokens * sizeof(int32_t));
	return 0;
}

int kvmm_commit(struct kvmm *m, const struct kvmm_grow *g, size_t n)
{
	bool cow_stack[STACK_GROWS], *cow = cow_stack;
	int32_t dst_stack[STACK_GROWS], *dst = dst_stack;
	uint64_t step_read = 0;
	uint32_t needed;
	int r;

	if (n > STACK_GROWS) {
		cow = malloc(n * sizeof(*cow));
		dst = malloc(n * sizeof(*dst));
		if (!cow || !dst) {
			r = -ENOMEM;
			goto out;
		}
	}
	r = scan_step(m, g, n, cow, &needed);
	if (r < 0)
		goto out;
	/* Page tables big enough first: the last thing that could fail. */
	for (size_t k = 0; k < n; k++) {
		struct kvmm_seq *s = seq_get(m, g[k].seq);

		r = seq_reserve(s, (uint32_t)(((uint64_t)s->len + g[k].n_tokens + m->bs - 1) / m->bs));
		if (r < 0)
			goto out;
	}
	kvmm_shm_begin(m);
	/* Phase A: all copies, into pages nobody sees yet; a failing copy
	 * returns them and leaves every sequence as it was. */
	for (size_t k = 0; k < n; k++) {
		struct kvmm_seq *s;

		dst[k] = -1;
		if (!cow[k])
			continue;
		s = seq_get(m, g[k].seq);
		dst[k] = page_alloc_for(m, s);
		r = cow_copy(m, dst[k], s->pages[s->len / m->bs], s->len % m->bs);
		if (r < 0) {
			for (size_t i = 0; i <= k; i++)
				if (dst[i] >= 0) {
					page_free(m, dst[i]);
					ctr_sub(m, W_PAGES_ALLOCATED, 1);
				}
			kvmm_shm_end(m);
			goto out;
		}
	}
	/* Phase B: install the copies and append; nothing here can fail. */
	for (size_t k = 0; k < n; k++) {
		struct kvmm_seq *s = seq_get(m, g[k].seq);
		uint32_t pos = s->len, end = s->len + g[k].n_tokens, first = s->len / m->bs;

		if (g[k].n_tokens == 0)
			continue;
		if (dst[k] >= 0) {
			int32_t src = s->pages[first];

			page_get(m, dst[k]);
			page_set_fill(m, dst[k], pos % m->bs);
			s->pages[first] = dst[k];
			page_put(m, src);
			s->cow_copies++;
			s->pages_allocated++;
			ctr_add(m, W_COW_COPIES, 1);
		}
		if (!g[k].tokens)
			s->unkeyed = true;
		while (pos < end) {
			uint32_t idx = pos / m->bs, slot = pos % m->bs, take = m->bs - slot;
			int32_t p;

			if (take > end - pos)
				take = end - pos;
			if (idx == s->n_pages) {
				p = page_alloc_for(m, s);
				page_get(m, p);
				s->pages[s->n_pages++] = p;
				s->pages_allocated++;
			}
			p = s->pages[idx];
			if (g[k].tokens)
				memcpy(&m->page_tokens[(size_t)p * m->bs + slot], g[k].tokens + (pos - s->len),
				       take * sizeof(int32_t));
			else
				for (uint32_t t = 0; t < take; t++)
					m->page_tokens[(size_t)p * m->bs + slot + t] = -1;
			if (m->pg[p].fill < slot + take)
				page_set_fill(m, p, slot + take);
			pos += take;
		}
		s->len = end;
		if (s->n_pages > s->pages_peak)
			s->pages_peak = s->n_pages;
		s->steps++;
		s->kv_read_bytes += tok_bytes(m, end);
		if (tok_bytes(m, end) > s->kv_read_bytes_max)
			s->kv_read_bytes_max = tok_bytes(m, end);
		step_read += tok_bytes(m, end);
		ctr_add(m, W_TOKENS_RESIDENT, g[k].n_tokens);
	}
	ctr_add(m, W_STEPS, 1);
	ctr_set(m, W_KV_READ_LAST, step_read);
	ctr_add(m, W_KV_READ_TOTAL, step_read);
	kvmm_shm_end(m);
	r = 0;
out:
	if (cow != cow_stack)
		free(cow);
	if (dst != dst_stack)
		free(dst);
	return r;
}

/* ---- context policies ---------------------------------------------------------------------- */

int kvmm_seq_drop_pages(struct kvmm *m, uint32_t seq, uint32_t first, uint32_t n_drop)
{
	struct kvmm_seq *s = seq_get(m, seq);
	uint32_t copies = 0, freed = 0, end;
	int r = 0;

	if (!s || s->swapped)
		return -ENOENT;
	if (s->n_released)
		return -EBUSY; /* positions no longer contiguous in full pages */
	end = first + n_drop;
	if (n_drop == 0 || end < first || end > s->n_pages || (end == s->n_pages && s->len % m->bs))
		return -EINVAL;
	for (uint32_t i = first; i < end; i++)
		freed += page_ref(m, s->pages[i]) == 1;
	for (uint32_t i = end; i < s->n_pages; i++)
		copies += page_ref(m, s->pages[i]) > 1;
	if (copies > avail_pages(m) + freed)
		return -ENOMEM;
	kvmm_shm_begin(m);
	for (uint32_t i = first; i < end; i++)
		page_put(m, s->pages[i]);
	memmove(s->pages + first, s->pages + end, (size_t)(s->n_pages - end) * sizeof(*s->pages));
	s->n_pages -= n_drop;
	s->len -= n_drop * m->bs;
	s->dropped_tokens += n_drop * m->bs;
	s->drops++;
	ctr_sub(m, W_TOKENS_RESIDENT, (uint64_t)n_drop * m->bs);
	/* never indexed again: the content of the moved pages is not what
	 * their tokens give at their new positions from scratch */
	s->unkeyed = true;
	if (s->n_published > first)
		s->n_published = first;
	for (uint32_t i = first; i < s->n_pages; i++) {
		int32_t src = s->pages[i], dst;
		uint32_t fill = i + 1 < s->n_pages || s->len % m->bs == 0 ? m->bs : s->len % m->bs;

		if (page_ref(m, src) == 1) {
			/* ours alone: leave the index (with the entries below it,
			 * which no lookup could reach any more) instead of copying */
			if (m->pg[src].node >= 0)
				index_drop_subtree(m, m->pg[src].node, W_EVICT_EXPLICIT);
			continue;
		}
		dst = page_alloc_for(m, s); /* counted above: cannot fail */
		r = cow_copy(m, dst, src, fill);
		if (r < 0) {
			page_free(m, dst);
			ctr_sub(m, W_PAGES_ALLOCATED, 1);
			break;
		}
		page_get(m, dst);
		page_set_fill(m, dst, fill);
		s->pages[i] = dst;
		page_put(m, src);
		s->cow_copies++;
		s->pages_allocated++;
		ctr_add(m, W_COW_COPIES, 1);
	}
	kvmm_shm_end(m);
	return r;
}

int kvmm_seq_truncate(struct kvmm *m, uint32_t seq, uint32_t n_tokens)
{
	struct kvmm_seq *s = seq_get(m, seq);
	uint32_t keep_pages;

	if (!s || s->swapped)
		return -ENOENT;
	if (n_tokens >= s->len)
		return 0;
	/* a published page is immutable and known to the index; a released
	 * one no longer holds what its positions would need */
	if ((uint64_t)n_tokens < (uint64_t)s->n_published * m->bs ||
	    (uint64_t)n_tokens < (uint64_t)s->n_released * m->bs)
		return -EBUSY;
	keep_pages = (uint32_t)(((uint64_t)n_tokens + m->bs - 1) / m->bs);
	kvmm_shm_begin(m);
	for (uint32_t i = s->n_pages; i-- > keep_pages;)
		page_put(m, s->pages[i]);
	s->n_pages = keep_pages;
	if (n_tokens % m->bs) {
		int32_t p = s->pages[keep_pages - 1];

		/* ours alone (a step's write made it private): its later
		 * slots are free again; shared, others' fill stands */
		if (page_ref(m, p) == 1 && m->pg[p].node < 0)
			page_set_fill(m, p, n_tokens % m->bs);
	}
	ctr_sub(m, W_TOKENS_RESIDENT, s->len - n_tokens);
	s->len = n_tokens;
	kvmm_shm_end(m);
	return 0;
}

int kvmm_seq_set_scope(struct kvmm *m, uint32_t seq, uint64_t scope)
{
	struct kvmm_seq *s = seq_get(m, seq);

	if (!s)
		return -ENOENT;
	if (s->len || s->n_pages || s->swapped)
		return -EBUSY;
	s->scope = scope;
	return 0;
}

int kvmm_seq_set_owner(struct kvmm *m, uint32_t seq, uint32_t owner)
{
	struct kvmm_seq *s = seq_get(m, seq);

	if (!s)
		return -ENOENT;
	s->owner = owner;
	return 0;
}

/* ---- ledger ------------------------------------------------------------------------------ */

int kvmm_seq_set_prompt_tokens(struct kvmm *m, uint32_t seq, uint32_t n_prompt_tokens)
{
	struct kvmm_seq *s = seq_get(m, seq);

	if (!s)
		return -ENOENT;
	s->prompt_tokens = n_prompt_tokens;
	return 0;
}

int kvmm_seq_add_time(struct kvmm *m, uint32_t seq, uint64_t mem_wait_ns, uint64_t compute_ns)
{
	struct kvmm_seq *s = seq_get(m, seq);

	if (!s)
		return -ENOENT;
	s->mem_wait_ns += mem_wait_ns;
	s->compute_ns += compute_ns;
	kvmm_shm_begin(m);
	ctr_add(m, W_MEM_WAIT_NS, mem_wait_ns);
	ctr_add(m, W_COMPUTE_NS, compute_ns);
	kvmm_shm_end(m);
	return 0;
}

int kvmm_seq_ledger(const struct kvmm *m, uint32_t seq, struct kvmm_seq_record *ret)
{
	const struct kvmm_seq *s = seq_get(m, seq);
	uint32_t retained = 0;

	if (!s)
		return -ENOENT;
	fill_record(m, s, seq, ret);
	for (uint32_t i = s->n_released; i < s->n_pages && !s->swapped; i++)
		if (m->pg[s->pages[i]].node >= 0 && (i + 1) * (uint64_t)m->bs <= s->len)
			retained++;
	ret->retained_tokens = retained * m->bs;
	return 0;
}

int kvmm_seq_record_json(const struct kvmm_seq_record *r, char *buf, size_t size)
{
	int n = snprintf(buf, size,
			 "{\"seq\":%" PRIu32 ",\"len_tokens\":%" PRIu32 ",\"prompt_tokens\":%" PRIu32
			 ",\"generated_tokens\":%" PRIu32 ",\"shared_prefix_tokens\":%" PRIu32
			 ",\"adopted_tokens\":%" PRIu32 ",\"retained_tokens\":%" PRIu32 ",\"pages\":%" PRIu32 ",\"pages_peak\":%" PRIu32
			 ",\"kv_bytes_allocated\":%" PRIu64 ",\"kv_bytes_useful\":%" PRIu64
			 ",\"slack_tokens\":%" PRIu32 ",\"pages_allocated\":%" PRIu32 ",\"cow_copies\":%" PRIu32
			 ",\"swap_outs\":%" PRIu32 ",\"swap_ins\":%" PRIu32 ",\"swap_out_pages\":%" PRIu32
			 ",\"swap_in_pages\":%" PRIu32 ",\"swap_in_remapped_pages\":%" PRIu32
			 ",\"swap_errors\":%" PRIu32 ",\"swap_bytes\":%" PRIu64 ",\"swap_ns\":%" PRIu64
			 ",\"steps\":%" PRIu64 ",\"kv_read_bytes\":%" PRIu64 ",\"kv_read_bytes_max_step\":%" PRIu64 ",\"mem_wait_ns\":%" PRIu64
			 ",\"compute_ns\":%" PRIu64 ",\"lifetime_ns\":%" PRIu64 ",\"dropped_tokens\":%" PRIu32
			 ",\"drops\":%" PRIu32 ",\"released_tokens\":%" PRIu32 ",\"packed_pages\":%" PRIu32
			 ",\"evicted_prefix_tokens\":%" PRIu32 "}",
			 r->seq, r->len_tokens, r->prompt_tokens, r->generated_tokens, r->shared_prefix_tokens,
			 r->adopted_tokens, r->retained_tokens, r->pages, r->pages_peak, r->kv_bytes_allocated, r->kv_bytes_useful,
			 r->slack_tokens, r->pages_allocated, r->cow_copies, r->swap_outs, r->swap_ins,
			 r->swap_out_pages, r->swap_in_pages, r->swap_in_remapped_pages, r->swap_errors, r->swap_bytes,
			 r->swap_ns, r->steps, r->kv_read_bytes, r->kv_read_bytes_max_step, r->mem_wait_ns, r->compute_ns, r->lifetime_ns,
			 r->dropped_tokens, r->drops, r->released_tokens, r->packed_pages, r->evicted_prefix_tokens);

	if (n < 0)
		return -EINVAL;
	if ((size_t)n >= size)
		return -ENOBUFS;
	return n;
}
