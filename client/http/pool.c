/*
 * client/http/pool.c — kvd-http's few kvd connections, shared by many HTTP requests.
 *
 * kvd counts connections per user (server.max_clients_per_user) and
 * kvd-http is one user, so the gateway cannot give each HTTP request its
 * own connection. It holds at most kvd_connections "lanes" instead, each a
 * kvc_client carrying up to kvd's max_requests_per_client requests at once
 * (a request of n samples counts n, as kvd counts it). A request that finds
 * every lane full waits in a queue of at most max_queued; beyond that it is
 * refused (429), never sent to kvd to be refused there.
 *
 * libkvclient wants a client and its requests used by one thread at a
 * time, and a request's events can only be read by kvc_request_next() on
 * that request; reading a connection moves every request's events into
 * their own queues. So each lane has:
 *   io    a mutex held around every libkvclient call on the lane;
 *   mu    a mutex over the mailboxes (one per request: "my thread wants an
 *         event", "here it is") and `busy`;
 * and one thread at a time is the lane's pumper: it holds io, waits for
 * its own request's next event at most HTTP_PUMP_MS at a time, and after
 * every wait hands each waiting request the event that arrived for it
 * (kvc_request_next() on that request, which returns at once from its
 * queue), then wakes the waiters. A waiter never touches its request while
 * it is marked wanting, and the pumper touches a request only then, so an
 * event stays valid until its own thread asks for the next one, as the
 * library promises. When the pumper's own event has come it gives up the
 * role and one of the waiters takes it; other requests' events are thus
 * late by HTTP_PUMP_MS at most.
 *
 * Lock order: io before mu; s->lock (the lane table) is never held with
 * either. Lanes are reference counted under s->lock; a lane found broken
 * (its connection died, e.g. kvd's idle_timeout closed it) is taken out of
 * the table at once, with every other lane nobody uses (they have been
 * idle as long, so are as stale), and freed when its last user leaves.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvclient.h"
#include "server_impl.h"

struct lane {
	kvc_client *kc;
	uint64_t serial;        /* connection order: retries ask for a newer one */
	uint32_t max_weight;    /* kvd's max_requests_per_client */
	/* under s->lock */
	uint32_t weight;        /* requests in flight, samples counted */
	uint32_t users;         /* requests and control calls holding the lane */
	bool dead;              /* out of the table: freed by its last user */
	/* the pumping protocol (see the top of the file) */
	pthread_mutex_t io;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* under mu: the pumper handed out events or left */
	bool busy;              /* under mu: a thread is pumping */
	uint32_t starters;      /* under mu: threads waiting for io to start, cancel or ask something;
	                         * a pumper gives io up to them (else a pumper waiting long for its own
	                         * event would keep every new request off the lane) */
	struct lane_req *reqs;  /* under mu (and io, to change it): the requests started on it */
};

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A CLOCK_REALTIME deadline ms from now, for pthread_cond_timedwait. */
static struct timespec abs_in(int ms)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += ms / 1000;
	t.tv_nsec += (long)(ms % 1000) * 1000000;
	if (t.tv_nsec >= 1000000000) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000;
	}
	return t;
}

bool kvd_conn_error(int code)
{
	switch (code) {
	case -ECONNRESET:
	case -EPIPE:
	case -ENOTCONN:
	case -EPROTO:
	case -ETIMEDOUT: /* kvd's idle_timeout */
	case -EIO:
	case -EBADF:
	case KVC_ERR_SHUTDOWN:
	case KVC_ERR_VERSION:
	case KVC_ERR_DENIED:
		return true;
	default:
		return false;
	}
}

static struct lane *lane_free(struct lane *l)
{
	if (!l)
		return NULL;
	kvc_close(l->kc);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
	pthread_mutex_destroy(&l->io);
	free(l);
	return NULL;
}

/* Connect a new lane (s->lock not held). */
static int lane_connect(struct http_server *s, struct lane **ret)
{
	struct lane *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->io, NULL);
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	int r = kvc_connect(s->cfg.kvd_socket[0] ? s->cfg.kvd_socket : NULL, &l->kc);
	if (r < 0) {
		l->kc = NULL;
		lane_free(l);
		return r;
	}
	const struct kvc_info *info = kvc_server_info(l->kc);
	l->max_weight = info->max_requests ? info->max_requests : 1;
	*ret = l;
	return 0;
}

/* Take l out of the table (s->lock held); its last user frees it. */
static void retire_locked(struct http_server *s, struct lane *l)
{
	if (l->dead)
		return;
	l->dead = true;
	for (size_t i = 0; i < s->n_lanes; i++)
		if (s->lanes[i] == l) {
			s->lanes[i] = s->lanes[--s->n_lanes];
			break;
		}
}

uint64_t pool_serial(struct http_server *s)
{
	pthread_mutex_lock(&s->lock);
	uint64_t v = s->next_serial;
	pthread_mutex_unlock(&s->lock);
	return v;
}

