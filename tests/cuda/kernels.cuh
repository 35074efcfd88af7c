/* kernels.cuh: (a) the kernel unit tests of test_sdc.cu, except attention's (attention.cuh): conversions,
 * embedding, RMSNorm, RoPE, element-wise, classifier, AdamW, global norm, one optimizer pass, Q/K
 * fingerprints, the GEMM plan cache, argmax, unscale, fault flips and the linear layers, each against its
 * CPU reference (llmc/cpu/cpu_kernels.h) under the bounds explained in test_sdc.cu's header. */

/* ------------------------------------------------------------------------ (a) kernel tests */
/* Catches: a rounding that truncates or breaks ties away from even, NaN or inf mishandled, the vector path and the
 * scalar tail disagreeing, elements past n written. */
static void test_convert(void) {
    printf("f32 <-> bf16 conversion (llmc/cuda/convert.cuh) vs bf16.h, bitwise\n");
    size_t n = 1000003;
    float* x = h_alloc(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_normal(&g_rng) * ldexp(1.0, (int)rng_below(&g_rng, 90) - 45));
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0x00000001u, 0x807FFFFFu,
                                 0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0xBF808001u, 0x00008000u, 0x00018000u,
                                 0x7F7F8000u, 0x7FC00001u, 0xFFC00000u, 0x7F800001u};
    const int ns = (int)(sizeof(specials) / sizeof(specials[0]));
    for (int j = 0; j < ns; j++) x[j] = bits_f32(specials[j]);
    float* dx = d_f32(x, n);
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: aligned, vector path; pass 1: both pointers one element in (scalar path) */
        size_t off = pass, m = n - off;
        bf16* dy = d_bf16_poison(n);
        f32_to_bf16(dy + off, dx + off, m, g_s);
        Written w;
        float* y = dl_bf16(dy, n, &w);
        size_t bad = 0, first = 0;
        for (size_t i = off; i < n; i++) {
            uint16_t got = f32_to_bf16_bits(y[i]) /* y is exact */, want = f32_to_bf16_bits(x[i]);
            int okv = x[i] != x[i] ? ((got & 0x7F80) == 0x7F80 && (got & 0x7F)) : got == want;
            if (!okv) { if (!bad) first = i; bad++; }
        }
        int head_ok = !off || f32_bits(y[0]) == 0xFFFF0000u; /* the element before the range untouched */
        check(bad == 0 && w.overrun == 0 && head_ok, "    f32_to_bf16 %-30s n %-9zu %zu mismatches%s%s (specials: +-0 +-inf FLT_MAX "
              "denormals ties NaN)", off ? "(offset 1: scalar path)" : "(aligned: vector path)", m, bad,
              w.overrun ? ", wrote past the end" : "", head_ok ? "" : ", wrote before the start");
        if (bad) printf("      first [%zu]: in %08x -> gpu %04x, expected %04x\n", first, f32_bits(x[first]), f32_to_bf16_bits(y[first]),
                        f32_to_bf16_bits(x[first]));
        free(y);
    }
    /* bf16 -> f32: every bit pattern, 16 times, plus a tail */
    size_t nb = 16 * 65536 + 5;
    uint16_t* hb = (uint16_t*)mallocCheck(nb * 2);
    for (size_t i = 0; i < nb; i++) hb[i] = (uint16_t)(i * 40503u);
    bf16* db = d_bf16_poison(nb);
    cudaCheck(cudaMemcpy(db, hb, nb * 2, cudaMemcpyHostToDevice));
    for (int pass = 0; pass < 2; pass++) {
        size_t off = pass, m = nb - off;
        float* dy = d_f32_poison(nb);
        bf16_to_f32(dy + off, db + off, m, g_s);
        Written w;
        float* y = dl_f32(dy, nb, &w);
        size_t bad = 0;
        for (size_t i = off; i < nb; i++) {
            int nan_in = (hb[i] & 0x7F80) == 0x7F80 && (hb[i] & 0x7F);
            /* NaN stays NaN (sm_90's cvt.f32.bf16 may canonicalise the payload); all else exact */
            bad += nan_in ? !(y[i] != y[i] && f32_bits(y[i]) != 0xFFFFFFFFu) : f32_bits(y[i]) != ((uint32_t)hb[i] << 16);
        }
        int head_ok = !off || f32_bits(y[0]) == 0xFFFFFFFFu;
        check(bad == 0 && w.overrun == 0 && head_ok, "    bf16_to_f32 %-30s n %-9zu %zu mismatches (all 65536 bit patterns; NaN -> any NaN)%s",
              off ? "(offset 1: scalar path)" : "(aligned: vector path)", m, bad, w.overrun || !head_ok ? ", wrote outside" : "");
        free(y);
    }
    free(x); free(hb);
    dfree_all();
}

/* Catches: a wrong row of the table read (token stride), a backward that loses a repeated token's contribution or
 * sums in another order than the CPU, elements outside the output written. */
static void test_embedding(void) {
    printf("embedding (llmc/cuda/embedding.cuh) vs embedding_forward / embedding_backward\n");
    struct { int N, V, C; } fw[] = {{517, 1000, 128}, {300, 77, 100}};
    for (int c = 0; c < 2; c++) {
        int N = fw[c].N, V = fw[c].V, C = fw[c].C;
        float* wte = h_normal((size_t)V * C, 1.0, 0.0, 1);
        int* tok = (int*)mallocCheck(sizeof(int) * N);
        for (int i = 0; i < N; i++) tok[i] = (int)rng_below(&g_rng, V);
        bf16* dout = d_bf16_poison((size_t)N * C);
        embedding_forward(dout, d_i32(tok, N), d_bf16(wte, (size_t)V * C), N, C, g_s);
        Written w;
        float* got = dl_bf16(dout, (size_t)N * C, &w);
        float* ref = h_alloc((size_t)N * C);
        embedding_forward(ref, tok, wte, N, C);
        char name[96];
        snprintf(name, sizeof(name), "forward N %d V %d C %d", N, V, C);
        compare(name, got, ref, (size_t)N * C, tol_bitwise(0), &w);
        FREE_ALL(wte, tok, got, ref);
    }
    /* backward: many repeats of few tokens; N 4100 crosses the 2048-token staging chunk; C 96 leaves
     * part of a 128-channel block idle. Same fp32 additions in the same (token) order as the CPU. */
    struct { int N, V, C; } bw[] = {{600, 50, 128}, {4100, 50, 96}, {333, 1000, 128}};
    for (int c = 0; c < 3; c++) {
        int N = bw[c].N, V = bw[c].V, C = bw[c].C;
        float* dwte0 = h_normal((size_t)V * C, 0.1, 0.0, 0);
        float* dout = h_normal((size_t)N * C, 1.0, 0.0, 1);
        int* tok = (int*)mallocCheck(sizeof(int) * N);
        for (int i = 0; i < N; i++) tok[i] = (int)rng_below(&g_rng, V);
        float* ddw = d_f32(dwte0, (size_t)V * C);
        embedding_backward(ddw, d_bf16(dout, (size_t)N * C), d_i32(tok, N), N, C, g_s);
        Written w;
        float* got = dl_f32(ddw, (size_t)V * C, &w);
        float* ref = h_copy(dwte0, (size_t)V * C);
        embedding_backward(ref, dout, tok, N, C);
        char name[96];
        snprintf(name, sizeof(name), "backward (+=) N %d V %d C %d", N, V, C);
        compare(name, got, ref, (size_t)V * C, tol_bitwise(0), &w);
        FREE_ALL(dwte0, dout, tok, got, ref);
    }
    dfree_all();
}

/* The dw pass riding on the dx launch (RmsDwRide) against the two launches (g_rmsnorm_dw_apart): dx and dw bitwise, for the
 * plain, the duplicated (-protect ew) and the fingerprinting dx kernels, dx written and accumulated, with the dx rows' grid
 * at its size and capped (its warps striding over their own blocks, not the riders'), one launch against two (on the
 * emulation, by its launch counter); and dx aliasing dout (allowed) taking the two launches, with the bits of the
 * out-of-place call. Catches: a rider whose block or thread mapping differs from the dw kernel's, dx's warps striding over
 * the whole launch, a launcher that rides over an in-place dx. */
