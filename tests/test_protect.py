"""TrainSDC protection in the CPU trainer (docs/design.md, the method): Q/K path recomputation detects every
forward Q/K-path fault and the replayed run ends bit-identical to the fault-free run; calibrated clean
runs (one process, and 3 MPI ranks) raise no alarm over 200 steps; large exponent faults at residual-
reaching sites are caught by the Residual Gain Guard and replayed; exponent scaling is bit-exact in fp32,
within rounding in bf16, and skips non-finite updates; the calibration file is validated; and the
k-selection tool reproduces hand-computed R_amp and k*."""
import json
import os
import re
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_trainer import BIN, MPIRUN, MPI_SKIP, ROOT, run, steps, loss_bits, data, expect_error, corrupt  # noqa: F401,E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import expscale_select  # noqa: E402


def small(data, out, **kw):
    a = ["-vocab", 256, "-seq", 32, "-B", 2, "-train", data / "train.bin", "-lr", 1e-3, "-warmup", 5,
         "-eval_every", 0, "-out", out, "-quiet"]
    for k, v in kw.items():
        a += [k, v]
    return a


def ckpt(out, step):
    return open(os.path.join(out, f"step_{step:06d}.ckpt"), "rb").read()


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-nanochat"])
def test_qk_recomputation_detects_every_qk_fault_and_replay_is_exact(data, tmp_path, preset):
    """one forward Q/K-path fault a step (1, 10, 1000 elements, every microbatch): each step alarms "qk" and
    replays, the run ends bit-identical to the fault-free one. Catches: a fault that escapes the fingerprint
    comparison, a replay that reuses faulty state, the faulty attempt's loss logged."""
    base = {"-preset": preset, "-steps": 6, "-accum": 2}
    run(small(data, tmp_path / "clean", **base))
    for m in (1, 10, 1000):
        out = tmp_path / f"m{m}"
        run(small(data, out, **base, **{"-protect": "qk", "-fault_mode": "campaign", "-fault_sites": "qk",
                                       "-fault_pass": "fwd", "-fault_m": m, "-fault_seed": 11 + m, "-fault_mb": -1}))
        st = steps(out)
        assert sorted(st) == list(range(1, 7)), sorted(st)
        for s, r in st.items():
            assert r["injections"] == 1, (s, r)
            assert r["replayed"] == 1 and r["alarm"].startswith("qk"), (m, s, r)
        # every fault caught and replayed clean: the weights are those of the fault-free run, bit for bit
        assert ckpt(out, 6) == ckpt(tmp_path / "clean", 6), m
        # the logged loss is the replayed attempt's: the fault-free run's, bit for bit
        assert loss_bits(out) == loss_bits(tmp_path / "clean"), m


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-nanochat"])
def test_backward_qk_recomputation_catches_every_backward_qk_fault(data, tmp_path, preset):
    """one backward Q/K-path fault a step flipping mantissa bits of a single gradient element (a change no norm
    can see): -protect qk_bwd catches every one, replays, and the run ends bit-identical to the fault-free one;
    -protect qk (the paper's forward recomputation) catches none of them; -protect all includes qk_bwd.
    Catches: a backward recomputation that is not bitwise (false alarms end the run differently), one that
    fingerprints the recomputation's own tensors twice (misses everything), a fault site on the Q/K backward
    path left outside the fingerprinted tensors (q_norm/k_norm of qwen3 and nanochat included), qk_bwd dropped
    from -protect all."""
    base = {"-preset": preset, "-steps": 6, "-accum": 2}
    fault = {"-fault_mode": "campaign", "-fault_sites": "qk", "-fault_pass": "bwd", "-fault_field": "mantissa",
             "-fault_m": 1, "-fault_seed": 5, "-fault_mb": -1}
    run(small(data, tmp_path / "clean", **base))
    run(small(data, tmp_path / "b", **base, **fault, **{"-protect": "qk_bwd"}))
    st = steps(tmp_path / "b")
    assert sorted(st) == list(range(1, 7)), sorted(st)
    assert all(r["injections"] == 1 and r["replayed"] == 1 and r["by"] == "qk_bwd" and r["alarm"].startswith("qk_bwd: ")
               for r in st.values()), st
    sites = {json.loads(l)["site"] for l in open(tmp_path / "b" / "faults.jsonl")}
    assert len(sites) >= 3, sites
    assert ckpt(tmp_path / "b", 6) == ckpt(tmp_path / "clean", 6)
    assert loss_bits(tmp_path / "b") == loss_bits(tmp_path / "clean")
    run(small(data, tmp_path / "f", **base, **fault, **{"-protect": "qk"}))
    assert not any(r["replayed"] for r in steps(tmp_path / "f").values())
    run(small(data, tmp_path / "a", **{**base, "-accum": 3}, **fault, **{"-protect": "all"}))   # the RGG needs 3 peers
    assert all("qk_bwd" in r["by"].split(",") for r in steps(tmp_path / "a").values())


