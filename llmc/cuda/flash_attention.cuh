/* flash_attention.cuh: fused (FlashAttention-2 style) causal GQA attention on tensor cores, forward and
 * backward, deterministic. CPU reference: attention_forward / attention_backward in llmc/cpu/cpu_kernels.h
 * (the same math as the materialised llmc/cuda/attention.cuh, without ever writing a T x T tensor).
 *
 * Math (g = H/KV query heads share kv head j = h/g; scale = 1/sqrt(hd); only s <= t is read):
 *   z[t,s]  = scale * q[b,t,h] . k[b,s,j]
 *   lse[t]  = log sum_{s<=t} exp(z[t,s])                          (saved, fp32, for the backward)
 *   out[t]  = sum_{s<=t} exp(z[t,s] - lse[t]) v[b,s,j]
 * forward, online softmax over key tiles s0 = 0, BK, 2BK, ... up to the diagonal (tiles above it are
 * never visited), per query row, in fp32:
 *   m' = max(m, max_s z),  a = exp(m - m'),  l' = a l + sum_s exp(z - m'),  o' = a o + sum_s bf16(exp(z - m')) v_s
 *   out = o / l rounded once to bf16,  lse = m + log(l)
 * backward (dout given; P recomputed from q, k and lse, never stored):
 *   D[t]    = sum_d dout[t,d] out[t,d]            (= sum_s P[t,s] dP[t,s]; the forward's bf16 out)
 *   P[t,s]  = exp(z[t,s] - lse[t]),  dP[t,s] = dout[t] . v[s],  dZ[t,s] = P (dP - D[t])
 *   dq[t]   = scale sum_s bf16(dZ[t,s]) k[s]
 *   dk[s]   = scale sum_{h in j} sum_t bf16(dZ[t,s]) q[t]
 *   dv[s]   =       sum_{h in j} sum_t bf16(P[t,s]) dout[t]
 *
 * Layouts: q, out, dq, dout [B,T,H*hd] and k, dk [B,T,KV*hd] (heads interleaved per token, as the
 * projections write them and as llmc/cuda/attention.cuh takes them: no permute kernels); v and dv the
 * same with ldv elements between consecutive tokens (KV*hd when contiguous; (H+2KV)*hd when they are
 * column views of a fused [B*T, (H+2KV)*hd] QKV buffer); lse and D [B,H,T] fp32 (row (b*H + h)*T + t).
 * Every tensor 16-byte aligned and ldv a multiple of 8 (cp.async copies 16 bytes; checked, one-line error).
 * head_dim 32 (the tiny presets), 64 or 128 (template HD; flash_attention_supported).
 *
 * Tensor cores (every wrapper from llmc/cuda/ptx.cuh; no inline asm here). Every tile product is
 * mma.sync m16n8k16 bf16 x bf16 -> fp32 (mma_bf16_16816): a warp's 16 rows x 8 columns per instruction,
 * k = 16 per step. Fragments (lane = 4 gq + tq): the C fragment element e of n-block nb holds row
 * gq + 8 (e >> 1), column 8 nb + 2 tq + (e & 1). Operands come from shared memory by ldmatrix:
 *   flash_mma_nt  acc += A B^T over d (S = Q K^T, dP = dO V^T, and in the dk/dv kernel S^T = K Q^T,
 *                 dP^T = V dO^T): A = the warp's 16 rows by ldmatrix_x4 (rows lane & 15, columns
 *                 8 (lane >> 4): matrices a[0..3]); B = rows of a [row][d] tile by ldmatrix_x4, two
 *                 n-blocks a call (no .trans: a [n][k] tile is the "col" operand as stored).
 *   flash_mma_nn  acc += P B over the tile's rows (o += P V, dq += dZ K, dv += P^T dO, dk += dZ^T Q):
 *                 B = a [k][d] tile by ldmatrix_x4_trans, two n-blocks of d a call.
 *   flash_c_to_a  P (or dZ) never leaves registers: the C fragments of S for key columns 16 ks .. 16 ks
 *                 + 15 (n-blocks 2 ks, 2 ks + 1) are exactly the A fragment of k-step ks of the next
 *                 product (a[0] = C[2ks][0..1], a[1] = C[2ks][2..3], a[2] = C[2ks+1][0..1],
 *                 a[3] = C[2ks+1][2..3]), each pair rounded to bf16 by pack_bf16x2 (round to nearest even).
 * The softmax statistics m, l of a row live in the 4 lanes of its quad (each lane its own columns'
 * partial l; the row max and the final l combined by xor 1, xor 2: every lane gets the same bits).
 *
 * Shared memory: bf16 tiles [rows][HD + 8]: one row is HD/8 16-byte chunks plus one chunk of padding,
 * so the row stride is 16 mod 128 bytes and the 8 row addresses of one ldmatrix 8x8 matrix (with or
 * without .trans) land in 8 distinct 16-byte bank groups: conflict-free. Padding rather than an XOR
 * swizzle: the addresses stay plain row * stride + column (one formula for cp.async, ldmatrix and
 * .trans, readable in the emulator's error messages), at the cost of 16 bytes a row (11% at hd 64).
 * cp.async writes: a warp's 32 consecutive 16-byte chunks of consecutive rows (2-way conflicts at hd 32
 * only, where a row is 4 chunks). Dynamic shared memory, opted in above 48 KB (flash_smem_optin).
 * Tiles are loaded by flash_cp_tile (cp.async 16 bytes; rows >= T zero-filled, nothing read) and
 * double-buffered: the load of tile i+1 is issued before tile i is computed; cp_async_wait<1> (<0> at
 * the last tile) and a barrier make tile i visible, a second barrier at the end of the iteration frees
 * its buffer for tile i+2.
 *
 * Kernels (128 threads = 4 warps, each warp 16 rows of the block's tile; grids 1-D with the tile index
 * slowest and the heaviest tiles first, so the block scheduler starts the long blocks first):
 *   forward   one block per (query tile of BQ = 64 rows, b, h), the last query tile first. Q tile once,
 *             K/V tiles 0 .. last row / BK double-buffered. Per K/V tile a warp computes S (16 x BK) =
 *             Q K^T, masks s > t and s >= T (only on tiles that reach past the warp's first row or past
 *             T), rescales o and l, P = exp(z - m) -> bf16 A fragments, o += P V. With rss (-protect bound's o
 *             check) the epilogue also leaves each (row, head)'s sum of squares of the bf16 out it stores, in double
 *             (the quad's lanes their columns, then xor 1, xor 2): the residual norm that checks o reads H doubles a
 *             row instead of the row; registers unchanged (96 / 128 / 168).
 *   D         one warp per (b, t, h) row, lanes stride d, warp butterfly (flash_rowdot; computed twice and compared
 *             under -protect qk_bwd, whose rerun of dq and dk reads this D instead of a second one). In the first
 *             pass the dq kernel makes it (FlashRowDot): each warp its 16 rows before its tile loop, from dout and out
 *             in global memory, stored for the dk/dv kernel launched after it; where D must exist before a launch
 *             (the rerun's one dq + dk launch, when it does not reuse the first pass's), flash_attention_rowdot_kernel.
 *   dq        one block per (query tile, b, h), as the forward: Q and dout tiles once, K/V tiles 0 ..
 *             diagonal double-buffered: S = Q K^T, dP = dO V^T, dZ = P (dP - D) masked at s > t,
 *             dq += bf16(dZ) K; dq * scale rounded once.
 *   dk, dv    one block per (key tile of BK = 64 rows, b, kv head j, split sp), the first key tile (which
 *             meets every query tile) first. K/V tile once; the block loops over (head h of its split,
 *             query tile from the diagonal on), heads outer, and double-buffers Q, dout (cp.async) and
 *             lse, D (plain loads: a row of lse is 16-byte aligned only when T is a multiple of 4).
 *             Per query tile a warp (16 keys) computes S^T = K Q^T, dP^T = V dO^T, P^T, dZ^T, then
 *             dv += bf16(P^T) dO and dk += bf16(dZ^T) Q.
 *             Head split, for a full grid without atomics: the grid has ceil(T/64) KV B nsplit blocks,
 *             nsplit the smallest divisor of g giving >= FLASH_DKV_MIN_BLOCKS = 264 (2 resident blocks on
 *             each of 132 SMs; the causal imbalance, T/BQ query tiles for the first key tile and one for the
 *             last, needs more blocks than SMs to even out), else g. Split sp sums the heads
 *             j g + sp g/nsplit .. in its own fp32 accumulators; nsplit 1 writes bf16 dk, dv directly,
 *             nsplit > 1 writes fp32 partials [nsplit][2][B,T,KV*hd] (workspace) that
 *             flash_attention_dkdv_sum_kernel adds in split order sp = 0, 1, ... (then * scale for dk)
 *             and rounds once (inside the dk/dv kernel: the last of a key tile's nsplit blocks to finish adds them,
             an integer counter after a __threadfence; the separate sum kernel remains for the tests, which hold the
             two bitwise). llama3.2-1b (H 32, KV 8, g 4, T 1024): B 1: 16 x 8 = 128 blocks unsplit,
 *             nsplit 2 gives 256 < 264, so nsplit 4: 512 blocks (plus the sum pass over 2 x 4 MB of partials
 *             read 4 times); B >= 3: unsplit (B 8: 1024 blocks). qwen3-0.6b (g 2): B 1 nsplit 2, 256 blocks.
 *             The split depends on the shape (B, T, KV, g) only, never on the device, so the bits do too.
 *   rerun     dq and dk alone (dv NULL: -protect qk_bwd's recomputation from the first pass's D) in one launch,
 *             flash_attention_backward_dqdk_kernel: the dk-only grid, then the dq grid, each block running its
 *             kernel's body (the same bits as two launches). The first pass keeps its two launches: the dk/dv
 *             variant's registers (below) would take the dq blocks from 3 to 2 resident a SM. With a FlashQkEpi the
 *             rerun writes neither dq nor dk: each block's finished tile goes through RoPE's (and Qwen3's QK norm's)
 *             backward in shared memory and only its fingerprint leaves (flash_qk_epilogue).
 * Tiles (FlashTiles<HD>): forward BQ 64, BK 64; dq BQ 64, BK 64 (32 at hd 128); dk/dv BK 64, BQ 64 (32 at
 * hd 128). Dynamic shared memory (bytes), hd 32 / 64 / 128: forward 25600 / 46080 / 87040 (Q + 2 x K + 2 x V);
 * dq 30720 / 55296 / 69632 (Q + dO + 2 x K + 2 x V); dk/dv 31744 / 56320 / 70144 (K + V + 2 x Q + 2 x dO + 2 x
 * lse, D). Registers (ptxas -v, CUDA 13.0.88, sm_90; sm_80 in brackets where it differs), hd 32 / 64 / 128:
 * forward 96 / 128 / 168 (the CHK variant the same); dq 127 / 168 / 168 with D made inside (128 / 166 / 164 without it; CHK 128 / 168 / 166; 3 blocks a SM by registers either way); dk/dv 168 / 228 / 255
 * with 24 / 0 / 12 bytes of spill stores (sm_80: 161 / 224 / 252, no spills: the two 16 x 128 fp32 accumulators of a
 * warp are 128 registers a lane); the rerun's dq + dk-only kernel 128 / 168 / 168, 4 / 8 / 0 bytes of spills (sm_80
 * 4 / 0 / 0), with the Q/K epilogue the same registers, 4 / 24 / 0 bytes of spills (sm_80 0 / 0 / 0) and 512 bytes
 * of static shared memory for the fingerprint's block reduction; the sum and D kernels 34 and 31. The accounting leaves out the CHK variants' extra CUDA-core adds
 * (about 2 a live entry) and their 8 bytes a row (the checks' own launches carry their cost).
 *
 * Summation order (bitwise reproducible, no atomics, one order per output): every dot over d in mma
 * k-steps of 16, ascending; o and dq over key tiles ascending, within a tile over its k-steps of 16 keys
 * ascending; l over tiles ascending, each lane its own columns, then the quad (xor 1, xor 2); dk, dv over
 * (head of the split ascending, then query tiles ascending, k-steps of 16 queries within), then the splits
 * in order; each output rounded once to bf16 (dq, dk times scale first). Within one mma the hardware's
 * order and internal precision are NVIDIA's (fixed, not documented); the emulator adds the 16 exact
 * products in double and rounds once. Both are deterministic; they agree to rounding, not bitwise.
 *
 * Precision against the CPU (fp32) and the materialised path (llmc/cuda/attention.cuh): the fused path
 * keeps S, the softmax statistics, dP and dZ in fp32 registers and rounds to bf16 only the A operands of
 * the second products, P (unnormalised) for P V and P^T dO and dZ for dZ K and dZ^T Q (relative 2^-8 a
 * term), as the materialised path rounds its stored probs and dlogits; out is normalised by the fp32 row
 * sum of the unrounded P. The CPU normalises p first and keeps probs and dlogits in fp32. The backward's
 * D comes from the bf16 out (the CPU's from sum P dP in fp32). tests/cuda/attention.cuh (test_flash_attention)
 * derives the per-element bounds from this accumulation order. Rows t >= T of a partial tile read zeros and
 * are never stored; keys s > t add exact zeros. Non-finite inputs: a NaN/inf in q, k or v reaches only the
 * rows that read it (s <= t), as on the CPU.
 *
 * The attention checks (-protect att, att_bwd) run inside: with a FlashCheck the forward and dq kernels (template
 * CHK) also accumulate, per row, the sums the checks compare (z and the rounded P; dP and the rounded dZ; see
 * FlashCheck below), from the registers the products use, a few fp32 adds a live entry and no extra memory traffic
 * but 2 floats a row; llmc/sdc/attcheck.cuh compares them with the CPU's references and bounds. A FlashPlant
 * (test-only) changes one intermediate element where a hardware fault would (tests/cuda/attention.cuh,
 * test_flash_attcheck). What the fused path does not provide: the stored att_logits / att_probs tensors (fault
 * injection into them, ATTNChecker's column checksums of -detect abft, the propagation trace read them):
 * train_sdc.cu keeps the materialised path for those (see attention_fused there and the README).
 *
 * Speed (a prediction until a GPU is lent; nothing here was timed): llama3.2-1b at B 8, T 1024 does
 * 4 B H hd T^2/2 = 34 GFLOP of causal attention forward per layer and 3.5 times that backward (S and dP
 * recomputed in both backward kernels), 2.5 TFLOP a step over 16 layers: ~11 ms at FlashAttention-2's
 * ~230 TFLOP/s on an H100, against ~120 ms for the CUDA-core version this replaces. Next steps on
 * hardware: 32 rows a warp in the forward (fewer K/V ldmatrix per mma), exp2 with the scale folded in,
 * wgmma/TMA on sm_90.
 *
 * Scratch: workspace slot 4 (shared with llmc/cuda/attention.cuh; neither holds it across calls): D
 * [B,H,T] fp32, then the dk/dv partials when the head split is on.
 *
 * Accounting (launch_account, COST_ATTENTION): the tile kernels as tensor-core work (COST_TC), FLOPs per
 * (t, s) pair that the tiles cover (flash_pairs_rows / flash_pairs_cols: whole tiles up to and across the
 * diagonal, masked entries included, as the kernels compute them), 2 hd per tile product: forward 4 hd
 * (S, P V), dq 6 hd (S, dP recomputed, dq), dk/dv 8 hd (S, dP recomputed, dv, dk); the softmax and dZ
 * arithmetic beside them (about 5 CUDA-core operations a pair, an exp among them) is not counted. Bytes:
 * each input read once, each output written once (the k/v tiles that every query tile reads again come
 * from L2 and are not counted), the head split's fp32 partials written and read back by the sum pass
 * (COST_FP32); D by flash_attention_rowdot_kernel (COST_FP32), or in the dq kernel as out read and D written (its
 * 2 hd CUDA-core operations a row not counted). */
