/* attcheck.h: checks of the materialised causal attention, on the CPU (the CUDA kernels in
 * attcheck.cuh are tested against these). Two families, each behind its own flag:
 *
 *  ABFT, the ATTNChecker-style baseline (-detect abft): checksums of the two attention matrix products,
 *  verified after each product (and after a fault injected into its output):
 *    logits = scale * Q K^T (causal):  column sums  sum_{t>=s} logits[t,s]  ==  scale * (sum_{t>=s} q_t) . k_s
 *    out = P V:                        column sums  sum_t out[t,i]  ==  sum_s (sum_{t>=s} P[t,s]) v_s[i]
 *  It verifies each GEMM against its own inputs, so a fault in the probabilities (between softmax and
 *  P V) passes it, as it passes ATTNChecker.
 *
 *  Cheap attention invariants, ours (-protect att; DESIGN section 11), aimed at the paper's largest
 *  miss classes, attention logits and attention weights:
 *    logits row checksum: sum_{s<=t} logits[t,s] == scale * q_t . (sum_{s<=t} k_s)   (prefix sums of K,
 *      O(T hd) a head; the row sums fuse into the softmax, which reads every row anyway)
 *    probability rows sum to one: |sum_{s<=t} P[t,s] - 1| <= tol
 *  and in the backward (-protect att_bwd), where a fault in the gradient of the probabilities or of the logits
 *  reaches dQ, dK (and dV's neighbours) through every entry it touches:
 *    dprobs row checksum: dP = dO V^T (causal), so sum_{s<=t} dP[t,s] == dO_t . (sum_{s<=t} v_s)   (prefix sums
 *      of V, O(T hd) a head, as the logits' row check)
 *    dlogits rows sum to zero: dS[t,s] = P[t,s] (dP[t,s] - sum_j P[t,j] dP[t,j]), so sum_{s<=t} dS[t,s] == 0
 *      exactly in real arithmetic (sum_s P[t,s] = 1)
 *    dV column sums: dV = P^T dO (summed over the query heads of a kv head), so for every dim i
 *      sum_s dV[s,i] == sum_{h in the group} sum_t dO[t,h,i]   (rows of P sum to one; O(T hd) a head)
 *  A fault in dO itself (att_out's gradient) is consistent input to both and passes them; the backward
 *  guard's norms see it. The dlogits check needs the dprobs check beside it: a fault in dP keeps dS's rows
 *  summing to zero.
 *  "The row maximum of the logits is consistent with the probabilities" (the other example of DESIGN
 *  section 11) is left out: any change of a probability large enough to matter changes its row sum by
 *  the same amount, and a fault in the logits gives consistent probabilities, so it adds no coverage.
 *
 * Tolerances. A checksum can only be compared within the rounding of the values it sums, so each
 * check's bound is a rounding bound built from the clean side (never from the checked tensor, whose
 * fault would inflate its own bound): Cauchy-Schwarz for the logits, |q_t| |k_s| summed; sum of
 * |P| |v| for the output. The relative factor is ATT_TOL_REL(width): 2^-7 when the tensors are stored
 * in bf16 (each element carries up to 2^-8 relative rounding: a 2x margin), 1e-4 in fp32 (enough for
 * T up to about 1700 in the worst case of the float sums; far more in practice). The backward's bounds, from
 * the clean side again: |dO_t| sum_{s<=t} |v_s| for the dprobs row (Cauchy-Schwarz: at least sum_s |dP[t,s]|,
 * so the bf16 rounding of the stored dP, 2^-8 of each entry, stays 2x inside, as in the logits' check);
 * B_t = 2 |dO_t| max_{s<=t} |v_s| for the dlogits row (|dP[t,s]| <= |dO_t| |v_s| and sum_s P[t,s] = 1 bound
 * sum_s |dS[t,s]| by it; the rounding of the stored dS, 2^-8 of B_t, and the stored probabilities' sum off 1 by
 * up to 2^-8, times |D_t| <= B_t / 2: at most 1.5 x 2^-8 B_t, so the factor is 2 ATT_TOL_REL = 2^-6 in bf16, 2.7x
 * inside). Measured on clean bf16 steps (tiny-llama at the main job's checkpoint, tiny-qwen3, tiny-nanochat):
 * at most 0.45 of the tolerance for dprobs (the t = 0 row, one entry: the 2^-8 rounding itself), 0.08 for
 * dlogits; fp32 0.002. The dV column check's bound: B_i = sum_{h,t} |dO[t,h,i]| (at least sum_s |dV[s,i]|, rows
 * of P summing to one): the stored dV's rounding (2^-8 of B_i) plus the stored probabilities' row sums off 1
 * (2^-8 of B_i): 2^-7 B_i, so the factor is 2 ATT_TOL_REL = 2^-6 in bf16, 2x inside. Entries in the masked
 * triangle are never read by the model, so faults there are harmless and are not checked.
 * A non-finite sum always fails (the comparisons are written as !(err <= tol)). Sums are in double. */
