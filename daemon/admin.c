/*
 * daemon/admin.c — STATS, PS, KVMAP, HIST, LEDGER and CACHE. Pool and scheduler
 * counters, latency histograms and the KV map (page states, never whose
 * pages they are) are for everyone; the prefix-cache counters in STATS are
 * the caller's own uid's unless it is an admin (the machine's would tell
 * one user when another's prompts hit the cache); PS and LEDGER show a
 * request's owner and details only to its own user or an admin (root or
 * server.admin_groups). CACHE (kvctl cache save / drop) is for an admin only:
 * it writes or removes the machine's cache file and empties everyone's cache.
 */
#include "server_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hist.h"
#include "kvmap.h"
#include "kvmm.h"

static struct user_counters *user_counters_find(struct kvd_server *srv, uid_t uid, bool add)
{
	for (uint32_t i = 0; i < srv->n_ucount; i++)
		if (srv->ucount[i].uid == uid)
			return &srv->ucount[i];
	if (!add || srv->n_ucount >= SRV_MAX_USER_COUNTERS)
		return NULL;
	if (srv->n_ucount == srv->cap_ucount) {
		uint32_t cap = srv->cap_ucount ? srv->cap_ucount * 2 : 16;
		struct user_counters *n = realloc(srv->ucount, cap * sizeof(*n));

		if (!n)
			return NULL;
		srv->ucount = n;
		srv->cap_ucount = cap;
	}
	srv->ucount[srv->n_ucount] = (struct user_counters){ .uid = uid };
	return &srv->ucount[srv->n_ucount++];
}

void user_counters_add(struct kvd_server *srv, uid_t uid, uint64_t query_tokens, uint64_t hit_tokens,
		       uint64_t adopted_hit_tokens)
{
	struct user_counters *u = user_counters_find(srv, uid, true);

	if (!u)
		return;
	u->prefix_lookups++;
	u->prefix_query_tokens += query_tokens;
	u->prefix_hit_tokens += hit_tokens;
	u->adopted_hit_tokens += adopted_hit_tokens;
}

void user_counters_add_spec(struct kvd_server *srv, uid_t uid, const struct kvd_request_result *res)
{
	struct user_counters *u = res->spec_verify_steps ? user_counters_find(srv, uid, true) : NULL;

	if (!u)
		return;
	u->spec_verify_steps += res->spec_verify_steps;
	u->spec_drafted_tokens += res->spec_drafted_tokens;
	u->spec_accepted_tokens += res->spec_accepted_tokens;
	for (unsigned i = 0; i < KVD_SPEC_RUN_BUCKETS; i++)
		u->spec_runs[i] += res->spec_runs[i];
}

/* The speculative-decoding counters of STATS, from totals and a histogram. */
static void stats_spec(struct ipc_stats *st, uint64_t verify, uint64_t drafted, uint64_t accepted,
		       const uint64_t runs[KVD_SPEC_RUN_BUCKETS])
{
	_Static_assert(KVD_SPEC_RUN_BUCKETS == 5, "STATS carries five acceptance buckets");
	st->spec_verify_steps = verify;
	st->spec_drafted_tokens = drafted;
	st->spec_accepted_tokens = accepted;
	st->spec_runs_0 = runs[0];
	st->spec_runs_1 = runs[1];
	st->spec_runs_2_3 = runs[2];
	st->spec_runs_4_7 = runs[3];
	st->spec_runs_8_16 = runs[4];
}