static void rmsnorm_dw_ride_case(int rows, int C, float eps, const bf16* g, const bf16* x, const bf16* w, const float* ms) {
    const size_t n = (size_t)rows * C;
    float* hold = h_normal(n, 0.5, 0.0, 1);
    float* hdw = h_normal(C, 0.3, 0.0, 1);
    int* flags = (int*)dalloc_raw(2, 4);
    cudaCheck(cudaMemset(flags, 0, 8));
    const char* kinds[3] = {"plain", "duplicated", "fingerprint"};
    int bad = 0, runs = 0, launches_bad = 0;
    for (int kind = 0; kind < 3; kind++)
        for (int acc = 0; acc < 2; acc++)
            for (int cap = 0; cap < 2; cap++) {
                if (kind == 2 && acc) continue;
                bf16* ox[2];
                float* ow[2];
                unsigned long long* fps[2];
#ifdef __CUDA_EMU__
                long long nl[2] = {0, 0};   /* launches, on the emulation's counter */
#endif
                for (int ride = 0; ride < 2; ride++) {
                    ox[ride] = acc ? d_bf16(hold, n) : d_bf16_poison(n);
                    ow[ride] = d_f32(hdw, C);
                    fps[ride] = (unsigned long long*)dalloc_raw(FP_WORDS, 8);
                    cudaCheck(cudaMemset(fps[ride], 0, FP_WORDS * 8));
                    g_rmsnorm_dw_apart = !ride;
                    g_rmsnorm_dx_grid_cap = cap ? 2 : 0;
#ifdef __CUDA_EMU__
                    const long long l0 = (long long)emu_counters()->launches;
#endif
                    rmsnorm_backward_ld(ox[ride], ow[ride], g, x, C, w, ms, rows, 1, C, eps, acc, 1, g_s, kind == 2 ? fps[ride] : NULL,
                                        kind == 1 ? ew_dup(flags, flags + 1) : ew_dup_none());
                    cudaCheck(cudaDeviceSynchronize());
#ifdef __CUDA_EMU__
                    nl[ride] = (long long)emu_counters()->launches - l0;
#endif
                }
                g_rmsnorm_dw_apart = 0;
                g_rmsnorm_dx_grid_cap = 0;
                float *x0 = dl_bf16(ox[0], n, NULL), *x1 = dl_bf16(ox[1], n, NULL), *w0 = dl_f32(ow[0], C, NULL), *w1 = dl_f32(ow[1], C, NULL);
                unsigned long long f[2][FP_WORDS];
                cudaCheck(cudaMemcpy(f[0], fps[0], sizeof(f[0]), cudaMemcpyDeviceToHost));
                cudaCheck(cudaMemcpy(f[1], fps[1], sizeof(f[1]), cudaMemcpyDeviceToHost));
                const bool same = !memcmp(x0, x1, n * 4) && !memcmp(w0, w1, C * 4) && !memcmp(f[0], f[1], sizeof(f[0]));
                if (!same) printf("    rmsnorm dw ride %s acc %d cap %d: differs from the two launches\n", kinds[kind], acc, cap);
                bad += !same;
                runs++;
#ifdef __CUDA_EMU__
                launches_bad += !(nl[0] == 2 && nl[1] == 1);
#endif
                FREE_ALL(x0, x1, w0, w1);
            }
    int hflags[2];
    cudaCheck(cudaMemcpy(hflags, flags, sizeof(hflags), cudaMemcpyDeviceToHost));
    check(bad == 0 && launches_bad == 0 && hflags[0] == 0 && hflags[1] == 0,
          "    %-46s %d of %d cases bitwise, launches 1 (riding) vs 2: %s, flags %d %d", "backward: dw riding on dx's launch == two launches",
          runs - bad, runs, launches_bad ? "NO" : "yes", hflags[0], hflags[1]);
    {   /* dx == dout: the launcher keeps dw in its own launch first; the out-of-place bits */
        bf16* io = d_bf16_poison(n);
        bf16* ref = d_bf16_poison(n);
        float *wi = d_f32(hdw, C), *wr = d_f32(hdw, C);
        cudaCheck(cudaMemcpy(io, g, n * 2, cudaMemcpyDeviceToDevice));
        rmsnorm_backward_ld(ref, wr, g, x, C, w, ms, rows, 1, C, eps, 0, 1, g_s);
#ifdef __CUDA_EMU__
        const long long l0 = (long long)emu_counters()->launches;
#endif
        rmsnorm_backward_ld(io, wi, io, x, C, w, ms, rows, 1, C, eps, 0, 1, g_s);
        cudaCheck(cudaDeviceSynchronize());
        long long nl = 2;
#ifdef __CUDA_EMU__
        nl = (long long)emu_counters()->launches - l0;
#endif
        float *a = dl_bf16(io, n, NULL), *b = dl_bf16(ref, n, NULL), *c = dl_f32(wi, C, NULL), *d = dl_f32(wr, C, NULL);
        check(!memcmp(a, b, n * 4) && !memcmp(c, d, C * 4) && nl == 2, "    %-46s launches %lld", "backward in place (dx == dout) == out of place", nl);
        FREE_ALL(a, b, c, d);
    }
    FREE_ALL(hold, hdw);
}

/* Catches: a wrong eps or mean (sum over the wrong length), a backward that differs from the CPU's formula, a dw
 * reduced across chunks in a thread-dependent order, the fused residual variant differing from the split one, the
 * scalar path for C % 8 != 0 broken. */
static void test_rmsnorm(void) {
    printf("rmsnorm (llmc/cuda/rmsnorm.cuh) vs rmsnorm_forward / rmsnorm_backward\n");
    struct { int rows, C, weighted; float eps; const char* what; } cases[] = {
        {300, 128, 1, 1e-5f, "300 x 128 weighted"},
        {300, 128, 0, (float)FP32_EPS, "300 x 128 parameter-free"},
        {296, 64, 1, 1e-6f, "QK norm 2*37*4 x 64 weighted (Qwen3)"},
        {296, 64, 0, (float)FP32_EPS, "QK norm 2*37*4 x 64 free (nanochat)"},
        {640, 128, 1, 1e-6f, "QK norm 40*16 x 128 weighted (qwen3-0.6b)"},
        {1000, 128, 1, 1e-5f, "1000 x 128 weighted (8 dw chunks)"},
        {64, 2048, 1, 1e-5f, "64 x 2048 weighted"},
        {50, 100, 1, 1e-5f, "50 x 100 weighted (C%8: scalar path)"},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int rows = cases[ci].rows, C = cases[ci].C, wt = cases[ci].weighted;
        float eps = cases[ci].eps;
        size_t n = (size_t)rows * C;
        float* x = h_normal(n, 1.3, 0.2, 1);
        float* w = wt ? h_normal(C, 0.2, 1.0, 1) : NULL;
        bf16* dx = d_bf16(x, n);
        bf16* dw = wt ? d_bf16(w, C) : NULL;
        /* forward */
        bf16* dout = d_bf16_poison(n);
        float* dms = d_f32_poison(rows);
        rmsnorm_forward(dout, dms, dx, dw, rows, C, eps, g_s);
        Written w1, w2;
        float* out = dl_bf16(dout, n, &w1);
        float* ms = dl_f32(dms, rows, &w2);
        float *rout = h_alloc(n), *rms = h_alloc(rows);
        rmsnorm_forward(rout, rms, x, w, rows, C, eps);
        /* ms: C positive terms, the CPU serially (<= (C-1) u relative), the GPU per lane then a 5-level
         * tree (<= (C/32 + 5) u): |err| <= (1.1 C + 8) 2^-24 |ms| */
        double sum_tol = (1.1 * C + 8) * ldexp(1.0, -24);
        char name[128];
        printf("  %s\n", cases[ci].what);
        compare("forward out (bf16)", out, rout, n, tol_bf16(0), &w1);
        compare("forward ms (fp32)", ms, rms, rows, tol_f32(NULL, 0, 0, sum_tol), &w2);
        {   /* the residual add fused in front (residual_rmsnorm_forward) vs residual_forward then rmsnorm_forward: bitwise */
            float* y = h_normal(n, 0.7, -0.1, 1);
            bf16 *dy = d_bf16(y, n), *r1 = d_bf16_poison(n), *o1 = d_bf16_poison(n), *r2 = d_bf16_poison(n), *o2 = d_bf16_poison(n);
            float *m1 = d_f32_poison(rows), *m2 = d_f32_poison(rows);
            residual_forward(r1, dx, dy, n, g_s);
            rmsnorm_forward(o1, m1, r1, dw, rows, C, eps, g_s);
            residual_rmsnorm_forward(r2, o2, m2, dx, dy, dw, rows, C, eps, g_s);
            Written wr, wo, wm;
            float *fr1 = dl_bf16(r1, n, NULL), *fo1 = dl_bf16(o1, n, NULL), *fm1 = dl_f32(m1, rows, NULL);
            float *fr2 = dl_bf16(r2, n, &wr), *fo2 = dl_bf16(o2, n, &wo), *fm2 = dl_f32(m2, rows, &wm);
            compare("residual fused: resid == residual_forward", fr2, fr1, n, tol_bitwise(0), &wr);
            compare("residual fused: out == rmsnorm_forward(resid)", fo2, fo1, n, tol_bitwise(0), &wo);
            compare("residual fused: ms == rmsnorm_forward's", fm2, fm1, rows, tol_bitwise(0), &wm);
            FREE_ALL(y, fr1, fo1, fm1, fr2, fo2, fm2);
        }
        if (wt) {   /* accumulate_dw 0 over a poisoned dw == accumulate into zeros: bitwise (the first microbatch) */
            float* g = h_normal(n, 1.0, 0.0, 1);
            float* zeros = (float*)callocCheck(C, sizeof(float));
            bf16 *dg = d_bf16(g, n), *x1 = d_bf16_poison(n), *x2 = d_bf16_poison(n);
            float *w1p = d_f32(zeros, C), *w2p = d_f32_poison(C), *dms2 = d_f32(ms, rows);
            rmsnorm_backward(x1, w1p, dg, dx, dw, dms2, rows, C, eps, 0, g_s);
            rmsnorm_backward_acc(x2, w2p, dg, dx, dw, dms2, rows, C, eps, 0, 0, g_s);
            Written wa;
            float *a1 = dl_f32(w1p, C, NULL), *a2 = dl_f32(w2p, C, &wa);
            compare("backward dw, accumulate_dw 0 over poison == += into zeros", a2, a1, C, tol_bitwise(0), &wa);
            {   /* the one-launch dw (the last block of a column block sums the chunks) == the two-kernel form, bitwise */
                const int col_blocks = CEIL_DIV(C, RMSNORM_DW_TX);
                int target = 2048 / col_blocks;
                if (target < 1) target = 1;
                int R = CEIL_DIV(rows, target);
                if (R < 128) R = 128;
                const int nchunks = CEIL_DIV(rows, R);
                float *part = d_f32_poison((size_t)nchunks * C), *w3p = d_f32(zeros, C);
                const dim3 blk(RMSNORM_DW_TX, RMSNORM_DW_TY);
                rmsnorm_dw_partial_kernel<<<dim3(col_blocks, nchunks), blk, 0, g_s>>>(part, dg, dx, dms2, rows, C, 1, (size_t)C, eps, R, NULL, 0, NULL);
                rmsnorm_dw_sum_kernel<<<col_blocks, blk, 0, g_s>>>(w3p, part, nchunks, C, 1);
                cudaCheck(cudaGetLastError());
                float* a3 = dl_f32(w3p, C, NULL);
                compare("backward dw: one launch == partials + the sum kernel", a1, a3, C, tol_bitwise(0), NULL);
                free(a3);
            }
            rmsnorm_dw_ride_case(rows, C, eps, dg, dx, dw, dms2);
            FREE_ALL(g, zeros, a1, a2);
        }
        /* backward: both sides get the CPU's ms, so only the kernel's own arithmetic is compared */
        float* dmsin = d_f32(rms, rows);
        for (int acc = 0; acc < 2; acc++) {
            float* g = h_normal(n, 1.0, 0.0, 1);
            float* dx_old = acc ? h_normal(n, 0.5, 0.0, 1) : NULL;
            float* dw_old = wt ? h_normal(C, 0.3, 0.0, 0) : NULL;
            bf16* ddx = acc ? d_bf16(dx_old, n) : d_bf16_poison(n);
            float* ddw = wt ? d_f32(dw_old, C) : NULL;
            rmsnorm_backward(ddx, ddw, d_bf16(g, n), dx, dw, dmsin, rows, C, eps, acc, g_s);
            Written wx, ww;
            float* gdx = dl_bf16(ddx, n, &wx);
            float* gdw = wt ? dl_f32(ddw, C, &ww) : NULL;
            float* rdx = acc ? h_copy(dx_old, n) : h_alloc(n);
            float* rdw = wt ? h_copy(dw_old, C) : NULL;
            rmsnorm_backward(rdx, rdw, g, x, w, rms, rows, C, eps, acc);
            /* mag of dx: |wg| rstd + |x| rstd^3 sum_j |wg_j x_j| / C (+ |dx_old|); the dot has C terms */
            float* mdx = h_alloc(n);
            float* mdw = wt ? h_alloc(C) : NULL;
            if (wt) for (int i = 0; i < C; i++) mdw[i] = fabsf(dw_old[i]);
            for (int r = 0; r < rows; r++) {
                double rstd = 1.0 / sqrt((double)rms[r] + eps), sabs = 0;
                for (int i = 0; i < C; i++) sabs += fabs((double)(w ? w[i] : 1.0f) * g[(size_t)r * C + i] * x[(size_t)r * C + i]);
                for (int i = 0; i < C; i++) {
                    size_t k = (size_t)r * C + i;
                    mdx[k] = (float)(fabs((double)(w ? w[i] : 1.0f) * g[k]) * rstd + fabs((double)x[k]) * rstd * rstd * rstd * sabs / C +
                                     (acc ? fabs((double)dx_old[k]) : 0.0));
                    if (wt) mdw[i] += (float)fabs((double)g[k] * x[k] * rstd);
                }
            }
            snprintf(name, sizeof(name), "backward dx (bf16)%s", acc ? " accumulate" : "");
            compare(name, gdx, rdx, n, tol_bf16_mag(mdx, sum_tol + ldexp(1.0, -22)), &wx);
            if (wt) {
                /* dw: rows terms per column, the CPU serially (<= rows u), the GPU in chunks (fewer) */
                snprintf(name, sizeof(name), "backward dw (fp32, +=)%s", acc ? " [2nd draw]" : "");
                compare(name, gdw, rdw, C, tol_f32(mdw, (rows + 32) * ldexp(1.0, -24), 0, 0), &ww);
            }
            free(g); free(dx_old); free(dw_old); free(gdx); free(gdw); free(rdx); free(rdw); free(mdx); free(mdw);
        }
        free(x); free(w); free(out); free(ms); free(rout); free(rms);
        dfree_all();
    }
}

