/* multi_tensor.cuh: one pass over every parameter: the gradient norms and the AdamW
 * step of all tensors, each in one launch, over the flat fp32 buffers.
 *
 * Chunks: the flat buffer [P] holds the tensors back to back (ParamLayout order, llmc/host/config.h); each
 * tensor i (offset off[i], numel[i]) is cut into chunks of MT_CHUNK elements (the last one shorter), so
 * that no chunk crosses a tensor. Chunk c belongs to the tensor i with first[i] <= c < first[i+1]
 * (first: [n+1] prefix counts on the device; a block finds its tensor by binary search) and covers
 * [off[i] + (c - first[i]) * MT_CHUNK, + min(MT_CHUNK, rest)). One block of MT_THREADS a chunk. A chunk
 * whose start is a multiple of 4 is read and written as float4 packs (thread t: packs t, t + MT_THREADS,
 * ... of the chunk, then the scalar tail), else element by element (thread t: elements t, t +
 * MT_THREADS, ...): the choice depends on the layout only.
 *
 * Gradient norms (mt_grad_sumsq): per tensor, ss[i] = sum over its elements of x^2 in double, with
 * x = (double)(grad * unscale) (unscale: exponent scaling's 2^-k, the fp32 product AdamW takes too:
 * folded in here rather than a pass that multiplies the stored gradients). Kernel 1, per chunk: each
 * thread sums its elements in the order above, the block's fixed tree (global_norm.cuh's
 * gnorm_block_reduce) -> part[c]. Kernel 2, one block per tensor: thread t sums part[first[i] + t],
 * part[first[i] + t + GNORM_THREADS], ... in order, the same tree -> ss[i]. The n sums go to the host in
 * one copy (pinned) and one synchronisation; the host adds them in tensor order for the global norm, and
 * sums runs of them for the backward guard's per-layer norms. The order differs from global_norm.cuh's
 * single grid-stride sum, so the global norm changes at the rounding of double (documented in the README);
 * it is the same on every run and every GPU (it depends on the layout only).
 *
 * AdamW (adamw_multi_tensor): every element of every tensor in one launch, adamw_element (adamw.cuh) with
 * the tensor's decay: h.decay = decay[i] ? decay_value : 1; the element math and the bf16 copy are
 * adamw_kernel's, so the result is bitwise that of one adamw_update per tensor with the same h.
 *
 * Row norms inside the update (adamw_multi_tensor with an MtRows, -protect bound's weight norms): the launch takes
 * a second chunk table in which each listed tensor [rows, cols] is cut into chunks of whole rows (max(1, MT_CHUNK /
 * cols) rows a chunk); in such a chunk warp w takes rows w, w + 8, ..., lane l updates elements l, l + 32, ... of
 * its row in order and sums the squares of the bf16 weights it writes in double in that order, then the warp's
 * butterfly (xor 16, 8, 4, 2, 1) and mmb_norm (llmc/sdc/bound.h): the arithmetic and order of bound.cuh's
 * mmb_row_norms_jobs_kernel over the same bf16 weights, so the same bits, without a pass that reads every weight
 * again. Each element's update is adamw_element whatever the chunking, so p, m, v and p_bf16 keep their bits.
 *
 * Layout: grad, p, m, v fp32 [P]; p_bf16 bf16 [P]; table (MtTable, device): first int [n+1], off size_t
 * [n], numel size_t [n], decay int [n]; part double [n_chunks]; ss double [n].
 * Accounting (ew_account, COST_OPTIMIZER): sum of squares 3 FLOPs an element (scale, square, add; in double),
 * AdamW a nominal 16 an element; bytes: every element read once and written once, in its dtype. */
#ifndef TSDC_MULTI_TENSOR_CUH
#define TSDC_MULTI_TENSOR_CUH

#include "cuda_common.cuh"
#include "adamw.cuh"
#include "global_norm.cuh"
#include "../sdc/bound.h"   /* mmb_norm: the row norms' last step (-protect bound) */

#define MT_CHUNK 8192        /* elements a chunk (a multiple of 4) */
#define MT_THREADS GNORM_THREADS

