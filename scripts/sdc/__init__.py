"""The modules behind the two experiment drivers, scripts/reproduce.py (the paper's evaluation) and
scripts/characterize.py (the paper's fault characterisation), split by job:

  plan.py     what to run: presets, methods and their flags, every run's command line; the trainer's sites
  runner.py   running the plan (parallel, resumable, progress), the overhead pass, characterize.sh's run helpers
  metrics.py  a run against the fault-free reference, on top of scripts/sdc_metrics.py
  tables.py   the paper's tables with its numbers beside ours; the number formats
  figures.py  Figures 1, 3 and 5 (matplotlib)
  report.py   the prose: REPORT.md, results.md

The drivers put scripts/ on sys.path (for sdc_metrics and expscale_select) before they import this package."""
import os


class Error(Exception):
    """a driver's input is not what it needs (a missing file, a run that cannot be compared)"""


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # scripts/
ROOT = os.path.dirname(HERE)
