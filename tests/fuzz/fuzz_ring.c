/*
 * tests/fuzz/fuzz_ring.c — libFuzzer target for the shared-memory ring
 * (ipc/ring.c), whose control block and data area a hostile peer can
 * rewrite at any moment.
 *
 * Input: one byte choosing the capacity (64 << (b & 3) bytes) and whether
 * the max record is half of it or a quarter, then a program of operations
 * on one producer and one consumer handle sharing the memory: push, pop
 * (into a buffer of chosen size), the sleep/wake protocol calls, size
 * queries, re-attaching either side, and "peer writes": arbitrary head,
 * tail, waiting flags or data bytes, as the other process could store
 * them. The data area is allocated with exactly its capacity, so any
 * access outside it is an ASan error.
 *
 * Promises checked: until the memory is tampered with, the consumer pops
 * exactly the records pushed, in order, and both sides agree on the bytes
 * in use (a reference queue is kept alongside). Always: a pop returns a
 * length within the max record and the caller's buffer, or -EAGAIN,
 * -EMSGSIZE or -EPROTO; once a handle reports -EPROTO it keeps doing so;
 * used and free bytes add up to the capacity.
 */
#include <errno.h>
#include <stdatomic.h>

#include "ipc.h"
#include "fuzz_util.h"

#define MAX_QUEUE 512

struct rec {
	uint32_t len;
	uint8_t seed;
};

struct state {
	const uint8_t *p, *end;
};

static unsigned next_byte(struct state *s)
{
	return s->p < s->end ? *s->p++ : 0;
}

static uint32_t next_u32(struct state *s)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)next_byte(s) << (8 * i);
	return v;
}

