/* args.h: the command-line flags of both trainers, parsed and documented in one place.
 * The usage text below is the reference; docs/flags.md holds it verbatim (scripts/update_flag_docs.sh).
 * An unknown flag, a missing value or a malformed number is one error line naming the flag, "(see -h)",
 * and exit 1: the full text would scroll the error away. */
#ifndef TSDC_ARGS_H
#define TSDC_ARGS_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "config.h"

typedef struct {
    /* model */
    char preset[64];
    int preset_set;            /* -preset given (with -init/-resume the checkpoint's config is used) */
    int vocab, seq, n_layer;   /* overrides, 0 = the preset's or the checkpoint's */
    /* data */
    char train[1024], val[1024], tokenizer[1024];
    int B, accum;
    /* optimisation */
    int steps, warmup;
    double lr, final_lr_frac, beta1, beta2, adam_eps, weight_decay, grad_clip;
    int precision;             /* 0 fp32, 1 bf16, -1 the trainer's default (CPU fp32, GPU bf16) */
    unsigned long long seed;
    /* evaluation, sampling */
    int eval_every, eval_tokens, sample_every, sample_len;
    double temperature;
    char pred_out[1024];
    /* checkpoints, logs */
    char out[1024], resume[1024], init[1024];
    int ckpt_every, stop_at;
    int save;                  /* 0: -save none, no checkpoint is written */
    int threads;
    int quiet;
    int force;                 /* -force: a fresh run may start over in an -out that holds a run */
    int stats;                 /* -stats: device counts per step (llmc/host/stats.h) in the log and the step line */
    char cost_out[1024];       /* -cost_out FILE: the work records of the first step (GPU trainer, docs/cost_model.md) */
    /* fault injection (llmc/sdc/fault.h) */
    char fault_mode[16], fault_sites[512], fault_pass[8], fault_log[1024], fault_field[16];
    int fault_layer, fault_bits, fault_rank, fault_mb;
    long long fault_m, fault_start, fault_end;
    double fault_frac, fault_rate;
    unsigned long long fault_seed;
    char trace_out[1024];
    char fault_dtype[16];      /* storage (default), bf16, fp32, autocast: the dtype the flips happen in */
    double perturb;            /* clean-envelope perturbation: ulp-level, see -perturb */
    /* protection (TrainSDC) */
    char protect[64], rgg_layers[256], rgg_calibrate[1024], rgg_calibration[1024], exp_profile[1024];
    double rgg_alpha;
    int rgg_window, expscale_k, exp_samples;   /* expscale_k: -1 the default, -2 auto */
    /* backward guard (llmc/sdc/bwdguard.h) */
    char bwd_calibrate[1024], bwd_calibration[1024];
    double bwd_alpha;
    int bwd_window;
    /* lost-step control */
    char skip_steps[1024];
    /* baseline detectors (llmc/sdc/detect.h) */
    char detect[128], llmft_model[1024];
    int detect_observe, detect_window;
    double spike_z, harmful_z;
} Args;

