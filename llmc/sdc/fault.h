/* fault.h: the fault model (docs/design.md, the fault model, paper Section 3.1), host side, shared by both trainers.
 *
 * One injection event corrupts m randomly chosen distinct elements of one tensor and flips nbits
 * distinct randomly chosen bits in each, in the tensor's storage dtype (fp32 in the CPU trainer's
 * -precision fp32, bf16 in its -precision bf16 and on the GPU), on one rank, in one microbatch, at one
 * layer, in the forward pass (a module output) or the backward pass (the gradient dL/dx of that
 * output). Parameters, optimizer state and data are never touched.
 *
 * Randomness. Every choice comes from streams derived from -fault_seed by hashing, never from a stream
 * carried across steps, so a resumed run injects exactly what the uninterrupted run would:
 *   - schedule of step s: fault_rng(seed, s, FAULT_STREAM_PLAN): whether s has an event (characterisation
 *     rate), which site/pass/layer/rank/microbatch (campaign draws);
 *   - element and bit choices of step s: fault_rng(seed, s, FAULT_STREAM_SELECT). It does not depend on
 *     the site, so sites of equal size get the same elements and bits ("shared random selection").
 * Element indices: m distinct indices drawn uniformly from [0, n) (Floyd's algorithm, sorted);
 * bits: nbits distinct bit positions in [0, width) per element (or within one field: -fault_field), as
 * an XOR mask.
 *
 * Schedules: -fault_mode char (characterisation: one site and layer; each step in the window
 * [-fault_start, -fault_end] has an event with probability -fault_rate, default 1%) and -fault_mode
 * campaign (one event per step in the window, site and pass drawn from -fault_sites x -fault_pass,
 * layer from -fault_layer or drawn). -fault_rank / -fault_mb fix the rank and microbatch (-1: drawn).
 * Injection is off during a replay (the protection issue).
 *
 * Flip dtype (-fault_dtype). By default the bits flip in the storage dtype. Under -precision bf16 the
 * CPU trainer can flip them instead as if a site were stored in fp32 (fp32: every site; autocast: the
 * sites PyTorch autocast keeps in fp32, fault_autocast_fp32() below), to compare with the paper, whose
 * models ran under autocast. The flipped fp32 value is then read as is (not rounded to bf16 again): such a site keeps
 * a float array in the CPU trainer (which stores some sites as bf16 bits otherwise; fault_apply_host_x flips either). */
#ifndef TSDC_FAULT_H
#define TSDC_FAULT_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "../cpu/bf16.h"
#include "../host/checksum.h"
#include "../host/config.h"
#include "../host/logger.h"
#include "../host/rng.h"
#include "../host/utils.h"

enum {
    SITE_ATTN_NORM, SITE_Q_PROJ, SITE_K_PROJ, SITE_V_PROJ, SITE_Q_NORM, SITE_K_NORM, SITE_Q_ROPE, SITE_K_ROPE,
    SITE_ATT_LOGITS, SITE_ATT_PROBS, SITE_ATT_OUT, SITE_O_PROJ, SITE_ATTN_RESIDUAL, SITE_MLP_NORM, SITE_GATE_PROJ,
    SITE_UP_PROJ, SITE_ACT, SITE_MLP_PRODUCT, SITE_DOWN_PROJ, SITE_BLOCK_OUT, SITE_COUNT
};
static const char* const SITE_NAMES[SITE_COUNT] __attribute__((unused)) = {
    "attn_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope", "att_logits", "att_probs",
    "att_out", "o_proj", "attn_residual", "mlp_norm", "gate_proj", "up_proj", "act", "mlp_product", "down_proj", "block_out"};
enum { PASS_FWD = 0, PASS_BWD = 1 };
static const char* const PASS_NAMES[2] __attribute__((unused)) = {"fwd", "bwd"};
enum { FAULT_OFF = 0, FAULT_CHAR = 1, FAULT_CAMPAIGN = 2 };

