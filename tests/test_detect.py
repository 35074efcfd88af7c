"""Baseline detectors (docs/design.md, the baselines, llmc/sdc/detect.h) and the cheap attention checks (-protect att,
llmc/sdc/attcheck.h) in the CPU trainer: each fires on a fault it should catch and replays the step like
TrainSDC's alarms, each stays quiet on clean steps, the learned detector trains on one campaign and
works on another, observation mode never replays, and bad flags and model files fail with one line."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_trainer import ROOT, run, steps, data, expect_error  # noqa: F401,E402
from test_protect import small, ckpt  # noqa: E402

LLMFT_TRAIN = os.path.join(ROOT, "scripts", "llmft_train.py")


def faults(out):
    """the fault log's events; a missing log is an error (a run that injected nothing must not pass)"""
    return [json.loads(l) for l in open(os.path.join(out, "faults.jsonl"))]


def test_detectors_quiet_on_clean_steps(data, tmp_path):
    """40 steps of training first (as the comparison resumes from a common checkpoint), then 100 clean
    steps with every detector and check on.
    Catches: a detector or check that fires on clean training (false alarms, replays), features never computed (z
    scores all 0), un/gn not logged."""
    for preset, prec in (("tiny-llama", "fp32"), ("tiny-qwen3", "bf16")):
        out = tmp_path / preset
        kw = {"-preset": preset, "-precision": prec, "-steps": 140, "-accum": 2}
        run(small(data, out, **kw, **{"-stop_at": 40}))
        run(small(data, out, **kw, **{"-resume": out / "step_000040.ckpt", "-detect": "loss,nan,abft,harmful",
                                      "-protect": "att"}))
        st = {s: r for s, r in steps(out).items() if s > 40}
        assert len(st) == 100
        assert sum(r["replayed"] for r in st.values()) == 0, [(s, r["alarm"]) for s, r in st.items() if r["replayed"]]
        assert all(r["det"] == "" for r in st.values())
        # the features are computed: after 8 steps of history the z scores are not all zero
        assert any(abs(r["feat"][0]) > 0 for r in st.values())
        assert all(r["un"] > 0 and r["gn"] > 0 for r in st.values())


@pytest.mark.parametrize("site,flags,source", [
    ("att_logits", {"-detect": "abft"}, "abft"),
    ("att_out", {"-detect": "abft"}, "abft"),
    ("att_logits", {"-protect": "att"}, "att"),
    ("att_probs", {"-protect": "att"}, "att"),
])
def test_attention_checks_catch_live_attention_faults(data, tmp_path, site, flags, source):
    """exponent faults in the attention tensors: every event that hits an element the model reads is
    caught and replayed; events wholly in the masked triangle are harmless and pass; so the run ends
    bit-identical to the fault-free run.
    Catches: a check that misses live faults in its tensor, one that alarms on masked (harmless) elements, a replay
    that does not restore the fault-free result."""
    kw = {"-preset": "tiny-llama", "-precision": "bf16", "-steps": 12, "-accum": 2}
    run(small(data, tmp_path / "clean", **kw, **flags))
    out = tmp_path / "f"
    run(small(data, out, **kw, **flags, **{"-fault_mode": "campaign", "-fault_sites": site, "-fault_pass": "fwd",
                                          "-fault_m": 10, "-fault_field": "exponent", "-fault_seed": 5}))
    st, ev = steps(out), faults(out)
    assert len(ev) == 12
    live = 0
    for e in ev:
        r = st[e["step"]]
        if e["live"] > 0:
            live += 1
            assert r["replayed"] == 1 and source in r["by"].split(","), (e, r)
        else:
            assert r["replayed"] == 0, (e, r)
    assert live >= 6
    assert ckpt(out, 12) == ckpt(tmp_path / "clean", 12)


