/* fingerprint.cuh: the device side of the Q/K fingerprints (llmc/sdc/fingerprint.h: the math, shared with
 * the CPU). A kernel that produces Q or K folds each stored element into a thread-local Fingerprint
 * (fp_add on the bf16 bits it writes); fp_block_reduce XORs the block's threads (XOR: any order gives
 * the same bits) into part[2*block], part[2*block+1]. Fingerprint grids are capped at FP_MAX_GRID blocks,
 * so a fingerprint's partials fit FP_PART_U64 words.
 * The fused kernels are rope_kernel (rope.cuh) and rmsnorm_forward_kernel (rmsnorm.cuh): with an output
 * pointer they write Q/K and fingerprint what they write; with NULL they only fingerprint, so a
 * recomputed Q or K is never written out.
 * Where the result goes (no host round-trip in the trainer's layer loop):
 * - on the device: the launchers take the partials buffer and return the block count without waiting;
 *   fp_compare (one block) XORs the partials of the forward's Q and K and of their recomputation,
 *   and writes flag[0] = 1 when either half of either fingerprint differs, else 0. The trainer copies
 *   the flags to the host once per microbatch with its other results.
 * - on the host (tests): fingerprint_collect XORs the blocks there; it synchronises. qk_fingerprint_dev
 *   and the *_fp_host wrappers use workspace slot 3.
 * Accounting (launch_account, "qk": these launches exist for -protect qk only): fingerprinting counts a
 * nominal 4 integer operations an element at the CUDA-core rate. */
#ifndef TSDC_FINGERPRINT_CUH
#define TSDC_FINGERPRINT_CUH

#include "../cuda/cuda_common.cuh"
#include "fingerprint.h"

#define FP_MAX_GRID 1024
#define FP_PART_U64 (2 * FP_MAX_GRID)   /* words of one fingerprint's partials */

__device__ __forceinline__ void fp_block_reduce(Fingerprint f, unsigned long long* part) {
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
        part[2 * blockIdx.x] = r;
        part[2 * blockIdx.x + 1] = x;
    }
}

