/*
 * daemon/server.c — the event loop: lifecycle, signals, systemd, shutdown.
 *
 * Everything runs on one thread but the tokenizer worker (tokwork.h),
 * which turns texts that came through the upload ring into tokens and
 * says so through an eventfd in the loop's epoll set. The loop alternates: look at the sockets
 * (epoll_wait with timeout 0 while the scheduler has work, blocking when it
 * has none), then one scheduler step, then push what the step produced into
 * the clients' rings. A client therefore never waits more than one step for
 * its control messages to be answered. SIGHUP re-reads the configuration
 * (apply_reload), SIGTERM/SIGINT drain. The objects the loop serves are
 * described in server_impl.h; connections live in conn.c, requests in
 * handlers.c and stream.c, sessions in session.c, STATS/PS in admin.c.
 */
#include "server_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "engine.h"
#include "kvmm.h"
#include "log.h"
#include "model.h"
#include "tokwork.h"
#include "grammar.h"

/* ---- configuration, signals, systemd ---------------------------------------- */

static uint32_t online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (uint32_t)n : 1;
}

static struct kvd_sched_config sched_config(const struct kvd_config *cfg, uint32_t n_ctx)
{
	enum kvd_spec_mode mode;
	return (struct kvd_sched_config){
		.max_num_seqs = cfg->max_num_seqs,
		.max_tokens_per_step = cfg->max_tokens_per_step,
		.max_model_len = n_ctx,
		.max_waiting = cfg->max_waiting,
		.session_idle_s = cfg->session_idle_s,
		.max_step_ms = cfg->max_step_ms,
		.draw_threads = cfg->threads > 0 ? (uint32_t)cfg->threads : online_cpus(),
		.spec = {
			.mode = kvd_spec_mode_parse(cfg->spec_mode, &mode) == 0 ? mode : KVD_SPEC_OFF,
			.draft_tokens = cfg->spec_draft_tokens,
			.min_match = cfg->spec_min_match,
		},
	};
}

static void apply_reload(struct kvd_server *srv, const struct kvd_config *n)
{
	struct kvd_config *o = &srv->cfg;
	struct kvd_config keep = *o;

	*o = *n;
	/* restart-only keys (kvd_conf_keys[].reload) keep their running values */
	for (size_t i = 0; i < kvd_conf_n_keys; i++) {
		const struct kvd_conf_key *k = &kvd_conf_keys[i];
		char *now = (char *)o, *was = (char *)&keep;
		if (k->reload != KVD_CONF_RESTART)
			continue;
		if (memcmp(now + k->off, was + k->off, k->size) ||
		    (k->size2 && memcmp(now + k->off2, was + k->off2, k->size2)))
			log_warning("reload: %s.%s changed; it takes effect only after a restart", k->section, k->name);
		memcpy(now + k->off, was + k->off, k->size);
		if (k->size2)
			memcpy(now + k->off2, was + k->off2, k->size2);
	}
	kvd_log_level = o->log_level;
	struct kvd_sched_config sc = sched_config(o, srv->n_ctx);
	kvd_sched_set_config(srv->sched, &sc);
	kvd_ledger_reopen(srv->ledger, o->ledger_log); /* always: logrotate renames, then sends SIGHUP */
	/* The allow-list holds for connections already open, too. */
	for (struct client *c = srv->clients, *next; c; c = next) {
		next = c->next;
		if (c->closing || c->lingering)
			continue;
		c->admin = peer_is_admin(srv, c->fd, &c->cred);
		if (peer_allowed(srv, c->fd, &c->cred))
			continue;
		log_notice("reload: closing client %" PRIu64 " (pid %d uid %u): no longer in server.allowed_users/groups",
			   c->id, (int)c->cred.pid, (unsigned)c->cred.uid);
		sock_error(c, 0, IPC_ERR_DENIED, "uid %u may no longer use kvd (server.allowed_users / allowed_groups)",
			   (unsigned)c->cred.uid);
		client_linger(c, "denied after reload");
	}
	log_notice("configuration reloaded: log level %d, max_num_seqs %u, max_tokens_per_step %u, "
		   "max_requests_per_client %u, max_prompt_bytes %" PRIu64 ", %zu allowed users, %zu allowed groups",
		   o->log_level, o->max_num_seqs, o->max_tokens_per_step, o->max_requests_per_client, o->max_prompt_bytes,
		   o->n_allowed_uids, o->n_allowed_gids);
}