typedef struct {
    int n, n_chunks;
    int* first;              /* device [n+1] */
    size_t *off, *numel;     /* device [n] */
    int* decay;              /* device [n] */
    size_t total;            /* host: the elements of all tensors (the launchers' accounting) */
} MtTable;

/* the chunk table of n tensors (host arrays off, numel, decay) on the device */
static void mt_table_build(MtTable* t, int n, const size_t* off, const size_t* numel, const int* decay) {
    int* first = (int*)mallocCheck(sizeof(int) * (n + 1));
    long long c = 0;
    for (int i = 0; i < n; i++) { first[i] = (int)c; c += (long long)((numel[i] + MT_CHUNK - 1) / MT_CHUNK); }
    if (c > 0x7fffffff) tsdc_fail("mt_table_build: %lld chunks", c);
    first[n] = (int)c;
    t->n = n; t->n_chunks = (int)c;
    t->total = 0;
    for (int i = 0; i < n; i++) t->total += numel[i];
    cudaCheck(cudaMalloc(&t->first, sizeof(int) * (n + 1)));
    cudaCheck(cudaMalloc(&t->off, sizeof(size_t) * n));
    cudaCheck(cudaMalloc(&t->numel, sizeof(size_t) * n));
    cudaCheck(cudaMalloc(&t->decay, sizeof(int) * n));
    cudaCheck(cudaMemcpy(t->first, first, sizeof(int) * (n + 1), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(t->off, off, sizeof(size_t) * n, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(t->numel, numel, sizeof(size_t) * n, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(t->decay, decay, sizeof(int) * n, cudaMemcpyHostToDevice));
    free(first);
}
static void mt_table_free(MtTable* t) {
    if (!t->first) return;
    cudaCheck(cudaFree(t->first)); cudaCheck(cudaFree(t->off)); cudaCheck(cudaFree(t->numel)); cudaCheck(cudaFree(t->decay));
    t->first = NULL;
}

/* the tensor of chunk c: the largest i with first[i] <= c (binary search; empty tensors are skipped) */
__device__ __forceinline__ int mt_tensor_of(const int* first, int n, int c) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (first[mid] <= c) lo = mid; else hi = mid - 1;
    }
    return lo;
}
/* the chunk's tensor, start and length */
__device__ __forceinline__ int mt_chunk(const int* first, const size_t* off, const size_t* numel, int n, int c, size_t* start, int* len) {
    const int i = mt_tensor_of(first, n, c);
    const size_t k = (size_t)(c - first[i]) * MT_CHUNK;
    const size_t rest = numel[i] - k;
    *start = off[i] + k;
    *len = (int)(rest < MT_CHUNK ? rest : MT_CHUNK);
    return i;
}

__global__ static void mt_sumsq_chunks_kernel(double* part, const float* grad, float unscale, const int* first, const size_t* off,
                                              const size_t* numel, int n) {
    size_t s; int len;
    mt_chunk(first, off, numel, n, blockIdx.x, &s, &len);
    const float* g = grad + s;
    double acc = 0.0;
    if (s % 4 == 0) {
        const int np = len / 4;
        for (int q = threadIdx.x; q < np; q += MT_THREADS) {
            const f32_pack<4> x = reinterpret_cast<const f32_pack<4>*>(g)[q];
#pragma unroll
            for (int j = 0; j < 4; j++) { const double a = (double)(x.v[j] * unscale); acc += a * a; }
        }
        for (int j = np * 4 + threadIdx.x; j < len; j += MT_THREADS) { const double a = (double)(g[j] * unscale); acc += a * a; }
    } else {
        for (int j = threadIdx.x; j < len; j += MT_THREADS) { const double a = (double)(g[j] * unscale); acc += a * a; }
    }
    gnorm_block_reduce(acc, part);
}
__global__ static void mt_sumsq_tensors_kernel(double* ss, const double* part, const int* first) {
    const int i = blockIdx.x;
    double acc = 0.0;
    for (int c = first[i] + threadIdx.x; c < first[i + 1]; c += GNORM_THREADS) acc += part[c];
    gnorm_block_reduce(acc, ss);
}

/* ss[i] (device, [n]) = the sum of squares of tensor i's (grad * unscale); part: device scratch of
 * t->n_chunks doubles. Two launches, does not wait. */
static void mt_grad_sumsq(double* ss, double* part, const float* grad, float unscale, const MtTable* t, cudaStream_t stream) {
    if (t->n_chunks > 0)
        mt_sumsq_chunks_kernel<<<t->n_chunks, MT_THREADS, 0, stream>>>(part, grad, unscale, t->first, t->off, t->numel, t->n);
    cudaCheck(cudaGetLastError());
    if (t->n_chunks == 0) { cudaCheck(cudaMemsetAsync(ss, 0, sizeof(double) * t->n, stream)); return; }
    ew_account(COST_OPTIMIZER, "mt_sumsq_chunks_kernel", t->n_chunks, 3.0 * t->total, t->total * 4, (size_t)t->n_chunks * 8);   /* grad in; partials out */
    mt_sumsq_tensors_kernel<<<t->n, GNORM_THREADS, 0, stream>>>(ss, part, t->first);
    cudaCheck(cudaGetLastError());
    ew_account(COST_OPTIMIZER, "mt_sumsq_tensors_kernel", t->n, (double)t->n_chunks, (size_t)t->n_chunks * 8, (size_t)t->n * 8);   /* partials in; sums out */
}

/* the AdamW step of elements [s, s + len) (adamw_element, the bf16 copy): float4 packs where s is a multiple of 4 */
__device__ __forceinline__ void mt_adamw_span(float* p, bf16* p_bf16, const float* grad, float* m, float* v, size_t s, int len,
                                              const AdamWParams& h) {
    if (s % 4 == 0) {
        const int np = len / 4;
        for (int q = threadIdx.x; q < np; q += MT_THREADS) {
            const size_t e = s + (size_t)q * 4;
            f32_pack<4> pp = *reinterpret_cast<const f32_pack<4>*>(p + e);
            f32_pack<4> gg = *reinterpret_cast<const f32_pack<4>*>(grad + e);
            f32_pack<4> mm = *reinterpret_cast<const f32_pack<4>*>(m + e);
            f32_pack<4> vv = *reinterpret_cast<const f32_pack<4>*>(v + e);
            bf16_pack<4> pb;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                adamw_element(pp.v[j], mm.v[j], vv.v[j], gg.v[j], h);
                pb.v[j] = __float2bfloat16_rn(pp.v[j]);
            }
            *reinterpret_cast<f32_pack<4>*>(p + e) = pp;
            *reinterpret_cast<f32_pack<4>*>(m + e) = mm;
            *reinterpret_cast<f32_pack<4>*>(v + e) = vv;
            *reinterpret_cast<bf16_pack<4>*>(p_bf16 + e) = pb;
        }
        for (int j = np * 4 + threadIdx.x; j < len; j += MT_THREADS) {
            const size_t e = s + j;
            float pi = p[e], mi = m[e], vi = v[e];
            adamw_element(pi, mi, vi, grad[e], h);
            p[e] = pi; m[e] = mi; v[e] = vi;
            p_bf16[e] = __float2bfloat16_rn(pi);
        }
    } else {
        for (int j = threadIdx.x; j < len; j += MT_THREADS) {
            const size_t e = s + j;
            float pi = p[e], mi = m[e], vi = v[e];
            adamw_element(pi, mi, vi, grad[e], h);
            p[e] = pi; m[e] = mi; v[e] = vi;
            p_bf16[e] = __float2bfloat16_rn(pi);
        }
    }
}

