/* attention.cuh: materialised causal GQA attention, forward and backward.
 * CPU reference: attention_forward / attention_backward in llmc/cpu_kernels.h.
 *
 * Math (g = H/KV query heads share kv head j = h/g; scale = 1/sqrt(hd); s <= t, else 0):
 *   logits[b,h,t,s] = scale * q[b,t,h] . k[b,s,j]
 *   probs[b,h,t,:]  = softmax over s <= t of logits[b,h,t,:]          (fp32 math)
 *   out[b,t,h]      = sum_s probs[b,h,t,s] v[b,s,j]
 * backward (dout given):
 *   dprobs[b,h,t,s] = dout[b,t,h] . v[b,s,j]
 *   dlogits         = probs * (dprobs - sum_s' probs*dprobs) * scale   (s <= t, else 0)
 *   dq[b,t,h] = sum_s dlogits[b,h,t,s] k[b,s,j]
 *   dk[b,s,j] = sum_{h in j, t} dlogits[b,h,t,s] q[b,t,h]
 *   dv[b,s,j] = sum_{h in j, t} probs[b,h,t,s] dout[b,t,h]
 *
 * Layouts: q, out, dq [B,T,H*hd]; k, dk [B,T,KV*hd] (heads interleaved per token, contiguous: RoPE and the
 * QK norm write them so); v, dv [B,T,KV*hd] with the row stride ldv (elements between consecutive tokens,
 * >= KV*hd): v is a view of the fused [N, qd + 2 kd] projection output and dv of its gradient (ldv = qd + 2 kd;
 * KV*hd when contiguous); logits, probs [B,H,T,T] bf16 with the masked triangle (s > t) 0. The strides are
 * read only by the permute of v and the unpermute of dv, so the GEMMs and their bits do not depend on them.
 * Internally q/k/v/dout are permuted to head-major [B,nh,T,hd]. In that layout, and in [B,H,T,T],
 * the g query heads of kv head j of batch b are contiguous, so each (b, j) is ONE GEMM problem with the
 * g heads stacked along the rows (g*T rows), and kv heads are never copied g times:
 *   forward   S[g*T,T]    = scale * Qg[g*T,hd] Kj^T              -> fp32 scratch
 *             softmax(S)  -> logits, probs (bf16)
 *             Og[g*T,hd]  = Pg[g*T,T] Vj[T,hd]                   -> bf16, unpermuted into out
 *   backward  dVj[T,hd]   = Pg^T dOg          (k = g*T: the g heads and all t in one fp32 sum)
 *             dS[g*T,T]   = dOg Vj^T                             -> fp32 scratch
 *             dLg         = softmax backward (scale folded here, once) -> bf16 scratch
 *             dQg[g*T,hd] = dLg Kj,   dKj[T,hd] = dLg^T Qg       (fp32, each rounded once to bf16)
 * One batched GEMM covers all (b, j) with batch index b*KV + j (element strides g*T*hd, T*hd, g*T*T).
 * The GEMMs compute the full T x T square; the softmax kernels read only s <= t and write exact zeros
 * for s > t, so the masked entries of logits/probs/dlogits are 0 and add nothing to the later GEMMs.
 *
 * Precision (bf16 AMP): GEMMs accumulate in fp32. The softmax reads the fp32 logits (not the rounded
 * ones), as the CPU's reference kernel (the CPU's -precision bf16 rounds them first, and so does the
 * split path's attention_softmax_from_logits); logits, probs, out and dlogits are rounded to bf16 once
 * when stored; dq, dk, dv come out of the GEMMs in fp32 and are rounded once. Differences from the CPU's -precision bf16:
 * out uses the bf16 probs (the CPU uses the fp32 ones, then rounds probs), and dq/dk use bf16 dlogits
 * (the CPU keeps them fp32); both are at the bf16 rounding level.
 * Non-finite inputs: a NaN/inf in k or v at position s also reaches rows t < s here through 0 * NaN in
 * the dense GEMMs (the CPU skips s > t); either way the step's loss is NaN.
 *
 * Determinism: fixed-order warp reductions in the softmax kernels, fixed cuBLASLt algorithms per shape
 * (matmul.cuh), no atomics. The batch is processed in chunks of nb sequences (nb depends only on
 * B, H, T) to bound the fp32 scratch.
 *
 * Scratch (llmc/cuda/cuda_common.cuh workspaces): slot 4 fp32 S / dS chunk [nb,H,T,T]; slot 5 bf16 dL chunk
 * [nb,H,T,T]; slot 6 bf16 qp [B,H,T,hd], kp, vp [B,KV,T,hd], op/dop [B,H,T,hd]; slot 7 fp32 dqp
 * [B,H,T,hd], dkp, dvp [B,KV,T,hd].
 *
 * Split pieces (fault injection into att_logits / att_probs and their gradients; train_sdc.cu runs them
 * only when such a fault is due, so the normal path above is untouched). Twins of the CPU's three-step
 * attention (llmc/cpu/cpu_kernels.h), with the CPU's semantics for the masked triangle: a consumer reads
 * only s <= t, so a value planted at s > t (by a fault) changes nothing downstream.
 *   attention_softmax_from_logits  probs = causal softmax of the bf16 logits tensor (fp32 math)   [attention_softmax_forward]
 *                                  optional ref: only rows whose logits (s <= t) differ bitwise from ref
 *                                  are recomputed, the others are left as they are
 *   attention_av                   out = probs v (probs must be 0 for s > t: the GEMM reads the whole
 *                                  row; attention_causal_mask makes a masked copy)                [attention_av_forward]
 *   attention_split_av_backward    dv (bitwise the fused backward's) and dprobs [B,H,T,T] bf16,
 *                                  0 for s > t                                                    [attention_av_backward]
 *   attention_split_softmax_backward  dlogits = probs * (dprobs - sum probs*dprobs), unscaled (the
 *                                  gradient of att_logits, as the CPU's), bf16, 0 for s > t;
 *                                  in place allowed                                                [attention_softmax_backward]
 *   attention_split_logits_backward   zeroes dlogits at s > t in place, then dq = scale dL K,
 *                                  dk = scale dL^T Q (scale as the GEMMs' alpha)                   [attention_logits_backward]
 * The split backward stores dprobs and dlogits in bf16 (the storage dtype of every activation gradient,
 * the dtype the fault model flips); the fused backward keeps dprobs in fp32 and folds the scale into its
 * bf16 dlogits, so the two agree to bf16 rounding, not bit for bit (dv excepted).
 *
 * Accounting (launch_account, COST_ATTENTION): the launchers open a CostScope, so their batched GEMMs are
 * attention's (tensor cores, whole T x T products: the causal half is computed too); the softmax kernels
 * a nominal 5 (forward) / 4 (backward) FLOPs an entry; permutes and masks move bytes only. */
