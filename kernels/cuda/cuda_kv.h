/*
 * kernels/cuda/cuda_kv.h — private to the CUDA plug-in: the KV element
 * types of kernels/backend.h (enum kvd_kv_type) in device code. One token's
 * K (or V) row is stored by kv_store_row from floats, and one element of a
 * stored head is read back by kv_load; the attention kernel's tiles and
 * kv_shift go through these, so the byte layout lives in one place.
 *
 * The layouts are the CPU backend's (kernels/cpu/kvquant.c), byte for byte,
 * so that pages, swap files and the host tier are interchangeable between
 * the two backends: f16 (IEEE half, rounded to nearest even), f32, bf16
 * (the upper half of the float, rounded to nearest even, NaN kept quiet),
 * q8_0 (34-byte blocks: f16 d = max|x| / 127, 32 int8 round(x / d), half
 * away from zero) and q4_0 (18-byte blocks: f16 d = m / -8 with m the
 * element of largest magnitude, 16 bytes of nibbles n = min(15, trunc(x /
 * d + 8.5)), element j in the low nibble of byte j, j + 16 in its high
 * one). The quantizers compute what the CPU's do in the same order, with
 * __fmul_rn / __fadd_rn where the GPU would otherwise contract a multiply
 * and an add into one rounding, so the same floats give the same bytes.
 *
 * Scales and 16-bit elements are read and written as 16-bit words: every
 * block and row of every type starts at an even byte offset of a page.
 */
#ifndef KVD_CUDA_KV_H
#define KVD_CUDA_KV_H

#include <math.h>

#include "cuda_impl.h"

/* enum kvd_kv_type values (kernels/backend.h), for device code. */
#define KT_F16 0
#define KT_F32 1
#define KT_Q8_0 2
#define KT_Q4_0 3
#define KT_BF16 4
#define KT_QBLOCK 32

static __host__ __device__ __forceinline__ int kt_head_bytes(int type, int hd)
{
	switch (type) {
	case KT_F32: return hd * 4;
	case KT_Q8_0: return hd / KT_QBLOCK * 34;
	case KT_Q4_0: return hd / KT_QBLOCK * 18;
	default: return hd * 2; /* f16, bf16 */
	}
}

static __device__ __forceinline__ float kt_bf16_to_f32(unsigned short h)
{
	return __uint_as_float((unsigned int)h << 16);
}