/* |x1 c| + |x2 s| of each output element of the rotation (the two products the fp32 result sums) */
static float* rope_mag(const float* x, const float* cs, const float* sn, int B, int T, int nh, int hd) {
    int half = hd / 2;
    size_t n = (size_t)B * T * nh * hd;
    float* m = h_alloc(n);
    for (int r = 0; r < B * T; r++) {
        int t = r % T;
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < half; i++) {
                size_t b = ((size_t)r * nh + h) * hd;
                float c = fabsf(cs[t * half + i]), s = fabsf(sn[t * half + i]);
                m[b + i] = fabsf(x[b + i]) * c + fabsf(x[b + i + half]) * s;
                m[b + i + half] = fabsf(x[b + i + half]) * c + fabsf(x[b + i]) * s;
            }
    }
    return m;
}

/* Catches: the wrong pairing (interleaved vs half-split), the wrong theta or missing Llama-3 frequency scaling,
 * positions off by one, a backward that is not the inverse rotation. */
static void test_rope(void) {
    printf("rope (llmc/cuda/rope.cuh) vs rope_forward / rope_backward; 1 ulp + 2^-22 (|x1 c| + |x2 s|) (FMA contraction)\n");
    struct { const char* preset; int B, T, nh; } cases[] = {
        {"tiny-llama", 2, 37, 4}, {"tiny-qwen3", 2, 37, 4}, {"tiny-nanochat", 2, 37, 2}, {"llama3.2-1b", 1, 1024, 8},
        {"qwen3-0.6b", 1, 40, 16}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const Config* c = preset_find(cases[ci].preset);
        int B = cases[ci].B, T = cases[ci].T, nh = cases[ci].nh, hd = c->head_dim, half = hd / 2;
        size_t n = (size_t)B * T * nh * hd;
        float *cs = h_alloc((size_t)T * half), *sn = h_alloc((size_t)T * half);
        rope_tables(c, T, cs, sn);
        float *dcs = d_f32(cs, (size_t)T * half), *dsn = d_f32(sn, (size_t)T * half);
        printf("  %s style, %s tables (theta %g%s), B %d T %d heads %d hd %d\n", c->rope_style == ROPE_HF ? "HF" : "nanochat",
               cases[ci].preset, c->rope_theta, c->rope_llama3 ? ", Llama-3 scaling" : "", B, T, nh, hd);
        float* x = h_normal(n, 1.0, 0.0, 1);
        bf16* dx = d_bf16(x, n);
        bf16* dy = d_bf16_poison(n);
        rope_forward(dy, dx, nh * hd, dcs, dsn, B, T, nh, hd, c->rope_style, g_s);
        Written w;
        float* y = dl_bf16(dy, n, &w);
        float* ry = h_alloc(n);
        rope_forward(ry, x, cs, sn, B, T, nh, hd, c->rope_style);
        float* mag = rope_mag(x, cs, sn, B, T, nh, hd);
        compare("forward", y, ry, n, tol_bf16_mag(mag, ldexp(1.0, -22)), &w);
        bf16* dxi = d_bf16(x, n); /* in place: out == x */
        rope_forward(dxi, dxi, nh * hd, dcs, dsn, B, T, nh, hd, c->rope_style, g_s);
        float* yi = dl_bf16(dxi, n, &w);
        compare("forward in place == out of place", yi, y, n, tol_bitwise(0), &w);
        float* g = h_normal(n, 1.0, 0.0, 1);
        bf16* dg = d_bf16_poison(n);
        rope_backward(dg, nh * hd, d_bf16(g, n), dcs, dsn, B, T, nh, hd, c->rope_style, g_s);
        float* gx = dl_bf16(dg, n, &w);
        float* rgx = h_alloc(n);
        rope_backward(rgx, g, cs, sn, B, T, nh, hd, c->rope_style);
        float* magb = rope_mag(g, cs, sn, B, T, nh, hd);
        compare("backward", gx, rgx, n, tol_bf16_mag(magb, ldexp(1.0, -22)), &w);
        FREE_ALL(cs, sn, x, y, ry, mag, yi, g, gx, rgx, magb);
        dfree_all();
    }
}

/* Catches: a SiLU or ReLU^2 derivative error, the fused SwiGLU rounding differently from the split kernels, in-
 * place aliasing broken, the scalar path for unaligned pointers broken. */
static void test_elementwise(void) {
    printf("element-wise (llmc/cuda/mlp.cuh, llmc/cuda/residual.cuh) vs silu/mul/relu2/residual; fused SwiGLU vs the split kernels\n");
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: [97, 1032] aligned (vector path); pass 1: [37, 111], pointers one element in (scalar). The mlp.cuh
         * launchers take [rows, cols] views; contiguous here (ld = cols), strided in test_strided */
        const int rows = pass ? 37 : 97, cols = pass ? 111 : 1032;
        size_t n = (size_t)rows * cols, off = pass;
        printf("  [%d, %d]%s\n", rows, cols, pass ? ", every pointer offset by one element (scalar path)" : ", aligned (vector path)");
        float* a = h_normal(n, 2.0, 0.0, 1);
        float* b = h_normal(n, 1.0, 0.0, 1);
        float* g = h_normal(n, 1.0, 0.0, 1);
        /* device copies placed `off` elements into their buffers */
        float *a2 = h_alloc(n + off), *b2 = h_alloc(n + off), *g2 = h_alloc(n + off);
        a2[0] = b2[0] = g2[0] = 0.5f;
        memcpy(a2 + off, a, n * 4); memcpy(b2 + off, b, n * 4); memcpy(g2 + off, g, n * 4);
        bf16 *da = d_bf16(a2, n + off) + off, *db = d_bf16(b2, n + off) + off, *dg = d_bf16(g2, n + off) + off;
        Written w;
        float* ref = h_alloc(n);
        float* ref2 = h_alloc(n);
        /* silu: expf (CUDA 2 ulp, glibc < 1 ulp) and a division: a few fp32 ulps apart, 1 bf16 ulp */
        bf16* o = d_bf16_poison(n + off);
        silu_forward(o + off, da, rows, cols, cols, g_s);
        float* y = dl_bf16(o + off, n, &w);
        w.overrun = guard_overrun(o, n + off);
        silu_forward(ref, a, n);
        compare("silu forward", y, ref, n, tol_bf16(ldexp(1.0, -20)), &w);
        free(y);
        o = d_bf16_poison(n + off);
        silu_backward(o + off, dg, da, rows, cols, cols, g_s);
        y = dl_bf16(o + off, n, &w);
        w.overrun = guard_overrun(o, n + off);
        silu_backward(ref, g, a, n);
        float* mag = h_alloc(n);
        for (size_t i = 0; i < n; i++) {
            double s = 1.0 / (1.0 + exp(-(double)a[i]));
            mag[i] = (float)(fabs((double)g[i]) * (s + fabs(a[i] * s * (1 - s))));
        }
        compare("silu backward (1 ulp + 2^-20 |dact| (s + |x s (1-s)|))", y, ref, n, tol_bf16_mag(mag, ldexp(1.0, -20)), &w);
        free(y);
        /* products of two bf16 are exact in fp32, a single fp32 add is the same on both: bitwise */
        o = d_bf16_poison(n + off);
        mul_forward(o + off, da, db, rows, cols, cols, g_s);
        y = dl_bf16(o + off, n, &w);
        w.overrun = guard_overrun(o, n + off);
        mul_forward(ref, a, b, n);
        compare("mul forward", y, ref, n, tol_bitwise(1), &w);
        free(y);
        bf16 *o1 = d_bf16_poison(n + off), *o2 = d_bf16_poison(n + off);
        mul_backward(o1 + off, o2 + off, dg, da, db, rows, cols, cols, g_s);
        mul_backward(ref, ref2, g, a, b, n);
        y = dl_bf16(o1 + off, n, &w);
        w.overrun = guard_overrun(o1, n + off);
        compare("mul backward da", y, ref, n, tol_bitwise(1), &w);
        free(y);
        y = dl_bf16(o2 + off, n, &w);
        w.overrun = guard_overrun(o2, n + off);
        compare("mul backward db", y, ref2, n, tol_bitwise(1), &w);
        free(y);
        o = d_bf16_poison(n + off);
        relu2_forward(o + off, da, rows, cols, cols, g_s);
        y = dl_bf16(o + off, n, &w);
        w.overrun = guard_overrun(o, n + off);
        relu2_forward(ref, a, n);
        compare("relu2 forward", y, ref, n, tol_bitwise(1), &w);
        free(y);
        o = d_bf16_poison(n + off);
        relu2_backward(o + off, dg, da, rows, cols, cols, g_s);
        y = dl_bf16(o + off, n, &w);
        w.overrun = guard_overrun(o, n + off);
        relu2_backward(ref, g, a, n);
        compare("relu2 backward", y, ref, n, tol_bitwise(1), &w);
        free(y);
        o = d_bf16_poison(n + off);
        residual_forward(o + off, da, db, n, g_s);
        y = dl_bf16(o + off, n, &w);
        w.overrun = guard_overrun(o, n + off);
        residual_forward(ref, a, b, n);
        compare("residual forward", y, ref, n, tol_bitwise(1), &w);
        free(y);
        /* fused SwiGLU (gate a, up b, d(prod) g) against the split kernels above on the device: bitwise; the
         * backward in place over d(prod), as the trainer runs it */
        {
            bf16 *act = d_bf16_poison(n + off) + off, *prod = d_bf16_poison(n + off) + off, *act2 = d_bf16_poison(n + off) + off,
                 *prod2 = d_bf16_poison(n + off) + off;
            silu_forward(act, da, rows, cols, cols, g_s);
            mul_forward(prod, act, db, rows, cols, cols, g_s);
            swiglu_forward(act2, prod2, da, db, rows, cols, cols, g_s);
            Written w2;
            float *s1 = dl_bf16(act, n, NULL), *s2 = dl_bf16(prod, n, NULL), *f1 = dl_bf16(act2, n, &w), *f2 = dl_bf16(prod2, n, &w2);
            compare("swiglu forward act == silu_forward", f1, s1, n, tol_bitwise(0), &w);
            compare("swiglu forward prod == mul_forward(act, up)", f2, s2, n, tol_bitwise(0), &w2);
            bf16 *dact = d_bf16_poison(n + off) + off, *dup = d_bf16_poison(n + off) + off, *dgate = d_bf16_poison(n + off) + off,
                 *dup2 = d_bf16_poison(n + off) + off, *dgp = d_bf16_poison(n + off) + off;
            mul_backward(dact, dup, dg, act, db, rows, cols, cols, g_s);
            silu_backward(dgate, dact, da, rows, cols, cols, g_s);
            cudaCheck(cudaMemcpy(dgp, dg, n * sizeof(bf16), cudaMemcpyDeviceToDevice));
            swiglu_backward(dgp, dup2, dgp, act, da, db, rows, cols, cols, g_s);
            float *r1 = dl_bf16(dgate, n, NULL), *r2 = dl_bf16(dup, n, NULL), *b1 = dl_bf16(dgp, n, &w), *b2 = dl_bf16(dup2, n, &w2);
            compare("swiglu backward d(gate) (in place) == mul + silu backward", b1, r1, n, tol_bitwise(0), &w);
            compare("swiglu backward d(up) == mul_backward", b2, r2, n, tol_bitwise(0), &w2);
            FREE_ALL(s1, s2, f1, f2, r1, r2, b1, b2);
        }
        FREE_ALL(a, b, g, a2, b2, g2, ref, ref2, mag);
        dfree_all();
    }
}

