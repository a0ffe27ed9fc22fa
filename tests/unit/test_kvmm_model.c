/*
 * tests/unit/test_kvmm_model.c — randomized model-based test of kvmm.
 *
 * At least 200,000 random operations (create with prefix lookup, batched
 * growth with copy-on-write, fork, free, publish, evict, demote, swap out,
 * swap in, release of old pages into packed pages, each I/O operation
 * sometimes under an injected fault, copy failures, reads of the metadata
 * memfd) are run over several pool
 * configurations (block sizes 1 to 16, host and device pools, the latter
 * moved page by page or in batches, memory and
 * io_uring stores with and without O_DIRECT, shuffled placement, hash keys
 * cut to 3 bits so collisions are everyday, prefix caching off). After every
 * step the pool is checked against a reference model kept here:
 *
 *  - every live sequence has the model's length, swap state and a page table
 *    of the right size; kvmm_check() finds no broken invariant;
 *  - every page's refcount equals the number of page tables mapping it (no
 *    page owned twice, nothing leaked: free + used + cached = total);
 *  - the K/V content of every token of every resident sequence reads back
 *    exactly: the test plays the engine and writes, after each commit, a
 *    pattern that is a function of the token's whole prefix and position;
 *    of a released page, the share its pack callback keeps (the first
 *    block_size / pack_slots token slots) reads back from its packed page;
 *  - a prefix lookup never returns less than what live sequences have
 *    published for that prefix, never more than n - 1 tokens, and (by the
 *    content check) never a wrong page;
 *  - plan's page count is bracketed by the model and matches what commit
 *    allocates; a failed commit, swap-out or swap-in changes nothing.
 *
 * Environment: KVMM_MODEL_SEED (default fixed) picks the seed,
 * KVMM_MODEL_OPS (default 200000) the total number of operations. The seed
 * is printed at the start and with every failure.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvmm.h"
#include "client/kvc_impl.h"
#include "daemon/kvmap.h"

#define MAX_SEQS 24
#define DEAD_PROMPTS 8
#define DEFAULT_SEED 0x6b766d6d2024ull
#define DEFAULT_OPS 200000u

/* ST_MEM_ALIGN64: the memory store told to want 64-byte alignment, so that
 * a slot is larger than a page of the runs' sizes */
enum store { ST_MEM, ST_URING_DIRECT, ST_URING_BUFFERED, ST_MEM_ALIGN64 };

enum dev { DEV_NONE, DEV_PAGES, DEV_BATCHED }; /* pool in host memory, or behind page_ops (page by page, batched) */

struct run_cfg {
	const char *name;
	uint32_t bs, n_pages, token_bytes, n_slots, vocab;
	bool prefix;
	unsigned hash_bits; /* 0: full keys */
	uint64_t shuffle;
	enum store store;
	enum dev device;
	bool layout_copy; /* copy callback that copies only n_tokens slots */
	uint32_t pack;    /* kvmm_config.pack_slots: 0, 1 .. bs, or KVMM_PACK_NONE */
};

static const struct run_cfg runs[] = {
	{"bs4-mem-layoutcopy-shuffled-pack2", 4, 48, 8, 64, 3, true, 0, 7, ST_MEM, DEV_NONE, true, 2},
	{"bs1-uring-buffered-collisions-pack1", 1, 40, 8, 48, 3, true, 3, 0, ST_URING_BUFFERED, DEV_NONE, false, 1},
	{"bs16-uring-direct-fixedbufs-pack4", 16, 24, 256, 32, 2, true, 0, 9, ST_URING_DIRECT, DEV_NONE, false, 4},
	{"bs3-device-pool-collisions-pack3", 3, 40, 8, 48, 4, true, 5, 3, ST_MEM, DEV_PAGES, false, 3},
	{"bs5-device-batched-aligned-slots-nopack", 5, 40, 8, 48, 3, true, 0, 13, ST_MEM_ALIGN64, DEV_BATCHED, false,
	 KVMM_PACK_NONE},
	{"bs2-noprefix-uring-direct-bounce-pack2", 2, 32, 8, 40, 3, false, 0, 11, ST_URING_DIRECT, DEV_NONE, true, 2},
	{"bs8-large-pool-mem", 8, 160, 8, 200, 2, true, 0, 5, ST_MEM, DEV_NONE, false, 0},
};
#define N_RUNS (sizeof(runs) / sizeof(runs[0]))

struct mseq {
	bool live, swapped;
	int32_t *tok;
	uint64_t *ph; /* ph[i]: hash of tok[0..i] */
	uint32_t len, cap;
	uint32_t published;
	uint32_t released; /* kvmm_seq_release: leading pages released */
};

struct model {
	const struct run_cfg *c;
	uint64_t base_seed, seed, rng, step;
	const char *op;
	struct kvmm *m;
	struct kvmm_swap_io *fault;
	char *dev; /* device memory of a device pool */
	size_t page_bytes;
	bool copy_fail;
	struct mseq s[MAX_SEQS];
	int32_t *dead[DEAD_PROMPTS];
	uint32_t dead_len[DEAD_PROMPTS];
	uint32_t dead_next;
	uint32_t *refs;
	uint32_t max_len;
	uint64_t n_hits, n_hit_tokens, n_swaps, n_faults, n_cow_fail, n_batches, n_released;
};

