/* train_sdc.c: the CPU reference trainer.
 *
 * Trains any member of the model family (llmc/config.h) with AdamW, gradient accumulation, MPI data
 * parallelism, exact checkpoint resume and a JSONL log, in fp32 (the exact reference) or in emulated
 * bf16 AMP. It is also the reference the CUDA trainer is tested against: the forward and backward
 * below are written to be read top to bottom, one line an op, with the shapes in comments; the math
 * of each op is in llmc/cpu_kernels.h.
 *
 * Emulated AMP (-precision bf16): the GPU keeps fp32 master weights and AdamW state, computes with
 * bf16 copies of the weights, and stores every activation and activation gradient in bf16 with fp32
 * accumulation inside each op. Here: weights are rounded to bf16 once after each update (model->wr,
 * model->wT), and every module output and activation gradient is rounded to bf16 (round-to-nearest-
 * even) right after the op that writes it (BF16_STORE). Weight gradients, mean squares, losses and the
 * optimizer stay fp32.
 *
 * Determinism: see llmc/cpu_kernels.h; every reduction has a fixed order that does not depend on the
 * thread count, so the same flags give the same bits. test_sdc.c includes this file with TESTING
 * defined to reach the model functions. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "llmc/utils.h"
#include "llmc/args.h"
#include "llmc/bf16.h"
#include "llmc/checkpoint.h"
#include "llmc/checksum.h"
#include "llmc/config.h"
#include "llmc/cpu_kernels.h"
#include "llmc/dataloader.h"
#include "llmc/dist.h"
#include "llmc/logger.h"
#include "llmc/rng.h"
#include "llmc/rope.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"

/* ------------------------------------------------------------------------------------- model */
typedef struct {
    float *attn_norm, *attn_ms;          /* [N,d], [N]                      attn_norm */
    float *q, *k, *v;                    /* [N,H*hd], [N,KV*hd] x2          q_proj k_proj v_proj */
    float *qn, *kn, *qn_ms, *kn_ms;      /* weighted QK norm before RoPE    q_norm k_norm (Qwen3) */
    float *qr, *kr;                      /* after RoPE                      q_rope k_rope */
    float *qf, *kf, *qf_ms, *kf_ms;      /* plain QK norm after RoPE        q_norm k_norm (nanochat) */
    float *logits, *probs;               /* [B,H,T,T]                       att_logits att_probs */
    float *att_out;                      /* [N,H*hd]                        att_out */
    float *o;                            /* [N,d]                           o_proj */
    float *resid_mid;                    /* [N,d] x + o                     attn_residual */
    float *mlp_norm, *mlp_ms;            /* [N,d], [N]                      mlp_norm */
    float *gate, *up;                    /* [N,F] (gate = fc for ReLU^2)    gate_proj up_proj */
    float *act, *prod;                   /* [N,F]                           act mlp_product */
    float *down;                         /* [N,d]                           down_proj */
    float *out;                          /* [N,d] resid_mid + down          block_out */
} LayerActs;

typedef struct {
    Config c;
    ParamLayout L;
    int* tidx;                 /* [n_layer+1][PT_COUNT] tensor index, -1 absent; row n_layer = globals */
    int B, T;                  /* allocated microbatch shape */
    int precision;
    float *params, *grads, *m, *v;   /* fp32 master weights, gradients, AdamW moments */
    float *wr;                 /* weights used by the math: bf16-rounded copy in bf16 mode, else params */
    float *wT;                 /* transposed copies of the matrices (same offsets), for the forward GEMM */
    float *rope_cos, *rope_sin;
    /* activations */
    float *emb, *emb_ms, *x0;  /* embedding output, embed-norm mean square, layer-0 input */
    LayerActs* la;
    float *final_norm, *final_ms, *logits, *losses;
    int *inputs, *targets;
    /* backward scratch */
    float *dres, *dbuf, *dq, *dq2, *dk, *dk2, *dv, *datt, *dF, *dF2, *dF3;
    float* act_mem;
    size_t act_floats;
} Model;

#define BF16_STORE(m, x, n) do { if ((m)->precision) bf16_round_array((x), (long long)(n)); } while (0)

static int tensor_index(const Model* m, int type, int layer) {
    return m->tidx[(layer < 0 ? m->c.n_layer : layer) * PT_COUNT + type];
}
/* pointer into a parameter-sized buffer; NULL when the preset has no such tensor */
static float* tensor_ptr(const Model* m, float* base, int type, int layer) {
    int i = tensor_index(m, type, layer);
    return i < 0 ? NULL : base + m->L.t[i].offset;
}
#define W(type, l) tensor_ptr(model, model->wr, type, l)
#define WT(type, l) tensor_ptr(model, model->wT, type, l)
#define GR(type, l) tensor_ptr(model, model->grads, type, l)

