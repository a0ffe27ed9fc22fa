/*
 * daemon/ledger.c — the per-request ledger file: whole-line appends, cut
 * back on a short write, reopened on SIGHUP, never through a symbolic link;
 * and the last records kept in memory for `kvctl ledger`.
 * See ledger.h for the contract.
 */
#include "ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "kvmm.h"
#include "log.h"
#include "model.h"
#include "sched.h"

struct recent {
	uint64_t seq;  /* order of arrival, from 1; 0: the slot is empty */
	uint32_t uid;
	uint32_t len;
	char *line; /* without the newline */
};

/* The recent records are not one ring: a full store makes room by dropping
 * the oldest record of the uid that holds the most (kvd_ledger_recent), so
 * one user's flood pushes out only its own history. */
struct uid_count {
	uint32_t uid, n;
	size_t oldest;    /* index of its oldest record */
};

struct kvd_ledger {
	struct recent recent[KVD_LEDGER_RECENT];
	size_t n_recent;
	struct uid_count scratch[KVD_LEDGER_RECENT]; /* victim()'s tally */
	uint64_t next_seq;
	int fd;
	char *path;          /* of fd; NULL when none is open */
	bool failing;        /* the last record was dropped (log once per run) */
	bool need_newline;   /* a partial line could not be cut back */
	uint64_t dropped, written;
	uint64_t dropped_at_failure; /* `dropped` when the run of failures began */
	char model[KVD_LEDGER_MODEL_MAX]; /* the records' "model" member; "" until described */
	uint32_t block_size;              /* tokens per page (0: not described) */
};

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Open path for appending: never through a symbolic link (O_NOFOLLOW),
 * never a FIFO or device (O_NONBLOCK so a FIFO cannot block the open, then
 * the type is checked and blocking writes restored). Logs why not. */
static int open_file(const char *path)
{
	struct stat st;
	int fd, fl, r;

	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK, 0640);
	if (fd < 0) {
		r = -errno;
		if (r == -ELOOP)
			log_warning("ledger file %s: is a symbolic link, which kvd does not follow "
				    "(per-request ledger disabled)", path);
		else
			log_warning("ledger file %s: %s (per-request ledger disabled)", path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		log_warning("ledger file %s: fstat: %s (per-request ledger disabled)", path, strerror(-r));
		close(fd);
		return r;
	}
	if (!S_ISREG(st.st_mode)) {
		log_warning("ledger file %s: not a regular file (per-request ledger disabled)", path);
		close(fd);
		return -EINVAL;
	}
	/* Every record names a user and a prompt's figures: a file another
	 * user owns, or one others may write, could be read by its owner or
	 * have forged lines put in between kvd's. */
	if (st.st_uid != geteuid()) {
		log_warning("ledger file %s: owned by uid %u, not by kvd's user (uid %u) (per-request ledger disabled)",
			    path, (unsigned)st.st_uid, (unsigned)geteuid());
		close(fd);
		return -EPERM;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		log_warning("ledger file %s: writable by %s (mode %04o); kvd wants it writable by its own user only "
			    "(per-request ledger disabled)", path, st.st_mode & S_IWOTH ? "everyone" : "its group",
			    (unsigned)(st.st_mode & 07777));
		close(fd);
		return -EPERM;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		r = -errno;
		log_warning("ledger file %s: fcntl: %s (per-request ledger disabled)", path, strerror(-r));
		close(fd);
		return r;
	}
	return fd;
}

int kvd_ledger_new(const char *path, struct kvd_ledger **ret)
{
	struct kvd_ledger *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->fd = -1;
	(void)kvd_ledger_reopen(l, path);
	*ret = l;
	return 0;
}

struct kvd_ledger *kvd_ledger_free(struct kvd_ledger *l)
{
	if (!l)
		return NULL;
	if (l->fd >= 0)
		close(l->fd);
	for (size_t i = 0; i < KVD_LEDGER_RECENT; i++)
		free(l->recent[i].line);
	free(l->path);
	free(l);
	return NULL;
}

