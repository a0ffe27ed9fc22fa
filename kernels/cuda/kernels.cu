/*
 * kernels/cuda/kernels.cu — the device kernels of kvd's CUDA backend:
 * weight dequantization, embedding lookup, RMSNorm, RoPE with K/V stores
 * into pages, paged attention (decode and tiled prefill in one kernel),
 * SwiGLU, and page gather/scatter for swap.
 *
 * The kernels favour plain, checkable indexing over speed: one block per
 * row (or per attention item and KV head), threads striding over the
 * row's elements. Matrix products are not here: the backend runs them
 * through cuBLAS on fp16 weights.
 *
 * Weight block formats (ggml's, as in kernels/cpu/ops.c), 32 elements a
 * block, element j of a block:
 *   q4_0 (18 bytes): f16 d, 16 bytes qs; q = j < 16 ? qs[j] & 15 : qs[j-16] >> 4;
 *                    x = (q - 8) * d
 *   q4_1 (20 bytes): f16 d, f16 m, 16 bytes qs; x = q * d + m
 *   q8_0 (34 bytes): f16 d, 32 int8 q; x = q * d
 */
#include <math.h>

#include "cuda_impl.h"

/* enum kvd_wtype values (kernels/backend.h). */
#define WT_F32 0
#define WT_F16 1
#define WT_Q4_0 2
#define WT_Q4_1 3
#define WT_Q8_0 8
#define WT_BF16 30

static __device__ __forceinline__ float ld_f16(const uint8_t *p)
{
	/* every f16 in a row or block sits at an even offset */
	return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

/* Element c of a stored row. */
static __device__ float row_elem(const uint8_t *row, int type, int64_t c)
{
	int64_t b = c / 32;
	int j = (int)(c % 32);

	switch (type) {
	case WT_F32:
		return ((const float *)row)[c];
	case WT_F16:
		return __half2float(__ushort_as_half(((const unsigned short *)row)[c]));
	case WT_BF16:
		return __uint_as_float((unsigned int)((const unsigned short *)row)[c] << 16);
	case WT_Q4_0: {
		const uint8_t *blk = row + b * 18;
		int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
		return (float)(q - 8) * ld_f16(blk);
	}
	case WT_Q4_1: {
		const uint8_t *blk = row + b * 20;
		int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
		return (float)q * ld_f16(blk) + ld_f16(blk + 2);
	}
	case WT_Q8_0: {
		const uint8_t *blk = row + b * 34;
		return (float)(int8_t)blk[2 + j] * ld_f16(blk);
	}
	}
	return 0.0f;
}

static inline cudaError_t launched(void)
{
	return cudaGetLastError();
}

/* ---- dequantization and embedding --------------------------------------- */

static __global__ void k_dequant_f16(const uint8_t *src, int type, int64_t rows, int64_t cols, size_t row_bytes,
				     __half *dst)
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
	int64_t n = rows * cols;
	int64_t blocks = (n + 255) / 256;
	if (blocks > 65536)
		blocks = 65536;
	if (n <= 0)
		return cudaSuccess;
	k_dequant_f16<<<(unsigned)blocks, 256, 0, s>>>((const uint8_t *)src, type, rows, cols, row_bytes, dst);
	return launched();
}

static __global__ void k_embed(const uint8_t *table, int type, size_t row_bytes, const int32_t *tok, int n,
			       float *x)
{
	int t = blockIdx.x;
	const uint8_t *row = table + (size_t)tok[t] * row_bytes;
	for (int c = threadIdx.x; c < n; c += blockDim.x)
		x[(size_t)t * n + c] = row_elem(row, type, c);
}

cudaError_t cu_embed(const void *table, int type, size_t row_bytes, const int32_t *tok, int T, int n, float *x,
		     cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	k_embed<<<T, 256, 0, s>>>((const uint8_t *)table, type, row_bytes, tok, n, x);
	return launched();
}

/* ---- RMSNorm --------------------------------------------------------------- */

#define NORM_THREADS 256

