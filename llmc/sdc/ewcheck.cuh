/* ewcheck.cuh: -protect ew on the device: every element-wise kernel of the forward and of the MLP's backward
 * recomputed from its stored inputs by a kernel of its own, and its stored output compared bit for bit; the
 * backward's residual gradients recomputed by the producing kernel itself and compared (ew_check_equal).
 *
 * What is checked (the CPU trainer's ew_rmsnorm / ew_residual / ew_compare in train_sdc.c, the same comparisons):
 *   forward   attn_norm   = rmsnorm(x, w_attn_norm)          the layer input x (the stored tensor)
 *             attn_residual = bf16(x + o)                    mlp_norm = rmsnorm(attn_residual, w_mlp_norm)
 *             act         = bf16(silu(gate)) | bf16(relu(gate)^2)
 *             mlp_product = bf16(act * up)                    (act the stored, rounded tensor)
 *             block_out   = bf16(attn_residual + down)
 *   backward  (SwiGLU) d act = bf16(d prod * up), d up = bf16(d prod * act), d gate = bf16(silu'(gate, d act));
 *             (ReLU^2) d gate = bf16(relu2'(gate, d act))
 *             d attn_residual = d block_out + bf16 rmsnorm'(mlp_norm), d block_out = d (next attn_norm's input) +
 *             rmsnorm'(next attn_norm) (the final norm's rmsnorm' alone for the last layer): the norm backward
 *             accumulates into dres in place, so the trainer keeps dres before it (one [N, d] copy), reruns
 *             rmsnorm_backward_dx_kernel on the copy after the result's injection point and ew_check_equal
 *             compares the two (the kernel's own arithmetic: nothing to mirror)
 * Each comparison has a flag slot (EWF_* forward, EWB_* backward, per layer in the trainer's report); a kernel
 * sets a slot to 1 when any element (or a mean square) of its output differs from the recomputation. The alarm
 * count of a layer is the sum of its slots: the number of failed comparisons, as the CPU's check_alarm calls.
 * The inputs are the stored ones, so a fault upstream is consistent input (another check's), a fault in the
 * output of the producing kernel (or written over it afterwards: the fault injector) differs.
 *
 * Rounding: each recomputation is the producing kernel's own expression on the same bf16 inputs, so a clean run
 * gives the same bits. The per-element math calls the functors of llmc/cuda/mlp.cuh and residual.cuh (SiluOp,
 * MulOp, SiluBackwardOp, Relu2Op, Relu2BackwardOp, AddOp), rounded once to bf16 (__float2bfloat16_rn) as
 * ew_map1/ew_map2, mul_backward_kernel and the fused swiglu kernels store them. The fused SwiGLU backward never
 * stores d act: it rounds it to bf16 in a register and feeds it to silu'; the check does the same (and checks
 * the stored d act instead where the split path stored it). The norms: the same lane groups as
 * rmsnorm_forward_kernel / residual_rmsnorm_forward_kernel (L = rmsnorm_lanes(C) lanes a row, lane l owning the
 * 8-element packs l, l+L, ..., summing x^2 over them in order in fp32, rmsnorm_group_sum's butterfly, ms = sum / C,
 * rstd = 1 / sqrtf(ms + eps), out = rmsnorm_scale8), so ms is recomputed with the same bits and compared too. The
 * sum depends on C only (not on the grid), so the check may run on any grid. Bits are compared as bf16 bit patterns
 * (fp32 for ms): a NaN compares equal only to the same NaN.
 *
 * Launchers and layouts (bf16 row-major; flags: device int, set to 1 on a mismatch, never cleared here):
 *   ew_check_norm(flag_res, flag_norm, resid, out, ms, a, b, w, rows, C, eps)   [rows, C] each
 *       the residual part (a, b not NULL): resid == bf16(a + b), into flag_res; the norm part (out not NULL):
 *       out == rmsnorm(resid, w) and ms == its mean square (ms may be NULL), into flag_norm; the norm reads the
 *       stored resid (its input as stored). One kernel for the trainer's fused residual_rmsnorm_forward, for the
 *       split residual_forward + rmsnorm_forward pair, for a norm alone (a NULL) and a residual alone (out NULL).
 *   ew_check_mlp_forward(flag_act, flag_prod, act, prod, gate, up, rows, F, ld)
 *       SwiGLU (up not NULL) or ReLU^2 (up, prod NULL); act, prod [rows, F]; gate, up [rows, ld] (row stride ld >= F:
 *       gate and up may be column views of one [rows, 2F] buffer).
 *   ew_check_swiglu_backward(flag_dact, flag_dup, flag_dgate, dgate, dup, dact, dprod, act, gate, up, rows, F, ld)
 *       dact NULL: the fused kernel (d act recomputed in a register, dup and dgate checked); else the split pair:
 *       dup and dact from d prod (mul_backward) and dgate from the stored dact (silu_backward) - either part may be
 *       skipped with a NULL output (dgate NULL: only mul_backward's outputs; dup NULL: only silu_backward's).
 *       dprod, dact, act [rows, F]; gate, up, dgate, dup [rows, ld].
 *   ew_check_relu2_backward(flag_dgate, dgate, dact, gate, rows, F, ld): dact [rows, F]; gate, dgate [rows, ld].
 * Parallelism: the norm check on rmsnorm's grid (RMSNORM_BLOCK threads, rows in lane groups); the MLP checks a 2-D
 * grid, blockIdx.y over rows (grid-stride), threads over the row's packs of EWC_VEC = 8 elements (16-byte loads
 * when every pointer is 16-byte aligned and F, ld are multiples of 8; packs of 1 otherwise; the same values).
 * Flags are written with atomicOr by the threads that found a difference (integer: the same result in any order).
 * Cost (ew_account, bytes read; nothing written on a clean run): norm 2 n (resid) + 2 n (out) + 4 rows (ms) + 2 C
 * (w), plus 4 n with the residual; MLP forward 8 n (SwiGLU) or 4 n; backward 12 n (fused), 10 n + 6 n (split), 6 n
 * (ReLU^2); ew_check_equal 4 n; n = rows x C or rows x F. */