static void model_build(Model* model, const Config* c, int B, int T, int precision) {
    memset(model, 0, sizeof(*model));
    model->c = *c;
    model->B = B; model->T = T; model->precision = precision;
    param_layout_build(c, &model->L);
    model->tidx = (int*)mallocCheck(sizeof(int) * (c->n_layer + 1) * PT_COUNT);
    for (int i = 0; i < (c->n_layer + 1) * PT_COUNT; i++) model->tidx[i] = -1;
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* t = &model->L.t[i];
        model->tidx[(t->layer < 0 ? c->n_layer : t->layer) * PT_COUNT + t->type] = i;
    }
    size_t P = model->L.total;
    model->params = (float*)callocCheck(P, sizeof(float));
    model->grads = (float*)callocCheck(P, sizeof(float));
    model->m = (float*)callocCheck(P, sizeof(float));
    model->v = (float*)callocCheck(P, sizeof(float));
    model->wr = precision ? (float*)callocCheck(P, sizeof(float)) : model->params;
    model->wT = (float*)callocCheck(P, sizeof(float));
    int half = c->head_dim / 2;
    model->rope_cos = (float*)mallocCheck(sizeof(float) * T * half);
    model->rope_sin = (float*)mallocCheck(sizeof(float) * T * half);
    rope_tables(c, T, model->rope_cos, model->rope_sin);

    /* activations: one allocation carved into tensors */
    size_t N = (size_t)B * T, d = c->d_model, qd = (size_t)c->n_head * c->head_dim, kd = (size_t)c->n_kv_head * c->head_dim;
    size_t F = c->ffn_dim, V = c->vocab_size, att = (size_t)B * c->n_head * T * T, H = c->n_head, KV = c->n_kv_head;
    size_t per_layer = N * d * 6 + N * 2 + N * qd * 5 + N * kd * 5 + N * (H + KV) * 2 + att * 2 + N * F * 4;
    size_t total = N * d * 2 + N + (size_t)c->n_layer * per_layer + N * d + N + N * V + N /* forward */
                 + N * d * 2 + N * qd * 3 + N * kd * 3 + N * F * 3;                         /* backward */
    model->act_mem = (float*)callocCheck(total, sizeof(float));
    model->act_floats = total;
    float* p = model->act_mem;
#define CARVE(ptr, n) do { (ptr) = p; p += (n); } while (0)
    CARVE(model->emb, N * d); CARVE(model->emb_ms, N); CARVE(model->x0, N * d);
    model->la = (LayerActs*)callocCheck(c->n_layer, sizeof(LayerActs));
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs* a = &model->la[l];
        CARVE(a->attn_norm, N * d); CARVE(a->attn_ms, N);
        CARVE(a->q, N * qd); CARVE(a->k, N * kd); CARVE(a->v, N * kd);
        CARVE(a->qn, N * qd); CARVE(a->kn, N * kd); CARVE(a->qn_ms, N * H); CARVE(a->kn_ms, N * KV);
        CARVE(a->qr, N * qd); CARVE(a->kr, N * kd);
        CARVE(a->qf, N * qd); CARVE(a->kf, N * kd); CARVE(a->qf_ms, N * H); CARVE(a->kf_ms, N * KV);
        CARVE(a->logits, att); CARVE(a->probs, att);
        CARVE(a->att_out, N * qd); CARVE(a->o, N * d); CARVE(a->resid_mid, N * d);
        CARVE(a->mlp_norm, N * d); CARVE(a->mlp_ms, N);
        CARVE(a->gate, N * F); CARVE(a->up, N * F); CARVE(a->act, N * F); CARVE(a->prod, N * F);
        CARVE(a->down, N * d); CARVE(a->out, N * d);
    }
    CARVE(model->final_norm, N * d); CARVE(model->final_ms, N); CARVE(model->logits, N * V); CARVE(model->losses, N);
    CARVE(model->dres, N * d); CARVE(model->dbuf, N * d);
    CARVE(model->dq, N * qd); CARVE(model->dq2, N * qd); CARVE(model->datt, N * qd);
    CARVE(model->dk, N * kd); CARVE(model->dk2, N * kd); CARVE(model->dv, N * kd);
    CARVE(model->dF, N * F); CARVE(model->dF2, N * F); CARVE(model->dF3, N * F);
#undef CARVE
    if ((size_t)(p - model->act_mem) > total) tsdc_fail("internal: activation carve overflow");
    model->inputs = (int*)callocCheck(N, sizeof(int));
    model->targets = (int*)callocCheck(N, sizeof(int));
}

static void model_free(Model* model) {
    if (model->wr != model->params) free(model->wr);
    free(model->params); free(model->grads); free(model->m); free(model->v); free(model->wT);
    free(model->rope_cos); free(model->rope_sin); free(model->act_mem); free(model->la);
    free(model->inputs); free(model->targets); free(model->tidx);
}

/* normal(0, 0.02) for matrices and embeddings, ones for norm weights; one seeded stream in
 * parameter order, so every rank and every run draws the same weights. */
static void model_init_weights(Model* model, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* t = &model->L.t[i];
        float* p = model->params + t->offset;
        if (t->rows == 1) for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        else for (size_t j = 0; j < t->numel; j++) p[j] = (float)(0.02 * rng_normal(&r));
    }
}

/* after every change of the master weights: the bf16 copy (bf16 mode) and the transposed copies */
static void model_prepare_weights(Model* model) {
    size_t P = model->L.total;
    if (model->precision) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < P; i++) model->wr[i] = bf16_round(model->params[i]);
    }
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* t = &model->L.t[i];
        if (t->rows > 1) transpose(model->wT + t->offset, model->wr + t->offset, t->rows, t->cols);
    }
}

/* ---------------------------------------------------------------------------------- forward
 * inputs/targets [B*T] in model->inputs/targets (targets may be NULL: no loss). B <= model->B and
 * T <= model->T (sampling runs shorter). Returns the mean loss over the non-ignored targets. */
