"""Tests of scripts/sdc_compare_plot.py (the main job's figure) on hand-made run directories: the deviation series
D(t) = L_run(t) - L_clean(t) over the window, the symmetric clean envelope E(t), a step missing from one run (a
gap), a non-finite loss in the faulty run (a gap and a top-edge marker, never a crash), the lost-update marks, the
y-scale choice, and that a valid PNG is written. No trainer needed. Run: python3 -m pytest -q tests/test_plot.py
"""
import contextlib
import io
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import sdc_compare_plot as sp  # noqa: E402
from test_metrics import write_steps  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from a PNG's signature and IHDR chunk; AssertionError if it is not a PNG"""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path}: not a PNG (signature {head[:8]!r})"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])


def run(tmp, name, losses, first=1, missing=(), lost=(), faults=()):
    """a run dir: step records first.. with these losses (a step in missing not logged; a step in lost skipped,
    found_inf with a NaN grad norm), faults.jsonl with an event at each step of faults"""
    recs = [{"step": s, "loss": x, "grad_norm": math.nan if s in lost else 1.0, "found_inf": int(s in lost)}
            for s, x in enumerate(losses, first) if s not in missing]
    d = write_steps(tmp / name, recs)
    if faults:
        (d / "faults.jsonl").write_text("".join(json.dumps({"type": "fault", "step": s, "site": "q_rope",
                                                            "pass": "fwd", "m": 10, "live": 1}) + "\n" for s in faults))
    return d


@pytest.fixture
def runs(tmp_path):
    """steps 1..5, faults in 2..4 (so the window is 2..5); by hand, over steps 2, 3, 4, 5:
      E(t) = max - min of clean, clean_p1, clean_m1  = 0.02, 0.03, 0.04, 0.01
      faulty: D = 0.5, inf (NaN loss, a lost update), 0.4, 0.2
      protected_paper: step 4 not logged; protected_all: 0, 1e-4, 0, 0; control: 0, 0.1, 0.1, 0.05"""
    return {
        "clean": run(tmp_path, "clean", [3.0, 2.0, 1.5, 1.0, 0.8]),
        "clean_p1": run(tmp_path, "clean_p1", [3.0, 2.01, 1.52, 0.99, 0.81]),
        "clean_m1": run(tmp_path, "clean_m1", [3.0, 1.99, 1.49, 1.03, 0.80]),
        "faulty": run(tmp_path, "faulty", [3.0, 2.5, math.nan, 1.4, 1.0], lost=(3,), faults=(2, 3, 4)),
        "protected_paper": run(tmp_path, "protected_paper", [3.0, 2.0, 1.5, 1.0, 0.81], missing=(4,), faults=(2, 3, 4)),
        "protected_all": run(tmp_path, "protected_all", [3.0, 2.0, 1.5001, 1.0, 0.8], faults=(2, 3, 4)),
        "control": run(tmp_path, "control", [3.0, 2.0, 1.6, 1.1, 0.85], lost=(3,)),
    }


def test_deviation_and_envelope_by_hand(runs):
    """Catches: a deviation from the wrong run (clean_p1, or clean - run), the window not starting at the first
    fault event, a missing step shifting the series (alignment by position) instead of leaving a gap, a NaN loss
    drawn as a number or crashing, E(t) from one pair only or as a standard deviation, lost updates not marked."""
    d = sp.deviation_data(runs)
    assert d["steps"].tolist() == [2, 3, 4, 5] and (d["window_start"], d["last"]) == (2, 5)
    np.testing.assert_allclose(d["env"], [0.02, 0.03, 0.04, 0.01], atol=1e-12)
    assert d["E_max"] == pytest.approx(0.04) and d["n_clean"] == 3
    f = d["dev"]["faulty"]
    assert f[1] == math.inf and d["nonfinite"]["faulty"] == [3]
    np.testing.assert_allclose(f[[0, 2, 3]], [0.5, 0.4, 0.2], atol=1e-12)
    pp = d["dev"]["protected_paper"]
    assert math.isnan(pp[2]) and d["nonfinite"]["protected_paper"] == []     # step 4 missing: a gap
    np.testing.assert_allclose(pp[[0, 1, 3]], [0.0, 0.0, 0.01], atol=1e-12)
    np.testing.assert_allclose(d["dev"]["protected_all"], [0.0, 1e-4, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(d["dev"]["control"], [0.0, 0.1, 0.1, 0.05], atol=1e-12)
    assert d["lost"] == [3] and d["m"] == 10
    assert d["yscale"] == ("linear", None)          # 0.5 is 12.5 E_max: not many orders
    # an explicit window start, and the window runs to the clean log's last step
    assert sp.deviation_data(runs, window_start=4)["steps"].tolist() == [4, 5]


def test_yscale_symlog_when_deviations_span_orders(runs, tmp_path):
    """a faulty run off by 2 nats against E_max 0.04: symmetric-log with linthresh E_max; without any envelope
    the smallest nonzero |D| sets the scale. Catches: a linear axis that flattens the protected runs into the zero
    line, a log axis that drops the sign, a linthresh unrelated to the envelope."""
    runs["faulty"] = run(tmp_path, "faulty2", [3.0, 4.0, 1.5, 1.0, 0.8], faults=(2,))
    d = sp.deviation_data(runs)
    assert d["yscale"][0] == "symlog" and d["yscale"][1] == pytest.approx(0.04)
    d = sp.deviation_data({k: runs[k] for k in ("clean", "faulty", "protected_all")})
    assert d["env"] is None and d["E_max"] is None
    assert d["yscale"][0] == "symlog" and d["yscale"][1] == pytest.approx(1e-4)
    assert "envelope" not in sp.caption(d) and "E_max" not in sp.caption(d)


def test_png_is_written(runs, tmp_path):
    """the command line writes OUT/loss_deviation.png, a valid PNG of a sensible size with the runs' colours in it,
    even with the faulty run's NaN loss; no clean run is a one-line error. Catches: a plot that crashes on a
    non-finite loss, an empty or truncated file, a blank figure."""
    out = tmp_path                       # the fixture's run dirs are under tmp_path, as sdc_compare.sh's under OUT
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert sp.main(["--out", str(out), "--dpi", "60"]) == 0
    png = out / sp.PNG
    assert buf.getvalue().splitlines()[0] == str(png) and "clean envelope" in buf.getvalue()
    w, h = png_size(png)
    assert (w, h) == (round(sp.FIGSIZE[0] * 60), round(sp.FIGSIZE[1] * 60)) and w >= 400 and h >= 300
    import matplotlib.image
    img = matplotlib.image.imread(str(png))[..., :3]
    colours = {tuple(c) for c in (np.round(img.reshape(-1, 3) * 255).astype(int) // 16).tolist()}
    assert len(colours) > 20                               # not blank
    for hexc in ("#d62728", "#1f77b4"):                    # faulty and protected_all are drawn
        rgb = tuple(int(hexc[i:i + 2], 16) // 16 for i in (1, 3, 5))
        assert rgb in colours, hexc
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert sp.main(["--out", str(tmp_path / "nothing")]) == 1
    assert err.getvalue().startswith("error: ") and len(err.getvalue().strip().splitlines()) == 1
