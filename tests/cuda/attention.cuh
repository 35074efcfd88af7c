/* attention.cuh: the attention kernel tests of test_sdc.cu: the materialised attention (llmc/cuda/attention.cuh,
 * whole and split), the fused one (llmc/cuda/flash_attention.cuh), the chunked batch, and the four attention
 * checks (llmc/sdc/attcheck.cuh) against llmc/sdc/attcheck.h's. */

/* Catches: a wrong causal mask (future positions read), a GQA head mapped to the wrong K/V head, a missing
 * 1/sqrt(hd) scale, a softmax or backward that differs from the CPU's math. */
static void test_attention(void) {
    printf("attention (llmc/cuda/attention.cuh) vs attention_forward / attention_backward\n");
    struct { int B, T, H, KV, hd; } cases[] = {
        {2, 37, 4, 2, 32}, {2, 37, 4, 2, 64}, {2, 128, 4, 2, 32}, {2, 128, 4, 2, 64}, {1, 64, 4, 1, 64}, {2, 50, 2, 2, 64},
        {1, 40, 16, 8, 128}};   /* the last: qwen3-0.6b's heads (16 q, 8 kv, head_dim 128) */
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int B = cases[ci].B, T = cases[ci].T, H = cases[ci].H, KV = cases[ci].KV, hd = cases[ci].hd, g = H / KV;
        size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T;
        float scale = 1.0f / sqrtf((float)hd);
        printf("  B %d T %d H %d KV %d hd %d\n", B, T, H, KV, hd);
        float* q = h_normal(nq, 1.5, 0.0, 1);
        float* k = h_normal(nk, 1.0, 0.0, 1);
        float* v = h_normal(nk, 1.0, 0.0, 1);
        bf16 *dq = d_bf16(q, nq), *dk = d_bf16(k, nk), *dv = d_bf16(v, nk);
        bf16 *dout = d_bf16_poison(nq), *dlog = d_bf16_poison(na), *dprob = d_bf16_poison(na);
        attention_forward(dout, dlog, dprob, dq, dk, dv, B, T, H, KV, hd, KV * hd, g_s);
        Written wo, wl, wp;
        float* out = dl_bf16(dout, nq, &wo);
        float* lg = dl_bf16(dlog, na, &wl);
        float* pr = dl_bf16(dprob, na, &wp);
        float *rout = h_alloc(nq), *rlg = h_alloc(na), *rpr = h_alloc(na);
        attention_forward(rout, rlg, rpr, q, k, v, B, T, H, KV, hd);
        /* logits: one fp32 dot of hd terms each side, rounded once: 1 ulp + (hd+8) 2^-24 scale sum|q k| */
        float* mlg = h_alloc(na);
        float mlg_max = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++)
                    for (int s = 0; s < T; s++) {
                        double a = 0;
                        if (s <= t)
                            for (int i = 0; i < hd; i++)
                                a += fabs((double)q[((size_t)b * T + t) * H * hd + (size_t)h * hd + i] *
                                          k[((size_t)b * T + s) * KV * hd + (size_t)(h / g) * hd + i]);
                        mlg[(((size_t)b * H + h) * T + t) * T + s] = (float)(a * scale);
                        mlg_max = fmaxf(mlg_max, (float)(a * scale));
                    }
        double dot_tol = 2 * (hd + 8) * ldexp(1.0, -24); /* x2: tensor-core accumulation may truncate */
        compare("logits [B,H,T,T] (masked entries 0)", lg, rlg, na, tol_bf16_mag(mlg, dot_tol), &wl);
        /* probs: softmax of the fp32 logits on both sides; those differ by <= dot_tol * mlg_max, which
         * moves p by a relative 2x that (max and sum shift too): 1 ulp + rtol */
        compare("probs (masked entries 0)", pr, rpr, na, tol_bf16(2 * dot_tol * mlg_max + ldexp(1.0, -20)), &wp);
        /* out: the GPU multiplies the bf16 probs (relative rounding <= 2^-9, so sum_s |dp_s| <= 2^-9
         * and |dout| <= 2^-9 max|v|), the CPU the fp32 ones: 1 ulp + 2^-8 max|v| (2x margin) */
        Tol to = tol_bf16(0);
        to.atol = ldexp(1.0, -8) * max_abs_of(v, nk);
        compare("out", out, rout, nq, to, &wo);
        /* backward: both sides get the same bf16 probs and dout */
        float* go = h_normal(nq, 1.0, 0.0, 1);
        float* prr = h_alloc(na);
        for (size_t i = 0; i < na; i++) prr[i] = bf16_round(rpr[i]);
        bf16 *gdq = d_bf16_poison(nq), *gdk = d_bf16_poison(nk), *gdv = d_bf16_poison(nk);
        attention_backward(gdq, gdk, gdv, d_bf16(go, nq), d_bf16(prr, na), dq, dk, dv, B, T, H, KV, hd, KV * hd, g_s);
        Written wq, wk, wv;
        float* xdq = dl_bf16(gdq, nq, &wq);
        float* xdk = dl_bf16(gdk, nk, &wk);
        float* xdv = dl_bf16(gdv, nk, &wv);
        float *rdq = h_alloc(nq), *rdk = h_alloc(nk), *rdv = h_alloc(nk), *rdatt = h_alloc(na);
        attention_backward(rdq, rdk, rdv, rdatt, go, prr, q, k, v, B, T, H, KV, hd);
        /* dv = P^T dO from identical bf16 inputs, g*T terms: 1 ulp + 2 (g T + 16) 2^-24 sum p |dO| */
        float* mdv = h_alloc(nk);
        memset(mdv, 0, nk * sizeof(float));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++)
                    for (int s = 0; s <= t; s++) {
                        float p = prr[(((size_t)b * H + h) * T + t) * T + s];
                        for (int i = 0; i < hd; i++)
                            mdv[((size_t)b * T + s) * KV * hd + (size_t)(h / g) * hd + i] +=
                                p * fabsf(go[((size_t)b * T + t) * H * hd + (size_t)h * hd + i]);
                    }
        compare("backward dv", xdv, rdv, nk, tol_bf16_mag(mdv, 2 * (g * T + 16) * ldexp(1.0, -24)), &wv);
        /* dq, dk: the GPU's GEMMs read bf16 dlogits (relative rounding 2^-9, random sign), the CPU's
         * fp32 ones: typical relative error 2^-9 of the element's magnitude, the largest a few times
         * that; bound 2^-6 of the tensor's max|ref| (plus 1 ulp) and relative L2 < 1e-2 */
        Tol tq = tol_bf16(0);
        tq.atol = ldexp(1.0, -6) * max_abs_of(rdq, nq);
        compare("backward dq", xdq, rdq, nq, tq, &wq);
        Tol tk = tol_bf16(0);
        tk.atol = ldexp(1.0, -6) * max_abs_of(rdk, nk);
        compare("backward dk (sum over the g query heads)", xdk, rdk, nk, tk, &wk);
        FREE_ALL(q, k, v, out, lg, pr, rout, rlg, rpr, mlg, go, prr, xdq, xdk, xdv, rdq, rdk, rdv, rdatt, mdv);
        dfree_all();
    }
}

/* the split attention pieces (fault injection into att_logits / att_probs and their gradients) against
 * the CPU's three-step attention, each from identical bf16 inputs; wherever the CPU reads only s <= t the
 * input holds garbage at s > t, which must change nothing */
/* Catches: a split kernel that reads the masked upper triangle, a gradient step of the split path that differs
 * from the CPU's three-step attention. */
static void test_attention_split(void) {
    printf("attention split path (llmc/cuda/attention.cuh) vs attention_softmax_forward / attention_av_forward /\n"
           "  attention_av_backward / attention_softmax_backward / attention_logits_backward\n");
    struct { int B, T, H, KV, hd; } cases[] = {{2, 37, 4, 2, 32}, {2, 128, 4, 2, 64}, {1, 64, 4, 1, 64}, {2, 50, 2, 2, 64}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int B = cases[ci].B, T = cases[ci].T, H = cases[ci].H, KV = cases[ci].KV, hd = cases[ci].hd, g = H / KV;
        size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T, rows = (size_t)B * H * T;
        float scale = 1.0f / sqrtf((float)hd);
        printf("  B %d T %d H %d KV %d hd %d\n", B, T, H, KV, hd);
        float* q = h_normal(nq, 1.5, 0.0, 1);
        float* k = h_normal(nk, 1.0, 0.0, 1);
        float* v = h_normal(nk, 1.0, 0.0, 1);
        bf16 *gq = d_bf16(q, nq), *gk = d_bf16(k, nk), *gv = d_bf16(v, nk);
        Written w;

        /* softmax from bf16 logits (garbage at s > t). Same inputs: expf (a few fp32 ulps) and the sum
         * order ((T+8) 2^-24 relative, x2): 1 ulp + rtol */
        double rt = 2 * (T + 8) * ldexp(1.0, -24) + ldexp(1.0, -21);
        float* lg = h_normal(na, 2.0, 0.0, 1);
        bf16 *glg = d_bf16(lg, na), *gpr = d_bf16_poison(na);
        attention_softmax_from_logits(gpr, glg, NULL, B, H, T, g_s);
        float* pr = dl_bf16(gpr, na, &w);
        float* rpr = h_alloc(na);
        attention_softmax_forward(rpr, lg, B, H, T, 0);
        compare("softmax from bf16 logits (garbage at s > t)", pr, rpr, na, tol_bf16(rt), &w);
        /* with ref: rows changed at s <= t recomputed, rows changed only at s > t and unchanged rows
         * left alone (here: still the poison) */
        float* lg2 = h_copy(lg, na);
        size_t expect_sel = 0;
        for (size_t r = 0; r < rows; r++) {
            int t = (int)(r % T);
            if (r % 3 == 0) { lg2[r * T + t / 2] = bf16_round(lg2[r * T + t / 2] + 1.0f); expect_sel++; }
            else if (r % 3 == 1 && t < T - 1) lg2[r * T + T - 1] = bf16_round(lg2[r * T + T - 1] + 1.0f);
        }
        bf16* gpr2 = d_bf16_poison(na);
        attention_softmax_from_logits(gpr2, d_bf16(lg2, na), glg, B, H, T, g_s);
        float* pr2 = dl_bf16(gpr2, na, &w);
        float* rpr2 = h_alloc(na);
        attention_softmax_forward(rpr2, lg2, B, H, T, 0);
        float *gs = h_alloc(na), *rs = h_alloc(na);
        size_t nsel = 0, touched = 0, unw = 0;
        for (size_t r = 0; r < rows; r++) {
            int t = (int)(r % T), changed = 0;
            for (int s2 = 0; s2 <= t; s2++) changed |= f32_bits(lg2[r * T + s2]) != f32_bits(lg[r * T + s2]);
            for (int s2 = 0; s2 < T; s2++) {
                uint32_t bits = f32_bits(pr2[r * T + s2]);
                if (changed) { gs[nsel] = pr2[r * T + s2]; rs[nsel] = rpr2[r * T + s2]; nsel++; unw += bits == 0xFFFF0000u; }
                else touched += bits != 0xFFFF0000u;
            }
        }
        Written ws = {unw, w.overrun};
        compare("  ref given: the rows changed at s <= t", gs, rs, nsel, tol_bf16(rt), &ws);
        check(touched == 0 && nsel == expect_sel * T, "      the other rows (changed only at s > t, or not at all) untouched: %zu elements written, "
              "%zu of %zu rows recomputed", touched, nsel / T, rows);

        /* probs x v from the bf16 probs (0 at s > t): the same fp32 sums in another order, T terms:
         * 1 ulp + 2 (T + 16) 2^-24 sum_s p |v| */
        float* p = h_alloc(na);
        for (size_t i = 0; i < na; i++) p[i] = bf16_round(rpr[i]);
        bf16 *gp = d_bf16(p, na), *gout = d_bf16_poison(nq);
        attention_av(gout, gp, gv, B, T, H, KV, hd, KV * hd, g_s);
        float* out = dl_bf16(gout, nq, &w);
        float *rout = h_alloc(nq), *mo = h_alloc(nq);
        attention_av_forward(rout, p, v, B, T, H, KV, hd, 0);
        float* av = h_abs(v, nk);
        attention_av_forward(mo, p, av, B, T, H, KV, hd, 0); /* p >= 0: sum_s p |v| */
        compare("av: out = probs v", out, rout, nq, tol_bf16_mag(mo, 2 * (T + 16) * ldexp(1.0, -24)), &w);
        /* the forward's own probs: attention_av gives attention_forward's out bit for bit (m = 0 faults) */
        bf16 *fout = d_bf16_poison(nq), *flg = d_bf16_poison(na), *fpr = d_bf16_poison(na), *fout2 = d_bf16_poison(nq);
        attention_forward(fout, flg, fpr, gq, gk, gv, B, T, H, KV, hd, KV * hd, g_s);
        attention_av(fout2, fpr, gv, B, T, H, KV, hd, KV * hd, g_s);
        float* o1 = dl_bf16(fout, nq, NULL);
        float* o2 = dl_bf16(fout2, nq, &w);
        compare("av from attention_forward's probs == its out", o2, o1, nq, tol_bitwise(0), &w);
        /* and softmax_from_logits with ref = the logits themselves recomputes nothing */
        float* fp0 = dl_bf16(fpr, na, NULL);
        attention_softmax_from_logits(fpr, flg, flg, B, H, T, g_s);
        float* fp1 = dl_bf16(fpr, na, &w);
        compare("softmax_from_logits, ref = logits: probs unchanged", fp1, fp0, na, tol_bitwise(0), &w);

        /* backward step 1: dprobs = dout . v (hd terms: 1 ulp + 2 (hd + 16) 2^-24 sum |dout v|), 0 at s > t;
         * dv = P^T dO as the fused backward, bit for bit */
        float* go = h_normal(nq, 1.0, 0.0, 1);
        bf16* ggo = d_bf16(go, nq);
        bf16 *gdp = d_bf16_poison(na), *gdv = d_bf16_poison(nk);
        attention_split_av_backward(gdp, gdv, ggo, gp, gv, B, T, H, KV, hd, KV * hd, g_s);
        Written wd, wv;
        float* xdp = dl_bf16(gdp, na, &wd);
        float* xdv = dl_bf16(gdv, nk, &wv);
        float *rdp = h_alloc(na), *rdv = h_alloc(nk), *mdp = h_alloc(na), *mdv = h_alloc(nk);
        attention_av_backward(rdp, rdv, go, p, v, B, T, H, KV, hd, 0);
        float* ago = h_abs(go, nq);
        attention_av_backward(mdp, mdv, ago, p, av, B, T, H, KV, hd, 0); /* sum |dout v| and sum p |dout| */
        compare("split av backward: dprobs (bf16, 0 at s > t)", xdp, rdp, na, tol_bf16_mag(mdp, 2 * (hd + 16) * ldexp(1.0, -24)), &wd);
        compare("split av backward: dv", xdv, rdv, nk, tol_bf16_mag(mdv, 2 * (g * T + 16) * ldexp(1.0, -24)), &wv);
        bf16 *fdq = d_bf16_poison(nq), *fdk = d_bf16_poison(nk), *fdv = d_bf16_poison(nk);
        attention_backward(fdq, fdk, fdv, ggo, gp, gq, gk, gv, B, T, H, KV, hd, KV * hd, g_s);
        float* xfdv = dl_bf16(fdv, nk, NULL);
        compare("split av backward: dv == the fused backward's", xdv, xfdv, nk, tol_bitwise(0), &wv);

        /* step 2 (garbage dprobs at s > t): dl = p (dp - sum p dp); 1 ulp + 2 (T + 16) 2^-24 p (|dp| + sum p |dp|) */
        float* dpin = h_normal(na, 4.0, 0.0, 1);
        bf16 *gdpin = d_bf16(dpin, na), *gdl = d_bf16_poison(na);
        attention_split_softmax_backward(gdl, gdpin, gp, B, H, T, g_s);
        Written wl;
        float* xdl = dl_bf16(gdl, na, &wl);
        float *rdl = h_alloc(na), *mdl = h_alloc(na);
        attention_softmax_backward(rdl, dpin, p, B, H, T, 0);
        for (size_t r = 0; r < rows; r++) {
            int t = (int)(r % T);
            double sp = 0;
            for (int s2 = 0; s2 <= t; s2++) sp += (double)p[r * T + s2] * fabsf(dpin[r * T + s2]);
            for (int s2 = 0; s2 < T; s2++) mdl[r * T + s2] = s2 <= t ? (float)(p[r * T + s2] * (fabsf(dpin[r * T + s2]) + sp)) : 0.0f;
        }
        compare("split softmax backward: dlogits (unscaled, 0 at s > t)", xdl, rdl, na, tol_bf16_mag(mdl, 2 * (T + 16) * ldexp(1.0, -24)), &wl);
        attention_split_softmax_backward(gdpin, gdpin, gp, B, H, T, g_s);
        float* xdl2 = dl_bf16(gdpin, na, &wl);
        compare("split softmax backward in place == out of place", xdl2, xdl, na, tol_bitwise(0), &wl);

        /* step 3 (garbage dlogits at s > t, zeroed in place): dq = scale dL K, dk = scale dL^T Q;
         * 1 ulp + 2 (terms + 16) 2^-24 scale sum |dl| |k or q| */
        float* dlin = h_normal(na, 0.1, 0.0, 1);
        bf16 *gdlin = d_bf16(dlin, na), *gdq = d_bf16_poison(nq), *gdk = d_bf16_poison(nk);
        attention_split_logits_backward(gdq, gdk, gdlin, gq, gk, B, T, H, KV, hd, g_s);
        Written wq, wk, wm;
        float* xdq = dl_bf16(gdq, nq, &wq);
        float* xdk = dl_bf16(gdk, nk, &wk);
        float* xdlm = dl_bf16(gdlin, na, &wm);
        float *rdq = h_alloc(nq), *rdk = h_alloc(nk), *mdq = h_alloc(nq), *mdk = h_alloc(nk);
        attention_logits_backward(rdq, rdk, dlin, q, k, B, T, H, KV, hd, 0);
        float *adl = h_abs(dlin, na), *aq = h_abs(q, nq), *ak = h_abs(k, nk);
        attention_logits_backward(mdq, mdk, adl, aq, ak, B, T, H, KV, hd, 0);
        compare("split logits backward: dq", xdq, rdq, nq, tol_bf16_mag(mdq, 2 * (T + 16) * ldexp(1.0, -24)), &wq);
        compare("split logits backward: dk", xdk, rdk, nk, tol_bf16_mag(mdk, 2 * (g * T + 16) * ldexp(1.0, -24)), &wk);
        float* dlm = h_alloc(na);
        for (size_t i = 0; i < na; i++) dlm[i] = (int)(i % T) > (int)((i / T) % T) ? 0.0f : dlin[i];
        compare("split logits backward: dlogits zeroed at s > t, else kept", xdlm, dlm, na, tol_bitwise(0), &wm);

        /* the three steps chained (dprobs, dlogits in one bf16 buffer, in place) vs the CPU's attention_backward:
         * the tolerance of the fused backward (test_attention); the split one rounds dprobs to bf16 too */
        bf16 *gbuf = d_bf16_poison(na), *sdq = d_bf16_poison(nq), *sdk = d_bf16_poison(nk), *sdv = d_bf16_poison(nk);
        attention_split_av_backward(gbuf, sdv, ggo, gp, gv, B, T, H, KV, hd, KV * hd, g_s);
        attention_split_softmax_backward(gbuf, gbuf, gp, B, H, T, g_s);
        attention_split_logits_backward(sdq, sdk, gbuf, gq, gk, B, T, H, KV, hd, g_s);
        Written cq, ck;
        float* cdq = dl_bf16(sdq, nq, &cq);
        float* cdk = dl_bf16(sdk, nk, &ck);
        float *bdq = h_alloc(nq), *bdk = h_alloc(nk), *bdv = h_alloc(nk), *batt = h_alloc(na);
        attention_backward(bdq, bdk, bdv, batt, go, p, q, k, v, B, T, H, KV, hd);
        Tol tq = tol_bf16(0);
        tq.atol = ldexp(1.0, -6) * max_abs_of(bdq, nq);
        compare("split backward chained: dq", cdq, bdq, nq, tq, &cq);
        Tol tk = tol_bf16(0);
        tk.atol = ldexp(1.0, -6) * max_abs_of(bdk, nk);
        compare("split backward chained: dk", cdk, bdk, nk, tk, &ck);

        FREE_ALL(q, k, v, lg, pr, rpr, lg2, pr2, rpr2, gs, rs, p, out, rout, mo, av, o1, o2, fp0, fp1, go, xdp, xdv, rdp, rdv, mdp, mdv,
                 ago, xfdv, dpin, xdl, rdl, mdl, xdl2, dlin, xdq, xdk, xdlm, rdq, rdk, mdq, mdk, adl, aq, ak, dlm, cdq, cdk, bdq, bdk,
                 bdv, batt);
        dfree_all();
    }
}

