/* rope.cuh: rotary position embedding, forward and backward, both styles.
 *
 * Math: for token n (position t = n % T), head h, pair i < hd/2 of that head's vector
 * (x1 = x[i], x2 = x[i + hd/2]), rope_rotate_pair(style, x1, x2, cos[t,i], sin[t,i]) from
 * llmc/cpu/rope.h (the shared element math; HF half-split or nanochat direction). The rotation is
 * orthogonal, so the backward pass is the same rotation with sin negated (exact in fp32).
 * Layout: x, out, dout, dx [B*T, nh*hd] bf16 (heads interleaved per token), each with its own row stride
 * (elements between consecutive tokens, >= nh*hd): the forward reads q or k as a view of the fused
 * [N, qd + 2 kd] projection output (ldx = qd + 2 kd) and writes its contiguous output (nh*hd); the backward
 * reads the contiguous gradient and writes into the fused [N, qd + 2 kd] gradient (lddx). Token n, head h,
 * element e is at n * ld + h * hd + e. cos, sin [T, hd/2] fp32 (rope_tables() in llmc/cpu/rope.h). One
 * thread per pair; out may equal x when their strides are equal (each thread reads its pair, then writes
 * it). Pair index math in 32 bits when the pair count allows, else 64; element offsets in 64.
 * The fingerprint (FP) folds each output element under its logical index n * nh*hd + h * hd + e (the
 * contiguous tensor's), whatever the strides.
 * CPU reference: rope_forward, rope_backward in llmc/cpu/cpu_kernels.h (same expressions).
 * Accounting (ew_account, COST_ELEMENTWISE): 6 FLOPs a pair (4 multiplies, 2 adds), +8 integer operations a
 * pair for a fingerprint (4 an element); bytes: x in and out written once, the cos and sin tables read once
 * (T hd/2 pairs of fp32: every head and batch row reads the same table, from L2 after the first read). */
#ifndef TSDC_ROPE_CUH
#define TSDC_ROPE_CUH

#include "cuda_common.cuh"
#include "convert.cuh"
#include "../cpu/rope.h"
#include "../sdc/fingerprint.cuh"
#include "../sdc/bound.h"
#include "../sdc/attcheck.cuh"

/* -protect bound's check of another product's output riding on a launch that runs right after the GEMM that wrote it
 * (v: a column view of the fused Q/K/V output, checked by the launch that rotates q and k, here or in
 * qknorm_rope.cuh): y [rows, cols] (row stride ld) against mmb_violates(y, xn[row], wn[col], c) (llmc/sdc/bound.h),
 * xn the input rows' norms its norm kernel left, the flag set by atomicOr. vec: 8 elements an item (cols and ld
 * multiples of 8, y 16-byte aligned), else one. The launch's threads take the items after their own work, grid-stride. */
struct MmbTail {
    const bf16* y;
    size_t ld;
    int rows, cols;
    bool vec;
    const float *xn, *wn;
    float c;
    int* flag;
};
static const MmbTail MMB_TAIL_NONE = {NULL, 0, 0, 0, false, NULL, NULL, 0.0f, NULL};
__host__ __device__ static inline size_t mmb_tail_items(const MmbTail& m) { return m.y ? (size_t)m.rows * m.cols / (m.vec ? 8 : 1) : 0; }
static inline MmbTail mmb_tail(const bf16* y, size_t ld, int rows, int cols, const float* xn, const float* wn, float c, int* flag) {
    const MmbTail m = {y, ld, rows, cols, cols % 8 == 0 && ld % 8 == 0 && ptr_aligned(y, 16), xn, wn, c, flag};
    return m;
}
/* item i of the check: true on a violation */
__device__ __forceinline__ bool mmb_tail_item(const MmbTail& m, size_t i) {
    const int per = m.vec ? 8 : 1, ipr = m.cols / per;
    const size_t r = i / (size_t)ipr;
    const int c0 = (int)(i - r * ipr) * per;
    float f[8];
    load8_f32(f, m.y + r * m.ld + c0, per, m.vec, 0.0f);
    const float nx = m.xn[r];
    bool bad = false;
    for (int j = 0; j < per; j++) bad |= mmb_violates(f[j], nx, m.wn[c0 + j], m.c);
    return bad;
}
/* the items of m, grid-stride from thread g over nthreads, the flag set once a thread */
__device__ __forceinline__ void mmb_tail_run(const MmbTail& m, size_t g, size_t nthreads) {
    if (!m.y) return;
    const size_t n = mmb_tail_items(m);
    bool bad = false;
    for (size_t i = g; i < n; i += nthreads) bad |= mmb_tail_item(m, i);
    if (bad) atomicOr(m.flag, 1);
}
/* its work: 3 FLOPs an element, y and the input norms read (the weights' norms from L2) */
static inline double mmb_tail_flops(const MmbTail& m) { return m.y ? 3.0 * m.rows * m.cols : 0.0; }
static inline size_t mmb_tail_bytes(const MmbTail& m) { return m.y ? (size_t)m.rows * m.cols * 2 + (size_t)m.rows * 4 + (size_t)m.cols * 4 : 0; }

