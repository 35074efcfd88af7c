/* qknorm_rope.cuh: Qwen3's QK norm (a weighted RMSNorm over each head, before RoPE) and RoPE in one pass, forward and
 * (fingerprint-only) backward, with the same bits as the two kernels they fuse (rmsnorm.cuh, rope.cuh).
 *
 * Forward, per row r = (token n, head h) of x (the q or k view of the fused projection output, row stride ldx):
 *   qn = bf16(w * (x * rstd)),  rstd = 1 / sqrtf(ms + eps),  ms = mean x^2   (rmsnorm_forward_ld's expressions and sum)
 *   qr = bf16(rope(qn))                                                       (rope_forward's rope_rotate_pair)
 * Backward (the gradient of q_proj's output from the gradient of RoPE's output g, the saved ms and x):
 *   gn = bf16(rope^-1(g))                                                     (rope_backward: sin negated, rounded as stored)
 *   dx = bf16((w gn) rstd - x (sum_i (w gn)_i x_i / C) rstd^3)                (rmsnorm_backward_ld's dx, not accumulating)
 * Parallelism: the head's C = hd values in L = hd / 8 lanes, one 8-element pack each (the lane groups of rmsnorm.cuh
 * for C = 8 L: the same packs, the same per-lane order, the same xor butterfly, so the norm's sums have its bits);
 * RoPE pairs dimension i with i + hd/2, which lives in lane l ^ (L/2): one xor shuffle of the 8 values a lane
 * (both lanes compute rope_rotate_pair on the same pair and keep their half, as rope_kernel's one thread does).
 * Supported where hd is 16, 32, 64, 128 or 256 and the 16-byte path holds (ldx a multiple of 8, pointers aligned):
 * qknorm_rope_ok; elsewhere the trainer runs the two kernels.
 * Uses: the forward writes qn (the q_norm / k_norm site, the trace), ms and qr, qr's Q/K fingerprint into fp
 * (-protect qk); with every output NULL it only fingerprints (the recomputation of -protect qk). The backward comes
 * twice: the first pass's (rope_qknorm_backward_qk: dx written into the views, fingerprinted under qk_bwd, the norm
 * weights' dw as riding blocks that make each element's rope^-1 again, QknrDoutRope, and -protect att_bwd's checks
 * riding too; where no q_norm / k_norm fault is due between the two steps) and -protect qk_bwd's recomputation
 * (fingerprint-only, nothing written). The _qk launchers run Q's rows and then K's in one launch (each its own
 * outputs, weight and fingerprint). ptxas (CUDA 13.0.88, sm_90 and sm_80): the backward 63-64 registers (the
 * fingerprint-only recomputation is its fingerprinting instance), 80 with att_bwd's checks riding (and their 39 KB of
 * shared memory), no spills.
 * Accounting (ew_account, COST_NORM): the forward 4 + 6 FLOPs an element (+4 integer operations with a fingerprint),
 * the backward 7 + 6 + 4; bytes: x (g, x, ms) and w, the tables once, what is written. */
#ifndef TSDC_QKNORM_ROPE_CUH
#define TSDC_QKNORM_ROPE_CUH

#include "cuda_common.cuh"
#include "convert.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "../sdc/fingerprint.cuh"

static inline bool qknorm_rope_ok(int hd, int ldx, const void* x, const void* w) {
    return (hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256) && ldx % 8 == 0 && ptr_aligned(x, 16) && ptr_aligned(w, 16);
}

/* the partner lane's 8 values (lane ^ m: the other half of the head) */
__device__ __forceinline__ void qknr_swap8(float o[8], const float v[8], int m) {
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = __shfl_xor_sync(0xffffffffu, v[j], m);
}

/* one tensor of a launch: the forward's x (a view, row stride ldx), w, outputs qn, ms, qr (each NULL: not written), the
 * backward's g (contiguous) and saved ms_in; rows = B T nh; fp its fingerprint accumulator (NULL: none) */
