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

Metrics of a faulty run against the clean reference (aligned on the steps C+1..S of the fault window):
  D(t) = L_fault(t) - L_clean(t) (training loss); D_final = D(S); D_max = the largest D(t) over the steps
  where both losses are finite. A step whose loss is non-finite (the fault put an Inf/NaN into the
  forward pass) is counted (nonfinite_steps) instead of making D_max infinite, because the trainer then
  skips that update (found_inf) and training goes on: the run has not diverged. sdc_metrics.loss_deviation
  reports such a run with D_max = +inf; both are in results.json.
  E_final, E_max: sdc_metrics.envelope over the clean run and its -perturb repeats, from step C+1.
  delta-PPL, Top-1 (argmax agreement on the held-out set), W_L2: sdc_metrics.
Propagation (Experiment 2): for every event of a forward run's trace, R_x = ||x_fault - x_clean|| /
  ||x_clean|| at the injected tensor and at the monitored outputs downstream (attention output, the
  attention residual, the MLP norm, the MLP output, the block output of the injected layer and of the last
  layer, the LM output); the table and heat map give log10 of the median over the events (a NaN R_x, a
  tensor that became non-finite, counts as +inf).
"""
import argparse
import json
import math
import os
import shlex
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdc_metrics as sm  # noqa: E402

SITES = ["attn_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope", "att_logits", "att_probs",
         "att_out", "o_proj", "attn_residual", "mlp_norm", "gate_proj", "up_proj", "act", "mlp_product", "down_proj",
         "block_out"]
QK_PATH = {"q_proj", "k_proj", "q_norm", "k_norm", "q_rope", "k_rope"}
MODEL_TITLE = {"llama": "Llama family", "nanochat": "nanochat family"}


class Error(Exception):
    pass


# ------------------------------------------------------------------ small subcommands
def cmd_trim(run, step):
    for name in ("log.jsonl", "faults.jsonl", "trace.jsonl"):
        p = os.path.join(run, name)
        if not os.path.exists(p):
            continue
        keep = []
        with open(p) as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue          # a line cut short by the interruption
                s = rec.get("step")
                if isinstance(s, (int, float)) and s > step:
                    continue
                keep.append(line if line.endswith("\n") else line + "\n")
        tmp = p + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, p)


def cmd_resume(cmd, ckpt):
    a = shlex.split(cmd)
    out, i = [], 0
    while i < len(a):
        if a[i] in ("-resume", "-init") and i + 1 < len(a):
            i += 2
            continue
        out.append(a[i])
        i += 1
    return shlex.join(out + ["-resume", ckpt])


def cmd_postrun(run, clean, keep):
    fc, cc = sm.final_checkpoint(run), sm.final_checkpoint(clean)
    if not fc:
        raise Error(f"{run}: no checkpoint")
    if not cc:
        raise Error(f"{clean}: no checkpoint")
    a, c = sm.Checkpoint(fc), sm.Checkpoint(cc)
    if a.step != c.step:
        raise Error(f"{fc}: step {a.step}, the clean run's final checkpoint {cc} is at step {c.step}")
    w = sm.weight_l2(a, c)
    with open(os.path.join(run, "wl2.json"), "w") as f:
        json.dump({"w_l2_pct": w, "ckpt_step": a.step, "clean_ckpt": cc}, f)
    print(f"W_L2 {w:.6g} % (step {a.step}, against {cc})")
    if not keep:
        del a
        for name in os.listdir(run):
            if name.startswith("step_") and name.endswith(".ckpt"):
                os.remove(os.path.join(run, name))


# ------------------------------------------------------------------ reading an output directory
def read_settings(out):
    p = os.path.join(out, "settings.txt")
    if not os.path.exists(p):
        raise Error(f"{p}: no such file (not a characterize.sh output directory)")
    st = {}
    for line in open(p):
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            st[k] = v
    return st


def read_plan(out):
    p = os.path.join(out, "plan.tsv")
    rows = []
    for line in open(p):
        if not line.strip():
            continue
        model, kind, pas, site, perturb, d = line.rstrip("\n").split("\t")
        rows.append({"model": model, "kind": kind, "pass": pas, "site": site, "perturb": int(perturb), "dir": d})
    return rows


def fnum(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def run_metrics(clean_log, run_dir, t0, env):
    """Experiment 1 metrics of one run against the clean reference (see the module doc)."""
    fl = sm.read_log(run_dir)
    steps = [s for s in sm._aligned(clean_log, fl) if s >= t0]
    if not steps:
        raise Error(f"{run_dir}: no step of the fault window (from {t0}) in common with the clean run")
    Lc, Lf = clean_log.losses(steps), fl.losses(steps)
    fin = np.isfinite(Lc) & np.isfinite(Lf)
    D = np.where(fin, Lf - np.where(fin, Lc, 0), np.nan)
    r = {"T": steps[-1], "t0": t0, "n_steps": len(steps)}
    r["D_final"] = float(D[-1]) if fin[-1] else math.inf
    if fin.any():
        i = int(np.nanargmax(np.where(fin, D, -np.inf)))
        r["D_max"], r["D_max_step"] = float(D[i]), int(steps[i])
    else:
        r["D_max"], r["D_max_step"] = math.inf, None
    r["nonfinite_steps"] = [int(s) for s, ok in zip(steps, np.isfinite(Lf)) if not ok]
    r["found_inf"] = int(sum(int(fl.steps[s].get("found_inf", 0) or 0) for s in steps))
    ev = sm.read_faults(run_dir)
    r["events"] = [int(e["step"]) for e in ev]
    r["events_nonfinite"] = sum(1 for e in ev if not (isinstance(e.get("rms_after"), (int, float)) and math.isfinite(e["rms_after"])))
    r["m_logged"] = sorted({int(e["m"]) for e in ev})
    r["numel"] = sorted({int(e["numel"]) for e in ev})
    try:
        r["sdc_metrics_D_max"] = sm.loss_deviation(clean_log, fl, window_start=t0)["D_max"]
    except sm.MetricsError:
        r["sdc_metrics_D_max"] = None
    if env:
        r["ratio_final"] = sm.ratio(r["D_final"], env["E_final"])[0]
        r["ratio_max"] = sm.ratio(r["D_max"], env["E_max"])[0]
    else:
        r["ratio_final"] = r["ratio_max"] = None
    dp = sm.delta_ppl(clean_log, fl)
    r["delta_ppl"] = dp["delta_ppl"] if dp else None
    r["ppl"] = dp["ppl_fault"] if dp else None
    return r


def top1(clean_dir, run_dir):
    cp, fp = sm.find_predictions(clean_dir), sm.find_predictions(run_dir)
    return sm.top1_agreement(fp, cp) if cp and fp else None


def wl2(run_dir, clean_dir):
    p = os.path.join(run_dir, "wl2.json")
    if os.path.exists(p):
        return json.load(open(p))["w_l2_pct"]
    fc, cc = sm.final_checkpoint(run_dir), sm.final_checkpoint(clean_dir)
    return sm.weight_l2(fc, cc) if fc and cc else None


def trace_columns(layer, n_layer):
    """the monitored outputs of Experiment 2, in forward order: (key, site, layer, label)"""
    cols = [("self", None, layer, "injected\ntensor")]
    for s, lab in (("att_out", "att_out"), ("attn_residual", "attn_resid"), ("mlp_norm", "mlp_norm"),
                   ("down_proj", "mlp out\n(down)"), ("block_out", "block_out")):
        cols.append((f"{s}@{layer}", s, layer, f"{lab}\nL{layer}"))
    if layer < n_layer - 1:
        cols.append((f"block_out@{n_layer - 1}", "block_out", n_layer - 1, f"block_out\nL{n_layer - 1}"))
    cols.append(("lm_output", "lm_output", -1, "LM\noutput"))
    return cols


def trace_metrics(path, site, layer, n_layer):
    """{column key: (median R_x or None when upstream, n events, n non-finite)}"""
    recs = sm.read_trace(path)
    events = {}
    for r in recs:
        ev = (int(r["step"]), int(r["microbatch"]), int(r["rank"]))
        nc = r.get("norm_clean")
        ok = not isinstance(nc, (int, float)) or math.isfinite(nc)
        events.setdefault(ev, {})[(r["site"], int(r["layer"]))] = (float(r["rx"]), ok)
    out = {}
    si = SITES.index(site)
    for key, s, l, _ in trace_columns(layer, n_layer):
        if key == "self":
            s = site
        elif s != "lm_output" and l == layer and SITES.index(s) < si:
            out[key] = None                                   # upstream of the injection: not monitored
            continue
        vals = [v for e in events.values() for (v, ok) in [e.get((s, l), (None, False))] if v is not None and ok]
        if not vals:
            out[key] = None
            continue
        ranked = [math.inf if math.isnan(v) else v for v in vals]
        out[key] = (float(np.median(ranked)), len(vals), sum(not math.isfinite(v) for v in vals))
    return out, len(events)


# ------------------------------------------------------------------ figures
def _cap(vals, floor=10.0):
    fin = [abs(v) for v in vals if fnum(v)]
    return max([floor] + fin) * 4


def bar_panel(ax, res, model, metric, letter):
    """grouped bars of D/E per site, forward and backward, symlog axis; the clean envelope is |D/E| = 1"""
    rows = [r for r in res["runs"] if r["model"] == model and r["kind"] == "fault"]
    sites = [s for s in SITES if any(r["site"] == s for r in rows)]
    key = "ratio_final" if metric == "final" else "ratio_max"
    vals = [r[key] for r in rows if r[key] is not None]
    cap = _cap(vals)
    x = np.arange(len(sites))
    w = 0.4
    colors = {"fwd": "#2b6cb0", "bwd": "#dd6b20"}
    for k, pas in enumerate(("fwd", "bwd")):
        xs, ys, hatch_x, notes = [], [], [], []
        for i, s in enumerate(sites):
            r = next((r for r in rows if r["site"] == s and r["pass"] == pas), None)
            if r is None or r[key] is None:
                continue
            v = r[key]
            if not fnum(v):
                v = cap if (math.isnan(v) or v > 0) else -cap
                hatch_x.append(i)
            xs.append(i + (k - 0.5) * w)
            ys.append(v)
            nf = len(r["nonfinite_steps"])
            if nf:
                notes.append((i + (k - 0.5) * w, v, nf))
        if not xs:
            continue
        bars = ax.bar(xs, ys, w, color=colors[pas], label="forward" if pas == "fwd" else "backward")
        for b, xx in zip(bars, xs):
            if int(round(xx - (k - 0.5) * w)) in hatch_x:
                b.set_hatch("///")
                b.set_edgecolor("black")
        for xx, v, nf in notes:
            ax.annotate(f"{nf}", (xx, v), xytext=(0, 2 if v >= 0 else -8), textcoords="offset points",
                        ha="center", fontsize=6, color="#c53030")
    ax.set_yscale("symlog", linthresh=1.0)
    for y in (1, -1):
        ax.axhline(y, color="gray", lw=0.8, ls="--")
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xticks(x)
    ax.set_xticklabels(sites, rotation=60, ha="right", fontsize=7)
    for lab, s in zip(ax.get_xticklabels(), sites):
        if s in QK_PATH:
            lab.set_color("#c53030")
            lab.set_fontweight("bold")
    m = res["models"][model]
    what = "D_final / E_final" if metric == "final" else "D_max / E_max"
    ax.set_title(f"({letter}) {m['preset']} layer {m['layer']}: {what}\n", fontsize=9)
    ax.text(0.5, 1.015, "red labels: Q/K path; dashed: the clean envelope (|D| = E); red numbers: steps with a "
            "non-finite loss (update skipped); hatched: non-finite D", transform=ax.transAxes, ha="center",
            va="bottom", fontsize=6, color="#444")
    ax.set_ylabel(what + " (symlog)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlim(-0.7, len(sites) - 0.3)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=colors["fwd"], label="forward"), Patch(color=colors["bwd"], label="backward")],
              fontsize=7, loc="upper right", framealpha=0.8)


def heat_panel(ax, res, model, letter, fig):
    m = res["models"][model]
    rows = [r for r in res["runs"] if r["model"] == model and r["kind"] == "fault" and r["pass"] == "fwd"
            and r.get("trace")]
    sites = [s for s in SITES if any(r["site"] == s for r in rows)]
    cols = trace_columns(m["layer"], m["n_layer"])
    A = np.full((len(sites), len(cols)), np.nan)
    txt = [["" for _ in cols] for _ in sites]
    for i, s in enumerate(sites):
        r = next(r for r in rows if r["site"] == s)
        for j, (key, _, _, _) in enumerate(cols):
            v = r["trace"].get(key)
            if v is None:
                txt[i][j] = "·"
                continue
            med = v[0]
            if not math.isfinite(med):
                A[i, j] = 99
                txt[i][j] = "inf"
            elif med <= 0:
                A[i, j] = -98
                txt[i][j] = "0"
            else:
                A[i, j] = math.log10(med)
                txt[i][j] = f"{A[i, j]:.1f}"
    vmin, vmax = -6, 6
    import matplotlib.colors as mcolors
    cmap = mcolors.LinearSegmentedColormap.from_list("rx", ["#f7fbff", "#9ecae1", "#3182bd", "#fd8d3c", "#a50f15"])
    cmap.set_over("#3d0000")
    cmap.set_under("#ffffff")
    cmap.set_bad("#e2e2e2")
    im = ax.imshow(np.ma.masked_invalid(A), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    for i in range(len(sites)):
        for j in range(len(cols)):
            v = A[i, j]
            dark = np.isfinite(v) and (v > 2 or v == 99)
            ax.text(j, i, txt[i][j], ha="center", va="center", fontsize=6, color="white" if dark else "black")
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([c[3] for c in cols], fontsize=6.5)
    ax.set_yticks(range(len(sites)))
    ax.set_yticklabels(sites, fontsize=7)
    for lab, s in zip(ax.get_yticklabels(), sites):
        if s in QK_PATH:
            lab.set_color("#c53030")
            lab.set_fontweight("bold")
    ax.set_title(f"({letter}) {m['preset']} layer {m['layer']}: propagation, log10 median R_x (forward faults)",
                 fontsize=9)
    cb = fig.colorbar(im, ax=ax, fraction=0.035, pad=0.02, extend="max")
    cb.ax.tick_params(labelsize=7)
    cb.set_label("log10 R_x", fontsize=7)


def make_figures(res, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = [m for m in ("llama", "nanochat") if m in res["models"]]
    files = []
    letters = {("final", 0): "a", ("final", 1): "b", ("max", 0): "c", ("max", 1): "d", ("prop", 0): "e", ("prop", 1): "f"}
    has_trace = {m: any(r.get("trace") for r in res["runs"] if r["model"] == m) for m in models}
    for k, model in enumerate(models):
        for metric in ("final", "max"):
            fig, ax = plt.subplots(figsize=(7.5, 3.6))
            bar_panel(ax, res, model, metric, letters[(metric, k)])
            fig.tight_layout()
            f = f"fig1{letters[(metric, k)]}.png"
            fig.savefig(os.path.join(out, f), dpi=110)
            plt.close(fig)
            files.append(f)
        if has_trace[model]:
            n = sum(1 for r in res["runs"] if r["model"] == model and r.get("trace"))
            fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.26 * n))
            heat_panel(ax, res, model, letters[("prop", k)], fig)
            fig.tight_layout()
            f = f"fig1{letters[('prop', k)]}.png"
            fig.savefig(os.path.join(out, f), dpi=110)
            plt.close(fig)
            files.append(f)
    # all panels in one figure, the layout of Figure 1: columns = models, rows = final, max, propagation
    nrow = 3 if any(has_trace.values()) else 2
    fig = plt.figure(figsize=(7.5 * len(models), 3.6 * 2 + (6.0 if nrow == 3 else 0)))
    gs = fig.add_gridspec(nrow, len(models), height_ratios=[1, 1, 1.6][:nrow])
    for k, model in enumerate(models):
        bar_panel(fig.add_subplot(gs[0, k]), res, model, "final", letters[("final", k)])
        bar_panel(fig.add_subplot(gs[1, k]), res, model, "max", letters[("max", k)])
        if nrow == 3 and has_trace[model]:
            heat_panel(fig.add_subplot(gs[2, k]), res, model, letters[("prop", k)], fig)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "figure1.png"), dpi=80)
    plt.close(fig)
    files.append("figure1.png")
    return files


# ------------------------------------------------------------------ the report
def fmt(x, f="{:+.3e}"):
    if x is None:
        return "n/a"
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("+inf" if x > 0 else "-inf")
    return f.format(x)


def fmt_ratio(x):
    if x is None:
        return "n/a"
    if not fnum(x):
        return fmt(x)
    return f"{x:+.3g}" if abs(x) < 1e4 else f"{x:+.2e}"


def collect(out):
    st = read_settings(out)
    plan = read_plan(out)
    res = {"settings": st, "models": {}, "runs": []}
    for model in dict.fromkeys(r["model"] for r in plan):
        C, S, L = int(st[f"{model}.c"]), int(st[f"{model}.s"]), int(st[f"{model}.layer"])
        t0 = C + 1
        clean = next(r["dir"] for r in plan if r["model"] == model and r["kind"] == "clean")
        reps = [r["dir"] for r in plan if r["model"] == model and r["kind"] == "repeat"]
        cl = sm.read_log(clean)
        n_layer = int(cl.runs[0].get("n_layer", 0)) if cl.runs else 0
        env = sm.envelope([cl] + [sm.read_log(d) for d in reps], window_start=t0) if reps else None
        ev = cl.final_eval()
        res["models"][model] = {"preset": st[f"{model}.preset"], "layer": L, "S": S, "C": C, "n_layer": n_layer,
                                "clean": clean, "repeats": reps, "envelope": env,
                                "clean_final_loss": cl.steps[max(cl.steps)]["loss"],
                                "clean_val_loss": ev["val_loss"] if ev else None, "clean_ppl": ev["ppl"] if ev else None}
        for r in plan:
            if r["model"] != model or r["kind"] == "clean":
                continue
            m = run_metrics(cl, r["dir"], t0, env)
            m.update(r)
            m["top1"] = top1(clean, r["dir"])
            m["w_l2_pct"] = wl2(r["dir"], clean)
            tp = os.path.join(r["dir"], "trace.jsonl")
            if r["kind"] == "fault" and r["pass"] == "fwd" and os.path.exists(tp) and os.path.getsize(tp) > 0:
                tm, n_ev = trace_metrics(tp, r["site"], L, n_layer)
                m["trace"] = {k: v for k, v in tm.items()}
                m["trace_events"] = n_ev
            res["runs"].append(m)
    return res


def summary_lines(res, model):
    """the rankings a reader checks O1 and O2 against"""
    L = []
    rows = [r for r in res["runs"] if r["model"] == model and r["kind"] == "fault"]
    fwd = [r for r in rows if r["pass"] == "fwd"]
    bwd = [r for r in rows if r["pass"] == "bwd"]

    def rank(rs, key, n=6):
        good = [r for r in rs if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
        good.sort(key=lambda r: -r[key])
        return ", ".join(f"{r['site']}{'*' if r['site'] in QK_PATH else ''} {fmt_ratio(r[key])}" for r in good[:n])

    def med(rs, key):
        v = [r[key] for r in rs if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
        return float(np.median(v)) if v else None

    if fwd:
        L.append(f"- forward, largest D_final/E_final: {rank(fwd, 'ratio_final')}")
        L.append(f"- forward, largest D_max/E_max: {rank(fwd, 'ratio_max')}")
        qk = [r for r in fwd if r["site"] in QK_PATH]
        rest = [r for r in fwd if r["site"] not in QK_PATH]
        L.append(f"- forward medians, Q/K path ({len(qk)} sites) vs the others ({len(rest)}): D_final/E_final "
                 f"{fmt_ratio(med(qk, 'ratio_final'))} vs {fmt_ratio(med(rest, 'ratio_final'))}; D_max/E_max "
                 f"{fmt_ratio(med(qk, 'ratio_max'))} vs {fmt_ratio(med(rest, 'ratio_max'))}")
        above = sum(1 for r in fwd if fnum(r["ratio_final"]) and abs(r["ratio_final"]) > 1 or
                    (r["ratio_final"] is not None and not fnum(r["ratio_final"])))
        L.append(f"- forward sites with |D_final| above the clean envelope: {above} of {len(fwd)}")
    if bwd:
        v = sorted(r["ratio_final"] for r in bwd if fnum(r["ratio_final"]))
        above = sum(1 for r in bwd if (fnum(r["ratio_final"]) and abs(r["ratio_final"]) > 1) or
                    (r["ratio_final"] is not None and not fnum(r["ratio_final"])))
        L.append(f"- backward, largest D_final/E_final: {rank(bwd, 'ratio_final')}")
        if v:
            L.append(f"- backward D_final/E_final: min {fmt_ratio(v[0])}, median {fmt_ratio(float(np.median(v)))}, "
                     f"max {fmt_ratio(v[-1])}; |D_final| above the clean envelope at {above} of {len(bwd)} sites")
    tr = [r for r in fwd if r.get("trace")]
    if tr:
        m = res["models"][model]
        key = f"block_out@{m['layer']}"

        def val(r, k):
            v = r["trace"].get(k)
            return v[0] if v else None
        parts = []
        for r in tr:
            v = val(r, key)
            parts.append((math.inf if v is None or math.isnan(v) else v, r["site"]))
        parts.sort(key=lambda t: t[0])
        L.append(f"- propagation, median R_x at block_out of layer {m['layer']} (smallest first): " +
                 ", ".join(f"{s}{'*' if s in QK_PATH else ''} {fmt(v, '{:.2g}')}" for v, s in parts))
    return L


def write_markdown(res, out, figs):
    st = res["settings"]
    L = [f"# Fault characterisation: preset {st['preset']}{' (smoke)' if st.get('smoke') == '1' else ''}", ""]
    L.append("Made by `scripts/characterize.sh` (paper Section 3, Experiments 1 and 2, Figure 1). "
             "Metrics: see `scripts/characterize.py` and `scripts/sdc_metrics.py`.")
    L.append("")
    wall = os.path.join(out, "wall_seconds.txt")
    if os.path.exists(wall):
        ws = [int(x) for x in open(wall).read().split()]
        L.append(f"Wall time of the driver: {sum(ws)} s ({sum(ws) / 60:.1f} min) over {len(ws)} invocation(s) "
                 f"({', '.join(str(w) for w in ws)} s).")
    tot = 0
    for r in [*res["runs"]]:
        p = os.path.join(r["dir"], "done")
        if os.path.exists(p):
            tot += int(open(p).read().strip() or 0)
    L.append(f"Sum of the run times of the fault and repeat runs: {tot} s (with {st['jobs']} run(s) at a time).")
    L.append("")
    budget = f"frac {st['frac']} of each tensor" if st.get("frac") else f"m = {st['m']} elements"
    L.append(f"Common settings: trainer `{st['trainer']}`, B {st['B']} x accum {st['accum']} x seq {st['seq']}"
             f"{' x ' + st['ranks'] + ' ranks' if st.get('ranks', '1') != '1' else ''}, lr {st['lr']}, warmup "
             f"{st['warmup']}, fault rate {st['rate']} of the window's steps, {budget}, {st['bits']} bits an element, "
             f"rank 0, fault seed {st['seed']}, held-out {st['eval_tokens']} positions, {st['repeats']} clean repeats.")
    L.append("")
    for model, m in res["models"].items():
        env = m["envelope"]
        L.append(f"## {m['preset']} ({MODEL_TITLE.get(model, model)}), layer {m['layer']} of {m['n_layer']}")
        L.append("")
        L.append(f"Steps 1-{m['C']} clean (common checkpoint), fault window {m['C'] + 1}-{m['S']}. Clean run: final "
                 f"training loss {fmt(m['clean_final_loss'], '{:.5f}')}, val loss {fmt(m['clean_val_loss'], '{:.5f}')}, "
                 f"PPL {fmt(m['clean_ppl'], '{:.3f}')}.")
        if env:
            L.append(f"Clean envelope ({env['n_clean']} clean runs: the reference and -perturb repeats): "
                     f"E_final = {fmt(env['E_final'], '{:.3e}')}, E_max = {fmt(env['E_max'], '{:.3e}')} (step "
                     f"{env['E_max_step']}).")
        fr = [r for r in res["runs"] if r["model"] == model and r["kind"] == "fault"]
        if fr:
            evs = sorted({tuple(r["events"]) for r in fr})
            if len(evs) == 1:
                L.append(f"Fault events (the same steps in every run): {len(evs[0])}, at steps {', '.join(map(str, evs[0]))}.")
            else:
                L.append(f"Fault events differ between runs: {', '.join(str(len(e)) for e in evs)} events.")
        L.append("")
        L.append("### Experiment 1: training vulnerability")
        L.append("")
        L.append("Events: injected / of them with an Inf or NaN injected; non-finite: steps whose training loss was "
                 "non-finite (the update was skipped, found_inf); D_max over the steps with finite losses. "
                 "Q/K-path sites are marked *.")
        L.append("")
        L.append("| pass | site | events (Inf/NaN) | non-finite steps | skipped updates | D_final | D_max | "
                 "D_final/E_final | D_max/E_max | ΔPPL | Top-1 % | W_L2 % |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in [r for r in res["runs"] if r["model"] == model]:
            if r["kind"] == "repeat":
                name, pas = f"clean, -perturb {r['perturb']}", "-"
            else:
                name, pas = r["site"] + (" *" if r["site"] in QK_PATH else ""), r["pass"]
            L.append(f"| {pas} | {name} | {len(r['events'])} ({r['events_nonfinite']}) | {len(r['nonfinite_steps'])} | "
                     f"{r['found_inf']} | {fmt(r['D_final'])} | {fmt(r['D_max'])} | {fmt_ratio(r['ratio_final'])} | "
                     f"{fmt_ratio(r['ratio_max'])} | {fmt(r['delta_ppl'], '{:+.4g}')} | "
                     f"{fmt(None if r['top1'] is None else 100 * r['top1'], '{:.2f}')} | {fmt(r['w_l2_pct'], '{:.3g}')} |")
        L.append("")
        L += summary_lines(res, model)
        L.append("")
        tr = [r for r in res["runs"] if r["model"] == model and r.get("trace")]
        if tr:
            cols = trace_columns(m["layer"], m["n_layer"])
            L.append("### Experiment 2: propagation (forward faults)")
            L.append("")
            L.append("log10 of the median R_x = ||x_fault - x_clean|| / ||x_clean|| over the events of the run "
                     "(inf: the tensor became non-finite; · : upstream of the injection; 0: unchanged).")
            L.append("")
            L.append("| injected site | events | " + " | ".join(c[3].replace("\n", " ") for c in cols) + " |")
            L.append("|---|---|" + "---|" * len(cols))
            for r in tr:
                cells = []
                for key, _, _, _ in cols:
                    v = r["trace"].get(key)
                    if v is None:
                        cells.append("·")
                    elif not math.isfinite(v[0]):
                        cells.append("inf")
                    elif v[0] <= 0:
                        cells.append("0")
                    else:
                        cells.append(f"{math.log10(v[0]):+.2f}")
                L.append(f"| {r['site']}{' *' if r['site'] in QK_PATH else ''} | {r['trace_events']} | " +
                         " | ".join(cells) + " |")
            L.append("")
    L.append("## Figures")
    L.append("")
    for f in figs:
        L.append(f"![{f}]({f})")
    L.append("")
    L.append("## Commands")
    L.append("")
    L.append("Every run, in the order run (the prefix and clean runs first):")
    L.append("")
    L.append("```")
    cp = os.path.join(out, "commands.txt")
    if os.path.exists(cp):
        L += [line.rstrip() for line in open(cp)]
    L.append(f"python scripts/characterize.py report --out {out}")
    L.append("```")
    L.append("")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(L))


def _json_safe(o):
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {str(k): _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


def cmd_report(out, figures=True):
    res = collect(out)
    figs = make_figures(res, out) if figures else []
    write_markdown(res, out, figs)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(_json_safe(res), f, indent=1)
    print(f"wrote {os.path.join(out, 'results.md')}, results.json" + (f", {', '.join(figs)}" if figs else ""))
    for model in res["models"]:
        print(f"-- {res['models'][model]['preset']}")
        for line in summary_lines(res, model):
            print(line)


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
