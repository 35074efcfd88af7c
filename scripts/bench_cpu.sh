#!/usr/bin/env bash
# scripts/bench_cpu.sh: CPU training-speed benchmark, train_sdc against PyTorch, side by side in one run.
#
# Trains the same model with ./train_sdc and with the HF model in PyTorch (dev/bench/bench_torch.py),
# same threads, batch B, sequence length T and token shard, and prints tokens/s and ms/step of each and
# the ratio train_sdc / PyTorch.
#
#   scripts/bench_cpu.sh [--preset tiny-llama|tiny-qwen3] [--wide] [--precision fp32|bf16]
#                        [--B 8] [--T 128] [--threads N] [--warmup 3] [--steps 10] [--repeats 2]
#                        [--data DIR]
#   scripts/bench_cpu.sh --table [--repeats 2] [--out FILE]
#
# --wide: the SmolLM2-135M width (d 576, 9 / 3 heads of 64, ffn 1536) at 4 layers and vocabulary 8192,
# B 4 x T 256 unless given (train_sdc -preset smollm2-135m -n_layer 4 -vocab 8192; PyTorch's
# LlamaForCausalLM at the same shape). --precision bf16: train_sdc -precision bf16 against PyTorch
# under torch.autocast bf16. --table: every goal row (fp32 tiny-llama, tiny-qwen3 and the wide row at 1
# and 2 threads; the wide row in bf16 at 1 and 2 threads), then a markdown table headed by the CPU's
# model, its flags, the GEMM paths train_sdc chose and ./bench_gemm's GEMM efficiency against the core's
# measured FMA peak; --out FILE also writes the table there. Goals: fp32 >= 1.3 x PyTorch, bf16 >= 1.0.
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

PRESET=tiny-llama; B=""; T=""; THREADS="$(nproc)"; WARMUP=3; STEPS=10; REPEATS=2; DATA=""
WIDE=0; PRECISION=fp32; TABLE=0; OUTFILE=""
usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; }
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
        --wide) WIDE=1; shift ;;
        --precision) PRECISION="$2"; shift 2 ;;
        --table) TABLE=1; shift ;;
        --out) OUTFILE="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_cpu: unknown argument '$1' (--help for the flags)" >&2; exit 2 ;;
    esac
done
case "$PRESET" in
    tiny-llama|tiny-qwen3) ;;
    *) echo "bench_cpu: --preset must be tiny-llama or tiny-qwen3 (the presets with an HF model; --wide for the SmolLM2 width)" >&2; exit 2 ;;
