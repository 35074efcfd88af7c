/* cpu_kernels.h: the math of every op of the model family on the CPU, forward and backward side by
 * side with the same argument order. This is the reference the CUDA kernels are tested against.
 *
 * Layouts: N = B*T tokens; activations [N, C] row-major; weights [out, in] row-major (HF), so a
 * linear layer is y = x W^T. Attention tensors: q [N, H*hd], k/v [N, KV*hd] (heads interleaved per
 * token, as the projections write them); logits/probs [B, H, T, T] with the masked upper triangle 0.
 *
 * Determinism: every output element is summed by one thread in a fixed order (k increasing in the
 * GEMM; tokens in order in the reductions), so results are bitwise identical run after run and do
 * not depend on the number of OpenMP threads. No OpenMP floating-point reductions are used (their
 * combine order is unspecified); reductions go through fixed-size chunks summed serially. */
#ifndef TSDC_CPU_KERNELS_H
#define TSDC_CPU_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <string.h>
#include "rope.h"
#include "bf16.h"
#include "vexp.h"

#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#endif

/* dot product with 16 independent lanes (vectorises without reassociating: the order is fixed),
 * lanes combined pairwise in a fixed tree, then the scalar tail */
static inline float dotf(const float* a, const float* b, int n) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] += a[i + j] * b[i + j];
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) lane[j] += lane[j + w];
    float s = lane[0];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
/* max of a row with 16 lanes (max is exact, so any order gives the same value). GCC left the lane loop scalar (a chain
 * of vmaxss: 40% of the cross-entropy pass), so on AVX-512 it is spelled out: VMAXPS(a, b) is a > b ? a : b lane by
 * lane, the C expression below exactly (NaN and signed zeros included) */
#if TSDC_VEXP_X86
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"   /* GCC 12's false positive in C++ builds: vexp.h */
__attribute__((target("avx512f"))) static inline float rowmax_avx512(const float* z, int n) {
    __m512 lane = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) lane = _mm512_max_ps(_mm512_loadu_ps(z + i), lane);
    float l[16], m = -INFINITY;
    _mm512_storeu_ps(l, lane);
    for (int j = 0; j < 16; j++) m = l[j] > m ? l[j] : m;
    for (; i < n; i++) m = z[i] > m ? z[i] : m;
    return m;
}
#pragma GCC diagnostic pop
#endif
static inline float rowmax(const float* z, int n) {
#if TSDC_VEXP_X86
    if (cpu_avx512dq()) return rowmax_avx512(z, n);
#endif
    float lane[16];
    for (int j = 0; j < 16; j++) lane[j] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] = z[i + j] > lane[j] ? z[i + j] : lane[j];
    float m = -INFINITY;
    for (int j = 0; j < 16; j++) m = lane[j] > m ? lane[j] : m;
    for (; i < n; i++) m = z[i] > m ? z[i] : m;
    return m;
}

/* ------------------------------------------------------------------------------------------ GEMM
 * gemm_portable, the path every machine has (llmc/cpu/gemm.h adds the SIMD ones and chooses at run time):
 * C[M,N] (+)= A[M,K] B[K,N], A element (m,k) at A[m*sam + k*sak] (so A may be read transposed),
 * B row-major [K,N]. Parallel tasks are tiles of GEMM_MT rows x GEMM_NB columns of C; inside a
 * tile, K is walked in chunks of GEMM_KC so the chunk of B (GEMM_KC x GEMM_NB) stays in cache while
 * the tile's micro-rows (GEMM_MB rows, accumulators in registers) pass over it. Every C element is
 * summed over k = 0..K-1 in order by one thread: the result does not depend on the thread count. */
#define GEMM_MB 4
#define GEMM_NB 64
#define GEMM_MT 64
#define GEMM_KC 256
static void gemm_portable(float* C, const float* A, long sam, long sak, const float* B, int M, int K, int N, int accumulate) {
    int nmt = (M + GEMM_MT - 1) / GEMM_MT, nnb = (N + GEMM_NB - 1) / GEMM_NB;
#pragma omp parallel for schedule(static)
    for (long task = 0; task < (long)nmt * nnb; task++) {
        int mt0 = (int)(task / nnb) * GEMM_MT, n0 = (int)(task % nnb) * GEMM_NB;
        int mt1 = MIN(M, mt0 + GEMM_MT), nr = MIN(GEMM_NB, N - n0);
        if (K == 0 && !accumulate)
            for (int r = mt0; r < mt1; r++) memset(C + (size_t)r * N + n0, 0, sizeof(float) * nr);
        for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
            int k1 = MIN(K, k0 + GEMM_KC);
            int init_zero = (k0 == 0 && !accumulate);
            /* pack the chunk of B: rows of B are N floats apart, which for large N (the vocabulary)
             * puts them all in the same cache sets; the packed copy is contiguous */
            float bp[GEMM_KC * GEMM_NB];
            for (int k = k0; k < k1; k++) memcpy(bp + (size_t)(k - k0) * GEMM_NB, B + (size_t)k * N + n0, sizeof(float) * nr);
            for (int m0 = mt0; m0 < mt1; m0 += GEMM_MB) {
                int mr = MIN(GEMM_MB, mt1 - m0);
                if (mr == GEMM_MB && nr == GEMM_NB) {
                    float acc[GEMM_MB][GEMM_NB];
                    for (int r = 0; r < GEMM_MB; r++)
                        for (int j = 0; j < GEMM_NB; j++) acc[r][j] = init_zero ? 0.0f : C[(size_t)(m0 + r) * N + n0 + j];
                    const float* a0 = A + (size_t)(m0 + 0) * sam;
                    const float* a1 = A + (size_t)(m0 + 1) * sam;
                    const float* a2 = A + (size_t)(m0 + 2) * sam;
                    const float* a3 = A + (size_t)(m0 + 3) * sam;
                    for (int k = k0; k < k1; k++) {
                        const float* b = bp + (size_t)(k - k0) * GEMM_NB;
                        float x0 = a0[k * sak], x1 = a1[k * sak], x2 = a2[k * sak], x3 = a3[k * sak];
                        for (int j = 0; j < GEMM_NB; j++) {
                            float bj = b[j];
                            acc[0][j] += x0 * bj; acc[1][j] += x1 * bj; acc[2][j] += x2 * bj; acc[3][j] += x3 * bj;
                        }
                    }
                    for (int r = 0; r < GEMM_MB; r++)
                        for (int j = 0; j < GEMM_NB; j++) C[(size_t)(m0 + r) * N + n0 + j] = acc[r][j];
                } else {
                    for (int r = 0; r < mr; r++)
                        for (int j = 0; j < nr; j++) {
                            float acc = init_zero ? 0.0f : C[(size_t)(m0 + r) * N + n0 + j];
                            const float* a = A + (size_t)(m0 + r) * sam;
                            for (int k = k0; k < k1; k++) acc += a[k * sak] * bp[(size_t)(k - k0) * GEMM_NB + j];
                            C[(size_t)(m0 + r) * N + n0 + j] = acc;
                        }
                }
            }
        }
    }
}

/* out[rows, cols] -> outT[cols, rows] */
static void transpose(float* outT, const float* in, int rows, int cols) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) outT[(size_t)c * rows + r] = in[(size_t)r * cols + c];
}

/* The GEMMs the model calls: in C, llmc/cpu/gemm.h's run-time choice of SIMD and matrix-unit paths (gemm_f32,
 * and gemm_bf16 for -precision bf16); in C++ (the CUDA tests' host references) gemm_portable for both. */
/* the logit softcap of one value, cap * tanh(x / cap): the one arithmetic of every store of it (softcap_forward, the
 * GEMM that stores the logits as bf16 bits), so the same bits */
static inline float softcap_value(float x, float cap) { return cap * tanhf(x / cap); }
/* n elements stored as h says (bf16 bits where h) as an fp32 array: x itself, or an exact widened copy in *tmp (NULL
 * otherwise; the caller frees it): for the paths that are not worth a blockwise form (the C++ references, head_dim
 * not a multiple of 16, the attention checks) */
static inline const float* widen_copy(const void* x, int h, size_t n, float** tmp) {
    *tmp = NULL;
    if (!h) return (const float*)x;
    *tmp = (float*)mallocCheck(sizeof(float) * (n ? n : 1));
    (*tmp)[0] = 0.0f;   /* n 0: nothing to widen, but no uninitialised read either */
    for (size_t i = 0; i < n; i++) (*tmp)[i] = bf16_bits_to_f32(((const uint16_t*)x)[i]);
    return *tmp;
}
#ifndef __cplusplus
#include "gemm.h"
#define gemm_nn gemm_f32
#define gemm_nn_bf16 gemm_bf16
/* The general forms, for -precision bf16's tensors stored as bf16 bits (ih, doh: the input, the output's gradient so
 * stored; the classifier's logits and dlogits, the activations of train_sdc.c's BF16_SITES): out is fp32 (out16
 * NULL), or out16 is stored as bf16 bits, after the softcap cap * tanh(z / cap) where cap > 0. The bits of the fp32
 * forms below on arrays of the same values, followed by softcap_forward and the bf16 store. */
static void matmul_forward_x(float* out, uint16_t* out16, float cap, const void* inp, int ih, const float* W, int N, int I, int O,
                             int bf16, int round_out) {
    gemm_x(bf16, out, out16, cap, inp, ih, I, 1, W, 0, 1, N, I, O, 0, round_out);
}
/* dinp16: dinp stored as bf16 bits instead; accumulating, dinp holds the fp32 partial sums of the products before
 * (read only) and dinp16 gets the bits of the whole sum (a dx summed over products, stored once as bf16) */
static void matmul_backward_xo(float* dinp, uint16_t* dinp16, float* dW, const void* dout, int doh, const void* inp, int ih, const float* W,
                               int N, int I, int O, int accumulate_dinp, int bf16, int round_dinp) {
    if (dinp || dinp16) gemm_x(bf16, dinp, dinp16, 0.0f, dout, doh, O, 1, W, 0, 0, N, O, I, accumulate_dinp, round_dinp);
    gemm_x(bf16, dW, NULL, 0.0f, dout, doh, 1, O, inp, ih, 0, O, N, I, 1, 0);
}
static void matmul_backward_x(float* dinp, float* dW, const void* dout, int doh, const void* inp, int ih, const float* W,
                              int N, int I, int O, int accumulate_dinp, int bf16, int round_dinp) {
    matmul_backward_xo(dinp, NULL, dW, dout, doh, inp, ih, W, N, I, O, accumulate_dinp, bf16, round_dinp);
}
/* linear with the weight as stored, W [O, I] (read as W^T by the GEMM's packing: no transposed copy);
 * round_out: the output rounded to bf16 as it is finished (its -precision bf16 store) */
static void matmul_forward_w(float* out, const float* inp, const float* W, int N, int I, int O, int bf16, int round_out) {
    matmul_forward_x(out, NULL, 0.0f, inp, 0, W, N, I, O, bf16, round_out);
}
/* matmul_backward_p with dinp rounded to bf16 when finished (round_dinp: the last product into dinp) */
static void matmul_backward_r(float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                              int N, int I, int O, int accumulate_dinp, int bf16, int round_dinp) {
    matmul_backward_x(dinp, dW, dout, 0, inp, 0, W, N, I, O, accumulate_dinp, bf16, round_dinp);
}
#else
#define gemm_nn gemm_portable
#define gemm_nn_bf16 gemm_portable
static void matmul_forward_w(float* out, const float* inp, const float* W, int N, int I, int O, int bf16, int round_out) {
    (void)bf16;   /* gemm_portable reads B row-major: W^T once */
    float* wT = (float*)mallocCheck(sizeof(float) * (size_t)I * O);
    transpose(wT, W, O, I);
    gemm_portable(out, inp, I, 1, wT, N, I, O, 0);
    free(wT);
    if (round_out) bf16_round_array(out, (long long)N * O);
}
static void matmul_backward_r(float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                              int N, int I, int O, int accumulate_dinp, int bf16, int round_dinp) {
    if (dinp) gemm_portable(dinp, dout, O, 1, W, N, O, I, accumulate_dinp);
    gemm_portable(dW, dout, 1, O, inp, O, N, I, 1);
    if (dinp && round_dinp) bf16_round_array(dinp, (long long)N * I);
    (void)bf16;
}
/* the bf16-storage forms (see the C branch), through fp32 copies (widen_copy) */
static void matmul_forward_x(float* out, uint16_t* out16, float cap, const void* inp, int ih, const float* W, int N, int I, int O,
                             int bf16, int round_out) {
    float *xt, *y = out16 ? (float*)mallocCheck(sizeof(float) * (size_t)N * O) : out;
    matmul_forward_w(y, widen_copy(inp, ih, (size_t)N * I, &xt), W, N, I, O, bf16, out16 ? 0 : round_out);
    if (out16)
        for (size_t i = 0; i < (size_t)N * O; i++) out16[i] = f32_to_bf16_bits(cap > 0.0f ? softcap_value(y[i], cap) : y[i]);
    if (out16) free(y);
    free(xt);
}
static void matmul_backward_xo(float* dinp, uint16_t* dinp16, float* dW, const void* dout, int doh, const void* inp, int ih, const float* W,
                               int N, int I, int O, int accumulate_dinp, int bf16, int round_dinp) {
    float *gt, *xt, *dt = dinp16 ? (float*)mallocCheck(sizeof(float) * (size_t)N * I) : NULL;
    if (dinp16 && accumulate_dinp) memcpy(dt, dinp, sizeof(float) * (size_t)N * I);   /* dinp: the partial sums, read only */
    const float* g = widen_copy(dout, doh, (size_t)N * O, &gt);
    const float* x = widen_copy(inp, ih, (size_t)N * I, &xt);
    matmul_backward_r(dinp16 ? dt : dinp, dW, g, x, W, N, I, O, accumulate_dinp, bf16, dinp16 ? 0 : round_dinp);
    if (dinp16)
        for (size_t i = 0; i < (size_t)N * I; i++) dinp16[i] = f32_to_bf16_bits(dt[i]);
    free(dt); free(gt); free(xt);
}
static void matmul_backward_x(float* dinp, float* dW, const void* dout, int doh, const void* inp, int ih, const float* W,
                              int N, int I, int O, int accumulate_dinp, int bf16, int round_dinp) {
    matmul_backward_xo(dinp, NULL, dW, dout, doh, inp, ih, W, N, I, O, accumulate_dinp, bf16, round_dinp);
}
#endif
/* linear: out[N,O] = inp[N,I] W^T with wT = W^T [I,O] (the trainer keeps transposed weight copies);
 * bf16 = 1: the inputs are bf16 values (-precision bf16) and the product runs on gemm_bf16 */
