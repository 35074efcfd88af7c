/* train_loop.h: the host side of training, shared by the CPU trainer (train_sdc.c) and the CUDA
 * trainer (train_sdc.cu): flags, data, the step loop (gradient accumulation, data-parallel
 * all-reduce, clipping, AdamW, schedule), evaluation and predictions, sampling, checkpoints and exact
 * resume, progress and the JSONL log. The including file defines the model and these functions:
 *
 *   Model (with fields Config c; int B, T), TRAINER_NAME (a string), TRAINER_DEFAULT_PRECISION (0 fp32,
 *   1 bf16), TRAINER_HAS_FP32 (0/1), TRAINER_HAS_EXTRA_CHECKS (0/1: -protect qk_bwd, att_bwd, ew), TRAINER_BF16_NAME
 *   (how bf16 is described),
 *   model_build(Model*, const Config*, B, T, precision)     model_free(Model*)
 *   model_init_weights(Model*, seed)                         model_num_params(const Model*)
 *   model_load_state(Model*, params, m, v)                   (host fp32 arrays; m, v NULL: zero)
 *   model_host_state(Model*, &params, &m, &v)                (host views of the fp32 state)
 *   model_set_tokens(Model*, inputs, targets, n)             (targets NULL: none)
 *   model_forward_step(Model*, B, T, with_targets) -> mean loss
 *   model_backward_step(Model*, B, T, dloss)                 (adds into the gradients)
 *   model_zero_grads(Model*)     model_allreduce_grads(Model*, Dist*)
 *   model_update(Model*, const AdamW*, t, clip) -> gradient norm before clipping
 *   model_token_losses(Model*, n, float*)   model_argmax(Model*, n, int*)   model_logits_row(Model*, row, float*)
 *   model_weights_checksum(Model*)          model_threads(void)             model_set_threads(int)
 *   model_set_fault(Model*, FaultCtx*)      (injection hooks on, or off with NULL)
 *   model_trace_snapshot(Model*)            (keep a copy of the activations of the last forward)
 *   model_trace_diff(Model*, site, layer, B, T, &num, &den)   (||x - x_snapshot||^2 and ||x_snapshot||^2 of a
 *                                           site's forward tensor; site -1 = the logits)
 *   model_set_protect_qk(Model*, on)   model_qk_reset(Model*) (resets every check's alarms)
 *   model_set_checks(Model*, abft, att)   (the attention checks of llmc/attcheck.h on/off)
 *   model_set_bwd_checks(Model*, qk, att) (the backward's Q/K recomputation and attention checks on/off)
 *   model_set_ew(Model*, on)               (element-wise recomputation on/off; both only where
 *                                          TRAINER_HAS_EXTRA_CHECKS is 1)
 *   model_check_alarms(Model*, kind, &first_layer)   (CHECK_QK .. CHECK_ATT_BWD alarms of the last microbatch)
 *   model_grad_norm(Model*)   model_update_norm(Model*, const AdamW*, t, clip, grad_norm)   (harmful-update detector)
 *   model_rgg_gains(Model*, B, T, layers, n_mon, double* out[n_mon*2])   (from the norms' mean squares)
 *   model_unscale_check(Model*, scale) -> 1 if a gradient is non-finite after grads *= scale
 *   model_exp_profile_start(Model*, samples, seed) (counts from zero)   model_exp_profile_stop(Model*)
 *   model_exp_hist(Model*) -> [tensors][256] counts
 *   model_grad_sumsq_range(Model*, off, n) -> sum of squares of the gradients [off, off + n)   (backward guard)
 *   model_set_rgg(Model*, on)      (the Residual Gain Guard's statistics are gathered in each forward)
 *   model_device_stats(Model*, DeviceStats*) -> 1 when the backend counts its device work (llmc/stats.h), else 0
 */
#ifndef TSDC_TRAIN_LOOP_H
#define TSDC_TRAIN_LOOP_H

#ifndef TRAINER_SETUP               /* device selection, NCCL (GPU trainer); nothing on the CPU */
#define TRAINER_SETUP(dist) ((void)0)
#define TRAINER_TEARDOWN() ((void)0)
#endif

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include "args.h"
#include "checkpoint.h"
#include "dataloader.h"
#include "dist.h"
#include "fault.h"
#include "rgg.h"
#include "bwdguard.h"
#include "expscale.h"
#include "attcheck.h"
#include "detect.h"
#include "logger.h"
#include "rng.h"
#include "schedule.h"
#include "tokenizer.h"
#include "stats.h"

/* a count for the JSONL log: null when unknown (< 0) */
static JNum jcount(long long x) {
    JNum j;
    if (x < 0) snprintf(j.s, sizeof(j.s), "null");
    else snprintf(j.s, sizeof(j.s), "%lld", x);
    return j;
}

typedef struct {
    Args a;
    Config c;
    Dist dist;
    Model model;
    Shard train, val;
    int have_val;
    Tokenizer tok;
    int have_tok;
    TrainState ts;
    Rng sample_rng;
    Logger log;
    int threads;
    FaultCtx fx;
    StreamFile trace;          /* -trace_out (fp NULL: off) */
    /* protection */
    int prot_qk, prot_rgg, prot_exp, prot_att, prot_bwd, prot_qkb, prot_attb, prot_ew, expscale_k, exp_auto;
    Detect det;
    Rgg rgg;
    double* gains;             /* [n_obs][n_mon][2] gains of the step (all ranks, gathered) */
    /* backward guard: the gradient's groups as contiguous ranges (one per layer, the rest), llmc/bwdguard.h */
    BwdGuard bwd;
    int have_bwd, n_ranges;
    size_t *range_off, *range_n;
    int* range_own;            /* the backward guard's group of a matrix of its own, -1 for a vector */
    int* range_group;
    /* lost-step control (-skip_steps): sorted step numbers */
    long long* skip;
    int n_skip;
    long long alarms_total, replays_total, found_inf_total, overflow_total, skipped_total;
    /* the end summary: alarmed steps by the check that raised them (ALARM_KIND_NAMES), fault events by site
     * and pass (injected, and caught: their step alarmed and was replayed), alarmed steps without a fault */
    long long alarm_kind_steps[8];
    long long ev_injected[SITE_COUNT][2], ev_caught[SITE_COUNT][2];
    long long false_alarms;
} Run;

/* the checks a step's alarm can come from, in the order of the log's "by" field */
enum { AK_QK, AK_RGG, AK_ATT, AK_QK_BWD, AK_ATT_BWD, AK_EW, AK_BWD, AK_DETECT, AK_COUNT };
static const char* const ALARM_KIND_NAMES[AK_COUNT] = {"qk", "rgg", "att", "qk_bwd", "att_bwd", "ew", "bwd", "detectors"};

/* Graceful stop. SIGINT, SIGTERM and SIGUSR1 (Slurm's --signal sends it ahead of a time limit; mpirun
 * forwards it to every rank) ask the run to stop: the step in progress finishes, every rank agrees on
 * the step at which to stop (stop_agreed, after each step), a checkpoint is written through the atomic
 * path (unless -save none), the log gets its end record with the signal as the reason, and the process
 * exits 128 + the signal's number (130 SIGINT, 143 SIGTERM, 138 SIGUSR1). A second signal exits at once,
 * without a checkpoint (the last complete one stays valid: checkpoints are renamed into place). */
static volatile sig_atomic_t stop_signal = 0;
static void on_stop_signal(int sig) {
    if (stop_signal) {
        static const char m2[] = "\ntrain_sdc: second signal: exiting now, no checkpoint\n";
        ssize_t w = write(2, m2, sizeof(m2) - 1);
        (void)w;
        _exit(128 + sig);
    }
    stop_signal = sig;
    static const char m1[] = "\ntrain_sdc: signal received: stopping after this step with a checkpoint (a second signal exits now)\n";
    ssize_t w = write(2, m1, sizeof(m1) - 1);
    (void)w;
}
static void stop_handlers_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}
static const char* signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "signal";
}
/* the signal every rank stops for (the lowest rank's that has one), or 0: one collective a step */
static int stop_agreed(Run* run) {
    int world = run->dist.world;
    if (world == 1) return stop_signal;
    double* all = (double*)mallocCheck(sizeof(double) * world);
    dist_allgather_f64(&run->dist, (double)stop_signal, all);
    int sig = 0;
    for (int r = 0; r < world && !sig; r++) sig = (int)all[r];
    free(all);
    return sig;
}

/* a number for a person: fixed point while that stays short, else scientific (a faulty run's norms reach 1e20) */
typedef struct { char s[32]; } Num;
static Num num_fmt(double x, int digits) {
    Num n;
    double ax = fabs(x);
    if (x != x || ax == INFINITY) snprintf(n.s, sizeof(n.s), "%s", x != x ? "nan" : x > 0 ? "inf" : "-inf");
    else if (ax != 0 && (ax >= 1e6 || ax < 1e-3)) snprintf(n.s, sizeof(n.s), "%.*e", digits > 1 ? digits - 1 : 1, x);
    else snprintf(n.s, sizeof(n.s), "%.*f", digits, x);
    return n;
}

static void mkdir_p(const char* dir) {
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", dir);
    for (char* p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) tsdc_fail("-out %s: cannot create directory: %s", dir, strerror(errno));
}

/* Every output path is checked before the first step: its directory exists and is writable, and the
 * path itself is not a directory. An error names the flag; nothing has been trained yet. */
static void check_output_path(const char* flag, const char* path) {
    if (!path[0]) return;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) tsdc_fail("flag %s %s: is a directory (give a file name)", flag, path);
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s", path);
    char* slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (stat(dir, &st) != 0) tsdc_fail("flag %s %s: directory %s does not exist", flag, path, dir);
    if (!S_ISDIR(st.st_mode)) tsdc_fail("flag %s %s: %s is not a directory", flag, path, dir);
    if (access(dir, W_OK | X_OK) != 0) tsdc_fail("flag %s %s: directory %s is not writable: %s", flag, path, dir, strerror(errno));
}

