/* cuda_common.cuh: what every CUDA file of train_sdc shares.
 *
 * - bf16 (the storage type of activations and weight copies), CEIL_DIV.
 * - cudaCheck / cublasCheck / ncclCheck: one line "error: ... [file:line]" with the library's own
 *   message, then exit 1 (the whole MPI job is aborted, see tsdc_abort in utils.h).
 * - Deterministic reductions: warp_reduce_sum / warp_reduce_max combine the 32 lanes with xor
 *   shuffles at offsets 16, 8, 4, 2, 1 (a fixed butterfly: every lane ends with the same value, and
 *   the same inputs give the same bits on every run); block_reduce_sum sums each warp that way, then
 *   the warp sums in warp order through warp 0, and hands every thread the result. No atomics.
 * - cuda_workspace_f32(slot, n): lazily grown device scratch, 8 slots, each at least n floats. A slot
 *   is grown (freed and reallocated, zero-filled) only when a call asks for more than it holds, so
 *   after the first training step nothing is allocated. Growing invalidates pointers returned earlier
 *   for that slot: a launcher fetches each slot it uses once, at its start. Slot owners:
 *       0..3  rmsnorm.cuh, global_norm.cuh (and other small reductions)
 *       4..7  attention.cuh (4: fp32 logits / dprobs chunk, 5: bf16 dlogits chunk,
 *             6: bf16 permuted q/k/v/dout, 7: fp32 permuted dq/dk/dv); flash_attention.cuh's D in 4
 * - cuda_device_check_or_exit(program): a clean one-line error where there is no usable GPU.
 * - Work accounting, one call per launch (kernel, cuBLASLt GEMM, NCCL call), right at the launcher:
 *       launch_account(comp, kernel, unit, grid, flops, read, written)
 *       ew_account(comp, kernel, grid, flops, read, written)   (CUDA-core fp32; also adds to -stats' bytes)
 *       ride_account(...)   (launch_account's arguments: blocks riding on another launch, no launch overhead)
 *   comp is the component label (COST_* below), kernel the kernel's name, unit what executes its
 *   FLOPs (COST_TC: tensor cores, bf16 in, fp32 accumulate; COST_FP32: CUDA cores (integer work counted
 *   there too); COST_FP64: CUDA cores in double; COST_NET: a collective, its bytes are what one rank
 *   sends and receives), grid its blocks (x*y*z; 1 for a
 *   library call), flops the floating-point operations it executes (a multiply-add is 2; the work the
 *   kernel really does, e.g. the tiles the fused attention visits, not a model's nominal count) and
 *   read/written its documented compulsory traffic in bytes (every input element read once, every
 *   output element written once, in its storage dtype; re-reads through caches are not counted).
 *   ew_account's bytes are also summed into g_ew_bytes_read / g_ew_bytes_written, the element-wise
 *   bytes of -stats (llmc/host/stats.h): element-wise, norm, embedding, classifier and optimizer
 *   kernels use it, the rest (GEMMs, attention, checks) launch_account.
 *   Records are kept only while g_cost_on (the trainer's -cost_out window, train_sdc.cu); a
 *   CostScope("qk") object relabels every launch of its lifetime (the outermost scope wins: the
 *   trainer marks the work that exists only because a -protect kind is on, and a launcher such as
 *   attention_forward marks its own GEMMs as attention). Counting costs a few additions a launch.
 *
 * Device code must not be built with --use_fast_math: the kernels use expf, 1.0f/x and sqrtf with
 * their IEEE meaning, as the CPU reference (llmc/cpu/cpu_kernels.h) does. */
#ifndef TSDC_CUDA_COMMON_CUH
#define TSDC_CUDA_COMMON_CUH

#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#ifdef USE_NCCL
#include <nccl.h>
#endif

#include "../host/utils.h"

typedef __nv_bfloat16 bf16;

#ifndef CEIL_DIV
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#endif

/* ------------------------------------------------------------------------------ error checks */
static inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
    if (err != cudaSuccess) tsdc_fail("CUDA error: %s (%s) [%s:%d]", cudaGetErrorString(err), call, file, line);
}
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)