static inline int site_from_name(const char* s) {
    for (int i = 0; i < SITE_COUNT; i++) if (!strcmp(SITE_NAMES[i], s)) return i;
    return -1;
}
/* does the model have this site? (q_norm/k_norm need QK norm; up_proj/mlp_product need SwiGLU;
 * for ReLU^2 models gate_proj is the fc projection and act is relu(fc)^2) */
static inline int site_exists(const Config* c, int site) {
    if (site == SITE_Q_NORM || site == SITE_K_NORM) return c->qk_norm != QKNORM_NONE;
    if (site == SITE_UP_PROJ || site == SITE_MLP_PRODUCT) return c->mlp == MLP_SWIGLU;
    return site >= 0 && site < SITE_COUNT;
}
/* the body of a trainer's model_site_tensor: both trainers name their LayerActs fields alike. `a` the
 * layer's activations, `pre` 1 when the QK norm comes before RoPE (its outputs qn/kn, else qf/kf),
 * sizes in elements; sets *n and returns the tensor */
#define SITE_TENSOR_SWITCH(a, site, pre, N, d, qd, kd, F, att, n) \
    switch (site) {                                                                              \
        case SITE_ATTN_NORM: *(n) = (N) * (d); return (a)->attn_norm;                            \
        case SITE_Q_PROJ: *(n) = (N) * (qd); return (a)->q;                                      \
        case SITE_K_PROJ: *(n) = (N) * (kd); return (a)->k;                                      \
        case SITE_V_PROJ: *(n) = (N) * (kd); return (a)->v;                                      \
        case SITE_Q_NORM: *(n) = (N) * (qd); return (pre) ? (a)->qn : (a)->qf;                   \
        case SITE_K_NORM: *(n) = (N) * (kd); return (pre) ? (a)->kn : (a)->kf;                   \
        case SITE_Q_ROPE: *(n) = (N) * (qd); return (a)->qr;                                     \
        case SITE_K_ROPE: *(n) = (N) * (kd); return (a)->kr;                                     \
        case SITE_ATT_LOGITS: *(n) = (att); return (a)->logits;                                  \
        case SITE_ATT_PROBS: *(n) = (att); return (a)->probs;                                    \
        case SITE_ATT_OUT: *(n) = (N) * (qd); return (a)->att_out;                               \
        case SITE_O_PROJ: *(n) = (N) * (d); return (a)->o;                                       \
        case SITE_ATTN_RESIDUAL: *(n) = (N) * (d); return (a)->resid_mid;                        \
        case SITE_MLP_NORM: *(n) = (N) * (d); return (a)->mlp_norm;                              \
        case SITE_GATE_PROJ: *(n) = (N) * (F); return (a)->gate;                                 \
        case SITE_UP_PROJ: *(n) = (N) * (F); return (a)->up;                                     \
        case SITE_ACT: *(n) = (N) * (F); return (a)->act;                                        \
        case SITE_MLP_PRODUCT: *(n) = (N) * (F); return (a)->prod;                               \
        case SITE_DOWN_PROJ: *(n) = (N) * (d); return (a)->down;                                 \
        case SITE_BLOCK_OUT: *(n) = (N) * (d); return (a)->out;                                  \
    }

/* a trainer's model_site_tensor, for its element type: the forward tensor of a site at a layer (site -1:
 * the logits) and its size in *n */
#define DEFINE_MODEL_SITE_TENSOR(elem)                                                                         \
    static elem* model_site_tensor(Model* model, int site, int l, int B, int T, size_t* n) {                   \
        const Config* c = &model->c;                                                                         \
        size_t N = (size_t)B * T, d = c->d_model, qd = (size_t)c->n_head * c->head_dim,                      \
               kd = (size_t)c->n_kv_head * c->head_dim;                                                      \
        size_t F = c->ffn_dim, att = (size_t)B * c->n_head * T * T;                                          \
        if (site < 0) { *n = N * c->vocab_size; return model->logits; }                                      \
        LayerActs* a = &model->la[l];                                                                        \
        int pre = c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE;                                                    \
        SITE_TENSOR_SWITCH(a, site, pre, N, d, qd, kd, F, att, n)                                            \
        *n = 0;                                                                                              \
        return NULL;                                                                                         \
    }

