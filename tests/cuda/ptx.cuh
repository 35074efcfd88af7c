/* tests/cuda/ptx.cuh (part of test_sdc.cu, `-only ptx`): every wrapper of llmc/cuda/ptx.cuh in small
 * kernels against the scalar reference of tests/ptx_ref.h, written from the PTX ISA's fragment tables. On
 * a GPU this is what shows that the layouts the emulator (dev/cuda_emu) implements are the hardware's;
 * under the emulator it checks the emulator against the same tables (dev/cuda_emu/emu_selftest.cu
 * checks the emulator's own semantics beyond them: late landing of cp.async, the misuse errors).
 *
 *   mma        fragments built on the host from random bf16 A (16x16), B (16x8) and a non-zero fp32 C by
 *              the ISA's tables, 4 blocks of 2 warps (each warp its own matrices); every lane's d[i]
 *              against the reference at (row, col) of the C/D table, within 2^-18 (|c| + sum_k |a b|):
 *              the hardware's accumulation inside one mma is undocumented (order, internal width,
 *              truncation), the emulator's is exact products summed in double; a wrong layout is off
 *              by O(|values|). d aliasing c: the same bits as d apart.
 *   ldmatrix   x1, x2, x4, each plain and .trans, from static and from dynamic shared memory, each lane
 *              giving a permuted row (lane l: row (11 l + 5) % 32): every lane's register i bitwise.
 *   chain      the operand recipes of ptx.cuh's header: A row-major in shared memory by one x4, B
 *              stored [n][k] by one x2 and B stored [k][n] by one x2_trans, into one mma each: D
 *              against the reference product (the same tolerance).
 *   cp.async   each thread: a row of 16 bytes in group 0, one of t % 17 source bytes (zero filled) in
 *              group 1; after wait<1> group 0 must have landed, after wait<0> both; another thread's
 *              rows after its wait and a __syncthreads; a src_bytes 0 zero fill left uncommitted and
 *              landed by wait_all. (That a copy is *not* visible before its wait is not asserted here:
 *              a GPU may land it early. emu_selftest checks the emulator's late landing.)
 *   pack       pack_bf16x2 on ties, overflow, subnormals, signed zeros, NaN and random bit patterns:
 *              bitwise the reference's round-to-nearest-even (any NaN for a NaN).
 * A failure names the lane, the register and the matrix element. */
#ifndef TSDC_TESTS_CUDA_PTX_CUH
#define TSDC_TESTS_CUDA_PTX_CUH

#include "../../llmc/cuda/ptx.cuh"
#include "../ptx_ref.h"

#define PTX_MMA_TOL 3.814697265625e-06   /* 2^-18, times |c| + sum_k |a b| */

/* one mma per warp, warp w of the grid (w = blockIdx.x * warps + warp) on fragment set w: d1 = A B + C,
 * d2 the same with d aliasing c */
__global__ void ptx_mma_kernel(float* d1, float* d2, const uint32_t* aw, const uint32_t* bw, const float* cw) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;   /* = 32 w + lane */
    const uint32_t a[4] = {aw[t * 4], aw[t * 4 + 1], aw[t * 4 + 2], aw[t * 4 + 3]};
    const uint32_t b[2] = {bw[t * 2], bw[t * 2 + 1]};
    const float c[4] = {cw[t * 4], cw[t * 4 + 1], cw[t * 4 + 2], cw[t * 4 + 3]};
    float d[4];
    mma_bf16_16816(d, a, b, c);
    float x[4] = {c[0], c[1], c[2], c[3]};
    mma_bf16_16816(x, a, b, x);
    for (int i = 0; i < 4; i++) { d1[t * 4 + i] = d[i]; d2[t * 4 + i] = x[i]; }
}

/* 32 rows of 8 b16 in shared memory (static, or dynamic with dyn); lane l gives row perm[l]; out[l * 4 + i]
 * = register i of ldmatrix_x{num}[_trans] (0xdeadbeef where i >= num) */
