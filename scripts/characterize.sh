#!/usr/bin/env bash
# characterize.sh: the paper's fault characterisation (TrainSDC Section 3: Experiment 1, training
# vulnerability of every forward and backward site, one at a time; Experiment 2, propagation trace of
# the forward sites; Figure 1; the Figure 4 variants by flags) for a Llama-family and a nanochat-family
# model. Ends with figures in the layout of Figure 1 (a)-(f) and OUT/results.md (every number and the
# exact commands).
#
#   scripts/characterize.sh [--preset tiny|paper] [--smoke] [--out DIR] [--dry] [options]
#
# The protocol (both presets): one clean run trains each model from scratch (or from --*-init) to the
# common checkpoint at step C (the paper: 1221 of 2035 for SmolLM2, 954 of 1907 for nanochat); every
# other run resumes from that checkpoint with -resume and trains to step S:
#   clean            the fault-free reference (-pred_out for Top-1)
#   clean_pK ...     clean-envelope repeats, -perturb +K, -K, +2K, ... (K fp32 ulps of the first element
#                    of every weight matrix; bf16 ulps under bf16): they differ from `clean` by rounding only
#                    and give E_final / E_max (the trainer is otherwise bitwise deterministic)
#   fwd_SITE         -fault_mode char at one forward site (module output), one layer, rank 0, in steps
#                    C+1..S with probability --rate each, --m elements x 4 bits an event; its
#                    propagation trace (-trace_out, Experiment 2) comes from the same run
#   bwd_SITE         the same on the gradient dL/dx of that output
# All sites of a run share the fault schedule and the element/bit selection (-fault_seed).
#
# --preset tiny (CPU, ./train_sdc, fp32, both models on tinyshakespeare, BPE vocab 8192):
#   paper                                   tiny (this script)                 why
#   SmolLM2-135M (30 layers), layer 20      tiny-llama (4 layers), layer 2     20 of 0..29 = 69% deep; 0.69 x 3 = 2.1
#   nanochat-d12 (12 layers), layer 5       tiny-nanochat (4 layers), layer 1  5 of 0..11 = 45% deep; 0.45 x 3 = 1.4
#   2035 steps, checkpoint 1221 (60%)       S = 500 steps, C = 300 (60%)       the same fraction, both models
#   (nanochat: 1907, checkpoint 954)          (nanochat too: 300 of 500)        (nanochat's 50% would cost more)
#   6 ranks x 8 microbatches of 1 x 1024    1 rank x 8 microbatches of 1 x 128  the event hits one 1-sequence
#                                                                              microbatch, as in the paper
#   1% of 814 steps = ~8 events a run       rate 0.04 of 200 steps = 8 expected (seed 1234: 10 events, at
#                                                                              steps 307 314 332 359 402 443 445
#                                                                              466 469 475, the same in every run)
#   m = 100,000 elements, 4 bits            m = 10 elements, 4 bits            see below
#   Figure 4: rate 0.1%                     --rate 0.004 (the same 1/10)
#   Figure 4: layer 10                      --layer 1 (10 of 0..29 = 34%; 0.34 x 3 = 1.0)
#   Figure 4: 1% of each tensor             --frac 0.01
#   lr 5e-5 (pretrained continuation)       lr 2e-3, warmup 30 (from scratch, as tiny_shakespeare.sh)
#   repeated clean runs (GPU rounding)      3 repeats, -perturb 65536, -65536, 131072: 4 clean runs, 6 pairs
#                                           (65536 fp32 ulps = one bf16 ulp of the first element of every
#                                           matrix; with -perturb 1, -1, 2 the fp32 trainer ends 200 steps
#                                           later with a bit-identical final loss: E_final = 0, D/E = inf)
#   held-out 614,400 positions              16,384 positions of val.bin
# Why m = 10 and not the same fraction of the tensor (100,000 / (1024 x 576) = 17% -> 2,778 of the tiny
# 1 x 128 x 128 residual tensor): a 4-bit flip in fp32 (or bf16) turns an element in [1, 2) into Inf/NaN
# with probability ~5.6% and 12% of elements into ~1e38. Measured on tiny-llama (layer 2, 12 events a
# site, forward): at m = 100, 2-11 of 12 events inject a non-finite value directly and 2-12 of the 12
# updates are skipped (found_inf); at m = 2,778 every event of every site (forward and backward) ends
# in a skipped update and all sites give bit-identical runs (the characterisation degenerates into
# "which steps were skipped"). m = 10, the paper's smallest campaign budget, keeps most events finite.
# The paper-mapped budget is one flag away: --m 2778 (or --frac 0.17).
# The whole tiny preset: 2 prefixes of 300 steps, then 2 models x (36 fault runs + 4 clean runs) x 200
# steps: measured 49 minutes (2,928 s) on this project's 2 shared cores with --jobs 2 (docs/characterization.md).
#
# --preset paper (GPU, ./train_sdc_cu, bf16 AMP): smollm2-135m at layer 20 over steps 1222-2035 and
# nanochat-d12 at layer 5 over steps 955-1907, 100,000 elements at 1% of steps, rank 0, 1 x 1024-token
# microbatches, 48 a step (-accum 48/--ranks), lr 5e-5, warmup 100, held-out 614,400 positions;
# --llama-data DIR / --nanochat-data DIR (train.bin, val.bin of each model's tokenizer) are required,
# --llama-init / --nanochat-init CKPT start from imported weights (dev/reference/hf_to_ckpt.py).
# An interrupted run is run again from the common checkpoint (a run that holds a checkpoint of its own,
# e.g. made with -ckpt_every, resumes from it). Use --dry to print the commands.
#
# --smoke: a tiny subset (3 sites, forward and backward, steps 21-30, 1 clean repeat, small eval) for
# CI (tests/test_characterize.py), well under 3 minutes.
#
# Options:
#   --out DIR            output directory (default runs/characterize/PRESET[-smoke])
#   --dry                print the commands, run nothing
#   --rate X             fault-step rate (tiny 0.04, paper 0.01)
#   --layer L            layer to inject, both models (tiny 2 / 1, paper 20 / 5)
#   --m N                elements an event (tiny 10, paper 100000)
#   --frac F             corrupt round(F x tensor size) elements instead of --m
#   --bits K             bits flipped an element (4)
#   --seed N             fault seed (1234)
#   --models LIST        llama,nanochat (default both)
#   --passes LIST        fwd,bwd (default both)
#   --sites LIST         comma-separated sites (default every site the model has)
#   --repeats N          clean-envelope repeats besides the reference (tiny 3, smoke 1, paper 3)
#   --perturb K          the repeats use -perturb +K, -K, +2K, -2K, ... (tiny 65536, paper 1: one bf16 ulp)
#   --steps S --common-step C   override the schedule (both models)
#   --jobs J             runs at a time (tiny 2, paper 1); --threads N OpenMP threads a run (tiny 1)
#   --ranks R            MPI ranks a run (paper preset; -accum 48/R keeps 48 microbatches a step)
#   --trainer BIN        the trainer binary (default ./train_sdc, paper ./train_sdc_cu)
#   --data DIR           tiny: the prepared data (default data/tinyshakespeare)
#   --llama-data DIR --nanochat-data DIR --llama-init CKPT --nanochat-init CKPT   (paper)
#   --eval-tokens N      held-out positions
#   --keep-ckpt          keep every run's final checkpoint (default: W_L2 is computed after each run,
#                        then the faulty runs' checkpoints are deleted; prefix and clean are kept)
#   --no-report          run only, no figures/table
#   --python PY          Python with numpy and matplotlib (default .venv/bin/python, made by `make venv`;
#                        or $PYTHON)
#
# Figure 4 of the paper (SmolLM2 forward sites only) is:
#   scripts/characterize.sh --models llama --passes fwd --rate 0.004 --out runs/char-rate   (tiny; paper: --rate 0.001)
#   scripts/characterize.sh --models llama --passes fwd --layer 1 --out runs/char-layer    (tiny; paper: --layer 10)
#   scripts/characterize.sh --models llama --passes fwd --frac 0.01 --out runs/char-frac
#
# Resumable: a run whose log ends with its "end" record (and whose post-processing is done) is skipped
# when the script is run again with the same settings; a run made with other settings is an error (use
# another --out). Output: OUT/<model>/<run>/ (log.jsonl, faults.jsonl, trace.jsonl, predictions.bin,
# stdout.txt, cmd), OUT/results.md, OUT/results.json, OUT/fig1a.png ... fig1f.png, OUT/figure1.png.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/reap.sh