/* the Q/K path: the tensors that produce the Q and K that attention consumes */
static inline int site_is_qk_path(int site) {
    return site == SITE_Q_PROJ || site == SITE_K_PROJ || site == SITE_Q_NORM || site == SITE_K_NORM ||
           site == SITE_Q_ROPE || site == SITE_K_ROPE;
}

typedef struct {
    int mode;                  /* FAULT_OFF / FAULT_CHAR / FAULT_CAMPAIGN */
    uint32_t sites;            /* bit mask of allowed sites */
    int pass;                  /* PASS_FWD, PASS_BWD, or 2 = both */
    int layer;                 /* fixed layer, -1 drawn */
    long long m;               /* elements per event (when frac == 0) */
    double frac;               /* fraction of the tensor per event (m = round(frac*n)); 0 = use m */
    int nbits;                 /* distinct bits flipped per element */
    int rank, mb;              /* fixed rank / microbatch, -1 drawn */
    double rate;               /* characterisation: probability that a step in the window has an event */
    long long start, end;      /* step window, inclusive (1-based step numbers as in the log) */
    uint64_t seed;
    int field;                 /* bits to draw from: FIELD_ALL, FIELD_EXPONENT, FIELD_MANTISSA, FIELD_SIGN */
} FaultConfig;
enum { FIELD_ALL = 0, FIELD_EXPONENT = 1, FIELD_MANTISSA = 2, FIELD_SIGN = 3 };
/* the bit positions of a field in a storage word of `width` bits (fp32: 1-8-23, bf16: 1-8-7) */
static inline void fault_field_range(int field, int width, int* lo, int* hi) {
    int man = width == 32 ? 23 : 7;
    switch (field) {
        case FIELD_EXPONENT: *lo = man; *hi = man + 8; break;
        case FIELD_MANTISSA: *lo = 0; *hi = man; break;
        case FIELD_SIGN: *lo = width - 1; *hi = width; break;
        default: *lo = 0; *hi = width;
    }
}

typedef struct {
    int active;
    long long step;            /* 1-based step number (as the log) */
    int site, pass, layer, rank, mb;
    long long m;               /* resolved count (before capping to the tensor) */
    double frac;
    int nbits;
    uint64_t seed;
    int field;
} FaultEvent;

#define FAULT_STREAM_PLAN 0x504C414EULL
#define FAULT_STREAM_SELECT 0x53454C45ULL
static inline void fault_rng(Rng* r, uint64_t seed, long long step, uint64_t stream) {
    rng_seed(r, splitmix64_fin(seed ^ splitmix64_fin((uint64_t)step * TSDC_GOLDEN ^ stream)));
}

/* the event of step s (1-based) on a job of `world` ranks x `accum` microbatches and n_layer layers */
static FaultEvent fault_plan_step(const FaultConfig* fc, long long step, int world, int accum, int n_layer) {
    FaultEvent ev;
    memset(&ev, 0, sizeof(ev));
    if (fc->mode == FAULT_OFF || step < fc->start || step > fc->end) return ev;
    Rng r;
    fault_rng(&r, fc->seed, step, FAULT_STREAM_PLAN);
    double u = rng_uniform(&r);
    if (fc->mode == FAULT_CHAR && !(u < fc->rate)) return ev;
    int allowed[SITE_COUNT], na = 0;
    for (int s = 0; s < SITE_COUNT; s++) if (fc->sites & (1u << s)) allowed[na++] = s;
    if (na == 0) return ev;
    ev.site = allowed[rng_below(&r, (uint64_t)na)];
    ev.pass = fc->pass == 2 ? (int)rng_below(&r, 2) : fc->pass;
    ev.layer = fc->layer >= 0 ? fc->layer : (int)rng_below(&r, (uint64_t)n_layer);
    ev.rank = fc->rank >= 0 ? fc->rank : (int)rng_below(&r, (uint64_t)world);
    ev.mb = fc->mb >= 0 ? fc->mb : (int)rng_below(&r, (uint64_t)accum);
    ev.m = fc->m; ev.frac = fc->frac; ev.nbits = fc->nbits; ev.seed = fc->seed; ev.field = fc->field;
    ev.step = step;
    ev.active = 1;
    return ev;
}