__global__ void ptx_ldmatrix_kernel(uint32_t* out, const uint16_t* rows, const int* perm, int num, int trans, int dyn) {
    __shared__ __align__(16) uint16_t st[32 * 8];
    extern __shared__ uint16_t ptx_dyn[];   /* the dynamic arena: 16-byte aligned (more on a GPU) */
    uint16_t* sm = dyn ? ptx_dyn : st;
    const int l = threadIdx.x;
    for (int c = 0; c < 8; c++) sm[l * 8 + c] = rows[l * 8 + c];
    __syncthreads();
    const void* p = &sm[perm[l] * 8];
    uint32_t r[4] = {0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu};
    if (num == 1 && !trans) { uint32_t q[1]; ldmatrix_x1(q, p); r[0] = q[0]; }
    if (num == 2 && !trans) { uint32_t q[2]; ldmatrix_x2(q, p); r[0] = q[0]; r[1] = q[1]; }
    if (num == 4 && !trans) ldmatrix_x4(r, p);
    if (num == 1 && trans) { uint32_t q[1]; ldmatrix_x1_trans(q, p); r[0] = q[0]; }
    if (num == 2 && trans) { uint32_t q[2]; ldmatrix_x2_trans(q, p); r[0] = q[0]; r[1] = q[1]; }
    if (num == 4 && trans) ldmatrix_x4_trans(r, p);
    for (int i = 0; i < 4; i++) out[l * 4 + i] = r[i];
}

/* A [16][16] row-major, Bt [8][16] (= B stored [n][k]), B [16][8] (stored [k][n]), C [16][8] in global
 * memory; shared rows padded to 24 b16 (48 bytes: 16-byte aligned). d_nk = A B + C with b from Bt by x2,
 * d_kn with b from B by x2_trans; out[lane * 4 + i] as the C/D table */
__global__ void ptx_chain_kernel(float* d_nk, float* d_kn, const uint16_t* A, const uint16_t* Bt, const uint16_t* B, const float* cw) {
    __shared__ __align__(16) uint16_t sA[16 * 24];
    __shared__ __align__(16) uint16_t sBt[8 * 24];
    __shared__ __align__(16) uint16_t sB[16 * 24];
    const int l = threadIdx.x;
    for (int i = l; i < 256; i += 32) sA[(i / 16) * 24 + i % 16] = A[i];
    for (int i = l; i < 128; i += 32) { sBt[(i / 16) * 24 + i % 16] = Bt[i]; sB[(i / 8) * 24 + i % 8] = B[i]; }
    __syncthreads();
    uint32_t a[4], b1[2], b2[2];
    ldmatrix_x4(a, &sA[(l % 16) * 24 + (l / 16) * 8]);           /* lanes 0-15: rows 0-15 at k 0; 16-31: at k 8 */
    ldmatrix_x2(b1, &sBt[(l % 8) * 24 + ((l / 8) % 2) * 8]);      /* lanes 0-7: n 0-7 at k 0; 8-15: at k 8 */
    ldmatrix_x2_trans(b2, &sB[(l % 16) * 24]);                    /* lanes 0-15: rows k 0-15 */
    const float c[4] = {cw[l * 4], cw[l * 4 + 1], cw[l * 4 + 2], cw[l * 4 + 3]};
    float x[4], y[4];
    mma_bf16_16816(x, a, b1, c);
    mma_bf16_16816(y, a, b2, c);
    for (int i = 0; i < 4; i++) { d_nk[l * 4 + i] = x[i]; d_kn[l * 4 + i] = y[i]; }
}

/* out rows (16 bytes): 0-31 row t after wait<1>; 32-63 row 32 + t after wait<0>; 64-95 the neighbour's
 * row (t + 1) % 32 after a __syncthreads; 96-127 row t after a zero fill (src_bytes 0) issued after the
 * rest, left uncommitted, landed by wait_all */
__global__ void ptx_cp_async_kernel(uint16_t* out, const uint16_t* src) {
    __shared__ __align__(16) uint16_t s[64 * 8];
    const int t = threadIdx.x;
    cp_async_16(&s[t * 8], src + t * 8, 16);
    cp_async_commit();
    cp_async_16(&s[(32 + t) * 8], src + (32 + t) * 8, t % 17);
    cp_async_commit();
    cp_async_wait<1>();
    for (int c = 0; c < 8; c++) out[t * 8 + c] = s[t * 8 + c];
    cp_async_wait<0>();
    for (int c = 0; c < 8; c++) out[(32 + t) * 8 + c] = s[(32 + t) * 8 + c];
    __syncthreads();
    for (int c = 0; c < 8; c++) out[(64 + t) * 8 + c] = s[((t + 1) % 32) * 8 + c];
    __syncthreads();
    cp_async_16(&s[t * 8], src, 0);
    cp_async_wait_all();
    for (int c = 0; c < 8; c++) out[(96 + t) * 8 + c] = s[t * 8 + c];
}

__global__ void ptx_pack_kernel(uint32_t* out, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = pack_bf16x2(x[2 * i], x[2 * i + 1]);
}

