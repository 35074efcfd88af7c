/* mlp.cuh: the element-wise pieces of the MLP blocks (bf16 in, fp32 math, bf16_rn out).
 *
 *   SwiGLU:  act = silu(gate) = gate / (1 + exp(-gate));  prod = act * up
 *            dgate = dact * (s + gate * s * (1 - s)),  s = 1 / (1 + exp(-gate))
 *            mul backward: da = dout * b,  db = dout * a
 *   ReLU^2:  act = relu(x)^2;  dx = x > 0 ? dact * 2 * x : 0
 *   Fused SwiGLU (one launch each way, the same roundings as the split kernels, so the
 *   same bits): swiglu_forward writes act = bf16(silu(gate)) and prod = bf16(float(act) * up);
 *   swiglu_backward computes dact = bf16(dprod * up) in a register (rounded as the split path stores it),
 *   writes dup = bf16(dprod * act) and dgate = bf16(SiluBackwardOp(dact, gate)). The trainer uses the split
 *   kernels where a fault is injected into act (forward) or its gradient (backward), between the steps.
 *
 * Layout: [rows, cols] views (rows = N tokens, cols = F). gate and up, and their gradients dgate and dup,
 * have the row stride ld (elements between consecutive tokens): they are the two halves of the fused
 * [N, 2F] gate/up projection output (gate = gu, up = gu + F, ld = 2F) and of its gradient, which the one
 * dx GEMM and the one dW GEMM read; a ReLU^2 model's fc output is contiguous (ld = F). act, prod and
 * their gradients are always contiguous [rows, cols]. Element (r, c) is at r * ld + c (strided) or
 * r * cols + c (contiguous); its math does not depend on where it is stored, so a strided call gives the
 * bits of the contiguous one. Work is split into packs of VEC elements of one row (VEC 8: 16-byte loads
 * and stores, when cols and ld are multiples of 8 and every pointer is 16-byte aligned; else VEC 1):
 * pack p is row p / (cols/VEC), columns (p % (cols/VEC)) * VEC .. + VEC-1, grid-stride over the packs.
 * An output may equal an input of the same layout (each element is read, then written, by one thread).
 * expf is CUDA's full-precision expf (max error 2 ulp; not __expf: do not build with
 * --use_fast_math). CPU reference: silu_forward, silu_backward, mul_forward, mul_backward,
 * relu2_forward, relu2_backward in llmc/cpu/cpu_kernels.h (same expressions, same operation order).
 * -protect ew (llmc/sdc/ewdup.cuh): swiglu_forward, swiglu_backward, relu2_forward and relu2_backward take an EwDup;
 * with flags, a variant (template DUP) computes every output twice, the second copy from the loaded values through
 * dup_opaque, compares the bit patterns and sets the output's flag on a difference; it stores the same bits.
 * Accounting (ew_account, COST_ELEMENTWISE): nominal FLOPs an element (expf as 1): mul backward 2,
 * swiglu forward 5, swiglu backward 12; silu / relu2 / mul forward as ew_map1 / ew_map2 count them (convert.cuh: 4 an
 * element), through their strided twins mlp_map1 / mlp_map2 here; the duplicated variants twice that, plus one
 * comparison an output element (the same bytes). */
#ifndef TSDC_MLP_CUH
#define TSDC_MLP_CUH

#include "cuda_common.cuh"
#include "convert.cuh"
#include "../sdc/ewdup.cuh"
#include "../sdc/bound.h"

struct SiluOp {
    __device__ float operator()(float x) const { return x / (1.0f + expf(-x)); }
};
struct SiluBackwardOp { /* (dact, gate) */
    __device__ float operator()(float dact, float x) const {
        float s = 1.0f / (1.0f + expf(-x));
        return dact * (s + x * s * (1.0f - s));
    }
};
struct MulOp {
    __device__ float operator()(float a, float b) const { return a * b; }
};
struct Relu2Op {
    __device__ float operator()(float x) const { float r = x > 0.0f ? x : 0.0f; return r * r; }
};
struct Relu2BackwardOp { /* (dact, x) */
    __device__ float operator()(float dact, float x) const { return x > 0.0f ? dact * 2.0f * x : 0.0f; }
};

