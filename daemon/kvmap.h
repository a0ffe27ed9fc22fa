/*
 * daemon/kvmap.h — the KV map's wire description of kvmm's metadata memfd
 * (struct ipc_kvmap), which KVMAP_REPLY sends with the fd (daemon/admin.c).
 * A header of its own so that tests can describe a kvmm of theirs exactly
 * as the daemon does and read it through libkvclient.
 */
#ifndef KVD_KVMAP_H
#define KVD_KVMAP_H

#include "ipc.h"

struct kvmm;

/* Describe kv's metadata memfd (kvmm_stats_fd) for a client. */
void kvd_kvmap_describe(const struct kvmm *kv, struct ipc_kvmap *ret);

#endif