/* -out and every other output path, before anything is loaded or trained. A fresh run (no -resume) into
 * an -out that holds a run already (its log.jsonl, faults.jsonl or a checkpoint) is refused unless -force:
 * a repeated command line would otherwise replace that run's log without a word. -resume appends to it;
 * -force starts over in it (its logs are replaced, its checkpoints overwritten as the new run reaches them). */
static void out_setup(Run* run) {
    Args* a = &run->a;
    if (run->dist.rank == 0) {
        struct stat st;
        if (stat(a->out, &st) == 0 && !S_ISDIR(st.st_mode)) tsdc_fail("flag -out %s: exists and is not a directory", a->out);
        mkdir_p(a->out);
        if (access(a->out, W_OK | X_OK) != 0) tsdc_fail("flag -out %s: directory is not writable: %s", a->out, strerror(errno));
        if (!a->resume[0] && !a->force) {
            char p[1200], held[160] = "";
            const char* names[2] = {"log.jsonl", "faults.jsonl"};
            for (int i = 0; i < 2; i++) {
                snprintf(p, sizeof(p), "%s/%s", a->out, names[i]);
                if (stat(p, &st) == 0) snprintf(held + strlen(held), sizeof(held) - strlen(held), "%s%s", held[0] ? ", " : "", names[i]);
            }
            int n_ck = 0;
            char newest[300] = "";
            DIR* d = opendir(a->out);
            for (struct dirent* e; d && (e = readdir(d));) {
                size_t n = strlen(e->d_name);
                if (!strncmp(e->d_name, "step_", 5) && n > 5 && !strcmp(e->d_name + n - 5, ".ckpt")) {
                    n_ck++;
                    if (strcmp(e->d_name, newest) > 0) snprintf(newest, sizeof(newest), "%s", e->d_name);
                }
            }
            if (d) closedir(d);
            if (n_ck) snprintf(held + strlen(held), sizeof(held) - strlen(held), "%s%d checkpoint%s", held[0] ? ", " : "", n_ck, n_ck == 1 ? "" : "s");
            if (held[0]) {
                if (newest[0])
                    tsdc_fail("flag -out %s: holds a run already (%s): -resume %s/%s continues it, -force starts over in it, or choose another -out",
                              a->out, held, a->out, newest);
                tsdc_fail("flag -out %s: holds a run already (%s): -force starts over in it, or choose another -out", a->out, held);
            }
        }
    }
    if (a->pred_out[0] && !a->val[0]) tsdc_fail("flag -pred_out %s: needs -val (the predictions are over the held-out set)", a->pred_out);
    check_output_path("-pred_out", a->pred_out);
    check_output_path("-rgg_calibrate", a->rgg_calibrate);
    check_output_path("-bwd_calibrate", a->bwd_calibrate);
    check_output_path("-exp_profile", a->exp_profile);
    check_output_path("-trace_out", a->trace_out);
    dist_barrier(&run->dist);
}


/* evaluation on the fixed held-out set: the first n_seq*T+1 tokens of -val, B sequences a pass.
 * Returns the mean loss; writes the argmax predictions when pred_path is set. Rank 0 only. */
static double evaluate(Run* run, const char* pred_path) {
    Model* model = &run->model;
    int B = model->B, T = model->T, V = model->c.vocab_size;
    long long n_seq = run->a.eval_tokens / T;
    if (n_seq < 1) n_seq = 1;
    if ((uint64_t)n_seq * T + 1 > run->val.n) n_seq = (long long)((run->val.n - 1) / T);
    int* preds = pred_path ? (int*)mallocCheck(sizeof(int) * n_seq * T) : NULL;
    int *inp = (int*)mallocCheck(sizeof(int) * B * T), *tgt = (int*)mallocCheck(sizeof(int) * B * T);
    float* losses = (float*)mallocCheck(sizeof(float) * B * T);
    double sum = 0.0; long long cnt = 0;
    for (long long s0 = 0; s0 < n_seq; s0 += B) {
        int nb = (int)(n_seq - s0 < B ? n_seq - s0 : B);
        for (int j = 0; j < B; j++) {
            if (j < nb) shard_sequence(&run->val, (uint64_t)(s0 + j) * T, T, inp + j * T, tgt + j * T);
            else for (int t = 0; t < T; t++) inp[j * T + t] = 0, tgt[j * T + t] = -1;
        }
        model_set_tokens(model, inp, tgt, B * T);
        model_forward_step(model, B, T, 1);
        model_token_losses(model, nb * T, losses);
        for (int n = 0; n < nb * T; n++) { sum += losses[n]; cnt++; }
        if (preds) model_argmax(model, nb * T, preds + s0 * T);
    }
    free(inp); free(tgt); free(losses);
    if (preds) {
        /* a token shard (docs/formats.md), 4-byte ids, so tsdc_io.read_shard reads it */
        OutFile f;
        outfile_open(&f, pred_path);
        uint8_t h[SHARD_HEADER_BYTES] = {0};
        memcpy(h, "TSDCTOK\0", 8);
        uint32_t ver = 1, width = 4, vocab = (uint32_t)V; uint64_t n = (uint64_t)n_seq * T;
        uint64_t chk = tsdc_checksum(preds, n * 4);
        memcpy(h + 8, &ver, 4); memcpy(h + 12, &width, 4); memcpy(h + 16, &vocab, 4); memcpy(h + 24, &n, 8); memcpy(h + 32, &chk, 8);
        outfile_write(&f, h, sizeof(h));
        outfile_write(&f, preds, n * 4);
        outfile_commit(&f);
        free(preds);
    }
    return sum / (double)cnt;
}

/* print a sample continuing from the first token of -val (or BOS): rank 0 only */
static void sample(Run* run) {
    Model* model = &run->model;
    int T = model->T, V = model->c.vocab_size, len = run->a.sample_len;
    int start = run->have_tok && run->tok.bos != 0xFFFFFFFFu ? (int)run->tok.bos
              : (run->have_val ? (int)shard_token(&run->val, 0) : 0);
    int* ctx = (int*)mallocCheck(sizeof(int) * (len + 1));
    float* z = (float*)mallocCheck(sizeof(float) * V);
    ctx[0] = start;
    printf("sample: ");
    if (run->have_tok) tokenizer_print(&run->tok, start, stdout);
    for (int i = 1; i <= len; i++) {
        int lo = i > T ? i - T : 0, n = i - lo;
        model_set_tokens(model, ctx + lo, NULL, n);
        model_forward_step(model, 1, n, 0);
        model_logits_row(model, n - 1, z);
        int next = 0;
        if (run->a.temperature <= 0) { for (int k = 1; k < V; k++) if (z[k] > z[next]) next = k; }
        else {
            double mx = -INFINITY, s = 0.0;
            for (int k = 0; k < V; k++) if (z[k] > mx) mx = z[k];
            for (int k = 0; k < V; k++) s += exp((z[k] - mx) / run->a.temperature);
            double u = rng_uniform(&run->sample_rng) * s, acc = 0.0;
            next = V - 1;
            for (int k = 0; k < V; k++) { acc += exp((z[k] - mx) / run->a.temperature); if (acc > u) { next = k; break; } }
        }
        ctx[i] = next;
        if (run->have_tok) tokenizer_print(&run->tok, next, stdout); else printf(" %d", next);
    }
    printf("\n");
    fflush(stdout);
    free(ctx); free(z);
}

static void save_checkpoint(Run* run, const char* path) {
    Model* model = &run->model;
    memcpy(run->ts.rng, run->sample_rng.s, sizeof(run->ts.rng));
    uint64_t h = model_weights_checksum(model);
    dist_check_same(&run->dist, h, "at checkpoint");
    if (run->dist.rank == 0) {
        const float *p, *m, *v;
        model_host_state(model, &p, &m, &v);
        checkpoint_write(path, &model->c, p, m, v, model_num_params(model), &run->ts);
        printf("checkpoint %s (step %lld, weights %016llx)\n", path, (long long)run->ts.step, (unsigned long long)h);
    }
    dist_barrier(&run->dist);
}

static void fmt_eta(double s, char* buf, size_t n) {
    if (s < 0 || s != s) s = 0;
    long long t = (long long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%lldh%02lldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
}

/* a resumed run must be the run that wrote the checkpoint: every setting that changes the math */
static void check_resume_matches(const CkptInfo* ck, const Run* run, const char* path) {
    const Args* a = &run->a;
#define SAME(cond, flag, fmt, x, y) if (!(cond)) tsdc_fail("%s: checkpoint was written with " flag " " fmt ", this run has " fmt \
                                                          " (pass the same flag to resume)", path, x, y)
    SAME(ck->ts.B == a->B, "-B", "%d", ck->ts.B, a->B);
    SAME(ck->ts.T == run->model.T, "-seq", "%d", ck->ts.T, run->model.T);
    SAME((long long)ck->ts.world * ck->ts.A == (long long)run->dist.world * a->accum, "ranks x -accum", "%lld",
         (long long)ck->ts.world * ck->ts.A, (long long)run->dist.world * a->accum);
    SAME(ck->ts.total_steps == a->steps, "-steps", "%d", ck->ts.total_steps, a->steps);
    SAME(ck->ts.warmup == a->warmup, "-warmup", "%d", ck->ts.warmup, a->warmup);
    SAME(ck->ts.precision == a->precision, "-precision", "%d", ck->ts.precision, a->precision);
    SAME(ck->ts.lr == a->lr, "-lr", "%g", ck->ts.lr, a->lr);
    SAME(ck->ts.final_frac == a->final_lr_frac, "-final_lr_frac", "%g", ck->ts.final_frac, a->final_lr_frac);
    SAME(ck->ts.beta1 == a->beta1, "-beta1", "%g", ck->ts.beta1, a->beta1);
    SAME(ck->ts.beta2 == a->beta2, "-beta2", "%g", ck->ts.beta2, a->beta2);
    SAME(ck->ts.adam_eps == a->adam_eps, "-adam_eps", "%g", ck->ts.adam_eps, a->adam_eps);
    SAME(ck->ts.weight_decay == a->weight_decay, "-wd", "%g", ck->ts.weight_decay, a->weight_decay);
    SAME(ck->ts.grad_clip == a->grad_clip, "-clip", "%g", ck->ts.grad_clip, a->grad_clip);
#undef SAME
}

