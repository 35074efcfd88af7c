#!/usr/bin/env bash
# The main job: fault-free vs faulty vs protected training of a tiny model on the CPU, with the same
# fault campaign in every faulty run, all resuming from one common checkpoint (as the paper's runs all
# start from step 1221), and one table at the end (scripts/sdc_compare_table.py):
#   final loss, D_final, D_max, the mean deviation over the last 50 steps, the held-out loss difference,
#   delta-PPL, Top-1 agreement, W_L2, each deviation against the clean envelope E; fault events, events
#   the model reads that were caught, Q/K-path events caught, lost updates, replays, false alarms,
#   found_inf, overhead.
#
#   scripts/sdc_compare.sh [--preset tiny-llama] [--out DIR] [--pre N] [--window N] [--m M[,M...]] [--pass both]
#                          [--sites all] [--precision bf16] [--input FILE] [--ranks R] [--accum A] [--B B]
#                          [--seq T] [--lr X] [--warmup N] [--eval-tokens N] [--seed S] [--jobs J]
#                          [--smoke | --paper] [--plot-only] [--dry-run] [--trainer cpu|gpu|emu]
#
# --paper: the paper's evaluation setting (its Section 5): llama3.2-1b (--preset qwen3-0.6b for the other model),
# 6 ranks x 8 microbatches x 1 sequence of 1024 tokens a step, lr 5e-5 (warmup 100, cosine to 10%), the common
# checkpoint at step 1221, the window to step 2035 (814 steps), m = 10 and 100000, 614,400 held-out positions
# (capped by the validation split); any option after --paper overrides it (on one GPU: --ranks 1 --accum 48, the
# same 49,152 tokens a step, the Residual Gain Guard's peers then the 48 microbatches). The model keeps its
# preset's shape except the vocabulary, which is the data's (-vocab from DATA/meta.json: 8192 for the default
# tinyshakespeare BPE); the calibration is the 100 clean steps before the common checkpoint, as in every
# setting of this job (the paper calibrates on the 100 after it). A GPU job: `--trainer gpu --paper`.
# --m with several values (comma-separated): the fault-free runs once, in OUT; per value a directory OUT/mM with
# that campaign's faulty, protected_paper, protected_all and control runs (links to the fault-free ones beside
# them), its table.md and loss_deviation.png; OUT/table.md holds every value's table under its heading.
# --dry-run prints every stage's trainer command line and writes, builds and runs nothing.
# --jobs J keeps J of a stage's runs going at once (default 2, one thread each; --paper 1): the next starts as soon
# as any of them ends (scripts/reap.sh), so a long run (protected_all) does not hold the shorter ones back.
#
# --trainer picks the binary every stage runs: cpu (default) ./train_sdc; gpu ./train_sdc_cu (nvcc, a
# GPU); emu ./train_sdc_emu, the GPU trainer's code under the CUDA emulation (dev/cuda_emu) on the CPU,
# about 1.4 s a tiny-llama step on 2 cores (2.3 s on one thread, 5.7 s under -protect all): --smoke on it takes
# about 9 minutes, its window of 12 steps 6 of them. -threads (the CPU
# trainer's OpenMP threads) is passed to the CPU trainer only.
#
# Steps (each skipped when its output is already there, so an interrupted job resumes):
#   1. data: tinyshakespeare tokenised with an 8192-token byte-level BPE (data/tinyshakespeare)
#   2. pre-training, clean, steps 1..PRE-100; then PRE-100..PRE with -rgg_calibrate and -bwd_calibrate:
#      the common checkpoint step_PRE.ckpt and the calibrations of the Residual Gain Guard and the
#      backward guard
#   3. from the common checkpoint, WINDOW more steps (faults in PRE+1 .. PRE+WINDOW-1: none on the last):
#        clean            fault-free, unprotected                        (the reference)
#        clean_p1/_m1     fault-free with -perturb +1 / -1 (bf16 ulps)   (the clean envelope E)
#        clean_prot       fault-free, -protect all                       (overhead; false alarms)
#        faulty           campaign: one fault event a step, site and pass drawn, unprotected
#        protected_paper  the same campaign, -protect paper (Q/K recomputation, Residual Gain Guard,
#                         exponent scaling k = 15: the paper's method)
#        protected_all    the same campaign, -protect all (+ attention checks in both passes, the
#                         backward Q/K recomputation, the backward guard, k chosen from the run's own
#                         profile)
#        control          fault-free, skipping the updates the faulty run lost (-skip_steps)
#   4. the table
#   5. the figure (scripts/sdc_compare_plot.py): OUT/loss_deviation.png, the training loss deviation from
#      the clean run step by step over the window for faulty, the two protected runs and the control,
#      the clean envelope shaded; a failure to draw it stops the job (exit 1). --plot-only: this step
#      alone, on the runs already in OUT (the same --pre/--window/--smoke as the job that made them)
# Every trainer run must finish (its log's end record at the last step): a failed run stops the job
# with its output's tail and exit status 1.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/reap.sh"   # reap_one: the runs kept going JOBS at a time
# idle OpenMP threads sleep instead of spinning: a spinning run sharing its cores with another process
# is many times slower (measured here: 6.2 s vs 0.32 s a step); set OMP_WAIT_POLICY=active to override
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
PRESET=tiny-llama
OUT=out/sdc_compare
PRE=300
WINDOW=200
M=10
PASS=both
SITES=all
PRECISION=bf16
INPUT=""
RANKS=1
ACCUM=3
MB_B=4
SEQ=128
LR=2e-3
WARMUP=30
EVAL_TOKENS=8192
SEED=2026
JOBS=2
PLOT_ONLY=0
DRY_RUN=0
TRAINER_KIND=cpu
# the settings first (--smoke, --paper), wherever they stand: the other options override them
SETTING=""
for arg in "$@"; do
  case "$arg" in
    --smoke|--paper)
      if [ -n "$SETTING" ] && [ "$SETTING" != "$arg" ]; then echo "error: --smoke and --paper exclude each other" >&2; exit 1; fi
      SETTING="$arg" ;;
  esac
