"""The GPU trainer (train_sdc.cu) run on the CUDA emulation (./train_sdc_emu, dev/cuda_emu; `make emu`),
as a user runs it: its losses against the CPU trainer's emulation of the same AMP (./train_sdc -precision
bf16) from the reference checkpoints, checkpoints that resume across the two trainers, 2 and 4 emulated ranks
(NCCL over MPI, the bucketed all-reduce) against 1 rank x 2 / 4 microbatches, and the protection tests of scripts/gpu_check.sh's
protect phase (Q/K-path faults caught with the replayed run bit-identical to the clean emulated run;
calibrated clean steps without an alarm).

Tolerance for GPU vs CPU bf16 losses: relative 2e-3 per step (test_sdc.cu's loss bound for the
reference states). The two trainers round the same tensors to bf16 but sum in different orders (cuBLASLt
blocks vs the CPU's serial k loop, warp trees vs serial sums) and the GPU rounds a few GEMM inputs the
CPU keeps in fp32 (attention probs and dlogits, docs/cuda_kernels.md), so they agree to bf16 noise, not
bitwise; measured 2026-12 on 5 steps: at most 2.3e-4. A real bug gives errors near 1e-1 or more.

TSDC_EMU_FULL=1 (make test-emu-full) runs the longer variants: all three presets in the Q/K-fault test,
and 200 calibrated clean steps (make test: tiny-llama, 40 steps). Data: the byte-level tinyshakespeare
shards of tests/test_trainer.py."""
import json
import os
import re

import pytest

from test_trainer import BIN, MPIRUN, MPI_SKIP, ROOT, data, run, steps  # noqa: F401

EMU_BIN = os.path.join(ROOT, "train_sdc_emu")
FULL = os.environ.get("TSDC_EMU_FULL", "0") not in ("", "0")
LOSS_RTOL = 2e-3

pytestmark = pytest.mark.skipif(not os.path.exists(EMU_BIN), reason="train_sdc_emu not built (make emu)")


def run_bin(binary, args, mpi=0, check=True, timeout=1800, threads=1, env_extra=None):
    return run(args, check=check, env={"OMP_NUM_THREADS": str(threads), **(env_extra or {})}, mpi=mpi, timeout=timeout, binary=binary)


def emu(args, **kw):
    return run_bin(EMU_BIN, args, **kw)


def cpu(args, **kw):
    return run_bin([BIN, "-precision", "bf16"], args, **kw)


def small(data, out, **kw):
    """the settings of tests/test_protect.py (vocab 256, T 32, B 2) and of test_sdc.cu's reference states"""
    a = {"-vocab": 256, "-seq": 32, "-B": 2, "-train": data / "train.bin", "-lr": 1e-3, "-warmup": 2,
         "-eval_every": 0, "-out": out}
    a.update(kw)
    args = []
    for k, v in a.items():
        args += [k] if v is None else [k, v]   # None: a flag without a value (-stats)
    return args + ["-quiet"]


def ref_ckpt(preset):
    ck = os.path.join(ROOT, "build", "ref", f"{preset}.ckpt")
    if not os.path.exists(ck):
        pytest.skip("build/ref not built (make refckpts)")
    return ck


def rel_diffs(a, b, which):
    return {s: abs(a[s]["loss"] - b[s]["loss"]) / abs(b[s]["loss"]) for s in which}


def ckpt(out, step):
    return open(os.path.join(out, f"step_{step:06d}.ckpt"), "rb").read()


# ------------------------------------------------------------------------ GPU trainer vs CPU bf16
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-nanochat"])
def test_losses_match_cpu_bf16(data, tmp_path, preset):
    """the emulated GPU trainer's first 5 losses from the reference checkpoint against the CPU trainer's bf16 mode
    (relative LOSS_RTOL). Catches: a kernel of the forward or backward, the optimizer or the data path that differs
    from the CPU's math (a wrong stride, head mapping, RoPE table, missing bias correction)."""
    kw = {"-preset": preset, "-init": ref_ckpt(preset), "-steps": 5}
    emu(small(data, tmp_path / "gpu", **kw))
    cpu(small(data, tmp_path / "cpu", **kw))
    g, c = steps(tmp_path / "gpu"), steps(tmp_path / "cpu")
    assert sorted(g) == sorted(c) == [1, 2, 3, 4, 5]
    d = rel_diffs(g, c, g)
    print(preset, "GPU (emulated):", [round(g[s]["loss"], 6) for s in sorted(g)])
    print(preset, "CPU bf16:      ", [round(c[s]["loss"], 6) for s in sorted(c)], f"largest rel diff {max(d.values()):.2e}")
    assert max(d.values()) <= LOSS_RTOL, d


