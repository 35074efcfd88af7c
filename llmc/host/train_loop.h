/* train_loop.h: the training step, shared by the CPU trainer (train_sdc.c) and the CUDA trainer
 * (train_sdc.cu), as in the paper's Figure 2: zero the gradients, run the microbatches, reduce over the
 * ranks, ask the guards for their verdict, then replay the step (an alarm) or update, log, evaluate,
 * checkpoint. The model is the trainer's (llmc/host/backend.h: the functions it provides); the rest of a run
 * lives beside this file: setup.h (flags, data, model, resume), protect_run.h (the fault injector and the
 * protection: set-up, verdict, summary), evaluate.h (held-out loss, predictions, sampling), run.h (the
 * run's state, the graceful stop, checkpoints).
 *
 * Determinism: every rank decides the same way from all-reduced or gathered inputs, and a replay recomputes
 * the step with injection off from the same weights and data, so a caught fault leaves no trace in the
 * weights. */
#ifndef TSDC_TRAIN_LOOP_H
#define TSDC_TRAIN_LOOP_H

#include "setup.h"
#include "evaluate.h"

/* the step's start: its fault event, the schedule's learning rate, nothing fired yet */
static void step_begin(Run* run, Step* st, long long s, AdamW* opt) {
    const Args* a = &run->a;
    memset(st, 0, sizeof(*st));
    st->s = s;
    st->skip = skip_due(run, s + 1);
    st->k = run->expscale_k;
    st->norm = st->gn = st->un = st->bwd_r0 = NAN;
    st->score0 = st->gn0 = st->un0 = NAN;
    run->fx.ev = fault_plan_step(&run->fx.cfg, s + 1, run->dist.world, a->accum, run->c.n_layer);
    run->fx.injected = 0;
    run->fx.replay = 0;
    opt->lr = lr_at(s, a->lr, a->warmup, a->steps, a->final_lr_frac);
}

/* one attempt's microbatches on this rank: forward (the Residual Gain Guard's gains gathered from it),
 * backward of the loss scaled by 2^k into the accumulated gradients, the passes' check counts */
static void step_microbatches(Run* run, Step* st, int* inp, int* tgt) {
    const Args* a = &run->a;
    Model* model = &run->model;
    int T = run->c.seq_len, N = a->B * T, rank = run->dist.rank;
    float dloss = 1.0f / (float)((double)N * a->accum * run->dist.world);
    float kscale = ldexpf(1.0f, run->expscale_k);            /* 2^k, exact */
    model_zero_grads(model);
    st->loss_sum = 0.0;
    memset(st->checks, 0, sizeof(st->checks));
    for (int k = 0; k < CHECK_KINDS; k++) st->chk_layer[k] = st->chk_mb[k] = -1;
    for (int mb = 0; mb < a->accum; mb++) {
        shard_microbatch(&run->train, run->ts.data_pos, rank * a->accum + mb, a->B, T, inp, tgt);
        model_set_tokens(model, inp, tgt, N);
        run->fx.mb = mb;
        int tracing = run->trace.fp && run->fx.ev.pass == PASS_FWD && fault_due(&run->fx, run->fx.ev.site, run->fx.ev.layer, PASS_FWD);
        if (tracing) trace_clean(run, a->B, T);
        model_qk_reset(model);
        if (!tracing) model_classifier_fused_next(model, dloss * kscale);   /* the trace diffs the logits */
        st->loss_sum += model_forward_step(model, a->B, T, 1);
        if (tracing) trace_write(run, a->B, T);
        if (run->gains)
            model_rgg_gains(model, a->B, T, run->rgg.layers, run->rgg.n_mon,
                            run->gains + ((size_t)(rank * a->accum + mb) * run->rgg.n_mon) * 2);
        if (mb == a->accum - 1) model_reduce_in_backward(model, &run->dist);   /* only the last backward reduces */
        model_backward_step(model, a->B, T, dloss * kscale);
        for (int k = 0; k < CHECK_KINDS; k++) {
            int cl, cn = model_check_alarms(model, k, &cl);
            if (cn && !st->checks[k]) { st->chk_layer[k] = cl; st->chk_mb[k] = mb; }
            st->checks[k] += cn;
        }
    }
}