#ifndef TSDC_FLASH_ATTENTION_CUH
#define TSDC_FLASH_ATTENTION_CUH

#include <math.h>
#include <stdint.h>
#include "cuda_common.cuh"
#include "ptx.cuh"
#include "qknorm_rope.cuh"

#define FLASH_WARPS 4                     /* each warp owns 16 rows of the block's tile */
#define FLASH_THREADS (32 * FLASH_WARPS)
#define FLASH_SLOT 4                      /* workspace slot: D, then the dk/dv partials */
#define FLASH_DKV_MIN_BLOCKS 264          /* dk/dv grid target: 2 blocks on each of 132 SMs (see the header) */
#define FLASH_STATIC_SMEM (48 * 1024)     /* above it a kernel needs the dynamic shared-memory opt-in */

/* tile sizes per head dim: rows of the query tile (BQ) and of the key/value tile (BK) per kernel. The
 * warp-owned side is always 16 * FLASH_WARPS = 64; the other side is 64, or 32 at head_dim 128 in the
 * backward (its registers: two fp32 accumulators of 16 x 128 a warp, see the header) */
template <int HD> struct FlashTiles {
    enum { FWD_BQ = 64, FWD_BK = 64, DQ_BQ = 64, DQ_BK = HD > 64 ? 32 : 64, DKV_BK = 64, DKV_BQ = HD > 64 ? 32 : 64 };
};

static inline int flash_attention_supported(int hd) { return hd == 32 || hd == 64 || hd == 128; }

/* 16 bytes: the unit of the dynamic shared memory (its alignment) and of the fp32 partials' reads */
struct alignas(16) flash_chunk {
    uint32_t w[4];
};
struct alignas(16) flash_f4 {
    float x, y, z, w;
};
struct alignas(8) flash_f2 {
    float x, y;
};

/* The attention checks' row sums (-protect att, att_bwd; llmc/sdc/attcheck.cuh compares them), computed by the
 * fused kernels from the values they hold, in fp32, over the live keys s <= t of each stored row t
 * ([B*H*T], row (b*H + h)*T + t; each lane its own columns over the tiles ascending, then the quad xor 1, xor 2):
 *   forward  rows_a[t] = sum_s z[t,s]                    (the scaled logits, as S leaves the mma)
 *            rows_b[t] = (sum_s bf16(P[t,s])) / l[t]     (the rounded P that P V consumes, unpacked from its A
 *                        fragments, rescaled with l by each tile's alpha: the normalised probabilities' row sum)
 *   dq       rows_a[t] = sum_s dP[t,s]                   (dP = dO V^T as it leaves the mma)
 *            rows_b[t] = sum_s bf16(dZ[t,s])             (the rounded dZ that dZ K consumes)
 * A plant (test-only, FlashPlant) changes one element of one intermediate x -> x * mul + add, inside the kernel,
 * where a hardware fault would: S before the mask and the softmax, P after l took it (the operand of P V alone,
 * as the CPU's stored probs after the softmax), dP before dZ, dZ before its rounding; in the dk/dv kernel P^T after
 * dZ^T took it (dv's operand alone), dP^T before dZ^T, dZ^T before its rounding. where = FLASH_PLANT_NONE in every
 * trainer launch: one warp-uniform comparison a tile. */
enum { FLASH_PLANT_NONE = 0, FLASH_PLANT_S, FLASH_PLANT_P, FLASH_PLANT_DP, FLASH_PLANT_DZ, FLASH_PLANT_DKV_P, FLASH_PLANT_DKV_DP,
       FLASH_PLANT_DKV_DZ };
struct FlashPlant {
    int where, b, h, t, s;   /* the intermediate, batch, query head, query row, key */
    float mul, add;
};
struct FlashCheck {
    float* rows_a;   /* [B*H*T] (NULL: the kernel computes no row sums) */
    float* rows_b;
    FlashPlant plant;
};
/* x * mul + add where (where, b, h, t, s) is the planted element */
__device__ __forceinline__ float flash_plant(const FlashPlant& pl, int where, int b, int h, int t, int s, float x) {
    return pl.where == where && pl.b == b && pl.h == h && pl.t == t && pl.s == s ? x * pl.mul + pl.add : x;
}
/* the two bf16 halves of a packed pair (pack_bf16x2: lo in bits 0..15) as fp32, exactly */
__device__ __forceinline__ float flash_bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float flash_bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }
/* the row sums of the bf16 A fragments pa (rows g: a[0], a[2]; g + 8: a[1], a[3]) added to r[0], r[1] */
template <int KS> __device__ __forceinline__ void flash_a_rowsum(float (&r)[2], const uint32_t (&pa)[KS][4]) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        r[0] += flash_bf16_lo(pa[ks][0]) + flash_bf16_hi(pa[ks][0]) + flash_bf16_lo(pa[ks][2]) + flash_bf16_hi(pa[ks][2]);
        r[1] += flash_bf16_lo(pa[ks][1]) + flash_bf16_hi(pa[ks][1]) + flash_bf16_lo(pa[ks][3]) + flash_bf16_hi(pa[ks][3]);
    }
}

