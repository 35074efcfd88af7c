/* flash_attention.cuh: fused (flash-style) causal GQA attention, forward and backward, deterministic.
 * CPU reference: attention_forward / attention_backward in llmc/cpu/cpu_kernels.h (the same math as the
 * materialised llmc/cuda/attention.cuh, without ever writing a T x T tensor).
 *
 * Math (g = H/KV query heads share kv head j = h/g; scale = 1/sqrt(hd); only s <= t is read):
 *   z[t,s]  = scale * q[b,t,h] . k[b,s,j]
 *   lse[t]  = log sum_{s<=t} exp(z[t,s])                          (saved, fp32, for the backward)
 *   out[t]  = sum_{s<=t} exp(z[t,s] - lse[t]) v[b,s,j]
 * forward, online softmax over key tiles s0 = 0, BK, 2BK, ... up to the diagonal (tiles above it
 * are never visited), per query row, in fp32:
 *   m' = max(m, max_s z),  a = exp(m - m'),  l' = a l + sum_s exp(z - m'),  o' = a o + sum_s exp(z - m') v_s
 *   out = o / l rounded once to bf16,  lse = m + log(l)
 * backward (dout given; P recomputed from q, k and lse, never stored):
 *   D[t]    = sum_d dout[t,d] out[t,d]            (= sum_s P[t,s] dP[t,s]; the forward's bf16 out)
 *   P[t,s]  = exp(z[t,s] - lse[t]),  dP[t,s] = dout[t] . v[s],  dZ[t,s] = P (dP - D[t])
 *   dq[t]   = scale sum_s dZ[t,s] k[s]
 *   dk[s]   = scale sum_{h in j} sum_t dZ[t,s] q[t]
 *   dv[s]   =       sum_{h in j} sum_t P[t,s] dout[t]
 *
 * Layouts: q, out, dq, dout [B,T,H*hd] and k, dk [B,T,KV*hd] (heads interleaved per token, as RoPE and the QK
 * norm write them and as llmc/cuda/attention.cuh takes them: no permute kernels); v, dv [B,T,KV*hd] with the
 * row stride ldv (elements between consecutive tokens, >= KV*hd: v is a view of the fused [N, qd + 2 kd]
 * projection output, dv of its gradient); lse and D [B,H,T] fp32 (row (b*H + h)*T + t). head_dim 32, 64 or
 * 128 (template HD; flash_attention_supported). The strides change only addresses, never the arithmetic.
 *
 * Kernels (128 threads = a 16 x 8 grid, tx = threadIdx % 16 (the 16 lanes of a half warp), ty =
 * threadIdx / 16; tiles of rows in shared memory as bf16 pairs with one pad word a row, so the rows a
 * half warp reads fall into distinct banks; fp32 accumulators in registers; tile sizes FlashTiles<HD>,
 * each kernel's static shared memory asserted <= 48 KB at compile time):
 *   forward   grid (T/BQ, H, B), one block per query tile of one head, heaviest (last) tiles first.
 *             Thread (tx, ty) owns query rows ty*RR .. ty*RR+RR-1 of the tile; of S = Q K^T the key
 *             columns tx + 16 c; of o the dimension pairs tx + 16 c. Row max and the final row sum
 *             are combined over the 16 tx lanes by an xor butterfly (offsets 8, 4, 2, 1): every lane
 *             gets the same bits. P (unnormalised, fp32) goes through shared memory to o += P V.
 *   D         one warp per (b, t, h) row: lanes stride d, warp butterfly.
 *   dq        grid (T/BQ, H, B): per query tile, key tiles 0 .. diagonal in order: S = Q K^T and
 *             dP = dO V^T (registers), dZ to shared memory, dq += dZ K.
 *   dk, dv    grid (T/BK, KV, B): per key tile of one kv head, the g query heads in order h = j*g ..
 *             j*g+g-1, and for each the query tiles from the diagonal to the end in order: S^T = K Q^T,
 *             dP^T = V dO^T, P^T and dZ^T to shared memory, dv += P^T dO, dk += dZ^T Q.
 *             (At B = 1 this grid is small, T/BK x KV blocks: 128 for llama3.2-1b at T 1024, under one
 *             block an SM on an H200. If measured slow: split the g heads over blocks, write fp32 partials
 *             and sum them in head order in a second pass; the bits then change, the determinism not.)
 * Summation order (bitwise reproducible, no atomics): every dot over d ascending; o, dq over s
 * ascending (tile by tile); dk, dv over (h ascending, then t ascending) in one fp32 accumulator each;
 * each output rounded once to bf16 (dq, dk times scale first).
 *
 * Precision against the materialised path (llmc/cuda/attention.cuh) and the CPU's -precision bf16: the
 * fused path keeps P, dP and dZ in fp32 (the materialised path rounds probs and dlogits to bf16 because
 * it stores them; the CPU keeps probs fp32 for out and dlogits fp32 for dq/dk), so its out, dq and dk
 * are closer to the fp32 reference than the materialised path's and agree with it at the bf16 rounding
 * level, not bitwise. Differences that remain: out = o * (1/l) with o accumulated against the running
 * max (the CPU normalises p first); the backward's D comes from the bf16 out (the CPU's from sum P dP
 * in fp32), a relative 2^-9 of sum |dout out|; dv is bitwise neither path's (another summation order).
 * Rows t >= T of a partial tile read zeros and are never stored; keys s > t add exact zeros.
 * Non-finite inputs: a NaN/inf in q, k or v reaches only the rows that read it (s <= t), as on the CPU.
 *
 * What the fused path does not provide: the stored att_logits / att_probs tensors (fault injection
 * into them, the attention checks of -protect att and -detect abft, the propagation trace read them):
 * train_sdc.cu keeps the materialised path for those (see attention_fused there and the README).
 *
 * Next step on real hardware: the two tile products (flash_tile_nt: S = A B^T over d; flash_tile_nn:
 * acc += P B over s) are the places for tensor cores (mma.sync m16n8k16 bf16 on sm_80, wgmma on sm_90,
 * with P / dZ rounded to bf16 as their A operand) and for cp.async / TMA tile loads with larger
 * opt-in shared memory; the loop structure, tile order and summation order per output stay as they are.
 * This version uses CUDA cores only, so that the CPU emulation (dev/cuda_emu) runs it.
 *
 * Scratch: D in cuda_workspace slot 4 (shared with llmc/cuda/attention.cuh; neither holds it across calls).
 *
 * Accounting (launch_account, COST_ATTENTION, CUDA-core fp32): FLOPs per (t, s) pair that the tiles cover
 * (flash_pairs_rows / flash_pairs_cols: whole tiles up to and across the diagonal, masked entries
 * included, as the kernels compute them): forward 4 hd + 5 (two dots, the online softmax), dq 6 hd + 5
 * (S, dP recomputed, dq), dk/dv 8 hd + 5 (S, dP recomputed, dv, dk); bytes: each input read once, each
 * output written once (the k/v tiles that every query tile reads again come from L2 and are not counted). */
