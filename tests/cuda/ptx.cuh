/* tests/cuda/ptx.cuh (part of test_sdc.cu): the wrappers of llmc/cuda/ptx.cuh in small kernels. */
#ifndef TSDC_TESTS_CUDA_PTX_CUH
#define TSDC_TESTS_CUDA_PTX_CUH

#include "../../llmc/cuda/ptx.cuh"

/* every wrapper once (one warp): cuda-check compiles each instruction for sm_80 and sm_90 */
__global__ void ptx_all_wrappers_kernel(float* out, const bf16* src) {
    __shared__ __align__(16) bf16 tile[32 * 8];
    const int lane = threadIdx.x & 31;
    cp_async_16(&tile[lane * 8], src + lane * 8, 16);
    cp_async_commit();
    cp_async_wait<0>();
    cp_async_16(&tile[lane * 8], src + lane * 8, 8);
    cp_async_wait_all();
    __syncthreads();
    uint32_t r1[1], r2[2], r4[4], t1[1], t2[2], t4[4];
    ldmatrix_x1(r1, &tile[(lane & 7) * 8]);
    ldmatrix_x2(r2, &tile[(lane & 15) * 8]);
    ldmatrix_x4(r4, &tile[lane * 8]);
    ldmatrix_x1_trans(t1, &tile[(lane & 7) * 8]);
    ldmatrix_x2_trans(t2, &tile[(lane & 15) * 8]);
    ldmatrix_x4_trans(t4, &tile[lane * 8]);
    const uint32_t b[2] = {r2[0] ^ t2[0], r2[1] ^ t2[1] ^ r1[0] ^ t1[0]};
    const uint32_t a[4] = {r4[0] ^ t4[0], r4[1] ^ t4[1], r4[2] ^ t4[2], r4[3] ^ pack_bf16x2(1.0f, 2.0f)};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_bf16_16816(d, a, b, d);
    for (int i = 0; i < 4; i++) out[lane * 4 + i] = d[i];
}

#endif
