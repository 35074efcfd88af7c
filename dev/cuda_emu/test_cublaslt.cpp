/* test_cublaslt.cpp: unit tests of the cuBLASLt emulation (dev/cuda_emu/cublaslt_emu.cpp), written from
 * the cuBLASLt documentation (see the semantics in include/cublasLt.h), against references written
 * here independently:
 *   - ref_f32: the documented order (one fp32 accumulator per output, k in order, product rounded to
 *     fp32 then added, v = alpha*acc + beta*C in fp32, bf16 D rounded once RNE): the emulation must
 *     match it bit for bit (this also pins determinism across threads and SIMD widths, since
 *     `make test-cublaslt` runs the tests with 2 threads, 1 thread, and SSE2 forced);
 *   - ref_f64: a double-precision product; the result must lie within k * 2^-24 * sum|a||b| (+ the
 *     bf16 rounding of D) of it, and be equal to it when the data make the fp32 sum exact.
 * Checked against planted bugs (each made the run fail): TRANSB ignored (75 failures), A read with
 * ld = rows (148), batch offset of B ignored (76), C read when beta == 0 (53), bf16 D truncated instead
 * of RNE (50), alignment not checked (3), workspace size not checked (3), k blocks summed in reverse
 * (2), batch counts not compared (2), C shape not checked (2).
 * Usage: test_cublaslt            run the tests; exit 1 on a failure
 *        test_cublaslt --bench [V] time the three GEMMs of a [64 x 2048] x [2048 x V] linear layer
 *                                  (V = 128256 by default) and print GFLOP/s. */
#pragma GCC optimize("fp-contract=off")

#include <cublasLt.h>
#include <cuda_emu_cublaslt_stats.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

static int g_pass = 0, g_fail = 0;
static void report(bool ok, const std::string& name, const std::string& why = "") {
    if (ok) {
        g_pass++;
        printf("OK      %s\n", name.c_str());
    } else {
        g_fail++;
        printf("NOT OK  %s%s%s\n", name.c_str(), why.empty() ? "" : ": ", why.c_str());
    }
}

/* ------------------------------------------------------------------ helpers written for the test */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float urand() { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); } /* [-1, 1) */

static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* round to nearest even on the 16 dropped bits, computed with integer compares (not the +0x7fff trick) */
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (std::isnan(f)) return (uint16_t)((u >> 16) | 0x0040);
    uint32_t hi = u >> 16, lo = u & 0xffff;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) hi++;
    return (uint16_t)hi;
}

/* a typed, batched, column-major buffer: element (r, c) of batch b at b * off + r + c * ld */
struct Mat {
    cudaDataType_t type;
    int64_t rows, cols, ld, off;
    int batch;
    size_t n_elems;
    void* p;
    size_t es() const { return type == CUDA_R_16BF ? 2 : 4; }
    int64_t idx(int b, int64_t r, int64_t c) const { return b * off + r + c * ld; }
    float get(int64_t i) const { return type == CUDA_R_16BF ? bf2f(((uint16_t*)p)[i]) : ((float*)p)[i]; }
    void set(int64_t i, float v) {
        if (type == CUDA_R_16BF) ((uint16_t*)p)[i] = f2bf(v);
        else ((float*)p)[i] = v;
    }
    uint32_t bits(int64_t i) const {
        if (type == CUDA_R_16BF) return ((uint16_t*)p)[i];
        uint32_t u;
        memcpy(&u, (float*)p + i, 4);
        return u;
    }
};
static Mat mat_alloc(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t off) {
    Mat m;
    m.type = t;
    m.rows = rows;
    m.cols = cols;
    m.ld = ld;
    m.batch = batch;
    m.off = off;
    m.n_elems = (size_t)((batch - 1) * off + ld * (cols > 0 ? cols : 1) + 64);
    size_t bytes = (m.n_elems * m.es() + 255) / 256 * 256;
    m.p = aligned_alloc(256, bytes);
    return m;
}
static const uint32_t SENT32 = 0x7fc0beefu; /* a NaN nobody computes */
static const uint16_t SENT16 = 0x7fc5;
static void mat_sentinel(Mat& m) {
    for (size_t i = 0; i < m.n_elems; i++) {
        if (m.type == CUDA_R_16BF) ((uint16_t*)m.p)[i] = SENT16;
        else memcpy((float*)m.p + i, &SENT32, 4);
    }
}
static bool is_sentinel(const Mat& m, size_t i) { return m.bits(i) == (m.type == CUDA_R_16BF ? SENT16 : SENT32); }

/* RAII for the descriptors */
struct Lt {
    cublasLtHandle_t h = nullptr;
    Lt() { cublasLtCreate(&h); }
    ~Lt() { cublasLtDestroy(h); }
};
static cublasLtMatrixLayout_t layout(const Mat& m) {
    cublasLtMatrixLayout_t l;
    cublasLtMatrixLayoutCreate(&l, m.type, (uint64_t)m.rows, (uint64_t)m.cols, m.ld);
    if (m.batch > 1) {
        int32_t bc = m.batch;
        int64_t off = m.off;
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc));
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off, sizeof(off));
    }
    return l;
}
static cublasLtMatmulDesc_t desc(int ta, int tb) {
    cublasLtMatmulDesc_t d;
    cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &a, sizeof(a));
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &b, sizeof(b));
    return d;
}
static cublasLtMatmulPreference_t pref(uint64_t ws, uint32_t al_a, uint32_t al_b, uint32_t al_c, uint32_t al_d) {
    cublasLtMatmulPreference_t p;
    cublasLtMatmulPreferenceCreate(&p);
    cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
    cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
    cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
    cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
    return p;
}