struct QknrT {
    bf16 *qn, *qr;
    float* ms;
    const bf16 *x, *w, *g;
    const float* ms_in;
    size_t ldx;
    int rows, nh;
    unsigned long long* fp;
};

/* lane group row grow of a launch over t0's rows, then t1's, t2's, t3's: which tensor (0 .. 3), its row, token n, head
 * h, position t (an idle lane, grow >= all rows, maps to t0's row 0: it reads valid memory and stores nothing) */
struct QknrRow {
    bool valid, second;
    int which, row, n, h, t;
};
__device__ __forceinline__ QknrRow qknr_row(const QknrT& t0, const QknrT& t1, const QknrT& t2, const QknrT& t3, int grow, int T) {
    QknrRow r;
    const int e0 = t0.rows, e1 = e0 + t1.rows, e2 = e1 + t2.rows, e3 = e2 + t3.rows;
    r.valid = grow < e3;
    r.which = !r.valid ? 0 : grow < e0 ? 0 : grow < e1 ? 1 : grow < e2 ? 2 : 3;
    r.second = r.which == 1;
    r.row = !r.valid ? 0 : grow - (r.which == 0 ? 0 : r.which == 1 ? e0 : r.which == 2 ? e1 : e2);
    const int nh = r.which == 0 ? t0.nh : r.which == 1 ? t1.nh : r.which == 2 ? t2.nh : t3.nh;
    r.n = r.row / nh;
    r.h = r.row % nh;
    r.t = r.n % T;
    return r;
}

/* one thread a lane of a row's group; the rows of t0 then t1 (Q and K in one launch) grid-strided a warp at a time
 * (every lane reaches the shuffles; a warp may hold rows of both tensors: its lane groups are independent) */
__global__ static void qknorm_rope_forward_kernel(QknrT t0, QknrT t1, QknrT t2, QknrT t3, int C, float eps, const float* cos_t,
                                                  const float* sin_t, int T, int style, MmbTail mt) {
    Fingerprint f0 = {0, 0}, f1 = {0, 0}, f2 = {0, 0}, f3 = {0, 0};
    const int L = C / 8, half = C / 2, rows = t0.rows + t1.rows + t2.rows + t3.rows;
    const int lane = threadIdx.x & 31, gl = lane & (L - 1), rpw = 32 / L;
    const int wpb = blockDim.x >> 5, step = gridDim.x * wpb * rpw;
    for (int base = (blockIdx.x * wpb + (threadIdx.x >> 5)) * rpw; base < rows; base += step) {
        const QknrRow R = qknr_row(t0, t1, t2, t3, base + lane / L, T);
        const bool valid = R.valid;
        const int which = R.which;
        const QknrT& tt = which == 0 ? t0 : which == 1 ? t1 : which == 2 ? t2 : t3;
        const int row = R.row, n = R.n, h = R.h, t = R.t;
        float f[8];
        load8_f32(f, tt.x + (size_t)n * tt.ldx + (size_t)h * C + gl * 8, 8, true, 0.0f);
        if (!valid)
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = 0.0f;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) acc += f[j] * f[j];
        const float m = rmsnorm_group_sum(acc, L) / C;
        const float rstd = 1.0f / sqrtf(m + eps);
        rmsnorm_scale8(f, tt.w, gl * 8, 8, true, rstd);
        float nb[8], other[8];
#pragma unroll
        for (int j = 0; j < 8; j++) nb[j] = __bfloat162float(__float2bfloat16_rn(f[j]));   /* qn as stored */
        qknr_swap8(other, nb, L / 2);
        if (!valid) continue;
        if (gl == 0 && tt.ms) tt.ms[row] = m;
        const size_t ro = (size_t)row * C + gl * 8;
        if (tt.qn) store8_bf16(tt.qn + ro, nb, 8, true);
        const bool lo = gl < L / 2;
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = (gl & (L / 2 - 1)) * 8 + j;   /* the pair's first-half dimension */
            float y1, y2;
            rope_rotate_pair(style, lo ? nb[j] : other[j], lo ? other[j] : nb[j], cos_t[t * half + i], sin_t[t * half + i], &y1, &y2);
            y[j] = lo ? y1 : y2;
        }
        if (tt.qr) store8_bf16(tt.qr + ro, y, 8, true);
        if (tt.fp)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint64_t bits = (uint64_t)__bfloat16_as_ushort(__float2bfloat16_rn(y[j]));
                if (which == 0) fp_add(&f0, (uint64_t)ro + j, bits, 16);
                else if (which == 1) fp_add(&f1, (uint64_t)ro + j, bits, 16);
                else if (which == 2) fp_add(&f2, (uint64_t)ro + j, bits, 16);
                else fp_add(&f3, (uint64_t)ro + j, bits, 16);
            }
    }
    mmb_tail_run(mt, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);   /* a riding bound check (v) */
    unsigned long long *a0 = t0.rows ? t0.fp : NULL, *a1 = t1.rows ? t1.fp : NULL, *a2 = t2.rows ? t2.fp : NULL, *a3 = t3.rows ? t3.fp : NULL;
    if (a0 || a1 || a2 || a3) fp_block_reduce4(f0, f1, f2, f3, a0, a1, a2, a3);   /* the same for the whole block */
}

