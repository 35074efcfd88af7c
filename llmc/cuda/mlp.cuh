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
 * Layout: flat arrays of n = N*F elements ([N, F] row-major; the kernels do not care). Outputs may
 * equal inputs (each element is read, then written, by one thread).
 * expf is CUDA's full-precision expf (max error 2 ulp; not __expf: do not build with
 * --use_fast_math). CPU reference: silu_forward, silu_backward, mul_forward, mul_backward,
 * relu2_forward, relu2_backward in llmc/cpu/cpu_kernels.h (same expressions, same operation order).
 * Accounting (ew_account, COST_ELEMENTWISE): nominal FLOPs an element (expf as 1): mul backward 2,
 * swiglu forward 5, swiglu backward 12; silu / relu2 / mul through ew_map1 / ew_map2 (convert.cuh). */
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

/* act = silu(gate) */
static void silu_forward(bf16* act, const bf16* gate, size_t n, cudaStream_t stream) {
    ew_map1(act, gate, n, SiluOp(), stream);
}
/* dgate = dact * silu'(gate) */
static void silu_backward(bf16* dgate, const bf16* dact, const bf16* gate, size_t n, cudaStream_t stream) {
    ew_map2(dgate, dact, gate, n, SiluBackwardOp(), stream);
}
/* out = a * b */
static void mul_forward(bf16* out, const bf16* a, const bf16* b, size_t n, cudaStream_t stream) {
    ew_map2(out, a, b, n, MulOp(), stream);
}

/* da = dout * b, db = dout * a (one pass over dout) */
template <int VEC>
__global__ static void mul_backward_kernel(bf16* da, bf16* db, const bf16* dout, const bf16* a, const bf16* b, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    for (size_t p = tid; p < np; p += stride) {
        bf16_pack<VEC> g = *reinterpret_cast<const bf16_pack<VEC>*>(dout + p * VEC);
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + p * VEC);
        bf16_pack<VEC> y = *reinterpret_cast<const bf16_pack<VEC>*>(b + p * VEC);
        bf16_pack<VEC> ra, rb;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float gj = __bfloat162float(g.v[j]);
            ra.v[j] = __float2bfloat16_rn(gj * __bfloat162float(y.v[j]));
            rb.v[j] = __float2bfloat16_rn(gj * __bfloat162float(x.v[j]));
        }
        *reinterpret_cast<bf16_pack<VEC>*>(da + p * VEC) = ra;
        *reinterpret_cast<bf16_pack<VEC>*>(db + p * VEC) = rb;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride) {
        float gi = __bfloat162float(dout[i]), ai = __bfloat162float(a[i]), bi = __bfloat162float(b[i]);
        da[i] = __float2bfloat16_rn(gi * bi);
        db[i] = __float2bfloat16_rn(gi * ai);
    }
}
static void mul_backward(bf16* da, bf16* db, const bf16* dout, const bf16* a, const bf16* b, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (ptr_aligned(da, 16) && ptr_aligned(db, 16) && ptr_aligned(dout, 16) && ptr_aligned(a, 16) && ptr_aligned(b, 16)) {
        mul_backward_kernel<8><<<ew_grid(n / 8 + 1), EW_BLOCK, 0, stream>>>(da, db, dout, a, b, n);
    } else {
        mul_backward_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(da, db, dout, a, b, n);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "mul_backward_kernel", ew_grid(n / 8 + 1), 2.0 * n, n * 6, n * 4);   /* dout, a, b in; da, db out */
}

