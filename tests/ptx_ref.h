/* tests/ptx_ref.h: the scalar (host) reference of llmc/cuda/ptx.cuh's instructions, written from the
 * PTX ISA's layout tables, for the emulator's own test (dev/cuda_emu/emu_selftest.cu) and the kernel test
 * (tests/cuda/ptx.cuh, which on a GPU checks the hardware against the same tables). Each function
 * states the ISA's rule in the ISA's own terms (element index i of a fragment, groupID, threadID_in_group)
 * rather than the emulator's register loops, so that the two are written independently.
 *
 * "Matrix Fragments for mma.m16n8k16 with floating point type" (.bf16): groupID = lane >> 2,
 * threadID_in_group = lane % 4.
 *   A: a 4 x .b32 fragment holding elements a0..a7 (two per register, a0 in the low half of the first):
 *      row = groupID for a_i with i < 2 or 4 <= i < 6, groupID + 8 otherwise;
 *      col = threadID_in_group * 2 + (i & 1) for i < 4, that + 8 for i >= 4.
 *   B: 2 x .b32 holding b0..b3: row (k) = threadID_in_group * 2 + (i & 1) for i < 2, that + 8 for i >= 2;
 *      col (n) = groupID.
 *   C, D: 4 x .f32 c0..c3: row = groupID for i < 2, groupID + 8 otherwise; col = threadID_in_group * 2 + (i & 1).
 * "Warp-level matrix load instruction: ldmatrix" (.m8n8 .b16): the row addresses of matrix j are given
 * by threads 8j .. 8j+7; each thread receives of matrix j (in register j) the two elements of row
 * lane / 4 at columns 2 (lane % 4) and 2 (lane % 4) + 1; with .trans, of the transposed matrix, i.e.
 * the elements at rows 2 (lane % 4), 2 (lane % 4) + 1 of column lane / 4. */
#ifndef TSDC_TESTS_PTX_REF_H
#define TSDC_TESTS_PTX_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ptx_ref_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ptx_ref_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ptx_ref_bf16(uint16_t h) { return ptx_ref_f32((uint32_t)h << 16); }

/* mma.m16n8k16 fragments: element i of lane's A (0..7), B (0..3), C/D (0..3) */
static inline void ptx_ref_a_elem(int lane, int i, int* row, int* col) {
    const int group = lane >> 2, tig = lane % 4;
    *row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
    *col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}
static inline void ptx_ref_b_elem(int lane, int i, int* k, int* n) {
    const int group = lane >> 2, tig = lane % 4;
    *k = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
    *n = group;
}
static inline void ptx_ref_c_elem(int lane, int i, int* row, int* col) {
    const int group = lane >> 2, tig = lane % 4;
    *row = i < 2 ? group : group + 8;
    *col = tig * 2 + (i & 1);
}

/* the fragment words of every lane from row-major bf16 bit matrices A[16][16] (m, k) and B[16][8] (k, n),
 * C[16][8] fp32: aw[lane][r] holds elements 2r (low half) and 2r + 1 (high half) */
static inline void ptx_ref_fragments(const uint16_t* A, const uint16_t* B, const float* C, uint32_t (*aw)[4], uint32_t (*bw)[2],
                                     float (*cw)[4]) {
    for (int lane = 0; lane < 32; lane++) {
        uint16_t e[8];
        int r, c;
        for (int i = 0; i < 8; i++) { ptx_ref_a_elem(lane, i, &r, &c); e[i] = A[r * 16 + c]; }
        for (int j = 0; j < 4; j++) aw[lane][j] = (uint32_t)e[2 * j] | (uint32_t)e[2 * j + 1] << 16;
        for (int i = 0; i < 4; i++) { ptx_ref_b_elem(lane, i, &r, &c); e[i] = B[r * 8 + c]; }
        for (int j = 0; j < 2; j++) bw[lane][j] = (uint32_t)e[2 * j] | (uint32_t)e[2 * j + 1] << 16;
        for (int i = 0; i < 4; i++) { ptx_ref_c_elem(lane, i, &r, &c); cw[lane][i] = C[r * 8 + c]; }
    }
}

/* D = A B + C (16 x 8): the value (products exact, summed in double in k order, c added last, rounded
 * once to fp32) and mag = |c| + sum_k |a b|, the scale of a GPU's accumulation error */
static inline void ptx_ref_mma(const uint16_t* A, const uint16_t* B, const float* C, float* D, float* mag) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < 16; k++) {
                const double p = (double)ptx_ref_bf16(A[m * 16 + k]) * (double)ptx_ref_bf16(B[k * 8 + n]);
                s += p;
                a += fabs(p);
            }
            D[m * 8 + n] = (float)(s + (double)C[m * 8 + n]);
            if (mag) mag[m * 8 + n] = (float)(a + fabs((double)C[m * 8 + n]));
        }
}

/* ldmatrix: rows[j][r][c] is row r (c = 0..7) of matrix j; the word lane receives in register j */
static inline uint32_t ptx_ref_ldmatrix(const uint16_t rows[][8][8], int j, int lane, int trans) {
    const int r = lane / 4, c = 2 * (lane % 4);
    if (!trans) return (uint32_t)rows[j][r][c] | (uint32_t)rows[j][r][c + 1] << 16;
    return (uint32_t)rows[j][c][r] | (uint32_t)rows[j][c + 1][r] << 16;
}

/* fp32 -> bf16, round to nearest, ties to even, from the discarded 16 bits (NaN: any NaN is right; this
 * gives the quiet form of the input's) */
static inline uint16_t ptx_ref_bf16_rn(float f) {
    const uint32_t u = ptx_ref_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    uint32_t hi = u >> 16;
    const uint32_t rest = u & 0xffffu;
    if (rest > 0x8000u || (rest == 0x8000u && (hi & 1u))) hi++;   /* a carry into the exponent is right (up to inf) */
    return (uint16_t)hi;
}
static inline int ptx_ref_bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

#endif