/* clean-envelope repeats: move the first element of every weight matrix by k ulps of the storage
 * dtype the math uses (fp32 ulps with -precision fp32; bf16 ulps, 2^16 fp32 ulps, with bf16, since a
 * smaller move of the fp32 master weight vanishes in the bf16 copy), so that otherwise bitwise-identical
 * runs differ at the ulp level */
static void perturb_weights(Model* model, long long k, int precision) {
    if (precision) k *= 65536;
    const float *p0, *m0, *v0;
    model_host_state(model, &p0, &m0, &v0);
    size_t P = model_num_params(model);
    float* p = (float*)mallocCheck(sizeof(float) * P);
    memcpy(p, p0, sizeof(float) * P);
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    param_layout_build(&model->c, L);
    for (int i = 0; i < L->n; i++)
        if (L->t[i].rows > 1) {
            float* x = p + L->t[i].offset;
            int32_t b; memcpy(&b, x, 4);
            b = (int32_t)((int64_t)b + k);
            memcpy(x, &b, 4);
        }
    float *m = (float*)mallocCheck(sizeof(float) * P), *v = (float*)mallocCheck(sizeof(float) * P);
    memcpy(m, m0, sizeof(float) * P); memcpy(v, v0, sizeof(float) * P);
    model_load_state(model, p, m, v);
    free(p); free(m); free(v); free(L);
}

/* fault injection set-up from the flags: the schedule, the storage width, the event log, the trace */
static void fault_setup(Run* run) {
    Args* a = &run->a;
    FaultCtx* fx = &run->fx;
    memset(fx, 0, sizeof(*fx));
    fx->rank = run->dist.rank;
    fx->width = a->precision ? 16 : 32;
    fx->att_T = run->c.seq_len;
    FaultConfig* fc = &fx->cfg;
    fc->mode = !strcmp(a->fault_mode, "char") ? FAULT_CHAR : !strcmp(a->fault_mode, "campaign") ? FAULT_CAMPAIGN : FAULT_OFF;
    if (fc->mode == FAULT_OFF) { model_set_fault(&run->model, NULL); return; }
    fc->sites = fault_parse_sites(a->fault_sites);
    fc->pass = !strcmp(a->fault_pass, "fwd") ? PASS_FWD : !strcmp(a->fault_pass, "bwd") ? PASS_BWD : 2;
    fc->layer = a->fault_layer; fc->m = a->fault_m; fc->frac = a->fault_frac; fc->nbits = a->fault_bits;
    fc->rank = a->fault_rank; fc->mb = a->fault_mb; fc->rate = a->fault_rate;
    fc->start = a->fault_start; fc->end = a->fault_end < 0 ? a->steps : a->fault_end; fc->seed = a->fault_seed;
    fc->field = !strcmp(a->fault_field, "exponent") ? FIELD_EXPONENT : !strcmp(a->fault_field, "mantissa") ? FIELD_MANTISSA
              : !strcmp(a->fault_field, "sign") ? FIELD_SIGN : FIELD_ALL;
    /* -fault_dtype: the CPU's emulated bf16 mode keeps every tensor in a float array, so a site can take
     * fp32 flips; the GPU stores bf16 and fp32 storage keeps fp32 */
    if (strcmp(a->fault_dtype, "storage") && strcmp(a->fault_dtype, a->precision ? "bf16" : "fp32")) {
        if (!a->precision) usage_fail("flag -fault_dtype %s: needs -precision bf16 (under fp32 every site is stored in fp32)", a->fault_dtype);
        if (!TRAINER_HAS_FP32) usage_fail("flag -fault_dtype %s: this trainer stores every site in bf16; use the CPU trainer", a->fault_dtype);
        for (int st = 0; st < SITE_COUNT; st++)
            fx->site_width[st] = !strcmp(a->fault_dtype, "fp32") || fault_autocast_fp32(st) ? 32 : 16;
    }
    /* -fault_bits above what the flips can reach would be clamped silently while faults.jsonl records
     * the flag's value: refuse it */
    for (int st = 0; st < SITE_COUNT; st++) {
        if (!(fc->sites & (1u << st))) continue;
        int w = fx->site_width[st] ? fx->site_width[st] : fx->width, lo, hi;
        fault_field_range(fc->field, w, &lo, &hi);
        if (fc->nbits > hi - lo) {
            if (fc->field == FIELD_ALL)
                tsdc_fail("flag -fault_bits %d: more than the %d bits of the %s storage of site %s", fc->nbits, w, w == 32 ? "fp32" : "bf16", SITE_NAMES[st]);
            tsdc_fail("flag -fault_bits %d: more than the %d bits of the %s field of %s (site %s)", fc->nbits, hi - lo, a->fault_field,
                      w == 32 ? "fp32" : "bf16", SITE_NAMES[st]);
        }
    }
    if (fc->mode == FAULT_CHAR && __builtin_popcount(fc->sites) != 1)
        usage_fail("%s", "-fault_mode char injects one site: give one name to -fault_sites");
    if (fc->rank >= run->dist.world) tsdc_fail("flag -fault_rank: rank %d does not exist (%d ranks)", fc->rank, run->dist.world);
    if (fc->mb >= a->accum) tsdc_fail("flag -fault_mb: microbatch %d does not exist (-accum %d)", fc->mb, a->accum);
    /* "all" and "qk" name sets: a member the family lacks is left out, not an error */
    int set_requested = strstr(a->fault_sites, "all") != NULL || strstr(a->fault_sites, "qk") != NULL;
    fault_validate(fc, &run->c, set_requested);
    char path[1200];
    snprintf(path, sizeof(path), "%s/faults.jsonl", a->out);
    if (run->dist.rank == 0) mkdir_p(a->out);
    dist_barrier(&run->dist);
    streamfile_open(&fx->log, path, a->resume[0] || run->dist.rank != 0, "the fault log");
    dist_barrier(&run->dist);
    if (a->trace_out[0]) {
        char tp[1100];
        if (run->dist.world > 1) snprintf(tp, sizeof(tp), "%s.rank%d", a->trace_out, run->dist.rank);
        else snprintf(tp, sizeof(tp), "%s", a->trace_out);
        streamfile_open(&run->trace, tp, a->resume[0] != 0, "the trace file");
    }
    model_set_fault(&run->model, fx);
    char sites[400] = "";
    int n_sites = 0, n_exist = 0;
    for (int st = 0; st < SITE_COUNT; st++) {
        n_exist += site_exists(&run->c, st);
        if (fc->sites & (1u << st)) {
            n_sites++;
            snprintf(sites + strlen(sites), sizeof(sites) - strlen(sites), "%s%s", sites[0] ? "," : "", SITE_NAMES[st]);
        }
    }
    if (n_sites == n_exist && n_sites > 1) snprintf(sites, sizeof(sites), "all %d of the preset", n_sites);
    if (run->dist.rank == 0)
        printf("fault injection: %s, sites %s, pass %s, layer %d, m %lld (frac %g), %d bits (%s), rank %d, steps %lld-%lld%s, seed %llu\n",
               a->fault_mode, sites, a->fault_pass, fc->layer, fc->m, fc->frac, fc->nbits,
               !strcmp(a->fault_dtype, "storage") ? (a->precision ? "bf16" : "fp32") : a->fault_dtype, fc->rank, fc->start, fc->end,
               fc->mode == FAULT_CHAR ? "" : " (one event a step)", (unsigned long long)fc->seed);
}

/* Experiment 2 (propagation trace): before the due microbatch's forward, run it clean (injection off)
 * and keep its activations; after the faulty forward, write R_x = ||x_fault - x_clean|| / ||x_clean||
 * of every module output of every layer and of the logits, one JSONL line a tensor. */
static void trace_clean(Run* run, int B, int T) {
    run->fx.replay = 1;
    model_forward_step(&run->model, B, T, 1);
    model_trace_snapshot(&run->model);
    run->fx.replay = 0;
}
static void trace_write(Run* run, int B, int T) {
    Model* model = &run->model;
    const FaultEvent* e = &run->fx.ev;
    for (int l = 0; l <= model->c.n_layer; l++)
        for (int site = 0; site < SITE_COUNT; site++) {
            if (l == model->c.n_layer && site > 0) break;
            int s = l == model->c.n_layer ? -1 : site;   /* -1: the logits */
            if (s >= 0 && !site_exists(&model->c, s)) continue;
            double num = 0, den = 0;
            model_trace_diff(model, s, l, B, T, &num, &den);
            streamfile_printf(&run->trace, "{\"step\":%lld,\"microbatch\":%d,\"rank\":%d,\"inj_site\":\"%s\",\"inj_layer\":%d,"
                    "\"site\":\"%s\",\"layer\":%d,\"rx\":%s,\"norm_clean\":%s}\n", e->step, e->mb, e->rank,
                    SITE_NAMES[e->site], e->layer, s < 0 ? "lm_output" : SITE_NAMES[s], s < 0 ? -1 : l,
                    jnum(den != den || num != num ? NAN : den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0)).s, jnum(sqrt(den)).s);
        }
}

/* the exponent-code histograms (summed over ranks) as JSON: {"k": the scaling in effect, "projections":
 * {"layers.0.wq": [256 counts of the codes of dL/dY as computed, i.e. shifted by k], ...}} */