static void matmul_forward_p(float* out, const float* inp, const float* wT, int N, int I, int O, int bf16) {
    (bf16 ? gemm_nn_bf16 : gemm_nn)(out, inp, I, 1, wT, N, I, O, 0);
}
static void matmul_forward(float* out, const float* inp, const float* wT, int N, int I, int O) {
    matmul_forward_p(out, inp, wT, N, I, O, 0);
}
/* dinp[N,I] (+)= dout[N,O] W[O,I];  dW[O,I] += dout^T inp */
static void matmul_backward_p(float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                              int N, int I, int O, int accumulate_dinp, int bf16) {
    if (dinp) (bf16 ? gemm_nn_bf16 : gemm_nn)(dinp, dout, O, 1, W, N, O, I, accumulate_dinp);
    (bf16 ? gemm_nn_bf16 : gemm_nn)(dW, dout, 1, O, inp, O, N, I, 1);
}
static void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                            int N, int I, int O, int accumulate_dinp) {
    matmul_backward_p(dinp, dW, dout, inp, W, N, I, O, accumulate_dinp, 0);
}

/* --------------------------------------------------------------------------- deterministic sums */
#define SUM_CHUNK 4096
#define SUM_LANES 8
/* sum of squares of x[0..n) in double: chunk c's partial is the serial sum of x[i]^2 over its SUM_CHUNK
 * elements in index order, and the partials are summed in chunk order (thread-count independent). Each
 * square is exact in double (a 24-bit mantissa squared), so fma and mul + add agree. A serial chain waits
 * out the add latency on every element; SUM_LANES full chunks are therefore summed side by side, each its
 * own chain (the same operations in the same order per chunk, so the same bits as one chunk at a time). */
static double sumsq_det(const float* x, size_t n) {
    size_t nc = (n + SUM_CHUNK - 1) / SUM_CHUNK, nfull = n / SUM_CHUNK, ng = nfull / SUM_LANES;
    double* part = (double*)mallocCheck(sizeof(double) * (nc ? nc : 1));
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (long long g = 0; g < (long long)ng; g++) {
            const float* base = x + (size_t)g * SUM_LANES * SUM_CHUNK;
            double s[SUM_LANES] = {0};
            for (size_t i = 0; i < SUM_CHUNK; i++)
                for (int j = 0; j < SUM_LANES; j++) {
                    double v = base[(size_t)j * SUM_CHUNK + i];
                    s[j] += v * v;
                }
            for (int j = 0; j < SUM_LANES; j++) part[(size_t)g * SUM_LANES + j] = s[j];
        }
#pragma omp for schedule(static)
        for (long long c = (long long)(ng * SUM_LANES); c < (long long)nc; c++) {
            size_t lo = (size_t)c * SUM_CHUNK, hi = MIN(n, lo + SUM_CHUNK);
            double s = 0;
            for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
            part[c] = s;
        }
    }
    double s = 0;
    for (size_t c = 0; c < nc; c++) s += part[c];
    free(part);
    return s;
}
/* the same sum one chunk at a time (test_sdc holds sumsq_det to it bit for bit) */
static double sumsq_det_ref(const float* x, size_t n) {
    double s = 0;
    for (size_t lo = 0; lo < n; lo += SUM_CHUNK) {
        size_t hi = MIN(n, lo + SUM_CHUNK);
        double c = 0;
        for (size_t i = lo; i < hi; i++) c += (double)x[i] * x[i];
        s += c;
    }
    return s;
}

/* -------------------------------------------------------------------------- bf16 storage */
/* An operand may be stored as bf16 bits (h = 1: -precision bf16's storage of an activation): a block of it
 * is widened exactly into the thread's buffer before the arithmetic, and a bf16 output is computed into a buffer and
 * stored as the bits of its rounding (bf16_pack_span), so each element's arithmetic is the fp32 form's and the
 * bits are those of the fp32 arrays of the same values. */
static inline const float* ew_in(const void* x, int h, size_t i0, size_t i1, float* buf) {
    if (!h) return (const float*)x + i0;
    bf16_unpack_span(buf, (const uint16_t*)x + i0, (int)(i1 - i0));
    return buf;
}
/* Compare mode (-protect ew's recomputations): EW_CMP in a kernel's output flag (with the bf16 bit as the output is
 * stored) makes the kernel compute its output into its block buffer as always and, instead of storing it, compare it,
 * rounded as it is stored, with what the output already holds, bit for bit; a difference sets bit 0 of ew_cmp_bits
 * (bit 1 for a second output: EW_CMP_2ND, mul_backward_x's db). No scratch is written and read back: the check reads
 * the kernel's inputs and its stored output once. ew_cmp_take() returns the bits and clears them. */
#define EW_CMP 2
#define EW_CMP_2ND 4
static unsigned ew_cmp_bits;
static inline void ew_cmp_block(const void* y, int h, size_t i0, size_t i1, const float* o, int round) {
    const uint32_t* ou = (const uint32_t*)o;
    const int m = (int)(i1 - i0);
    unsigned d = 0;
    if (h & 1) {
        const uint16_t* y16 = (const uint16_t*)y + i0;
        for (int i = 0; i < m; i++) d |= (bf16_round_bits(ou[i]) >> 16) != y16[i];
    } else {
        const uint32_t* yu = (const uint32_t*)y + i0;
        if (round) for (int i = 0; i < m; i++) d |= bf16_round_bits(ou[i]) != yu[i];
        else for (int i = 0; i < m; i++) d |= ou[i] != yu[i];
    }
    if (d) __atomic_fetch_or(&ew_cmp_bits, h & EW_CMP_2ND ? 2u : 1u, __ATOMIC_RELAXED);
}
static inline unsigned ew_cmp_take(void) { unsigned b = ew_cmp_bits; ew_cmp_bits = 0; return b; }
static inline float* ew_out(void* y, int h, size_t i0, float* buf) { return h ? buf : (float*)y + i0; }
static inline void ew_store(void* y, int h, size_t i0, size_t i1, float* o, int round) {
    if (h & EW_CMP) ew_cmp_block(y, h, i0, i1, o, round);
    else if (h) bf16_pack_span((uint16_t*)y + i0, o, (int)(i1 - i0));
    else if (round) bf16_round_span(o, (int)(i1 - i0));
}
/* -------------------------------------------------------------------------------------- RMSNorm
 * out = x * rstd (* w),  rstd = 1/sqrt(ms + eps),  ms = mean(x^2) over the last dim C (per row).
 * ms is kept per row (the Residual Gain Guard reuses it). w == NULL: parameter-free. */
#define NORM_ROWS 8
/* s[j] = sum_i x_j[i]^2, i in order, for n <= NORM_ROWS rows side by side, each its own chain (one row at a time
 * waits out the add latency on every element; the same operations in the same order per row, so the same bits).
 * Each square is rounded, then added: contraction off for this function, so the rounding is the code's, not a
 * choice the compiler makes differently for each loop shape (a fused square-add would change the bits). */
__attribute__((optimize("fp-contract=off"))) static void norm_row_sumsq(float* s, const float* x, int n, int C) {
    float a[NORM_ROWS] = {0};
    if (n == NORM_ROWS)
        for (int i = 0; i < C; i++)
            for (int j = 0; j < NORM_ROWS; j++) { float v = x[(size_t)j * C + i]; a[j] += v * v; }
    else
        for (int j = 0; j < n; j++) {
            const float* xr = x + (size_t)j * C;
            for (int i = 0; i < C; i++) a[j] += xr[i] * xr[i];
        }
    for (int j = 0; j < n; j++) s[j] = a[j];
}
/* round: each output row rounded to bf16 as it is written (its -precision bf16 store, without a pass of its own);
 * oh: out stored as bf16 bits (-precision bf16's storage of the norms' outputs: each row computed into a buffer and
 * stored as the bits of its rounding, the same bits); xh: x stored as bf16 bits (the residual stream), a block of
 * rows widened exactly before the arithmetic */
static void rmsnorm_forward_x(void* out, int oh, float* ms, const void* xs, int xh, const float* w, int rows, int C, float eps,
                              int round) {
    int nblk = (rows + NORM_ROWS - 1) / NORM_ROWS;
#pragma omp parallel
    {
    float* xbuf = xh ? (float*)mallocCheck(sizeof(float) * NORM_ROWS * (size_t)C) : NULL;
    float* rowbuf = oh ? (float*)mallocCheck(sizeof(float) * (size_t)C) : NULL;
#pragma omp for schedule(static)
    for (int b = 0; b < nblk; b++) {
        int r0 = b * NORM_ROWS, n = rows - r0 < NORM_ROWS ? rows - r0 : NORM_ROWS;
        float s[NORM_ROWS];
        const float* x0 = ew_in(xs, xh, (size_t)r0 * C, (size_t)(r0 + n) * C, xbuf);   /* the block's rows */
        norm_row_sumsq(s, x0, n, C);
        for (int j = 0; j < n; j++) {
            const float* xr = x0 + (size_t)j * C;
            float* o = oh ? rowbuf : (float*)out + (size_t)(r0 + j) * C;
            float m = s[j] / C;
            float rstd = 1.0f / sqrtf(m + eps);
            ms[r0 + j] = m;
            if (w) for (int i = 0; i < C; i++) o[i] = w[i] * (xr[i] * rstd);
            else for (int i = 0; i < C; i++) o[i] = xr[i] * rstd;
            if (oh) ew_store(out, oh, (size_t)(r0 + j) * C, (size_t)(r0 + j + 1) * C, o, round);
            else if (round) bf16_round_span(o, C);
        }
    }
    free(xbuf); free(rowbuf);
    }
}
static void rmsnorm_forward_r(float* out, float* ms, const float* x, const float* w, int rows, int C, float eps, int round) {
    rmsnorm_forward_x(out, 0, ms, x, 0, w, rows, C, eps, round);
}
static void rmsnorm_forward(float* out, float* ms, const float* x, const float* w, int rows, int C, float eps) {
    rmsnorm_forward_r(out, ms, x, w, rows, C, eps, 0);
}
/* RMSNorm's weight gradient: dw[i] += sum over rows r, in row order, of dout[r,i] * (x[r,i] * rstd_r), each product
 * rounded and then added (no fused multiply-add: contraction off for this function, so the rounding is written
 * here, not chosen by the compiler). 16 columns walked together, each its own serial sum, reading the rows in
 * place (one column at a time walks down the rows, a cache line an element); the same bits as one column at a
 * time (test_sdc holds it to that loop). */
__attribute__((optimize("fp-contract=off"))) static void rmsnorm_dw(float* dw, const void* dout, int gh, const void* x, int xh,
                                                                     const float* ms, int rows, int C, float eps) {
    int ncb = (C + 15) / 16;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < ncb; b++) {
        int i0 = b * 16, w16 = C - i0 < 16 ? C - i0 : 16;
        float s[16] = {0}, xw[16], gw[16];
        for (int r = 0; r < rows; r++) {
            float rs = 1.0f / sqrtf(ms[r] + eps);
            const float *g = (const float*)dout + (size_t)r * C + i0, *xr = (const float*)x + (size_t)r * C + i0;
            if (xh) { bf16_unpack_span(xw, (const uint16_t*)x + (size_t)r * C + i0, w16); xr = xw; }   /* widened exactly */
            if (gh) { bf16_unpack_span(gw, (const uint16_t*)dout + (size_t)r * C + i0, w16); g = gw; }
            if (w16 == 16)
                for (int j = 0; j < 16; j++) s[j] += g[j] * (xr[j] * rs);
            else
                for (int j = 0; j < w16; j++) s[j] += g[j] * (xr[j] * rs);
        }
        for (int j = 0; j < w16; j++) dw[i0 + j] += s[j];
    }
}
/* dx (+)= d/dx;  dw += sum_rows dout * x * rstd (dw may be NULL when w is NULL).
 * dw is reduced over rows serially per column block so the order is fixed. x, dout and dx stored as xh, gh and dh
 * say (a row widened exactly before the arithmetic; dx's row, with what it held where it accumulates, computed in a
 * buffer and stored as the bits of its rounding: the same bits as the float array's row rounded in place). */