def test_abft_passes_probability_faults(data, tmp_path):
    """ATTNChecker verifies each matrix product against its own inputs: a finite fault in the
    probabilities (between softmax and P V) gives consistent checksums, so it is not an ABFT alarm.
    Catches an ABFT check that compares with the clean side of the probabilities (it would claim a
    coverage ATTNChecker does not have)"""
    out = tmp_path / "f"
    run(small(data, out, **{"-preset": "tiny-llama", "-precision": "fp32", "-steps": 10, "-accum": 2, "-detect": "abft",
                            "-fault_mode": "campaign", "-fault_sites": "att_probs", "-fault_pass": "fwd", "-fault_m": 10,
                            "-fault_field": "mantissa", "-fault_seed": 3}))
    st, ev = steps(out), faults(out)
    # one event a step, most of them in the causal rows the model reads (live): the faults are real
    assert len(ev) == 10 and all(st[e["step"]]["injections"] == 1 for e in ev)
    assert sum(e["live"] > 0 for e in ev) >= 5, [e["live"] for e in ev]
    assert sum(r["replayed"] for r in st.values()) == 0


def one_fault(step, site, **kw):
    a = {"-fault_mode": "campaign", "-fault_sites": site, "-fault_start": step, "-fault_end": step, "-fault_mb": 0}
    a.update(kw)
    return a


def test_loss_spike_detector(data, tmp_path):
    """the sign of every element of the last block's output flipped at step 40: a finite loss spike.
    Catches: a loss z threshold that a finite spike never reaches (or the spike caught as NaN instead), replays on
    clean steps, a replay that does not restore the clean run."""
    kw = {"-preset": "tiny-llama", "-precision": "fp32", "-steps": 50, "-accum": 2, "-detect": "loss,nan"}
    run(small(data, tmp_path / "clean", **kw))
    out = tmp_path / "f"
    run(small(data, out, **kw, **one_fault(40, "block_out", **{"-fault_layer": 3, "-fault_frac": 1.0,
                                                               "-fault_field": "sign", "-fault_bits": 1})))
    st = steps(out)
    assert st[40]["replayed"] == 1 and st[40]["by"] == "loss", st[40]   # finite: the Inf/NaN detector is silent
    assert st[40]["feat"][0] > 6
    assert sum(r["replayed"] for r in st.values()) == 1
    assert ckpt(out, 50) == ckpt(tmp_path / "clean", 50)


def test_nan_detector(data, tmp_path):
    """1000 flips of down_proj at layer 1, step 20 (bf16) make the loss non-finite: the Inf/NaN detector alone
    replays step 20 and logs its feature. Catches: a NaN check that never fires, or fires on clean steps."""
    out = tmp_path / "f"
    run(small(data, out, **{"-preset": "tiny-llama", "-precision": "bf16", "-steps": 30, "-accum": 2, "-detect": "nan"},
              **one_fault(20, "down_proj", **{"-fault_layer": 1, "-fault_m": 1000})))
    st = steps(out)
    assert st[20]["replayed"] == 1 and st[20]["by"] == "nan" and st[20]["feat"][3] == 1, st[20]
    assert sum(r["replayed"] for r in st.values()) == 1


def test_harmful_update_detector(data, tmp_path):
    """a backward fault: one exponent bit flipped in 100 gradient elements of down_proj's output makes a
    huge but finite gradient; the gradient-norm history flags it before the update.
    Catches: a gradient-norm z score that never reaches its threshold, replays on clean steps."""
    out = tmp_path / "f"
    run(small(data, out, **{"-preset": "tiny-llama", "-precision": "fp32", "-steps": 40, "-accum": 2,
                            "-detect": "harmful"},
              **one_fault(30, "down_proj", **{"-fault_pass": "bwd", "-fault_layer": 2, "-fault_m": 100,
                                             "-fault_field": "exponent", "-fault_bits": 1})))
    st = steps(out)
    assert st[30]["replayed"] == 1 and st[30]["by"] == "harmful", st[30]
    assert st[30]["feat"][1] > 6
    assert sum(r["replayed"] for r in st.values()) == 1