static void exp_profile_write(Run* run, const char* path) {
    Model* model = &run->model;
    const uint32_t* h = model_exp_hist(model);
    if (!h) return;
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    param_layout_build(&model->c, L);
    double* all = (double*)callocCheck((size_t)L->n * 256, sizeof(double));
    for (size_t i = 0; i < (size_t)L->n * 256; i++) all[i] = h[i];
    dist_allreduce_sum_f64(&run->dist, all, L->n * 256);
    if (run->dist.rank == 0) {
        OutFile f;
        outfile_open(&f, path);
        outfile_printf(&f, "{\"k\": %d, \"steps\": %lld, \"samples_per_microbatch\": %d, \"preset\": \"%s\", \"projections\": {",
                run->expscale_k, (long long)run->ts.step, run->a.exp_samples, model->c.preset);
        int first = 1;
        for (int i = 0; i < L->n; i++) {
            if (L->t[i].rows <= 1) continue;
            const double* c = all + (size_t)i * 256;
            double tot = 0; for (int k = 0; k < 256; k++) tot += c[k];
            if (tot == 0) continue;
            if (L->t[i].layer >= 0) outfile_printf(&f, "%s\n  \"layers.%d.%s\": [", first ? "" : ",", L->t[i].layer, PT_NAMES[L->t[i].type]);
            else outfile_printf(&f, "%s\n  \"%s\": [", first ? "" : ",", PT_NAMES[L->t[i].type] );
            for (int k = 0; k < 256; k++) outfile_printf(&f, "%s%.0f", k ? "," : "", c[k]);
            outfile_printf(&f, "]");
            first = 0;
        }
        outfile_printf(&f, "\n}}\n");
        outfile_commit(&f);
        printf("exponent profile %s\n", path);
    }
    free(all); free(L);
}

/* the backward guard from the flags: its groups (each layer's parameters and the rest, as contiguous
 * ranges of the gradient), window, calibration */
static void bwd_setup(Run* run) {
    Args* a = &run->a;
    if (a->bwd_calibrate[0] && a->bwd_calibration[0]) usage_fail("%s", "-bwd_calibrate and -bwd_calibration exclude each other");
    if (!run->prot_bwd && !a->bwd_calibrate[0]) {
        if (a->bwd_calibration[0]) usage_fail("%s", "-bwd_calibration needs -protect bwd (or all)");
        return;
    }
    run->have_bwd = 1;
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    param_layout_build(&run->c, L);
    /* one range per tensor; a matrix (or embedding) has a group of its own (the first n_mat groups), every
     * tensor counts in its layer's group (or "other") and the global one (bwd_norms). Vectors (the norm
     * weights) have no group of their own: their clean gradient norms swing too far (an mlp_norm_w of
     * tiny-llama reached 49x its median in 40 clean steps at B 2 x T 32) */
    char (*names)[32] = (char (*)[32])callocCheck((size_t)L->n, 32);
    run->range_off = (size_t*)mallocCheck(sizeof(size_t) * L->n);
    run->range_n = (size_t*)mallocCheck(sizeof(size_t) * L->n);
    run->range_group = (int*)mallocCheck(sizeof(int) * L->n);
    run->range_own = (int*)mallocCheck(sizeof(int) * L->n);
    run->n_ranges = L->n;
    int n_mat = 0;
    for (int i = 0; i < L->n; i++) if (L->t[i].rows > 1) n_mat++;
    for (int i = 0, j = 0; i < L->n; i++) {
        const TensorInfo* t = &L->t[i];
        run->range_own[i] = -1;
        if (t->rows > 1) {
            if (t->layer >= 0) snprintf(names[j], 32, "L%d.%s", t->layer, PT_NAMES[t->type]);
            else snprintf(names[j], 32, "%s", PT_NAMES[t->type]);
            run->range_own[i] = j++;
        }
        run->range_off[i] = t->offset; run->range_n[i] = t->numel;
        run->range_group[i] = n_mat + (t->layer >= 0 ? t->layer : run->c.n_layer);   /* its layer's group, or "other" */
    }
    bwd_init(&run->bwd, run->c.n_layer, n_mat, (const char (*)[32])names, a->bwd_window, a->bwd_alpha);
    free(names);
    free(L);
    if (a->bwd_calibrate[0]) run->bwd.calibrating = 1;
    if (a->bwd_calibration[0]) bwd_load_calibration(&run->bwd, a->bwd_calibration);
    else if (run->prot_bwd && !a->bwd_calibrate[0] && run->dist.rank == 0)
        printf("note: -protect bwd without -bwd_calibration: the backward guard's window seeds itself from the first %d steps, "
               "on which only a non-finite gradient alarms\n", a->bwd_window);
}

/* the backward guard's inputs: the log norms of every group (x[n_groups]) of the gradients as they are
 * now (all-reduced, unscaled), the global one last */
static void bwd_norms(Run* run, double* x) {
    int G = run->bwd.n_groups;
    double* ss = (double*)callocCheck((size_t)G, sizeof(double));
    for (int r = 0; r < run->n_ranges; r++) {
        double v = model_grad_sumsq_range(&run->model, run->range_off[r], run->range_n[r]);
        if (run->range_own[r] >= 0) ss[run->range_own[r]] += v;   /* the matrix's own group */
        ss[run->range_group[r]] += v;     /* its layer, or "other" */
        ss[G - 1] += v;
    }
    bwd_log_norms(&run->bwd, ss, x);
    free(ss);
}

/* -skip_steps FILE: the step numbers whose updates the lost-step control skips */
static int cmp_ll(const void* x, const void* y) { long long a = *(const long long*)x, b = *(const long long*)y; return (a > b) - (a < b); }
static void skip_setup(Run* run) {
    const char* path = run->a.skip_steps;
    if (!path[0]) return;
    FILE* fp = fopen(path, "r");
    if (!fp) tsdc_fail("%s: cannot open the -skip_steps file: %s", path, strerror(errno));
    int cap = 64, n = 0;
    long long* v = (long long*)mallocCheck(sizeof(long long) * cap);
    char line[4096];
    int no = 0;
    while (fgets(line, sizeof(line), fp)) {
        no++;
        char* hash = strchr(line, '#');
        if (hash) *hash = 0;
        for (char* tok = strtok(line, " \t\r\n,"); tok; tok = strtok(NULL, " \t\r\n,")) {
            char* end;
            errno = 0;
            long long x = strtoll(tok, &end, 10);
            if (errno || *end || x < 1) tsdc_fail("%s:%d: '%s' is not a step number (>= 1)", path, no, tok);
            if (n == cap) { cap *= 2; v = (long long*)realloc(v, sizeof(long long) * cap); if (!v) tsdc_fail("out of memory"); }
            v[n++] = x;
        }
    }
    fclose(fp);
    qsort(v, (size_t)n, sizeof(long long), cmp_ll);
    run->skip = v; run->n_skip = n;
    if (run->dist.rank == 0) printf("lost-step control: %d step%s listed in %s\n", n, n == 1 ? "" : "s", path);
}
static int skip_due(const Run* run, long long step) {
    return run->n_skip && bsearch(&step, run->skip, (size_t)run->n_skip, sizeof(long long), cmp_ll) != NULL;
}

/* -expscale_k auto: profile dL/dY on the microbatches of the coming step with injection off and the loss
 * unscaled (gradients discarded), and take k* = argmin R_amp (llmc/expscale.h); the same on every rank
 * (the histograms are summed over ranks). Costs one step's forward and backward, once. */
static void select_expscale_k(Run* run, int* inp, int* tgt) {
    Args* a = &run->a;
    Model* model = &run->model;
    int T = model->T, N = a->B * T;
    model_exp_profile_start(model, a->exp_samples, a->seed ^ 0xE4905EULL);   /* -exp_profile's seed: the same samples */
    run->fx.replay = 1;
    model_zero_grads(model);
    float dloss = 1.0f / (float)((double)N * a->accum * run->dist.world);
    for (int mb = 0; mb < a->accum; mb++) {
        shard_microbatch(&run->train, run->ts.data_pos, run->dist.rank * a->accum + mb, a->B, T, inp, tgt);
        model_set_tokens(model, inp, tgt, N);
        model_qk_reset(model);
        model_forward_step(model, a->B, T, 1);
        model_backward_step(model, a->B, T, dloss);
    }
    model_zero_grads(model);
    model_qk_reset(model);
    run->fx.replay = 0;
    model_exp_profile_stop(model);
    int nt = model->L.n;
    double* h = (double*)callocCheck((size_t)nt * 256, sizeof(double));
    const uint32_t* hc = model_exp_hist(model);
    for (size_t i = 0; i < (size_t)nt * 256; i++) h[i] = hc[i];
    dist_allreduce_sum_f64(&run->dist, h, (size_t)nt * 256);
    ExpScaleChoice ch = expscale_select_k(h, nt, 0, 0, 64);
    free(h);
    if (ch.k_star < 0) {
        if (run->dist.rank == 0) printf("warning: exponent scaling: no gradient sample to choose k from; keeping k %d\n", run->expscale_k);
        return;
    }
    run->expscale_k = ch.k_star;
    if (run->dist.rank == 0)
        printf("exponent scaling: k* = %d from %.0f samples of dL/dY on step %lld's microbatches (unscaled codes %d..%d, K_safe [%d, %d], "
               "R_amp(k*) %.4Lg)\n", ch.k_star, ch.samples, (long long)run->ts.step + 1, ch.code_lo, ch.code_hi, ch.k_lo, ch.k_hi, ch.r_min);
}

