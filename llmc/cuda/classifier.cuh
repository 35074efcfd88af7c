/* classifier.cuh: logit softcap, cross-entropy forward, the fused cross-entropy + softcap backward, and the
 * one-pass classifier that does the forward's and the backward's work in one kernel (crossentropy_fused, below).
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
 * elements and order otherwise); its exps are summed in that order in fp32, then over the block in
 * block_reduce_sum's fixed tree (ce_row_sum). The max is exact in any order. No atomics.
 * CPU reference: softcap_forward, crossentropy_forward, crossentropy_softcap_backward in
 * llmc/cpu/cpu_kernels.h (there the sum of exps is accumulated in double).
 * Accounting (ew_account, COST_CLASSIFIER): nominal FLOPs a logit (expf as 1) 4 forward, 5 backward, 9 fused; the
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

/* A row's max and sum over the block, every thread getting each, for kernels that reduce one row at a time (a block a
 * row, or rows in turn): ce_row_max (exact in any order), then ce_row_sum (block_reduce_sum's tree: each warp's
 * butterfly, then the warp sums in warp order through warp 0: the same bits). Three barriers a row, none before a
 * write: each shared array is rewritten only after a barrier that every reader of its last value has passed (the
 * maxima are read before the sum's first barrier, the warp sums before its second, the total before the next row's
 * max barrier), so the rows of a block need no barrier between them. */
struct CeRowShared { float pmax[32], psum[32], total; };
__device__ __forceinline__ float ce_row_max(CeRowShared& sh, float v) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce_max(v);
    if (lane == 0) sh.pmax[warp] = v;
    __syncthreads();
    float m = sh.pmax[0];
    for (int w = 1; w < nwarps; w++) m = fmaxf(m, sh.pmax[w]);
    return m;
}
__device__ __forceinline__ float ce_row_sum(CeRowShared& sh, float v) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce_sum(v);
    if (lane == 0) sh.psum[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nwarps ? sh.psum[lane] : 0.0f;
        t = warp_reduce_sum(t);
        if (lane == 0) sh.total = t;
    }
    __syncthreads();
    return sh.total;
}

__global__ static void crossentropy_forward_kernel(float* losses, float* lse, const bf16* logits, const int* targets,
                                                   int V, bool vec) {
    const int row = blockIdx.x;
    const bf16* z = logits + (size_t)row * V;
    __shared__ CeRowShared sh;
    float mx = -INFINITY;
    for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_BLOCK * 8) {
        float f[8];
        load8_f32(f, z + c0, min(8, V - c0), vec, -INFINITY);
#pragma unroll
        for (int j = 0; j < 8; j++) mx = fmaxf(mx, f[j]);
    }
    mx = ce_row_max(sh, mx);
    float acc = 0.0f;
    for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_BLOCK * 8) {
        const int cnt = min(8, V - c0);
        float f[8];
        load8_f32(f, z + c0, cnt, vec, 0.0f);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < cnt) acc += expf(f[j] - mx);
    }
    const float s = ce_row_sum(sh, acc);
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

/* ------------------------------------------------------------------ the one-pass classifier
 * crossentropy_fused: the forward's losses and lse and the backward's dlogits of a training microbatch in one
 * kernel, dlogits written in place over the logits (as llm.c's fused classifier). The two-pass path reads
 * the logits in crossentropy_forward (its max and its sum loop) and again in crossentropy_softcap_backward;
 * this one reads each row once from HBM for an online softmax and a second time to write dlogits.
 * Math per row (zc = the logits as stored, capped or not):
 *   per thread, over its packs in order: pm = max of the pack; if pm > m: s = s * expf(m - pm), m = pm;
 *   then s += expf(zc_i - m) for each element of the pack in order (m starts at -inf, s at 0);
 *   M = max_t m_t (exact); S = ce_row_sum(s_t * expf(m_t - M)) (block_reduce_sum's tree); lse = (float)(log((double)S) + M);
 *   loss = lse - zc[target] (0 where target < 0); dlogits as crossentropy_softcap_backward from this lse.
 * The online sum rounds differently from the two-pass sum (the rescalings), so lse and losses agree with
 * crossentropy_forward's to fp32 rounding, not bitwise; the same inputs give the same bits every run.
 * Parallelism: CE_FUSED_BLOCK (1024) threads a block and min(N, number of SMs) blocks, each taking rows
 * blockIdx.x, blockIdx.x + gridDim.x, ...; thread t owns the 8-element packs t, t + CE_FUSED_BLOCK, ... of a
 * row in both of its passes. One block a row at a time per SM keeps the rows in flight to about one per SM
 * (132 x 256 KB = 34 MB at V 128256 on an H100/H200, under their 50 MB of L2), so the second read of a row
 * finds it in L2 rather than HBM; the row does not fit in shared memory (256 KB > 227 KB). That L2 hit is a
 * prediction (no GPU measured it). The target's logit is read by thread 0 before the block's first barrier,
 * so before any thread overwrites it; every other element is read and then written by its owner only.
 * When the host loop uses it: a training microbatch whose backward follows with nothing reading the logits
 * in between (train_sdc.cu model_classifier_fused_next, docs/cuda_kernels.md). */
