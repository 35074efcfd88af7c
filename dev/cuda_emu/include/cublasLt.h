/* cublasLt.h (CUDA emulation, dev/cuda_emu): the part of cuBLASLt that the project uses, run on the CPU
 * by dev/cuda_emu/cublaslt_emu.cpp. Names, enum values, struct layouts and signatures follow the
 * toolkit's cublasLt.h / cublas_api.h (CUDA 12/13); the declarations are written here so the emulated
 * build needs no CUDA toolkit.
 *
 * Semantics (cuBLAS documentation, "cuBLASLt API": cublasLtMatmul, cublasLtMatrixLayoutAttribute_t,
 * cublasLtMatmulDescAttributes_t, cublasLtMatmulPreferenceAttributes_t, and the doc comments of the
 * toolkit's cublasLt.h, quoted as [h]):
 *
 *   D = alpha * op(A) op(B) + beta * C, column-major. A layout describes a matrix as stored, before op:
 *   rows x cols, element (r, c) at base + r + c * ld, ld >= rows ([h] LD: "must be large enough so that
 *   matrix memory locations are not overlapping (e.g. greater or equal to ROWS in case of ORDER_COL)").
 *   op(A) is m x k, op(B) k x n, C and D m x n; op from CUBLASLT_MATMUL_DESC_TRANSA/TRANSB (default N).
 *   m = D.rows, n = D.cols, k = op(A).cols; op(A).rows must be m, op(B) must be k x n, C must be m x n.
 *   Batches: CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT (default 1) and STRIDED_BATCH_OFFSET (elements,
 *   default 0): batch i of an operand starts at base + i * offset elements; all four batch counts must
 *   be equal (an offset of 0 reuses one matrix for every batch).
 *
 * Supported (anything else: CUBLAS_STATUS_NOT_SUPPORTED, from AlgoGetHeuristic with 0 results, and
 * from Matmul): compute type CUBLAS_COMPUTE_32F (or _PEDANTIC), scale type CUDA_R_32F, host pointer
 * mode (alpha, beta are host floats), epilogue DEFAULT, ORDER_COL, strided batch mode, TRANSC N, and
 *     A, B both CUDA_R_16BF with C = D type CUDA_R_16BF or CUDA_R_32F, or
 *     A, B, C, D all CUDA_R_32F.
 *
 * Numerics (deterministic, independent of the number of threads and of the SIMD width chosen at run
 * time): each output element has ONE fp32 accumulator, starting at +0, to which the products
 * a(i,p) * b(p,j) (inputs converted exactly to fp32, each product rounded to fp32, no FMA) are added
 * for p = 0, 1, ..., k-1 in order. Then v = alpha * acc (rounded), and if beta != 0,
 * v = v + beta * C(i,j) (beta * C rounded, then the sum rounded). beta == 0 means C is not read at all
 * (NaN/Inf in C do not propagate). A bf16 D is rounded once from v, round to nearest even; fp32 D
 * stores v. With bf16 inputs every product is exact in fp32.
 *
 * Error statuses (the choices, and why):
 *   - null handle -> CUBLAS_STATUS_NOT_INITIALIZED ([h] cublasLtMatmul: "if cuBLASLt handle has not
 *     been initialized").
 *   - null descriptor/layout/preference/alpha/beta/output pointer, attribute buffer NULL or of the
 *     wrong size, unknown attribute -> CUBLAS_STATUS_INVALID_VALUE ([h] *SetAttribute: "if buf is NULL
 *     or sizeInBytes doesn't match size of internal storage for selected attribute").
 *   - inconsistent shapes (op(A), op(B), C, D), ld < rows, batch counts that differ, C == D with
 *     layouts that differ, workspace smaller than the algorithm's workspaceSize (or NULL when
 *     that is > 0), an algo not made by AlgoGetHeuristic -> CUBLAS_STATUS_INVALID_VALUE ([h]
 *     cublasLtMatmul: "if parameters are in conflict or in an impossible configuration; e.g. when
 *     workspaceSizeInBytes is less than workspace required by configured algo"). AlgoGetHeuristic
 *     reports the same configurations with INVALID_VALUE and 0 results. Layout creation does not
 *     check (its documented statuses are only ALLOC_FAILED / SUCCESS); the check happens at use.
 *   - a pointer less aligned than the algorithm requires -> CUBLAS_STATUS_NOT_SUPPORTED: the algorithm
 *     cannot run on it ([h] "NOT_SUPPORTED if current implementation on selected device doesn't support
 *     configured operation"; [h] PREF_MIN_ALIGNMENT_*: "Selecting a smaller value will exclude
 *     algorithms that can not work with matrix A that is not as strictly aligned as they need"; this is
 *     the status the real library gives for under-aligned operands, see pytorch/pytorch#92201,
 *     #97205, #76021). The algorithm requires, per operand, min(the preference's MIN_ALIGNMENT (default
 *     256), 16) bytes, where a batched operand's preference is first lowered to the alignment its batch
 *     offset (in bytes) guarantees; a preference below the element size finds no algorithm
 *     (NOT_SUPPORTED, 0 results).
 *   - AlgoGetHeuristic: requestedAlgoCount <= 0 -> INVALID_VALUE ([h]); otherwise one result, state
 *     SUCCESS, workspaceSize = min(PREF_MAX_WORKSPACE_BYTES (default 0), 64 KiB). Matmul overwrites
 *     the first workspaceSize bytes of the workspace (so a workspace smaller than announced is caught
 *     by the memory checker of the runtime emulation).
 *   - algo == NULL in cublasLtMatmul runs the heuristic with default preferences (alignment 256,
 *     no workspace), as the documentation of cublasLtMatmul describes.
 * Execution is synchronous on the calling thread (OpenMP inside); the stream argument is not used. */