static void die(struct model *md, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fail_msg("run %s step %" PRIu64 " op %s: %s (seed: KVMM_MODEL_SEED=%#" PRIx64 ")", md->c->name, md->step,
		 md->op, msg, md->base_seed);
}

#define EXPECT(md, cond, ...)                  \
	do {                                   \
		if (!(cond))                   \
			die(md, __VA_ARGS__);  \
	} while (0)

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rnd(struct model *md) { return mix(md->rng++ ^ md->seed); }
static uint32_t below(struct model *md, uint32_t n) { return n ? (uint32_t)(rnd(md) % n) : 0; }
static bool chance(struct model *md, uint32_t pct) { return below(md, 100) < pct; }

/* ---- the engine's side: content ------------------------------------------------------ */

static char *slot_ptr(struct model *md, int32_t page, uint32_t pos)
{
	char *base = md->c->device ? md->dev : kvmm_pool_base(md->m);

	return base + (size_t)page * md->page_bytes + (size_t)(pos % md->c->bs) * md->c->token_bytes;
}

static void write_token(struct model *md, int32_t page, uint32_t pos, uint64_t ph)
{
	uint64_t *w = (uint64_t *)slot_ptr(md, page, pos);

	for (uint32_t i = 0; i < md->c->token_bytes / 8; i++)
		w[i] = mix(ph + i);
}

static void check_token(struct model *md, uint32_t id, int32_t page, uint32_t pos, uint64_t ph)
{
	const uint64_t *w = (const uint64_t *)slot_ptr(md, page, pos);
	uint32_t nw = md->c->token_bytes / 8, idx[3] = {0, nw - 1, pos % nw};

	/* First, last and one more word per slot: a wrong page or a torn
	 * transfer shows, at a fraction of the cost of every word. */
	for (int k = 0; k < 3; k++)
		EXPECT(md, w[idx[k]] == mix(ph + idx[k]), "seq %u token %u (page %d) word %u: %#" PRIx64 ", want %#" PRIx64,
		       id, pos, page, idx[k], w[idx[k]], mix(ph + idx[k]));
}

static int copy_cb(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
	struct model *md = ud;
	char *base = md->c->device ? md->dev : kvmm_pool_base(md->m);

	if (md->copy_fail)
		return -EIO;
	memset(base + (size_t)dst * md->page_bytes, 0xee, md->page_bytes);
	memcpy(base + (size_t)dst * md->page_bytes, base + (size_t)src * md->page_bytes,
	       (size_t)n_tokens * md->c->token_bytes);
	return 0;
}

/* The share of a page that outlives its release: its first bs / pack token
 * slots, kept in slot `slot` of the packed page. */
static uint32_t kept_tokens(const struct model *md)
{
	return md->c->pack && md->c->pack != KVMM_PACK_NONE ? md->c->bs / md->c->pack : 0;
}

static int pack_cb(void *ud, uint32_t dst, uint32_t slot, uint32_t src)
{
	struct model *md = ud;
	char *base = md->c->device ? md->dev : kvmm_pool_base(md->m);
	size_t share = (size_t)kept_tokens(md) * md->c->token_bytes;

	EXPECT(md, slot < md->c->pack && dst < md->c->n_pages && src < md->c->n_pages && dst != src,
	       "pack(%u, %u, %u)", dst, slot, src);
	memcpy(base + (size_t)dst * md->page_bytes + slot * share, base + (size_t)src * md->page_bytes, share);
	return 0;
}

static int dev_read(void *ud, uint32_t page, void *host)
{
	struct model *md = ud;

	memcpy(host, md->dev + (size_t)page * md->page_bytes, md->page_bytes);
	return 0;
}

static int dev_write(void *ud, uint32_t page, const void *host)
{
	struct model *md = ud;

	memcpy(md->dev + (size_t)page * md->page_bytes, host, md->page_bytes);
	return 0;
}

static int dev_read_unused(void *ud, uint32_t page, void *host)
{
	(void)host;
	die(ud, "page_ops.read(%u) with batched callbacks set", page);
	return -EIO;
}

static int dev_write_unused(void *ud, uint32_t page, const void *host)
{
	(void)host;
	die(ud, "page_ops.write(%u) with batched callbacks set", page);
	return -EIO;
}

/* Batched: pages packed page_bytes apart in host memory, at most one swap
 * queue's worth per call. */
static int dev_read_n(void *ud, const uint32_t *pages, uint32_t n, void *host)
{
	struct model *md = ud;

	EXPECT(md, n >= 1 && n <= KVMM_SWAP_QUEUE_DEPTH, "read_n of %u pages", n);
	for (uint32_t i = 0; i < n; i++) {
		EXPECT(md, pages[i] < md->c->n_pages, "read_n page %u", pages[i]);
		memcpy((char *)host + (size_t)i * md->page_bytes, md->dev + (size_t)pages[i] * md->page_bytes,
		       md->page_bytes);
	}
	md->n_batches++;
	return 0;
}

static int dev_write_n(void *ud, const uint32_t *pages, uint32_t n, const void *host)
{
	struct model *md = ud;

	EXPECT(md, n >= 1 && n <= KVMM_SWAP_QUEUE_DEPTH, "write_n of %u pages", n);
	for (uint32_t i = 0; i < n; i++) {
		EXPECT(md, pages[i] < md->c->n_pages, "write_n page %u", pages[i]);
		memcpy(md->dev + (size_t)pages[i] * md->page_bytes, (const char *)host + (size_t)i * md->page_bytes,
		       md->page_bytes);
	}
	md->n_batches++;
	return 0;
}