def test_backward_attention_checks_catch_dprobs_dlogits_and_dv_faults(data, tmp_path):
    """exponent flips in 1000 elements of the gradient of the attention probabilities, logits or V, one event a step:
    -protect att_bwd (the dprobs row checksum, the dlogits zero row sums, the dV column sums) catches every one, replays, and the run
    ends bit-identical to the fault-free one; the forward attention checks (-protect att) catch none; mantissa
    flips in dprobs alone (invisible to dlogits' zero row sums) are caught too. A clean run with att_bwd raises no
    alarm (bf16, 20 steps). Catches: a backward attention check that is never called, the dprobs check placed
    before the injection point (planted: the mantissa part fails), a check whose clean rounding trips it."""
    base = {"-preset": "tiny-llama", "-steps": 8, "-accum": 2, "-precision": "bf16"}
    fault = {"-fault_mode": "campaign", "-fault_sites": "att_probs,att_logits,v_proj", "-fault_pass": "bwd",
             "-fault_field": "exponent", "-fault_m": 1000, "-fault_seed": 3, "-fault_mb": -1}
    run(small(data, tmp_path / "clean", **base))
    run(small(data, tmp_path / "b", **base, **fault, **{"-protect": "att_bwd"}))
    st = steps(tmp_path / "b")
    sites = {json.loads(l)["site"] for l in open(tmp_path / "b" / "faults.jsonl")}
    assert sites == {"att_probs", "att_logits", "v_proj"}, sites
    assert all(r["injections"] == 1 and r["replayed"] == 1 and r["by"] == "att_bwd" for r in st.values()), st
    assert ckpt(tmp_path / "b", 8) == ckpt(tmp_path / "clean", 8)
    run(small(data, tmp_path / "f", **base, **fault, **{"-protect": "att"}))
    assert not any(r["replayed"] for r in steps(tmp_path / "f").values())
    # mantissa flips in dprobs (each entry moves by under 2x): dlogits' rows still sum to zero, so only the
    # dprobs checksum, placed after the injection point, sees them
    run(small(data, tmp_path / "m", **base, **{**fault, "-fault_sites": "att_probs", "-fault_field": "mantissa"},
              **{"-protect": "att_bwd"}))
    assert all(r["replayed"] == 1 for r in steps(tmp_path / "m").values()), steps(tmp_path / "m")
    assert ckpt(tmp_path / "m", 8) == ckpt(tmp_path / "clean", 8)
    run(small(data, tmp_path / "q", **{**base, "-steps": 20}, **{"-protect": "att_bwd"}))
    assert sum(r["alarms"] for r in steps(tmp_path / "q").values()) == 0


EW_FWD = "attn_norm,mlp_norm,attn_residual,block_out,act,mlp_product"
EW_BWD = "act,up_proj,gate_proj,attn_residual,block_out"


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-nanochat"])
def test_elementwise_recomputation_catches_every_fault_at_its_sites(data, tmp_path, preset):
    """one fault a step flipping mantissa bits of a single element, at the outputs of the element-wise kernels
    (forward: the RMSNorms, the residual writebacks, the activation, the gated product; backward: the gradients
    of act, up_proj and gate_proj): -protect ew catches every one, replays, and the run ends bit-identical to the
    fault-free one; without it none is caught (a change that small moves no norm); a clean bf16 run raises no
    alarm; -protect all includes ew. tiny-llama has SwiGLU, tiny-nanochat ReLU^2 (no up_proj or product, and its act
    gradient comes from a matrix product).
    Catches: a recomputation that is not bitwise (false alarms end the run differently), one that compares the
    stored tensor with itself or runs before the injection point (misses everything), a site left out."""
    base = {"-preset": preset, "-steps": 8, "-accum": 3, "-precision": "bf16"}
    run(small(data, tmp_path / "clean", **base))
    relu2 = preset == "tiny-nanochat"
    for pas, sites in (("fwd", EW_FWD.replace(",mlp_product", "") if relu2 else EW_FWD),
                       ("bwd", "gate_proj,attn_residual,block_out" if relu2 else EW_BWD)):   # ReLU^2: act's gradient is down_proj's dx (a product)
        fault = {"-fault_mode": "campaign", "-fault_sites": sites, "-fault_pass": pas, "-fault_field": "mantissa",
                 "-fault_m": 1, "-fault_seed": 9, "-fault_mb": -1}
        out = tmp_path / f"ew_{pas}"
        run(small(data, out, **base, **fault, **{"-protect": "ew"}))
        st = steps(out)
        assert sorted(st) == list(range(1, 9)), sorted(st)
        assert all(r["injections"] == 1 and r["replayed"] == 1 and r["by"] == "ew" and r["alarm"].startswith("ew: ")
                   for r in st.values()), (pas, st)
        hit = {json.loads(l)["site"] for l in open(out / "faults.jsonl")}
        assert len(hit) >= (4 if pas == "fwd" else 3), hit
        assert ckpt(out, 8) == ckpt(tmp_path / "clean", 8), pas
        run(small(data, tmp_path / f"none_{pas}", **base, **fault))
        assert not any(r["replayed"] for r in steps(tmp_path / f"none_{pas}").values())
        run(small(data, tmp_path / f"all_{pas}", **base, **fault, **{"-protect": "all"}))
        assert all("ew" in r["by"].split(",") for r in steps(tmp_path / f"all_{pas}").values()), pas
    run(small(data, tmp_path / "quiet", **{**base, "-steps": 20}, **{"-protect": "ew"}))
    assert sum(r["alarms"] for r in steps(tmp_path / "quiet").values()) == 0


