/* cpu_features.h: what the CPU running this process offers, asked once (CPUID through __builtin_cpu_supports), for
 * the kernels that pick a vector path at run time (the build may target a baseline CPU: NATIVE=0). */
#ifndef TSDC_CPU_FEATURES_H
#define TSDC_CPU_FEATURES_H

#if defined(__x86_64__) && !defined(__CUDACC__)
/* AVX-512 with 64-bit lane multiplies and conversions (AVX512F + AVX512DQ): vexp.h's expf, the Q/K fingerprint */
static int cpu_avx512dq(void) {
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }
    return have;
}
#else
static int cpu_avx512dq(void) { return 0; }
#endif

#endif
