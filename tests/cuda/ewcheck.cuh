/* ewcheck.cuh (tests): the element-wise recomputation checks of llmc/sdc/ewcheck.cuh (-protect ew on the GPU), kernel by
 * kernel. The checked outputs are made by the trainer's own producing kernels (residual_rmsnorm_forward,
 * residual_forward, rmsnorm_forward, swiglu_forward, relu2_forward, swiglu_backward, mul_backward, silu_backward,
 * relu2_backward) on seeded bf16 inputs; each check must stay quiet on them (the same bits: no false alarm) and set
 * exactly the flag of the tensor in which the lowest mantissa bit of one element was flipped, at the first, a middle
 * and the last element (and of the mean squares, for the norms). Shapes: rows odd; the 16-byte path (C, F, ld
 * multiples of 8) and the scalar one (C 100, F 37); gate, up and their gradients as column views of one [rows, 2F]
 * buffer (row stride ld = 2F, up at column F), the layout of a fused gate/up GEMM, and contiguous (ld = F). */

/* flips `mask` in element i of a device bf16 or fp32 tensor (synchronous; calling it twice restores it) */
static void ewt_flip16(bf16* d, size_t i, uint16_t mask) {
    uint16_t v;
    cudaCheck(cudaMemcpy(&v, d + i, 2, cudaMemcpyDeviceToHost));
    v ^= mask;
    cudaCheck(cudaMemcpy(d + i, &v, 2, cudaMemcpyHostToDevice));
}
static void ewt_flip32(float* d, size_t i, uint32_t mask) {
    uint32_t v;
    cudaCheck(cudaMemcpy(&v, d + i, 4, cudaMemcpyDeviceToHost));
    v ^= mask;
    cudaCheck(cudaMemcpy(d + i, &v, 4, cudaMemcpyHostToDevice));
}
/* [rows, F] contiguous (host) into columns [off, off + F) of a [rows, ld] host array */
static void ewt_scatter(float* dst, const float* src, int rows, int F, int ld, int off) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * ld + off, src + (size_t)r * F, sizeof(float) * F);
}
static void ewt_gather(float* dst, const float* src, int rows, int F, int ld, int off) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * F, src + (size_t)r * ld + off, sizeof(float) * F);
}

/* the flags after a check (3 ints, zeroed before it) */
typedef struct { int f[3]; } EwtFlags;
static EwtFlags ewt_read(const int* flags) {
    EwtFlags r;
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(r.f, flags, sizeof(r.f), cudaMemcpyDeviceToHost));
    return r;
}

/* one output tensor of a check: where it is (bf16 [rows, cols] with row stride ld at offset 0 of p), and its flag */
typedef struct { const char* name; bf16* p; int rows, cols, ld, slot; } EwtOut;

/* clean: all flags 0; then for each output, the lowest mantissa bit of its first, middle and last element flipped:
 * its flag 1 (and, with strict, the others 0: the flip is in no other check's input), restored after */
template <typename Run>
static void ewt_flips(const char* what, Run run, int* flags, const EwtOut* outs, int nout, const int* strict) {
    cudaCheck(cudaMemset(flags, 0, 3 * sizeof(int)));
    run();
    EwtFlags c = ewt_read(flags);
    check(c.f[0] == 0 && c.f[1] == 0 && c.f[2] == 0, "    %-44s clean: flags %d %d %d", what, c.f[0], c.f[1], c.f[2]);
    for (int o = 0; o < nout; o++) {
        const EwtOut* t = &outs[o];
        const size_t pos[3][2] = {{0, 0}, {(size_t)t->rows / 2, (size_t)t->cols / 2}, {(size_t)t->rows - 1, (size_t)t->cols - 1}};
        int ok = 1, got[3][3];
        for (int q = 0; q < 3; q++) {
            const size_t i = pos[q][0] * t->ld + pos[q][1];
            ewt_flip16(t->p, i, 1);
            cudaCheck(cudaMemset(flags, 0, 3 * sizeof(int)));
            run();
            EwtFlags f = ewt_read(flags);
            ewt_flip16(t->p, i, 1);
            for (int k = 0; k < 3; k++) {
                got[q][k] = f.f[k];
                if (k == t->slot ? f.f[k] != 1 : (strict[o] && f.f[k] != 0)) ok = 0;
            }
        }
        check(ok, "    %-44s %s flipped at first/middle/last: flags %d%d%d %d%d%d %d%d%d", what, t->name, got[0][0], got[0][1], got[0][2],
              got[1][0], got[1][1], got[1][2], got[2][0], got[2][1], got[2][2]);
    }
}