/* ---- model sequences --------------------------------------------------------------------- */

static void mseq_push(struct mseq *s, int32_t tok)
{
	if (s->len == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 64;
		s->tok = realloc(s->tok, s->cap * sizeof(*s->tok));
		s->ph = realloc(s->ph, s->cap * sizeof(*s->ph));
		assert_non_null(s->tok);
		assert_non_null(s->ph);
	}
	s->tok[s->len] = tok;
	s->ph[s->len] = mix((s->len ? s->ph[s->len - 1] : 0x1234) ^ ((uint64_t)(uint32_t)tok << 17) ^ s->len);
	s->len++;
}

static void mseq_clear(struct mseq *s)
{
	s->live = s->swapped = false;
	s->len = s->published = s->released = 0;
}

static uint32_t pick(struct model *md, int want_swapped) /* -1: any live */
{
	uint32_t cand[MAX_SEQS], n = 0;

	for (uint32_t i = 0; i < MAX_SEQS; i++)
		if (md->s[i].live && (want_swapped < 0 || md->s[i].swapped == (want_swapped != 0)))
			cand[n++] = i;
	return n ? cand[below(md, n)] : UINT32_MAX;
}

/* Append n tokens to several sequences in one step, as the engine does:
 * plan, commit, write the K/V pattern, publish. */
static int step_grow(struct model *md, const uint32_t *ids, const int32_t *const *toks, const uint32_t *ns, uint32_t k,
		     bool publish)
{
	struct kvmm_grow g[8];
	uint32_t need = 0, newpages = 0, partials = 0, avail = kvmm_available_pages(md->m);
	struct kvmm_ledger l0, l1;
	int32_t *snap[8];
	uint32_t snap_n[8];
	int r, rp;

	for (uint32_t i = 0; i < k; i++) {
		const struct mseq *s = &md->s[ids[i]];
		uint32_t bs = md->c->bs;
		const int32_t *pg = kvmm_seq_pages(md->m, ids[i], &snap_n[i]);

		g[i] = (struct kvmm_grow){ids[i], ns[i], toks[i]};
		newpages += (s->len + ns[i] + bs - 1) / bs - (s->len + bs - 1) / bs;
		partials += s->len % bs && ns[i] ? 1 : 0;
		snap[i] = malloc((snap_n[i] + 1) * sizeof(int32_t));
		memcpy(snap[i], pg, snap_n[i] * sizeof(int32_t));
	}
	rp = kvmm_plan(md->m, g, k, &need);
	if (rp == 0) {
		EXPECT(md, need >= newpages && need <= newpages + partials, "plan says %u pages, model %u..%u", need,
		       newpages, newpages + partials);
		EXPECT(md, need <= avail, "plan fits %u pages in %u", need, avail);
	} else {
		EXPECT(md, rp == -ENOMEM, "plan: %d", rp);
		EXPECT(md, newpages + partials > avail, "plan ENOMEM but %u+%u <= %u", newpages, partials, avail);
	}
	kvmm_get_ledger(md->m, &l0);
	md->copy_fail = md->c->layout_copy || md->c->device ? chance(md, 5) : false;
	r = kvmm_commit(md->m, g, k);
	md->copy_fail = false;
	if (rp < 0)
		EXPECT(md, r == rp, "commit %d after plan %d", r, rp);
	if (r < 0) {
		EXPECT(md, r == -ENOMEM || r == -EIO, "commit: %d", r);
		if (r == -EIO)
			md->n_cow_fail++;
		/* Nothing changed. */
		for (uint32_t i = 0; i < k; i++) {
			uint32_t np;
			const int32_t *pg = kvmm_seq_pages(md->m, ids[i], &np);

			EXPECT(md, kvmm_seq_len(md->m, ids[i]) == md->s[ids[i]].len, "failed commit changed a length");
			EXPECT(md, np == snap_n[i] && !memcmp(pg, snap[i], np * sizeof(int32_t)),
			       "failed commit changed a page table");
		}
		goto out;
	}
	EXPECT(md, rp == 0, "commit succeeded after plan %d", rp);
	kvmm_get_ledger(md->m, &l1);
	EXPECT(md, l1.pages_allocated - l0.pages_allocated == need, "commit took %" PRIu64 " pages, plan said %u",
	       l1.pages_allocated - l0.pages_allocated, need);
	for (uint32_t i = 0; i < k; i++) {
		struct mseq *s = &md->s[ids[i]];
		uint32_t np, from = s->len;
		const int32_t *pg = kvmm_seq_pages(md->m, ids[i], &np);

		for (uint32_t j = 0; j < ns[i]; j++)
			mseq_push(s, toks[i][j]);
		for (uint32_t pos = from; pos < s->len; pos++)
			write_token(md, pg[pos / md->c->bs], pos, s->ph[pos]);
	}
	if (publish)
		for (uint32_t i = 0; i < k; i++) {
			EXPECT(md, kvmm_seq_publish(md->m, ids[i]) == 0, "publish");
			md->s[ids[i]].published = md->s[ids[i]].len / md->c->bs;
		}
out:
	for (uint32_t i = 0; i < k; i++)
		free(snap[i]);
	return r;
}

