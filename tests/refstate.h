/* refstate.h: the debug reference state (docs/formats.md), written by dev/reference/make_states.py
 * with HF transformers / nanochat, read by the CPU and GPU tests. read_state validates magic, size and
 * checksum and returns 0 (after printing why) on a bad file. */
#ifndef TSDC_REFSTATE_H
#define TSDC_REFSTATE_H

#include <stdint.h>
#include <stdio.h>
#include "../llmc/host/checksum.h"
#include "../llmc/host/utils.h"
#include "check.h"

typedef struct {
    int B, T, V, n_steps, warmup;
    uint64_t n_params;
    float max_lr, final_frac, beta1, beta2, adam_eps, wd, clip;
    int* tokens;
    float *logits, loss, *grads, *losses;
} RefState;

static int read_state(const char* path, RefState* s) {
    FILE* fp = fopen(path, "rb");
    if (!fp) { printf("  cannot open %s\n", path); return 0; }
    long long size = file_size_of(fp, path);
    uint8_t* buf = (uint8_t*)mallocCheck((size_t)size);
    fread_exact(buf, (size_t)size, fp, path);
    fclose(fp);
    if (size < 264 || memcmp(buf, "TSDCREF\0", 8)) { printf("  %s: bad magic\n", path); free(buf); return 0; }
    uint64_t chk; memcpy(&chk, buf + size - 8, 8);
    if (tsdc_checksum(buf, (size_t)size - 8) != chk) { printf("  %s: checksum mismatch\n", path); free(buf); return 0; }
    memcpy(&s->B, buf + 12, 4); memcpy(&s->T, buf + 16, 4); memcpy(&s->V, buf + 20, 4); memcpy(&s->n_steps, buf + 24, 4);
    memcpy(&s->warmup, buf + 28, 4); memcpy(&s->n_params, buf + 32, 8);
    float hv[7]; memcpy(hv, buf + 40, sizeof(hv));
    s->max_lr = hv[0]; s->final_frac = hv[1]; s->beta1 = hv[2]; s->beta2 = hv[3]; s->adam_eps = hv[4]; s->wd = hv[5]; s->clip = hv[6];
    size_t off = 256, nt = (size_t)s->B * (s->T + 1), nl = (size_t)s->B * s->T * s->V;
    size_t expect = off + nt * 4 + nl * 4 + 4 + s->n_params * 4 + (size_t)s->n_steps * 4 + 8;
    if ((size_t)size != expect) { printf("  %s: size %lld, expected %zu\n", path, size, expect); free(buf); return 0; }
    s->tokens = (int*)mallocCheck(nt * 4); memcpy(s->tokens, buf + off, nt * 4); off += nt * 4;
    s->logits = (float*)mallocCheck(nl * 4); memcpy(s->logits, buf + off, nl * 4); off += nl * 4;
    memcpy(&s->loss, buf + off, 4); off += 4;
    s->grads = (float*)mallocCheck(s->n_params * 4); memcpy(s->grads, buf + off, s->n_params * 4); off += s->n_params * 4;
    s->losses = (float*)mallocCheck((size_t)s->n_steps * 4); memcpy(s->losses, buf + off, (size_t)s->n_steps * 4);
    free(buf);
    return 1;
}

static void free_state(RefState* s) { free(s->tokens); free(s->logits); free(s->grads); free(s->losses); }

/* the reference state of a preset (states_dir/PRESET.state) read, and the path of its converted checkpoint
 * (ckpt_dir/PRESET.ckpt, `make refckpts`) in cpath; 0, after a failed check, when the state cannot be read */
static int ref_open(const char* preset, const char* states_dir, const char* ckpt_dir, RefState* s, char* cpath, size_t ncpath) {
    char spath[1200];
    snprintf(spath, sizeof(spath), "%s/%s.state", states_dir, preset);
    snprintf(cpath, ncpath, "%s/%s.ckpt", ckpt_dir, preset);
    if (!read_state(spath, s)) { check(0, "  read %s", spath); return 0; }
    return 1;
}

/* the state's batch: B sequences of T + 1 tokens, as B x T inputs and the B x T next tokens */
static void ref_batch(const RefState* s, int* inputs, int* targets) {
    for (int b = 0; b < s->B; b++)
        for (int t = 0; t < s->T; t++) {
            inputs[b * s->T + t] = s->tokens[b * (s->T + 1) + t];
            targets[b * s->T + t] = s->tokens[b * (s->T + 1) + t + 1];
        }
}

/* the name of a parameter gradient in the tests' lines: "grad layers.L.NAME", or "grad NAME" outside the
 * layers (TensorInfo and PT_NAMES: llmc/host/config.h, included by the trainer before this file) */
static void grad_name(char* buf, size_t n, const TensorInfo* t) {
    if (t->layer >= 0) snprintf(buf, n, "grad layers.%d.%s", t->layer, PT_NAMES[t->type]);
    else snprintf(buf, n, "grad %s", PT_NAMES[t->type]);
}

#endif
