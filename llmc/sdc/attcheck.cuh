/* attcheck.cuh: the four checks of the materialised causal attention (llmc/sdc/attcheck.h, the CPU reference
 * and the math) on device tensors, as the GPU stores them (bf16; tolerances ATT_TOL_REL(16) and
 * ATT_TOL_ROWSUM(16, T), bounds built from the clean side exactly as in attcheck.h).
 *
 * Layouts (llmc/cuda/attention.cuh): q, out [B,T,H*hd]; k [B,T,KV*hd]; v [B,T,KV*hd] with the row stride ldv
 * (a view of the fused q/k/v projection output, ldv = qd + 2 kd); logits, probs [B,H,T,T], of which
 * only s <= t is read (the masked triangle may hold anything, e.g. an injected value: never read).
 * Query head h uses kv head j = h / (H/KV). hd <= ATTC_MAX_HD.
 *
 * Result: per check c (ATTC_ABFT_LOGITS, ATTC_ATT_LOGITS, ATTC_ATT_PROBS, ATTC_ABFT_AV) the number of
 * (b,h) heads that failed is ADDED to counts[c] (device int); flags [ATTC_NCHECK][B*H] (device int, zero
 * on entry) remember which heads already failed: a failing row/column/dimension does
 * `if (atomicExch(&flags[c][bh], 1) == 0) atomicAdd(&counts[c], 1)`, so each failing head is counted
 * exactly once. Integer atomics only: the counts are the same on every run. Each pass/fail decision is
 * computed in a fixed order (double sums, fixed warp butterflies and fixed block trees), so the flags
 * are deterministic too. The trainer maps the four counts to its alarm kinds: ABFT = ABFT_LOGITS +
 * ABFT_AV, ATT = ATT_LOGITS + ATT_PROBS (the CPU's check_alarm calls).
 *
 * Kernels (all sums in double, from the bf16 values):
 *  attcheck_scan_kernel   grid (B*H, 1 or 2, nchunk), ATTC_WARPS warps. The O(T hd) side of the checksums, per
 *      head, by an inclusive scan in time order of one operand dotted with the other:
 *        dir 0 (rows, ours):  X[t] = sum_{s<=t} k_s, XN[t] = sum_{s<=t} |k_s|;  ref_row[t] = scale q_t . X[t],
 *                             tol_row[t] = rel scale |q_t| XN[t] + 1e-30
 *        dir 1 (columns, ABFT): X[s] = sum_{t>=s} q_t (suffix: the scan runs from T-1 down), XN likewise;
 *                             ref_col[s] = scale k_s . X[s], tol_col[s] = rel scale |k_s| XN[s] + 1e-30
 *      The T positions are cut into nchunk chunks, one a block (1 on the materialised path; on the fused path as
 *      many as fill the GPU, attc_scan_chunks), each chunk into ATTC_WARPS contiguous sub-chunks, one a warp: each
 *      warp sums its share of the positions before the block's chunk and its sub-chunk (lanes own dims lane,
 *      lane+32, ...), the sums go through shared memory, each warp adds the prefix's shares and the sub-chunks
 *      before its own in warp order, then walks its sub-chunk once more writing ref/tol (see attc_scan_start).
 *      On the fused path the same launch compares each row with the flash kernel's row sums as it writes them.
 *  attcheck_rows_kernel   one warp per row (b,h,t) (ours): sum_{s<=t} logits[t,s] vs ref_row[t] within
 *      tol_row[t] (ATTC_ATT_LOGITS), sum_{s<=t} probs[t,s] vs 1 within ATT_TOL_ROWSUM(16,T) (ATTC_ATT_PROBS).
 *  attcheck_cols_kernel   grid (B*H, ceil(T/ATTC_COLS)), block ATTC_COLS x ATTC_COL_ROWS (ABFT): thread
 *      (x,y) sums column s = tile + x over rows t >= s, t = tile + y (mod ATTC_COL_ROWS): each block row
 *      reads ATTC_COLS consecutive elements of one tensor row (coalesced). Column sums of the logits vs
 *      ref_col[s] within tol_col[s] (ATTC_ABFT_LOGITS); column sums c_s and sum |P| of the probs are written
 *      to scratch for the next kernel.
 *  attcheck_av_kernel     grid (B*H, ceil(hd/32)), block 32 x ATTC_AV_ROWS (ABFT): per dim i,
 *      sum_t out[t,i] vs sum_s c_s v_s[i] within rel sum_s (sum_t |P[t,s]|) |v_s[i]| + 1e-30 (ATTC_ABFT_AV).
 * A comparison is written !(|err| <= tol), so a NaN or inf anywhere in what is summed fails.
 *
 * Cost: the checksums of the [T,T] tensors read each live element once per family (ours: the rows of
 * logits and probs; ABFT: the columns of logits and probs), plus O(T hd) for the scans and for ABFT's
 * out/v pass; no full-size scratch (6 B*H*T doubles: attcheck_scratch_doubles).
 * CPU reference: abft_logits_check, att_logits_rowcheck, att_probs_rowcheck, abft_av_check (attcheck.h).
 * Accounting (launch_account, CUDA cores in double): ours (rows) as "att", ABFT's (columns, out/v) as
 * "detectors" (the -detect abft baseline), the shared scan as "att" when ours is on; FLOPs: 4 hd a scan
 * position, 2 (rows) / 3 (columns) a live entry, 5 hd a position for out/v; bytes: each tensor once. */
#ifndef TSDC_ATTCHECK_CUH
#define TSDC_ATTCHECK_CUH

#include <math.h>
#include "../cuda/cuda_common.cuh"
#include "attcheck.h"

#define ATTC_WARPS 8              /* scan and row kernels: warps per block */
#define ATTC_MAX_HD 256
#define ATTC_DPL (ATTC_MAX_HD / 32) /* head dims per lane in the scan */
#define ATTC_COLS 64              /* columns per block in the column kernel */
#define ATTC_COL_ROWS 4           /* row phases per block in the column kernel */
#define ATTC_AV_ROWS 8            /* row phases per block in the out/v kernel */

/* the four checks, in the order of their counters */
enum { ATTC_ABFT_LOGITS = 0, ATTC_ATT_LOGITS = 1, ATTC_ATT_PROBS = 2, ATTC_ABFT_AV = 3, ATTC_NCHECK = 4 };

