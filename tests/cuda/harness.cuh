/* harness.cuh: the harness of the GPU tests (test_sdc.cu includes it after both trainers): per-element
 * comparison under a tolerance (Tol, compare) that reports unwritten and overrun elements, seeded host
 * inputs, device buffers poisoned with NaN patterns and a guard after their end, and their download. */
/* ------------------------------------------------- comparison (check() is tests/check.h's) */
/* one bf16 unit in the last place at |x| (7 stored mantissa bits); subnormal range: the smallest */
static double ulp_bf16(double x) {
    x = fabs(x);
    if (!(x >= 1.1754943508222875e-38)) return ldexp(1.0, -133);
    int e;
    frexp(x, &e); /* x = m 2^e, m in [0.5, 1): floor(log2 x) = e - 1 */
    return ldexp(1.0, e - 8);
}

typedef struct {
    double ulps;       /* allowed bf16 ulps of max(|gpu|, |ref|) */
    double atol;       /* absolute */
    double rtol;       /* times |ref| */
    const float* mag;  /* optional: sum of |terms| per element */
    double mtol;       /* times mag[i] */
    double l2;         /* relative L2 limit; 0: not checked */
    int bitwise;       /* identical bits required */
    int round_ref;     /* the GPU stored bf16: compare with bf16_round(ref) */
} Tol;

static Tol tol_bitwise(int round_ref) { Tol t; memset(&t, 0, sizeof(t)); t.bitwise = 1; t.round_ref = round_ref; return t; }
/* a bf16 output: 1 ulp (+ rtol |ref|) against the rounded reference, relative L2 < 1e-2 */
static Tol tol_bf16(double rtol) { Tol t; memset(&t, 0, sizeof(t)); t.ulps = 1; t.rtol = rtol; t.l2 = 1e-2; t.round_ref = 1; return t; }
static Tol tol_bf16_mag(const float* mag, double mtol) { Tol t = tol_bf16(0); t.mag = mag; t.mtol = mtol; return t; }
/* an fp32 output: mtol * mag[i] (+ atol, rtol |ref|) */
static Tol tol_f32(const float* mag, double mtol, double atol, double rtol) {
    Tol t; memset(&t, 0, sizeof(t)); t.mag = mag; t.mtol = mtol; t.atol = atol; t.rtol = rtol; t.l2 = 1e-2; return t;
}

typedef struct { size_t unwritten, overrun; } Written;

static int compare(const char* name, const float* got, const float* ref_in, size_t n, Tol t, const Written* w) {
    double scale = 0;
    for (size_t i = 0; i < n; i++) {
        double r = t.round_ref ? bf16_round(ref_in[i]) : ref_in[i];
        if (fabs(r) > scale) scale = fabs(r);
    }
    double max_abs = 0, max_rel = 0, se = 0, sr = 0;
    size_t bad = 0, first = 0;
    double first_bound = 0;
    for (size_t i = 0; i < n; i++) {
        float rf = t.round_ref ? bf16_round(ref_in[i]) : ref_in[i];
        double g = got[i], r = rf;
        double e = fabs(g - r);
        int ok;
        double bound = 0;
        if (t.bitwise) {
            ok = f32_bits(got[i]) == f32_bits(rf);
        } else {
            double big = fabs(g) > fabs(r) ? fabs(g) : fabs(r);
            bound = t.ulps * (t.ulps > 0 ? ulp_bf16(big) : 0) + t.atol + t.rtol * fabs(r) + (t.mag ? t.mtol * t.mag[i] : 0);
            ok = e <= bound; /* false for NaN */
        }
        if (!ok) { if (!bad) { first = i; first_bound = bound; } bad++; }
        if (e == e) { se += e * e; if (e > max_abs) max_abs = e; } else { max_abs = NAN; se = NAN; }
        sr += r * r;
        if (fabs(r) >= 1e-3 * scale && scale > 0 && e / fabs(r) > max_rel) max_rel = e / fabs(r);
    }
    double rl2 = sr > 0 ? sqrt(se / sr) : (se > 0 ? INFINITY : 0.0);
    size_t unw = w ? w->unwritten : 0, ovr = w ? w->overrun : 0;
    int ok = bad == 0 && unw == 0 && ovr == 0 && !(t.l2 > 0 && !(rl2 < t.l2));
    check(ok, "    %-46s n %-9zu max abs %.2e  max rel %.2e  rel L2 %.2e%s", name, n, max_abs, max_rel, rl2,
          t.bitwise ? "  (bitwise)" : "");
    if (!ok) {
        if (bad) {
            if (t.bitwise)
                printf("      %zu elements differ; first [%zu]: gpu %.9g (%08x) ref %.9g (%08x)\n", bad, first, got[first],
                       f32_bits(got[first]), t.round_ref ? bf16_round(ref_in[first]) : ref_in[first],
                       f32_bits(t.round_ref ? bf16_round(ref_in[first]) : ref_in[first]));
            else
                printf("      %zu elements outside their bound; first [%zu]: gpu %.9g ref %.9g |err| %.3e bound %.3e\n", bad, first,
                       got[first], t.round_ref ? bf16_round(ref_in[first]) : ref_in[first],
                       fabs((double)got[first] - (t.round_ref ? bf16_round(ref_in[first]) : ref_in[first])), first_bound);
        }
        if (unw) printf("      %zu elements unwritten (still the NaN poison)\n", unw);
        if (ovr) printf("      %zu guard elements after the end were overwritten\n", ovr);
        if (t.l2 > 0 && !(rl2 < t.l2)) printf("      relative L2 error %.3e >= %.1e\n", rl2, t.l2);
    }
    return ok;
}

