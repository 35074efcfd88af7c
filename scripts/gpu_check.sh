#!/usr/bin/env bash
# scripts/gpu_check.sh: everything a GPU machine should check, in one command, under 9 minutes on
# one H200, ending with one markdown table.
#
#   scripts/gpu_check.sh [--dry] [--fake] [--phases LIST] [--B N] [--warmup N] [--steps N] [--budget S]
#
# Phases (each under its own `timeout`; a phase is skipped, and says so, when the time budget is spent):
#   info    nvidia-smi, nvcc, compiler, python / numpy / torch / transformers versions
#   build   make GPU_ARCH=$GPU_ARCH (default 90) train_sdc train_sdc_cu test_sdc_cu; the cuBLASLt
#           benchmark (dev/cuda/bench_matmul.cu) and a small token-shard generator (C, written here);
#           the reference checkpoints build/ref/*.ckpt (see "Reference checkpoints" below)
#   test    ./test_sdc_cu (kernels vs the CPU, reference states, determinism), its last line parsed
#   det     the full binary twice on a synthetic shard (tiny-llama, tiny-nanochat, smollm2-135m):
#           loss/grad-norm bits of every step (log.jsonl) and the checkpoint bytes must be identical
#   resume  cross-resume: the GPU writes a checkpoint at step 2 and ./train_sdc -precision bf16 (CPU)
#           resumes it to step 4, and the reverse; both must load and continue, and their losses must be
#           within 2e-2 relative of the uninterrupted runs (bf16 tolerance); plus the GPU resuming its
#           own checkpoint must repeat its uninterrupted run bit for bit
#   bench   cuBLASLt bf16 rate (bench_matmul), then for llama3.2-1b (B=$B), qwen3-0.6b (B=$B) and
#           llama3.2-1b B=1 (the paper's per-rank setting), T=1024, synthetic tokens: train_sdc_cu and
#           the same model in PyTorch (dev/bench/bench_gpu_torch.py: HF LlamaForCausalLM /
#           Qwen3ForCausalLM, random init, bf16 autocast, SDPA, fused AdamW) on the same shard, each
#           --warmup untimed + --steps timed steps: tokens/s, ms/step, MFU, peak GPU memory
#   torch   an alias: naming only `bench` runs both; `--phases bench` without `torch` in the list
#           skips the PyTorch runs
#   protect the protection tests of tests/test_protect.py and tests/test_detect.py on the GPU binary (Q/K
#           recomputation m = 1, 10, 1000; attention checks and ABFT; 200 calibrated clean steps; large
#           residual faults; exponent scaling in bf16), then the overhead of -protect none, qk, rgg, exp,
#           all, all,att for $PROT_BENCH at B 1 x T 1024 x accum 4 (the paper's per-rank setting)
# Default: --phases info,build,test,det,resume,protect,bench,torch --B 8 --warmup 5 --steps 20 --budget 500.
#
# MFU = tokens/s x FLOPs/token / peak, FLOPs/token = 6 P + 12 L H hd T (PaLM's model FLOPs: every
# parameter in a matmul forward and backward -- the tied embedding counts once, as the LM head -- plus
# the attention score and value products over the full T x T; both implementations are charged the same
# model FLOPs). Peak: the datasheet's 989 TFLOP/s dense bf16 (H100/H200 SXM) and the rate measured by
# bench_matmul. Peak memory: the largest memory.used that nvidia-smi reports while the run is alive,
# sampled every 200 ms (CUDA context included; PyTorch's own allocator peak is in the log). The
# train_sdc_cu benchmark runs are stopped once the timed steps are logged (their final checkpoint of
# 5-15 GB is not written).
#
# Output: everything is printed and also written to $OUT (the device tool's folder) or, when OUT is
# unset, build/gpu_check/: gpu_check.log (all of it), test_sdc_cu.log, bench_matmul.log and summary.md
# (the final table). Scratch runs go to build/gpu_check_work (deleted at the end).
#
# Reference checkpoints: `make refckpts` needs the project venv (pip install numpy tokenizers pytest),
# and the device machine has no network. So convert them on a machine with network first
# (`make refckpts` writes build/ref/tiny-*.ckpt, 11 MB) and carry build/ref with the run (the device
# tool's carry option: carry ["build/ref"]). Without them this script converts with the machine's own
# python3 + numpy (dev/reference/hf_to_ckpt.py needs numpy only) when it can.
#
#   --dry      print the plan and check that every file and tool it needs exists (no GPU needed)
#   --fake     run the whole flow on the CPU to test this script: ./train_sdc -precision bf16 stands in
#              for train_sdc_cu, ./test_sdc for test_sdc_cu, tiny presets for the benchmarks, PyTorch on
#              the CPU ($PYTHON, default .venv-ref/bin/python when present); no nvidia-smi
# Environment: GPU_ARCH (default 90), PYTHON (default python3), OUT (results folder), GPU_CHECK_BENCH
# (benchmark runs, "preset:B ...", default "llama3.2-1b:8 qwen3-0.6b:8 llama3.2-1b:1"), GPU_CHECK_DET
# (determinism runs, "preset:B:T:steps ...").
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DRY=0; FAKE=0; PHASES="info,build,test,det,resume,protect,bench,torch"; BB=8; WARM=5; STEPS=20; BUDGET=500
usage() { sed -n '2,53p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --dry) DRY=1; shift ;;
        --fake) FAKE=1; shift ;;
        --phases) PHASES="$2"; shift 2 ;;
        --B) BB="$2"; shift 2 ;;
        --warmup) WARM="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --budget) BUDGET="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1' (--help for the flags)" >&2; exit 2 ;;
    esac
done
for v in BB:--B WARM:--warmup STEPS:--steps BUDGET:--budget; do
    n="${v%%:*}"
    if ! [[ "${!n}" =~ ^[0-9]+$ ]] || [ "${!n}" -eq 0 ]; then echo "gpu_check: ${v#*:} must be a positive integer" >&2; exit 2; fi
done
has_phase() { [[ ",$PHASES," == *",$1,"* ]]; }

GPU_ARCH="${GPU_ARCH:-90}"
PRESETS_REF="tiny-llama tiny-qwen3 tiny-nanochat"
RES="${OUT:-$ROOT/build/gpu_check}"
WORK="$ROOT/build/gpu_check_work"
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET))