__device__ __forceinline__ double attc_warp_sum(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* head bh failed check c: counted once per head */
__device__ __forceinline__ void attc_fail(int* counts, int* flags, int c, int nbh, int bh) {
    if (atomicExch(flags + (size_t)c * nbh + bh, 1) == 0) atomicAdd(counts + c, 1);
}

/* The scans' shape: the T positions of a head are cut into nchunk chunks of `chunk` positions, one block each (grid z
 * for the forward's scan, y for the backward's); a chunk is cut into ATTC_WARPS contiguous sub-chunks, one a warp.
 * A block first sums the positions before its chunk (the prefix [0, c0), cut into ATTC_WARPS ranges, one a warp),
 * then its warps' sub-chunks; each warp starts from the prefix ranges' sums in warp order plus the sub-chunks before
 * its own in warp order, and walks its sub-chunk writing ref/tol. One block a head (nchunk 1) is the scan of a
 * single block: an empty prefix (its sums are exact zeros). The orders depend on (T, nchunk) only, so the bits do.
 * More chunks re-read the prefix (a chunk's prefix is read by its block again, about nchunk / 2 times the scanned
 * operand in all, from L2: the operand of a head is T hd bf16) for a grid that fills the GPU at B 1. */
struct AttcScanSums {   /* a warp's sums over a range: the dims lane + 32 r, the sum and the max of the norms */
    double acc[ATTC_DPL];
    double nacc, mx;
};
__device__ __forceinline__ double attc_max_nan(double a, double b) { return (a != a || b != b) ? (a + b) : (b > a ? b : a); }
/* the warp's sums of x over positions [p0, p1) (time index t = dir ? T - 1 - p : p, rows xs apart) */
__device__ __forceinline__ void attc_range_sums(AttcScanSums* r, const bf16* x, size_t xs, int T, int dir, int p0, int p1, int hd,
                                                int lane) {
#pragma unroll
    for (int i = 0; i < ATTC_DPL; i++) r->acc[i] = 0.0;
    r->nacc = 0.0;
    r->mx = 0.0;
    for (int p = p0; p < p1; p++) {
        const bf16* xt = x + (size_t)(dir ? T - 1 - p : p) * xs;
        double ss = 0.0;
#pragma unroll
        for (int i = 0; i < ATTC_DPL; i++) {
            const int d = lane + 32 * i;
            if (d < hd) {
                const double xv = (double)__bfloat162float(xt[d]);
                r->acc[i] += xv;
                ss += xv * xv;
            }
        }
        const double nv = sqrt(attc_warp_sum(ss));
        r->nacc += nv;
        r->mx = attc_max_nan(r->mx, nv);
    }
}
/* every warp's start: the prefix ranges' sums (all warps, in order), then the sub-chunks before its own (in order).
 * pre / own: the warps' sums through shared memory (sp[2][ATTC_WARPS][ATTC_MAX_HD], sn, sm [2][ATTC_WARPS]) */
__device__ __forceinline__ void attc_scan_start(AttcScanSums* r, const AttcScanSums& pre, const AttcScanSums& own, double (*sp)[ATTC_WARPS][ATTC_MAX_HD],
                                                double (*sn)[ATTC_WARPS], double (*sm)[ATTC_WARPS], int warp, int lane, int hd) {
#pragma unroll
    for (int i = 0; i < ATTC_DPL; i++) {
        const int d = lane + 32 * i;
        if (d < hd) { sp[0][warp][d] = pre.acc[i]; sp[1][warp][d] = own.acc[i]; }
    }
    if (lane == 0) { sn[0][warp] = pre.nacc; sn[1][warp] = own.nacc; sm[0][warp] = pre.mx; sm[1][warp] = own.mx; }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ATTC_DPL; i++) r->acc[i] = 0.0;
    r->nacc = 0.0;
    r->mx = 0.0;
    for (int k = 0; k < 2 * ATTC_WARPS; k++) {   /* the prefix's ranges, then the chunk's sub-chunks before this warp's */
        const int h = k / ATTC_WARPS, w = k % ATTC_WARPS;
        if (h == 1 && w >= warp) break;
#pragma unroll
        for (int i = 0; i < ATTC_DPL; i++) {
            const int d = lane + 32 * i;
            if (d < hd) r->acc[i] += sp[h][w][d];
        }
        r->nacc += sn[h][w];
        r->mx = attc_max_nan(r->mx, sm[h][w]);
    }
}
/* the chunk count of a scan of T positions for nbh heads: the smallest power of 2 that gives ATTC_SCAN_BLOCKS blocks,
 * keeping at least 8 positions a warp (a function of the shape alone) */
#define ATTC_SCAN_BLOCKS 264
static int attc_scan_chunks(int nbh, int T) {
    int c = 1;
    while ((long long)nbh * c < ATTC_SCAN_BLOCKS && T / (2 * c) >= 8 * ATTC_WARPS) c *= 2;
    return c;
}

/* ref/tol [2][B*H][T]: [0] rows (dir 0), [1] columns (dir 1); dir = dir0 + blockIdx.y; blockIdx.z the chunk of `chunk`
 * positions. rows_a not NULL (dir 0 only: the fused forward's FlashCheck rows): each row's ref and tol are also
 * compared at once with the flash kernel's row sums, rows_a[t] (the logits) against ref within tol (ATTC_ATT_LOGITS),
 * rows_b[t] (the probabilities) against 1 within ptol (ATTC_ATT_PROBS), into counts / flags */
/* block (bh, by, bz) of the scan's grid (nbh, dirs, nchunk), as a device function: its own kernel below, or blocks riding on
 * another launch (AttcScan, attc_scan_ride_block) */
__device__ __forceinline__ void attc_scan_block(int bh, int by, int bz, int nbh, double* __restrict__ ref, double* __restrict__ tol,
                                                const bf16* __restrict__ q, const bf16* __restrict__ k, int T, int H, int KV, int hd, double scale,
                                                double rel, int dir0, int chunk, const float* __restrict__ rows_a, const float* __restrict__ rows_b,
                                                int* counts, int* flags, double ptol) {
    __shared__ double sp[2][ATTC_WARPS][ATTC_MAX_HD];
    __shared__ double sn[2][ATTC_WARPS], sm[2][ATTC_WARPS];
    const int dir = dir0 + by;
    const int b = bh / H, h = bh % H, j = h / (H / KV);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
    const bf16* qh = q + (size_t)b * T * qs + (size_t)h * hd;
    const bf16* kh = k + (size_t)b * T * ks + (size_t)j * hd;
    const bf16* x = dir ? qh : kh;   /* the scanned operand */
    const bf16* y = dir ? kh : qh;   /* the one dotted with the scan */
    const size_t xs = dir ? qs : ks, ys = dir ? ks : qs;
    double* R = ref + ((size_t)dir * nbh + bh) * T;
    double* E = tol + ((size_t)dir * nbh + bh) * T;
    const int c0 = min(T, bz * chunk), c1 = min(T, c0 + chunk);
    const int pre = CEIL_DIV(c0, ATTC_WARPS), sub = CEIL_DIV(c1 - c0, ATTC_WARPS);
    const int p0 = min(c1, c0 + warp * sub), p1 = min(c1, p0 + sub);
    AttcScanSums sp_pre, sp_own, st;
    attc_range_sums(&sp_pre, x, xs, T, dir, min(c0, warp * pre), min(c0, (warp + 1) * pre), hd, lane);
    attc_range_sums(&sp_own, x, xs, T, dir, p0, p1, hd, lane);
    attc_scan_start(&st, sp_pre, sp_own, sp, sn, sm, warp, lane, hd);
    for (int p = p0; p < p1; p++) {
        const int t = dir ? T - 1 - p : p;
        const bf16* xt = x + (size_t)t * xs;
        const bf16* yt = y + (size_t)t * ys;
        double ss = 0.0, dot = 0.0, yy = 0.0;
#pragma unroll
        for (int i = 0; i < ATTC_DPL; i++) {
            const int d = lane + 32 * i;
            if (d < hd) {
                const double xv = (double)__bfloat162float(xt[d]), yv = (double)__bfloat162float(yt[d]);
                st.acc[i] += xv;
                ss += xv * xv;
                dot += yv * st.acc[i];
                yy += yv * yv;
            }
        }
        ss = attc_warp_sum(ss);
        dot = attc_warp_sum(dot);
        yy = attc_warp_sum(yy);
        st.nacc += sqrt(ss);
        if (lane == 0) {
            const double rf = scale * dot, tl = rel * scale * sqrt(yy) * st.nacc + 1e-30;
            R[t] = rf;
            E[t] = tl;
            if (rows_a) {
                const size_t row = (size_t)bh * T + t;
                if (!(fabs((double)rows_a[row] - rf) <= tl)) attc_fail(counts, flags, ATTC_ATT_LOGITS, nbh, bh);
                if (!(fabs((double)rows_b[row] - 1.0) <= ptol)) attc_fail(counts, flags, ATTC_ATT_PROBS, nbh, bh);
            }
        }
    }
}
__global__ void __launch_bounds__(ATTC_WARPS * 32)
attcheck_scan_kernel(double* __restrict__ ref, double* __restrict__ tol, const bf16* __restrict__ q, const bf16* __restrict__ k,
                     int T, int H, int KV, int hd, double scale, double rel, int dir0, int chunk, const float* __restrict__ rows_a,
                     const float* __restrict__ rows_b, int* counts, int* flags, double ptol) {
    attc_scan_block((int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)gridDim.x, ref, tol, q, k, T, H, KV, hd, scale, rel, dir0, chunk,
                    rows_a, rows_b, counts, flags, ptol);
}
/* the fused forward's scan (attcheck_fused_forward) riding on another launch of 256-thread blocks: its arguments, and
 * block i of its grid (nbh, 1, nchunk), x fastest */
