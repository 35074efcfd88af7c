/* gemm.h: the CPU trainer's GEMMs on the machine's SIMD and matrix units, chosen at run time.
 *
 *   C[M,N] (+)= A[M,K] B[K,N];  A element (m,k) at A[m*sam + k*sak] (sam = 1 reads A transposed),
 *   B row-major [K,N] or, in the _x entry points with btr = 1, given transposed as Bt [N,K] (a weight
 *   W [out, in] used as W^T, so the trainer keeps no transposed copy), C row-major [M,N];
 *   accumulate = 0 overwrites C.
 *
 *   gemm_f32   fp32 inputs, fp32 accumulation.
 *   gemm_bf16  bf16 inputs (the -precision bf16 tensors, fp32 arrays that hold bf16 values; a value that
 *              is not one is rounded to nearest even when packed, as the GPU's GEMMs read bf16), fp32
 *              accumulation, the products on the CPU's bf16 units where it has them.
 *   gemm_x     either, with A, or a row-major B, given as bf16 bits (uint16, -precision bf16's storage: widened
 *              exactly as it is packed, so the bits of the fp32 array of the same values) and C stored as bf16
 *              bits (each block rounded as it is finished, after an optional softcap; the classifier's logits),
 *              accumulating onto fp32 partial sums left by earlier products where asked (a dx that is a sum of
 *              products: C holds the fp32 sums and is only read, the bits of the whole sum go to C16).
 *
 * Paths, picked once per process from what CPUID and the OS report (__builtin_cpu_supports; AMX also
 * needs the kernel's permission for the tile state, asked with arch_prctl):
 *   fp32:  avx512      12 x 32 micro-tile, 24 zmm accumulators, VFMADD231PS
 *          avx2        6 x 16 micro-tile, 12 ymm accumulators, VFMADD231PS
 *          portable    gemm_portable (cpu_kernels.h): C loops the compiler vectorises
 *   bf16:  amx         TDPBF16PS on 16 x 16 fp32 tiles, C blocks of 32 x 32 (4 tiles), K steps of 32
 *          avx512bf16  VDPBF16PS, 12 x 32 micro-tile (k in pairs); by default on AMD only (gemm_default_level:
 *                      on Intel CPUs without AMX it runs at half the FMAs' rate)
 *          otherwise   the fp32 path (the values are bf16, the products exact in fp32)
 * TSDC_CPU_GEMM=portable|avx2|avx512|avx512bf16|amx caps the choice at that level (portable < avx2 <
 * avx512 < avx512bf16 < amx; the fp32 product takes the best fp32 path at or below the cap), so a test
 * can run every path the machine has; a level the machine lacks is a one-line error. TSDC_CPU_GEMM=fp32:
 * the best fp32 path for both products (bf16 inputs summed by fp32 FMAs in k order, the numerics the
 * cross-trainer tests compare the GPU emulation with).
 *
 * Blocking (every SIMD path): B is packed once per call into NR-column panels (k-major strips over all of K, each
 * element converted once; a B given transposed is read row by row), zero-padded at the edges (padded rows and
 * columns are computed and dropped). A: the fp32 paths read A stored by rows in place (only a partial last panel
 * is packed, per task and chunk); A read transposed (the dW products) and every bf16 A are packed once into MR-row
 * panels, the transposed ones walking k outermost (fp32: 16 k at a time, each panel then written 16 k contiguous)
 * so that the source rows are read in order; the packing is split over the threads. The avx512, avx512bf16 and
 * amx paths pack with AVX-512 (the bf16 conversion in integer lanes, f32_to_bf16_bits' bits; register transposes
 * where a panel's layout crosses the source's rows; the avx512bf16 path takes an operand given as bf16 bits as it is,
 * quieting a NaN as the rounding would: gm_ldh16q), but for an fp32 A's partial last panel; the scalar packers
 * serve the avx2 path, other strides, and as the reference test_sdc holds the bf16 ones to. Then tasks, blocks of GM_MB
 * rows x GM_NB columns of C (halved to 96 x 64 when there are fewer than 4 a thread) taken by the threads in any
 * order, walk K in equal chunks of at most GM_KC (384; AVX512-BF16 1536, AMX 1024) so that the task's chunk of A and B stays in L2,
 * and run the micro-kernel on every micro-tile for each chunk: accumulators in registers (AMX: tiles), loaded from
 * C (zero at the first chunk unless accumulating) and stored back after it. fp32 partial sums survive the store
 * exactly, so neither the blocks nor the chunks change a bit. round_out rounds each finished tile to bf16 while it
 * is in cache (the trainer's bf16 store of the output, without a pass of its own).
 * Summation order of each element, fixed by K alone (not by M, N, the thread count, the task or the
 * panel an element falls in), so results are bitwise identical run after run and across thread counts:
 *   avx512, avx2: c = fma(a_k, b_k, c) for k = 0, 1, ..., K-1 (one rounding each). gemm_portable under
 *      -march=native contracts its loop to the same FMAs, so on such a build the three agree bit for bit.
 *   avx512bf16: k in pairs p = 0, 1, ..., ceil(K/2)-1 (an odd K padded with a zero), one VDPBF16PS each:
 *      c = (c + a_{2p+1} b_{2p+1}) + a_{2p} b_{2p}, each addition rounded to fp32 (round to nearest even),
 *      bf16 denormal inputs read as zero, denormal results flushed to zero (the instruction's fixed
 *      DAZ/FTZ). dpbf16_ref below is this as scalar C, and the tests hold the kernel to it bit for bit.
 *   amx: K in steps of 32 (zero-padded), one TDPBF16PS each, its 16 pairs summed inside the unit in an
 *      order Intel does not document bit-exactly; fixed for a given CPU. Tested against double by bound.
 * Another path gives other bits: a machine with other units, or TSDC_CPU_GEMM, changes the last bits of
 * every GEMM. Tests that compare runs with each other by hash run them on one machine in one build; tests
 * against the PyTorch references and between the trainers compare by tolerance. */
#ifndef TSDC_CPU_GEMM_H
#define TSDC_CPU_GEMM_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && !defined(__CUDACC__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TSDC_GEMM_X86 1
#else
#define TSDC_GEMM_X86 0
#endif
#include "bf16.h"
#ifdef _OPENMP
#include <omp.h>
#endif

enum { GEMM_PORTABLE = 0, GEMM_AVX2 = 1, GEMM_AVX512 = 2, GEMM_AVX512BF16 = 3, GEMM_AMX = 4 };
static const char* const gemm_path_names[] = {"portable", "avx2", "avx512", "avx512bf16", "amx"};

/* the largest block of C a task computes (multiples of every micro-tile below: 12 x 32, 6 x 16, 32 x 32);
 * gemm_blocked halves them down to 96 x 64 when a GEMM has fewer than 4 blocks a thread */
#define GM_MB 192
#define GM_NB 256
/* the largest chunk of K a task walks with its accumulators in registers: fp32 384 (1.5 KB of a row), AVX512-BF16
 * 1536 (3 KB: on a Zen 5 core, 1 MB of L2, the VDPBF16PS products of the wide row ran 12% faster at two threads than
 * with 384 and at one thread the same within the noise, most gained on the classifier's, which then walks its K of
 * 576 in one chunk: docs/speed.md), AMX 1024 */
#define GM_KC 384
#define GM_KC_BF16 1536

/* element i of an A operand: fp32, or (ah = 1) bf16 bits, the -precision bf16 storage, widened exactly */
static inline float gm_lda(const void* A, size_t i, int ah) { return ah ? bf16_bits_to_f32(((const uint16_t*)A)[i]) : ((const float*)A)[i]; }

/* one rounding of fp32 like VDPBF16PS: denormal results flushed to zero (sign kept) */
static inline float gemm_ftz(float x) {
    uint32_t u = f32_bits(x);
    return (u & 0x7f800000u) == 0 ? bits_f32(u & 0x80000000u) : x;
}
/* a bf16 input as VDPBF16PS reads it: denormals as zero */
static inline float gemm_daz(uint16_t h) { return (h & 0x7f80u) == 0 ? bits_f32((uint32_t)(h & 0x8000u) << 16) : bf16_bits_to_f32(h); }
/* scalar model of one VDPBF16PS lane: c + a1 b1 (rounded, FTZ), then + a0 b0 (rounded, FTZ). The bf16
 * products are exact in fp32 (8 x 8 significant bits); volatile keeps the compiler from fusing. */
