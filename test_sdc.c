/* test_sdc.c: CPU tests of the model family, the shared element-wise logic and the file formats.
 *
 *   ./test_sdc -states DIR -ckpts DIR
 *
 * - parameter counts of the HF presets against docs/design.md exactly;
 * - bf16 round-to-nearest-even on hand-computed cases; checksum properties;
 * - every GEMM path the CPU offers (gemm.h) against double, bitwise across thread counts;
 * - the register-blocked attention products bit for bit equal to their reference loops;
 * - GEMM and whole-step bitwise independence from the OpenMP thread count;
 * - the reference states of dev/reference (HF LlamaForCausalLM, Qwen3ForCausalLM and the nanochat
 *   model): weights loaded through the user's import path (hf_to_ckpt.py -> checkpoint -> -init
 *   loader), then logits, loss, every parameter gradient and the losses of 10 AdamW steps (made by
 *   model_update, the training loop's call) compared in fp32, printing the largest absolute and
 *   relative error per tensor;
 * - the same reference states with -precision bf16 (the emulated AMP) against the fp32 reference, under
 *   the fixed bounds of tests/bf16_bounds.h, derived from bf16 rounding (the GPU tests use the same):
 *   catches a bf16 mode that stops learning (a stale bf16 weight copy) or loses accuracy anywhere.
 * Each check prints OK / NOT OK; the last line is "N passed, M failed"; exit 1 on any failure. */
#define TESTING
#include "train_sdc.c"

#include "tests/check.h"

/* every element: |got - ref| <= atol + rtol*|ref|. Prints the largest abs and rel error. */
static int compare_tensor(const char* name, const float* got, const float* ref, size_t n, float atol, float rtol) {
    double max_abs = 0, max_rel = 0; int ok = 1; size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        double rel = e / (fabs((double)ref[i]) + 1e-12);
        if (!(e <= atol + rtol * fabs((double)ref[i]))) { if (ok) worst = i; ok = 0; }
        if (e > max_abs || e != e) max_abs = e;
        if (fabs(ref[i]) > 1e-6 && rel > max_rel) max_rel = rel;
    }
    check(ok, "  %-28s n=%-8zu max abs %.3e  max rel %.3e%s", name, n, max_abs, max_rel, ok ? "" : " (first bad element shown below)");
    if (!ok) printf("    element %zu: got %.9g ref %.9g\n", worst, got[worst], ref[worst]);
    return ok;
}

/* ------------------------------------------------------------------------------- unit tests */
/* the HF presets' parameter counts equal docs/design.md's (the published model sizes). Catches: a tensor missing,
 * duplicated or of the wrong shape in the layout (untied head counted as tied, GQA K/V sized as Q). */
static void test_param_counts(void) {
    printf("parameter counts (docs/design.md, the model family)\n");
    struct { const char* name; size_t expect; } cases[] = {
        {"llama3.2-1b", 1235814400ULL}, {"qwen3-0.6b", 596049920ULL}, {"smollm2-135m", 134515008ULL}};
    for (int i = 0; i < 3; i++) {
        size_t n = config_num_params(preset_find(cases[i].name));
        check(n == cases[i].expect, "  %-14s %zu (expect %zu)", cases[i].name, n, cases[i].expect);
    }
}

/* fp32 -> bf16 on hand-computed cases. Catches: truncation instead of round-to-nearest-even, ties rounded away
 * from even, overflow not going to inf, a NaN rounded into inf. */
static void test_bf16(void) {
    printf("bf16 round-to-nearest-even\n");
    struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 exact */
        {0x3F808000u, 0x3F80}, /* 1 + 2^-8: halfway, even stays */
        {0x3F818000u, 0x3F82}, /* halfway with odd lsb: rounds up to even */
        {0x3F808001u, 0x3F81}, /* just above halfway: up */
        {0x3F807FFFu, 0x3F80}, /* just below halfway: down */
        {0xBF808001u, 0xBF81}, /* negative: magnitude rounds the same way */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds to +inf */
        {0x7F800000u, 0x7F80}, /* +inf */
        {0x00000001u, 0x0000}, /* smallest denormal rounds to +0 */
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t got = f32_to_bf16_bits(bits_f32(cases[i].in));
        if (got != cases[i].out) { printf("    %08x -> %04x, expected %04x\n", cases[i].in, got, cases[i].out); ok = 0; }
    }
    check(ok, "  %zu hand-computed cases", sizeof(cases) / sizeof(cases[0]));
    uint16_t nan = f32_to_bf16_bits(bits_f32(0x7FC00001u));
    check((nan & 0x7F80) == 0x7F80 && (nan & 0x7F), "  NaN stays NaN (%04x)", nan);
    /* the vectorised array form against the scalar one on every exponent and random mantissas (NaNs, infs,
     * denormals, ties included) */
    size_t n = 1 << 20;
    uint32_t* u = mallocCheck(sizeof(uint32_t) * n);
    uint64_t z = 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < n; i++) {
        z = z * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t r = (uint32_t)(z >> 32);
        u[i] = (i & 3) == 0 ? (r & 0xffff8000u) : (i & 3) == 1 ? (r | 0x7f800000u) : r;   /* ties; inf/NaN exponents */
    }
    uint32_t* w = mallocCheck(sizeof(uint32_t) * n);
    memcpy(w, u, sizeof(uint32_t) * n);
    bf16_round_array((float*)w, (long long)n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += f32_bits(bf16_round(bits_f32(u[i]))) != w[i];
    check(bad == 0, "  bf16_round_array = bf16_round on %zu bit patterns (%zu differ)", n, bad);
    free(u); free(w);
}

/* the file checksum: every single-bit flip changes it, streaming equals one shot, the length counts. Catches:
 * a checksum blind to some bit positions (a corrupted file accepted), a streaming state lost across pieces
 * of odd length, zero padding that hides a truncation. */
static void test_checksum(void) {
    printf("checksum\n");
    uint8_t buf[1003];
    Rng r; rng_seed(&r, 1);
    for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (uint8_t)rng_u64(&r);
    uint64_t base = tsdc_checksum(buf, sizeof(buf));
    int all_differ = 1;
    for (size_t i = 0; i < sizeof(buf); i++)
        for (int b = 0; b < 8; b++) {
            buf[i] ^= (uint8_t)(1u << b);
            if (tsdc_checksum(buf, sizeof(buf)) == base) all_differ = 0;
            buf[i] ^= (uint8_t)(1u << b);
        }
    check(all_differ, "  every single-bit flip of a 1003-byte buffer changes it");
    int stream_ok = 1;
    size_t cuts[] = {0, 1, 7, 8, 9, 500, 1002, 1003};
    for (size_t i = 0; i < 8; i++)
        for (size_t j = i; j < 8; j++) {
            ChecksumStream cs; checksum_stream_init(&cs);
            checksum_stream_update(&cs, buf, cuts[i]);
            checksum_stream_update(&cs, buf + cuts[i], cuts[j] - cuts[i]);
            checksum_stream_update(&cs, buf + cuts[j], sizeof(buf) - cuts[j]);
            if (checksum_stream_final(&cs) != base) stream_ok = 0;
        }
    check(stream_ok, "  streaming in pieces of any length equals the one-shot checksum");
    uint8_t z[16] = {0};
    check(tsdc_checksum(z, 15) != tsdc_checksum(z, 16), "  length is part of the checksum (15 vs 16 zero bytes)");
}

/* -protect's parser (llmc/sdc/checks.h protect_parse, what both trainers' protect_setup calls) with a trainer that
 * provides every kind, and with one that lacks some (the CUDA trainer's case for any kind whose gpu column is 0):
 * paper is qk,rgg,exp, all is every kind with a -protect name; a kind the trainer lacks is one line,
 * "-protect X: not available on this trainer", named alone or through all or paper, and sets no kind on; an unknown
 * name lists the valid ones. Catches: all narrowed to what a trainer has (a silent drop), an error that names the
 * wrong kind, a set that leaves a member out or adds the detectors. */
static void test_protect_parse(void) {
    printf("-protect parsing (protect_parse)\n");
    int every[PK_COUNT], lacking[PK_COUNT], on[PK_COUNT], all = 0;
    char err[400];
    for (int k = 0; k < PK_COUNT; k++) { every[k] = 1; lacking[k] = k != PK_ATT_BWD && k != PK_EW; }
    char want_all[200] = "", got[200];
    for (int k = 0; k < PK_COUNT; k++)
        if (PROT_KINDS[k].all) snprintf(want_all + strlen(want_all), sizeof(want_all) - strlen(want_all), "%s%s", want_all[0] ? "," : "", PROT_KINDS[k].name);
#define ON_LIST(out) do { out[0] = 0; for (int k_ = 0; k_ < PK_COUNT; k_++) if (on[k_]) snprintf(out + strlen(out), sizeof(got) - strlen(out), "%s%s", out[0] ? "," : "", PROT_KINDS[k_].name); } while (0)
    memset(on, 0, sizeof(on));
    int rc = protect_parse("all", every, on, &all, err, sizeof(err));
    ON_LIST(got);
    check(rc == 0 && all && !strcmp(got, "qk,rgg,att,qk_bwd,att_bwd,ew,bound,bwd,exp") && !strcmp(got, want_all), "  all = %s", got);
    memset(on, 0, sizeof(on));
    rc = protect_parse("paper", every, on, &all, err, sizeof(err));
    ON_LIST(got);
    check(rc == 0 && !all && !strcmp(got, "qk,rgg,exp"), "  paper = %s", got);
    memset(on, 0, sizeof(on));
    rc = protect_parse("none,qk,att", lacking, on, &all, err, sizeof(err));
    ON_LIST(got);
    check(rc == 0 && !strcmp(got, "qk,att"), "  none,qk,att on a trainer lacking others = %s", got);
    memset(on, 0, sizeof(on));
    rc = protect_parse("qk,ew", lacking, on, &all, err, sizeof(err));
    check(rc == 1 && !strcmp(err, "-protect ew: not available on this trainer"), "  a lacking kind named: \"%s\"", rc ? err : "accepted");
    memset(on, 0, sizeof(on));
    rc = protect_parse("all", lacking, on, &all, err, sizeof(err));
    check(rc == 1 && !strcmp(err, "-protect att_bwd,ew: not available on this trainer (in -protect all)"), "  all on a trainer lacking two: \"%s\"",
          rc ? err : "accepted");
    memset(on, 0, sizeof(on));
    rc = protect_parse("paper,rgg", lacking, on, &all, err, sizeof(err));
    ON_LIST(got);
    check(rc == 0 && !strcmp(got, "qk,rgg,exp"), "  paper on a trainer lacking non-paper kinds = %s", got);
    memset(on, 0, sizeof(on));
    rc = protect_parse("qk,detectors", every, on, &all, err, sizeof(err));
    check(rc == 1 && strstr(err, "'detectors' is not none, paper, all, qk, rgg, att, qk_bwd, att_bwd, ew, bound, bwd, exp (see -h)") != NULL,
          "  an unknown name: \"%s\"", rc ? err : "accepted");
#undef ON_LIST
}

/* lr_at: linear warmup (s+1)/w, cosine to the floor, the floor after the end. Catches: warmup off by one
 * step, a cosine over the wrong span, a decay to 0 instead of final_lr_frac. */
static void test_schedule(void) {
    printf("learning-rate schedule\n");
    int ok = fabs(lr_at(0, 1.0, 10, 100, 0.1) - 0.1) < 1e-15 && fabs(lr_at(9, 1.0, 10, 100, 0.1) - 1.0) < 1e-15 &&
             fabs(lr_at(10, 1.0, 10, 100, 0.1) - 1.0) < 1e-15 && fabs(lr_at(55, 1.0, 10, 100, 0.1) - 0.55) < 1e-12 &&
             fabs(lr_at(100, 1.0, 10, 100, 0.1) - 0.1) < 1e-15 && fabs(lr_at(500, 1.0, 10, 100, 0.1) - 0.1) < 1e-15;
    check(ok, "  warmup (s+1)/w, cosine midpoint 0.55, floor 0.1");
}

static void fill_normal(float* x, size_t n, uint64_t seed, float scale) {
    Rng r; rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&r));
}

/* -protect bound's comparison (llmc/sdc/bound.h) on the trainer's own forward GEMM (matmul_forward_w, every path this
 * CPU has, fp32 and bf16, the output stored as bf16 or not), at the invariant's tight case: input rows equal to weight
 * rows with positive entries, so the diagonal outputs are ||w_j||^2, Cauchy-Schwarz with equality, plus rows equal
 * to weight rows scaled by 2^-60 and 2^60 (the bound's fp32 arithmetic far from 1); K from 7 to 4096. The clean
 * outputs never violate and reach more than 0.99 of the bound (so the test is at the edge the factor c(K) covers);
 * one output multiplied by 2, a NaN and an Inf each violate. Catches: c(K) without the output's bf16 rounding or the
 * summation's error (set mmb_factor to 1: the tight outputs rounded up violate), a norm rounded down, a comparison
 * that lets NaN through. */
static void test_mmb_bound(void) {
    printf("-protect bound: matrix-product outputs under c(K) |x_i| |w_j|\n");
    const int Ks[] = {7, 128, 1536, 4096}, rows = 12, cols = 20;
    const int top = gemm_machine_level();
    for (int lv = 0; lv <= top; lv++) {
        gemm_set_level(lv);
        for (int bf = 0; bf < 2; bf++) {
            long long viol = 0, planted = 0;
            double worst = 0;
            for (int ki = 0; ki < 4; ki++) {
                const int K = Ks[ki];
                float *x = mallocCheck(sizeof(float) * rows * K), *w = mallocCheck(sizeof(float) * cols * K), *y = mallocCheck(sizeof(float) * rows * cols);
                float *nx = mallocCheck(sizeof(float) * rows), *nw = mallocCheck(sizeof(float) * cols);
                fill_normal(w, (size_t)cols * K, 91 + K, 1);
                for (int i = 0; i < cols * K; i++) w[i] = bf16_round(fabsf(w[i]));
                for (int r = 0; r < rows; r++)
                    for (int k = 0; k < K; k++) x[(size_t)r * K + k] = ldexpf(w[(size_t)r * K + k], r == 10 ? -60 : r == 11 ? 60 : 0);
                for (int round = 0; round < 2; round++) {
                    matmul_forward_w(y, x, w, rows, K, cols, bf, round && bf);
                    mmb_row_norms(nx, x, rows, K, K);
                    mmb_row_norms(nw, w, cols, K, K);
                    viol += mmb_count(y, rows, cols, cols, nx, nw, K);
                    const float c = mmb_factor(K);
                    for (int r = 0; r < rows; r++)
                        for (int j = 0; j < cols; j++) {
                            const double q = fabs((double)y[r * cols + j]) / ((double)nx[r] * nw[j] * c);
                            if (q > worst) worst = q;
                        }
                    const float keep = y[3 * cols + 3];
                    const float bad[3] = {keep * 2.0f, NAN, INFINITY};
                    for (int b = 0; b < 3; b++) {
                        y[3 * cols + 3] = bad[b];
                        planted += mmb_count(y, rows, cols, cols, nx, nw, K) == 1;
                    }
                    y[3 * cols + 3] = keep;
                }
                free(x); free(w); free(y); free(nx); free(nw);
            }
            const char* path = bf ? gemm_bf16_path() : gemm_f32_path();
            check(viol == 0 && worst > 0.99, "  %-10s %s: no clean output over its bound (%lld), the tightest at %.6f of it", path,
                  bf ? "bf16" : "fp32", viol, worst);
            check(planted == 4 * 2 * 3, "  %-10s %s: x2, NaN and Inf planted: %lld of 24 violate", path, bf ? "bf16" : "fp32", planted);
        }
    }
    gemm_set_level(gemm_machine_level());
}

/* the register-blocked attention products (cpu_kernels.h) against their _ref loops, bit for bit: T not a
 * multiple of the 8-row or 16-key blocks, head_dim 32 / 48 / 64 / 128 and 40 (not a multiple of 16: the
 * _ref fallback), GQA groups 1, 2, 3, and an inf planted in one value row and one query (a masked term added
 * as zero would turn it into NaN where the _ref loop leaves a number). Catches: a changed summation order
 * (other bits: the fault-free reference and every hash in the tests would move), a causal triangle
 * visited beyond s <= t, a block edge dropped. */