#ifndef TSDC_EWCHECK_CUH
#define TSDC_EWCHECK_CUH

#include <stdint.h>
#include "../cuda/cuda_common.cuh"
#include "../cuda/convert.cuh"
#include "../cuda/rmsnorm.cuh"
#include "../cuda/residual.cuh"
#include "../cuda/mlp.cuh"

/* the flag slots of a layer (the trainer's report holds [n_layer][EW_FWD_SLOTS] and [n_layer][EW_BWD_SLOTS]) */
enum { EWF_ATTN_NORM, EWF_ATTN_RESIDUAL, EWF_MLP_NORM, EWF_ACT, EWF_MLP_PRODUCT, EWF_BLOCK_OUT, EW_FWD_SLOTS };
enum { EWB_ACT, EWB_UP_PROJ, EWB_GATE_PROJ, EWB_ATTN_RESIDUAL, EWB_BLOCK_OUT, EW_BWD_SLOTS };

#define EWC_VEC 8
#define EWC_BLOCK 256

/* 1 when the stored bf16 s is not the bf16 rounding of the recomputed fp32 r */
__device__ __forceinline__ static bool ewc_differs(bf16 s, float r) {
    return __bfloat16_as_ushort(s) != __bfloat16_as_ushort(__float2bfloat16_rn(r));
}
/* the first cnt (<= 8) stored bf16 at p (one 16-byte load when vec && cnt == 8) */
__device__ __forceinline__ static void ewc_load8(bf16 o[8], const bf16* p, int cnt, bool vec) {
    if (vec && cnt == 8) {
        bf16_pack<8> k = *reinterpret_cast<const bf16_pack<8>*>(p);
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = k.v[j];
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = j < cnt ? p[j] : __float2bfloat16_rn(0.0f);
    }
}
/* V stored bf16 at p as bf16 and as floats (V = 8: one 16-byte load, p aligned) */
template <int V>
__device__ __forceinline__ static void ewc_ld(bf16 o[V], float f[V], const bf16* p) {
    bf16_pack<V> k = *reinterpret_cast<const bf16_pack<V>*>(p);
#pragma unroll
    for (int j = 0; j < V; j++) { o[j] = k.v[j]; f[j] = __bfloat162float(k.v[j]); }
}