MMB_SITES = "v_proj,o_proj,gate_proj,up_proj,down_proj"


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-nanochat"])
def test_bound_catches_exponent_faults_in_the_products_outputs(data, tmp_path, preset):
    """one fault a step, 10 elements x 4 exponent bits, at the outputs of the forward's v, o, gate, up and down
    projections (llmc/sdc/bound.h): -protect bound catches every one (a top-exponent-bit flip lifts a value past
    |x_i| |w_j|), names the products that failed, replays, and the run ends bit-identical to the fault-free one;
    without it the same plan is caught nowhere; mantissa flips (a value changed by under 2x, far below its bound)
    are not caught, as the header says; -protect all includes bound; 20 clean bf16 steps raise no alarm, as the
    invariant promises (there is no threshold to calibrate). tiny-nanochat has ReLU^2 (the fc output is gate_proj's
    site, no up_proj). Catches: a check placed before the injection point or on another tensor (misses), a bound
    without the rounding slack (false alarms in the clean run), a product left out (a site never caught)."""
    base = {"-preset": preset, "-steps": 16, "-accum": 3, "-precision": "bf16"}
    run(small(data, tmp_path / "clean", **base))
    sites = MMB_SITES.replace(",up_proj", "") if preset == "tiny-nanochat" else MMB_SITES
    fault = {"-fault_mode": "campaign", "-fault_sites": sites, "-fault_pass": "fwd", "-fault_field": "exponent",
             "-fault_m": 10, "-fault_seed": 1, "-fault_mb": -1}   # a seed whose 16 draws hit every site
    out = tmp_path / "bound"
    run(small(data, out, **base, **fault, **{"-protect": "bound"}))
    st = steps(out)
    assert sorted(st) == list(range(1, 17)), sorted(st)
    assert all(r["injections"] == 1 and r["replayed"] == 1 and r["by"] == "bound" and
               re.match(r"bound: \d+ products? over (its|their) bound", r["alarm"]) for r in st.values()), st
    hit = {json.loads(l)["site"] for l in open(out / "faults.jsonl")}
    assert hit == set(sites.split(",")), hit
    assert ckpt(out, 16) == ckpt(tmp_path / "clean", 16)
    run(small(data, tmp_path / "none", **base, **fault))
    assert not any(r["replayed"] for r in steps(tmp_path / "none").values())
    run(small(data, tmp_path / "mant", **base, **{**fault, "-fault_field": "mantissa"}, **{"-protect": "bound"}))
    assert not any(r["replayed"] for r in steps(tmp_path / "mant").values())
    run(small(data, tmp_path / "all", **base, **fault, **{"-protect": "all"}))
    assert all("bound" in r["by"].split(",") for r in steps(tmp_path / "all").values())
    run(small(data, tmp_path / "quiet", **{**base, "-steps": 20}, **{"-protect": "bound"}))
    assert sum(r["alarms"] for r in steps(tmp_path / "quiet").values()) == 0


def calibrate_then_run(data, tmp_path, mpi, **kw):
    cal = tmp_path / "rgg.cal"
    run(small(data, tmp_path / "cal", **kw, **{"-steps": 300, "-stop_at": 100, "-rgg_calibrate": cal}), mpi=mpi)
    run(small(data, tmp_path / "cal", **kw, **{"-steps": 300, "-resume": tmp_path / "cal" / "step_000100.ckpt",
                                               "-protect": "all", "-rgg_calibration": cal}), mpi=mpi)
    return steps(tmp_path / "cal")


def test_clean_single_process_run_raises_no_alarm(data, tmp_path):
    """calibrated on clean steps, 200 more clean steps under -protect all on one process (3 microbatches as peers):
    no alarm. Catches: false alarms (thresholds under clean variation, a calibration not applied)."""
    st = calibrate_then_run(data, tmp_path, 0, **{"-preset": "tiny-llama", "-accum": 3})
    protected = [st[s] for s in range(101, 301)]
    assert len(protected) == 200
    assert sum(r["alarms"] for r in protected) == 0, [r["alarm"] for r in protected if r["alarms"]]


@pytest.mark.skipif(MPIRUN is None, reason=str(MPI_SKIP))
def test_clean_three_rank_run_raises_no_alarm(data, tmp_path):
    """as above on 3 MPI ranks, one microbatch each (the other ranks as peers). Catches: false alarms when the peers
    are other ranks (gains gathered from the wrong rank or step)."""
    st = calibrate_then_run(data, tmp_path, 3, **{"-preset": "tiny-llama", "-accum": 1, "-threads": 1})
    protected = [st[s] for s in range(101, 301)]
    assert len(protected) == 200
    assert sum(r["alarms"] for r in protected) == 0, [r["alarm"] for r in protected if r["alarms"]]


@pytest.mark.parametrize("site", ["o_proj", "down_proj", "v_proj"])
def test_large_residual_faults_are_detected_and_replayed(data, tmp_path, site):
    """exponent flips of 100 elements of o_proj, down_proj or v_proj at layer 2, steps 101-120: every event alarmed
    by the Residual Gain Guard and replayed. Catches: a residual-reaching site the guard does not watch, an alarm
    without a replay."""
    cal = tmp_path / "rgg.cal"
    kw = {"-preset": "tiny-llama", "-accum": 3, "-steps": 120}
    run(small(data, tmp_path / "cal", **kw, **{"-stop_at": 100, "-rgg_calibrate": cal}))
    out = tmp_path / "f"
    run(small(data, out, **kw, **{"-resume": tmp_path / "cal" / "step_000100.ckpt", "-protect": "rgg",
                                  "-rgg_calibration": cal, "-fault_mode": "campaign", "-fault_sites": site,
                                  "-fault_field": "exponent", "-fault_m": 100, "-fault_layer": 2, "-fault_start": 101}))
    st = steps(out)
    injected = [s for s in range(101, 121) if st[s]["injections"]]
    assert len(injected) == 20
    missed = [s for s in injected if not st[s]["replayed"]]
    assert not missed, [(s, st[s]) for s in missed]
    assert all(st[s]["alarm"].startswith("rgg") for s in injected)