static unsigned long long* fingerprint_partials(void) {
    return (unsigned long long*)cuda_workspace_f32(3, 4 * (size_t)FP_MAX_GRID);
}
/* XOR of `blocks` partials (synchronises the stream) */
static Fingerprint fingerprint_collect(const unsigned long long* part, int blocks, cudaStream_t stream) {
    static unsigned long long h[2 * FP_MAX_GRID];
    cudaCheck(cudaMemcpyAsync(h, part, sizeof(unsigned long long) * 2 * blocks, cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    Fingerprint f = {0, 0};
    for (int b = 0; b < blocks; b++) { f.raw ^= h[2 * b]; f.idx ^= h[2 * b + 1]; }
    return f;
}

/* the XOR of a fingerprint's block partials, computed by all threads of one block (XOR: any order) */
__device__ __forceinline__ Fingerprint fp_gather(const unsigned long long* part, int blocks) {
    Fingerprint f = {0, 0};
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) { f.raw ^= part[2 * b]; f.idx ^= part[2 * b + 1]; }
    for (int off = 16; off > 0; off >>= 1) {
        f.raw ^= __shfl_xor_sync(0xffffffffu, f.raw, off);
        f.idx ^= __shfl_xor_sync(0xffffffffu, f.idx, off);
    }
    __shared__ unsigned long long g_r[32], g_i[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();   /* a previous call may still read g_r / g_i */
    if (lane == 0) { g_r[warp] = f.raw; g_i[warp] = f.idx; }
    __syncthreads();
    Fingerprint t = {0, 0};
    for (int w = 0; w < (int)((blockDim.x + 31) / 32); w++) { t.raw ^= g_r[w]; t.idx ^= g_i[w]; }
    return t;
}
/* flag[0] = 1 when fq != rq or fk != rk (each the XOR of its partials), else 0. One block of 256. */
__global__ static void fp_compare_kernel(int* flag, const unsigned long long* fq, int bq, const unsigned long long* fk, int bk,
                                         const unsigned long long* rq, int brq, const unsigned long long* rk, int brk) {
    const Fingerprint a = fp_gather(fq, bq), b = fp_gather(fk, bk), c = fp_gather(rq, brq), d = fp_gather(rk, brk);
    if (threadIdx.x == 0) flag[0] = (a.raw != c.raw || a.idx != c.idx || b.raw != d.raw || b.idx != d.idx) ? 1 : 0;
}
static void fp_compare(int* flag, const unsigned long long* fq, int bq, const unsigned long long* fk, int bk,
                       const unsigned long long* rq, int brq, const unsigned long long* rk, int brk, cudaStream_t stream) {
    fp_compare_kernel<<<1, 256, 0, stream>>>(flag, fq, bq, fk, bk, rq, brq, rk, brk);
    cudaCheck(cudaGetLastError());
    launch_account("qk", "fp_compare_kernel", COST_FP32, 1, 2.0 * (bq + bk + brq + brk), 16.0 * (bq + bk + brq + brk), 4.0);   /* the partials in; the flag out */
}

/* fingerprint of a stored bf16 tensor (used where a fault was injected after the producing kernel) */
__global__ static void fingerprint_tensor_kernel(unsigned long long* part, const bf16* z, size_t n) {
    Fingerprint f = {0, 0};
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        fp_add(&f, i, (uint64_t)__bfloat16_as_ushort(z[i]), 16);
    fp_block_reduce(f, part);
}
/* into part (FP_PART_U64 words); returns the block count, does not wait */
static int qk_fingerprint_part(unsigned long long* part, const bf16* z, size_t n, cudaStream_t stream) {
    int blocks = (int)(n < (size_t)256 * 256 ? (n + 255) / 256 : 256); /* XOR: any grid gives the same bits */
    if (blocks < 1) blocks = 1;
    fingerprint_tensor_kernel<<<blocks, 256, 0, stream>>>(part, z, n);
    cudaCheck(cudaGetLastError());
    launch_account("qk", "fingerprint_tensor_kernel", COST_FP32, blocks, 4.0 * n, (double)n * 2, (double)blocks * 16);   /* integer operations */
    return blocks;
}
/* the same, collected on the host (synchronises) */
static Fingerprint qk_fingerprint_dev(const bf16* z, size_t n, cudaStream_t stream) {
    unsigned long long* part = fingerprint_partials();
    return fingerprint_collect(part, qk_fingerprint_part(part, z, n, stream), stream);
}

/* fingerprint of a row-strided bf16 view: rows x cols elements, row r at z + r*ld (ld >= cols). Element (r, c) is
 * folded at its logical index r*cols + c, so a contiguous view (ld = cols) gives the bits of qk_fingerprint_part
 * and of the CPU's qk_fingerprint (width 16) of the same values, and a strided view those of its contiguous copy.
 * -protect qk_bwd fingerprints the backward's dq, dk (views of a fused q/k/v gradient buffer once the projections
 * share one) and their recomputation with it. Grid-stride over the logical index, at most 256 blocks of 256. */
__global__ static void fingerprint_rows_kernel(unsigned long long* part, const bf16* z, size_t rows, size_t cols, size_t ld) {
    Fingerprint f = {0, 0};
    const size_t n = rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / cols, c = i - r * cols;
        fp_add(&f, i, (uint64_t)__bfloat16_as_ushort(z[r * ld + c]), 16);
    }
    fp_block_reduce(f, part);
}
/* into part (FP_PART_U64 words); returns the block count, does not wait */
static int qk_fingerprint_rows_part(unsigned long long* part, const bf16* z, size_t rows, size_t cols, size_t ld, cudaStream_t stream) {
    if (ld < cols) tsdc_fail("qk_fingerprint_rows_part: row stride %zu < row width %zu", ld, cols);
    const size_t n = rows * cols;
    int blocks = (int)(n < (size_t)256 * 256 ? (n + 255) / 256 : 256);
    if (blocks < 1) blocks = 1;
    fingerprint_rows_kernel<<<blocks, 256, 0, stream>>>(part, z, rows, cols, ld);
    cudaCheck(cudaGetLastError());
    launch_account("qk", "fingerprint_rows_kernel", COST_FP32, blocks, 4.0 * n, (double)n * 2, (double)blocks * 16);   /* a scope relabels it (qk_bwd) */
    return blocks;
}

#endif