PRESET=tiny SMOKE=0 OUT="" DRY=0 RATE="" LAYER="" M="" FRAC="" BITS=4 SEED=1234 MODELS="llama,nanochat"
PASSES="fwd,bwd" SITES="" REPEATS="" PERTURB="" STEPS="" COMMON="" JOBS="" THREADS="" RANKS=1 TRAINER="" DATA=""
LLAMA_DATA="" NANOCHAT_DATA="" LLAMA_INIT="" NANOCHAT_INIT="" EVAL_TOKENS="" KEEP_CKPT=0 REPORT=1
PY="${PYTHON:-}"
need() { [ $# -ge 2 ] && [ -n "$2" ] || { echo "error: option $1 needs a value" >&2; exit 1; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) need "$@"; PRESET="$2"; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --out) need "$@"; OUT="$2"; shift 2 ;;
    --dry) DRY=1; shift ;;
    --rate) need "$@"; RATE="$2"; shift 2 ;;
    --layer) need "$@"; LAYER="$2"; shift 2 ;;
    --m) need "$@"; M="$2"; shift 2 ;;
    --frac) need "$@"; FRAC="$2"; shift 2 ;;
    --bits) need "$@"; BITS="$2"; shift 2 ;;
    --seed) need "$@"; SEED="$2"; shift 2 ;;
    --models) need "$@"; MODELS="$2"; shift 2 ;;
    --passes) need "$@"; PASSES="$2"; shift 2 ;;
    --sites) need "$@"; SITES="$2"; shift 2 ;;
    --repeats) need "$@"; REPEATS="$2"; shift 2 ;;
    --perturb) need "$@"; PERTURB="$2"; shift 2 ;;
    --steps) need "$@"; STEPS="$2"; shift 2 ;;
    --common-step) need "$@"; COMMON="$2"; shift 2 ;;
    --jobs) need "$@"; JOBS="$2"; shift 2 ;;
    --threads) need "$@"; THREADS="$2"; shift 2 ;;
    --ranks) need "$@"; RANKS="$2"; shift 2 ;;
    --trainer) need "$@"; TRAINER="$2"; shift 2 ;;
    --data) need "$@"; DATA="$2"; shift 2 ;;
    --llama-data) need "$@"; LLAMA_DATA="$2"; shift 2 ;;
    --nanochat-data) need "$@"; NANOCHAT_DATA="$2"; shift 2 ;;
    --llama-init) need "$@"; LLAMA_INIT="$2"; shift 2 ;;
    --nanochat-init) need "$@"; NANOCHAT_INIT="$2"; shift 2 ;;
    --eval-tokens) need "$@"; EVAL_TOKENS="$2"; shift 2 ;;
    --keep-ckpt) KEEP_CKPT=1; shift ;;
    --no-report) REPORT=0; shift ;;
    --python) need "$@"; PY="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 1 ;;
  esac