static inline float dpbf16_ref(float c, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1) {
    volatile float p1 = gemm_daz(a1) * gemm_daz(b1), p0 = gemm_daz(a0) * gemm_daz(b0);
    volatile float t = gemm_ftz(c + p1);
    return gemm_ftz(t + p0);
}

#if TSDC_GEMM_X86
/* the mask of the first n of 16 lanes (n <= 0: none) */
static inline __mmask16 gm_mask(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }
/* --------------------------------------------------------------------------- packing (fp32) */
/* elements i .. i + n - 1 of an A operand (n <= 0: none; at most 16), zero past n, as 16 fp32: a masked load, or
 * (ah) 16 bf16 bits widened exactly (AVX-512F only: a partial tail goes through a zeroed copy) */
__attribute__((target("avx512f"))) static inline __m512 gm_lda16(const void* A, size_t i, int n, int ah) {
    if (!ah) return _mm512_maskz_loadu_ps(gm_mask(n), (const float*)A + i);
    const uint16_t* src = (const uint16_t*)A + i;
    __m256i v;
    if (n >= 16) v = _mm256_loadu_si256((const __m256i*)src);
    else {
        uint16_t t[16] = {0};
        for (int j = 0; j < n; j++) t[j] = src[j];
        v = _mm256_loadu_si256((const __m256i*)t);
    }
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
/* panels p0..p1-1 (12 rows each) of A read transposed (element (m, k) at A[m + k * sak]), k outermost: the
 * source rows are read in order; masked zmm moves of 12 floats */
__attribute__((target("avx512f"))) static void gm_pack_at_avx512(float* ap, const void* A, int ah, long sak, int M, int K, int p0, int p1, size_t pa) {
    /* 16 source rows at a time (in L2), then panel by panel: each panel gets 16 x 12 contiguous floats, where one k
     * for every panel wrote 48 bytes into each of hundreds of 48 KB-apart places (the classifier's dW: 683 panels) */
    for (int k0 = 0; k0 < K; k0 += 16) {
        int k1 = K < k0 + 16 ? K : k0 + 16;
        for (int p = p0; p < p1; p++) {
            int w = M - p * 12 < 12 ? M - p * 12 : 12;
            for (int k = k0; k < k1; k++)
                _mm512_mask_storeu_ps(ap + (size_t)p * pa + (size_t)k * 12, 0x0fff, gm_lda16(A, (size_t)k * sak + (size_t)p * 12, w, ah));
        }
    }
}
/* rows m0..m0+mr-1, k0..k0+kc-1 of A into panels of MR rows: ap[panel][k][MR], zero rows past mr */
static void gm_pack_a_f32(float* ap, const void* A, int ah, long sam, long sak, int m0, int mr, int k0, int kc, int MR) {
    int np = (mr + MR - 1) / MR;
    for (int p = 0; p < np; p++) {
        float* dst = ap + (size_t)p * kc * MR;
        int w = mr - p * MR < MR ? mr - p * MR : MR;   /* (A read transposed goes through gm_pack_at_*) */
        for (int r = 0; r < MR; r++) {
            if (r < w) {
                const size_t src = (size_t)(m0 + p * MR + r) * sam + (size_t)k0 * sak;
                for (int k = 0; k < kc; k++) dst[(size_t)k * MR + r] = gm_lda(A, src + (size_t)k * sak, ah);
            } else
                for (int k = 0; k < kc; k++) dst[(size_t)k * MR + r] = 0.0f;
        }
    }
}
/* columns n0..n0+nr-1, rows k0..k0+kc-1 of B into panels of NR columns: bp[panel][k][NR] */
static void gm_pack_b_f32(float* bp, const void* B, int bh, int N, int n0, int nr, int k0, int kc, int NR) {
    int np = (nr + NR - 1) / NR;
    for (int p = 0; p < np; p++) {
        float* dst = bp + (size_t)p * kc * NR;
        int w = nr - p * NR < NR ? nr - p * NR : NR;
        for (int k = 0; k < kc; k++) {
            const size_t src = (size_t)(k0 + k) * N + n0 + p * NR;
            if (!bh) memcpy(dst + (size_t)k * NR, (const float*)B + src, sizeof(float) * w);
            else bf16_unpack_span(dst + (size_t)k * NR, (const uint16_t*)B + src, w);
            if (w < NR) memset(dst + (size_t)k * NR + w, 0, sizeof(float) * (NR - w));
        }
    }
}

/* ---------------------------------------------------------------------- micro-kernels (fp32) */
/* c[MR x NR] (ldc) = (zero ? 0 : c) + A B over kc, k in order, one FMA per k. A element (r, k) at
 * a[r * ars + k * aks]: a packed panel (ars 1, aks MR), or A itself, in place: rows (ars = sam, aks 1)
 * or read transposed (ars 1, aks = sak); the wrappers below fix one stride so the compiler folds it. */
__attribute__((target("avx512f"), always_inline)) static inline void gm_mk_avx512_body(int kc, const float* a, long ars, long aks,
                                                                                    const float* bp, float* c, long ldc, int zero) {
    __m512 acc[12][2];
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) {
        acc[r][0] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc);
        acc[r][1] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16);
    }
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp + (size_t)k * 32), b1 = _mm512_loadu_ps(bp + (size_t)k * 32 + 16);
        const float* ak = a + (size_t)k * aks;
#pragma GCC unroll 12
        for (int r = 0; r < 12; r++) {
            __m512 x = _mm512_set1_ps(ak[r * ars]);
            acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) { _mm512_storeu_ps(c + r * ldc, acc[r][0]); _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]); }
}
__attribute__((target("avx512f"))) static void gm_mk_avx512_kmajor(int kc, const float* a, long aks, const float* bp, float* c, long ldc, int zero) {
    gm_mk_avx512_body(kc, a, 1, aks, bp, c, ldc, zero);
}
__attribute__((target("avx512f"))) static void gm_mk_avx512_rows(int kc, const float* a, long ars, const float* bp, float* c, long ldc, int zero) {
    gm_mk_avx512_body(kc, a, ars, 1, bp, c, ldc, zero);
}
__attribute__((target("avx2,fma"), always_inline)) static inline void gm_mk_avx2_body(int kc, const float* a, long ars, long aks,
                                                                                   const float* bp, float* c, long ldc, int zero) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
        acc[r][0] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc);
        acc[r][1] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc + 8);
    }
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp + (size_t)k * 16), b1 = _mm256_loadu_ps(bp + (size_t)k * 16 + 8);
        const float* ak = a + (size_t)k * aks;
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            __m256 x = _mm256_broadcast_ss(ak + r * ars);
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) { _mm256_storeu_ps(c + r * ldc, acc[r][0]); _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]); }
}
__attribute__((target("avx2,fma"))) static void gm_mk_avx2_kmajor(int kc, const float* a, long aks, const float* bp, float* c, long ldc, int zero) {
    gm_mk_avx2_body(kc, a, 1, aks, bp, c, ldc, zero);
}
__attribute__((target("avx2,fma"))) static void gm_mk_avx2_rows(int kc, const float* a, long ars, const float* bp, float* c, long ldc, int zero) {
    gm_mk_avx2_body(kc, a, ars, 1, bp, c, ldc, zero);
}

/* ------------------------------------------------------------------------ packing (bf16 pairs) */
/* Scalar: A with neither stride 1, the portable reference of the vectorised packers below (gm_pack_*_bf16_*), which
 * the VDPBF16PS path takes; test_sdc holds them equal byte for byte. */
