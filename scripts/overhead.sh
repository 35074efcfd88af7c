#!/usr/bin/env bash
# Protection overhead on the CPU, measured side by side in one run: fault-free training steps with
# protection off, each component alone (qk, rgg, exp, att, bwd, qk_bwd, att_bwd, ew, bound), the paper's method (paper =
# qk,rgg,exp) and all (qk,rgg,att,bwd,qk_bwd,att_bwd,ew,bound,exp with k chosen at the start), interleaved in rounds so that a change in
# machine load hits every configuration alike. Prints ms/step (median over rounds of the mean over the
# timed steps) and the overhead against "none".
#
#   scripts/overhead.sh [--preset tiny-llama] [--steps 100] [--rounds 2] [--threads N] [--precision bf16]
#                       [--B 4] [--accum 3] [--T 128]
#
# The Residual Gain Guard needs a calibration: one clean calibration run of 70 steps comes first (not
# timed). Token data: a random-token shard (the speed does not depend on the text).
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=tiny-llama
STEPS=100
ROUNDS=2
THREADS=$(nproc)
PRECISION=bf16
B=4; ACCUM=3; T=128
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) PRESET="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --B) B="$2"; shift 2 ;;
    --accum) ACCUM="$2"; shift 2 ;;
    --T) T="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 1 ;;
  esac
done
make -s train_sdc venv
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
.venv/bin/python - "$WORK" <<'PY'
import sys, numpy as np
sys.path.insert(0, "dev")
import tsdc_io
rng = np.random.default_rng(0)
tsdc_io.write_shard(f"{sys.argv[1]}/train.bin", rng.integers(0, 8192, 2_000_000), 8192)
PY
COMMON=(-preset "$PRESET" -train "$WORK/train.bin" -B "$B" -accum "$ACCUM" -seq "$T" -lr 1e-3 -warmup 10
        -precision "$PRECISION" -eval_every 0 -threads "$THREADS" -quiet)
echo "== calibration (70 clean steps, not timed)"
./train_sdc "${COMMON[@]}" -steps 70 -out "$WORK/cal" -rgg_calibrate "$WORK/rgg.cal" | grep calibration
# Each step's CPU time (all threads of the process, as the trainer logs it: cpu_ms) is measured besides its wall time: with
# OMP_WAIT_POLICY=passive (set here unless given) idle threads sleep instead of spinning, so the CPU time
# is the work done and stays meaningful on a loaded machine, where wall times are not.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
.venv/bin/python - "$WORK" "$ROUNDS" "$STEPS" "$PRESET" "$B" "$ACCUM" "$T" "$THREADS" "$PRECISION" -- "${COMMON[@]}" <<'PY'
import json, os, statistics, subprocess, sys
work, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
preset, B, A, T, threads, prec = sys.argv[4:10]
common = sys.argv[sys.argv.index("--") + 1:]
configs = ["none", "qk", "rgg", "exp", "att", "bwd", "qk_bwd", "att_bwd", "ew", "bound", "paper", "all"]
res = {c: [] for c in configs}
for r in range(1, rounds + 1):
    for c in configs:
        extra = ["-protect", c] + (["-rgg_calibration", f"{work}/rgg.cal"] if set(c.split(",")) & {"rgg", "paper", "all"} else [])
        print(f"== round {r}/{rounds}: -protect {c}, {steps} steps", flush=True)
        subprocess.run(["./train_sdc", *common, "-steps", str(steps), "-save", "none", "-out", f"{work}/{c}.{r}", *extra],
                       check=True, stdout=subprocess.DEVNULL)
        st = [json.loads(l) for l in open(f"{work}/{c}.{r}/log.jsonl") if '"type":"step"' in l]
        st = st[5:]                                     # the first 5 steps are warm-up
        # wall and CPU time (all threads) of each step, as the trainer logs them
        res[c].append((sum(x["ms"] for x in st) / len(st), sum(x["cpu_ms"] for x in st) / len(st), sum(x["alarms"] for x in st)))
print(f"\n{preset}, B {B} x accum {A} x T {T}, {prec}, {threads} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; "
      f"median over {rounds} interleaved rounds")
print("| -protect | wall ms/step | overhead % (wall) | CPU ms/step | overhead % (CPU) | alarms (fault-free) |")
print("|---|---|---|---|---|---|")
base_w = statistics.median(x[0] for x in res["none"])
base_c = statistics.median(x[1] for x in res["none"])
for c in configs:
    w = statistics.median(x[0] for x in res[c]); cp = statistics.median(x[1] for x in res[c])
    print(f"| {c} | {w:.1f} | {100 * (w / base_w - 1):+.2f} | {cp:.1f} | {100 * (cp / base_c - 1):+.2f} | {sum(x[2] for x in res[c])} |")
PY
