/* matmul.cuh: every GEMM of the GPU trainer, through cuBLASLt.
 *
 * Math (row-major, as the CPU trainer): C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C, batched
 * over `batch` independent problems whose operands start stride{A,B,C} elements apart.
 *   op(A) = A, A stored [m,k] (transA 0)   or   op(A) = A^T, A stored [k,m] (transA 1)
 *   op(B) = B, B stored [k,n] (transB 0)   or   op(B) = B^T, B stored [n,k] (transB 1)
 * A and B are bf16, C is bf16 (c_fp32 0) or fp32 (c_fp32 1); products are accumulated in fp32
 * (CUBLAS_COMPUTE_32F) with fp32 alpha/beta, and a bf16 C is rounded once (RN) by the epilogue.
 * CPU reference: gemm_nn / matmul_forward / matmul_backward in llmc/cpu/cpu_kernels.h (the CPU sums k in
 * order; cuBLAS in its own blocked order: the results agree to fp32 rounding, not bit for bit).
 *
 * Determinism: the algorithm of each problem key (shape, transposes, C type, batch and strides,
 * whether beta is 0, and the alignment of the three pointers) is chosen once, by the first result of
 * cublasLtMatmulAlgoGetHeuristic, and cached; every later call of that key runs the same kernel with
 * the same 32 MiB workspace on the same stream, so it gives the same bits. The cache holds
 * MATMUL_CACHE_SIZE plans; when a new key finds it full (sampling with -sample_every makes a shape per
 * prefix length) the least recently used plan is evicted: the heuristic is a deterministic function of
 * the key, so a key planned again gets the same algorithm.
 * When the heuristic has no algorithm for the key's pointer alignments, it is asked once more without
 * alignment preferences (cuBLASLt then assumes 256-byte aligned operands and checks them at the call);
 * if that finds none either, the error names the shape and both attempts. (cuBLASLt's split-K
 * reduction schemes are sequential: INPLACE uses counters to keep the order, the others reduce in a
 * separate pass; no scheme uses floating-point atomics.)
 *
 * Row-major to column-major (cuBLAS is column-major). A row-major matrix X[r,c] with row stride c is,
 * byte for byte, the column-major matrix X^T (c rows, r columns, leading dimension c). So the row-major
 * product C = op(A) op(B) is computed as the column-major product
 *         C^T[n,m] = op(B)^T[n,k] op(A)^T[k,m]
 * i.e. cuBLAS's first operand ("A'") is our B, its second ("B'") is our A, and cuBLAS's sizes are
 * M' = n, N' = m, K' = k. Operand by operand:
 *   our B, transB 0: stored row-major [k,n] (row stride n) = column-major [n rows, k cols], ld n.
 *                    That is already op(B)^T [n,k]: op N, layout (rows n, cols k, ld n).
 *   our B, transB 1: stored row-major [n,k] (row stride k) = column-major [k rows, n cols], ld k.
 *                    That is op(B) [k,n]; we need its transpose: op T, layout (rows k, cols n, ld k).
 *   our A, transA 0: stored row-major [m,k] (row stride k) = column-major [k rows, m cols], ld k.
 *                    That is op(A)^T [k,m]: op N, layout (rows k, cols m, ld k).
 *   our A, transA 1: stored row-major [k,m] (row stride m) = column-major [m rows, k cols], ld m.
 *                    That is op(A) [m,k]; we need its transpose: op T, layout (rows m, cols k, ld m).
 *   our C:           stored row-major [m,n] (row stride n) = column-major [n rows, m cols], ld n.
 * (A cuBLASLt layout always describes the matrix as stored, before its op: rows x cols with ld >= rows.)
 * Batches: CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = batch on all three layouts, and
 * CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = the element stride of that operand (our strideB goes
 * on cuBLAS's A' layout, our strideA on its B' layout). C doubles as D (same pointer, same layout).
 *
 * Accounting (cuda_common.cuh): each call is one record, COST_GEMM unless a scope relabels it (the
 * attention launchers' batched GEMMs), tensor-core unit, 2 m n k batch FLOPs, A and B read once, C
 * read where beta != 0, written once.
 *
 * Linear layers (weights [out, in] row-major, as HF): see linear_forward / linear_backward_dx /
 * linear_backward_dw at the end of this file. */
#ifndef TSDC_MATMUL_CUH
#define TSDC_MATMUL_CUH

#include <stdint.h>
#include <string.h>
#include "cuda_common.cuh"

#define MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)
#define MATMUL_CACHE_SIZE 512

typedef struct {
    int m, n, k, transA, transB, c_fp32, batch, beta_nonzero;
    long strideA, strideB, strideC;
    int alignA, alignB, alignC; /* bytes, power of two, at most 256 */
} MatmulKey;