/* ---- full check ---------------------------------------------------------------------------- */

static void check_all(struct model *md)
{
	struct kvmm *m = md->m;
	uint32_t n_pages = kvmm_n_pages(m), bs = md->c->bs, live = 0, swapped = 0, used = 0, shared = 0;
	uint64_t resident = 0;
	struct kvmm_stats st;
	char why[256] = "";

	EXPECT(md, kvmm_check(m, why, sizeof(why)) == 0, "kvmm_check: %s", why);
	memset(md->refs, 0, n_pages * sizeof(*md->refs));
	for (uint32_t id = 0; id < MAX_SEQS; id++) {
		const struct mseq *s = &md->s[id];
		const int32_t *pg;
		uint32_t np = 0;

		if (!s->live) {
			EXPECT(md, kvmm_seq_pages(m, id, &np) == NULL, "dead seq %u has pages", id);
			continue;
		}
		live++;
		EXPECT(md, kvmm_seq_len(m, id) == s->len, "seq %u: len %u, model %u", id, kvmm_seq_len(m, id), s->len);
		EXPECT(md, kvmm_seq_is_swapped(m, id) == s->swapped, "seq %u: swapped %d, model %d", id,
		       kvmm_seq_is_swapped(m, id), s->swapped);
		pg = kvmm_seq_pages(m, id, &np);
		EXPECT(md, pg && np == (s->len + bs - 1) / bs, "seq %u: %u pages for %u tokens", id, np, s->len);
		for (uint32_t i = 0; i < np; i++) {
			bool head = md->c->pack != KVMM_PACK_NONE && md->c->pack && i % md->c->pack == 0;
			if (i < s->released && !head) {
				EXPECT(md, pg[i] == KVMM_RELEASED, "seq %u released page %u maps %d", id, i, pg[i]);
				continue;
			}
			if (pg[i] < 0) {
				EXPECT(md, s->swapped && pg[i] == -1, "resident seq %u has no page %u (%d)", id, i, pg[i]);
				continue;
			}
			EXPECT(md, (uint32_t)pg[i] < n_pages, "seq %u page %u = %d", id, i, pg[i]);
			md->refs[pg[i]]++;
		}
		if (s->swapped) {
			swapped++;
			continue;
		}
		resident += s->len;
		for (uint32_t pos = 0; pos < s->len; pos++) {
			uint32_t i = pos / bs, k = md->c->pack;
			if (i >= s->released) {
				check_token(md, id, pg[i], pos, s->ph[pos]);
			} else if (pos % bs < kept_tokens(md)) {
				/* the packed page's slot i % k holds the kept tokens */
				uint32_t at = (i % k) * kept_tokens(md) + pos % bs;
				check_token(md, id, pg[i - i % k], at, s->ph[pos]);
			}
		}
	}
	for (uint32_t p = 0; p < n_pages; p++) {
		EXPECT(md, kvmm_page_refcount(m, p) == md->refs[p], "page %u: refcount %u, owners %u", p,
		       kvmm_page_refcount(m, p), md->refs[p]);
		used += md->refs[p] > 0;
		shared += md->refs[p] > 1;
	}
	kvmm_get_stats(m, &st);
	EXPECT(md, st.pages_used == used && st.pages_shared == shared, "stats used %u shared %u, model %u %u",
	       st.pages_used, st.pages_shared, used, shared);
	EXPECT(md, st.pages_free + st.pages_used + st.pages_cached == st.pages_total, "pages leaked: %u+%u+%u != %u",
	       st.pages_free, st.pages_used, st.pages_cached, st.pages_total);
	EXPECT(md, kvmm_available_pages(m) == st.pages_free + st.pages_cached, "available pages");
	EXPECT(md, st.seqs_live == live && st.seqs_swapped == swapped, "seqs %u/%u, model %u/%u", st.seqs_live,
	       st.seqs_swapped, live, swapped);
	EXPECT(md, st.tokens_resident == resident, "tokens resident %" PRIu64 ", model %" PRIu64, st.tokens_resident,
	       resident);
	EXPECT(md, st.pages_swapped == kvmm_swap_slots(m) - kvmm_swap_slots_free(m), "swap slots");
	if (!md->c->prefix)
		EXPECT(md, st.pages_cached == 0 && st.pages_demoted == 0, "cache without prefix caching");
}

/* ---- operations --------------------------------------------------------------------------------- */

static void arm_fault(struct model *md, uint32_t op_mask)
{
	static const int errs[] = {-EIO, -ENOSPC, KVMM_IO_FAULT_SHORT, -EIO};
	struct kvmm_io_fault f = {
		.after = below(md, 4), .ops_mask = op_mask, .count = 1 + below(md, 2), .error = errs[below(md, 4)],
	};

	assert_int_equal(kvmm_swap_io_fault_arm(md->fault, &f), 0);
}

static void disarm(struct model *md)
{
	assert_int_equal(kvmm_swap_io_fault_arm(md->fault, NULL), 0);
}