#ifndef TSDC_ATTENTION_CUH
#define TSDC_ATTENTION_CUH

#include <math.h>
#include "cuda_common.cuh"
#include "matmul.cuh"

#define ATTN_SLOT_S 4
#define ATTN_SLOT_DL 5
#define ATTN_SLOT_BF16 6
#define ATTN_SLOT_F32 7
#define ATTN_SOFTMAX_WARPS 8                     /* rows per block: one warp per row */
#define ATTN_CHUNK_FLOATS ((size_t)1 << 26)      /* fp32 scratch target: 256 MiB */

/* ---------------------------------------------------------------------------------- kernels */
__device__ __forceinline__ bf16 attention_to_bf16(bf16 x) { return x; }                      /* bit copy */
__device__ __forceinline__ bf16 attention_to_bf16(float x) { return __float2bfloat16_rn(x); } /* one rounding */

/* in [B,n1,n2,hd] (bf16 or fp32) -> out [B,n2,n1,hd] bf16: the two middle axes swapped. One thread per output
 * element (logical index i); consecutive threads walk hd, contiguous on both sides. ldi: elements between
 * consecutive (b, j1) rows of in (n2*hd when contiguous); ldo: between consecutive (b, j2) rows of out (n1*hd).
 * Permute: in [B,T,nh,hd] (n1 = T, n2 = nh, ldi the token stride) -> [B,nh,T,hd], bf16 in (bit copy);
 * unpermute: in [B,nh,T,hd] (n1 = nh, n2 = T) -> [B,T,nh,hd] (ldo the token stride). */
template <typename Tin>
__global__ void attention_swap_axes_kernel(bf16* __restrict__ out, size_t ldo, const Tin* __restrict__ in, size_t ldi, int B, int n1,
                                           int n2, int hd) {
    const size_t n = (size_t)B * n1 * n2 * hd;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / hd;
        const int d = (int)(i - r * hd);
        const int j1 = (int)(r % n1);
        r /= n1;
        const int j2 = (int)(r % n2);
        const size_t b = r / n2;
        out[(b * n2 + j2) * ldo + (size_t)j1 * hd + d] = attention_to_bf16(in[(b * n1 + j1) * ldi + (size_t)j2 * hd + d]);
    }
}

