/* tokenizer.h: the decode table (tokenizer.bin, docs/formats.md) that the sampler prints with.
 * Written by dev/data/prepare.py beside the shards; each id maps to its raw UTF-8 bytes. */
#ifndef TSDC_TOKENIZER_H
#define TSDC_TOKENIZER_H

#include <stdint.h>
#include "checksum.h"
#include "utils.h"

typedef struct {
    uint32_t vocab, bos, eos;
    uint8_t* body;
    uint32_t* off;   /* [vocab]: offset of each token's bytes in body */
    uint32_t* len;
} Tokenizer;

static void tokenizer_load(Tokenizer* tk, const char* path) {
    memset(tk, 0, sizeof(*tk));
    FILE* fp = fopen_regular(path, "decode table");
    long long size = file_size_of(fp, path);
    if (size < 64) tsdc_fail("%s: truncated decode table", path);
    uint8_t h[64];
    fread_exact(h, 64, fp, path);
    if (memcmp(h, "TSDCVOC\0", 8) != 0) tsdc_fail("%s: not a train_sdc decode table (bad magic)", path);
    uint32_t version; uint64_t check;
    memcpy(&version, h + 8, 4); memcpy(&tk->vocab, h + 12, 4); memcpy(&tk->bos, h + 16, 4); memcpy(&tk->eos, h + 20, 4);
    memcpy(&check, h + 24, 8);
    if (version != 1) tsdc_fail("%s: unsupported decode table version %u", path, version);
    size_t body = (size_t)(size - 64);
    tk->body = (uint8_t*)mallocCheck(body);
    fread_exact(tk->body, body, fp, path);
    fclose(fp);
    if (tsdc_checksum(tk->body, body) != check) tsdc_fail("%s: checksum mismatch (corrupted decode table)", path);
    tk->off = (uint32_t*)mallocCheck(sizeof(uint32_t) * (tk->vocab ? tk->vocab : 1));
    tk->len = (uint32_t*)mallocCheck(sizeof(uint32_t) * (tk->vocab ? tk->vocab : 1));
    size_t at = 0;
    for (uint32_t i = 0; i < tk->vocab; i++) {
        uint32_t n;
        if (at + 4 > body) tsdc_fail("%s: truncated decode table at token %u", path, i);
        memcpy(&n, tk->body + at, 4);
        if (at + 4 + n > body) tsdc_fail("%s: truncated decode table at token %u", path, i);
        tk->off[i] = (uint32_t)(at + 4); tk->len[i] = n; at += 4 + n;
    }
    if (at != body) tsdc_fail("%s: %zu trailing bytes after the last token", path, body - at);
}

static void tokenizer_print(const Tokenizer* tk, int id, FILE* out) {
    if (id < 0 || (uint32_t)id >= tk->vocab) { fprintf(out, "<%d>", id); return; }
    fwrite(tk->body + tk->off[id], 1, tk->len[id], out);
}

static void tokenizer_free(Tokenizer* tk) { free(tk->body); free(tk->off); free(tk->len); memset(tk, 0, sizeof(*tk)); }

#endif