static void rmsnorm_backward_x(void* dx, int dh, float* dw, const void* dout, int gh, const void* x, int xh, const float* w, const float* ms,
                               int rows, int C, float eps, int accumulate_dx, int round) {
#pragma omp parallel
    {
    float* xbuf = xh || gh || dh ? (float*)mallocCheck(sizeof(float) * 3 * (size_t)C) : NULL;
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
        const size_t i0 = (size_t)r * C, i1 = i0 + C;
        const float* xr = ew_in(x, xh, i0, i1, xbuf);
        const float* g = ew_in(dout, gh, i0, i1, xbuf + C);
        float* d = dh && accumulate_dx ? (float*)ew_in(dx, dh, i0, i1, xbuf + 2 * C) : ew_out(dx, dh, i0, xbuf + 2 * C);
        float rstd = 1.0f / sqrtf(ms[r] + eps);
        float dot = 0.0f; /* sum_j (w_j g_j) x_j */
        for (int i = 0; i < C; i++) dot += (w ? w[i] * g[i] : g[i]) * xr[i];
        float coef = dot / C * rstd * rstd * rstd;
        for (int i = 0; i < C; i++) {
            float v = (w ? w[i] * g[i] : g[i]) * rstd - xr[i] * coef;
            d[i] = accumulate_dx ? d[i] + v : v;
        }
        ew_store(dx, dh, i0, i1, d, round);   /* the row's -precision bf16 store, while it is in L1 */
    }
    free(xbuf);
    }
    if (dw) rmsnorm_dw(dw, dout, gh, x, xh, ms, rows, C, eps);
}
static void rmsnorm_backward_r(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* ms,
                               int rows, int C, float eps, int accumulate_dx, int round) {
    rmsnorm_backward_x(dx, 0, dw, dout, 0, x, 0, w, ms, rows, C, eps, accumulate_dx, round);
}
static void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* ms,
                             int rows, int C, float eps, int accumulate_dx) {
    rmsnorm_backward_r(dx, dw, dout, x, w, ms, rows, C, eps, accumulate_dx, 0);
}

/* ---------------------------------------------------------------------------------------- RoPE
 * x [N, nh*hd] with N = B*T, token n at position n % T. In place allowed (out == x). */
/* round: each head's row rounded to bf16 right after it is rotated, while it is in L1 (the -precision bf16 store, no
 * pass of its own; the rotation loop is left as it is, since how the compiler contracts x1 c - x2 s into FMAs
 * decides its bits) */
/* x and out stored as xh and oh say (bf16 bits where set: a head's row widened, rotated in a buffer and stored as the
 * bits of its rounding) */
/* the rotation (neg: by the opposite angle, RoPE's backward), x and out stored as their flags say */
static void rope_rotate_x(void* out, int oh, const void* x, int xh, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                          int style, int round, int neg) {
    int half = hd / 2;
#pragma omp parallel
    {
        float* buf = xh || oh ? (float*)mallocCheck(sizeof(float) * 2 * (size_t)hd) : NULL;
#pragma omp for schedule(static)
        for (int n = 0; n < B * T; n++) {
            int t = n % T;
            for (int h = 0; h < nh; h++) {
                const size_t i0 = ((size_t)n * nh + h) * hd;
                const float* xi = ew_in(x, xh, i0, i0 + hd, buf);
                float* o = ew_out(out, oh, i0, buf + hd);
                for (int i = 0; i < half; i++) {
                    float y1, y2;
                    rope_rotate_pair(style, xi[i], xi[i + half], cos_t[t * half + i], neg ? -sin_t[t * half + i] : sin_t[t * half + i], &y1, &y2);
                    o[i] = y1; o[i + half] = y2;
                }
                ew_store(out, oh, i0, i0 + hd, o, round);
            }
        }
        free(buf);
    }
}
static void rope_forward_x(void* out, int oh, const void* x, int xh, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                           int style, int round) {
    rope_rotate_x(out, oh, x, xh, cos_t, sin_t, B, T, nh, hd, style, round, 0);
}
static void rope_forward_r(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, int style,
                           int round) {
    rope_forward_x(out, 0, x, 0, cos_t, sin_t, B, T, nh, hd, style, round);
}
static void rope_forward(float* out, const float* x, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, int style) {
    rope_forward_r(out, x, cos_t, sin_t, B, T, nh, hd, style, 0);
}
/* the rotation is orthogonal: the gradient is rotated back (sin -> -sin); dx and dout stored as their flags say */
static void rope_backward_x(void* dx, int dxh, const void* dout, int douth, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd,
                            int style, int round) {
    rope_rotate_x(dx, dxh, dout, douth, cos_t, sin_t, B, T, nh, hd, style, round, 1);
}
static void rope_backward_r(float* dx, const float* dout, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, int style,
                            int round) {
    rope_backward_x(dx, 0, dout, 0, cos_t, sin_t, B, T, nh, hd, style, round);
}
static void rope_backward(float* dx, const float* dout, const float* cos_t, const float* sin_t, int B, int T, int nh, int hd, int style) {
    rope_backward_r(dx, dout, cos_t, sin_t, B, T, nh, hd, style, 0);
}

/* ----------------------------------------------------------------------------------- attention
 * Causal GQA attention, materialised: kv head j serves query heads j*g .. j*g+g-1, g = H/KV.
 *   logits[b,h,t,s] = scale * q[b,t,h] . k[b,s,h/g]   (s <= t; 0 above the diagonal), scale = 1/sqrt(hd)
 *   probs = softmax_s(logits),  out[b,t,h] = sum_s probs[b,h,t,s] v[b,s,h/g]
 * In three steps (logits, softmax, probs x v) so that a fault can be injected into the logits and the
 * probabilities between them; the backward likewise (dprobs and dv; dlogits; dq and dk). The _x forms take q, k, v,
 * the output, its gradient and dv stored as bf16 bits (-precision bf16's storage), each flag for its tensor: a task
 * widens the head it reads into its buffer and stores an output from its buffer as the bits of its rounding, so every
 * element's arithmetic and order are the fp32 form's (the fp32 forms are the flags-0 case). */
/* a loop gcc unrolls n times; nothing in the C++ test programs, which compile these loops as references under nvcc
 * (unrolling changes no bits: the operations and their order are the loop's) */
#ifdef __CUDACC__
#define TSDC_UNROLL(n)
#else
#define TSDC_PRAGMA_(x) _Pragma(#x)
#define TSDC_UNROLL(n) TSDC_PRAGMA_(GCC unroll n)
#endif
#define ATT_KB 16   /* keys a dot-product block */
#define ATT_RB 8    /* output rows a sum block */
static void attention_logits_forward_ref(float* logits, const float* q, const float* k, int B, int T, int H, int KV, int hd) {
    int g = H / KV;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float* qt = q + ((size_t)b * T + t) * qs + (size_t)h * hd;
                float* lrow = logits + (((size_t)b * H + h) * T + t) * T;
                for (int s = 0; s <= t; s++) lrow[s] = dotf(qt, k + ((size_t)b * T + s) * ks + (size_t)(h / g) * hd, hd) * scale;
                for (int s = t + 1; s < T; s++) lrow[s] = 0.0f;
            }
}
/* The causal softmax of the nr <= ATT_RB consecutive rows t0 .. t0+nr-1 of a head: row r of the logits at l + r * rs
 * (s <= t read), of the probs at p + r * rs (p == l allowed): per row, the max, exp(l - max) (libm's expf bits, 16 at a time: vexp.h), their sum
 * in s order, each times 1/sum, 0 above the diagonal; round: stored as bf16 once written (-precision bf16; the same
 * bits as rounding after). The rows' sums run in one loop, so that their serial chains of adds (each row's own, in s
 * order) go side by side instead of one after another. The materialised and the fused attention both call it. */
static inline void att_softmax_rows(float* p, const float* l, size_t rs, int nr, int t0, int T, int round, int zero) {
    float mx[ATT_RB], sum[ATT_RB];
    for (int r = 0; r < nr; r++) {
        float* row = p + (size_t)r * rs;
        const float* lrow = l + (size_t)r * rs;
        int n = t0 + r + 1;
        mx[r] = rowmax(lrow, n);
        for (int s = 0; s < n; s++) row[s] = lrow[s] - mx[r];
        vexpf_span(row, row, n);
        sum[r] = 0.0f;
    }
    if (nr == ATT_RB)
        for (int s = 0; s <= t0; s++) {
TSDC_UNROLL(8)
            for (int r = 0; r < ATT_RB; r++) sum[r] += p[(size_t)r * rs + s];
        }
    else
        for (int s = 0; s <= t0; s++)
            for (int r = 0; r < nr; r++) sum[r] += p[(size_t)r * rs + s];
    for (int r = 1; r < nr; r++)
        for (int s = t0 + 1; s <= t0 + r; s++) sum[r] += p[(size_t)r * rs + s];
    for (int r = 0; r < nr; r++) {
        float* row = p + (size_t)r * rs;
        int t = t0 + r;
        float inv = 1.0f / sum[r];
        for (int s = 0; s <= t; s++) row[s] *= inv;
        if (zero) for (int s = t + 1; s < T; s++) row[s] = 0.0f;
        if (round) bf16_round_span(row, t + 1);
    }
}
/* dlogits = probs * (dprobs - sum_s probs*dprobs) for nr <= ATT_RB consecutive causal rows of a head, in place on d
 * (dprobs in, dlogits out; rows at d + r * rs, probs at p + r * rs). The sum over s <= t in s order: the first
 * 8 floor((t+1)/8) products rounded before their add, the rest fused into it (fmaf; on a build with FMA): what GCC
 * made of the one-row loop this replaced (products vectorised 16 and 8 at a time ahead of in-order adds, the <= 7 left
 * as scalar FMAs), written out so that the reference's bits stay those and no compiler's choice moves them. The
 * rows' sums side by side, as in att_softmax_rows. */
#ifdef __CUDACC__
#define TSDC_NO_CONTRACT
#else
#define TSDC_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
static inline float att_pd_tail(float pd, float p, float d) {
#ifdef __FMA__
    return fmaf(p, d, pd);
#else
    return pd + p * d;
#endif
}
TSDC_NO_CONTRACT static void att_softmax_bwd_rows(float* d, const float* p, size_t rs, int nr, int t0, int T, int round, int zero) {
    float pd[ATT_RB];
    int n8[ATT_RB], c8 = (t0 + 1) / 8 * 8;   /* row r's unfused products: s < n8[r]; all rows: s < c8 */
    for (int r = 0; r < nr; r++) { pd[r] = 0.0f; n8[r] = (t0 + r + 1) / 8 * 8; }
    if (nr == ATT_RB)
        for (int s = 0; s < c8; s++) {
TSDC_UNROLL(8)
            for (int r = 0; r < ATT_RB; r++) pd[r] += p[(size_t)r * rs + s] * d[(size_t)r * rs + s];
        }
    else
        for (int s = 0; s < c8; s++)
            for (int r = 0; r < nr; r++) pd[r] += p[(size_t)r * rs + s] * d[(size_t)r * rs + s];
    for (int r = 0; r < nr; r++) {
        const float *pr = p + (size_t)r * rs, *dr = d + (size_t)r * rs;
        int s = c8;
        for (; s < n8[r]; s++) pd[r] += pr[s] * dr[s];
        for (; s <= t0 + r; s++) pd[r] = att_pd_tail(pd[r], pr[s], dr[s]);
    }
    for (int r = 0; r < nr; r++) {
        float* dl = d + (size_t)r * rs;
        const float* prow = p + (size_t)r * rs;
        int t = t0 + r;
        for (int s = 0; s <= t; s++) dl[s] = prow[s] * (dl[s] - pd[r]);
        if (zero) for (int s = t + 1; s < T; s++) dl[s] = 0.0f;
        if (round) bf16_round_span(dl, t + 1);
    }
}
static void attention_av_forward_ref(float* out, const float* probs, const float* v, int B, int T, int H, int KV, int hd) {
    int g = H / KV;
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float* prow = probs + (((size_t)b * H + h) * T + t) * T;
                float* o = out + ((size_t)b * T + t) * qs + (size_t)h * hd;
                for (int i = 0; i < hd; i++) o[i] = 0.0f;
                for (int s = 0; s <= t; s++) {
                    const float* vv = v + ((size_t)b * T + s) * ks + (size_t)(h / g) * hd;
                    float p = prow[s];
                    for (int i = 0; i < hd; i++) o[i] += p * vv[i];
                }
            }
}
/* ---- the same four products, register-blocked, with each output element's arithmetic unchanged
 * The _ref loops above define the math and the order; these compute every element with the same operations in
 * the same order (so the same bits: test_sdc holds them to the _ref loops bit for bit), faster:
 *  - a dot product over hd (a logit, a dprobs entry) is dotf's: 16 lanes, lane j summing i = j, j+16, ... in
 *    order, then the fixed tree; here 16 keys and 4 query rows at once, the keys transposed into a [hd][16] block
 *    so that each lane step is one vector operation over the 16 keys (att_dot16x4);
 *  - a sum over keys or queries (out, dv, dq, dk) keeps its order (s, or h then t, ascending) and runs 8 output
 *    rows at once over 32- (then 16-) float chunks of hd, the accumulators in registers (only the causal triangle
 *    is added: no masked term, so no -0 or non-finite value enters an element the _ref loop would not touch);
 *  - the softmax and its backward take 8 rows at once, each row's sums still in s order (att_softmax_rows).
 * They need hd % 16 == 0 (every preset) and fall back to the _ref loops otherwise. */