/* One warp per row of [rows, T] (row = (b*H + h)*T + t, so t = row % T). Reads the fp32 scaled
 * logits z[row, s <= t]; writes logits = bf16(z) and probs = bf16(exp(z - max) * (1/sum)) for s <= t,
 * exact 0 for t < s < T. Lanes stride s by 32 (coalesced); sums combined by the fixed butterfly. */
__global__ void __launch_bounds__(ATTN_SOFTMAX_WARPS * 32)
attention_softmax_forward_kernel(bf16* __restrict__ logits, bf16* __restrict__ probs, const float* __restrict__ z, size_t rows, int T) {
    const size_t row = (size_t)blockIdx.x * ATTN_SOFTMAX_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return; /* whole warp leaves together: row depends on the warp only */
    const int t = (int)(row % (size_t)T);
    const float* zr = z + row * T;
    bf16* lr = logits + row * T;
    bf16* pr = probs + row * T;
    float mx = -INFINITY;
    for (int s = lane; s <= t; s += 32) mx = fmaxf(mx, zr[s]);
    mx = warp_reduce_max(mx);
    float sum = 0.0f;
    for (int s = lane; s <= t; s += 32) sum += expf(zr[s] - mx);
    sum = warp_reduce_sum(sum);
    const float inv = 1.0f / sum;
    for (int s = lane; s < T; s += 32) {
        float zl = 0.0f, p = 0.0f;
        if (s <= t) {
            zl = zr[s];
            p = expf(zl - mx) * inv;
        }
        lr[s] = __float2bfloat16_rn(zl);
        pr[s] = __float2bfloat16_rn(p);
    }
}

/* One warp per row: dlogits[s] = p[s] * (dp[s] - sum_{s'<=t} p[s'] dp[s']) * scale for s <= t, 0 for
 * s > t (p = bf16 probs, dp = fp32 dprobs), stored bf16. */
__global__ void __launch_bounds__(ATTN_SOFTMAX_WARPS * 32)
attention_softmax_backward_kernel(bf16* __restrict__ dlogits, const bf16* __restrict__ probs, const float* __restrict__ dprobs,
                                  size_t rows, int T, float scale) {
    const size_t row = (size_t)blockIdx.x * ATTN_SOFTMAX_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int t = (int)(row % (size_t)T);
    const bf16* pr = probs + row * T;
    const float* dr = dprobs + row * T;
    bf16* out = dlogits + row * T;
    float pd = 0.0f;
    for (int s = lane; s <= t; s += 32) pd += __bfloat162float(pr[s]) * dr[s];
    pd = warp_reduce_sum(pd);
    for (int s = lane; s < T; s += 32) {
        float dl = 0.0f;
        if (s <= t) dl = __bfloat162float(pr[s]) * (dr[s] - pd) * scale;
        out[s] = __float2bfloat16_rn(dl);
    }
}

/* ------------------------------------------------------------------------ split-path kernels */
/* One warp per row: probs = causal softmax of the bf16 logits (fp32 math), exact 0 for s > t. With
 * ref != NULL a row whose logits at s <= t all equal ref's bitwise is skipped (its probs left as they
 * are); the test is warp-uniform, so the whole warp returns together. */
__global__ void __launch_bounds__(ATTN_SOFTMAX_WARPS * 32)
attention_softmax_from_logits_kernel(bf16* __restrict__ probs, const bf16* __restrict__ logits, const bf16* __restrict__ ref,
                                     size_t rows, int T) {
    const size_t row = (size_t)blockIdx.x * ATTN_SOFTMAX_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int t = (int)(row % (size_t)T);
    const bf16* lr = logits + row * T;
    bf16* pr = probs + row * T;
    if (ref) {
        const bf16* rr = ref + row * T;
        int diff = 0;
        for (int s = lane; s <= t; s += 32) diff |= __bfloat16_as_ushort(lr[s]) != __bfloat16_as_ushort(rr[s]);
        if (!__any_sync(0xffffffffu, diff)) return;
    }
    float mx = -INFINITY;
    for (int s = lane; s <= t; s += 32) mx = fmaxf(mx, __bfloat162float(lr[s]));
    mx = warp_reduce_max(mx);
    float sum = 0.0f;
    for (int s = lane; s <= t; s += 32) sum += expf(__bfloat162float(lr[s]) - mx);
    sum = warp_reduce_sum(sum);
    const float inv = 1.0f / sum;
    for (int s = lane; s < T; s += 32) {
        float p = 0.0f;
        if (s <= t) p = expf(__bfloat162float(lr[s]) - mx) * inv;
        pr[s] = __float2bfloat16_rn(p);
    }
}