/* the offsets of pack p of a [rows, cols] view: *c contiguous (p * VEC), *s with row stride ld */
template <int VEC>
__device__ __forceinline__ void mlp_pack_offsets(size_t p, size_t cpr, size_t ld, size_t* c, size_t* s) {
    const size_t r = p / cpr;
    const size_t col = (p - r * cpr) * VEC;
    *c = p * VEC;
    *s = r * ld + col;
}
/* 16-byte packs when cols and ld are multiples of 8 and every pointer given is 16-byte aligned */
static inline bool mlp_vec_ok(size_t cols, size_t ld, const void* p0, const void* p1, const void* p2 = NULL, const void* p3 = NULL,
                              const void* p4 = NULL, const void* p5 = NULL) {
    return cols % 8 == 0 && ld % 8 == 0 && ptr_aligned(p0, 16) && ptr_aligned(p1, 16) && (!p2 || ptr_aligned(p2, 16)) &&
           (!p3 || ptr_aligned(p3, 16)) && (!p4 || ptr_aligned(p4, 16)) && (!p5 || ptr_aligned(p5, 16));
}
static inline void mlp_check_view(const char* who, size_t cols, size_t ld) {
    if (ld < cols) tsdc_fail("%s: row stride %zu below the %zu columns", who, ld, cols);
}

/* out = op(a), out contiguous, a strided (SA) or contiguous; DUP: op computed twice, compared (ewdup.cuh: output 0) */
template <int VEC, typename Op, bool SA, bool DUP>
__global__ static void mlp_map1_kernel(bf16* out, const bf16* a, size_t rows, size_t cols, size_t ld, Op op, EwDup dup) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    bool bad = false;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
        size_t oc, os;
        mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + (SA ? os : oc)), y;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            y.v[j] = __float2bfloat16_rn(op(__bfloat162float(x.v[j])));
            if (DUP) {
                y.v[j] = ewdup_plant(dup, 0, oc + j, y.v[j]);
                bad |= ewdup_differs(y.v[j], __float2bfloat16_rn(op(dup_opaque(__bfloat162float(x.v[j])))));
            }
        }
        *reinterpret_cast<bf16_pack<VEC>*>(out + oc) = y;
    }
    if (DUP) ewdup_flag(dup, bad, false);
}
/* out = op(a, b), each operand strided (SO, SA, SB) or contiguous; DUP: as mlp_map1_kernel (the logical index of out
 * is the contiguous one, row * cols + col) */
template <int VEC, typename Op, bool SO, bool SA, bool SB, bool DUP>
__global__ static void mlp_map2_kernel(bf16* out, const bf16* a, const bf16* b, size_t rows, size_t cols, size_t ld, Op op, EwDup dup) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    bool bad = false;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
        size_t oc, os;
        mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + (SA ? os : oc));
        bf16_pack<VEC> z = *reinterpret_cast<const bf16_pack<VEC>*>(b + (SB ? os : oc)), y;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            y.v[j] = __float2bfloat16_rn(op(__bfloat162float(x.v[j]), __bfloat162float(z.v[j])));
            if (DUP) {
                y.v[j] = ewdup_plant(dup, 0, oc + j, y.v[j]);
                bad |= ewdup_differs(y.v[j], __float2bfloat16_rn(op(dup_opaque(__bfloat162float(x.v[j])), dup_opaque(__bfloat162float(z.v[j])))));
            }
        }
        *reinterpret_cast<bf16_pack<VEC>*>(out + (SO ? os : oc)) = y;
    }
    if (DUP) ewdup_flag(dup, bad, false);
}
template <typename Op>
static void mlp_map1(bf16* out, const bf16* a, size_t rows, size_t cols, size_t ld, Op op, cudaStream_t stream, EwDup dup = ew_dup_none()) {
    const size_t n = rows * cols;
    if (n == 0) return;
    const bool vec = mlp_vec_ok(cols, ld, out, a), d = ew_dup_on(dup);
    const int g = vec ? ew_grid(n / 8) : ew_grid(n);
    if (vec && d) mlp_map1_kernel<8, Op, true, true><<<g, EW_BLOCK, 0, stream>>>(out, a, rows, cols, ld, op, dup);
    else if (vec) mlp_map1_kernel<8, Op, true, false><<<g, EW_BLOCK, 0, stream>>>(out, a, rows, cols, ld, op, dup);
    else if (d) mlp_map1_kernel<1, Op, true, true><<<g, EW_BLOCK, 0, stream>>>(out, a, rows, cols, ld, op, dup);
    else mlp_map1_kernel<1, Op, true, false><<<g, EW_BLOCK, 0, stream>>>(out, a, rows, cols, ld, op, dup);
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, d ? "mlp_map1_kernel_dup" : "mlp_map1_kernel", ew_grid(n / 8 + 1), (d ? 9.0 : 4.0) * n, n * 2, n * 2);   /* a in; out (ew_map1's count) */
}
template <typename Op, bool SO, bool SA, bool SB>
static void mlp_map2(bf16* out, const bf16* a, const bf16* b, size_t rows, size_t cols, size_t ld, Op op, cudaStream_t stream,
                     EwDup dup = ew_dup_none()) {
    const size_t n = rows * cols;
    if (n == 0) return;
    const bool vec = mlp_vec_ok(cols, ld, out, a, b), d = ew_dup_on(dup);
    const int g = vec ? ew_grid(n / 8) : ew_grid(n);
    if (vec && d) mlp_map2_kernel<8, Op, SO, SA, SB, true><<<g, EW_BLOCK, 0, stream>>>(out, a, b, rows, cols, ld, op, dup);
    else if (vec) mlp_map2_kernel<8, Op, SO, SA, SB, false><<<g, EW_BLOCK, 0, stream>>>(out, a, b, rows, cols, ld, op, dup);
    else if (d) mlp_map2_kernel<1, Op, SO, SA, SB, true><<<g, EW_BLOCK, 0, stream>>>(out, a, b, rows, cols, ld, op, dup);
    else mlp_map2_kernel<1, Op, SO, SA, SB, false><<<g, EW_BLOCK, 0, stream>>>(out, a, b, rows, cols, ld, op, dup);
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, d ? "mlp_map2_kernel_dup" : "mlp_map2_kernel", ew_grid(n / 8 + 1), (d ? 9.0 : 4.0) * n, n * 4, n * 2);   /* a, b in; out (ew_map2's count) */
}

