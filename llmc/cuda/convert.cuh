/* convert.cuh: fp32 <-> bf16 conversion, and the packed bf16 access the element-wise files share.
 *
 * Math:   f32_to_bf16: out[i] = bf16_rn(in[i])   (round to nearest even, NaN kept, as bf16_round()
 *                      in llmc/cpu/bf16.h and the CPU trainer's BF16_STORE)
 *         bf16_to_f32: out[i] = (float)in[i]     (exact)
 * Layout: flat arrays of n elements (size_t n; grid-stride loops, so n may exceed 2^31).
 * CPU reference: bf16_round / bf16_round_array in llmc/bf16.h.
 *
 * Packed access (used by mlp.cuh, residual.cuh, classifier.cuh, rmsnorm.cuh, embedding.cuh, rope.cuh):
 * bf16_pack<N> is N bf16 in one aligned 2N-byte word, so bf16_pack<8> is one 16-byte load/store.
 * The vector path is taken only when every pointer is 16-byte aligned; otherwise the same kernel
 * runs with packs of 1. Element-wise results do not depend on the path: each element's math is the
 * same expression in fp32, rounded once when stored. ew_map1 / ew_map2 apply an fp32 functor
 * element-wise to one or two bf16 inputs (out may equal an input: each element is read and written
 * by the same thread).
 * Accounting (cuda_common.cuh ew_account, COST_ELEMENTWISE): the bytes above; grid: the vector path's;
 * FLOPs: 0 for the conversions, a nominal 4 an element for ew_map1 / ew_map2 (the functors are a
 * few operations; these kernels are bound by their bytes). */
#ifndef TSDC_CONVERT_CUH
#define TSDC_CONVERT_CUH

#include <stdint.h>
#include "cuda_common.cuh"

template <int N> struct alignas(2 * N) bf16_pack { bf16 v[N]; };
template <int N> struct alignas(4 * N) f32_pack { float v[N]; };

static inline bool ptr_aligned(const void* p, size_t bytes) { return ((uintptr_t)p % bytes) == 0; }

#define EW_BLOCK 256
#define EW_MAX_GRID 65536 /* grid-stride beyond this: 16.7M threads cover any n */

/* blocks for `work` items of one thread each (at least 1, at most EW_MAX_GRID) */
static inline int ew_grid(size_t work) {
    size_t b = CEIL_DIV(work, (size_t)EW_BLOCK);
    if (b < 1) b = 1;
    if (b > EW_MAX_GRID) b = EW_MAX_GRID;
    return (int)b;
}

/* the first cnt (<= 8) elements at p as floats, the rest `fill`; one 16-byte load when vec && cnt == 8
 * (vec promises p is 16-byte aligned) */
__device__ __forceinline__ void load8_f32(float f[8], const bf16* p, int cnt, bool vec, float fill) {
    if (vec && cnt == 8) {
        bf16_pack<8> k = *reinterpret_cast<const bf16_pack<8>*>(p);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = __bfloat162float(k.v[j]);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = j < cnt ? __bfloat162float(p[j]) : fill;
    }
}
/* stores bf16_rn(f[0..cnt)) at p; one 16-byte store when vec && cnt == 8 */
__device__ __forceinline__ void store8_bf16(bf16* p, const float f[8], int cnt, bool vec) {
    if (vec && cnt == 8) {
        bf16_pack<8> k;
#pragma unroll
        for (int j = 0; j < 8; j++) k.v[j] = __float2bfloat16_rn(f[j]);
        *reinterpret_cast<bf16_pack<8>*>(p) = k;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < cnt) p[j] = __float2bfloat16_rn(f[j]);
    }
}

/* ------------------------------------------------------------------ generic element-wise maps */
/* out[i] = bf16_rn(op(a[i])) */
template <int VEC, typename Op>
__global__ static void ew_map1_kernel(bf16* out, const bf16* a, size_t n, Op op) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    for (size_t p = tid; p < np; p += stride) {
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + p * VEC), y;
#pragma unroll
        for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(op(__bfloat162float(x.v[j])));
        *reinterpret_cast<bf16_pack<VEC>*>(out + p * VEC) = y;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride) out[i] = __float2bfloat16_rn(op(__bfloat162float(a[i])));
}
/* out[i] = bf16_rn(op(a[i], b[i])) */
template <int VEC, typename Op>
__global__ static void ew_map2_kernel(bf16* out, const bf16* a, const bf16* b, size_t n, Op op) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    for (size_t p = tid; p < np; p += stride) {
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(a + p * VEC);
        bf16_pack<VEC> z = *reinterpret_cast<const bf16_pack<VEC>*>(b + p * VEC), y;
#pragma unroll
        for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(op(__bfloat162float(x.v[j]), __bfloat162float(z.v[j])));
        *reinterpret_cast<bf16_pack<VEC>*>(out + p * VEC) = y;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride)
        out[i] = __float2bfloat16_rn(op(__bfloat162float(a[i]), __bfloat162float(b[i])));
}