/* out[i] = 0 where s > t, else in[i] (bf16 bit copy, or fp32 rounded once), for a [rows, T] tensor
 * whose row index is (b*H + h)*T + t, viewed flat: i = row*T + s. out may equal in (bf16). */
template <typename Tin>
__global__ void attention_causal_mask_kernel(bf16* out, const Tin* in, size_t n, int T) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / (size_t)T;
        const int s = (int)(i - row * T), t = (int)(row % (size_t)T);
        out[i] = s > t ? __ushort_as_bfloat16((unsigned short)0) : attention_to_bf16(in[i]);
    }
}

/* One warp per row: dlogits[s] = p[s] * (dp[s] - sum_{s'<=t} p[s'] dp[s']) for s <= t, 0 for s > t,
 * from bf16 probs and bf16 dprobs, unscaled (the gradient of att_logits), stored bf16. dlogits may equal
 * dprobs: lane l reads and writes only the entries s = l (mod 32), the reads of the sum all before the
 * shuffles, and each entry is read before it is written. */
__global__ void __launch_bounds__(ATTN_SOFTMAX_WARPS * 32)
attention_split_softmax_backward_kernel(bf16* dlogits, const bf16* probs, const bf16* dprobs, size_t rows, int T) {
    const size_t row = (size_t)blockIdx.x * ATTN_SOFTMAX_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int t = (int)(row % (size_t)T);
    const bf16* pr = probs + row * T;
    const bf16* dr = dprobs + row * T;
    bf16* out = dlogits + row * T;
    float pd = 0.0f;
    for (int s = lane; s <= t; s += 32) pd += __bfloat162float(pr[s]) * __bfloat162float(dr[s]);
    pd = warp_reduce_sum(pd);
    for (int s = lane; s < T; s += 32) {
        float dl = 0.0f;
        if (s <= t) dl = __bfloat162float(pr[s]) * (__bfloat162float(dr[s]) - pd);
        out[s] = __float2bfloat16_rn(dl);
    }
}

/* -------------------------------------------------------------------------------- launchers */
static inline unsigned attention_grid(size_t n, int block) {
    size_t g = CEIL_DIV(n, (size_t)block);
    if (g > ((size_t)1 << 20)) g = (size_t)1 << 20; /* grid-stride loops cover the rest */
    if (g < 1) g = 1;
    return (unsigned)g;
}

/* in [B,T,nh,hd] with token stride ld -> out [B,nh,T,hd] contiguous */
static void attention_permute(bf16* out, const bf16* in, int ld, int B, int T, int nh, int hd, cudaStream_t stream) {
    const size_t n = (size_t)B * T * nh * hd;
    attention_swap_axes_kernel<bf16><<<attention_grid(n, 256), 256, 0, stream>>>(out, (size_t)T * hd, in, (size_t)ld, B, T, nh, hd);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "attention_swap_axes_kernel", COST_FP32, attention_grid(n, 256), 0.0, (double)n * 2, (double)n * 2);
}

/* in [B,nh,T,hd] contiguous -> out [B,T,nh,hd] with token stride ld */
template <typename Tin>
static void attention_unpermute(bf16* out, int ld, const Tin* in, int B, int T, int nh, int hd, cudaStream_t stream) {
    const size_t n = (size_t)B * T * nh * hd;
    attention_swap_axes_kernel<Tin><<<attention_grid(n, 256), 256, 0, stream>>>(out, (size_t)ld, in, (size_t)T * hd, B, nh, T, hd);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "attention_swap_axes_kernel", COST_FP32, attention_grid(n, 256), 0.0, (double)n * sizeof(Tin), (double)n * 2);
}

static void attention_check_args(const char* who, int B, int T, int H, int KV, int hd, int ldv) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0 || H % KV != 0)
        tsdc_fail("%s: bad shape B %d T %d H %d KV %d hd %d (all > 0, H a multiple of KV)", who, B, T, H, KV, hd);
    if (ldv < KV * hd) tsdc_fail("%s: v row stride %d below KV*hd = %d", who, ldv, KV * hd);
}

