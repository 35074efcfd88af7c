"""Tests of scripts/sdc_metrics.py on synthetic run directories with hand-computed answers: loss
deviation D, clean envelope E and D/E, delta-PPL, Top-1 agreement, W_L2, step-time overhead, diverged
(NaN / inf) runs, the propagation-trace summary, the command line, and one-line errors for missing or
malformed files. No trainer needed. Run: python3 -m pytest -q tests/test_metrics.py
"""
import contextlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "dev"))
sys.path.insert(0, str(REPO / "scripts"))
import sdc_metrics as sm  # noqa: E402
import tsdc_io  # noqa: E402

SCRIPT = REPO / "scripts" / "sdc_metrics.py"

# a tiny model: 1 layer, d 2, SwiGLU, weighted norms, tied; 38 parameters
CFG = dict(n_layer=1, d_model=2, n_head=1, n_kv_head=1, head_dim=2, ffn_dim=2, vocab_size=2, seq_len=4,
           mlp=0, norm_weighted=1, qk_norm=0, rope_style=0, rope_llama3=0, tied=1, embed_norm=0,
           rope_theta=10000.0, norm_eps=1e-5, softcap=0.0, rope_factor=0.0, rope_low=0.0, rope_high=0.0,
           rope_orig=0.0)


def zero_params(cfg=CFG):
    return {name: np.zeros(shape, np.float32) for name, shape in tsdc_io.param_layout(cfg)}


def write_log(path, losses, ms=None, evals=(), first_step=1, extra_lines=()):
    """log.jsonl with one step record per loss (steps first_step..), eval records (step, val_loss, ppl)."""
    lines = [json.dumps({"type": "run", "preset": "tiny", "steps": len(losses)})]
    for i, loss in enumerate(losses):
        s = first_step + i
        lines.append(json.dumps({"type": "step", "step": s, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
                                 "ms": 10.0 if ms is None else ms[i], "tok_s": 1.0, "k": 0, "alarms": 0,
                                 "injections": 0, "replayed": 0}))
    for s, vl, ppl in evals:
        lines.append(json.dumps({"type": "eval", "step": s, "val_loss": vl, "ppl": ppl}))
    lines += list(extra_lines)
    lines.append(json.dumps({"type": "end", "step": first_step + len(losses) - 1, "weights": "0"}))
    Path(path).write_text("\n".join(lines) + "\n")


def make_run(tmp, name, losses, ms=None, evals=(), fault_steps=None, preds=None, params=None, ckpt_step=None):
    d = tmp / name
    d.mkdir()
    write_log(d / "log.jsonl", losses, ms, evals)
    if fault_steps is not None:
        (d / "faults.jsonl").write_text("".join(
            json.dumps({"type": "fault", "step": s, "microbatch": 0, "rank": 0, "layer": 0, "site": "q_rope",
                        "pass": "fwd", "m": 10, "numel": 100, "nbits": 4, "dtype": "bf16", "seed": 1234,
                        "rms_before": 1.0, "rms_after": 2.0}) + "\n" for s in fault_steps))
    if preds is not None:
        tsdc_io.write_shard(d / "pred.bin", np.array(preds), 70000)  # 4-byte ids, as the trainer writes
    if params is not None:
        tsdc_io.write_checkpoint(d / f"step_{ckpt_step or len(losses):06d}.ckpt", "tiny", CFG, params)
    return d


