#!/usr/bin/env bash
# scripts/bench_cpu.sh: CPU training-speed benchmark, train_sdc (fp32) against PyTorch.
#
# Trains the same tiny preset with ./train_sdc and with the HF model in PyTorch
# (dev/bench/bench_torch.py), same threads, batch B and sequence length T, on the same token shard,
# and prints tokens/s and ms/step of each and the ratio train_sdc / PyTorch. Goal: ratio >= 1.
#
#   scripts/bench_cpu.sh [--preset tiny-llama|tiny-qwen3] [--B 8] [--T 128] [--threads N]
#                        [--warmup 3] [--steps 10] [--repeats 2] [--data DIR]
#
# Steps: (a) make sure the Python venv with torch + transformers exists ($VENV_REF, default
# .venv-ref at the repo root, created from dev/reference/requirements.txt if missing; if that fails
# the C part still runs); (b) make train_sdc; (c) the shard: DIR/train.bin with --data, else a
# seeded random-token shard (vocabulary 8192, the tiny presets') in a temp dir; (d)+(e) interleaved
# runs, train_sdc then PyTorch, --repeats times; each run does --warmup untimed steps and --steps
# timed ones, and its ms/step is the mean over the timed steps (train_sdc: the "ms" of the step
# lines of its log.jsonl after the warm-up); (f) the table, taking the BEST run (lowest ms/step) of
# each implementation, every run listed above it.
#
# Environment: VENV_REF (venv directory), TORCH_INDEX_URL (if set, torch is installed from that
# index first, e.g. https://download.pytorch.org/whl/cpu for the CPU-only wheel), PYTHON (the
# interpreter used to create the venv, default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PRESET=tiny-llama; B=8; T=128; THREADS="$(nproc)"; WARMUP=3; STEPS=10; REPEATS=2; DATA=""
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --preset) PRESET="$2"; shift 2 ;;
        --B) B="$2"; shift 2 ;;
        --T) T="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --warmup) WARMUP="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --repeats) REPEATS="$2"; shift 2 ;;
        --data) DATA="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_cpu: unknown argument '$1' (--help for the flags)" >&2; exit 2 ;;
    esac
done
case "$PRESET" in
    tiny-llama|tiny-qwen3) ;;
    *) echo "bench_cpu: --preset must be tiny-llama or tiny-qwen3 (the presets with an HF model)" >&2; exit 2 ;;