static float model_forward(Model* model, int B, int T, const int* targets) {
    const Config* c = &model->c;
    int N = B * T, d = c->d_model, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    int qd = H * hd, kd = KV * hd, F = c->ffn_dim, V = c->vocab_size;
    float eps = (float)c->norm_eps;
    const int* inputs = model->inputs;

    embedding_forward(model->emb, inputs, W(PT_WTE, -1), N, d);                   /* [N,d] */
    BF16_STORE(model, model->emb, (size_t)N * d);
    float* x = model->emb;
    if (c->embed_norm) {
        rmsnorm_forward(model->x0, model->emb_ms, x, W(PT_EMBED_NORM, -1), N, d, eps);
        BF16_STORE(model, model->x0, (size_t)N * d);
        x = model->x0;
    }
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs* a = &model->la[l];
        /* attention block: x + o_proj(attn(rope(qk_norm(q, k)), v)) */
        rmsnorm_forward(a->attn_norm, a->attn_ms, x, W(PT_ATTN_NORM, l), N, d, eps);   BF16_STORE(model, a->attn_norm, (size_t)N * d);
        matmul_forward(a->q, a->attn_norm, WT(PT_WQ, l), N, d, qd);                       BF16_STORE(model, a->q, (size_t)N * qd);
        matmul_forward(a->k, a->attn_norm, WT(PT_WK, l), N, d, kd);                       BF16_STORE(model, a->k, (size_t)N * kd);
        matmul_forward(a->v, a->attn_norm, WT(PT_WV, l), N, d, kd);                       BF16_STORE(model, a->v, (size_t)N * kd);
        float *qc = a->q, *kc = a->k;
        if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {                                    /* per head, over hd */
            rmsnorm_forward(a->qn, a->qn_ms, qc, W(PT_QNORM, l), N * H, hd, eps);          BF16_STORE(model, a->qn, (size_t)N * qd);
            rmsnorm_forward(a->kn, a->kn_ms, kc, W(PT_KNORM, l), N * KV, hd, eps);         BF16_STORE(model, a->kn, (size_t)N * kd);
            qc = a->qn; kc = a->kn;
        }
        rope_forward(a->qr, qc, model->rope_cos, model->rope_sin, B, T, H, hd, c->rope_style);   BF16_STORE(model, a->qr, (size_t)N * qd);
        rope_forward(a->kr, kc, model->rope_cos, model->rope_sin, B, T, KV, hd, c->rope_style);  BF16_STORE(model, a->kr, (size_t)N * kd);
        qc = a->qr; kc = a->kr;
        if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
            rmsnorm_forward(a->qf, a->qf_ms, qc, NULL, N * H, hd, eps);                    BF16_STORE(model, a->qf, (size_t)N * qd);
            rmsnorm_forward(a->kf, a->kf_ms, kc, NULL, N * KV, hd, eps);                   BF16_STORE(model, a->kf, (size_t)N * kd);
            qc = a->qf; kc = a->kf;
        }
        attention_forward(a->att_out, a->logits, a->probs, qc, kc, a->v, B, T, H, KV, hd);
        BF16_STORE(model, a->logits, (size_t)B * H * T * T); BF16_STORE(model, a->probs, (size_t)B * H * T * T);
        BF16_STORE(model, a->att_out, (size_t)N * qd);
        matmul_forward(a->o, a->att_out, WT(PT_WO, l), N, qd, d);                         BF16_STORE(model, a->o, (size_t)N * d);
        residual_forward(a->resid_mid, x, a->o, (size_t)N * d);                           BF16_STORE(model, a->resid_mid, (size_t)N * d);
        /* MLP block: x + down(silu(gate) * up)  or  x + down(relu(fc)^2) */
        rmsnorm_forward(a->mlp_norm, a->mlp_ms, a->resid_mid, W(PT_MLP_NORM, l), N, d, eps); BF16_STORE(model, a->mlp_norm, (size_t)N * d);
        float* hidden;
        if (c->mlp == MLP_SWIGLU) {
            matmul_forward(a->gate, a->mlp_norm, WT(PT_WGATE, l), N, d, F);               BF16_STORE(model, a->gate, (size_t)N * F);
            matmul_forward(a->up, a->mlp_norm, WT(PT_WUP, l), N, d, F);                   BF16_STORE(model, a->up, (size_t)N * F);
            silu_forward(a->act, a->gate, (size_t)N * F);                                  BF16_STORE(model, a->act, (size_t)N * F);
            mul_forward(a->prod, a->act, a->up, (size_t)N * F);                            BF16_STORE(model, a->prod, (size_t)N * F);
            hidden = a->prod;
        } else {
            matmul_forward(a->gate, a->mlp_norm, WT(PT_WFC, l), N, d, F);                 BF16_STORE(model, a->gate, (size_t)N * F);
            relu2_forward(a->act, a->gate, (size_t)N * F);                                 BF16_STORE(model, a->act, (size_t)N * F);
            hidden = a->act;
        }
        matmul_forward(a->down, hidden, WT(PT_WDOWN, l), N, F, d);                        BF16_STORE(model, a->down, (size_t)N * d);
        residual_forward(a->out, a->resid_mid, a->down, (size_t)N * d);                   BF16_STORE(model, a->out, (size_t)N * d);
        x = a->out;
    }
    rmsnorm_forward(model->final_norm, model->final_ms, x, W(PT_FINAL_NORM, -1), N, d, eps);
    BF16_STORE(model, model->final_norm, (size_t)N * d);
    const float* lmT = c->tied ? WT(PT_WTE, -1) : WT(PT_LMHEAD, -1);                     /* [d, V] */
    matmul_forward(model->logits, model->final_norm, lmT, N, d, V);
    softcap_forward(model->logits, (size_t)N * V, (float)c->softcap);
    BF16_STORE(model, model->logits, (size_t)N * V);
    if (!targets) return 0.0f;
    crossentropy_forward(model->losses, model->logits, targets, N, V);
    double s = 0.0; int cnt = 0;
    for (int n = 0; n < N; n++) if (targets[n] >= 0) { s += model->losses[n]; cnt++; }
    return cnt ? (float)(s / cnt) : 0.0f;
}