/* one tensor of a launch: out (row stride ldo; NULL with FP: fingerprint only) = the rotation of x (row stride ldx), nh
 * heads a token, npairs = B T nh hd/2 pairs, its fingerprint into fp (FP) */
struct RopeT {
    bf16* out;
    size_t ldo;
    const bf16* x;
    size_t ldx;
    int nh;
    size_t npairs;
    unsigned long long* fp;
};
/* pair idx of tensor t: its rotation stored and, with FP, folded into f */
template <typename I, bool FP>
__device__ __forceinline__ void rope_pair(const RopeT& tt, I idx, const float* cos_t, const float* sin_t, int T, int hd, int style,
                                          bool inverse, Fingerprint* f) {
    const I half = (I)(hd / 2);
    const I hr = idx / half;              /* head row: n * nh + h */
    const int i = (int)(idx - hr * half);
    const I n = hr / (I)tt.nh;
    const int h = (int)(hr - n * (I)tt.nh);
    const int t = (int)(n % (I)T);
    const size_t base = (size_t)hr * hd;  /* logical (contiguous) offset of the head's vector */
    const size_t xb = (size_t)n * tt.ldx + (size_t)h * hd, ob = (size_t)n * tt.ldo + (size_t)h * hd;
    const float c = cos_t[t * (int)half + i];
    const float s = inverse ? -sin_t[t * (int)half + i] : sin_t[t * (int)half + i];
    float y1, y2;
    rope_rotate_pair(style, __bfloat162float(tt.x[xb + i]), __bfloat162float(tt.x[xb + i + half]), c, s, &y1, &y2);
    const bf16 o1 = __float2bfloat16_rn(y1), o2 = __float2bfloat16_rn(y2);
    if (!FP || tt.out) { tt.out[ob + i] = o1; tt.out[ob + i + half] = o2; }
    if (FP) {
        fp_add(f, (uint64_t)(base + i), (uint64_t)__bfloat16_as_ushort(o1), 16);
        fp_add(f, (uint64_t)(base + i + half), (uint64_t)__bfloat16_as_ushort(o2), 16);
    }
}
/* one launch over the pairs of t0, t1, t2, t3 in turn (an empty tensor: npairs 0; Q and K in one launch, and with t2,
 * t3 the fingerprint-only Q and K of -protect qk's recomputation beside them), grid-stride. FP: every output element
 * also folded into its tensor's Q/K fingerprint accumulator (fingerprint.cuh; a tensor with fp NULL: not kept); out
 * may then be NULL (fingerprint only) */