def cli(*args):
    """sdc_metrics.main in this process (fast); returns an object like subprocess.run's."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = sm.main([str(a) for a in args])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def cli_process(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def assert_one_error(r, *fragments):
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


# ---------------------------------------------------------------- loss deviation D
def test_d_max_d_final(tmp_path):
    """D = L_fault - L_clean by hand: D_max 0.5 at step 2, D_final 0.2, t_f the first differing step. Catches: D as
    clean - fault or as a ratio, D_max at the wrong step, T or t_f off by one."""
    c = make_run(tmp_path, "clean", [3, 2, 1])
    f = make_run(tmp_path, "fault", [3, 2.5, 1.2])
    r = sm.loss_deviation(c, f)
    assert r["D_max"] == pytest.approx(0.5) and r["D_max_step"] == 2
    assert r["D_final"] == pytest.approx(0.2)
    assert (r["t_f"], r["t_f_source"], r["T"]) == (2, "first differing step", 3)
    assert not r["diverged"] and r["first_nonfinite_step"] is None


def test_window_from_faults_jsonl(tmp_path):
    """the window starts at faults.jsonl's first event (a larger deviation before it is left out); window_start
    overrides it. Catches: D_max over the whole run, faults.jsonl ignored, window_start off by one."""
    # the larger deviation at step 1 lies before the fault window (first fault at step 2)
    c = make_run(tmp_path, "clean", [3, 2, 1])
    f = make_run(tmp_path, "fault", [3.9, 2.5, 1.2], fault_steps=[2, 3])
    r = sm.loss_deviation(c, f)
    assert (r["t_f"], r["t_f_source"]) == (2, "faults.jsonl")
    assert r["D_max"] == pytest.approx(0.5)
    r = sm.loss_deviation(c, f, window_start=1)
    assert r["D_max"] == pytest.approx(0.9) and r["D_max_step"] == 1
    r = sm.loss_deviation(c, f, window_start=3)
    assert r["D_max"] == pytest.approx(0.2) and r["n_aligned"] == 1


def test_d_is_signed(tmp_path):
    """a faulty run below the clean one: D_max -0.25, the largest |D| with its sign. Catches: D_max as max(D) or as
    |D|."""
    c = make_run(tmp_path, "clean", [3, 2, 1])
    f = make_run(tmp_path, "fault", [3, 1.5, 0.75], fault_steps=[2])
    r = sm.loss_deviation(c, f)
    assert r["D_max"] == pytest.approx(-0.25) and r["D_max_step"] == 3
    assert r["D_final"] == pytest.approx(-0.25)


def test_aligned_steps_and_resume_duplicates(tmp_path):
    """logs over different step ranges are aligned on their common steps, and a step a resume logged twice counts
    once, the last record. Catches: alignment by position instead of step, the pre-resume record used."""
    # clean log steps 1..4; fault log steps 2..3 plus a duplicate step 3 appended by a resume (last wins)
    c = tmp_path / "c.jsonl"
    f = tmp_path / "f.jsonl"
    write_log(c, [4, 3, 2, 1])
    write_log(f, [3, 9], first_step=2,
              extra_lines=[json.dumps({"type": "step", "step": 3, "loss": 2.25, "ms": 1.0})])
    r = sm.loss_deviation(c, f)
    assert r["T"] == 3 and r["D_final"] == pytest.approx(0.25) and r["D_max"] == pytest.approx(0.25)
    assert any("different steps" in n for n in r["notes"])


def test_identical_runs(tmp_path):
    """Catches: a nonzero D or a spurious first fault step for identical runs."""
    c = make_run(tmp_path, "clean", [3, 2, 1])
    f = make_run(tmp_path, "fault", [3, 2, 1])
    r = sm.loss_deviation(c, f)
    assert r["D_max"] == 0 and r["D_final"] == 0 and r["t_f_source"] == "runs identical"


def test_nonfinite_loss_is_divergence(tmp_path):
    """NaN, +inf and -inf losses: diverged, the first non-finite step, D = +inf; the CLI prints DIVERGED. Catches:
    NaN compared as a number (max() skips it), -inf giving a -inf deviation, divergence not reported."""
    c = make_run(tmp_path, "clean", [3, 2, 1, 0.5])
    f = make_run(tmp_path, "fault", [3, 2.5, math.nan, math.inf], fault_steps=[2])
    assert "NaN" in (f / "log.jsonl").read_text() and "Infinity" in (f / "log.jsonl").read_text()
    r = sm.loss_deviation(c, f)
    assert r["diverged"] and r["first_nonfinite_step"] == 3 and r["fault_first_nonfinite_step"] == 3
    assert r["D_max"] == math.inf and r["D_final"] == math.inf
    assert r["clean_first_nonfinite_step"] is None
    # -inf loss counts as +inf deviation too
    g = make_run(tmp_path, "fault2", [3, 2, 1, -math.inf])
    assert sm.loss_deviation(c, g)["D_final"] == math.inf
    out = cli("compare", "--clean", c, "--fault", f)
    assert out.returncode == 0, out.stderr
    assert "DIVERGED: non-finite loss from step 3" in out.stdout and "+inf" in out.stdout


# ---------------------------------------------------------------- envelope E and D/E
def test_envelope_and_ratios(tmp_path):
    """E = per-step max - min over the clean runs (E_max 0.15 at step 2, E_final 0.03), independent of order; D/E
    ratios. Catches: E as a standard deviation or as the difference to the first run only, ratios inverted."""
    a = make_run(tmp_path, "a", [3, 2, 1])
    b = make_run(tmp_path, "b", [3, 2.1, 0.99])
    c = make_run(tmp_path, "c", [3, 1.95, 1.02])
    # per-step spread max-min: 0, 0.15, 0.03
    e = sm.envelope([a, b, c])
    assert e["E_final"] == pytest.approx(0.03) and e["E_max"] == pytest.approx(0.15)
    assert e["E_max_step"] == 2 and e["n_clean"] == 3 and e["T_E"] == 3
    assert sm.envelope([a, b, c], window_start=3)["E_max"] == pytest.approx(0.03)
    # E is absolute: the order of the runs does not matter
    assert sm.envelope([c, a])["E_final"] == pytest.approx(0.02)
    f = make_run(tmp_path, "f", [3, 2.5, 1.2], fault_steps=[2])
    r = sm.compare(a, f, [b, c])
    assert r["E_final"] == pytest.approx(0.03) and r["E_max"] == pytest.approx(0.15)
    assert r["ratio_final"] == pytest.approx(0.2 / 0.03)   # 6.667
    assert r["ratio_max"] == pytest.approx(0.5 / 0.15)     # 3.333


def test_envelope_zero_gives_inf_ratio(tmp_path):
    """identical clean runs: E = 0, D/E = inf with a note; ratio(0, 0) = 0, ratio(-1, 0) = -inf. Catches: a
    division-by-zero error, or a ratio of 0 that hides a deviation."""
    a = make_run(tmp_path, "a", [3, 2, 1])
    b = make_run(tmp_path, "b", [3, 2, 1])
    f = make_run(tmp_path, "f", [3, 2.5, 1.2], fault_steps=[2])
    r = sm.compare(a, f, [b])
    assert r["E_final"] == 0 and r["E_max"] == 0
    assert r["ratio_final"] == math.inf and r["ratio_max"] == math.inf
    assert any("E = 0" in n for n in r["notes"])
    assert sm.ratio(0.0, 0.0)[0] == 0.0 and sm.ratio(-1.0, 0.0)[0] == -math.inf
    assert sm.ratio(0.2, 0.1)[0] == pytest.approx(2.0)


def test_envelope_nonfinite_and_too_few(tmp_path):
    """a NaN in a clean run makes E_max inf and is flagged; one clean run is an error. Catches: a NaN silently
    dropped from the envelope, E from one run (always 0)."""
    a = make_run(tmp_path, "a", [3, 2, 1])
    b = make_run(tmp_path, "b", [3, math.nan, 1])
    e = sm.envelope([a, b])
    assert e["E_max"] == math.inf and e["E_final"] == 0 and e["clean_nonfinite"]
    with pytest.raises(sm.MetricsError, match="at least two"):
        sm.envelope([a])


# ---------------------------------------------------------------- delta-PPL, Top-1
def test_delta_ppl(tmp_path):
    """delta-PPL at the final eval (2.5), inf for a non-finite ppl, an error when the final evals are at different
    steps, None without evals. Catches: the first eval used instead of the final, perplexities of different steps
    compared."""
    c = make_run(tmp_path, "c", [3, 2], evals=[(1, 3.5, 33.0), (2, 3.0, 20.0)])
    f = make_run(tmp_path, "f", [3, 2], evals=[(1, 3.6, 36.0), (2, 3.1, 22.5)])
    r = sm.delta_ppl(c, f)
    assert r["eval_step"] == 2 and r["delta_ppl"] == pytest.approx(2.5) and r["delta_val_loss"] == pytest.approx(0.1)
    g = make_run(tmp_path, "g", [3, 2], evals=[(2, math.inf, math.inf)])
    r = sm.delta_ppl(c, g)
    assert r["delta_ppl"] == math.inf and r["ppl_nonfinite"]
    h = make_run(tmp_path, "h", [3, 2], evals=[(1, 3.0, 20.0)])
    with pytest.raises(sm.MetricsError, match="final eval at step 1"):
        sm.delta_ppl(c, h)
    assert sm.delta_ppl(c, make_run(tmp_path, "noeval", [3, 2])) is None


def test_top1_agreement(tmp_path):
    """7 of 10 predictions equal: 0.7 from 4-byte and 2-byte shards and from arrays; sets of different length are an
    error. Catches: agreement over a truncated set, 2-byte shards misread."""
    a = np.arange(10)
    b = a.copy()
    b[[1, 4, 8]] = 9999  # 7 of 10 agree
    c = make_run(tmp_path, "c", [1], preds=a)
    f = make_run(tmp_path, "f", [1], preds=b)
    assert sm.find_predictions(c) == str(c / "pred.bin")
    assert sm.top1_agreement(f / "pred.bin", c / "pred.bin") == pytest.approx(0.7)
    assert sm.top1_agreement(a, a) == 1.0
    # a 2-byte shard reads the same
    tsdc_io.write_shard(tmp_path / "p2.bin", b, 10000)
    assert sm.top1_agreement(str(tmp_path / "p2.bin"), a) == pytest.approx(0.7)
    with pytest.raises(sm.MetricsError, match="not the same held-out set"):
        sm.top1_agreement(a, a[:9])


# ---------------------------------------------------------------- W_L2
def weights_pair():
    clean = zero_params()
    clean["wte"][:] = [[6, 0], [0, 8]]          # ||W_clean|| = 10, every other tensor 0
    fault = {k: v.copy() for k, v in clean.items()}
    fault["wte"][0, 1] = 0.3                     # diff 0.3 in wte ...
    fault["layers.0.w_down"][1, 1] = 0.4         # ... and 0.4 in w_down: ||diff|| = 0.5
    return clean, fault


def test_weight_l2(tmp_path):
    """W_L2 = 100 ||W - W_clean|| / ||W_clean|| by hand (5 %; per tensor 3 %, inf, 0; 100 % for 2x); a NaN weight
    gives NaN. Catches: the wrong norm as denominator, per-tensor rows out of layout order, NaN turned into a
    number."""
    clean, fault = weights_pair()
    tsdc_io.write_checkpoint(tmp_path / "c.ckpt", "tiny", CFG, clean)
    tsdc_io.write_checkpoint(tmp_path / "f.ckpt", "tiny", CFG, fault)
    c, f = str(tmp_path / "c.ckpt"), str(tmp_path / "f.ckpt")
    assert sm.weight_l2(f, c) == pytest.approx(5.0)    # 100 * 0.5 / 10
    assert sm.weight_l2(c, c) == 0.0
    per = sm.weight_l2_per_tensor(f, c)
    assert list(per) == [n for n, _ in tsdc_io.param_layout(CFG)]
    assert per["wte"] == pytest.approx(3.0)          # 100 * 0.3 / 10
    assert per["layers.0.w_down"] == math.inf        # clean tensor is 0, fault tensor is not
    assert per["layers.0.wq"] == 0.0                 # both 0
    # a second, all-nonzero case: W_clean = 1 everywhere (38 parameters), W = 2 everywhere -> 100 %
    ones = {k: np.ones_like(v) for k, v in clean.items()}
    tsdc_io.write_checkpoint(tmp_path / "o.ckpt", "tiny", CFG, ones)
    tsdc_io.write_checkpoint(tmp_path / "t.ckpt", "tiny", CFG, {k: 2 * v for k, v in ones.items()})
    assert sm.weight_l2(str(tmp_path / "t.ckpt"), str(tmp_path / "o.ckpt")) == pytest.approx(100.0)
    # a NaN weight
    bad = {k: v.copy() for k, v in fault.items()}
    bad["final_norm_w"][0] = np.nan
    tsdc_io.write_checkpoint(tmp_path / "n.ckpt", "tiny", CFG, bad)
    assert math.isnan(sm.weight_l2(str(tmp_path / "n.ckpt"), c))


def test_checkpoint_reader_matches_tsdc_io(tmp_path):
    """sdc_metrics' streaming checkpoint reader gives tsdc_io's config, count and tensors; the streamed checksum
    equals tsdc_io's at any chunk size. Catches: a tensor offset or shape mistake in the reader, a streamed checksum
    wrong at chunk boundaries."""
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s).astype(np.float32) for n, s in tsdc_io.param_layout(CFG)}
    tsdc_io.write_checkpoint(tmp_path / "r.ckpt", "tiny", CFG, params)
    ck = sm.Checkpoint(str(tmp_path / "r.ckpt"))
    _, cfg, hdr, ref, _, _ = tsdc_io.read_checkpoint(tmp_path / "r.ckpt")
    assert ck.cfg == cfg and ck.n_params == hdr["n_params"] == 38 and ck.step == 0
    for name, off, shape in ck.tensors():
        np.testing.assert_array_equal(np.asarray(ck.params[off:off + int(np.prod(shape))]).reshape(shape), ref[name])
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 100, 4099]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        (tmp_path / "b").write_bytes(data)
        assert sm.streamed_checksum(str(tmp_path / "b"), n, chunk_words=3) == tsdc_io.checksum(data)


def test_checkpoint_errors(tmp_path):
    """a flipped byte, a short file, a wrong magic, another config, a missing file: MetricsError naming the cause.
    Catches: W_L2 computed from a damaged checkpoint or from two different models."""
    clean, fault = weights_pair()
    tsdc_io.write_checkpoint(tmp_path / "c.ckpt", "tiny", CFG, clean)
    raw = (tmp_path / "c.ckpt").read_bytes()
    (tmp_path / "flip.ckpt").write_bytes(raw[:4100] + bytes([raw[4100] ^ 1]) + raw[4101:])
    with pytest.raises(sm.MetricsError, match="checksum mismatch"):
        sm.Checkpoint(str(tmp_path / "flip.ckpt"))
    (tmp_path / "short.ckpt").write_bytes(raw[:-4])
    with pytest.raises(sm.MetricsError, match="size"):
        sm.Checkpoint(str(tmp_path / "short.ckpt"))
    (tmp_path / "magic.ckpt").write_bytes(b"X" + raw[1:])
    with pytest.raises(sm.MetricsError, match="not a train_sdc checkpoint"):
        sm.Checkpoint(str(tmp_path / "magic.ckpt"))
    cfg2 = dict(CFG, n_layer=2)
    p2 = {n: np.zeros(s, np.float32) for n, s in tsdc_io.param_layout(cfg2)}
    tsdc_io.write_checkpoint(tmp_path / "l2.ckpt", "tiny", cfg2, p2)
    with pytest.raises(sm.MetricsError, match="model config differs.*n_layer"):
        sm.weight_l2(str(tmp_path / "l2.ckpt"), str(tmp_path / "c.ckpt"))
    with pytest.raises(sm.MetricsError, match="no such file"):
        sm.Checkpoint(str(tmp_path / "none.ckpt"))


# ---------------------------------------------------------------- overhead
def test_overhead(tmp_path):
    """overhead = mean step ms of the run / of the base - 1 over the window, the first 10 steps skipped by default.
    Catches: warm-up steps in the mean, the ratio inverted, the start/steps window off by one."""
    # steps 1..10 are warm-up (slow, skipped by default); steps 11..20: 11 ms vs 10 ms -> +10 %
    base = make_run(tmp_path, "base", [1.0] * 20, ms=[500.0] * 10 + [10.0] * 10)
    run = make_run(tmp_path, "run", [1.0] * 20, ms=[1000.0] * 10 + [11.0] * 10)
    r = sm.overhead(run, base)
    assert r["overhead_pct"] == pytest.approx(10.0) and r["start"] == 11 and r["n_steps"] == 10
    r = sm.overhead(run, base, start=1, steps=2)
    assert r["overhead_pct"] == pytest.approx(100.0) and r["n_steps"] == 2
    r = sm.overhead(run, base, start=9, steps=4)   # (1000+1000+11+11)/4 / ((500+500+10+10)/4) - 1
    assert r["overhead_pct"] == pytest.approx(100 * (2022 / 1020 - 1))
    with pytest.raises(sm.MetricsError, match="no common step in the overhead window"):
        sm.overhead(run, base, start=50)
    out = cli("overhead", "--run", run, "--base", base, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["overhead_pct"] == pytest.approx(10.0)


# ---------------------------------------------------------------- the whole comparison, CLI
def test_compare_cli(tmp_path):
    """the whole comparison on hand-made runs: every metric's hand value in --json and in the text; without repeats,
    predictions or checkpoints each is None with a note. Catches: a metric fed the wrong input in compare, a missing
    input that crashes instead of giving n/a."""
    clean, fault = weights_pair()
    preds = np.arange(10)
    fpreds = preds.copy()
    fpreds[[0, 1, 2]] = 7
    c = make_run(tmp_path, "clean", [3, 2, 1], evals=[(3, 3.0, 20.0)], preds=preds, params=clean)
    r1 = make_run(tmp_path, "rep1", [3, 2.1, 0.99])
    r2 = make_run(tmp_path, "rep2", [3, 1.95, 1.02])
    f = make_run(tmp_path, "fault", [3, 2.5, 1.2], evals=[(3, 3.1, 22.5)], fault_steps=[2], preds=fpreds,
                 params=fault)
    out = cli_process("compare", "--clean", c, "--fault", f, "--clean-repeat", r1, "--clean-repeat", r2,
                      "--overhead-start", 1, "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["D_max"] == pytest.approx(0.5) and r["D_final"] == pytest.approx(0.2)
    assert r["E_final"] == pytest.approx(0.03) and r["E_max"] == pytest.approx(0.15)
    assert r["ratio_final"] == pytest.approx(0.2 / 0.03) and r["ratio_max"] == pytest.approx(0.5 / 0.15)
    assert r["delta_ppl"] == pytest.approx(2.5) and r["top1"] == pytest.approx(0.7)
    assert r["w_l2_pct"] == pytest.approx(5.0) and r["ckpt_step"] == 0
    assert r["overhead_pct"] == pytest.approx(0.0) and r["n_fault_events"] == 1 and r["t_f"] == 2
    text = cli("compare", "--clean", c, "--fault", f, "--clean-repeat", r1, "--clean-repeat", r2)
    assert text.returncode == 0, text.stderr
    for k in ("D_final", "D_max", "E_final", "E_max", "D_final/E_final", "delta_PPL", "Top-1", "W_L2", "overhead"):
        assert k in text.stdout
    assert "+5.0000e-01" in text.stdout and "70.00" in text.stdout and "6.667" in text.stdout
    # without repeats, predictions or checkpoints: n/a with notes, not errors
    g = make_run(tmp_path, "bare", [3, 2.5, 1.2])
    r = sm.compare(c, g)
    assert r["E_final"] is None and r["top1"] is None and r["w_l2_pct"] is None and r["delta_ppl"] is None
    assert r["overhead_pct"] is None  # 3 steps, all inside the default 10 warm-up steps
    assert any("overhead not computed" in n for n in r["notes"]) and len(r["notes"]) >= 4
    # explicit prediction files
    r = sm.compare(c, g, clean_pred=str(c / "pred.bin"), fault_pred=str(f / "pred.bin"))
    assert r["top1"] == pytest.approx(0.7)


def test_envelope_cli(tmp_path):
    """Catches: the envelope subcommand printing or serialising other values than envelope() computes."""
    a = make_run(tmp_path, "a", [3, 2, 1])
    b = make_run(tmp_path, "b", [3, 2.1, 0.99])
    out = cli("envelope", a, b)
    assert out.returncode == 0, out.stderr
    assert "E_final 1.0000e-02" in out.stdout and "E_max   1.0000e-01" in out.stdout
    r = json.loads(cli("envelope", a, b, "--json").stdout)
    assert r["E_final"] == pytest.approx(0.01) and r["E_max"] == pytest.approx(0.1)


def test_weights_cli(tmp_path):
    """Catches: the weights subcommand swapping fault and clean (W_L2 relative to the wrong norm) or ignoring
    --per-tensor."""
    clean, fault = weights_pair()
    tsdc_io.write_checkpoint(tmp_path / "c.ckpt", "tiny", CFG, clean)
    tsdc_io.write_checkpoint(tmp_path / "f.ckpt", "tiny", CFG, fault)
    out = cli("weights", tmp_path / "f.ckpt", tmp_path / "c.ckpt", "--per-tensor")
    assert out.returncode == 0, out.stderr
    assert "W_L2 5.0000e+00 %" in out.stdout and "wte" in out.stdout


# ---------------------------------------------------------------- propagation trace
def trace_lines(step, vals, norm_clean=1.0):
    """vals: {(site, layer): rx}; other sites of a 3-layer model get rx 0."""
    out = []
    for l in range(3):
        for site in ("q_rope", "attn_residual", "block_out"):
            out.append({"step": step, "microbatch": 0, "rank": 0, "inj_site": "q_rope", "inj_layer": 1,
                        "site": site, "layer": l, "rx": vals.get((site, l), 0.0), "norm_clean": norm_clean})
    out.append({"step": step, "microbatch": 0, "rank": 0, "inj_site": "q_rope", "inj_layer": 1,
                "site": "lm_output", "layer": -1, "rx": vals.get(("lm_output", -1), 0.0), "norm_clean": norm_clean})
    return out


def test_trace_summary(tmp_path):
    """the median rx per site over events, a NaN ranked as +inf, events whose clean tensor was non-finite left out
    and counted; a malformed record is a one-line error. Catches: a mean instead of a median, NaN dropped (a blow-up
    hidden), diverged events in the median."""
    ev1 = {("q_rope", 1): 1.0, ("attn_residual", 1): 1e-3, ("block_out", 1): 1e-3, ("block_out", 2): 4e-4,
           ("lm_output", -1): 2e-4}
    ev2 = {("q_rope", 1): 3.0, ("attn_residual", 1): 3e-3, ("block_out", 1): 1e-3, ("block_out", 2): 6e-4,
           ("lm_output", -1): 2e-4}
    ev3 = {("q_rope", 1): 2.0, ("attn_residual", 1): 2e-3, ("block_out", 1): 1e-3, ("block_out", 2): math.nan,
           ("lm_output", -1): 2e-4}
    # ev4: the run had diverged before it (clean tensors NaN, the trainer writes rx 0): left out
    recs = trace_lines(5, ev1) + trace_lines(9, ev2) + trace_lines(12, ev3) + trace_lines(14, {}, math.nan)
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = sm.trace_summary(str(p))
    assert len(s) == 1 and s[0]["inj_site"] == "q_rope" and s[0]["inj_layer"] == 1 and s[0]["n_events"] == 4
    rows = [(r["site"], r["layer"], r["rx_median"]) for r in s[0]["rows"]]
    # medians over ev1..ev3; the NaN of ev3 at block_out L2 ranks as +inf: median of (4e-4, 6e-4, inf)
    assert rows == [("q_rope", 1, pytest.approx(2.0)), ("attn_residual", 1, pytest.approx(2e-3)),
                    ("block_out", 1, pytest.approx(1e-3)), ("block_out", 2, pytest.approx(6e-4)),
                    ("lm_output", -1, pytest.approx(2e-4))]
    assert s[0]["rows"][0]["rx_events"] == [1.0, 3.0, 2.0]
    assert [r["n_clean_nonfinite"] for r in s[0]["rows"]] == [1] * 5
    assert [r["n_nonfinite"] for r in s[0]["rows"]] == [0, 0, 0, 1, 0]
    out = cli("trace", p)
    assert out.returncode == 0, out.stderr
    assert "injected q_rope @ layer 1: 4 event(s)" in out.stdout and "6.000e-04" in out.stdout
    assert "1 non-finite, 1 skipped (clean non-finite)" in out.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"step": 1, "site": "q_rope"}) + "\n")
    assert_one_error(cli("trace", bad), "bad.jsonl:1", "'microbatch'")


# ---------------------------------------------------------------- errors
def test_errors(tmp_path):
    """every missing or malformed input is a one-line error naming the file, line and field. Catches: a traceback,
    or a silently empty result, on bad input."""
    c = make_run(tmp_path, "clean", [3, 2, 1])
    assert_one_error(cli_process("compare", "--clean", c, "--fault", tmp_path / "nope"), "nope", "no such run directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_error(cli("compare", "--clean", c, "--fault", empty), "empty/log.jsonl", "no such file")
    mal = tmp_path / "mal"
    mal.mkdir()
    (mal / "log.jsonl").write_text('{"type":"step","step":1,"loss":3}\n{"type":"step","step":2,"lo\n')
    assert_one_error(cli("compare", "--clean", c, "--fault", mal), "mal/log.jsonl:2", "malformed JSON")
    (mal / "log.jsonl").write_text('{"type":"run"}\n')
    assert_one_error(cli("compare", "--clean", c, "--fault", mal), "no step records")
    (mal / "log.jsonl").write_text('{"type":"step","step":1}\n')
    assert_one_error(cli("compare", "--clean", c, "--fault", mal), "log.jsonl:1", "no 'loss'")
    (mal / "log.jsonl").write_text('{"type":"step","step":1,"loss":"x"}\n')
    assert_one_error(cli("compare", "--clean", c, "--fault", mal), "'loss' is not a number")
    # faults.jsonl malformed
    f = make_run(tmp_path, "fault", [3, 2.5, 1.2])
    (f / "faults.jsonl").write_text("{oops\n")
    assert_one_error(cli("compare", "--clean", c, "--fault", f), "faults.jsonl:1", "malformed JSON")
    # no common steps; window after the end
    far = tmp_path / "far.jsonl"
    write_log(far, [1, 2], first_step=100)
    with pytest.raises(sm.MetricsError, match="no step in common"):
        sm.loss_deviation(c, str(far))
    with pytest.raises(sm.MetricsError, match="after the last aligned step"):
        sm.loss_deviation(c, make_run(tmp_path, "f2", [3, 2, 1]), window_start=9)
    # predictions: bad file, different lengths
    g = make_run(tmp_path, "g", [3, 2, 1], preds=np.arange(10))
    h = make_run(tmp_path, "h", [3, 2, 1], preds=np.arange(9))
    assert_one_error(cli("compare", "--clean", g, "--fault", h), "not the same held-out set")
    (h / "pred.bin").write_bytes(b"TSDCTOK\0" + b"\0" * 10)
    assert_one_error(cli("compare", "--clean", g, "--fault", h), "pred.bin", "truncated")
    assert_one_error(cli("envelope", c), "at least two")
    assert_one_error(cli("trace", tmp_path / "none.jsonl"), "none.jsonl", "no such file")
    assert_one_error(cli("weights", tmp_path / "x.ckpt", tmp_path / "y.ckpt"), "x.ckpt", "no such file")


# ------------------------------------------------------------ beyond the paper: lost updates, last-K, E, detection
def write_steps(d, recs, evals=()):
    """a run dir whose log holds the given step records (dicts with at least step, loss)"""
    d.mkdir()
    lines = [json.dumps({"type": "run"})]
    for r in recs:
        base = {"type": "step", "lr": 1e-3, "grad_norm": 1.0, "ms": 10.0, "k": 0, "alarms": 0, "injections": 0,
                "replayed": 0, "found_inf": 0}
        base.update(r)
        lines.append(json.dumps(base))
    for s, vl, ppl in evals:
        lines.append(json.dumps({"type": "eval", "step": s, "val_loss": vl, "ppl": ppl}))
    lines.append(json.dumps({"type": "end", "step": recs[-1]["step"], "weights": "0"}))
    (d / "log.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_lost_updates_skipped_and_clipped_away(tmp_path):
    """skipped updates (found_inf, skip, NaN norm) and norms > 100x the median of the 32 nearest other
    steps are lost; 99x is not (a factor applied the wrong way or a mean instead of a median fails). Catches: a
    lost-update count that misses found_inf or -skip_steps updates, or lets one huge norm move the median."""
    g = [1.0] * 40
    g[5] = 150.0          # > 100 x median 1: lost
    g[10] = 99.0          # < 100 x: not lost
    g[20] = float("nan")  # found_inf: the log's grad_norm is NaN
    g[30] = 1e30          # lost; its size must not move the others' median
    g[31] = 120.0         # lost although its neighbour is 1e30
    recs = [{"step": 101 + i, "loss": 1.0, "grad_norm": g[i], "found_inf": int(i == 20), "skip": int(i == 35)}
            for i in range(40)]
    recs[35]["grad_norm"] = float("nan")
    d = write_steps(tmp_path / "r", recs)
    lu = sm.lost_updates(d)
    assert lu["skipped"] == [121, 136]
    assert lu["blown"] == [106, 131, 132]
    assert lu["lost"] == [106, 121, 131, 132, 136] and lu["n_lost"] == 5
    r = cli("lost", d, "--steps-only")
    assert r.returncode == 0 and r.stdout.split() == ["106", "121", "131", "132", "136"]


def test_lost_updates_median_of_neighbours_not_of_the_run(tmp_path):
    """the reference is local: a norm 150x its neighbours is lost even where the run's overall median is
    much larger, and a norm that only follows a slow rise is not.
    Catches: a median over the whole run (step 11 not counted lost), a fixed threshold (the rise to 1000 counted
    lost)."""
    g = [1.0] * 20 + [1000.0] * 40
    g[10] = 150.0
    recs = [{"step": i + 1, "loss": 1.0, "grad_norm": x} for i, x in enumerate(g)]
    d = write_steps(tmp_path / "r", recs)
    assert sm.lost_updates(d)["lost"] == [11]


def test_mean_deviation_last_k_and_envelope_of_every_deviation(tmp_path):
    """hand-computed: D = +0.1 on steps 1..50 and +0.3 on 51..60 -> last 10: 0.3, last 20: 0.2; a NaN
    loss is left out and counted; E_lastK, E_val, E_ppl are the largest pairwise differences.
    Catches: a NaN loss counted as 0 or turning the mean into NaN, the last-K window taken from the start, E_* from
    one pair of runs only."""
    clean = write_steps(tmp_path / "c", [{"step": s, "loss": 2.0} for s in range(1, 61)], evals=[(60, 2.0, 7.0)])
    fl = [2.1] * 50 + [2.3] * 10
    fl[-1] = float("nan")
    fault = write_steps(tmp_path / "f", [{"step": s, "loss": fl[s - 1]} for s in range(1, 61)], evals=[(60, 2.25, 9.0)])
    m, nn = sm.mean_deviation_last(clean, fault, k=10, with_count=True)
    assert m == pytest.approx(0.3) and nn == 1
    assert sm.mean_deviation_last(clean, fault, k=20) == pytest.approx((10 * 0.1 + 9 * 0.3) / 19)
    r = sm.compare(clean, fault, window_start=1)
    assert r["mean_dev_lastK"] == pytest.approx((40 * 0.1 + 9 * 0.3) / 49) and r["mean_dev_lastK_nonfinite"] == 1
    assert r["delta_val_loss"] == pytest.approx(0.25)
    r1 = write_steps(tmp_path / "r1", [{"step": s, "loss": 2.0 + (0.01 if s > 55 else 0)} for s in range(1, 61)],
                     evals=[(60, 2.02, 7.1)])
    r2 = write_steps(tmp_path / "r2", [{"step": s, "loss": 2.0 - 0.002} for s in range(1, 61)], evals=[(60, 1.99, 6.95)])
    e = sm.envelope_all([clean, r1, r2], k=10)
    assert e["E_lastK"] == pytest.approx(0.005 + 0.002)   # r1 mean 2.005, r2 1.998
    assert e["E_val"] == pytest.approx(0.03) and e["E_ppl"] == pytest.approx(0.15)
    assert e["E_final"] == pytest.approx(0.012)


def test_detection_counts_read_caught_qk_and_false_alarms(tmp_path):
    """events the model reads (live > 0) caught when their step was replayed; Q/K-path events of both
    passes; a replay on a step without an event is a false alarm.
    Catches: events in unread (masked) elements counted as missed, backward Q/K-path events left out, replays of
    faulty steps counted as false alarms."""
    recs = [{"step": s, "loss": 1.0, "injections": int(s <= 4), "replayed": int(s in (1, 2, 5))} for s in range(1, 7)]
    d = write_steps(tmp_path / "r", recs)
    ev = [(1, "q_rope", "fwd", 10), (2, "att_logits", "fwd", 0), (3, "k_proj", "bwd", 10), (4, "down_proj", "bwd", 10)]
    (d / "faults.jsonl").write_text("".join(json.dumps({"type": "fault", "step": s, "site": site, "pass": p, "m": 10,
                                                        "live": live}) + "\n" for s, site, p, live in ev))
    det = sm.detection(d)
    assert det["events"] == 4 and det["read"] == 3 and det["caught_read"] == 1 and det["caught"] == 2
    assert det["qk"] == 2 and det["qk_caught"] == 1 and det["fwd"] == 2 and det["fwd_caught"] == 2
    assert det["qk_fwd"] == 1 and det["qk_fwd_caught"] == 1
    assert det["false_alarms"] == 1 and det["replayed"] == 3