static void attention_av_backward_ref(float* dprobs, float* dv, const float* dout, const float* probs, const float* v,
                                      int B, int T, int H, int KV, int hd);
static void attention_logits_backward_ref(float* dq, float* dk, const float* dlogits, const float* q, const float* k,
                                          int B, int T, int H, int KV, int hd);
/* per-thread scratch that only grows (the attention products call it every layer: a malloc of T*T floats
 * would be an mmap and page faults each time) */
#ifdef __cplusplus
#define TSDC_THREAD_LOCAL thread_local
#else
#define TSDC_THREAD_LOCAL _Thread_local
#endif
static float* att_scratch(int which, size_t n) {
    static TSDC_THREAD_LOCAL float* buf[12];
    static TSDC_THREAD_LOCAL size_t cap[12];
    if (n > cap[which]) {
        free(buf[which]);
        buf[which] = (float*)mallocCheck(sizeof(float) * n);
        cap[which] = n;
    }
    return buf[which];
}
/* 16 floats as one vector (GCC vector extension: zmm with AVX-512, split into narrower ones elsewhere). Its
 * arithmetic is the scalar loops' element by element; `a += p * x` is contracted to an FMA exactly where the
 * compiler contracts the _ref loops' `o[i] += p * v[i]` (-ffp-contract=fast, an FMA build), so the bits agree. */
typedef float att_v16 __attribute__((vector_size(64)));
typedef float att_v16u __attribute__((vector_size(64), aligned(4), may_alias));   /* unaligned access */
#define att_load16(p) ((att_v16) * (const att_v16u*)(p))
#define att_store16(p, v) (*(att_v16u*)(p) = (v))
/* out + r * ATT_KB = dotf(x_r, key c) for 4 query rows x_r and the ATT_KB keys of kT ([hd][ATT_KB], key c in
 * column c; hd % 16 == 0): dotf's operations for each (lane j's chain over i = j, j+16, ... in order from zero, then
 * the fixed tree: lane j + lane j+8, then + the partner 4 away, 2 away, 1 away), the lane pairs (j, j+8) one after
 * another and the tree's upper levels as soon as both halves exist, so that four rows' partials stay in registers
 * and each kT load serves four rows (1.25 loads an FMA; one row at a time took two). */
static inline void att_dot16x4(float* out, const float* const* x, const float* kT, int hd) {
#define ATT_PAIR(j, U)                                                                                     \
    do {                                                                                                   \
        att_v16 a_[4] = {{0}, {0}, {0}, {0}}, b_[4] = {{0}, {0}, {0}, {0}};                                \
        for (int i = 0; i < hd; i += 16) {                                                                 \
            att_v16 ka = att_load16(kT + (size_t)(i + (j)) * ATT_KB), kb = att_load16(kT + (size_t)(i + (j) + 8) * ATT_KB); \
            TSDC_UNROLL(4)                                                                                 \
            for (int r = 0; r < 4; r++) { a_[r] += x[r][i + (j)] * ka; b_[r] += x[r][i + (j) + 8] * kb; }  \
        }                                                                                                  \
        TSDC_UNROLL(4)                                                                                     \
        for (int r = 0; r < 4; r++) U[r] = a_[r] + b_[r];                                                  \
    } while (0)
    att_v16 u[4], w0[4], w1[4], x0[4], x1[4];
    ATT_PAIR(0, w0); ATT_PAIR(4, u);
    for (int r = 0; r < 4; r++) w0[r] += u[r];          /* lanes 0 (+8) + 4 (+12) */
    ATT_PAIR(2, x0); ATT_PAIR(6, u);
    for (int r = 0; r < 4; r++) { x0[r] += u[r]; x0[r] = w0[r] + x0[r]; }   /* lane 2 + 6, then lane 0 + lane 2 */
    ATT_PAIR(1, w1); ATT_PAIR(5, u);
    for (int r = 0; r < 4; r++) w1[r] += u[r];
    ATT_PAIR(3, x1); ATT_PAIR(7, u);
    for (int r = 0; r < 4; r++) { x1[r] += u[r]; x1[r] = w1[r] + x1[r]; }   /* lane 1 + lane 3 */
    for (int r = 0; r < 4; r++) att_store16(out + (size_t)r * ATT_KB, x0[r] + x1[r]);
#undef ATT_PAIR
}
/* rows s0..s0+15 of x (row stride xs, hd wide; bf16 bits where h, widened exactly) into kT [hd][16], rows past n as
 * zeros */
static inline void att_block_T(float* kT, const void* x, int h, size_t xs, int s0, int n, int hd) {
    for (int c = 0; c < ATT_KB; c++) {
        int s = s0 + c;
        if (h)
            for (int i = 0; i < hd; i++) kT[(size_t)i * ATT_KB + c] = s < n ? bf16_bits_to_f32(((const uint16_t*)x)[(size_t)s * xs + i]) : 0.0f;
        else
            for (int i = 0; i < hd; i++) kT[(size_t)i * ATT_KB + c] = s < n ? ((const float*)x)[(size_t)s * xs + i] : 0.0f;
    }
}
/* element i of a tensor stored as h says, as a pointer (bf16 bits where h) */
static inline const void* att_at(const void* x, int h, size_t i) { return h ? (const void*)((const uint16_t*)x + i) : (const void*)((const float*)x + i); }
/* n rows of x (stride xs, hd wide, stored as h says) as fp32 rows: x itself (*s = xs), or widened exactly into buf
 * [n][hd] (*s = hd): a head's q, k, v or output gradient for the products that read its rows in place */
static inline const float* att_rows_in(const void* x, int h, size_t xs, int n, int hd, float* buf, size_t* s) {
    if (!h) { *s = xs; return (const float*)x; }
    for (int i = 0; i < n; i++) bf16_unpack_span(buf + (size_t)i * hd, (const uint16_t*)x + (size_t)i * xs, hd);
    *s = hd;
    return buf;
}
/* nr finished output rows o (stride os, hd wide) stored at out + off (row stride qs): as bf16 bits where oh (then o is
 * the task's buffer), else in place, rounded where round */
static inline void att_rows_out(void* out, int oh, size_t off, size_t qs, const float* o, size_t os, int nr, int hd, int round) {
    for (int r = 0; r < nr; r++)
        if (oh) bf16_pack_span((uint16_t*)out + off + (size_t)r * qs, o + (size_t)r * os, hd);
        else if (round) bf16_round_span((float*)out + off + (size_t)r * qs, hd);
}
/* The materialised attention's [B, H, T, T] tensors (logits, probs, their gradients) stored as h says: rows t0 ..
 * t0+nr-1 of the head at off as fp32 rows (stride T): the tensor itself, or (h) its bf16 bits widened into buf, each
 * row's causal part (s <= t; nothing reads above it) */
static inline const float* att_tt_in(const void* x, int h, size_t off, int t0, int nr, int T, float* buf) {
    if (!h) return (const float*)x + off + (size_t)t0 * T;
    for (int r = 0; r < nr; r++) bf16_unpack_span(buf + (size_t)r * T, (const uint16_t*)x + off + (size_t)(t0 + r) * T, t0 + r + 1);
    return buf;
}
/* where rows t0 .. of such a head are computed: in place, or (h) into buf */
static inline float* att_tt_rows(void* x, int h, size_t off, int t0, int T, float* buf) { return h ? buf : (float*)x + off + (size_t)t0 * T; }
/* rows computed into buf (h) stored as bf16 bits, the whole row (zeros above the diagonal); in place: nothing to do
 * (the row functions round where asked) */
static inline void att_tt_out(void* x, int h, size_t off, int t0, int nr, int T, const float* buf) {
    if (h)
        for (int r = 0; r < nr; r++) bf16_pack_span((uint16_t*)x + off + (size_t)(t0 + r) * T, buf + (size_t)r * T, T);
}
/* probs = causal softmax of each row of logits (entries above the diagonal are 0); ATT_RB rows of a head a task;
 * probs and logits stored as ph and lh say (bf16 bits: a block of rows widened, computed and stored in a buffer) */
static void attention_softmax_forward_x(void* probs, int ph, const void* logits, int lh, int B, int H, int T, int round) {
    int nb = (T + ATT_RB - 1) / ATT_RB;
#pragma omp parallel
    {
        float* buf = ph || lh ? att_scratch(10, (size_t)ATT_RB * T) : NULL;
#pragma omp for schedule(static)
        for (long long blk = 0; blk < (long long)B * H * nb; blk++) {
            long long bh = blk / nb;
            int t0 = (int)(blk % nb) * ATT_RB, nr = T - t0 < ATT_RB ? T - t0 : ATT_RB;
            const size_t off = (size_t)bh * T * T;
            const float* l = att_tt_in(logits, lh, off, t0, nr, T, buf);
            float* p = ph ? buf : (float*)probs + off + (size_t)t0 * T;
            att_softmax_rows(p, l, T, nr, t0, T, round, 1);
            att_tt_out(probs, ph, off, t0, nr, T, p);
        }
    }
}
static void attention_softmax_forward(float* probs, const float* logits, int B, int H, int T, int round) {
    attention_softmax_forward_x(probs, 0, logits, 0, B, H, T, round);
}
/* acc rows r0..r0+nr-1 (stride as) += w[r][s] x[s] over s in [lo(r), hi(r)], s ascending, one 16-float
 * chunk of hd at a time; w(r, s) at w[r * wrs + s * wss]. Rows of the block take the common range together
 * and their own ends separately (the causal triangle), each element still in ascending s. */
static void att_rows_accumulate(float* acc0, size_t as, int nr, const float* w, size_t wrs, size_t wss, const float* x, size_t xs,
                                const int* lo, const int* hi, int hd) {
    int clo = lo[0], chi = hi[0];
    for (int r = 1; r < nr; r++) { clo = lo[r] > clo ? lo[r] : clo; chi = hi[r] < chi ? hi[r] : chi; }
    int i0 = 0;
    /* two 16-float chunks at a time where hd allows (each w broadcast serves 16 FMAs: 0.6 loads an FMA) */
    for (; i0 + 32 <= hd; i0 += 32) {
        att_v16 a[ATT_RB], b[ATT_RB];
TSDC_UNROLL(8)
        for (int r = 0; r < ATT_RB; r++) {
            a[r] = r < nr ? att_load16(acc0 + (size_t)r * as + i0) : (att_v16){0};
            b[r] = r < nr ? att_load16(acc0 + (size_t)r * as + i0 + 16) : (att_v16){0};
        }
        for (int r = 0; r < nr; r++)
            for (int s = lo[r]; s < clo && s <= hi[r]; s++) {
                float ws = w[(size_t)r * wrs + (size_t)s * wss];
                a[r] += ws * att_load16(x + (size_t)s * xs + i0);
                b[r] += ws * att_load16(x + (size_t)s * xs + i0 + 16);
            }
        if (nr == ATT_RB)
            for (int s = clo; s <= chi; s++) {
                att_v16 xa = att_load16(x + (size_t)s * xs + i0), xb = att_load16(x + (size_t)s * xs + i0 + 16);
                const float* ws = w + (size_t)s * wss;
TSDC_UNROLL(8)
                for (int r = 0; r < ATT_RB; r++) { a[r] += ws[(size_t)r * wrs] * xa; b[r] += ws[(size_t)r * wrs] * xb; }
            }
        else
            for (int s = clo; s <= chi; s++) {
                att_v16 xa = att_load16(x + (size_t)s * xs + i0), xb = att_load16(x + (size_t)s * xs + i0 + 16);
                for (int r = 0; r < nr; r++) { a[r] += w[(size_t)r * wrs + (size_t)s * wss] * xa; b[r] += w[(size_t)r * wrs + (size_t)s * wss] * xb; }
            }
        for (int r = 0; r < nr; r++)
            for (int s = (chi + 1 > lo[r] ? chi + 1 : lo[r]); s <= hi[r]; s++) {
                float ws = w[(size_t)r * wrs + (size_t)s * wss];
                a[r] += ws * att_load16(x + (size_t)s * xs + i0);
                b[r] += ws * att_load16(x + (size_t)s * xs + i0 + 16);
            }
TSDC_UNROLL(8)
        for (int r = 0; r < ATT_RB; r++)
            if (r < nr) { att_store16(acc0 + (size_t)r * as + i0, a[r]); att_store16(acc0 + (size_t)r * as + i0 + 16, b[r]); }
    }
    for (; i0 < hd; i0 += 16) {
        att_v16 a[ATT_RB];
TSDC_UNROLL(8)
        for (int r = 0; r < ATT_RB; r++) a[r] = r < nr ? att_load16(acc0 + (size_t)r * as + i0) : (att_v16){0};
        /* each row: its own leading part [lo, clo), then the common [clo, chi] (all rows), then (chi, hi] */
        for (int r = 0; r < nr; r++)
            for (int s = lo[r]; s < clo && s <= hi[r]; s++) a[r] += w[(size_t)r * wrs + (size_t)s * wss] * att_load16(x + (size_t)s * xs + i0);
        if (nr == ATT_RB)
            for (int s = clo; s <= chi; s++) {
                att_v16 xv = att_load16(x + (size_t)s * xs + i0);
                const float* ws = w + (size_t)s * wss;
TSDC_UNROLL(8)
                for (int r = 0; r < ATT_RB; r++) a[r] += ws[(size_t)r * wrs] * xv;
            }
        else
            for (int s = clo; s <= chi; s++) {
                att_v16 xv = att_load16(x + (size_t)s * xs + i0);
                for (int r = 0; r < nr; r++) a[r] += w[(size_t)r * wrs + (size_t)s * wss] * xv;
            }
        for (int r = 0; r < nr; r++)
            for (int s = (chi + 1 > lo[r] ? chi + 1 : lo[r]); s <= hi[r]; s++) a[r] += w[(size_t)r * wrs + (size_t)s * wss] * att_load16(x + (size_t)s * xs + i0);
TSDC_UNROLL(8)
        for (int r = 0; r < ATT_RB; r++) if (r < nr) att_store16(acc0 + (size_t)r * as + i0, a[r]);
    }
}