static __global__ void k_rmsnorm(const float *x, const int32_t *idx, int n, const float *g, float eps, __half *out)
{
	__shared__ double part[NORM_THREADS];
	int row = blockIdx.x;
	const float *xr = x + (size_t)(idx ? idx[row] : row) * n;
	double ss = 0;

	for (int c = threadIdx.x; c < n; c += blockDim.x)
		ss += (double)xr[c] * xr[c];
	part[threadIdx.x] = ss;
	__syncthreads();
	for (int w = NORM_THREADS / 2; w > 0; w /= 2) {
		if ((int)threadIdx.x < w)
			part[threadIdx.x] += part[threadIdx.x + w];
		__syncthreads();
	}
	float scale = (float)(1.0 / sqrt(part[0] / (double)n + (double)eps));
	for (int c = threadIdx.x; c < n; c += blockDim.x)
		out[(size_t)row * n + c] = __float2half_rn(xr[c] * scale * g[c]);
}

cudaError_t cu_rmsnorm(const float *x, const int32_t *idx, int n_rows, int n, const float *g, float eps, __half *out,
		       cudaStream_t s)
{
	if (n_rows <= 0)
		return cudaSuccess;
	k_rmsnorm<<<n_rows, NORM_THREADS, 0, s>>>(x, idx, n, g, eps, out);
	return launched();
}

/* ---- RoPE and K/V stores -------------------------------------------------- */

static __global__ void k_rope_table(const int32_t *pos, int hd, float base, float *tab)
{
	int t = blockIdx.x;
	for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) {
		double th = (double)pos[t] * pow((double)base, -2.0 * i / hd);
		tab[(size_t)t * hd + 2 * i] = (float)cos(th);
		tab[(size_t)t * hd + 2 * i + 1] = (float)sin(th);
	}
}

cudaError_t cu_rope_table(const int32_t *pos, int T, int hd, float base, float *tab, cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	k_rope_table<<<T, 64, 0, s>>>(pos, hd, base, tab);
	return launched();
}

/* The address of token `pos`'s K row for `layer` in the page table at
 * pages (V is v_offset further). */
static __device__ __forceinline__ char *kv_row(const struct cu_kv &kv, const int32_t *pages, int layer, int pos)
{
	int64_t page = pages[pos / kv.block_size];
	return kv.base + page * kv.page_bytes + (int64_t)layer * kv.layer_stride +
	       (int64_t)(pos % kv.block_size) * kv.token_stride;
}

static __global__ void k_rope_store(float *qkv, int ld, const float *tab, const int32_t *tok_pos,
				    const int32_t *tok_pageoff, const int32_t *pages, struct cu_kv kv, int layer,
				    int n_head, int n_head_kv, int hd, int neox)
{
	int t = blockIdx.x;
	int half_hd = hd / 2;
	int nq_pairs = n_head * half_hd, nk_pairs = n_head_kv * half_hd;
	float *q = qkv + (size_t)t * ld;
	float *k = q + (size_t)n_head * hd;
	const float *v = k + (size_t)n_head_kv * hd;
	const float *cs = tab + (size_t)t * hd;
	__half *kd = (__half *)kv_row(kv, pages + tok_pageoff[t], layer, tok_pos[t]);
	__half *vd = (__half *)((char *)kd + kv.v_offset);

	for (int i = threadIdx.x; i < nq_pairs + nk_pairs; i += blockDim.x) {
		int is_k = i >= nq_pairs;
		int j = is_k ? i - nq_pairs : i;
		int h = j / half_hd, pi = j % half_hd;
		int a = h * hd + (neox ? pi : 2 * pi);
		int b = h * hd + (neox ? pi + half_hd : 2 * pi + 1);
		float c = cs[2 * pi], sn = cs[2 * pi + 1];
		float *vec = is_k ? k : q;
		float x0 = vec[a], x1 = vec[b];
		float y0 = x0 * c - x1 * sn, y1 = x0 * sn + x1 * c;
		if (is_k) {
			kd[a] = __float2half_rn(y0);
			kd[b] = __float2half_rn(y1);
		} else {
			vec[a] = y0;
			vec[b] = y1;
		}
	}
	for (int i = threadIdx.x; i < n_head_kv * hd; i += blockDim.x)
		vd[i] = __float2half_rn(v[i]);
}

cudaError_t cu_rope_store(float *qkv, int ld, const float *tab, const int32_t *tok_pos, const int32_t *tok_pageoff,
			  const int32_t *pages, struct cu_kv kv, int layer, int n_head, int n_head_kv, int hd, int neox,
			  int T, cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	k_rope_store<<<T, 128, 0, s>>>(qkv, ld, tab, tok_pos, tok_pageoff, pages, kv, layer, n_head, n_head_kv, hd,
				       neox);
	return launched();
}