struct AttcScan {
    double *ref, *tol;
    const bf16 *q, *k;
    int T, H, KV, hd;
    double scale, rel;
    int chunk;
    const float *rows_a, *rows_b;
    int *counts, *flags;
    double ptol;
    int nbh;
    unsigned blocks;
};
__device__ __forceinline__ void attc_scan_ride_block(const AttcScan& a, int i) {
    attc_scan_block(i % a.nbh, 0, i / a.nbh, a.nbh, a.ref, a.tol, a.q, a.k, a.T, a.H, a.KV, a.hd, a.scale, a.rel, 0, a.chunk, a.rows_a, a.rows_b,
                    a.counts, a.flags, a.ptol);
}

/* one warp per row of [B*H*T, T]: the row checksum of the logits and the row sum of the probs */
__global__ void __launch_bounds__(ATTC_WARPS * 32)
attcheck_rows_kernel(int* counts, int* flags, const bf16* __restrict__ logits, const bf16* __restrict__ probs,
                     const double* __restrict__ rref, const double* __restrict__ rtol, size_t rows, int T, int nbh, double ptol) {
    const size_t row = (size_t)blockIdx.x * ATTC_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return; /* the whole warp leaves together */
    const int t = (int)(row % (size_t)T), bh = (int)(row / (size_t)T);
    const bf16* lr = logits + row * T;
    const bf16* pr = probs + row * T;
    double sl = 0.0, sp = 0.0;
    for (int s = lane; s <= t; s += 32) {
        sl += (double)__bfloat162float(lr[s]);
        sp += (double)__bfloat162float(pr[s]);
    }
    sl = attc_warp_sum(sl);
    sp = attc_warp_sum(sp);
    if (lane == 0) {
        if (!(fabs(sl - rref[row]) <= rtol[row])) attc_fail(counts, flags, ATTC_ATT_LOGITS, nbh, bh);
        if (!(fabs(sp - 1.0) <= ptol)) attc_fail(counts, flags, ATTC_ATT_PROBS, nbh, bh);
    }
}

/* column sums over t >= s: logits checked against ref_col, probs' sums (and sums of |P|) to csum/cabs */
__global__ void __launch_bounds__(ATTC_COLS * ATTC_COL_ROWS)
attcheck_cols_kernel(int* counts, int* flags, double* __restrict__ csum, double* __restrict__ cabs, const bf16* __restrict__ logits,
                     const bf16* __restrict__ probs, const double* __restrict__ cref, const double* __restrict__ ctol, int T) {
    __shared__ double red[3][ATTC_COL_ROWS][ATTC_COLS];
    const int nbh = (int)gridDim.x, bh = (int)blockIdx.x;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int s0 = (int)blockIdx.y * ATTC_COLS, s = s0 + tx;
    const bf16* L = logits + (size_t)bh * T * T;
    const bf16* P = probs + (size_t)bh * T * T;
    double cl = 0.0, cp = 0.0, ca = 0.0;
    for (int t = s0 + ty; t < T; t += ATTC_COL_ROWS)
        if (s <= t) {   /* s < T follows */
            const size_t i = (size_t)t * T + s;
            const double p = (double)__bfloat162float(P[i]);
            cl += (double)__bfloat162float(L[i]);
            cp += p;
            ca += fabs(p);
        }
    red[0][ty][tx] = cl; red[1][ty][tx] = cp; red[2][ty][tx] = ca;
    __syncthreads();
    if (ty == 0 && s < T) {
        cl = 0.0; cp = 0.0; ca = 0.0;
        for (int r = 0; r < ATTC_COL_ROWS; r++) { cl += red[0][r][tx]; cp += red[1][r][tx]; ca += red[2][r][tx]; }
        const size_t o = (size_t)bh * T + s;
        if (!(fabs(cl - cref[o]) <= ctol[o])) attc_fail(counts, flags, ATTC_ABFT_LOGITS, nbh, bh);
        csum[o] = cp;
        cabs[o] = ca;
    }
}

/* ABFT of out = P V: per dim i, sum_t out[t,i] vs sum_s csum[s] v_s[i] within rel sum_s cabs[s] |v_s[i]| */
__global__ void __launch_bounds__(32 * ATTC_AV_ROWS)
attcheck_av_kernel(int* counts, int* flags, const bf16* __restrict__ out, const bf16* __restrict__ v, const double* __restrict__ csum,
                   const double* __restrict__ cabs, int T, int H, int KV, int hd, size_t ldv, double rel) {
    __shared__ double red[3][ATTC_AV_ROWS][32];
    const int nbh = (int)gridDim.x, bh = (int)blockIdx.x, b = bh / H, h = bh % H, j = h / (H / KV);
    const int tx = threadIdx.x, ty = threadIdx.y, i = (int)blockIdx.y * 32 + tx;
    const size_t qs = (size_t)H * hd, ks = ldv;
    const bf16* vh = v + (size_t)b * T * ks + (size_t)j * hd;
    const bf16* oh = out + (size_t)b * T * qs + (size_t)h * hd;
    const double* cs = csum + (size_t)bh * T;
    const double* ca = cabs + (size_t)bh * T;
    double r = 0.0, bd = 0.0, co = 0.0;
    if (i < hd)
        for (int s = ty; s < T; s += ATTC_AV_ROWS) {
            const double vs = (double)__bfloat162float(vh[(size_t)s * ks + i]);
            r += cs[s] * vs;
            bd += ca[s] * fabs(vs);
            co += (double)__bfloat162float(oh[(size_t)s * qs + i]);
        }
    red[0][ty][tx] = r; red[1][ty][tx] = bd; red[2][ty][tx] = co;
    __syncthreads();
    if (ty == 0 && i < hd) {
        r = 0.0; bd = 0.0; co = 0.0;
        for (int k2 = 0; k2 < ATTC_AV_ROWS; k2++) { r += red[0][k2][tx]; bd += red[1][k2][tx]; co += red[2][k2][tx]; }
        if (!(fabs(co - r) <= rel * bd + 1e-30)) attc_fail(counts, flags, ATTC_ABFT_AV, nbh, bh);
    }
}

