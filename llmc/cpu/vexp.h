/* vexp.h: expf over arrays, 16 floats at a time on AVX-512, with the bits of glibc's expf.
 *
 *   vexpf_span(y, x, n): y[i] = expf(x[i]) for i < n (y may alias x).
 *
 * The CPU trainer's SiLU and attention softmax called libm's expf once per element (an opaque call: the loops
 * around it could not vectorise; 4% of a tiny-llama step). Any other exp would change the fault-free reference's
 * bits, so this is glibc's own algorithm (sysdeps/ieee754/flt-32/e_expf.c, glibc >= 2.28, from Arm's optimized
 * routines) done in eight double lanes per zmm, with the operations and the fused multiply-adds of the FMA build
 * that glibc selects on any CPU with FMA (__expf_fma), in the same order:
 *
 *   xd = (double) x
 *   kd = fma(InvLn2N, xd, Shift)          InvLn2N = 32 / ln 2, Shift = 0x1.8p52: k = round(x 32 / ln 2) in the low bits
 *   ki = bits(kd); kd = kd - Shift
 *   r  = fma(InvLn2N, xd, -kd)            r in [-1/2, 1/2]
 *   s  = asdouble(T[ki % 32] + (ki << 47))  2^(k/32)
 *   z  = fma(C0, r, C1); r2 = r r; y = fma(C2, r, 1); y = fma(z, r2, y); y = y s
 *   return (float) y                      (round to nearest even)
 *
 * T, C0..C2, InvLn2N and Shift are glibc's __exp2f_data constants (the 2^(i/32) table with i << 47 taken out, the
 * polynomial scaled by 32). Inputs with |x| >= 88 (top 12 bits >= 0x42a), infinities and NaNs take glibc's special
 * cases: those lanes are recomputed by libm's expf itself. vexpf_ref is the same algorithm as scalar C with fma();
 * test_sdc holds the vector code to it bit for bit and both to libm's expf over a sweep of all float bit patterns
 * (equal on FMA machines with this glibc; without AVX-512 vexpf_span calls expf, so the bits are libm's anyway). */
#ifndef TSDC_CPU_VEXP_H
#define TSDC_CPU_VEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "cpu_features.h"
#if defined(__x86_64__) && !defined(__CUDACC__)
#include <immintrin.h>
#define TSDC_VEXP_X86 1
#else
#define TSDC_VEXP_X86 0
#endif

static const uint64_t vexp_T[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull};
#define VEXP_INVLN2N 0x40471547652b82feull
#define VEXP_SHIFT 0x4338000000000000ull
#define VEXP_C0 0x3ebc6af84b912394ull
#define VEXP_C1 0x3f2ebfce50fac4f3ull
#define VEXP_C2 0x3f962e42ff0c52d6ull

static inline double vexp_d(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
static inline uint64_t vexp_u(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

/* the algorithm as scalar C (the tests' model of the vector code; fma() is the correctly rounded fused operation) */
static inline float vexpf_ref(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    if (((bits >> 20) & 0x7ff) >= 0x42a) return expf(x);   /* |x| >= 88, inf, nan: glibc's special cases */
    double xd = (double)x, inv = vexp_d(VEXP_INVLN2N), shift = vexp_d(VEXP_SHIFT);
    double kd = fma(inv, xd, shift);
    uint64_t ki = vexp_u(kd);
    kd -= shift;
    double r = fma(inv, xd, -kd);
    double s = vexp_d(vexp_T[ki % 32] + (ki << 47));
    double z = fma(vexp_d(VEXP_C0), r, vexp_d(VEXP_C1)), r2 = r * r, y = fma(vexp_d(VEXP_C2), r, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

#if TSDC_VEXP_X86
/* GCC 12's intrinsic headers start several of these from an "undefined" vector, which its C++ front end at -O2 without
 * -march=native (the emulation build) reports as maybe uninitialised: a false positive */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/* eight lanes: x (fp32, in a ymm) -> expf(x) (fp32) */
__attribute__((target("avx512f,avx512dq"))) static inline __m256 vexp8(__m256 x, const __m512i t0, const __m512i t1, const __m512i t2,
                                                                   const __m512i t3) {
    const __m512d inv = _mm512_castsi512_pd(_mm512_set1_epi64((long long)VEXP_INVLN2N));
    const __m512d shift = _mm512_castsi512_pd(_mm512_set1_epi64((long long)VEXP_SHIFT));
    __m512d xd = _mm512_cvtps_pd(x);
    __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
    __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    /* T[ki % 32]: entries 0..15 from t0:t1, 16..31 from t2:t3 (permutex2var reads the low 4 bits), bit 4 picks */
    __m512i lo = _mm512_permutex2var_epi64(t0, ki, t1), hi = _mm512_permutex2var_epi64(t2, ki, t3);
    __mmask8 up = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    __m512i t = _mm512_mask_blend_epi64(up, lo, hi);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    __m512d s = _mm512_castsi512_pd(t);
    __m512d z = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_set1_epi64((long long)VEXP_C0)), r,
                                _mm512_castsi512_pd(_mm512_set1_epi64((long long)VEXP_C1)));
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_set1_epi64((long long)VEXP_C2)), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    y = _mm512_mul_pd(y, s);
    return _mm512_cvtpd_ps(y);   /* MXCSR's rounding: nearest even, as vcvtsd2ss in glibc */
}
__attribute__((target("avx512f,avx512dq"))) static void vexpf_span_avx512(float* y, const float* x, long n) {
    const __m512i t0 = _mm512_loadu_si512(vexp_T), t1 = _mm512_loadu_si512(vexp_T + 8);
    const __m512i t2 = _mm512_loadu_si512(vexp_T + 16), t3 = _mm512_loadu_si512(vexp_T + 24);
    const __m512i big = _mm512_set1_epi32(0x42a);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __mmask16 special = _mm512_mask_cmpge_epi32_mask(m, _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 20), _mm512_set1_epi32(0x7ff)), big);
        __m256 e0 = vexp8(_mm512_castps512_ps256(v), t0, t1, t2, t3);
        __m256 e1 = vexp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)), t0, t1, t2, t3);
        __m512 e = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(e0)), _mm256_castps_pd(e1), 1));
        if (special) {   /* rare: glibc's special cases, by glibc */
            float xs[16], es[16];
            _mm512_storeu_ps(xs, v);
            _mm512_storeu_ps(es, e);
            for (int j = 0; j < 16; j++)
                if (special >> j & 1) es[j] = expf(xs[j]);
            e = _mm512_loadu_ps(es);
        }
        _mm512_mask_storeu_ps(y + i, m, e);
    }
}
#pragma GCC diagnostic pop
#endif

/* y[i] = expf(x[i]), i < n; y may alias x */
static inline void vexpf_span(float* y, const float* x, long n) {
#if TSDC_VEXP_X86
    if (cpu_avx512dq()) { vexpf_span_avx512(y, x, n); return; }
#endif
    for (long i = 0; i < n; i++) y[i] = expf(x[i]);
}

#endif
