/* init.cuh: the weight initialisation on the GPU, the twin of init_weights_cpu (llmc/cpu/init.h).
 *
 * Math:   as llmc/cpu/init.h: pair j of tensor i is init_normal_pair(init_tensor_key(seed, i), j), scaled by
 *         0.02 (matrices, embeddings); vectors (norm weights) are 1. The same function, compiled for the
 *         device, so the GPU's weights are bit-identical to the CPU trainer's for the same seed.
 * Layout: params fp32 [P], tensors at their layout offsets; one thread per pair (grid-stride, size_t).
 * Accounting (launch_account, COST_MISC: before training): a nominal 20 operations a normal sample. */
#ifndef TSDC_INIT_CUH
#define TSDC_INIT_CUH

#include "cuda_common.cuh"
#include "convert.cuh"
#include "../cpu/init.h"

__global__ static void init_normal_kernel(float* p, size_t n, uint64_t key, float std_) {
    size_t np = (n + 1) / 2;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < np; j += (size_t)gridDim.x * blockDim.x) {
        float z0, z1;
        init_normal_pair(key, j, &z0, &z1);
        p[2 * j] = std_ * z0;
        if (2 * j + 1 < n) p[2 * j + 1] = std_ * z1;
    }
}

__global__ static void init_fill_kernel(float* p, size_t n, float value) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = value;
}

/* every tensor of layout L into the device array params (asynchronous on `stream`) */
static void init_weights_gpu(float* params, const ParamLayout* L, uint64_t seed, cudaStream_t stream) {
    for (int i = 0; i < L->n; i++) {
        const TensorInfo* t = &L->t[i];
        float* p = params + t->offset;
        if (t->rows == 1) init_fill_kernel<<<ew_grid(t->numel), EW_BLOCK, 0, stream>>>(p, t->numel, 1.0f);
        else init_normal_kernel<<<ew_grid((t->numel + 1) / 2), EW_BLOCK, 0, stream>>>(p, t->numel, init_tensor_key(seed, i), INIT_STD);
        cudaCheck(cudaGetLastError());
        launch_account(COST_MISC, t->rows == 1 ? "init_fill_kernel" : "init_normal_kernel", COST_FP32, t->rows == 1 ? ew_grid(t->numel) : ew_grid((t->numel + 1) / 2), t->rows == 1 ? 0.0 : 20.0 * t->numel, 0.0, (double)t->numel * 4);
    }
}

#endif