/* ------------------------------------------------------------------ the GEMM cases */
struct Case {
    int64_t m, n, k;
    int ta, tb;
    cudaDataType_t tab, tcd;
    int batch;
    int64_t ldpad, gap; /* ld = rows + ldpad; batch offset = ld * cols + gap */
    float alpha, beta;
    bool inplace;
    int data; /* 0: random in [-1,1) rounded to the input type; 1: small integers / 8 (fp32 sums exact) */
    int bcastA; /* 1: A's batch offset is 0 (one A for every batch) */
};

static const char* tname(cudaDataType_t t) { return t == CUDA_R_16BF ? "bf16" : "f32"; }
static std::string case_name(const Case& c) {
    char s[200];
    snprintf(s, sizeof(s), "gemm %lldx%lldx%lld op%c%c %s->%s batch%d ldpad%lld gap%lld alpha%g beta%g %s%s",
             (long long)c.m, (long long)c.n, (long long)c.k, c.ta ? 'T' : 'N', c.tb ? 'T' : 'N', tname(c.tab),
             tname(c.tcd), c.batch, (long long)c.ldpad, (long long)c.gap, c.alpha, c.beta,
             c.inplace ? "C==D" : "C!=D", c.data ? " exact-data" : c.bcastA ? " A-offset0" : "");
    return s;
}

static Mat operand(cudaDataType_t t, int64_t rows, int64_t cols, const Case& c) {
    const int64_t ld = rows + c.ldpad;
    return mat_alloc(t, rows, cols, ld, c.batch, c.batch > 1 ? ld * cols + c.gap : 0);
}
static void fill(Mat& m, int data) {
    mat_sentinel(m);
    for (int b = 0; b < m.batch; b++)
        for (int64_t cc = 0; cc < m.cols; cc++)
            for (int64_t r = 0; r < m.rows; r++)
                m.set(m.idx(b, r, cc), data ? (float)((int)(rnd() % 17) - 8) / 8.0f : urand());
}

