/* model.cuh: the trainer-level tests of test_sdc.cu on whole models: (b) the reference states, (c)
 * determinism and (0) the weight initialisation, the GPU trainer beside the CPU one (namespace cpu). */

/* ----------------------------------------------------------------- (b) reference states */

typedef struct { double max_abs, max_rel, rl2; } Err;
static Err err_of(const float* got, const float* ref, size_t n) {
    Err e = {0, 0, 0};
    double se = 0, sr = 0, scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d != d) { e.max_abs = e.max_rel = e.rl2 = NAN; return e; }
        se += d * d; sr += (double)ref[i] * ref[i];
        if (d > e.max_abs) e.max_abs = d;
        if (fabs(ref[i]) >= 1e-3 * scale && scale > 0 && d / fabs(ref[i]) > e.max_rel) e.max_rel = d / fabs(ref[i]);
    }
    e.rl2 = sr > 0 ? sqrt(se / sr) : (se > 0 ? INFINITY : 0.0);
    return e;
}
/* GPU vs the fp32 reference under a fixed bound of tests/bf16_bounds.h; the CPU bf16 emulation's error beside it */
static int compare_ref(const char* name, const float* gpu, const float* cpub, const float* ref, size_t n, double lim) {
    Err g = err_of(gpu, ref, n), c = err_of(cpub, ref, n), gc = err_of(gpu, cpub, n);
    int ok = g.rl2 <= lim;
    check(ok, "    %-28s n %-7zu GPU vs ref: max abs %.2e max rel %.2e rel L2 %.2e (limit %.1e) | CPU bf16 vs ref %.2e | GPU vs CPU bf16 %.2e",
          name, n, g.max_abs, g.max_rel, g.rl2, lim, c.rl2, gc.rl2);
    return ok;
}

static int file_exists(const char* p) { FILE* f = fopen(p, "rb"); if (f) fclose(f); return f != NULL; }

/* Catches: a GPU model bug against PyTorch (a wrong layer, head mapping, norm or loss), under the fixed bf16
 * bounds of llmc/bf16_bounds.h. */