static inline uint16_t gm_bf(float x) { return f32_to_bf16_bits(x); }
/* A panels of MR rows, k in pairs: ap[panel][kp][MR][2] (uint16), zero past mr and past kc */
static void gm_pack_a_bf16(uint16_t* ap, const void* A, int ah, long sam, long sak, int m0, int mr, int k0, int kc, int MR) {
    int np = (mr + MR - 1) / MR, kp = (kc + 1) / 2;
    for (int p = 0; p < np; p++) {
        uint16_t* dst = ap + (size_t)p * kp * MR * 2;
        for (int r = 0; r < MR; r++) {
            int m = p * MR + r;
            const size_t src = (size_t)(m0 + m) * sam + (size_t)k0 * sak;
            for (int k = 0; k < 2 * kp; k++)
                dst[((size_t)(k >> 1) * MR + r) * 2 + (k & 1)] = (m < mr && k < kc) ? gm_bf(gm_lda(A, src + (size_t)k * sak, ah)) : 0;
        }
    }
}
/* B panels of NR columns, k in pairs: bp[panel][kp][NR][2] */
static void gm_pack_b_bf16(uint16_t* bp, const float* B, int N, int n0, int nr, int k0, int kc, int NR) {
    int np = (nr + NR - 1) / NR, kp = (kc + 1) / 2;
    for (int p = 0; p < np; p++) {
        uint16_t* dst = bp + (size_t)p * kp * NR * 2;
        int w = nr - p * NR < NR ? nr - p * NR : NR;
        for (int q = 0; q < kp; q++)
            for (int h = 0; h < 2; h++) {
                int k = 2 * q + h;
                const float* src = B + (size_t)(k0 + k) * N + n0 + p * NR;
                uint16_t* d = dst + (size_t)q * NR * 2 + h;
                for (int j = 0; j < NR; j++) d[2 * j] = (k < kc && j < w) ? gm_bf(src[j]) : 0;
            }
    }
}
__attribute__((target("avx512f,avx512bf16"))) static void gm_mk_avx512bf16(int kc, const uint16_t* ap, const uint16_t* bp, float* c, long ldc, int zero) {
    __m512 acc[12][2];
    int kp = (kc + 1) / 2;
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) {
        acc[r][0] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc);
        acc[r][1] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16);
    }
    for (int q = 0; q < kp; q++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + (size_t)q * 64), b1 = (__m512bh)_mm512_loadu_si512(bp + (size_t)q * 64 + 32);
        const uint32_t* a = (const uint32_t*)(ap + (size_t)q * 24);
#pragma GCC unroll 12
        for (int r = 0; r < 12; r++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) { _mm512_storeu_ps(c + r * ldc, acc[r][0]); _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]); }
}

/* ------------------------------------------------------------------------------ AMX (bf16) */
/* tiles: 0..3 the C block (2 x 2 tiles of 16 x 16 fp32), 4, 5 two A tiles (16 rows x 32 bf16), 6, 7 two
 * B tiles (16 k pairs x 16 columns x 2 bf16). A is packed [tile row block][k step][16][32], B
 * [tile column block][k step][16 pairs][16][2]: each tile is 1 KiB contiguous, loaded with stride 64. */
typedef struct { uint8_t palette, start_row, rsvd[14]; uint16_t colsb[16]; uint8_t rows[16]; } GmTileCfg;
__attribute__((target("amx-tile"))) static void gm_amx_config(void) {
    GmTileCfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    /* the compiler does not see LDTILECFG read all 64 bytes (gcc 12 drops the row and column stores without this) */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}
__attribute__((target("amx-tile"))) static void gm_amx_release(void) { _tile_release(); }
/* packed A of MR = 16 rows for k steps of 32: ap[panel][ks][16][32] */
static void gm_pack_a_amx(uint16_t* ap, const void* A, int ah, long sam, long sak, int m0, int mr, int k0, int kc) {
    int np = (mr + 15) / 16, ks = (kc + 31) / 32;
    for (int p = 0; p < np; p++)
        for (int r = 0; r < 16; r++) {
            int m = p * 16 + r;
            const size_t src = (size_t)(m0 + m) * sam + (size_t)k0 * sak;
            for (int k = 0; k < ks * 32; k++)
                ap[(((size_t)p * ks + (k >> 5)) * 16 + r) * 32 + (k & 31)] = (m < mr && k < kc) ? gm_bf(gm_lda(A, src + (size_t)k * sak, ah)) : 0;
        }
}
/* packed B of NR = 16 columns: bp[panel][ks][16 pairs][16][2] */
static void gm_pack_b_amx(uint16_t* bp, const float* B, int N, int n0, int nr, int k0, int kc) {
    int np = (nr + 15) / 16, ks = (kc + 31) / 32;
    for (int p = 0; p < np; p++) {
        int w = nr - p * 16 < 16 ? nr - p * 16 : 16;
        for (int k = 0; k < ks * 32; k++) {
            const float* src = B + (size_t)(k0 + k) * N + n0 + p * 16;
            uint16_t* d = bp + (((size_t)p * ks + (k >> 5)) * 16 + ((k & 31) >> 1)) * 32 + (k & 1);
            for (int j = 0; j < 16; j++) d[2 * j] = (k < kc && j < w) ? gm_bf(src[j]) : 0;
        }
    }
}
/* the C block at c (2 x 2 tiles, ldc floats; a partial block goes through a 32 x 32 buffer first) */
__attribute__((target("amx-tile,amx-bf16"))) static void gm_mk_amx(int ks, const uint16_t* a0, const uint16_t* a1,
                                                                  const uint16_t* b0, const uint16_t* b1, float* c, long ldc, int zero) {
    long st = ldc * 4;
    if (zero) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    else {
        _tile_loadd(0, c, st); _tile_loadd(1, c + 16, st);
        _tile_loadd(2, c + 16 * ldc, st); _tile_loadd(3, c + 16 * ldc + 16, st);
    }
    for (int s = 0; s < ks; s++) {
        _tile_loadd(4, a0 + (size_t)s * 512, 64);
        _tile_loadd(5, a1 + (size_t)s * 512, 64);
        _tile_loadd(6, b0 + (size_t)s * 512, 64);
        _tile_loadd(7, b1 + (size_t)s * 512, 64);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, st); _tile_stored(1, c + 16, st);
    _tile_stored(2, c + 16 * ldc, st); _tile_stored(3, c + 16 * ldc + 16, st);
}
#endif /* TSDC_GEMM_X86 */

