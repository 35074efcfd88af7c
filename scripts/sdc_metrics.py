#!/usr/bin/env python3
"""sdc_metrics: the paper's SDC metrics (TrainSDC Sections 3.1, 3.2, 5.1; docs/design.md) from
train_sdc run directories. numpy only; a module (import sdc_metrics) and a command line tool.

A run directory (-out DIR) holds log.jsonl, faults.jsonl (when injecting), step_NNNNNN.ckpt, and the
argmax predictions (-pred_out FILE; found in DIR as the one token shard whose name contains "pred",
or given with --clean-pred / --fault-pred). Steps are the log's 1-based optimizer step numbers; when a
log holds a step twice (a resumed run appends), the last record wins.

Loss deviation (training loss of the "step" records, aligned step by step; T = the last step both
logs have; t_f = first step of the fault window, by default the first step recorded in the faulty
run's faults.jsonl, else the first aligned step where the two losses differ):
    D(t)    = L_fault(t) - L_clean(t)                       signed, as in the paper
    D_max   = max_{t_f <= t <= T} D(t)
    D_final = D(T)
A step where either loss is NaN or +-inf has D(t) = +inf: the run diverged, and the result says so
(diverged, first_nonfinite_step).

Clean envelope (C >= 2 repeated fault-free runs, e.g. with -perturb; all clean runs of a comparison,
the reference --clean included; aligned on the steps all of them have, T_E the last):
    E_final = max_{i<j} |L_i(T_E) - L_j(T_E)|  = max_i L_i(T_E) - min_i L_i(T_E)
    E_max   = max_{t_f <= t <= T_E} max_{i<j} |L_i(t) - L_j(t)|
Both are ABSOLUTE differences (the paper says "largest pairwise difference"; the sign of a clean pair
has no meaning). A non-finite clean loss makes the difference +inf.
Ratios: D_final / E_final and D_max / E_max. When E = 0 (bitwise-identical repeats) the ratio is
reported as +-inf (sign of D) with a note, or 0 when D = 0 too.

Held-out set (the final "eval" record of each log, which must be at the same step):
    delta_PPL = PPL_fault - PPL_clean        (also delta_val_loss)
Top-1 agreement of the argmax predictions (two files over the same held-out positions):
    top1 = #{i : p_fault[i] == p_clean[i]} / n
Parameter drift (final checkpoints, the same step and model config; every parameter, fp64 sums):
    W_L2 = 100 * ||W - W_clean||_2 / ||W_clean||_2        (percent; per tensor: weight_l2_per_tensor)
Step-time overhead (the "ms" of the step records, steps a .. a+n-1 that both logs have; by default
a = the first logged step + 10 warm-up steps, n = 100):
    overhead = 100 * (mean ms_run / mean ms_base - 1)     (percent)
The paper measures it on fault-free runs (protected vs unprotected).

Beyond the paper: metrics that separate lost progress from corrupted weights.
    mean_dev_lastK = mean of D(t) over the last K aligned steps (K = 50) where both losses are finite
                     (a faulty forward can make one step's logged loss NaN while its update was skipped:
                     mean_dev_lastK_nonfinite counts those; +inf if none is finite): D_final is the loss
                     of one batch, whose step-to-step spread can exceed the effect measured.
    delta_val_loss = val_loss_fault - val_loss_clean at the final eval (the held-out loss difference).
    lost updates   = the steps whose update was lost: skipped (found_inf, or "skip" of the lost-step
                     control -skip_steps; the log's grad_norm is then NaN), plus the steps whose pre-clip
                     gradient norm (the log's grad_norm) exceeded LOST_FACTOR = 100 times the running
                     median: the median of the finite grad_norm of the 2 x 16 nearest other steps of the
                     log (16 on each side where the log has them), so that clipping shrank the real
                     gradient to nothing.
Envelope of every deviation (envelope_all, >= 2 clean runs, e.g. the reference and -perturb repeats):
E_final, E_max as above; E_lastK = max_{i<j} |mean over the last K steps of (L_i - L_j)|; E_val =
max_{i<j} |val_loss_i - val_loss_j| and E_ppl likewise at the final eval. A deviation is "inside the
envelope" when |D| <= E.
Detection (detection(DIR), from faults.jsonl and the step records): events; events the model reads
(live > 0: a flip in the masked attention triangle is never read); of those, caught (the step of the
event was replayed); Q/K-path events (either pass) and how many were caught; false alarms (replayed
steps without an event); qk_fwd / qk_fwd_caught: the forward Q/K-path events alone (what Q/K
recomputation covers; a backward Q/K-path event is the backward guard's).

Propagation trace (-trace_out FILE; records {"step","microbatch","rank","inj_site","inj_layer","site",
"layer","rx","norm_clean"}, R_x = ||x_fault - x_clean||_2 / ||x_clean||_2): for each injected
(site, layer), R_x at the injected tensor itself, at that layer's attn_residual and block_out, at every
later layer's block_out and at lm_output; the median over the events of the trace, a NaN R_x ranking
as +inf (each event's value is kept in the JSON, and the number of non-finite ones). An event whose
clean tensor is already non-finite (norm_clean NaN/inf: the run had diverged before it) says nothing
about propagation; it is left out and counted (n_clean_nonfinite).

Command line (one-line `error: ...` and exit 1 on a missing or malformed file):
    python scripts/sdc_metrics.py compare --clean DIR --fault DIR [--clean-repeat DIR ...]
        [--window-start S] [--clean-pred FILE] [--fault-pred FILE] [--overhead-start S]
        [--overhead-steps N] [--json]
    python scripts/sdc_metrics.py envelope DIR DIR [DIR ...] [--window-start S] [--json]
    python scripts/sdc_metrics.py trace FILE [FILE ...] [--json]
    python scripts/sdc_metrics.py weights CKPT CKPT_CLEAN [--per-tensor] [--json]
    python scripts/sdc_metrics.py overhead --run DIR --base DIR [--start S] [--steps N] [--json]
    python scripts/sdc_metrics.py lost DIR [--factor F] [--steps-only] [--json]
JSON output uses NaN / Infinity for non-finite numbers, as the trainer's logs do (Python's json reads
them).
"""
import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev"))
import tsdc_io  # noqa: E402