/* a shared tile row: HD bf16 plus 8 bf16 (16 bytes) of padding; the row stride is 16 mod 128 bytes */
#define FLASH_LDS(HD) ((HD) + 8)

/* -protect qk_bwd's rerun with the rest of the Q/K path inside (FlashQkEpi given to flash_attention_backward, dq, dk and
 * dv NULL): the dq block's final tile (64 query rows of head h) and the dk block's (64 keys of kv head j, after the head
 * split's sum where there is one) are rounded to bf16 as they would be stored, put in shared memory, and each row goes
 * through RoPE's backward (and, with x, Weighted QK norm's backward: Qwen3) in qknr_backward_group_fp, the body of the
 * separate fingerprint-only kernels (qknorm_rope.cuh), so the fingerprints are theirs; nothing is written but the
 * block's fingerprint, XORed into fpq / fpk. Saves the rerun's dq, dk round trip through memory and the launch of the
 * path's last kernel. nanochat's QK norm after RoPE keeps the separate kernels. */
struct FlashQkEpi {
    const float *cos, *sin;   /* RoPE's tables [T, hd/2] */
    int style;
    float eps;
    const bf16 *xq, *xk;      /* the forward's QK-norm inputs (views of the fused projection output, row stride ldx); NULL: RoPE alone */
    int ldx;
    const bf16 *wq, *wk;      /* the norms' weights */
    const float *msq, *msk;   /* the forward's mean squares [B T H], [B T KV] */
    unsigned long long *fpq, *fpk;
};
/* a warp's 16 x HD accumulator tile (C fragments: rows gq, gq + 8, columns 8 nd + 2 tq, + 1) times scale, rounded to bf16
 * as the kernel would store it, into rows 16 warp .. of a shared [64][LDS] tile */
template <int HD>
__device__ __forceinline__ void flash_acc_to_tile(bf16* tile, const float (&acc)[HD / 8][4], float scale, int warp, int gq, int tq) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        uint32_t* dst = reinterpret_cast<uint32_t*>(tile + (16 * warp + gq + 8 * r) * FLASH_LDS(HD)) + tq;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) dst[4 * nd] = pack_bf16x2(acc[nd][2 * r] * scale, acc[nd][2 * r + 1] * scale);
    }
}
/* the epilogue over a finished tile (shared memory, [64][LDS] bf16, rows 0 .. nvalid-1 hold positions t0 .. of head
 * `head`, of q or of k): every thread of the block calls it; the warps take lane groups of L = HD/8 lanes a row, 32/L
 * rows at a time */
template <int HD>
__device__ __forceinline__ void flash_qk_epilogue(const bf16* tile, int t0, int nvalid, int b, int T, int head, int nh, bool is_k,
                                                  const FlashQkEpi& e) {
    constexpr int L = HD / 8, RPW = 32 / L, LDS = FLASH_LDS(HD), ROWS = 16 * FLASH_WARPS;
    const bf16* x = is_k ? e.xk : e.xq;
    const bf16* w = is_k ? e.wk : e.wq;
    const float* ms = is_k ? e.msk : e.msq;
    const int ldx = e.ldx;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gl = lane & (L - 1);
    Fingerprint f = {0, 0};
    for (int r0 = warp * RPW; r0 < ROWS; r0 += FLASH_WARPS * RPW) {
        const int r = r0 + lane / L;
        const bool valid = r < nvalid;
        const int t = valid ? t0 + r : t0;   /* an idle lane reads row t0's inputs (valid memory) and folds nothing */
        const size_t n = (size_t)b * T + t, row = n * nh + head;
        float gv[8];
        const flash_chunk raw = *reinterpret_cast<const flash_chunk*>(tile + r * LDS + gl * 8);   /* 16 bytes, aligned */
#pragma unroll
        for (int i = 0; i < 4; i++) { gv[2 * i] = flash_bf16_lo(raw.w[i]); gv[2 * i + 1] = flash_bf16_hi(raw.w[i]); }
        qknr_backward_group_fp(gv, x ? x + n * ldx + (size_t)head * HD + gl * 8 : NULL, x ? w + gl * 8 : NULL, x && valid ? ms[row] : 0.0f, valid,
                               gl, L, HD, t, e.eps, e.cos, e.sin, e.style, (uint64_t)(row * HD + gl * 8), &f);
    }
    fp_block_reduce(f, is_k ? e.fpk : e.fpq);
}

/* bytes of dynamic shared memory of each kernel */
template <int HD> static constexpr int flash_fwd_smem() { return (FlashTiles<HD>::FWD_BQ + 4 * FlashTiles<HD>::FWD_BK) * FLASH_LDS(HD) * 2; }
template <int HD> static constexpr int flash_dq_smem() { return (2 * FlashTiles<HD>::DQ_BQ + 4 * FlashTiles<HD>::DQ_BK) * FLASH_LDS(HD) * 2; }
template <int HD> static constexpr int flash_dkv_smem() {
    return (2 * FlashTiles<HD>::DKV_BK + 4 * FlashTiles<HD>::DKV_BQ) * FLASH_LDS(HD) * 2 + 4 * FlashTiles<HD>::DKV_BQ * 4;
}

/* ---------------------------------------------------------------------------- device helpers */
/* rows row0 .. row0+R-1 of a bf16 tensor (row r at src + r*ld, HD elements) into the shared tile dst
 * (row stride FLASH_LDS(HD)) with cp.async, 16 bytes a copy, consecutive threads on consecutive 16-byte
 * chunks of a row; rows >= nrows are zero-filled (a copy of 0 source bytes reads nothing). The caller commits. */
template <int R, int HD>
__device__ __forceinline__ void flash_cp_tile(bf16* dst, const bf16* src, size_t ld, int row0, int nrows) {
    constexpr int CPR = HD / 8;
    static_assert(R * CPR % FLASH_THREADS == 0, "flash_cp_tile: whole rounds of the block");
#pragma unroll
    for (int i0 = 0; i0 < R * CPR; i0 += FLASH_THREADS) {
        const int i = i0 + (int)threadIdx.x, r = i / CPR, c = i - r * CPR;
        const int ok = row0 + r < nrows;
        const bf16* s = ok ? src + (size_t)(row0 + r) * ld + c * 8 : src;
        cp_async_16(dst + r * FLASH_LDS(HD) + c * 8, s, ok ? 16 : 0);
    }
}

/* acc[nb] (the C fragments of a 16 x 8*NB tile) += A B^T over HD: A the warp's 16 rows at sA, B the
 * 8*NB rows at sB, both row-major [row][d] in shared memory. k-steps of 16 ascending over d (each
 * element's dot: d ascending in blocks of 16). A by ldmatrix_x4 (rows lane & 15, columns 8 (lane >> 4));
 * B by ldmatrix_x4 for two n-blocks (rows 8 nb + (lane & 7) + 8 (lane >> 4), columns 8 ((lane >> 3) & 1)). */
template <int NB, int HD>
__device__ __forceinline__ void flash_mma_nt(float (&acc)[NB][4], const bf16* sA, const bf16* sB, int lane) {
    static_assert(NB % 2 == 0 && HD % 16 == 0, "flash_mma_nt: shape");
    constexpr int LDS = FLASH_LDS(HD);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[4];
        ldmatrix_x4(a, sA + (lane & 15) * LDS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nb = 0; nb < NB; nb += 2) {
            uint32_t b[4];
            ldmatrix_x4(b, sB + (nb * 8 + (lane & 7) + (lane >> 4) * 8) * LDS + kk * 16 + ((lane >> 3) & 1) * 8);
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_bf16_16816(acc[nb], a, b0, acc[nb]);
            mma_bf16_16816(acc[nb + 1], a, b1, acc[nb + 1]);
        }
    }
}

/* acc[nd] (the C fragments of a 16 x HD tile) += P B over the 16*KS rows of B: P as A fragments in
 * registers (pa[ks]: columns 16 ks .. 16 ks + 15), B row-major [k][d] in shared memory at sB, read by
 * ldmatrix_x4_trans for two n-blocks (rows 16 ks + (lane & 7) + 8 ((lane >> 3) & 1), columns 8 nd +
 * 8 (lane >> 4)). k-steps ascending. */
template <int KS, int HD>
__device__ __forceinline__ void flash_mma_nn(float (&acc)[HD / 8][4], const uint32_t (&pa)[KS][4], const bf16* sB, int lane) {
    constexpr int LDS = FLASH_LDS(HD), ND = HD / 8;
    static_assert(ND % 2 == 0, "flash_mma_nn: shape");
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int nd = 0; nd < ND; nd += 2) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, sB + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + nd * 8 + (lane >> 4) * 8);
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_bf16_16816(acc[nd], pa[ks], b0, acc[nd]);
            mma_bf16_16816(acc[nd + 1], pa[ks], b1, acc[nd + 1]);
        }
    }
}

/* the C fragments of a 16 x 16 KS tile (x[nb][e]: row g + 8 (e >> 1), column 8 nb + 2t + (e & 1)) rounded
 * to bf16 as the A fragments of the next product, k-step ks = key/query columns 16 ks .. 16 ks + 15:
 * a[0] = row g, columns 2t, 2t+1 = x[2ks][0..1]; a[1] = row g+8 = x[2ks][2..3]; a[2], a[3] the same of
 * columns 2t+8, 2t+9 = x[2ks+1]. No shared memory: the accumulator layout is the operand layout. */
template <int KS>
__device__ __forceinline__ void flash_c_to_a(uint32_t (&pa)[KS][4], const float (&x)[2 * KS][4]) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        pa[ks][0] = pack_bf16x2(x[2 * ks][0], x[2 * ks][1]);
        pa[ks][1] = pack_bf16x2(x[2 * ks][2], x[2 * ks][3]);
        pa[ks][2] = pack_bf16x2(x[2 * ks + 1][0], x[2 * ks + 1][1]);
        pa[ks][3] = pack_bf16x2(x[2 * ks + 1][2], x[2 * ks + 1][3]);
    }
}

