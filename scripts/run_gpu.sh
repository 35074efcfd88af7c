#!/usr/bin/env bash
# scripts/run_gpu.sh: build train_sdc_cu and train a preset on one GPU on a prepared dataset.
#
#   scripts/run_gpu.sh [PRESET] [STEPS] [-- extra train_sdc_cu flags]
#   scripts/run_gpu.sh tiny-llama 1000
#   DATA=data/mytext B=4 scripts/run_gpu.sh llama3.2-1b 500 -- -init llama.ckpt -lr 2e-5
#
# PRESET (default tiny-llama): any of train_sdc's presets. STEPS (default 1000): the schedule's length.
# Environment (defaults in brackets):
#   DATA [data/tinyshakespeare]  folder with train.bin and val.bin (dev/data/prepare.py; the token ids must
#                                be below the preset's vocabulary: 8192 for the tiny presets, or pass -vocab).
#                                data/tinyshakespeare is prepared here when missing (needs the venv: network).
#   OUT [runs/PRESET]            log.jsonl, step_NNNNNN.ckpt; an existing run there is resumed from its newest
#                                checkpoint (same flags required, as train_sdc checks)
#   B [8]  SEQ [the preset's]  ACCUM [1]  LR [6e-4 tiny, 3e-4 otherwise]  WARMUP [STEPS/20]
#   EVAL_EVERY [100]  CKPT_EVERY [500]  GPU_ARCH [90: H100/H200; 80: A100]
#   LAUNCH                       command prefix, e.g. "mpirun -np 4" (scripts/run_multigpu.sh sets it)
#   DRY=1                        print the commands instead of running them
set -euo pipefail
cd "$(dirname "$0")/.."

PRESET="${1:-tiny-llama}"; [ $# -gt 0 ] && shift
STEPS="${1:-1000}"; [ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
case "$PRESET" in -*) echo "run_gpu: the first argument is the preset, not a flag (put flags after --)" >&2; exit 2 ;; esac
[[ "$STEPS" =~ ^[0-9]+$ ]] || { echo "run_gpu: STEPS must be a number (got '$STEPS')" >&2; exit 2; }

DATA="${DATA:-data/tinyshakespeare}"
OUT="${OUT:-runs/$PRESET}"
B="${B:-8}"; ACCUM="${ACCUM:-1}"
case "$PRESET" in tiny-*) LR="${LR:-6e-4}" ;; *) LR="${LR:-3e-4}" ;; esac
WARMUP="${WARMUP:-$(( STEPS / 20 > 0 ? STEPS / 20 : 1 ))}"
EVAL_EVERY="${EVAL_EVERY:-100}"; CKPT_EVERY="${CKPT_EVERY:-500}"
SEQ_FLAG=(); [ -n "${SEQ:-}" ] && SEQ_FLAG=(-seq "$SEQ")
read -r -a LAUNCH_CMD <<<"${LAUNCH:-}"
run() { echo "+ $*"; [ "${DRY:-0}" = 1 ] || "$@"; }

# 1. build (make autodetects mpicc and NCCL: both are needed for more than one GPU)
run make -s GPU_ARCH="${GPU_ARCH:-90}" train_sdc_cu

# 2. data
if [ ! -f "$DATA/train.bin" ]; then
    if [ "$DATA" = data/tinyshakespeare ]; then
        echo "== preparing $DATA (byte-level BPE, vocab 8192; needs the Python venv)"
        run make -s venv
        INPUT=(); [ -f ../shared/data/tinyshakespeare.txt ] && INPUT=(--input ../shared/data/tinyshakespeare.txt)
        run .venv/bin/python dev/data/tinyshakespeare.py "${INPUT[@]}" --out "$DATA"
    else
        echo "run_gpu: $DATA/train.bin not found (prepare it with dev/data/prepare.py)" >&2; exit 1
    fi
fi
VAL=(); [ -f "$DATA/val.bin" ] && VAL=(-val "$DATA/val.bin")

# 3. resume from the newest checkpoint of OUT, if any
RESUME=()
last=$(ls "$OUT"/step_*.ckpt 2>/dev/null | sort | tail -n 1 || true)
if [ -n "$last" ]; then RESUME=(-resume "$last"); echo "== resuming from $last"
elif [ -f "$OUT/log.jsonl" ]; then RESUME=(-force); echo "== $OUT holds a log but no checkpoint: nothing to resume, starting over (-force)"; fi

# 4. train
run "${LAUNCH_CMD[@]}" ./train_sdc_cu -preset "$PRESET" -train "$DATA/train.bin" "${VAL[@]}" "${SEQ_FLAG[@]}" \
    -B "$B" -accum "$ACCUM" -steps "$STEPS" -lr "$LR" -warmup "$WARMUP" -eval_every "$EVAL_EVERY" \
    -ckpt_every "$CKPT_EVERY" -out "$OUT" "${RESUME[@]}" "${EXTRA[@]}"
echo "== done: $OUT/log.jsonl, checkpoints $OUT/step_*.ckpt"