/* the reduction over ranks: check counts summed, the gains gathered and judged (the same on every rank),
 * the gradients and the loss all-reduced; exponent scaling undone right before clipping (a non-finite
 * gradient then skips the update) */
static void step_reduce(Run* run, Step* st) {
    const Args* a = &run->a;
    Model* model = &run->model;
    dist_allreduce_sum_f64(&run->dist, st->checks, CHECK_KINDS);
    memset(&st->rr, 0, sizeof(st->rr));
    if (run->gains) {
        dist_allgather_f64_block(&run->dist, run->gains, (size_t)a->accum * run->rgg.n_mon * 2);
        st->rr = rgg_check(&run->rgg, run->gains);
        if (!run->prot[PK_RGG]) st->rr.alarm = 0, st->rr.n_alarms = 0;   /* calibration alone never alarms */
    }
    model_allreduce_grads(model, &run->dist);
    dist_allreduce_sum_f64(&run->dist, &st->loss_sum, 1);
    st->loss = st->loss_sum / ((double)a->accum * run->dist.world);
    double fi = model_unscale_check(model, ldexpf(1.0f, -run->expscale_k));
    dist_allreduce_sum_f64(&run->dist, &fi, 1);
    st->found_inf = fi > 0;
}

/* the step's device work (-stats): differences of the backend's counters, the device bytes as they are now */
static void step_stats(Run* run, const DeviceStats* st0, char* json, size_t jn, char* line, size_t ln) {
    DeviceStats st1;
    DEVICE_STATS_UNKNOWN(&st1);
    model_device_stats(&run->model, &st1);
#define ST_D(f) (st0->f < 0 || st1.f < 0 ? -1 : st1.f - st0->f)
#define ST_J(x) jcount(x).s
    long long L_ = ST_D(launches), S_ = ST_D(syncs), LS_ = ST_D(loop_syncs), D_ = ST_D(d2h), A_ = ST_D(alloc_bytes),
              R_ = ST_D(ew_read), W_ = ST_D(ew_written), B_ = st1.dev_bytes;
    snprintf(json, jn, ",\"stats\":{\"launches\":%s,\"syncs\":%s,\"loop_syncs\":%s,\"d2h\":%s,\"dev_bytes\":%s,"
             "\"alloc_bytes\":%s,\"ew_read\":%s,\"ew_written\":%s}", ST_J(L_), ST_J(S_), ST_J(LS_), ST_J(D_), ST_J(B_), ST_J(A_),
             ST_J(R_), ST_J(W_));
    snprintf(line, ln, " | %lld launches, %lld syncs (%lld in layer loops), %.1f MB device, ew %.2f MB", L_, S_, LS_,
             B_ / 1e6, (R_ + W_) / 1e6);
#undef ST_D
#undef ST_J
}

