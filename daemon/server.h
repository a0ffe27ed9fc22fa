/*
 * daemon/server.h — kvd's front: the epoll loop that owns the listening
 * socket, every client connection (handshake, credentials, per-client
 * limits, uploads through the shared-memory ring, the token stream back),
 * the sessions, and the calls into the scheduler between socket events.
 *
 * One thread runs everything: kvd_server_run() alternates one scheduler
 * step with a non-blocking look at the sockets while there is work, and
 * blocks in epoll_wait() when there is none. It also owns the systemd side
 * of serving: READY=1, STATUS= lines, watchdog pings and STOPPING=1, and the
 * signals (SIGTERM/SIGINT drain, SIGHUP asks the owner to reload).
 */
#ifndef KVD_SERVER_H
#define KVD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* 0.2.0: GENERATE carries chat turns (IPC_GEN_CHAT_TURNS): clients gate
 * that flag on this number, so it is at least IPC_CHAT_TURNS_SERVER_VERSION.
 * 0.3.0: parallel samples and log-probabilities (ipc_generate.n_samples,
 * IPC_GEN_LOGPROBS), gated on IPC_SAMPLES_SERVER_VERSION.
 * 0.4.0: STATS carries pages_packed and pages_released (IPC_RELEASE_SERVER_VERSION).
 * 0.5.0: WELCOME names the KV element type (IPC_KV_TYPE_CLIENT_VERSION); [kv]
 * cache_type = bf16.
 * 0.6.0: the prefix cache is scoped by owner ([kv] prefix_sharing) and
 * GENERATE may name a tenant (IPC_GEN_TENANT, IPC_TENANT_SERVER_VERSION).
 * 0.7.0: GENERATE may carry a constraint (IPC_GEN_CONSTRAINT,
 * IPC_CONSTRAINT_SERVER_VERSION): structured output.
 * 0.8.0: WELCOME carries the model id (IPC_MODEL_ID_CLIENT_VERSION); STATS
 * replies grow (IPC_STATS_GROW_VERSION) and carry the constraint counters.
 * 0.9.0: speculative decoding seen and chosen (IPC_SPEC_VERSION): DONE's
 * drafted and accepted tokens, STATS' spec_* counters, IPC_GEN_NO_SPECULATE;
 * chat turns may carry tools, tool calls and tool results
 * (IPC_CHAT_TOOLS_SERVER_VERSION), rendered in the family's tool format.
 * 0.10.0: STATS says which drafter is in use and how full the draft
 * model's pool is (IPC_SPEC_DRAFT_STATS_VERSION).
 * 0.11.0: WELCOME names the chat format (IPC_CHAT_FORMAT_CLIENT_VERSION);
 * a conversation may end with a call-open turn (IPC_CHAT_CALL_OPEN,
 * IPC_CHAT_CALL_OPEN_SERVER_VERSION): a forced call in the family's shape. */
#define KVD_VERSION     "0.11.0"
#define KVD_VERSION_NUM ((0u << 16) | (11u << 8) | 0u) /* as in ipc_welcome.server_version */

struct kvd_engine;
struct kvd_server;

/* What a cache hook did (kvctl cache save / drop), for the reply. */
struct kvd_cache_op_result {
	uint32_t pages;      /* save: pages written; drop: cached pages dropped */
	uint32_t candidates; /* save: cached pages there were to write */
	uint64_t bytes;      /* save: bytes of the file */
	uint64_t ns;         /* time taken */
	bool timed_out;      /* save: stopped by kv.persist_timeout */
	bool file_removed;   /* drop: the cache file was removed */
};

struct kvd_server_hooks {
	/* SIGHUP: re-read the configuration and return it in *ret (0), or
	 * return an error (the running configuration stays). The server then
	 * applies what can change while running and logs what cannot. */
	int (*reload)(void *ud, struct kvd_config *ret);
	void *ud;
	/* Optional: work done a piece at a time between the loop's turns
	 * (adopting the cache file), until it returns 0; > 0 while more
	 * remains (the loop then does not sleep). Not called while stopping. */
	int (*background)(void *ud);
	void *background_ud;
	/* Optional: CACHE from an administrator (kvctl cache save / drop), ud
	 * cache_ud. 0 and *ret filled, or -errno with why[0 .. why_size) saying
	 * what is wrong for the client. Missing: the request is refused. */
	int (*cache_save)(void *ud, struct kvd_engine *e, struct kvd_cache_op_result *ret, char *why, size_t why_size);
	int (*cache_drop)(void *ud, struct kvd_engine *e, struct kvd_cache_op_result *ret, char *why, size_t why_size);
	void *cache_ud;
	/* Fault injection, set only by the test build (kvd-faulty, compiled
	 * with -DKVD_FAULT_INJECTION): every SO_PEERCRED read fails; WELCOME
	 * says this version instead of KVD_VERSION_NUM (0: the real one), so
	 * clients' fallbacks for older daemons can be tested. */
	bool fault_peercred;
	uint32_t fault_server_version;
};

/*
 * Build a server over a loaded engine. listen_fd: a listening
 * SOCK_SEQPACKET socket (owned by the server from now on, also on
 * failure); sig_fd: a signalfd for SIGTERM, SIGINT and SIGHUP (owned
 * likewise). The configuration is copied. Returns 0, -ENOMEM or the
 * error of epoll/scheduler creation.
 */
int kvd_server_create(const struct kvd_config *cfg, struct kvd_engine *e, int listen_fd, int sig_fd,
		      const struct kvd_server_hooks *hooks, struct kvd_server **ret);

/*
 * Serve until SIGTERM/SIGINT, then drain: stop accepting, refuse new
 * requests with IPC_ERR_SHUTDOWN, let running ones finish for up to the
 * configured drain_timeout, then end the rest (each client gets an
 * ERROR IPC_ERR_SHUTDOWN as the request's last event). Sends READY=1 on
 * entry. Returns 0 after a clean drain, or a negative errno when the
 * loop itself failed.
 */
int kvd_server_run(struct kvd_server *srv);

/* Close every connection (requests cancelled) and free; accepts NULL;
 * returns NULL. The engine stays the caller's. */
struct kvd_server *kvd_server_free(struct kvd_server *srv);

#endif
