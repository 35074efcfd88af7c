/* train_sdc.c: the CPU reference trainer.
 *
 * Trains any member of the model family (llmc/host/config.h) with AdamW, gradient accumulation, MPI data
 * parallelism, exact checkpoint resume and a JSONL log, in fp32 (the exact reference) or in emulated
 * bf16 AMP. It is also the reference the CUDA trainer is tested against: the forward and backward
 * below are written to be read top to bottom, one line an op, with the shapes in comments; the math
 * of each op is in llmc/cpu_kernels.h.
 *
 * Emulated AMP (-precision bf16): the GPU keeps fp32 master weights and AdamW state, computes with
 * bf16 copies of the weights, and stores every activation and activation gradient in bf16 with fp32
 * accumulation inside each op. Here: weights are rounded to bf16 once after each update (model->wr),
 * the GEMMs take bf16 inputs (llmc/cpu/gemm.h: the CPU's bf16 units where it has them), and every module output and
 * activation gradient is rounded to bf16 (round-to-nearest-even) by the op that writes it, as it writes it (the _r
 * forms' round = precision; no rounding pass of its own). Weight gradients, mean squares, losses and the
 * optimizer stay fp32. Stored as bf16 bits (half the bytes, as the GPU stores them): the logits (then dlogits, in
 * place; logits_h), and the forward tensors of the sites in BF16_SITES (every site; Model.h16, ACT_T; the
 * materialised attention's logits and probabilities, in Model.att_mem, where Model.att16): the op that writes one
 * stores it so, the ops that read it widen it exactly (the GEMMs as they pack A or B, the element-wise kernels, RoPE
 * and the norms a block or a row at a time, the attention a head of q, k or v, or a block of rows of a [T, T] head, at
 * a time, the fingerprints and checks as they read), so every result has the bits of
 * the fp32 arrays holding the same values. A site that the faults flip in fp32 (-fault_dtype fp32, autocast's fp32
 * sites) keeps its float array (model_fault_storage), and TSDC_CPU_STORAGE=fp32 keeps them all so. The embedding's
 * output (and nanochat's norm of it) and the final norm's output are stored so too (Model.emb16), the gradients of v,
 * att_out and the MLP's hidden tensors as those tensors are (dv, datt, dF, dF2, dF3), and the residual stream's gradient
 * (dres) as the residual stream is, the norms' output gradients as the norms' outputs are (dbuf16: a dx summed over
 * two or three products, which the GPU makes one product over the adjacent weights, adds them in the fp32 dbuf, the
 * GEMM's partial sums, and the last product stores the sum's bits), and the Q/K path's (dq, dk: the attention's
 * backward sums each row in fp32 and stores its bits) as the path's tensors are, and the materialised attention's
 * dprobs and dlogits (dlog_h) as its logits and probabilities are. Float scratch: the recomputations' (qk, qk_bwd: into
 * the spare dq / dk buffers, compared with the stored bits), a GEMM's partial sums.
 *
 * Determinism: see llmc/cpu/cpu_kernels.h; every reduction has a fixed order that does not depend on the
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

#include "llmc/host/utils.h"
#include "llmc/host/args.h"
#include "llmc/sdc/attcheck.h"
#include "llmc/cpu/bf16.h"
#include "llmc/host/checkpoint.h"
#include "llmc/sdc/checks.h"
#include "llmc/host/checksum.h"
#include "llmc/host/config.h"
#include "llmc/cpu/cpu_kernels.h"
#include "llmc/host/dataloader.h"
#include "llmc/host/dist.h"
#include "llmc/sdc/fault.h"
#include "llmc/sdc/fingerprint.h"
#include "llmc/cpu/init.h"
#include "llmc/sdc/rgg.h"
#include "llmc/sdc/bound.h"
#include "llmc/host/logger.h"
#include "llmc/host/rng.h"
#include "llmc/cpu/rope.h"
#include "llmc/host/schedule.h"
#include "llmc/host/tokenizer.h"
#include "llmc/host/stats.h"

/* ------------------------------------------------------------------------------------- model */
typedef struct {
    float *attn_norm, *attn_ms;          /* [N,d], [N]                      attn_norm */
    float *q, *k, *v;                    /* [N,H*hd], [N,KV*hd] x2          q_proj k_proj v_proj */
    float *qn, *kn, *qn_ms, *kn_ms;      /* weighted QK norm before RoPE    q_norm k_norm (Qwen3; NULL otherwise) */
    float *qr, *kr;                      /* after RoPE                      q_rope k_rope */
    float *qf, *kf, *qf_ms, *kf_ms;      /* plain QK norm after RoPE        q_norm k_norm (nanochat; NULL otherwise) */
    float *logits, *probs;               /* [B,H,T,T]                       att_logits att_probs (materialised path only:
                                            in Model.att_mem, NULL until something needs them) */
    uint16_t *logits_h, *probs_h;        /* the same as bf16 bits where Model.att16 (then logits, probs NULL) */
    int fused;                           /* the last forward took the fused attention here (the backward follows it) */
    float *att_out;                      /* [N,H*hd]                        att_out */
    float *o;                            /* [N,d]                           o_proj */
    float *resid_mid;                    /* [N,d] x + o                     attn_residual */
    float *mlp_norm, *mlp_ms;            /* [N,d], [N]                      mlp_norm */
    float *gate, *up;                    /* [N,F] (gate = fc for ReLU^2)    gate_proj up_proj */
    float *act, *prod;                   /* [N,F]                           act mlp_product */
    /* the same tensors as bf16 bits where Model.h16 says their site is so stored (the float pointer NULL then; ACT_T
     * gives either) */
    uint16_t *attn_norm_h, *q_h, *k_h, *v_h, *qn_h, *kn_h, *qr_h, *kr_h, *qf_h, *kf_h, *att_out_h, *o_h, *resid_mid_h, *mlp_norm_h;
    uint16_t *gate_h, *up_h, *act_h, *prod_h, *down_h, *out_h;
    float *down;                         /* [N,d]                           down_proj */
    float *out;                          /* [N,d] resid_mid + down          block_out */
} LayerActs;

typedef struct {
    Config c;
    ParamLayout L;
    int* tidx;                 /* [n_layer+1][PT_COUNT] tensor index, -1 absent; row n_layer = globals */
    int B, T;                  /* allocated microbatch shape */
    int precision;
    int ce_fused_next, ce_dlogits_ready;   /* the one-pass classifier (model_classifier_fused_next) */
    float ce_dloss;
    float *params, *grads, *m, *v;   /* fp32 master weights, gradients, AdamW moments */
    float *wr;                 /* weights used by the math: bf16-rounded copy in bf16 mode, else params */
    float *rope_cos, *rope_sin;
    /* activations */
    float *emb, *emb_ms, *x0;  /* embedding output, embed-norm mean square, layer-0 input (x0: the embedding norm's output,
                                  NULL without one); emb and x0 NULL where emb16: */
    uint16_t *emb_h, *x0_h;    /* the same as bf16 bits (-precision bf16, not TSDC_CPU_STORAGE=fp32; no fault site flips them) */
    int emb16;                 /* emb_h, x0_h and final_norm_h in use */
    LayerActs* la;
    float *final_norm, *final_ms, *logits, *lse, *losses;
    uint16_t* final_norm_h;    /* the final norm's output (the classifier's input) as bf16 bits where emb16; final_norm NULL */
    uint16_t* logits_h;        /* -precision bf16: the logits (then dlogits) [N, V] stored as bf16 bits, as the GPU stores
                                * them; logits is then NULL (the fp32 array holds them under -precision fp32) */
    int *inputs, *targets;
    /* backward scratch */
    float *dres, *dbuf, *dq, *dq2, *dk, *dk2, *dv, *datt;   /* dv, datt: bf16 bits where v's and att_out's sites are;
                                                                dres (the residual stream's gradient) where dres16 */
    int dres16;                /* dres as bf16 bits: where the residual stream's two sites are (h16) */
    int dqk16;                 /* dq, dk (the Q/K path's gradients, from attention's back to the projections') as bf16 bits:
                                * where every site on the path is (h16: q_rope, k_rope, q_proj, k_proj, the QK norms) */
    uint16_t* dbuf16;          /* the norms' output gradients (the classifier's, the attention's and the MLP's dx) as bf16
                                * bits, where the two sites are (h16[SITE_ATTN_NORM], h16[SITE_MLP_NORM]), else NULL: a dx
                                * summed over products (q, k, v; gate, up) adds them in fp32 in dbuf, the GEMM's partial
                                * sums, and the last product stores the whole sum's bits here, as the GPU's one GEMM over
                                * the adjacent weights rounds its fp32 sum once */
    float *dF, *dF2, *dF3;     /* the MLP's hidden gradients [N,F], stored as its tensors are: bf16 bits where model_mlp_h16 */
    float* dlog;               /* [B,H,T,T]: dprobs, then dlogits, of the layer being differentiated (materialised path;
                                  in att_mem) */
    uint16_t* dlog_h;          /* the same as bf16 bits where att16 (then dlog NULL) */
    int att16;                 /* the materialised attention's logits, probs and their gradients as bf16 bits: where both
                                * sites are (h16[SITE_ATT_LOGITS], h16[SITE_ATT_PROBS]) */
    int att_mem16;             /* the layout att_mem was allocated with (model_att_buffers reallocates on a change) */
    float* qk_ms;              /* [N*H]: the Q/K recomputation's QK-norm mean squares */
    float *att_mem, *trace_att_mem;   /* the materialised attention's tensors (model_att_buffers), the trace's copy */
    size_t att_floats;
    int att_mode;              /* ATT_AUTO, ATT_MATERIALISED or ATT_FUSED (TSDC_CPU_ATTENTION, model_set_attention_mode) */
    int last_B, last_T;        /* the shape of the last forward (the trace materialises with it) */
    Protect prot;              /* protection and fault injection state (llmc/sdc/checks.h, llmc/host/backend.h) */
    float* ew_scratch;         /* ew's scratch: [N, d] + [N] (allocated on first use) */
    float *mmb_wn, *mmb_xn;    /* bound's weight row norms [n_layer][kd + 2d + 2F] and input row norms [2][N] (first use) */
    int mmb_wn_valid;          /* mmb_wn is of the current weights (cleared by model_prepare_weights) */
    float* upd;                /* scratch for model_update_norm (allocated on first use) */
    float* act_mem;
    size_t act_floats;
    unsigned char h16[SITE_COUNT];   /* a site's forward tensor stored as bf16 bits (model_carve: BF16_SITES under -precision
                                        bf16, less any that a fault flips in fp32, model_fault_storage) */
    float* trace_mem;          /* snapshot of act_mem for the propagation trace (allocated on first use) */
} Model;

#include "llmc/host/backend.h"   /* the functions the host loop calls, declared for this Model; the protection accessors */

/* fault injection points: a module output (forward) or the gradient of that output (backward) */
#define FAULT_AT(pass, site, l, x, n) do { if (fault_due(model->prot.fx, (site), (l), (pass))) fault_apply_host(model->prot.fx, (x), (size_t)(n)); } while (0)
#define FAULT_FWD(site, l, x, n) FAULT_AT(PASS_FWD, site, l, x, n)
#define FAULT_BWD(site, l, x, n) FAULT_AT(PASS_BWD, site, l, x, n)
/* a module output (forward), or the gradient of one (backward), once its op has stored it (in bf16 mode rounded to
 * bf16 as it wrote it: a GEMM with round_out = precision, an element-wise kernel's _r form with round = precision;
 * no op leaves a rounding pass behind): the fault injector's hook for its site and layer. The passes read as math:
 * an op, then STORE_RND of what it wrote. */
#define STORE_RND(site, l, x, n) FAULT_FWD((site), (l), (x), (size_t)(n))
/* the same for a tensor stored as h says (ACT_T) */
#define STORE_RND_X(site, l, x, h, n) do { if (fault_due(model->prot.fx, (site), (l), PASS_FWD)) fault_apply_host_x(model->prot.fx, (x), (h), (size_t)(n)); } while (0)
#define STORE_GRAD_RND(site, l, x, n) FAULT_BWD((site), (l), (x), (size_t)(n))
/* the same for a gradient stored as h says */
#define FAULT_BWD_X(site, l, x, h, n) do { if (fault_due(model->prot.fx, (site), (l), PASS_BWD)) fault_apply_host_x(model->prot.fx, (x), (h), (size_t)(n)); } while (0)
#define STORE_GRAD_RND_X(site, l, x, h, n) FAULT_BWD_X((site), (l), (x), (h), (n))
/* field f of the layer activations a, the forward tensor of site, as stored: its float array, or its bf16 bits where
 * model->h16[site] */
#define ACT_T(a, f, site) (model->h16[site] ? (void*)(a)->f##_h : (void*)(a)->f)
/* field f (logits, probs; dlog of the model) of the materialised attention's [B,H,T,T] tensors, as stored: the float
 * array, or its bf16 bits where model->att16 */
