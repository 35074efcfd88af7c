/* checksum.cuh: tsdc_checksum (llmc/host/checksum.h) of device memory, without copying it to the host.
 *
 * Math:   check = n_bytes G + sum_i fin(w_i + (i+1) G) (mod 2^64) over the little-endian u64 words w_i
 *         of the bytes (the last one zero-padded), exactly as the host's tsdc_checksum.
 * Order:  integer sums mod 2^64 are associative and commutative, so the grid's partial sums combined
 *         with an atomicAdd give the same value on every run, equal to the host's.
 * Layout: data any device pointer, 8-byte aligned (cudaMalloc'd arrays are); n in bytes, size_t.
 * Uses workspace slot 0 (one u64); synchronises `stream` (the result is needed on the host). */
#ifndef TSDC_CHECKSUM_CUH
#define TSDC_CHECKSUM_CUH

#include "cuda_common.cuh"
#include "../host/checksum.h"

__global__ static void checksum_words_kernel(unsigned long long* out, const uint64_t* w, size_t nw) {
    unsigned long long s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nw; i += (size_t)gridDim.x * blockDim.x)
        s += splitmix64_fin(w[i] + ((uint64_t)i + 1) * TSDC_GOLDEN);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

static uint64_t tsdc_checksum_gpu(const void* data, size_t n, cudaStream_t stream) {
    size_t nw = n / 8, rem = n - nw * 8;
    unsigned long long* d = (unsigned long long*)cuda_workspace_f32(0, 2);
    unsigned long long sum = 0;
    cudaCheck(cudaMemsetAsync(d, 0, sizeof(sum), stream));
    if (nw) {
        size_t blocks = CEIL_DIV(nw, (size_t)256);
        if (blocks > 4096) blocks = 4096;
        checksum_words_kernel<<<(int)blocks, 256, 0, stream>>>(d, (const uint64_t*)data, nw);
        cudaCheck(cudaGetLastError());
        launch_account(COST_MISC, "checksum_words_kernel", COST_FP32, (unsigned)blocks, 4.0 * nw, (double)nw * 8, 8.0);   /* integer operations */
    }
    cudaCheck(cudaMemcpyAsync(&sum, d, sizeof(sum), cudaMemcpyDeviceToHost, stream));
    uint64_t tail = 0;
    if (rem) cudaCheck(cudaMemcpyAsync(&tail, (const char*)data + nw * 8, rem, cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    if (rem) sum += splitmix64_fin(tail + ((uint64_t)nw + 1) * TSDC_GOLDEN);
    return (uint64_t)n * TSDC_GOLDEN + sum;
}

#endif