/* the n bf16 bits h are those of the fp32 array x (which holds bf16 values), element for element */
static int bits_equal_values(const uint16_t* h, const float* x, size_t n) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= (uint32_t)h[i] << 16 == f32_bits(x[i]);
    return ok;
}
static void test_attention_fast(void) {
    printf("attention products, register-blocked = the reference loops bit for bit; the fused attention = the materialised one\n");
    struct { int B, T, H, KV, hd; } sh[] = {{2, 37, 4, 2, 32}, {1, 16, 3, 1, 64}, {1, 53, 6, 2, 128}, {2, 9, 2, 2, 40}, {1, 21, 4, 2, 48}, {1, 128, 4, 4, 64},
                                            {1, 1100, 2, 1, 16}};   /* T 1100: the fused backward in 20 query tiles of 56 rows */
    for (int c = 0; c < (int)(sizeof(sh) / sizeof(sh[0])); c++) {
        int B = sh[c].B, T = sh[c].T, H = sh[c].H, KV = sh[c].KV, hd = sh[c].hd;
        size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T;
        float *q = mallocCheck(sizeof(float) * nq), *k = mallocCheck(sizeof(float) * nk), *v = mallocCheck(sizeof(float) * nk);
        float *go = mallocCheck(sizeof(float) * nq), *p = mallocCheck(sizeof(float) * na), *dl = mallocCheck(sizeof(float) * na);
        fill_normal(q, nq, 100 + c, 1); fill_normal(k, nk, 200 + c, 1); fill_normal(v, nk, 300 + c, 1);
        fill_normal(go, nq, 400 + c, 1); fill_normal(dl, na, 500 + c, 1);
        v[(size_t)(T / 2) * KV * hd + 3] = INFINITY;    /* batch 0, token T/2, kv head 0 */
        q[(size_t)(T - 1) * H * hd + 1] = INFINITY;     /* batch 0, last token, head 0 */
        float *r1 = mallocCheck(sizeof(float) * na), *r2 = mallocCheck(sizeof(float) * na);
        attention_logits_forward_ref(r1, q, k, B, T, H, KV, hd);
        attention_logits_forward(r2, q, k, B, T, H, KV, hd, 0);
        int ok_l = memcmp(r1, r2, sizeof(float) * na) == 0;
        attention_softmax_forward(p, r1, B, H, T, 0);
        float *o1 = mallocCheck(sizeof(float) * nq), *o2 = mallocCheck(sizeof(float) * nq);
        attention_av_forward_ref(o1, p, v, B, T, H, KV, hd);
        attention_av_forward(o2, p, v, B, T, H, KV, hd, 0);
        int ok_o = memcmp(o1, o2, sizeof(float) * nq) == 0;
        float *dv1 = mallocCheck(sizeof(float) * nk), *dv2 = mallocCheck(sizeof(float) * nk);
        attention_av_backward_ref(r1, dv1, go, p, v, B, T, H, KV, hd);
        attention_av_backward(r2, dv2, go, p, v, B, T, H, KV, hd, 0);
        int ok_dp = memcmp(r1, r2, sizeof(float) * na) == 0 && memcmp(dv1, dv2, sizeof(float) * nk) == 0;
        float *dq1 = mallocCheck(sizeof(float) * nq), *dq2 = mallocCheck(sizeof(float) * nq);
        attention_logits_backward_ref(dq1, dv1, dl, q, k, B, T, H, KV, hd);
        attention_logits_backward(dq2, dv2, dl, q, k, B, T, H, KV, hd, 0);
        int ok_dq = memcmp(dq1, dq2, sizeof(float) * nq) == 0 && memcmp(dv1, dv2, sizeof(float) * nk) == 0;
        check(ok_l && ok_o && ok_dp && ok_dq, "  B %d T %-3d H %d KV %d hd %-3d: logits %s, out %s, dprobs+dv %s, dq+dk %s", B, T, H, KV, hd,
              ok_l ? "=" : "DIFFER", ok_o ? "=" : "DIFFER", ok_dp ? "=" : "DIFFER", ok_dq ? "=" : "DIFFER");
        /* the fused attention against the materialised path it replaces, in fp32 and in bf16 (round): out, dq, dk, dv
         * bit for bit (no infinity here: the materialised path's probs of a row with an infinite logit are NaN and
         * so are the fused path's, but NaN payloads need not agree) */
        if (attention_fused_supported(hd))
            for (int round = 0; round < 2; round++) {
                q[(size_t)(T - 1) * H * hd + 1] = 0.5f; v[(size_t)(T / 2) * KV * hd + 3] = 0.5f;
                float *dk1 = mallocCheck(sizeof(float) * nk), *dk2 = mallocCheck(sizeof(float) * nk);
                attention_logits_forward(r1, q, k, B, T, H, KV, hd, round);
                attention_softmax_forward(p, r1, B, H, T, round);
                attention_av_forward(o1, p, v, B, T, H, KV, hd, round);
                attention_fused_forward(o2, q, k, v, B, T, H, KV, hd, round);
                attention_av_backward(r1, dv1, go, p, v, B, T, H, KV, hd, round);
                attention_softmax_backward(r1, r1, p, B, H, T, round);
                attention_logits_backward(dq1, dk1, r1, q, k, B, T, H, KV, hd, round);
                attention_fused_backward(dq2, dk2, dv2, go, q, k, v, B, T, H, KV, hd, round);
                int fo = memcmp(o1, o2, sizeof(float) * nq) == 0, fq = memcmp(dq1, dq2, sizeof(float) * nq) == 0;
                int fk = memcmp(dk1, dk2, sizeof(float) * nk) == 0, fv = memcmp(dv1, dv2, sizeof(float) * nk) == 0;
                check(fo && fq && fk && fv, "  B %d T %-3d H %d KV %d hd %-3d %s: fused = materialised: out %s, dq %s, dk %s, dv %s", B, T, H, KV, hd,
                      round ? "bf16" : "fp32", fo ? "=" : "DIFFER", fq ? "=" : "DIFFER", fk ? "=" : "DIFFER", fv ? "=" : "DIFFER");
                free(dk1); free(dk2);
            }
        /* q, k, v, the output and its gradient stored as bf16 bits, dv too (-precision bf16's storage of the Q/K path, v_proj
         * and att_out and of their gradients): the _x forms = the fp32 forms on arrays of the same values, bit for bit (hd
         * 40: the _ref fallback's copies) */
        {
            q[(size_t)(T - 1) * H * hd + 1] = 0.5f; v[(size_t)(T / 2) * KV * hd + 3] = 0.5f;
            float *vr = mallocCheck(sizeof(float) * nk), *kr = mallocCheck(sizeof(float) * nk), *qr = mallocCheck(sizeof(float) * nq);
            float *dk1 = mallocCheck(sizeof(float) * nk), *dk2 = mallocCheck(sizeof(float) * nk);
            float* gor = mallocCheck(sizeof(float) * nq);   /* the output's gradient as bf16 values (goh: its bits) */
            uint16_t *vh = mallocCheck(2 * nk), *kh = mallocCheck(2 * nk), *qh = mallocCheck(2 * nq), *oh = mallocCheck(2 * nq);
            uint16_t *goh = mallocCheck(2 * nq), *dvh = mallocCheck(2 * nk);
            for (size_t i = 0; i < nk; i++) { vr[i] = bf16_round(v[i]); vh[i] = f32_to_bf16_bits(v[i]); kr[i] = bf16_round(k[i]); kh[i] = f32_to_bf16_bits(k[i]); }
            for (size_t i = 0; i < nq; i++) { qr[i] = bf16_round(q[i]); qh[i] = f32_to_bf16_bits(q[i]); gor[i] = bf16_round(go[i]); goh[i] = f32_to_bf16_bits(go[i]); }
            int xl, xo = 1, xb, xd, xf = 1;
            /* the [B,H,T,T] tensors (logits, probs, dprobs, dlogits) as bf16 bits too: the float forms' values, the
             * masked triangle zero; each function reading them so gives the float form's bits */
            uint16_t *lh16 = mallocCheck(2 * na), *ph16 = mallocCheck(2 * na), *th16 = mallocCheck(2 * na);
            float* dlr = mallocCheck(sizeof(float) * na);   /* dl as bf16 values (th16: its bits) */
            for (size_t i = 0; i < na; i++) { dlr[i] = bf16_round(dl[i]); th16[i] = f32_to_bf16_bits(dl[i]); }
            int xt = 1;
            attention_logits_forward(r1, qr, kr, B, T, H, KV, hd, 1);
            attention_logits_forward_x(r2, 0, qh, 1, kh, 1, B, T, H, KV, hd, 1);
            xl = memcmp(r1, r2, sizeof(float) * na) == 0;
            memset(lh16, 0xff, 2 * na);
            attention_logits_forward_x(lh16, 1, qh, 1, kh, 1, B, T, H, KV, hd, 1);
            xt &= bits_equal_values(lh16, r1, na);
            attention_softmax_forward(p, r1, B, H, T, 1);
            memset(ph16, 0xff, 2 * na);
            attention_softmax_forward_x(ph16, 1, lh16, 1, B, H, T, 1);
            xt &= bits_equal_values(ph16, p, na);
            attention_softmax_forward_x(r2, 0, lh16, 1, B, H, T, 1);
            xt &= memcmp(r2, p, sizeof(float) * na) == 0;
            attention_av_forward(o1, p, vr, B, T, H, KV, hd, 1);
            attention_av_forward_x(oh, 1, p, 0, vh, 1, B, T, H, KV, hd, 1);
            xo &= bits_equal_values(oh, o1, nq);
            attention_av_forward_x(o2, 0, p, 0, vh, 1, B, T, H, KV, hd, 1);
            xo &= memcmp(o1, o2, sizeof(float) * nq) == 0;
            attention_av_forward_x(o2, 0, ph16, 1, vh, 1, B, T, H, KV, hd, 1);
            xt &= memcmp(o1, o2, sizeof(float) * nq) == 0;
            attention_av_backward(r1, dv1, gor, p, vr, B, T, H, KV, hd, 1);
            attention_av_backward_x(r2, 0, dv2, 0, goh, 1, p, 0, vh, 1, B, T, H, KV, hd, 1);
            xb = memcmp(r1, r2, sizeof(float) * na) == 0 && memcmp(dv1, dv2, sizeof(float) * nk) == 0;
            attention_av_backward_x(r2, 0, dvh, 1, goh, 1, p, 0, vh, 1, B, T, H, KV, hd, 1);   /* dv as bf16 bits */
            xb &= memcmp(r1, r2, sizeof(float) * na) == 0;
            xb &= bits_equal_values(dvh, dv1, nk);
            memset(lh16, 0xff, 2 * na);
            attention_av_backward_x(lh16, 1, dv2, 0, goh, 1, ph16, 1, vh, 1, B, T, H, KV, hd, 1);   /* dprobs from probs, as bits */
            xt &= bits_equal_values(lh16, r1, na) && memcmp(dv1, dv2, sizeof(float) * nk) == 0;
            attention_softmax_backward(r1, r1, p, B, H, T, 1);                                    /* dlogits, in place */
            attention_softmax_backward_x(lh16, lh16, 1, ph16, 1, B, H, T, 1);
            xt &= bits_equal_values(lh16, r1, na);
            attention_logits_backward(dq1, dk1, dlr, qr, kr, B, T, H, KV, hd, 1);
            attention_logits_backward_x(dq2, dk2, 0, dlr, 0, qh, 1, kh, 1, B, T, H, KV, hd, 1);
            xd = memcmp(dq1, dq2, sizeof(float) * nq) == 0 && memcmp(dk1, dk2, sizeof(float) * nk) == 0;
            uint16_t *dqh = mallocCheck(2 * nq), *dkh = mallocCheck(2 * nk);   /* dq, dk as bf16 bits */
            attention_logits_backward_x(dqh, dkh, 1, dlr, 0, qh, 1, kh, 1, B, T, H, KV, hd, 1);
            xd &= bits_equal_values(dqh, dq1, nq) && bits_equal_values(dkh, dk1, nk);
            attention_logits_backward_x(dqh, dkh, 1, th16, 1, qh, 1, kh, 1, B, T, H, KV, hd, 1);   /* dlogits as bits */
            xt &= bits_equal_values(dqh, dq1, nq) && bits_equal_values(dkh, dk1, nk);
            if (attention_fused_supported(hd)) {
                attention_fused_forward(o1, qr, kr, vr, B, T, H, KV, hd, 1);
                attention_fused_forward_x(oh, 1, qh, 1, kh, 1, vh, 1, B, T, H, KV, hd, 1);
                xf &= bits_equal_values(oh, o1, nq);
                attention_fused_backward(dq1, dk1, dv1, gor, qr, kr, vr, B, T, H, KV, hd, 1);
                attention_fused_backward_x(dq2, dk2, 0, dv2, 0, goh, 1, qh, 1, kh, 1, vh, 1, B, T, H, KV, hd, 1);
                xf &= !memcmp(dq1, dq2, sizeof(float) * nq) && !memcmp(dk1, dk2, sizeof(float) * nk) && !memcmp(dv1, dv2, sizeof(float) * nk);
                attention_fused_backward_x(dq2, dk2, 0, dvh, 1, goh, 1, qh, 1, kh, 1, vh, 1, B, T, H, KV, hd, 1);
                xf &= !memcmp(dq1, dq2, sizeof(float) * nq) && !memcmp(dk1, dk2, sizeof(float) * nk);
                xf &= bits_equal_values(dvh, dv1, nk);
                memset(dvh, 0xff, 2 * nk);
                attention_fused_backward_x(dqh, dkh, 1, dvh, 1, goh, 1, qh, 1, kh, 1, vh, 1, B, T, H, KV, hd, 1);   /* dq, dk as bits too */
                xf &= bits_equal_values(dqh, dq1, nq) && bits_equal_values(dkh, dk1, nk) && bits_equal_values(dvh, dv1, nk);
            }
            free(dqh); free(dkh);
            check(xl && xo && xb && xd && xf && xt, "  B %d T %-3d H %d KV %d hd %-3d: q, k, v, out, dout, dv, dq, dk as bf16 bits: logits %s, out %s, dprobs+dv %s, dq+dk %s, fused %s; [B,H,T,T] as bits %s", B,
                  T, H, KV, hd, xl ? "=" : "DIFFER", xo ? "=" : "DIFFER", xb ? "=" : "DIFFER", xd ? "=" : "DIFFER",
                  attention_fused_supported(hd) ? (xf ? "=" : "DIFFER") : "n/a", xt ? "=" : "DIFFER");
            free(lh16); free(ph16); free(th16); free(dlr);
            free(vr); free(kr); free(qr); free(gor); free(dk1); free(dk2); free(vh); free(kh); free(qh); free(oh); free(goh); free(dvh);
        }
        /* the softmax and its backward (rows side by side) against their one-row specification: each row's sum in s
         * order; the backward's sum of probs * dprobs with the first 8 floor((t+1)/8) products rounded before their
         * add and the rest fused (on an FMA build), as cpu_kernels.h writes down */
        {
            q[(size_t)(T - 1) * H * hd + 1] = 0.5f; v[(size_t)(T / 2) * KV * hd + 3] = 0.5f;   /* finite: no NaN payloads to compare */
            attention_logits_forward(r1, q, k, B, T, H, KV, hd, 0);
            attention_softmax_forward(p, r1, B, H, T, 0);
            attention_softmax_backward(r2, dl, p, B, H, T, 0);
            int sp = 1, sb = 1;
            for (long long row = 0; row < (long long)B * H * T; row++) {
                int t = (int)(row % T);
                const float *lr = r1 + (size_t)row * T, *pr = p + (size_t)row * T, *dp = dl + (size_t)row * T;
                float mx = lr[0], sum = 0.0f, pd = 0.0f;
                for (int s = 1; s <= t; s++) mx = lr[s] > mx ? lr[s] : mx;
                for (int s = 0; s <= t; s++) { volatile float e = expf(lr[s] - mx); sum += e; }
                float inv = 1.0f / sum;
                for (int s = 0; s < T; s++) {
                    float want = s <= t ? expf(lr[s] - mx) * inv : 0.0f;
                    sp &= f32_bits(want) == f32_bits(pr[s]);
                }
                for (int s = 0; s <= t; s++) {
                    if (s < (t + 1) / 8 * 8) { volatile float prod = pr[s] * dp[s]; pd += prod; }
                    else {
#ifdef __FMA__
                        pd = fmaf(pr[s], dp[s], pd);
#else
                        volatile float prod = pr[s] * dp[s]; pd += prod;
#endif
                    }
                }
                for (int s = 0; s < T; s++) {
                    volatile float diff = dp[s] - pd;
                    float want = s <= t ? pr[s] * diff : 0.0f;
                    sb &= f32_bits(want) == f32_bits(r2[(size_t)row * T + s]);
                }
            }
            check(sp && sb, "  B %d T %-3d H %d KV %d hd %-3d: softmax %s, its backward %s its one-row specification", B, T, H, KV, hd,
                  sp ? "=" : "DIFFERS FROM", sb ? "=" : "DIFFERS FROM");
        }
        free(q); free(k); free(v); free(go); free(p); free(dl); free(r1); free(r2); free(o1); free(o2);
        free(dv1); free(dv2); free(dq1); free(dq2);
    }
}

