/* bound.h: -protect bound, every forward matrix product's output held under its Cauchy-Schwarz bound (ours,
 * beyond the paper). The CPU trainer's check is here; the GPU trainer's kernels (llmc/sdc/bound.cuh) use the
 * same factor and the same comparison.
 *
 * The invariant. A linear layer computes y = x W^T: x [rows, K] its input as stored, W [cols, K] the weights the
 * product read (bf16 in bf16 mode: the copy the GEMM reads). For every output
 *     |y_ij| = |sum_k x_ik w_jk| <= sum_k |x_ik w_jk| <= ||x_i||_2 ||w_j||_2.
 * The computed, stored output obeys it up to rounding: products exact (bf16 inputs) or rounded once (fp32), an
 * fp32 sum of K terms in any order or pairing (the SIMD, AMX and tensor-core paths) off by at most
 * gamma_{K+1} sum |x w|, gamma_n = n u / (1 - n u), u = 2^-24, and the store to bf16 by a factor (1 + 2^-8) at
 * most. So
 *     |ŷ_ij| <= c(K) nx_i nw_j + 2^-100,   c(K) = (1 + 2^-8)(1 + 2 (K + 2) 2^-24)(1 + 2^-16)
 * holds on every clean product (the factor 2 on gamma and the 2^-16 cover the fp32 arithmetic of the bound
 * itself: two roundings of 2^-24), where nx_i and nw_j are the row norms rounded up: sqrt of a sum of squares
 * in double, times (1 + 2^-20), to fp32. The 2^-100 absolute term covers products flushed to zero (below
 * 2^-126 each) and a bound that underflows. An alarm is a violation: !(|y| <= bound), so a NaN output alarms
 * too. No clean run can raise one, whatever the data or the training state: there is nothing to calibrate.
 *
 * What it sees. Most clean outputs sit far below their bound, but not all: over 40 clean steps of the main job the
 * largest |y| / bound was 0.72 (v), 0.92 (o), 0.82 (gate, up), 0.66 (down). A flip that sets the top exponent bit
 * of a value below 2 in magnitude multiplies it by 2^15 or more (bit 7 up; three other flipped bits lower it by at
 * most 2^112, or by under 4 outside the exponent), so it is caught unless the value was under 2^-15 of its bound;
 * any Inf or NaN is caught. It does not see a flip that shrinks a value (a lowered exponent, the sign, most
 * mantissa flips): those change the output by less than the value itself. It is the check for products whose large faults nothing downstream reads: a
 * gate_proj output made huge and negative is zeroed by SiLU (the Residual Gain Guard sees nothing), yet the
 * backward's d gate reads it.
 *
 * Which products: v_proj, o_proj, gate_proj (fc for ReLU^2), up_proj and down_proj of every layer, each checked
 * after its output's injection point against the input the product read (attn_norm, att_out, mlp_norm,
 * mlp_product or act) and its weight matrix. q_proj and k_proj are qk's (recomputed exactly); the classifier's
 * logits feed only the loss. A layer's alarm count is the number of products that failed (up to 5).
 *
 * Cost: the input rows' norms (one pass over each input; attn_norm and mlp_norm once for the products that share
 * them), one pass over each output, and the weights' row norms once after every change of the weights (an
 * update or a load: the forwards of the step's microbatches and its replay share them). */
#ifndef TSDC_BOUND_H
#define TSDC_BOUND_H

#include <math.h>
#include <stddef.h>
#include "../cpu/bf16.h"

#ifndef TSDC_HD
#ifdef __CUDACC__
#define TSDC_HD __host__ __device__
#else
#define TSDC_HD
#endif
#endif

enum { MMB_V_PROJ, MMB_O_PROJ, MMB_GATE_PROJ, MMB_UP_PROJ, MMB_DOWN_PROJ, MMB_SLOTS };
#define MMB_ABS 0x1p-100f

/* both trainers keep a layer's weight row norms one slot after another in MMB_* order (v: kd rows, o: d, gate or
 * fc: F, up: F, down: d): slot s's offset in a layer's part; s = MMB_SLOTS gives the part's length */
static inline size_t mmb_slot_offset(int s, size_t kd, size_t d, size_t F) {
    const size_t len[MMB_SLOTS] = {kd, d, F, F, d};
    size_t o = 0;
    for (int i = 0; i < s; i++) o += len[i];
    return o;
}

