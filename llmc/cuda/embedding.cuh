/* embedding.cuh: token embedding lookup (forward) and its gradient (backward), without atomics.
 *
 * Math:   out[n, c] = wte[tokens[n], c]                 (a bf16 copy)
 *         dwte[tokens[n], c] += dout[n, c] for n = 0 .. N-1 in order (fp32)
 * Layout: tokens [N] int32; wte [V, C] bf16; out, dout [N, C] bf16; dwte [V, C] fp32.
 * Backward, deterministic and in the CPU's exact order: a thread owns one channel c and one slice
 * of the vocabulary (tokens with tok % EMB_BWD_SLICES == slice). It walks n = 0 .. N-1 in order
 * (tokens staged in shared memory a chunk at a time) and for each token of its slice does
 * dwte[tok, c] = dwte[tok, c] + dout[n, c]. No other thread touches (tok, c), so there is no race,
 * and each (tok, c) receives its terms in token order starting from the existing value: the same
 * sequence of fp32 additions as the CPU loop. Neighbouring threads are neighbouring channels, so
 * the accesses of a warp are coalesced. Negative token ids are skipped (and give zero rows forward).
 * CPU reference: embedding_forward, embedding_backward in llmc/cpu_kernels.h.
 * Accounting (ew_account, COST_EMBEDDING): forward 0 FLOPs (a gather; grid: the vector path's), backward one
 * add an element of dout. */
#ifndef TSDC_EMBEDDING_CUH
#define TSDC_EMBEDDING_CUH

#include "cuda_common.cuh"
#include "convert.cuh"

#define EMB_BWD_SLICES 64     /* vocabulary slices: grid.y */
#define EMB_BWD_BLOCK 128     /* channels per block: grid.x = ceil(C / 128) */
#define EMB_BWD_TOKCHUNK 2048 /* tokens staged in shared memory per round (8 KiB) */

/* one thread per pack of VEC channels of one token */
template <int VEC>
__global__ static void embedding_forward_kernel(bf16* out, const int* tokens, const bf16* wte, int N, int C) {
    const size_t ppr = (size_t)(C / VEC);   /* packs per row (C % VEC == 0) */
    const size_t total = (size_t)N * ppr;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < total; p += stride) {
        const size_t n = p / ppr, cp = p - n * ppr;
        const int tok = tokens[n];
        bf16_pack<VEC> v;
        if (tok >= 0) {
            v = *reinterpret_cast<const bf16_pack<VEC>*>(wte + (size_t)tok * C + cp * VEC);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; j++) v.v[j] = __float2bfloat16_rn(0.0f);
        }
        *reinterpret_cast<bf16_pack<VEC>*>(out + n * C + cp * VEC) = v;
    }
}

__global__ static void embedding_backward_kernel(float* dwte, const bf16* dout, const int* tokens, int N, int C) {
    __shared__ int s_tok[EMB_BWD_TOKCHUNK];
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int slice = blockIdx.y;
    for (int n0 = 0; n0 < N; n0 += EMB_BWD_TOKCHUNK) {
        const int cnt = min(EMB_BWD_TOKCHUNK, N - n0);
        __syncthreads(); /* the previous chunk is consumed */
        for (int k = threadIdx.x; k < cnt; k += blockDim.x) {
            const int t = tokens[n0 + k];
            s_tok[k] = (t >= 0 && t % EMB_BWD_SLICES == slice) ? t : -1;
        }
        __syncthreads();
        if (c < C) {
            for (int k = 0; k < cnt; k++) {
                const int t = s_tok[k]; /* the same for the whole block: no divergence */
                if (t >= 0) {
                    float* d = dwte + (size_t)t * C + c;
                    *d = *d + __bfloat162float(dout[(size_t)(n0 + k) * C + c]);
                }
            }
        }
    }
}

static void embedding_forward(bf16* out, const int* tokens, const bf16* wte, int N, int C, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    if (C % 8 == 0 && ptr_aligned(out, 16) && ptr_aligned(wte, 16)) {
        embedding_forward_kernel<8><<<ew_grid((size_t)N * (C / 8)), EW_BLOCK, 0, stream>>>(out, tokens, wte, N, C);
    } else {
        embedding_forward_kernel<1><<<ew_grid((size_t)N * C), EW_BLOCK, 0, stream>>>(out, tokens, wte, N, C);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_EMBEDDING, "embedding_forward_kernel", ew_grid((size_t)N * (C / 8)), 0.0, (size_t)N * 4 + (size_t)N * C * 2, (size_t)N * C * 2);   /* tokens, the N rows in; out */
}

/* dwte[tokens[n]] += dout[n], deterministic (see the top of the file) */
static void embedding_backward(float* dwte, const bf16* dout, const int* tokens, int N, int C, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    dim3 grid(CEIL_DIV(C, EMB_BWD_BLOCK), EMB_BWD_SLICES);
    embedding_backward_kernel<<<grid, EMB_BWD_BLOCK, 0, stream>>>(dwte, dout, tokens, N, C);
    cudaCheck(cudaGetLastError());
    /* dout and the touched dwte rows in (tokens: once a slice), those rows out (at most N of them) */
    ew_account(COST_EMBEDDING, "embedding_backward_kernel", grid, (double)N * C, (size_t)N * C * 2 + (size_t)N * C * 4 + (size_t)N * 4 * EMB_BWD_SLICES, (size_t)N * C * 4);
}

#endif