/* run one case; returns "" or why it failed */
static std::string run_case(const Case& c) {
    Lt lt;
    Mat A = c.ta ? operand(c.tab, c.k, c.m, c) : operand(c.tab, c.m, c.k, c);
    Mat B = c.tb ? operand(c.tab, c.n, c.k, c) : operand(c.tab, c.k, c.n, c);
    Mat C = operand(c.tcd, c.m, c.n, c);
    if (c.bcastA) A.off = 0;
    fill(A, c.data);
    fill(B, c.data);
    fill(C, c.data);
    if (c.beta == 0.0f) /* beta == 0: C must not be read; NaN there must not reach D */
        for (int b = 0; b < C.batch; b++)
            for (int64_t j = 0; j < c.n; j++)
                for (int64_t i = 0; i < c.m; i++) C.set(C.idx(b, i, j), NAN);
    std::vector<float> C0(C.n_elems);
    for (size_t i = 0; i < C.n_elems; i++) C0[i] = C.get((int64_t)i);
    Mat D = C;
    if (!c.inplace) {
        D = operand(c.tcd, c.m, c.n, c);
        mat_sentinel(D);
    }
    cublasLtMatmulDesc_t d = desc(c.ta, c.tb);
    cublasLtMatrixLayout_t la = layout(A), lb = layout(B), lc = layout(C), ldd = layout(D);
    cublasLtMatmulPreference_t p = pref(1 << 20, 256, 256, 256, 256);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    int nres = -1;
    std::string why;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt.h, d, la, lb, lc, ldd, p, 1, &res, &nres);
    std::vector<char> ws(res.workspaceSize + 1);
    if (st != CUBLAS_STATUS_SUCCESS || nres != 1 || res.state != CUBLAS_STATUS_SUCCESS)
        why = std::string("heuristic: ") + cublasLtGetStatusString(st);
    else {
        unsigned long long calls0 = cublaslt_emu_matmul_calls();
        st = cublasLtMatmul(lt.h, d, &c.alpha, A.p, la, B.p, lb, &c.beta, C.p, lc, D.p, ldd, &res.algo, ws.data(),
                            res.workspaceSize, nullptr);
        if (st != CUBLAS_STATUS_SUCCESS) why = std::string("matmul: ") + cublasLtGetStatusString(st);
        else if (cublaslt_emu_matmul_calls() != calls0 + 1) why = "matmul call counter not incremented";
    }
    /* compare */
    long bad_exact = 0, bad_bound = 0, bad_untouched = 0;
    std::vector<char> inside(D.n_elems, 0);
    for (int b = 0; b < c.batch && why.empty(); b++)
        for (int64_t j = 0; j < c.n; j++)
            for (int64_t i = 0; i < c.m; i++) {
                float acc = 0.0f;
                double dref = 0.0, mag = 0.0;
                for (int64_t q = 0; q < c.k; q++) {
                    float a = A.get(c.ta ? A.idx(b, q, i) : A.idx(b, i, q));
                    float bb = B.get(c.tb ? B.idx(b, j, q) : B.idx(b, q, j));
                    float prod = a * bb;
                    acc = acc + prod;
                    dref += (double)a * (double)bb;
                    mag += fabs((double)a * (double)bb);
                }
                float v = c.alpha * acc;
                double vd = (double)c.alpha * dref;
                if (c.beta != 0.0f) {
                    float cv = C0[C.idx(b, i, j)];
                    float bc = c.beta * cv;
                    v = v + bc;
                    vd += (double)c.beta * (double)cv;
                }
                const int64_t di = D.idx(b, i, j);
                inside[di] = 1;
                const float got = D.get(di);
                float want = c.tcd == CUDA_R_16BF ? bf2f(f2bf(v)) : v;
                uint32_t wb;
                memcpy(&wb, &want, 4);
                const uint32_t want_bits = c.tcd == CUDA_R_16BF ? (wb >> 16) : wb;
                if (D.bits(di) != want_bits) bad_exact++;
                /* error bound vs double: k u sum|ab| (+ rounding of alpha*, beta*, +) + bf16 half ulp */
                double bound = fabs((double)c.alpha) * (c.k * ldexp(1.0, -24) * mag) * 1.0000001 +
                               4 * ldexp(1.0, -24) * (fabs(vd) + fabs((double)c.alpha) * mag + 1e-30);
                if (c.tcd == CUDA_R_16BF) bound += ldexp(1.0, -8) * (fabs(vd) + bound);
                if (c.data && c.tcd == CUDA_R_32F && c.alpha == 1.0f && (c.beta == 0.0f || c.beta == 1.0f))
                    bound = 0.0; /* small integers / 8: every fp32 operation is exact */
                if (!(fabs((double)got - vd) <= bound)) {
                    if (bad_bound == 0) {
                        char s[160];
                        snprintf(s, sizeof(s), "first bound miss b%d (%lld,%lld): got %.9g want %.9g (bound %.3g)", b,
                                 (long long)i, (long long)j, got, vd, bound);
                        why = s;
                    }
                    bad_bound++;
                }
            }
    if (why.empty() || bad_bound) {
        for (size_t i = 0; i < D.n_elems; i++)
            if (!inside[i]) {
                bool same = c.inplace ? (D.bits(i) == (C.type == CUDA_R_16BF ? f2bf(C0[i]) : [&] {
                    uint32_t u;
                    memcpy(&u, &C0[i], 4);
                    return u;
                }()) || (std::isnan(C0[i]) && std::isnan(D.get((int64_t)i))))
                                      : is_sentinel(D, i);
                if (!same) bad_untouched++;
            }
    }
    if (why.empty() && bad_exact) why = std::to_string(bad_exact) + " elements differ from the documented fp32 order";
    if (why.empty() && bad_untouched) why = std::to_string(bad_untouched) + " elements outside D were written";
    if (!why.empty() && bad_untouched && why.find("outside") == std::string::npos)
        why += "; " + std::to_string(bad_untouched) + " elements outside D were written";
    cublasLtMatmulPreferenceDestroy(p);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ldd);
    cublasLtMatmulDescDestroy(d);
    free(A.p);
    free(B.p);
    free(C.p);
    if (!c.inplace) free(D.p);
    return why;
}

/* ------------------------------------------------------------------ error statuses */
struct ErrSetup { /* a valid bf16 7x13x5 NN problem with fp32 C = D, ready to be broken */
    Lt lt;
    Mat A, B, C;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    float alpha = 1.0f, beta = 0.0f;
    std::vector<char> ws = std::vector<char>(1 << 20);
    cublasLtMatmulPreference_t p = pref(0, 256, 256, 256, 256);   /* the default: no workspace, 256-byte alignment */
    ErrSetup() {
        Case c{7, 13, 5, 0, 0, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, 1.0f, 0.0f, false, 0};
        A = operand(CUDA_R_16BF, 7, 5, c);
        B = operand(CUDA_R_16BF, 5, 13, c);
        C = operand(CUDA_R_32F, 7, 13, c);
        fill(A, 0);
        fill(B, 0);
        fill(C, 0);
        d = desc(0, 0);
        la = layout(A);
        lb = layout(B);
        lc = layout(C);
    }
    ~ErrSetup() {
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(d);
        cublasLtMatmulPreferenceDestroy(p);
        free(A.p);
        free(B.p);
        free(C.p);
    }
    /* heuristic with the given preference, then matmul; pointers may be offset by elements */
    cublasStatus_t heur(cublasLtMatmulPreference_t p, cublasLtMatmulHeuristicResult_t* r, int* n,
                        cublasLtMatrixLayout_t a = nullptr, cublasLtMatrixLayout_t b = nullptr,
                        cublasLtMatrixLayout_t cc = nullptr, cublasLtMatrixLayout_t dd = nullptr) {
        memset(r, 0, sizeof(*r));
        *n = -1;
        return cublasLtMatmulAlgoGetHeuristic(lt.h, d, a ? a : la, b ? b : lb, cc ? cc : lc, dd ? dd : lc, p, 1, r, n);
    }
    cublasStatus_t mm(const cublasLtMatmulAlgo_t* algo, size_t wsb, cublasLtMatrixLayout_t a = nullptr,
                      cublasLtMatrixLayout_t b = nullptr, cublasLtMatrixLayout_t cc = nullptr,
                      cublasLtMatrixLayout_t dd = nullptr, int offA = 0, void* Dp = nullptr) {
        return cublasLtMatmul(lt.h, d, &alpha, (uint16_t*)A.p + offA, a ? a : la, B.p, b ? b : lb, &beta, C.p,
                              cc ? cc : lc, Dp ? Dp : C.p, dd ? dd : lc, algo, ws.data(), wsb, nullptr);
    }
};

