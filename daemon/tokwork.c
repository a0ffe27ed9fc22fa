/*
 * daemon/tokwork.c — the tokenizer worker (see tokwork.h): one thread, a
 * queue per owner served round robin, and an eventfd that tells the event
 * loop jobs are done.
 *
 * The worker runs at a lower CPU priority than the loop (nice
 * TOKW_NICE): on a machine whose cores the engine keeps busy, a megabyte
 * of text waits rather than slowing every stream's step. What it costs is
 * measured per job (CLOCK_THREAD_CPUTIME_ID) and charged by the loop to
 * the job's owner when it completes.
 */
#include "tokwork.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "grammar.h"
#include "request.h"

#define TOKW_NICE 10

/* One owner with jobs out: its queue, and its place in the round. */
struct tokw_owner {
	struct tokw_owner *next;      /* every owner with jobs out */
	struct tokw_owner *rnext;     /* the round: owners with queued jobs */
	uint64_t owner;
	struct tokw_job *head, *tail; /* queued, oldest first */
	uint32_t n_jobs;              /* queued, running or done, not taken back */
	bool in_round;
};

struct kvd_tokwork {
	const struct kvd_tokenizer *tok;
	pthread_t th;
	bool started;
	int efd;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;                            /* under mu */
	struct tokw_owner *owners;            /* under mu */
	struct tokw_owner *round, *round_tail; /* under mu */
	struct tokw_job *done, *done_tail;    /* under mu */
};

struct tokw_job *tokw_job_free(struct tokw_job *j)
{
	if (!j)
		return NULL;
	free(j->text);
	free(j->system);
	free(j->ids);
	free(j->cons_text);
	kvd_grammar_unref(j->grammar);
	free(j);
	return NULL;
}

/* The job's constraint, through the shared compile cache. */
static void compile_constraint(struct tokw_job *j)
{
	struct kvd_grammar_error err = { 0 };

	j->grammar = NULL;
	j->gram_rc = 0;
	j->gram_why[0] = 0;
	if (!j->cons_kind)
		return;
	if (!j->gram_cache) {
		j->gram_rc = -ENOTSUP;
		snprintf(j->gram_why, sizeof(j->gram_why), "constraints are not available");
		return;
	}
	j->gram_rc = kvd_gram_cache_get(j->gram_cache, (enum kvd_grammar_kind)j->cons_kind,
					j->cons_text ? j->cons_text : "", j->cons_len, &j->grammar, &j->gram_hit, &err);
	if (j->gram_rc < 0) {
		j->grammar = NULL;
		snprintf(j->gram_why, sizeof(j->gram_why), "%s", err.msg[0] ? err.msg : strerror(-j->gram_rc));
	}
}

void kvd_tokwork_run(const struct kvd_tokenizer *tok, struct tokw_job *j)
{
	j->ids = NULL;
	j->why[0] = 0;
	j->stopped = false;
	switch (j->kind) {
	case TOKW_CHAT_TURNS:
		j->n = kvd_request_chat_turns(tok, j->text, j->len, j->stop_after, &j->ids, j->why, sizeof(j->why));
		break;
	case TOKW_CHAT_TURN:
		j->n = kvd_request_chat_turn(tok, j->system, j->text, j->continuation, j->last_token, j->stop_after, &j->ids,
					     j->why,
					     sizeof(j->why));
		break;
	case TOKW_RAW:
	default:
		j->n = kvd_request_tokenize(tok, j->text, j->len, j->add_bos, j->parse_special, j->stop_after, &j->ids);
		break;
	}
	if (j->n < 0)
		j->ids = NULL;
	j->stopped = j->n >= 0 && (size_t)j->n > j->stop_after;
	if (j->n >= 0 && !j->stopped)
		compile_constraint(j);
}

static struct tokw_owner *owner_find(struct kvd_tokwork *w, uint64_t owner)
{
	struct tokw_owner *o;
	for (o = w->owners; o; o = o->next)
		if (o->owner == owner)
			break;
	return o;
}

static void round_append(struct kvd_tokwork *w, struct tokw_owner *o)
{
	o->rnext = NULL;
	o->in_round = true;
	if (w->round_tail)
		w->round_tail->rnext = o;
	else
		w->round = o;
	w->round_tail = o;
}

/* The next job in the round (mu held): the oldest of the owner whose turn
 * it is, who then goes to the back of the round if it has more. */