/* As the CPU's cpu_f32_to_bf16: round to nearest even, a NaN kept a NaN. */
static __device__ __forceinline__ unsigned short kt_f32_to_bf16(float f)
{
	unsigned int b = __float_as_uint(f);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (unsigned short)((b >> 16) | 0x40u);
	return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float kt_h(const char *p)
{
	return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

static __device__ __forceinline__ void kt_put_h(char *p, float f)
{
	*(unsigned short *)p = __half_as_ushort(__float2half_rn(f));
}

/* One q8_0 block of the 32 floats x at dst (kvquant.c's quantize_q8_0). */
static __device__ inline void kt_quant_q8_0(char *dst, const float *x)
{
	float amax = 0.0f;
	for (int i = 0; i < KT_QBLOCK; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
	kt_put_h(dst, d);
	for (int i = 0; i < KT_QBLOCK; i++) {
		float v = __fmul_rn(x[i], id);
		int q = v == v ? (int)roundf(v) : 0; /* NaN (a broken model) stores 0 */
		dst[2 + i] = (char)(signed char)(q > 127 ? 127 : q < -127 ? -127 : q);
	}
}

/* One q4_0 block (kvquant.c's quantize_q4_0). */
static __device__ inline void kt_quant_q4_0(char *dst, const float *x)
{
	float amax = 0.0f, max = 0.0f;
	for (int i = 0; i < KT_QBLOCK; i++)
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
	kt_put_h(dst, d);
	for (int j = 0; j < KT_QBLOCK / 2; j++) {
		float a = __fadd_rn(__fmul_rn(x[j], id), 8.5f), b = __fadd_rn(__fmul_rn(x[j + KT_QBLOCK / 2], id), 8.5f);
		int qa = a >= 0.0f ? (a < 15.0f ? (int)a : 15) : 0; /* also NaN -> 0 */
		int qb = b >= 0.0f ? (b < 15.0f ? (int)b : 15) : 0;
		dst[2 + j] = (char)(unsigned char)(qa | qb << 4);
	}
}

/* A row of n floats (n a multiple of 32 for the quantized types) stored as
 * type at dst, the work spread over the block's threads: one element per
 * thread step for the plain types, one 32-element block for the quantized
 * ones. The caller synchronizes before src changes. */
static __device__ inline void kv_store_row(int type, char *dst, const float *src, int n)
{
	switch (type) {
	case KT_F32:
		for (int i = threadIdx.x; i < n; i += blockDim.x)
			((float *)dst)[i] = src[i];
		break;
	case KT_BF16:
		for (int i = threadIdx.x; i < n; i += blockDim.x)
			((unsigned short *)dst)[i] = kt_f32_to_bf16(src[i]);
		break;
	case KT_Q8_0:
		for (int b = threadIdx.x; b < n / KT_QBLOCK; b += blockDim.x)
			kt_quant_q8_0(dst + (size_t)b * 34, src + (size_t)b * KT_QBLOCK);
		break;
	case KT_Q4_0:
		for (int b = threadIdx.x; b < n / KT_QBLOCK; b += blockDim.x)
			kt_quant_q4_0(dst + (size_t)b * 18, src + (size_t)b * KT_QBLOCK);
		break;
	default:
		for (int i = threadIdx.x; i < n; i += blockDim.x)
			((unsigned short *)dst)[i] = __half_as_ushort(__float2half_rn(src[i]));
		break;
	}
}

/* Element d of one stored head (row of hd elements) of type. */
static __device__ __forceinline__ float kv_load(int type, const char *row, int d)
{
	switch (type) {
	case KT_F32: return ((const float *)row)[d];
	case KT_BF16: return kt_bf16_to_f32(((const unsigned short *)row)[d]);
	case KT_Q8_0: {
		const char *blk = row + (size_t)(d / KT_QBLOCK) * 34;
		return kt_h(blk) * (float)(signed char)blk[2 + d % KT_QBLOCK];
	}
	case KT_Q4_0: {
		const char *blk = row + (size_t)(d / KT_QBLOCK) * 18;
		int j = d % KT_QBLOCK;
		unsigned char b = (unsigned char)blk[2 + j % (KT_QBLOCK / 2)];
		return kt_h(blk) * (float)((j < KT_QBLOCK / 2 ? b & 15 : b >> 4) - 8);
	}
	default: return __half2float(__ushort_as_half(((const unsigned short *)row)[d]));
	}
}

/* dot(q, one stored head of hd elements): the quantized types per block,
 * the 32 products summed, then scaled once. */
static __device__ __forceinline__ float kv_dot(int type, const float *q, const char *row, int hd)
{
	float dot = 0.0f;
	switch (type) {
	case KT_F16:
		for (int d = 0; d < hd; d++)
			dot += q[d] * __half2float(__ushort_as_half(((const unsigned short *)row)[d]));
		break;
	case KT_Q8_0:
		for (int b = 0; b < hd / KT_QBLOCK; b++) {
			const char *blk = row + (size_t)b * 34;
			const float *qb = q + b * KT_QBLOCK;
			float s = 0.0f;
			for (int j = 0; j < KT_QBLOCK; j++)
				s += qb[j] * (float)(signed char)blk[2 + j];
			dot += kt_h(blk) * s;
		}
		break;
	case KT_Q4_0:
		for (int b = 0; b < hd / KT_QBLOCK; b++) {
			const char *blk = row + (size_t)b * 18;
			const float *qb = q + b * KT_QBLOCK;
			float s = 0.0f;
			for (int j = 0; j < KT_QBLOCK / 2; j++) {
				unsigned char v = (unsigned char)blk[2 + j];
				s += qb[j] * (float)((v & 15) - 8) + qb[j + KT_QBLOCK / 2] * (float)((v >> 4) - 8);
			}
			dot += kt_h(blk) * s;
		}
		break;
	default:
		for (int d = 0; d < hd; d++)
			dot += q[d] * kv_load(type, row, d);
		break;
	}
	return dot;
}

#endif