static void test_reference(const char* preset, const char* states_dir, const char* ckpt_dir) {
    printf("reference state %s: GPU (bf16 AMP) vs PyTorch fp32, beside the CPU's -precision bf16\n", preset);
    char cpath[1200];
    RefState s;
    if (!ref_open(preset, states_dir, ckpt_dir, &s, cpath, sizeof(cpath))) return;
    if (!file_exists(cpath)) { check(0, "  %s missing (make refckpts, or carry build/ref)", cpath); return; }
    Config c = *preset_find(preset);
    c.vocab_size = s.V; c.seq_len = s.T;
    size_t P = config_num_params(&c);
    check(P == s.n_params, "  parameter count %zu == state's %llu", P, (unsigned long long)s.n_params);
    if (P != s.n_params) return;
    CkptInfo ck;
    checkpoint_read(cpath, &ck, NULL, NULL, NULL, 0);
    const char* diff = config_diff(&ck.cfg, &c);
    check(diff == NULL, "  imported checkpoint config equals the preset's (%s)", diff ? diff : "all fields");
    if (diff) return;
    float* params = h_alloc(P);
    checkpoint_read(cpath, &ck, params, NULL, NULL, P);
    int B = s.B, T = s.T, N = B * T, V = s.V;
    int *inp = (int*)mallocCheck(sizeof(int) * N), *tgt = (int*)mallocCheck(sizeof(int) * N);
    ref_batch(&s, inp, tgt);
    /* GPU model */
    Model gm_, *gm = &gm_;
    model_build(gm, &c, B, T, 1);
    model_load_state(gm, params, NULL, NULL);
    model_set_tokens(gm, inp, tgt, N);
    float gloss = model_forward_step(gm, B, T, 1);
    float* glogits = dl_bf16(gm->logits, (size_t)N * V, NULL);
    model_zero_grads(gm);
    model_backward_step(gm, B, T, 1.0f / N);
    float* ggrads = dl_f32(gm->grads, P, NULL);
    /* CPU -precision bf16 */
    cpu::Model cm_, *cm = &cm_;
    cpu::model_build(cm, &c, B, T, 1);
    memcpy(cm->params, params, P * sizeof(float));
    cpu::model_prepare_weights(cm);
    memcpy(cm->inputs, inp, sizeof(int) * N);
    memcpy(cm->targets, tgt, sizeof(int) * N);
    float closs = cpu::model_forward(cm, B, T, cm->targets);
    float* clogits = h_alloc((size_t)N * V);   /* stored as bf16 bits on the CPU too */
    for (int n = 0; n < N; n++) cpu::model_logits_row(cm, n, clogits + (size_t)n * V);
    memset(cm->grads, 0, P * sizeof(float));
    cpu::model_backward(cm, B, T, cm->targets, 1.0f / N);

    int nl = c.n_layer;
    compare_ref("logits", glogits, clogits, s.logits, (size_t)N * V, BF16_LOGITS_RL2(nl));
    double loss0_bound = bf16_loss_bound(s.logits, N, V, nl);
    {
        double ge = fabs((double)gloss - s.loss), ce = fabs((double)closs - s.loss);
        check(ge <= loss0_bound, "    %-28s GPU %.6f CPU bf16 %.6f ref %.6f: GPU |err| %.2e (limit %.1e), CPU bf16 %.2e", "loss", gloss, closs,
              s.loss, ge, loss0_bound, ce);
    }
    int n_grad_ok = 0;
    for (int i = 0; i < gm->L.n; i++) {
        const TensorInfo* t = &gm->L.t[i];
        char name[64];
        grad_name(name, sizeof(name), t);
        n_grad_ok += compare_ref(name, ggrads + t->offset, cm->grads + t->offset, s.grads + t->offset, t->numel, BF16_GRAD_RL2(nl));
    }
    printf("    %d of %d gradient tensors within their limit\n", n_grad_ok, gm->L.n);
    /* 10 AdamW steps on the same batch with the state's hyperparameters */
    model_load_state(gm, params, NULL, NULL);
    memcpy(cm->params, params, P * sizeof(float));
    memset(cm->m, 0, P * sizeof(float));
    memset(cm->v, 0, P * sizeof(float));
    cpu::model_prepare_weights(cm);
    float *gl = h_alloc(s.n_steps), *cl = h_alloc(s.n_steps);
    AdamW opt = {s.max_lr, s.beta1, s.beta2, s.adam_eps, s.wd};
    for (int step = 0; step < s.n_steps; step++) {
        opt.lr = lr_at(step, s.max_lr, s.warmup, s.n_steps, s.final_frac);
        model_zero_grads(gm);
        gl[step] = model_forward_step(gm, B, T, 1);
        model_backward_step(gm, B, T, 1.0f / N);
        model_update(gm, &opt, step + 1, s.clip);
        memset(cm->grads, 0, P * sizeof(float));
        cl[step] = cpu::model_forward(cm, B, T, cm->targets);
        cpu::model_backward(cm, B, T, cm->targets, 1.0f / N);
        cpu::clip_grads(cm, s.clip);
        cpu::adamw_update(cm, &opt, step + 1);
        cpu::model_prepare_weights(cm);
    }
    double ge = 0, ce = 0;   /* the largest |err| / bf16_losses_bound over the steps: <= 1 passes */
    for (int i = 0; i < s.n_steps; i++) {
        double b = bf16_losses_bound(loss0_bound, s.losses, i, nl);
        double g = fabs((double)gl[i] - s.losses[i]) / b, cc = fabs((double)cl[i] - s.losses[i]) / b;
        ge = g <= ge ? ge : g;   /* NaN sticks */
        ce = cc <= ce ? ce : cc;
    }
    check(ge <= 1, "    %-28s largest |err| / bound GPU %.2f (limit 1), CPU bf16 %.2f", "losses of 10 AdamW steps", ge, ce);
    printf("      GPU     : "); for (int i = 0; i < s.n_steps; i++) printf("%.5f ", gl[i]); printf("\n");
    printf("      CPU bf16: "); for (int i = 0; i < s.n_steps; i++) printf("%.5f ", cl[i]); printf("\n");
    printf("      reference: "); for (int i = 0; i < s.n_steps; i++) printf("%.5f ", s.losses[i]); printf("\n");
    model_free(gm);
    cpu::model_free(cm);
    FREE_ALL(params, inp, tgt, glogits, ggrads, clogits, gl, cl, s.tokens, s.logits, s.grads, s.losses);
}

/* ------------------------------------------------------------------------ (c) determinism */
/* Catches: any non-deterministic kernel (floating-point atomics, a schedule-dependent reduction): two runs or two
 * schedules giving other bits. */