/* ------------------------------------------------------------------------------ path selection */
static int gemm_amx_permitted(void) {
#if TSDC_GEMM_X86 && defined(SYS_arch_prctl)
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): Linux >= 5.16 hands out the tile state on request */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}
/* what the CPU (and OS) offers: the highest level */
static int gemm_machine_level(void) {
    static int level = -1;
    if (level >= 0) return level;
    level = GEMM_PORTABLE;
#if TSDC_GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = GEMM_AVX2;
    if (__builtin_cpu_supports("avx512f")) level = GEMM_AVX512;
    if (level == GEMM_AVX512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        level = GEMM_AVX512BF16;   /* its packers use BW's and VL's 16-bit lanes (every CPU with AVX512-BF16 has both) */
    if (level == GEMM_AVX512BF16 && __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile") && gemm_amx_permitted())
        level = GEMM_AMX;
#endif
    return level;
}
/* the default level: the machine's, except that VDPBF16PS is used by default only on AMD CPUs. On Intel CPUs that
 * report AVX512-BF16 without AMX (Cooper Lake; Sapphire / Emerald Rapids whose tile state a hypervisor or the OS
 * withholds) it was measured at half the rate of the fp32 FMAs (./bench_gemm prints both peaks: 83-88 against
 * 175 GFLOP/s on one core of this project's Xeon), so there the bf16 products run on the fp32 FMA path (bf16
 * inputs, exact products, fp32 accumulation in k order: the same numerics class, twice as fast). A fixed rule
 * from CPUID, not a timing taken at start-up, so that the path and with it the bits never change between runs
 * on one machine. TSDC_CPU_GEMM=avx512bf16 still selects it (the tests run every path the CPU has). */
static int gemm_default_level(int lv) {
#if TSDC_GEMM_X86
    if (lv == GEMM_AVX512BF16 && !__builtin_cpu_is("amd")) return GEMM_AVX512;
#endif
    return lv;
}
/* the level in use: the default above, or the cap TSDC_CPU_GEMM names (read once; gemm_set_level overrides, for
 * tests) */
static int gemm_level_cached = -1;
static int gemm_parse_level(const char* s) {
    for (int i = 0; i <= GEMM_AMX; i++) if (!strcmp(s, gemm_path_names[i])) return i;
    return -1;
}
static int gemm_level(void) {
    if (gemm_level_cached >= 0) return gemm_level_cached;
    int lv = gemm_machine_level();
    const char* env = getenv("TSDC_CPU_GEMM");
    if (env && *env) {
        /* fp32: the best fp32 path, the bf16 products too (the cross-trainer tests: the GPU emulation's GEMMs sum
         * k in order in fp32, as these paths do) */
        int want = !strcmp(env, "fp32") ? (lv < GEMM_AVX512 ? lv : GEMM_AVX512) : gemm_parse_level(env);
        if (want < 0) { fprintf(stderr, "error: TSDC_CPU_GEMM=%s: expected portable, avx2, avx512, avx512bf16, amx or fp32\n", env); exit(2); }
        if (want > lv) { fprintf(stderr, "error: TSDC_CPU_GEMM=%s: this CPU offers at most %s\n", env, gemm_path_names[lv]); exit(2); }
        lv = want;
    } else
        lv = gemm_default_level(lv);
    gemm_level_cached = lv;
    return lv;
}
/* 0 on success; -1 when the machine lacks that level */
static int gemm_set_level(int lv) {
    if (lv < 0 || lv > gemm_machine_level()) return -1;
    gemm_level_cached = lv;
    return 0;
}
static const char* gemm_f32_path(void) { int lv = gemm_level(); return gemm_path_names[lv > GEMM_AVX512 ? GEMM_AVX512 : lv]; }
static const char* gemm_bf16_path(void) { int lv = gemm_level(); return lv >= GEMM_AVX512BF16 ? gemm_path_names[lv] : gemm_f32_path(); }

static void gemm_portable(float* C, const float* A, long sam, long sak, const float* B, int M, int K, int N, int accumulate);

#if TSDC_GEMM_X86
/* vectorised AMX packers (AVX512-BF16 conversion, round to nearest even, exact for bf16 values) */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline __m512i gm_pair16(__m512 lo, __m512 hi) {
    /* [lo_j, hi_j] pairs of bf16 for j = 0..15: cvtne2ps puts lo in elements 0..15 and hi in 16..31 */
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}
/* a 16 x 16 dword transpose in registers: out[c][r] = in[r][c]. Within each 128-bit lane L, 32- then 64-bit unpacks
 * give x[4g + e] lane L = rows 4g..4g+3 at column 4L + e; two rounds of 128-bit lane shuffles then gather lane L of
 * x[e], x[4 + e], x[8 + e], x[12 + e] into column 4L + e */
__attribute__((target("avx512f"))) static inline void gm_transpose16(__m512i out[16], const __m512i in[16]) {
    __m512i t[16], x[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {
        x[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        x[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        x[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        x[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int e = 0; e < 4; e++) {
        __m512i a = _mm512_shuffle_i32x4(x[e], x[4 + e], 0x88), b = _mm512_shuffle_i32x4(x[e], x[4 + e], 0xdd);
        __m512i c = _mm512_shuffle_i32x4(x[8 + e], x[12 + e], 0x88), d = _mm512_shuffle_i32x4(x[8 + e], x[12 + e], 0xdd);
        out[e] = _mm512_shuffle_i32x4(a, c, 0x88);
        out[8 + e] = _mm512_shuffle_i32x4(a, c, 0xdd);
        out[4 + e] = _mm512_shuffle_i32x4(b, d, 0x88);
        out[12 + e] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
}
/* A tiles of 16 rows (panel p): [ks][16][32] */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void gm_pack_a_amx_vec(uint16_t* ap, const void* A, int ah, long sam, long sak, int M, int K, int p) {
    int ks = (K + 31) / 32, m0 = p * 16;
    uint16_t* dst = ap + (size_t)p * ks * 512;
    if (sak == 1) {
        for (int r = 0; r < 16; r++) {
            int m = m0 + r;
            for (int s = 0; s < ks; s++) {
                __m512i v = _mm512_setzero_si512();
                if (m < M) {
                    const size_t src = (size_t)m * sam + (size_t)s * 32;
                    __m512 lo = gm_lda16(A, src, K - s * 32, ah), hi = gm_lda16(A, src + 16, K - s * 32 - 16, ah);
                    v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
                }
                _mm512_storeu_si512(dst + ((size_t)s * 16 + r) * 32, v);
            }
        }
    } else if (sam == 1) {
        /* k-major source: pairs of rows k, k+1 give 16 dwords (one per m), a column of the tile; transposed */
        for (int s = 0; s < ks; s++) {
            __m512i t[16], u[16];
            for (int q = 0; q < 16; q++) {
                int k = s * 32 + 2 * q;
                __m512 v0 = k < K ? gm_lda16(A, m0 + (size_t)k * sak, M - m0, ah) : _mm512_setzero_ps();
                __m512 v1 = k + 1 < K ? gm_lda16(A, m0 + (size_t)(k + 1) * sak, M - m0, ah) : _mm512_setzero_ps();
                t[q] = gm_pair16(v0, v1);
            }
            gm_transpose16(u, t);
            for (int r = 0; r < 16; r++) _mm512_storeu_si512(dst + (size_t)s * 512 + (size_t)r * 32, u[r]);
        }
    } else
        gm_pack_a_amx(dst, A, ah, sam, sak, m0, M - m0 < 16 ? M - m0 : 16, 0, K);
}
/* A tiles of panels p0..p1-1 from A read transposed (element (m, k) at A[m + k * sak]): for each k step and panel,
 * the 16 row pairs (k, k+1) of its 16 rows m give one dword a row, column q of the tile; the 16 columns are
 * transposed in registers into the tile's rows (the k steps' 32 source rows stay in cache across the panels) */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void gm_pack_at_amx(uint16_t* ap, const void* A, int ah, long sak, int M, int K, int p0, int p1) {
    int ks = (K + 31) / 32;
    for (int s = 0; s < ks; s++)
        for (int p = p0; p < p1; p++) {
            __m512i col[16], row[16];
            for (int q = 0; q < 16; q++) {
                int k = s * 32 + 2 * q;
                __m512 v0 = k < K ? gm_lda16(A, (size_t)k * sak + (size_t)p * 16, M - p * 16, ah) : _mm512_setzero_ps();
                __m512 v1 = k + 1 < K ? gm_lda16(A, (size_t)(k + 1) * sak + (size_t)p * 16, M - p * 16, ah) : _mm512_setzero_ps();
                col[q] = gm_pair16(v0, v1);
            }
            gm_transpose16(row, col);
            uint16_t* tile = ap + ((size_t)p * ks + s) * 512;
            for (int r = 0; r < 16; r++) _mm512_storeu_si512(tile + (size_t)r * 32, row[r]);
        }
}
/* B tiles of 16 columns: [panel][ks][16 pairs][16][2], for panels p0..p1-1, row pairs (k, k+1) outermost: the source
 * rows are read in order, each pair's segment of the panels contiguous (a panel at a time would walk all K rows for
 * 64 bytes each) */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void gm_pack_b_amx_rows(uint16_t* bp, const void* B, int bh, int N, int K, int p0, int p1) {
    int ks = (K + 31) / 32;
    for (int s = 0; s < ks; s++)
        for (int q = 0; q < 16; q++) {
            int k = s * 32 + 2 * q;
            for (int p = p0; p < p1; p++) {
                __m512 v0 = k < K ? gm_lda16(B, (size_t)k * N + (size_t)p * 16, N - p * 16, bh) : _mm512_setzero_ps();
                __m512 v1 = k + 1 < K ? gm_lda16(B, (size_t)(k + 1) * N + (size_t)p * 16, N - p * 16, bh) : _mm512_setzero_ps();
                _mm512_storeu_si512(bp + (((size_t)p * ks + s) * 16 + q) * 32, gm_pair16(v0, v1));
            }
        }
}

/* B given transposed: element (k, n) at Bt[n * K + k] (a weight W [out, in] read as W^T). The same panel
 * layouts as above; each source row (one column n of B) is read contiguously. */
static void gm_pack_bt_f32(float* bp, const float* Bt, int K, int n0, int nr, int NR) {
    int np = (nr + NR - 1) / NR;
    for (int p = 0; p < np; p++) {
        float* dst = bp + (size_t)p * K * NR;
        for (int j = 0; j < NR; j++) {
            int n = p * NR + j;
            if (n < nr) {
                const float* src = Bt + (size_t)(n0 + n) * K;
                for (int k = 0; k < K; k++) dst[(size_t)k * NR + j] = src[k];
            } else
                for (int k = 0; k < K; k++) dst[(size_t)k * NR + j] = 0.0f;
        }
    }
}
static void gm_pack_bt_bf16(uint16_t* bp, const float* Bt, int K, int n0, int nr, int NR) {
    int np = (nr + NR - 1) / NR, kp = (K + 1) / 2;
    for (int p = 0; p < np; p++) {
        uint16_t* dst = bp + (size_t)p * kp * NR * 2;
        for (int j = 0; j < NR; j++) {
            int n = p * NR + j;
            const float* src = Bt + (size_t)(n0 + n) * K;
            for (int k = 0; k < 2 * kp; k++) dst[((size_t)(k >> 1) * NR + j) * 2 + (k & 1)] = (n < nr && k < K) ? gm_bf(src[k]) : 0;
        }
    }
}
/* AMX B tiles from Bt: one source row gives the 16 pairs of one tile column; a 16 x 16 dword transpose */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void gm_pack_bt_amx_vec(uint16_t* bp, const float* Bt, int N, int K, int p) {
    int ks = (K + 31) / 32, n0 = p * 16;
    uint16_t* dst = bp + (size_t)p * ks * 512;
    for (int s = 0; s < ks; s++) {
        __m512i t[16], u[16];
        for (int j = 0; j < 16; j++) {
            __m512i v = _mm512_setzero_si512();
            if (n0 + j < N) {
                const float* src = Bt + (size_t)(n0 + j) * K + (size_t)s * 32;
                __m512 lo = _mm512_maskz_loadu_ps(gm_mask(K - s * 32), src), hi = _mm512_maskz_loadu_ps(gm_mask(K - s * 32 - 16), src + 16);
                v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);   /* k order: dword q = (k 2q, k 2q+1) */
            }
            t[j] = v;
        }
        gm_transpose16(u, t);   /* row q of the tile: dword j = column n0 + j's pair q */
        for (int q = 0; q < 16; q++) _mm512_storeu_si512(dst + (size_t)s * 512 + (size_t)q * 32, u[q]);
    }
}

/* fp32 B panels of 32 columns from Bt [N, K] (a weight read as W^T): 16 x 16 blocks transposed in registers, each
 * source row read 64 bytes at a time in order (the scalar gm_pack_bt_f32 wrote one float every 128 bytes) */
__attribute__((target("avx512f"))) static void gm_pack_bt_f32_avx512(float* bp, const float* Bt, int N, int K, int p) {
    float* dst = bp + (size_t)p * K * 32;
    for (int h = 0; h < 2; h++) {
        int n0 = p * 32 + h * 16;
        for (int k0 = 0; k0 < K; k0 += 16) {
            __m512i t[16], u[16];
            __mmask16 mk = gm_mask(K - k0);
            for (int j = 0; j < 16; j++)
                t[j] = n0 + j < N ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mk, Bt + (size_t)(n0 + j) * K + k0)) : _mm512_setzero_si512();
            gm_transpose16(u, t);   /* u[kk]: column k0 + kk of the 16 rows, i.e. B row k0 + kk at columns n0.. */
            int kn = K - k0 < 16 ? K - k0 : 16;
            for (int kk = 0; kk < kn; kk++) _mm512_storeu_si512(dst + (size_t)(k0 + kk) * 32 + h * 16, u[kk]);
        }
    }
}

/* fp32 B panel p (32 columns) from row-major B [K, N]: two masked zmm moves a row (a memcpy call a row cost 2% of a
 * wide step) */
__attribute__((target("avx512f"))) static void gm_pack_b_f32_avx512(float* bp, const void* B, int bh, int N, int K, int p) {
    float* dst = bp + (size_t)p * K * 32;
    int n0 = p * 32;
    for (int k = 0; k < K; k++) {
        const size_t src = (size_t)k * N + n0;
        _mm512_storeu_ps(dst + (size_t)k * 32, gm_lda16(B, src, N - n0, bh));
        _mm512_storeu_ps(dst + (size_t)k * 32 + 16, gm_lda16(B, src + 16, N - n0 - 16, bh));
    }
}

/* ------------------------------------------------------ vectorised packers of the VDPBF16PS path (kind 2) */
/* Byte for byte the scalar packers' output (gm_pack_a_bf16, gm_pack_b_bf16, gm_pack_bt_bf16; test_sdc holds them
 * equal on edge shapes and on NaN, infinities, denormals and values that are not bf16): the conversion is
 * f32_to_bf16_bits in integer lanes (round to nearest even, NaN quieted), not VCVTNE2PS2BF16, whose handling of
 * fp32 denormals is not f32_to_bf16_bits'. */
/* 16 fp32 -> their bf16 bits in the low half of each dword */
__attribute__((target("avx512f"))) static inline __m512i gm_bf16_lo16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}
/* 16 dwords (bf16(v0_j), bf16(v1_j)): the k pair (k, k + 1) of 16 rows or columns j, k in the low half */
__attribute__((target("avx512f"))) static inline __m512i gm_bf16_pairs(__m512 v0, __m512 v1) {
    return _mm512_or_si512(gm_bf16_lo16(v0), _mm512_slli_epi32(gm_bf16_lo16(v1), 16));
}
/* An operand already stored as bf16 bits needs no rounding: its values are bf16 values, which round to themselves,
 * but for a NaN, which the rounding quiets (gm_bf16_lo16: the quiet bit 0x40 set). The forms below load the bits as
 * they are and set that bit where a lane holds a NaN: the bytes gm_bf16_lo16 makes from the widened value, without
 * the widening and the rounding's arithmetic. AVX512BW and VL for the 16-bit lanes (every CPU with AVX512-BF16 has
 * them; gemm_machine_level asks for both). */
/* 16 bf16 bits i .. i + n - 1 of X (n <= 0: none), zero past n, NaNs quieted */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m256i gm_ldh16q(const void* X, size_t i, int n) {
    const __m256i v = _mm256_maskz_loadu_epi16(gm_mask(n), (const uint16_t*)X + i);
    const __mmask16 nan = _mm256_cmpgt_epu16_mask(_mm256_and_si256(v, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7f80));
    return _mm256_mask_mov_epi16(v, nan, _mm256_or_si256(v, _mm256_set1_epi16(0x40)));
}
/* 16 dwords (a_j, b_j) from two rows of 16 bf16 bits each (a in the low half): gm_bf16_pairs of their values */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512i gm_bf16h_pairs(__m256i a, __m256i b) {
    return _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}
/* 32 consecutive k of one source row (elements i .. i + n - 1 of X, fp32 or (ah) bf16 bits; zero past n) -> 16
 * dwords, the pairs in k order (bf16 bits: their own layout, loaded as they are) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512i gm_bf16_row_pairs(const void* X, size_t i, int n, int ah) {
    if (ah) {
        const __mmask32 m = n >= 32 ? 0xffffffffu : n <= 0 ? 0u : (__mmask32)((1u << n) - 1);
        const __m512i v = _mm512_maskz_loadu_epi16(m, (const uint16_t*)X + i);
        const __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(v, _mm512_set1_epi16(0x7fff)), _mm512_set1_epi16(0x7f80));
        return _mm512_mask_mov_epi16(v, nan, _mm512_or_si512(v, _mm512_set1_epi16(0x40)));
    }
    const __m256i lo = _mm512_cvtepi32_epi16(gm_bf16_lo16(gm_lda16(X, i, n, ah)));
    const __m256i hi = _mm512_cvtepi32_epi16(gm_bf16_lo16(gm_lda16(X, i + 16, n - 16, ah)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
/* B panels [panel][kp][32][2] from row-major B [K, N], panels p0..p1-1, row pairs outermost (the rows read in order) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void gm_pack_b_bf16_rows(uint16_t* bp, const void* B, int bh, int N, int K,
                                                                                 int p0, int p1) {
    const int kp = (K + 1) / 2;
    for (int q = 0; q < kp; q++) {
        const size_t r0 = (size_t)(2 * q) * N, r1 = (size_t)(2 * q + 1) * N;
        const int has1 = 2 * q + 1 < K;
        for (int p = p0; p < p1; p++) {
            uint32_t* d = (uint32_t*)(bp + (size_t)p * kp * 64) + (size_t)q * 32;
            for (int h = 0; h < 2; h++) {
                const int n0 = p * 32 + h * 16;
                if (bh) {   /* the bits as they are (gm_ldh16q) */
                    const __m256i b0 = gm_ldh16q(B, r0 + n0, N - n0), b1 = has1 ? gm_ldh16q(B, r1 + n0, N - n0) : _mm256_setzero_si256();
                    _mm512_storeu_si512(d + h * 16, gm_bf16h_pairs(b0, b1));
                    continue;
                }
                const __m512 v0 = gm_lda16(B, r0 + n0, N - n0, bh), v1 = has1 ? gm_lda16(B, r1 + n0, N - n0, bh) : _mm512_setzero_ps();
                _mm512_storeu_si512(d + h * 16, gm_bf16_pairs(v0, v1));
            }
        }
    }
}
/* B panel p [kp][32][2] from Bt [N, K] (a weight read as W^T): per 16 columns and 16 pairs, each source row's 32 k
 * give one dword a pair; a 16 x 16 dword transpose turns the columns' dwords into the panel's rows */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void gm_pack_bt_bf16_vec(uint16_t* bp, const float* Bt, int N, int K, int p) {
    const int kp = (K + 1) / 2;
    uint32_t* dst = (uint32_t*)(bp + (size_t)p * kp * 64);
    for (int h = 0; h < 2; h++) {
        const int n0 = p * 32 + h * 16;
        for (int s = 0; 16 * s < kp; s++) {
            __m512i t[16], u[16];
            for (int j = 0; j < 16; j++)
                t[j] = n0 + j < N ? gm_bf16_row_pairs(Bt, (size_t)(n0 + j) * K + (size_t)s * 32, K - s * 32, 0) : _mm512_setzero_si512();
            gm_transpose16(u, t);   /* u[q]: dword j = column n0 + j's pair 16 s + q */
            const int qn = kp - 16 * s < 16 ? kp - 16 * s : 16;
            for (int q = 0; q < qn; q++) _mm512_storeu_si512(dst + (size_t)(16 * s + q) * 32 + h * 16, u[q]);
        }
    }
}
/* A panel p [kp][12][2] from A stored by rows (element (m, k) at A[m * sam + k]): as above, 12 rows of the 16 */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void gm_pack_a_bf16_rows(uint16_t* ap, const void* A, int ah, long sam, int M, int K, int p) {
    const int kp = (K + 1) / 2, m0 = p * 12;
    uint32_t* dst = (uint32_t*)(ap + (size_t)p * kp * 24);
    for (int s = 0; 16 * s < kp; s++) {
        __m512i t[16], u[16];
        for (int r = 0; r < 16; r++)
            t[r] = r < 12 && m0 + r < M ? gm_bf16_row_pairs(A, (size_t)(m0 + r) * sam + (size_t)s * 32, K - s * 32, ah) : _mm512_setzero_si512();
        gm_transpose16(u, t);   /* u[q]: dword r = row m0 + r's pair 16 s + q */
        const int qn = kp - 16 * s < 16 ? kp - 16 * s : 16;
        for (int q = 0; q < qn; q++) _mm512_mask_storeu_epi32(dst + (size_t)(16 * s + q) * 12, 0x0fff, u[q]);
    }
}
/* A panels p0..p1-1 [kp][12][2] from A read transposed (element (m, k) at A[m + k * sak]): a pair of source rows gives
 * the 12 dwords of a panel's pair directly; pairs outermost, so the source rows are read in order */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void gm_pack_at_bf16(uint16_t* ap, const void* A, int ah, long sak, int M, int K,
                                                                             int p0, int p1) {
    const int kp = (K + 1) / 2;
    for (int q = 0; q < kp; q++) {
        const size_t r0 = (size_t)(2 * q) * sak, r1 = (size_t)(2 * q + 1) * sak;
        const int has1 = 2 * q + 1 < K;
        for (int p = p0; p < p1; p++) {
            const int w = M - p * 12 < 12 ? M - p * 12 : 12;
            if (ah) {   /* the bits as they are (gm_ldh16q) */
                const __m256i a0 = gm_ldh16q(A, r0 + (size_t)p * 12, w), a1 = has1 ? gm_ldh16q(A, r1 + (size_t)p * 12, w) : _mm256_setzero_si256();
                _mm512_mask_storeu_epi32((uint32_t*)(ap + (size_t)p * kp * 24) + (size_t)q * 12, 0x0fff, gm_bf16h_pairs(a0, a1));
                continue;
            }
            const __m512 v0 = gm_lda16(A, r0 + (size_t)p * 12, w, ah), v1 = has1 ? gm_lda16(A, r1 + (size_t)p * 12, w, ah) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32((uint32_t*)(ap + (size_t)p * kp * 24) + (size_t)q * 12, 0x0fff, gm_bf16_pairs(v0, v1));
        }
    }
}

