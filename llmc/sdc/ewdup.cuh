/* ewdup.cuh: -protect ew inside the element-wise kernels: every output computed twice and compared before it is
 * stored (duplicated computation, as SWIFT's software fault tolerance does it: the loaded values feed both copies,
 * memory and caches being ECC-protected; the arithmetic is what a transient fault hits).
 *
 * The checked kernels (RMSNorm forward, the residual add fused with it, the SwiGLU and ReLU^2 forward and backward,
 * RMSNorm's backward where it accumulates the residual gradient) take an EwDup: with flags, a template variant
 * computes every output a second time from the same loaded values passed through dup_opaque (llmc/cuda/ptx.cuh: an
 * asm the compiler cannot see through, so the copy is neither merged with the primary nor folded away) with the
 * same expression, compares the two bf16 bit patterns (fp32 for a norm's mean square), and sets the output's flag
 * (atomicOr, integer) on any difference. The primary is what the kernel stores; the flags are ew's slots in the
 * trainer's report (llmc/sdc/ewcheck.cuh: EWF_*, EWB_*), the same slots ew's recomputation kernels set.
 *
 * What this replaces, and the emulation. ew used to rerun each checked kernel from its stored inputs after the
 * injection point and compare with the stored output (ewcheck.cuh), reading every input and output of the
 * element-wise MLP once more: about 10% of a llama3.2-1b step (cost model). A fault the injector writes into an
 * output after its kernel stands for an error inside that kernel's arithmetic, which the duplicate would have seen
 * (it computed the value again, correctly); the injector does not act inside kernels, so where (and only where) it
 * wrote into a checked output, the trainer runs the recomputation check of ewcheck.cuh for that output, whose
 * verdict is the duplicate's. A clean step runs the duplicated kernels alone: no extra launch, no extra memory
 * traffic, about twice the arithmetic of kernels bound by their bytes. test_sdc.cu's ew_dup test holds the
 * duplicated kernels to the plain ones bit for bit and plants a changed value in the primary copy (the plant below)
 * to show each flag set and only it.
 *
 * Plant (test-only; plant < 0 in every trainer launch): the primary value of output plant_out (0 or 1, the order of
 * the kernel's outputs) at logical element index plant (row * cols + col of the kernel's [rows, cols] output) has
 * the bits plant_xor flipped just before the comparison and the store, as a fault in its arithmetic would. */
#ifndef TSDC_EWDUP_CUH
#define TSDC_EWDUP_CUH

#include <stdint.h>
#include "../cuda/cuda_common.cuh"
#include "../cuda/ptx.cuh"

struct EwDup {
    int* f0;             /* the first output's flag (NULL: not checked) */
    int* f1;             /* the second output's (NULL: none or not checked) */
    long long plant;     /* test-only: see the header; -1 none */
    int plant_out;
    unsigned plant_xor;
};
static inline EwDup ew_dup_none(void) {
    EwDup d = {NULL, NULL, -1, 0, 0u};
    return d;
}
static inline EwDup ew_dup(int* f0, int* f1) {
    EwDup d = {f0, f1, -1, 0, 0u};
    return d;
}
static inline bool ew_dup_on(const EwDup& d) { return d.f0 || d.f1; }

/* the primary value v of output `out` at logical index i, with the plant applied */
__device__ __forceinline__ bf16 ewdup_plant(const EwDup& d, int out, size_t i, bf16 v) {
    if (d.plant >= 0 && (size_t)d.plant == i && d.plant_out == out)
        return __ushort_as_bfloat16((unsigned short)(__bfloat16_as_ushort(v) ^ (unsigned short)d.plant_xor));
    return v;
}
__device__ __forceinline__ float ewdup_plant_f32(const EwDup& d, int out, size_t i, float v) {
    if (d.plant >= 0 && (size_t)d.plant == i && d.plant_out == out) return __uint_as_float(__float_as_uint(v) ^ d.plant_xor);
    return v;
}
__device__ __forceinline__ bool ewdup_differs(bf16 a, bf16 b) { return __bfloat16_as_ushort(a) != __bfloat16_as_ushort(b); }
/* a thread's verdicts into the flags (atomicOr only on a difference: nothing in a clean run) */
__device__ __forceinline__ void ewdup_flag(const EwDup& d, bool bad0, bool bad1) {
    if (bad0 && d.f0) atomicOr(d.f0, 1);
    if (bad1 && d.f1) atomicOr(d.f1, 1);
}

#endif