__global__ static void adamw_multi_tensor_kernel(float* p, bf16* p_bf16, const float* grad, float* m, float* v, const int* first,
                                                 const size_t* off, const size_t* numel, const int* dk, int n, AdamWParams h,
                                                 float decay) {
    size_t s; int len;
    const int i = mt_chunk(first, off, numel, n, blockIdx.x, &s, &len);
    h.decay = dk[i] ? decay : 1.0f;
    mt_adamw_span(p, p_bf16, grad, m, v, s, len, h);
}

/* the AdamW launch's own chunk table when it also makes row norms (see the header): tensor i of the layout has
 * cols[i] > 0 (rows of cols[i] elements, rpc[i] rows a chunk, norms to out[i][row]) or 0 (chunks of MT_CHUNK, no
 * norms); first[i]: its first chunk, as MtTable's */
typedef struct {
    int n, n_chunks;
    int *first, *cols, *rpc, *decay;   /* device */
    size_t *off, *numel;               /* device */
    float** out;                       /* device [n] */
    size_t total, norm_rows, norm_elems;   /* host: the elements, and the rows and elements with norms (accounting) */
} MtRows;
/* off, numel, decay: the layout (MtTable's arrays); cols, out: per tensor (0 / NULL: no norms; else numel % cols == 0) */
static void mt_rows_build(MtRows* t, int n, const size_t* off, const size_t* numel, const int* decay, const int* cols, float* const* out) {
    int* first = (int*)mallocCheck(sizeof(int) * (n + 1));
    int* rpc = (int*)mallocCheck(sizeof(int) * (n > 0 ? n : 1));
    long long c = 0;
    t->total = t->norm_rows = t->norm_elems = 0;
    for (int i = 0; i < n; i++) {
        first[i] = (int)c;
        t->total += numel[i];
        if (cols[i] > 0) {
            if (numel[i] % (size_t)cols[i]) tsdc_fail("mt_rows_build: tensor %d: %zu elements are not rows of %d", i, numel[i], cols[i]);
            rpc[i] = cols[i] >= MT_CHUNK ? 1 : MT_CHUNK / cols[i];
            const size_t rows = numel[i] / (size_t)cols[i];
            c += (long long)((rows + rpc[i] - 1) / rpc[i]);
            t->norm_rows += rows;
            t->norm_elems += numel[i];
        } else {
            rpc[i] = 0;
            c += (long long)((numel[i] + MT_CHUNK - 1) / MT_CHUNK);
        }
    }
    if (c > 0x7fffffff) tsdc_fail("mt_rows_build: %lld chunks", c);
    first[n] = (int)c;
    t->n = n; t->n_chunks = (int)c;
    cudaCheck(cudaMalloc(&t->first, sizeof(int) * (n + 1)));
    cudaCheck(cudaMalloc(&t->cols, sizeof(int) * (n > 0 ? n : 1)));
    cudaCheck(cudaMalloc(&t->rpc, sizeof(int) * (n > 0 ? n : 1)));
    cudaCheck(cudaMalloc(&t->decay, sizeof(int) * (n > 0 ? n : 1)));
    cudaCheck(cudaMalloc(&t->off, sizeof(size_t) * (n > 0 ? n : 1)));
    cudaCheck(cudaMalloc(&t->numel, sizeof(size_t) * (n > 0 ? n : 1)));
    cudaCheck(cudaMalloc(&t->out, sizeof(float*) * (n > 0 ? n : 1)));
    cudaCheck(cudaMemcpy(t->first, first, sizeof(int) * (n + 1), cudaMemcpyHostToDevice));
    if (n > 0) {
        cudaCheck(cudaMemcpy(t->cols, cols, sizeof(int) * n, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(t->rpc, rpc, sizeof(int) * n, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(t->decay, decay, sizeof(int) * n, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(t->off, off, sizeof(size_t) * n, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(t->numel, numel, sizeof(size_t) * n, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(t->out, out, sizeof(float*) * n, cudaMemcpyHostToDevice));
    }
    free(first); free(rpc);
}
static void mt_rows_free(MtRows* t) {
    if (!t->first) return;
    cudaCheck(cudaFree(t->first)); cudaCheck(cudaFree(t->cols)); cudaCheck(cudaFree(t->rpc)); cudaCheck(cudaFree(t->decay));
    cudaCheck(cudaFree(t->off)); cudaCheck(cudaFree(t->numel)); cudaCheck(cudaFree(t->out));
    t->first = NULL;
}
__global__ static void adamw_multi_tensor_rows_kernel(float* p, bf16* p_bf16, const float* grad, float* m, float* v, const int* first,
                                                      const size_t* off, const size_t* numel, const int* dk, const int* colsv,
                                                      const int* rpcv, float* const* outv, int n, AdamWParams h, float decay) {
    const int c = blockIdx.x, i = mt_tensor_of(first, n, c);
    h.decay = dk[i] ? decay : 1.0f;
    const int cols = colsv[i];
    if (cols == 0) {   /* no norms: MtTable's chunk */
        const size_t k = (size_t)(c - first[i]) * MT_CHUNK, rest = numel[i] - k;
        mt_adamw_span(p, p_bf16, grad, m, v, off[i] + k, (int)(rest < MT_CHUNK ? rest : MT_CHUNK), h);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t rows = numel[i] / (size_t)cols, r0 = (size_t)(c - first[i]) * rpcv[i];
    const int nr = (int)(rows - r0 < (size_t)rpcv[i] ? rows - r0 : (size_t)rpcv[i]);
    float* out = outv[i];
    for (int r = warp; r < nr; r += MT_THREADS / 32) {   /* the whole warp takes the row: the butterfly needs every lane */
        const size_t e0 = off[i] + (r0 + r) * (size_t)cols;
        double ss = 0.0;
        for (int k = lane; k < cols; k += 32) {
            const size_t e = e0 + k;
            float pi = p[e], mi = m[e], vi = v[e];
            adamw_element(pi, mi, vi, grad[e], h);
            p[e] = pi; m[e] = mi; v[e] = vi;
            const bf16 b = __float2bfloat16_rn(pi);
            p_bf16[e] = b;
            const double x = (double)__bfloat162float(b);
            ss += x * x;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) out[r0 + r] = mmb_norm(ss);
    }
}

/* the AdamW step of every tensor of the table in one launch: h as adamw.cuh (h.decay is set per tensor:
 * decay for tensors with the decay flag, 1 for the others). The buffers must be 16-byte aligned (the
 * trainer's cudaMalloc'd flat buffers). Does not wait. */
static void adamw_multi_tensor(float* p, bf16* p_bf16, const float* grad, float* m, float* v, const MtTable* t, AdamWParams h,
                               float decay, size_t total, cudaStream_t stream) {
    if (t->n_chunks == 0) return;
    if (!ptr_aligned(p, 16) || !ptr_aligned(grad, 16) || !ptr_aligned(m, 16) || !ptr_aligned(v, 16) || !ptr_aligned(p_bf16, 8))
        tsdc_fail("adamw_multi_tensor: the flat buffers must be 16-byte aligned");
    adamw_multi_tensor_kernel<<<t->n_chunks, MT_THREADS, 0, stream>>>(p, p_bf16, grad, m, v, t->first, t->off, t->numel, t->decay, t->n,
                                                                   h, decay);
    cudaCheck(cudaGetLastError());
    ew_account(COST_OPTIMIZER, "adamw_multi_tensor_kernel", t->n_chunks, 16.0 * total, total * 16, total * 14);   /* p, grad, m, v in; p, m, v, p_bf16 out */
}
/* the same step (the same bits of p, m, v, p_bf16) with the row norms of MtRows' listed tensors written (see the
 * header): one launch; the norms' arithmetic accounted to comp as riding work (a square and an add an element in
 * double, the norms written), none of their reads (the update holds the values) */
static void adamw_multi_tensor_rows(float* p, bf16* p_bf16, const float* grad, float* m, float* v, const MtRows* t, AdamWParams h,
                                    float decay, const char* comp, cudaStream_t stream) {
    if (t->n_chunks == 0) return;
    if (!ptr_aligned(p, 16) || !ptr_aligned(grad, 16) || !ptr_aligned(m, 16) || !ptr_aligned(v, 16) || !ptr_aligned(p_bf16, 8))
        tsdc_fail("adamw_multi_tensor_rows: the flat buffers must be 16-byte aligned");
    adamw_multi_tensor_rows_kernel<<<t->n_chunks, MT_THREADS, 0, stream>>>(p, p_bf16, grad, m, v, t->first, t->off, t->numel, t->decay,
                                                                        t->cols, t->rpc, t->out, t->n, h, decay);
    cudaCheck(cudaGetLastError());
    ew_account(COST_OPTIMIZER, "adamw_multi_tensor_kernel", t->n_chunks, 16.0 * t->total, t->total * 16, t->total * 14);
    ride_account(comp, "adamw_row_norms_ride", COST_FP64, t->n_chunks, 2.0 * t->norm_elems, 0.0, (double)t->norm_rows * 4);
}

#endif