/* round (here and below): every output stored as bf16 as soon as it is final, while it is in cache (-precision
 * bf16: the same bits as a rounding pass after) */
/* row t[s] = dotf(x_t, key s) (* scale when scaled) for s <= t, for the nr <= 4 rows t0 .. t0+nr-1 (row r at
 * rows + r * rs, its x at x + r * xs) from the transposed key blocks kT, by att_dot16x4; a key block wholly at or
 * below a row's diagonal is stored by one vector store. zero: 0 above the diagonal (a stored tensor's masked
 * triangle; the fused path's scratch rows are never read there) */
static inline void att_causal_rows4(float* rows, size_t rs, const float* x, size_t xs, int nr, const float* kT, int t0, int T, int hd,
                                    int scaled, float scale, int round, int zero) {
    float dots[4 * ATT_KB];
    const float* xp[4];
    for (int r = 0; r < 4; r++) xp[r] = x + (size_t)(r < nr ? r : 0) * xs;
    for (int j = 0; j * ATT_KB <= t0 + nr - 1; j++) {
        att_dot16x4(dots, xp, kT + (size_t)j * hd * ATT_KB, hd);
        for (int r = 0; r < nr; r++) {
            float* row = rows + (size_t)r * rs + (size_t)j * ATT_KB;
            int t = t0 + r;
            if (j * ATT_KB + ATT_KB - 1 <= t) {
                att_v16 dv = att_load16(dots + r * ATT_KB);
                att_store16(row, scaled ? dv * scale : dv);
            } else
                for (int c = 0; c < ATT_KB && j * ATT_KB + c <= t; c++) row[c] = scaled ? dots[r * ATT_KB + c] * scale : dots[r * ATT_KB + c];
        }
    }
    for (int r = 0; r < nr; r++) {
        float* row = rows + (size_t)r * rs;
        int t = t0 + r;
        if (zero) for (int s = t + 1; s < T; s++) row[s] = 0.0f;
        if (round) bf16_round_span(row, t + 1);
    }
}
/* q and k stored as qh and kh say (bf16 bits where set: q widened a head at a time, k as its key blocks are made);
 * logits as lh says (bf16 bits: four rows at a time made in a buffer and stored) */
static void attention_logits_forward_x(void* logits, int lh, const void* q, int qh, const void* k, int kh, int B, int T, int H, int KV, int hd,
                                       int round) {
    if (hd % 16) {
        const size_t n = (size_t)B * H * T * T;
        float *qt, *kt, *lt = lh ? (float*)mallocCheck(sizeof(float) * n) : (float*)logits;
        attention_logits_forward_ref(lt, widen_copy(q, qh, (size_t)B * T * H * hd, &qt), widen_copy(k, kh, (size_t)B * T * KV * hd, &kt), B,
                                     T, H, KV, hd);
        free(qt); free(kt);
        if (lh) { bf16_pack_array((uint16_t*)logits, lt, (long long)n); free(lt); }
        else if (round) bf16_round_array(lt, (long long)n);
        return;
    }
    int g = H / KV, nkb = (T + ATT_KB - 1) / ATT_KB;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel
    {
        float* kT = att_scratch(0, (size_t)nkb * hd * ATT_KB);
        float* qbuf = qh ? att_scratch(1, (size_t)T * hd) : NULL;
        float* lbuf = lh ? att_scratch(10, (size_t)4 * T) : NULL;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const void* kb = att_at(k, kh, (size_t)b * T * ks + (size_t)(h / g) * hd);
                size_t qss;
                const float* qb = att_rows_in(att_at(q, qh, (size_t)b * T * qs + (size_t)h * hd), qh, qs, T, hd, qbuf, &qss);
                for (int j = 0; j < nkb; j++) att_block_T(kT + (size_t)j * hd * ATT_KB, kb, kh, ks, j * ATT_KB, T, hd);
                const size_t off = ((size_t)b * H + h) * T * T;
                for (int t = 0; t < T; t += 4) {
                    float* rows = att_tt_rows(logits, lh, off, t, T, lbuf);
                    att_causal_rows4(rows, T, qb + (size_t)t * qss, qss, T - t < 4 ? T - t : 4, kT, t, T, hd, 1, scale, round, 1);
                    att_tt_out(logits, lh, off, t, T - t < 4 ? T - t : 4, T, rows);
                }
            }
    }
}
static void attention_logits_forward(float* logits, const float* q, const float* k, int B, int T, int H, int KV, int hd, int round) {
    attention_logits_forward_x(logits, 0, q, 0, k, 0, B, T, H, KV, hd, round);
}
/* out = probs v; v and out stored as vh and oh say (bf16 bits where set: v widened a head at a time, out's rows summed
 * in a buffer and stored as the bits of their rounding; the same bits as the fp32 arrays of the same values) */
static void attention_av_forward_x(void* out, int oh, const void* probs, int ph, const void* v, int vh, int B, int T, int H, int KV, int hd,
                                   int round) {
    if (hd % 16) {
        float *vt, *pt, *ot = oh ? (float*)mallocCheck(sizeof(float) * (size_t)B * T * H * hd) : NULL;
        attention_av_forward_ref(oh ? ot : (float*)out, widen_copy(probs, ph, (size_t)B * H * T * T, &pt), widen_copy(v, vh, (size_t)B * T * KV * hd, &vt),
                                 B, T, H, KV, hd);
        if (oh) bf16_pack_span((uint16_t*)out, ot, B * T * H * hd);
        else if (round) bf16_round_array((float*)out, (long long)B * T * H * hd);
        free(vt); free(ot); free(pt);
        return;
    }
    int g = H / KV;
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel
    {
        float* vbuf = vh ? att_scratch(2, (size_t)T * hd) : NULL;
        float* obuf = oh ? att_scratch(3, (size_t)ATT_RB * hd) : NULL;
        float* pbuf = ph ? att_scratch(10, (size_t)ATT_RB * T) : NULL;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                size_t vs;
                const float* vb = att_rows_in(att_at(v, vh, (size_t)b * T * ks + (size_t)(h / g) * hd), vh, ks, T, hd, vbuf, &vs);
                for (int t0 = 0; t0 < T; t0 += ATT_RB) {
                    int nr = T - t0 < ATT_RB ? T - t0 : ATT_RB, lo[ATT_RB], hi[ATT_RB];
                    const size_t off = ((size_t)b * T + t0) * qs + (size_t)h * hd, os = oh ? (size_t)hd : qs;
                    float* o = oh ? obuf : (float*)out + off;
                    for (int r = 0; r < nr; r++) { lo[r] = 0; hi[r] = t0 + r; memset(o + (size_t)r * os, 0, sizeof(float) * hd); }
                    att_rows_accumulate(o, os, nr, att_tt_in(probs, ph, ((size_t)b * H + h) * T * T, t0, nr, T, pbuf), T, 1, vb, vs, lo, hi, hd);
                    att_rows_out(out, oh, off, qs, o, os, nr, hd, round);
                }
            }
    }
}
static void attention_av_forward(float* out, const float* probs, const float* v, int B, int T, int H, int KV, int hd, int round) {
    attention_av_forward_x(out, 0, probs, 0, v, 0, B, T, H, KV, hd, round);
}
/* dprobs[b,h,t,s] = dout[b,t,h] . v[b,s,h/g] (s <= t, else 0); dv overwritten with sum_t probs dout */
/* dv and dout (att_out's gradient) stored as dvh and doh say (bf16 bits where set: dout widened a head at a time, dv
 * summed over the group's heads in the task's buffer and stored as the bits of its rounding) */
/* dprobs and probs stored as dph and ph say (bf16 bits: a head's probs widened, dprobs four rows at a time made in a
 * buffer and stored) */
static void attention_av_backward_x(void* dprobs, int dph, void* dv, int dvh, const void* dout, int doh, const void* probs, int ph, const void* v,
                                    int vh, int B, int T, int H, int KV, int hd, int round) {
    if (hd % 16) {
        const size_t na = (size_t)B * H * T * T;
        float *vt, *gt, *pt, *dvt = dvh ? (float*)mallocCheck(sizeof(float) * (size_t)B * T * KV * hd) : (float*)dv;
        float* dpt = dph ? (float*)mallocCheck(sizeof(float) * na) : (float*)dprobs;
        attention_av_backward_ref(dpt, dvt, widen_copy(dout, doh, (size_t)B * T * H * hd, &gt), widen_copy(probs, ph, na, &pt),
                                  widen_copy(v, vh, (size_t)B * T * KV * hd, &vt), B, T, H, KV, hd);
        free(vt); free(gt); free(pt);
        if (dph) { bf16_pack_array((uint16_t*)dprobs, dpt, (long long)na); free(dpt); }
        else if (round) bf16_round_array(dpt, (long long)na);
        if (dvh) { bf16_pack_span((uint16_t*)dv, dvt, B * T * KV * hd); free(dvt); }
        else if (round) bf16_round_array((float*)dv, (long long)B * T * KV * hd);
        return;
    }
    int g = H / KV, nkb = (T + ATT_KB - 1) / ATT_KB;
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel
    {
        float* vT = att_scratch(0, (size_t)nkb * hd * ATT_KB);
        float* dvbuf = dvh ? att_scratch(1, (size_t)T * hd) : NULL;
        float* gobuf = doh ? att_scratch(2, (size_t)T * hd) : NULL;
        float* pbuf = ph ? att_scratch(10, (size_t)T * T) : NULL;    /* a head's probs */
        float* dpbuf = dph ? att_scratch(11, (size_t)4 * T) : NULL;  /* four rows of dprobs */
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < KV; kh++) {
                const void* vb = att_at(v, vh, (size_t)b * T * ks + (size_t)kh * hd);
                const size_t dvoff = (size_t)b * T * ks + (size_t)kh * hd, dvs = dvh ? (size_t)hd : ks;
                float* dvb = dvh ? dvbuf : (float*)dv + dvoff;
                for (int s = 0; s < T; s++) memset(dvb + (size_t)s * dvs, 0, sizeof(float) * hd);
                for (int j = 0; j < nkb; j++) att_block_T(vT + (size_t)j * hd * ATT_KB, vb, vh, ks, j * ATT_KB, T, hd);
                for (int h = kh * g; h < kh * g + g; h++) {
                    const size_t poff = ((size_t)b * H + h) * T * T;
                    const float* pb = att_tt_in(probs, ph, poff, 0, T, T, pbuf);
                    size_t gs;
                    const float* gob = att_rows_in(att_at(dout, doh, (size_t)b * T * qs + (size_t)h * hd), doh, qs, T, hd, gobuf, &gs);
                    /* dv rows s: += p[t, s] dout[t] over t = s .. T-1 ascending (this head after the ones before) */
                    for (int s0 = 0; s0 < T; s0 += ATT_RB) {
                        int nr = T - s0 < ATT_RB ? T - s0 : ATT_RB, lo[ATT_RB], hi[ATT_RB];
                        for (int r = 0; r < nr; r++) { lo[r] = s0 + r; hi[r] = T - 1; }
                        att_rows_accumulate(dvb + (size_t)s0 * dvs, dvs, nr, pb + s0, 1, T, gob, gs, lo, hi, hd);
                    }
                    for (int t = 0; t < T; t += 4) {
                        float* rows = att_tt_rows(dprobs, dph, poff, t, T, dpbuf);
                        att_causal_rows4(rows, T, gob + (size_t)t * gs, gs, T - t < 4 ? T - t : 4, vT, t, T, hd, 0, 1.0f, round, 1);
                        att_tt_out(dprobs, dph, poff, t, T - t < 4 ? T - t : 4, T, rows);
                    }
                }
                att_rows_out(dv, dvh, dvoff, ks, dvb, dvs, T, hd, round);   /* every head of the group added */
            }
    }
}
static void attention_av_backward(float* dprobs, float* dv, const float* dout, const float* probs, const float* v,
                                  int B, int T, int H, int KV, int hd, int round) {
    attention_av_backward_x(dprobs, 0, dv, 0, dout, 0, probs, 0, v, 0, B, T, H, KV, hd, round);
}
/* dq = scale * dlogits k, dk = scale * dlogits^T q (overwritten; stored as bf16 bits where dqkh: each row summed in a
 * task's fp32 buffer, then stored); one task per (b, kv head). The _ref loop multiplies each dlogit by scale before
 * its products (d = dl * scale): so do these, on a scaled row copy. */
