/* classifier.cuh: logit softcap, cross-entropy forward, and the fused cross-entropy + softcap backward.
 *
 * Math (per row n of the logits [N, V]; z = raw lm_head output, zc = the model's logits):
 *   softcap:   zc = cap * tanhf(z / cap)                 (in place; cap <= 0: no-op, zc = z)
 *   forward:   mx = max_i zc_i;  s = sum_i expf(zc_i - mx)  (fp32)
 *              lse[n] = (float)(log((double)s) + mx);  losses[n] = lse[n] - zc[target] (0 if target < 0
 *              or targets == NULL)
 *   backward:  d_i = expf(zc_i - lse) * dloss * dcap_i,  d_target -= dloss * dcap_target,
 *              dcap_i = 1 - (zc_i * (1/cap))^2 from the stored zc (cap <= 0: dcap = 1, no factor);
 *              rows with target < 0 are all zero. dlogits may alias logits: each element is read
 *              and then written by one thread (the target element included: its owner subtracts).
 * expf is CUDA's full-precision expf (max error 2 ulp), where the CPU uses fast_expf (its own
 * polynomial, about 1-2 ulp): the two agree to rounding, not bitwise. tanhf is CUDA's (max 2 ulp).
 * Do not build with --use_fast_math.
 * Layout: logits, dlogits [N, V] bf16 row-major (row offsets in size_t: N*V may exceed 2^31);
 * losses, lse [N] fp32; targets [N] int32.
 * Parallelism and order: one block (CE_BLOCK threads) per row. Thread t owns the 8-element packs
 * t, t + CE_BLOCK, ... (16-byte loads when V % 8 == 0 and the pointers are aligned; the same
 * elements and order otherwise); its exps are summed in that order in fp32, then block_reduce_sum
 * (a fixed tree). The max is exact in any order. No atomics.
 * CPU reference: softcap_forward, crossentropy_forward, crossentropy_softcap_backward in
 * llmc/cpu/cpu_kernels.h (there the sum of exps is accumulated in double).
 * Accounting (ew_account, COST_CLASSIFIER): nominal FLOPs a logit (expf as 1) 4 forward, 5 backward; the
 * bytes the launchers' comments list. */
#ifndef TSDC_CLASSIFIER_CUH
#define TSDC_CLASSIFIER_CUH

#include <math.h>
#include "cuda_common.cuh"
#include "convert.cuh"

#define CE_BLOCK 512

struct SoftcapOp {
    float cap;
    __device__ float operator()(float z) const { return cap * tanhf(z / cap); }
};

/* logits = cap * tanh(logits / cap), in place; cap <= 0: nothing */
static void softcap_forward(bf16* logits, size_t n, float cap, cudaStream_t stream) {
    if (cap <= 0.0f) return;
    SoftcapOp op;
    op.cap = cap;
    ew_map1(logits, logits, n, op, stream);
}

/* max over the block, every thread gets it (exact: the order does not matter) */
__device__ __forceinline__ float ce_block_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float m = partial[0];
    for (int w = 1; w < nwarps; w++) m = fmaxf(m, partial[w]);
    return m;
}

__global__ static void crossentropy_forward_kernel(float* losses, float* lse, const bf16* logits, const int* targets,
                                                   int V, bool vec) {
    const int row = blockIdx.x;
    const bf16* z = logits + (size_t)row * V;
    float mx = -INFINITY;
    for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_BLOCK * 8) {
        float f[8];
        load8_f32(f, z + c0, min(8, V - c0), vec, -INFINITY);
#pragma unroll
        for (int j = 0; j < 8; j++) mx = fmaxf(mx, f[j]);
    }
    mx = ce_block_max(mx);
    float acc = 0.0f;
    for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_BLOCK * 8) {
        const int cnt = min(8, V - c0);
        float f[8];
        load8_f32(f, z + c0, cnt, vec, 0.0f);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < cnt) acc += expf(f[j] - mx);
    }
    const float s = block_reduce_sum(acc);
    if (threadIdx.x == 0) {
        const float l = (float)(log((double)s) + (double)mx);
        lse[row] = l;
        const int tg = targets ? targets[row] : -1;
        losses[row] = tg >= 0 ? l - __bfloat162float(z[tg]) : 0.0f;
    }
}

__global__ static void crossentropy_softcap_backward_kernel(bf16* dlogits, const bf16* logits, const float* lse,
                                                            const int* targets, int V, float dloss, float cap, bool vec) {
    const int row = blockIdx.x;
    const bf16* z = logits + (size_t)row * V;
    bf16* d = dlogits + (size_t)row * V;
    const int tg = targets[row];
    if (tg < 0) { /* ignored position: no gradient */
        float zero[8];
#pragma unroll
        for (int j = 0; j < 8; j++) zero[j] = 0.0f;
        for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_BLOCK * 8) store8_bf16(d + c0, zero, min(8, V - c0), vec);
        return;
    }
    const float l = lse[row];
    const bool capped = cap > 0.0f;
    const float inv = capped ? 1.0f / cap : 0.0f;
    for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_BLOCK * 8) {
        const int cnt = min(8, V - c0);
        float f[8];
        load8_f32(f, z + c0, cnt, vec, 0.0f);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v;
            if (capped) {
                const float t = f[j] * inv;
                v = expf(f[j] - l) * dloss * (1.0f - t * t);
                if (c0 + j == tg) v -= dloss * (1.0f - t * t);
            } else {
                v = expf(f[j] - l) * dloss;
                if (c0 + j == tg) v -= dloss;
            }
            f[j] = v;
        }
        store8_bf16(d + c0, f, cnt, vec);
    }
}

/* per row: lse = logsumexp(zc), loss = lse - zc[target] (0 where target < 0 or targets == NULL) */
static void crossentropy_forward(float* losses, float* lse, const bf16* logits, const int* targets, int N, int V,
                                 cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    const bool vec = V % 8 == 0 && ptr_aligned(logits, 16);
    crossentropy_forward_kernel<<<N, CE_BLOCK, 0, stream>>>(losses, lse, logits, targets, V, vec);
    cudaCheck(cudaGetLastError());
    ew_account(COST_CLASSIFIER, "crossentropy_forward_kernel", N, 4.0 * N * V, (size_t)N * V * 2 + (size_t)N * 4, (size_t)N * 8);   /* logits, targets in; losses, lse out */
}

/* dlogits = dloss * (softmax(zc) - onehot) * (1 - (zc/cap)^2 if cap > 0); may alias logits.
 * targets must not be NULL. */
static void crossentropy_softcap_backward(bf16* dlogits, const bf16* logits, const float* lse, const int* targets,
                                          int N, int V, float dloss, float cap, cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    const bool vec = V % 8 == 0 && ptr_aligned(logits, 16) && ptr_aligned(dlogits, 16);
    crossentropy_softcap_backward_kernel<<<N, CE_BLOCK, 0, stream>>>(dlogits, logits, lse, targets, V, dloss, cap, vec);
    cudaCheck(cudaGetLastError());
    ew_account(COST_CLASSIFIER, "crossentropy_softcap_backward_kernel", N, 5.0 * N * V, (size_t)N * V * 2 + (size_t)N * 8, (size_t)N * V * 2);   /* logits, lse, targets in; dlogits out */
}

#endif
