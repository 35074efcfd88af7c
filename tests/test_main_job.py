"""The README's first command, scripts/sdc_compare.sh, at smoke scale: it finishes with the table of its six
rows and the figure (OUT/loss_deviation.png, a valid PNG); every trainer run reached its last step (its log's
end record there); the campaign is the same in every faulty run and spares the last step (-fault_end);
-protect all loses no update and raises no false alarm; the control skips exactly the faulty run's lost updates.
A trainer run that fails stops the job loudly (exit 1, the run named), never a table with n/a in it.
The same smoke job's window on the GPU trainer under the CUDA emulation (--trainer emu, from the CPU job's common
checkpoint: about 6 minutes) must give a table with the same rows and columns, and the two trainers must catch the
same fault events."""
import json
import shutil
import os
import subprocess
import sys

import pytest

from test_plot import png_size
from test_trainer import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "sdc_compare.sh")
RUNS = ("clean", "clean_p1", "clean_m1", "clean_prot", "faulty", "protected_paper", "protected_all", "control")


def records(d):
    return [json.loads(l) for l in open(os.path.join(d, "log.jsonl"))]


def run_smoke(out, trainer):
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--trainer", trainer, "--out", str(out)], capture_output=True,
                       text=True, timeout=2400, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p


def table(out):
    lines = [l for l in (out / "table.md").read_text().splitlines() if l.startswith("| ")]
    head = [c.strip() for c in lines[0].split("|")[1:-1]]
    rows = {c[0]: dict(zip(head, c)) for c in ([x.strip() for x in l.split("|")[1:-1]] for l in lines[1:])}
    return head, rows


def goal_rows(out):
    """the table's goal lines (their names, without the measured values)"""
    return [l.split(":")[0] for l in (out / "table.md").read_text().splitlines() if l.startswith("Goal")]


@pytest.fixture(scope="module")
def cpu_smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp_cpu") / "cmp"
    return out, run_smoke(out, "cpu")


@pytest.fixture(scope="module")
def emu_smoke(tmp_path_factory, cpu_smoke):
    """the smoke job on the emulated GPU trainer from the CPU smoke job's common checkpoint and calibrations (copied
    into its OUT: the job finds them and goes straight to the window's runs). Checkpoints are the same format on both
    trainers (tests/test_emu.py resumes each in the other), so both windows start from the same weights and the
    comparison of the events caught is of the protection alone; it also saves the emulated pre-training (130 steps,
    about a third of the job); the emulated trainer's own calibration is tested in tests/test_emu.py."""
    out = tmp_path_factory.mktemp("cmp_emu") / "cmp"
    out.mkdir()
    shutil.copytree(cpu_smoke[0] / "pre", out / "pre")
    return out, run_smoke(out, "emu")


def check_smoke(out, p):
    """Catches: a crashed or early-ended run behind a table (no end record at step 142), a job without its figure
    (or a file that is not a PNG), a fault on the last step,
    faulty runs with different campaigns, -protect all losing updates or raising false alarms, a forward Q/K-path
    event missed, a control that skips other steps than the faulty run's lost updates."""
    head, rows = table(out)
    assert set(rows) == {"clean", "clean_prot", "faulty", "protected_paper", "protected_all", "control"}, rows
    # every run reached its last step: the end record at step 142 (130 + 12), after a step record of 142
    for name in RUNS:
        recs = records(out / name)
        ends = [r for r in recs if r["type"] == "end"]
        assert len(ends) == 1 and ends[0]["step"] == 142, (name, ends)
        assert max(r["step"] for r in recs if r["type"] == "step") == 142, name
    for name in ("faulty", "protected_paper", "protected_all"):
        f = [json.loads(l) for l in open(out / name / "faults.jsonl")]
        assert [r["step"] for r in f] == list(range(131, 142)), name      # -fault_end: no event on the last step
        assert rows[name]["faults"] == "11"
    allp, clp = rows["protected_all"], rows["clean_prot"]
    assert allp["lost updates"] == "0" and allp["false alarms"] == "0", allp
    qk_c, qk_n = allp["Q/K events caught: fwd, bwd"].split(",")[0].split("/")
    assert qk_c == qk_n, allp      # every forward Q/K-path event (Q/K recomputation)
    assert clp["replayed"] == "0" and clp["false alarms"] == "0", clp
    # the control skipped exactly the faulty run's lost updates, and they are what the table counts
    lost = [int(x) for x in (out / "control.steps").read_text().split()]
    skipped = [r["step"] for r in records(out / "control") if r["type"] == "step" and r.get("skip")]
    assert skipped == lost and rows["faulty"]["lost updates"] == rows["control"]["lost updates"] == str(len(lost))
    assert "Goal of protected_all" in (out / "table.md").read_text()
    # the figure: a PNG of the loss deviation (scripts/sdc_compare_plot.py, 990 x 660 at 110 dpi), its path printed
    png = out / "loss_deviation.png"
    assert png.is_file() and str(png) in p.stdout, p.stdout[-2000:]
    w, h = png_size(png)
    size = png.stat().st_size
    assert 600 <= w <= 3000 and 400 <= h <= 2000 and 20_000 <= size <= 1_000_000, (w, h, size)


