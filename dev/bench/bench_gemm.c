/* bench_gemm.c: the CPU GEMMs (llmc/cpu/gemm.h) against the core's measured FMA peak, on the shapes of a model.
 *
 *   ./bench_gemm [-d 576] [-ffn 1536] [-kv 192] [-vocab 8192] [-tokens 1024] [-threads 1] [-reps 3]
 *
 * Peak: one thread runs 24 independent chains of fused multiply-adds on the widest vector unit the CPU
 * has (zmm with AVX-512, else ymm with FMA), long enough to reach its steady clock; FLOP/s = 2 x lanes x
 * FMAs / s. That is the ceiling a GEMM at this clock can reach on one core (threads x it for several).
 * Shapes: the linear layers of one transformer layer and the classifier at N tokens, each as the trainer
 * calls it: forward (N x I times W^T), dx (N x O times W) and dW (dout^T x inp, A read transposed),
 * timed as the best of -reps calls after one warm-up; every fp32 path the machine has, and the bf16 path
 * chosen for -precision bf16, called as that mode calls it: the activations and their gradients stored as bf16 bits
 * (the forward's input, the dx product's dout, both operands of dW), the weights as fp32 arrays of bf16 values read
 * as W^T (forward) or row-major (dx). Prints GFLOP/s and the fraction of the fp32 peak x threads, per layer (the three
 * products summed) and then per product on the best fp32 path (where a GEMM loses). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
#include "llmc/host/utils.h"
#include "llmc/cpu/cpu_kernels.h"

static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

#if TSDC_GEMM_X86
#define CHAINS 24
__attribute__((target("avx512f"), noinline)) static float peak_avx512(long iters) {
    __m512 a[CHAINS], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 24
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    }
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"), noinline)) static float peak_avx2(long iters) {
    __m256 a[12], x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float r[8];
    _mm256_storeu_ps(r, s);
    return r[0] + r[7];
}
/* 24 chains of VDPBF16PS: 32 bf16 pairs (64 FLOP) an instruction */
__attribute__((target("avx512f,avx512bf16"), noinline)) static float peak_dpbf16(long iters) {
    __m512 a[CHAINS];
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 24
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    }
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
#endif

/* GFLOP/s of one core's VDPBF16PS peak (0 without AVX512-BF16) */
static double dpbf16_peak(void) {
#if TSDC_GEMM_X86
    if (gemm_machine_level() < GEMM_AVX512BF16) return 0;
    volatile float sink = 0;
    double g = 0;
    for (int w = 0; w < 2; w++) {
        long iters = 20000000;
        double t0 = now_s();
        sink += peak_dpbf16(iters);
        g = iters * CHAINS * 64.0 / (now_s() - t0) / 1e9;
    }
    (void)sink;
    return g;
#else
    return 0;
#endif
}

/* GFLOP/s of one core's FMA peak, and which unit */
static double fma_peak(const char** unit) {
    *unit = "scalar (no FMA vector unit detected)";
#if TSDC_GEMM_X86
    int lv = gemm_machine_level();
    volatile float sink = 0;
    for (int w = 0; w < 2; w++) {   /* a warm-up pass, then the timed one */
        long iters = 40000000;
        double t0 = now_s();
        if (lv >= GEMM_AVX512) sink += peak_avx512(iters);
        else if (lv >= GEMM_AVX2) sink += peak_avx2(iters);
        else return 0;
        double dt = now_s() - t0;
        if (w == 1) {
            *unit = lv >= GEMM_AVX512 ? "zmm FMA (AVX-512), 24 chains" : "ymm FMA (AVX2), 12 chains";
            return (lv >= GEMM_AVX512 ? iters * CHAINS * 32.0 : iters * 12 * 16.0) / dt / 1e9;
        }
    }
    (void)sink;
#endif
    return 0;
}

