#!/usr/bin/env bash
# The main job (for now): on a fresh machine, set up everything, prepare tinyshakespeare, train
# tiny-llama on it for a few hundred steps on the CPU, evaluate (loss, perplexity, argmax predictions)
# and sample. Resumable: run it again after an interruption and it continues from the last checkpoint.
#
#   scripts/tiny_shakespeare.sh [--steps N] [--ranks R] [--input FILE] [--out DIR] [-- extra train_sdc flags]
#
# --input defaults to ../shared/data/tinyshakespeare.txt when present (else the corpus script
# downloads it); --ranks R > 1 runs R MPI ranks (each with 1 OpenMP thread).
set -euo pipefail
cd "$(dirname "$0")/.."
# idle OpenMP threads sleep instead of spinning: a spinning run sharing its cores with another process
# is many times slower (measured here: 6.2 s vs 0.32 s a step); set OMP_WAIT_POLICY=active to override
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
STEPS=300
RANKS=1
INPUT=""
OUT=out/tiny_shakespeare
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --ranks) RANKS="$2"; shift 2 ;;
    --input) INPUT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 1 ;;
  esac
done
if [ -z "$INPUT" ] && [ -f ../shared/data/tinyshakespeare.txt ]; then INPUT=../shared/data/tinyshakespeare.txt; fi

echo "== build"
make -s train_sdc venv
DATA=data/tinyshakespeare
if [ ! -f "$DATA/meta.json" ]; then
  echo "== prepare $DATA (byte-level BPE, vocab 8192)"
  .venv/bin/python dev/data/tinyshakespeare.py ${INPUT:+--input "$INPUT"} --out "$DATA"
else
  echo "== data: $DATA already prepared"
fi

mkdir -p "$OUT"
RESUME=()
last=$(ls "$OUT"/step_*.ckpt 2>/dev/null | sort | tail -n 1 || true)
if [ -n "$last" ]; then
  if [ "$last" = "$(printf '%s/step_%06d.ckpt' "$OUT" "$STEPS")" ]; then
    echo "== already trained: $last (delete $OUT to start over)"
  fi
  RESUME=(-resume "$last")
  echo "== resuming from $last"
fi

LAUNCH=()
THREADS=()
if [ "$RANKS" -gt 1 ]; then
  LAUNCH=(mpirun -np "$RANKS" --oversubscribe)
  [ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
  THREADS=(-threads 1)
fi
echo "== train tiny-llama for $STEPS steps"
set -x
"${LAUNCH[@]}" ./train_sdc -preset tiny-llama -train "$DATA/train.bin" -val "$DATA/val.bin" \
  -B 8 -seq 128 -steps "$STEPS" -lr 2e-3 -warmup 30 -eval_every 100 -eval_tokens 16384 \
  -ckpt_every 100 -sample_every 0 -sample_len 96 -temp 0.8 -pred_out "$OUT/predictions.bin" \
  -out "$OUT" "${THREADS[@]}" "${RESUME[@]}" "${EXTRA[@]}"
set +x
echo "== sample from the final model"
./train_sdc -preset tiny-llama -val "$DATA/val.bin" -steps 0 -init "$(printf '%s/step_%06d.ckpt' "$OUT" "$STEPS")" \
  -tokenizer "$DATA/tokenizer.bin" -eval_tokens 16384 -sample_every 1 -sample_len 128 -temp 0.8 -out "$OUT/final_eval" -force -quiet
echo "== done: log $OUT/log.jsonl, checkpoints $OUT/step_*.ckpt, predictions $OUT/predictions.bin"
