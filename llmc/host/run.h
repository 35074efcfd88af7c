/* run.h: one training run's state on the host (Run) and the small pieces every part of the run uses: the
 * output directory and its checks, the graceful stop on a signal, checkpoints, the lost-step control's
 * list, numbers for people. Shared by both trainers; the model is the trainer's (llmc/host/backend.h). */
#ifndef TSDC_RUN_H
#define TSDC_RUN_H

#ifndef TRAINER_SETUP               /* device selection, NCCL (GPU trainer); nothing on the CPU */
#define TRAINER_SETUP(dist) ((void)0)
#define TRAINER_TEARDOWN() ((void)0)
#endif

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include "args.h"
#include "../sdc/bwdguard.h"
#include "checkpoint.h"
#include "../sdc/checks.h"
#include "dataloader.h"
#include "../sdc/detect.h"
#include "dist.h"
#include "../sdc/expscale.h"
#include "../sdc/fault.h"
#include "logger.h"
#include "../sdc/rgg.h"
#include "rng.h"
#include "schedule.h"
#include "stats.h"
#include "tokenizer.h"

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
    /* protection: the kinds on (PROT_KINDS, llmc/sdc/checks.h), exponent scaling's k */
    int prot[PK_COUNT];
    int expscale_k, exp_auto;
    Detect det;
    Rgg rgg;
    double* gains;             /* [n_obs][n_mon][2] gains of the step (all ranks, gathered) */
    /* backward guard: the gradient's groups as contiguous ranges (one per layer, the rest), llmc/sdc/bwdguard.h */
    BwdGuard bwd;
    int have_bwd, n_ranges;
    size_t *range_off, *range_n;
    int* range_own;            /* the backward guard's group of a matrix of its own, -1 for a vector */
    int* range_group;
    double* bx;                /* [n_groups] the step's log norms */
    /* lost-step control (-skip_steps): sorted step numbers */
    long long* skip;
    int n_skip;
    long long alarms_total, replays_total, found_inf_total, overflow_total, skipped_total;
    /* the end summary: alarmed steps by the kind that raised them, fault events by site and pass (injected,
     * and caught: their step alarmed and was replayed), alarmed steps without a fault */
    long long kind_steps[PK_COUNT];
    long long ev_injected[SITE_COUNT][2], ev_caught[SITE_COUNT][2];
    long long false_alarms;
} Run;

/* one optimizer step as the loop and the guards see it: its attempts (the first, and the replay after an
 * alarm), what the passes' checks counted, the guards' results and what the log line reports */
typedef struct {
    long long s;                        /* update number, 0-based: this is step s + 1 */
    int attempt;                        /* 0, or 1: the replay with injection off */
    int skip;                           /* the lost-step control skips this update */
    int k;                              /* exponent scaling's k of this step (an overflow lowers it for the next) */
    double loss_sum, loss;              /* this rank's microbatch losses; their mean over every rank and microbatch */
    double checks[CHECK_KINDS];         /* alarms of the in-pass checks, by CHECK_* kind (summed over ranks) */
    int chk_layer[CHECK_KINDS], chk_mb[CHECK_KINDS];   /* where each kind's first alarm was, on this rank */
    int found_inf, overflow, replayed, n_alarms;
    RggResult rr;
    BwdResult br;
    DetectOut dout;
    unsigned det_fired;                 /* the detectors that fired (1 << DET_*) */
    double gn, un;                      /* gradient and update norm (the detectors'), NAN when not computed */
    int fired[PK_COUNT], count[PK_COUNT];   /* the kinds that fired and how many alarms each counted */
    double norm, replay_ms, bwd_ms, bwd_r0;
    char alarm_desc[200], alarm_by[96], det_names[64];
    /* the first attempt's detector features and verdicts (the attempt a fault hits), for the log */
    char det_first[64];
    double feat0[DET_NF], score0, gn0, un0;
} Step;

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
static void fmt_eta(double s, char* buf, size_t n) {
    if (s < 0 || s != s) s = 0;
    long long t = (long long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%lldh%02lldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
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

#endif
