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

/* The block's XOR of NF fingerprints (NF = 1, 2 or 4), each added (XOR) into its accumulator acc[j] (acc[j] NULL: not
 * kept); every thread of the block calls it, the block a whole number of warps, acc the same for the whole block.
 * A warp's 2 NF words are reduced as a reduce-scatter butterfly: at each of the first log2(2 NF) levels a lane
 * exchanges half of the words it still holds with the partner lane (__shfl_xor_sync, distance 16, 8, ..) and keeps the
 * XOR of the other half; then the one word left is reduced over the remaining distances. Lane L ends holding word
 * (L >> (5 - log2(2 NF))) of the warp's XOR: 2 NF - 1 + 5 - log2(2 NF) shuffles (9 for four fingerprints) where a
 * butterfly a word takes 10 NF (40). Each word's lane group leader puts it in shared memory, one barrier, and thread j
 * XORs word j over the warps into its accumulator (one atomicXor a word). XOR in any order: the accumulators' bits are
 * those of any other reduction of the same elements. */
template <int NF>
__device__ __forceinline__ void fp_block_reduce_n(const Fingerprint* f, unsigned long long* const* acc) {
    static_assert(NF == 1 || NF == 2 || NF == 4, "fp_block_reduce_n: 1, 2 or 4 fingerprints");
    constexpr int W = 2 * NF, LS = NF == 1 ? 1 : NF == 2 ? 2 : 3;   /* words a lane holds; log2(W) */
    unsigned long long w[W];
#pragma unroll
    for (int j = 0; j < NF; j++) { w[2 * j] = f[j].raw; w[2 * j + 1] = f[j].idx; }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < LS; k++) {   /* keep the lower half (the lane's bit 4 - k clear) or the upper, send the other */
        const int off = 16 >> k, half = W >> (k + 1);
        const bool up = (lane & off) != 0;
#pragma unroll
        for (int j = 0; j < half; j++) {
            const unsigned long long r = __shfl_xor_sync(0xffffffffu, up ? w[j] : w[j + half], off);
            w[j] = (up ? w[j + half] : w[j]) ^ r;
        }
    }
#pragma unroll
    for (int off = 16 >> LS; off > 0; off >>= 1) w[0] ^= __shfl_xor_sync(0xffffffffu, w[0], off);
    __shared__ unsigned long long fp_s[W][32];
    if ((lane & ((32 >> LS) - 1)) == 0) fp_s[lane >> (5 - LS)][warp] = w[0];
    __syncthreads();
    if (threadIdx.x < W && acc[threadIdx.x >> 1]) {
        unsigned long long r = 0;
        for (int q = 0; q < (int)((blockDim.x + 31) / 32); q++) r ^= fp_s[threadIdx.x][q];
        atomicXor(acc[threadIdx.x >> 1] + (threadIdx.x & 1), r);
    }
}
/* one fingerprint: the block's XOR of f, added (XOR) into acc[0], acc[1] */
__device__ __forceinline__ void fp_block_reduce(Fingerprint f, unsigned long long* acc) { fp_block_reduce_n<1>(&f, &acc); }
/* four (a tensor that is empty or not kept: its acc NULL) */
__device__ __forceinline__ void fp_block_reduce4(const Fingerprint& f0, const Fingerprint& f1, const Fingerprint& f2, const Fingerprint& f3,
                                                 unsigned long long* a0, unsigned long long* a1, unsigned long long* a2, unsigned long long* a3) {
    const Fingerprint f[4] = {f0, f1, f2, f3};
    unsigned long long* const acc[4] = {a0, a1, a2, a3};
    fp_block_reduce_n<4>(f, acc);
}
/* two */
__device__ __forceinline__ void fp_block_reduce2(const Fingerprint& f0, const Fingerprint& f1, unsigned long long* a0, unsigned long long* a1) {
    const Fingerprint f[2] = {f0, f1};
    unsigned long long* const acc[2] = {a0, a1};
    fp_block_reduce_n<2>(f, acc);
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
