/* fingerprint.cuh: the device side of the Q/K fingerprints (llmc/sdc/fingerprint.h: the math, shared with
 * the CPU). A kernel that produces Q or K (or, for -protect qk_bwd, their gradients) folds each stored element
 * into a thread-local Fingerprint (fp_add on the bf16 bits it writes); fp_block_reduce XORs the block's threads
 * and adds the block's result into a 128-bit accumulator in device memory with two 64-bit atomicXor. XOR is
 * associative and commutative, so the accumulator ends with the same bits whatever the order in which the
 * blocks finish: integer atomics, deterministic, and no partials buffer, no gathering kernel.
 * An accumulator is two unsigned long long words (raw, idx) that the caller zeroes before the producing
 * launches (the trainer's report is zeroed once per pass); several launches may fold into one accumulator
 * (a tensor produced in parts).
 * The fused kernels are rope_kernel (rope.cuh) and the RMSNorm kernels (rmsnorm.cuh): with an output pointer
 * they write Q/K and fingerprint what they write; with NULL they only fingerprint, so a recomputed Q or K is
 * never written out.
 * Where the result goes (no host round-trip in the trainer's layer loop, no comparison kernel): the trainer keeps
 * a layer's four accumulators (the forward's Q and K, their recomputation's) in its report, which the host
 * copies once per pass with its other results and compares there (fp_equal). Tests and the test-only dump
 * read an accumulator with fingerprint_read (it synchronises).
 * Grids of fingerprinting launches are capped at FP_MAX_GRID blocks (at most that many atomics a launch).
 * Accounting (launch_account, "qk": these launches exist for -protect qk only): fingerprinting counts a
 * nominal 4 integer operations an element at the CUDA-core rate. */
#ifndef TSDC_FINGERPRINT_CUH
#define TSDC_FINGERPRINT_CUH

#include "../cuda/cuda_common.cuh"
#include "fingerprint.h"

#define FP_MAX_GRID 1024
#define FP_WORDS 2   /* an accumulator: raw, idx */

/* the block's XOR of f, added (XOR) into acc[0], acc[1]; every thread of the block calls it */
__device__ __forceinline__ void fp_block_reduce(Fingerprint f, unsigned long long* acc) {
    for (int off = 16; off > 0; off >>= 1) {
        f.raw ^= __shfl_xor_sync(0xffffffffu, f.raw, off);
        f.idx ^= __shfl_xor_sync(0xffffffffu, f.idx, off);
    }
    __shared__ unsigned long long fp_sr[32], fp_si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { fp_sr[warp] = f.raw; fp_si[warp] = f.idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long r = 0, x = 0;
        for (int w = 0; w < (int)((blockDim.x + 31) / 32); w++) { r ^= fp_sr[w]; x ^= fp_si[w]; }
        atomicXor(acc, r);
        atomicXor(acc + 1, x);
    }
}

/* fp_block_reduce for one of several accumulators a kernel reduces in turn: nothing when acc is NULL or the tensor is
 * empty (used false), else a barrier first unless this is the first reduction (its shared arrays are read again);
 * used and acc the same for the whole block */
__device__ __forceinline__ void fp_block_reduce_next(const Fingerprint& f, unsigned long long* acc, bool used, bool* first) {
    if (!used || !acc) return;
    if (!*first) __syncthreads();
    fp_block_reduce(f, acc);
    *first = false;
}

/* an accumulator's value on the host (synchronises the stream) */
static Fingerprint fingerprint_read(const unsigned long long* acc, cudaStream_t stream) {
    unsigned long long h[FP_WORDS];
    cudaCheck(cudaMemcpyAsync(h, acc, sizeof(h), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    Fingerprint f = {h[0], h[1]};
    return f;
}
/* an accumulator set to the empty fingerprint (0, 0) */
static void fingerprint_zero(unsigned long long* acc, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(acc, 0, sizeof(unsigned long long) * FP_WORDS, stream));
}
/* an accumulator from the host's values of the report copy (the trainer) */
static inline Fingerprint fingerprint_of(const unsigned long long* host_acc) {
    Fingerprint f = {host_acc[0], host_acc[1]};
    return f;
}
static int fp_grid(size_t n) {
    size_t blocks = (n + 255) / 256;
    if (blocks > 256) blocks = 256;   /* XOR: any grid gives the same bits */
    return blocks < 1 ? 1 : (int)blocks;
}

/* fingerprint of a stored bf16 tensor (used where a fault was injected after the producing kernel) */
__global__ static void fingerprint_tensor_kernel(unsigned long long* acc, const bf16* z, size_t n) {
    Fingerprint f = {0, 0};
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        fp_add(&f, i, (uint64_t)__bfloat16_as_ushort(z[i]), 16);
    fp_block_reduce(f, acc);
}
/* XORed into the accumulator acc; does not wait */
static void qk_fingerprint_acc(unsigned long long* acc, const bf16* z, size_t n, cudaStream_t stream) {
    const int blocks = fp_grid(n);
    fingerprint_tensor_kernel<<<blocks, 256, 0, stream>>>(acc, z, n);
    cudaCheck(cudaGetLastError());
    launch_account("qk", "fingerprint_tensor_kernel", COST_FP32, blocks, 4.0 * n, (double)n * 2, (double)blocks * 16);   /* integer operations */
}
/* the same, read on the host (synchronises; workspace slot 3) */
static Fingerprint qk_fingerprint_dev(const bf16* z, size_t n, cudaStream_t stream) {
    unsigned long long* acc = (unsigned long long*)cuda_workspace_f32(3, 2 * FP_WORDS);
    fingerprint_zero(acc, stream);
    qk_fingerprint_acc(acc, z, n, stream);
    return fingerprint_read(acc, stream);
}

/* fingerprint of a row-strided bf16 view: rows x cols elements, row r at z + r*ld (ld >= cols). Element (r, c) is
 * folded at its logical index r*cols + c, so a contiguous view (ld = cols) gives the bits of qk_fingerprint_acc
 * and of the CPU's qk_fingerprint (width 16) of the same values, and a strided view those of its contiguous copy.
 * -protect qk_bwd fingerprints the backward's dq, dk (views of a fused q/k/v gradient buffer once the projections
 * share one) and their recomputation with it. Grid-stride over the logical index, at most 256 blocks of 256. */
__global__ static void fingerprint_rows_kernel(unsigned long long* acc, const bf16* z, size_t rows, size_t cols, size_t ld) {
    Fingerprint f = {0, 0};
    const size_t n = rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / cols, c = i - r * cols;
        fp_add(&f, i, (uint64_t)__bfloat16_as_ushort(z[r * ld + c]), 16);
    }
    fp_block_reduce(f, acc);
}
/* XORed into the accumulator acc; does not wait */
static void qk_fingerprint_rows_acc(unsigned long long* acc, const bf16* z, size_t rows, size_t cols, size_t ld, cudaStream_t stream) {
    if (ld < cols) tsdc_fail("qk_fingerprint_rows_acc: row stride %zu < row width %zu", ld, cols);
    const size_t n = rows * cols;
    const int blocks = fp_grid(n);
    fingerprint_rows_kernel<<<blocks, 256, 0, stream>>>(acc, z, rows, cols, ld);
    cudaCheck(cudaGetLastError());
    launch_account("qk", "fingerprint_rows_kernel", COST_FP32, blocks, 4.0 * n, (double)n * 2, (double)blocks * 16);   /* a scope relabels it (qk_bwd) */
}

#endif