done
case "$SETTING" in
  --smoke) PRE=130; WINDOW=12 ;;
  --paper) PRESET=llama3.2-1b; PRE=1221; WINDOW=814; M=10,100000; RANKS=6; ACCUM=8; MB_B=1; SEQ=1024; LR=5e-5; WARMUP=100
           EVAL_TOKENS=614400; JOBS=1 ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) PRESET="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --pre) PRE="$2"; shift 2 ;;
    --window) WINDOW="$2"; shift 2 ;;
    --m) M="$2"; shift 2 ;;
    --pass) PASS="$2"; shift 2 ;;
    --sites) SITES="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --input) INPUT="$2"; shift 2 ;;
    --ranks) RANKS="$2"; shift 2 ;;
    --accum) ACCUM="$2"; shift 2 ;;
    --B) MB_B="$2"; shift 2 ;;
    --seq) SEQ="$2"; shift 2 ;;
    --lr) LR="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --eval-tokens) EVAL_TOKENS="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --smoke|--paper) shift ;;
    --plot-only) PLOT_ONLY=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --trainer) TRAINER_KIND="$2"; shift 2 ;;
    -h|--help) sed -n '2,56p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 1 ;;
  esac
done
posint() { case "$2" in ''|*[!0-9]*) echo "error: $1 must be a positive integer (got '$2')" >&2; exit 1 ;; esac
           if [ "$2" -lt 1 ]; then echo "error: $1 must be a positive integer (got '$2')" >&2; exit 1; fi; }
posint --pre "$PRE"; posint --window "$WINDOW"; posint --jobs "$JOBS"; posint --ranks "$RANKS"; posint --accum "$ACCUM"
posint --B "$MB_B"; posint --seq "$SEQ"; posint --eval-tokens "$EVAL_TOKENS"
case "$WARMUP" in ''|*[!0-9]*) echo "error: --warmup must be a non-negative integer (got '$WARMUP')" >&2; exit 1 ;; esac
if [ "$PRE" -lt 165 ] && [ "$PRE" -ne 130 ]; then echo "error: --pre must be >= 165 (100 calibration steps after 64+ clean ones)" >&2; exit 1; fi
if [ "$WINDOW" -lt 2 ]; then echo "error: --window must be >= 2" >&2; exit 1; fi
# the fault intensities: one campaign per value (the fault-free runs are shared)
IFS=, read -r -a MS <<< "$M"
if [ "${#MS[@]}" -lt 1 ]; then echo "error: --m: no value" >&2; exit 1; fi
for m in "${MS[@]}"; do posint --m "$m"; done
if [ "$(printf '%s\n' "${MS[@]}" | sort | uniq -d)" ]; then echo "error: --m $M: a value twice" >&2; exit 1; fi
case "$TRAINER_KIND" in
  cpu) BIN=train_sdc ;;
  gpu) BIN=train_sdc_cu ;;
  emu) BIN=train_sdc_emu ;;
  *) echo "error: --trainer must be cpu, gpu or emu (got '$TRAINER_KIND')" >&2; exit 1 ;;