# ------------------------------------------------------------------ checkpoints across the trainers
@pytest.mark.parametrize("writer", ["gpu", "cpu"])
def test_checkpoint_resumes_in_the_other_trainer(data, tmp_path, writer):
    """one trainer writes step 3 of 5, the other resumes it; steps 4-5 match the writer's uninterrupted run. Catches: a
    checkpoint layout or optimizer state that one trainer writes and the other reads differently, a data position or
    schedule step not restored."""
    first, second = (emu, cpu) if writer == "gpu" else (cpu, emu)
    kw = {"-preset": "tiny-qwen3", "-init": ref_ckpt("tiny-qwen3"), "-steps": 5}
    first(small(data, tmp_path / "full", **kw))
    first(small(data, tmp_path / "part", **kw, **{"-stop_at": 3, "-ckpt_every": 3}))
    p = second(small(data, tmp_path / "part", **{k: v for k, v in kw.items() if k != "-init"},
                     **{"-resume": tmp_path / "part" / "step_000003.ckpt"}))
    assert "resumed from" in p.stdout, p.stdout[-1000:]
    a, b = steps(tmp_path / "part"), steps(tmp_path / "full")
    assert {4, 5} <= set(a), sorted(a)
    d = rel_diffs(a, b, [4, 5])
    print(f"written by {writer}, resumed by the other: rel loss diff at steps 4, 5: {d[4]:.2e} {d[5]:.2e}")
    assert max(d.values()) <= LOSS_RTOL, d


# ---------------------------------------------------------------------- data parallelism (NCCL)
def bucket_banner(stdout):
    """the trainer's line on its gradient buckets: their number and sizes (in floats), in the backward's order"""
    import re
    line = [l for l in stdout.splitlines() if l.startswith("gradient all-reduce:")]
    assert len(line) == 1, stdout[-2000:]
    n = int(re.search(r"(\d+) buckets", line[0]).group(1))
    sizes = []
    for count, size in re.findall(r"(?:(\d+) \w+s x |(?:tail|head|layer) )(\d+)", line[0]):
        sizes += [int(size)] * (int(count) if count else 1)
    return n, sizes