static void expect(const char* name, cublasStatus_t got, cublasStatus_t want, const char* bug) {
    std::string why;
    if (got != want)
        why = std::string("got ") + cublasLtGetStatusString(got) + ", want " + cublasLtGetStatusString(want) + " (" +
              bug + ")";
    report(got == want, name, why);
}

static void test_errors() {
    cublasLtMatmulHeuristicResult_t r;
    int n;
    /* the valid setup works (catches: the error tests below passing only because everything fails) */
    {
        ErrSetup s;
        cublasStatus_t st = s.heur(s.p, &r, &n);
        expect("errors: valid setup heuristic", st, CUBLAS_STATUS_SUCCESS, "valid problem rejected");
        report(n == 1 && r.state == CUBLAS_STATUS_SUCCESS, "errors: valid setup returns one algo");
        expect("errors: valid setup matmul", s.mm(&r.algo, 0), CUBLAS_STATUS_SUCCESS, "valid problem rejected");
        expect("errors: algo NULL runs the default heuristic", s.mm(nullptr, 0), CUBLAS_STATUS_SUCCESS,
               "NULL algo not supported");
        cublasLtMatmulAlgo_t junk;
        memset(&junk, 0, sizeof(junk));
        expect("errors: algo not from the heuristic", s.mm(&junk, 0), CUBLAS_STATUS_INVALID_VALUE,
               "garbage algo accepted");
        /* C == NULL with beta == 0 is fine (C not read); with beta != 0 it is not */
        st = cublasLtMatmul(s.lt.h, s.d, &s.alpha, s.A.p, s.la, s.B.p, s.lb, &s.beta, nullptr, s.lc, s.C.p, s.lc,
                            &r.algo, nullptr, 0, nullptr);
        expect("errors: C NULL with beta 0 is allowed", st, CUBLAS_STATUS_SUCCESS, "C read although beta == 0");
        float one = 1.0f;
        st = cublasLtMatmul(s.lt.h, s.d, &s.alpha, s.A.p, s.la, s.B.p, s.lb, &one, nullptr, s.lc, s.C.p, s.lc,
                            &r.algo, nullptr, 0, nullptr);
        expect("errors: C NULL with beta 1", st, CUBLAS_STATUS_INVALID_VALUE, "NULL C dereferenced");
    }
    /* null handle (catches: a matmul that ignores the handle) */
    {
        ErrSetup s;
        s.heur(s.p, &r, &n);
        cublasStatus_t st = cublasLtMatmul(nullptr, s.d, &s.alpha, s.A.p, s.la, s.B.p, s.lb, &s.beta, s.C.p, s.lc,
                                           s.C.p, s.lc, &r.algo, nullptr, 0, nullptr);
        expect("errors: matmul null handle", st, CUBLAS_STATUS_NOT_INITIALIZED, "null handle accepted");
        st = cublasLtMatmulAlgoGetHeuristic(nullptr, s.d, s.la, s.lb, s.lc, s.lc, s.p, 1, &r, &n);
        expect("errors: heuristic null handle", st, CUBLAS_STATUS_NOT_INITIALIZED, "null handle accepted");
        st = cublasLtMatmul(s.lt.h, nullptr, &s.alpha, s.A.p, s.la, s.B.p, s.lb, &s.beta, s.C.p, s.lc, s.C.p, s.lc,
                            &r.algo, nullptr, 0, nullptr);
        expect("errors: matmul null descriptor", st, CUBLAS_STATUS_INVALID_VALUE, "null descriptor dereferenced");
        st = cublasLtMatmul(s.lt.h, s.d, &s.alpha, s.A.p, nullptr, s.B.p, s.lb, &s.beta, s.C.p, s.lc, s.C.p, s.lc,
                            &r.algo, nullptr, 0, nullptr);
        expect("errors: matmul null layout", st, CUBLAS_STATUS_INVALID_VALUE, "null layout dereferenced");
        st = s.heur(s.p, &r, &n);
        int n0 = 7;
        st = cublasLtMatmulAlgoGetHeuristic(s.lt.h, s.d, s.la, s.lb, s.lc, s.lc, s.p, 0, &r, &n0);
        expect("errors: heuristic requestedAlgoCount 0", st, CUBLAS_STATUS_INVALID_VALUE, "count not checked");
    }
    /* attribute sizes (catches: a SetAttribute that copies whatever size it is given) */
    {
        ErrSetup s;
        int64_t big = 1;
        int32_t small = 1;
        expect("errors: desc attribute of the wrong size",
               cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_TRANSA, &big, sizeof(big)),
               CUBLAS_STATUS_INVALID_VALUE, "size not checked");
        expect("errors: desc attribute NULL buffer",
               cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4), CUBLAS_STATUS_INVALID_VALUE,
               "NULL buffer read");
        expect("errors: layout LD attribute of the wrong size",
               cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_LD, &small, sizeof(small)),
               CUBLAS_STATUS_INVALID_VALUE, "size not checked");
        expect("errors: layout BATCH_COUNT attribute of the wrong size",
               cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &big, sizeof(big)),
               CUBLAS_STATUS_INVALID_VALUE, "size not checked");
        cublasLtMatmulPreference_t p;
        cublasLtMatmulPreferenceCreate(&p);
        expect("errors: preference alignment attribute of the wrong size",
               cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &big, sizeof(big)),
               CUBLAS_STATUS_INVALID_VALUE, "size not checked");
        expect("errors: preference workspace attribute of the wrong size",
               cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &small, sizeof(small)),
               CUBLAS_STATUS_INVALID_VALUE, "size not checked");
        cublasLtMatmulPreferenceDestroy(p);
    }
    /* ld < rows (catches: no ld check, reads overlapping columns) */
    {
        ErrSetup s;
        cublasLtMatrixLayout_t bad;
        cublasLtMatrixLayoutCreate(&bad, CUDA_R_16BF, 7, 5, 6);
        cublasStatus_t st = s.heur(s.p, &r, &n, bad);
        expect("errors: heuristic ld < rows", st, CUBLAS_STATUS_INVALID_VALUE, "ld not checked");
        report(n == 0, "errors: heuristic ld < rows returns 0 algos");
        s.heur(s.p, &r, &n);
        expect("errors: matmul ld < rows", s.mm(&r.algo, 0, bad), CUBLAS_STATUS_INVALID_VALUE, "ld not checked");
        cublasLtMatrixLayout_t badc;
        cublasLtMatrixLayoutCreate(&badc, CUDA_R_32F, 7, 13, 3);
        expect("errors: matmul ld < rows on D", s.mm(&r.algo, 0, nullptr, nullptr, badc, badc),
               CUBLAS_STATUS_INVALID_VALUE, "ld of D not checked");
        cublasLtMatrixLayoutDestroy(bad);
        cublasLtMatrixLayoutDestroy(badc);
    }
    /* shapes (catches: m, n or k taken from one layout without checking the others) */
    {
        ErrSetup s;
        s.heur(s.p, &r, &n);
        cublasLtMatrixLayout_t a6, b6, c8, d14;
        cublasLtMatrixLayoutCreate(&a6, CUDA_R_16BF, 7, 6, 7);   /* k 6 vs B's 5 */
        cublasLtMatrixLayoutCreate(&b6, CUDA_R_16BF, 5, 14, 5);  /* n 14 vs C's 13 */
        cublasLtMatrixLayoutCreate(&c8, CUDA_R_32F, 8, 13, 8);   /* C rows 8 vs m 7 */
        cublasLtMatrixLayoutCreate(&d14, CUDA_R_32F, 7, 14, 7);  /* D cols 14 vs C's 13 */
        expect("errors: k of op(A) != k of op(B)", s.mm(&r.algo, 0, a6), CUBLAS_STATUS_INVALID_VALUE, "k mismatch");
        expect("errors: n of op(B) != n of C/D", s.mm(&r.algo, 0, nullptr, b6), CUBLAS_STATUS_INVALID_VALUE,
               "n mismatch");
        std::vector<float> Dbuf(8 * 14 + 64); /* D apart from C, so that only the shape is wrong */
        expect("errors: C rows != m", s.mm(&r.algo, 0, nullptr, nullptr, c8, nullptr, 0, Dbuf.data()),
               CUBLAS_STATUS_INVALID_VALUE, "C shape not checked");
        expect("errors: heuristic C rows != m", s.heur(s.p, &r, &n, nullptr, nullptr, c8), CUBLAS_STATUS_INVALID_VALUE,
               "C shape not checked");
        s.heur(s.p, &r, &n);
        expect("errors: D cols != C cols", s.mm(&r.algo, 0, nullptr, nullptr, nullptr, d14, 0, Dbuf.data()),
               CUBLAS_STATUS_INVALID_VALUE, "D shape not checked");
        cublasStatus_t st = s.heur(s.p, &r, &n, a6);
        expect("errors: heuristic k mismatch", st, CUBLAS_STATUS_INVALID_VALUE, "k mismatch");
        /* TRANSA makes the same layouts inconsistent (catches: op ignored in the shape check) */
        int32_t t = CUBLAS_OP_T;
        cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
        st = s.heur(s.p, &r, &n);
        expect("errors: TRANSA T makes 7x5 A inconsistent", st, CUBLAS_STATUS_INVALID_VALUE, "op ignored in checks");
        for (auto l : {a6, b6, c8, d14}) cublasLtMatrixLayoutDestroy(l);
    }
    /* batch counts (catches: batch count of D used for all operands unchecked) */
    {
        ErrSetup s;
        s.heur(s.p, &r, &n);
        cublasLtMatrixLayout_t a3;
        cublasLtMatrixLayoutCreate(&a3, CUDA_R_16BF, 7, 5, 7);
        int32_t three = 3;
        int64_t off = 0;
        cublasLtMatrixLayoutSetAttribute(a3, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &three, sizeof(three));
        cublasLtMatrixLayoutSetAttribute(a3, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off, sizeof(off));
        expect("errors: batch count of A 3, others 1", s.mm(&r.algo, 0, a3), CUBLAS_STATUS_INVALID_VALUE,
               "batch counts not compared");
        cublasStatus_t st = s.heur(s.p, &r, &n, a3);
        expect("errors: heuristic batch count mismatch", st, CUBLAS_STATUS_INVALID_VALUE, "batch counts not compared");
        cublasLtMatrixLayoutDestroy(a3);
    }
    /* alignment (catches: preference alignment ignored / not stored in the algo) */
    {
        ErrSetup s;
        cublasLtMatmulPreference_t p16 = pref(0, 16, 256, 256, 256), p2 = pref(0, 2, 256, 256, 256);
        cublasLtMatmulPreference_t p1 = pref(0, 1, 256, 256, 256);
        cublasLtMatrixLayout_t a;
        cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, 7, 5, 7);
        s.heur(p16, &r, &n);
        expect("errors: A 2-byte aligned, algo for 16-byte alignment", s.mm(&r.algo, 0, a, nullptr, nullptr, nullptr, 1),
               CUBLAS_STATUS_NOT_SUPPORTED, "misaligned pointer accepted");
        expect("errors: A 16-byte aligned, algo for 16-byte alignment", s.mm(&r.algo, 0, a, nullptr, nullptr, nullptr, 8),
               CUBLAS_STATUS_SUCCESS, "aligned pointer rejected");
        s.heur(p2, &r, &n);
        expect("errors: A 2-byte aligned, algo for 2-byte alignment", s.mm(&r.algo, 0, a, nullptr, nullptr, nullptr, 1),
               CUBLAS_STATUS_SUCCESS, "algo not valid for the alignment asked");
        s.heur(p2, &r, &n);
        expect("errors: default preference (256) requires 16 bytes", s.mm(nullptr, 0, a, nullptr, nullptr, nullptr, 4),
               CUBLAS_STATUS_NOT_SUPPORTED, "default alignment not enforced");
        cublasStatus_t st = s.heur(p1, &r, &n);
        expect("errors: alignment preference below the element size", st, CUBLAS_STATUS_NOT_SUPPORTED,
               "impossible alignment accepted");
        report(n == 0, "errors: alignment below element size returns 0 algos");
        /* D misaligned against a 16-byte preference */
        cublasLtMatmulPreference_t pd = pref(0, 256, 256, 256, 16);
        s.heur(pd, &r, &n);
        std::vector<float> Dbuf(7 * 13 + 64 + 16);
        float* Dp = (float*)(((uintptr_t)Dbuf.data() + 63) / 64 * 64) + 1;
        expect("errors: D 4-byte aligned, algo for 16-byte alignment",
               s.mm(&r.algo, 0, nullptr, nullptr, nullptr, nullptr, 0, Dp), CUBLAS_STATUS_NOT_SUPPORTED,
               "misaligned D accepted");
        cublasLtMatrixLayoutDestroy(a);
        for (auto q : {p16, p2, p1, pd}) cublasLtMatmulPreferenceDestroy(q);
    }
    /* workspace (catches: workspace requirement not checked / not stored) */
    {
        ErrSetup s;
        cublasLtMatmulPreference_t p = pref(1 << 20, 256, 256, 256, 256);
        s.heur(p, &r, &n);
        report(r.workspaceSize > 0 && r.workspaceSize <= (1u << 20), "errors: heuristic workspace within the maximum");
        expect("errors: workspace one byte too small", s.mm(&r.algo, r.workspaceSize - 1), CUBLAS_STATUS_INVALID_VALUE,
               "workspace size not checked");
        cublasStatus_t st = cublasLtMatmul(s.lt.h, s.d, &s.alpha, s.A.p, s.la, s.B.p, s.lb, &s.beta, s.C.p, s.lc,
                                           s.C.p, s.lc, &r.algo, nullptr, r.workspaceSize, nullptr);
        expect("errors: workspace NULL", st, CUBLAS_STATUS_INVALID_VALUE, "NULL workspace accepted");
        memset(s.ws.data(), 0, s.ws.size());
        expect("errors: workspace exactly the size", s.mm(&r.algo, r.workspaceSize), CUBLAS_STATUS_SUCCESS,
               "exact workspace rejected");
        s.heur(s.p, &r, &n);
        report(r.workspaceSize == 0, "errors: no workspace allowed -> workspaceSize 0");
        cublasLtMatmulPreferenceDestroy(p);
    }
    /* unsupported configurations -> NOT_SUPPORTED, 0 algos (catches: silently computing something else) */
    {
        ErrSetup s;
        cublasLtMatrixLayout_t bf32, c16h, cbf;
        cublasLtMatrixLayoutCreate(&bf32, CUDA_R_32F, 5, 13, 5);
        cublasLtMatrixLayoutCreate(&c16h, CUDA_R_16F, 7, 13, 7);
        cublasLtMatrixLayoutCreate(&cbf, CUDA_R_16BF, 7, 13, 7);
        expect("errors: A bf16 with B fp32", s.heur(s.p, &r, &n, nullptr, bf32), CUBLAS_STATUS_NOT_SUPPORTED,
               "mixed inputs accepted");
        report(n == 0, "errors: unsupported types return 0 algos");
        expect("errors: fp16 C/D", s.heur(s.p, &r, &n, nullptr, nullptr, c16h, c16h), CUBLAS_STATUS_NOT_SUPPORTED,
               "fp16 accepted");
        expect("errors: C fp32 with D bf16", s.heur(s.p, &r, &n, nullptr, nullptr, nullptr, cbf),
               CUBLAS_STATUS_NOT_SUPPORTED, "C type != D type accepted");
        cublasLtMatmulDesc_t d64;
        cublasLtMatmulDescCreate(&d64, CUBLAS_COMPUTE_64F, CUDA_R_64F);
        int nn = -1;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.lt.h, d64, s.la, s.lb, s.lc, s.lc, s.p, 1, &r, &nn);
        expect("errors: compute 64F", st, CUBLAS_STATUS_NOT_SUPPORTED, "compute type ignored");
        uint32_t relu = CUBLASLT_EPILOGUE_RELU;
        cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof(relu));
        expect("errors: epilogue RELU", s.heur(s.p, &r, &n), CUBLAS_STATUS_NOT_SUPPORTED, "epilogue ignored");
        cublasLtMatmulDescDestroy(d64);
        for (auto l : {bf32, c16h, cbf}) cublasLtMatrixLayoutDestroy(l);
    }
    /* in place with different layouts (catches: C == D aliasing with another ld) */
    {
        ErrSetup s;
        s.heur(s.p, &r, &n);
        cublasLtMatrixLayout_t dl;
        cublasLtMatrixLayoutCreate(&dl, CUDA_R_32F, 7, 13, 8);
        expect("errors: C == D with a different ld", s.mm(&r.algo, 0, nullptr, nullptr, nullptr, dl),
               CUBLAS_STATUS_INVALID_VALUE, "in-place with different layouts accepted");
        cublasLtMatrixLayoutDestroy(dl);
    }
    /* failed calls are not counted; the workspace is used (catches: stats counting failures) */
    {
        ErrSetup s;
        cublasLtMatmulPreference_t p = pref(1 << 20, 256, 256, 256, 256);
        s.heur(p, &r, &n);
        unsigned long long c0 = cublaslt_emu_matmul_calls();
        s.mm(&r.algo, 0); /* too small */
        report(cublaslt_emu_matmul_calls() == c0, "stats: failed matmul not counted");
        memset(s.ws.data(), 0, s.ws.size());
        s.mm(&r.algo, r.workspaceSize);
        report(cublaslt_emu_matmul_calls() == c0 + 1, "stats: successful matmul counted");
        bool used = false;
        for (size_t i = 0; i < r.workspaceSize; i++) used |= s.ws[i] != 0;
        bool beyond = false;
        for (size_t i = r.workspaceSize; i < s.ws.size(); i++) beyond |= s.ws[i] != 0;
        report(used && !beyond, "workspace: written within workspaceSize only");
        cublasLtMatmulPreferenceDestroy(p);
    }
}