#define ATT_TT(a, f) (model->att16 ? (void*)(a)->f##_h : (void*)(a)->f)
/* the Q (is_k 0) or K (1) that attention consumes at layer a, as stored (*h): after RoPE, or nanochat's norm after it */
static const void* att_qk(const Model* model, const LayerActs* a, int is_k, int* h) {
    if (model->c.qk_norm == QKNORM_PLAIN_POST_ROPE) {
        *h = model->h16[is_k ? SITE_K_NORM : SITE_Q_NORM];
        return is_k ? ACT_T(a, kf, SITE_K_NORM) : ACT_T(a, qf, SITE_Q_NORM);
    }
    *h = model->h16[is_k ? SITE_K_ROPE : SITE_Q_ROPE];
    return is_k ? ACT_T(a, kr, SITE_K_ROPE) : ACT_T(a, qr, SITE_Q_ROPE);
}
/* the MLP's hidden tensors (gate, up, act, product) are stored alike: their kernels take one storage flag */
static int model_mlp_h16(const Model* model) {
    const unsigned char* h = model->h16;
    if (h[SITE_UP_PROJ] != h[SITE_GATE_PROJ] || h[SITE_ACT] != h[SITE_GATE_PROJ] || h[SITE_MLP_PRODUCT] != h[SITE_GATE_PROJ])
        tsdc_fail("internal: the MLP's hidden tensors stored unlike");
    return h[SITE_GATE_PROJ];
}
/* the gradient of a module output that shares its tensor with the residual path (o_proj, down_proj):
 * a fault there must hit only the module's own backward, so it goes into a copy. g stored as gh says; *h: how the
 * result is (the copy is a float array, g widened into it exactly: the same values and flips as from a float array
 * holding g's values) */
static const void* fault_private_grad(Model* model, int site, int l, const void* g, int gh, float* scratch, size_t n, int* h) {
    *h = gh;
    if (!fault_due(model->prot.fx, site, l, PASS_BWD)) return g;
    if (gh) bf16_unpack_array(scratch, (const uint16_t*)g, (long long)n);
    else memcpy(scratch, g, n * sizeof(float));
    fault_apply_host(model->prot.fx, scratch, n);
    *h = 0;
    return scratch;
}

static int tensor_index(const Model* m, int type, int layer) {
    return m->tidx[(layer < 0 ? m->c.n_layer : layer) * PT_COUNT + type];
}
/* pointer into a parameter-sized buffer; NULL when the preset has no such tensor */
static float* tensor_ptr(const Model* m, float* base, int type, int layer) {
    int i = tensor_index(m, type, layer);
    return i < 0 ? NULL : base + m->L.t[i].offset;
}
#define W(type, l) tensor_ptr(model, model->wr, type, l)
#define GR(type, l) tensor_ptr(model, model->grads, type, l)

/* Which attention a forward takes where both may: the fused one from T 512 up, the materialised one below (measured
 * on a 2-core Xeon, 1 thread, the SmolLM2 width, one layer's forward + backward: T 1024 fused 61 ms against 72;
 * T 256 and 320 within 5% of each other; T 192 9.7 against 8.6; tiny-llama's T 128 2.6 against 2.4: the fused
 * backward's second logits product costs about what the T^2 tensors' traffic costs until they outgrow the caches;
 * from T 512 the tensors, 2 L + 1 of [B, H, T, T] floats, also grow to GBs: SmolLM2-135M at B 1 x T 1024 peaks at
 * 3.3 GB fused, 5.6 GB materialised). Both give the same bits, so this is a speed and memory choice only;
 * TSDC_CPU_ATTENTION=fused|materialised|auto sets it (the benchmarks and tests compare the two). */
enum { ATT_AUTO, ATT_MATERIALISED, ATT_FUSED };
static int att_mode_from_env(void) {
    const char* e = getenv("TSDC_CPU_ATTENTION");
    if (!e || !*e || !strcmp(e, "auto")) return ATT_AUTO;
    if (!strcmp(e, "fused")) return ATT_FUSED;
    if (!strcmp(e, "materialised") || !strcmp(e, "materialized")) return ATT_MATERIALISED;
    tsdc_fail("TSDC_CPU_ATTENTION=%s: not fused, materialised or auto", e);
    return ATT_AUTO;
}
#define ATT_FUSED_FROM_T 512
/* TSDC_CPU_STORAGE=fp32 keeps every -precision bf16 activation but the logits in a float array (the same values and
 * bits, twice the bytes; the tests and benchmarks compare the two); bf16 or unset: the sites of BF16_SITES as bf16
 * bits (Model.h16) */
static int storage_fp32_from_env(void) {
    const char* e = getenv("TSDC_CPU_STORAGE");
    if (!e || !*e || !strcmp(e, "bf16")) return 0;
    if (!strcmp(e, "fp32")) return 1;
    tsdc_fail("TSDC_CPU_STORAGE=%s: not bf16 or fp32", e);
    return 0;
}
static void model_carve(Model* model);
/* the sites whose forward tensor -precision bf16 stores as bf16 bits: all (the materialised attention's logits and
 * probabilities, [B, H, T, T], in their own allocation: model_att_buffers). The activation gradients are stored as
 * their tensors (the Q/K path's and the norms' outputs' where every site they pass is, Model.dqk16, dbuf16). */
static const int BF16_SITES[] = {SITE_ATTN_NORM, SITE_Q_PROJ, SITE_K_PROJ, SITE_V_PROJ, SITE_Q_NORM, SITE_K_NORM, SITE_Q_ROPE, SITE_K_ROPE,
                                 SITE_ATT_LOGITS, SITE_ATT_PROBS, SITE_ATT_OUT, SITE_O_PROJ, SITE_ATTN_RESIDUAL, SITE_MLP_NORM,
                                 SITE_GATE_PROJ, SITE_UP_PROJ, SITE_ACT, SITE_MLP_PRODUCT, SITE_DOWN_PROJ, SITE_BLOCK_OUT};
#define N_BF16_SITES ((int)(sizeof(BF16_SITES) / sizeof(BF16_SITES[0])))
static void model_build(Model* model, const Config* c, int B, int T, int precision) {
    memset(model, 0, sizeof(*model));
    model->c = *c;
    model->B = B; model->T = T; model->precision = precision;
    model->att_mode = att_mode_from_env();
    param_layout_build(c, &model->L);
    model->tidx = param_tensor_index(c, &model->L);
    size_t P = model->L.total;
    model->params = (float*)callocCheck(P, sizeof(float));
    model->grads = (float*)callocCheck(P, sizeof(float));
    model->m = (float*)callocCheck(P, sizeof(float));
    model->v = (float*)callocCheck(P, sizeof(float));
    model->wr = precision ? (float*)callocCheck(P, sizeof(float)) : model->params;
    int half = c->head_dim / 2;
    model->rope_cos = (float*)mallocCheck(sizeof(float) * T * half);
    model->rope_sin = (float*)mallocCheck(sizeof(float) * T * half);
    rope_tables(c, T, model->rope_cos, model->rope_sin);

    model->la = (LayerActs*)callocCheck(c->n_layer, sizeof(LayerActs));
    if (precision && !storage_fp32_from_env()) {
        for (int i = 0; i < N_BF16_SITES; i++) model->h16[BF16_SITES[i]] = 1;
        model->emb16 = 1;
    }
    model_carve(model);
    model->inputs = (int*)callocCheck((size_t)B * T, sizeof(int));
    model->targets = (int*)callocCheck((size_t)B * T, sizeof(int));
}

/* the activations: one allocation carved into tensors, those of the sites in model->h16 as bf16 bits (two a float).
 * Called again (the arena remade, nothing in it kept) when a fault must flip one of them in fp32. */
static void model_carve(Model* model) {
    const Config* c = &model->c;
    const int precision = model->precision;
    const unsigned char* h = model->h16;
    free(model->act_mem); free(model->trace_mem);
    model->trace_mem = NULL;
    size_t N = (size_t)model->B * model->T, d = c->d_model, qd = (size_t)c->n_head * c->head_dim, kd = (size_t)c->n_kv_head * c->head_dim;
    size_t F = c->ffn_dim, V = c->vocab_size, H = c->n_head, KV = c->n_kv_head;
#define NFL(site, n) (h[site] ? ((n) + 1) / 2 : (n))   /* a tensor's floats */
    /* the QK norm's output and mean squares: only for the family's form (Qwen3's before RoPE, nanochat's after) */
    const int qkn_pre = c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE, qkn_post = c->qk_norm == QKNORM_PLAIN_POST_ROPE;
    size_t per_layer = NFL(SITE_ATTN_RESIDUAL, N * d) + NFL(SITE_BLOCK_OUT, N * d) + NFL(SITE_ATTN_NORM, N * d) + NFL(SITE_O_PROJ, N * d) + NFL(SITE_MLP_NORM, N * d) +
                       NFL(SITE_DOWN_PROJ, N * d) + N * 2 + NFL(SITE_Q_PROJ, N * qd) + NFL(SITE_Q_ROPE, N * qd) + NFL(SITE_ATT_OUT, N * qd) +
                       NFL(SITE_K_PROJ, N * kd) + NFL(SITE_K_ROPE, N * kd) + NFL(SITE_V_PROJ, N * kd) +
                       (size_t)(qkn_pre + qkn_post) * (NFL(SITE_Q_NORM, N * qd) + NFL(SITE_K_NORM, N * kd) + N * (H + KV)) +
                       NFL(SITE_GATE_PROJ, N * F) + NFL(SITE_UP_PROJ, N * F) + NFL(SITE_ACT, N * F) + NFL(SITE_MLP_PRODUCT, N * F);
    const size_t nF = NFL(SITE_GATE_PROJ, N * F);   /* floats of an MLP gradient (stored as its tensors: model_mlp_h16) */
    /* the residual stream's gradient: bf16 bits where both its sites' tensors are (a fault flipping either in fp32 makes
     * it a float array, as it makes them) */
    model->dres16 = h[SITE_ATTN_RESIDUAL] && h[SITE_BLOCK_OUT];
    const size_t NRES = model->dres16 ? (N * d + 1) / 2 : N * d;
    const int db16 = h[SITE_ATTN_NORM] && h[SITE_MLP_NORM];
    model->att16 = h[SITE_ATT_LOGITS] && h[SITE_ATT_PROBS];
    model->dqk16 = h[SITE_Q_ROPE] && h[SITE_K_ROPE] && h[SITE_Q_PROJ] && h[SITE_K_PROJ] &&
                   (c->qk_norm == QKNORM_NONE || (h[SITE_Q_NORM] && h[SITE_K_NORM]));
#undef NFL
    size_t nlog = precision ? (N * V + 1) / 2 : N * V;   /* the logits: bf16 bits in bf16 mode (two a float) */
    const size_t nemb = (model->emb16 ? (N * d + 1) / 2 : N * d) * (c->embed_norm ? 3 : 2);   /* emb, x0, the final norm's output */
    size_t total = nemb + N + (size_t)c->n_layer * per_layer + N + nlog + N * 2 /* forward */
                 + NRES + N * d + (db16 ? (N * d + 1) / 2 : 0) + N * qd * 3 + N * kd * 3 + nF * 3 + N * H;   /* backward */
    model->act_mem = (float*)callocCheck(total, sizeof(float));
    model->act_floats = total;
    float* p = model->act_mem;
#define CARVE(ptr, n) do { (ptr) = p; p += (n); } while (0)
#define CARVE16(ptr, n) do { (ptr) = (uint16_t*)p; p += ((n) + 1) / 2; } while (0)
/* field f of a layer's activations, site's tensor of n elements: its float array or its bf16 bits */
#define CARVE_S(f, site, n) do { a->f = NULL; a->f##_h = NULL; if (h[site]) CARVE16(a->f##_h, n); else CARVE(a->f, n); } while (0)
    model->emb = model->x0 = NULL; model->emb_h = model->x0_h = NULL;
    if (model->emb16) { CARVE16(model->emb_h, N * d); if (c->embed_norm) CARVE16(model->x0_h, N * d); }
    else { CARVE(model->emb, N * d); if (c->embed_norm) CARVE(model->x0, N * d); }
    CARVE(model->emb_ms, N);
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs* a = &model->la[l];
        CARVE_S(attn_norm, SITE_ATTN_NORM, N * d); CARVE(a->attn_ms, N);
        CARVE_S(q, SITE_Q_PROJ, N * qd); CARVE_S(k, SITE_K_PROJ, N * kd); CARVE_S(v, SITE_V_PROJ, N * kd);
        a->qn = a->kn = a->qn_ms = a->kn_ms = a->qf = a->kf = a->qf_ms = a->kf_ms = NULL;
        a->qn_h = a->kn_h = a->qf_h = a->kf_h = NULL;
        if (qkn_pre) { CARVE_S(qn, SITE_Q_NORM, N * qd); CARVE_S(kn, SITE_K_NORM, N * kd); CARVE(a->qn_ms, N * H); CARVE(a->kn_ms, N * KV); }
        CARVE_S(qr, SITE_Q_ROPE, N * qd); CARVE_S(kr, SITE_K_ROPE, N * kd);
        if (qkn_post) { CARVE_S(qf, SITE_Q_NORM, N * qd); CARVE_S(kf, SITE_K_NORM, N * kd); CARVE(a->qf_ms, N * H); CARVE(a->kf_ms, N * KV); }
        CARVE_S(att_out, SITE_ATT_OUT, N * qd); CARVE_S(o, SITE_O_PROJ, N * d); CARVE_S(resid_mid, SITE_ATTN_RESIDUAL, N * d);
        CARVE_S(mlp_norm, SITE_MLP_NORM, N * d); CARVE(a->mlp_ms, N);
        CARVE_S(gate, SITE_GATE_PROJ, N * F); CARVE_S(up, SITE_UP_PROJ, N * F); CARVE_S(act, SITE_ACT, N * F);
        CARVE_S(prod, SITE_MLP_PRODUCT, N * F);
        CARVE_S(down, SITE_DOWN_PROJ, N * d); CARVE_S(out, SITE_BLOCK_OUT, N * d);
    }
    model->final_norm = NULL; model->final_norm_h = NULL;
    if (model->emb16) CARVE16(model->final_norm_h, N * d);
    else CARVE(model->final_norm, N * d);
    CARVE(model->final_ms, N);
    if (precision) { model->logits_h = (uint16_t*)p; p += nlog; }
    else CARVE(model->logits, N * V);
    CARVE(model->lse, N); CARVE(model->losses, N);
    CARVE(model->dres, NRES); CARVE(model->dbuf, N * d);
    model->dbuf16 = NULL;
    if (db16) CARVE16(model->dbuf16, N * d);
    CARVE(model->dq, N * qd); CARVE(model->dq2, N * qd); CARVE(model->datt, N * qd);
    CARVE(model->dk, N * kd); CARVE(model->dk2, N * kd); CARVE(model->dv, N * kd);
    CARVE(model->dF, nF); CARVE(model->dF2, nF); CARVE(model->dF3, nF); CARVE(model->qk_ms, N * H);
