"""The tables: the paper's Tables 1, 2, 3, 5, 6 with the paper's numbers beside ours, and the tables beyond the
paper (scripts/reproduce.py); the number formats of both drivers (scripts/characterize.py)."""
import math
import os

import sdc_metrics as sm

from .metrics import detection, envelope_of, fnum, run_ok
from .plan import ABLATION, ALPHAS, EXTRA, METHODS, QK_SITES


# ------------------------ the paper's numbers (Tables 1, 2, 3, 5, 6; "-" where it reports none)
# the paper's numbers (Tables 1, 2, 3, 5, 6; "-" where it reports none)
PAPER_T1 = {
    "Llama 3.2-1B": {"Fault": ("0.00 / 0.00", "+1.72e-2 / nonfinite", "1.23e-1 / nonfinite", "4.04 / -", "94.20 / -", "0.69 / -"),
                     "Loss spike": ("~0 / ~0", "+1.72e-2 / +1.15e-1", "1.24e-1 / 2.84e-1", "4.03 / 27.60", "94.40 / 82.60", "0.692 / 2.10"),
                     "Inf/NaN": ("~0 / ~0", "+1.72e-2 / +1.18e-1", "1.23e-1 / 4.28e-1", "4.04 / 28.60", "94.20 / 82.20", "0.69 / 2.15"),
                     "ATTNChecker": ("7.65 / 7.65", "+1.75e-2 / +1.07e-1", "3.73e-2 / 3.86e-1", "4.07 / 25.40", "94.30 / 83.40", "0.692 / 2.00"),
                     "Harmful-update": ("12.10 / 12.10", "+1.08e-2 / +5.37e-3", "1.15e-1 / 1.57e-1", "2.49 / 1.25", "95.00 / 96.90", "0.510 / 0.480"),
                     "LLMFT": ("13.50 / 13.50", "+1.68e-2 / +9.43e-2", "9.37e-2 / 2.42e-1", "3.86 / 22.20", "94.50 / 84.60", "0.679 / 1.84"),
                     "TrainSDC (ours)": ("1.65 / 1.65", "-3.86e-5 / +6.32e-4", "2.86e-4 / 9.14e-3", "-3.37e-3 / 0.173", "99.10 / 98.60", "2.83e-2 / 0.149")},
    "Qwen3 0.6B": {"Fault": ("0.00 / 0.00", "+2.30e-2 / nonfinite", "9.65e-2 / nonfinite", "5.43 / -", "93.10 / -", "0.69 / -"),
                   "Loss spike": ("~0 / ~0", "+2.17e-2 / +1.25e-1", "9.59e-2 / 2.82e-1", "5.24 / 36.30", "93.60 / 81.80", "0.677 / 2.60"),
                   "Inf/NaN": ("~0 / ~0", "+2.30e-2 / +1.27e-1", "9.65e-2 / 3.21e-1", "5.43 / 36.90", "93.10 / 81.70", "0.690 / 2.67"),
                   "ATTNChecker": ("36.70 / 36.70", "+2.10e-2 / +1.26e-1", "2.67e-2 / 2.93e-1", "5.06 / 37.10", "93.70 / 81.70", "0.656 / 2.69"),
                   "Harmful-update": ("11.20 / 11.20", "+1.39e-2 / +3.82e-3", "8.85e-2 / 1.56e-1", "3.24 / 1.14", "94.50 / 97.90", "0.471 / 0.361"),
                   "LLMFT": ("5.62 / 5.62", "+2.17e-2 / +1.05e-1", "7.06e-2 / 2.48e-1", "5.33 / 29.50", "93.60 / 84.20", "0.676 / 2.25"),
                   "TrainSDC (ours)": ("6.76 / 6.76", "+3.87e-6 / +6.15e-4", "2.22e-4 / 1.48e-2", "-1.25e-3 / 0.175", "99.10 / 98.80", "2.16e-2 / 0.109")},
}
PAPER_T2 = {"Llama": {"Q/K path only": ("+1.69e-2 / +9.03e-2", "4.00 / 21.70"), "Residual only": ("+1.44e-2 / +9.02e-2", "3.37 / 21.40"),
                      "Exponent scaling only": ("+3.03e-4 / Inf", "7.28e-2 / -"), "Complete": ("-3.86e-5 / +6.32e-4", "-3.37e-3 / 0.173")},
            "Qwen": {"Q/K path only": ("+2.15e-2 / +1.02e-1", "5.22 / 28.50"), "Residual only": ("+1.98e-2 / +1.04e-1", "4.59 / 29.10"),
                     "Exponent scaling only": ("+1.12e-3 / Inf", "0.250 / -"), "Complete": ("+3.87e-6 / +6.15e-4", "-1.25e-3 / 0.175")}}
