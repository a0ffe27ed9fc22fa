/*
 * ipc/ring.c — single-producer single-consumer byte rings of
 * variable-length records in memory shared between two processes (the
 * model is Linux's circ_buf.h and circular-buffers.rst).
 *
 * Layout: a control block of two cache lines — head (written only by the
 * producer) with the producer's waiting flag, and tail (written only by
 * the consumer) with the consumer's waiting flag — and a data area of
 * `cap` bytes, a power of two. head and tail are free-running u32 byte
 * counters; head - tail is the number of bytes in use. A record is a u32
 * length, the bytes, and padding up to IPC_RING_ALIGN; since cap and every
 * record are multiples of 8, a length word never straddles the end of the
 * area, while the bytes may wrap (copied in two pieces).
 *
 * Hostile peers. The other process can write anything into the shared
 * memory at any time. So: each side keeps the index it owns in private
 * memory and only *publishes* it (never reads it back); the peer's index
 * is read once per operation and checked (0 <= head - tail <= cap, 8-byte
 * granularity); a length word is read once through a volatile access (no
 * double fetch) and checked against the max record and the bytes in use;
 * records are copied out to private memory before they are parsed. A
 * failed check marks the ring broken (-EPROTO from then on). Nothing the
 * peer writes can make us touch memory outside the mapping. The layout
 * itself (cap, offsets) is never read from shared memory after attach.
 *
 * Barriers (each pairs with one on the other side):
 *   (P1) producer loads tail with acquire: the consumer's copies out of the
 *        slots it released are complete before we overwrite them; pairs
 *        with (C2).
 *   (P2) producer stores head with release: the record bytes are visible
 *        before the new head; pairs with (C1).
 *   (C1) consumer loads head with acquire: pairs with (P2), so the bytes
 *        it then copies are the ones written.
 *   (C2) consumer stores tail with release: its copies out happen before
 *        the producer may reuse the space; pairs with (P1).
 *   (W1)/(W2) the sleep protocol below: seq_cst fences.
 *
 * Sleeping without lost wake-ups. Consumer about to sleep for data:
 *     store consumer_waiting = 1; fence seq_cst (W1); load head;
 *     if data: withdraw (store 0) and don't sleep; else sleep on its wake fd.
 * Producer after publishing head (P2):
 *     fence seq_cst (W2); if exchange(consumer_waiting, 0) == 1: send a wake-up.
 * Claim: the consumer cannot sleep while the producer skips the wake-up.
 * Suppose it does: the consumer's head load (after W1) missed the new head
 * and the producer's flag load (after W2) missed the flag. W1 and W2 are
 * ordered in the single total order of seq_cst operations. If W1 comes
 * first, the producer's load after W2 must see the flag store that precedes
 * W1 (or a later one, and the only later store is the consumer's own
 * withdrawal, which it has not made since it sleeps) — so it wakes the
 * consumer. If W2 comes first, the consumer's load after W1 must see the
 * head store that precedes W2 — so it does not sleep. Either way a
 * contradiction. The wake fd is a datagram socket (ipc/chan.c): a wake-up
 * sent before the consumer reaches poll() stays queued, and poll() on a
 * socket with a queued datagram is level-triggered, so it is not lost
 * either. A send that finds the sleeper's queue full (EAGAIN, it never
 * blocks: MSG_DONTWAIT) is not lost either: the queue holds wake-ups the
 * sleeper has not received, so its poll() returns at once; the sleeper
 * receives them only after withdrawing its flag (ipc_chan_ack), and so
 * rechecks the ring after every wake-up it consumes. A peer can at worst
 * cause spare wake-ups (each one costs us a recheck of the indices), never
 * a blocked call. A producer waiting for room uses the mirror image with
 * producer_waiting and tail. The exchange clears the flag, so one sleep
 * costs at most one send(), and busy peers make no system calls at all.
 */
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ipc.h"

#pragma GCC visibility push(hidden)

struct ipc_ring_ctl {
	_Alignas(64) _Atomic uint32_t head;  /* producer-owned */
	_Atomic uint32_t producer_waiting;    /* set by the producer, cleared by either */
	uint8_t pad0[56];
	_Alignas(64) _Atomic uint32_t tail;  /* consumer-owned */
	_Atomic uint32_t consumer_waiting;    /* set by the consumer, cleared by either */
	uint8_t pad1[56];
};
static_assert(sizeof(struct ipc_ring_ctl) == IPC_RING_CTL_BYTES, "ring control block size");
/* Lock-free atomics are address-free, so they work across processes. */
static_assert(ATOMIC_INT_LOCK_FREE == 2, "u32 atomics must be lock-free");

struct ipc_ring {
	struct ipc_ring_ctl *ctl;
	uint8_t *data;
	uint32_t cap;
	uint32_t mask;
	uint32_t max_record;
	uint32_t idx;        /* head (producer) or tail (consumer): the master copy */
	enum ipc_ring_role role;
	bool broken;
};