def test_sdc_compare_smoke(cpu_smoke):
    check_smoke(*cpu_smoke)
    assert (cpu_smoke[0] / "trainer").read_text().strip() == "cpu"
    assert (cpu_smoke[0] / "bin" / "train_sdc").is_file()


def caught_events(out, run):
    """(step, site, pass, layer) of each fault event of RUN (faults.jsonl), with whether the run caught it (its
    step replayed: scripts/sdc_metrics.py's detection())"""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import sdc_metrics
    st = sdc_metrics.read_log(str(out / run)).steps
    return {(int(f["step"]), f.get("site"), f.get("pass"), f.get("layer")):
            bool(st.get(int(f["step"]), {}).get("replayed", 0)) for f in sdc_metrics.read_faults(str(out / run))}


# events the GPU trainer (emulated) and the CPU trainer may judge differently, with the reason; empty: none
CROSS_TRAINER_DIFFERENCES = {}


def test_sdc_compare_smoke_emu(emu_smoke, cpu_smoke):
    """--trainer emu (from the CPU job's common checkpoint, emu_smoke): every run of the window ran ./train_sdc_emu
    (its private copy in OUT/bin), the table has the CPU trainer's rows, columns and goal lines, and on the same
    campaign from the same weights the two trainers saw the same fault events and caught the same ones under
    -protect paper and -protect all.
    Catches: a --trainer that is ignored (the CPU binary run), a GPU-trainer flag the job passes but the trainer
    refuses (a failed stage), a table column missing on the GPU trainer, a protection kind that catches on one
    trainer and not on the other."""
    out, p = emu_smoke
    check_smoke(out, p)
    assert (out / "trainer").read_text().strip() == "emu"
    assert (out / "bin" / "train_sdc_emu").is_file() and not (out / "bin" / "train_sdc").exists()
    assert "build (train_sdc_emu)" in p.stdout
    cout = cpu_smoke[0]
    (h_e, r_e), (h_c, r_c) = table(out), table(cout)
    assert h_e == h_c and set(r_e) == set(r_c), (h_e, h_c)
    assert goal_rows(out) == goal_rows(cout) and goal_rows(out), goal_rows(out)
    # the emulator's wall time says nothing about a GPU: no overhead figure from it (the CPU's is a number)
    assert r_e["clean_prot"]["overhead % (CPU)"] == "n/a" and r_c["clean_prot"]["overhead % (CPU)"] != "n/a"
    for run in ("faulty", "protected_paper", "protected_all"):
        e, c = caught_events(out, run), caught_events(cout, run)
        assert set(e) == set(c), (run, sorted(set(e) ^ set(c)))      # the same campaign on both trainers
    for run in ("protected_paper", "protected_all"):
        e, c = caught_events(out, run), caught_events(cout, run)
        differ = {k for k in e if e[k] != c[k] and k not in CROSS_TRAINER_DIFFERENCES}
        assert not differ, (run, sorted(differ))


