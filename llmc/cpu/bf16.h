/* bf16.h: bfloat16 conversion shared by the CPU trainer (emulated AMP) and the CUDA kernels.
 * bf16 = the top 16 bits of an fp32. Rounding is round-to-nearest-even on the dropped 16 bits,
 * NaN kept quiet (as __float2bfloat16_rn does). -precision bf16 on the CPU rounds every tensor
 * the GPU stores in bf16 through bf16_round(), so faults and exponent scaling behave alike. */
#ifndef TSDC_BF16_H
#define TSDC_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TSDC_HD __host__ __device__
#else
#define TSDC_HD
#endif

static inline TSDC_HD uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline TSDC_HD float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline TSDC_HD uint16_t f32_to_bf16_bits(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}
static inline TSDC_HD float bf16_bits_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }
static inline TSDC_HD float bf16_round(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

/* bf16_round on the bits, branch-free so that loops over it vectorise; the same result as bf16_round for every
 * input (NaN quieted, ties to even, overflow to inf) */
static inline uint32_t bf16_round_bits(uint32_t v) {
    uint32_t rounded = (v + 0x7fffu + ((v >> 16) & 1u)) & 0xffff0000u;
    uint32_t quiet = (v & 0xffff0000u) | 0x00400000u;
    return (v & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}
/* bf16_round over an array (dst = round(src); dst == src allowed) */
static inline void bf16_round_copy(float* dst, const float* src, long long n) {
    uint32_t* u = (uint32_t*)dst;
    const uint32_t* in = (const uint32_t*)src;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long long i = 0; i < n; i++) u[i] = bf16_round_bits(in[i]);
}
static inline void bf16_round_array(float* x, long long n) { bf16_round_copy(x, x, n); }
/* dst = round(src) over a short span, inside a parallel region (no OpenMP of its own) */
static inline void bf16_round_copy_span(float* dst, const float* src, int n) {
    uint32_t* u = (uint32_t*)dst;
    const uint32_t* in = (const uint32_t*)src;
    for (int i = 0; i < n; i++) u[i] = bf16_round_bits(in[i]);
}
/* in place */
static inline void bf16_round_span(float* x, int n) { bf16_round_copy_span(x, x, n); }
/* -precision bf16's storage: dst = the bf16 bits of round(src) (f32_to_bf16_bits' result, branch-free), and back
 * (exact), over a short span inside a parallel region */
static inline void bf16_pack_span(uint16_t* dst, const float* src, int n) {
    const uint32_t* in = (const uint32_t*)src;
    for (int i = 0; i < n; i++) dst[i] = (uint16_t)(bf16_round_bits(in[i]) >> 16);
}
static inline void bf16_unpack_span(float* dst, const uint16_t* src, int n) {
    uint32_t* u = (uint32_t*)dst;
    for (int i = 0; i < n; i++) u[i] = (uint32_t)src[i] << 16;
}
/* the same over a whole array, threaded like bf16_round_copy */
static inline void bf16_unpack_array(float* dst, const uint16_t* src, long long n) {
    uint32_t* u = (uint32_t*)dst;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long long i = 0; i < n; i++) u[i] = (uint32_t)src[i] << 16;
}
static inline void bf16_pack_array(uint16_t* dst, const float* src, long long n) {
    const uint32_t* in = (const uint32_t*)src;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long long i = 0; i < n; i++) dst[i] = (uint16_t)(bf16_round_bits(in[i]) >> 16);
}

#endif
