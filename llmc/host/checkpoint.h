/* checkpoint.h: checkpoint write (atomic) and read (validated), docs/formats.md.
 *
 * Layout: 4096-byte header (config + training state), fp32 parameters, then AdamW m and v when
 * has_opt, then a u64 tsdc_checksum of everything before it. Written to PATH.tmp, fflushed, fsynced
 * and renamed over PATH (utils.h, OutFile), so a crash leaves either the old checkpoint or the new one,
 * never half; a failed write (a full disk) removes the .tmp and stops with the file named. */
#ifndef TSDC_CHECKPOINT_H
#define TSDC_CHECKPOINT_H

#include <stdint.h>
#include <unistd.h>
#include "checksum.h"
#include "config.h"
#include "utils.h"

#define CKPT_HEADER_BYTES 4096

/* what a checkpoint records besides the weights: everything an exact resume needs */
typedef struct {
    int64_t step;          /* optimizer steps completed */
    uint64_t data_pos;     /* token position of the next step's batch */
    uint64_t rng[4];
    int world, B, A, T, warmup, precision;
    int total_steps;
    double lr, final_frac, beta1, beta2, adam_eps, weight_decay, grad_clip;
} TrainState;

static void ckpt_put(uint8_t* h, int off, const void* v, int n) { memcpy(h + off, v, n); }
static void ckpt_get(const uint8_t* h, int off, void* v, int n) { memcpy(v, h + off, n); }

static void ckpt_header_encode(uint8_t* h, const Config* c, size_t n_params, const TrainState* ts, int has_opt, uint64_t wsum) {
    memset(h, 0, CKPT_HEADER_BYTES);
    memcpy(h, "TSDCCKPT", 8);
    uint32_t version = 1, hb = CKPT_HEADER_BYTES;
    ckpt_put(h, 8, &version, 4); ckpt_put(h, 12, &hb, 4);
    memcpy(h + 16, c->preset, strnlen(c->preset, 31)); /* NUL-padded, at most 31 characters */
    int32_t iv[15] = {c->n_layer, c->d_model, c->n_head, c->n_kv_head, c->head_dim, c->ffn_dim, c->vocab_size, c->seq_len,
                      c->mlp, c->norm_weighted, c->qk_norm, c->rope_style, c->rope_llama3, c->tied, c->embed_norm};
    ckpt_put(h, 48, iv, sizeof(iv));
    double dv[7] = {c->rope_theta, c->norm_eps, c->softcap, c->rope_factor, c->rope_low, c->rope_high, c->rope_orig};
    ckpt_put(h, 112, dv, sizeof(dv));
    uint64_t np = n_params; ckpt_put(h, 168, &np, 8);
    ckpt_put(h, 176, &ts->step, 8); ckpt_put(h, 184, &ts->data_pos, 8); ckpt_put(h, 192, ts->rng, 32);
    int32_t tv[8] = {has_opt, ts->world, ts->B, ts->A, ts->T, ts->warmup, ts->total_steps, ts->precision};
    ckpt_put(h, 224, tv, sizeof(tv));
    double hv[7] = {ts->lr, ts->final_frac, ts->beta1, ts->beta2, ts->adam_eps, ts->weight_decay, ts->grad_clip};
    ckpt_put(h, 256, hv, sizeof(hv));
    ckpt_put(h, 312, &wsum, 8);
}

/* write header + params (+ m, v) atomically. Returns the weight checksum. */
static uint64_t checkpoint_write(const char* path, const Config* c, const float* params, const float* m, const float* v,
                                 size_t n_params, const TrainState* ts) {
    OutFile f;
    outfile_open(&f, path);
    uint8_t h[CKPT_HEADER_BYTES];
    uint64_t wsum = tsdc_checksum(params, n_params * sizeof(float));
    int has_opt = (m != NULL && v != NULL);
    ckpt_header_encode(h, c, n_params, ts, has_opt, wsum);
    ChecksumStream cs;
    checksum_stream_init(&cs);
    checksum_stream_update(&cs, h, CKPT_HEADER_BYTES);
    outfile_write(&f, h, CKPT_HEADER_BYTES);
    const float* parts[3] = {params, m, v};
    for (int i = 0; i < (has_opt ? 3 : 1); i++) {
        checksum_stream_update(&cs, parts[i], n_params * sizeof(float));
        outfile_write(&f, parts[i], n_params * sizeof(float));
    }
    uint64_t check = checksum_stream_final(&cs);
    outfile_write(&f, &check, 8);
    outfile_commit(&f);
    return wsum;
}

typedef struct {
    Config cfg;
    TrainState ts;
    int has_opt;
    size_t n_params;
    uint64_t weight_sum;
} CkptInfo;

