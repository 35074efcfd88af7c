/* rgg.h: the Residual Gain Guard (docs/design.md, the method, paper Section 4.1 and Appendix A.2), host side,
 * shared by both trainers. It needs only the per-token mean squares the RMSNorm kernels already keep.
 *
 * Gain. For monitored layer l and path p (attn: x_in = the layer input, x_out = x + o_proj; mlp:
 * x_in = that, x_out = the block output), R(x) = sqrt(mean over tokens of the per-token mean square)
 * and g = log(R(x_out) + eps) - log(R(x_in) + eps), eps = 1e-12. The mean squares come from the norm
 * that reads each residual: attn_norm (x_in of attn), mlp_norm (x_out of attn = x_in of mlp), and the
 * next layer's attn_norm or the final norm (x_out of mlp).
 *
 * Peers. Every observation of a step -- each microbatch on each rank, n_obs = ranks x microbatches,
 * all computed with the same weights on different data -- is compared with the median of the others:
 * e_o = g_o - median_{j != o} g_j. With several ranks this is the paper's cross-rank reference; on one
 * GPU or one process the other microbatches of the step are the peers (docs/design.md, beyond the paper). It needs
 * n_obs >= 3 (with two, both deviations are mirror images and the dominance rule can never fire).
 *
 * Window. H_{l,p} holds the deviations of the last W = 64 accepted steps; each step contributes its
 * n_obs - 1 deviations of smallest |e| (the largest is dropped). mu = median(H),
 * s = max(1.4826 median|h - mu|, 1e-6). Scores: z_o = |e_o - mu| / s, rel_o = exp(|e_o|) - 1.
 * Thresholds: tau_z = alpha max(floor_z, max_H |h - mu| / s), tau_rel = alpha max(floor_rel, max_H
 * (exp(|h|) - 1)), alpha = 2.5, floors = the largest clean scores of a calibration run (100 clean steps,
 * the first 64 seed H). Alarm when the largest score reaches its threshold and is at least 1.5 times
 * the second largest (z and rel alike), or at once when a mean square is non-finite or negative.
 * Non-finite values and observations of a rejected (alarmed) attempt never enter H. The window lives in
 * the process; the calibration file (seed window and floors) is what a restart reloads. */
#ifndef TSDC_RGG_H
#define TSDC_RGG_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../host/checksum.h"
#include "../host/utils.h"

#define RGG_MAX_MON 16
#define RGG_EPS 1e-12
enum { RGG_ATTN = 0, RGG_MLP = 1 };

typedef struct {
    int n_layer, n_mon, layers[RGG_MAX_MON];
    int n_obs, W;
    double alpha, dominance;
    double* win;               /* [n_mon][2][W][n_obs-1] deviations */
    int count[RGG_MAX_MON][2]; /* accepted steps stored */
    int head[RGG_MAX_MON][2];  /* next ring slot */
    double floor_z[RGG_MAX_MON][2], floor_rel[RGG_MAX_MON][2];
    int have_floors;
    /* calibration: the largest scores seen once the window is seeded */
    int calibrating, cal_steps;
    double cal_z[RGG_MAX_MON][2], cal_rel[RGG_MAX_MON][2];
    double* seed;              /* the first W accepted deviation sets, for the calibration file */
    int seed_count;
} Rgg;

typedef struct {
    int alarm;                  /* any (layer, path) alarmed */
    int n_alarms;
    int layer, path, obs;       /* the first alarm: monitored layer, path, observation (rank*A + mb) */
    char why[32];               /* "z", "rel" or "nonfinite" */
    double z, tau_z, rel, tau_rel;
    double max_z, max_rel;      /* largest scores of the step (over all layers and paths) */
} RggResult;

/* default monitored layers: four evenly spaced, {0, k, 2k, 3k} with k = (L-1)/3 ({0,5,10,15} for 16
 * layers, {0,9,18,27} for 28); every layer when L < 4 */
static int rgg_default_layers(int L, int* out) {
    if (L < 4) { for (int i = 0; i < L; i++) out[i] = i; return L; }
    int k = (L - 1) / 3;
    for (int i = 0; i < 4; i++) out[i] = i * k;
    return 4;
}

