#!/usr/bin/env python3
"""The reproduction of the paper's evaluation (Section 5, Appendix A.2-A.3): every run, then REPORT.md
with Tables 1, 2, 3, 5, 6 and Figures 3 and 5 in the paper's layout, the paper's numbers beside ours.
scripts/reproduce.sh is the front door; see its header for the presets.

Runs (each model; all but the pre-training resume from one common checkpoint, as the paper's resume
from step 1221, and use the same data order; a faulty and a protected run share one campaign):
  pre          clean pre-training to the common checkpoint (checkpoints along the way: Figure 5); its
               last `cal` steps calibrate the Residual Gain Guard
  clean        fault-free reference, detector features observed (-detect_observe: no effect on the math)
  clean_prot   fault-free, TrainSDC on (Table 5's clean false-positive rate)
  <method>_m<M>   the campaign at m elements an event (one event a step, site/pass/rank/microbatch/layer drawn)
               for Fault, Loss spike, Inf/NaN, ATTNChecker, Harmful-update, LLMFT, TrainSDC (Table 1), its
               components alone (Table 2), TrainSDC + the cheap attention checks (beyond the paper)
  llmft_train  the learned detector's training campaign (another fault seed; features observed)
  alpha<A>_*   Table 3: -protect rgg at alpha A: 200 held-out clean steps, 48 + 48 residual-path events
  peers_*      single process (1 rank x 3 microbatches) against 3 MPI ranks x 1 microbatch
  expk<K>      Figure 3: exponent scaling alone at k = K under backward faults
  profile      clean exponent profile at the common checkpoint (R_amp for Figure 3); prof_<step> at every
               pre-training checkpoint (Figure 5)
  overhead     fault-free step time of every method, measured one after another (not in parallel)

Every run is skipped when its log already ends at its last step, so an interrupted job resumes.

The code, by job (scripts/sdc/):
  sdc/plan.py     PRESETS, the methods (Tables 1 and 2) and their flags; build_plan: every run's command line
  sdc/runner.py   run_jobs (parallel, in dependency order, resumable; progress and ETA), the LLMFT training,
                  the overhead pass
  sdc/metrics.py  a finished run against the fault-free run (on scripts/sdc_metrics.py)
  sdc/tables.py   Tables 1, 2, 3, 5, 6 and the tables beyond the paper, the paper's numbers beside ours
  sdc/figures.py  Figure 3 and the Figure 5 analogue
  sdc/report.py   REPORT.md (the full and the reduced plan)"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdc import ROOT  # noqa: E402
from sdc.plan import PRESETS, build_plan  # noqa: E402  (both also used by tests/test_reproduce.py)
from sdc.report import report, report_reduced  # noqa: E402
from sdc.runner import overhead_pass, run_jobs, train_llmft  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=PRESETS, default="tiny")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reduced", action="store_true", help="the tiny preset's reduced plan (tiny-llama, m = 10; see PRESETS)")
    ap.add_argument("--report-only", action="store_true", help="write the report from the runs finished so far (reduced plan)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--report", default=None)
    ap.add_argument("--report-dir", default=None, help="where the figures go (default: beside the runs)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--machine", default="")
    ap.add_argument("--args-line", default="scripts/reproduce.sh")
    a = ap.parse_args()
    name = "smoke" if a.smoke else ("tiny_reduced" if a.reduced and a.preset == "tiny" else a.preset)
    P = dict(PRESETS[name])
    if a.window:
        P["window"] = a.window
    a.preset = name
    a.out = a.out or os.path.join("out", f"reproduce_{name}")
    a.report = a.report or os.path.join(a.out, "REPORT.md")
    if not a.dry and not a.report_only and os.path.exists(os.path.join(ROOT, P["trainer"])):
        # run a private copy of the trainer: a rebuild while the job runs cannot mix two binaries
        os.makedirs(os.path.join(a.out, "bin"), exist_ok=True)
        dst = os.path.join(a.out, "bin", os.path.basename(P["trainer"]))
        shutil.copy2(os.path.join(ROOT, P["trainer"]), dst + ".tmp")
        os.replace(dst + ".tmp", dst)     # a rename works while an old copy still runs
        P["trainer_shown"] = P["trainer"]
        P["trainer"] = os.path.abspath(dst)
    pl = build_plan(a, P)
    if a.report_only:
        (report_reduced if P.get("reduced") else report)(pl, a.args_line)
        return
    run_jobs(pl, a.jobs or P["jobs"], a.dry)
    if a.dry:
        return
    for model in P["models"]:
        train_llmft(pl, model)
        if not P.get("reduced"):
            overhead_pass(pl, model)
    (report_reduced if P.get("reduced") else report)(pl, a.args_line)


if __name__ == "__main__":
    main()