/* Catches: a softcap or cross-entropy formula error, ignored targets (-1) counted, a large vocabulary (128256,
 * 151936) reduced with the wrong block stride; in the one-pass classifier (crossentropy_fused) also an online-softmax
 * rescaling error, a row loop that skips or repeats rows, a target logit read after its owner overwrote it. */
static void test_classifier(void) {
    printf("classifier (llmc/cuda/classifier.cuh) vs softcap_forward / crossentropy_forward / crossentropy_softcap_backward; crossentropy_fused\n");
    /* 300 x 1003: more rows than SMs (the fused kernel's blocks take several rows each), V odd (no 16-byte loads) */
    struct { int N, V; float cap; } cases[] = {{96, 1000, 0.0f}, {96, 1000, 15.0f}, {32, 50257, 0.0f}, {32, 50257, 15.0f}, {64, 8192, 30.0f},
        {300, 1003, 15.0f}, {6, 128256, 0.0f}, {6, 151936, 15.0f}};   /* llama3.2-1b's and qwen3-0.6b's vocabularies */
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int N = cases[ci].N, V = cases[ci].V;
        float cap = cases[ci].cap;
        size_t n = (size_t)N * V;
        printf("  N %d V %d softcap %g (every 5th target -1)\n", N, V, cap);
        float* z = h_normal(n, 4.0, 0.0, 1);
        int* tg = (int*)mallocCheck(sizeof(int) * N);
        for (int i = 0; i < N; i++) tg[i] = i % 5 == 3 ? -1 : (int)rng_below(&g_rng, V);
        int* dtg = d_i32(tg, N);
        bf16* dz = d_bf16(z, n);
        softcap_forward(dz, n, cap, g_s);
        Written w;
        float* zc = dl_bf16(dz, n, &w);
        float* rzc = h_copy(z, n);
        softcap_forward(rzc, n, cap);
        /* cap 0: untouched; else tanhf (CUDA 2 ulp vs glibc) and a division: 1 bf16 ulp */
        compare(cap > 0 ? "softcap (in place)" : "softcap 0 leaves the logits untouched", zc, rzc, n,
                cap > 0 ? tol_bf16(ldexp(1.0, -20)) : tol_bitwise(1), &w);
        /* cross-entropy on the GPU's capped logits (both sides read the same bf16 values) */
        float *dl = d_f32_poison(N), *dlse = d_f32_poison(N);
        crossentropy_forward(dl, dlse, dz, dtg, N, V, g_s);
        Written w1, w2;
        float* loss = dl_f32(dl, N, &w1);
        float* lse = dl_f32(dlse, N, &w2);
        float *rloss = h_alloc(N), *rlse = h_alloc(N);
        crossentropy_forward(rloss, rlse, zc, tg, N, V);
        /* GPU: fp32 sum of V exps (per thread ~V/512 terms, then a 9-level tree: relative error of the
         * sum <= (V/512 + 10) u ~ 6e-6 at V 50257, i.e. that much absolute in lse), expf 2 ulp; CPU:
         * double sum of fast_expf (2e-7); plus lse's own fp32 rounding (<= 2^-24 |lse|): 2e-5 + 1e-6 |lse| */
        compare("forward losses (fp32)", loss, rloss, N, tol_f32(NULL, 0, 2e-5, 1e-6), &w1);
        compare("forward lse (fp32)", lse, rlse, N, tol_f32(NULL, 0, 2e-5, 1e-6), &w2);
        int ign_ok = 1;
        for (int i = 0; i < N; i++) if (tg[i] < 0 && f32_bits(loss[i]) != 0) ign_ok = 0;
        check(ign_ok, "    %-46s", "ignored targets (-1) give loss exactly 0");
        /* backward out of place, with the CPU's lse on both sides */
        float dloss = 0.7f / N;
        float* dlse_in = d_f32(rlse, N);
        bf16* dd = d_bf16_poison(n);
        crossentropy_softcap_backward(dd, dz, dlse_in, dtg, N, V, dloss, cap, g_s);
        float* gd = dl_bf16(dd, n, &w);
        float* rd = h_alloc(n);
        crossentropy_softcap_backward(rd, zc, rlse, tg, N, V, dloss, cap);
        /* expf(z - lse) from the same fp32 argument: expf vs fast_expf, a few fp32 ulps (rtol 2^-19);
         * the target element p - 1 cancels when p ~ 1 (2^-22 dloss) */
        Tol tb = tol_bf16(ldexp(1.0, -19));
        tb.atol = ldexp(1.0, -22) * dloss;
        compare("backward dlogits", gd, rd, n, tb, &w);
        /* in place (dlogits == logits, as the model calls it) */
        bf16* dz2 = d_bf16_poison(n);
        cudaCheck(cudaMemcpy(dz2, dz, n * 2, cudaMemcpyDeviceToDevice));
        crossentropy_softcap_backward(dz2, dz2, dlse_in, dtg, N, V, dloss, cap, g_s);
        float* gd2 = dl_bf16(dz2, n, &w);
        compare("backward in place == out of place", gd2, gd, n, tol_bitwise(0), &w);
        /* the one-pass classifier (crossentropy_fused), in place over a copy of the capped logits */
        bf16* dz3 = d_bf16_poison(n);
        cudaCheck(cudaMemcpy(dz3, dz, n * 2, cudaMemcpyDeviceToDevice));
        float *fl = d_f32_poison(N), *flse = d_f32_poison(N);
        crossentropy_fused(fl, flse, dz3, dtg, N, V, dloss, cap, g_s);
        Written w3, w4, w5;
        float* floss = dl_f32(fl, N, &w3);
        float* fse = dl_f32(flse, N, &w4);
        float* fd = dl_bf16(dz3, n, &w5);
        /* the online sum: per thread ~V/1024 terms and at most one rescaling (a product, an expf) per 8-element pack,
         * then the 10-level tree and one scaling per thread: (V/1024 + 3 V/8192 + 13) u ~ 1.3e-5 at V 151936, the
         * two-pass sum's bound; the same tolerance */
        compare("fused losses (fp32) vs the CPU forward", floss, rloss, N, tol_f32(NULL, 0, 2e-5, 1e-6), &w3);
        compare("fused lse (fp32) vs the CPU forward", fse, rlse, N, tol_f32(NULL, 0, 2e-5, 1e-6), &w4);
        ign_ok = 1;
        for (int i = 0; i < N; i++) if (tg[i] < 0 && f32_bits(floss[i]) != 0) ign_ok = 0;
        check(ign_ok, "    %-46s", "fused: ignored targets (-1) give loss exactly 0");
        /* dlogits: the two-pass backward's formula from the fused lse, so bitwise that backward given that lse; and
         * the CPU backward given it, within the bound above */
        float* dfse = d_f32(fse, N);
        bf16* dd4 = d_bf16_poison(n);
        crossentropy_softcap_backward(dd4, dz, dfse, dtg, N, V, dloss, cap, g_s);
        float* gd4 = dl_bf16(dd4, n, &w);
        compare("fused dlogits == backward from its lse", fd, gd4, n, tol_bitwise(0), &w5);
        float* rd2 = h_alloc(n);
        crossentropy_softcap_backward(rd2, zc, fse, tg, N, V, dloss, cap);
        compare("fused dlogits vs the CPU backward", fd, rd2, n, tb, &w5);
        FREE_ALL(z, tg, zc, rzc, loss, lse, rloss, rlse, gd, rd, gd2, floss, fse, fd, gd4, rd2);
        dfree_all();
    }
}

/* Catches: a bias correction, decay or epsilon placement that differs from the CPU's AdamW, the grad scale not
 * applied, the bf16 weight copy not refreshed. */
