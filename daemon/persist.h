/*
 * daemon/persist.h — the KV cache kept across restarts under systemd.
 *
 * At a clean stop kvd hands two memfds to the service manager's
 * file-descriptor store (sd_pid_notify_with_fds, FDSTORE=1): "kv-pool", the
 * pool itself, and "kv-index", a sealed snapshot of the prefix index
 * (kvmm_prefix_export) carrying a fingerprint of what the pages were
 * computed for. systemd keeps the store while the unit is restarted
 * (`systemctl restart`, Restart=) and passes the fds back at the next start
 * (LISTEN_FDS, LISTEN_FDNAMES); it drops them when the unit fully stops.
 * At that start kvd takes them out of the store, compares the fingerprint,
 * and adopts the pool and its cached prefixes, or discards them with one
 * log line saying why. No KV byte is ever written to a file.
 *
 * The fingerprint: kvd's hand-over format version; the model file's
 * identity (device, inode, size, modification time in ns) and a 64-bit hash
 * of its first MiB (the GGUF header: architecture, hyper-parameters, tensor
 * list); the page layout (block size, page bytes, layers, KV width, KV
 * element type); the pool (pages, and the configured size when given in
 * bytes); the backend. Hashing the whole file would cost seconds for large
 * models at every start; an edited or replaced file changes its identity.
 */
#ifndef KVD_PERSIST_H
#define KVD_PERSIST_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

struct kvd_config;
struct kvd_engine;

#define KVD_PERSIST_FDNAME_POOL  "kv-pool"
#define KVD_PERSIST_FDNAME_INDEX "kv-index"
/* The largest index memfd read back: 16 + 4 * block_size bytes an entry,
 * one entry per page, for pools far beyond any RAM kvd runs in. */
#define KVD_PERSIST_MAX_INDEX_BYTES (1ull << 32)

struct kvd_persist;

/*
 * Start-up: note the model file's identity (kept for the hand-over at
 * stop, so that a file replaced while kvd runs is never described as the
 * one its KV came from), and take what the service manager passed back:
 * the fds named kv-pool and kv-index among LISTEN_FDS (other fds, the
 * listening socket, are left where they are), removing both names from its
 * store (FDSTOREREMOVE=1) so nothing stale stays there. The index memfd is
 * read (through its seals), checked and closed. Anything passed but
 * unusable is discarded with one log line. NULL only for lack of memory.
 */
struct kvd_persist *kvd_persist_new(const struct kvd_config *cfg, int n_fds, char **names);
/* Accepts NULL; closes a pool fd not adopted; returns NULL. */
struct kvd_persist *kvd_persist_free(struct kvd_persist *p);

/* The engine's pool_adopt callback (struct kvd_engine_config), ud a
 * struct kvd_persist (may be NULL): compares the fingerprint and returns
 * the pool memfd to adopt, or -1 after logging the reason. */
int kvd_persist_pool_adopt(void *ud, const struct kvd_kv_layout *layout, const char *backend, int device_pool,
			   uint64_t pool_bytes, uint32_t *ret_n_pages);

/* After kvd_engine_open: import the index into the adopted pool and log
 * what was adopted (or why nothing was). Accepts NULL. */
void kvd_persist_adopt(struct kvd_persist *p, struct kvd_engine *e);

/* True for the fd names kvd_persist_new claims. */
bool kvd_persist_fd_name(const char *name);

/*
 * At a clean stop: export the prefix index and hand both memfds to the
 * service manager, then wait (sd_notify_barrier) until it has them. Does
 * nothing without NOTIFY_SOCKET, with kv.keep_on_restart off, without
 * prefix caching, or for a device pool (logged). Returns 0 or -errno (logged).
 */
int kvd_persist_hand_over(struct kvd_persist *p, struct kvd_engine *e);

/*
 * Hibernation (kv.persist_path, persist_size, persist_timeout): the prefix
 * cache in a file that outlives the fd store (a full stop, a reboot).
 * The fingerprint is the one above without the pool size (pages are placed
 * anew). The file: KVD_PERSIST_HIB_NAME in $STATE_DIRECTORY for "auto".
 */
#define KVD_PERSIST_HIB_NAME "prefix-cache"

/* After kvd_persist_adopt(), before READY=1: unless the fd store's pool
 * was adopted, open the file, check it and its fingerprint (one log line
 * when refused: kvd starts cold), and keep it for kvd_persist_background.
 * Accepts NULL. */
void kvd_persist_hib_open(struct kvd_persist *p, struct kvd_engine *e);
/* The server's background hook (ud a struct kvd_persist): adopt the next
 * batch of the file's pages. 1 while more remain, else 0 (the outcome
 * logged once, the file closed). */
int kvd_persist_background(void *ud);
/* At a clean stop, after kvd_persist_hand_over(): write the file (logged:
 * pages, bytes, time and rate, or why not). 0 or -errno. Accepts NULL. */
int kvd_persist_hibernate(struct kvd_persist *p, struct kvd_engine *e);

/* kvctl cache (struct kvd_server_hooks.cache_save / cache_drop, ud a
 * struct kvd_persist, may be NULL), on the server's thread between steps.
 * Save: the file written now, as at a stop (an adoption still running is
 * finished first, so the file's pages are not lost); -EOPNOTSUPP without a
 * kv.persist_path, with prefix caching off or for a device pool.
 * Drop: an adoption still running stops, every cached page no sequence uses
 * is dropped (kvmm_cache_drop_all), and the file is removed (a regular file
 * only). Both log what they did; 0, or -errno with why set. */
struct kvd_cache_op_result;
int kvd_persist_cache_save(void *ud, struct kvd_engine *e, struct kvd_cache_op_result *ret, char *why,
			   size_t why_size);
int kvd_persist_cache_drop(void *ud, struct kvd_engine *e, struct kvd_cache_op_result *ret, char *why,
			   size_t why_size);

#endif