static void attention_logits_backward_x(void* dq, void* dk, int dqkh, const void* dlogits, int dlh, const void* q, int qh, const void* k, int kh,
                                        int B, int T, int H, int KV, int hd, int round) {
    if (hd % 16) {
        const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
        float *qt, *kt, *lt, *dqf = dqkh ? (float*)mallocCheck(sizeof(float) * nq) : (float*)dq, *dkf = dqkh ? (float*)mallocCheck(sizeof(float) * nk) : (float*)dk;
        attention_logits_backward_ref(dqf, dkf, widen_copy(dlogits, dlh, (size_t)B * H * T * T, &lt), widen_copy(q, qh, nq, &qt), widen_copy(k, kh, nk, &kt),
                                      B, T, H, KV, hd);
        free(qt); free(kt); free(lt);
        if (dqkh) {
            bf16_pack_array((uint16_t*)dq, dqf, (long long)nq); bf16_pack_array((uint16_t*)dk, dkf, (long long)nk);
            free(dqf); free(dkf);
        } else if (round) { bf16_round_array(dqf, (long long)nq); bf16_round_array(dkf, (long long)nk); }
        return;
    }
    int g = H / KV;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel
    {
        float* ds = att_scratch(1, (size_t)T * T);   /* scale * dlogits of one head */
        float* kbuf = kh ? att_scratch(2, (size_t)T * hd) : NULL;
        float* qbuf = qh ? att_scratch(3, (size_t)T * hd) : NULL;
        float* dkbuf = dqkh ? att_scratch(4, (size_t)T * hd) : NULL;      /* dk's sums, [T][hd] */
        float* dqbuf = dqkh ? att_scratch(5, (size_t)ATT_RB * hd) : NULL; /* a block of dq's rows */
        const size_t dks = dqkh ? (size_t)hd : ks, dqs = dqkh ? (size_t)hd : qs;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < KV; j++) {
                size_t kss, qss;
                const float* kb = att_rows_in(att_at(k, kh, (size_t)b * T * ks + (size_t)j * hd), kh, ks, T, hd, kbuf, &kss);
                const size_t dkoff = (size_t)b * T * ks + (size_t)j * hd;
                float* dkb = dqkh ? dkbuf : (float*)dk + dkoff;
                for (int s = 0; s < T; s++) memset(dkb + (size_t)s * dks, 0, sizeof(float) * hd);
                for (int h = j * g; h < j * g + g; h++) {
                    const size_t loff = ((size_t)b * H + h) * T * T;
                    if (dlh)
                        for (int t = 0; t < T; t++)
                            for (int s = 0; s <= t; s++) ds[(size_t)t * T + s] = bf16_bits_to_f32(((const uint16_t*)dlogits)[loff + (size_t)t * T + s]) * scale;
                    else
                        for (int t = 0; t < T; t++)
                            for (int s = 0; s <= t; s++) ds[(size_t)t * T + s] = ((const float*)dlogits)[loff + (size_t)t * T + s] * scale;
                    const float* qb = att_rows_in(att_at(q, qh, (size_t)b * T * qs + (size_t)h * hd), qh, qs, T, hd, qbuf, &qss);
                    const size_t dqoff = (size_t)b * T * qs + (size_t)h * hd;
                    for (int t0 = 0; t0 < T; t0 += ATT_RB) {   /* dq rows t: += d[t, s] k[s], s = 0 .. t */
                        int nr = T - t0 < ATT_RB ? T - t0 : ATT_RB, lo[ATT_RB], hi[ATT_RB];
                        float* dqr = dqkh ? dqbuf : (float*)dq + dqoff + (size_t)t0 * qs;
                        for (int r = 0; r < nr; r++) { lo[r] = 0; hi[r] = t0 + r; memset(dqr + (size_t)r * dqs, 0, sizeof(float) * hd); }
                        att_rows_accumulate(dqr, dqs, nr, ds + (size_t)t0 * T, T, 1, kb, kss, lo, hi, hd);
                        att_rows_out(dq, dqkh, dqoff + (size_t)t0 * qs, qs, dqr, dqs, nr, hd, round);
                    }
                    for (int s0 = 0; s0 < T; s0 += ATT_RB) {   /* dk rows s: += d[t, s] q[t], t = s .. T-1 */
                        int nr = T - s0 < ATT_RB ? T - s0 : ATT_RB, lo[ATT_RB], hi[ATT_RB];
                        for (int r = 0; r < nr; r++) { lo[r] = s0 + r; hi[r] = T - 1; }
                        att_rows_accumulate(dkb + (size_t)s0 * dks, dks, nr, ds + s0, 1, T, qb, qss, lo, hi, hd);
                    }
                }
                att_rows_out(dk, dqkh, dkoff, ks, dkb, dks, T, hd, round);   /* every head of the group added */
            }
    }
}
static void attention_logits_backward(float* dq, float* dk, const float* dlogits, const float* q, const float* k,
                                      int B, int T, int H, int KV, int hd, int round) {
    attention_logits_backward_x(dq, dk, 0, dlogits, 0, q, 0, k, 0, B, T, H, KV, hd, round);
}
/* ---- the fused attention: the materialised path's outputs, bit for bit, without its [B,H,T,T] tensors
 * For where nothing reads the stored logits, probabilities or their gradients (train_sdc.c's attention_fused: no
 * -protect att / att_bwd / qk_bwd, no -detect abft, no att_logits / att_probs fault due, no trace). The forward
 * makes ATT_RB query rows' logits and probabilities at a time in a scratch [ATT_RB][T] (L1 / L2) and adds them
 * into out at once; the backward makes them again a tile of R query rows at a time (R x T floats, two tiles in
 * 512 KB: att_fused_tile_rows), with the tile's dprobs and dlogits beside them, and adds the tile into dv, dq and
 * dk. Every element goes through the materialised path's own functions: the row functions att_causal_rows4,
 * att_softmax_rows, att_softmax_bwd_rows (the scratch rows left unwritten above the diagonal, where nothing reads
 * them), and att_rows_accumulate's sums, each dv / dk element over t ascending in
 * tiles that follow each other (the heads of a group in order), as the materialised loops add them. So out, dq,
 * dk and dv are the materialised path's bits (test_sdc compares them bit for bit), run after run and at any
 * thread count (one task owns each output). The cost: the backward's logits and softmax again (one more T^2 hd / 2
 * product a head, and its exps); the gain: no T^2 tensor written and read back (logits, probs, dprobs, dlogits),
 * and no [B,H,T,T] buffer allocated. Needs hd % 16 == 0 (attention_fused_supported). */
static inline int attention_fused_supported(int hd) { return hd % 16 == 0; }
static inline int att_fused_tile_rows(int T) {
    int r = (65536 / T) / ATT_RB * ATT_RB;
    int rt = (T + ATT_RB - 1) / ATT_RB * ATT_RB;
    if (r < ATT_RB) r = ATT_RB;
    return r < rt ? r : rt;
}
/* acc rows s (stride as) += w[t][s] x[t] over the tile's rows t (t0 .. t0+nt-1, those >= s), ascending; w a tile
 * [nt][T] (row t - t0), x the tile's first row (stride xs): dv (w = probs, x = dout) and dk (w = scale * dlogits,
 * x = q), rows s0 .. t0+nt-1 ATT_RB at a time */
static void att_tile_cols_accumulate(float* acc, size_t as, const float* w, int T, const float* x, size_t xs, int t0, int nt, int hd) {
    int t1 = t0 + nt - 1;
    for (int s0 = 0; s0 <= t1; s0 += ATT_RB) {
        int nr = t1 + 1 - s0 < ATT_RB ? t1 + 1 - s0 : ATT_RB, lo[ATT_RB], hi[ATT_RB];
        for (int r = 0; r < nr; r++) { lo[r] = (s0 + r > t0 ? s0 + r : t0) - t0; hi[r] = nt - 1; }
        att_rows_accumulate(acc + (size_t)s0 * as, as, nr, w + s0, 1, T, x, xs, lo, hi, hd);
    }
}
/* out = the causal GQA attention of q, k, v (overwritten): attention_logits_forward, attention_softmax_forward and
 * attention_av_forward's bits; one task per (b, head) */
static void attention_fused_forward_x(void* out, int oh, const void* q, int qh, const void* k, int kh, const void* v, int vh, int B, int T,
                                      int H, int KV, int hd, int round) {
    int g = H / KV, nkb = (T + ATT_KB - 1) / ATT_KB;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel
    {
        float* kT = att_scratch(0, (size_t)nkb * hd * ATT_KB);
        float* P = att_scratch(1, (size_t)ATT_RB * T);
        float* vbuf = vh ? att_scratch(2, (size_t)T * hd) : NULL;
        float* obuf = oh ? att_scratch(3, (size_t)ATT_RB * hd) : NULL;
        float* qbuf = qh ? att_scratch(4, (size_t)T * hd) : NULL;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const void* kb = att_at(k, kh, (size_t)b * T * ks + (size_t)(h / g) * hd);
                size_t vs, qss;
                const float* vb = att_rows_in(att_at(v, vh, (size_t)b * T * ks + (size_t)(h / g) * hd), vh, ks, T, hd, vbuf, &vs);
                const float* qb = att_rows_in(att_at(q, qh, (size_t)b * T * qs + (size_t)h * hd), qh, qs, T, hd, qbuf, &qss);
                for (int j = 0; j < nkb; j++) att_block_T(kT + (size_t)j * hd * ATT_KB, kb, kh, ks, j * ATT_KB, T, hd);
                for (int t0 = 0; t0 < T; t0 += ATT_RB) {
                    int nr = T - t0 < ATT_RB ? T - t0 : ATT_RB, lo[ATT_RB], hi[ATT_RB];
                    const size_t off = ((size_t)b * T + t0) * qs + (size_t)h * hd, os = oh ? (size_t)hd : qs;
                    float* o = oh ? obuf : (float*)out + off;
                    for (int r = 0; r < nr; r += 4)
                        att_causal_rows4(P + (size_t)r * T, T, qb + (size_t)(t0 + r) * qss, qss, nr - r < 4 ? nr - r : 4, kT, t0 + r, T, hd, 1,
                                         scale, round, 0);
                    att_softmax_rows(P, P, T, nr, t0, T, round, 0);
                    for (int r = 0; r < nr; r++) {
                        lo[r] = 0; hi[r] = t0 + r;
                        memset(o + (size_t)r * os, 0, sizeof(float) * hd);
                    }
                    att_rows_accumulate(o, os, nr, P, T, 1, vb, vs, lo, hi, hd);
                    att_rows_out(out, oh, off, qs, o, os, nr, hd, round);
                }
            }
    }
}
static void attention_fused_forward(float* out, const float* q, const float* k, const float* v, int B, int T, int H, int KV, int hd,
                                    int round) {
    attention_fused_forward_x(out, 0, q, 0, k, 0, v, 0, B, T, H, KV, hd, round);
}
/* dq, dk, dv (overwritten; dq and dk stored as bf16 bits where dqkh, dv where dvh) from dout, q, k, v: attention_av_backward,
 * attention_softmax_backward and attention_logits_backward's bits; one task per (b, kv head), which owns that head's dk
 * and dv rows */