int kvd_ledger_reopen(struct kvd_ledger *l, const char *path)
{
	char *copy;
	int fd;

	if (!path || !path[0]) {
		if (l->fd >= 0)
			close(l->fd);
		l->fd = -1;
		free(l->path);
		l->path = NULL;
		return 0;
	}
	copy = strdup(path);
	if (!copy) {
		log_warning("ledger file %s: out of memory; the current file stays in use", path);
		return -ENOMEM;
	}
	fd = open_file(path);
	if (fd < 0) {
		free(copy);
		if (l->fd >= 0)
			log_warning("ledger: still writing to the file opened before");
		return fd;
	}
	if (l->fd >= 0)
		close(l->fd);
	l->fd = fd;
	free(l->path);
	l->path = copy;
	l->need_newline = false; /* a fresh file: any broken line stayed in the old one */
	return 0;
}

static int drop(struct kvd_ledger *l, int err)
{
	l->dropped++;
	if (!l->failing) {
		l->failing = true;
		l->dropped_at_failure = l->dropped - 1;
		log_warning("ledger file %s: cannot append a record: %s; records are dropped (and counted) until "
			    "writing works again",
			    l->path ? l->path : "(none)", strerror(-err));
	}
	return err;
}

/* Take back the n bytes a short write left at the end of the file, so the
 * next record starts a line of its own. With O_APPEND the offset after the
 * write is the end of our bytes. */
static void cut_back(struct kvd_ledger *l, size_t n)
{
	off_t end = lseek(l->fd, 0, SEEK_CUR);

	if (end >= (off_t)n && ftruncate(l->fd, end - (off_t)n) == 0)
		return;
	/* Cannot cut: end the broken line, now or before the next record. */
	l->need_newline = write(l->fd, "\n", 1) != 1;
}

int kvd_ledger_append(struct kvd_ledger *l, const char *line, size_t len)
{
	char buf[KVD_LEDGER_LINE_MAX + 1];
	const char *p = line;
	size_t n = len;
	ssize_t w;

	if (l->fd < 0)
		return -EBADF; /* no ledger: nothing to count */
	if (len == 0 || line[len - 1] != '\n' || memchr(line, '\n', len - 1))
		return drop(l, -EINVAL);
	if (len > KVD_LEDGER_LINE_MAX)
		return drop(l, -EMSGSIZE);
	if (l->need_newline) {
		buf[0] = '\n';
		memcpy(buf + 1, line, len);
		p = buf;
		n = len + 1;
	}
	w = write(l->fd, p, n);
	if (w < 0 && errno == EINTR)
		w = write(l->fd, p, n);
	if (w < 0)
		return drop(l, -errno);
	if ((size_t)w < n) {
		cut_back(l, (size_t)w);
		return drop(l, -ENOSPC);
	}
	l->need_newline = false;
	l->written++;
	if (l->failing) {
		l->failing = false;
		log_notice("ledger file %s: appending again; %" PRIu64 " record(s) were dropped meanwhile", l->path,
			   l->dropped - l->dropped_at_failure);
	}
	return 0;
}

/* The slot a new record of uid takes: an empty one while there is one,
 * else the oldest record of the uid holding the most (ties: the uid whose
 * oldest record is older). */
static struct recent *victim(struct kvd_ledger *l)
{
	struct uid_count *cnt = l->scratch;
	size_t n_uids = 0, best = 0;

	if (l->n_recent < KVD_LEDGER_RECENT) {
		for (size_t i = 0; i < KVD_LEDGER_RECENT; i++)
			if (!l->recent[i].seq)
				return &l->recent[i];
	}
	for (size_t i = 0; i < KVD_LEDGER_RECENT; i++) {
		const struct recent *r = &l->recent[i];
		size_t k = 0;

		while (k < n_uids && cnt[k].uid != r->uid)
			k++;
		if (k == n_uids)
			cnt[n_uids++] = (struct uid_count){ r->uid, 0, i };
		cnt[k].n++;
		if (r->seq < l->recent[cnt[k].oldest].seq)
			cnt[k].oldest = i;
	}
	for (size_t k = 1; k < n_uids; k++)
		if (cnt[k].n > cnt[best].n ||
		    (cnt[k].n == cnt[best].n && l->recent[cnt[k].oldest].seq < l->recent[cnt[best].oldest].seq))
			best = k;
	return &l->recent[cnt[best].oldest];
}

