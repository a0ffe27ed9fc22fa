/*
 * ipc/ipc_views.h — the part of kvd's wire protocol that shows the daemon's
 * bookkeeping: the KV map (KVMAP), the latency histograms (HIST) and the
 * last per-request ledger records (LEDGER). Included by ipc.h, whose
 * conventions (validation errors, framing, decoders) hold here too; not
 * meant to be included on its own.
 */
#ifndef KVD_IPC_VIEWS_H
#define KVD_IPC_VIEWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The KV map: the daemon's page pool as a picture (kvctl stats --map).
 * KVMAP is answered by KVMAP_REPLY carrying one fd: a memfd that the KV
 * manager keeps up to date, sealed (F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) so that whoever receives it can map it
 * only read-only and cannot change, resize or punch holes in what the daemon
 * itself reads; a daemon whose kernel cannot seal it so refuses KVMAP with
 * -EOPNOTSUPP rather than hand it out. Counters are for everyone (as STATS):
 * the map shows page states, never whose pages they are.
 *
 * The reply describes the file; the client trusts none of it until checked
 * against the file's size. In the file, at byte offsets:
 *   seq_offset         u64 sequence lock: odd while the daemon updates; read
 *                      it (acquire), copy what you need, fence (acquire),
 *                      read it again: equal and even means a consistent copy
 *   words_offset       u64 counters, n_words of them; the word indices below
 *                      name the ones a map needs
 *   page_words_offset  one u32 state word per page (n_pages): its refcount
 *                      (IPC_KVMAP_PAGE_REF_MASK, sequences mapping it) and
 *                      the flags IPC_KVMAP_PAGE_INDEXED (in the prefix index)
 *                      and IPC_KVMAP_PAGE_FREE (on the free list). A page is
 *                      free (FREE), cached (refcount 0, INDEXED: kept on the
 *                      LRU for prefix reuse), private (refcount 1) or shared
 *                      (refcount >= 2). IPC_KVMAP_PAGE_PACKED marks a
 *                      referenced page holding released pages' global
 *                      layers ([kv] release_local); readers may ignore it.
 * Swapped pages have no state word: they live in the swap file's swap_slots
 * slots; word_slots_used counts the slots holding pages, of which
 * word_pages_demoted are cached prefix pages (a cache tier) and the rest
 * belong to preempted sequences.
 */
#define IPC_KVMAP_PAGE_REF_MASK 0x00ffffffu
#define IPC_KVMAP_PAGE_INDEXED  0x01000000u
#define IPC_KVMAP_PAGE_FREE     0x02000000u
#define IPC_KVMAP_PAGE_PACKED   0x04000000u
#define IPC_KVMAP_MAX_PAGES     (1u << 30) /* pages a map may describe */
#define IPC_KVMAP_MAX_WORDS     4096u      /* counter words a map may describe */

struct ipc_kvmap {
	uint64_t file_bytes;        /* size of the memfd */
	uint64_t seq_offset;        /* 8-aligned */
	uint64_t words_offset;      /* 8-aligned */
	uint64_t page_words_offset; /* 4-aligned */
	uint64_t page_bytes;
	uint32_t n_pages;           /* 1 .. IPC_KVMAP_MAX_PAGES */
	uint32_t block_size;        /* tokens per page */
	uint32_t n_words;           /* 1 .. IPC_KVMAP_MAX_WORDS */
	uint32_t swap_slots;
	uint32_t word_slots_used;   /* indices into the counters, < n_words */
	uint32_t word_pages_demoted;
	uint64_t reserved[4];
};

/*
 * Latency histograms (kvctl stats --prometheus): fixed buckets, counted by
 * the daemon since it started. HIST is answered by HIST_REPLY. bucket[i]
 * counts the samples in (bound_ns[i-1], bound_ns[i]] (not cumulative);
 * bucket[n_bounds] those above the last bound. count is the sum of the
 * buckets and sum_ns the sum of the samples.
 */
#define IPC_HIST_MAX_BOUNDS 24
struct ipc_hist {
	uint32_t n_bounds;          /* finite upper bounds used, 1 .. IPC_HIST_MAX_BOUNDS */
	uint32_t reserved0;
	uint64_t count;
	uint64_t sum_ns;
	uint64_t bound_ns[IPC_HIST_MAX_BOUNDS];      /* strictly increasing; unused ones 0 */
	uint64_t bucket[IPC_HIST_MAX_BOUNDS + 1];    /* unused ones 0 */
};
struct ipc_hist_reply {
	struct ipc_hist ttft;       /* request received -> first token, one sample per request
				     * that produced a token */
	struct ipc_hist itl;        /* inter-token latency: one sample per token after a
				     * request's first (the gap since its previous token) */
	uint64_t reserved[4];
};