/* sequences per chunk: the fp32 [nb,H,T,T] scratch stays near ATTN_CHUNK_FLOATS (at least one sequence) */
static inline int attention_chunk(int B, int H, int T) {
    size_t per_b = (size_t)H * T * T;
    size_t nb = ATTN_CHUNK_FLOATS / per_b;
    if (nb < 1) nb = 1;
    if (nb > (size_t)B) nb = (size_t)B;
    return (int)nb;
}

/* sub-buffers of a bf16 / fp32 slot start on 256-byte boundaries */
static inline size_t attention_round_up(size_t n, size_t to) { return CEIL_DIV(n, to) * to; }

/* slot 6 carved into qp | kp | vp | op (bf16 element offsets); returns the total in elements */
static inline size_t attention_bf16_layout(int B, int T, int H, int KV, int hd, size_t* ok, size_t* ov, size_t* oo) {
    const size_t nq = attention_round_up((size_t)B * H * T * hd, 128), nk = attention_round_up((size_t)B * KV * T * hd, 128);
    *ok = nq;
    *ov = nq + nk;
    *oo = nq + 2 * nk;
    return 2 * nq + 2 * nk;
}

static void attention_forward(bf16* out, bf16* logits, bf16* probs, const bf16* q, const bf16* k, const bf16* v,
                              int B, int T, int H, int KV, int hd, int ldv, cudaStream_t stream) {
    attention_check_args("attention_forward", B, T, H, KV, hd, ldv);
    CostScope cost_scope(COST_ATTENTION);   /* its GEMMs are attention's */
    const int g = H / KV;
    const float scale = 1.0f / sqrtf((float)hd);
    const int nb = attention_chunk(B, H, T);
    size_t ok, ov, oo;
    const size_t nbf = attention_bf16_layout(B, T, H, KV, hd, &ok, &ov, &oo);
    bf16* ws = (bf16*)cuda_workspace_f32(ATTN_SLOT_BF16, CEIL_DIV(nbf, (size_t)2));
    float* S = cuda_workspace_f32(ATTN_SLOT_S, (size_t)nb * H * T * T);
    bf16 *qp = ws, *kp = ws + ok, *vp = ws + ov, *op = ws + oo;

    attention_permute(qp, q, H * hd, B, T, H, hd, stream);
    attention_permute(kp, k, KV * hd, B, T, KV, hd, stream);
    attention_permute(vp, v, ldv, B, T, KV, hd, stream);

    const long sQ = (long)g * T * hd, sK = (long)T * hd, sS = (long)g * T * T; /* per (b, j) problem */
    for (int b0 = 0; b0 < B; b0 += nb) {
        const int bn = B - b0 < nb ? B - b0 : nb;
        /* S[g*T, T] = scale * Qg[g*T, hd] Kj[T, hd]^T  (B operand stored [n,k]: transB 1) */
        matmul_bf16(S, 1, qp + (size_t)b0 * H * T * hd, kp + (size_t)b0 * KV * T * hd, g * T, T, hd, 0, 1, scale, 0.0f,
                    bn * KV, sQ, sK, sS, stream);
        const size_t rows = (size_t)bn * H * T;
        attention_softmax_forward_kernel<<<(unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), ATTN_SOFTMAX_WARPS * 32, 0, stream>>>(
            logits + (size_t)b0 * H * T * T, probs + (size_t)b0 * H * T * T, S, rows, T);
        cudaCheck(cudaGetLastError());
        launch_account(COST_ATTENTION, "attention_softmax_forward_kernel", COST_FP32, (unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), 5.0 * rows * T, (double)rows * T * 4, (double)rows * T * 4);   /* S in; logits, probs out */
    }
    /* Og[g*T, hd] = Pg[g*T, T] Vj[T, hd] */
    matmul_bf16(op, 0, probs, vp, g * T, hd, T, 0, 0, 1.0f, 0.0f, B * KV, sS, sK, sQ, stream);
    attention_unpermute(out, H * hd, op, B, T, H, hd, stream);
}