/* The least loaded live lane of serial >= min_serial with room for weight
 * (any, for a control call: weight 0), or NULL (s->lock held). */
static struct lane *pick_locked(struct http_server *s, uint32_t weight, uint64_t min_serial)
{
	struct lane *best = NULL;
	for (size_t i = 0; i < s->n_lanes; i++) {
		struct lane *l = s->lanes[i];
		if (l->serial < min_serial || (weight && l->weight + weight > l->max_weight))
			continue;
		if (!best || l->weight < best->weight)
			best = l;
	}
	return best;
}

int pool_acquire(struct http_server *s, uint32_t *weight, uint64_t min_serial, int sock, struct lane **ret)
{
	bool queued = false;
	int r = 0;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		if (s->n_lanes && *weight > s->lanes[0]->max_weight)
			*weight = s->lanes[0]->max_weight; /* more samples than kvd takes: kvd says so */
		struct lane *l = pick_locked(s, *weight, min_serial);
		if (l) {
			l->weight += *weight;
			l->users++;
			*ret = l;
			break;
		}
		if (s->n_lanes + s->n_connecting < s->cfg.kvd_connections) {
			s->n_connecting++;
			pthread_mutex_unlock(&s->lock);
			r = lane_connect(s, &l);
			pthread_mutex_lock(&s->lock);
			s->n_connecting--;
			if (r < 0) {
				pthread_cond_broadcast(&s->slot_cv);
				break;
			}
			l->serial = s->next_serial++;
			const struct kvc_info *info = kvc_server_info(l->kc);
			if (!s->model[0])
				snprintf(s->model, sizeof(s->model), "%s",
					 info->model_id[0] ? info->model_id : info->model_name);
			snprintf(s->model_name, sizeof(s->model_name), "%s", info->model_name);
			snprintf(s->model_file, sizeof(s->model_file), "%s", info->model_id);
			s->n_ctx = info->n_ctx;
			s->lanes[s->n_lanes++] = l;
			/* more samples than kvd takes on one connection: kvd says so */
			if (*weight > l->max_weight)
				*weight = l->max_weight;
			continue;
		}
		if (min_serial) {
			/* no room for a newer connection: the ones left are in
			 * use, so alive */
			min_serial = 0;
			continue;
		}
		if (!queued) {
			if (*weight && s->n_queued >= s->cfg.max_queued) {
				r = -EBUSY;
				break;
			}
			s->n_queued++;
			queued = true;
		}
		struct timespec until = abs_in(HTTP_POLL_MS);
		pthread_cond_timedwait(&s->slot_cv, &s->lock, &until);
		if (sock >= 0 && client_gone(sock)) {
			r = -ECONNABORTED;
			break;
		}
	}
	if (queued)
		s->n_queued--;
	pthread_mutex_unlock(&s->lock);
	return r;
}

void pool_release(struct http_server *s, struct lane *l, uint32_t weight, bool broken)
{
	if (!l)
		return;
	pthread_mutex_lock(&s->lock);
	l->weight -= weight;
	l->users--;
	if (broken) {
		retire_locked(s, l);
		/* the others nobody uses have been idle as long: as stale */
		for (size_t i = s->n_lanes; i-- > 0;)
			if (!s->lanes[i]->users)
				retire_locked(s, s->lanes[i]);
	}
	bool last = l->dead && !l->users;
	pthread_cond_broadcast(&s->slot_cv);
	pthread_mutex_unlock(&s->lock);
	if (last)
		lane_free(l);
}