/* the backward of one row's lane group, fingerprint-only: gv the lane's 8 values (dimensions gl*8 ..) of the gradient of
 * RoPE's output, g; then gn = bf16(rope^-1(g)) and, with x (the lane's 8 values of the forward's QK-norm input row) and
 * w (the norm weight's 8 at gl*8), the QK norm's dx from gn, x and the row's saved mean square ms; each output element's
 * bf16 bits folded into f under its logical index ro + j. x NULL: RoPE's backward alone (its dx is the output). Every
 * lane of the warp calls it (shuffles); an idle lane (valid false) takes part in them and folds nothing. dxo (not NULL, with
 * x): the 8 dx values also stored there as bf16 (the first pass's writing kernel); f NULL: no fingerprint. The one body of
 * rope_qknorm_backward_kernel below (both passes) and of the flash rerun's epilogue (flash_attention.cuh), so all have these bits;
 * rope_kernel's pair arithmetic (rope_rotate_pair, sin negated, one rounding) in lane form. */
__device__ __forceinline__ void qknr_backward_group_fp(const float gv[8], const bf16* x, const bf16* w, float ms, bool valid, int gl, int L,
                                                       int C, int t, float eps, const float* cos_t, const float* sin_t, int style,
                                                       uint64_t ro, Fingerprint* f, bf16* dxo = nullptr) {
    const int half = C / 2;
    float other[8], gn[8], xv[8], wv[8];
    if (x) {
        load8_f32(xv, x, 8, true, 0.0f);
        load8_f32(wv, w, 8, true, 0.0f);
    }
    qknr_swap8(other, gv, L / 2);
    const bool lo = gl < L / 2;
#pragma unroll
    for (int j = 0; j < 8; j++) {   /* RoPE's backward (sin negated), rounded as rope_backward stores it */
        const int i = (gl & (L / 2 - 1)) * 8 + j;
        float y1, y2;
        rope_rotate_pair(style, lo ? gv[j] : other[j], lo ? other[j] : gv[j], cos_t[t * half + i], -sin_t[t * half + i], &y1, &y2);
        gn[j] = __bfloat162float(__float2bfloat16_rn(lo ? y1 : y2));
    }
    if (!x) {
        if (valid && f)
#pragma unroll
            for (int j = 0; j < 8; j++) fp_add(f, ro + j, (uint64_t)__bfloat16_as_ushort(__float2bfloat16_rn(gn[j])), 16);
        return;
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        gn[j] = wv[j] * gn[j];
        acc += gn[j] * xv[j];
    }
    if (!valid) acc = 0.0f;
    const float dot = rmsnorm_group_sum(acc, L);
    if (!valid) return;
    const float rstd = 1.0f / sqrtf(ms + eps);
    const float coef = dot / C * rstd * rstd * rstd;
    float dx[8];
#pragma unroll
    for (int j = 0; j < 8; j++) dx[j] = gn[j] * rstd - xv[j] * coef;
    if (dxo) store8_bf16(dxo, dx, 8, true);
    if (f)
#pragma unroll
        for (int j = 0; j < 8; j++) fp_add(f, ro + j, (uint64_t)__bfloat16_as_ushort(__float2bfloat16_rn(dx[j])), 16);
}

