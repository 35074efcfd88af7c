/* config.h: the model family (docs/design.md, the model family), its presets, and the parameter layout.
 *
 * One Config describes any member of the family: RMSNorm with weight or parameter-free; GQA with
 * head_dim independent of d_model/n_head; QK norm none / weighted before RoPE (Qwen3) / parameter-free
 * after RoPE (nanochat); HF half-split or nanochat RoPE, optional Llama-3 frequency scaling; SwiGLU or
 * ReLU^2; tied or untied embeddings; optional norm after the embedding; optional logit softcap.
 *
 * Parameters live in one fp32 allocation, layer-major, in the order of docs/formats.md; ParamLayout
 * gives each tensor's offset so the same numbers serve the CPU trainer, the CUDA trainer, checkpoint
 * files and the HF importer (dev/tsdc_io.py param_layout mirrors param_layout_build). */
#ifndef TSDC_CONFIG_H
#define TSDC_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "utils.h"

enum { MLP_SWIGLU = 0, MLP_RELU2 = 1 };
enum { QKNORM_NONE = 0, QKNORM_WEIGHTED_PRE_ROPE = 1, QKNORM_PLAIN_POST_ROPE = 2 };
enum { ROPE_HF = 0, ROPE_NANOCHAT = 1 };

typedef struct {
    char preset[32];
    int n_layer, d_model, n_head, n_kv_head, head_dim, ffn_dim, vocab_size, seq_len;
    int mlp, norm_weighted, qk_norm, rope_style, rope_llama3, tied, embed_norm;
    double rope_theta, norm_eps, softcap;
    double rope_factor, rope_low, rope_high, rope_orig; /* Llama-3 scaling */
} Config;

#define FP32_EPS 1.1920928955078125e-07 /* torch.finfo(float32).eps: F.rms_norm's default */

typedef struct { const char* name; Config c; } Preset;

/* name, L, d, H, KV, hd, F, V, T, mlp, normw, qk, rope, l3, tied, embnorm, theta, eps, softcap, l3 params */
static const Preset PRESETS[] = {
    {"llama3.2-1b",  {"llama3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, 1024, MLP_SWIGLU, 1, QKNORM_NONE, ROPE_HF, 1, 1, 0,
                      500000.0, 1e-5, 0.0, 32.0, 1.0, 4.0, 8192.0}},
    {"qwen3-0.6b",   {"qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, 1024, MLP_SWIGLU, 1, QKNORM_WEIGHTED_PRE_ROPE, ROPE_HF, 0, 1, 0,
                      1000000.0, 1e-6, 0.0, 0, 0, 0, 0}},
    {"smollm2-135m", {"smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 1024, MLP_SWIGLU, 1, QKNORM_NONE, ROPE_HF, 0, 1, 0,
                      100000.0, 1e-5, 0.0, 0, 0, 0, 0}},
    {"nanochat-d12", {"nanochat-d12", 12, 768, 6, 6, 128, 3072, 65536, 1024, MLP_RELU2, 0, QKNORM_PLAIN_POST_ROPE, ROPE_NANOCHAT, 0, 0, 1,
                      10000.0, FP32_EPS, 15.0, 0, 0, 0, 0}},
    {"tiny-llama",   {"tiny-llama", 4, 128, 4, 2, 32, 384, 8192, 128, MLP_SWIGLU, 1, QKNORM_NONE, ROPE_HF, 1, 1, 0,
                      500000.0, 1e-5, 0.0, 32.0, 1.0, 4.0, 8192.0}},
    {"tiny-qwen3",   {"tiny-qwen3", 4, 128, 4, 2, 64, 384, 8192, 128, MLP_SWIGLU, 1, QKNORM_WEIGHTED_PRE_ROPE, ROPE_HF, 0, 1, 0,
                      1000000.0, 1e-6, 0.0, 0, 0, 0, 0}},
    {"tiny-nanochat",{"tiny-nanochat", 4, 128, 2, 2, 64, 512, 8192, 128, MLP_RELU2, 0, QKNORM_PLAIN_POST_ROPE, ROPE_NANOCHAT, 0, 0, 1,
                      10000.0, FP32_EPS, 15.0, 0, 0, 0, 0}},
};
#define N_PRESETS ((int)(sizeof(PRESETS) / sizeof(PRESETS[0])))