/* the fused attention (llmc/cuda/flash_attention.cuh) against the CPU's attention_forward / attention_backward
 * (fp32, from the same bf16 q, k, v, dout), for determinism, for a strided v, and against the materialised path.
 * Bounds per element, derived from the arithmetic of both sides (u = 2^-24, the fp32 unit roundoff; ub = 2^-8,
 * bf16's), on top of 1 bf16 ulp for the GPU's final rounding; each side errs by at most its bound, so the
 * difference gets both. The GPU's tile products are mma.sync m16n8k16: bf16 operands, products exact in fp32,
 * accumulated in fp32 in k-blocks of 16 whose internal rounding NVIDIA does not document (it may truncate), so
 * a dot of n terms there errs by at most 2 (n + 16) u sum |terms| (twice the round-to-nearest bound of n + 16
 * sequential additions); the CPU's sequential fp32 dot by (n + 4) u sum |terms|, below that.
 *   z[t,s]  ez = 2 (hd + 16) u scale sum_d |q k| per side; EZ[t] its max over s <= t;
 *   p       relative error eP[t] = 2 (2 EZ[t] + (T + 16) u)   (numerator and normaliser, exp, sums);
 *   out     (eP[t] + ub + 2 (T + 16) u) sum_s p |v|: the GPU rounds P (unnormalised, each term relative ub)
 *           to bf16 as the A operand of P V and normalises by the row sum of the unrounded P;
 *   lse     2 EZ[t] + (2 T + 16) u + 8 u |lse|  (fp32 sums and log on both sides);
 *   D[t]    the GPU's from its bf16 out: sum_d |dout| (2^-8 |out| + out's bound) + 2 (T + hd + 16) u (sum_s p |dP| + sum_d |dout out|);
 *   dZ[t,s] p ((eP + 4u) |dP - D| + 2 (hd + 16) u sum_d |dout v| + dD + 2u (|dP| + |D|));
 *   dq      scale sum_s (dZ's bound + (ub + 2 (T + 16) u) |dZ|) |k|  (dZ rounded to bf16 as the A operand of dZ K);
 *   dk      likewise over (h, t) (g T terms) with |q|;   dv  sum_(h,t) p (eP + ub + 2 (g T + 16) u) |dout|  (P^T rounded).
 * Against the materialised path (which multiplies bf16 probs and bf16 dlogits, bounded in test_attention
 * by 2^-8 max|v| for out, 2^-6 max|ref| for dq and dk, 2^-8 sum p |dout| for dv): the sum of both bounds,
 * 2 ulps. All with relative L2 < 1e-2. The cases: head_dim 32, 64, 128; MHA and GQA (g 2, 4); T 37, 50, 70,
 * 100, 130, none a multiple of the 64-row tiles; the dk/dv head split at 1 (MHA), 2 of g 4 (B 33: 132 key blocks)
 * and g (the small grids); v and dv as strided views of a fused [B*T, (H + 2 KV) hd] buffer (bitwise the
 * contiguous run, the other columns never read: NaN there, and never written: still the poison). */
/* Catches: an online softmax that rescales wrongly across tiles, the causal skip dropping a diagonal tile, T not a
 * multiple of the tile mishandled, a P / dZ fragment handed to the wrong mma operand position, a cp.async tile
 * read before its wait, a dK/dV or dQ order that changes between runs (atomics), a head split summed out of
 * order, a GQA mapping error, a strided v read or dv written at the contiguous stride. */
static uint16_t* dl_bits(const bf16* d, size_t n);
/* the head split's sum pass alone (flash_attention_dkdv_sum_kernel), on partials that cancel (N(0,1) 2^-3sp, the
 * last one minus their sum plus N(0,1) 2^-16) so that the rounding of the fp32 additions, hence their order,
 * shows in the bf16 results (about one element in ten): bitwise
 * the host's sum in split order; the host's reversed order must differ somewhere (else this check could not see
 * an order change) */
