/* train_sdc.cu: the GPU trainer.
 *
 * Same model family, flags, token shards, checkpoints and JSONL log as the CPU trainer (train_sdc.c):
 * the host loop is llmc/host/train_loop.h, shared by both; this file holds the model on the device and the
 * backend functions that loop calls. The math of each op is a kernel in an llmc .cuh file (contract:
 * docs/cuda_kernels.md), each the twin of a CPU function in llmc/cpu_kernels.h.
 *
 * Precision: bf16 AMP. fp32 master weights, gradients and AdamW state; a bf16 copy of every weight
 * (written by the AdamW kernel) feeds the math; activations and activation gradients are stored in
 * bf16; matmuls accumulate in fp32 (cuBLASLt, CUBLAS_COMPUTE_32F) and round a bf16 output once.
 * RMSNorm mean squares, losses and logsumexps are fp32.
 *
 * Fused projections: q, k, v are one GEMM over the adjacent weights [wq; wk; wv] ([qd + 2 kd, d], adjacent in
 * the parameter layout, llmc/host/config.h) into one [N, qd + 2 kd] buffer (a->qkv; q, k, v are views with
 * that row stride, ldqkv), gate and up one GEMM over [w_gate; w_up] into [N, 2F] (a->gu, ldgu = 2F). The
 * backward writes their gradients into the same layouts (model->dqkv, model->dgu) and runs one dW GEMM
 * into the adjacent gradients and one dx GEMM with K = qd + 2 kd (2F) each, the dx rounded to bf16 once by
 * the GEMM's epilogue. Precision: the CPU's -precision bf16 sums the three (two) products in fp32 and rounds
 * the sum once; the fused GEMM accumulates all K terms in fp32 and rounds once: the same single bf16
 * rounding, the fp32 sum in another order (as every GEMM here), so the two agree to fp32 reassociation
 * before that rounding. The checkpoint layout is unchanged.
 *
 * Determinism: no floating-point atomics in any training reduction, and every GEMM shape runs one
 * cached cuBLASLt algorithm; the same command on the same GPU gives the same bits.
 *
 * Data parallelism: mpirun launches one process per GPU; MPI carries the NCCL unique id; gradients are
 * summed with ncclAllReduce (the loss is pre-scaled by 1/(R*A*B*T), so the sum is the mean). Built
 * without NCCL (or MPI) the binary runs on one GPU and says so. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef USE_NCCL
#include <nccl.h>
#endif

#include "llmc/host/utils.h"
#include "llmc/cpu/bf16.h"
#include "llmc/host/checksum.h"
#include "llmc/host/config.h"
#include "llmc/host/dist.h"
#include "llmc/host/rng.h"
#include "llmc/cpu/rope.h"
#include "llmc/host/schedule.h"

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/flash_attention.cuh"
#include "llmc/cuda/rmsnorm.cuh"
#include "llmc/cuda/rope.cuh"
#include "llmc/cuda/qknorm_rope.cuh"
#include "llmc/cuda/mlp.cuh"
#include "llmc/cuda/residual.cuh"
#include "llmc/cuda/convert.cuh"
#include "llmc/cuda/embedding.cuh"
#include "llmc/cuda/classifier.cuh"
#include "llmc/cuda/adamw.cuh"
#include "llmc/cuda/global_norm.cuh"
#include "llmc/cuda/multi_tensor.cuh"
#include "llmc/sdc/fault.cuh"
#include "llmc/sdc/fingerprint.cuh"
#include "llmc/sdc/attcheck.cuh"
#include "llmc/sdc/ewcheck.cuh"
#include "llmc/sdc/bound.cuh"
#include "llmc/cuda/init.cuh"
#include "llmc/cuda/checksum.cuh"
#include "llmc/sdc/rgg.cuh"
#include "llmc/sdc/rgg.h"
#include "llmc/host/stats.h"
#include "llmc/sdc/checks.h"
#ifdef __CUDA_EMU__
#include "cuda_emu.h"   /* the emulation's counters (-stats) */
#endif

/* host synchronisations so far (the emulation counts them; a GPU build cannot, and reports -1) */
static long long host_syncs_now(void) {
#ifdef __CUDA_EMU__
    return (long long)emu_counters()->host_syncs;
#else
    return -1;
#endif
}

/* a layer's Q/K fingerprint accumulators in the report (fingerprint.cuh), forward (-protect qk) and backward (qk_bwd):
 * the tensors as stored (the forward's Q and K that attention consumes; the backward's gradients of q_proj, k_proj)
 * and their recomputation; the host compares them after the pass's one copy of the report */
enum { QKF_Q, QKF_K, QKF_RQ, QKF_RK, QKF_D, QKF_SLOTS };   /* QKF_D (backward): the flash backward's duplicated D differed */
#define QKF_BYTES ((size_t)QKF_SLOTS * FP_WORDS * sizeof(unsigned long long))

/* ------------------------------------------------------------------------------------- model */
typedef struct {                         /* all bf16 but the mean squares and lse (fp32); site names as on the CPU */
    bf16 *attn_norm; float *attn_ms;     /* attn_norm */
    bf16* qkv;                           /* [N, qd + 2 kd]: the fused projection's output; q, k, v are its column views */
    bf16 *q, *k, *v;                     /* q_proj k_proj v_proj: qkv, qkv + qd, qkv + qd + kd, row stride Model.ldqkv */
    bf16 *qn, *kn; float *qn_ms, *kn_ms; /* q_norm k_norm (Qwen3, before RoPE) */
    bf16 *qr, *kr;                       /* q_rope k_rope */
    bf16 *qf, *kf; float *qf_ms, *kf_ms; /* q_norm k_norm (nanochat, after RoPE) */
    bf16 *logits, *probs;                /* att_logits att_probs [B,H,T,T] (materialised path only; in Model.att_mem,
                                            NULL until something needs them: model_att_buffers) */
    float* lse;                          /* [B,H,T] row logsumexp of the fused path (its backward reads it) */
    int fused;                           /* this layer's last forward took the fused path (attention_fused) */
    bf16 *att_out, *o, *resid_mid;       /* att_out o_proj attn_residual */
    bf16 *mlp_norm; float *mlp_ms;       /* mlp_norm */
    bf16* gu;                            /* SwiGLU: [N, 2F], the fused gate/up output; ReLU^2: the fc output [N, F] */
    bf16 *gate, *up;                     /* gate_proj (fc) up_proj: gu, gu + F, row stride Model.ldgu (ReLU^2: F, up NULL) */
    bf16 *act, *prod, *down;             /* act mlp_product down_proj */
    bf16 *out;                           /* block_out */
} LayerActs;

/* The gradient buckets of the overlapped reduction: contiguous ranges of the one fp32 gradient buffer,
 * listed in the order the backward finishes writing them (grad_bucket_plan). */
#define GB_MAX (MAX_TENSORS / 4 + 2)   /* a layer has at least 4 tensors */
typedef struct {
    int n;                               /* buckets: the tail, each layer from the last down, the head */
    size_t off[GB_MAX], numel[GB_MAX];   /* in floats */
    int layer[GB_MAX];                   /* the layer a bucket holds; GB_TAIL, GB_HEAD */
} GradBuckets;
enum { GB_TAIL = -1, GB_HEAD = -2 };

/* The buckets, in the order the backward completes them: the tail (the tensors after the last layer's: final
 * norm, lm_head; written by the head GEMM's dW and the final norm's backward, before the layer loop), each
 * layer from the last down (a layer's tensors are contiguous and only its own backward writes them; the
 * bucket is complete at the end of its iteration), and the head (the tensors before layer 0: wte, the
 * embedding norm; written last, by embedding_backward; tied, wte also took the head GEMM's dW first).
 * Empty ranges are left out. Together they cover [0, P) once (test_sdc.cu grad_buckets). */
static void grad_bucket_plan(const ParamLayout* L, int n_layer, GradBuckets* gb) {
    memset(gb, 0, sizeof(*gb));
    if (n_layer + 2 > GB_MAX) tsdc_fail("internal: %d layers exceed the gradient buckets' %d", n_layer, GB_MAX - 2);
    size_t* lo = (size_t*)mallocCheck(sizeof(size_t) * n_layer);
    size_t* hi = (size_t*)mallocCheck(sizeof(size_t) * n_layer);
    for (int l = 0; l < n_layer; l++) { lo[l] = (size_t)-1; hi[l] = 0; }
    size_t covered = 0;
    for (int i = 0; i < L->n; i++) {
        const TensorInfo* t = &L->t[i];
        if (t->layer < 0) continue;
        if (t->offset < lo[t->layer]) lo[t->layer] = t->offset;
        if (t->offset + t->numel > hi[t->layer]) hi[t->layer] = t->offset + t->numel;
        covered += t->numel;
    }
    for (int l = 0; l < n_layer; l++)
        if (lo[l] >= hi[l] || (l > 0 && lo[l] != hi[l - 1])) tsdc_fail("internal: layer %d's parameters are not one range after layer %d's", l, l - 1);
    if (covered != hi[n_layer - 1] - lo[0]) tsdc_fail("internal: a global tensor lies between the layers' parameters");
#define GB_ADD(o, n_, tag) do { if ((n_) > 0) { gb->off[gb->n] = (o); gb->numel[gb->n] = (n_); gb->layer[gb->n] = (tag); gb->n++; } } while (0)
    GB_ADD(hi[n_layer - 1], L->total - hi[n_layer - 1], GB_TAIL);
    for (int l = n_layer - 1; l >= 0; l--) GB_ADD(lo[l], hi[l] - lo[l], l);
    GB_ADD((size_t)0, lo[0], GB_HEAD);
#undef GB_ADD
    free(lo); free(hi);
}

typedef struct {
    Config c;
    ParamLayout L;
    int* tidx;
    int B, T, precision;
    /* device state */
    float *params, *grads, *m, *v;       /* fp32 [P] */
    bf16* wbf;                           /* bf16 copy of the weights [P] */
    float *rope_cos, *rope_sin;          /* [T, hd/2] */
    bf16 *emb, *x0; float* emb_ms;
    LayerActs* la;
    bf16* final_norm; float* final_ms;
    bf16* logits;                        /* [N, V]; dlogits in place in the backward */
    float *lse, *losses;                 /* [N]; losses lives in the report (rep_dev) */
    int *inputs, *targets;               /* [N] device */
    int ldqkv, ldgu;                     /* row strides of the fused views: qd + 2 kd; 2F (SwiGLU) or F (ReLU^2) */
    /* backward scratch */
    bf16 *dres, *dbuf, *dq, *dq2, *dk, *dk2, *datt, *dF, *dF2;
    bf16* dqkv;                          /* [N, qd + 2 kd]: the gradients of q_proj, k_proj, v_proj (the views
                                            dqkv, + qd, + qd + kd), what the fused dW and dx GEMMs read */
    bf16* dgu;                           /* SwiGLU: [N, 2F], the gradients of gate_proj and up_proj (dgu, + F); NULL for ReLU^2 */
    float* ms_scratch;                   /* fp32 [N * n_head]: the Q/K recomputation's mean squares */
    int* argmax;                         /* [N] */
    /* host mirrors for checkpoints and the loop */
    float *h_params, *h_m, *h_v;
    float* h_losses;
    int* h_targets;                      /* host copy of the targets of the current microbatch */
    bf16* h_row;
    cudaStream_t stream;
    void* act_mem;
    size_t act_bytes;
    void* trace_mem;                     /* device snapshot of act_mem for the propagation trace */
    void* att_mem;                       /* every layer's logits and probs (model_att_buffers), NULL until needed */
    size_t att_bytes;
    void* trace_att_mem;                 /* device snapshot of att_mem for the trace */
    Protect prot;                        /* protection and fault injection state (llmc/sdc/checks.h, llmc/host/backend.h) */
    bf16* att_scratch;                   /* [B,H,T,T] for att_logits/att_probs faults (model_att_scratch), else NULL */
    bf16* att_out_clean;                 /* [N, H*hd]: att_out before a forward att_out fault on the fused path, else NULL */
    int att_materialised;                /* 1: the materialised attention at every layer (model_set_attention_materialised) */
    int last_B, last_T;                  /* shape of the last forward (the trace materialises with it) */
    int* chk_dev;                        /* attention checks: flags [n_layer][ATTC_NCHECK][B*H] (device, zeroed per
                                            forward; the counts are in the report), NULL until used */
    double* chk_scratch;                 /* attcheck_scratch_doubles(B, H, T) (device) */
    int* chkb_dev;                       /* the backward's attention checks (-protect att_bwd): flags [n_layer][ATTB_NCHECK]
                                            [B*H] (device, zeroed per backward), NULL until used */
    bf16* qkb_scratch;                   /* -protect qk_bwd's recomputation: [2 N qd + 3 N kd] (device), NULL until used */
    float* mmb_wn;                       /* -protect bound: weight row norms [n_layer][kd + 2d + 2F] (device, allocated
                                            before the first forward's layer loop) */
    int mmb_wn_valid;                    /* mmb_wn is of the current weights (cleared by every change of them) */
    MmbJob *mmb_jobs, *mmb_hjobs;        /* -protect bound: the weights' row-norm jobs (device, host), mmb_njobs of them */
    int mmb_njobs;
    double* mmb_rss;                     /* -protect bound: att_out's rows' sums of squares a head [B*T][H], from the flash
                                          * forward, for o's check in the residual add and norm */
    float* mmb_xn;                       /* -protect bound: the rows' norms of mlp_norm [B*T] as its kernel stored it, for
                                            the gate/up check fused into SwiGLU's forward (allocated with mmb_wn) */
    float* mmb_pn;                       /* ... and of SwiGLU's product [B*T] as it stored it, for down's check fused into
                                            the block's residual add and next norm */
    float* mmb_an;                       /* ... and of attn_norm [B*T] as its kernel stored it, for v's check riding on the
                                            launch that rotates q and k */
    bf16* ew_dres;                       /* -protect ew: dres kept before a norm backward accumulates into it, then the
                                            accumulation rerun on it [N, d] (device, allocated before the first backward's loop) */
    size_t* upd_seg_end;                 /* model_update_norm: end offset and decay flag per tensor (device), */
    int* upd_seg_decay;                  /*   NULL until used */
    /* The report: what the host reads after a forward, in one pinned asynchronous copy per microbatch
     *, laid out as: rgg_ss, rgg_bad double [2L+1] (llmc/sdc/rgg.cuh; vector 2l = layer l's
     * attn_ms, 2l+1 its mlp_ms, 2L the final norm's), qk unsigned long long [L][QKF_SLOTS][FP_WORDS] (the layer's
     * Q/K fingerprint accumulators: the forward's Q and K, their recomputation's; compared on the host),
     * attc int [L][ATTC_NCHECK] (the attention checks' failed heads), ew int [L][EW_FWD_SLOTS] (the
     * forward's element-wise checks, llmc/sdc/ewcheck.cuh), losses float [B*T]; then the backward's part (rep_bwd,
     * below: its own copy at the backward's end, model_backward_step). Byte
     * offsets rep_*; the copy covers everything up to the losses, and the losses when there are targets. */
    char *rep_dev, *rep_host;
    size_t rep_bad, rep_qk, rep_attc, rep_ew, rep_mmb, rep_ewb, rep_loss;
    /* the backward's report, after the losses, in its own pinned copy at the end of the backward (only when a
     * backward check is on): qkb unsigned long long [L][QKF_SLOTS][FP_WORDS] (the fingerprints of the layer's stored
     * dq/dk and of their recomputation), attb int [L]
     * [ATTB_NCHECK] (the backward attention checks' failed heads), ewb int [L][EW_BWD_SLOTS] (ew's backward flags,
     * at rep_ewb); rep_bwd_bytes long */
    size_t rep_bwd, rep_bwd_bytes;
    const float** ms_table;              /* device [2L+1]: the mean-square vectors in the report's order */
    /* the optimizer pass (llmc/cuda/multi_tensor.cuh): the tensors' chunk table, the per-tensor sums of squares
     * of the gradients (device, and a pinned host copy) and their scratch */
    MtTable mt;
    MtRows mt_rows;                      /* -protect bound: the AdamW launch's chunks with the weights' row norms inside
                                          * (multi_tensor.cuh MtRows; built with the norm jobs; first NULL: not built) */
    double *ss_dev, *ss_host, *mt_part;
    double norm2;                        /* the global sum of squares (host: the tensors' sums in order) */
    int norms_valid;                     /* ss_host / norm2 hold the current gradients' (x unscale) */
    float unscale;                       /* exponent scaling's 2^-k, folded into the norms and AdamW (1: none) */
    int grads_fresh;                     /* the next backward overwrites the gradients (beta 0) instead of adding */
    long long loop_syncs;                /* host synchronisations inside the forward's and backward's layer loops */
    /* the gradient reduction over the ranks, overlapped with the backward (model_reduce_in_backward) */
    GradBuckets gb;                      /* the bucket plan (grad_bucket_plan), in the order the backward completes them */
    cudaStream_t comm;                   /* the buckets' all-reduces run here (created on first use) */
    cudaEvent_t* bucket_ready;           /* [gb.n]: recorded on the main stream after a bucket's last gradient kernel */
    cudaEvent_t comm_done;               /* recorded on comm after the last bucket; the main stream waits for it */
    Dist* reduce_dist;                   /* non-NULL: the next backward reduces its buckets as it completes them */
    int gb_next;                         /* the next bucket the armed backward completes */
    int grads_reduced;                   /* that backward launched every bucket: model_allreduce_grads only joins */
    /* the one-pass classifier (model_classifier_fused_next) */
    int ce_fused_next;                   /* the next forward with targets writes dlogits over the logits ... */
    float ce_dloss;                      /* ... for this dloss */
    int dlogits_ready;                   /* the last forward did: the backward starts from dlogits */
} Model;

#include "llmc/host/backend.h"   /* the functions the host loop calls, declared for this Model; the protection accessors */

static int tensor_index(const Model* m, int type, int layer) { return m->tidx[(layer < 0 ? m->c.n_layer : layer) * PT_COUNT + type]; }
template <typename TT> static TT* tensor_ptr(const Model* m, TT* base, int type, int layer) {
    int i = tensor_index(m, type, layer);
    return i < 0 ? NULL : base + m->L.t[i].offset;
}
#define W(type, l) tensor_ptr(model, model->wbf, type, l)
#define GR(type, l) tensor_ptr(model, model->grads, type, l)
/* fault injection points (see train_sdc.c): a module output, or the gradient of that output */
#define FAULT_AT(pass, site, l, x, n) do { if (fault_due(model->prot.fx, (site), (l), (pass))) fault_apply_device(model->prot.fx, (x), (size_t)(n), s); } while (0)
#define FAULT_FWD(site, l, x, n) FAULT_AT(PASS_FWD, site, l, x, n)
#define FAULT_BWD(site, l, x, n) FAULT_AT(PASS_BWD, site, l, x, n)
/* the same at a [rows, cols] view with the row stride ld (q/k/v, gate/up and their gradients): logical index i of
 * the CPU's contiguous [rows, cols] tensor is the element at row i / cols, column i % cols (fault_apply_device_ld) */
#define FAULT_AT_LD(pass, site, l, x, rows, cols, ld) do { if (fault_due(model->prot.fx, (site), (l), (pass))) \
    fault_apply_device_ld(model->prot.fx, (x), (size_t)(rows), (size_t)(cols), (size_t)(ld), s); } while (0)
#define FAULT_FWD_LD(site, l, x, rows, cols, ld) FAULT_AT_LD(PASS_FWD, site, l, x, rows, cols, ld)
#define FAULT_BWD_LD(site, l, x, rows, cols, ld) FAULT_AT_LD(PASS_BWD, site, l, x, rows, cols, ld)
/* a backward fault at a site whose gradient g [n] also flows down the skip path: when one is due, g is copied into
 * copy and the fault goes there, so only the site's own backward sees it; returns what that backward reads */
static const bf16* fault_bwd_private(Model* model, int site, int l, const bf16* g, bf16* copy, size_t n, cudaStream_t s) {
    if (!fault_due(model->prot.fx, site, l, PASS_BWD)) return g;
    cudaCheck(cudaMemcpyAsync(copy, g, sizeof(bf16) * n, cudaMemcpyDeviceToDevice, s));
    fault_apply_device(model->prot.fx, copy, n, s);
    return copy;
}

/* att_logits / att_probs faults: attention_forward / attention_backward are fused (no stored tensor
 * between their steps is read back), so when such a fault is due the affected steps are redone with the
 * split launchers of llmc/cuda/attention.cuh; with no such fault due the fused path runs unchanged. Their
 * scratch: one bf16 [B,H,T,T] buffer outside the activations (so outside the trace snapshot), allocated
 * on the first use. One event hits one site in one pass, so at most one use is live at a time. */
static bf16* model_att_scratch(Model* model) {
    if (!model->att_scratch) {
        size_t n = (size_t)model->B * model->c.n_head * model->T * model->T;
        cudaError_t e = cudaMalloc(&model->att_scratch, n * sizeof(bf16));
        if (e != cudaSuccess)
            tsdc_fail("cannot allocate %.2f GiB of attention scratch for an att_logits/att_probs fault: %s", n * 2 / 1073741824.0,
                      cudaGetErrorString(e));
    }
    return model->att_scratch;
}
/* forward, after attention_forward: a fault in the logits reaches the probs of the rows it hit (softmax
 * from the bf16 logits, the CPU's -precision bf16; the other rows keep their bits) and the output; a fault
 * in the probs reaches the output through a copy masked at s > t (the CPU reads only s <= t; the tensor
 * keeps what was injected, as the CPU's) */