@pytest.mark.skipif(MPIRUN is None, reason=str(MPI_SKIP))
@pytest.mark.parametrize("ranks", [2, 4])
def test_emulated_ranks_equal_one_rank_accumulating(data, tmp_path, ranks):
    """mpirun -np R (2, 4): the gradients summed over the ranks by the bucketed ncclAllReduce overlapped with the
    backward (the emulation's NCCL over MPI, one all-reduce a bucket) against one rank accumulating the same R
    microbatches. Same bf16 math, the fp32 gradient sums in another order: losses and grad_norm within relative 1e-4
    per step (measured: loss 0 and grad_norm below 1e-8 at R 2, below 1e-6 at R 4), and every tensor's weights after
    4 steps within 1e-3 of its update's largest element (measured: below 1e-4). The banner's buckets: one a layer plus
    the tail (final norm) and the head (the tied embedding), their sizes summing to the parameter count. Catches: a
    gradient all-reduce that averages instead of sums (or misses the 1/(world x accum) scale), ranks reading the same
    data, an all-reduce over the wrong buffer, a bucket left out (the ranks' weights part: the run fails its
    cross-rank check, and the weights differ) or reduced twice (its gradients R x: grad_norm)."""
    import numpy as np
    import tsdc_io
    kw = {"-preset": "tiny-llama", "-init": ref_ckpt("tiny-llama"), "-steps": 4, "-ckpt_every": 4}
    p = emu(small(data, tmp_path / "rR", **kw, **{"-accum": 1}), mpi=ranks)
    assert f"{ranks} ranks" in p.stdout and "identical on all ranks" in p.stdout, p.stdout[-1000:]
    emu(small(data, tmp_path / "r1", **kw, **{"-accum": ranks}))
    a, b = steps(tmp_path / "rR"), steps(tmp_path / "r1")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    d = rel_diffs(a, b, a)
    gn = {s: abs(a[s]["grad_norm"] - b[s]["grad_norm"]) / abs(b[s]["grad_norm"]) for s in a}
    # the buckets: tiny-llama has 4 layers, a weighted final norm (the tail) and a tied embedding (the head)
    n, sizes = bucket_banner(p.stdout)
    P = int(re.search(r"\| (\d+) parameters \|", p.stdout).group(1))
    assert n == 4 + 2 and len(sizes) == n and sum(sizes) == P, (n, sizes, P)
    wR = tsdc_io.read_checkpoint(tmp_path / "rR" / "step_000004.ckpt")[3]
    w1 = tsdc_io.read_checkpoint(tmp_path / "r1" / "step_000004.ckpt")[3]
    w0 = tsdc_io.read_checkpoint(ref_ckpt("tiny-llama"))[3]
    worst = max(float(np.max(np.abs(wR[k] - w1[k])) / np.max(np.abs(w1[k] - w0[k]))) for k in w1)
    print(f"{ranks} ranks x 1 vs 1 rank x {ranks} microbatches: largest rel loss diff {max(d.values()):.2e}, grad_norm "
          f"{max(gn.values()):.2e}, weights (vs the update) {worst:.2e}; buckets {sizes}")
    assert max(d.values()) <= 1e-4, d
    assert max(gn.values()) <= 1e-4, gn   # the pre-clip norm: a 2x gradient scale error shows here, not in the losses
    assert worst <= 1e-3, worst


# ------------------------------------------------------------------------------------ protection
QK_PRESETS = ["tiny-llama", "tiny-qwen3", "tiny-nanochat"] if FULL else ["tiny-llama"]


@pytest.mark.parametrize("preset", QK_PRESETS)
def test_qk_faults_caught_and_replay_is_exact(data, tmp_path, preset):
    """gpu_check.sh's protect phase: forward Q/K-path faults (m = 1, 10, 1000 elements) in every step are
    caught by the Q/K recomputation, the step is replayed, and the final weights are the clean run's bytes. Catches: a fingerprint comparison that
    misses small faults (m = 1), a replay with injection still on, state left dirty by the faulty pass."""
    base = {"-preset": preset, "-steps": 6, "-accum": 2, "-warmup": 5}
    emu(small(data, tmp_path / "clean", **base))
    for m in (1, 10, 1000):
        out = tmp_path / f"m{m}"
        emu(small(data, out, **base, **{"-protect": "qk", "-fault_mode": "campaign", "-fault_sites": "qk", "-fault_pass": "fwd",
                                        "-fault_m": m, "-fault_seed": 11 + m, "-fault_mb": -1}))
        st = steps(out)
        assert sorted(st) == [1, 2, 3, 4, 5, 6]
        for s, r in st.items():
            assert r["injections"] == 1, (m, s, r)
            assert r["replayed"] == 1 and r["alarm"].startswith("qk"), (m, s, r)
        assert ckpt(out, 6) == ckpt(tmp_path / "clean", 6), f"m {m}: final checkpoint differs from the clean emulated run"


def fault_events(out):
    """(step, microbatch, layer, site, pass) of every injected event of a run"""
    return [(r["step"], r["microbatch"], r["layer"], r["site"], r["pass"]) for r in map(json.loads, open(os.path.join(out, "faults.jsonl")))]


def caught_by(out):
    """per step: replayed and the kinds that alarmed"""
    return {s: (r["replayed"], r["by"]) for s, r in steps(out).items()}


