/* cuda_runtime.h (CUDA emulation, dev/cuda_emu): the CUDA runtime API and the device-side language
 * that train_sdc's CUDA sources use, declared for the host C++ compiler so that the same .cu/.cuh files
 * build and run on a CPU without a CUDA toolkit. The design (execution model, checks, what it cannot
 * see) is described at the top of dev/cuda_emu/emu_runtime.cpp; the emulator's own API (counters) is in
 * cuda_emu.h.
 *
 * Host API: types and enum values as in the toolkit (CUDA 12), so code written against the real header
 * compiles unchanged; only what the project calls (and a few neighbours) is declared.
 * Device side: __global__/__device__/__host__/__forceinline__/__launch_bounds__ are no-ops or plain
 * attributes; threadIdx, blockIdx, blockDim, gridDim and warpSize read the current emulated thread and
 * block; __syncthreads and the warp intrinsics are calls into the emulator's scheduler (they carry the
 * source line so an error names it); math functions are the host libm's (IEEE; never built with
 * fast-math); integer atomics are GCC __atomic builtins (blocks run in parallel).
 * Kernel launches and __shared__ declarations reach this header through dev/cuda_emu/cu2emu.py, which
 * rewrites `k<<<g, b, smem, stream>>>(args)` into emu::launch(...) and `__shared__ T x[N];` into
 * EMU_SHARED(T, x, [N]). */
#ifndef CUDA_EMU_CUDA_RUNTIME_H
#define CUDA_EMU_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "the CUDA emulation (dev/cuda_emu) is C++ only: compile the .cu sources with g++ -x c++"
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <cmath>
#include <type_traits>
#include "library_types.h"

#define __CUDA_EMU__ 1
#define CUDART_VERSION 12040

/* ------------------------------------------------------------------------------ qualifiers */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __CUDA_ALIGN__(n) __attribute__((aligned(n)))

/* ------------------------------------------------------------------------------ vector types */
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

/* ------------------------------------------------------------------------------ host API types */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
} cudaFuncAttribute;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int clockRate;
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int memoryClockRate;
    int memoryBusWidth;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    size_t sharedMemPerBlockOptin;
    int regsPerMultiprocessor;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int unifiedAddressing;
    int managedMemory;
    int concurrentKernels;
    int ECCEnabled;
};

extern "C" {
cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void* ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaFuncSetAttribute_emu(const void* func, cudaFuncAttribute attr, int value);
cudaError_t cudaMalloc_at(void** ptr, size_t size, const char* file, int line);
}
/* cudaMalloc records where each buffer was allocated (an out-of-bounds access names that line); the
 * cast accepts any T** as the toolkit's C++ overload does */
#define cudaMalloc(p, n) cudaMalloc_at((void**)(p), (n), __FILE__, __LINE__)
template <class T> static inline cudaError_t cudaMallocHost(T** p, size_t n) { return cudaMallocHost((void**)p, n); }
/* the toolkit's C++ overload takes any kernel */
template <class T> static inline cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute_emu(reinterpret_cast<const void*>(func), attr, value);
}

/* ------------------------------------------------------------------------------ device side */
namespace emu {
/* what the device code reads of the current thread and block (the runtime's fibers extend these) */
struct ThreadCtx { uint3 idx; };
struct BlockCtx { uint3 blockIdx; dim3 blockDim; dim3 gridDim; };
}
extern __thread emu::ThreadCtx* emu_tl_thread;
extern __thread emu::BlockCtx* emu_tl_block;
#define threadIdx (emu_tl_thread->idx)
#define blockIdx (emu_tl_block->blockIdx)
#define blockDim (emu_tl_block->blockDim)
#define gridDim (emu_tl_block->gridDim)
#define warpSize 32

namespace emu {
enum WarpKind { W_SHFL_IDX = 0, W_SHFL_XOR, W_SHFL_DOWN, W_SHFL_UP, W_ANY, W_ALL, W_BALLOT, W_SYNCWARP,
                W_MMA, W_LDMATRIX /* the tensor-core collectives (all 32 lanes, one call site) */ };
/* the scheduler's entry points (emu_runtime.cpp) */
void syncthreads(const char* file, int line);
unsigned long long warp_op(int kind, unsigned mask, unsigned long long bits, int arg, int width, const char* file, int line);
void* shared_slot(const void* tag, size_t bytes, size_t align, const char* file, int line, const char* name);
void* dynamic_shared(const char* file, int line);

template <class T> static inline T shfl_generic(int kind, const char* file, int line, unsigned mask, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
    unsigned long long b = 0;
    memcpy(&b, &v, sizeof(T));
    b = warp_op(kind, mask, b, arg, width, file, line);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
template <class T> static inline T shfl_sync(const char* f, int l, unsigned mask, T v, int src, int width = 32) { return shfl_generic(W_SHFL_IDX, f, l, mask, v, src, width); }
template <class T> static inline T shfl_xor_sync(const char* f, int l, unsigned mask, T v, int lm, int width = 32) { return shfl_generic(W_SHFL_XOR, f, l, mask, v, lm, width); }
template <class T> static inline T shfl_down_sync(const char* f, int l, unsigned mask, T v, unsigned d, int width = 32) { return shfl_generic(W_SHFL_DOWN, f, l, mask, v, (int)d, width); }
template <class T> static inline T shfl_up_sync(const char* f, int l, unsigned mask, T v, unsigned d, int width = 32) { return shfl_generic(W_SHFL_UP, f, l, mask, v, (int)d, width); }
static inline int any_sync(const char* f, int l, unsigned mask, int pred) { return (int)warp_op(W_ANY, mask, pred != 0, 0, 32, f, l); }
static inline int all_sync(const char* f, int l, unsigned mask, int pred) { return (int)warp_op(W_ALL, mask, pred != 0, 0, 32, f, l); }
static inline unsigned ballot_sync(const char* f, int l, unsigned mask, int pred) { return (unsigned)warp_op(W_BALLOT, mask, pred != 0, 0, 32, f, l); }
struct SyncWarp {   /* __syncwarp() / __syncwarp(mask) with the call site */
    const char* f;
    int l;
    void operator()(unsigned mask = 0xffffffffu) const { warp_op(W_SYNCWARP, mask, 0, 0, 32, f, l); }
};

/* the twins of llmc/cuda/ptx.cuh's wrappers (emu_runtime.cpp; semantics and checks described there).
 * mma_bf16_16816 and ldmatrix are warp collectives (every lane of the warp at the same call site);
 * cp_async_* act on the calling thread's queue of pending copies. */
void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b, const float* c, const char* file, int line);
void ldmatrix(uint32_t* r, int num, bool trans, const void* smem_row, const char* file, int line);
void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes, const char* file, int line);
void cp_async_commit(const char* file, int line);
void cp_async_wait(int n, const char* file, int line);
void cp_async_wait_all(const char* file, int line);
uint32_t pack_bf16x2(float lo, float hi);

