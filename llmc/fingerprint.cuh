/* fingerprint.cuh: the device side of the Q/K fingerprints (llmc/fingerprint.h: the math, shared with
 * the CPU). A kernel that produces Q or K folds each stored element into a thread-local Fingerprint
 * (fp_add on the bf16 bits it writes); fp_block_reduce XORs the block's threads (XOR: any order gives
 * the same bits) into part[2*block], part[2*block+1]; fingerprint_collect XORs the blocks on the host.
 * The fused kernels are rope_kernel (rope.cuh) and rmsnorm_forward_kernel (rmsnorm.cuh): with an output
 * pointer they write Q/K and fingerprint what they write; with NULL they only fingerprint, so a
 * recomputed Q or K is never written out. Fingerprint grids are capped at FP_MAX_GRID blocks.
 * Partials: workspace slot 3. */
#ifndef TSDC_FINGERPRINT_CUH
#define TSDC_FINGERPRINT_CUH

#include "cuda_common.cuh"
#include "fingerprint.h"

#define FP_MAX_GRID 1024

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

/* fingerprint of a stored bf16 tensor (used where a fault was injected after the producing kernel) */
__global__ static void fingerprint_tensor_kernel(unsigned long long* part, const bf16* z, size_t n) {
    Fingerprint f = {0, 0};
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        fp_add(&f, i, (uint64_t)__bfloat16_as_ushort(z[i]), 16);
    fp_block_reduce(f, part);
}
static Fingerprint qk_fingerprint_dev(const bf16* z, size_t n, cudaStream_t stream) {
    unsigned long long* part = fingerprint_partials();
    int blocks = (int)(n < (size_t)256 * 256 ? (n + 255) / 256 : 256); /* XOR: any grid gives the same bits */
    if (blocks < 1) blocks = 1;
    fingerprint_tensor_kernel<<<blocks, 256, 0, stream>>>(part, z, n);
    cudaCheck(cudaGetLastError());
    return fingerprint_collect(part, blocks, stream);
}

#endif