# the three attention paths of the GPU backward that -protect qk_bwd recomputes: the fused (flash) backward rerun,
# the materialised one rerun (-protect att selects it), the split one from the stored dlogits (att_bwd selects it)
QKB_PATHS = {"flash": "qk_bwd", "materialised": "qk_bwd,att", "split": "qk_bwd,att_bwd"}
QKB_CASES = [(p, path) for p in (QK_PRESETS if FULL else ["tiny-llama"]) for path in QKB_PATHS] if FULL else \
    [("tiny-llama", "flash"), ("tiny-llama", "split"), ("tiny-qwen3", "flash"), ("tiny-nanochat", "materialised")]


@pytest.mark.parametrize("preset,path", QKB_CASES)
def test_qk_bwd_catches_mantissa_faults_on_the_backward_qk_path(data, tmp_path, preset, path):
    """-protect qk_bwd on the GPU trainer: one mantissa-only flip of one element of a backward Q/K-path gradient a
    step (q_proj, k_proj, q_rope, k_rope, and q_norm, k_norm where the preset has them; microbatch drawn) is caught
    at every step, the step replayed, and the final weights are the bytes of the clean run under the same protection
    (the same attention path); the CPU trainer (-precision bf16) on the same plan injects the same events and
    catches the same steps by the same kinds. Catches: a recomputation that reads the stored (faulty) gradient instead
    of recomputing it (misses everything), one that is not bitwise (the clean run's replays differ), a site on the path
    outside the comparison, a fingerprint of the wrong length (the last rows unseen)."""
    prot = QKB_PATHS[path]
    base = {"-preset": preset, "-steps": 4, "-accum": 2, "-warmup": 2, "-protect": prot}
    fault = {"-fault_mode": "campaign", "-fault_sites": "qk", "-fault_pass": "bwd", "-fault_field": "mantissa",
             "-fault_m": 1, "-fault_seed": 5, "-fault_mb": -1}
    emu(small(data, tmp_path / "clean", **base))
    assert not any(r["alarms"] for r in steps(tmp_path / "clean").values())
    emu(small(data, tmp_path / "g", **base, **fault))
    st = steps(tmp_path / "g")
    assert sorted(st) == [1, 2, 3, 4]
    assert all(r["injections"] == 1 and r["replayed"] == 1 and "qk_bwd" in r["by"].split(",") for r in st.values()), st
    assert ckpt(tmp_path / "g", 4) == ckpt(tmp_path / "clean", 4), "final checkpoint differs from the clean emulated run"
    cpu(small(data, tmp_path / "c", **base, **fault))
    assert fault_events(tmp_path / "g") == fault_events(tmp_path / "c")
    assert caught_by(tmp_path / "g") == caught_by(tmp_path / "c"), (caught_by(tmp_path / "g"), caught_by(tmp_path / "c"))


def test_att_bwd_catches_faults_in_dprobs_dlogits_and_dv(data, tmp_path):
    """-protect att_bwd on the GPU trainer (the materialised attention with the split backward at every layer):
    exponent flips in 1000 elements of the gradient of the probabilities, the logits or V, and mantissa-only flips in
    the gradient of the probabilities (which leave dlogits' rows summing to zero: only the dprobs checksum sees them),
    one event a step, are caught at every step and replayed to the clean run's final weights; the CPU trainer on the
    same plans catches the same steps by the same kinds. Catches: a check that is never called, one placed before
    its injection point (the dprobs checksum: the mantissa plan passes), the dV check before the v_proj injection."""
    base = {"-preset": "tiny-llama", "-steps": 4, "-accum": 2, "-warmup": 2, "-protect": "att_bwd"}
    emu(small(data, tmp_path / "clean", **base))
    plans = {"exp": {"-fault_sites": "att_probs,att_logits,v_proj", "-fault_field": "exponent", "-fault_m": 1000},
             "man": {"-fault_sites": "att_probs", "-fault_field": "mantissa", "-fault_m": 1000}}
    for name, plan in plans.items():
        fault = {"-fault_mode": "campaign", "-fault_pass": "bwd", "-fault_seed": 3, "-fault_mb": -1, **plan}
        emu(small(data, tmp_path / name, **base, **fault))
        st = steps(tmp_path / name)
        assert sorted(st) == [1, 2, 3, 4]
        assert all(r["injections"] == 1 and r["replayed"] == 1 and r["by"] == "att_bwd" for r in st.values()), (name, st)
        assert ckpt(tmp_path / name, 4) == ckpt(tmp_path / "clean", 4), name
        cpu(small(data, tmp_path / f"{name}_cpu", **base, **fault))
        assert fault_events(tmp_path / name) == fault_events(tmp_path / f"{name}_cpu"), name
        assert caught_by(tmp_path / name) == caught_by(tmp_path / f"{name}_cpu"), name
    assert {e[3] for e in fault_events(tmp_path / "exp")} >= {"att_probs", "v_proj"}