#ifndef TSDC_ATTCHECK_H
#define TSDC_ATTCHECK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cpu/bf16.h"

/* the kinds of in-pass checks a trainer counts (model_check_alarms): the forward's Q/K recomputation, ABFT and
 * attention checks, the backward's Q/K recomputation (-protect qk_bwd) and attention checks (-protect att_bwd),
 * and the element-wise recomputation of both passes (-protect ew) */
enum { CHECK_QK = 0, CHECK_ABFT = 1, CHECK_ATT = 2, CHECK_QK_BWD = 3, CHECK_ATT_BWD = 4, CHECK_EW = 5, CHECK_BOUND = 6, CHECK_KINDS = 7 };

#define ATT_TOL_REL(width) ((width) == 16 ? 0.0078125 : 1e-4)
/* probability rows: bf16 storage 2^-6 (the row's rounding is at most 2^-8 of its sum, 1: a 4x margin); fp32: the
 * float sum of T terms of the softmax, with room */
#define ATT_TOL_ROWSUM(width, T) ((width) == 16 ? 0.015625 : 1e-5 + 4.0 * (T) * 5.9604645e-8)

/* Sums in double over ATT_LANES independent lanes (lane j takes the elements i = j mod 8, in order), the lanes then
 * added pairwise: one fixed order (the same sums run to run and at any thread count), and loops the compiler
 * vectorises, where one serial chain waits out the add's latency on every element (these sums were most of the
 * checks' time). The checks compare them with bounds of relative size 2^-7 (bf16) or 1e-4 (fp32), so the order of
 * a double sum moves nothing a check decides. */
#define ATT_LANES 8
/* the lanes' sum of term(k) over k < n (term: an expression in k) */
#define ATT_LANE_SUM(n, term)                                                                                          \
    double a[ATT_LANES] = {0};                                                                                         \
    int k0 = 0;                                                                                                        \
    for (; k0 + ATT_LANES <= (n); k0 += ATT_LANES)                                                                     \
        for (int j = 0; j < ATT_LANES; j++) { const int k = k0 + j; a[j] += (term); }                                  \
    for (int j = 0; k0 + j < (n); j++) { const int k = k0 + j; a[j] += (term); }                                       \
    const double lanes = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
/* sum_i x[i] */
static inline double att_sum(const float* x, int n) { ATT_LANE_SUM(n, x[k]); return lanes; }
/* sum_i x[i] y[i], y in double */
static inline double att_dot_d(const float* x, const double* y, int n) { ATT_LANE_SUM(n, x[k] * y[k]); return lanes; }
static inline double att_norm(const float* x, int n) { ATT_LANE_SUM(n, (double)x[k] * x[k]); return sqrt(lanes); }

/* what a per-head check reads: the checked tensor m, the tensors x and y its checksum is built from, the sizes
 * (g = H / KV query heads a kv head), the relative tolerance and the logits' scale; tt, the check's [B,H,T,T] operand
 * (m, or x for ABFT's P V), as it is stored: fp32, or (th) bf16 bits (-precision bf16's storage), read through
 * att_head_in */
typedef struct {
    const float *m, *x, *y;
    int B, T, H, KV, hd, g;
    double rel, scale;
    const void* tt;
    int th;
} AttHeads;

static inline AttHeads att_heads(const float* m, const float* x, const float* y, int B, int T, int H, int KV, int hd, double rel,
                                 double scale) {
    AttHeads c = {m, x, y, B, T, H, KV, hd, H / KV, rel, scale, m, 0};
    return c;
}

/* row t of head h of a [B*T, heads*hd] tensor (heads interleaved per token) */
static inline const float* att_row(const AttHeads* c, const float* x, int heads, int b, int t, int h) {
    return x + ((size_t)b * c->T + t) * ((size_t)heads * c->hd) + (size_t)h * c->hd;
}