#undef CARVE
#undef CARVE16
#undef CARVE_S
    if ((size_t)(p - model->act_mem) > total) tsdc_fail("internal: activation carve overflow");
}
/* the trainer's side of model_set_fault (llmc/host/backend.h): a site that the faults flip in fp32 (-fault_dtype fp32,
 * or autocast's fp32 sites) keeps its float array (a flipped fp32 value is no bf16 value) */
static void model_fault_storage(Model* model, const FaultCtx* fx) {
    if (!fx) return;
    int change = 0;
    for (int s = 0; s < SITE_COUNT; s++)
        if (model->h16[s] && fx->site_width[s] == 32) { model->h16[s] = 0; change = 1; }
    if (change) model_carve(model);
}

static void model_free(Model* model) {
    if (model->wr != model->params) free(model->wr);
    free(model->params); free(model->grads); free(model->m); free(model->v);
    free(model->rope_cos); free(model->rope_sin); free(model->act_mem); free(model->la);
    free(model->inputs); free(model->targets); free(model->tidx); free(model->trace_mem); free(model->prot.exp_hist); free(model->upd);
    free(model->ew_scratch); free(model->mmb_wn); free(model->mmb_xn); free(model->att_mem); free(model->trace_att_mem);
}

/* The materialised attention's logits and probs, [B,H,T,T] for every layer, and the backward's dlog (the model's B
 * and T): (2 L + 1) B H T^2 elements in one allocation outside the activations, floats or (att16) bf16 bits, made the
 * first time a forward takes the materialised path somewhere (attention_fused) or the trace needs them. A run that
 * never needs them never allocates them: at T 1024 they would be the bulk of the memory. */
static void model_att_buffers(Model* model, const char* why) {
    if (model->att_mem && model->att_mem16 == model->att16) return;
    free(model->att_mem); free(model->trace_att_mem);
    model->att_mem = model->trace_att_mem = NULL;
    const Config* c = &model->c;
    const int h = model->att16;
    size_t att = (size_t)model->B * c->n_head * model->T * model->T, n = att * (2 * (size_t)c->n_layer + 1);
    size_t nf = h ? (n + 1) / 2 : n;   /* floats */
    model->att_mem = (float*)calloc(nf, sizeof(float));
    if (!model->att_mem)
        tsdc_fail("cannot allocate %.2f GiB for the materialised attention's logits and probs (2 x [B %d, H %d, T %d, T] %s a "
                  "layer, %d layers, and one for the backward), which %s needs; lower -B or -seq", nf * 4.0 / 1073741824.0, model->B,
                  c->n_head, model->T, h ? "bf16" : "floats", c->n_layer, why);
    model->att_floats = nf;
    model->att_mem16 = h;
    uint16_t* m16 = (uint16_t*)model->att_mem;
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs* a = &model->la[l];
        a->logits = h ? NULL : model->att_mem + 2 * att * l;
        a->probs = h ? NULL : model->att_mem + 2 * att * l + att;
        a->logits_h = h ? m16 + 2 * att * l : NULL;
        a->probs_h = h ? m16 + 2 * att * l + att : NULL;
    }
    model->dlog = h ? NULL : model->att_mem + 2 * att * c->n_layer;
    model->dlog_h = h ? m16 + 2 * att * c->n_layer : NULL;
}
/* the fused attention (llmc/cpu/cpu_kernels.h: the same bits, no [B,H,T,T] tensor) at layer l, unless something
 * reads the materialised tensors there: -protect att (the logits' and probs' row checks) or att_bwd (dprobs and
 * dlogits), qk_bwd (its rerun starts from the stored dlogits), -detect abft, an att_logits / att_probs fault due at
 * this layer in this microbatch (either pass: the backward injects into the stored dprobs / dlogits),
 * the materialised mode (TSDC_CPU_ATTENTION, model_set_attention_mode; or T below 512 in the auto mode), or a
 * head_dim the fused kernels lack. The forward records the choice in the layer; the backward follows it. Either
 * path gives the same bits, so a layer may switch for a fault event and the run stays the clean run's elsewhere. */
static int attention_fused(const Model* model, int l) {
    const FaultCtx* fx = model->prot.fx;
    const int* on = model->prot.on;
    if (model->att_mode == ATT_MATERIALISED || model->prot.abft || on[PK_ATT] || on[PK_ATT_BWD] || on[PK_QK_BWD] ||
        !attention_fused_supported(model->c.head_dim))
        return 0;
    if (model->att_mode == ATT_AUTO && model->T < ATT_FUSED_FROM_T) return 0;
    return !(fault_due(fx, SITE_ATT_LOGITS, l, PASS_FWD) || fault_due(fx, SITE_ATT_PROBS, l, PASS_FWD) ||
             fault_due(fx, SITE_ATT_LOGITS, l, PASS_BWD) || fault_due(fx, SITE_ATT_PROBS, l, PASS_BWD));
}
/* what makes a forward take the materialised path (model_att_buffers' error message) */
static const char* model_materialised_reason(const Model* model) {
    if (model->prot.abft) return "-detect abft";
    if (model->prot.on[PK_ATT] || model->prot.on[PK_ATT_BWD] || model->prot.on[PK_QK_BWD]) return "-protect att, att_bwd or qk_bwd";
    if (!attention_fused_supported(model->c.head_dim)) return "this head_dim (the fused attention needs a multiple of 16)";
    if (model->att_mode == ATT_MATERIALISED) return "TSDC_CPU_ATTENTION=materialised";
    if (model->att_mode == ATT_AUTO && model->T < ATT_FUSED_FROM_T) return "T below 512 (TSDC_CPU_ATTENTION=fused takes the fused path)";
    return "an att_logits / att_probs fault event";
}
/* ATT_MATERIALISED: the materialised attention at every layer; ATT_FUSED: the fused one wherever attention_fused
 * allows; ATT_AUTO: by T (the tests compare the two) */
static __attribute__((unused)) void model_set_attention_mode(Model* model, int mode) { model->att_mode = mode; }

static void model_prepare_weights(Model* model);

/* normal(0, 0.02) for matrices and embeddings, ones for norm weights: the counter-based generator of
 * llmc/cpu/init.h (each weight a hash of seed, tensor and index; OpenMP), so every rank, every thread count
 * and the GPU trainer (llmc/cuda/init.cuh) draw the same weights, bit for bit. */
static void model_init_weights(Model* model, uint64_t seed) {
    init_weights_cpu(model->params, &model->L, seed);
    model_prepare_weights(model);
}

/* after every change of the master weights: the bf16 copy (bf16 mode). The forward GEMMs read W [out, in]
 * as W^T in their packing (matmul_forward_w), so no transposed copy is kept. */
static void model_prepare_weights(Model* model) {
    size_t P = model->L.total;
    if (model->precision) bf16_round_copy(model->wr, model->params, (long long)P);
    model->mmb_wn_valid = 0;
}

/* count n alarms of a kind raised in layer l */
#define check_alarm(model, kind, l, n) protect_alarm(&(model)->prot, (kind), (l), (n))

/* ---------------------------------------------------------------- Q/K path recomputation
 * The whole Q/K path of layer l (projections, QK norm, RoPE) run again from the same attn_norm output
 * and weights into backward scratch (dq, dq2, dk, dk2; the mean squares into qk_ms), both results
 * reduced to 128-bit fingerprints and compared with those of the Q and K the forward gave attention.
 * The recomputation has no injection points: a transient fault hits one execution, not both. */
static void qk_recompute_check(Model* model, int l, int B, int T, const void* q_used, int qh, const void* k_used, int kh) {
    const Config* c = &model->c;
    LayerActs* a = &model->la[l];
    int N = B * T, d = c->d_model, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim, qd = H * hd, kd = KV * hd;
    float eps = (float)c->norm_eps;
    int width = model->precision ? 16 : 32;
    float *q1 = model->dq, *q2 = model->dq2, *k1 = model->dk, *k2 = model->dk2, *ms = model->qk_ms, *t;
    const void* an = ACT_T(a, attn_norm, SITE_ATTN_NORM);
    const int anh = model->h16[SITE_ATTN_NORM];
    matmul_forward_x(q1, NULL, 0.0f, an, anh, W(PT_WQ, l), N, d, qd, model->precision, model->precision);
    matmul_forward_x(k1, NULL, 0.0f, an, anh, W(PT_WK, l), N, d, kd, model->precision, model->precision);
    if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {
        rmsnorm_forward_r(q2, ms, q1, W(PT_QNORM, l), N * H, hd, eps, model->precision);
        rmsnorm_forward_r(k2, ms, k1, W(PT_KNORM, l), N * KV, hd, eps, model->precision);
        t = q1; q1 = q2; q2 = t; t = k1; k1 = k2; k2 = t;
    }
    rope_forward_r(q2, q1, model->rope_cos, model->rope_sin, B, T, H, hd, c->rope_style, model->precision);
    rope_forward_r(k2, k1, model->rope_cos, model->rope_sin, B, T, KV, hd, c->rope_style, model->precision);
    t = q1; q1 = q2; q2 = t; t = k1; k1 = k2; k2 = t;
    if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
        rmsnorm_forward_r(q2, ms, q1, NULL, N * H, hd, eps, model->precision);
        rmsnorm_forward_r(k2, ms, k1, NULL, N * KV, hd, eps, model->precision);
        t = q1; q1 = q2; q2 = t; t = k1; k1 = k2; k2 = t;
    }
    int bad = !fp_equal(qk_fingerprint_x(q_used, qh, (size_t)N * qd, width), qk_fingerprint(q1, (size_t)N * qd, width)) ||
              !fp_equal(qk_fingerprint_x(k_used, kh, (size_t)N * kd, width), qk_fingerprint(k1, (size_t)N * kd, width));
    if (bad) check_alarm(model, CHECK_QK, l, 1);
    if (check_dump_file())   /* test-only (llmc/sdc/checks.h) */
        fprintf(check_dump_file(), "{\"kind\":\"qkf\",\"fwd\":%lld,\"layer\":%d,\"qkf\":%d}\n", check_dump_fwd, l, bad);
}

/* the recomputations of ours (qk_bwd, ew) write their result into scratch on the CPU, so they compare it with
 * the stored tensor bit for bit in one pass (a fingerprint is for a device that never writes it out): 1 when any
 * element differs. r is rounded as it would be stored (bf16 under -precision bf16) unless it already was. */