esac
# a job's runs all come from one trainer: an OUT made by another is refused (before any build), not mixed into one table
if [ "$PLOT_ONLY" = 0 ] && [ -f "$OUT/trainer" ] && [ "$(cat "$OUT/trainer")" != "$TRAINER_KIND" ]; then
  echo "error: --out $OUT holds runs of --trainer $(cat "$OUT/trainer"), not $TRAINER_KIND: use another --out" >&2; exit 1
fi
if [ -z "$INPUT" ] && [ -f ../shared/data/tinyshakespeare.txt ]; then INPUT=../shared/data/tinyshakespeare.txt; fi
T0=$(date +%s)
say() { printf '[%4ds] %s\n' $(( $(date +%s) - T0 )) "$*"; }
# the campaign directories: OUT itself for one --m value, OUT/mM for each of several
campaign_dirs() { if [ "${#MS[@]}" -eq 1 ]; then echo "$OUT"; else for m in "${MS[@]}"; do echo "$OUT/m$m"; done; fi; }
# the figure of the runs in directory $1; a failure stops the job
figure() {
  local dir="$1"
  say "figure ($dir)"
  rm -f "$dir/loss_deviation.png"
  if ! .venv/bin/python scripts/sdc_compare_plot.py --out "$dir" --window-start $((PRE + 1)) --png "$dir/loss_deviation.png" \
     || [ ! -s "$dir/loss_deviation.png" ]; then
    echo "error: the figure (scripts/sdc_compare_plot.py) failed: no $dir/loss_deviation.png" >&2
    exit 1
  fi
}
if [ "$PLOT_ONLY" = 1 ]; then
  for dir in $(campaign_dirs); do figure "$dir"; done
  exit 0
fi

DATA=data/tinyshakespeare
PY=.venv/bin/python
TRAINER="$OUT/bin/$BIN"
if [ "$DRY_RUN" = 0 ]; then
  say "build ($BIN)"
  make -s "$BIN" venv
  if [ ! -x "$BIN" ]; then echo "error: --trainer $TRAINER_KIND: make did not build ./$BIN (train_sdc_cu needs nvcc)" >&2; exit 1; fi
  # the runs use a private copy of the trainer: a rebuild while the job runs cannot mix two binaries
  mkdir -p "$OUT/bin"
  cp -p "$BIN" "$OUT/bin/$BIN"
  echo "$TRAINER_KIND" > "$OUT/trainer"
  if [ ! -f "$DATA/meta.json" ]; then
    say "prepare $DATA"
    $PY dev/data/tinyshakespeare.py ${INPUT:+--input "$INPUT"} --out "$DATA"
  fi
  mkdir -p "$OUT"
fi
# the model's vocabulary is the data's (the presets of real models have their tokenizer's, far larger)
VOCAB=8192
if [ -f "$DATA/meta.json" ]; then
  VOCAB=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$DATA/meta.json" | head -n 1)
  posint "vocab_size of $DATA/meta.json" "$VOCAB"
