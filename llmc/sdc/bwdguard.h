/* bwdguard.h: the backward guard (docs/design.md, beyond the paper, beyond the paper), host side, shared by both
 * trainers. A backward fault must not cost an update: exponent scaling alone cannot stop a flip that
 * sets a high exponent bit, and such a gradient is either non-finite (the update would be skipped) or
 * so large that global clipping shrinks the real gradient to nothing. The guard raises an alarm on both,
 * and the alarm replays the step's microbatches with injection off like every other alarm.
 *
 * Inputs of a step (after the all-reduce and the unscale by 2^-k, so k never moves them): whether any
 * gradient is non-finite, and the L2 norms of the gradient of every weight matrix and embedding
 * (llmc/host/config.h's layout order; not the norm weights, whose clean gradient norms swing up to 49x their
 * median in a short window), of every layer l (its parameters are one contiguous range), of the rest (embedding, final
 * norm, head) and of all of it (global): n_groups = n_matrices + n_layer + 2 series x_g = log(norm_g)
 * (log(1e-30) for a zero norm). The per-tensor groups are the sensitive ones (2026-12, the main job at
 * m = 10): a fault in dK of layer 0 that raised dK's RMS 200x blew layer 0's norm up only 5.7x, under the
 * 16x minimum threshold, so with per-layer groups alone it cost a corrupted update; W_K's own gradient norm
 * moves by about the factor of dK. The per-layer and global groups stay (a fault spread thinly over many
 * tensors of a layer still shows there). The per-tensor norms cost nothing extra on the GPU (one pass
 * computes them for the update, llmc/cuda/multi_tensor.cuh) and one pass over the gradients on the CPU.
 *
 * History. H_g holds the x_g of the last W accepted (alarm-free) steps (W = -bwd_window, 32).
 * mu_g = median(H_g); the blow-up of the step is d_g = x_g - mu_g (a log ratio to the median norm).
 * Threshold: tau_g = alpha * max(floor_g, max_{h in H_g} (h - mu_g), BWD_MIN_FLOOR), alpha = -bwd_alpha
 * (2.5), floor_g = the largest clean d_g of a calibration run (-bwd_calibrate), BWD_MIN_FLOOR = log 16 / 2.5
 * (no threshold below 16x the median norm: after a 20-step calibration a clean layer norm of tiny-llama at
 * B 2 x T 32 reached 9.7x its median, over the 7.8x its calibration implied; a blow-up under 16x costs at
 * most part of one update, and the lost-update metric counts 100x). Alarm when any d_g >= tau_g (one-sided: a norm that
 * shrinks loses nothing), or at once on a non-finite gradient. Without a calibration, the window seeds
 * itself from the first W accepted steps, on which only the non-finite check alarms (a shorter window
 * underestimates the clean spread: 8 steps gave 1% false alarms in early training), and the same 16x
 * minimum holds (BWD_MIN_FLOOR_UNCALIBRATED: a clean layer norm reached 2.2x its window's median with the
 * window's own spread giving 2.16x).
 * Values of alarmed attempts never enter H. The window lives in the process; the calibration file holds
 * the last W accepted vectors of the calibration run and the floors, and a restart reloads it. */
#ifndef TSDC_BWDGUARD_H
#define TSDC_BWDGUARD_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../host/checksum.h"
#include "../host/utils.h"

#define BWD_MIN_HISTORY 8
#define BWD_MIN_FLOOR 1.1090354888959125          /* log(16) / 2.5: no threshold below 16x the median */
#define BWD_MIN_FLOOR_UNCALIBRATED 1.1090354888959125   /* the same without a calibration */

typedef struct {
    int n_layer, n_tensors, n_groups, W;
    char (*names)[32];         /* [n_groups] the groups' names, for the log: "L3.wk", "layer 3", "other", "global" */
    double alpha;
    double* win;               /* [W][n_groups] accepted log norms, a ring */
    int count, head;
    double* floor_;            /* [n_groups] calibrated floors (0 without calibration) */
    int have_floors;
    int calibrating, cal_steps;
    double* cal_max;           /* [n_groups] largest clean d seen while calibrating */
} BwdGuard;

typedef struct {
    int alarm;
    int group;                 /* the group with the largest d / tau (-1: non-finite) */
    double d, tau;             /* its blow-up (log ratio) and threshold */
    double max_ratio;          /* largest d / tau over the groups (0 while unseeded) */
} BwdResult;

