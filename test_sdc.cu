/* test_sdc.cu: GPU tests of the CUDA trainer (needs one NVIDIA GPU; built by `make test_sdc_cu`).
 *
 *   ./test_sdc_cu [-states DIR] [-ckpts DIR] [-seed N] [-only LIST]
 *
 * LIST (comma-separated): init, grad_buckets, kernels, reference, determinism, att_faults, update_norm, att_checks,
 * fused_faults, or one kernel test: convert embedding rmsnorm rope qknorm_rope attention attention_split flash attcheck attcheck_bwd flash_attcheck ewcheck
 *   ew_dup elementwise
 * classifier adamw global_norm matmul fingerprint fingerprint_rows matmul_cache fault_flip argmax unscale attention_chunked ptx strided.
 * Default: everything.
 *
 * This file holds the includes (both trainers), the table of tests and main; the tests are in tests/, each
 * file included below in this order: tests/check.h (the OK / NOT OK lines, shared with test_sdc.c),
 * tests/refstate.h (the reference states' reader), tests/cuda/harness.cuh (comparisons, device buffers),
 * kernels.cuh and attention.cuh (a), model.cuh (0, b, c), protect.cuh (d to g), ptx.cuh (a''), fused.cuh (i, j), ewcheck.cuh (a''').
 *
 * (0) init: the GPU's weight initialisation (llmc/cuda/init.cuh, one thread per pair) is bit-identical to the CPU
 *     trainer's (llmc/cpu/init.h, the same function on the host): model_init_weights of both trainers for the
 *     three tiny presets (and their bf16 copies, and zero AdamW state on the GPU), and the whole llama3.2-1b
 *     layout (1.24e9 weights), whose GPU time is printed and must be under 1 s; the weights checksum computed
 *     on the GPU (llmc/cuda/checksum.cuh) equals the host's tsdc_checksum of the same bytes.
 * (a) kernels: every launcher of the llmc .cuh files against its CPU reference (llmc/cpu/cpu_kernels.h; AdamW
 *     against the formula of train_sdc.c) on fresh seeded normal inputs, never zeros. The inputs are
 *     rounded to bf16 (bf16_round) and the CPU gets exactly the values the GPU reads. Every output is
 *     poisoned with NaN bit patterns (0xFFFF bf16, 0xFFFFFFFF fp32) before the launch, with 64 guard
 *     elements after its end, so an element left unwritten or a write past the end is reported.
 *     Each comparison prints the largest abs error, the largest rel error (over |ref| >= 1e-3 max|ref|)
 *     and the relative L2 error ||gpu - cpu|| / ||cpu||, and passes when every element is within its
 *     bound (below) and, where given, the relative L2 error is under its limit (1e-2 for bf16 data).
 *     Bounds per element, each justified where it is used:
 *       - bitwise where the GPU does the same fp32 operations in the same order as the CPU (copies,
 *         products of two bf16, a single add, the embedding gradient, the conversions);
 *       - 1 bf16 ulp of max(|gpu|, |cpu|) where both compute an fp32 value that differs by a few fp32
 *         ulps (other expf/tanhf, FMA contraction, another summation order) and the GPU rounds it
 *         to bf16 once: the two can round to neighbours, never further apart;
 *       - plus c * mag[i] where cancellation or a long sum is involved: mag[i] is the sum of the
 *         absolute values of the terms of that element (computed here on the CPU), and c the
 *         worst-case relative error of fp32 summation in either order (about K * 2^-24 for K terms);
 *       - attention out, dq, dk: larger, derived from the extra bf16 roundings of the GPU (probs and
 *         dlogits are GEMM inputs there, fp32 on the CPU), see test_attention.
 *       - fused attention (flash): per-element bounds from both sides' accumulation order (mma's fp32
 *         k-blocks of 16, P and dZ rounded to bf16 as mma operands, the bf16 out its backward reads), see
 *         test_flash_attention; also two runs bitwise equal, a strided v bitwise the contiguous run, the
 *         dk/dv head split's sum pass bitwise the in-order sum, and vs the materialised path.
 *       - the attention checks inside the fused kernels (flash_attcheck): the kernels' row sums vs the CPU's
 *         double sums within 1% of the check's bound (fp32), faults planted in their registers caught at
 *         twice the bound and not at a quarter of it.
 * (b) reference states (dev/reference/states, HF transformers / nanochat in fp32) for tiny-llama,
 *     tiny-qwen3 and tiny-nanochat: the converted checkpoints (build/ref, `make refckpts`) loaded into
 *     the GPU model (vocab 256, T 32, B 2); logits, loss, every parameter gradient and the losses of 10
 *     AdamW steps. Beside the GPU, the CPU trainer (train_sdc.c, included below in namespace cpu) runs
 *     the same with -precision bf16, its emulation of the same AMP: each line shows the GPU's error
 *     against the fp32 reference, the CPU bf16 emulation's, and GPU vs CPU bf16. Pass: the fixed bounds
 *     of tests/bf16_bounds.h, derived from bf16 rounding alone (the CPU emulation passes the same bounds
 *     in test_sdc.c): logits rel L2 <= BF16_LOGITS_RL2, every gradient tensor <= BF16_GRAD_RL2, the loss
 *     within bf16_loss_bound, each of the 10 AdamW-step losses within bf16_losses_bound. A broken CPU
 *     bf16 mode cannot loosen them.
 * (c) determinism: two forward+backward passes give bitwise identical logits, per-token losses, loss
 *     and gradients; two 3-step training runs from the same weights give identical losses, gradient
 *     norms, weights, bf16 weight copies and AdamW moments.
 * (d) att_faults: injection into att_logits / att_probs at layer 1 (the split attention path): a forward
 *     fault changes the model's logits and only the probs rows it hit (logits) / layer 1 onwards; with
 *     m = 0 the forward and backward are bitwise the clean run's; a backward fault (split backward)
 *     leaves the gradients of the layers above bitwise alone, with m = 0 the gradients are within
 *     rel L2 1e-2 of the fused backward's and with m = 64 the lower layers' change.
 * (a') attcheck: the four attention checks of llmc/sdc/attcheck.cuh against llmc/sdc/attcheck.h's on attention_forward's
 *     bf16 logits/probs/out (several shapes: GQA, T not a multiple of the kernels' tiles, hd not a multiple of
 *     32): failed-head counts equal on the GPU and the CPU and 0 on clean inputs (also with garbage in the
 *     masked triangle); the top exponent bit flipped in one live element of the logits (two heads: both
 *     logits checks fail in exactly those), of the probs (row sums; ABFT's P V too, out being stale), of
 *     out (ABFT's P V), a NaN logit.
 * (a''') ew_dup: the duplicated element-wise kernels of -protect ew (llmc/sdc/ewdup.cuh): the plain kernels' stored bits,
 *     no flag clean, a planted change of one primary value (first, middle, last element of each output) flags that
 *     output alone. ewcheck: the element-wise recomputation checks of llmc/sdc/ewcheck.cuh (-protect ew) on outputs made by the
 *     trainer's producing kernels (fused and split residual + RMSNorm, SwiGLU and ReLU^2 forward and backward, gate/up
 *     and their gradients as strided views of one [rows, 2F] buffer): no flag on the clean outputs, exactly the
 *     flipped tensor's flag for the lowest mantissa bit of its first, a middle and its last element (and of a mean
 *     square), on the 16-byte and the scalar paths; mmb_bound: -protect bound's kernels (llmc/sdc/bound.cuh) on
 *     linear_forward's output as a strided view: the CPU's row norms, quiet at Cauchy-Schwarz's equality case, x4 /
 *     NaN / Inf flagged.
 * (e) update_norm: model_grad_norm against the CPU's sum of squares of the downloaded gradients and the CPU
 *     trainer's model_grad_norm; model_update_norm (clipping active and off, weight decay, t 3) changes no
 *     state, is bitwise reproducible, and is within 1e-5 relative of ||params after model_update - before||
 *     and of the CPU trainer's model_update_norm on the same state.
 * (f) att_checks: with the attention checks on the model's forward/backward are bitwise those with them off
 *     and raise no alarm; forward faults (64 elements, all exponent bits) at layer 1 in att_logits, att_probs,
 *     att_out and q_rope raise exactly the expected kinds (abft+att, att, abft, qk) at first layer 1 on both
 *     the GPU and the CPU's -precision bf16.
 * (g) flash (with the kernel test in (a)): the fused attention in the model: all layers fused by default, within
 *     bf16 rounding of the materialised path and bitwise reproducible; a due att_logits/att_probs fault moves only
 *     its layer to the materialised path; a forward att_out fault keeps the fused backward on the clean out.
 *     (d) and (f) run on the materialised path (model_set_attention_materialised), whose semantics they test. A forward
 *     with every layer fused allocates no [B,H,T,T] logits/probs; the materialised one does.
 * (a'') ptx: the tensor-core and cp.async wrappers of llmc/cuda/ptx.cuh in small kernels against tests/ptx_ref.h's scalar
 *     reference written from the PTX ISA's fragment tables (mma within 2^-18 of |c| + sum |a b|, ldmatrix, cp.async and
 *     pack bitwise): on a GPU the proof that the emulator's layouts are the hardware's (see tests/cuda/ptx.cuh).
 * (h) grad_buckets: the buckets of the overlapped gradient all-reduce tile the gradients once, in the backward's
 *     order, each tensor in its layer's bucket (every preset; host only).
 * (i) strided (a kernel test): every kernel that reads or writes a view of the fused q/k/v ([N, qd + 2 kd]) or gate/up
 *     ([N, 2F]) buffers or of their gradients (RoPE and its fingerprint, the QK norm forward and backward, the
 *     materialised and the fused attention with v / dv views, the attention checks, the MLP element-wise kernels on
 *     both the 16-byte and the scalar path, fault injection and its sums) against the same kernel on contiguous
 *     copies: bitwise, and nothing outside a written view touched (the buffer is poisoned around it).
 * (i') qknorm_rope: Qwen3's QK norm and RoPE in one kernel (llmc/cuda/qknorm_rope.cuh) against the two kernels it
 *     fuses: qn, ms, qr bitwise and the fingerprints equal (forward, fingerprint-only forward, backward), head_dim 16
 *     to 128, both RoPE styles; the sign of one element of the backward's input changes its fingerprint.
 * (j) fused_faults: faults at q_proj, k_proj, v_proj, gate_proj, up_proj of layer 1 in the model, GPU vs the CPU's
 *     -precision bf16 on the same weights and tokens: forward, the same 12 logical elements changed with the same XOR
 *     masks; backward, the rows of the layer's fused weight gradient that clearly change on one side change on the other, by
 *     amounts within 5e-2 rel L2.
 * Each check prints OK / NOT OK; the last line is "test_sdc_cu: N passed, M failed"; exit 1 on any
 * failure (or when no GPU is present). */