static int recompute_differs(const Model* model, const float* x, const float* r, size_t n, int round) {
    const uint32_t *xu = (const uint32_t*)x, *ru = (const uint32_t*)r;
    long long diff = 0;
    if (round && model->precision != 0) {   /* bf16_round_bits: branch-free, so the loop vectorises */
#pragma omp parallel for schedule(static) reduction(+:diff)
        for (long long i = 0; i < (long long)n; i++) diff += bf16_round_bits(ru[i]) != xu[i];
    } else {
#pragma omp parallel for schedule(static) reduction(+:diff)
        for (long long i = 0; i < (long long)n; i++) diff += ru[i] != xu[i];
    }
    return diff != 0;
}
/* the same with x stored as bf16 bits (h; r rounded as it is compared) */
static int recompute_differs_x(const Model* model, const void* x, int h, const float* r, size_t n, int round) {
    if (!h) return recompute_differs(model, (const float*)x, r, n, round);
    const uint16_t* x16 = (const uint16_t*)x;
    const uint32_t* ru = (const uint32_t*)r;
    long long diff = 0;
#pragma omp parallel for schedule(static) reduction(+:diff)
    for (long long i = 0; i < (long long)n; i++) diff += (bf16_round_bits(ru[i]) >> 16) != x16[i];
    return diff != 0;
}

/* ---------------------------------------------------------------- backward Q/K path recomputation (ours)
 * The backward half of the Q/K path, from the gradient of the logits to the gradients of the q and k
 * projections' outputs (what the weight-gradient and dx GEMMs of wq and wk consume), run a second time
 * from the same dlogits, Q, K and saved statistics into scratch the backward has finished with (dq2, dk2,
 * datt), and both results compared with the stored ones bit for bit: a fault anywhere on the path (q_rope, k_rope,
 * q_norm, k_norm, q_proj, k_proj gradients, whatever its size) changes the stored tensor's bits and not the
 * recomputation's. Exact because every kernel here is deterministic. The QK norm's weight gradient is not
 * accumulated again (NULL). No injection points: a transient fault hits one execution, not both. */
/* the rest of the path after attention_logits_backward for one of q (nh = H) or k (nh = KV): x holds the
 * gradient of the tensor attention consumed, spare is scratch of the same size; returns the buffer that
 * holds the gradient of the projection's output (x or spare) */
static float* qk_bwd_path(Model* model, int l, int B, int T, int nh, int is_k, float* x, float* spare) {
    const Config* c = &model->c;
    LayerActs* a = &model->la[l];
    int n = B * T * nh, hd = c->head_dim;
    float eps = (float)c->norm_eps, *t;
    if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
        const int site = is_k ? SITE_K_ROPE : SITE_Q_ROPE;
        rmsnorm_backward_x(spare, 0, NULL, x, 0, is_k ? ACT_T(a, kr, site) : ACT_T(a, qr, site), model->h16[site], NULL,
                           is_k ? a->kf_ms : a->qf_ms, n, hd, eps, 0, model->precision);
        t = x; x = spare; spare = t;
    }
    rope_backward_r(spare, x, model->rope_cos, model->rope_sin, B, T, nh, hd, c->rope_style, model->precision);
    t = x; x = spare; spare = t;
    if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {
        const int site = is_k ? SITE_K_PROJ : SITE_Q_PROJ;
        rmsnorm_backward_x(spare, 0, NULL, x, 0, is_k ? ACT_T(a, k, site) : ACT_T(a, q, site), model->h16[site],
                           W(is_k ? PT_KNORM : PT_QNORM, l), is_k ? a->kn_ms : a->qn_ms, n, hd, eps, 0, model->precision);
        t = x; x = spare; spare = t;
    }
    return x;
}
static void qk_bwd_recompute_check(Model* model, int l, int B, int T, const void* qc, int qch, const void* kc, int kch,
                                   const void* dq_used, const void* dk_used, int dqkh, float* sq, float* sk) {
    const Config* c = &model->c;
    int N = B * T, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim, qd = H * hd, kd = KV * hd;
    attention_logits_backward_x(sq, sk, 0, ATT_TT(model, dlog), model->att16, qc, qch, kc, kch, B, T, H, KV, hd, model->precision);
    /* datt (N qd >= N kd) is free once attention_av_backward has read it: the spare of both */
    int bad = recompute_differs_x(model, dq_used, dqkh, qk_bwd_path(model, l, B, T, H, 0, sq, model->datt), (size_t)N * qd, 0) ||
              recompute_differs_x(model, dk_used, dqkh, qk_bwd_path(model, l, B, T, KV, 1, sk, model->datt), (size_t)N * kd, 0);
    if (bad) check_alarm(model, CHECK_QK_BWD, l, 1);
    if (check_dump_file())   /* test-only (llmc/sdc/checks.h) */
        fprintf(check_dump_file(), "{\"kind\":\"qkb\",\"bwd\":%lld,\"layer\":%d,\"qkb\":%d}\n", check_dump_bwd, l, bad);
}

/* ---------------------------------------------------------------- element-wise recomputation (ours, -protect ew)
 * The kernels that are not matrix products are cheap (one pass over their tensors): each is run a second time
 * from the same stored inputs and its result compared with the stored output bit for bit, so a fault at any bit of
 * their outputs is caught: in the kernels' compare mode (EW_CMP), block by block as the kernel computes it, nothing
 * stored; the norms' backward, which accumulates into its output, into scratch from the kept value. Forward: the
 * RMSNorm outputs (attn_norm, mlp_norm, from the input and the saved mean square), the residual writebacks (attn_residual, block_out), the
 * activation and the gated product (act, mlp_product); backward: the gradients the MLP's element-wise backward
 * produces (act and up_proj from mlp_product's gradient, gate_proj from act's) and the residual gradients the norms'
 * backward accumulates in place (attn_residual's from mlp_norm's, block_out's from the next attn_norm's or the final
 * norm's: the value before the accumulation is kept, ew_keep_dres). Each recomputation calls the
 * same kernel on the same inputs (exact: every kernel here is deterministic); its inputs are the stored,
 * possibly faulty ones, so a fault upstream is consistent input and stays another check's. Not covered: the
 * outputs of matrix products (q/k/v/o/gate/up/down projections and their dx; bound holds the forward's under their
 * Cauchy-Schwarz bound), attention (att and att_bwd), the QK norms' gradients (qk_bwd's) and the gradient of the
 * first layer's input (the embedding's; no injection site). */
/* the scratch: [N, d] for the kept residual gradient, then [N] for the compare-mode norm's mean squares */
static size_t ew_stride(const Model* model) { return (size_t)model->B * model->T * (size_t)model->c.d_model; }
static float* ew_scratch(Model* model) {
    if (!model->ew_scratch) model->ew_scratch = (float*)mallocCheck(sizeof(float) * (ew_stride(model) + (size_t)model->B * model->T));
    return model->ew_scratch;
}
/* after a kernel run in compare mode (EW_CMP, llmc/cpu/cpu_kernels.h): an alarm for each output that differed, in
 * output order (one for each, as a comparison of each) */
static void ew_cmp_alarms(Model* model, int l) {
    unsigned bits = ew_cmp_take();
    if (bits & 1) check_alarm(model, CHECK_EW, l, 1);
    if (bits & 2) check_alarm(model, CHECK_EW, l, 1);
}
/* out stored as oh says */
static void ew_rmsnorm(Model* model, int l, const void* out, int oh, const void* x, int xh, const float* w, int N, int d) {
    rmsnorm_forward_x((void*)out, oh | EW_CMP, ew_scratch(model) + ew_stride(model), x, xh, w, N, d, (float)model->c.norm_eps,
                      model->precision != 0);
    ew_cmp_alarms(model, l);
}
/* out = a + b, each stored as its flag says */
static void ew_residual(Model* model, int l, const void* out, int oh, const void* a, int ah, const void* b, int bh, size_t n) {
    residual_forward_x((void*)out, oh | EW_CMP, a, ah, b, bh, n, model->precision != 0);
    ew_cmp_alarms(model, l);
}
/* the backward's residual gradients, accumulated in place by the norms' backward (dres += d/dx norm(x)): the value
 * before the accumulation is kept in the scratch (ew_keep_dres), and after the result's injection point the same
 * accumulation is run again on the kept copy and compared (ew_norm_backward; accumulate 0: the final norm's, which
 * writes dres) */
static void ew_keep_dres(Model* model, const void* dres, int dh, size_t n) {
    if (!model->prot.on[PK_EW]) return;
    if (dh) bf16_unpack_array(ew_scratch(model), (const uint16_t*)dres, (long long)n);
    else memcpy(ew_scratch(model), dres, n * sizeof(float));
}
/* dres stored as dh says, dout as douth */
static void ew_norm_backward(Model* model, int l, const void* dres, int dh, const void* dout, int douth, const void* x, int xh,
                             const float* w, const float* ms, int N, int d, int accumulate) {
    float* r = ew_scratch(model);
    rmsnorm_backward_x(r, 0, NULL, dout, douth, x, xh, w, ms, N, d, (float)model->c.norm_eps, accumulate, 0);
    if (recompute_differs_x(model, dres, dh, r, (size_t)N * d, 1)) check_alarm(model, CHECK_EW, l, 1);
}

/* ---------------------------------------------------------------- matrix-product output bounds (ours, -protect bound)
 * llmc/sdc/bound.h: each of v_proj, o_proj, gate_proj (fc), up_proj, down_proj checked after its injection point,
 * |y_ij| <= c(K) ||x_i|| ||w_j||, against the input the product read and the weights (model->wr, the copy the GEMMs
 * read). The weights' row norms are computed once after every change of the weights (mmb_wn_valid); the input
 * rows' norms per product, attn_norm's and mlp_norm's once for the products that share them. */
static size_t mmb_layer_offset(const Config* c, int s) {
    return mmb_slot_offset(s, (size_t)c->n_kv_head * c->head_dim, (size_t)c->d_model, (size_t)c->ffn_dim);
}
static void mmb_alloc(Model* model) {
    if (model->mmb_wn) return;
    model->mmb_wn = (float*)mallocCheck(sizeof(float) * mmb_layer_offset(&model->c, MMB_SLOTS) * model->c.n_layer);
    model->mmb_xn = (float*)mallocCheck(sizeof(float) * 2 * (size_t)model->B * model->T);
}
/* layer l's weight row norms of product slot s (MMB_*) */
static const float* mmb_weight_norms(Model* model, int l, int s) {
    const Config* c = &model->c;
    const int d = c->d_model, kd = c->n_kv_head * c->head_dim, qd = c->n_head * c->head_dim, F = c->ffn_dim;
    const size_t stride = mmb_layer_offset(c, MMB_SLOTS);
    mmb_alloc(model);
    if (!model->mmb_wn_valid) {
        for (int i = 0; i < c->n_layer; i++) {
            float* wn = model->mmb_wn + stride * i;
            const int swiglu = c->mlp == MLP_SWIGLU;
            mmb_row_norms(wn + mmb_layer_offset(c, MMB_V_PROJ), W(PT_WV, i), kd, d, d);
            mmb_row_norms(wn + mmb_layer_offset(c, MMB_O_PROJ), W(PT_WO, i), d, qd, qd);
            mmb_row_norms(wn + mmb_layer_offset(c, MMB_GATE_PROJ), W(swiglu ? PT_WGATE : PT_WFC, i), F, d, d);
            if (swiglu) mmb_row_norms(wn + mmb_layer_offset(c, MMB_UP_PROJ), W(PT_WUP, i), F, d, d);
            mmb_row_norms(wn + mmb_layer_offset(c, MMB_DOWN_PROJ), W(PT_WDOWN, i), d, F, F);
        }
        model->mmb_wn_valid = 1;
    }
    return model->mmb_wn + stride * l + mmb_layer_offset(c, s);
}
/* the input rows' norms of a product into slot buffer i (0 or 1) of mmb_xn */
static const float* mmb_input_norms_x(Model* model, int i, const void* x, int h, int rows, int K) {
    mmb_alloc(model);
    float* nx = model->mmb_xn + (size_t)i * model->B * model->T;
    mmb_row_norms_x(nx, x, h, rows, K, K);
    return nx;
}
static const float* mmb_input_norms(Model* model, int i, const float* x, int rows, int K) { return mmb_input_norms_x(model, i, x, 0, rows, K); }
/* product slot s of layer l: y [rows, cols] (stored as yh says) from an input with row norms nx over K */
static void mmb_check_x(Model* model, int l, int s, const void* y, int yh, int rows, int cols, const float* nx, int K) {
    double q = 0.0;
    const long long bad = mmb_count_qx(y, yh, rows, cols, cols, nx, mmb_weight_norms(model, l, s), K, check_dump_file() ? &q : NULL);
    if (bad) check_alarm(model, CHECK_BOUND, l, 1);
    if (check_dump_file())   /* test-only (llmc/sdc/checks.h) */
        fprintf(check_dump_file(), "{\"kind\":\"mmb\",\"fwd\":%lld,\"layer\":%d,\"slot\":%d,\"bad\":%lld,\"q\":%s}\n", check_dump_fwd, l,
                s, bad, jnum(q).s);
}
static void mmb_check(Model* model, int l, int s, const float* y, int rows, int cols, const float* nx, int K) {
    mmb_check_x(model, l, s, y, 0, rows, cols, nx, K);
}

/* exponent profiling: sample dL/dY of a linear layer (its output gradient) and count the exponent
 * codes (bits 23..30, the same field in fp32 and bf16) of the nonzero finite samples */