static inline void cublas_check(cublasStatus_t st, const char* call, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS)
        tsdc_fail("cuBLAS error: %s (%d) (%s) [%s:%d]", cublasLtGetStatusString(st), (int)st, call, file, line);
}
#define cublasCheck(call) cublas_check((call), #call, __FILE__, __LINE__)

#ifdef USE_NCCL
static inline void nccl_check(ncclResult_t r, const char* call, const char* file, int line) {
    if (r != ncclSuccess) tsdc_fail("NCCL error: %s (%s) [%s:%d]", ncclGetErrorString(r), call, file, line);
}
#define ncclCheck(call) nccl_check((call), #call, __FILE__, __LINE__)
#endif

/* No usable GPU (no driver, no device, a broken driver): one line and exit 1, never a crash.
 * program names the GPU binary that asked (kept for the caller's readability; the message points
 * the user to the CPU trainer). */
static void cuda_device_check_or_exit(const char* program) {
    (void)program;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n <= 0) {
        const char* why = err != cudaSuccess ? cudaGetErrorString(err) : cudaGetErrorString(cudaErrorNoDevice);
        fflush(stdout);
        fprintf(stderr, "error: no usable CUDA GPU (%s); ./train_sdc is the CPU trainer\n", why);
        fflush(stderr);
        exit(1);
    }
}

/* --------------------------------------------------------------------------- work accounting */
/* component labels: the model's work, and one per -protect kind for the work that exists only because it
 * is on (PROT_KINDS' names, llmc/sdc/checks.h), fault injection and the baseline detectors */
#define COST_GEMM "gemm"
#define COST_ATTENTION "attention"
#define COST_NORM "norm"
#define COST_ELEMENTWISE "elementwise"
#define COST_CLASSIFIER "classifier"
#define COST_EMBEDDING "embedding"
#define COST_OPTIMIZER "optimizer"
#define COST_ALLREDUCE "allreduce"
#define COST_FAULT "fault"
#define COST_MISC "misc"          /* initialisation, checksums, evaluation: outside a training step */
enum { COST_TC = 0, COST_FP32 = 1, COST_NET = 2, COST_FP64 = 3 };
static const char* const COST_UNIT_NAMES[4] = {"tc_bf16", "fp32", "net", "fp64"};

typedef struct {
    const char* comp;             /* the label (the scope's, when one is set) */
    const char* kernel;
    int unit;
    unsigned long long grid;
    double flops, read, written;
    int ride;                     /* work riding on another launch (ride_account): no launch of its own */
} CostRec;

static unsigned long long g_ew_bytes_read = 0, g_ew_bytes_written = 0;
static int g_cost_on = 0;
static CostRec* g_cost_recs = NULL;
static size_t g_cost_n = 0, g_cost_cap = 0;
static const char* g_cost_scope = NULL;

static inline void cost_record(const char* comp, const char* kernel, int unit, dim3 grid, double flops, double read, double written, int ride) {
    if (!g_cost_on) return;
    if (g_cost_n == g_cost_cap) {
        g_cost_cap = g_cost_cap ? 2 * g_cost_cap : 4096;
        g_cost_recs = (CostRec*)realloc(g_cost_recs, g_cost_cap * sizeof(CostRec));
        if (!g_cost_recs) tsdc_fail("out of host memory for %zu cost records", g_cost_cap);
    }
    CostRec* r = &g_cost_recs[g_cost_n++];
    r->comp = g_cost_scope ? g_cost_scope : comp;
    r->kernel = kernel;
    r->unit = unit;
    r->grid = (unsigned long long)grid.x * grid.y * grid.z;
    r->flops = flops; r->read = read; r->written = written;
    r->ride = ride;
}
static inline void launch_account(const char* comp, const char* kernel, int unit, dim3 grid, double flops, double read, double written) {
    cost_record(comp, kernel, unit, grid, flops, read, written, 0);
}
/* a check's blocks riding on another launch (extra blocks of it): its work as its own record, marked, so the cost
 * model charges its FLOPs and bytes but no launch overhead, and the launch counts leave it out */