/* ------------------------------------------------------------------ determinism across thread counts */
static void test_threads() {
#ifdef _OPENMP
    /* catches: a reduction split over threads (results depending on the thread count) */
    Case c{150, 200, 700, 1, 0, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, 1.0f, 0.0f, false, 0};
    Lt lt;
    Mat A = operand(c.tab, c.k, c.m, c), B = operand(c.tab, c.k, c.n, c);
    fill(A, 0);
    fill(B, 0);
    Mat D1 = operand(CUDA_R_32F, c.m, c.n, c), D2 = operand(CUDA_R_32F, c.m, c.n, c);
    cublasLtMatmulDesc_t d = desc(1, 0);
    cublasLtMatrixLayout_t la = layout(A), lb = layout(B), lc = layout(D1);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    cublasStatus_t s1 = cublasLtMatmul(lt.h, d, &c.alpha, A.p, la, B.p, lb, &c.beta, nullptr, lc, D1.p, lc, nullptr,
                                       nullptr, 0, nullptr);
    omp_set_num_threads(nt > 1 ? nt : 2);
    cublasStatus_t s2 = cublasLtMatmul(lt.h, d, &c.alpha, A.p, la, B.p, lb, &c.beta, nullptr, lc, D2.p, lc, nullptr,
                                       nullptr, 0, nullptr);
    omp_set_num_threads(nt);
    report(s1 == CUBLAS_STATUS_SUCCESS && s2 == CUBLAS_STATUS_SUCCESS &&
               memcmp(D1.p, D2.p, sizeof(float) * c.m * c.n) == 0,
           "determinism: 1 thread and 2 threads give the same bits");
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
    free(A.p);
    free(B.p);
    free(D1.p);
    free(D2.p);
#endif
}

