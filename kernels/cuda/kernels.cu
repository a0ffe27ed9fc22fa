/*
 * kernels/cuda/kernels.cu — the device kernels of kvd's CUDA backend that
 * work on activations: RMSNorm (of rows, of each head of Q and K, and of
 * a sublayer's output added to the residual), biases, RoPE tables and RoPE
 * with K/V stores into pages (in the pool's element type, cuda_kv.h), the
 * re-rotation of cached keys (kv_shift), the gated activations (SwiGLU,
 * GeGLU), and page gather/scatter for swap. Weights are read in kernels_quant.cu,
 * attention is kernels_attn.cu.
 *
 * The kernels favour plain, checkable indexing over speed: one block per
 * row (or per row and head), threads striding over the row's elements.
 * Matrix products are not here: the backend runs them through cuBLAS on
 * fp16 weights, or the dequantizing GEMV.
 */
#include <math.h>

#include "cuda_kv.h"

static inline cudaError_t launched(void)
{
	return cudaGetLastError();
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


/* x[t][:] += rmsnorm(y[t][:]) * g: a sublayer's output, normalised, into
 * the residual (post-attention / post-FFN norms). */
static __global__ void k_rmsnorm_add(float *x, const float *y, int n, const float *g, float eps)
{
	__shared__ double part[NORM_THREADS];
	int row = blockIdx.x;
	const float *yr = y + (size_t)row * n;
	float *xr = x + (size_t)row * n;
	double ss = 0;

	for (int c = threadIdx.x; c < n; c += blockDim.x)
		ss += (double)yr[c] * yr[c];
	part[threadIdx.x] = ss;
	__syncthreads();
	for (int w = NORM_THREADS / 2; w > 0; w /= 2) {
		if ((int)threadIdx.x < w)
			part[threadIdx.x] += part[threadIdx.x + w];
		__syncthreads();
	}
	float scale = (float)(1.0 / sqrt(part[0] / (double)n + (double)eps));
	for (int c = threadIdx.x; c < n; c += blockDim.x)
		xr[c] += yr[c] * scale * g[c];
}

cudaError_t cu_rmsnorm_add(float *x, const float *y, int n_rows, int n, const float *g, float eps, cudaStream_t s)
{
	if (n_rows <= 0)
		return cudaSuccess;
	k_rmsnorm_add<<<n_rows, NORM_THREADS, 0, s>>>(x, y, n, g, eps);
	return launched();
}

/* ---- biases and per-head Q/K norms ------------------------------------------ */

static __global__ void k_add_bias(float *qkv, int ld, int q_dim, int kv_dim, const float *bq, const float *bk,
				   const float *bv)
{
	float *row = qkv + (size_t)blockIdx.x * ld;
	for (int i = threadIdx.x; i < q_dim + 2 * kv_dim; i += blockDim.x) {
		const float *b = i < q_dim ? bq : i < q_dim + kv_dim ? bk : bv;
		int j = i < q_dim ? i : i < q_dim + kv_dim ? i - q_dim : i - q_dim - kv_dim;
		if (b)
			row[i] += b[j];
	}
}

cudaError_t cu_add_bias(float *qkv, int ld, int T, int q_dim, int kv_dim, const float *bq, const float *bk,
			const float *bv, cudaStream_t s)
{
	if (T <= 0 || (!bq && !bk && !bv))
		return cudaSuccess;
	k_add_bias<<<T, 256, 0, s>>>(qkv, ld, q_dim, kv_dim, bq, bk, bv);
	return launched();
}

#define HEAD_NORM_THREADS 64

/* Block (t, h): head h of row t, Q heads first, then K heads, normalised
 * in place with q_norm or k_norm (head_dim weights). */
static __global__ void k_head_norm(float *qkv, int ld, int n_head, int hd, const float *q_norm, const float *k_norm,
				   float eps)
{
	__shared__ double part[HEAD_NORM_THREADS];
	int h = blockIdx.y;
	float *v = qkv + (size_t)blockIdx.x * ld + (size_t)h * hd;
	const float *g = h < n_head ? q_norm : k_norm;
	double ss = 0;

	if (!g) /* the whole block: no barrier is left waiting */
		return;

	for (int i = threadIdx.x; i < hd; i += blockDim.x)
		ss += (double)v[i] * v[i];
	part[threadIdx.x] = ss;
	__syncthreads();
	for (int w = HEAD_NORM_THREADS / 2; w > 0; w /= 2) {
		if ((int)threadIdx.x < w)
			part[threadIdx.x] += part[threadIdx.x + w];
		__syncthreads();
	}
	float scale = (float)(1.0 / sqrt(part[0] / (double)hd + (double)eps));
	for (int i = threadIdx.x; i < hd; i += blockDim.x)
		v[i] = v[i] * scale * g[i];
}

cudaError_t cu_head_norm(float *qkv, int ld, int T, int n_head, int n_head_kv, int hd, const float *q_norm,
			 const float *k_norm, float eps, cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	dim3 grid((unsigned)T, (unsigned)(n_head + n_head_kv));
	k_head_norm<<<grid, HEAD_NORM_THREADS, 0, s>>>(qkv, ld, n_head, hd, q_norm, k_norm, eps);
	return launched();
}

/* ---- RoPE and K/V stores -------------------------------------------------- */

/* As kernels/cpu's cpu_rope_table: the angle in double, pos * pos_scale *
 * base^(-2i/hd) / freqs[i]. */
static __global__ void k_rope_table(const int32_t *pos, int hd, float base, float pos_scale, const float *freqs,
				    float *tab)
{
	int t = blockIdx.x;
	for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) {
		double th = (double)pos[t] * pos_scale * pow((double)base, -2.0 * i / hd);
		if (freqs)
			th /= freqs[i];
		tab[(size_t)t * hd + 2 * i] = (float)cos(th);
		tab[(size_t)t * hd + 2 * i + 1] = (float)sin(th);
	}
}