static void attention_fused_backward_x(void* dq, void* dk, int dqkh, void* dv, int dvh, const void* dout, int doh, const void* q, int qh,
                                       const void* k, int kh, const void* v, int vh, int B, int T, int H, int KV, int hd, int round) {
    int g = H / KV, nkb = (T + ATT_KB - 1) / ATT_KB, R = att_fused_tile_rows(T);
    float scale = 1.0f / sqrtf((float)hd);
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel
    {
        float* kT = att_scratch(0, (size_t)nkb * hd * ATT_KB);
        float* vT = att_scratch(1, (size_t)nkb * hd * ATT_KB);
        float* P = att_scratch(2, (size_t)R * T);   /* the tile's probs */
        float* D = att_scratch(3, (size_t)R * T);   /* its dprobs, then dlogits, then scale * dlogits */
        float* kbuf = kh ? att_scratch(4, (size_t)T * hd) : NULL;
        float* qbuf = qh ? att_scratch(5, (size_t)T * hd) : NULL;
        float* dvbuf = dvh ? att_scratch(6, (size_t)T * hd) : NULL;
        float* gobuf = doh ? att_scratch(7, (size_t)T * hd) : NULL;
        float* dkbuf = dqkh ? att_scratch(8, (size_t)T * hd) : NULL;      /* dk's sums */
        float* dqbuf = dqkh ? att_scratch(9, (size_t)ATT_RB * hd) : NULL; /* a block of dq's rows */
        const size_t dks = dqkh ? (size_t)hd : ks, dqs = dqkh ? (size_t)hd : qs;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int jh = 0; jh < KV; jh++) {
                size_t kss, qss;
                const float* kb = att_rows_in(att_at(k, kh, (size_t)b * T * ks + (size_t)jh * hd), kh, ks, T, hd, kbuf, &kss);
                const void* vb = att_at(v, vh, (size_t)b * T * ks + (size_t)jh * hd);
                const size_t dvoff = (size_t)b * T * ks + (size_t)jh * hd, dvs = dvh ? (size_t)hd : ks;
                float* dkb = dqkh ? dkbuf : (float*)dk + dvoff;
                float* dvb = dvh ? dvbuf : (float*)dv + dvoff;
                for (int s = 0; s < T; s++) {
                    memset(dkb + (size_t)s * dks, 0, sizeof(float) * hd);
                    memset(dvb + (size_t)s * dvs, 0, sizeof(float) * hd);
                }
                for (int j = 0; j < nkb; j++) {
                    att_block_T(kT + (size_t)j * hd * ATT_KB, kb, 0, kss, j * ATT_KB, T, hd);
                    att_block_T(vT + (size_t)j * hd * ATT_KB, vb, vh, ks, j * ATT_KB, T, hd);
                }
                for (int h = jh * g; h < jh * g + g; h++) {
                    const float* qb = att_rows_in(att_at(q, qh, (size_t)b * T * qs + (size_t)h * hd), qh, qs, T, hd, qbuf, &qss);
                    size_t gs;
                    const float* gob = att_rows_in(att_at(dout, doh, (size_t)b * T * qs + (size_t)h * hd), doh, qs, T, hd, gobuf, &gs);
                    const size_t dqoff = (size_t)b * T * qs + (size_t)h * hd;
                    for (int t0 = 0; t0 < T; t0 += R) {
                        int nt = T - t0 < R ? T - t0 : R;
                        for (int r = 0; r < nt; r += ATT_RB) {
                            int nr = nt - r < ATT_RB ? nt - r : ATT_RB;
                            float *pr = P + (size_t)r * T, *dr = D + (size_t)r * T;
                            for (int r4 = 0; r4 < nr; r4 += 4) {
                                int n4 = nr - r4 < 4 ? nr - r4 : 4, t = t0 + r + r4;
                                att_causal_rows4(pr + (size_t)r4 * T, T, qb + (size_t)t * qss, qss, n4, kT, t, T, hd, 1, scale, round, 0);
                                att_causal_rows4(dr + (size_t)r4 * T, T, gob + (size_t)t * gs, gs, n4, vT, t, T, hd, 0, 1.0f, round, 0);
                            }
                            att_softmax_rows(pr, pr, T, nr, t0 + r, T, round, 0);
                            att_softmax_bwd_rows(dr, pr, T, nr, t0 + r, T, round, 0);
                            for (int i = 0; i < nr; i++)
                                for (int s = 0; s <= t0 + r + i; s++) dr[(size_t)i * T + s] *= scale;
                        }
                        att_tile_cols_accumulate(dvb, dvs, P, T, gob + (size_t)t0 * gs, gs, t0, nt, hd);
                        for (int r0 = 0; r0 < nt; r0 += ATT_RB) {   /* dq rows t: += d[t, s] k[s], s = 0 .. t */
                            int nr = nt - r0 < ATT_RB ? nt - r0 : ATT_RB, lo[ATT_RB], hi[ATT_RB];
                            float* dqr = dqkh ? dqbuf : (float*)dq + dqoff + (size_t)(t0 + r0) * qs;
                            for (int r = 0; r < nr; r++) { lo[r] = 0; hi[r] = t0 + r0 + r; memset(dqr + (size_t)r * dqs, 0, sizeof(float) * hd); }
                            att_rows_accumulate(dqr, dqs, nr, D + (size_t)r0 * T, T, 1, kb, kss, lo, hi, hd);
                            att_rows_out(dq, dqkh, dqoff + (size_t)(t0 + r0) * qs, qs, dqr, dqs, nr, hd, round);
                        }
                        att_tile_cols_accumulate(dkb, dks, D, T, qb + (size_t)t0 * qss, qss, t0, nt, hd);
                    }
                }
                att_rows_out(dk, dqkh, dvoff, ks, dkb, dks, T, hd, round);   /* every head of the group added */
                att_rows_out(dv, dvh, dvoff, ks, dvb, dvs, T, hd, round);
            }
    }
}
static void attention_fused_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                                     int B, int T, int H, int KV, int hd, int round) {
    attention_fused_backward_x(dq, dk, 0, dv, 0, dout, 0, q, 0, k, 0, v, 0, B, T, H, KV, hd, round);
}
static void attention_forward(float* out, float* logits, float* probs, const float* q, const float* k, const float* v,
                              int B, int T, int H, int KV, int hd) {
    attention_logits_forward(logits, q, k, B, T, H, KV, hd, 0);
    attention_softmax_forward(probs, logits, B, H, T, 0);
    attention_av_forward(out, probs, v, B, T, H, KV, hd, 0);
}

/* dprobs[b,h,t,s] = dout[b,t,h] . v[b,s,h/g] (s <= t, else 0); dv overwritten with sum_t probs dout.
 * One task per (b, kv head): it owns that head's dv rows. */
static void attention_av_backward_ref(float* dprobs, float* dv, const float* dout, const float* probs, const float* v,
                                  int B, int T, int H, int KV, int hd) {
    int g = H / KV;
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < KV; kh++) {
            for (int s = 0; s < T; s++) memset(dv + ((size_t)b * T + s) * ks + (size_t)kh * hd, 0, sizeof(float) * hd);
            for (int h = kh * g; h < kh * g + g; h++)
                for (int t = 0; t < T; t++) {
                    const float* prow = probs + (((size_t)b * H + h) * T + t) * T;
                    float* drow = dprobs + (((size_t)b * H + h) * T + t) * T;
                    const float* go = dout + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    for (int s = 0; s <= t; s++) {
                        const float* vv = v + ((size_t)b * T + s) * ks + (size_t)kh * hd;
                        float* dvv = dv + ((size_t)b * T + s) * ks + (size_t)kh * hd;
                        float ps = prow[s];
                        for (int i = 0; i < hd; i++) dvv[i] += ps * go[i];
                        drow[s] = dotf(go, vv, hd);
                    }
                    for (int s = t + 1; s < T; s++) drow[s] = 0.0f;
                }
        }
}
/* dlogits = probs * (dprobs - sum_s probs*dprobs), s <= t (in place allowed: dlogits == dprobs) */
/* dlogits, dprobs and probs stored as dh (both gradients) and ph say (bf16 bits: a block of rows widened, computed and
 * stored in a buffer) */
static void attention_softmax_backward_x(void* dlogits, const void* dprobs, int dh, const void* probs, int ph, int B, int H, int T, int round) {
    int nb = (T + ATT_RB - 1) / ATT_RB;
#pragma omp parallel
    {
        float* dbuf = dh ? att_scratch(10, (size_t)ATT_RB * T) : NULL;
        float* pbuf = ph ? att_scratch(11, (size_t)ATT_RB * T) : NULL;
#pragma omp for schedule(static)
        for (long long blk = 0; blk < (long long)B * H * nb; blk++) {
            long long bh = blk / nb;
            int t0 = (int)(blk % nb) * ATT_RB, nr = T - t0 < ATT_RB ? T - t0 : ATT_RB;
            const size_t off = (size_t)bh * T * T;
            float* d = att_tt_rows(dlogits, dh, off, t0, T, dbuf);
            if (dh) att_tt_in(dprobs, 1, off, t0, nr, T, dbuf);
            else if (dlogits != dprobs) memcpy(d, (const float*)dprobs + off + (size_t)t0 * T, sizeof(float) * T * nr);
            att_softmax_bwd_rows(d, att_tt_in(probs, ph, off, t0, nr, T, pbuf), T, nr, t0, T, round, 1);
            att_tt_out(dlogits, dh, off, t0, nr, T, d);
        }
    }
}
static void attention_softmax_backward(float* dlogits, const float* dprobs, const float* probs, int B, int H, int T, int round) {
    attention_softmax_backward_x(dlogits, dprobs, 0, probs, 0, B, H, T, round);
}
/* dq = scale * dlogits k, dk = scale * dlogits^T q (overwritten); one task per (b, kv head) */
static void attention_logits_backward_ref(float* dq, float* dk, const float* dlogits, const float* q, const float* k,
                                      int B, int T, int H, int KV, int hd) {
    int g = H / KV;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < KV; kh++) {
            for (int s = 0; s < T; s++) memset(dk + ((size_t)b * T + s) * ks + (size_t)kh * hd, 0, sizeof(float) * hd);
            for (int h = kh * g; h < kh * g + g; h++)
                for (int t = 0; t < T; t++) {
                    const float* dl = dlogits + (((size_t)b * H + h) * T + t) * T;
                    const float* qt = q + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    float* dqt = dq + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    for (int i = 0; i < hd; i++) dqt[i] = 0.0f;
                    for (int s = 0; s <= t; s++) {
                        float d = dl[s] * scale;
                        const float* kk = k + ((size_t)b * T + s) * ks + (size_t)kh * hd;
                        float* dkk = dk + ((size_t)b * T + s) * ks + (size_t)kh * hd;
                        for (int i = 0; i < hd; i++) { dqt[i] += d * kk[i]; dkk[i] += d * qt[i]; }
                    }
                }
        }
}
/* dq, dk, dv overwritten; datt [B,H,T,T] scratch (holds dprobs, then dlogits) */
static void attention_backward(float* dq, float* dk, float* dv, float* datt, const float* dout, const float* probs,
                               const float* q, const float* k, const float* v, int B, int T, int H, int KV, int hd) {
    attention_av_backward(datt, dv, dout, probs, v, B, T, H, KV, hd, 0);
    attention_softmax_backward(datt, datt, probs, B, H, T, 0);
    attention_logits_backward(dq, dk, datt, q, k, B, T, H, KV, hd, 0);
}

/* ----------------------------------------------------------------------------------------- MLP */
/* SwiGLU pieces: act = silu(gate) = gate*sigmoid(gate); prod = act * up */
/* The element-wise kernels walk EW_BLK elements a block; with round set (their -precision bf16 store), each block's
 * output is rounded to bf16 right after it, while it is in L1 (the same bits as a rounding pass after the kernel,
 * without the pass). */
#define EW_BLK 4096
#define EW_BLOCKS(n) (((n) + EW_BLK - 1) / EW_BLK)
#define EW_RANGE(b, n, i0, i1) size_t i0 = (size_t)(b) * EW_BLK, i1 = i0 + EW_BLK < (n) ? i0 + EW_BLK : (n)
/* act = silu(gate): act stored as ah says, gate as gh */
static void silu_forward_x(void* act, int ah, const void* gate, int gh, size_t n, int round) {
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < EW_BLOCKS(n); b++) {
        EW_RANGE(b, n, i0, i1);
        const int m = (int)(i1 - i0);
        float e[EW_BLK], gb[EW_BLK], ob[EW_BLK];   /* e: expf(-gate) for the block, 16 at a time (vexp.h: libm's bits) */
        const float* g = ew_in(gate, gh, i0, i1, gb);
        float* o = ew_out(act, ah, i0, ob);
        for (int i = 0; i < m; i++) e[i] = -g[i];
        vexpf_span(e, e, m);
        for (int i = 0; i < m; i++) o[i] = g[i] / (1.0f + e[i]);
        ew_store(act, ah, i0, i1, o, round);
    }
}
static void silu_forward_r(float* act, const float* gate, size_t n, int round) { silu_forward_x(act, 0, gate, 0, n, round); }
static void silu_forward(float* act, const float* gate, size_t n) { silu_forward_r(act, gate, n, 0); }
/* dgate (fp32) from dact (fp32) and gate (stored as h says) */
/* the backward forms: the gradient out stored as oh says, the stored input and the incoming gradient as h (the MLP's
 * tensors and their gradients are stored alike) */