/* every GEMM path this machine has (llmc/cpu/gemm.h), fp32 and bf16, against a double-precision product of the
 * same (bf16-valued) inputs, on shapes with every edge: M, N, K not multiples of any tile, K = 1, odd K, K = 0,
 * A read transposed, accumulating into C or not. Bound, from the summation order (one fp32 rounding per k
 * and per pair; bf16 products exact in fp32): |got - exact| <= (K + 2) 2^-24 (|c0| + sum_k |a_k b_k|).
 * Also per path: 1 vs 3 threads bitwise; B given transposed (W read as W^T) bitwise equal to B row-major; the
 * output rounded to bf16 inside the GEMM (round_out) bitwise equal to rounding it afterwards; the VDPBF16PS path equal bit for bit to dpbf16_ref (the scalar model
 * of its rounding, denormal inputs included); on an FMA build (-march=native) the fp32 SIMD paths equal
 * gemm_portable bit for bit (the same k-ordered FMAs). Catches: a tile edge computed wrong or left unwritten,
 * a lost K chunk or pair, a packer that swaps the pair halves, accumulate ignored, a thread-dependent
 * split of K, a change of summation order the header does not document. */
/* vexp.h: the vectorised expf against its scalar model bit for bit, and against libm's expf (glibc's algorithm with
 * FMA: equal bit for bit on a CPU with FMA, which is what keeps the trainer's SiLU and softmax bits). A sweep of every
 * 4099th float bit pattern (about a million: every exponent, both signs, NaN, infinities, the |x| >= 88 cases),
 * spans whose length is not a multiple of 16, in place. Catches a wrong table entry, a lost FMA, a lane order. */
static void test_vexp(void) {
    printf("vectorised expf (vexp.h)\n");
    enum { CH = 4096 };
    static float x[CH + 7], y[CH + 7], z[CH + 7];
    long n_ref = 0, n_lib = 0, total = 0;
    int fma_cpu = 0;
#if TSDC_VEXP_X86
    __builtin_cpu_init();
    fma_cpu = __builtin_cpu_supports("fma");
#endif
    uint64_t u = 0;
    while (u < (1ull << 32)) {
        int len = CH - (int)(total / CH % 13);   /* lengths that end mid-vector */
        int i = 0;
        for (; i < len && u < (1ull << 32); i++, u += 4099) { uint32_t b = (uint32_t)u; memcpy(&x[i], &b, 4); }
        len = i;
        memcpy(z, x, sizeof(float) * len);
        vexpf_span(y, x, len);
        vexpf_span(z, z, len);   /* in place */
        for (i = 0; i < len; i++) {
            float r = vexpf_ref(x[i]), l = expf(x[i]);
            uint32_t by = f32_bits(y[i]), bz = f32_bits(z[i]), br = f32_bits(r), bl = f32_bits(l);
            int nan = isnan(r) && isnan(y[i]) && isnan(z[i]);
            n_ref += !nan && (by != br || bz != br);
            n_lib += !(isnan(l) && isnan(y[i])) && by != bl;
        }
        total += len;
    }
    check(n_ref == 0, "  vexpf_span = vexpf_ref bit for bit, in place too (%ld of %ld differ)", n_ref, total);
    if (fma_cpu)
        check(n_lib == 0, "  vexpf_span = libm expf bit for bit on this FMA CPU (%ld of %ld differ)", n_lib, total);
    else
        printf("  (no FMA on this CPU: libm's expf is its non-FMA build, %ld of %ld differ from vexpf_ref)\n", n_lib, total);
}

/* The VDPBF16PS path's vectorised packers (gemm.h: gm_pack_a_bf16_rows, gm_pack_at_bf16, gm_pack_b_bf16_rows,
 * gm_pack_bt_bf16_vec) against the scalar packers byte for byte, on every panel of shapes with partial panels, odd K,
 * K below and across a 32-k block, and on inputs that are not bf16 values: NaNs (quieted, payload kept), infinities,
 * fp32 denormals (one rounds up to the smallest normal bf16), the largest float (rounds to inf), ties both ways.
 * Catches a pair's halves swapped, a tail pair or a partial panel not zeroed, a transpose lane off by one, a
 * rounding other than f32_to_bf16_bits' (VCVTNE2PS2BF16's denormal handling among them). Needs AVX-512F only. */
#if TSDC_GEMM_X86
/* A's panels (M x K) by the scalar packer from the fp32 values (A by rows, At its transpose) against the vectorised
 * one (form 0: by rows from Asrc; 1: read transposed from Atsrc), the sources fp32 or (h) bf16 bits: 1 when the
 * bytes differ */
static int pack_a_differs(int form, const float* A, const float* At, const void* Asrc, const void* Atsrc, int h, int M, int K,
                          uint16_t* a0, uint16_t* a1) {
    const int npa = (M + 11) / 12;
    const size_t pa = (size_t)((K + 1) / 2) * 24;
    memset(a0, 0xab, 2 * pa * npa); memset(a1, 0xcd, 2 * pa * npa);
    for (int p = 0; p < npa; p++) {
        const int m0 = p * 12, mr = M - m0 < 12 ? M - m0 : 12;
        if (form == 0) { gm_pack_a_bf16(a0 + p * pa, A, 0, K, 1, m0, mr, 0, K, 12); gm_pack_a_bf16_rows(a1, Asrc, h, K, M, K, p); }
        else gm_pack_a_bf16(a0 + p * pa, At, 0, 1, M, m0, mr, 0, K, 12);
    }
    if (form == 1) gm_pack_at_bf16(a1, Atsrc, h, M, M, K, 0, npa);
    return memcmp(a0, a1, 2 * pa * npa) != 0;
}
#endif
static void test_gemm_bf16_packers(void) {
#if TSDC_GEMM_X86
    if (gemm_machine_level() < GEMM_AVX512 || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) {
        printf("bf16 packers: no AVX-512 (F, BW and VL) on this CPU, skipped\n");
        return;
    }
    printf("VDPBF16PS path's vectorised packers vs the scalar ones\n");
    static const uint32_t special[] = {0x7f800001u, 0xffc12345u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x007fffffu, 0x807fffffu,
                                       0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0xbf818000u, 0x00008000u, 0x7fffffffu};
    const int nsp = (int)(sizeof(special) / sizeof(special[0]));
    struct { int M, K, N; } sh[] = {{1, 1, 1}, {13, 7, 33}, {12, 32, 32}, {25, 33, 65}, {37, 129, 200}, {5, 64, 17}, {24, 1031, 40}};
    /* bf16 bit patterns a stored tensor can hold after a fault: signalling and quiet NaNs, infinities, denormals */
    static const uint16_t hsp[] = {0x7f81, 0xff81, 0x7fc0, 0x7f80, 0xff80, 0x0001, 0x8001, 0x7f7f, 0x3f80, 0xffff, 0x7fbf, 0x8000};
    const int nhs = (int)(sizeof(hsp) / sizeof(hsp[0]));
    long bad[7] = {0, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < (int)(sizeof(sh) / sizeof(sh[0])); s++) {
        const int M = sh[s].M, K = sh[s].K, N = sh[s].N, kp = (K + 1) / 2;
        const int npa = (M + 11) / 12, npb = (N + 31) / 32;
        const size_t pa = (size_t)kp * 24, pb = (size_t)kp * 64;
        float *A = mallocCheck(sizeof(float) * M * K), *At = mallocCheck(sizeof(float) * M * K);
        float *B = mallocCheck(sizeof(float) * K * N), *Bt = mallocCheck(sizeof(float) * K * N);
        fill_normal(A, (size_t)M * K, 71 + s, 1); fill_normal(B, (size_t)K * N, 73 + s, 1);
        for (int i = 0; i < M * K; i += 3) memcpy(&A[i], &special[(i / 3) % nsp], 4);
        for (int i = 1; i < K * N; i += 4) memcpy(&B[i], &special[(i / 4) % nsp], 4);
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) At[(size_t)k * M + m] = A[(size_t)m * K + k];
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) Bt[(size_t)n * K + k] = B[(size_t)k * N + n];
        uint16_t *a0 = mallocCheck(2 * pa * npa), *a1 = mallocCheck(2 * pa * npa), *b0 = mallocCheck(2 * pb * npb), *b1 = mallocCheck(2 * pb * npb);
        for (int form = 0; form < 2; form++) bad[form] += pack_a_differs(form, A, At, A, At, 0, M, K, a0, a1);   /* by rows, transposed */
        for (int form = 0; form < 2; form++) {   /* B row-major, B given transposed */
            memset(b0, 0xab, 2 * pb * npb); memset(b1, 0xcd, 2 * pb * npb);
            for (int p = 0; p < npb; p++) {
                const int n0 = p * 32, nr = N - n0 < 32 ? N - n0 : 32;
                if (form == 0) gm_pack_b_bf16(b0 + p * pb, B, N, n0, nr, 0, K, 32);
                else { gm_pack_bt_bf16(b0 + p * pb, Bt, K, n0, nr, 32); gm_pack_bt_bf16_vec(b1, Bt, N, K, p); }
            }
            if (form == 0) gm_pack_b_bf16_rows(b1, B, 0, N, K, 0, npb);
            bad[2 + form] += memcmp(b0, b1, 2 * pb * npb) != 0;
        }
        /* B row-major and A (by rows, and read transposed) given as bf16 bits (-precision bf16's storage), the
         * patterns above among them (loaded as they are, a NaN quieted): the scalar packer's bytes of the values they
         * widen to */
        uint16_t* Bh = mallocCheck(sizeof(uint16_t) * K * N);
        for (size_t i = 0; i < (size_t)K * N; i++) {
            Bh[i] = i % 5 == 2 ? hsp[(i / 5) % nhs] : f32_to_bf16_bits(B[i]);
            B[i] = bf16_bits_to_f32(Bh[i]);
        }
        memset(b0, 0xab, 2 * pb * npb); memset(b1, 0xcd, 2 * pb * npb);
        for (int p = 0; p < npb; p++) gm_pack_b_bf16(b0 + p * pb, B, N, p * 32, N - p * 32 < 32 ? N - p * 32 : 32, 0, K, 32);
        gm_pack_b_bf16_rows(b1, Bh, 1, N, K, 0, npb);
        bad[4] += memcmp(b0, b1, 2 * pb * npb) != 0;
        free(Bh);
        uint16_t *Ah = mallocCheck(sizeof(uint16_t) * M * K), *Aht = mallocCheck(sizeof(uint16_t) * M * K);
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) {
                const size_t i = (size_t)m * K + k;
                Ah[i] = i % 4 == 1 ? hsp[(i / 4) % nhs] : f32_to_bf16_bits(A[i]);
                Aht[(size_t)k * M + m] = Ah[i];
                A[i] = At[(size_t)k * M + m] = bf16_bits_to_f32(Ah[i]);
            }
        for (int form = 0; form < 2; form++) bad[5 + form] += pack_a_differs(form, A, At, Ah, Aht, 1, M, K, a0, a1);
        free(Ah); free(Aht);
        free(A); free(At); free(B); free(Bt); free(a0); free(a1); free(b0); free(b1);
    }
    const int n = (int)(sizeof(sh) / sizeof(sh[0]));
    check(bad[0] == 0, "  A by rows (gm_pack_a_bf16_rows): %d shapes, %ld differ from gm_pack_a_bf16", n, bad[0]);
    check(bad[1] == 0, "  A read transposed (gm_pack_at_bf16): %d shapes, %ld differ from gm_pack_a_bf16", n, bad[1]);
    check(bad[2] == 0, "  B row-major (gm_pack_b_bf16_rows): %d shapes, %ld differ from gm_pack_b_bf16", n, bad[2]);
    check(bad[3] == 0, "  B given transposed (gm_pack_bt_bf16_vec): %d shapes, %ld differ from gm_pack_bt_bf16", n, bad[3]);
    check(bad[4] == 0, "  B row-major as bf16 bits, NaNs among them (gm_pack_b_bf16_rows): %d shapes, %ld differ from gm_pack_b_bf16", n, bad[4]);
    check(bad[5] == 0, "  A by rows as bf16 bits, NaNs among them (gm_pack_a_bf16_rows): %d shapes, %ld differ from gm_pack_a_bf16", n, bad[5]);
    check(bad[6] == 0, "  A transposed as bf16 bits, NaNs among them (gm_pack_at_bf16): %d shapes, %ld differ from gm_pack_a_bf16", n, bad[6]);
#endif
}