static void test_determinism(const char* preset, int vocab, int B, int T, const char* ckpt_dir) {
    Config c = *preset_find(preset);
    c.vocab_size = vocab; c.seq_len = T;
    size_t P = config_num_params(&c);
    int N = B * T;
    Model gm_, *gm = &gm_;
    model_build(gm, &c, B, T, 1);
    char cpath[1200];
    snprintf(cpath, sizeof(cpath), "%s/%s.ckpt", ckpt_dir, preset);
    int from_ref = vocab == 256 && T == 32 && file_exists(cpath);
    float* params0 = h_alloc(P);
    if (from_ref) {
        CkptInfo ck;
        checkpoint_read(cpath, &ck, params0, NULL, NULL, P);
        model_load_state(gm, params0, NULL, NULL);
    } else {
        model_init_weights(gm, 11);
        cudaCheck(cudaMemcpy(params0, gm->params, P * sizeof(float), cudaMemcpyDeviceToHost));
    }
    printf("determinism %s (vocab %d, B %d, T %d, %s weights)\n", preset, vocab, B, T, from_ref ? "reference" : "seeded random");
    int *inp = (int*)mallocCheck(sizeof(int) * N), *tgt = (int*)mallocCheck(sizeof(int) * N);
    for (int i = 0; i < N; i++) { inp[i] = (int)rng_below(&g_rng, vocab); tgt[i] = (int)rng_below(&g_rng, vocab); }
    model_set_tokens(gm, inp, tgt, N);
    float loss[2];
    uint16_t* lg[2];
    float *tl[2], *gr[2];
    for (int r = 0; r < 2; r++) {
        model_zero_grads(gm);
        loss[r] = model_forward_step(gm, B, T, 1);
        lg[r] = (uint16_t*)mallocCheck((size_t)N * vocab * 2);
        cudaCheck(cudaMemcpy(lg[r], gm->logits, (size_t)N * vocab * 2, cudaMemcpyDeviceToHost));
        tl[r] = h_alloc(N);
        model_token_losses(gm, N, tl[r]);
        model_backward_step(gm, B, T, 1.0f / N);
        gr[r] = dl_f32(gm->grads, P, NULL);
    }
    check(f32_bits(loss[0]) == f32_bits(loss[1]) && !memcmp(lg[0], lg[1], (size_t)N * vocab * 2) && !memcmp(tl[0], tl[1], sizeof(float) * N),
          "  forward twice: loss %.9g / %.9g, logits and per-token losses bitwise %s", loss[0], loss[1],
          !memcmp(lg[0], lg[1], (size_t)N * vocab * 2) && !memcmp(tl[0], tl[1], sizeof(float) * N) ? "equal" : "DIFFERENT");
    size_t ndiff = 0;
    for (size_t i = 0; i < P; i++) ndiff += f32_bits(gr[0][i]) != f32_bits(gr[1][i]);
    check(ndiff == 0, "  backward twice: %zu of %zu gradient elements differ", ndiff, P);
    /* two 3-step training runs from the same weights */
    float sl[2][3];
    double sn[2][3];
    float *fp[2], *fm[2], *fv[2];
    uint16_t* fb[2];
    AdamW opt = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    for (int r = 0; r < 2; r++) {
        model_load_state(gm, params0, NULL, NULL);
        for (int step = 0; step < 3; step++) {
            opt.lr = lr_at(step, 1e-3, 2, 3, 0.1);
            model_zero_grads(gm);
            sl[r][step] = model_forward_step(gm, B, T, 1);
            model_backward_step(gm, B, T, 1.0f / N);
            sn[r][step] = model_update(gm, &opt, step + 1, 1.0);
        }
        fp[r] = dl_f32(gm->params, P, NULL);
        fm[r] = dl_f32(gm->m, P, NULL);
        fv[r] = dl_f32(gm->v, P, NULL);
        fb[r] = (uint16_t*)mallocCheck(P * 2);
        cudaCheck(cudaMemcpy(fb[r], gm->wbf, P * 2, cudaMemcpyDeviceToHost));
    }
    int same_l = !memcmp(sl[0], sl[1], sizeof(sl[0])) && !memcmp(sn[0], sn[1], sizeof(sn[0]));
    int same_s = !memcmp(fp[0], fp[1], P * 4) && !memcmp(fm[0], fm[1], P * 4) && !memcmp(fv[0], fv[1], P * 4) && !memcmp(fb[0], fb[1], P * 2);
    check(same_l && same_s, "  3 AdamW steps twice: losses %.9g %.9g %.9g / %.9g %.9g %.9g, grad norms %s, weights, bf16 copies and moments %s",
          sl[0][0], sl[0][1], sl[0][2], sl[1][0], sl[1][1], sl[1][2], !memcmp(sn[0], sn[1], sizeof(sn[0])) ? "equal" : "DIFFERENT",
          same_s ? "bitwise equal" : "DIFFERENT");
    model_free(gm);
    for (int r = 0; r < 2; r++) FREE_ALL(lg[r], tl[r], gr[r], fp[r], fm[r], fv[r], fb[r]);
    FREE_ALL(params0, inp, tgt);
}