static void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* probs,
                               const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV, int hd, int ldv,
                               cudaStream_t stream) {
    attention_check_args("attention_backward", B, T, H, KV, hd, ldv);
    CostScope cost_scope(COST_ATTENTION);
    const int g = H / KV;
    const float scale = 1.0f / sqrtf((float)hd);
    const int nb = attention_chunk(B, H, T);
    size_t ok, ov, oo;
    const size_t nbf = attention_bf16_layout(B, T, H, KV, hd, &ok, &ov, &oo);
    const size_t fq = attention_round_up((size_t)B * H * T * hd, 64), fk = attention_round_up((size_t)B * KV * T * hd, 64);
    bf16* ws = (bf16*)cuda_workspace_f32(ATTN_SLOT_BF16, CEIL_DIV(nbf, (size_t)2));
    float* wf = cuda_workspace_f32(ATTN_SLOT_F32, fq + 2 * fk);
    float* dS = cuda_workspace_f32(ATTN_SLOT_S, (size_t)nb * H * T * T);
    bf16* dL = (bf16*)cuda_workspace_f32(ATTN_SLOT_DL, CEIL_DIV((size_t)nb * H * T * T, (size_t)2));
    bf16 *qp = ws, *kp = ws + ok, *vp = ws + ov, *dop = ws + oo;
    float *dqp = wf, *dkp = wf + fq, *dvp = wf + fq + fk;

    attention_permute(qp, q, H * hd, B, T, H, hd, stream);
    attention_permute(kp, k, KV * hd, B, T, KV, hd, stream);
    attention_permute(vp, v, ldv, B, T, KV, hd, stream);
    attention_permute(dop, dout, H * hd, B, T, H, hd, stream);

    const long sQ = (long)g * T * hd, sK = (long)T * hd, sS = (long)g * T * T;
    /* dVj[T, hd] = Pg^T dOg: A = Pg stored [k,m] = [g*T, T] (transA 1), B = dOg stored [k,n] = [g*T, hd] */
    matmul_bf16(dvp, 1, probs, dop, T, hd, g * T, 1, 0, 1.0f, 0.0f, B * KV, sS, sQ, sK, stream);
    for (int b0 = 0; b0 < B; b0 += nb) {
        const int bn = B - b0 < nb ? B - b0 : nb;
        const bf16* qc = qp + (size_t)b0 * H * T * hd;
        const bf16* kc = kp + (size_t)b0 * KV * T * hd;
        /* dS[g*T, T] = dOg[g*T, hd] Vj[T, hd]^T */
        matmul_bf16(dS, 1, dop + (size_t)b0 * H * T * hd, vp + (size_t)b0 * KV * T * hd, g * T, T, hd, 0, 1, 1.0f, 0.0f,
                    bn * KV, sQ, sK, sS, stream);
        const size_t rows = (size_t)bn * H * T;
        attention_softmax_backward_kernel<<<(unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), ATTN_SOFTMAX_WARPS * 32, 0, stream>>>(
            dL, probs + (size_t)b0 * H * T * T, dS, rows, T, scale);
        cudaCheck(cudaGetLastError());
        launch_account(COST_ATTENTION, "attention_softmax_backward_kernel", COST_FP32, (unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), 4.0 * rows * T, (double)rows * T * 6, (double)rows * T * 2);   /* probs, dS in; dL out */
        /* dQg[g*T, hd] = dLg[g*T, T] Kj[T, hd] */
        matmul_bf16(dqp + (size_t)b0 * H * T * hd, 1, dL, kc, g * T, hd, T, 0, 0, 1.0f, 0.0f, bn * KV, sS, sK, sQ, stream);
        /* dKj[T, hd] = dLg^T Qg: A = dLg stored [k,m] = [g*T, T] (transA 1), B = Qg stored [k,n] = [g*T, hd] */
        matmul_bf16(dkp + (size_t)b0 * KV * T * hd, 1, dL, qc, T, hd, g * T, 1, 0, 1.0f, 0.0f, bn * KV, sS, sQ, sK, stream);
    }
    attention_unpermute(dq, H * hd, dqp, B, T, H, hd, stream);
    attention_unpermute(dk, KV * hd, dkp, B, T, KV, hd, stream);
    attention_unpermute(dv, ldv, dvp, B, T, KV, hd, stream);
}

/* ------------------------------------------------------------------------ split-path launchers */
/* x [B,H,T,T]: out = x with the entries s > t set to 0 (out may equal x) */
static void attention_causal_mask(bf16* out, const bf16* x, int B, int H, int T, cudaStream_t stream) {
    const size_t n = (size_t)B * H * T * T;
    attention_causal_mask_kernel<bf16><<<attention_grid(n, 256), 256, 0, stream>>>(out, x, n, T);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "attention_causal_mask_kernel", COST_FP32, attention_grid(n, 256), 0.0, (double)n * 2, (double)n * 2);
}