#define TESTING
#include "train_sdc.cu"

#include <errno.h>
#include <sys/stat.h>
#include "llmc/host/args.h"
#include "llmc/host/checkpoint.h"
#include "llmc/cpu/cpu_kernels.h"
#include "llmc/host/dataloader.h"
#include "llmc/host/logger.h"
#include "llmc/host/tokenizer.h"
#if __has_include("llmc/sdc/fault.h")
#include "llmc/sdc/fault.h"
#endif

/* The CPU trainer (its -precision bf16 is the emulation the GPU is compared with in (b)). Every header
 * it includes is already included above (include guards), so the namespace holds only its own model
 * code; its calls of the CPU kernels resolve to the float overloads of llmc/cpu_kernels.h. */
#include "tests/cuda/trainer_macros_undef.h"
namespace cpu {
#include "train_sdc.c"
}
#include "tests/cuda/trainer_macros_undef.h"

/* the tests, in the files of tests/ (each reads what the ones before it define) */
#include "tests/check.h"
#include "tests/refstate.h"
#include "tests/bf16_bounds.h"
#include "tests/cuda/harness.cuh"
#include "tests/cuda/kernels.cuh"
#include "tests/cuda/attention.cuh"
#include "tests/cuda/model.cuh"
#include "tests/cuda/protect.cuh"
#include "tests/cuda/ptx.cuh"
#include "tests/cuda/fused.cuh"
#include "tests/cuda/ewcheck.cuh"

