/*
 * tests/gpu/emu/emu.cc — the CPU emulation declared in include/emu.h.
 *
 * Kernels: a grid's blocks run one after another; a block's threads are
 * fibers run round-robin, each until it reaches __syncthreads() or
 * returns, so that every thread of a block has arrived at a barrier before
 * any leaves it. On x86-64 a fiber switch saves only the callee-saved
 * registers and the stack pointer (emu_switch below): glibc's swapcontext
 * also makes a sigprocmask system call per switch, which made the
 * emulated kernels with barriers spend most of their time in the kernel.
 * Elsewhere, and under AddressSanitizer (which must be told of stack
 * switches), the fibers are ucontext ones. When the first block meets no barrier at all, the
 * other blocks' threads run as plain calls (fast); a barrier met then
 * aborts. A block whose threads reach different numbers of
 * barriers (undefined behaviour on a GPU) aborts the test.
 *
 * Memory: "device" allocations are host allocations, tracked so that a
 * free of an unknown pointer, a leak check or a copy out of bounds can be
 * reported. Copies are synchronous; streams and events only record order.
 */
#include <assert.h>
#include <stdio.h>
#include <ucontext.h>

#include <map>

#include "emu.h"

emu_uint3 threadIdx, blockIdx, blockDim, gridDim;
char *emu_dyn_smem;

static cudaError_t last_error = cudaSuccess;
static int smem_limit = 48 << 10; /* until cudaFuncSetAttribute raises it */
static const int smem_optin = 227 << 10;

/* ---- fibers ---------------------------------------------------------------------- */

#define EMU_STACK (256 << 10)
#define EMU_MAX_THREADS 1024

static char *stacks;
static int cur, done[EMU_MAX_THREADS], barriers[EMU_MAX_THREADS];
static const std::function<void()> *cur_body;

/* Set while threads run as plain calls (a kernel whose first block met no
 * barrier): a barrier then is a kernel with data-dependent barriers. */
static int direct_mode;

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
/* emu_switch(save, to): push the callee-saved registers, store the stack
 * pointer in *save, load `to` as the stack pointer, pop its registers and
 * return into it (the System V x86-64 ABI: everything else is
 * caller-saved; MXCSR and the x87 control word are never changed here). */
extern "C" void emu_switch(void **save, void *to);
__asm__(".text\n"
	".globl emu_switch\n"
	".type emu_switch,@function\n"
	"emu_switch:\n"
	"\tpushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n"
	"\tmovq %rsp, (%rdi)\n"
	"\tmovq %rsi, %rsp\n"
	"\tpopq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n"
	"\tret\n"
	".size emu_switch, .-emu_switch\n");

static void *sched_sp, *fib_sp[EMU_MAX_THREADS];

static void fiber_yield(void) { emu_switch(&fib_sp[cur], sched_sp); }
static void fiber_run(int t) { emu_switch(&sched_sp, fib_sp[t]); }

static void fiber_entry(void)
{
	(*cur_body)();
	done[cur] = 1;
	emu_switch(&fib_sp[cur], sched_sp); /* never resumed: the next launch makes it anew */
	abort();
}

/* A fresh fiber's stack: the six registers emu_switch pops, then
 * fiber_entry as its return address, then a slot standing for the
 * return address of a call, so that fiber_entry starts with the stack
 * aligned as after a call (rsp + 8 a multiple of 16). */
static void fiber_make(int t)
{
	uintptr_t top = ((uintptr_t)(stacks + (size_t)(t + 1) * EMU_STACK)) & ~(uintptr_t)15;
	void **sp = (void **)top;
	*--sp = NULL;                   /* fiber_entry's return address: never used */
	*--sp = (void *)fiber_entry;    /* where emu_switch's ret goes */
	for (int r = 0; r < 6; r++)
		*--sp = NULL;           /* r15 r14 r13 r12 rbx rbp */
	fib_sp[t] = sp;
}
#else
static ucontext_t sched_ctx, fib[EMU_MAX_THREADS];

static void fiber_yield(void) { swapcontext(&fib[cur], &sched_ctx); }
static void fiber_run(int t) { swapcontext(&sched_ctx, &fib[t]); }

static void fiber_entry(void)
{
	(*cur_body)();
	done[cur] = 1;
	/* returns to uc_link, the scheduler */
}

static void fiber_make(int t)
{
	getcontext(&fib[t]);
	fib[t].uc_stack.ss_sp = stacks + (size_t)t * EMU_STACK;
	fib[t].uc_stack.ss_size = EMU_STACK;
	fib[t].uc_link = &sched_ctx;
	makecontext(&fib[t], fiber_entry, 0);
}
#endif

void __syncthreads(void)
{
	if (direct_mode) {
		fprintf(stderr, "emu: __syncthreads in a block after a first block without any\n");
		abort();
	}
	barriers[cur]++;
	fiber_yield();
}

int emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body)
{
	int nth = (int)(block.x * block.y * block.z);
	if (nth <= 0 || nth > EMU_MAX_THREADS || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
	    grid.z > 65535 || (int)smem > smem_limit) {
		fprintf(stderr, "emu: bad launch: grid %u,%u,%u block %d smem %zu (limit %d)\n", grid.x, grid.y, grid.z,
			nth, smem, smem_limit);
		last_error = cudaErrorInvalidValue;
		return -1;
	}
	if (!stacks) {
		stacks = (char *)malloc((size_t)EMU_MAX_THREADS * EMU_STACK);
		assert(stacks);
	}
	char *dyn = (char *)calloc(1, smem + 16);
	/* fill with a pattern: a kernel must not rely on zeroed shared memory */
	memset(dyn, 0x7f, smem);
	emu_dyn_smem = dyn;
	cur_body = &body;
	blockDim.x = block.x;
	blockDim.y = block.y;
	blockDim.z = block.z;
	gridDim.x = grid.x;
	gridDim.y = grid.y;
	gridDim.z = grid.z;
	int any_barrier = 1;
	for (unsigned bz = 0; bz < grid.z; bz++)
		for (unsigned by = 0; by < grid.y; by++)
			for (unsigned bx = 0; bx < grid.x; bx++) {
				blockIdx.x = bx;
				blockIdx.y = by;
				blockIdx.z = bz;
				if (!any_barrier) {
					/* no barriers: threads one after another, as calls */
					direct_mode = 1;
					for (int t = 0; t < nth; t++) {
						cur = t;
						threadIdx.x = (unsigned)t % block.x;
						threadIdx.y = ((unsigned)t / block.x) % block.y;
						threadIdx.z = (unsigned)t / (block.x * block.y);
						body();
					}
					direct_mode = 0;
					continue;
				}
				for (int t = 0; t < nth; t++) {
					fiber_make(t);
					done[t] = 0;
					barriers[t] = 0;
				}
				for (;;) {
					int live = 0;
					for (int t = 0; t < nth; t++) {
						if (done[t])
							continue;
						cur = t;
						threadIdx.x = (unsigned)t % block.x;
						threadIdx.y = ((unsigned)t / block.x) % block.y;
						threadIdx.z = (unsigned)t / (block.x * block.y);
						fiber_run(t);
						live += !done[t];
					}
					/* every thread is at the same barrier, or all finished */
					for (int t = 1; t < nth; t++)
						if (done[t] != done[0] || barriers[t] != barriers[0]) {
							fprintf(stderr, "emu: divergent __syncthreads in block %u,%u,%u\n",
								bx, by, bz);
							abort();
						}
					if (!live)
						break;
				}
				if (bx == 0 && by == 0 && bz == 0 && barriers[0] == 0)
					any_barrier = 0;
			}
	free(dyn);
	emu_dyn_smem = NULL;
	return 0;
}

/* ---- fp16 ------------------------------------------------------------------------ */

float emu_h2f(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
	float f;
	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else {
			int e = -1;
			do {
				e++;
				man <<= 1;
			} while (!(man & 0x400));
			man &= 0x3ff;
			bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
		}
	} else if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t emu_f2h(float f)
{
	uint32_t x, sign, exp, man;
	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000;
	exp = (x >> 23) & 0xff;
	man = x & 0x7fffff;
	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
	int32_t e = (int32_t)exp - 127 + 15;
	if (e >= 0x1f)
		return (uint16_t)(sign | 0x7c00);
	if (e <= 0) {
		if (e < -10)
			return (uint16_t)sign;
		man |= 0x800000;
		uint32_t shift = (uint32_t)(14 - e), half = man >> shift, rem = man & ((1u << shift) - 1),
			 mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
		half++;
	return (uint16_t)half;
}

/* ---- runtime ---------------------------------------------------------------------- */

static std::map<const char *, size_t> &allocs(void)
{
	static std::map<const char *, size_t> m;
	return m;
}

/* Whether [p, p + n) lies inside one emulated device allocation. */
static int in_device(const void *p, size_t n)
{
	auto &m = allocs();
	auto it = m.upper_bound((const char *)p);
	if (it == m.begin())
		return 0;
	--it;
	return (const char *)p >= it->first && (const char *)p + n <= it->first + it->second;
}

static cudaError_t check_span(const void *p, size_t n, int device)
{
	if (device && !in_device(p, n)) {
		fprintf(stderr, "emu: device access %p + %zu outside any allocation\n", p, n);
		abort();
	}
	return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	*n = 1;
	return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev)
{
	(void)dev;
	if (a != cudaDevAttrMaxSharedMemoryPerBlockOptin)
		return cudaErrorInvalidValue;
	*v = smem_optin;
	return cudaSuccess;
}
cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}
cudaError_t emu_func_set_smem(int bytes)
{
	if (bytes > smem_optin)
		return cudaErrorInvalidValue;
	smem_limit = bytes > smem_limit ? bytes : smem_limit;
	return cudaSuccess;
}