static void test_adamw(void) {
    printf("adamw (llmc/cuda/adamw.cuh) vs the formula of train_sdc.c adamw_update (+ scale_grads, bf16 copy)\n");
    struct { size_t n, off; double lr, wd, grad_scale; long long t; } cases[] = {
        {1000003, 0, 3e-4, 0.1, 0.6, 7}, {4099, 1, 1e-3, 0.0, 1.0, 1}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        size_t n = cases[ci].n, off = cases[ci].off;
        double lr = cases[ci].lr;
        float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = (float)cases[ci].grad_scale;
        float decay = (float)(1.0 - lr * cases[ci].wd);
        double bc1 = 1.0 - pow(0.9, (double)cases[ci].t), bc2 = 1.0 - pow(0.95, (double)cases[ci].t);
        float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
        printf("  n %zu%s, lr %g, decay %.6f, grad_scale %g, t %lld\n", n, off ? " (pointers offset: scalar path)" : "", lr,
               decay, gs, cases[ci].t);
        float* p = h_normal(n + off, 0.02, 0.0, 0);
        float* g = h_normal(n + off, 1e-3, 0.0, 0);
        float* m = h_normal(n + off, 1e-4, 0.0, 0);
        float* v = h_normal(n + off, 1e-3, 0.0, 0);
        for (size_t i = 0; i < n + off; i++) v[i] = v[i] * v[i];
        float *dp = d_f32(p, n + off), *dg = d_f32(g, n + off), *dm = d_f32(m, n + off), *dv = d_f32(v, n + off);
        bf16* dpb = d_bf16_poison(n + off);
        adamw_update(dp + off, dpb + off, dg + off, dm + off, dv + off, n, gs, decay, b1, b2, eps, step_size, bc2_sqrt, g_s);
        Written wp, wm, wv, wb;
        float* gp = dl_f32(dp + off, n, &wp);
        float* gm = dl_f32(dm + off, n, &wm);
        float* gv = dl_f32(dv + off, n, &wv);
        float* gb = dl_bf16(dpb + off, n, &wb);
        wb.overrun = guard_overrun(dpb, n + off);
        /* the CPU: scale_grads, then adamw_update's loop, then model_prepare_weights' rounding */
        float *rp = h_alloc(n), *rm = h_alloc(n), *rv = h_alloc(n), *mp = h_alloc(n), *mm = h_alloc(n), *mv = h_alloc(n);
        for (size_t j = 0; j < n; j++) {
            float gg = g[off + j] * gs, pp = p[off + j], m0 = m[off + j], v0 = v[off + j];
            float pj = pp, mj = m0, vj = v0;
            pj *= decay;
            mj += (1.0f - b1) * (gg - mj);
            vj = vj * b2 + (1.0f - b2) * gg * gg;
            float denom = sqrtf(vj) / bc2_sqrt + eps;
            pj -= step_size * (mj / denom);
            rp[j] = pj; rm[j] = mj; rv[j] = vj;
            /* magnitudes of the terms of each result (a few fp32 roundings each, FMA contraction) */
            mm[j] = fabsf(m0) + fabsf(gg);
            mv[j] = v0 + gg * gg;
            mp[j] = fabsf(pp) + step_size * ((fabsf(m0) + fabsf(gg)) / denom + fabsf(mj / denom));
        }
        compare("p (fp32): 2^-20 (|p| + step (|m|+|g|)/denom + ...)", gp, rp, n, tol_f32(mp, ldexp(1.0, -20), 0, 0), &wp);
        compare("m (fp32): 2^-21 (|m| + |g|)", gm, rm, n, tol_f32(mm, ldexp(1.0, -21), 0, 0), &wm);
        compare("v (fp32): 2^-21 (v + g^2)", gv, rv, n, tol_f32(mv, ldexp(1.0, -21), 0, 0), &wv);
        float* gpr = h_alloc(n);
        for (size_t j = 0; j < n; j++) gpr[j] = bf16_round(gp[j]);
        compare("p_bf16 == bf16_rn(p) of the GPU's own p", gb, gpr, n, tol_bitwise(0), &wb);
        compare("p_bf16 vs bf16_rn(p) of the CPU", gb, rp, n, tol_bf16(0), &wb);
        FREE_ALL(p, g, m, v, gp, gm, gv, gb, rp, rm, rv, mp, mm, mv, gpr);
        dfree_all();
    }
}

/* Catches: elements skipped or counted twice at block boundaries, a reduction order that changes between calls
 * (non-deterministic), a sum in fp32 where the design says double. */
static void test_global_norm(void) {
    printf("global norm (llmc/cuda/global_norm.cuh) vs sumsq_det (both in double: rel err <= (n + 1024) 2^-53)\n");
    size_t sizes[] = {1, 7, 1000003, 10000019};
    for (int ci = 0; ci < 4; ci++) {
        size_t n = sizes[ci];
        float* g = h_normal(n, 1e-2, 0.0, 0);
        float* dg = d_f32(g, n);
        double a = global_norm_squared(dg, n, g_s);
        double b = global_norm_squared(dg, n, g_s);
        double r = sumsq_det(g, n);
        double rel = fabs(a - r) / r;
        check(rel <= (n + 1024) * ldexp(1.0, -53) && memcmp(&a, &b, sizeof(a)) == 0,
              "    n %-10zu gpu %.17g cpu %.17g rel err %.2e, two calls bitwise %s", n, a, r, rel,
              memcmp(&a, &b, sizeof(a)) == 0 ? "equal" : "DIFFERENT");
        free(g);
        dfree_all();
    }
}

/* ------------------------------------------------------------ one optimizer pass (multi_tensor.cuh) */
/* adamw_multi_tensor over a layout of tensors with odd sizes and offsets (chunks on the float4 and the
 * scalar paths, tensors shorter than a chunk, an empty one, decay on some) against one adamw_update per
 * tensor with the same scalars: bitwise, every element written; mt_grad_sumsq per tensor (with an
 * unscale of 2^-15) against sumsq_det of the CPU's scaled values (rel err <= (n + 1024) 2^-53), two calls
 * bitwise equal */
/* Catches: a chunk table that skips or overlaps tensors, decay applied to the wrong tensors, the multi-tensor
 * update differing from the per-tensor one, per-tensor norms mixed up, the folded unscale wrong. */