template <typename I, bool FP, bool AB>
__global__ static void rope_kernel(RopeT t0, RopeT t1, RopeT t2, RopeT t3, const float* cos_t, const float* sin_t, int T, int hd,
                                   int style, bool inverse, MmbTail mt, AttbFused ab) {
    /* AB: -protect att_bwd's fused checks ride on the launch: its last ab.blocks blocks run them (attcheck.cuh), the
     * others the pairs over their own grid. That instance carries the checks' registers and shared memory (ptxas, sm_90:
     * 80 registers and 39-41 KB against 32-56 and at most 2 KB), so its pair blocks run at most 3 a SM: the cost model does not
     * charge it (an element-wise pass reaches most of the bandwidth there), a GPU measures it */
    const unsigned gr = gridDim.x - (AB ? ab.blocks : 0u);
    if (AB && blockIdx.x >= gr) {
        attbwd_fused_block(ab, (int)(blockIdx.x - gr));
        return;
    }
    Fingerprint f0 = {0, 0}, f1 = {0, 0}, f2 = {0, 0}, f3 = {0, 0};
    const I stride = (I)gr * blockDim.x, n0 = (I)t0.npairs, n1 = n0 + (I)t1.npairs, n2 = n1 + (I)t2.npairs, np = n2 + (I)t3.npairs;
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < np; idx += stride) {
        if (idx < n0) rope_pair<I, FP>(t0, idx, cos_t, sin_t, T, hd, style, inverse, &f0);
        else if (idx < n1) rope_pair<I, FP>(t1, idx - n0, cos_t, sin_t, T, hd, style, inverse, &f1);
        else if (idx < n2) rope_pair<I, FP>(t2, idx - n1, cos_t, sin_t, T, hd, style, inverse, &f2);
        else rope_pair<I, FP>(t3, idx - n2, cos_t, sin_t, T, hd, style, inverse, &f3);
    }
    mmb_tail_run(mt, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gr * blockDim.x);
    if (FP)
        fp_block_reduce4(f0, f1, f2, f3, t0.npairs ? t0.fp : NULL, t1.npairs ? t1.fp : NULL, t2.npairs ? t2.fp : NULL, t3.npairs ? t3.fp : NULL);
}

/* the cos and sin tables' bytes, read once by a launch */
static inline size_t rope_table_bytes(int T, int hd) { return (size_t)T * (hd / 2) * 8; }

static RopeT rope_tensor(bf16* out, size_t ldo, const bf16* x, size_t ldx, int B, int T, int nh, int hd, unsigned long long* fp,
                         const char* name) {
    if ((out && ldo < (size_t)nh * hd) || ldx < (size_t)nh * hd) tsdc_fail("%s: row strides %zu, %zu below nh*hd = %d", name, ldo, ldx, nh * hd);
    RopeT t = {out, ldo, x, ldx, nh, (size_t)B * T * nh * (hd / 2), fp};
    return t;
}
/* rope_kernel over t0 and t1 (t1.npairs 0: t0 alone); fp: the fingerprinting variant; does not wait */
static const RopeT ROPE_NONE = {NULL, 0, NULL, 0, 1, 0, NULL};
static const AttbFused ATTB_NONE = {};
static int g_rope_grid_cap = 0;   /* test-only: > 0 caps the pairs' grid, so that its threads stride (the trainer's shapes do) */
static int g_rope_index64 = 0;    /* test-only: 1 takes the 64-bit index instances, which only tensors of over 4 G pairs need */
/* the launch with index type I: 32-bit wherever idx + stride cannot wrap (every shape of these models), 64-bit beyond.
 * A pair's index splits into head row, head, token and position by three divisions, which the GPU has no unit for: a
 * 32-bit one is a short inline sequence; a 64-bit one adds a test of its operands' high words (and the 64-bit index
 * arithmetic around it) before that sequence, and calls a long subroutine where they are set */
