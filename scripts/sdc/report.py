"""The prose around the tables and figures: REPORT.md of scripts/reproduce.py (the full and the reduced plan),
results.md and results.json of scripts/characterize.py."""
import json
import math
import os
import subprocess
import time

import numpy as np

import sdc_metrics as sm

from . import ROOT
from .figures import figure3, figure5, make_figures
from .metrics import collect, fnum, regime_rows, results, trace_columns
from .plan import RESIDUAL_SITES, SEED_EVAL, SEED_FIG3, SEED_LLMFT, QK_SITES, fig3_candidates, mpi_ready
from .runner import say
from .tables import (PAPER_FIG3, exp1_table, exp2_table, f_e, f_f, fig3_table, fmt, fmt_ratio, paper_t6, table1, table2,
                     table3, table5, table6, table_fidelity, table_honest, table_peers)


# --------------------------------------------------------------------------------- reproduce.py
def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def figure_dir(pl):
    """where the figures go (--report-dir/figures, else beside the runs), made if missing"""
    figdir = os.path.join(pl.a.report_dir, "figures") if pl.a.report_dir else os.path.join(pl.out, "figures")
    os.makedirs(figdir, exist_ok=True)
    return figdir


def link(pl, path):
    """a figure's path as the report links it (relative to the report's folder)"""
    return os.path.relpath(path, os.path.dirname(os.path.abspath(pl.a.report)))


def write_report(pl, L):
    """REPORT.md from its lines L, with the hand-written reading of this preset's run (docs/report_reading_<preset>.md)
    at the end when there is one; written whole or not at all"""
    notes = os.path.join(ROOT, "docs", f"report_reading_{pl.a.preset}.md")
    if os.path.exists(notes):
        L.append("\n## Reading\n")
        L.append(f"(Written by hand from this run: `{os.path.relpath(notes, ROOT)}`.)\n")
        L.append(open(notes).read().strip())
    txt = "\n".join(L) + "\n"
    tmp = pl.a.report + ".tmp"
    open(tmp, "w").write(txt)
    os.replace(tmp, pl.a.report)
    say(f"report {pl.a.report}")


def regime_lines(pl):
    """the report's lines on the continuation regime (both plans)"""
    L = []
    for model, l0, l1, lr, val, c in regime_rows(pl):
        per = f"{c['mean_dev_lastK'] / c['lost_updates']:.2e}" if c and c["lost_updates"] else "-"
        vals = " -> ".join(f"{val[k]:.4f} ({lab})" for k, lab in (("base", "base model"), ("start", "common checkpoint"),
                                                                   ("end", "end of the window")) if val.get(k) is not None)
        L.append(f"- {model}: clean training loss {l0:.4f} (mean of the window's first 20 steps) -> {l1:.4f} (last 20): "
                 f"{100 * (l0 - l1) / l0:.2f}% over {pl.P['window']} steps; lr {lr[0]:.2e} -> {lr[1]:.2e}" +
                 (f"; held-out loss {vals}" if vals else "") +
                 (f"; the lost-step control skipping {c['lost_updates']} updates ends with a mean deviation of "
                  f"{c['mean_dev_lastK']:+.2e} over the last 50 steps ({per} a lost update)" if c else "") +
                 (f" and a held-out loss difference of {c['delta_val_loss']:+.2e}" if c and c.get("delta_val_loss") is not None else ""))
    return L