static uint32_t lower_bound(struct model *md, const int32_t *prompt, uint32_t n)
{
	uint32_t lb = 0, bs = md->c->bs;

	if (!md->c->prefix || n < 2)
		return 0;
	for (uint32_t id = 0; id < MAX_SEQS; id++) {
		const struct mseq *s = &md->s[id];
		uint32_t c = 0, full, cand;

		/* a released page may have left the cache: nothing is promised */
		if (!s->live || s->swapped || s->released)
			continue;
		while (c < n && c < s->len && s->tok[c] == prompt[c])
			c++;
		full = c / bs < s->published ? c / bs : s->published;
		cand = full * bs < n - 1 ? full * bs : n - 1;
		if (cand > lb)
			lb = cand;
	}
	return lb;
}

static void op_new(struct model *md)
{
	uint32_t id, n, hit = 0, lb, bs = md->c->bs;
	int32_t *prompt;
	struct mseq *s;
	int r;

	md->op = "new+attach+prefill";
	r = kvmm_seq_new(md->m, &id);
	if (r == -ENOSPC)
		return;
	EXPECT(md, r == 0 && id < MAX_SEQS, "seq_new: %d id %u", r, id);
	s = &md->s[id];
	EXPECT(md, !s->live, "seq_new gave live id %u", id);
	n = 1 + below(md, md->max_len / 2);
	prompt = malloc(n * sizeof(*prompt));
	{
		uint32_t from = 0, src = below(md, 10);

		if (src < 5) { /* a live sequence's prefix */
			uint32_t o = pick(md, -1);

			if (o != UINT32_MAX) {
				from = below(md, md->s[o].len + 1);
				from = from < n ? from : n;
				if (from)
					memcpy(prompt, md->s[o].tok, from * sizeof(*prompt));
			}
		} else if (src < 8) { /* a finished one's, likely cached */
			uint32_t d = below(md, DEAD_PROMPTS);

			from = md->dead_len[d] < n ? md->dead_len[d] : n;
			if (from)
				memcpy(prompt, md->dead[d], from * sizeof(*prompt));
		}
		for (uint32_t i = from; i < n; i++)
			prompt[i] = (int32_t)below(md, md->c->vocab);
	}
	lb = lower_bound(md, prompt, n);
	if (chance(md, 10))
		arm_fault(md, 1u << KVMM_IO_READ);
	r = kvmm_prefix_attach(md->m, id, prompt, n, &hit);
	disarm(md);
	EXPECT(md, r == 0, "attach: %d", r);
	EXPECT(md, hit <= (n ? n - 1 : 0), "hit %u for %u tokens", hit, n);
	EXPECT(md, hit >= lb, "hit %u below what live sequences published (%u)", hit, lb);
	EXPECT(md, md->c->prefix || hit == 0, "hit without prefix caching");
	s->live = true;
	for (uint32_t i = 0; i < hit; i++)
		mseq_push(s, prompt[i]);
	s->published = hit / bs;
	md->n_hits += hit > 0;
	md->n_hit_tokens += hit;
	EXPECT(md, kvmm_seq_set_prompt_tokens(md->m, id, n) == 0, "set prompt");
	/* Prefill the rest in one to three chunks; stop when memory runs out. */
	for (uint32_t at = hit; at < n;) {
		uint32_t chunk = 1 + below(md, n - at);
		const int32_t *t = prompt + at;

		if (step_grow(md, &id, &t, &chunk, 1, chance(md, 85)) < 0)
			break;
		at += chunk;
	}
	free(prompt);
}

static void op_grow(struct model *md)
{
	uint32_t ids[4], ns[4], k = 0, want = 1 + below(md, 4);
	int32_t *toks[4];

	md->op = "grow";
	for (uint32_t tries = 0; tries < 8 && k < want; tries++) {
		uint32_t id = pick(md, 0);
		bool dup = false;

		if (id == UINT32_MAX)
			break;
		for (uint32_t j = 0; j < k; j++)
			dup |= ids[j] == id;
		if (dup || md->s[id].len >= md->max_len)
			continue;
		ids[k] = id;
		ns[k] = 1 + below(md, chance(md, 70) ? 2 : 2 * md->c->bs);
		toks[k] = malloc(ns[k] * sizeof(int32_t));
		for (uint32_t j = 0; j < ns[k]; j++)
			toks[k][j] = (int32_t)below(md, md->c->vocab);
		k++;
	}
	if (k)
		step_grow(md, ids, (const int32_t *const *)toks, ns, k, chance(md, 80));
	for (uint32_t j = 0; j < k; j++)
		free(toks[j]);
}

/* Cut a resident sequence's unpublished tail back (speculative decoding's
 * rejected drafts): refused into published or released pages, else the
 * model's tokens stop at the cut, and later growth rewrites the positions. */
static void op_truncate(struct model *md)
{
	uint32_t id = pick(md, 0), bs = md->c->bs, floor, n;
	struct mseq *s;
	int r;

	md->op = "truncate";
	if (id == UINT32_MAX)
		return;
	s = &md->s[id];
	floor = (s->published > s->released ? s->published : s->released) * bs;
	if (floor > s->len)
		floor = s->len;
	if (floor && chance(md, 20)) {
		r = kvmm_seq_truncate(md->m, id, floor - 1 - below(md, floor));
		EXPECT(md, r == -EBUSY, "truncate into published pages: %d", r);
		return;
	}
	n = floor + below(md, s->len - floor + 1);
	r = kvmm_seq_truncate(md->m, id, n);
	EXPECT(md, r == 0, "truncate %u of %u (published %u released %u): %d", n, s->len, s->published, s->released, r);
	s->len = n;
	EXPECT(md, kvmm_seq_len(md->m, id) == n, "length after truncate");
}

