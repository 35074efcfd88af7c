"""The reproduction driver end to end at toy scale (scripts/reproduce.sh --smoke): every run of the plan
finishes, the report has every table and figure of the paper's evaluation, a second invocation resumes
(runs nothing again), and bad options fail with one line."""
import argparse
import json
import os
import subprocess
import sys
import time

from test_trainer import MPIRUN, ROOT

SCRIPT = os.path.join(ROOT, "scripts", "reproduce.sh")


def test_reproduce_smoke(tmp_path):
    """Catches: a table or figure missing from the report, a run that ended before its last step, a second call that
    reruns finished runs."""
    out = tmp_path / "rep"
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    t0 = time.time()
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--out", str(out)], capture_output=True, text=True, env=env, timeout=3000)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    first = time.time() - t0
    rep = (out / "REPORT.md").read_text()
    heads = ["## Table 1", "## Table 2", "## Table 3", "## Table 5", "## Table 6", "## Figure 3", "## Figure 5", "Beyond the paper"]
    if MPIRUN:  # the single-process-against-three-ranks comparison needs MPI; without it the report leaves it out
        heads.append("One process against three ranks")
    for head in heads:
        assert head in rep, head
    for label in ("Loss spike", "Inf/NaN", "ATTNChecker", "Harmful-update", "LLMFT", "TrainSDC (ours)"):
        assert f"| {label} |" in rep, label
    assert (out / "figures" / "figure3.png").stat().st_size > 1000
    assert (out / "figures" / "figure5.png").stat().st_size > 1000
    assert "ETA" in p.stdout
    # every run of the plan reached its last step: its log's end record is at the step it had to reach
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import reproduce
    P = dict(reproduce.PRESETS["smoke"])
    a = argparse.Namespace(out=str(out), train="x", val="x", preset="smoke")
    plan = reproduce.build_plan(a, P)
    for j in plan.jobs:
        recs = [json.loads(l) for l in open(os.path.join(j["dir"], "log.jsonl"))]
        ends = [r["step"] for r in recs if r["type"] == "end"]
        assert ends and ends[-1] == j["end"] == max(r["step"] for r in recs if r["type"] == "step"), (j["name"], ends, j["end"])
    for key in ("ours_all_m10", "control_m10", "fault_ac_m10", "clean_p1"):
        assert any(j["name"].endswith("/" + key) for j in plan.jobs), key
    for head in ("Beyond the paper: lost updates", "Fidelity: bf16 storage against autocast"):
        assert head in rep, head
    # resumable: everything is there, so a second call runs nothing and rewrites the same report
    p2 = subprocess.run(["bash", SCRIPT, "--smoke", "--out", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert p2.returncode == 0, p2.stderr[-2000:]
    assert "0 to run" in p2.stdout
    print(f"smoke: {first:.0f} s")


def test_reproduce_bad_options():
    """an unknown preset, the paper preset without --train, an unknown option: exit 1 with a message naming it.
    Catches: a bad option ignored (a long run with defaults) or a traceback."""
    p = subprocess.run(["bash", SCRIPT, "--preset", "huge"], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "--preset" in p.stderr
    p = subprocess.run(["bash", SCRIPT, "--preset", "paper"], capture_output=True, text=True)
    assert p.returncode == 1 and "--train" in p.stderr
    p = subprocess.run(["bash", SCRIPT, "--bogus"], capture_output=True, text=True)
    assert p.returncode == 1 and "--bogus" in p.stderr


def test_reproduce_fails_loudly_when_a_run_fails(tmp_path):
    """a trainer run that fails (a corrupt common checkpoint behind a finished pre-training log) stops the
    job with exit 1, the run named, the other runs stopped.
    Catches: a failed run swallowed and a report written from missing logs."""
    out = tmp_path / "rep"
    pre = out / "tiny-llama" / "pre"
    pre.mkdir(parents=True)
    (pre / "log.jsonl").write_text('{"type":"end","step":64,"weights":"0"}\n{"type":"end","step":130,"weights":"0"}\n')
    for f in ("step_000064.ckpt", "step_000130.ckpt", "rgg.cal", "bwd.cal"):
        (pre / f).write_bytes(b"garbage" * 16)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode != 0, p.stdout[-2000:]
    assert "error: run tiny-llama/" in p.stderr and "failed" in p.stderr, p.stderr[-2000:]
    assert not (out / "REPORT.md").exists()
