/*
 * kernels/cuda/kernels_attn.cu — the CUDA plug-in's paged attention: one
 * kernel for decode (single-token items) and tiled prefill (multi-token
 * items), K/V read through the page tables in the pool's element type
 * (f16, f32, bf16, q8_0, q4_0: cuda_kv.h), online softmax, full causal or
 * sliding-window masks.
 */
#include <math.h>

#include "cuda_kv.h"

/*
 * Shared memory of one block, for R = rows_max query rows (row r = token
 * r / n_rep of the item, query head g * n_rep + r % n_rep):
 *   float q[R][hd]    the scaled query rows
 *   float acc[R][hd]  running sum of p * v
 *   float s[R][TILE]  this tile's scores, then their exponentials
 *   float m[R], l[R], corr[R]   running max, running sum, rescale factor
 *   k[TILE][kw + 1], v[TILE][kw]  32-bit words: this tile's keys and
 *                     values as stored (head g's bytes of each row, kw
 *                     words of them), dequantized as they are read
 * The float part is padded to 16 bytes. Key rows are padded by one 32-bit
 * word so that a warp reading 32 different keys at the same column hits 32
 * different banks.
 */
static __host__ __device__ size_t attn_floats(int rows, int hd)
{
	size_t nf = 2 * (size_t)rows * hd + (size_t)rows * CU_ATTN_TILE + 3 * (size_t)rows;
	return (nf + 3) & ~(size_t)3;
}

/* 32-bit words of one head's stored K (or V) elements, rounded up */
static __host__ __device__ int attn_head_words(int hd, int kv_type)
{
	return (kt_head_bytes(kv_type, hd) + 3) / 4;
}

size_t cu_attn_smem_bytes(int rows, int hd, int kv_type)
{
	return attn_floats(rows, hd) * sizeof(float) +
	       (size_t)CU_ATTN_TILE * (2 * attn_head_words(hd, kv_type) + 1) * sizeof(unsigned int);
}

