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

/* ------------------------------------------------------- the duplicated kernels (llmc/sdc/ewdup.cuh, -protect ew)
 * Each kernel with an EwDup: (1) its duplicated variant stores bitwise what the plain one stores and sets no flag;
 * (2) a plant (the lowest mantissa bit of the primary value of one output, at its first, middle and last element)
 * sets that output's flag and no other, and the stored tensor differs from the plain run's in that element alone,
 * by that bit. Catches: a duplicate that the compiler merged with the primary or that reads the primary's result (a
 * plant no flag sees), a comparison on the wrong output or index, a variant whose stores differ from the plain
 * kernel's (the trainer's bits would move with -protect ew). */
typedef struct { const char* name; bf16* p; int rows, cols, ld; } EwdOut;   /* output k of the kernel: outs[k] */
static uint16_t* ewd_bits(const EwdOut* o) {
    uint16_t* h = (uint16_t*)mallocCheck(sizeof(uint16_t) * (size_t)o->rows * o->cols);
    for (int r = 0; r < o->rows; r++)
        cudaCheck(cudaMemcpy(h + (size_t)r * o->cols, o->p + (size_t)r * o->ld, sizeof(uint16_t) * o->cols, cudaMemcpyDeviceToHost));
    return h;
}
template <typename Run>
static void ewd_case(const char* what, Run run, int* flags, const EwdOut* outs, int nout) {
    run(ew_dup_none());
    cudaCheck(cudaDeviceSynchronize());
    uint16_t* ref[2] = {ewd_bits(&outs[0]), nout > 1 ? ewd_bits(&outs[1]) : NULL};
    cudaCheck(cudaMemset(flags, 0, 2 * sizeof(int)));
    run(ew_dup(flags, flags + 1));
    EwtFlags c = ewt_read(flags);
    size_t diff = 0;
    for (int k = 0; k < nout; k++) {
        uint16_t* h = ewd_bits(&outs[k]);
        for (size_t i = 0; i < (size_t)outs[k].rows * outs[k].cols; i++) diff += h[i] != ref[k][i];
        free(h);
    }
    check(c.f[0] == 0 && c.f[1] == 0 && diff == 0, "    %-46s duplicated: flags %d %d, %zu stored elements differ from the plain kernel's",
          what, c.f[0], c.f[1], diff);
    for (int k = 0; k < nout; k++) {
        const EwdOut* o = &outs[k];
        const size_t n = (size_t)o->rows * o->cols, pos[3] = {0, n / 2 + 1, n - 1};
        int ok = 1, got[3][2];
        for (int q = 0; q < 3; q++) {
            EwDup d = ew_dup(flags, flags + 1);
            d.plant = (long long)pos[q];
            d.plant_out = k;
            d.plant_xor = 1u;
            cudaCheck(cudaMemset(flags, 0, 2 * sizeof(int)));
            run(d);
            EwtFlags f = ewt_read(flags);
            uint16_t* h = ewd_bits(o);
            size_t other = 0;
            for (size_t i = 0; i < n; i++)
                if (i != pos[q]) other += h[i] != ref[k][i];
            ok &= f.f[k] == 1 && f.f[1 - k] == 0 && h[pos[q]] == (uint16_t)(ref[k][pos[q]] ^ 1u) && other == 0;
            got[q][0] = f.f[0];
            got[q][1] = f.f[1];
            free(h);
        }
        check(ok, "    %-46s %s planted at first/middle/last: flags %d%d %d%d %d%d (want only output %d's), the stored element alone changed",
              what, o->name, got[0][0], got[0][1], got[1][0], got[1][1], got[2][0], got[2][1], k);
    }
    FREE_ALL(ref[0], ref[1]);
}
static void ewd_shapes(int rows, int C, int F, int ld) {
    const float eps = 1e-5f;
    const size_t n = (size_t)rows * C, nf = (size_t)rows * F, nl = (size_t)rows * ld;
    int* flags = (int*)dalloc_raw(2, 4);
    char what[96];
    float *ha = h_normal(n, 1.0, 0.0, 1), *hb = h_normal(n, 1.0, 0.0, 1), *hw = h_normal(C, 0.3, 1.0, 1), *hg = h_normal(n, 0.5, 0.0, 1);
    bf16 *a = d_bf16(ha, n), *b = d_bf16(hb, n), *w = d_bf16(hw, C), *g = d_bf16(hg, n);
    bf16 *resid = d_bf16_poison(n), *out = d_bf16_poison(n), *dx = d_bf16_poison(n);
    float* ms = d_f32_poison(rows);
    snprintf(what, sizeof(what), "rmsnorm_forward %dx%d", rows, C);
    EwdOut o1[1] = {{"out", out, rows, C, C}};
    ewd_case(what, [&](EwDup d) { rmsnorm_forward(out, ms, a, w, rows, C, eps, g_s, d); }, flags, o1, 1);
    snprintf(what, sizeof(what), "residual_rmsnorm_forward %dx%d", rows, C);
    EwdOut o2[2] = {{"resid", resid, rows, C, C}, {"out", out, rows, C, C}};
    ewd_case(what, [&](EwDup d) { residual_rmsnorm_forward(resid, out, ms, a, b, w, rows, C, eps, g_s, d); }, flags, o2, 2);
    snprintf(what, sizeof(what), "rmsnorm_backward dx, accumulating %dx%d", rows, C);
    EwdOut o3[1] = {{"dx", dx, rows, C, C}};
    ewd_case(what, [&](EwDup d) {
        cudaCheck(cudaMemcpyAsync(dx, b, sizeof(bf16) * n, cudaMemcpyDeviceToDevice, g_s));   /* the accumulated-into gradient */
        rmsnorm_backward_acc(dx, NULL, g, a, w, ms, rows, C, eps, 1, 1, g_s, d);
    }, flags, o3, 1);
    /* the MLP: gate, up (and their gradients) columns 0 and F of [rows, ld] buffers (ld >= 2F), act, prod contiguous */
    float *hG = h_normal(nl, 1.5, 0.0, 1), *hdp = h_normal(nf, 0.2, 0.0, 1);
    bf16 *G = d_bf16(hG, nl), *dprod = d_bf16(hdp, nf), *act = d_bf16_poison(nf), *prod = d_bf16_poison(nf);
    bf16 *D = d_bf16_poison(nl);
    snprintf(what, sizeof(what), "swiglu_forward %dx%d ld %d", rows, F, ld);
    EwdOut o4[2] = {{"act", act, rows, F, F}, {"prod", prod, rows, F, F}};
    ewd_case(what, [&](EwDup d) { swiglu_forward(act, prod, G, G + F, rows, F, ld, g_s, d); }, flags, o4, 2);
    snprintf(what, sizeof(what), "swiglu_backward %dx%d ld %d", rows, F, ld);
    EwdOut o5[2] = {{"dup", D + F, rows, F, ld}, {"dgate", D, rows, F, ld}};
    ewd_case(what, [&](EwDup d) { swiglu_backward(D, D + F, dprod, act, G, G + F, rows, F, ld, g_s, d); }, flags, o5, 2);
    snprintf(what, sizeof(what), "relu2_forward %dx%d ld %d", rows, F, ld);
    EwdOut o6[1] = {{"act", act, rows, F, F}};
    ewd_case(what, [&](EwDup d) { relu2_forward(act, G, rows, F, ld, g_s, d); }, flags, o6, 1);
    snprintf(what, sizeof(what), "relu2_backward %dx%d ld %d", rows, F, ld);
    EwdOut o7[1] = {{"dx", D, rows, F, ld}};
    ewd_case(what, [&](EwDup d) { relu2_backward(D, dprod, G, rows, F, ld, g_s, d); }, flags, o7, 1);
    FREE_ALL(ha, hb, hw, hg, hG, hdp);
    dfree_all();
}
static void test_ew_dup(void) {
    printf("element-wise kernels duplicated (llmc/sdc/ewdup.cuh, -protect ew): the plain kernels' bits, no flag clean, a planted primary flagged\n");
    ewd_shapes(33, 128, 64, 128);   /* 16-byte packs */
    ewd_shapes(7, 100, 37, 74);     /* scalar path, partial last packs */
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
/* the gate/up check fused into SwiGLU's forward (the trainer's path): the input rows' norms from the norm kernel that
 * produced the input (rmsnorm_forward's onorm) within 2 ulp of mmb_row_norms on the stored tensor; the fused kernel
 * stores the plain kernel's act and prod, is quiet on the GEMM's clean outputs, and flags a gate (up) value 1% over
 * its bound of either sign, NaN or Inf in the gate (up) flag alone, and stays quiet 1% under it. Then down's check
 * fused into the residual add and norm that reads it: the product's row norms SwiGLU's forward left (xo) within 2 ulp
 * of mmb_row_norms on the stored product; resid, out and ms the plain kernel's; quiet on the GEMM's clean output;
 * 1% over, NaN, Inf flagged, 1% under quiet.
 * Catches: input norms of the unrounded norm output or of another row, a weight norm of the wrong half, a
 * comparison on act instead of gate, a flag swap, the product's norms of the unrounded values or summed over part of
 * the row, the residual kernel checking a instead of b. */
/* values planted at 3 places (row pr[q], column pc[q]) of y (element r * ld + c), each restored after: 4 just over the
 * bound nx[r] nw[c] c + MMB_ABS (+1% rounded up to bf16, its negative, NaN, Inf), then one 1% under. run(false) runs
 * the check under test, run(true) mmb_check's own launch (the reference; a run without one returns -1), both
 * returning their flags. Counts: *flagged the over values the check flags as `want`, *quiet the under values it passes,
 * *agree its verdicts equal to the reference's (15 when all are) */
template <class R>
static void mmbt_plant3(bf16* y, size_t ld, const int pr[3], const int pc[3], const float* nx, const float* nw, float c, int want, R run,
                        int* flagged, int* quiet, int* agree) {
    *flagged = *quiet = *agree = 0;
    for (int q = 0; q < 3; q++) {
        const size_t i = (size_t)pr[q] * ld + pc[q];
        const uint16_t keep = mmbt_get16(y, i);
        const float bnd = nx[pr[q]] * nw[pc[q]] * c + MMB_ABS, up = bnd * 1.01f, dn = bnd * 0.99f;
        uint32_t ub, db;
        memcpy(&ub, &up, 4); memcpy(&db, &dn, 4);
        const uint16_t vals[5] = {(uint16_t)((ub >> 16) + 1), (uint16_t)(((ub >> 16) + 1) | 0x8000), 0x7fc0, 0x7f80, (uint16_t)(db >> 16)};
        for (int k = 0; k < 5; k++) {
            mmbt_set16(y, i, vals[k]);
            const int f = run(false);
            if (k < 4) *flagged += f == want;
            else *quiet += f == 0;
            *agree += f == run(true);
        }
        mmbt_set16(y, i, keep);
    }
}
static void mmbt_fused(int rows, int F, int K) {
    const int O = 2 * F;
    float *hw = h_normal((size_t)O * K, 1.0, 0.0, 1), *hx = h_normal((size_t)rows * K, 1.0, 0.0, 1);
    bf16 *xr = d_bf16(hx, (size_t)rows * K), *w = d_bf16(hw, (size_t)O * K), *x = d_bf16_poison((size_t)rows * K);
    bf16 *gu = d_bf16_poison((size_t)rows * O), *act = d_bf16_poison((size_t)rows * F), *prod = d_bf16_poison((size_t)rows * F);
    bf16 *act0 = d_bf16_poison((size_t)rows * F), *prod0 = d_bf16_poison((size_t)rows * F);
    float *ms = d_f32_poison(rows), *xn = d_f32_poison(rows), *xn2 = d_f32_poison(rows), *nw = d_f32_poison(O);
    rmsnorm_forward(x, ms, xr, NULL, rows, K, 1e-5f, g_s, ew_dup_none(), xn);
    mmb_row_norms(xn2, x, rows, K, K, g_s);
    mmb_row_norms(nw, w, O, K, K, g_s);
    linear_forward(gu, x, w, rows, K, O, g_s);
    float *g1 = dl_f32(xn, rows, NULL), *g2 = dl_f32(xn2, rows, NULL);
    double worst = 0;
    for (int r = 0; r < rows; r++) worst = fmax(worst, fabs((double)g1[r] - g2[r]) / mmbt_ulp(g2[r]));
    check(worst <= 2.0, "    fused %dx%d K %d: the norm kernel's output row norms = mmb_row_norms' of the stored tensor within %.0f ulp", rows, F, K, worst);
    const float c = mmb_factor(K);
    int* flag = (int*)dalloc_raw(2, 4);
    const MmbFused mb = {xn, nw, nw + F, c, flag, flag + 1};
    auto run = [&]() {
        cudaCheck(cudaMemset(flag, 0, 2 * sizeof(int)));
        swiglu_forward(act, prod, gu, gu + F, rows, F, O, g_s, ew_dup_none(), &mb);
        int f[2] = {0, 0};
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(f, flag, sizeof(f), cudaMemcpyDeviceToHost));
        return (f[0] != 0) | (f[1] != 0) << 1;
    };
    swiglu_forward(act0, prod0, gu, gu + F, rows, F, O, g_s);
    const int clean = run();
    uint16_t *a0 = dl_bits(act0, (size_t)rows * F), *p0 = dl_bits(prod0, (size_t)rows * F), *a1 = dl_bits(act, (size_t)rows * F),
             *p1 = dl_bits(prod, (size_t)rows * F);
    const int same = !memcmp(a0, a1, (size_t)rows * F * 2) && !memcmp(p0, p1, (size_t)rows * F * 2);
    check(clean == 0 && same, "    fused %dx%d K %d: clean flags %d (want 0), act and prod the plain kernel's: %s", rows, F, K, clean, same ? "yes" : "NO");
    float *rx = dl_f32(xn, rows, NULL), *rw = dl_f32(nw, O, NULL);
    const int pr[3] = {0, rows / 2, rows - 1}, pc[3] = {0, F / 2, F - 1};
    int flagged = 0, quiet = 0;
    for (int half = 0; half < 2; half++)
        for (int q = 0; q < 3; q++) {
            const size_t i = (size_t)pr[q] * O + half * F + pc[q];
            const uint16_t keep = mmbt_get16(gu, i);
            const float b = rx[pr[q]] * rw[half * F + pc[q]] * c + MMB_ABS, up = b * 1.01f, dn = b * 0.99f;
            uint32_t ub, db;
            memcpy(&ub, &up, 4); memcpy(&db, &dn, 4);
            const uint16_t over[4] = {(uint16_t)((ub >> 16) + 1), (uint16_t)(((ub >> 16) + 1) | 0x8000), 0x7fc0, 0x7f80};
            for (int k = 0; k < 4; k++) { mmbt_set16(gu, i, over[k]); flagged += run() == 1 << half; }
            mmbt_set16(gu, i, (uint16_t)(db >> 16));
            quiet += run() == 0;
            mmbt_set16(gu, i, keep);
        }
    check(flagged == 24 && quiet == 6, "    fused %dx%d K %d: over the bound in gate / up at 3 places: %d of 24 set their own flag only; 1%% under: %d of 6 quiet",
          rows, F, K, flagged, quiet);
    /* down: y = prod Wd^T [rows, K], its check inside residual_rmsnorm_forward(a + y), the product's norms from SwiGLU */
    float *pn = d_f32_poison(rows), *pn2 = d_f32_poison(rows), *nwd = d_f32_poison(K);
    const MmbFused mbx = {xn, nw, nw + F, c, flag, flag + 1, pn};
    cudaCheck(cudaMemset(flag, 0, 2 * sizeof(int)));
    swiglu_forward(act, prod, gu, gu + F, rows, F, O, g_s, ew_dup_none(), &mbx);
    mmb_row_norms(pn2, prod, rows, F, F, g_s);
    float *hd = h_normal((size_t)K * F, 1.0, 0.0, 1), *ha = h_normal((size_t)rows * K, 1.0, 0.0, 1);
    bf16 *wd = d_bf16(hd, (size_t)K * F), *ra = d_bf16(ha, (size_t)rows * K), *y = d_bf16_poison((size_t)rows * K);
    mmb_row_norms(nwd, wd, K, F, F, g_s);
    linear_forward(y, prod, wd, rows, F, K, g_s);
    float *q1 = dl_f32(pn, rows, NULL), *q2 = dl_f32(pn2, rows, NULL);
    worst = 0;
    for (int r = 0; r < rows; r++) worst = fmax(worst, fabs((double)q1[r] - q2[r]) / mmbt_ulp(q2[r]));
    bf16 *rs0 = d_bf16_poison((size_t)rows * K), *o0 = d_bf16_poison((size_t)rows * K), *rs1 = d_bf16_poison((size_t)rows * K),
         *o1 = d_bf16_poison((size_t)rows * K);
    float *m0 = d_f32_poison(rows), *m1 = d_f32_poison(rows);
    const float cd = mmb_factor(F);
    const MmbFused mbd = {pn, nwd, NULL, cd, flag, NULL, NULL};
    residual_rmsnorm_forward(rs0, o0, m0, ra, y, NULL, rows, K, 1e-5f, g_s);
    auto rund = [&]() {
        cudaCheck(cudaMemset(flag, 0, 2 * sizeof(int)));
        residual_rmsnorm_forward(rs1, o1, m1, ra, y, NULL, rows, K, 1e-5f, g_s, ew_dup_none(), NULL, &mbd);
        int f[2] = {0, 0};
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(f, flag, sizeof(f), cudaMemcpyDeviceToHost));
        return (f[0] != 0) | (f[1] != 0) << 1;
    };
    const int dclean = rund();
    uint16_t *r0b = dl_bits(rs0, (size_t)rows * K), *r1b = dl_bits(rs1, (size_t)rows * K), *o0b = dl_bits(o0, (size_t)rows * K),
             *o1b = dl_bits(o1, (size_t)rows * K);
    float *m0h = dl_f32(m0, rows, NULL), *m1h = dl_f32(m1, rows, NULL);
    const int dsame = !memcmp(r0b, r1b, (size_t)rows * K * 2) && !memcmp(o0b, o1b, (size_t)rows * K * 2) && !memcmp(m0h, m1h, (size_t)rows * 4);
    check(worst <= 2.0 && dclean == 0 && dsame, "    fused down %dx%d K %d: the product's row norms within %.0f ulp; clean flags %d (want 0); resid, out, ms the plain kernel's: %s",
          rows, K, F, worst, dclean, dsame ? "yes" : "NO");
    float *rpn = dl_f32(pn, rows, NULL), *rwd = dl_f32(nwd, K, NULL);
    const int dr[3] = {0, rows / 2, rows - 1}, dc[3] = {0, K / 2, K - 1};
    int dflag, dquiet, dnone;
    mmbt_plant3(y, K, dr, dc, rpn, rwd, cd, 1, [&](bool own) { return own ? -1 : rund(); }, &dflag, &dquiet, &dnone);
    check(dflag == 12 && dquiet == 3, "    fused down %dx%d K %d: over the bound at 3 places: %d of 12 flagged; 1%% under: %d of 3 quiet", rows, K, F, dflag, dquiet);
    /* o: the same product, checked inside residual_rmsnorm_forward with its input rows' norms taken there from the input
     * itself (mb.xin: att_out in the trainer), no norms handed over; the same flags as mmb_check's own launch */
    const MmbFused mbo = {NULL, nwd, NULL, cd, flag, NULL, NULL, prod, F};
    /* the flags of mmb_check's own launch (own) or of the residual add and norm checking o with mb */
    auto run_o = [&](const MmbFused* mb, bool own) {
        cudaCheck(cudaMemset(flag, 0, 2 * sizeof(int)));
        if (own) mmb_check(flag, flag, K, y, rows, K, K, prod, F, nwd, cd, g_s);
        else residual_rmsnorm_forward(rs1, o1, m1, ra, y, NULL, rows, K, 1e-5f, g_s, ew_dup_none(), NULL, mb);
        int f[2] = {0, 0};
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(f, flag, sizeof(f), cudaMemcpyDeviceToHost));
        return (f[0] != 0) | (f[1] != 0) << 1;
    };
    auto runo = [&](bool own) { return run_o(&mbo, own); };
    const int oclean = runo(false);
    uint16_t *r2b = dl_bits(rs1, (size_t)rows * K), *o2b = dl_bits(o1, (size_t)rows * K);
    float* m2h = dl_f32(m1, rows, NULL);
    const int osame = !memcmp(r0b, r2b, (size_t)rows * K * 2) && !memcmp(o0b, o2b, (size_t)rows * K * 2) && !memcmp(m0h, m2h, (size_t)rows * 4);
    check(oclean == 0 && osame, "    fused o %dx%d K %d (input norms in the kernel): clean flags %d (want 0); resid, out, ms the plain kernel's: %s",
          rows, K, F, oclean, osame ? "yes" : "NO");
    int oflag, oquiet, oagree;
    mmbt_plant3(y, K, dr, dc, rpn, rwd, cd, 1, runo, &oflag, &oquiet, &oagree);
    check(oflag == 12 && oquiet == 3 && oagree == 15, "    fused o %dx%d K %d: over the bound at 3 places: %d of 12 flagged; 1%% under: %d of 3 quiet; "
          "the same verdict as mmb_check's own launch: %d of 15", rows, K, F, oflag, oquiet, oagree);
    /* the same with the input rows' squared norms handed over in parts (mb.xnp: att_out's a head, from the flash forward
     * in the trainer): 4 parts of the row (F % 4 == 0) or 1, summed on the host in double; the same verdicts */
    {
        const int np = F % 4 == 0 ? 4 : 1, pw = F / np;
        float* hp = dl_bf16(prod, (size_t)rows * F, NULL);
        double* hs = (double*)mallocCheck(sizeof(double) * rows * np);
        for (int r = 0; r < rows; r++)
            for (int p = 0; p < np; p++) {
                double ss = 0.0;
                for (int k = p * pw; k < (p + 1) * pw; k++) ss += (double)hp[(size_t)r * F + k] * hp[(size_t)r * F + k];
                hs[(size_t)r * np + p] = ss;
            }
        double* ds = (double*)dalloc_raw((size_t)rows * np, 8);
        cudaCheck(cudaMemcpy(ds, hs, sizeof(double) * rows * np, cudaMemcpyHostToDevice));
        const MmbFused mbp = {NULL, nwd, NULL, cd, flag, NULL, NULL, NULL, 0, ds, np};
        auto runp = [&](bool own) { return run_o(&mbp, own); };
        const int pclean = runp(false);
        int pflag, pquiet, pagree;
        mmbt_plant3(y, K, dr, dc, rpn, rwd, cd, 1, runp, &pflag, &pquiet, &pagree);
        check(pclean == 0 && pflag == 12 && pquiet == 3 && pagree == 15, "    fused o %dx%d K %d (input norms handed over in %d parts): clean flags "
              "%d (want 0); over the bound at 3 places: %d of 12 flagged; 1%% under: %d of 3 quiet; mmb_check's verdict: %d of 15",
              rows, K, F, np, pclean, pflag, pquiet, pagree);
        FREE_ALL(hp, hs);
    }
    FREE_ALL(r2b, o2b, m2h);
    FREE_ALL(hw, hx, g1, g2, a0, p0, a1, p1, rx, rw, hd, ha, q1, q2, r0b, r1b, o0b, o1b, m0h, m1h, rpn, rwd);
}
/* v's check riding on the launch that rotates q and k (MmbTail: rope_qk, or Qwen3's qknorm_rope_forward_qk): q, k, v
 * the views of one [N, qd + 2 kd] GEMM output from x [N, K]; the rotation's outputs bitwise those without the check, a
 * clean run quiet, values over the bound at 3 places flagged (1% under: quiet), each verdict mmb_check's own launch's */
