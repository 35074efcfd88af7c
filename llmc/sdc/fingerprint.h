/* fingerprint.h: the 128-bit Q/K fingerprints of Q/K path recomputation (docs/design.md, the method, paper
 * eqs. 5-7). For a tensor Z of n elements with raw bit patterns b_i of width w and L = 64 / w:
 *   phi_raw = XOR_i (b_i << (w * (i mod L)))       every single-bit change of any b_i flips one bit
 *   phi_idx = XOR_i mix(i, b_i)                      mix(i, b) = fin(fin(i + G) ^ b), fin = splitmix64
 * phi_idx ties each value to its position, so a permutation (two elements swapped) changes it even
 * where phi_raw cannot see it. A mismatch in either half between the forward's Q (or K) and its
 * recomputation raises the alarm. w is the storage width: 32 for fp32 tensors, 16 for bf16.
 * Both halves are XORs, so the fingerprint of a tensor is the XOR of the fingerprints of any partition
 * of it: chunks (OpenMP tasks here, thread blocks on the GPU) combine in any order to the same bits. */
#ifndef TSDC_FINGERPRINT_H
#define TSDC_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>
#include "../cpu/bf16.h"
#include "../host/checksum.h"

typedef struct { uint64_t raw, idx; } Fingerprint;

static inline TSDC_HD uint64_t fp_mix(uint64_t i, uint64_t b) { return splitmix64_fin(splitmix64_fin(i + TSDC_GOLDEN) ^ b); }

/* one element's contribution; bits already reduced to the storage width */
static inline TSDC_HD void fp_add(Fingerprint* f, uint64_t i, uint64_t bits, int width) {
    int L = 64 / width;
    f->raw ^= bits << (width * (int)(i % (uint64_t)L));
    f->idx ^= fp_mix(i, bits);
}

/* storage bits of a float that holds an fp32 (width 32) or a bf16 value (width 16) */
static inline TSDC_HD uint64_t fp_bits(float x, int width) {
    return width == 32 ? (uint64_t)f32_bits(x) : (uint64_t)(f32_bits(x) >> 16);
}

/* fingerprint of a CPU tensor: a float array, or (h) bf16 bits (the bits of the float holding the same value) */
static Fingerprint qk_fingerprint_x(const void* z, int h, size_t n, int width) {
    Fingerprint total = {0, 0};
    const size_t chunk = 1 << 14;
    size_t nc = (n + chunk - 1) / chunk;
#pragma omp parallel
    {
        Fingerprint part = {0, 0};
#pragma omp for schedule(static)
        for (long long c = 0; c < (long long)nc; c++) {
            size_t lo = (size_t)c * chunk, hi = lo + chunk < n ? lo + chunk : n;
            if (h)
                for (size_t i = lo; i < hi; i++) fp_add(&part, i, fp_bits(bits_f32((uint32_t)((const uint16_t*)z)[i] << 16), width), width);
            else
                for (size_t i = lo; i < hi; i++) fp_add(&part, i, fp_bits(((const float*)z)[i], width), width);
        }
#pragma omp critical
        { total.raw ^= part.raw; total.idx ^= part.idx; }   /* XOR: any combine order gives the same bits */
    }
    return total;
}

static Fingerprint qk_fingerprint(const float* z, size_t n, int width) { return qk_fingerprint_x(z, 0, n, width); }

static inline int fp_equal(Fingerprint a, Fingerprint b) { return a.raw == b.raw && a.idx == b.idx; }

#endif
