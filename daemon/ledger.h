/*
 * daemon/ledger.h — the per-request ledger file ([log] ledger): one line of
 * JSON per finished or rejected request, appended, for scripts to read.
 *
 * Every record is one whole line written by one write() on an O_APPEND
 * descriptor, or nothing: a short write (a full file system, a file size
 * limit) is cut back to where the record began, so a reader never sees half
 * a record glued to the next one. A record that cannot be written is dropped
 * and counted (kvd_ledger_dropped), and the daemon logs once per run of
 * failures, not once per record. The file is opened with O_NOFOLLOW and must
 * be a regular file; kvd_ledger_reopen() (SIGHUP) opens the path again, which
 * is logrotate's convention: rename the file, send SIGHUP, and kvd writes to
 * a new file at the old name.
 *
 * A record names its requester by what kvd learned when it accepted the
 * request (struct kvd_ledger_who), so a request whose client died meanwhile
 * is still recorded with that client's id, pid and uid.
 *
 * The last records are also kept in memory (kvd_ledger_recent), for
 * `kvctl ledger` to ask the daemon rather than read a file that holds every
 * user's records.
 *
 * Single-threaded: the server's loop owns the ledger.
 */
#ifndef KVD_LEDGER_H
#define KVD_LEDGER_H

#include <stddef.h>
#include <stdint.h>

struct kvd_ledger;
struct kvd_request_result;
struct kvd_engine;

/* Longest record, newline included; longer ones are dropped (counted). */
#define KVD_LEDGER_LINE_MAX 8192u

/* Who asked: captured from the connection (SO_PEERCRED) at admission. */
struct kvd_ledger_who {
	uint64_t client_id;
	int32_t pid;
	uint32_t uid;
};

/* A ledger writing to path, or to nothing when path is "" or NULL. A file
 * that cannot be opened is logged and leaves the ledger closed (until a
 * reopen succeeds); it is not an error. Returns 0 or -ENOMEM. */
int kvd_ledger_new(const char *path, struct kvd_ledger **ret);
/* Close and free; accepts NULL; returns NULL. */
struct kvd_ledger *kvd_ledger_free(struct kvd_ledger *l);
/* Open path ("" or NULL: none) afresh and write there from now on (SIGHUP).
 * When the new file cannot be opened the old one stays in use (logged).
 * Returns 0 or the open error. */
int kvd_ledger_reopen(struct kvd_ledger *l, const char *path);

/*
 * Describe the model the daemon serves, for every later record's "model"
 * member (docs/operations.md lists its fields): name, file fingerprint,
 * KV heads against query heads, head size, KV element type, bytes per
 * token and page, and the attention window of each group of layers. The
 * fingerprint is FNV-1a 64 over the file's size and first
 * KVD_LEDGER_FP_BYTES bytes (the GGUF header and metadata). An engine
 * without a model file (tests) or a failed read leaves the members it
 * cannot know out. Also sets the block size the records' slack and
 * swapped tokens are counted in. e may be NULL (nothing described).
 */
#define KVD_LEDGER_FP_BYTES (64u * 1024u)
#define KVD_LEDGER_MODEL_MAX 1024u /* longest "model" member */
#define KVD_LEDGER_WINDOW_GROUPS 8u /* kinds of layer (by window) listed, at most */
void kvd_ledger_set_model(struct kvd_ledger *l, const struct kvd_engine *e);

/* Append one record: len bytes ending in '\n', no other newline. Returns 0
 * when written whole; otherwise nothing of it stays in the file and the
 * record counts as dropped: -EBADF (no file open), -EMSGSIZE (longer than
 * KVD_LEDGER_LINE_MAX), -EINVAL (not one line), or write's error (-ENOSPC,
 * -EFBIG, -EIO; a short write is reported as -ENOSPC). */
int kvd_ledger_append(struct kvd_ledger *l, const char *line, size_t len);

/* The record of a request that ran (l may be NULL: nothing to do) (finish is its name: "eos", "length",
 * "stop", "cancelled", "error"); res->ledger may be NULL. */
void kvd_ledger_request(struct kvd_ledger *l, const struct kvd_ledger_who *who, uint64_t request_id,
			uint64_t session_id, const char *finish, const struct kvd_request_result *res);
/* The record of a request refused before it ran: finish "rejected", the
 * error code sent to the client, and the reason it was told. */
void kvd_ledger_rejected(struct kvd_ledger *l, const struct kvd_ledger_who *who, uint64_t request_id,
			 uint64_t session_id, int32_t code, const char *reason);

/*
 * Up to KVD_LEDGER_RECENT recent records, kept in memory whether or not a
 * file is open (the same lines, without the newline), for `kvctl ledger`.
 * When the store is full, a new record replaces the oldest record of the
 * uid that holds the most, so one user's flood pushes out only its own
 * history and every other user keeps its last records. Fills
 * out[] with the last max (0 or more than KVD_LEDGER_RECENT: all kept) of
 * those whose uid is `uid` (< 0: everyone's), oldest first, and returns
 * their number; out must hold that many. The lines stay valid until the
 * next record.
 */
#define KVD_LEDGER_RECENT 1024u
struct kvd_ledger_rec {
	uint32_t uid;
	uint32_t len;
	const char *line;
};
size_t kvd_ledger_recent(const struct kvd_ledger *l, int64_t uid, size_t max, struct kvd_ledger_rec *out);

/* Records dropped since kvd_ledger_new(), and records written. */
uint64_t kvd_ledger_dropped(const struct kvd_ledger *l);
uint64_t kvd_ledger_written(const struct kvd_ledger *l);

#endif