static inline void ride_account(const char* comp, const char* kernel, int unit, dim3 grid, double flops, double read, double written) {
    cost_record(comp, kernel, unit, grid, flops, read, written, 1);
}
static inline void ew_account(const char* comp, const char* kernel, dim3 grid, double flops, size_t read, size_t written) {
    g_ew_bytes_read += read;
    g_ew_bytes_written += written;
    launch_account(comp, kernel, COST_FP32, grid, flops, (double)read, (double)written);
}
/* an element-wise pass riding on another launch (ride_account): its bytes counted as ew_account's */
static inline void ew_ride_account(const char* comp, const char* kernel, dim3 grid, double flops, size_t read, size_t written) {
    g_ew_bytes_read += read;
    g_ew_bytes_written += written;
    ride_account(comp, kernel, COST_FP32, grid, flops, (double)read, (double)written);
}
/* relabels the launches of its lifetime (the outermost scope wins) */
struct CostScope {
    const char* prev;
    explicit CostScope(const char* comp) : prev(g_cost_scope) { if (!prev) g_cost_scope = comp; }
    ~CostScope() { g_cost_scope = prev; }
};

/* ------------------------------------------------------------------- deterministic reductions */
/* xor butterfly with fixed offsets: all 32 lanes return the same value, the same bits every run.
 * Must be called by all 32 lanes of a warp. */
__device__ __forceinline__ float warp_reduce_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
/* fmaxf: a NaN operand is ignored unless both are NaN (as the CPU's `z > m ? z : m` rowmax) */
__device__ __forceinline__ float warp_reduce_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
/* Sum over the block; every thread gets the result. blockDim.x must be a multiple of 32 (<= 1024),
 * all threads must call it (it contains __syncthreads). Safe to call repeatedly in one kernel. The
 * order is fixed: each warp's butterfly, then warp 0 sums the warp partials (missing warps read as
 * 0) with the same butterfly. */
__device__ __forceinline__ float block_reduce_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    __syncthreads(); /* a previous call may still be reading partial / total */
    v = warp_reduce_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nwarps ? partial[lane] : 0.0f;
        s = warp_reduce_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

/* ------------------------------------------------------------------------------- workspaces */
#define CUDA_WORKSPACE_SLOTS 8
static float* g_cuda_workspace[CUDA_WORKSPACE_SLOTS];
static size_t g_cuda_workspace_n[CUDA_WORKSPACE_SLOTS];

/* device scratch of at least n floats in slot (0..7); grown on demand, never shrunk */
static float* cuda_workspace_f32(int slot, size_t n) {
    if (slot < 0 || slot >= CUDA_WORKSPACE_SLOTS) tsdc_fail("cuda_workspace_f32: slot %d out of range 0..%d", slot, CUDA_WORKSPACE_SLOTS - 1);
    if (n == 0) n = 1;
    if (n > g_cuda_workspace_n[slot]) {
        if (g_cuda_workspace[slot]) {
            cudaCheck(cudaDeviceSynchronize()); /* queued kernels may still use the old buffer */
            cudaCheck(cudaFree(g_cuda_workspace[slot]));
            g_cuda_workspace[slot] = NULL;
            g_cuda_workspace_n[slot] = 0;
        }
        void* p = NULL;
        cudaError_t e = cudaMalloc(&p, n * sizeof(float));
        if (e != cudaSuccess)
            tsdc_fail("cannot allocate %.3f GiB of scratch (workspace slot %d): %s; lower -B or -seq",
                      (double)n * sizeof(float) / 1073741824.0, slot, cudaGetErrorString(e));
        cudaCheck(cudaMemset(p, 0, n * sizeof(float))); /* never read uninitialised memory */
        g_cuda_workspace[slot] = (float*)p;
        g_cuda_workspace_n[slot] = n;
    }
    return g_cuda_workspace[slot];
}

/* frees every workspace slot (end of the program, or between models in tests) */
static void cuda_workspace_free_all(void) {
    int any = 0;
    for (int i = 0; i < CUDA_WORKSPACE_SLOTS; i++) any |= g_cuda_workspace[i] != NULL;
    if (any) cudaCheck(cudaDeviceSynchronize());
    for (int i = 0; i < CUDA_WORKSPACE_SLOTS; i++) {
        if (g_cuda_workspace[i]) cudaCheck(cudaFree(g_cuda_workspace[i]));
        g_cuda_workspace[i] = NULL;
        g_cuda_workspace_n[i] = 0;
    }
}

#endif