static void rgg_init(Rgg* r, int n_layer, const int* layers, int n_mon, int n_obs, int W, double alpha) {
    memset(r, 0, sizeof(*r));
    if (n_mon < 1 || n_mon > RGG_MAX_MON) tsdc_fail("-rgg_layers: between 1 and %d monitored layers (got %d)", RGG_MAX_MON, n_mon);
    if (n_obs < 3)
        tsdc_fail("the Residual Gain Guard needs at least 3 observations a step (ranks x -accum = %d): raise -accum or the ranks", n_obs);
    r->n_layer = n_layer; r->n_mon = n_mon; r->n_obs = n_obs; r->W = W; r->alpha = alpha; r->dominance = 1.5;
    for (int i = 0; i < n_mon; i++) {
        if (layers[i] < 0 || layers[i] >= n_layer) tsdc_fail("-rgg_layers: layer %d does not exist (the model has %d)", layers[i], n_layer);
        r->layers[i] = layers[i];
    }
    r->win = (double*)callocCheck((size_t)n_mon * 2 * W * (n_obs - 1), sizeof(double));
    r->seed = (double*)callocCheck((size_t)n_mon * 2 * W * (n_obs - 1), sizeof(double));
}
static void rgg_free(Rgg* r) { free(r->win); free(r->seed); r->win = r->seed = NULL; }

/* the gain from the two sums of mean squares over n tokens (the GPU reduces them on the device:
 * llmc/sdc/rgg.cuh) */
static double residual_gain_sums(double sum_in, double sum_out, int n) {
    return log(sqrt(sum_out / n) + RGG_EPS) - log(sqrt(sum_in / n) + RGG_EPS);
}
/* the gain of one residual writeback from the per-token mean squares of its input and output;
 * NaN when any mean square is non-finite or negative (an immediate alarm) */
static double residual_gain(const float* ms_in, const float* ms_out, int n) {
    double a = 0, b = 0;
    for (int i = 0; i < n; i++) {
        if (!(ms_in[i] >= 0) || !(ms_out[i] >= 0) || isinf(ms_in[i]) || isinf(ms_out[i])) return NAN;
        a += ms_in[i]; b += ms_out[i];
    }
    return residual_gain_sums(a, b, n);
}

