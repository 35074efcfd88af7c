/* setup.h: a run from its command line to its first step (host, both trainers): flags and the model's
 * config (from the preset or a checkpoint), the output paths checked, the data, the model built and its
 * weights initialised or loaded (-init: weights only; -resume: the exact state to continue bit for bit),
 * the fault injector and the protection set up, the log opened. Every check of the input happens here,
 * before anything is trained. */
#ifndef TSDC_SETUP_H
#define TSDC_SETUP_H

#include "../sdc/protect_run.h"

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

/* -train, -val and the decode table (-tokenizer, or tokenizer.bin beside -train) */
static void setup_data(Run* run) {
    const Args* a = &run->a;
    int T = run->c.seq_len, world = run->dist.world;
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
}

/* the weights and, with -resume, the optimizer state, step, data position and sampling RNG from a checkpoint
 * (ck: its header, read and validated by setup_config) */
static void setup_load_checkpoint(Run* run, const char* path, CkptInfo ck) {
    const Args* a = &run->a;
    Model* model = &run->model;
    TrainState* ts = &run->ts;
    int T = run->c.seq_len, rank = run->dist.rank, world = run->dist.world;
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
}

/* the model: built, its weights initialised (seeded) or loaded, perturbed for the clean envelope if asked,
 * and the same on every rank */
static void setup_model(Run* run, const char* ckpath, const CkptInfo* ck) {
    const Args* a = &run->a;
    Model* model = &run->model;
    int T = run->c.seq_len;
    model_build(model, &run->c, a->B, T, a->precision);
    TrainState* ts = &run->ts;
    ts->world = run->dist.world; ts->B = a->B; ts->A = a->accum; ts->T = T; ts->warmup = a->warmup; ts->total_steps = a->steps;
    ts->precision = a->precision; ts->lr = a->lr; ts->final_frac = a->final_lr_frac; ts->beta1 = a->beta1;
    ts->beta2 = a->beta2; ts->adam_eps = a->adam_eps; ts->weight_decay = a->weight_decay; ts->grad_clip = a->grad_clip;
    rng_seed(&run->sample_rng, a->seed ^ 0x5A3D1E5EULL);
    if (ckpath) setup_load_checkpoint(run, ckpath, *ck);
    else {
        double ti = wall_seconds();
        model_init_weights(model, a->seed);
        if (run->dist.rank == 0) printf("init: %zu weights in %.2f s (seed %llu)\n", model_num_params(model), wall_seconds() - ti, a->seed);
    }
    if (a->perturb != 0) perturb_weights(model, (long long)a->perturb, a->precision);
    dist_check_same(&run->dist, model_weights_checksum(model), "at start");
}

/* rank 0: the JSONL log (appended to on -resume) and its run record */
#ifndef TRAINER_KERNELS
#define TRAINER_KERNELS(precision) ""
#endif
static void setup_log(Run* run) {
    const Args* a = &run->a;
    if (run->dist.rank != 0) return;
    char logpath[1100];
    snprintf(logpath, sizeof(logpath), "%s/log.jsonl", a->out);
    logger_open(&run->log, logpath, a->resume[0] != 0);
    logger_line(&run->log, "{\"type\":\"run\",\"trainer\":\"" TRAINER_NAME "\",\"preset\":\"%s\",\"params\":%zu,\"n_layer\":%d,\"d_model\":%d,"
                "\"vocab\":%d,\"seq\":%d,\"B\":%d,\"accum\":%d,\"world\":%d,\"threads\":%d,\"precision\":\"%s\",\"steps\":%d,"
                "\"lr\":%.9g,\"warmup\":%d,\"seed\":%llu,\"start_step\":%lld,\"kernels\":\"%s\"}",
                run->c.preset, model_num_params(&run->model), run->c.n_layer, run->c.d_model, run->c.vocab_size, run->c.seq_len, a->B,
                a->accum, run->dist.world, run->threads, a->precision ? "bf16" : "fp32", a->steps, a->lr, a->warmup, a->seed,
                (long long)run->ts.step, TRAINER_KERNELS(a->precision));
}

/* everything before the first step; returns 1 when the run is only -version */
static int run_setup(Run* run, int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-version") || !strcmp(argv[i], "--version")) { print_build(); return 1; }
    memset(run, 0, sizeof(*run));
    dist_init(&run->dist, &argc, &argv);
    stop_handlers_install();
    int rank = run->dist.rank, world = run->dist.world;
    Args* a = &run->a;
    args_parse(a, argc, argv);
    const char* ckpath = a->resume[0] ? a->resume : a->init[0] ? a->init : NULL;
    CkptInfo ck;
    memset(&ck, 0, sizeof(ck));
    if (ckpath) {
        checkpoint_read(ckpath, &ck, NULL, NULL, NULL, 0); /* validate the file and read its config first */
        args_config_from_checkpoint(a, &ck.cfg, ckpath, a->resume[0] != 0, &run->c);
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
    if (rank == 0)
        printf("train_sdc (" TRAINER_NAME ") | preset %s | %zu parameters | %s | %d rank%s%s | %d thread%s | B %d x T %d x accum %d\n",
               run->c.preset, config_num_params(&run->c), a->precision ? TRAINER_BF16_NAME : "fp32", world,
               world == 1 ? "" : "s", dist_built_with_mpi() ? "" : " (built without MPI: single process)",
               run->threads, run->threads == 1 ? "" : "s", a->B, run->c.seq_len, a->accum);
    if (rank == 0 && TRAINER_KERNELS(a->precision)[0]) printf("kernels: %s\n", TRAINER_KERNELS(a->precision));
    setup_data(run);
    setup_model(run, ckpath, &ck);
    fault_setup(run);
    protect_setup(run);
    if (a->exp_profile[0]) model_exp_profile_start(&run->model, a->exp_samples, a->seed ^ 0xE4905EULL);
    setup_log(run);
    return 0;
}

/* what the run holds, freed; the device and the ranks let go */
static void run_teardown(Run* run) {
    model_free(&run->model);
    if (run->train.raw) shard_free(&run->train);
    if (run->have_val) shard_free(&run->val);
    if (run->have_tok) tokenizer_free(&run->tok);
    streamfile_close(&run->fx.log);
    if (run->gains) { rgg_free(&run->rgg); free(run->gains); }
    if (run->have_bwd) { bwd_free(&run->bwd); free(run->range_off); free(run->range_n); free(run->range_group); free(run->range_own); }
    free(run->bx); free(run->skip);
    detect_free(&run->det);
    streamfile_close(&run->trace);
    TRAINER_TEARDOWN();
    dist_finalize(&run->dist);
}

#endif