static const char* USAGE =
"usage: train_sdc [flags]            (mpirun -np R ./train_sdc ... for data parallelism)\n"
"model\n"
"  -preset NAME       model preset (default tiny-llama): llama3.2-1b qwen3-0.6b smollm2-135m nanochat-d12\n"
"                     tiny-llama tiny-qwen3 tiny-nanochat; with -init or -resume the model is the\n"
"                     checkpoint's and -preset is optional (given, it must match the checkpoint)\n"
"  -vocab N           override the vocabulary size (default: the preset's; with a checkpoint it must match)\n"
"  -seq T             override the sequence length T (default: the preset's or the checkpoint's; with -init\n"
"                     any T, with -resume the checkpoint's)\n"
"  -n_layer N         keep only the first N layers (1 <= N <= the preset's or the checkpoint's layers): the\n"
"                     model at full width, shallower; with -init the checkpoint's first N layers, embedding,\n"
"                     final norm and head; with -resume it must equal the checkpoint's\n"
"data\n"
"  -train FILE        training token shard (required unless -steps 0)\n"
"  -val FILE          validation token shard (evaluation, predictions)\n"
"  -tokenizer FILE    decode table for sampling (default: tokenizer.bin beside -train)\n"
"  -B N               sequences per microbatch (default 8)\n"
"  -accum A           microbatches per step per rank, gradient accumulation (default 1)\n"
"optimisation (AdamW; docs/design.md)\n"
"  -steps N           total optimizer steps of the schedule (default 1000)\n"
"  -lr X              peak learning rate (default 5e-5)\n"
"  -warmup N          linear warmup steps (default 100)\n"
"  -final_lr_frac X   cosine floor as a fraction of -lr (default 0.1)\n"
"  -beta1 X -beta2 X  AdamW betas (default 0.9 0.95)\n"
"  -adam_eps X        AdamW epsilon (default 1e-8)\n"
"  -wd X              weight decay on matrices and embeddings (default 0.1)\n"
"  -clip X            global gradient-norm clipping, 0 = off (default 1.0)\n"
"  -precision P       fp32 (exact reference, CPU only) or bf16 (AMP; emulated on the CPU)\n"
"                     (default: fp32 on the CPU, bf16 on the GPU)\n"
"  -seed N            initialisation and sampling seed (default 8)\n"
"evaluation and sampling\n"
"  -eval_every N      evaluate on -val every N steps and at the end, 0 = only at the end (default 100)\n"
"  -eval_tokens N     positions of the fixed held-out set, from the start of -val (default 16384)\n"
"  -pred_out FILE     write the argmax predictions over the held-out set at the final evaluation\n"
"  -sample_every N    print a sample every N steps and at the end, 0 = off (default 0)\n"
"  -sample_len N      tokens a sample (default 64)\n"
"  -temp X            sampling temperature, 0 = argmax (default 1.0)\n"
"checkpoints and logs\n"
"  -out DIR           output directory: log.jsonl, step_NNNNNN.ckpt (default out); a fresh run into a DIR that\n"
"                     holds a run (log.jsonl, faults.jsonl or a checkpoint) is refused: -resume continues it\n"
"  -force             start a fresh run in an -out that holds a run (its logs are replaced)\n"
"  -ckpt_every N      write a checkpoint every N steps, 0 = only at the end (default 0)\n"
"  -resume FILE       resume exactly from a checkpoint (weights, AdamW state, step, data position, RNG)\n"
"  -init FILE         start from a checkpoint's weights only (e.g. imported with dev/reference/hf_to_ckpt.py)\n"
"  -stop_at S         stop after step S (the schedule still spans -steps), writing a checkpoint\n"
"                     SIGINT, SIGTERM or SIGUSR1 stop the run the same way after the step in progress (a\n"
"                     checkpoint, the log's end record with the signal, exit 128 + its number; a second\n"
"                     signal exits at once)\n"
"  -save W            all (checkpoints as -ckpt_every and at the end) or none (no checkpoint at all: benchmarks,\n"
"                     overhead runs) (default all)\n"
"  -threads N         OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
"  -quiet             no per-step lines on stdout (the log still has them)\n"
"  -stats             per step, the device work's counts (kernel launches, host synchronisations, those inside\n"
"                     the layer loops, device-to-host copies, device bytes, element-wise bytes; llmc/host/stats.h) in\n"
"                     the log's \"stats\" field and the step line; complete on the CUDA emulation (train_sdc_emu)\n"
"  -cost_out FILE     GPU trainer: the work records (component, unit, FLOPs, bytes, kernel, grid) of every launch\n"
"                     of the run's first step, its first attempt, to FILE (JSON lines; scripts/cost_model.py, under\n"
"                     EMU_COST_ONLY=1 on train_sdc_emu without running the kernels; docs/cost_model.md)\n"
"fault injection (docs/fault_model.md; every event is logged to OUT/faults.jsonl)\n"
"  -fault_mode M      off, char (characterisation) or campaign (one event a step) (default off)\n"
"  -fault_sites LIST  comma-separated sites, or all, or qk (the Q/K path): attn_norm q_proj k_proj v_proj\n"
"                     q_norm k_norm q_rope k_rope att_logits att_probs att_out o_proj attn_residual mlp_norm\n"
"                     gate_proj up_proj act mlp_product down_proj block_out (default all)\n"
"  -fault_pass P      fwd (module output), bwd (its gradient) or both (default fwd)\n"
"  -fault_layer L     layer to inject, -1 = drawn each event (default -1)\n"
"  -fault_m N         elements corrupted per event (default 100000, capped at the tensor size)\n"
"  -fault_frac F      corrupt round(F * size) elements instead of -fault_m (default 0 = use -fault_m)\n"
"  -fault_bits K      distinct bits flipped per element, in the storage dtype (default 4, or all of the\n"
"                     -fault_field's bits where it has fewer: the sign's 1)\n"
"  -fault_field F     draw the flipped bits from all, exponent, mantissa or sign (default all)\n"
"  -fault_rank R      rank to inject, -1 = drawn (default 0)\n"
"  -fault_mb A        microbatch to inject, -1 = drawn (default -1)\n"
"  -fault_rate X      char mode: fraction of the window's steps with an event (default 0.01)\n"
"  -fault_start S     first step of the fault window (default 1)\n"
"  -fault_end S       last step of the fault window (default: the last step)\n"
"  -fault_seed N      seed of the schedule and of the shared element/bit selection (default 1234)\n"
"  -fault_dtype D     the dtype the bits are flipped in: storage (the trainer's storage dtype: fp32 under\n"
"                     -precision fp32, bf16 under bf16), bf16, fp32 (every site as if stored in fp32), or\n"
"                     autocast (each site in the dtype PyTorch autocast stores it in: fp32 for the residual\n"
"                     stream and the RMSNorm outputs and their gradients, bf16 elsewhere) (default storage)\n"
"  -trace_out FILE    propagation trace (Experiment 2): for each forward event, run the microbatch clean and\n"
"                     faulty and write R_x at every downstream module output as JSONL\n"
"protection (TrainSDC, docs/protection.md; alarms are logged and the step is replayed)\n"
"  -protect LIST      none, paper, all, or any of qk (Q/K path recomputation), rgg (Residual Gain Guard), exp\n"
"                     (exponent scaling), att (cheap attention checks: logits row checksums, probability rows\n"
"                     sum to one; llmc/sdc/attcheck.h), bwd (backward guard: replay on a non-finite gradient or a\n"
"                     gradient-norm blow-up, global, per layer and per weight matrix; llmc/sdc/bwdguard.h), qk_bwd\n"
"                     (the backward's Q/K path, dlogits to the q/k projections' gradients, recomputed and\n"
"                     compared), att_bwd (backward attention checks: dprobs row checksums, dlogits rows sum\n"
"                     to zero, dV column sums), ew (the element-wise kernels, norms, residual adds, activation,\n"
"                     gated product and their gradients, recomputed and compared), bound (the forward's v, o,\n"
"                     gate, up and down projections' outputs under |x_i| |w_j|, Cauchy-Schwarz;\n"
"                     llmc/sdc/bound.h), comma-separated. paper = qk,rgg,exp with k 15 (the paper's method);\n"
"                     all = qk,rgg,att,qk_bwd,att_bwd,ew,bound,bwd,exp (every\n"
"                     kind, on both trainers) with k chosen from the run's own profile at its start (-expscale_k\n"
"                     auto); a kind this trainer does not run is an error, named alone or through paper or all\n"
"                     (\"-protect X: not available on this trainer\") (default none)\n"
"  -rgg_calibration F load the Residual Gain Guard's calibration (seed window and floors) from F\n"
"  -rgg_calibrate F   calibration mode: run the steps clean, seed the window with the first -rgg_window of\n"
"                     them, record the largest clean scores as floors, write F at the end (no alarms)\n"
"  -rgg_alpha X       threshold multiplier alpha (default 2.5)\n"
"  -rgg_layers LIST   monitored layers, comma-separated (default four evenly spaced: 0,5,10,15 for 16)\n"
"  -rgg_window W      accepted steps in the sliding window (default 64)\n"
"  -expscale_k K      scale the loss by 2^K, unscale right before clipping; a non-finite gradient then\n"
"                     skips the update (found_inf); auto: profile dL/dY on the first step's microbatches\n"
"                     (injection off) and take k* = argmin R_amp (llmc/sdc/expscale.h) (default: auto with\n"
"                     -protect all, 15 with -protect paper or exp, else 0)\n"
"  -exp_profile F     write the exponent-code histograms of dL/dY at every linear layer, sampled on every\n"
"                     step of this run, to F (JSON) at the end, for scripts/expscale_select.py\n"
"  -exp_samples N     samples a linear layer a microbatch for -exp_profile (default 8192)\n"
"  -bwd_alpha X       backward guard: alarm when a gradient norm (global, a layer's, or the rest's) exceeds\n"
"                     its median over the window by more than X times the larger of its calibrated floor,\n"
"                     the window's own spread and log(2)/2.5, in log (default 2.5)\n"
"  -bwd_window W      backward guard: accepted steps in its window (default 32, at most 1024)\n"
"  -bwd_calibrate F   run the steps clean, record the backward guard's window and its largest clean\n"
"                     blow-ups as floors, write F at the end (no alarms)\n"
"  -bwd_calibration F load the backward guard's calibration from F\n"
"  -skip_steps FILE   lost-step control: skip the update of every step listed in FILE (step numbers,\n"
"                     whitespace or comma separated, # comments) as a found_inf would, with no fault\n"
"baseline detectors (docs/protection.md; each alarm replays the step like TrainSDC's, llmc/sdc/detect.h)\n"
"  -detect LIST       none, or any of loss (loss spike), nan (Inf/NaN in the loss or gradients), abft\n"
"                     (ATTNChecker-style checksums of the attention matrix products), harmful (AdamW update\n"
"                     norm and gradient norm against their history), llmft (learned detector, needs\n"
"                     -llmft_model), comma-separated (default none)\n"
"  -detect_observe 1  compute the -detect detectors and log their features and verdicts, never replay\n"
"                     (to train -llmft_model on a campaign; to study the detectors) (default 0)\n"
"  -detect_window W   accepted steps of history of the loss/norm detectors (default 32; they check from the\n"
"                     8th accepted step on)\n"
"  -spike_z X         loss spike: alarm when loss > median + X * max(1.4826 MAD, 1% of median) (default 6)\n"
"  -harmful_z X       harmful update: alarm when log gradient norm or log update norm exceeds median +\n"
"                     X * max(1.4826 MAD, 0.25) (default 6)\n"
"  -llmft_model F     the learned detector's model (scripts/llmft_train.py writes it)\n"
"  -perturb X         clean-envelope repeats: add X ulps (integer, +-; bf16 ulps under -precision bf16) to the\n"
"                     first element of every weight matrix at the start (0 = off); the trainer is otherwise\n"
"                     bitwise deterministic\n"
"  -version           print how this binary was built (MPI, OpenMP, CUDA) and exit\n"
"  -h                 this text\n";