/* (0) init: GPU model_init_weights vs the CPU trainer's, bit for bit */
/* Catches: GPU weights that differ from the CPU trainer's for the same seed (the two trainers would not start from
 * the same model). */
static void test_init(void) {
    printf("weight initialisation: GPU kernel (llmc/cuda/init.cuh) vs the CPU trainer (llmc/cpu/init.h), bitwise\n");
    const char* presets[] = {"tiny-llama", "tiny-qwen3", "tiny-nanochat"};
    for (int i = 0; i < 3; i++) {
        Config c = *preset_find(presets[i]);
        c.vocab_size = 256; c.seq_len = 32;
        Model gm_, *gm = &gm_;
        model_build(gm, &c, 2, 32, 1);
        model_init_weights(gm, 11);
        cpu::Model cm_, *cm = &cm_;
        cpu::model_build(cm, &c, 2, 32, 1);
        cpu::model_init_weights(cm, 11);
        size_t P = gm->L.total;
        float *p = h_alloc(P), *m = h_alloc(P), *v = h_alloc(P);
        uint16_t* wb = (uint16_t*)mallocCheck(P * 2);
        cudaCheck(cudaMemcpy(p, gm->params, P * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(m, gm->m, P * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(v, gm->v, P * 4, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(wb, gm->wbf, P * 2, cudaMemcpyDeviceToHost));
        size_t diff = 0, bad_bf = 0, nz = 0;
        for (size_t j = 0; j < P; j++) {
            if (f32_bits(p[j]) != f32_bits(cm->params[j])) diff++;
            if (wb[j] != f32_to_bf16_bits(cm->params[j])) bad_bf++;
            if (m[j] != 0.0f || v[j] != 0.0f || f32_bits(m[j]) != 0 || f32_bits(v[j]) != 0) nz++;
        }
        check(diff == 0 && bad_bf == 0 && nz == 0, "  %-13s %zu weights: %zu differ from the CPU's, %zu bf16 copies wrong, %zu AdamW moments not +0",
              presets[i], P, diff, bad_bf, nz);
        free(p); free(m); free(v); free(wb);
        cpu::model_free(cm);
        model_free(gm);
    }
    /* the whole llama3.2-1b layout, timed on the GPU, against the host function */
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
#ifdef __CUDA_EMU__
    /* on the CPU emulation (one fiber a CUDA thread) the whole 1.24e9-weight layout would take minutes: the
     * llama3.2-1b width with 1 layer and vocabulary 4096 (68M weights), and no time limit */
    Config big = *preset_find("llama3.2-1b");
    big.n_layer = 1; big.vocab_size = 4096;
    param_layout_build(&big, L);
    const double time_limit = 1e30;
#else
    param_layout_build(preset_find("llama3.2-1b"), L);
    const double time_limit = 1.0;
#endif
    size_t P = L->total;
    float* d = NULL;
    if (cudaMalloc(&d, P * sizeof(float)) != cudaSuccess) { cudaGetLastError(); check(0, "  llama3.2-1b: no room for %zu floats on the GPU", P); free(L); return; }
    init_weights_gpu(d, L, 8, g_s);                       /* warm-up (module load) */
    cudaCheck(cudaStreamSynchronize(g_s));
    double t0 = wall_seconds();
    init_weights_gpu(d, L, 8, g_s);
    cudaCheck(cudaStreamSynchronize(g_s));
    double dt = wall_seconds() - t0;
    float *g = h_alloc(P), *h = h_alloc(P);
    cudaCheck(cudaMemcpy(g, d, P * sizeof(float), cudaMemcpyDeviceToHost));
    double tc = wall_seconds();
    uint64_t cs_gpu = tsdc_checksum_gpu(d, P * sizeof(float), g_s);
    tc = wall_seconds() - tc;
    uint64_t cs_host = tsdc_checksum(g, P * sizeof(float)), cs_odd = tsdc_checksum_gpu(d, P * sizeof(float) - 3, g_s);
    check(cs_gpu == cs_host && cs_odd == tsdc_checksum(g, P * sizeof(float) - 3),
          "  weights checksum on the GPU (llmc/cuda/checksum.cuh, %.1f ms) equals the host's: %016llx %016llx (and of %zu bytes, not whole words)",
          1e3 * tc, (unsigned long long)cs_gpu, (unsigned long long)cs_host, P * sizeof(float) - 3);
    cudaCheck(cudaFree(d));
    double t1 = wall_seconds();
    init_weights_cpu(h, L, 8);
    double dh = wall_seconds() - t1;
    size_t diff = 0, first = P;
    for (size_t j = 0; j < P; j++) if (f32_bits(g[j]) != f32_bits(h[j])) { if (!diff) first = j; diff++; }
    check(diff == 0 && dt < time_limit, "  llama3.2-1b %zu weights: GPU %.1f ms (want < 1 s on a GPU), host %.2f s; %zu differ%s", P, 1e3 * dt, dh,
          diff, diff ? " (first below)" : "");
    if (diff) printf("    element %zu: GPU %08x host %08x\n", first, f32_bits(g[first]), f32_bits(h[first]));
    free(g); free(h); free(L);
}

/* (h) grad_buckets: the plan of the overlapped gradient reduction (train_sdc.cu grad_bucket_plan) for every preset
 * and a 1-layer model: the buckets tile [0, P) exactly once from the end down (each ends where the one before it
 * starts), in the order the backward completes them (the tail, layers n_layer-1 .. 0, the head), each tensor lies
 * whole in its own bucket (a layer's tensors in that layer's, wte / the embedding norm in the head, the final norm
 * and lm_head in the tail), and the tail is left out where it is empty. Catches: a bucket that drops or doubles a
 * range (an off-by-one at a layer boundary, the head or tail missed), buckets in an order the backward would
 * deadlock or race on (a layer's all-reduce before its gradients are written). Host only. */
static void test_grad_buckets(void) {
    printf("grad_buckets: the gradient buckets of the overlapped all-reduce (train_sdc.cu grad_bucket_plan)\n");
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    GradBuckets* gb = (GradBuckets*)mallocCheck(sizeof(GradBuckets));
    for (int pi = 0; pi <= N_PRESETS + 1; pi++) {   /* the presets; a 1-layer untied llama; a tied nanochat (no tail) */
        Config c = PRESETS[pi < N_PRESETS ? pi : 0].c;
        if (pi == N_PRESETS) { c.n_layer = 1; c.tied = 0; snprintf(c.preset, sizeof(c.preset), "llama, 1 layer, untied"); }
        if (pi == N_PRESETS + 1) { c = *preset_find("tiny-nanochat"); c.tied = 1; snprintf(c.preset, sizeof(c.preset), "nanochat, tied"); }
        param_layout_build(&c, L);
        grad_bucket_plan(L, c.n_layer, gb);
        int ok = gb->n >= c.n_layer + 1 && gb->n <= c.n_layer + 2;
        size_t end = L->total;   /* the buckets, in order, tile [0, P) from the end down */
        for (int b = 0; ok && b < gb->n; b++) {
            ok = gb->numel[b] > 0 && gb->off[b] + gb->numel[b] == end;
            end = gb->off[b];
        }
        ok = ok && end == 0;
        /* the backward's order: the tail (if any), the layers from the last down, the head */
        int b0 = gb->n == c.n_layer + 2 ? 1 : 0;
        if (ok && b0) ok = gb->layer[0] == GB_TAIL;
        for (int l = 0; ok && l < c.n_layer; l++) ok = gb->layer[b0 + c.n_layer - 1 - l] == l;
        ok = ok && gb->layer[gb->n - 1] == GB_HEAD;
        /* every tensor whole inside the bucket of its layer (globals: before the layers the head, after them the tail) */
        int bad = -1;
        for (int i = 0; ok && i < L->n; i++) {
            const TensorInfo* t = &L->t[i];
            int want = t->layer >= 0 ? t->layer : (t->type == PT_WTE || t->type == PT_EMBED_NORM ? GB_HEAD : GB_TAIL), in = 0;
            for (int b = 0; b < gb->n; b++)
                if (gb->layer[b] == want && t->offset >= gb->off[b] && t->offset + t->numel <= gb->off[b] + gb->numel[b]) in++;
            if (in != 1) { ok = 0; bad = i; }
        }
        size_t tail = 0;
        for (int i = 0; i < L->n; i++) if (L->t[i].type == PT_FINAL_NORM || L->t[i].type == PT_LMHEAD) tail += L->t[i].numel;
        ok = ok && (tail > 0) == (b0 == 1) && (!b0 || gb->numel[0] == tail);
        check(ok, "  %-24s %2d buckets (tail %zu, %d layers of %zu, head %zu floats) tile the %zu gradients once, in the backward's order%s",
              c.preset, gb->n, b0 ? gb->numel[0] : (size_t)0, c.n_layer, gb->numel[b0], gb->numel[gb->n - 1], L->total,
              bad >= 0 ? " (a tensor outside its bucket)" : "");
    }
    free(L); free(gb);
}