esac
for v in B T THREADS WARMUP STEPS REPEATS; do
    if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then
        f="${v,,}"; [ ${#v} = 1 ] && f="$v"   # --B and --T keep their case
        echo "bench_cpu: --$f must be a positive integer" >&2; exit 2
    fi
done
if [ -n "$DATA" ] && [ ! -f "$DATA/train.bin" ]; then echo "bench_cpu: $DATA/train.bin not found" >&2; exit 2; fi

say() { echo "[bench] $*"; }
# percentage of the machine's CPU time that was busy over 1 s (from /proc/stat): other work on the
# machine makes both implementations' OpenMP threads wait on each other and the timings meaningless
busy_pct() {
    local a b
    read -r -a a </proc/stat; sleep 1; read -r -a b </proc/stat
    local tot=0 idle i
    for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
    idle=$(( (b[4] - a[4]) + (b[5] - a[5]) ))
    echo $(( tot > 0 ? 100 * (tot - idle) / tot : 0 ))
}
check_quiet() {
    local p; p=$(busy_pct)
    if [ "$p" -gt 10 ]; then
        say "WARNING: the machine is ${p}% busy $1 this benchmark (other processes); timings are unreliable"
    else
        say "machine ${p}% busy $1 the runs"
    fi
}
run() { echo "+ $*"; "$@"; }   # print the command, then run it

VENV="${VENV_REF:-$ROOT/.venv-ref}"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/bench_cpu.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# ---------------------------------------------------------------- (a) the PyTorch venv
HAVE_TORCH=0
venv_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch, transformers, numpy" >/dev/null 2>&1; }
if venv_ok; then
    HAVE_TORCH=1
    say "venv $VENV: $("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
else
    PKGS="$(grep -v '^\s*#' dev/reference/requirements.txt | grep -v '^\s*$' | tr '\n' ' ')"
    say "venv $VENV missing or incomplete: creating it and installing ${PKGS}(dev/reference/requirements.txt)"
    if [ -n "${TORCH_INDEX_URL:-}" ]; then say "torch from $TORCH_INDEX_URL"; fi
    PIPLOG="$TMP/pip.log"
    if { [ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"; } >"$PIPLOG" 2>&1 \
        && "$VENV/bin/python" -m pip install -q --upgrade pip >>"$PIPLOG" 2>&1 \
        && { [ -z "${TORCH_INDEX_URL:-}" ] || "$VENV/bin/python" -m pip install -q --index-url "$TORCH_INDEX_URL" torch >>"$PIPLOG" 2>&1; } \
        && "$VENV/bin/python" -m pip install -q -r dev/reference/requirements.txt >>"$PIPLOG" 2>&1 \
        && venv_ok; then
        HAVE_TORCH=1
        say "installed: $("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
    else
        say "could not install torch+transformers into $VENV ($(tail -n 1 "$PIPLOG" 2>/dev/null | cut -c1-160)); running the train_sdc part only"
    fi
fi

# ---------------------------------------------------------------- (b) build
run make -s train_sdc

# ---------------------------------------------------------------- (c) the token shard
if [ -n "$DATA" ]; then
    SHARD="$DATA/train.bin"
else
    SHARD="$TMP/train.bin"
    NTOK=$(( (WARMUP + STEPS) * B * T + 1 ))
    if [ "$NTOK" -lt 65536 ]; then NTOK=65536; fi
    PY=python3; [ "$HAVE_TORCH" = 1 ] && PY="$VENV/bin/python"
    say "random-token shard: $NTOK tokens, vocabulary 8192, seed 1234 -> $SHARD"
    # tsdc_io (numpy) when numpy is there; otherwise the same format written in plain Python
    "$PY" - "$SHARD" "$NTOK" <<'EOF'
import struct, sys
path, n, V, seed = sys.argv[1], int(sys.argv[2]), 8192, 1234
sys.path.insert(0, "dev")
try:
    import numpy as np
    import tsdc_io
    tsdc_io.write_shard(path, np.random.default_rng(seed).integers(0, V, n), V)
except ImportError:
    import random
    rng = random.Random(seed)
    body = struct.pack(f"<{n}H", *(rng.randrange(V) for _ in range(n)))
    M, G = (1 << 64) - 1, 0x9E3779B97F4A7C15
    def fin(z):
        z ^= z >> 30; z = (z * 0xBF58476D1CE4E5B9) & M
        z ^= z >> 27; z = (z * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)
    padded = body + b"\0" * (-len(body) % 8)
    chk = len(body) * G
    for i, (w,) in enumerate(struct.iter_unpack("<Q", padded)):
        chk += fin((w + (i + 1) * G) & M)
    hdr = bytearray(256)
    struct.pack_into("<8sIIIIQQ", hdr, 0, b"TSDCTOK\0", 1, 2, V, 0, n, chk & M)
    with open(path, "wb") as f:
        f.write(bytes(hdr) + body)
EOF
fi

# ---------------------------------------------------------------- (d), (e) interleaved runs
RESULTS="$TMP/results.tsv"   # impl \t ms_step \t tok_s
: >"$RESULTS"
run_c() {
    local out="$TMP/c_$1"
    run ./train_sdc -preset "$PRESET" -train "$SHARD" -B "$B" -seq "$T" -threads "$THREADS" \
        -steps $((WARMUP + STEPS)) -eval_every 0 -quiet -save none -out "$out" >"$TMP/c_$1.stdout"
    python3 - "$out/log.jsonl" "$WARMUP" "$B" "$T" <<'EOF' >>"$RESULTS"
import json, sys
log, warm, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ms = [r["ms"] for r in map(json.loads, open(log)) if r.get("type") == "step" and r["step"] > warm]
m = sum(ms) / len(ms)
print(f"train_sdc\t{m:.3f}\t{B * T / (m / 1000):.1f}")
EOF
    say "train_sdc run $1: $(tail -n 1 "$RESULTS" | cut -f2) ms/step, $(tail -n 1 "$RESULTS" | cut -f3) tokens/s"
}
run_torch() {
    local extra=()
    if [ "$1" = 1 ]; then extra=(--parallel-info); fi
    run "$VENV/bin/python" dev/bench/bench_torch.py --train "$SHARD" --preset "$PRESET" --B "$B" --T "$T" \
        --threads "$THREADS" --warmup "$WARMUP" --steps "$STEPS" "${extra[@]}" >"$TMP/t_$1.json" 2>"$TMP/t_$1.err" \
        || { cat "$TMP/t_$1.err" >&2; say "PyTorch run $1 failed"; return 0; }
    if [ "$1" = 1 ]; then sed 's/^/    /' "$TMP/t_$1.err"; fi
    python3 - "$TMP/t_$1.json" <<'EOF' >>"$RESULTS"
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"pytorch\t{r['ms_step']:.3f}\t{r['tok_s']:.1f}")
EOF
    say "PyTorch   run $1: $(tail -n 1 "$RESULTS" | cut -f2) ms/step, $(tail -n 1 "$RESULTS" | cut -f3) tokens/s"
}

check_quiet before
say "preset $PRESET, fp32, B $B, T $T, $THREADS threads, $WARMUP warm-up + $STEPS timed steps, $REPEATS repeats (interleaved)"
for i in $(seq 1 "$REPEATS"); do
    run_c "$i"
    if [ "$HAVE_TORCH" = 1 ]; then run_torch "$i"; fi
done

check_quiet after

# ---------------------------------------------------------------- (f) the table
python3 - "$RESULTS" "$PRESET" "$B" "$T" "$THREADS" "$REPEATS" <<'EOF'
import sys
path, preset, B, T, thr, rep = sys.argv[1:]
best = {}
for line in open(path):
    impl, ms, tok = line.rstrip("\n").split("\t")
    if impl not in best or float(ms) < best[impl][0]:
        best[impl] = (float(ms), float(tok))
print(f"\n{preset} fp32, B={B} T={T} threads={thr}; best of {rep} runs each (lowest mean ms/step)")
print(f"{'impl':<10} {'tokens/s':>10} {'ms/step':>10}")
for impl in ("train_sdc", "pytorch"):
    if impl in best:
        print(f"{impl:<10} {best[impl][1]:>10.1f} {best[impl][0]:>10.2f}")
if "train_sdc" in best and "pytorch" in best:
    ratio = best["train_sdc"][1] / best["pytorch"][1]
    print(f"ratio train_sdc/PyTorch (tokens/s): {ratio:.3f}  ({'goal met' if ratio >= 1 else 'goal NOT met'}: >= 1)")
else:
    print("ratio train_sdc/PyTorch: n/a (no PyTorch result)")
EOF