/* over the 4 lanes of a quad (the lanes holding one row of a C fragment): xor 1, then xor 2; fp32 max
 * and + commute, so every lane of the quad gets the same bits */
__device__ __forceinline__ float flash_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float flash_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* ------------------------------------------------------------------------------------ kernels */
/* grid: one block per (query tile, b, h), 1-D, the query tile slowest and the last (heaviest) first */
template <int HD, bool CHK>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q, const bf16* __restrict__ k,
                               const bf16* __restrict__ v, int B, int T, int H, int KV, int ldv, float scale, float* __restrict__ rows_a,
                               float* __restrict__ rows_b, FlashPlant pl, double* __restrict__ rss) {
    constexpr int BQ = FlashTiles<HD>::FWD_BQ, BK = FlashTiles<HD>::FWD_BK, LDS = FLASH_LDS(HD);
    constexpr int NB = BK / 8, KS = BK / 16, ND = HD / 8;
    static_assert(BQ == 16 * FLASH_WARPS && BK % 16 == 0, "forward: tile shape");
    extern __shared__ flash_chunk flash_smem[];
    bf16* sQ = reinterpret_cast<bf16*>(flash_smem); /* [BQ][LDS] */
    bf16* sK = sQ + BQ * LDS;                        /* [2][BK][LDS] */
    bf16* sV = sK + 2 * BK * LDS;                    /* [2][BK][LDS] */
    const int nqt = CEIL_DIV(T, BQ), nbh = B * H;
    const int t0 = (nqt - 1 - (int)(blockIdx.x / nbh)) * BQ;
    const int h = (int)(blockIdx.x % nbh) % H, b = (int)(blockIdx.x % nbh) / H, j = h / (H / KV);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    const bf16* kb = k + (size_t)b * T * ldk + (size_t)j * HD;
    const bf16* vb = v + (size_t)b * T * ldv + (size_t)j * HD;
    const int last = min(t0 + BQ, T) - 1; /* the tile's last stored row: key tiles 0 .. last / BK */
    const int ntiles = last / BK + 1;
    flash_cp_tile<BQ, HD>(sQ, q + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);
    flash_cp_tile<BK, HD>(sK, kb, ldk, 0, T);
    flash_cp_tile<BK, HD>(sV, vb, ldv, 0, T);
    cp_async_commit();

    const int r0 = t0 + 16 * warp;            /* the warp's first row */
    const int trow[2] = {r0 + gq, r0 + gq + 8}; /* this lane's two rows (C fragment rows g, g + 8) */
    float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float zs[2] = {0.0f, 0.0f}, pb[2] = {0.0f, 0.0f}; /* CHK: the row sums of z and of bf16(P) (FlashCheck) */
    const bool plant_bh = pl.where != FLASH_PLANT_NONE && pl.b == b && pl.h == h && pl.t >= r0 && pl.t < r0 + 16;
#pragma unroll
    for (int nd = 0; nd < ND; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nd][e] = 0.0f;
    for (int it = 0; it < ntiles; it++) {
        const int s0 = it * BK, buf = it & 1;
        if (it + 1 < ntiles) { /* the next K/V tile into the other buffer (free: the barrier at the loop's end) */
            flash_cp_tile<BK, HD>(sK + (buf ^ 1) * BK * LDS, kb, ldk, s0 + BK, T);
            flash_cp_tile<BK, HD>(sV + (buf ^ 1) * BK * LDS, vb, ldv, s0 + BK, T);
            cp_async_commit();
            cp_async_wait<1>(); /* everything but the newest group: this tile (and Q) landed */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nb][e] = 0.0f;
        flash_mma_nt<NB, HD>(s, sQ + 16 * warp * LDS, sK + buf * BK * LDS, lane);
        /* scale; mask s > t (causal) and s >= T (rows t >= T are never stored; they read the valid keys).
         * Only tiles that reach past the warp's first row or past T need the mask (warp-uniform). */
        const bool masked = s0 + BK - 1 > r0 || s0 + BK > T;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = s0 + 8 * nb + 2 * tq + (e & 1), row = trow[e >> 1];
                float z = s[nb][e] * scale;
                if (plant_bh) z = flash_plant(pl, FLASH_PLANT_S, b, h, row, col, z);
                if (masked && (col > row || col >= T)) z = -INFINITY;
                else if (CHK) zs[e >> 1] += z;
                s[nb][e] = z;
                mx[e >> 1] = fmaxf(mx[e >> 1], z);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* finite: the first tile holds s = 0 <= t for every row, so m is finite from then on */
            const float mn = fmaxf(m[r], flash_quad_max(mx[r]));
            alpha[r] = expf(m[r] - mn); /* 0 on the first tile (m = -inf) */
            m[r] = mn;
            l[r] *= alpha[r];
            if (CHK) pb[r] *= alpha[r];
        }
#pragma unroll
        for (int nd = 0; nd < ND; nd++) {
            o[nd][0] *= alpha[0];
            o[nd][1] *= alpha[0];
            o[nd][2] *= alpha[1];
            o[nd][3] *= alpha[1];
        }
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = expf(s[nb][e] - m[e >> 1]); /* 0 where masked */
                l[e >> 1] += p;                              /* the lane's columns, fp32 */
                s[nb][e] = plant_bh ? flash_plant(pl, FLASH_PLANT_P, b, h, trow[e >> 1], s0 + 8 * nb + 2 * tq + (e & 1), p) : p;
            }
        uint32_t pa[KS][4];
        flash_c_to_a<KS>(pa, s);                      /* P rounded to bf16: the A operand of P V */
        if (CHK) flash_a_rowsum<KS>(pb, pa);
        flash_mma_nn<KS, HD>(o, pa, sV + buf * BK * LDS, lane);
        __syncthreads(); /* every warp is done with this buffer before the next iteration refills it */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float sum = flash_quad_sum(l[r]); /* the four lanes' partial sums of the row */
        const float zsum = CHK ? flash_quad_sum(zs[r]) : 0.0f, pbsum = CHK ? flash_quad_sum(pb[r]) : 0.0f;
        const int t = trow[r];
        if (rss) {   /* the sum of squares of this head's stored (bf16) out row: each lane its columns in nd order, then the quad */
            const float inv = 1.0f / sum;
            double ss = 0.0;
#pragma unroll
            for (int nd = 0; nd < ND; nd++) {
                const uint32_t w = pack_bf16x2(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
                const double lo = flash_bf16_lo(w), hi = flash_bf16_hi(w);
                ss += lo * lo;
                ss += hi * hi;
            }
            ss += __shfl_xor_sync(0xffffffffu, ss, 1);
            ss += __shfl_xor_sync(0xffffffffu, ss, 2);
            if (t < T && tq == 0) rss[((size_t)b * T + t) * H + h] = ss;
        }
        if (t < T) {
            const float inv = 1.0f / sum;
            uint32_t* dst = reinterpret_cast<uint32_t*>(out + ((size_t)b * T + t) * ldq + (size_t)h * HD) + tq;
#pragma unroll
            for (int nd = 0; nd < ND; nd++) dst[4 * nd] = pack_bf16x2(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
            if (tq == 0) lse[((size_t)b * H + h) * T + t] = m[r] + logf(sum);
            if (CHK && tq == 0) { rows_a[((size_t)b * H + h) * T + t] = zsum; rows_b[((size_t)b * H + h) * T + t] = pbsum * inv; }
        }
    }
}

/* D of one row: sum_d a[d] o[d], lanes striding d, then the butterfly (every lane gets the same bits). dup (not NULL;
 * -protect qk_bwd, whose rerun reuses this D): the sum computed a second time from the loaded values through
 * dup_opaque (llmc/sdc/ewdup.cuh's duplication) and compared, *dup set to 1 on any difference. plant_xor (test-only, 0
 * in every trainer launch): flips these bits of the primary sum, as a fault in its arithmetic would. The one body of
 * flash_attention_rowdot_kernel and of the dq kernel's first pass (FlashRowDot), so both give the same bits. */
__device__ __forceinline__ float flash_rowdot(const bf16* __restrict__ a, const bf16* __restrict__ o, int hd, int lane,
                                              unsigned long long* dup, unsigned plant_xor) {
    float acc = 0.0f, acc2 = 0.0f;
    for (int d = lane; d < hd; d += 32) {
        acc += __bfloat162float(a[d]) * __bfloat162float(o[d]);
        if (dup) acc2 += dup_opaque(__bfloat162float(a[d])) * dup_opaque(__bfloat162float(o[d]));
    }
    acc = warp_reduce_sum(acc);
    if (plant_xor) acc = __uint_as_float(__float_as_uint(acc) ^ plant_xor);
    if (dup) {
        acc2 = warp_reduce_sum(acc2);
        if (lane == 0 && __float_as_uint(acc) != __float_as_uint(acc2)) atomicOr(dup, 1ull);
    }
    return acc;
}

/* D[(b*H + h)*T + t] = sum_d dout[b,t,h,d] out[b,t,h,d]: one warp per row, rows in memory order (flash_rowdot; plant_xor
 * on row 0). Where D must exist before a launch whose blocks all read it (the rerun's one dq + dk launch); the first
 * pass computes D inside its dq kernel instead (FlashRowDot) */
__global__ void flash_attention_rowdot_kernel(float* __restrict__ D, const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                              int B, int T, int H, int hd, unsigned long long* dup, unsigned plant_xor) {
    const size_t rows = (size_t)B * T * H;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return; /* the whole warp leaves together */
    const float acc = flash_rowdot(dout + row * hd, out + row * hd, hd, lane, dup, row == 0 ? plant_xor : 0u);
    if (lane == 0) {
        const int h = (int)(row % H);
        const size_t bt = row / H;
        const int t = (int)(bt % T);
        const size_t b = bt / T;
        D[(b * H + h) * T + t] = acc;
    }
}

/* the first pass's D made by its dq kernel (out not NULL): each warp, before its tile loop, computes D of its 16 rows
 * (flash_rowdot over dout and out from global memory, the rows one after another), uses them and stores them to Dw
 * (workspace slot 4) for the dk/dv kernel launched after it: no D launch, no second read of dout. dup and plant_xor as
 * flash_attention_rowdot_kernel's (plant_xor on the row b 0, h 0, t 0). out NULL: D read from the D argument. */
struct FlashRowDot {
    const bf16* out;
    float* Dw;
    unsigned long long* dup;
    unsigned plant_xor;
};