/* ------------------------------------------------------------------------- residual and RMSNorm */
__global__ static void ew_check_norm_kernel(int* flag_res, int* flag_norm, const bf16* resid, const bf16* out, const float* ms,
                                            const bf16* a, const bf16* b, const bf16* w, int rows, int C, float eps, int L,
                                            bool vec) {
    const int lane = threadIdx.x & 31, gl = lane & (L - 1), rpw = 32 / L;
    const int wpb = blockDim.x >> 5, step = gridDim.x * wpb * rpw;
    bool bad_res = false, bad_norm = false;
    /* base is the same for the whole warp, so every lane reaches the shuffles */
    for (int base = (blockIdx.x * wpb + (threadIdx.x >> 5)) * rpw; base < rows; base += step) {
        const int row = base + lane / L;
        const bool valid = row < rows;
        const size_t ro = (size_t)row * C;
        float acc = 0.0f;
        if (valid) {
            for (int c0 = gl * 8; c0 < C; c0 += L * 8) {
                const int cnt = min(8, C - c0);
                float x[8];
                load8_f32(x, resid + ro + c0, cnt, vec, 0.0f);
                if (a) {
                    float fa[8], fb[8];
                    bf16 s[8];
                    load8_f32(fa, a + ro + c0, cnt, vec, 0.0f);
                    load8_f32(fb, b + ro + c0, cnt, vec, 0.0f);
                    ewc_load8(s, resid + ro + c0, cnt, vec);
                    const AddOp add;
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (j < cnt) bad_res |= ewc_differs(s[j], add(fa[j], fb[j]));
                }
#pragma unroll
                for (int j = 0; j < 8; j++)   /* rmsnorm_forward_kernel's sum, on the stored input */
                    if (j < cnt) acc += x[j] * x[j];
            }
        }
        if (!out) continue;
        const float m = rmsnorm_group_sum(acc, L) / C;
        if (!valid) continue;
        const float rstd = 1.0f / sqrtf(m + eps);
        if (gl == 0 && ms) bad_norm |= __float_as_uint(ms[row]) != __float_as_uint(m);
        for (int c0 = gl * 8; c0 < C; c0 += L * 8) {
            const int cnt = min(8, C - c0);
            float f[8];
            bf16 s[8];
            load8_f32(f, resid + ro + c0, cnt, vec, 0.0f);
            rmsnorm_scale8(f, w, c0, cnt, vec, rstd);
            ewc_load8(s, out + ro + c0, cnt, vec);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < cnt) bad_norm |= ewc_differs(s[j], f[j]);
        }
    }
    if (bad_res) atomicOr(flag_res, 1);
    if (bad_norm) atomicOr(flag_norm, 1);
}

/* the residual resid = a + b (a NULL: none) and out, ms = rmsnorm(resid, w) (out NULL: none) against their stored
 * values; does not wait */
static void ew_check_norm(int* flag_res, int* flag_norm, const bf16* resid, const bf16* out, const float* ms, const bf16* a,
                          const bf16* b, const bf16* w, int rows, int C, float eps, cudaStream_t stream) {
    if (rows <= 0 || C <= 0 || (!a && !out)) return;
    const bool vec = C % 8 == 0 && ptr_aligned(resid, 16) && (!out || ptr_aligned(out, 16)) && (!a || (ptr_aligned(a, 16) && ptr_aligned(b, 16))) &&
                     (!w || ptr_aligned(w, 16));
    const int L = rmsnorm_lanes(C);
    ew_check_norm_kernel<<<rmsnorm_grid(rows, L), RMSNORM_BLOCK, 0, stream>>>(flag_res, flag_norm, resid, out, ms, a, b, w, rows, C, eps,
                                                                              L, vec);
    cudaCheck(cudaGetLastError());
    const size_t n = (size_t)rows * C;
    ew_account("ew", "ew_check_norm_kernel", rmsnorm_grid(rows, L), 7.0 * n,
               n * 2 + (a ? n * 4 : 0) + (out ? n * 2 + (ms ? (size_t)rows * 4 : 0) + (w ? (size_t)C * 2 : 0) : 0), 0);
}