/* probs [B,H,T,T] = causal softmax of the bf16 logits [B,H,T,T] (fp32 math, entries s > t of logits
 * ignored, of probs 0). ref NULL: every row; else only the rows whose logits at s <= t differ bitwise
 * from ref's (the others keep their probs). */
static void attention_softmax_from_logits(bf16* probs, const bf16* logits, const bf16* ref, int B, int H, int T, cudaStream_t stream) {
    if (B <= 0 || H <= 0 || T <= 0) tsdc_fail("attention_softmax_from_logits: bad shape B %d H %d T %d", B, H, T);
    const size_t rows = (size_t)B * H * T;
    attention_softmax_from_logits_kernel<<<(unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), ATTN_SOFTMAX_WARPS * 32, 0, stream>>>(
        probs, logits, ref, rows, T);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "attention_softmax_from_logits_kernel", COST_FP32, (unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), 5.0 * rows * T, (double)rows * T * 4, (double)rows * T * 2);   /* logits, ref in; probs out */
}

/* out [B,T,H*hd] = probs v (v with row stride ldv): the probs x v step of attention_forward (the same GEMM call,
 * so the same bits for the same probs). probs must be 0 at s > t (the GEMM reads whole rows). */
static void attention_av(bf16* out, const bf16* probs, const bf16* v, int B, int T, int H, int KV, int hd, int ldv, cudaStream_t stream) {
    attention_check_args("attention_av", B, T, H, KV, hd, ldv);
    CostScope cost_scope(COST_ATTENTION);
    const int g = H / KV;
    size_t ok, ov, oo;
    const size_t nbf = attention_bf16_layout(B, T, H, KV, hd, &ok, &ov, &oo);
    bf16* ws = (bf16*)cuda_workspace_f32(ATTN_SLOT_BF16, CEIL_DIV(nbf, (size_t)2));
    bf16 *vp = ws + ov, *op = ws + oo;
    attention_permute(vp, v, ldv, B, T, KV, hd, stream);
    const long sQ = (long)g * T * hd, sK = (long)T * hd, sS = (long)g * T * T;
    matmul_bf16(op, 0, probs, vp, g * T, hd, T, 0, 0, 1.0f, 0.0f, B * KV, sS, sK, sQ, stream);
    attention_unpermute(out, H * hd, op, B, T, H, hd, stream);
}

/* backward, step 1: dv [B,T,KV*hd] (row stride ldv, as v's; the fused backward's GEMM: the same bits) and dprobs
 * [B,H,T,T] = dout . v rounded once to bf16, 0 at s > t. probs must be 0 at s > t (the dv GEMM reads whole rows). */
static void attention_split_av_backward(bf16* dprobs, bf16* dv, const bf16* dout, const bf16* probs, const bf16* v,
                                        int B, int T, int H, int KV, int hd, int ldv, cudaStream_t stream) {
    attention_check_args("attention_split_av_backward", B, T, H, KV, hd, ldv);
    CostScope cost_scope(COST_ATTENTION);
    const int g = H / KV;
    const int nb = attention_chunk(B, H, T);
    size_t ok, ov, oo;
    const size_t nbf = attention_bf16_layout(B, T, H, KV, hd, &ok, &ov, &oo);
    const size_t fq = attention_round_up((size_t)B * H * T * hd, 64), fk = attention_round_up((size_t)B * KV * T * hd, 64);
    bf16* ws = (bf16*)cuda_workspace_f32(ATTN_SLOT_BF16, CEIL_DIV(nbf, (size_t)2));
    float* wf = cuda_workspace_f32(ATTN_SLOT_F32, fq + 2 * fk);
    float* dS = cuda_workspace_f32(ATTN_SLOT_S, (size_t)nb * H * T * T);
    bf16 *vp = ws + ov, *dop = ws + oo;
    float* dvp = wf + fq + fk;

    attention_permute(vp, v, ldv, B, T, KV, hd, stream);
    attention_permute(dop, dout, H * hd, B, T, H, hd, stream);
    const long sQ = (long)g * T * hd, sK = (long)T * hd, sS = (long)g * T * T;
    matmul_bf16(dvp, 1, probs, dop, T, hd, g * T, 1, 0, 1.0f, 0.0f, B * KV, sS, sQ, sK, stream);
    for (int b0 = 0; b0 < B; b0 += nb) {
        const int bn = B - b0 < nb ? B - b0 : nb;
        /* dS[g*T, T] = dOg Vj^T in fp32 (the fused backward's GEMM), then masked and rounded once */
        matmul_bf16(dS, 1, dop + (size_t)b0 * H * T * hd, vp + (size_t)b0 * KV * T * hd, g * T, T, hd, 0, 1, 1.0f, 0.0f,
                    bn * KV, sQ, sK, sS, stream);
        const size_t n = (size_t)bn * H * T * T;
        attention_causal_mask_kernel<float><<<attention_grid(n, 256), 256, 0, stream>>>(dprobs + (size_t)b0 * H * T * T, dS, n, T);
        cudaCheck(cudaGetLastError());
        launch_account(COST_ATTENTION, "attention_causal_mask_kernel", COST_FP32, attention_grid(n, 256), 0.0, (double)n * 4, (double)n * 2);
    }
    attention_unpermute(dv, ldv, dvp, B, T, KV, hd, stream);
}

