/* checksum.h: tsdc_checksum, the 64-bit checksum of every train_sdc file (docs/formats.md).
 *   bytes -> zero-padded little-endian u64 words w_i;  G = 0x9E3779B97F4A7C15
 *   check = n_bytes*G + sum_i fin(w_i + (i+1)*G)  (mod 2^64),  fin = splitmix64 finaliser.
 * A sum of bijective mixes: order-independent (so it parallelises without changing a bit) yet
 * position-sensitive, and any single-bit change alters it. splitmix64_fin is also the mix used by
 * the Q/K fingerprints and the RNG, so it is host/device-callable. */
#ifndef TSDC_CHECKSUM_H
#define TSDC_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "utils.h"

#ifdef __CUDACC__
#define TSDC_HD __host__ __device__
#else
#define TSDC_HD
#endif

#define TSDC_GOLDEN 0x9E3779B97F4A7C15ULL

static inline TSDC_HD uint64_t splitmix64_fin(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* checksum of n bytes; `word_offset` lets a caller checksum a buffer in pieces (each piece a
 * multiple of 8 bytes except the last) and add the partial sums: total = n_total*G + sum(parts). */
static inline uint64_t tsdc_checksum_part(const void* data, size_t n, uint64_t word_offset) {
    const unsigned char* p = (const unsigned char*)data;
    size_t nw = n / 8;
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (nw > (1u << 16))
    for (long long i = 0; i < (long long)nw; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * (size_t)i, 8); /* little-endian hosts only (x86, arm64) */
        sum += splitmix64_fin(w + ((uint64_t)i + 1 + word_offset) * TSDC_GOLDEN);
    }
    size_t rem = n - nw * 8;
    if (rem) {
        uint64_t w = 0;
        memcpy(&w, p + nw * 8, rem);
        sum += splitmix64_fin(w + ((uint64_t)nw + 1 + word_offset) * TSDC_GOLDEN);
    }
    return sum;
}

static inline uint64_t tsdc_checksum(const void* data, size_t n) {
    return (uint64_t)n * TSDC_GOLDEN + tsdc_checksum_part(data, n, 0);
}

/* streaming form, for data written in pieces of any length (checkpoints) */
typedef struct { uint64_t sum, words, total; uint8_t pend[8]; int npend; } ChecksumStream;
static inline void checksum_stream_init(ChecksumStream* cs) { memset(cs, 0, sizeof(*cs)); }
static inline void checksum_stream_update(ChecksumStream* cs, const void* data, size_t n) {
    const uint8_t* p = (const uint8_t*)data;
    cs->total += n;
    while (n && cs->npend) { /* complete a pending word */
        cs->pend[cs->npend++] = *p++; n--;
        if (cs->npend == 8) { cs->sum += tsdc_checksum_part(cs->pend, 8, cs->words); cs->words++; cs->npend = 0; }
    }
    if (cs->npend) return; /* the data ended inside the pending word */
    size_t bulk = n / 8 * 8;
    if (bulk) { cs->sum += tsdc_checksum_part(p, bulk, cs->words); cs->words += bulk / 8; }
    memcpy(cs->pend, p + bulk, n - bulk);
    cs->npend = (int)(n - bulk);
}
static inline uint64_t checksum_stream_final(const ChecksumStream* cs) {
    uint64_t sum = cs->sum;
    if (cs->npend) sum += tsdc_checksum_part(cs->pend, (size_t)cs->npend, cs->words);
    return cs->total * TSDC_GOLDEN + sum;
}

/* a file of `bytes` bytes of body and its u64 tsdc_checksum after them (buf holds bytes + 8), written
 * atomically through utils.h's OutFile: the calibration files */
static void file_write_checksummed(const char* path, uint8_t* buf, size_t bytes) {
    uint64_t chk = tsdc_checksum(buf, bytes);
    memcpy(buf + bytes, &chk, 8);
    OutFile f;
    outfile_open(&f, path);
    outfile_write(&f, buf, bytes + 8);
    outfile_commit(&f);
}

#endif