/* an optimizer state of P elements on the host: weights, gradients, m and v (v >= 0), fixed seeds */
static void mt_test_state(size_t P, float** p, float** g, float** m, float** v) {
    *p = h_normal(P, 0.02, 0.0, 0);
    *g = h_normal(P, 3e2, 0.0, 0);
    *m = h_normal(P, 1e-4, 0.0, 0);
    *v = h_normal(P, 1e-3, 0.0, 0);
    for (size_t i = 0; i < P; i++) (*v)[i] = (*v)[i] * (*v)[i];
}
static void test_multi_tensor(void) {
    printf("one optimizer pass (llmc/cuda/multi_tensor.cuh) vs one adamw_update per tensor (bitwise) and sumsq_det per tensor\n");
    const size_t numel[] = {5, MT_CHUNK + 3, 0, 3 * MT_CHUNK, 1, 2 * MT_CHUNK - 1, 4096, 77};
    const int decay_of[] = {1, 0, 1, 1, 0, 1, 0, 1};
    const int n = (int)(sizeof(numel) / sizeof(numel[0]));
    size_t off[8], P = 0;
    for (int i = 0; i < n; i++) { off[i] = P; P += numel[i]; }
    MtTable t;
    mt_table_build(&t, n, off, numel, decay_of);
    float *p, *g, *m, *v;
    mt_test_state(P, &p, &g, &m, &v);
    AdamWParams h;
    h.grad_scale = 0.7f; h.b1 = 0.9f; h.b2 = 0.95f; h.eps = 1e-8f; h.step_size = 1e-3f; h.bc2_sqrt = 0.3f; h.decay = 1.0f;
    h.unscale = ldexpf(1.0f, -15);
    const float decay = 0.9999f;
    float *dp = d_f32(p, P), *dg = d_f32(g, P), *dm = d_f32(m, P), *dv = d_f32(v, P);
    bf16* dpb = d_bf16_poison(P);
    adamw_multi_tensor(dp, dpb, dg, dm, dv, &t, h, decay, P, g_s);
    Written wp, wm, wv, wb;
    float *ap = dl_f32(dp, P, &wp), *am = dl_f32(dm, P, &wm), *av = dl_f32(dv, P, &wv), *ab = dl_bf16(dpb, P, &wb);
    /* the reference: the CPU's scale_grads (g * 2^-15 stored), then one adamw_update per tensor */
    float* gs = h_alloc(P);
    for (size_t i = 0; i < P; i++) gs[i] = g[i] * h.unscale;
    float *rp = d_f32(p, P), *rg = d_f32(gs, P), *rm = d_f32(m, P), *rv = d_f32(v, P);
    bf16* rpb = d_bf16_poison(P);
    for (int i = 0; i < n; i++)
        adamw_update(rp + off[i], rpb + off[i], rg + off[i], rm + off[i], rv + off[i], numel[i], h.grad_scale, decay_of[i] ? decay : 1.0f,
                     h.b1, h.b2, h.eps, h.step_size, h.bc2_sqrt, g_s);
    float *bp = dl_f32(rp, P, NULL), *bm = dl_f32(rm, P, NULL), *bv = dl_f32(rv, P, NULL), *bb = dl_bf16(rpb, P, NULL);
    compare("p (fp32) vs per-tensor adamw_update", ap, bp, P, tol_bitwise(0), &wp);
    compare("m (fp32) vs per-tensor adamw_update", am, bm, P, tol_bitwise(0), &wm);
    compare("v (fp32) vs per-tensor adamw_update", av, bv, P, tol_bitwise(0), &wv);
    compare("p_bf16 vs per-tensor adamw_update", ab, bb, P, tol_bitwise(0), &wb);
    double* ss = (double*)dalloc_raw(n, 8);
    double* part = (double*)dalloc_raw(t.n_chunks, 8);
    double h1[8], h2[8];
    mt_grad_sumsq(ss, part, dg, h.unscale, &t, g_s);
    cudaCheck(cudaMemcpy(h1, ss, sizeof(double) * n, cudaMemcpyDeviceToHost));
    mt_grad_sumsq(ss, part, dg, h.unscale, &t, g_s);
    cudaCheck(cudaMemcpy(h2, ss, sizeof(double) * n, cudaMemcpyDeviceToHost));
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        double r = sumsq_det(gs + off[i], numel[i]), e = r > 0 ? fabs(h1[i] - r) / r : fabs(h1[i]);
        if (e > (numel[i] + 1024) * ldexp(1.0, -53)) bad++;
        if (e > worst) worst = e;
    }
    check(bad == 0 && memcmp(h1, h2, sizeof(double) * n) == 0, "    per-tensor sums of squares of grad x 2^-15 (%d tensors, %d chunks): "
          "worst rel err %.2e vs sumsq_det, %d over (n + 1024) 2^-53; two calls bitwise %s", n, t.n_chunks, worst, bad,
          memcmp(h1, h2, sizeof(double) * n) == 0 ? "equal" : "DIFFERENT");
    /* the update with -protect bound's row norms inside (MtRows): tensors as rows of cols elements (cols below and above
     * MT_CHUNK, not dividing it; a tensor of one row; others without norms) from the same start: p, m, v, p_bf16
     * bitwise the plain pass's, the norms bitwise mmb_row_norms_jobs' over the bf16 weights it wrote */
    {
        const int cols[8] = {5, 0, 0, 96, 1, 0, 64, 7};   /* tensor 3: 3 MT_CHUNK / 96 rows; 6: 4096 / 64 */
        const int cols2[8] = {0, 3072, 0, 3 * MT_CHUNK, 0, 0, 4096, 11};   /* 3072 does not divide MT_CHUNK; one row; 77 = 7 x 11 */
        for (int pass = 0; pass < 2; pass++) {
            const int* cl = pass ? cols2 : cols;
            size_t numel2[8];
            memcpy(numel2, numel, sizeof(numel2));
            if (pass) numel2[1] = 3 * 3072;   /* rows of 3072 */
            size_t off2[8], P2 = 0;
            for (int i = 0; i < n; i++) { off2[i] = P2; P2 += numel2[i]; }
            float *p2, *g2, *m2, *v2;
            mt_test_state(P2, &p2, &g2, &m2, &v2);
            MtTable t2;
            mt_table_build(&t2, n, off2, numel2, decay_of);
            size_t nrows = 0;
            for (int i = 0; i < n; i++) nrows += cl[i] ? numel2[i] / cl[i] : 0;
            float* norms = d_f32_poison(nrows);
            float* outs[8];
            MmbJob jobs[8];
            int nj = 0;
            size_t r = 0;
            float *qp = d_f32(p2, P2), *qg = d_f32(g2, P2), *qm = d_f32(m2, P2), *qv = d_f32(v2, P2);
            bf16* qb = d_bf16_poison(P2);
            for (int i = 0; i < n; i++) {
                outs[i] = cl[i] ? norms + r : NULL;
                if (cl[i]) {
                    jobs[nj].out = NULL; jobs[nj].x = qb + off2[i]; jobs[nj].rows = (int)(numel2[i] / cl[i]); jobs[nj].cols = cl[i];
                    jobs[nj].ld = cl[i]; jobs[nj].first = (long long)r;
                    nj++;
                    r += numel2[i] / cl[i];
                }
            }
            MtRows tr;
            mt_rows_build(&tr, n, off2, numel2, decay_of, cl, outs);
            adamw_multi_tensor_rows(qp, qb, qg, qm, qv, &tr, h, decay, "bound", g_s);
            float *xp = dl_f32(qp, P2, NULL), *xm = dl_f32(qm, P2, NULL), *xv = dl_f32(qv, P2, NULL), *xb = dl_bf16(qb, P2, NULL);
            float* xn = dl_f32(norms, nrows, NULL);
            /* the plain pass from the same start */
            float *zp = d_f32(p2, P2), *zg = d_f32(g2, P2), *zm = d_f32(m2, P2), *zv = d_f32(v2, P2);
            bf16* zb = d_bf16_poison(P2);
            adamw_multi_tensor(zp, zb, zg, zm, zv, &t2, h, decay, P2, g_s);
            float *yp = dl_f32(zp, P2, NULL), *ym = dl_f32(zm, P2, NULL), *yv = dl_f32(zv, P2, NULL), *yb = dl_bf16(zb, P2, NULL);
            /* the norms' own pass over the bf16 weights the plain pass wrote */
            float* norms2 = d_f32_poison(nrows);
            r = 0;
            for (int j = 0; j < nj; j++) { jobs[j].x = zb + (jobs[j].x - qb); jobs[j].out = norms2 + r; r += jobs[j].rows; }
            MmbJob* djobs = (MmbJob*)dalloc_raw(sizeof(MmbJob) * nj, 1);
            cudaCheck(cudaMemcpy(djobs, jobs, sizeof(MmbJob) * nj, cudaMemcpyHostToDevice));
            mmb_row_norms_jobs(djobs, jobs, nj, g_s);
            float* yn = dl_f32(norms2, nrows, NULL);
            const int same_u = !memcmp(xp, yp, P2 * 4) && !memcmp(xm, ym, P2 * 4) && !memcmp(xv, yv, P2 * 4) && !memcmp(xb, yb, P2 * 4);
            const int same_n = !memcmp(xn, yn, nrows * 4);
            check(same_u && same_n, "    with the row norms inside (%s, %d chunks): p, m, v, p_bf16 bitwise the plain pass's: %s; %zu row norms "
                  "bitwise mmb_row_norms_jobs': %s", pass ? "rows of 3072, 24576, 4096, 11" : "rows of 5, 96, 1, 64, 7", tr.n_chunks,
                  same_u ? "yes" : "NO", nrows, same_n ? "yes" : "NO");
            mt_rows_free(&tr);
            mt_table_free(&t2);
            FREE_ALL(p2, g2, m2, v2, xp, xm, xv, xb, xn, yp, ym, yv, yb, yn);
        }
    }
    mt_table_free(&t);
    FREE_ALL(p, g, m, v, ap, am, av, ab, gs, bp, bm, bv, bb);
    dfree_all();
}

/* ------------------------------------------------------------------- Q/K fingerprints (fingerprint.cuh) */
/* the fingerprint test on the GPU: the device fingerprint of a stored bf16 tensor equals the CPU's
 * (llmc/sdc/fingerprint.h, width 16); every single-bit change at every position changes it (exhaustive on
 * small tensors: 16 bits x n elements); a swap of two different elements changes it */
/* Catches: a fingerprint blind to some bit positions or to swaps (a Q/K fault that passes the comparison), a GPU
 * fingerprint that differs from the CPU's. */