/* Keep line[0 .. len) (no newline) among the recent records; without
 * memory the record is only not kept. */
static void keep(struct kvd_ledger *l, uint32_t uid, const char *line, size_t len)
{
	char *copy = malloc(len + 1);
	struct recent *r;

	if (!copy)
		return;
	memcpy(copy, line, len);
	copy[len] = 0;
	r = victim(l);
	if (!r->seq)
		l->n_recent++;
	free(r->line);
	*r = (struct recent){ .seq = ++l->next_seq, .uid = uid, .len = (uint32_t)len, .line = copy };
}

static int by_seq(const void *a, const void *b)
{
	const struct recent *x = *(const struct recent *const *)a, *y = *(const struct recent *const *)b;

	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

size_t kvd_ledger_recent(const struct kvd_ledger *l, int64_t uid, size_t max, struct kvd_ledger_rec *out)
{
	const struct recent *sel[KVD_LEDGER_RECENT];
	size_t n = 0, first;

	if (max == 0 || max > KVD_LEDGER_RECENT)
		max = KVD_LEDGER_RECENT;
	for (size_t i = 0; i < KVD_LEDGER_RECENT; i++) {
		const struct recent *r = &l->recent[i];

		if (r->seq && (uid < 0 || r->uid == (uint64_t)uid))
			sel[n++] = r;
	}
	qsort(sel, n, sizeof(sel[0]), by_seq);
	first = n > max ? n - max : 0;
	for (size_t i = first; i < n; i++)
		out[i - first] = (struct kvd_ledger_rec){ sel[i]->uid, sel[i]->len, sel[i]->line };
	return n - first;
}

/* s as a JSON string (quotes included) into out; control characters and
 * bytes of invalid UTF-8 are not checked for beyond escaping < 0x20. */
static size_t json_str(char *out, size_t cap, const char *s)
{
	size_t o = 0;

	if (cap < 3)
		return 0;
	out[o++] = '"';
	for (; *s && o + 8 < cap; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			out[o++] = '\\';
			out[o++] = (char)c;
		} else if (c < 0x20 || c == 0x7f) {
			o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
		} else {
			out[o++] = (char)c;
		}
	}
	out[o++] = '"';
	out[o] = 0;
	return o;
}

/* A formatted record (snprintf's n, newline included): kept among the
 * recent ones, and appended when a file is open. */
static void record(struct kvd_ledger *l, uint32_t uid, const char *line, int n)
{
	if (n < 0 || (size_t)n >= KVD_LEDGER_LINE_MAX) {
		if (l->fd >= 0)
			drop(l, -EMSGSIZE);
		return;
	}
	keep(l, uid, line, (size_t)n - 1);
	if (l->fd >= 0)
		(void)kvd_ledger_append(l, line, (size_t)n);
}

/* FNV-1a 64 over the file's size and its first KVD_LEDGER_FP_BYTES bytes;
 * 0 when it cannot be read. */
static uint64_t file_fingerprint(const char *path)
{
	uint8_t *buf = malloc(KVD_LEDGER_FP_BYTES);
	uint64_t h = 0xcbf29ce484222325ull, size;
	struct stat st;
	ssize_t n = -1;
	int fd = -1;

	if (!buf || !path || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &st) < 0)
		goto out;
	size = (uint64_t)st.st_size;
	for (int i = 0; i < 8; i++)
		h = (h ^ ((size >> (8 * i)) & 0xff)) * 0x100000001b3ull;
	n = pread(fd, buf, KVD_LEDGER_FP_BYTES, 0);
	for (ssize_t i = 0; i < n; i++)
		h = (h ^ buf[i]) * 0x100000001b3ull;
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return n < 0 ? 0 : h;
}