OVERHEAD_STEPS = 100
OVERHEAD_WARMUP = 10
LAST_K = 50
LOST_FACTOR = 100.0
LOST_HALF_WINDOW = 16
QK_SITES = ("q_proj", "k_proj", "q_norm", "k_norm", "q_rope", "k_rope")


class MetricsError(ValueError):
    """A missing or malformed input; the message names the file."""


# ---------------------------------------------------------------- reading
def _read_jsonl(path):
    """[(line number, dict)] of a JSONL file; blank lines are skipped."""
    if not os.path.exists(path):
        raise MetricsError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise MetricsError(f"{path}: not a file")
    out = []
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise MetricsError(f"{path}:{no}: malformed JSON line") from None
            if not isinstance(rec, dict):
                raise MetricsError(f"{path}:{no}: not a JSON object")
            out.append((no, rec))
    return out


def _num(path, no, rec, key, kind=float):
    if key not in rec:
        raise MetricsError(f"{path}:{no}: record has no '{key}'")
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MetricsError(f"{path}:{no}: '{key}' is not a number")
    if kind is int:
        if isinstance(v, float) and not v.is_integer():
            raise MetricsError(f"{path}:{no}: '{key}' is not an integer")
        return int(v)
    return float(v)


class RunLog:
    """A parsed log.jsonl. steps: step -> step record; evals: step -> eval record (last record wins)."""

    def __init__(self, path):
        self.path = path
        self.steps, self.evals, self.runs, self.ends = {}, {}, [], []
        for no, rec in _read_jsonl(path):
            typ = rec.get("type")
            if typ == "step":
                s = _num(path, no, rec, "step", int)
                rec = dict(rec)
                rec["loss"] = _num(path, no, rec, "loss")
                self.steps[s] = rec
            elif typ == "eval":
                s = _num(path, no, rec, "step", int)
                rec = dict(rec)
                rec["val_loss"] = _num(path, no, rec, "val_loss")
                rec["ppl"] = _num(path, no, rec, "ppl")
                self.evals[s] = rec
            elif typ == "run":
                self.runs.append(rec)
            elif typ == "end":
                self.ends.append(rec)
        if not self.steps:
            raise MetricsError(f"{path}: no step records")

    def losses(self, steps):
        return np.array([self.steps[s]["loss"] for s in steps], dtype=np.float64)

    def ms(self, s):
        rec = self.steps[s]
        if "ms" not in rec:
            raise MetricsError(f"{self.path}: step {s} has no 'ms'")
        return float(rec["ms"])

    def final_eval(self):
        if not self.evals:
            return None
        return self.evals[max(self.evals)]


def _log_path(d):
    return os.path.join(d, "log.jsonl") if os.path.isdir(d) else d


def read_log(path_or_dir):
    """RunLog of DIR/log.jsonl (or of a log file)."""
    if not os.path.exists(path_or_dir):
        raise MetricsError(f"{path_or_dir}: no such file or directory")
    return RunLog(_log_path(path_or_dir))


def read_faults(path_or_dir):
    """The fault records of DIR/faults.jsonl ([] when the file does not exist)."""
    path = os.path.join(path_or_dir, "faults.jsonl") if os.path.isdir(path_or_dir) else path_or_dir
    if not os.path.exists(path):
        return []
    out = []
    for no, rec in _read_jsonl(path):
        if rec.get("type", "fault") != "fault":
            continue
        _num(path, no, rec, "step", int)
        out.append(rec)
    return out


_CKPT_RE = re.compile(r"^step_(\d+)\.ckpt$")


def final_checkpoint(d):
    """Path of the checkpoint with the highest step in DIR, or None."""
    best = None
    for name in os.listdir(d):
        m = _CKPT_RE.match(name)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), os.path.join(d, name))
    return best[1] if best else None


def find_predictions(d):
    """Path of the predictions file in DIR: the one token shard (magic TSDCTOK) whose name contains
    'pred'; None if there is none."""
    cands = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if "pred" not in name.lower() or name.endswith(".tmp") or not os.path.isfile(p):
            continue
        with open(p, "rb") as f:
            if f.read(8) == tsdc_io.SHARD_MAGIC:
                cands.append(p)
    if len(cands) > 1:
        raise MetricsError(f"{d}: several prediction files ({', '.join(os.path.basename(c) for c in cands)}): "
                           "name one with --clean-pred / --fault-pred")
    return cands[0] if cands else None


def read_predictions(path):
    """The argmax predictions (int64 array) of a -pred_out file."""
    if not os.path.isfile(path):
        raise MetricsError(f"{path}: no such file")
    try:
        preds, _ = tsdc_io.read_shard(path)
    except ValueError as e:
        raise MetricsError(str(e)) from None
    return preds