/* grid as the forward's: one block per (query tile, b, h), the last query tile first; bid: the block's index in
 * that grid (bid, or its place in the rerun's one launch, flash_attention_backward_dqdk_kernel) */
template <int HD, bool CHK, bool EPI = false>
__device__ __forceinline__ void flash_backward_dq_block(unsigned bid, bf16* __restrict__ dq, const bf16* __restrict__ dout,
                                                        const float* __restrict__ lse, const float* __restrict__ D,
                                                        const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                        int B, int T, int H, int KV, int ldv, float scale, float* __restrict__ rows_a,
                                                        float* __restrict__ rows_b, FlashPlant pl, const FlashQkEpi* epi = NULL,
                                                        FlashRowDot rd = FlashRowDot{}) {
    constexpr int BQ = FlashTiles<HD>::DQ_BQ, BK = FlashTiles<HD>::DQ_BK, LDS = FLASH_LDS(HD);
    constexpr int NB = BK / 8, KS = BK / 16, ND = HD / 8;
    static_assert(BQ == 16 * FLASH_WARPS && BK % 16 == 0, "dq: tile shape");
    extern __shared__ flash_chunk flash_smem[];
    bf16* sQ = reinterpret_cast<bf16*>(flash_smem); /* [BQ][LDS] */
    bf16* sO = sQ + BQ * LDS;                        /* dout [BQ][LDS] */
    bf16* sK = sO + BQ * LDS;                        /* [2][BK][LDS] */
    bf16* sV = sK + 2 * BK * LDS;                    /* [2][BK][LDS] */
    const int nqt = CEIL_DIV(T, BQ), nbh = B * H;
    const int t0 = (nqt - 1 - (int)(bid / nbh)) * BQ;
    const int h = (int)(bid % nbh) % H, b = (int)(bid % nbh) / H, j = h / (H / KV);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    const bf16* kb = k + (size_t)b * T * ldk + (size_t)j * HD;
    const bf16* vb = v + (size_t)b * T * ldv + (size_t)j * HD;
    const int last = min(t0 + BQ, T) - 1;
    const int ntiles = last / BK + 1;
    flash_cp_tile<BQ, HD>(sQ, q + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);
    flash_cp_tile<BQ, HD>(sO, dout + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);
    flash_cp_tile<BK, HD>(sK, kb, ldk, 0, T);
    flash_cp_tile<BK, HD>(sV, vb, ldv, 0, T);
    cp_async_commit();

    const int r0 = t0 + 16 * warp;
    const int trow[2] = {r0 + gq, r0 + gq + 8};
    float L[2], Dt[2], acc[ND][4];
    float dps[2] = {0.0f, 0.0f}, dzs[2] = {0.0f, 0.0f}; /* CHK: the row sums of dP and of bf16(dZ) (FlashCheck) */
    const bool plant_bh = pl.where != FLASH_PLANT_NONE && pl.b == b && pl.h == h && pl.t >= r0 && pl.t < r0 + 16;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        L[r] = trow[r] < T ? lse[((size_t)b * H + h) * T + trow[r]] : 0.0f;
        Dt[r] = trow[r] < T && !rd.out ? D[((size_t)b * H + h) * T + trow[r]] : 0.0f;
    }
    if (rd.out) /* D of the warp's rows, made here (FlashRowDot); the loop's bound is the same for the whole warp */
        for (int rr = 0; rr < 16 && r0 + rr < T; rr++) {
            const int t = r0 + rr;
            const size_t off = ((size_t)b * T + t) * ldq + (size_t)h * HD;
            const float dt = flash_rowdot(dout + off, rd.out + off, HD, lane, rd.dup, (b | h | t) == 0 ? rd.plant_xor : 0u);
            if (rr == gq) Dt[0] = dt;
            if (rr == gq + 8) Dt[1] = dt;
            if (lane == 0) rd.Dw[((size_t)b * H + h) * T + t] = dt;
        }
#pragma unroll
    for (int nd = 0; nd < ND; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nd][e] = 0.0f;
    for (int it = 0; it < ntiles; it++) {
        const int s0 = it * BK, buf = it & 1;
        if (it + 1 < ntiles) {
            flash_cp_tile<BK, HD>(sK + (buf ^ 1) * BK * LDS, kb, ldk, s0 + BK, T);
            flash_cp_tile<BK, HD>(sV + (buf ^ 1) * BK * LDS, vb, ldv, s0 + BK, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[NB][4], dp[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) { s[nb][e] = 0.0f; dp[nb][e] = 0.0f; }
        flash_mma_nt<NB, HD>(s, sQ + 16 * warp * LDS, sK + buf * BK * LDS, lane);  /* S = Q K^T */
        flash_mma_nt<NB, HD>(dp, sO + 16 * warp * LDS, sV + buf * BK * LDS, lane); /* dP = dO V^T */
        const bool masked = s0 + BK - 1 > r0;
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = s0 + 8 * nb + 2 * tq + (e & 1), row = trow[e >> 1];
                const float p = expf(s[nb][e] * scale - L[e >> 1]);
                const float dpe = plant_bh ? flash_plant(pl, FLASH_PLANT_DP, b, h, row, col, dp[nb][e]) : dp[nb][e];
                float dz = p * (dpe - Dt[e >> 1]);
                if (plant_bh) dz = flash_plant(pl, FLASH_PLANT_DZ, b, h, row, col, dz);
                if (masked && col > row) dz = 0.0f; /* keys s >= T are > every stored row: masked too */
                else if (CHK) dps[e >> 1] += dpe;
                s[nb][e] = dz;
            }
        uint32_t pa[KS][4];
        flash_c_to_a<KS>(pa, s); /* dZ rounded to bf16: the A operand of dZ K */
        if (CHK) flash_a_rowsum<KS>(dzs, pa);
        flash_mma_nn<KS, HD>(acc, pa, sK + buf * BK * LDS, lane);
        __syncthreads();
    }
    if constexpr (EPI) {   /* the rerun's epilogue: the tile as dq would be stored, into sQ (free after the loop's last barrier) */
        flash_acc_to_tile<HD>(sQ, acc, scale, warp, gq, tq);
        __syncthreads();
        flash_qk_epilogue<HD>(sQ, t0, min(BQ, T - t0), b, T, h, H, false, *epi);
    } else {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = trow[r];
            const float dpsum = CHK ? flash_quad_sum(dps[r]) : 0.0f, dzsum = CHK ? flash_quad_sum(dzs[r]) : 0.0f;
            if (t < T) {
                uint32_t* dst = reinterpret_cast<uint32_t*>(dq + ((size_t)b * T + t) * ldq + (size_t)h * HD) + tq;
#pragma unroll
                for (int nd = 0; nd < ND; nd++) dst[4 * nd] = pack_bf16x2(acc[nd][2 * r] * scale, acc[nd][2 * r + 1] * scale);
                if (CHK && tq == 0) { rows_a[((size_t)b * H + h) * T + t] = dpsum; rows_b[((size_t)b * H + h) * T + t] = dzsum; }
            }
        }
    }
}

/* the dk/dv kernel's query tile of iteration i (head h0 + i / ntq, query tile qt0 + i % ntq) into one
 * buffer: Q and dout by cp.async (the caller commits), lse and D by plain loads (a row of lse starts
 * 16-byte aligned only where T is a multiple of 4); all visible after the caller's next barrier */
template <int BQ, int HD>
__device__ __forceinline__ void flash_dkv_load_q(bf16* sQ, bf16* sO, float* sL, float* sD, const bf16* q, const bf16* dout, const float* lse,
                                                 const float* D, int b, int h0, int qt0, int ntq, int i, int T, int H) {
    const int h = h0 + i / ntq, t0 = (qt0 + i % ntq) * BQ;
    const size_t ldq = (size_t)H * HD, row = ((size_t)b * H + h) * T;
    flash_cp_tile<BQ, HD>(sQ, q + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);
    flash_cp_tile<BQ, HD>(sO, dout + (size_t)b * T * ldq + (size_t)h * HD, ldq, t0, T);
    for (int c = threadIdx.x; c < BQ; c += FLASH_THREADS) {
        sL[c] = t0 + c < T ? lse[row + t0 + c] : 0.0f;
        sD[c] = t0 + c < T ? D[row + t0 + c] : 0.0f;
    }
}

/* grid: one block per (key tile, b, kv head j, split sp), 1-D, the key tile slowest and the first
 * (heaviest: it meets every query tile) first. Split sp of nsplit handles the g / nsplit query heads
 * h = j g + sp g / nsplit ...; nsplit 1: dk, dv written as bf16; else fp32 partials part[sp] (dk) and
 * part[sp] + n (dv), n = B T KV HD, summed in split order by flash_attention_dkdv_sum_kernel.
 * DV false: dk alone (-protect qk_bwd's rerun): no P^T dO product, no dv accumulators, nothing written for dv;
 * dk's arithmetic and order are those of DV true, so its bits are too. */
