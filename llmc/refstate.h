/* refstate.h: the debug reference state (docs/formats.md), written by dev/reference/make_states.py
 * with HF transformers / nanochat, read by the CPU and GPU tests. read_state validates magic, size and
 * checksum and returns 0 (after printing why) on a bad file. */
#ifndef TSDC_REFSTATE_H
#define TSDC_REFSTATE_H

#include <stdint.h>
#include <stdio.h>
#include "checksum.h"
#include "utils.h"

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

#endif
