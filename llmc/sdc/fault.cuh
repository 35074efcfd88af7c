/* fault.cuh: the device side of fault injection (llmc/sdc/fault.h holds the fault model and the host
 * logic shared with the CPU trainer).
 *
 * An event's m element indices and XOR masks are drawn on the host by fault_select (the shared random
 * selection, identical to the CPU trainer's), copied to the device, and applied by one kernel that
 * XORs the mask into the raw bf16 storage bits (what fault_flip_value with width 16 does on the CPU;
 * NaN payloads are kept).
 * The tensor's RMS before and after (for the event log) and the propagation-trace differences come
 * from a deterministic two-stage reduction in double (block partials summed on the host in order).
 * Layout: any bf16 tensor viewed flat [n], or (the _ld variants) a [rows, cols] view with the row stride ld:
 * the q/k/v and gate/up views of the fused projection outputs and of their gradients (llmc/cuda/mlp.cuh,
 * train_sdc.cu). Fault indices and sums are over the logical tensor: logical index i (what fault_select
 * draws, the same on the CPU, whose tensors are contiguous) is the element at row i / cols, column
 * i % cols, stored at (i / cols) * ld + i % cols; the sums visit the logical indices in the flat order
 * (the same partials, so the same bits, as a contiguous copy). Workspace slot 2 (partials).
 * Accounting (launch_account, COST_FAULT): the injector's reductions (in double) and flips. */
#ifndef TSDC_FAULT_CUH
#define TSDC_FAULT_CUH

#include "../cuda/cuda_common.cuh"
#include "fault.h"

#define FAULT_RED_BLOCKS 256
#define FAULT_RED_THREADS 256

__global__ static void fault_flip_kernel(bf16* x, const unsigned long long* idx, const uint32_t* mask, size_t m) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (size_t)gridDim.x * blockDim.x) {
        size_t j = (size_t)idx[i];
        /* the raw 16-bit pattern, as fault_flip_value on the CPU: a round trip through fp32 and
         * __float2bfloat16_rn would turn every NaN the flip makes into the canonical 0x7FFF */
        x[j] = __ushort_as_bfloat16((unsigned short)(__bfloat16_as_ushort(x[j]) ^ (unsigned short)mask[i]));
    }
}