/* act [rows, cols] = silu(gate), gate with row stride ld */
static void silu_forward(bf16* act, const bf16* gate, int rows, int cols, int ld, cudaStream_t stream) {
    mlp_check_view("silu_forward", cols, ld);
    mlp_map1(act, gate, rows, cols, ld, SiluOp(), stream);
}
/* dgate (row stride ld) = dact * silu'(gate), dact contiguous, gate with row stride ld */
static void silu_backward(bf16* dgate, const bf16* dact, const bf16* gate, int rows, int cols, int ld, cudaStream_t stream) {
    mlp_check_view("silu_backward", cols, ld);
    mlp_map2<SiluBackwardOp, true, false, true>(dgate, dact, gate, rows, cols, ld, SiluBackwardOp(), stream);
}
/* out = a * b: out, a contiguous, b (up) with row stride ld */
static void mul_forward(bf16* out, const bf16* a, const bf16* b, int rows, int cols, int ld, cudaStream_t stream) {
    mlp_check_view("mul_forward", cols, ld);
    mlp_map2<MulOp, false, false, true>(out, a, b, rows, cols, ld, MulOp(), stream);
}

/* da = dout * b, db = dout * a (one pass over dout): da, dout, a contiguous; db, b (dup, up) with row stride ld */
template <int VEC>
__global__ static void mul_backward_kernel(bf16* da, bf16* db, const bf16* dout, const bf16* a, const bf16* b, size_t rows, size_t cols,
                                           size_t ld) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
        size_t oc, os;
        mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
        bf16_pack<VEC> g = *reinterpret_cast<const bf16_pack<VEC>*>(dout + oc);
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + oc);
        bf16_pack<VEC> y = *reinterpret_cast<const bf16_pack<VEC>*>(b + os);
        bf16_pack<VEC> ra, rb;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float gj = __bfloat162float(g.v[j]);
            ra.v[j] = __float2bfloat16_rn(gj * __bfloat162float(y.v[j]));
            rb.v[j] = __float2bfloat16_rn(gj * __bfloat162float(x.v[j]));
        }
        *reinterpret_cast<bf16_pack<VEC>*>(da + oc) = ra;
        *reinterpret_cast<bf16_pack<VEC>*>(db + os) = rb;
    }
}
static void mul_backward(bf16* da, bf16* db, const bf16* dout, const bf16* a, const bf16* b, int rows, int cols, int ld,
                         cudaStream_t stream) {
    mlp_check_view("mul_backward", cols, ld);
    const size_t n = (size_t)rows * cols;
    if (n == 0) return;
    if (mlp_vec_ok(cols, ld, da, db, dout, a, b)) {
        mul_backward_kernel<8><<<ew_grid(n / 8), EW_BLOCK, 0, stream>>>(da, db, dout, a, b, rows, cols, ld);
    } else {
        mul_backward_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(da, db, dout, a, b, rows, cols, ld);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "mul_backward_kernel", ew_grid(n / 8 + 1), 2.0 * n, n * 6, n * 4);   /* dout, a, b in; da, db out */
}