void fill_stats(struct kvd_server *srv, const struct client *c, struct ipc_stats *st)
{
	struct kvmm_stats ks;
	struct kvmm_ledger led;
	struct kvd_sched_stats ss;

	kvmm_get_stats(srv->kv, &ks);
	kvmm_get_ledger(srv->kv, &led);
	kvd_sched_get_stats(srv->sched, &ss);
	memset(st, 0, sizeof(*st));
	st->pages_total = ks.pages_total;
	st->pages_free = ks.pages_free;
	st->pages_used = ks.pages_used;
	st->pages_shared = ks.pages_shared;
	st->pages_cached = ks.pages_cached;
	st->pages_swapped = ks.pages_swapped;
	st->page_bytes = ks.page_bytes;
	st->block_size = ks.block_size;
	st->kv_bytes_per_token = ks.block_size ? ks.page_bytes / ks.block_size : 0;
	st->pool_bytes = (uint64_t)ks.pages_total * ks.page_bytes;
	st->tokens_resident = ks.tokens_resident;
	if (st->kv_bytes_per_token && led.kv_bytes_allocated > led.kv_bytes_useful)
		st->slack_tokens = (led.kv_bytes_allocated - led.kv_bytes_useful) / st->kv_bytes_per_token;
	/* a session turn reusing its kept KV is a prefix hit kvmm never saw */
	st->prefix_lookups = ks.prefix_lookups + ss.session_lookups;
	st->prefix_query_tokens = ks.prefix_query_tokens + ss.session_query_tokens;
	st->prefix_hit_tokens = ks.prefix_hit_tokens + ss.session_hit_tokens;
	st->pages_evicted = ks.pages_evicted;
	st->cow_copies = ks.cow_copies;
	st->swap_out_pages = ks.swap_out_pages;
	st->swap_in_pages = ks.swap_in_pages;
	st->swap_bytes = (uint64_t)ks.swap_slots * ks.page_bytes;
	st->requests_running = ss.running;
	st->requests_waiting = ss.waiting + srv->n_uploading;
	st->requests_swapped = ss.swapped;
	st->requests_completed = ss.requests_done;
	st->requests_rejected = srv->requests_rejected;
	st->clients = srv->n_clients;
	st->sessions = srv->n_sessions;
	st->prompt_tokens_total = srv->prompt_tokens_total;
	st->generated_tokens_total = srv->generated_tokens_total;
	st->steps = ss.steps;
	st->uptime_ns = now_ns() - srv->t_start;
	st->ledger_records_dropped = kvd_ledger_dropped(srv->ledger);
	st->swap_errors = led.swap_errors;
	st->swap_fallback_recomputes = ss.swap_fallback_recomputes;
	st->pages_demoted = ks.pages_demoted;
	st->samples_forked = ss.samples_forked;
	st->pages_adopted = led.pages_adopted;
	st->pages_packed = ks.pages_packed;
	st->pages_released = ks.pages_released;
	st->adopted_hit_tokens = ks.adopted_hit_tokens;
	st->gram_checked = ss.gram_checked;
	st->gram_masked = ss.gram_masked;
	stats_spec(st, ss.spec_verifies, ss.spec_drafted, ss.spec_accepted, ss.spec_runs);
	switch ((enum kvd_spec_mode)ss.spec_mode) {
	case KVD_SPEC_OFF: st->spec_mode = IPC_SPEC_MODE_OFF; break;
	case KVD_SPEC_LOOKUP: st->spec_mode = IPC_SPEC_MODE_LOOKUP; break;
	case KVD_SPEC_DRAFT: st->spec_mode = IPC_SPEC_MODE_DRAFT; break;
	case KVD_SPEC_AUTO: st->spec_mode = IPC_SPEC_MODE_AUTO; break;
	}
	st->spec_draft_pages_total = ss.spec_draft_pages_total;
	st->spec_draft_pages_used = ss.spec_draft_pages_used;
	st->spec_draft_reclaims = ss.spec_draft_reclaims;
	if (c && !c->admin) {
		const struct user_counters *u = user_counters_find(srv, c->cred.uid, false);
		static const uint64_t none[KVD_SPEC_RUN_BUCKETS];

		if (u)
			stats_spec(st, u->spec_verify_steps, u->spec_drafted_tokens, u->spec_accepted_tokens, u->spec_runs);
		else
			stats_spec(st, 0, 0, 0, none);

		st->prefix_lookups = u ? u->prefix_lookups : 0;
		st->prefix_query_tokens = u ? u->prefix_query_tokens : 0;
		st->prefix_hit_tokens = u ? u->prefix_hit_tokens : 0;
		st->adopted_hit_tokens = u ? u->adopted_hit_tokens : 0; /* adopted hits are prefix hits */
	}
}