def test_finite_residual_faults_raise_z_or_rel_alarms(data, tmp_path):
    """The Residual Gain Guard's thresholds fire on finite faults (the exponent faults above alarm as
    "nonfinite" and would pass with alpha = 1e9): in bf16, mantissa flips of every element of block_out
    and sign flips of every element of down_proj at layer 2 each raise a "z" or "rel" alarm (at layer 2 or
    the layer above, which the changed residual reaches) in every faulty step (measured: z 40-49 against thresholds near 23, rel 0.13-0.16 against 0.07), and
    a single mantissa flip of one down_proj element (a change far under the thresholds) raises none.
    Catches thresholds that cannot fire (alpha or floors too large, a z/rel comparison never reached)."""
    cal = tmp_path / "rgg.cal"
    kw = {"-preset": "tiny-llama", "-accum": 3, "-steps": 105, "-precision": "bf16"}
    run(small(data, tmp_path / "cal", **kw, **{"-stop_at": 100, "-rgg_calibrate": cal}))
    for site, field, m, want in (("block_out", "mantissa", 8192, True), ("down_proj", "sign", 8192, True),
                                 ("down_proj", "mantissa", 1, False)):
        out = tmp_path / f"{site}_{field}_{m}"
        run(small(data, out, **kw, **{"-resume": tmp_path / "cal" / "step_000100.ckpt", "-protect": "rgg",
                                      "-rgg_calibration": cal, "-fault_mode": "campaign", "-fault_sites": site,
                                      "-fault_field": field, "-fault_m": m, "-fault_layer": 2, "-fault_start": 101}))
        st = steps(out)
        assert sorted(st) == list(range(101, 106))
        for s, r in st.items():
            assert r["injections"] == 1, (site, field, m, s, r)
            if want:
                why = r["alarm"].split()[1] if r["alarm"].startswith("rgg: ") else r["alarm"]
                assert r["replayed"] == 1 and why in ("z", "rel"), (site, field, m, s, r["alarm"])
            else:
                assert r["alarms"] == 0 and r["replayed"] == 0, (site, field, m, s, r["alarm"])


def test_exponent_scaling_is_bit_identical(data, tmp_path):
    """-expscale_k 15 against k = 0 on 6 steps, fp32 and bf16. Catches: an unscale by another power, an unscale
    after clipping, a rounding between scale and unscale (see below), k not logged."""
    for prec in ("fp32", "bf16"):
        run(small(data, tmp_path / f"k0{prec}", **{"-preset": "tiny-qwen3", "-steps": 6, "-precision": prec}))
        run(small(data, tmp_path / f"k15{prec}", **{"-preset": "tiny-qwen3", "-steps": 6, "-precision": prec, "-expscale_k": 15}))
    # scaling by 2^15 and back is exact while nothing overflows or underflows, in fp32 and in bf16 (its
    # exponent range is fp32's): both runs are bit-identical. Catches an unscale by another power, an
    # unscale after clipping, a rounding step between scale and unscale
    for prec in ("fp32", "bf16"):
        assert loss_bits(tmp_path / f"k0{prec}") == loss_bits(tmp_path / f"k15{prec}"), prec
        assert ckpt(tmp_path / f"k0{prec}", 6) == ckpt(tmp_path / f"k15{prec}", 6), prec
    assert all(r["k"] == 15 for r in steps(tmp_path / "k15bf16").values())


def test_found_inf_skips_the_update(data, tmp_path):
    """+inf activations (every exact zero of relu(x)^2 with all exponent bits flipped) make every step's gradient
    non-finite: found_inf on each of the 3 steps and the weights are still the initial ones. Catches: a non-finite
    gradient applied (NaN weights), found_inf never set."""
    # all 8 exponent bits of the exact zeros of relu(x)^2 flipped: +inf activations, NaN loss and
    # gradients; after unscaling the step finds them and skips the update, as AMP does
    kw = {"-preset": "tiny-nanochat", "-steps": 3}
    run(small(data, tmp_path / "o", **kw, **{"-fault_mode": "campaign", "-fault_sites": "act", "-fault_field": "exponent",
                                            "-fault_bits": 8, "-fault_m": 1000, "-fault_layer": 1, "-expscale_k": 15}))
    st = steps(tmp_path / "o")
    assert sorted(st) == [1, 2, 3], st
    assert all(r["found_inf"] == 1 for r in st.values()), st
    # no update was made: the weights are still the initial ones
    run(small(data, tmp_path / "init", **{**kw, "-steps": 0}))
    w = lambda d: [json.loads(l) for l in open(d / "log.jsonl") if '"end"' in l][0]["weights"]  # noqa: E731
    assert w(tmp_path / "o") == w(tmp_path / "init")


def test_calibration_file_is_validated(data, tmp_path):
    """a damaged calibration file (magic, truncated, checksum), one of another accum or monitored layers, fewer than
    3 observations or 64 calibration steps: one-line errors. Catches: thresholds from a damaged or mismatched
    calibration accepted, a calibration from too little data."""
    cal = tmp_path / "rgg.cal"
    run(small(data, tmp_path / "cal", **{"-preset": "tiny-llama", "-accum": 3, "-steps": 70, "-rgg_calibrate": cal}))
    kw = {"-preset": "tiny-llama", "-accum": 3, "-steps": 2, "-protect": "rgg"}
    bad = corrupt(cal, tmp_path / "bad1.cal", lambda b: b"XXXXXXXX" + b[8:])
    expect_error(run(small(data, tmp_path / "o", **kw, **{"-rgg_calibration": bad}), check=False), bad, "magic")
    bad = corrupt(cal, tmp_path / "bad2.cal", lambda b: b[:-40])
    expect_error(run(small(data, tmp_path / "o", **kw, **{"-rgg_calibration": bad}), check=False), bad, "truncated")
    def flip(b):
        b[200] ^= 1
        return b
    bad = corrupt(cal, tmp_path / "bad3.cal", flip)
    expect_error(run(small(data, tmp_path / "o", **kw, **{"-rgg_calibration": bad}), check=False), bad, "checksum")
    expect_error(run(small(data, tmp_path / "o", **{**kw, "-accum": 4}, **{"-rgg_calibration": cal}), check=False),
                 cal, "observations")
    expect_error(run(small(data, tmp_path / "o", **kw, **{"-rgg_calibration": cal, "-rgg_layers": "0,1"}), check=False),
                 cal, "monitored")
    p = run(small(data, tmp_path / "o", **{**kw, "-accum": 2}), check=False)
    assert p.returncode == 1 and "at least 3 observations" in p.stderr
    p = run(small(data, tmp_path / "o2", **{"-preset": "tiny-llama", "-accum": 3, "-steps": 10, "-rgg_calibrate": tmp_path / "x.cal"}), check=False)
    assert p.returncode == 1 and "at least 64 clean steps" in p.stderr