/* --------------------------------------------------------------------------------- backward
 * Adds d(loss * dloss_scale)/d(params) into model->grads (gradient accumulation: zero them before
 * the first microbatch of a step). Needs the activations of the forward of the same microbatch. */
static void model_backward(Model* model, int B, int T, const int* targets, float dloss_scale) {
    const Config* c = &model->c;
    int N = B * T, d = c->d_model, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    int qd = H * hd, kd = KV * hd, F = c->ffn_dim, V = c->vocab_size;
    float eps = (float)c->norm_eps;
    const int* inputs = model->inputs;
    float* dres = model->dres;   /* gradient of the residual stream, [N,d] */
    float* dbuf = model->dbuf;

    /* loss -> logits (in place) -> lm_head -> final norm */
    float* dlogits = model->logits;
    crossentropy_softcap_backward(dlogits, model->logits, targets, N, V, dloss_scale, (float)c->softcap);
    BF16_STORE(model, dlogits, (size_t)N * V);
    if (c->tied) matmul_backward(dbuf, GR(PT_WTE, -1), dlogits, model->final_norm, W(PT_WTE, -1), N, d, V, 0);
    else matmul_backward(dbuf, GR(PT_LMHEAD, -1), dlogits, model->final_norm, W(PT_LMHEAD, -1), N, d, V, 0);
    BF16_STORE(model, dbuf, (size_t)N * d);
    float* x_last = c->n_layer ? model->la[c->n_layer - 1].out : NULL;
    rmsnorm_backward(dres, GR(PT_FINAL_NORM, -1), dbuf, x_last, W(PT_FINAL_NORM, -1), model->final_ms, N, d, eps, 0);
    BF16_STORE(model, dres, (size_t)N * d);

    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs* a = &model->la[l];
        float* x_in = l > 0 ? model->la[l - 1].out : (c->embed_norm ? model->x0 : model->emb);
        /* MLP block: dres is d(block_out) = d(resid_mid) (through the skip) = d(down) */
        if (c->mlp == MLP_SWIGLU) {
            matmul_backward(model->dF, GR(PT_WDOWN, l), dres, a->prod, W(PT_WDOWN, l), N, F, d, 0);  BF16_STORE(model, model->dF, (size_t)N * F);
            mul_backward(model->dF2, model->dF3, model->dF, a->act, a->up, (size_t)N * F);          /* d act, d up */
            BF16_STORE(model, model->dF2, (size_t)N * F); BF16_STORE(model, model->dF3, (size_t)N * F);
            silu_backward(model->dF, model->dF2, a->gate, (size_t)N * F);                             BF16_STORE(model, model->dF, (size_t)N * F);
            matmul_backward(dbuf, GR(PT_WGATE, l), model->dF, a->mlp_norm, W(PT_WGATE, l), N, d, F, 0);
            matmul_backward(dbuf, GR(PT_WUP, l), model->dF3, a->mlp_norm, W(PT_WUP, l), N, d, F, 1);
        } else {
            matmul_backward(model->dF, GR(PT_WDOWN, l), dres, a->act, W(PT_WDOWN, l), N, F, d, 0);   BF16_STORE(model, model->dF, (size_t)N * F);
            relu2_backward(model->dF2, model->dF, a->gate, (size_t)N * F);                            BF16_STORE(model, model->dF2, (size_t)N * F);
            matmul_backward(dbuf, GR(PT_WFC, l), model->dF2, a->mlp_norm, W(PT_WFC, l), N, d, F, 0);
        }
        BF16_STORE(model, dbuf, (size_t)N * d);
        rmsnorm_backward(dres, GR(PT_MLP_NORM, l), dbuf, a->resid_mid, W(PT_MLP_NORM, l), a->mlp_ms, N, d, eps, 1);
        BF16_STORE(model, dres, (size_t)N * d);
        /* attention block: dres is d(resid_mid) = d(x_in) (skip) = d(o) */
        matmul_backward(model->datt, GR(PT_WO, l), dres, a->att_out, W(PT_WO, l), N, qd, d, 0);      BF16_STORE(model, model->datt, (size_t)N * qd);
        const float* qc = c->qk_norm == QKNORM_PLAIN_POST_ROPE ? a->qf : a->qr;
        const float* kc = c->qk_norm == QKNORM_PLAIN_POST_ROPE ? a->kf : a->kr;
        attention_backward(model->dq, model->dk, model->dv, model->datt, a->probs, qc, kc, a->v, B, T, H, KV, hd);
        BF16_STORE(model, model->dq, (size_t)N * qd); BF16_STORE(model, model->dk, (size_t)N * kd); BF16_STORE(model, model->dv, (size_t)N * kd);
        float *dq = model->dq, *dk = model->dk, *dq2 = model->dq2, *dk2 = model->dk2, *t;
        if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
            rmsnorm_backward(dq2, NULL, dq, a->qr, NULL, a->qf_ms, N * H, hd, eps, 0);              BF16_STORE(model, dq2, (size_t)N * qd);
            rmsnorm_backward(dk2, NULL, dk, a->kr, NULL, a->kf_ms, N * KV, hd, eps, 0);             BF16_STORE(model, dk2, (size_t)N * kd);
            t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
        }
        rope_backward(dq2, dq, model->rope_cos, model->rope_sin, B, T, H, hd, c->rope_style);       BF16_STORE(model, dq2, (size_t)N * qd);
        rope_backward(dk2, dk, model->rope_cos, model->rope_sin, B, T, KV, hd, c->rope_style);      BF16_STORE(model, dk2, (size_t)N * kd);
        t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
        if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {
            rmsnorm_backward(dq2, GR(PT_QNORM, l), dq, a->q, W(PT_QNORM, l), a->qn_ms, N * H, hd, eps, 0);   BF16_STORE(model, dq2, (size_t)N * qd);
            rmsnorm_backward(dk2, GR(PT_KNORM, l), dk, a->k, W(PT_KNORM, l), a->kn_ms, N * KV, hd, eps, 0);  BF16_STORE(model, dk2, (size_t)N * kd);
            t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
        }
        matmul_backward(dbuf, GR(PT_WQ, l), dq, a->attn_norm, W(PT_WQ, l), N, d, qd, 0);
        matmul_backward(dbuf, GR(PT_WK, l), dk, a->attn_norm, W(PT_WK, l), N, d, kd, 1);
        matmul_backward(dbuf, GR(PT_WV, l), model->dv, a->attn_norm, W(PT_WV, l), N, d, kd, 1);
        BF16_STORE(model, dbuf, (size_t)N * d);
        rmsnorm_backward(dres, GR(PT_ATTN_NORM, l), dbuf, x_in, W(PT_ATTN_NORM, l), a->attn_ms, N, d, eps, 1);
        BF16_STORE(model, dres, (size_t)N * d);
    }
    if (c->embed_norm) {
        rmsnorm_backward(dbuf, GR(PT_EMBED_NORM, -1), dres, model->emb, W(PT_EMBED_NORM, -1), model->emb_ms, N, d, eps, 0);
        BF16_STORE(model, dbuf, (size_t)N * d);
        dres = dbuf;
    }
    embedding_backward(GR(PT_WTE, -1), dres, inputs, N, d);
}