#ifndef TSDC_FLASH_ATTENTION_CUH
#define TSDC_FLASH_ATTENTION_CUH

#include <math.h>
#include "cuda_common.cuh"

#define FLASH_THREADS 128                 /* a 16 x 8 thread grid */
#define FLASH_TX 16
#define FLASH_TY 8
#define FLASH_SLOT_D 4
#define FLASH_STATIC_SMEM (48 * 1024)     /* static shared memory limit of a block */

/* tile sizes per head dim: rows of the query tile (BQ) and of the key/value tile (BK) per kernel */
template <int HD> struct FlashTiles;
template <> struct FlashTiles<32> { enum { FWD_BQ = 64, FWD_BK = 64, DQ_BQ = 64, DQ_BK = 64, DKV_BK = 64, DKV_BQ = 32 }; };
template <> struct FlashTiles<64> { enum { FWD_BQ = 64, FWD_BK = 64, DQ_BQ = 64, DQ_BK = 32, DKV_BK = 64, DKV_BQ = 32 }; };
template <> struct FlashTiles<128> { enum { FWD_BQ = 64, FWD_BK = 32, DQ_BQ = 32, DQ_BK = 32, DKV_BK = 32, DKV_BQ = 32 }; };

static inline int flash_attention_supported(int hd) { return hd == 32 || hd == 64 || hd == 128; }