/* ------------------------------------------------------------------------------ the MLP's element-wise kernels
 * One 2-D kernel, a functor per check: E::check<V>(r, c0, bad) compares the V elements from column c0 of row r and
 * ORs bit k of bad for a mismatch of flag slot k (of E::flags). */
struct EwcMlpFwd {   /* act = silu(gate) | relu2(gate); prod = act * up (up NULL: ReLU^2) */
    const bf16 *act, *prod, *gate, *up;
    int F, ld;
    template <int V>
    __device__ __forceinline__ void check(size_t r, int c0, unsigned& bad) const {
        bf16 sa[V], sp[V], t[V];
        float fa[V], fg[V], fu[V], fp[V];   /* fp: prod as floats, unused */
        ewc_ld<V>(t, fg, gate + r * ld + c0);
        ewc_ld<V>(sa, fa, act + r * F + c0);
        if (up) {
            ewc_ld<V>(t, fu, up + r * ld + c0);
            ewc_ld<V>(sp, fp, prod + r * F + c0);
            const SiluOp silu;
            const MulOp mul;
#pragma unroll
            for (int j = 0; j < V; j++) {
                if (ewc_differs(sa[j], silu(fg[j]))) bad |= 1u;
                if (ewc_differs(sp[j], mul(fa[j], fu[j]))) bad |= 2u;   /* from the stored act, as mul_forward */
            }
        } else {
            const Relu2Op relu2;
#pragma unroll
            for (int j = 0; j < V; j++)
                if (ewc_differs(sa[j], relu2(fg[j]))) bad |= 1u;
        }
        (void)fp;
    }
};
struct EwcSwigluBwd {   /* see ew_check_swiglu_backward */
    const bf16 *dgate, *dup, *dact, *dprod, *act, *gate, *up;
    int F, ld;
    template <int V>
    __device__ __forceinline__ void check(size_t r, int c0, unsigned& bad) const {
        bf16 t[V], sd[V];
        float fd[V], fa[V], fg[V], fu[V], fdact[V];
        const MulOp mul;
        const SiluBackwardOp dsilu;
        if (dup || !dact) {   /* from d prod: d act, d up (mul_backward, or the fused kernel's first step) */
            ewc_ld<V>(t, fd, dprod + r * F + c0);
            ewc_ld<V>(t, fu, up + r * ld + c0);
            if (dup) {
                ewc_ld<V>(t, fa, act + r * F + c0);
                ewc_ld<V>(sd, fdact, dup + r * ld + c0);
#pragma unroll
                for (int j = 0; j < V; j++)
                    if (ewc_differs(sd[j], mul(fd[j], fa[j]))) bad |= 2u;
            }
            if (dact) {
                ewc_ld<V>(sd, fdact, dact + r * F + c0);
#pragma unroll
                for (int j = 0; j < V; j++)
                    if (ewc_differs(sd[j], mul(fd[j], fu[j]))) bad |= 1u;
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) fdact[j] = __bfloat162float(__float2bfloat16_rn(mul(fd[j], fu[j])));   /* as the fused kernel */
            }
        } else {
            ewc_ld<V>(t, fdact, dact + r * F + c0);   /* silu_backward's input as stored */
        }
        if (dgate) {
            ewc_ld<V>(t, fg, gate + r * ld + c0);
            ewc_ld<V>(sd, fd, dgate + r * ld + c0);
#pragma unroll
            for (int j = 0; j < V; j++)
                if (ewc_differs(sd[j], dsilu(fdact[j], fg[j]))) bad |= 4u;
        }
    }
};
struct EwcRelu2Bwd {   /* dgate = relu2'(gate, dact) */
    const bf16 *dgate, *dact, *gate;
    int F, ld;
    template <int V>
    __device__ __forceinline__ void check(size_t r, int c0, unsigned& bad) const {
        bf16 t[V], sd[V];
        float fd[V], fg[V], fo[V];
        ewc_ld<V>(t, fd, dact + r * F + c0);
        ewc_ld<V>(t, fg, gate + r * ld + c0);
        ewc_ld<V>(sd, fo, dgate + r * ld + c0);
        const Relu2BackwardOp drelu2;
#pragma unroll
        for (int j = 0; j < V; j++)
            if (ewc_differs(sd[j], drelu2(fd[j], fg[j]))) bad |= 4u;
    }
};