typedef struct {
    MatmulKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layA, layB, layC; /* cuBLAS's A' (our B), B' (our A), C */
    cublasLtMatmulAlgo_t algo;
    unsigned long long last_use;             /* g_matmul_clock at the last call (LRU eviction) */
} MatmulPlan;

static cublasLtHandle_t g_cublaslt = NULL;
static void* g_matmul_workspace = NULL;
static MatmulPlan g_matmul_plans[MATMUL_CACHE_SIZE];
static int g_matmul_nplans = 0;
static unsigned long long g_matmul_clock = 0;

static void matmul_init(void) {
    if (g_cublaslt) return;
    cublasCheck(cublasLtCreate(&g_cublaslt));
    cudaCheck(cudaMalloc(&g_matmul_workspace, MATMUL_WORKSPACE_BYTES));
    cudaCheck(cudaMemset(g_matmul_workspace, 0, MATMUL_WORKSPACE_BYTES));
    g_matmul_nplans = 0;
}

static void matmul_free(void) {
    if (!g_cublaslt) return;
    cudaCheck(cudaDeviceSynchronize());
    for (int i = 0; i < g_matmul_nplans; i++) {
        MatmulPlan* p = &g_matmul_plans[i];
        cublasCheck(cublasLtMatrixLayoutDestroy(p->layA));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->layB));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->layC));
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
    }
    g_matmul_nplans = 0;
    cudaCheck(cudaFree(g_matmul_workspace));
    g_matmul_workspace = NULL;
    cublasCheck(cublasLtDestroy(g_cublaslt));
    g_cublaslt = NULL;
}

/* largest power of two dividing the address, capped at 256 (cuBLASLt's default assumption) */
static inline int matmul_ptr_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0) al >>= 1;
    return al;
}

static inline void matmul_shape_string(char* buf, size_t len, const MatmulKey* k) {
    snprintf(buf, len,
             "m %d n %d k %d transA %d transB %d C %s batch %d strides A %ld B %ld C %ld beta%s0 align A %d B %d C %d",
             k->m, k->n, k->k, k->transA, k->transB, k->c_fp32 ? "fp32" : "bf16", k->batch, k->strideA, k->strideB,
             k->strideC, k->beta_nonzero ? "!=" : "==", k->alignA, k->alignB, k->alignC);
}

/* a cuBLAS failure inside matmul: name the shape */
static inline void matmul_check(cublasStatus_t st, const char* what, const MatmulKey* k) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        char shape[320];
        matmul_shape_string(shape, sizeof(shape), k);
        tsdc_fail("cuBLASLt %s failed: %s (%d) for GEMM %s", what, cublasLtGetStatusString(st), (int)st, shape);
    }
}

static inline int matmul_key_equal(const MatmulKey* a, const MatmulKey* b) {
    return a->m == b->m && a->n == b->n && a->k == b->k && a->transA == b->transA && a->transB == b->transB &&
           a->c_fp32 == b->c_fp32 && a->batch == b->batch && a->beta_nonzero == b->beta_nonzero &&
           a->strideA == b->strideA && a->strideB == b->strideB && a->strideC == b->strideC &&
           a->alignA == b->alignA && a->alignB == b->alignB && a->alignC == b->alignC;
}