/* the dw riders' gradient: gn = bf16(rope^-1(g)) at (r, c) from RoPE's output gradient g [rows, C] (contiguous), as
 * rope_kernel's backward stores it (the pair i, i + C/2 of row r = (n, h) at position t = n % T, sin negated, one rounding) */
struct QknrDoutRope {
    const bf16* g;
    const float *cos_t, *sin_t;
    int C, nh, T, style;
    __device__ float operator()(int r, int c) const {
        const int half = C / 2, i = c < half ? c : c - half, t = (r / nh) % T;
        const size_t rb = (size_t)r * C;
        float y1, y2;
        rope_rotate_pair(style, __bfloat162float(g[rb + i]), __bfloat162float(g[rb + i + half]), cos_t[t * half + i], -sin_t[t * half + i], &y1,
                         &y2);
        return __bfloat162float(__float2bfloat16_rn(c < half ? y1 : y2));
    }
};
/* The first pass's backward of RoPE and Qwen3's QK norm in one launch, where no fault is due between them (else the
 * trainer runs rope_qk's backward into scratch and rmsnorm_backward_ld for Q and for K): blocks [0, gr) take the rows of
 * t0 (Q) then t1 (K), gn = bf16(rope^-1(g)) and the norm's dx (not accumulated) stored into dx0 / dx1 (the views of
 * the q/k/v gradient, row stride t.ldx) and, FP, fingerprinted into t.fp; then ride, each its own body: AB -protect
 * att_bwd's fused checks (ab.blocks), Q's norm-weight gradient (d0: rmsnorm_dw_partial_block with gn made again per element,
 * QknrDoutRope) and K's (d1). Every output the bits of the two-step form's (the same bodies, orders and roundings). That
 * instance carries the riders' registers and shared memory, as rope_kernel's riding instance does. With dx0, dx1 NULL and
 * no riders (d0, d1 of no blocks) it is -protect qk_bwd's fingerprint-only recomputation (rope_qknorm_backward_launch) */
template <bool FP, bool AB>
__global__ static void rope_qknorm_backward_kernel(QknrT t0, QknrT t1, bf16* dx0, bf16* dx1, int C, float eps, const float* cos_t,
                                                   const float* sin_t, int T, int style, unsigned gr, AttbFused ab, RmsDwRide d0,
                                                   RmsDwRide d1) {
    static_assert(RMSNORM_BLOCK == RMSNORM_DW_TX * RMSNORM_DW_TY && RMSNORM_BLOCK == ATTC_WARPS * 32, "the riders' blocks are the launch's");
    if (blockIdx.x >= gr) {
        int k = (int)(blockIdx.x - gr);
        if (AB) {
            if (k < (int)ab.blocks) {
                attbwd_fused_block(ab, k);
                return;
            }
            k -= (int)ab.blocks;
        }
        const int n0 = d0.col_blocks * d0.nchunks;
        const bool second = k >= n0;
        const RmsDwRide& d = second ? d1 : d0;
        const QknrT& t = second ? t1 : t0;
        if (second) k -= n0;
        const QknrDoutRope g = {t.g, cos_t, sin_t, C, t.nh, T, style};
        rmsnorm_dw_partial_block(k % d.col_blocks, k / d.col_blocks, d.nchunks, (int)(threadIdx.x % RMSNORM_DW_TX), (int)(threadIdx.x / RMSNORM_DW_TX),
                                 d.part, g, t.x, t.ms_in, t.rows, C, t.nh, t.ldx, eps, d.R, d.dw, d.accumulate, d.done);
        return;
    }
    Fingerprint f0 = {0, 0}, f1 = {0, 0};
    QknrT none = t1;   /* no third or fourth tensor */
    none.rows = 0;
    const int L = C / 8, rows = t0.rows + t1.rows;
    const int lane = threadIdx.x & 31, gl = lane & (L - 1), rpw = 32 / L;
    const int wpb = blockDim.x >> 5, step = (int)gr * wpb * rpw;
    for (int base = (blockIdx.x * wpb + (threadIdx.x >> 5)) * rpw; base < rows; base += step) {
        const QknrRow R = qknr_row(t0, t1, none, none, base + lane / L, T);
        const QknrT& tt = R.second ? t1 : t0;
        const size_t ro = (size_t)R.row * C + gl * 8, xo = (size_t)R.n * tt.ldx + (size_t)R.h * C + gl * 8;
        bf16* dxb = R.second ? dx1 : dx0;   /* NULL: fingerprint only */
        float gv[8];
        load8_f32(gv, tt.g + ro, 8, true, 0.0f);
        qknr_backward_group_fp(gv, tt.x + xo, tt.w + gl * 8, R.valid ? tt.ms_in[R.row] : 0.0f, R.valid, gl, L, C, R.t, eps, cos_t, sin_t, style,
                               (uint64_t)ro, FP ? (R.second ? &f1 : &f0) : nullptr, R.valid && dxb ? dxb + xo : nullptr);
    }
    if (FP) fp_block_reduce2(f0, f1, t0.fp, t1.rows ? t1.fp : NULL);
}

