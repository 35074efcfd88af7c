#!/usr/bin/env bash
# scripts/run_multinode.sh: data-parallel training over several nodes with mpirun and a hostfile, one
# rank per GPU (NCCL across nodes). Builds and trains as scripts/run_gpu.sh does.
#
#   scripts/run_multinode.sh HOSTFILE GPUS_PER_NODE [PRESET] [STEPS] [-- extra train_sdc_cu flags]
#   scripts/run_multinode.sh hosts.txt 8 llama3.2-1b 2000
#
# HOSTFILE is Open MPI's: one line per node, "node01 slots=8". The repository (binary, data, OUT) must
# be at the same path on every node (a shared file system): the build runs once, here, and every rank
# reads DATA and rank 0 writes OUT. Ranks = nodes x GPUS_PER_NODE; each rank uses the GPU of its local
# rank on its node. NCCL picks the network itself; NCCL_SOCKET_IFNAME / NCCL_IB_HCA and friends are
# passed to every rank when set (-x), as are PATH and LD_LIBRARY_PATH. All environment variables of
# scripts/run_gpu.sh apply (DATA, OUT, B, SEQ, ACCUM, LR, ...); MPIRUN_ARGS adds mpirun flags;
# DRY=1 prints the commands.
set -euo pipefail
cd "$(dirname "$0")/.."

HOSTFILE="${1:-}"; GPN="${2:-}"
if [ -z "$HOSTFILE" ] || [ ! -f "$HOSTFILE" ] || ! [[ "$GPN" =~ ^[0-9]+$ ]]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2
fi
shift 2
NODES=$(grep -cvE '^\s*(#|$)' "$HOSTFILE")
N=$((NODES * GPN))
PRESET="${1:-tiny-llama}"
OUT="${OUT:-runs/$PRESET-${N}gpu}"

LAUNCH="mpirun -np $N --hostfile $HOSTFILE --map-by ppr:$GPN:node --bind-to none -x PATH -x LD_LIBRARY_PATH"
for v in $(env | sed -n 's/^\(NCCL_[A-Z_]*\)=.*/\1/p'); do LAUNCH="$LAUNCH -x $v"; done
[ "$(id -u)" = 0 ] && LAUNCH="$LAUNCH --allow-run-as-root"
LAUNCH="$LAUNCH ${MPIRUN_ARGS:-}"
echo "== $NODES nodes x $GPN GPUs = $N ranks: $LAUNCH"
LAUNCH="$LAUNCH" OUT="$OUT" exec scripts/run_gpu.sh "$@"