static void test_flash_dkdv_sum(void) {
    const int rows = 64, kvhd = 128, ldv = 320;
    const size_t n = (size_t)rows * kvhd;
    const float scale = 0.125f;
    for (int nsplit = 3; nsplit <= 4; nsplit++) {
        float* part = h_alloc(2 * (size_t)nsplit * n);
        for (size_t i = 0; i < 2 * n; i++) {
            double sum = 0;
            for (int sp = 0; sp < nsplit - 1; sp++) {
                part[(size_t)sp * 2 * n + i] = (float)(rng_normal(&g_rng) * ldexp(1.0, -3 * sp));
                sum += part[(size_t)sp * 2 * n + i];
            }
            part[(size_t)(nsplit - 1) * 2 * n + i] = (float)(-sum + rng_normal(&g_rng) * ldexp(1.0, -16));
        }
        float* dpart = d_f32(part, 2 * (size_t)nsplit * n);
        bf16 *gk = d_bf16_poison(n), *gv = d_bf16_poison((size_t)rows * ldv);
        flash_attention_dkdv_sum_kernel<<<(unsigned)CEIL_DIV(n / 4, (size_t)256), 256, 0, g_s>>>(gk, gv, dpart, n, kvhd, ldv, nsplit, scale);
        cudaCheck(cudaGetLastError());
        uint16_t* xk = dl_bits(gk, n);
        uint16_t* xv = dl_bits(gv, (size_t)rows * ldv);
        size_t dif = 0, rev = 0, touched = 0;
        for (size_t i = 0; i < n; i++) {
            float sk = part[i], sv = part[n + i], rk = part[(size_t)(nsplit - 1) * 2 * n + i], rv = part[(size_t)(nsplit - 1) * 2 * n + n + i];
            for (int sp = 1; sp < nsplit; sp++) { sk += part[(size_t)sp * 2 * n + i]; sv += part[(size_t)sp * 2 * n + n + i]; }
            for (int sp = nsplit - 2; sp >= 0; sp--) { rk += part[(size_t)sp * 2 * n + i]; rv += part[(size_t)sp * 2 * n + n + i]; }
            const uint16_t ek = f32_to_bf16_bits(sk * scale), ev = f32_to_bf16_bits(sv);
            dif += (xk[i] != ek) + (xv[i / kvhd * ldv + i % kvhd] != ev);
            rev += (f32_to_bf16_bits(rk * scale) != ek) + (f32_to_bf16_bits(rv) != ev);
        }
        for (size_t i = 0; i < (size_t)rows * ldv; i++) touched += (int)(i % ldv) >= kvhd && xv[i] != 0xFFFF;
        check(dif == 0 && rev > 0 && touched == 0,
              "  sum pass, %d splits: bitwise the in-order sum (%zu of %zu differ; the reversed order would differ in %zu); dv's other columns untouched "
              "(%zu written)", nsplit, dif, 2 * n, rev, touched);
        /* dv NULL (dk alone): the same dk bits */
        bf16* gk2 = d_bf16_poison(n);
        flash_attention_dkdv_sum_kernel<<<(unsigned)CEIL_DIV(n / 4, (size_t)256), 256, 0, g_s>>>(gk2, NULL, dpart, n, kvhd, ldv, nsplit, scale);
        cudaCheck(cudaGetLastError());
        uint16_t* xk2 = dl_bits(gk2, n);
        check(!memcmp(xk2, xk, n * 2), "  sum pass, %d splits, dk alone (dv NULL): dk bitwise the same: %s", nsplit, !memcmp(xk2, xk, n * 2) ? "yes" : "NO");
        free(xk2);
        FREE_ALL(part, xk, xv);
        dfree_all();
    }
}
static void test_flash_attention(void) {
    printf("fused attention (llmc/cuda/flash_attention.cuh) vs attention_forward / attention_backward, determinism, strided v,\n"
           "  vs llmc/cuda/attention.cuh\n");
    test_flash_dkdv_sum();
    struct { int B, T, H, KV, hd, strided; } cases[] = {
        {2, 37, 4, 2, 64, 0}, {1, 130, 8, 2, 64, 1}, {2, 37, 4, 4, 128, 0}, {1, 130, 4, 2, 128, 1}, {1, 100, 8, 2, 128, 0},
        {1, 70, 4, 1, 32, 1}, {33, 50, 16, 4, 32, 0}};
    const double u = ldexp(1.0, -24), ub = ldexp(1.0, -8);
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int B = cases[ci].B, T = cases[ci].T, H = cases[ci].H, KV = cases[ci].KV, hd = cases[ci].hd, g = H / KV;
        const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T, nr = (size_t)B * H * T;
        const size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
        const float scale = 1.0f / sqrtf((float)hd);
        printf("  B %d T %d H %d KV %d hd %d (g %d; dk/dv: %d head split%s)%s\n", B, T, H, KV, hd, g, flash_dkdv_splits(B, T, KV, g, 64),
               flash_dkdv_splits(B, T, KV, g, 64) > 1 ? "s" : "", cases[ci].strided ? ", strided v" : "");
        float* q = h_normal(nq, 1.5, 0.0, 1);
        float* k = h_normal(nk, 1.0, 0.0, 1);
        float* v = h_normal(nk, 1.0, 0.0, 1);
        float* go = h_normal(nq, 1.0, 0.0, 1);
        bf16 *dq_in = d_bf16(q, nq), *dk_in = d_bf16(k, nk), *dv_in = d_bf16(v, nk), *dgo = d_bf16(go, nq);
        bf16* gout = d_bf16_poison(nq);
        float* glse = d_f32_poison(nr);
        flash_attention_forward(gout, glse, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s);
        Written wo, wl;
        float* out = dl_bf16(gout, nq, &wo);
        float* lse = dl_f32(glse, nr, &wl);
        float *rout = h_alloc(nq), *rlg = h_alloc(na), *rpr = h_alloc(na);
        attention_forward(rout, rlg, rpr, q, k, v, B, T, H, KV, hd);

        /* per row: EZ, eP, lse (double, from the CPU's fp32 logits), D (double, sum_s p dP) */
        float *rlse = h_alloc(nr), *mlse = h_alloc(nr), *mout = h_alloc(nq);
        double *eP = (double*)mallocCheck(nr * sizeof(double)), *Dx = (double*)mallocCheck(nr * sizeof(double));
        double *dD = (double*)mallocCheck(nr * sizeof(double));
        double* dP = (double*)mallocCheck((size_t)T * sizeof(double));
        double* adP = (double*)mallocCheck((size_t)T * sizeof(double));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    const size_t r = ((size_t)b * H + h) * T + t;
                    const float* qt = q + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    const float* lr = rlg + r * T;
                    double EZ = 0, mx = -INFINITY, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        const float* kk = k + ((size_t)b * T + s) * ks + (size_t)(h / g) * hd;
                        double a = 0;
                        for (int i = 0; i < hd; i++) a += fabs((double)qt[i] * kk[i]);
                        EZ = fmax(EZ, 2 * (hd + 16) * u * scale * a);
                        mx = fmax(mx, lr[s]);
                    }
                    for (int s = 0; s <= t; s++) sum += exp(lr[s] - mx);
                    rlse[r] = (float)(mx + log(sum));
                    mlse[r] = (float)(2 * EZ + (2.0 * T + 16) * u + 8 * u * fabs(rlse[r]));
                    eP[r] = 2 * (2 * EZ + (T + 16) * u);
                    for (int i = 0; i < hd; i++) {
                        double spv = 0;
                        for (int s = 0; s <= t; s++)
                            spv += rpr[r * T + s] * fabs((double)v[((size_t)b * T + s) * ks + (size_t)(h / g) * hd + i]);
                        mout[((size_t)b * T + t) * qs + (size_t)h * hd + i] = (float)((eP[r] + ub + 2 * (T + 16) * u) * spv);
                    }
                }
        compare("forward out", out, rout, nq, tol_bf16_mag(mout, 1.0), &wo);
        compare("forward lse [B,H,T] (fp32)", lse, rlse, nr, tol_f32(mlse, 1.0, 0.0, 0.0), &wl);

        /* backward from the forward's own out and lse */
        bf16 *gdq = d_bf16_poison(nq), *gdk = d_bf16_poison(nk), *gdv = d_bf16_poison(nk);
        flash_attention_backward(gdq, gdk, gdv, dgo, gout, glse, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s);
        Written wq, wk, wv;
        float* xdq = dl_bf16(gdq, nq, &wq);
        float* xdk = dl_bf16(gdk, nk, &wk);
        float* xdv = dl_bf16(gdv, nk, &wv);
        /* the head split's sum pass: the fp32 partials it left in the workspace, added on the host in split
         * order sp = 0, 1, ... (fp32, as documented), dk times scale, rounded: bitwise the kernel's dk, dv.
         * With 3 or more splits another order gives other bits (fp32 addition is not associative). */
        const int nsplit = flash_dkdv_splits(B, T, KV, g, 64);
        if (nsplit > 1) {
            const size_t poff = CEIL_DIV(nr, (size_t)4) * 4;
            float* part = h_alloc(2 * (size_t)nsplit * nk);
            cudaCheck(cudaMemcpy(part, cuda_workspace_f32(FLASH_SLOT, 1) + poff, 2 * (size_t)nsplit * nk * sizeof(float), cudaMemcpyDeviceToHost));
            size_t dif = 0;
            for (size_t i = 0; i < nk; i++) {
                float sk = part[i], sv = part[nk + i];
                for (int sp = 1; sp < nsplit; sp++) { sk += part[(size_t)sp * 2 * nk + i]; sv += part[(size_t)sp * 2 * nk + nk + i]; }
                dif += f32_bits(bf16_round(sk * scale)) != f32_bits(xdk[i]);
                dif += f32_bits(bf16_round(sv)) != f32_bits(xdv[i]);
            }
            check(dif == 0, "    dk/dv head split (%d): the fp32 partials summed in split order give the kernel's dk, dv bitwise (%zu of %zu differ)", nsplit,
                  dif, 2 * nk);
            free(part);
        }
        float *rdq = h_alloc(nq), *rdk = h_alloc(nk), *rdv = h_alloc(nk), *rdatt = h_alloc(na);
        attention_backward(rdq, rdk, rdv, rdatt, go, rpr, q, k, v, B, T, H, KV, hd);
        float *mdq = h_alloc(nq), *mdk = h_alloc(nk), *mdv = h_alloc(nk), *spdo = h_alloc(nk);
        memset(mdq, 0, nq * sizeof(float));
        memset(mdk, 0, nk * sizeof(float));
        memset(mdv, 0, nk * sizeof(float));
        memset(spdo, 0, nk * sizeof(float));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    const size_t r = ((size_t)b * H + h) * T + t;
                    const float* dot_ = go + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    const float* qt = q + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    const float* ot = rout + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    const float* mo = mout + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    double D = 0, spdp = 0, sdo = 0, dDo = 0;
                    for (int s = 0; s <= t; s++) {
                        const float* vv = v + ((size_t)b * T + s) * ks + (size_t)(h / g) * hd;
                        double a = 0, aa = 0;
                        for (int i = 0; i < hd; i++) { a += (double)dot_[i] * vv[i]; aa += fabs((double)dot_[i] * vv[i]); }
                        dP[s] = a;
                        adP[s] = aa;
                        D += rpr[r * T + s] * a;
                        spdp += rpr[r * T + s] * fabs(a);
                    }
                    for (int i = 0; i < hd; i++) {
                        sdo += fabs((double)dot_[i] * ot[i]);
                        dDo += fabs((double)dot_[i]) * (ldexp(1.0, -8) * fabs((double)ot[i]) + mo[i]);
                    }
                    Dx[r] = D;
                    dD[r] = dDo + 2 * (T + hd + 16) * u * (spdp + sdo);
                    for (int s = 0; s <= t; s++) {
                        const double p = rpr[r * T + s];
                        const double dz = p * fabs(dP[s] - D);
                        const double edz = p * ((eP[r] + 4 * u) * fabs(dP[s] - D) + 2 * (hd + 16) * u * adP[s] + dD[r] + 2 * u * (fabs(dP[s]) + fabs(D)));
                        const size_t ko = ((size_t)b * T + s) * ks + (size_t)(h / g) * hd;
                        const double wq_ = scale * (edz + (ub + 2 * (T + 16) * u) * dz), wk_ = scale * (edz + (ub + 2 * (g * T + 16) * u) * dz);
                        const double wv_ = p * (eP[r] + ub + 2 * (g * T + 16) * u);
                        for (int i = 0; i < hd; i++) {
                            mdq[((size_t)b * T + t) * qs + (size_t)h * hd + i] += (float)(wq_ * fabs((double)k[ko + i]));
                            mdk[ko + i] += (float)(wk_ * fabs((double)qt[i]));
                            mdv[ko + i] += (float)(wv_ * fabs((double)dot_[i]));
                            spdo[ko + i] += (float)(p * fabs((double)dot_[i]));
                        }
                    }
                }
        compare("backward dq", xdq, rdq, nq, tol_bf16_mag(mdq, 1.0), &wq);
        compare("backward dk (sum over the g query heads)", xdk, rdk, nk, tol_bf16_mag(mdk, 1.0), &wk);
        compare("backward dv (sum over the g query heads)", xdv, rdv, nk, tol_bf16_mag(mdv, 1.0), &wv);

        /* determinism: a second forward and backward into fresh (poisoned) buffers, bitwise; this forward also leaves the
         * rows' sums of squares a head (rss, -protect bound's o check), which change nothing else and equal, bitwise, the
         * kernel's order replayed on the host over the stored out: each quad lane tq its columns 8 nd + 2 tq, + 1 in nd
         * order, then (q0 + q1) + (q2 + q3) */
        bf16 *gout2 = d_bf16_poison(nq), *gdq2 = d_bf16_poison(nq), *gdk2 = d_bf16_poison(nk), *gdv2 = d_bf16_poison(nk);
        float* glse2 = d_f32_poison(nr);
        double* grss = (double*)dalloc_raw(nr, 8);
        flash_attention_forward(gout2, glse2, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s, NULL, grss);
        {
            double* hrss = (double*)mallocCheck(nr * sizeof(double));
            cudaCheck(cudaMemcpy(hrss, grss, nr * sizeof(double), cudaMemcpyDeviceToHost));
            long bad_rss = 0;
            for (size_t row = 0; row < (size_t)B * T; row++)
                for (int hh = 0; hh < H; hh++) {
                    double qs[4] = {0, 0, 0, 0};
                    const float* x = out + row * H * hd + (size_t)hh * hd;
                    for (int tq = 0; tq < 4; tq++)
                        for (int nd = 0; nd < hd / 8; nd++) {
                            const double lo = x[8 * nd + 2 * tq], hi = x[8 * nd + 2 * tq + 1];
                            qs[tq] += lo * lo;
                            qs[tq] += hi * hi;
                        }
                    const double want = (qs[0] + qs[1]) + (qs[2] + qs[3]);
                    bad_rss += memcmp(&want, &hrss[row * H + hh], 8) != 0;
                }
            check(bad_rss == 0, "    the rows' sums of squares a head (rss): %ld of %zu differ from the host's replay of the kernel's order",
                  bad_rss, nr);
            free(hrss);
        }
        flash_attention_backward(gdq2, gdk2, gdv2, dgo, gout2, glse2, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s);
        float* out2 = dl_bf16(gout2, nq, NULL);
        float* lse2 = dl_f32(glse2, nr, NULL);
        float* xdq2 = dl_bf16(gdq2, nq, NULL);
        float* xdk2 = dl_bf16(gdk2, nk, NULL);
        float* xdv2 = dl_bf16(gdv2, nk, NULL);
        int same = !memcmp(out2, out, nq * 4) && !memcmp(lse2, lse, nr * 4) && !memcmp(xdq2, xdq, nq * 4) && !memcmp(xdk2, xdk, nk * 4) &&
                   !memcmp(xdv2, xdv, nk * 4);
        check(same, "    determinism: a second forward + backward, out lse dq dk dv bitwise equal: %s", same ? "yes" : "NO");
        if (flash_dkdv_splits(B, T, KV, H / KV, 64) > 1) {   /* the head split's sum inside the dk/dv kernel == the sum kernel's */
            bf16 *gdq5 = d_bf16_poison(nq), *gdk5 = d_bf16_poison(nk), *gdv5 = d_bf16_poison(nk);
            g_flash_sum_kernel = 1;
            flash_attention_backward(gdq5, gdk5, gdv5, dgo, gout2, glse2, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s);
            g_flash_sum_kernel = 0;
            float* xdk5 = dl_bf16(gdk5, nk, NULL);
            float* xdv5 = dl_bf16(gdv5, nk, NULL);
            const int same5 = !memcmp(xdk5, xdk, nk * 4) && !memcmp(xdv5, xdv, nk * 4);
            check(same5, "    head split %d: the sum inside the dk/dv kernel == the separate sum kernel, dk dv bitwise: %s",
                  flash_dkdv_splits(B, T, KV, H / KV, 64), same5 ? "yes" : "NO");
            FREE_ALL(xdk5, xdv5);
        }
        {   /* -protect qk_bwd's rerun: D computed twice in the first pass (clean: no flag), then dv NULL (the dk/dv kernel's
             * dk-only variant, both in one launch: flash_attention_backward_dqdk_kernel) from that D (reuse_d): dq and dk bitwise
             * the full backward's (two launches) */
            unsigned long long* dflag = (unsigned long long*)d_f32_poison(2);
            cudaCheck(cudaMemset(dflag, 0, sizeof(unsigned long long)));
            bf16 *gdq4 = d_bf16_poison(nq), *gdk4 = d_bf16_poison(nk), *gdv4 = d_bf16_poison(nk);
            flash_attention_backward(gdq4, gdk4, gdv4, dgo, gout, glse, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s, NULL, dflag);
            unsigned long long hflag = 1;
            cudaCheck(cudaMemcpy(&hflag, dflag, sizeof(hflag), cudaMemcpyDeviceToHost));
            {   /* the D the dq kernel made (FlashRowDot, workspace slot 4) == flash_attention_rowdot_kernel's, bitwise; a
                 * planted flip of the dq kernel's D of row 0 (g_flash_d_plant) is flagged by its duplicate and changes dq */
                float* hD = dl_f32(cuda_workspace_f32(FLASH_SLOT, 1), nr, NULL);
                float* gD = d_f32_poison(nr);
                flash_attention_rowdot_kernel<<<(unsigned)CEIL_DIV(nr, (size_t)8), 256, 0, g_s>>>(gD, dgo, gout, B, T, H, hd, NULL, 0u);
                cudaCheck(cudaGetLastError());
                float* hD2 = dl_f32(gD, nr, NULL);
                const int sameD = !memcmp(hD, hD2, nr * 4);
                check(sameD, "    D made by the dq kernel == flash_attention_rowdot_kernel's, bitwise: %s", sameD ? "yes" : "NO");
                unsigned long long pflag = 0;
                cudaCheck(cudaMemset(dflag, 0, sizeof(unsigned long long)));
                bf16* gdq6 = d_bf16_poison(nq);
                g_flash_d_plant = 1u << 20;
                flash_attention_backward(gdq6, gdk4, gdv4, dgo, gout, glse, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s, NULL, dflag);
                g_flash_d_plant = 0;
                cudaCheck(cudaMemcpy(&pflag, dflag, sizeof(pflag), cudaMemcpyDeviceToHost));
                float* xdq6 = dl_bf16(gdq6, nq, NULL);
                const int moved = memcmp(xdq6, xdq, nq * 4) != 0;
                check(pflag != 0 && moved, "    the dq kernel's D: a planted change of row 0's primary sum flagged: %s, dq changed: %s",
                      pflag ? "yes" : "NO", moved ? "yes" : "NO");
#ifdef __CUDA_EMU__
                /* the first pass is the dq and dk/dv launches, no D launch (plus the head split's sum, when separate) */
                const long long l0 = (long long)emu_counters()->launches;
                flash_attention_backward(gdq6, gdk4, gdv4, dgo, gout, glse, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s, NULL, dflag);
                const long long nl = (long long)emu_counters()->launches - l0;
                check(nl == 2, "    the first pass's launches: %lld (want 2: dq with D inside, dk/dv)", nl);
#endif
                FREE_ALL(hD, hD2, xdq6);
            }
            cudaCheck(cudaMemset(gdq4, 0xff, nq * 2));
            cudaCheck(cudaMemset(gdk4, 0xff, nk * 2));
            flash_attention_backward(gdq4, gdk4, NULL, dgo, gout, glse, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s, NULL, NULL, true);
            float* xdq4 = dl_bf16(gdq4, nq, NULL);
            float* xdk4 = dl_bf16(gdk4, nk, NULL);
            const int same4 = !memcmp(xdq4, xdq, nq * 4) && !memcmp(xdk4, xdk, nk * 4);
            check(same4 && hflag == 0, "    D computed twice: flag %llu (want 0); dq and dk alone (dv NULL: one launch) from that D: bitwise the full backward's: %s",
                  hflag, same4 ? "yes" : "NO");
            /* a planted change of the primary D of row 0: the duplicate's comparison flags it */
            float* Dw = cuda_workspace_f32(FLASH_SLOT, 1);
            cudaCheck(cudaMemset(dflag, 0, sizeof(unsigned long long)));
            flash_attention_rowdot_kernel<<<(unsigned)CEIL_DIV(nr, (size_t)8), 256, 0, g_s>>>(Dw, dgo, gout, B, T, H, hd, dflag, 1u);
            cudaCheck(cudaGetLastError());
            cudaCheck(cudaMemcpy(&hflag, dflag, sizeof(hflag), cudaMemcpyDeviceToHost));
            check(hflag != 0, "    D's duplicate: a planted change of row 0's primary sum flagged: %s", hflag ? "yes" : "NO");
            /* the rerun with the Q/K path's backward in its epilogue (FlashQkEpi): the fingerprints of RoPE's backward (and,
             * with the weighted QK norm, of the norm's dx) equal those of the separate fingerprint-only kernels over the dq,
             * dk the rerun wrote above (rope_qk / rope_qknorm_backward_fp_qk); x as views of a [B T, (H + KV) hd + 8]
             * buffer, the RoPE style alternating with the case. A flipped sign in the dq the separate kernel reads changes
             * its fingerprint (the comparison can fail). Catches a tile row or column left out or taken from the wrong
             * place, the unscaled or unrounded tile, the wrong position, head or kv head in the epilogue, and the head
             * split's tile fingerprinted before its sum. */
            {
                const int style = (int)(ci % 2) ? ROPE_NANOCHAT : ROPE_HF, half = hd / 2, ldx = (H + KV) * hd + 8;
                Config cc = *preset_find("tiny-qwen3");
                cc.head_dim = hd;
                cc.rope_style = style;
                float *cs = h_alloc((size_t)T * half), *sn = h_alloc((size_t)T * half);
                rope_tables(&cc, T, cs, sn);
                float* xh = h_normal((size_t)B * T * ldx, 1.0, 0.0, 1);
                float* wh = h_normal(2 * (size_t)hd, 0.5, 1.0, 1);
                float* msh = h_normal((size_t)B * T * (H + KV), 0.3, 1.0, 0);
                for (size_t i = 0; i < (size_t)B * T * (H + KV); i++) msh[i] = fabsf(msh[i]) + 0.05f;
                float *dcs = d_f32(cs, (size_t)T * half), *dsn = d_f32(sn, (size_t)T * half), *dms = d_f32(msh, (size_t)B * T * (H + KV));
                bf16 *dx = d_bf16(xh, (size_t)B * T * ldx), *dw = d_bf16(wh, 2 * (size_t)hd);
                unsigned long long* fa = (unsigned long long*)d_f32_poison(8 * FP_WORDS * 2);
                for (int wn = 0; wn <= 1; wn++) {
                    cudaCheck(cudaMemset(fa, 0, 8 * FP_WORDS * sizeof(unsigned long long)));
                    unsigned long long *rq = fa, *rk = fa + FP_WORDS, *eq = fa + 2 * FP_WORDS, *ek = fa + 3 * FP_WORDS, *pq = fa + 4 * FP_WORDS;
                    const bf16 *xq = dx + 8, *xk = dx + 8 + (size_t)H * hd;   /* views: q's columns, then k's */
                    const float *msq = dms, *msk = dms + (size_t)B * T * H;
                    if (wn) rope_qknorm_backward_fp_qk(gdq4, gdk4, xq, xk, ldx, dw, dw + hd, msq, msk, B, T, H, KV, hd, 1e-6f, dcs, dsn, style, rq, rk, g_s);
                    else rope_qk(NULL, NULL, gdq4, gdk4, H * hd, KV * hd, dcs, dsn, B, T, H, KV, hd, style, true, rq, rk, g_s);
                    const FlashQkEpi e = {dcs, dsn, style, 1e-6f, wn ? xq : NULL, wn ? xk : NULL, ldx, wn ? dw : NULL, wn ? dw + hd : NULL,
                                          wn ? msq : NULL, wn ? msk : NULL, eq, ek};
                    /* D made again (the plant above left slot 4's changed) */
                    flash_attention_backward(NULL, NULL, NULL, dgo, gout, glse, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s, NULL, NULL, false, &e);
                    /* the planted difference: the sign of dq's last element flipped for the separate kernel */
                    uint16_t bit;
                    cudaCheck(cudaMemcpy(&bit, gdq4 + nq - 1, 2, cudaMemcpyDeviceToHost));
                    bit ^= 0x8000;
                    cudaCheck(cudaMemcpy(gdq4 + nq - 1, &bit, 2, cudaMemcpyHostToDevice));
                    if (wn) rope_qknorm_backward_fp_qk(gdq4, gdk4, xq, xk, ldx, dw, dw + hd, msq, msk, B, T, H, KV, hd, 1e-6f, dcs, dsn, style, pq,
                                                       pq + FP_WORDS, g_s);
                    else rope_qk(NULL, NULL, gdq4, gdk4, H * hd, KV * hd, dcs, dsn, B, T, H, KV, hd, style, true, pq, pq + FP_WORDS, g_s);
                    bit ^= 0x8000;
                    cudaCheck(cudaMemcpy(gdq4 + nq - 1, &bit, 2, cudaMemcpyHostToDevice));
                    unsigned long long h[5 * FP_WORDS];
                    cudaCheck(cudaMemcpy(h, fa, sizeof(h), cudaMemcpyDeviceToHost));
                    const int eqq = h[0] == h[4] && h[1] == h[5], ekk = h[2] == h[6] && h[3] == h[7], moved = h[8] != h[0] || h[9] != h[1];
                    check(eqq && ekk && moved && (h[0] | h[1]) != 0,
                          "    the rerun with %s backward in its epilogue (%s, head split %d): Q, K fingerprints those of the separate kernel: %s, %s; "
                          "a flipped sign in dq moves Q's: %s", wn ? "RoPE's and the QK norm's" : "RoPE's", style == ROPE_HF ? "HF" : "nanochat",
                          flash_dkdv_splits(B, T, KV, H / KV, 64), eqq ? "yes" : "NO", ekk ? "yes" : "NO", moved ? "yes" : "NO");
                }
                FREE_ALL(cs, sn, xh, wh, msh);
            }
            FREE_ALL(xdq4, xdk4);
        }

        /* strided v / dv: columns (H + KV) hd .. (H + 2 KV) hd of a [B*T, (H + 2 KV) hd] buffer, NaN elsewhere
         * in v (never read) and the poison elsewhere in dv (never written); the results bitwise the contiguous run's */
        if (cases[ci].strided) {
            const int ldv = (H + 2 * KV) * hd;
            const size_t nv = (size_t)B * T * ldv, voff = (size_t)(H + KV) * hd;
            float* vs = h_alloc(nv);
            for (size_t i = 0; i < nv; i++) vs[i] = NAN;
            for (size_t r = 0; r < (size_t)B * T; r++) memcpy(vs + r * ldv + voff, v + r * ks, ks * sizeof(float));
            bf16* dvs = d_bf16(vs, nv);
            bf16 *gout3 = d_bf16_poison(nq), *gdq3 = d_bf16_poison(nq), *gdk3 = d_bf16_poison(nk), *gdv3 = d_bf16_poison(nv);
            float* glse3 = d_f32_poison(nr);
            flash_attention_forward(gout3, glse3, dq_in, dk_in, dvs + voff, B, T, H, KV, hd, ldv, g_s);
            flash_attention_backward(gdq3, gdk3, gdv3 + voff, dgo, gout3, glse3, dq_in, dk_in, dvs + voff, B, T, H, KV, hd, ldv, g_s);
            Written w3;
            float* out3 = dl_bf16(gout3, nq, NULL);
            float* lse3 = dl_f32(glse3, nr, NULL);
            float* xdq3 = dl_bf16(gdq3, nq, NULL);
            float* xdk3 = dl_bf16(gdk3, nk, NULL);
            uint16_t* dv3 = dl_bits(gdv3, nv);
            size_t vdiff = 0, touched = 0;
            for (size_t r = 0; r < (size_t)B * T; r++)
                for (size_t c = 0; c < (size_t)ldv; c++) {
                    const uint16_t x = dv3[r * ldv + c];
                    if (c >= voff && c < voff + ks) vdiff += f32_bits(bf16_bits_to_f32(x)) != f32_bits(xdv[r * ks + c - voff]);
                    else touched += x != 0xFFFF;
                }
            const int sv = !memcmp(out3, out, nq * 4) && !memcmp(lse3, lse, nr * 4) && !memcmp(xdq3, xdq, nq * 4) && !memcmp(xdk3, xdk, nk * 4) &&
                           vdiff == 0;
            check(sv, "    strided v (ldv %d): out lse dq dk dv bitwise the contiguous run's: %s (%zu dv elements differ)", ldv, sv ? "yes" : "NO",
                  vdiff);
            w3.overrun = guard_overrun(gdv3, nv);
            check(touched == 0 && w3.overrun == 0, "    strided dv: the other columns of the fused buffer untouched: %zu written, %zu guard elements",
                  touched, w3.overrun);
            FREE_ALL(vs, out3, lse3, xdq3, xdk3, dv3);
        }

        /* against the materialised path on the same inputs (its backward from its own bf16 probs) */
        bf16 *mgo = d_bf16_poison(nq), *mgl = d_bf16_poison(na), *mgp = d_bf16_poison(na);
        bf16 *mgdq = d_bf16_poison(nq), *mgdk = d_bf16_poison(nk), *mgdv = d_bf16_poison(nk);
        attention_forward(mgo, mgl, mgp, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s);
        attention_backward(mgdq, mgdk, mgdv, dgo, mgp, dq_in, dk_in, dv_in, B, T, H, KV, hd, KV * hd, g_s);
        float* mo_ = dl_bf16(mgo, nq, NULL);
        float* mdq_ = dl_bf16(mgdq, nq, NULL);
        float* mdk_ = dl_bf16(mgdk, nk, NULL);
        float* mdv_ = dl_bf16(mgdv, nk, NULL);
        Tol to = tol_bf16_mag(mout, 1.0);
        to.ulps = 2; to.round_ref = 0; to.atol = ldexp(1.0, -8) * max_abs_of(v, nk);
        compare("vs materialised: out", out, mo_, nq, to, NULL);
        Tol tq = tol_bf16_mag(mdq, 1.0);
        tq.ulps = 2; tq.round_ref = 0; tq.atol = ldexp(1.0, -6) * max_abs_of(rdq, nq);
        compare("vs materialised: dq", xdq, mdq_, nq, tq, NULL);
        Tol tk = tol_bf16_mag(mdk, 1.0);
        tk.ulps = 2; tk.round_ref = 0; tk.atol = ldexp(1.0, -6) * max_abs_of(rdk, nk);
        compare("vs materialised: dk", xdk, mdk_, nk, tk, NULL);
        for (size_t i = 0; i < nk; i++) mdv[i] += (float)(ldexp(1.0, -8) * spdo[i]);
        Tol tv = tol_bf16_mag(mdv, 1.0);
        tv.ulps = 2; tv.round_ref = 0;
        compare("vs materialised: dv", xdv, mdv_, nk, tv, NULL);

        FREE_ALL(q, k, v, go, out, lse, rout, rlg, rpr, rlse, mlse, mout, eP, Dx, dD, dP, adP, xdq, xdk, xdv, rdq, rdk, rdv, rdatt, mdq,
                 mdk, mdv, spdo, out2, lse2, xdq2, xdk2, xdv2, mo_, mdq_, mdk_, mdv_);
        dfree_all();
    }
}
/* ------------------------------------------------------------- attention in chunks (attention.cuh) */
/* B*H*T^2 > ATTN_CHUNK_FLOATS (2^26): attention_forward / attention_backward process the batch in chunks of
 * nb sequences (here B 3, H 2, T 4096: nb 2, chunks of 2 and 1). Each sequence is independent, so the
 * chunked run must give what one unchunked run per sequence (B 1: H*T^2 = 2^25, one chunk) gives: logits,
 * probs, out, dq, dk, dv within 1 bf16 ulp (bitwise on the emulator; a GPU may pick another GEMM algorithm
 * for another batch count), every element written. The per-sequence runs are checked against the CPU by
 * test_attention's shapes; this checks the chunk bookkeeping (offsets, scratch reuse, the last partial chunk). */
