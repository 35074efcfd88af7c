/* residual.cuh: the residual connection, out = a + b (bf16 in, fp32 add, bf16_rn out).
 *
 * Layout: flat arrays of n = N*C elements ([N, C] row-major). out may equal a or b.
 * Backward needs no kernel: the gradient passes through to both inputs unchanged.
 * CPU reference: residual_forward in llmc/cpu_kernels.h. */
#ifndef TSDC_RESIDUAL_CUH
#define TSDC_RESIDUAL_CUH

#include "cuda_common.cuh"
#include "convert.cuh"

struct AddOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};

static void residual_forward(bf16* out, const bf16* a, const bf16* b, size_t n, cudaStream_t stream) {
    ew_map2(out, a, b, n, AddOp(), stream);
}

#endif