def report(pl, args_line):
    P = pl.P
    res = results(pl, skip=("pre", "prof_", "alpha", "peers", "profile", "clean"))
    oh = {m: json.load(open(os.path.join(pl.out, m, "overhead.json"))) for m in P["models"]
          if os.path.exists(os.path.join(pl.out, m, "overhead.json"))}
    figdir = figure_dir(pl)
    f3, f3rows = figure3(pl, res, figdir)
    f5, f5rows = figure5(pl, figdir)
    t6, miss, tot = table6(pl, res, "ours")
    t6a, missa, tota = table6(pl, res, "ours_att")
    L = []
    L.append(f"# Reproduction of the TrainSDC evaluation: preset `{pl.a.preset}`\n")
    L.append(f"Made by `{args_line}` on {time.strftime('%Y-%m-%d')} ({pl.a.machine}), report written at commit {git_commit()}.\n")
    L.append("## Settings\n")
    L.append(f"- models: {', '.join(P['models'])}; trainer `{P.get('trainer_shown', P['trainer'])}`, {P['ranks']} rank(s), B {P['B']} x T {P['T']} x "
             f"accum {P['accum']}, {P['precision']}, AdamW lr {P['lr']} warmup {P['warmup']} cosine to 10%"
             f"{f' over {pl.total} steps' if P.get('base') else ''}, clip 1.0")
    if P.get("base"):
        L.append(f"- the continuation regime: a base model pre-trained for {P['base']} steps (lr {P['base_lr']}, warmup "
                 f"{P['warmup']}, cosine to 10%) is continued with a fresh AdamW at the lr above; steps are counted from the start "
                 "of the continuation")
    L.append(f"- common checkpoint at step {P['pre']} (clean training; its last {P['cal']} steps calibrate the Residual Gain "
             f"Guard and the backward guard); every compared run continues from it for {P['window']} steps (to step {pl.total}) "
             "with the same data order; no fault on the last step")
    L.append(f"- fault campaign: one event a step over the window, site (all 20), pass (forward or backward), layer, rank and "
             f"microbatch drawn, 4 bits flipped in each of m elements of the storage dtype; the same campaign (seed {SEED_EVAL}) in "
             "every compared run")
    ms = "; ".join(f"{m}: {' / '.join(str(x) for x in P['m'][m])}" for m in P["models"])
    L.append(f"- m (corrupted elements an event), low / mid / high: {ms}. The paper's 10 / 1,000 / 100,000 are for tensors of "
             "1024 tokens x 2048 (Llama) or x 1024 (Qwen); the tiny preset keeps 10 and scales 1,000 and 100,000 by the share of "
             "a [tokens, d_model] tensor they are in the paper (4.8% for Llama's 100,000, 9.5% for Qwen's).")
    L.append("- detectors: see llmc/sdc/detect.h and llmc/sdc/attcheck.h (thresholds there and in README.md); LLMFT is trained on "
             f"another campaign (seed {SEED_LLMFT}, m = mid, faults in the last two thirds) plus the clean run, then applied unchanged")
    L.append("- metrics: scripts/sdc_metrics.py (docs/design.md section 8) against the fault-free run; delta-PPL and Top-1 on the "
             f"first {P['eval_tokens']} held-out positions; '-' where the run's loss went non-finite (as the paper)\n")
    if P.get("base"):
        L.append("## The continuation regime\n")
        L += regime_lines(pl)
        L.append("")
    L.append("## Table 1: evaluation under the transient-fault protocol\n")
    L.append("Each cell: m = low / m = high. Overhead: the change of fault-free CPU time per step (the overhead pass runs the "
             "methods one after another on the whole machine; wall times in the JSON beside the runs). 'fwd events detected': "
             "forward events whose step was replayed.\n")
    L.append(table1(pl, res, oh))
    L.append("\n## Table 2: component ablation\n")
    L.append(table2(pl, res))
    L.append("\n## Table 3: the Residual Gain Guard's alpha\n")
    n_clean = min(P["alpha_clean"], P["window"])
    L.append(f"-protect rgg alone; clean FPR over {n_clean} held-out clean steps after the common checkpoint "
             f"({'the paper: 200; the window of this preset is ' + str(P['window']) + ' steps' if n_clean < 200 else 'as the paper'}); recall "
             f"over {P['alpha_events']} forward events each at m = low and m = high on the residual-path sites ({RESIDUAL_SITES}), "
             "an event detected when its step is replayed.\n")
    L.append(table3(pl))
    tp = table_peers(pl)
    if tp:
        L.append("\n### One process against three ranks (beyond the paper: docs/design.md section 11)\n")
        L.append("The same 3 observations a step (the same token batches: rank r's microbatch is the single process's "
                 "microbatch r), the same calibration file; alpha 2.5.\n")
        L.append(tp)
    elif P["peers"] and not mpi_ready(P["trainer"]):
        L.append(f"\n(One process against three ranks: left out, {mpi_ready.why}.)\n")
    L.append("\n## Table 5: complete-run clean FPR and forward-alarm recall (alpha 2.5)\n")
    L.append(table5(pl, res))
    L.append("\n## Table 6: missed forward events by injection site (TrainSDC, alpha 2.5)\n")
    L.append(t6)
    L.append("\nWith the cheap attention checks on (`-protect all,att`):\n")
    L.append(t6a)
    L.append("\nThe paper (Table 6, both networks):\n")
    L.append(paper_t6())
    L.append("\n## Figure 3: R_amp(k) against the measured final deviation\n")
    L.append(f"Exponent scaling alone (`-protect exp -expscale_k K`) under backward faults (m = mid, seed {SEED_FIG3}); R_amp from "
             f"the clean exponent profile at the common checkpoint ({P['profile_steps']} steps, 8192 samples a projection a microbatch).\n")
    L.append(f"![Figure 3]({link(pl, f3)})\n")
    L += fig3_table(f3rows)
    L.append(PAPER_FIG3)
    L.append("## Figure 5 (analogue): k* along one run of ours\n")
    if f5:
        L.append(f"Profiles at every pre-training checkpoint of {P['models'][0]} (every {P['ckpt_every']} steps); a held k is "
                 "kept while its R_amp is within 25% of the pointwise minimum, else the run re-profiles and moves to k*.\n")
        L.append(f"![Figure 5]({link(pl, f5)})\n")
        L.append("| step | k* | held k | reassessed | within 25% | excess risk of held k |")
        L.append("|---|---|---|---|---|---|")
        for s, ks, held, re_, lo, hi, ex in f5rows:
            L.append(f"| {s} | {ks} | {held} | {'yes' if re_ else ''} | {lo}..{hi} | {100 * ex:.1f}% |")
    L.append("\n## Beyond the paper\n")
    L.append("| run (TrainSDC) | events | caught (replayed) | harmless (masked triangle only) | W_L2 (%) | D_final |")
    L.append("|---|---|---|---|---|---|")
    for model in P["models"]:
        for name in sorted(res[model]):
            if not (name.startswith("ours") or name.startswith("fwdonly")):
                continue
            r = res[model][name]
            L.append(f"| {model} {name} | {r['n_ev']} ({r['n_fwd']} fwd) | {r['detected_any']} | {r['dead']} | {f_f(r['w_l2_pct'], '{:.3g}')} | "
                     f"{f_e(r['D_final'])} |")
    caught_all = lambda r: r["n_ev"] and r["detected_any"] + r["dead"] == r["n_ev"]
    ours = lambda n: n.startswith(("ours", "fwdonly"))
    exact = [f"{m} {n}" for m in P["models"] for n, r in res[m].items() if caught_all(r) and ours(n)]
    exact0 = [f"{m} {n}" for m in P["models"] for n, r in res[m].items() if caught_all(r) and ours(n) and r["w_l2_pct"] == 0]
    base = [f"{m} {n}" for m in P["models"] for n, r in res[m].items() if caught_all(r) and not ours(n)]
    base0 = [x for x in base if res[x.split()[0]][x.split()[1]]["w_l2_pct"] == 0]
    L.append(f"\n- Exact fault-free reference: {len(exact)} TrainSDC run(s) caught every event that the model reads "
             f"({', '.join(exact) or 'none'}); W_L2 is exactly 0 in {len(exact0)} of them (goal: all). So did "
             f"{len(base)} baseline run(s) ({', '.join(base) or 'none'}; W_L2 = 0 in {len(base0)}): the replay is exact "
             "whichever detector asks for it. The paper's method (`ours`: exponent scaling is its answer to backward events) "
             "detects no backward event: its runs catch them all only in a forward-only campaign (`fwdonly_`) or with the "
             "Inf/NaN or harmful-update guard added, when every backward event overflows (m = high); `-protect all` (`ours_all`) "
             "adds the backward guard and the backward checks.")
    for model in P["models"]:
        if model in oh:
            o = oh[model]
            L.append(f"- overhead ({model}, CPU time): TrainSDC {o['ours']['cpu_pct']:+.2f}%, + attention checks "
                     f"{o['ours_att']['cpu_pct']:+.2f}%; wall {o['ours']['wall_pct']:+.2f}% / {o['ours_att']['wall_pct']:+.2f}%")
    L.append(f"- missed forward events: {tot} without the attention checks, {tota} with them; attention sites "
             f"(att_logits + att_probs) {sum(sum(miss.get(s, [0])) for s in ('att_logits', 'att_probs'))} -> "
             f"{sum(sum(missa.get(s, [0])) for s in ('att_logits', 'att_probs'))}")
    L.append("\n## Beyond the paper: lost updates, the held-out loss and the clean envelope\n")
    L.append(table_honest(pl, res))
    L.append("\n## Fidelity: bf16 storage against autocast's dtypes\n")
    L.append(table_fidelity(pl, res))
    L.append(table_honest(pl, res, "_ac"))
    try:
        f3a, f3arows = figure3(pl, res, figdir, "_ac", " (autocast)")
        L.append(f"\n![Figure 3 (autocast)]({link(pl, f3a)})\n")
        L += fig3_table(f3arows, rho="Spearman rho (autocast)")
    except (OSError, ValueError, sm.MetricsError) as e:
        L.append(f"(Figure 3 under autocast not drawn: {e})")
    write_report(pl, L)