/* -protect and the Residual Gain Guard's set-up from the flags */
static void protect_setup(Run* run) {
    Args* a = &run->a;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", a->protect);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "none")) continue;
        else if (!strcmp(tok, "paper")) run->prot_qk = run->prot_rgg = run->prot_exp = 1;
        else if (!strcmp(tok, "all")) {
            run->prot_qk = run->prot_rgg = run->prot_exp = run->prot_att = run->prot_bwd = 1;
            run->prot_qkb = run->prot_attb = run->prot_ew = TRAINER_HAS_EXTRA_CHECKS;
            run->exp_auto = 1;
        }
        else if (!strcmp(tok, "qk")) run->prot_qk = 1;
        else if (!strcmp(tok, "qk_bwd") || !strcmp(tok, "att_bwd") || !strcmp(tok, "ew")) {
            if (!TRAINER_HAS_EXTRA_CHECKS) usage_fail("flag -protect: '%s' is the CPU trainer's for now (docs/protection.md)", tok);
            if (tok[0] == 'q') run->prot_qkb = 1; else if (tok[0] == 'a') run->prot_attb = 1; else run->prot_ew = 1;
        }
        else if (!strcmp(tok, "bwd")) run->prot_bwd = 1;
        else if (!strcmp(tok, "rgg")) run->prot_rgg = 1;
        else if (!strcmp(tok, "exp")) run->prot_exp = 1;
        else if (!strcmp(tok, "att")) run->prot_att = 1;
        else usage_fail("flag -protect: '%s' is not none, paper, all, qk, rgg, exp, att, bwd, qk_bwd, att_bwd or ew", tok);
    }
    detect_init(&run->det, detect_parse(a->detect), a->detect_observe, a->detect_window, a->spike_z, a->harmful_z, a->llmft_model);
    if (a->detect_observe && !run->det.mask) usage_fail("%s", "-detect_observe 1 needs -detect LIST (the detectors to observe)");
    model_set_checks(&run->model, (run->det.mask >> DET_ABFT) & 1, run->prot_att);
    /* k: explicit, or auto (chosen at the start of the run: select_expscale_k), or 15 (the paper's) with exp */
    if (a->expscale_k == -2) run->exp_auto = 1;
    else if (a->expscale_k >= 0) run->exp_auto = 0;
    run->expscale_k = a->expscale_k >= 0 ? a->expscale_k : (run->prot_exp || run->exp_auto ? 15 : 0);
    if (run->exp_auto) run->prot_exp = 1;
    model_set_protect_qk(&run->model, run->prot_qk);
    model_set_bwd_checks(&run->model, run->prot_qkb, run->prot_attb);
    model_set_ew(&run->model, run->prot_ew);
    if (!TRAINER_HAS_EXTRA_CHECKS && strstr(a->protect, "all") && run->dist.rank == 0)
        printf("note: -protect all on this trainer is qk,rgg,att,bwd,exp: the backward's Q/K recomputation and attention "
               "checks and the element-wise recomputation (qk_bwd, att_bwd, ew) are the CPU trainer's for now\n");
    bwd_setup(run);
    skip_setup(run);
    if (a->rgg_calibrate[0] && a->rgg_calibration[0]) usage_fail("%s", "-rgg_calibrate and -rgg_calibration exclude each other");
    if (!run->prot_rgg && !a->rgg_calibrate[0]) {
        if (a->rgg_calibration[0]) usage_fail("%s", "-rgg_calibration needs -protect rgg");
        return;
    }
    int layers[RGG_MAX_MON], n = 0;
    if (a->rgg_layers[0]) {
        char lb[256];
        snprintf(lb, sizeof(lb), "%s", a->rgg_layers);
        for (char* tok = strtok(lb, ","); tok; tok = strtok(NULL, ",")) {
            if (n == RGG_MAX_MON) usage_fail("flag -rgg_layers: at most %s layers", "16");
            layers[n++] = (int)parse_int("-rgg_layers", tok, 0, 1 << 20);
        }
    } else n = rgg_default_layers(run->c.n_layer, layers);
    rgg_init(&run->rgg, run->c.n_layer, layers, n, run->dist.world * a->accum, a->rgg_window, a->rgg_alpha);
    if (a->rgg_calibrate[0]) run->rgg.calibrating = 1;
    if (a->rgg_calibration[0]) rgg_load_calibration(&run->rgg, a->rgg_calibration);
    run->gains = (double*)callocCheck((size_t)run->rgg.n_obs * n * 2, sizeof(double));
    model_set_rgg(&run->model, 1);
    if (run->prot_rgg && !a->rgg_calibration[0] && !a->rgg_calibrate[0] && run->dist.rank == 0)
        printf("note: -protect rgg without -rgg_calibration: the window seeds itself from the first %d steps, which are "
               "not checked\n", a->rgg_window);
}

/* the parameters of src (config cs) cut to the first cd->n_layer layers (config cd: the same model but
 * shallower): every tensor of cd's layout copied from the tensor of the same type and layer in cs's */
static void params_keep_first_layers(const Config* cs, const float* src, const Config* cd, float* dst) {
    ParamLayout* Ls = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    ParamLayout* Ld = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    param_layout_build(cs, Ls);
    param_layout_build(cd, Ld);
    for (int i = 0, j = 0; i < Ld->n; i++) {
        const TensorInfo* t = &Ld->t[i];
        while (j < Ls->n && !(Ls->t[j].type == t->type && Ls->t[j].layer == t->layer)) j++;
        if (j == Ls->n || Ls->t[j].numel != t->numel) tsdc_fail("-n_layer: tensor %s of layer %d not found in the checkpoint", PT_NAMES[t->type], t->layer);
        memcpy(dst + t->offset, src + Ls->t[j].offset, sizeof(float) * t->numel);
    }
    free(Ls); free(Ld);
}

/* The end summary (rank 0): protection's alarms by the check that raised them, and, under injection, the
 * fault events injected, caught (their step alarmed and was replayed) and missed (no alarm in their step)
 * by site and pass. "Missed" is the trainer's view: an event whose elements the model never reads (a
 * masked logit, a value that rounds away) raises no alarm and needs none; scripts/sdc_metrics.py separates
 * those from the misses that matter. */
static void print_summary(const Run* run) {
    const Args* a = &run->a;
    int protecting = run->prot_qk || run->prot_rgg || run->prot_exp || run->prot_att || run->prot_bwd || run->prot_qkb ||
                     run->prot_attb || run->prot_ew || run->det.mask;
    if (protecting) {
        printf("protection %s (k %d): %lld alarmed step%s, %lld replayed; %lld found_inf (%lld real overflow%s)", a->protect,
               run->expscale_k, run->alarms_total, run->alarms_total == 1 ? "" : "s", run->replays_total, run->found_inf_total,
               run->overflow_total, run->overflow_total == 1 ? "" : "s");
        const char* sep = "; by check: ";
        for (int k = 0; k < AK_COUNT; k++)
            if (run->alarm_kind_steps[k]) { printf("%s%s %lld", sep, ALARM_KIND_NAMES[k], run->alarm_kind_steps[k]); sep = ", "; }
        printf("\n");
    }
    if (run->fx.cfg.mode == FAULT_OFF) return;
    long long inj = 0, caught = 0;
    for (int st = 0; st < SITE_COUNT; st++) for (int p = 0; p < 2; p++) { inj += run->ev_injected[st][p]; caught += run->ev_caught[st][p]; }
    printf("faults: %lld event%s injected, %lld caught (step replayed), %lld missed (no alarm in its step)", inj, inj == 1 ? "" : "s",
           caught, inj - caught);
    if (protecting) printf("; %lld alarmed step%s without a fault", run->false_alarms, run->false_alarms == 1 ? "" : "s");
    printf("\n");
    for (int p = 0; p < 2; p++) {
        char line[2048] = "";
        for (int st = 0; st < SITE_COUNT; st++)
            if (run->ev_injected[st][p])
                snprintf(line + strlen(line), sizeof(line) - strlen(line), "%s %s %lld/%lld", line[0] ? "," : "", SITE_NAMES[st],
                         run->ev_caught[st][p], run->ev_injected[st][p]);
        if (line[0]) printf("  %s, caught/injected:%s\n", p ? "backward" : "forward", line);
    }
}

/* -version: how this binary was built, one line (the tests read MPI from it) */
static void print_build(void) {
    printf("train_sdc (" TRAINER_NAME ") | MPI: %s | OpenMP: %s", dist_built_with_mpi() ? "yes" : "no (single process)",
#ifdef _OPENMP
           "yes"
#else
           "no"
#endif
    );
#ifdef USE_NCCL
    printf(" | NCCL: yes");
#endif
    printf("\n");
}

