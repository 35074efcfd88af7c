/* init.h: the weight initialisation both trainers share, counter-based so that it parallelises and
 * gives the same bits on the CPU and the GPU.
 *
 * Math (docs/design.md, training: matrices and embeddings N(0, 0.02^2), norm weights 1):
 *   key_i  = fin(fin(seed + G) + (i + 1) G)                 tensor i of the parameter layout
 *   h      = fin(key_i + (j + 1) G)                         pair j = elements 2j and 2j + 1 of the tensor
 *   u1     = (h[63:40] + 1) 2^-24          in (0, 1]        24 bits, exact in fp32
 *   a      = 2 pi (h[39:16] + 1/2) 2^-24   in (0, 2 pi)     quadrant h[39:38], angle within it h[37:16]
 *   r      = sqrt(-2 ln u1)                                 Box-Muller: (r cos a, r sin a) are two
 *   w[2j]  = 0.02 r cos a,  w[2j+1] = 0.02 r sin a          independent N(0, 1) draws, scaled
 * (fin = splitmix64's finaliser, G = 0x9E3779B97F4A7C15: each tensor is a splitmix64 stream of its own.)
 * An odd-sized tensor's last element takes the cosine half of its pair.
 *
 * Why this arithmetic (bit-identical on CPU and GPU): libm's logf / cosf and CUDA's differ in the last
 * bit for some inputs, so neither is used. Everything is fp32 made of correctly rounded IEEE operations
 * only: integer hashing, exact int -> float conversions, +, -, *, /, sqrt, and fmaf (one rounding on
 * both: an FMA instruction, or glibc's exact fmaf). ln(m) for m in [sqrt(1/2), sqrt(2)] is the atanh
 * series 2 s (1 + s^2/3 + s^4/5 + s^6/7 + s^8/9), s = (m-1)/(m+1), |s| <= 0.172 (truncation < 1e-9);
 * sin and cos on [0, pi/2] are Taylor polynomials to theta^13 / theta^16 (truncation < 1e-9): every
 * multiply-add is an explicit fmaf, so a compiler's FMA contraction (gcc's default -ffp-contract=fast,
 * nvcc's -fmad=true) has nothing left to fuse: no plain product feeds a plain add except products by
 * powers of two, which are exact. The result is within 1e-6 of the exact Box-Muller value (tested
 * against libm in double) and exactly the same bits on every machine (tested: GPU kernel vs this host code).
 *
 * CPU: init_weights_cpu, OpenMP over each tensor's pairs. GPU: llmc/cuda/init.cuh, one thread per pair,
 * calling the same init_normal_pair. */
#ifndef TSDC_INIT_H
#define TSDC_INIT_H

#include <math.h>
#include <stdint.h>
#include "bf16.h"
#include "../host/checksum.h"
#include "../host/config.h"

#define INIT_STD 0.02f

#ifdef __CUDA_ARCH__
#define INIT_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define INIT_DIV(a, b) __fdiv_rn((a), (b))
#define INIT_SQRT(a) __fsqrt_rn(a)
#else
#define INIT_FMA(a, b, c) fmaf((a), (b), (c))
#define INIT_DIV(a, b) ((a) / (b))
#define INIT_SQRT(a) sqrtf(a)
#endif

/* the key of tensor i (its index in the parameter layout) for a seed */
static inline TSDC_HD uint64_t init_tensor_key(uint64_t seed, int i) {
    return splitmix64_fin(splitmix64_fin(seed + TSDC_GOLDEN) + ((uint64_t)i + 1) * TSDC_GOLDEN);
}

/* ln(u) for u = k 2^-24, k in [1, 2^24]: k = m 2^e exactly, m in [sqrt(1/2), sqrt(2)) */
static inline TSDC_HD float init_log_u24(uint32_t k) {
    uint32_t b = f32_bits((float)k);                            /* exact: k <= 2^24 */
    int e = (int)(b >> 23) - 127;
    float m = bits_f32((b & 0x7FFFFFu) | 0x3F800000u);         /* [1, 2) */
    if (m > 1.41421356f) { m *= 0.5f; e += 1; }                 /* exact */
    float f = m - 1.0f;                                         /* exact (Sterbenz) */
    float s = INIT_DIV(f, 2.0f + f);
    float s2 = s * s;
    float p = INIT_FMA(s2, 2.0f / 9.0f, 2.0f / 7.0f);
    p = INIT_FMA(s2, p, 2.0f / 5.0f);
    p = INIT_FMA(s2, p, 2.0f / 3.0f);
    p = INIT_FMA(s2, p, 2.0f);
    return INIT_FMA((float)(e - 24), 0.693147182f, s * p);      /* (e - 24) ln 2 + ln m */
}