/* two consecutive bf16 elements: one 32-bit word in global and shared memory */
struct alignas(4) flash_bf16x2 {
    bf16 lo, hi;
};

/* a shared tile row of HD bf16 = HD/2 words, plus one pad word */
#define FLASH_ROW(HD) ((HD) / 2 + 1)

/* ---------------------------------------------------------------------------- device helpers */
/* rows row0 .. row0+R-1 of a bf16 tensor (row r at src + r*ld, HD elements) into the shared tile dst;
 * rows >= nrows are zero-filled. Consecutive threads copy consecutive words. */
template <int R, int HD>
__device__ __forceinline__ void flash_load_tile(flash_bf16x2 (*dst)[FLASH_ROW(HD)], const bf16* src, size_t ld, int row0, int nrows) {
    constexpr int WPR = HD / 2;
    for (int i = threadIdx.x; i < R * WPR; i += FLASH_THREADS) {
        const int r = i / WPR, w = i - r * WPR;
        flash_bf16x2 x;
        if (row0 + r < nrows) {
            x = reinterpret_cast<const flash_bf16x2*>(src + (size_t)(row0 + r) * ld)[w];
        } else {
            x.lo = __float2bfloat16_rn(0.0f);
            x.hi = x.lo;
        }
        dst[r][w] = x;
    }
}

/* acc[i][c] += sum_d A[ty*RR + i][d] B[tx + 16 c][d], d ascending (S = Q K^T and its kin) */
template <int RR, int CC, int HD>
__device__ __forceinline__ void flash_tile_nt(float (&acc)[RR][CC], const flash_bf16x2 (*A)[FLASH_ROW(HD)],
                                              const flash_bf16x2 (*Bm)[FLASH_ROW(HD)], int tx, int ty) {
    for (int w = 0; w < HD / 2; w++) {
        float a0[RR], a1[RR], b0[CC], b1[CC];
#pragma unroll
        for (int i = 0; i < RR; i++) {
            const flash_bf16x2 x = A[ty * RR + i][w];
            a0[i] = __bfloat162float(x.lo);
            a1[i] = __bfloat162float(x.hi);
        }
#pragma unroll
        for (int c = 0; c < CC; c++) {
            const flash_bf16x2 x = Bm[tx + FLASH_TX * c][w];
            b0[c] = __bfloat162float(x.lo);
            b1[c] = __bfloat162float(x.hi);
        }
#pragma unroll
        for (int i = 0; i < RR; i++)
#pragma unroll
            for (int c = 0; c < CC; c++) {
                acc[i][c] += a0[i] * b0[c];
                acc[i][c] += a1[i] * b1[c];
            }
    }
}

/* acc[i][2c + e] += sum_s P[ty*RR + i][s] Bm[s][2 (tx + 16 c) + e], s ascending over the BS rows of the
 * tile (o += P V and its kin); the thread's columns are the pairs tx + 16 c, c < HD/32 */
template <int RR, int BS, int HD>
__device__ __forceinline__ void flash_tile_nn(float (&acc)[RR][HD / 16], const float (*P)[BS + 1],
                                              const flash_bf16x2 (*Bm)[FLASH_ROW(HD)], int tx, int ty) {
    for (int s = 0; s < BS; s++) {
        float p[RR], b[HD / 16];
#pragma unroll
        for (int i = 0; i < RR; i++) p[i] = P[ty * RR + i][s];
#pragma unroll
        for (int c = 0; c < HD / 32; c++) {
            const flash_bf16x2 x = Bm[s][tx + FLASH_TX * c];
            b[2 * c] = __bfloat162float(x.lo);
            b[2 * c + 1] = __bfloat162float(x.hi);
        }
#pragma unroll
        for (int i = 0; i < RR; i++)
#pragma unroll
            for (int c = 0; c < HD / 16; c++) acc[i][c] += p[i] * b[c];
    }
}