static void usage_fail(const char* fmt, const char* a) {
    fflush(stdout);
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, " (see -h)\n");
    tsdc_abort(1);
}

static long long parse_int(const char* flag, const char* v, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v) usage_fail("flag %s: not an integer", flag);
    if (x < lo || x > hi) {
        fprintf(stderr, "error: flag %s: %lld out of range [%lld, %lld] (see -h)\n", flag, x, lo, hi);
        tsdc_abort(1);
    }
    return x;
}
static double parse_double(const char* flag, const char* v, double lo, double hi) {
    char* end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || x != x) usage_fail("flag %s: not a number", flag);
    if (x < lo || x > hi) {
        fprintf(stderr, "error: flag %s: %g out of range [%g, %g] (see -h)\n", flag, x, lo, hi);
        tsdc_abort(1);
    }
    return x;
}

static void args_defaults(Args* a) {
    memset(a, 0, sizeof(*a));
    snprintf(a->preset, sizeof(a->preset), "tiny-llama");
    a->B = 8; a->accum = 1;
    a->steps = 1000; a->warmup = 100;
    a->lr = 5e-5; a->final_lr_frac = 0.1; a->beta1 = 0.9; a->beta2 = 0.95; a->adam_eps = 1e-8;
    a->weight_decay = 0.1; a->grad_clip = 1.0;
    a->seed = 8;
    a->save = 1;
    a->precision = -1;
    a->eval_every = 100; a->eval_tokens = 16384; a->sample_len = 64; a->temperature = 1.0;
    snprintf(a->out, sizeof(a->out), "out");
    snprintf(a->fault_mode, sizeof(a->fault_mode), "off");
    snprintf(a->fault_sites, sizeof(a->fault_sites), "all");
    snprintf(a->fault_pass, sizeof(a->fault_pass), "fwd");
    snprintf(a->fault_field, sizeof(a->fault_field), "all");
    a->fault_layer = -1; a->fault_bits = 0; a->fault_rank = 0; a->fault_mb = -1;   /* fault_bits 0: the default */
    a->fault_m = 100000; a->fault_start = 1; a->fault_end = -1; a->fault_rate = 0.01; a->fault_seed = 1234;
    snprintf(a->protect, sizeof(a->protect), "none");
    a->rgg_alpha = 2.5; a->rgg_window = 64; a->expscale_k = -1; a->exp_samples = 8192;
    a->bwd_alpha = 2.5; a->bwd_window = 32;
    snprintf(a->fault_dtype, sizeof(a->fault_dtype), "storage");
    snprintf(a->detect, sizeof(a->detect), "none");
    a->detect_window = 32; a->spike_z = 6; a->harmful_z = 6;
}