static void mmbt_rope_tail(int B, int T, int H, int KV, int hd, int K, bool qknr, bool scalar = false) {
    const int N = B * T, qd = H * hd, kd = KV * hd, O = qd + 2 * kd, half = hd / 2;
    float *hw = h_normal((size_t)O * K, 1.0, 0.0, 1), *hx = h_normal((size_t)N * K, 1.0, 0.0, 1);
    bf16 *x = d_bf16(hx, (size_t)N * K), *w = d_bf16(hw, (size_t)O * K), *qkv = d_bf16_poison((size_t)N * O);
    linear_forward(qkv, x, w, N, K, O, g_s);
    const bf16 *q = qkv, *k = qkv + qd;
    bf16* v = qkv + qd + kd;
    float *xn = d_f32_poison(N), *nwv = d_f32_poison(kd);
    mmb_row_norms(xn, x, N, K, K, g_s);
    mmb_row_norms(nwv, w + (size_t)(qd + kd) * K, kd, K, K, g_s);
    Config cc = *preset_find("tiny-llama");
    cc.head_dim = hd;
    float *cs = h_alloc((size_t)T * half), *sn = h_alloc((size_t)T * half);
    rope_tables(&cc, T, cs, sn);
    float *dcs = d_f32(cs, (size_t)T * half), *dsn = d_f32(sn, (size_t)T * half);
    uint16_t* hnw = h_bits(hd, 0.5);
    bf16* nwt = d_raw16(hnw, hd);   /* the QK norms' weight (Qwen3) */
    bf16 *qr0 = d_bf16_poison((size_t)N * qd), *kr0 = d_bf16_poison((size_t)N * kd), *qr1 = d_bf16_poison((size_t)N * qd),
         *kr1 = d_bf16_poison((size_t)N * kd);
    const float c = mmb_factor(K);
    int* flag = (int*)dalloc_raw(2, 4);
    auto rot = [&](bf16* qo, bf16* ko, const MmbTail& mt) {
        if (qknr) qknorm_rope_forward_qk(NULL, NULL, qo, NULL, NULL, ko, q, k, O, nwt, nwt, B, T, H, KV, hd, 1e-6f, dcs, dsn, cc.rope_style,
                                         NULL, NULL, g_s, mt);
        else rope_qk(qo, ko, q, k, O, O, dcs, dsn, B, T, H, KV, hd, cc.rope_style, false, NULL, NULL, g_s, mt);
    };
    MmbTail mt = mmb_tail(v, (size_t)O, N, kd, xn, nwv, c, flag);
    if (scalar) mt.vec = false;   /* one element an item (the path of a row stride or width not a multiple of 8) */
    auto run = [&](bool own) {
        cudaCheck(cudaMemset(flag, 0, 2 * sizeof(int)));
        if (own) mmb_check(flag, flag, kd, v, N, kd, O, x, K, nwv, c, g_s);
        else rot(qr1, kr1, mt);
        int f = 0;
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(&f, flag, sizeof(f), cudaMemcpyDeviceToHost));
        return f != 0;
    };
    rot(qr0, kr0, MMB_TAIL_NONE);
    const int clean = run(false);
    uint16_t *a0 = dl_bits(qr0, (size_t)N * qd), *a1 = dl_bits(qr1, (size_t)N * qd), *b0 = dl_bits(kr0, (size_t)N * kd),
             *b1 = dl_bits(kr1, (size_t)N * kd);
    const int same = !memcmp(a0, a1, (size_t)N * qd * 2) && !memcmp(b0, b1, (size_t)N * kd * 2);
    const char* who = qknr ? "qknorm_rope_forward_qk" : "rope_qk";
    check(clean == 0 && same, "    v's check on %s, N %d kd %d K %d%s: clean flag %d (want 0); q, k rotated as without it: %s", who, N, kd, K,
          scalar ? ", scalar items" : "", clean,
          same ? "yes" : "NO");
    float *rx = dl_f32(xn, N, NULL), *rw = dl_f32(nwv, kd, NULL);
    const int pr[3] = {0, N / 2, N - 1}, pc[3] = {0, kd / 2, kd - 1};
    int flagged, quiet, agree;
    mmbt_plant3(v, O, pr, pc, rx, rw, c, 1, run, &flagged, &quiet, &agree);
    check(flagged == 12 && quiet == 3 && agree == 15, "    v's check on %s: over the bound at 3 places: %d of 12 flagged; 1%% under: %d of 3 quiet; "
          "the same verdict as mmb_check's own launch: %d of 15", who, flagged, quiet, agree);
    FREE_ALL(hw, hx, cs, sn, hnw, a0, a1, b0, b1, rx, rw);
}
static void test_mmb_bound(void) {
    printf("matrix-product output bounds (llmc/sdc/bound.cuh, -protect bound): the CPU's norms, quiet on the GEMM's outputs, planted values flagged\n");
    mmbt_case(37, 24, 64);
    mmbt_case(29, 19, 300);   /* scalar path; K > the block: the input norm's threads stride */
    {   /* the weights' norms of many matrices in one launch (mmb_row_norms_jobs) == one launch each, bitwise */
        const int shp[3][2] = {{37, 64}, {5, 300}, {70, 33}};
        MmbJob hj[3];
        float* outs[3];
        float* refs[3];
        long long first = 0;
        for (int i = 0; i < 3; i++) {
            float* hx = h_normal((size_t)shp[i][0] * shp[i][1], 1.0, 0.0, 1);
            bf16* x = d_bf16(hx, (size_t)shp[i][0] * shp[i][1]);
            outs[i] = d_f32_poison(shp[i][0]);
            refs[i] = d_f32_poison(shp[i][0]);
            mmb_row_norms(refs[i], x, shp[i][0], shp[i][1], shp[i][1], g_s);
            hj[i].out = outs[i]; hj[i].x = x; hj[i].rows = shp[i][0]; hj[i].cols = shp[i][1]; hj[i].ld = shp[i][1]; hj[i].first = first;
            first += shp[i][0];
            free(hx);
        }
        MmbJob* dj = (MmbJob*)d_f32_poison(sizeof(hj) / 4 + 1);
        cudaCheck(cudaMemcpy(dj, hj, sizeof(hj), cudaMemcpyHostToDevice));
        mmb_row_norms_jobs(dj, hj, 3, g_s);
        size_t diff = 0;
        for (int i = 0; i < 3; i++) {
            float *a = dl_f32(outs[i], shp[i][0], NULL), *b = dl_f32(refs[i], shp[i][0], NULL);
            diff += bits_differ(a, b, shp[i][0]);
            FREE_ALL(a, b);
        }
        check(diff == 0, "    weights' norms of 3 matrices in one launch: bitwise one launch each (%zu of 112 differ)", diff);
    }
    mmbt_fused(37, 64, 96);   /* the gate/up check inside SwiGLU's forward, 16-byte path */
    mmbt_fused(9, 37, 100);   /* scalar path */
    mmbt_rope_tail(2, 19, 4, 2, 64, 96, false);   /* v's check on RoPE's launch, 16-byte items */
    mmbt_rope_tail(1, 23, 4, 1, 64, 40, true);    /* on Qwen3's QK norm + RoPE */
    mmbt_rope_tail(1, 11, 2, 1, 16, 24, false);   /* hd 16: kd 16, items of 8 */
    mmbt_rope_tail(1, 11, 2, 1, 16, 24, false, true);   /* items of one element */
    dfree_all();
}
