/*
 * daemon/persist.c — the KV pool and its prefix index handed to systemd's
 * file-descriptor store at a clean stop and adopted at the next start
 * (see persist.h for the protocol and the fingerprint).
 *
 * Everything that comes back from the store is checked before use: the
 * index memfd must be sealed against writes and resizing, its structure and
 * checksum must hold (kvmm_persist_parse), its fingerprint must match this
 * run exactly, and kvmm validates every entry again on import. The pool
 * memfd must be sealed against shrinking and have the exact size. A pool
 * whose pages were in the swap file at the stop lost those pages (the swap
 * file is unlinked and dies with the process): they are simply not in the
 * index. On any mismatch the pool is dropped with one log line, and kvd
 * starts cold.
 *
 * Hibernation (the second half of this file) covers what the fd store
 * cannot: a full stop, a reboot. The cached pages go to a file at the stop
 * (kvmm_hib_save, after the hand-over, bounded in bytes and time) and come
 * back at a start that adopted nothing from the store: the file's index is
 * read and its fingerprint compared before READY=1 (a few KiB), its pages
 * are read in batches between the server loop's turns afterwards
 * (kvd_persist_background), each checked before it can be hit.
 */
#include "persist.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "config.h"
#include "engine.h"
#include "kvmm.h"
#include "log.h"
#include "server.h"

/* Bumped whenever the meaning of a pool's bytes or of the fingerprint
 * changes, so that an older kvd's pool is never adopted. */
#define KVD_PERSIST_FORMAT 1u
/* The KV element type is the layout's enum kvd_kv_type plus one (0 is never
 * written), beside the token_stride that follows from it. */
#define MODEL_HEAD_BYTES (1u << 20)
#define BARRIER_USEC (5 * 1000000ull)

static uint64_t kvd_now_ns_for_persist(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts); /* kvmm_hib_save's deadline clock */
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The owner bytes of the exported index (kvmm stores them, kvd compares). */
struct fingerprint {
	uint32_t format;
	uint32_t kv_type;
	uint64_t model_dev, model_ino, model_size, model_mtime_ns;
	uint64_t model_head_hash;
	uint32_t block_size, n_layer, kv_dim, reserved;
	uint64_t token_stride, page_bytes;
	uint64_t pool_bytes; /* as configured; 0: a fraction of memory */
	char backend[16];
};