/* the host side */
static uint16_t ptx_rand_bf16(double scale) { return f32_to_bf16_bits((float)(scale * rng_normal(&g_rng))); }

/* d [32 lanes][4] of one warp against the reference D [16][8]; prints the first few differences */
static int ptx_check_d(const char* what, int warp, const float* got, const float* D, const float* mag, int* shown) {
    int bad = 0;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            int r, c;
            ptx_ref_c_elem(lane, i, &r, &c);
            const double want = D[r * 8 + c], g = got[lane * 4 + i], bound = PTX_MMA_TOL * mag[r * 8 + c];
            if (!(fabs(g - want) <= bound)) {
                if ((*shown)++ < 6)
                    printf("    %s: warp %d lane %d d[%d] (D row %d col %d): got %.9g want %.9g (bound %.3g)\n", what, warp, lane, i, r, c, g, want,
                           bound);
                bad++;
            }
        }
    return bad;
}

static void test_ptx_mma(void) {
    const int nb = 4, wpb = 2, nw = nb * wpb;
    uint16_t* A = (uint16_t*)mallocCheck(nw * 256 * 2);
    uint16_t* B = (uint16_t*)mallocCheck(nw * 128 * 2);
    float* C = h_alloc(nw * 128);
    float* D = h_alloc(nw * 128);
    float* mag = h_alloc(nw * 128);
    uint32_t(*aw)[4] = (uint32_t(*)[4])mallocCheck(nw * 32 * 16);
    uint32_t(*bw)[2] = (uint32_t(*)[2])mallocCheck(nw * 32 * 8);
    float(*cw)[4] = (float(*)[4])mallocCheck(nw * 32 * 16);
    for (int w = 0; w < nw; w++) {
        for (int i = 0; i < 256; i++) A[w * 256 + i] = ptx_rand_bf16(1.0);
        for (int i = 0; i < 128; i++) { B[w * 128 + i] = ptx_rand_bf16(1.0); C[w * 128 + i] = (float)(2.0 * rng_normal(&g_rng)); }
        ptx_ref_fragments(A + w * 256, B + w * 128, C + w * 128, aw + 32 * w, bw + 32 * w, cw + 32 * w);
        ptx_ref_mma(A + w * 256, B + w * 128, C + w * 128, D + w * 128, mag + w * 128);
    }
    uint32_t* daw = (uint32_t*)dalloc_raw(nw * 32 * 4, 4);
    uint32_t* dbw = (uint32_t*)dalloc_raw(nw * 32 * 2, 4);
    float* dcw = d_f32_poison(nw * 32 * 4);
    float* d1 = d_f32_poison(nw * 32 * 4);
    float* d2 = d_f32_poison(nw * 32 * 4);
    cudaCheck(cudaMemcpy(daw, aw, nw * 32 * 16, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dbw, bw, nw * 32 * 8, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dcw, cw, nw * 32 * 16, cudaMemcpyHostToDevice));
    ptx_mma_kernel<<<nb, 32 * wpb, 0, g_s>>>(d1, d2, daw, dbw, dcw);
    cudaCheck(cudaGetLastError());
    float* h1 = h_alloc(nw * 128);
    float* h2 = h_alloc(nw * 128);
    cudaCheck(cudaMemcpy(h1, d1, nw * 128 * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h2, d2, nw * 128 * 4, cudaMemcpyDeviceToHost));
    int bad = 0, shown = 0;
    double worst = 0;
    for (int w = 0; w < nw; w++) {
        bad += ptx_check_d("mma", w, h1 + w * 128, D + w * 128, mag + w * 128, &shown);
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++) {
                int r, c;
                ptx_ref_c_elem(lane, i, &r, &c);
                const double e = fabs((double)h1[w * 128 + lane * 4 + i] - D[w * 128 + r * 8 + c]) / mag[w * 128 + r * 8 + c];
                if (e > worst || e != e) worst = e;
            }
    }
    check(bad == 0, "ptx mma_bf16_16816: %d warps, every lane's d[0..3] at the ISA's (row, col) within 2^-18 (|c| + sum |a b|) of the reference: "
          "%d wrong, largest error %.3g of that scale", nw, bad, worst);
    const size_t alias = bits_differ(h1, h2, nw * 128);
    check(alias == 0, "ptx mma_bf16_16816 with d aliasing c: the same bits as d apart: %zu differ", alias);
    FREE_ALL(A, B, C, D, mag, aw, bw, cw, h1, h2);
    dfree_all();
}