void pool_close(struct http_server *s)
{
	pthread_mutex_lock(&s->lock);
	while (s->n_lanes) {
		struct lane *l = s->lanes[--s->n_lanes];
		pthread_mutex_unlock(&s->lock);
		lane_free(l);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
}

/* Take io for a short call, ahead of pumpers: announced in starters, so
 * the pumper leaves at its next turn and no new one starts meanwhile. */
static void io_acquire(struct lane *l)
{
	pthread_mutex_lock(&l->mu);
	l->starters++;
	pthread_mutex_unlock(&l->mu);
	pthread_mutex_lock(&l->io);
	pthread_mutex_lock(&l->mu);
	l->starters--;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

kvc_client *lane_lock(struct lane *l, int timeout_ms)
{
	io_acquire(l);
	kvc_set_timeout(l->kc, timeout_ms);
	return l->kc;
}

void lane_unlock(struct lane *l)
{
	pthread_mutex_unlock(&l->io);
}

int lane_start(struct lane *l, const char *prompt, size_t len, const struct kvc_gen_params *p, struct lane_req *lr)
{
	memset(lr, 0, sizeof(*lr));
	kvc_client *kc = lane_lock(l, HTTP_START_TIMEOUT_MS);
	int r = kvc_request_start(kc, prompt, len, p, &lr->kr);
	if (r == 0) {
		pthread_mutex_lock(&l->mu);
		lr->next = l->reqs;
		if (l->reqs)
			l->reqs->prev = lr;
		l->reqs = lr;
		pthread_mutex_unlock(&l->mu);
	} else {
		snprintf(lr->msg, sizeof(lr->msg), "%s", kvc_last_message(kc));
	}
	lane_unlock(l);
	return r;
}

/* The next event of lr's request, without waiting (io held): fills the
 * mailbox; false when none has come. */
static bool take_event(struct lane_req *lr)
{
	const struct kvc_event *ev = NULL;
	int r = kvc_request_next(lr->kr, &ev);
	if (r == -ETIMEDOUT && !kvc_request_result(lr->kr))
		return false;
	lr->rc = r;
	lr->ev = r == 1 ? ev : NULL;
	lr->ended = r != 1;
	lr->has = true;
	lr->want = false;
	return true;
}

/* As pumper (io held, busy set): hand every waiting request what has come. */
static void hand_out(struct lane *l)
{
	bool handed = false;
	kvc_set_timeout(l->kc, 0);
	pthread_mutex_lock(&l->mu);
	for (struct lane_req *q = l->reqs; q; q = q->next)
		if (q->want && !q->has)
			handed |= take_event(q);
	if (handed) /* else the waiters have nothing to look at */
		pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

int lane_next(struct lane *l, struct lane_req *lr, int wait_ms, const struct kvc_event **ret_ev)
{
	int64_t deadline = now_ms() + wait_ms;
	int r = -EAGAIN;

	pthread_mutex_lock(&l->mu);
	if (lr->ended) {
		r = lr->rc;
		goto out;
	}
	lr->want = true;
	for (;;) {
		if (lr->has) {
			lr->has = false;
			r = lr->rc;
			*ret_ev = lr->ev;
			break;
		}
		int64_t left = deadline - now_ms();
		if (left <= 0) {
			lr->want = false;
			break;
		}
		if (l->busy || l->starters) {
			struct timespec until = abs_in((int)left);
			pthread_cond_timedwait(&l->cv, &l->mu, &until);
			continue;
		}
		/* become the pumper */
		l->busy = true;
		pthread_mutex_unlock(&l->mu);
		pthread_mutex_lock(&l->io);
		for (;;) {
			hand_out(l);
			pthread_mutex_lock(&l->mu);
			bool mine = lr->has;
			pthread_mutex_unlock(&l->mu);
			left = deadline - now_ms();
			if (mine || left <= 0)
				break;
			/* wait for our own event; others' are queued meanwhile */
			kvc_set_timeout(l->kc, left < HTTP_PUMP_MS ? (int)left : HTTP_PUMP_MS);
			pthread_mutex_lock(&l->mu);
			bool wanted = lr->want && !lr->has && !l->starters;
			pthread_mutex_unlock(&l->mu);
			if (!wanted)
				break;
			const struct kvc_event *ev = NULL;
			int x = kvc_request_next(lr->kr, &ev);
			if (x != -ETIMEDOUT || kvc_request_result(lr->kr)) {
				pthread_mutex_lock(&l->mu);
				lr->rc = x;
				lr->ev = x == 1 ? ev : NULL;
				lr->ended = x != 1;
				lr->has = true;
				lr->want = false;
				pthread_mutex_unlock(&l->mu);
			}
		}
		hand_out(l);
		pthread_mutex_lock(&l->mu);
		l->busy = false;
		pthread_cond_broadcast(&l->cv);
		pthread_mutex_unlock(&l->io);
	}
out:
	pthread_mutex_unlock(&l->mu);
	return r;
}

const struct kvc_result *lane_result(struct lane_req *lr)
{
	return lr->ended ? kvc_request_result(lr->kr) : NULL;
}

bool lane_end(struct lane *l, struct lane_req *lr, int wait_ms)
{
	bool broken = false;
	if (!lr->kr)
		return false;
	if (!lr->ended) {
		/* cancel, and wait for kvd to confirm, so that its count of
		 * this lane's requests has dropped before the slot is reused */
		kvc_client *kc = lane_lock(l, 0);
		int x = kvc_cancel(kc, kvc_request_id(lr->kr));
		lane_unlock(l);
		if (x < 0)
			broken = true;
		int64_t deadline = now_ms() + wait_ms;
		while (!broken && !lr->ended && now_ms() < deadline) {
			const struct kvc_event *ev;
			lane_next(l, lr, (int)(deadline - now_ms()), &ev);
		}
		if (!lr->ended)
			broken = true; /* not confirmed: do not trust the lane's count */
	}
	if (lr->ended && kvd_conn_error(lr->rc))
		broken = true;
	io_acquire(l);
	pthread_mutex_lock(&l->mu);
	if (lr->prev)
		lr->prev->next = lr->next;
	else if (l->reqs == lr)
		l->reqs = lr->next;
	if (lr->next)
		lr->next->prev = lr->prev;
	lr->next = lr->prev = NULL;
	pthread_mutex_unlock(&l->mu);
	lr->kr = kvc_request_finish(lr->kr);
	pthread_mutex_unlock(&l->io);
	return broken;
}