/* c(K), rounded up to fp32 */
static inline float mmb_factor(int K) {
    const double c = (1.0 + 0x1p-8) * (1.0 + 2.0 * ((double)K + 2.0) * 0x1p-24) * (1.0 + 0x1p-16);
    float f = (float)c;
    return (double)f < c ? nextafterf(f, INFINITY) : f;
}
/* the check of a product's output fused into the kernel that reads it next (on the GPU: gate and up in SwiGLU's
 * forward, llmc/cuda/mlp.cuh; o and down in the residual adds fused with the next norm, llmc/cuda/rmsnorm.cuh): the
 * input rows' norms xn (left by the kernel that produced the input), the weight rows' norms of the output's columns
 * wn0 (and of a second column half wn1: gate, up), c = mmb_factor(K), the flags f0 (f1); xo (not NULL) receives the
 * norms of the reading kernel's own output rows (SwiGLU's product: the down projection's input). xin (xn NULL): the
 * input itself, bf16 [rows, kin] contiguous, whose row norms the reading kernel takes as it goes (o: att_out, which no
 * kernel before it reads whole rows of). xnp (xn and xin NULL): the input rows' sums of squares in np parts, double
 * [rows][np], added in part order (o: att_out's, one a head, left by the flash forward that wrote it) */
typedef struct {
    const float *xn, *wn0, *wn1;
    float c;
    int *f0, *f1;
    float* xo;
    const void* xin;
    int kin;
    const double* xnp;
    int np;
} MmbFused;
/* a row norm from its sum of squares, rounded up to fp32 */
TSDC_HD static inline float mmb_norm(double ss) { return (float)(sqrt(ss) * (1.0 + 0x1p-20)); }
/* the comparison, in the same fp32 operations on both trainers */
TSDC_HD static inline int mmb_violates(float y, float nx, float nw, float c) { return !(fabsf(y) <= nx * nw * c + MMB_ABS); }

/* an operand stored as fp32, or (h) as bf16 bits (-precision bf16's storage of the MLP's hidden tensors): columns
 * c0 .. c0 + n - 1 (n <= MMB_CHUNK) of the row at offset o, widened exactly into buf where needed */
#define MMB_CHUNK 512
static inline const float* mmb_chunk(const void* x, int h, size_t o, int n, float* buf) {
    if (!h) return (const float*)x + o;
    bf16_unpack_span(buf, (const uint16_t*)x + o, n);
    return buf;
}
/* the 2-norms of the rows of x [rows, cols] (row stride ld), each a sum of squares in double: 8 partial sums over
 * the columns k = j mod 8, each in k order (a SIMD-friendly order; any order is far inside the 2^-20 the norm is
 * rounded up by); the columns taken MMB_CHUNK at a time (a multiple of 8: the same sums) */
static void mmb_row_norms_x(float* out, const void* x, int h, int rows, int cols, int ld) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float buf[MMB_CHUNK];
        for (int c0 = 0; c0 < cols; c0 += MMB_CHUNK) {
            const int n = cols - c0 < MMB_CHUNK ? cols - c0 : MMB_CHUNK;
            const float* p = mmb_chunk(x, h, (size_t)r * ld + c0, n, buf);
            int k = 0;
            for (; k + 8 <= n; k += 8)
                for (int j = 0; j < 8; j++) acc[j] += (double)p[k + j] * p[k + j];
            for (; k < n; k++) acc[k & 7] += (double)p[k] * p[k];
        }
        out[r] = mmb_norm(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
    }
}
static void mmb_row_norms(float* out, const float* x, int rows, int cols, int ld) { mmb_row_norms_x(out, x, 0, rows, cols, ld); }
/* the number of outputs of y [rows, cols] (row stride ld; stored as yh says) over their bound, given the input rows'
 * norms nx [rows] and the weight rows' norms nw [cols] of a product over K; qmax (not NULL): the largest |y| / bound of
 * the finite outputs (how close the clean outputs come; test-only) */
static long long mmb_count_qx(const void* y, int yh, int rows, int cols, int ld, const float* nx, const float* nw, int K, double* qmax) {
    const float c = mmb_factor(K);
    long long bad = 0;
    double q = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : bad) reduction(max : q)
    for (int r = 0; r < rows; r++) {
        const float xr = nx[r];
        float buf[MMB_CHUNK];
        for (int c0 = 0; c0 < cols; c0 += MMB_CHUNK) {
            const int n = cols - c0 < MMB_CHUNK ? cols - c0 : MMB_CHUNK;
            const float* p = mmb_chunk(y, yh, (size_t)r * ld + c0, n, buf);
            const float* w = nw + c0;
            int nb = 0;
            for (int j = 0; j < n; j++) nb += mmb_violates(p[j], xr, w[j], c);   /* vectorised: no branch */
            bad += nb;
            if (qmax)
                for (int j = 0; j < n; j++)
                    if (isfinite(p[j])) {
                        const double t = fabs((double)p[j]) / ((double)xr * w[j] * c + MMB_ABS);
                        if (t > q) q = t;
                    }
        }
    }
    if (qmax) *qmax = q;
    return bad;
}
static long long mmb_count_q(const float* y, int rows, int cols, int ld, const float* nx, const float* nw, int K, double* qmax) {
    return mmb_count_qx(y, 0, rows, cols, ld, nx, nw, K, qmax);
}
static long long mmb_count(const float* y, int rows, int cols, int ld, const float* nx, const float* nw, int K) {
    return mmb_count_q(y, rows, cols, ld, nx, nw, K, NULL);
}

#endif
