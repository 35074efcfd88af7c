/* ptx.cuh: the tensor-core and asynchronous-copy instructions the kernels use, one wrapper each.
 *
 * With nvcc every wrapper is one inline-PTX instruction for sm_80 and later (shared-memory operands as
 * 32-bit .shared addresses through __cvta_generic_to_shared). Under the CPU emulation (dev/cuda_emu,
 * __CUDA_EMU__) every wrapper calls its twin in the emulator's runtime (dev/cuda_emu/emu_runtime.cpp)
 * with the call site's file and line: mma and ldmatrix are warp collectives there (all 32 lanes of the
 * warp at the same instruction, or an error naming the kernel and the line), cp.async a per-thread
 * queue whose data become visible only at the wait. This header holds the only #ifdef __CUDA_EMU__ of
 * the tensor-core code: kernel bodies call the wrappers and never test for the emulator.
 *
 * Fragments are uint32_t words holding two bf16, the lower column (or k) index in the low 16 bits. The
 * per-lane layouts are those of the PTX ISA, sections "Matrix Fragments for mma.m16n8k16 with floating
 * point type" and "Warp-level matrix load instruction: ldmatrix" (lane = threadIdx linear % 32,
 * g = lane >> 2 (groupID), t = lane & 3 (threadID_in_group)):
 *
 *   mma_bf16_16816: D (16x8, fp32) = A (16x16, bf16, row-major) B (16x8, bf16, "col": B[k][n]) + C
 *     a[0] = A[g   ][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
 *     a[2] = A[g   ][2t+8, 2t+9]  a[3] = A[g+8][2t+8, 2t+9]
 *     b[0] = B[2t, 2t+1][g]       b[1] = B[2t+8, 2t+9][g]            (two k values of column n = g)
 *     c[i], d[i]: row g + 8 (i >> 1), column 2t + (i & 1)
 *   ldmatrix_xN (N = 1, 2, 4 8x8 matrices of b16): lanes 8i .. 8i+7 give the addresses of rows 0..7 of
 *     matrix i (16 bytes each, 16-byte aligned, in shared memory); the addresses of lanes >= 8N are not
 *     read. r[i] = M_i[lane >> 2][2t, 2t+1]; with _trans r[i] = (M_i[2t][lane >> 2], M_i[2t+1][lane >> 2]),
 *     i.e. the fragment of the transposed matrix. An A operand is one x4 (matrices: rows 0-7 / 8-15 x
 *     k 0-7 / 8-15 in the order of a[0..3] above); a B operand stored [n][k] is one x2 (k 0-7, 8-15),
 *     stored [k][n] one x2_trans.
 *   cp_async_16: cp.async.cg.shared.global, 16 bytes (L2 only); src_bytes in 0..16 are read from
 *     gmem_src and the rest of the 16 destination bytes are zero-filled (src_bytes 0 reads nothing).
 *     cp_async_commit closes the thread's open group; cp_async_wait<N> returns when all but the newest
 *     N committed groups of this thread have landed; cp_async_wait_all also lands the open group. The
 *     copies of one thread are visible to other threads only after that thread's wait and a
 *     __syncthreads (the barrier alone does not land anything).
 *   pack_bf16x2: cvt.rn.bf16x2.f32, both halves rounded to nearest even (NaN: the canonical 0x7FFF).
 *   dup_opaque: the value unchanged through an asm volatile mov.b32, which the compiler cannot see through: the
 *     duplicated computations of -protect ew (llmc/sdc/ewdup.cuh) start from it, so nvcc can neither merge them with
 *     the primary ones (common subexpressions) nor fold the comparison away. The emulator's twin is the identity.
 *
 * The "memory" clobbers keep the compiler from moving ordinary shared-memory loads and stores across
 * an ldmatrix or a cp.async issue/commit/wait (the data they read or write are shared memory the
 * compiler does not see in the asm operands). mma has none: it reads and writes registers only.
 *
 * Arithmetic of mma: the hardware's accumulation order and internal precision inside one mma are not
 * documented by NVIDIA. The emulator computes each d as (fp32)(c + sum_k a_k b_k) with the 16 products
 * exact and summed in double in k order (one rounding); a GPU agrees to a few fp32 ulps of
 * |c| + sum_k |a_k b_k|, not bitwise. Tests against a GPU compare at that tolerance (see
 * tests/cuda/ptx.cuh and docs/cuda_emulation.md). */
#ifndef TSDC_CUDA_PTX_CUH
#define TSDC_CUDA_PTX_CUH

#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __CUDA_EMU__
/* ------------------------------------------------------------------ the emulator's twins (CPU) */
/* __builtin_FILE / __builtin_LINE as default arguments are the caller's file and line (the #line of the
 * mirrored source names the original), so an error names the kernel's line, not this header's. */
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                                               const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::mma_bf16_16816(d, a, b, c, file, line);
}
__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void* smem_row, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::ldmatrix(r, 1, false, smem_row, file, line);
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::ldmatrix(r, 2, false, smem_row, file, line);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::ldmatrix(r, 4, false, smem_row, file, line);
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void* smem_row, const char* file = __builtin_FILE(),
                                                  int line = __builtin_LINE()) {
    emu::ldmatrix(r, 1, true, smem_row, file, line);
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row, const char* file = __builtin_FILE(),
                                                  int line = __builtin_LINE()) {
    emu::ldmatrix(r, 2, true, smem_row, file, line);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row, const char* file = __builtin_FILE(),
                                                  int line = __builtin_LINE()) {
    emu::ldmatrix(r, 4, true, smem_row, file, line);
}
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes, const char* file = __builtin_FILE(),
                                            int line = __builtin_LINE()) {
    emu::cp_async_16(smem_dst, gmem_src, src_bytes, file, line);
}
__device__ __forceinline__ void cp_async_commit(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::cp_async_commit(file, line);
}
template <int N> __device__ __forceinline__ void cp_async_wait(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(N >= 0, "cp.async.wait_group N: N >= 0");
    emu::cp_async_wait(N, file, line);
}
__device__ __forceinline__ void cp_async_wait_all(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::cp_async_wait_all(file, line);
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) { return emu::pack_bf16x2(lo, hi); }
__device__ __forceinline__ float dup_opaque(float x) { return x; }

#else
/* ------------------------------------------------------------------ nvcc: one PTX instruction each */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "llmc/cuda/ptx.cuh: mma.m16n8k16 bf16, ldmatrix and cp.async need sm_80 or later"
#endif

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void* smem_row) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void* smem_row) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    static_assert(N >= 0, "cp.async.wait_group N: N >= 0");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    /* cvt.rn.bf16x2.f32 d, a, b: a (here hi) to the upper half, b (lo) to the lower */
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float dup_opaque(float x) {
    float r;
    asm volatile("mov.b32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}
#endif

#endif /* TSDC_CUDA_PTX_CUH */
