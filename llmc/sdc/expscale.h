/* expscale.h: choosing the exponent-scaling shift k from the run's own gradient profile (docs/design.md
 * section 6, paper Section 4.2, eq. 16-17), host side, shared by both trainers. The same math as
 * scripts/expscale_select.py (which reads a -exp_profile file); here the trainer applies it itself at
 * the start of protection (-protect all, or -expscale_k auto).
 *
 * H: counts of the bf16/fp32 exponent codes (bits 23..30; 0 and 255 excluded) of dL/dY at every linear
 * layer, pooled, profiled while the loss was scaled by 2^k0 (codes shifted down by k0 here).
 * For a candidate k every code c becomes c + k; a fault that flips exponent bit j multiplies the value
 * by 2^(2^j) when that bit is 0 (amplifies) and divides it when it is 1. The risk
 *     R_amp(k; H) = sum_{j=0..7} P_H(bit j of (c + k) == 0) * (2^(2^j) - 1)^2
 * (compared exactly: expscale_risk below); K_safe = the k in
 * [kmin, kmax] that keep every shifted code finite and normal (max c + k < 255, min c + k >= 1);
 * k* = argmin R_amp over K_safe, the smallest k on ties. Hold rule: a held k stays while
 * R_amp(k_held) <= 1.25 R_amp(k*). */
#ifndef TSDC_EXPSCALE_H
#define TSDC_EXPSCALE_H

#include <math.h>
#include <stdint.h>

#define EXPSCALE_HOLD 1.25

/* R_amp(k) of an unscaled code histogram h[256] (codes 1..254), approximately (for printing) */
static long double expscale_r_amp(const double* h, int k) {
    long double num = 0, tot = 0;
    for (int c = 1; c < 255; c++) {
        if (h[c] <= 0) continue;
        tot += h[c];
        int s = c + k;
        for (int j = 0; j < 8; j++)
            if (!((s >> j) & 1)) {
                long double w = ldexpl(1.0L, 1 << j) - 1.0L;
                num += (long double)h[c] * w * w;
            }
    }
    return tot > 0 ? num / tot : 0;
}

/* R_amp(k) compared exactly (as scripts/expscale_select.py does with fractions): with Z_j the number of
 * samples whose bit j of c + k is 0 (the total N is the same for every k), N R_amp = sum_j Z_j w_j,
 * w_j = (2^(2^j) - 1)^2. For j >= 5, w_j exceeds N times the sum of the lower weights for any N < 2^32, so
 * Z_7, Z_6, Z_5 decide in that order; the rest, sum_{j<=4} Z_j w_j < 2^32 * 2^33, is an exact 128-bit
 * integer. (Summed in floating point, 2^256-sized terms drown the lower ones and every k whose codes all
 * have bit 7 set looks alike.) Returns <0, 0, >0. */
typedef struct { uint64_t z7, z6, z5; unsigned __int128 low; } ExpScaleRisk;
static ExpScaleRisk expscale_risk(const double* h, int k) {
    ExpScaleRisk r = {0, 0, 0, 0};
    for (int c = 1; c < 255; c++) {
        if (h[c] <= 0) continue;
        uint64_t n = (uint64_t)h[c];
        int s = c + k;
        if (!((s >> 7) & 1)) r.z7 += n;
        if (!((s >> 6) & 1)) r.z6 += n;
        if (!((s >> 5) & 1)) r.z5 += n;
        for (int j = 0; j <= 4; j++)
            if (!((s >> j) & 1)) {
                unsigned __int128 w = ((unsigned __int128)1 << (1 << j)) - 1;
                r.low += (unsigned __int128)n * w * w;
            }
    }
    return r;
}
static int expscale_risk_cmp(const ExpScaleRisk* a, const ExpScaleRisk* b) {
    if (a->z7 != b->z7) return a->z7 < b->z7 ? -1 : 1;
    if (a->z6 != b->z6) return a->z6 < b->z6 ? -1 : 1;
    if (a->z5 != b->z5) return a->z5 < b->z5 ? -1 : 1;
    return a->low < b->low ? -1 : (a->low > b->low ? 1 : 0);
}

typedef struct {
    int k_star, k_lo, k_hi;     /* the choice and K_safe = [k_lo, k_hi] (k_star -1: empty histogram or no safe k) */
    int code_lo, code_hi;       /* unscaled codes seen */
    double samples;
    long double r_min;
} ExpScaleChoice;

/* k* from hist_scaled: [n_tensors][256] counts of the codes as computed under the shift k0 */
static ExpScaleChoice expscale_select_k(const double* hist_scaled, int n_tensors, int k0, int kmin, int kmax) {
    ExpScaleChoice ch = {-1, -1, -1, 256, -1, 0, 0};
    double h[256] = {0};
    for (int t = 0; t < n_tensors; t++)
        for (int code = 1; code < 255; code++) {
            double n = hist_scaled[(size_t)t * 256 + code];
            int c = code - k0;
            if (n <= 0 || c < 1) continue;
            h[c] += n;
        }
    for (int c = 1; c < 255; c++)
        if (h[c] > 0) { ch.samples += h[c]; if (c < ch.code_lo) ch.code_lo = c; ch.code_hi = c; }
    if (ch.samples == 0) return ch;
    ExpScaleRisk best = {0, 0, 0, 0};
    for (int k = kmin; k <= kmax; k++) {
        if (ch.code_hi + k >= 255 || ch.code_lo + k < 1) continue;
        if (ch.k_lo < 0) ch.k_lo = k;
        ch.k_hi = k;
        ExpScaleRisk r = expscale_risk(h, k);
        if (ch.k_star < 0 || expscale_risk_cmp(&r, &best) < 0) { ch.k_star = k; best = r; }   /* the smallest k on ties */
    }
    if (ch.k_star >= 0) ch.r_min = expscale_r_amp(h, ch.k_star);
    return ch;
}

#endif
