#!/usr/bin/env python3
"""characterize.py: the Python side of scripts/characterize.sh (the paper's fault characterisation,
TrainSDC Section 3, Experiments 1 and 2, Figure 1). numpy and matplotlib; the metrics come from
scripts/sdc_metrics.py.

    characterize.py report --out DIR         results.md, results.json and the Figure 1 panels of a finished
                                             characterize.sh output directory
    characterize.py postrun RUN CLEAN [--keep-ckpt]
                                             W_L2 of RUN's final checkpoint against CLEAN's, into RUN/wl2.json;
                                             then RUN's checkpoints are deleted (unless --keep-ckpt)
    characterize.py trim RUN STEP            drop the records after STEP from RUN's log.jsonl, faults.jsonl and
                                             trace.jsonl (before resuming RUN from its own checkpoint at STEP)
    characterize.py resume-cmd CMD CKPT      CMD with its -resume / -init replaced by -resume CKPT

The code, by job (scripts/sdc/; the plan and the running are characterize.sh's):
  sdc/plan.py     the sites; read_settings, read_plan: what characterize.sh wrote into its output directory
  sdc/runner.py   the trim, resume-cmd and postrun subcommands
  sdc/metrics.py  Experiments 1 and 2: a run against the clean reference and its envelope, the propagation
                  trace (the definitions are in its docstring)
  sdc/tables.py   the number formats
  sdc/figures.py  the Figure 1 panels
  sdc/report.py   results.md, results.json
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdc_metrics as sm  # noqa: E402
from sdc import Error  # noqa: E402
from sdc.report import cmd_report  # noqa: E402
from sdc.runner import cmd_postrun, cmd_resume, cmd_trim  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(prog="characterize.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    p.add_argument("--no-figures", action="store_true")
    p = sub.add_parser("postrun")
    p.add_argument("run")
    p.add_argument("clean")
    p.add_argument("--keep-ckpt", action="store_true")
    p = sub.add_parser("trim")
    p.add_argument("run")
    p.add_argument("step", type=int)
    p = sub.add_parser("resume-cmd")
    p.add_argument("command")
    p.add_argument("ckpt")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "report":
            cmd_report(a.out, not a.no_figures)
        elif a.cmd == "postrun":
            cmd_postrun(a.run, a.clean, a.keep_ckpt)
        elif a.cmd == "trim":
            cmd_trim(a.run, a.step)
        else:
            print(cmd_resume(a.command, a.ckpt))
    except (Error, sm.MetricsError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
