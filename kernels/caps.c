/*
 * kernels/caps.c — the names of the capabilities a backend is asked about
 * (struct kvd_cap_query in backend.h), so that every refusal the engine
 * makes says in the same words what is missing. One row per query kind.
 */
#include <stdio.h>

#include "backend.h"

const char *kvd_cap_describe(const struct kvd_cap_query *q, char *buf, size_t cap)
{
	const char *kv = kvd_kv_type_name(q->kv_type);

	if (!cap)
		return buf;
	switch (q->kind) {
	case KVD_CAPQ_WEIGHT_TYPE:
		snprintf(buf, cap, "weight type %s", kvd_wtype_name(q->wtype));
		break;
	case KVD_CAPQ_MODEL_FEATURE:
		snprintf(buf, cap, "%s", kvd_feature_name(q->feature));
		break;
	case KVD_CAPQ_ATTENTION:
		snprintf(buf, cap, "attention with head size %d and %d query heads per KV head", (int)q->head_dim,
			 (int)q->n_rep);
		break;
	case KVD_CAPQ_KV_TYPE:
		snprintf(buf, cap, "KV cache type %s", kv ? kv : "unknown");
		break;
	case KVD_CAPQ_KV_FAST:
		snprintf(buf, cap, "fast attention over a %s KV cache", kv ? kv : "unknown");
		break;
	case KVD_CAPQ_KV_SHIFT:
		snprintf(buf, cap, "re-rotating cached keys (kv_shift) of a %s KV cache", kv ? kv : "unknown");
		break;
	case KVD_CAPQ_RELEASED_PAGES:
		snprintf(buf, cap, "released pages of windowed layers");
		break;
	default:
		snprintf(buf, cap, "capability %d", (int)q->kind);
		break;
	}
	return buf;
}
