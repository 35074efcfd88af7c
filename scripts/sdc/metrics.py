"""The metrics of the two drivers, on top of scripts/sdc_metrics.py.

scripts/reproduce.py: a run of the plan against the fault-free run (sdc_metrics.compare), with the forward
events it detected (its step replayed) and D_max over the steps where both losses are finite.

scripts/characterize.py: metrics of a faulty run against the clean reference (aligned on the steps C+1..S of
the fault window):
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
  tensor that became non-finite, counts as +inf)."""
import json
import math
import os

import numpy as np

import sdc_metrics as sm

from . import Error
from .plan import SITES, job_done, job_done_dir, read_plan, read_settings


# ----------------------------------------- reproduce.py: a run against the fault-free reference
def detection(d):
    """forward events detected (the event's step was replayed), by site; dead = every flipped element in
    the masked attention triangle (harmless)"""
    st = sm.read_log(d).steps
    ev = [json.loads(l) for l in open(os.path.join(d, "faults.jsonl"))] if os.path.exists(os.path.join(d, "faults.jsonl")) else []
    fwd = [e for e in ev if e["pass"] == "fwd"]
    det = [e for e in fwd if st.get(e["step"], {}).get("replayed", 0)]
    missed = [e for e in fwd if not st.get(e["step"], {}).get("replayed", 0)]
    rep_all = sum(1 for e in ev if st.get(e["step"], {}).get("replayed", 0))
    dead = sum(1 for e in ev if not st.get(e["step"], {}).get("replayed", 0) and e.get("live", e["m"]) == 0)
    return dict(n_ev=len(ev), n_fwd=len(fwd), fwd_det=len(det), missed=missed, detected_any=rep_all, dead=dead,
                false=sum(1 for s, r in st.items() if r.get("replayed") and r.get("injections", 0) == 0))


def evaluate(pl, model, name):
    """the metrics of run `name` of `model` against the fault-free run (sdc_metrics.compare) and its detections"""
    d = pl.d(model, name)
    r = sm.compare(pl.d(model, "clean"), d, window_start=pl.P["pre"] + 1)
    r.update(detection(d))
    r["det"] = sm.detection(d)
    st = sm.read_log(d).steps
    r["found_inf"] = sum(1 for x in st.values() if x.get("found_inf"))
    # D_max over the steps where both losses are finite, and how many were not (sm's D_max is +inf
    # after a single non-finite step, which hides everything else)
    cl = sm.read_log(pl.d(model, "clean")).steps
    t_f = pl.P["pre"] + 1
    ds = [st[t]["loss"] - cl[t]["loss"] for t in st if t >= t_f and t in cl
          and math.isfinite(st[t]["loss"]) and math.isfinite(cl[t]["loss"])]
    r["D_max_finite"] = max(ds) if ds else None
    r["nonfinite_steps"] = sum(1 for t in st if t >= t_f and not math.isfinite(st[t]["loss"]))
    return r


def results(pl, skip):
    """{model: {run: metrics}} of every finished run of the plan but the LLMFT training run and those whose
    name starts with one of `skip`"""
    res = {}
    for model in pl.P["models"]:
        res[model] = {}
        for j in pl.jobs:
            mname, name = j["name"].split("/", 1)
            if mname != model or not job_done(j) or name.startswith(skip) or name == "llmft_train":
                continue
            res[model][name] = evaluate(pl, model, name)
    return res


def run_ok(r):
    """the final model evaluated to a finite held-out loss (else PPL and Top-1 mean nothing: '-')"""
    return r.get("delta_ppl") is not None and math.isfinite(r["delta_ppl"])


def res_get(pl, model, name):
    if not job_done_dir(pl, model, name):
        return None
    try:
        return evaluate(pl, model, name)
    except sm.MetricsError:
        return None


def envelope_of(pl, model):
    reps = [pl.d(model, n) for n in ("clean", "clean_p1", "clean_m1") if job_done_dir(pl, model, n)]
    return sm.envelope_all(reps, window_start=pl.P["pre"] + 1) if len(reps) >= 2 else None


def regime_rows(pl):
    """how fast the clean loss falls in the window, the held-out loss along the way (base model, common
    checkpoint, end), and what one lost update costs (the control)"""
    P = pl.P
    out = []
    for model in P["models"]:
        try:
            st = sm.read_log(pl.d(model, "clean")).steps
        except sm.MetricsError:
            continue
        a, b = P["pre"] + 1, P["pre"] + P["window"]
        first = [st[s]["loss"] for s in range(a, a + 20) if s in st]
        last = [st[s]["loss"] for s in range(b - 19, b + 1) if s in st]
        lr = (st[a]["lr"], st[b]["lr"]) if a in st and b in st else (None, None)
        val = {}
        for name, key in (("base", "base"), ("pre", "start"), ("clean", "end")):
            try:
                ev = sm.read_log(pl.d(model, name)).evals
                val[key] = ev[max(ev)]["val_loss"] if ev else None
            except sm.MetricsError:
                val[key] = None
        m = P["m"][model][0]
        c = res_get(pl, model, f"control_m{m}")
        out.append((model, sum(first) / max(len(first), 1), sum(last) / max(len(last), 1), lr, val, c))
    return out


def spearman_exact(x, y):
    """Spearman's rho and the exact two-sided permutation p (all n! orders; n <= 9)"""
    import itertools
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    def rho(a, b):
        ma, mb = sum(a) / n, sum(b) / n
        num = sum((p - ma) * (q - mb) for p, q in zip(a, b))
        den = math.sqrt(sum((p - ma) ** 2 for p in a) * sum((q - mb) ** 2 for q in b))
        return num / den if den else 0.0
    r0 = rho(rx, ry)
    if n > 9:
        return r0, None
    cnt = tot = 0
    for perm in itertools.permutations(ry):
        tot += 1
        if abs(rho(rx, list(perm))) >= abs(r0) - 1e-12:
            cnt += 1
    return r0, cnt / tot


# --------------------------------------------------------- characterize.py: Experiments 1 and 2
def fnum(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def run_metrics(clean_log, run_dir, t0, env):
    """Experiment 1 metrics of one run against the clean reference (see this module's doc)."""
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
