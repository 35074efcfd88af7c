/* detect.h: the baseline detectors of the comparison (docs/design.md, the baselines, paper Table 1), host side,
 * shared by both trainers. Each one, when it fires, triggers the same replay as TrainSDC's alarms
 * (discard the step's gradients, run every microbatch again with injection off, one update), so that
 * the comparison isolates detection.
 *
 *   loss     loss spike: the step's loss against the last W accepted losses,
 *            z = (loss - median) / max(1.4826 MAD, 0.01 |median|); alarm at z > -spike_z (6), or a
 *            non-finite loss.
 *   nan      Inf/NaN: a non-finite loss, or a non-finite gradient after the all-reduce (and unscale).
 *   abft     ATTNChecker-style checksums of the two attention matrix products (llmc/sdc/attcheck.h), in the
 *            forward; an alarm when any head's checksum fails.
 *   harmful  harmful update (after Altenbernd et al. 2026): the global gradient norm and the norm of the
 *            AdamW parameter change the update would make, both as logs, against the last W accepted
 *            steps: z = (x - median) / max(1.4826 MAD, 0.25); alarm at z > -harmful_z (6) for either, or a
 *            non-finite value. The update is computed (not applied) before deciding.
 *   llmft    LLMFT-style learned detector: logistic regression over the per-step features below,
 *            trained by scripts/llmft_train.py on one campaign's logged features (-detect_observe 1)
 *            and applied unchanged to others; alarm when the score reaches the model's threshold.
 *
 * Features (logged in every step line when a detector is on, the learned detector's inputs):
 *   z_loss, z_grad_norm, z_update_norm   the three z scores above (0 while the history has < 8 steps)
 *   nonfinite                            1 if the loss or a gradient is non-finite, else 0
 *   loss_jump                            (loss - previous accepted loss) / max(0.01 |previous|, 1e-6)
 * each clipped to [-50, 50], a non-finite one set to 50. History: only the values of accepted attempts on
 * which no detector fired enter the windows, so a caught fault never becomes the reference. The windows
 * live in the process (like the Residual Gain Guard's; a resumed run refills them in 8 steps). */
#ifndef TSDC_DETECT_H
#define TSDC_DETECT_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../host/utils.h"

enum { DET_LOSS = 0, DET_NAN, DET_ABFT, DET_HARMFUL, DET_LLMFT, DET_COUNT };
static const char* const DET_NAMES[DET_COUNT] __attribute__((unused)) = {"loss", "nan", "abft", "harmful", "llmft"};
#define DET_NF 5
static const char* const DET_FEATURES[DET_NF] __attribute__((unused)) = {"z_loss", "z_grad_norm", "z_update_norm",
                                                                        "nonfinite", "loss_jump"};
#define DET_MIN_HISTORY 8
#define DET_LOG_FLOOR 0.25           /* least spread of the log norms: z > 6 needs a norm 4.5x the median */

typedef struct {
    unsigned mask;             /* 1 << DET_* */
    int observe;               /* decide and log, never alarm */
    int W;
    double spike_z, harmful_z;
    double *h_loss, *h_gn, *h_un;   /* rings of accepted values (loss, log grad norm, log update norm) */
    int n, head;
    double prev_loss;
    int have_prev;
    /* the learned detector */
    int have_llmft;
    double mean[DET_NF], sd[DET_NF], w[DET_NF], bias, threshold;
} Detect;

typedef struct {
    unsigned fired;            /* 1 << DET_* of the detectors that fired (computed ones only) */
    double feat[DET_NF];
    double score;              /* learned detector's probability, NAN without a model */
} DetectOut;

static int det_cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
/* median and MAD of the n values of a ring (n <= W) */
static void det_median_mad(const double* h, int n, double* med, double* mad) {
    double* t = (double*)mallocCheck(sizeof(double) * (n ? n : 1));
    memcpy(t, h, sizeof(double) * n);
    qsort(t, n, sizeof(double), det_cmp);
    *med = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    for (int i = 0; i < n; i++) t[i] = fabs(t[i] - *med);
    qsort(t, n, sizeof(double), det_cmp);
    *mad = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
}
static double det_clip(double x) { return x != x || x > 50 ? 50 : (x < -50 ? -50 : x); }