/* --------------------------------------------------------------------------------- optimizer */
typedef struct { double lr, beta1, beta2, eps, weight_decay; } AdamW;

/* global L2 norm of the gradients (double, fixed order) */
static double grad_global_norm(const Model* model) { return sqrt(sumsq_det(model->grads, model->L.total)); }

/* torch.optim.AdamW semantics, step t (1-based): p *= 1 - lr*wd; m = lerp(m, g, 1-b1);
 * v = b2*v + (1-b2)*g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). Weight decay only on
 * matrices and embeddings. */
static void adamw_update(Model* model, const AdamW* o, long long t) {
    float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps;
    double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
    float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* ti = &model->L.t[i];
        float decay = ti->decay ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
        float *p = model->params + ti->offset, *g = model->grads + ti->offset, *m = model->m + ti->offset, *v = model->v + ti->offset;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < ti->numel; j++) {
            p[j] *= decay;
            m[j] += (1.0f - b1) * (g[j] - m[j]);
            v[j] = v[j] * b2 + (1.0f - b2) * g[j] * g[j];
            float denom = sqrtf(v[j]) / bc2_sqrt + eps;
            p[j] -= step_size * (m[j] / denom);
        }
    }
}

static void scale_grads(Model* model, float s) {
    size_t P = model->L.total;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < P; i++) model->grads[i] *= s;
}

/* clip to max_norm as torch.nn.utils.clip_grad_norm_ does (coef = max/(norm+1e-6), clamped to 1) */
static double clip_grads(Model* model, double max_norm) {
    double norm = grad_global_norm(model);
    if (max_norm > 0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) scale_grads(model, (float)coef);
    }
    return norm;
}

#ifndef TESTING
/* ------------------------------------------------------------------------------ training loop */
typedef struct {
    Args a;
    Config c;
    Dist dist;
    Model model;
    Shard train, val;
    int have_val;
    Tokenizer tok;
    int have_tok;
    TrainState ts;
    Rng sample_rng;
    Logger log;
    int threads;
} Run;

static void mkdir_p(const char* dir) {
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", dir);
    for (char* p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) tsdc_fail("-out %s: cannot create directory: %s", dir, strerror(errno));
}

/* evaluation on the fixed held-out set: the first n_seq*T+1 tokens of -val, B sequences a pass.
 * Returns the mean loss; writes the argmax predictions when pred_path is set. Rank 0 only. */
static double evaluate(Run* run, const char* pred_path) {
    Model* model = &run->model;
    int B = model->B, T = model->T, V = model->c.vocab_size;
    long long n_seq = run->a.eval_tokens / T;
    if (n_seq < 1) n_seq = 1;
    if ((uint64_t)n_seq * T + 1 > run->val.n) n_seq = (long long)((run->val.n - 1) / T);
    int* preds = pred_path ? (int*)mallocCheck(sizeof(int) * n_seq * T) : NULL;
    double sum = 0.0; long long cnt = 0;
    for (long long s0 = 0; s0 < n_seq; s0 += B) {
        int nb = (int)(n_seq - s0 < B ? n_seq - s0 : B);
        for (int j = 0; j < B; j++)
            for (int t = 0; t < T; t++) {
                uint64_t pos = (uint64_t)(s0 + j) * T + t;
                model->inputs[j * T + t] = j < nb ? (int)shard_token(&run->val, pos) : 0;
                model->targets[j * T + t] = j < nb ? (int)shard_token(&run->val, pos + 1) : -1;
            }
        model_forward(model, B, T, model->targets);
        for (int n = 0; n < nb * T; n++) { sum += model->losses[n]; cnt++; }
        if (preds)
            for (int n = 0; n < nb * T; n++) {
                const float* z = model->logits + (size_t)n * V;
                int best = 0;
                for (int i = 1; i < V; i++) if (z[i] > z[best]) best = i;
                preds[(s0 * T) + n] = best;
            }
    }
    if (preds) {
        /* a token shard (docs/formats.md), 4-byte ids, so tsdc_io.read_shard reads it */
        char tmp[1100];
        snprintf(tmp, sizeof(tmp), "%s.tmp", pred_path);
        FILE* fp = fopenCheck(tmp, "wb");
        uint8_t h[SHARD_HEADER_BYTES] = {0};
        memcpy(h, "TSDCTOK\0", 8);
        uint32_t ver = 1, width = 4, vocab = (uint32_t)V; uint64_t n = (uint64_t)n_seq * T;
        uint64_t chk = tsdc_checksum(preds, n * 4);
        memcpy(h + 8, &ver, 4); memcpy(h + 12, &width, 4); memcpy(h + 16, &vocab, 4); memcpy(h + 24, &n, 8); memcpy(h + 32, &chk, 8);
        fwrite_exact(h, sizeof(h), fp, tmp);
        fwrite_exact(preds, n * 4, fp, tmp);
        if (fclose(fp) != 0 || rename(tmp, pred_path) != 0) tsdc_fail("%s: cannot write predictions", pred_path);
        free(preds);
    }
    return sum / (double)cnt;
}