void ipc_ring_format(void *ctl)
{
	memset(ctl, 0, sizeof(struct ipc_ring_ctl));
}

/* Bytes in use given both indices; -EPROTO when the peer's is impossible. */
static int64_t used_of(uint32_t head, uint32_t tail, uint32_t cap)
{
	uint32_t used = head - tail;
	if (used > cap || (used & (IPC_RING_ALIGN - 1)))
		return -EPROTO;
	return used;
}

static int64_t broken(struct ipc_ring *r)
{
	r->broken = true;
	return -EPROTO;
}

/* Producer: bytes in use. (P1): acquire pairs with the consumer's (C2). */
static int64_t prod_used(struct ipc_ring *r)
{
	uint32_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
	int64_t used = used_of(r->idx, tail, r->cap);
	return used < 0 ? broken(r) : used;
}

/* Consumer: bytes in use. (C1): acquire pairs with the producer's (P2). */
static int64_t cons_used(struct ipc_ring *r)
{
	uint32_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
	int64_t used = used_of(head, r->idx, r->cap);
	return used < 0 ? broken(r) : used;
}

int ipc_ring_attach(void *ctl, void *data, uint32_t capacity, uint32_t max_record, enum ipc_ring_role role,
		    struct ipc_ring **ret)
{
	if (!ctl || !data || ((uintptr_t)ctl & 63) || ((uintptr_t)data & (IPC_RING_ALIGN - 1)))
		return -EINVAL;
	if (capacity < 64 || (capacity & (capacity - 1)) || capacity > (1u << 31))
		return -EINVAL;
	if (max_record == 0 || max_record > capacity / 2)
		return -EINVAL;
	if (role != IPC_RING_PRODUCER && role != IPC_RING_CONSUMER)
		return -EINVAL;

	struct ipc_ring_ctl *c = ctl;
	/* Starting point: acquire on the peer's index, as in (P1)/(C1). */
	uint32_t head = atomic_load_explicit(&c->head, role == IPC_RING_PRODUCER ? memory_order_relaxed
										  : memory_order_acquire);
	uint32_t tail = atomic_load_explicit(&c->tail, role == IPC_RING_CONSUMER ? memory_order_relaxed
										  : memory_order_acquire);
	if ((head & (IPC_RING_ALIGN - 1)) || (tail & (IPC_RING_ALIGN - 1)) || used_of(head, tail, capacity) < 0)
		return -EPROTO;

	struct ipc_ring *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->ctl = c;
	r->data = data;
	r->cap = capacity;
	r->mask = capacity - 1;
	r->max_record = max_record;
	r->role = role;
	r->idx = role == IPC_RING_PRODUCER ? head : tail;
	*ret = r;
	return 0;
}

struct ipc_ring *ipc_ring_free(struct ipc_ring *r)
{
	free(r);
	return NULL;
}

uint32_t ipc_ring_capacity(const struct ipc_ring *r)
{
	return r->cap;
}

uint32_t ipc_ring_max_record(const struct ipc_ring *r)
{
	return r->max_record;
}

static void copy_in(struct ipc_ring *r, uint32_t pos, const void *src, size_t n)
{
	uint32_t off = pos & r->mask;
	size_t first = r->cap - off < n ? r->cap - off : n;

	memcpy(r->data + off, src, first);
	if (n > first)
		memcpy(r->data, (const uint8_t *)src + first, n - first);
}

static void copy_out(const struct ipc_ring *r, uint32_t pos, void *dst, size_t n)
{
	uint32_t off = pos & r->mask;
	size_t first = r->cap - off < n ? r->cap - off : n;

	memcpy(dst, r->data + off, first);
	if (n > first)
		memcpy((uint8_t *)dst + first, r->data, n - first);
}

int ipc_ring_push(struct ipc_ring *r, const struct iovec *iov, int n_iov)
{
	size_t len = 0;

	assert(r->role == IPC_RING_PRODUCER);
	if (r->broken)
		return -EPROTO;
	for (int i = 0; i < n_iov; i++) {
		if (iov[i].iov_len > r->max_record)
			return -EMSGSIZE;
		len += iov[i].iov_len;
	}
	if (len == 0 || len > r->max_record)
		return -EMSGSIZE;
	uint32_t need = ipc_ring_record_bytes((uint32_t)len);
	int64_t used = prod_used(r); /* (P1) */
	if (used < 0)
		return (int)used;
	if (r->cap - (uint32_t)used < need)
		return -EAGAIN;

	uint32_t pos = r->idx;
	uint32_t len32 = (uint32_t)len;
	memcpy(r->data + (pos & r->mask), &len32, 4); /* 8-aligned: never wraps */
	pos += 4;
	for (int i = 0; i < n_iov; i++) {
		if (iov[i].iov_len == 0)
			continue; /* iov_base may be NULL */
		copy_in(r, pos, iov[i].iov_base, iov[i].iov_len);
		pos += (uint32_t)iov[i].iov_len;
	}
	r->idx += need;
	/* (P2) release: the bytes above are visible before the new head;
	 * pairs with the consumer's acquire load (C1). */
	atomic_store_explicit(&r->ctl->head, r->idx, memory_order_release);
	return 0;
}

