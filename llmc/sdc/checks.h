/* checks.h: every kind of protection, declared once, and the protection state both trainers keep.
 *
 * PROT_KINDS is the one table that the host loop reads for all it does with a kind: parsing -protect
 * (name, membership of "paper" and "all"), which trainer provides it, the step's alarm (the OR of the
 * enabled kinds that fired), the alarm count and the log's "by" field, the alarm's description, and the
 * end summary's counts. Adding a kind is a row here (and, for a check inside the passes, its CHECK_* index
 * and its kernel); nothing in the loop names a kind. The order is the order of the log's "by" field and
 * of the description's priority (the first kind that fired describes the alarm).
 *
 * Kinds counted inside the passes (check >= 0) report through model_check_alarms: the number of failed
 * comparisons (or heads) and the first layer, per microbatch. rgg and bwd are decided on the host from the
 * gathered statistics (llmc/sdc/rgg.h, llmc/sdc/bwdguard.h); exp (exponent scaling) never alarms, it changes what a
 * fault does; the baseline detectors (llmc/sdc/detect.h, -detect) alarm through the same replay and are the
 * last kind, outside -protect. */
#ifndef TSDC_CHECKS_H
#define TSDC_CHECKS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "attcheck.h"   /* CHECK_* */
#include "fault.h"      /* FaultCtx */
#include "../host/rng.h"
#include "../host/logger.h"  /* jnum (the test-only dump) */

enum { PK_QK, PK_RGG, PK_ATT, PK_QK_BWD, PK_ATT_BWD, PK_EW, PK_BOUND, PK_BWD, PK_EXP, PK_DETECT, PK_COUNT };

typedef struct {
    const char* name;       /* in -protect, the log's "by" field, the alarm description and the summary */
    int check;              /* model_check_alarms kind (CHECK_*), or -1 (decided on the host, or no alarm) */
    const char* one;        /* what an alarm counts, for the description: one, several */
    const char* many;
    int paper;              /* in -protect paper (the paper's method) */
    int all;                /* in -protect all (0: not a -protect component: the detectors) */
    int gpu;                /* the CUDA trainer provides it (the CPU trainer provides every kind); a kind it lacks is
                               an error when -protect names it, alone or through paper or all (protect_parse) */
    const char* what;       /* one line: what it checks */
} ProtKind;

static const ProtKind PROT_KINDS[PK_COUNT] __attribute__((unused)) = {
    {"qk", CHECK_QK, "mismatch", "mismatches", 1, 1, 1, "Q/K path recomputed, compared through 128-bit fingerprints"},
    {"rgg", -1, NULL, NULL, 1, 1, 1, "Residual Gain Guard: RMS gain of each residual writeback against its peers and history"},
    {"att", CHECK_ATT, "head failed", "heads failed", 0, 1, 1, "logits row checksums, probability rows sum to one"},
    {"qk_bwd", CHECK_QK_BWD, "mismatch", "mismatches", 0, 1, 1, "the backward's Q/K path recomputed and compared"},
    {"att_bwd", CHECK_ATT_BWD, "head failed", "heads failed", 0, 1, 1, "dprobs row checksums, dlogits rows sum to zero, dV column sums"},
    {"ew", CHECK_EW, "mismatch", "mismatches", 0, 1, 1, "element-wise kernels recomputed from their stored inputs"},
    {"bound", CHECK_BOUND, "product over its bound", "products over their bound", 0, 1, 1,
     "forward matrix-product outputs under |x_i| |w_j| (Cauchy-Schwarz, llmc/sdc/bound.h)"},
    {"bwd", -1, NULL, NULL, 0, 1, 1, "backward guard: non-finite gradients, gradient-norm blow-ups"},
    {"exp", -1, NULL, NULL, 1, 1, 1, "exponent scaling of the loss by 2^k (no alarm)"},
    {"detectors", -1, NULL, NULL, 0, 0, 1, "the baseline detectors of -detect"},
};

/* -protect LIST (comma-separated: none, paper, all, or the name of a kind with .all set) into on[PK_COUNT], given
 * the kinds this trainer provides (provided[k]); *all_named: the list names all. paper and all are sets, never
 * narrowed to what a trainer has: a member it lacks is an error as the kind named alone is. Returns 0, or 1 with
 * one line in err (no "error: " prefix): "'X' is not none, paper, all, qk, ... (see -h)" for an unknown name,
 * "-protect X: not available on this trainer" for a kind this trainer does not run (X: the kinds of paper or
 * all that it lacks, comma-separated, when the set was named). */
static __attribute__((unused)) int protect_parse(const char* list, const int provided[PK_COUNT], int on[PK_COUNT], int* all_named,
                                                 char* err, size_t errn) {
    char buf[256], names[256] = "";
    snprintf(buf, sizeof(buf), "%s", list);
    for (int k = 0; k < PK_COUNT; k++)
        if (PROT_KINDS[k].all) snprintf(names + strlen(names), sizeof(names) - strlen(names), ", %s", PROT_KINDS[k].name);
    *all_named = 0;
    char* save = NULL;
    for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "none")) continue;
        const int paper = !strcmp(tok, "paper"), all = !strcmp(tok, "all");
        char missing[160] = "";
        int found = paper || all;
        for (int k = 0; k < PK_COUNT; k++) {
            const ProtKind* K = &PROT_KINDS[k];
            if (!K->all || !((paper && K->paper) || all || !strcmp(tok, K->name))) continue;
            found = 1;
            if (provided[k]) on[k] = 1;
            else snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%s", missing[0] ? "," : "", K->name);
        }
        if (!found) {
            snprintf(err, errn, "flag -protect: '%s' is not none, paper, all%s (see -h)", tok, names);
            return 1;
        }
        if (missing[0]) {
            if (paper || all) snprintf(err, errn, "-protect %s: not available on this trainer (in -protect %s)", missing, tok);
            else snprintf(err, errn, "-protect %s: not available on this trainer", missing);
            return 1;
        }
        if (all) *all_named = 1;
    }
    return 0;
}