/* elements to corrupt in a tensor of n elements */
static inline size_t fault_count(const FaultEvent* ev, size_t n) {
    double want = ev->frac > 0 ? floor(ev->frac * (double)n + 0.5) : (double)ev->m;
    if (want < 0) want = 0;
    return want > (double)n ? n : (size_t)want;
}

/* the shared random selection: m distinct sorted indices in [0, n) and an XOR mask of nbits distinct
 * bits below `width` for each. idx and mask hold m entries. Floyd's algorithm with a hash set. */
static void fault_select(const FaultEvent* ev, size_t n, size_t m, int width, size_t* idx, uint32_t* mask) {
    Rng r;
    fault_rng(&r, ev->seed, ev->step, FAULT_STREAM_SELECT);
    if (m > n) m = n;
    /* open-addressing set of chosen indices */
    size_t cap = 16;
    while (cap < 2 * m + 1) cap <<= 1;
    size_t* set = (size_t*)mallocCheck(sizeof(size_t) * cap);
    for (size_t i = 0; i < cap; i++) set[i] = SIZE_MAX;
    size_t k = 0;
    for (size_t j = n - m; j < n; j++) {
        size_t t = (size_t)rng_below(&r, (uint64_t)j + 1), pick = t;
        /* if t is already chosen, take j (Floyd) */
        for (int pass = 0; pass < 2; pass++) {
            size_t h = (size_t)splitmix64_fin(pick) & (cap - 1);
            int found = 0;
            while (set[h] != SIZE_MAX) { if (set[h] == pick) { found = 1; break; } h = (h + 1) & (cap - 1); }
            if (!found) { set[h] = pick; break; }
            pick = j; /* j is never in the set yet */
        }
        idx[k++] = pick;
    }
    free(set);
    {   /* sort the indices (shell sort, in place) */
        size_t gap = m / 2;
        for (; gap > 0; gap /= 2)
            for (size_t i = gap; i < m; i++) {
                size_t t = idx[i], j = i;
                while (j >= gap && idx[j - gap] > t) { idx[j] = idx[j - gap]; j -= gap; }
                idx[j] = t;
            }
    }
    int lo, hi;
    fault_field_range(ev->field, width, &lo, &hi);
    int nb = ev->nbits < hi - lo ? ev->nbits : hi - lo;
    for (size_t i = 0; i < m; i++) {
        uint32_t msk = 0;
        int got = 0;
        while (got < nb) {
            uint32_t b = (uint32_t)lo + (uint32_t)rng_below(&r, (uint64_t)(hi - lo));
            if (!(msk & (1u << b))) { msk |= 1u << b; got++; }
        }
        mask[i] = msk;
    }
}

/* flip in the storage dtype: width 32 = fp32 bits; width 16 = the bf16 bits of a bf16-representable float */
static inline TSDC_HD float fault_flip_value(float x, uint32_t mask, int width) {
    if (width == 32) return bits_f32(f32_bits(x) ^ mask);
    return bf16_bits_to_f32((uint16_t)(f32_to_bf16_bits(x) ^ (uint16_t)mask));
}

/* ------------------------------------------------------------------------- per-process context */
typedef struct {
    FaultConfig cfg;
    FaultEvent ev;             /* the event of the current step (ev.active 0: none) */
    int rank;
    int mb;                    /* microbatch being computed */
    int replay;                /* 1 while a step is replayed: injection off */
    int width;                 /* storage bits: 32 fp32, 16 bf16 */
    int site_width[SITE_COUNT];/* the bits a site's flips happen in (-fault_dtype), 0 = width */
    int att_T;                 /* sequence length of the [B,H,T,T] attention tensors (for the "live" count) */
    int injected;              /* events applied in the current step */
    long long injected_total;
    StreamFile log;            /* JSONL, one line an applied event (every rank that applies one writes); checked */
    /* trace (Experiment 2): see the trainer */
    int trace;
} FaultCtx;

