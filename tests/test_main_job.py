"""The README's first command, scripts/sdc_compare.sh, at smoke scale: it finishes, prints the table of
the four runs, and its protected run caught at least one forward event with no false alarm."""
import os
import subprocess

from test_trainer import ROOT


def test_sdc_compare_smoke(tmp_path):
    out = tmp_path / "cmp"
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "sdc_compare.sh"), "--smoke", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
            for l in (out / "table.md").read_text().splitlines() if l.startswith("| ") and not l.startswith("| run")}
    assert set(rows) == {"clean", "clean_prot", "faulty", "protected"}, rows
    faults, detected, replayed, false = (int(x) for x in rows["protected"][6:10])
    assert faults == 12 and detected >= 1 and replayed == detected and false == 0, rows["protected"]
    assert rows["clean_prot"][9] == "0"   # no false alarm on the fault-free protected run