template <typename I>
static void rope_launch_i(unsigned g, const RopeT& t0, const RopeT& t1, const RopeT& t2, const RopeT& t3, const float* cos, const float* sin,
                          int T, int hd, int style, bool inverse, bool fp, const MmbTail& mt, const AttbFused* ab, cudaStream_t stream) {
    if (ab && fp) rope_kernel<I, true, true><<<g, EW_BLOCK, 0, stream>>>(t0, t1, t2, t3, cos, sin, T, hd, style, inverse, mt, *ab);
    else if (ab) rope_kernel<I, false, true><<<g, EW_BLOCK, 0, stream>>>(t0, t1, t2, t3, cos, sin, T, hd, style, inverse, mt, *ab);
    else if (fp) rope_kernel<I, true, false><<<g, EW_BLOCK, 0, stream>>>(t0, t1, t2, t3, cos, sin, T, hd, style, inverse, mt, ATTB_NONE);
    else rope_kernel<I, false, false><<<g, EW_BLOCK, 0, stream>>>(t0, t1, t2, t3, cos, sin, T, hd, style, inverse, mt, ATTB_NONE);
}
static void rope_launch2(const RopeT& t0, const RopeT& t1, const float* cos, const float* sin, int T, int hd, int style, bool inverse,
                         bool fp, const char* name, cudaStream_t stream, const MmbTail& mt = MMB_TAIL_NONE, const RopeT& t2 = ROPE_NONE,
                         const RopeT& t3 = ROPE_NONE, const AttbFused* ab = NULL) {
    static_assert(EW_BLOCK == ATTC_WARPS * 32, "the riding attention checks' blocks are the launch's");
    const size_t npairs = t0.npairs + t1.npairs + t2.npairs + t3.npairs;
    if (npairs == 0 && !ab) return;
    int grid = ew_grid(npairs);
    if (fp && grid > FP_MAX_GRID) grid = FP_MAX_GRID;
    if (g_rope_grid_cap > 0 && grid > g_rope_grid_cap) grid = g_rope_grid_cap;
    const unsigned g = (unsigned)grid + (ab ? ab->blocks : 0u);
    if (npairs <= 0xffffffffull - ((size_t)EW_MAX_GRID * EW_BLOCK) && !g_rope_index64)   /* idx + stride must not wrap in 32 bits */
        rope_launch_i<unsigned int>(g, t0, t1, t2, t3, cos, sin, T, hd, style, inverse, fp, mt, ab, stream);
    else
        rope_launch_i<size_t>(g, t0, t1, t2, t3, cos, sin, T, hd, style, inverse, fp, mt, ab, stream);
    cudaCheck(cudaGetLastError());
    const size_t written = (t0.out ? t0.npairs : 0) + (t1.out ? t1.npairs : 0) + (t2.out ? t2.npairs : 0) + (t3.out ? t3.npairs : 0);
    /* x pairs (bf16), the tables (and a riding bound check's y and norms) in; out written */
    ew_account(COST_ELEMENTWISE, name, grid, (fp ? 14.0 : 6.0) * npairs + mmb_tail_flops(mt), npairs * 4 + rope_table_bytes(T, hd) + mmb_tail_bytes(mt),
               written * 4);
}
/* rope_kernel<.., true>: out (NULL: not written) = the rotation of x (sin negated: inverse), its fingerprint XORed
 * into the accumulator fp; does not wait */
static void rope_launch_fp(bf16* out, size_t ldo, const bf16* x, size_t ldx, const float* cos, const float* sin, int B, int T, int nh,
                           int hd, int style, bool inverse, unsigned long long* fp, const char* name, cudaStream_t stream) {
    rope_launch2(rope_tensor(out, ldo, x, ldx, B, T, nh, hd, fp, name), ROPE_NONE, cos, sin, T, hd, style, inverse, true, name, stream);
}
static void rope_launch(bf16* out, size_t ldo, const bf16* x, size_t ldx, const float* cos_t, const float* sin_t, int B, int T,
                        int nh, int hd, int style, bool inverse, cudaStream_t stream) {
    rope_launch2(rope_tensor(out, ldo, x, ldx, B, T, nh, hd, NULL, "rope"), ROPE_NONE, cos_t, sin_t, T, hd, style, inverse, false,
                 "rope_kernel", stream);
}
/* Q and K in one launch (the same tables and head size; each its own heads, strides, output and fingerprint), with the
 * bits of the two single launches: the forward (inverse false: qo, ko contiguous from q, k with the row strides ldq,
 * ldk: the views of the fused projection output, or contiguous) or the backward (inverse true: q, k contiguous
 * gradients into qo, ko with the row strides ldq, ldk). fpq, fpk not NULL: the fingerprinting variant (qo / ko may
 * then be NULL: not written). mt: a bound check riding on the launch (v's, in the forward; MmbTail above). ab (backward
 * only): -protect att_bwd's fused checks riding as extra blocks (attcheck.cuh's AttbFused, attcheck_fused_backward_ride). rr (forward
 * only): a second Q and K rotated in the same launch, fingerprint-only (QkFpPair: -protect qk's recomputation). */