done

int_re='^[0-9]+$'
num_re='^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$'
check_int() { [[ "$2" =~ $int_re ]] || { echo "error: $1 must be a non-negative integer, got '$2'" >&2; exit 1; }; }
check_num() { [[ "$2" =~ $num_re ]] || { echo "error: $1 must be a number, got '$2'" >&2; exit 1; }; }

# ------------------------------------------------------------------ the presets
# per model slot: preset, layer, S (total steps), C (common checkpoint), data dir, init checkpoint
case "$PRESET" in
  tiny)
    TRAINER=${TRAINER:-./train_sdc}
    A_PRESET=tiny-llama A_LAYER=2 N_PRESET=tiny-nanochat N_LAYER=1
    A_S=500 A_C=300 N_S=500 N_C=300
    D_RATE=0.04 D_M=10 D_REPEATS=3 D_PERTURB=65536 D_JOBS=2 D_THREADS=1
    MB_B=1 ACCUM=8 SEQ=128 LR=2e-3 WARMUP=30 D_EVAL=16384 CKPT_EVERY=0
    DATA=${DATA:-data/tinyshakespeare}
    A_DATA=$DATA N_DATA=$DATA
    if [ "$SMOKE" = 1 ]; then
      A_S=30 A_C=20 N_S=30 N_C=20 D_RATE=0.3 D_REPEATS=1 D_EVAL=2048
      SITES=${SITES:-q_proj,v_proj,block_out}
    fi
    ;;
  paper)
    TRAINER=${TRAINER:-./train_sdc_cu}
    A_PRESET=smollm2-135m A_LAYER=20 N_PRESET=nanochat-d12 N_LAYER=5
    A_S=2035 A_C=1221 N_S=1907 N_C=954
    D_RATE=0.01 D_M=100000 D_REPEATS=3 D_PERTURB=1 D_JOBS=1 D_THREADS=""
    check_int --ranks "$RANKS"
    if [ "$RANKS" -lt 1 ] || [ $((48 % RANKS)) -ne 0 ]; then echo "error: --ranks must divide 48" >&2; exit 1; fi
    MB_B=1 ACCUM=$((48 / RANKS)) SEQ=1024 LR=5e-5 WARMUP=100 D_EVAL=614400 CKPT_EVERY=0
    A_DATA=${LLAMA_DATA:-${DATA}} N_DATA=${NANOCHAT_DATA:-${DATA}}
    if [ "$SMOKE" = 1 ]; then echo "error: --smoke is for --preset tiny" >&2; exit 1; fi
    ;;
  *) echo "error: --preset must be tiny or paper, got '$PRESET'" >&2; exit 1 ;;