static unsigned detect_parse(const char* list) {
    unsigned mask = 0;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "none")) continue;
        int k = -1;
        for (int i = 0; i < DET_COUNT; i++) if (!strcmp(tok, DET_NAMES[i])) k = i;
        if (k < 0) tsdc_fail("flag -detect: '%s' is not none, loss, nan, abft, harmful or llmft", tok);
        mask |= 1u << k;
    }
    return mask;
}

/* the learned detector's model file: text, written by scripts/llmft_train.py
 *   TSDC-LLMFT 1
 *   features z_loss z_grad_norm z_update_norm nonfinite loss_jump
 *   mean <5 numbers>      std <5 numbers>      weights <5 numbers>
 *   bias <x>              threshold <p in (0,1)> */
static void detect_load_llmft(Detect* d, const char* path) {
    FILE* fp = fopen(path, "r");
    if (!fp) tsdc_fail("-llmft_model %s: cannot open: %s", path, strerror(errno));
    char word[64];
    int ver = 0;
    if (fscanf(fp, "%63s %d", word, &ver) != 2 || strcmp(word, "TSDC-LLMFT") || ver != 1)
        tsdc_fail("-llmft_model %s: not a learned-detector model (expected 'TSDC-LLMFT 1' first)", path);
    int got = 0;
    while (fscanf(fp, "%63s", word) == 1) {
        double* dst = !strcmp(word, "mean") ? d->mean : !strcmp(word, "std") ? d->sd : !strcmp(word, "weights") ? d->w : NULL;
        if (!strcmp(word, "features")) {
            for (int i = 0; i < DET_NF; i++) {
                char f[64];
                if (fscanf(fp, "%63s", f) != 1 || strcmp(f, DET_FEATURES[i]))
                    tsdc_fail("-llmft_model %s: feature %d must be %s (this trainer's feature set)", path, i, DET_FEATURES[i]);
            }
            got |= 1;
        } else if (dst) {
            for (int i = 0; i < DET_NF; i++)
                if (fscanf(fp, "%lf", &dst[i]) != 1 || !isfinite(dst[i])) tsdc_fail("-llmft_model %s: bad or missing value in '%s'", path, word);
            got |= dst == d->mean ? 2 : dst == d->sd ? 4 : 8;
        } else if (!strcmp(word, "bias")) {
            if (fscanf(fp, "%lf", &d->bias) != 1 || !isfinite(d->bias)) tsdc_fail("-llmft_model %s: bad bias", path);
            got |= 16;
        } else if (!strcmp(word, "threshold")) {
            if (fscanf(fp, "%lf", &d->threshold) != 1 || !(d->threshold > 0 && d->threshold < 1))
                tsdc_fail("-llmft_model %s: threshold must be in (0, 1)", path);
            got |= 32;
        } else tsdc_fail("-llmft_model %s: unknown entry '%s'", path, word);
    }
    fclose(fp);
    if (got != 63) tsdc_fail("-llmft_model %s: incomplete (needs features, mean, std, weights, bias, threshold)", path);
    for (int i = 0; i < DET_NF; i++) if (!(d->sd[i] > 0)) tsdc_fail("-llmft_model %s: std must be positive", path);
    d->have_llmft = 1;
}

static void detect_init(Detect* d, unsigned mask, int observe, int W, double spike_z, double harmful_z, const char* llmft) {
    memset(d, 0, sizeof(*d));
    d->mask = mask; d->observe = observe; d->W = W; d->spike_z = spike_z; d->harmful_z = harmful_z;
    d->h_loss = (double*)callocCheck((size_t)W, sizeof(double));
    d->h_gn = (double*)callocCheck((size_t)W, sizeof(double));
    d->h_un = (double*)callocCheck((size_t)W, sizeof(double));
    if (mask & (1u << DET_LLMFT)) {
        if (!llmft || !llmft[0]) tsdc_fail("%s", "flag -detect llmft needs -llmft_model FILE (scripts/llmft_train.py writes it)");
        detect_load_llmft(d, llmft);
    } else if (llmft && llmft[0]) tsdc_fail("%s", "flag -llmft_model needs -detect llmft");
}
static void detect_free(Detect* d) { free(d->h_loss); free(d->h_gn); free(d->h_un); }
/* does the step need the update norm (a pass over the optimizer state)? */
static int detect_needs_norms(const Detect* d) { return (d->mask & ((1u << DET_HARMFUL) | (1u << DET_LLMFT))) != 0; }

