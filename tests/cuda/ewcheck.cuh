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

/* -protect bound's kernels (llmc/sdc/bound.cuh) on the trainer's own GEMM: linear_forward into one [rows, 2 cols]
 * output whose second half is checked as a strided view (row stride 2 cols, as v or gate/up of the fused GEMMs), in
 * one launch with two flags (columns below split and from it, as gate | up). The weight rows' norms equal the CPU's
 * mmb_row_norms (llmc/sdc/bound.h) of the same bf16 values within 2 fp32 ulps (double sums in other orders); no
 * flag on the clean outputs, among them Cauchy-Schwarz's equality case (the first cols input rows equal to positive
 * weight rows: the view's diagonal reaches more than 0.99 of its bound); at the view's first, middle and last
 * element a value 1% over its bound (either sign; the bound from the CPU's input norm), a NaN and an Inf each set
 * that column's flag and only it, 1% under the bound sets none. cols 24 (16-byte path, K 64) and 19 (scalar, K 300:
 * more than a block's threads, so the input norm's threads stride). */
static double mmbt_ulp(float v) { return (double)nextafterf(fabsf(v), INFINITY) - fabsf(v); }
static void mmbt_set16(bf16* d, size_t i, uint16_t v) { cudaCheck(cudaMemcpy(d + i, &v, 2, cudaMemcpyHostToDevice)); }
static uint16_t mmbt_get16(const bf16* d, size_t i) {
    uint16_t v;
    cudaCheck(cudaMemcpy(&v, d + i, 2, cudaMemcpyDeviceToHost));
    return v;
}
static void mmbt_case(int rows, int cols, int K) {
    const int O = 2 * cols, split = cols / 2 >= 8 ? cols / 2 / 8 * 8 : cols / 2;   /* a multiple of 8: the 16-byte path allows it */
    float *hw = h_normal((size_t)O * K, 1.0, 0.0, 1), *hx = h_normal((size_t)rows * K, 1.0, 0.0, 1);
    for (size_t i = 0; i < (size_t)O * K; i++) hw[i] = fabsf(hw[i]);
    for (int r = 0; r < cols && r < rows; r++) memcpy(hx + (size_t)r * K, hw + (size_t)(cols + r) * K, sizeof(float) * K);
    bf16 *x = d_bf16(hx, (size_t)rows * K), *w = d_bf16(hw, (size_t)O * K), *y = d_bf16_poison((size_t)rows * O);
    linear_forward(y, x, w, rows, K, O, g_s);
    float* nw = d_f32_poison(cols);
    mmb_row_norms(nw, w + (size_t)cols * K, cols, K, K, g_s);
    float *gw = dl_f32(nw, cols, NULL), *rx = h_alloc(rows), *rw = h_alloc(cols);
    mmb_row_norms(rx, hx, rows, K, K);
    mmb_row_norms(rw, hw + (size_t)cols * K, cols, K, K);
    double worst = 0;
    for (int j = 0; j < cols; j++) worst = fmax(worst, fabs((double)gw[j] - rw[j]) / mmbt_ulp(rw[j]));
    check(worst <= 2.0, "    %dx%d K %d: weight row norms = the CPU's within %.0f ulp", rows, cols, K, worst);
    const float c = mmb_factor(K);
    const int zero[2] = {0, 0};
    int* flag = d_i32(zero, 2);
    auto run = [&]() {   /* bit 0: columns below split, bit 1: from split */
        cudaCheck(cudaMemset(flag, 0, 2 * sizeof(int)));
        mmb_check(flag, flag + 1, split, y + cols, rows, cols, O, x, K, nw, c, g_s);
        int f[2] = {0, 0};
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(f, flag, sizeof(f), cudaMemcpyDeviceToHost));
        return (f[0] != 0) | (f[1] != 0) << 1;
    };
    float* hy = dl_bf16(y, (size_t)rows * O, NULL);
    double tight = 0;
    for (int r = 0; r < cols && r < rows; r++) tight = fmax(tight, fabs((double)hy[(size_t)r * O + cols + r]) / ((double)rx[r] * rw[r] * c));
    check(run() == 0 && tight > 0.99, "    %dx%d K %d: clean outputs not flagged (the equality case at %.4f of its bound)", rows, cols, K, tight);
    const int pr[3] = {0, rows / 2, rows - 1}, pc[3] = {0, cols / 2, cols - 1};
    int flagged = 0, quiet = 0;
    for (int q = 0; q < 3; q++) {
        const size_t i = (size_t)pr[q] * O + cols + pc[q];
        const uint16_t keep = mmbt_get16(y, i);
        const int want = pc[q] < split ? 1 : 2;
        /* the bound (the CPU's norms); bf16 values 1% above it (either sign) and 1% below it */
        const float b = rx[pr[q]] * rw[pc[q]] * c + MMB_ABS, up = b * 1.01f, dn = b * 0.99f;
        uint32_t ub, db;
        memcpy(&ub, &up, 4); memcpy(&db, &dn, 4);
        const uint16_t over[4] = {(uint16_t)((ub >> 16) + 1), (uint16_t)(((ub >> 16) + 1) | 0x8000), 0x7fc0, 0x7f80};   /* +-above, NaN, Inf */
        for (int k = 0; k < 4; k++) { mmbt_set16(y, i, over[k]); flagged += run() == want; }
        mmbt_set16(y, i, (uint16_t)(db >> 16));
        quiet += run() == 0;
        mmbt_set16(y, i, (uint16_t)((db >> 16) | 0x8000));
        quiet += run() == 0;
        mmbt_set16(y, i, keep);
    }
    check(flagged == 12 && quiet == 6 && run() == 0,
          "    %dx%d K %d split %d: 1%% over the bound (both signs), NaN, Inf at 3 places: %d of 12 set their column's flag only; "
          "1%% under: %d of 6 quiet", rows, cols, K, split, flagged, quiet);
    FREE_ALL(hw, hx, gw, rx, rw, hy);
}
static void test_mmb_bound(void) {
    printf("matrix-product output bounds (llmc/sdc/bound.cuh, -protect bound): the CPU's norms, quiet on the GEMM's outputs, planted values flagged\n");
    mmbt_case(37, 24, 64);
    mmbt_case(29, 19, 300);   /* scalar path; K > the block: the input norm's threads stride */
    dfree_all();
}