/* print a sample continuing from the first token of -val (or BOS): rank 0 only */
static void sample(Run* run) {
    Model* model = &run->model;
    int T = model->T, V = model->c.vocab_size, len = run->a.sample_len;
    int start = run->have_tok && run->tok.bos != 0xFFFFFFFFu ? (int)run->tok.bos
              : (run->have_val ? (int)shard_token(&run->val, 0) : 0);
    int* ctx = (int*)mallocCheck(sizeof(int) * (len + 1));
    ctx[0] = start;
    printf("sample: ");
    if (run->have_tok) tokenizer_print(&run->tok, start, stdout);
    for (int i = 1; i <= len; i++) {
        int lo = i > T ? i - T : 0, n = i - lo;
        memcpy(model->inputs, ctx + lo, sizeof(int) * n);
        model_forward(model, 1, n, NULL);
        const float* z = model->logits + (size_t)(n - 1) * V;
        int next = 0;
        if (run->a.temperature <= 0) { for (int k = 1; k < V; k++) if (z[k] > z[next]) next = k; }
        else {
            double mx = -INFINITY, s = 0.0;
            for (int k = 0; k < V; k++) if (z[k] > mx) mx = z[k];
            for (int k = 0; k < V; k++) s += exp((z[k] - mx) / run->a.temperature);
            double u = rng_uniform(&run->sample_rng) * s, acc = 0.0;
            next = V - 1;
            for (int k = 0; k < V; k++) { acc += exp((z[k] - mx) / run->a.temperature); if (acc > u) { next = k; break; } }
        }
        ctx[i] = next;
        if (run->have_tok) tokenizer_print(&run->tok, next, stdout); else printf(" %d", next);
    }
    printf("\n");
    fflush(stdout);
    free(ctx);
}

static void save_checkpoint(Run* run, const char* path) {
    Model* model = &run->model;
    memcpy(run->ts.rng, run->sample_rng.s, sizeof(run->ts.rng));
    uint64_t h = tsdc_checksum(model->params, model->L.total * sizeof(float));
    dist_check_same(&run->dist, h, "at checkpoint");
    if (run->dist.rank == 0) {
        checkpoint_write(path, &model->c, model->params, model->m, model->v, model->L.total, &run->ts);
        printf("checkpoint %s (step %lld, weights %016llx)\n", path, (long long)run->ts.step, (unsigned long long)h);
    }
    dist_barrier(&run->dist);
}

static void fmt_eta(double s, char* buf, size_t n) {
    if (s < 0 || s != s) s = 0;
    long long t = (long long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%lldh%02lldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
}

/* a resumed run must be the run that wrote the checkpoint: every setting that changes the math */
static void check_resume_matches(const CkptInfo* ck, const Run* run, const char* path) {
    const Args* a = &run->a;
#define SAME(cond, flag, fmt, x, y) if (!(cond)) tsdc_fail("%s: checkpoint was written with " flag " " fmt ", this run has " fmt \
                                                          " (pass the same flag to resume)", path, x, y)
    SAME(ck->ts.B == a->B, "-B", "%d", ck->ts.B, a->B);
    SAME(ck->ts.T == run->model.T, "-seq", "%d", ck->ts.T, run->model.T);
    SAME((long long)ck->ts.world * ck->ts.A == (long long)run->dist.world * a->accum, "ranks x -accum", "%lld",
         (long long)ck->ts.world * ck->ts.A, (long long)run->dist.world * a->accum);
    SAME(ck->ts.total_steps == a->steps, "-steps", "%d", ck->ts.total_steps, a->steps);
    SAME(ck->ts.warmup == a->warmup, "-warmup", "%d", ck->ts.warmup, a->warmup);
    SAME(ck->ts.precision == a->precision, "-precision", "%d", ck->ts.precision, a->precision);
    SAME(ck->ts.lr == a->lr, "-lr", "%g", ck->ts.lr, a->lr);
    SAME(ck->ts.final_frac == a->final_lr_frac, "-final_lr_frac", "%g", ck->ts.final_frac, a->final_lr_frac);
    SAME(ck->ts.beta1 == a->beta1, "-beta1", "%g", ck->ts.beta1, a->beta1);
    SAME(ck->ts.beta2 == a->beta2, "-beta2", "%g", ck->ts.beta2, a->beta2);
    SAME(ck->ts.adam_eps == a->adam_eps, "-adam_eps", "%g", ck->ts.adam_eps, a->adam_eps);
    SAME(ck->ts.weight_decay == a->weight_decay, "-wd", "%g", ck->ts.weight_decay, a->weight_decay);
    SAME(ck->ts.grad_clip == a->grad_clip, "-clip", "%g", ck->ts.grad_clip, a->grad_clip);
#undef SAME
}

