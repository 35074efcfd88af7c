"""The README's first command, scripts/sdc_compare.sh, at smoke scale: it finishes with the table of its six
rows and the figure (OUT/loss_deviation.png, a valid PNG); every trainer run reached its last step (its log's
end record there); the campaign is the same in every faulty run and spares the last step (-fault_end);
-protect all loses no update and raises no false alarm; the control skips exactly the faulty run's lost updates.
A trainer run that fails stops the job loudly (exit 1, the run named), never a table with n/a in it."""
import json
import os
import subprocess

from test_plot import png_size
from test_trainer import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "sdc_compare.sh")
RUNS = ("clean", "clean_p1", "clean_m1", "clean_prot", "faulty", "protected_paper", "protected_all", "control")


def records(d):
    return [json.loads(l) for l in open(os.path.join(d, "log.jsonl"))]


def test_sdc_compare_smoke(tmp_path):
    """Catches: a crashed or early-ended run behind a table (no end record at step 142), a job without its figure
    (or a file that is not a PNG), a fault on the last step,
    faulty runs with different campaigns, -protect all losing updates or raising false alarms, a forward Q/K-path
    event missed, a control that skips other steps than the faulty run's lost updates."""
    out = tmp_path / "cmp"
    p = subprocess.run(["bash", SCRIPT, "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=2400,
                       env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = [l for l in (out / "table.md").read_text().splitlines() if l.startswith("| ")]
    head = [c.strip() for c in lines[0].split("|")[1:-1]]
    rows = {c[0]: dict(zip(head, c)) for c in ([x.strip() for x in l.split("|")[1:-1]] for l in lines[1:])}
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
