#!/usr/bin/env bash
# Protection overhead on the CPU, measured side by side in one run: fault-free training steps with
# protection off, each component alone (qk, rgg, exp) and all, interleaved in rounds so that a change in
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
CONFIGS=(none qk rgg exp all)
for r in $(seq 1 "$ROUNDS"); do
  for c in "${CONFIGS[@]}"; do
    extra=(-protect "$c")
    case "$c" in rgg|all) extra+=(-rgg_calibration "$WORK/rgg.cal") ;; esac
    echo "== round $r/$ROUNDS: -protect $c, $STEPS steps"
    ./train_sdc "${COMMON[@]}" -steps "$STEPS" -out "$WORK/$c.$r" "${extra[@]}" > /dev/null
  done
done
.venv/bin/python - "$WORK" "$ROUNDS" "$PRESET" "$B" "$ACCUM" "$T" "$THREADS" "$PRECISION" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def mean_ms(d):
    st = [json.loads(l) for l in open(f"{d}/log.jsonl") if '"type":"step"' in l]
    ms = [r["ms"] for r in st[5:]]             # the first 5 steps are warm-up
    alarms = sum(r["alarms"] for r in st)
    return sum(ms) / len(ms), alarms
res = {}
for c in ("none", "qk", "rgg", "exp", "all"):
    runs = [mean_ms(f"{work}/{c}.{r}") for r in range(1, rounds + 1)]
    res[c] = (statistics.median(m for m, _ in runs), sum(a for _, a in runs))
print(f"\n{sys.argv[3]}, B {sys.argv[4]} x accum {sys.argv[5]} x T {sys.argv[6]}, {sys.argv[8]}, {sys.argv[7]} threads; "
      f"median over {rounds} interleaved rounds of the mean step time (first 5 steps skipped)")
print("| -protect | ms/step | overhead % | alarms (fault-free) |")
print("|---|---|---|---|")
base = res["none"][0]
for c, (m, a) in res.items():
    print(f"| {c} | {m:.1f} | {100 * (m / base - 1):+.2f} | {a} |")
PY