/* butterfly over the 16 lanes of a half warp (all 32 lanes must call it): every lane gets the same bits */
__device__ __forceinline__ float flash_half_warp_max(float v) {
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
__device__ __forceinline__ float flash_half_warp_sum(float v) {
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* row r of the thread's accumulator -> dst[2 (tx + 16 c) + e] = bf16(acc * mul), pairs as one word */
template <int HD>
__device__ __forceinline__ void flash_store_row(bf16* dst, const float (&acc)[HD / 16], float mul, int tx) {
#pragma unroll
    for (int c = 0; c < HD / 32; c++) {
        flash_bf16x2 x;
        x.lo = __float2bfloat16_rn(acc[2 * c] * mul);
        x.hi = __float2bfloat16_rn(acc[2 * c + 1] * mul);
        reinterpret_cast<flash_bf16x2*>(dst)[tx + FLASH_TX * c] = x;
    }
}

/* ------------------------------------------------------------------------------------ kernels */
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q,
                               const bf16* __restrict__ k, const bf16* __restrict__ v, int T, int H, int KV, size_t ldv, float scale) {
    constexpr int BQ = FlashTiles<HD>::FWD_BQ, BK = FlashTiles<HD>::FWD_BK;
    constexpr int RR = BQ / FLASH_TY, CK = BK / FLASH_TX, CD = HD / 16;
    static_assert(BQ % FLASH_TY == 0 && BK % FLASH_TX == 0 && HD % 32 == 0, "tile shape");
    static_assert(sizeof(flash_bf16x2) * FLASH_ROW(HD) * (BQ + 2 * BK) + sizeof(float) * BQ * (BK + 1) <= FLASH_STATIC_SMEM,
                  "forward: static shared memory over 48 KB");
    __shared__ flash_bf16x2 sQ[BQ][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sK[BK][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sV[BK][FLASH_ROW(HD)];
    __shared__ float sP[BQ][BK + 1];
    const int tx = threadIdx.x % FLASH_TX, ty = threadIdx.x / FLASH_TX;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * BQ; /* the last (heaviest) query tiles first */
    const int h = blockIdx.y, b = blockIdx.z, j = h / (H / KV);
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    const bf16* kb = k + (size_t)b * T * ldk + (size_t)j * HD;
    const bf16* vb = v + (size_t)b * T * ldv + (size_t)j * HD;
    flash_load_tile<BQ, HD>(sQ, q + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);

    float m[RR], l[RR], o[RR][CD];
#pragma unroll
    for (int i = 0; i < RR; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < CD; c++) o[i][c] = 0.0f;
    }
    const int last = (t0 + BQ < T ? t0 + BQ : T) - 1; /* the tile's last row that is stored */
    for (int s0 = 0; s0 <= last; s0 += BK) {
        __syncthreads(); /* the previous tile's reads of sK, sV, sP are done */
        flash_load_tile<BK, HD>(sK, kb, ldk, s0, T);
        flash_load_tile<BK, HD>(sV, vb, ldv, s0, T);
        __syncthreads();
        float z[RR][CK];
#pragma unroll
        for (int i = 0; i < RR; i++)
#pragma unroll
            for (int c = 0; c < CK; c++) z[i][c] = 0.0f;
        flash_tile_nt<RR, CK, HD>(z, sQ, sK, tx, ty);
#pragma unroll
        for (int i = 0; i < RR; i++) {
            const int t = t0 + ty * RR + i;
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < CK; c++) {
                const int s = s0 + tx + FLASH_TX * c;
                /* s <= t (causal) and s < T (rows t >= T are never stored; they read the valid keys) */
                z[i][c] = (s <= t && s < T) ? z[i][c] * scale : -INFINITY;
                mx = fmaxf(mx, z[i][c]);
            }
            mx = flash_half_warp_max(mx);
            /* finite: the first tile holds s = 0 for every row, so m is finite from then on */
            const float mn = fmaxf(m[i], mx);
            const float alpha = expf(m[i] - mn); /* 0 on the first tile (m = -inf) */
            m[i] = mn;
            l[i] *= alpha;
#pragma unroll
            for (int c = 0; c < CD; c++) o[i][c] *= alpha;
#pragma unroll
            for (int c = 0; c < CK; c++) {
                const float p = expf(z[i][c] - mn); /* 0 where masked */
                l[i] += p;
                sP[ty * RR + i][tx + FLASH_TX * c] = p;
            }
        }
        __syncthreads();
        flash_tile_nn<RR, BK, HD>(o, sP, sV, tx, ty);
    }
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const float sum = flash_half_warp_sum(l[i]); /* the thread's partial sums over its key columns */
        const int t = t0 + ty * RR + i;
        if (t < T) {
            flash_store_row<HD>(out + ((size_t)b * T + t) * ldq + (size_t)h * HD, o[i], 1.0f / sum, tx);
            if (tx == 0) lse[((size_t)b * H + h) * T + t] = m[i] + logf(sum);
        }
    }
}

