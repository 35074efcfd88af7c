/* rmsnorm.cuh: RMSNorm forward and backward (also the QK norms: rows = N*heads, C = head_dim).
 *
 * Math (per row r of x [rows, C], fp32 inside, bf16_rn when stored):
 *   ms[r]  = mean_i x[r,i]^2          (fp32, kept: the Residual Gain Guard reuses it)
 *   rstd   = 1 / sqrtf(ms[r] + eps)
 *   out    = w[i] * (x[r,i] * rstd)    (w NULL: parameter-free, out = x * rstd)
 * backward, with g = dout and wg[i] = w ? w[i] * g[r,i] : g[r,i]:
 *   dot    = sum_i wg[i] * x[r,i]
 *   dx     = wg[i] * rstd - x[r,i] * (dot / C * rstd^3)      (accumulate: dx_old + that, rounded once)
 *   dw[i] += sum_r g[r,i] * (x[r,i] * rstd_r)                (fp32; dw may be NULL)
 *
 * Layout: x, out, dout, dx [rows, C] bf16 row-major; w [C] bf16; ms [rows] fp32; dw [C] fp32.
 * The _ld launchers (the QK norms on the views of the fused q/k/v projection output) take x, and in the
 * backward dx, as rows of nh heads a token with the row stride ld between tokens: row r = n * nh + h is
 * at n * ld + h * C (nh = 1, ld = C: contiguous, what the plain launchers pass); out and dout stay
 * contiguous [rows, C]. Only addresses change, never the arithmetic or its order: a strided call gives
 * the bits of the contiguous one.
 * Parallelism and order (all fixed, so bitwise reproducible):
 * - forward and dx: a group of L lanes per row, L = the smallest power of 2 >= C/8, at most 32
 *   (C = 2048: a warp per row; head_dim 128: 2 rows per warp; 64: 4 rows). Lane l of the group owns
 *   the 8-element packs l, l+L, l+2L, ... of the row (16-byte loads when C % 8 == 0 and the pointers
 *   are aligned; the same elements and order otherwise), sums them in that order in fp32, and the
 *   group is combined by an xor butterfly (offsets L/2 .. 1; for L = 32 that is warp_reduce_sum).
 *   L depends on C only. Every element is read and written by the lane that owns it, so out may
 *   equal x and dx may equal dout.
 * - dw: the rows are cut into chunks of R rows (R a function of rows and C only). A block of 32
 *   columns x 8 row-lanes; lane y sums rows r0+y, r0+y+8, ... of its chunk in order, the 8 lane sums
 *   are added in lane order -> part[chunk, C] in workspace slot 0. The last block of a column block
 *   to finish (an integer counter, after a __threadfence) then sums the chunks in the same shape
 *   (lane y: chunks y, y+8, ... in order, then lanes in order) into dw: one launch, the order of the
 *   two-kernel form (rmsnorm_dw_sum_kernel, kept for the tests), so the same bits. accumulate_dw 0
 *   (rmsnorm_backward_acc) writes dw = 0 + sum instead of adding (the first microbatch: no memset of
 *   the gradients).
 * - dw and dx in one launch: the dw blocks ride as the last col_blocks x nchunks blocks of the dx launch
 *   (RmsDwRide; dx's warps stride over their own grid, the ones before), the same blocks, threads and
 *   order as rmsnorm_dw_partial_kernel's (32 x 8 threads are the dx block's 256, tx = thread % 32), so
 *   the same bits, one launch instead of two (a backward's norms were a quarter of qwen3-0.6b's
 *   launches). Both read dout and x and write apart, so the launcher rides only when dx overlaps neither;
 *   where it does (dx may alias dout), dw runs first in its own launch, as before.
 * residual_rmsnorm_forward fuses the residual add in front (resid = bf16(a + b) stored, then the forward on
 * it, each lane on the elements it wrote): the same bits as residual_forward then rmsnorm_forward.
 * CPU reference: rmsnorm_forward, rmsnorm_backward in llmc/cpu/cpu_kernels.h (same per-element
 * expressions; the sums there are serial, here a fixed tree, so they agree to rounding).
 * -protect ew (llmc/sdc/ewdup.cuh): the forward kernels and dx take an EwDup; with flags, a variant (template DUP)
 * computes everything it stores a second time from the loaded values through dup_opaque (the residual, the sum of
 * squares and its own butterfly, ms, rstd, out; dx from its own dot), compares the bit patterns and sets the
 * output's flag (forward: f0 the norm's out and ms, or for the residual-fused kernel f0 the residual, f1 the norm;
 * dx: f0). It stores the same bits as the plain kernel.
 * Accounting (ew_account, COST_NORM), a record per launch: nominal FLOPs an element 4 forward (5 with the
 * residual add, +4 integer operations for a fingerprint), 7 for dx, 3 for the dw partials, twice that (and a
 * comparison) duplicated; bytes as the kernels read and write them once (the dw partial kernel reads dout and x
 * again: its own traffic). */
#ifndef TSDC_RMSNORM_CUH
#define TSDC_RMSNORM_CUH

#include "cuda_common.cuh"
#include "convert.cuh"
#include "../sdc/fingerprint.cuh"
#include "../sdc/ewdup.cuh"
#include "../sdc/bound.h"
#include "../sdc/attcheck.cuh"

#define RMSNORM_BLOCK 256     /* 8 warps, each 32/L rows at a time */
#define RMSNORM_DW_TX 32      /* dw kernels: columns per block */
#define RMSNORM_DW_TY 8       /* dw kernels: row-lanes per column */

/* sum over the L lanes of an aligned lane group (L a power of 2 <= 32; L = 32 is warp_reduce_sum's
 * butterfly): xor offsets L/2 .. 1 stay inside the group; all 32 lanes must call it */