/* kernel launch (the rewritten form of k<<<grid, block, smem, stream>>>(args)) */
struct LaunchCfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    LaunchCfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), smem(s), stream(st) {}
};
typedef void (*BodyFn)(const void* ctx);
void launch_impl(const char* name, const void* fn, const LaunchCfg& cfg, const char* file, int line, BodyFn body, const void* ctx);
/* body: a lambda that calls the kernel with the launch's arguments (each emulated thread calls it; the
 * kernel's parameters are then per-thread copies, as on the GPU) */
template <class F, class L> static inline void launch(const char* name, F* fn, const LaunchCfg& cfg, const char* file, int line, const L& body) {
    launch_impl(name, reinterpret_cast<const void*>(fn), cfg, file, line, [](const void* c) { (*static_cast<const L*>(c))(); }, &body);
}
}  // namespace emu

#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp emu::SyncWarp{__FILE__, __LINE__}
#define __shfl_sync(...) emu::shfl_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) emu::shfl_xor_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) emu::shfl_down_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) emu::shfl_up_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __any_sync(mask, pred) emu::any_sync(__FILE__, __LINE__, (mask), (pred))
#define __all_sync(mask, pred) emu::all_sync(__FILE__, __LINE__, (mask), (pred))
#define __ballot_sync(mask, pred) emu::ballot_sync(__FILE__, __LINE__, (mask), (pred))
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* __shared__ T name dims;  ->  EMU_SHARED(T, name, dims): the block's slot for this declaration (the same
 * for every thread of the block, poisoned with 0xFF when the block first reaches it) */
#define EMU_SHARED(T, name, dims)                                                                                 \
    typedef T emu_shared_t_##name dims;                                                                           \
    static char emu_shared_tag_##name;                                                                            \
    emu_shared_t_##name& name = *static_cast<emu_shared_t_##name*>(emu::shared_slot(                               \
        &emu_shared_tag_##name, sizeof(emu_shared_t_##name), alignof(emu_shared_t_##name), __FILE__, __LINE__, #name))
/* extern __shared__ T name[];  ->  the block's dynamic shared memory */
#define EMU_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(emu::dynamic_shared(__FILE__, __LINE__))

/* ------------------------------------------------------------------------------ device math */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
static inline long long __double_as_longlong(double f) { long long i; memcpy(&i, &f, 8); return i; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
template <class T> static inline T __ldg(const T* p) { return *p; }

/* min/max as CUDA's math_functions.hpp declares them for integer and floating types */
#define EMU_MINMAX(T)                                                   \
    static inline T min(T a, T b) { return a < b ? a : b; }             \
    static inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* ------------------------------------------------------------------------------ atomics */
template <class T> static inline T emu_atomic_add_int(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicAdd(int* p, int v) { return emu_atomic_add_int(p, v); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return emu_atomic_add_int(p, v); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return emu_atomic_add_int(p, v); }
static inline float atomicAdd(float* p, float v) {
    float old, upd;
    __atomic_load(p, &old, __ATOMIC_SEQ_CST);
    do { upd = old + v; } while (!__atomic_compare_exchange(p, &old, &upd, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
static inline double atomicAdd(double* p, double v) {
    double old, upd;
    __atomic_load(p, &old, __ATOMIC_SEQ_CST);
    do { upd = old + v; } while (!__atomic_compare_exchange(p, &old, &upd, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
static inline int atomicSub(int* p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicSub(unsigned* p, unsigned v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline float atomicExch(float* p, float v) { float r; __atomic_exchange(p, &v, &r, __ATOMIC_SEQ_CST); return r; }
static inline int atomicCAS(int* p, int cmp, int v) { __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return cmp; }
static inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) { __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return cmp; }
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
static inline int atomicMax(int* p, int v) { int o = __atomic_load_n(p, __ATOMIC_SEQ_CST); while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} return o; }
static inline int atomicMin(int* p, int v) { int o = __atomic_load_n(p, __ATOMIC_SEQ_CST); while (o > v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} return o; }
static inline unsigned atomicMax(unsigned* p, unsigned v) { unsigned o = __atomic_load_n(p, __ATOMIC_SEQ_CST); while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} return o; }
static inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicXor(int* p, int v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicXor(unsigned* p, unsigned v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicXor(unsigned long long* p, unsigned long long v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }

#endif /* CUDA_EMU_CUDA_RUNTIME_H */