static void op_fork(struct model *md)
{
	uint32_t p = pick(md, 0), c;
	int r;

	md->op = "fork";
	if (p == UINT32_MAX)
		return;
	r = kvmm_seq_fork(md->m, p, &c);
	if (r == -ENOSPC)
		return;
	EXPECT(md, r == 0 && c < MAX_SEQS && !md->s[c].live, "fork: %d", r);
	md->s[c].live = true;
	for (uint32_t i = 0; i < md->s[p].len; i++)
		mseq_push(&md->s[c], md->s[p].tok[i]);
	md->s[c].published = md->s[p].published;
	md->s[c].released = md->s[p].released;
}

static void op_free(struct model *md)
{
	uint32_t id = pick(md, -1), d;
	struct kvmm_seq_record rec;
	struct mseq *s;

	md->op = "free";
	if (id == UINT32_MAX)
		return;
	s = &md->s[id];
	EXPECT(md, kvmm_seq_finish(md->m, id, &rec) == 0, "finish");
	EXPECT(md, rec.seq == id && rec.len_tokens == s->len && rec.prompt_tokens + rec.generated_tokens == s->len,
	       "record: seq %u len %u prompt %u gen %u", rec.seq, rec.len_tokens, rec.prompt_tokens,
	       rec.generated_tokens);
	EXPECT(md, rec.retained_tokens <= s->len && rec.retained_tokens % md->c->bs == 0, "record: retained %u",
	       rec.retained_tokens);
	d = md->dead_next++ % DEAD_PROMPTS;
	md->dead[d] = realloc(md->dead[d], (s->len + 1) * sizeof(int32_t));
	if (s->len)
		memcpy(md->dead[d], s->tok, s->len * sizeof(int32_t));
	md->dead_len[d] = s->len;
	mseq_clear(s);
}

static void op_publish(struct model *md)
{
	uint32_t id = pick(md, 0);

	md->op = "publish";
	if (id == UINT32_MAX)
		return;
	EXPECT(md, kvmm_seq_publish(md->m, id) == 0, "publish");
	md->s[id].published = md->s[id].len / md->c->bs;
}

static void op_evict(struct model *md)
{
	uint32_t n = 1 + below(md, 8), got = 0;

	md->op = "evict";
	EXPECT(md, kvmm_cache_evict(md->m, n, &got) == 0, "evict");
}

static void op_demote(struct model *md)
{
	uint32_t n = 1 + below(md, 8), got = 0;
	bool armed = chance(md, 30);
	int r;

	md->op = "demote";
	if (armed)
		arm_fault(md, 1u << KVMM_IO_WRITE);
	r = kvmm_cache_demote(md->m, n, &got);
	disarm(md);
	EXPECT(md, r == 0 || (armed && r < 0), "demote: %d", r);
	EXPECT(md, r < 0 || got <= n, "demoted %u of %u", got, n);
}

static void op_swap_out(struct model *md)
{
	uint32_t id = pick(md, 0);
	bool armed = chance(md, 30);
	int r;

	md->op = "swap_out";
	if (id == UINT32_MAX)
		return;
	if (armed)
		arm_fault(md, 1u << KVMM_IO_WRITE);
	r = kvmm_seq_swap_out(md->m, id);
	disarm(md);
	if (r == 0) {
		md->s[id].swapped = true;
		md->n_swaps++;
		return;
	}
	EXPECT(md, r == -ENOSPC || (armed && (r == -EIO || r == -ENOSPC)), "swap_out: %d", r);
	md->n_faults += armed;
}

static void op_swap_in(struct model *md)
{
	uint32_t id = pick(md, 1);
	bool armed = chance(md, 30);
	int r;

	md->op = "swap_in";
	if (id == UINT32_MAX)
		return;
	if (armed)
		arm_fault(md, 1u << KVMM_IO_READ);
	r = kvmm_seq_swap_in(md->m, id);
	disarm(md);
	if (r == 0) {
		md->s[id].swapped = false;
		return;
	}
	EXPECT(md, r == -ENOMEM || (armed && (r == -EIO || r == -ENOSPC)), "swap_in: %d", r);
	md->n_faults += armed && r != -ENOMEM;
}

/* Release the oldest pages of a resident sequence, up to a random point at
 * most its published pages; with no room for a packed page kvmm stops
 * early, never goes back. */
static void op_release(struct model *md)
{
	uint32_t id = pick(md, 0), rel = 0, upto;
	struct mseq *s;
	int r;

	md->op = "release";
	if (id == UINT32_MAX)
		return;
	s = &md->s[id];
	upto = s->released + below(md, s->published - s->released + 1);
	if (chance(md, 5))
		upto = s->published + 1 + below(md, 3); /* past the published pages */
	r = kvmm_seq_release(md->m, id, upto, &rel);
	if (!md->c->pack) {
		EXPECT(md, r == -EOPNOTSUPP, "release without pack slots: %d", r);
		return;
	}
	if (upto > s->published) {
		EXPECT(md, r == -EINVAL, "release past the published pages: %d", r);
		return;
	}
	EXPECT(md, r == 0, "release: %d", r);
	EXPECT(md, rel >= s->released && rel <= (upto > s->released ? upto : s->released), "released %u (was %u, upto %u)",
	       rel, s->released, upto);
	EXPECT(md, rel == kvmm_seq_released(md->m, id), "kvmm_seq_released");
	/* it stops short only for want of a page (a packed page, or a copy of
	 * a shared one) */
	EXPECT(md, rel == upto || upto < s->released ||
			   (md->c->pack != KVMM_PACK_NONE && kvmm_available_pages(md->m) == 0),
	       "release stopped at %u of %u with %u pages available", rel, upto, kvmm_available_pages(md->m));
	md->n_released += rel - s->released;
	s->released = rel;
}