# ---------------------------------------------------------------- checkpoints (streamed, memory-mapped)
class Checkpoint:
    """A checkpoint's header and its fp32 parameters, memory-mapped (the optimizer state is never read).
    Validates magic, version, size and the parameter count; verify=True also checks the file checksum,
    streamed in chunks, so checkpoints of the 1B models fit."""

    def __init__(self, path, verify=True):
        self.path = path
        if not os.path.isfile(path):
            raise MetricsError(f"{path}: no such file")
        size = os.path.getsize(path)
        H = tsdc_io.CKPT_HEADER
        if size < H + 8:
            raise MetricsError(f"{path}: truncated")
        with open(path, "rb") as f:
            hdr = f.read(H)
        magic, ver, hb = struct.unpack_from("<8sII", hdr, 0)
        if magic != tsdc_io.CKPT_MAGIC or ver != 1 or hb != H:
            raise MetricsError(f"{path}: not a train_sdc checkpoint (magic/version)")
        self.preset = struct.unpack_from("<32s", hdr, 16)[0].split(b"\0")[0].decode(errors="replace")
        self.cfg = dict(zip(tsdc_io.CONFIG_FIELDS_I, struct.unpack_from("<15i", hdr, 48)))
        self.cfg.update(zip(tsdc_io.CONFIG_FIELDS_D, struct.unpack_from("<7d", hdr, 112)))
        (self.n_params,) = struct.unpack_from("<Q", hdr, 168)
        (self.step,) = struct.unpack_from("<q", hdr, 176)
        (self.has_opt,) = struct.unpack_from("<i", hdr, 224)
        expect = H + 4 * self.n_params * (3 if self.has_opt else 1) + 8
        if size != expect:
            raise MetricsError(f"{path}: size {size} bytes, expected {expect} (truncated or corrupt)")
        try:
            self.layout = tsdc_io.param_layout(self.cfg)
        except (KeyError, ValueError) as e:
            raise MetricsError(f"{path}: bad model config ({e})") from None
        if sum(int(np.prod(s)) for _, s in self.layout) != self.n_params:
            raise MetricsError(f"{path}: parameter count {self.n_params} does not match its config")
        if verify:
            (chk,) = struct.unpack("<Q", _read_at(path, size - 8, 8))
            if streamed_checksum(path, size - 8) != chk:
                raise MetricsError(f"{path}: checksum mismatch")
        self.params = np.memmap(path, dtype="<f4", mode="r", offset=H, shape=(self.n_params,))

    def tensors(self):
        """[(name, offset, shape)] in checkpoint order."""
        out, off = [], 0
        for name, shape in self.layout:
            out.append((name, off, shape))
            off += int(np.prod(shape))
        return out