/* the sites PyTorch autocast (bf16) stores in fp32 in the HF Llama/Qwen3 models with fp32 master weights
 * and eager attention (the paper's setting); the gradient of a tensor has its dtype, so both passes:
 *   attn_norm, mlp_norm   RMSNorm computes in fp32 and multiplies by its fp32 weight
 *   attn_residual, block_out   the residual stream: fp32 embedding output + bf16 branch outputs -> fp32
 *   q_norm, k_norm        fp32 weight * bf16 input -> fp32 (type promotion; Qwen3's QK norm)
 *   q_rope, k_rope        q * cos + rotate_half(q) * sin with cos/sin in the residual stream's dtype, fp32
 *   att_logits            Q K^T is an autocast matmul (bf16), then + the fp32 causal mask -> fp32
 *   att_probs             softmax(dtype=fp32).to(query dtype), and the query is fp32 (q_rope)
 * bf16 (autocast's lower-precision ops: linear and matmul outputs, and what is computed from them alone):
 *   q_proj k_proj v_proj o_proj gate_proj up_proj down_proj att_out, act (SiLU of bf16), mlp_product */
static inline int fault_autocast_fp32(int site) {
    switch (site) {
        case SITE_ATTN_NORM: case SITE_MLP_NORM: case SITE_ATTN_RESIDUAL: case SITE_BLOCK_OUT:
        case SITE_Q_NORM: case SITE_K_NORM: case SITE_Q_ROPE: case SITE_K_ROPE: case SITE_ATT_LOGITS: case SITE_ATT_PROBS:
            return 1;
        default: return 0;
    }
}
/* the flip width of the current event's site */
static inline int fault_event_width(const FaultCtx* fx) {
    int w = fx->site_width[fx->ev.site];
    return w ? w : fx->width;
}

/* does the current event hit this (site, layer, pass) now? */
static inline int fault_due(const FaultCtx* fx, int site, int layer, int pass) {
    return fx && fx->ev.active && !fx->replay && fx->ev.site == site && fx->ev.layer == layer && fx->ev.pass == pass &&
           fx->ev.rank == fx->rank && fx->ev.mb == fx->mb;
}

/* an event due here that flips something (m or frac > 0): the GPU trainer switches a layer to the materialised
 * attention only for such an event, so an m = 0 event leaves the run bit for bit the clean one on both trainers */
static inline int fault_due_flips(const FaultCtx* fx, int site, int layer, int pass) {
    return fault_due(fx, site, layer, pass) && (fx->ev.m > 0 || fx->ev.frac > 0);
}

/* how many of the m selected elements the model reads: all of them, except in att_logits/att_probs,
 * whose masked upper triangle (s > t) is never read, so a flip there is harmless */
static size_t fault_live_count(const FaultCtx* fx, const size_t* idx, size_t m) {
    int site = fx->ev.site;
    if ((site != SITE_ATT_LOGITS && site != SITE_ATT_PROBS) || fx->att_T <= 0) return m;
    size_t live = 0, T = (size_t)fx->att_T;
    for (size_t i = 0; i < m; i++) live += idx[i] % T <= (idx[i] / T) % T;
    return live;
}

static void fault_log_event(FaultCtx* fx, size_t n, size_t m, size_t live, double rms_before, double rms_after) {
    fx->injected++;
    fx->injected_total++;
    if (!fx->log.fp) return;
    const FaultEvent* e = &fx->ev;
    streamfile_printf(&fx->log, "{\"type\":\"fault\",\"step\":%lld,\"microbatch\":%d,\"rank\":%d,\"layer\":%d,\"site\":\"%s\",\"pass\":\"%s\","
            "\"m\":%zu,\"live\":%zu,\"numel\":%zu,\"nbits\":%d,\"dtype\":\"%s\",\"seed\":%llu,\"rms_before\":%s,\"rms_after\":%s}\n",
            e->step, e->mb, e->rank, e->layer, SITE_NAMES[e->site], PASS_NAMES[e->pass], m, live, n, e->nbits,
            fault_event_width(fx) == 32 ? "fp32" : "bf16", (unsigned long long)e->seed, jnum(rms_before).s, jnum(rms_after).s);
}