static size_t bf16_ulp_diff(const uint16_t* a, const uint16_t* b, size_t n, size_t* differ) {
    size_t bad = 0;
    *differ = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == b[i]) continue;
        (*differ)++;
        const float x = bf16_bits_to_f32(a[i]), y = bf16_bits_to_f32(b[i]);
        if (!(fabs((double)x - y) <= ulp_bf16(fmax(fabs((double)x), fabs((double)y))))) bad++;
    }
    return bad;
}
static uint16_t* dl_bits(const bf16* d, size_t n) {
    uint16_t* h = (uint16_t*)mallocCheck(n * 2);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
    return h;
}
/* Catches: a chunked attention (B*H*T^2 above the buffer) that mixes sequences across chunk boundaries or skips a
 * chunk. */
static void test_attention_chunked(void) {
    const int B = 3, T = 4096, H = 2, KV = 1, hd = 8;
    const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T;
    const size_t sq = nq / B, sk = nk / B, sa = na / B;
    printf("attention in chunks (llmc/cuda/attention.cuh): B %d T %d H %d KV %d hd %d, B*H*T^2 = %zu > %zu: %d sequences a chunk, "
           "vs one run per sequence\n", B, T, H, KV, hd, na, (size_t)ATTN_CHUNK_FLOATS, attention_chunk(B, H, T));
    float* q = h_normal(nq, 1.5, 0.0, 1);
    float* k = h_normal(nk, 1.0, 0.0, 1);
    float* v = h_normal(nk, 1.0, 0.0, 1);
    float* dout = h_normal(nq, 1.0, 0.0, 1);
    bf16 *dq_ = d_bf16(q, nq), *dk_ = d_bf16(k, nk), *dv_ = d_bf16(v, nk), *ddo = d_bf16(dout, nq);
    FREE_ALL(q, k, v, dout);
    bf16 *out = d_bf16_poison(nq), *lg = d_bf16_poison(na), *pr = d_bf16_poison(na);
    bf16 *gq = d_bf16_poison(nq), *gk = d_bf16_poison(nk), *gv = d_bf16_poison(nk);
    attention_forward(out, lg, pr, dq_, dk_, dv_, B, T, H, KV, hd, KV * hd, g_s);
    attention_backward(gq, gk, gv, ddo, pr, dq_, dk_, dv_, B, T, H, KV, hd, KV * hd, g_s);
    bf16 *out1 = d_bf16_poison(sq), *lg1 = d_bf16_poison(sa), *pr1 = d_bf16_poison(sa);
    bf16 *gq1 = d_bf16_poison(sq), *gk1 = d_bf16_poison(sk), *gv1 = d_bf16_poison(sk);
    size_t bad[6] = {0}, differ[6] = {0}, unwritten = 0;
    for (int b = 0; b < B; b++) {
        attention_forward(out1, lg1, pr1, dq_ + b * sq, dk_ + b * sk, dv_ + b * sk, 1, T, H, KV, hd, KV * hd, g_s);
        attention_backward(gq1, gk1, gv1, ddo + b * sq, pr1, dq_ + b * sq, dk_ + b * sk, dv_ + b * sk, 1, T, H, KV, hd, KV * hd, g_s);
        const bf16* whole[6] = {lg + b * sa, pr + b * sa, out + b * sq, gq + b * sq, gk + b * sk, gv + b * sk};
        const bf16* one[6] = {lg1, pr1, out1, gq1, gk1, gv1};
        const size_t len[6] = {sa, sa, sq, sq, sk, sk};
        for (int t = 0; t < 6; t++) {
            uint16_t *x = dl_bits(whole[t], len[t]), *y = dl_bits(one[t], len[t]);
            size_t d;
            bad[t] += bf16_ulp_diff(x, y, len[t], &d);
            differ[t] += d;
            for (size_t i = 0; i < len[t]; i++) unwritten += x[i] == 0xFFFF;
            free(x); free(y);
        }
    }
    const char* names[6] = {"logits", "probs", "out", "dq", "dk", "dv"};
    for (int t = 0; t < 6; t++)
        check(bad[t] == 0 && (t || unwritten == 0), "    %-6s chunked vs per sequence: %zu elements differ, %zu by more than 1 bf16 ulp%s", names[t],
              differ[t], bad[t], t ? "" : (unwritten ? "; some elements unwritten (NaN poison)" : "; every element of the six written"));
    dfree_all();
    cuda_workspace_free_all();   /* 1 GiB of scratch: give it back */
}