if [ "$FAKE" = 1 ]; then
    PYTHON="${PYTHON:-$([ -x "$ROOT/.venv-ref/bin/python" ] && echo "$ROOT/.venv-ref/bin/python" || echo python3)}"
    TRAIN_GPU=(./train_sdc -precision bf16 -threads 2)
    TEST_BIN=(./test_sdc -states dev/reference/states -ckpts build/ref)
    GPU_TARGETS="train_sdc test_sdc"
    BENCH_T=128; TORCH_DEV=cpu
    BENCH_CFGS="tiny-llama:2 tiny-qwen3:2 tiny-llama:1"
    DET_CFGS="tiny-llama:4:64:4 tiny-nanochat:4:64:4"
    PROT_BENCH="tiny-llama"
else
    PYTHON="${PYTHON:-python3}"
    TRAIN_GPU=(./train_sdc_cu)
    TEST_BIN=(./test_sdc_cu -states dev/reference/states -ckpts build/ref)
    GPU_TARGETS="train_sdc train_sdc_cu test_sdc_cu"
    BENCH_T=1024; TORCH_DEV=cuda
    BENCH_CFGS="llama3.2-1b:$BB qwen3-0.6b:$BB llama3.2-1b:1"
    DET_CFGS="tiny-llama:8:128:6 tiny-nanochat:8:128:6 smollm2-135m:4:512:4"
    PROT_BENCH="llama3.2-1b qwen3-0.6b"
fi
BENCH_CFGS="${GPU_CHECK_BENCH:-$BENCH_CFGS}"; DET_CFGS="${GPU_CHECK_DET:-$DET_CFGS}"
TRAIN_CPU=(./train_sdc -precision bf16)

# ------------------------------------------------------------------------------------ helpers
# the benchmark runs are killed after their timed steps: line-buffer their stdout so it is not lost
LINEBUF=""; command -v stdbuf >/dev/null 2>&1 && LINEBUF="stdbuf -oL -eL"
say() { echo "[gpu_check $(($(date +%s) - T0))s] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }
# time_for S WHAT: is there S seconds of budget left? (else say what is skipped)
time_for() {
    if [ "$(left)" -lt "$1" ]; then say "SKIP $2: $(left)s of the ${BUDGET}s budget left, it needs ~$1s"; return 1; fi
    return 0
}
# tmo S CMD...: run under timeout S (TERM, then KILL 10 s later); 124 means timed out
tmo() { local s=$1; shift; timeout --signal=TERM --kill-after=10 "$s" "$@"; }

ITEMS=(); RESULTS=(); TOKS=(); MSS=(); MFU1=(); MFU2=(); MEMS=()
row() { ITEMS+=("$1"); RESULTS+=("$2"); TOKS+=("${3:-}"); MSS+=("${4:-}"); MFU1+=("${5:-}"); MFU2+=("${6:-}"); MEMS+=("${7:-}"); }

# model shape (layers heads head_dim) of the benchmarked presets, for the attention FLOPs
shape_of() {
    case "$1" in
        llama3.2-1b) echo "16 32 64" ;; qwen3-0.6b) echo "28 16 128" ;; smollm2-135m) echo "30 9 64" ;;
        nanochat-d12) echo "12 6 128" ;; tiny-llama) echo "4 4 32" ;; tiny-qwen3) echo "4 4 64" ;; tiny-nanochat) echo "4 2 64" ;;
        *) echo "0 0 0" ;;
    esac
}
# mfu TOK_S PARAMS PRESET T PEAK_TFLOPS -> percent (empty when unknown)
mfu() {
    local sh; sh=$(shape_of "$3")
    awk -v ts="$1" -v p="$2" -v sh="$sh" -v T="$4" -v pk="$5" 'BEGIN {
        split(sh, a, " "); if (ts == "" || p == "" || pk == "" || pk <= 0 || ts <= 0) { exit }
        f = 6 * p + 12 * a[1] * a[2] * a[3] * T; printf "%.1f%%", 100 * ts * f / (pk * 1e12) }'
}
# the step records of a log with the timing fields removed (what must be bitwise reproducible)
step_bits() { grep '"type":"step"' "$1" | sed -E 's/"(ms|cpu_ms|tok_s|replay_ms)":[^,]*,//g'; }
# loss of step S in a log.jsonl
loss_at() { grep '"type":"step"' "$1" 2>/dev/null | grep "\"step\":$2," | sed -E 's/.*"loss":([^,]*),.*/\1/' | head -n 1; }
# largest relative difference between two lists of numbers (same length), "" if any is missing
maxrel() {
    awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n == 0 || n != m) exit;
        r = 0; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; s = y[i] < 0 ? -y[i] : y[i];
        if (x[i] != x[i] + 0 || s == 0) { r = 1e9; continue } if (d / s > r) r = d / s } printf "%.2e", r }'
}
# sample nvidia-smi memory.used (MiB) every 200 ms into FILE until mem_sampler_stop; MP = its pid
MP=""
mem_sampler_start() {
    MP=""
    if [ "$FAKE" = 1 ] || ! command -v nvidia-smi >/dev/null 2>&1; then return; fi
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
    MP=$!
}
mem_sampler_stop() { if [ -n "$MP" ]; then kill "$MP" 2>/dev/null; wait "$MP" 2>/dev/null; MP=""; fi; }
mem_peak_gib() { [ -s "$1" ] && awk 'BEGIN { m = 0 } $1 + 0 > m { m = $1 + 0 } END { printf "%.1f", m / 1024 }' "$1"; }

