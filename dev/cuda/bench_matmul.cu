/* bench_matmul.cu: the bf16 matrix-multiply rate of this GPU through cuBLASLt, the denominator of the
 * "MFU vs measured" figure of scripts/gpu_check.sh.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -o build/bench_matmul dev/cuda/bench_matmul.cu -lcublasLt
 *   ./build/bench_matmul [reps]
 *
 * D[m,n] = A[m,k] B[k,n] with bf16 A, B, D, fp32 accumulation (CUBLAS_COMPUTE_32F), as the trainer's
 * GEMMs (llmc/cuda/matmul.cuh). Operands are filled with random normal bf16 values (never zeros: a product
 * of zeros runs faster than real data), are far larger than the 60 MB L2, and each shape is timed
 * with CUDA events: 5 warm-up products, then `reps` (default 20) timed one by one; the median is
 * reported. Shapes: 8192^3 (square), and the three GEMM shapes of a llama3.2-1b step at B*T = 8192
 * tokens (QKV/attention-out 8192x2048x2048, MLP 8192x8192x2048, LM head 8192x128256x2048).
 * For each shape the first heuristic algorithm (what the trainer uses) is timed; for the square shape
 * also the best of the first 8 heuristic algorithms. The last line is
 *   PEAK_TFLOPS <best rate seen, TFLOP/s>
 * for scripts to read. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { fprintf(stderr, "error: CUDA %s (%s) [%s:%d]\n", \
    cudaGetErrorString(e_), #call, __FILE__, __LINE__); exit(1); } } while (0)
#define CB(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "error: cuBLASLt %s (%d) (%s) [%s:%d]\n", \
    cublasLtGetStatusString(s_), (int)s_, #call, __FILE__, __LINE__); exit(1); } } while (0)

/* normal(0,1) bf16 from a counter-based hash (Box-Muller) */
__global__ void fill_normal(__nv_bfloat16* x, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u1 = ((z >> 40) + 1) * (1.0f / 16777217.0f), u2 = ((z >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
        x[i] = __float2bfloat16_rn(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
    }
}

static cublasLtHandle_t g_lt;
static void* g_ws;
static const size_t WS = (size_t)32 << 20;

/* times one shape; returns the median ms of the heuristic's algorithm `which` (-1: none available) */
static double time_shape(int m, int n, int k, int which, int reps, int* n_algos) {
    __nv_bfloat16 *A, *B, *D;
    CK(cudaMalloc(&A, (size_t)m * k * 2));
    CK(cudaMalloc(&B, (size_t)k * n * 2));
    CK(cudaMalloc(&D, (size_t)m * n * 2));
    fill_normal<<<4096, 256>>>(A, (size_t)m * k, 1);
    fill_normal<<<4096, 256>>>(B, (size_t)k * n, 2);
    CK(cudaGetLastError());
    /* column-major cuBLAS view of row-major D[m,n] = A[m,k] B[k,n]: D^T[n,m] = B^T[n,k] A^T[k,m] */
    cublasLtMatmulDesc_t desc;
    CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opN = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opN, sizeof(opN)));
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
    cublasLtMatrixLayout_t la, lb, ld;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, k, n));  /* B stored [k,n] row-major = [n,k] col-major */
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));  /* A stored [m,k] row-major = [k,m] col-major */
    CB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = WS;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t res[8];
    int got = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 8, res, &got));
    *n_algos = got;
    double med = -1;
    if (which < got) {
        float alpha = 1.0f, beta = 0.0f;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int i = 0; i < 5; i++)
            CB(cublasLtMatmul(g_lt, desc, &alpha, B, la, A, lb, &beta, D, ld, D, ld, &res[which].algo, g_ws, WS, 0));
        std::vector<float> t(reps);
        for (int r = 0; r < reps; r++) {
            CK(cudaEventRecord(e0));
            CB(cublasLtMatmul(g_lt, desc, &alpha, B, la, A, lb, &beta, D, ld, D, ld, &res[which].algo, g_ws, WS, 0));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&t[r], e0, e1));
        }
        std::sort(t.begin(), t.end());
        med = t[reps / 2];
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }
    CB(cublasLtMatmulPreferenceDestroy(pref));
    CB(cublasLtMatrixLayoutDestroy(la));
    CB(cublasLtMatrixLayoutDestroy(lb));
    CB(cublasLtMatrixLayoutDestroy(ld));
    CB(cublasLtMatmulDescDestroy(desc));
    CK(cudaFree(A)); CK(cudaFree(B)); CK(cudaFree(D));
    return med;
}

int main(int argc, char** argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) reps = 1;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) { fprintf(stderr, "error: no usable CUDA GPU\n"); return 1; }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("bench_matmul: %s, %d SMs, bf16 in/out, fp32 accumulate, median of %d after 5 warm-up\n", p.name, p.multiProcessorCount, reps);
    CB(cublasLtCreate(&g_lt));
    CK(cudaMalloc(&g_ws, WS));
    struct { int m, n, k; const char* what; } shapes[] = {
        {8192, 8192, 8192, "square"},
        {8192, 2048, 2048, "llama3.2-1b q/o proj, 8192 tokens"},
        {8192, 8192, 2048, "llama3.2-1b MLP up/gate, 8192 tokens"},
        {8192, 128256, 2048, "llama3.2-1b LM head, 8192 tokens"},
    };
    double peak = 0;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        int m = shapes[i].m, n = shapes[i].n, k = shapes[i].k, na = 0;
        double flop = 2.0 * m * n * k;
        int tries = i == 0 ? 8 : 1;
        double best_ms = -1;
        for (int a = 0; a < tries; a++) {
            double ms = time_shape(m, n, k, a, reps, &na);
            if (ms < 0) break;
            if (a == 0) printf("  %-6d x %-6d x %-6d %-38s first heuristic algo: %8.3f ms  %7.1f TFLOP/s\n", m, n, k, shapes[i].what, ms,
                               flop / ms * 1e-9);
            if (best_ms < 0 || ms < best_ms) best_ms = ms;
            if (a + 1 >= na) break;
        }
        if (best_ms > 0) {
            if (tries > 1) printf("  %-6d x %-6d x %-6d %-38s best of %d algos:     %8.3f ms  %7.1f TFLOP/s\n", m, n, k, shapes[i].what,
                                  na < tries ? na : tries, best_ms, flop / best_ms * 1e-9);
            double r = flop / best_ms * 1e-9;
            if (r > peak) peak = r;
        }
    }
    CK(cudaFree(g_ws));
    CB(cublasLtDestroy(g_lt));
    printf("PEAK_TFLOPS %.1f\n", peak);
    return 0;
}