/* ---------------------------------------------------------------------------------- launcher */
/* scratch the checks need: ref/tol for rows and columns, column sums of P and of |P| */
static inline size_t attcheck_scratch_doubles(int B, int H, int T) { return (size_t)6 * B * H * T; }

/* Runs the ABFT checks (abft) and/or ours (att) of one layer's attention, adding failed heads to counts
 * [ATTC_NCHECK] (device); flags [ATTC_NCHECK * B*H] (device) must be zero for this layer's heads. scratch:
 * attcheck_scratch_doubles(B, H, T) doubles (device). Reads only; asynchronous on `stream`. */
static void attcheck_forward(int* counts, int* flags, double* scratch, const bf16* logits, const bf16* probs, const bf16* out,
                             const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV, int hd, int ldv, int abft,
                             int att, cudaStream_t stream) {
    if (!abft && !att) return;
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0 || H % KV != 0 || hd > ATTC_MAX_HD || ldv < KV * hd)
        tsdc_fail("attcheck_forward: bad shape B %d T %d H %d KV %d hd %d ldv %d (H a multiple of KV, hd <= %d, ldv >= KV*hd)", B, T, H,
                  KV, hd, ldv, ATTC_MAX_HD);
    const int nbh = B * H;
    const size_t n = (size_t)nbh * T;
    double *ref = scratch, *tol = scratch + 2 * n, *csum = scratch + 4 * n, *cabs = scratch + 5 * n;
    const double scale = 1.0 / sqrt((double)hd), rel = ATT_TOL_REL(16);
    /* dir 0 (rows) for ours, dir 1 (columns) for ABFT */
    attcheck_scan_kernel<<<dim3((unsigned)nbh, (unsigned)(abft && att ? 2 : 1), 1u), ATTC_WARPS * 32, 0, stream>>>(
        ref, tol, q, k, T, H, KV, hd, scale, rel, att ? 0 : 1, T, NULL, NULL, NULL, NULL, 0.0);
    cudaCheck(cudaGetLastError());
    const int dirs = abft && att ? 2 : 1;
    const double live = (double)nbh * T * (T + 1) / 2;   /* the s <= t entries of the [T,T] tensors */
    launch_account(att ? "att" : "detectors", "attcheck_scan_kernel", COST_FP64, dim3((unsigned)nbh, (unsigned)dirs), 4.0 * dirs * n * hd, (double)dirs * B * T * (H + KV) * hd * 2, (double)dirs * n * 16);   /* q, k in; ref, tol out */
    if (att) {
        attcheck_rows_kernel<<<(unsigned)CEIL_DIV(n, (size_t)ATTC_WARPS), ATTC_WARPS * 32, 0, stream>>>(
            counts, flags, logits, probs, ref, tol, n, T, nbh, ATT_TOL_ROWSUM(16, T));
        cudaCheck(cudaGetLastError());
        launch_account("att", "attcheck_rows_kernel", COST_FP64, (unsigned)CEIL_DIV(n, (size_t)ATTC_WARPS), 2.0 * live, live * 4 + (double)n * 16, 0.0);   /* logits, probs rows, ref, tol in */
    }
    if (abft) {
        attcheck_cols_kernel<<<dim3((unsigned)nbh, (unsigned)CEIL_DIV(T, ATTC_COLS)), dim3(ATTC_COLS, ATTC_COL_ROWS), 0, stream>>>(
            counts, flags, csum, cabs, logits, probs, ref + n, tol + n, T);
        cudaCheck(cudaGetLastError());
        launch_account("detectors", "attcheck_cols_kernel", COST_FP64, dim3((unsigned)nbh, (unsigned)CEIL_DIV(T, ATTC_COLS)), 3.0 * live, live * 4 + (double)n * 16, (double)n * 16);   /* logits, probs columns, ref, tol in; c, |c| out */
        attcheck_av_kernel<<<dim3((unsigned)nbh, (unsigned)CEIL_DIV(hd, 32)), dim3(32, ATTC_AV_ROWS), 0, stream>>>(
            counts, flags, out, v, csum, cabs, T, H, KV, hd, (size_t)ldv, rel);
        cudaCheck(cudaGetLastError());
        launch_account("detectors", "attcheck_av_kernel", COST_FP64, dim3((unsigned)nbh, (unsigned)CEIL_DIV(hd, 32)), 5.0 * n * hd, (double)B * T * (H + KV) * hd * 2 + (double)n * 16, 0.0);   /* out, v, c, |c| in */
    }
}

/* ---------------------------------------------------------------------------------- the fused path's checks
 * The same checks on the fused attention (llmc/cuda/flash_attention.cuh), which never stores a [T,T] tensor: its
 * kernels hand over the row sums they accumulate from the values they hold (FlashCheck), and these compare them
 * with the same references and bounds as above (the scans, from the clean side):
 *   forward (ATTC_ATT_LOGITS, ATTC_ATT_PROBS): the fp32 row sum of the logits z against ref_row[t] within tol_row[t];
 *     the row sum of the rounded P that P V consumes, over the row's l, against 1 within ATT_TOL_ROWSUM(16, T)
 *   backward (ATTB_DPROBS, ATTB_DLOGITS; the dq kernel): the row sum of dP against ref[t] within tol_dp[t]; the row
 *     sum of the rounded dZ that dZ K consumes against 0 within tol_dl[t]
 * The bounds hold with more room than on the stored bf16 tensors: z and dP are fp32 (not rounded to bf16), P and dZ
 * carry one bf16 rounding each (2^-9 relative, round to nearest), and the backward's D comes from the bf16 out,
 * |D - sum_s P dP| <= 2^-9 |dO_t| |out_t| <= 2^-9 |dO_t| max_s |v_s|, a quarter of what tol_dl allows for it.
 * The dV column check reads the fused kernels' output as it reads the split backward's (attcheck_backward_dv).
 * What the fused checks see that the stored tensors' checks see: a fault in the logits as they leave the mma (the
 * checksum), in the probabilities P V consumes (the row sum; a fault in the exp before l takes it is a consistent,
 * renormalised row, as a fault in the CPU's exp before its normalisation), in dP, in dZ. The dk/dv kernel
 * recomputes P, dP and dZ for dk and dv: its P reaches only dv (the dV column check), its dP and dZ only dk, which
 * the Q/K backward recomputation (-protect qk_bwd) compares; att_bwd alone does not check them. */
/* where the kernels write their row sums: 2 B*H*T floats after the scans' doubles (within attcheck_scratch_doubles) */
static inline float* attcheck_fused_rows(double* scratch, int B, int H, int T) { return (float*)(scratch + (size_t)4 * B * H * T); }

/* -protect att on the fused forward: rows = attcheck_fused_rows(scratch, ...) as flash_attention_forward's FlashCheck
 * left them (rows_a = rows, rows_b = rows + B*H*T); q [B,T,H*hd], k [B,T,KV*hd] the tensors it read. Counters as
 * attcheck_forward's (ATTC_ATT_LOGITS, ATTC_ATT_PROBS). One launch: the scan compares each row as it writes its
 * reference and bound (which stay in scratch for the test-only dump). */