static struct tokw_job *next_job_locked(struct kvd_tokwork *w)
{
	struct tokw_owner *o = w->round;
	if (!o)
		return NULL;
	w->round = o->rnext;
	if (!w->round)
		w->round_tail = NULL;
	o->in_round = false;
	struct tokw_job *j = o->head;
	o->head = j->next;
	if (!o->head)
		o->tail = NULL;
	j->next = NULL;
	if (o->head)
		round_append(w, o);
	return j;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *worker(void *arg)
{
	struct kvd_tokwork *w = arg;

	/* below the loop and the engine: best effort, nothing depends on it */
	(void)!setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), TOKW_NICE);
	pthread_mutex_lock(&w->mu);
	for (;;) {
		struct tokw_job *j = NULL;
		while (!w->stop && !(j = next_job_locked(w)))
			pthread_cond_wait(&w->cv, &w->mu);
		if (w->stop)
			break;
		pthread_mutex_unlock(&w->mu);
		uint64_t c0 = thread_cpu_ns();
		kvd_tokwork_run(w->tok, j);
		j->cpu_ns = thread_cpu_ns() - c0;
		pthread_mutex_lock(&w->mu);
		if (w->done_tail)
			w->done_tail->next = j;
		else
			w->done = j;
		w->done_tail = j;
		uint64_t one = 1;
		/* a full counter (never: it is read every loop turn) only
		 * means the fd is readable already */
		(void)!write(w->efd, &one, sizeof(one));
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

int kvd_tokwork_new(const struct kvd_tokenizer *tok, struct kvd_tokwork **ret)
{
	struct kvd_tokwork *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return -ENOMEM;
	w->tok = tok;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->efd < 0) {
		r = -errno;
		goto fail;
	}
	r = -pthread_create(&w->th, NULL, worker, w);
	if (r < 0)
		goto fail;
	w->started = true;
	*ret = w;
	return 0;
fail:
	kvd_tokwork_free(w);
	return r;
}

struct kvd_tokwork *kvd_tokwork_free(struct kvd_tokwork *w)
{
	if (!w)
		return NULL;
	if (w->started) {
		pthread_mutex_lock(&w->mu);
		w->stop = true;
		pthread_cond_signal(&w->cv);
		pthread_mutex_unlock(&w->mu);
		pthread_join(w->th, NULL);
	}
	while (w->owners) {
		struct tokw_owner *o = w->owners;
		w->owners = o->next;
		while (o->head) {
			struct tokw_job *j = o->head;
			o->head = j->next;
			tokw_job_free(j);
		}
		free(o);
	}
	while (w->done) {
		struct tokw_job *j = w->done;
		w->done = j->next;
		tokw_job_free(j);
	}
	if (w->efd >= 0)
		close(w->efd);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
	return NULL;
}

int kvd_tokwork_fd(const struct kvd_tokwork *w)
{
	return w->efd;
}

int kvd_tokwork_submit(struct kvd_tokwork *w, struct tokw_job *j)
{
	int r = 0;

	pthread_mutex_lock(&w->mu);
	struct tokw_owner *o = owner_find(w, j->owner);
	if (!o) {
		o = calloc(1, sizeof(*o));
		if (!o) {
			r = -ENOMEM;
			goto out;
		}
		o->owner = j->owner;
		o->next = w->owners;
		w->owners = o;
	}
	j->next = NULL;
	if (o->tail)
		o->tail->next = j;
	else
		o->head = j;
	o->tail = j;
	o->n_jobs++;
	if (!o->in_round)
		round_append(w, o);
	pthread_cond_signal(&w->cv);
out:
	pthread_mutex_unlock(&w->mu);
	return r;
}

struct tokw_job *kvd_tokwork_take_done(struct kvd_tokwork *w)
{
	uint64_t v;
	(void)!read(w->efd, &v, sizeof(v)); /* EAGAIN: nothing was signalled */
	pthread_mutex_lock(&w->mu);
	struct tokw_job *list = w->done;
	w->done = w->done_tail = NULL;
	for (struct tokw_job *j = list; j; j = j->next) {
		struct tokw_owner **pp = &w->owners;
		while (*pp && (*pp)->owner != j->owner)
			pp = &(*pp)->next;
		if (*pp && --(*pp)->n_jobs == 0 && !(*pp)->in_round) {
			struct tokw_owner *o = *pp;
			*pp = o->next;
			free(o);
		}
	}
	pthread_mutex_unlock(&w->mu);
	return list;
}

uint32_t kvd_tokwork_owner_jobs(struct kvd_tokwork *w, uint64_t owner)
{
	pthread_mutex_lock(&w->mu);
	struct tokw_owner *o = owner_find(w, owner);
	uint32_t n = o ? o->n_jobs : 0;
	pthread_mutex_unlock(&w->mu);
	return n;
}