static void exp_profile_x(Model* model, int type, int l, const void* dy, int dh, size_t n) {
    if (!model->prot.exp_hist || !n) return;
    uint32_t* h = model->prot.exp_hist + (size_t)tensor_index(model, type, l) * 256;
    for (int i = 0; i < model->prot.exp_samples; i++) {
        const size_t j = rng_below(&model->prot.exp_rng, n);
        uint32_t b = dh ? (uint32_t)((const uint16_t*)dy)[j] << 16 : f32_bits(((const float*)dy)[j]);
        uint32_t code = (b >> 23) & 0xFF;
        if (code != 0 && code != 255) h[code]++;
    }
}
static void exp_profile(Model* model, int type, int l, const float* dy, size_t n) { exp_profile_x(model, type, l, dy, 0, n); }
/* the same on a tensor stored as bf16 bits */
static void exp_profile_h(Model* model, int type, int l, const uint16_t* dy, size_t n) { exp_profile_x(model, type, l, dy, 1, n); }

/* the residual gains of the monitored layers from the last forward's mean squares: out[i*2 + p] */
static void model_rgg_gains(Model* model, int B, int T, const int* layers, int n_mon, double* out) {
    int N = B * T, L = model->c.n_layer;
    for (int i = 0; i < n_mon; i++) {
        int l = layers[i];
        const float* ms_next = l + 1 < L ? model->la[l + 1].attn_ms : model->final_ms;
        out[i * 2 + RGG_ATTN] = residual_gain(model->la[l].attn_ms, model->la[l].mlp_ms, N);
        out[i * 2 + RGG_MLP] = residual_gain(model->la[l].mlp_ms, ms_next, N);
        if (check_dump_file()) {   /* test-only (llmc/sdc/checks.h): the sums the gains come from */
            const float* ms[3] = {model->la[l].attn_ms, model->la[l].mlp_ms, ms_next};
            double ss[3] = {0, 0, 0};
            for (int j = 0; j < 3; j++)
                for (int n = 0; n < N; n++) ss[j] += ms[j][n];
            check_dump_rgg(l, ss, out[i * 2 + RGG_ATTN], out[i * 2 + RGG_MLP]);
        }
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
    model->last_B = B; model->last_T = T;

    /* [N,d]; rows of the weights in use: bf16 values in bf16 mode */
    const int eh = model->emb16;
    void* emb = eh ? (void*)model->emb_h : (void*)model->emb;
    embedding_forward_x(emb, eh, inputs, W(PT_WTE, -1), N, d);
    const void* x = emb;   /* the layer's input, the residual stream: stored as xh says */
    int xh = eh;
    if (c->embed_norm) {
        void* x0 = eh ? (void*)model->x0_h : (void*)model->x0;
        rmsnorm_forward_x(x0, eh, model->emb_ms, emb, eh, W(PT_EMBED_NORM, -1), N, d, eps, model->precision);
        x = x0;
    }
    const int prec = model->precision;
    /* each site's tensor stored as bf16 bits where h16 says (ACT_T) */
    const unsigned char* h16 = model->h16;
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs* a = &model->la[l];
        /* attention block: x + o_proj(attn(rope(qk_norm(q, k)), v)) */
        void* an = ACT_T(a, attn_norm, SITE_ATTN_NORM);
        const int anh = h16[SITE_ATTN_NORM];
        rmsnorm_forward_x(an, anh, a->attn_ms, x, xh, W(PT_ATTN_NORM, l), N, d, eps, prec);   STORE_RND_X(SITE_ATTN_NORM, l, an, anh, (size_t)N * d);
        if (model->prot.on[PK_EW]) ew_rmsnorm(model, l, an, anh, x, xh, W(PT_ATTN_NORM, l), N, d);
        void *q = ACT_T(a, q, SITE_Q_PROJ), *k = ACT_T(a, k, SITE_K_PROJ);
        const int qh = h16[SITE_Q_PROJ], kh = h16[SITE_K_PROJ];
        matmul_forward_x((float*)(qh ? NULL : q), (uint16_t*)(qh ? q : NULL), 0.0f, an, anh, W(PT_WQ, l), N, d, qd, prec, prec); STORE_RND_X(SITE_Q_PROJ, l, q, qh, (size_t)N * qd);
        matmul_forward_x((float*)(kh ? NULL : k), (uint16_t*)(kh ? k : NULL), 0.0f, an, anh, W(PT_WK, l), N, d, kd, prec, prec); STORE_RND_X(SITE_K_PROJ, l, k, kh, (size_t)N * kd);
        void* v = ACT_T(a, v, SITE_V_PROJ);
        const int vh = h16[SITE_V_PROJ];
        matmul_forward_x((float*)(vh ? NULL : v), (uint16_t*)(vh ? v : NULL), 0.0f, an, anh, W(PT_WV, l), N, d, kd, prec, prec); STORE_RND_X(SITE_V_PROJ, l, v, vh, (size_t)N * kd);
        const int mmb = model->prot.on[PK_BOUND];
        if (mmb) mmb_check_x(model, l, MMB_V_PROJ, v, vh, N, kd, mmb_input_norms_x(model, 0, an, anh, N, d), d);
        /* the Q/K path, each tensor as stored (qc, kc the latest, qch, kch their flags) */
        const void *qc = q, *kc = k;
        int qch = qh, kch = kh;
        const int qnh = h16[SITE_Q_NORM], knh = h16[SITE_K_NORM], qrh = h16[SITE_Q_ROPE], krh = h16[SITE_K_ROPE];
        if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {                                    /* per head, over hd */
            void *qn = ACT_T(a, qn, SITE_Q_NORM), *kn = ACT_T(a, kn, SITE_K_NORM);
            rmsnorm_forward_x(qn, qnh, a->qn_ms, qc, qch, W(PT_QNORM, l), N * H, hd, eps, prec);   STORE_RND_X(SITE_Q_NORM, l, qn, qnh, (size_t)N * qd);
            rmsnorm_forward_x(kn, knh, a->kn_ms, kc, kch, W(PT_KNORM, l), N * KV, hd, eps, prec);  STORE_RND_X(SITE_K_NORM, l, kn, knh, (size_t)N * kd);
            qc = qn; kc = kn; qch = qnh; kch = knh;
        }
        void *qr = ACT_T(a, qr, SITE_Q_ROPE), *kr = ACT_T(a, kr, SITE_K_ROPE);
        rope_forward_x(qr, qrh, qc, qch, model->rope_cos, model->rope_sin, B, T, H, hd, c->rope_style, prec);   STORE_RND_X(SITE_Q_ROPE, l, qr, qrh, (size_t)N * qd);
        rope_forward_x(kr, krh, kc, kch, model->rope_cos, model->rope_sin, B, T, KV, hd, c->rope_style, prec);  STORE_RND_X(SITE_K_ROPE, l, kr, krh, (size_t)N * kd);
        qc = qr; kc = kr; qch = qrh; kch = krh;
        if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
            void *qf = ACT_T(a, qf, SITE_Q_NORM), *kf = ACT_T(a, kf, SITE_K_NORM);
            rmsnorm_forward_x(qf, qnh, a->qf_ms, qc, qch, NULL, N * H, hd, eps, prec);   STORE_RND_X(SITE_Q_NORM, l, qf, qnh, (size_t)N * qd);
            rmsnorm_forward_x(kf, knh, a->kf_ms, kc, kch, NULL, N * KV, hd, eps, prec);  STORE_RND_X(SITE_K_NORM, l, kf, knh, (size_t)N * kd);
            qc = qf; kc = kf; qch = qnh; kch = knh;
        }
        if (model->prot.on[PK_QK]) qk_recompute_check(model, l, B, T, qc, qch, kc, kch);
        void* ao = ACT_T(a, att_out, SITE_ATT_OUT);
        const int aoh = h16[SITE_ATT_OUT];
        if ((a->fused = attention_fused(model, l))) {
            attention_fused_forward_x(ao, aoh, qc, qch, kc, kch, v, vh, B, T, H, KV, hd, prec);   STORE_RND_X(SITE_ATT_OUT, l, ao, aoh, (size_t)N * qd);
        } else {
            model_att_buffers(model, model_materialised_reason(model));
            size_t natt = (size_t)B * H * T * T;
            const int th = model->att16;   /* the [B,H,T,T] tensors as stored */
            void *lg = ATT_TT(a, logits), *pr = ATT_TT(a, probs);
            attention_logits_forward_x(lg, th, qc, qch, kc, kch, B, T, H, KV, hd, prec);   STORE_RND_X(SITE_ATT_LOGITS, l, lg, th, natt);
            int width = model->precision ? 16 : 32;
            float *qt = NULL, *kt = NULL;   /* the checks read q and k as fp32 (copies where they are stored as bf16 bits) */
            const float *qf32 = NULL, *kf32 = NULL;
            if (model->prot.abft || model->prot.on[PK_ATT]) {
                qf32 = widen_copy(qc, qch, (size_t)N * qd, &qt);
                kf32 = widen_copy(kc, kch, (size_t)N * kd, &kt);
            }
            if (model->prot.abft) check_alarm(model, CHECK_ABFT, l, abft_logits_check_x(lg, th, qf32, kf32, B, T, H, KV, hd, width));
            int att_n[2] = {0, 0};   /* failed heads of the logits and the probability checks */
            if (model->prot.on[PK_ATT]) check_alarm(model, CHECK_ATT, l, att_n[0] = att_logits_rowcheck_x(lg, th, qf32, kf32, B, T, H, KV, hd, width));
            attention_softmax_forward_x(pr, th, lg, th, B, H, T, model->precision);        STORE_RND_X(SITE_ATT_PROBS, l, pr, th, natt);
            if (model->prot.on[PK_ATT]) check_alarm(model, CHECK_ATT, l, att_n[1] = att_probs_rowcheck_x(pr, th, B, H, T, width));
            if (model->prot.on[PK_ATT] && check_dump_file()) {   /* test-only (llmc/sdc/checks.h) */
                double st[4];
                att_fwd_stats(lg, pr, th, qf32, kf32, B, T, H, KV, hd, width, st);
                check_dump_attf(l, att_n[0], att_n[1], st);
            }
            free(qt); free(kt);
            attention_av_forward_x(ao, aoh, pr, th, v, vh, B, T, H, KV, hd, prec); STORE_RND_X(SITE_ATT_OUT, l, ao, aoh, (size_t)N * qd);
            if (model->prot.abft) {   /* on fp32 copies of what is stored as bf16 bits */
                float *ot, *vt;
                const float *of = widen_copy(ao, aoh, (size_t)N * qd, &ot), *vf = widen_copy(v, vh, (size_t)N * kd, &vt);
                check_alarm(model, CHECK_ABFT, l, abft_av_check_x(of, pr, th, vf, B, T, H, KV, hd, width));
                free(ot); free(vt);
            }
        }
        void* o = ACT_T(a, o, SITE_O_PROJ);
        const int oh = h16[SITE_O_PROJ];
        matmul_forward_x((float*)(oh ? NULL : o), (uint16_t*)(oh ? o : NULL), 0.0f, ao, aoh, W(PT_WO, l), N, qd, d, prec, prec); STORE_RND_X(SITE_O_PROJ, l, o, oh, (size_t)N * d);
        if (mmb) mmb_check_x(model, l, MMB_O_PROJ, o, oh, N, d, mmb_input_norms_x(model, 0, ao, aoh, N, qd), qd);
        void* rm = ACT_T(a, resid_mid, SITE_ATTN_RESIDUAL);
        const int rmh = h16[SITE_ATTN_RESIDUAL];
        residual_forward_x(rm, rmh, x, xh, o, oh, (size_t)N * d, prec);      STORE_RND_X(SITE_ATTN_RESIDUAL, l, rm, rmh, (size_t)N * d);
        if (model->prot.on[PK_EW]) ew_residual(model, l, rm, rmh, x, xh, o, oh, (size_t)N * d);
        /* MLP block: x + down(silu(gate) * up)  or  x + down(relu(fc)^2) */
        void* mn = ACT_T(a, mlp_norm, SITE_MLP_NORM);
        const int mnh = h16[SITE_MLP_NORM];
        rmsnorm_forward_x(mn, mnh, a->mlp_ms, rm, rmh, W(PT_MLP_NORM, l), N, d, eps, prec); STORE_RND_X(SITE_MLP_NORM, l, mn, mnh, (size_t)N * d);
        if (model->prot.on[PK_EW]) ew_rmsnorm(model, l, mn, mnh, rm, rmh, W(PT_MLP_NORM, l), N, d);
        /* the hidden tensors as stored: each op reads and writes them so */
        void *gate = ACT_T(a, gate, SITE_GATE_PROJ), *up = ACT_T(a, up, SITE_UP_PROJ), *act = ACT_T(a, act, SITE_ACT);
        void *prod = ACT_T(a, prod, SITE_MLP_PRODUCT), *hidden;
        const int mh = model_mlp_h16(model);   /* the four alike (both -fault_dtype forms keep them so) */
        if (c->mlp == MLP_SWIGLU) {
            matmul_forward_x((float*)(mh ? NULL : gate), (uint16_t*)(mh ? gate : NULL), 0.0f, mn, mnh, W(PT_WGATE, l), N, d, F, prec, prec); STORE_RND_X(SITE_GATE_PROJ, l, gate, mh, (size_t)N * F);
            matmul_forward_x((float*)(mh ? NULL : up), (uint16_t*)(mh ? up : NULL), 0.0f, mn, mnh, W(PT_WUP, l), N, d, F, prec, prec);       STORE_RND_X(SITE_UP_PROJ, l, up, mh, (size_t)N * F);
            if (mmb) {
                const float* nx = mmb_input_norms_x(model, 1, mn, mnh, N, d);
                mmb_check_x(model, l, MMB_GATE_PROJ, gate, mh, N, F, nx, d);
                mmb_check_x(model, l, MMB_UP_PROJ, up, mh, N, F, nx, d);
            }
            silu_forward_x(act, mh, gate, mh, (size_t)N * F, prec);        STORE_RND_X(SITE_ACT, l, act, mh, (size_t)N * F);
            mul_forward_x(prod, mh, act, up, mh, (size_t)N * F, prec);     STORE_RND_X(SITE_MLP_PRODUCT, l, prod, mh, (size_t)N * F);
            if (model->prot.on[PK_EW]) {
                silu_forward_x(act, mh | EW_CMP, gate, mh, (size_t)N * F, prec);     ew_cmp_alarms(model, l);
                mul_forward_x(prod, mh | EW_CMP, act, up, mh, (size_t)N * F, prec);  ew_cmp_alarms(model, l);
            }
            hidden = prod;
        } else {
            matmul_forward_x((float*)(mh ? NULL : gate), (uint16_t*)(mh ? gate : NULL), 0.0f, mn, mnh, W(PT_WFC, l), N, d, F, prec, prec);   STORE_RND_X(SITE_GATE_PROJ, l, gate, mh, (size_t)N * F);
            if (mmb) mmb_check_x(model, l, MMB_GATE_PROJ, gate, mh, N, F, mmb_input_norms_x(model, 1, mn, mnh, N, d), d);
            relu2_forward_x(act, mh, gate, mh, (size_t)N * F, prec);      STORE_RND_X(SITE_ACT, l, act, mh, (size_t)N * F);
            if (model->prot.on[PK_EW]) {
                relu2_forward_x(act, mh | EW_CMP, gate, mh, (size_t)N * F, prec);  ew_cmp_alarms(model, l);
            }
            hidden = act;
        }
        void* dn = ACT_T(a, down, SITE_DOWN_PROJ);
        const int dnh = h16[SITE_DOWN_PROJ];
        matmul_forward_x((float*)(dnh ? NULL : dn), (uint16_t*)(dnh ? dn : NULL), 0.0f, hidden, mh, W(PT_WDOWN, l), N, F, d, prec, prec); STORE_RND_X(SITE_DOWN_PROJ, l, dn, dnh, (size_t)N * d);
        if (mmb) mmb_check_x(model, l, MMB_DOWN_PROJ, dn, dnh, N, d, mmb_input_norms_x(model, 0, hidden, mh, N, F), F);
        void* bo = ACT_T(a, out, SITE_BLOCK_OUT);
        const int boh = h16[SITE_BLOCK_OUT];
        residual_forward_x(bo, boh, rm, rmh, dn, dnh, (size_t)N * d, prec); STORE_RND_X(SITE_BLOCK_OUT, l, bo, boh, (size_t)N * d);
        if (model->prot.on[PK_EW]) ew_residual(model, l, bo, boh, rm, rmh, dn, dnh, (size_t)N * d);
        x = bo; xh = boh;
    }
    const int fh = model->emb16;   /* the final norm's output: stored as bf16 bits where fh */
    void* fn = fh ? (void*)model->final_norm_h : (void*)model->final_norm;
    rmsnorm_forward_x(fn, fh, model->final_ms, x, xh, W(PT_FINAL_NORM, -1), N, d, eps, model->precision);
    const float* lm = c->tied ? W(PT_WTE, -1) : W(PT_LMHEAD, -1);                       /* [V, d] */
    if (model->logits_h)   /* stored as bf16 bits by the GEMM, after the softcap */
        matmul_forward_x(NULL, model->logits_h, (float)c->softcap, fn, fh, lm, N, d, V, 1, 0);
    else {
        matmul_forward_w(model->logits, model->final_norm, lm, N, d, V, 0, 0);
        softcap_forward(model->logits, (size_t)N * V, (float)c->softcap);
    }
    if (!targets) return 0.0f;
    if (model->ce_fused_next) {   /* the backward follows with nothing reading the logits: its dlogits now */
        model->ce_fused_next = 0;
        if (model->logits_h) crossentropy_fused_h(model->losses, model->lse, model->logits_h, targets, N, V, model->ce_dloss, (float)c->softcap);
        else crossentropy_fused(model->losses, model->lse, model->logits, targets, N, V, model->ce_dloss, (float)c->softcap, 0);
        model->ce_dlogits_ready = 1;
    } else {
        if (model->logits_h) crossentropy_forward_h(model->losses, model->lse, model->logits_h, targets, N, V);
        else crossentropy_forward(model->losses, model->lse, model->logits, targets, N, V);
        model->ce_dlogits_ready = 0;
    }
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
    void* dres = model->dres;   /* gradient of the residual stream, [N,d]: bf16 bits where dh */
    int dh = model->dres16;
    float* dbuf = model->dbuf;
    /* the norms' output gradients, written by the last dx product (bf16 bits where dbuf16; dbuf: the partial sums
     * of the products before it), read by the norms' backward */
    uint16_t* const db16 = model->dbuf16;
    void* const dg = db16 ? (void*)db16 : (void*)dbuf;
    const int dgh = db16 != NULL;

    /* loss -> logits (in place) -> lm_head -> final norm */
    float* dlogits = model->logits;   /* in place of the logits (bf16 bits in logits_h under -precision bf16) */
    if (model->ce_dlogits_ready && model->ce_dloss == dloss_scale) model->ce_dlogits_ready = 0;   /* the forward's one pass made them */
    else {
        if (model->ce_dlogits_ready) { fprintf(stderr, "internal error: the one-pass classifier ran with another loss scale\n"); exit(1); }
        if (model->logits_h) crossentropy_softcap_backward_h(model->logits_h, model->lse, targets, N, V, dloss_scale, (float)c->softcap);
        else crossentropy_softcap_backward(dlogits, model->logits, model->lse, targets, N, V, dloss_scale, (float)c->softcap);
    }
    const int lmt = c->tied ? PT_WTE : PT_LMHEAD;
    if (model->logits_h) {
        exp_profile_h(model, lmt, -1, model->logits_h, (size_t)N * V);
        const int fh = model->emb16;
        matmul_backward_xo(dbuf, db16, GR(lmt, -1), model->logits_h, 1, fh ? (void*)model->final_norm_h : (void*)model->final_norm, fh,
                           W(lmt, -1), N, d, V, 0, 1, 1);
    } else {
        exp_profile(model, lmt, -1, dlogits, (size_t)N * V);
        matmul_backward_r(dbuf, GR(lmt, -1), dlogits, model->final_norm, W(lmt, -1), N, d, V, 0, 0, 0);
    }
    /* a layer's input, the residual stream (stored as its flag says; the first layer's, the embedding's or its norm's, as
     * emb16 says) */
    const int eh = model->emb16;
    const void* emb = eh ? (void*)model->emb_h : (void*)model->emb;
    const void* x_first = c->embed_norm ? (eh ? (void*)model->x0_h : (void*)model->x0) : emb;
    const int boh = model->h16[SITE_BLOCK_OUT], rmh = model->h16[SITE_ATTN_RESIDUAL];
    const void* x_last = c->n_layer ? ACT_T(&model->la[c->n_layer - 1], out, SITE_BLOCK_OUT) : x_first;
    const int x_last_h = c->n_layer ? boh : eh;
    rmsnorm_backward_x(dres, dh, GR(PT_FINAL_NORM, -1), dg, dgh, x_last, x_last_h, W(PT_FINAL_NORM, -1), model->final_ms, N, d, eps, 0, model->precision);
    /* what wrote dres last, for ew's check of d(block_out) (the next layer's attn_norm backward, here the final norm's) */
    const void* res_x = x_last;
    const float *res_w = W(PT_FINAL_NORM, -1), *res_ms = model->final_ms;
    int res_acc = 0, res_xh = x_last_h;

    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs* a = &model->la[l];
        const void* x_in = l > 0 ? ACT_T(&model->la[l - 1], out, SITE_BLOCK_OUT) : x_first;
        const int x_in_h = l > 0 ? boh : eh;
        const void* rm = ACT_T(a, resid_mid, SITE_ATTN_RESIDUAL);
        size_t natt = (size_t)B * H * T * T;
        FAULT_BWD_X(SITE_BLOCK_OUT, l, dres, dh, (size_t)N * d);
        if (model->prot.on[PK_EW]) ew_norm_backward(model, l, dres, dh, dg, dgh, res_x, res_xh, res_w, res_ms, N, d, res_acc);
        /* MLP block: dres is d(block_out) = d(resid_mid) (through the skip) = d(down) */
        int ddh;
        const void* ddown = fault_private_grad(model, SITE_DOWN_PROJ, l, dres, dh, dbuf, (size_t)N * d, &ddh);
        const int mh = model_mlp_h16(model), prec = model->precision;   /* the hidden tensors as stored (ACT_T) */
        const void* mn = ACT_T(a, mlp_norm, SITE_MLP_NORM);
        const int mnh = model->h16[SITE_MLP_NORM];
        void *dF = model->dF, *dF2 = model->dF2, *dF3 = model->dF3;   /* the hidden gradients, stored as the tensors (mh) */
        float* const dF32 = mh ? NULL : model->dF;   /* dF where it is a float array (a GEMM's dx stores into one or the other) */
        uint16_t* const dF16 = mh ? (uint16_t*)model->dF : NULL;
        const size_t nf = (size_t)N * F;
        if (c->mlp == MLP_SWIGLU) {
            const void *gate = ACT_T(a, gate, SITE_GATE_PROJ), *up = ACT_T(a, up, SITE_UP_PROJ), *act = ACT_T(a, act, SITE_ACT);
            const void* prod = ACT_T(a, prod, SITE_MLP_PRODUCT);
            exp_profile_x(model, PT_WDOWN, l, ddown, ddh, (size_t)N * d);
            matmul_backward_xo(dF32, dF16, GR(PT_WDOWN, l), ddown, ddh, prod, mh, W(PT_WDOWN, l), N, F, d, 0, prec, prec);  STORE_GRAD_RND_X(SITE_MLP_PRODUCT, l, dF, mh, nf);
            mul_backward_x(dF2, dF3, mh, dF, act, up, mh, nf, prec);   /* d act, d up */
            FAULT_BWD_X(SITE_ACT, l, dF2, mh, nf);
            FAULT_BWD_X(SITE_UP_PROJ, l, dF3, mh, nf);
            if (model->prot.on[PK_EW]) {   /* d act, d up from mlp_product's gradient (still in dF) */
                mul_backward_x(dF2, dF3, mh | EW_CMP, dF, act, up, mh, nf, prec);
                ew_cmp_alarms(model, l);
            }
            silu_backward_x(dF, mh, dF2, gate, mh, nf, prec);       STORE_GRAD_RND_X(SITE_GATE_PROJ, l, dF, mh, nf);
            if (model->prot.on[PK_EW]) {
                silu_backward_x(dF, mh | EW_CMP, dF2, gate, mh, nf, prec);  ew_cmp_alarms(model, l);
            }
            exp_profile_x(model, PT_WGATE, l, dF, mh, nf);
            exp_profile_x(model, PT_WUP, l, dF3, mh, nf);
            matmul_backward_x(dbuf, GR(PT_WGATE, l), dF, mh, mn, mnh, W(PT_WGATE, l), N, d, F, 0, prec, 0);
            matmul_backward_xo(dbuf, db16, GR(PT_WUP, l), dF3, mh, mn, mnh, W(PT_WUP, l), N, d, F, 1, prec, prec);
        } else {
            const void *gate = ACT_T(a, gate, SITE_GATE_PROJ), *act = ACT_T(a, act, SITE_ACT);
            exp_profile_x(model, PT_WDOWN, l, ddown, ddh, (size_t)N * d);
            matmul_backward_xo(dF32, dF16, GR(PT_WDOWN, l), ddown, ddh, act, mh, W(PT_WDOWN, l), N, F, d, 0, prec, prec);   STORE_GRAD_RND_X(SITE_ACT, l, dF, mh, nf);
            relu2_backward_x(dF2, mh, dF, gate, mh, nf, prec);       STORE_GRAD_RND_X(SITE_GATE_PROJ, l, dF2, mh, nf);
            if (model->prot.on[PK_EW]) {
                relu2_backward_x(dF2, mh | EW_CMP, dF, gate, mh, nf, prec);  ew_cmp_alarms(model, l);
            }
            exp_profile_x(model, PT_WFC, l, dF2, mh, nf);
            matmul_backward_xo(dbuf, db16, GR(PT_WFC, l), dF2, mh, mn, mnh, W(PT_WFC, l), N, d, F, 0, prec, prec);
        }
        STORE_GRAD_RND_X(SITE_MLP_NORM, l, dg, dgh, (size_t)N * d);   /* the last product stored it as bf16 */
        ew_keep_dres(model, dres, dh, (size_t)N * d);
        rmsnorm_backward_x(dres, dh, GR(PT_MLP_NORM, l), dg, dgh, rm, rmh, W(PT_MLP_NORM, l), a->mlp_ms, N, d, eps, 1, model->precision);
        STORE_GRAD_RND_X(SITE_ATTN_RESIDUAL, l, dres, dh, (size_t)N * d);
        if (model->prot.on[PK_EW]) ew_norm_backward(model, l, dres, dh, dg, dgh, rm, rmh, W(PT_MLP_NORM, l), a->mlp_ms, N, d, 1);
        /* attention block: dres is d(resid_mid) = d(x_in) (skip) = d(o) */
        int doh;
        const void* dout_o = fault_private_grad(model, SITE_O_PROJ, l, dres, dh, dbuf, (size_t)N * d, &doh);
        exp_profile_x(model, PT_WO, l, dout_o, doh, (size_t)N * d);
        const void *ao = ACT_T(a, att_out, SITE_ATT_OUT), *v = ACT_T(a, v, SITE_V_PROJ);
        const int aoh = model->h16[SITE_ATT_OUT], vh = model->h16[SITE_V_PROJ];
        /* att_out's and v's gradients stored as att_out and v are (datt keeps N qd floats: qk_bwd's spare after it is read) */
        void *datt = model->datt, *dv = model->dv;
        matmul_backward_xo(aoh ? NULL : model->datt, aoh ? (uint16_t*)datt : NULL, GR(PT_WO, l), dout_o, doh, ao, aoh, W(PT_WO, l), N, qd, d, 0, prec,
                           prec);      STORE_GRAD_RND_X(SITE_ATT_OUT, l, datt, aoh, (size_t)N * qd);
        int qch, kch;
        const void *qc = att_qk(model, a, 0, &qch), *kc = att_qk(model, a, 1, &kch);
        const int qkh = model->dqk16;
        if (a->fused) {   /* the probs again from q and k (the forward kept none): dq, dk, dv with the materialised bits */
            attention_fused_backward_x(model->dq, model->dk, qkh, dv, vh, datt, aoh, qc, qch, kc, kch, v, vh, B, T, H, KV, hd, prec);
            FAULT_BWD_X(SITE_V_PROJ, l, dv, vh, (size_t)N * kd);
        } else {
            const int th = model->att16;   /* the [B,H,T,T] tensors as stored */
            void *dl = ATT_TT(model, dlog), *pr = ATT_TT(a, probs);
            attention_av_backward_x(dl, th, dv, vh, datt, aoh, pr, th, v, vh, B, T, H, KV, hd, prec);
            FAULT_BWD_X(SITE_ATT_PROBS, l, dl, th, natt);
            FAULT_BWD_X(SITE_V_PROJ, l, dv, vh, (size_t)N * kd);
            int width = model->precision ? 16 : 32;
            int attb_n[3] = {0, 0, 0};   /* dprobs, dlogits, dV failed heads (the GPU's ATTB_* order) */
            float *vt = NULL, *gt = NULL, *dvt = NULL;   /* the checks read v, datt and dv as fp32 (copies of bf16 bits) */
            const float *vf = NULL, *gf = NULL, *dvf = NULL;
            if (model->prot.on[PK_ATT_BWD]) {
                vf = widen_copy(v, vh, (size_t)N * kd, &vt);
                gf = widen_copy(datt, aoh, (size_t)N * qd, &gt);
                dvf = widen_copy(dv, vh, (size_t)N * kd, &dvt);
                check_alarm(model, CHECK_ATT_BWD, l, attb_n[0] = att_dprobs_rowcheck_x(dl, th, gf, vf, B, T, H, KV, hd, width));
                check_alarm(model, CHECK_ATT_BWD, l, attb_n[2] = att_dv_colcheck(dvf, gf, B, T, H, KV, hd, width));
            }
            attention_softmax_backward_x(dl, dl, th, pr, th, B, H, T, model->precision); STORE_GRAD_RND_X(SITE_ATT_LOGITS, l, dl, th, natt);
            if (model->prot.on[PK_ATT_BWD])
                check_alarm(model, CHECK_ATT_BWD, l, attb_n[1] = att_dlogits_rowcheck_x(dl, th, gf, vf, B, T, H, KV, hd, width));
            if (model->prot.on[PK_ATT_BWD] && check_dump_file()) {   /* test-only (llmc/sdc/checks.h) */
                double tb[3];
                att_bwd_bound_sums(gf, vf, B, T, H, KV, hd, width, tb);
                fprintf(check_dump_file(), "{\"kind\":\"att\",\"bwd\":%lld,\"layer\":%d,\"att\":[%d,%d,%d],\"tol\":[%.17g,%.17g,%.17g]}\n",
                        check_dump_bwd, l, attb_n[0], attb_n[1], attb_n[2], tb[0], tb[1], tb[2]);
            }
            free(vt); free(gt); free(dvt);
            attention_logits_backward_x(model->dq, model->dk, qkh, dl, th, qc, qch, kc, kch, B, T, H, KV, hd, prec);
        }
        /* the Q/K path's gradients, between two buffers each, stored as qkh says */
        float *dq = model->dq, *dk = model->dk, *dq2 = model->dq2, *dk2 = model->dk2, *t;
        if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
            FAULT_BWD_X(SITE_Q_NORM, l, dq, qkh, (size_t)N * qd);
            FAULT_BWD_X(SITE_K_NORM, l, dk, qkh, (size_t)N * kd);
            rmsnorm_backward_x(dq2, qkh, NULL, dq, qkh, ACT_T(a, qr, SITE_Q_ROPE), model->h16[SITE_Q_ROPE], NULL, a->qf_ms, N * H, hd, eps, 0, prec);
            rmsnorm_backward_x(dk2, qkh, NULL, dk, qkh, ACT_T(a, kr, SITE_K_ROPE), model->h16[SITE_K_ROPE], NULL, a->kf_ms, N * KV, hd, eps, 0, prec);
            t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
        }
        FAULT_BWD_X(SITE_Q_ROPE, l, dq, qkh, (size_t)N * qd);
        FAULT_BWD_X(SITE_K_ROPE, l, dk, qkh, (size_t)N * kd);
        rope_backward_x(dq2, qkh, dq, qkh, model->rope_cos, model->rope_sin, B, T, H, hd, c->rope_style, model->precision);
        rope_backward_x(dk2, qkh, dk, qkh, model->rope_cos, model->rope_sin, B, T, KV, hd, c->rope_style, model->precision);
        t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
        if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {
            FAULT_BWD_X(SITE_Q_NORM, l, dq, qkh, (size_t)N * qd);
            FAULT_BWD_X(SITE_K_NORM, l, dk, qkh, (size_t)N * kd);
            rmsnorm_backward_x(dq2, qkh, GR(PT_QNORM, l), dq, qkh, ACT_T(a, q, SITE_Q_PROJ), model->h16[SITE_Q_PROJ], W(PT_QNORM, l), a->qn_ms, N * H, hd, eps, 0, prec);
            rmsnorm_backward_x(dk2, qkh, GR(PT_KNORM, l), dk, qkh, ACT_T(a, k, SITE_K_PROJ), model->h16[SITE_K_PROJ], W(PT_KNORM, l), a->kn_ms, N * KV, hd, eps, 0, prec);
            t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
        }
        FAULT_BWD_X(SITE_Q_PROJ, l, dq, qkh, (size_t)N * qd);
        FAULT_BWD_X(SITE_K_PROJ, l, dk, qkh, (size_t)N * kd);
        if (model->prot.on[PK_QK_BWD]) qk_bwd_recompute_check(model, l, B, T, qc, qch, kc, kch, dq, dk, qkh, dq2, dk2);
        exp_profile_x(model, PT_WQ, l, dq, qkh, (size_t)N * qd);
        exp_profile_x(model, PT_WK, l, dk, qkh, (size_t)N * kd);
        exp_profile_x(model, PT_WV, l, dv, vh, (size_t)N * kd);
        const void* an = ACT_T(a, attn_norm, SITE_ATTN_NORM);
        const int anh = model->h16[SITE_ATTN_NORM];
        matmul_backward_x(dbuf, GR(PT_WQ, l), dq, qkh, an, anh, W(PT_WQ, l), N, d, qd, 0, model->precision, 0);
        matmul_backward_x(dbuf, GR(PT_WK, l), dk, qkh, an, anh, W(PT_WK, l), N, d, kd, 1, model->precision, 0);
        matmul_backward_xo(dbuf, db16, GR(PT_WV, l), dv, vh, an, anh, W(PT_WV, l), N, d, kd, 1, model->precision, model->precision);
        STORE_GRAD_RND_X(SITE_ATTN_NORM, l, dg, dgh, (size_t)N * d);
        ew_keep_dres(model, dres, dh, (size_t)N * d);
        rmsnorm_backward_x(dres, dh, GR(PT_ATTN_NORM, l), dg, dgh, x_in, x_in_h, W(PT_ATTN_NORM, l), a->attn_ms, N, d, eps, 1, model->precision);
        res_x = x_in; res_xh = x_in_h; res_w = W(PT_ATTN_NORM, l); res_ms = a->attn_ms; res_acc = 1;
    }
    if (c->embed_norm) {
        rmsnorm_backward_x(dbuf, 0, GR(PT_EMBED_NORM, -1), dres, dh, emb, eh, W(PT_EMBED_NORM, -1), model->emb_ms, N, d, eps, 0, model->precision);
        dres = dbuf; dh = 0;
    }
    embedding_backward_x(GR(PT_WTE, -1), dres, dh, inputs, N, d);
}