fi
TOTAL=$((PRE + WINDOW))
LAUNCH=()
# the CPU trainer: one thread a run when runs or ranks share the cores
THREADS=()
if [ "$TRAINER_KIND" = cpu ] && { [ "$JOBS" -gt 1 ] || [ "$RANKS" -gt 1 ]; }; then THREADS=(-threads 1); fi
# the emulator runs blocks on OpenMP threads (its bits do not depend on their number): all of them in the
# pre-training, one each in the waves when JOBS runs share the cores
WAVE_OMP=""
if [ "$TRAINER_KIND" = emu ] && [ "$JOBS" -gt 1 ]; then WAVE_OMP=1; fi
if [ "$RANKS" -gt 1 ]; then
  LAUNCH=(mpirun -np "$RANKS" --oversubscribe)
  [ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
fi
COMMON=(-preset "$PRESET" -vocab "$VOCAB" -train "$DATA/train.bin" -val "$DATA/val.bin" -B "$MB_B" -accum "$ACCUM" -seq "$SEQ"
        -steps "$TOTAL" -lr "$LR" -warmup "$WARMUP" -precision "$PRECISION" -eval_every 0 -eval_tokens "$EVAL_TOKENS" -quiet)
CAL_FROM=$((PRE - 100))
if [ "$PRE" -eq 130 ]; then CAL_FROM=$((PRE - 66)); fi   # smoke: just enough to seed the window
CKPT="$OUT/pre/step_$(printf %06d "$PRE").ckpt"
CAL="$OUT/pre/rgg.cal"
BCAL="$OUT/pre/bwd.cal"

# a finished run: its log's end record is at the step it had to reach
done_run() { [ -f "$1/log.jsonl" ] && grep -q '"type":"end","step":'"$2"',' "$1/log.jsonl"; }
# run the trainer into DIR (output in DIR/train.out); a failure, or a log without its end record at
# step LAST, stops the job with the output's tail. --dry-run: the command line, nothing run
train() {
  local dir="$1" last="$2"; shift 2
  if [ "$DRY_RUN" = 1 ]; then echo "run $(basename "$dir"): ${LAUNCH[*]}${LAUNCH[*]:+ }$TRAINER $* -out $dir"; return 0; fi
  mkdir -p "$dir"
  local st=0
  "${LAUNCH[@]}" "$TRAINER" "$@" -out "$dir" >> "$dir/train.out" 2>&1 || st=$?
  if [ "$st" != 0 ] || ! done_run "$dir" "$last"; then
    echo "error: trainer run $dir failed (exit status $st, $( [ "$st" = 0 ] && echo "no end record at step $last" || echo "see $dir/train.out")); its last lines:" >&2
    tail -n 15 "$dir/train.out" >&2 || true
    return 1
  fi
  grep -E "^(exponent scaling|lost-step|protection|done)" "$dir/train.out" | sed "s|^|    $(basename "$dir"): |" || true
}

if [ "$DRY_RUN" = 1 ] || [ ! -f "$CKPT" ] || [ ! -f "$CAL" ] || [ ! -f "$BCAL" ]; then
  say "pre-training: steps 1..$CAL_FROM clean, then $CAL_FROM..$PRE clean with calibration"
  [ "$DRY_RUN" = 1 ] || rm -rf "$OUT/pre"
  train "$OUT/pre" "$CAL_FROM" "${COMMON[@]}" "${THREADS[@]}" -stop_at "$CAL_FROM"
  train "$OUT/pre" "$PRE" "${COMMON[@]}" "${THREADS[@]}" -stop_at "$PRE" \
    -resume "$OUT/pre/step_$(printf %06d "$CAL_FROM").ckpt" -rgg_calibrate "$CAL" -bwd_calibrate "$BCAL"
else
  say "common checkpoint $CKPT and calibrations $CAL, $BCAL already there"
fi

PAPER=(-protect paper -rgg_calibration "$CAL")
ALL=(-protect all -rgg_calibration "$CAL" -bwd_calibration "$BCAL")
campaign() {
  echo -fault_mode campaign -fault_sites "$SITES" -fault_pass "$PASS" -fault_m "$1" -fault_rank -1 -fault_mb -1 \
       -fault_start $((PRE + 1)) -fault_end $((TOTAL - 1)) -fault_seed "$SEED"
}
# run_args NAME M CAMPAIGN_DIR: the flags of run NAME (M: the campaign's elements an event)
run_args() {
  case "$1" in
    clean) ;;
    clean_p1) echo -perturb 1 ;;
    clean_m1) echo -perturb -1 ;;
    clean_prot) echo "${ALL[@]}" ;;
    faulty) campaign "$2" ;;
    protected_paper) echo "$(campaign "$2")" "${PAPER[@]}" ;;
    protected_all) echo "$(campaign "$2")" "${ALL[@]}" ;;
    control) echo -skip_steps "$3/control.steps" ;;
  esac
}
# wait_one: wait for whichever of the running runs (pids, names) ends first (reap.sh), drop it from the lists, report
# a failure
wait_one() {
  reap_one "${pids[@]}" || return 0
  for i in "${!pids[@]}"; do
    if [ "${pids[$i]}" = "$REAP_PID" ]; then
      [ "$REAP_STATUS" = 0 ] || { echo "error: run ${names[$i]} failed" >&2; failed=1; }
      unset "pids[$i]" "names[$i]"
      pids=("${pids[@]}"); names=("${names[@]}"); n=$((n - 1))
      return 0
    fi
  done
}
# run_wave DIR M NAME...: the runs into DIR/NAME, JOBS at a time (the next starts when any of them ends)
run_wave() {
  local base="$1" m="$2" pids=() names=() n=0 failed=0
  shift 2
  for name in "$@"; do
    local dir="$base/$name"
    if [ "$DRY_RUN" = 0 ] && done_run "$dir" "$TOTAL"; then say "$name: done already"; continue; fi
    [ "$DRY_RUN" = 1 ] || rm -rf "$dir"
    # shellcheck disable=SC2046
    say "$name${m:+ (m = $m)}: steps $((PRE + 1))..$TOTAL $(run_args "$name" "$m" "$base")"
    { if [ -n "$WAVE_OMP" ]; then export OMP_NUM_THREADS="$WAVE_OMP"; fi
      train "$dir" "$TOTAL" "${COMMON[@]}" "${THREADS[@]}" -resume "$CKPT" -pred_out "$dir/pred.bin" $(run_args "$name" "$m" "$base"); } &
    pids+=($!); names+=("$name"); n=$((n + 1))
    if [ "$n" -ge "$JOBS" ]; then wait_one; fi
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { echo "error: run ${names[$i]} failed" >&2; failed=1; }; done
  [ "$failed" = 0 ] || exit 1
}
# the control's skipped steps: the faulty run's lost updates (a change reruns the control)
control_steps() {
  local dir="$1"
  if [ "$DRY_RUN" = 1 ]; then echo "lost updates: $PY scripts/sdc_metrics.py lost $dir/faulty --steps-only > $dir/control.steps"; return 0; fi
  $PY scripts/sdc_metrics.py lost "$dir/faulty" --steps-only > "$dir/control.steps.new"
  if [ -f "$dir/control.steps" ] && ! cmp -s "$dir/control.steps" "$dir/control.steps.new"; then rm -rf "$dir/control"; fi
  mv "$dir/control.steps.new" "$dir/control.steps"
  say "control: the faulty run lost $(wc -w < "$dir/control.steps") updates"
}
FREE=(clean clean_p1 clean_m1 clean_prot)
CAMP=(faulty protected_all protected_paper)
if [ "${#MS[@]}" -eq 1 ]; then
  run_wave "$OUT" "${MS[0]}" clean faulty protected_all protected_paper clean_prot clean_p1 clean_m1
  control_steps "$OUT"
  run_wave "$OUT" "${MS[0]}" control
  if [ "$DRY_RUN" = 1 ]; then exit 0; fi
  say "table"
  $PY scripts/sdc_compare_table.py --out "$OUT" --window-start $((PRE + 1)) | tee "$OUT/table.md"
  figure "$OUT"
  say "finished; runs in $OUT, table in $OUT/table.md, figure in $OUT/loss_deviation.png"
  exit 0