/* ---- paged attention ------------------------------------------------------- */

/*
 * Shared memory of one block, for R = rows_max query rows (row r = token
 * r / n_rep of the item, query head g * n_rep + r % n_rep):
 *   float q[R][hd]    the scaled query rows
 *   float acc[R][hd]  running sum of p * v
 *   float s[R][TILE]  this tile's scores, then their exponentials
 *   float m[R], l[R], corr[R]   running max, running sum, rescale factor
 *   half  k[TILE][hd + 2], v[TILE][hd]   this tile's keys and values
 * The float part is padded to 16 bytes. Key rows are padded by one 32-bit
 * word so that a warp reading 32 different keys at the same column hits 32
 * different banks.
 */
static __host__ __device__ size_t attn_floats(int rows, int hd)
{
	size_t nf = 2 * (size_t)rows * hd + (size_t)rows * CU_ATTN_TILE + 3 * (size_t)rows;
	return (nf + 3) & ~(size_t)3;
}

size_t cu_attn_smem_bytes(int rows, int hd)
{
	return attn_floats(rows, hd) * sizeof(float) + (size_t)CU_ATTN_TILE * (2 * hd + 2) * sizeof(__half);
}

static __global__ void k_attention(const float *qkv, int ld, __half *att, const struct cu_attn_item *items,
				   const int32_t *pages_all, struct cu_kv kv, int layer, int n_head, int n_head_kv,
				   int hd, int rows_max)
{
	extern __shared__ float sm[];
	const struct cu_attn_item it = items[blockIdx.x];
	const int g = blockIdx.y;
	const int n_rep = n_head / n_head_kv;
	const int R = it.n_q * n_rep;
	const int qd = n_head * hd;
	const int kv_len = it.pos0 + it.n_q; /* positions 0 .. last token's own */
	const int32_t *pages = pages_all + it.page_off;
	const float scale = 1.0f / sqrtf((float)hd);
	const int tid = threadIdx.x, nth = blockDim.x;

	float *qs = sm;
	float *acc = qs + (size_t)rows_max * hd;
	float *sc = acc + (size_t)rows_max * hd;
	float *mx = sc + (size_t)rows_max * CU_ATTN_TILE;
	float *lsum = mx + rows_max;
	float *corr = lsum + rows_max;
	__half *kt = (__half *)(sm + attn_floats(rows_max, hd));
	const int ks = hd + 2; /* key row stride in halves */
	__half *vt = kt + (size_t)CU_ATTN_TILE * ks;

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

	for (int p0 = 0; p0 < kv_len; p0 += CU_ATTN_TILE) {
		__syncthreads(); /* the previous tile's k, v, s are consumed */
		/* this tile's K and V rows of head g, in 32-bit words (hd is
		 * even, rows start at even half offsets); zeros past kv_len */
		int words = hd / 2;
		for (int i = tid; i < CU_ATTN_TILE * words; i += nth) {
			int pp = i / words, w = i % words;
			int p = p0 + pp;
			unsigned int kw = 0, vw = 0;
			if (p < kv_len) {
				const char *kr = kv_row(kv, pages, layer, p) + (size_t)g * hd * sizeof(__half);
				kw = ((const unsigned int *)kr)[w];
				vw = ((const unsigned int *)(kr + kv.v_offset))[w];
			}
			((unsigned int *)kt)[(size_t)pp * (words + 1) + w] = kw;
			((unsigned int *)vt)[(size_t)pp * words + w] = vw;
		}
		__syncthreads();
		/* scores, -inf where masked (past the row's own position) */
		for (int i = tid; i < R * CU_ATTN_TILE; i += nth) {
			int r = i / CU_ATTN_TILE, pp = i % CU_ATTN_TILE;
			int p = p0 + pp;
			float v = -INFINITY;
			if (p <= it.pos0 + r / n_rep) {
				const float *qr = qs + (size_t)r * hd;
				const __half *kr = kt + (size_t)pp * ks;
				float dot = 0.0f;
				for (int d = 0; d < hd; d++)
					dot += qr[d] * __half2float(kr[d]);
				v = dot;
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
			for (int pp = 0; pp < CU_ATTN_TILE; pp++)
				a += sr[pp] * __half2float(vt[(size_t)pp * hd + d]);
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
			 int rows_max, cudaStream_t s)
{
	if (n_items <= 0)
		return cudaSuccess;
	dim3 grid((unsigned)n_items, (unsigned)n_head_kv);
	k_attention<<<grid, CU_ATTN_THREADS, cu_attn_smem_bytes(rows_max, hd), s>>>(qkv, ld, att, items, pages, kv,
										     layer, n_head, n_head_kv, hd,
										     rows_max);
	return launched();
}

/* ---- SwiGLU ------------------------------------------------------------------ */

static __global__ void k_swiglu(const float *gu, int n_ff, __half *h)
{
	int t = blockIdx.x;
	const float *gr = gu + (size_t)t * 2 * n_ff, *ur = gr + n_ff;
	for (int i = threadIdx.x; i < n_ff; i += blockDim.x) {
		float gv = gr[i];
		h[(size_t)t * n_ff + i] = __float2half_rn(gv / (1.0f + expf(-gv)) * ur[i]);
	}
}

cudaError_t cu_swiglu(const float *gu, int T, int n_ff, __half *h, cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	k_swiglu<<<T, 256, 0, s>>>(gu, n_ff, h);
	return launched();
}

/* ---- dequantizing GEMV (decode) ------------------------------------------- */

#define GEMV_WARPS 4

/* The 32 elements of block b of a stored row, as floats. */
static __device__ void block_dequant(const uint8_t *row, int type, int b, float *w)
{
	switch (type) {
	case WT_Q4_0: {
		const uint8_t *blk = row + (size_t)b * 18;
		float d = ld_f16(blk);
		for (int j = 0; j < 16; j++) {
			w[j] = (float)((blk[2 + j] & 15) - 8) * d;
			w[j + 16] = (float)((blk[2 + j] >> 4) - 8) * d;
		}
		break;
	}
	case WT_Q4_1: {
		const uint8_t *blk = row + (size_t)b * 20;
		float d = ld_f16(blk), m = ld_f16(blk + 2);
		for (int j = 0; j < 16; j++) {
			w[j] = (float)(blk[4 + j] & 15) * d + m;
			w[j + 16] = (float)(blk[4 + j] >> 4) * d + m;
		}
		break;
	}
	case WT_Q8_0: {
		const uint8_t *blk = row + (size_t)b * 34;
		float d = ld_f16(blk);
		for (int j = 0; j < 32; j++)
			w[j] = (float)(int8_t)blk[2 + j] * d;
		break;
	}
	default:
		for (int j = 0; j < 32; j++)
			w[j] = row_elem(row, type, (int64_t)b * 32 + j);
	}
}

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
	return launched();
}

/* ---- page gather / scatter ------------------------------------------------ */

/* Page bytes are a multiple of 4 (rows of kv_dim halves, an even count of
 * them per layer), so pages move as 32-bit words; grid.y walks the pages. */
static __global__ void k_pages_move(char *pool, size_t page_bytes, const uint32_t *pages, char *flat, int to_flat)
{
	size_t words = page_bytes / 4;
	unsigned int *pg = (unsigned int *)(pool + (size_t)pages[blockIdx.y] * page_bytes);
	unsigned int *fl = (unsigned int *)(flat + (size_t)blockIdx.y * page_bytes);
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) {
		if (to_flat)
			fl[i] = pg[i];
		else
			pg[i] = fl[i];
	}
}

static cudaError_t pages_move(char *pool, size_t page_bytes, const uint32_t *pages, int n, char *flat, int to_flat,
			      cudaStream_t s)
{
	size_t words = page_bytes / 4;
	size_t bx = (words + 255) / 256;
	if (n <= 0)
		return cudaSuccess;
	if (bx > 1024)
		bx = 1024;
	dim3 grid((unsigned)bx, (unsigned)n);
	k_pages_move<<<grid, 256, 0, s>>>(pool, page_bytes, pages, flat, to_flat);
	return launched();
}

cudaError_t cu_pages_gather(const char *pool, size_t page_bytes, const uint32_t *pages, int n, char *dst,
			    cudaStream_t s)
{
	return pages_move((char *)pool, page_bytes, pages, n, dst, 1, s);
}

cudaError_t cu_pages_scatter(char *pool, size_t page_bytes, const uint32_t *pages, int n, const char *src,
			     cudaStream_t s)
{
	return pages_move(pool, page_bytes, pages, n, (char *)src, 0, s);
}
