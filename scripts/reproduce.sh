#!/usr/bin/env bash
# The reproduction of the paper's evaluation (Section 5, Appendix A.2-A.3): baselines, TrainSDC, the
# ablation, the alpha sweep, recall and misses by site, Figure 3 and a Figure 5 analogue, written to a
# report with the paper's numbers beside ours.
#
#   scripts/reproduce.sh --preset tiny|paper [--smoke] [--jobs N] [--window N] [--out DIR] [--dry]
#                        [--train FILE --val FILE]
#
#   tiny    tiny-llama and tiny-qwen3 on the CPU (tinyshakespeare, 8192-token BPE), 2 runs at a time with
#           one thread each; writes REPORT.md and docs/report/*.png (the committed report). About an hour
#           on 2 cores.
#   paper   the paper's settings: llama3.2-1b and qwen3-0.6b with ./train_sdc_cu on 6 GPU ranks (mpirun),
#           checkpoint 1221, end 2035, m = 10 / 1,000 / 100,000; needs --train/--val token shards of the
#           model's tokenizer (dev/data/prepare.py). Never run yet (no GPU here); --dry prints its commands.
#   --smoke the whole pipeline on a toy scale (tiny-llama, 12-step window; under 5 minutes; in CI)
#   --reduced   (with --preset tiny) what fits an oversubscribed 2-core machine in about an hour: tiny-llama,
#           m = 10, a 60-step window, Table 1 + -protect all + the lost-step control, Table 2 and the Fault
#           rows in both fault dtypes (bf16 storage, autocast); writes docs/report_tiny_reduced.md
#   --report-only   write the report from the runs finished so far
#
# Runs live under out/reproduce_<preset>/<model>/<run>; an interrupted job resumes where it stopped (a
# finished run is never run again: delete its directory to redo it). Progress and ETA on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
PRESET=tiny
ARGS=()
TRAIN=""; VAL=""; SMOKE=0; DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) PRESET="$2"; shift 2 ;;
    --smoke) SMOKE=1; ARGS+=(--smoke); shift ;;
    --reduced) ARGS+=(--reduced); shift ;;
    --report-only) ARGS+=(--report-only); shift ;;
    --jobs|--window|--out) ARGS+=("$1" "$2"); shift 2 ;;
    --train) TRAIN="$2"; shift 2 ;;
    --val) VAL="$2"; shift 2 ;;
    --dry) DRY=1; ARGS+=(--dry); shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 1 ;;
  esac
done
case "$PRESET" in tiny|paper) ;; *) echo "error: --preset must be tiny or paper (got '$PRESET')" >&2; exit 1 ;; esac
PY=.venv/bin/python
if [ "$PRESET" = paper ] && [ "$SMOKE" = 0 ]; then
  if [ -z "$TRAIN" ] || [ -z "$VAL" ]; then
    if [ "$DRY" = 1 ]; then TRAIN=${TRAIN:-data/paper/train.bin}; VAL=${VAL:-data/paper/val.bin}
    else echo "error: --preset paper needs --train and --val (token shards of the model's tokenizer)" >&2; exit 1; fi
  fi
  [ "$DRY" = 1 ] || make -s train_sdc_cu venv
else
  make -s train_sdc venv
  if [ -z "$TRAIN" ]; then
    DATA=data/tinyshakespeare
    if [ ! -f "$DATA/meta.json" ]; then
      INPUT=""
      [ -f ../shared/data/tinyshakespeare.txt ] && INPUT=../shared/data/tinyshakespeare.txt
      $PY dev/data/tinyshakespeare.py ${INPUT:+--input "$INPUT"} --out "$DATA"
    fi
    TRAIN=$DATA/train.bin; VAL=$DATA/val.bin
  fi
fi
[ -n "$VAL" ] || { echo "error: --train needs --val too" >&2; exit 1; }
REPORT=()
if [ "$PRESET" = tiny ] && [ "$SMOKE" = 0 ]; then
  REPORT=(--report REPORT.md --report-dir docs/report)
  if printf '%s\n' "${ARGS[@]}" | grep -qx -- --reduced; then REPORT=(--report docs/report_tiny_reduced.md --report-dir docs/report_reduced); fi
fi
MACHINE="$(nproc) cores, $(uname -m)"
PYBIN=$PY
[ -x "$PY" ] || PYBIN=python3
exec $PYBIN scripts/reproduce.py --preset "$PRESET" --train "$TRAIN" --val "$VAL" "${REPORT[@]}" "${ARGS[@]}" \
  --machine "$MACHINE" --args-line "scripts/reproduce.sh --preset $PRESET$([ $SMOKE = 1 ] && echo ' --smoke')"
