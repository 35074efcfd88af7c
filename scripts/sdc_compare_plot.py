#!/usr/bin/env python3
"""The figure of scripts/sdc_compare.sh: the training loss deviation from the clean run, step by step over
the fault window, for faulty, protected_paper, protected_all and control, with the clean envelope shaded.

    python scripts/sdc_compare_plot.py --out OUT [--window-start S] [--png FILE] [--dpi N]

reads OUT/{clean,clean_p1,clean_m1,faulty,protected_paper,protected_all,control}/log.jsonl (with
scripts/sdc_metrics.py's readers) and writes OUT/loss_deviation.png (or FILE); prints its path and caption.

What is drawn (deviation_data() computes it, without matplotlib; draw() draws it):
  x       the steps S .. T: S = --window-start (sdc_compare.sh passes PRE + 1, the first step after the
          common checkpoint), by default the faulty run's first fault event; T = the clean run's last step.
  y       D(t) = L_run(t) - L_clean(t), the signed training-loss deviation of sdc_metrics.py (the paper's D),
          one line per run. protected_all is drawn last, thicker, on top: it is the run that should sit
          on the zero line. A step the run (or the clean run) did not log is a gap in its line. A step
          whose loss is NaN or +-inf (sdc_metrics: D = +inf, the run diverged there) is a gap too, with a
          triangle of the run's colour at the top edge of the plot.
  band    the clean envelope, SYMMETRIC: |D| <= E(t), E(t) = max_i L_i(t) - min_i L_i(t) over the clean run
          and its -perturb +1 / -1 repeats (clean_p1, clean_m1), i.e. the largest pairwise |difference| of
          the fault-free runs at step t. This is sdc_metrics.py's E taken per step (E_max is its maximum
          over the window), so a point is inside the band exactly when the table's "inside the envelope"
          test |D| <= E holds at that step. (The asymmetric band spanned by clean_p1 - clean and
          clean_m1 - clean has the same width but only says where two particular repeats fell; the sign of
          a clean pair means nothing.)
  marks   ticks at the bottom edge at the updates the faulty run lost (sdc_metrics.lost_updates: skipped,
          or a clipped-away blow-up), the steps the control skips (at the edge, so that a lost update whose
          loss is NaN is marked too); a finite point between two gaps is a dot.
  y scale symmetric-log (linear within +-E_max, logarithmic beyond) when the largest |D| is more than
          SYMLOG_RATIO times E_max; linear otherwise. The paper's loss-deviation figures compare a faulty run
          that can be off by whole nats with protected runs that stay at bf16 noise (1e-4 .. 1e-2): on a
          linear axis the protected runs and the envelope are one flat line at zero, and on a plain log
          axis the sign and the zero line are lost. With linthresh = E_max the inner, linear part of the
          axis is the envelope's own scale (inside it or not is read directly), and each decade beyond it
          reads as "this many orders of magnitude outside the fault-free spread".
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdc_metrics as sm  # noqa: E402

# (run, label, colour, line width, line style, z order): drawn in this order, protected_all last, on top
RUNS = (("faulty", "faulty (unprotected)", "#d62728", 1.3, "-", 3),
        ("control", "control (fault-free, skips the lost updates)", "#9467bd", 1.3, "--", 4),
        ("protected_paper", "protected_paper (-protect paper)", "#ff7f0e", 1.5, "-", 5),
        ("protected_all", "protected_all (-protect all)", "#1f77b4", 2.4, "-", 6))
CLEAN = "clean"
REPEATS = ("clean_p1", "clean_m1")
SYMLOG_RATIO = 30.0
PNG = "loss_deviation.png"
FIGSIZE = (9.0, 6.0)      # inches: 990 x 660 pixels at the default 110 dpi


def deviation_data(runs, window_start=None):
    """The figure's numbers. runs: {name: run dir or sdc_metrics.RunLog}, with "clean"; any of the RUNS and
    REPEATS present are used. Returns a dict:
      steps     int array S .. T (S: window_start, else the faulty run's first fault event, else the clean
                log's first step; T: the clean log's last step; the clean log's steps in between)
      dev       {run: float array over steps}: D(t) = L_run(t) - L_clean(t); NaN where either log lacks the
                step, +inf where either loss is non-finite (as sdc_metrics.deviation_series)
      nonfinite {run: the steps where D is +inf}
      env       E(t) over steps: max - min of the clean runs' losses (NaN where one of them lacks the step,
                +inf where one is non-finite); None with fewer than two clean runs
      E_max     the largest finite E(t) (None without an envelope)
      lost      the faulty run's lost updates in S .. T
      preset, m the run record's preset, the faulty campaign's bit count m (None when unknown)
      yscale    ("symlog", linthresh) or ("linear", None), by choose_yscale"""
    if CLEAN not in runs:
        raise sm.MetricsError("no clean run: the deviation is from the clean run")
    logs = {n: sm._logs(r) for n, r in runs.items()}
    faults = sm.read_faults(runs["faulty"]) if "faulty" in runs and not isinstance(runs["faulty"], sm.RunLog) else []
    clean_steps = sorted(logs[CLEAN].steps)
    if window_start is None:
        window_start = min(int(r["step"]) for r in faults) if faults else clean_steps[0]
    steps = np.array([s for s in clean_steps if s >= window_start], dtype=np.int64)
    if not len(steps):
        raise sm.MetricsError(f"{logs[CLEAN].path}: no step at or after the window start {window_start}")
    index = {int(s): i for i, s in enumerate(steps)}

    def on_steps(got_steps, values):
        out = np.full(len(steps), math.nan)
        for s, v in zip(got_steps, values):
            if s in index:
                out[index[s]] = v
        return out
    dev, nonfinite = {}, {}
    for name, *_ in RUNS:
        if name in logs:
            dev[name] = on_steps(*sm.deviation_series(logs[CLEAN], logs[name]))
            nonfinite[name] = [int(s) for s, d in zip(steps, dev[name]) if d == math.inf]
    clean_runs = [logs[CLEAN]] + [logs[n] for n in REPEATS if n in logs]
    env = on_steps(*sm.clean_spread(clean_runs)[:2]) if len(clean_runs) >= 2 else None
    finite_env = env[np.isfinite(env)] if env is not None else np.zeros(0)
    E_max = float(finite_env.max()) if len(finite_env) else None
    lost = [s for s in sm.lost_updates(logs["faulty"])["lost"] if s in index] if "faulty" in logs else []
    run_rec = next((lg.runs[-1] for lg in logs.values() if lg.runs), {})
    res = {"steps": steps, "window_start": int(steps[0]), "last": int(steps[-1]), "dev": dev,
           "nonfinite": nonfinite, "env": env, "E_max": E_max, "n_clean": len(clean_runs), "lost": lost,
           "preset": run_rec.get("preset"), "m": faults[0].get("m") if faults else None}
    res["yscale"] = choose_yscale(res)
    return res


def choose_yscale(data, ratio=SYMLOG_RATIO):
    """("symlog", linthresh) when the largest finite |D| exceeds ratio x the scale (E_max, or without an
    envelope the smallest nonzero finite |D|); ("linear", None) otherwise (the module doc says why)."""
    mags = np.concatenate([np.abs(d[np.isfinite(d)]) for d in data["dev"].values()] or [np.zeros(0)])
    if not len(mags) or mags.max() == 0:
        return ("linear", None)
    scale = data["E_max"] if data["E_max"] else float(mags[mags > 0].min())
    return ("symlog", scale) if mags.max() > ratio * scale else ("linear", None)


def caption(data):
    """one paragraph, what the figure shows (printed by main, and the figure's footnote)"""
    parts = [f"Training loss deviation D(t) = L_run(t) - L_clean(t), steps {data['window_start']}..{data['last']}."]
    if data["env"] is not None:
        parts.append(f"Shaded: the clean envelope |D| <= E(t), E(t) = max - min of the losses of the {data['n_clean']} "
                     f"fault-free runs (clean, -perturb +-1 bf16 ulp) at step t"
                     + (f"; E_max = {data['E_max']:.2g}." if data["E_max"] is not None else " (no finite E)."))
    kind, lt = data["yscale"]
    if kind == "symlog":
        parts.append(f"y axis symmetric-log: linear within +-{lt:.2g}{' (E_max)' if lt == data['E_max'] else ''}, "
                     "logarithmic beyond.")
    if data["lost"]:
        n = len(data["lost"])
        parts.append(f"Ticks at the bottom: the {n} update{'s' if n > 1 else ''} the faulty run lost (the control skips "
                     f"{'them' if n > 1 else 'it'}).")
    if any(data["nonfinite"].values()):
        parts.append("Triangles at the top edge: a non-finite loss (a gap in the line).")
    return " ".join(parts)


def draw(data, png, dpi=110):
    """Draw deviation_data's dict into the PNG file png (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import blended_transform_factory

    x = data["steps"]
    fig, ax = plt.subplots(figsize=FIGSIZE)
    if data["env"] is not None:
        e = np.where(np.isfinite(data["env"]), data["env"], np.nan)
        ax.fill_between(x, -e, e, where=np.isfinite(e), color="0.6", alpha=0.35, linewidth=0, step=None,
                        label=f"clean envelope |D| <= E(t) ({data['n_clean']} fault-free runs)", zorder=1)
    ax.axhline(0.0, color="black", linewidth=0.8, zorder=2)
    edge = blended_transform_factory(ax.transData, ax.transAxes)     # x: step, y: 0 bottom .. 1 top
    for name, label, colour, lw, ls, z in RUNS:
        if name not in data["dev"]:
            continue
        d = np.where(np.isfinite(data["dev"][name]), data["dev"][name], np.nan)
        ax.plot(x, d, color=colour, linewidth=lw, linestyle=ls, label=label, zorder=z)
        ok = np.isfinite(d)
        alone = ok & ~np.r_[False, ok[:-1]] & ~np.r_[ok[1:], False]     # a point between two gaps: no line
        if alone.any():
            ax.plot(x[alone], d[alone], linestyle="none", marker="o", markersize=3.5, color=colour, zorder=z)
        if name == "faulty" and data["lost"]:
            ax.plot(data["lost"], [0.03] * len(data["lost"]), transform=edge, linestyle="none", marker="|",
                    markersize=11, markeredgewidth=1.6, color=colour, clip_on=False, zorder=20,
                    label="faulty: lost update (bottom ticks; the control skips them)")
        if data["nonfinite"][name]:
            ax.plot(data["nonfinite"][name], [0.975] * len(data["nonfinite"][name]), transform=edge,
                    linestyle="none", marker="v", markersize=8, color=colour, clip_on=False, zorder=20,
                    label=f"{name}: non-finite loss (top edge)")
    kind, lt = data["yscale"]
    if kind == "symlog":
        ax.set_yscale("symlog", linthresh=lt, linscale=1.0)
        ax.set_ylabel(f"L_run - L_clean  (symmetric log, linear within +-{lt:.2g})")
    else:
        ax.set_ylabel("L_run - L_clean")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    pad = max(0.5, 0.01 * (x[-1] - x[0]))      # room for a point or a marker on the first and last step
    ax.set_xlim(x[0] - pad, x[-1] + pad)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    what = ", ".join(str(v) for v in (data["preset"], None if data["m"] is None else f"m = {data['m']}") if v)
    ax.set_title(f"Training loss deviation from the clean run{': ' + what if what else ''}")
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8, frameon=False)
    fig.text(0.01, 0.01, caption(data), fontsize=6.5, wrap=True, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(png, dpi=dpi)
    plt.close(fig)
    return png


def plot(out, window_start=None, png=None, dpi=110):
    """deviation_data of the run directories under out, drawn into png (default out/loss_deviation.png);
    returns (png, data)."""
    names = (CLEAN,) + REPEATS + tuple(r[0] for r in RUNS)
    runs = {n: os.path.join(out, n) for n in names if os.path.isdir(os.path.join(out, n))}
    if CLEAN not in runs:
        raise sm.MetricsError(f"{os.path.join(out, CLEAN)}: no such run directory (the deviation is from the clean run)")
    data = deviation_data(runs, window_start)
    return draw(data, png or os.path.join(out, PNG), dpi), data


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="OUT", help="the run directories of scripts/sdc_compare.sh")
    ap.add_argument("--window-start", type=int, metavar="S")
    ap.add_argument("--png", metavar="FILE", help=f"default OUT/{PNG}")
    ap.add_argument("--dpi", type=int, default=110)
    a = ap.parse_args(argv)
    try:
        png, data = plot(a.out, a.window_start, a.png, a.dpi)
    except (sm.MetricsError, ValueError, OSError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    print(png)
    print(caption(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