/* ew_check_norm: residual + norm (fused producer), residual alone, norm alone (split producers) */
static void ewt_norm(int rows, int C) {
    const size_t n = (size_t)rows * C;
    const float eps = 1e-5f;
    float *ha = h_normal(n, 1.0, 0.0, 1), *hb = h_normal(n, 1.0, 0.0, 1), *hw = h_normal(C, 0.3, 1.0, 1);
    bf16 *a = d_bf16(ha, n), *b = d_bf16(hb, n), *w = d_bf16(hw, C);
    bf16 *resid = d_bf16_poison(n), *out = d_bf16_poison(n), *out2 = d_bf16_poison(n), *resid2 = d_bf16_poison(n);
    float *ms = d_f32_poison(rows), *ms2 = d_f32_poison(rows);
    int* flags = (int*)dalloc_raw(3, 4);
    char what[96];
    residual_rmsnorm_forward(resid, out, ms, a, b, w, rows, C, eps, g_s);
    snprintf(what, sizeof(what), "residual+norm (fused) %dx%d", rows, C);
    {
        EwtOut outs[2] = {{"resid", resid, rows, C, C, 0}, {"out", out, rows, C, C, 1}};
        const int strict[2] = {0, 1};   /* a flipped resid is the norm's input too */
        ewt_flips(what, [&] { ew_check_norm(flags, flags + 1, resid, out, ms, a, b, w, rows, C, eps, g_s); }, flags, outs, 2, strict);
        int ok = 1;
        for (int q = 0; q < 3; q++) {   /* the mean squares: first, middle, last row */
            const int r = q == 0 ? 0 : q == 1 ? rows / 2 : rows - 1;
            ewt_flip32(ms, r, 1);
            cudaCheck(cudaMemset(flags, 0, 3 * sizeof(int)));
            ew_check_norm(flags, flags + 1, resid, out, ms, a, b, w, rows, C, eps, g_s);
            EwtFlags f = ewt_read(flags);
            ewt_flip32(ms, r, 1);
            ok &= f.f[0] == 0 && f.f[1] == 1;
        }
        check(ok, "    %-44s ms flipped at first/middle/last row", what);
    }
    residual_forward(resid2, a, b, n, g_s);
    snprintf(what, sizeof(what), "residual alone %dx%d", rows, C);
    {
        EwtOut outs[1] = {{"resid", resid2, rows, C, C, 0}};
        const int strict[1] = {1};
        ewt_flips(what, [&] { ew_check_norm(flags, flags + 1, resid2, NULL, NULL, a, b, NULL, rows, C, eps, g_s); }, flags, outs, 1, strict);
    }
    rmsnorm_forward(out2, ms2, a, w, rows, C, eps, g_s);
    snprintf(what, sizeof(what), "norm alone %dx%d", rows, C);
    {
        EwtOut outs[1] = {{"out", out2, rows, C, C, 1}};
        const int strict[1] = {1};
        ewt_flips(what, [&] { ew_check_norm(flags, flags + 1, a, out2, ms2, NULL, NULL, w, rows, C, eps, g_s); }, flags, outs, 1, strict);
    }
    FREE_ALL(ha, hb, hw);
}

/* the MLP checks. gate/up (and their gradients): packed (ld >= 2F): columns 0 and F of one [rows, ld] buffer; else
 * two [rows, ld] buffers, each at column 0 */