/* act = silu(gate), prod = act * up (act rounded to bf16 first, as stored), one pass */
template <int VEC>
__global__ static void swiglu_forward_kernel(bf16* act, bf16* prod, const bf16* gate, const bf16* up, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    const SiluOp silu;
    for (size_t p = tid; p < np; p += stride) {
        bf16_pack<VEC> g = *reinterpret_cast<const bf16_pack<VEC>*>(gate + p * VEC);
        bf16_pack<VEC> u = *reinterpret_cast<const bf16_pack<VEC>*>(up + p * VEC);
        bf16_pack<VEC> ra, rp;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            ra.v[j] = __float2bfloat16_rn(silu(__bfloat162float(g.v[j])));
            rp.v[j] = __float2bfloat16_rn(__bfloat162float(ra.v[j]) * __bfloat162float(u.v[j]));
        }
        *reinterpret_cast<bf16_pack<VEC>*>(act + p * VEC) = ra;
        *reinterpret_cast<bf16_pack<VEC>*>(prod + p * VEC) = rp;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride) {
        const bf16 a = __float2bfloat16_rn(silu(__bfloat162float(gate[i])));
        act[i] = a;
        prod[i] = __float2bfloat16_rn(__bfloat162float(a) * __bfloat162float(up[i]));
    }
}
static void swiglu_forward(bf16* act, bf16* prod, const bf16* gate, const bf16* up, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (ptr_aligned(act, 16) && ptr_aligned(prod, 16) && ptr_aligned(gate, 16) && ptr_aligned(up, 16)) {
        swiglu_forward_kernel<8><<<ew_grid(n / 8 + 1), EW_BLOCK, 0, stream>>>(act, prod, gate, up, n);
    } else {
        swiglu_forward_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(act, prod, gate, up, n);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "swiglu_forward_kernel", ew_grid(n / 8 + 1), 5.0 * n, n * 4, n * 4);   /* gate, up in; act, prod out */
}
/* dup = dprod * act, dgate = silu'(gate) * bf16(dprod * up), one pass; dgate may equal dprod */
template <int VEC>
__global__ static void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dprod, const bf16* act, const bf16* gate, const bf16* up,
                                              size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    const SiluBackwardOp dsilu;
    for (size_t p = tid; p < np; p += stride) {
        bf16_pack<VEC> d = *reinterpret_cast<const bf16_pack<VEC>*>(dprod + p * VEC);
        bf16_pack<VEC> a = *reinterpret_cast<const bf16_pack<VEC>*>(act + p * VEC);
        bf16_pack<VEC> g = *reinterpret_cast<const bf16_pack<VEC>*>(gate + p * VEC);
        bf16_pack<VEC> u = *reinterpret_cast<const bf16_pack<VEC>*>(up + p * VEC);
        bf16_pack<VEC> rg, ru;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float dj = __bfloat162float(d.v[j]);
            const bf16 dact = __float2bfloat16_rn(dj * __bfloat162float(u.v[j]));
            ru.v[j] = __float2bfloat16_rn(dj * __bfloat162float(a.v[j]));
            rg.v[j] = __float2bfloat16_rn(dsilu(__bfloat162float(dact), __bfloat162float(g.v[j])));
        }
        *reinterpret_cast<bf16_pack<VEC>*>(dgate + p * VEC) = rg;
        *reinterpret_cast<bf16_pack<VEC>*>(dup + p * VEC) = ru;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride) {
        const float di = __bfloat162float(dprod[i]);
        const bf16 dact = __float2bfloat16_rn(di * __bfloat162float(up[i]));
        const bf16 du = __float2bfloat16_rn(di * __bfloat162float(act[i]));
        const bf16 dg = __float2bfloat16_rn(dsilu(__bfloat162float(dact), __bfloat162float(gate[i])));
        dup[i] = du;
        dgate[i] = dg;
    }
}
static void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dprod, const bf16* act, const bf16* gate, const bf16* up, size_t n,
                            cudaStream_t stream) {
    if (n == 0) return;
    if (ptr_aligned(dgate, 16) && ptr_aligned(dup, 16) && ptr_aligned(dprod, 16) && ptr_aligned(act, 16) && ptr_aligned(gate, 16) &&
        ptr_aligned(up, 16)) {
        swiglu_backward_kernel<8><<<ew_grid(n / 8 + 1), EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, n);
    } else {
        swiglu_backward_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(dgate, dup, dprod, act, gate, up, n);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "swiglu_backward_kernel", ew_grid(n / 8 + 1), 12.0 * n, n * 8, n * 4);   /* dprod, act, gate, up in; dgate, dup out */
}

/* act = relu(x)^2 */
static void relu2_forward(bf16* act, const bf16* x, size_t n, cudaStream_t stream) {
    ew_map1(act, x, n, Relu2Op(), stream);
}
/* dx = x > 0 ? dact * 2x : 0 */
static void relu2_backward(bf16* dx, const bf16* dact, const bf16* x, size_t n, cudaStream_t stream) {
    ew_map2(dx, dact, x, n, Relu2BackwardOp(), stream);
}

#endif