def _read_at(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def streamed_checksum(path, nbytes, chunk_words=1 << 22):
    """tsdc_io.checksum of the first nbytes of a file, without reading it whole into memory."""
    MASK = tsdc_io.MASK
    total = (nbytes * 0x9E3779B97F4A7C15) & MASK
    nwords = nbytes // 8
    words = np.memmap(path, dtype="<u8", mode="r", shape=(nwords,)) if nwords else np.zeros(0, "<u8")
    with np.errstate(over="ignore"):
        for s in range(0, nwords, chunk_words):
            w = np.asarray(words[s:s + chunk_words]).astype(np.uint64)
            idx = np.arange(s + 1, s + 1 + len(w), dtype=np.uint64)
            total = (total + int(tsdc_io._fin(w + idx * tsdc_io.G).sum(dtype=np.uint64))) & MASK
        tail = nbytes - nwords * 8
        if tail:
            b = _read_at(path, nwords * 8, tail) + b"\0" * (8 - tail)
            w = np.frombuffer(b, dtype="<u8").astype(np.uint64)
            t = tsdc_io._fin(w + np.uint64(nwords + 1) * tsdc_io.G)
            total = (total + int(t[0])) & MASK
    return total


def _open_ckpt(c, verify):
    return c if isinstance(c, Checkpoint) else Checkpoint(c, verify)


def _same_model(a, b):
    if a.cfg != b.cfg or a.n_params != b.n_params:
        diff = [k for k in a.cfg if a.cfg[k] != b.cfg.get(k)]
        raise MetricsError(f"{a.path}: model config differs from {b.path} ({', '.join(diff) or 'n_params'})")


def _sq_sums(a, c, off, n, chunk=1 << 23):
    """(sum (a-c)^2, sum c^2) over params[off:off+n] in fp64, chunked."""
    num = den = 0.0
    for s in range(off, off + n, chunk):
        e = min(off + n, s + chunk)
        x = np.asarray(a.params[s:e], dtype=np.float64)
        y = np.asarray(c.params[s:e], dtype=np.float64)
        num += float(np.dot(x - y, x - y))
        den += float(np.dot(y, y))
    return num, den


def _rel_pct(num, den):
    if not (math.isfinite(num) and math.isfinite(den)):
        return math.nan if (math.isnan(num) or math.isnan(den)) else math.inf
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return 100.0 * math.sqrt(num) / math.sqrt(den)


def weight_l2_per_tensor(ckpt, ckpt_clean, verify=True):
    """{tensor name: 100 * ||W_t - Wc_t|| / ||Wc_t||} (percent), checkpoint order."""
    a, c = _open_ckpt(ckpt, verify), _open_ckpt(ckpt_clean, verify)
    _same_model(a, c)
    return {name: _rel_pct(*_sq_sums(a, c, off, int(np.prod(shape)))) for name, off, shape in a.tensors()}


def weight_l2(ckpt, ckpt_clean, verify=True):
    """W_L2 = 100 * ||W - W_clean||_2 / ||W_clean||_2 over all parameters (percent). NaN when a weight
    is NaN, inf when one is infinite."""
    a, c = _open_ckpt(ckpt, verify), _open_ckpt(ckpt_clean, verify)
    _same_model(a, c)
    num = den = 0.0
    for _, off, shape in a.tensors():
        n1, d1 = _sq_sums(a, c, off, int(np.prod(shape)))
        num += n1
        den += d1
    return _rel_pct(num, den)


# ---------------------------------------------------------------- metrics
def _logs(x):
    return x if isinstance(x, RunLog) else read_log(x)


def _aligned(*logs):
    common = set(logs[0].steps)
    for lg in logs[1:]:
        common &= set(lg.steps)
    if not common:
        raise MetricsError(f"{logs[0].path}: no step in common with {', '.join(lg.path for lg in logs[1:])}")
    return sorted(common)


def _first_nonfinite(steps, losses):
    bad = np.nonzero(~np.isfinite(losses))[0]
    return int(steps[bad[0]]) if len(bad) else None


def deviation_series(clean, fault):
    """(steps both logs have, D(t) = L_fault(t) - L_clean(t) on them): +inf where either loss is NaN or
    +-inf (the module doc). clean, fault: RunLog or run dir/log path."""
    cl, fl = _logs(clean), _logs(fault)
    steps = _aligned(cl, fl)
    Lc, Lf = cl.losses(steps), fl.losses(steps)
    with np.errstate(invalid="ignore", over="ignore"):
        dev = Lf - Lc
    dev[~(np.isfinite(Lc) & np.isfinite(Lf))] = math.inf
    return steps, dev


def clean_spread(clean_runs):
    """(steps all the clean runs have, E(t) = max_i L_i(t) - min_i L_i(t) = max_{i<j} |L_i(t) - L_j(t)| on
    them, +inf where a clean loss is non-finite, whether every loss is finite per step) over >= 2 clean runs
    (RunLogs or dirs)."""
    logs = [_logs(r) for r in clean_runs]
    if len(logs) < 2:
        raise MetricsError("the clean envelope needs at least two clean runs")
    steps = _aligned(*logs)
    L = np.stack([lg.losses(steps) for lg in logs])           # [runs, steps]
    with np.errstate(invalid="ignore"):
        spread = L.max(axis=0) - L.min(axis=0)
    finite = np.isfinite(L).all(axis=0)
    spread[~finite] = math.inf
    return steps, spread, finite


def loss_deviation(clean, fault, window_start=None, fault_records=None):
    """D_max, D_final and their context. clean, fault: RunLog or run dir/log path. window_start: t_f;
    None = the first step in fault_records (default: the fault dir's faults.jsonl), else the first
    aligned step where the losses differ."""
    cl, fl = _logs(clean), _logs(fault)
    steps, dev = deviation_series(cl, fl)
    Lc, Lf = cl.losses(steps), fl.losses(steps)
    nonfinite = ~(np.isfinite(Lc) & np.isfinite(Lf))
    if fault_records is None and not isinstance(fault, RunLog):
        fault_records = read_faults(fault)
    if window_start is not None:
        t_f, src = int(window_start), "--window-start"
    elif fault_records:
        t_f, src = min(int(r["step"]) for r in fault_records), "faults.jsonl"
    else:
        differ = [s for s, a, b in zip(steps, Lc, Lf) if not (a == b or (math.isnan(a) and math.isnan(b)))]
        t_f, src = (differ[0], "first differing step") if differ else (steps[0], "runs identical")
    T = steps[-1]
    win = [i for i, s in enumerate(steps) if t_f <= s <= T]
    if not win:
        raise MetricsError(f"{fl.path}: fault window starts at step {t_f}, after the last aligned step {T}")
    i_max = max(win, key=lambda i: dev[i])
    notes = []
    if max(cl.steps) != max(fl.steps):
        notes.append(f"logs end at different steps (clean {max(cl.steps)}, fault {max(fl.steps)}); T = {T}")
    return {
        "T": T, "t_f": t_f, "t_f_source": src, "n_aligned": len(win),
        "D_max": float(dev[i_max]), "D_max_step": int(steps[i_max]), "D_final": float(dev[-1]),
        "L_clean_final": float(Lc[-1]), "L_fault_final": float(Lf[-1]),
        "diverged": bool(nonfinite[win].any()),
        "first_nonfinite_step": next((steps[i] for i in win if nonfinite[i]), None),
        "fault_first_nonfinite_step": _first_nonfinite(steps, Lf),
        "clean_first_nonfinite_step": _first_nonfinite(steps, Lc),
        "notes": notes,
    }


def envelope(clean_runs, window_start=None, final_step=None):
    """E_final, E_max (absolute pairwise differences) over >= 2 clean runs (RunLogs or dirs), aligned
    on the steps they all have, t in [window_start (default: the first aligned step), T_E];
    T_E = final_step or the last aligned step."""
    logs = [_logs(r) for r in clean_runs]
    steps, spread, finite = clean_spread(logs)
    if final_step is not None:
        keep = [i for i, s in enumerate(steps) if s <= final_step]
        steps, spread, finite = [steps[i] for i in keep], spread[keep], finite[keep]
        if not steps or steps[-1] != final_step:
            raise MetricsError(f"{logs[0].path}: step {final_step} is not in every clean log")
    t0 = steps[0] if window_start is None else int(window_start)
    win = [i for i, s in enumerate(steps) if s >= t0]
    if not win:
        raise MetricsError(f"{logs[0].path}: window start {t0} after the last aligned clean step {steps[-1]}")
    i_max = max(win, key=lambda i: spread[i])
    return {"n_clean": len(logs), "T_E": steps[-1], "window_start": t0,
            "E_final": float(spread[-1]), "E_max": float(spread[i_max]), "E_max_step": int(steps[i_max]),
            "clean_nonfinite": bool(not finite.all())}


def ratio(d, e):
    """(D / E, note). E = 0: +-inf (sign of D), or 0 when D = 0 as well."""
    if d is None or e is None:
        return None, None
    if math.isnan(d) or math.isnan(e):
        return math.nan, None
    if e == 0:
        note = "E = 0 (bitwise-identical clean repeats: use -perturb); D/E reported as inf (0 where D = 0)"
        return (0.0 if d == 0 else math.copysign(math.inf, d)), note
    return d / e, None


def delta_ppl(clean, fault):
    """PPL_fault - PPL_clean (and val loss) from the final eval record of each log; None if either
    has no eval record."""
    ec, ef = _logs(clean).final_eval(), _logs(fault).final_eval()
    if ec is None or ef is None:
        return None
    if ec["step"] != ef["step"]:
        raise MetricsError(f"{_logs(fault).path}: final eval at step {ef['step']}, clean run's at step {ec['step']}")
    dp = ef["ppl"] - ec["ppl"]
    dl = ef["val_loss"] - ec["val_loss"]
    nonfinite = not (math.isfinite(ef["ppl"]) and math.isfinite(ec["ppl"]))
    return {"eval_step": ec["step"], "ppl_clean": ec["ppl"], "ppl_fault": ef["ppl"],
            "delta_ppl": math.inf if nonfinite else dp, "val_loss_clean": ec["val_loss"],
            "val_loss_fault": ef["val_loss"], "delta_val_loss": dl, "ppl_nonfinite": nonfinite}


def top1_agreement(pred_a, pred_b):
    """Fraction of positions where the two argmax predictions agree (arrays or -pred_out files)."""
    a = read_predictions(pred_a) if isinstance(pred_a, (str, os.PathLike)) else np.asarray(pred_a)
    b = read_predictions(pred_b) if isinstance(pred_b, (str, os.PathLike)) else np.asarray(pred_b)
    name = str(pred_a) if isinstance(pred_a, (str, os.PathLike)) else "predictions"
    if a.shape != b.shape:
        raise MetricsError(f"{name}: {a.size} predictions, the other file has {b.size} (not the same held-out set)")
    if a.size == 0:
        raise MetricsError(f"{name}: no predictions")
    return float(np.count_nonzero(a == b)) / a.size


def overhead(run, base, start=None, steps=OVERHEAD_STEPS, warmup=OVERHEAD_WARMUP):
    """Step-time overhead of run vs base, percent: 100 * (mean ms_run / mean ms_base - 1) over the
    steps [start, start + steps) both logs have; start defaults to the first common step + warmup."""
    rl, bl = _logs(run), _logs(base)
    common = _aligned(rl, bl)
    a = common[0] + warmup if start is None else int(start)
    win = [s for s in common if a <= s < a + steps]
    if not win:
        raise MetricsError(f"{rl.path}: no common step in the overhead window [{a}, {a + steps})")
    mr = float(np.mean([rl.ms(s) for s in win]))
    mb = float(np.mean([bl.ms(s) for s in win]))
    if mb <= 0:
        raise MetricsError(f"{bl.path}: mean step time is {mb} ms in [{a}, {a + steps})")
    return {"overhead_pct": 100.0 * (mr / mb - 1.0), "ms_run": mr, "ms_base": mb,
            "start": a, "n_steps": len(win), "requested_steps": steps}


# ---------------------------------------------------------------- beyond the paper: lost updates, last-K, envelope
def _grad_norm(rec):
    v = rec.get("grad_norm")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def lost_updates(run, factor=LOST_FACTOR, half_window=LOST_HALF_WINDOW):
    """The lost updates of a run (module doc): {"skipped": [...], "blown": [...], "lost": sorted union,
    "n_lost": n}. skipped: found_inf, skip, or a non-finite grad_norm; blown: grad_norm > factor x the
    median of the finite grad_norm of the 2 x half_window nearest other steps."""
    lg = _logs(run)
    steps = sorted(lg.steps)
    g = np.array([_grad_norm(lg.steps[s]) for s in steps])
    skipped = [s for i, s in enumerate(steps)
               if lg.steps[s].get("found_inf", 0) or lg.steps[s].get("skip", 0) or not math.isfinite(g[i])]
    blown = []
    n = len(steps)
    for i, s in enumerate(steps):
        if not math.isfinite(g[i]) or s in skipped:
            continue
        lo = max(0, min(i - half_window, n - 1 - 2 * half_window))
        hi = min(n, lo + 2 * half_window + 1)
        nb = [g[j] for j in range(lo, hi) if j != i and math.isfinite(g[j])]
        if nb and g[i] > factor * float(np.median(nb)):
            blown.append(s)
    lost = sorted(set(skipped) | set(blown))
    return {"skipped": skipped, "blown": blown, "lost": lost, "n_lost": len(lost), "factor": factor}


def mean_deviation_last(clean, fault, k=LAST_K, with_count=False):
    """mean of D(t) = L_fault(t) - L_clean(t) over the last k aligned steps where it is finite (+inf when
    none is); with_count: (mean, number of non-finite steps left out)"""
    cl, fl = _logs(clean), _logs(fault)
    steps = _aligned(cl, fl)[-k:]
    with np.errstate(invalid="ignore", over="ignore"):
        d = fl.losses(steps) - cl.losses(steps)
    ok = np.isfinite(d)
    m = float(np.mean(d[ok])) if ok.any() else math.inf
    return (m, int((~ok).sum())) if with_count else m


def envelope_all(clean_runs, window_start=None, k=LAST_K):
    """envelope() plus E_lastK (largest |mean over the last k steps of L_i - L_j|), E_val and E_ppl (largest
    |difference| of the final eval's val_loss and ppl; None when a log has no eval)"""
    logs = [_logs(r) for r in clean_runs]
    e = envelope(logs, window_start)
    steps = _aligned(*logs)[-k:]
    means = [float(np.mean(lg.losses(steps))) for lg in logs]
    e["E_lastK"] = max(means) - min(means) if all(map(math.isfinite, means)) else math.inf
    e["K"] = len(steps)
    ev = [lg.final_eval() for lg in logs]
    if all(x is not None for x in ev):
        vl, pp = [x["val_loss"] for x in ev], [x["ppl"] for x in ev]
        e["E_val"], e["E_ppl"] = max(vl) - min(vl), max(pp) - min(pp)
    else:
        e["E_val"] = e["E_ppl"] = None
    return e


def detection(fault_dir):
    """what the protection caught in a run (module doc): events, read (live > 0), caught_read,
    qk / qk_caught (Q/K-path events, both passes), fwd / fwd_caught, false_alarms, replayed"""
    st = read_log(fault_dir).steps
    faults = read_faults(fault_dir)
    fault_steps = {int(f["step"]) for f in faults}

    def caught(f):
        return bool(st.get(int(f["step"]), {}).get("replayed", 0))
    read = [f for f in faults if f.get("live", f.get("m", 1)) > 0]
    qk = [f for f in faults if f.get("site") in QK_SITES]
    fwd = [f for f in faults if f.get("pass") == "fwd"]
    rep = [s for s in st if st[s].get("replayed", 0)]
    qk_fwd = [f for f in qk if f.get("pass") == "fwd"]
    return {"events": len(faults), "read": len(read), "caught_read": sum(map(caught, read)),
            "caught": sum(map(caught, faults)), "qk": len(qk), "qk_caught": sum(map(caught, qk)),
            "qk_fwd": len(qk_fwd), "qk_fwd_caught": sum(map(caught, qk_fwd)),
            "fwd": len(fwd), "fwd_caught": sum(map(caught, fwd)), "replayed": len(rep),
            "false_alarms": sum(1 for s in rep if s not in fault_steps),
            "found_inf": sum(1 for s in st if st[s].get("found_inf", 0))}


# ---------------------------------------------------------------- propagation trace
_TRACE_KEYS = ("step", "microbatch", "rank", "inj_site", "inj_layer", "site", "layer", "rx")


def read_trace(paths):
    """Trace records of one or more files (one per rank when world > 1)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        for no, rec in _read_jsonl(p):
            for k in _TRACE_KEYS:
                if k not in rec:
                    raise MetricsError(f"{p}:{no}: trace record has no '{k}'")
            _num(p, no, rec, "rx")
            out.append(rec)
        if not out:
            raise MetricsError(f"{p}: no trace records")
    return out


def trace_summary(paths):
    """[{inj_site, inj_layer, n_events, rows: [{site, layer, rx_median, rx_events}]}], one entry per
    injected (site, layer). rows: the injected tensor, attn_residual and block_out of the injected
    layer, block_out of every later layer, lm_output."""
    recs = read_trace(paths)
    n_layer = 1 + max([int(r["layer"]) for r in recs] + [int(r["inj_layer"]) for r in recs])
    groups = {}
    for r in recs:
        key = (r["inj_site"], int(r["inj_layer"]))
        ev = (int(r["step"]), int(r["microbatch"]), int(r["rank"]))
        nc = r.get("norm_clean")
        clean_ok = not isinstance(nc, (int, float)) or math.isfinite(nc)
        groups.setdefault(key, {}).setdefault(ev, {})[(r["site"], int(r["layer"]))] = (float(r["rx"]), clean_ok)
    out = []
    for (site, layer), events in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        wanted = [(site, layer, "injected")]
        if site != "attn_residual":
            wanted.append(("attn_residual", layer, ""))
        if site != "block_out":
            wanted.append(("block_out", layer, ""))
        wanted += [("block_out", l, "") for l in range(layer + 1, n_layer)]
        wanted.append(("lm_output", -1, ""))
        rows = []
        for s, l, tag in wanted:
            got = [ev[(s, l)] for ev in events.values() if (s, l) in ev]
            if not got:
                continue
            vals = [v for v, ok in got if ok]
            ranked = [math.inf if math.isnan(v) else v for v in vals]   # a NaN tensor: infinitely far
            rows.append({"site": s, "layer": l, "tag": tag,
                         "rx_median": float(np.median(ranked)) if ranked else math.nan,
                         "n_nonfinite": sum(not math.isfinite(v) for v in vals),
                         "n_clean_nonfinite": len(got) - len(vals), "rx_events": vals})
        out.append({"inj_site": site, "inj_layer": layer, "n_events": len(events), "rows": rows})
    return out


# ---------------------------------------------------------------- the comparison
def compare(clean_dir, fault_dir, clean_repeats=(), window_start=None, clean_pred=None, fault_pred=None,
            overhead_start=None, overhead_steps=OVERHEAD_STEPS, verify_ckpt=True):
    """Every metric of a faulty run against the clean reference, as one dict (see the module doc).
    Metrics whose inputs are absent (no eval record, predictions, checkpoints, repeats) are None, with
    a note."""
    for d in (clean_dir, fault_dir, *clean_repeats):
        if not os.path.isdir(d):
            raise MetricsError(f"{d}: no such run directory")
    cl, fl = read_log(clean_dir), read_log(fault_dir)
    faults = read_faults(fault_dir)
    res = {"clean": clean_dir, "fault": fault_dir, "clean_repeats": list(clean_repeats),
           "n_fault_events": len(faults)}
    dev = loss_deviation(cl, fl, window_start, faults)
    notes = dev.pop("notes")
    res.update(dev)
    if clean_repeats:
        env = envelope([cl] + [read_log(d) for d in clean_repeats], window_start=dev["t_f"])
        if env["T_E"] != dev["T"]:
            notes.append(f"clean runs end at step {env['T_E']}, the comparison at {dev['T']}")
        env.pop("window_start")
        res.update(env)
        res["ratio_final"], n1 = ratio(dev["D_final"], env["E_final"])
        res["ratio_max"], n2 = ratio(dev["D_max"], env["E_max"])
        notes += sorted({n for n in (n1, n2) if n})
    else:
        res.update({"n_clean": 1, "E_final": None, "E_max": None, "ratio_final": None, "ratio_max": None})
        notes.append("no --clean-repeat: E and D/E not computed")
    dp = delta_ppl(cl, fl)
    if dp is None:
        notes.append("no eval record in a log: delta-PPL not computed")
        dp = {"delta_ppl": None}
    res.update(dp)
    cp = clean_pred or find_predictions(clean_dir)
    fp = fault_pred or find_predictions(fault_dir)
    if cp and fp:
        res["top1"] = top1_agreement(fp, cp)
    else:
        res["top1"] = None
        notes.append("no predictions file (-pred_out) in a run: Top-1 not computed")
    cc, fc = final_checkpoint(clean_dir), final_checkpoint(fault_dir)
    if cc and fc:
        a, c = Checkpoint(fc, verify_ckpt), Checkpoint(cc, verify_ckpt)
        if a.step != c.step:
            raise MetricsError(f"{fc}: final checkpoint at step {a.step}, the clean run's ({cc}) at step {c.step}")
        res["ckpt_step"] = a.step
        res["w_l2_pct"] = weight_l2(a, c)
    else:
        res["ckpt_step"] = res["w_l2_pct"] = None
        notes.append("no checkpoint in a run: W_L2 not computed")
    try:
        oh = overhead(fl, cl, overhead_start, overhead_steps)
        res.update({"overhead_pct": oh["overhead_pct"], "overhead_ms_run": oh["ms_run"],
                    "overhead_ms_base": oh["ms_base"], "overhead_start": oh["start"],
                    "overhead_n_steps": oh["n_steps"]})
    except MetricsError as e:
        res["overhead_pct"] = None
        notes.append(f"overhead not computed ({e})")
    res["mean_dev_lastK"], res["mean_dev_lastK_nonfinite"] = mean_deviation_last(cl, fl, with_count=True)
    lu = lost_updates(fl)
    res["lost_updates"], res["lost_steps"] = lu["n_lost"], lu["lost"]
    res["notes"] = notes
    return res


# ---------------------------------------------------------------- output
def _f(x, fmt="{:+.4e}"):
    if x is None:
        return "n/a"
    if isinstance(x, float) and not math.isfinite(x):
        return "nonfinite" if math.isnan(x) else ("+inf" if x > 0 else "-inf")
    return fmt.format(x)


def format_compare(r):
    L = [f"clean {r['clean']}  vs  fault {r['fault']}" +
         (f"  ({r['n_clean']} clean runs)" if r.get("n_clean", 1) > 1 else ""),
         f"window t_f = {r['t_f']} ({r['t_f_source']}) .. T = {r['T']}, {r['n_aligned']} aligned steps; "
         f"{r['n_fault_events']} fault events logged"]
    div = ""
    if r["diverged"]:
        div = f"   DIVERGED: non-finite loss from step {r['first_nonfinite_step']} (counted as +inf)"
    rows = [("D_final", _f(r["D_final"]), f"L_fault(T) {_f(r['L_fault_final'], '{:.6f}')} - L_clean(T) "
                                           f"{_f(r['L_clean_final'], '{:.6f}')}"),
            ("D_max", _f(r["D_max"]), f"at step {r['D_max_step']}"),
            ("E_final", _f(r["E_final"], "{:.4e}"), "largest |clean - clean| at T_E"),
            ("E_max", _f(r["E_max"], "{:.4e}"), "largest |clean - clean| in the window"),
            ("D_final/E_final", _f(r["ratio_final"], "{:.3f}"), ""),
            ("D_max/E_max", _f(r["ratio_max"], "{:.3f}"), ""),
            (f"mean D last {LAST_K}", _f(r.get("mean_dev_lastK")), "mean of L_fault - L_clean over the last steps"),
            ("delta_val_loss", _f(r.get("delta_val_loss")), "held-out loss difference at the final eval"),
            ("lost updates", str(r.get("lost_updates")), f"skipped, or pre-clip norm > {LOST_FACTOR:g}x the running median"),
            ("delta_PPL", _f(r.get("delta_ppl")),
             f"PPL fault {_f(r.get('ppl_fault'), '{:.4f}')} - clean {_f(r.get('ppl_clean'), '{:.4f}')}"
             if r.get("delta_ppl") is not None else ""),
            ("Top-1 (%)", _f(None if r["top1"] is None else 100 * r["top1"], "{:.2f}"), "argmax agreement"),
            ("W_L2 (%)", _f(r["w_l2_pct"], "{:.4e}"),
             f"final checkpoints, step {r['ckpt_step']}" if r["ckpt_step"] is not None else ""),
            ("overhead (%)", _f(r.get("overhead_pct"), "{:+.2f}"),
             f"mean ms {r['overhead_ms_run']:.3f} / {r['overhead_ms_base']:.3f}, {r['overhead_n_steps']} steps "
             f"from {r['overhead_start']}"
             if r.get("overhead_pct") is not None else "")]
    L += [f"  {k:<16} {v:>12}   {c}".rstrip() for k, v, c in rows]
    if div:
        L.append(div)
    L += [f"note: {n}" for n in r["notes"]]
    return "\n".join(L)


def format_trace(summary):
    L = []
    for g in summary:
        L.append(f"injected {g['inj_site']} @ layer {g['inj_layer']}: {g['n_events']} event(s), median R_x")
        for row in g["rows"]:
            where = "" if row["layer"] < 0 else f"L{row['layer']}"
            rx = row["rx_median"]
            lg = f"log10 {math.log10(rx):+.2f}" if rx > 0 and math.isfinite(rx) else ""
            nf = ", ".join(x for x in (f"{row['n_nonfinite']} non-finite" if row["n_nonfinite"] else "",
                                       f"{row['n_clean_nonfinite']} skipped (clean non-finite)"
                                       if row["n_clean_nonfinite"] else "") if x)
            L.append(f"  {row['site']:<14} {where:<4} {_f(rx, '{:.3e}'):>10}  {lg:<12} {row['tag']:<9} {nf}".rstrip())
    return "\n".join(L)


def _dump(obj):
    return json.dumps(obj, indent=1, allow_nan=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="sdc_metrics.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compare", help="every metric of a faulty run against the clean run")
    p.add_argument("--clean", required=True, metavar="DIR")
    p.add_argument("--fault", required=True, metavar="DIR")
    p.add_argument("--clean-repeat", action="append", default=[], metavar="DIR",
                   help="another clean run (repeatable), for E and D/E")
    p.add_argument("--window-start", type=int, metavar="S", help="t_f (default: first step in faults.jsonl)")
    p.add_argument("--clean-pred", metavar="FILE")
    p.add_argument("--fault-pred", metavar="FILE")
    p.add_argument("--overhead-start", type=int, metavar="S")
    p.add_argument("--overhead-steps", type=int, default=OVERHEAD_STEPS, metavar="N")
    p.add_argument("--no-verify", action="store_true", help="skip checkpoint checksums")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("envelope", help="E_final and E_max of repeated clean runs")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.add_argument("--window-start", type=int, metavar="S")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("trace", help="summarise a propagation trace (-trace_out)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("weights", help="W_L2 between two checkpoints")
    p.add_argument("ckpt", metavar="CKPT")
    p.add_argument("ckpt_clean", metavar="CKPT_CLEAN")
    p.add_argument("--per-tensor", action="store_true")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("overhead", help="step-time overhead of a run against a baseline")
    p.add_argument("--run", required=True, metavar="DIR")
    p.add_argument("--base", required=True, metavar="DIR")
    p.add_argument("--start", type=int, metavar="S")
    p.add_argument("--steps", type=int, default=OVERHEAD_STEPS, metavar="N")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("lost", help="the lost updates of a run (skipped, or a clipped-away blow-up)")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--factor", type=float, default=LOST_FACTOR)
    p.add_argument("--steps-only", action="store_true", help="print the lost steps only, one a line (for -skip_steps)")
    p.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "compare":
            r = compare(a.clean, a.fault, a.clean_repeat, a.window_start, a.clean_pred, a.fault_pred,
                        a.overhead_start, a.overhead_steps, not a.no_verify)
            print(_dump(r) if a.json else format_compare(r))
        elif a.cmd == "envelope":
            r = envelope(a.dirs, a.window_start)
            print(_dump(r) if a.json else
                  f"{r['n_clean']} clean runs, steps {r['window_start']}..{r['T_E']}\n"
                  f"  E_final {r['E_final']:.4e}   (largest |L_i(T) - L_j(T)|)\n"
                  f"  E_max   {r['E_max']:.4e}   (largest |L_i(t) - L_j(t)|, at step {r['E_max_step']})"
                  + ("\nnote: E = 0: the repeats are bitwise identical (use -perturb)" if r["E_max"] == 0 else ""))
        elif a.cmd == "trace":
            s = trace_summary(a.files)
            print(_dump(s) if a.json else format_trace(s))
        elif a.cmd == "weights":
            r = {"w_l2_pct": weight_l2(a.ckpt, a.ckpt_clean)}
            if a.per_tensor:
                r["per_tensor"] = weight_l2_per_tensor(a.ckpt, a.ckpt_clean)
            if a.json:
                print(_dump(r))
            else:
                print(f"W_L2 {_f(r['w_l2_pct'], '{:.4e}')} %")
                for k, v in r.get("per_tensor", {}).items():
                    print(f"  {k:<24} {_f(v, '{:.4e}')} %")
        elif a.cmd == "lost":
            r = lost_updates(a.dir, a.factor)
            if a.json:
                print(_dump(r))
            elif a.steps_only:
                print("\n".join(map(str, r["lost"])))
            else:
                print(f"{r['n_lost']} lost updates: {len(r['skipped'])} skipped, {len(r['blown'])} with a pre-clip norm > "
                      f"{a.factor:g}x the running median\n  skipped: {r['skipped']}\n  blown: {r['blown']}")
        elif a.cmd == "overhead":
            r = overhead(a.run, a.base, a.start, a.steps)
            print(_dump(r) if a.json else
                  f"overhead {r['overhead_pct']:+.2f} %  (mean ms {r['ms_run']:.3f} vs {r['ms_base']:.3f}, "
                  f"steps {r['start']}.. , {r['n_steps']} steps)")
    except (MetricsError, ValueError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