template <int HD, bool DV, bool EPI = false>
__device__ __forceinline__ void flash_backward_dkdv_block(unsigned bid, bf16* __restrict__ dk, bf16* __restrict__ dv, float* __restrict__ part,
                                                          const bf16* __restrict__ dout, const float* __restrict__ lse,
                                                          const float* __restrict__ D, const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                          const bf16* __restrict__ v, int B, int T, int H, int KV, int ldv, int nsplit,
                                                          float scale, FlashPlant pl, unsigned* done, const FlashQkEpi* epi = NULL) {
    static_assert(!(DV && EPI), "dk/dv: the rerun's epilogue is of the dk-only variant");
    constexpr int BK = FlashTiles<HD>::DKV_BK, BQ = FlashTiles<HD>::DKV_BQ, LDS = FLASH_LDS(HD);
    constexpr int NB = BQ / 8, KS = BQ / 16, ND = HD / 8;
    static_assert(BK == 16 * FLASH_WARPS && BQ % 16 == 0, "dk/dv: tile shape");
    extern __shared__ flash_chunk flash_smem[];
    bf16* sK = reinterpret_cast<bf16*>(flash_smem); /* [BK][LDS] */
    bf16* sV = sK + BK * LDS;                        /* [BK][LDS] */
    bf16* sQ = sV + BK * LDS;                        /* [2][BQ][LDS] */
    bf16* sO = sQ + 2 * BQ * LDS;                    /* dout [2][BQ][LDS] */
    float* sL = reinterpret_cast<float*>(sO + 2 * BQ * LDS); /* lse [2][BQ] */
    float* sD = sL + 2 * BQ;                                  /* D [2][BQ] */
    const int g = H / KV, hps = g / nsplit, ny = B * KV * nsplit;
    const int s0 = (int)(bid / ny) * BK;
    const int sp = (int)(bid % ny) % nsplit, j = (int)(bid % ny) / nsplit % KV, b = (int)(bid % ny) / (nsplit * KV);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
    const size_t ldk = (size_t)KV * HD;
    const int qt0 = s0 / BQ, ntq = CEIL_DIV(T, BQ) - qt0; /* the query tiles from the diagonal on */
    const int n = hps * ntq, h0 = j * g + sp * hps;        /* iterations: (head, query tile), tiles fastest */
    flash_cp_tile<BK, HD>(sK, k + (size_t)b * T * ldk + (size_t)j * HD, ldk, s0, T);
    flash_cp_tile<BK, HD>(sV, v + (size_t)b * T * ldv + (size_t)j * HD, ldv, s0, T);
    flash_dkv_load_q<BQ, HD>(sQ, sO, sL, sD, q, dout, lse, D, b, h0, qt0, ntq, 0, T, H);
    cp_async_commit();

    const int k0 = s0 + 16 * warp;               /* the warp's first key */
    const int srow[2] = {k0 + gq, k0 + gq + 8};  /* this lane's two keys */
    float ak[ND][4], av[ND][4];
#pragma unroll
    for (int nd = 0; nd < ND; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) { ak[nd][e] = 0.0f; av[nd][e] = 0.0f; }
    for (int it = 0; it < n; it++) {
        const int buf = it & 1, t0 = (qt0 + it % ntq) * BQ;
        if (it + 1 < n) {
            flash_dkv_load_q<BQ, HD>(sQ + (buf ^ 1) * BQ * LDS, sO + (buf ^ 1) * BQ * LDS, sL + (buf ^ 1) * BQ, sD + (buf ^ 1) * BQ, q,
                                     dout, lse, D, b, h0, qt0, ntq, it + 1, T, H);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* q_ = sQ + buf * BQ * LDS;
        const bf16* o_ = sO + buf * BQ * LDS;
        const float* L = sL + buf * BQ;
        const float* Dq = sD + buf * BQ;
        float s[NB][4], dp[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) { s[nb][e] = 0.0f; dp[nb][e] = 0.0f; }
        flash_mma_nt<NB, HD>(s, sK + 16 * warp * LDS, q_, lane);  /* S^T = K Q^T [key][query] */
        flash_mma_nt<NB, HD>(dp, sV + 16 * warp * LDS, o_, lane); /* dP^T = V dO^T */
        const bool masked = t0 < k0 + 15 || t0 + BQ > T;
        const int hh = h0 + it / ntq;
        const bool plant_bh = pl.where != FLASH_PLANT_NONE && pl.b == b && pl.h == hh && pl.s >= k0 && pl.s < k0 + 16;
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = 8 * nb + 2 * tq + (e & 1), t = t0 + c, srw = srow[e >> 1];
                float p = expf(s[nb][e] * scale - L[c]);
                const float dpe = plant_bh ? flash_plant(pl, FLASH_PLANT_DKV_DP, b, hh, t, srw, dp[nb][e]) : dp[nb][e];
                float dz = p * (dpe - Dq[c]);
                if (plant_bh) {
                    dz = flash_plant(pl, FLASH_PLANT_DKV_DZ, b, hh, t, srw, dz);
                    p = flash_plant(pl, FLASH_PLANT_DKV_P, b, hh, t, srw, p);
                }
                if (masked && (t < srw || t >= T)) { p = 0.0f; dz = 0.0f; }
                s[nb][e] = p;
                dp[nb][e] = dz;
            }
        uint32_t pp[KS][4], pz[KS][4];
        if (DV) flash_c_to_a<KS>(pp, s);  /* P^T rounded to bf16 */
        flash_c_to_a<KS>(pz, dp); /* dZ^T rounded to bf16 */
        if (DV) flash_mma_nn<KS, HD>(av, pp, o_, lane); /* dv += P^T dO */
        flash_mma_nn<KS, HD>(ak, pz, q_, lane); /* dk += dZ^T Q */
        __syncthreads();
    }
    const size_t nel = (size_t)B * T * ldk;
    if (EPI && nsplit == 1) {   /* the rerun's epilogue: the tile as dk would be stored, into sK (free after the loop's last barrier) */
        flash_acc_to_tile<HD>(sK, ak, scale, warp, gq, tq);
        __syncthreads();
        flash_qk_epilogue<HD>(sK, s0, min(BK, T - s0), b, T, j, KV, true, *epi);
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int s = srow[r];
        if (s >= T) continue;
        const size_t off = ((size_t)b * T + s) * ldk + (size_t)j * HD + 2 * tq;
        if (nsplit == 1) {
            uint32_t* dkr = reinterpret_cast<uint32_t*>(dk + off);
            uint32_t* dvr = DV ? reinterpret_cast<uint32_t*>(dv + ((size_t)b * T + s) * ldv + (size_t)j * HD + 2 * tq) : nullptr;
#pragma unroll
            for (int nd = 0; nd < ND; nd++) {
                dkr[4 * nd] = pack_bf16x2(ak[nd][2 * r] * scale, ak[nd][2 * r + 1] * scale);
                if (DV) dvr[4 * nd] = pack_bf16x2(av[nd][2 * r], av[nd][2 * r + 1]);
            }
        } else {
            flash_f2* pk = reinterpret_cast<flash_f2*>(part + (size_t)sp * 2 * nel + off);
            flash_f2* pv = reinterpret_cast<flash_f2*>(part + (size_t)sp * 2 * nel + nel + off);
#pragma unroll
            for (int nd = 0; nd < ND; nd++) {
                pk[4 * nd] = flash_f2{ak[nd][2 * r], ak[nd][2 * r + 1]};
                if (DV) pv[4 * nd] = flash_f2{av[nd][2 * r], av[nd][2 * r + 1]};
            }
        }
    }
    if (nsplit == 1 || !done) return;
    /* the head split's sum in the block that finishes last among the nsplit blocks of this (key tile, b, j): an integer
     * counter after a __threadfence (the counter left at 0 again), then the partials of its BK keys added in split
     * order, times scale for dk, rounded once: flash_attention_dkdv_sum_kernel's arithmetic, so its bits */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    const size_t grp = (size_t)(bid / ny) * ((size_t)B * KV) + (size_t)b * KV + j;
    if (threadIdx.x == 0) {
        last = atomicAdd(done + grp, 1u) == (unsigned)(nsplit - 1);
        if (last) done[grp] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile float* vp = part;
    const int nrow = min(BK, T - s0);
    for (int e = threadIdx.x; e < nrow * (HD / 2); e += FLASH_THREADS) {
        const int rr = e / (HD / 2), cc = (e % (HD / 2)) * 2;
        const size_t off = ((size_t)b * T + s0 + rr) * ldk + (size_t)j * HD + cc;
        float k0 = vp[off], k1 = vp[off + 1];
        for (int q2 = 1; q2 < nsplit; q2++) { k0 += vp[(size_t)q2 * 2 * nel + off]; k1 += vp[(size_t)q2 * 2 * nel + off + 1]; }
        *reinterpret_cast<uint32_t*>(EPI ? sK + rr * LDS + cc : dk + off) = pack_bf16x2(k0 * scale, k1 * scale);
        if (DV) {
            float v0 = vp[nel + off], v1 = vp[nel + off + 1];
            for (int q2 = 1; q2 < nsplit; q2++) { v0 += vp[(size_t)q2 * 2 * nel + nel + off]; v1 += vp[(size_t)q2 * 2 * nel + nel + off + 1]; }
            *reinterpret_cast<uint32_t*>(dv + ((size_t)b * T + s0 + rr) * ldv + (size_t)j * HD + cc) = pack_bf16x2(v0, v1);
        }
    }
    if (EPI) {   /* the rerun's epilogue over the summed tile */
        __syncthreads();
        flash_qk_epilogue<HD>(sK, s0, nrow, b, T, j, KV, true, *epi);
    }
}

/* the kernels: one block a grid entry as described above each body */
template <int HD, bool CHK>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dq_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout, const float* __restrict__ lse,
                                   const float* __restrict__ D, const bf16* __restrict__ q, const bf16* __restrict__ k,
                                   const bf16* __restrict__ v, int B, int T, int H, int KV, int ldv, float scale, float* __restrict__ rows_a,
                                   float* __restrict__ rows_b, FlashPlant pl, FlashRowDot rd) {
    flash_backward_dq_block<HD, CHK>(blockIdx.x, dq, dout, lse, D, q, k, v, B, T, H, KV, ldv, scale, rows_a, rows_b, pl, NULL, rd);
}
template <int HD, bool DV>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dkdv_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, float* __restrict__ part,
                                     const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ D,
                                     const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, int B, int T,
                                     int H, int KV, int ldv, int nsplit, float scale, FlashPlant pl, unsigned* done) {
    flash_backward_dkdv_block<HD, DV>(blockIdx.x, dk, dv, part, dout, lse, D, q, k, v, B, T, H, KV, ldv, nsplit, scale, pl, done);
}
/* dq and dk alone in one launch (dv NULL: -protect qk_bwd's rerun, which reads a D already made): blocks 0 .. gk-1
 * are the dk-only grid (its heaviest key tile first), blocks gk .. the dq grid (its heaviest query tile first). The
 * two bodies share nothing but the launch: each output is written by the block and in the order of its own kernel,
 * so the bits are the two launches'. Only the dk-only variant is fused: its registers are the dq kernel's (ptxas,
 * sm_90: 164-168 at head_dim 64 and 128), so one launch costs neither body an SM's occupancy; the dk/dv variant
 * (228-255 registers) would take the dq blocks from 3 to 2 a SM, which is why the first pass keeps two launches. */
