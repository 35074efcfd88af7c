#!/usr/bin/env bash
# scripts/run_multigpu.sh: data-parallel training on the N GPUs of one node: one MPI rank per GPU
# (mpirun -np N), gradients summed with NCCL. Builds and trains as scripts/run_gpu.sh does.
#
#   scripts/run_multigpu.sh N [PRESET] [STEPS] [-- extra train_sdc_cu flags]
#   scripts/run_multigpu.sh 8 llama3.2-1b 2000
#
# N defaults to the number of GPUs nvidia-smi lists. Each rank picks the GPU of its local rank; every
# rank reads its own slice of the step's batch, so the global batch is N x B x ACCUM sequences (a
# checkpoint resumes with any ranks x ACCUM of the same product). Needs train_sdc_cu built with MPI
# and NCCL (make prints "MPI: yes" and "NCCL: yes"; apt-get install openmpi-bin libopenmpi-dev and
# libnccl-dev). All environment variables of scripts/run_gpu.sh apply (DATA, OUT, B, SEQ, ACCUM, LR, ...);
# MPIRUN_ARGS adds mpirun flags; DRY=1 prints the commands.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" =~ ^[0-9]+$ ]]; then N="$1"; shift
else N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
[ "${N:-0}" -ge 1 ] || { echo "run_multigpu: no GPU found; pass N" >&2; exit 2; }
PRESET="${1:-tiny-llama}"
OUT="${OUT:-runs/$PRESET-${N}gpu}"

LAUNCH="mpirun -np $N --bind-to none"
[ "$(id -u)" = 0 ] && LAUNCH="$LAUNCH --allow-run-as-root"
LAUNCH="$LAUNCH ${MPIRUN_ARGS:-}"
echo "== $N ranks on this node: $LAUNCH"
LAUNCH="$LAUNCH" OUT="$OUT" exec scripts/run_gpu.sh "$@"