# ----------------------------------------------------------------------------- R_amp and k*
def test_r_amp_hand_computed():
    """R_amp and k* of expscale_select.py against hand sums of the zero-bit weights (2^(2^j) - 1)^2. Catches: a
    wrong bit weight, R_amp summed over set instead of zero bits, K_safe not ending where the largest code reaches
    254."""
    h = {100: 1}                                       # one code, 0b01100100
    w = lambda j: (2 ** (2 ** j) - 1) ** 2             # noqa: E731
    assert expscale_select.r_amp_exact(h, 0) == w(0) + w(1) + w(3) + w(4) + w(7)
    # 100 + 154 = 254 = 0b11111110: only bit 0 is zero, the least risk any finite code can have
    assert expscale_select.r_amp_exact(h, 154) == 1
    res = expscale_select.select(h, 0, 200)
    assert res["k_star"] == 154 and res["k_safe"] == [0, 154]
    # two codes with weights 3:1; at k = 28, codes 128 (0b10000000) and 228 (0b11100100)
    h2 = {100: 3, 200: 1}
    expect = Fraction(3 * sum(w(j) for j in range(7)) + (w(0) + w(1) + w(3) + w(4)), 4)
    assert expscale_select.r_amp_exact(h2, 28) == expect
    assert expscale_select.select(h2, 0, 100)["k_safe"] == [0, 54]


def test_hold_rule():
    """The hold rule's factor on both sides: a held k whose R_amp is 1.2 x the minimum is held, one at 1.3 x
    re-profiles (a factor of 1e30, or 1, fails one side). R_amp is dominated by bit 7's weight, so it is the
    share of codes below 128 after the shift: codes {1: 10, 100: 2, 110: 1, 200: 1}, k <= 54 safe; at
    k >= 28 only code 1 is below 128 (10 of 14: the minimum), at 18 <= k < 28 code 100 too (12: 1.2 x), at
    k < 18 code 110 too (13: 1.3 x). Catches: a hold rule that never re-profiles
    or always does, a k* that is not the safe minimiser of R_amp."""
    h = {1: 10, 100: 2, 110: 1, 200: 1}
    for held, want_ratio, want_hold in ((20, 1.2, True), (10, 1.3, False)):
        r = expscale_select.select(h, 0, 54, held=held)
        ratio = r["r_held"] / r["r_min"]
        assert abs(ratio - want_ratio) < 1e-9, (held, ratio)
        assert r["hold"] is want_hold, (held, ratio, r["decision"])
        assert r["decision"] == (f"hold k={held}" if want_hold else f"re-profile: R_amp({held}) > 1.25 x min (k*={r['k_star']})")
    assert expscale_select.select(h, 0, 54)["k_star"] >= 28
    far = expscale_select.select(h, 0, 54, held=60)     # 200 + 60 > 254: not safe
    assert not far["hold"] and far["decision"].startswith("k=60 is not safe")


def test_profile_and_select_end_to_end(data, tmp_path):
    """-exp_profile writes every projection's exponent histogram (3 steps x 512 samples, less exact zeros); the
    tool's answer is the selection over the pooled histogram. Catches: a tool that drops the profile's shift or a
    projection (see below), a profile of the wrong size."""
    prof = tmp_path / "prof.json"
    run(small(data, tmp_path / "o", **{"-preset": "tiny-llama", "-steps": 3, "-exp_profile": prof, "-exp_samples": 512,
                                       "-expscale_k": 4}))
    d = json.load(open(prof))
    assert d["k"] == 4 and "layers.0.wq" in d["projections"] and "wte" in d["projections"]
    # 3 steps x 512 samples, less the exact zeros (code 0 is not counted: scaling cannot move it)
    assert 0.8 * 3 * 512 < sum(d["projections"]["layers.0.wq"]) <= 3 * 512
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "expscale_select.py"), str(prof), "--held", "15",
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    # the tool's answer is the selection over the pooled histogram of the file (codes unshifted by the
    # profile's k = 4): K_safe ends where the largest code reaches 254, k* is R_amp's argmin, the held
    # k = 15 decided by the hold rule. Catches a tool that drops the profile's shift or a projection
    _, hists = expscale_select.load_profile(str(prof))
    pooled = expscale_select.pooled(hists)
    want = expscale_select.select(pooled, 0, 64, held=15)
    assert r["k_safe"] == [0, min(64, 254 - max(pooled))] == want["k_safe"]
    assert r["k_star"] == want["k_star"] and r["r_min"] == want["r_min"] == min(want["r_amp"].values())
    assert r["decision"] == want["decision"] and r["samples"] == sum(pooled.values())


