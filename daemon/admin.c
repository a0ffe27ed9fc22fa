/*
 * daemon/admin.c — STATS and PS. Counters are for everyone; PS shows a
 * request's owner and details only to its own user or an admin
 * (root or server.admin_groups).
 */
#include "server_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvmm.h"

void fill_stats(struct kvd_server *srv, struct ipc_stats *st)
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
	st->prefix_lookups = ks.prefix_lookups;
	st->prefix_query_tokens = ks.prefix_query_tokens;
	st->prefix_hit_tokens = ks.prefix_hit_tokens;
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