/* fp32 A panel p [K][12] from A stored by rows (element (m, k) at A[m * sam + k]) as bf16 bits (the fp32 path reads an
 * fp32 A in place): 16 k of the panel's 12 rows widened, a 16 x 16 transpose; gm_pack_a_f32's layout and values */
__attribute__((target("avx512f"))) static void gm_pack_a_f32_rows(float* ap, const void* A, int ah, long sam, int M, int K, int p, size_t pa) {
    float* dst = ap + (size_t)p * pa;
    for (int k0 = 0; k0 < K; k0 += 16) {
        __m512i t[16], u[16];
        for (int r = 0; r < 16; r++)
            t[r] = r < 12 && p * 12 + r < M ? _mm512_castps_si512(gm_lda16(A, (size_t)(p * 12 + r) * sam + (size_t)k0, K - k0, ah)) : _mm512_setzero_si512();
        gm_transpose16(u, t);   /* u[kk]: dword r = row p * 12 + r's element k0 + kk */
        const int kn = K - k0 < 16 ? K - k0 : 16;
        for (int kk = 0; kk < kn; kk++) _mm512_mask_storeu_ps(dst + (size_t)(k0 + kk) * 12, 0x0fff, _mm512_castsi512_ps(u[kk]));
    }
}

/* a C block stored as bf16 (gemm_x's C16): dst = the bits of bf16(src), after the softcap where cap > 0 (softcap_value,
 * cpu_kernels.h: softcap_forward's arithmetic, so the same bits as the softcap and the bf16 store after the GEMM) */