static void test_gemm_paths(void) {
    printf("GEMM paths (this CPU offers up to %s)\n", gemm_path_names[gemm_machine_level()]);
    struct { int M, K, N, tr, acc; } sh[] = {{37, 129, 200, 0, 0}, {1, 1, 1, 0, 1}, {13, 7, 33, 1, 1}, {192, 512, 256, 0, 0},
                                            {200, 1031, 300, 1, 0}, {64, 64, 64, 0, 1}, {33, 1000, 17, 1, 1}, {5, 0, 9, 0, 0},
                                            {300, 96, 530, 0, 1}, {40, 3100, 70, 1, 1}, {6, 0, 10, 0, 1}};   /* K 3100: several chunks on every path */
    int nsh = (int)(sizeof(sh) / sizeof(sh[0]));
    int top = gemm_machine_level(), saved_threads = omp_get_max_threads();
    for (int lv = 0; lv <= top; lv++) {
        gemm_set_level(lv);
        for (int bf = 0; bf < 2; bf++) {
            double worst = 0;
            int same_threads = 1, same_portable = 1, same_bt = 1, same_round = 1, same_ah = 1, same_c16 = 1, same_bh = 1, same_c16acc = 1;
            for (int s = 0; s < nsh; s++) {
                int M = sh[s].M, K = sh[s].K, N = sh[s].N;
                long sam = sh[s].tr ? 1 : K, sak = sh[s].tr ? M : 1;
                size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
                float *A = mallocCheck(sizeof(float) * (na + 1)), *B = mallocCheck(sizeof(float) * (nb + 1));
                float *C0 = mallocCheck(sizeof(float) * nc), *C1 = mallocCheck(sizeof(float) * nc), *C3 = mallocCheck(sizeof(float) * nc);
                fill_normal(A, na, 11 + s, 1); fill_normal(B, nb, 31 + s, 1); fill_normal(C0, nc, 51 + s, 1);
                bf16_round_array(A, (long long)na); bf16_round_array(B, (long long)nb); bf16_round_array(C0, (long long)nc);
                void (*g)(float*, const float*, long, long, const float*, int, int, int, int) = bf ? gemm_bf16 : gemm_f32;
                memcpy(C1, C0, sizeof(float) * nc); memcpy(C3, C0, sizeof(float) * nc);
                omp_set_num_threads(1); g(C1, A, sam, sak, B, M, K, N, sh[s].acc);
                omp_set_num_threads(3); g(C3, A, sam, sak, B, M, K, N, sh[s].acc);
                same_threads &= memcmp(C1, C3, sizeof(float) * nc) == 0;
                /* B given transposed (a weight read as W^T): the same packed panels, so the same bits */
                float* Bt = mallocCheck(sizeof(float) * (nb + 1));
                for (int k = 0; k < K; k++)
                    for (int n = 0; n < N; n++) Bt[(size_t)n * K + k] = B[(size_t)k * N + n];
                memcpy(C3, C0, sizeof(float) * nc);
                (bf ? gemm_bf16_x : gemm_f32_x)(C3, A, sam, sak, Bt, 1, M, K, N, sh[s].acc, 0);
                same_bt &= memcmp(C1, C3, sizeof(float) * nc) == 0;
                /* round_out: the output stored as bf16 tile by tile = rounding it afterwards */
                memcpy(C3, C0, sizeof(float) * nc);
                (bf ? gemm_bf16_x : gemm_f32_x)(C3, A, sam, sak, B, 0, M, K, N, sh[s].acc, 1);
                float* Cr = mallocCheck(sizeof(float) * nc);
                memcpy(Cr, C1, sizeof(float) * nc);
                bf16_round_array(Cr, (long long)nc);
                same_round &= memcmp(Cr, C3, sizeof(float) * nc) == 0;
                free(Cr);
                /* A stored as bf16 bits (-precision bf16's storage), widened as it is packed: C1's bits. Not accumulating,
                 * C stored as bf16 bits (W read as W^T, the classifier's form; A fp32 or bf16 bits): C1 rounded, and with
                 * a softcap, softcap_forward's arithmetic on C1, rounded */
                uint16_t* Ah = mallocCheck(sizeof(uint16_t) * (na + 1));
                for (size_t i = 0; i < na; i++) Ah[i] = f32_to_bf16_bits(A[i]);
                memcpy(C3, C0, sizeof(float) * nc);
                gemm_x(bf, C3, NULL, 0.0f, Ah, 1, sam, sak, B, 0, 0, M, K, N, sh[s].acc, 0);
                same_ah &= memcmp(C1, C3, sizeof(float) * nc) == 0;
                /* B row-major stored as bf16 bits (the dW products' input, an MLP hidden tensor), A fp32 or bf16 bits */
                uint16_t* Bh = mallocCheck(sizeof(uint16_t) * (nb + 1));
                for (size_t i = 0; i < nb; i++) Bh[i] = f32_to_bf16_bits(B[i]);
                for (int v = 0; v < 2; v++) {
                    memcpy(C3, C0, sizeof(float) * nc);
                    gemm_x(bf, C3, NULL, 0.0f, v ? (const void*)Ah : (const void*)A, v, sam, sak, Bh, 1, 0, M, K, N, sh[s].acc, 0);
                    same_bh &= memcmp(C1, C3, sizeof(float) * nc) == 0;
                }
                free(Bh);
                if (!sh[s].acc) {
                    uint16_t* Ch = mallocCheck(sizeof(uint16_t) * (nc + 1));
                    for (int v = 0; v < 3; v++) {
                        const float cap = v == 2 ? 1.5f : 0.0f;
                        memset(Ch, 0xff, sizeof(uint16_t) * nc);
                        gemm_x(bf, NULL, Ch, cap, v == 0 ? (const void*)A : (const void*)Ah, v > 0, sam, sak, Bt, 0, 1, M, K, N, 0, 0);
                        for (size_t i = 0; i < nc; i++) same_c16 &= Ch[i] == f32_to_bf16_bits(cap > 0 ? cap * tanhf(C1[i] / cap) : C1[i]);
                    }
                    /* B row-major (a dx product's W), C stored as bf16 bits: C1 rounded */
                    memset(Ch, 0xff, sizeof(uint16_t) * nc);
                    gemm_x(bf, NULL, Ch, 0.0f, Ah, 1, sam, sak, B, 0, 0, M, K, N, 0, 0);
                    for (size_t i = 0; i < nc; i++) same_c16 &= Ch[i] == f32_to_bf16_bits(C1[i]);
                    free(Ch);
                } else {
                    /* C stored as bf16 bits, the product added to fp32 partial sums in C (a dx summed over products, the
                     * last one storing the sum's bits): C1 rounded, and C left as it was */
                    uint16_t* Ch = mallocCheck(sizeof(uint16_t) * (nc + 1));
                    memset(Ch, 0xff, sizeof(uint16_t) * nc);
                    memcpy(C3, C0, sizeof(float) * nc);
                    gemm_x(bf, C3, Ch, 0.0f, Ah, 1, sam, sak, B, 0, 0, M, K, N, 1, 0);
                    for (size_t i = 0; i < nc; i++) same_c16acc &= Ch[i] == f32_to_bf16_bits(C1[i]);
                    same_c16acc &= memcmp(C3, C0, sizeof(float) * nc) == 0;
                    free(Ch);
                }
                free(Ah);
                free(Bt);
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < N; n++) {
                        double c0 = sh[s].acc ? C0[(size_t)m * N + n] : 0.0, e = c0, mag = fabs(c0);
                        for (int k = 0; k < K; k++) {
                            double p = (double)A[m * sam + k * sak] * B[(size_t)k * N + n];
                            e += p; mag += fabs(p);
                        }
                        double r = fabs(C1[(size_t)m * N + n] - e) / ((K + 2) * ldexp(mag, -24) + 1e-300);
                        if (!(r <= worst)) worst = r;
                    }
#ifdef __FMA__
                if (!bf && lv <= GEMM_AVX512 && lv > GEMM_PORTABLE) {
                    memcpy(C3, C0, sizeof(float) * nc);
                    gemm_portable(C3, A, sam, sak, B, M, K, N, sh[s].acc);
                    same_portable &= memcmp(C1, C3, sizeof(float) * nc) == 0;
                }
#endif
                free(A); free(B); free(C0); free(C1); free(C3);
            }
            (void)same_portable;   /* compared on an FMA build only */
            const char* path = bf ? gemm_bf16_path() : gemm_f32_path();
            check(worst <= 1.0, "  %-10s %s: %d shapes, worst error / bound %.3f", path, bf ? "bf16" : "fp32", nsh, worst);
            check(same_threads, "  %-10s %s: 1 vs 3 threads bitwise", path, bf ? "bf16" : "fp32");
            check(same_bt, "  %-10s %s: B given transposed = B row-major, bitwise", path, bf ? "bf16" : "fp32");
            check(same_round, "  %-10s %s: output rounded to bf16 by the GEMM = rounded after it, bitwise", path, bf ? "bf16" : "fp32");
            check(same_ah, "  %-10s %s: A stored as bf16 bits = the fp32 array of its values, bitwise", path, bf ? "bf16" : "fp32");
            check(same_bh, "  %-10s %s: B stored as bf16 bits (A fp32 or bf16 bits) = the fp32 arrays, bitwise", path, bf ? "bf16" : "fp32");
            check(same_c16, "  %-10s %s: C stored as bf16 bits (softcap 0 and 1.5) = C rounded after, bitwise", path, bf ? "bf16" : "fp32");
            check(same_c16acc, "  %-10s %s: C stored as bf16 bits adding to fp32 partial sums = C accumulated and rounded, bitwise",
                  path, bf ? "bf16" : "fp32");
#ifdef __FMA__
            if (!bf && lv <= GEMM_AVX512 && lv > GEMM_PORTABLE) check(same_portable, "  %-10s fp32 = gemm_portable bit for bit (FMA build)", path);
#endif
        }
    }
    if (top >= GEMM_AVX512BF16) {
        /* VDPBF16PS against its scalar model, with bf16 denormals and values near the fp32 denormal range */
        gemm_set_level(GEMM_AVX512BF16);
        int M = 29, K = 77, N = 45;
        float *A = mallocCheck(sizeof(float) * M * K), *B = mallocCheck(sizeof(float) * K * N), *C = mallocCheck(sizeof(float) * M * N);
        fill_normal(A, (size_t)M * K, 7, 1); fill_normal(B, (size_t)K * N, 8, 1);
        for (int i = 0; i < M * K; i++) A[i] = bf16_round(i % 5 == 0 ? A[i] * 1e-39f : i % 5 == 1 ? A[i] * 1e-20f : A[i]);
        for (int i = 0; i < K * N; i++) B[i] = bf16_round(i % 7 == 0 ? B[i] * 1e-19f : B[i]);
        gemm_bf16(C, A, K, 1, B, M, K, N, 0);
        long bad = 0;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                float c = 0.0f;
                for (int q = 0; q < (K + 1) / 2; q++) {
                    int k0 = 2 * q, k1 = 2 * q + 1;
                    c = dpbf16_ref(c, f32_to_bf16_bits(A[m * K + k0]), k1 < K ? f32_to_bf16_bits(A[m * K + k1]) : 0,
                                   f32_to_bf16_bits(B[(size_t)k0 * N + n]), k1 < K ? f32_to_bf16_bits(B[(size_t)k1 * N + n]) : 0);
                }
                bad += f32_bits(c) != f32_bits(C[(size_t)m * N + n]);
            }
        check(bad == 0, "  avx512bf16 = dpbf16_ref bit for bit (%ld of %d differ; denormal inputs read as zero)", bad, M * N);
        free(A); free(B); free(C);
    }
    gemm_set_level(top);
    omp_set_num_threads(saved_threads);
    /* the cap: a level above the machine's is refused */
    check(gemm_set_level(top + 1) != 0 && gemm_level() == top, "  a level above the machine's (%d) is refused", top + 1);
}

#ifdef _OPENMP
/* a GEMM and a whole tiny-qwen3 forward + backward, 1 vs 3 threads: bitwise equal. Catches: a reduction whose
 * order follows the thread split (results that change with -threads or the machine). */
/* one column (row) at a time, each product rounded and then added, as the kernels define it (contraction off) */
__attribute__((optimize("fp-contract=off"))) static void norm_dw_ref(float* dw, const float* g, const float* x, const float* ms,
                                                                      int rows, int C, float eps) {
    for (int i = 0; i < C; i++) {
        float t = 0.0f;
        for (int r = 0; r < rows; r++) t += g[(size_t)r * C + i] * (x[(size_t)r * C + i] * (1.0f / sqrtf(ms[r] + eps)));
        dw[i] += t;
    }
}
__attribute__((optimize("fp-contract=off"))) static float norm_sumsq_ref(const float* x, int C) {
    float a = 0.0f;
    for (int i = 0; i < C; i++) a += x[i] * x[i];
    return a;
}
static void test_thread_independence(void) {
    printf("bitwise independence from the thread count\n");
    int M = 37, K = 129, N = 200;
    float *A = mallocCheck(sizeof(float) * M * K), *B = mallocCheck(sizeof(float) * K * N);
    float *C1 = mallocCheck(sizeof(float) * M * N), *C2 = mallocCheck(sizeof(float) * M * N);
    fill_normal(A, (size_t)M * K, 1, 1); fill_normal(B, (size_t)K * N, 2, 1);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1); gemm_nn(C1, A, K, 1, B, M, K, N, 0);
    omp_set_num_threads(3); gemm_nn(C2, A, K, 1, B, M, K, N, 0);
    check(memcmp(C1, C2, sizeof(float) * M * N) == 0, "  GEMM 37x129x200, 1 vs 3 threads");
    /* the deterministic sum of squares (the gradient norms): chunks summed side by side, the bits of one chunk at
     * a time, at sizes with and without a partial group of chunks and a partial last chunk, any thread count */
    {
        size_t sizes[4] = {1000, 8 * SUM_CHUNK, 19 * SUM_CHUNK + 77, 64 * SUM_CHUNK + 5};
        size_t nmax = sizes[3];
        float* x = mallocCheck(sizeof(float) * nmax);
        fill_normal(x, nmax, 3, 1);
        for (size_t i = 0; i < nmax; i += 97) x[i] *= 1e4f;   /* a wide range of magnitudes: order matters */
        int same = 1;
        for (int k = 0; k < 4; k++) {
            double ref = sumsq_det_ref(x, sizes[k]);
            omp_set_num_threads(1); double a = sumsq_det(x, sizes[k]);
            omp_set_num_threads(3); double b = sumsq_det(x, sizes[k]);
            same &= memcmp(&a, &ref, sizeof(double)) == 0 && memcmp(&b, &ref, sizeof(double)) == 0;
        }
        check(same, "  sumsq_det = one chunk at a time, bit for bit, 1 and 3 threads (4 sizes)");
        free(x);
    }
    /* RMSNorm's weight gradient (columns walked 16 at a time) against one column at a time, bit for bit, at a width
     * with a partial block of columns */
    {
        int rows = 67, C = 72;
        float *x = mallocCheck(sizeof(float) * rows * C), *g = mallocCheck(sizeof(float) * rows * C);
        float *ms = mallocCheck(sizeof(float) * rows), *dx = mallocCheck(sizeof(float) * rows * C);
        float *dw = mallocCheck(sizeof(float) * C), *ref = mallocCheck(sizeof(float) * C), *w = mallocCheck(sizeof(float) * C);
        fill_normal(x, (size_t)rows * C, 4, 1); fill_normal(g, (size_t)rows * C, 5, 1); fill_normal(w, C, 6, 1);
        for (int r = 0; r < rows; r++) { double a = 0; for (int i = 0; i < C; i++) a += (double)x[r * C + i] * x[r * C + i]; ms[r] = (float)(a / C); }
        for (int i = 0; i < C; i++) dw[i] = ref[i] = 0.25f * (float)i;
        norm_dw_ref(ref, g, x, ms, rows, C, 1e-5f);
        omp_set_num_threads(3);
        rmsnorm_backward(dx, dw, g, x, w, ms, rows, C, 1e-5f, 0);
        check(memcmp(dw, ref, sizeof(float) * C) == 0, "  RMSNorm dw = one column at a time, bit for bit (67 rows x 72)");
        /* the forward's mean squares (rows summed side by side) against one row at a time */
        float* ms2 = mallocCheck(sizeof(float) * rows);
        int same_ms = 1;
        rmsnorm_forward(dx, ms2, x, w, rows, C, 1e-5f);
        for (int r = 0; r < rows; r++) {
            float m = norm_sumsq_ref(x + (size_t)r * C, C) / C;
            same_ms &= memcmp(&m, &ms2[r], sizeof(float)) == 0;
        }
        check(same_ms, "  RMSNorm forward mean squares = one row at a time, bit for bit (67 rows, a partial block of 8)");
        free(ms2);
        free(x); free(g); free(ms); free(dx); free(dw); free(ref); free(w);
    }
    /* a full forward + backward of tiny-qwen3 (GQA, QK norm), on the materialised and on the fused attention */
    Config c = *preset_find("tiny-qwen3");
    c.vocab_size = 256; c.seq_len = 16;
    Model m[4];
    for (int pass = 0; pass < 4; pass++) {
        omp_set_num_threads(pass & 1 ? 3 : 1);
        model_build(&m[pass], &c, 2, 16, 0);
        model_set_attention_mode(&m[pass], pass < 2 ? ATT_MATERIALISED : ATT_FUSED);
        model_init_weights(&m[pass], 5);
        model_prepare_weights(&m[pass]);
        for (int i = 0; i < 32; i++) { m[pass].inputs[i] = (i * 37) % 256; m[pass].targets[i] = (i * 91 + 3) % 256; }
        model_forward(&m[pass], 2, 16, m[pass].targets);
        model_backward(&m[pass], 2, 16, m[pass].targets, 1.0f / 32);
    }
    size_t gb = sizeof(float) * m[0].L.total;
    check(memcmp(m[0].grads, m[1].grads, gb) == 0, "  tiny-qwen3 forward+backward gradients, 1 vs 3 threads");
    check(memcmp(m[0].grads, m[2].grads, gb) == 0 && memcmp(m[0].grads, m[3].grads, gb) == 0 && m[2].la[0].fused && !m[0].la[0].fused &&
          !m[2].att_mem && m[0].att_mem,
          "  ... the same gradients on the fused attention at 1 and 3 threads (and no [B,H,T,T] buffer allocated)");
    for (int pass = 0; pass < 4; pass++) model_free(&m[pass]);
    omp_set_num_threads(saved);
    free(A); free(B); free(C1); free(C2);
}
#endif

