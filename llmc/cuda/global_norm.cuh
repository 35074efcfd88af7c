/* global_norm.cuh: the squared global L2 norm of the fp32 gradients, deterministic.
 *
 * Math:   sum_i g[i]^2, each square and every partial sum in double (as sumsq_det() on the CPU:
 *         an fp32 gradient squared in double cannot overflow, so a fault that makes one gradient
 *         huge gives a huge finite norm on both trainers, not inf on one of them).
 * Order (fixed for a given n, independent of the device): a grid of exactly GNORM_BLOCKS blocks of
 * GNORM_THREADS threads; thread t (global index) sums i = t, t + G, t + 2G, ... (G = all threads) in
 * order; each block combines its threads with a fixed shuffle tree (xor offsets 16..1 per warp, then
 * the warp sums through warp 0 the same way) into part[block] (double, workspace slot 1). The
 * GNORM_BLOCKS partials are copied to the host and summed there in index order.
 * The call synchronises the stream (the result is needed on the host for clipping).
 * Layout: g fp32 [n], n size_t.
 * CPU reference: sumsq_det in llmc/cpu/cpu_kernels.h (chunked in a different order: equal to rounding
 * in double).
 * The trainer's step takes its norms from llmc/cuda/multi_tensor.cuh (per tensor, one pass, one copy); this
 * file's sum serves arbitrary ranges and the tests.
 * Accounting (launch_account, COST_OPTIMIZER; not in -stats' element-wise bytes): 3 FLOPs an element. */
#ifndef TSDC_GLOBAL_NORM_CUH
#define TSDC_GLOBAL_NORM_CUH

#include "cuda_common.cuh"

#define GNORM_BLOCKS 1024
#define GNORM_THREADS 256

__device__ __forceinline__ double gnorm_warp_sum(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* the block's threads' sums combined in the fixed tree into part[blockIdx.x] (every kernel that
 * follows this file's order ends with it: global_norm_partials_kernel, train_sdc.cu's update norm) */
__device__ __forceinline__ void gnorm_block_reduce(double acc, double* part) {
    __shared__ double warp_part[GNORM_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    acc = gnorm_warp_sum(acc);
    if (lane == 0) warp_part[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        double s = lane < GNORM_THREADS / 32 ? warp_part[lane] : 0.0;
        s = gnorm_warp_sum(s);
        if (lane == 0) part[blockIdx.x] = s;
    }
}

__global__ static void global_norm_partials_kernel(double* part, const float* g, size_t n, float scale) {
    const size_t stride = (size_t)GNORM_BLOCKS * GNORM_THREADS;
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * GNORM_THREADS + threadIdx.x; i < n; i += stride) {
        const double x = (double)(g[i] * scale);
        acc += x * x;
    }
    gnorm_block_reduce(acc, part);
}

/* sum of squares of (g[i] * scale) for i in [0, n) (the fp32 product: scale 1 is g itself), returned to the
 * host (synchronises `stream`). Uses workspace slot 1. */
static double global_norm_squared_scaled(const float* g, size_t n, float scale, cudaStream_t stream) {
    if (n == 0) return 0.0;
    /* GNORM_BLOCKS doubles in a float workspace (cudaMalloc memory is 256-byte aligned) */
    double* part = (double*)cuda_workspace_f32(1, 2 * (size_t)GNORM_BLOCKS);
    global_norm_partials_kernel<<<GNORM_BLOCKS, GNORM_THREADS, 0, stream>>>(part, g, n, scale);
    cudaCheck(cudaGetLastError());
    launch_account(COST_OPTIMIZER, "global_norm_partials_kernel", COST_FP32, GNORM_BLOCKS, 3.0 * n, (double)n * 4, (double)GNORM_BLOCKS * 8);
    static double host_part[GNORM_BLOCKS];
    cudaCheck(cudaMemcpyAsync(host_part, part, sizeof(host_part), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    double s = 0.0;
    for (int b = 0; b < GNORM_BLOCKS; b++) s += host_part[b];
    return s;
}
static double global_norm_squared(const float* g, size_t n, cudaStream_t stream) { return global_norm_squared_scaled(g, n, 1.0f, stream); }

#endif