ssize_t ipc_ring_pop(struct ipc_ring *r, void *buf, size_t cap)
{
	assert(r->role == IPC_RING_CONSUMER);
	if (r->broken)
		return -EPROTO;
	int64_t used = cons_used(r); /* (C1) */
	if (used < 0)
		return (ssize_t)used;
	if (used == 0)
		return -EAGAIN;
	/* One volatile read of the length word: the peer may rewrite it at any
	 * moment, so the value checked is the value used. */
	uint32_t len = *(volatile const uint32_t *)(r->data + (r->idx & r->mask));
	if (len == 0 || len > r->max_record || ipc_ring_record_bytes(len) > (uint64_t)used)
		return (ssize_t)broken(r);
	if (len > cap)
		return -EMSGSIZE;
	copy_out(r, r->idx + 4, buf, len);
	r->idx += ipc_ring_record_bytes(len);
	/* (C2) release: our copy out is complete before the producer can see
	 * the space as free; pairs with its acquire load (P1). */
	atomic_store_explicit(&r->ctl->tail, r->idx, memory_order_release);
	return (ssize_t)len;
}

ssize_t ipc_ring_used_bytes(struct ipc_ring *r)
{
	if (r->broken)
		return -EPROTO;
	return (ssize_t)(r->role == IPC_RING_PRODUCER ? prod_used(r) : cons_used(r));
}

ssize_t ipc_ring_free_bytes(struct ipc_ring *r)
{
	ssize_t used = ipc_ring_used_bytes(r);
	return used < 0 ? used : (ssize_t)(r->cap - (size_t)used);
}

int ipc_ring_consumer_prepare_sleep(struct ipc_ring *r)
{
	assert(r->role == IPC_RING_CONSUMER);
	if (r->broken)
		return -EPROTO;
	atomic_store_explicit(&r->ctl->consumer_waiting, 1, memory_order_relaxed);
	/* (W1) StoreLoad: the flag store is ordered before the head load
	 * below; pairs with the producer's (W2). See the proof above. */
	atomic_thread_fence(memory_order_seq_cst);
	int64_t used = cons_used(r);
	if (used != 0) {
		atomic_store_explicit(&r->ctl->consumer_waiting, 0, memory_order_relaxed);
		return used < 0 ? (int)used : 1;
	}
	return 0;
}

void ipc_ring_consumer_end_sleep(struct ipc_ring *r)
{
	/* Relaxed: only a hint to the producer; a stale 1 costs one spare
	 * wake-up, never a lost one. */
	atomic_store_explicit(&r->ctl->consumer_waiting, 0, memory_order_relaxed);
}

int ipc_ring_producer_prepare_sleep(struct ipc_ring *r, uint32_t record_len)
{
	assert(r->role == IPC_RING_PRODUCER);
	if (r->broken)
		return -EPROTO;
	if (record_len == 0 || record_len > r->max_record)
		return -EMSGSIZE;
	atomic_store_explicit(&r->ctl->producer_waiting, 1, memory_order_relaxed);
	/* (W1') StoreLoad: the flag store is ordered before the tail load;
	 * pairs with the consumer's (W2'). */
	atomic_thread_fence(memory_order_seq_cst);
	int64_t used = prod_used(r);
	if (used < 0 || r->cap - (uint32_t)used >= ipc_ring_record_bytes(record_len)) {
		atomic_store_explicit(&r->ctl->producer_waiting, 0, memory_order_relaxed);
		return used < 0 ? (int)used : 1;
	}
	return 0;
}

void ipc_ring_producer_end_sleep(struct ipc_ring *r)
{
	atomic_store_explicit(&r->ctl->producer_waiting, 0, memory_order_relaxed);
}

bool ipc_ring_producer_should_wake(struct ipc_ring *r)
{
	assert(r->role == IPC_RING_PRODUCER);
	/* (W2) StoreLoad: our head store (P2) is ordered before the flag
	 * load; pairs with the consumer's (W1). */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(&r->ctl->consumer_waiting, memory_order_relaxed))
		return false;
	/* Clear it so the next batch does not send a wake-up again. */
	return atomic_exchange_explicit(&r->ctl->consumer_waiting, 0, memory_order_relaxed) != 0;
}

bool ipc_ring_consumer_should_wake(struct ipc_ring *r)
{
	assert(r->role == IPC_RING_CONSUMER);
	/* (W2') StoreLoad: our tail store (C2) is ordered before the flag
	 * load; pairs with the producer's (W1'). */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(&r->ctl->producer_waiting, memory_order_relaxed))
		return false;
	return atomic_exchange_explicit(&r->ctl->producer_waiting, 0, memory_order_relaxed) != 0;
}