static void attention_forward_faults(Model* model, LayerActs* a, int l, int B, int T, cudaStream_t s) {
    CostScope cost_scope(COST_FAULT);   /* the split steps redone for a fault */
    const Config* c = &model->c;
    const int H = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    const size_t natt = (size_t)B * H * T * T;
    if (fault_due(model->prot.fx, SITE_ATT_LOGITS, l, PASS_FWD)) {
        bf16* before = model_att_scratch(model);
        cudaCheck(cudaMemcpyAsync(before, a->logits, natt * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
        fault_apply_device(model->prot.fx, a->logits, natt, s);
        attention_softmax_from_logits(a->probs, a->logits, before, B, H, T, s);
        attention_av(a->att_out, a->probs, a->v, B, T, H, KV, hd, model->ldqkv, s);
    }
    if (fault_due(model->prot.fx, SITE_ATT_PROBS, l, PASS_FWD)) {
        fault_apply_device(model->prot.fx, a->probs, natt, s);
        bf16* pm = model_att_scratch(model);
        attention_causal_mask(pm, a->probs, B, H, T, s);
        attention_av(a->att_out, pm, a->v, B, T, H, KV, hd, model->ldqkv, s);
    }
}

/* Fused attention (llmc/cuda/flash_attention.cuh: no [B,H,T,T] tensor written) at layer l, unless something
 * needs the materialised logits and probs there: -detect abft (ATTNChecker's column checksums of the stored
 * tensors; -protect att and att_bwd run inside the fused kernels, llmc/sdc/attcheck.cuh), an att_logits / att_probs fault due at this layer in this microbatch (either pass: the
 * backward injection needs the stored probs), model_set_attention_materialised, or a head_dim the fused
 * kernels lack. The forward records the choice in the layer (a->fused); the backward follows it. A layer
 * that switches for a fault event differs from the fused run at the bf16 rounding level (see the README). */
static int attention_fused(const Model* model, int l) {
    const FaultCtx* fx = model->prot.fx;
    if (model->att_materialised || model->prot.abft || !flash_attention_supported(model->c.head_dim))
        return 0;
    return !(fault_due_flips(fx, SITE_ATT_LOGITS, l, PASS_FWD) || fault_due_flips(fx, SITE_ATT_PROBS, l, PASS_FWD) ||
             fault_due_flips(fx, SITE_ATT_LOGITS, l, PASS_BWD) || fault_due_flips(fx, SITE_ATT_PROBS, l, PASS_BWD));
}

/* an att_logits / att_probs event due at layer l in `pass` on the fused path flips nothing (attention_fused keeps
 * the fused path only for m = 0): logged as the CPU logs it, but with the rms of a [B,H,T,T] tensor the fused
 * kernels never store as NaN */
static void attention_fused_log_empty(Model* model, int l, int B, int T, int pass) {
    FaultCtx* fx = model->prot.fx;
    const size_t natt = (size_t)B * model->c.n_head * T * T;
    if (fault_due(fx, SITE_ATT_LOGITS, l, pass) || fault_due(fx, SITE_ATT_PROBS, l, pass)) fault_log_event(fx, natt, 0, 0, NAN, NAN);
}
/* The materialised path's logits and probs, bf16 [B,H,T,T] each for every layer (2 L B H T^2 elements, the
 * model's B and T), in one allocation outside the activations, made the first time something needs them: a
 * forward with a layer on the materialised path (attention_fused: -detect abft, an att_logits /
 * att_probs fault due, model_set_attention_materialised, a head_dim the fused kernels lack; allocated before
 * the layer loop, so no allocation happens inside it) or the propagation trace (model_trace_snapshot). A run
 * that never needs them never allocates them. `why` names the need in the error when the allocation fails. */
static void model_att_buffers(Model* model, const char* why) {
    if (model->att_mem) return;
    const size_t att = (size_t)model->B * model->c.n_head * model->T * model->T;
    const size_t per = (att * sizeof(bf16) + 255) / 256 * 256;
    const size_t bytes = 2 * per * model->c.n_layer;
    cudaError_t e = cudaMalloc(&model->att_mem, bytes);
    if (e != cudaSuccess) {
        model->att_mem = NULL;
        tsdc_fail("cannot allocate %.2f GiB for the materialised attention's logits and probs (2 x [B %d, H %d, T %d, T] bf16 a layer, "
                  "%d layers), which %s needs: %s; lower -B or -seq", bytes / 1073741824.0, model->B, model->c.n_head, model->T,
                  model->c.n_layer, why, cudaGetErrorString(e));
    }
    model->att_bytes = bytes;
    cudaCheck(cudaMemset(model->att_mem, 0, bytes));
    for (int l = 0; l < model->c.n_layer; l++) {
        model->la[l].logits = (bf16*)((char*)model->att_mem + 2 * per * l);
        model->la[l].probs = (bf16*)((char*)model->att_mem + 2 * per * l + per);
    }
}
/* what makes a forward take the materialised path somewhere (the error message of model_att_buffers) */
static const char* model_materialised_reason(const Model* model) {
    if (model->att_materialised) return "model_set_attention_materialised";
    if (model->prot.abft) return "-detect abft";
    if (!flash_attention_supported(model->c.head_dim)) return "this head_dim (no fused attention kernel)";
    return "an att_logits / att_probs fault event";
}

/* the fused backward takes D = rowsum(dout * out) from the stored out; a forward att_out fault must not
 * reach it there (the CPU's backward reads the probs, not out): the clean out is kept aside first */
static bf16* model_att_out_clean(Model* model) {
    if (!model->att_out_clean)
        cudaCheck(cudaMalloc(&model->att_out_clean, (size_t)model->B * model->T * model->c.n_head * model->c.head_dim * sizeof(bf16)));
    return model->att_out_clean;
}

static void model_build(Model* model, const Config* c, int B, int T, int precision) {
    memset(model, 0, sizeof(*model));
    model->c = *c; model->B = B; model->T = T; model->precision = precision;
    for (int k = 0; k < CHECK_KINDS; k++) model->prot.first_layer[k] = -1;
    param_layout_build(c, &model->L);
    model->tidx = param_tensor_index(c, &model->L);
    cudaCheck(cudaStreamCreate(&model->stream));
    size_t P = model->L.total;
    cudaCheck(cudaMalloc(&model->params, P * sizeof(float)));
    cudaCheck(cudaMalloc(&model->grads, P * sizeof(float)));
    cudaCheck(cudaMalloc(&model->m, P * sizeof(float)));
    cudaCheck(cudaMalloc(&model->v, P * sizeof(float)));
    cudaCheck(cudaMalloc(&model->wbf, P * sizeof(bf16)));
    cudaCheck(cudaMemset(model->grads, 0, P * sizeof(float)));
    cudaCheck(cudaMemset(model->m, 0, P * sizeof(float)));
    cudaCheck(cudaMemset(model->v, 0, P * sizeof(float)));
    {   /* the chunk table of the optimizer pass: every tensor, in layout order (contiguous) */
        const int n = model->L.n;
        size_t *off = (size_t*)mallocCheck(sizeof(size_t) * n), *numel = (size_t*)mallocCheck(sizeof(size_t) * n);
        int* dk = (int*)mallocCheck(sizeof(int) * n);
        size_t end = 0;
        for (int i = 0; i < n; i++) {
            const TensorInfo* ti = &model->L.t[i];
            if (ti->offset != end) tsdc_fail("internal: the optimizer pass needs the tensors contiguous in layout order");
            off[i] = ti->offset; numel[i] = ti->numel; dk[i] = ti->decay;
            end += ti->numel;
        }
        if (end != P) tsdc_fail("internal: the tensors cover %zu of %zu parameters", end, P);
        mt_table_build(&model->mt, n, off, numel, dk);
        free(off); free(numel); free(dk);
        cudaCheck(cudaMalloc(&model->ss_dev, sizeof(double) * n));
        cudaCheck(cudaMallocHost(&model->ss_host, sizeof(double) * n));
        cudaCheck(cudaMalloc(&model->mt_part, sizeof(double) * (model->mt.n_chunks > 0 ? model->mt.n_chunks : 1)));
        model->unscale = 1.0f;
        model->grads_fresh = 0;          /* the memset above zeroed them: adding is right too */
    }
    grad_bucket_plan(&model->L, c->n_layer, &model->gb);
    model->h_params = (float*)mallocCheck(P * sizeof(float));
    model->h_m = (float*)mallocCheck(P * sizeof(float));
    model->h_v = (float*)mallocCheck(P * sizeof(float));

    int half = c->head_dim / 2;
    float* hc = (float*)mallocCheck(sizeof(float) * T * half);
    float* hs = (float*)mallocCheck(sizeof(float) * T * half);
    rope_tables(c, T, hc, hs);
    cudaCheck(cudaMalloc(&model->rope_cos, sizeof(float) * T * half));
    cudaCheck(cudaMalloc(&model->rope_sin, sizeof(float) * T * half));
    cudaCheck(cudaMemcpy(model->rope_cos, hc, sizeof(float) * T * half, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->rope_sin, hs, sizeof(float) * T * half, cudaMemcpyHostToDevice));
    free(hc); free(hs);

    /* activations: one allocation carved into tensors (sizes in elements; bf16 unless noted) */
    size_t N = (size_t)B * T, d = c->d_model, qd = (size_t)c->n_head * c->head_dim, kd = (size_t)c->n_kv_head * c->head_dim;
    size_t F = c->ffn_dim, V = c->vocab_size, H = c->n_head, KV = c->n_kv_head;
    const size_t qkvd = qd + 2 * kd;
    model->ldqkv = (int)qkvd;
    model->ldgu = (int)(c->mlp == MLP_SWIGLU ? 2 * F : F);
    {   /* the fused GEMMs read [wq; wk; wv] and [w_gate; w_up] as one matrix: adjacent in the layout (weights,
         * gradients and their bf16 copy alike, one offset for all) */
        for (int l = 0; l < c->n_layer; l++) {
            const TensorInfo *tq = &model->L.t[tensor_index(model, PT_WQ, l)], *tk = &model->L.t[tensor_index(model, PT_WK, l)],
                             *tv = &model->L.t[tensor_index(model, PT_WV, l)];
            if (tk->offset != tq->offset + tq->numel || tv->offset != tk->offset + tk->numel)
                tsdc_fail("internal: layer %d's wq, wk, wv are not adjacent in the parameter layout", l);
            if (c->mlp == MLP_SWIGLU) {
                const TensorInfo *tg = &model->L.t[tensor_index(model, PT_WGATE, l)], *tu = &model->L.t[tensor_index(model, PT_WUP, l)];
                if (tu->offset != tg->offset + tg->numel) tsdc_fail("internal: layer %d's w_gate, w_up are not adjacent", l);
            }
        }
    }
    size_t bytes = 0;
    /* first pass computes the size, second pass carves */
    for (int pass = 0; pass < 2; pass++) {
        char* p = (char*)model->act_mem;
        size_t off = 0;
#define CARVE_BF(ptr, n) do { if (pass) (ptr) = (bf16*)(p + off); off += ((n) * sizeof(bf16) + 255) / 256 * 256; } while (0)
#define CARVE_F(ptr, n) do { if (pass) (ptr) = (float*)(p + off); off += ((n) * sizeof(float) + 255) / 256 * 256; } while (0)
#define CARVE_I(ptr, n) do { if (pass) (ptr) = (int*)(p + off); off += ((n) * sizeof(int) + 255) / 256 * 256; } while (0)
        CARVE_BF(model->emb, N * d); CARVE_F(model->emb_ms, N); CARVE_BF(model->x0, N * d);
        if (pass) model->la = (LayerActs*)callocCheck(c->n_layer, sizeof(LayerActs));
        for (int l = 0; l < c->n_layer; l++) {
            LayerActs* a = pass ? &model->la[l] : NULL;
            LayerActs dummy; if (!pass) a = &dummy;
            CARVE_BF(a->attn_norm, N * d); CARVE_F(a->attn_ms, N);
            CARVE_BF(a->qkv, N * qkvd);
            if (pass) { a->q = a->qkv; a->k = a->qkv + qd; a->v = a->qkv + qd + kd; }
            if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {
                CARVE_BF(a->qn, N * qd); CARVE_BF(a->kn, N * kd); CARVE_F(a->qn_ms, N * H); CARVE_F(a->kn_ms, N * KV);
            }
            CARVE_BF(a->qr, N * qd); CARVE_BF(a->kr, N * kd);
            if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
                CARVE_BF(a->qf, N * qd); CARVE_BF(a->kf, N * kd); CARVE_F(a->qf_ms, N * H); CARVE_F(a->kf_ms, N * KV);
            }
            CARVE_F(a->lse, N * H);   /* logits, probs: model_att_buffers */
            CARVE_BF(a->att_out, N * qd); CARVE_BF(a->o, N * d); CARVE_BF(a->resid_mid, N * d);
            CARVE_BF(a->mlp_norm, N * d); CARVE_F(a->mlp_ms, N);
            CARVE_BF(a->gu, N * (size_t)model->ldgu); CARVE_BF(a->act, N * F);
            if (pass) { a->gate = a->gu; a->up = c->mlp == MLP_SWIGLU ? a->gu + F : NULL; }
            if (c->mlp == MLP_SWIGLU) CARVE_BF(a->prod, N * F);
            CARVE_BF(a->down, N * d); CARVE_BF(a->out, N * d);
        }
        CARVE_BF(model->final_norm, N * d); CARVE_F(model->final_ms, N);
        CARVE_BF(model->logits, N * V); CARVE_F(model->lse, N);
        CARVE_I(model->inputs, N); CARVE_I(model->targets, N); CARVE_I(model->argmax, N);
        CARVE_BF(model->dres, N * d); CARVE_BF(model->dbuf, N * d);
        CARVE_BF(model->dq, N * qd); CARVE_BF(model->dq2, N * qd); CARVE_BF(model->datt, N * qd);
        CARVE_BF(model->dk, N * kd); CARVE_BF(model->dk2, N * kd); CARVE_BF(model->dqkv, N * qkvd);
        CARVE_BF(model->dF, N * F); CARVE_BF(model->dF2, N * F);
        if (c->mlp == MLP_SWIGLU) CARVE_BF(model->dgu, N * 2 * F);
        CARVE_F(model->ms_scratch, N * H);
#undef CARVE_BF
#undef CARVE_F
#undef CARVE_I
        if (!pass) {
            bytes = off;
            cudaError_t e = cudaMalloc(&model->act_mem, bytes);
            if (e != cudaSuccess)
                tsdc_fail("cannot allocate %.2f GiB of activations for B %d x T %d (%s): lower -B or -seq", bytes / 1073741824.0,
                          B, T, cudaGetErrorString(e));
        }
    }
    model->act_bytes = bytes;
    cudaCheck(cudaMemset(model->act_mem, 0, bytes));
    /* the report (see Model) and what fills it */
    {
        const size_t nv = 2 * (size_t)c->n_layer + 1;
        model->rep_bad = nv * sizeof(double);
        model->rep_qk = 2 * nv * sizeof(double);
        model->rep_attc = model->rep_qk + (size_t)c->n_layer * QKF_BYTES;
        model->rep_ew = model->rep_attc + (size_t)c->n_layer * ATTC_NCHECK * sizeof(int);
        model->rep_mmb = model->rep_ew + (size_t)c->n_layer * EW_FWD_SLOTS * sizeof(int);
        model->rep_loss = (model->rep_mmb + (size_t)c->n_layer * MMB_SLOTS * sizeof(int) + 15) / 16 * 16;
        /* the backward's part after the losses: qk_bwd flags, att_bwd counts, then ew's backward flags (rep_ewb),
         * all in the backward's one copy */
        model->rep_bwd = (model->rep_loss + N * sizeof(float) + 15) / 16 * 16;
        model->rep_ewb = model->rep_bwd + (size_t)c->n_layer * (QKF_BYTES + ATTB_NCHECK * sizeof(int));
        model->rep_bwd_bytes = (size_t)c->n_layer * (QKF_BYTES + (ATTB_NCHECK + EW_BWD_SLOTS) * sizeof(int));
        const size_t rb = model->rep_bwd + model->rep_bwd_bytes;
        cudaCheck(cudaMalloc(&model->rep_dev, rb));
        cudaCheck(cudaMemset(model->rep_dev, 0, rb));
        cudaCheck(cudaMallocHost(&model->rep_host, rb));
        memset(model->rep_host, 0, rb);
        model->losses = (float*)(model->rep_dev + model->rep_loss);
        const float** tab = (const float**)mallocCheck(nv * sizeof(float*));
        for (int l = 0; l < c->n_layer; l++) { tab[2 * l] = model->la[l].attn_ms; tab[2 * l + 1] = model->la[l].mlp_ms; }
        tab[nv - 1] = model->final_ms;
        cudaCheck(cudaMalloc(&model->ms_table, nv * sizeof(float*)));
        cudaCheck(cudaMemcpy(model->ms_table, tab, nv * sizeof(float*), cudaMemcpyHostToDevice));
        free(tab);
    }
    model->h_losses = (float*)(model->rep_host + model->rep_loss);
    model->h_targets = (int*)mallocCheck(sizeof(int) * N);
    model->h_row = (bf16*)mallocCheck(sizeof(bf16) * V);
    matmul_init();
}

static void model_free(Model* model) {
    cudaCheck(cudaFree(model->params)); cudaCheck(cudaFree(model->grads)); cudaCheck(cudaFree(model->m));
    cudaCheck(cudaFree(model->v)); cudaCheck(cudaFree(model->wbf)); cudaCheck(cudaFree(model->rope_cos));
    cudaCheck(cudaFree(model->rope_sin)); cudaCheck(cudaFree(model->act_mem));
    if (model->trace_mem) cudaCheck(cudaFree(model->trace_mem));
    if (model->att_mem) cudaCheck(cudaFree(model->att_mem));
    if (model->trace_att_mem) cudaCheck(cudaFree(model->trace_att_mem));
    if (model->att_scratch) cudaCheck(cudaFree(model->att_scratch));
    if (model->att_out_clean) cudaCheck(cudaFree(model->att_out_clean));
    if (model->chk_dev) cudaCheck(cudaFree(model->chk_dev));
    if (model->chkb_dev) cudaCheck(cudaFree(model->chkb_dev));
    if (model->qkb_scratch) cudaCheck(cudaFree(model->qkb_scratch));
    if (model->mmb_wn) {
        cudaCheck(cudaFree(model->mmb_wn)); cudaCheck(cudaFree(model->mmb_xn)); cudaCheck(cudaFree(model->mmb_pn)); cudaCheck(cudaFree(model->mmb_an)); cudaCheck(cudaFree(model->mmb_rss));
    }
    if (model->mmb_jobs) { cudaCheck(cudaFree(model->mmb_jobs)); free(model->mmb_hjobs); }
    if (model->ew_dres) cudaCheck(cudaFree(model->ew_dres));
    cudaCheck(cudaFree(model->rep_dev)); cudaCheck(cudaFreeHost(model->rep_host));
    cudaCheck(cudaFree(model->ms_table));
    if (model->chk_scratch) cudaCheck(cudaFree(model->chk_scratch));
    mt_table_free(&model->mt);
    mt_rows_free(&model->mt_rows);
    cudaCheck(cudaFree(model->ss_dev)); cudaCheck(cudaFreeHost(model->ss_host)); cudaCheck(cudaFree(model->mt_part));
    if (model->upd_seg_end) cudaCheck(cudaFree(model->upd_seg_end));
    if (model->upd_seg_decay) cudaCheck(cudaFree(model->upd_seg_decay));
    cudaCheck(cudaStreamDestroy(model->stream));
    if (model->comm) {
        for (int b = 0; b < model->gb.n; b++) cudaCheck(cudaEventDestroy(model->bucket_ready[b]));
        cudaCheck(cudaEventDestroy(model->comm_done));
        cudaCheck(cudaStreamDestroy(model->comm));
        free(model->bucket_ready);
    }
    free(model->h_params); free(model->h_m); free(model->h_v); free(model->h_targets); free(model->h_row);
    free(model->la); free(model->tidx); free(model->prot.exp_hist);
    matmul_free();
}

static size_t model_num_params(const Model* model) { return model->L.total; }

/* host fp32 state -> device, and the bf16 weight copy */
static void model_load_state(Model* model, const float* params, const float* m, const float* v) {
    size_t P = model->L.total;
    cudaCheck(cudaMemcpy(model->params, params, P * sizeof(float), cudaMemcpyHostToDevice));
    if (m) cudaCheck(cudaMemcpy(model->m, m, P * sizeof(float), cudaMemcpyHostToDevice));
    else cudaCheck(cudaMemset(model->m, 0, P * sizeof(float)));
    if (v) cudaCheck(cudaMemcpy(model->v, v, P * sizeof(float), cudaMemcpyHostToDevice));
    else cudaCheck(cudaMemset(model->v, 0, P * sizeof(float)));
    f32_to_bf16(model->wbf, model->params, P, model->stream);
    model->mmb_wn_valid = 0;
    cudaCheck(cudaStreamSynchronize(model->stream));
}

/* the same weights as the CPU trainer, bit for bit: the counter-based generator of llmc/cpu/init.h, one
 * kernel thread per pair of weights (llmc/cuda/init.cuh); AdamW state zero, then the bf16 copy */
static void model_init_weights(Model* model, uint64_t seed) {
    size_t P = model->L.total;
    init_weights_gpu(model->params, &model->L, seed, model->stream);
    cudaCheck(cudaMemsetAsync(model->m, 0, P * sizeof(float), model->stream));
    cudaCheck(cudaMemsetAsync(model->v, 0, P * sizeof(float), model->stream));
    f32_to_bf16(model->wbf, model->params, P, model->stream);
    model->mmb_wn_valid = 0;
    cudaCheck(cudaStreamSynchronize(model->stream));
}

static void model_host_state(Model* model, const float** params, const float** m, const float** v) {
    size_t P = model->L.total;
    cudaCheck(cudaStreamSynchronize(model->stream));
    cudaCheck(cudaMemcpy(model->h_params, model->params, P * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(model->h_m, model->m, P * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(model->h_v, model->v, P * sizeof(float), cudaMemcpyDeviceToHost));
    *params = model->h_params; *m = model->h_m; *v = model->h_v;
}

static void model_set_tokens(Model* model, const int* inputs, const int* targets, int n) {
    cudaCheck(cudaMemcpyAsync(model->inputs, inputs, sizeof(int) * n, cudaMemcpyHostToDevice, model->stream));
    if (targets) {
        memcpy(model->h_targets, targets, sizeof(int) * n);
        cudaCheck(cudaMemcpyAsync(model->targets, targets, sizeof(int) * n, cudaMemcpyHostToDevice, model->stream));
    }
    cudaCheck(cudaStreamSynchronize(model->stream)); /* the host buffers may be reused at once */
}

/* test-only (TSDC_CHECK_DUMP, llmc/sdc/checks.h): the CPU's qk_fingerprint of a [rows, cols] bf16 tensor with row
 * stride ld, downloaded (synchronises) */
static Fingerprint host_fingerprint_bf16(const bf16* x, int rows, int cols, int ld, cudaStream_t s) {
    const size_t n = (size_t)rows * cols;
    uint16_t* hb = (uint16_t*)mallocCheck(sizeof(uint16_t) * n);
    float* hf = (float*)mallocCheck(sizeof(float) * n);
    cudaCheck(cudaStreamSynchronize(s));
    if (ld == cols) cudaCheck(cudaMemcpy(hb, x, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost));
    else
        for (int r = 0; r < rows; r++)
            cudaCheck(cudaMemcpy(hb + (size_t)r * cols, x + (size_t)r * ld, sizeof(uint16_t) * cols, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) hf[i] = bits_f32((uint32_t)hb[i] << 16);
    const Fingerprint f = qk_fingerprint(hf, n, 16);
    free(hb); free(hf);
    return f;
}
#define FP_HEX "\"%016llx%016llx %016llx%016llx\""
#define FP_ARGS(a, b) (unsigned long long)(a).raw, (unsigned long long)(a).idx, (unsigned long long)(b).raw, (unsigned long long)(b).idx

/* ------------------------------------------------------------------ protection (device side)
 * Q/K path recomputation with fused fingerprints (llmc/sdc/fingerprint.cuh): the kernel that produces the
 * Q and K attention consumes (RoPE, or nanochat's norm after RoPE) fingerprints what it writes, in the
 * forward; the recomputation runs the Q and K projections as one GEMM over the adjacent [wq; wk]
 * ([qd + kd, d]: v is not on the Q/K path, so its kd columns are not recomputed) into backward scratch
 * (model->dqkv, free in the forward, as [N, qd + kd]), Qwen3's QK norm on its views, and then the same final
 * kernel in fingerprint-only mode, so the recomputed Q and K are never written out. The forward's q, k
 * columns come out of the [N, qd + 2 kd] GEMM: the check relies on cuBLASLt giving those columns the same
 * bits in the two shapes (each element one fp32 dot product over d; the emulation's GEMM does; the first GPU
 * run's clean -protect qk steps check it, docs/gpu.md).
 * When a fault was injected into the final tensor after its kernel, the forward's fingerprint is taken
 * from the stored tensor instead (the fault stands for an error inside that kernel).
 * Nothing goes to the host here: the fingerprints accumulate (XOR) in the layer's slots of the report (QKF_*:
 * the forward's Q, K, then the recomputation's), which the host copies once after the forward and compares
 * (qk_fp_differ). qc, kc: the Q and K attention consumed (contiguous), read only by the test-only dump. */
static unsigned long long* qk_fp(Model* model, int backward, int l, int slot) {
    return (unsigned long long*)(model->rep_dev + (backward ? model->rep_bwd : model->rep_qk) + (size_t)l * QKF_BYTES) + slot * FP_WORDS;
}
/* 1 when the host copy of layer l's accumulators has the stored Q (or dq) differ from its recomputation, or K */
static int qk_fp_differ(const Model* model, int backward, int l) {
    const unsigned long long* f = (const unsigned long long*)(model->rep_host + (backward ? model->rep_bwd : model->rep_qk) + (size_t)l * QKF_BYTES);
    const Fingerprint q = fingerprint_of(f + QKF_Q * FP_WORDS), k = fingerprint_of(f + QKF_K * FP_WORDS);
    const Fingerprint rq = fingerprint_of(f + QKF_RQ * FP_WORDS), rk = fingerprint_of(f + QKF_RK * FP_WORDS);
    return !fp_equal(q, rq) || !fp_equal(k, rk) || f[QKF_D * FP_WORDS] != 0;
}
/* the recomputation's GEMM: [wq; wk] again from attn_norm into scratch the forward does not use (the backward's dqkv);
 * returns the views of its Q and K and the layer's recomputation fingerprints (QkFpPair), for the pass that follows:
 * qk_recompute_check's own, or the first pass's RoPE launch (qk_rides: the same kernel) */
static QkFpPair qk_recompute_gemm(Model* model, int l, int B, int T) {
    const Config* c = &model->c;
    CostScope cost_scope("qk");
    const int qd = c->n_head * c->head_dim, kd = c->n_kv_head * c->head_dim, ldqk = qd + kd;
    bf16* qk = model->dqkv;
    linear_forward(qk, model->la[l].attn_norm, W(PT_WQ, l), B * T, c->d_model, ldqk, model->stream);   /* the first qd + kd rows of [wq; wk; wv] */
    const QkFpPair rr = {qk, qk + qd, ldqk, qk_fp(model, 0, l, QKF_RQ), qk_fp(model, 0, l, QKF_RK)};
    return rr;
}
static void qk_recompute_dump(Model* model, int l, int B, int T, const bf16* qc, const bf16* kc);
static void qk_recompute_check(Model* model, int l, int B, int T, const bf16* qc, const bf16* kc) {
    const Config* c = &model->c;
    cudaStream_t s = model->stream;
    CostScope cost_scope("qk");   /* every launch here exists for -protect qk */
    int N = B * T, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim, qd = H * hd, kd = KV * hd;
    float eps = (float)c->norm_eps;
    const int ldqk = qd + kd;
    bf16 *q2 = model->dq, *k2 = model->dk;
    float* ms = model->ms_scratch;   /* the recomputation's mean squares (not read) */
    const QkFpPair rr = qk_recompute_gemm(model, l, B, T);
    const bf16 *q1 = rr.q, *k1 = rr.k;   /* views of the recomputed [N, qd + kd] with row stride ldqk */
    unsigned long long *rq = rr.fpq, *rk = rr.fpk;
    if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE && qknorm_rope_ok(hd, ldqk, q1, W(PT_QNORM, l)) && qknorm_rope_ok(hd, ldqk, k1, W(PT_KNORM, l))) {
        /* Qwen3: its QK norm and RoPE in one fingerprint-only kernel (qknorm_rope.cuh), nothing written */
        qknorm_rope_forward_qk(NULL, NULL, NULL, NULL, NULL, NULL, q1, k1, ldqk, W(PT_QNORM, l), W(PT_KNORM, l), B, T, H, KV, hd, eps,
                               model->rope_cos, model->rope_sin, c->rope_style, rq, rk, s);
    } else if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {   /* the two kernels: the norm into scratch, then RoPE fingerprint-only */
        rmsnorm_forward_ld(q2, ms, q1, ldqk, W(PT_QNORM, l), N, H, hd, eps, s);
        rmsnorm_forward_ld(k2, ms, k1, ldqk, W(PT_KNORM, l), N, KV, hd, eps, s);
        rope_qk(NULL, NULL, q2, k2, qd, kd, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, false, rq, rk, s);
    } else if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {   /* nanochat: RoPE into scratch, then the norm fingerprint-only */
        rope_qk(q2, k2, q1, k1, ldqk, ldqk, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, false, NULL, NULL, s);
        rmsnorm_forward_fp(NULL, NULL, q2, NULL, N * H, hd, eps, rq, s);
        rmsnorm_forward_fp(NULL, NULL, k2, NULL, N * KV, hd, eps, rk, s);
    } else {   /* no QK norm: RoPE fingerprint-only on the views, q and k in one launch */
        rope_qk(NULL, NULL, q1, k1, ldqk, ldqk, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, false, rq, rk, s);
    }
    qk_recompute_dump(model, l, B, T, qc, kc);
}
/* test-only (llmc/sdc/checks.h): the layer's fingerprints, both passes' and the host's of the stored tensors; synchronises */
static void qk_recompute_dump(Model* model, int l, int B, int T, const bf16* qc, const bf16* kc) {
    const Config* c = &model->c;
    cudaStream_t s = model->stream;
    const int N = B * T, qd = c->n_head * c->head_dim, kd = c->n_kv_head * c->head_dim;
    unsigned long long *rq = qk_fp(model, 0, l, QKF_RQ), *rk = qk_fp(model, 0, l, QKF_RK);
    if (check_dump_file()) {
        const Fingerprint fq = fingerprint_read(qk_fp(model, 0, l, QKF_Q), s), fk = fingerprint_read(qk_fp(model, 0, l, QKF_K), s);
        const Fingerprint gq = fingerprint_read(rq, s), gk = fingerprint_read(rk, s);
        const int flag = !fp_equal(fq, gq) || !fp_equal(fk, gk);
        const Fingerprint hq = host_fingerprint_bf16(qc, N, qd, qd, s), hk = host_fingerprint_bf16(kc, N, kd, kd, s);
        fprintf(check_dump_file(), "{\"kind\":\"qkf\",\"fwd\":%lld,\"layer\":%d,\"qkf\":%d,\"fp_dev\":" FP_HEX ",\"fp_rec\":" FP_HEX
                ",\"fp_host\":" FP_HEX "}\n", check_dump_fwd, l, flag, FP_ARGS(fq, fk), FP_ARGS(gq, gk), FP_ARGS(hq, hk));
    }
}

/* n alarms of a kind raised at layer l (llmc/sdc/checks.h) */
#define gpu_alarm(model, kind, l, n) protect_alarm(&(model)->prot, (kind), (l), (n))

/* Attention checks (-detect abft, -protect att; llmc/sdc/attcheck.cuh). The fused attention_forward stores
 * logits and probs (its softmax kernel writes both), so every tensor the checks read is in memory after
 * the layer's attention: they run once per layer after attention_forward, attention_forward_faults and
 * the att_out injection point, and read the tensors as the CPU's checks do after their injection points
 * (logits with an att_logits fault in; probs after the recompute of the rows a logits fault hit and with
 * an att_probs fault in; out after everything). Failed heads are counted on the device per layer and
 * check, into the report; the counts come back with it once per forward (no extra synchronisation).
 * Buffers sized for the model's B and T, allocated on first use, outside the activations (not in the
 * trace snapshot). */
static void attcheck_buffers(Model* model) {
    if (model->chk_dev) return;
    const int L = model->c.n_layer;
    const size_t nbh = (size_t)model->B * model->c.n_head;
    const size_t nd = attcheck_scratch_doubles(model->B, model->c.n_head, model->T);
    cudaError_t e = cudaMalloc(&model->chk_scratch, nd * sizeof(double));
    if (e != cudaSuccess)
        tsdc_fail("cannot allocate %.3f GiB for the attention checks: %s", nd * 8 / 1073741824.0, cudaGetErrorString(e));
    cudaCheck(cudaMalloc(&model->chk_dev, sizeof(int) * (size_t)L * ATTC_NCHECK * nbh));
}
static size_t attcheck_dev_ints(const Model* model) {
    return (size_t)model->c.n_layer * ATTC_NCHECK * ((size_t)model->B * model->c.n_head);
}
/* after the forward's final synchronisation: the layers' counts into the alarms (layer order) */
static void attcheck_collect(Model* model) {
    for (int l = 0; l < model->c.n_layer; l++) {
        const int* n = (const int*)(model->rep_host + model->rep_attc) + (size_t)l * ATTC_NCHECK;
        gpu_alarm(model, CHECK_ABFT, l, n[ATTC_ABFT_LOGITS] + n[ATTC_ABFT_AV]);
        gpu_alarm(model, CHECK_ATT, l, n[ATTC_ATT_LOGITS] + n[ATTC_ATT_PROBS]);
    }
}

/* Element-wise recomputation (-protect ew; llmc/sdc/ewcheck.cuh: the kernels and their math). After each
 * element-wise kernel's injection point, a check kernel of its own recomputes the output from the stored inputs
 * and compares it bit for bit; a mismatch sets the comparison's flag slot, layer l's slots of the forward in the
 * report (rep_ew), of the backward in rep_ewb. The forward's come back with the forward's one copy; the
 * backward's in one copy at the backward's end (after its layer loop: nothing waits inside the loops), since the
 * host loop reads every check's alarms right after the backward. A layer's alarm count is the number of its
 * slots set, the CPU's check_alarm count. Where a residual add is fused with the next norm, the residual is
 * the layer's (attn_residual, block_out) and the norm the next one's (mlp_norm, the next layer's attn_norm),
 * both checked by one launch after the norm's injection point; the final norm, which the CPU does not check,
 * is not checked either (the last block_out is, alone). */
static int* ew_flag(Model* model, int backward, int l, int slot) {
    return backward ? (int*)(model->rep_dev + model->rep_ewb) + (size_t)l * EW_BWD_SLOTS + slot
                    : (int*)(model->rep_dev + model->rep_ew) + (size_t)l * EW_FWD_SLOTS + slot;
}
/* after the pass's copy of its slots: each layer's failed comparisons into the alarms, in the pass's layer order
 * (the forward's ascending, the backward's descending: the CPU's first layer) */
static void ew_collect(Model* model, int backward) {
    const int L = model->c.n_layer, slots = backward ? (int)EW_BWD_SLOTS : (int)EW_FWD_SLOTS;
    const int* f = (const int*)(model->rep_host + (backward ? model->rep_ewb : model->rep_ew));
    for (int i = 0; i < L; i++) {
        const int l = backward ? L - 1 - i : i;
        int n = 0;
        for (int k = 0; k < slots; k++) n += f[(size_t)l * slots + k] != 0;
        gpu_alarm(model, CHECK_EW, l, n);
    }
}

/* ew inside the kernels (llmc/sdc/ewdup.cuh): with -protect ew every checked element-wise kernel runs its duplicated
 * variant, which sets the same flag slots as the recomputation checks; the recomputation kernels run only where the
 * fault injector writes into a checked output after its kernel (an error the duplicate would have seen, which the
 * injector models outside the kernel: ewdup.cuh), so a clean step launches none. ew_dupf: the flags of a duplicated
 * kernel's outputs (slot -1, or ew off: none). ew_due: a fault due in this pass at one of the sites (layer, site
 * pairs; a negative layer ends the list early), i.e. the recomputation check of those outputs must run. */
static EwDup ew_dupf(Model* model, int backward, int l0, int s0, int l1, int s1) {
    if (!model->prot.on[PK_EW]) return ew_dup_none();
    return ew_dup(l0 >= 0 && s0 >= 0 ? ew_flag(model, backward, l0, s0) : NULL, l1 >= 0 && s1 >= 0 ? ew_flag(model, backward, l1, s1) : NULL);
}
static int ew_due(const Model* model, int pass, int l0, int site0, int l1 = -1, int site1 = -1, int l2 = -1, int site2 = -1) {
    const FaultCtx* fx = model->prot.fx;
    return (l0 >= 0 && fault_due(fx, site0, l0, pass)) || (l1 >= 0 && fault_due(fx, site1, l1, pass)) || (l2 >= 0 && fault_due(fx, site2, l2, pass));
}

/* Matrix-product output bounds (-protect bound; llmc/sdc/bound.h the math, bound.cuh the kernels): v_proj, o_proj,
 * gate_proj (fc), up_proj and down_proj checked after their injection points, |y_ij| <= c(K) ||x_i|| ||w_j||, against
 * the input the GEMM read and the bf16 weights it read. The weights' row norms once after every change of the weights:
 * made by the optimizer's launch as it writes the bf16 weights (adamw_multi_tensor_rows, mmb_row_norms_jobs' bits), else
 * (the first step, a loaded or initialised model) by mmb_prepare's one pass before the layer loop; the step's
 * microbatches and its replay share them. On the clean path no product
 * has a check launch of its own: v rides on the launch that rotates q and k (MmbTail, against attn_norm's row norms
 * its norm kernel left), o is checked in the residual add and norm that read it (its input rows' norms from the sums of
 * squares a head the flash forward left as it stored att_out, else taken there from att_out), gate and up in SwiGLU's forward, down in the block's closing residual add and norm; where a fault or a path
 * splits those kernels, mmb_product's one check launch takes the input rows' norms itself (gate and up: one launch over
 * the fused [N, 2F] output, two slots). A layer's
 * slots (MMB_*) of the forward's report come back with its one copy; the alarm count is the number of slots set,
 * the CPU's count of failed products. */
static size_t mmb_wn_offset(const Config* c, int slot) {
    return mmb_slot_offset(slot, (size_t)c->n_kv_head * c->head_dim, (size_t)c->d_model, (size_t)c->ffn_dim);
}
static const float* mmb_wnorms(const Model* model, int l, int slot) {
    const Config* c = &model->c;
    return model->mmb_wn + mmb_wn_offset(c, MMB_SLOTS) * l + mmb_wn_offset(c, slot);
}
static void mmb_prepare(Model* model, cudaStream_t s) {
    const Config* c = &model->c;
    const int d = c->d_model, kd = c->n_kv_head * c->head_dim, qd = c->n_head * c->head_dim, F = c->ffn_dim;
    if (!model->mmb_wn) {
        cudaCheck(cudaMalloc(&model->mmb_wn, sizeof(float) * mmb_wn_offset(c, MMB_SLOTS) * c->n_layer));
        cudaCheck(cudaMalloc(&model->mmb_xn, sizeof(float) * (size_t)model->B * model->T));
        cudaCheck(cudaMalloc(&model->mmb_pn, sizeof(float) * (size_t)model->B * model->T));
        cudaCheck(cudaMalloc(&model->mmb_an, sizeof(float) * (size_t)model->B * model->T));
        cudaCheck(cudaMalloc(&model->mmb_rss, sizeof(double) * (size_t)model->B * model->T * c->n_head));
    }
    if (!model->mmb_jobs) {   /* the weights' row-norm jobs, every checked matrix of every layer (fixed pointers) */
        const int swiglu = c->mlp == MLP_SWIGLU;
        MmbJob* h = (MmbJob*)mallocCheck(sizeof(MmbJob) * 5 * (size_t)c->n_layer);
        int n = 0;
        long long first = 0;
        auto add = [&](float* out, const bf16* x, int rows, int cols) {
            h[n].out = out; h[n].x = x; h[n].rows = rows; h[n].cols = cols; h[n].ld = cols; h[n].first = first;
            first += rows;
            n++;
        };
        for (int l = 0; l < c->n_layer; l++) {
            add((float*)mmb_wnorms(model, l, MMB_V_PROJ), W(PT_WV, l), kd, d);
            add((float*)mmb_wnorms(model, l, MMB_O_PROJ), W(PT_WO, l), d, qd);
            add((float*)mmb_wnorms(model, l, MMB_GATE_PROJ), W(swiglu ? PT_WGATE : PT_WFC, l), F, d);
            if (swiglu) add((float*)mmb_wnorms(model, l, MMB_UP_PROJ), W(PT_WUP, l), F, d);
            add((float*)mmb_wnorms(model, l, MMB_DOWN_PROJ), W(PT_WDOWN, l), d, F);
        }
        cudaCheck(cudaMalloc(&model->mmb_jobs, sizeof(MmbJob) * (size_t)n));
        cudaCheck(cudaMemcpy(model->mmb_jobs, h, sizeof(MmbJob) * (size_t)n, cudaMemcpyHostToDevice));
        model->mmb_hjobs = h;
        model->mmb_njobs = n;
        /* the same norms from the optimizer's launch (model_update): each job is a whole tensor of the layout (its bf16
         * copy, rows of cols), so the update's own chunks can be its rows (MtRows) */
        const int nt = model->L.n;
        size_t *off = (size_t*)mallocCheck(sizeof(size_t) * nt), *numel = (size_t*)mallocCheck(sizeof(size_t) * nt);
        int *dk = (int*)mallocCheck(sizeof(int) * nt), *cols = (int*)mallocCheck(sizeof(int) * nt);
        float** out = (float**)mallocCheck(sizeof(float*) * nt);
        int matched = 0;
        for (int i = 0; i < nt; i++) {
            const TensorInfo* ti = &model->L.t[i];
            off[i] = ti->offset; numel[i] = ti->numel; dk[i] = ti->decay; cols[i] = 0; out[i] = NULL;
            for (int j = 0; j < n; j++)
                if (h[j].x == model->wbf + ti->offset && (size_t)h[j].rows * h[j].cols == ti->numel) {
                    cols[i] = h[j].cols; out[i] = h[j].out; matched++;
                }
        }
        if (matched == n) mt_rows_build(&model->mt_rows, nt, off, numel, dk, cols, out);   /* else the norms keep their own pass */
        free(off); free(numel); free(dk); free(cols); free(out);
    }
    if (model->mmb_wn_valid) return;
    mmb_row_norms_jobs(model->mmb_jobs, model->mmb_hjobs, model->mmb_njobs, s);   /* every weight matrix, one launch */
    model->mmb_wn_valid = 1;
}
/* product slot s of layer l (slot s + 1 for the columns from split: gate and up in one launch): y [N, cols] (row
 * stride ld) from the input x [N, K] */
/* the flag of product slot s of layer l in the forward's report */
static int* mmb_flag(Model* model, int l, int slot) { return (int*)(model->rep_dev + model->rep_mmb) + (size_t)l * MMB_SLOTS + slot; }
static void mmb_product(Model* model, int l, int slot, int split, const bf16* y, int N, int cols, int ld, const bf16* x, int K,
                        cudaStream_t s) {
    int* f = (int*)(model->rep_dev + model->rep_mmb) + (size_t)l * MMB_SLOTS + slot;
    mmb_check(f, split < cols ? f + 1 : f, split, y, N, cols, ld, x, K, mmb_wnorms(model, l, slot), mmb_factor(K), s);
}
static void mmb_collect(Model* model) {
    const int* f = (const int*)(model->rep_host + model->rep_mmb);
    for (int l = 0; l < model->c.n_layer; l++) {
        int n = 0;
        for (int k = 0; k < MMB_SLOTS; k++) n += f[(size_t)l * MMB_SLOTS + k] != 0;
        gpu_alarm(model, CHECK_BOUND, l, n);
    }
}

/* ---------------------------------------------------------------- the backward's checks (-protect qk_bwd, att_bwd)
 * Backward Q/K path recomputation (qk_bwd; the CPU's qk_bwd_recompute_check in train_sdc.c). Once the layer's dq and
 * dk (the gradients of the q and k projections' outputs, after their injection points) are stored, the path that
 * produced them runs a second time from the same stored inputs, and the two are compared bitwise through 128-bit
 * fingerprints (llmc/sdc/fingerprint.cuh): the first pass's kernel that writes them (RoPE's backward, or Qwen3's QK
 * norm backward) fingerprints what it writes into the layer's QKF_Q, QKF_K accumulators of the backward's report
 * (taken again from the stored view where a fault is injected after it: store_dqk), the rerun's last kernel runs in
 * fingerprint-only mode into QKF_RQ, QKF_RK (the recomputed gradients are never written), and the host compares them
 * after the backward's one copy of the report. What is recomputed:
 *   - the attention's gradient of the tensors attention consumed (q_rope/k_rope, or nanochat's q_norm/k_norm), by
 *     the same kernels the layer ran: on the fused path flash_attention_backward again (it keeps dS in registers, so
 *     the dq/dk computation reruns from dout, the forward's out and lse, q, k, v: a second, independent execution of
 *     the same arithmetic; dv is not recomputed: the dk/dv kernel's dk-only variant skips P^T dO); on the split path (-protect att_bwd, or a backward attention fault)
 *     attention_split_logits_backward from the stored dlogits, as the CPU; on the materialised non-split path
 *     attention_backward again from dout and the stored probs;
 *   - then the QK norm backward (dx only: the weight gradient is not accumulated again) and RoPE backward, the
 *     same kernels on the same saved statistics.
 * A fault anywhere on the path (q_proj, k_proj, q_norm, k_norm, q_rope, k_rope gradients, or inside the attention
 * backward's dq/dk) changes the stored tensor's bits and not the recomputation's. Faults in the stored dlogits (split
 * path) or in dout are consistent input to both, as on the CPU: those are checked by invariants instead (att_bwd:
 * the dprobs row checksums, dlogits' zero row sums, dV's column sums, attcheck.cuh). No injection points in the rerun.
 * Cost a layer (docs/protection.md): fused path, the flash backward's dq and dk again (6 causal T x T x hd products a
 * head, dv's seventh skipped), with RoPE's and Qwen3's QK norm's backward and the fingerprints in its epilogue (one
 * launch, nothing written; flash_attention.cuh's FlashQkEpi); nanochat's QK norm after RoPE, the split and the
 * materialised paths: the attention products again, then the norm/RoPE reruns, the last one reading its input and
 * writing nothing, in scratch of 2 N qd + 3 N kd bf16. The first pass's fingerprints are folded into its RoPE (QK
 * norm) backward. */
enum { QKB_FLASH, QKB_MATERIALISED, QKB_SPLIT };
/* test-only (llmc/sdc/checks.h; synchronises): the layer's stored and recomputed fingerprints, the verdict, and the
 * stored gradients' fingerprints taken on the host */
static void qk_bwd_dump(Model* model, int l, int N, int qd, int kd, const bf16* dq_used, const bf16* dk_used, int ldu, unsigned long long* rq,
                        unsigned long long* rk, cudaStream_t s) {
    if (!check_dump_file()) return;
    const Fingerprint fq = fingerprint_read(qk_fp(model, 1, l, QKF_Q), s), fk = fingerprint_read(qk_fp(model, 1, l, QKF_K), s);
    const Fingerprint gq = fingerprint_read(rq, s), gk = fingerprint_read(rk, s);
    const int flag = !fp_equal(fq, gq) || !fp_equal(fk, gk);
    const Fingerprint hq = host_fingerprint_bf16(dq_used, N, qd, ldu, s), hk = host_fingerprint_bf16(dk_used, N, kd, ldu, s);
    fprintf(check_dump_file(), "{\"kind\":\"qkb\",\"bwd\":%lld,\"layer\":%d,\"qkb\":%d,\"fp_dev\":" FP_HEX ",\"fp_host\":" FP_HEX "}\n",
            check_dump_bwd, l, flag, FP_ARGS(fq, fk), FP_ARGS(hq, hk));
}
static void qk_bwd_recompute_check(Model* model, int l, int B, int T, int path, const bf16* o, const bf16* probs, bf16* dlogits,
                                   const bf16* qc, const bf16* kc, const bf16* dq_used, const bf16* dk_used, int ldu) {
    CostScope cost_scope("qk_bwd");   /* every launch here exists for -protect qk_bwd */
    const Config* c = &model->c;
    cudaStream_t s = model->stream;
    LayerActs* a = &model->la[l];
    const int N = B * T, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim, qd = H * hd, kd = KV * hd, ld = model->ldqkv;
    const float eps = (float)c->norm_eps;
    unsigned long long *rq = qk_fp(model, 1, l, QKF_RQ), *rk = qk_fp(model, 1, l, QKF_RK);
    /* the fused path with no QK norm or Qwen3's: the whole rerun in one launch, RoPE's and the norm's backward in the
     * flash kernels' epilogue (FlashQkEpi): no scratch, nothing written but the fingerprints */
    /* Qwen3's norm and RoPE backward in one pass where qknorm_rope.cuh takes the shapes (always at head_dim 32 .. 256) */
    const int wq_ok = c->qk_norm != QKNORM_WEIGHTED_PRE_ROPE || (qknorm_rope_ok(hd, ld, a->q, W(PT_QNORM, l)) && qknorm_rope_ok(hd, ld, a->k, W(PT_KNORM, l)));
    if (path == QKB_FLASH && c->qk_norm != QKNORM_PLAIN_POST_ROPE && wq_ok) {
        const int wn = c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE;
        const FlashQkEpi e = {model->rope_cos, model->rope_sin, c->rope_style, eps, wn ? a->q : NULL, wn ? a->k : NULL, ld,
                              wn ? W(PT_QNORM, l) : NULL, wn ? W(PT_KNORM, l) : NULL, wn ? a->qn_ms : NULL, wn ? a->kn_ms : NULL, rq, rk};
        flash_attention_backward(NULL, NULL, NULL, model->datt, o, a->lse, qc, kc, a->v, B, T, H, KV, hd, ld, s, NULL, NULL, true, &e);
        qk_bwd_dump(model, l, N, qd, kd, dq_used, dk_used, ldu, rq, rk, s);
        return;
    }
    /* elsewhere, scratch: q1, q2 [N, qd], k1, k2 [N, kd] contiguous, and one [N, ldqkv] buffer shaped as the fused
     * gradient, which takes the rerun's d(v) (the attention kernels write dv with v's row stride) and, with a weighted
     * QK norm, the norm backward's dq, dk (its dx has x's row stride) */
    const size_t per = 2 * (size_t)model->B * model->T * (size_t)(qd + kd) + (size_t)model->B * model->T * ld;
    if (!model->qkb_scratch) {
        cudaError_t e = cudaMalloc(&model->qkb_scratch, per * sizeof(bf16));
        if (e != cudaSuccess) tsdc_fail("cannot allocate %.3f GiB for -protect qk_bwd: %s", per * 2 / 1073741824.0, cudaGetErrorString(e));
    }
    bf16 *q1 = model->qkb_scratch, *q2 = q1 + (size_t)N * qd, *k1 = q2 + (size_t)N * qd, *k2 = k1 + (size_t)N * kd, *f = k2 + (size_t)N * kd, *t;
    /* the fused path reruns dq and dk alone (dv NULL: the dk/dv kernel skips P^T dO and the dv partials), from the D of
     * the first pass (its row dots of dout and out, computed twice and compared there: QKF_D) */
    if (path == QKB_FLASH) flash_attention_backward(q1, k1, NULL, model->datt, o, a->lse, qc, kc, a->v, B, T, H, KV, hd, ld, s, NULL, NULL, true);
    else if (path == QKB_SPLIT) attention_split_logits_backward(q1, k1, dlogits, qc, kc, B, T, H, KV, hd, s);
    else attention_backward(q1, k1, f + qd + kd, model->datt, probs, qc, kc, a->v, B, T, H, KV, hd, ld, s);
    if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
        rmsnorm_backward(q2, NULL, q1, a->qr, NULL, a->qf_ms, N * H, hd, eps, 0, s);
        rmsnorm_backward(k2, NULL, k1, a->kr, NULL, a->kf_ms, N * KV, hd, eps, 0, s);
        t = q1; q1 = q2; q2 = t; t = k1; k1 = k2; k2 = t;
    }
    /* the last kernel of the path in fingerprint-only mode: the recomputed gradients of q_proj, k_proj are never
     * written, their fingerprints go to the layer's QKF_RQ, QKF_RK accumulators */
    if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE && wq_ok) {
        /* RoPE's and the QK norm's backward in one fingerprint-only kernel (qknorm_rope.cuh) */
        rope_qknorm_backward_fp_qk(q1, k1, a->q, a->k, ld, W(PT_QNORM, l), W(PT_KNORM, l), a->qn_ms, a->kn_ms, B, T, H, KV, hd, eps,
                                   model->rope_cos, model->rope_sin, c->rope_style, rq, rk, s);
    } else if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {
        rope_qk(q2, k2, q1, k1, qd, kd, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, true, NULL, NULL, s);
        rmsnorm_backward_ld(NULL, NULL, q2, a->q, ld, W(PT_QNORM, l), a->qn_ms, N, H, hd, eps, 0, 0, s, rq);
        rmsnorm_backward_ld(NULL, NULL, k2, a->k, ld, W(PT_KNORM, l), a->kn_ms, N, KV, hd, eps, 0, 0, s, rk);
    } else {   /* RoPE's backward of q and k, fingerprint-only, one launch */
        rope_qk(NULL, NULL, q1, k1, qd, kd, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, true, rq, rk, s);
    }
    qk_bwd_dump(model, l, N, qd, kd, dq_used, dk_used, ldu, rq, rk, s);
}

/* the backward attention checks of layer l write their failed heads here (report) and flag heads here (device) */
static int* attb_counts(Model* model, int l) {
    return (int*)(model->rep_dev + model->rep_bwd + (size_t)model->c.n_layer * QKF_BYTES) + (size_t)l * ATTB_NCHECK;
}
static int* attb_flags(Model* model, int l) { return model->chkb_dev + (size_t)l * ATTB_NCHECK * ((size_t)model->B * model->c.n_head); }
/* the dV check's chunk counters of layer l (attcheck_backward_dv), after every layer's flags, zeroed with them */
static size_t attb_done_per_layer(const Model* model) { return (size_t)model->B * model->c.n_kv_head * CEIL_DIV(model->c.head_dim, 32); }
static unsigned* attb_done(Model* model, int l) {
    return (unsigned*)(model->chkb_dev + (size_t)model->c.n_layer * ATTB_NCHECK * ((size_t)model->B * model->c.n_head)) + (size_t)l * attb_done_per_layer(model);
}
static int bwd_checks_on(const Model* model) { return model->prot.on[PK_QK_BWD] || model->prot.on[PK_ATT_BWD]; }
/* test-only (TSDC_CHECK_DUMP, llmc/sdc/checks.h): the dV check's bounds go here (NULL without the dump); attb_dump
 * writes layer l's failed heads per check and the sums of the three checks' bounds, as the CPU trainer does. It
 * synchronises inside the layer loop. */
static double* attb_dump_bound(Model* model) {
    static double* bound = NULL;
    if (!check_dump_file()) return NULL;
    if (!bound) cudaCheck(cudaMalloc(&bound, sizeof(double) * (size_t)model->B * model->c.n_kv_head * model->c.head_dim));
    return bound;
}
static void attb_dump(Model* model, int l, int B, int T, cudaStream_t s) {
    if (!check_dump_file()) return;
    const int H = model->c.n_head, KV = model->c.n_kv_head, hd = model->c.head_dim;
    const size_t n = (size_t)B * H * T, nv = (size_t)B * KV * hd;
    double* h = (double*)mallocCheck(sizeof(double) * (3 * n + nv));
    int cnt[ATTB_NCHECK];
    cudaCheck(cudaMemcpyAsync(cnt, attb_counts(model, l), sizeof(cnt), cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaMemcpyAsync(h, model->chk_scratch, sizeof(double) * 3 * n, cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaMemcpyAsync(h + 3 * n, attb_dump_bound(model), sizeof(double) * nv, cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
    double tb[3] = {0, 0, 0};
    for (size_t i = 0; i < n; i++) { tb[0] += h[n + i]; tb[1] += h[2 * n + i]; }
    for (size_t i = 0; i < nv; i++) tb[2] += h[3 * n + i];
    free(h);
    fprintf(check_dump_file(), "{\"kind\":\"att\",\"bwd\":%lld,\"layer\":%d,\"att\":[%d,%d,%d],\"tol\":[%.17g,%.17g,%.17g]}\n",
            check_dump_bwd, l, cnt[ATTB_DPROBS], cnt[ATTB_DLOGITS], cnt[ATTB_DV], tb[0], tb[1], tb[2]);
}
/* before the backward's layer loop: the report's backward part and the flags from zero, buffers on first use */
static void bwd_checks_begin(Model* model, int B, int T, cudaStream_t s) {
    if (!bwd_checks_on(model)) return;
    if (B > model->B || T > model->T) tsdc_fail("model_backward_step: B %d T %d exceed the model's %d %d", B, T, model->B, model->T);
    cudaCheck(cudaMemsetAsync(model->rep_dev + model->rep_bwd, 0, model->rep_bwd_bytes, s));
    if (model->prot.on[PK_ATT_BWD]) {
        attcheck_buffers(model);   /* chk_scratch: attbwd_scratch_doubles <= attcheck_scratch_doubles */
        const size_t nf = (size_t)model->c.n_layer * (ATTB_NCHECK * ((size_t)model->B * model->c.n_head) + attb_done_per_layer(model));
        if (!model->chkb_dev) cudaCheck(cudaMalloc(&model->chkb_dev, sizeof(int) * nf));
        cudaCheck(cudaMemsetAsync(model->chkb_dev, 0, sizeof(int) * nf, s));
    }
}
/* after the layer loop: the backward's report in one pinned copy and one synchronisation (the next microbatch's
 * token upload and the step's norms wait for the backward anyway), its counts into the alarms in the CPU's order
 * (layers from the top down, as its backward raises them) */
static void bwd_checks_collect(Model* model, cudaStream_t s) {
    const int ew = model->prot.on[PK_EW], other = bwd_checks_on(model);
    if (!ew && !other) return;
    const int L = model->c.n_layer;
    cudaCheck(cudaMemcpyAsync(model->rep_host + model->rep_bwd, model->rep_dev + model->rep_bwd, model->rep_bwd_bytes,
                              cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
    if (ew) ew_collect(model, 1);
    if (!other) return;
    const int* attb = (const int*)(model->rep_host + model->rep_bwd + (size_t)L * QKF_BYTES);
    for (int l = L - 1; l >= 0; l--) {
        const int* n = attb + (size_t)l * ATTB_NCHECK;
        if (model->prot.on[PK_ATT_BWD]) gpu_alarm(model, CHECK_ATT_BWD, l, n[ATTB_DPROBS] + n[ATTB_DV] + n[ATTB_DLOGITS]);
        if (model->prot.on[PK_QK_BWD]) gpu_alarm(model, CHECK_QK_BWD, l, qk_fp_differ(model, 1, l));
    }
}

/* exponent profiling: gather random samples of dL/dY on the device, count codes on the host */
__global__ static void gather_bf16_kernel(uint16_t* out, const bf16* x, const unsigned long long* idx, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat16_as_ushort(x[idx[i]]);
}
/* dy [n / cols, cols] with the row stride ld (cols = ld = n: contiguous): sample logical index i, as the CPU,
 * is read at (i / cols) * ld + i % cols */
static void exp_profile_ld(Model* model, int type, int l, const bf16* dy, size_t n, size_t cols, size_t ld) {
    if (!model->prot.exp_hist || !model->prot.exp_samples || !n) return;
    int m = model->prot.exp_samples;
    unsigned long long* h_idx = (unsigned long long*)mallocCheck(sizeof(unsigned long long) * m);
    for (int i = 0; i < m; i++) {
        const unsigned long long j = rng_below(&model->prot.exp_rng, n);
        h_idx[i] = j / cols * ld + j % cols;
    }
    unsigned long long* d_idx = (unsigned long long*)cuda_workspace_f32(2, 2 * (size_t)m + (size_t)m);
    uint16_t* d_out = (uint16_t*)(d_idx + m);
    cudaCheck(cudaMemcpyAsync(d_idx, h_idx, sizeof(unsigned long long) * m, cudaMemcpyHostToDevice, model->stream));
    gather_bf16_kernel<<<CEIL_DIV(m, 256), 256, 0, model->stream>>>(d_out, dy, d_idx, m);
    cudaCheck(cudaGetLastError());
    launch_account("exp", "gather_bf16_kernel", COST_FP32, CEIL_DIV(m, 256), 0.0, (double)m * 10, (double)m * 2);
    uint16_t* h_out = (uint16_t*)mallocCheck(sizeof(uint16_t) * m);
    cudaCheck(cudaMemcpyAsync(h_out, d_out, sizeof(uint16_t) * m, cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    uint32_t* hist = model->prot.exp_hist + (size_t)tensor_index(model, type, l) * 256;
    for (int i = 0; i < m; i++) { uint32_t code = (h_out[i] >> 7) & 0xFF; if (code != 0 && code != 255) hist[code]++; }
    free(h_idx); free(h_out);
}
static void exp_profile(Model* model, int type, int l, const bf16* dy, size_t n) { exp_profile_ld(model, type, l, dy, n, n, n); }

/* ---------------------------------------------------------------------------------- forward */
/* Which kernels a layer's forward runs: the one place the fused-or-split choices are made. A fused kernel
 * computes the same bits as its split steps (the kernels' headers say how), so the choice only matters
 * where something must happen between the steps: a fault due there (the injector writes the tensor in
 * between), or a check that reads it. */
typedef struct {
    int fp_rope;       /* RoPE writes Q and K and their fingerprints in one pass (-protect qk, QK norm not after RoPE) */
    int fp_norm;       /* the QK norm after RoPE (nanochat) writes them with their fingerprints (-protect qk) */
    int qknr_q;        /* Qwen3's QK norm and RoPE of q in one kernel (qknorm_rope.cuh): no q_norm fault between them */
    int qknr_k;        /* ... of k: no k_norm fault between them */
    int flash;         /* the fused attention (attention_fused), else the materialised one (stored logits, probs) */
    int resid_norm;    /* the attention residual and mlp_norm in one kernel: no attn_residual fault between them */
    int swiglu;        /* SiLU and the gated product in one pass: no act fault between them */
    int block_norm;    /* the block's residual and the next norm in one kernel: no block_out fault between them */
} LayerPlan;

static LayerPlan layer_plan(const Model* model, int l) {
    const Config* c = &model->c;
    const FaultCtx* fx = model->prot.fx;
    LayerPlan p;
    p.fp_rope = model->prot.on[PK_QK] && c->qk_norm != QKNORM_PLAIN_POST_ROPE;
    p.fp_norm = model->prot.on[PK_QK] && c->qk_norm == QKNORM_PLAIN_POST_ROPE;
    const int wq = c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE && qknorm_rope_ok(c->head_dim, model->ldqkv, model->la[l].q, W(PT_QNORM, l));
    p.qknr_q = wq && !fault_due(fx, SITE_Q_NORM, l, PASS_FWD);
    p.qknr_k = wq && qknorm_rope_ok(c->head_dim, model->ldqkv, model->la[l].k, W(PT_KNORM, l)) && !fault_due(fx, SITE_K_NORM, l, PASS_FWD);
    p.flash = attention_fused(model, l);
    p.resid_norm = !fault_due(fx, SITE_ATTN_RESIDUAL, l, PASS_FWD);
    p.swiglu = c->mlp == MLP_SWIGLU && !fault_due(fx, SITE_ACT, l, PASS_FWD);
    p.block_norm = !fault_due(fx, SITE_BLOCK_OUT, l, PASS_FWD);
    return p;
}
/* whether the recomputation's fingerprint pass rides on the first pass's launch that rotates Q and K: where both are
 * one kernel (no QK norm: rope_qk; Qwen3's norm and RoPE fused, on both sides: qknorm_rope_forward_qk) */
static int qk_rides(const Model* model, int l, const LayerPlan& P) {
    const Config* c = &model->c;
    const int qd = c->n_head * c->head_dim, kd = c->n_kv_head * c->head_dim, ldqk = qd + kd;
    if (!model->prot.on[PK_QK]) return 0;
    if (c->qk_norm == QKNORM_NONE) return !P.qknr_q && !P.qknr_k;
    return c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE && P.qknr_q && P.qknr_k && qknorm_rope_ok(c->head_dim, ldqk, model->dqkv, W(PT_QNORM, l)) &&
           qknorm_rope_ok(c->head_dim, ldqk, model->dqkv + qd, W(PT_KNORM, l));
}

/* test-only (TSDC_CHECK_DUMP, llmc/sdc/checks.h): layer l's forward attention checks as they ran, for comparison with
 * the CPU trainer's att_fwd_stats: the failed heads of the logits and the probability checks (the report's counters),
 * and sums over the rows of the bounds and |references| the scan wrote into scratch, of |the logits' row sums| and of
 * the probabilities' row sums: on the fused path the ones the flash kernel accumulated (FlashCheck), on the
 * materialised path summed here from the stored bf16 logits and probs. Synchronises inside the layer loop. */
static void attf_dump(Model* model, int l, int B, int T, int fused, const bf16* logits, const bf16* probs, cudaStream_t s) {
    if (!check_dump_file() || !model->prot.on[PK_ATT]) return;
    const size_t n = (size_t)B * model->c.n_head * T;
    int cnt[ATTC_NCHECK];
    double* ref = (double*)mallocCheck(sizeof(double) * n);
    double* tol = (double*)mallocCheck(sizeof(double) * n);
    float* rows = (float*)mallocCheck(sizeof(float) * 2 * n);
    cudaCheck(cudaStreamSynchronize(s));
    cudaCheck(cudaMemcpy(cnt, (int*)(model->rep_dev + model->rep_attc) + (size_t)l * ATTC_NCHECK, sizeof(cnt), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(ref, model->chk_scratch, sizeof(double) * n, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(tol, model->chk_scratch + 2 * n, sizeof(double) * n, cudaMemcpyDeviceToHost));
    if (fused) {
        cudaCheck(cudaMemcpy(rows, attcheck_fused_rows(model->chk_scratch, B, model->c.n_head, T), sizeof(float) * 2 * n, cudaMemcpyDeviceToHost));
    } else {
        uint16_t* h = (uint16_t*)mallocCheck(sizeof(uint16_t) * n * T);
        for (int w = 0; w < 2; w++) {
            cudaCheck(cudaMemcpy(h, w ? probs : logits, sizeof(uint16_t) * n * T, cudaMemcpyDeviceToHost));
            for (size_t r = 0; r < n; r++) {
                const int t = (int)(r % (size_t)T);
                double sum = 0.0;
                for (int j = 0; j <= t; j++) sum += bits_f32((uint32_t)h[r * T + j] << 16);
                rows[w * n + r] = (float)sum;
            }
        }
        free(h);
    }
    double st[4] = {0, 0, 0, 0};
    for (size_t r = 0; r < n; r++) {
        st[0] += tol[r];
        st[1] += fabs(ref[r]);
        st[2] += fabs((double)rows[r]);
        st[3] += rows[n + r];
    }
    check_dump_attf(l, cnt[ATTC_ATT_LOGITS], cnt[ATTC_ATT_PROBS], st);
    free(ref); free(tol); free(rows);
}

/* a Q or K tensor that attention consumes, stored: the fault injector's hook, and where its kernel took the
 * fingerprint (fp: the accumulator, NULL when none), the fingerprint taken again over what the fault left, since a
 * fault after the producing kernel is one the recomputation must see */
static void store_qk(Model* model, int site, int l, bf16* x, size_t n, unsigned long long* fp, cudaStream_t s) {
    if (!fault_due(model->prot.fx, site, l, PASS_FWD)) return;
    fault_apply_device(model->prot.fx, x, n, s);
    if (fp) {
        fingerprint_zero(fp, s);
        qk_fingerprint_acc(fp, x, n, s);
    }
}

static float model_forward_step(Model* model, int B, int T, int with_targets) {
    check_dump_fwd++;   /* the test-only dump's forward count (llmc/sdc/checks.h) */
    const Config* c = &model->c;
    cudaStream_t s = model->stream;
    int N = B * T, d = c->d_model, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    int qd = H * hd, kd = KV * hd, F = c->ffn_dim, V = c->vocab_size;
    float eps = (float)c->norm_eps;
    const int checks = model->prot.abft || model->prot.on[PK_ATT], ew = model->prot.on[PK_EW], mmb = model->prot.on[PK_BOUND];
    if (B * T > model->B * model->T) tsdc_fail("model_forward_step: B %d x T %d exceed the model's %d x %d tokens", B, T, model->B, model->T);
    const int fuse_ce = with_targets && model->ce_fused_next;   /* the one-pass classifier (model_classifier_fused_next) */
    model->ce_fused_next = 0;
    model->dlogits_ready = 0;
    if (checks) {
        if (B > model->B || T > model->T) tsdc_fail("model_forward_step: B %d T %d exceed the model's %d %d", B, T, model->B, model->T);
        attcheck_buffers(model);
        cudaCheck(cudaMemsetAsync(model->chk_dev, 0, sizeof(int) * attcheck_dev_ints(model), s));
    }
    /* the report's flags and counts start from zero (a layer without a check leaves its zeros) */
    if (checks || model->prot.on[PK_QK] || ew || mmb)
        cudaCheck(cudaMemsetAsync(model->rep_dev + model->rep_qk, 0, model->rep_loss - model->rep_qk, s));

    model->last_B = B; model->last_T = T;
    for (int l = 0; l < c->n_layer && !model->att_mem; l++)   /* before the layer loop: no allocation inside it */
        if (!attention_fused(model, l)) model_att_buffers(model, model_materialised_reason(model));
    if (mmb) mmb_prepare(model, s);   /* before the layer loop: its allocation, and the weights' norms */
    const int ldqkv = model->ldqkv, ldgu = model->ldgu;
    embedding_forward(model->emb, model->inputs, W(PT_WTE, -1), N, d, s);
    bf16* x = model->emb;
    if (c->embed_norm) { rmsnorm_forward(model->x0, model->emb_ms, x, W(PT_EMBED_NORM, -1), N, d, eps, s); x = model->x0; }
    const long long syncs0 = host_syncs_now();   /* -stats: none may happen inside the layer loop */
    /* Each residual add is fused with the norm that follows it (residual_rmsnorm_forward: the same bits),
     * but where a fault is due in the residual's output between the two (attn_residual, block_out).
     * normed: the previous layer's fused add already wrote this layer's attn_norm (or the final norm). */
    int normed = 0;
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs* a = &model->la[l];
        const LayerPlan P = layer_plan(model, l);
        /* -protect bound: the norm's kernel also leaves its output rows' norms (mmb_an) for v's check; the previous block's
         * residual add and norm left them where it made attn_norm; a fault written into attn_norm: taken again from it */
        float* an = mmb ? model->mmb_an : NULL;
        if (!normed) rmsnorm_forward(a->attn_norm, a->attn_ms, x, W(PT_ATTN_NORM, l), N, d, eps, s, ew_dupf(model, 0, l, EWF_ATTN_NORM, -1, -1), an);
        FAULT_FWD(SITE_ATTN_NORM, l, a->attn_norm, (size_t)N * d);
        if (an && fault_due(model->prot.fx, SITE_ATTN_NORM, l, PASS_FWD)) mmb_row_norms(an, a->attn_norm, N, d, d, s);
        if (ew && ew_due(model, PASS_FWD, l, SITE_ATTN_NORM, l - 1, SITE_BLOCK_OUT)) {
            /* attn_norm from x; x = the previous block's out, from its residual add (fused with this norm or not) */
            const LayerActs* p = l > 0 ? &model->la[l - 1] : NULL;
            ew_check_norm(p ? ew_flag(model, 0, l - 1, EWF_BLOCK_OUT) : NULL, ew_flag(model, 0, l, EWF_ATTN_NORM), x, a->attn_norm,
                          a->attn_ms, p ? p->resid_mid : NULL, p ? p->down : NULL, W(PT_ATTN_NORM, l), N, d, eps, s);
        }
        /* q, k, v: one GEMM over [wq; wk; wv] into a->qkv, then the three sites' injection points on its views */
        linear_forward(a->qkv, a->attn_norm, W(PT_WQ, l), N, d, ldqkv, s);
        FAULT_FWD_LD(SITE_Q_PROJ, l, a->q, N, qd, ldqkv);
        FAULT_FWD_LD(SITE_K_PROJ, l, a->k, N, kd, ldqkv);
        FAULT_FWD_LD(SITE_V_PROJ, l, a->v, N, kd, ldqkv);
        /* -protect bound on v: riding on the launch below that rotates q and k (MmbTail), else its own check launch */
        const MmbTail vt = mmb ? mmb_tail(a->v, (size_t)ldqkv, N, kd, an, mmb_wnorms(model, l, MMB_V_PROJ), mmb_factor(d),
                                          mmb_flag(model, l, MMB_V_PROJ)) : MMB_TAIL_NONE;
        int v_rode = 0;
        /* -protect qk: where its recomputation's fingerprint pass is the kernel below, the GEMM goes first and the pass
         * rides on that launch (qk_rides); elsewhere qk_recompute_check after the path */
        const int qk_ride = qk_rides(model, l, P);
        const QkFpPair rr = qk_ride ? qk_recompute_gemm(model, l, B, T) : QkFpPair{NULL, NULL, 0, NULL, NULL};
        bf16 *qc = a->q, *kc = a->k;
        int ldq = ldqkv, ldk = ldqkv;   /* the row strides of qc, kc: the views, then contiguous */
        /* the kernel producing the Q and K attention consumes also fingerprints them (-protect qk), into the
         * layer's accumulators of the report, compared on the host after the forward. Qwen3's QK norm and RoPE run
         * as one kernel (qknorm_rope.cuh: the same bits) where no fault is due between them (P.qknr_q, P.qknr_k) */
        unsigned long long *pq = qk_fp(model, 0, l, QKF_Q), *pk = qk_fp(model, 0, l, QKF_K);
        if (P.qknr_q && P.qknr_k) {   /* q and k in one launch */
            qknorm_rope_forward_qk(a->qn, a->qn_ms, a->qr, a->kn, a->kn_ms, a->kr, qc, kc, ldq, W(PT_QNORM, l), W(PT_KNORM, l), B, T, H, KV,
                                   hd, eps, model->rope_cos, model->rope_sin, c->rope_style, P.fp_rope ? pq : NULL, P.fp_rope ? pk : NULL, s, vt,
                                   qk_ride ? &rr : NULL);
            v_rode = 1;
        } else if (P.qknr_q)
            qknorm_rope_forward(a->qn, a->qn_ms, a->qr, qc, ldq, W(PT_QNORM, l), B, T, H, hd, eps, model->rope_cos, model->rope_sin,
                                c->rope_style, P.fp_rope ? pq : NULL, s);
        else if (P.qknr_k)
            qknorm_rope_forward(a->kn, a->kn_ms, a->kr, kc, ldk, W(PT_KNORM, l), B, T, KV, hd, eps, model->rope_cos, model->rope_sin,
                                c->rope_style, P.fp_rope ? pk : NULL, s);
        if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {
            if (!P.qknr_q) {
                rmsnorm_forward_ld(a->qn, a->qn_ms, qc, ldq, W(PT_QNORM, l), N, H, hd, eps, s);
                FAULT_FWD(SITE_Q_NORM, l, a->qn, (size_t)N * qd);
            }
            if (!P.qknr_k) {
                rmsnorm_forward_ld(a->kn, a->kn_ms, kc, ldk, W(PT_KNORM, l), N, KV, hd, eps, s);
                FAULT_FWD(SITE_K_NORM, l, a->kn, (size_t)N * kd);
            }
            qc = a->qn; kc = a->kn; ldq = qd; ldk = kd;
        }
        if (!P.qknr_q && !P.qknr_k) {   /* RoPE of q and k in one launch (rope_qk: the bits of two) */
            rope_qk(a->qr, a->kr, qc, kc, ldq, ldk, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, false,
                    P.fp_rope ? pq : NULL, P.fp_rope ? pk : NULL, s, vt, qk_ride ? &rr : NULL);
            v_rode = 1;
        } else if (!P.qknr_q) {
            if (P.fp_rope) rope_forward_fp(a->qr, qc, ldq, model->rope_cos, model->rope_sin, B, T, H, hd, c->rope_style, pq, s);
            else rope_forward(a->qr, qc, ldq, model->rope_cos, model->rope_sin, B, T, H, hd, c->rope_style, s);
        } else if (!P.qknr_k) {
            if (P.fp_rope) rope_forward_fp(a->kr, kc, ldk, model->rope_cos, model->rope_sin, B, T, KV, hd, c->rope_style, pk, s);
            else rope_forward(a->kr, kc, ldk, model->rope_cos, model->rope_sin, B, T, KV, hd, c->rope_style, s);
        }
        if (mmb && !v_rode) mmb_product(model, l, MMB_V_PROJ, kd, a->v, N, kd, ldqkv, a->attn_norm, d, s);
        store_qk(model, SITE_Q_ROPE, l, a->qr, (size_t)N * qd, P.fp_rope ? pq : NULL, s);
        store_qk(model, SITE_K_ROPE, l, a->kr, (size_t)N * kd, P.fp_rope ? pk : NULL, s);
        qc = a->qr; kc = a->kr;
        if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
            if (P.fp_norm) rmsnorm_forward_fp(a->qf, a->qf_ms, qc, NULL, N * H, hd, eps, pq, s);
            else rmsnorm_forward(a->qf, a->qf_ms, qc, NULL, N * H, hd, eps, s);
            store_qk(model, SITE_Q_NORM, l, a->qf, (size_t)N * qd, P.fp_norm ? pq : NULL, s);
            if (P.fp_norm) rmsnorm_forward_fp(a->kf, a->kf_ms, kc, NULL, N * KV, hd, eps, pk, s);
            else rmsnorm_forward(a->kf, a->kf_ms, kc, NULL, N * KV, hd, eps, s);
            store_qk(model, SITE_K_NORM, l, a->kf, (size_t)N * kd, P.fp_norm ? pk : NULL, s);
            qc = a->qf; kc = a->kf;
        }
        if (qk_ride) qk_recompute_dump(model, l, B, T, qc, kc);
        else if (model->prot.on[PK_QK]) qk_recompute_check(model, l, B, T, qc, kc);
        a->fused = P.flash;
        /* -protect bound's o check in the residual add and norm: att_out's row norms from the flash forward that writes it
         * (a sum of squares a head), unless a fault is written into att_out between them (then taken from att_out there) */
        double* o_rss = mmb && P.flash && P.resid_norm && !fault_due(model->prot.fx, SITE_ATT_OUT, l, PASS_FWD) ? model->mmb_rss : NULL;
        if (P.flash) {
            /* -protect att: the kernel's row sums of the logits and probabilities, checked below */
            float* rows = model->prot.on[PK_ATT] ? attcheck_fused_rows(model->chk_scratch, B, H, T) : NULL;
            const FlashCheck fc = {rows, rows ? rows + (size_t)B * H * T : NULL, flash_plant_of(NULL)};
            flash_attention_forward(a->att_out, a->lse, qc, kc, a->v, B, T, H, KV, hd, ldqkv, s, rows ? &fc : NULL, o_rss);
            attention_fused_log_empty(model, l, B, T, PASS_FWD);
            if (fault_due(model->prot.fx, SITE_ATT_OUT, l, PASS_FWD))   /* the fused backward reads the clean out */
                cudaCheck(cudaMemcpyAsync(model_att_out_clean(model), a->att_out, sizeof(bf16) * N * qd, cudaMemcpyDeviceToDevice, s));
        } else {
            attention_forward(a->att_out, a->logits, a->probs, qc, kc, a->v, B, T, H, KV, hd, ldqkv, s);
            attention_forward_faults(model, a, l, B, T, s);
        }
        FAULT_FWD(SITE_ATT_OUT, l, a->att_out, (size_t)N * qd);
        /* -protect att on the fused path: the scan that makes the rows' bounds and compares the flash kernel's row sums rides
         * on the residual add + norm after o_proj below (nothing between writes q, k, the rows or the scratch); where that
         * launch is split (a fault due between its steps), its own launch here */
        AttcScan attc_ride;
        const AttcScan* attc = NULL;
        if (checks && P.flash && P.resid_norm) {
            const size_t nbh_max = (size_t)model->B * H;
            attc_ride = attcheck_fused_forward_ride((int*)(model->rep_dev + model->rep_attc) + (size_t)l * ATTC_NCHECK,
                                                    model->chk_dev + (size_t)l * ATTC_NCHECK * nbh_max, model->chk_scratch, qc, kc, B, T, H, KV, hd);
            attc = &attc_ride;
        } else if (checks && P.flash) {   /* -protect att alone: -detect abft takes the materialised path */
            const size_t nbh_max = (size_t)model->B * H;
            attcheck_fused_forward((int*)(model->rep_dev + model->rep_attc) + (size_t)l * ATTC_NCHECK,
                                   model->chk_dev + (size_t)l * ATTC_NCHECK * nbh_max, model->chk_scratch, qc, kc, B, T, H, KV, hd, s);
        } else if (checks) {
            const size_t nbh_max = (size_t)model->B * H;
            attcheck_forward((int*)(model->rep_dev + model->rep_attc) + (size_t)l * ATTC_NCHECK,
                             model->chk_dev + (size_t)l * ATTC_NCHECK * nbh_max, model->chk_scratch,
                             a->logits, a->probs, a->att_out, qc, kc, a->v, B, T, H, KV, hd, ldqkv, model->prot.abft,
                             model->prot.on[PK_ATT], s);
        }
        if (checks && !attc) attf_dump(model, l, B, T, P.flash, a->logits, a->probs, s);   /* test-only: nothing without TSDC_CHECK_DUMP */
        linear_forward(a->o, a->att_out, W(PT_WO, l), N, qd, d, s);
        FAULT_FWD(SITE_O_PROJ, l, a->o, (size_t)N * d);
        /* -protect bound on o: inside the residual add and norm that read it, the input rows' norms taken there from
         * att_out; elsewhere (a fault due between the add and the norm) its own check launch */
        if (mmb && !P.resid_norm) mmb_product(model, l, MMB_O_PROJ, d, a->o, N, d, d, a->att_out, qd, s);
        /* -protect bound: the norm's kernel also leaves its output rows' norms (mmb_xn) for the gate/up check fused into
         * SwiGLU; where a fault is written into mlp_norm after it, they are taken again from the stored tensor */
        float* xn = mmb && c->mlp == MLP_SWIGLU ? model->mmb_xn : NULL;
        if (P.resid_norm) {
            const MmbFused mbo = {NULL, mmb_wnorms(model, l, MMB_O_PROJ), NULL, mmb_factor(qd), mmb_flag(model, l, MMB_O_PROJ), NULL, NULL,
                                  o_rss ? NULL : a->att_out, qd, o_rss, H};
            residual_rmsnorm_forward(a->resid_mid, a->mlp_norm, a->mlp_ms, x, a->o, W(PT_MLP_NORM, l), N, d, eps, s,
                                     ew_dupf(model, 0, l, EWF_ATTN_RESIDUAL, l, EWF_MLP_NORM), xn, mmb ? &mbo : NULL, attc);
            if (attc) attf_dump(model, l, B, T, P.flash, a->logits, a->probs, s);
        } else {
            residual_forward(a->resid_mid, x, a->o, (size_t)N * d, s);
            FAULT_FWD(SITE_ATTN_RESIDUAL, l, a->resid_mid, (size_t)N * d);
            rmsnorm_forward(a->mlp_norm, a->mlp_ms, a->resid_mid, W(PT_MLP_NORM, l), N, d, eps, s, ew_dupf(model, 0, l, EWF_MLP_NORM, -1, -1), xn);
        }
        FAULT_FWD(SITE_MLP_NORM, l, a->mlp_norm, (size_t)N * d);
        if (xn && fault_due(model->prot.fx, SITE_MLP_NORM, l, PASS_FWD)) mmb_row_norms(xn, a->mlp_norm, N, d, d, s);
        if (ew && ew_due(model, PASS_FWD, l, SITE_ATTN_RESIDUAL, l, SITE_MLP_NORM))
            ew_check_norm(ew_flag(model, 0, l, EWF_ATTN_RESIDUAL), ew_flag(model, 0, l, EWF_MLP_NORM), a->resid_mid, a->mlp_norm, a->mlp_ms,
                          x, a->o, W(PT_MLP_NORM, l), N, d, eps, s);
        bf16* hidden;
        if (c->mlp == MLP_SWIGLU) {
            /* gate, up: one GEMM over [w_gate; w_up] into a->gu, then the two sites' injection points on its views */
            linear_forward(a->gu, a->mlp_norm, W(PT_WGATE, l), N, d, ldgu, s);
            FAULT_FWD_LD(SITE_GATE_PROJ, l, a->gate, N, F, ldgu);
            FAULT_FWD_LD(SITE_UP_PROJ, l, a->up, N, F, ldgu);
            if (mmb && !P.swiglu) mmb_product(model, l, MMB_GATE_PROJ, F, a->gate, N, 2 * F, ldgu, a->mlp_norm, d, s);   /* gate | up: one launch */
            if (P.swiglu) {   /* the same bits, one pass; -protect bound's gate/up check fused in */
                const MmbFused mb = {xn, mmb_wnorms(model, l, MMB_GATE_PROJ), mmb_wnorms(model, l, MMB_UP_PROJ), mmb_factor(d),
                                     mmb_flag(model, l, MMB_GATE_PROJ), mmb_flag(model, l, MMB_UP_PROJ), model->mmb_pn};
                swiglu_forward(a->act, a->prod, a->gate, a->up, N, F, ldgu, s, ew_dupf(model, 0, l, EWF_ACT, l, EWF_MLP_PRODUCT), mmb ? &mb : NULL);
            } else {   /* the fault goes between silu and the product */
                silu_forward(a->act, a->gate, N, F, ldgu, s);
                FAULT_FWD(SITE_ACT, l, a->act, (size_t)N * F);
                mul_forward(a->prod, a->act, a->up, N, F, ldgu, s);
            }
            FAULT_FWD(SITE_MLP_PRODUCT, l, a->prod, (size_t)N * F);
            if (mmb && P.swiglu && fault_due(model->prot.fx, SITE_MLP_PRODUCT, l, PASS_FWD))   /* its norms, of the stored tensor */
                mmb_row_norms(model->mmb_pn, a->prod, N, F, F, s);
            if (ew && ew_due(model, PASS_FWD, l, SITE_ACT, l, SITE_MLP_PRODUCT))
                ew_check_mlp_forward(ew_flag(model, 0, l, EWF_ACT), ew_flag(model, 0, l, EWF_MLP_PRODUCT), a->act, a->prod, a->gate, a->up,
                                     N, F, ldgu, s);
            hidden = a->prod;
        } else {
            linear_forward(a->gate, a->mlp_norm, W(PT_WFC, l), N, d, F, s);
            FAULT_FWD(SITE_GATE_PROJ, l, a->gate, (size_t)N * F);
            if (mmb) mmb_product(model, l, MMB_GATE_PROJ, F, a->gate, N, F, F, a->mlp_norm, d, s);
            relu2_forward(a->act, a->gate, N, F, ldgu, s, ew_dupf(model, 0, l, EWF_ACT, -1, -1));
            FAULT_FWD(SITE_ACT, l, a->act, (size_t)N * F);
            if (ew && ew_due(model, PASS_FWD, l, SITE_ACT)) ew_check_mlp_forward(ew_flag(model, 0, l, EWF_ACT), NULL, a->act, NULL, a->gate, NULL, N, F, ldgu, s);
            hidden = a->act;
        }
        linear_forward(a->down, hidden, W(PT_WDOWN, l), N, F, d, s);
        FAULT_FWD(SITE_DOWN_PROJ, l, a->down, (size_t)N * d);
        /* -protect bound on down: inside the block's residual add and next norm, which reads it, against the product's row
         * norms SwiGLU's forward left (mmb_pn); elsewhere (ReLU^2, a split path) its own check launch */
        const int down_fused = mmb && c->mlp == MLP_SWIGLU && P.swiglu && P.block_norm;
        if (mmb && !down_fused) mmb_product(model, l, MMB_DOWN_PROJ, d, a->down, N, d, d, hidden, F, s);
        normed = P.block_norm;
        if (normed) {   /* the next norm: layer l+1's attn_norm, or the final norm */
            const int last = l + 1 == c->n_layer;
            const MmbFused mbd = {model->mmb_pn, mmb_wnorms(model, l, MMB_DOWN_PROJ), NULL, mmb_factor(F), mmb_flag(model, l, MMB_DOWN_PROJ),
                                  NULL, NULL, NULL, 0};
            residual_rmsnorm_forward(a->out, last ? model->final_norm : model->la[l + 1].attn_norm,
                                     last ? model->final_ms : model->la[l + 1].attn_ms, a->resid_mid, a->down,
                                     last ? W(PT_FINAL_NORM, -1) : W(PT_ATTN_NORM, l + 1), N, d, eps, s,
                                     ew_dupf(model, 0, l, EWF_BLOCK_OUT, last ? -1 : l + 1, EWF_ATTN_NORM),   /* the final norm: not checked */
                                     mmb && !last ? model->mmb_an : NULL, down_fused ? &mbd : NULL);
        } else {
            residual_forward(a->out, a->resid_mid, a->down, (size_t)N * d, s);
            FAULT_FWD(SITE_BLOCK_OUT, l, a->out, (size_t)N * d);
        }
        x = a->out;
    }
    model->loop_syncs += host_syncs_now() - syncs0;
    if (ew && c->n_layer > 0 && ew_due(model, PASS_FWD, c->n_layer - 1, SITE_BLOCK_OUT)) {   /* the last block's residual add (its norm, the final one, is not checked) */
        const LayerActs* p = &model->la[c->n_layer - 1];
        ew_check_norm(ew_flag(model, 0, c->n_layer - 1, EWF_BLOCK_OUT), NULL, p->out, NULL, NULL, p->resid_mid, p->down, NULL, N, d, eps, s);
    }
    if (!normed) rmsnorm_forward(model->final_norm, model->final_ms, x, W(PT_FINAL_NORM, -1), N, d, eps, s);
    /* the Residual Gain Guard's sums of mean squares, all layers in one launch, into the report */
    if (model->prot.on[PK_RGG])
        rgg_ms_sums((double*)model->rep_dev, (double*)(model->rep_dev + model->rep_bad), model->ms_table, 2 * c->n_layer + 1, N, s);
    linear_forward(model->logits, model->final_norm, c->tied ? W(PT_WTE, -1) : W(PT_LMHEAD, -1), N, d, V, s);
    softcap_forward(model->logits, (size_t)N * V, (float)c->softcap, s);
    if (fuse_ce) crossentropy_fused(model->losses, model->lse, model->logits, model->targets, N, V, model->ce_dloss, (float)c->softcap, s);
    else if (with_targets) crossentropy_forward(model->losses, model->lse, model->logits, model->targets, N, V, s);
    model->dlogits_ready = fuse_ce;
    /* the report: one pinned asynchronous copy (flags, counts, RGG sums, and the losses), read after the
     * one synchronisation of the forward, once all its work is queued */
    cudaCheck(cudaMemcpyAsync(model->rep_host, model->rep_dev, model->rep_loss + (with_targets ? sizeof(float) * N : 0),
                              cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
    if (model->prot.on[PK_QK])
        for (int l = 0; l < c->n_layer; l++) gpu_alarm(model, CHECK_QK, l, qk_fp_differ(model, 0, l));
    if (checks) attcheck_collect(model);
    if (ew) ew_collect(model, 0);
    if (mmb) mmb_collect(model);
    if (!with_targets) return 0.0f;
    double sum = 0.0; int cnt = 0;
    for (int n = 0; n < N; n++) if (model->h_targets[n] >= 0) { sum += model->h_losses[n]; cnt++; }
    return cnt ? (float)(sum / cnt) : 0.0f;
}

/* ------------------------------------------------------------------- the gradient reduction
 * Data parallelism sums the fp32 gradients over the ranks. The step's last backward (the host loop arms it:
 * model_reduce_in_backward; the microbatches before it only accumulate) reduces them in buckets while it
 * runs: when the backward has written a bucket's last gradient it records bucket_ready[b] on the main
 * stream, the comm stream waits for that event and all-reduces the bucket in place, and the backward goes
 * on with the next layer while NCCL moves this one. model_allreduce_grads joins the streams (comm_done).
 * Nothing reads the gradients between the backward and that join (the backward guard's norms, found_inf,
 * the detectors and the update all come after; the checks the loop reads between microbatches are
 * activation checks), so what every reader sees is the reduced sum, as with one all-reduce after the
 * backward. Why buckets of a whole all-reduce and not ZeRO-1 (reduce-scatter + sharded AdamW, as llm.c):
 * every reader of the gradients here (the per-tensor norms of the backward guard, model_update_norm, the
 * exponent-scaling check, the checkpoint's full AdamW state) reads whole tensors on every rank; sharding
 * the optimizer would have each of them reduce partial norms over the ranks and gather state for
 * checkpoints. The bucketed all-reduce changes none of them, and hides what is hideable (docs/gpu.md).
 * Determinism: each bucket is one ncclAllReduce of a fixed range in a fixed order; for a fixed world size,
 * topology, NCCL version and environment NCCL's choice of algorithm and channels per message size is
 * fixed, so the bits are the same run to run. They need not equal one whole-buffer all-reduce's: NCCL may
 * pick another algorithm (ring or tree) or chunking for a bucket's size, and so another order of the R
 * terms of an element (with 2 ranks the sum of two terms is the same either way). */
#ifdef USE_NCCL
static ncclComm_t g_nccl;
static int g_nccl_ready = 0;
#endif

/* the step's last backward is next: it reduces its buckets over the ranks as it completes them (one rank:
 * nothing to do). The first call creates the comm stream and the events and says how the buckets fall. */
static void model_reduce_in_backward(Model* model, Dist* dist) {
    if (dist->world == 1) return;
#ifdef USE_NCCL
    if (!model->comm) {
        cudaCheck(cudaStreamCreateWithFlags(&model->comm, cudaStreamNonBlocking));
        model->bucket_ready = (cudaEvent_t*)mallocCheck(sizeof(cudaEvent_t) * model->gb.n);
        for (int b = 0; b < model->gb.n; b++) cudaCheck(cudaEventCreateWithFlags(&model->bucket_ready[b], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&model->comm_done, cudaEventDisableTiming));
        if (dist->rank == 0) {
            const GradBuckets* gb = &model->gb;
            char buf[400];
            int k = snprintf(buf, sizeof(buf), "gradient all-reduce: %d buckets overlapped with the backward, in its order:", gb->n);
            for (int b = 0; b < gb->n && k < (int)sizeof(buf) - 40; b++) {
                int run = 1;   /* equal consecutive layer buckets as one entry */
                while (b + run < gb->n && gb->layer[b] >= 0 && gb->layer[b + run] >= 0 && gb->numel[b + run] == gb->numel[b]) run++;
                const char* what = gb->layer[b] == GB_TAIL ? "tail" : gb->layer[b] == GB_HEAD ? "head" : "layer";
                if (run > 1) k += snprintf(buf + k, sizeof(buf) - k, " %d %ss x %zu", run, what, gb->numel[b]);
                else k += snprintf(buf + k, sizeof(buf) - k, " %s %zu", what, gb->numel[b]);
                k += snprintf(buf + k, sizeof(buf) - k, "%s", b + run < gb->n ? "," : "");
                b += run - 1;
            }
            printf("%s fp32 gradients (%.1f MB)\n", buf, model->L.total * 4 / 1e6);
        }
    }
    model->reduce_dist = dist;
    model->gb_next = 0;
    model->grads_reduced = 0;
#else
    tsdc_fail("%d ranks: this binary was built without NCCL, so it trains on one GPU only", dist->world);
#endif
}

/* the backward has queued the last kernel that writes bucket `which` (a layer, GB_TAIL or GB_HEAD): when
 * armed, its all-reduce goes on the comm stream behind an event on the main stream */
static void grad_bucket_done(Model* model, int which) {
    if (!model->reduce_dist) return;
    const GradBuckets* gb = &model->gb;
    const int b = model->gb_next;
    if (b >= gb->n || gb->layer[b] != which) {
        if (which < 0) return;   /* an empty tail or head has no bucket */
        tsdc_fail("internal: the backward completed layer %d's gradients, but the next bucket is %d of %d", which, b, gb->n);
    }
#ifdef USE_NCCL
    cudaCheck(cudaEventRecord(model->bucket_ready[b], model->stream));
    cudaCheck(cudaStreamWaitEvent(model->comm, model->bucket_ready[b], 0));
    float* g = model->grads + gb->off[b];
    ncclCheck(ncclAllReduce(g, g, gb->numel[b], ncclFloat, ncclSum, g_nccl, model->comm));
    {   /* ring all-reduce of the bucket, on the comm stream (overlapped with the backward) */
        const double R = model->reduce_dist->world, n = (double)gb->numel[b];
        launch_account(COST_ALLREDUCE, "ncclAllReduce", COST_NET, 1, n * (R - 1) / R, 8.0 * n * (R - 1) / R, 8.0 * n * (R - 1) / R);
    }
#endif
    if (++model->gb_next == gb->n) {
        cudaCheck(cudaEventRecord(model->comm_done, model->comm));
        model->grads_reduced = 1;
        model->reduce_dist = NULL;
    }
}

/* the gradient of q_proj or k_proj, stored (a [N, cols] view with row stride ld): the fault injector's hook, and where
 * the producing kernel took its fingerprint (fp not NULL, -protect qk_bwd), the fingerprint taken again over what
 * the fault left, as store_qk in the forward */
static void store_dqk(Model* model, int site, int l, bf16* x, int N, int cols, int ld, unsigned long long* fp, cudaStream_t s) {
    if (!fault_due(model->prot.fx, site, l, PASS_BWD)) return;
    fault_apply_device_ld(model->prot.fx, x, (size_t)N, (size_t)cols, (size_t)ld, s);
    if (fp) {
        CostScope cs("qk_bwd");
        fingerprint_zero(fp, s);
        qk_fingerprint_rows_acc(fp, x, N, cols, ld, s);
    }
}

/* --------------------------------------------------------------------------------- backward */
static void model_backward_step(Model* model, int B, int T, float dloss) {
    const Config* c = &model->c;
    cudaStream_t s = model->stream;
    int N = B * T, d = c->d_model, H = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    int qd = H * hd, kd = KV * hd, F = c->ffn_dim, V = c->vocab_size;
    float eps = (float)c->norm_eps;
    bf16 *dres = model->dres, *dbuf = model->dbuf;
    const int ldqkv = model->ldqkv, ldgu = model->ldgu;
    /* Gradients: the first backward after model_zero_grads writes every gradient (GEMMs with beta 0, the
     * norms' dw kernels with accumulate 0) instead of adding to a memset; the later microbatches add. Each
     * gradient tensor is written by exactly one kernel a backward, but for the embedding: tied, the lm
     * head's GEMM writes it first and embedding_backward adds; untied, only embedding_backward (a scatter
     * into the rows of the batch's tokens) touches it, so that tensor alone is zeroed first. The fused
     * [wq; wk; wv] and [w_gate; w_up] gradients are one tensor range each, written by their one dW GEMM. */
    const int acc = !model->grads_fresh;
    model->grads_fresh = 0;
    check_dump_bwd++;   /* the test-only dump's backward count (llmc/sdc/checks.h) */
    model->norms_valid = 0;
    const int ew = model->prot.on[PK_EW];
    const size_t ewb_bytes = (size_t)c->n_layer * EW_BWD_SLOTS * sizeof(int);
    if (ew) cudaCheck(cudaMemsetAsync(model->rep_dev + model->rep_ewb, 0, ewb_bytes, s));
    if (ew && !model->ew_dres) cudaCheck(cudaMalloc(&model->ew_dres, sizeof(bf16) * (size_t)model->B * model->T * d));

    bf16* dlogits = model->logits;
    if (model->dlogits_ready) {   /* the forward's one-pass classifier wrote them, for this dloss */
        if (dloss != model->ce_dloss) tsdc_fail("internal: the backward's dloss %g is not the %g the forward's classifier used", dloss, model->ce_dloss);
        model->dlogits_ready = 0;
    } else {
        crossentropy_softcap_backward(dlogits, model->logits, model->lse, model->targets, N, V, dloss, (float)c->softcap, s);
    }
    const bf16* lm_w = c->tied ? W(PT_WTE, -1) : W(PT_LMHEAD, -1);
    float* lm_g = c->tied ? GR(PT_WTE, -1) : GR(PT_LMHEAD, -1);
    exp_profile(model, c->tied ? PT_WTE : PT_LMHEAD, -1, dlogits, (size_t)N * V);
    linear_backward_dx_bf16(dbuf, dlogits, lm_w, N, d, V, s);
    linear_backward_dw_acc(lm_g, dlogits, model->final_norm, N, d, V, acc, s);
    rmsnorm_backward_acc(dres, GR(PT_FINAL_NORM, -1), dbuf, model->la[c->n_layer - 1].out, W(PT_FINAL_NORM, -1), model->final_ms,
                     N, d, eps, 0, acc, s, ew_dupf(model, 1, c->n_layer - 1, EWB_BLOCK_OUT, -1, -1));
    /* what wrote dres last, for ew's check of d(block_out): the next layer's attn_norm backward (accumulating into the
     * copy kept in ew_dres), here the final norm's (writing) */
    const bf16 *res_x = model->la[c->n_layer - 1].out, *res_w = W(PT_FINAL_NORM, -1);
    const float* res_ms = model->final_ms;
    int res_acc = 0;
    grad_bucket_done(model, GB_TAIL);   /* lm_head and the final norm: written */
    bwd_checks_begin(model, B, T, s);
    const long long syncs0 = host_syncs_now();   /* -stats: none may happen inside the layer loop */
    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs* a = &model->la[l];
        bf16* x_in = l > 0 ? model->la[l - 1].out : (c->embed_norm ? model->x0 : model->emb);
        FAULT_BWD(SITE_BLOCK_OUT, l, dres, (size_t)N * d);
        if (ew && ew_due(model, PASS_BWD, l, SITE_BLOCK_OUT)) {
            CostScope cs("ew");
            rmsnorm_backward(model->ew_dres, NULL, dbuf, res_x, res_w, res_ms, N, d, eps, res_acc, s);
            ew_check_equal(ew_flag(model, 1, l, EWB_BLOCK_OUT), dres, model->ew_dres, N, d, s);
        }
        /* d(down) shares dres with the skip path: a fault there goes into a private copy (dbuf) */
        const bf16* ddown = fault_bwd_private(model, SITE_DOWN_PROJ, l, dres, dbuf, (size_t)N * d, s);
        /* MLP block */
        if (c->mlp == MLP_SWIGLU) {
            exp_profile(model, PT_WDOWN, l, ddown, (size_t)N * d);
            linear_backward_dx_bf16(model->dF, ddown, W(PT_WDOWN, l), N, F, d, s);
            linear_backward_dw_acc(GR(PT_WDOWN, l), ddown, a->prod, N, F, d, acc, s);
            FAULT_BWD(SITE_MLP_PRODUCT, l, model->dF, (size_t)N * F);
            /* d(gate), d(up) into the views of model->dgu [N, 2F] (row stride ldgu), what the fused GEMMs read;
             * d(prod) stays in dF for the ew checks */
            bf16 *dgate = model->dgu, *dup = model->dgu + F;
            const int split = fault_due(model->prot.fx, SITE_ACT, l, PASS_BWD);
            const int ew_mlp = ew && ew_due(model, PASS_BWD, l, SITE_ACT, l, SITE_UP_PROJ, l, SITE_GATE_PROJ);   /* recomputation checks */
            if (split) {   /* the fault goes into d(act), between the steps */
                mul_backward(model->dF2, dup, model->dF, a->act, a->up, N, F, ldgu, s);
                FAULT_BWD(SITE_ACT, l, model->dF2, (size_t)N * F);
                FAULT_BWD_LD(SITE_UP_PROJ, l, dup, N, F, ldgu);
                if (ew_mlp)
                    ew_check_swiglu_backward(ew_flag(model, 1, l, EWB_ACT), ew_flag(model, 1, l, EWB_UP_PROJ), NULL, NULL, dup,
                                             model->dF2, model->dF, a->act, a->gate, a->up, N, F, ldgu, s);
                silu_backward(dgate, model->dF2, a->gate, N, F, ldgu, s);
            } else {   /* the same bits, one pass */
                swiglu_backward(dgate, dup, model->dF, a->act, a->gate, a->up, N, F, ldgu, s, ew_dupf(model, 1, l, EWB_UP_PROJ, l, EWB_GATE_PROJ));
                FAULT_BWD_LD(SITE_UP_PROJ, l, dup, N, F, ldgu);
            }
            FAULT_BWD_LD(SITE_GATE_PROJ, l, dgate, N, F, ldgu);
            if (ew_mlp && split)
                ew_check_swiglu_backward(NULL, NULL, ew_flag(model, 1, l, EWB_GATE_PROJ), dgate, NULL, model->dF2, NULL, NULL, a->gate, NULL,
                                         N, F, ldgu, s);
            else if (ew_mlp)
                ew_check_swiglu_backward(NULL, ew_flag(model, 1, l, EWB_UP_PROJ), ew_flag(model, 1, l, EWB_GATE_PROJ), dgate, dup, NULL,
                                         model->dF, a->act, a->gate, a->up, N, F, ldgu, s);
            exp_profile_ld(model, PT_WGATE, l, dgate, (size_t)N * F, F, ldgu);
            exp_profile_ld(model, PT_WUP, l, dup, (size_t)N * F, F, ldgu);
            /* one dx GEMM (K = 2F, rounded to bf16 once) and one dW GEMM into the adjacent [w_gate; w_up] gradients */
            linear_backward_dx_bf16(dbuf, model->dgu, W(PT_WGATE, l), N, d, ldgu, s);
            linear_backward_dw_acc(GR(PT_WGATE, l), model->dgu, a->mlp_norm, N, d, ldgu, acc, s);
        } else {
            exp_profile(model, PT_WDOWN, l, ddown, (size_t)N * d);
            linear_backward_dx_bf16(model->dF, ddown, W(PT_WDOWN, l), N, F, d, s);
            linear_backward_dw_acc(GR(PT_WDOWN, l), ddown, a->act, N, F, d, acc, s);
            FAULT_BWD(SITE_ACT, l, model->dF, (size_t)N * F);
            relu2_backward(model->dF2, model->dF, a->gate, N, F, ldgu, s, ew_dupf(model, 1, l, EWB_GATE_PROJ, -1, -1));
            FAULT_BWD(SITE_GATE_PROJ, l, model->dF2, (size_t)N * F);
            if (ew && ew_due(model, PASS_BWD, l, SITE_GATE_PROJ)) ew_check_relu2_backward(ew_flag(model, 1, l, EWB_GATE_PROJ), model->dF2, model->dF, a->gate, N, F, ldgu, s);
            exp_profile(model, PT_WFC, l, model->dF2, (size_t)N * F);
            linear_backward_dx_bf16(dbuf, model->dF2, W(PT_WFC, l), N, d, F, s);
            linear_backward_dw_acc(GR(PT_WFC, l), model->dF2, a->mlp_norm, N, d, F, acc, s);
        }
        FAULT_BWD(SITE_MLP_NORM, l, dbuf, (size_t)N * d);
        const int ew_res = ew && ew_due(model, PASS_BWD, l, SITE_ATTN_RESIDUAL);   /* the recomputation needs dres as it was */
        if (ew_res) ew_keep(model->ew_dres, dres, (size_t)N * d, s);
        rmsnorm_backward_acc(dres, GR(PT_MLP_NORM, l), dbuf, a->resid_mid, W(PT_MLP_NORM, l), a->mlp_ms, N, d, eps, 1, acc, s,
                             ew_dupf(model, 1, l, EWB_ATTN_RESIDUAL, -1, -1));
        FAULT_BWD(SITE_ATTN_RESIDUAL, l, dres, (size_t)N * d);
        if (ew_res) {
            CostScope cs("ew");
            rmsnorm_backward(model->ew_dres, NULL, dbuf, a->resid_mid, W(PT_MLP_NORM, l), a->mlp_ms, N, d, eps, 1, s);
            ew_check_equal(ew_flag(model, 1, l, EWB_ATTN_RESIDUAL), dres, model->ew_dres, N, d, s);
        }
        /* attention block; d(o) shares dres with the skip path, as d(down) */
        const bf16* dout_o = fault_bwd_private(model, SITE_O_PROJ, l, dres, dbuf, (size_t)N * d, s);
        exp_profile(model, PT_WO, l, dout_o, (size_t)N * d);
        linear_backward_dx_bf16(model->datt, dout_o, W(PT_WO, l), N, qd, d, s);
        linear_backward_dw_acc(GR(PT_WO, l), dout_o, a->att_out, N, qd, d, acc, s);
        FAULT_BWD(SITE_ATT_OUT, l, model->datt, (size_t)N * qd);
        const bf16* qc = c->qk_norm == QKNORM_PLAIN_POST_ROPE ? a->qf : a->qr;
        const bf16* kc = c->qk_norm == QKNORM_PLAIN_POST_ROPE ? a->kf : a->kr;
        /* the gradients of q_proj, k_proj, v_proj: views of model->dqkv (row stride ldqkv); attention writes d(v)
         * there directly and dq, dk contiguous, which the QK norm / RoPE backward carry into the views */
        bf16 *dqv = model->dqkv, *dkv = model->dqkv + qd, *dvv = model->dqkv + qd + kd;
        /* att_logits / att_probs: see attention_forward_faults. A forward fault in the probs may have put a
         * value at s > t, which the CPU never reads: the backward gets a masked copy. A backward fault runs
         * the split backward, which stores dprobs (the gradient of att_probs) and then, in place, dlogits
         * (of att_logits) as bf16 [B,H,T,T] tensors to inject into. -protect att_bwd runs the split backward at
         * every layer and checks dprobs, dlogits (and dV below) where the CPU does, after their injection points;
         * its dprobs/dlogits go into the layer's logits tensor (the backward never reads it), so they never share
         * the scratch with a masked copy of the probs. */
        int qkb_path = QKB_FLASH;
        const bf16 *qkb_o = NULL, *qkb_probs = NULL;
        bf16* qkb_dl = NULL;
        if (a->fused) {
            /* fused backward: P recomputed from q, k and the saved lse; D from the clean out */
            const bf16* o = fault_due(model->prot.fx, SITE_ATT_OUT, l, PASS_FWD) ? model->att_out_clean : a->att_out;
            /* -protect att_bwd: the dq kernel's row sums of dprobs and dlogits, checked against the CPU's bounds */
            float* rows = model->prot.on[PK_ATT_BWD] ? attcheck_fused_rows(model->chk_scratch, B, H, T) : NULL;
            const FlashCheck fc = {rows, rows ? rows + (size_t)B * H * T : NULL, flash_plant_of(NULL)};
            /* -protect qk_bwd: D computed twice and compared (its rerun reads this D, flash_attention_backward) */
            flash_attention_backward(model->dq, model->dk, dvv, model->datt, o, a->lse, qc, kc, a->v, B, T, H, KV, hd, ldqkv, s,
                                     rows ? &fc : NULL, model->prot.on[PK_QK_BWD] ? qk_fp(model, 1, l, QKF_D) : NULL);
            attention_fused_log_empty(model, l, B, T, PASS_BWD);
            qkb_o = o;   /* its rows are checked with dV below, one launch */
        } else {
            const bf16* probs = a->probs;
            if (fault_due(model->prot.fx, SITE_ATT_PROBS, l, PASS_FWD)) {
                bf16* pm = model_att_scratch(model);
                attention_causal_mask(pm, a->probs, B, H, T, s);
                probs = pm;
            }
            const int attb = model->prot.on[PK_ATT_BWD];
            if (attb || fault_due(model->prot.fx, SITE_ATT_PROBS, l, PASS_BWD) || fault_due(model->prot.fx, SITE_ATT_LOGITS, l, PASS_BWD)) {
                const size_t natt = (size_t)B * H * T * T;
                /* without att_bwd, not the masked probs: that needs a forward event */
                bf16* dpl = attb ? a->logits : model_att_scratch(model);
                attention_split_av_backward(dpl, dvv, model->datt, probs, a->v, B, T, H, KV, hd, ldqkv, s);
                FAULT_BWD(SITE_ATT_PROBS, l, dpl, natt);
                if (attb) attcheck_backward_dprobs(attb_counts(model, l), attb_flags(model, l), model->chk_scratch, dpl, model->datt, qd, a->v, ldqkv,
                                                   B, T, H, KV, hd, s);
                attention_split_softmax_backward(dpl, dpl, probs, B, H, T, s);
                FAULT_BWD(SITE_ATT_LOGITS, l, dpl, natt);
                if (attb) attcheck_backward_dlogits(attb_counts(model, l), attb_flags(model, l), model->chk_scratch, dpl, B, T, H, s);
                attention_split_logits_backward(model->dq, model->dk, dpl, qc, kc, B, T, H, KV, hd, s);
                qkb_path = QKB_SPLIT;
                qkb_dl = dpl;
            } else {
                attention_backward(model->dq, model->dk, dvv, model->datt, probs, qc, kc, a->v, B, T, H, KV, hd, ldqkv, s);
                qkb_path = QKB_MATERIALISED;
                qkb_probs = probs;
            }
        }
        FAULT_BWD_LD(SITE_V_PROJ, l, dvv, N, kd, ldqkv);
        /* -protect att_bwd on the fused path: the dq kernel's rows against the scan's bounds, and dV, as extra blocks of
         * the launch that rotates dq and dk back below (nothing between writes dout, v, dv, the rows or the scratch) */
        AttbFused attb_ride;
        const AttbFused* attb = NULL;
        if (model->prot.on[PK_ATT_BWD]) {
            /* the chunked dV check's partials after the rows the scans use (chk_scratch holds 6 B H T of the model's) */
            const size_t nmax = (size_t)model->B * H * model->T;
            if (a->fused) {
                attb_ride = attcheck_fused_backward_ride(attb_counts(model, l), attb_flags(model, l), model->chk_scratch, model->datt, qd, a->v,
                                                         ldqkv, dvv, ldqkv, B, T, H, KV, hd, attb_dump_bound(model), model->chk_scratch + 5 * nmax,
                                                         nmax, attb_done(model, l));
                attb = &attb_ride;
            } else {
                attcheck_backward_dv(attb_counts(model, l), attb_flags(model, l), attb_dump_bound(model), dvv, ldqkv, model->datt, qd, B, T, H,
                                     KV, hd, s, model->chk_scratch + 5 * nmax, nmax, attb_done(model, l));
                attb_dump(model, l, B, T, s);
            }
        }
        bf16 *dq = model->dq, *dk = model->dk, *dq2 = model->dq2, *dk2 = model->dk2, *t;
        if (c->qk_norm == QKNORM_PLAIN_POST_ROPE) {
            FAULT_BWD(SITE_Q_NORM, l, dq, (size_t)N * qd);
            FAULT_BWD(SITE_K_NORM, l, dk, (size_t)N * kd);
            rmsnorm_backward(dq2, NULL, dq, a->qr, NULL, a->qf_ms, N * H, hd, eps, 0, s);
            rmsnorm_backward(dk2, NULL, dk, a->kr, NULL, a->kf_ms, N * KV, hd, eps, 0, s);
            t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
        }
        FAULT_BWD(SITE_Q_ROPE, l, dq, (size_t)N * qd);
        FAULT_BWD(SITE_K_ROPE, l, dk, (size_t)N * kd);
        /* -protect qk_bwd: the kernel producing the gradients of q_proj and k_proj fingerprints them as it writes */
        const int qkb = model->prot.on[PK_QK_BWD];
        unsigned long long *fpq = qkb ? qk_fp(model, 1, l, QKF_Q) : NULL, *fpk = qkb ? qk_fp(model, 1, l, QKF_K) : NULL;
        const int qknr_bwd = c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE && qknorm_rope_ok(hd, ldqkv, a->q, W(PT_QNORM, l)) &&
                             qknorm_rope_ok(hd, ldqkv, a->k, W(PT_KNORM, l)) && !fault_due(model->prot.fx, SITE_Q_NORM, l, PASS_BWD) &&
                             !fault_due(model->prot.fx, SITE_K_NORM, l, PASS_BWD);
        if (qknr_bwd) {   /* Qwen3: RoPE's and the QK norm's backward of q and k in one launch, into the views, the norms' dw riding */
            rope_qknorm_backward_qk(dqv, dkv, GR(PT_QNORM, l), GR(PT_KNORM, l), dq, dk, a->q, a->k, ldqkv, W(PT_QNORM, l), W(PT_KNORM, l), a->qn_ms,
                                    a->kn_ms, B, T, H, KV, hd, eps, acc, model->rope_cos, model->rope_sin, c->rope_style, fpq, fpk, attb, s);
        } else if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) {   /* RoPE's backward into scratch (q and k one launch), the QK norm's into the views */
            rope_qk(dq2, dk2, dq, dk, qd, kd, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, true, NULL, NULL, s, MMB_TAIL_NONE,
                    NULL, attb);
            t = dq; dq = dq2; dq2 = t; t = dk; dk = dk2; dk2 = t;
            FAULT_BWD(SITE_Q_NORM, l, dq, (size_t)N * qd);
            FAULT_BWD(SITE_K_NORM, l, dk, (size_t)N * kd);
            rmsnorm_backward_ld(dqv, GR(PT_QNORM, l), dq, a->q, ldqkv, W(PT_QNORM, l), a->qn_ms, N, H, hd, eps, 0, acc, s, fpq);
            rmsnorm_backward_ld(dkv, GR(PT_KNORM, l), dk, a->k, ldqkv, W(PT_KNORM, l), a->kn_ms, N, KV, hd, eps, 0, acc, s, fpk);
        } else {   /* RoPE's backward of q and k into the views, one launch (fingerprinting them under qk_bwd) */
            rope_qk(dqv, dkv, dq, dk, ldqkv, ldqkv, model->rope_cos, model->rope_sin, B, T, H, KV, hd, c->rope_style, true, fpq, fpk, s, MMB_TAIL_NONE,
                    NULL, attb);
        }
        if (attb) attb_dump(model, l, B, T, s);
        store_dqk(model, SITE_Q_PROJ, l, dqv, N, qd, ldqkv, fpq, s);
        store_dqk(model, SITE_K_PROJ, l, dkv, N, kd, ldqkv, fpk, s);
        if (model->prot.on[PK_QK_BWD]) qk_bwd_recompute_check(model, l, B, T, qkb_path, qkb_o, qkb_probs, qkb_dl, qc, kc, dqv, dkv, ldqkv);
        exp_profile_ld(model, PT_WQ, l, dqv, (size_t)N * qd, qd, ldqkv);
        exp_profile_ld(model, PT_WK, l, dkv, (size_t)N * kd, kd, ldqkv);
        exp_profile_ld(model, PT_WV, l, dvv, (size_t)N * kd, kd, ldqkv);
        /* one dx GEMM (K = qd + 2 kd, rounded to bf16 once) and one dW GEMM into the adjacent [wq; wk; wv] gradients */
        linear_backward_dx_bf16(dbuf, model->dqkv, W(PT_WQ, l), N, d, ldqkv, s);
        linear_backward_dw_acc(GR(PT_WQ, l), model->dqkv, a->attn_norm, N, d, ldqkv, acc, s);
        FAULT_BWD(SITE_ATTN_NORM, l, dbuf, (size_t)N * d);
        if (ew && l > 0 && ew_due(model, PASS_BWD, l - 1, SITE_BLOCK_OUT)) ew_keep(model->ew_dres, dres, (size_t)N * d, s);
        /* d(block_out) of layer l - 1 (layer 0's goes to the embedding, which the CPU does not check either) */
        rmsnorm_backward_acc(dres, GR(PT_ATTN_NORM, l), dbuf, x_in, W(PT_ATTN_NORM, l), a->attn_ms, N, d, eps, 1, acc, s,
                             ew_dupf(model, 1, l - 1, EWB_BLOCK_OUT, -1, -1));
        res_x = x_in; res_w = W(PT_ATTN_NORM, l); res_ms = a->attn_ms; res_acc = 1;
        grad_bucket_done(model, l);   /* the layer's last gradient kernel is queued */
    }
    model->loop_syncs += host_syncs_now() - syncs0;
    if (c->embed_norm) {
        rmsnorm_backward_acc(dbuf, GR(PT_EMBED_NORM, -1), dres, model->emb, W(PT_EMBED_NORM, -1), model->emb_ms, N, d, eps, 0, acc, s);
        dres = dbuf;
    }
    if (!acc && !c->tied) cudaCheck(cudaMemsetAsync(GR(PT_WTE, -1), 0, sizeof(float) * (size_t)V * d, s));
    embedding_backward(GR(PT_WTE, -1), dres, model->inputs, N, d, s);
    grad_bucket_done(model, GB_HEAD);
    if (model->reduce_dist) tsdc_fail("internal: the backward completed %d of its %d gradient buckets", model->gb_next, model->gb.n);
    bwd_checks_collect(model, s);   /* the backward's reports (ew's flags, qk_bwd, att_bwd): one synchronisation */
}

/* --------------------------------------------------------------------------------- optimizer */
/* no memset: the next backward writes every gradient instead of adding (model_backward_step); the
 * exponent-scaling fold is reset */
static void model_zero_grads(Model* model) {
    model->grads_fresh = 1;
    model->unscale = 1.0f;
    model->norms_valid = 0;
}

/* The step's gradients summed over the ranks. After a backward that model_reduce_in_backward armed, every
 * bucket's all-reduce is already queued on the comm stream: the main stream waits for the last (comm_done)
 * before anything that follows reads the gradients (the norms, the guards, the update), and the host does
 * not wait. Otherwise (a backward nobody armed) one all-reduce of the whole buffer on the main stream. */
static void model_allreduce_grads(Model* model, Dist* dist) {
    if (dist->world == 1) return;
    model->norms_valid = 0;
#ifdef USE_NCCL
    if (model->grads_reduced) {
        cudaCheck(cudaStreamWaitEvent(model->stream, model->comm_done, 0));
        model->grads_reduced = 0;
        return;
    }
    ncclCheck(ncclAllReduce(model->grads, model->grads, model->L.total, ncclFloat, ncclSum, g_nccl, model->stream));
    /* ring all-reduce: each rank sends and receives 2 (R-1)/R of the fp32 gradients, adds (R-1)/R of them */
    launch_account(COST_ALLREDUCE, "ncclAllReduce", COST_NET, 1, (double)model->L.total * (dist->world - 1) / dist->world,
                   8.0 * model->L.total * (dist->world - 1) / dist->world, 8.0 * model->L.total * (dist->world - 1) / dist->world);
#else
    (void)model;
    tsdc_fail("%d ranks: this binary was built without NCCL, so it trains on one GPU only", dist->world);
#endif
}

/* the scalars of the AdamW step t with the gradient norm `norm` (clip coefficient as torch's
 * clip_grad_norm_: clip/(norm+1e-6) when clip > 0 and that is < 1); decay is set per tensor by the caller */
static AdamWParams adamw_params(const AdamW* o, long long t, double clip, double norm) {
    AdamWParams h;
    h.grad_scale = 1.0f;
    if (clip > 0) { double cc = clip / (norm + 1e-6); if (cc < 1.0) h.grad_scale = (float)cc; }
    double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
    h.step_size = (float)(o->lr / bc1);
    h.bc2_sqrt = (float)sqrt(bc2);
    h.b1 = (float)o->beta1; h.b2 = (float)o->beta2; h.eps = (float)o->eps;
    h.decay = 1.0f;
    h.unscale = 1.0f;
    return h;
}

/* The gradient norms of the step, once: every tensor's sum of squares of (grad * unscale) in one pass
 * (llmc/cuda/multi_tensor.cuh: two launches), one pinned copy, one synchronisation; the global one is their
 * sum in tensor order. Kept until the gradients change (backward, all-reduce, zero, unscale), so the
 * found_inf test, the backward guard's per-layer norms, the detectors and the update share it. */
static void model_norms(Model* model) {
    if (model->norms_valid) return;
    const int n = model->L.n;
    mt_grad_sumsq(model->ss_dev, model->mt_part, model->grads, model->unscale, &model->mt, model->stream);
    cudaCheck(cudaMemcpyAsync(model->ss_host, model->ss_dev, sizeof(double) * n, cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    double s2 = 0.0;
    for (int i = 0; i < n; i++) s2 += model->ss_host[i];
    model->norm2 = s2;
    model->norms_valid = 1;
}

/* One launch updates every parameter (llmc/cuda/multi_tensor.cuh adamw_multi_tensor: per-tensor decay from the
 * chunk table; exponent scaling's unscale folded into the gradient scale) with the norm of model_norms
 * (computed here if the loop has not yet). Nothing waits for the update: the next step's first copy
 * does, and model_host_state / the checksum synchronise before they read. */
static double model_update(Model* model, const AdamW* o, long long t, double clip) {
    model_norms(model);
    const double norm = sqrt(model->norm2);
    AdamWParams h = adamw_params(o, t, clip, norm);
    h.unscale = model->unscale;
    const float decay = (float)(1.0 - o->lr * o->weight_decay);
    if (model->prot.on[PK_BOUND] && model->mt_rows.first) {
        /* -protect bound: the new weights' row norms made by the update itself, the same bits as mmb_prepare's pass */
        adamw_multi_tensor_rows(model->params, model->wbf, model->grads, model->m, model->v, &model->mt_rows, h, decay, "bound",
                                model->stream);
        model->mmb_wn_valid = 1;
    } else {
        adamw_multi_tensor(model->params, model->wbf, model->grads, model->m, model->v, &model->mt, h, decay, model->L.total, model->stream);
        model->mmb_wn_valid = 0;
        /* -protect bound: the new weights' row norms now, once a step (the cost model's window holds the update) */
        if (model->prot.on[PK_BOUND]) mmb_prepare(model, model->stream);
    }
    return norm;
}

/* the global L2 norm of the gradients as they are now (after all-reduce, x the unscale): model_norms, the
 * same bits as the norm model_update uses and returns */
static double model_grad_norm(Model* model) { model_norms(model); return sqrt(model->norm2); }
/* sum of squares of the gradients [off, off + n) (x the unscale; the backward guard's per-layer norms): the
 * sum of model_norms' per-tensor sums in tensor order when the range is whole tensors (the guard's are),
 * else a pass of its own (global_norm.cuh; synchronises) */
static double model_grad_sumsq_range(Model* model, size_t off, size_t n) {
    CostScope cost_scope("bwd");   /* the backward guard's groups */
    int i = 0;
    while (i < model->L.n && model->L.t[i].offset < off) i++;
    if (i < model->L.n && model->L.t[i].offset == off) {
        size_t covered = 0;
        int j = i;
        while (j < model->L.n && covered < n) covered += model->L.t[j++].numel;
        if (covered == n) {
            model_norms(model);
            double s2 = 0.0;
            for (int k = i; k < j; k++) s2 += model->ss_host[k];
            return s2;
        }
    }
    return global_norm_squared_scaled(model->grads + off, n, model->unscale, model->stream);
}

/* model_update_norm's kernel: per element the AdamW step of adamw_element (llmc/cuda/adamw.cuh, the update
 * kernel's own element math) on register copies (nothing is written), delta = p' - p in fp32, delta^2
 * summed in double in global_norm.cuh's fixed order (GNORM_BLOCKS x GNORM_THREADS threads, grid-stride
 * by global thread index, fixed warp and block trees, one partial a block; the host sums the partials in
 * index order). The decay of element i is its tensor's: each thread's indices only grow, so it walks
 * seg_end (the tensors' end offsets, ascending) with a cursor. */
__global__ static void update_norm_partials_kernel(double* part, const float* p, const float* grad, const float* m, const float* v, size_t n,
                                                   const size_t* seg_end, const int* seg_decay, int nseg, AdamWParams h, float decay) {
    const size_t stride = (size_t)GNORM_BLOCKS * GNORM_THREADS;
    double acc = 0.0;
    int cur = 0;
    for (size_t i = (size_t)blockIdx.x * GNORM_THREADS + threadIdx.x; i < n; i += stride) {
        while (cur < nseg - 1 && i >= seg_end[cur]) cur++;
        AdamWParams e = h;
        e.decay = seg_decay[cur] ? decay : 1.0f;
        const float p0 = p[i];
        float pi = p0, mi = m[i], vi = v[i];
        adamw_element(pi, mi, vi, grad[i], e);
        const float dlt = pi - p0;
        acc += (double)dlt * dlt;
    }
    gnorm_block_reduce(acc, part);
}

/* ||p' - p||_2 (fp32 master weights) of the step model_update(model, o, t, clip) would make now, with
 * grad_norm the gradient norm it would compute (model_grad_norm); changes no state. Synchronises. */
static double model_update_norm(Model* model, const AdamW* o, long long t, double clip, double grad_norm) {
    const int nseg = model->L.n;
    if (!model->upd_seg_end) {
        size_t* e = (size_t*)mallocCheck(sizeof(size_t) * nseg);
        int* dk = (int*)mallocCheck(sizeof(int) * nseg);
        size_t end = 0;
        for (int i = 0; i < nseg; i++) {
            const TensorInfo* ti = &model->L.t[i];
            if (ti->offset != end) tsdc_fail("internal: model_update_norm needs the tensors contiguous in layout order");
            end += ti->numel;
            e[i] = end;
            dk[i] = ti->decay;
        }
        if (end != model->L.total) tsdc_fail("internal: model_update_norm: tensors cover %zu of %zu parameters", end, model->L.total);
        cudaCheck(cudaMalloc(&model->upd_seg_end, sizeof(size_t) * nseg));
        cudaCheck(cudaMalloc(&model->upd_seg_decay, sizeof(int) * nseg));
        cudaCheck(cudaMemcpy(model->upd_seg_end, e, sizeof(size_t) * nseg, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(model->upd_seg_decay, dk, sizeof(int) * nseg, cudaMemcpyHostToDevice));
        free(e); free(dk);
    }
    AdamWParams h = adamw_params(o, t, clip, grad_norm);
    h.unscale = model->unscale;
    const float decay = (float)(1.0 - o->lr * o->weight_decay);
    double* part = (double*)cuda_workspace_f32(1, 2 * (size_t)GNORM_BLOCKS);   /* global_norm.cuh's slot and size */
    update_norm_partials_kernel<<<GNORM_BLOCKS, GNORM_THREADS, 0, model->stream>>>(part, model->params, model->grads, model->m, model->v,
                                                                                 model->L.total, model->upd_seg_end, model->upd_seg_decay,
                                                                                 nseg, h, decay);
    cudaCheck(cudaGetLastError());
    launch_account("detectors", "update_norm_partials_kernel", COST_FP32, GNORM_BLOCKS, 19.0 * model->L.total, (double)model->L.total * 16,
                   (double)GNORM_BLOCKS * 8);   /* p, grad, m, v in (the AdamW step's math, nothing stored); partials out */
    static double host_part[GNORM_BLOCKS];
    cudaCheck(cudaMemcpyAsync(host_part, part, sizeof(host_part), cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
    double s2 = 0.0;
    for (int b = 0; b < GNORM_BLOCKS; b++) s2 += host_part[b];
    return sqrt(s2);
}

/* --------------------------------------------------------------------- evaluation and sampling */
/* row argmax, first maximum on ties (as the CPU's strict '>' scan) */
__global__ static void argmax_kernel(int* out, const bf16* logits, int V) {
    int row = blockIdx.x;
    const bf16* z = logits + (size_t)row * V;
    float best = -INFINITY; int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float x = __bfloat162float(z[i]);
        if (x > best || (x == best && i < bi)) { best = x; bi = i; }
    }
    __shared__ float sb[1024];
    __shared__ int si[1024];
    sb[threadIdx.x] = best; si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) {
            float ob = sb[threadIdx.x + w]; int oi = si[threadIdx.x + w];
            if (ob > sb[threadIdx.x] || (ob == sb[threadIdx.x] && oi < si[threadIdx.x])) { sb[threadIdx.x] = ob; si[threadIdx.x] = oi; }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[row] = si[0];
}

static void model_token_losses(Model* model, int n, float* out) { memcpy(out, model->h_losses, sizeof(float) * n); }
/* the one-pass classifier (crossentropy_fused) of the next forward with targets: the host loop says so before
 * a training microbatch whose backward follows with this dloss and nothing reading the logits in between
 * (not before the propagation trace's forwards, which diff the logits; evaluation, -pred_out's argmax and
 * sampling never ask, and keep the two-pass path). The logits are then gone after that forward. */
static void model_classifier_fused_next(Model* model, float dloss) { model->ce_fused_next = 1; model->ce_dloss = dloss; }
static void logits_intact(const Model* model, const char* who) {
    if (model->dlogits_ready) tsdc_fail("internal: %s after a forward whose classifier wrote dlogits over the logits", who);
}
static void model_argmax(Model* model, int n, int* out) {
    logits_intact(model, "model_argmax");
    argmax_kernel<<<n, 256, 0, model->stream>>>(model->argmax, model->logits, model->c.vocab_size);
    cudaCheck(cudaGetLastError());
    launch_account(COST_MISC, "argmax_kernel", COST_FP32, n, (double)n * model->c.vocab_size, (double)n * model->c.vocab_size * 2, (double)n * 4);
    cudaCheck(cudaMemcpyAsync(out, model->argmax, sizeof(int) * n, cudaMemcpyDeviceToHost, model->stream));
    cudaCheck(cudaStreamSynchronize(model->stream));
}
static void model_logits_row(Model* model, int row, float* out) {
    logits_intact(model, "model_logits_row");
    int V = model->c.vocab_size;
    cudaCheck(cudaMemcpy(model->h_row, model->logits + (size_t)row * V, sizeof(bf16) * V, cudaMemcpyDeviceToHost));
    for (int i = 0; i < V; i++) out[i] = __bfloat162float(model->h_row[i]);
}
/* every site is stored in bf16 here (-fault_dtype fp32 and autocast are the CPU trainer's) */
static void model_fault_storage(Model* model, const FaultCtx* fx) { (void)model; (void)fx; }
/* on the device (llmc/cuda/checksum.cuh): the same value as the CPU's tsdc_checksum of the host copy */
static uint64_t model_weights_checksum(Model* model) {
    return tsdc_checksum_gpu(model->params, model->L.total * sizeof(float), model->stream);
}

/* the forward tensor of a site at a layer (llmc/sdc/fault.h). att_logits / att_probs: the stored bf16 [B,H,T,T]
 * tensors, with any injected value in place and the probs recomputed after a logits fault (attention_forward_faults),
 * as the CPU's */
DEFINE_MODEL_SITE_TENSOR(bf16)
/* the same as a [n / cols, cols] view with the row stride ld: q_proj, k_proj, v_proj and (SwiGLU) gate_proj, up_proj
 * are the column views of the fused projection outputs; every other site is contiguous (cols = ld = n) */
static bf16* model_site_view(Model* model, int site, int l, int B, int T, size_t* n, size_t* cols, size_t* ld) {
    bf16* x = model_site_tensor(model, site, l, B, T, n);
    const Config* c = &model->c;
    *cols = *n; *ld = *n;
    if (site == SITE_Q_PROJ || site == SITE_K_PROJ || site == SITE_V_PROJ) {
        *cols = (size_t)(site == SITE_Q_PROJ ? c->n_head : c->n_kv_head) * c->head_dim;
        *ld = (size_t)model->ldqkv;
    } else if ((site == SITE_GATE_PROJ || site == SITE_UP_PROJ) && c->mlp == MLP_SWIGLU) {
        *cols = (size_t)c->ffn_dim;
        *ld = (size_t)model->ldgu;
    }
    if (*n == 0) { *cols = 1; *ld = 1; }
    return x;
}
/* The trace reads att_logits / att_probs at every layer: a layer whose last forward took the fused path
 * gets them materialised from its stored q, k, v (llmc/cuda/attention.cuh; its out goes to backward scratch, so
 * att_out keeps the fused bits). A layer that switched path for the fault event (att_logits/att_probs)
 * differs from the clean pass at the bf16 rounding level on top of the fault. */
static void model_materialise_attention(Model* model, int l) {
    const Config* c = &model->c;
    LayerActs* a = &model->la[l];
    if (!a->fused) return;
    const bf16* qc = c->qk_norm == QKNORM_PLAIN_POST_ROPE ? a->qf : a->qr;
    const bf16* kc = c->qk_norm == QKNORM_PLAIN_POST_ROPE ? a->kf : a->kr;
    model_att_buffers(model, "the propagation trace (-trace_out)");
    attention_forward(model->datt, a->logits, a->probs, qc, kc, a->v, model->last_B, model->last_T, c->n_head, c->n_kv_head, c->head_dim,
                      model->ldqkv, model->stream);
}
/* the snapshot: the activations and the logits and probs of every layer (two allocations, each copied whole) */
static void model_trace_snapshot(Model* model) {
    logits_intact(model, "model_trace_snapshot");
    model_att_buffers(model, "the propagation trace (-trace_out)");
    for (int l = 0; l < model->c.n_layer; l++) model_materialise_attention(model, l);
    if (!model->trace_mem) cudaCheck(cudaMalloc(&model->trace_mem, model->act_bytes));
    if (!model->trace_att_mem) {
        cudaError_t e = cudaMalloc(&model->trace_att_mem, model->att_bytes);
        if (e != cudaSuccess)
            tsdc_fail("cannot allocate %.2f GiB for the propagation trace's copy of the attention logits and probs (-trace_out): %s; "
                      "lower -B or -seq", model->att_bytes / 1073741824.0, cudaGetErrorString(e));
    }
    cudaCheck(cudaMemcpyAsync(model->trace_mem, model->act_mem, model->act_bytes, cudaMemcpyDeviceToDevice, model->stream));
    cudaCheck(cudaMemcpyAsync(model->trace_att_mem, model->att_mem, model->att_bytes, cudaMemcpyDeviceToDevice, model->stream));
}
static void model_trace_diff(Model* model, int site, int l, int B, int T, double* num, double* den) {
    logits_intact(model, "model_trace_diff");
    size_t n, cols, ld;
    if (site == SITE_ATT_LOGITS || site == SITE_ATT_PROBS) model_materialise_attention(model, l);
    const bf16* x = model_site_view(model, site, l, B, T, &n, &cols, &ld);
    const char* base = (const char*)model->act_mem;
    const char* snap = (const char*)model->trace_mem;
    if (model->att_mem && (const char*)x >= (const char*)model->att_mem && (const char*)x < (const char*)model->att_mem + model->att_bytes) {
        base = (const char*)model->att_mem;
        snap = (const char*)model->trace_att_mem;
    }
    const bf16* y = (const bf16*)(snap + ((const char*)x - base));
    fault_sumsq_ld(x, y, n / cols, cols, ld, num, den, model->stream);
}

/* 1: the materialised attention (llmc/cuda/attention.cuh) at every layer; 0 (default): the fused one
 * (llmc/cuda/flash_attention.cuh) wherever attention_fused allows */
static __attribute__((unused)) void model_set_attention_materialised(Model* model, int on) { model->att_materialised = on != 0; }
/* the residual gains of the monitored layers of the last forward, from the sums of the norms' mean
 * squares that it reduced on the device (llmc/sdc/rgg.cuh) and copied with its report: no device work here.
 * Vector 2l is layer l's attn_ms (its attention residual's input), 2l+1 its mlp_ms (the attention
 * residual's output, the MLP residual's input), 2l+2 the next layer's attn_ms or the final norm's. */
static void model_rgg_gains(Model* model, int B, int T, const int* layers, int n_mon, double* out) {
    if (!model->prot.on[PK_RGG]) tsdc_fail("internal: model_rgg_gains without model_set_protect(PK_RGG) before the forward");
    const int N = B * T;
    const double* ss = (const double*)model->rep_host;
    const double* bad = (const double*)(model->rep_host + model->rep_bad);
    for (int i = 0; i < n_mon; i++) {
        const int j = 2 * layers[i];
        out[i * 2 + RGG_ATTN] = bad[j] || bad[j + 1] ? NAN : residual_gain_sums(ss[j], ss[j + 1], N);
        out[i * 2 + RGG_MLP] = bad[j + 1] || bad[j + 2] ? NAN : residual_gain_sums(ss[j + 1], ss[j + 2], N);
        if (check_dump_file())   /* test-only (llmc/sdc/checks.h): the device's sums, as the report brought them */
            check_dump_rgg(layers[i], ss + j, out[i * 2 + RGG_ATTN], out[i * 2 + RGG_MLP]);
    }
}
/* exponent scaling's unscale, grads *= s, folded: the gradients are left as they are and every reader
 * (model_norms, AdamW, model_update_norm) takes grad * s, the fp32 product a separate pass would have
 * stored (exact for a power of two unless it lands below the normal range, and then the same rounding
 * either way), until model_zero_grads. Returns 1 if any gradient is non-finite (the squared norm is
 * then not finite); the norms computed for it serve the rest of the step. */
static int model_unscale_check(Model* model, float s) {
    model->unscale = s;
    model->norms_valid = 0;
    model_norms(model);
    return !isfinite(model->norm2);
}

/* -stats (llmc/host/stats.h): the emulation's counters, the trainer's own loop count and the element-wise
 * launchers' byte accounting; on a GPU only the latter two (the rest -1) */
static int model_device_stats(Model* model, DeviceStats* st) {
    DEVICE_STATS_UNKNOWN(st);
#ifdef __CUDA_EMU__
    const emu_counters_t* e = emu_counters();
    st->launches = (long long)e->launches;
    st->syncs = (long long)e->host_syncs;
    st->d2h = (long long)e->d2h_copies;
    st->dev_bytes = (long long)e->device_bytes;
    st->alloc_bytes = (long long)e->allocated_bytes;
    st->loop_syncs = model->loop_syncs;
#endif
    st->ew_read = (long long)g_ew_bytes_read;
    st->ew_written = (long long)g_ew_bytes_written;
    return 1;
}

/* -cost_out (llmc/host/train_loop.h; docs/cost_model.md): the launchers' work records (cuda_common.cuh
 * launch_account) of one window, the first step's first attempt and its update, written as JSON lines: a
 * header with the run's fields and the device's counts, then one record a launch in launch order. On the
 * emulation every kernel launch and every cuBLASLt call of the window must have its record (a launcher
 * without its accounting line is an error here); the header's peak device bytes are the emulator's
 * (since the start of the process: the model, the step's workspaces), -1 on a GPU. */
#ifdef __CUDA_EMU__
#include "cuda_emu_cublaslt_stats.h"
#endif
#ifdef __CUDA_EMU__
static long long g_cost_launches, g_cost_gemms, g_cost_l0, g_cost_g0;   /* the emulator's counts in the window (coverage check) */
#endif
static int model_cost_only(void) {
#ifdef __CUDA_EMU__
    return emu_cost_only();
#else
    return 0;
#endif
}
static void model_cost_resume(Model* model) {
    (void)model;
    if (g_cost_on) return;
#ifdef __CUDA_EMU__
    g_cost_l0 = (long long)emu_counters()->launches;
    g_cost_g0 = (long long)cublaslt_emu_matmul_calls();
#endif
    g_cost_on = 1;
}
static void model_cost_pause(Model* model) {
    (void)model;
    if (!g_cost_on) return;
#ifdef __CUDA_EMU__
    g_cost_launches += (long long)emu_counters()->launches - g_cost_l0;
    g_cost_gemms += (long long)cublaslt_emu_matmul_calls() - g_cost_g0;
#endif
    g_cost_on = 0;
}
static void model_cost_begin(Model* model) {
    g_cost_n = 0;
#ifdef __CUDA_EMU__
    g_cost_launches = g_cost_gemms = 0;
#endif
    model_cost_resume(model);
}
/* the window's records to path; meta: the run's fields, a JSON object's members without braces */
static void model_cost_end(Model* model, const char* path, const char* meta) {
    model_cost_pause(model);
    long long kernels = 0, gemms = 0;
    for (size_t i = 0; i < g_cost_n; i++) {
        if (!strcmp(g_cost_recs[i].kernel, "cublasLtMatmul")) gemms++;
        else if (g_cost_recs[i].unit != COST_NET && !g_cost_recs[i].ride) kernels++;
    }
    long long peak = -1, now = -1, emu_l = -1, emu_g = -1;
#ifdef __CUDA_EMU__
    peak = (long long)emu_counters()->device_bytes_peak;
    now = (long long)emu_counters()->device_bytes;
    emu_l = g_cost_launches;
    emu_g = g_cost_gemms;
    if (emu_l != kernels || emu_g != gemms)
        tsdc_fail("-cost_out: %lld kernel launches and %lld cuBLASLt calls in the step, but %lld and %lld work records: a launcher "
                  "without its launch_account / ew_account line (cuda_common.cuh)", emu_l, emu_g, kernels, gemms);
#endif
    FILE* f = fopen(path, "w");
    if (!f) tsdc_fail("flag -cost_out: cannot write %s", path);
    fprintf(f, "{\"type\":\"header\",%s,\"params\":%zu,\"cost_only\":%d,\"peak_device_bytes\":%lld,\"device_bytes\":%lld,"
            "\"act_bytes\":%zu,\"launches\":%lld,\"gemms\":%lld,\"emu_launches\":%lld,\"emu_gemms\":%lld,\"records\":%zu}\n",
            meta, model->L.total, model_cost_only(), peak, now, model->act_bytes, kernels, gemms, emu_l, emu_g, g_cost_n);
    for (size_t i = 0; i < g_cost_n; i++) {
        const CostRec* r = &g_cost_recs[i];
        fprintf(f, "{\"comp\":\"%s\",\"unit\":\"%s\",\"kernel\":\"%s\",\"grid\":%llu,\"flops\":%.17g,\"read\":%.17g,\"written\":%.17g%s}\n",
                r->comp, COST_UNIT_NAMES[r->unit], r->kernel, r->grid, r->flops, r->read, r->written, r->ride ? ",\"ride\":1" : "");
    }
    if (fclose(f) != 0) tsdc_fail("flag -cost_out: cannot write %s", path);
    g_cost_n = 0;
}

static int model_threads(void) { return 1; }
static void model_set_threads(int n) { (void)n; }

/* --------------------------------------------------------------------- device and NCCL set-up */
/* one GPU per process: the rank on this node picks the device; rank 0's NCCL id goes out over MPI */
static void gpu_setup(Dist* dist) {
    cuda_device_check_or_exit("train_sdc_cu");
    int ndev = 0;
    cudaCheck(cudaGetDeviceCount(&ndev));
    int local = 0;
#ifdef USE_MPI
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, dist->rank, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_rank(node, &local));
    MPI_Comm_free(&node);
#endif
    if (local >= ndev) tsdc_fail("rank %d is local rank %d on its node, which has only %d GPU(s)", dist->rank, local, ndev);
    cudaCheck(cudaSetDevice(local));
#ifndef USE_NCCL
    if (dist->rank == 0) printf("built without NCCL: one GPU per run\n");
#endif
#ifdef USE_NCCL
    if (dist->world > 1) {
        ncclUniqueId id;
        if (dist->rank == 0) ncclCheck(ncclGetUniqueId(&id));
        dist_bcast_bytes(dist, &id, sizeof(id), 0);
        ncclCheck(ncclCommInitRank(&g_nccl, dist->world, id, dist->rank));
        g_nccl_ready = 1;
    }
#endif
}
static void gpu_teardown(void) {
#ifdef USE_NCCL
    if (g_nccl_ready) ncclCommDestroy(g_nccl);
#endif
}

#ifndef TESTING
#define TRAINER_NAME "gpu"
#define TRAINER_DEFAULT_PRECISION 1
#define TRAINER_HAS_FP32 0
#define TRAINER_GPU 1                /* the check kinds it provides: the gpu column of PROT_KINDS (llmc/sdc/checks.h) */
#define TRAINER_BF16_NAME "bf16 AMP"
#define TRAINER_SETUP(dist) gpu_setup(dist)
#define TRAINER_TEARDOWN() gpu_teardown()
#include "llmc/host/train_loop.h"
int main(int argc, char** argv) { return train_main(argc, argv); }
#endif