/* ---------------------------------------------------------------------------- initialisation */
/* the counter-based generator of llmc/cpu/init.h: its log and sin/cos against libm in double over every
 * input they take, the normal's moments and tails, thread-count independence, and pinned bits (the GPU
 * kernel is compared with this host code by test_sdc_cu; the pins notice a change of either). Catches: an
 * inaccurate log or sin/cos (a biased or heavy-tailed normal), correlated draws, two tensors with the same
 * stream, norm weights not 1, weights that depend on the thread count, an unnoticed change of the draws. */
#define INIT_PIN_SUM 0xd3411a7b1f49283cULL     /* tsdc_checksum of tiny-llama's initial weights, seed 8 */
static void test_init(void) {
    printf("weight initialisation: counter-based normal draws (llmc/cpu/init.h)\n");
    double e_log = 0;
    for (uint32_t k = 1; k <= (1u << 24); k++) {
        double e = fabs((double)init_log_u24(k) - log((double)k / 16777216.0));
        if (e > e_log) e_log = e;
    }
    check(e_log < 2e-6, "  ln u for every u = k 2^-24, k = 1..2^24: max abs error %.2e vs libm in double (want < 2e-6)", e_log);
    double e_sc = 0;
    for (uint32_t f = 0; f < (1u << 22); f++) {
        float t = (float)(2u * f + 1u) * (1.5707963267948966f / 8388608.0f), c, s;
        init_sincos(t, &c, &s);
        double ec = fabs((double)c - cos((double)t)), es = fabs((double)s - sin((double)t));
        if (ec > e_sc) e_sc = ec;
        if (es > e_sc) e_sc = es;
    }
    check(e_sc < 5e-7, "  cos, sin at every angle of a quadrant (2^22): max abs error %.2e vs libm in double (want < 5e-7)", e_sc);
    /* the normal draws: moments, tails, correlation of neighbours, against N(0, 1) */
    size_t n = (size_t)1 << 23;
    float* z = (float*)mallocCheck(sizeof(float) * n);
    init_fill_normal(z, n, init_tensor_key(8, 3), 1.0f);
    double m1 = 0, m2 = 0, m4 = 0, c01 = 0, c12 = 0, zmax = 0; size_t t2 = 0, t3 = 0, t4 = 0;
    for (size_t i = 0; i < n; i++) {
        double x = z[i];
        m1 += x; m2 += x * x; m4 += x * x * x * x;
        if (fabs(x) > 2) t2++;
        if (fabs(x) > 3) t3++;
        if (fabs(x) > 4) t4++;
        if (fabs(x) > zmax) zmax = fabs(x);
        if (i + 1 < n) { if (i & 1) c12 += x * z[i + 1]; else c01 += x * z[i + 1]; }
    }
    m1 /= n; m2 /= n; m4 /= n; c01 /= n / 2; c12 /= n / 2;
    double p2 = (double)t2 / n, p3 = (double)t3 / n, p4 = (double)t4 / n, se = 1 / sqrt((double)n);
    check(fabs(m1) < 4 * se && fabs(m2 - 1) < 4 * sqrt(2.0) * se && fabs(m4 / (m2 * m2) - 3) < 4 * sqrt(96.0) * se,
          "  2^23 draws: mean %+.5f, variance %.5f, kurtosis %.4f (N(0,1): 0, 1, 3; 4 standard errors)", m1, m2, m4 / (m2 * m2));
    check(fabs(p2 - 0.0455003) < 4 * sqrt(0.0455 / n) && fabs(p3 - 0.0026998) < 4 * sqrt(0.0027 / n) && fabs(p4 - 6.334e-5) < 4 * sqrt(6.334e-5 / n),
          "  tails P(|z|>2) %.5f, P(|z|>3) %.6f, P(|z|>4) %.2e (N(0,1): 0.04550, 0.002700, 6.33e-05); max |z| %.2f", p2, p3, p4, zmax);
    check(fabs(c01) < 4 * se * sqrt(2.0) && fabs(c12) < 4 * se * sqrt(2.0),
          "  neighbours uncorrelated: E[z_2j z_2j+1] %+.5f (a pair), E[z_2j+1 z_2j+2] %+.5f (across pairs)", c01, c12);
    free(z);
    /* whole models: ones for norm weights, distinct tensors, independent of the thread count, pinned bits */
    Config c = *preset_find("tiny-llama");
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    param_layout_build(&c, L);
    float *p1 = (float*)mallocCheck(sizeof(float) * L->total), *p2v = (float*)mallocCheck(sizeof(float) * L->total);
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    omp_set_num_threads(1); init_weights_cpu(p1, L, 8);
    omp_set_num_threads(3); init_weights_cpu(p2v, L, 8);
    omp_set_num_threads(saved);
    check(!memcmp(p1, p2v, sizeof(float) * L->total), "  tiny-llama weights, 1 vs 3 threads: bitwise equal");
#else
    init_weights_cpu(p1, L, 8);
#endif
    int ones = 1, distinct = 1;
    for (int i = 0; i < L->n; i++) {
        const TensorInfo* t = &L->t[i];
        if (t->rows == 1) { for (size_t j = 0; j < t->numel; j++) if (p1[t->offset + j] != 1.0f) ones = 0; }
        for (int k = 0; k < i; k++)
            if (L->t[k].rows > 1 && t->rows > 1 && !memcmp(p1 + t->offset, p1 + L->t[k].offset, 64)) distinct = 0;
    }
    check(ones && distinct, "  tiny-llama: norm weights 1, every matrix's draws its own (%d tensors)", L->n);
    init_weights_cpu(p2v, L, 9);
    check(memcmp(p1, p2v, sizeof(float) * L->total) != 0, "  another seed, other weights");
    uint64_t sum = tsdc_checksum(p1, sizeof(float) * L->total);
    check(sum == INIT_PIN_SUM, "  pinned: tiny-llama seed 8 weights checksum %016llx (want %016llx), w[0..1] = %08x %08x",
          (unsigned long long)sum, (unsigned long long)INIT_PIN_SUM, f32_bits(p1[0]), f32_bits(p1[1]));
    free(p1); free(p2v); free(L);
}

/* -bench_init PRESET: the time to initialise a preset's weights into a fresh allocation, as the trainer */
static int bench_init(const char* preset) {
    const Config* c = preset_find(preset);
    if (!c) { fprintf(stderr, "bench_init: unknown preset %s\n", preset); return 1; }
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    param_layout_build(c, L);
    float* p = (float*)callocCheck(L->total, sizeof(float));
    double t0 = wall_seconds();
    init_weights_cpu(p, L, 8);
    double dt = wall_seconds() - t0;
    t0 = wall_seconds();
    init_weights_cpu(p, L, 9);
    double dt2 = wall_seconds() - t0;
#ifdef _OPENMP
    int th = omp_get_max_threads();
#else
    int th = 1;
#endif
    printf("init: %s %.4g weights in %.2f s (%.2f ns a weight, %d threads; fresh calloc, page faults included); "
           "again into the same memory %.2f s\n", preset, (double)L->total, dt, 1e9 * dt / L->total, th, dt2);
    free(p); free(L);
    return 0;
}

/* -protect ew's compare mode (EW_CMP): each element-wise kernel run again over its stored output compares instead of
 * storing. Clean: no difference reported; one bit flipped in the stored output (the lowest bit of its storage: bf16
 * bits, or a float rounded to bf16, or an fp32 float) at the first and last element of a block, of a row, of the
 * tensor and in the middle: reported, in the right output's bit (mul_backward_x's second output: bit 1). Catches: a
 * compare that skips an element (the first or last of a block or row), reads the wrong block or row, compares
 * unrounded values, or reports the wrong output. */
static void ew_cmp_kernel(int k, void* o, void* o2, int oh, int round, const uint16_t* a, const uint16_t* b, const uint16_t* g,
                          const float* w, float* ms, size_t n, int rows, int C) {
    switch (k) {
    case 0: silu_forward_x(o, oh, a, 1, n, round); break;
    case 1: mul_forward_x(o, oh, a, b, 1, n, round); break;
    case 2: relu2_forward_x(o, oh, a, 1, n, round); break;
    case 3: residual_forward_x(o, oh, a, 1, b, 1, n, round); break;
    case 4: rmsnorm_forward_x(o, oh, ms, a, 1, w, rows, C, 1e-5f, round); break;
    case 5: silu_backward_x(o, oh, g, a, 1, n, round); break;
    case 6: relu2_backward_x(o, oh, g, a, 1, n, round); break;
    default: mul_backward_x(o, o2, oh, g, a, b, 1, n, round); break;
    }
}
static void test_ew_compare_mode(void) {
    printf("-protect ew's compare mode: clean runs quiet, one flipped bit anywhere reported\n");
    const int rows = 45, C = 300;   /* 13500 elements: three EW_BLK blocks and a partial one; rows of 300 */
    const size_t n = (size_t)rows * C;
    float *f = mallocCheck(4 * n), *w = mallocCheck(4 * C), *ms = mallocCheck(4 * rows);
    float *o32 = mallocCheck(4 * n), *o32b = mallocCheck(4 * n);
    uint16_t *a = mallocCheck(2 * n), *b = mallocCheck(2 * n), *g = mallocCheck(2 * n), *o16 = mallocCheck(2 * n), *o16b = mallocCheck(2 * n);
    fill_normal(f, n, 31, 2); for (size_t i = 0; i < n; i++) a[i] = f32_to_bf16_bits(f[i]);
    fill_normal(f, n, 32, 1); for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16_bits(f[i]);
    fill_normal(f, n, 33, 1e-2f); for (size_t i = 0; i < n; i++) g[i] = f32_to_bf16_bits(f[i]);
    fill_normal(w, C, 34, 1);
    const size_t pos[] = {0, 1, (size_t)C - 1, (size_t)C, EW_BLK - 1, EW_BLK, 2 * EW_BLK + 1, n / 2, n - 1};
    const char* names[] = {"silu", "product", "ReLU^2", "residual add", "RMSNorm", "silu backward", "ReLU^2 backward", "product backward"};
    ew_cmp_take();
    for (int k = 0; k < 8; k++) {
        int ok = 1;
        for (int mode = 0; mode < 3; mode++) {   /* bf16 output; fp32 output rounded to bf16; fp32 output */
            const int oh = mode == 0, round = mode != 2;
            void *o = oh ? (void*)o16 : (void*)o32, *o2 = oh ? (void*)o16b : (void*)o32b;
            ew_cmp_kernel(k, o, o2, oh, round, a, b, g, w, ms, n, rows, C);
            ew_cmp_kernel(k, o, o2, oh | EW_CMP, round, a, b, g, w, ms, n, rows, C);
            ok &= ew_cmp_take() == 0;
            for (int out = 0; out < (k == 7 ? 2 : 1); out++)
                for (size_t pi = 0; pi < sizeof(pos) / sizeof(pos[0]); pi++) {
                    void* t = out ? o2 : o;
                    const size_t i = pos[pi];
                    if (oh) ((uint16_t*)t)[i] ^= 1;
                    else ((uint32_t*)t)[i] ^= round ? 1u << 16 : 1u;
                    ew_cmp_kernel(k, o, o2, oh | EW_CMP, round, a, b, g, w, ms, n, rows, C);
                    ok &= ew_cmp_take() == (out ? 2u : 1u);
                    if (oh) ((uint16_t*)t)[i] ^= 1;
                    else ((uint32_t*)t)[i] ^= round ? 1u << 16 : 1u;
                }
            ew_cmp_kernel(k, o, o2, oh | EW_CMP, round, a, b, g, w, ms, n, rows, C);
            ok &= ew_cmp_take() == 0;
        }
        check(ok, "  %s", names[k]);
    }
    free(f); free(w); free(ms); free(o32); free(o32b); free(a); free(b); free(g); free(o16); free(o16b);
}

/* -precision bf16's storage of activations as bf16 bits: each element-wise kernel's _x form (SiLU, the product, ReLU^2,
 * the residual add, RMSNorm), the bound's row norms and comparison, and the fault injector on bf16 bits, against the
 * fp32 forms on float arrays holding the same values, bit for bit (n spanning several EW_BLK blocks and a partial one; values of both signs, zeros, a NaN
 * and infinities; a row longer than MMB_CHUNK). Catches: a block widened or stored at the wrong offset, a bf16 output
 * not rounded to nearest even (or rounded twice), a flip landing in another bit or element of a bf16 tensor than of
 * the float array, the bound reading a bf16 row as floats. */