static int rgg_cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
static double rgg_median(double* v, int n) { /* sorts v */
    qsort(v, (size_t)n, sizeof(double), rgg_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static double* rgg_slot(Rgg* r, int i, int p, int slot) { return r->win + (((size_t)i * 2 + p) * r->W + slot) * (r->n_obs - 1); }

/* deviations e_o = g_o - median of the others (g: [n_obs]) */
static void rgg_deviations(const Rgg* r, const double* g, double* e) {
    double* tmp = (double*)mallocCheck(sizeof(double) * r->n_obs);
    for (int o = 0; o < r->n_obs; o++) {
        int k = 0;
        for (int j = 0; j < r->n_obs; j++) if (j != o) tmp[k++] = g[j];
        e[o] = g[o] - rgg_median(tmp, k);
    }
    free(tmp);
}

/* mu and s of a window, and its largest z and rel (the data-driven part of the thresholds) */
static void rgg_window_stats(Rgg* r, int i, int p, double* mu, double* s, double* hz, double* hrel) {
    int nh = r->count[i][p] * (r->n_obs - 1);
    double* h = (double*)mallocCheck(sizeof(double) * (nh ? nh : 1));
    for (int c = 0; c < r->count[i][p]; c++) memcpy(h + (size_t)c * (r->n_obs - 1), rgg_slot(r, i, p, c), sizeof(double) * (r->n_obs - 1));
    double* dev = (double*)mallocCheck(sizeof(double) * (nh ? nh : 1));
    memcpy(dev, h, sizeof(double) * nh);
    *mu = rgg_median(dev, nh);
    for (int k = 0; k < nh; k++) dev[k] = fabs(h[k] - *mu);
    double mad = rgg_median(dev, nh);
    *s = fmax(1.4826 * mad, 1e-6);
    *hz = 0; *hrel = 0;
    for (int k = 0; k < nh; k++) { *hz = fmax(*hz, fabs(h[k] - *mu) / *s); *hrel = fmax(*hrel, exp(fabs(h[k])) - 1.0); }
    free(h); free(dev);
}

/* score a step. g: [n_obs][n_mon][2] gains (NaN = non-finite mean square). Without a seeded window (no
 * calibration loaded and fewer than W accepted steps) only the non-finite check can alarm. */
static RggResult rgg_check(Rgg* r, const double* g) {
    RggResult res;
    memset(&res, 0, sizeof(res));
    res.layer = res.obs = -1;
    double* gi = (double*)mallocCheck(sizeof(double) * r->n_obs);
    double* e = (double*)mallocCheck(sizeof(double) * r->n_obs);
    for (int i = 0; i < r->n_mon; i++)
        for (int p = 0; p < 2; p++) {
            int bad = -1;
            for (int o = 0; o < r->n_obs; o++) {
                gi[o] = g[((size_t)o * r->n_mon + i) * 2 + p];
                if (!isfinite(gi[o]) && bad < 0) bad = o;
            }
            if (bad >= 0) {
                if (!res.alarm) { res.layer = r->layers[i]; res.path = p; res.obs = bad; snprintf(res.why, sizeof(res.why), "nonfinite"); }
                res.alarm = 1; res.n_alarms++;
                continue;
            }
            int seeded = r->count[i][p] >= r->W || (r->have_floors && r->count[i][p] > 0);
            if (!seeded) continue;
            rgg_deviations(r, gi, e);
            double mu, s, hz, hrel;
            rgg_window_stats(r, i, p, &mu, &s, &hz, &hrel);
            double z1 = -1, z2 = -1, r1 = -1, r2 = -1; int oz = 0, orl = 0;
            for (int o = 0; o < r->n_obs; o++) {
                double z = fabs(e[o] - mu) / s, rel = exp(fabs(e[o])) - 1.0;
                if (z > z1) { z2 = z1; z1 = z; oz = o; } else if (z > z2) z2 = z;
                if (rel > r1) { r2 = r1; r1 = rel; orl = o; } else if (rel > r2) r2 = rel;
            }
            res.max_z = fmax(res.max_z, z1); res.max_rel = fmax(res.max_rel, r1);
            if (r->calibrating) { r->cal_z[i][p] = fmax(r->cal_z[i][p], z1); r->cal_rel[i][p] = fmax(r->cal_rel[i][p], r1); continue; }
            double tz = r->alpha * fmax(r->floor_z[i][p], hz), tr = r->alpha * fmax(r->floor_rel[i][p], hrel);
            int az = z1 >= tz && z1 >= r->dominance * z2;
            int ar = r1 >= tr && r1 >= r->dominance * r2;
            if (az || ar) {
                if (!res.alarm) {
                    res.layer = r->layers[i]; res.path = p; res.obs = az ? oz : orl;
                    snprintf(res.why, sizeof(res.why), az ? "z" : "rel");
                    res.z = z1; res.tau_z = tz; res.rel = r1; res.tau_rel = tr;
                }
                res.alarm = 1; res.n_alarms++;
            }
        }
    free(gi); free(e);
    return res;
}

static int rgg_cmp_abs(const void* a, const void* b) {
    double x = fabs(*(const double*)a), y = fabs(*(const double*)b);
    return (x > y) - (x < y);
}
/* admit an accepted, alarm-free step into the windows (and the seed, while calibrating) */
static void rgg_admit(Rgg* r, const double* g) {
    double* gi = (double*)mallocCheck(sizeof(double) * r->n_obs);
    double* e = (double*)mallocCheck(sizeof(double) * r->n_obs);
    for (int i = 0; i < r->n_mon; i++)
        for (int p = 0; p < 2; p++) {
            int finite = 1;
            for (int o = 0; o < r->n_obs; o++) { gi[o] = g[((size_t)o * r->n_mon + i) * 2 + p]; finite &= isfinite(gi[o]); }
            if (!finite) continue;
            rgg_deviations(r, gi, e);
            qsort(e, (size_t)r->n_obs, sizeof(double), rgg_cmp_abs);        /* drop the largest |e| */
            memcpy(rgg_slot(r, i, p, r->head[i][p]), e, sizeof(double) * (r->n_obs - 1));
            r->head[i][p] = (r->head[i][p] + 1) % r->W;
            if (r->count[i][p] < r->W) r->count[i][p]++;
        }
    if (r->calibrating && r->seed_count < r->W) {
        for (int i = 0; i < r->n_mon; i++)
            for (int p = 0; p < 2; p++)
                memcpy(r->seed + (((size_t)i * 2 + p) * r->W + r->seed_count) * (r->n_obs - 1),
                       rgg_slot(r, i, p, (r->head[i][p] + r->W - 1) % r->W), sizeof(double) * (r->n_obs - 1));
        r->seed_count++;
    }
    if (r->calibrating) r->cal_steps++;
    free(gi); free(e);
}

/* ------------------------------------------------------------------------------ calibration file
 * "TSDCCAL\0", u32 version 1, i32 n_layer, n_mon, n_obs, W, layers[16], then f64 floor_z[16][2],
 * floor_rel[16][2], f64 seed window [n_mon][2][W][n_obs-1], u64 checksum of everything before it. */
static void rgg_write_calibration(const Rgg* r, const char* path) {
    if (r->seed_count < r->W)
        tsdc_fail("%s: calibration needs at least %d clean steps to seed the window (ran %d): raise -steps", path, r->W, r->seed_count);
    size_t nw = (size_t)r->n_mon * 2 * r->W * (r->n_obs - 1);
    size_t bytes = 8 + 4 + 4 * 4 + 4 * RGG_MAX_MON + 8 * RGG_MAX_MON * 2 * 2 + 8 * nw;
    uint8_t* buf = (uint8_t*)callocCheck(bytes + 8, 1);
    uint8_t* p = buf;
    memcpy(p, "TSDCCAL\0", 8); p += 8;
    uint32_t ver = 1; memcpy(p, &ver, 4); p += 4;
    int32_t hv[4] = {r->n_layer, r->n_mon, r->n_obs, r->W}; memcpy(p, hv, 16); p += 16;
    int32_t ly[RGG_MAX_MON] = {0}; for (int i = 0; i < r->n_mon; i++) ly[i] = r->layers[i];
    memcpy(p, ly, sizeof(ly)); p += sizeof(ly);
    double fz[RGG_MAX_MON][2] = {{0}}, fr[RGG_MAX_MON][2] = {{0}};
    for (int i = 0; i < r->n_mon; i++) for (int q = 0; q < 2; q++) { fz[i][q] = r->cal_z[i][q]; fr[i][q] = r->cal_rel[i][q]; }
    memcpy(p, fz, sizeof(fz)); p += sizeof(fz);
    memcpy(p, fr, sizeof(fr)); p += sizeof(fr);
    memcpy(p, r->seed, 8 * nw); p += 8 * nw;
    (void)p;
    file_write_checksummed(path, buf, bytes);
    free(buf);
}

/* load the seed window and floors; the file must match the model and the monitoring set-up */
static void rgg_load_calibration(Rgg* r, const char* path) {
    FILE* fp = fopen_regular(path, "calibration");
    long long size = file_size_of(fp, path);
    size_t fixed = 8 + 4 + 16 + 4 * RGG_MAX_MON + 8 * RGG_MAX_MON * 4;
    if (size < (long long)fixed + 8) tsdc_fail("%s: truncated calibration file (%lld bytes)", path, size);
    uint8_t* buf = (uint8_t*)mallocCheck((size_t)size);
    fread_exact(buf, (size_t)size, fp, path);
    fclose(fp);
    if (memcmp(buf, "TSDCCAL\0", 8) != 0) tsdc_fail("%s: not a train_sdc calibration file (bad magic)", path);
    uint32_t ver; memcpy(&ver, buf + 8, 4);
    if (ver != 1) tsdc_fail("%s: unsupported calibration version %u", path, ver);
    int32_t hv[4]; memcpy(hv, buf + 12, 16);
    if (hv[1] < 1 || hv[1] > RGG_MAX_MON || hv[2] < 3 || hv[3] < 1) tsdc_fail("%s: corrupt calibration header", path);
    size_t nw = (size_t)hv[1] * 2 * hv[3] * (hv[2] - 1);
    if ((size_t)size != fixed + 8 * nw + 8) tsdc_fail("%s: truncated calibration file (%lld bytes, header implies %zu)", path, size, fixed + 8 * nw + 8);
    uint64_t chk; memcpy(&chk, buf + size - 8, 8);
    if (tsdc_checksum(buf, (size_t)size - 8) != chk) tsdc_fail("%s: checksum mismatch (corrupted calibration file)", path);
    if (hv[0] != r->n_layer) tsdc_fail("%s: calibrated for %d layers, the model has %d", path, hv[0], r->n_layer);
    if (hv[1] != r->n_mon) tsdc_fail("%s: calibrated with %d monitored layers, this run monitors %d (-rgg_layers)", path, hv[1], r->n_mon);
    if (hv[2] != r->n_obs) tsdc_fail("%s: calibrated with %d observations a step (ranks x -accum), this run has %d", path, hv[2], r->n_obs);
    if (hv[3] != r->W) tsdc_fail("%s: calibrated with window %d, this run uses %d", path, hv[3], r->W);
    int32_t ly[RGG_MAX_MON]; memcpy(ly, buf + 28, sizeof(ly));
    for (int i = 0; i < r->n_mon; i++)
        if (ly[i] != r->layers[i]) tsdc_fail("%s: calibrated for monitored layer %d, this run monitors %d (-rgg_layers)", path, ly[i], r->layers[i]);
    const uint8_t* p = buf + 28 + sizeof(ly);
    double fz[RGG_MAX_MON][2], fr[RGG_MAX_MON][2];
    memcpy(fz, p, sizeof(fz)); p += sizeof(fz);
    memcpy(fr, p, sizeof(fr)); p += sizeof(fr);
    for (int i = 0; i < r->n_mon; i++) for (int q = 0; q < 2; q++) { r->floor_z[i][q] = fz[i][q]; r->floor_rel[i][q] = fr[i][q]; }
    memcpy(r->win, p, 8 * nw);
    for (int i = 0; i < r->n_mon; i++) for (int q = 0; q < 2; q++) { r->count[i][q] = r->W; r->head[i][q] = 0; }
    r->have_floors = 1;
    free(buf);
}

#endif