# ----------------------------------------------------------------------------- backward guard
def calibrate_bwd(data, tmp_path, kw):
    """40 clean steps to a checkpoint; steps 21..40 calibrate the backward guard"""
    bcal = tmp_path / "bwd.cal"
    run(small(data, tmp_path / "cal", **kw, **{"-stop_at": 20}))
    run(small(data, tmp_path / "cal", **kw, **{"-stop_at": 40, "-resume": tmp_path / "cal" / "step_000020.ckpt",
                                               "-bwd_calibrate": bcal}))
    return tmp_path / "cal" / "step_000040.ckpt", bcal


BWD_KW = {"-preset": "tiny-llama", "-accum": 3, "-steps": 52, "-precision": "bf16", "-threads": 1}
BWD_FAULT = {"-fault_mode": "campaign", "-fault_pass": "bwd", "-fault_field": "exponent", "-fault_bits": 8, "-fault_m": 10,
             "-fault_rank": -1, "-fault_start": 41}


def test_backward_faults_are_caught_and_replayed_exactly(data, tmp_path):
    """every backward event that flips all 8 exponent bits of 10 gradient elements (a small gradient becomes
    2^30+ times larger) is caught by the backward guard alone and replayed: no update is lost and the run
    ends bit-identical to the fault-free run. Fails when the guard's threshold is far too high (-bwd_alpha
    1e6: planted here, updates are lost) or when an alarm does not replay. Catches: a backward guard
    blind to gradient blow-ups, a replay that is not exact, the per-matrix groups dropped (alarms name only layers)."""
    ck, bcal = calibrate_bwd(data, tmp_path, BWD_KW)
    common = {"-resume": ck, "-bwd_calibration": bcal, "-protect": "bwd"}
    run(small(data, tmp_path / "clean", **BWD_KW, **common))
    out = tmp_path / "f"
    run(small(data, out, **BWD_KW, **common, **BWD_FAULT))
    st = steps(out)
    injected = [s for s in range(41, 53) if st[s]["injections"]]
    assert len(injected) == 12
    assert all(st[s]["replayed"] == 1 and st[s]["by"] == "bwd" for s in injected), \
        [(s, st[s]["alarm"], st[s]["bwd_r"]) for s in injected if not st[s]["replayed"]]
    assert all(st[s]["bwd_r"] >= 1 for s in injected)          # a norm blow-up past the threshold, logged
    # the largest blow-up is a weight matrix's own group (per-matrix groups: without them it would be a layer's)
    assert any(re.search(r"bwd: (L\d+\.w\w+|wte|lm_head) gradient norm", st[s]["alarm"]) for s in injected), \
        [st[s]["alarm"] for s in injected]
    assert all(st[s]["found_inf"] == 0 and st[s]["overflow"] == 0 for s in st)
    assert ckpt(out, 52) == ckpt(tmp_path / "clean", 52)
    # the threshold out of reach: only a non-finite gradient would still be caught; updates are lost
    run(small(data, tmp_path / "loose", **BWD_KW, **common, **BWD_FAULT, **{"-bwd_alpha": 1e6}))
    assert sum(r["replayed"] for r in steps(tmp_path / "loose").values()) < len(injected)
    assert ckpt(tmp_path / "loose", 52) != ckpt(tmp_path / "clean", 52)


def test_backward_guard_quiet_on_clean_steps_and_thresholds_written(data, tmp_path):
    """calibrated, the guard raises no alarm on 40 clean steps (bf16, every group: each weight matrix, each layer,
    the rest, global); the calibration prints its thresholds; a corrupted calibration file fails with one line.
    Catches: guard thresholds under clean variation (false alarms), a damaged calibration accepted, -bwd_calibration
    without -protect bwd accepted."""
    # B 4 x T 64: the guard's per-matrix groups need a batch whose clean gradient norms are not bursty (at B 2 x T 32
    # an L1.wq gradient norm reached 323x its median on a clean step, over a calibrated 229x; here the largest
    # clean blow-up is 0.26 of its threshold, measured 2026-12-01)
    kw = {**BWD_KW, "-steps": 80, "-B": 4, "-seq": 64}
    ck, bcal = calibrate_bwd(data, tmp_path, kw)
    p = run(small(data, tmp_path / "c", **kw, **{"-resume": ck, "-protect": "bwd", "-bwd_calibration": bcal}))
    st = steps(tmp_path / "c")
    assert len(st) == 40 and sum(r["alarms"] for r in st.values()) == 0, [r["alarm"] for r in st.values() if r["alarms"]]
    assert all(r["bwd_r"] < 1 for r in st.values())
    assert p.returncode == 0
    bad = corrupt(bcal, tmp_path / "bad.cal", lambda b: b[:-8] + bytes(8))
    expect_error(run(small(data, tmp_path / "o", **kw, **{"-resume": ck, "-protect": "bwd", "-bwd_calibration": bad}), check=False),
                 bad, "checksum")
    expect_error(run(small(data, tmp_path / "o", **kw, **{"-resume": ck, "-bwd_calibration": bcal}), check=False), "-protect bwd")
    p = run(small(data, tmp_path / "cal2", **{**kw, "-steps": 12}, **{"-bwd_calibrate": tmp_path / "x.cal"}))
    assert "backward-guard calibration" in p.stdout and "global" in p.stdout