static const QknrT QKNR_NONE = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 1, NULL};   /* no second tensor */
static int qknorm_rope_grid(int rows, int C) {
    int g = rmsnorm_grid(rows, C / 8);
    return g > FP_MAX_GRID ? FP_MAX_GRID : g;
}
static QknrT qknr_tensor(bf16* qn, float* ms, bf16* qr, const bf16* x, int ldx, const bf16* w, const bf16* g, const float* ms_in, int rows,
                         int nh, unsigned long long* fp) {
    QknrT t = {qn, qr, ms, x, w, g, ms_in, (size_t)ldx, rows, nh, fp};
    return t;
}
static void qknr_check(const char* who, int C, int ldx, const void* x, const void* w, const void* o1, const void* o2) {
    if (!qknorm_rope_ok(C, ldx, x, w) || (o1 && !ptr_aligned(o1, 16)) || (o2 && !ptr_aligned(o2, 16)))
        tsdc_fail("%s: head_dim %d, row stride %d or alignment not supported (qknorm_rope_ok)", who, C, ldx);
}
/* a tensor's bytes written, its FLOPs (with its fingerprint's integer operations) and its weight's bytes read */
static size_t qknr_written(const QknrT& t, int C) {
    const size_t n = (size_t)t.rows * C;
    return (t.qn ? n * 2 : 0) + (t.ms ? (size_t)t.rows * 4 : 0) + (t.qr ? n * 2 : 0);
}
static double qknr_flops(const QknrT& t, int C) { return (10.0 + (t.fp ? 4.0 : 0.0)) * t.rows * C; }
static size_t qknr_wbytes(const QknrT& t, int C) { return t.rows ? (size_t)C * 2 : 0; }
static void qknorm_rope_launch(const QknrT& t0, const QknrT& t1, int T, int C, float eps, const float* cos, const float* sin, int style,
                               cudaStream_t stream, const MmbTail& mt = MMB_TAIL_NONE, const QknrT& t2 = QKNR_NONE,
                               const QknrT& t3 = QKNR_NONE) {
    const int rows = t0.rows + t1.rows + t2.rows + t3.rows;
    if (rows <= 0) return;
    const int grid = qknorm_rope_grid(rows, C);
    qknorm_rope_forward_kernel<<<grid, RMSNORM_BLOCK, 0, stream>>>(t0, t1, t2, t3, C, eps, cos, sin, T, style, mt);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    ew_account(COST_NORM, "qknorm_rope_forward_kernel", grid,
               qknr_flops(t0, C) + qknr_flops(t1, C) + qknr_flops(t2, C) + qknr_flops(t3, C) + mmb_tail_flops(mt),
               n * 2 + qknr_wbytes(t0, C) + qknr_wbytes(t1, C) + qknr_wbytes(t2, C) + qknr_wbytes(t3, C) + rope_table_bytes(T, C) + mmb_tail_bytes(mt),
               qknr_written(t0, C) + qknr_written(t1, C) + qknr_written(t2, C) + qknr_written(t3, C));
}
/* qn [N*nh, C] and ms [N*nh] (each NULL: not written) = rmsnorm of x (the view: row (n, h) at n * ldx + h * C), qr
 * [N*nh, C] (NULL: not written) = rope(qn), qr's fingerprint into fp (NULL: none); qknorm_rope_ok must hold */