void kvd_ledger_set_model(struct kvd_ledger *l, const struct kvd_engine *e)
{
	const struct kvd_kv_layout *lay;
	const struct kvd_model *md;
	char *o, *end;

	if (!l || !e)
		return;
	lay = kvd_engine_kv_layout(e);
	md = kvd_engine_model(e);
	o = l->model;
	end = l->model + sizeof(l->model) - 2; /* room for the closing brace */
	l->block_size = lay->block_size;
	o += snprintf(o, (size_t)(end - o), "{\"kv_type\":\"%s\",\"block_size\":%" PRIu32 ",\"kv_bytes_per_token\":%zu"
		      ",\"page_bytes\":%zu", kvd_kv_type_name(lay->type), lay->block_size,
		      lay->block_size ? lay->page_bytes / lay->block_size : 0, lay->page_bytes);
	if (md) {
		const struct kvd_hparams *hp = kvd_model_hparams(md);
		const struct kvd_model_weights *w = kvd_model_weights(md);
		char name[300];
		int32_t win[KVD_LEDGER_WINDOW_GROUPS];
		uint32_t cnt[KVD_LEDGER_WINDOW_GROUPS], ng = 0;

		json_str(name, sizeof(name), kvd_model_name(md));
		o += snprintf(o, (size_t)(end - o), ",\"name\":%s,\"fingerprint\":\"%016" PRIx64 "\",\"kv_heads\":%" PRId32
			      ",\"query_heads\":%" PRId32 ",\"head_dim\":%" PRId32 ",\"layers\":%" PRId32, name,
			      file_fingerprint(kvd_model_path(md)), hp->n_head_kv, hp->n_head, hp->head_dim, hp->n_layer);
		for (int32_t i = 0; w && w->layers && i < hp->n_layer; i++) {
			uint32_t g = 0;

			while (g < ng && win[g] != w->layers[i].d.window)
				g++;
			if (g == ng && ng == KVD_LEDGER_WINDOW_GROUPS)
				continue; /* more kinds of layer than kept: not listed */
			if (g == ng) {
				win[ng] = w->layers[i].d.window;
				cnt[ng++] = 0;
			}
			cnt[g]++;
		}
		o += snprintf(o, (size_t)(end - o), ",\"layer_windows\":[");
		for (uint32_t g = 0; g < ng && o < end; g++)
			o += snprintf(o, (size_t)(end - o), "%s{\"window\":%" PRId32 ",\"layers\":%" PRIu32 "}",
				      g ? "," : "", win[g], cnt[g]);
		if (o < end)
			o += snprintf(o, (size_t)(end - o), "]");
	}
	if (o >= end) { /* cut: describe less rather than break the JSON */
		snprintf(l->model, sizeof(l->model), "{\"kv_type\":\"%s\"}", kvd_kv_type_name(lay->type));
		return;
	}
	*o++ = '}';
	*o = 0;
}

/* enum kvd_ctx_policy */
static const char *const policy_names[] = {"error", "truncate-oldest", "sliding-window", "sinks"};

