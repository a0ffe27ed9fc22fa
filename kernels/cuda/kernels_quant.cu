/*
 * kernels/cuda/kernels_quant.cu — the CUDA plug-in's kernels that read
 * weights in their stored types: dequantization to fp16 (every matrix at
 * load, for the cuBLAS GEMMs of prefill), the embedding lookup, and the
 * dequantizing GEMV of decode steps, which reads the blocks in place.
 *
 * Block formats (ggml's, as in kernels/cpu/ops.c); element j of a 32-element
 * block, q its integer quant:
 *   q4_0 (18 bytes): f16 d, 16 bytes qs; q = j < 16 ? qs[j] & 15 : qs[j-16] >> 4;
 *                    x = (q - 8) * d
 *   q4_1 (20 bytes): f16 d, f16 m, 16 bytes qs; x = q * d + m
 *   q5_0 (22 bytes): f16 d, 4 bytes qh, 16 bytes qs; q = the q4 nibble |
 *                    bit j of qh (little-endian) << 4; x = (q - 16) * d
 *   q5_1 (24 bytes): f16 d, f16 m, qh, qs; x = q * d + m
 *   q8_0 (34 bytes): f16 d, 32 int8 q; x = q * d
 * and the K-quants, super-blocks of 256 elements (layouts in
 * kernels/cpu/ops.c):
 *   q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins of
 *                     eight sub-blocks of 32, 128 bytes of nibbles (sub-blocks
 *                     2i, 2i+1 the low and high nibbles of bytes 32i..32i+31);
 *                     x = d * sc * q - dmin * m
 *   q5_K (176 bytes): as q4_K with 32 bytes qh before the nibbles, bit j of
 *                     qh[l] the fifth bit of element l of sub-block j
 *   q6_K (210 bytes): 128 bytes ql, 64 bytes qh, 16 int8 scales (sub-blocks
 *                     of 16), f16 d; x = d * sc * (q - 32)
 * A 32-element block of a K-quant row (what the GEMV and the row reader
 * address) is one sub-block of q4_K/q5_K or two of q6_K.
 */
#include "cuda_impl.h"