static AttcScan attcheck_fused_forward_args(int* counts, int* flags, double* scratch, const bf16* q, const bf16* k, int B, int T, int H, int KV,
                                            int hd) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0 || H % KV != 0 || hd > ATTC_MAX_HD)
        tsdc_fail("attcheck_fused_forward: bad shape B %d T %d H %d KV %d hd %d (H a multiple of KV, hd <= %d)", B, T, H, KV, hd, ATTC_MAX_HD);
    const int nbh = B * H, nc = attc_scan_chunks(nbh, T), chunk = CEIL_DIV(T, nc);
    const size_t n = (size_t)nbh * T;
    const float* rows = attcheck_fused_rows(scratch, B, H, T);
    const AttcScan a = {scratch, scratch + 2 * n, q, k, T, H, KV, hd, 1.0 / sqrt((double)hd), ATT_TOL_REL(16), chunk, rows, rows + n, counts, flags,
                        ATT_TOL_ROWSUM(16, T), nbh, (unsigned)(nbh * nc)};
    return a;
}
/* FLOPs: 4 hd a scanned position, 2 hd a prefix position re-read (about (nc - 1) / 2 times T a head); bytes: q, k once (the
 * prefix re-reads come from L2), the flash rows in, ref and tol out; ride: on another launch (ride_account) */
static void attc_scan_account(const AttcScan& a, int B, bool ride) {
    const size_t n = (size_t)a.nbh * a.T;
    const int nc = (int)a.blocks / a.nbh;
    const double fl = 4.0 * n * a.hd + 2.0 * n * a.hd * (nc - 1) / 2.0, rd = (double)B * a.T * (a.H + a.KV) * a.hd * 2 + (double)n * 8;
    if (ride) ride_account("att", "attcheck_scan_ride", COST_FP64, a.blocks, fl, rd, (double)n * 16);
    else launch_account("att", "attcheck_scan_kernel", COST_FP64, dim3((unsigned)a.nbh, 1u, (unsigned)nc), fl, rd, (double)n * 16);
}
static void attcheck_fused_forward(int* counts, int* flags, double* scratch, const bf16* q, const bf16* k, int B, int T, int H, int KV,
                                   int hd, cudaStream_t stream) {
    const AttcScan a = attcheck_fused_forward_args(counts, flags, scratch, q, k, B, T, H, KV, hd);
    const dim3 grid((unsigned)a.nbh, 1u, a.blocks / (unsigned)a.nbh);
    attcheck_scan_kernel<<<grid, ATTC_WARPS * 32, 0, stream>>>(a.ref, a.tol, q, k, T, H, KV, hd, a.scale, a.rel, 0, a.chunk, a.rows_a, a.rows_b,
                                                              counts, flags, a.ptol);
    cudaCheck(cudaGetLastError());
    attc_scan_account(a, B, false);
}
/* the same scan riding on a later launch of 256-thread blocks that runs before anything writes q, k, the rows or the
 * scratch (the trainer: the residual add + norm after o_proj, residual_rmsnorm_forward): its arguments, the work
 * accounted as a ride */
static AttcScan attcheck_fused_forward_ride(int* counts, int* flags, double* scratch, const bf16* q, const bf16* k, int B, int T, int H, int KV,
                                            int hd) {
    const AttcScan a = attcheck_fused_forward_args(counts, flags, scratch, q, k, B, T, H, KV, hd);
    attc_scan_account(a, B, true);
    return a;
}

/* ---------------------------------------------------------------------------------- backward (-protect att_bwd)
 * The three backward checks of attcheck.h (att_dprobs_rowcheck, att_dlogits_rowcheck, att_dv_colcheck) on the
 * split backward's stored bf16 tensors (llmc/cuda/attention.cuh: attention_split_av_backward writes dprobs,
 * attention_split_softmax_backward dlogits, unscaled, both [B,H,T,T], s <= t read). Bounds from the clean side, as
 * the CPU's: dout (att_out's gradient) and v, never the checked tensor.
 * Row strides: dout, v and dv are read with an explicit row stride (ld_o, ld_v, ld_dv: elements between token
 * rows; the contiguous width H*hd, KV*hd today), so strided views of a fused projection buffer work unchanged.
 * Counters (added to counts[c], flags [ATTB_NCHECK][B*H] as the forward's: each failing head counted once):
 * ATTB_DPROBS, ATTB_DLOGITS per (b, h); ATTB_DV per (b, kv head) (flag index b*KV + kh).
 * Kernels (sums in double, from the bf16 values):
 *  attbwd_scan_kernel   grid (B*H, nchunk), ATTC_WARPS warps: the forward scan's chunked inclusive scan (dir 0) with
 *      the scanned operand v (kv head h/g) and the dotted one dout (query head h), scale 1, plus the prefix maximum
 *      of |v_s| (chunk maxima through shared memory, combined in warp order; a NaN norm stays NaN):
 *        ref[t] = dout_t . sum_{s<=t} v_s,  tol_dp[t] = rel |dout_t| sum_{s<=t} |v_s| + 1e-30,
 *        tol_dl[t] = 2 rel 2 |dout_t| max_{s<=t} |v_s| + 1e-30                (rel = ATT_TOL_REL(16))
 *  attbwd_rows_kernel   one warp per row (b,h,t), lanes stride s <= t, warp butterfly: sum_{s<=t} M[t,s] vs ref[t]
 *      (NULL: 0) within tol[t]; the dprobs check (ref, tol_dp) and the dlogits check (NULL, tol_dl).
 *  attbwd_dv_kernel     grid (B*KV, ceil(hd/32), nchunk), block 32 x ATTC_AV_ROWS: per dim i of kv head kh, thread
 *      row ty sums t = ty, ty + ATTC_AV_ROWS, ... of its chunk of dv[t,i] and of dout[t,h,i], |dout[t,h,i]| over the
 *      group's heads h in order; the rows combined in ty order, the chunks in chunk order (the last block to finish
 *      adds them): |sum dv - sum dout| <= 2 rel sum |dout| + 1e-30.
 *  attbwd_fused_kernel  the fused (flash) backward's checks in one launch: the chunked scan, comparing the dq kernel's
 *      rows as it makes the bounds, and the chunked dV check, each block running one of the two bodies above.
 * Cost per layer: the rows kernels read dprobs and dlogits once each (B H T^2/2 live bf16 elements each: the
 * split backward writes and reads both anyway), the scan reads dout and v once (O(B T (H + KV) hd)), the dV
 * kernel dv and dout once; scratch 3 B*H*T doubles (attbwd_scratch_doubles, within the forward's). */
enum { ATTB_DPROBS = 0, ATTB_DLOGITS = 1, ATTB_DV = 2, ATTB_NCHECK = 3 };

/* ref, tol_dp, tol_dl [B*H][T]; blockIdx.y the chunk of `chunk` positions (the forward scan's shape). rows_a not NULL
 * (the fused backward's FlashCheck rows of its dq kernel): each row is also compared at once, rows_a[t] (dP) against ref
 * within tol_dp (ATTB_DPROBS), rows_b[t] (the rounded dZ) against 0 within tol_dl (ATTB_DLOGITS), into counts / flags */