static void qknorm_rope_forward(bf16* qn, float* ms, bf16* qr, const bf16* x, int ldx, const bf16* w, int B, int T, int nh, int C, float eps,
                                const float* cos, const float* sin, int style, unsigned long long* fp, cudaStream_t stream) {
    qknr_check("qknorm_rope_forward", C, ldx, x, w, qn, qr);
    qknorm_rope_launch(qknr_tensor(qn, ms, qr, x, ldx, w, NULL, NULL, B * T * nh, nh, fp), QKNR_NONE, T, C, eps, cos, sin, style, stream);
}
/* the same for Q (H heads, its norm's weight wq) and K (KV heads, wk) in one launch, each with its outputs and fingerprint;
 * mt: a bound check riding on the launch (v's: rope.cuh's MmbTail); rr: a second Q and K (the views of -protect qk's
 * recomputed [N, qd + kd] output, rope.cuh's QkFpPair) normed and rotated in the same launch, fingerprint-only */
static void qknorm_rope_forward_qk(bf16* qn, float* qms, bf16* qr, bf16* kn, float* kms, bf16* kr, const bf16* q, const bf16* k, int ldx,
                                   const bf16* wq, const bf16* wk, int B, int T, int H, int KV, int C, float eps, const float* cos,
                                   const float* sin, int style, unsigned long long* fpq, unsigned long long* fpk, cudaStream_t stream,
                                   const MmbTail& mt = MMB_TAIL_NONE, const QkFpPair* rr = NULL) {
    qknr_check("qknorm_rope_forward_qk", C, ldx, q, wq, qn, qr);
    qknr_check("qknorm_rope_forward_qk", C, ldx, k, wk, kn, kr);
    if ((fpq == NULL) != (fpk == NULL)) tsdc_fail("qknorm_rope_forward_qk: fingerprints for both Q and K or for neither");
    const QknrT tq = qknr_tensor(qn, qms, qr, q, ldx, wq, NULL, NULL, B * T * H, H, fpq);
    const QknrT tk = qknr_tensor(kn, kms, kr, k, ldx, wk, NULL, NULL, B * T * KV, KV, fpk);
    if (!rr) {
        qknorm_rope_launch(tq, tk, T, C, eps, cos, sin, style, stream, mt);
        return;
    }
    qknr_check("qknorm_rope_forward_qk", C, rr->ld, rr->q, wq, NULL, NULL);
    qknr_check("qknorm_rope_forward_qk", C, rr->ld, rr->k, wk, NULL, NULL);
    if (!rr->fpq || !rr->fpk) tsdc_fail("qknorm_rope_forward_qk: the second pair needs both fingerprints");
    qknorm_rope_launch(tq, tk, T, C, eps, cos, sin, style, stream, mt, qknr_tensor(NULL, NULL, NULL, rr->q, rr->ld, wq, NULL, NULL, B * T * H, H, rr->fpq),
                       qknr_tensor(NULL, NULL, NULL, rr->k, rr->ld, wk, NULL, NULL, B * T * KV, KV, rr->fpk));
}
static void rope_qknorm_backward_launch(const QknrT& t0, const QknrT& t1, int T, int C, float eps, const float* cos, const float* sin,
                                        int style, cudaStream_t stream) {
    const int rows = t0.rows + t1.rows;
    if (rows <= 0) return;
    const int grid = qknorm_rope_grid(rows, C);
    const RmsDwRide none = {NULL, NULL, NULL, 0, 0, 0, 0};
    const AttbFused no = {};
    rope_qknorm_backward_kernel<true, false><<<grid, RMSNORM_BLOCK, 0, stream>>>(t0, t1, NULL, NULL, C, eps, cos, sin, T, style, (unsigned)grid, no,
                                                                                  none, none);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    ew_account(COST_NORM, "rope_qknorm_backward_fp_kernel", grid, 17.0 * n,
               n * 4 + (size_t)rows * 4 + (size_t)C * 2 * (t1.rows ? 2 : 1) + rope_table_bytes(T, C), 0);   /* g, x, ms, w, the tables in */
}
/* the fingerprints of the QK norm's dx from the gradients of RoPE's output gq, gk (nothing written), Q and K in one
 * launch: x, ms and w the forward's (q, k the views of row stride ldx) */