/* D[(b*H + h)*T + t] = sum_d dout[b,t,h,d] out[b,t,h,d]: one warp per row, rows in memory order */
__global__ void flash_attention_rowdot_kernel(float* __restrict__ D, const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                              int B, int T, int H, int hd) {
    const size_t rows = (size_t)B * T * H;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return; /* the whole warp leaves together */
    const bf16* a = dout + row * hd;
    const bf16* o = out + row * hd;
    float acc = 0.0f;
    for (int d = lane; d < hd; d += 32) acc += __bfloat162float(a[d]) * __bfloat162float(o[d]);
    acc = warp_reduce_sum(acc);
    if (lane == 0) {
        const int h = (int)(row % H);
        const size_t bt = row / H;
        const int t = (int)(bt % T);
        const size_t b = bt / T;
        D[(b * H + h) * T + t] = acc;
    }
}

template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dq_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout, const float* __restrict__ lse,
                                   const float* __restrict__ D, const bf16* __restrict__ q, const bf16* __restrict__ k,
                                   const bf16* __restrict__ v, int T, int H, int KV, size_t ldv, float scale) {
    constexpr int BQ = FlashTiles<HD>::DQ_BQ, BK = FlashTiles<HD>::DQ_BK;
    constexpr int RR = BQ / FLASH_TY, CK = BK / FLASH_TX, CD = HD / 16;
    static_assert(BQ % FLASH_TY == 0 && BK % FLASH_TX == 0 && HD % 32 == 0, "tile shape");
    static_assert(sizeof(flash_bf16x2) * FLASH_ROW(HD) * (2 * BQ + 2 * BK) + sizeof(float) * BQ * (BK + 1) <= FLASH_STATIC_SMEM,
                  "dq: static shared memory over 48 KB");
    __shared__ flash_bf16x2 sQ[BQ][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sdO[BQ][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sK[BK][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sV[BK][FLASH_ROW(HD)];
    __shared__ float sZ[BQ][BK + 1];
    const int tx = threadIdx.x % FLASH_TX, ty = threadIdx.x / FLASH_TX;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * BQ;
    const int h = blockIdx.y, b = blockIdx.z, j = h / (H / KV);
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    const bf16* kb = k + (size_t)b * T * ldk + (size_t)j * HD;
    const bf16* vb = v + (size_t)b * T * ldv + (size_t)j * HD;
    flash_load_tile<BQ, HD>(sQ, q + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);
    flash_load_tile<BQ, HD>(sdO, dout + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);
    const float* lr = lse + ((size_t)b * H + h) * T;
    const float* dr = D + ((size_t)b * H + h) * T;
    float L[RR], Dt[RR], acc[RR][CD];
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const int t = t0 + ty * RR + i;
        L[i] = t < T ? lr[t] : 0.0f;
        Dt[i] = t < T ? dr[t] : 0.0f;
#pragma unroll
        for (int c = 0; c < CD; c++) acc[i][c] = 0.0f;
    }
    const int last = (t0 + BQ < T ? t0 + BQ : T) - 1;
    for (int s0 = 0; s0 <= last; s0 += BK) {
        __syncthreads();
        flash_load_tile<BK, HD>(sK, kb, ldk, s0, T);
        flash_load_tile<BK, HD>(sV, vb, ldv, s0, T);
        __syncthreads();
        float z[RR][CK], dp[RR][CK];
#pragma unroll
        for (int i = 0; i < RR; i++)
#pragma unroll
            for (int c = 0; c < CK; c++) { z[i][c] = 0.0f; dp[i][c] = 0.0f; }
        flash_tile_nt<RR, CK, HD>(z, sQ, sK, tx, ty);
        flash_tile_nt<RR, CK, HD>(dp, sdO, sV, tx, ty);
#pragma unroll
        for (int i = 0; i < RR; i++) {
            const int t = t0 + ty * RR + i;
#pragma unroll
            for (int c = 0; c < CK; c++) {
                const int s = s0 + tx + FLASH_TX * c;
                float dz = 0.0f;
                if (s <= t && t < T) {
                    const float p = expf(z[i][c] * scale - L[i]);
                    dz = p * (dp[i][c] - Dt[i]);
                }
                sZ[ty * RR + i][tx + FLASH_TX * c] = dz;
            }
        }
        __syncthreads();
        flash_tile_nn<RR, BK, HD>(acc, sZ, sK, tx, ty);
    }
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const int t = t0 + ty * RR + i;
        if (t < T) flash_store_row<HD>(dq + ((size_t)b * T + t) * ldq + (size_t)h * HD, acc[i], scale, tx);
    }
}

template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dkdv_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, const bf16* __restrict__ dout,
                                     const float* __restrict__ lse, const float* __restrict__ D, const bf16* __restrict__ q,
                                     const bf16* __restrict__ k, const bf16* __restrict__ v, int T, int H, int KV, size_t ldv,
                                     float scale) {
    constexpr int BK = FlashTiles<HD>::DKV_BK, BQ = FlashTiles<HD>::DKV_BQ;
    constexpr int RR = BK / FLASH_TY, CQ = BQ / FLASH_TX, CD = HD / 16;
    static_assert(BK % FLASH_TY == 0 && BQ % FLASH_TX == 0 && HD % 32 == 0, "tile shape");
    static_assert(sizeof(flash_bf16x2) * FLASH_ROW(HD) * (2 * BK + 2 * BQ) + sizeof(float) * (2 * BK * (BQ + 1) + 2 * BQ) <=
                      FLASH_STATIC_SMEM,
                  "dk/dv: static shared memory over 48 KB");
    __shared__ flash_bf16x2 sK[BK][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sV[BK][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sQ[BQ][FLASH_ROW(HD)];
    __shared__ flash_bf16x2 sdO[BQ][FLASH_ROW(HD)];
    __shared__ float sP[BK][BQ + 1];  /* P^T  [key][query] */
    __shared__ float sZ[BK][BQ + 1];  /* dZ^T [key][query] */
    __shared__ float sL[BQ], sD[BQ];  /* lse and D of the query tile's rows */
    const int tx = threadIdx.x % FLASH_TX, ty = threadIdx.x / FLASH_TX;
    const int s0 = blockIdx.x * BK; /* the first (heaviest) key tiles first */
    const int j = blockIdx.y, b = blockIdx.z, g = H / KV;
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    flash_load_tile<BK, HD>(sK, k + (size_t)b * T * ldk + (size_t)j * HD, ldk, s0, T);
    flash_load_tile<BK, HD>(sV, v + (size_t)b * T * ldv + (size_t)j * HD, ldv, s0, T);
    float ak[RR][CD], av[RR][CD];
#pragma unroll
    for (int i = 0; i < RR; i++)
#pragma unroll
        for (int c = 0; c < CD; c++) { ak[i][c] = 0.0f; av[i][c] = 0.0f; }
    for (int h = j * g; h < j * g + g; h++) {
        const bf16* qb = q + (size_t)b * T * ldq + (size_t)h * HD;
        const bf16* ob = dout + (size_t)b * T * ldq + (size_t)h * HD;
        const float* lr = lse + ((size_t)b * H + h) * T;
        const float* dr = D + ((size_t)b * H + h) * T;
        for (int t0 = s0 / BQ * BQ; t0 < T; t0 += BQ) { /* the query tiles from the diagonal on */
            __syncthreads(); /* the previous tile's reads of sQ, sdO, sP, sZ, sL, sD are done */
            flash_load_tile<BQ, HD>(sQ, qb, ldq, t0, T);
            flash_load_tile<BQ, HD>(sdO, ob, ldq, t0, T);
            for (int i = threadIdx.x; i < BQ; i += FLASH_THREADS) {
                sL[i] = t0 + i < T ? lr[t0 + i] : 0.0f;
                sD[i] = t0 + i < T ? dr[t0 + i] : 0.0f;
            }
            __syncthreads();
            float z[RR][CQ], dp[RR][CQ];
#pragma unroll
            for (int i = 0; i < RR; i++)
#pragma unroll
                for (int c = 0; c < CQ; c++) { z[i][c] = 0.0f; dp[i][c] = 0.0f; }
            flash_tile_nt<RR, CQ, HD>(z, sK, sQ, tx, ty);   /* S^T[s][t] = k_s . q_t */
            flash_tile_nt<RR, CQ, HD>(dp, sV, sdO, tx, ty); /* dP^T[s][t] = v_s . dout_t */
#pragma unroll
            for (int i = 0; i < RR; i++) {
                const int s = s0 + ty * RR + i;
#pragma unroll
                for (int c = 0; c < CQ; c++) {
                    const int tl = tx + FLASH_TX * c, t = t0 + tl;
                    float p = 0.0f, dz = 0.0f;
                    if (s <= t && t < T) {
                        p = expf(z[i][c] * scale - sL[tl]);
                        dz = p * (dp[i][c] - sD[tl]);
                    }
                    sP[ty * RR + i][tl] = p;
                    sZ[ty * RR + i][tl] = dz;
                }
            }
            __syncthreads();
            flash_tile_nn<RR, BQ, HD>(av, sP, sdO, tx, ty); /* dv += P^T dout */
            flash_tile_nn<RR, BQ, HD>(ak, sZ, sQ, tx, ty);  /* dk += dZ^T q */
        }
    }
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const int s = s0 + ty * RR + i;
        if (s < T) {
            flash_store_row<HD>(dk + ((size_t)b * T + s) * ldk + (size_t)j * HD, ak[i], scale, tx);
            flash_store_row<HD>(dv + ((size_t)b * T + s) * ldv + (size_t)j * HD, av[i], 1.0f, tx);
        }
    }
}

/* -------------------------------------------------------------------------------- launchers */
/* the accounting's (t, s) pairs of one head that a kernel's tiles cover, masked entries of a diagonal tile
 * included: query tiles of bq rows, each over the key tiles of bk up to its last row (forward, dq) ... */
static double flash_pairs_rows(int T, int bq, int bk) {
    double p = 0.0;
    for (int t0 = 0; t0 < T; t0 += bq) p += (double)bq * bk * (((t0 + bq < T ? t0 + bq : T) - 1) / bk + 1);
    return p;
}
/* ... or key tiles of bk, each over the query tiles of bq from the diagonal on (dk, dv) */
static double flash_pairs_cols(int T, int bk, int bq) {
    double p = 0.0;
    for (int s0 = 0; s0 < T; s0 += bk) p += (double)bk * bq * (CEIL_DIV(T, bq) - s0 / bq);
    return p;
}

static void flash_attention_check_args(const char* who, int B, int T, int H, int KV, int hd, int ldv) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || H % KV != 0 || B > 65535 || H > 65535)
        tsdc_fail("%s: bad shape B %d T %d H %d KV %d hd %d (all > 0, H a multiple of KV)", who, B, T, H, KV, hd);
    if (ldv < KV * hd || ldv % 2) tsdc_fail("%s: v row stride %d (even, at least KV*hd = %d: the tiles load bf16 pairs)", who, ldv, KV * hd);
    if (!flash_attention_supported(hd)) tsdc_fail("%s: head_dim %d (the fused kernels take 32, 64 or 128)", who, hd);
}