static double time_gemm(int bf16, float* C, const void* A, int ah, long sam, long sak, const void* B, int bh, int btr, int M, int K, int N,
                        int acc, int reps) {
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = now_s();
        gemm_x(bf16, C, NULL, 0.0f, A, ah, sam, sak, B, bh, btr, M, K, N, acc, 0);
        double dt = now_s() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    return best;
}

int main(int argc, char** argv) {
    int d = 576, F = 1536, kv = 192, V = 8192, Nt = 1024, threads = 1, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) { fprintf(stderr, "bench_gemm: %s needs a value\n", argv[i]); return 2; }
        int v = atoi(argv[i + 1]);
        if (v <= 0) { fprintf(stderr, "bench_gemm: %s must be a positive integer\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "-d")) d = v;
        else if (!strcmp(argv[i], "-ffn")) F = v;
        else if (!strcmp(argv[i], "-kv")) kv = v;
        else if (!strcmp(argv[i], "-vocab")) V = v;
        else if (!strcmp(argv[i], "-tokens")) Nt = v;
        else if (!strcmp(argv[i], "-threads")) threads = v;
        else if (!strcmp(argv[i], "-reps")) reps = v;
        else { fprintf(stderr, "bench_gemm: unknown flag %s\n", argv[i]); return 2; }
        i++;
    }
    omp_set_num_threads(threads);
    const char* unit;
    double peak = fma_peak(&unit);
    printf("fp32 FMA peak of one core: %.1f GFLOP/s (%s); x %d thread%s = %.1f\n", peak, unit, threads, threads == 1 ? "" : "s", peak * threads);
    double dpk = dpbf16_peak();
    if (dpk > 0) printf("VDPBF16PS peak of one core: %.1f GFLOP/s (%.2f x the FMA peak; 24 chains)\n", dpk, peak > 0 ? dpk / peak : 0);
    struct { const char* name; int I, O; } lin[] = {{"q/o", d, d}, {"k/v", d, kv}, {"gate/up", d, F}, {"down", F, d}, {"classifier", d, V}};
    int top = gemm_machine_level();
    printf("%-11s %-5s %-5s", "layer", "I", "O");
    for (int lv = 1; lv <= (top < GEMM_AVX512 ? top : GEMM_AVX512); lv++) printf("  %-22s", gemm_path_names[lv]);
    /* the bf16 columns: the path -precision bf16 takes by default, then the machine's best bf16 unit if that differs */
    int bfl[2] = {gemm_default_level(top), top}, nbf = bfl[0] == top || top < GEMM_AVX512BF16 ? 1 : 2;
    for (int b = 0; b < nbf; b++) {
        gemm_set_level(bfl[b]);
        printf("  bf16 %-17s", gemm_bf16_path());
    }
    printf("%s\n", nbf == 2 ? "  (the default bf16 path first)" : "");
    double tflop[8] = {0}, tsec[8] = {0};
    const int best32 = top < GEMM_AVX512 ? top : GEMM_AVX512;
    double dir_t[2][5][3] = {{{0}}};   /* each product's time (forward, dx, dW): the best fp32 path, the default bf16 path */
    for (int s = 0; s < 5; s++) {
        int I = lin[s].I, O = lin[s].O;
        float *x = mallocCheck(sizeof(float) * Nt * I), *w = mallocCheck(sizeof(float) * I * O), *wT = mallocCheck(sizeof(float) * I * O);
        float *y = mallocCheck(sizeof(float) * Nt * O), *dx = mallocCheck(sizeof(float) * Nt * I), *dw = mallocCheck(sizeof(float) * I * O);
        uint16_t *x16 = mallocCheck(sizeof(uint16_t) * Nt * I), *y16 = mallocCheck(sizeof(uint16_t) * Nt * O);   /* as bf16 bits */
        for (long i = 0; i < (long)Nt * I; i++) { x[i] = bf16_round((float)((i * 37 % 101) - 50) * 0.01f); x16[i] = f32_to_bf16_bits(x[i]); }
        for (long i = 0; i < (long)I * O; i++) w[i] = wT[i] = bf16_round((float)((i * 53 % 89) - 44) * 0.01f);
        for (long i = 0; i < (long)Nt * O; i++) { y[i] = bf16_round((float)((i * 29 % 83) - 41) * 0.001f); y16[i] = f32_to_bf16_bits(y[i]); }
        memset(dw, 0, sizeof(float) * I * O);
        printf("%-11s %-5d %-5d", lin[s].name, I, O);
        double f = 2.0 * Nt * I * O;
        int col = 0;
        for (int lv = 1; lv <= top + nbf; lv++) {
            int bf = lv > top;
            if (!bf && lv > GEMM_AVX512) continue;
            gemm_set_level(bf ? bfl[lv - top - 1] : lv);
            /* bf16: the forms of -precision bf16 (w as the weight [O, I]: read as W^T, then row-major) */
            const double tf = bf ? time_gemm(1, y, x16, 1, I, 1, w, 0, 1, Nt, I, O, 0, reps) : time_gemm(0, y, x, 0, I, 1, wT, 0, 0, Nt, I, O, 0, reps),
                         tx = time_gemm(bf, dx, bf ? (const void*)y16 : (const void*)y, bf, O, 1, w, 0, 0, Nt, O, I, 0, reps),
                         tw = bf ? time_gemm(1, dw, y16, 1, 1, O, x16, 1, 0, O, Nt, I, 1, reps) : time_gemm(0, dw, y, 0, 1, O, x, 0, 0, O, Nt, I, 1, reps);
            const double t = tf + tx + tw;
            const int di = !bf && lv == best32 ? 0 : bf && lv == top + 1 ? 1 : -1;
            if (di >= 0) { dir_t[di][s][0] = tf; dir_t[di][s][1] = tx; dir_t[di][s][2] = tw; }
            double g = 3 * f / t / 1e9;
            printf("  %6.0f GFLOP/s (%3.0f%%)  ", g, peak > 0 ? 100 * g / (peak * threads) : 0);
            tflop[col] += 3 * f; tsec[col] += t; col++;
        }
        printf("\n");
        free(x); free(w); free(wT); free(y); free(dx); free(dw); free(x16); free(y16);
    }
    printf("%-23s", "all (FLOP-weighted)");
    for (int c = 0; c < 8 && tsec[c] > 0; c++) {
        double g = tflop[c] / tsec[c] / 1e9;
        printf("  %6.0f GFLOP/s (%3.0f%%)  ", g, peak > 0 ? 100 * g / (peak * threads) : 0);
    }
    printf("\n(forward + dx + dW of each layer at %d tokens; %% of the fp32 FMA peak x threads; bf16 can exceed 100%%)\n", Nt);
    /* where a path loses: each product on its own (forward N x I times W^T, W read transposed by the packer; dx N x O
     * times W; dW dout^T x, A read transposed), on the best fp32 path and on the default bf16 path */
    for (int di = 0; di < 2; di++) {
        if (di == 0 && best32 < 1) continue;
        gemm_set_level(bfl[0]);
        if (di == 0) printf("by product, fp32 %s path, GFLOP/s (%% of the fp32 peak x threads):\n%-11s", gemm_path_names[best32], "product");
        else printf("by product, bf16 %s path, GFLOP/s (%% of the fp32 peak x threads):\n%-11s", gemm_bf16_path(), "product");
        const char* dn[3] = {"forward", "dx", "dW"};
        for (int k = 0; k < 3; k++) printf("  %-18s", dn[k]);
        printf("\n");
        for (int s = 0; s < 5; s++) {
            const double f = 2.0 * Nt * lin[s].I * lin[s].O;
            printf("%-11s", lin[s].name);
            for (int k = 0; k < 3; k++) {
                const double g = dir_t[di][s][k] > 0 ? f / dir_t[di][s][k] / 1e9 : 0;
                printf("  %6.0f (%3.0f%%)       ", g, peak > 0 ? 100 * g / (peak * threads) : 0);
            }
            printf("\n");
        }
    }
    return 0;
}