static void rope_qknorm_backward_fp_qk(const bf16* gq, const bf16* gk, const bf16* q, const bf16* k, int ldx, const bf16* wq, const bf16* wk,
                                       const float* qms, const float* kms, int B, int T, int H, int KV, int C, float eps, const float* cos,
                                       const float* sin, int style, unsigned long long* fpq, unsigned long long* fpk, cudaStream_t stream) {
    qknr_check("rope_qknorm_backward_fp_qk", C, ldx, q, wq, gq, NULL);
    qknr_check("rope_qknorm_backward_fp_qk", C, ldx, k, wk, gk, NULL);
    rope_qknorm_backward_launch(qknr_tensor(NULL, NULL, NULL, q, ldx, wq, gq, qms, B * T * H, H, fpq),
                                qknr_tensor(NULL, NULL, NULL, k, ldx, wk, gk, kms, B * T * KV, KV, fpk), T, C, eps, cos, sin, style, stream);
}
/* one tensor alone (tests) */
static void rope_qknorm_backward_fp(const bf16* g, const bf16* x, int ldx, const bf16* w, const float* ms, int B, int T, int nh, int C,
                                    float eps, const float* cos, const float* sin, int style, unsigned long long* fp, cudaStream_t stream) {
    qknr_check("rope_qknorm_backward_fp", C, ldx, x, w, g, NULL);
    rope_qknorm_backward_launch(qknr_tensor(NULL, NULL, NULL, x, ldx, w, g, ms, B * T * nh, nh, fp), QKNR_NONE, T, C, eps, cos, sin, style, stream);
}

/* The first pass's backward of RoPE and Qwen3's QK norm, Q and K, in one launch (rope_qknorm_backward_kernel): dxq, dxk
 * (the views of the q/k/v gradient, row stride ldx, as q and k) = the norm's dx from gn = rope^-1(gq), rope^-1(gk)
 * (contiguous [B T H, C], [B T KV, C]: RoPE's output gradients) and the forward's x (q, k), mean squares and weights, not
 * accumulated; dwq, dwk (+)= the norm weights' gradients (accumulate_dw 0: = 0 + them); fpq, fpk (both or neither): dxq's
 * and dxk's fingerprints; ab: -protect att_bwd's checks riding (attcheck_fused_backward_ride). The bits of rope_qk's
 * backward into scratch followed by rmsnorm_backward_ld of Q and of K. Uses workspace slot 0. qknorm_rope_ok must hold. */