esac
case "$PRECISION" in fp32|bf16) ;; *) echo "bench_cpu: --precision must be fp32 or bf16" >&2; exit 2 ;; esac
if [ "$WIDE" = 1 ]; then PRESET=smollm2-135m; B="${B:-4}"; T="${T:-256}"; fi
B="${B:-8}"; T="${T:-128}"
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
    if [ "$TABLE" = 1 ]; then NTOK=$(( (WARMUP + STEPS) * 4 * 256 + 1 )); fi
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
# one row: train_sdc and PyTorch at PRESET B T THREADS PRECISION (WIDE adds the -n_layer/-vocab override),
# interleaved --repeats times; appends "impl \t ms \t tok/s" lines to $RESULTS, prints the row's table,
# and leaves the best of each in BEST_C / BEST_T (tokens/s; empty when that side failed)
row() {
    local preset="$1" b="$2" t="$3" thr="$4" prec="$5" wide="$6"
    RESULTS="$TMP/results_${preset}_${thr}_${prec}.tsv"
    : >"$RESULTS"
    local cflags=() tflags=()
    if [ "$wide" = 1 ]; then cflags=(-n_layer 4 -vocab 8192); tflags=(--n-layer 4 --vocab 8192); fi
    local i
    for i in $(seq 1 "$REPEATS"); do
        local out="$TMP/c_$i"
        run ./train_sdc -preset "$preset" "${cflags[@]}" -train "$SHARD" -B "$b" -seq "$t" -threads "$thr" -precision "$prec" \
            -steps $((WARMUP + STEPS)) -eval_every 0 -quiet -save none -force -out "$out" >"$TMP/c_$i.stdout"
        KERNELS="$(sed -n 's/^kernels: //p' "$TMP/c_$i.stdout" | head -n 1)"
        python3 - "$out/log.jsonl" "$WARMUP" "$b" "$t" <<'PYEOF' >>"$RESULTS"
import json, sys
log, warm, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ms = [r["ms"] for r in map(json.loads, open(log)) if r.get("type") == "step" and r["step"] > warm]
m = sum(ms) / len(ms)
print(f"train_sdc\t{m:.3f}\t{B * T / (m / 1000):.1f}")
PYEOF
        say "train_sdc run $i: $(tail -n 1 "$RESULTS" | cut -f2) ms/step, $(tail -n 1 "$RESULTS" | cut -f3) tokens/s"
        if [ "$HAVE_TORCH" = 1 ]; then
            local extra=()
            if [ "$i" = 1 ] && [ "$FIRST_TORCH" = 1 ]; then extra=(--parallel-info); FIRST_TORCH=0; fi
            if run "$VENV/bin/python" dev/bench/bench_torch.py --train "$SHARD" --preset "$preset" "${tflags[@]}" --B "$b" --T "$t" \
                --threads "$thr" --precision "$prec" --warmup "$WARMUP" --steps "$STEPS" "${extra[@]}" >"$TMP/t_$i.json" 2>"$TMP/t_$i.err"; then
                if [ ${#extra[@]} -gt 0 ]; then sed 's/^/    /' "$TMP/t_$i.err"; fi
                python3 - "$TMP/t_$i.json" <<'PYEOF' >>"$RESULTS"
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"pytorch\t{r['ms_step']:.3f}\t{r['tok_s']:.1f}")
PYEOF
                say "PyTorch   run $i: $(tail -n 1 "$RESULTS" | cut -f2) ms/step, $(tail -n 1 "$RESULTS" | cut -f3) tokens/s"
            else
                cat "$TMP/t_$i.err" >&2; say "PyTorch run $i failed"
            fi
        fi
    done
    read -r BEST_C BEST_T < <(python3 - "$RESULTS" <<'PYEOF'
import sys
best = {}
for line in open(sys.argv[1]):
    impl, ms, tok = line.rstrip("\n").split("\t")
    best[impl] = max(best.get(impl, 0.0), float(tok))
print(best.get("train_sdc", "-"), best.get("pytorch", "-"))
PYEOF
)
    local goal=1.3; [ "$prec" = bf16 ] && goal=1.0
    python3 - "$RESULTS" "$preset" "$b" "$t" "$thr" "$REPEATS" "$prec" "$goal" <<'PYEOF'
import sys
path, preset, B, T, thr, rep, prec, goal = sys.argv[1:]
best = {}
for line in open(path):
    impl, ms, tok = line.rstrip("\n").split("\t")
    if impl not in best or float(ms) < best[impl][0]:
        best[impl] = (float(ms), float(tok))
print(f"\n{preset} {prec}, B={B} T={T} threads={thr}; best of {rep} runs each (lowest mean ms/step)")
print(f"{'impl':<10} {'tokens/s':>10} {'ms/step':>10}")
for impl in ("train_sdc", "pytorch"):
    if impl in best:
        print(f"{impl:<10} {best[impl][1]:>10.1f} {best[impl][0]:>10.2f}")
if "train_sdc" in best and "pytorch" in best:
    ratio = best["train_sdc"][1] / best["pytorch"][1]
    print(f"ratio train_sdc/PyTorch (tokens/s): {ratio:.3f}  ({'goal met' if ratio >= float(goal) else 'goal NOT met'}: >= {goal})")
else:
    print("ratio train_sdc/PyTorch: n/a (no PyTorch result)")
PYEOF
}

FIRST_TORCH=1
check_quiet before
if [ "$TABLE" = 0 ]; then
    say "preset $PRESET$([ "$WIDE" = 1 ] && echo ' (wide: 4 layers, vocab 8192)'), $PRECISION, B $B, T $T, $THREADS threads, $WARMUP warm-up + $STEPS timed steps, $REPEATS repeats (interleaved)"
    row "$PRESET" "$B" "$T" "$THREADS" "$PRECISION" "$WIDE"
    check_quiet after
    exit 0
fi

# ---------------------------------------------------------------- --table: every goal row
ROWS="$TMP/rows.tsv"; : >"$ROWS"
for spec in "tiny-llama 8 128 1 fp32 0" "tiny-llama 8 128 2 fp32 0" "tiny-qwen3 8 128 1 fp32 0" "tiny-qwen3 8 128 2 fp32 0" \
            "smollm2-135m 4 256 1 fp32 1" "smollm2-135m 4 256 2 fp32 1" "smollm2-135m 4 256 1 bf16 1" "smollm2-135m 4 256 2 bf16 1"; do
    read -r p b t thr prec wide <<<"$spec"
    say "row: $p B $b T $t, $thr thread(s), $prec$([ "$wide" = 1 ] && echo ', wide')"
    row "$p" "$b" "$t" "$thr" "$prec" "$wide"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "$b" "$t" "$thr" "$prec" "$wide" "$BEST_C" "$BEST_T" "$KERNELS" >>"$ROWS"
done
check_quiet after
run make -s bench_gemm
GEMM1="$TMP/gemm1.txt"; GEMM2="$TMP/gemm2.txt"
./bench_gemm -threads 1 >"$GEMM1"; ./bench_gemm -threads 2 >"$GEMM2"
cat "$GEMM1" "$GEMM2"
TORCHV="n/a"; [ "$HAVE_TORCH" = 1 ] && TORCHV="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
python3 - "$ROWS" "$GEMM1" "$GEMM2" "$TORCHV" "$REPEATS" <<'PYEOF' | tee "$TMP/table.md"
import re, sys
rows, g1, g2, torchv, rep = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
want = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
have = [f for f in want if f in flags]
def gemm_line(path):
    # columns by the header: the fp32 paths, then "bf16 <path>" (the default bf16 path first, then the CPU's bf16
    # unit when the default is not it)
    t = open(path).read()
    peak = re.search(r"FMA peak of one core: ([0-9.]+) GFLOP/s", t).group(1)
    dp = re.search(r"VDPBF16PS peak of one core: ([0-9.]+) GFLOP/s", t)
    cols = re.findall(r"(bf16 \w+|\w+)", re.search(r"^layer\s+I\s+O(.*?)(\(|$)", t, re.M).group(1))
    allrow = re.search(r"^all \(FLOP-weighted\)(.*)$", t, re.M).group(1)
    return peak, dp.group(1) if dp else None, dict(zip(cols, re.findall(r"([0-9]+) GFLOP/s \(\s*([0-9]+)%\)", allrow))), cols
p1, d1, a1, cols = gemm_line(g1); p2, d2, a2, _ = gemm_line(g2)
f32 = [c for c in cols if not c.startswith("bf16")][-1]; bfc = [c for c in cols if c.startswith("bf16")]
print(f"- CPU: {cpu}; flags: {' '.join(have) or 'none of ' + ' '.join(want)}; torch {torchv}")
print(f"- fp32 FMA peak of one core (./bench_gemm, 24 chains of zmm/ymm FMAs): {p1} GFLOP/s"
      + (f"; VDPBF16PS peak {d1} GFLOP/s" if d1 else ""))
print(f"- GEMMs of the wide row (forward + dx + dW, all layers, FLOP-weighted; ./bench_gemm): "
      f"best fp32 path ({f32}) {a1[f32][0]} GFLOP/s = {a1[f32][1]}% of the peak at 1 thread, {a2[f32][0]} GFLOP/s = {a2[f32][1]}% at 2; "
      + "; ".join(f"{c} path {a1[c][0]} / {a2[c][0]} GFLOP/s" + (" (the default)" if i == 0 and len(bfc) > 1 else "")
                  for i, c in enumerate(bfc)))
print()
print("| model, B x T | precision | threads | train_sdc tokens/s | PyTorch tokens/s | ratio | goal |")
print("|---|---|---|---|---|---|---|")
kern = set()
for line in open(rows):
    p, b, t, thr, prec, wide, c, tt, k = (line.rstrip("\n").split("\t") + [""])[:9]
    kern.add(k)
    name = {"smollm2-135m": "SmolLM2 width, 4 layers, vocab 8192"}.get(p, p)
    goal = 1.0 if prec == "bf16" else 1.3
    if c != "-" and tt != "-":
        r = float(c) / float(tt)
        ratio = f"**{r:.2f}**" if r < goal else f"{r:.2f}"
        met = "met" if r >= goal else "not met"
    else:
        ratio, met = "n/a", "n/a"
    print(f"| {name}, {b} x {t} | {prec} | {thr} | {c} | {tt} | {ratio} | >= {goal} {met} |")
print()
print(f"train_sdc kernels: {'; '.join(sorted(k for k in kern if k))}. Best of {rep} interleaved runs each; "
      f"PyTorch: HF LlamaForCausalLM / Qwen3ForCausalLM, SDPA, foreach AdamW, clipping; bf16 rows: torch.autocast.")
PYEOF
if [ -n "$OUTFILE" ]; then cp "$TMP/table.md" "$OUTFILE"; say "table written to $OUTFILE"; fi
