/* rgg.cuh: the Residual Gain Guard's statistics reduced on the device.
 *
 * Math: for each of nvec fp32 vectors ms_j [N] (the RMSNorms' per-token mean squares, which the norm
 * kernels keep: llmc/cuda/rmsnorm.cuh), ss[j] = sum_i ms_j[i] in double, and bad[j] = the number of ms_j[i]
 * that are negative, NaN or infinite (llmc/sdc/rgg.h residual_gain's test: any makes the gain NaN), as a
 * double. The host takes the gains from these sums (residual_gain_sums in llmc/sdc/rgg.h).
 * Order (fixed): block j handles vector j; thread t sums i = t, t + RGG_SUM_THREADS, ... in order, then the
 * block's fixed tree (global_norm.cuh's gnorm_block_reduce: warp xor butterflies 16..1, then the warp sums
 * through warp 0); bad the same way. The same bits every run; against the host's serial sum (the CPU trainer's
 * residual_gain) equal to rounding in double.
 * Layout: ms: a device table of nvec pointers (float* [nvec]), each vector N fp32; ss, bad double [nvec].
 * One launch for all the vectors of a forward. */
#ifndef TSDC_RGG_CUH
#define TSDC_RGG_CUH

#include "../cuda/cuda_common.cuh"
#include "../cuda/global_norm.cuh"

#define RGG_SUM_THREADS GNORM_THREADS

__global__ static void rgg_ms_sums_kernel(double* ss, double* bad, const float* const* ms, int N) {
    const float* x = ms[blockIdx.x];
    double acc = 0.0, nb = 0.0;
    for (int i = threadIdx.x; i < N; i += RGG_SUM_THREADS) {
        const float v = x[i];
        if (!(v >= 0.0f) || isinf(v)) nb += 1.0;
        acc += (double)v;
    }
    gnorm_block_reduce(acc, ss);   /* ss[blockIdx.x] */
    __syncthreads();               /* warp 0 has read the shared warp sums */
    gnorm_block_reduce(nb, bad);   /* the count of bad values, exact in double */
}

/* ss[j], bad[j] (the count of bad values, as a double) for the nvec vectors ms[j][0..N) (ms: device
 * table); does not wait */
static void rgg_ms_sums(double* ss, double* bad, const float* const* ms, int nvec, int N, cudaStream_t stream) {
    if (nvec <= 0) return;
    rgg_ms_sums_kernel<<<nvec, RGG_SUM_THREADS, 0, stream>>>(ss, bad, ms, N);
    cudaCheck(cudaGetLastError());
    ew_account("rgg", "rgg_ms_sums_kernel", nvec, 2.0 * nvec * N, (size_t)nvec * N * 4, (size_t)nvec * 16);   /* the mean squares in; sums, bad counts out */
}

#endif