def test_sdc_compare_rejects_a_bad_trainer_and_a_mixed_out(tmp_path):
    """--trainer other than cpu, gpu, emu is a one-line error; an OUT holding runs of another trainer is refused
    (one table never mixes two trainers' runs).
    Catches: a typo silently running the CPU trainer; a GPU job resuming into a CPU job's directory."""
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--trainer", "tpu", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "--trainer must be cpu, gpu or emu" in p.stderr, p.stderr
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "trainer").write_text("cpu\n")
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--trainer", "emu", "--out", str(out)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 1 and "holds runs of --trainer cpu, not emu" in p.stderr, p.stderr[-2000:]
    assert not (out / "pre").exists()


def test_sdc_compare_fails_loudly_when_a_run_fails(tmp_path):
    """a trainer failure (here: a corrupt common checkpoint, so every run from it fails at once) ends the
    job with exit 1 naming the run, and no table.
    Catches: a driver that swallows a trainer's failure (`... || true`) and prints a table with n/a."""
    out = tmp_path / "cmp"
    (out / "pre").mkdir(parents=True)
    for f in ("step_000130.ckpt", "rgg.cal", "bwd.cal"):
        (out / "pre" / f).write_bytes(b"not a checkpoint" * 8)
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "error: trainer run" in p.stderr and "step_000130.ckpt" in p.stderr, p.stderr[-2000:]
    # it stopped there: no later stage ran on the failed runs' missing logs (a driver that only printed the
    # failure and went on would fail in the lost-update or table step, on a missing log.jsonl)
    assert "log.jsonl" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not (out / "table.md").exists() and not (out / "control.steps").exists()


def test_sdc_compare_figure_fails_loudly(tmp_path):
    """--plot-only on an OUT without the runs: exit 1 with the plotter's error and the job's, and no PNG.
    Catches: a figure stage whose failure is swallowed (a job that ends 'finished' without its figure)."""
    out = tmp_path / "cmp"
    out.mkdir()
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--plot-only", "--out", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "clean: no such run directory" in p.stderr and "error: the figure" in p.stderr, p.stderr[-2000:]
    assert not (out / "loss_deviation.png").exists()


def test_sdc_compare_several_intensities(cpu_smoke, tmp_path):
    """--m 10,1000 (as --paper's 10,100000) over the smoke job's runs: the fault-free runs stay in OUT, each
    intensity's campaign goes to OUT/mM beside links to them, with its own table of the six rows and its figure;
    OUT/table.md holds both tables under their headings; the two campaigns differ only in m. The smoke job's
    common checkpoint, fault-free runs and m = 10 campaign are copied in (the job resumes: only the m = 1000
    campaign runs).
    Catches: a second intensity that reruns (or overwrites) the fault-free runs, a campaign run without its m, a
    table of one intensity missing a row because a fault-free run is not reachable from its directory."""
    src, out = cpu_smoke[0], tmp_path / "cmp"
    out.mkdir()
    for name in ("pre", "clean", "clean_p1", "clean_m1", "clean_prot"):
        shutil.copytree(src / name, out / name)
    (out / "m10").mkdir()
    for name in ("faulty", "protected_paper", "protected_all", "control"):
        shutil.copytree(src / name, out / "m10" / name)
    shutil.copy(src / "control.steps", out / "m10" / "control.steps")
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--m", "10,1000", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "already there" in p.stdout and p.stdout.count("done already") == 8, p.stdout[-3000:]
    for name in ("clean", "clean_p1", "clean_m1", "clean_prot"):
        assert (out / name).is_dir() and not (out / name).is_symlink(), name
    camp = {}
    for m in (10, 1000):
        d = out / f"m{m}"
        for name in ("clean", "clean_p1", "clean_m1", "clean_prot"):
            assert (d / name).is_symlink() and (d / name).resolve() == (out / name).resolve(), (m, name)
        head, rows = table(d)
        assert set(rows) == {"clean", "clean_prot", "faulty", "protected_paper", "protected_all", "control"}, (m, rows)
        assert (d / "loss_deviation.png").is_file()
        for name in ("faulty", "protected_paper", "protected_all"):
            f = [json.loads(l) for l in open(d / name / "faults.jsonl")]
            assert [r["step"] for r in f] == list(range(131, 142)), (m, name, f)
            assert all(r["m"] == min(m, r["numel"]) for r in f) and any(r["m"] == m for r in f), (m, name, f[0])
            assert max(r["step"] for r in records(d / name) if r["type"] == "step") == 142
        camp[m] = [(r["site"], r["pass"], r["layer"]) for r in map(json.loads, open(d / "faulty" / "faults.jsonl"))]
    assert camp[10] == camp[1000], camp     # the same schedule, only the intensity differs
    assert table(out / "m10")[1]["protected_all"] == table(src)[1]["protected_all"]
    text = (out / "table.md").read_text()
    assert text.index("## m = 10 elements") < text.index("## m = 1000 elements"), text[:500]
    assert text.count("| protected_all |") == 2