/* rows over blockIdx.y (grid-stride), the row's V-element packs over the x threads */
template <int V, typename E>
__global__ static void ew_check_rows_kernel(E e, int* f0, int* f1, int* f2, int rows, int F) {
    const int packs = F / V;
    unsigned bad = 0;
    for (int r = blockIdx.y; r < rows; r += gridDim.y)
        for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < packs; p += gridDim.x * blockDim.x)
            e.template check<V>((size_t)r, p * V, bad);
    if ((bad & 1u) && f0) atomicOr(f0, 1);
    if ((bad & 2u) && f1) atomicOr(f1, 1);
    if ((bad & 4u) && f2) atomicOr(f2, 1);
}
template <typename E>
static dim3 ew_check_rows(const E& e, bool vec, int* f0, int* f1, int* f2, int rows, int F, cudaStream_t stream) {
    const int V = vec ? EWC_VEC : 1;
    const int packs = F / V;
    int gx = CEIL_DIV(packs, EWC_BLOCK), gy = rows < 65535 ? rows : 65535;
    if (gx < 1) gx = 1;
    if (vec) ew_check_rows_kernel<EWC_VEC, E><<<dim3(gx, gy), EWC_BLOCK, 0, stream>>>(e, f0, f1, f2, rows, F);
    else ew_check_rows_kernel<1, E><<<dim3(gx, gy), EWC_BLOCK, 0, stream>>>(e, f0, f1, f2, rows, F);
    cudaCheck(cudaGetLastError());
    return dim3(gx, gy);
}
static bool ewc_vec(int F, int ld, const void* p0, const void* p1, const void* p2, const void* p3, const void* p4, const void* p5,
                    const void* p6) {
    const void* p[7] = {p0, p1, p2, p3, p4, p5, p6};
    bool v = F % EWC_VEC == 0 && ld % EWC_VEC == 0;
    for (int i = 0; i < 7; i++) v = v && (!p[i] || ptr_aligned(p[i], 16));
    return v;
}

/* dst = src, n bf16 (the copy of dres kept for the norm backward's recomputation), 8 a thread when aligned */
__global__ static void ew_keep_kernel(bf16* dst, const bf16* src, size_t n, bool vec) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (vec) {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n / 8; i += stride)
            reinterpret_cast<bf16_pack<8>*>(dst)[i] = reinterpret_cast<const bf16_pack<8>*>(src)[i];
    } else {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
    }
}
static void ew_keep(bf16* dst, const bf16* src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const bool vec = n % 8 == 0 && ptr_aligned(dst, 16) && ptr_aligned(src, 16);
    const size_t work = vec ? n / 8 : n;
    const int g = (int)(CEIL_DIV(work, EWC_BLOCK) < 65535 ? CEIL_DIV(work, EWC_BLOCK) : 65535);
    ew_keep_kernel<<<g, EWC_BLOCK, 0, stream>>>(dst, src, n, vec);
    cudaCheck(cudaGetLastError());
    ew_account("ew", "ew_keep_kernel", dim3(g), 0.0, n * 2, n * 2);
}