def test_observe_mode_logs_and_never_replays(data, tmp_path):
    """-detect_observe 1: the harmful-update detector names the step-30 backward fault in det, and nothing is
    replayed. Catches: an observation mode that replays (changing the run it should only watch) or logs nothing."""
    out = tmp_path / "f"
    run(small(data, out, **{"-preset": "tiny-llama", "-precision": "fp32", "-steps": 40, "-accum": 2,
                            "-detect": "loss,nan,harmful", "-detect_observe": 1},
              **one_fault(30, "down_proj", **{"-fault_pass": "bwd", "-fault_layer": 2, "-fault_m": 100,
                                             "-fault_field": "exponent", "-fault_bits": 1})))
    st = steps(out)
    assert sum(r["replayed"] for r in st.values()) == 0
    assert "harmful" in st[30]["det"].split(",")


def test_llmft_trains_on_one_campaign_and_works_on_another(data, tmp_path):
    """LLMFT trained by llmft_train.py on one campaign and a clean run catches >= 10 events of another campaign and
    raises no alarm on a clean run of other weights. Catches: a model file the trainer reads wrongly (features out
    of order, threshold ignored), a detector that only fits its training run, false alarms."""
    kw = {"-preset": "tiny-llama", "-precision": "fp32", "-steps": 120, "-accum": 2}
    camp = {"-fault_mode": "campaign", "-fault_sites": "all", "-fault_pass": "both", "-fault_m": 100,
            "-fault_field": "exponent", "-fault_bits": 2}
    # training set: a clean run and a campaign (clean steps 1..59, then one event a step), features
    # observed, nothing replayed
    obs = {"-detect": "loss,nan,harmful", "-detect_observe": 1}
    train, train_clean = tmp_path / "train", tmp_path / "train_clean"
    run(small(data, train_clean, **kw, **obs))
    run(small(data, train, **kw, **camp, **obs, **{"-fault_start": 60, "-fault_seed": 101}))
    model = tmp_path / "llmft.txt"
    p = subprocess.run([sys.executable, LLMFT_TRAIN, "--run", str(train), "--run", str(train_clean), "--out", str(model)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "threshold" in p.stdout
    # another campaign (other seed): it catches faults; on a clean run of other weights it stays quiet
    other = tmp_path / "other"
    run(small(data, other, **kw, **camp, **{"-fault_start": 60, "-fault_seed": 202, "-detect": "llmft",
                                            "-llmft_model": model}))
    st = steps(other)
    caught = [s for s in range(60, 121) if st[s]["replayed"] and "llmft" in st[s]["by"]]
    assert len(caught) >= 10, len(caught)
    clean = tmp_path / "clean"
    run(small(data, clean, **kw, **{"-detect": "llmft", "-llmft_model": model, "-seed": 9}))
    assert sum(r["replayed"] for r in steps(clean).values()) == 0


def test_detector_flag_errors(data, tmp_path):
    """unknown -detect names, llmft without -llmft_model, -detect_observe without a detector, malformed model files,
    an unknown -protect part: each a one-line error naming it. Catches: bad flags silently ignored (a run without
    the detector it was asked for)."""
    base = small(data, tmp_path / "e", **{"-preset": "tiny-llama", "-steps": 2})
    expect_error(run(base + ["-detect", "bogus"], check=False), "-detect", "bogus")
    expect_error(run(base + ["-detect", "llmft"], check=False), "-llmft_model")
    expect_error(run(base + ["-detect_observe", "1"], check=False), "-detect_observe")
    bad = tmp_path / "bad.txt"
    bad.write_text("TSDC-LLMFT 1\nfeatures z_loss z_grad_norm\n")
    expect_error(run(base + ["-detect", "llmft", "-llmft_model", bad], check=False), str(bad))
    bad.write_text("hello\n")
    expect_error(run(base + ["-detect", "llmft", "-llmft_model", bad], check=False), str(bad), "TSDC-LLMFT")
    expect_error(run(base + ["-protect", "att,bogus"], check=False), "-protect", "bogus")
