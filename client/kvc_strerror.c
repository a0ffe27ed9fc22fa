/*
 * client/kvc_strerror.c — messages for the codes libkvclient returns:
 * negative errno values and the kvd-specific KVC_ERR_* codes.
 */
#include <string.h>

#include "kvclient.h"

#pragma GCC visibility push(hidden)

const char *kv_strerror(int code)
{
	switch (code) {
	case 0: return "Success";
	case KVC_ERR_VERSION: return "kvd speaks an incompatible protocol version";
	case KVC_ERR_CONTEXT: return "Prompt and max_tokens exceed the model's context window";
	case KVC_ERR_SHUTDOWN: return "kvd is shutting down";
	case KVC_ERR_LIMIT: return "Per-client limit reached (too many requests or sessions)";
	case KVC_ERR_ENGINE: return "The model or compute backend failed";
	case KVC_ERR_SESSION: return "Unknown, expired or busy session";
	case KVC_ERR_DENIED: return "This user may not use kvd";
	}
	if (code < 0 && code > -4096) {
		/* strerrordesc_np: static strings, thread-safe, locale-free. */
		const char *s = strerrordesc_np(-code);
		if (s)
			return s;
	}
	return "Unknown error";
}