static void test_bf16_storage_forms(void) {
    printf("bf16 storage of the activations: the _x forms = the fp32 forms, bitwise\n");
    const size_t n = 3 * EW_BLK + 77;
    float *g = mallocCheck(4 * n), *u = mallocCheck(4 * n), *d = mallocCheck(4 * n), *r0 = mallocCheck(4 * n), *r1 = mallocCheck(4 * n);
    float *s0 = mallocCheck(4 * n), *s1 = mallocCheck(4 * n);
    uint16_t *gh = mallocCheck(2 * n), *uh = mallocCheck(2 * n), *oh = mallocCheck(2 * n), *oh2 = mallocCheck(2 * n), *dh = mallocCheck(2 * n);
    float* dr = mallocCheck(4 * n);   /* d as bf16 values (dh: its bits), the gradients the backward forms read */
    fill_normal(g, n, 5, 3); fill_normal(u, n, 6, 1); fill_normal(d, n, 7, 1e-3f);
    for (size_t i = 0; i < n; i++) { dr[i] = bf16_round(d[i]); dh[i] = f32_to_bf16_bits(d[i]); }
    g[10] = 0.0f; g[11] = -0.0f; g[12] = INFINITY; g[13] = -INFINITY; u[14] = NAN;
    bf16_round_array(g, (long long)n); bf16_round_array(u, (long long)n);
    for (size_t i = 0; i < n; i++) { gh[i] = f32_to_bf16_bits(g[i]); uh[i] = f32_to_bf16_bits(u[i]); }
    int ok[6] = {1, 1, 1, 1, 1, 1};
    for (int round = 0; round < 2; round++) {
        /* forward: bf16 output from bf16 inputs (round = 1 is how the trainer calls them), fp32 output from bf16 inputs */
        silu_forward_r(r0, g, n, 1); silu_forward_x(oh, 1, gh, 1, n, round);
        for (size_t i = 0; i < n; i++) ok[0] &= oh[i] == f32_to_bf16_bits(r0[i]);
        silu_forward_r(r0, g, n, round); silu_forward_x(r1, 0, gh, 1, n, round);
        ok[0] &= !memcmp(r0, r1, 4 * n);
        mul_forward_r(r0, g, u, n, 1); mul_forward_x(oh, 1, gh, uh, 1, n, round);
        for (size_t i = 0; i < n; i++) ok[1] &= oh[i] == f32_to_bf16_bits(r0[i]);
        mul_forward_r(r0, g, u, n, round); mul_forward_x(r1, 0, gh, uh, 1, n, round);
        ok[1] &= !memcmp(r0, r1, 4 * n);
        relu2_forward_r(r0, g, n, 1); relu2_forward_x(oh, 1, gh, 1, n, round);
        for (size_t i = 0; i < n; i++) ok[2] &= oh[i] == f32_to_bf16_bits(r0[i]);
        relu2_forward_r(r0, g, n, round); relu2_forward_x(r1, 0, gh, 1, n, round);
        ok[2] &= !memcmp(r0, r1, 4 * n);
        /* backward: from bf16 stored inputs and a bf16 incoming gradient, into fp32 (rounded or not) or bf16 gradients */
        silu_backward_r(r0, dr, g, n, round); silu_backward_x(r1, 0, dh, gh, 1, n, round);
        ok[3] &= !memcmp(r0, r1, 4 * n);
        silu_backward_r(r0, dr, g, n, 1); silu_backward_x(oh, 1, dh, gh, 1, n, round);
        for (size_t i = 0; i < n; i++) ok[3] &= (uint32_t)oh[i] << 16 == f32_bits(r0[i]);
        mul_backward_r(r0, s0, dr, g, u, n, round); mul_backward_x(r1, s1, 0, dh, gh, uh, 1, n, round);
        ok[3] &= !memcmp(r0, r1, 4 * n) && !memcmp(s0, s1, 4 * n);
        mul_backward_r(r0, s0, dr, g, u, n, 1); mul_backward_x(oh, oh2, 1, dh, gh, uh, 1, n, round);
        for (size_t i = 0; i < n; i++) ok[3] &= (uint32_t)oh[i] << 16 == f32_bits(r0[i]) && (uint32_t)oh2[i] << 16 == f32_bits(s0[i]);
        relu2_backward_r(r0, dr, g, n, round); relu2_backward_x(r1, 0, dh, gh, 1, n, round);
        ok[3] &= !memcmp(r0, r1, 4 * n);
        relu2_backward_r(r0, dr, g, n, 1); relu2_backward_x(oh, 1, dh, gh, 1, n, round);
        for (size_t i = 0; i < n; i++) ok[3] &= (uint32_t)oh[i] << 16 == f32_bits(r0[i]);
    }
    check(ok[0], "  silu forward (bf16 and fp32 outputs, rounded or not), %zu elements", n);
    check(ok[1], "  product forward");
    check(ok[2], "  ReLU^2 forward");
    check(ok[3], "  silu, product and ReLU^2 backward from bf16 stored inputs and gradients, into fp32 or bf16 gradients");
    /* the residual add (each operand and the output either way) and RMSNorm, forward and backward, over rows of 300
     * (a partial block of NORM_ROWS rows at the end; finite values, past the special ones, so that a NaN does not hide
     * a difference in dw) with the input and output stored as bf16 bits */
    {
        const int rows = 39, C = 300, o0 = 200;
        const size_t nn = (size_t)rows * C;
        float *w = mallocCheck(4 * C), *ms0 = mallocCheck(4 * rows), *ms1 = mallocCheck(4 * rows), *dw0 = calloc(C, 4), *dw1 = calloc(C, 4);
        fill_normal(w, C, 8, 1);
        int okr = 1, okn = 1, okb = 1;
        for (int hh = 0; hh < 4; hh++) {   /* a, b stored as bf16 bits or not */
            residual_forward_r(r0, g, u, n, 1);
            residual_forward_x(oh, 1, hh & 1 ? (const void*)gh : (const void*)g, hh & 1, hh & 2 ? (const void*)uh : (const void*)u, (hh & 2) != 0, n, 1);
            for (size_t i = 0; i < n; i++) okr &= oh[i] == f32_to_bf16_bits(r0[i]);
            residual_forward_x(r1, 0, hh & 1 ? (const void*)gh : (const void*)g, hh & 1, hh & 2 ? (const void*)uh : (const void*)u, (hh & 2) != 0, n, 1);
            okr &= !memcmp(r0, r1, 4 * n);
        }
        for (int round = 0; round < 2; round++) {
            rmsnorm_forward_r(r0, ms0, u + o0, w, rows, C, 1e-5f, 1);
            rmsnorm_forward_x(oh, 1, ms1, uh + o0, 1, w, rows, C, 1e-5f, round);
            for (size_t i = 0; i < nn; i++) okn &= oh[i] == f32_to_bf16_bits(r0[i]);
            okn &= !memcmp(ms0, ms1, 4 * rows);
            rmsnorm_forward_r(r0, ms0, u + o0, w, rows, C, 1e-5f, round);
            rmsnorm_forward_x(r1, 0, ms1, uh + o0, 1, w, rows, C, 1e-5f, round);
            okn &= !memcmp(r0, r1, 4 * nn);
            memcpy(s0, d, 4 * nn); memcpy(s1, d, 4 * nn);
            rmsnorm_backward_r(s0, dw0, g + o0, u + o0, w, ms0, rows, C, 1e-5f, round, round);
            rmsnorm_backward_x(s1, 0, dw1, g + o0, 0, uh + o0, 1, w, ms0, rows, C, 1e-5f, round, round);
            okn &= !memcmp(s0, s1, 4 * nn) && !memcmp(dw0, dw1, 4 * C);
            for (int i = 0; i < C; i++) okn &= isfinite(dw0[i]);
            /* the residual stream's gradient: dout and dx as bf16 bits too, dx written (round 0) or accumulated into
             * (round 1, from the bf16 values dr) and stored rounded, against the float arrays rounded in place */
            const int acc = round;
            memcpy(s0, dr, 4 * nn); memcpy(oh2, dh, 2 * nn);
            rmsnorm_backward_r(s0, dw0, g + o0, u + o0, w, ms0, rows, C, 1e-5f, acc, 1);
            rmsnorm_backward_x(oh2, 1, dw1, gh + o0, 1, uh + o0, 1, w, ms0, rows, C, 1e-5f, acc, 1);
            for (size_t i = 0; i < nn; i++) okb &= (uint32_t)oh2[i] << 16 == f32_bits(s0[i]);
            okb &= !memcmp(dw0, dw1, 4 * C);
        }
        check(okr, "  residual add, operands and output as fp32 or bf16 bits");
        check(okn, "  RMSNorm forward (bf16 input and output) and backward (bf16 input; dx and dw)");
        check(okb, "  RMSNorm backward with its gradients as bf16 bits (dout read, dx written or accumulated into)");
        free(w); free(ms0); free(ms1); free(dw0); free(dw1);
    }
    /* the embedding's rows (a table of bf16 values, as -precision bf16's weights) stored as bf16 bits */
    {
        const int toks[5] = {3, 0, 7, 3, 1}, C = 100;   /* rows of u as the table */
        embedding_forward(r0, toks, u, 5, C);
        embedding_forward_x(oh, 1, toks, u, 5, C);
        int oke = 1;
        for (int i = 0; i < 5 * C; i++) oke &= (uint32_t)oh[i] << 16 == f32_bits(r0[i]);
        check(oke, "  embedding rows stored as bf16 bits = the rows");
        float *e0 = calloc(8 * C, 4), *e1 = calloc(8 * C, 4);   /* its gradient from the residual stream's as bf16 bits */
        embedding_backward(e0, g, toks, 5, C);
        embedding_backward_x(e1, gh, 1, toks, 5, C);
        check(!memcmp(e0, e1, 4 * 8 * C), "  embedding backward from a gradient stored as bf16 bits = from the floats");
        free(e0); free(e1);
    }
    /* RoPE (the Q/K path's rotation, heads of 64) and the Q/K fingerprint on bf16 bits */
    {
        const int B = 2, T = 5, nh = 3, hd = 64, half = hd / 2;
        const size_t nr = (size_t)B * T * nh * hd;
        float *cs = mallocCheck(4 * T * half), *sn = mallocCheck(4 * T * half);
        fill_normal(cs, (size_t)T * half, 9, 1); fill_normal(sn, (size_t)T * half, 10, 1);
        int okp = 1;
        for (int round = 0; round < 2; round++)
            for (int style = 0; style < 2; style++) {
                rope_forward_r(r0, u, cs, sn, B, T, nh, hd, style, 1);
                rope_forward_x(oh, 1, uh, 1, cs, sn, B, T, nh, hd, style, round);
                for (size_t i = 0; i < nr; i++) okp &= oh[i] == f32_to_bf16_bits(r0[i]);
                rope_forward_r(r0, u, cs, sn, B, T, nh, hd, style, round);
                rope_forward_x(r1, 0, uh, 1, cs, sn, B, T, nh, hd, style, round);
                okp &= !memcmp(r0, r1, 4 * nr);
            }
        check(okp, "  RoPE forward (bf16 input, bf16 or fp32 output, both styles)");
        int okb = 1;   /* its backward (the rotation back) on a gradient stored as bf16 bits */
        for (int style = 0; style < 2; style++) {
            rope_backward_r(r0, u, cs, sn, B, T, nh, hd, style, 1);
            memset(oh, 0xff, 2 * nr);
            rope_backward_x(oh, 1, uh, 1, cs, sn, B, T, nh, hd, style, 1);
            for (size_t i = 0; i < nr; i++) okb &= oh[i] == f32_to_bf16_bits(r0[i]);
            for (int i = 0; i < half; i++) {   /* the first row, by the definition: rotated by the opposite angle */
                float y1, y2;
                rope_rotate_pair(style, u[i], u[i + half], cs[i], -sn[i], &y1, &y2);
                okb &= oh[i] == f32_to_bf16_bits(y1) && oh[i + half] == f32_to_bf16_bits(y2);
            }
        }
        check(okb, "  RoPE backward (bf16 bits in and out, both styles) = the fp32 form rounded, and the rotation back");
        int okf = 1;
        for (int w = 16; w <= 32; w += 16) {
            Fingerprint f0 = qk_fingerprint(u, n, w), f1 = qk_fingerprint_x(uh, 1, n, w);
            okf &= fp_equal(f0, f1);
        }
        uh[5] ^= 1;   /* one low mantissa bit: another fingerprint */
        okf &= !fp_equal(qk_fingerprint(u, n, 16), qk_fingerprint_x(uh, 1, n, 16));
        uh[5] ^= 1;
        check(okf, "  Q/K fingerprint of bf16 bits = of the float array holding them (widths 16 and 32); one flipped bit changes it");
        {   /* the fast paths against the definition, element by element (fp_add); sizes around the 8-lane step and the
             * 2^14-element chunks */
            const size_t sizes[] = {0, 1, 7, 8, 9, 100, 16383, 16384, 16385, 40003};
            const size_t nmax = 40003;
            float* zf = mallocCheck(4 * nmax);
            uint16_t* zh = mallocCheck(2 * nmax);
            fill_normal(zf, nmax, 77, 3);
            for (size_t i = 0; i < nmax; i++) zh[i] = f32_to_bf16_bits(zf[i]);
            int okd = 1, paths = 0;
            for (int si = 0; si < (int)(sizeof(sizes) / sizeof(sizes[0])); si++)
                for (int w = 16; w <= 32; w += 16)
                    for (int h = 0; h < 2; h++) {
                        const void* z = h ? (const void*)zh : (const void*)zf;
                        size_t n = sizes[si];
                        Fingerprint ref = {0, 0}, sc = {0, 0};
                        for (size_t i = 0; i < n; i++) fp_add(&ref, i, fp_elem_bits(z, h, i, w), w);
                        okd &= fp_equal(ref, qk_fingerprint_x(z, h, n, w));
                        fp_span_scalar(&sc, z, h, 0, n, w);
                        okd &= fp_equal(ref, sc);
#if TSDC_FP_X86
                        if (cpu_avx512dq() && n >= 8) {   /* a span that starts at 8, as a chunk after the first */
                            Fingerprint a = {0, 0}, b = {0, 0};
                            for (size_t i = 8; i < n; i++) fp_add(&a, i, fp_elem_bits(z, h, i, w), w);
                            fp_span_avx512(&b, z, h, 8, n, w);
                            okd &= fp_equal(a, b);
                            paths = 1;
                        }
#endif
                    }
            check(okd, "  Q/K fingerprint: the chunked and the scalar path (and AVX-512 where the CPU has it) = the definition, n 0-40003");
            if (!paths) printf("    (the AVX-512 path not run: this CPU lacks AVX512F/DQ)\n");
            free(zf); free(zh);
        }
        free(cs); free(sn);
    }
    /* the bound: rows of 1300 columns (MMB_CHUNK 512: two chunks and a partial one) */
    const int rows = 7, cols = 1300;
    float nx0[7], nx1[7], *nw = mallocCheck(4 * cols);
    for (int j = 0; j < cols; j++) nw[j] = 0.5f + (float)(j % 7) * 0.01f;
    mmb_row_norms(nx0, u + 20, rows, cols, cols); mmb_row_norms_x(nx1, uh + 20, 1, rows, cols, cols);
    double q0 = 0, q1 = 0;
    const long long b0 = mmb_count_q(g, rows, cols, cols, nx0, nw, 64, &q0), b1 = mmb_count_qx(gh, 1, rows, cols, cols, nx0, nw, 64, &q1);
    ok[4] = !memcmp(nx0, nx1, sizeof(nx0)) && b0 == b1 && q0 == q1 && b0 > 0;
    check(ok[4], "  bound: row norms and violations (%lld) of bf16 rows = of the float rows", b0);
    /* the fault injector: the same event flips the same bits */
    FaultCtx fx; memset(&fx, 0, sizeof(fx));
    fx.width = 16; fx.ev.active = 1; fx.ev.step = 3; fx.ev.seed = 11; fx.ev.nbits = 4; fx.ev.site = SITE_ACT; fx.ev.m = 300;
    memcpy(r0, g, 4 * n); memcpy(oh, gh, 2 * n);
    fault_apply_host(&fx, r0, n); fault_apply_host_x(&fx, oh, 1, n);
    size_t changed = 0;
    ok[5] = 1;
    for (size_t i = 0; i < n; i++) { ok[5] &= f32_bits(r0[i]) == (uint32_t)oh[i] << 16; changed += oh[i] != gh[i]; }   /* NaNs as flipped */
    check(ok[5] && changed > 0 && fx.injected == 2, "  fault injector: %zu elements flipped in bf16 bits as in the float array", changed);
    free(g); free(u); free(d); free(r0); free(r1); free(s0); free(s1); free(gh); free(uh); free(oh); free(oh2); free(dh); free(dr); free(nw);
}

/* ------------------------------------------------------------------------------ fault model */
/* bit flips in the storage dtype, hand-computed. Catches: bf16 masks applied to the fp32 word's low bits
 * (flipping bits bf16 does not store), a flip that is not an XOR of the stored bits. */
static void test_fault_flips(void) {
    printf("fault injection: bit flips in the storage dtype (hand-computed)\n");
    struct { float x; uint32_t mask; int width; uint32_t expect_bits; } cases[] = {
        {1.0f, 0x00000001u, 32, 0x3F800001u},   /* fp32 mantissa lsb: 1 + 2^-23 */
        {1.0f, 0x40000000u, 32, 0x7F800000u},   /* fp32 exponent msb of 1.0 (0x3F800000): +inf */
        {1.0f, 0x80000000u, 32, 0xBF800000u},   /* fp32 sign */
        {1.0f, 0x00800000u, 32, 0x3F000000u},   /* fp32 exponent lsb: 1.0 -> 0.5 */
        {1.0f, 0x0001u, 16, 0x3F810000u},       /* bf16 mantissa lsb: 1 + 2^-7 = 1.0078125 */
        {1.0f, 0x4000u, 16, 0x7F800000u},       /* bf16 exponent msb: +inf */
        {-2.5f, 0x8000u, 16, 0x40200000u},      /* bf16 sign: -2.5 -> 2.5 */
        {0.15625f, 0x0080u, 16, 0x3E200000u},   /* bf16 0x3E20 ^ 0x0080 (exponent lsb) = 0x3EA0 = 0.3125: expect below */
    };
    cases[7].expect_bits = 0x3EA00000u;     /* 0.15625 * 2 = 0.3125 */
    int ok = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t got = f32_bits(fault_flip_value(cases[i].x, cases[i].mask, cases[i].width));
        if (got != cases[i].expect_bits) { printf("    %g ^ %x (w%d) -> %08x, expected %08x\n", cases[i].x, cases[i].mask, cases[i].width, got, cases[i].expect_bits); ok = 0; }
    }
    check(ok, "  %zu cases, fp32 and bf16", sizeof(cases) / sizeof(cases[0]));
}

/* fault_select and the char schedule. Catches: a selection that is not reproducible (a resumed campaign
 * flips other elements), repeated or out-of-range indices, masks with the wrong number of bits or above
 * the width, sites of one event not sharing the selection, every step selecting the same elements, a
 * char schedule with events outside its window, site or layer, or far from rate x window. */