template <int HD>
static void flash_attention_forward_hd(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV,
                                       int ldv, cudaStream_t stream) {
    const dim3 grid((unsigned)CEIL_DIV(T, (int)FlashTiles<HD>::FWD_BQ), (unsigned)H, (unsigned)B);
    flash_attention_forward_kernel<HD><<<grid, FLASH_THREADS, 0, stream>>>(out, lse, q, k, v, T, H, KV, (size_t)ldv,
                                                                           1.0f / sqrtf((float)HD));
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "flash_attention_forward_kernel", COST_FP32, grid, (4.0 * HD + 5) * B * H * flash_pairs_rows(T, FlashTiles<HD>::FWD_BQ, FlashTiles<HD>::FWD_BK), (double)B * T * (H + 2 * KV) * HD * 2, (double)B * T * H * (HD * 2 + 4));   /* q, k, v in; out, lse out */
}

template <int HD>
static void flash_attention_backward_hd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* D,
                                        const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV, int ldv,
                                        cudaStream_t stream) {
    const float scale = 1.0f / sqrtf((float)HD);
    const dim3 gq((unsigned)CEIL_DIV(T, (int)FlashTiles<HD>::DQ_BQ), (unsigned)H, (unsigned)B);
    flash_attention_backward_dq_kernel<HD><<<gq, FLASH_THREADS, 0, stream>>>(dq, dout, lse, D, q, k, v, T, H, KV, (size_t)ldv, scale);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "flash_attention_backward_dq_kernel", COST_FP32, gq, (6.0 * HD + 5) * B * H * flash_pairs_rows(T, FlashTiles<HD>::DQ_BQ, FlashTiles<HD>::DQ_BK), (double)B * T * ((2 * H + 2 * KV) * HD * 2 + H * 8), (double)B * T * H * HD * 2);   /* q, dout, k, v, lse, D in; dq out */
    const dim3 gk((unsigned)CEIL_DIV(T, (int)FlashTiles<HD>::DKV_BK), (unsigned)KV, (unsigned)B);
    flash_attention_backward_dkdv_kernel<HD><<<gk, FLASH_THREADS, 0, stream>>>(dk, dv, dout, lse, D, q, k, v, T, H, KV, (size_t)ldv,
                                                                               scale);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "flash_attention_backward_dkdv_kernel", COST_FP32, gk, (8.0 * HD + 5) * B * H * flash_pairs_cols(T, FlashTiles<HD>::DKV_BK, FlashTiles<HD>::DKV_BQ), (double)B * T * ((2 * H + 2 * KV) * HD * 2 + H * 8), (double)B * T * 2 * KV * HD * 2);   /* q, dout, k, v, lse, D in; dk, dv out */
}

