/* bound.cuh: -protect bound on the device: every forward matrix product's output against its Cauchy-Schwarz bound,
 * |y_ij| <= c(K) ||x_i|| ||w_j|| + 2^-100 (the math, its rounding argument and what it catches: llmc/sdc/bound.h; the
 * CPU trainer's mmb_check in train_sdc.c makes the same comparisons with the same functions).
 *
 * Launchers (bf16 row-major; a flag is a device int set to 1 on a violation, never cleared here):
 *   mmb_row_norms(out, x, rows, cols, ld)   out[r] = mmb_norm(sum_k x[r, k]^2), float [rows]; x [rows, cols] row stride
 *       ld: the rows of each weight matrix (W [cols_out, K]: row j is w_j), once after every change of the weights.
 *   mmb_check(f0, f1, split, y, rows, cols, ld, x, K, nw, c)   a flag set when any y[r, j] (row stride ld: v and
 *       gate/up are column views of the fused GEMMs' outputs) violates mmb_violates(y, ||x_r||, nw[j], c), c =
 *       mmb_factor(K) (host); the input rows' norms are reduced inside the check (no launch of their own); columns
 *       below split flag f0, the rest f1 (gate and up in one launch, two flags, as the CPU's two comparisons).
 * Used alone, a layer costs 4 check launches (v, o, gate/up, down; 3 with ReLU^2), one per product, besides the weights'
 * norms once a step (mmb_row_norms_jobs: every weight matrix of every layer in one launch; in the trainer after the first
 * step the optimizer's launch makes them as it writes the bf16 weights, the same order and bits: multi_tensor.cuh's
 * MtRows). The trainer's clean path
 * makes none of them: gate, up, o and down are checked inside the kernels that read them (MmbFused, bound.h: SwiGLU's
 * forward, the two residual adds fused with the next norm), v by the launch that rotates q and k (MmbTail, rope.cuh);
 * mmb_check remains for the paths those kernels are split on (a fault due between their steps) and ReLU^2's MLP. Order: the weight norms one warp a row, lane t summing x^2 in double over the columns t, t + 32, ...,
 * then the xor butterfly (fixed offsets); the input norms per block, thread t over t, t + 256, ..., the warps'
 * butterflies, then the 8 warp partials in order: the same bits every run, on any grid. The CPU sums in other orders,
 * so the two trainers' norms may differ in the last bits of the double sum, far inside the bound's slack (a norm is
 * rounded up by 2^-20 before use). Flags by atomicOr (integer).
 * Grid: one block a row (blockIdx.y, grid-stride past 65535), its threads over the row's packs, so the input row is
 * read once (a grid of several blocks a row would read it once each: 2.6x the bytes for llama3.2-1b's gate/up).
 * Cost (ew_account, bytes read; nothing written on a clean run): weight norms 2 rows cols + 4 rows; a check 2 rows
 * cols + 2 rows K + 4 cols. */
#ifndef TSDC_BOUND_CUH
#define TSDC_BOUND_CUH

#include "../cuda/cuda_common.cuh"
#include "bound.h"
#include "ewcheck.cuh"   /* ew_check_rows, ewc_ld, ewc_vec */

#define MMB_ROWS_PER_BLOCK 8   /* warps a block, one row each */