def test_backward_check_statistics_match_the_cpu_trainer(data, tmp_path):
    """The statistics the backward checks read on the device, dumped by both trainers (TSDC_CHECK_DUMP, test-only:
    llmc/sdc/checks.h) for the same backward, layer and microbatch of the same plan (3 steps from the reference
    checkpoint, exponent flips in 3 elements of a dprobs or dV a step): the failed heads per check equal the CPU
    trainer's; the sums of the three checks' bounds (the prefix sums and maxima of |v|, |dout|, the dV bounds) within
    5e-3 relative of the CPU's (the two trainers' tensors differ by bf16 rounding, and their weights by that after
    an update: measured at most 1.5e-3 at step 3, 4e-4 at step 1); the qk_bwd flags equal; the stored dq/dk fingerprints as the device reduced them equal the
    CPU's qk_fingerprint of the downloaded tensors. Catches: a scan whose prefix is off by one (a bound sum moves
    by about 1/T = 3%), a check that skips a row the fault hit, a fingerprint reduction that drops blocks."""
    base = {"-preset": "tiny-llama", "-init": ref_ckpt("tiny-llama"), "-steps": 3, "-accum": 2, "-protect": "qk_bwd,att_bwd",
            "-fault_mode": "campaign", "-fault_sites": "att_probs,v_proj", "-fault_pass": "bwd", "-fault_field": "exponent",
            "-fault_m": 3, "-fault_seed": 7, "-fault_mb": -1}
    dumps = {}
    for name, fn in (("gpu", emu), ("cpu", cpu)):
        dump = tmp_path / f"{name}.jsonl"
        fn(small(data, tmp_path / name, **base), env_extra={"TSDC_CHECK_DUMP": str(dump)})
        dumps[name] = {(r["kind"], r["bwd"], r["layer"]): r for r in map(json.loads, open(dump))}
    g, c = dumps["gpu"], dumps["cpu"]
    assert sorted(g) == sorted(c) and len(g) > 0, (sorted(g)[:8], sorted(c)[:8])
    assert fault_events(tmp_path / "gpu") == fault_events(tmp_path / "cpu")
    # the backward calls in order: each step's microbatches, again when it was replayed; below a fault's layer in the
    # call it hit, the two trainers' gradients carry the same flip of values that differ by bf16 rounding (a flipped
    # exponent can differ by 2x): their bounds are compared above it only
    below, call = {}, 0
    events = {(e[0], e[1]): e[2] for e in fault_events(tmp_path / "gpu")}
    for s_, r in sorted(steps(tmp_path / "gpu").items()):
        if (s_, 0) in events or (s_, 1) in events:
            for mb in range(2):
                if (s_, mb) in events:
                    below[call + 1 + mb] = events[(s_, mb)]
        call += 2 * (1 + r["replayed"])
    assert call == max(k[1] for k in g), (call, max(k[1] for k in g))
    worst = 0.0
    for key, rg in g.items():
        rc = c[key]
        if key[0] == "att":
            assert rg["att"] == rc["att"], (key, rg, rc)
            if key[2] < below.get(key[1], -1):
                continue
            for a, b in zip(rg["tol"], rc["tol"]):
                worst = max(worst, abs(a - b) / abs(b))
        else:
            assert rg["qkb"] == rc["qkb"] == 0, (key, rg, rc)
            assert rg["fp_dev"] == rg["fp_host"], (key, rg)
    print(f"bound sums: worst relative difference GPU vs CPU {worst:.2e}")
    assert worst < 5e-3, worst
    assert any(sum(r["att"]) for k, r in g.items() if k[0] == "att"), "no layer with a failed head: the plan injected nothing"