__device__ __forceinline__ double fault_warp_sum(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
/* part[block] = (sum (x - y)^2, sum y^2) over a fixed grid-stride set of logical indices; y NULL: (sum x^2, 0).
 * Logical index i of the [n / cols, cols] view is stored at (i / cols) * ld + i % cols (x and y alike). */
__global__ static void fault_sumsq_kernel(double* part, const bf16* x, const bf16* y, size_t n, size_t cols, size_t ld) {
    __shared__ double wa[FAULT_RED_THREADS / 32], wb[FAULT_RED_THREADS / 32];
    double a = 0.0, b = 0.0;
    for (size_t i = (size_t)blockIdx.x * FAULT_RED_THREADS + threadIdx.x; i < n; i += (size_t)FAULT_RED_BLOCKS * FAULT_RED_THREADS) {
        const size_t o = cols == ld ? i : (i / cols) * ld + i % cols;
        double xv = (double)__bfloat162float(x[o]);
        if (y) { double yv = (double)__bfloat162float(y[o]); a += (xv - yv) * (xv - yv); b += yv * yv; }
        else a += xv * xv;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    a = fault_warp_sum(a); b = fault_warp_sum(b);
    if (lane == 0) { wa[warp] = a; wb[warp] = b; }
    __syncthreads();
    if (warp == 0) {
        a = lane < FAULT_RED_THREADS / 32 ? wa[lane] : 0.0;
        b = lane < FAULT_RED_THREADS / 32 ? wb[lane] : 0.0;
        a = fault_warp_sum(a); b = fault_warp_sum(b);
        if (lane == 0) { part[2 * blockIdx.x] = a; part[2 * blockIdx.x + 1] = b; }
    }
}
/* (sum (x-y)^2, sum y^2) or (sum x^2, 0) to the host, synchronising; x, y [rows, cols] with the row stride ld */
static void fault_sumsq_ld(const bf16* x, const bf16* y, size_t rows, size_t cols, size_t ld, double* a, double* b, cudaStream_t stream) {
    *a = 0; *b = 0;
    const size_t n = rows * cols;
    if (n == 0) return;
    if (ld < cols) tsdc_fail("fault_sumsq_ld: row stride %zu below the %zu columns", ld, cols);
    double* part = (double*)cuda_workspace_f32(2, 4 * (size_t)FAULT_RED_BLOCKS);
    fault_sumsq_kernel<<<FAULT_RED_BLOCKS, FAULT_RED_THREADS, 0, stream>>>(part, x, y, n, cols, ld);
    cudaCheck(cudaGetLastError());
    launch_account(COST_FAULT, "fault_sumsq_kernel", COST_FP64, FAULT_RED_BLOCKS, (y ? 5.0 : 2.0) * n, (double)n * (y ? 4 : 2), (double)FAULT_RED_BLOCKS * 16);
    static double h[2 * FAULT_RED_BLOCKS];
    cudaCheck(cudaMemcpyAsync(h, part, sizeof(h), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    for (int i = 0; i < FAULT_RED_BLOCKS; i++) { *a += h[2 * i]; *b += h[2 * i + 1]; }
}
static void fault_sumsq(const bf16* x, const bf16* y, size_t n, double* a, double* b, cudaStream_t stream) {
    fault_sumsq_ld(x, y, 1, n, n, a, b, stream);
}

/* apply the current event to the bf16 device tensor [rows, cols] stored with the row stride ld, and log it: the
 * logical indices fault_select draws are mapped to their storage offsets on the host before the upload */
static void fault_apply_device_ld(FaultCtx* fx, bf16* x, size_t rows, size_t cols, size_t ld, cudaStream_t stream) {
    const size_t n = rows * cols;
    size_t m = fault_count(&fx->ev, n);
    double s0, s1, unused;
    size_t live = 0;
    fault_sumsq_ld(x, NULL, rows, cols, ld, &s0, &unused, stream);
    if (m > 0) {
        size_t* idx = (size_t*)mallocCheck(sizeof(size_t) * m);
        uint32_t* mask = (uint32_t*)mallocCheck(sizeof(uint32_t) * m);
        fault_select(&fx->ev, n, m, 16, idx, mask);
        live = fault_live_count(fx, idx, m);   /* of the logical indices */
        if (ld != cols)
            for (size_t i = 0; i < m; i++) idx[i] = idx[i] / cols * ld + idx[i] % cols;
        unsigned long long* d_idx;
        uint32_t* d_mask;
        cudaCheck(cudaMalloc(&d_idx, sizeof(unsigned long long) * m));
        cudaCheck(cudaMalloc(&d_mask, sizeof(uint32_t) * m));
        static_assert(sizeof(size_t) == sizeof(unsigned long long), "size_t is 64-bit");
        cudaCheck(cudaMemcpyAsync(d_idx, idx, sizeof(unsigned long long) * m, cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaMemcpyAsync(d_mask, mask, sizeof(uint32_t) * m, cudaMemcpyHostToDevice, stream));
        int blocks = (int)((m + 255) / 256 < 1024 ? (m + 255) / 256 : 1024);
        fault_flip_kernel<<<blocks, 256, 0, stream>>>(x, d_idx, d_mask, m);
        cudaCheck(cudaGetLastError());
        launch_account(COST_FAULT, "fault_flip_kernel", COST_FP32, blocks, (double)m, (double)m * 14, (double)m * 2);
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(d_idx)); cudaCheck(cudaFree(d_mask));
        free(idx); free(mask);
    }
    fault_sumsq_ld(x, NULL, rows, cols, ld, &s1, &unused, stream);
    fault_log_event(fx, n, m, live, sqrt(s0 / (double)(n ? n : 1)), sqrt(s1 / (double)(n ? n : 1)));
}
/* apply the current event to a contiguous bf16 device tensor of n elements and log it */
static void fault_apply_device(FaultCtx* fx, bf16* x, size_t n, cudaStream_t stream) { fault_apply_device_ld(fx, x, 1, n, n, stream); }

#endif