/* --------------------------------------------------------------------------------- optimizer */

/* global L2 norm of the gradients (double, fixed order) */
static double grad_global_norm(const Model* model) { return sqrt(sumsq_det(model->grads, model->L.total)); }

/* torch.optim.AdamW semantics, step t (1-based): p *= 1 - lr*wd; m = lerp(m, g, 1-b1);
 * v = b2*v + (1-b2)*g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). Weight decay only on
 * matrices and embeddings. */
/* the scalars of AdamW step t, and one element's update in place (the arithmetic of both
 * adamw_update and model_update_norm, so that the norm is that of the update, bit for bit) */
typedef struct { float b1, b2, eps, step_size, bc2_sqrt; } AdamWStep;
static AdamWStep adamw_step(const AdamW* o, long long t) {
    double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
    AdamWStep s = {(float)o->beta1, (float)o->beta2, (float)o->eps, (float)(o->lr / bc1), (float)sqrt(bc2)};
    return s;
}
static inline void adamw_element(float* p, float* m, float* v, float g, float decay, const AdamWStep* s) {
    *p *= decay;
    *m += (1.0f - s->b1) * (g - *m);
    *v = *v * s->b2 + (1.0f - s->b2) * g * g;
    float denom = sqrtf(*v) / s->bc2_sqrt + s->eps;
    *p -= s->step_size * (*m / denom);
}
/* the update in place, in blocks of 2048 weights; in bf16 mode each block's bf16 copy (model_prepare_weights' wr) is
 * written right after it, while the block is in L1 (the same bits as the separate copy, one pass over the weights fewer) */