__device__ __forceinline__ void attbwd_scan_block(int bh, int by, int nbh, double* __restrict__ ref, double* __restrict__ tol_dp,
                                                  double* __restrict__ tol_dl, const bf16* __restrict__ dout, int ld_o,
                                                  const bf16* __restrict__ v, int ld_v, int T, int H, int KV, int hd, double rel, int chunk,
                                                  const float* __restrict__ rows_a, const float* __restrict__ rows_b, int* counts, int* flags) {
    __shared__ double sp[2][ATTC_WARPS][ATTC_MAX_HD];
    __shared__ double sn[2][ATTC_WARPS], sm[2][ATTC_WARPS];
    const int b = bh / H, h = bh % H, j = h / (H / KV);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bf16* x = v + (size_t)b * T * ld_v + (size_t)j * hd;      /* scanned: v of kv head j */
    const bf16* y = dout + (size_t)b * T * ld_o + (size_t)h * hd;   /* dotted: dout of head h */
    double* R = ref + (size_t)bh * T;
    double* E = tol_dp + (size_t)bh * T;
    double* M = tol_dl + (size_t)bh * T;
    const int c0 = min(T, by * chunk), c1 = min(T, c0 + chunk);
    const int pre = CEIL_DIV(c0, ATTC_WARPS), sub = CEIL_DIV(c1 - c0, ATTC_WARPS);
    const int p0 = min(c1, c0 + warp * sub), p1 = min(c1, p0 + sub);
    AttcScanSums sp_pre, sp_own, st;
    attc_range_sums(&sp_pre, x, (size_t)ld_v, T, 0, min(c0, warp * pre), min(c0, (warp + 1) * pre), hd, lane);
    attc_range_sums(&sp_own, x, (size_t)ld_v, T, 0, p0, p1, hd, lane);
    attc_scan_start(&st, sp_pre, sp_own, sp, sn, sm, warp, lane, hd);
    for (int t = p0; t < p1; t++) {
        const bf16* xt = x + (size_t)t * ld_v;
        const bf16* yt = y + (size_t)t * ld_o;
        double ss = 0.0, dot = 0.0, yy = 0.0;
#pragma unroll
        for (int i = 0; i < ATTC_DPL; i++) {
            const int d = lane + 32 * i;
            if (d < hd) {
                const double xv = (double)__bfloat162float(xt[d]), yv = (double)__bfloat162float(yt[d]);
                st.acc[i] += xv;
                ss += xv * xv;
                dot += yv * st.acc[i];
                yy += yv * yv;
            }
        }
        ss = attc_warp_sum(ss);
        dot = attc_warp_sum(dot);
        yy = attc_warp_sum(yy);
        const double nv = sqrt(ss), ny = sqrt(yy);
        st.nacc += nv;
        st.mx = attc_max_nan(st.mx, nv);
        if (lane == 0) {
            const double tdp = rel * ny * st.nacc + 1e-30, tdl = 2.0 * rel * 2.0 * ny * st.mx + 1e-30;
            R[t] = dot;
            E[t] = tdp;
            M[t] = tdl;
            if (rows_a) {
                const size_t row = (size_t)bh * T + t;
                if (!(fabs((double)rows_a[row] - dot) <= tdp)) attc_fail(counts, flags, ATTB_DPROBS, nbh, bh);
                if (!(fabs((double)rows_b[row]) <= tdl)) attc_fail(counts, flags, ATTB_DLOGITS, nbh, bh);
            }
        }
    }
}

__global__ void __launch_bounds__(ATTC_WARPS * 32)
attbwd_scan_kernel(double* __restrict__ ref, double* __restrict__ tol_dp, double* __restrict__ tol_dl, const bf16* __restrict__ dout,
                   int ld_o, const bf16* __restrict__ v, int ld_v, int T, int H, int KV, int hd, double rel, int chunk,
                   const float* __restrict__ rows_a, const float* __restrict__ rows_b, int* counts, int* flags) {
    attbwd_scan_block((int)blockIdx.x, (int)blockIdx.y, (int)gridDim.x, ref, tol_dp, tol_dl, dout, ld_o, v, ld_v, T, H, KV, hd, rel, chunk,
                      rows_a, rows_b, counts, flags);
}

/* one warp per row of [B*H*T, T]: sum_{s<=t} m[t,s] vs ref[row] (NULL: 0) within tol[row], check c */
__global__ void __launch_bounds__(ATTC_WARPS * 32)
attbwd_rows_kernel(int* counts, int* flags, const bf16* __restrict__ m, const double* __restrict__ ref, const double* __restrict__ tol,
                   size_t rows, int T, int nbh, int c) {
    const size_t row = (size_t)blockIdx.x * ATTC_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return; /* the whole warp leaves together */
    const int t = (int)(row % (size_t)T), bh = (int)(row / (size_t)T);
    const bf16* mr = m + row * T;
    double sm = 0.0;
    for (int s = lane; s <= t; s += 32) sm += (double)__bfloat162float(mr[s]);
    sm = attc_warp_sum(sm);
    if (lane == 0 && !(fabs(sm - (ref ? ref[row] : 0.0)) <= tol[row])) attc_fail(counts, flags, c, nbh, bh);
}

/* dV column sums of kv head kh against dout's over kh's query heads. Grid (B*KV, ceil(hd/32), nchunk): block z sums
 * the positions of its chunk (rows ty, ty + ATTC_AV_ROWS, ... of the chunk, then the rows in ty order); nchunk 1
 * compares at once. With nchunk > 1 each block leaves its three partial sums a dimension in part [B*KV][gy][nchunk][3]
 * [32] and counts itself done in done[(bk, by)] (an integer atomic after a __threadfence); the block that counts last
 * adds the chunks' partials in chunk order and compares: the same bits whichever block is last. done must be zero on
 * entry (the trainer zeroes it with the backward's flags); the last block leaves it at nchunk. */
__device__ __forceinline__ void attbwd_dv_block(int bk, int by, int bz, int gy, int nc, int tx, int ty, int* counts, int* flags,
                                                double* bound, const bf16* __restrict__ dv, int ld_dv, const bf16* __restrict__ dout,
                                                int ld_o, int T, int H, int KV, int hd, double rel2, int nbh, int chunk, double* part,
                                                unsigned* done) {
    __shared__ double red[3][ATTC_AV_ROWS][32];
    __shared__ int last;
    const int b = bk / KV, kh = bk % KV, g = H / KV, i = by * 32 + tx;
    const int c0 = min(T, bz * chunk), c1 = min(T, c0 + chunk);
    const bf16* dvh = dv + (size_t)b * T * ld_dv + (size_t)kh * hd;
    const bf16* oh = dout + (size_t)b * T * ld_o + (size_t)kh * g * hd;
    double sv = 0.0, so = 0.0, sa = 0.0;
    if (i < hd)
        for (int t = c0 + ty; t < c1; t += ATTC_AV_ROWS) {
            sv += (double)__bfloat162float(dvh[(size_t)t * ld_dv + i]);
            for (int hh = 0; hh < g; hh++) {
                const double o = (double)__bfloat162float(oh[(size_t)t * ld_o + (size_t)hh * hd + i]);
                so += o;
                sa += fabs(o);
            }
        }
    red[0][ty][tx] = sv; red[1][ty][tx] = so; red[2][ty][tx] = sa;
    __syncthreads();
    if (ty == 0) {
        sv = 0.0; so = 0.0; sa = 0.0;
        for (int r = 0; r < ATTC_AV_ROWS; r++) { sv += red[0][r][tx]; so += red[1][r][tx]; sa += red[2][r][tx]; }
    }
    if (nc > 1) {
        const size_t col = (size_t)bk * gy + by;
        volatile double* pc = part + col * nc * 96;
        if (ty == 0) { pc[(size_t)bz * 96 + tx] = sv; pc[(size_t)bz * 96 + 32 + tx] = so; pc[(size_t)bz * 96 + 64 + tx] = sa; }
        __threadfence();
        __syncthreads();
        if (tx == 0 && ty == 0) last = atomicAdd(done + col, 1u) == (unsigned)(nc - 1);
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (ty == 0) {
            sv = 0.0; so = 0.0; sa = 0.0;
            for (int c = 0; c < nc; c++) { sv += pc[(size_t)c * 96 + tx]; so += pc[(size_t)c * 96 + 32 + tx]; sa += pc[(size_t)c * 96 + 64 + tx]; }
        }
    }
    if (ty == 0 && i < hd) {
        if (!(fabs(sv - so) <= rel2 * sa + 1e-30)) attc_fail(counts, flags, ATTB_DV, nbh, bk);
        if (bound) bound[(size_t)bk * hd + i] = rel2 * sa + 1e-30;
    }
}
__global__ void __launch_bounds__(32 * ATTC_AV_ROWS)
attbwd_dv_kernel(int* counts, int* flags, double* bound, const bf16* __restrict__ dv, int ld_dv, const bf16* __restrict__ dout, int ld_o,
                 int T, int H, int KV, int hd, double rel2, int nbh, int chunk, double* part, unsigned* done) {
    attbwd_dv_block((int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)gridDim.y, (int)gridDim.z, (int)threadIdx.x, (int)threadIdx.y,
                    counts, flags, bound, dv, ld_dv, dout, ld_o, T, H, KV, hd, rel2, nbh, chunk, part, done);
}
/* the fused backward's two checks in one launch (attcheck_fused_backward): blocks 0 .. nscan-1 are the scan's grid
 * (B*H, nchunk) in its order (x fastest), the rest the dV kernel's (B*KV, gy, nc) in its order, 256 threads either
 * way (thread x = tx + 32 ty for the dV body). Each body does what its own kernel does, so the counts, flags and
 * bounds are the two launches'. Its shared memory is both bodies' (32.4 + 6 KB) */