static void ewt_mlp(int rows, int F, int ld, int swiglu) {
    const size_t n = (size_t)rows * F, nl = (size_t)rows * ld;
    const int packed = ld >= 2 * F, uoff = packed ? F : 0;
    float *hG = h_normal(nl, 1.5, 0.0, 1), *hU = packed ? hG : h_normal(nl, 1.5, 0.0, 1);
    float *hgc = h_alloc(n), *huc = h_alloc(n), *hdp = h_normal(n, 0.2, 0.0, 1);
    ewt_gather(hgc, hG, rows, F, ld, 0);
    ewt_gather(huc, hU, rows, F, ld, uoff);
    bf16 *G = d_bf16(hG, nl), *U = packed ? G : d_bf16(hU, nl), *gc = d_bf16(hgc, n), *uc = d_bf16(huc, n), *dprod = d_bf16(hdp, n);
    bf16 *act = d_bf16_poison(n), *prod = d_bf16_poison(n), *dgc = d_bf16_poison(n), *duc = d_bf16_poison(n), *dact = d_bf16_poison(n);
    bf16 *gate = G, *up = swiglu ? U + uoff : NULL;
    int* flags = (int*)dalloc_raw(3, 4);
    char what[96];
    const char* kind = swiglu ? "swiglu" : "relu2";
    const char* lay = packed ? "packed" : "separate";
    /* forward */
    if (swiglu) swiglu_forward(act, prod, gc, uc, rows, F, F, g_s);
    else relu2_forward(act, gc, rows, F, F, g_s);
    snprintf(what, sizeof(what), "%s forward %dx%d ld %d %s", kind, rows, F, ld, lay);
    {
        EwtOut outs[2] = {{"act", act, rows, F, F, 0}, {"prod", prod, rows, F, F, 1}};
        const int strict[2] = {0, 1};   /* the product is recomputed from the stored act */
        ewt_flips(what, [&] { ew_check_mlp_forward(flags, swiglu ? flags + 1 : NULL, act, swiglu ? prod : NULL, gate, up, rows, F, ld, g_s); },
                  flags, outs, swiglu ? 2 : 1, strict);
    }
    /* backward: outputs made contiguous by the producers, then placed like gate and up (dgate at column 0, dup at uoff) */
    float *hD = h_normal(nl, 1.0, 0.0, 1), *hDU = packed ? hD : h_normal(nl, 1.0, 0.0, 1);
    if (swiglu) {
        const int strict[2] = {1, 1};
        for (int split = 0; split < 2; split++) {
            if (!split) swiglu_backward(dgc, duc, dprod, act, gc, uc, rows, F, F, g_s);
            else { mul_backward(dact, duc, dprod, act, uc, rows, F, F, g_s); silu_backward(dgc, dact, gc, rows, F, F, g_s); }
            float *hdg = dl_bf16(dgc, n, NULL), *hdu = dl_bf16(duc, n, NULL);
            ewt_scatter(hD, hdg, rows, F, ld, 0);
            ewt_scatter(hDU, hdu, rows, F, ld, uoff);
            bf16 *D = d_bf16(hD, nl), *DU = packed ? D + uoff : d_bf16(hDU, nl);
            if (!split) {
                snprintf(what, sizeof(what), "swiglu backward (fused) %dx%d ld %d %s", rows, F, ld, lay);
                EwtOut outs[2] = {{"dup", DU, rows, F, ld, 1}, {"dgate", D, rows, F, ld, 2}};
                ewt_flips(what, [&] { ew_check_swiglu_backward(NULL, flags + 1, flags + 2, D, DU, NULL, dprod, act, gate, up, rows, F, ld, g_s); },
                          flags, outs, 2, strict);
            } else {   /* split: mul_backward's d act, d up, then silu_backward's d gate from the stored d act */
                snprintf(what, sizeof(what), "swiglu backward (split: mul) %dx%d ld %d %s", rows, F, ld, lay);
                EwtOut o2[2] = {{"dact", dact, rows, F, F, 0}, {"dup", DU, rows, F, ld, 1}};
                ewt_flips(what, [&] { ew_check_swiglu_backward(flags, flags + 1, NULL, NULL, DU, dact, dprod, act, gate, up, rows, F, ld, g_s); },
                          flags, o2, 2, strict);
                snprintf(what, sizeof(what), "swiglu backward (split: silu) %dx%d ld %d %s", rows, F, ld, lay);
                EwtOut o3[1] = {{"dgate", D, rows, F, ld, 2}};
                ewt_flips(what, [&] { ew_check_swiglu_backward(NULL, NULL, flags + 2, D, NULL, dact, NULL, NULL, gate, NULL, rows, F, ld, g_s); },
                          flags, o3, 1, strict);
            }
            FREE_ALL(hdg, hdu);
        }
    } else {
        relu2_backward(dgc, dprod, gc, rows, F, F, g_s);   /* d act: dprod's values */
        float* hdg = dl_bf16(dgc, n, NULL);
        ewt_scatter(hD, hdg, rows, F, ld, 0);
        bf16* D = d_bf16(hD, nl);
        snprintf(what, sizeof(what), "relu2 backward %dx%d ld %d", rows, F, ld);
        EwtOut outs[1] = {{"dgate", D, rows, F, ld, 2}};
        const int strict[1] = {1};
        ewt_flips(what, [&] { ew_check_relu2_backward(flags + 2, D, dprod, gate, rows, F, ld, g_s); }, flags, outs, 1, strict);
        free(hdg);
    }
    if (!packed) FREE_ALL(hU, hDU);
    FREE_ALL(hG, hgc, huc, hdp, hD);
}

static void test_ewcheck(void) {
    printf("element-wise checks (llmc/sdc/ewcheck.cuh, -protect ew): quiet on the producing kernels' outputs, a 1-bit flip flagged\n");
    ewt_norm(33, 128);   /* 16-byte path, 16 lanes a row */
    ewt_norm(7, 100);    /* scalar path, a partial last pack */
    ewt_mlp(9, 64, 128, 1);   /* gate/up views of one [rows, 2F] buffer */
    ewt_mlp(5, 64, 64, 1);    /* separate [rows, F] buffers, as the trainer stores them today */
    ewt_mlp(7, 37, 74, 1);    /* scalar path (F, ld not multiples of 8) */
    ewt_mlp(9, 64, 64, 0);
    ewt_mlp(7, 37, 40, 0);    /* scalar path, ld > F */
    dfree_all();
}