/* -only LIST: comma-separated test names, or the groups "kernels" (every kernel test), "reference" and
 * "determinism"; empty: everything */
static const char* g_only = "";
static int want(const char* name, const char* group) {
    if (!g_only[0]) return 1;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", g_only);
    for (char* t = strtok(buf, ","); t; t = strtok(NULL, ","))
        if (!strcmp(t, name) || (group && !strcmp(t, group))) return 1;
    return 0;
}

#define USAGE_TEXT "usage: test_sdc_cu [-states DIR] [-ckpts DIR] [-seed N] [-only LIST]\n" \
    "  LIST: comma-separated, of kernels reference determinism att_faults update_norm att_checks fused_faults convert\n" \
    "        embedding rmsnorm rope attention attention_split flash attcheck attcheck_bwd flash_attcheck ewcheck ew_dup qknorm_rope mmb_bound elementwise\n" \
    "        classifier adamw global_norm\n" \
    "        matmul fingerprint fingerprint_rows matmul_cache fault_flip argmax unscale attention_chunked ptx strided init grad_buckets\n"

int main(int argc, char** argv) {
    const char *states = "dev/reference/states", *ckpts = "build/ref";
    unsigned long long seed = 1234;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, USAGE_TEXT); return 1; }
        if (!strcmp(argv[i], "-states")) states = argv[i + 1];
        else if (!strcmp(argv[i], "-ckpts")) ckpts = argv[i + 1];
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-only")) g_only = argv[i + 1];
        else { fprintf(stderr, USAGE_TEXT); return 1; }
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        printf("no usable CUDA GPU (%s)\ntest_sdc_cu: 0 passed, 1 failed\n", e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 1;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("test_sdc_cu: %s (sm_%d%d, %d SMs, %.1f GiB), driver %d, runtime %d, seed %llu%s%s\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, drv, rt, seed, g_only[0] ? ", only " : "", g_only);
    cudaCheck(cudaStreamCreate(&g_s));
    rng_seed(&g_rng, seed);
    struct { const char* name; void (*fn)(void); } kernels[] = {
        {"convert", test_convert}, {"embedding", test_embedding}, {"rmsnorm", test_rmsnorm}, {"rope", test_rope},
        {"attention", test_attention}, {"attention_split", test_attention_split}, {"flash", test_flash_attention},
        {"attcheck", test_attcheck}, {"attcheck_bwd", test_attcheck_bwd}, {"flash_attcheck", test_flash_attcheck}, {"ewcheck", test_ewcheck}, {"ew_dup", test_ew_dup}, {"qknorm_rope", test_qknorm_rope}, {"mmb_bound", test_mmb_bound},
        {"elementwise", test_elementwise}, {"classifier", test_classifier},
        {"adamw", test_adamw}, {"multi_tensor", test_multi_tensor}, {"global_norm", test_global_norm}, {"fingerprint", test_fingerprint}, {"fingerprint_rows", test_fingerprint_rows}, {"matmul", test_matmul},
        {"matmul_cache", test_matmul_cache}, {"fault_flip", test_fault_flip}, {"argmax", test_argmax}, {"unscale", test_unscale},
        {"attention_chunked", test_attention_chunked}, {"ptx", test_ptx}, {"strided", test_strided}};
    if (want("init", NULL)) test_init();
    if (want("grad_buckets", NULL)) test_grad_buckets();
    double t0 = wall_seconds();
    int any = 0;
    matmul_init();
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
        if (want(kernels[i].name, "kernels")) { kernels[i].fn(); any = 1; }
    matmul_free();
    if (any) printf("(kernels: %.1f s)\n", wall_seconds() - t0);
    double t1 = wall_seconds();
    const char* presets[] = {"tiny-llama", "tiny-qwen3", "tiny-nanochat"};
    if (want("reference", NULL)) {
        for (int i = 0; i < 3; i++) test_reference(presets[i], states, ckpts);
        printf("(reference states: %.1f s)\n", wall_seconds() - t1);
    }
    double t2 = wall_seconds();
    if (want("determinism", NULL)) {
        test_determinism("tiny-qwen3", 256, 2, 32, ckpts);
        test_determinism("tiny-llama", 8192, 4, 128, ckpts);
        test_determinism("tiny-nanochat", 8192, 4, 128, ckpts);
        printf("(determinism: %.1f s)\n", wall_seconds() - t2);
    }
    if (want("att_faults", NULL)) {
        test_att_faults("tiny-llama");
        test_att_faults("tiny-nanochat");
    }
    if (want("flash", NULL)) {
        test_flash_model("tiny-llama");
        test_flash_model("tiny-qwen3");
    }
    if (want("update_norm", NULL)) test_update_norm("tiny-llama");
    if (want("att_checks", NULL)) {
        test_att_checks("tiny-llama");
        test_att_checks("tiny-nanochat");
    }
    if (want("fused_faults", NULL)) {
        test_fused_faults("tiny-llama");
        test_fused_faults("tiny-qwen3");
        test_fused_faults("tiny-nanochat");
    }
    if (n_pass + n_fail == 0) { printf("-only %s: no such test\n", g_only); n_fail = 1; }
    cuda_workspace_free_all();
    printf("test_sdc_cu: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