/* Another process's picture of the pool (libkvclient's KV map over the
 * metadata memfd, as the daemon describes it) against the model's owners of
 * each page (counted by the last check_all, nothing changed since) and
 * kvmm's counters. */
static void op_map(struct model *md)
{
	uint32_t n = kvmm_n_pages(md->m), *pages = calloc(n, sizeof(*pages));
	struct kvc_kvmap_counts k;
	struct kvmm_stats st;
	struct ipc_kvmap d;
	kvc_kvmap *km = NULL;

	md->op = "map";
	EXPECT(md, pages != NULL, "calloc");
	kvd_kvmap_describe(md->m, &d);
	EXPECT(md, kvc_kvmap_attach_fd(kvmm_stats_fd(md->m), &d, &km) == 0, "kvc_kvmap_attach_fd");
	EXPECT(md, kvc_kvmap_read(km, pages, &k) == 0, "kvc_kvmap_read");
	for (uint32_t p = 0; p < n; p++)
		EXPECT(md, md->refs[p] ? pages[p] == md->refs[p] : pages[p] == KVC_PAGE_FREE || pages[p] == KVC_PAGE_CACHED,
		       "page %u: map %#x, owners %u", p, pages[p], md->refs[p]);
	kvmm_get_stats(md->m, &st);
	EXPECT(md, k.pages_free == st.pages_free && k.pages_private + k.pages_shared == st.pages_used &&
			   k.pages_shared == st.pages_shared && k.pages_cached == st.pages_cached &&
			   k.pages_swapped == st.pages_swapped && k.pages_demoted == st.pages_demoted,
	       "map counts %u/%u/%u/%u/%u/%u, stats %u/%u/%u/%u/%u", k.pages_free, k.pages_private, k.pages_shared,
	       k.pages_cached, k.pages_swapped, k.pages_demoted, st.pages_free, st.pages_used, st.pages_shared,
	       st.pages_cached, st.pages_swapped);
	kvc_kvmap_close(km);
	free(pages);
}

/* ---- one run --------------------------------------------------------------------------------------- */

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : def;
}

static struct kvmm_swap_io *open_store(const struct run_cfg *c, size_t page_bytes)
{
	struct kvmm_swap_io *io = NULL, *f = NULL;
	uint64_t slot = c->store == ST_URING_DIRECT ? (page_bytes + 4095) / 4096 * 4096
			: c->store == ST_MEM_ALIGN64 ? (page_bytes + 63) / 64 * 64 : page_bytes;
	uint64_t bytes = (uint64_t)c->n_slots * slot;

	if (c->store == ST_MEM || c->store == ST_MEM_ALIGN64) {
		assert_int_equal(kvmm_swap_io_mem_new(bytes, &io), 0);
		if (c->store == ST_MEM_ALIGN64)
			io->align = 64;
	} else {
		char path[4096];
		const char *d = getenv("TMPDIR");

		/* a fresh directory: kvmm creates the file and refuses an existing one */
		snprintf(path, sizeof(path), "%s/kvmm-model-swap-XXXXXX", d && *d ? d : "/tmp");
		assert_non_null(mkdtemp(path));
		strcat(path, "/swap");
		assert_int_equal(kvmm_swap_io_uring_open(path, bytes,
							 KVMM_SWAP_OPEN_UNLINK |
								 (c->store == ST_URING_BUFFERED ? KVMM_SWAP_OPEN_NO_DIRECT : 0),
							 &io),
				 0);
		*strrchr(path, '/') = 0;
		rmdir(path); /* the file is already unlinked */
	}
	assert_int_equal(kvmm_swap_io_fault_new(io, &f), 0);
	return f;
}