static void test_ptx_ldmatrix(void) {
    uint16_t rows[32 * 8];
    for (int i = 0; i < 32 * 8; i++) rows[i] = (uint16_t)rng_u64(&g_rng);
    int perm[32];
    for (int l = 0; l < 32; l++) perm[l] = (l * 11 + 5) % 32;
    uint16_t mats[4][8][8];   /* matrix j, row r: the row lane 8j + r gives */
    for (int j = 0; j < 4; j++) for (int r = 0; r < 8; r++) for (int c = 0; c < 8; c++) mats[j][r][c] = rows[perm[8 * j + r] * 8 + c];
    uint16_t* drows = (uint16_t*)dalloc_raw(32 * 8, 2);
    int* dperm = (int*)dalloc_raw(32, 4);
    uint32_t* dout = (uint32_t*)dalloc_raw(32 * 4, 4);
    cudaCheck(cudaMemcpy(drows, rows, sizeof(rows), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dperm, perm, sizeof(perm), cudaMemcpyHostToDevice));
    const int nums[3] = {1, 2, 4};
    for (int dyn = 0; dyn < 2; dyn++)
        for (int trans = 0; trans < 2; trans++)
            for (int k = 0; k < 3; k++) {
                const int num = nums[k];
                ptx_ldmatrix_kernel<<<1, 32, dyn ? 32 * 8 * 2 : 0, g_s>>>(dout, drows, dperm, num, trans, dyn);
                cudaCheck(cudaGetLastError());
                uint32_t h[32 * 4];
                cudaCheck(cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost));
                int bad = 0;
                for (int l = 0; l < 32; l++)
                    for (int i = 0; i < 4; i++) {
                        const uint32_t want = i < num ? ptx_ref_ldmatrix(mats, i, l, trans) : 0xdeadbeefu;
                        if (h[l * 4 + i] != want) {
                            if (bad < 3) {
                                const int rr = l / 4, cc = 2 * (l % 4);
                                printf("    lane %d r[%d]: got 0x%08x want 0x%08x (matrix %d, elements (%d,%d) and (%d,%d))\n", l, i, h[l * 4 + i], want, i,
                                       trans ? cc : rr, trans ? rr : cc, trans ? cc + 1 : rr, trans ? rr : cc + 1);
                            }
                            bad++;
                        }
                    }
                check(bad == 0, "ptx ldmatrix_x%d%s (%s shared memory, permuted row addresses): every lane's registers bitwise: %d wrong", num,
                      trans ? "_trans" : "", dyn ? "dynamic" : "static", bad);
            }
    dfree_all();
}

static void test_ptx_chain(void) {
    uint16_t A[256], Bt[128], B[128];
    float C[128], D[128], mag[128];
    for (int i = 0; i < 256; i++) A[i] = ptx_rand_bf16(1.0);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) { B[k * 8 + n] = ptx_rand_bf16(1.0); Bt[n * 16 + k] = B[k * 8 + n]; }
    for (int i = 0; i < 128; i++) C[i] = (float)rng_normal(&g_rng);
    ptx_ref_mma(A, B, C, D, mag);
    uint32_t aw[32][4], bw[32][2];
    float cw[32][4];
    ptx_ref_fragments(A, B, C, aw, bw, cw);
    uint16_t* dA = (uint16_t*)dalloc_raw(256, 2);
    uint16_t* dBt = (uint16_t*)dalloc_raw(128, 2);
    uint16_t* dB = (uint16_t*)dalloc_raw(128, 2);
    float* dcw = d_f32_poison(128);
    float* d1 = d_f32_poison(128);
    float* d2 = d_f32_poison(128);
    cudaCheck(cudaMemcpy(dA, A, sizeof(A), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dBt, Bt, sizeof(Bt), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dB, B, sizeof(B), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dcw, cw, sizeof(cw), cudaMemcpyHostToDevice));
    ptx_chain_kernel<<<1, 32, 0, g_s>>>(d1, d2, dA, dBt, dB, dcw);
    cudaCheck(cudaGetLastError());
    float h1[128], h2[128];
    cudaCheck(cudaMemcpy(h1, d1, sizeof(h1), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h2, d2, sizeof(h2), cudaMemcpyDeviceToHost));
    int shown = 0;
    const int b1 = ptx_check_d("A by x4, B[n][k] by x2", 0, h1, D, mag, &shown);
    const int b2 = ptx_check_d("A by x4, B[k][n] by x2_trans", 0, h2, D, mag, &shown);
    check(b1 == 0 && b2 == 0, "ptx operands from shared memory (A row-major by ldmatrix_x4; B [n][k] by x2: %d wrong; B [k][n] by x2_trans: %d wrong) "
          "into mma_bf16_16816", b1, b2);
    dfree_all();
}