/* read and validate a checkpoint. params (and m, v when has_opt and non-NULL) must hold
 * expect_params floats; their sizes are checked against the file before anything is read. */
static void checkpoint_read(const char* path, CkptInfo* info, float* params, float* m, float* v, size_t expect_params) {
    FILE* fp = fopen_regular(path, "checkpoint");
    long long size = file_size_of(fp, path);
    if (size < CKPT_HEADER_BYTES + 8) tsdc_fail("%s: truncated checkpoint (%lld bytes)", path, size);
    uint8_t* buf = (uint8_t*)mallocCheck((size_t)size);
    fread_exact(buf, (size_t)size, fp, path);
    fclose(fp);
    const uint8_t* h = buf;
    if (memcmp(h, "TSDCCKPT", 8) != 0) tsdc_fail("%s: not a train_sdc checkpoint (bad magic)", path);
    uint32_t version, hb;
    ckpt_get(h, 8, &version, 4); ckpt_get(h, 12, &hb, 4);
    if (version != 1 || hb != CKPT_HEADER_BYTES) tsdc_fail("%s: unsupported checkpoint version %u", path, version);
    memset(info, 0, sizeof(*info));
    Config* c = &info->cfg;
    memcpy(c->preset, h + 16, 31);
    int32_t iv[15]; ckpt_get(h, 48, iv, sizeof(iv));
    c->n_layer = iv[0]; c->d_model = iv[1]; c->n_head = iv[2]; c->n_kv_head = iv[3]; c->head_dim = iv[4];
    c->ffn_dim = iv[5]; c->vocab_size = iv[6]; c->seq_len = iv[7]; c->mlp = iv[8]; c->norm_weighted = iv[9];
    c->qk_norm = iv[10]; c->rope_style = iv[11]; c->rope_llama3 = iv[12]; c->tied = iv[13]; c->embed_norm = iv[14];
    double dv[7]; ckpt_get(h, 112, dv, sizeof(dv));
    c->rope_theta = dv[0]; c->norm_eps = dv[1]; c->softcap = dv[2]; c->rope_factor = dv[3]; c->rope_low = dv[4];
    c->rope_high = dv[5]; c->rope_orig = dv[6];
    uint64_t np; ckpt_get(h, 168, &np, 8);
    TrainState* ts = &info->ts;
    ckpt_get(h, 176, &ts->step, 8); ckpt_get(h, 184, &ts->data_pos, 8); ckpt_get(h, 192, ts->rng, 32);
    int32_t tv[8]; ckpt_get(h, 224, tv, sizeof(tv));
    info->has_opt = tv[0]; ts->world = tv[1]; ts->B = tv[2]; ts->A = tv[3]; ts->T = tv[4]; ts->warmup = tv[5];
    ts->total_steps = tv[6]; ts->precision = tv[7];
    double hv[7]; ckpt_get(h, 256, hv, sizeof(hv));
    ts->lr = hv[0]; ts->final_frac = hv[1]; ts->beta1 = hv[2]; ts->beta2 = hv[3]; ts->adam_eps = hv[4];
    ts->weight_decay = hv[5]; ts->grad_clip = hv[6];
    ckpt_get(h, 312, &info->weight_sum, 8);
    info->n_params = (size_t)np;
    if (info->has_opt != 0 && info->has_opt != 1) tsdc_fail("%s: corrupt header (has_opt = %d)", path, info->has_opt);
    long long expect_size = CKPT_HEADER_BYTES + (long long)np * 4 * (info->has_opt ? 3 : 1) + 8;
    if (size != expect_size)
        tsdc_fail("%s: truncated or oversized checkpoint: %lld bytes, header implies %lld", path, size, expect_size);
    uint64_t check; memcpy(&check, buf + size - 8, 8);
    if (tsdc_checksum(buf, (size_t)size - 8) != check) tsdc_fail("%s: checksum mismatch (corrupted checkpoint)", path);
    /* a valid file: its config must be a valid model */
    config_validate(c, path);
    if (config_num_params(c) != np) tsdc_fail("%s: header says %llu parameters, its config has %zu", path,
                                              (unsigned long long)np, config_num_params(c));
    if (params) {
        if (np != expect_params) tsdc_fail("%s: checkpoint has %llu parameters, the model %zu", path, (unsigned long long)np, expect_params);
        memcpy(params, buf + CKPT_HEADER_BYTES, np * 4);
        if (tsdc_checksum(params, np * 4) != info->weight_sum) tsdc_fail("%s: weight checksum mismatch", path);
        if (info->has_opt && m && v) {
            memcpy(m, buf + CKPT_HEADER_BYTES + np * 4, np * 4);
            memcpy(v, buf + CKPT_HEADER_BYTES + np * 8, np * 4);
        }
    }
    free(buf);
}

#endif