fi
# several intensities: the fault-free runs once, then each campaign in OUT/mM beside links to them
run_wave "$OUT" "" "${FREE[@]}"
for m in "${MS[@]}"; do
  dir="$OUT/m$m"
  if [ "$DRY_RUN" = 0 ]; then
    mkdir -p "$dir"
    for name in "${FREE[@]}"; do ln -sfn "../$name" "$dir/$name"; done
    cp -p "$OUT/trainer" "$dir/trainer"
  fi
  run_wave "$dir" "$m" "${CAMP[@]}"
  control_steps "$dir"
  run_wave "$dir" "$m" control
done
if [ "$DRY_RUN" = 1 ]; then exit 0; fi
: > "$OUT/table.md.new"
for m in "${MS[@]}"; do
  dir="$OUT/m$m"
  say "table (m = $m)"
  $PY scripts/sdc_compare_table.py --out "$dir" --window-start $((PRE + 1)) > "$dir/table.md"
  { echo "## m = $m elements an event"; echo; cat "$dir/table.md"; echo; } >> "$OUT/table.md.new"
  figure "$dir"
done
mv "$OUT/table.md.new" "$OUT/table.md"
cat "$OUT/table.md"
say "finished; runs in $OUT, tables in $OUT/table.md (each m's in $OUT/mM/table.md), figures in $OUT/mM/loss_deviation.png"