static void fill(uint8_t *buf, uint32_t len, uint8_t seed)
{
	for (uint32_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(seed * 31u + i * 7u);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	struct state s = { data, data + size };
	unsigned cfg = next_byte(&s);
	uint32_t cap = 64u << (cfg & 3);
	uint32_t max_record = (cfg & 4) ? cap / 4 : cap / 2;
	void *ctl = aligned_alloc(64, IPC_RING_CTL_BYTES);
	uint8_t *area = aligned_alloc(64, cap);
	uint8_t buf[1024], want[1024];
	struct ipc_ring *prod = NULL, *cons = NULL;
	struct rec q[MAX_QUEUE];
	unsigned q_head = 0, q_n = 0;
	uint8_t seed = 0;
	bool tampered = false, prod_broken = false, cons_broken = false;

	if (!ctl || !area)
		goto out;
	ipc_ring_format(ctl);
	memset(area, 0, cap);
	CHECK(ipc_ring_attach(ctl, area, cap, max_record, IPC_RING_PRODUCER, &prod) == 0);
	CHECK(ipc_ring_attach(ctl, area, cap, max_record, IPC_RING_CONSUMER, &cons) == 0);
	CHECK(ipc_ring_capacity(prod) == cap && ipc_ring_max_record(cons) == max_record);

	for (int steps = 0; s.p < s.end && steps < 4096; steps++) {
		unsigned op = next_byte(&s);
		int r;
		ssize_t n;
		switch (op % 12) {
		case 0: { /* push one record, possibly in two pieces */
			uint32_t len = next_byte(&s) + 1u;
			if (len > sizeof(buf))
				len = sizeof(buf);
			fill(buf, len, seed);
			uint32_t cut = len / 2;
			struct iovec iov[2] = { { buf, cut }, { buf + cut, len - cut } };
			r = ipc_ring_push(prod, iov, 2);
			if (prod_broken)
				CHECK(r == -EPROTO);
			if (r == -EPROTO) {
				CHECK(tampered);
				prod_broken = true;
			} else if (len > max_record) {
				CHECK(r == -EMSGSIZE);
			} else if (!tampered) {
				ssize_t used = ipc_ring_used_bytes(prod);
				CHECK(used >= 0);
				if (r == -EAGAIN) {
					CHECK(cap - (uint32_t)used < ipc_ring_record_bytes(len));
				} else {
					CHECK(r == 0 && q_n < MAX_QUEUE);
					q[(q_head + q_n++) % MAX_QUEUE] = (struct rec){ len, seed };
				}
			} else {
				CHECK(r == 0 || r == -EAGAIN);
			}
			seed++;
			break;
		}
		case 1: { /* pop into a buffer of chosen size */
			size_t bcap = (size_t)next_byte(&s) * 4 + 1;
			if (bcap > sizeof(buf))
				bcap = sizeof(buf);
			n = ipc_ring_pop(cons, buf, bcap);
			if (cons_broken)
				CHECK(n == -EPROTO);
			if (n == -EPROTO) {
				CHECK(tampered);
				cons_broken = true;
				break;
			}
			CHECK(n == -EAGAIN || n == -EMSGSIZE || (n >= 1 && (size_t)n <= bcap && n <= max_record));
			if (tampered)
				break;
			if (q_n == 0) {
				CHECK(n == -EAGAIN);
				break;
			}
			struct rec *e = &q[q_head];
			if (e->len > bcap) {
				CHECK(n == -EMSGSIZE);
				break;
			}
			CHECK(n == (ssize_t)e->len);
			fill(want, e->len, e->seed);
			CHECK(memcmp(buf, want, e->len) == 0);
			q_head = (q_head + 1) % MAX_QUEUE;
			q_n--;
			break;
		}
		case 2: /* the peer stores any head */
			atomic_store((_Atomic uint32_t *)ctl, next_u32(&s));
			tampered = true;
			break;
		case 3: /* the peer stores any tail */
			atomic_store((_Atomic uint32_t *)((uint8_t *)ctl + 64), next_u32(&s));
			tampered = true;
			break;
		case 4: { /* the peer writes a data byte */
			uint32_t off = next_u32(&s) & (cap - 1);
			area[off] = (uint8_t)next_byte(&s);
			tampered = true;
			break;
		}
		case 5: /* the peer stores any waiting flags */
			atomic_store((_Atomic uint32_t *)((uint8_t *)ctl + 4), next_u32(&s));
			atomic_store((_Atomic uint32_t *)((uint8_t *)ctl + 68), next_u32(&s));
			break;
		case 6:
			r = ipc_ring_consumer_prepare_sleep(cons);
			CHECK(r == 0 || r == 1 || r == -EPROTO);
			CHECK(!cons_broken || r == -EPROTO);
			if (r == -EPROTO) {
				CHECK(tampered);
				cons_broken = true;
			} else if (!tampered)
				CHECK(r == (q_n > 0));
			ipc_ring_consumer_end_sleep(cons);
			break;
		case 7: {
			uint32_t len = next_byte(&s) * 2u;
			r = ipc_ring_producer_prepare_sleep(prod, len);
			CHECK(r == 0 || r == 1 || r == -EPROTO || r == -EMSGSIZE);
			CHECK(!prod_broken || r == -EPROTO);
			if (r == -EPROTO) {
				CHECK(tampered);
				prod_broken = true;
			} else if (len == 0 || len > max_record) {
				CHECK(r == -EMSGSIZE);
			}
			ipc_ring_producer_end_sleep(prod);
			break;
		}
		case 8:
			(void)ipc_ring_producer_should_wake(prod);
			(void)ipc_ring_consumer_should_wake(cons);
			break;
		case 9: {
			bool pu = next_byte(&s) & 1, pf = next_byte(&s) & 1;
			ssize_t u = ipc_ring_used_bytes(pu ? prod : cons);
			ssize_t f = ipc_ring_free_bytes(pf ? prod : cons);
			CHECK(u == -EPROTO || (u >= 0 && u <= cap));
			CHECK(f == -EPROTO || (f >= 0 && f <= cap));
			if (u == -EPROTO || f == -EPROTO)
				CHECK(tampered);
			if (u == -EPROTO)
				*(pu ? &prod_broken : &cons_broken) = true;
			if (f == -EPROTO)
				*(pf ? &prod_broken : &cons_broken) = true;
			if (!tampered) {
				uint64_t want_used = 0;
				for (unsigned i = 0; i < q_n; i++)
					want_used += ipc_ring_record_bytes(q[(q_head + i) % MAX_QUEUE].len);
				CHECK(u == (ssize_t)want_used && f == (ssize_t)(cap - want_used));
			}
			break;
		}
		case 10: { /* re-attach the consumer (a new handle reads the indices) */
			struct ipc_ring *nc = NULL;
			r = ipc_ring_attach(ctl, area, cap, max_record, IPC_RING_CONSUMER, &nc);
			CHECK(r == 0 || r == -EPROTO);
			if (!tampered)
				CHECK(r == 0);
			if (r == 0) {
				ipc_ring_free(cons);
				cons = nc;
				cons_broken = false;
			}
			break;
		}
		case 11: { /* re-attach the producer */
			struct ipc_ring *np = NULL;
			r = ipc_ring_attach(ctl, area, cap, max_record, IPC_RING_PRODUCER, &np);
			CHECK(r == 0 || r == -EPROTO);
			if (r == 0) {
				ipc_ring_free(prod);
				prod = np;
				prod_broken = false;
			}
			break;
		}
		}
	}
out:
	ipc_ring_free(prod);
	ipc_ring_free(cons);
	free(ctl);
	free(area);
	return 0;
}