static void gm_store_c16(uint16_t* dst, const float* src, int n, float cap) {
    if (cap > 0.0f)
        for (int i = 0; i < n; i++) dst[i] = f32_to_bf16_bits(softcap_value(src[i], cap));
    else
        bf16_pack_span(dst, src, n);
}

/* grow-only packing buffers (the GEMMs are called from one thread; their packing and tasks are parallel) */
static void* gm_buf[3];
static size_t gm_cap[3];
/* a thread's grow-only fp32 buffer for the C block of a GEMM stored as bf16 (kept for the thread's life) */
static __thread float* gm_tblk;
static __thread size_t gm_tblk_cap;
static float* gm_thread_block(size_t n) {
    if (n > gm_tblk_cap) {
        free(gm_tblk);
        gm_tblk = (float*)aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        if (!gm_tblk) { fprintf(stderr, "error: gemm: out of memory for a %zu-float output block\n", n); exit(1); }
        gm_tblk_cap = n;
    }
    return gm_tblk;
}
static void* gm_scratch(int which, size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (bytes > gm_cap[which]) {
        free(gm_buf[which]);
        gm_buf[which] = aligned_alloc(64, bytes);
        if (!gm_buf[which]) { fprintf(stderr, "error: gemm: out of memory for %zu bytes of packed operands\n", bytes); exit(1); }
        gm_cap[which] = bytes;
    }
    return gm_buf[which];
}

/* the SIMD paths: kind 0 fp32 avx512, 1 fp32 avx2, 2 bf16 avx512bf16, 3 bf16 amx. A and B are packed whole
 * (A into MR-row panels over all of K, B into NR-column panels), each operand element converted once; then
 * the tasks, blocks of C, run each micro-tile over all of K in one call: its accumulators live in registers
 * (tiles) from k = 0 to K-1, and C is read and written once. */
/* A: fp32, or (ah) bf16 bits; C fp32, or (C16 != NULL) each finished block stored as bf16 bits from a thread's fp32
 * block buffer, after the softcap where cap > 0 (gm_store_c16): the buffer starts from C's block where accumulate (C
 * the fp32 partial sums of earlier products, read only), else from zero */