static __device__ __forceinline__ float ld_f16(const uint8_t *p)
{
	/* every f16 in a row or block sits at an even offset */
	return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

static __device__ __forceinline__ uint32_t ld_u32_bytes(const uint8_t *p)
{
	/* qh of q5_0/q5_1 sits at offset 2 or 4 of a block of 22 or 24 bytes:
	 * not aligned, read byte by byte */
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Sub-block j's 6-bit scale and min of a q4_K/q5_K super-block. */
static __device__ __forceinline__ void kq_scale_min(const uint8_t *q, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

/*
 * The 32 elements of block b (elements 32b .. 32b+31) of a stored row, as
 * floats: the one place the plug-in reads the block formats; the row
 * reader, the dequantization and the GEMV go through it.
 */
static __device__ void block_dequant(const uint8_t *row, int type, int64_t b, float *w)
{
	switch (type) {
	case WT_F32:
		for (int j = 0; j < 32; j++)
			w[j] = ((const float *)row)[b * 32 + j];
		break;
	case WT_F16:
		for (int j = 0; j < 32; j++)
			w[j] = __half2float(__ushort_as_half(((const unsigned short *)row)[b * 32 + j]));
		break;
	case WT_BF16:
		for (int j = 0; j < 32; j++)
			w[j] = __uint_as_float((unsigned int)((const unsigned short *)row)[b * 32 + j] << 16);
		break;
	case WT_Q4_0: {
		const uint8_t *blk = row + b * 18;
		float d = ld_f16(blk);
		for (int j = 0; j < 16; j++) {
			w[j] = (float)((blk[2 + j] & 15) - 8) * d;
			w[j + 16] = (float)((blk[2 + j] >> 4) - 8) * d;
		}
		break;
	}
	case WT_Q4_1: {
		const uint8_t *blk = row + b * 20;
		float d = ld_f16(blk), m = ld_f16(blk + 2);
		for (int j = 0; j < 16; j++) {
			w[j] = (float)(blk[4 + j] & 15) * d + m;
			w[j + 16] = (float)(blk[4 + j] >> 4) * d + m;
		}
		break;
	}
	case WT_Q5_0:
	case WT_Q5_1: {
		int one = type == WT_Q5_1;
		const uint8_t *blk = row + b * (one ? 24 : 22);
		float d = ld_f16(blk), m = one ? ld_f16(blk + 2) : -16.0f * d;
		uint32_t qh = ld_u32_bytes(blk + (one ? 4 : 2));
		const uint8_t *qs = blk + (one ? 8 : 6);
		for (int j = 0; j < 16; j++) {
			int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
			int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
			w[j] = (float)lo * d + m;
			w[j + 16] = (float)hi * d + m;
		}
		break;
	}
	case WT_Q8_0: {
		const uint8_t *blk = row + b * 34;
		float d = ld_f16(blk);
		for (int j = 0; j < 32; j++)
			w[j] = (float)(int8_t)blk[2 + j] * d;
		break;
	}
	case WT_Q4_K:
	case WT_Q5_K: {
		int five = type == WT_Q5_K;
		const uint8_t *blk = row + (b / 8) * (five ? 176 : 144);
		int j = (int)(b % 8), sc, mn;
		kq_scale_min(blk + 4, j, &sc, &mn);
		float d = ld_f16(blk) * (float)sc, m = ld_f16(blk + 2) * (float)mn;
		const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16) + 32 * (j / 2);
		int shift = (j & 1) * 4;
		for (int l = 0; l < 32; l++) {
			int q = (qs[l] >> shift) & 15;
			if (five)
				q |= ((qh[l] >> j) & 1) << 4;
			w[l] = d * (float)q - m;
		}
		break;
	}
	case WT_Q6_K: {
		const uint8_t *blk = row + (b / 8) * 210;
		int i = (int)(b % 8), h = i / 4, quarter = i % 4;
		const uint8_t *ql = blk + 64 * h + (quarter & 1) * 32, *qh = blk + 128 + 32 * h;
		const int8_t *scales = (const int8_t *)(blk + 192);
		float d = ld_f16(blk + 208);
		int shift_l = (quarter / 2) * 4, shift_h = quarter * 2;
		for (int l = 0; l < 32; l++) {
			int q = ((ql[l] >> shift_l) & 15) | ((qh[l] >> shift_h) & 3) << 4;
			/* 16-element sub-block 2i + l / 16 of the super-block */
			w[l] = d * (float)scales[2 * i + l / 16] * (float)(q - 32);
		}
		break;
	}
	default:
		for (int j = 0; j < 32; j++)
			w[j] = 0.0f;
	}
}

/* Element c of a stored row. */
static __device__ float row_elem(const uint8_t *row, int type, int64_t c)
{
	float w[32];
	switch (type) {
	case WT_F32: return ((const float *)row)[c];
	case WT_F16: return __half2float(__ushort_as_half(((const unsigned short *)row)[c]));
	case WT_BF16: return __uint_as_float((unsigned int)((const unsigned short *)row)[c] << 16);
	}
	block_dequant(row, type, c / 32, w);
	return w[c % 32];
}

/* ---- dequantization and embedding --------------------------------------- */

/* One thread per 32-element block: dst row r, elements 32b .. 32b+31. */
static __global__ void k_dequant_f16(const uint8_t *src, int type, int64_t rows, int64_t cols, size_t row_bytes,
				     __half *dst)
{
	int64_t nb = cols / 32, n = rows * nb;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / nb, b = i % nb;
		float w[32];
		block_dequant(src + r * row_bytes, type, b, w);
		for (int j = 0; j < 32; j++)
			dst[r * cols + b * 32 + j] = __float2half_rn(w[j]);
	}
}

/* Float rows of any width, element by element. */
static __global__ void k_dequant_f16_elems(const uint8_t *src, int type, int64_t rows, int64_t cols,
					   size_t row_bytes, __half *dst)
{
	int64_t n = rows * cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / cols, c = i % cols;
		dst[i] = __float2half_rn(row_elem(src + r * row_bytes, type, c));
	}
}

