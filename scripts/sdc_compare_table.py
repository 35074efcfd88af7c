#!/usr/bin/env python3
"""The table of scripts/sdc_compare.sh: fault-free vs faulty vs protected, from the four run
directories under --out (clean, clean_prot, faulty, protected), with scripts/sdc_metrics.py.

Columns: final training loss; D_final and D_max against the fault-free run (DESIGN.md section 8);
delta-PPL and Top-1 agreement of the final model on the held-out set; W_L2 (percent); fault events
injected; events detected (an alarm on the step of the event, so the step was replayed); steps
replayed; alarms on steps without a fault (false positives); step-time overhead of the protected
fault-free run over the unprotected one (mean over the window, first 10 steps skipped)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdc_metrics as sm  # noqa: E402


def counts(d):
    st = sm.read_log(d).steps
    inj = [s for s in st if st[s].get("injections", 0) > 0]
    rep = [s for s in st if st[s].get("replayed", 0)]
    det = [s for s in inj if st[s].get("replayed", 0)]
    false = [s for s in rep if s not in inj]
    fin = [s for s in st if st[s].get("found_inf", 0)]
    return len(sm.read_faults(d)), len(det), len(rep), len(false), len(fin)


def fmt(x, f="{:+.4f}"):
    if x is None:
        return "n/a"
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return str(x)
    return f.format(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--window-start", type=int, required=True)
    a = ap.parse_args()
    clean = os.path.join(a.out, "clean")
    rows = []
    try:
        oh = sm.overhead(os.path.join(a.out, "clean_prot"), clean, start=a.window_start + 10)
    except sm.MetricsError as e:
        oh = {"overhead_pct": None}
        print(f"note: overhead not computed: {e}", file=sys.stderr)
    for name in ("clean", "clean_prot", "faulty", "protected"):
        d = os.path.join(a.out, name)
        log = sm.read_log(d)
        last = max(log.steps)
        if name == "clean":
            r = {"D_final": 0.0, "D_max": 0.0, "delta_ppl": 0.0, "top1": 1.0, "w_l2_pct": 0.0}
        else:
            r = sm.compare(clean, d, window_start=a.window_start)
        inj, det, rep, false, fin = counts(d)
        rows.append((name, log.steps[last]["loss"], r, inj, det, rep, false, fin,
                     oh["overhead_pct"] if name == "clean_prot" else None))
    print(f"| run | final loss | D_final | D_max | delta-PPL | Top-1 | W_L2 % | faults | detected | replayed | false alarms | found_inf | overhead % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, loss, r, inj, det, rep, false, fin, ohp in rows:
        print(f"| {name} | {fmt(loss, '{:.4f}')} | {fmt(r['D_final'])} | {fmt(r['D_max'])} | {fmt(r['delta_ppl'], '{:+.3f}')} | "
              f"{fmt(r['top1'], '{:.4f}')} | {fmt(r['w_l2_pct'], '{:.4f}')} | {inj} | {det} | {rep} | {false} | {fin} | "
              f"{fmt(ohp, '{:+.2f}')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