static void gemm_blocked(int kind, float* C, uint16_t* C16, float cap, const void* A, int ah, long sam, long sak, const void* B, int bh,
                         int btr, int M, int K, int N, int accumulate, int round_out) {
    const float* Bf = (const float*)B;   /* B given transposed: fp32 (gemm_x refuses bf16 bits there) */
    static const int MRs[4] = {12, 6, 12, 16}, NRs[4] = {32, 16, 32, 16};
    const int MR = MRs[kind], NR = NRs[kind];
    if (M <= 0 || N <= 0) return;
    if (K == 0) {
        if (C16 && accumulate)
            for (int r = 0; r < M; r++) gm_store_c16(C16 + (size_t)r * N, C + (size_t)r * N, N, cap);
        else if (C16) memset(C16, 0, sizeof(uint16_t) * (size_t)M * N);   /* softcap(0) = 0 */
        else if (!accumulate) memset(C, 0, sizeof(float) * (size_t)M * N);
        else if (round_out) bf16_round_array(C, (long long)M * N);
        return;
    }
    int npa = (M + MR - 1) / MR, npb = (N + NR - 1) / NR;
    int Kp = kind == 3 ? (K + 31) / 32 * 32 : kind == 2 ? (K + 1) / 2 * 2 : K;   /* K padded with zeros */
    size_t esz = kind >= 2 ? 2 : 4;
    size_t pa = (size_t)Kp * MR, pb = (size_t)Kp * NR;   /* elements a panel */
    /* K is walked in chunks (a multiple of 32, so of every layout's k step) so that a task's A and B chunks stay
     * in L2; C holds the fp32 partial sums between chunks, exactly, so the chunks do not change a bit */
    const int KCMAX = kind == 3 ? 1024 : kind == 2 ? GM_KC_BF16 : GM_KC, nch = (Kp + KCMAX - 1) / KCMAX;
    const int KC = ((Kp + nch - 1) / nch + 31) / 32 * 32;   /* nch chunks of about equal length (576: 288 + 288, not 384 + 192) */
    /* an AMX block takes two panels of each: one zero panel past the last, for an odd count */
    /* fp32: A stored by rows (sak 1) is read in place, only a partial last panel packed, per task and chunk;
     * A read transposed (sam 1) is packed whole, reading each of its rows once: in place, the micro-kernel
     * would take a new cache line every k, and again for every B panel; a bf16 A (ah) is packed whole, widened */
    int apack = kind >= 2 || sak != 1 || ah;
    void* abuf = apack ? gm_scratch(0, (size_t)(npa + 1) * pa * esz) : NULL;
    void* bbuf = gm_scratch(1, (size_t)(npb + 1) * pb * esz);
    /* smaller blocks when there are few: at least 4 tasks a thread where the shape allows (the blocks do not
     * change a bit: each element's order is fixed by K alone) */
    int mbs = GM_MB, nbs = GM_NB, nth = 1;
#ifdef _OPENMP
    nth = omp_get_max_threads();
#endif
    while (((M + mbs - 1) / mbs) * ((N + nbs - 1) / nbs) < 4 * nth) {
        if (mbs > 96) mbs = 96;
        else if (nbs > 64) nbs /= 2;
        else break;
    }
#pragma omp parallel
    {
        if (apack && sam == 1) {
            /* A read transposed (dW's dout^T; fp32 and AMX): each thread packs a range of panels walking k
             * outermost, so it reads rows of the source in order (a panel at a time would take a new line every k) */
            int nt = 1, me = 0;
#ifdef _OPENMP
            nt = omp_get_num_threads(); me = omp_get_thread_num();
#endif
            int p0 = (int)((long)npa * me / nt), p1 = (int)((long)npa * (me + 1) / nt);
            if (kind == 3) gm_pack_at_amx((uint16_t*)abuf, A, ah, sak, M, K, p0, p1);
            else if (kind == 2) gm_pack_at_bf16((uint16_t*)abuf, A, ah, sak, M, K, p0, p1);
            else if (kind == 0) gm_pack_at_avx512((float*)abuf, A, ah, sak, M, K, p0, p1, pa);
            else
                for (int k = 0; k < K; k++) {
                    const size_t src = (size_t)k * sak;
                    for (int p = p0; p < p1; p++) {
                        float* d = (float*)abuf + (size_t)p * pa + (size_t)k * MR;
                        int w = M - p * MR < MR ? M - p * MR : MR;
                        for (int r = 0; r < MR; r++) d[r] = r < w ? gm_lda(A, src + (size_t)p * MR + r, ah) : 0.0f;
                    }
                }
            if (me == 0) memset((char*)abuf + (size_t)npa * pa * esz, 0, pa * esz);
        }
#pragma omp for schedule(static) nowait
        for (int p = 0; p <= npa; p++) {
            int m0 = p * MR, mr = M - m0 < MR ? M - m0 : MR;
            if (!apack || sam == 1) continue;
            if (p == npa) { memset((char*)abuf + (size_t)p * pa * esz, 0, pa * esz); continue; }
            if (kind == 3) gm_pack_a_amx_vec((uint16_t*)abuf, A, ah, sam, sak, M, K, p);
            else if (kind == 2 && sak == 1) gm_pack_a_bf16_rows((uint16_t*)abuf, A, ah, sam, M, K, p);
            else if (kind == 2) gm_pack_a_bf16((uint16_t*)abuf + (size_t)p * pa, A, ah, sam, sak, m0, mr, 0, K, MR);
            else if (kind == 0 && sak == 1) gm_pack_a_f32_rows((float*)abuf, A, ah, sam, M, K, p, pa);   /* a bf16 A by rows */
            else gm_pack_a_f32((float*)abuf + (size_t)p * pa, A, ah, sam, sak, m0, mr, 0, K, MR);
        }
        if ((kind == 3 || kind == 2) && !btr) {   /* each thread a range of B panels, the rows read in order */
            int nt = 1, me = 0;
#ifdef _OPENMP
            nt = omp_get_num_threads(); me = omp_get_thread_num();
#endif
            if (kind == 3) gm_pack_b_amx_rows((uint16_t*)bbuf, B, bh, N, K, (int)((long)npb * me / nt), (int)((long)npb * (me + 1) / nt));
            else gm_pack_b_bf16_rows((uint16_t*)bbuf, B, bh, N, K, (int)((long)npb * me / nt), (int)((long)npb * (me + 1) / nt));
            if (me == 0) memset((char*)bbuf + (size_t)npb * pb * esz, 0, pb * esz);
#pragma omp barrier
        } else {
#pragma omp for schedule(static)
            for (int p = 0; p <= npb; p++) {
                int n0 = p * NR, nr = N - n0 < NR ? N - n0 : NR;
                if (p == npb) { memset((char*)bbuf + (size_t)p * pb * esz, 0, pb * esz); continue; }
                if (btr) {
                    if (kind == 3) gm_pack_bt_amx_vec((uint16_t*)bbuf, Bf, N, K, p);
                    else if (kind == 2) gm_pack_bt_bf16_vec((uint16_t*)bbuf, Bf, N, K, p);
                    else if (kind == 0) gm_pack_bt_f32_avx512((float*)bbuf, Bf, N, K, p);
                    else gm_pack_bt_f32((float*)bbuf + (size_t)p * pb, Bf, K, n0, nr, NR);
                } else if (kind == 0) gm_pack_b_f32_avx512((float*)bbuf, B, bh, N, K, p);
                else gm_pack_b_f32((float*)bbuf + (size_t)p * pb, B, bh, N, n0, nr, 0, K, NR);
            }
        }
        /* the tasks: blocks of GM_MB rows x GM_NB columns of C (whole micro-tiles) */
        if (kind == 3) gm_amx_config();
        float tmp[32 * 32] __attribute__((aligned(64)));
        float edge[12 * GM_KC] __attribute__((aligned(64)));   /* a partial A panel of one fp32 chunk (KC <= GM_KC) */
        int mt = kind == 3 ? 32 : MR, nt = kind == 3 ? 32 : NR;   /* the micro-tile */
        int nmb = (M + mbs - 1) / mbs, nnb = (N + nbs - 1) / nbs;
        float* cblk = C16 ? gm_thread_block((size_t)mbs * nbs) : NULL;   /* C16: the task's block in fp32, ldc nbs */
#pragma omp for schedule(static)
        for (long task = 0; task < (long)nmb * nnb; task++) {
            int mb0 = (int)(task / nnb) * mbs, nb0 = (int)(task % nnb) * nbs;
            int mb1 = M < mb0 + mbs ? M : mb0 + mbs, nb1 = N < nb0 + nbs ? N : nb0 + nbs;
            if (cblk && accumulate)   /* the partial sums the chunks add to */
                for (int r = mb0; r < mb1; r++) memcpy(cblk + (size_t)(r - mb0) * nbs, C + (size_t)r * N + nb0, sizeof(float) * (nb1 - nb0));
            for (int k0 = 0; k0 < Kp; k0 += KC) {
                int kc = Kp - k0 < KC ? Kp - k0 : KC, first = k0 == 0 && !accumulate;
                int medge = apack ? mb1 : mb1 - (mb1 - mb0) % MR;   /* rows from here on: a partial panel */
                if (!apack && medge < mb1) gm_pack_a_f32(edge, A, 0, sam, sak, medge, mb1 - medge, k0, kc, MR);
                for (int n0 = nb0; n0 < nb1; n0 += nt)
                    for (int m0 = mb0; m0 < mb1; m0 += mt) {
                        int rows = mb1 - m0 < mt ? mb1 - m0 : mt, cols = nb1 - n0 < nt ? nb1 - n0 : nt;
                        const long ldC = cblk ? nbs : N;
                        float* c = cblk ? cblk + (size_t)(m0 - mb0) * nbs + (n0 - nb0) : C + (size_t)m0 * N + n0;
                        int full = rows == mt && cols == nt;
                        float* cc = full ? c : tmp;
                        long ldc = full ? ldC : nt;
                        if (!full && !first)
                            for (int r = 0; r < rows; r++) memcpy(tmp + r * nt, c + (size_t)r * ldC, sizeof(float) * cols);
                        /* panel i, rows k0.. of the chunk: every layout keeps MR (NR) elements a k */
                        size_t ia = (size_t)(m0 / MR) * pa + (size_t)k0 * MR, jb = (size_t)(n0 / NR) * pb + (size_t)k0 * NR;
                        if (kind == 3) {
                            const uint16_t *ua = (const uint16_t*)abuf, *ub = (const uint16_t*)bbuf;
                            gm_mk_amx(kc / 32, ua + ia, ua + ia + pa, ub + jb, ub + jb + pb, cc, ldc, first);
                        } else if (kind == 2)
                            gm_mk_avx512bf16(kc, (const uint16_t*)abuf + ia, (const uint16_t*)bbuf + jb, cc, ldc, first);
                        else {
                            const float* fb = (const float*)bbuf + jb;
                            const float* fa = (const float*)A + (size_t)m0 * sam + (size_t)k0 * sak;   /* fp32 (apack otherwise) */
                            if (apack || m0 >= medge) {   /* a packed panel */
                                const float* pk = apack ? (const float*)abuf + ia : edge;
                                if (kind == 1) gm_mk_avx2_kmajor(kc, pk, MR, fb, cc, ldc, first);
                                else gm_mk_avx512_kmajor(kc, pk, MR, fb, cc, ldc, first);
                            } else {
                                if (kind == 1) gm_mk_avx2_rows(kc, fa, sam, fb, cc, ldc, first);
                                else gm_mk_avx512_rows(kc, fa, sam, fb, cc, ldc, first);
                            }
                        }
                        if (!full)
                            for (int r = 0; r < rows; r++) memcpy(c + (size_t)r * ldC, tmp + r * nt, sizeof(float) * cols);
                    }
            }
            /* the finished block, stored as bf16 while it is in L2: a block at a time, not a tile at a time, so that the
             * loads do not wait on the tile's stores still in flight (a tile at a time cost about an eighth of an AMX
             * GEMM's time) */
            if (cblk)
                for (int r = mb0; r < mb1; r++) gm_store_c16(C16 + (size_t)r * N + nb0, cblk + (size_t)(r - mb0) * nbs, nb1 - nb0, cap);
            else if (round_out)
                for (int r = mb0; r < mb1; r++) bf16_round_span(C + (size_t)r * N + nb0, nb1 - nb0);
        }
        if (kind == 3) gm_amx_release();
    }
}
#endif