def test_backward_checks_clean_runs_are_quiet(data, tmp_path):
    """50 clean bf16 steps under -protect qk_bwd,att_bwd (the split backward, its three attention checks at their
    bounds, the Q/K recomputation from the stored dlogits) and 50 under -protect qk_bwd (the fused backward rerun):
    no alarm. Catches: a bound tighter than the GPU's bf16 rounding, a recomputation that is not bitwise."""
    for prot in ("qk_bwd,att_bwd", "qk_bwd"):
        out = tmp_path / prot.replace(",", "_")
        emu(small(data, out, **{"-preset": "tiny-llama", "-steps": 50, "-warmup": 5, "-protect": prot, "-save": "none"}))
        st = steps(out)
        assert len(st) == 50 and sum(r["alarms"] for r in st.values()) == 0, [(s, r["alarm"]) for s, r in st.items() if r["alarms"]]


def test_cpu_only_checks_are_refused_not_silently_dropped(data, tmp_path):
    """the element-wise recomputation is the CPU trainer's for now (README): asked for by name, the GPU trainer
    stops with one error line naming the flag; under -protect all it says that it is left out. The backward's Q/K
    recomputation and attention checks run on the GPU trainer: accepted by name and in all. Catches: a GPU run that
    claims a protection it does not run."""
    for tok in ("ew", "qk_bwd,ew"):
        p = emu(small(data, tmp_path / "r", **{"-steps": 1, "-protect": tok}), check=False)
        err = [l for l in p.stderr.splitlines() if l.startswith("error:")]
        assert p.returncode == 1 and len(err) == 1 and "-protect" in err[0] and "CPU trainer" in err[0], (tok, p.stderr[-500:])
    for tok in ("qk_bwd", "att_bwd", "qk,att_bwd"):
        emu(small(data, tmp_path / tok.replace(",", "_"), **{"-steps": 1, "-protect": tok}))
    p = emu(small(data, tmp_path / "a", **{"-steps": 1, "-accum": 3, "-protect": "all"}))
    assert "qk,rgg,att,qk_bwd,att_bwd,bwd,exp" in p.stdout and "ew are the CPU" in p.stdout, p.stdout[-1000:]


def test_calibrated_clean_steps_raise_no_alarm(data, tmp_path):
    """100 clean calibration steps (-rgg_calibrate; 3 microbatches a step, the peers of the Residual Gain Guard on one
    process, as tests/test_protect.py), then protected clean steps (-protect all) without an alarm:
    200 with TSDC_EMU_FULL=1 (as gpu_check.sh), 40 in make test. Catches: a
    GPU check whose clean rounding trips it (Q/K recomputation that is not bitwise, an RGG or backward-guard statistic
    computed differently from the calibration)."""
    n = 200 if FULL else 40
    cal = tmp_path / "rgg.cal"
    kw = {"-preset": "tiny-llama", "-steps": 100 + n, "-warmup": 5, "-accum": 3}
    emu(small(data, tmp_path / "cal", **kw, **{"-stop_at": 100, "-rgg_calibrate": cal}))
    emu(small(data, tmp_path / "cal", **kw, **{"-resume": tmp_path / "cal" / "step_000100.ckpt", "-protect": "all",
                                              "-rgg_calibration": cal}))
    st = steps(tmp_path / "cal")
    protected = [st[s] for s in range(101, 101 + n)]
    assert len(protected) == n
    assert sum(r["alarms"] for r in protected) == 0, [(r["step"], r["alarm"]) for r in protected if r["alarms"]]


