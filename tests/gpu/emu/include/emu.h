/*
 * tests/gpu/emu/include/emu.h — a CPU emulation of the small part of CUDA,
 * cuda_fp16 and cuBLAS that kvd's CUDA plug-in uses, so that the plug-in's
 * own sources (the .cu files of kernels/cuda, launch syntax rewritten by
 * tests/gpu/emu/rewrite.py) build with g++ into a shared object that runs
 * on any machine. tests/unit/test_cuda.c then checks it against the CPU
 * backend exactly as it checks the real plug-in on a GPU.
 *
 * What it emulates faithfully: the kernels' indexing and arithmetic (each
 * CUDA thread of a block is a ucontext fiber; __syncthreads() switches
 * fibers, so a block's threads interleave only at barriers, like a correct
 * CUDA program may assume), dynamic and static shared memory, the
 * column-major semantics and argument order of cublasGemmEx, the
 * copy/memset/2-D copy calls. What it cannot show: data races between
 * threads outside barriers, the GPU memory model, real out-of-bounds
 * faults in device memory (host memory is used; run under ASan to catch
 * them), occupancy and launch limits beyond the checks below, and speed.
 */
#ifndef KVD_CUDA_EMU_H
#define KVD_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <functional>

/* ---- qualifiers and built-ins ------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
	unsigned int x, y, z;
	dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};
struct emu_uint3 {
	unsigned int x, y, z;
};

extern emu_uint3 threadIdx, blockIdx, blockDim, gridDim;
extern char *emu_dyn_smem;

void __syncthreads(void);

/* Run body once per thread of every block of the grid. */
int emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);

/* ---- fp16 ---------------------------------------------------------------------- */

struct __half {
	uint16_t x;
};

float emu_h2f(uint16_t h);
uint16_t emu_f2h(float f);

static inline float __half2float(__half h) { return emu_h2f(h.x); }
static inline __half __float2half_rn(float f) { __half h; h.x = emu_f2h(f); return h; }
static inline __half __ushort_as_half(unsigned short u) { __half h; h.x = u; return h; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
/* single roundings (g++ -std=c++17 does not contract a * b + c either) */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }

/* ---- runtime ---------------------------------------------------------------------- */

enum cudaError_t {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorLaunchFailure = 719,
};
typedef enum cudaError_t cudaError_t;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
};
enum cudaDeviceAttr {
	cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostRegisterDefault 0x00

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaGetLastError(void);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
			      enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st);
cudaError_t emu_func_set_smem(int bytes);

template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *, enum cudaFuncAttribute a, int v)
{
	return a == cudaFuncAttributeMaxDynamicSharedMemorySize ? emu_func_set_smem(v) : cudaErrorInvalidValue;
}

/* ---- cuBLAS ------------------------------------------------------------------------- */

typedef struct emu_blas *cublasHandle_t;
enum cublasStatus_t {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
typedef enum cublasStatus_t cublasStatus_t;
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
			    const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
			    cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
			    cublasComputeType_t comp, cublasGemmAlgo_t algo);

#endif
