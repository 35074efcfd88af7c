/* bf16_bounds.h: the fixed bounds within which bf16 AMP (-precision bf16 on the CPU, the GPU trainer)
 * must reproduce the fp32 reference states (dev/reference/states: HF transformers / nanochat, fp32),
 * derived from bf16 rounding alone, never from an implementation's own error. test_sdc.c (CPU
 * emulation), test_sdc.cu section (b) (GPU) and tests/test_reference_run.py (the binary) use them.
 *
 * 1. One rounding. bf16 keeps 8 significant bits; round-to-nearest-even moves a value by at most half
 *    an ulp: relative error <= u = 2^-9 per element, so a rounded tensor's relative L2 error
 *    ||round(x) - x|| / ||x|| <= u.
 * 2. Roundings on a path. The reference weights are bf16 values already (make_states.py rounds them),
 *    so the bf16 weight copy is exact at step 0 and every error comes from the activation and
 *    activation-gradient roundings (train_sdc.c BF16_STORE: every module output and every gradient of
 *    one). Along the longest chain of one layer, forward: attn_norm, q_proj, the QK norm (before or
 *    after RoPE: a family has one), q_rope, att_logits, att_probs, att_out, o_proj, attn_residual,
 *    mlp_norm, gate_proj, act, mlp_product, down_proj, block_out: 15; backward the gradients of the
 *    same modules, which add the split of dprobs / dv: 16. Count 16 a layer each way, and 4 outside
 *    the layers each way (embedding, embed norm, final norm, logits; dlogits, final norm, residual,
 *    embedding): the logits lie n_f = 16 L + 4 roundings from the input, a weight gradient at most
 *    n_f + n_b = 2 (16 L + 4) (layer 0: the whole forward, then the whole backward). L = 4: 68, 136.
 * 3. Accumulation. Each op between roundings (RMSNorm, fp32-accumulated GEMM, softmax, SwiGLU / ReLU^2,
 *    RoPE) is well conditioned in relative L2, so to first order the n relative errors add. All aligned
 *    (the worst case) that is n u (0.13 for the logits, 0.27 for the gradients: looser than any real
 *    bug needs); rounding errors are zero-mean and independent across roundings, so they add as a
 *    random walk, sqrt(n) u. The bound is that estimate with a safety factor LAMBDA = 3, which also
 *    covers the cancellation in the reductions that make norm-weight gradients (the largest measured
 *    errors): BF16_LOGITS_RL2 = 3 sqrt(n_f) u, BF16_GRAD_RL2 = 3 sqrt(n_f + n_b) u.
 * 4. The loss. d CE_n = sum_i (p_i - [i = y]) dz_i, and ||p - e_y||_2 <= sqrt(2), so each position's
 *    cross-entropy moves by at most sqrt(2) ||dz_n||; the mean over N positions, whose rounding errors
 *    are independent as in 3., moves by at most sqrt(2) ||dz||_F / N <= sqrt(2) BF16_LOGITS_RL2 ||z||_F / N:
 *    an absolute bound computed from the reference logits z (bf16_loss_bound).
 * 5. The losses of the 10 AdamW steps. The loss falls from L(0) to L(s) through the updates, and
 *    AdamW's update m / sqrt(v) is invariant to the gradient's scale, so each update is off by at most
 *    the gradient's relative error: |L_bf16(s) - L_ref(s)| <= bound of step 0 +
 *    BF16_GRAD_RL2 |L_ref(0) - L_ref(s)| (bf16_losses_bound).
 *
 * Measured 2026-12 (CPU emulation, tiny presets): logits rel L2 <= 6.4e-3 (bound 4.83e-2); loss
 * 3.0e-4 absolute (bound 3.0e-2); gradients <= 2.5e-2 (tiny-qwen3 q_norm_w; bound 6.83e-2); the 10 losses within
 * 0.28 of their bounds (tiny-llama step 8: 0.039 of 0.137). A bf16 weight copy left stale after the
 * updates (training stops learning: the step-10 loss stays 5.58 instead of 3.79) misses the losses'
 * bound by 11.5x. */
#ifndef TSDC_BF16_BOUNDS_H
#define TSDC_BF16_BOUNDS_H

#include <math.h>

#define BF16_U 0.001953125                                   /* 2^-9: one round-to-nearest-even */
#define BF16_LAMBDA 3.0                                      /* safety factor on the random-walk sqrt(n) u */
#define BF16_FWD_ROUNDINGS(L) (16 * (L) + 4)                 /* input -> logits */
#define BF16_BWD_ROUNDINGS(L) (16 * (L) + 4)                 /* dlogits -> the layer-0 weight gradients */
#define BF16_LOGITS_RL2(L) (BF16_LAMBDA * sqrt((double)BF16_FWD_ROUNDINGS(L)) * BF16_U)
#define BF16_GRAD_RL2(L) (BF16_LAMBDA * sqrt((double)(BF16_FWD_ROUNDINGS(L) + BF16_BWD_ROUNDINGS(L))) * BF16_U)

/* absolute bound on the mean cross-entropy from the logits' bound: sqrt(2) rl2 ||z||_F / N,
 * z the reference logits [N, V] */
static inline double bf16_loss_bound(const float* z, long long N, int V, int L) {
    double s = 0;
    for (long long i = 0; i < N * V; i++) s += (double)z[i] * z[i];
    return sqrt(2.0) * BF16_LOGITS_RL2(L) * sqrt(s) / (double)N;
}

/* absolute bound on the loss before update s of the reference run, whose losses are ref[0..] */
static inline double bf16_losses_bound(double loss0_bound, const float* ref, int s, int L) {
    return loss0_bound + BF16_GRAD_RL2(L) * fabs((double)ref[0] - ref[s]);
}

#endif