static void adamw_update(Model* model, const AdamW* o, long long t) {
    const AdamWStep st = adamw_step(o, t);
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* ti = &model->L.t[i];
        float decay = ti->decay ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
        float *p = model->params + ti->offset, *g = model->grads + ti->offset, *m = model->m + ti->offset, *v = model->v + ti->offset;
        float* wr = model->precision ? model->wr + ti->offset : NULL;
        size_t n = ti->numel, nb = (n + 2047) / 2048;
#pragma omp parallel for schedule(static)
        for (size_t b = 0; b < nb; b++) {
            size_t j0 = b * 2048, j1 = j0 + 2048 < n ? j0 + 2048 : n;
            for (size_t j = j0; j < j1; j++) adamw_element(&p[j], &m[j], &v[j], g[j], decay, &st);
            if (wr) bf16_round_copy_span(wr + j0, p + j0, (int)(j1 - j0));   /* while the block is in L1 */
        }
    }
    model->mmb_wn_valid = 0;
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

/* ------------------------------------------------------------------------ the backend API
 * What the shared training loop (llmc/host/train_loop.h) needs from a trainer; the CUDA trainer defines
 * the same functions over device memory. */
static size_t model_num_params(const Model* model) { return model->L.total; }
static void model_load_state(Model* model, const float* params, const float* m, const float* v) {
    size_t P = model->L.total;
    memcpy(model->params, params, P * sizeof(float));
    if (m) memcpy(model->m, m, P * sizeof(float)); else memset(model->m, 0, P * sizeof(float));
    if (v) memcpy(model->v, v, P * sizeof(float)); else memset(model->v, 0, P * sizeof(float));
    model_prepare_weights(model);
}
/* host views of the fp32 state (here the state itself) */
static void model_host_state(Model* model, const float** params, const float** m, const float** v) {
    *params = model->params; *m = model->m; *v = model->v;
}
static void model_set_tokens(Model* model, const int* inputs, const int* targets, int n) {
    memcpy(model->inputs, inputs, sizeof(int) * n);
    if (targets) memcpy(model->targets, targets, sizeof(int) * n);
}
static float model_forward_step(Model* model, int B, int T, int with_targets) {
    check_dump_fwd++;   /* the test-only dump's forward count (llmc/sdc/checks.h) */
    return model_forward(model, B, T, with_targets ? model->targets : NULL);
}
static void model_backward_step(Model* model, int B, int T, float dloss) {
    check_dump_bwd++;   /* the test-only dump's backward count (llmc/sdc/checks.h) */
    model_backward(model, B, T, model->targets, dloss);
}
static void model_zero_grads(Model* model) { memset(model->grads, 0, sizeof(float) * model->L.total); }
/* one MPI all-reduce after the backward; nothing is started inside it */
static void model_reduce_in_backward(Model* model, Dist* dist) { (void)model; (void)dist; }
/* the one-pass classifier: the next training forward computes the dlogits in its cross-entropy pass */
static void model_classifier_fused_next(Model* model, float dloss) { model->ce_fused_next = 1; model->ce_dloss = dloss; }
static void model_allreduce_grads(Model* model, Dist* dist) { dist_allreduce_sum_f32(dist, model->grads, model->L.total); }
/* clip, AdamW update t (1-based), refresh the weight copies; returns the pre-clip gradient norm */
static double model_update(Model* model, const AdamW* opt, long long t, double clip) {
    double norm = clip_grads(model, clip);
    adamw_update(model, opt, t);   /* and the weight copies (model_prepare_weights' work) */
    return norm;
}
/* the global gradient norm as the gradients are now (after all-reduce and unscale) */
static double model_grad_norm(Model* model) { return grad_global_norm(model); }
/* sum of squares of the gradients [off, off + n) (the backward guard's per-layer norms) */
static double model_grad_sumsq_range(Model* model, size_t off, size_t n) { return sumsq_det(model->grads + off, n); }
/* ||p' - p||_2 of the update model_update would make now (clip, AdamW t), computed without changing
 * any state: the harmful-update detector's update magnitude */