/* ------------------------------------------------------------- attention checks (attcheck.cuh) */
/* the four GPU checks (abft / att as the trainer's flags) on device tensors: failed heads per check */
static void gpu_attcheck(int cnt[ATTC_NCHECK], int* dbuf, double* scratch, const bf16* lg, const bf16* pr, const bf16* out,
                         const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV, int hd, int abft, int att) {
    cudaCheck(cudaMemset(dbuf, 0, sizeof(int) * ATTC_NCHECK * (1 + (size_t)B * H)));
    attcheck_forward(dbuf, dbuf + ATTC_NCHECK, scratch, lg, pr, out, q, k, v, B, T, H, KV, hd, KV * hd, abft, att, g_s);
    cudaCheck(cudaStreamSynchronize(g_s));
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(cnt, dbuf, sizeof(int) * ATTC_NCHECK, cudaMemcpyDeviceToHost));
}
/* the CPU's (llmc/sdc/attcheck.h, bf16 tolerances), in the counters' order */
static void cpu_attcheck(int cnt[ATTC_NCHECK], const float* lg, const float* pr, const float* out, const float* q, const float* k,
                         const float* v, int B, int T, int H, int KV, int hd) {
    cnt[ATTC_ABFT_LOGITS] = abft_logits_check(lg, q, k, B, T, H, KV, hd, 16);
    cnt[ATTC_ATT_LOGITS] = att_logits_rowcheck(lg, q, k, B, T, H, KV, hd, 16);
    cnt[ATTC_ATT_PROBS] = att_probs_rowcheck(pr, B, H, T, 16);
    cnt[ATTC_ABFT_AV] = abft_av_check(out, pr, v, B, T, H, KV, hd, 16);
}
/* one line: GPU counts == CPU counts == want (want[c] < 0: any value, as long as GPU == CPU) */
static void attcheck_line(const char* what, const int* gc, const int* cc, const int* want) {
    int ok = 1;
    for (int c = 0; c < ATTC_NCHECK; c++) ok &= gc[c] == cc[c] && (want[c] < 0 || gc[c] == want[c]);
    char w[64];
    int o = 0;
    for (int c = 0; c < ATTC_NCHECK; c++) o += snprintf(w + o, sizeof(w) - o, want[c] < 0 ? "=cpu " : "%d ", want[c]);
    check(ok, "    %-44s failed heads abft_logits/att_logits/att_probs/abft_av: gpu %d %d %d %d, cpu %d %d %d %d (want %s)", what,
          gc[0], gc[1], gc[2], gc[3], cc[0], cc[1], cc[2], cc[3], w);
}
/* the top exponent bit of a bf16 value (bit 14; bit 30 of the fp32 that holds it) flipped */
static float flip_top_exponent(float x) { return bits_f32(f32_bits(x) ^ 0x40000000u); }
/* a random element of the live triangle (s <= t) of [B,H,T,T] in head bh (-1: any) with 2^-20 <= |x| < 1,
 * so that the flip makes it >= 2^108 (never a value within any tolerance); (size_t)-1 if none found */
static size_t pick_live(const float* x, int B, int H, int T, int bh) {
    for (int tries = 0; tries < 1000000; tries++) {
        size_t hh = bh >= 0 ? (size_t)bh : (size_t)rng_below(&g_rng, (uint64_t)B * H);
        int t = (int)rng_below(&g_rng, T), s = (int)rng_below(&g_rng, t + 1);
        size_t i = (hh * T + t) * T + s;
        if (fabsf(x[i]) >= ldexpf(1.0f, -20) && fabsf(x[i]) < 1.0f) return i;
    }
    return (size_t)-1;
}
/* any element of a flat tensor with 2^-20 <= |x| < 1 */
static size_t pick_any(const float* x, size_t n) {
    for (int tries = 0; tries < 1000000; tries++) {
        size_t i = (size_t)rng_below(&g_rng, n);
        if (fabsf(x[i]) >= ldexpf(1.0f, -20) && fabsf(x[i]) < 1.0f) return i;
    }
    return (size_t)-1;
}

/* Catches: an attention check (ABFT on the logits and AV, row checks of logits and probabilities) whose GPU sums
 * or tolerances differ from the CPU's, alarms on clean attention. */
static void test_attcheck(void) {
    printf("attention checks (llmc/sdc/attcheck.cuh) vs abft_logits_check / att_logits_rowcheck / att_probs_rowcheck /\n"
           "  abft_av_check (llmc/sdc/attcheck.h, width 16), on attention_forward's bf16 logits, probs and out (hd 48: the CPU's\n"
           "  attention_forward rounded to bf16, as the CPU's -precision bf16)\n");
    struct { int B, T, H, KV, hd; } cases[] = {
        {2, 37, 4, 2, 32}, {2, 130, 4, 2, 64}, {1, 64, 4, 1, 48}, {2, 50, 2, 2, 128}, {3, 200, 6, 3, 64}, {1, 9, 2, 1, 32}, {1, 3, 2, 2, 32}};
    const int none[ATTC_NCHECK] = {0, 0, 0, 0};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int B = cases[ci].B, T = cases[ci].T, H = cases[ci].H, KV = cases[ci].KV, hd = cases[ci].hd, nbh = B * H;
        size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, na = (size_t)B * H * T * T;
        printf("  B %d T %d H %d KV %d hd %d\n", B, T, H, KV, hd);
        float* q = h_normal(nq, 1.5, 0.0, 1);
        float* k = h_normal(nk, 1.0, 0.0, 1);
        float* v = h_normal(nk, 1.0, 0.0, 1);
        bf16 *dq = d_bf16(q, nq), *dk = d_bf16(k, nk), *dv = d_bf16(v, nk);
        float *out, *lg, *pr;
        bf16 *dout, *dlg, *dpr;
        if (hd % 32 == 0) {
            dout = d_bf16_poison(nq); dlg = d_bf16_poison(na); dpr = d_bf16_poison(na);
            attention_forward(dout, dlg, dpr, dq, dk, dv, B, T, H, KV, hd, KV * hd, g_s);
            out = dl_bf16(dout, nq, NULL);
            lg = dl_bf16(dlg, na, NULL);
            pr = dl_bf16(dpr, na, NULL);
        } else {
            out = h_alloc(nq); lg = h_alloc(na); pr = h_alloc(na);
            attention_forward(out, lg, pr, q, k, v, B, T, H, KV, hd);
            for (size_t i = 0; i < nq; i++) out[i] = bf16_round(out[i]);
            for (size_t i = 0; i < na; i++) { lg[i] = bf16_round(lg[i]); pr[i] = bf16_round(pr[i]); }
            dout = d_bf16(out, nq); dlg = d_bf16(lg, na); dpr = d_bf16(pr, na);
        }
        int* dbuf = (int*)dalloc_raw(ATTC_NCHECK * (1 + (size_t)nbh), 4);
        double* scr = (double*)dalloc_raw(attcheck_scratch_doubles(B, H, T), 8);
        int gc[ATTC_NCHECK], cc[ATTC_NCHECK];
        /* (a) clean */
        gpu_attcheck(gc, dbuf, scr, dlg, dpr, dout, dq, dk, dv, B, T, H, KV, hd, 1, 1);
        cpu_attcheck(cc, lg, pr, out, q, k, v, B, T, H, KV, hd);
        attcheck_line("clean", gc, cc, none);
        /* the masked triangle is never read: NaN in the logits, 2^100 in the probs there */
        float *lgm = h_copy(lg, na), *prm = h_copy(pr, na);
        for (size_t r = 0; r < (size_t)nbh * T; r++)
            for (int s = (int)(r % T) + 1; s < T; s++) { lgm[r * T + s] = NAN; prm[r * T + s] = ldexpf(1.0f, 100); }
        bf16 *dlgm = d_bf16(lgm, na), *dprm = d_bf16(prm, na);
        gpu_attcheck(gc, dbuf, scr, dlgm, dprm, dout, dq, dk, dv, B, T, H, KV, hd, 1, 1);
        cpu_attcheck(cc, lgm, prm, out, q, k, v, B, T, H, KV, hd);
        attcheck_line("clean, garbage in the masked triangle", gc, cc, none);
        if (T < 8) { FREE_ALL(q, k, v, out, lg, pr, lgm, prm); dfree_all(); continue; }   /* too few live elements to pick from */
        /* (b) logits: the top exponent bit of one live element in each of (up to) two heads */
        int nh = nbh > 1 ? 2 : 1, bh1 = (int)rng_below(&g_rng, nbh), bh2 = nbh > 1 ? (bh1 + 1 + (int)rng_below(&g_rng, nbh - 1)) % nbh : bh1;
        size_t i1 = pick_live(lg, B, H, T, bh1), i2 = nh > 1 ? pick_live(lg, B, H, T, bh2) : i1;
        if (i1 == (size_t)-1 || i2 == (size_t)-1) { check(0, "    no live logit with 2^-20 <= |x| < 1 to flip"); }
        else {
            float* lgc = h_copy(lg, na);
            lgc[i1] = flip_top_exponent(lgc[i1]);
            if (nh > 1) lgc[i2] = flip_top_exponent(lgc[i2]);
            bf16* dlgc = d_bf16(lgc, na);
            char what[96];
            snprintf(what, sizeof(what), "logits: exponent flip in %d head%s", nh, nh > 1 ? "s" : "");
            int want[ATTC_NCHECK] = {nh, nh, 0, 0};
            gpu_attcheck(gc, dbuf, scr, dlgc, dpr, dout, dq, dk, dv, B, T, H, KV, hd, 1, 1);
            cpu_attcheck(cc, lgc, pr, out, q, k, v, B, T, H, KV, hd);
            attcheck_line(what, gc, cc, want);
            /* the trainer's two flags one at a time (the scan runs one direction only) */
            int wa[ATTC_NCHECK] = {nh, 0, 0, 0}, wb[ATTC_NCHECK] = {0, nh, 0, 0}, ca[ATTC_NCHECK] = {cc[0], 0, 0, 0},
                cb[ATTC_NCHECK] = {0, cc[1], 0, 0};
            gpu_attcheck(gc, dbuf, scr, dlgc, dpr, dout, dq, dk, dv, B, T, H, KV, hd, 1, 0);
            attcheck_line("  the same, ABFT alone", gc, ca, wa);
            gpu_attcheck(gc, dbuf, scr, dlgc, dpr, dout, dq, dk, dv, B, T, H, KV, hd, 0, 1);
            attcheck_line("  the same, att alone", gc, cb, wb);
            /* a NaN logit (non-finite sums fail) */
            float* lgn = h_copy(lg, na);
            lgn[i1] = NAN;
            bf16* dlgn = d_bf16(lgn, na);
            int wn[ATTC_NCHECK] = {1, 1, 0, 0};
            gpu_attcheck(gc, dbuf, scr, dlgn, dpr, dout, dq, dk, dv, B, T, H, KV, hd, 1, 1);
            cpu_attcheck(cc, lgn, pr, out, q, k, v, B, T, H, KV, hd);
            attcheck_line("logits: one NaN", gc, cc, wn);
            FREE_ALL(lgc, lgn);
        }
        /* probs: one live element; out was computed from the clean probs, so ABFT's P V check sees the
         * inconsistency too (in the model out is recomputed from the faulty probs, and it passes) */
        size_t ip = pick_live(pr, B, H, T, -1);
        if (ip == (size_t)-1) { check(0, "    no live probability with 2^-20 <= p < 1 to flip"); }
        else {
            float* prc = h_copy(pr, na);
            prc[ip] = flip_top_exponent(prc[ip]);
            bf16* dprc = d_bf16(prc, na);
            int want[ATTC_NCHECK] = {0, 0, 1, 1};
            gpu_attcheck(gc, dbuf, scr, dlg, dprc, dout, dq, dk, dv, B, T, H, KV, hd, 1, 1);
            cpu_attcheck(cc, lg, prc, out, q, k, v, B, T, H, KV, hd);
            attcheck_line("probs: exponent flip in one element", gc, cc, want);
            free(prc);
        }
        /* att_out: one element */
        size_t io = pick_any(out, nq);
        if (io == (size_t)-1) { check(0, "    no att_out element with 2^-20 <= |x| < 1 to flip"); }
        else {
            float* oc = h_copy(out, nq);
            oc[io] = flip_top_exponent(oc[io]);
            bf16* doc = d_bf16(oc, nq);
            int want[ATTC_NCHECK] = {0, 0, 0, 1};
            gpu_attcheck(gc, dbuf, scr, dlg, dpr, doc, dq, dk, dv, B, T, H, KV, hd, 1, 1);
            cpu_attcheck(cc, lg, pr, oc, q, k, v, B, T, H, KV, hd);
            attcheck_line("att_out: exponent flip in one element", gc, cc, want);
            free(oc);
        }
        FREE_ALL(q, k, v, out, lg, pr, lgm, prm);
        dfree_all();
    }
}

/* ------------------------------------------------------- backward attention checks (attcheck.cuh, att_bwd) */
static int g_attbwd_chunked = 0;   /* calls of gpu_attbwd whose chunked dV check had more than one chunk */
/* the three GPU checks on device tensors, in the ATTB_* order: failed heads (dV: failed (b, kv head)) per check.
 * ld_o, ld_v: the row strides of dout and v/dv (the contiguous widths, or wider: views of a padded buffer) */
