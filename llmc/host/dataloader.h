/* dataloader.h: token shards (docs/formats.md) and the deterministic batch order.
 *
 * A shard is loaded whole and validated: magic, version, token width, exact file size, checksum,
 * and every token id < the model's vocabulary size. Errors name the file and the problem.
 *
 * Batch order: one optimizer step consumes R*A microbatches (R ranks, A accumulation steps) of B
 * sequences of T+1 tokens (inputs and the next-token targets). Global microbatch g = r*A + a (each
 * rank a contiguous slice of the step's batch), sequence j of it starts at pos + ((g*B + j) * T).
 * After the step pos += R*A*B*T, wrapping to 0 when the next step would run past the end. So
 * R ranks x A microbatches and 1 rank x R*A microbatches read exactly the same tokens.
 *
 * Row shards (header field "row length" r > 0): the tokens are independent rows of r = T+1 tokens,
 * such as a fixed batch of the reference states (dev/reference), where consecutive sequences share no
 * token. The sequence that starts at stream position q*T reads row q (inputs its first T tokens,
 * targets its last T); the shard behaves as a stream of rows*T + 1 positions, so the batch order, the
 * wrap and the checkpointed data position are the same as for a stream. */
#ifndef TSDC_DATALOADER_H
#define TSDC_DATALOADER_H

#include <stdint.h>
#include "checksum.h"
#include "utils.h"

#define SHARD_HEADER_BYTES 256

typedef struct {
    char path[1024];
    int width;          /* 2 or 4 */
    uint32_t vocab;     /* vocabulary size recorded by the writer */
    uint64_t n;         /* stream positions: the tokens, or rows*(r-1) + 1 for a row shard */
    uint32_t row;       /* 0: one token stream; r > 0: independent rows of r tokens */
    uint64_t n_raw;     /* tokens in the file */
    uint8_t* raw;       /* token bytes */
} Shard;

static inline uint32_t shard_token(const Shard* s, uint64_t i) {
    if (s->width == 2) { uint16_t t; memcpy(&t, s->raw + 2 * i, 2); return t; }
    uint32_t t; memcpy(&t, s->raw + 4 * i, 4); return t;
}

static void shard_load(Shard* s, const char* path, int model_vocab) {
    memset(s, 0, sizeof(*s));
    snprintf(s->path, sizeof(s->path), "%s", path);
    FILE* fp = fopen_regular(path, "token shard");
    long long size = file_size_of(fp, path);
    if (size < SHARD_HEADER_BYTES) tsdc_fail("%s: truncated token shard (%lld bytes, header is %d)", path, size, SHARD_HEADER_BYTES);
    uint8_t h[SHARD_HEADER_BYTES];
    fread_exact(h, SHARD_HEADER_BYTES, fp, path);
    if (memcmp(h, "TSDCTOK\0", 8) != 0) tsdc_fail("%s: not a train_sdc token shard (bad magic)", path);
    uint32_t version, width, vocab, row; uint64_t n, check;
    memcpy(&version, h + 8, 4); memcpy(&width, h + 12, 4); memcpy(&vocab, h + 16, 4); memcpy(&row, h + 20, 4);
    memcpy(&n, h + 24, 8); memcpy(&check, h + 32, 8);
    if (version != 1) tsdc_fail("%s: unsupported token shard version %u (expected 1)", path, version);
    if (width != 2 && width != 4) tsdc_fail("%s: bad token width %u (expected 2 or 4)", path, width);
    if ((unsigned long long)size != SHARD_HEADER_BYTES + n * (unsigned long long)width)
        tsdc_fail("%s: truncated or oversized token shard: header says %llu tokens (%llu bytes), file has %lld bytes",
                  path, (unsigned long long)n, (unsigned long long)(SHARD_HEADER_BYTES + n * width), size);
    if (row == 1 || (row && (n == 0 || n % row)))
        tsdc_fail("%s: row length %u does not divide the shard into rows of at least 2 tokens (%llu tokens)", path, row,
                  (unsigned long long)n);
    s->width = (int)width; s->vocab = vocab; s->row = row; s->n_raw = n;
    s->n = row ? n / row * (row - 1) + 1 : n;
    s->raw = (uint8_t*)mallocCheck((size_t)(n * width));
    fread_exact(s->raw, (size_t)(n * width), fp, path);
    fclose(fp);
    if (tsdc_checksum(s->raw, (size_t)(n * width)) != check) tsdc_fail("%s: checksum mismatch (corrupted token shard)", path);
    uint32_t mx = 0; uint64_t at = 0;
    for (uint64_t i = 0; i < n; i++) { uint32_t t = shard_token(s, i);   /* file order: row shards too */ if (t > mx) { mx = t; at = i; } }
    if (n && mx >= (uint32_t)model_vocab)
        tsdc_fail("%s: token id %u at position %llu >= model vocab size %d (pass -vocab or use the matching tokenizer)",
                  path, mx, (unsigned long long)at, model_vocab);
    /* ids below the model's vocabulary, but from a tokenizer of another size: the wrong data for this model */
    if (vocab != (uint32_t)model_vocab)
        tsdc_fail("%s: shard was tokenised for a vocabulary of %u, the model has %d (pass -vocab %u, or the shard of the model's tokenizer)",
                  path, vocab, model_vocab, vocab);
}

static void shard_free(Shard* s) { free(s->raw); s->raw = NULL; }

/* tokens needed for one step */
static inline uint64_t batch_span(int world, int accum, int B, int T) { return (uint64_t)world * accum * B * T; }

static inline void shard_require(const Shard* s, uint64_t need, const char* what) {
    if (s->n < need)
        tsdc_fail("%s: shard has %llu tokens, shorter than one %s (%llu tokens)", s->path,
                  (unsigned long long)s->n, what, (unsigned long long)need);
}

/* the sequence starting at stream position start: T inputs and their T next-token targets */
static void shard_sequence(const Shard* s, uint64_t start, int T, int* inputs, int* targets) {
    uint64_t at = start;
    if (s->row) {
        if (s->row != (uint32_t)T + 1) tsdc_fail("%s: a row shard of rows of %u tokens needs -seq %u, not %d", s->path, s->row, s->row - 1, T);
        if (start % (uint64_t)T) tsdc_fail("%s: position %llu is not at a row of the row shard", s->path, (unsigned long long)start);
        at = start / (uint64_t)T * s->row;
    }
    for (int t = 0; t < T; t++) {
        inputs[t] = (int)shard_token(s, at + t);
        targets[t] = (int)shard_token(s, at + t + 1);
    }
}

/* fill inputs/targets [B*T] of global microbatch g of the step starting at position pos */
static void shard_microbatch(const Shard* s, uint64_t pos, int g, int B, int T, int* inputs, int* targets) {
    for (int j = 0; j < B; j++) shard_sequence(s, pos + ((uint64_t)g * B + j) * T, T, inputs + j * T, targets + j * T);
}

/* position of the step after the one starting at pos */
static inline uint64_t shard_advance(const Shard* s, uint64_t pos, uint64_t span) {
    pos += span;
    if (pos + span + 1 > s->n) pos = 0;
    return pos;
}

#endif