def report_reduced(pl, args_line):
    P = pl.P
    res = results(pl, skip=("pre", "profile", "clean"))
    figdir = figure_dir(pl)
    L = [f"# Reproduction of the TrainSDC evaluation: preset `{pl.a.preset}`\n",
         f"Made by `{args_line}{'' if '--reduced' in args_line else ' --reduced'}` on {time.strftime('%Y-%m-%d')} ({pl.a.machine}), "
         f"report written at commit {git_commit()}.\n",
         "This is the **reduced** tiny plan: what fits a shared 2-core machine in an hour. It runs one model "
         f"({', '.join(P['models'])}) at m = {P['m'][P['models'][0]][0]} only, over a {P['window']}-step window: Table 1's methods "
         "plus `-protect all` and the lost-step control, Table 2 and the Fault / Inf/NaN rows under both fault dtypes, in that "
         f"order of priority, then Figure 3 over {len(fig3_candidates(P))} values of k in both fault dtypes (a run missing below did "
         "not finish in the time); no alpha sweep, peers, Tables 5/6, Figure 5 or overhead pass. The full recipe is `scripts/reproduce.sh --preset tiny` (both models, m = low and high, "
         "every table and figure, both fault dtypes).\n",
         "## Settings\n",
         f"- trainer `{P.get('trainer_shown', P['trainer'])}`, B {P['B']} x T {P['T']} x accum {P['accum']}, {P['precision']}, AdamW lr "
         f"{P['lr']} warmup {P['warmup']} cosine to 10% over {pl.total} steps, clip 1.0",
         f"- common checkpoint at step {P['pre']} (its last {P['cal']} steps calibrate the Residual Gain Guard and the backward "
         f"guard); every compared run continues for {P['window']} steps with the same data order; one fault event a step "
         f"(seed {SEED_EVAL}), none on the last step",
         "- metrics: scripts/sdc_metrics.py; E from the fault-free run and its -perturb +-1 repeats\n",
         "## The continuation regime\n"]
    L += regime_lines(pl)
    L.append("\n## Table 1 at m = low, with the lost-update, held-out and envelope metrics\n")
    L.append(table_honest(pl, res))
    L.append("\n## Fidelity: bf16 storage against autocast's dtypes\n")
    L.append("`-fault_dtype autocast` flips the bits of each site in the dtype PyTorch autocast stores it in (fp32: the "
             "residual stream, the RMSNorm outputs, q/k after the QK norm and RoPE, the attention logits and probabilities, and "
             "their gradients; bf16: every projection output, the attention output, SiLU and the MLP product; README).\n")
    L.append(table_fidelity(pl, res))
    L.append("\nThe same rows' lost-update, held-out and envelope metrics under autocast:\n")
    L.append(table_honest(pl, res, "_ac"))
    L.append("\n## Figure 3: R_amp(k) against the measured final deviation, both fault dtypes\n")
    if not all(os.path.exists(os.path.join(pl.d(m, "profile"), "profile.json")) for m in P["models"]):
        L.append("Not run in the reduced plan (it needs a profile and 9 exponent-scaling runs a fault dtype); the full "
                 "plan (`scripts/reproduce.sh --preset tiny`) draws it for both fault dtypes.")
    for tag, lab in (("", " (bf16 storage)"), ("_ac", " (autocast)")) if "Not run" not in L[-1] else ():
        try:
            f3, rows = figure3(pl, res, figdir, tag, lab)
        except (OSError, ValueError, sm.MetricsError) as e:
            L.append(f"(Figure 3{lab} not drawn: {e})")
            continue
        L.append(f"![Figure 3{lab}]({link(pl, f3)})\n")
        L += fig3_table(rows, dtype=lab.strip(" ()"))
        L.append("")
    L.append(PAPER_FIG3)
    write_report(pl, L)