# ------------------------------------------------------------------------------ predictions (argmax)
def test_pred_out_matches_cpu_bf16(data, tmp_path):
    """-pred_out through the GPU trainer's own launch (model_argmax): catches a launch the GPU would refuse
    (planted: argmax_kernel with 2048 threads a block, which test_sdc.cu's argmax test does not go through)
    and a wrong row stride; the two trainers differ only by bf16 near-ties (measured 2026-12: 1 of 256). Catches: an
    argmax launch the GPU refuses, a wrong row stride or column range."""
    import numpy as np
    import tsdc_io
    kw = {"-preset": "tiny-llama", "-init": ref_ckpt("tiny-llama"), "-steps": 1, "-val": data / "val.bin",
          "-eval_tokens": 256}
    emu(small(data, tmp_path / "gpu", **kw, **{"-pred_out": tmp_path / "gpu.pred"}))
    cpu(small(data, tmp_path / "cpu", **kw, **{"-pred_out": tmp_path / "cpu.pred"}))
    pg, vg = tsdc_io.read_shard(tmp_path / "gpu.pred")
    pc, vc = tsdc_io.read_shard(tmp_path / "cpu.pred")
    assert vg == vc == 256 and len(pg) == len(pc) == 256
    agree = float(np.mean(np.asarray(pg) == np.asarray(pc)))
    print(f"predictions: {agree:.4f} of 256 positions agree")
    assert agree >= 0.98, agree


# ------------------------------------------------------------------------ device work
def stats_of(data, out, **kw):
    """the per-step device counts (-stats, llmc/host/stats.h) of a 2-step emulated run: step 2's (step 1 holds the
    one-off allocations)"""
    emu(small(data, out, **{"-steps": 2, "-warmup": 1, "-save": "none", "-stats": None, **kw}))
    return steps(out)[2]["stats"]


def test_no_host_sync_inside_the_layer_loops(data, tmp_path):
    """Protection without host round-trips, counted by the emulation (-stats): a protected step
    (-protect all: Q/K recomputation, Residual Gain Guard, attention checks, backward guard, exponent scaling;
    4 microbatches, so the RGG has its peers) synchronises the host nowhere inside the forward's and backward's
    layer loops; its synchronisations per step are those of the unprotected step plus the backward's report, one a
    microbatch (the Q/K fingerprints of both passes are compared on the device, the RGG sums reduced there, the
    attention checks counted there; the forward's come back with the losses in its one copy, the backward's in one
    copy after its layer loop); and they do not grow with the layers (2 vs 4). A host round-trip planted in the layer loop (a
    stream synchronisation, a pageable copy) fails all three."""
    geo = {"-preset": "tiny-llama", "-accum": 4}
    prot2 = stats_of(data, tmp_path / "p2", **geo, **{"-n_layer": 2, "-protect": "all"})
    prot4 = stats_of(data, tmp_path / "p4", **geo, **{"-n_layer": 4, "-protect": "all"})
    none2 = stats_of(data, tmp_path / "n2", **geo, **{"-n_layer": 2, "-protect": "none"})
    none4 = stats_of(data, tmp_path / "n4", **geo, **{"-n_layer": 4, "-protect": "none"})
    print("stats per step: protect all L2", prot2, "L4", prot4, "| none L2", none2, "L4", none4)
    for name, st in (("all L2", prot2), ("all L4", prot4), ("none L2", none2), ("none L4", none4)):
        assert st["loop_syncs"] == 0, f"{name}: {st['loop_syncs']} host synchronisations inside the layer loops"
    # the backward's checks (qk_bwd, att_bwd, in all) add one report copy and synchronisation per microbatch, after
    # the backward's layer loop (the next token upload or the step's norms wait for the backward anyway)
    bwd = 4
    assert prot2["syncs"] == none2["syncs"] + bwd and prot4["syncs"] == none4["syncs"] + bwd, \
        f"protection adds host synchronisations: {prot2['syncs']} vs {none2['syncs']} (L2), {prot4['syncs']} vs {none4['syncs']} (L4)"
    assert prot2["syncs"] == prot4["syncs"], f"host synchronisations grow with the layers: {prot2['syncs']} (L2) vs {prot4['syncs']} (L4)"
    # a small constant: per microbatch the token upload, the forward's report and the backward's, plus the step's norms
    assert prot2["syncs"] <= 3 * 4 + 2, prot2
    # one device-to-host copy per microbatch for the forward's report (and one for the backward's), one for the norms
    assert prot2["d2h"] == none2["d2h"] + bwd == prot4["d2h"], (prot2, none2, prot4)
    # the launches do grow with the layers (the counters count)
    assert prot4["launches"] > prot2["launches"] > none2["launches"] > 0