static int g_qknr_bwd_grid_cap = 0;   /* test-only: > 0 caps the rows' grid, so that its warps stride */
static void rope_qknorm_backward_qk(bf16* dxq, bf16* dxk, float* dwq, float* dwk, const bf16* gq, const bf16* gk, const bf16* q, const bf16* k,
                                    int ldx, const bf16* wq, const bf16* wk, const float* qms, const float* kms, int B, int T, int H, int KV,
                                    int C, float eps, int accumulate_dw, const float* cos, const float* sin, int style,
                                    unsigned long long* fpq, unsigned long long* fpk, const AttbFused* ab, cudaStream_t stream) {
    qknr_check("rope_qknorm_backward_qk", C, ldx, q, wq, gq, dxq);
    qknr_check("rope_qknorm_backward_qk", C, ldx, k, wk, gk, dxk);
    if ((fpq == NULL) != (fpk == NULL)) tsdc_fail("rope_qknorm_backward_qk: fingerprints for both Q and K or for neither");
    if (!dxq || !dxk || !dwq || !dwk) tsdc_fail("rope_qknorm_backward_qk: dx and dw of both Q and K are written");
    const QknrT tq = qknr_tensor(NULL, NULL, NULL, q, ldx, wq, gq, qms, B * T * H, H, fpq);
    const QknrT tk = qknr_tensor(NULL, NULL, NULL, k, ldx, wk, gk, kms, B * T * KV, KV, fpk);
    const int rows = tq.rows + tk.rows;
    if (rows <= 0) return;
    int cb, Rq, nq, Rk, nk;
    rmsnorm_dw_plan(tq.rows, C, &cb, &Rq, &nq);
    rmsnorm_dw_plan(tk.rows, C, &cb, &Rk, &nk);
    float* part = cuda_workspace_f32(0, (size_t)(nq + nk) * C);
    unsigned* done = rmsnorm_dw_done(2 * cb);
    const RmsDwRide d0 = {part, dwq, done, Rq, accumulate_dw, cb, nq}, d1 = {part + (size_t)nq * C, dwk, done + cb, Rk, accumulate_dw, cb, nk};
    int grid = qknorm_rope_grid(rows, C);
    if (g_qknr_bwd_grid_cap > 0 && grid > g_qknr_bwd_grid_cap) grid = g_qknr_bwd_grid_cap;
    const AttbFused no = {};
    const unsigned gg = (unsigned)grid + (ab ? ab->blocks : 0u) + (unsigned)(cb * (nq + nk));
    if (fpq && ab) rope_qknorm_backward_kernel<true, true><<<gg, RMSNORM_BLOCK, 0, stream>>>(tq, tk, dxq, dxk, C, eps, cos, sin, T, style, grid, *ab, d0, d1);
    else if (fpq) rope_qknorm_backward_kernel<true, false><<<gg, RMSNORM_BLOCK, 0, stream>>>(tq, tk, dxq, dxk, C, eps, cos, sin, T, style, grid, no, d0, d1);
    else if (ab) rope_qknorm_backward_kernel<false, true><<<gg, RMSNORM_BLOCK, 0, stream>>>(tq, tk, dxq, dxk, C, eps, cos, sin, T, style, grid, *ab, d0, d1);
    else rope_qknorm_backward_kernel<false, false><<<gg, RMSNORM_BLOCK, 0, stream>>>(tq, tk, dxq, dxk, C, eps, cos, sin, T, style, grid, no, d0, d1);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    /* g, x in, ms, w, the tables; dx out (RoPE's 6 FLOPs an element and the norm's 7, +4 integer operations fingerprinting) */
    ew_account(COST_NORM, fpq ? "rope_qknorm_backward_kernel_fp" : "rope_qknorm_backward_kernel", grid, (fpq ? 17.0 : 13.0) * n,
               n * 4 + (size_t)rows * 4 + (size_t)C * 2 * 2 + rope_table_bytes(T, C), n * 2);
    double fl;
    size_t rd, wr;
    rmsnorm_dw_bytes(tq.rows, C, nq, accumulate_dw, &fl, &rd, &wr);
    ew_ride_account(COST_NORM, "rmsnorm_dw_partial_ride", dim3(cb * nq), fl + 6.0 * tq.rows * C, rd + rope_table_bytes(T, C), wr);
    rmsnorm_dw_bytes(tk.rows, C, nk, accumulate_dw, &fl, &rd, &wr);
    ew_ride_account(COST_NORM, "rmsnorm_dw_partial_ride", dim3(cb * nk), fl + 6.0 * tk.rows * C, rd + rope_table_bytes(T, C), wr);
}

#endif
