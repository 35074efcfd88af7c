"""The characterisation driver (scripts/characterize.sh, paper Section 3, Experiments 1 and 2): its
--smoke mode runs end to end on the CPU (tiny-llama and tiny-nanochat, 3 sites forward and backward,
steps 21-30 after a common checkpoint at step 20) and leaves the Figure 1 panels and a table with
every row; a second invocation skips every finished run; the paper preset's --dry prints the paper's
schedule. Data: tinyshakespeare prepared by the script itself (../shared/data, TSDC_DATA_DIR)."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "characterize.sh")
DATA_DIR = os.environ.get("TSDC_DATA_DIR", os.path.join(ROOT, "..", "shared", "data"))
SITES = ["q_proj", "v_proj", "block_out"]
MODELS = {"llama": "tiny-llama", "nanochat": "tiny-nanochat"}


def drive(*args, timeout=600):
    env = dict(os.environ, PYTHON=sys.executable)
    p = subprocess.run(["bash", SCRIPT, *map(str, args)], cwd=ROOT, capture_output=True, text=True, env=env,
                       errors="replace", timeout=timeout)
    assert p.returncode == 0, f"characterize.sh {' '.join(map(str, args))} failed ({p.returncode}):\n" \
                              f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("char")
    if not os.path.exists(os.path.join(DATA_DIR, "tinyshakespeare.txt")):
        pytest.skip(f"no {DATA_DIR}/tinyshakespeare.txt")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.fail("matplotlib is missing: it is in requirements.txt (make venv)")
    data = tmp / "data"
    # the script prepares the data itself when absent: do it here from TSDC_DATA_DIR's copy
    subprocess.run([sys.executable, os.path.join(ROOT, "dev", "data", "tinyshakespeare.py"), "--input",
                    os.path.join(DATA_DIR, "tinyshakespeare.txt"), "--out", str(data)], check=True,
                   capture_output=True, cwd=ROOT)
    out = tmp / "out"
    first = drive("--preset", "tiny", "--smoke", "--out", out, "--data", data)
    second = drive("--preset", "tiny", "--smoke", "--out", out, "--data", data)
    return out, first, second


def test_smoke_writes_figures_and_table(smoke):
    """--smoke leaves the six Figure 1 panels and figure1.png as real PNGs, and results.md with one Experiment 1 row
    per model, pass and site plus one clean-repeat row a model, both Experiment 2 sections and the exact commands.
    Catches: a figure missing or empty, a model, pass or site dropped from the table, commands printed without their
    fault flags."""
    out, first, _ = smoke
    for f in ["fig1a.png", "fig1b.png", "fig1c.png", "fig1d.png", "fig1e.png", "fig1f.png", "figure1.png"]:
        p = out / f
        assert p.exists() and p.stat().st_size > 1000, f
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n", f
    md = (out / "results.md").read_text()
    for model, preset in MODELS.items():
        assert f"## {preset} " in md
    # one Experiment 1 row per model, pass and site, and one per clean repeat
    rows = [l for l in md.splitlines() if re.match(r"^\| (fwd|bwd|-) \|", l)]
    assert len(rows) == 2 * (2 * len(SITES) + 1), rows
    for pas in ("fwd", "bwd"):
        for s in SITES:
            assert sum(1 for l in rows if re.match(rf"^\| {pas} \| {s}( \*)? \|", l)) == 2, (pas, s)
    assert sum(1 for l in rows if l.startswith("| - | clean, -perturb 65536 |")) == 2
    # Experiment 2 rows: the forward sites of each model
    assert md.count("### Experiment 2") == 2
    # the exact commands, with the fault flags
    assert "-fault_mode char -fault_sites q_proj -fault_pass bwd" in md
    assert re.search(r"\[\d+/18\] done nanochat/bwd_block_out", first)


def test_smoke_numbers(smoke):
    """results.json: a model's fault runs share one schedule inside steps 21-30, log m = 10, T 30 and 10 steps, have
    W_L2 and (forward) one trace per event; some fault changes the run; the repeat is -perturb 65536 and differs by
    0 < W_L2 < 0.05 %. Catches: sites of a model hit at other steps (not comparable), events outside the window, a
    trace missing events, a repeat identical to the clean run (E = 0) or far from it."""
    out, _, _ = smoke
    res = json.loads((out / "results.json").read_text())
    assert set(res["models"]) == set(MODELS)
    faults = [r for r in res["runs"] if r["kind"] == "fault"]
    assert len(faults) == 2 * 2 * len(SITES)
    for model in MODELS:
        m = res["models"][model]
        assert (m["C"], m["S"]) == (20, 30)
        rs = [r for r in faults if r["model"] == model]
        # the shared schedule: every site of a model is hit at the same steps, inside the window
        steps = {tuple(r["events"]) for r in rs}
        assert len(steps) == 1 and len(next(iter(steps))) >= 1, steps
        assert all(21 <= s <= 30 for s in next(iter(steps)))
        for r in rs:
            assert r["m_logged"] == [10]
            assert r["T"] == 30 and r["n_steps"] == 10
            assert r["w_l2_pct"] is not None
            if r["pass"] == "fwd":
                assert r["trace_events"] == len(r["events"])
        # a fault changes the run: some site ends with a different loss or different weights
        assert any(r["D_final"] != 0 or r["w_l2_pct"] != 0 for r in rs)
        # the repeat differs from the clean run by rounding only
        rep = [r for r in res["runs"] if r["model"] == model and r["kind"] == "repeat"]
        assert len(rep) == 1 and rep[0]["perturb"] == 65536        # one bf16 ulp (the tiny preset's --perturb)
        assert 0 < float(rep[0]["w_l2_pct"]) < 0.05


def test_every_run_reached_its_last_step(smoke):
    """a run that stopped early must not pass: every run directory's log ends with its end record
    at the step its command had to reach (-stop_at, else -steps), after a step record of that step.
    Catches: a trainer run that stopped early (crash, -stop_at misread) behind a finished-looking table."""
    out, _, _ = smoke
    cmds = sorted(out.rglob("cmd"))
    assert len(cmds) >= 18, cmds
    for c in cmds:
        args = c.read_text().split()
        target = int(args[args.index("-stop_at") + 1] if "-stop_at" in args else args[args.index("-steps") + 1])
        recs = [json.loads(l) for l in open(c.parent / "log.jsonl")]
        ends = [r["step"] for r in recs if r["type"] == "end"]
        assert ends and ends[-1] == target, (c.parent, ends, target)
        assert max(r["step"] for r in recs if r["type"] == "step") == target, c.parent


def test_a_failed_run_fails_the_driver(tmp_path):
    """characterize.sh stops with exit 1 and the run's output when a trainer run fails (here: missing data).
    Catches: a driver that swallows a trainer failure and goes on to the table."""
    env = dict(os.environ, PYTHON=sys.executable)
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text("{}")
    for f in ("train.bin", "val.bin"):
        (data / f).write_bytes(b"not a shard" * 10)
    p = subprocess.run(["bash", SCRIPT, "--preset", "tiny", "--smoke", "--out", str(tmp_path / "out"), "--data", str(data)],
                       cwd=ROOT, capture_output=True, text=True, env=env, errors="replace", timeout=600)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "FAILED" in p.stderr and "error: a run failed" in p.stderr, p.stderr[-2000:]


def test_second_invocation_skips_finished_runs(smoke):
    """the second --smoke call finds the 18 runs done and starts none. Catches: a driver that reruns finished runs
    (an interrupted job restarts from scratch) or whose done-test never matches."""
    _, _, second = smoke
    assert "18 already done, 0 to run" in second, second[-2000:]
    assert "start " not in second


def test_paper_preset_dry_run():
    """--preset paper --dry: 2 prefixes, 2 clean runs, 6 repeats and every site forward and backward for each model,
    with the paper's layer, m, rate, fault window, prefix checkpoint, batch and rank, a trace on the forward runs;
    --layer, --frac, --rate reach the commands (Figure 4). Catches: a paper schedule drifted from Section 3 (wrong
    window, layer, m, rate, resume step) and variant flags ignored."""
    out = drive("--preset", "paper", "--dry", "--llama-data", "data/smol", "--nanochat-data", "data/nano")
    cmds = [l for l in out.splitlines() if l.startswith("./train_sdc_cu")]
    # 2 prefixes, 2 clean, 6 repeats, and every site forward and backward (18 a model)
    assert len(cmds) == 2 + 2 + 6 + 2 * 2 * 18, len(cmds)
    smol = [c for c in cmds if "-preset smollm2-135m" in c and "-fault_mode char" in c]
    nano = [c for c in cmds if "-preset nanochat-d12" in c and "-fault_mode char" in c]
    assert len(smol) == len(nano) == 36
    for c in smol:
        assert "-fault_layer 20 -fault_m 100000" in c and "-fault_rate 0.01 -fault_start 1222 -fault_end 2035" in c
        assert "-resume runs/characterize/paper/llama/prefix/step_001221.ckpt" in c and "-steps 2035" in c
    for c in nano:
        assert "-fault_layer 5 -fault_m 100000" in c and "-fault_rate 0.01 -fault_start 955 -fault_end 1907" in c
        assert "-resume runs/characterize/paper/nanochat/prefix/step_000954.ckpt" in c
    assert all("-B 1 -accum 48 -seq 1024" in c and "-fault_rank 0" in c for c in smol + nano)
    assert sum("-trace_out" in c for c in smol) == 18
    prefix = [c for c in cmds if "-stop_at" in c]
    assert any("-stop_at 1221" in c for c in prefix) and any("-stop_at 954" in c for c in prefix)
    # Figure 4's variants are flags away
    out = drive("--preset", "paper", "--dry", "--models", "llama", "--passes", "fwd", "--frac", "0.01",
                "--layer", "10", "--rate", "0.001")
    f = [l for l in out.splitlines() if "-fault_mode char" in l]
    assert len(f) == 18 and all("-fault_layer 10 -fault_frac 0.01" in c and "-fault_rate 0.001" in c for c in f)