/* CPU tensors: float arrays holding fp32 or bf16-representable values, or (h) -precision bf16's storage as bf16 bits
 * (the MLP's hidden tensors; only with 16-bit flips: a site that takes fp32 flips keeps its float array). Flip in
 * place (a bf16 element as fault_flip_value flips the float that holds it, so the same bits either way), log. */
static inline float fault_elem(const void* x, int h, size_t i) { return h ? bf16_bits_to_f32(((const uint16_t*)x)[i]) : ((const float*)x)[i]; }
static void fault_apply_host_x(FaultCtx* fx, void* x, int h, size_t n) {
    size_t m = fault_count(&fx->ev, n);
    double ss0 = 0, ss1 = 0;
    size_t live = 0;
    for (size_t i = 0; i < n; i++) { double v = fault_elem(x, h, i); ss0 += v * v; }
    if (m > 0) {
        size_t* idx = (size_t*)mallocCheck(sizeof(size_t) * m);
        uint32_t* mask = (uint32_t*)mallocCheck(sizeof(uint32_t) * m);
        int width = fault_event_width(fx);
        if (h && width != 16) { fprintf(stderr, "internal error: fp32 flips into a tensor stored as bf16\n"); exit(1); }
        fault_select(&fx->ev, n, m, width, idx, mask);
        for (size_t i = 0; i < m; i++) {
            const float v = fault_flip_value(fault_elem(x, h, idx[i]), mask[i], width);
            if (h) ((uint16_t*)x)[idx[i]] = (uint16_t)(f32_bits(v) >> 16);   /* exact: a bf16 value */
            else ((float*)x)[idx[i]] = v;
        }
        live = fault_live_count(fx, idx, m);
        free(idx); free(mask);
    }
    for (size_t i = 0; i < n; i++) { double v = fault_elem(x, h, i); ss1 += v * v; }
    fault_log_event(fx, n, m, live, sqrt(ss0 / (n ? n : 1)), sqrt(ss1 / (n ? n : 1)));
}
static void fault_apply_host(FaultCtx* fx, float* x, size_t n) { fault_apply_host_x(fx, x, 0, n); }

/* --------------------------------------------------------------------------------- flags */
/* parse "q_proj,k_proj" (or "all", "qk" = the Q/K path) into a mask; fails naming the flag */
static uint32_t fault_parse_sites(const char* list) {
    uint32_t mask = 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "all")) { mask |= (1u << SITE_COUNT) - 1; continue; }
        if (!strcmp(tok, "qk")) { for (int s = 0; s < SITE_COUNT; s++) if (site_is_qk_path(s)) mask |= 1u << s; continue; }
        int s = site_from_name(tok);
        if (s < 0) {
            fprintf(stderr, "error: flag -fault_sites: unknown site '%s'; sites:", tok);
            for (int i = 0; i < SITE_COUNT; i++) fprintf(stderr, " %s", SITE_NAMES[i]);
            fprintf(stderr, " (or all, qk)\n");
            tsdc_abort(1);
        }
        mask |= 1u << s;
    }
    return mask;
}

/* check the configuration against the model: every named site must exist (a missing site for a
 * family is an error, unless "all" asked for whatever exists), the layer must exist */
static void fault_validate(FaultConfig* fc, const Config* c, int all_requested) {
    if (fc->mode == FAULT_OFF) return;
    for (int s = 0; s < SITE_COUNT; s++)
        if ((fc->sites & (1u << s)) && !site_exists(c, s)) {
            if (all_requested) { fc->sites &= ~(1u << s); continue; }
            tsdc_fail("flag -fault_sites: site %s does not exist in preset %s (%s)", SITE_NAMES[s], c->preset,
                      (s == SITE_Q_NORM || s == SITE_K_NORM) ? "it has no QK norm" : "its MLP is ReLU^2: use gate_proj and act");
        }
    if (!fc->sites) tsdc_fail("flag -fault_sites: no site left for preset %s", c->preset);
    if (fc->layer >= c->n_layer) tsdc_fail("flag -fault_layer: layer %d does not exist (the model has %d)", fc->layer, c->n_layer);
}

#endif