/* head h's [T,T] matrix in a [B,H,T,T] tensor */
static inline const float* att_head(const AttHeads* c, const float* x, int b, int h) {
    return x + ((size_t)b * c->H + h) * c->T * c->T;
}
/* head h's [T,T] matrix of a [B,H,T,T] tensor stored as h says: the tensor itself, or its bf16 bits' causal part
 * (s <= t, all the checks read) widened into *tmp (allocated here; the caller frees it) */
static inline const float* att_head_as(const AttHeads* c, const void* x, int h16, int b, int h, float** tmp) {
    *tmp = NULL;
    if (!h16) return att_head(c, (const float*)x, b, h);
    const size_t T = (size_t)c->T;
    const uint16_t* src = (const uint16_t*)x + ((size_t)b * c->H + h) * T * T;
    float* w = (float*)malloc(sizeof(float) * T * T);
    if (!w) { fprintf(stderr, "error: out of memory for an attention check's head\n"); exit(1); }
    for (size_t t = 0; t < T; t++) bf16_unpack_span(w + t * T, src + t * T, (int)t + 1);
    *tmp = w;
    return w;
}
/* head h of the check's [B,H,T,T] operand (c->tt) */
static inline const float* att_head_in(const AttHeads* c, int b, int h, float** tmp) { return att_head_as(c, c->tt, c->th, b, h, tmp); }

/* check(c, b, h) (1: failed) for every batch b and head h < heads, in parallel. Returns the failed heads. */
static int att_heads_failed(const AttHeads* c, int heads, int (*check)(const AttHeads*, int, int)) {
    int bad = 0;
#pragma omp parallel for collapse(2) schedule(static) reduction(+:bad)
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < heads; h++) bad += check(c, b, h);
    return bad;
}

/* column checksums of head h of logits = m against the suffix sums of q = x, k = y */
static int abft_logits_head(const AttHeads* c, int b, int h) {
    const int T = c->T, hd = c->hd;
    double* qsuf = (double*)calloc((size_t)hd, sizeof(double));
    double qnsuf = 0;
    float* tmp;
    const float* L = att_head_in(c, b, h, &tmp);
    int fail = 0;
    for (int s = T - 1; s >= 0; s--) {   /* suffix sums over t >= s */
        const float* qt = att_row(c, c->x, c->H, b, s, h);
        for (int i = 0; i < hd; i++) qsuf[i] += qt[i];
        qnsuf += att_norm(qt, hd);
        const float* kv = att_row(c, c->y, c->KV, b, s, h / c->g);
        double ref = 0, col = 0;
        for (int i = 0; i < hd; i++) ref += qsuf[i] * kv[i];
        for (int t = s; t < T; t++) col += L[(size_t)t * T + s];
        double tol = c->rel * c->scale * qnsuf * att_norm(kv, hd) + 1e-30;
        if (!(fabs(col - c->scale * ref) <= tol)) fail = 1;
    }
    free(qsuf); free(tmp);
    return fail;
}

/* ABFT on logits = scale Q K^T; q [B*T, H*hd], k [B*T, KV*hd], logits [B,H,T,T]. Returns the number of
 * (b, h) heads whose checksum failed. */
static int abft_logits_check_x(const void* logits, int lh, const float* q, const float* k, int B, int T, int H, int KV, int hd,
                               int width) {
    AttHeads c = att_heads(NULL, q, k, B, T, H, KV, hd, ATT_TOL_REL(width), 1.0 / sqrt((double)hd));
    c.tt = logits; c.th = lh;
    return att_heads_failed(&c, H, abft_logits_head);
}
static int abft_logits_check(const float* logits, const float* q, const float* k, int B, int T, int H, int KV, int hd,
                             int width) {
    return abft_logits_check_x(logits, 0, q, k, B, T, H, KV, hd, width);
}