static __global__ void k_attention(const float *qkv, int ld, __half *att, const struct cu_attn_item *items,
				   const int32_t *pages_all, struct cu_kv kv, int layer, int n_head, int n_head_kv,
				   int hd, int rows_max, float scale, int window)
{
	extern __shared__ float sm[];
	const struct cu_attn_item it = items[blockIdx.x];
	const int g = blockIdx.y;
	const int n_rep = n_head / n_head_kv;
	const int R = it.n_q * n_rep;
	const int qd = n_head * hd;
	const int kv_len = it.pos0 + it.n_q; /* positions 0 .. last token's own */
	const int32_t *pages = pages_all + it.page_off;
	const int tid = threadIdx.x, nth = blockDim.x;

	float *qs = sm;
	float *acc = qs + (size_t)rows_max * hd;
	float *sc = acc + (size_t)rows_max * hd;
	float *mx = sc + (size_t)rows_max * CU_ATTN_TILE;
	float *lsum = mx + rows_max;
	float *corr = lsum + rows_max;
	const int words = attn_head_words(hd, kv.type);
	const int ks = words + 1; /* key row stride in words */
	unsigned int *kt = (unsigned int *)(sm + attn_floats(rows_max, hd));
	unsigned int *vt = kt + (size_t)CU_ATTN_TILE * ks;
	/* rows of 16-bit word alignment only (q8_0, q4_0 with an odd number of
	 * blocks per head) are copied in 16-bit units */
	const int narrow = (kv.head_bytes | (int)kv.token_stride) & 3;

	for (int i = tid; i < R * hd; i += nth) {
		int r = i / hd, d = i % hd;
		int tq = it.t0 + r / n_rep, h = g * n_rep + r % n_rep;
		qs[i] = qkv[(size_t)tq * ld + (size_t)h * hd + d] * scale;
		acc[i] = 0.0f;
	}
	for (int r = tid; r < R; r += nth) {
		mx[r] = -INFINITY;
		lsum[r] = 0.0f;
	}

	/* a windowed layer: the item's first token sees pos0 - window + 1 ..,
	 * later ones less; tiles start there */
	const int lo = window > 0 && it.pos0 - window + 1 > 0 ? it.pos0 - window + 1 : 0;
	for (int p0 = lo; p0 < kv_len; p0 += CU_ATTN_TILE) {
		__syncthreads(); /* the previous tile's k, v, s are consumed */
		/* this tile's K and V bytes of head g as stored, in 32-bit
		 * words (16-bit halves of them for narrow rows); zeros past
		 * kv_len */
		const int units = narrow ? (kv.head_bytes + 1) / 2 : words;
		for (int i = tid; i < CU_ATTN_TILE * units; i += nth) {
			int pp = i / units, w = i % units;
			int p = p0 + pp;
			if (narrow) {
				unsigned short kw = 0, vw = 0;
				if (p < kv_len) {
					const char *kr = kv_row(kv, pages, layer, p) + (size_t)g * kv.head_bytes;
					kw = ((const unsigned short *)kr)[w];
					vw = ((const unsigned short *)(kr + kv.v_offset))[w];
				}
				((unsigned short *)(kt + (size_t)pp * ks))[w] = kw;
				((unsigned short *)(vt + (size_t)pp * words))[w] = vw;
				continue;
			}
			unsigned int kw = 0, vw = 0;
			if (p < kv_len) {
				const char *kr = kv_row(kv, pages, layer, p) + (size_t)g * kv.head_bytes;
				kw = ((const unsigned int *)kr)[w];
				vw = ((const unsigned int *)(kr + kv.v_offset))[w];
			}
			kt[(size_t)pp * ks + w] = kw;
			vt[(size_t)pp * words + w] = vw;
		}
		__syncthreads();
		/* scores, -inf where masked (past the row's own position, or
		 * window or more positions before it) */
		for (int i = tid; i < R * CU_ATTN_TILE; i += nth) {
			int r = i / CU_ATTN_TILE, pp = i % CU_ATTN_TILE;
			int p = p0 + pp;
			float v = -INFINITY;
			int pr = it.pos0 + r / n_rep;
			if (p <= pr && (window <= 0 || p > pr - window)) {
				v = kv_dot(kv.type, qs + (size_t)r * hd, (const char *)(kt + (size_t)pp * ks), hd);
			}
			sc[(size_t)r * CU_ATTN_TILE + pp] = v;
		}
		__syncthreads();
		/* online softmax: new running max, rescale of what came before,
		 * and the tile's weights */
		for (int r = tid; r < R; r += nth) {
			float *sr = sc + (size_t)r * CU_ATTN_TILE;
			float m_old = mx[r], m_new = m_old;
			for (int pp = 0; pp < CU_ATTN_TILE; pp++)
				m_new = fmaxf(m_new, sr[pp]);
			float c = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
			float sum = 0.0f;
			for (int pp = 0; pp < CU_ATTN_TILE; pp++) {
				float e = sr[pp] == -INFINITY ? 0.0f : expf(sr[pp] - m_new);
				sr[pp] = e;
				sum += e;
			}
			mx[r] = m_new;
			lsum[r] = lsum[r] * c + sum;
			corr[r] = c;
		}
		__syncthreads();
		for (int i = tid; i < R * hd; i += nth) {
			int r = i / hd, d = i % hd;
			const float *sr = sc + (size_t)r * CU_ATTN_TILE;
			float a = acc[i] * corr[r];
			if (kv.type == KT_F16) { /* the default cache: no per-element type switch */
				const __half *vh = (const __half *)vt;
				for (int pp = 0; pp < CU_ATTN_TILE; pp++)
					a += sr[pp] * __half2float(vh[(size_t)pp * 2 * words + d]);
			} else {
				for (int pp = 0; pp < CU_ATTN_TILE; pp++)
					a += sr[pp] * kv_load(kv.type, (const char *)(vt + (size_t)pp * words), d);
			}
			acc[i] = a;
		}
	}
	__syncthreads();
	for (int i = tid; i < R * hd; i += nth) {
		int r = i / hd, d = i % hd;
		int tq = it.t0 + r / n_rep, h = g * n_rep + r % n_rep;
		att[(size_t)tq * qd + (size_t)h * hd + d] = __float2half_rn(acc[i] / lsum[r]);
	}
}

cudaError_t cu_attn_set_smem(size_t bytes)
{
	return cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

cudaError_t cu_attention(const float *qkv, int ld, __half *att, const struct cu_attn_item *items, int n_items,
			 const int32_t *pages, struct cu_kv kv, int layer, int n_head, int n_head_kv, int hd,
			 int rows_max, float scale, int window, cudaStream_t s)
{
	if (n_items <= 0)
		return cudaSuccess;
	dim3 grid((unsigned)n_items, (unsigned)n_head_kv);
	k_attention<<<grid, CU_ATTN_THREADS, cu_attn_smem_bytes(rows_max, hd, kv.type), s>>>(qkv, ld, att, items, pages, kv,
										     layer, n_head, n_head_kv, hd,
										     rows_max, scale, window);
	return cudaGetLastError();
}