/* act = silu(gate), prod = act * up (act rounded to bf16 first, as stored), one pass; act, prod contiguous,
 * gate, up with row stride ld. DUP (ewdup.cuh): both computed twice and compared, output 0 act, 1 prod (prod's
 * duplicate from act as stored, as ew's recomputation reads it: a wrong act sets act's flag alone) */
/* one pack of VEC elements of swiglu_forward (oc: contiguous offset of act and prod, os: of gate and up, c0: its
 * column); returns the sum of the squares of the stored prod values in double (BND: the down projection's input row
 * norms) */
template <int VEC, bool DUP, bool BND>
__device__ __forceinline__ double swiglu_forward_pack(bf16* act, bf16* prod, const bf16* gate, const bf16* up, size_t oc, size_t os,
                                                      size_t c0, float xr, const EwDup& dup, const MmbFused& mb, bool* bad0, bool* bad1,
                                                      bool* bg, bool* bu) {
    const SiluOp silu;
    bf16_pack<VEC> g = *reinterpret_cast<const bf16_pack<VEC>*>(gate + os);
    bf16_pack<VEC> u = *reinterpret_cast<const bf16_pack<VEC>*>(up + os);
    if (BND) {   /* -protect bound on the gate and up outputs as read here (llmc/sdc/bound.h) */
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            *bg |= mmb_violates(__bfloat162float(g.v[j]), xr, mb.wn0[c0 + j], mb.c);
            *bu |= mmb_violates(__bfloat162float(u.v[j]), xr, mb.wn1[c0 + j], mb.c);
        }
    }
    bf16_pack<VEC> ra, rp;
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        ra.v[j] = __float2bfloat16_rn(silu(__bfloat162float(g.v[j])));
        if (DUP) {
            ra.v[j] = ewdup_plant(dup, 0, oc + j, ra.v[j]);
            *bad0 |= ewdup_differs(ra.v[j], __float2bfloat16_rn(silu(dup_opaque(__bfloat162float(g.v[j])))));
        }
        rp.v[j] = __float2bfloat16_rn(__bfloat162float(ra.v[j]) * __bfloat162float(u.v[j]));
        if (DUP) {
            const bf16 p2 = __float2bfloat16_rn(dup_opaque(__bfloat162float(ra.v[j])) * dup_opaque(__bfloat162float(u.v[j])));
            rp.v[j] = ewdup_plant(dup, 1, oc + j, rp.v[j]);
            *bad1 |= ewdup_differs(rp.v[j], p2);
        }
        if (BND) {
            const double v = (double)__bfloat162float(rp.v[j]);
            ss += v * v;
        }
    }
    *reinterpret_cast<bf16_pack<VEC>*>(act + oc) = ra;
    *reinterpret_cast<bf16_pack<VEC>*>(prod + oc) = rp;
    return ss;
}
/* BND: one block a row (grid-stride over the rows), the row's packs over the threads, so that the block also reduces
 * the row's sum of squares of prod: each thread its packs in order, the warps' xor butterflies, the warps in order
 * (the same bits on any grid), mb.xo[row] = mmb_norm of it. Without BND: packs grid-stride over all rows. */