static inline const Config* preset_find(const char* name) {
    for (int i = 0; i < N_PRESETS; i++) if (strcmp(PRESETS[i].name, name) == 0) return &PRESETS[i].c;
    return NULL;
}

/* -------------------------------------------------------------------- parameter layout */
enum { PT_WTE, PT_EMBED_NORM, PT_ATTN_NORM, PT_WQ, PT_WK, PT_WV, PT_QNORM, PT_KNORM, PT_WO, PT_MLP_NORM,
       PT_WGATE, PT_WUP, PT_WFC, PT_WDOWN, PT_FINAL_NORM, PT_LMHEAD, PT_COUNT };
static const char* const PT_NAMES[PT_COUNT] __attribute__((unused)) = {"wte", "embed_norm_w", "attn_norm_w", "wq", "wk", "wv", "q_norm_w",
    "k_norm_w", "wo", "mlp_norm_w", "w_gate", "w_up", "w_fc", "w_down", "final_norm_w", "lm_head"};

typedef struct {
    int type, layer;        /* layer -1 for global tensors */
    size_t offset, numel;   /* in floats, within the one parameter allocation */
    int rows, cols;         /* [rows, cols] row-major; vectors have rows = 1 */
    int decay;              /* weight decay applies (matrices and embeddings) */
} TensorInfo;

#define MAX_TENSORS 4096
typedef struct {
    int n;
    TensorInfo t[MAX_TENSORS];
    size_t total;
    /* index of each tensor type per layer (-1 if absent) and of the globals */
    int idx_global[PT_COUNT];
} ParamLayout;

static inline void layout_add(ParamLayout* L, int type, int layer, int rows, int cols) {
    if (L->n >= MAX_TENSORS) tsdc_fail("model has more than %d tensors", MAX_TENSORS);
    TensorInfo* t = &L->t[L->n++];
    t->type = type; t->layer = layer; t->rows = rows; t->cols = cols;
    t->numel = (size_t)rows * cols; t->offset = L->total; L->total += t->numel;
    t->decay = rows > 1;
    if (layer < 0) L->idx_global[type] = L->n - 1;
}

static inline void param_layout_build(const Config* c, ParamLayout* L) {
    memset(L, 0, sizeof(*L));
    for (int i = 0; i < PT_COUNT; i++) L->idx_global[i] = -1;
    int d = c->d_model, hd = c->head_dim, F = c->ffn_dim;
    layout_add(L, PT_WTE, -1, c->vocab_size, d);
    if (c->embed_norm && c->norm_weighted) layout_add(L, PT_EMBED_NORM, -1, 1, d);
    for (int l = 0; l < c->n_layer; l++) {
        if (c->norm_weighted) layout_add(L, PT_ATTN_NORM, l, 1, d);
        layout_add(L, PT_WQ, l, c->n_head * hd, d);
        layout_add(L, PT_WK, l, c->n_kv_head * hd, d);
        layout_add(L, PT_WV, l, c->n_kv_head * hd, d);
        if (c->qk_norm == QKNORM_WEIGHTED_PRE_ROPE) { layout_add(L, PT_QNORM, l, 1, hd); layout_add(L, PT_KNORM, l, 1, hd); }
        layout_add(L, PT_WO, l, d, c->n_head * hd);
        if (c->norm_weighted) layout_add(L, PT_MLP_NORM, l, 1, d);
        if (c->mlp == MLP_SWIGLU) { layout_add(L, PT_WGATE, l, F, d); layout_add(L, PT_WUP, l, F, d); }
        else layout_add(L, PT_WFC, l, F, d);
        layout_add(L, PT_WDOWN, l, d, F);
    }
    if (c->norm_weighted) layout_add(L, PT_FINAL_NORM, -1, 1, d);
    if (!c->tied) layout_add(L, PT_LMHEAD, -1, c->vocab_size, d);
}

/* parameter count without building a layout (works for 1B-parameter presets too) */
static inline size_t config_num_params(const Config* c) {
    ParamLayout* L = (ParamLayout*)mallocCheck(sizeof(ParamLayout));
    param_layout_build(c, L);
    size_t n = L->total;
    free(L);
    return n;
}