void kvd_ledger_request(struct kvd_ledger *l, const struct kvd_ledger_who *who, uint64_t request_id,
			uint64_t session_id, const char *finish, const struct kvd_request_result *res)
{
	char kv[2048], line[KVD_LEDGER_LINE_MAX];
	const struct kvmm_seq_record *k = res->ledger;
	uint64_t slack = 0, rd_mean = 0, rd_max = 0, swapped = 0;
	char by[40] = ""; /* ,"prefix_evicted_by": when prefix tokens were recomputed */
	int n;

	if (!l)
		return;
	if (!k || kvmm_seq_record_json(k, kv, sizeof(kv)) < 0)
		snprintf(kv, sizeof(kv), "null");
	if (k && k->evicted_prefix_tokens && k->evicted_prefix_by != KVMM_OWNER_NONE)
		snprintf(by, sizeof(by), ",\"prefix_evicted_by\":%" PRIu32, k->evicted_prefix_by);
	else if (k && k->evicted_prefix_tokens)
		snprintf(by, sizeof(by), ",\"prefix_evicted_by\":null"); /* dropped explicitly, or a tenant's */
	if (k) {
		slack = k->kv_bytes_allocated > k->kv_bytes_useful ? k->kv_bytes_allocated - k->kv_bytes_useful : 0;
		rd_mean = k->steps ? k->kv_read_bytes / k->steps : 0;
		rd_max = k->kv_read_bytes_max_step;
		swapped = (uint64_t)k->swap_out_pages * l->block_size;
	}
	n = snprintf(line, sizeof(line),
		     "{\"time_ns\":%" PRIu64 ",\"client_id\":%" PRIu64 ",\"pid\":%" PRId32 ",\"uid\":%" PRIu32
		     ",\"request_id\":%" PRIu64 ",\"session_id\":%" PRIu64 ",\"finish\":\"%s\",\"error\":%d,"
		     "\"prompt_tokens\":%u,\"cached_tokens\":%u,\"adopted_tokens\":%u,\"generated_tokens\":%u,"
		     "\"spec_drafted_tokens\":%u,\"spec_accepted_tokens\":%u,\"queue_ns\":%" PRIu64
		     ",\"ttft_ns\":%" PRIu64 ",\"decode_ns\":%" PRIu64 ",\"itl_ns\":%" PRIu64
		     ",\"preemptions\":%u,\"swaps\":%u,\"swap_errors\":%u,\"swap_fallback_recomputes\":%u,"
		     "\"context_policy\":\"%s\",\"context_window\":%u,\"context_sinks\":%u,\"context_dropped_tokens\":%u,"
		     "\"context_truncated_turns\":%u,\"compute_wait_ns\":%" PRIu64 ",\"batch_width_mean\":%.2f,"
		     "\"slack_bytes\":%" PRIu64 ",\"decode_read_bytes_mean\":%" PRIu64 ",\"decode_read_bytes_max\":%" PRIu64
		     ",\"evicted_tokens\":{\"context_drop\":%u,\"swap\":%" PRIu64 ",\"preemption_recompute\":%u"
		     ",\"prefix_eviction\":%u%s},"
		     "\"model\":%s,\"kv\":%s}\n",
		     realtime_ns(), who->client_id, who->pid, who->uid, request_id, session_id, finish, res->error,
		     res->prompt_tokens, res->cached_tokens, res->adopted_tokens, res->generated_tokens,
		     res->spec_drafted_tokens, res->spec_accepted_tokens, res->queue_ns, res->ttft_ns,
		     res->decode_ns, res->generated_tokens > 1 ? res->decode_ns / (res->generated_tokens - 1) : 0,
		     res->preemptions, res->swaps, res->swap_errors, res->swap_fallback_recomputes,
		     res->context_policy < 4 ? policy_names[res->context_policy] : "?", res->context_window,
		     res->context_sinks, res->context_dropped_tokens, res->context_truncated_turns, res->compute_wait_ns,
		     res->batch_steps ? (double)res->batch_width_sum / res->batch_steps : 0.0, slack, rd_mean, rd_max,
		     res->context_dropped_tokens, swapped, res->recompute_tokens, k ? k->evicted_prefix_tokens : 0, by,
		     l->model[0] ? l->model : "null", kv);
	record(l, who->uid, line, n);
}

void kvd_ledger_rejected(struct kvd_ledger *l, const struct kvd_ledger_who *who, uint64_t request_id,
			 uint64_t session_id, int32_t code, const char *reason)
{
	char why[2048], line[KVD_LEDGER_LINE_MAX];
	int n;

	if (!l)
		return;
	json_str(why, sizeof(why), reason ? reason : "");
	n = snprintf(line, sizeof(line),
		     "{\"time_ns\":%" PRIu64 ",\"client_id\":%" PRIu64 ",\"pid\":%" PRId32 ",\"uid\":%" PRIu32
		     ",\"request_id\":%" PRIu64 ",\"session_id\":%" PRIu64
		     ",\"finish\":\"rejected\",\"error\":%" PRId32 ",\"reason\":%s}\n",
		     realtime_ns(), who->client_id, who->pid, who->uid, request_id, session_id, code, why);
	record(l, who->uid, line, n);
}

uint64_t kvd_ledger_dropped(const struct kvd_ledger *l) { return l->dropped; }
uint64_t kvd_ledger_written(const struct kvd_ledger *l) { return l->written; }