/* tensor_names[n_tensors]: the names of the tensors with a group of their own (the matrices), in layout order (groups 0..n_tensors-1); then
 * the layers, "other" and "global" */
static void bwd_init(BwdGuard* g, int n_layer, int n_tensors, const char (*tensor_names)[32], int W, double alpha) {
    memset(g, 0, sizeof(*g));
    g->n_layer = n_layer; g->n_tensors = n_tensors; g->n_groups = n_tensors + n_layer + 2; g->W = W; g->alpha = alpha;
    g->names = (char (*)[32])callocCheck((size_t)g->n_groups, 32);
    for (int i = 0; i < g->n_groups; i++) {
        if (i < n_tensors) snprintf(g->names[i], 32, "%s", tensor_names[i]);
        else if (i < n_tensors + n_layer) snprintf(g->names[i], 32, "layer %d", i - n_tensors);
        else snprintf(g->names[i], 32, "%s", i == g->n_groups - 2 ? "other" : "global");
    }
    g->win = (double*)callocCheck((size_t)W * g->n_groups, sizeof(double));
    g->floor_ = (double*)callocCheck((size_t)g->n_groups, sizeof(double));
    g->cal_max = (double*)callocCheck((size_t)g->n_groups, sizeof(double));
}
static void bwd_free(BwdGuard* g) {
    free(g->win); free(g->floor_); free(g->cal_max); free(g->names);
    g->win = g->floor_ = g->cal_max = NULL; g->names = NULL;
}

/* the name of a group, for the log: "L3.wk", "layer 3", "other", "global" */
static void bwd_group_name(const BwdGuard* g, int i, char* buf, size_t n) {
    if (i < 0 || i >= g->n_groups) snprintf(buf, n, "nonfinite");
    else snprintf(buf, n, "%s", g->names[i]);
}

static int bwd_cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
/* median of H_g and its largest h - mu (one-sided, as the alarm) */
static void bwd_stats(const BwdGuard* g, int i, double* mu, double* spread) {
    double h[1024];
    int n = g->count < 1024 ? g->count : 1024;
    for (int c = 0; c < n; c++) h[c] = g->win[(size_t)c * g->n_groups + i];
    qsort(h, (size_t)n, sizeof(double), bwd_cmp);
    *mu = n % 2 ? h[n / 2] : 0.5 * (h[n / 2 - 1] + h[n / 2]);
    *spread = fmax(h[n - 1] - *mu, 0.0);
}

/* the log norms of a step from the squared norms of its groups (sumsq[n_groups]) */
static void bwd_log_norms(const BwdGuard* g, const double* sumsq, double* x) {
    for (int i = 0; i < g->n_groups; i++) x[i] = log(fmax(sqrt(sumsq[i]), 1e-30));
}

/* score a step: nonfinite = a gradient is non-finite (x is then not looked at) */
static BwdResult bwd_check(BwdGuard* g, int nonfinite, const double* x) {
    BwdResult r = {0, -1, 0, 0, 0};
    if (nonfinite) { r.alarm = 1; return r; }
    int seeded = g->count >= g->W || (g->have_floors && g->count > 0);
    if (!seeded) return r;
    for (int i = 0; i < g->n_groups; i++) {
        if (!isfinite(x[i])) { r.alarm = 1; r.group = -1; return r; }
        double mu, spread;
        bwd_stats(g, i, &mu, &spread);
        double d = x[i] - mu;
        if (g->calibrating) g->cal_max[i] = fmax(g->cal_max[i], d);
        double tau = g->alpha * fmax(fmax(g->floor_[i], spread), g->have_floors ? BWD_MIN_FLOOR : BWD_MIN_FLOOR_UNCALIBRATED);
        double ratio = d / tau;
        if (ratio > r.max_ratio || r.group < 0) { r.max_ratio = ratio; r.group = i; r.d = d; r.tau = tau; }
    }
    if (!g->calibrating && r.max_ratio >= 1.0) r.alarm = 1;
    return r;
}

/* admit an accepted, alarm-free step */
static void bwd_admit(BwdGuard* g, const double* x) {
    for (int i = 0; i < g->n_groups; i++) if (!isfinite(x[i])) return;
    memcpy(g->win + (size_t)g->head * g->n_groups, x, sizeof(double) * g->n_groups);
    g->head = (g->head + 1) % g->W;
    if (g->count < g->W) g->count++;
    if (g->calibrating) g->cal_steps++;
}