static double det_z(const double* h, int n, double x, double floor_abs, double floor_rel) {
    if (!isfinite(x)) return INFINITY;
    if (n < DET_MIN_HISTORY) return 0;
    double med, mad;
    det_median_mad(h, n, &med, &mad);
    double s = 1.4826 * mad;
    if (s < floor_abs) s = floor_abs;
    if (s < floor_rel * fabs(med)) s = floor_rel * fabs(med);
    return (x - med) / s;
}

/* the step's verdicts. loss: the step's mean loss; nonfinite_grad: a gradient is non-finite; gn, un: grad
 * norm and update norm (NAN when not computed); abft: failed attention checksums in the step's forward */
static DetectOut detect_check(const Detect* d, double loss, int nonfinite_grad, double gn, double un, int abft) {
    DetectOut o;
    memset(&o, 0, sizeof(o));
    int n = d->n < d->W ? d->n : d->W;
    int nonfinite = !isfinite(loss) || nonfinite_grad;
    double lgn = gn > 0 ? log(gn) : (gn == 0 ? -700 : gn), lun = un > 0 ? log(un) : (un == 0 ? -700 : un);
    o.feat[0] = det_clip(det_z(d->h_loss, n, loss, 0, 0.01));
    o.feat[1] = d->mask & ((1u << DET_HARMFUL) | (1u << DET_LLMFT)) ? det_clip(nonfinite_grad ? INFINITY : det_z(d->h_gn, n, lgn, DET_LOG_FLOOR, 0)) : 0;
    o.feat[2] = d->mask & ((1u << DET_HARMFUL) | (1u << DET_LLMFT)) ? det_clip(nonfinite_grad ? INFINITY : det_z(d->h_un, n, lun, DET_LOG_FLOOR, 0)) : 0;
    o.feat[3] = nonfinite;
    double pj = d->prev_loss;
    o.feat[4] = !d->have_prev ? 0 : det_clip((loss - pj) / fmax(0.01 * fabs(pj), 1e-6));
    if ((d->mask & (1u << DET_LOSS)) && (!isfinite(loss) || o.feat[0] > d->spike_z)) o.fired |= 1u << DET_LOSS;
    if ((d->mask & (1u << DET_NAN)) && nonfinite) o.fired |= 1u << DET_NAN;
    if ((d->mask & (1u << DET_ABFT)) && abft > 0) o.fired |= 1u << DET_ABFT;
    if ((d->mask & (1u << DET_HARMFUL)) && (nonfinite || o.feat[1] > d->harmful_z || o.feat[2] > d->harmful_z))
        o.fired |= 1u << DET_HARMFUL;
    o.score = NAN;
    if (d->have_llmft) {
        double zsum = d->bias;
        for (int i = 0; i < DET_NF; i++) zsum += d->w[i] * (o.feat[i] - d->mean[i]) / d->sd[i];
        o.score = 1.0 / (1.0 + exp(-zsum));
        if (o.score >= d->threshold) o.fired |= 1u << DET_LLMFT;
    }
    return o;
}

/* the accepted attempt's values enter the history (only finite ones, and only when no detector fired) */
static void detect_admit(Detect* d, double loss, double gn, double un, unsigned fired) {
    if (fired || !isfinite(loss)) return;
    if (detect_needs_norms(d) && !(isfinite(gn) && gn > 0 && isfinite(un) && un > 0)) return;
    d->h_loss[d->head] = loss;
    d->h_gn[d->head] = gn > 0 ? log(gn) : 0;
    d->h_un[d->head] = un > 0 ? log(un) : 0;
    d->head = (d->head + 1) % d->W;
    d->n++;
    d->prev_loss = loss;
    d->have_prev = 1;
}

/* "loss,harmful" */
static void detect_names(unsigned fired, char* buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < DET_COUNT; i++)
        if (fired & (1u << i)) snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? "," : "", DET_NAMES[i]);
}

#endif