esac
A_INIT=$LLAMA_INIT N_INIT=$NANOCHAT_INIT
RATE=${RATE:-$D_RATE}; REPEATS=${REPEATS:-$D_REPEATS}; PERTURB=${PERTURB:-$D_PERTURB}; JOBS=${JOBS:-$D_JOBS}; THREADS=${THREADS:-$D_THREADS}
EVAL_TOKENS=${EVAL_TOKENS:-$D_EVAL}
[ -n "$M" ] || M=$D_M
[ -n "$STEPS" ] && { check_int --steps "$STEPS"; A_S=$STEPS; N_S=$STEPS; }
[ -n "$COMMON" ] && { check_int --common-step "$COMMON"; A_C=$COMMON; N_C=$COMMON; }
[ -n "$LAYER" ] && { check_int --layer "$LAYER"; A_LAYER=$LAYER; N_LAYER=$LAYER; }
check_num --rate "$RATE"; check_int --m "$M"; check_int --bits "$BITS"; check_int --seed "$SEED"
check_int --repeats "$REPEATS"; check_int --perturb "$PERTURB"; check_int --jobs "$JOBS"; check_int --eval-tokens "$EVAL_TOKENS"
[ -n "$FRAC" ] && check_num --frac "$FRAC"
[ -n "$THREADS" ] && check_int --threads "$THREADS"
[ "$JOBS" -ge 1 ] || { echo "error: --jobs must be >= 1" >&2; exit 1; }
for s in "$A_S:$A_C" "$N_S:$N_C"; do
  [ "${s#*:}" -ge 1 ] && [ "${s#*:}" -lt "${s%:*}" ] || { echo "error: the common checkpoint step must lie in [1, steps): got ${s#*:} of ${s%:*}" >&2; exit 1; }
done
OUT=${OUT:-runs/characterize/$PRESET$([ "$SMOKE" = 1 ] && echo -smoke || true)}
case "$OUT" in *[[:space:]]*) echo "error: --out must not contain spaces" >&2; exit 1 ;; esac