/* check that a Config is a valid member of the family; fails naming the field */
static inline void config_validate(const Config* c, const char* what) {
    if (c->n_layer < 1) tsdc_fail("%s: n_layer must be >= 1 (got %d)", what, c->n_layer);
    if (c->d_model < 1 || c->head_dim < 2 || c->head_dim % 2) tsdc_fail("%s: d_model >= 1 and an even head_dim are required", what);
    if (c->n_head < 1 || c->n_kv_head < 1 || c->n_head % c->n_kv_head)
        tsdc_fail("%s: n_kv_head (%d) must divide n_head (%d)", what, c->n_kv_head, c->n_head);
    if (c->ffn_dim < 1) tsdc_fail("%s: ffn_dim must be >= 1", what);
    if (c->vocab_size < 2) tsdc_fail("%s: vocab size must be >= 2 (got %d)", what, c->vocab_size);
    if (c->seq_len < 1) tsdc_fail("%s: sequence length must be >= 1 (got %d)", what, c->seq_len);
    if (c->mlp != MLP_SWIGLU && c->mlp != MLP_RELU2) tsdc_fail("%s: unknown mlp type %d", what, c->mlp);
    if (c->qk_norm < 0 || c->qk_norm > 2) tsdc_fail("%s: unknown qk_norm %d", what, c->qk_norm);
    if (c->rope_style < 0 || c->rope_style > 1) tsdc_fail("%s: unknown rope_style %d", what, c->rope_style);
    if (!(c->rope_theta > 0) || !(c->norm_eps > 0) || c->softcap < 0) tsdc_fail("%s: theta and eps must be > 0, softcap >= 0", what);
}

/* field-by-field comparison of everything that defines the weights and the math; returns the name of
 * the first differing field or NULL. seq_len is not compared: it only sizes the RoPE tables. */
static inline const char* config_diff(const Config* a, const Config* b) {
#define CMPF(f) if (a->f != b->f) return #f;
    CMPF(n_layer) CMPF(d_model) CMPF(n_head) CMPF(n_kv_head) CMPF(head_dim) CMPF(ffn_dim) CMPF(vocab_size)
    CMPF(mlp) CMPF(norm_weighted) CMPF(qk_norm) CMPF(rope_style) CMPF(rope_llama3) CMPF(tied)
    CMPF(embed_norm) CMPF(rope_theta) CMPF(norm_eps) CMPF(softcap)
    if (a->rope_llama3) { CMPF(rope_factor) CMPF(rope_low) CMPF(rope_high) CMPF(rope_orig) }
#undef CMPF
    return NULL;
}

/* config_diff, also writing the two differing values (as text, n bytes each) */
static inline const char* config_diff_values(const Config* a, const Config* b, char* va, char* vb, size_t n) {
    const char* f = config_diff(a, b);
    if (!f) return NULL;
#define VALI(x) if (!strcmp(f, #x)) { snprintf(va, n, "%d", a->x); snprintf(vb, n, "%d", b->x); return f; }
#define VALD(x) if (!strcmp(f, #x)) { snprintf(va, n, "%.9g", a->x); snprintf(vb, n, "%.9g", b->x); return f; }
    VALI(n_layer) VALI(d_model) VALI(n_head) VALI(n_kv_head) VALI(head_dim) VALI(ffn_dim) VALI(vocab_size) VALI(mlp)
    VALI(norm_weighted) VALI(qk_norm) VALI(rope_style) VALI(rope_llama3) VALI(tied) VALI(embed_norm)
    VALD(rope_theta) VALD(norm_eps) VALD(softcap) VALD(rope_factor) VALD(rope_low) VALD(rope_high) VALD(rope_orig)
#undef VALI
#undef VALD
    snprintf(va, n, "?"); snprintf(vb, n, "?");
    return f;
}

/* the tensor index of each (layer, type): [n_layer + 1][PT_COUNT], -1 where the model has no such tensor;
 * row n_layer holds the tensors outside the layers (embedding, final norm, head). Allocated, the caller frees */
static int* param_tensor_index(const Config* c, const ParamLayout* L) {
    int* tidx = (int*)mallocCheck(sizeof(int) * (c->n_layer + 1) * PT_COUNT);
    for (int i = 0; i < (c->n_layer + 1) * PT_COUNT; i++) tidx[i] = -1;
    for (int i = 0; i < L->n; i++) {
        const TensorInfo* t = &L->t[i];
        tidx[(t->layer < 0 ? c->n_layer : t->layer) * PT_COUNT + t->type] = i;
    }
    return tidx;
}

#endif