cudaError_t cu_dequant_f16(const void *src, int type, int64_t rows, int64_t cols, size_t row_bytes, __half *dst,
			   cudaStream_t s)
{
	int by_block = cols % 32 == 0;
	int64_t n = rows * (by_block ? cols / 32 : cols);
	int64_t blocks = (n + 255) / 256;
	if (blocks > 65536)
		blocks = 65536;
	if (n <= 0)
		return cudaSuccess;
	if (by_block)
		k_dequant_f16<<<(unsigned)blocks, 256, 0, s>>>((const uint8_t *)src, type, rows, cols, row_bytes, dst);
	else
		k_dequant_f16_elems<<<(unsigned)blocks, 256, 0, s>>>((const uint8_t *)src, type, rows, cols, row_bytes,
								      dst);
	return cudaGetLastError();
}

static __global__ void k_embed(const uint8_t *table, int type, size_t row_bytes, const int32_t *tok, int n,
			       float scale, float *x)
{
	int t = blockIdx.x;
	const uint8_t *row = table + (size_t)tok[t] * row_bytes;
	for (int c = threadIdx.x; c < n; c += blockDim.x)
		x[(size_t)t * n + c] = row_elem(row, type, c) * scale;
}

cudaError_t cu_embed(const void *table, int type, size_t row_bytes, const int32_t *tok, int T, int n, float scale,
		     float *x, cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	k_embed<<<T, 256, 0, s>>>((const uint8_t *)table, type, row_bytes, tok, n, scale, x);
	return cudaGetLastError();
}

/* ---- dequantizing GEMV (decode) ------------------------------------------- */

#define GEMV_WARPS 4

/* One warp per weight row: lane l takes blocks l, l + 32, ...; the lanes'
 * partial sums meet in shared memory and lane 0 adds them in lane order. */
static __global__ void k_gemv(const uint8_t *W, int type, size_t row_bytes, int rows, int cols, const __half *X,
			      int ldx, int T, float *Y, int ldy, float beta)
{
	__shared__ float red[GEMV_WARPS][CU_GEMV_MAX_T][32];
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int r = blockIdx.x * GEMV_WARPS + warp;
	float acc[CU_GEMV_MAX_T];

	for (int t = 0; t < CU_GEMV_MAX_T; t++)
		acc[t] = 0.0f;
	if (r < rows) {
		const uint8_t *row = W + (size_t)r * row_bytes;
		for (int b = lane; b < cols / 32; b += 32) {
			float w[32];
			block_dequant(row, type, b, w);
			for (int t = 0; t < T; t++) {
				const __half *x = X + (size_t)t * ldx + (size_t)b * 32;
				float sum = 0.0f;
				for (int j = 0; j < 32; j++)
					sum += w[j] * __half2float(x[j]);
				acc[t] += sum;
			}
		}
	}
	for (int t = 0; t < T; t++)
		red[warp][t][lane] = acc[t];
	__syncthreads();
	if (r < rows && lane == 0) {
		for (int t = 0; t < T; t++) {
			float v = 0.0f;
			for (int l = 0; l < 32; l++)
				v += red[warp][t][l];
			float *y = Y + (size_t)t * ldy + r;
			*y = beta != 0.0f ? v + beta * *y : v;
		}
	}
}

cudaError_t cu_gemv(const void *W, int type, size_t row_bytes, int rows, int cols, const __half *X, int ldx, int T,
		    float *Y, int ldy, float beta, cudaStream_t s)
{
	if (rows <= 0 || T <= 0)
		return cudaSuccess;
	if (T > CU_GEMV_MAX_T || cols % 32)
		return cudaErrorInvalidValue;
	k_gemv<<<(rows + GEMV_WARPS - 1) / GEMV_WARPS, GEMV_WARPS * 32, 0, s>>>((const uint8_t *)W, type, row_bytes,
										rows, cols, X, ldx, T, Y, ldy, beta);
	return cudaGetLastError();
}
