/*
 * kernels/wtype.c — sizes and names of the weight storage types every
 * backend understands (the ggml block formats kvd computes with).
 */
#include "backend.h"

size_t kvd_wtype_row_bytes(enum kvd_wtype t, int64_t cols)
{
	if (cols <= 0)
		return 0;
	switch (t) {
	case KVD_WTYPE_F32:
		return (size_t)cols * 4;
	case KVD_WTYPE_F16:
	case KVD_WTYPE_BF16:
		return (size_t)cols * 2;
	case KVD_WTYPE_Q4_0:
		return cols % 32 ? 0 : (size_t)cols / 32 * 18;
	case KVD_WTYPE_Q4_1:
		return cols % 32 ? 0 : (size_t)cols / 32 * 20;
	case KVD_WTYPE_Q8_0:
		return cols % 32 ? 0 : (size_t)cols / 32 * 34;
	}
	return 0;
}

const char *kvd_wtype_name(enum kvd_wtype t)
{
	switch (t) {
	case KVD_WTYPE_F32: return "f32";
	case KVD_WTYPE_F16: return "f16";
	case KVD_WTYPE_BF16: return "bf16";
	case KVD_WTYPE_Q4_0: return "q4_0";
	case KVD_WTYPE_Q4_1: return "q4_1";
	case KVD_WTYPE_Q8_0: return "q8_0";
	}
	return "unknown";
}