PAPER_T3 = {"Llama 3.2-1B": ["33/200 (16.5%) | 48/48 | 48/48", "3/200 (1.5%) | 17/48 | 41/48", "1/200 (0.5%) | 17/48 | 41/48",
                             "0/200 (0%) | 17/48 | 41/48", "0/200 (0%) | 17/48 | 41/48"],
            "Qwen3-0.6B": ["17/200 (8.5%) | 7/48 | 32/48", "0/200 (0%) | 7/48 | 32/48", "0/200 (0%) | 7/48 | 32/48",
                           "0/200 (0%) | 7/48 | 32/48", "0/200 (0%) | 7/48 | 32/48"]}
PAPER_T5 = {"Llama 3.2-1B": ("1/814 (0.12%)", "175/403 (43.42%)", "338/403 (83.87%)", "348/403 (86.35%)", "861/1209 (71.22%)"),
            "Qwen3-0.6B": ("0/814 (0%)", "165/403 (40.94%)", "279/403 (69.23%)", "316/403 (78.41%)", "760/1209 (62.86%)")}
PAPER_T6 = [("Attention weights", "att_probs", 45, 45, 45), ("Attention logits", "att_logits", 32, 32, 32),
            ("Down projection", "down_proj", 39, 28, 20), ("Attention residual", "attn_residual", 28, 28, 27),
            ("Pre-o attention output", "att_out", 42, 17, 8), ("Output projection", "o_proj", 25, 21, 10),
            ("Input RMSNorm", "attn_norm", 48, 0, 0), ("SiLU output", "act", 37, 7, 0), ("Up projection", "up_proj", 35, 1, 0),
            ("Gate projection", "gate_proj", 32, 3, 0), ("Post-attention RMSNorm", "mlp_norm", 33, 0, 0),
            ("Gated MLP product", "mlp_product", 27, 3, 0), ("Value projection", "v_proj", 25, 3, 1),
            ("Block output", "block_out", 18, 1, 0)]


# ------------------------------------------------------------------------------- number formats
def f_f(x, fmt="{:.2f}"):
    """REPORT.md's number: '-' for none, 'nonfinite' for Inf/NaN"""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "nonfinite"
    return fmt.format(x)


def f_e(x, sign=True):
    return f_f(x, "{:+.2e}" if sign else "{:.2e}")


def xe(x, e, fmt="{:+.2e}"):
    """x and, when the clean envelope E is known, |x| / E"""
    s = f_f(x, fmt)
    if x is None or e is None or (isinstance(x, float) and not math.isfinite(x)):
        return s
    return s + (f" ({abs(x) / e:.2g}E)" if e > 0 else (" (0E)" if x == 0 else " (inf E)"))


def pair(a, b):
    return f"{a} / {b}"


def dmax_cell(r):
    x = f_e(r["D_max_finite"], False)
    return x + (f" ({r['nonfinite_steps']} nf)" if r["nonfinite_steps"] else "")


def fmt(x, f="{:+.3e}"):
    """results.md's number: sdc_metrics' format ('n/a' for none, +inf, -inf), NaN spelled out"""
    return "NaN" if isinstance(x, float) and math.isnan(x) else sm._f(x, f)