/*
 * The per-request ledger (kvctl ledger): the daemon keeps the last
 * IPC_LEDGER_MAX_RECORDS records it wrote (or would have written, without a
 * ledger file) since it started, each the same line of JSON as in the
 * ledger file. LEDGER asks for the last max_records of them (0: all kept)
 * that the caller may see: every user's for administrators, its own uid's
 * for anyone else; the reply holds the newest of those whose records take
 * at most IPC_LEDGER_MAX_REPLY_BYTES (so that it always fits the socket's
 * buffer). The reply lists them oldest first, over one or more
 * frames (IPC_F_MORE on all but the last); each record is
 *
 *     u32 uid | u32 bytes | bytes of JSON (no newline) | zero padding to 8
 */
#define IPC_LEDGER_MAX_RECORDS 1024u
#define IPC_LEDGER_MAX_LINE_BYTES 8192u
#define IPC_LEDGER_MAX_REPLY_BYTES (512u << 10) /* records of one reply in all: the newest that fit */
struct ipc_ledger_req {
	uint32_t max_records;       /* 0 .. IPC_LEDGER_MAX_RECORDS; 0: all */
	uint32_t flags;             /* none defined: 0 */
};
struct ipc_ledger_reply {
	uint32_t n_total;           /* records in the whole reply */
	uint32_t n_records;         /* in this frame */
};

/*
 * The prefix cache steered by an administrator (kvctl cache): CACHE asks
 * the daemon to write its hibernation file now, while serving (SAVE: the
 * writer of a clean stop, bounded by kv.persist_size and persist_timeout),
 * or to drop every cached prefix page no sequence uses and remove that file
 * (DROP). A caller that is not root or in server.admin_groups gets
 * IPC_ERR_DENIED; SAVE without a kv.persist_path gets -EOPNOTSUPP, with a
 * message. The reply says what was done. Since IPC_CACHE_SERVER_VERSION.
 */
#define IPC_CACHE_SERVER_VERSION ((0u << 16) | (7u << 8) | 0u) /* kvd 0.7.0 */
#define IPC_CACHE_SAVE 1u
#define IPC_CACHE_DROP 2u
struct ipc_cache_req {
	uint32_t op;                /* IPC_CACHE_SAVE or IPC_CACHE_DROP */
	uint32_t flags;             /* none defined: 0 */
};
struct ipc_cache_reply {
	uint32_t op;                /* the request's */
	uint32_t file_removed;      /* DROP: 1 when a hibernation file was removed */
	uint64_t pages;             /* SAVE: pages written; DROP: cached pages dropped */
	uint64_t candidates;        /* SAVE: cached pages there were to write */
	uint64_t bytes;             /* SAVE: bytes of the file */
	uint64_t ns;                /* time the operation took */
	uint32_t timed_out;         /* SAVE: stopped by kv.persist_timeout */
	uint32_t reserved;          /* 0 */
};

/* ---- decoders ---------------------------------------------------------- */

/* KVMAP_REPLY: the description checked for what can be checked without the
 * file (offsets aligned, counts in range, word indices < n_words, regions
 * inside file_bytes, reserved zero); the fd stays in the frame. */
int ipc_decode_kvmap(const struct ipc_frame *f, struct ipc_kvmap *ret);
/* HIST_REPLY: bounds strictly increasing, unused slots zero, count equal
 * to the sum of the buckets. */
int ipc_decode_hist(const struct ipc_frame *f, struct ipc_hist_reply *ret);
int ipc_decode_ledger_req(const struct ipc_frame *f, struct ipc_ledger_req *ret);
/* CACHE: a known op, flags 0 (-EPROTO otherwise). */
int ipc_decode_cache_req(const struct ipc_frame *f, struct ipc_cache_req *ret);
/* CACHE_REPLY: a known op, reserved 0, pages <= candidates for SAVE. */
int ipc_decode_cache_reply(const struct ipc_frame *f, struct ipc_cache_reply *ret);

struct ipc_ledger_record {
	uint32_t uid;
	uint32_t bytes;
	const char *json;           /* bytes bytes, no NUL, no newline */
};
struct ipc_ledger_reply_msg {
	struct ipc_ledger_reply r;
	const uint8_t *records;     /* walk with ipc_ledger_record_next() */
	size_t records_bytes;
	bool more;
};
/* LEDGER_REPLY: every record inside the frame, n_records of them exactly,
 * lengths within IPC_LEDGER_MAX_LINE_BYTES, no newline or NUL in a line,
 * zero padding. */
int ipc_decode_ledger_reply(const struct ipc_frame *f, struct ipc_ledger_reply_msg *ret);
/* Record at *off (start at 0) of a decoded reply; advances *off. Returns 1,
 * or 0 after the last. */
int ipc_ledger_record_next(const struct ipc_ledger_reply_msg *m, size_t *off, struct ipc_ledger_record *ret);
/* Bytes one record of `bytes` bytes of JSON takes in a reply. */
static inline size_t ipc_ledger_record_size(uint32_t bytes)
{
	return (8u + (size_t)bytes + 7u) & ~(size_t)7u;
}

#endif /* KVD_IPC_VIEWS_H */
