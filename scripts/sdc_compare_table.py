#!/usr/bin/env python3
"""The table of scripts/sdc_compare.sh, from the run directories under --out, with scripts/sdc_metrics.py.

Rows: clean (the reference), clean_prot (fault-free, -protect all), faulty, protected_paper,
protected_all, control (fault-free, skipping the faulty run's lost updates).
Columns: final training loss; against the clean run, each with its ratio to the clean envelope E in
parentheses (E from the clean run and its -perturb repeats clean_p1, clean_m1; |D| <= E is inside it):
D_final, D_max (paper), the mean deviation over the last 50 steps, the held-out (validation) loss
difference and delta-PPL at the end; Top-1 agreement; W_L2 (percent); fault events; events the model
reads (live > 0) that were caught (their step was replayed); Q/K-path events caught, forward (what
Q/K recomputation covers) and backward (qk_bwd's and the backward guard's); lost updates
(skipped, or a pre-clip gradient norm > 100x the running median); steps replayed; false alarms
(replays without an event); found_inf; the exponent-scaling k of the first step; CPU-time overhead of
clean_prot over clean (mean cpu_ms over the window, first 10 steps skipped; runs may have shared the
machine). Below the table: E, and the goal of protected_all checked item by item."""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdc_metrics as sm  # noqa: E402

ROWS = ("clean", "clean_prot", "faulty", "protected_paper", "protected_all", "control")
REPEATS = ("clean_p1", "clean_m1")


def fmt(x, f="{:+.4f}"):
    """sdc_metrics' number format, NaN spelled nan"""
    s = sm._f(x, f)
    return "nan" if s == "nonfinite" else s


def against(x, e, f="{:+.4f}"):
    """the value and |x| / E"""
    if x is None:
        return "n/a"
    if e is None or not math.isfinite(x):
        return fmt(x, f)
    if e == 0:
        return fmt(x, f) + (" (0E)" if x == 0 else " (inf E)")
    return f"{fmt(x, f)} ({abs(x) / e:.2g}E)"


def cpu_overhead(run, base, start):
    rl, bl = sm.read_log(run), sm.read_log(base)
    win = [s for s in sorted(set(rl.steps) & set(bl.steps)) if s >= start]
    if not win or any("cpu_ms" not in rl.steps[s] or "cpu_ms" not in bl.steps[s] for s in win):
        return None
    mr = float(np.mean([rl.steps[s]["cpu_ms"] for s in win]))
    mb = float(np.mean([bl.steps[s]["cpu_ms"] for s in win]))
    return 100.0 * (mr / mb - 1.0) if mb > 0 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--window-start", type=int, required=True)
    a = ap.parse_args()
    d = {n: os.path.join(a.out, n) for n in ROWS + REPEATS}
    clean = d["clean"]
    reps = [d[n] for n in REPEATS if os.path.isdir(d[n])]
    env = sm.envelope_all([clean] + reps, window_start=a.window_start) if reps else None
    E = env or {}
    rows = []
    tfile = os.path.join(a.out, "trainer")      # written by scripts/sdc_compare.sh --trainer
    emulated = os.path.isfile(tfile) and open(tfile).read().strip() == "emu"
    for name in ROWS:
        if not os.path.isdir(d[name]):
            continue
        log = sm.read_log(d[name])
        last = max(log.steps)
        if name == "clean":
            r = {"D_final": 0.0, "D_max": 0.0, "mean_dev_lastK": 0.0, "delta_val_loss": 0.0, "delta_ppl": 0.0,
                 "top1": 1.0, "w_l2_pct": 0.0, "lost_updates": sm.lost_updates(log)["n_lost"]}
        else:
            r = sm.compare(clean, d[name], window_start=a.window_start)
        r["det"] = sm.detection(d[name])
        r["loss"] = log.steps[last]["loss"]
        r["k"] = log.steps[min(log.steps)].get("k")
        # the emulated GPU trainer's wall time is the emulator's, not a GPU's: no overhead from it
        r["overhead"] = cpu_overhead(d[name], clean, a.window_start + 10) if name == "clean_prot" and not emulated else None
        rows.append((name, r))
    print("| run | final loss | D_final | D_max | mean D, last 50 | held-out loss diff | delta-PPL | Top-1 | W_L2 % | "
          "faults | read events caught | Q/K events caught: fwd, bwd | lost updates | replayed | false alarms | found_inf | k | "
          "overhead % (CPU) |")
    print("|" + "---|" * 18)
    for name, r in rows:
        det = r["det"]
        print(f"| {name} | {fmt(r['loss'], '{:.4f}')} | {against(r['D_final'], E.get('E_final'))} | "
              f"{against(r['D_max'], E.get('E_max'))} | {against(r.get('mean_dev_lastK'), E.get('E_lastK'))} | "
              f"{against(r.get('delta_val_loss'), E.get('E_val'))} | {against(r.get('delta_ppl'), E.get('E_ppl'), '{:+.3f}')} | "
              f"{fmt(r['top1'], '{:.4f}')} | {fmt(r['w_l2_pct'], '{:.4f}')} | {det['events']} | "
              f"{det['caught_read']}/{det['read']} | {det['qk_fwd_caught']}/{det['qk_fwd']}, "
              f"{det['qk_caught'] - det['qk_fwd_caught']}/{det['qk'] - det['qk_fwd']} | {r['lost_updates']} | "
              f"{det['replayed']} | {det['false_alarms']} | {det['found_inf']} | {r['k']} | {fmt(r['overhead'], '{:+.2f}')} |")
    if env:
        print(f"\nClean envelope E ({len(reps) + 1} fault-free runs: clean and -perturb +-1 bf16 ulp): "
              f"E_final {env['E_final']:.4f}, E_max {env['E_max']:.4f}, E_last50 {env['E_lastK']:.4f}, "
              f"E_val {fmt(env['E_val'], '{:.4f}')}, E_ppl {fmt(env['E_ppl'], '{:.3f}')}; (xE) = |deviation| / E.")
    got = dict(rows)
    if "protected_all" in got and env:
        r = got["protected_all"]
        det = r["det"]
        fp = got["clean_prot"]["det"]["false_alarms"] if "clean_prot" in got else None
        checks = [
            ("0 lost updates", r["lost_updates"] == 0, f"{r['lost_updates']}"),
            ("held-out loss difference inside E", r.get("delta_val_loss") is not None and env["E_val"] is not None
             and abs(r["delta_val_loss"]) <= env["E_val"], f"{fmt(r.get('delta_val_loss'))} vs E_val {fmt(env['E_val'], '{:.4f}')}"),
            ("last-50 mean deviation inside E", abs(r["mean_dev_lastK"]) <= env["E_lastK"],
             f"{fmt(r['mean_dev_lastK'])} vs E_last50 {env['E_lastK']:.4f}"),
            ("delta-PPL <= 0.05", r.get("delta_ppl") is not None and r["delta_ppl"] <= 0.05, fmt(r.get("delta_ppl"), "{:+.3f}")),
            ("every Q/K-path event caught", det["qk_caught"] == det["qk"],
             f"{det['qk_caught']}/{det['qk']}: forward {det['qk_fwd_caught']}/{det['qk_fwd']}"),
            (">= 95% of the events the model reads caught", det["read"] == 0 or det["caught_read"] >= 0.95 * det["read"],
             f"{det['caught_read']}/{det['read']}"),
            ("0 false alarms in the clean protected run", fp == 0, f"{fp}"),
        ]
        print("\nGoal of protected_all: " + "; ".join(f"{n}: {'yes' if ok else 'NO'} ({v})" for n, ok, v in checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