__global__ static void mmb_row_norms_kernel(float* out, const bf16* x, int rows, int cols, int ld) {
    const int lane = threadIdx.x & 31;
    for (int r = blockIdx.x * MMB_ROWS_PER_BLOCK + (threadIdx.x >> 5); r < rows; r += gridDim.x * MMB_ROWS_PER_BLOCK) {
        const bf16* p = x + (size_t)r * ld;
        double ss = 0.0;
        for (int k = lane; k < cols; k += 32) {
            const double v = (double)__bfloat162float(p[k]);
            ss += v * v;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (lane == 0) out[r] = mmb_norm(ss);
    }
}
/* many row-norm jobs in one launch (the weights' norms of every checked product of every layer, once a step): job i
 * writes out[r] for the rows r of x [rows, cols] (row stride ld); the rows of all jobs are numbered in job order
 * (first: a job's first global row) and a warp takes one at a time, with mmb_row_norms_kernel's arithmetic and order */
typedef struct {
    float* out;
    const bf16* x;
    int rows, cols, ld;
    long long first;
} MmbJob;
__global__ static void mmb_row_norms_jobs_kernel(const MmbJob* __restrict__ jobs, int njobs, long long total) {
    const int lane = threadIdx.x & 31;
    for (long long g = (long long)blockIdx.x * MMB_ROWS_PER_BLOCK + (threadIdx.x >> 5); g < total; g += (long long)gridDim.x * MMB_ROWS_PER_BLOCK) {
        int lo = 0, hi = njobs - 1;   /* the job whose rows hold g: the last with first <= g */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (jobs[mid].first <= g) lo = mid;
            else hi = mid - 1;
        }
        const MmbJob& jb = jobs[lo];
        const int r = (int)(g - jb.first);
        const bf16* p = jb.x + (size_t)r * jb.ld;
        double ss = 0.0;
        for (int k = lane; k < jb.cols; k += 32) {
            const double v = (double)__bfloat162float(p[k]);
            ss += v * v;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (lane == 0) jb.out[r] = mmb_norm(ss);
    }
}
/* jobs_dev: njobs jobs on the device (their first rows numbered), host_jobs: the same on the host (for the accounting) */
static void mmb_row_norms_jobs(const MmbJob* jobs_dev, const MmbJob* host_jobs, int njobs, cudaStream_t stream) {
    if (njobs <= 0) return;
    const long long total = host_jobs[njobs - 1].first + host_jobs[njobs - 1].rows;
    if (total <= 0) return;
    const long long gb = (total + MMB_ROWS_PER_BLOCK - 1) / MMB_ROWS_PER_BLOCK;
    const int g = gb < 65535 ? (int)gb : 65535;
    mmb_row_norms_jobs_kernel<<<g, 32 * MMB_ROWS_PER_BLOCK, 0, stream>>>(jobs_dev, njobs, total);
    cudaCheck(cudaGetLastError());
    double fl = 0.0;
    size_t rd = 0, wr = 0;
    for (int i = 0; i < njobs; i++) {
        fl += 2.0 * host_jobs[i].rows * host_jobs[i].cols;
        rd += (size_t)host_jobs[i].rows * host_jobs[i].cols * 2;
        wr += (size_t)host_jobs[i].rows * 4;
    }
    ew_account("bound", "mmb_row_norms_jobs_kernel", dim3(g), fl, rd + (size_t)njobs * sizeof(MmbJob), wr);
}
static void mmb_row_norms(float* out, const bf16* x, int rows, int cols, int ld, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return;
    const int g = CEIL_DIV(rows, MMB_ROWS_PER_BLOCK) < 65535 ? CEIL_DIV(rows, MMB_ROWS_PER_BLOCK) : 65535;
    mmb_row_norms_kernel<<<g, 32 * MMB_ROWS_PER_BLOCK, 0, stream>>>(out, x, rows, cols, ld);
    cudaCheck(cudaGetLastError());
    ew_account("bound", "mmb_row_norms_kernel", dim3(g), 2.0 * rows * cols, (size_t)rows * cols * 2, (size_t)rows * 4);
}

/* the check, one launch a product: blockIdx.y over rows (grid-stride), the row's packs of V outputs over the x threads.
 * Each block first reduces the input row's sum of squares (threads over the columns in a stride of the block, each in
 * double, then the warps' xor butterflies and warp partials summed in order by thread 0: the same bits in every block
 * of the row and every run), so no norm kernel or buffer is needed for the inputs. Columns below split flag f0, the
 * rest f1 (gate and up of the fused gate/up output checked in one launch, each with its own flag). */
#define MMB_CHECK_BLOCK 256
template <int V>
__global__ static void mmb_check_kernel(int* f0, int* f1, int split, const bf16* y, int cols, int ld, const bf16* x, int K,
                                        const float* nw, float c, int rows) {
    __shared__ double part[MMB_CHECK_BLOCK / 32];
    __shared__ float nx_row;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, packs = cols / V;
    bool bad0 = false, bad1 = false;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const bf16* xr = x + (size_t)r * K;
        double ss = 0.0;
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            const double v = (double)__bfloat162float(xr[k]);
            ss += v * v;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
            double t = 0.0;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += part[w];
            nx_row = mmb_norm(t);
        }
        __syncthreads();
        const float nxr = nx_row;
        for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < packs; p += gridDim.x * blockDim.x) {
            const int c0 = p * V;
            bf16 t[V];
            float fy[V];
            ewc_ld<V>(t, fy, y + (size_t)r * ld + c0);
#pragma unroll
            for (int j = 0; j < V; j++)
                if (mmb_violates(fy[j], nxr, nw[c0 + j], c)) { if (c0 + j < split) bad0 = true; else bad1 = true; }
        }
        __syncthreads();   /* part and nx_row are rewritten for the next row */
    }
    if (bad0) atomicOr(f0, 1);
    if (bad1) atomicOr(f1, 1);
}
/* y [rows, cols] (row stride ld) against the input x [rows, K] (contiguous) and the weight rows' norms nw [cols];
 * columns [0, split) into flag f0, [split, cols) into f1 (split = cols: one flag); does not wait */
static void mmb_check(int* f0, int* f1, int split, const bf16* y, int rows, int cols, int ld, const bf16* x, int K, const float* nw,
                      float c, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return;
    const bool vec = ewc_vec(cols, ld, y, NULL, NULL, NULL, NULL, NULL, NULL) && split % EWC_VEC == 0;
    const int V = vec ? EWC_VEC : 1, packs = cols / V;
    /* one block a row (rows >= the SMs at every B x T worth checking): the input row is read once */
    const int gx = 1, gy = rows < 65535 ? rows : 65535;
    (void)packs;
    if (vec) mmb_check_kernel<EWC_VEC><<<dim3(gx, gy), MMB_CHECK_BLOCK, 0, stream>>>(f0, f1, split, y, cols, ld, x, K, nw, c, rows);
    else mmb_check_kernel<1><<<dim3(gx, gy), MMB_CHECK_BLOCK, 0, stream>>>(f0, f1, split, y, cols, ld, x, K, nw, c, rows);
    cudaCheck(cudaGetLastError());
    ew_account("bound", "mmb_check_kernel", dim3(gx, gy), 3.0 * rows * cols + 2.0 * rows * K, (size_t)rows * cols * 2 + (size_t)rows * K * 2 +
               (size_t)cols * 4, 0);
}

#endif