__device__ __forceinline__ float rmsnorm_group_sum(float v, int L) {
    for (int off = L >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* the same in double (the output rows' norms of -protect bound) */
__device__ __forceinline__ double rmsnorm_group_sum_f64(double v, int L) {
    for (int off = L >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* y = w * (x * rstd), or x * rstd without a weight, on 8 loaded values (the forward's second pass) */
__device__ __forceinline__ static void rmsnorm_scale8(float f[8], const bf16* w, int c0, int cnt, bool vec, float rstd) {
    if (w) {
        float wv[8];
        load8_f32(wv, w + c0, cnt, vec, 0.0f);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = wv[j] * (f[j] * rstd);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = f[j] * rstd;
    }
}

/* a valid row's output (the lane's packs): ms, out, the fingerprint, the duplicate's comparison; returns the lane's
 * sum of the squares of the stored values in double when sq, else 0 */
template <bool FP, bool DUP>
__device__ __forceinline__ static double rmsnorm_row_store(bf16* out, float* ms, const bf16* src, const bf16* w, float m, int row, int C,
                                                           float eps, int L, int gl, bool vec, Fingerprint* fp, float m2, const EwDup& dup,
                                                           int oi, bool* bad, bool sq) {
    double oss = 0.0;
    const float rstd = 1.0f / sqrtf(m + eps);
    if (gl == 0 && ms) ms[row] = m;
    float rstd2 = 0.0f;
    if (DUP) {
        rstd2 = 1.0f / sqrtf(m2 + eps);
        *bad |= __float_as_uint(m) != __float_as_uint(m2);
    }
    bf16* o = out + (size_t)row * C;
    for (int c0 = gl * 8; c0 < C; c0 += L * 8) {
        const int cnt = min(8, C - c0);
        float f[8], f2[8];
        load8_f32(f, src + c0, cnt, vec, 0.0f);
        if (DUP)
#pragma unroll
            for (int j = 0; j < 8; j++) f2[j] = dup_opaque(f[j]);
        rmsnorm_scale8(f, w, c0, cnt, vec, rstd);
        if (DUP) {
            rmsnorm_scale8(f2, w, c0, cnt, vec, rstd2);
            for (int j = 0; j < cnt; j++) {
                const bf16 p = ewdup_plant(dup, oi, (size_t)row * C + c0 + j, __float2bfloat16_rn(f[j]));
                f[j] = __bfloat162float(p);
                *bad |= ewdup_differs(p, __float2bfloat16_rn(f2[j]));
            }
        }
        if (!FP || out) store8_bf16(o + c0, f, cnt, vec);
        if (FP)
            for (int j = 0; j < cnt; j++)
                fp_add(fp, (uint64_t)row * C + c0 + j, (uint64_t)__bfloat16_as_ushort(__float2bfloat16_rn(f[j])), 16);
        if (sq)
            for (int j = 0; j < cnt; j++) {
                const double v = (double)__bfloat162float(__float2bfloat16_rn(f[j]));
                oss += v * v;
            }
    }
    return oss;
}
/* The forward's second half, shared by the plain and the residual-fused kernels (so their bits are the same by
 * construction): ms = (the group's sum of the lanes' partial sums acc) / C, every lane of the warp taking part
 * (valid row or not, for the shuffles); for a valid row, rstd = 1 / sqrtf(ms + eps), lane 0 of the group stores
 * ms (ms not NULL), and each lane reads its own packs of src (the row's source, the values acc summed) and
 * writes out[row] = bf16(rmsnorm_scale8). FP: also folds every output element into *fp; out may then be NULL.
 * DUP: acc2 is the duplicate's sum of squares (from its own copy of the row's values); the duplicate's ms, rstd and
 * out (from the values read back through dup_opaque) are compared with the primary's, any difference into *bad;
 * output index oi of the plant (ewdup.cuh) is the norm's out. onorm (not NULL; the same for the whole grid): the stored
 * output row's 2-norm for -protect bound, mmb_norm (llmc/sdc/bound.h) of the sum of the squares of the stored bf16
 * values in double (each lane its packs in order, then the group's butterfly), every lane of the warp taking part. */
template <bool FP, bool DUP>
__device__ __forceinline__ static void rmsnorm_forward_row_tail(bf16* out, float* ms, const bf16* src, const bf16* w, float acc,
                                                                int row, bool valid, int C, float eps, int L, int gl, bool vec,
                                                                Fingerprint* fp, float acc2, const EwDup& dup, int oi, bool* bad,
                                                                float* onorm) {
    const float m = rmsnorm_group_sum(acc, L) / C;
    const float m2 = DUP ? rmsnorm_group_sum(acc2, L) / C : 0.0f;
    double oss = 0.0;
    if (valid) oss = rmsnorm_row_store<FP, DUP>(out, ms, src, w, m, row, C, eps, L, gl, vec, fp, m2, dup, oi, bad, onorm != nullptr);
    if (onorm) {
        oss = rmsnorm_group_sum_f64(oss, L);
        if (valid && gl == 0) onorm[row] = mmb_norm(oss);
    }
}

/* FP: also fold every output element into the Q/K fingerprint accumulator fp; out and ms may then be NULL.
 * DUP: duplicated (ewdup.cuh), f0 the norm's flag */
template <bool FP, bool DUP>
__global__ static void rmsnorm_forward_kernel(bf16* out, float* ms, const bf16* x, const bf16* w, int rows, int C, int nh, size_t ldx,
                                              float eps, int L, bool vec, unsigned long long* fp_acc, EwDup dup, float* onorm) {
    Fingerprint fp = {0, 0};
    bool bad = false;
    const int lane = threadIdx.x & 31, gl = lane & (L - 1), rpw = 32 / L;
    const int wpb = blockDim.x >> 5, step = gridDim.x * wpb * rpw;
    /* base is the same for the whole warp, so every lane reaches the shuffles */
    for (int base = (blockIdx.x * wpb + (threadIdx.x >> 5)) * rpw; base < rows; base += step) {
        const int row = base + lane / L;
        const bool valid = row < rows;
        const bf16* xr = x + (size_t)(row / nh) * ldx + (size_t)(row % nh) * C;
        float acc = 0.0f, acc2 = 0.0f;
        if (valid) {
            for (int c0 = gl * 8; c0 < C; c0 += L * 8) {
                const int cnt = min(8, C - c0);
                float f[8];
                load8_f32(f, xr + c0, cnt, vec, 0.0f);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < cnt) {
                        acc += f[j] * f[j];
                        if (DUP) {
                            const float g = dup_opaque(f[j]);
                            acc2 += g * g;
                        }
                    }
            }
        }
        rmsnorm_forward_row_tail<FP, DUP>(out, ms, xr, w, acc, row, valid, C, eps, L, gl, vec, &fp, acc2, dup, 0, &bad, onorm);
    }
    if (FP) fp_block_reduce(fp, fp_acc);
    if (DUP) ewdup_flag(dup, bad, false);
}

/* the residual add fused in front of the norm: resid = bf16(a + b) stored, then the forward above on the
 * stored (rounded) values, by the lane that wrote them (it reads back only its own elements). DUP: duplicated
 * (ewdup.cuh), output 0 (f0) the residual, 1 (f1) the norm's out and ms; the duplicate's norm from the residual as
 * stored (so a wrong residual sets the residual's flag alone, as ew's recomputation from the stored tensors does) */
template <bool DUP, bool BND, bool AS>
__global__ static void residual_rmsnorm_forward_kernel(bf16* resid, bf16* out, float* ms, const bf16* a, const bf16* b, const bf16* w,
                                                       int rows, int C, float eps, int L, bool vec, EwDup dup, float* onorm, MmbFused mb,
                                                       AttcScan as) {
    /* AS: -protect att's fused forward scan rides on the launch: its last as.blocks blocks run it (attcheck.cuh), the
     * others the rows over their own grid. That instance carries the scan's registers and shared memory (ptxas, sm_90: 82
     * registers and 33 KB against 40-53 and none), so its row blocks run at most 3 a SM: not charged by the cost model,
     * measured on a GPU */
    const unsigned gr = gridDim.x - (AS ? as.blocks : 0u);
    if (AS && blockIdx.x >= gr) {
        attc_scan_ride_block(as, (int)(blockIdx.x - gr));
        return;
    }
    bool bad_res = false, bad_norm = false, bad_b = false;
    const int lane = threadIdx.x & 31, gl = lane & (L - 1), rpw = 32 / L;
    const int wpb = blockDim.x >> 5, step = (int)gr * wpb * rpw;
    for (int base = (blockIdx.x * wpb + (threadIdx.x >> 5)) * rpw; base < rows; base += step) {
        const int row = base + lane / L;
        const bool valid = row < rows;
        const size_t ro = (size_t)row * C;
        float acc = 0.0f, acc2 = 0.0f, nxb = 0.0f;
        if (BND) {   /* the product's input row norm: given (mb.xn), or taken here from the input (mb.xin), every lane of
                      * the warp in the group's butterfly: each lane its packs in double, in order */
            if (mb.xin) {
                const bf16* xi = static_cast<const bf16*>(mb.xin) + (size_t)row * mb.kin;
                const bool vx = mb.kin % 8 == 0 && (uintptr_t)mb.xin % 16 == 0;
                double ss = 0.0;
                if (valid)
                    for (int c0 = gl * 8; c0 < mb.kin; c0 += L * 8) {
                        const int cnt = min(8, mb.kin - c0);
                        float f[8];
                        load8_f32(f, xi + c0, cnt, vx, 0.0f);
                        for (int j = 0; j < cnt; j++) ss += (double)f[j] * f[j];
                    }
                nxb = mmb_norm(rmsnorm_group_sum_f64(ss, L));
            } else if (mb.xnp) {
                if (valid) {
                    double ss = 0.0;
                    for (int p = 0; p < mb.np; p++) ss += mb.xnp[(size_t)row * mb.np + p];
                    nxb = mmb_norm(ss);
                }
            } else if (valid) {
                nxb = mb.xn[row];
            }
        }
        if (valid) {
            for (int c0 = gl * 8; c0 < C; c0 += L * 8) {
                const int cnt = min(8, C - c0);
                float fa[8], fb[8], f2[8];
                load8_f32(fa, a + ro + c0, cnt, vec, 0.0f);
                load8_f32(fb, b + ro + c0, cnt, vec, 0.0f);
                if (BND)   /* -protect bound on b (a product's output: o, down) as read here (llmc/sdc/bound.h) */
                    for (int j = 0; j < cnt; j++) bad_b |= mmb_violates(fb[j], nxb, mb.wn0[c0 + j], mb.c);
                if (DUP)
#pragma unroll
                    for (int j = 0; j < 8; j++) f2[j] = __bfloat162float(__float2bfloat16_rn(dup_opaque(fa[j]) + dup_opaque(fb[j])));
#pragma unroll
                for (int j = 0; j < 8; j++) fa[j] = __bfloat162float(__float2bfloat16_rn(fa[j] + fb[j]));   /* AddOp, rounded */
                if (DUP)
                    for (int j = 0; j < cnt; j++) {
                        fa[j] = __bfloat162float(ewdup_plant(dup, 0, ro + c0 + j, __float2bfloat16_rn(fa[j])));
                        bad_res |= __float_as_uint(fa[j]) != __float_as_uint(f2[j]);
                    }
                store8_bf16(resid + ro + c0, fa, cnt, vec);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < cnt) {
                        acc += fa[j] * fa[j];
                        if (DUP) {   /* the norm's duplicate on the residual as stored, as ew's recomputation reads it */
                            const float r2 = dup_opaque(fa[j]);
                            acc2 += r2 * r2;
                        }
                    }
            }
        }
        rmsnorm_forward_row_tail<false, DUP>(out, ms, resid + ro, w, acc, row, valid, C, eps, L, gl, vec, nullptr, acc2, dup, 1, &bad_norm,
                                             onorm);
    }
    if (DUP) ewdup_flag(dup, bad_res, bad_norm);
    if (BND && bad_b) atomicOr(mb.f0, 1);
}

/* part[chunk, c] = sum over the chunk's rows of g * (x * rstd), 8 row-lanes then lanes in order; then the last block of
 * the column block to finish (an integer counter done[blockIdx.x], after a __threadfence; it leaves the counter at 0
 * again) adds the chunks' partials into dw as rmsnorm_dw_sum_kernel does (the same order: the same bits), so one
 * launch does both (done NULL: the partials alone, for rmsnorm_dw_sum_kernel). Block (bx, by) of a col_blocks x nchunks
 * grid, thread (tx, ty) of 32 x 8: rmsnorm_dw_partial_kernel's own, or a block riding on another launch (RmsDwRide). dout(r, c):
 * the gradient's element (RmsDout: as stored; qknorm_rope.cuh's rider makes it from RoPE's output gradient) */
struct RmsDout {   /* the dw pass's gradient as stored: dout [rows, C] contiguous */
    const bf16* p;
    int C;
    __device__ float operator()(int r, int c) const { return __bfloat162float(p[(size_t)r * C + c]); }
};
/* the block's 8 values of column tx (one a ty) summed in ty order through sh, the block's [8][33] scratch (every thread
 * calls; the sum is valid in the threads ty == 0); a barrier first, as sh may still be read by an earlier pass */
__device__ static float rmsnorm_dw_ty_sum(float (*sh)[RMSNORM_DW_TX + 1], int tx, int ty, float v) {
    __syncthreads();
    sh[ty][tx] = v;
    __syncthreads();
    float u = sh[0][tx];
#pragma unroll
    for (int k = 1; k < RMSNORM_DW_TY; k++) u += sh[k][tx];
    return u;
}
/* dw[c] (+)= sum over chunks of part[chunk, c] for the block's 32 columns: thread (tx, ty) sums chunks ty, ty + 8, ...
 * in order, then the 8 lane sums in lane order (accumulate 0: dw[c] = 0 + that, the first microbatch's write that
 * replaces the memset of the gradients); sh the block's [8][33] scratch. The dw pass's last block and
 * rmsnorm_dw_sum_kernel both run it: the same bits */
__device__ static void rmsnorm_dw_sum_cols(float* dw, const volatile float* part, int nchunks, int C, int c, int tx, int ty, int accumulate,
                                           float (*sh)[RMSNORM_DW_TX + 1]) {
    float t = 0.0f;
    if (c < C)
        for (int k = ty; k < nchunks; k += RMSNORM_DW_TY) t += part[(size_t)k * C + c];
    const float u = rmsnorm_dw_ty_sum(sh, tx, ty, t);
    if (ty == 0 && c < C) dw[c] = (accumulate ? dw[c] : 0.0f) + u;
}
template <typename G>
__device__ static void rmsnorm_dw_partial_block(int bx, int by, int nchunks, int tx, int ty, float* part, const G& dout,
                                                const bf16* x, const float* ms, int rows, int C, int nh, size_t ldx, float eps, int R,
                                                float* dw, int accumulate, unsigned* done) {
    __shared__ float sh[RMSNORM_DW_TY][RMSNORM_DW_TX + 1];
    const int c = bx * RMSNORM_DW_TX + tx;
    const int r0 = by * R, r1 = min(rows, r0 + R);
    float s = 0.0f;
    if (c < C) {
        for (int r = r0 + ty; r < r1; r += RMSNORM_DW_TY) {
            const float rstd = 1.0f / sqrtf(ms[r] + eps);
            const size_t xi = (size_t)(r / nh) * ldx + (size_t)(r % nh) * C + c;
            s += dout(r, c) * (__bfloat162float(x[xi]) * rstd);
        }
    }
    const float t = rmsnorm_dw_ty_sum(sh, tx, ty, s);
    if (ty == 0 && c < C) part[(size_t)by * C + c] = t;
    if (!done) return;
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (tx == 0 && ty == 0) {
        last = atomicAdd(done + bx, 1u) == (unsigned)(nchunks - 1);
        if (last) done[bx] = 0;   /* every block of the column block has counted: ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    rmsnorm_dw_sum_cols(dw, part, nchunks, C, c, tx, ty, accumulate, sh);
}
__global__ static void rmsnorm_dw_partial_kernel(float* part, const bf16* dout, const bf16* x, const float* ms,
                                                 int rows, int C, int nh, size_t ldx, float eps, int R, float* dw, int accumulate,
                                                 unsigned* done) {
    const RmsDout g = {dout, C};
    rmsnorm_dw_partial_block((int)blockIdx.x, (int)blockIdx.y, (int)gridDim.y, (int)threadIdx.x, (int)threadIdx.y, part, g, x, ms,
                             rows, C, nh, ldx, eps, R, dw, accumulate, done);
}
/* the dw pass riding on the dx launch: its blocks are the launch's last col_blocks * nchunks (0: none) */
typedef struct {
    float* part;
    float* dw;
    unsigned* done;
    int R, accumulate, col_blocks, nchunks;
} RmsDwRide;

/* dx and x at the strided rows (nh, ld), dout contiguous. FP: also fold every dx element (bf16, at its logical index
 * row * C + c) into the fingerprint accumulator fp; dx may then be NULL (fingerprint only) */
template <bool FP, bool DUP>
__global__ static void rmsnorm_backward_dx_kernel(bf16* dx, const bf16* dout, const bf16* x, const bf16* w, const float* ms,
                                                  int rows, int C, int nh, size_t ld, float eps, int accumulate, int L, bool vec,
                                                  unsigned long long* fp_acc, EwDup dup, RmsDwRide dwr) {
    static_assert(RMSNORM_BLOCK == RMSNORM_DW_TX * RMSNORM_DW_TY, "the riding dw blocks are the launch's");
    const unsigned gr = gridDim.x - (unsigned)(dwr.col_blocks * dwr.nchunks);
    if (blockIdx.x >= gr) {
        const int k = (int)(blockIdx.x - gr);
        const RmsDout g = {dout, C};
        rmsnorm_dw_partial_block(k % dwr.col_blocks, k / dwr.col_blocks, dwr.nchunks, (int)(threadIdx.x % RMSNORM_DW_TX),
                                 (int)(threadIdx.x / RMSNORM_DW_TX), dwr.part, g, x, ms, rows, C, nh, ld, eps, dwr.R, dwr.dw,
                                 dwr.accumulate, dwr.done);
        return;
    }
    Fingerprint fp = {0, 0};
    bool bad = false;
    const int lane = threadIdx.x & 31, gl = lane & (L - 1), rpw = 32 / L;
    const int wpb = blockDim.x >> 5, step = (int)gr * wpb * rpw;
    for (int base = (blockIdx.x * wpb + (threadIdx.x >> 5)) * rpw; base < rows; base += step) {
        const int row = base + lane / L;
        const bool valid = row < rows;
        const size_t rb = (size_t)row * C, rs = (size_t)(row / nh) * ld + (size_t)(row % nh) * C;
        float acc = 0.0f, acc2 = 0.0f;
        if (valid) {
            for (int c0 = gl * 8; c0 < C; c0 += L * 8) {
                const int cnt = min(8, C - c0);
                float g[8], xv[8], wv[8], g2[8];
                load8_f32(g, dout + rb + c0, cnt, vec, 0.0f);
                load8_f32(xv, x + rs + c0, cnt, vec, 0.0f);
                if (w) load8_f32(wv, w + c0, cnt, vec, 0.0f);
                if (DUP)
#pragma unroll
                    for (int j = 0; j < 8; j++) g2[j] = w ? dup_opaque(wv[j]) * dup_opaque(g[j]) : dup_opaque(g[j]);
                if (w) {
#pragma unroll
                    for (int j = 0; j < 8; j++) g[j] = wv[j] * g[j];
                }
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < cnt) {
                        acc += g[j] * xv[j];
                        if (DUP) acc2 += g2[j] * dup_opaque(xv[j]);
                    }
            }
        }
        const float dot = rmsnorm_group_sum(acc, L);
        const float dot2 = DUP ? rmsnorm_group_sum(acc2, L) : 0.0f;
        if (!valid) continue;
        const float rstd = 1.0f / sqrtf(ms[row] + eps);
        const float coef = dot / C * rstd * rstd * rstd;
        float rstd2 = 0.0f, coef2 = 0.0f;
        if (DUP) {
            rstd2 = 1.0f / sqrtf(dup_opaque(ms[row]) + eps);
            coef2 = dot2 / C * rstd2 * rstd2 * rstd2;
        }
        for (int c0 = gl * 8; c0 < C; c0 += L * 8) {
            const int cnt = min(8, C - c0);
            float g[8], xv[8], wv[8], old[8], g2[8];
            load8_f32(g, dout + rb + c0, cnt, vec, 0.0f);
            load8_f32(xv, x + rs + c0, cnt, vec, 0.0f);
            if (w) load8_f32(wv, w + c0, cnt, vec, 0.0f);
            if (DUP)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float gw = w ? dup_opaque(wv[j]) * dup_opaque(g[j]) : dup_opaque(g[j]);
                    g2[j] = gw * rstd2 - dup_opaque(xv[j]) * coef2;
                }
            if (w) {
#pragma unroll
                for (int j = 0; j < 8; j++) g[j] = wv[j] * g[j];
            }
#pragma unroll
            for (int j = 0; j < 8; j++) g[j] = g[j] * rstd - xv[j] * coef;
            if (accumulate) {
                load8_f32(old, dx + rs + c0, cnt, vec, 0.0f);
#pragma unroll
                for (int j = 0; j < 8; j++) g[j] = old[j] + g[j];
                if (DUP)
#pragma unroll
                    for (int j = 0; j < 8; j++) g2[j] = dup_opaque(old[j]) + g2[j];
            }
            if (DUP)
                for (int j = 0; j < cnt; j++) {
                    const bf16 p = ewdup_plant(dup, 0, rb + c0 + j, __float2bfloat16_rn(g[j]));
                    g[j] = __bfloat162float(p);
                    bad |= ewdup_differs(p, __float2bfloat16_rn(g2[j]));
                }
            if (!FP || dx) store8_bf16(dx + rs + c0, g, cnt, vec);
            if (FP)
                for (int j = 0; j < cnt; j++)
                    fp_add(&fp, (uint64_t)rb + c0 + j, (uint64_t)__bfloat16_as_ushort(__float2bfloat16_rn(g[j])), 16);
        }
    }
    if (FP) fp_block_reduce(fp, fp_acc);
    if (DUP) ewdup_flag(dup, bad, false);
}

/* the column blocks' counters of the fused dw pass: a device array kept across launches (each launch leaves its
 * counters at 0), grown (zeroed) on first use; the stream order serialises the launches that share it */
static unsigned* rmsnorm_dw_done(int col_blocks) {
    static unsigned* d = NULL;
    static int n = 0;
    if (col_blocks > n) {
        if (d) {
            cudaCheck(cudaDeviceSynchronize());
            cudaCheck(cudaFree(d));
        }
        cudaCheck(cudaMalloc(&d, sizeof(unsigned) * (size_t)col_blocks));
        cudaCheck(cudaMemset(d, 0, sizeof(unsigned) * (size_t)col_blocks));
        n = col_blocks;
    }
    return d;
}
/* the dw pass's second step as a kernel of its own (the tests hold the one-launch form to it) */
__global__ static void rmsnorm_dw_sum_kernel(float* dw, const float* part, int nchunks, int C, int accumulate) {
    __shared__ float sh[RMSNORM_DW_TY][RMSNORM_DW_TX + 1];
    rmsnorm_dw_sum_cols(dw, part, nchunks, C, (int)(blockIdx.x * RMSNORM_DW_TX + threadIdx.x), (int)threadIdx.x, (int)threadIdx.y, accumulate, sh);
}

/* lanes per row: the smallest power of 2 >= C/8 (one 8-element pack each), at most 32 */
static int rmsnorm_lanes(int C) {
    int L = 1;
    while (L < 32 && L * 8 < C) L *= 2;
    return L;
}
static int rmsnorm_grid(int rows, int L) {
    int rows_per_block = (RMSNORM_BLOCK / 32) * (32 / L), b = CEIL_DIV(rows, rows_per_block);
    return b > EW_MAX_GRID ? EW_MAX_GRID : b;
}

static void rmsnorm_check_ld(const char* who, int nh, int C, int ld) {
    if (nh < 1 || ld < nh * C) tsdc_fail("%s: row stride %d below %d heads x %d", who, ld, nh, C);
}
/* out [N*nh, C] (contiguous), ms [N*nh] = the forward of x, whose row (n, h) is at n * ldx + h * C */
/* onorm (not NULL): the rows' 2-norms of out as stored (-protect bound's input norms, llmc/sdc/bound.h) */
static void rmsnorm_forward_ld(bf16* out, float* ms, const bf16* x, int ldx, const bf16* w, int N, int nh, int C, float eps,
                               cudaStream_t stream, EwDup dup = ew_dup_none(), float* onorm = NULL) {
    const int rows = N * nh;
    if (rows <= 0 || C <= 0) return;
    rmsnorm_check_ld("rmsnorm_forward_ld", nh, C, ldx);
    bool vec = C % 8 == 0 && ldx % 8 == 0 && ptr_aligned(out, 16) && ptr_aligned(x, 16) && (!w || ptr_aligned(w, 16));
    const int L = rmsnorm_lanes(C), d = ew_dup_on(dup);
    if (d)
        rmsnorm_forward_kernel<false, true><<<rmsnorm_grid(rows, L), RMSNORM_BLOCK, 0, stream>>>(out, ms, x, w, rows, C, nh, (size_t)ldx, eps,
                                                                                               L, vec, NULL, dup, onorm);
    else
        rmsnorm_forward_kernel<false, false><<<rmsnorm_grid(rows, L), RMSNORM_BLOCK, 0, stream>>>(out, ms, x, w, rows, C, nh, (size_t)ldx, eps,
                                                                                                L, vec, NULL, dup, onorm);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    ew_account(COST_NORM, d ? "rmsnorm_forward_kernel_dup" : "rmsnorm_forward_kernel", rmsnorm_grid(rows, L), (d ? 9.0 : 4.0) * n + (onorm ? 2.0 * n : 0.0),
               n * 2 + (w ? (size_t)C * 2 : 0), n * 2 + (ms ? (size_t)rows * 4 : 0) + (onorm ? (size_t)rows * 4 : 0));   /* x (w) in; out, ms (norms) out */
}
static void rmsnorm_forward(bf16* out, float* ms, const bf16* x, const bf16* w, int rows, int C, float eps, cudaStream_t stream,
                            EwDup dup = ew_dup_none(), float* onorm = NULL) {
    rmsnorm_forward_ld(out, ms, x, C, w, rows, 1, C, eps, stream, dup, onorm);
}
/* resid = a + b (residual.cuh's add, rounded to bf16 and stored), then out, ms = rmsnorm_forward(resid):
 * the same bits as residual_forward followed by rmsnorm_forward, in one pass */
/* mb (not NULL): -protect bound's check of b (the o or down projection's output) fused in: |b_ij| against mb->xn[i]
 * (its input rows' norms) or the norm of row i of mb->xin (the input, [rows, mb->kin], taken here), mb->wn0[j], mb->c,
 * flag mb->f0 (llmc/sdc/bound.h) */
template <bool DUP>
static void residual_rmsnorm_launch(int g, bf16* resid, bf16* out, float* ms, const bf16* a, const bf16* b, const bf16* w, int rows, int C,
                                    float eps, int L, bool vec, EwDup dup, float* onorm, const MmbFused* mb, const AttcScan* as,
                                    cudaStream_t stream) {
    static_assert(RMSNORM_BLOCK == ATTC_WARPS * 32, "the riding attention scan's blocks are the launch's");
    const MmbFused none = {NULL, NULL, NULL, 0.0f, NULL, NULL, NULL, NULL, 0};
    const AttcScan no = {};
    const unsigned gg = (unsigned)g + (as ? as->blocks : 0u);
    const MmbFused& m = mb ? *mb : none;
    if (mb && as) residual_rmsnorm_forward_kernel<DUP, true, true><<<gg, RMSNORM_BLOCK, 0, stream>>>(resid, out, ms, a, b, w, rows, C, eps, L, vec, dup, onorm, m, *as);
    else if (as) residual_rmsnorm_forward_kernel<DUP, false, true><<<gg, RMSNORM_BLOCK, 0, stream>>>(resid, out, ms, a, b, w, rows, C, eps, L, vec, dup, onorm, m, *as);
    else if (mb) residual_rmsnorm_forward_kernel<DUP, true, false><<<gg, RMSNORM_BLOCK, 0, stream>>>(resid, out, ms, a, b, w, rows, C, eps, L, vec, dup, onorm, m, no);
    else residual_rmsnorm_forward_kernel<DUP, false, false><<<gg, RMSNORM_BLOCK, 0, stream>>>(resid, out, ms, a, b, w, rows, C, eps, L, vec, dup, onorm, m, no);
}
static int g_rmsnorm_grid_cap = 0;   /* test-only: > 0 caps residual_rmsnorm_forward's rows grid, so that its warps stride */
static void residual_rmsnorm_forward(bf16* resid, bf16* out, float* ms, const bf16* a, const bf16* b, const bf16* w, int rows, int C,
                                     float eps, cudaStream_t stream, EwDup dup = ew_dup_none(), float* onorm = NULL,
                                     const MmbFused* mb = NULL, const AttcScan* as = NULL) {
    if (rows <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && ptr_aligned(resid, 16) && ptr_aligned(out, 16) && ptr_aligned(a, 16) && ptr_aligned(b, 16) &&
               (!w || ptr_aligned(w, 16));
    const int L = rmsnorm_lanes(C), d = ew_dup_on(dup);
    int gr = rmsnorm_grid(rows, L);
    if (g_rmsnorm_grid_cap > 0 && gr > g_rmsnorm_grid_cap) gr = g_rmsnorm_grid_cap;
    if (d) residual_rmsnorm_launch<true>(gr, resid, out, ms, a, b, w, rows, C, eps, L, vec, dup, onorm, mb, as, stream);
    else residual_rmsnorm_launch<false>(gr, resid, out, ms, a, b, w, rows, C, eps, L, vec, dup, onorm, mb, as, stream);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    ew_account(COST_NORM, d ? "residual_rmsnorm_forward_kernel_dup" : "residual_rmsnorm_forward_kernel", gr,
               (d ? 11.0 : 5.0) * n + (onorm ? 2.0 * n : 0.0) + (mb ? 3.0 * n : 0.0) + (mb && mb->xin ? 2.0 * rows * mb->kin : 0.0),
               n * 4 + (w ? (size_t)C * 2 : 0) +
                   (mb ? (mb->xin ? (size_t)rows * mb->kin * 2 : mb->xnp ? (size_t)rows * mb->np * 8 : (size_t)rows * 4) + (size_t)C * 4 : 0),
               n * 4 + (ms ? (size_t)rows * 4 : 0) + (onorm ? (size_t)rows * 4 : 0));   /* a, b (w, the bound's input norms or input) in; resid, out, ms (norms) out */
}
/* rmsnorm_forward with the Q/K fingerprint of its output (out, ms NULL: fingerprint only) XORed into the
 * accumulator fp (fingerprint.cuh); does not wait */
static void rmsnorm_forward_fp(bf16* out, float* ms, const bf16* x, const bf16* w, int rows, int C, float eps, unsigned long long* fp,
                               cudaStream_t stream) {
    if (rows <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && (!out || ptr_aligned(out, 16)) && ptr_aligned(x, 16) && (!w || ptr_aligned(w, 16));
    const int L = rmsnorm_lanes(C);
    int grid = rmsnorm_grid(rows, L);
    if (grid > FP_MAX_GRID) grid = FP_MAX_GRID;
    rmsnorm_forward_kernel<true, false><<<grid, RMSNORM_BLOCK, 0, stream>>>(out, ms, x, w, rows, C, 1, (size_t)C, eps, L, vec, fp,
                                                                            ew_dup_none(), NULL);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    ew_account(COST_NORM, "rmsnorm_forward_kernel_fp", grid, (out ? 4.0 : 2.0) * n + 4.0 * n, n * 2 + (w ? (size_t)C * 2 : 0), (out ? n * 2 : 0) + (ms ? (size_t)rows * 4 : 0));
}

/* dx (= or +=) d/dx; dw (may be NULL) += the weight gradient (accumulate_dw 0: dw = 0 + it, the first
 * microbatch's write, no memset before). x and dx: row (n, h) at n * ld + h * C; dout contiguous [N*nh, C].
 * fp (may be NULL): the fingerprint of dx (as stored, at its logical index) XORed into that accumulator; dx may
 * then be NULL (fingerprint only; not with accumulate_dx). Uses workspace slot 0 when dw != NULL.
 * One launch: the dw blocks ride on the dx launch (RmsDwRide) unless dx overlaps dout or x, when dw runs first in
 * its own launch (g_rmsnorm_dw_apart, test-only: always apart). */
static int g_rmsnorm_dw_apart = 0;
/* the dw pass's shape: about 2048 blocks of 256 threads; at least 128 rows (16 per lane) a chunk. R depends on (rows, C)
 * only, so a given shape is always summed the same way */
static void rmsnorm_dw_plan(int rows, int C, int* col_blocks, int* R, int* nchunks) {
    *col_blocks = CEIL_DIV(C, RMSNORM_DW_TX);
    int target = 2048 / *col_blocks;
    if (target < 1) target = 1;
    *R = CEIL_DIV(rows, target);
    if (*R < 128) *R = 128;
    *nchunks = CEIL_DIV(rows, *R);   /* <= target <= 2048 */
}
/* its traffic in one record: dout and x read, the partials written and read back by the last blocks, dw */
static void rmsnorm_dw_bytes(int rows, int C, int nchunks, int accumulate_dw, double* flops, size_t* rd, size_t* wr) {
    *flops = 3.0 * rows * C + (double)nchunks * C;
    *rd = (size_t)rows * C * 4 + (size_t)rows * 4 + (size_t)nchunks * C * 4 + (accumulate_dw ? (size_t)C * 4 : 0);
    *wr = (size_t)nchunks * C * 4 + (size_t)C * 4;
}
static int g_rmsnorm_dx_grid_cap = 0;   /* test-only: > 0 caps the dx rows' grid, so that its warps stride */
static bool rmsnorm_bytes_overlap(const void* a, size_t na, const void* b, size_t nb) {
    const char *pa = (const char*)a, *pb = (const char*)b;
    return a && b && pa < pb + nb && pb < pa + na;
}
static void rmsnorm_backward_ld(bf16* dx, float* dw, const bf16* dout, const bf16* x, int ld, const bf16* w, const float* ms,
                                int N, int nh, int C, float eps, int accumulate_dx, int accumulate_dw, cudaStream_t stream,
                                unsigned long long* fp = NULL, EwDup dup = ew_dup_none()) {
    const int rows = N * nh;
    if (rows <= 0 || C <= 0) return;
    rmsnorm_check_ld("rmsnorm_backward_ld", nh, C, ld);
    if (fp && !dx && accumulate_dx) tsdc_fail("rmsnorm_backward_ld: a fingerprint-only call cannot accumulate into dx");
    if (fp && ew_dup_on(dup)) tsdc_fail("rmsnorm_backward_ld: a fingerprinted call is not duplicated");
    RmsDwRide dwr = {NULL, NULL, NULL, 0, 0, 0, 0};
    if (dw) {
        int col_blocks, R, nchunks;
        rmsnorm_dw_plan(rows, C, &col_blocks, &R, &nchunks);
        float* part = cuda_workspace_f32(0, (size_t)nchunks * C);
        unsigned* done = rmsnorm_dw_done(col_blocks);
        const size_t xspan = ((size_t)(N - 1) * ld + (size_t)nh * C) * sizeof(bf16);
        const bool apart = g_rmsnorm_dw_apart || rmsnorm_bytes_overlap(dx, xspan, dout, (size_t)rows * C * sizeof(bf16)) ||
                           rmsnorm_bytes_overlap(dx, xspan, x, xspan);
        double fl;
        size_t rd, wr;
        rmsnorm_dw_bytes(rows, C, nchunks, accumulate_dw, &fl, &rd, &wr);
        if (apart) {
            dim3 block(RMSNORM_DW_TX, RMSNORM_DW_TY);
            rmsnorm_dw_partial_kernel<<<dim3(col_blocks, nchunks), block, 0, stream>>>(part, dout, x, ms, rows, C, nh, (size_t)ld, eps, R,
                                                                                       dw, accumulate_dw, done);
            cudaCheck(cudaGetLastError());
            ew_account(COST_NORM, "rmsnorm_dw_partial_kernel", dim3(col_blocks, nchunks), fl, rd, wr);
        } else {
            dwr = {part, dw, done, R, accumulate_dw, col_blocks, nchunks};
            ew_ride_account(COST_NORM, "rmsnorm_dw_partial_ride", dim3(col_blocks * nchunks), fl, rd, wr);
        }
    }
    bool vec = C % 8 == 0 && ld % 8 == 0 && (!dx || ptr_aligned(dx, 16)) && ptr_aligned(dout, 16) && ptr_aligned(x, 16) &&
               (!w || ptr_aligned(w, 16));
    const int L = rmsnorm_lanes(C), d = ew_dup_on(dup);
    int grid = rmsnorm_grid(rows, L);
    if (fp && grid > FP_MAX_GRID) grid = FP_MAX_GRID;
    if (g_rmsnorm_dx_grid_cap > 0 && grid > g_rmsnorm_dx_grid_cap) grid = g_rmsnorm_dx_grid_cap;
    const unsigned gg = (unsigned)grid + (unsigned)(dwr.col_blocks * dwr.nchunks);
    if (fp)
        rmsnorm_backward_dx_kernel<true, false><<<gg, RMSNORM_BLOCK, 0, stream>>>(dx, dout, x, w, ms, rows, C, nh, (size_t)ld, eps,
                                                                                 accumulate_dx, L, vec, fp, dup, dwr);
    else if (d)
        rmsnorm_backward_dx_kernel<false, true><<<gg, RMSNORM_BLOCK, 0, stream>>>(dx, dout, x, w, ms, rows, C, nh, (size_t)ld, eps,
                                                                                 accumulate_dx, L, vec, NULL, dup, dwr);
    else
        rmsnorm_backward_dx_kernel<false, false><<<gg, RMSNORM_BLOCK, 0, stream>>>(dx, dout, x, w, ms, rows, C, nh, (size_t)ld, eps,
                                                                                  accumulate_dx, L, vec, NULL, dup, dwr);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    const size_t rd = n * 2 * 2 + (accumulate_dx ? n * 2 : 0) + (size_t)rows * 4 + (w ? (size_t)C * 2 : 0);   /* dout, x (dx), ms, w */
    if (fp) ew_account(COST_NORM, "rmsnorm_backward_dx_kernel_fp", grid, 11.0 * n, rd, dx ? n * 2 : 0);
    else ew_account(COST_NORM, d ? "rmsnorm_backward_dx_kernel_dup" : "rmsnorm_backward_dx_kernel", grid, (d ? 15.0 : 7.0) * n, rd, n * 2);
}
static void rmsnorm_backward_acc(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* ms,
                                 int rows, int C, float eps, int accumulate_dx, int accumulate_dw, cudaStream_t stream,
                                 EwDup dup = ew_dup_none()) {
    rmsnorm_backward_ld(dx, dw, dout, x, C, w, ms, rows, 1, C, eps, accumulate_dx, accumulate_dw, stream, NULL, dup);
}
static void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* ms,
                             int rows, int C, float eps, int accumulate_dx, cudaStream_t stream) {
    rmsnorm_backward_acc(dx, dw, dout, x, w, ms, rows, C, eps, accumulate_dx, 1, stream);
}

#endif