static_assert(ATTC_WARPS * 32 == 32 * ATTC_AV_ROWS, "the scan and the dV blocks: one block shape");
/* the two checks' arguments; blocks: nscan + the dV grid's */
struct AttbFused {
    double *ref, *tol_dp, *tol_dl;
    const bf16* dout;
    int ld_o;
    const bf16* v;
    int ld_v, T, H, KV, hd;
    double rel;
    int chunk;
    const float *rows_a, *rows_b;
    int *counts, *flags;
    int nbh, nscan;
    double* bound;
    const bf16* dv;
    int ld_dv;
    double rel2;
    int dv_chunk;
    double* part;
    unsigned* done;
    int gx, gy, nc;
    unsigned blocks;
};
/* block i of the launch (256 threads): the scan's block or the dV check's */
__device__ __forceinline__ void attbwd_fused_block(const AttbFused& a, int i) {
    if (i < a.nscan) {
        attbwd_scan_block(i % a.nbh, i / a.nbh, a.nbh, a.ref, a.tol_dp, a.tol_dl, a.dout, a.ld_o, a.v, a.ld_v, a.T, a.H, a.KV, a.hd, a.rel, a.chunk,
                          a.rows_a, a.rows_b, a.counts, a.flags);
    } else {
        const int jb = i - a.nscan;
        attbwd_dv_block(jb % a.gx, jb / a.gx % a.gy, jb / (a.gx * a.gy), a.gy, a.nc, (int)threadIdx.x % 32, (int)threadIdx.x / 32, a.counts,
                        a.flags, a.bound, a.dv, a.ld_dv, a.dout, a.ld_o, a.T, a.H, a.KV, a.hd, a.rel2, a.nbh, a.dv_chunk, a.part, a.done);
    }
}
__global__ void __launch_bounds__(ATTC_WARPS * 32) attbwd_fused_kernel(AttbFused a) { attbwd_fused_block(a, (int)blockIdx.x); }

static inline size_t attbwd_scratch_doubles(int B, int H, int T) { return (size_t)3 * B * H * T; }

static void attbwd_check_args(const char* who, int B, int T, int H, int KV, int hd) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0 || H % KV != 0 || hd > ATTC_MAX_HD)
        tsdc_fail("%s: bad shape B %d T %d H %d KV %d hd %d (H a multiple of KV, hd <= %d)", who, B, T, H, KV, hd, ATTC_MAX_HD);
}
/* the backward checks' references and bounds into scratch: ref, tol_dp, tol_dl [B*H][T] each (attbwd_scan_kernel), one
 * block a head (the split path's; the fused path's scan is chunked, inside attbwd_fused_kernel) */
static void attbwd_scan(double* scratch, const bf16* dout, int ld_o, const bf16* v, int ld_v, int B, int T, int H, int KV, int hd,
                        cudaStream_t stream) {
    const int nbh = B * H;
    const size_t n = (size_t)nbh * T;
    attbwd_scan_kernel<<<(unsigned)nbh, ATTC_WARPS * 32, 0, stream>>>(scratch, scratch + n, scratch + 2 * n, dout, ld_o, v, ld_v, T, H, KV, hd,
                                                                     ATT_TOL_REL(16), T, NULL, NULL, NULL, NULL);
    cudaCheck(cudaGetLastError());
    launch_account("att_bwd", "attbwd_scan_kernel", COST_FP64, (unsigned)nbh, 4.0 * n * hd, (double)B * T * (H + KV) * hd * 2,
                   (double)n * 24);   /* dout, v (rows) in; 3 bounds out */
}
/* the dprobs row check (ATTB_DPROBS); leaves in scratch the bounds attcheck_backward_dlogits reads, so it runs first,
 * on the same dout and v. counts [ATTB_NCHECK], flags [ATTB_NCHECK * B*H] (zero for this layer), scratch
 * attbwd_scratch_doubles(B, H, T) doubles, all device. Reads only; asynchronous on `stream`. */
static void attcheck_backward_dprobs(int* counts, int* flags, double* scratch, const bf16* dprobs, const bf16* dout, int ld_o,
                                     const bf16* v, int ld_v, int B, int T, int H, int KV, int hd, cudaStream_t stream) {
    attbwd_check_args("attcheck_backward_dprobs", B, T, H, KV, hd);
    const int nbh = B * H;
    const size_t n = (size_t)nbh * T;
    attbwd_scan(scratch, dout, ld_o, v, ld_v, B, T, H, KV, hd, stream);
    attbwd_rows_kernel<<<(unsigned)CEIL_DIV(n, (size_t)ATTC_WARPS), ATTC_WARPS * 32, 0, stream>>>(counts, flags, dprobs, scratch,
                                                                                                  scratch + n, n, T, nbh, ATTB_DPROBS);
    cudaCheck(cudaGetLastError());
    launch_account("att_bwd", "attbwd_rows_kernel", COST_FP64, (unsigned)CEIL_DIV(n, (size_t)ATTC_WARPS), (double)n * T, (double)n * T + (double)n * 16, 0.0);   /* the causal rows (half of [T,T]) in */
}
/* the dlogits rows sum to zero (ATTB_DLOGITS), within the bounds attcheck_backward_dprobs left in scratch */
static void attcheck_backward_dlogits(int* counts, int* flags, const double* scratch, const bf16* dlogits, int B, int T, int H,
                                      cudaStream_t stream) {
    const int nbh = B * H;
    const size_t n = (size_t)nbh * T;
    attbwd_rows_kernel<<<(unsigned)CEIL_DIV(n, (size_t)ATTC_WARPS), ATTC_WARPS * 32, 0, stream>>>(counts, flags, dlogits, NULL,
                                                                                                  scratch + 2 * n, n, T, nbh, ATTB_DLOGITS);
    cudaCheck(cudaGetLastError());
    launch_account("att_bwd", "attbwd_rows_kernel", COST_FP64, (unsigned)CEIL_DIV(n, (size_t)ATTC_WARPS), (double)n * T, (double)n * T + (double)n * 8, 0.0);
}
/* the dV column sums (ATTB_DV): dv [B,T,KV*hd] (row stride ld_dv) against dout [B,T,H*hd] (row stride ld_o). bound
 * (NULL: not written; the trainer's test-only dump): [B*KV][hd] doubles, each column's bound. work (NULL: one block a
 * column of 32 dimensions, over all T) lets the positions be cut into chunks for a grid that fills the GPU at B 1:
 * attbwd_dv_work_doubles(B, KV, hd, nc) doubles of partials for nc = attbwd_dv_chunks(...) chunks, and done,
 * B*KV*ceil(hd/32) unsigned, zero on entry (left non-zero: zero it again before the next call). */
