/* adamw.cuh: the AdamW step (torch.optim.AdamW semantics), fused with the bf16 weight copy.
 *
 * Math, per element, in this order (fp32, as adamw_update() in train_sdc.c):
 *   g = (grad * unscale) * grad_scale         (unscale: exponent scaling's 2^-k, folded in here instead of a
 *                                              pass of its own: the same product the CPU's scale_grads
 *                                              stores, so bitwise the same; 1 without it. grad_scale: the
 *                                              clip coefficient, 1 when not clipping; grad is left unchanged)
 *   p *= decay                                (decay = 1 - lr*wd, or 1 for tensors without decay)
 *   m += (1 - b1) * (g - m)
 *   v  = v * b2 + (1 - b2) * g * g
 *   p -= step_size * (m / (sqrtf(v) / bc2_sqrt + eps))     (step_size = lr / bc1)
 *   p_bf16 = bf16_rn(p)                       (the copy the math uses, as model_prepare_weights())
 * Layout: p, grad, m, v fp32 [n]; p_bf16 bf16 [n]; n is size_t (grid-stride). float4 access when
 * every pointer is aligned, element by element otherwise; the element math is the same either way.
 * adamw_update is one launch for one tensor; the trainer updates every tensor in one launch with
 * llmc/cuda/multi_tensor.cuh's adamw_multi_tensor, which runs this file's adamw_element.
 * CPU reference: adamw_update, scale_grads and model_prepare_weights in train_sdc.c.
 * Accounting (launch_account, COST_OPTIMIZER): a nominal 16 FLOPs an element, every element read and written once. */
#ifndef TSDC_ADAMW_CUH
#define TSDC_ADAMW_CUH

#include "cuda_common.cuh"
#include "convert.cuh"

struct AdamWParams {
    float grad_scale, decay, b1, b2, eps, step_size, bc2_sqrt, unscale;
};

__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float grad, const AdamWParams& h) {
    const float g = (grad * h.unscale) * h.grad_scale;
    p *= h.decay;
    m += (1.0f - h.b1) * (g - m);
    v = v * h.b2 + (1.0f - h.b2) * g * g;
    const float denom = sqrtf(v) / h.bc2_sqrt + h.eps;
    p -= h.step_size * (m / denom);
}

template <int VEC>
__global__ static void adamw_kernel(float* p, bf16* p_bf16, const float* grad, float* m, float* v, size_t n, AdamWParams h) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    for (size_t q = tid; q < np; q += stride) {
        f32_pack<VEC> pp = *reinterpret_cast<const f32_pack<VEC>*>(p + q * VEC);
        f32_pack<VEC> gg = *reinterpret_cast<const f32_pack<VEC>*>(grad + q * VEC);
        f32_pack<VEC> mm = *reinterpret_cast<const f32_pack<VEC>*>(m + q * VEC);
        f32_pack<VEC> vv = *reinterpret_cast<const f32_pack<VEC>*>(v + q * VEC);
        bf16_pack<VEC> pb;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            adamw_element(pp.v[j], mm.v[j], vv.v[j], gg.v[j], h);
            pb.v[j] = __float2bfloat16_rn(pp.v[j]);
        }
        *reinterpret_cast<f32_pack<VEC>*>(p + q * VEC) = pp;
        *reinterpret_cast<f32_pack<VEC>*>(m + q * VEC) = mm;
        *reinterpret_cast<f32_pack<VEC>*>(v + q * VEC) = vv;
        *reinterpret_cast<bf16_pack<VEC>*>(p_bf16 + q * VEC) = pb;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride) {
        float pi = p[i], mi = m[i], vi = v[i];
        adamw_element(pi, mi, vi, grad[i], h);
        p[i] = pi; m[i] = mi; v[i] = vi;
        p_bf16[i] = __float2bfloat16_rn(pi);
    }
}

static void adamw_update(float* p, bf16* p_bf16, const float* grad, float* m, float* v, size_t n, float grad_scale,
                         float decay, float b1, float b2, float eps, float step_size, float bc2_sqrt, cudaStream_t stream) {
    if (n == 0) return;
    AdamWParams h;
    h.grad_scale = grad_scale; h.decay = decay; h.b1 = b1; h.b2 = b2; h.eps = eps;
    h.step_size = step_size; h.bc2_sqrt = bc2_sqrt; h.unscale = 1.0f;
    if (ptr_aligned(p, 16) && ptr_aligned(grad, 16) && ptr_aligned(m, 16) && ptr_aligned(v, 16) && ptr_aligned(p_bf16, 8)) {
        adamw_kernel<4><<<ew_grid(n / 4 + 1), EW_BLOCK, 0, stream>>>(p, p_bf16, grad, m, v, n, h);
    } else {
        adamw_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(p, p_bf16, grad, m, v, n, h);
    }
    cudaCheck(cudaGetLastError());
    launch_account(COST_OPTIMIZER, "adamw_kernel", COST_FP32, ew_grid(n / 4 + 1), 16.0 * n, (double)n * 16, (double)n * 14);   /* p, grad, m, v in; p, m, v, p_bf16 out */
}

#endif