def test_real_overflow_is_skipped_and_lowers_k(data, tmp_path):
    """a gradient that is non-finite again on the clean replay is a real overflow (here: a NaN weight, so
    every attempt is NaN): the update is skipped as AMP does and k goes down by one a step.
    Catches: an endless replay of a real overflow, an update from a NaN gradient, k never lowered."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    sys.path.insert(0, os.path.join(ROOT, "dev"))
    import sdc_metrics as sm
    import tsdc_io
    kw = {"-preset": "tiny-llama", "-accum": 3, "-steps": 3, "-precision": "bf16", "-threads": 1}
    run(small(data, tmp_path / "w", **{**kw, "-steps": 1}))
    c = sm.Checkpoint(str(tmp_path / "w" / "step_000001.ckpt"))
    params = {n: np.array(c.params[o:o + int(np.prod(sh))]).reshape(sh) for n, o, sh in c.tensors()}
    norm = next(n for n in params if "norm" in n)
    params[norm][...] = np.nan
    tsdc_io.write_checkpoint(tmp_path / "nan.ckpt", c.preset, c.cfg, params)
    run(small(data, tmp_path / "o", **kw, **{"-init": tmp_path / "nan.ckpt", "-protect": "bwd,exp", "-expscale_k": 15}))
    st = steps(tmp_path / "o")
    assert [st[s]["k"] for s in (1, 2, 3)] == [15, 14, 13]
    assert all(r["replayed"] == 1 and r["found_inf"] == 1 and r["overflow"] == 1 for r in st.values()), st


def test_skip_steps_skips_exactly_the_listed_updates(data, tmp_path):
    """-skip_steps: the listed steps make no update (weights after step 3 = after step 2, step 4 updates
    again), the log says skip and a NaN grad norm; the schedule and data order are unchanged.
    Catches: -skip_steps skipping other steps or still updating, or shifting the data order or lr schedule."""
    (tmp_path / "skip.txt").write_text("# lost updates\n3, 5\n")
    kw = {"-preset": "tiny-llama", "-steps": 6, "-ckpt_every": 1, "-threads": 1}
    run(small(data, tmp_path / "s", **kw, **{"-skip_steps": tmp_path / "skip.txt"}))
    run(small(data, tmp_path / "c", **kw))
    st, cl = steps(tmp_path / "s"), steps(tmp_path / "c")
    assert [s for s in st if st[s]["skip"]] == [3, 5]
    assert all(st[s]["grad_norm"] != st[s]["grad_norm"] for s in (3, 5)) and not any(r["found_inf"] for r in st.values())
    assert [st[s]["lr"] for s in st] == [cl[s]["lr"] for s in cl]
    assert st[3]["loss"] == cl[3]["loss"]     # step 3's batch is the same, computed on the same weights
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import sdc_metrics as sm
    P = lambda d, s: np.asarray(sm.Checkpoint(str(d / f"step_{s:06d}.ckpt")).params)  # noqa: E731
    assert np.array_equal(P(tmp_path / "s", 2), P(tmp_path / "s", 3))
    assert not np.array_equal(P(tmp_path / "s", 3), P(tmp_path / "s", 4))
    assert np.array_equal(P(tmp_path / "s", 2), P(tmp_path / "c", 2)) and not np.array_equal(P(tmp_path / "s", 6), P(tmp_path / "c", 6))
    (tmp_path / "bad.txt").write_text("3 x\n")
    expect_error(run(small(data, tmp_path / "b", **kw, **{"-skip_steps": tmp_path / "bad.txt"}), check=False), "bad.txt:1", "'x'")


def test_protect_levels_paper_and_all(data, tmp_path):
    """-protect paper is the paper's three components with k = 15 (no attention check, no backward guard);
    -protect all adds them and takes k* from its own first step, the k that expscale_select.py picks from
    a -exp_profile of the same step (same samples).
    Catches: paper mode running beyond-paper components, all not taking k* or taking it from another profile."""
    kw = {"-preset": "tiny-llama", "-accum": 3, "-steps": 2, "-precision": "bf16", "-threads": 1}
    prof = tmp_path / "prof.json"
    run(small(data, tmp_path / "prof", **{**kw, "-steps": 1}, **{"-exp_profile": prof}))
    kstar = expscale_select.select(expscale_select.pooled(expscale_select.load_profile(str(prof))[1]))["k_star"]
    p = run(small(data, tmp_path / "all", **kw, **{"-protect": "all"}))
    assert f"k* = {kstar} " in p.stdout, (kstar, p.stdout)
    assert sorted(steps(tmp_path / "all")) == [1, 2]
    assert all(r["k"] == kstar for r in steps(tmp_path / "all").values())
    fault = {"-fault_mode": "campaign", "-fault_sites": "att_logits", "-fault_field": "exponent", "-fault_m": 1000,
             "-fault_layer": 1, "-fault_mb": 0}
    run(small(data, tmp_path / "paper", **kw, **{"-protect": "paper"}, **fault))
    run(small(data, tmp_path / "all2", **kw, **{"-protect": "all"}, **fault))
    sp, sa = steps(tmp_path / "paper"), steps(tmp_path / "all2")
    assert sorted(sp) == sorted(sa) == [1, 2]
    assert all(r["k"] == 15 for r in sp.values())
    assert not any("att" in r["by"] or "bwd" in r["by"] for r in sp.values()), sp
    assert all("att" in r["by"] for r in sa.values()), sa


def test_fault_dtype_autocast_flips_fp32_sites_in_fp32(data, tmp_path):
    """-fault_dtype autocast: the residual stream and norm outputs take fp32 flips, the projections bf16
    ones (the fault log's dtype); fp32: every site; -precision fp32 rejects it.
    Catches: autocast flipping fp32 tensors in bf16 (or the reverse), -fault_dtype ignored."""
    kw = {"-preset": "tiny-llama", "-steps": 2, "-precision": "bf16", "-fault_mode": "campaign", "-fault_m": 10, "-fault_layer": 1,
          "-threads": 1}
    dt = {}
    for site in ("attn_norm", "q_proj", "attn_residual", "down_proj", "att_probs", "act"):
        for mode in ("autocast", "fp32", "storage"):
            out = tmp_path / f"{site}_{mode}"
            run(small(data, out, **kw, **{"-fault_sites": site, "-fault_dtype": mode}))
            dt[site, mode] = {json.loads(l)["dtype"] for l in open(out / "faults.jsonl")}
    assert dt["attn_norm", "autocast"] == {"fp32"} and dt["attn_residual", "autocast"] == {"fp32"}
    assert dt["att_probs", "autocast"] == {"fp32"}
    assert dt["q_proj", "autocast"] == {"bf16"} and dt["down_proj", "autocast"] == {"bf16"}
    assert all(dt[s, "fp32"] == {"fp32"} and dt[s, "storage"] == {"bf16"} for s in ("attn_norm", "q_proj"))
    assert ckpt(tmp_path / "q_proj_fp32", 2) != ckpt(tmp_path / "q_proj_storage", 2)
    # act, an MLP hidden tensor, is stored as bf16 bits in bf16 mode: fp32 flips keep it in a float array instead
    assert dt["act", "autocast"] == {"bf16"} and dt["act", "fp32"] == {"fp32"} and dt["act", "storage"] == {"bf16"}
    assert ckpt(tmp_path / "act_fp32", 2) != ckpt(tmp_path / "act_storage", 2)
    p = run(small(data, tmp_path / "x", **{**kw, "-precision": "fp32"}, **{"-fault_dtype": "autocast"}), check=False)
    expect_error(p, "-fault_dtype", "bf16")


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-nanochat"])
def test_bf16_storage_keeps_the_bits(data, tmp_path, preset):
    """-precision bf16 stores every activation (the norms' outputs, the materialised attention's logits and
    probabilities, the residual stream, the Q/K path, v_proj, att_out, o_proj, the MLP's hidden tensors, down_proj,
    the embedding's output, the final norm's output) and every activation gradient (v's, att_out's, the attention's
    dprobs and dlogits, the MLP's tensors', the residual stream's, the norms' outputs': the attention's and the MLP's
    dx, summed over their products; the Q/K path's dq, dk) as bf16 bits; the float arrays holding the same values
    (TSDC_CPU_STORAGE=fp32) give the same run bit for bit: checkpoint, losses and fault log, under -protect all (the
    materialised attention) with a fault campaign on those sites in both passes (SwiGLU and ReLU^2), and with the
    fused attention (the protection that leaves it on; faults on tensors it reads and writes), and with backward
    faults on the gradients, two sites at a time, on either attention path. Catches: a kernel, check or fault reading
    or writing the bf16 storage differently from the float arrays, a fault flipping other bits of a bf16 tensor."""
    mlp = "gate_proj,act" if preset == "tiny-nanochat" else "gate_proj,up_proj,act,mlp_product"
    kw = {"-preset": preset, "-steps": 6, "-accum": 3, "-precision": "bf16", "-protect": "all", "-fault_mode": "campaign",
          "-fault_pass": "both", "-fault_m": 40, "-threads": 2,
          "-fault_sites": "attn_norm,q_proj,k_proj,q_norm,k_norm,q_rope,k_rope,att_logits,att_probs,v_proj,att_out,o_proj,"
                          "attn_residual,mlp_norm,down_proj,block_out," + mlp}
    fused = {"-protect": "qk,bound,ew,rgg", "-fault_pass": "fwd"}   # forward faults on two sites at a time: each one hit
    pairs = ("q_proj,k_rope", "k_proj,q_rope", "q_norm,k_norm", "v_proj,att_out")
    # and the gradients stored as their tensors (v's, att_out's, the MLP's, the residual stream's, which down_proj's and
    # o_proj's faults flip in a private copy, the norms' outputs', the Q/K path's): backward faults, two sites at a time
    bwd_pairs = ("v_proj,att_out", "gate_proj,act", "attn_residual,block_out", "down_proj,o_proj", "attn_norm,mlp_norm",
                 "q_norm,k_rope", "q_rope,k_proj", "att_logits,att_probs") + \
        (() if preset == "tiny-nanochat" else ("up_proj,mlp_product",))
    for i, (att, over) in enumerate([("materialised", {})] + [("fused", dict(fused, **{"-fault_sites": p})) for p in pairs] +
                                    [("fused", dict(fused, **{"-fault_pass": "bwd", "-fault_sites": p})) for p in ("v_proj,att_out", "q_proj,k_norm")] +
                                    [("materialised", {"-fault_pass": "bwd", "-fault_sites": p}) for p in bwd_pairs]):
        out = {s: tmp_path / f"{i}{s}" for s in ("bf16", "fp32")}
        for storage in ("bf16", "fp32"):
            run(small(data, out[storage], **dict(kw, **over)), env={"TSDC_CPU_STORAGE": storage, "TSDC_CPU_ATTENTION": att})
        assert ckpt(out["bf16"], 6) == ckpt(out["fp32"], 6)
        assert loss_bits(out["bf16"]) == loss_bits(out["fp32"])
        fb, ff = (open(out[s] / "faults.jsonl").read() for s in ("bf16", "fp32"))
        assert fb == ff and fb.count("\n") == 6
        if over:
            assert {json.loads(x)["site"] for x in fb.splitlines()} == set(over["-fault_sites"].split(","))
    p = run(small(data, tmp_path / "x", **kw), check=False, env={"TSDC_CPU_STORAGE": "half"})
    assert p.returncode != 0 and "TSDC_CPU_STORAGE=half" in p.stderr