/* ------------------------------------------------------------------ bench */
static double bench_one(const char* name, int64_t M, int64_t N, int64_t K, int ta, int tb, cudaDataType_t tcd) {
    Lt lt;
    Case c{M, N, K, ta, tb, CUDA_R_16BF, tcd, 1, 0, 0, 1.0f, 0.0f, false, 0};
    Mat A = ta ? operand(CUDA_R_16BF, K, M, c) : operand(CUDA_R_16BF, M, K, c);
    Mat B = tb ? operand(CUDA_R_16BF, N, K, c) : operand(CUDA_R_16BF, K, N, c);
    Mat D = operand(tcd, M, N, c);
    memset(A.p, 0x3c, A.n_elems * 2);
    memset(B.p, 0x3c, B.n_elems * 2);
    cublasLtMatmulDesc_t d = desc(ta, tb);
    cublasLtMatrixLayout_t la = layout(A), lb = layout(B), lc = layout(D);
    auto t0 = std::chrono::steady_clock::now();
    cublasStatus_t st = cublasLtMatmul(lt.h, d, &c.alpha, A.p, la, B.p, lb, &c.beta, nullptr, lc, D.p, lc, nullptr,
                                       nullptr, 0, nullptr);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double gf = 2.0 * M * N * K / s / 1e9;
    printf("bench %-28s M %lld N %lld K %lld: %s, %.3f s, %.2f GFLOP/s\n", name, (long long)M, (long long)N,
           (long long)K, cublasLtGetStatusString(st), s, gf);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
    free(A.p);
    free(B.p);
    free(D.p);
    return gf;
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        const int64_t V = argc > 2 ? atoll(argv[2]) : 128256, T = 64, C = 2048;
        /* the project's linear layer y[T,V] = x[T,C] W[V,C]^T in cuBLAS terms (column-major, see llmc/cuda/matmul.cuh):
         * forward M=V N=T K=C (A = W op T), backward dx M=C N=T K=V (A = W op N), dW M=C N=V K=T (B = dy op T) */
        bench_one("forward (logits)", V, T, C, 1, 0, CUDA_R_16BF);
        bench_one("backward dx", C, T, V, 0, 0, CUDA_R_16BF);
        bench_one("backward dW (fp32 out)", C, V, T, 0, 1, CUDA_R_32F);
        return 0;
    }
    /* every op combination x types x batch x beta x in-place, on a shape that is a multiple of nothing */
    const cudaDataType_t types[3][2] = {{CUDA_R_16BF, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_32F, CUDA_R_32F}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (auto& t : types)
                for (int batch : {1, 3})
                    for (float beta : {0.0f, 1.0f, 0.5f})
                        for (bool inplace : {false, true}) {
                            /* catches: op ignored, wrong ld (ldpad 3), batch offset ignored or gap lost (gap 5),
                             * beta == 0 reading C (NaN), C != D mixed up, alpha dropped, wrong rounding */
                            Case c{7, 13, 5, ta, tb, t[0], t[1], batch, 3, 5, 1.5f, beta, inplace, 0};
                            std::string why = run_case(c);
                            report(why.empty(), case_name(c), why);
                        }
    /* bigger shapes across tile boundaries (MC 128, NC 96, KC 256), exact data: k-blocking, edges */
    {
        Case cs[] = {
            {200, 100, 600, 0, 0, CUDA_R_16BF, CUDA_R_32F, 1, 1, 0, 1.0f, 0.0f, false, 1},
            {200, 100, 600, 1, 1, CUDA_R_16BF, CUDA_R_32F, 2, 2, 7, 1.0f, 1.0f, true, 1},
            {131, 97, 257, 1, 0, CUDA_R_16BF, CUDA_R_16BF, 1, 0, 0, 1.0f, 0.0f, false, 1},
            {131, 97, 257, 0, 1, CUDA_R_32F, CUDA_R_32F, 3, 0, 0, 1.0f, 1.0f, false, 1},
            /* random data, large k: the error bound against double */
            {65, 70, 1000, 1, 0, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, 1.0f, 0.0f, false, 0},
            {65, 70, 1000, 0, 1, CUDA_R_32F, CUDA_R_32F, 1, 0, 0, -0.75f, 0.25f, false, 0},
            {33, 1, 300, 1, 0, CUDA_R_16BF, CUDA_R_16BF, 1, 0, 0, 1.0f, 0.0f, false, 0}, /* n = 1 */
            {1, 40, 9, 0, 0, CUDA_R_16BF, CUDA_R_32F, 4, 0, 0, 2.0f, 0.0f, false, 0},    /* m = 1 */
            /* batch offset 0: one A for every batch (broadcast) */
            {9, 11, 4, 1, 0, CUDA_R_16BF, CUDA_R_32F, 3, 2, 3, 1.0f, 0.5f, false, 0, 1},
        };
        for (const Case& c : cs) {
            std::string why = run_case(c);
            report(why.empty(), case_name(c), why);
        }
    }
    /* k == 0: D = beta * C (catches: uninitialised accumulators) */
    {
        Case c{5, 6, 0, 0, 0, CUDA_R_16BF, CUDA_R_32F, 1, 1, 0, 1.0f, 0.5f, false, 0}; /* ldpad 1: ld >= 1 for the 0-row B */
        std::string why = run_case(c);
        report(why.empty(), case_name(c), why);
    }
    test_errors();
    test_threads();
    printf("test_cublaslt: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
