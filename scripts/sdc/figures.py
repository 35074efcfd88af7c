"""The figures: Figure 3 (R_amp(k) against the measured final deviation) and the Figure 5 analogue (k* along
one run) of scripts/reproduce.py; the Figure 1 panels of scripts/characterize.py. matplotlib, Agg backend."""
import math
import os

import numpy as np

import expscale_select as es

from .metrics import fnum, spearman_exact, trace_columns
from .plan import K_MAX, QK_SITES, SITES, fig3_candidates


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display), imported when a figure is drawn"""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# --------------------------------------------------------------------------------- reproduce.py
def figure3(pl, res, figdir, tag="", label=""):
    plt = pyplot()
    P = pl.P
    ks = fig3_candidates(P)
    fig, axes = plt.subplots(1, len(P["models"]), figsize=(5.5 * len(P["models"]), 4), squeeze=False)
    rows = []
    for ax, model in zip(axes[0], P["models"]):
        _, hists = es.load_profile(os.path.join(pl.d(model, "profile"), "profile.json"))
        H = es.pooled(hists)
        safe = set(es.k_safe(H, 0, K_MAX))
        sel = es.select(H, 0, K_MAX)
        ramp, dfin = [], []
        for k in ks:
            r = res[model].get(f"expk{k}{tag}")
            if r is None or k not in safe:
                continue
            ramp.append(float(es.r_amp_exact(H, k)))
            dfin.append(r["D_final"] if r["D_final"] is not None and math.isfinite(r["D_final"]) else float("inf"))
        finite = [(a, b) for a, b in zip(ramp, dfin) if math.isfinite(b)]
        rho, p = spearman_exact([a for a, _ in finite], [b for _, b in finite]) if len(finite) >= 3 else (float("nan"), None)
        rows.append((model, sel["k_star"], len(finite), rho, p))
        kk = [k for k in ks if k in safe and res[model].get(f"expk{k}{tag}")]
        ax.plot(kk, [abs(v) if math.isfinite(v) else float("nan") for v in dfin], "o-", color="C0", label="|D_final| (measured)")
        ax.set_yscale("log")
        ax.set_xlabel("k")
        ax.set_ylabel("|D_final|", color="C0")
        ax2 = ax.twinx()
        ax2.plot(kk, ramp, "s--", color="C3", label="R_amp(k)")
        ax2.set_yscale("log")
        ax2.set_ylabel("R_amp(k; H)", color="C3")
        ax.axvline(sel["k_star"], color="gray", ls=":")
        ax.set_title(f"{model}{label}: rho = {rho:.3f}, p_perm = {p if p is None else round(p, 3)} (n = {len(finite)})")
    fig.tight_layout()
    path = os.path.join(figdir, f"figure3{tag}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, rows


def figure5(pl, figdir):
    plt = pyplot()
    P = pl.P
    model = P["models"][0]
    pts = []
    for s in range(P["ckpt_every"], P["pre"] + 1, P["ckpt_every"]):
        f = os.path.join(pl.d(model, f"prof_{s:06d}"), "profile.json")
        if not os.path.exists(f):
            continue
        _, hists = es.load_profile(f)
        H = es.pooled(hists)
        sel = es.select(H, 0, K_MAX)
        pts.append((s, H, sel))
    if not pts:
        return None, []
    held, rows = None, []
    for s, H, sel in pts:
        reassess = False
        if held is None:
            held, reassess = sel["k_star"], True
        else:
            h = es.select(H, 0, K_MAX, held=held)
            if not h["hold"]:
                held, reassess = sel["k_star"], True
        within = [k for k, v in sel["r_amp"].items() if v <= 1.25 * sel["r_min"]]
        excess = sel["r_amp"][held] / sel["r_min"] - 1 if held in sel["r_amp"] else float("nan")
        rows.append((s, sel["k_star"], held, reassess, min(within), max(within), excess))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    xs = [r[0] for r in rows]
    a1.fill_between(xs, [r[4] for r in rows], [r[5] for r in rows], color="C0", alpha=0.2, label="within 25% of min R_amp")
    a1.plot(xs, [r[1] for r in rows], "o", color="C0", label="k* (pointwise)")
    a1.step(xs, [r[2] for r in rows], where="post", color="C3", label="held k")
    for r in rows:
        if r[3] and r[0] != xs[0]:
            a1.axvline(r[0], color="gray", ls="--")
    a1.axvspan(0, P["warmup"], color="gray", alpha=0.15)
    a1.set_ylabel("k")
    a1.legend(fontsize=8)
    a2.plot(xs, [100 * r[6] for r in rows], "-", color="C3")
    a2.axhline(25, color="gray", ls=":")
    a2.axvspan(0, P["warmup"], color="gray", alpha=0.15)
    a2.set_ylabel("excess risk of held k (%)")
    a2.set_xlabel("training step")
    fig.tight_layout()
    path = os.path.join(figdir, "figure5.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, rows


# -------------------------------------------------------------------- characterize.py: Figure 1
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
        if s in QK_SITES:
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
        if s in QK_SITES:
            lab.set_color("#c53030")
            lab.set_fontweight("bold")
    ax.set_title(f"({letter}) {m['preset']} layer {m['layer']}: propagation, log10 median R_x (forward faults)",
                 fontsize=9)
    cb = fig.colorbar(im, ax=ax, fraction=0.035, pad=0.02, extend="max")
    cb.ax.tick_params(labelsize=7)
    cb.set_label("log10 R_x", fontsize=7)


def make_figures(res, out):
    plt = pyplot()
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