/* column sums of head h of out = m against probs = x, v = y */
static int abft_av_head(const AttHeads* c, int b, int h) {
    const int T = c->T, hd = c->hd;
    double* acc = (double*)calloc((size_t)hd * 3, sizeof(double));   /* ref, bound, column sum of out */
    float* tmp;
    const float* P = att_head_in(c, b, h, &tmp);
    for (int s = 0; s < T; s++) {
        double cs = 0, ca = 0;
        for (int t = s; t < T; t++) { cs += P[(size_t)t * T + s]; ca += fabs(P[(size_t)t * T + s]); }
        const float* vs = att_row(c, c->y, c->KV, b, s, h / c->g);
        const float* os = att_row(c, c->m, c->H, b, s, h);
        for (int i = 0; i < hd; i++) {
            acc[i] += cs * vs[i];
            acc[hd + i] += ca * fabs(vs[i]);
            acc[2 * hd + i] += os[i];
        }
    }
    int fail = 0;
    for (int i = 0; i < hd; i++)
        if (!(fabs(acc[2 * hd + i] - acc[i]) <= c->rel * acc[hd + i] + 1e-30)) fail = 1;
    free(acc); free(tmp);
    return fail;
}

/* ABFT on out = P V; probs [B,H,T,T] (stored as ph says), v [B*T, KV*hd], out [B*T, H*hd]. Returns failed heads. */
static int abft_av_check_x(const float* out, const void* probs, int ph, const float* v, int B, int T, int H, int KV, int hd,
                           int width) {
    AttHeads c = att_heads(out, NULL, v, B, T, H, KV, hd, ATT_TOL_REL(width), 1.0);
    c.tt = probs; c.th = ph;
    return att_heads_failed(&c, H, abft_av_head);
}
static int abft_av_check(const float* out, const float* probs, const float* v, int B, int T, int H, int KV, int hd,
                         int width) {
    return abft_av_check_x(out, probs, 0, v, B, T, H, KV, hd, width);
}

/* row checksums of head h of M = m against A = x and the prefix sums of Bm = y */
static int att_prefix_row_head(const AttHeads* c, int b, int h) {
    const int T = c->T, hd = c->hd;
    double* pre = (double*)calloc((size_t)hd, sizeof(double));
    double npre = 0;
    float* tmp;
    const float* Mh = att_head_in(c, b, h, &tmp);
    int fail = 0;
    for (int t = 0; t < T; t++) {
        const float* bt = att_row(c, c->y, c->KV, b, t, h / c->g);
        for (int i = 0; i < hd; i++) pre[i] += bt[i];
        npre += att_norm(bt, hd);
        const float* at = att_row(c, c->x, c->H, b, t, h);
        double ref = att_dot_d(at, pre, hd), row = att_sum(Mh + (size_t)t * T, t + 1);
        double tol = c->rel * c->scale * att_norm(at, hd) * npre + 1e-30;
        if (!(fabs(row - c->scale * ref) <= tol)) fail = 1;
    }
    free(pre); free(tmp);
    return fail;
}

/* row checksums of a causal product M = scale * A Bm^T (A [B*T, H*hd] per query head, Bm [B*T, KV*hd] per kv head,
 * M [B,H,T,T]): sum_{s<=t} M[t,s] == scale * a_t . (sum_{s<=t} b_s), within rel * scale * |a_t| sum_{s<=t} |b_s|
 * (Cauchy-Schwarz). The logits' check (A = Q, Bm = K) and the dprobs' (A = dO, Bm = V, scale 1). Returns failed heads. */
static int att_prefix_rowcheck(const void* M, int mh, const float* A, const float* Bm, int B, int T, int H, int KV, int hd, double scale,
                               int width) {
    AttHeads c = att_heads(NULL, A, Bm, B, T, H, KV, hd, ATT_TOL_REL(width), scale);
    c.tt = M; c.th = mh;
    return att_heads_failed(&c, H, att_prefix_row_head);
}

/* ours: logits row checksums against prefix sums of K (logits stored as lh says). Returns failed heads. */
static int att_logits_rowcheck_x(const void* logits, int lh, const float* q, const float* k, int B, int T, int H, int KV, int hd,
                                 int width) {
    return att_prefix_rowcheck(logits, lh, q, k, B, T, H, KV, hd, 1.0 / sqrt((double)hd), width);
}
static int att_logits_rowcheck(const float* logits, const float* q, const float* k, int B, int T, int H, int KV, int hd,
                               int width) {
    return att_logits_rowcheck_x(logits, 0, q, k, B, T, H, KV, hd, width);
}