/* ------------------------------------------------------------------- host and device buffers */
static Rng g_rng;
static cudaStream_t g_s;

static float* h_alloc(size_t n) { return (float*)mallocCheck(n * sizeof(float)); }
static float* h_copy(const float* x, size_t n) { float* y = h_alloc(n); memcpy(y, x, n * sizeof(float)); return y; }
/* shift + scale * N(0,1), rounded to bf16 when `round` */
static float* h_normal(size_t n, double scale, double shift, int round) {
    float* x = h_alloc(n);
    for (size_t i = 0; i < n; i++) {
        float v = (float)(shift + scale * rng_normal(&g_rng));
        x[i] = round ? bf16_round(v) : v;
    }
    return x;
}
static float* h_abs(const float* x, size_t n) { float* y = h_alloc(n); for (size_t i = 0; i < n; i++) y[i] = fabsf(x[i]); return y; }
static float max_abs_of(const float* x, size_t n) { float m = 0; for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i])); return m; }

#define GUARD 64
#define MAX_DEV 512
static struct { void* p; size_t n; int elem; } g_dev[MAX_DEV];
static int g_ndev = 0;

static void* dalloc_raw(size_t n, int elem) {
    if (g_ndev == MAX_DEV) tsdc_fail("test_sdc_cu: more than %d device buffers", MAX_DEV);
    void* p = NULL;
    cudaCheck(cudaMalloc(&p, (n + GUARD) * elem));
    cudaCheck(cudaMemset(p, 0xFF, (n + GUARD) * elem)); /* NaN poison, guard included */
    g_dev[g_ndev].p = p; g_dev[g_ndev].n = n; g_dev[g_ndev].elem = elem; g_ndev++;
    return p;
}
static void dfree_all(void) {
    cudaCheck(cudaDeviceSynchronize());
    for (int i = 0; i < g_ndev; i++) cudaCheck(cudaFree(g_dev[i].p));
    g_ndev = 0;
}
static bf16* d_bf16_poison(size_t n) { return (bf16*)dalloc_raw(n, 2); }
static float* d_f32_poison(size_t n) { return (float*)dalloc_raw(n, 4); }
/* upload: h must hold bf16-exact values (h_normal(..., round 1)) */
static bf16* d_bf16(const float* h, size_t n) {
    bf16* d = d_bf16_poison(n);
    uint16_t* t = (uint16_t*)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) {
        t[i] = f32_to_bf16_bits(h[i]);
        if (bf16_bits_to_f32(t[i]) != h[i] && h[i] == h[i]) tsdc_fail("test_sdc_cu: internal: upload of a non-bf16 value");
    }
    cudaCheck(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
    free(t);
    return d;
}
static float* d_f32(const float* h, size_t n) {
    float* d = d_f32_poison(n);
    cudaCheck(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    return d;
}
static int* d_i32(const int* h, size_t n) {
    int* d = (int*)dalloc_raw(n, 4);
    cudaCheck(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    return d;
}
/* the guard of a registered buffer (elements n .. n+GUARD) must still be poison */
static size_t guard_overrun(const void* d, size_t n) {
    for (int i = 0; i < g_ndev; i++)
        if (g_dev[i].p == d && g_dev[i].n == n) {
            int el = g_dev[i].elem;
            uint8_t* t = (uint8_t*)mallocCheck(GUARD * el);
            cudaCheck(cudaMemcpy(t, (const uint8_t*)d + n * el, GUARD * el, cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (int j = 0; j < GUARD * el; j++) bad += t[j] != 0xFF;
            free(t);
            return bad;
        }
    return 0;
}
static float* dl_bf16(const bf16* d, size_t n, Written* w) {
    cudaCheck(cudaDeviceSynchronize()); /* the kernel tests' stream and the model's */
    cudaCheck(cudaGetLastError());
    uint16_t* t = (uint16_t*)mallocCheck(n * 2);
    cudaCheck(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost));
    float* x = h_alloc(n);
    size_t unw = 0;
    for (size_t i = 0; i < n; i++) { unw += t[i] == 0xFFFF; x[i] = bf16_bits_to_f32(t[i]); }
    free(t);
    if (w) { w->unwritten = unw; w->overrun = guard_overrun(d, n); }
    return x;
}
static float* dl_f32(const float* d, size_t n, Written* w) {
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaGetLastError());
    float* x = h_alloc(n);
    cudaCheck(cudaMemcpy(x, d, n * 4, cudaMemcpyDeviceToHost));
    size_t unw = 0;
    for (size_t i = 0; i < n; i++) unw += f32_bits(x[i]) == 0xFFFFFFFFu;
    if (w) { w->unwritten = unw; w->overrun = guard_overrun(d, n); }
    return x;
}

#define FREE_ALL(...) do { void* ptrs_[] = {__VA_ARGS__}; for (size_t i_ = 0; i_ < sizeof(ptrs_) / sizeof(ptrs_[0]); i_++) free(ptrs_[i_]); } while (0)

/* how many elements of two fp32 arrays differ in their bits */
static size_t bits_differ(const float* a, const float* b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += f32_bits(a[i]) != f32_bits(b[i]);
    return d;
}
