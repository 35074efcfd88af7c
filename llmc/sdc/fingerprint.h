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
#include "../cpu/cpu_features.h"
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

/* element i's storage bits: bf16 bits (h) or a float's bits, reduced to the width */
static inline uint64_t fp_elem_bits(const void* z, int h, size_t i, int width) {
    if (h) return width == 32 ? (uint64_t)((const uint16_t*)z)[i] << 16 : (uint64_t)((const uint16_t*)z)[i];
    return fp_bits(((const float*)z)[i], width);
}

/* elements [lo, hi) into f, one at a time (the definition above; the CPU's portable path and the tails); L is a
 * power of two, so i mod L is a mask, not a division */
static inline void fp_span_scalar(Fingerprint* f, const void* z, int h, size_t lo, size_t hi, int width) {
    const size_t lmask = (size_t)(64 / width) - 1;
    for (size_t i = lo; i < hi; i++) {
        uint64_t b = fp_elem_bits(z, h, i, width);
        f->raw ^= b << (width * (int)(i & lmask));
        f->idx ^= fp_mix(i, b);
    }
}

#if defined(__x86_64__) && !defined(__CUDACC__)
#include <immintrin.h>
#define TSDC_FP_X86 1
/* GCC 12's intrinsic headers start some of these from an "undefined" vector, which its C++ front end without
 * -march=native (the emulation build) reports as maybe uninitialised: a false positive (as in vexp.h) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/* eight elements a step on AVX-512 (64-bit lanes; vpmullq is AVX512DQ): lane j holds element lo + 8 t + j, its
 * bits widened to 64, shifted by width * (j mod L) into the raw half (lo is a multiple of 8, so lane j's shift
 * is the same every step), mixed with its index into the idx half; the lanes are XORed together at the end.
 * XOR is associative and commutative, so the bits are those of the scalar definition. */
static inline __attribute__((target("avx512f,avx512dq"))) __m512i fp_fin8(__m512i z) {
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64((long long)0x94D049BB133111EBULL));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}
static __attribute__((target("avx512f,avx512dq"))) void fp_span_avx512(Fingerprint* f, const void* z, int h, size_t lo, size_t hi,
                                                                         int width) {
    const __m512i sh = width == 16 ? _mm512_setr_epi64(0, 16, 32, 48, 0, 16, 32, 48) : _mm512_setr_epi64(0, 32, 0, 32, 0, 32, 0, 32);
    __m512i idx = _mm512_add_epi64(_mm512_set1_epi64((long long)(lo + TSDC_GOLDEN)), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    const __m512i step = _mm512_set1_epi64(8);
    __m512i raw = _mm512_setzero_si512(), mix = _mm512_setzero_si512();
    size_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m512i b;
        if (h) {
            b = _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i*)((const uint16_t*)z + i)));
            if (width == 32) b = _mm512_slli_epi64(b, 16);
        } else {
            b = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i*)((const float*)z + i)));
            if (width == 16) b = _mm512_srli_epi64(b, 16);
        }
        raw = _mm512_xor_si512(raw, _mm512_sllv_epi64(b, sh));
        mix = _mm512_xor_si512(mix, fp_fin8(_mm512_xor_si512(fp_fin8(idx), b)));
        idx = _mm512_add_epi64(idx, step);
    }
    uint64_t r[8], m[8];
    _mm512_storeu_si512(r, raw);
    _mm512_storeu_si512(m, mix);
    for (int j = 0; j < 8; j++) { f->raw ^= r[j]; f->idx ^= m[j]; }
    fp_span_scalar(f, z, h, i, hi, width);
}
#pragma GCC diagnostic pop
#else
#define TSDC_FP_X86 0
#endif

/* fingerprint of a CPU tensor: a float array, or (h) bf16 bits (the bits of the float holding the same value).
 * Chunks of 2^14 elements (multiples of 8, as the AVX-512 path needs), one OpenMP task each, XORed together.
 * The AVX-512 path where the CPU has it (test_sdc compares both paths with the definition, fp_add). */
static Fingerprint qk_fingerprint_x(const void* z, int h, size_t n, int width) {
    Fingerprint total = {0, 0};
    const size_t chunk = 1 << 14;
    size_t nc = (n + chunk - 1) / chunk;
#if TSDC_FP_X86
    const int vec = cpu_avx512dq();
#endif
#pragma omp parallel
    {
        Fingerprint part = {0, 0};
#pragma omp for schedule(static)
        for (long long c = 0; c < (long long)nc; c++) {
            size_t lo = (size_t)c * chunk, hi = lo + chunk < n ? lo + chunk : n;
#if TSDC_FP_X86
            if (vec) { fp_span_avx512(&part, z, h, lo, hi, width); continue; }
#endif
            fp_span_scalar(&part, z, h, lo, hi, width);
        }
#pragma omp critical
        { total.raw ^= part.raw; total.idx ^= part.idx; }   /* XOR: any combine order gives the same bits */
    }
    return total;
}

static Fingerprint qk_fingerprint(const float* z, size_t n, int width) { return qk_fingerprint_x(z, 0, n, width); }

static inline int fp_equal(Fingerprint a, Fingerprint b) { return a.raw == b.raw && a.idx == b.idx; }

#endif