/* a flag that takes a value: matched by name first, so that a known flag without its value (the last word
 * of the line) says so and an unknown one says unknown */
#define VALFLAG(name) if (!strcmp(f, name) && (v || (usage_fail("flag %s needs a value", f), 1)))
#define STRFLAG(name, field) VALFLAG(name) { snprintf(a->field, sizeof(a->field), "%s", v); continue; }
#define INTFLAG(name, field, lo, hi) VALFLAG(name) { a->field = (int)parse_int(f, v, lo, hi); continue; }
#define DBLFLAG(name, field, lo, hi) VALFLAG(name) { a->field = parse_double(f, v, lo, hi); continue; }

static void args_parse(Args* a, int argc, char** argv) {
    args_defaults(a);
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { printf("%s", USAGE); exit(0); }
        if (!strcmp(f, "-quiet")) { a->quiet = 1; continue; }
        if (!strcmp(f, "-stats")) { a->stats = 1; continue; }
        if (!strcmp(f, "-force")) { a->force = 1; continue; }
        if (f[0] != '-') usage_fail("unexpected argument '%s'", f);
        const char* v = i + 1 < argc ? argv[++i] : NULL;
        VALFLAG("-preset") { snprintf(a->preset, sizeof(a->preset), "%s", v); a->preset_set = 1; continue; }
        STRFLAG("-train", train) STRFLAG("-val", val) STRFLAG("-tokenizer", tokenizer)
        STRFLAG("-pred_out", pred_out) STRFLAG("-out", out) STRFLAG("-resume", resume) STRFLAG("-init", init)
        INTFLAG("-vocab", vocab, 2, 1 << 30) INTFLAG("-seq", seq, 1, 1 << 20) INTFLAG("-n_layer", n_layer, 1, 1 << 20)
        INTFLAG("-B", B, 1, 1 << 20) INTFLAG("-accum", accum, 1, 1 << 20)
        INTFLAG("-steps", steps, 0, 1 << 30) INTFLAG("-warmup", warmup, 0, 1 << 30)
        DBLFLAG("-lr", lr, 0, 10) DBLFLAG("-final_lr_frac", final_lr_frac, 0, 1)
        DBLFLAG("-beta1", beta1, 0, 0.999999) DBLFLAG("-beta2", beta2, 0, 0.999999999)
        DBLFLAG("-adam_eps", adam_eps, 0, 1) DBLFLAG("-wd", weight_decay, 0, 10) DBLFLAG("-clip", grad_clip, 0, 1e30)
        VALFLAG("-precision") {
            if (!strcmp(v, "fp32")) a->precision = 0;
            else if (!strcmp(v, "bf16")) a->precision = 1;
            else usage_fail("flag -precision: '%s' is not fp32 or bf16", v);
            continue;
        }
        VALFLAG("-seed") { a->seed = (unsigned long long)parse_int(f, v, 0, (long long)1 << 62); continue; }
        INTFLAG("-eval_every", eval_every, 0, 1 << 30) INTFLAG("-eval_tokens", eval_tokens, 1, 1 << 30)
        INTFLAG("-sample_every", sample_every, 0, 1 << 30) INTFLAG("-sample_len", sample_len, 1, 1 << 20)
        DBLFLAG("-temp", temperature, 0, 100)
        INTFLAG("-ckpt_every", ckpt_every, 0, 1 << 30) INTFLAG("-stop_at", stop_at, 1, 1 << 30)
        INTFLAG("-threads", threads, 1, 4096)
        VALFLAG("-save") {
            if (!strcmp(v, "all")) a->save = 1;
            else if (!strcmp(v, "none")) a->save = 0;
            else usage_fail("flag -save: '%s' is not all or none", v);
            continue;
        }
        STRFLAG("-fault_mode", fault_mode) STRFLAG("-fault_sites", fault_sites) STRFLAG("-fault_pass", fault_pass) STRFLAG("-fault_field", fault_field)
        STRFLAG("-trace_out", trace_out) STRFLAG("-cost_out", cost_out)
        STRFLAG("-protect", protect) STRFLAG("-rgg_layers", rgg_layers) STRFLAG("-rgg_calibrate", rgg_calibrate)
        STRFLAG("-rgg_calibration", rgg_calibration) STRFLAG("-exp_profile", exp_profile)
        DBLFLAG("-rgg_alpha", rgg_alpha, 0, 1e6) INTFLAG("-rgg_window", rgg_window, 1, 1 << 16)
        if (!strcmp(f, "-expscale_k") && v && !strcmp(v, "auto")) { a->expscale_k = -2; continue; }
        INTFLAG("-expscale_k", expscale_k, 0, 127) INTFLAG("-exp_samples", exp_samples, 1, 1 << 24)
        DBLFLAG("-bwd_alpha", bwd_alpha, 0, 1e6) INTFLAG("-bwd_window", bwd_window, 8, 1024)
        STRFLAG("-bwd_calibrate", bwd_calibrate) STRFLAG("-bwd_calibration", bwd_calibration)
        STRFLAG("-skip_steps", skip_steps) STRFLAG("-fault_dtype", fault_dtype)
        STRFLAG("-detect", detect) STRFLAG("-llmft_model", llmft_model)
        INTFLAG("-detect_observe", detect_observe, 0, 1) INTFLAG("-detect_window", detect_window, 8, 1 << 16)
        DBLFLAG("-spike_z", spike_z, 0, 1e6) DBLFLAG("-harmful_z", harmful_z, 0, 1e6)
        INTFLAG("-fault_layer", fault_layer, -1, 1 << 20) INTFLAG("-fault_bits", fault_bits, 1, 32)
        INTFLAG("-fault_rank", fault_rank, -1, 1 << 20) INTFLAG("-fault_mb", fault_mb, -1, 1 << 20)
        DBLFLAG("-fault_frac", fault_frac, 0, 1) DBLFLAG("-fault_rate", fault_rate, 0, 1) DBLFLAG("-perturb", perturb, -1e6, 1e6)
        VALFLAG("-fault_m") { a->fault_m = parse_int(f, v, 0, (long long)1 << 40); continue; }
        VALFLAG("-fault_start") { a->fault_start = parse_int(f, v, 1, (long long)1 << 40); continue; }
        VALFLAG("-fault_end") { a->fault_end = parse_int(f, v, -1, (long long)1 << 40); continue; }
        VALFLAG("-fault_seed") { a->fault_seed = (unsigned long long)parse_int(f, v, 0, (long long)1 << 62); continue; }
        usage_fail("unknown flag %s", f);
    }
    if (a->resume[0] && a->init[0]) usage_fail("%s", "-resume and -init exclude each other");
    if (strcmp(a->fault_mode, "off") && strcmp(a->fault_mode, "char") && strcmp(a->fault_mode, "campaign"))
        usage_fail("flag -fault_mode: '%s' is not off, char or campaign", a->fault_mode);
    if (strcmp(a->fault_pass, "fwd") && strcmp(a->fault_pass, "bwd") && strcmp(a->fault_pass, "both"))
        usage_fail("flag -fault_pass: '%s' is not fwd, bwd or both", a->fault_pass);
    if (strcmp(a->fault_field, "all") && strcmp(a->fault_field, "exponent") && strcmp(a->fault_field, "mantissa") &&
        strcmp(a->fault_field, "sign"))
        usage_fail("flag -fault_field: '%s' is not all, exponent, mantissa or sign", a->fault_field);
    if (strcmp(a->fault_dtype, "storage") && strcmp(a->fault_dtype, "bf16") && strcmp(a->fault_dtype, "fp32") &&
        strcmp(a->fault_dtype, "autocast"))
        usage_fail("flag -fault_dtype: '%s' is not storage, bf16, fp32 or autocast", a->fault_dtype);
    if (a->perturb != floor(a->perturb)) usage_fail("%s", "flag -perturb: a whole number of ulps");
}