ALL_SITES="attn_norm q_proj k_proj v_proj q_norm k_norm q_rope k_rope att_logits att_probs att_out o_proj attn_residual mlp_norm gate_proj up_proj act mlp_product down_proj block_out"
# the sites a preset has (llmc/sdc/fault.h site_exists): QK norm in qwen3 and nanochat; SwiGLU's up_proj
# and mlp_product not in nanochat (ReLU^2)
sites_for() {
  local preset=$1 out="" s
  for s in $ALL_SITES; do
    case "$s" in
      q_norm|k_norm) case "$preset" in *qwen3*|*nanochat*) ;; *) continue ;; esac ;;
      up_proj|mlp_product) case "$preset" in *nanochat*) continue ;; esac ;;
    esac
    if [ -n "$SITES" ]; then case ",$SITES," in *",$s,"*) ;; *) continue ;; esac; fi
    out="$out $s"
  done
  echo "$out"
}
if [ -n "$SITES" ]; then
  for s in ${SITES//,/ }; do
    case " $ALL_SITES " in *" $s "*) ;; *) echo "error: --sites: unknown site '$s' (sites: $ALL_SITES)" >&2; exit 1 ;; esac
  done
fi
for p in ${PASSES//,/ }; do case "$p" in fwd|bwd) ;; *) echo "error: --passes takes fwd,bwd; got '$p'" >&2; exit 1 ;; esac; done
SLOTS=()
for m in ${MODELS//,/ }; do case "$m" in llama) SLOTS+=(A) ;; nanochat) SLOTS+=(N) ;; *) echo "error: --models takes llama,nanochat; got '$m'" >&2; exit 1 ;; esac; done
[ ${#SLOTS[@]} -gt 0 ] || { echo "error: --models is empty" >&2; exit 1; }

# ------------------------------------------------------------------ set-up
if [ "$DRY" = 0 ]; then
  if [ "$PRESET" = tiny ]; then make -s train_sdc; else make -s train_sdc_cu; fi
  [ -x "$TRAINER" ] || { echo "error: $TRAINER: no such trainer binary (make it first)" >&2; exit 1; }
  if [ -z "$PY" ]; then make -s venv; PY=.venv/bin/python; fi
  if [ "$REPORT" = 1 ]; then
    "$PY" -c "import numpy, matplotlib" 2>/dev/null ||
      { echo "error: $PY lacks numpy or matplotlib (pip install -r requirements.txt, or --python PY)" >&2; exit 1; }
  fi
  if [ "$PRESET" = tiny ] && [ ! -f "$DATA/meta.json" ]; then
    echo "== prepare $DATA (tinyshakespeare, byte-level BPE, vocab 8192)"
    INPUT=""; [ -f ../shared/data/tinyshakespeare.txt ] && INPUT=../shared/data/tinyshakespeare.txt
    "$PY" dev/data/tinyshakespeare.py ${INPUT:+--input "$INPUT"} --out "$DATA"
  fi
  for slot in "${SLOTS[@]}"; do
    d=${slot}_DATA; d=${!d}
    if [ -z "$d" ] || [ ! -f "$d/train.bin" ] || [ ! -f "$d/val.bin" ]; then
      mn=$([ "$slot" = A ] && echo llama || echo nanochat)
      echo "error: data of the $mn model: '$d' has no train.bin and val.bin (--$mn-data DIR)" >&2; exit 1
    fi
  done
  mkdir -p "$OUT"
fi
PY=${PY:-.venv/bin/python}

# ------------------------------------------------------------------ the runs
# one entry a run: name, dir, kind, target step, first step, the command (printf %q), post-processing
R_NAME=() R_DIR=() R_KIND=() R_TARGET=() R_FROM=() R_CMD=() R_CLEAN=() R_PHASE=()
q() { printf '%q ' "$@"; }
LAUNCH=()
if [ "$RANKS" -gt 1 ]; then
  LAUNCH=(mpirun -np "$RANKS" --oversubscribe)
  [ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
fi
PLAN_ROWS=()
for slot in "${SLOTS[@]}"; do
  v=${slot}_PRESET; P=${!v}; v=${slot}_LAYER; L=${!v}; v=${slot}_S; S=${!v}; v=${slot}_C; C=${!v}
  v=${slot}_DATA; D=${!v}; v=${slot}_INIT; INIT=${!v}
  model=$([ "$slot" = A ] && echo llama || echo nanochat)
  MD="$OUT/$model"
  base=("${LAUNCH[@]}" "$TRAINER" -preset "$P" -train "$D/train.bin" -val "$D/val.bin" -B "$MB_B" -accum "$ACCUM"
        -seq "$SEQ" -steps "$S" -lr "$LR" -warmup "$WARMUP" -eval_every 0 -eval_tokens "$EVAL_TOKENS" -quiet)
  [ -n "$THREADS" ] && base+=(-threads "$THREADS")
  [ "$CKPT_EVERY" -gt 0 ] && base+=(-ckpt_every "$CKPT_EVERY")
  ck=$(printf '%s/prefix/step_%06d.ckpt' "$MD" "$C")
  add() { # name kind target from phase clean cmd...
    local name=$1 kind=$2 target=$3 from=$4 phase=$5 clean=$6; shift 6
    R_NAME+=("$model/$name"); R_DIR+=("$MD/$name"); R_KIND+=("$kind"); R_TARGET+=("$target"); R_FROM+=("$from")
    R_PHASE+=("$phase"); R_CLEAN+=("$clean"); R_CMD+=("$(q "$@")")
  }
  init=(); [ -n "$INIT" ] && init=(-init "$INIT")
  add prefix prefix "$C" 0 1 "" "${base[@]}" "${init[@]}" -stop_at "$C" -out "$MD/prefix"
  add clean clean "$S" "$C" 2 "" "${base[@]}" -resume "$ck" -pred_out "$MD/clean/predictions.bin" -out "$MD/clean"
  PLAN_ROWS+=("$model	clean	-	-	0	$MD/clean")
  for ((r = 1; r <= REPEATS; r++)); do
    k=$(( (r + 1) / 2 * PERTURB )); [ $((r % 2)) = 0 ] && k=-$k
    nm=clean_$([ "$k" -gt 0 ] && echo p$k || echo m${k#-})
    add "$nm" repeat "$S" "$C" 3 "$MD/clean" "${base[@]}" -resume "$ck" -perturb "$k" -pred_out "$MD/$nm/predictions.bin" -out "$MD/$nm"
    PLAN_ROWS+=("$model	repeat	-	-	$k	$MD/$nm")
  done
  budget=(-fault_m "$M"); [ -n "$FRAC" ] && budget=(-fault_frac "$FRAC")
  for pass in ${PASSES//,/ }; do
    for s in $(sites_for "$P"); do
      nm=${pass}_$s
      tr=(); [ "$pass" = fwd ] && tr=(-trace_out "$MD/$nm/trace.jsonl")
      add "$nm" fault "$S" "$C" 3 "$MD/clean" "${base[@]}" -resume "$ck" -fault_mode char -fault_sites "$s" -fault_pass "$pass" \
        -fault_layer "$L" "${budget[@]}" -fault_bits "$BITS" -fault_rank 0 -fault_rate "$RATE" -fault_start $((C + 1)) \
        -fault_end "$S" -fault_seed "$SEED" "${tr[@]}" -pred_out "$MD/$nm/predictions.bin" -out "$MD/$nm"
      PLAN_ROWS+=("$model	fault	$pass	$s	0	$MD/$nm")
    done
  done
done
N=${#R_NAME[@]}
# interleave the two models in phase 3 so that parallel jobs share the work evenly
ORDER=()
for phase in 1 2; do for ((i = 0; i < N; i++)); do [ "${R_PHASE[$i]}" = "$phase" ] && ORDER+=("$i"); done; done
P3A=() P3B=()
for ((i = 0; i < N; i++)); do
  [ "${R_PHASE[$i]}" = 3 ] || continue
  case "${R_NAME[$i]}" in llama/*) P3A+=("$i") ;; *) P3B+=("$i") ;; esac
done
for ((j = 0; j < ${#P3A[@]} || j < ${#P3B[@]}; j++)); do
  [ $j -lt ${#P3A[@]} ] && ORDER+=("${P3A[$j]}"); [ $j -lt ${#P3B[@]} ] && ORDER+=("${P3B[$j]}")
done

REPORT_CMD=("$PY" scripts/characterize.py report --out "$OUT")
if [ "$DRY" = 1 ]; then
  echo "# characterize.sh --preset $PRESET$([ "$SMOKE" = 1 ] && echo ' --smoke' || true): $N runs (in this order; phases 1-2 before 3)"
  for i in "${ORDER[@]}"; do echo "${R_CMD[$i]}"; done
  echo "$(q "${REPORT_CMD[@]}")"
  exit 0
fi

# the settings and the plan, for the report
{
  echo "preset=$PRESET"; echo "smoke=$SMOKE"; echo "trainer=$TRAINER"; echo "rate=$RATE"; echo "m=$M"; echo "frac=$FRAC"
  echo "bits=$BITS"; echo "seed=$SEED"; echo "repeats=$REPEATS"; echo "perturb=$PERTURB"; echo "B=$MB_B"; echo "accum=$ACCUM"; echo "seq=$SEQ"
  echo "lr=$LR"; echo "warmup=$WARMUP"; echo "eval_tokens=$EVAL_TOKENS"; echo "ranks=$RANKS"; echo "jobs=$JOBS"; echo "threads=$THREADS"
  for slot in "${SLOTS[@]}"; do
    model=$([ "$slot" = A ] && echo llama || echo nanochat)
    for k in PRESET LAYER S C DATA INIT; do v=${slot}_$k; echo "$model.${k,,}=${!v}"; done
  done
} > "$OUT/settings.txt"
printf '%s\n' "${PLAN_ROWS[@]}" > "$OUT/plan.tsv"
: > "$OUT/commands.txt"
for i in "${ORDER[@]}"; do echo "${R_CMD[$i]}" >> "$OUT/commands.txt"; done

# ------------------------------------------------------------------ running
T0=$(date +%s)
hms() { printf '%d:%02d:%02d' $(($1 / 3600)) $(($1 % 3600 / 60)) $(($1 % 60)); }
has_end() { [ -f "$1/log.jsonl" ] && grep -q "\"type\":\"end\",\"step\":$2," "$1/log.jsonl"; }
last_ckpt_step() { # highest step_N.ckpt in DIR, 0 if none
  local f s best=0
  for f in "$1"/step_*.ckpt; do [ -e "$f" ] || continue; s=${f##*/step_}; s=$((10#${s%.ckpt})); [ $s -gt $best ] && best=$s; done
  echo $best
}
# state of run i: done | todo (and prepares the directory)
prepare() {
  local i=$1 d=${R_DIR[$1]}
  if [ -f "$d/cmd" ] && [ "$(cat "$d/cmd")" != "${R_CMD[$i]}" ]; then
    echo "error: $d was made by another command (other settings); remove it or use another --out" >&2
    echo "  its command: $(cat "$d/cmd")" >&2; echo "  this one:    ${R_CMD[$i]}" >&2
    return 2
  fi
  if [ -f "$d/done" ] && has_end "$d" "${R_TARGET[$i]}"; then echo "done"; return 0; fi
  echo todo
}
run_one() { # the body of a run (in a subshell): train (resuming from its own checkpoint if any), post-process
  local i=$1 d=${R_DIR[$1]} target=${R_TARGET[$1]} t0 cmd own
  t0=$(date +%s)
  cmd=${R_CMD[$i]}
  own=0; [ -d "$d" ] && own=$(last_ckpt_step "$d")
  if [ -f "$d/cmd" ] && [ "$own" -gt "${R_FROM[$i]}" ]; then
    if ! { [ "$own" = "$target" ] && has_end "$d" "$target"; }; then
      # resume from the run's own last checkpoint: drop what it logged after it, swap -resume/-init
      "$PY" scripts/characterize.py trim "$d" "$own"
      cmd="$("$PY" scripts/characterize.py resume-cmd "$cmd" "$(printf '%s/step_%06d.ckpt' "$d" "$own")")"
      echo "   (resuming ${R_NAME[$i]} from its step $own)" >> "$OUT/progress.log"
      bash -c "$cmd" >> "$d/stdout.txt" 2>&1 || return 1
    fi
  else
    rm -rf "$d"; mkdir -p "$d"
    echo "${R_CMD[$i]}" > "$d/cmd"
    bash -c "$cmd" > "$d/stdout.txt" 2>&1 || return 1
  fi
  has_end "$d" "$target" || { echo "no end record at step $target in $d/log.jsonl" >> "$d/stdout.txt"; return 1; }
  if [ -n "${R_CLEAN[$i]}" ]; then
    "$PY" scripts/characterize.py postrun "$d" "${R_CLEAN[$i]}" $([ "$KEEP_CKPT" = 1 ] && echo --keep-ckpt) >> "$d/stdout.txt" 2>&1 || return 1
  fi
  echo $(( $(date +%s) - t0 )) > "$d/done"
}

TODO=() WORK_TOTAL=0 NDONE_BEFORE=0
for i in "${ORDER[@]}"; do
  st=$(prepare "$i") || exit 1
  if [ "$st" = "done" ]; then NDONE_BEFORE=$((NDONE_BEFORE + 1)); else TODO+=("$i"); WORK_TOTAL=$((WORK_TOTAL + R_TARGET[i] - R_FROM[i])); fi
done
echo "== characterize ($PRESET$([ "$SMOKE" = 1 ] && echo ', smoke' || true)): $N runs, $NDONE_BEFORE already done, ${#TODO[@]} to run" \
     "($JOBS at a time${THREADS:+, $THREADS thread(s) each}); output in $OUT" | tee -a "$OUT/progress.log"
WORK_DONE=0 K=$NDONE_BEFORE FAILED=0
declare -A PID_RUN=() PID_T0=() PID_IDX=()
STARTED=$NDONE_BEFORE
finish() { # reap one finished run (reap.sh)
  local pid st i el eta
  reap_one "${!PID_RUN[@]}"
  pid=$REAP_PID st=$REAP_STATUS
  i=${PID_RUN[$pid]}; unset "PID_RUN[$pid]"
  K=$((K + 1))
  el=$(( $(date +%s) - T0 ))
  if [ $st -ne 0 ]; then
    FAILED=1
    echo "[${PID_IDX[$pid]}/$N] FAILED ${R_NAME[$i]} (exit $st); the end of ${R_DIR[$i]}/stdout.txt:" | tee -a "$OUT/progress.log" >&2
    tail -n 15 "${R_DIR[$i]}/stdout.txt" >&2 || true
    return
  fi
  WORK_DONE=$((WORK_DONE + R_TARGET[i] - R_FROM[i]))
  eta=$(( WORK_DONE > 0 ? el * (WORK_TOTAL - WORK_DONE) / WORK_DONE : 0 ))
  echo "[${PID_IDX[$pid]}/$N] done ${R_NAME[$i]} in $(( $(date +%s) - PID_T0[$pid] )) s | $K of $N finished |" \
       "elapsed $(hms $el) | ETA $(hms $eta)" | tee -a "$OUT/progress.log"
}
phase_of_last=""
for i in "${TODO[@]}"; do
  # a phase starts only when the previous one has finished (prefix -> clean -> the rest)
  if [ -n "$phase_of_last" ] && [ "${R_PHASE[$i]}" != "$phase_of_last" ]; then
    while [ ${#PID_RUN[@]} -gt 0 ]; do finish; done
  fi
  [ "$FAILED" = 1 ] && break
  phase_of_last=${R_PHASE[$i]}
  while [ ${#PID_RUN[@]} -ge "$JOBS" ]; do finish; done
  [ "$FAILED" = 1 ] && break
  STARTED=$((STARTED + 1))
  echo "[$STARTED/$N] start ${R_NAME[$i]} (steps $((R_FROM[i] + 1))-${R_TARGET[$i]})" | tee -a "$OUT/progress.log"
  ( run_one "$i" ) &
  PID_RUN[$!]=$i; PID_T0[$!]=$(date +%s); PID_IDX[$!]=$STARTED
done
while [ ${#PID_RUN[@]} -gt 0 ]; do finish; done
[ "$FAILED" = 0 ] || { echo "error: a run failed (see above); run the script again to continue" >&2; exit 1; }
WALL=$(( $(date +%s) - T0 ))
[ ${#TODO[@]} -gt 0 ] && echo "$WALL" >> "$OUT/wall_seconds.txt"
echo "== all $N runs done; this invocation $(hms $WALL) ($WALL s)" | tee -a "$OUT/progress.log"

if [ "$REPORT" = 1 ]; then
  echo "== report: $(q "${REPORT_CMD[@]}")"
  "${REPORT_CMD[@]}"
fi
