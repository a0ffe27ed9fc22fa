/*
 * kernels/wtype.c — names of the weight storage types every backend
 * understands (the ggml block formats kvd computes with); their row sizes
 * are inline in backend.h.
 */
#include "backend.h"

const char *kvd_wtype_name(enum kvd_wtype t)
{
	switch (t) {
	case KVD_WTYPE_F32: return "f32";
	case KVD_WTYPE_F16: return "f16";
	case KVD_WTYPE_BF16: return "bf16";
	case KVD_WTYPE_Q4_0: return "q4_0";
	case KVD_WTYPE_Q4_1: return "q4_1";
	case KVD_WTYPE_Q5_0: return "q5_0";
	case KVD_WTYPE_Q5_1: return "q5_1";
	case KVD_WTYPE_Q8_0: return "q8_0";
	case KVD_WTYPE_Q4_K: return "q4_K";
	case KVD_WTYPE_Q5_K: return "q5_K";
	case KVD_WTYPE_Q6_K: return "q6_K";
	}
	return "unknown";
}