/* ------------------------------------------------------------------------------ calibration file
 * "TSDCBWD\0", u32 version 2 (version 1: per-layer groups only, refused), i32 n_layer, n_groups, W, count, then f64 floors[n_groups], f64 the window in
 * age order, oldest first [count][n_groups], u64 checksum of everything before it. */
static void bwd_write_calibration(const BwdGuard* g, const char* path) {
    if (g->count < BWD_MIN_HISTORY)
        tsdc_fail("%s: the backward guard's calibration needs at least %d clean steps (ran %d): raise -steps", path, BWD_MIN_HISTORY, g->count);
    size_t nw = (size_t)g->count * g->n_groups;
    size_t bytes = 8 + 4 + 16 + 8 * (size_t)g->n_groups + 8 * nw;
    uint8_t* buf = (uint8_t*)callocCheck(bytes + 8, 1);
    uint8_t* p = buf;
    memcpy(p, "TSDCBWD\0", 8); p += 8;
    uint32_t ver = 2; memcpy(p, &ver, 4); p += 4;
    int32_t hv[4] = {g->n_layer, g->n_groups, g->W, g->count}; memcpy(p, hv, 16); p += 16;
    memcpy(p, g->cal_max, 8 * (size_t)g->n_groups); p += 8 * (size_t)g->n_groups;
    int start = g->count < g->W ? 0 : g->head;
    for (int c = 0; c < g->count; c++) {
        memcpy(p, g->win + (size_t)((start + c) % g->W) * g->n_groups, 8 * (size_t)g->n_groups);
        p += 8 * (size_t)g->n_groups;
    }
    (void)p;
    file_write_checksummed(path, buf, bytes);
    free(buf);
}

static void bwd_load_calibration(BwdGuard* g, const char* path) {
    FILE* fp = fopen_regular(path, "the backward guard's calibration");
    long long size = file_size_of(fp, path);
    if (size < 8 + 4 + 16 + 8) tsdc_fail("%s: truncated backward-guard calibration file (%lld bytes)", path, size);
    uint8_t* buf = (uint8_t*)mallocCheck((size_t)size);
    fread_exact(buf, (size_t)size, fp, path);
    fclose(fp);
    if (memcmp(buf, "TSDCBWD\0", 8) != 0) tsdc_fail("%s: not a backward-guard calibration file (bad magic)", path);
    uint32_t ver; memcpy(&ver, buf + 8, 4);
    if (ver == 1) tsdc_fail("%s: a version-1 backward-guard calibration (per-layer groups only); the guard now also watches every "
                            "tensor: recalibrate with -bwd_calibrate", path);
    if (ver != 2) tsdc_fail("%s: unsupported backward-guard calibration version %u", path, ver);
    int32_t hv[4]; memcpy(hv, buf + 12, 16);
    if (hv[0] < 1 || hv[1] < hv[0] + 2 || hv[2] < 1 || hv[3] < 1 || hv[3] > hv[2]) tsdc_fail("%s: corrupt backward-guard calibration header", path);
    size_t need = 8 + 4 + 16 + 8 * (size_t)hv[1] + 8 * (size_t)hv[3] * hv[1] + 8;
    if ((size_t)size != need) tsdc_fail("%s: truncated backward-guard calibration file (%lld bytes, header implies %zu)", path, size, need);
    uint64_t chk; memcpy(&chk, buf + size - 8, 8);
    if (tsdc_checksum(buf, (size_t)size - 8) != chk) tsdc_fail("%s: checksum mismatch (corrupted backward-guard calibration file)", path);
    if (hv[0] != g->n_layer) tsdc_fail("%s: calibrated for %d layers, the model has %d", path, hv[0], g->n_layer);
    if (hv[1] != g->n_groups) tsdc_fail("%s: calibrated for %d gradient groups, this model has %d (another architecture)", path, hv[1], g->n_groups);
    const uint8_t* p = buf + 28;
    memcpy(g->floor_, p, 8 * (size_t)g->n_groups); p += 8 * (size_t)g->n_groups;
    /* the newest min(count, W) vectors fill this run's window */
    int n = hv[3] < g->W ? hv[3] : g->W;
    p += 8 * (size_t)(hv[3] - n) * g->n_groups;
    g->count = 0; g->head = 0;
    for (int c = 0; c < n; c++) {
        memcpy(g->win + (size_t)c * g->n_groups, p, 8 * (size_t)g->n_groups);
        p += 8 * (size_t)g->n_groups;
    }
    g->count = n; g->head = n % g->W;
    g->have_floors = 1;
    free(buf);
}

#endif