static const Config* args_preset(const Args* a) {
    const Config* p = preset_find(a->preset);
    if (!p) {
        fprintf(stderr, "error: flag -preset: unknown preset '%s'; known:", a->preset);
        for (int i = 0; i < N_PRESETS; i++) fprintf(stderr, " %s", PRESETS[i].name);
        fprintf(stderr, "\n");
        tsdc_abort(1);
    }
    return p;
}

/* the model config the flags ask for: preset plus overrides */
static void args_config(const Args* a, Config* c) {
    *c = *args_preset(a);
    if (a->vocab) c->vocab_size = a->vocab;
    if (a->seq) c->seq_len = a->seq;
    if (a->n_layer) {
        if (a->n_layer > c->n_layer)
            tsdc_fail("flag -n_layer %d: preset %s has %d layers (-n_layer keeps the first N)", a->n_layer, c->preset, c->n_layer);
        c->n_layer = a->n_layer;
    }
    config_validate(c, "flags");
}

/* the model config of a run from a checkpoint (-init or -resume): the checkpoint's. A flag given
 * beside it must agree, else one line names both values. What may differ: -seq with -init (the
 * training length; RoPE is computed per position), -n_layer N <= the checkpoint's with -init (its first
 * N layers). With -resume everything must match (check_resume_matches compares -seq and the rest). */