void handle_ps(struct client *c, uint64_t rid)
{
	struct kvd_server *srv = c->srv;
	size_t cap = 64, n;
	struct kvd_sched_req_info *info;
	struct ipc_ps_entry *ent;
	size_t n_ent = 0;
	uint64_t t = now_ns();

	for (;;) {
		info = malloc(cap * sizeof(*info));
		if (!info)
			goto oom;
		n = kvd_sched_list(srv->sched, info, cap);
		if (n < cap)
			break;
		free(info);
		cap *= 4;
	}
	ent = calloc(n + srv->n_uploading + 1, sizeof(*ent));
	if (!ent) {
		free(info);
		goto oom;
	}
	static const uint32_t state_map[] = { IPC_REQ_WAITING, IPC_REQ_PREFILL, IPC_REQ_RUNNING, IPC_REQ_SWAPPED };
	/* Administrators see everyone's requests; others only their own
	 * (pids, session ids and sizes of other users' work are private). */
	for (size_t i = 0; i < n; i++) {
		struct greq *gr = (struct greq *)(uintptr_t)info[i].req_id;
		if (!c->admin && (!gr->c || gr->c->cred.uid != c->cred.uid))
			continue;
		/* clients older than samples require sample 0: they see the first only */
		if (info[i].sample && c->client_version < IPC_SAMPLES_SERVER_VERSION)
			continue;
		ent[n_ent++] = (struct ipc_ps_entry){
			.request_id = gr->id,
			.client_id = gr->c ? gr->c->id : 0,
			.session_id = info[i].session,
			.age_ns = t - gr->t_recv,
			.pid = gr->c ? (uint32_t)gr->c->cred.pid : 0,
			.uid = gr->c ? (uint32_t)gr->c->cred.uid : 0,
			.state = state_map[info[i].state & 3],
			.pages = info[i].pages,
			.pages_shared = info[i].pages_shared,
			.prompt_tokens = info[i].prompt_tokens,
			.cached_tokens = info[i].cached_tokens,
			.generated_tokens = info[i].generated_tokens,
			.max_tokens = info[i].max_tokens,
			.sample = info[i].sample,
		};
	}
	for (struct client *o = srv->clients; o; o = o->next)
		for (struct upload *u = o->up_head; u && n_ent < n + srv->n_uploading; u = u->next)
			if (u->kind == UP_GENERATE && (c->admin || o->cred.uid == c->cred.uid))
				ent[n_ent++] = (struct ipc_ps_entry){
					.request_id = u->req_id,
					.client_id = o->id,
					.session_id = u->gr->sess ? u->gr->sess->id : 0,
					.age_ns = t - u->gr->t_recv,
					.pid = (uint32_t)o->cred.pid,
					.uid = (uint32_t)o->cred.uid,
					.state = IPC_REQ_UPLOADING,
					.max_tokens = u->gr->g.max_tokens,
				};
	free(info);
	size_t off = 0;
	do {
		uint8_t buf[IPC_MAX_PAYLOAD_BYTES];
		size_t k = n_ent - off;
		if (k > IPC_MAX_PS_PER_FRAME)
			k = IPC_MAX_PS_PER_FRAME;
		struct ipc_ps_reply pr = { .n_total = (uint32_t)n_ent, .n_entries = (uint32_t)k };
		memcpy(buf, &pr, sizeof(pr));
		memcpy(buf + sizeof(pr), ent + off, k * sizeof(*ent));
		off += k;
		if (sock_send(c, IPC_MSG_PS_REPLY, off < n_ent ? IPC_F_MORE : 0, rid, buf, sizeof(pr) + k * sizeof(*ent)) < 0)
			break;
	} while (off < n_ent);
	free(ent);
	return;
oom:
	sock_error(c, rid, -ENOMEM, "out of memory");
}