/* the protection state a trainer's model keeps (model->prot): which kinds its passes check, their alarms
 * since model_qk_reset, the fault injector's hooks and the exponent profile. One struct for both trainers,
 * set and read through the accessors of llmc/backend.h. */
typedef struct {
    FaultCtx* fx;                       /* fault injection (NULL: off) */
    int on[PK_COUNT];                   /* the kinds whose checks the passes run (on[PK_RGG]: the Residual Gain
                                           Guard's statistics gathered in each forward, also while calibrating) */
    int abft;                           /* the ABFT checksums of the attention products (-detect abft) */
    int alarms[CHECK_KINDS], first_layer[CHECK_KINDS];   /* since model_qk_reset, by kind */
    uint32_t* exp_hist;                 /* exponent profiling: [L.n][256] counts of dL/dY codes (host), NULL = off */
    int exp_samples;
    Rng exp_rng;
} Protect;

/* n alarms of a kind raised at layer l (the first layer that raised one is kept) */
static inline void protect_alarm(Protect* p, int kind, int l, int n) {
    if (n <= 0) return;
    if (!p->alarms[kind]) p->first_layer[kind] = l;
    p->alarms[kind] += n;
}

/* Test-only: TSDC_CHECK_DUMP=FILE makes both trainers append the statistics their guards read, one JSON line each,
 * so that tests/test_emu.py compares the trainers for the same forward or backward (check_dump_fwd / check_dump_bwd
 * count the calls of model_forward_step / model_backward_step from 1, replays included), layer and microbatch:
 *   "qkf"  per forward and layer (-protect qk): the Q/K recomputation's flag; on the GPU also the fingerprints of the
 *          Q and K attention consumed and of their recomputation as the device reduced them, and the CPU's
 *          qk_fingerprint of the downloaded Q and K
 *   "attf" per forward and layer (-protect att): failed heads of the logits and probability checks, and sums of
 *          what they read (att_fwd_stats: the bounds, the references, the logits' and the probabilities' row sums)
 *   "rgg"  per forward and monitored layer (-protect rgg, -rgg_calibrate): the three sums of per-token mean squares
 *          the layer's two gains come from, and the gains
 *   "gss"  per backward-guard evaluation (-protect bwd, -bwd_calibrate; bwd_norms counts them): every tensor's
 *          sum of squared (all-reduced, unscaled) gradients, in parameter order
 *   "mmb"  per forward, layer and product (-protect bound; the CPU trainer only): the outputs over their bound and the
 *          largest |y| / bound of the finite ones (how much room the clean outputs leave)
 *   "qkb", "att" per backward and layer (-protect qk_bwd, att_bwd): the layer's flag, and on the GPU the stored
 *          dq/dk fingerprints as the device reduced them and as qk_fingerprint computes them from a download; the
 *          failed heads per backward check and the sums of the checks' bounds
 * The GPU trainer synchronises inside its layer loop to write them: never set outside tests. */
static long long check_dump_bwd, check_dump_fwd;
static FILE* check_dump_file(void) {
    static int init = 0;
    static FILE* f = NULL;
    if (!init) {
        init = 1;
        const char* p = getenv("TSDC_CHECK_DUMP");
        if (p && *p && !(f = fopen(p, "a"))) {
            fprintf(stderr, "error: TSDC_CHECK_DUMP %s: cannot open for appending\n", p);
            exit(1);
        }
    }
    return f;
}

/* the dump's lines that both trainers write in the same form: a monitored layer's three sums of mean squares and
 * its two gains ("rgg"); a layer's forward attention checks, failed heads and att_fwd_stats' four sums ("attf") */
static void check_dump_rgg(int l, const double ss[3], double g_attn, double g_mlp) {
    fprintf(check_dump_file(), "{\"kind\":\"rgg\",\"fwd\":%lld,\"layer\":%d,\"ss\":[%s,%s,%s],\"gain\":[%s,%s]}\n", check_dump_fwd, l,
            jnum(ss[0]).s, jnum(ss[1]).s, jnum(ss[2]).s, jnum(g_attn).s, jnum(g_mlp).s);
}
static void check_dump_attf(int l, int n_logits, int n_probs, const double st[4]) {
    fprintf(check_dump_file(), "{\"kind\":\"attf\",\"fwd\":%lld,\"layer\":%d,\"att\":[%d,%d],\"sums\":[%s,%s,%s,%s]}\n", check_dump_fwd, l,
            n_logits, n_probs, jnum(st[0]).s, jnum(st[1]).s, jnum(st[2]).s, jnum(st[3]).s);
}

#endif