struct emu_stream { int dummy; };
struct emu_event { int dummy; };
struct emu_blas { cudaStream_t s; };

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
	(void)flags;
	*s = new emu_stream();
	return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	delete s;
	return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return s ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
	(void)flags;
	return s && e ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
	(void)flags;
	*e = new emu_event();
	return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	delete e;
	return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return s && e ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaMalloc(void **p, size_t n)
{
	/* EMU_DEVICE_MIB bounds the emulated device memory (tests of -ENOMEM) */
	static size_t used;
	const char *lim = getenv("EMU_DEVICE_MIB");
	if (lim && used + n > (size_t)atol(lim) << 20) {
		*p = NULL;
		return cudaErrorMemoryAllocation;
	}
	void *q = NULL;
	if (posix_memalign(&q, 256, n ? n : 1))
		return cudaErrorMemoryAllocation;
	memset(q, 0xa5, n); /* device memory is not zeroed */
	allocs()[(const char *)q] = n;
	used += n;
	*p = q;
	return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	auto &m = allocs();
	auto it = m.find((const char *)p);
	if (it == m.end()) {
		fprintf(stderr, "emu: cudaFree of unknown pointer %p\n", p);
		abort();
	}
	m.erase(it);
	free(p);
	return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n)
{
	*p = malloc(n ? n : 1);
	return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p)
{
	free(p);
	return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags)
{
	(void)flags;
	return p && n ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaHostUnregister(void *p) { return p ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
	*free_b = 1ull << 30;
	*total_b = 2ull << 30;
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
	if (!st)
		return cudaErrorInvalidValue;
	check_span(d, n, k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice);
	check_span(s, n, k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice);
	if (n)
		memmove(d, s, n);
	return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
			      enum cudaMemcpyKind k, cudaStream_t st)
{
	if (!st || width > dpitch || width > spitch)
		return cudaErrorInvalidValue;
	for (size_t r = 0; r < height; r++) {
		cudaError_t e = cudaMemcpyAsync((char *)d + r * dpitch, (const char *)s + r * spitch, width, k, st);
		if (e)
			return e;
	}
	return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st)
{
	if (!st)
		return cudaErrorInvalidValue;
	check_span(p, n, 1);
	memset(p, v, n);
	return cudaSuccess;
}

/* ---- cuBLAS ------------------------------------------------------------------------ */

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	*h = new emu_blas();
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	h->s = s;
	return CUBLAS_STATUS_SUCCESS;
}

/* C = alpha op(A) op(B) + beta C, column-major, C m x n, op(A) m x k,
 * op(B) k x n, as cuBLAS defines it; the arguments are checked as cuBLAS
 * checks them (lda >= rows of A as stored, ...). */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
			    const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
			    cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
			    cublasComputeType_t comp, cublasGemmAlgo_t algo)
{
	(void)algo;
	if (!h || at != CUDA_R_16F || bt != CUDA_R_16F || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	if (m < 0 || n < 0 || k < 0 || lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) ||
	    ldc < m || lda < 1 || ldb < 1 || ldc < 1)
		return CUBLAS_STATUS_INVALID_VALUE;
	const __half *a = (const __half *)A, *b = (const __half *)B;
	float *c = (float *)C, al = *(const float *)alpha, be = *(const float *)beta;
	/* the spans cuBLAS would touch */
	if (m && n && k) {
		size_t acols = ta == CUBLAS_OP_N ? (size_t)k : (size_t)m, arows = ta == CUBLAS_OP_N ? (size_t)m : (size_t)k;
		size_t bcols = tb == CUBLAS_OP_N ? (size_t)n : (size_t)k, brows = tb == CUBLAS_OP_N ? (size_t)k : (size_t)n;
		check_span(a, ((acols - 1) * lda + arows) * 2, 1);
		check_span(b, ((bcols - 1) * ldb + brows) * 2, 1);
	}
	if (m && n)
		check_span(c, (((size_t)n - 1) * ldc + m) * 4, 1);
	/* op(A) as m rows of k floats, op(B) as n rows of k floats */
	float *fa = (float *)malloc(sizeof(float) * ((size_t)m * k + 1));
	float *fb = (float *)malloc(sizeof(float) * ((size_t)n * k + 1));
	if (!fa || !fb) {
		free(fa);
		free(fb);
		return CUBLAS_STATUS_ALLOC_FAILED;
	}
	for (int i = 0; i < m; i++)
		for (int p = 0; p < k; p++)
			fa[(size_t)i * k + p] = emu_h2f(ta == CUBLAS_OP_N ? a[i + (size_t)p * lda].x : a[p + (size_t)i * lda].x);
	for (int j = 0; j < n; j++)
		for (int p = 0; p < k; p++)
			fb[(size_t)j * k + p] = emu_h2f(tb == CUBLAS_OP_N ? b[p + (size_t)j * ldb].x : b[j + (size_t)p * ldb].x);
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			const float *ar = fa + (size_t)i * k, *br = fb + (size_t)j * k;
			float s = 0;
			for (int p = 0; p < k; p++)
				s += ar[p] * br[p];
			float *cij = c + i + (size_t)j * ldc;
			*cij = al * s + (be != 0.0f ? be * *cij : 0.0f);
		}
	free(fa);
	free(fb);
	return CUBLAS_STATUS_SUCCESS;
}