static void matmul_layout(cublasLtMatrixLayout_t* lay, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                          int batch, long stride, const MatmulKey* key) {
    matmul_check(cublasLtMatrixLayoutCreate(lay, type, rows, cols, ld), "MatrixLayoutCreate", key);
    if (batch > 1) {
        int32_t count = batch;
        int64_t off = stride;
        matmul_check(cublasLtMatrixLayoutSetAttribute(*lay, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                     "MatrixLayoutSetAttribute(BATCH_COUNT)", key);
        matmul_check(cublasLtMatrixLayoutSetAttribute(*lay, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off, sizeof(off)),
                     "MatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", key);
    }
}

/* the cached plan of a key, made on first use */
static const MatmulPlan* matmul_plan(const MatmulKey* key) {
    g_matmul_clock++;
    for (int i = 0; i < g_matmul_nplans; i++)
        if (matmul_key_equal(&g_matmul_plans[i].key, key)) {
            g_matmul_plans[i].last_use = g_matmul_clock;
            return &g_matmul_plans[i];
        }
    MatmulPlan* p;
    if (g_matmul_nplans == MATMUL_CACHE_SIZE) {   /* full: evict the least recently used plan */
        p = &g_matmul_plans[0];
        for (int i = 1; i < g_matmul_nplans; i++)
            if (g_matmul_plans[i].last_use < p->last_use) p = &g_matmul_plans[i];
        cublasCheck(cublasLtMatrixLayoutDestroy(p->layA));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->layB));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->layC));
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
        g_matmul_nplans--;
        *p = g_matmul_plans[g_matmul_nplans];    /* keep the live plans at 0 .. nplans-1 */
        p = &g_matmul_plans[g_matmul_nplans];
    } else {
        p = &g_matmul_plans[g_matmul_nplans];
    }
    memset(p, 0, sizeof(*p));
    p->last_use = g_matmul_clock;
    p->key = *key;
    const int m = key->m, n = key->n, k = key->k;

    matmul_check(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate", key);
    /* cuBLAS A' = our B, cuBLAS B' = our A (see the derivation at the top of the file) */
    cublasOperation_t opA = key->transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = key->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    matmul_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)), "MatmulDescSetAttribute(TRANSA)", key);
    matmul_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)), "MatmulDescSetAttribute(TRANSB)", key);

    /* A' (our B): transB 0 -> rows n, cols k, ld n;  transB 1 -> rows k, cols n, ld k */
    if (!key->transB) matmul_layout(&p->layA, CUDA_R_16BF, (uint64_t)n, (uint64_t)k, (int64_t)n, key->batch, key->strideB, key);
    else              matmul_layout(&p->layA, CUDA_R_16BF, (uint64_t)k, (uint64_t)n, (int64_t)k, key->batch, key->strideB, key);
    /* B' (our A): transA 0 -> rows k, cols m, ld k;  transA 1 -> rows m, cols k, ld m */
    if (!key->transA) matmul_layout(&p->layB, CUDA_R_16BF, (uint64_t)k, (uint64_t)m, (int64_t)k, key->batch, key->strideA, key);
    else              matmul_layout(&p->layB, CUDA_R_16BF, (uint64_t)m, (uint64_t)k, (int64_t)m, key->batch, key->strideA, key);
    /* C = D (ours, row-major [m,n]): rows n, cols m, ld n */
    matmul_layout(&p->layC, key->c_fp32 ? CUDA_R_32F : CUDA_R_16BF, (uint64_t)n, (uint64_t)m, (int64_t)n, key->batch,
                  key->strideC, key);

    cublasLtMatmulPreference_t pref;
    matmul_check(cublasLtMatmulPreferenceCreate(&pref), "MatmulPreferenceCreate", key);
    uint64_t ws = MATMUL_WORKSPACE_BYTES;
    uint32_t alA = (uint32_t)key->alignB, alB = (uint32_t)key->alignA, alC = (uint32_t)key->alignC; /* A' is our B */
    matmul_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "MatmulPreferenceSetAttribute(WORKSPACE)", key);
    matmul_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alA, sizeof(alA)), "MatmulPreferenceSetAttribute(ALIGN_A)", key);
    matmul_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alB, sizeof(alB)), "MatmulPreferenceSetAttribute(ALIGN_B)", key);
    matmul_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alC, sizeof(alC)), "MatmulPreferenceSetAttribute(ALIGN_C)", key);
    matmul_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alC, sizeof(alC)), "MatmulPreferenceSetAttribute(ALIGN_D)", key);

    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    int returned = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_cublaslt, p->desc, p->layA, p->layB, p->layC, p->layC, pref, 1, &res, &returned);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (st == CUBLAS_STATUS_SUCCESS && (returned < 1 || res.state != CUBLAS_STATUS_SUCCESS)) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
        /* no algorithm for these alignments: ask again without alignment preferences */
        cublasStatus_t st1 = st;
        matmul_check(cublasLtMatmulPreferenceCreate(&pref), "MatmulPreferenceCreate", key);
        matmul_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "MatmulPreferenceSetAttribute(WORKSPACE)", key);
        memset(&res, 0, sizeof(res));
        returned = 0;
        st = cublasLtMatmulAlgoGetHeuristic(g_cublaslt, p->desc, p->layA, p->layB, p->layC, p->layC, pref, 1, &res, &returned);
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        if (st == CUBLAS_STATUS_SUCCESS && (returned < 1 || res.state != CUBLAS_STATUS_SUCCESS)) st = CUBLAS_STATUS_NOT_SUPPORTED;
        if (st != CUBLAS_STATUS_SUCCESS) {
            char shape[320];
            matmul_shape_string(shape, sizeof(shape), key);
            tsdc_fail("cuBLASLt has no algorithm for GEMM %s: the heuristic returned none for these pointer alignments (%s) nor "
                      "without alignment preferences (%s)", shape, cublasLtGetStatusString(st1), cublasLtGetStatusString(st));
        }
    }
    matmul_check(st, "MatmulAlgoGetHeuristic", key);
    p->algo = res.algo;
    g_matmul_nplans++;
    return p;
}