static void test_fingerprint(void) {
    printf("Q/K fingerprints: GPU == CPU; any single-bit change (exhaustive) and any swap of two different elements change them\n");
    size_t sizes[] = {1, 7, 64, 257};
    for (int ci = 0; ci < 4; ci++) {
        size_t n = sizes[ci];
        float* h = h_normal(n, 1.0, 0.0, 1);
        bf16* d = d_bf16(h, n);
        Fingerprint g0 = qk_fingerprint_dev(d, n, g_s), c0 = qk_fingerprint(h, n, 16);
        int same = fp_equal(g0, c0), unchanged = 0, tried = 0, swaps = 0, swap_same = 0;
        uint16_t* bits = (uint16_t*)mallocCheck(sizeof(uint16_t) * n);
        cudaCheck(cudaMemcpy(bits, d, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            for (int b = 0; b < 16; b++) {
                uint16_t x = (uint16_t)(bits[i] ^ (1u << b));
                cudaCheck(cudaMemcpy((uint16_t*)d + i, &x, 2, cudaMemcpyHostToDevice));
                Fingerprint f = qk_fingerprint_dev(d, n, g_s);
                unchanged += fp_equal(f, g0);
                tried++;
                cudaCheck(cudaMemcpy((uint16_t*)d + i, &bits[i], 2, cudaMemcpyHostToDevice));
            }
        for (size_t i = 0; i + 1 < n && swaps < 200; i++) {
            size_t j = (i * 7 + 3) % n;
            if (bits[i] == bits[j]) continue;
            cudaCheck(cudaMemcpy((uint16_t*)d + i, &bits[j], 2, cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy((uint16_t*)d + j, &bits[i], 2, cudaMemcpyHostToDevice));
            swap_same += fp_equal(qk_fingerprint_dev(d, n, g_s), g0);
            swaps++;
            cudaCheck(cudaMemcpy((uint16_t*)d + i, &bits[i], 2, cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy((uint16_t*)d + j, &bits[j], 2, cudaMemcpyHostToDevice));
        }
        check(same && unchanged == 0 && swap_same == 0 && tried == (int)n * 16,
              "    n %-4zu GPU == CPU %s; %d/%d single-bit flips left it unchanged; %d/%d swaps left it unchanged", n,
              same ? "yes" : "NO", unchanged, tried, swap_same, swaps);
        free(h); free(bits);
        dfree_all();
    }
}

/* the row-strided fingerprint (qk_fingerprint_rows_acc, -protect qk_bwd) on views of a padded buffer: equal to the
 * CPU's qk_fingerprint (width 16) of the contiguous copy and to qk_fingerprint_acc on it; a change in the padding
 * leaves it alone; a single-bit change at the first and at the last element of the view, and at every element of
 * the last row, changes it.
 * Catches: a strided fingerprint that reads the padding, skips the last row or element (a recomputation whose
 * mismatch there passes), folds the storage index instead of the logical one (differs from the contiguous one). */
static void test_fingerprint_rows(void) {
    printf("row-strided fingerprints: GPU == CPU on the contiguous copy; padding ignored; last row and element seen\n");
    struct { size_t rows, cols, ld; } cases[] = {{1, 1, 1}, {5, 37, 50}, {64, 96, 96}, {300, 224, 256}, {3, 257, 300}};
    for (int ci = 0; ci < 5; ci++) {
        const size_t rows = cases[ci].rows, cols = cases[ci].cols, ld = cases[ci].ld, n = rows * cols;
        float* h = h_normal(n, 1.0, 0.0, 1);
        float* p = h_alloc(rows * ld);
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < ld; c++) p[r * ld + c] = c < cols ? h[r * cols + c] : 3.0f;
        bf16 *dp = d_bf16(p, rows * ld), *dc = d_bf16(h, n);
        unsigned long long* part = (unsigned long long*)cuda_workspace_f32(3, 2 * FP_WORDS);
        auto rows_fp = [&]() {
            fingerprint_zero(part, g_s);
            qk_fingerprint_rows_acc(part, dp, rows, cols, ld, g_s);
            return fingerprint_read(part, g_s);
        };
        Fingerprint g = rows_fp();
        Fingerprint gc = qk_fingerprint_dev(dc, n, g_s), c0 = qk_fingerprint(h, n, 16);
        int same = fp_equal(g, c0) && fp_equal(gc, c0);
        int pad_changes = 0, missed = 0, tried = 0;
        if (ld > cols) {   /* the padding of the last row */
            uint16_t x = 0x7f80u;
            cudaCheck(cudaMemcpy((uint16_t*)dp + (rows - 1) * ld + cols, &x, 2, cudaMemcpyHostToDevice));
            pad_changes = !fp_equal(rows_fp(), g);
        }
        for (size_t c = 0; c < cols; c++) {   /* every element of the last row, and the first element */
            for (int e = 0; e < 2; e++) {
                size_t off = e ? 0 : (rows - 1) * ld + c;
                if (e && c) continue;
                uint16_t b0, b1;
                cudaCheck(cudaMemcpy(&b0, (uint16_t*)dp + off, 2, cudaMemcpyDeviceToHost));
                b1 = (uint16_t)(b0 ^ (1u << (c % 16)));
                cudaCheck(cudaMemcpy((uint16_t*)dp + off, &b1, 2, cudaMemcpyHostToDevice));
                missed += fp_equal(rows_fp(), g);
                tried++;
                cudaCheck(cudaMemcpy((uint16_t*)dp + off, &b0, 2, cudaMemcpyHostToDevice));
            }
        }
        check(same && !pad_changes && !missed, "    rows %-3zu cols %-3zu ld %-3zu GPU == CPU %s; padding changed it: %s; %d/%d single-bit flips missed",
              rows, cols, ld, same ? "yes" : "NO", pad_changes ? "YES" : "no", missed, tried);
        FREE_ALL(h, p);
        dfree_all();
    }
}

/* ------------------------------------------------------------------ GEMM plan cache (matmul.cuh) */
/* more distinct GEMM shapes than the plan cache holds (as -sample_every makes, one per prefix length):
 * every product still right (fp32 C of exact bf16 products, k 8: exact sums of 8 terms with small
 * integers), and the first shape, evicted and planned again, gives the same bits as the first time */
/* Catches: a plan cache that returns the wrong plan after eviction, or fails when more shapes are seen than it
 * holds. */
static void test_matmul_cache(void) {
    const int nshapes = MATMUL_CACHE_SIZE + 40, k = 8, n = 8;
    printf("matmul plan cache: %d distinct shapes through a %d-plan cache (m 1..%d, n %d, k %d)\n", nshapes, MATMUL_CACHE_SIZE, nshapes, n, k);
    const int mmax = nshapes;
    float* A = h_alloc((size_t)mmax * k);
    float* Bm = h_alloc((size_t)k * n);
    for (int i = 0; i < mmax * k; i++) A[i] = (float)((i * 7) % 9 - 4);
    for (int i = 0; i < k * n; i++) Bm[i] = (float)((i * 5) % 7 - 3);
    bf16 *dA = d_bf16(A, (size_t)mmax * k), *dB = d_bf16(Bm, (size_t)k * n);
    float* dC = d_f32_poison((size_t)mmax * n);
    size_t bad = 0;
    float* first = NULL;
    for (int m = 1; m <= nshapes; m++) {
        matmul_bf16(dC, 1, dA, dB, m, n, k, 0, 0, 1.0f, 0.0f, 1, 0, 0, 0, g_s);
        if (m == 1 || m == nshapes || m % 64 == 0) {
            float* got = dl_f32(dC, (size_t)m * n, NULL);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    float r = 0;
                    for (int p = 0; p < k; p++) r += A[i * k + p] * Bm[p * n + j];
                    bad += got[i * n + j] != r;
                }
            if (m == 1) first = h_copy(got, (size_t)n);
            free(got);
        }
    }
    matmul_bf16(dC, 1, dA, dB, 1, n, k, 0, 0, 1.0f, 0.0f, 1, 0, 0, 0, g_s);
    float* again = dl_f32(dC, (size_t)n, NULL);
    int same = memcmp(again, first, sizeof(float) * n) == 0;
    check(bad == 0 && same && g_matmul_nplans == MATMUL_CACHE_SIZE,
          "    %d shapes: %zu wrong elements; the evicted first shape planned again gives the same bits: %s; plans cached %d", nshapes,
          bad, same ? "yes" : "NO", g_matmul_nplans);
    FREE_ALL(A, Bm, first, again);
    dfree_all();
}

/* ------------------------------------------------------------------------- argmax (train_sdc.cu) */
/* argmax_kernel (evaluation predictions) against the CPU trainer's strict '>' scan (first maximum on ties)
 * at llama3.2-1b's and qwen3-0.6b's vocabularies: random rows, rows with the maximum repeated (first wins),
 * the maximum in the first and in the last column, a constant row */
/* Catches: ties resolved to another index than the CPU's first maximum, the first or last column missed, a launch
 * configuration the GPU refuses. */
static void test_argmax(void) {
    printf("argmax_kernel (train_sdc.cu) vs the CPU's first-maximum scan\n");
    const int Vs[2] = {128256, 151936};
    for (int vi = 0; vi < 2; vi++) {
        const int V = Vs[vi], N = 9;
        float* z = h_normal((size_t)N * V, 2.0, 0.0, 1);
        for (int j = 0; j < 5; j++) z[(size_t)1 * V + 100 + j * 3001] = 40.0f;       /* ties: 100 wins */
        z[(size_t)2 * V + 0] = 50.0f;                                              /* first column */
        z[(size_t)3 * V + V - 1] = 50.0f;                                          /* last column */
        for (int i = 0; i < V; i++) z[(size_t)4 * V + i] = 1.0f;                   /* constant: 0 */
        z[(size_t)5 * V + V - 1] = 60.0f; z[(size_t)5 * V + V - 2] = 60.0f;        /* tie at the end: V-2 */
        bf16* dz = d_bf16(z, (size_t)N * V);
        int* dout = (int*)dalloc_raw(N, 4);
        argmax_kernel<<<N, 256, 0, g_s>>>(dout, dz, V);
        cudaCheck(cudaGetLastError());
        int got[9];
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(got, dout, sizeof(got), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < N; r++) {
            const float* zr = z + (size_t)r * V;
            int best = 0;
            for (int i = 1; i < V; i++) if (zr[i] > zr[best]) best = i;
            if (got[r] != best) { if (!bad) printf("      row %d: gpu %d cpu %d\n", r, got[r], best); bad++; }
        }
        check(bad == 0, "    V %-6d %d rows (ties, first/last column, constant): %d differ", V, N, bad);
        free(z);
        dfree_all();
    }
}

/* ------------------------------------------------------------- unscale and found_inf (train_sdc.cu) */
/* model_unscale_check (exponent scaling's grads *= 2^-k, folded into the norms and AdamW, then the
 * non-finite test that skips the update): the stored gradients are left as they are; the norm and the
 * AdamW step taken with the fold are bitwise those from the gradients unscaled by the CPU trainer's
 * scale_grads (uploaded, no fold); found_inf raised by one NaN, one +inf, one -inf anywhere in the
 * gradients (first, middle, last element), never by clean or huge finite ones */
/* Catches: an unscale check (found_inf, 2^-k) on the GPU that differs from the CPU trainer's. */
static void test_unscale(void) {
    Config c = *preset_find("tiny-llama");
    c.vocab_size = 256; c.seq_len = 32;
    Model gm_, *gm = &gm_;
    model_build(gm, &c, 2, 32, 1);
    cpu::Model cm_, *cm = &cm_;
    cpu::model_build(cm, &c, 2, 32, 1);
    const size_t P = gm->L.total;
    printf("model_unscale_check (train_sdc.cu) vs the CPU trainer's, %s, %zu gradients\n", "tiny-llama", P);
    model_init_weights(gm, 11);
    const float *hp, *hm, *hv;
    model_host_state(gm, &hp, &hm, &hv);
    float *p0 = h_copy(hp, P), *m0 = h_copy(hm, P), *v0 = h_copy(hv, P);
    float* g = h_normal(P, 3e4, 0.0, 0);
    g[P / 3] = 3.0e38f;                        /* huge but finite: not found_inf */
    for (size_t i = 0; i < P; i += 97) g[i] = ldexpf(g[i], -130);   /* x 2^-15 lands below the normal range */
    const float s = ldexpf(1.0f, -15);
    memcpy(cm->grads, g, P * 4);
    int fc = cpu::model_unscale_check(cm, s);  /* cm->grads: the CPU's unscaled gradients */
    AdamW opt = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    /* (a) the fold: g uploaded, unscale_check(s), update */
    model_zero_grads(gm);
    cudaCheck(cudaMemcpy(gm->grads, g, P * 4, cudaMemcpyHostToDevice));
    int fg = model_unscale_check(gm, s);
    double na = model_grad_norm(gm);
    double ua = model_update(gm, &opt, 1, 1.0);
    float *ga = dl_f32(gm->grads, P, NULL), *pa = dl_f32(gm->params, P, NULL), *ma = dl_f32(gm->m, P, NULL), *va = dl_f32(gm->v, P, NULL);
    /* (b) the CPU's unscaled gradients uploaded, no fold */
    model_load_state(gm, p0, m0, v0);
    model_zero_grads(gm);
    cudaCheck(cudaMemcpy(gm->grads, cm->grads, P * 4, cudaMemcpyHostToDevice));
    int fb = model_unscale_check(gm, 1.0f);
    double nb = model_grad_norm(gm);
    double ub = model_update(gm, &opt, 1, 1.0);
    float *pb = dl_f32(gm->params, P, NULL), *mb = dl_f32(gm->m, P, NULL), *vb = dl_f32(gm->v, P, NULL);
    size_t differ = bits_differ(pa, pb, P) + bits_differ(ma, mb, P) + bits_differ(va, vb, P), touched = bits_differ(ga, g, P);
    check(fg == 0 && fb == 0 && fc == 0 && differ == 0 && touched == 0 && memcmp(&na, &nb, 8) == 0 && memcmp(&ua, &ub, 8) == 0,
          "    finite gradients x 2^-15 (some below the normal range): found_inf gpu %d/%d cpu %d (want 0); folded vs the CPU's "
          "unscaled gradients: norm %.17g vs %.17g, %zu parameter/m/v values differ bitwise, %zu stored gradients changed (want 0)",
          fg, fb, fc, na, nb, differ, touched);
    FREE_ALL(ga, pa, ma, va, pb, mb, vb, p0, m0, v0);
    const size_t where[3] = {0, P / 2, P - 1};
    const float bads[3] = {NAN, INFINITY, -INFINITY};
    for (int w = 0; w < 3; w++)
        for (int b = 0; b < 3; b++) {
            float* h = h_copy(g, P);
            h[where[w]] = bads[b];
            cudaCheck(cudaMemcpy(gm->grads, h, P * 4, cudaMemcpyHostToDevice));
            memcpy(cm->grads, h, P * 4);
            fg = model_unscale_check(gm, s);
            fc = cpu::model_unscale_check(cm, s);
            check(fg == 1 && fc == 1, "    %-4g at gradient %-8zu: found_inf gpu %d cpu %d (want 1)", bads[b], where[w], fg, fc);
            free(h);
        }
    free(g);
    cpu::model_free(cm);
    model_free(gm);
    matmul_init();   /* model_free released cuBLASLt; the kernel tests after this one use it */
}

/* ------------------------------------------------------------------ fault injection (fault.cuh) */
/* fault_apply_device against the CPU's fault_apply_host (llmc/sdc/fault.h) on the same bf16 values and the same
 * event (every element hit, 4 random bits of 16 each): the stored 16-bit patterns must be identical,
 * including the NaNs the flips create (their payloads are the bits the fault model says; a conversion
 * through fp32 -> bf16 rounding would make them the canonical NaN) */
/* Catches: a flip applied through an fp32 round trip (NaN payloads canonicalised), masks or selection that differ
 * from the CPU's fault model. */
static void test_fault_flip(void) {
    printf("fault injection (llmc/sdc/fault.cuh) vs fault_apply_host (llmc/sdc/fault.h): stored bits after 4-bit flips, NaN payloads included\n");
    size_t sizes[] = {4099, 65536};
    for (int ci = 0; ci < 2; ci++) {
        size_t n = sizes[ci];
        float* h = h_normal(n, 1.0, 0.0, 1);
        bf16* d = d_bf16(h, n);
        FaultCtx fg, fc;
        memset(&fg, 0, sizeof(fg));
        fg.width = 16;
        fg.ev.active = 1; fg.ev.nbits = 4; fg.ev.seed = 1234 + ci; fg.ev.field = FIELD_ALL; fg.ev.m = (long long)n;
        fc = fg;
        fault_apply_device(&fg, d, n, g_s);
        fault_apply_host(&fc, h, n);
        cudaCheck(cudaDeviceSynchronize());
        uint16_t* got = (uint16_t*)mallocCheck(n * 2);
        cudaCheck(cudaMemcpy(got, d, n * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0, nan = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            const uint16_t want = (uint16_t)(f32_bits(h[i]) >> 16);   /* the CPU keeps the flipped pattern exactly */
            nan += h[i] != h[i];
            if (got[i] != want) { if (!bad) first = i; bad++; }
        }
        check(bad == 0 && nan > 0 && fg.injected == 1 && fc.injected == 1,
              "    n %-6zu every element flipped: %zu stored patterns differ from the CPU's (first [%zu]: gpu %04x cpu %04x); %zu NaNs made",
              n, bad, first, bad ? got[first] : 0, bad ? (unsigned)(f32_bits(h[first]) >> 16) : 0, nan);
        free(h); free(got);
        dfree_all();
    }
}

/* mag[m,n] = |A| |B| with the layout of gemm_nn */
static float* gemm_mag(const float* A, long sam, long sak, size_t na, const float* B, size_t nb, int M, int K, int N) {
    float *aa = h_abs(A, na), *ab = h_abs(B, nb), *c = h_alloc((size_t)M * N);
    gemm_nn(c, aa, sam, sak, ab, M, K, N, 0);
    free(aa); free(ab);
    return c;
}

/* Catches: a transposed operand, a wrong leading dimension, beta/accumulation misused (gradients overwritten or
 * doubled), bf16 outputs rounded twice. */
static void test_matmul(void) {
    printf("linear layers (llmc/cuda/matmul.cuh, cuBLASLt) vs matmul_forward / matmul_backward; fp32 sums of K terms:\n"
           "  |err| <= 2^-12 sum|terms| (the worst case K 2^-24 of either order for K <= 4096) (+ 1 bf16 ulp for bf16 outputs)\n");
    struct { int N, I, O; } cases[] = {{74, 128, 384}, {64, 384, 128}, {64, 2048, 512}, {32, 64, 50257}};
    const double mt = ldexp(1.0, -12);
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int N = cases[ci].N, I = cases[ci].I, O = cases[ci].O;
        printf("  N %d I %d O %d\n", N, I, O);
        float* x = h_normal((size_t)N * I, 1.0, 0.0, 1);
        float* W = h_normal((size_t)O * I, 0.05, 0.0, 1);
        float* dy = h_normal((size_t)N * O, 1.0, 0.0, 1);
        float* wT = h_alloc((size_t)I * O);
        transpose(wT, W, O, I);
        bf16 *dx = d_bf16(x, (size_t)N * I), *dW = d_bf16(W, (size_t)O * I), *ddy = d_bf16(dy, (size_t)N * O);
        /* forward */
        bf16* dyo = d_bf16_poison((size_t)N * O);
        linear_forward(dyo, dx, dW, N, I, O, g_s);
        Written w;
        float* y = dl_bf16(dyo, (size_t)N * O, &w);
        float* ry = h_alloc((size_t)N * O);
        matmul_forward(ry, x, wT, N, I, O);
        float* my = gemm_mag(x, I, 1, (size_t)N * I, wT, (size_t)I * O, N, I, O);
        compare("linear_forward y = x W^T (bf16)", y, ry, (size_t)N * O, tol_bf16_mag(my, mt), &w);
        /* dx, = and += */
        float* dx_old = h_normal((size_t)N * I, 0.5, 0.0, 0);
        float* mdx = gemm_mag(dy, O, 1, (size_t)N * O, W, (size_t)O * I, N, O, I);
        for (int acc = 0; acc < 2; acc++) {
            float* gdx = acc ? d_f32(dx_old, (size_t)N * I) : d_f32_poison((size_t)N * I);
            linear_backward_dx(gdx, ddy, dW, N, I, O, acc, g_s);
            float* hx = dl_f32(gdx, (size_t)N * I, &w);
            float* rdx = acc ? h_copy(dx_old, (size_t)N * I) : h_alloc((size_t)N * I);
            gemm_nn(rdx, dy, O, 1, W, N, O, I, acc);
            float* m2 = h_copy(mdx, (size_t)N * I);
            if (acc) for (size_t i = 0; i < (size_t)N * I; i++) m2[i] += fabsf(dx_old[i]);
            compare(acc ? "linear_backward_dx += dy W (fp32)" : "linear_backward_dx = dy W (fp32)", hx, rdx, (size_t)N * I,
                    tol_f32(m2, mt, 0, 0), &w);
            FREE_ALL(hx, rdx, m2);
        }
        /* dW += dy^T x */
        float* dW0 = h_normal((size_t)O * I, 0.01, 0.0, 0);
        float* gdW = d_f32(dW0, (size_t)O * I);
        linear_backward_dw(gdW, ddy, dx, N, I, O, g_s);
        float* hW = dl_f32(gdW, (size_t)O * I, &w);
        float* rdW = h_copy(dW0, (size_t)O * I);
        gemm_nn(rdW, dy, 1, O, x, O, N, I, 1);
        float* mW = gemm_mag(dy, 1, O, (size_t)N * O, x, (size_t)N * I, O, N, I);
        for (size_t i = 0; i < (size_t)O * I; i++) mW[i] += fabsf(dW0[i]);
        compare("linear_backward_dw += dy^T x (fp32)", hW, rdW, (size_t)O * I, tol_f32(mW, mt, 0, 0), &w);
        FREE_ALL(x, W, dy, wT, y, ry, my, dx_old, mdx, dW0, hW, rdW, mW);
        dfree_all();
    }
    /* matmul_bf16 itself: batched, strided (padding between problems), every transpose combination */
    printf("  matmul_bf16 batched: m 40 n 24 k 56, batch 3, strides padded by 8\n");
    const int m = 40, n = 24, k = 56, batch = 3;
    const long sA = (long)m * k + 8, sB = (long)k * n + 8, sC = (long)m * n + 8;
    for (int combo = 0; combo < 5; combo++) {
        int tA = combo & 1, tB = (combo >> 1) & 1, cf = combo < 4;
        float alpha = cf ? 0.5f : 1.0f, beta = cf ? 1.0f : 0.0f;
        float* A = h_normal((size_t)sA * batch, 1.0, 0.0, 1);
        float* Bm = h_normal((size_t)sB * batch, 1.0, 0.0, 1);
        float* C0 = h_normal((size_t)sC * batch, 1.0, 0.0, 0);
        bf16 *dA = d_bf16(A, (size_t)sA * batch), *dB = d_bf16(Bm, (size_t)sB * batch);
        void* dC = cf ? (void*)d_f32(C0, (size_t)sC * batch) : (void*)d_bf16_poison((size_t)sC * batch);
        matmul_bf16(dC, cf, dA, dB, m, n, k, tA, tB, alpha, beta, batch, sA, sB, sC, g_s);
        Written w;
        float* got = cf ? dl_f32((float*)dC, (size_t)sC * batch, &w) : dl_bf16((bf16*)dC, (size_t)sC * batch, &w);
        float* ref = h_copy(C0, (size_t)sC * batch);
        float* mag = h_alloc((size_t)sC * batch);
        float* Bkn = h_alloc((size_t)k * n);
        float* ab = h_alloc((size_t)m * n);
        size_t pad_written = 0;
        for (int bt = 0; bt < batch; bt++) {
            const float* Ab = A + bt * sA;
            if (tB) transpose(Bkn, Bm + bt * sB, n, k); else memcpy(Bkn, Bm + bt * sB, sizeof(float) * k * n);
            long sam = tA ? 1 : k, sak = tA ? m : 1;
            gemm_nn(ab, Ab, sam, sak, Bkn, m, k, n, 0);
            float* mab = gemm_mag(Ab, sam, sak, (size_t)m * k, Bkn, (size_t)k * n, m, k, n);
            for (int i = 0; i < m * n; i++) {
                ref[bt * sC + i] = alpha * ab[i] + beta * C0[bt * sC + i];
                mag[bt * sC + i] = fabsf(alpha) * mab[i] + fabsf(beta * C0[bt * sC + i]);
            }
            for (long i = m * n; i < sC; i++) { /* padding between problems: untouched */
                mag[bt * sC + i] = 0;
                if (cf ? f32_bits(got[bt * sC + i]) != f32_bits(C0[bt * sC + i]) : f32_bits(got[bt * sC + i]) != 0xFFFF0000u) pad_written++;
                got[bt * sC + i] = ref[bt * sC + i] = 0;
            }
            free(mab);
        }
        if (!cf) w.unwritten -= (size_t)(sC - m * n) * batch; /* the padding keeps its poison */
        char name[96];
        snprintf(name, sizeof(name), "transA %d transB %d C %s alpha %g beta %g", tA, tB, cf ? "fp32" : "bf16", alpha, beta);
        Tol t = cf ? tol_f32(mag, mt, 0, 0) : tol_bf16_mag(mag, mt);
        compare(name, got, ref, (size_t)sC * batch, t, &w);
        check(pad_written == 0, "    %-46s", "  padding between the batched problems untouched");
        FREE_ALL(A, Bm, C0, got, ref, mag, Bkn, ab);
        dfree_all();
    }
}
