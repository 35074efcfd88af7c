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
 * Accounting (ew_account, COST_ELEMENTWISE): nominal FLOPs an element (expf as 1): mul backward 2,
 * swiglu forward 5, swiglu backward 12; silu / relu2 / mul forward as ew_map1 / ew_map2 count them (convert.cuh: 4 an
 * element), through their strided twins mlp_map1 / mlp_map2 here. */
#ifndef TSDC_MLP_CUH
#define TSDC_MLP_CUH

#include "cuda_common.cuh"
#include "convert.cuh"

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

/* out = op(a), out contiguous, a strided (SA) or contiguous */
template <int VEC, typename Op, bool SA>
__global__ static void mlp_map1_kernel(bf16* out, const bf16* a, size_t rows, size_t cols, size_t ld, Op op) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
        size_t oc, os;
        mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + (SA ? os : oc)), y;
#pragma unroll
        for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(op(__bfloat162float(x.v[j])));
        *reinterpret_cast<bf16_pack<VEC>*>(out + oc) = y;
    }
}
/* out = op(a, b), each operand strided (SO, SA, SB) or contiguous */
template <int VEC, typename Op, bool SO, bool SA, bool SB>
__global__ static void mlp_map2_kernel(bf16* out, const bf16* a, const bf16* b, size_t rows, size_t cols, size_t ld, Op op) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
        size_t oc, os;
        mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + (SA ? os : oc));
        bf16_pack<VEC> z = *reinterpret_cast<const bf16_pack<VEC>*>(b + (SB ? os : oc)), y;
#pragma unroll
        for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(op(__bfloat162float(x.v[j]), __bfloat162float(z.v[j])));
        *reinterpret_cast<bf16_pack<VEC>*>(out + (SO ? os : oc)) = y;
    }
}
template <typename Op>
static void mlp_map1(bf16* out, const bf16* a, size_t rows, size_t cols, size_t ld, Op op, cudaStream_t stream) {
    const size_t n = rows * cols;
    if (n == 0) return;
    if (mlp_vec_ok(cols, ld, out, a)) mlp_map1_kernel<8, Op, true><<<ew_grid(n / 8), EW_BLOCK, 0, stream>>>(out, a, rows, cols, ld, op);
    else mlp_map1_kernel<1, Op, true><<<ew_grid(n), EW_BLOCK, 0, stream>>>(out, a, rows, cols, ld, op);
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "mlp_map1_kernel", ew_grid(n / 8 + 1), 4.0 * n, n * 2, n * 2);   /* a in; out (ew_map1's count) */
}
template <typename Op, bool SO, bool SA, bool SB>
static void mlp_map2(bf16* out, const bf16* a, const bf16* b, size_t rows, size_t cols, size_t ld, Op op, cudaStream_t stream) {
    const size_t n = rows * cols;
    if (n == 0) return;
    if (mlp_vec_ok(cols, ld, out, a, b))
        mlp_map2_kernel<8, Op, SO, SA, SB><<<ew_grid(n / 8), EW_BLOCK, 0, stream>>>(out, a, b, rows, cols, ld, op);
    else
        mlp_map2_kernel<1, Op, SO, SA, SB><<<ew_grid(n), EW_BLOCK, 0, stream>>>(out, a, b, rows, cols, ld, op);
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "mlp_map2_kernel", ew_grid(n / 8 + 1), 4.0 * n, n * 4, n * 2);   /* a, b in; out (ew_map2's count) */
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
 * gate, up with row stride ld */
template <int VEC>
__global__ static void swiglu_forward_kernel(bf16* act, bf16* prod, const bf16* gate, const bf16* up, size_t rows, size_t cols, size_t ld) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    const SiluOp silu;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += stride) {
        size_t oc, os;
        mlp_pack_offsets<VEC>(p, cpr, ld, &oc, &os);
        bf16_pack<VEC> g = *reinterpret_cast<const bf16_pack<VEC>*>(gate + os);
        bf16_pack<VEC> u = *reinterpret_cast<const bf16_pack<VEC>*>(up + os);
        bf16_pack<VEC> ra, rp;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            ra.v[j] = __float2bfloat16_rn(silu(__bfloat162float(g.v[j])));
            rp.v[j] = __float2bfloat16_rn(__bfloat162float(ra.v[j]) * __bfloat162float(u.v[j]));
        }
        *reinterpret_cast<bf16_pack<VEC>*>(act + oc) = ra;
        *reinterpret_cast<bf16_pack<VEC>*>(prod + oc) = rp;
    }
}
static void swiglu_forward(bf16* act, bf16* prod, const bf16* gate, const bf16* up, int rows, int cols, int ld, cudaStream_t stream) {
    mlp_check_view("swiglu_forward", cols, ld);
    const size_t n = (size_t)rows * cols;
    if (n == 0) return;
    if (mlp_vec_ok(cols, ld, act, prod, gate, up)) {
        swiglu_forward_kernel<8><<<ew_grid(n / 8), EW_BLOCK, 0, stream>>>(act, prod, gate, up, rows, cols, ld);
    } else {
        swiglu_forward_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(act, prod, gate, up, rows, cols, ld);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "swiglu_forward_kernel", ew_grid(n / 8 + 1), 5.0 * n, n * 4, n * 4);   /* gate, up in; act, prod out */
}
/* dup = dprod * act, dgate = silu'(gate) * bf16(dprod * up), one pass: dprod, act contiguous; dgate, dup, gate, up
 * with row stride ld (dgate may equal dprod only when ld == cols) */
template <int VEC>
__global__ static void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dprod, const bf16* act, const bf16* gate, const bf16* up,
                                              size_t rows, size_t cols, size_t ld) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t cpr = cols / VEC, np = rows * cpr;
    const SiluBackwardOp dsilu;
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
        }
        *reinterpret_cast<bf16_pack<VEC>*>(dgate + os) = rg;
        *reinterpret_cast<bf16_pack<VEC>*>(dup + os) = ru;
    }
}
static void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dprod, const bf16* act, const bf16* gate, const bf16* up, int rows,
                            int cols, int ld, cudaStream_t stream) {
    mlp_check_view("swiglu_backward", cols, ld);
    const size_t n = (size_t)rows * cols;
    if (n == 0) return;
    if (mlp_vec_ok(cols, ld, dgate, dup, dprod, act, gate, up)) {
        swiglu_backward_kernel<8><<<ew_grid(n / 8), EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, rows, cols, ld);
    } else {
        swiglu_backward_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, rows, cols, ld);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "swiglu_backward_kernel", ew_grid(n / 8 + 1), 12.0 * n, n * 8, n * 4);   /* dprod, act, gate, up in; dgate, dup out */
}

/* act [rows, cols] = relu(x)^2, x (the fc output) with row stride ld */
static void relu2_forward(bf16* act, const bf16* x, int rows, int cols, int ld, cudaStream_t stream) {
    mlp_check_view("relu2_forward", cols, ld);
    mlp_map1(act, x, rows, cols, ld, Relu2Op(), stream);
}
/* dx (row stride ld) = x > 0 ? dact * 2x : 0, dact contiguous, x with row stride ld */
static void relu2_backward(bf16* dx, const bf16* dact, const bf16* x, int rows, int cols, int ld, cudaStream_t stream) {
    mlp_check_view("relu2_backward", cols, ld);
    mlp_map2<Relu2BackwardOp, true, false, true>(dx, dact, x, rows, cols, ld, Relu2BackwardOp(), stream);
}

#endif
