/* fused.cuh: the fused Q/K/V and gate/up projections (train_sdc.cu): (i) every kernel that reads or writes a
 * view of a fused buffer (row stride ld > its columns) against its own contiguous call, bitwise, with the
 * columns outside a written view checked untouched; (j) fault injection at the fused sites lands on the same
 * logical element, with the same bits, as the CPU trainer's -precision bf16. */

/* ----------------------------------------------------------------- raw bf16 buffers and views */
static bf16* d_raw16(const uint16_t* h, size_t n) {
    bf16* d = d_bf16_poison(n);
    cudaCheck(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    return d;
}
static uint16_t* dl_raw16(const bf16* d, size_t n) {
    cudaCheck(cudaDeviceSynchronize());
    uint16_t* h = (uint16_t*)mallocCheck(n * 2);
    cudaCheck(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
    return h;
}
/* seeded bf16 bits, N(0, scale) */
static uint16_t* h_bits(size_t n, double scale) {
    uint16_t* h = (uint16_t*)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16_bits((float)(scale * rng_normal(&g_rng)));
    return h;
}
/* the [rows, cols] view at column c0 of a [rows, ld] buffer, gathered contiguous */
static uint16_t* gather_view(const uint16_t* full, size_t rows, size_t ld, size_t c0, size_t cols) {
    uint16_t* v = (uint16_t*)mallocCheck(rows * cols * 2 + 2);
    for (size_t r = 0; r < rows; r++) memcpy(v + r * cols, full + r * ld + c0, cols * 2);
    return v;
}
/* columns [c0, c0 + cols) of x's rows put into a [rows, ld] buffer filled with `fill` elsewhere */
static uint16_t* scatter_view(const uint16_t* x, size_t rows, size_t ld, size_t c0, size_t cols, uint16_t fill) {
    uint16_t* f = (uint16_t*)mallocCheck(rows * ld * 2);
    for (size_t i = 0; i < rows * ld; i++) f[i] = fill;
    for (size_t r = 0; r < rows; r++) memcpy(f + r * ld + c0, x + r * cols, cols * 2);
    return f;
}
/* device view (c0, cols of a [rows, ld] device buffer) vs a contiguous device result, bitwise; with `outside`,
 * the elements of the buffer outside the view must still hold their bits there (nothing written past the view) */
static int check_view(const char* name, const bf16* dfull, size_t rows, size_t ld, size_t c0, size_t cols, const bf16* dref,
                      const uint16_t* outside) {
    uint16_t *full = dl_raw16(dfull, rows * ld), *ref = dl_raw16(dref, rows * cols);
    uint16_t* v = gather_view(full, rows, ld, c0, cols);
    size_t bad = 0, first = 0, touched = 0;
    for (size_t i = 0; i < rows * cols; i++)
        if (v[i] != ref[i]) { if (!bad) first = i; bad++; }
    if (outside)
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < ld; c++)
                if ((c < c0 || c >= c0 + cols) && full[r * ld + c] != outside[r * ld + c]) touched++;
    int ok = bad == 0 && touched == 0;
    check(ok, "    %-58s [%zu, %zu] ld %zu at col %zu: bitwise the contiguous call's%s", name, rows, cols, ld, c0,
          outside ? ", nothing outside the view written" : "");
    if (!ok) printf("      %zu elements differ (first [%zu]: %04x vs %04x), %zu outside the view written\n", bad, first, bad ? v[first] : 0,
                    bad ? ref[first] : 0, touched);
    FREE_ALL(full, ref, v);
    return ok;
}
static int check_same16(const char* name, const bf16* a, const bf16* b, size_t n) {
    uint16_t *x = dl_raw16(a, n), *y = dl_raw16(b, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += x[i] != y[i];
    check(bad == 0, "    %-58s n %zu: bitwise the contiguous call's%s", name, n, bad ? " (NO)" : "");
    FREE_ALL(x, y);
    return bad == 0;
}
static int check_same32(const char* name, const float* a, const float* b, size_t n) {
    float *x = dl_f32(a, n, NULL), *y = dl_f32(b, n, NULL);
    size_t bad = bits_differ(x, y, n);
    check(bad == 0, "    %-58s n %zu: bitwise the contiguous call's%s", name, n, bad ? " (NO)" : "");
    FREE_ALL(x, y);
    return bad == 0;
}

/* ---------------------------------------------------------------- (i) strided views, kernel by kernel */
/* Catches: a kernel that ignores a view's row stride or column offset (q, k, v of the fused [N, qd + 2 kd] buffer;
 * gate, up of [N, 2F]; their gradients), reads the wrong columns, or writes outside its view. */
static void test_strided(void) {
    printf("strided views of the fused projection buffers vs the same kernels on contiguous copies (bitwise)\n");
    const int B = 2, T = 37, N = B * T, H = 4, KV = 2, hd = 32, qd = H * hd, kd = KV * hd, ld = qd + 2 * kd;
    const uint16_t POISON = 0xFFFF;
    /* the fused buffer and contiguous copies of its three views */
    uint16_t* hqkv = h_bits((size_t)N * ld, 1.0);
    uint16_t *hq = gather_view(hqkv, N, ld, 0, qd), *hk = gather_view(hqkv, N, ld, qd, kd), *hv = gather_view(hqkv, N, ld, qd + kd, kd);
    bf16 *qkv = d_raw16(hqkv, (size_t)N * ld), *q = d_raw16(hq, (size_t)N * qd), *k = d_raw16(hk, (size_t)N * kd),
         *v = d_raw16(hv, (size_t)N * kd);
    uint16_t* hpoison = scatter_view(hq, N, ld, 0, 0, POISON);   /* all poison */
    const Config* c = preset_find("tiny-llama");
    const int half = hd / 2;
    float *cs = h_alloc((size_t)T * half), *sn = h_alloc((size_t)T * half);
    Config cc = *c;
    cc.head_dim = hd;
    rope_tables(&cc, T, cs, sn);
    float *dcs = d_f32(cs, (size_t)T * half), *dsn = d_f32(sn, (size_t)T * half);
    printf("  q, k, v views of [N %d, %d] (H %d, KV %d, hd %d); gradients written into a poisoned [N, %d]\n", N, ld, H, KV, hd, ld);
    {   /* RoPE: strided in, contiguous out; its fingerprint; the backward into the views */
        bf16 *o1 = d_bf16_poison((size_t)N * qd), *o2 = d_bf16_poison((size_t)N * qd);
        rope_forward(o1, qkv, ld, dcs, dsn, B, T, H, hd, c->rope_style, g_s);
        rope_forward(o2, q, qd, dcs, dsn, B, T, H, hd, c->rope_style, g_s);
        check_same16("rope_forward, q view", o1, o2, (size_t)N * qd);
        bf16 *k1 = d_bf16_poison((size_t)N * kd), *k2 = d_bf16_poison((size_t)N * kd);
        rope_forward(k1, qkv + qd, ld, dcs, dsn, B, T, KV, hd, c->rope_style, g_s);
        rope_forward(k2, k, kd, dcs, dsn, B, T, KV, hd, c->rope_style, g_s);
        check_same16("rope_forward, k view", k1, k2, (size_t)N * kd);
        /* the fingerprints of the strided and the contiguous calls agree, and equal the one of the stored output (what
         * rope_forward wrote); against the other tensor (K's against Q's) they do not */
        unsigned long long* acc = (unsigned long long*)d_f32_poison(4 * FP_WORDS * 2);
        cudaCheck(cudaMemset(acc, 0, 4 * FP_WORDS * sizeof(unsigned long long)));
        unsigned long long *p0 = acc, *p1 = acc + FP_WORDS, *p2 = acc + 2 * FP_WORDS, *p3 = acc + 3 * FP_WORDS;
        rope_forward_fp(NULL, qkv, ld, dcs, dsn, B, T, H, hd, c->rope_style, p0, g_s);
        rope_forward_fp(NULL, qkv + qd, ld, dcs, dsn, B, T, KV, hd, c->rope_style, p1, g_s);
        rope_forward_fp(NULL, q, qd, dcs, dsn, B, T, H, hd, c->rope_style, p2, g_s);
        rope_forward_fp(NULL, k, kd, dcs, dsn, B, T, KV, hd, c->rope_style, p3, g_s);
        const Fingerprint f0 = fingerprint_read(p0, g_s), f1 = fingerprint_read(p1, g_s), f2 = fingerprint_read(p2, g_s);
        const Fingerprint f3 = fingerprint_read(p3, g_s), s2 = qk_fingerprint_dev(o1, (size_t)N * qd, g_s);
        const Fingerprint s3 = qk_fingerprint_dev(k1, (size_t)N * kd, g_s);
        const int agree = fp_equal(f0, f2) && fp_equal(f1, f3) && fp_equal(f0, s2) && fp_equal(f1, s3);
        check(agree && !fp_equal(f1, f2), "    %-58s agree %s (want yes), Q's against K's equal %s (want no)",
              "rope_forward_fp: strided, contiguous and stored Q/K fingerprints", agree ? "yes" : "NO", fp_equal(f1, f2) ? "YES" : "no");
        uint16_t* hg = h_bits((size_t)N * qd, 1.0);
        bf16 *g = d_raw16(hg, (size_t)N * qd), *dv1 = d_raw16(hpoison, (size_t)N * ld), *dv2 = d_bf16_poison((size_t)N * qd);
        rope_backward(dv1, ld, g, dcs, dsn, B, T, H, hd, c->rope_style, g_s);
        rope_backward(dv2, qd, g, dcs, dsn, B, T, H, hd, c->rope_style, g_s);
        check_view("rope_backward into the q view", dv1, N, ld, 0, qd, dv2, hpoison);
        {   /* rope_backward_fp (-protect qk_bwd): writes what rope_backward writes, and its fingerprint (also of the NULL,
             * fingerprint-only call) is the stored view's */
            bf16* dv3 = d_raw16(hpoison, (size_t)N * ld);
            cudaCheck(cudaMemset(acc, 0, 2 * FP_WORDS * sizeof(unsigned long long)));
            rope_backward_fp(dv3, ld, g, dcs, dsn, B, T, H, hd, c->rope_style, p0, g_s);
            rope_backward_fp(NULL, qd, g, dcs, dsn, B, T, H, hd, c->rope_style, p1, g_s);
            check_view("rope_backward_fp into the q view", dv3, N, ld, 0, qd, dv2, hpoison);
            unsigned long long* pr = acc + 2 * FP_WORDS;
            cudaCheck(cudaMemset(pr, 0, FP_WORDS * sizeof(unsigned long long)));
            qk_fingerprint_rows_acc(pr, dv3, N, qd, ld, g_s);
            const Fingerprint a = fingerprint_read(p0, g_s), b = fingerprint_read(p1, g_s), r = fingerprint_read(pr, g_s);
            check(fp_equal(a, r) && fp_equal(b, r), "    %-58s %s", "rope_backward_fp: its fingerprint (with and without dx) = the view's",
                  fp_equal(a, r) && fp_equal(b, r) ? "yes" : "NO");
        }
        bf16 *dk1 = d_raw16(hpoison, (size_t)N * ld), *dk2 = d_bf16_poison((size_t)N * kd);
        rope_backward(dk1 + qd, ld, g, dcs, dsn, B, T, KV, hd, c->rope_style, g_s);
        rope_backward(dk2, kd, g, dcs, dsn, B, T, KV, hd, c->rope_style, g_s);
        check_view("rope_backward into the k view", dk1, N, ld, qd, kd, dk2, hpoison);
        {   /* rope_qk: q and k in one launch, forward (with and without fingerprints) and backward, the bits of two */
            bf16 *oq = d_bf16_poison((size_t)N * qd), *ok = d_bf16_poison((size_t)N * kd);
            unsigned long long* a2 = (unsigned long long*)d_f32_poison(2 * FP_WORDS * 2);
            cudaCheck(cudaMemset(a2, 0, 2 * FP_WORDS * sizeof(unsigned long long)));
            rope_qk(oq, ok, qkv, qkv + qd, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, false, NULL, NULL, g_s);
            check_same16("rope_qk forward: q", oq, o2, (size_t)N * qd);
            check_same16("rope_qk forward: k", ok, k2, (size_t)N * kd);
            rope_qk(NULL, NULL, qkv, qkv + qd, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, false, a2, a2 + FP_WORDS, g_s);
            const Fingerprint gq = fingerprint_read(a2, g_s), gk = fingerprint_read(a2 + FP_WORDS, g_s);
            check(fp_equal(gq, f2) && fp_equal(gk, f3), "    %-58s %s", "rope_qk fingerprints (q, k) = the single launches'",
                  fp_equal(gq, f2) && fp_equal(gk, f3) ? "yes" : "NO");
            {   /* a second pair riding on the launch (-protect qk's recomputation, fingerprint-only): the first pair's outputs and
                 * fingerprints as without it, the second's as its own launch's; the second pair a copy of the views with one q
                 * element's sign flipped: its q fingerprint alone differs */
                uint16_t* h2 = (uint16_t*)malloc((size_t)N * ld * 2);
                memcpy(h2, hqkv, (size_t)N * ld * 2);
                h2[(size_t)(N - 1) * ld + 3] ^= 0x8000u;
                bf16 *qkv2 = d_raw16(h2, (size_t)N * ld), *oq2 = d_bf16_poison((size_t)N * qd), *ok2 = d_bf16_poison((size_t)N * kd);
                unsigned long long* a4 = (unsigned long long*)d_f32_poison(6 * FP_WORDS * 2);
                cudaCheck(cudaMemset(a4, 0, 6 * FP_WORDS * sizeof(unsigned long long)));
                const QkFpPair rr = {qkv2, qkv2 + qd, ld, a4 + 2 * FP_WORDS, a4 + 3 * FP_WORDS};
                rope_qk(oq2, ok2, qkv, qkv + qd, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, false, a4, a4 + FP_WORDS, g_s, MMB_TAIL_NONE, &rr);
                rope_qk(NULL, NULL, qkv2, qkv2 + qd, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, false, a4 + 4 * FP_WORDS, a4 + 5 * FP_WORDS, g_s);
                check_same16("rope_qk with a second pair riding: q", oq2, o2, (size_t)N * qd);
                check_same16("rope_qk with a second pair riding: k", ok2, k2, (size_t)N * kd);
                Fingerprint fr[6];
                for (int i = 0; i < 6; i++) fr[i] = fingerprint_read(a4 + i * FP_WORDS, g_s);
                const int rok = fp_equal(fr[0], f2) && fp_equal(fr[1], f3) && fp_equal(fr[2], fr[4]) && fp_equal(fr[3], fr[5]) && !fp_equal(fr[2], f2) &&
                                fp_equal(fr[3], f3);
                check(rok, "    %-58s %s", "rope_qk + riding pair: 4 fingerprints = the launches' own", rok ? "yes" : "NO");
                free(h2);
            }
            bf16* dqk = d_raw16(hpoison, (size_t)N * ld);
            rope_qk(dqk, dqk + qd, g, g, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, true, NULL, NULL, g_s);
            check_view("rope_qk backward: dq into the q view", dqk, N, ld, 0, qd, dv2, NULL);
            check_view("rope_qk backward: dk into the k view", dqk, N, ld, qd, kd, dk2, NULL);
            {   /* the 64-bit index instances (which only tensors of over 4 G pairs take): the 32-bit ones' outputs and
                 * fingerprints, forward and backward */
                g_rope_index64 = 1;
                bf16 *wq = d_bf16_poison((size_t)N * qd), *wk = d_bf16_poison((size_t)N * kd), *wd = d_raw16(hpoison, (size_t)N * ld);
                rope_qk(wq, wk, qkv, qkv + qd, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, false, NULL, NULL, g_s);
                check_same16("rope_qk forward, 64-bit indices: q", wq, o2, (size_t)N * qd);
                check_same16("rope_qk forward, 64-bit indices: k", wk, k2, (size_t)N * kd);
                cudaCheck(cudaMemset(a2, 0, 2 * FP_WORDS * sizeof(unsigned long long)));
                rope_qk(NULL, NULL, qkv, qkv + qd, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, false, a2, a2 + FP_WORDS, g_s);
                const Fingerprint wq2 = fingerprint_read(a2, g_s), wk2 = fingerprint_read(a2 + FP_WORDS, g_s);
                check(fp_equal(wq2, f2) && fp_equal(wk2, f3), "    %-58s %s", "rope_qk fingerprints, 64-bit indices = the 32-bit ones",
                      fp_equal(wq2, f2) && fp_equal(wk2, f3) ? "yes" : "NO");
                rope_qk(wd, wd + qd, g, g, ld, ld, dcs, dsn, B, T, H, KV, hd, c->rope_style, true, NULL, NULL, g_s);
                check_view("rope_qk backward, 64-bit indices: dq", wd, N, ld, 0, qd, dv2, NULL);
                check_view("rope_qk backward, 64-bit indices: dk", wd, N, ld, qd, kd, dk2, NULL);
                g_rope_index64 = 0;
            }
        }
        free(hg);
    }
    {   /* the QK norm on the views: forward (strided in), backward (dx into the view, x strided, dw) */
        uint16_t* hw = h_bits(hd, 0.5);
        bf16* w = d_raw16(hw, hd);
        bf16 *o1 = d_bf16_poison((size_t)N * qd), *o2 = d_bf16_poison((size_t)N * qd);
        float *m1 = d_f32_poison((size_t)N * H), *m2 = d_f32_poison((size_t)N * H);
        rmsnorm_forward_ld(o1, m1, qkv, ld, w, N, H, hd, 1e-6f, g_s);
        rmsnorm_forward(o2, m2, q, w, N * H, hd, 1e-6f, g_s);
        check_same16("rmsnorm_forward_ld (QK norm), q view: out", o1, o2, (size_t)N * qd);
        check_same32("rmsnorm_forward_ld (QK norm), q view: ms", m1, m2, (size_t)N * H);
        uint16_t* hg = h_bits((size_t)N * kd, 1.0);
        bf16 *g = d_raw16(hg, (size_t)N * kd), *d1 = d_raw16(hpoison, (size_t)N * ld), *d2 = d_bf16_poison((size_t)N * kd);
        float *mk = d_f32_poison((size_t)N * KV), *w1 = d_f32_poison(hd), *w2 = d_f32_poison(hd);
        rmsnorm_forward(o2, mk, k, w, N * KV, hd, 1e-6f, g_s);
        rmsnorm_backward_ld(d1 + qd, w1, g, qkv + qd, ld, w, mk, N, KV, hd, 1e-6f, 0, 0, g_s);
        rmsnorm_backward_acc(d2, w2, g, k, w, mk, N * KV, hd, 1e-6f, 0, 0, g_s);
        check_view("rmsnorm_backward_ld (QK norm) into the k view: dx", d1, N, ld, qd, kd, d2, hpoison);
        check_same32("rmsnorm_backward_ld (QK norm), k view: dw", w1, w2, hd);
        {   /* with a fingerprint (-protect qk_bwd): the same dx, and the fingerprint (also of the NULL, fingerprint-only
             * call) is the stored view's */
            bf16* d3 = d_raw16(hpoison, (size_t)N * ld);
            unsigned long long* acc = (unsigned long long*)d_f32_poison(3 * FP_WORDS * 2);
            cudaCheck(cudaMemset(acc, 0, 3 * FP_WORDS * sizeof(unsigned long long)));
            rmsnorm_backward_ld(d3 + qd, NULL, g, qkv + qd, ld, w, mk, N, KV, hd, 1e-6f, 0, 0, g_s, acc);
            rmsnorm_backward_ld(NULL, NULL, g, qkv + qd, ld, w, mk, N, KV, hd, 1e-6f, 0, 0, g_s, acc + FP_WORDS);
            check_view("rmsnorm_backward_ld with its fingerprint: dx", d3, N, ld, qd, kd, d2, hpoison);
            qk_fingerprint_rows_acc(acc + 2 * FP_WORDS, d3 + qd, N, kd, ld, g_s);
            const Fingerprint a = fingerprint_read(acc, g_s), b = fingerprint_read(acc + FP_WORDS, g_s);
            const Fingerprint r = fingerprint_read(acc + 2 * FP_WORDS, g_s);
            check(fp_equal(a, r) && fp_equal(b, r), "    %-58s %s", "rmsnorm_backward_ld: its fingerprint (with and without dx) = the view's",
                  fp_equal(a, r) && fp_equal(b, r) ? "yes" : "NO");
        }
        free(hw); free(hg);
    }
    {   /* head_dim 36 (not a multiple of 8: the scalar path), 3 heads, row stride 128 */
        const int n2 = 10, nh = 3, C = 36, ld2 = 128;
        uint16_t *hx = h_bits((size_t)n2 * ld2, 1.0), *hw = h_bits(C, 0.5);
        uint16_t* hxc = gather_view(hx, n2, ld2, 20, nh * C);
        bf16 *x = d_raw16(hx, (size_t)n2 * ld2), *xc = d_raw16(hxc, (size_t)n2 * nh * C), *w = d_raw16(hw, C);
        bf16 *o1 = d_bf16_poison((size_t)n2 * nh * C), *o2 = d_bf16_poison((size_t)n2 * nh * C);
        float *m1 = d_f32_poison((size_t)n2 * nh), *m2 = d_f32_poison((size_t)n2 * nh);
        rmsnorm_forward_ld(o1, m1, x + 20, ld2, w, n2, nh, C, 1e-5f, g_s);
        rmsnorm_forward(o2, m2, xc, w, n2 * nh, C, 1e-5f, g_s);
        check_same16("rmsnorm_forward_ld, C 36 at column 20 of ld 128 (scalar)", o1, o2, (size_t)n2 * nh * C);
        FREE_ALL(hx, hw, hxc);
    }
    {   /* the materialised attention with v (and dv) the views */
        bf16 *out1 = d_bf16_poison((size_t)N * qd), *out2 = d_bf16_poison((size_t)N * qd);
        const size_t na = (size_t)B * H * T * T;
        bf16 *lg1 = d_bf16_poison(na), *lg2 = d_bf16_poison(na), *pr1 = d_bf16_poison(na), *pr2 = d_bf16_poison(na);
        attention_forward(out1, lg1, pr1, q, k, qkv + qd + kd, B, T, H, KV, hd, ld, g_s);
        attention_forward(out2, lg2, pr2, q, k, v, B, T, H, KV, hd, kd, g_s);
        check_same16("attention_forward, v view: out", out1, out2, (size_t)N * qd);
        check_same16("attention_forward, v view: probs", pr1, pr2, na);
        attention_av(out1, pr1, qkv + qd + kd, B, T, H, KV, hd, ld, g_s);
        attention_av(out2, pr2, v, B, T, H, KV, hd, kd, g_s);
        check_same16("attention_av, v view", out1, out2, (size_t)N * qd);
        uint16_t* hdo = h_bits((size_t)N * qd, 1.0);
        bf16* dout = d_raw16(hdo, (size_t)N * qd);
        bf16 *dq1 = d_bf16_poison((size_t)N * qd), *dq2 = d_bf16_poison((size_t)N * qd), *dk1 = d_bf16_poison((size_t)N * kd),
             *dk2 = d_bf16_poison((size_t)N * kd), *dv1 = d_raw16(hpoison, (size_t)N * ld), *dv2 = d_bf16_poison((size_t)N * kd);
        attention_backward(dq1, dk1, dv1 + qd + kd, dout, pr1, q, k, qkv + qd + kd, B, T, H, KV, hd, ld, g_s);
        attention_backward(dq2, dk2, dv2, dout, pr2, q, k, v, B, T, H, KV, hd, kd, g_s);
        check_same16("attention_backward, v view: dq", dq1, dq2, (size_t)N * qd);
        check_same16("attention_backward, v view: dk", dk1, dk2, (size_t)N * kd);
        check_view("attention_backward: dv into the v view", dv1, N, ld, qd + kd, kd, dv2, hpoison);
        bf16 *dp1 = d_bf16_poison(na), *dp2 = d_bf16_poison(na), *dw1 = d_raw16(hpoison, (size_t)N * ld);
        attention_split_av_backward(dp1, dw1 + qd + kd, dout, pr1, qkv + qd + kd, B, T, H, KV, hd, ld, g_s);
        attention_split_av_backward(dp2, dv2, dout, pr2, v, B, T, H, KV, hd, kd, g_s);
        check_same16("attention_split_av_backward, v view: dprobs", dp1, dp2, na);
        check_view("attention_split_av_backward: dv into the v view", dw1, N, ld, qd + kd, kd, dv2, hpoison);
        /* the attention checks read v through the view: clean 0 failures, as with the contiguous v */
        int* cnt = (int*)d_f32_poison(2 * (ATTC_NCHECK + ATTC_NCHECK * B * H));
        cudaCheck(cudaMemset(cnt, 0, sizeof(int) * 2 * (ATTC_NCHECK + ATTC_NCHECK * B * H)));
        double* scr = (double*)cuda_workspace_f32(2, 2 * attcheck_scratch_doubles(B, H, T));
        attcheck_forward(cnt, cnt + 2 * ATTC_NCHECK, scr, lg1, pr1, out1, q, k, qkv + qd + kd, B, T, H, KV, hd, ld, 1, 1, g_s);
        cudaCheck(cudaStreamSynchronize(g_s));
        attcheck_forward(cnt + ATTC_NCHECK, cnt + 2 * ATTC_NCHECK + ATTC_NCHECK * B * H, scr, lg2, pr2, out2, q, k, v, B, T, H, KV, hd, kd,
                         1, 1, g_s);
        int hc[2 * ATTC_NCHECK];
        cudaCheck(cudaMemcpy(hc, cnt, sizeof(hc), cudaMemcpyDeviceToHost));
        int sum1 = 0, sum2 = 0;
        for (int i = 0; i < ATTC_NCHECK; i++) { sum1 += hc[i]; sum2 += hc[ATTC_NCHECK + i]; }
        check(sum1 == 0 && sum2 == 0, "    %-58s failed heads %d, contiguous %d (want 0 0)", "attcheck_forward, v view (clean)", sum1, sum2);
        free(hdo);
    }
    {   /* the fused attention with v, dv the views */
        bf16 *o1 = d_bf16_poison((size_t)N * qd), *o2 = d_bf16_poison((size_t)N * qd);
        float *l1 = d_f32_poison((size_t)B * H * T), *l2 = d_f32_poison((size_t)B * H * T);
        flash_attention_forward(o1, l1, q, k, qkv + qd + kd, B, T, H, KV, hd, ld, g_s);
        flash_attention_forward(o2, l2, q, k, v, B, T, H, KV, hd, kd, g_s);
        check_same16("flash_attention_forward, v view: out", o1, o2, (size_t)N * qd);
        check_same32("flash_attention_forward, v view: lse", l1, l2, (size_t)B * H * T);
        uint16_t* hdo = h_bits((size_t)N * qd, 1.0);
        bf16* dout = d_raw16(hdo, (size_t)N * qd);
        bf16 *dq1 = d_bf16_poison((size_t)N * qd), *dq2 = d_bf16_poison((size_t)N * qd), *dk1 = d_bf16_poison((size_t)N * kd),
             *dk2 = d_bf16_poison((size_t)N * kd), *dv1 = d_raw16(hpoison, (size_t)N * ld), *dv2 = d_bf16_poison((size_t)N * kd);
        flash_attention_backward(dq1, dk1, dv1 + qd + kd, dout, o1, l1, q, k, qkv + qd + kd, B, T, H, KV, hd, ld, g_s);
        flash_attention_backward(dq2, dk2, dv2, dout, o2, l2, q, k, v, B, T, H, KV, hd, kd, g_s);
        check_same16("flash_attention_backward, v view: dq", dq1, dq2, (size_t)N * qd);
        check_same16("flash_attention_backward, v view: dk", dk1, dk2, (size_t)N * kd);
        check_view("flash_attention_backward: dv into the v view", dv1, N, ld, qd + kd, kd, dv2, hpoison);
        free(hdo);
    }
    {   /* fault injection and its sums on a view: the logical element i at row i / cols, column i % cols */
        FaultCtx f1, f2;
        memset(&f1, 0, sizeof(f1));
        f1.width = 16;
        f1.ev.active = 1; f1.ev.step = 1; f1.ev.nbits = 3; f1.ev.seed = 7; f1.ev.field = FIELD_ALL; f1.ev.m = 40;
        f2 = f1;
        uint16_t* hcopy = (uint16_t*)mallocCheck((size_t)N * ld * 2);
        memcpy(hcopy, hqkv, (size_t)N * ld * 2);
        bf16 *x1 = d_raw16(hcopy, (size_t)N * ld), *x2 = d_raw16(hk, (size_t)N * kd);
        double a1, b1, a2, b2;
        fault_sumsq_ld(x1 + qd, NULL, N, kd, ld, &a1, &b1, g_s);
        fault_sumsq(x2, NULL, (size_t)N * kd, &a2, &b2, g_s);
        check(a1 == a2, "    %-58s %.17g vs %.17g", "fault_sumsq_ld of the k view: bitwise the contiguous sum", a1, a2);
        fault_apply_device_ld(&f1, x1 + qd, N, kd, ld, g_s);
        fault_apply_device(&f2, x2, (size_t)N * kd, g_s);
        uint16_t* changed = dl_raw16(x2, (size_t)N * kd);
        size_t nch = 0;
        for (size_t i = 0; i < (size_t)N * kd; i++) nch += changed[i] != hk[i];
        check(f1.injected == 1 && nch == 40, "    %-58s %zu elements changed (want 40)", "fault_apply_device (contiguous k)", nch);
        check_view("fault_apply_device_ld on the k view", x1, N, ld, qd, kd, x2, hqkv);
        free(changed); free(hcopy);
    }
    /* the MLP's element-wise kernels on the gate/up views of [rows, 2F]: F 48 (16-byte packs), F 37 (scalar) */
    const int Fs[2] = {48, 37};
    for (int fi = 0; fi < 2; fi++) {
        const int R = 37, F = Fs[fi], L2 = 2 * F;
        const size_t n = (size_t)R * F;
        printf("  gate, up views of [%d, %d] (%s); d(gate), d(up) written into a poisoned [%d, %d]\n", R, L2,
               fi ? "scalar path" : "16-byte packs", R, L2);
        uint16_t* hgu = h_bits((size_t)R * L2, 1.5);
        uint16_t *hg = gather_view(hgu, R, L2, 0, F), *hu = gather_view(hgu, R, L2, F, F), *hd_ = h_bits(n, 1.0);
        uint16_t* hp2 = scatter_view(hg, R, L2, 0, 0, POISON);
        bf16 *gu = d_raw16(hgu, (size_t)R * L2), *gc = d_raw16(hg, n), *uc = d_raw16(hu, n), *dy = d_raw16(hd_, n);
        bf16 *a1 = d_bf16_poison(n), *a2 = d_bf16_poison(n), *p1 = d_bf16_poison(n), *p2 = d_bf16_poison(n);
        silu_forward(a1, gu, R, F, L2, g_s);
        silu_forward(a2, gc, R, F, F, g_s);
        check_same16("silu_forward, gate view", a1, a2, n);
        mul_forward(p1, a1, gu + F, R, F, L2, g_s);
        mul_forward(p2, a2, uc, R, F, F, g_s);
        check_same16("mul_forward, up view", p1, p2, n);
        swiglu_forward(a1, p1, gu, gu + F, R, F, L2, g_s);
        swiglu_forward(a2, p2, gc, uc, R, F, F, g_s);
        check_same16("swiglu_forward, gate/up views: act", a1, a2, n);
        check_same16("swiglu_forward, gate/up views: prod", p1, p2, n);
        bf16 *r1 = d_bf16_poison(n), *r2 = d_bf16_poison(n);
        relu2_forward(r1, gu, R, F, L2, g_s);
        relu2_forward(r2, gc, R, F, F, g_s);
        check_same16("relu2_forward, strided input", r1, r2, n);
        bf16 *dg1 = d_raw16(hp2, (size_t)R * L2), *dg2 = d_bf16_poison(n), *du2 = d_bf16_poison(n), *da1 = d_bf16_poison(n),
             *da2 = d_bf16_poison(n);
        mul_backward(da1, dg1 + F, dy, a1, gu + F, R, F, L2, g_s);
        mul_backward(da2, du2, dy, a2, uc, R, F, F, g_s);
        check_same16("mul_backward, up view: d(act)", da1, da2, n);
        check_view("mul_backward: d(up) into the up view", dg1, R, L2, F, F, du2, hp2);
        bf16* dg3 = d_raw16(hp2, (size_t)R * L2);
        silu_backward(dg3, da1, gu, R, F, L2, g_s);
        silu_backward(dg2, da2, gc, R, F, F, g_s);
        check_view("silu_backward: d(gate) into the gate view", dg3, R, L2, 0, F, dg2, hp2);
        bf16 *dgu = d_raw16(hp2, (size_t)R * L2), *sg = d_bf16_poison(n), *su = d_bf16_poison(n);
        swiglu_backward(dgu, dgu + F, dy, a1, gu, gu + F, R, F, L2, g_s);
        swiglu_backward(sg, su, dy, a2, gc, uc, R, F, F, g_s);
        uint16_t *hdgu = dl_raw16(dgu, (size_t)R * L2), *hsg = dl_raw16(sg, n), *hsu = dl_raw16(su, n);
        uint16_t *vg = gather_view(hdgu, R, L2, 0, F), *vu = gather_view(hdgu, R, L2, F, F);
        int ok = !memcmp(vg, hsg, n * 2) && !memcmp(vu, hsu, n * 2);
        check(ok, "    %-58s [%d, %d] ld %d: bitwise the contiguous call's", "swiglu_backward: d(gate), d(up) into the views", R, F, L2);
        bf16* dr1 = d_raw16(hp2, (size_t)R * L2);
        relu2_backward(dr1, dy, gu, R, F, L2, g_s);
        relu2_backward(dg2, dy, gc, R, F, F, g_s);
        check_view("relu2_backward: dx into the strided view", dr1, R, L2, 0, F, dg2, hp2);
        FREE_ALL(hgu, hg, hu, hd_, hp2, hdgu, hsg, hsu, vg, vu);
    }
    FREE_ALL(hqkv, hq, hk, hv, hpoison, cs, sn);
    dfree_all();
}

/* --------------------------------------------- (j) faults at the fused sites land as on the CPU trainer */
/* a site's forward tensor as bf16 bits in logical order: the GPU's through its view, the CPU's (-precision bf16: bf16
 * bits for the logits and the MLP's hidden tensors, fp32 arrays holding bf16 values otherwise) directly */
static uint16_t* gpu_site_bits(Model* gm, int site, int l, int B, int T, size_t* n) {
    size_t cols, ld;
    const bf16* x = model_site_view(gm, site, l, B, T, n, &cols, &ld);
    uint16_t* full = dl_raw16(x, (*n / cols - 1) * ld + cols);
    uint16_t* v = gather_view(full, *n / cols, ld, 0, cols);
    free(full);
    return v;
}
static uint16_t* cpu_site_bits(cpu::Model* cm, int site, int l, int B, int T, size_t* n) {
    uint16_t* v;
    const uint16_t* xh = cpu::model_site_tensor_h(cm, site, l, B, T, n);
    if (xh) {
        v = (uint16_t*)mallocCheck(*n * 2);
        memcpy(v, xh, *n * 2);
        return v;
    }
    const float* x = cpu::model_site_tensor(cm, site, l, B, T, n);
    v = (uint16_t*)mallocCheck(*n * 2);
    for (size_t i = 0; i < *n; i++) v[i] = f32_to_bf16_bits(x[i]);
    return v;
}
/* the rows of layer l's fused weight block (rows0 .. rows0 + nrows, cols d) whose gradient changed, as a bit set,
 * and the changes themselves (faulty - clean) */
static void grad_block_delta(const float* gf, const float* gc, size_t off, int nrows, int d, unsigned char* rows, float* delta) {
    for (int r = 0; r < nrows; r++) {
        rows[r] = 0;
        for (int j = 0; j < d; j++) {
            const size_t i = off + (size_t)r * d + j;
            delta[(size_t)r * d + j] = gf[i] - gc[i];
            rows[r] |= f32_bits(gf[i]) != f32_bits(gc[i]);
        }
    }
}

/* Catches: a fault at q_proj/k_proj/v_proj/gate_proj/up_proj (forward: the module output; backward: its gradient)
 * that lands on another element than the CPU's (a view offset or stride wrong in the injector, the index map
 * missing), or with other bits. Forward: the changed logical elements and their XOR masks equal the CPU's exactly.
 * Backward: the rows of the layer's fused weight gradient ([wq; wk; wv] or [w_gate; w_up]) that change (the
 * injected columns) change on both sides (a row whose injected element is 0 on one side moves only by an ulp on the
 * other: a clear change, > 1e-3 of the largest, must be matched), and the changes agree within 5e-2 relative L2 (they are delta * x[row],
 * so a wrong row gives another vector; sign flips, so that delta = -2 g on both sides). */
static void test_fused_faults(const char* preset) {
    Config c;
    int B = 2, T = 32, N = B * T;
    Model gm_, *gm = &gm_;
    tiny_model(gm, &c, preset, B, T);
    cpu::Model cm_, *cm = &cm_;
    cpu::model_build(cm, &c, B, T, 1);
    cpu::model_init_weights(cm, 11);
    printf("faults at the fused sites, %s (vocab 256, B %d, T %d, seeded random weights), GPU vs the CPU's -precision bf16\n", preset, B, T);
    int *inp = (int*)mallocCheck(sizeof(int) * N), *tgt = (int*)mallocCheck(sizeof(int) * N);
    for (int i = 0; i < N; i++) { inp[i] = (int)rng_below(&g_rng, 256); tgt[i] = (int)rng_below(&g_rng, 256); }
    model_set_tokens(gm, inp, tgt, N);
    cpu::model_set_tokens(cm, inp, tgt, N);
    const int d = c.d_model, qd = c.n_head * c.head_dim, kd = c.n_kv_head * c.head_dim, F = c.ffn_dim, layer = 1;
    const size_t P = gm->L.total;
    const float dloss = 1.0f / N;
    /* clean runs: the site tensors after the forward and the gradients after the backward */
    model_zero_grads(gm);
    model_forward_step(gm, B, T, 1);
    model_backward_step(gm, B, T, dloss);
    float* gclean = dl_f32(gm->grads, P, NULL);
    cpu::model_zero_grads(cm);
    cpu::model_forward_step(cm, B, T, 1);
    cpu::model_backward_step(cm, B, T, dloss);
    float* cclean = h_copy(cm->grads, P);
    const int sites[5] = {SITE_Q_PROJ, SITE_K_PROJ, SITE_V_PROJ, SITE_GATE_PROJ, SITE_UP_PROJ};
    uint16_t *gsc[5] = {0}, *csc[5] = {0};
    for (int si = 0; si < 5; si++) {
        if (!site_exists(&c, sites[si])) continue;
        size_t n1, n2;
        model_zero_grads(gm);
        model_forward_step(gm, B, T, 1);
        cpu::model_forward_step(cm, B, T, 1);
        gsc[si] = gpu_site_bits(gm, sites[si], layer, B, T, &n1);
        csc[si] = cpu_site_bits(cm, sites[si], layer, B, T, &n2);
    }
    for (int si = 0; si < 5; si++) {
        const int site = sites[si];
        if (!site_exists(&c, site)) continue;
        for (int pass = PASS_FWD; pass <= PASS_BWD; pass++) {
            FaultCtx fx, fc;
            memset(&fx, 0, sizeof(fx));
            fx.width = 16;
            fx.ev.active = 1; fx.ev.step = 1; fx.ev.layer = layer; fx.ev.nbits = 1; fx.ev.seed = 21 + si; fx.ev.m = 12;
            fx.ev.field = pass == PASS_FWD ? FIELD_ALL : FIELD_SIGN;   /* backward: delta = -2 g, the same on both sides to bf16 rounding */
            fx.ev.site = site; fx.ev.pass = pass;
            fc = fx;
            model_set_fault(gm, &fx);
            cpu::model_set_fault(cm, &fc);
            model_zero_grads(gm);
            float gl = model_forward_step(gm, B, T, 1);
            cpu::model_zero_grads(cm);
            float cl = cpu::model_forward_step(cm, B, T, 1);
            if (pass == PASS_FWD) {
                size_t n1, n2;
                uint16_t *gx = gpu_site_bits(gm, site, layer, B, T, &n1), *cx = cpu_site_bits(cm, site, layer, B, T, &n2);
                size_t ng = 0, nc = 0, same = 0;
                for (size_t i = 0; i < n1 && n1 == n2; i++) {
                    const uint16_t xg = gx[i] ^ gsc[si][i], xc = cx[i] ^ csc[si][i];
                    ng += xg != 0; nc += xc != 0;
                    same += xg != 0 && xg == xc;
                }
                const double lr = fabs((double)gl - cl) / fabs((double)cl);
                const int finite = isfinite(gl) && isfinite(cl);
                check(fx.injected == 1 && fc.injected == 1 && ng == 12 && nc == 12 && same == 12 && (finite ? lr < 5e-2 : !isfinite(gl)),
                      "  fwd %-10s m 12: elements changed gpu %zu cpu %zu, the same elements with the same XOR masks %zu (want 12); loss gpu %.6g "
                      "cpu %.6g", SITE_NAMES[site], ng, nc, same, gl, cl);
                FREE_ALL(gx, cx);
            } else {
                model_backward_step(gm, B, T, dloss);
                cpu::model_backward_step(cm, B, T, dloss);
                float* gf = dl_f32(gm->grads, P, NULL);
                const int qkv = site == SITE_Q_PROJ || site == SITE_K_PROJ || site == SITE_V_PROJ;
                const int nrows = qkv ? qd + 2 * kd : (c.mlp == MLP_SWIGLU ? 2 * F : F);
                const size_t off = gm->L.t[tensor_index(gm, qkv ? PT_WQ : (c.mlp == MLP_SWIGLU ? PT_WGATE : PT_WFC), layer)].offset;
                unsigned char *rg = (unsigned char*)mallocCheck(nrows), *rc = (unsigned char*)mallocCheck(nrows);
                float *dg = h_alloc((size_t)nrows * d), *dc = h_alloc((size_t)nrows * d);
                grad_block_delta(gf, gclean, off, nrows, d, rg, dg);
                grad_block_delta(cm->grads, cclean, off, nrows, d, rc, dc);
                /* a row changed clearly on one side (by more than 1e-3 of that side's largest change) must have changed on
                 * the other: an injected element that is 0 on one side and tiny on the other (a cancellation in the
                 * backward's fp32, another order on each side) moves its row on one side only, by an ulp */
                double mg = 0, mc = 0;
                for (size_t i = 0; i < (size_t)nrows * d; i++) { mg = fmax(mg, fabs(dg[i])); mc = fmax(mc, fabs(dc[i])); }
                int nr = 0, eq = 1;
                for (int r = 0; r < nrows; r++) {
                    double rgm = 0, rcm = 0;
                    for (int j = 0; j < d; j++) { rgm = fmax(rgm, fabs(dg[(size_t)r * d + j])); rcm = fmax(rcm, fabs(dc[(size_t)r * d + j])); }
                    if ((rgm > 1e-3 * mg && !rc[r]) || (rcm > 1e-3 * mc && !rg[r])) eq = 0;
                    nr += rgm > 1e-3 * mg;
                }
                const double e = rel_l2(dg, dc, (size_t)nrows * d);
                check(fx.injected == 1 && fc.injected == 1 && eq && nr > 0 && nr <= 12 && e < 5e-2,
                      "  bwd %-10s m 12: layer %d's fused weight gradient: rows changed %d, each changed on the CPU too and vice versa: %s; "
                      "changes vs the CPU's rel L2 %.2e (< 5e-2)", SITE_NAMES[site], layer, nr, eq ? "the same" : "DIFFERENT", e);
                FREE_ALL(rg, rc, dg, dc, gf);
            }
            model_set_fault(gm, NULL);
            cpu::model_set_fault(cm, NULL);
        }
    }
    for (int si = 0; si < 5; si++) FREE_ALL(gsc[si], csc[si]);
    FREE_ALL(inp, tgt, gclean, cclean);
    cpu::model_free(cm);
    model_free(gm);
}

/* ------------------------------------------------- Qwen3's QK norm and RoPE in one kernel (qknorm_rope.cuh)
 * The fused forward against the trainer's two kernels (rmsnorm_forward_ld on the view, then rope_forward_fp on its
 * contiguous output): qn, ms and qr bitwise, and the fingerprint of qr, also from the fingerprint-only call (every
 * output NULL), equal to the two kernels'; the fused backward's fingerprint (rope_qknorm_backward_fp) equal to the two
 * kernels' (rope_backward, then rmsnorm_backward_ld with its fingerprint), for head_dim 16 to 128, both RoPE styles,
 * a row count that leaves a warp partly idle, x as a view of a wider buffer. The sign of g's last element flipped
 * changes the backward's fingerprint (the fused kernel reads every element).
 * Catches: a RoPE partner taken from the wrong lane or half, cos / sin at the wrong position or head, the norm summed
 * in another order than rmsnorm.cuh's lane groups (bits differ), the unrounded norm fed to RoPE, a row of the last
 * warp skipped. */
static void test_qknorm_rope(void) {
    printf("Qwen3's QK norm + RoPE fused (llmc/cuda/qknorm_rope.cuh) vs rmsnorm_forward_ld + rope_forward / rope_backward + rmsnorm_backward_ld\n");
    const Config* c = preset_find("tiny-qwen3");
    const int hds[4] = {16, 32, 64, 128};
    for (int hi = 0; hi < 4; hi++)
        for (int style = ROPE_HF; style <= ROPE_NANOCHAT; style++) {
            const int hd = hds[hi], B = 2, T = 13, nh = 3, N = B * T, ld = nh * hd + 16, qd = nh * hd, half = hd / 2;
            Config cc = *c;
            cc.head_dim = hd;
            float *cs = h_alloc((size_t)T * half), *sn = h_alloc((size_t)T * half);
            rope_tables(&cc, T, cs, sn);
            float *dcs = d_f32(cs, (size_t)T * half), *dsn = d_f32(sn, (size_t)T * half);
            uint16_t *hx = h_bits((size_t)N * ld, 1.0), *hw = h_bits(hd, 0.5), *hg = h_bits((size_t)N * qd, 1.0);
            bf16 *x = d_raw16(hx, (size_t)N * ld), *w = d_raw16(hw, hd), *g = d_raw16(hg, (size_t)N * qd);
            bf16 *qn1 = d_bf16_poison((size_t)N * qd), *qr1 = d_bf16_poison((size_t)N * qd), *qn2 = d_bf16_poison((size_t)N * qd),
                 *qr2 = d_bf16_poison((size_t)N * qd), *g2 = d_bf16_poison((size_t)N * qd);
            float *ms1 = d_f32_poison((size_t)N * nh), *ms2 = d_f32_poison((size_t)N * nh);
            unsigned long long* acc = (unsigned long long*)d_f32_poison(5 * FP_WORDS * 2);
            cudaCheck(cudaMemset(acc, 0, 5 * FP_WORDS * sizeof(unsigned long long)));
            unsigned long long *a1 = acc, *a2 = acc + FP_WORDS, *a3 = acc + 2 * FP_WORDS, *b1 = acc + 3 * FP_WORDS, *b2 = acc + 4 * FP_WORDS;
            const bf16* xv = x + 8;   /* the view: columns 8 .. 8 + qd of each [ld] row */
            qknorm_rope_forward(qn1, ms1, qr1, xv, ld, w, B, T, nh, hd, 1e-6f, dcs, dsn, style, a1, g_s);
            qknorm_rope_forward(NULL, NULL, NULL, xv, ld, w, B, T, nh, hd, 1e-6f, dcs, dsn, style, a3, g_s);
            rmsnorm_forward_ld(qn2, ms2, xv, ld, w, N, nh, hd, 1e-6f, g_s);
            rope_forward_fp(qr2, qn2, qd, dcs, dsn, B, T, nh, hd, style, a2, g_s);
            char what[96];
            snprintf(what, sizeof(what), "hd %d %s: qn", hd, style == ROPE_HF ? "HF" : "nanochat");
            int ok = check_same16(what, qn1, qn2, (size_t)N * qd);
            snprintf(what, sizeof(what), "hd %d %s: ms", hd, style == ROPE_HF ? "HF" : "nanochat");
            ok &= check_same32(what, ms1, ms2, (size_t)N * nh);
            snprintf(what, sizeof(what), "hd %d %s: qr", hd, style == ROPE_HF ? "HF" : "nanochat");
            ok &= check_same16(what, qr1, qr2, (size_t)N * qd);
            const Fingerprint f1 = fingerprint_read(a1, g_s), f2 = fingerprint_read(a2, g_s), f3 = fingerprint_read(a3, g_s);
            check(fp_equal(f1, f2) && fp_equal(f3, f2), "    %-58s fused %s, fingerprint-only %s", "  forward fingerprints = the two kernels'",
                  fp_equal(f1, f2) ? "yes" : "NO", fp_equal(f3, f2) ? "yes" : "NO");
            rope_qknorm_backward_fp(g, xv, ld, w, ms2, B, T, nh, hd, 1e-6f, dcs, dsn, style, b1, g_s);
            rope_backward(g2, qd, g, dcs, dsn, B, T, nh, hd, style, g_s);
            rmsnorm_backward_ld(NULL, NULL, g2, xv, ld, w, ms2, N, nh, hd, 1e-6f, 0, 0, g_s, b2);
            const Fingerprint e1 = fingerprint_read(b1, g_s), e2 = fingerprint_read(b2, g_s);
            uint16_t one = hg[(size_t)N * qd - 1] ^ 0x8000u;   /* the last element of g, its sign (a low mantissa bit may round away) */
            cudaCheck(cudaMemcpy((uint16_t*)g + (size_t)N * qd - 1, &one, 2, cudaMemcpyHostToDevice));
            cudaCheck(cudaMemset(b1, 0, FP_WORDS * sizeof(unsigned long long)));
            rope_qknorm_backward_fp(g, xv, ld, w, ms2, B, T, nh, hd, 1e-6f, dcs, dsn, style, b1, g_s);
            const Fingerprint e3 = fingerprint_read(b1, g_s);
            check(fp_equal(e1, e2) && !fp_equal(e3, e2), "    %-58s %s; the sign of g's last element changes it: %s", "  backward fingerprint = the two kernels'",
                  fp_equal(e1, e2) ? "yes" : "NO", !fp_equal(e3, e2) ? "yes" : "NO");
            {   /* Q (nh heads) and K (2 heads of the same view, its own weight) in one launch: each as its single launch */
                const int nk = 2;
                uint16_t* hw2 = h_bits(hd, 0.5);
                bf16 *w2 = d_raw16(hw2, hd), *kn1 = d_bf16_poison((size_t)N * nk * hd), *kr1 = d_bf16_poison((size_t)N * nk * hd),
                     *kn2 = d_bf16_poison((size_t)N * nk * hd), *kr2 = d_bf16_poison((size_t)N * nk * hd), *qn3 = d_bf16_poison((size_t)N * qd),
                     *qr3 = d_bf16_poison((size_t)N * qd);
                float *kms1 = d_f32_poison((size_t)N * nk), *kms2 = d_f32_poison((size_t)N * nk), *qms3 = d_f32_poison((size_t)N * nh);
                unsigned long long* acc2 = (unsigned long long*)d_f32_poison(6 * FP_WORDS * 2);
                cudaCheck(cudaMemset(acc2, 0, 6 * FP_WORDS * sizeof(unsigned long long)));
                unsigned long long *c0 = acc2, *c1 = acc2 + FP_WORDS, *c2 = acc2 + 2 * FP_WORDS, *c3 = acc2 + 3 * FP_WORDS, *c4 = acc2 + 4 * FP_WORDS,
                                   *c5 = acc2 + 5 * FP_WORDS;
                qknorm_rope_forward_qk(qn3, qms3, qr3, kn1, kms1, kr1, xv, xv, ld, w, w2, B, T, nh, nk, hd, 1e-6f, dcs, dsn, style, c0, c1, g_s);
                qknorm_rope_forward(kn2, kms2, kr2, xv, ld, w2, B, T, nk, hd, 1e-6f, dcs, dsn, style, c2, g_s);
                snprintf(what, sizeof(what), "hd %d %s: q and k in one launch", hd, style == ROPE_HF ? "HF" : "nanochat");
                check_same16(what, qr3, qr1, (size_t)N * qd);
                check_same16(what, qn3, qn1, (size_t)N * qd);
                check_same32(what, qms3, ms1, (size_t)N * nh);
                check_same16(what, kr1, kr2, (size_t)N * nk * hd);
                check_same16(what, kn1, kn2, (size_t)N * nk * hd);
                check_same32(what, kms1, kms2, (size_t)N * nk);
                rope_qknorm_backward_fp_qk(g, g, xv, xv, ld, w, w2, ms2, kms2, B, T, nh, nk, hd, 1e-6f, dcs, dsn, style, c3, c4, g_s);
                rope_qknorm_backward_fp(g, xv, ld, w2, kms2, B, T, nk, hd, 1e-6f, dcs, dsn, style, c5, g_s);
                const Fingerprint h0 = fingerprint_read(c0, g_s), h1 = fingerprint_read(c1, g_s), h2 = fingerprint_read(c2, g_s);
                const Fingerprint h3 = fingerprint_read(c3, g_s), h4 = fingerprint_read(c4, g_s), h5 = fingerprint_read(c5, g_s);
                const int fok = fp_equal(h0, f1) && fp_equal(h1, h2) && fp_equal(h3, e3) && fp_equal(h4, h5);
                check(fok, "    %-58s %s", "  q and k in one launch: the four fingerprints = the single launches'", fok ? "yes" : "NO");
                {   /* the first pass's writing backward (rope_qknorm_backward_qk: RoPE's and the norm's backward of q and k, the
                     * norms' dw riding) against rope_qk's backward into scratch + rmsnorm_backward_ld of q and of k: dx of both
                     * (views of their own [N, ld] buffers, nothing else written), dw of both (written and accumulated), the
                     * fingerprints, with and without them, with the rows' grid at its size and capped at 2 blocks */
                    uint16_t* hgk = h_bits((size_t)N * nk * hd, 1.0);
                    float* hdw = h_normal(hd, 0.3, 0.0, 1);
                    bf16* gk = d_raw16(hgk, (size_t)N * nk * hd);
                    bf16 *sq = d_bf16_poison((size_t)N * qd), *sk = d_bf16_poison((size_t)N * nk * hd);
                    int bok = 1;
                    for (int v = 0; v < 8; v++) {
                        const int accw = v & 1, fp = (v >> 1) & 1, cap = v >> 2;
                        bf16* dx[4];   /* q, k: fused; q, k: two-step */
                        for (int i = 0; i < 4; i++) dx[i] = d_bf16_poison((size_t)N * ld);
                        float* dw[4];
                        for (int i = 0; i < 4; i++) dw[i] = accw ? d_f32(hdw, hd) : d_f32_poison(hd);
                        unsigned long long* fa = (unsigned long long*)d_f32_poison(4 * FP_WORDS * 2);
                        cudaCheck(cudaMemset(fa, 0, 4 * FP_WORDS * sizeof(unsigned long long)));
                        unsigned long long* fq[4];
                        for (int i = 0; i < 4; i++) fq[i] = fp ? fa + i * FP_WORDS : NULL;
                        g_qknr_bwd_grid_cap = cap ? 2 : 0;
                        rope_qknorm_backward_qk(dx[0] + 8, dx[1] + 8, dw[0], dw[1], g, gk, xv, xv, ld, w, w2, ms2, kms2, B, T, nh, nk, hd, 1e-6f,
                                                accw, dcs, dsn, style, fq[0], fq[1], NULL, g_s);
                        g_qknr_bwd_grid_cap = 0;
                        rope_qk(sq, sk, g, gk, qd, nk * hd, dcs, dsn, B, T, nh, nk, hd, style, true, NULL, NULL, g_s);
                        rmsnorm_backward_ld(dx[2] + 8, dw[2], sq, xv, ld, w, ms2, N, nh, hd, 1e-6f, 0, accw, g_s, fq[2]);
                        rmsnorm_backward_ld(dx[3] + 8, dw[3], sk, xv, ld, w2, kms2, N, nk, hd, 1e-6f, 0, accw, g_s, fq[3]);
                        uint16_t *a0 = dl_raw16(dx[0], (size_t)N * ld), *a1 = dl_raw16(dx[1], (size_t)N * ld), *a2 = dl_raw16(dx[2], (size_t)N * ld),
                                 *a3 = dl_raw16(dx[3], (size_t)N * ld);
                        float *w0 = dl_f32(dw[0], hd, NULL), *w1 = dl_f32(dw[1], hd, NULL), *w2h = dl_f32(dw[2], hd, NULL), *w3 = dl_f32(dw[3], hd, NULL);
                        unsigned long long hf[4 * FP_WORDS];
                        cudaCheck(cudaMemcpy(hf, fa, sizeof(hf), cudaMemcpyDeviceToHost));
                        const int same = !memcmp(a0, a2, (size_t)N * ld * 2) && !memcmp(a1, a3, (size_t)N * ld * 2) && !bits_differ(w0, w2h, hd) &&
                                         !bits_differ(w1, w3, hd) && !memcmp(hf, hf + 2 * FP_WORDS, 2 * FP_WORDS * 8) &&
                                         (!fp || (hf[0] | hf[1]) != 0);
                        if (!same) printf("      writing backward, dw %s, fingerprints %s, grid %s: differs from the two-step form\n",
                                          accw ? "accumulated" : "written", fp ? "on" : "off", cap ? "capped" : "full");
                        bok &= same;
                        FREE_ALL(a0, a1, a2, a3, w0, w1, w2h, w3);
                    }
                    snprintf(what, sizeof(what), "hd %d %s: the writing backward of q and k, one launch", hd, style == ROPE_HF ? "HF" : "nanochat");
                    check(bok, "    %-58s dx, dw, fingerprints bitwise the two-step form's (8 variants)%s", what, bok ? "" : " (NO)");
                    FREE_ALL(hgk, hdw);
                }
                {   /* a second pair riding (-protect qk's recomputation, fingerprint-only): the first pair's outputs and fingerprints
                     * as without it, the second pair's as its own launch's; the second pair's x with one sign flipped in q */
                    uint16_t* hx2 = (uint16_t*)malloc((size_t)N * ld * 2);
                    memcpy(hx2, hx, (size_t)N * ld * 2);
                    hx2[(size_t)(N - 1) * ld + 8 + 2 * hd + 3] ^= 0x8000u;   /* head 2: q's only (k reads heads 0, 1 of the view) */
                    bf16 *x2 = d_raw16(hx2, (size_t)N * ld), *qr4 = d_bf16_poison((size_t)N * qd), *kr4 = d_bf16_poison((size_t)N * nk * hd);
                    unsigned long long* a6 = (unsigned long long*)d_f32_poison(6 * FP_WORDS * 2);
                    cudaCheck(cudaMemset(a6, 0, 6 * FP_WORDS * sizeof(unsigned long long)));
                    const QkFpPair rr = {x2 + 8, x2 + 8, ld, a6 + 2 * FP_WORDS, a6 + 3 * FP_WORDS};
                    qknorm_rope_forward_qk(NULL, NULL, qr4, NULL, NULL, kr4, xv, xv, ld, w, w2, B, T, nh, nk, hd, 1e-6f, dcs, dsn, style, a6, a6 + FP_WORDS,
                                           g_s, MMB_TAIL_NONE, &rr);
                    qknorm_rope_forward_qk(NULL, NULL, NULL, NULL, NULL, NULL, x2 + 8, x2 + 8, ld, w, w2, B, T, nh, nk, hd, 1e-6f, dcs, dsn, style,
                                           a6 + 4 * FP_WORDS, a6 + 5 * FP_WORDS, g_s);
                    snprintf(what, sizeof(what), "hd %d %s: q and k with a second pair riding", hd, style == ROPE_HF ? "HF" : "nanochat");
                    check_same16(what, qr4, qr1, (size_t)N * qd);
                    check_same16(what, kr4, kr2, (size_t)N * nk * hd);
                    Fingerprint fr[6];
                    for (int i = 0; i < 6; i++) fr[i] = fingerprint_read(a6 + i * FP_WORDS, g_s);
                    const int rok = fp_equal(fr[0], f1) && fp_equal(fr[1], h2) && fp_equal(fr[2], fr[4]) && fp_equal(fr[3], fr[5]) &&
                                    !fp_equal(fr[2], f1) && fp_equal(fr[3], h2);
                    check(rok, "    %-58s %s", "  + riding pair: 4 fingerprints = the launches' own", rok ? "yes" : "NO");
                    free(hx2);
                }
                free(hw2);
            }
            (void)ok;
            FREE_ALL(cs, sn, hx, hw, hg);
            dfree_all();
        }
}