template <int HD, bool EPI>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dqdk_kernel(bf16* __restrict__ dq, bf16* __restrict__ dk, float* __restrict__ part,
                                     const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ D,
                                     const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, int B, int T,
                                     int H, int KV, int ldv, int nsplit, float scale, FlashPlant pl, unsigned* done, unsigned gk, FlashQkEpi epi) {
    if (blockIdx.x < gk)
        flash_backward_dkdv_block<HD, false, EPI>(blockIdx.x, dk, NULL, part, dout, lse, D, q, k, v, B, T, H, KV, ldv, nsplit, scale, pl, done, &epi);
    else
        flash_backward_dq_block<HD, false, EPI>(blockIdx.x - gk, dq, dout, lse, D, q, k, v, B, T, H, KV, ldv, scale, NULL, NULL, pl, &epi);
}

/* the head split's counters (one a key tile, b and kv head): a device array kept across launches (each launch leaves
 * them at 0), grown (zeroed) on first use; the stream order serialises the launches that share it */
static unsigned* flash_dkdv_done(size_t groups) {
    static unsigned* d = NULL;
    static size_t n = 0;
    if (groups > n) {
        if (d) {
            cudaCheck(cudaDeviceSynchronize());
            cudaCheck(cudaFree(d));
        }
        cudaCheck(cudaMalloc(&d, sizeof(unsigned) * groups));
        cudaCheck(cudaMemset(d, 0, sizeof(unsigned) * groups));
        n = groups;
    }
    return d;
}
/* test-only: bits flipped in the dq kernel's D of row (b 0, h 0, t 0) where it makes D (FlashRowDot's plant_xor); 0 in
 * every trainer run */
static unsigned g_flash_d_plant = 0;
/* test-only: 1 runs the head split's sum as its own kernel (flash_attention_dkdv_sum_kernel), the form the one-launch
 * sum must equal bitwise */
static int g_flash_sum_kernel = 0;

/* dk = bf16(scale sum_sp part[sp]), dv = bf16(sum_sp part[sp] + n), sp ascending; 4 elements a thread (dv NULL:
 * dk alone) */
__global__ void flash_attention_dkdv_sum_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, const float* __restrict__ part, size_t n,
                                                int kvhd, int ldv, int nsplit, float scale) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    flash_f4 sk = reinterpret_cast<const flash_f4*>(part + i)[0];
    for (int s = 1; s < nsplit; s++) {
        const flash_f4 xk = reinterpret_cast<const flash_f4*>(part + (size_t)s * 2 * n + i)[0];
        sk.x += xk.x; sk.y += xk.y; sk.z += xk.z; sk.w += xk.w;
    }
    uint32_t* dkw = reinterpret_cast<uint32_t*>(dk + i);
    dkw[0] = pack_bf16x2(sk.x * scale, sk.y * scale);
    dkw[1] = pack_bf16x2(sk.z * scale, sk.w * scale);
    if (!dv) return;
    flash_f4 sv = reinterpret_cast<const flash_f4*>(part + n + i)[0];
    for (int s = 1; s < nsplit; s++) {
        const flash_f4 xv = reinterpret_cast<const flash_f4*>(part + (size_t)s * 2 * n + n + i)[0];
        sv.x += xv.x; sv.y += xv.y; sv.z += xv.z; sv.w += xv.w;
    }
    const size_t row = i / kvhd, col = i % kvhd; /* kvhd % 4 == 0: the 4 stay in one row */
    uint32_t* dvw = reinterpret_cast<uint32_t*>(dv + row * ldv + col);
    dvw[0] = pack_bf16x2(sv.x, sv.y);
    dvw[1] = pack_bf16x2(sv.z, sv.w);
}

/* -------------------------------------------------------------------------------- launchers */
static void flash_attention_check_args(const char* who, int B, int T, int H, int KV, int hd, int ldv, const void* const* ptrs, int nptr) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || H % KV != 0 || (long long)B * H * CEIL_DIV(T, 16) > 0x7fffffffLL)
        tsdc_fail("%s: bad shape B %d T %d H %d KV %d hd %d (all > 0, H a multiple of KV)", who, B, T, H, KV, hd);
    if (!flash_attention_supported(hd)) tsdc_fail("%s: head_dim %d (the fused kernels take 32, 64 or 128)", who, hd);
    if (ldv < KV * hd || ldv % 8 != 0)
        tsdc_fail("%s: ldv %d (the elements between tokens of v: >= KV*hd = %d and a multiple of 8)", who, ldv, KV * hd);
    for (int i = 0; i < nptr; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0) tsdc_fail("%s: tensor argument %d not 16-byte aligned (cp.async reads 16 bytes)", who, i);
}

/* the accounting's (t, s) pairs of one head that a kernel's tiles cover, masked entries of a diagonal tile
 * included: query tiles of bq rows, each over the key tiles of bk up to its last row (forward, dq) ... */
static double flash_pairs_rows(int T, int bq, int bk) {
    double p = 0.0;
    for (int t0 = 0; t0 < T; t0 += bq) p += (double)bq * bk * (((t0 + bq < T ? t0 + bq : T) - 1) / bk + 1);
    return p;
}
/* ... or key tiles of bk, each over the query tiles of bq from the diagonal on (dk, dv) */
static double flash_pairs_cols(int T, int bk, int bq) {
    double p = 0.0;
    for (int s0 = 0; s0 < T; s0 += bk) p += (double)bk * bq * (CEIL_DIV(T, bq) - s0 / bq);
    return p;
}

/* the dynamic shared-memory opt-in above 48 KB, once per kernel */
template <class K> static void flash_smem_optin(K* kernel, int bytes, int* done) {
    if (bytes > FLASH_STATIC_SMEM && !*done) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        *done = 1;
    }
}

/* the number of splits of the g query heads of a kv group in the dk/dv grid: the smallest divisor of g
 * that gives FLASH_DKV_MIN_BLOCKS blocks (g itself if none does) */
static int flash_dkdv_splits(int B, int T, int KV, int g, int bk) {
    const long long blocks = (long long)CEIL_DIV(T, bk) * KV * B;
    for (int s = 1; s < g; s++)
        if (g % s == 0 && blocks * s >= FLASH_DKV_MIN_BLOCKS) return s;
    return g;
}

/* the plant of chk (none without chk) */
static inline FlashPlant flash_plant_of(const FlashCheck* chk) {
    FlashPlant none = {FLASH_PLANT_NONE, 0, 0, 0, 0, 1.0f, 0.0f};
    return chk ? chk->plant : none;
}

template <int HD>
static void flash_attention_forward_hd(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV,
                                       int ldv, const FlashCheck* chk, cudaStream_t stream, double* rss) {
    static int optin = 0, optin_chk = 0;
    const int smem = flash_fwd_smem<HD>();
    const unsigned grid = (unsigned)(CEIL_DIV(T, (int)FlashTiles<HD>::FWD_BQ) * B * H);
    const float scale = 1.0f / sqrtf((float)HD);
    if (chk && chk->rows_a) {
        flash_smem_optin(flash_attention_forward_kernel<HD, true>, smem, &optin_chk);
        flash_attention_forward_kernel<HD, true><<<grid, FLASH_THREADS, smem, stream>>>(out, lse, q, k, v, B, T, H, KV, ldv, scale, chk->rows_a,
                                                                                      chk->rows_b, chk->plant, rss);
    } else {
        flash_smem_optin(flash_attention_forward_kernel<HD, false>, smem, &optin);
        flash_attention_forward_kernel<HD, false><<<grid, FLASH_THREADS, smem, stream>>>(out, lse, q, k, v, B, T, H, KV, ldv, scale, NULL, NULL,
                                                                                       flash_plant_of(chk), rss);
    }
    cudaCheck(cudaGetLastError());
    launch_account(COST_ATTENTION, "flash_attention_forward_kernel", COST_TC, grid,
                   4.0 * HD * B * H * flash_pairs_rows(T, FlashTiles<HD>::FWD_BQ, FlashTiles<HD>::FWD_BK), (double)B * T * (H + 2 * KV) * HD * 2,
                   (double)B * T * H * (HD * 2 + 4 + (rss ? 8 : 0)));   /* q, k, v in; out, lse (and the rows' sums of squares) out */
}