/* cos and sin of theta in (0, pi/2) */
static inline TSDC_HD void init_sincos(float t, float* c, float* s) {
    float t2 = t * t;
    float pc = INIT_FMA(t2, 4.77947733e-14f, -1.14707456e-11f);  /* 1/16!, -1/14!, ..., -1/2! */
    pc = INIT_FMA(t2, pc, 2.08767570e-9f);
    pc = INIT_FMA(t2, pc, -2.75573192e-7f);
    pc = INIT_FMA(t2, pc, 2.48015873e-5f);
    pc = INIT_FMA(t2, pc, -1.38888889e-3f);
    pc = INIT_FMA(t2, pc, 4.16666667e-2f);
    pc = INIT_FMA(t2, pc, -0.5f);
    *c = INIT_FMA(t2, pc, 1.0f);
    float ps = INIT_FMA(t2, 1.60590438e-10f, -2.50521084e-8f);   /* 1/13!, -1/11!, ..., -1/3! */
    ps = INIT_FMA(t2, ps, 2.75573192e-6f);
    ps = INIT_FMA(t2, ps, -1.98412698e-4f);
    ps = INIT_FMA(t2, ps, 8.33333333e-3f);
    ps = INIT_FMA(t2, ps, -1.66666667e-1f);
    ps = INIT_FMA(t2, ps, 1.0f);
    *s = t * ps;
}

/* the two N(0, 1) draws of pair j of the tensor with key `key` */
static inline TSDC_HD void init_normal_pair(uint64_t key, uint64_t j, float* z0, float* z1) {
    uint64_t h = splitmix64_fin(key + (j + 1) * TSDC_GOLDEN);
    uint32_t k1 = (uint32_t)(h >> 40) + 1u;                     /* [1, 2^24] */
    uint32_t k2 = (uint32_t)(h >> 16) & 0xFFFFFFu;
    uint32_t quad = k2 >> 22, frac = k2 & 0x3FFFFFu;
    float theta = (float)(2u * frac + 1u) * (1.5707963267948966f / 8388608.0f);   /* (frac + 1/2) 2^-22 pi/2 */
    float r = INIT_SQRT(-2.0f * init_log_u24(k1));
    float c, s;
    init_sincos(theta, &c, &s);
    /* the angle is quad pi/2 + theta */
    float cq = quad == 0 ? c : quad == 1 ? -s : quad == 2 ? -c : s;
    float sq = quad == 0 ? s : quad == 1 ? c : quad == 2 ? -s : -c;
    *z0 = r * cq;
    *z1 = r * sq;
}

/* element k of a normal tensor: std * its half of pair k/2 */
static inline TSDC_HD float init_normal_at(uint64_t key, uint64_t k, float std_) {
    float z0, z1;
    init_normal_pair(key, k >> 1, &z0, &z1);
    return std_ * ((k & 1) ? z1 : z0);
}

/* n elements std * N(0, 1) of the tensor with key `key` (OpenMP over pairs) */
static void init_fill_normal(float* p, size_t n, uint64_t key, float std_) {
    long long np = (long long)(n / 2);
#pragma omp parallel for schedule(static)
    for (long long j = 0; j < np; j++) {
        float z0, z1;
        init_normal_pair(key, (uint64_t)j, &z0, &z1);
        p[2 * j] = std_ * z0;
        p[2 * j + 1] = std_ * z1;
    }
    if (n & 1) p[n - 1] = init_normal_at(key, n - 1, std_);
}

/* every tensor of layout L into params: ones for vectors (norm weights), N(0, 0.02^2) for matrices */
static void init_weights_cpu(float* params, const ParamLayout* L, uint64_t seed) {
    for (int i = 0; i < L->n; i++) {
        const TensorInfo* t = &L->t[i];
        float* p = params + t->offset;
        if (t->rows == 1) for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        else init_fill_normal(p, t->numel, init_tensor_key(seed, i), INIT_STD);
    }
}

#endif