struct kvd_persist {
	struct fingerprint model; /* the model fields, from the start */
	int model_id_err;         /* stat/read error of the model file, or 0 */
	int keep, prefix;
	uint64_t pool_bytes;      /* kv.pool_size in bytes, 0: a fraction */
	int pool_fd;              /* passed back, not yet given to the engine */
	void *index;              /* the index read back */
	size_t index_bytes;
	bool adopting;
	bool adopted;             /* the fd store's pool was adopted */
	/* hibernation */
	char hib_path[KVD_CONF_PATH_MAX]; /* empty: none */
	uint64_t hib_bytes;
	uint32_t hib_timeout_s;
	struct kvmm_hib *hib;     /* being adopted, or NULL */
	struct kvd_engine *engine; /* of hib */
	struct kvmm_hib_progress hib_done;
	uint64_t hib_t0_ns;
};

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull ^ n;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t v;

		memcpy(&v, p + i, 8);
		h = (h ^ v) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 31;
	}
	for (; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

/* The model file's identity: stat fields and the hash of its first MiB. */
static int model_identity(const char *path, struct fingerprint *fp)
{
	struct stat st;
	uint8_t *buf;
	size_t want, got = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	fp->model_dev = st.st_dev;
	fp->model_ino = st.st_ino;
	fp->model_size = (uint64_t)st.st_size;
	fp->model_mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	want = (uint64_t)st.st_size < MODEL_HEAD_BYTES ? (size_t)st.st_size : MODEL_HEAD_BYTES;
	buf = malloc(want ? want : 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	while (got < want) {
		ssize_t n = pread(fd, buf + got, want - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			break;
		}
		got += (size_t)n;
	}
	if (r == 0)
		fp->model_head_hash = hash_bytes(buf, want);
	free(buf);
out:
	close(fd);
	return r;
}

/* This run's fingerprint for a pool of this layout. */
static void fingerprint_of(const struct kvd_persist *p, const struct kvd_kv_layout *l, const char *backend,
			   uint64_t pool_bytes, struct fingerprint *ret)
{
	*ret = p->model;
	ret->format = KVD_PERSIST_FORMAT;
	ret->kv_type = (uint32_t)l->type + 1u;
	ret->block_size = l->block_size;
	ret->n_layer = l->n_layer;
	ret->kv_dim = l->kv_dim;
	ret->reserved = 0;
	ret->token_stride = l->token_stride;
	ret->page_bytes = l->page_bytes;
	ret->pool_bytes = pool_bytes;
	memset(ret->backend, 0, sizeof(ret->backend));
	snprintf(ret->backend, sizeof(ret->backend), "%s", backend);
}

static const char *kv_type_name(uint32_t v)
{
	const char *n = v && v <= 16 ? kvd_kv_type_name((enum kvd_kv_type)(v - 1)) : NULL;
	return n ? n : "unknown";
}

/* Why `old` (handed over) does not fit `now`, or NULL when it does. */
static const char *mismatch(const struct fingerprint *old, const struct fingerprint *now, uint32_t old_pages,
			    char *buf, size_t size)
{
	if (old->format != now->format)
		return snprintf(buf, size, "written by a kvd of another hand-over format (%u, this one %u)", old->format,
				now->format), buf;
	if (old->model_dev != now->model_dev || old->model_ino != now->model_ino)
		return "the model file is another file (device or inode changed)";
	if (old->model_size != now->model_size || old->model_mtime_ns != now->model_mtime_ns)
		return "the model file changed (size or modification time)";
	if (old->model_head_hash != now->model_head_hash)
		return "the model file's header changed";
	if (strncmp(old->backend, now->backend, sizeof(old->backend)))
		return snprintf(buf, size, "computed by the %.16s backend, now %.16s", old->backend, now->backend), buf;
	if (old->block_size != now->block_size)
		return snprintf(buf, size, "block size %u, now %u", old->block_size, now->block_size), buf;
	if (old->kv_type != now->kv_type)
		return snprintf(buf, size, "KV element type %s, now %s (kv.cache_type)", kv_type_name(old->kv_type),
				kv_type_name(now->kv_type)), buf;
	if (old->n_layer != now->n_layer || old->kv_dim != now->kv_dim || old->token_stride != now->token_stride ||
	    old->page_bytes != now->page_bytes)
		return snprintf(buf, size, "page layout differs (%u layers x %u KV dim, %" PRIu64 " bytes a page; now "
				"%u x %u, %" PRIu64 ")", old->n_layer, old->kv_dim, old->page_bytes, now->n_layer,
				now->kv_dim, now->page_bytes), buf;
	if (now->pool_bytes && now->pool_bytes / now->page_bytes != old_pages)
		return snprintf(buf, size, "pool of %u pages handed over, kv.pool_size now gives %" PRIu64, old_pages,
				now->pool_bytes / now->page_bytes), buf;
	return NULL;
}

bool kvd_persist_fd_name(const char *name)
{
	return name && (!strcmp(name, KVD_PERSIST_FDNAME_POOL) || !strcmp(name, KVD_PERSIST_FDNAME_INDEX));
}

static void discard(struct kvd_persist *p, const char *why)
{
	log_notice("restart cache: discarded the previous run's KV pool: %s", why);
	if (p->pool_fd >= 0)
		close(p->pool_fd);
	p->pool_fd = -1;
	free(p->index);
	p->index = NULL;
	p->index_bytes = 0;
}

/* kv.persist_path: "auto" is the first directory of $STATE_DIRECTORY
 * (systemd's StateDirectory=), or none outside systemd. */
static void hib_path_of(const char *conf, char *buf, size_t size)
{
	const char *sd = getenv("STATE_DIRECTORY");

	buf[0] = 0;
	if (strcmp(conf, "auto")) {
		snprintf(buf, size, "%s", conf);
		return;
	}
	if (sd && *sd) {
		size_t n = strcspn(sd, ":");

		if (n + sizeof("/" KVD_PERSIST_HIB_NAME) <= size)
			snprintf(buf, size, "%.*s/%s", (int)n, sd, KVD_PERSIST_HIB_NAME);
	}
}

struct kvd_persist *kvd_persist_new(const struct kvd_config *cfg, int n, char **names)
{
	struct kvd_persist *p = calloc(1, sizeof(*p));
	char why[160];
	int index_fd = -1, r;

	if (!p)
		return NULL;
	p->pool_fd = -1;
	p->keep = cfg->keep_on_restart;
	p->prefix = cfg->prefix_caching;
	p->pool_bytes = cfg->pool_bytes;
	p->model_id_err = model_identity(cfg->model, &p->model);
	p->hib_bytes = cfg->persist_bytes;
	p->hib_timeout_s = cfg->persist_timeout_s;
	hib_path_of(cfg->persist_path, p->hib_path, sizeof(p->hib_path));
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;

		if (!names || !kvd_persist_fd_name(names[i]))
			continue;
		/* One of each is taken; a duplicate (never stored by kvd) is closed. */
		if (!strcmp(names[i], KVD_PERSIST_FDNAME_POOL) && p->pool_fd < 0)
			p->pool_fd = fd;
		else if (!strcmp(names[i], KVD_PERSIST_FDNAME_INDEX) && index_fd < 0)
			index_fd = fd;
		else
			close(fd);
	}
	if (p->pool_fd < 0 && index_fd < 0)
		return p;
	/* Ours now: the store keeps nothing stale for the next start. */
	sd_notify(0, "FDSTOREREMOVE=1\nFDNAME=" KVD_PERSIST_FDNAME_POOL);
	sd_notify(0, "FDSTOREREMOVE=1\nFDNAME=" KVD_PERSIST_FDNAME_INDEX);
	if (p->pool_fd < 0 || index_fd < 0) {
		discard(p, p->pool_fd < 0 ? "an index was passed back without its pool" : "the pool was passed back without its index");
		goto out;
	}
	r = kvmm_persist_read_memfd(index_fd, (size_t)KVD_PERSIST_MAX_INDEX_BYTES, &p->index, &p->index_bytes);
	if (r < 0) {
		snprintf(why, sizeof(why), "cannot use the index memfd: %s",
			 r == -EPERM ? "not a memfd sealed against writing and resizing" : strerror(-r));
		discard(p, why);
		goto out;
	}
	{
		struct kvmm_persist_info info;

		r = kvmm_persist_parse(p->index, p->index_bytes, &info);
		if (r < 0 || info.owner_bytes != sizeof(struct fingerprint)) {
			snprintf(why, sizeof(why), "the prefix index is %s",
				 r == -EPROTO ? "of another kvmm format version" : r < 0 ? "corrupt (checksum or structure)"
				 : "from another kvd (fingerprint size)");
			discard(p, why);
		}
	}
out:
	if (index_fd >= 0)
		close(index_fd);
	return p;
}

struct kvd_persist *kvd_persist_free(struct kvd_persist *p)
{
	if (!p)
		return NULL;
	if (p->pool_fd >= 0)
		close(p->pool_fd);
	free(p->index);
	kvmm_hib_close(p->hib);
	free(p);
	return NULL;
}

int kvd_persist_pool_adopt(void *ud, const struct kvd_kv_layout *layout, const char *backend, int device_pool,
			   uint64_t pool_bytes, uint32_t *ret_n_pages)
{
	struct kvd_persist *p = ud;
	struct kvmm_persist_info info;
	struct fingerprint old, now;
	const char *why;
	char buf[200];
	int fd;

	if (!p || p->pool_fd < 0 || !p->index)
		return -1;
	if (device_pool) {
		snprintf(buf, sizeof(buf), "the %s backend keeps its KV pool in device memory, which cannot be adopted",
			 backend);
		discard(p, buf);
		return -1;
	}
	if (!p->prefix) {
		discard(p, "prefix caching is off (kv.prefix_caching)");
		return -1;
	}
	if (p->model_id_err) {
		snprintf(buf, sizeof(buf), "cannot identify the model file: %s", strerror(-p->model_id_err));
		discard(p, buf);
		return -1;
	}
	if (kvmm_persist_parse(p->index, p->index_bytes, &info) < 0) { /* checked in kvd_persist_new */
		discard(p, "the prefix index is corrupt");
		return -1;
	}
	memcpy(&old, info.owner, sizeof(old));
	fingerprint_of(p, layout, backend, pool_bytes, &now);
	why = mismatch(&old, &now, info.n_pages, buf, sizeof(buf));
	if (why) {
		discard(p, why);
		return -1;
	}
	fd = p->pool_fd;
	p->pool_fd = -1; /* the engine's now */
	p->adopting = true;
	*ret_n_pages = info.n_pages;
	return fd;
}

void kvd_persist_adopt(struct kvd_persist *p, struct kvd_engine *e)
{
	struct kvmm *kv = kvd_engine_kvmm(e);
	int r = kvd_engine_pool_adopted(e);
	uint32_t pages = 0;
	char why[160];

	if (!p || !p->adopting)
		return;
	p->adopting = false;
	if (r < 0) {
		snprintf(why, sizeof(why), "cannot map the pool memfd: %s",
			 r == -EPERM ? "not sealed against shrinking" : r == -EBADFD ? "wrong size or kind of file"
										: strerror(-r));
		discard(p, why);
		return;
	}
	r = kvmm_prefix_import(kv, p->index, p->index_bytes, &pages);
	if (r < 0) {
		snprintf(why, sizeof(why), "the prefix index was refused: %s",
			 r == -EBADMSG ? "invalid entries" : strerror(-r));
		discard(p, why);
		return;
	}
	p->adopted = true;
	log_info("restart cache: adopted %u cached prefix pages (%" PRIu64 " tokens) of a %u-page pool from the "
		 "previous run", pages, (uint64_t)pages * kvmm_block_size(kv), kvmm_n_pages(kv));
	free(p->index);
	p->index = NULL;
	p->index_bytes = 0;
}

int kvd_persist_hand_over(struct kvd_persist *p, struct kvd_engine *e)
{
	struct kvmm *kv = kvd_engine_kvmm(e);
	struct kvmm_persist_info info;
	struct fingerprint fp;
	void *buf = NULL;
	size_t bytes = 0;
	int pool_fd = kvmm_pool_fd(kv), index_fd = -1, r;
	const char *ns = getenv("NOTIFY_SOCKET");

	if (!p || !p->keep || !ns || !*ns)
		return 0;
	if (pool_fd < 0) {
		log_info("restart cache: not kept: the %s backend's KV pool is in device memory",
			 kvd_engine_backend_name(e));
		return 0;
	}
	if (!p->prefix)
		return 0;
	if (p->model_id_err) {
		log_warning("restart cache: not kept: cannot identify the model file: %s", strerror(-p->model_id_err));
		return p->model_id_err;
	}
	/* pool_bytes as configured: the fingerprint says "a fraction" by 0,
	 * and then the next run takes the pool at the size handed over. */
	fingerprint_of(p, kvd_engine_kv_layout(e), kvd_engine_backend_name(e), p->pool_bytes, &fp);
	r = kvmm_prefix_export(kv, &fp, sizeof(fp), &buf, &bytes);
	if (r == 0)
		r = kvmm_persist_memfd(buf, bytes, &index_fd);
	if (r == 0)
		r = kvmm_persist_parse(buf, bytes, &info);
	free(buf);
	if (r < 0) {
		log_warning("restart cache: not kept: cannot export the prefix index: %s", strerror(-r));
		goto out;
	}
	r = sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=" KVD_PERSIST_FDNAME_POOL, &pool_fd, 1);
	if (r > 0)
		r = sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=" KVD_PERSIST_FDNAME_INDEX, &index_fd, 1);
	if (r <= 0) {
		log_warning("restart cache: not kept: cannot pass the memfds to the service manager: %s",
			    r < 0 ? strerror(-r) : "no notification socket");
		r = r < 0 ? r : -ENOTCONN;
		goto out;
	}
	/* The manager reads them before it sees this process exit. */
	r = sd_notify_barrier(0, BARRIER_USEC);
	if (r < 0)
		log_warning("restart cache: the service manager did not confirm the hand-over: %s", strerror(-r));
	log_info("restart cache: handed the KV pool (%u pages) and %u cached prefix pages to the service manager",
		 kvmm_n_pages(kv), info.n_entries);
	r = 0;
out:
	if (index_fd >= 0)
		close(index_fd);
	return r;
}

/* ---- hibernation ------------------------------------------------------------------------ */

void kvd_persist_hib_open(struct kvd_persist *p, struct kvd_engine *e)
{
	struct kvmm *kv = kvd_engine_kvmm(e);
	struct fingerprint old, now;
	const char *why = NULL;
	const void *owner;
	uint32_t ob = 0;
	char buf[200];
	int r;

	if (!p || !p->hib_path[0])
		return;
	if (p->adopted) {
		log_debug("cache file %s: not read, the restart cache was adopted", p->hib_path);
		return;
	}
	r = kvmm_hib_open(p->hib_path, &p->hib, &why);
	if (r == -ENOENT)
		return;
	if (r < 0) {
		log_notice("cache file %s: refused, starting cold: %s%s%s", p->hib_path, why ? why : strerror(-r),
			   why && r != -EBADMSG && r != -EPROTO ? ": " : "", why && r != -EBADMSG && r != -EPROTO ? strerror(-r) : "");
		return;
	}
	why = NULL;
	owner = kvmm_hib_owner(p->hib, &ob);
	if (p->model_id_err) {
		snprintf(buf, sizeof(buf), "cannot identify the model file: %s", strerror(-p->model_id_err));
		why = buf;
	} else if (ob != sizeof(old)) {
		why = "written by another kvd (fingerprint size)";
	} else if (kvmm_pool_fd(kv) < 0) {
		snprintf(buf, sizeof(buf), "the %s backend keeps its KV pool in device memory",
			 kvd_engine_backend_name(e));
		why = buf;
	} else if (!p->prefix) {
		why = "prefix caching is off (kv.prefix_caching)";
	} else {
		memcpy(&old, owner, sizeof(old));
		/* Pages are placed anew: the pool's size does not matter. */
		fingerprint_of(p, kvd_engine_kv_layout(e), kvd_engine_backend_name(e), 0, &now);
		why = mismatch(&old, &now, 0, buf, sizeof(buf));
	}
	if (why) {
		log_notice("cache file %s: refused, starting cold: %s", p->hib_path, why);
		p->hib = kvmm_hib_close(p->hib);
		return;
	}
	p->engine = e;
	p->hib_t0_ns = kvd_now_ns_for_persist();
	{
		struct kvmm_hib_info info;

		kvmm_hib_info(p->hib, &info);
		log_info("cache file %s: adopting %u cached prefix pages in the background", p->hib_path,
			 info.n_entries);
	}
}

static void hib_finish(struct kvd_persist *p, int r)
{
	const struct kvmm_hib_progress *d = &p->hib_done;
	uint64_t ms = (kvd_now_ns_for_persist() - p->hib_t0_ns) / 1000000;

	if (r < 0)
		log_warning("cache file %s: adoption stopped: %s", p->hib_path, strerror(-r));
	log_info("cache file %s: adopted %u cached prefix pages (%" PRIu64 " tokens) in %" PRIu64 " ms; %u already "
		 "cached, %u skipped", p->hib_path, d->adopted,
		 (uint64_t)d->adopted * kvmm_block_size(kvd_engine_kvmm(p->engine)), ms, d->present, d->skipped);
	if (d->refused)
		log_warning("cache file %s: refused %u page(s): content does not match the index checksum", p->hib_path,
			    d->refused);
	p->hib = kvmm_hib_close(p->hib);
}

int kvd_persist_background(void *ud)
{
	struct kvd_persist *p = ud;
	int r;

	if (!p || !p->hib)
		return 0;
	r = kvmm_hib_adopt(kvd_engine_kvmm(p->engine), p->hib, KVMM_HIB_BATCH, &p->hib_done);
	if (r > 0)
		return 1;
	hib_finish(p, r);
	return 0;
}

/* Write the cache file (the stop's writer, also kvctl cache save): logged;
 * 0 with *st, 1 when there was nothing to do (why says so), or -errno. */
static int hib_write(struct kvd_persist *p, struct kvd_engine *e, const char *when, struct kvmm_hib_save_stats *st,
		     char *why, size_t why_size)
{
	struct fingerprint fp;
	uint64_t deadline;
	int r;

	if (p->hib) /* what was not adopted yet is still in the file: adopt it first, briefly */
		while (kvd_persist_background(p) > 0)
			;
	if (kvmm_pool_fd(kvd_engine_kvmm(e)) < 0) {
		snprintf(why, why_size, "the %s backend's KV pool is in device memory", kvd_engine_backend_name(e));
		log_info("cache file %s: not written: %s", p->hib_path, why);
		return 1;
	}
	if (!p->prefix) {
		snprintf(why, why_size, "prefix caching is off (kv.prefix_caching)");
		return 1;
	}
	if (p->model_id_err) {
		snprintf(why, why_size, "cannot identify the model file: %s", strerror(-p->model_id_err));
		log_warning("cache file %s: not written: %s", p->hib_path, why);
		return p->model_id_err;
	}
	fingerprint_of(p, kvd_engine_kv_layout(e), kvd_engine_backend_name(e), 0, &fp);
	deadline = kvd_now_ns_for_persist() + (uint64_t)p->hib_timeout_s * 1000000000ull;
	r = kvmm_hib_save(kvd_engine_kvmm(e), p->hib_path, &fp, sizeof(fp), p->hib_bytes, deadline, st);
	if (r < 0) {
		snprintf(why, why_size, "%s", r == -ELOOP ? "the path is a symbolic link"
			 : r == -EISDIR ? "the path is not a regular file" : strerror(-r));
		log_warning("cache file %s: not written: %s", p->hib_path, why);
		return r;
	}
	log_info("cache file %s: %swrote %u of %u cached prefix pages (%.1f MiB) in %.1f ms (%.0f MiB/s%s)%s%s",
		 p->hib_path, when, st->pages_written, st->candidates, (double)st->bytes / 1048576.0,
		 (double)st->ns / 1e6, st->ns ? (double)st->bytes / 1048576.0 / ((double)st->ns / 1e9) : 0.0,
		 st->direct ? ", O_DIRECT" : "", st->timed_out ? "; stopped by kv.persist_timeout" : "",
		 st->pages_written + 0 < st->candidates && !st->timed_out ? "; the rest is past kv.persist_size" : "");
	if (st->write_error)
		log_warning("cache file %s: a page write failed (%s): kept the pages before it", p->hib_path,
			    strerror(-st->write_error));
	return 0;
}

int kvd_persist_hibernate(struct kvd_persist *p, struct kvd_engine *e)
{
	struct kvmm_hib_save_stats st;
	char why[200];
	int r;

	if (!p || !p->hib_path[0])
		return 0;
	r = hib_write(p, e, "", &st, why, sizeof(why));
	return r > 0 ? 0 : r;
}

int kvd_persist_cache_save(void *ud, struct kvd_engine *e, struct kvd_cache_op_result *ret, char *why,
			   size_t why_size)
{
	struct kvd_persist *p = ud;
	struct kvmm_hib_save_stats st = {0};
	int r;

	if (!p || !p->hib_path[0]) {
		snprintf(why, why_size, "no cache file is configured (kv.persist_path is empty)");
		return -EOPNOTSUPP;
	}
	r = hib_write(p, e, "on request, ", &st, why, why_size);
	if (r > 0)
		return -EOPNOTSUPP;
	if (r < 0)
		return r;
	*ret = (struct kvd_cache_op_result){
		.pages = st.pages_written,
		.candidates = st.candidates,
		.bytes = st.bytes,
		.ns = st.ns,
		.timed_out = st.timed_out,
	};
	return 0;
}

int kvd_persist_cache_drop(void *ud, struct kvd_engine *e, struct kvd_cache_op_result *ret, char *why,
			   size_t why_size)
{
	struct kvd_persist *p = ud;
	uint64_t t0 = kvd_now_ns_for_persist();
	uint32_t dropped = 0;
	bool removed = false;
	struct stat st;

	(void)why;
	(void)why_size;
	if (p && p->hib) { /* the file is going: so are the pages not adopted yet */
		log_info("cache file %s: adoption stopped by a cache drop", p->hib_path);
		hib_finish(p, 0);
	}
	kvmm_cache_drop_all(kvd_engine_kvmm(e), &dropped);
	if (p && p->hib_path[0] && lstat(p->hib_path, &st) == 0 && S_ISREG(st.st_mode)) {
		if (unlink(p->hib_path) == 0)
			removed = true;
		else
			log_warning("cache file %s: cannot remove it: %s", p->hib_path, strerror(errno));
	}
	*ret = (struct kvd_cache_op_result){
		.pages = dropped,
		.ns = kvd_now_ns_for_persist() - t0,
		.file_removed = removed,
	};
	log_info("prefix cache dropped on request: %u cached pages%s%s", dropped, removed ? "; removed " : "",
		 removed ? p->hib_path : "");
	return 0;
}