/* ours: every causal probability row sums to one (probs stored as ph says). Returns failed heads. */
static int att_probs_rowcheck_x(const void* probs, int ph, int B, int H, int T, int width) {
    int bad = 0;
    double tol = ATT_TOL_ROWSUM(width, T);
    AttHeads c = att_heads(NULL, NULL, NULL, B, T, H, H, 1, 0.0, 1.0);
    c.tt = probs; c.th = ph;
#pragma omp parallel for schedule(static) reduction(+:bad)
    for (long long bh = 0; bh < (long long)B * H; bh++) {
        float* tmp;
        const float* P = att_head_in(&c, (int)(bh / H), (int)(bh % H), &tmp);
        int fail = 0;
        for (int t = 0; t < T; t++) {
            double s = att_sum(P + (size_t)t * T, t + 1);
            if (!(fabs(s - 1.0) <= tol)) fail = 1;
        }
        free(tmp);
        bad += fail;
    }
    return bad;
}
static int att_probs_rowcheck(const float* probs, int B, int H, int T, int width) { return att_probs_rowcheck_x(probs, 0, B, H, T, width); }

/* the statistics the forward checks read, summed over every causal row (b, h, t): out[0] the logits checksum's
 * bounds rel * scale * |q_t| sum_{s<=t} |k_s|, out[1] |scale * q_t . sum_{s<=t} k_s| (the references), out[2]
 * |sum_{s<=t} logits[t,s]|, out[3] sum_{s<=t} probs[t,s]. Test-only (the trainers' TSDC_CHECK_DUMP): a prefix or a
 * row sum off by one entry moves them by about 1/T, far more than the two trainers' bf16 differences. */
static void att_fwd_stats(const void* logits, const void* probs, int th, const float* q, const float* k, int B, int T, int H, int KV,
                          int hd, int width, double out[4]) {
    const double scale = 1.0 / sqrt((double)hd), rel = ATT_TOL_REL(width);
    AttHeads c = att_heads(NULL, q, k, B, T, H, KV, hd, rel, scale);
    double* pre = (double*)mallocCheck(sizeof(double) * (size_t)hd);
    out[0] = out[1] = out[2] = out[3] = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            double npre = 0;
            for (int i = 0; i < hd; i++) pre[i] = 0;
            float *zt, *pt;
            const float* Z = att_head_as(&c, logits, th, b, h, &zt);
            const float* P = att_head_as(&c, probs, th, b, h, &pt);
            for (int t = 0; t < T; t++) {
                const float* kt = att_row(&c, k, KV, b, t, h / c.g);
                for (int i = 0; i < hd; i++) pre[i] += kt[i];
                npre += att_norm(kt, hd);
                const float* qt = att_row(&c, q, H, b, t, h);
                double ref = 0, zr = 0, pr = 0;
                for (int i = 0; i < hd; i++) ref += qt[i] * pre[i];
                for (int s = 0; s <= t; s++) { zr += Z[(size_t)t * T + s]; pr += P[(size_t)t * T + s]; }
                out[0] += rel * scale * att_norm(qt, hd) * npre + 1e-30;
                out[1] += fabs(scale * ref);
                out[2] += fabs(zr);
                out[3] += pr;
            }
            free(zt); free(pt);
        }
    free(pre);
}

/* ours, backward: dprobs = dO V^T row checksums against prefix sums of V. dprobs [B,H,T,T], dout [B*T, H*hd]
 * (att_out's gradient), v [B*T, KV*hd]. Returns failed heads. */
static int att_dprobs_rowcheck_x(const void* dprobs, int dh, const float* dout, const float* v, int B, int T, int H, int KV, int hd,
                                 int width) {
    return att_prefix_rowcheck(dprobs, dh, dout, v, B, T, H, KV, hd, 1.0, width);
}
static int att_dprobs_rowcheck(const float* dprobs, const float* dout, const float* v, int B, int T, int H, int KV, int hd,
                               int width) {
    return att_dprobs_rowcheck_x(dprobs, 0, dout, v, B, T, H, KV, hd, width);
}

/* rows of head h of dlogits = m summing to zero; the bound from dout = x, v = y */
static int att_dlogits_head(const AttHeads* c, int b, int h) {
    const int T = c->T, hd = c->hd;
    double vmax = 0;
    float* tmp;
    const float* D = att_head_in(c, b, h, &tmp);
    int fail = 0;
    for (int t = 0; t < T; t++) {
        double vn = att_norm(att_row(c, c->y, c->KV, b, t, h / c->g), hd);
        if (vn > vmax || vn != vn) vmax = vn;   /* a NaN norm keeps the bound NaN: the rows fail */
        double row = att_sum(D + (size_t)t * T, t + 1);
        double tol = 2.0 * c->rel * 2.0 * att_norm(att_row(c, c->x, c->H, b, t, h), hd) * vmax + 1e-30;
        if (!(fabs(row) <= tol)) fail = 1;
    }
    free(tmp);
    return fail;
}

