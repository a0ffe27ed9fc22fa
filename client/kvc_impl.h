/*
 * client/kvc_impl.h — libkvclient's private header: the client and request
 * structs and the internal functions the library's files share (the
 * transport, in kvc_io.c). Not installed; included only by the library's
 * own sources in client/. Everything declared here is hidden: the library
 * exports only what kvclient.h marks KVC_EXPORT.
 */
#ifndef KVD_KVC_IMPL_H
#define KVD_KVC_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvclient.h"
#include "ipc.h"

#pragma GCC visibility push(hidden)


#define MSG_CAP (IPC_MAX_ERROR_MSG_BYTES + 1)
/* Token ids a hostile or broken daemon may make us allocate for one text. */
#define MAX_TOKENIZE_IDS (IPC_MAX_TEXT_BYTES + 64u)
#define MAX_PS_ENTRIES   (1u << 20)

struct evnode {
	struct evnode *next;
	struct kvc_event ev;
	_Alignas(8) unsigned char data[]; /* ids, then text and a NUL */
};

struct kvc_request {
	kvc_client *c;
	kvc_request *prev, *next;   /* the client's list */
	uint64_t id;
	struct evnode *head, *tail; /* events not yet returned */
	struct evnode *cur;         /* returned by the last kvc_request_next() */
	bool finished;              /* the terminal event arrived (result valid) */
	int status;                 /* 0, -ECANCELED or the error; when finished */
	struct kvc_result result;
	/* samples and log-probabilities (IPC_F_SAMPLE stream) */
	bool ext;                   /* asked for: TOKEN and DONE carry IPC_F_SAMPLE */
	bool logprobs;
	uint32_t top_logprobs;
	uint32_t n_samples, n_done;
	struct kvc_result *sample_res; /* n_samples; NULL unless ext */
	uint8_t *sample_done;       /* n_samples flags */
	struct ipc_done_spec spec;  /* DONE's IPC_F_SPEC block (summed over samples); 0 without */
};

typedef int (*ctl_fn)(kvc_client *c, const struct ipc_frame *f, void *arg);

struct kvc_client {
	int fd;
	struct ipc_chan *ch;
	struct kvc_info info;
	uint64_t next_id;
	kvc_request *reqs;
	int dead;                   /* 0, or why the connection is unusable */
	int timeout_ms;
	/* The control call in progress (one at a time). */
	uint64_t ctl_id;
	ctl_fn ctl;
	void *ctl_arg;
	bool ctl_done;
	int ctl_status;
	char last_msg[MSG_CAP];
	uint8_t *sockbuf;           /* one socket frame */
	uint8_t *ringbuf;           /* one ring record (separate: ring drains nest in socket handling) */
	uint8_t *txbuf;             /* a GENERATE being encoded */
};

typedef bool (*cond_fn)(kvc_client *c, void *arg);

/* ---- kvc_io.c ------------------------------------------------------------------------ */

int64_t now_ns(void);
int64_t deadline_in(int timeout_ms);
/* poll() timeout until deadline: -1 without one, rounded up otherwise. */
int remaining_ms(int64_t deadline);
bool expired(int64_t deadline);
void set_msg(char *dst, const char *src, size_t n);
/* Send one frame on the (non-blocking) socket, waiting for room until
 * deadline. */
int send_frame(kvc_client *c, uint16_t type, uint64_t id, const struct iovec *iov, int n_iov, int64_t deadline);
/* Process traffic until cond holds (0), the connection dies (its error),
 * or the deadline passes (-ETIMEDOUT); see kvc_io.c. */
int pump(kvc_client *c, cond_fn cond, void *arg, int64_t deadline, bool want_tx, uint32_t tx_payload);
/* pump() condition: request arg (a kvc_request) has an event. */
bool req_ready(kvc_client *c, void *arg);
/* Push text as PROMPT_DATA records of request id. */
int upload(kvc_client *c, uint64_t id, const char *text, size_t len);
/* A control call: send the frame (and upload text if given), then process
 * traffic until fn says the reply is complete (fn: 0 more frames follow,
 * 1 done, a negative code for a bad reply). */
int ctl_call(kvc_client *c, uint16_t type, const struct iovec *iov, int n_iov, const char *up, size_t up_len,
	     ctl_fn fn, void *arg);

/* ---- kvc_kvmap.c ---------------------------------------------------------------------- */

/* Map a KV map file described by d (decoded with ipc_decode_kvmap): checks
 * its seals and size; the fd stays the caller's. -EPROTO for a file that
 * is not what d says, -ENOMEM, mmap's error. (kvc_kvmap_open's second
 * half; tests map a kvmm's metadata memfd with it.) */
int kvc_kvmap_attach_fd(int fd, const struct ipc_kvmap *d, kvc_kvmap **ret);

#pragma GCC visibility pop

#endif