template <int HD>
static void flash_attention_backward_hd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, float* ws, const bf16* q,
                                        const bf16* k, const bf16* v, int B, int T, int H, int KV, int ldv, int nsplit, const FlashCheck* chk,
                                        cudaStream_t stream, const FlashQkEpi* epi, FlashRowDot rd) {
    static int optin_dq = 0, optin_dq_chk = 0, optin_dkv = 0, optin_dqdk = 0, optin_dqdk_epi = 0;
    const float scale = 1.0f / sqrtf((float)HD);
    const size_t rows = (size_t)B * T * H, nel = (size_t)B * T * KV * HD;
    const float* D = ws;
    float* part = ws + CEIL_DIV(rows, (size_t)4) * 4;
    const int smq = flash_dq_smem<HD>(), smk = flash_dkv_smem<HD>();
    const unsigned gq = (unsigned)(CEIL_DIV(T, (int)FlashTiles<HD>::DQ_BQ) * B * H);
    const unsigned gk = (unsigned)(CEIL_DIV(T, (int)FlashTiles<HD>::DKV_BK) * B * KV * nsplit);
    const FlashPlant pl = flash_plant_of(chk);
    const double dq_flops = 6.0 * HD * B * H * flash_pairs_rows(T, FlashTiles<HD>::DQ_BQ, FlashTiles<HD>::DQ_BK);
    const double dq_read = (double)B * T * ((2 * H + 2 * KV) * HD * 2 + H * 8);   /* q, dout, k, v, lse, D */
    /* the head split's sum inside the kernel (the last block of each key tile's splits), unless a test asks for the
     * separate sum kernel */
    const bool one = nsplit > 1 && (!g_flash_sum_kernel || epi);   /* the epilogue needs the sum inside */
    unsigned* done = one ? flash_dkdv_done((size_t)CEIL_DIV(T, (int)FlashTiles<HD>::DKV_BK) * B * KV) : NULL;
    const int nout = dv ? 2 : 1;   /* dk and dv, or dk alone */
    /* the dk/dv kernel's work: q, dout, lse, D, k, v (per split) in; dk, dv or the partials out; with the sum inside:
     * the partials read back by the last blocks and dk, dv written too */
    const double dk_flops = (dv ? 8.0 : 6.0) * HD * B * H * flash_pairs_cols(T, FlashTiles<HD>::DKV_BK, FlashTiles<HD>::DKV_BQ) +
                            (one ? (double)nsplit * nout * nel : 0.0);
    const double dk_read = (double)B * T * ((2 * H + 2 * nsplit * KV) * HD * 2 + H * 8) + (one ? (double)nsplit * nout * nel * 4 : 0.0);
    const double dk_written = nsplit > 1 ? (double)nsplit * nout * nel * 4 + (one ? (double)nel * nout * 2 : 0.0) : (double)nel * nout * 2;
    if (!dv && chk && chk->rows_a) tsdc_fail("flash_attention_backward: dv NULL (dq and dk alone) takes no FlashCheck rows");
    if (epi) {   /* the rerun with the Q/K path's epilogue: dq and dk never written, the fingerprints only */
        const int sm = smq > smk ? smq : smk;
        flash_smem_optin(flash_attention_backward_dqdk_kernel<HD, true>, sm, &optin_dqdk_epi);
        flash_attention_backward_dqdk_kernel<HD, true><<<gk + gq, FLASH_THREADS, sm, stream>>>(NULL, NULL, part, dout, lse, D, q, k, v, B, T, H, KV,
                                                                                             ldv, nsplit, scale, pl, done, gk, *epi);
        cudaCheck(cudaGetLastError());
        /* as below without dq and dk written; the epilogue reads the tables, and with a QK norm x, its mean squares and
         * weights (its CUDA-core arithmetic, about 17 operations an element, is left out as the softmax's is) */
        const double nqk = (double)B * T * (H + KV) * HD;
        const double epi_read = (double)T * HD * 4 + (epi->xq ? nqk * 2 + (double)B * T * (H + KV) * 4 + 4.0 * HD : 0.0);
        launch_account(COST_ATTENTION, "flash_attention_backward_dqdk_kernel", COST_TC, gk + gq, dq_flops + dk_flops, dq_read + dk_read + epi_read,
                       dk_written - (double)nel * 2);   /* dk's bf16 not written */
    } else if (!dv) {   /* dq and dk alone: one launch (flash_attention_backward_dqdk_kernel) */
        const int sm = smq > smk ? smq : smk;
        const FlashQkEpi none = {};
        flash_smem_optin(flash_attention_backward_dqdk_kernel<HD, false>, sm, &optin_dqdk);
        flash_attention_backward_dqdk_kernel<HD, false><<<gk + gq, FLASH_THREADS, sm, stream>>>(dq, dk, part, dout, lse, D, q, k, v, B, T, H, KV,
                                                                                              ldv, nsplit, scale, pl, done, gk, none);
        cudaCheck(cudaGetLastError());
        /* the two kernels' work summed (each body reads its inputs; the second reads come from L2 on a GPU, counted anyway) */
        launch_account(COST_ATTENTION, "flash_attention_backward_dqdk_kernel", COST_TC, gk + gq, dq_flops + dk_flops, dq_read + dk_read,
                       (double)B * T * H * HD * 2 + dk_written);
    } else {
        flash_smem_optin(flash_attention_backward_dkdv_kernel<HD, true>, smk, &optin_dkv);
        if (chk && chk->rows_a) {
            flash_smem_optin(flash_attention_backward_dq_kernel<HD, true>, smq, &optin_dq_chk);
            flash_attention_backward_dq_kernel<HD, true><<<gq, FLASH_THREADS, smq, stream>>>(dq, dout, lse, D, q, k, v, B, T, H, KV, ldv, scale,
                                                                                           chk->rows_a, chk->rows_b, pl, rd);
        } else {
            flash_smem_optin(flash_attention_backward_dq_kernel<HD, false>, smq, &optin_dq);
            flash_attention_backward_dq_kernel<HD, false><<<gq, FLASH_THREADS, smq, stream>>>(dq, dout, lse, D, q, k, v, B, T, H, KV, ldv, scale,
                                                                                            NULL, NULL, pl, rd);
        }
        cudaCheck(cudaGetLastError());
        /* with D made here: out read instead of D, D written (its 2 hd CUDA-core operations a row left out, as the softmax's) */
        const double rd_read = rd.out ? (double)B * T * H * ((double)HD * 2 - 4) : 0.0, rd_written = rd.out ? (double)B * T * H * 4 : 0.0;
        launch_account(COST_ATTENTION, "flash_attention_backward_dq_kernel", COST_TC, gq, dq_flops, dq_read + rd_read,
                       (double)B * T * H * HD * 2 + rd_written);   /* dq out */
        flash_attention_backward_dkdv_kernel<HD, true><<<gk, FLASH_THREADS, smk, stream>>>(dk, dv, part, dout, lse, D, q, k, v, B, T, H, KV,
                                                                                         ldv, nsplit, scale, pl, done);
        cudaCheck(cudaGetLastError());
        launch_account(COST_ATTENTION, "flash_attention_backward_dkdv_kernel", COST_TC, gk, dk_flops, dk_read, dk_written);
    }
    if (nsplit > 1 && !one) {
        flash_attention_dkdv_sum_kernel<<<(unsigned)CEIL_DIV(nel / 4, (size_t)256), 256, 0, stream>>>(dk, dv, part, nel, KV * HD, ldv, nsplit,
                                                                                                       scale);
        cudaCheck(cudaGetLastError());
        launch_account(COST_ATTENTION, "flash_attention_dkdv_sum_kernel", COST_FP32, (unsigned)CEIL_DIV(nel / 4, (size_t)256),
                       (double)nsplit * nout * nel, (double)nsplit * nout * nel * 4, (double)nel * nout * 2);   /* the partials in; dk, dv out */
    }
}

/* out [B,T,H*hd] bf16 and lse [B,H,T] fp32 from q [B,T,H*hd], k [B,T,KV*hd] and v (token stride ldv). rss (not NULL;
 * -protect bound's o check): rss[(b T + t) H + h] = the sum of squares, in double, of head h's hd values of out row
 * (b, t) as stored (bf16): each of the row's quad lanes sums its columns 8 nd + 2 tq, + 1 in nd order, then the quad
 * (xor 1, xor 2), so the reader gets a row's squared norm as H doubles to add instead of re-reading the row */
static void flash_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV,
                                    int hd, int ldv, cudaStream_t stream, const FlashCheck* chk = NULL, double* rss = NULL) {
    const void* ptrs[] = {out, q, k, v};
    flash_attention_check_args("flash_attention_forward", B, T, H, KV, hd, ldv, ptrs, 4);
    if (hd == 32) flash_attention_forward_hd<32>(out, lse, q, k, v, B, T, H, KV, ldv, chk, stream, rss);
    else if (hd == 64) flash_attention_forward_hd<64>(out, lse, q, k, v, B, T, H, KV, ldv, chk, stream, rss);
    else flash_attention_forward_hd<128>(out, lse, q, k, v, B, T, H, KV, ldv, chk, stream, rss);
}

/* dq [B,T,H*hd], dk [B,T,KV*hd], dv (token stride ldv) overwritten, from dout and the forward's out and lse; dv NULL:
 * dq and dk alone (the dk/dv kernel's DV false variant). D (the row dots of dout and out, workspace slot 4): d_dup not
 * NULL: computed twice and compared into *d_dup (an accumulator word, set non-zero on a difference); reuse_d: not
 * computed, the D the previous call left in slot 4 is read (-protect qk_bwd's rerun, right after the same layer's
 * backward with the same dout and out, nothing in between using slot 4: the caller's promise). epi (dq, dk, dv NULL):
 * that rerun with the rest of the Q/K path's backward in its epilogue, the fingerprints only (FlashQkEpi) */
static void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                                     const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int KV, int hd, int ldv,
                                     cudaStream_t stream, const FlashCheck* chk = NULL, unsigned long long* d_dup = NULL,
                                     bool reuse_d = false, const FlashQkEpi* epi = NULL) {
    const void* ptrs[] = {dq, dk, dv, dout, q, k, v};
    flash_attention_check_args("flash_attention_backward", B, T, H, KV, hd, ldv, ptrs, 7);
    if (epi && (dq || dk || dv || chk || !epi->fpq || !epi->fpk || (epi->xq && !(qknorm_rope_ok(hd, epi->ldx, epi->xq, epi->wq) &&
                                                                                 qknorm_rope_ok(hd, epi->ldx, epi->xk, epi->wk)))))
        tsdc_fail("flash_attention_backward: the Q/K epilogue takes no dq, dk, dv or FlashCheck, both fingerprints, and a QK norm qknorm_rope_ok takes");
    const size_t rows = (size_t)B * T * H, nel = (size_t)B * T * KV * hd;
    const int g = H / KV, nsplit = flash_dkdv_splits(B, T, KV, g, 64);
    float* ws = cuda_workspace_f32(FLASH_SLOT, CEIL_DIV(rows, (size_t)4) * 4 + (nsplit > 1 ? 2 * (size_t)nsplit * nel : 0));
    /* the first pass (dv and no epilogue) makes D inside its dq kernel, launched before the dk/dv kernel that reads it;
     * the rerun's one launch, whose dk blocks run beside its dq blocks, needs D made before it */
    const bool d_in_dq = !reuse_d && dv && !epi;
    const FlashRowDot rd = d_in_dq ? FlashRowDot{out, ws, d_dup, g_flash_d_plant} : FlashRowDot{};
    if (!reuse_d && !d_in_dq) {
        flash_attention_rowdot_kernel<<<(unsigned)CEIL_DIV(rows, (size_t)8), 256, 0, stream>>>(ws, dout, out, B, T, H, hd, d_dup, 0u);
        cudaCheck(cudaGetLastError());
        launch_account(COST_ATTENTION, "flash_attention_rowdot_kernel", COST_FP32, (unsigned)CEIL_DIV(rows, (size_t)8), (d_dup ? 4.0 : 2.0) * rows * hd,
                       (double)rows * hd * 4, (double)rows * 4);   /* dout, out in; D out */
    }
    if (hd == 32) flash_attention_backward_hd<32>(dq, dk, dv, dout, lse, ws, q, k, v, B, T, H, KV, ldv, nsplit, chk, stream, epi, rd);
    else if (hd == 64) flash_attention_backward_hd<64>(dq, dk, dv, dout, lse, ws, q, k, v, B, T, H, KV, ldv, nsplit, chk, stream, epi, rd);
    else flash_attention_backward_hd<128>(dq, dk, dv, dout, lse, ws, q, k, v, B, T, H, KV, ldv, nsplit, chk, stream, epi, rd);
}

#endif