int main(int argc, char** argv) {
    Run run_, *run = &run_;
    memset(run, 0, sizeof(*run));
    dist_init(&run->dist, &argc, &argv);
    int rank = run->dist.rank, world = run->dist.world;
    Args* a = &run->a;
    args_parse(a, argc, argv);
    args_config(a, &run->c);
    if (a->threads) {
#ifdef _OPENMP
        omp_set_num_threads(a->threads);
#endif
    }
#ifdef _OPENMP
    run->threads = omp_get_max_threads();
#else
    run->threads = 1;
#endif
    if (a->steps > 0 && !a->train[0]) usage_fail("%s", "-train FILE is required (or -steps 0)");
    int T = run->c.seq_len;
    if (rank == 0) {
        printf("train_sdc (CPU) | preset %s | %zu parameters | %s | %d rank%s%s | %d thread%s | B %d x T %d x accum %d\n",
               run->c.preset, config_num_params(&run->c), a->precision ? "bf16 (emulated AMP)" : "fp32", world,
               world == 1 ? "" : "s", dist_built_with_mpi() ? "" : " (built without MPI: single process)",
               run->threads, run->threads == 1 ? "" : "s", a->B, T, a->accum);
    }

    /* data */
    if (a->train[0]) {
        shard_load(&run->train, a->train, run->c.vocab_size);
        shard_require(&run->train, batch_span(world, a->accum, a->B, T) + 1, "step's batch (ranks x -accum x -B x -seq + 1)");
    }
    if (a->val[0]) {
        shard_load(&run->val, a->val, run->c.vocab_size);
        shard_require(&run->val, (uint64_t)T + 1, "sequence (-seq + 1)");
        run->have_val = 1;
    }
    char tokpath[1100] = {0};
    if (a->tokenizer[0]) snprintf(tokpath, sizeof(tokpath), "%s", a->tokenizer);
    else if (a->train[0]) {
        snprintf(tokpath, sizeof(tokpath), "%s", a->train);
        char* slash = strrchr(tokpath, '/');
        snprintf(slash ? slash + 1 : tokpath, sizeof(tokpath) - (slash ? (size_t)(slash + 1 - tokpath) : 0), "tokenizer.bin");
        FILE* probe = fopen(tokpath, "rb");
        if (probe) fclose(probe); else tokpath[0] = 0;
    }
    if (tokpath[0]) {
        tokenizer_load(&run->tok, tokpath);
        if (run->tok.vocab > (uint32_t)run->c.vocab_size)
            tsdc_fail("%s: decode table has %u tokens, more than the model vocab %d", tokpath, run->tok.vocab, run->c.vocab_size);
        run->have_tok = 1;
    }

    /* model */
    Model* model = &run->model;
    model_build(model, &run->c, a->B, T, a->precision);
    TrainState* ts = &run->ts;
    ts->world = world; ts->B = a->B; ts->A = a->accum; ts->T = T; ts->warmup = a->warmup; ts->total_steps = a->steps;
    ts->precision = a->precision; ts->lr = a->lr; ts->final_frac = a->final_lr_frac; ts->beta1 = a->beta1;
    ts->beta2 = a->beta2; ts->adam_eps = a->adam_eps; ts->weight_decay = a->weight_decay; ts->grad_clip = a->grad_clip;
    rng_seed(&run->sample_rng, a->seed ^ 0x5A3D1E5EULL);
    if (a->resume[0] || a->init[0]) {
        const char* path = a->resume[0] ? a->resume : a->init;
        CkptInfo ck;
        checkpoint_read(path, &ck, NULL, NULL, NULL, 0); /* header first: config before sizes */
        const char* diff = config_diff(&ck.cfg, &run->c);
        if (diff) tsdc_fail("%s: checkpoint config differs from the flags in '%s' (checkpoint preset %s)", path, diff, ck.cfg.preset);
        if (a->resume[0]) {
            if (!ck.has_opt) tsdc_fail("%s: has no optimizer state (a weights-only checkpoint): use -init, not -resume", path);
            check_resume_matches(&ck, run, path);
        }
        checkpoint_read(path, &ck, model->params, a->resume[0] ? model->m : NULL, a->resume[0] ? model->v : NULL, model->L.total);
        if (a->resume[0]) {
            ts->step = ck.ts.step; ts->data_pos = ck.ts.data_pos;
            memcpy(run->sample_rng.s, ck.ts.rng, sizeof(ck.ts.rng));
            if (run->train.n && ts->data_pos + batch_span(world, a->accum, a->B, T) + 1 > run->train.n)
                tsdc_fail("%s: data position %llu lies beyond -train %s (%llu tokens): not the shard it was trained on",
                          path, (unsigned long long)ts->data_pos, a->train, (unsigned long long)run->train.n);
        }
        if (rank == 0) printf("%s %s (step %lld)\n", a->resume[0] ? "resumed from" : "initialised from", path, (long long)ck.ts.step);
    } else {
        model_init_weights(model, a->seed);
    }
    model_prepare_weights(model);
    dist_check_same(&run->dist, tsdc_checksum(model->params, model->L.total * sizeof(float)), "at start");

    if (rank == 0) {
        mkdir_p(a->out);
        char logpath[1100];
        snprintf(logpath, sizeof(logpath), "%s/log.jsonl", a->out);
        logger_open(&run->log, logpath, a->resume[0] != 0);
        logger_line(&run->log, "{\"type\":\"run\",\"trainer\":\"cpu\",\"preset\":\"%s\",\"params\":%zu,\"n_layer\":%d,\"d_model\":%d,"
                    "\"vocab\":%d,\"seq\":%d,\"B\":%d,\"accum\":%d,\"world\":%d,\"threads\":%d,\"precision\":\"%s\",\"steps\":%d,"
                    "\"lr\":%.9g,\"warmup\":%d,\"seed\":%llu,\"start_step\":%lld}",
                    run->c.preset, model->L.total, run->c.n_layer, run->c.d_model, run->c.vocab_size, T, a->B, a->accum, world,
                    run->threads, a->precision ? "bf16" : "fp32", a->steps, a->lr, a->warmup, a->seed, (long long)ts->step);
    }

    AdamW opt = {a->lr, a->beta1, a->beta2, a->adam_eps, a->weight_decay};
    int last = a->stop_at && a->stop_at < a->steps ? a->stop_at : a->steps;
    uint64_t span = batch_span(world, a->accum, a->B, T);
    int N = a->B * T;
    float dloss = 1.0f / (float)((double)N * a->accum * world);
    double t_start = wall_seconds(), ms_sum = 0; int timed = 0;
    char path[1200];
    while (ts->step < last) {
        long long s = ts->step; /* update number, 0-based */
        double t0 = wall_seconds();
        memset(model->grads, 0, sizeof(float) * model->L.total);
        double loss_sum = 0.0;
        for (int mb = 0; mb < a->accum; mb++) {
            shard_microbatch(&run->train, ts->data_pos, rank * a->accum + mb, a->B, T, model->inputs, model->targets);
            loss_sum += model_forward(model, a->B, T, model->targets);
            model_backward(model, a->B, T, model->targets, dloss);
        }
        dist_allreduce_sum_f32(&run->dist, model->grads, model->L.total);
        dist_allreduce_sum_f64(&run->dist, &loss_sum, 1);
        float loss = (float)(loss_sum / ((double)a->accum * world));
        double norm = clip_grads(model, a->grad_clip);
        opt.lr = lr_at(s, a->lr, a->warmup, a->steps, a->final_lr_frac);
        adamw_update(model, &opt, s + 1);
        model_prepare_weights(model);
        ts->step = s + 1;
        ts->data_pos = shard_advance(&run->train, ts->data_pos, span);
        double dt = wall_seconds() - t0;
        if (s > 0 || ts->step == last) { ms_sum += dt; timed++; }
        double tok_s = span / dt;
        if (rank == 0) {
            logger_line(&run->log, "{\"type\":\"step\",\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"ms\":%.3f,"
                        "\"tok_s\":%.1f,\"k\":0,\"alarms\":0,\"injections\":0,\"replayed\":0}",
                        (long long)ts->step, loss, opt.lr, norm, dt * 1e3, tok_s);
            if (!a->quiet) {
                char eta[32];
                fmt_eta((last - ts->step) * (timed ? ms_sum / timed : dt), eta, sizeof(eta));
                printf("step %5lld/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | ETA %s\n",
                       (long long)ts->step, a->steps, loss, opt.lr, norm, dt * 1e3, tok_s, eta);
                fflush(stdout);
            }
        }
        if (!isfinite(loss) && rank == 0) fprintf(stderr, "warning: non-finite loss at step %lld\n", (long long)ts->step);
        int at_end = ts->step == last;
        if (run->have_val && rank == 0 && ((a->eval_every && ts->step % a->eval_every == 0) || at_end)) {
            const char* pred = at_end && a->pred_out[0] ? a->pred_out : NULL;
            double vl = evaluate(run, pred);
            logger_line(&run->log, "{\"type\":\"eval\",\"step\":%lld,\"val_loss\":%.9g,\"ppl\":%.9g}", (long long)ts->step, vl, exp(vl));
            printf("eval step %lld | val loss %.6f | ppl %.3f%s%s\n", (long long)ts->step, vl, exp(vl),
                   pred ? " | predictions " : "", pred ? pred : "");
        }
        if (rank == 0 && a->sample_every && (ts->step % a->sample_every == 0 || at_end)) sample(run);
        if ((a->ckpt_every && ts->step % a->ckpt_every == 0) || at_end) {
            snprintf(path, sizeof(path), "%s/step_%06lld.ckpt", a->out, (long long)ts->step);
            save_checkpoint(run, path);
        }
    }
    if (a->steps == 0 || ts->step >= last) {
        if (a->steps == 0 && run->have_val && rank == 0) {
            double vl = evaluate(run, a->pred_out[0] ? a->pred_out : NULL);
            logger_line(&run->log, "{\"type\":\"eval\",\"step\":%lld,\"val_loss\":%.9g,\"ppl\":%.9g}", (long long)ts->step, vl, exp(vl));
            printf("eval step %lld | val loss %.6f | ppl %.3f\n", (long long)ts->step, vl, exp(vl));
            if (a->sample_every) sample(run);
        }
    }
    uint64_t h = tsdc_checksum(model->params, model->L.total * sizeof(float));
    dist_check_same(&run->dist, h, "at the end");
    if (rank == 0) {
        printf("done: step %lld, %.1f s, final weights %016llx%s\n", (long long)ts->step, wall_seconds() - t_start,
               (unsigned long long)h, world > 1 ? " (identical on all ranks)" : "");
        logger_line(&run->log, "{\"type\":\"end\",\"step\":%lld,\"weights\":\"%016llx\"}", (long long)ts->step, (unsigned long long)h);
        logger_close(&run->log);
    }
    model_free(model);
    if (run->train.raw) shard_free(&run->train);
    if (run->have_val) shard_free(&run->val);
    if (run->have_tok) tokenizer_free(&run->tok);
    dist_finalize(&run->dist);
    return 0;
}
#endif /* TESTING */