static double model_update_norm(Model* model, const AdamW* o, long long t, double clip, double grad_norm) {
    size_t P = model->L.total;
    if (!model->upd) model->upd = (float*)mallocCheck(sizeof(float) * P);
    float coef = 1.0f;   /* clip_grads' coefficient, applied to the gradient as scale_grads does */
    if (clip > 0 && clip / (grad_norm + 1e-6) < 1.0) coef = (float)(clip / (grad_norm + 1e-6));
    const AdamWStep st = adamw_step(o, t);
    for (int i = 0; i < model->L.n; i++) {
        const TensorInfo* ti = &model->L.t[i];
        float decay = ti->decay ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
        const float *p = model->params + ti->offset, *g = model->grads + ti->offset, *m = model->m + ti->offset, *v = model->v + ti->offset;
        float* d = model->upd + ti->offset;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < ti->numel; j++) {
            float pj = p[j], mj = m[j], vj = v[j];
            adamw_element(&pj, &mj, &vj, g[j] * coef, decay, &st);
            d[j] = pj - p[j];
        }
    }
    return sqrt(sumsq_det(model->upd, P));
}
/* per-token losses and argmax of the last forward (n tokens) */
static void model_token_losses(Model* model, int n, float* out) { memcpy(out, model->losses, sizeof(float) * n); }
static void model_argmax(Model* model, int n, int* out) {
    int V = model->c.vocab_size;
    float* zb = model->logits_h ? (float*)mallocCheck(sizeof(float) * V) : NULL;
    for (int i = 0; i < n; i++) {
        const float* z = zb;
        if (zb) bf16_unpack_span(zb, model->logits_h + (size_t)i * V, V);
        else z = model->logits + (size_t)i * V;
        int best = 0;
        for (int k = 1; k < V; k++) if (z[k] > z[best]) best = k;
        out[i] = best;
    }
    free(zb);
}
static void model_logits_row(Model* model, int row, float* out) {
    const size_t V = model->c.vocab_size;
    if (model->logits_h) bf16_unpack_span(out, model->logits_h + (size_t)row * V, (int)V);
    else memcpy(out, model->logits + (size_t)row * V, sizeof(float) * V);
}
static uint64_t model_weights_checksum(Model* model) { return tsdc_checksum(model->params, model->L.total * sizeof(float)); }
static int model_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static void model_set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* no device: no counts (-stats logs nothing) */
static int model_device_stats(Model* model, DeviceStats* st) { (void)model; DEVICE_STATS_UNKNOWN(st); return 0; }
/* grads *= s (exact for a power of two), and whether any gradient is non-finite */
static int model_unscale_check(Model* model, float s) {
    size_t P = model->L.total;
    float* g = model->grads;
    int bad = 0;
    if (s != 1.0f) {   /* one pass: each gradient scaled and checked while it is in a register */
#pragma omp parallel for reduction(| : bad) schedule(static)
        for (size_t i = 0; i < P; i++) { g[i] *= s; bad |= !isfinite(g[i]); }
    } else {
#pragma omp parallel for reduction(| : bad) schedule(static)
        for (size_t i = 0; i < P; i++) bad |= !isfinite(g[i]);
    }
    return bad;
}

DEFINE_MODEL_SITE_TENSOR(float)   /* llmc/sdc/fault.h; NULL for a tensor stored as bf16 bits: */
/* a site's forward tensor stored as bf16 bits (-precision bf16: the logits, site -1; the sites of model->h16), else NULL
 * (model_site_tensor gives it) */
static uint16_t* model_site_tensor_h(Model* model, int site, int l, int B, int T, size_t* n) {
    if (site < 0) { *n = (size_t)B * T * model->c.vocab_size; return model->logits_h; }
    if (!model->h16[site] || !site_exists(&model->c, site)) return NULL;
    LayerActs* a = &model->la[l];
    const size_t N = (size_t)B * T, d = model->c.d_model, F = model->c.ffn_dim, qd = (size_t)model->c.n_head * model->c.head_dim,
                 kd = (size_t)model->c.n_kv_head * model->c.head_dim;
    switch (site) {
        case SITE_ATTN_NORM: *n = N * d; return a->attn_norm_h;
        case SITE_Q_PROJ: *n = N * qd; return a->q_h;
        case SITE_K_PROJ: *n = N * kd; return a->k_h;
        case SITE_V_PROJ: *n = N * kd; return a->v_h;
        case SITE_Q_NORM: *n = N * qd; return model->c.qk_norm == QKNORM_WEIGHTED_PRE_ROPE ? a->qn_h : a->qf_h;
        case SITE_K_NORM: *n = N * kd; return model->c.qk_norm == QKNORM_WEIGHTED_PRE_ROPE ? a->kn_h : a->kf_h;
        case SITE_Q_ROPE: *n = N * qd; return a->qr_h;
        case SITE_K_ROPE: *n = N * kd; return a->kr_h;
        case SITE_ATT_OUT: *n = N * qd; return a->att_out_h;
        case SITE_O_PROJ: *n = N * d; return a->o_h;
        case SITE_ATTN_RESIDUAL: *n = N * d; return a->resid_mid_h;
        case SITE_BLOCK_OUT: *n = N * d; return a->out_h;
        case SITE_MLP_NORM: *n = N * d; return a->mlp_norm_h;
        case SITE_GATE_PROJ: *n = N * F; return a->gate_h;
        case SITE_UP_PROJ: *n = N * F; return a->up_h;
        case SITE_ACT: *n = N * F; return a->act_h;
        case SITE_MLP_PRODUCT: *n = N * F; return a->prod_h;
        case SITE_DOWN_PROJ: *n = N * d; return a->down_h;
        case SITE_ATT_LOGITS: *n = (size_t)B * model->c.n_head * T * T; return a->logits_h;
        case SITE_ATT_PROBS: *n = (size_t)B * model->c.n_head * T * T; return a->probs_h;
    }
    return NULL;
}
/* The trace reads att_logits / att_probs at every layer: a layer whose last forward took the fused path gets them
 * materialised from its stored q and k (the bits the materialised path would have stored: the same functions) */
static void model_materialise_attention(Model* model, int l) {
    const Config* c = &model->c;
    LayerActs* a = &model->la[l];
    if (!a->fused) return;
    int qch, kch;
    const void *qc = att_qk(model, a, 0, &qch), *kc = att_qk(model, a, 1, &kch);
    model_att_buffers(model, "the propagation trace (-trace_out)");
    const int th = model->att16;
    void *lg = ATT_TT(a, logits), *pr = ATT_TT(a, probs);
    attention_logits_forward_x(lg, th, qc, qch, kc, kch, model->last_B, model->last_T, c->n_head, c->n_kv_head, c->head_dim, model->precision);
    attention_softmax_forward_x(pr, th, lg, th, model->last_B, c->n_head, model->last_T, model->precision);
}
/* the snapshot: the activations and the logits and probs of every layer (two allocations, each copied whole) */
static void model_trace_snapshot(Model* model) {
    model_att_buffers(model, "the propagation trace (-trace_out)");
    for (int l = 0; l < model->c.n_layer; l++) model_materialise_attention(model, l);
    if (!model->trace_mem) model->trace_mem = (float*)mallocCheck(sizeof(float) * model->act_floats);
    if (!model->trace_att_mem) model->trace_att_mem = (float*)mallocCheck(sizeof(float) * model->att_floats);
    memcpy(model->trace_mem, model->act_mem, sizeof(float) * model->act_floats);
    memcpy(model->trace_att_mem, model->att_mem, sizeof(float) * model->att_floats);
}
static void model_trace_diff(Model* model, int site, int l, int B, int T, double* num, double* den) {
    size_t n;
    if (site == SITE_ATT_LOGITS || site == SITE_ATT_PROBS) model_materialise_attention(model, l);
    double a = 0, b = 0;
    const uint16_t* xh = model_site_tensor_h(model, site, l, B, T, &n);
    if (xh) {   /* bf16 bits in the activations (or the attention's tensors): the snapshot's bits at the same offset */
        const int in_att = model->att_mem && (const char*)xh >= (const char*)model->att_mem &&
                           (const char*)xh < (const char*)(model->att_mem + model->att_floats);
        const uint16_t* yh = in_att ? (const uint16_t*)((const char*)model->trace_att_mem + ((const char*)xh - (const char*)model->att_mem))
                                    : (const uint16_t*)((const char*)model->trace_mem + ((const char*)xh - (const char*)model->act_mem));
        for (size_t i = 0; i < n; i++) {
            double xv = bf16_bits_to_f32(xh[i]), yv = bf16_bits_to_f32(yh[i]), e = xv - yv;
            a += e * e; b += yv * yv;
        }
        *num = a; *den = b;
        return;
    }
    const float* x = model_site_tensor(model, site, l, B, T, &n);
    int in_att = model->att_mem && x >= model->att_mem && x < model->att_mem + model->att_floats;
    const float* y = in_att ? model->trace_att_mem + (x - model->att_mem) : model->trace_mem + (x - model->act_mem);
    for (size_t i = 0; i < n; i++) { double e = (double)x[i] - y[i]; a += e * e; b += (double)y[i] * y[i]; }
    *num = a; *den = b;
}

#ifndef TESTING
#define TRAINER_NAME "cpu"
#define TRAINER_DEFAULT_PRECISION 0
#define TRAINER_HAS_FP32 1
#define TRAINER_GPU 0
#define TRAINER_BF16_NAME "bf16 (emulated AMP)"
/* the GEMM path llmc/cpu/gemm.h chose from the CPU's flags */
static const char* cpu_kernels_desc(int precision) {
    static char s[160];
    if (precision) snprintf(s, sizeof(s), "GEMM %s (bf16 inputs, fp32 accumulation; TSDC_CPU_GEMM caps the path)", gemm_bf16_path());
    else snprintf(s, sizeof(s), "GEMM %s (fp32; TSDC_CPU_GEMM caps the path)", gemm_f32_path());
    return s;
}
#define TRAINER_KERNELS(precision) cpu_kernels_desc(precision)
#include "llmc/host/train_loop.h"
int main(int argc, char** argv) { return train_main(argc, argv); }
#endif