/* rank 0: the step's log record and its progress line */
static void step_log(Run* run, const Step* st, const AdamW* opt, double injected, double dt, double cpu_ms, double eta_s,
                     const char* st_json, const char* st_line) {
    const Args* a = &run->a;
    double tok_s = batch_span(run->dist.world, a->accum, a->B, run->c.seq_len) / dt;
    float loss = (float)st->loss;
    char det_json[400] = "";
    if (run->det.mask)   /* the detectors' features and verdicts of the first attempt (the one a fault hits) */
        snprintf(det_json, sizeof(det_json), ",\"det\":\"%s\",\"feat\":[%s,%s,%s,%s,%s],\"score\":%s,\"gn\":%s,\"un\":%s",
                 st->det_first, jnum(st->feat0[0]).s, jnum(st->feat0[1]).s, jnum(st->feat0[2]).s, jnum(st->feat0[3]).s,
                 jnum(st->feat0[4]).s, jnum(st->score0).s, jnum(st->gn0).s, jnum(st->un0).s);
    logger_line(&run->log, "{\"type\":\"step\",\"step\":%lld,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"ms\":%.3f,\"cpu_ms\":%.3f,"
                "\"tok_s\":%.1f,\"k\":%d,\"alarms\":%d,\"injections\":%d,\"replayed\":%d,\"replay_ms\":%.3f,"
                "\"found_inf\":%d,\"skip\":%d,\"overflow\":%d,\"bwd_r\":%s,\"bwd_ms\":%.3f,\"by\":\"%s\",\"alarm\":\"%s\"%s%s}",
                st->s + 1, jnum(loss).s, opt->lr, jnum(st->norm).s, dt * 1e3, cpu_ms, tok_s, st->k, st->n_alarms,
                (int)injected, st->replayed, st->replay_ms, st->found_inf, st->skip, st->overflow, jnum(st->bwd_r0).s, st->bwd_ms,
                st->alarm_by, st->alarm_desc, det_json, st_json);
    if (!a->quiet) {
        char eta[32];
        fmt_eta(eta_s, eta, sizeof(eta));
        printf("step %5lld/%d | loss %s | lr %.3e | norm %s | %.1f ms | %.0f tok/s | ETA %s%s%s%s%s%s\n", st->s + 1, a->steps,
               num_fmt(loss, 6).s, opt->lr, num_fmt(st->norm, 4).s, dt * 1e3, tok_s, eta, st_line, injected > 0 ? " | fault injected" : "",
               st->replayed ? " | ALARM, replayed: " : "", st->alarm_desc,
               st->found_inf ? " | found_inf: update skipped" : st->skip ? " | update skipped (-skip_steps)" : "");
        fflush(stdout);
    }
    if (!isfinite(loss)) fprintf(stderr, "warning: non-finite loss at step %lld\n", st->s + 1);
}

/* after the step: the held-out evaluation (the final one with -pred_out) and a sample, as scheduled */
static void step_evaluate(Run* run, int at_end) {
    const Args* a = &run->a;
    long long step = run->ts.step;
    if (run->dist.rank != 0) return;
    if (run->have_val && ((a->eval_every && step % a->eval_every == 0) || at_end)) {
        const char* pred = at_end && a->pred_out[0] ? a->pred_out : NULL;
        double vl = evaluate(run, pred);
        logger_line(&run->log, "{\"type\":\"eval\",\"step\":%lld,\"val_loss\":%s,\"ppl\":%s}", step, jnum(vl).s, jnum(exp(vl)).s);
        printf("eval step %lld | val loss %.6f | ppl %.3f%s%s\n", step, vl, exp(vl), pred ? " | predictions " : "", pred ? pred : "");
    }
    if (a->sample_every && (step % a->sample_every == 0 || at_end)) sample(run);
}

/* the run's end: the summary, the final weights (the same on every rank), the end record with the reason */
static void run_end(Run* run, int stop_sig, const char* ckpt, double t_start) {
    uint64_t h = model_weights_checksum(&run->model);
    dist_check_same(&run->dist, h, "at the end");
    if (run->dist.rank != 0) return;
    print_summary(run);
    long long step = run->ts.step;
    if (stop_sig)
        printf("stopped by %s after step %lld, %.1f s, final weights %016llx%s%s%s\n", signal_name(stop_sig), step,
               wall_seconds() - t_start, (unsigned long long)h, run->a.save ? ": -resume " : " (-save none: no checkpoint)",
               run->a.save ? ckpt : "", run->a.save ? " continues it" : "");
    else
        printf("done: step %lld, %.1f s, final weights %016llx%s\n", step, wall_seconds() - t_start, (unsigned long long)h,
               run->dist.world > 1 ? " (identical on all ranks)" : "");
    logger_line(&run->log, "{\"type\":\"end\",\"step\":%lld,\"weights\":\"%016llx\",\"reason\":\"%s\"}", step, (unsigned long long)h,
                stop_sig ? signal_name(stop_sig) : "done");
    logger_close(&run->log);
}