# ------------------------------------------------------------------------------ characterize.py
MODEL_TITLE = {"llama": "Llama family", "nanochat": "nanochat family"}


def summary_lines(res, model):
    """the rankings a reader checks O1 and O2 against"""
    L = []
    rows = [r for r in res["runs"] if r["model"] == model and r["kind"] == "fault"]
    fwd = [r for r in rows if r["pass"] == "fwd"]
    bwd = [r for r in rows if r["pass"] == "bwd"]

    def rank(rs, key, n=6):
        good = [r for r in rs if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
        good.sort(key=lambda r: -r[key])
        return ", ".join(f"{r['site']}{'*' if r['site'] in QK_SITES else ''} {fmt_ratio(r[key])}" for r in good[:n])

    def med(rs, key):
        v = [r[key] for r in rs if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
        return float(np.median(v)) if v else None

    if fwd:
        L.append(f"- forward, largest D_final/E_final: {rank(fwd, 'ratio_final')}")
        L.append(f"- forward, largest D_max/E_max: {rank(fwd, 'ratio_max')}")
        qk = [r for r in fwd if r["site"] in QK_SITES]
        rest = [r for r in fwd if r["site"] not in QK_SITES]
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
                 ", ".join(f"{s}{'*' if s in QK_SITES else ''} {fmt(v, '{:.2g}')}" for v, s in parts))
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
        L += exp1_table(res, model)
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
            L += exp2_table(tr, cols)
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