/* Row-major C[m,n] = alpha op(A) op(B) + beta C (see the top of the file). C is bf16 (c_fp32 0) or
 * fp32 (c_fp32 1). batch >= 1; strides in elements (ignored when batch == 1). */
static void matmul_bf16(void* C, int c_fp32, const bf16* A, const bf16* B, int m, int n, int k, int transA, int transB,
                        float alpha, float beta, int batch, long strideA, long strideB, long strideC, cudaStream_t stream) {
    MatmulKey key;
    memset(&key, 0, sizeof(key));
    key.m = m; key.n = n; key.k = k;
    key.transA = transA ? 1 : 0; key.transB = transB ? 1 : 0; key.c_fp32 = c_fp32 ? 1 : 0;
    key.batch = batch; key.beta_nonzero = beta != 0.0f;
    key.strideA = batch > 1 ? strideA : 0; key.strideB = batch > 1 ? strideB : 0; key.strideC = batch > 1 ? strideC : 0;
    key.alignA = matmul_ptr_alignment(A); key.alignB = matmul_ptr_alignment(B); key.alignC = matmul_ptr_alignment(C);
    if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) matmul_check(CUBLAS_STATUS_INVALID_VALUE, "argument check (sizes must be > 0)", &key);
    if (!g_cublaslt) tsdc_fail("matmul_bf16 called before matmul_init()");
    const MatmulPlan* p = matmul_plan(&key);
    matmul_check(cublasLtMatmul(g_cublaslt, p->desc, &alpha, B, p->layA, A, p->layB, &beta, C, p->layC, C, p->layC,
                                &p->algo, g_matmul_workspace, MATMUL_WORKSPACE_BYTES, stream),
                 "Matmul", &key);
    cudaCheck(cudaGetLastError());
    /* 2 m n k a problem; A and B read once, C read where beta != 0, written once */
    launch_account(COST_GEMM, "cublasLtMatmul", COST_TC, 1, 2.0 * m * n * k * batch,
                   (double)batch * ((double)m * k * 2 + (double)k * n * 2 + (beta != 0.0f ? (double)m * n * (c_fp32 ? 4 : 2) : 0.0)),
                   (double)batch * m * n * (c_fp32 ? 4 : 2));
}

/* ---------------------------------------------------------------------------- linear layers */
/* y[N,O] = x[N,I] W^T, W [O,I]: m N, n O, k I; A = x stored [m,k]; B = W stored [n,k] (transB 1) */
static void linear_forward(bf16* y, const bf16* x, const bf16* W, int N, int I, int O, cudaStream_t stream) {
    matmul_bf16(y, 0, x, W, N, O, I, 0, 1, 1.0f, 0.0f, 1, 0, 0, 0, stream);
}
/* dx[N,I] (= or +=) dy[N,O] W[O,I], fp32: m N, n I, k O; A = dy stored [m,k]; B = W stored [k,n] */
static void linear_backward_dx(float* dx, const bf16* dy, const bf16* W, int N, int I, int O, int accumulate, cudaStream_t stream) {
    matmul_bf16(dx, 1, dy, W, N, I, O, 0, 0, 1.0f, accumulate ? 1.0f : 0.0f, 1, 0, 0, 0, stream);
}
/* dx[N,I] = dy[N,O] W[O,I] written as bf16 by the GEMM's epilogue (the fp32 sum rounded once, RN): where
 * a dx is one GEMM's alone (not summed over q/k/v or gate/up), the same bits as linear_backward_dx into
 * fp32 then f32_to_bf16, without the fp32 buffer and the conversion pass */
static void linear_backward_dx_bf16(bf16* dx, const bf16* dy, const bf16* W, int N, int I, int O, cudaStream_t stream) {
    matmul_bf16(dx, 0, dy, W, N, I, O, 0, 0, 1.0f, 0.0f, 1, 0, 0, 0, stream);
}
/* dW[O,I] (= or +=) dy[N,O]^T x[N,I], fp32: m O, n I, k N; A = dy stored [k,m] (transA 1); B = x stored
 * [k,n]. accumulate 0 (beta 0): the first microbatch overwrites the gradient, so no memset zeroes it. */
static void linear_backward_dw_acc(float* dW, const bf16* dy, const bf16* x, int N, int I, int O, int accumulate, cudaStream_t stream) {
    matmul_bf16(dW, 1, dy, x, O, I, N, 1, 0, 1.0f, accumulate ? 1.0f : 0.0f, 1, 0, 0, 0, stream);
}
static void linear_backward_dw(float* dW, const bf16* dy, const bf16* x, int N, int I, int O, cudaStream_t stream) {
    linear_backward_dw_acc(dW, dy, x, N, I, O, 1, stream);
}

#endif