int train_main(int argc, char** argv) {
    Run run_, *run = &run_;
    if (run_setup(run, argc, argv)) return 0;
    Args* a = &run->a;
    Model* model = &run->model;
    TrainState* ts = &run->ts;
    AdamW opt = {a->lr, a->beta1, a->beta2, a->adam_eps, a->weight_decay};
    int last = a->stop_at && a->stop_at < a->steps ? a->stop_at : a->steps;
    uint64_t span = batch_span(run->dist.world, a->accum, a->B, run->c.seq_len);
    int *inp = (int*)mallocCheck(sizeof(int) * a->B * run->c.seq_len), *tgt = (int*)mallocCheck(sizeof(int) * a->B * run->c.seq_len);
    if (run->exp_auto && ts->step < last) {
        select_expscale_k(run, inp, tgt);
        if (a->exp_profile[0]) model_exp_profile_start(model, a->exp_samples, a->seed ^ 0xE4905EULL);
    }
    double t_start = wall_seconds(), ms_sum = 0;
    int timed = 0, stop_sig = 0;               /* stop_sig: the signal the run stopped for (graceful stop), 0: none */
    char ckpt[1200] = "";
    while (ts->step < last) {
        Step st;
        double t0 = wall_seconds(), c0 = cpu_seconds();
        DeviceStats st0;
        DEVICE_STATS_UNKNOWN(&st0);
        const int have_st = a->stats && model_device_stats(model, &st0);
        step_begin(run, &st, ts->step, &opt);
        /* the first attempt; after an alarm, the replay: every microbatch again with injection off */
        for (st.attempt = 0; st.attempt < 2; st.attempt++) {
            double ta = wall_seconds();
            step_microbatches(run, &st, inp, tgt);
            step_reduce(run, &st);
            guards_verdict(run, &st, &opt);
            if (st.attempt == 1) st.replay_ms = (wall_seconds() - ta) * 1e3;
            if (st.attempt == 1 && st.found_inf) st.overflow = 1;   /* non-finite with injection off: a real overflow */
            if (!verdict_alarm(&st)) { guards_admit(run, &st); break; }
            verdict_alarmed(run, &st);
        }
        run->fx.ev.active = 0; /* the event belongs to this step's microbatches, not to evaluation or sampling */
        run->fx.replay = 0;
        double inj = run->fx.injected;
        dist_allreduce_sum_f64(&run->dist, &inj, 1);
        verdict_account(run, &st, inj);
        /* the update, unless the gradient is non-finite (found_inf) or the lost-step control skips it */
        if (!st.found_inf && !st.skip) st.norm = model_update(model, &opt, st.s + 1, a->grad_clip);
        else if (st.found_inf) run->found_inf_total++;
        else run->skipped_total++;
        run->overflow_total += st.overflow;
        char st_json[400] = "", st_line[160] = "";
        if (have_st) step_stats(run, &st0, st_json, sizeof(st_json), st_line, sizeof(st_line));
        ts->step = st.s + 1;
        ts->data_pos = shard_advance(&run->train, ts->data_pos, span);
        double dt = wall_seconds() - t0;
        if (st.s > 0 || ts->step == last) { ms_sum += dt; timed++; }
        if (run->dist.rank == 0)
            step_log(run, &st, &opt, inj, dt, (cpu_seconds() - c0) * 1e3, (last - ts->step) * (timed ? ms_sum / timed : dt), st_json, st_line);
        int at_end = ts->step == last;
        step_evaluate(run, at_end);
        /* a stop signal (any rank's): this step is complete; leave with a checkpoint */
        if (!at_end && (stop_sig = stop_agreed(run))) at_end = 1;
        if (a->save && ((a->ckpt_every && ts->step % a->ckpt_every == 0) || at_end)) {
            snprintf(ckpt, sizeof(ckpt), "%s/step_%06lld.ckpt", a->out, (long long)ts->step);
            save_checkpoint(run, ckpt);
        }
        if (stop_sig) break;
    }
    if (!stop_sig && ts->step < last) stop_sig = stop_agreed(run);   /* a signal before the first step */
    if (a->steps == 0 && run->dist.rank == 0) evaluate_only(run);
    if (stop_sig) {   /* outputs of a finished run only: a calibration or profile of part of the steps is not written */
        if (run->dist.rank == 0 && (a->rgg_calibrate[0] || a->bwd_calibrate[0] || a->exp_profile[0] || a->pred_out[0]))
            printf("note: stopped early: the calibrations, the exponent profile and the final predictions are written "
                   "when the run reaches its last step (-resume continues it)\n");
    } else protect_finish(run);
    run_end(run, stop_sig, ckpt, t_start);
    free(inp); free(tgt);
    run_teardown(run);
    return stop_sig ? 128 + stop_sig : 0;
}

#endif