struct EwcEqual {   /* a [rows, F] against its recomputation r [rows, F], bf16 bit patterns */
    const bf16 *a, *r;
    int F;
    template <int V>
    __device__ __forceinline__ void check(size_t row, int c0, unsigned& bad) const {
        bf16 ta[V], tr[V];
        float fa[V], fr[V];
        ewc_ld<V>(ta, fa, a + row * F + c0);
        ewc_ld<V>(tr, fr, r + row * F + c0);
#pragma unroll
        for (int j = 0; j < V; j++)
            if (__bfloat16_as_ushort(ta[j]) != __bfloat16_as_ushort(tr[j])) bad |= 1u;
    }
};
/* a stored tensor against a recomputation the trainer ran into scratch with the producing kernel itself (the
 * backward's residual gradients: the norm backward's accumulation rerun on a kept copy); does not wait */
static void ew_check_equal(int* flag, const bf16* a, const bf16* r, int rows, int F, cudaStream_t stream) {
    if (rows <= 0 || F <= 0) return;
    EwcEqual e = {a, r, F};
    const dim3 g = ew_check_rows(e, ewc_vec(F, F, a, r, NULL, NULL, NULL, NULL, NULL), flag, NULL, NULL, rows, F, stream);
    ew_account("ew", "ew_check_rows_kernel", g, 1.0 * rows * F, (size_t)rows * F * 4, 0);
}

/* act (and prod) of the MLP forward against gate (and up); does not wait */
static void ew_check_mlp_forward(int* flag_act, int* flag_prod, const bf16* act, const bf16* prod, const bf16* gate, const bf16* up,
                                 int rows, int F, int ld, cudaStream_t stream) {
    if (rows <= 0 || F <= 0) return;
    EwcMlpFwd e = {act, prod, gate, up, F, ld};
    const dim3 g = ew_check_rows(e, ewc_vec(F, ld, act, prod, gate, up, NULL, NULL, NULL), flag_act, flag_prod, NULL, rows, F, stream);
    ew_account("ew", "ew_check_rows_kernel", g, (double)rows * F * (up ? 6 : 3), (size_t)rows * F * (up ? 8 : 4), 0);   /* gate, act (up, prod) */
}
/* SwiGLU's backward: dact NULL: the fused swiglu_backward (dup, dgate from dprod); else mul_backward's dact, dup
 * (dup not NULL) and silu_backward's dgate (dgate not NULL); does not wait */
static void ew_check_swiglu_backward(int* flag_dact, int* flag_dup, int* flag_dgate, const bf16* dgate, const bf16* dup, const bf16* dact,
                                     const bf16* dprod, const bf16* act, const bf16* gate, const bf16* up, int rows, int F, int ld,
                                     cudaStream_t stream) {
    if (rows <= 0 || F <= 0) return;
    EwcSwigluBwd e = {dgate, dup, dact, dprod, act, gate, up, F, ld};
    const dim3 g = ew_check_rows(e, ewc_vec(F, ld, dgate, dup, dact, dprod, act, gate, up), flag_dact, flag_dup, flag_dgate, rows, F, stream);
    const size_t n = (size_t)rows * F;
    ew_account("ew", "ew_check_rows_kernel", g, 8.0 * n, !dact ? n * 12 : (dup ? n * 10 : 0) + (dgate ? n * 6 : 0), 0);   /* the tensors each part reads */
}
/* ReLU^2's backward: dgate against dact and gate; does not wait */
static void ew_check_relu2_backward(int* flag_dgate, const bf16* dgate, const bf16* dact, const bf16* gate, int rows, int F, int ld,
                                    cudaStream_t stream) {
    if (rows <= 0 || F <= 0) return;
    EwcRelu2Bwd e = {dgate, dact, gate, F, ld};
    const dim3 g = ew_check_rows(e, ewc_vec(F, ld, dgate, dact, gate, NULL, NULL, NULL, NULL), NULL, NULL, flag_dgate, rows, F, stream);
    ew_account("ew", "ew_check_rows_kernel", g, 3.0 * rows * F, (size_t)rows * F * 6, 0);
}

#endif