int train_main(int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-version") || !strcmp(argv[i], "--version")) { print_build(); return 0; }
    Run run_, *run = &run_;
    memset(run, 0, sizeof(*run));
    dist_init(&run->dist, &argc, &argv);
    stop_handlers_install();
    int rank = run->dist.rank, world = run->dist.world;
    Args* a = &run->a;
    args_parse(a, argc, argv);
    const char* ckpath = a->resume[0] ? a->resume : a->init[0] ? a->init : NULL;
    CkptInfo ck0;
    if (ckpath) {
        checkpoint_read(ckpath, &ck0, NULL, NULL, NULL, 0); /* validate the file and read its config first */
        args_config_from_checkpoint(a, &ck0.cfg, ckpath, a->resume[0] != 0, &run->c);
    } else {
        args_config(a, &run->c);
    }
    if (a->precision < 0) a->precision = TRAINER_DEFAULT_PRECISION;
    if (a->precision == 0 && !TRAINER_HAS_FP32) usage_fail("%s", "-precision fp32 is the CPU trainer's (./train_sdc); this trainer computes in bf16 AMP");
    if (a->threads) model_set_threads(a->threads);
    TRAINER_SETUP(&run->dist);
    run->threads = model_threads();
    if (a->steps > 0 && !a->train[0]) usage_fail("%s", "-train FILE is required (or -steps 0)");
    out_setup(run);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (rank == 0 && cores > 0 && run->threads > cores)
        fprintf(stderr, "warning: -threads %d is more than the %ld cores here: the threads take turns and every step slows down "
                        "many times (use -threads %ld or fewer)\n", run->threads, cores, cores);
    int T = run->c.seq_len;
    if (rank == 0) {
        printf("train_sdc (" TRAINER_NAME ") | preset %s | %zu parameters | %s | %d rank%s%s | %d thread%s | B %d x T %d x accum %d\n",
               run->c.preset, config_num_params(&run->c), a->precision ? TRAINER_BF16_NAME : "fp32", world,
               world == 1 ? "" : "s", dist_built_with_mpi() ? "" : " (built without MPI: single process)",
               run->threads, run->threads == 1 ? "" : "s", a->B, T, a->accum);
    }

    /* data */
    if (a->train[0]) {
        shard_load(&run->train, a->train, run->c.vocab_size);
        shard_require(&run->train, batch_span(world, a->accum, a->B, T) + 1, "step's batch (ranks x -accum x -B x -seq + 1)");
    }
    if (a->val[0]) {
        shard_load(&run->val, a->val, run->c.vocab_size);
        shard_require(&run->val, (uint64_t)T + 1, "sequence (-seq + 1)");
        run->have_val = 1;
    }
    char tokpath[1100] = {0};
    if (a->tokenizer[0]) snprintf(tokpath, sizeof(tokpath), "%s", a->tokenizer);
    else if (a->train[0]) {
        snprintf(tokpath, sizeof(tokpath), "%s", a->train);
        char* slash = strrchr(tokpath, '/');
        snprintf(slash ? slash + 1 : tokpath, sizeof(tokpath) - (slash ? (size_t)(slash + 1 - tokpath) : 0), "tokenizer.bin");
        FILE* probe = fopen(tokpath, "rb");
        if (probe) fclose(probe); else tokpath[0] = 0;
    }
    if (tokpath[0]) {
        tokenizer_load(&run->tok, tokpath);
        if (run->tok.vocab > (uint32_t)run->c.vocab_size)
            tsdc_fail("%s: decode table has %u tokens, more than the model vocab %d", tokpath, run->tok.vocab, run->c.vocab_size);
        run->have_tok = 1;
    }

    /* model */
    Model* model = &run->model;
    model_build(model, &run->c, a->B, T, a->precision);
    TrainState* ts = &run->ts;
    ts->world = world; ts->B = a->B; ts->A = a->accum; ts->T = T; ts->warmup = a->warmup; ts->total_steps = a->steps;
    ts->precision = a->precision; ts->lr = a->lr; ts->final_frac = a->final_lr_frac; ts->beta1 = a->beta1;
    ts->beta2 = a->beta2; ts->adam_eps = a->adam_eps; ts->weight_decay = a->weight_decay; ts->grad_clip = a->grad_clip;
    rng_seed(&run->sample_rng, a->seed ^ 0x5A3D1E5EULL);
    if (a->resume[0] || a->init[0]) {
        const char* path = ckpath;
        CkptInfo ck = ck0;
        if (ck.cfg.seq_len < T && a->init[0] && rank == 0)
            printf("note: -seq %d is longer than the checkpoint's sequence length %d: positions the model never trained on\n",
                   T, ck.cfg.seq_len);
        if (a->resume[0]) {
            if (!ck.has_opt) tsdc_fail("%s: has no optimizer state (a weights-only checkpoint): use -init, not -resume", path);
            check_resume_matches(&ck, run, path);
        }
        size_t P = model_num_params(model);
        float* hp = (float*)mallocCheck(sizeof(float) * P);
        float* hm = a->resume[0] ? (float*)mallocCheck(sizeof(float) * P) : NULL;
        float* hv = a->resume[0] ? (float*)mallocCheck(sizeof(float) * P) : NULL;
        if (run->c.n_layer == ck.cfg.n_layer) {
            checkpoint_read(path, &ck, hp, hm, hv, P);
        } else { /* -init -n_layer N: the checkpoint's first N layers, its embedding, final norm and head */
            float* full = (float*)mallocCheck(sizeof(float) * ck.n_params);
            checkpoint_read(path, &ck, full, NULL, NULL, ck.n_params);
            params_keep_first_layers(&ck.cfg, full, &run->c, hp);
            free(full);
        }
        model_load_state(model, hp, hm, hv);
        free(hp); free(hm); free(hv);
        if (a->resume[0]) {
            ts->step = ck.ts.step; ts->data_pos = ck.ts.data_pos;
            memcpy(run->sample_rng.s, ck.ts.rng, sizeof(ck.ts.rng));
            if (run->train.n && ts->data_pos + batch_span(world, a->accum, a->B, T) + 1 > run->train.n)
                tsdc_fail("%s: data position %llu lies beyond -train %s (%llu tokens): not the shard it was trained on",
                          path, (unsigned long long)ts->data_pos, a->train, (unsigned long long)run->train.n);
        }
        if (rank == 0) {
            printf("%s %s (step %lld)", a->resume[0] ? "resumed from" : "initialised from", path, (long long)ck.ts.step);
            if (run->c.n_layer < ck.cfg.n_layer) printf(": its first %d of %d layers", run->c.n_layer, ck.cfg.n_layer);
            printf("\n");
        }
    } else {
        double ti = wall_seconds();
        model_init_weights(model, a->seed);
        if (rank == 0) printf("init: %zu weights in %.2f s (seed %llu)\n", model_num_params(model), wall_seconds() - ti, a->seed);
    }
    if (a->perturb != 0) perturb_weights(model, (long long)a->perturb, a->precision);
    dist_check_same(&run->dist, model_weights_checksum(model), "at start");
    fault_setup(run);
    protect_setup(run);
    if (a->exp_profile[0]) model_exp_profile_start(model, a->exp_samples, a->seed ^ 0xE4905EULL);

    if (rank == 0) {
        mkdir_p(a->out);
        char logpath[1100];
        snprintf(logpath, sizeof(logpath), "%s/log.jsonl", a->out);
        logger_open(&run->log, logpath, a->resume[0] != 0);
        logger_line(&run->log, "{\"type\":\"run\",\"trainer\":\"" TRAINER_NAME "\",\"preset\":\"%s\",\"params\":%zu,\"n_layer\":%d,\"d_model\":%d,"
                    "\"vocab\":%d,\"seq\":%d,\"B\":%d,\"accum\":%d,\"world\":%d,\"threads\":%d,\"precision\":\"%s\",\"steps\":%d,"
                    "\"lr\":%.9g,\"warmup\":%d,\"seed\":%llu,\"start_step\":%lld}",
                    run->c.preset, model_num_params(model), run->c.n_layer, run->c.d_model, run->c.vocab_size, T, a->B, a->accum, world,
                    run->threads, a->precision ? "bf16" : "fp32", a->steps, a->lr, a->warmup, a->seed, (long long)ts->step);
    }

    AdamW opt = {a->lr, a->beta1, a->beta2, a->adam_eps, a->weight_decay};
    int last = a->stop_at && a->stop_at < a->steps ? a->stop_at : a->steps;
    uint64_t span = batch_span(world, a->accum, a->B, T);
    int N = a->B * T;
    int *inp = (int*)mallocCheck(sizeof(int) * N), *tgt = (int*)mallocCheck(sizeof(int) * N);
    if (run->exp_auto && ts->step < last) {
        select_expscale_k(run, inp, tgt);
        if (a->exp_profile[0]) model_exp_profile_start(model, a->exp_samples, a->seed ^ 0xE4905EULL);
    }
    double* bx = run->have_bwd ? (double*)callocCheck((size_t)run->bwd.n_groups, sizeof(double)) : NULL;
    float dloss = 1.0f / (float)((double)N * a->accum * world);
    double t_start = wall_seconds(), ms_sum = 0; int timed = 0;
    int stop_sig = 0;                          /* the signal the run stopped for (graceful stop), 0: none */
    char path[1200];
    while (ts->step < last) {
        long long s = ts->step; /* update number, 0-based */
        double t0 = wall_seconds(), c0 = cpu_seconds();
        DeviceStats st0, st1;
        DEVICE_STATS_UNKNOWN(&st0); DEVICE_STATS_UNKNOWN(&st1);
        const int have_st = a->stats && model_device_stats(model, &st0);
        run->fx.ev = fault_plan_step(&run->fx.cfg, s + 1, world, a->accum, run->c.n_layer);
        run->fx.injected = 0;
        run->fx.replay = 0;
        double loss_sum = 0.0, replay_ms = 0.0, norm = NAN, gn = NAN, un = NAN;
        int replayed = 0, n_alarms = 0, found_inf = 0, overflow = 0, skip = skip_due(run, s + 1);
        double bwd_r0 = NAN;                      /* the backward guard's largest blow-up / threshold, first attempt */
        int k_step = run->expscale_k;             /* k of this step (an overflow lowers it for the next) */
        double bwd_ms = 0.0;                      /* the backward guard's norms: their cost */
        char alarm_desc[200] = "", alarm_by[96] = "", det_fired[64] = "";
        float kscale = ldexpf(1.0f, run->expscale_k);            /* 2^k, exact */
        opt.lr = lr_at(s, a->lr, a->warmup, a->steps, a->final_lr_frac);
        DetectOut dout;
        memset(&dout, 0, sizeof(dout));
        char det_first[64] = "";                  /* the first attempt's detector verdicts (the one a fault hits) */
        double feat0[DET_NF] = {0}, score0 = NAN, gn0 = NAN, un0 = NAN;
        for (int attempt = 0; attempt < 2; attempt++) {
            double ta = wall_seconds();
            model_zero_grads(model);
            loss_sum = 0.0;
            double checks[CHECK_KINDS] = {0};   /* alarms of the in-forward checks, by kind */
            int chk_layer[CHECK_KINDS], chk_mb[CHECK_KINDS];
            for (int k = 0; k < CHECK_KINDS; k++) chk_layer[k] = chk_mb[k] = -1;
            for (int mb = 0; mb < a->accum; mb++) {
                shard_microbatch(&run->train, ts->data_pos, rank * a->accum + mb, a->B, T, inp, tgt);
                model_set_tokens(model, inp, tgt, N);
                run->fx.mb = mb;
                int tracing = run->trace.fp && run->fx.ev.pass == PASS_FWD && fault_due(&run->fx, run->fx.ev.site, run->fx.ev.layer, PASS_FWD);
                if (tracing) trace_clean(run, a->B, T);
                model_qk_reset(model);
                loss_sum += model_forward_step(model, a->B, T, 1);
                if (tracing) trace_write(run, a->B, T);
                if (run->gains)
                    model_rgg_gains(model, a->B, T, run->rgg.layers, run->rgg.n_mon,
                                    run->gains + ((size_t)(rank * a->accum + mb) * run->rgg.n_mon) * 2);
                model_backward_step(model, a->B, T, dloss * kscale);
                /* the microbatch's check alarms, forward and backward */
                for (int k = 0; k < CHECK_KINDS; k++) {
                    int cl, cn = model_check_alarms(model, k, &cl);
                    if (cn && !checks[k]) { chk_layer[k] = cl; chk_mb[k] = mb; }
                    checks[k] += cn;
                }
            }
            /* the step's alarm: check alarms summed over ranks; the Residual Gain Guard decided identically on
             * every rank from the gathered gains; the detectors from the all-reduced loss and gradients */
            dist_allreduce_sum_f64(&run->dist, checks, CHECK_KINDS);
            RggResult rr;
            memset(&rr, 0, sizeof(rr));
            if (run->gains) {
                dist_allgather_f64_block(&run->dist, run->gains, (size_t)a->accum * run->rgg.n_mon * 2);
                rr = rgg_check(&run->rgg, run->gains);
                if (!run->prot_rgg) rr.alarm = 0, rr.n_alarms = 0;   /* calibration alone never alarms */
            }
            model_allreduce_grads(model, &run->dist);
            dist_allreduce_sum_f64(&run->dist, &loss_sum, 1);
            double step_loss = loss_sum / ((double)a->accum * world);
            /* exponent scaling: unscale right before clipping; a non-finite gradient skips the update */
            double fi = model_unscale_check(model, ldexpf(1.0f, -run->expscale_k));
            dist_allreduce_sum_f64(&run->dist, &fi, 1);
            found_inf = fi > 0;
            /* the backward guard: a non-finite gradient, or a norm blow-up (global, a layer's, the rest's) */
            BwdResult br = {0, -1, 0, 0, 0};
            if (run->have_bwd) {
                double tb = wall_seconds();
                if (!found_inf) bwd_norms(run, bx);
                bwd_ms += (wall_seconds() - tb) * 1e3;
                br = bwd_check(&run->bwd, found_inf, bx);
                if (attempt == 0) bwd_r0 = found_inf ? INFINITY : br.max_ratio;
            }
            int bwd_alarm = run->prot_bwd && !run->bwd.calibrating && br.alarm;
            unsigned fired = 0;
            if (run->det.mask) {
                gn = un = NAN;
                if (detect_needs_norms(&run->det) && !found_inf) {
                    gn = model_grad_norm(model);
                    if (isfinite(gn)) un = model_update_norm(model, &opt, s + 1, a->grad_clip, gn);
                }
                dout = detect_check(&run->det, step_loss, found_inf, gn, un, (int)checks[CHECK_ABFT]);
                fired = dout.fired;
                detect_names(fired, det_fired, sizeof(det_fired));
                if (attempt == 0) {
                    memcpy(det_first, det_fired, sizeof(det_first));
                    memcpy(feat0, dout.feat, sizeof(feat0));
                    score0 = dout.score; gn0 = gn; un0 = un;
                }
            }
            int qk_alarm = run->prot_qk && checks[CHECK_QK] > 0, att_alarm = run->prot_att && checks[CHECK_ATT] > 0;
            int qkb_alarm = run->prot_qkb && checks[CHECK_QK_BWD] > 0, attb_alarm = run->prot_attb && checks[CHECK_ATT_BWD] > 0;
            int ew_alarm = run->prot_ew && checks[CHECK_EW] > 0;
            int det_alarm = fired && !run->det.observe;
            int alarm = qk_alarm || rr.alarm || att_alarm || det_alarm || bwd_alarm || qkb_alarm || attb_alarm || ew_alarm;
            if (attempt == 1) replay_ms = (wall_seconds() - ta) * 1e3;
            if (attempt == 1 && found_inf) overflow = 1;   /* non-finite with injection off: a real overflow */
            if (!alarm) {
                if (run->gains) rgg_admit(&run->rgg, run->gains);
                if (run->have_bwd && !found_inf) bwd_admit(&run->bwd, bx);
                if (run->det.mask) detect_admit(&run->det, step_loss, gn, un, fired);
                break;
            }
            n_alarms += (qk_alarm ? (int)checks[CHECK_QK] : 0) + rr.n_alarms + (att_alarm ? (int)checks[CHECK_ATT] : 0) +
                        (det_alarm ? __builtin_popcount(fired) : 0) + bwd_alarm + (qkb_alarm ? (int)checks[CHECK_QK_BWD] : 0) +
                        (attb_alarm ? (int)checks[CHECK_ATT_BWD] : 0) + (ew_alarm ? (int)checks[CHECK_EW] : 0);
            if (attempt == 0) {
                snprintf(alarm_by, sizeof(alarm_by), "%s%s%s%s%s%s%s%s%s", qk_alarm ? "qk," : "", rr.alarm ? "rgg," : "",
                         att_alarm ? "att," : "", qkb_alarm ? "qk_bwd," : "", attb_alarm ? "att_bwd," : "", ew_alarm ? "ew," : "",
                         bwd_alarm ? "bwd," : "", det_alarm ? det_fired : "", det_alarm ? "," : "");
                if (alarm_by[0]) alarm_by[strlen(alarm_by) - 1] = 0;
                const int kinds[AK_COUNT] = {qk_alarm, rr.alarm, att_alarm, qkb_alarm, attb_alarm, ew_alarm, bwd_alarm, det_alarm};
                for (int k = 0; k < AK_COUNT; k++) run->alarm_kind_steps[k] += kinds[k] != 0;
                if (qk_alarm) snprintf(alarm_desc, sizeof(alarm_desc), "qk: %d mismatch%s, first layer %d mb %d on rank %d",
                                       (int)checks[CHECK_QK], checks[CHECK_QK] > 1 ? "es" : "", chk_layer[CHECK_QK], chk_mb[CHECK_QK], rank);
                else if (rr.alarm) snprintf(alarm_desc, sizeof(alarm_desc), "rgg: %s layer %d %s obs %d (rank %d mb %d) z %.3g/%.3g rel %.3g/%.3g",
                              rr.why, rr.layer, rr.path ? "mlp" : "attn", rr.obs, rr.obs / a->accum, rr.obs % a->accum,
                              rr.z, rr.tau_z, rr.rel, rr.tau_rel);
                else if (att_alarm) snprintf(alarm_desc, sizeof(alarm_desc), "att: %d head%s failed, first layer %d mb %d on rank %d",
                                             (int)checks[CHECK_ATT], checks[CHECK_ATT] > 1 ? "s" : "", chk_layer[CHECK_ATT], chk_mb[CHECK_ATT], rank);
                else if (qkb_alarm) snprintf(alarm_desc, sizeof(alarm_desc), "qk_bwd: %d mismatch%s, first layer %d mb %d on rank %d",
                                             (int)checks[CHECK_QK_BWD], checks[CHECK_QK_BWD] > 1 ? "es" : "", chk_layer[CHECK_QK_BWD],
                                             chk_mb[CHECK_QK_BWD], rank);
                else if (attb_alarm) snprintf(alarm_desc, sizeof(alarm_desc), "att_bwd: %d head%s failed, first layer %d mb %d on rank %d",
                                              (int)checks[CHECK_ATT_BWD], checks[CHECK_ATT_BWD] > 1 ? "s" : "", chk_layer[CHECK_ATT_BWD],
                                              chk_mb[CHECK_ATT_BWD], rank);
                else if (ew_alarm) snprintf(alarm_desc, sizeof(alarm_desc), "ew: %d mismatch%s, first layer %d mb %d on rank %d",
                                            (int)checks[CHECK_EW], checks[CHECK_EW] > 1 ? "es" : "", chk_layer[CHECK_EW], chk_mb[CHECK_EW], rank);
                else if (bwd_alarm) {
                    char gname[32];
                    bwd_group_name(&run->bwd, br.group, gname, sizeof(gname));
                    if (found_inf || br.group < 0) snprintf(alarm_desc, sizeof(alarm_desc), "bwd: non-finite gradient");
                    else snprintf(alarm_desc, sizeof(alarm_desc), "bwd: %s gradient norm %.3g x its median (threshold %.3g x)",
                                  gname, exp(br.d), exp(br.tau));
                }
                else snprintf(alarm_desc, sizeof(alarm_desc), "detector %s: loss %.6g, z loss %.3g, z grad norm %.3g, z update norm %.3g%s",
                              det_fired, step_loss, dout.feat[0], dout.feat[1], dout.feat[2],
                              (fired >> DET_ABFT) & 1 ? " (attention checksum failed)" : "");
                if (alarm_by[0] && strcmp(alarm_by, alarm_desc) && (qk_alarm + rr.alarm + att_alarm + det_alarm + qkb_alarm + attb_alarm + ew_alarm) > 1)
                    snprintf(alarm_desc + strlen(alarm_desc), sizeof(alarm_desc) - strlen(alarm_desc), " [%s]", alarm_by);
                run->alarms_total++;
                run->fx.replay = 1;   /* the replay runs every microbatch again with injection off */
                replayed = 1;
                run->replays_total++;
            } else if (overflow) {
                /* the gradient is non-finite again with injection off: a real overflow, not a fault. Skip the
                 * update as AMP does and lower k */
                int k_old = run->expscale_k;
                if (run->expscale_k > 0) run->expscale_k--;
                if (rank == 0) fprintf(stderr, "warning: step %lld: the replay's gradient is non-finite too: a real overflow; update skipped "
                                               "(found_inf), exponent scaling k %d -> %d\n", s + 1, k_old, run->expscale_k);
            } else {
                /* the clean replay alarmed too: keep it (a second replay would compute the same bits) */
                if (rank == 0) fprintf(stderr, "warning: step %lld: the replay raised an alarm too (%s); its result is kept\n",
                                       s + 1, det_fired[0] ? det_fired : bwd_alarm ? "bwd" : "protection");
            }
        }
        run->fx.ev.active = 0; /* the event belongs to this step's microbatches, not to evaluation or sampling */
        run->fx.replay = 0;
        double inj = run->fx.injected;
        dist_allreduce_sum_f64(&run->dist, &inj, 1);
        if (inj > 0) {            /* the step's event (one a step: fault_plan_step), caught when its step was replayed */
            int ps = run->fx.ev.pass == PASS_BWD;
            run->ev_injected[run->fx.ev.site][ps]++;
            run->ev_caught[run->fx.ev.site][ps] += replayed;
        } else run->false_alarms += replayed;
        float loss = (float)(loss_sum / ((double)a->accum * world));
        if (!found_inf && !skip) norm = model_update(model, &opt, s + 1, a->grad_clip);
        else if (found_inf) run->found_inf_total++;
        else run->skipped_total++;            /* the lost-step control: no update, as if it were lost */
        run->overflow_total += overflow;
        char st_json[400] = "", st_line[160] = "";
        if (have_st) {   /* this step's device work: differences, but the device bytes now */
            model_device_stats(model, &st1);
#define ST_D(f) (st0.f < 0 || st1.f < 0 ? -1 : st1.f - st0.f)
#define ST_J(x) jcount(x).s
            long long L_ = ST_D(launches), S_ = ST_D(syncs), LS_ = ST_D(loop_syncs), D_ = ST_D(d2h), A_ = ST_D(alloc_bytes),
                      R_ = ST_D(ew_read), W_ = ST_D(ew_written), B_ = st1.dev_bytes;
            snprintf(st_json, sizeof(st_json), ",\"stats\":{\"launches\":%s,\"syncs\":%s,\"loop_syncs\":%s,\"d2h\":%s,\"dev_bytes\":%s,"
                     "\"alloc_bytes\":%s,\"ew_read\":%s,\"ew_written\":%s}", ST_J(L_), ST_J(S_), ST_J(LS_), ST_J(D_), ST_J(B_), ST_J(A_),
                     ST_J(R_), ST_J(W_));
            snprintf(st_line, sizeof(st_line), " | %lld launches, %lld syncs (%lld in layer loops), %.1f MB device, ew %.2f MB", L_, S_, LS_,
                     B_ / 1e6, (R_ + W_) / 1e6);
#undef ST_D
#undef ST_J
        }
        ts->step = s + 1;
        ts->data_pos = shard_advance(&run->train, ts->data_pos, span);
        double dt = wall_seconds() - t0, cpu_ms = (cpu_seconds() - c0) * 1e3;
        if (s > 0 || ts->step == last) { ms_sum += dt; timed++; }
        double tok_s = span / dt;
        char det_json[400] = "";
        if (run->det.mask)   /* the detectors' features and verdicts of the first attempt (the one a fault hits) */
            snprintf(det_json, sizeof(det_json), ",\"det\":\"%s\",\"feat\":[%s,%s,%s,%s,%s],\"score\":%s,\"gn\":%s,\"un\":%s",
                     det_first, jnum(feat0[0]).s, jnum(feat0[1]).s, jnum(feat0[2]).s, jnum(feat0[3]).s, jnum(feat0[4]).s,
                     jnum(score0).s, jnum(gn0).s, jnum(un0).s);
        if (rank == 0) {
            logger_line(&run->log, "{\"type\":\"step\",\"step\":%lld,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"ms\":%.3f,\"cpu_ms\":%.3f,"
                        "\"tok_s\":%.1f,\"k\":%d,\"alarms\":%d,\"injections\":%d,\"replayed\":%d,\"replay_ms\":%.3f,"
                        "\"found_inf\":%d,\"skip\":%d,\"overflow\":%d,\"bwd_r\":%s,\"bwd_ms\":%.3f,\"by\":\"%s\",\"alarm\":\"%s\"%s%s}",
                        (long long)ts->step, jnum(loss).s, opt.lr, jnum(norm).s, dt * 1e3, cpu_ms, tok_s, k_step, n_alarms,
                        (int)inj, replayed, replay_ms, found_inf, skip, overflow, jnum(bwd_r0).s, bwd_ms, alarm_by, alarm_desc, det_json, st_json);
            if (!a->quiet) {
                char eta[32];
                fmt_eta((last - ts->step) * (timed ? ms_sum / timed : dt), eta, sizeof(eta));
                printf("step %5lld/%d | loss %s | lr %.3e | norm %s | %.1f ms | %.0f tok/s | ETA %s%s%s%s%s%s\n",
                       (long long)ts->step, a->steps, num_fmt(loss, 6).s, opt.lr, num_fmt(norm, 4).s, dt * 1e3, tok_s, eta, st_line, inj > 0 ? " | fault injected" : "",
                       replayed ? " | ALARM, replayed: " : "", alarm_desc, found_inf ? " | found_inf: update skipped" : skip ? " | update skipped (-skip_steps)" : "");
                fflush(stdout);
            }
        }
        if (!isfinite(loss) && rank == 0) fprintf(stderr, "warning: non-finite loss at step %lld\n", (long long)ts->step);
        int at_end = ts->step == last;
        if (run->have_val && rank == 0 && ((a->eval_every && ts->step % a->eval_every == 0) || at_end)) {
            const char* pred = at_end && a->pred_out[0] ? a->pred_out : NULL;
            double vl = evaluate(run, pred);
            logger_line(&run->log, "{\"type\":\"eval\",\"step\":%lld,\"val_loss\":%s,\"ppl\":%s}", (long long)ts->step, jnum(vl).s, jnum(exp(vl)).s);
            printf("eval step %lld | val loss %.6f | ppl %.3f%s%s\n", (long long)ts->step, vl, exp(vl),
                   pred ? " | predictions " : "", pred ? pred : "");
        }
        if (rank == 0 && a->sample_every && (ts->step % a->sample_every == 0 || at_end)) sample(run);
        /* a stop signal (any rank's): this step is complete; leave with a checkpoint (below) */
        if (!at_end && (stop_sig = stop_agreed(run))) at_end = 1;
        if (a->save && ((a->ckpt_every && ts->step % a->ckpt_every == 0) || at_end)) {
            snprintf(path, sizeof(path), "%s/step_%06lld.ckpt", a->out, (long long)ts->step);
            save_checkpoint(run, path);
        }
        if (stop_sig) break;
    }
    if (!stop_sig && ts->step < last) stop_sig = stop_agreed(run);   /* a signal before the first step */
    if (a->steps == 0 && rank == 0) {     /* evaluation and sampling of a model as it is */
        if (run->have_val) {
            double vl = evaluate(run, a->pred_out[0] ? a->pred_out : NULL);
            logger_line(&run->log, "{\"type\":\"eval\",\"step\":%lld,\"val_loss\":%s,\"ppl\":%s}", (long long)ts->step, jnum(vl).s, jnum(exp(vl)).s);
            printf("eval step %lld | val loss %.6f | ppl %.3f\n", (long long)ts->step, vl, exp(vl));
        }
        if (a->sample_every) sample(run);
        if (!run->have_val && !a->sample_every)
            printf("note: -steps 0 without -val or -sample_every: the model was built and checked, nothing else to do\n");
    }
    if (stop_sig) {   /* outputs of a finished run only: a calibration or profile of part of the steps is not written */
        if (rank == 0 && (a->rgg_calibrate[0] || a->bwd_calibrate[0] || a->exp_profile[0] || a->pred_out[0]))
            printf("note: stopped early: the calibrations, the exponent profile and the final predictions are written "
                   "when the run reaches its last step (-resume continues it)\n");
        a->rgg_calibrate[0] = a->bwd_calibrate[0] = a->exp_profile[0] = 0;
    }
    if (a->rgg_calibrate[0] && rank == 0) {
        rgg_write_calibration(&run->rgg, a->rgg_calibrate);
        printf("calibration %s: %d clean steps, window %d seeded; floors (z, rel) per monitored layer:", a->rgg_calibrate,
               run->rgg.cal_steps, run->rgg.W);
        for (int i = 0; i < run->rgg.n_mon; i++)
            printf(" L%d attn (%.3g, %.3g) mlp (%.3g, %.3g)", run->rgg.layers[i], run->rgg.cal_z[i][0], run->rgg.cal_rel[i][0],
                   run->rgg.cal_z[i][1], run->rgg.cal_rel[i][1]);
        printf("\n");
    }
    if (a->bwd_calibrate[0] && rank == 0) {
        bwd_write_calibration(&run->bwd, a->bwd_calibrate);
        printf("backward-guard calibration %s: %d clean steps, window %d; thresholds (alpha x floor, as a factor over the median norm):",
               a->bwd_calibrate, run->bwd.cal_steps, run->bwd.count);
        for (int i = 0; i < run->bwd.n_groups; i++) {
            char gname[32];
            bwd_group_name(&run->bwd, i, gname, sizeof(gname));
            printf(" %s %.3g", gname, exp(run->bwd.alpha * fmax(run->bwd.cal_max[i], BWD_MIN_FLOOR)));
        }
        printf("\n");
    }
    if (a->exp_profile[0]) exp_profile_write(run, a->exp_profile);
    if (rank == 0) print_summary(run);
    uint64_t h = model_weights_checksum(model);
    dist_check_same(&run->dist, h, "at the end");
    if (rank == 0) {
        if (stop_sig)
            printf("stopped by %s after step %lld, %.1f s, final weights %016llx%s%s%s\n", signal_name(stop_sig), (long long)ts->step,
                   wall_seconds() - t_start, (unsigned long long)h, a->save ? ": -resume " : " (-save none: no checkpoint)",
                   a->save ? path : "", a->save ? " continues it" : "");
        else
            printf("done: step %lld, %.1f s, final weights %016llx%s\n", (long long)ts->step, wall_seconds() - t_start,
                   (unsigned long long)h, world > 1 ? " (identical on all ranks)" : "");
        logger_line(&run->log, "{\"type\":\"end\",\"step\":%lld,\"weights\":\"%016llx\",\"reason\":\"%s\"}", (long long)ts->step,
                    (unsigned long long)h, stop_sig ? signal_name(stop_sig) : "done");
        logger_close(&run->log);
    }
    free(inp); free(tgt);
    model_free(model);
    if (run->train.raw) shard_free(&run->train);
    if (run->have_val) shard_free(&run->val);
    if (run->have_tok) tokenizer_free(&run->tok);
    streamfile_close(&run->fx.log);
    if (run->gains) { rgg_free(&run->rgg); free(run->gains); }
    if (run->have_bwd) { bwd_free(&run->bwd); free(run->range_off); free(run->range_n); free(run->range_group); free(run->range_own); }
    free(bx); free(run->skip);
    detect_free(&run->det);
    streamfile_close(&run->trace);
    TRAINER_TEARDOWN();
    dist_finalize(&run->dist);
    return stop_sig ? 128 + stop_sig : 0;
}

#endif