/* the entry points: B row-major [K, N] (btr 0) or given transposed, Bt [N, K] row-major (btr 1); round_out 1
 * rounds C to bf16 (round to nearest even) once it is complete, block by block while it is in cache: the
 * -precision bf16 store of a GEMM's output without a pass of its own (the same bits as rounding after).
 * gemm_x, the general one: bf16 picks the bf16 product (else fp32); A fp32, or (ah = 1) bf16 bits, the -precision
 * bf16 storage, widened exactly as it is packed (so the same bits as the fp32 array holding those values); C fp32,
 * or (C16 != NULL) stored as bf16 bits, after the softcap cap * tanh(c / cap) where cap > 0, each block as it is
 * finished (the same bits as softcap_forward and the bf16 rounding after the GEMM); with C16 and accumulate, C holds
 * fp32 partial sums (earlier products into the same output) that the product adds to, and is left as it was: the
 * same bits as accumulating into C and rounding it. */
static void gemm_x(int bf16, float* C, uint16_t* C16, float cap, const void* A, int ah, long sam, long sak, const void* B, int bh,
                   int btr, int M, int K, int N, int accumulate, int round_out) {
    if (C16 && accumulate && !C) { fprintf(stderr, "internal error: gemm: a bf16 output accumulates onto fp32 partial sums\n"); exit(1); }
    if (bh && btr) { fprintf(stderr, "internal error: gemm: B as bf16 bits is read row-major only\n"); exit(1); }
    int lv = gemm_level();
#if TSDC_GEMM_X86
    if (sam == 1 || sak == 1) {   /* the SIMD paths read A by rows or by columns */
        int kind = bf16 && lv == GEMM_AMX ? 3 : bf16 && lv == GEMM_AVX512BF16 ? 2 : lv >= GEMM_AVX512 ? 0 : lv >= GEMM_AVX2 ? 1 : -1;
        if (kind >= 0) { gemm_blocked(kind, C, C16, cap, A, ah, sam, sak, B, bh, btr, M, K, N, accumulate, round_out); return; }
    }
#endif
    (void)lv;
    if (M <= 0 || N <= 0) return;
    const float* Af = (const float*)A;
    if (ah) {   /* gemm_portable reads fp32: the bf16 A widened once (the span its strides cover) */
        size_t span = K > 0 ? (size_t)(M - 1) * sam + (size_t)(K - 1) * sak + 1 : 0;
        float* w = (float*)gm_scratch(0, sizeof(float) * (span ? span : 1));
        for (size_t i = 0; i < span; i++) w[i] = bf16_bits_to_f32(((const uint16_t*)A)[i]);
        Af = w;
    }
    float* Cf = C16 ? (float*)gm_scratch(2, sizeof(float) * (size_t)M * N) : C;
    if (C16 && accumulate) memcpy(Cf, C, sizeof(float) * (size_t)M * N);
    const float* Bf = (const float*)B;
    if (!btr && !bh) gemm_portable(Cf, Af, sam, sak, Bf, M, K, N, accumulate);
    else {   /* the portable path reads fp32 B row-major: Bt transposed once, or the bf16 B widened once */
        float* Bn = (float*)gm_scratch(1, sizeof(float) * (size_t)K * N);
        if (bh)
            for (size_t i = 0; i < (size_t)K * N; i++) Bn[i] = bf16_bits_to_f32(((const uint16_t*)B)[i]);
        else
            for (int n = 0; n < N; n++)
                for (int k = 0; k < K; k++) Bn[(size_t)k * N + n] = Bf[(size_t)n * K + k];
        gemm_portable(Cf, Af, sam, sak, Bn, M, K, N, accumulate);
    }
    if (C16) {
#pragma omp parallel for schedule(static)
        for (int m = 0; m < M; m++) gm_store_c16(C16 + (size_t)m * N, Cf + (size_t)m * N, N, cap);
    }
    else if (round_out) bf16_round_array(C, (long long)M * N);
}
static void gemm_f32_x(float* C, const float* A, long sam, long sak, const float* B, int btr, int M, int K, int N, int accumulate,
                       int round_out) {
    gemm_x(0, C, NULL, 0.0f, A, 0, sam, sak, B, 0, btr, M, K, N, accumulate, round_out);
}
static void gemm_bf16_x(float* C, const float* A, long sam, long sak, const float* B, int btr, int M, int K, int N, int accumulate,
                        int round_out) {
    gemm_x(1, C, NULL, 0.0f, A, 0, sam, sak, B, 0, btr, M, K, N, accumulate, round_out);
}
/* fp32 inputs, fp32 accumulation, on the best fp32 path at or below the level in use */
static void gemm_f32(float* C, const float* A, long sam, long sak, const float* B, int M, int K, int N, int accumulate) {
    gemm_f32_x(C, A, sam, sak, B, 0, M, K, N, accumulate, 0);
}
/* bf16 inputs (rounded to nearest even when packed), fp32 accumulation */
static void gemm_bf16(float* C, const float* A, long sam, long sak, const float* B, int M, int K, int N, int accumulate) {
    gemm_bf16_x(C, A, sam, sak, B, 0, M, K, N, accumulate, 0);
}

#endif