static void run_model(const struct run_cfg *c, uint64_t base_seed, uint64_t ops)
{
	struct model *md = calloc(1, sizeof(*md));
	struct kvmm_config kc = {0};
	struct kvmm_stats st;
	struct kvmm_ledger l;

	assert_non_null(md);
	md->c = c;
	md->base_seed = base_seed;
	md->seed = base_seed ^ (uint64_t)(c - runs) * 0x100000001b3ull;
	md->op = "create";
	md->page_bytes = (size_t)c->bs * c->token_bytes;
	md->max_len = c->n_pages * c->bs / 3;
	kc.page_bytes = md->page_bytes;
	kc.block_size = c->bs;
	kc.pool_bytes = (uint64_t)c->n_pages * md->page_bytes;
	kc.max_seqs = MAX_SEQS;
	kc.prefix_cache = c->prefix;
	kc.shuffle_seed = c->shuffle;
	kc.pack_slots = c->pack;
	if (c->device) {
		md->dev = calloc(c->n_pages, md->page_bytes);
		assert_non_null(md->dev);
		kc.page_ops = (struct kvmm_page_ops){.copy = copy_cb, .read = dev_read, .write = dev_write, .ud = md};
		if (c->device == DEV_BATCHED) {
			/* the per-page callbacks stay set (kvmm requires them) but must go unused */
			kc.page_ops.read = dev_read_unused;
			kc.page_ops.write = dev_write_unused;
			kc.page_ops.read_n = dev_read_n;
			kc.page_ops.write_n = dev_write_n;
		}
	} else if (c->layout_copy) {
		kc.page_ops = (struct kvmm_page_ops){.copy = copy_cb, .ud = md};
	}
	kc.page_ops.pack = pack_cb;
	kc.page_ops.ud = md;
	md->fault = open_store(c, md->page_bytes);
	EXPECT(md, kvmm_create_with_io(&kc, md->fault, &md->m) == 0, "create");
	if (c->hash_bits)
		assert_int_equal(kvmm_debug_set_hash_bits(md->m, c->hash_bits), 0);
	md->refs = calloc(c->n_pages, sizeof(*md->refs));
	assert_non_null(md->refs);

	for (md->step = 0; md->step < ops; md->step++) {
		uint32_t w = below(md, 100);

		if (w < 14)
			op_new(md);
		else if (w < 41)
			op_grow(md);
		else if (w < 44)
			op_truncate(md);
		else if (w < 51)
			op_fork(md);
		else if (w < 61)
			op_free(md);
		else if (w < 64)
			op_publish(md);
		else if (w < 67)
			op_release(md);
		else if (w < 70)
			op_evict(md);
		else if (w < 75)
			op_demote(md);
		else if (w < 87)
			op_swap_out(md);
		else if (w < 99)
			op_swap_in(md);
		else
			op_map(md);
		check_all(md);
	}
	kvmm_get_stats(md->m, &st);
	kvmm_get_ledger(md->m, &l);
	printf("    %s, %" PRIu64 " ops: %" PRIu64 " attach hits (%" PRIu64 " tokens), %" PRIu64 " CoW, %" PRIu64
	       " swap-outs, %" PRIu64 " swap-in pages remapped, %" PRIu64 " faulted I/O ops, %" PRIu64
	       " failed copies, %" PRIu64 " demoted, %" PRIu64 " promoted, %" PRIu64 " dedup, %" PRIu64
	       " evicted (%" PRIu64 " reclaim, %" PRIu64 " orphan)\n",
	       c->name, ops, md->n_hits, md->n_hit_tokens, st.cow_copies, md->n_swaps, l.swap_in_remapped_pages,
	       md->n_faults, md->n_cow_fail, l.pages_demoted, l.pages_promoted, l.pages_deduplicated, st.pages_evicted,
	       l.pages_evicted_reclaim, l.pages_evicted_orphan);
	printf("    %s: %" PRIu64 " pages released, %u packed now\n", c->name, md->n_released, st.pages_packed);
	if (c->pack)
		EXPECT(md, md->n_released > 0, "nothing was ever released");
	if (c->device == DEV_BATCHED) {
		printf("    %s: %" PRIu64 " batched device transfers\n", c->name, md->n_batches);
		EXPECT(md, md->n_batches > 0, "the batched device callbacks were never used");
	}
	/* Everything freed: the whole pool is back. */
	md->op = "teardown";
	for (uint32_t id = 0; id < MAX_SEQS; id++)
		if (md->s[id].live) {
			EXPECT(md, kvmm_seq_free(md->m, id) == 0, "free");
			mseq_clear(&md->s[id]);
		}
	check_all(md);
	kvmm_get_stats(md->m, &st);
	EXPECT(md, st.pages_used == 0 && st.pages_free + st.pages_cached == st.pages_total, "pool not whole at the end");
	EXPECT(md, kvmm_swap_slots_free(md->m) + st.pages_demoted == kvmm_swap_slots(md->m), "slots leaked");
	kvmm_destroy(md->m);
	for (uint32_t id = 0; id < MAX_SEQS; id++) {
		free(md->s[id].tok);
		free(md->s[id].ph);
	}
	for (uint32_t d = 0; d < DEAD_PROMPTS; d++)
		free(md->dead[d]);
	free(md->refs);
	free(md->dev);
	free(md);
}

static void test_model(void **state)
{
	const struct run_cfg *c = &runs[(uintptr_t)*state];
	uint64_t seed = env_u64("KVMM_MODEL_SEED", DEFAULT_SEED);
	uint64_t total = env_u64("KVMM_MODEL_OPS", DEFAULT_OPS);
	uint64_t ops = (total + N_RUNS - 1) / N_RUNS;

	printf("    seed %#" PRIx64 " (KVMM_MODEL_SEED), %" PRIu64 " ops in this run (KVMM_MODEL_OPS=%" PRIu64 " total)\n",
	       seed, ops, total);
	run_model(c, seed, ops);
}

int main(void)
{
	struct CMUnitTest tests[N_RUNS];

	for (size_t i = 0; i < N_RUNS; i++)
		tests[i] = (struct CMUnitTest){runs[i].name, test_model, NULL, NULL, (void *)(uintptr_t)i};
	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests_name("kvmm model", tests, NULL, NULL);
}