/* ---- KVMAP: the page pool's metadata memfd, read-only ---------------------------- */

_Static_assert(IPC_KVMAP_PAGE_REF_MASK == KVMM_PAGE_REF_MASK && IPC_KVMAP_PAGE_INDEXED == KVMM_PAGE_INDEXED &&
		       IPC_KVMAP_PAGE_FREE == KVMM_PAGE_FREE && IPC_KVMAP_PAGE_PACKED == KVMM_PAGE_PACKED,
	       "the KV map's page state bits are kvmm's");

void kvd_kvmap_describe(const struct kvmm *kv, struct ipc_kvmap *ret)
{
	struct kvmm_meta_layout lo;

	kvmm_meta_layout(kv, &lo);
	*ret = (struct ipc_kvmap){
		.file_bytes = lo.file_bytes,
		.seq_offset = lo.seq_offset,
		.words_offset = lo.words_offset,
		.page_words_offset = lo.page_words_offset,
		.page_bytes = kvmm_page_bytes(kv),
		.n_pages = lo.n_pages,
		.block_size = kvmm_block_size(kv),
		.n_words = lo.n_words,
		.swap_slots = lo.swap_slots,
		.word_slots_used = lo.word_slots_used,
		.word_pages_demoted = lo.word_pages_demoted,
	};
}

void handle_kvmap(struct client *c, uint64_t rid)
{
	struct ipc_kvmap k;
	int fd = kvmm_stats_fd(c->srv->kv);

	/* kvmm reads the page words back: the fd goes out only when nobody
	 * who receives it can write, resize or punch holes in it. */
	if (!kvmm_stats_fd_sealed(c->srv->kv)) {
		sock_error(c, rid, -EOPNOTSUPP, "this kernel cannot seal the KV map against writes (Linux 5.1 or later)");
		return;
	}
	kvd_kvmap_describe(c->srv->kv, &k);
	sock_send_fds(c, IPC_MSG_KVMAP_REPLY, 0, rid, &k, sizeof(k), &fd, 1);
}

/* ---- HIST: latency histograms ------------------------------------------------------- */

_Static_assert(KVD_HIST_BOUNDS <= IPC_HIST_MAX_BOUNDS, "the histograms fit the wire");

static void hist_to_wire(const struct kvd_hist *h, struct ipc_hist *w)
{
	memset(w, 0, sizeof(*w));
	w->n_bounds = KVD_HIST_BOUNDS;
	w->count = h->count;
	w->sum_ns = h->sum_ns;
	memcpy(w->bound_ns, kvd_hist_bounds_ns, sizeof(kvd_hist_bounds_ns));
	memcpy(w->bucket, h->bucket, sizeof(h->bucket));
}

void handle_hist(struct client *c, uint64_t rid)
{
	struct kvd_sched_stats ss;
	struct ipc_hist_reply h;

	kvd_sched_get_stats(c->srv->sched, &ss);
	memset(&h, 0, sizeof(h));
	hist_to_wire(&c->srv->ttft, &h.ttft);
	hist_to_wire(&ss.itl, &h.itl);
	sock_send(c, IPC_MSG_HIST_REPLY, 0, rid, &h, sizeof(h));
}

/* ---- LEDGER: the last per-request records ------------------------------------------- */

_Static_assert(KVD_LEDGER_RECENT <= IPC_LEDGER_MAX_RECORDS, "every kept record can be asked for");
_Static_assert(KVD_LEDGER_LINE_MAX <= IPC_LEDGER_MAX_LINE_BYTES + 1, "every kept line fits a record");
_Static_assert(IPC_LEDGER_MAX_REPLY_BYTES <= SRV_SNDBUF_BYTES / 2, "a whole LEDGER reply fits the socket buffer");