template <typename Op>
static void ew_map1(bf16* out, const bf16* a, size_t n, Op op, cudaStream_t stream) {
    if (n == 0) return;
    if (ptr_aligned(out, 16) && ptr_aligned(a, 16)) {
        ew_map1_kernel<8, Op><<<ew_grid(n / 8 + 1), EW_BLOCK, 0, stream>>>(out, a, n, op);
    } else {
        ew_map1_kernel<1, Op><<<ew_grid(n), EW_BLOCK, 0, stream>>>(out, a, n, op);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "ew_map1_kernel", ew_grid(n / 8 + 1), 4.0 * n, n * 2, n * 2);   /* a in; out */
}
template <typename Op>
static void ew_map2(bf16* out, const bf16* a, const bf16* b, size_t n, Op op, cudaStream_t stream) {
    if (n == 0) return;
    if (ptr_aligned(out, 16) && ptr_aligned(a, 16) && ptr_aligned(b, 16)) {
        ew_map2_kernel<8, Op><<<ew_grid(n / 8 + 1), EW_BLOCK, 0, stream>>>(out, a, b, n, op);
    } else {
        ew_map2_kernel<1, Op><<<ew_grid(n), EW_BLOCK, 0, stream>>>(out, a, b, n, op);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "ew_map2_kernel", ew_grid(n / 8 + 1), 4.0 * n, n * 4, n * 2);   /* a, b in; out */
}

/* ------------------------------------------------------------------------------ conversions */
template <int VEC>
__global__ static void f32_to_bf16_kernel(bf16* out, const float* in, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    for (size_t p = tid; p < np; p += stride) {
        f32_pack<VEC> x = *reinterpret_cast<const f32_pack<VEC>*>(in + p * VEC);
        bf16_pack<VEC> y;
#pragma unroll
        for (int j = 0; j < VEC; j++) y.v[j] = __float2bfloat16_rn(x.v[j]);
        *reinterpret_cast<bf16_pack<VEC>*>(out + p * VEC) = y;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride) out[i] = __float2bfloat16_rn(in[i]);
}
template <int VEC>
__global__ static void bf16_to_f32_kernel(float* out, const bf16* in, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t np = n / VEC;
    for (size_t p = tid; p < np; p += stride) {
        bf16_pack<VEC> x = *reinterpret_cast<const bf16_pack<VEC>*>(in + p * VEC);
        f32_pack<VEC> y;
#pragma unroll
        for (int j = 0; j < VEC; j++) y.v[j] = __bfloat162float(x.v[j]);
        *reinterpret_cast<f32_pack<VEC>*>(out + p * VEC) = y;
    }
    for (size_t i = np * VEC + tid; i < n; i += stride) out[i] = __bfloat162float(in[i]);
}

/* out[n] (bf16) = round-to-nearest-even of in[n] (fp32) */
static void f32_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (ptr_aligned(out, 8) && ptr_aligned(in, 16)) {   /* 4 floats (16 B) -> 4 bf16 (8 B) */
        f32_to_bf16_kernel<4><<<ew_grid(n / 4 + 1), EW_BLOCK, 0, stream>>>(out, in, n);
    } else {
        f32_to_bf16_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(out, in, n);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "f32_to_bf16_kernel", ew_grid(n / 4 + 1), 0.0, n * 4, n * 2);
}
/* out[n] (fp32) = in[n] (bf16), exact */
static void bf16_to_f32(float* out, const bf16* in, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (ptr_aligned(out, 16) && ptr_aligned(in, 8)) {
        bf16_to_f32_kernel<4><<<ew_grid(n / 4 + 1), EW_BLOCK, 0, stream>>>(out, in, n);
    } else {
        bf16_to_f32_kernel<1><<<ew_grid(n), EW_BLOCK, 0, stream>>>(out, in, n);
    }
    cudaCheck(cudaGetLastError());
    ew_account(COST_ELEMENTWISE, "bf16_to_f32_kernel", ew_grid(n / 4 + 1), 0.0, n * 2, n * 4);
}

#endif