template <int VEC, bool DUP, bool BND>
__global__ static void swiglu_forward_kernel(bf16* act, bf16* prod, const bf16* gate, const bf16* up, size_t rows, size_t cols, size_t ld,
                                             EwDup dup, MmbFused mb) {
    const size_t cpr = cols / VEC;
    bool bad0 = false, bad1 = false, bg = false, bu = false;
    if (BND) {
        __shared__ double red[32];
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
            const float xr = mb.xn[r];
            double ss = 0.0;
            for (size_t k = threadIdx.x; k < cpr; k += blockDim.x)
                ss += swiglu_forward_pack<VEC, DUP, true>(act, prod, gate, up, r * cols + k * VEC, r * ld + k * VEC, k * VEC, xr, dup, mb, &bad0,
                                                          &bad1, &bg, &bu);
            for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
            if (lane == 0) red[warp] = ss;
            __syncthreads();
            if (threadIdx.x == 0 && mb.xo) {
                double t = 0.0;
                for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += red[w];
                mb.xo[r] = mmb_norm(t);
            }
            __syncthreads();
        }
        if (bg) atomicOr(mb.f0, 1);
        if (bu) atomicOr(mb.f1, 1);
    } else {
        const size_t stride = (size_t)gridDim.x * blockDim.x, np = rows * cpr;
        for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
            size_t oc, os;
            mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
            swiglu_forward_pack<VEC, DUP, false>(act, prod, gate, up, oc, os, 0, 0.0f, dup, mb, &bad0, &bad1, &bg, &bu);
        }
    }
    if (DUP) ewdup_flag(dup, bad0, bad1);
}
template <int VEC, bool DUP>
static void swiglu_forward_launch(int g, bf16* act, bf16* prod, const bf16* gate, const bf16* up, size_t rows, size_t cols, size_t ld,
                                  EwDup dup, const MmbFused* mb, cudaStream_t stream) {
    const MmbFused none = {NULL, NULL, NULL, 0.0f, NULL, NULL, NULL, NULL, 0};
    const int gr = rows < (size_t)EW_MAX_GRID ? (int)rows : EW_MAX_GRID;   /* one block a row */
    if (mb) swiglu_forward_kernel<VEC, DUP, true><<<gr, EW_BLOCK, 0, stream>>>(act, prod, gate, up, rows, cols, ld, dup, *mb);
    else swiglu_forward_kernel<VEC, DUP, false><<<g, EW_BLOCK, 0, stream>>>(act, prod, gate, up, rows, cols, ld, dup, none);
}
/* mb (not NULL): -protect bound's check of gate and up fused in (llmc/sdc/bound.h MmbFused: the check of mmb_check,
 * the same comparison on the same values, flags f0 gate, f1 up), and prod's row norms into mb->xo (not NULL: the
 * down projection's input norms for its check, fused into the next residual add and norm) */
static void swiglu_forward(bf16* act, bf16* prod, const bf16* gate, const bf16* up, int rows, int cols, int ld, cudaStream_t stream,
                           EwDup dup = ew_dup_none(), const MmbFused* mb = NULL) {
    mlp_check_view("swiglu_forward", cols, ld);
    const size_t n = (size_t)rows * cols;
    if (n == 0) return;
    const bool vec = mlp_vec_ok(cols, ld, act, prod, gate, up), d = ew_dup_on(dup);
    const int g = vec ? ew_grid(n / 8) : ew_grid(n);
    if (vec && d) swiglu_forward_launch<8, true>(g, act, prod, gate, up, rows, cols, ld, dup, mb, stream);
    else if (vec) swiglu_forward_launch<8, false>(g, act, prod, gate, up, rows, cols, ld, dup, mb, stream);
    else if (d) swiglu_forward_launch<1, true>(g, act, prod, gate, up, rows, cols, ld, dup, mb, stream);
    else swiglu_forward_launch<1, false>(g, act, prod, gate, up, rows, cols, ld, dup, mb, stream);
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, d ? "swiglu_forward_kernel_dup" : "swiglu_forward_kernel",
               mb ? ((size_t)rows < (size_t)EW_MAX_GRID ? (unsigned)rows : (unsigned)EW_MAX_GRID) : (unsigned)ew_grid(n / 8 + 1),
               (d ? 12.0 : 5.0) * n + (mb ? 8.0 * n : 0.0), n * 4 + (mb ? (size_t)rows * 4 + (size_t)cols * 8 : 0),
               n * 4 + (mb && mb->xo ? (size_t)rows * 4 : 0));   /* gate, up (xn, wn) in; act, prod (prod's norms) out */
}
/* dup = dprod * act, dgate = silu'(gate) * bf16(dprod * up), one pass: dprod, act contiguous; dgate, dup, gate, up
 * with row stride ld (dgate may equal dprod only when ld == cols). DUP (ewdup.cuh): both computed twice and
 * compared, output 0 dup, 1 dgate (ew's slots EWB_UP_PROJ, EWB_GATE_PROJ) */