need_files() {   # the files and tools the phases need; prints each missing one; returns 1 if any required is missing
    local miss=0 f p
    for f in Makefile train_sdc.c train_sdc.cu test_sdc.c test_sdc.cu llmc/utils.h llmc/checksum.h llmc/rng.h llmc/cpu_kernels.h \
             llmc/train_loop.h llmc/cuda_common.cuh llmc/matmul.cuh llmc/attention.cuh llmc/rmsnorm.cuh llmc/rope.cuh llmc/mlp.cuh \
             llmc/residual.cuh llmc/convert.cuh llmc/embedding.cuh llmc/classifier.cuh llmc/adamw.cuh llmc/global_norm.cuh \
             dev/cuda/bench_matmul.cu dev/bench/bench_gpu_torch.py dev/tsdc_io.py dev/reference/hf_to_ckpt.py; do
        if [ -f "$f" ]; then echo "  ok       $f"; else echo "  MISSING  $f"; miss=1; fi
    done
    for p in $PRESETS_REF; do
        f="dev/reference/states/$p.state"
        if [ -f "$f" ]; then echo "  ok       $f"; else echo "  MISSING  $f"; miss=1; fi
        if [ -f "build/ref/$p.ckpt" ]; then echo "  ok       build/ref/$p.ckpt (carried / converted)"
        elif [ -f "dev/reference/states/$p/model.safetensors" ]; then
            echo "  absent   build/ref/$p.ckpt: will be converted from dev/reference/states/$p/model.safetensors (needs python3 + numpy there;"
            echo "           better: make refckpts here and carry build/ref)"
        else echo "  MISSING  build/ref/$p.ckpt and dev/reference/states/$p/model.safetensors"; miss=1; fi
    done
    for t in make cc timeout awk sed grep; do
        if command -v "$t" >/dev/null 2>&1; then echo "  ok       tool $t"; else echo "  MISSING  tool $t"; miss=1; fi
    done
    for t in nvcc nvidia-smi "$PYTHON"; do
        if command -v "$t" >/dev/null 2>&1; then echo "  ok       tool $t"; else echo "  absent   tool $t (needed on the GPU machine)"; fi
    done
    return $miss
}

plan() {
    cat <<EOF
plan ($([ "$FAKE" = 1 ] && echo "FAKE: CPU stand-ins" || echo "GPU"); phases $PHASES; budget ${BUDGET}s; results in $RES):
  info    nvidia-smi; nvcc --version; gcc; $PYTHON with numpy / torch / transformers               (timeout 30s)
  build   make -j8 GPU_ARCH=$GPU_ARCH $GPU_TARGETS                                    (timeout 300s)
          nvcc -O3 -arch=sm_$GPU_ARCH dev/cuda/bench_matmul.cu -> build/bench_matmul                 (timeout 120s)
          cc: token-shard generator -> $WORK/mkshard
          build/ref/*.ckpt: carried, else python3 dev/reference/hf_to_ckpt.py (numpy)                (timeout 60s)
  test    ${TEST_BIN[*]}                                    (timeout 300s)
  det     ${TRAIN_GPU[*]} twice for each of $DET_CFGS (preset:B:T:steps),
          synthetic shard (vocab 8192): step records (minus timings) and final checkpoints identical  (timeout 120s a run)
  resume  tiny-llama B 4 T 64, 4 steps: GPU and CPU (${TRAIN_CPU[*]}) runs with checkpoints at step 2;
          GPU->CPU and CPU->GPU resumes to step 4; GPU self-resume bitwise                             (timeout 120s a run)
  bench   build/bench_matmul 20 (cuBLASLt bf16 peak)                                                   (timeout 120s)
          for preset:B in $BENCH_CFGS, T $BENCH_T: ${TRAIN_GPU[*]} ($WARM warm-up + $STEPS timed steps, stopped after them)
          and, with 'torch' in the phases, $PYTHON dev/bench/bench_gpu_torch.py --device $TORCH_DEV on the same shard
                                                                                                       (timeout 200s a run)
  summary one markdown table (also $RES/summary.md)
EOF
}

# a token-shard generator in C (no Python needed): mkshard OUT N VOCAB SEED
mkshard_build() {
    [ -x "$WORK/mkshard" ] && return 0
    cat >"$WORK/mkshard.c" <<'EOF'
/* mkshard OUT N VOCAB SEED: a token shard (docs/formats.md) of N uniform random tokens < VOCAB;
 * mkshard OUT N 256 SEED FILE...: the bytes of the files instead (real text, vocab 256), up to N */
#include <stdio.h>
#include <stdlib.h>
#include "llmc/utils.h"
#include "llmc/checksum.h"
#include "llmc/rng.h"
int main(int argc, char** argv) {
    if (argc < 5) { fprintf(stderr, "usage: mkshard OUT N VOCAB SEED [FILE...]\n"); return 1; }
    uint64_t n = strtoull(argv[2], NULL, 10), seed = strtoull(argv[4], NULL, 10);
    uint32_t V = (uint32_t)strtoul(argv[3], NULL, 10), width = V <= 65536 ? 2 : 4, ver = 1, zero = 0;
    uint8_t* body = (uint8_t*)mallocCheck(n * width);
    if (argc > 5) {
        uint64_t got = 0;
        for (int a = 5; a < argc && got < n; a++) {
            FILE* t = fopenCheck(argv[a], "rb");
            int ch;
            while (got < n && (ch = fgetc(t)) != EOF) { uint32_t tok = (uint32_t)ch; memcpy(body + got * width, &tok, width); got++; }
            fclose(t);
        }
        n = got;
    } else {
        Rng r; rng_seed(&r, seed);
        for (uint64_t i = 0; i < n; i++) { uint32_t t = (uint32_t)rng_below(&r, V); memcpy(body + i * width, &t, width); }
    }
    uint8_t h[256] = {0};
    uint64_t chk = tsdc_checksum(body, n * width);
    memcpy(h, "TSDCTOK\0", 8); memcpy(h + 8, &ver, 4); memcpy(h + 12, &width, 4); memcpy(h + 16, &V, 4);
    memcpy(h + 20, &zero, 4); memcpy(h + 24, &n, 8); memcpy(h + 32, &chk, 8);
    FILE* f = fopenCheck(argv[1], "wb");
    fwrite_exact(h, 256, f, argv[1]); fwrite_exact(body, n * width, f, argv[1]);
    if (fclose(f) != 0) tsdc_fail("%s: write failed", argv[1]);
    return 0;
}
EOF
    cc -O2 -w -I"$ROOT" -o "$WORK/mkshard" "$WORK/mkshard.c" -lm || { say "shard generator failed to compile"; return 1; }
}
shard() {   # shard FILE NTOKENS: synthetic shard of vocabulary 8192 (ids valid for every preset)
    [ -f "$1" ] && return 0
    if mkshard_build && "$WORK/mkshard" "$1" "$2" 8192 1234; then say "shard $1: $2 random tokens < 8192"; return 0; fi
    say "no shard generator: $1 not written"; return 1
}

