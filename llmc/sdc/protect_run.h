/* protect_run.h: the fault injector and the protection as one run drives them (host, both trainers):
 * their set-up from the flags, the propagation trace, exponent scaling's choice of k, the backward guard's
 * groups, the step's verdict (which kinds fired; the replay), the calibrations written at the end, and the
 * end summary. The kinds themselves are PROT_KINDS (llmc/sdc/checks.h); the checks run inside the trainers'
 * passes, the guards' statistics in llmc/sdc/rgg.h, llmc/sdc/bwdguard.h, llmc/detect.h. */
#ifndef TSDC_PROTECT_RUN_H
#define TSDC_PROTECT_RUN_H

#include "../host/run.h"

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
     * the flag's value: refuse it. The default is 4, or the field's bits where it has fewer (the sign's 1),
     * so that the log records the bits actually flipped */
    int given = fc->nbits > 0;
    if (!given) fc->nbits = 4;
    for (int st = 0; st < SITE_COUNT; st++) {
        if (!(fc->sites & (1u << st))) continue;
        int w = fx->site_width[st] ? fx->site_width[st] : fx->width, lo, hi;
        fault_field_range(fc->field, w, &lo, &hi);
        if (fc->nbits <= hi - lo) continue;
        if (!given) { fc->nbits = hi - lo; continue; }
        if (fc->field == FIELD_ALL)
            tsdc_fail("flag -fault_bits %d: more than the %d bits of the %s storage of site %s", fc->nbits, w, w == 32 ? "fp32" : "bf16", SITE_NAMES[st]);
        tsdc_fail("flag -fault_bits %d: more than the %d bits of the %s field of %s (site %s)", fc->nbits, hi - lo, a->fault_field,
                  w == 32 ? "fp32" : "bf16", SITE_NAMES[st]);
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
    if (!run->prot[PK_BWD] && !a->bwd_calibrate[0]) {
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
    run->bx = (double*)callocCheck((size_t)run->bwd.n_groups, sizeof(double));
    if (a->bwd_calibrate[0]) run->bwd.calibrating = 1;
    if (a->bwd_calibration[0]) bwd_load_calibration(&run->bwd, a->bwd_calibration);
    else if (run->prot[PK_BWD] && !a->bwd_calibrate[0] && run->dist.rank == 0)
        printf("note: -protect bwd without -bwd_calibration: the backward guard's window seeds itself from the first %d steps, "
               "on which only a non-finite gradient alarms\n", a->bwd_window);
}

/* the backward guard's inputs: the log norms of every group (x[n_groups]) of the gradients as they are
 * now (all-reduced, unscaled), the global one last */
static void bwd_norms(Run* run, double* x) {
    int G = run->bwd.n_groups;
    double* ss = (double*)callocCheck((size_t)G, sizeof(double));
    static long long n_dump = 0;   /* the evaluations, for the test-only dump (llmc/sdc/checks.h) */
    FILE* dump = run->dist.rank == 0 ? check_dump_file() : NULL;
    if (dump) fprintf(dump, "{\"kind\":\"gss\",\"n\":%lld,\"ss\":[", ++n_dump);
    for (int r = 0; r < run->n_ranges; r++) {
        double v = model_grad_sumsq_range(&run->model, run->range_off[r], run->range_n[r]);
        if (run->range_own[r] >= 0) ss[run->range_own[r]] += v;   /* the matrix's own group */
        ss[run->range_group[r]] += v;     /* its layer, or "other" */
        ss[G - 1] += v;
        if (dump) fprintf(dump, "%s%s", r ? "," : "", jnum(v).s);
    }
    if (dump) fprintf(dump, "]}\n");
    bwd_log_norms(&run->bwd, ss, x);
    free(ss);
}

/* -expscale_k auto: profile dL/dY on the microbatches of the coming step with injection off and the loss
 * unscaled (gradients discarded), and take k* = argmin R_amp (llmc/sdc/expscale.h); the same on every rank
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

/* -protect and the Residual Gain Guard's set-up from the flags. The kinds and the sets paper and all are
 * PROT_KINDS's (llmc/sdc/checks.h, protect_parse); a kind this trainer does not provide is an error, named alone or
 * through paper or all: the sets mean the same kinds on both trainers. */
static void protect_setup(Run* run) {
    Args* a = &run->a;
    int provided[PK_COUNT], all = 0;
    char err[400];
    for (int k = 0; k < PK_COUNT; k++) provided[k] = !TRAINER_GPU || PROT_KINDS[k].gpu;
    if (protect_parse(a->protect, provided, run->prot, &all, err, sizeof(err))) {
        fflush(stdout);
        fprintf(stderr, "error: %s\n", err);
        tsdc_abort(1);
    }
    if (all) run->exp_auto = 1;
    if (run->dist.rank == 0 && (all || strstr(a->protect, "paper"))) {   /* what a set stands for, on this trainer */
        char on[200] = "";
        for (int k = 0; k < PK_COUNT; k++)
            if (run->prot[k]) snprintf(on + strlen(on), sizeof(on) - strlen(on), "%s%s", on[0] ? "," : "", PROT_KINDS[k].name);
        printf("-protect %s: %s\n", a->protect, on);
    }
    detect_init(&run->det, detect_parse(a->detect), a->detect_observe, a->detect_window, a->spike_z, a->harmful_z, a->llmft_model);
    if (a->detect_observe && !run->det.mask) usage_fail("%s", "-detect_observe 1 needs -detect LIST (the detectors to observe)");
    run->prot[PK_DETECT] = run->det.mask != 0;
    model_set_abft(&run->model, (run->det.mask >> DET_ABFT) & 1);
    /* k: explicit, or auto (chosen at the start of the run: select_expscale_k), or 15 (the paper's) with exp */
    if (a->expscale_k == -2) run->exp_auto = 1;
    else if (a->expscale_k >= 0) run->exp_auto = 0;
    run->expscale_k = a->expscale_k >= 0 ? a->expscale_k : (run->prot[PK_EXP] || run->exp_auto ? 15 : 0);
    if (run->exp_auto) run->prot[PK_EXP] = 1;
    for (int k = 0; k < PK_COUNT; k++)
        if (k != PK_RGG) model_set_protect(&run->model, k, run->prot[k]);
    bwd_setup(run);
    skip_setup(run);
    if (a->rgg_calibrate[0] && a->rgg_calibration[0]) usage_fail("%s", "-rgg_calibrate and -rgg_calibration exclude each other");
    if (!run->prot[PK_RGG] && !a->rgg_calibrate[0]) {
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
    model_set_protect(&run->model, PK_RGG, 1);   /* the statistics, for the guard or its calibration */
    if (run->prot[PK_RGG] && !a->rgg_calibration[0] && !a->rgg_calibrate[0] && run->dist.rank == 0)
        printf("note: -protect rgg without -rgg_calibration: the window seeds itself from the first %d steps, which are "
               "not checked\n", a->rgg_window);
}

/* ------------------------------------------------------------------------------- the step's verdict
 * After the microbatches of an attempt and the reduction over ranks: every enabled kind of PROT_KINDS
 * is asked whether it fired (the passes' checks from their counts, the Residual Gain Guard from the
 * gathered gains (st->rr), the backward guard from the gradients' norms, the detectors), and the step
 * alarms when any did. The same on every rank: each input is all-reduced or gathered first. */
static void guards_verdict(Run* run, Step* st, const AdamW* opt) {
    Model* model = &run->model;
    const Args* a = &run->a;
    /* the backward guard: a non-finite gradient, or a norm blow-up (global, a layer's, a matrix's, the rest's) */
    BwdResult br = {0, -1, 0, 0, 0};
    if (run->have_bwd) {
        double tb = wall_seconds();
        if (!st->found_inf) bwd_norms(run, run->bx);
        st->bwd_ms += (wall_seconds() - tb) * 1e3;
        br = bwd_check(&run->bwd, st->found_inf, run->bx);
        if (st->attempt == 0) st->bwd_r0 = st->found_inf ? INFINITY : br.max_ratio;
    }
    st->br = br;
    /* the baseline detectors, from the loss and the all-reduced gradients */
    unsigned fired = 0;
    if (run->det.mask) {
        st->gn = st->un = NAN;
        if (detect_needs_norms(&run->det) && !st->found_inf) {
            st->gn = model_grad_norm(model);
            if (isfinite(st->gn)) st->un = model_update_norm(model, opt, st->s + 1, a->grad_clip, st->gn);
        }
        st->dout = detect_check(&run->det, st->loss, st->found_inf, st->gn, st->un, (int)st->checks[CHECK_ABFT]);
        fired = st->dout.fired;
        detect_names(fired, st->det_names, sizeof(st->det_names));
        if (st->attempt == 0) {
            memcpy(st->det_first, st->det_names, sizeof(st->det_first));
            memcpy(st->feat0, st->dout.feat, sizeof(st->feat0));
            st->score0 = st->dout.score; st->gn0 = st->gn; st->un0 = st->un;
        }
    }
    st->det_fired = fired;
    /* each kind: fired, and how many alarms it counts */
    for (int k = 0; k < PK_COUNT; k++) {
        const ProtKind* K = &PROT_KINDS[k];
        int on = run->prot[k], n = 0, f = 0;
        if (K->check >= 0) { n = on && st->checks[K->check] > 0 ? (int)st->checks[K->check] : 0; f = n > 0; }
        else if (k == PK_RGG) { f = st->rr.alarm; n = st->rr.n_alarms; }
        else if (k == PK_BWD) { f = on && !run->bwd.calibrating && br.alarm; n = f; }
        else if (k == PK_DETECT) { f = fired && !run->det.observe; n = f ? __builtin_popcount(fired) : 0; }
        st->fired[k] = f;
        st->count[k] = n;
    }
}

static int verdict_alarm(const Step* st) {
    for (int k = 0; k < PK_COUNT; k++) if (st->fired[k]) return 1;
    return 0;
}

/* the first attempt's alarm in words: the first kind that fired describes it, the others are named after it */
static void verdict_describe(const Run* run, Step* st) {
    const Args* a = &run->a;
    int rank = run->dist.rank, n_fired = 0;
    char* by = st->alarm_by;
    by[0] = 0;
    for (int k = 0; k < PK_COUNT; k++)
        if (st->fired[k]) {
            n_fired++;
            snprintf(by + strlen(by), sizeof(st->alarm_by) - strlen(by), "%s%s", by[0] ? "," : "",
                     k == PK_DETECT ? st->det_names : PROT_KINDS[k].name);
        }
    int k = 0;
    while (k < PK_COUNT && !st->fired[k]) k++;
    char* d = st->alarm_desc;
    size_t dn = sizeof(st->alarm_desc);
    const ProtKind* K = &PROT_KINDS[k];
    const RggResult* rr = &st->rr;
    if (K->check >= 0)
        snprintf(d, dn, "%s: %d %s, first layer %d mb %d on rank %d", K->name, (int)st->checks[K->check],
                 st->checks[K->check] > 1 ? K->many : K->one, st->chk_layer[K->check], st->chk_mb[K->check], rank);
    else if (k == PK_RGG)
        snprintf(d, dn, "rgg: %s layer %d %s obs %d (rank %d mb %d) z %.3g/%.3g rel %.3g/%.3g", rr->why, rr->layer,
                 rr->path ? "mlp" : "attn", rr->obs, rr->obs / a->accum, rr->obs % a->accum, rr->z, rr->tau_z, rr->rel, rr->tau_rel);
    else if (k == PK_BWD) {
        char gname[32];
        bwd_group_name(&run->bwd, st->br.group, gname, sizeof(gname));
        if (st->found_inf || st->br.group < 0) snprintf(d, dn, "bwd: non-finite gradient");
        else snprintf(d, dn, "bwd: %s gradient norm %.3g x its median (threshold %.3g x)", gname, exp(st->br.d), exp(st->br.tau));
    } else
        snprintf(d, dn, "detector %s: loss %.6g, z loss %.3g, z grad norm %.3g, z update norm %.3g%s", st->det_names, st->loss,
                 st->dout.feat[0], st->dout.feat[1], st->dout.feat[2], (st->det_fired >> DET_ABFT) & 1 ? " (attention checksum failed)" : "");
    if (n_fired > 1) snprintf(d + strlen(d), dn - strlen(d), " [%s]", by);
}

/* an attempt without alarm: its statistics join the guards' histories (an alarmed attempt's never do) */
static void guards_admit(Run* run, const Step* st) {
    if (run->gains) rgg_admit(&run->rgg, run->gains);
    if (run->have_bwd && !st->found_inf) bwd_admit(&run->bwd, run->bx);
    if (run->det.mask) detect_admit(&run->det, st->loss, st->gn, st->un, st->det_fired);
}

/* an attempt that alarmed. The first: count it, describe it, and have the step replayed with injection off.
 * The replay: a non-finite gradient again is a real overflow (the update is skipped, as AMP does, and k
 * lowered); any other alarm is kept (a second replay would compute the same bits). */
static void verdict_alarmed(Run* run, Step* st) {
    for (int k = 0; k < PK_COUNT; k++) st->n_alarms += st->count[k];
    if (st->attempt == 0) {
        verdict_describe(run, st);
        for (int k = 0; k < PK_COUNT; k++) run->kind_steps[k] += st->fired[k];
        run->alarms_total++;
        run->fx.replay = 1;   /* the replay runs every microbatch again with injection off */
        st->replayed = 1;
        run->replays_total++;
    } else if (st->overflow) {
        int k_old = run->expscale_k;
        if (run->expscale_k > 0) run->expscale_k--;
        if (run->dist.rank == 0)
            fprintf(stderr, "warning: step %lld: the replay's gradient is non-finite too: a real overflow; update skipped "
                            "(found_inf), exponent scaling k %d -> %d\n", st->s + 1, k_old, run->expscale_k);
    } else if (run->dist.rank == 0)
        fprintf(stderr, "warning: step %lld: the replay raised an alarm too (%s); its result is kept\n", st->s + 1,
                st->det_names[0] ? st->det_names : st->fired[PK_BWD] ? "bwd" : "protection");
}

/* the step's fault event for the end summary: caught when its step was replayed */
static void verdict_account(Run* run, const Step* st, double injected) {
    if (injected > 0) {
        int ps = run->fx.ev.pass == PASS_BWD;
        run->ev_injected[run->fx.ev.site][ps]++;
        run->ev_caught[run->fx.ev.site][ps] += st->replayed;
    } else run->false_alarms += st->replayed;
}

/* the end of a run that reached its last step: the calibrations and the exponent profile it was asked to write */
static void protect_finish(Run* run) {
    const Args* a = &run->a;
    int rank = run->dist.rank;
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
}

/* The end summary (rank 0): protection's alarms by the check that raised them, and, under injection, the
 * fault events injected, caught (their step alarmed and was replayed) and missed (no alarm in their step)
 * by site and pass. "Missed" is the trainer's view: an event whose elements the model never reads (a
 * masked logit, a value that rounds away) raises no alarm and needs none; scripts/sdc_metrics.py separates
 * those from the misses that matter. */
static void print_summary(const Run* run) {
    const Args* a = &run->a;
    int protecting = 0;
    for (int k = 0; k < PK_COUNT; k++) protecting |= run->prot[k];
    if (protecting) {
        printf("protection %s (k %d): %lld alarmed step%s, %lld replayed; %lld found_inf (%lld real overflow%s)", a->protect,
               run->expscale_k, run->alarms_total, run->alarms_total == 1 ? "" : "s", run->replays_total, run->found_inf_total,
               run->overflow_total, run->overflow_total == 1 ? "" : "s");
        const char* sep = "; by check: ";
        for (int k = 0; k < PK_COUNT; k++)
            if (run->kind_steps[k]) { printf("%s%s %lld", sep, PROT_KINDS[k].name, run->kind_steps[k]); sep = ", "; }
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

#endif