def fmt_ratio(x):
    if x is None:
        return "n/a"
    if not fnum(x):
        return fmt(x)
    return f"{x:+.3g}" if abs(x) < 1e4 else f"{x:+.2e}"


# --------------------------------------------------------------------------------- reproduce.py
def table1(pl, res, oh):
    P = pl.P
    lines = []
    for model in P["models"]:
        lo, _, hi = P["m"][model]
        lines.append(f"\n**{model}** (m = {lo} / {hi} corrupted elements an event; overhead on fault-free steps, CPU time)\n")
        lines.append("| Method | Overhead (%) | D_final | D_max (nf: steps with a non-finite loss) | delta-PPL | Top-1 (%) | W_L2 (%) | fwd events detected |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for key, label, _ in METHODS + EXTRA:
            a, b = res[model].get(f"{key}_m{lo}"), res[model].get(f"{key}_m{hi}")
            if a is None or b is None:
                continue
            o = oh[model].get(key if key != "fault" else "none", {}).get("cpu_pct") if oh.get(model) else None
            o = 0.0 if key == "fault" else o
            cells = [pair(f_f(o), f_f(o)), pair(f_e(a["D_final"]), f_e(b["D_final"])), pair(dmax_cell(a), dmax_cell(b)),
                     pair(f_f(a["delta_ppl"], "{:.3g}") if run_ok(a) else "-", f_f(b["delta_ppl"], "{:.3g}") if run_ok(b) else "-"),
                     pair(f_f(100 * a["top1"]) if a["top1"] is not None and run_ok(a) else "-",
                          f_f(100 * b["top1"]) if b["top1"] is not None and run_ok(b) else "-"),
                     pair(f_f(a["w_l2_pct"], "{:.3g}"), f_f(b["w_l2_pct"], "{:.3g}")),
                     pair(f"{a['fwd_det']}/{a['n_fwd']}", f"{b['fwd_det']}/{b['n_fwd']}")]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("\nThe paper (Table 1; 10 / 100,000 elements; A100 x 6):\n")
    lines.append("| Network | Method | Overhead (%) | D_final | D_max | delta-PPL | Top-1 (%) | W_L2 (%) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for net, rows in PAPER_T1.items():
        for label, cells in rows.items():
            lines.append(f"| {net} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table2(pl, res):
    P = pl.P
    lines = ["| Network | Variant | D_final | delta-PPL | found_inf steps | fwd events detected |", "|---|---|---|---|---|---|"]
    for model in P["models"]:
        lo, _, hi = P["m"][model]
        for key, label, _ in ABLATION:
            a, b = res[model].get(f"{key}_m{lo}"), res[model].get(f"{key}_m{hi}")
            if a is None or b is None:
                continue
            lines.append(f"| {model} | {label} | {pair(f_e(a['D_final']), f_e(b['D_final']))} | "
                         f"{pair(f_f(a['delta_ppl'], '{:.3g}') if run_ok(a) else '-', f_f(b['delta_ppl'], '{:.3g}') if run_ok(b) else '-')} | "
                         f"{pair(a['found_inf'], b['found_inf'])} | {pair(str(a['fwd_det']) + '/' + str(a['n_fwd']), str(b['fwd_det']) + '/' + str(b['n_fwd']))} |")
    lines.append("\nThe paper (Table 2; D_final, delta-PPL; 10 / 100,000 elements):\n")
    lines.append("| Network | Variant | D_final | delta-PPL |")
    lines.append("|---|---|---|---|")
    for net, rows in PAPER_T2.items():
        for label, (df, dp) in rows.items():
            lines.append(f"| {net} | {label} | {df} | {dp} |")
    return "\n".join(lines)


def alpha_row(pl, model, prefix):
    P = pl.P
    lo, _, hi = P["m"][model]
    c = sm.read_log(pl.d(model, f"{prefix}_clean")).steps
    clean = [r for s, r in c.items() if s > P["pre"]]
    fp = sum(1 for r in clean if r.get("replayed"))
    out = [f"{fp}/{len(clean)} ({100 * fp / max(len(clean), 1):.1f}%)"]
    for m in (lo, hi):
        d = detection(pl.d(model, f"{prefix}_m{m}"))
        out.append(f"{d['fwd_det']}/{d['n_fwd']} ({100 * d['fwd_det'] / max(d['n_fwd'], 1):.1f}%)")
    return out


def table3(pl):
    P = pl.P
    lines = ["| Network | alpha | Clean step FPR | recall, m = low | recall, m = high |", "|---|---|---|---|---|"]
    for model in P["models"]:
        lo, _, hi = P["m"][model]
        for alpha in ALPHAS:
            try:
                row = alpha_row(pl, model, f"alpha{alpha}")
            except (sm.MetricsError, OSError):
                continue
            lines.append(f"| {model} (m = {lo} / {hi}) | {alpha} | " + " | ".join(row) + " |")
    lines.append("\nThe paper (Table 3; clean FPR on 200 steps | 10-element recall | 100,000-element recall):\n")
    lines.append("| Network | alpha | FPR / recall / recall |")
    lines.append("|---|---|---|")
    for net, rows in PAPER_T3.items():
        for alpha, r in zip(ALPHAS, rows):
            lines.append(f"| {net} | {alpha} | {r} |")
    return "\n".join(lines)


def table_peers(pl):
    P = pl.P
    model = P["models"][0]
    if not os.path.isdir(pl.d(model, "peers_ranks_clean")):
        return None
    lo, _, hi = P["m"][model]
    lines = [f"| {model}, alpha 2.5 | Clean step FPR | recall, m = {lo} | recall, m = {hi} |", "|---|---|---|---|",
             "| 1 process x 3 microbatches (peers: the other microbatches) | " + " | ".join(alpha_row(pl, model, "alpha2.5")) + " |",
             "| 3 MPI ranks x 1 microbatch (peers: the other ranks) | " + " | ".join(alpha_row(pl, model, "peers_ranks")) + " |"]
    return "\n".join(lines)


def table5(pl, res):
    P = pl.P
    lines = ["| Network | Clean alarms | m = low | m = mid | m = high | All fault runs |", "|---|---|---|---|---|---|"]
    for model in P["models"]:
        ms = P["m"][model]
        c = sm.read_log(pl.d(model, "clean_prot")).steps
        fp = sum(1 for s, r in c.items() if s > P["pre"] and r.get("replayed"))
        cells = [f"{fp}/{len(c)} ({100 * fp / max(len(c), 1):.2f}%)"]
        tot_d = tot_n = 0
        for m in ms:
            r = res[model][f"ours_m{m}"]
            cells.append(f"{r['fwd_det']}/{r['n_fwd']} ({100 * r['fwd_det'] / max(r['n_fwd'], 1):.1f}%) [m={m}]")
            tot_d += r["fwd_det"]; tot_n += r["n_fwd"]
        cells.append(f"{tot_d}/{tot_n} ({100 * tot_d / max(tot_n, 1):.1f}%)")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
        # with the attention checks
        cells = ["-"]
        tot_d = tot_n = 0
        for m in ms:
            r = res[model][f"ours_att_m{m}"]
            cells.append(f"{r['fwd_det']}/{r['n_fwd']} ({100 * r['fwd_det'] / max(r['n_fwd'], 1):.1f}%)")
            tot_d += r["fwd_det"]; tot_n += r["n_fwd"]
        cells.append(f"{tot_d}/{tot_n} ({100 * tot_d / max(tot_n, 1):.1f}%)")
        lines.append(f"| {model} + attention checks | " + " | ".join(cells) + " |")
    lines.append("\nThe paper (Table 5; 10 / 1,000 / 100,000 elements):\n")
    lines.append("| Network | Clean alarms | 10 | 1,000 | 100,000 | All fault runs |")
    lines.append("|---|---|---|---|---|---|")
    for net, cells in PAPER_T5.items():
        lines.append(f"| {net} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table6(pl, res, key):
    P = pl.P
    miss = {}
    dead = 0
    for model in P["models"]:
        for i, m in enumerate(P["m"][model]):
            for e in res[model][f"{key}_m{m}"]["missed"]:
                if e.get("live", e["m"]) == 0:
                    dead += 1
                    continue
                miss.setdefault(e["site"], [0, 0, 0])[i] += 1
    total = sum(sum(v) for v in miss.values())
    lines = ["| Injection site | m = low | m = mid | m = high | Total | Share (%) |", "|---|---|---|---|---|---|"]
    for site, v in sorted(miss.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {site} | {v[0]} | {v[1]} | {v[2]} | {sum(v)} | {100 * sum(v) / max(total, 1):.2f} |")
    qk = sum(sum(v) for s, v in miss.items() if s in QK_SITES)
    lines.append(f"| All protected Q/K-path targets | | | | {qk} | {100 * qk / max(total, 1):.2f} |")
    lines.append(f"\n{total} missed forward events (both models, three intensities); {dead} more events fell wholly in the "
                 "masked attention triangle (never read by the model: harmless, not counted).")
    return "\n".join(lines), miss, total


def fig3_table(rows, rho="Spearman rho", dtype=None):
    """Figure 3's numbers: k*, n, Spearman's rho and its exact p a network (rows from figures.figure3), with a
    column naming the fault dtype when `dtype` is given"""
    col = "" if dtype is None else " fault dtype |"
    L = [f"| Network |{col} k* | n | {rho} | exact p_perm |", "|---" * (5 if dtype is None else 6) + "|"]
    for model, ks, n, r, p in rows:
        cell = "" if dtype is None else f" {dtype} |"
        L.append(f"| {model} |{cell} {ks} | {n} | {r:.3f} | {'-' if p is None else f'{p:.3f}'} |")
    return L


PAPER_FIG3 = "\nThe paper: rho = 0.650, p_perm = 0.067 (Llama-3.2-1B), rho = 0.867, p_perm = 0.005 (Qwen3-0.6B), n = 9; k = 15.\n"


def paper_t6():
    lines = ["| Injection site | 10 | 1,000 | 100,000 | Total |", "|---|---|---|---|---|"]
    for label, site, a, b, c in PAPER_T6:
        lines.append(f"| {label} ({site}) | {a} | {b} | {c} | {a + b + c} |")
    return "\n".join(lines)


HONEST_ROWS = [(k, lab) for k, lab, _ in METHODS] + [("ours_all", "-protect all (ours)")] + \
              [("control", "clean, skipping the Fault run's lost updates")]


def table_honest(pl, res, tag=""):
    """every method at each m with the metrics beyond the paper's (lost updates, the held-out loss, the detections by kind), each deviation against the clean envelope"""
    P = pl.P
    L = []
    for model in P["models"]:
        E = envelope_of(pl, model) or {}
        for m in sorted({x for x in P["m"][model][:1] + P["m"][model][2:]}):
            rows = [(lab, res[model].get(f"{k}{tag}_m{m}")) for k, lab in HONEST_ROWS]
            rows = [(lab, r) for lab, r in rows if r is not None]
            if not rows:
                continue
            L.append(f"\n**{model}, m = {m}{' (-fault_dtype autocast)' if tag else ''}**\n")
            L.append("| Method | D_final | mean D, last 50 steps | held-out loss diff | delta-PPL | lost updates | "
                     "events the model reads caught | Q/K-path events caught | found_inf | replayed | W_L2 (%) |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for lab, r in rows:
                det = r["det"]
                L.append(f"| {lab} | {xe(r['D_final'], E.get('E_final'))} | {xe(r['mean_dev_lastK'], E.get('E_lastK'))} | "
                         f"{xe(r.get('delta_val_loss'), E.get('E_val'))} | {xe(r.get('delta_ppl'), E.get('E_ppl'), '{:+.3g}')} | "
                         f"{r['lost_updates']} | {det['caught_read']}/{det['read']} | {det['qk_caught']}/{det['qk']} | "
                         f"{det['found_inf']} | {det['replayed']} | {f_f(r['w_l2_pct'], '{:.3g}')} |")
        if E:
            L.append(f"\nClean envelope ({E['n_clean']} fault-free runs: the reference and -perturb +-1 bf16 ulp): E_final "
                     f"{E['E_final']:.2e}, E_last50 {E['E_lastK']:.2e}, E_val {f_e(E['E_val'], False)}, E_ppl "
                     f"{f_e(E['E_ppl'], False)}; (xE) = |deviation| / E, inside the envelope when <= 1.")
    return "\n".join(L)


def table_fidelity(pl, res):
    """Fault against Inf/NaN, and Table 2, in the storage dtype (bf16) and under autocast's dtypes"""
    P = pl.P
    L = ["| Network | fault dtype | Method | D_final | D_max (nf) | delta-PPL | found_inf steps | lost updates | "
         "Fault row = Inf/NaN row |", "|---|---|---|---|---|---|---|---|---|"]
    for model in P["models"]:
        m = P["m"][model][0]
        for tag, dt in (("", "bf16 (storage)"), ("_ac", "autocast")):
            a, b = res[model].get(f"fault{tag}_m{m}"), res[model].get(f"nan{tag}_m{m}")
            same = "-" if a is None or b is None else ("yes" if a["D_final"] == b["D_final"] and a.get("delta_ppl") == b.get("delta_ppl") else "no")
            for key, lab in (("fault", "Fault"), ("nan", "Inf/NaN"), ("qk", "Q/K path only"), ("rgg", "Residual only"),
                             ("exp", "Exponent scaling only"), ("ours", "Complete (paper)"), ("ours_all", "-protect all")):
                r = res[model].get(f"{key}{tag}_m{m}")
                if r is None:
                    continue
                L.append(f"| {model} (m = {m}) | {dt} | {lab} | {f_e(r['D_final'])} | {dmax_cell(r)} | "
                         f"{f_f(r['delta_ppl'], '{:.3g}') if run_ok(r) else '-'} | {r['found_inf']} | {r['lost_updates']} | "
                         f"{same if key in ('fault', 'nan') else ''} |")
    return "\n".join(L)


# ------------------------------------------------------------------------------ characterize.py
def exp1_table(res, model):
    """Experiment 1: a row a run of `model` (the clean repeats, then every site and pass)"""
    L = ["| pass | site | events (Inf/NaN) | non-finite steps | skipped updates | D_final | D_max | "
         "D_final/E_final | D_max/E_max | ΔPPL | Top-1 % | W_L2 % |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in [r for r in res["runs"] if r["model"] == model]:
        if r["kind"] == "repeat":
            name, pas = f"clean, -perturb {r['perturb']}", "-"
        else:
            name, pas = r["site"] + (" *" if r["site"] in QK_SITES else ""), r["pass"]
        L.append(f"| {pas} | {name} | {len(r['events'])} ({r['events_nonfinite']}) | {len(r['nonfinite_steps'])} | "
                 f"{r['found_inf']} | {fmt(r['D_final'])} | {fmt(r['D_max'])} | {fmt_ratio(r['ratio_final'])} | "
                 f"{fmt_ratio(r['ratio_max'])} | {fmt(r['delta_ppl'], '{:+.4g}')} | "
                 f"{fmt(None if r['top1'] is None else 100 * r['top1'], '{:.2f}')} | {fmt(r['w_l2_pct'], '{:.3g}')} |")
    return L


def exp2_table(runs, cols):
    """Experiment 2: log10 of the median R_x a forward run (row) and monitored output (column)"""
    L = ["| injected site | events | " + " | ".join(c[3].replace("\n", " ") for c in cols) + " |",
         "|---|---|" + "---|" * len(cols)]
    for r in runs:
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
        L.append(f"| {r['site']}{' *' if r['site'] in QK_SITES else ''} | {r['trace_events']} | " +
                 " | ".join(cells) + " |")
    return L