# ---------------------------------------------------------------------------------- dry mode
if [ "$DRY" = 1 ]; then
    plan
    echo "files and tools:"
    if need_files; then echo "dry run: everything needed is present"; exit 0; fi
    echo "dry run: something required is MISSING (above)"; exit 1
fi

mkdir -p "$RES" "$WORK"
LOG="$RES/gpu_check.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
plan
if ! need_files >"$WORK/files.txt"; then cat "$WORK/files.txt"; say "required files are missing: continuing, the phases that need them will fail"; fi

GPU_NAME="(fake: CPU)"; PEAK=""
# ------------------------------------------------------------------------------------- info
if has_phase info; then
    say "== info"
    echo "host: $(uname -srm), $(nproc) cores, $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB RAM"}'), disk $(df -h . | awk 'NR == 2 {print $4 " free"}')"
    if [ "$FAKE" = 0 ]; then
        tmo 30 nvidia-smi || say "nvidia-smi failed"
        tmo 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv || true
        GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    fi
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    cc --version 2>/dev/null | head -n 1
    command -v mpicc >/dev/null && echo "mpicc: $(command -v mpicc)" || echo "mpicc: none (single-process builds)"
    tmo 60 "$PYTHON" -c '
import sys
print("python", sys.version.split()[0], sys.executable)
for m in ("numpy", "torch", "transformers"):
    try:
        mod = __import__(m); print(m, mod.__version__)
    except Exception as e:
        print(m, "NOT importable:", e)
try:
    import torch; print("torch cuda:", torch.cuda.is_available(), torch.version.cuda)
except Exception:
    pass' || say "$PYTHON failed"
    row "machine" "${GPU_NAME:-unknown}; $(nproc) cores; nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
fi

# ------------------------------------------------------------------------------------ build
BUILD_OK=0
if has_phase build; then
    say "== build"
    missing_ref=""
    for p in $PRESETS_REF; do [ -f "build/ref/$p.ckpt" ] || missing_ref="$missing_ref $p"; done
    if [ -z "$missing_ref" ]; then
        say "reference checkpoints: build/ref/*.ckpt present (carried or converted before)"
    else
        say "reference checkpoints missing for:$missing_ref; converting with $PYTHON (numpy)"
        mkdir -p build/ref
        for p in $missing_ref; do
            tmo 60 "$PYTHON" dev/reference/hf_to_ckpt.py "dev/reference/states/$p" "build/ref/$p.ckpt" --preset "$p" \
                || say "conversion of $p failed (carry build/ref: make refckpts on a machine with network)"
        done
    fi
    say "make -j8 GPU_ARCH=$GPU_ARCH $GPU_TARGETS"
    tmo 300 make -j8 GPU_ARCH="$GPU_ARCH" $GPU_TARGETS; rc=$?
    built=""; for t in $GPU_TARGETS; do [ -x "$t" ] && built="$built $t"; done
    if [ $rc = 0 ]; then BUILD_OK=1; fi
    bm="no nvcc"
    if command -v nvcc >/dev/null 2>&1; then
        mkdir -p build
        if tmo 120 nvcc -O3 -std=c++17 -arch=sm_"$GPU_ARCH" -o build/bench_matmul dev/cuda/bench_matmul.cu -lcublasLt; then bm="bench_matmul"
        else bm="bench_matmul FAILED"; fi
    fi
    mkshard_build || true
    nref=0; for p in $PRESETS_REF; do [ -f "build/ref/$p.ckpt" ] && nref=$((nref + 1)); done
    row "build (make GPU_ARCH=$GPU_ARCH)" "$([ $BUILD_OK = 1 ] && echo OK || echo "FAILED (rc $rc)"):${built:- nothing}; $bm; ref ckpts $nref/3"
fi

# ------------------------------------------------------------------------------------- test
# the "N passed, M failed" line of a test log, as "N M" (empty if none)
test_counts() { grep -E '^test_sdc(_cu)?: [0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1 | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/'; }
if has_phase test; then
    say "== test: ${TEST_BIN[*]}"
    if [ -x "${TEST_BIN[0]}" ] && time_for 60 "test"; then
        TL="$RES/test_sdc_cu.log"
        tmo 300 "${TEST_BIN[@]}" 2>&1 | tee "$TL"; rc=${PIPESTATUS[0]}
        counts=$(test_counts "$TL")
        if [ -n "$counts" ] && { [ $rc = 0 ] || [ $rc = 1 ]; }; then
            read -r np nf <<<"$counts"; res="$np passed, $nf failed"
        elif [ "$FAKE" = 0 ]; then
            # a crash or a hang hides every later test: run each test on its own, to see them all
            say "test_sdc_cu ended without its summary (rc $rc): running each test in its own process"
            np=0; nf=0; crashed=""
            for t in convert embedding rmsnorm rope attention attention_split elementwise classifier adamw global_norm fingerprint attcheck matmul reference determinism update_norm att_checks; do
                time_for 20 "test $t" || { crashed="$crashed $t(no time)"; continue; }
                tmo 120 "${TEST_BIN[@]}" -only "$t" >"$WORK/test_$t.log" 2>&1; trc=$?
                cat "$WORK/test_$t.log" >>"$TL"
                c=$(test_counts "$WORK/test_$t.log")
                if [ -n "$c" ]; then read -r a1 b1 <<<"$c"; np=$((np + a1)); nf=$((nf + b1))
                else crashed="$crashed $t(rc $trc)"; tail -n 3 "$WORK/test_$t.log"; fi
            done
            res="$np passed, $nf failed (one process per test); CRASHED:${crashed:- none}"
        else
            res="CRASHED or no summary line (rc $rc)"
        fi
        [ $rc = 124 ] && res="$res; the full run TIMED OUT"
        row "${TEST_BIN[0]#./}" "$res"
        if grep -q "NOT OK" "$TL"; then say "NOT OK lines (with the line before):"; grep -B1 "NOT OK" "$TL" | head -n 80; fi
    else
        row "${TEST_BIN[0]#./}" "not run (binary missing or no time)"
    fi
fi