/* backward, step 2: dlogits = probs * (dprobs - sum_s probs*dprobs) (s <= t, else 0), unscaled, bf16.
 * dlogits may equal dprobs. */
static void attention_split_softmax_backward(bf16* dlogits, const bf16* dprobs, const bf16* probs, int B, int H, int T,
                                             cudaStream_t stream) {
    if (B <= 0 || H <= 0 || T <= 0) tsdc_fail("attention_split_softmax_backward: bad shape B %d H %d T %d", B, H, T);
    const size_t rows = (size_t)B * H * T;
    attention_split_softmax_backward_kernel<<<(unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), ATTN_SOFTMAX_WARPS * 32, 0, stream>>>(
        dlogits, probs, dprobs, rows, T);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "attention_split_softmax_backward_kernel", COST_FP32, (unsigned)CEIL_DIV(rows, (size_t)ATTN_SOFTMAX_WARPS), 3.0 * rows * T, (double)rows * T * 4, (double)rows * T * 2);   /* probs, dprobs in; dlogits out */
}

/* backward, step 3: dq [B,T,H*hd] = scale dL K, dk [B,T,KV*hd] = scale dL^T Q (fp32 GEMMs, each rounded
 * once). dlogits [B,H,T,T] is zeroed at s > t first, in place (the CPU reads only s <= t; the GEMMs
 * read whole rows). */
static void attention_split_logits_backward(bf16* dq, bf16* dk, bf16* dlogits, const bf16* q, const bf16* k,
                                            int B, int T, int H, int KV, int hd, cudaStream_t stream) {
    attention_check_args("attention_split_logits_backward", B, T, H, KV, hd, KV * hd);
    CostScope cost_scope(COST_ATTENTION);
    const int g = H / KV;
    const float scale = 1.0f / sqrtf((float)hd);
    size_t ok, ov, oo;
    const size_t nbf = attention_bf16_layout(B, T, H, KV, hd, &ok, &ov, &oo);
    const size_t fq = attention_round_up((size_t)B * H * T * hd, 64), fk = attention_round_up((size_t)B * KV * T * hd, 64);
    bf16* ws = (bf16*)cuda_workspace_f32(ATTN_SLOT_BF16, CEIL_DIV(nbf, (size_t)2));
    float* wf = cuda_workspace_f32(ATTN_SLOT_F32, fq + 2 * fk);
    bf16 *qp = ws, *kp = ws + ok;
    float *dqp = wf, *dkp = wf + fq;

    attention_causal_mask(dlogits, dlogits, B, H, T, stream);
    attention_permute(qp, q, H * hd, B, T, H, hd, stream);
    attention_permute(kp, k, KV * hd, B, T, KV, hd, stream);
    const long sQ = (long)g * T * hd, sK = (long)T * hd, sS = (long)g * T * T;
    /* dQg[g*T, hd] = scale dLg[g*T, T] Kj[T, hd] */
    matmul_bf16(dqp, 1, dlogits, kp, g * T, hd, T, 0, 0, scale, 0.0f, B * KV, sS, sK, sQ, stream);
    /* dKj[T, hd] = scale dLg^T Qg: A = dLg stored [k,m] = [g*T, T] (transA 1), B = Qg stored [k,n] = [g*T, hd] */
    matmul_bf16(dkp, 1, dlogits, qp, T, hd, g * T, 1, 0, scale, 0.0f, B * KV, sS, sQ, sK, stream);
    attention_unpermute(dq, H * hd, dqp, B, T, H, hd, stream);
    attention_unpermute(dk, KV * hd, dkp, B, T, KV, hd, stream);
}

#endif