template <int VEC, bool DUP>
__global__ static void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dprod, const bf16* act, const bf16* gate, const bf16* up,
                                              size_t rows, size_t cols, size_t ld, EwDup dd) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    const SiluBackwardOp dsilu;
    bool bad0 = false, bad1 = false;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
        size_t oc, os;
        mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
        bf16_pack<VEC> d = *reinterpret_cast<const bf16_pack<VEC>*>(dprod + oc);
        bf16_pack<VEC> a = *reinterpret_cast<const bf16_pack<VEC>*>(act + oc);
        bf16_pack<VEC> g = *reinterpret_cast<const bf16_pack<VEC>*>(gate + os);
        bf16_pack<VEC> u = *reinterpret_cast<const bf16_pack<VEC>*>(up + os);
        bf16_pack<VEC> rg, ru;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float dj = __bfloat162float(d.v[j]);
            const bf16 dact = __float2bfloat16_rn(dj * __bfloat162float(u.v[j]));
            ru.v[j] = __float2bfloat16_rn(dj * __bfloat162float(a.v[j]));
            rg.v[j] = __float2bfloat16_rn(dsilu(__bfloat162float(dact), __bfloat162float(g.v[j])));
            if (DUP) {
                const float d2 = dup_opaque(dj);
                const bf16 dact2 = __float2bfloat16_rn(d2 * dup_opaque(__bfloat162float(u.v[j])));
                const bf16 u2 = __float2bfloat16_rn(d2 * dup_opaque(__bfloat162float(a.v[j])));
                const bf16 g2 = __float2bfloat16_rn(dsilu(__bfloat162float(dact2), dup_opaque(__bfloat162float(g.v[j]))));
                ru.v[j] = ewdup_plant(dd, 0, oc + j, ru.v[j]);
                rg.v[j] = ewdup_plant(dd, 1, oc + j, rg.v[j]);
                bad0 |= ewdup_differs(ru.v[j], u2);
                bad1 |= ewdup_differs(rg.v[j], g2);
            }
        }
        *reinterpret_cast<bf16_pack<VEC>*>(dgate + os) = rg;
        *reinterpret_cast<bf16_pack<VEC>*>(dup + os) = ru;
    }
    if (DUP) ewdup_flag(dd, bad0, bad1);
}
static void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dprod, const bf16* act, const bf16* gate, const bf16* up, int rows,
                            int cols, int ld, cudaStream_t stream, EwDup dd = ew_dup_none()) {
    mlp_check_view("swiglu_backward", cols, ld);
    const size_t n = (size_t)rows * cols;
    if (n == 0) return;
    const bool vec = mlp_vec_ok(cols, ld, dgate, dup, dprod, act, gate, up), d = ew_dup_on(dd);
    const int g = vec ? ew_grid(n / 8) : ew_grid(n);
    if (vec && d) swiglu_backward_kernel<8, true><<<g, EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, rows, cols, ld, dd);
    else if (vec) swiglu_backward_kernel<8, false><<<g, EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, rows, cols, ld, dd);
    else if (d) swiglu_backward_kernel<1, true><<<g, EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, rows, cols, ld, dd);
    else swiglu_backward_kernel<1, false><<<g, EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, rows, cols, ld, dd);
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, d ? "swiglu_backward_kernel_dup" : "swiglu_backward_kernel", ew_grid(n / 8 + 1), (d ? 26.0 : 12.0) * n, n * 8, n * 4);   /* dprod, act, gate, up in; dgate, dup out */
}

/* act [rows, cols] = relu(x)^2, x (the fc output) with row stride ld */
static void relu2_forward(bf16* act, const bf16* x, int rows, int cols, int ld, cudaStream_t stream, EwDup dup = ew_dup_none()) {
    mlp_check_view("relu2_forward", cols, ld);
    mlp_map1(act, x, rows, cols, ld, Relu2Op(), stream, dup);
}
/* dx (row stride ld) = x > 0 ? dact * 2x : 0, dact contiguous, x with row stride ld */
static void relu2_backward(bf16* dx, const bf16* dact, const bf16* x, int rows, int cols, int ld, cudaStream_t stream,
                           EwDup dup = ew_dup_none()) {
    mlp_check_view("relu2_backward", cols, ld);
    mlp_map2<Relu2BackwardOp, true, false, true>(dx, dact, x, rows, cols, ld, Relu2BackwardOp(), stream, dup);
}

#endif