# -------------------------------------------------------------------------------- determinism
if has_phase det; then
    say "== determinism of the full binary: ${TRAIN_GPU[*]}"
    DSH="$WORK/det.bin"
    shard "$DSH" 2000000
    det_res=""; det_ok=1
    [ -x "${TRAIN_GPU[0]}" ] || { det_ok=0; det_res=" ${TRAIN_GPU[0]} missing"; DET_CFGS=""; }
    for cfg in $DET_CFGS; do
        IFS=: read -r p b t n <<<"$cfg"
        time_for 40 "determinism $p" || { det_res="$det_res $p:skipped"; det_ok=0; continue; }
        for r in 1 2; do
            rm -rf "$WORK/det_${p}_$r"
            tmo 120 "${TRAIN_GPU[@]}" -preset "$p" -train "$DSH" -B "$b" -seq "$t" -steps "$n" -warmup 2 -lr 1e-3 -eval_every 0 \
                -quiet -out "$WORK/det_${p}_$r" >"$WORK/det_${p}_$r.out" 2>&1 || { say "run $r of $p failed:"; tail -n 5 "$WORK/det_${p}_$r.out"; }
        done
        ck=$(printf 'step_%06d.ckpt' "$n")
        a="$WORK/det_${p}_1"; bdir="$WORK/det_${p}_2"
        if [ -s "$a/log.jsonl" ] && [ -s "$bdir/log.jsonl" ] && [ -f "$a/$ck" ] && [ -f "$bdir/$ck" ] \
            && [ "$(step_bits "$a/log.jsonl" | wc -l)" = "$n" ] && diff <(step_bits "$a/log.jsonl") <(step_bits "$bdir/log.jsonl") >/dev/null \
            && cmp -s "$a/$ck" "$bdir/$ck"; then
            say "$p: $n steps, loss bits and checkpoint bytes identical (final loss $(loss_at "$a/log.jsonl" "$n"))"
            det_res="$det_res $p:ok"
        else
            det_ok=0; det_res="$det_res $p:DIFFERENT"
            say "$p: runs differ or failed"; diff <(step_bits "$a/log.jsonl" 2>/dev/null) <(step_bits "$bdir/log.jsonl" 2>/dev/null) | head -n 6
            cmp "$a/$ck" "$bdir/$ck" 2>&1 | head -n 2
        fi
        rm -f "$a"/*.ckpt "$bdir"/*.ckpt
    done
    row "determinism, ${TRAIN_GPU[0]#./} twice" "$([ $det_ok = 1 ] && echo "OK: identical loss bits and checkpoint bytes" || echo "NOT OK"):$det_res"
fi

# ---------------------------------------------------------------------------------- cross-resume
if has_phase resume; then
    say "== cross-resume GPU <-> CPU (tiny-llama, B 4, T 64, 4 steps, checkpoint at step 2)"
    RSH="$WORK/det.bin"
    shard "$RSH" 2000000
    if time_for 40 "cross-resume" && [ -x "${TRAIN_GPU[0]}" ] && [ -x ./train_sdc ]; then
        COMMON=(-preset tiny-llama -train "$RSH" -B 4 -seq 64 -steps 4 -warmup 1 -lr 1e-3 -eval_every 0 -quiet)
        rm -rf "$WORK"/res_*
        tmo 120 "${TRAIN_GPU[@]}" "${COMMON[@]}" -ckpt_every 2 -out "$WORK/res_gpu" >"$WORK/res_gpu.out" 2>&1 || tail -n 5 "$WORK/res_gpu.out"
        tmo 120 "${TRAIN_CPU[@]}" "${COMMON[@]}" -ckpt_every 2 -out "$WORK/res_cpu" >"$WORK/res_cpu.out" 2>&1 || tail -n 5 "$WORK/res_cpu.out"
        tmo 120 "${TRAIN_CPU[@]}" "${COMMON[@]}" -resume "$WORK/res_gpu/step_000002.ckpt" -out "$WORK/res_g2c" >"$WORK/res_g2c.out" 2>&1; rc1=$?
        tmo 120 "${TRAIN_GPU[@]}" "${COMMON[@]}" -resume "$WORK/res_cpu/step_000002.ckpt" -out "$WORK/res_c2g" >"$WORK/res_c2g.out" 2>&1; rc2=$?
        tmo 120 "${TRAIN_GPU[@]}" "${COMMON[@]}" -resume "$WORK/res_gpu/step_000002.ckpt" -out "$WORK/res_g2g" >"$WORK/res_g2g.out" 2>&1; rc3=$?
        for f in g2c c2g g2g; do grep -E "^(resumed|error)" "$WORK/res_$f.out" | sed "s/^/  $f: /"; done
        lg=""; lc=""; for s in 1 2 3 4; do lg="$lg $(loss_at "$WORK/res_gpu/log.jsonl" $s)"; lc="$lc $(loss_at "$WORK/res_cpu/log.jsonl" $s)"; done
        g2c="$(loss_at "$WORK/res_g2c/log.jsonl" 3) $(loss_at "$WORK/res_g2c/log.jsonl" 4)"
        c2g="$(loss_at "$WORK/res_c2g/log.jsonl" 3) $(loss_at "$WORK/res_c2g/log.jsonl" 4)"
        g34="$(loss_at "$WORK/res_gpu/log.jsonl" 3) $(loss_at "$WORK/res_gpu/log.jsonl" 4)"
        c34="$(loss_at "$WORK/res_cpu/log.jsonl" 3) $(loss_at "$WORK/res_cpu/log.jsonl" 4)"
        echo "  losses steps 1-4: GPU$lg | CPU bf16$lc"
        echo "  steps 3-4: GPU->CPU $g2c | CPU->GPU $c2g"
        r_gc=$(maxrel "$lg" "$lc"); r_g2c=$(maxrel "$g2c" "$g34"); r_c2g=$(maxrel "$c2g" "$c34")
        self="bitwise"
        if ! diff <(step_bits "$WORK/res_g2g/log.jsonl" 2>/dev/null) <(step_bits "$WORK/res_gpu/log.jsonl" 2>/dev/null | tail -n 2) >/dev/null \
            || ! cmp -s "$WORK/res_g2g/step_000004.ckpt" "$WORK/res_gpu/step_000004.ckpt"; then self="DIFFERENT"; fi
        ok=1
        for r in "$r_gc" "$r_g2c" "$r_c2g"; do awk -v r="$r" 'BEGIN { exit !(r != "" && r + 0 < 2e-2) }' || ok=0; done
        [ $rc1 = 0 ] && [ $rc2 = 0 ] && [ $rc3 = 0 ] && [ "$self" = bitwise ] || ok=0
        row "cross-resume GPU<->CPU bf16" "$([ $ok = 1 ] && echo OK || echo "NOT OK (rc $rc1/$rc2/$rc3)"): GPU->CPU rel diff ${r_g2c:-n/a}, CPU->GPU ${r_c2g:-n/a}, GPU vs CPU steps 1-4 ${r_gc:-n/a} (limit 2e-2); GPU self-resume $self"
    else
        row "cross-resume GPU<->CPU bf16" "not run (binaries missing or no time)"
    fi
fi

# ---------------------------------------------------------------------------------- protection
# the CPU tests of tests/test_protect.py and tests/test_detect.py, on the GPU binary (python3 stdlib only):
# Q/K recomputation catches every Q/K-path fault and the replayed run ends bit-identical to the clean
# one; the attention checks (ours and ABFT) catch every live attention fault, bit-identical likewise;
# a calibrated clean run raises no alarm in 200 steps; large residual faults are caught; exponent
# scaling in bf16 stays within rounding; then the protection overhead on the paper's per-rank setting.
prot_check() {   # prot_check DIR KIND [CLEAN_DIR]: KIND qk|att|abft = every (live) event replayed by KIND
    "$PYTHON" - "$@" <<'PYEOF'
import json, os, sys
d, kind = sys.argv[1], sys.argv[2]
st = {}
for l in open(os.path.join(d, "log.jsonl")):
    r = json.loads(l)
    if r.get("type") == "step": st[r["step"]] = r
ev = [json.loads(l) for l in open(os.path.join(d, "faults.jsonl"))] if os.path.exists(os.path.join(d, "faults.jsonl")) else []
if kind == "clean":
    bad = [s for s, r in st.items() if r["replayed"]]
    print(f"{len(st)} steps, {len(bad)} alarms"); sys.exit(1 if bad or not st else 0)
if kind == "any":
    det = [e for e in ev if st[e["step"]]["replayed"]]
    print(f"{len(det)}/{len(ev)} events replayed"); sys.exit(0 if ev and len(det) == len(ev) else 1)
live = [e for e in ev if e.get("live", e["m"]) > 0]
miss = [e for e in live if not (st[e["step"]]["replayed"] and kind in st[e["step"]]["by"].split(","))]
false = [e for e in ev if e.get("live", e["m"]) == 0 and st[e["step"]]["replayed"]]
print(f"{len(live) - len(miss)}/{len(live)} live events caught by {kind}, {len(ev) - len(live)} dead, {len(false)} dead replayed")
sys.exit(0 if live and not miss and not false else 1)
PYEOF
}
if has_phase protect; then
    say "== protection on ${TRAIN_GPU[*]}"
    # real text, as the CPU tests (tests/test_protect.py: tinyshakespeare bytes, vocab 256, T 32, B 2): the
    # project's own sources and docs as bytes (there is no data set on the device machine)
    PSH="$WORK/text.bin"; TSH="$WORK/det.bin"
    shard "$TSH" 2000000
    mkshard_build && "$WORK/mkshard" "$PSH" 2000000 256 0 README.md docs/*.md train_sdc.c train_sdc.cu test_sdc.c test_sdc.cu llmc/*.h llmc/*.cuh
    if [ -x "${TRAIN_GPU[0]}" ] && [ -f "$PSH" ] && command -v "$PYTHON" >/dev/null 2>&1 && time_for 60 "protection"; then
        PC=(-preset tiny-llama -train "$PSH" -vocab 256 -B 2 -seq 32 -accum 2 -warmup 5 -lr 1e-3 -eval_every 0 -quiet)
        pok=0; pn=0; pres=""
        pcase() {   # pcase NAME KIND CLEAN_FLAGS... -- FAULT_FLAGS...: clean run, faulty run, prot_check, checkpoint bytes
            local name=$1 kind=$2; shift 2
            local cf=() ff=() sep=0
            for x in "$@"; do if [ "$x" = "--" ]; then sep=1; elif [ $sep = 0 ]; then cf+=("$x"); else ff+=("$x"); fi; done
            rm -rf "$WORK/p_$name" "$WORK/p_${name}_c"
            tmo 120 "${TRAIN_GPU[@]}" "${PC[@]}" -steps 8 "${cf[@]}" -out "$WORK/p_${name}_c" >"$WORK/p_$name.out" 2>&1
            tmo 120 "${TRAIN_GPU[@]}" "${PC[@]}" -steps 8 "${cf[@]}" "${ff[@]}" -out "$WORK/p_$name" >>"$WORK/p_$name.out" 2>&1
            pn=$((pn + 1))
            if msg=$(prot_check "$WORK/p_$name" "$kind" 2>&1) && cmp -s "$WORK/p_$name/step_000008.ckpt" "$WORK/p_${name}_c/step_000008.ckpt"; then
                pok=$((pok + 1)); say "protect $name: OK ($msg; weights bit-identical to the clean run)"
            else
                pres="$pres $name"; say "protect $name: NOT OK ($msg)"; tail -n 3 "$WORK/p_$name.out"
            fi
        }
        for m in 1 10 1000; do
            pcase "qk_m$m" qk -protect qk -- -fault_mode campaign -fault_sites qk -fault_pass fwd -fault_m $m -fault_seed $((11 + m))
        done
        for site in att_logits att_probs; do
            pcase "att_$site" att -protect att -- -fault_mode campaign -fault_sites $site -fault_pass fwd -fault_m 10 -fault_field exponent -fault_seed 5
        done
        for site in att_logits att_out; do
            pcase "abft_$site" abft -detect abft -- -fault_mode campaign -fault_sites $site -fault_pass fwd -fault_m 10 -fault_field exponent -fault_seed 5
        done
        # calibration (100 clean steps), then 200 protected clean steps without an alarm; then large residual faults
        rm -rf "$WORK/p_cal"
        # 256 tokens a microbatch: with 64 (B 2 x T 32, the CPU test's) the bf16 gains of this heterogeneous text raise
        # about 1 false alarm in 100 clean steps (measured on the CPU in bf16; 0 with tinyshakespeare or with 256 tokens)
        CC=(-preset tiny-llama -train "$PSH" -vocab 256 -B 4 -seq 64 -accum 3 -warmup 5 -lr 1e-3 -eval_every 0 -quiet -steps 300)
        tmo 200 "${TRAIN_GPU[@]}" "${CC[@]}" -stop_at 100 -rgg_calibrate "$WORK/p.cal" -out "$WORK/p_cal" >"$WORK/p_cal.out" 2>&1
        tmo 300 "${TRAIN_GPU[@]}" "${CC[@]}" -resume "$WORK/p_cal/step_000100.ckpt" -protect all -rgg_calibration "$WORK/p.cal" \
            -out "$WORK/p_clean" >>"$WORK/p_cal.out" 2>&1
        pn=$((pn + 1))
        if msg=$(prot_check "$WORK/p_clean" clean 2>&1); then pok=$((pok + 1)); say "protect clean 200 steps: OK ($msg)"
        else pres="$pres clean"; say "protect clean 200 steps: NOT OK ($msg)"; tail -n 3 "$WORK/p_cal.out"; fi
        for site in o_proj down_proj v_proj; do
            rm -rf "$WORK/p_res_$site"
            tmo 120 "${TRAIN_GPU[@]}" "${CC[@]}" -resume "$WORK/p_cal/step_000100.ckpt" -stop_at 110 -protect rgg -rgg_calibration "$WORK/p.cal" \
                -fault_mode campaign -fault_sites $site -fault_pass fwd -fault_m 1000 -fault_field exponent -fault_start 101 -fault_end 110 \
                -fault_seed 9 -out "$WORK/p_res_$site" >"$WORK/p_res_$site.out" 2>&1
            pn=$((pn + 1))
            if msg=$(prot_check "$WORK/p_res_$site" any 2>&1); then pok=$((pok + 1)); say "protect residual $site: OK ($msg)"
            else pres="$pres res_$site"; say "protect residual $site: NOT OK ($msg)"; fi
        done
        # exponent scaling in bf16: within rounding of the unscaled run
        rm -rf "$WORK/p_k0" "$WORK/p_k15"
        tmo 120 "${TRAIN_GPU[@]}" "${PC[@]}" -steps 20 -out "$WORK/p_k0" >/dev/null 2>&1
        tmo 120 "${TRAIN_GPU[@]}" "${PC[@]}" -steps 20 -expscale_k 15 -out "$WORK/p_k15" >/dev/null 2>&1
        l0=""; l15=""; for s in 5 10 15 20; do l0="$l0 $(loss_at "$WORK/p_k0/log.jsonl" $s)"; l15="$l15 $(loss_at "$WORK/p_k15/log.jsonl" $s)"; done
        rk=$(maxrel "$l0" "$l15"); pn=$((pn + 1))
        if awk -v r="$rk" 'BEGIN { exit !(r != "" && r + 0 < 2e-2) }'; then pok=$((pok + 1)); say "protect expscale k=15: OK (rel diff $rk)"
        else pres="$pres expscale"; say "protect expscale k=15: NOT OK (rel diff ${rk:-n/a})"; fi
        row "protection tests on ${TRAIN_GPU[0]#./}" "$pok/$pn OK${pres:+; NOT OK:$pres}"
        # overhead: the paper's per-rank setting (B 1 x T 1024), fault-free, one configuration after another
        for p in $PROT_BENCH; do
            base_ms=""
            for cfg in none qk rgg exp all all,att; do
                time_for 30 "overhead $p $cfg" || { row "overhead $p -protect $cfg" "skipped (no time)"; continue; }
                d="$WORK/oh_${p}_$cfg"; rm -rf "$d"
                tmo 150 "${TRAIN_GPU[@]}" -preset "$p" -train "$TSH" -B 1 -seq "$BENCH_T" -accum 4 -steps 1000 -warmup 10 -lr 1e-5 \
                    -eval_every 0 -quiet -stop_at $((WARM + STEPS)) -protect "$cfg" -out "$d" >"$d.out" 2>&1
                ms=$(grep '"type":"step"' "$d/log.jsonl" 2>/dev/null | tail -n "$STEPS" | sed -E 's/.*"ms":([^,]*),.*/\1/' | awk '{ s += $1; n++ } END { if (n) printf "%.2f", s / n }')
                rm -f "$d"/*.ckpt
                [ "$cfg" = none ] && base_ms=$ms
                oh=$(awk -v a="$ms" -v b="$base_ms" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%+.2f%%", 100 * (a / b - 1) }')
                row "overhead $p B 1 x T $BENCH_T x accum 4, -protect $cfg" "${oh:-n/a} vs none (paper: 1.65% llama3.2-1b, 6.76% qwen3-0.6b)" "" "${ms:-n/a}"
            done
        done
    else
        row "protection tests" "not run (binary or $PYTHON missing, or no time)"
    fi
fi

# --------------------------------------------------------------------------------- benchmarks
if has_phase bench; then
    say "== benchmarks, T $BENCH_T, $WARM warm-up + $STEPS timed steps"
    if [ "$FAKE" = 0 ] && [ -x build/bench_matmul ] && time_for 30 "bench_matmul"; then
        tmo 120 build/bench_matmul 20 2>&1 | tee "$RES/bench_matmul.log"
        PEAK=$(sed -n 's/^PEAK_TFLOPS \([0-9.]*\).*/\1/p' "$RES/bench_matmul.log" | tail -n 1)
        row "cuBLASLt bf16 GEMM rate (bench_matmul)" "${PEAK:-n/a} TFLOP/s measured (datasheet 989)"
    fi
    BSH="$WORK/bench.bin"
    ntok=$(( (WARM + STEPS) * BB * BENCH_T + 1 )); [ $ntok -lt 1100000 ] && ntok=1100000
    shard "$BSH" "$ntok"
    TORCH_OK=0
    if has_phase torch; then
        if tmo 120 "$PYTHON" -c "import torch, transformers; assert '$TORCH_DEV' == 'cpu' or torch.cuda.is_available()" >/dev/null 2>&1; then
            TORCH_OK=1
        else
            row "PyTorch" "not importable with $PYTHON (or no CUDA in torch): skipped"
        fi
    fi
    HAVE_NP=0; "$PYTHON" -c "import numpy" >/dev/null 2>&1 && HAVE_NP=1
    for cfg in $BENCH_CFGS; do
        IFS=: read -r p b <<<"$cfg"
        w=$WARM; s=$STEPS
        if [ "$b" = 1 ]; then w=3; s=10; fi
        label="$p B=$b T=$BENCH_T"
        # ---- train_sdc_cu
        if [ -x "${TRAIN_GPU[0]}" ] && time_for 60 "train_sdc_cu $label"; then
            d="$WORK/bench_${p}_$b"; rm -rf "$d"; mkdir -p "$d"
            last=$((w + s))
            mem_sampler_start "$d/mem.txt"
            # timeout itself in the background (not the tmo function: its subshell would not pass a kill on)
            lim=$(( $(left) - 20 )); [ $lim -gt 200 ] && lim=200
            $LINEBUF timeout --signal=TERM --kill-after=10 $lim "${TRAIN_GPU[@]}" -preset "$p" -train "$BSH" -B "$b" -seq "$BENCH_T" \
                -steps 100000 -warmup 10 -lr 1e-4 -eval_every 0 -quiet -out "$d" >"$d/stdout" 2>&1 &
            pid=$!
            while kill -0 $pid 2>/dev/null && ! grep -q "\"step\":$last," "$d/log.jsonl" 2>/dev/null; do sleep 0.5; done
            kill $pid 2>/dev/null; wait $pid 2>/dev/null
            mem_sampler_stop
            head -n 2 "$d/stdout"
            params=$(grep '"type":"run"' "$d/log.jsonl" 2>/dev/null | sed -n 's/.*"params":\([0-9]*\).*/\1/p' | head -n 1)
            stats=$(grep '"type":"step"' "$d/log.jsonl" 2>/dev/null | sed -E 's/.*"step":([0-9]+),.*"ms":([^,]*),.*/\1 \2/' |
                awk -v w="$w" -v l="$last" '$1 > w && $1 <= l { print $2 }' | sort -g |
                awk '{ v[++n] = $1; s += $1 } END { if (n == 0) exit; med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2;
                    printf "%d %.3f %.3f", n, s / n, med }')
            read -r nt mean med <<<"${stats:-0 0 0}"
            mem=$(mem_peak_gib "$d/mem.txt")
            if [ "$nt" -ge 1 ]; then
                tok=$(awk -v b="$b" -v t="$BENCH_T" -v ms="$mean" 'BEGIN { printf "%.0f", b * t / (ms / 1000) }')
                say "train_sdc_cu $label: $nt timed steps, mean $mean ms (median $med), $tok tokens/s, $params parameters, peak ${mem:-n/a} GiB"
                row "train_sdc_cu $label" "ok ($nt steps; median $med ms)" "$tok" "$mean" "$(mfu "$tok" "$params" "$p" "$BENCH_T" 989)" \
                    "$(mfu "$tok" "$params" "$p" "$BENCH_T" "${PEAK:-}")" "${mem:-n/a}"
            else
                say "train_sdc_cu $label: no timed steps logged"; tail -n 5 "$d/stdout"
                row "train_sdc_cu $label" "FAILED: $(grep -m1 -E 'error|rror' "$d/stdout" | cut -c1-120)"
            fi
        fi
        # ---- PyTorch
        if [ "$TORCH_OK" = 1 ] && time_for 60 "PyTorch $label"; then
            d="$WORK/torch_${p}_$b"; rm -rf "$d"; mkdir -p "$d"
            mem_sampler_start "$d/mem.txt"
            targs=(--preset "$p" --B "$b" --T "$BENCH_T" --warmup "$w" --steps "$s" --device "$TORCH_DEV")
            [ "$HAVE_NP" = 1 ] && targs+=(--train "$BSH")
            lim=$(( $(left) - 10 )); [ $lim -gt 200 ] && lim=200
            tmo $lim env PYTHONUNBUFFERED=1 "$PYTHON" dev/bench/bench_gpu_torch.py "${targs[@]}" >"$d/out.json" 2>"$d/err.txt"; rc=$?
            mem_sampler_stop
            mem=$(mem_peak_gib "$d/mem.txt")
            js=$(grep '^{' "$d/out.json" | tail -n 1)
            if [ $rc = 0 ] && [ -n "$js" ]; then
                echo "  $js"
                read -r tok ms params alloc <<<"$("$PYTHON" -c 'import json, sys; r = json.loads(sys.argv[1]);