static int attbwd_dv_chunks(int B, int KV, int hd, int T, size_t work_doubles) {
    const long long cols = (long long)B * KV * CEIL_DIV(hd, 32);
    int c = 1;
    while (cols * c < ATTC_SCAN_BLOCKS && T / (2 * c) >= 4 * ATTC_AV_ROWS && (size_t)(cols * 2 * c * 96) <= work_doubles) c *= 2;
    return c;
}
static void attcheck_backward_dv(int* counts, int* flags, double* bound, const bf16* dv, int ld_dv, const bf16* dout, int ld_o, int B,
                                 int T, int H, int KV, int hd, cudaStream_t stream, double* work = NULL, size_t work_doubles = 0,
                                 unsigned* done = NULL) {
    attbwd_check_args("attcheck_backward_dv", B, T, H, KV, hd);
    const int nc = work && done ? attbwd_dv_chunks(B, KV, hd, T, work_doubles) : 1;
    const dim3 grid((unsigned)(B * KV), (unsigned)CEIL_DIV(hd, 32), (unsigned)nc);
    attbwd_dv_kernel<<<grid, dim3(32, ATTC_AV_ROWS), 0, stream>>>(counts, flags, bound, dv, ld_dv, dout, ld_o, T, H, KV, hd,
                                                                   2.0 * ATT_TOL_REL(16), B * H, CEIL_DIV(T, nc), work, done);
    cudaCheck(cudaGetLastError());
    launch_account("att_bwd", "attbwd_dv_kernel", COST_FP64, grid, 2.0 * B * T * (H + KV) * hd, (double)B * T * (H + KV) * hd * 2, 0.0);   /* dv, dout in */
}

/* attbwd_fused_kernel's arguments (attcheck_fused_backward below) */
static AttbFused attcheck_fused_backward_args(int* counts, int* flags, double* scratch, const bf16* dout, int ld_o, const bf16* v, int ld_v,
                                              const bf16* dv, int ld_dv, int B, int T, int H, int KV, int hd, double* bound, double* work,
                                              size_t work_doubles, unsigned* done) {
    attbwd_check_args("attcheck_fused_backward", B, T, H, KV, hd);
    const int nbh = B * H, nc = attc_scan_chunks(nbh, T);
    const size_t n = (size_t)nbh * T;
    const float* rows = attcheck_fused_rows(scratch, B, H, T);
    const int nc2 = work && done ? attbwd_dv_chunks(B, KV, hd, T, work_doubles) : 1;
    const int gx = B * KV, gy = CEIL_DIV(hd, 32), nscan = nbh * nc, ndv = gx * gy * nc2;
    const AttbFused a = {scratch, scratch + n, scratch + 2 * n, dout, ld_o, v, ld_v, T, H, KV, hd, ATT_TOL_REL(16), CEIL_DIV(T, nc), rows, rows + n,
                         counts, flags, nbh, nscan, bound, dv, ld_dv, 2.0 * ATT_TOL_REL(16), CEIL_DIV(T, nc2), work, done, gx, gy, nc2,
                         (unsigned)(nscan + ndv)};
    return a;
}
/* the scan's work (dout, v rows and the kernel's row sums in; 3 bounds out) and the dV check's (dv, dout in); ride: on
 * another launch (llmc/cuda/cuda_common.cuh's ride_account: its work, no launch overhead) */
static void attbwd_fused_account(const AttbFused& a, int B, bool ride) {
    const size_t n = (size_t)a.nbh * a.T;
    const int nc = a.nscan / a.nbh;   /* the scan's chunks */
    const double fl = 4.0 * n * a.hd + 2.0 * n * a.hd * (nc - 1) / 2.0 + 2.0 * B * a.T * (a.H + a.KV) * a.hd;
    const double rd = (double)B * a.T * (a.H + a.KV) * a.hd * 2 + (double)n * 8 + (double)B * a.T * (a.H + a.KV) * a.hd * 2;
    if (ride) ride_account("att_bwd", "attbwd_fused_ride", COST_FP64, a.blocks, fl, rd, (double)n * 24);
    else launch_account("att_bwd", "attbwd_fused_kernel", COST_FP64, a.blocks, fl, rd, (double)n * 24);
}
/* -protect att_bwd on the fused backward, one launch (attbwd_fused_kernel): its dq kernel's rows (attcheck_fused_rows:
 * rows_a dP, rows_b dZ) against the bounds of attbwd_scan_kernel, compared by the scan as it makes them, the bounds left
 * in scratch as attcheck_backward_dprobs leaves them (the dump reads them); and the dV column check of dv (row stride
 * ld_dv) as attcheck_backward_dv makes it, with its bound, work, work_doubles and done. Called where dv is final (after
 * v_proj's backward injection point): the scan reads only dout, v and the rows, which nothing writes in between. */
static void attcheck_fused_backward(int* counts, int* flags, double* scratch, const bf16* dout, int ld_o, const bf16* v, int ld_v,
                                    const bf16* dv, int ld_dv, int B, int T, int H, int KV, int hd, cudaStream_t stream, double* bound = NULL,
                                    double* work = NULL, size_t work_doubles = 0, unsigned* done = NULL) {
    const AttbFused a = attcheck_fused_backward_args(counts, flags, scratch, dout, ld_o, v, ld_v, dv, ld_dv, B, T, H, KV, hd, bound, work,
                                                     work_doubles, done);
    attbwd_fused_kernel<<<a.blocks, ATTC_WARPS * 32, 0, stream>>>(a);
    cudaCheck(cudaGetLastError());
    attbwd_fused_account(a, B, false);
}
/* the same checks riding on another launch of 256-thread blocks that runs after dv is final and before anything writes
 * dout, v, the rows or the scratch (the trainer: the RoPE backward of q and k, rope_qk): the arguments for it, and the
 * work accounted as a ride (no launch of its own) */
static AttbFused attcheck_fused_backward_ride(int* counts, int* flags, double* scratch, const bf16* dout, int ld_o, const bf16* v, int ld_v,
                                              const bf16* dv, int ld_dv, int B, int T, int H, int KV, int hd, double* bound, double* work,
                                              size_t work_doubles, unsigned* done) {
    const AttbFused a = attcheck_fused_backward_args(counts, flags, scratch, dout, ld_o, v, ld_v, dv, ld_dv, B, T, H, KV, hd, bound, work,
                                                     work_doubles, done);
    attbwd_fused_account(a, B, true);
    return a;
}

#endif