def test_sdc_compare_paper_setting(tmp_path):
    """--paper --dry-run: the paper's setting in every command line (6 ranks through mpirun, B 1 x T 1024 x 8
    microbatches, lr 5e-5 with warmup 100, the common checkpoint at 1221, the window to 2035 with a fault event on
    every step but the last, m = 10 and 100000 in their own directories, 614,400 held-out positions, llama3.2-1b);
    a later option overrides it (--preset qwen3-0.6b, --ranks 1 --accum 48: one GPU); --paper with --smoke is an
    error. Nothing is built or written. Catches: a setting that drops one of the paper's parameters, a campaign
    directory shared by the two intensities, a dry run that starts a trainer."""
    out = tmp_path / "paper"
    p = subprocess.run(["bash", SCRIPT, "--paper", "--trainer", "gpu", "--dry-run", "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    runs = [l for l in p.stdout.splitlines() if l.startswith("run ")]
    names = [l.split(":")[0][4:] for l in runs]
    assert names == ["pre", "pre", "clean", "clean_p1", "clean_m1", "clean_prot"] + \
        ["faulty", "protected_all", "protected_paper", "control"] * 2, names
    for l in runs:
        for flag in ("mpirun -np 6 ", "/bin/train_sdc_cu ", "-preset llama3.2-1b ", "-B 1 ", "-accum 8 ", "-seq 1024 ",
                     "-steps 2035 ", "-lr 5e-5 ", "-warmup 100 ", "-eval_tokens 614400 ", "-precision bf16 "):
            assert flag in l, (flag, l)
    assert "-stop_at 1121" in runs[0] and "-stop_at 1221 " in runs[1] and "-rgg_calibrate" in runs[1]
    for l in runs[6:10]:
        assert f"{out}/m10/" in l, l
    for l in runs[10:]:
        assert f"{out}/m100000/" in l, l
    for l in runs[6:9] + runs[10:13]:
        assert "-fault_start 1222 -fault_end 2034" in l and "-resume " + str(out / "pre" / "step_001221.ckpt") in l, l
    assert all("-fault_m 10 " in l for l in runs[6:9]) and all("-fault_m 100000 " in l for l in runs[10:13])
    assert not out.exists()
    p = subprocess.run(["bash", SCRIPT, "--paper", "--preset", "qwen3-0.6b", "--ranks", "1", "--accum", "48", "--dry-run",
                        "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    runs = [l for l in p.stdout.splitlines() if l.startswith("run ")]
    assert all("mpirun" not in l and "-preset qwen3-0.6b " in l and "-accum 48 " in l for l in runs), runs[0]
    p = subprocess.run(["bash", SCRIPT, "--paper", "--smoke", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "--smoke and --paper exclude each other" in p.stderr, p.stderr
    p = subprocess.run(["bash", SCRIPT, "--m", "10,x", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "--m must be a positive integer (got 'x')" in p.stderr, p.stderr