print("%.0f %.3f %d %s" % (r["tok_s"], r["ms_step"], r["params"], r.get("peak_alloc_gib", "n/a")))' "$js")"
                row "PyTorch $label" "ok (SDPA, bf16 autocast, fused AdamW; allocator peak ${alloc} GiB)" "$tok" "$ms" \
                    "$(mfu "$tok" "$params" "$p" "$BENCH_T" 989)" "$(mfu "$tok" "$params" "$p" "$BENCH_T" "${PEAK:-}")" "${mem:-n/a}"
            else
                tail -n 5 "$d/err.txt"
                row "PyTorch $label" "FAILED (rc $rc): $(tail -n 1 "$d/err.txt" | cut -c1-120)"
            fi
        fi
    done
fi

# ----------------------------------------------------------------------------------- summary
say "== summary ($(($(date +%s) - T0)) s)"
{
    echo "| check / run | result | tokens/s | ms/step | MFU (989 TFLOP/s) | MFU (measured ${PEAK:-n/a}) | peak GPU mem (GiB) |"
    echo "|---|---|---|---|---|---|---|"
    for i in "${!ITEMS[@]}"; do
        echo "| ${ITEMS[$i]} | ${RESULTS[$i]} | ${TOKS[$i]:--} | ${MSS[$i]:--} | ${MFU1[$i]:--} | ${MFU2[$i]:--} | ${MEMS[$i]:--} |"
    done
} >"$RES/summary.md"
rm -rf "$WORK"
echo
echo "MFU = tokens/s x (6 P + 12 L H hd T) / peak; peak memory = nvidia-smi memory.used (context included); $([ "$FAKE" = 1 ] && echo "FAKE run: CPU stand-ins, numbers meaningless")"
cat "$RES/summary.md"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit 0