/* out [B,T,H*hd] bf16 and lse [B,H,T] fp32 from q [B,T,H*hd], k [B,T,KV*hd], v [B,T,KV*hd] with row stride ldv */
static void flash_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV,
                                    int hd, int ldv, cudaStream_t stream) {
    flash_attention_check_args("flash_attention_forward", B, T, H, KV, hd, ldv);
    if (hd == 32) flash_attention_forward_hd<32>(out, lse, q, k, v, B, T, H, KV, ldv, stream);
    else if (hd == 64) flash_attention_forward_hd<64>(out, lse, q, k, v, B, T, H, KV, ldv, stream);
    else flash_attention_forward_hd<128>(out, lse, q, k, v, B, T, H, KV, ldv, stream);
}

/* dq [B,T,H*hd], dk [B,T,KV*hd], dv [B,T,KV*hd] (row stride ldv, as v's) overwritten, from dout and the forward's
 * out and lse */
static void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                                     const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV, int hd, int ldv,
                                     cudaStream_t stream) {
    flash_attention_check_args("flash_attention_backward", B, T, H, KV, hd, ldv);
    const size_t rows = (size_t)B * T * H;
    float* D = cuda_workspace_f32(FLASH_SLOT_D, rows);
    flash_attention_rowdot_kernel<<<(unsigned)CEIL_DIV(rows, (size_t)8), 256, 0, stream>>>(D, dout, out, B, T, H, hd);
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "flash_attention_rowdot_kernel", COST_FP32, (unsigned)CEIL_DIV(rows, (size_t)8), 2.0 * rows * hd, (double)rows * hd * 4, (double)rows * 4);   /* dout, out in; D out */
    if (hd == 32) flash_attention_backward_hd<32>(dq, dk, dv, dout, lse, D, q, k, v, B, T, H, KV, ldv, stream);
    else if (hd == 64) flash_attention_backward_hd<64>(dq, dk, dv, dout, lse, D, q, k, v, B, T, H, KV, ldv, stream);
    else flash_attention_backward_hd<128>(dq, dk, dv, dout, lse, D, q, k, v, B, T, H, KV, ldv, stream);
}

#endif