/* ours, backward: every causal row of dlogits (the softmax backward's output) sums to zero. dlogits [B,H,T,T];
 * dout and v as above, for the bound. Returns failed heads. */
static int att_dlogits_rowcheck_x(const void* dlogits, int dh, const float* dout, const float* v, int B, int T, int H, int KV, int hd,
                                  int width) {
    AttHeads c = att_heads(NULL, dout, v, B, T, H, KV, hd, ATT_TOL_REL(width), 1.0);
    c.tt = dlogits; c.th = dh;
    return att_heads_failed(&c, H, att_dlogits_head);
}
static int att_dlogits_rowcheck(const float* dlogits, const float* dout, const float* v, int B, int T, int H, int KV, int hd,
                                int width) {
    return att_dlogits_rowcheck_x(dlogits, 0, dout, v, B, T, H, KV, hd, width);
}

/* column sums of kv head kh of dv = m against those of dout = x over kh's query heads */
static int att_dv_col_head(const AttHeads* c, int b, int kh) {
    const int T = c->T, hd = c->hd, g = c->g;
    double* acc = (double*)calloc((size_t)hd * 3, sizeof(double));   /* sum of dV, sum of dO, sum of |dO| */
    for (int t = 0; t < T; t++) {
        const float* dvt = att_row(c, c->m, c->KV, b, t, kh);
        for (int i = 0; i < hd; i++) acc[i] += dvt[i];
        for (int h = kh * g; h < kh * g + g; h++) {
            const float* ot = att_row(c, c->x, c->H, b, t, h);
            for (int i = 0; i < hd; i++) { acc[hd + i] += ot[i]; acc[2 * hd + i] += fabs(ot[i]); }
        }
    }
    int fail = 0;
    for (int i = 0; i < hd; i++)
        if (!(fabs(acc[i] - acc[hd + i]) <= c->rel * acc[2 * hd + i] + 1e-30)) fail = 1;
    free(acc);
    return fail;
}

/* ours, backward: dV column sums against the column sums of dO over each kv head's query heads. dv [B*T, KV*hd]
 * (v_proj's gradient), dout [B*T, H*hd]. Returns the number of (b, kv head) whose check failed. */
static int att_dv_colcheck(const float* dv, const float* dout, int B, int T, int H, int KV, int hd, int width) {
    AttHeads c = att_heads(dv, dout, NULL, B, T, H, KV, hd, 2.0 * ATT_TOL_REL(width), 1.0);
    return att_heads_failed(&c, KV, att_dv_col_head);
}

/* the sums of the backward checks' bounds, as they compute them: [0] over every row of the dprobs check, [1] of the
 * dlogits check, [2] over every (b, kv head, dim) of the dV check. Test-only statistics (the trainers' TSDC_CHECK_DUMP):
 * an off-by-one in a prefix sum or maximum moves them by about 1/T, far more than the two trainers' bf16 differences. */
static void att_bwd_bound_sums(const float* dout, const float* v, int B, int T, int H, int KV, int hd, int width, double out[3]) {
    const double rel = ATT_TOL_REL(width);
    const int g = H / KV;
    AttHeads c = att_heads(NULL, dout, v, B, T, H, KV, hd, rel, 1.0);
    out[0] = out[1] = out[2] = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            double npre = 0, vmax = 0;
            for (int t = 0; t < T; t++) {
                double vn = att_norm(att_row(&c, v, KV, b, t, h / g), hd);
                npre += vn;
                if (vn > vmax || vn != vn) vmax = vn;
                double on = att_norm(att_row(&c, dout, H, b, t, h), hd);
                out[0] += rel * on * npre + 1e-30;
                out[1] += 2.0 * rel * 2.0 * on * vmax + 1e-30;
            }
        }
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < KV; kh++)
            for (int i = 0; i < hd; i++) {
                double sa = 0;
                for (int t = 0; t < T; t++)
                    for (int h = kh * g; h < kh * g + g; h++) sa += fabs(att_row(&c, dout, H, b, t, h)[i]);
                out[2] += 2.0 * rel * sa + 1e-30;
            }
}

#endif