#ifndef CUDA_EMU_CUBLASLT_H
#define CUDA_EMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>
#include "library_types.h"

/* the same typedef as the runtime emulation's cuda_runtime.h (an identical typedef twice is legal C++) */
typedef struct CUstream_st* cudaStream_t;

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- cublas_api.h */
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2,
    CUBLAS_OP_HERMITAN = 2,
    CUBLAS_OP_CONJG = 3
} cublasOperation_t;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_16F_PEDANTIC = 65,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_64F_PEDANTIC = 71,
    CUBLAS_COMPUTE_32I = 72,
    CUBLAS_COMPUTE_32I_PEDANTIC = 73
} cublasComputeType_t;

/* ---------------------------------------------------------------- cublasLt.h: handles */
typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cublasLtMatmulDescEmu* cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutEmu* cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceEmu* cublasLtMatmulPreference_t;

typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
    CUBLASLT_ORDER_COL = 0,
    CUBLASLT_ORDER_ROW = 1,
    CUBLASLT_ORDER_COL32 = 2,
    CUBLASLT_ORDER_COL4_4R2_8C = 3,
    CUBLASLT_ORDER_COL32_2R_4R4 = 4
} cublasLtOrder_t;

typedef enum {
    CUBLASLT_POINTER_MODE_HOST = 0,
    CUBLASLT_POINTER_MODE_DEVICE = 1
} cublasLtPointerMode_t;

/* attribute types in comments, as documented */
typedef enum {
    CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                 /* uint32_t (cudaDataType) */
    CUBLASLT_MATRIX_LAYOUT_ORDER = 1,                /* int32_t, default CUBLASLT_ORDER_COL */
    CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                 /* uint64_t */
    CUBLASLT_MATRIX_LAYOUT_COLS = 3,                 /* uint64_t */
    CUBLASLT_MATRIX_LAYOUT_LD = 4,                   /* int64_t */
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,          /* int32_t, default 1 */
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6, /* int64_t, default 0 */
    CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET = 7,         /* int64_t, default 0 */
    CUBLASLT_MATRIX_LAYOUT_BATCH_MODE = 8            /* uint32_t, default 0 (strided) */
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0, /* int32_t */
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,   /* int32_t */
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2, /* int32_t, default HOST */
    CUBLASLT_MATMUL_DESC_TRANSA = 3,       /* int32_t, default CUBLAS_OP_N */
    CUBLASLT_MATMUL_DESC_TRANSB = 4,       /* int32_t, default CUBLAS_OP_N */
    CUBLASLT_MATMUL_DESC_TRANSC = 5,       /* int32_t, default CUBLAS_OP_N */
    CUBLASLT_MATMUL_DESC_FILL_MODE = 6,    /* int32_t */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7      /* uint32_t, default CUBLASLT_EPILOGUE_DEFAULT */
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU = 32
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,           /* uint32_t */
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,   /* uint64_t, default 0 */
    CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3, /* uint32_t */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = 9,       /* float */
    CUBLASLT_MATMUL_PREF_IMPL_MASK = 12             /* uint64_t */
} cublasLtMatmulPreferenceAttributes_t;

/* ---------------------------------------------------------------- functions */
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char* cublasLtGetStatusString(cublasStatus_t status);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CUDA_EMU_CUBLASLT_H */