static void silu_backward_x(void* dgate, int oh, const void* dact, const void* gate, int h, size_t n, int round) {
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < EW_BLOCKS(n); b++) {
        EW_RANGE(b, n, i0, i1);
        const int m = (int)(i1 - i0);
        float e[EW_BLK], gb[EW_BLK], db[EW_BLK], ob[EW_BLK];
        const float* g = ew_in(gate, h, i0, i1, gb);
        const float* da = ew_in(dact, h, i0, i1, db);
        float* o = ew_out(dgate, oh, i0, ob);
        for (int i = 0; i < m; i++) e[i] = -g[i];
        vexpf_span(e, e, m);
        for (int i = 0; i < m; i++) {
            float s = 1.0f / (1.0f + e[i]);
            o[i] = da[i] * (s + g[i] * s * (1.0f - s));
        }
        ew_store(dgate, oh, i0, i1, o, round);
    }
}
static void silu_backward_r(float* dgate, const float* dact, const float* gate, size_t n, int round) { silu_backward_x(dgate, 0, dact, gate, 0, n, round); }
static void silu_backward(float* dgate, const float* dact, const float* gate, size_t n) { silu_backward_r(dgate, dact, gate, n, 0); }
/* out = a * b: out stored as oh says, a and b as h */
static void mul_forward_x(void* out, int oh, const void* a, const void* b, int h, size_t n, int round) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < EW_BLOCKS(n); k++) {
        EW_RANGE(k, n, i0, i1);
        const int m = (int)(i1 - i0);
        float ab[EW_BLK], bb[EW_BLK], ob[EW_BLK];
        const float *x = ew_in(a, h, i0, i1, ab), *y = ew_in(b, h, i0, i1, bb);
        float* o = ew_out(out, oh, i0, ob);
        for (int i = 0; i < m; i++) o[i] = x[i] * y[i];
        ew_store(out, oh, i0, i1, o, round);
    }
}
static void mul_forward_r(float* out, const float* a, const float* b, size_t n, int round) { mul_forward_x(out, 0, a, b, 0, n, round); }
static void mul_forward(float* out, const float* a, const float* b, size_t n) { mul_forward_r(out, a, b, n, 0); }
/* out = a*b: da = dout*b, db = dout*a (fp32; a and b stored as h says) */
static void mul_backward_x(void* da, void* db, int oh, const void* dout, const void* a, const void* b, int h, size_t n, int round) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < EW_BLOCKS(n); k++) {
        EW_RANGE(k, n, i0, i1);
        const int m = (int)(i1 - i0);
        float ab[EW_BLK], bb[EW_BLK], gb[EW_BLK], oab[EW_BLK], obb[EW_BLK];
        const float *x = ew_in(a, h, i0, i1, ab), *y = ew_in(b, h, i0, i1, bb), *g = ew_in(dout, h, i0, i1, gb);
        float *oa = ew_out(da, oh, i0, oab), *ob = ew_out(db, oh, i0, obb);
        for (int i = 0; i < m; i++) { oa[i] = g[i] * y[i]; ob[i] = g[i] * x[i]; }
        ew_store(da, oh, i0, i1, oa, round);
        ew_store(db, oh & EW_CMP ? oh | EW_CMP_2ND : oh, i0, i1, ob, round);
    }
}
static void mul_backward_r(float* da, float* db, const float* dout, const float* a, const float* b, size_t n, int round) {
    mul_backward_x(da, db, 0, dout, a, b, 0, n, round);
}
static void mul_backward(float* da, float* db, const float* dout, const float* a, const float* b, size_t n) {
    mul_backward_r(da, db, dout, a, b, n, 0);
}
/* ReLU^2: act = relu(x)^2 (act stored as ah says, x as h) */
static void relu2_forward_x(void* act, int ah, const void* x, int h, size_t n, int round) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < EW_BLOCKS(n); k++) {
        EW_RANGE(k, n, i0, i1);
        const int m = (int)(i1 - i0);
        float xb[EW_BLK], ob[EW_BLK];
        const float* xx = ew_in(x, h, i0, i1, xb);
        float* o = ew_out(act, ah, i0, ob);
        for (int i = 0; i < m; i++) { float r = xx[i] > 0.0f ? xx[i] : 0.0f; o[i] = r * r; }
        ew_store(act, ah, i0, i1, o, round);
    }
}
static void relu2_forward_r(float* act, const float* x, size_t n, int round) { relu2_forward_x(act, 0, x, 0, n, round); }
static void relu2_forward(float* act, const float* x, size_t n) { relu2_forward_r(act, x, n, 0); }
static void relu2_backward_x(void* dx, int oh, const void* dact, const void* x, int h, size_t n, int round) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < EW_BLOCKS(n); k++) {
        EW_RANGE(k, n, i0, i1);
        const int m = (int)(i1 - i0);
        float xb[EW_BLK], gb[EW_BLK], ob[EW_BLK];
        const float *xx = ew_in(x, h, i0, i1, xb), *g = ew_in(dact, h, i0, i1, gb);
        float* o = ew_out(dx, oh, i0, ob);
        for (int i = 0; i < m; i++) o[i] = xx[i] > 0.0f ? g[i] * 2.0f * xx[i] : 0.0f;
        ew_store(dx, oh, i0, i1, o, round);
    }
}
static void relu2_backward_r(float* dx, const float* dact, const float* x, size_t n, int round) { relu2_backward_x(dx, 0, dact, x, 0, n, round); }
static void relu2_backward(float* dx, const float* dact, const float* x, size_t n) { relu2_backward_r(dx, dact, x, n, 0); }

/* ----------------------------------------------------------------------------------- residual */
/* out = a + b (the residual stream and a projection's output), each stored as its flag says */
static void residual_forward_x(void* out, int oh, const void* a, int ah, const void* b, int bh, size_t n, int round) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < EW_BLOCKS(n); k++) {
        EW_RANGE(k, n, i0, i1);
        const int m = (int)(i1 - i0);
        float ab[EW_BLK], bb[EW_BLK], ob[EW_BLK];
        const float *x = ew_in(a, ah, i0, i1, ab), *y = ew_in(b, bh, i0, i1, bb);
        float* o = ew_out(out, oh, i0, ob);
        for (int i = 0; i < m; i++) o[i] = x[i] + y[i];
        ew_store(out, oh, i0, i1, o, round);
    }
}
static void residual_forward_r(float* out, const float* a, const float* b, size_t n, int round) {
    residual_forward_x(out, 0, a, 0, b, 0, n, round);
}
static void residual_forward(float* out, const float* a, const float* b, size_t n) { residual_forward_r(out, a, b, n, 0); }

/* ---------------------------------------------------------------------------------- embedding */
/* the rows of the tokens; stored as bf16 bits where oh (the rows' rounding: exact for -precision bf16's bf16 weights) */
static void embedding_forward_x(void* out, int oh, const int* tokens, const float* wte, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        if (oh) bf16_pack_span((uint16_t*)out + (size_t)n * C, wte + (size_t)tokens[n] * C, C);
        else memcpy((float*)out + (size_t)n * C, wte + (size_t)tokens[n] * C, sizeof(float) * C);
}
static void embedding_forward(float* out, const int* tokens, const float* wte, int N, int C) { embedding_forward_x(out, 0, tokens, wte, N, C); }
/* dwte[tok] += dout rows, tokens in order (serial over tokens, parallel over channels) */
/* dout stored as gh says (bf16 bits widened exactly as they are read) */
static void embedding_backward_x(float* dwte, const void* dout, int gh, const int* tokens, int N, int C) {
    const float* g = (const float*)dout;
    const uint16_t* g16 = (const uint16_t*)dout;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        if (gh) for (int n = 0; n < N; n++) dwte[(size_t)tokens[n] * C + c] += bf16_bits_to_f32(g16[(size_t)n * C + c]);
        else for (int n = 0; n < N; n++) dwte[(size_t)tokens[n] * C + c] += g[(size_t)n * C + c];
    }
}
static void embedding_backward(float* dwte, const float* dout, const int* tokens, int N, int C) { embedding_backward_x(dwte, dout, 0, tokens, N, C); }

/* ------------------------------------------------------------------------ softcap + cross-entropy
 * logits [N,V] are the raw lm_head outputs z; in place they become the model's logits
 * zc = cap*tanh(z/cap) (cap = 0: zc = z). losses[n] = logsumexp(zc_n) - zc_n[target] (fp32, in
 * double for the sum). Targets < 0 are ignored (loss 0, no gradient). */
static void softcap_forward(float* logits, size_t n, float cap) {
    if (cap <= 0.0f) return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) logits[i] = softcap_value(logits[i], cap);
}
/* exp(x) for float, branch-free so that loops over it vectorise: x = n*ln2 + r with |r| <= ln2/2,
 * exp(r) by a degree-7 Taylor polynomial (relative error < 2e-7, about 1-2 ulp), scaled by 2^n
 * through the exponent bits. Inputs are clamped to [-87.3, 88.7]: exp underflows to ~1e-38 (not 0)
 * below, which is immaterial where it is used (softmax terms of at most 1). */
static inline float fast_expf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    float n = (float)((int)(x * 1.44269504088896341f + 128.5f) - 128); /* round to nearest; argument > 0 */
    float r = x - n * 0.693145751953125f;       /* ln2 split in two for an exact product */
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return p * scale;
}

/* per row: lse = logsumexp(zc) and the loss lse - zc[target] (sum of exps in double) */
static inline void ce_row_forward(const float* z, int V, int target, float* lse, float* loss) {
    float mx = rowmax(z, V);
    /* 16 float lanes (vectorised), each lane's partial flushed into a double every 1024 terms */
    double s = 0.0;
    for (int c0 = 0; c0 < V; c0 += 1024) {
        int c1 = MIN(V, c0 + 1024), i = c0;
        float lane[16] = {0};
        for (; i + 16 <= c1; i += 16)
            for (int j = 0; j < 16; j++) lane[j] += fast_expf(z[i + j] - mx);
        for (; i < c1; i++) lane[0] += fast_expf(z[i] - mx);
        for (int j = 0; j < 16; j++) s += lane[j];
    }
    *lse = (float)(log(s) + mx);
    *loss = target >= 0 ? *lse - z[target] : 0.0f;
}
/* d (may alias z) = dloss * (softmax(zc) - onehot) * dcap, softmax = exp(zc - lse), dcap = 1 - (zc/cap)^2 */
static inline void ce_row_backward(float* d, const float* z, int V, float l, int target, float dloss, float cap) {
    if (target < 0) { memset(d, 0, sizeof(float) * V); return; }
    float zy = z[target];
    if (cap > 0.0f) {
        float inv = 1.0f / cap;
        for (int i = 0; i < V; i++) { float t = z[i] * inv; d[i] = fast_expf(z[i] - l) * dloss * (1.0f - t * t); }
        float t = zy * inv;
        d[target] -= dloss * (1.0f - t * t);
    } else {
        for (int i = 0; i < V; i++) d[i] = fast_expf(z[i] - l) * dloss;
        d[target] -= dloss;
    }
}
/* per row: lse[n] = logsumexp(zc_n) and losses[n] = lse - zc_n[target] */
static void crossentropy_forward(float* losses, float* lse, const float* logits, const int* targets, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) ce_row_forward(logits + (size_t)n * V, V, targets ? targets[n] : -1, &lse[n], &losses[n]);
}
/* dlogits (may alias the model logits zc) = dloss * (softmax(zc) - onehot) * dcap */
static void crossentropy_softcap_backward(float* dlogits, const float* logits, const float* lse, const int* targets,
                                          int N, int V, float dloss, float cap) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) ce_row_backward(dlogits + (size_t)n * V, logits + (size_t)n * V, V, lse[n], targets[n], dloss, cap);
}
/* the one-pass classifier: the forward's losses and lse and, in place of the logits, the backward's dlogits
 * (rounded to bf16 when round_bf16), each row read from memory once and written once while it is in cache.
 * The same row functions as the two passes above, so the same bits. */
static void crossentropy_fused(float* losses, float* lse, float* logits, const int* targets, int N, int V, float dloss, float cap,
                               int round_bf16) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* z = logits + (size_t)n * V;
        ce_row_forward(z, V, targets[n], &lse[n], &losses[n]);
        ce_row_backward(z, z, V, lse[n], targets[n], dloss, cap);
        if (round_bf16) bf16_round_span(z, V);   /* branch-free: the same bits as bf16_round */
    }
}
/* The three passes on logits stored as bf16 bits (-precision bf16's storage): each row widened (exactly) into the
 * thread's scratch, the same row functions, the dlogits stored back in place as bf16 bits (rounded as above): the
 * bits of the fp32 forms above on the same values, from half the bytes. */
static __thread float* ce_row_buf;
static __thread int ce_row_cap;
static float* ce_row_scratch(int V) {
    if (V > ce_row_cap) {
        free(ce_row_buf);
        ce_row_buf = (float*)mallocCheck(sizeof(float) * (size_t)V);
        ce_row_cap = V;
    }
    return ce_row_buf;
}
static void crossentropy_forward_h(float* losses, float* lse, const uint16_t* logits, const int* targets, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* z = ce_row_scratch(V);
        bf16_unpack_span(z, logits + (size_t)n * V, V);
        ce_row_forward(z, V, targets ? targets[n] : -1, &lse[n], &losses[n]);
    }
}
/* in place: the logits become the dlogits */
static void crossentropy_softcap_backward_h(uint16_t* logits, const float* lse, const int* targets, int N, int V, float dloss, float cap) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* z = ce_row_scratch(V);
        uint16_t* row = logits + (size_t)n * V;
        bf16_unpack_span(z, row, V);
        ce_row_backward(z, z, V, lse[n], targets[n], dloss, cap);
        bf16_pack_span(row, z, V);
    }
}
static void crossentropy_fused_h(float* losses, float* lse, uint16_t* logits, const int* targets, int N, int V, float dloss, float cap) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* z = ce_row_scratch(V);
        uint16_t* row = logits + (size_t)n * V;
        bf16_unpack_span(z, row, V);
        ce_row_forward(z, V, targets[n], &lse[n], &losses[n]);
        ce_row_backward(z, z, V, lse[n], targets[n], dloss, cap);
        bf16_pack_span(row, z, V);
    }
}

#endif