struct QkFpPair {
    const bf16 *q, *k;   /* the views of the recomputed [N, qd + kd] output, row stride ld */
    int ld;
    unsigned long long *fpq, *fpk;
};
static void rope_qk(bf16* qo, bf16* ko, const bf16* q, const bf16* k, int ldq, int ldk, const float* cos, const float* sin, int B, int T,
                    int H, int KV, int hd, int style, bool inverse, unsigned long long* fpq, unsigned long long* fpk, cudaStream_t stream,
                    const MmbTail& mt = MMB_TAIL_NONE, const QkFpPair* rr = NULL, const AttbFused* ab = NULL) {
    const size_t lq = (size_t)H * hd, lk = (size_t)KV * hd;
    const char* name = fpq ? "rope_kernel_fp" : "rope_kernel";
    if ((fpq == NULL) != (fpk == NULL)) tsdc_fail("rope_qk: fingerprints for both Q and K or for neither");
    const RopeT tq = inverse ? rope_tensor(qo, (size_t)ldq, q, lq, B, T, H, hd, fpq, name) : rope_tensor(qo, lq, q, (size_t)ldq, B, T, H, hd, fpq, name);
    const RopeT tk = inverse ? rope_tensor(ko, (size_t)ldk, k, lk, B, T, KV, hd, fpk, name) : rope_tensor(ko, lk, k, (size_t)ldk, B, T, KV, hd, fpk, name);
    if (rr && (inverse || !rr->fpq || !rr->fpk)) tsdc_fail("rope_qk: the second pair is the forward's, with both fingerprints");
    if (rr && ab) tsdc_fail("rope_qk: the attention checks ride on the backward's launch, the second pair on the forward's");
    if (!rr) {
        rope_launch2(tq, tk, cos, sin, T, hd, style, inverse, fpq != NULL, name, stream, mt, ROPE_NONE, ROPE_NONE, ab);
        return;
    }
    const RopeT rq = rope_tensor(NULL, lq, rr->q, (size_t)rr->ld, B, T, H, hd, rr->fpq, name);
    const RopeT rk = rope_tensor(NULL, lk, rr->k, (size_t)rr->ld, B, T, KV, hd, rr->fpk, name);
    rope_launch2(tq, tk, cos, sin, T, hd, style, inverse, true, "rope_kernel_fp", stream, mt, rq, rk);
}

/* out [N, nh*hd] (contiguous) = rope(x), x with row stride ldx (nh*hd: contiguous; out may then equal x) */
static void rope_forward(bf16* out, const bf16* x, int ldx, const float* cos, const float* sin, int B, int T, int nh, int hd,
                         int style, cudaStream_t stream) {
    rope_launch(out, (size_t)nh * hd, x, (size_t)ldx, cos, sin, B, T, nh, hd, style, false, stream);
}
/* out = rope(x) (out NULL: not written) and the Q/K fingerprint of rope(x), from the same arithmetic as
 * rope_forward, XORed into the accumulator fp (fingerprint.cuh); does not wait */
static void rope_forward_fp(bf16* out, const bf16* x, int ldx, const float* cos, const float* sin, int B, int T, int nh, int hd,
                            int style, unsigned long long* fp, cudaStream_t stream) {
    rope_launch_fp(out, (size_t)nh * hd, x, (size_t)ldx, cos, sin, B, T, nh, hd, style, false, fp, "rope_kernel_fp", stream);
}
/* dx (row stride lddx) = inverse rotation of dout [N, nh*hd] (contiguous; sin -> -sin); dx may equal dout when
 * lddx = nh*hd */
static void rope_backward(bf16* dx, int lddx, const bf16* dout, const float* cos, const float* sin, int B, int T, int nh, int hd,
                          int style, cudaStream_t stream) {
    rope_launch(dx, (size_t)lddx, dout, (size_t)nh * hd, cos, sin, B, T, nh, hd, style, true, stream);
}
/* rope_backward (dx NULL: not written) with the fingerprint of dx (its logical, contiguous index) XORed into fp:
 * -protect qk_bwd's stored gradient of q_proj / k_proj and its recomputation */
static void rope_backward_fp(bf16* dx, int lddx, const bf16* dout, const float* cos, const float* sin, int B, int T, int nh, int hd,
                             int style, unsigned long long* fp, cudaStream_t stream) {
    rope_launch_fp(dx, (size_t)lddx, dout, (size_t)nh * hd, cos, sin, B, T, nh, hd, style, true, fp, "rope_kernel_fp", stream);
}

#endif