static void test_ptx_cp_async(void) {
    uint16_t src[64 * 8];
    for (int i = 0; i < 64 * 8; i++) src[i] = (uint16_t)(rng_u64(&g_rng) & 0x7fff);   /* never 0xFFFF, the poison */
    uint16_t* dsrc = (uint16_t*)dalloc_raw(64 * 8, 2);
    uint16_t* dout = (uint16_t*)dalloc_raw(128 * 8, 2);
    cudaCheck(cudaMemcpy(dsrc, src, sizeof(src), cudaMemcpyHostToDevice));
    ptx_cp_async_kernel<<<1, 32, 0, g_s>>>(dout, dsrc);
    cudaCheck(cudaGetLastError());
    uint16_t h[128 * 8];
    cudaCheck(cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost));
    int bad[4] = {0, 0, 0, 0}, shown = 0;
    for (int t = 0; t < 32; t++)
        for (int c = 0; c < 8; c++) {
            uint16_t part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            memcpy(part, &src[(32 + t) * 8], (size_t)(t % 17));
            const uint16_t want[4] = {src[t * 8 + c], part[c], src[((t + 1) % 32) * 8 + c], 0};
            for (int k = 0; k < 4; k++)
                if (h[(32 * k + t) * 8 + c] != want[k]) {
                    if (shown++ < 4) printf("    cp.async part %d thread %d element %d: got 0x%04x want 0x%04x\n", k, t, c, h[(32 * k + t) * 8 + c], want[k]);
                    bad[k]++;
                }
        }
    check(bad[0] == 0, "ptx cp_async_16: group 0 landed at cp_async_wait<1> (group 1 pending): %d wrong", bad[0]);
    check(bad[1] == 0, "ptx cp_async_16 with src_bytes t %% 17: those bytes and zeros after, landed at cp_async_wait<0>: %d wrong", bad[1]);
    check(bad[2] == 0, "ptx cp_async_16: another thread's row after its wait and a __syncthreads: %d wrong", bad[2]);
    check(bad[3] == 0, "ptx cp_async_16 with src_bytes 0 (zero fill), uncommitted, landed by cp_async_wait_all: %d wrong", bad[3]);
    dfree_all();
}

static void test_ptx_pack(void) {
    const int n = 1024;
    float* x = h_alloc(2 * n);
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                0x00000001u, 0x80008000u, 0x00018000u, 0x007fffffu, 0x7fc00001u, 0xffa00000u, 0x00000000u, 0x80000000u};
    const int ns = (int)(sizeof(special) / sizeof(special[0]));
    for (int i = 0; i < 2 * n; i++) x[i] = i < ns ? bits_f32(special[i]) : bits_f32((uint32_t)rng_u64(&g_rng));
    float* dx = d_f32_poison(2 * n);
    uint32_t* dout = (uint32_t*)dalloc_raw(n, 4);
    cudaCheck(cudaMemcpy(dx, x, 2 * n * 4, cudaMemcpyHostToDevice));
    ptx_pack_kernel<<<CEIL_DIV(n, 128), 128, 0, g_s>>>(dout, dx, n);
    cudaCheck(cudaGetLastError());
    uint32_t* h = (uint32_t*)mallocCheck(n * 4);
    cudaCheck(cudaMemcpy(h, dout, n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int half = 0; half < 2; half++) {
            const uint16_t got = (uint16_t)(h[i] >> (16 * half)), want = ptx_ref_bf16_rn(x[2 * i + half]);
            const int ok = ptx_ref_bf16_is_nan(want) ? ptx_ref_bf16_is_nan(got) : got == want;
            if (!ok) {
                if (bad < 4) printf("    pack_bf16x2 pair %d %s half: %a gave 0x%04x, want 0x%04x\n", i, half ? "high" : "low", x[2 * i + half], got, want);
                bad++;
            }
        }
    check(bad == 0, "ptx pack_bf16x2: %d pairs (ties, overflow, subnormals, signed zeros, NaN, random bits) round to nearest even, lo low: %d halves wrong",
          n, bad);
    FREE_ALL(x, h);
    dfree_all();
}

static void test_ptx(void) {
    printf("ptx (llmc/cuda/ptx.cuh: mma, ldmatrix, cp.async, pack against the ISA's tables, tests/ptx_ref.h)\n");
    test_ptx_mma();
    test_ptx_ldmatrix();
    test_ptx_chain();
    test_ptx_cp_async();
    test_ptx_pack();
}

#endif