static void test_fault_selection(void) {
    printf("fault injection: the shared random selection\n");
    FaultEvent a; memset(&a, 0, sizeof(a));
    a.active = 1; a.step = 17; a.seed = 99; a.nbits = 4; a.site = SITE_Q_PROJ;
    size_t n = 5000, m = 700;
    size_t *i1 = mallocCheck(sizeof(size_t) * m), *i2 = mallocCheck(sizeof(size_t) * m), *i3 = mallocCheck(sizeof(size_t) * m);
    uint32_t *k1 = mallocCheck(4 * m), *k2 = mallocCheck(4 * m), *k3 = mallocCheck(4 * m);
    fault_select(&a, n, m, 16, i1, k1);
    fault_select(&a, n, m, 16, i2, k2);
    check(!memcmp(i1, i2, sizeof(size_t) * m) && !memcmp(k1, k2, 4 * m), "  reproducible: the same event selects the same elements and bits");
    int ok = 1;
    for (size_t j = 0; j < m; j++) {
        if (i1[j] >= n || (j && i1[j] <= i1[j - 1])) ok = 0;            /* in range, sorted, distinct */
        if (__builtin_popcount(k1[j]) != 4 || (k1[j] >> 16)) ok = 0;    /* 4 distinct bits below 16 */
    }
    check(ok, "  %zu distinct sorted indices in [0,%zu), each mask 4 distinct bits of 16", m, n);
    FaultEvent b = a; b.site = SITE_DOWN_PROJ; b.layer = 3; b.pass = PASS_BWD;
    fault_select(&b, n, m, 16, i3, k3);
    check(!memcmp(i1, i3, sizeof(size_t) * m) && !memcmp(k1, k3, 4 * m), "  shared: another site/layer/pass of equal size gets the same selection");
    FaultEvent c = a; c.step = 18;
    fault_select(&c, n, m, 16, i3, k3);
    check(memcmp(i1, i3, sizeof(size_t) * m) != 0, "  another step selects differently");
    size_t* all = mallocCheck(sizeof(size_t) * n); uint32_t* km = mallocCheck(4 * n);
    fault_select(&a, n, n, 32, all, km);
    int perm = 1;
    for (size_t j = 0; j < n; j++) if (all[j] != j) perm = 0;
    check(perm, "  m = n selects every element exactly once");
    /* char schedule: about rate x window events, deterministic */
    FaultConfig fc; memset(&fc, 0, sizeof(fc));
    fc.mode = FAULT_CHAR; fc.sites = 1u << SITE_V_PROJ; fc.pass = PASS_FWD; fc.layer = 1; fc.m = 10; fc.nbits = 4;
    fc.rank = 0; fc.mb = -1; fc.rate = 0.1; fc.start = 101; fc.end = 10100; fc.seed = 5;
    int events = 0, outside = 0;
    for (long long st = 1; st <= 10200; st++) {
        FaultEvent e = fault_plan_step(&fc, st, 1, 4, 4);
        if (e.active) { events++; if (st < 101 || st > 10100 || e.site != SITE_V_PROJ || e.layer != 1 || e.mb > 3) outside++; }
    }
    check(outside == 0 && events > 900 && events < 1100, "  char schedule: %d events in 10000 window steps at rate 0.1, none outside", events);
    free(i1); free(i2); free(i3); free(k1); free(k2); free(k3); free(all); free(km);
}

/* ------------------------------------------------------------------ attention checks (attcheck.h) */
/* the single sign or mantissa bit flip (in the storage width) of x that moves it by the amount closest
 * above lo (and at most hi); returns the mask, 0 if none */
static uint32_t flip_moving_by(float x, int width, double lo, double hi) {
    uint32_t best = 0; double bd = INFINITY;
    int nm = width == 16 ? 7 : 23;
    for (int b = 0; b <= nm; b++) {
        uint32_t mask = b == nm ? (width == 16 ? 0x8000u : 0x80000000u) : 1u << b;   /* mantissa bits, then the sign */
        double d = fabs((double)fault_flip_value(x, mask, width) - x);
        if (d > lo && d <= hi && d < bd) { bd = d; best = mask; }
    }
    return best;
}

/* -protect att: the logits row checksum and the probability row sums, fed sign and mantissa flips (no
 * exponent flips: those are caught at any tolerance) sized against the tolerance each check claims in
 * attcheck.h's comment (logits: 2^-7 of the Cauchy-Schwarz bound in bf16, 1e-4 in fp32; probability
 * rows: 2^-6 in bf16, 1e-5 + 4 T 2^-24 in fp32), written here as numbers: a flip moving
 * a value by 2x to 8x its row's tolerance must fail the check, one moving it by at most 1/8 must pass
 * (the clean rounding residual uses at most half the tolerance: the bounds' stated margin). A check
 * whose tolerance is 100x looser than it claims, or that skips rows, fails this test. Catches also: a check
 * that alarms on clean rows (its tolerance under the rounding residual). */
static void test_att_checks_tolerance(void) {
    printf("attention checks (-protect att): non-exponent flips against the claimed tolerances\n");
    int B = 1, T = 16, H = 2, KV = 1, hd = 32, g = H / KV;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T;
    float *q = mallocCheck(4 * nq), *k = mallocCheck(4 * nk), *lg = mallocCheck(4 * na), *pr = mallocCheck(4 * na);
    for (int wi = 0; wi < 2; wi++) {
        int width = wi ? 16 : 32;
        fill_normal(q, nq, 31, 1); fill_normal(k, nk, 32, 1);
        if (width == 16) { bf16_round_array(q, (long long)nq); bf16_round_array(k, (long long)nk); }
        double scale = 1.0 / sqrt((double)hd);
        memset(lg, 0, 4 * na); memset(pr, 0, 4 * na);
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)q[(size_t)t * H * hd + h * hd + i] * k[(size_t)s * KV * hd + (h / g) * hd + i];
                    float z = (float)(scale * d);
                    lg[((size_t)h * T + t) * T + s] = width == 16 ? bf16_round(z) : z;
                    mx = fmax(mx, z);
                }
                for (int s = 0; s <= t; s++) sum += exp(lg[((size_t)h * T + t) * T + s] - mx);
                for (int s = 0; s <= t; s++) {
                    float p = (float)(exp(lg[((size_t)h * T + t) * T + s] - mx) / sum);
                    pr[((size_t)h * T + t) * T + s] = width == 16 ? bf16_round(p) : p;
                }
            }
        check(att_logits_rowcheck(lg, q, k, B, T, H, KV, hd, width) == 0 && att_probs_rowcheck(pr, B, H, T, width) == 0,
              "  %s: clean logits and probabilities pass", width == 16 ? "bf16" : "fp32");
        int tried = 0, caught = 0, small_tried = 0, small_passed = 0;
        /* the tolerances attcheck.h documents, written here again so that a changed macro cannot move the test */
        double claim_rel = width == 16 ? ldexp(1.0, -7) : 1e-4, claim_rowsum = width == 16 ? ldexp(1.0, -6) : 1e-5 + 4.0 * T * ldexp(1.0, -24);
        for (int h = 0; h < H; h++)
            for (int t = 1; t < T; t++)
                for (int s = 0; s <= t; s += 3) {
                    /* logits: the row's tolerance, as att_logits_rowcheck computes it */
                    double kn = 0, qn = att_norm(q + (size_t)t * H * hd + h * hd, hd);
                    for (int u = 0; u <= t; u++) kn += att_norm(k + (size_t)u * KV * hd + (h / g) * hd, hd);
                    double tol = claim_rel * scale * qn * kn;
                    float* x = &lg[((size_t)h * T + t) * T + s];
                    float keep = *x;
                    uint32_t m = flip_moving_by(keep, width, 2 * tol, 8 * tol);
                    if (m) { *x = fault_flip_value(keep, m, width); tried++; caught += att_logits_rowcheck(lg, q, k, B, T, H, KV, hd, width) == 1; *x = keep; }
                    m = flip_moving_by(keep, width, 0, tol / 8);
                    if (m) { *x = fault_flip_value(keep, m, width); small_tried++; small_passed += att_logits_rowcheck(lg, q, k, B, T, H, KV, hd, width) == 0; *x = keep; }
                    /* probabilities */
                    double ptol = claim_rowsum;
                    float* p = &pr[((size_t)h * T + t) * T + s];
                    keep = *p;
                    m = flip_moving_by(keep, width, 2 * ptol, 8 * ptol);
                    if (m) { *p = fault_flip_value(keep, m, width); tried++; caught += att_probs_rowcheck(pr, B, H, T, width) == 1; *p = keep; }
                    m = flip_moving_by(keep, width, 0, ptol / 8);
                    if (m) { *p = fault_flip_value(keep, m, width); small_tried++; small_passed += att_probs_rowcheck(pr, B, H, T, width) == 0; *p = keep; }
                }
        check(tried >= 20 && caught == tried, "  %s: %d of %d sign/mantissa flips moving a logit or probability by 2-8x its tolerance caught",
              width == 16 ? "bf16" : "fp32", caught, tried);
        check(small_tried >= 20 && small_passed == small_tried, "  %s: %d of %d flips moving it by <= 1/8 of its tolerance pass",
              width == 16 ? "bf16" : "fp32", small_passed, small_tried);
    }
    free(q); free(k); free(lg); free(pr);
}

/* -protect att_bwd: the dprobs row checksum and the dlogits zero row sums, on a backward made by the trainer's own
 * kernels (attention_av_backward, attention_softmax_backward) from bf16-rounded dO, V and probabilities, fed
 * sign and mantissa flips sized against the tolerances attcheck.h's comment claims, written here as numbers:
 * dprobs row t: 2^-7 (bf16) or 1e-4 (fp32) of |dO_t| sum_{s<=t} |v_s|; dlogits row t: 2^-6 (bf16) or 2e-4 (fp32)
 * of 2 |dO_t| max_{s<=t} |v_s|; dV column i of a kv head: 2^-6 (bf16) or 2e-4 (fp32) of sum_{h,t} |dO[t,h,i]|.
 * A flip moving an entry by 2-8x its row's tolerance must fail the check, one
 * moving it by at most 1/8 must pass; clean rows pass; a flip in the masked triangle (never read) passes; a NaN
 * in a read entry fails. Catches: a backward check whose tolerance is far looser than it claims, one that skips
 * rows or reads the masked triangle, one that alarms on clean rounding, a NaN that compares as passing. */
/* the attention checks reading their [B,H,T,T] operand as bf16 bits (-precision bf16's storage of the materialised
 * attention) decide as on the float array of the same values: the failed heads' count equal, clean and with one entry
 * flipped (sign, exponent or mantissa bits; live or in the masked triangle), for every check that reads one */
static void test_att_checks_bits(void) {
    printf("attention checks on [B,H,T,T] tensors stored as bf16 bits\n");
    const int B = 2, T = 24, H = 4, KV = 2, hd = 32, width = 16;
    const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T;
    float *q = mallocCheck(4 * nq), *k = mallocCheck(4 * nk), *v = mallocCheck(4 * nk), *go = mallocCheck(4 * nq), *o = mallocCheck(4 * nq);
    float *lg = mallocCheck(4 * na), *pr = mallocCheck(4 * na), *dp = mallocCheck(4 * na), *ds = mallocCheck(4 * na), *dv = mallocCheck(4 * nk);
    fill_normal(q, nq, 61, 1); fill_normal(k, nk, 62, 1); fill_normal(v, nk, 63, 1); fill_normal(go, nq, 64, 1);
    bf16_round_array(q, (long long)nq); bf16_round_array(k, (long long)nk); bf16_round_array(v, (long long)nk); bf16_round_array(go, (long long)nq);
    attention_logits_forward(lg, q, k, B, T, H, KV, hd, 1);
    attention_softmax_forward(pr, lg, B, H, T, 1);
    attention_av_forward(o, pr, v, B, T, H, KV, hd, 1);
    attention_av_backward(dp, dv, go, pr, v, B, T, H, KV, hd, 1);
    attention_softmax_backward(ds, dp, pr, B, H, T, 1);
    float* ten[4] = {lg, pr, dp, ds};
    uint16_t* th = mallocCheck(2 * na);
    int trials = 0, agree = 0, failed = 0;
    uint64_t rng = 12345;
    for (int w = 0; w < 4; w++)
        for (int trial = 0; trial < 41; trial++) {
            float* x = ten[w];
            size_t i = 0;
            float keep = 0.0f;
            if (trial > 0) {   /* trial 0: clean */
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                i = (size_t)((rng >> 33) % na);
                keep = x[i];
                uint32_t mask = (uint32_t)1 << (int)((rng >> 13) % 16);   /* one of the 16 bits */
                x[i] = fault_flip_value(keep, mask, width);
            }
            for (size_t j = 0; j < na; j++) th[j] = f32_to_bf16_bits(x[j]);
            int a, b;
            if (w == 0) {
                a = att_logits_rowcheck(x, q, k, B, T, H, KV, hd, width) * 100 + abft_logits_check(x, q, k, B, T, H, KV, hd, width);
                b = att_logits_rowcheck_x(th, 1, q, k, B, T, H, KV, hd, width) * 100 + abft_logits_check_x(th, 1, q, k, B, T, H, KV, hd, width);
            } else if (w == 1) {
                a = att_probs_rowcheck(x, B, H, T, width) * 100 + abft_av_check(o, x, v, B, T, H, KV, hd, width);
                b = att_probs_rowcheck_x(th, 1, B, H, T, width) * 100 + abft_av_check_x(o, th, 1, v, B, T, H, KV, hd, width);
            } else if (w == 2) {
                a = att_dprobs_rowcheck(x, go, v, B, T, H, KV, hd, width);
                b = att_dprobs_rowcheck_x(th, 1, go, v, B, T, H, KV, hd, width);
            } else {
                a = att_dlogits_rowcheck(x, go, v, B, T, H, KV, hd, width);
                b = att_dlogits_rowcheck_x(th, 1, go, v, B, T, H, KV, hd, width);
            }
            if (trial > 0) x[i] = keep;
            trials++; agree += a == b; failed += a != 0;
        }
    check(agree == trials && failed >= 20, "  logits (rows, ABFT), probs (rows, ABFT's P V), dprobs, dlogits: %d of %d clean and flipped "
          "tensors decided alike (%d with a failed head)", agree, trials, failed);
    free(q); free(k); free(v); free(go); free(o); free(lg); free(pr); free(dp); free(ds); free(dv); free(th);
}