static void gpu_attbwd(int cnt[ATTB_NCHECK], int* dbuf, double* scratch, const bf16* dp, const bf16* dl, const bf16* dv, const bf16* dout,
                       int ld_o, const bf16* v, int ld_v, int B, int T, int H, int KV, int hd) {
    cudaCheck(cudaMemset(dbuf, 0, sizeof(int) * ATTB_NCHECK * (1 + (size_t)B * H)));
    attcheck_backward_dprobs(dbuf, dbuf + ATTB_NCHECK, scratch, dp, dout, ld_o, v, ld_v, B, T, H, KV, hd, g_s);
    attcheck_backward_dlogits(dbuf, dbuf + ATTB_NCHECK, scratch, dl, B, T, H, g_s);
    attcheck_backward_dv(dbuf, dbuf + ATTB_NCHECK, NULL, dv, ld_v, dout, ld_o, B, T, H, KV, hd, g_s);
    cudaCheck(cudaStreamSynchronize(g_s));
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(cnt, dbuf, sizeof(int) * ATTB_NCHECK, cudaMemcpyDeviceToHost));
    /* the dV check again with its positions cut into chunks (the trainer's grid at B 1: the last block to finish adds
     * the chunks' partials): the same failed heads, else the count reads -1 (want is never -1) */
    const size_t nwork = (size_t)B * KV * CEIL_DIV(hd, 32) * 16 * 96, ndone = (size_t)B * KV * CEIL_DIV(hd, 32);
    double* work = (double*)d_f32_poison(2 * nwork);
    unsigned* done = (unsigned*)d_f32_poison(ndone);
    cudaCheck(cudaMemset(done, 0, sizeof(unsigned) * ndone));
    cudaCheck(cudaMemset(dbuf, 0, sizeof(int) * ATTB_NCHECK * (1 + (size_t)B * H)));
    attcheck_backward_dv(dbuf, dbuf + ATTB_NCHECK, NULL, dv, ld_v, dout, ld_o, B, T, H, KV, hd, g_s, work, nwork, done);
    int c2[ATTB_NCHECK];
    cudaCheck(cudaMemcpy(c2, dbuf, sizeof(int) * ATTB_NCHECK, cudaMemcpyDeviceToHost));
    if (c2[ATTB_DV] != cnt[ATTB_DV]) cnt[ATTB_DV] = -1;
    g_attbwd_chunked += attbwd_dv_chunks(B, KV, hd, T, nwork) > 1;
}
static void cpu_attbwd(int cnt[ATTB_NCHECK], const float* dp, const float* dl, const float* dv, const float* dout, const float* v, int B,
                       int T, int H, int KV, int hd) {
    cnt[ATTB_DPROBS] = att_dprobs_rowcheck(dp, dout, v, B, T, H, KV, hd, 16);
    cnt[ATTB_DLOGITS] = att_dlogits_rowcheck(dl, dout, v, B, T, H, KV, hd, 16);
    cnt[ATTB_DV] = att_dv_colcheck(dv, dout, B, T, H, KV, hd, 16);
}
static void attbwd_line(const char* what, const int* gc, const int* cc, const int* want) {
    int ok = 1;
    for (int c = 0; c < ATTB_NCHECK; c++) ok &= gc[c] == cc[c] && gc[c] == want[c];
    check(ok, "    %-46s failed dprobs/dlogits/dv: gpu %d %d %d, cpu %d %d %d (want %d %d %d)", what, gc[0], gc[1], gc[2], cc[0], cc[1], cc[2],
          want[0], want[1], want[2]);
}
/* a [rows, w] host tensor as bf16 rows of stride ld >= w on the device (the padding holds 2^100: never read) */
static bf16* d_bf16_strided(const float* h, size_t rows, int w, int ld) {
    float* p = h_alloc(rows * (size_t)ld);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < ld; c++) p[r * ld + c] = c < w ? h[r * w + c] : ldexpf(1.0f, 100);
    bf16* d = d_bf16(p, rows * (size_t)ld);
    free(p);
    return d;
}
/* a fault no bound absorbs: the top exponent bit of a value in [2^-20, 1) (pick_live / pick_any), else + 4096 */
static float attbwd_fault(float x) {
    return fabsf(x) >= ldexpf(1.0f, -20) && fabsf(x) < 1.0f ? flip_top_exponent(x) : bf16_round(x + 4096.0f);
}

/* Catches: a backward attention check whose GPU sums or bounds differ from the CPU's (att_dprobs_rowcheck,
 * att_dlogits_rowcheck, att_dv_colcheck), one that skips the last row, the diagonal entry or the last token, a
 * wrong row stride, alarms on clean tensors or on garbage in the masked triangle. */
static void test_attcheck_bwd(void) {
    printf("backward attention checks (attcheck.cuh: dprobs rows, dlogits rows, dV columns) vs att_dprobs_rowcheck /\n"
           "  att_dlogits_rowcheck / att_dv_colcheck (attcheck.h, width 16) on the CPU's attention backward rounded to bf16\n");
    struct { int B, T, H, KV, hd, pad; } cases[] = {
        {2, 37, 4, 2, 32, 0}, {2, 130, 4, 2, 64, 8}, {1, 64, 4, 1, 48, 0}, {2, 50, 2, 2, 128, 0}, {3, 200, 6, 3, 64, 16}, {1, 9, 2, 1, 32, 0}};
    const int none[ATTB_NCHECK] = {0, 0, 0};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int B = cases[ci].B, T = cases[ci].T, H = cases[ci].H, KV = cases[ci].KV, hd = cases[ci].hd, nbh = B * H;
        int qd = H * hd, kd = KV * hd, ldo = qd + cases[ci].pad, ldv = kd + cases[ci].pad;
        size_t nq = (size_t)B * T * qd, nk = (size_t)B * T * kd, na = (size_t)B * H * T * T;
        printf("  B %d T %d H %d KV %d hd %d, row strides %d %d\n", B, T, H, KV, hd, ldo, ldv);
        float* q = h_normal(nq, 1.5, 0.0, 1);
        float* k = h_normal(nk, 1.0, 0.0, 1);
        float* v = h_normal(nk, 1.0, 0.0, 1);
        float* go = h_normal(nq, 0.1, 0.0, 1);   /* dout */
        float *out = h_alloc(nq), *lg = h_alloc(na), *pr = h_alloc(na), *dp = h_alloc(na), *dl = h_alloc(na), *dv = h_alloc(nk);
        attention_forward(out, lg, pr, q, k, v, B, T, H, KV, hd);
        for (size_t i = 0; i < na; i++) pr[i] = bf16_round(pr[i]);
        attention_av_backward(dp, dv, go, pr, v, B, T, H, KV, hd, 0);
        for (size_t i = 0; i < na; i++) dp[i] = bf16_round(dp[i]);
        for (size_t i = 0; i < nk; i++) dv[i] = bf16_round(dv[i]);
        attention_softmax_backward(dl, dp, pr, B, H, T, 0);
        for (size_t i = 0; i < na; i++) dl[i] = bf16_round(dl[i]);
        bf16 *gdp = d_bf16(dp, na), *gdl = d_bf16(dl, na), *gdv = d_bf16_strided(dv, (size_t)B * T, kd, ldv);
        bf16 *gv = d_bf16_strided(v, (size_t)B * T, kd, ldv), *ggo = d_bf16_strided(go, (size_t)B * T, qd, ldo);
        int* dbuf = (int*)dalloc_raw(ATTB_NCHECK * (1 + (size_t)nbh), 4);
        double* scr = (double*)dalloc_raw(attbwd_scratch_doubles(B, H, T), 8);
        int gc[ATTB_NCHECK], cc[ATTB_NCHECK];
        gpu_attbwd(gc, dbuf, scr, gdp, gdl, gdv, ggo, ldo, gv, ldv, B, T, H, KV, hd);
        cpu_attbwd(cc, dp, dl, dv, go, v, B, T, H, KV, hd);
        attbwd_line("clean", gc, cc, none);
        /* the masked triangle is never read */
        float *dpm = h_copy(dp, na), *dlm = h_copy(dl, na);
        for (size_t r = 0; r < (size_t)nbh * T; r++)
            for (int s = (int)(r % T) + 1; s < T; s++) { dpm[r * T + s] = NAN; dlm[r * T + s] = ldexpf(1.0f, 100); }
        bf16 *gdpm = d_bf16(dpm, na), *gdlm = d_bf16(dlm, na);
        gpu_attbwd(gc, dbuf, scr, gdpm, gdlm, gdv, ggo, ldo, gv, ldv, B, T, H, KV, hd);
        cpu_attbwd(cc, dpm, dlm, dv, go, v, B, T, H, KV, hd);
        attbwd_line("clean, garbage in the masked triangle", gc, cc, none);
        /* one live element of dprobs / dlogits: a random one, the last head's last row at its diagonal (t = s = T-1),
         * that row's first entry */
        for (int which = 0; which < 2; which++) {
            const float* src = which ? dl : dp;
            const size_t last = (size_t)(nbh - 1) * T + (T - 1);
            size_t picks[3] = {pick_live(src, B, H, T, -1), last * T + (T - 1), last * T};
            const char* where[3] = {"random live element", "last row, diagonal", "last row, s = 0"};
            for (int pi = 0; pi < 3; pi++) {
                size_t i = picks[pi];
                if (i == (size_t)-1) { check(0, "    no live element with 2^-20 <= |x| < 1 to flip"); continue; }
                float* x = h_copy(src, na);
                x[i] = attbwd_fault(x[i]);
                bf16* gx = d_bf16(x, na);
                int want[ATTB_NCHECK] = {which ? 0 : 1, which ? 1 : 0, 0};
                gpu_attbwd(gc, dbuf, scr, which ? gdp : gx, which ? gx : gdl, gdv, ggo, ldo, gv, ldv, B, T, H, KV, hd);
                cpu_attbwd(cc, which ? dp : x, which ? x : dl, dv, go, v, B, T, H, KV, hd);
                char what[96];
                snprintf(what, sizeof(what), "%s: %s", which ? "dlogits" : "dprobs", where[pi]);
                attbwd_line(what, gc, cc, want);
                free(x);
            }
        }
        /* dV: a random element, the last token's last dim of the last kv head */
        size_t vpicks[2] = {pick_any(dv, nk), nk - 1};
        for (int pi = 0; pi < 2; pi++) {
            size_t i = vpicks[pi];
            if (i == (size_t)-1) { check(0, "    no dv element with 2^-20 <= |x| < 1 to flip"); continue; }
            float* x = h_copy(dv, nk);
            x[i] = attbwd_fault(x[i]);
            bf16* gx = d_bf16_strided(x, (size_t)B * T, kd, ldv);
            int want[ATTB_NCHECK] = {0, 0, 1};
            gpu_attbwd(gc, dbuf, scr, gdp, gdl, gx, ggo, ldo, gv, ldv, B, T, H, KV, hd);
            cpu_attbwd(cc, dp, dl, x, go, v, B, T, H, KV, hd);
            attbwd_line(pi ? "dv: last token, last dim" : "dv: random element", gc, cc, want);
            free(x);
        }
        /* a NaN in v at the last token of the last kv head: the bounds of the rows that read it are NaN, so the last
         * row of each of that kv head's query heads fails both row checks */
        {
            float* x = h_copy(v, nk);
            x[nk - 1] = NAN;
            bf16* gx = d_bf16_strided(x, (size_t)B * T, kd, ldv);
            gpu_attbwd(gc, dbuf, scr, gdp, gdl, gdv, ggo, ldo, gx, ldv, B, T, H, KV, hd);
            cpu_attbwd(cc, dp, dl, dv, go, x, B, T, H, KV, hd);
            int want[ATTB_NCHECK] = {H / KV, H / KV, 0};
            attbwd_line("v: one NaN (last token, last kv head)", gc, cc, want);
            free(x);
        }
        FREE_ALL(q, k, v, go, out, lg, pr, dp, dl, dv, dpm, dlm);
        dfree_all();
    }
    check(g_attbwd_chunked > 0, "  the chunked dV check ran with more than one chunk in %d of the calls above", g_attbwd_chunked);
}

/* ------------------------------------------- the fused path's attention checks (flash kernels + attcheck.cuh) */
typedef struct {
    int B, T, H, KV, hd;
    const bf16 *q, *k, *v, *go, *out;
    const float* lse;
    bf16 *gout, *gdq, *gdk, *gdv;
    float* glse;
    int* dbuf;
    double* scr;
} FusedChk;
static int g_ride_norm_diff = 0, g_ride_norm_runs = 0;   /* the forward scan riding on the residual norm: calls that differed, of all */
/* the fused forward with its row sums and plant pl, then attcheck_fused_forward: failed heads per ATTC check */
static void fused_fwd_checks(FusedChk* f, FlashPlant pl, int cnt[ATTC_NCHECK]) {
    const int nbh = f->B * f->H;
    const size_t n = (size_t)nbh * f->T;
    float* rows = attcheck_fused_rows(f->scr, f->B, f->H, f->T);
    const FlashCheck fc = {rows, rows + n, pl};
    cudaCheck(cudaMemset(f->dbuf, 0, sizeof(int) * ATTC_NCHECK * (1 + (size_t)nbh)));
    flash_attention_forward(f->gout, f->glse, f->q, f->k, f->v, f->B, f->T, f->H, f->KV, f->hd, f->KV * f->hd, g_s, &fc);
    attcheck_fused_forward(f->dbuf, f->dbuf + ATTC_NCHECK, f->scr, f->q, f->k, f->B, f->T, f->H, f->KV, f->hd, g_s);
    cudaCheck(cudaStreamSynchronize(g_s));
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(cnt, f->dbuf, sizeof(int) * ATTC_NCHECK, cudaMemcpyDeviceToHost));
    /* again riding on the residual add + norm that follows (the trainer's: attcheck_fused_forward_ride on
     * residual_rmsnorm_forward): the same counts, its bounds (ref, tol) bitwise the launch's, and the add's and the norm's
     * outputs bitwise those of the launch without the ride, once with the rows' grid capped so that its warps stride
     * (else g_ride_norm_diff) */
    const size_t nr = (size_t)f->B * f->T, n2 = 4 * n;
    const int C = 96;
    double *hs1 = (double*)mallocCheck(sizeof(double) * n2), *hs2 = (double*)mallocCheck(sizeof(double) * n2);
    cudaCheck(cudaMemcpy(hs1, f->scr, sizeof(double) * n2, cudaMemcpyDeviceToHost));   /* ref, tol of the separate launch (and the rows) */
    float *ha = h_normal(nr * C, 1.0, 0.0, 1), *hb = h_normal(nr * C, 1.0, 0.0, 1), *hw = h_normal(C, 0.3, 1.0, 1);
    bf16 *ra = d_bf16(ha, nr * C), *rb = d_bf16(hb, nr * C), *rw = d_bf16(hw, C);
    bf16 *o1 = d_bf16_poison(nr * C), *o2 = d_bf16_poison(nr * C), *s1 = d_bf16_poison(nr * C), *s2 = d_bf16_poison(nr * C);
    float *m1 = d_f32_poison(nr), *m2 = d_f32_poison(nr);
    for (int cap = 0; cap <= 1; cap++) {
        g_rmsnorm_grid_cap = cap ? 1 : 0;
        residual_rmsnorm_forward(s1, o1, m1, ra, rb, rw, (int)nr, C, 1e-5f, g_s);
        cudaCheck(cudaMemset(f->dbuf, 0, sizeof(int) * ATTC_NCHECK * (1 + (size_t)nbh)));
        cudaCheck(cudaMemset(f->scr, 0xff, sizeof(double) * 4 * n));   /* ref, tol (the rows after them stay) */
        cudaCheck(cudaMemset(o2, 0xff, nr * C * 2)); cudaCheck(cudaMemset(s2, 0xff, nr * C * 2)); cudaCheck(cudaMemset(m2, 0xff, nr * 4));
        const AttcScan as = attcheck_fused_forward_ride(f->dbuf, f->dbuf + ATTC_NCHECK, f->scr, f->q, f->k, f->B, f->T, f->H, f->KV, f->hd);
        residual_rmsnorm_forward(s2, o2, m2, ra, rb, rw, (int)nr, C, 1e-5f, g_s, ew_dup_none(), NULL, NULL, &as);
        cudaCheck(cudaStreamSynchronize(g_s));
        int c2[ATTC_NCHECK];
        cudaCheck(cudaMemcpy(c2, f->dbuf, sizeof(int) * ATTC_NCHECK, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(hs2, f->scr, sizeof(double) * n2, cudaMemcpyDeviceToHost));
        uint16_t *x1 = dl_bits(o1, nr * C), *x2 = dl_bits(o2, nr * C), *y1 = dl_bits(s1, nr * C), *y2 = dl_bits(s2, nr * C);
        float *z1 = dl_f32(m1, nr, NULL), *z2 = dl_f32(m2, nr, NULL);
        g_ride_norm_diff += memcmp(c2, cnt, sizeof(c2)) != 0 || memcmp(hs1, hs2, sizeof(double) * n2) != 0 || memcmp(x1, x2, nr * C * 2) != 0 ||
                            memcmp(y1, y2, nr * C * 2) != 0 || memcmp(z1, z2, nr * 4) != 0;
        g_ride_norm_runs++;
        FREE_ALL(x1, x2, y1, y2, z1, z2);
    }
    g_rmsnorm_grid_cap = 0;
    FREE_ALL(hs1, hs2, ha, hb, hw);
}
static int g_fused_chunked = 0;   /* calls of fused_bwd_checks whose dV check had more than one chunk */
static int g_ride_rope_diff = 0, g_ride_rope_runs = 0;   /* the riding checks' RoPE launches whose outputs differed, of all */
static int g_ride_qknr_diff = 0, g_ride_qknr_runs = 0;   /* ... riding on Qwen3's RoPE + QK-norm backward launch */
/* the fused backward (from the clean forward's out, lse) with plant pl, then the dq kernel's row checks and the dV
 * column check (one launch): failed heads per ATTB check */
