/*
 * kvmm/release.c — releasing the pages a sequence's windowed layers are
 * done with (kvmm_seq_release in kvmm.h).
 *
 * In a model whose layers mostly attend over a window (Gemma 3: five local
 * layers of six see the last 512 positions), a page older than the widest
 * window is read by the global layers only. Releasing it keeps their share
 * and frees the rest: with pack_slots = k (the engine's page layout fits
 * the global layers of k pages into one page), the shares of k consecutive
 * released pages fill one packed page, held at the first of their
 * positions; the other positions hold KVMM_RELEASED. A long context then
 * costs its global layers plus one window of full pages.
 *
 * The packed page is an ordinary page for references, forks and swap. It
 * is written only here, slot by slot as later pages are released; a fork
 * shares it, so the sibling that releases into it next copies it first
 * (copy-on-write of the whole page, through page_ops.copy). It is never
 * indexed: prefix hits map full pages only.
 */
#include <errno.h>

#include "kvmm_impl.h"

uint32_t kvmm_seq_released(const struct kvmm *m, uint32_t seq)
{
	const struct kvmm_seq *s = seq_get(m, seq);

	return s ? s->n_released : 0;
}

uint32_t kvmm_seq_pages_held(const struct kvmm *m, uint32_t seq)
{
	const struct kvmm_seq *s = seq_get(m, seq);

	return s ? seq_held(s) : 0;
}

/* Position i's packed page, made private and ready for slot i % k: a new
 * page for slot 0, else the group's page, copied first if shared. 0, or
 * -ENOMEM (no page; nothing changed), or the copy callback's error. */
static int packed_target(struct kvmm *m, struct kvmm_seq *s, uint32_t i, int32_t *ret)
{
	uint32_t head = i - i % m->pack_slots;
	int32_t p = head == i ? -1 : s->pages[head], q;
	int r;

	if (p >= 0 && page_ref(m, p) == 1) {
		*ret = p;
		return 0;
	}
	q = page_alloc_for(m, s);
	if (q < 0)
		return -ENOMEM;
	if (p >= 0) {
		r = cow_copy(m, q, p, m->bs);
		if (r < 0) {
			page_free(m, q);
			ctr_sub(m, W_PAGES_ALLOCATED, 1);
			return r;
		}
		s->cow_copies++;
		ctr_add(m, W_COW_COPIES, 1);
	}
	page_get(m, q);
	page_set_packed(m, q);
	s->pages_allocated++;
	if (p >= 0) {
		s->pages[head] = q;
		page_put(m, p);
	} else {
		s->n_packed++;
	}
	*ret = q;
	return 0;
}

int kvmm_seq_release(struct kvmm *m, uint32_t seq, uint32_t upto, uint32_t *ret_released)
{
	struct kvmm_seq *s = seq_get(m, seq);
	int r = 0;

	if (!s || s->swapped)
		return -ENOENT;
	if (m->pack_slots == 0)
		return -EOPNOTSUPP;
	if (upto > s->n_published)
		return -EINVAL;
	kvmm_shm_begin(m);
	while (s->n_released < upto) {
		uint32_t i = s->n_released;
		int32_t old = s->pages[i];

		if (m->pack_slots != KVMM_PACK_NONE) {
			int32_t dst = -1;

			r = packed_target(m, s, i, &dst);
			if (r == -ENOMEM) {
				r = 0; /* no room for the packed page now: later */
				break;
			}
			if (r == 0)
				r = m->page_ops.pack(m->page_ops.ud, (uint32_t)dst, i % m->pack_slots, (uint32_t)old);
			if (r < 0) {
				/* a fresh packed page without its first slot goes back */
				if (i % m->pack_slots == 0 && s->pages[i] == old && page_ref(m, dst) == 1) {
					page_put(m, dst);
					s->n_packed--;
				}
				break;
			}
			s->pages[i] = i % m->pack_slots == 0 ? dst : KVMM_RELEASED;
		} else {
			s->pages[i] = KVMM_RELEASED;
		}
		page_put(m, old);
		s->n_released++;
		ctr_add(m, W_PAGES_RELEASED, 1);
	}
	kvmm_shm_end(m);
	if (ret_released)
		*ret_released = s->n_released;
	return r;
}