static void test_att_bwd_checks_tolerance(void) {
    printf("attention checks, backward (-protect att_bwd): non-exponent flips against the claimed tolerances\n");
    int B = 1, T = 16, H = 4, KV = 2, hd = 32, g = H / KV;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T;
    float *dout = mallocCheck(4 * nq), *v = mallocCheck(4 * nk), *dv = mallocCheck(4 * nk), *pr = mallocCheck(4 * na);
    float *dp = mallocCheck(4 * na), *ds = mallocCheck(4 * na);
    for (int wi = 0; wi < 2; wi++) {
        int width = wi ? 16 : 32;
        fill_normal(dout, nq, 41, 1); fill_normal(v, nk, 42, 1);
        /* probabilities: a softmax of random logits, rows concentrated as a trained model's are */
        fill_normal(pr, na, 43, 3);
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                float* row = pr + ((size_t)h * T + t) * T;
                double mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) mx = fmax(mx, row[u]);
                for (int u = 0; u <= t; u++) sum += exp(row[u] - mx);
                for (int u = 0; u < T; u++) row[u] = u <= t ? (float)(exp(row[u] - mx) / sum) : 0.0f;
            }
        if (width == 16) { bf16_round_array(dout, (long long)nq); bf16_round_array(v, (long long)nk); bf16_round_array(pr, (long long)na); }
        attention_av_backward(dp, dv, dout, pr, v, B, T, H, KV, hd, 0);
        if (width == 16) { bf16_round_array(dp, (long long)na); bf16_round_array(dv, (long long)nk); }
        attention_softmax_backward(ds, dp, pr, B, H, T, 0);
        if (width == 16) bf16_round_array(ds, (long long)na);
        check(att_dprobs_rowcheck(dp, dout, v, B, T, H, KV, hd, width) == 0 && att_dlogits_rowcheck(ds, dout, v, B, T, H, KV, hd, width) == 0 &&
              att_dv_colcheck(dv, dout, B, T, H, KV, hd, width) == 0,
              "  %s: clean dprobs, dlogits and dV pass", width == 16 ? "bf16" : "fp32");
        double rel_p = width == 16 ? ldexp(1.0, -7) : 1e-4, rel_s = width == 16 ? ldexp(1.0, -6) : 2e-4;
        int tried = 0, caught = 0, small_tried = 0, small_passed = 0, masked_passed = 0, nan_caught = 0;
        for (int h = 0; h < H; h++)
            for (int t = 1; t < T; t++) {
                const float* vh = v + (size_t)(h / g) * hd;
                double on = att_norm(dout + (size_t)t * H * hd + h * hd, hd), vsum = 0, vmax = 0;
                for (int u = 0; u <= t; u++) { double n = att_norm(vh + (size_t)u * KV * hd, hd); vsum += n; vmax = fmax(vmax, n); }
                double tol[2] = {rel_p * on * vsum, rel_s * 2 * on * vmax};
                float* ten[2] = {dp, ds};
                for (int w = 0; w < 2; w++)
                    for (int s = 0; s <= t; s += 3) {
                        float* x = &ten[w][((size_t)h * T + t) * T + s];
                        float keep = *x;
#define ATTB_RUN(X) (w ? att_dlogits_rowcheck(X, dout, v, B, T, H, KV, hd, width) : att_dprobs_rowcheck(X, dout, v, B, T, H, KV, hd, width))
                        uint32_t m = flip_moving_by(keep, width, 2 * tol[w], 8 * tol[w]);
                        if (m) { *x = fault_flip_value(keep, m, width); tried++; caught += ATTB_RUN(ten[w]) == 1; *x = keep; }
                        m = flip_moving_by(keep, width, 0, tol[w] / 8);
                        if (m) { *x = fault_flip_value(keep, m, width); small_tried++; small_passed += ATTB_RUN(ten[w]) == 0; *x = keep; }
                        if (s == 0) {
                            *x = NAN; nan_caught += ATTB_RUN(ten[w]) == 1; *x = keep;
                            float* dead = &ten[w][((size_t)h * T + t - 1) * T + t];   /* row t-1, column t: masked */
                            *dead = 1e30f; masked_passed += ATTB_RUN(ten[w]) == 0; *dead = 0.0f;
                        }
#undef ATTB_RUN
                    }
            }
        /* dV: column sums against dO's */
        for (int kh = 0; kh < KV; kh++)
            for (int i = 0; i < hd; i += 3) {
                double bound = 0;
                for (int t = 0; t < T; t++)
                    for (int h = kh * g; h < kh * g + g; h++) bound += fabs(dout[(size_t)t * H * hd + h * hd + i]);
                double tol = rel_s * bound;
                for (int s = 0; s < T; s += 5) {
                    float* x = &dv[(size_t)s * KV * hd + kh * hd + i];
                    float keep = *x;
                    uint32_t m = flip_moving_by(keep, width, 2 * tol, 8 * tol);
                    if (m) { *x = fault_flip_value(keep, m, width); tried++; caught += att_dv_colcheck(dv, dout, B, T, H, KV, hd, width) == 1; *x = keep; }
                    m = flip_moving_by(keep, width, 0, tol / 8);
                    if (m) { *x = fault_flip_value(keep, m, width); small_tried++; small_passed += att_dv_colcheck(dv, dout, B, T, H, KV, hd, width) == 0; *x = keep; }
                }
            }
        const char* wn = width == 16 ? "bf16" : "fp32";
        check(tried >= 40 && caught == tried, "  %s: %d of %d sign/mantissa flips moving a dprobs, dlogits or dV entry by 2-8x its tolerance caught",
              wn, caught, tried);
        check(small_tried >= 40 && small_passed == small_tried, "  %s: %d of %d flips moving it by <= 1/8 of its tolerance pass", wn,
              small_passed, small_tried);
        check(nan_caught == 2 * H * (T - 1) && masked_passed == 2 * H * (T - 1),
              "  %s: a NaN in a read entry fails (%d of %d), 1e30 in the masked triangle passes (%d of %d)", wn, nan_caught,
              2 * H * (T - 1), masked_passed, 2 * H * (T - 1));
    }
    free(dout); free(v); free(dv); free(pr); free(dp); free(ds);
}

/* --------------------------------------------------------------------------- reference states */
#include "tests/refstate.h"
#include "tests/bf16_bounds.h"

/* the reference state of a preset read (ref_open) and the model built for its batch with the preset's
 * config at the state's vocabulary and length (in c), at the given precision (0 fp32, 1 bf16); 0 when
 * the state cannot be read */
static int ref_model(const char* preset, const char* states_dir, const char* ckpt_dir, int precision, RefState* s, Config* c,
                     Model* model, char* cpath, size_t ncpath) {
    if (!ref_open(preset, states_dir, ckpt_dir, s, cpath, ncpath)) return 0;
    *c = *preset_find(preset);
    c->vocab_size = s->V; c->seq_len = s->T;
    model_build(model, c, s->B, s->T, precision);
    return 1;
}

/* the state's s->n_steps AdamW steps on its batch (in the model's inputs and targets) with its
 * hyperparameters, from zero moments, through model_update (clip, AdamW, the weight copies: the training
 * loop's call); returns the loss of each step */
static float* ref_adamw_steps(Model* model, const RefState* s) {
    int N = s->B * s->T;
    memset(model->m, 0, sizeof(float) * model->L.total);
    memset(model->v, 0, sizeof(float) * model->L.total);
    float* losses = (float*)callocCheck((size_t)s->n_steps, sizeof(float));
    AdamW opt = {s->max_lr, s->beta1, s->beta2, s->adam_eps, s->wd};
    for (int step = 0; step < s->n_steps; step++) {
        memset(model->grads, 0, sizeof(float) * model->L.total);
        losses[step] = model_forward(model, s->B, s->T, model->targets);
        model_backward(model, s->B, s->T, model->targets, 1.0f / N);
        opt.lr = lr_at(step, s->max_lr, s->warmup, s->n_steps, s->final_frac);
        model_update(model, &opt, step + 1, s->clip);
    }
    return losses;
}

/* fp32 against PyTorch / HF transformers on the reference batch: logits, loss, every gradient, 10 AdamW steps
 * through model_update. Catches: a model bug anywhere in the forward or backward (attention, RoPE, norms, MLP,
 * head), the import path (hf_to_ckpt.py -> checkpoint -> loader) permuting or transposing a tensor,
 * an optimizer bug in model_update (clip, AdamW, weight decay, bias correction). */
static void test_reference(const char* preset, const char* states_dir, const char* ckpt_dir) {
    printf("reference state %s (vs PyTorch / HF transformers, fp32)\n", preset);
    char cpath[1200];
    RefState s;
    Config c;
    Model model_, *model = &model_;
    if (!ref_model(preset, states_dir, ckpt_dir, 0, &s, &c, model, cpath, sizeof(cpath))) return;
    check(model->L.total == s.n_params, "  parameter count %zu == state's %llu", model->L.total, (unsigned long long)s.n_params);
    if (model->L.total != s.n_params) return;
    /* the user's import path: hf_to_ckpt.py wrote cpath; load it as -init does */
    CkptInfo ck;
    checkpoint_read(cpath, &ck, NULL, NULL, NULL, 0);
    const char* diff = config_diff(&ck.cfg, &c);
    check(diff == NULL, "  imported checkpoint config equals the preset's (%s)", diff ? diff : "all fields");
    checkpoint_read(cpath, &ck, model->params, NULL, NULL, model->L.total);
    model_prepare_weights(model);
    int N = s.B * s.T;
    ref_batch(&s, model->inputs, model->targets);
    float loss = model_forward(model, s.B, s.T, model->targets);
    compare_tensor("logits", model->logits, s.logits, (size_t)N * s.V, 2e-5f, 1e-4f);
    compare_tensor("loss", &loss, &s.loss, 1, 1e-6f, 1e-5f);
    memset(model->grads, 0, sizeof(float) * model->L.total);
    model_backward(model, s.B, s.T, model->targets, 1.0f / N);
    int all_ok = 1;
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* t = &model->L.t[i];
        char name[64];
        grad_name(name, sizeof(name), t);
        /* gradients: absolute floor relative to the tensor's scale */
        double mx = 0; for (size_t j = 0; j < t->numel; j++) mx = fmax(mx, fabs(s.grads[t->offset + j]));
        all_ok &= compare_tensor(name, model->grads + t->offset, s.grads + t->offset, t->numel, (float)(1e-4 * mx + 1e-9), 1e-3f);
    }
    /* 10 AdamW steps on the same batch with the state's hyperparameters */
    float* losses = ref_adamw_steps(model, &s);
    compare_tensor("losses of 10 AdamW steps", losses, s.losses, s.n_steps, 1e-5f, 1e-5f);
    printf("  losses: ");
    for (int i = 0; i < s.n_steps; i++) printf("%.6f/%.6f ", losses[i], s.losses[i]);
    printf("(ours/reference)\n");
    free(losses); free_state(&s);
    model_free(model);
    (void)all_ok;
}

/* relative L2 error ||got - ref|| / ||ref|| (double) */
static double rel_l2(const float* got, const float* ref, size_t n) {
    double se = 0, sr = 0;
    for (size_t i = 0; i < n; i++) { double d = (double)got[i] - ref[i]; se += d * d; sr += (double)ref[i] * ref[i]; }
    return se != se ? NAN : sr > 0 ? sqrt(se / sr) : (se > 0 ? INFINITY : 0.0);
}

/* -precision bf16 (the emulated AMP) against the fp32 reference, under the fixed bounds of
 * tests/bf16_bounds.h (derived there from the bf16 unit roundoff and the roundings on each path). Catches: a
 * stale bf16 weight copy (training stops learning), a tensor computed or stored at less than bf16 accuracy, a
 * bf16 path that drifts from the fp32 model (a wrong rounding point, a missing fp32 accumulation). */
static void test_reference_bf16(const char* preset, const char* states_dir, const char* ckpt_dir) {
    printf("reference state %s: -precision bf16 vs PyTorch fp32, fixed bounds of tests/bf16_bounds.h\n", preset);
    char cpath[1200];
    RefState s;
    Config c;
    Model model_, *model = &model_;
    if (!ref_model(preset, states_dir, ckpt_dir, 1, &s, &c, model, cpath, sizeof(cpath))) return;
    if (model->L.total != s.n_params) { check(0, "  parameter count %zu == state's %llu", model->L.total, (unsigned long long)s.n_params); return; }
    CkptInfo ck;
    checkpoint_read(cpath, &ck, NULL, NULL, NULL, 0);
    float* w0 = mallocCheck(sizeof(float) * model->L.total);
    checkpoint_read(cpath, &ck, w0, NULL, NULL, model->L.total);
    model_load_state(model, w0, NULL, NULL);   /* fp32 master weights, zero moments, the bf16 copy */
    free(w0);
    int N = s.B * s.T, L = c.n_layer;
    ref_batch(&s, model->inputs, model->targets);
    float loss = model_forward(model, s.B, s.T, model->targets);
    float* zl = mallocCheck(sizeof(float) * (size_t)N * s.V);   /* the logits, stored as bf16 bits in bf16 mode */
    for (int n = 0; n < N; n++) model_logits_row(model, n, zl + (size_t)n * s.V);
    double e = rel_l2(zl, s.logits, (size_t)N * s.V), lim = BF16_LOGITS_RL2(L);
    free(zl);
    check(e <= lim, "  %-28s rel L2 %.3e <= %.3e (3 sqrt(%d roundings) 2^-9)", "logits", e, lim, BF16_FWD_ROUNDINGS(L));
    double loss0_bound = bf16_loss_bound(s.logits, N, s.V, L);
    e = fabs((double)loss - s.loss);
    check(e <= loss0_bound, "  %-28s |err| %.3e <= %.3e (%.6f vs %.6f)", "loss", e, loss0_bound, loss, s.loss);
    memset(model->grads, 0, sizeof(float) * model->L.total);
    model_backward(model, s.B, s.T, model->targets, 1.0f / N);
    double worst = 0; const char* worst_name = "";
    int bad = 0;
    lim = BF16_GRAD_RL2(L);
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* t = &model->L.t[i];
        double g = rel_l2(model->grads + t->offset, s.grads + t->offset, t->numel);
        if (!(g <= lim)) {
            bad++;
            char name[64];
            grad_name(name, sizeof(name), t);
            printf("    %s rel L2 %.3e > %.3e\n", name, g, lim);
        }
        if (g > worst || g != g) { worst = g; worst_name = PT_NAMES[t->type]; }
    }
    check(!bad, "  %-28s largest rel L2 %.3e (%s) <= %.3e (3 sqrt(%d roundings) 2^-9), %d of %d tensors over", "every gradient tensor", worst,
          worst_name, lim, BF16_FWD_ROUNDINGS(L) + BF16_BWD_ROUNDINGS(L), bad, model->L.n);
    /* 10 AdamW steps through model_update, as the training loop makes them */
    float* losses = ref_adamw_steps(model, &s);
    int worst_step = 0; double worst_ratio = 0;
    for (int step = 0; step < s.n_steps; step++) {
        double r = fabs((double)losses[step] - s.losses[step]) / bf16_losses_bound(loss0_bound, s.losses, step, L);
        if (!(r <= worst_ratio)) { worst_ratio = r; worst_step = step; }
    }
    check(worst_ratio <= 1, "  %-28s worst at step %d: |err| %.3e <= %.3e (%.2f of the bound)", "losses of 10 AdamW steps", worst_step + 1,
          fabs((double)losses[worst_step] - s.losses[worst_step]), bf16_losses_bound(loss0_bound, s.losses, worst_step, L), worst_ratio);
    printf("  losses: ");
    for (int i = 0; i < s.n_steps; i++) printf("%.5f/%.5f ", losses[i], s.losses[i]);
    printf("(bf16/reference)\n");
    free(losses); free_state(&s);
    model_free(model);
}

/* the reference checkpoints are built from the committed HF weights by `make refckpts` (a Python step:
 * the venv), not by the C build: on a fresh clone say so in one line instead of failing test by test */
static void require_ref_ckpts(const char* const* presets, int n, const char* dir) {
    for (int i = 0; i < n; i++) {
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s.ckpt", dir, presets[i]);
        FILE* fp = fopen(p, "rb");
        if (fp) { fclose(fp); continue; }
        fprintf(stderr, "error: %s not found: `make refckpts` builds the reference checkpoints (or run `make test`, which builds "
                        "everything and runs every test)\n", p);
        exit(2);
    }
}

int main(int argc, char** argv) {
    const char *states = "dev/reference/states", *ckpts = "build/ref";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-states")) states = argv[i + 1];
        else if (!strcmp(argv[i], "-ckpts")) ckpts = argv[i + 1];
        else if (!strcmp(argv[i], "-bench_init")) return bench_init(argv[i + 1]);
        else { fprintf(stderr, "usage: test_sdc [-states DIR] [-ckpts DIR] | test_sdc -bench_init PRESET\n"); return 1; }
    }
    const char* presets[] = {"tiny-llama", "tiny-qwen3", "tiny-nanochat"};
    require_ref_ckpts(presets, 3, ckpts);
    test_param_counts();
    test_bf16();
    test_checksum();
    test_schedule();
    test_protect_parse();
    test_init();
    test_fault_flips();
    test_bf16_storage_forms();
    test_ew_compare_mode();
    test_fault_selection();
    test_att_checks_tolerance();
    test_att_bwd_checks_tolerance();
    test_att_checks_bits();
    test_gemm_paths();
    test_gemm_bf16_packers();
    test_vexp();
    test_mmb_bound();
    test_attention_fast();
#ifdef _OPENMP
    test_thread_independence();
#endif
    for (int i = 0; i < 3; i++) test_reference(presets[i], states, ckpts);
    for (int i = 0; i < 3; i++) test_reference_bf16(presets[i], states, ckpts);
    printf("test_sdc: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