static void fused_bwd_checks(FusedChk* f, FlashPlant pl, int cnt[ATTB_NCHECK]) {
    const int nbh = f->B * f->H, qd = f->H * f->hd, kd = f->KV * f->hd;
    const size_t n = (size_t)nbh * f->T;
    float* rows = attcheck_fused_rows(f->scr, f->B, f->H, f->T);
    const FlashCheck fc = {rows, rows + n, pl};
    cudaCheck(cudaMemset(f->dbuf, 0, sizeof(int) * ATTB_NCHECK * (1 + (size_t)nbh)));
    flash_attention_backward(f->gdq, f->gdk, f->gdv, f->go, f->out, f->lse, f->q, f->k, f->v, f->B, f->T, f->H, f->KV, f->hd, kd, g_s, &fc);
    attcheck_fused_backward(f->dbuf, f->dbuf + ATTB_NCHECK, f->scr, f->go, qd, f->v, kd, f->gdv, kd, f->B, f->T, f->H, f->KV, f->hd, g_s);
    cudaCheck(cudaStreamSynchronize(g_s));
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(cnt, f->dbuf, sizeof(int) * ATTB_NCHECK, cudaMemcpyDeviceToHost));
    /* again with the dV check's positions cut into chunks inside the one launch (the trainer's grid): the same counts,
     * else each differing count reads -1 (want is never -1) */
    const size_t nwork = (size_t)f->B * f->KV * CEIL_DIV(f->hd, 32) * 16 * 96, ndone = (size_t)f->B * f->KV * CEIL_DIV(f->hd, 32);
    double* work = (double*)d_f32_poison(2 * nwork);
    unsigned* done = (unsigned*)d_f32_poison(ndone);
    cudaCheck(cudaMemset(done, 0, sizeof(unsigned) * ndone));
    cudaCheck(cudaMemset(f->dbuf, 0, sizeof(int) * ATTB_NCHECK * (1 + (size_t)nbh)));
    const size_t nbd = (size_t)f->B * f->KV * f->hd;
    double *bnd1 = (double*)d_f32_poison(2 * nbd), *bnd2 = (double*)d_f32_poison(2 * nbd);
    attcheck_fused_backward(f->dbuf, f->dbuf + ATTB_NCHECK, f->scr, f->go, qd, f->v, kd, f->gdv, kd, f->B, f->T, f->H, f->KV, f->hd, g_s, bnd1,
                            work, nwork, done);
    int c2[ATTB_NCHECK];
    cudaCheck(cudaMemcpy(c2, f->dbuf, sizeof(int) * ATTB_NCHECK, cudaMemcpyDeviceToHost));
    for (int c = 0; c < ATTB_NCHECK; c++)
        if (c2[c] != cnt[c]) cnt[c] = -1;
    g_fused_chunked += attbwd_dv_chunks(f->B, f->KV, f->hd, f->T, nwork) > 1;
    /* and riding on the launch that rotates dq and dk back (the trainer's: attcheck_fused_backward_ride on rope_qk), with and
     * without that launch's fingerprints: the counts of the one launch with the same chunks, the scan's and the dV check's
     * bounds bitwise its (every block ran), and the rotated dq, dk and their fingerprints bitwise those of the launch without the ride,
     * once with the pairs' grid capped at 3 blocks so that their threads stride, and the riding launch with 32-bit and
     * with 64-bit indices (else g_ride_rope_diff) */
    const size_t nq = (size_t)f->B * f->T * qd, nk = (size_t)f->B * f->T * kd;
    const int half = f->hd / 2;
    float *cs = h_normal((size_t)f->T * half, 0.7, 0.0, 0), *sn = h_normal((size_t)f->T * half, 0.7, 0.0, 0);
    float *dcs = d_f32(cs, (size_t)f->T * half), *dsn = d_f32(sn, (size_t)f->T * half);
    bf16 *r1q = d_bf16_poison(nq), *r1k = d_bf16_poison(nk), *r2q = d_bf16_poison(nq), *r2k = d_bf16_poison(nk);
    unsigned long long* fa = (unsigned long long*)d_f32_poison(4 * FP_WORDS * 2);
    double* hs1 = (double*)mallocCheck(sizeof(double) * 3 * n);
    double* hs2 = (double*)mallocCheck(sizeof(double) * 3 * n);
    cudaCheck(cudaMemcpy(hs1, f->scr, sizeof(double) * 3 * n, cudaMemcpyDeviceToHost));   /* the one launch's ref, tol_dp, tol_dl */
    for (int it = 0; it < 4; it++) {   /* without and with fingerprints; the riding launch's indices 32-bit, then 64-bit */
        const int fp = it & 1, wide = it >> 1;
        g_rope_grid_cap = fp ? 0 : 3;   /* the pairs' threads striding over their own grid's, not the whole launch's */
        cudaCheck(cudaMemset(f->scr, 0xff, sizeof(double) * 3 * n));
        cudaCheck(cudaMemset(fa, 0, 4 * FP_WORDS * sizeof(unsigned long long)));
        unsigned long long *a1 = fp ? fa : NULL, *b1 = fp ? fa + FP_WORDS : NULL, *a2 = fp ? fa + 2 * FP_WORDS : NULL, *b2 = fp ? fa + 3 * FP_WORDS : NULL;
        rope_qk(r1q, r1k, f->gdq, f->gdk, qd, kd, dcs, dsn, f->B, f->T, f->H, f->KV, f->hd, ROPE_HF, true, a1, b1, g_s);
        cudaCheck(cudaMemset(f->dbuf, 0, sizeof(int) * ATTB_NCHECK * (1 + (size_t)nbh)));
        cudaCheck(cudaMemset(done, 0, sizeof(unsigned) * ndone));   /* the dV chunks' counters (the trainer zeroes them each backward) */
        const AttbFused ab = attcheck_fused_backward_ride(f->dbuf, f->dbuf + ATTB_NCHECK, f->scr, f->go, qd, f->v, kd, f->gdv, kd, f->B, f->T, f->H,
                                                          f->KV, f->hd, bnd2, work, nwork, done);
        cudaCheck(cudaMemset(r2q, 0xff, nq * 2)); cudaCheck(cudaMemset(r2k, 0xff, nk * 2));
        g_rope_index64 = wide;
        rope_qk(r2q, r2k, f->gdq, f->gdk, qd, kd, dcs, dsn, f->B, f->T, f->H, f->KV, f->hd, ROPE_HF, true, a2, b2, g_s, MMB_TAIL_NONE, NULL, &ab);
        g_rope_index64 = 0;
        cudaCheck(cudaStreamSynchronize(g_s));
        int c3[ATTB_NCHECK];
        cudaCheck(cudaMemcpy(c3, f->dbuf, sizeof(int) * ATTB_NCHECK, cudaMemcpyDeviceToHost));
        g_ride_rope_diff += memcmp(c3, c2, sizeof(c3)) != 0;   /* the one launch's counts with the same chunks */
        uint16_t *x1 = dl_bits(r1q, nq), *x2 = dl_bits(r2q, nq), *y1 = dl_bits(r1k, nk), *y2 = dl_bits(r2k, nk);
        unsigned long long h[4 * FP_WORDS];
        cudaCheck(cudaMemcpy(h, fa, sizeof(h), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(hs2, f->scr, sizeof(double) * 3 * n, cudaMemcpyDeviceToHost));
        double *hb1 = (double*)mallocCheck(sizeof(double) * nbd), *hb2 = (double*)mallocCheck(sizeof(double) * nbd);
        cudaCheck(cudaMemcpy(hb1, bnd1, sizeof(double) * nbd, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(hb2, bnd2, sizeof(double) * nbd, cudaMemcpyDeviceToHost));
        const int bdiff = memcmp(hb1, hb2, sizeof(double) * nbd) != 0;   /* every dV column's bound: every dV block ran */
        FREE_ALL(hb1, hb2);
        g_ride_rope_diff += memcmp(x1, x2, nq * 2) != 0 || memcmp(y1, y2, nk * 2) != 0 || memcmp(h, h + 2 * FP_WORDS, 2 * FP_WORDS * 8) != 0 ||
                            (fp && (h[0] | h[1]) == 0) || memcmp(hs1, hs2, sizeof(double) * 3 * n) != 0 || bdiff;
        g_ride_rope_runs++;
        FREE_ALL(x1, x2, y1, y2);
        if (!wide && qknorm_rope_ok(f->hd, qd + kd, f->q, f->q)) {
            /* and riding on Qwen3's one launch for RoPE's and the QK norm's backward (rope_qknorm_backward_qk, with its norms'
             * dw riding too; x, the weights and mean squares drawn here): the counts and bounds as above, its dx, dw and
             * fingerprints bitwise the launch's without the checks, the rows' grid capped at 2 blocks once */
            const size_t nx = (size_t)f->B * f->T * (qd + kd);
            float *hx = h_normal(nx, 1.0, 0.0, 1), *hw = h_normal(f->hd, 0.3, 1.0, 1), *hm = h_normal((size_t)f->B * f->T * (f->H + f->KV), 0.2, 1.0, 0);
            for (size_t i = 0; i < (size_t)f->B * f->T * (f->H + f->KV); i++) hm[i] = fabsf(hm[i]) + 0.1f;
            bf16 *X = d_bf16(hx, nx), *Wn = d_bf16(hw, f->hd);
            float* M = d_f32(hm, (size_t)f->B * f->T * (f->H + f->KV));
            const float *mq = M, *mk = M + (size_t)f->B * f->T * f->H;
            bf16 *dx1 = d_bf16_poison(nx), *dx2 = d_bf16_poison(nx);
            float *dw1 = d_f32_poison(2 * (size_t)f->hd), *dw2 = d_f32_poison(2 * (size_t)f->hd);
            cudaCheck(cudaMemset(fa, 0, 4 * FP_WORDS * sizeof(unsigned long long)));
            g_qknr_bwd_grid_cap = fp ? 0 : 2;
            rope_qknorm_backward_qk(dx1, dx1 + qd, dw1, dw1 + f->hd, f->gdq, f->gdk, X, X + qd, qd + kd, Wn, Wn, mq, mk, f->B, f->T, f->H, f->KV,
                                    f->hd, 1e-6f, 0, dcs, dsn, ROPE_HF, a1, b1, NULL, g_s);
            cudaCheck(cudaMemset(f->scr, 0xff, sizeof(double) * 3 * n));
            cudaCheck(cudaMemset(f->dbuf, 0, sizeof(int) * ATTB_NCHECK * (1 + (size_t)nbh)));
            cudaCheck(cudaMemset(done, 0, sizeof(unsigned) * ndone));
            double* bnd3 = (double*)d_f32_poison(2 * nbd);
            const AttbFused ab2 = attcheck_fused_backward_ride(f->dbuf, f->dbuf + ATTB_NCHECK, f->scr, f->go, qd, f->v, kd, f->gdv, kd, f->B, f->T,
                                                               f->H, f->KV, f->hd, bnd3, work, nwork, done);
            rope_qknorm_backward_qk(dx2, dx2 + qd, dw2, dw2 + f->hd, f->gdq, f->gdk, X, X + qd, qd + kd, Wn, Wn, mq, mk, f->B, f->T, f->H, f->KV,
                                    f->hd, 1e-6f, 0, dcs, dsn, ROPE_HF, a2, b2, &ab2, g_s);
            g_qknr_bwd_grid_cap = 0;
            cudaCheck(cudaStreamSynchronize(g_s));
            int c5[ATTB_NCHECK];
            cudaCheck(cudaMemcpy(c5, f->dbuf, sizeof(int) * ATTB_NCHECK, cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(h, fa, sizeof(h), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(hs2, f->scr, sizeof(double) * 3 * n, cudaMemcpyDeviceToHost));
            double *hb1 = (double*)mallocCheck(sizeof(double) * nbd), *hb3 = (double*)mallocCheck(sizeof(double) * nbd);
            cudaCheck(cudaMemcpy(hb1, bnd1, sizeof(double) * nbd, cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(hb3, bnd3, sizeof(double) * nbd, cudaMemcpyDeviceToHost));
            uint16_t *u1 = dl_bits(dx1, nx), *u2 = dl_bits(dx2, nx);
            float *v1 = dl_f32(dw1, 2 * (size_t)f->hd, NULL), *v2 = dl_f32(dw2, 2 * (size_t)f->hd, NULL);
            g_ride_qknr_diff += memcmp(c5, c2, sizeof(c5)) != 0 || memcmp(hb1, hb3, sizeof(double) * nbd) != 0 ||
                                memcmp(hs1, hs2, sizeof(double) * 3 * n) != 0 || memcmp(u1, u2, nx * 2) != 0 || bits_differ(v1, v2, 2 * f->hd) ||
                                (fp && (memcmp(h, h + 2 * FP_WORDS, 2 * FP_WORDS * 8) != 0 || (h[0] | h[1]) == 0));
            g_ride_qknr_runs++;
            FREE_ALL(hx, hw, hm, hb1, hb3, u1, u2, v1, v2);
        }
    }
    g_rope_grid_cap = 0;
    FREE_ALL(cs, sn, hs1, hs2);
}
static FlashPlant plant_at(int where, int b, int h, int t, int s, float mul, float add) {
    FlashPlant p = {where, b, h, t, s, mul, add};
    return p;
}
/* want[c] < 0: any count */
static void fused_line(const char* what, const int* got, const int* want, int nc, const char* names) {
    int ok = 1;
    for (int c = 0; c < nc; c++) ok &= want[c] < 0 || got[c] == want[c];
    char g[64], w[64];
    int og = 0, ow = 0;
    for (int c = 0; c < nc; c++) {
        og += snprintf(g + og, sizeof(g) - og, "%d ", got[c]);
        ow += snprintf(w + ow, sizeof(w) - ow, want[c] < 0 ? "any " : "%d ", want[c]);
    }
    check(ok, "    %-58s failed %s: %s(want %s)", what, names, g, w);
}

/* Catches: fused kernels whose row sums cover the wrong keys (the diagonal, the masked tail, a tile twice), a row
 * sum taken before the plant point of its check (the fault passes), the probability sum of the unrounded P instead
 * of the operand P V reads, alarms on clean attention, and a bound that misses faults of twice its size or fires on a
 * quarter of it. The plants go where a hardware fault would hit the fused kernels' registers (FlashPlant). */
static void test_flash_attcheck(void) {
    printf("attention checks inside the fused kernels (FlashCheck row sums, attcheck_fused_forward / _backward, the dV column\n"
           "  check on the fused dv): clean rows against the CPU's sums, planted faults of 2x / 0.25x the CPU's bounds\n");
    struct { int B, T, H, KV, hd; } cases[] = {{2, 37, 4, 2, 64}, {1, 130, 4, 2, 128}, {1, 70, 4, 1, 32}, {1, 100, 2, 2, 64}};
    const char* fn = "logits/probs";
    const char* bn = "dprobs/dlogits/dv";
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int B = cases[ci].B, T = cases[ci].T, H = cases[ci].H, KV = cases[ci].KV, hd = cases[ci].hd, g = H / KV, nbh = B * H;
        const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, n = (size_t)nbh * T, na = (size_t)nbh * T * T;
        const size_t qs = (size_t)H * hd, ks = (size_t)KV * hd;
        const double scale = 1.0 / sqrt((double)hd);
        printf("  B %d T %d H %d KV %d hd %d\n", B, T, H, KV, hd);
        float* q = h_normal(nq, 1.5, 0.0, 1);
        float* k = h_normal(nk, 1.0, 0.0, 1);
        float* v = h_normal(nk, 1.0, 0.0, 1);
        float* go = h_normal(nq, 0.1, 0.0, 1);
        FusedChk f;
        f.B = B; f.T = T; f.H = H; f.KV = KV; f.hd = hd;
        f.q = d_bf16(q, nq); f.k = d_bf16(k, nk); f.v = d_bf16(v, nk); f.go = d_bf16(go, nq);
        f.gout = d_bf16_poison(nq); f.glse = d_f32_poison(n);
        f.gdq = d_bf16_poison(nq); f.gdk = d_bf16_poison(nk); f.gdv = d_bf16_poison(nk);
        f.dbuf = (int*)dalloc_raw(ATTC_NCHECK * (1 + (size_t)nbh), 4);
        f.scr = (double*)dalloc_raw(attcheck_scratch_doubles(B, H, T), 8);
        const FlashPlant none = plant_at(FLASH_PLANT_NONE, 0, 0, 0, 0, 1.0f, 0.0f);
        int fc[ATTC_NCHECK], bc[ATTB_NCHECK];
        const int fq[ATTC_NCHECK] = {-1, 0, 0, -1}, bq[ATTB_NCHECK] = {0, 0, 0};

        /* clean forward: the kernel's row sums against the CPU's (double, from the same bf16 inputs) */
        fused_fwd_checks(&f, none, fc);
        fused_line("clean forward", fc + 0, fq, ATTC_NCHECK, "abft_logits(unused)/logits/probs/abft_av(unused)");
        float* rows = dl_f32(attcheck_fused_rows(f.scr, B, H, T), 2 * n, NULL);
        double* hs = (double*)mallocCheck(sizeof(double) * 4 * n);
        cudaCheck(cudaMemcpy(hs, f.scr, sizeof(double) * 4 * n, cudaMemcpyDeviceToHost));   /* ref, -, tol, - (rows) */
        float *rlg = h_alloc(na), *rpr = h_alloc(na), *rout = h_alloc(nq);
        attention_forward(rout, rlg, rpr, q, k, v, B, T, H, KV, hd);
        double worst_z = 0, worst_p = 0;
        for (size_t r = 0; r < n; r++) {
            const int t = (int)(r % T);
            double sz = 0;
            for (int s = 0; s <= t; s++) sz += rlg[r * T + s];
            worst_z = fmax(worst_z, fabs(rows[r] - sz) / hs[2 * n + r]);
            worst_p = fmax(worst_p, fabs(rows[n + r] - 1.0) / ATT_TOL_ROWSUM(16, T));
        }
        check(worst_z <= 0.01 && worst_p <= 0.25,
              "    forward row sums: logits within %.2e of their bound from the CPU's sums (want <= 0.01: fp32), probabilities within "
              "%.2e of theirs from 1 (want <= 0.25: one bf16 rounding a term)", worst_z, worst_p);
        float* out = dl_bf16(f.gout, nq, NULL);
        float* lse = dl_f32(f.glse, n, NULL);
        f.out = d_bf16(out, nq);
        f.lse = d_f32(lse, n);
        /* forward plants: a random (b, h) and a live (t, s) */
        const int b0 = (int)rng_below(&g_rng, B), h0 = (int)rng_below(&g_rng, H), bh0 = b0 * H + h0;
        const int t0 = T - 1 - (int)rng_below(&g_rng, T / 2), s0 = (int)rng_below(&g_rng, t0 + 1);
        const size_t r0 = (size_t)bh0 * T + t0;
        char what[128];
        {
            const double tz = hs[2 * n + r0];
            int w2[ATTC_NCHECK] = {-1, 1, 0, -1}, w4[ATTC_NCHECK] = {-1, 0, 0, -1}, wn[ATTC_NCHECK] = {-1, 1, 1, -1};
            snprintf(what, sizeof(what), "S + 2 x bound at t %d s %d", t0, s0);
            fused_fwd_checks(&f, plant_at(FLASH_PLANT_S, b0, h0, t0, s0, 1.0f, (float)(2 * tz)), fc);
            fused_line(what, fc, w2, ATTC_NCHECK, fn);
            fused_fwd_checks(&f, plant_at(FLASH_PLANT_S, b0, h0, t0, s0, 1.0f, (float)(0.25 * tz)), fc);
            fused_line("S + 0.25 x bound (below what the checksum claims)", fc, w4, ATTC_NCHECK, fn);
            fused_fwd_checks(&f, plant_at(FLASH_PLANT_S, b0, h0, t0, t0, 1.0f, NAN), fc);
            fused_line("S = NaN on the diagonal (non-finite fails both)", fc, wn, ATTC_NCHECK, fn);
        }
        {   /* P: the row's largest probability in an early row (>= 1/(t+1)), scaled so the normalised row sum moves by
             * 2 x the tolerance (caught) or a quarter of it (not) */
            const int tp = 3 + (int)rng_below(&g_rng, 5 < T - 3 ? 5 : 1);
            const size_t rp = (size_t)bh0 * T + tp;
            int sp = 0;
            for (int s = 1; s <= tp; s++) if (rpr[rp * T + s] > rpr[rp * T + sp]) sp = s;
            const double P = rpr[rp * T + sp], tol = ATT_TOL_ROWSUM(16, T);
            int w2[ATTC_NCHECK] = {-1, 0, 1, -1}, w4[ATTC_NCHECK] = {-1, 0, 0, -1};
            snprintf(what, sizeof(what), "P x (1 + 2 tol / P) at t %d s %d (P %.3f)", tp, sp, P);
            fused_fwd_checks(&f, plant_at(FLASH_PLANT_P, b0, h0, tp, sp, (float)(1.0 + 2.0 * tol / P), 0.0f), fc);
            fused_line(what, fc, w2, ATTC_NCHECK, fn);
            fused_fwd_checks(&f, plant_at(FLASH_PLANT_P, b0, h0, tp, sp, (float)(1.0 + 0.25 * tol / P), 0.0f), fc);
            fused_line("P x (1 + 0.25 tol / P)", fc, w4, ATTC_NCHECK, fn);
            /* the last head's last row (a partial tile where T is not a multiple of 64), its largest probability */
            const size_t rl = (size_t)(nbh - 1) * T + (T - 1);
            int sl = 0;
            for (int s = 1; s < T; s++) if (rpr[rl * T + s] > rpr[rl * T + sl]) sl = s;
            fused_fwd_checks(&f, plant_at(FLASH_PLANT_P, B - 1, H - 1, T - 1, sl, (float)(1.0 + 2.0 * tol / rpr[rl * T + sl]), 0.0f), fc);
            int wl[ATTC_NCHECK] = {-1, 0, 1, -1};
            snprintf(what, sizeof(what), "P x (1 + 2 tol / P) at the last head's last row, s %d", sl);
            fused_line(what, fc, wl, ATTC_NCHECK, fn);
        }

        /* clean backward */
        fused_bwd_checks(&f, none, bc);
        fused_line("clean backward", bc, bq, ATTB_NCHECK, bn);
        double* hb = (double*)mallocCheck(sizeof(double) * 3 * n);
        cudaCheck(cudaMemcpy(hb, f.scr, sizeof(double) * 3 * n, cudaMemcpyDeviceToHost));   /* ref, tol_dp, tol_dl */
        float* brows = dl_f32(attcheck_fused_rows(f.scr, B, H, T), 2 * n, NULL);
        double worst_dp = 0, worst_dz = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    const size_t r = ((size_t)b * H + h) * T + t;
                    const float* ot = go + ((size_t)b * T + t) * qs + (size_t)h * hd;
                    double sdp = 0;
                    for (int s = 0; s <= t; s++) {
                        const float* vs = v + ((size_t)b * T + s) * ks + (size_t)(h / g) * hd;
                        for (int i = 0; i < hd; i++) sdp += (double)ot[i] * vs[i];
                    }
                    worst_dp = fmax(worst_dp, fabs(brows[r] - sdp) / hb[n + r]);
                    worst_dz = fmax(worst_dz, fabs(brows[n + r]) / hb[2 * n + r]);
                }
        check(worst_dp <= 0.01 && worst_dz <= 0.25,
              "    backward row sums: dprobs within %.2e of their bound from the CPU's sums (want <= 0.01: fp32), dlogits within %.2e of "
              "theirs from 0 (want <= 0.25: the room the bound claims)", worst_dp, worst_dz);
        {
            const double tdp = hb[n + r0], tdl = hb[2 * n + r0], P = rpr[r0 * T + s0];
            /* dP + delta moves the dprobs sum by delta and the dlogits sum by P delta (D comes from out, not from dP) */
            const double dl2 = P * 2 * tdp;
            int w2[ATTB_NCHECK] = {1, dl2 > 2 * tdl ? 1 : dl2 < 0.5 * tdl ? 0 : -1, 0};
            snprintf(what, sizeof(what), "dP + 2 x bound at t %d s %d", t0, s0);
            fused_bwd_checks(&f, plant_at(FLASH_PLANT_DP, b0, h0, t0, s0, 1.0f, (float)(2 * tdp)), bc);
            fused_line(what, bc, w2, ATTB_NCHECK, bn);
            int w4[ATTB_NCHECK] = {0, P * 0.25 * tdp < 0.5 * tdl ? 0 : -1, 0};
            fused_bwd_checks(&f, plant_at(FLASH_PLANT_DP, b0, h0, t0, s0, 1.0f, (float)(0.25 * tdp)), bc);
            fused_line("dP + 0.25 x bound", bc, w4, ATTB_NCHECK, bn);
            int z2[ATTB_NCHECK] = {0, 1, 0}, z4[ATTB_NCHECK] = {0, 0, 0};
            snprintf(what, sizeof(what), "dZ + 2 x bound at t %d s %d", t0, s0);
            fused_bwd_checks(&f, plant_at(FLASH_PLANT_DZ, b0, h0, t0, s0, 1.0f, (float)(2 * tdl)), bc);
            fused_line(what, bc, z2, ATTB_NCHECK, bn);
            fused_bwd_checks(&f, plant_at(FLASH_PLANT_DZ, b0, h0, t0, s0, 1.0f, (float)(0.25 * tdl)), bc);
            fused_line("dZ + 0.25 x bound", bc, z4, ATTB_NCHECK, bn);
            fused_bwd_checks(&f, plant_at(FLASH_PLANT_DZ, B - 1, H - 1, T - 1, T - 1, 1.0f, NAN), bc);
            int zn[ATTB_NCHECK] = {0, 1, -1};
            fused_line("dZ = NaN at the last head's last row, diagonal", bc, zn, ATTB_NCHECK, bn);
        }
        {   /* the dk/dv kernel's own P^T reaches dv alone (the dV column check); its dZ^T reaches dk alone, which no
             * att_bwd check reads (the Q/K backward recomputation does): counts zero, dk changed */
            const int tp = T - 1, hp = h0;
            int sp = 0;
            const size_t rp = (size_t)(b0 * H + hp) * T + tp;
            for (int s = 1; s <= tp; s++) if (rpr[rp * T + s] > rpr[rp * T + sp]) sp = s;
            int wv[ATTB_NCHECK] = {0, 0, 1};
            snprintf(what, sizeof(what), "dk/dv kernel: P^T x 2^20 at t %d s %d", tp, sp);
            fused_bwd_checks(&f, plant_at(FLASH_PLANT_DKV_P, b0, hp, tp, sp, 1048576.0f, 0.0f), bc);
            fused_line(what, bc, wv, ATTB_NCHECK, bn);
            fused_bwd_checks(&f, none, bc);
            float* dk_clean = dl_bf16(f.gdk, nk, NULL);
            fused_bwd_checks(&f, plant_at(FLASH_PLANT_DKV_DZ, b0, hp, tp, sp, 1.0f, 1024.0f), bc);
            float* dk_f = dl_bf16(f.gdk, nk, NULL);
            const size_t dif = bits_differ(dk_clean, dk_f, nk);
            check(bc[0] == 0 && bc[1] == 0 && bc[2] == 0 && dif > 0,
                  "    dk/dv kernel: dZ^T + 1024: dk elements changed %zu (want > 0), failed dprobs/dlogits/dv %d %d %d (want 0 0 0: "
                  "outside att_bwd, the Q/K backward recomputation's)", dif, bc[0], bc[1], bc[2]);
            FREE_ALL(dk_clean, dk_f);
        }
        FREE_ALL(q, k, v, go, rows, hs, rlg, rpr, rout, out, lse, hb, brows);
        dfree_all();
    }
    check(g_fused_chunked > 0, "  the one-launch checks' dV part ran with more than one chunk in %d of the calls above", g_fused_chunked);
    check(g_ride_norm_runs > 0 && g_ride_norm_diff == 0, "  the forward scan riding on the residual add + norm's launch: its counts and bounds the "
          "separate launch's, the add's and the norm's outputs bitwise the launch's without it, in %d of %d calls (want all)",
          g_ride_norm_runs - g_ride_norm_diff, g_ride_norm_runs);
    check(g_ride_rope_runs > 0 && g_ride_rope_diff == 0, "  the checks riding on the RoPE backward's launch: their counts the one launch's, its dq, dk and "
          "fingerprints bitwise the launch's without them, in %d of %d calls (want all)", g_ride_rope_runs - g_ride_rope_diff, g_ride_rope_runs);
    check(g_ride_qknr_runs > 0 && g_ride_qknr_diff == 0, "  the checks riding on Qwen3's RoPE + QK-norm backward launch: their counts and bounds the one "
          "launch's, its dx, dw and fingerprints bitwise the launch's without them, in %d of %d calls (want all)", g_ride_qknr_runs - g_ride_qknr_diff,
          g_ride_qknr_runs);
}