static void begin_stop(struct kvd_server *srv, const char *why)
{
	uint64_t t = now_ns();
	if (srv->stopping) {
		log_notice("%s again: ending running requests now", why);
		srv->drain_deadline = t;
		return;
	}
	srv->stopping = true;
	srv->drain_deadline = t + (uint64_t)srv->cfg.drain_timeout_s * 1000000000ull;
	if (srv->listen_fd >= 0) {
		epoll_ctl(srv->ep, EPOLL_CTL_DEL, srv->listen_fd, NULL);
		close(srv->listen_fd);
		srv->listen_fd = -1;
	}
	sd_notify(0, "STOPPING=1\nSTATUS=draining: finishing running requests");
	log_notice("%s: draining (new requests refused; running ones get up to %us)", why, srv->cfg.drain_timeout_s);
}

static void handle_signal(struct kvd_server *srv)
{
	struct signalfd_siginfo si;
	while (read(srv->sig_fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		switch (si.ssi_signo) {
		case SIGTERM:
		case SIGINT:
			begin_stop(srv, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
			break;
		case SIGHUP: {
			struct kvd_config n;
			sd_notify(0, "RELOADING=1");
			if (!srv->hooks.reload || srv->hooks.reload(srv->hooks.ud, &n) < 0)
				log_error("reload failed; the running configuration stays");
			else
				apply_reload(srv, &n);
			sd_notify(0, "READY=1");
			break;
		}
		default:
			break;
		}
	}
}

static uint32_t live_requests(const struct kvd_server *srv)
{
	uint32_t n = 0;
	for (const struct client *c = srv->clients; c; c = c->next)
		n += c->n_inflight;
	return n;
}

/* Shutdown: past the drain deadline, end what still runs with an ERROR
 * IPC_ERR_SHUTDOWN record (uploads get it on the socket). */
static void cancel_all(struct kvd_server *srv)
{
	uint32_t n = 0;
	for (struct client *c = srv->clients; c; c = c->next) {
		for (struct greq *gr = c->reqs, *next; gr; gr = next) {
			next = gr->next;
			if (gr->state == GR_UPLOADING || gr->state == GR_TOKENIZING) {
				sock_error(c, gr->id, IPC_ERR_SHUTDOWN, "kvd is shutting down; request not started");
				if (c->closing)
					break;
				greq_unlink(c, gr);
				greq_free(gr);
				n++;
			} else if (!gr->finished) {
				gr->shutdown = true;
				kvd_sched_cancel(srv->sched, (uint64_t)(uintptr_t)gr);
				n++;
			}
		}
		while (c->up_head) { /* nobody will read these any more */
			struct upload *u = c->up_head;
			c->up_head = u->next;
			srv->n_uploading--;
			c->n_uploads--;
			upload_free(u);
		}
		c->up_tail = NULL;
		client_mark_dirty(c);
	}
	if (n)
		log_notice("drain timeout: ended %u request(s) with a shutdown error", n);
}

static void update_status(struct kvd_server *srv)
{
	struct kvmm_stats ks;
	struct kvd_sched_stats ss;
	char buf[256];

	kvmm_get_stats(srv->kv, &ks);
	kvd_sched_get_stats(srv->sched, &ss);
	snprintf(buf, sizeof(buf), "STATUS=%s: %u running, %u waiting, %u swapped, %u/%u pages, %u clients",
		 srv->stopping ? "draining" : "serving", ss.running, ss.waiting + srv->n_uploading, ss.swapped,
		 ks.pages_used, ks.pages_total, srv->n_clients);
	if (strcmp(buf, srv->last_status)) {
		sd_notify(0, buf);
		memcpy(srv->last_status, buf, sizeof(buf));
	}
}

int kvd_server_create(const struct kvd_config *cfg, struct kvd_engine *e, int listen_fd, int sig_fd,
		      const struct kvd_server_hooks *hooks, struct kvd_server **ret)
{
	struct kvd_server *srv = calloc(1, sizeof(*srv));
	int r;

	if (!srv) {
		close(listen_fd);
		close(sig_fd);
		return -ENOMEM;
	}
	srv->cfg = *cfg;
	srv->e = e;
	srv->kv = kvd_engine_kvmm(e);
	srv->tok = kvd_model_tokenizer(kvd_engine_model(e));
	srv->listen_fd = listen_fd;
	srv->sig_fd = sig_fd;
	srv->ep = -1;
	if (hooks)
		srv->hooks = *hooks;
	srv->t_start = now_ns();
	srv->fault_peercred = srv->hooks.fault_peercred;
	srv->server_version = srv->hooks.fault_server_version ? srv->hooks.fault_server_version : KVD_VERSION_NUM;
	uint32_t n_train = (uint32_t)kvd_model_hparams(kvd_engine_model(e))->n_ctx_train;
	if (!n_train)
		n_train = 2048;
	srv->n_ctx = cfg->max_model_len && cfg->max_model_len < n_train ? cfg->max_model_len : n_train;
	srv->rxbuf = aligned_alloc(64, IPC_MAX_FRAME_BYTES);
	if (!srv->rxbuf) {
		r = -ENOMEM;
		goto fail;
	}
	struct kvd_sched_config sc = sched_config(cfg, srv->n_ctx);
	struct kvd_sched_events ev = {
		.on_token = on_token,
		.on_done = on_done,
		.is_eog = sched_is_eog,
		.on_session_expired = on_session_expired,
		.ud = srv,
		.on_sample_token = on_sample_token,
	};
	r = kvd_sched_create(&sc, e, &ev, &srv->sched);
	if (r < 0)
		goto fail;
	srv->ep = epoll_create1(EPOLL_CLOEXEC);
	if (srv->ep < 0) {
		r = -errno;
		goto fail;
	}
	srv->listen_src = (struct ep_src){ SRC_LISTEN, srv };
	srv->sig_src = (struct ep_src){ SRC_SIGNAL, srv };
	if ((r = ep_add(srv, listen_fd, &srv->listen_src)) < 0 || (r = ep_add(srv, sig_fd, &srv->sig_src)) < 0)
		goto fail;
	r = kvd_ledger_new(cfg->ledger_log, &srv->ledger);
	if (r < 0)
		goto fail;
	kvd_ledger_set_model(srv->ledger, e);
	r = kvd_tokwork_new(srv->tok, &srv->tokw);
	if (r < 0)
		goto fail;
	srv->gram_cache = kvd_gram_cache_new(SRV_GRAM_CACHE_ENTRIES, SRV_GRAM_CACHE_BYTES);
	if (!srv->gram_cache) {
		r = -ENOMEM;
		goto fail;
	}
	r = kvd_gram_vocab_from_tokenizer(srv->tok, &srv->gram_vocab);
	if (r < 0) /* serve without constraints rather than not at all */
		log_warning("constraints are not available: the vocabulary cannot be read (%s)", strerror(-r));
	srv->tokw_src = (struct ep_src){ SRC_TOKW, srv };
	if ((r = ep_add(srv, kvd_tokwork_fd(srv->tokw), &srv->tokw_src)) < 0)
		goto fail;
	*ret = srv;
	return 0;
fail:
	kvd_server_free(srv);
	return r;
}

struct kvd_server *kvd_server_free(struct kvd_server *srv)
{
	if (!srv)
		return NULL;
	while (srv->clients)
		client_close(srv->clients, "server exit");
	free_closed(srv);
	srv->tokw = kvd_tokwork_free(srv->tokw); /* its jobs name requests by id: none is left to touch */
	while (srv->sessions) {
		struct session *s = srv->sessions;
		srv->sessions = s->next;
		session_free(srv, s);
	}
	srv->sched = kvd_sched_destroy(srv->sched);
	srv->gram_cache = kvd_gram_cache_free(srv->gram_cache);
	srv->gram_vocab = kvd_gram_vocab_free(srv->gram_vocab);
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	if (srv->sig_fd >= 0)
		close(srv->sig_fd);
	if (srv->ep >= 0)
		close(srv->ep);
	srv->ledger = kvd_ledger_free(srv->ledger);
	free(srv->rxbuf);
	free(srv->ucount);
	free(srv);
	return NULL;
}

/* Client sockets least recently read first (everything else keeps its
 * place ahead of them): level-triggered epoll reports ready fds in the
 * same order every turn, so without this the first connections of a turn
 * could use up a user's share every time and starve the others. */
static uint64_t event_key(const struct epoll_event *ev)
{
	const struct ep_src *src = ev->data.ptr;
	return src->kind == SRC_SOCK ? 1 + ((const struct client *)src->p)->turn : 0;
}

static void sort_events(struct epoll_event *evs, int n)
{
	for (int i = 1; i < n; i++) { /* insertion sort: n <= SRV_MAX_EVENTS, mostly sorted */
		struct epoll_event e = evs[i];
		uint64_t k = event_key(&e);
		int j = i;
		while (j > 0 && event_key(&evs[j - 1]) > k) {
			evs[j] = evs[j - 1];
			j--;
		}
		evs[j] = e;
	}
}

static int ms_until(uint64_t t, uint64_t deadline)
{
	if (deadline <= t)
		return 0;
	uint64_t ms = (deadline - t + 999999) / 1000000;
	return ms > 60000 ? 60000 : (int)ms;
}

int kvd_server_run(struct kvd_server *srv)
{
	struct epoll_event evs[SRV_MAX_EVENTS];
	uint64_t usec = 0;
	bool progress = true;

	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
		srv->watchdog_ns = usec * 1000ull / 2;
	sd_notify(0, "READY=1");
	update_status(srv);
	srv->next_status = now_ns() + SRV_STATUS_NS;
	srv->next_watchdog = now_ns();
	srv->next_expire = now_ns() + SRV_EXPIRE_NS;
	for (;;) {
		uint64_t t = now_ns();
		srv->turn++;
		if (srv->watchdog_ns && t >= srv->next_watchdog) {
			sd_notify(0, "WATCHDOG=1");
			srv->next_watchdog = t + srv->watchdog_ns;
		}
		if (t >= srv->next_status) {
			update_status(srv);
			srv->next_status = t + SRV_STATUS_NS;
		}
		if (t >= srv->next_expire) {
			expire_sessions(srv, t);
			srv->next_expire = t + SRV_EXPIRE_NS;
		}
		if (srv->accept_paused_until && t >= srv->accept_paused_until) {
			srv->accept_paused_until = 0;
			if (srv->listen_fd >= 0 && ep_add(srv, srv->listen_fd, &srv->listen_src) < 0)
				log_error("cannot listen again: %m");
		}
		if (srv->stopping) {
			if (!live_requests(srv))
				break;
			if (!srv->cancelled_all && t >= srv->drain_deadline) {
				cancel_all(srv);
				srv->cancelled_all = true;
				srv->final_deadline = t + SRV_FINAL_FLUSH_NS;
				flush_dirty(srv);
				continue;
			}
			if (srv->cancelled_all && t >= srv->final_deadline) {
				log_warning("shutdown: %u request(s) could not deliver their last records", live_requests(srv));
				break;
			}
		}

		int timeout;
		bool busy = !kvd_sched_idle(srv->sched);
		bool more = srv->hooks.background && !srv->stopping && srv->hooks.background(srv->hooks.background_ud) > 0;
		if (srv->dirty || (busy && progress) || more) {
			timeout = 0;
		} else {
			uint64_t next = srv->next_status < srv->next_expire ? srv->next_status : srv->next_expire;
			if (srv->watchdog_ns && srv->next_watchdog < next)
				next = srv->next_watchdog;
			if (srv->accept_paused_until && srv->accept_paused_until < next)
				next = srv->accept_paused_until;
			if (srv->stopping) {
				uint64_t d = srv->cancelled_all ? srv->final_deadline : srv->drain_deadline;
				if (d < next)
					next = d;
			}
			timeout = ms_until(t, next);
			if (busy && timeout > 5)
				timeout = 5; /* work that made no progress: retry soon */
		}
		int n = epoll_wait(srv->ep, evs, SRV_MAX_EVENTS, timeout);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("epoll_wait: %m");
			return -errno;
		}
		sort_events(evs, n);
		for (int i = 0; i < n; i++) {
			struct ep_src *src = evs[i].data.ptr;
			switch (src->kind) {
			case SRC_LISTEN:
				if (!srv->stopping)
					handle_accept(srv);
				break;
			case SRC_SIGNAL:
				handle_signal(srv);
				break;
			case SRC_TOKW:
				tokw_collect(srv);
				break;
			case SRC_SOCK: {
				struct client *c = src->p;
				if (!c->closing)
					handle_sock(c, evs[i].events);
				break;
			}
			case SRC_CHAN: {
				struct client *c = src->p;
				if (!c->closing) {
					ipc_chan_ack(c->chan);
					client_service(c);
				}
				break;
			}
			}
		}
		free_closed(srv);
		if (!kvd_sched_idle(srv->sched)) {
			uint64_t t_step = now_ns();
			int r = kvd_sched_step(srv->sched);
			srv->ctl_earned_ns += (now_ns() - t_step) * SRV_CTL_SHARE_PERMILLE / 1000;
			progress = r != 0;
			if (r < 0)
				log_error("scheduler step failed: %s", strerror(-r));
		}
		if (srv->n_paused)
			resume_paused(srv);
		flush_dirty(srv);
		free_closed(srv);
	}
	sd_notify(0, "STOPPING=1\nSTATUS=stopped");
	log_notice("stopped");
	return 0;
}