static void args_config_from_checkpoint(const Args* a, const Config* ck, const char* path, int resume, Config* c) {
    *c = *ck;
    char va[64], vb[64];
    if (a->preset_set) {
        Config want = *args_preset(a);
        if (a->vocab) want.vocab_size = a->vocab;
        if (a->n_layer) want.n_layer = ck->n_layer; /* -n_layer is checked below */
        const char* f = config_diff_values(ck, &want, va, vb, sizeof(va));
        if (f) tsdc_fail("%s: checkpoint config differs from the flags: %s %s in the checkpoint, %s in -preset %s (the model "
                         "comes from the checkpoint: -preset may be left out)", path, f, va, vb, a->preset);
        snprintf(c->preset, sizeof(c->preset), "%s", want.preset);
    }
    if (a->vocab && a->vocab != ck->vocab_size)
        tsdc_fail("%s: checkpoint has vocab %d, flag -vocab %d (the vocabulary is the checkpoint's)", path, ck->vocab_size, a->vocab);
    if (a->n_layer && a->n_layer != ck->n_layer) {
        if (resume)
            tsdc_fail("%s: checkpoint has n_layer %d, flag -n_layer %d (-resume continues the same model; use -init to cut layers)",
                      path, ck->n_layer, a->n_layer);
        if (a->n_layer > ck->n_layer)
            tsdc_fail("%s: checkpoint has n_layer %d, flag -n_layer %d (-n_layer keeps the first N)", path, ck->n_layer, a->n_layer);
        c->n_layer = a->n_layer;
    }
    if (a->seq) c->seq_len = a->seq;
    config_validate(c, path);
}

#endif