cudaError_t cu_rope_table(const int32_t *pos, int T, int hd, float base, float pos_scale, const float *freqs,
			  float *tab, cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	k_rope_table<<<T, 64, 0, s>>>(pos, hd, base, pos_scale, freqs, tab);
	return launched();
}

/* Block t: RoPE on token t's Q and K heads in place in qkv, then its K and
 * V rows stored in the pool's element type (after a barrier: a quantized
 * block is stored by one thread from 32 rotated elements). */
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
	char *kd = kv_row(kv, pages + tok_pageoff[t], layer, tok_pos[t]);

	for (int i = threadIdx.x; i < nq_pairs + nk_pairs; i += blockDim.x) {
		int is_k = i >= nq_pairs;
		int j = is_k ? i - nq_pairs : i;
		int h = j / half_hd, pi = j % half_hd;
		int a = h * hd + (neox ? pi : 2 * pi);
		int b = h * hd + (neox ? pi + half_hd : 2 * pi + 1);
		float c = cs[2 * pi], sn = cs[2 * pi + 1];
		float *vec = is_k ? k : q;
		float x0 = vec[a], x1 = vec[b];
		vec[a] = x0 * c - x1 * sn;
		vec[b] = x0 * sn + x1 * c;
	}
	__syncthreads();
	kv_store_row(kv.type, kd, k, n_head_kv * hd);
	kv_store_row(kv.type, kd + kv.v_offset, v, n_head_kv * hd);
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

/* Block (t, l): token t's K row of layer l rotated by layer l's delta
 * angles, as kernels/cpu/kvshift.c does it: x0 c - x1 s, x0 s + x1 c in
 * float, each product and the sum rounded on its own (no contraction, so
 * the same key gives the CPU's bits), then rounded to the stored type. */
static __global__ void k_kv_shift(struct cu_kv kv, const int32_t *pages, int n_head_kv, int hd, int neox,
				  const float *tab)
{
	int t = blockIdx.x, l = blockIdx.y, half_hd = hd / 2;
	char *row = kv_row(kv, pages, l, t);
	const float *cs = tab + (size_t)l * hd;

	for (int i = threadIdx.x; i < n_head_kv * half_hd; i += blockDim.x) {
		int h = i / half_hd, pi = i % half_hd;
		int a = h * hd + (neox ? pi : 2 * pi);
		int b = h * hd + (neox ? pi + half_hd : 2 * pi + 1);
		float c = cs[2 * pi], sn = cs[2 * pi + 1];
		float x0 = kv_load(kv.type, row, a), x1 = kv_load(kv.type, row, b);
		float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
		float y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
		if (kv.type == KT_F32) {
			((float *)row)[a] = y0;
			((float *)row)[b] = y1;
		} else if (kv.type == KT_BF16) {
			((unsigned short *)row)[a] = kt_f32_to_bf16(y0);
			((unsigned short *)row)[b] = kt_f32_to_bf16(y1);
		} else {
			((unsigned short *)row)[a] = __half_as_ushort(__float2half_rn(y0));
			((unsigned short *)row)[b] = __half_as_ushort(__float2half_rn(y1));
		}
	}
}

cudaError_t cu_kv_shift(struct cu_kv kv, const int32_t *pages, int n_tokens, int n_layer, int n_head_kv, int hd,
			int neox, const float *tab, cudaStream_t s)
{
	if (n_tokens <= 0 || n_layer <= 0)
		return cudaSuccess;
	dim3 grid((unsigned)n_tokens, (unsigned)n_layer);
	k_kv_shift<<<grid, 64, 0, s>>>(kv, pages, n_head_kv, hd, neox, tab);
	return launched();
}


/* ---- gated activations ------------------------------------------------------ */

/* GELU_2K = 2 sqrt(2 / pi): 0.5 x (1 + tanh(z)) = x / (1 + exp(-2 z)), as the
 * CPU's GeGLU computes it (kernels/cpu/ops.c) */
#define GELU_2K 1.5957691216f
#define GELU_C 0.044715f

static __global__ void k_glu(const float *gu, int n_ff, int gelu, __half *h)
{
	int t = blockIdx.x;
	const float *gr = gu + (size_t)t * 2 * n_ff, *ur = gr + n_ff;
	for (int i = threadIdx.x; i < n_ff; i += blockDim.x) {
		float gv = gr[i];
		float z = gelu ? GELU_2K * (gv + GELU_C * gv * gv * gv) : gv;
		h[(size_t)t * n_ff + i] = __float2half_rn(gv / (1.0f + expf(-z)) * ur[i]);
	}
}

cudaError_t cu_glu(const float *gu, int T, int n_ff, int gelu, __half *h, cudaStream_t s)
{
	if (T <= 0)
		return cudaSuccess;
	k_glu<<<T, 256, 0, s>>>(gu, n_ff, gelu, h);
	return launched();
}


/* ---- page gather / scatter ------------------------------------------------ */

/* Page bytes are a multiple of 4 for every KV type (2 n_layer blocks of
 * rows whose sizes are even), so pages move as 32-bit words; grid.y walks
 * the pages. */
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