#define CE_FUSED_BLOCK 1024

__global__ static void __launch_bounds__(CE_FUSED_BLOCK)
crossentropy_fused_kernel(float* losses, float* lse, bf16* logits, const int* targets, int N, int V, float dloss, float cap, bool vec) {
    const bool capped = cap > 0.0f;
    const float inv = capped ? 1.0f / cap : 0.0f;
    __shared__ CeRowShared sh;
    for (int row = blockIdx.x; row < N; row += gridDim.x) {
        bf16* z = logits + (size_t)row * V;
        const int tg = targets[row];
        const float ztg = threadIdx.x == 0 && tg >= 0 ? __bfloat162float(z[tg]) : 0.0f;
        float m = -INFINITY, acc = 0.0f;
        for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_FUSED_BLOCK * 8) {
            const int cnt = min(8, V - c0);
            float f[8];
            load8_f32(f, z + c0, cnt, vec, -INFINITY);
            float pm = f[0];
#pragma unroll
            for (int j = 1; j < 8; j++) pm = fmaxf(pm, f[j]);
            if (pm == -INFINITY) continue;   /* nothing to add (and m - pm would be -inf - -inf) */
            if (pm > m) { acc *= expf(m - pm); m = pm; }
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < cnt) acc += expf(f[j] - m);
        }
        const float M = ce_row_max(sh, m);
        const float S = ce_row_sum(sh, m == -INFINITY ? 0.0f : acc * expf(m - M));
        const float l = (float)(log((double)S) + (double)M);
        if (threadIdx.x == 0) {
            lse[row] = l;
            losses[row] = tg >= 0 ? l - ztg : 0.0f;
        }
        for (int c0 = threadIdx.x * 8; c0 < V; c0 += CE_FUSED_BLOCK * 8) {
            const int cnt = min(8, V - c0);
            float f[8];
            load8_f32(f, z + c0, cnt, vec, 0.0f);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float v;
                if (tg < 0) v = 0.0f;
                else if (capped) {
                    const float t = f[j] * inv;
                    v = expf(f[j] - l) * dloss * (1.0f - t * t);
                    if (c0 + j == tg) v -= dloss * (1.0f - t * t);
                } else {
                    v = expf(f[j] - l) * dloss;
                    if (c0 + j == tg) v -= dloss;
                }
                f[j] = v;
            }
            store8_bf16(z + c0, f, cnt, vec);
        }
    }
}

static int ce_fused_grid(int N) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        cudaDeviceProp prop;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaGetDeviceProperties(&prop, dev));
        sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    }
    return N < sms ? N : sms;
}

/* per row: lse, loss (0 where target < 0) and, in place over the logits, dlogits = dloss * (softmax(zc) -
 * onehot) * (1 - (zc/cap)^2 if cap > 0); targets must not be NULL. Afterwards the logits are gone. */
static void crossentropy_fused(float* losses, float* lse, bf16* logits, const int* targets, int N, int V, float dloss, float cap,
                               cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    const bool vec = V % 8 == 0 && ptr_aligned(logits, 16);
    crossentropy_fused_kernel<<<ce_fused_grid(N), CE_FUSED_BLOCK, 0, stream>>>(losses, lse, logits, targets, N, V, dloss, cap, vec);
    cudaCheck(cudaGetLastError());
    /* logits and targets in, dlogits, losses and lse out; the second read of a row (L2) is not compulsory traffic */
    ew_account(COST_CLASSIFIER, "crossentropy_fused_kernel", ce_fused_grid(N), 9.0 * N * V, (size_t)N * V * 2 + (size_t)N * 4, (size_t)N * V * 2 + (size_t)N * 8);
}

#endif