void handle_ledger(struct client *c, const struct ipc_frame *f)
{
	struct kvd_ledger_rec *recs;
	uint64_t rid = f->hdr.request_id;
	struct ipc_ledger_req q;
	size_t n, i = 0;

	if (ipc_decode_ledger_req(f, &q) < 0) {
		sock_error(c, rid, -EINVAL, "malformed LEDGER");
		return;
	}
	recs = malloc(KVD_LEDGER_RECENT * sizeof(*recs));
	if (!recs) {
		sock_error(c, rid, -ENOMEM, "out of memory");
		return;
	}
	/* administrators see everyone's records; others only their own uid's */
	n = kvd_ledger_recent(c->srv->ledger, c->admin ? -1 : (int64_t)c->cred.uid, q.max_records, recs);
	/* the newest records whose reply fits the socket buffer at once: a
	 * reply the buffer cannot take would cost the client its connection */
	size_t bytes = 0, first = n;
	while (first > 0 && bytes + ipc_ledger_record_size(recs[first - 1].len) <= IPC_LEDGER_MAX_REPLY_BYTES)
		bytes += ipc_ledger_record_size(recs[--first].len);
	memmove(recs, recs + first, (n - first) * sizeof(*recs));
	n -= first;
	do {
		uint8_t buf[IPC_MAX_PAYLOAD_BYTES];
		size_t off = sizeof(struct ipc_ledger_reply), k = 0;

		while (i + k < n && off + ipc_ledger_record_size(recs[i + k].len) <= sizeof(buf)) {
			const struct kvd_ledger_rec *r = &recs[i + k];
			size_t size = ipc_ledger_record_size(r->len);

			memcpy(buf + off, &r->uid, 4);
			memcpy(buf + off + 4, &r->len, 4);
			memcpy(buf + off + 8, r->line, r->len);
			memset(buf + off + 8 + r->len, 0, size - 8 - r->len);
			off += size;
			k++;
		}
		struct ipc_ledger_reply lr = { .n_total = (uint32_t)n, .n_records = (uint32_t)k };
		memcpy(buf, &lr, sizeof(lr));
		i += k;
		if (sock_send(c, IPC_MSG_LEDGER_REPLY, i < n ? IPC_F_MORE : 0, rid, buf, off) < 0)
			break;
	} while (i < n);
	free(recs);
}

/* ---- CACHE: kvctl cache save / drop ------------------------------------------------- */

void handle_cache(struct client *c, const struct ipc_frame *f)
{
	struct kvd_server *srv = c->srv;
	uint64_t rid = f->hdr.request_id;
	struct kvd_cache_op_result res = {0};
	struct ipc_cache_req q;
	char why[256] = "";
	int r;

	if (ipc_decode_cache_req(f, &q) < 0) {
		sock_error(c, rid, -EINVAL, "malformed CACHE");
		return;
	}
	if (!c->admin) {
		sock_error(c, rid, IPC_ERR_DENIED, "kvctl cache %s is for root and members of server.admin_groups",
			   q.op == IPC_CACHE_SAVE ? "save" : "drop");
		return;
	}
	int (*fn)(void *, struct kvd_engine *, struct kvd_cache_op_result *, char *, size_t) =
		q.op == IPC_CACHE_SAVE ? srv->hooks.cache_save : srv->hooks.cache_drop;
	if (!fn) {
		sock_error(c, rid, -EOPNOTSUPP, "this kvd cannot %s its cache", q.op == IPC_CACHE_SAVE ? "save" : "drop");
		return;
	}
	r = fn(srv->hooks.cache_ud, srv->e, &res, why, sizeof(why));
	if (r < 0) {
		sock_error(c, rid, r, "cache %s: %s", q.op == IPC_CACHE_SAVE ? "save" : "drop",
			   why[0] ? why : strerror(-r));
		return;
	}
	struct ipc_cache_reply rep = {
		.op = q.op,
		.file_removed = res.file_removed,
		.pages = res.pages,
		.candidates = q.op == IPC_CACHE_SAVE ? res.candidates : 0,
		.bytes = res.bytes,
		.ns = res.ns,
		.timed_out = res.timed_out,
	};
	sock_send(c, IPC_MSG_CACHE_REPLY, 0, rid, &rep, sizeof(rep));
}
