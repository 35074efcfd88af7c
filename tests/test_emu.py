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

TSDC_EMU_FULL=1 (make test-emu-full) runs the longer variants: all three presets in the Q/K-fault and
backward-path tests, 150 steps and tiny-nanochat in the element-wise clean run (make test: tiny-llama). Data: the
byte-level tinyshakespeare shards of tests/test_trainer.py."""
import json
import os
import re

import pytest

from test_trainer import BIN, MPIRUN, MPI_SKIP, ROOT, data, run, steps  # noqa: F401

EMU_BIN = os.path.join(ROOT, "train_sdc_emu")
FULL = os.environ.get("TSDC_EMU_FULL", "0") not in ("", "0")
LOSS_RTOL = 2e-3

pytestmark = pytest.mark.skipif(not os.path.exists(EMU_BIN), reason="train_sdc_emu not built (make emu)")


def prot_kinds():
    """PROT_KINDS of llmc/sdc/checks.h, the table both trainers' -protect reads: [(name, in paper, in all, on the GPU)]"""
    src = open(os.path.join(ROOT, "llmc", "sdc", "checks.h")).read()
    rows = re.findall(r'\{"(\w+)",\s*(?:CHECK_\w+|-1),\s*[^,]+,\s*[^,]+,\s*(\d),\s*(\d),\s*(\d),\s*"', src)
    assert len(rows) >= 9, rows
    return [(n, int(p), int(a), int(g)) for n, p, a, g in rows]


ALL_KINDS = [n for n, _, a, _ in prot_kinds() if a]
GPU_MISSING = [n for n, _, a, g in prot_kinds() if a and not g]
# every kind the GPU trainer runs: -protect all once it runs them all (before, all is an error naming the others)
GPU_ALL = "all" if not GPU_MISSING else ",".join(n for n in ALL_KINDS if n not in GPU_MISSING)


def run_bin(binary, args, mpi=0, check=True, timeout=1800, threads=1, env_extra=None):
    return run(args, check=check, env={"OMP_NUM_THREADS": str(threads), **(env_extra or {})}, mpi=mpi, timeout=timeout, binary=binary)


def emu(args, **kw):
    return run_bin(EMU_BIN, args, **kw)


def cpu(args, env_extra=None, **kw):
    # the CPU trainer on its fp32 GEMM path (TSDC_CPU_GEMM=fp32: bf16 inputs summed by fp32 FMAs in k order, as the
    # emulated cuBLASLt sums them): the comparisons below hold the two trainers to equal check outcomes, which AMX's
    # other pairing of the products moves at the borderline of a fault's bound (llmc/cpu/gemm.h; the AMX path is
    # held to its own bounds by test_sdc and to PyTorch by the bf16 reference tests)
    return run_bin([BIN, "-precision", "bf16"], args, env_extra={"TSDC_CPU_GEMM": "fp32", **(env_extra or {})}, **kw)


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
    per step (measured: loss 0 and grad_norm below 1e-8 at R 2, below 1e-4 at R 4), and every tensor's gradient of
    step 1 (the AdamW m of the step-1 checkpoint, (1 - beta1) g) within 1e-5 of its largest element (measured: 1.3e-7,
    fp32 rounding). Not the weights after several steps: AdamW normalises each element by its own sqrt(v), so an
    element whose gradient is near zero moves by up to lr either way from a rounding-level difference of its
    gradient, and those differences compound (measured at R 4 after 4 steps: 14% of the update's largest element,
    with losses within 2e-5; at R 2 below 1e-3). The banner's buckets: one a layer plus
    the tail (final norm) and the head (the tied embedding), their sizes summing to the parameter count. Catches: a
    gradient all-reduce that averages instead of sums (or misses the 1/(world x accum) scale), ranks reading the same
    data, an all-reduce over the wrong buffer, a bucket left out (the ranks' weights part: the run fails its
    cross-rank check, and the weights differ) or reduced twice (its gradients R x: grad_norm)."""
    import numpy as np
    import tsdc_io
    kw = {"-preset": "tiny-llama", "-init": ref_ckpt("tiny-llama"), "-steps": 4, "-ckpt_every": 1}
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
    mR = tsdc_io.read_checkpoint(tmp_path / "rR" / "step_000001.ckpt")[4]   # AdamW m after step 1: (1 - beta1) g
    m1 = tsdc_io.read_checkpoint(tmp_path / "r1" / "step_000001.ckpt")[4]
    worst = max(float(np.max(np.abs(mR[k] - m1[k])) / np.max(np.abs(m1[k]))) for k in m1)
    print(f"{ranks} ranks x 1 vs 1 rank x {ranks} microbatches: largest rel loss diff {max(d.values()):.2e}, grad_norm "
          f"{max(gn.values()):.2e}, step-1 gradients {worst:.2e}; buckets {sizes}")
    assert max(d.values()) <= 1e-4, d
    assert max(gn.values()) <= 1e-4, gn   # the pre-clip norm: a 2x gradient scale error shows here, not in the losses
    assert worst <= 1e-5, worst


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


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-nanochat"])
def test_qk_mantissa_faults_at_every_site_caught(data, tmp_path, preset):
    """one mantissa-only flip (m = 1, -fault_field mantissa: the smallest fault the fingerprints must see) at each
    forward Q/K-path site in turn (projections, QK norm before RoPE for qwen3 and after it for nanochat, RoPE), in
    both steps of a 2-step run: every event caught by the Q/K recomputation and replayed, the final checkpoint the
    clean run's bytes. The backward Q/K path's mantissa faults: test_qk_bwd_catches_mantissa_faults_on_the_backward_qk_path.
    Catches: a site whose fingerprint is taken before its fault (the fault after the producing kernel not seen), a
    fingerprint that drops low mantissa bits."""
    base = {"-preset": preset, "-steps": 2, "-accum": 2, "-warmup": 1}
    emu(small(data, tmp_path / "clean", **base))
    for site in ("q_proj", "k_proj", "q_norm", "k_norm", "q_rope", "k_rope"):
        out = tmp_path / site
        emu(small(data, out, **base, **{"-protect": "qk", "-fault_mode": "campaign", "-fault_sites": site, "-fault_pass": "fwd",
                                        "-fault_field": "mantissa", "-fault_m": 1, "-fault_seed": 5, "-fault_mb": -1}))
        ev = fault_events(out)
        assert [(e[0], e[3], e[4]) for e in ev] == [(1, site, "fwd"), (2, site, "fwd")], ev
        st = steps(out)
        assert all(r["replayed"] == 1 and r["alarm"].startswith("qk") for r in st.values()), (site, st)
        assert ckpt(out, 2) == ckpt(tmp_path / "clean", 2), site


def test_protect_all_is_every_kind_or_an_error(data, tmp_path):
    """-protect all means the same kinds on both trainers: the GPU trainer runs ew by name; a kind it does not run
    (PROT_KINDS' gpu column, llmc/sdc/checks.h) is one error line naming it, "-protect X: not available on this
    trainer", named alone or through all, never a silent narrowing; where it runs every kind, all runs and its
    protected steps name every kind's checks in their summary. The same message for a kind made unavailable is
    tested on the parser itself (test_sdc.c, protect_parse), whatever the table says today.
    Catches: a GPU run that claims a protection it does not run, an all that quietly leaves kinds out."""
    p = emu(small(data, tmp_path / "ew", **{"-steps": 1, "-protect": "ew"}))
    assert "protection ew" in p.stdout, p.stdout[-800:]
    for tok in GPU_MISSING:
        p = emu(small(data, tmp_path / "r", **{"-steps": 1, "-protect": f"qk,{tok}"}), check=False)
        err = [l for l in p.stderr.splitlines() if l.startswith("error:")]
        assert p.returncode == 1 and err == [f"error: -protect {tok}: not available on this trainer"], (tok, p.stderr[-500:])
    p = emu(small(data, tmp_path / "a", **{"-steps": 1, "-accum": 3, "-protect": "all"}), check=False)
    c = cpu(small(data, tmp_path / "c", **{"-steps": 1, "-accum": 3, "-protect": "all"}))
    assert f"-protect all: {','.join(ALL_KINDS)}\n" in c.stdout, c.stdout[-800:]
    if GPU_MISSING:
        err = [l for l in p.stderr.splitlines() if l.startswith("error:")]
        assert p.returncode == 1 and err == [f"error: -protect {','.join(GPU_MISSING)}: not available on this trainer (in -protect all)"], \
            p.stderr[-500:]
    else:
        assert p.returncode == 0 and f"-protect all: {','.join(ALL_KINDS)}\n" in p.stdout, (p.stdout[-800:], p.stderr[-500:])


# (preset, pass, sites, steps, seed): a one-event-a-step campaign (-fault_mb -1: either microbatch) whose draws hit
# every element-wise site the CPU's ew catches (forward also attn_norm at layer 0, whose input is the embedding, and
# the last layer's block_out, checked after the loop); the draws are the fault injector's, the same for m 1 and 10
EW_PLANS = [("tiny-llama", "fwd", "attn_norm,mlp_norm,attn_residual,block_out,act,mlp_product", 10, 23),
            ("tiny-llama", "bwd", "act,up_proj,gate_proj,attn_residual,block_out", 8, 4),
            ("tiny-nanochat", "fwd", "attn_norm,mlp_norm,attn_residual,block_out,act", 6, 7),
            ("tiny-nanochat", "bwd", "gate_proj,attn_residual,block_out", 5, 2)]   # ReLU^2: act's gradient is down_proj's dx (a product)


def events(out):
    return [{k: e[k] for k in ("step", "microbatch", "layer", "site", "pass")} for e in map(json.loads, open(out / "faults.jsonl"))]


@pytest.mark.parametrize("plan", EW_PLANS, ids=[f"{p}-{q}" for p, q, *_ in EW_PLANS])
def test_ew_faults_caught_as_on_the_cpu_and_replay_is_exact(data, tmp_path, plan):
    """-protect ew on the device (llmc/sdc/ewcheck.cuh): single-element mantissa faults (m = 1 and 10) at the outputs of
    the element-wise kernels, forward (the norms, the residual adds, fused with the next norm or not, the activation,
    the gated product) or backward (the act, up_proj and gate_proj gradients: the split SwiGLU backward where act's is
    hit, the fused one else), are caught in every step, the step is replayed and the final weights are the clean
    emulated run's bytes; the CPU trainer (-precision bf16) on the same fault plan injects the same events and
    describes each alarm the same way (count of failed comparisons, first layer, microbatch). Catches: a check that
    runs before the injection point or reads the wrong tensor (misses), one that is not bitwise (a false alarm: the
    count differs from the CPU's, or the replay alarms again), flags read back before the backward's checks ran, a
    site left out."""
    preset, pas, sites, n, seed = plan
    base = {"-preset": preset, "-steps": n, "-accum": 2, "-warmup": 5}
    emu(small(data, tmp_path / "clean", **base))
    for m in (1, 10):
        fault = {"-protect": "ew", "-fault_mode": "campaign", "-fault_sites": sites, "-fault_pass": pas, "-fault_field": "mantissa",
                 "-fault_m": m, "-fault_seed": seed, "-fault_mb": -1}
        g, c = tmp_path / f"gpu{m}", tmp_path / f"cpu{m}"
        emu(small(data, g, **base, **fault))
        cpu(small(data, c, **base, **fault))
        sg, sc = steps(g), steps(c)
        assert sorted(sg) == sorted(sc) == list(range(1, n + 1)), (sorted(sg), sorted(sc))
        for s, r in sg.items():
            assert r["injections"] == 1 and r["replayed"] == 1 and r["by"] == "ew", (m, s, r)
            assert r["alarm"] == sc[s]["alarm"], (m, s, r["alarm"], sc[s]["alarm"])
        assert events(g) == events(c), (m, events(g), events(c))
        assert {e["site"] for e in events(g)} == set(sites.split(",")), events(g)
        assert ckpt(g, n) == ckpt(tmp_path / "clean", n), f"m {m}: final checkpoint differs from the clean emulated run"


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-nanochat"])
def test_bound_faults_caught_as_on_the_cpu_and_replay_is_exact(data, tmp_path, preset):
    """-protect bound on the device (llmc/sdc/bound.cuh): exponent faults (10 elements x 4 bits) at the outputs of the
    forward's v, o, gate, up and down projections, views of the fused q/k/v and gate/up GEMMs included, are caught in
    every step and described as the CPU trainer describes them (products over their bound, first layer, microbatch),
    the step replays to the clean emulated run's bytes, and 20 clean steps raise no alarm. tiny-nanochat: ReLU^2, the
    fc output unfused. Catches: a view read with the wrong row stride or offset, the weights' norms not refreshed after
    an update or taken from the wrong rows (false alarms or misses that differ from the CPU), flags read before the
    forward's copy, a product left out."""
    sites = "v_proj,o_proj,gate_proj,down_proj" if preset == "tiny-nanochat" else "v_proj,o_proj,gate_proj,up_proj,down_proj"
    n = 8
    base = {"-preset": preset, "-steps": n, "-accum": 2, "-warmup": 5}
    emu(small(data, tmp_path / "clean", **base))
    fault = {"-protect": "bound", "-fault_mode": "campaign", "-fault_sites": sites, "-fault_pass": "fwd", "-fault_field": "exponent",
             "-fault_m": 10, "-fault_seed": 1, "-fault_mb": -1}
    g, c = tmp_path / "gpu", tmp_path / "cpu"
    emu(small(data, g, **base, **fault))
    cpu(small(data, c, **base, **fault))
    sg, sc = steps(g), steps(c)
    assert sorted(sg) == sorted(sc) == list(range(1, n + 1)), (sorted(sg), sorted(sc))
    for s, r in sg.items():
        assert r["injections"] == 1 and r["replayed"] == 1 and r["by"] == "bound", (s, r)
        assert r["alarm"] == sc[s]["alarm"], (s, r["alarm"], sc[s]["alarm"])
    assert events(g) == events(c), (events(g), events(c))
    assert len({e["site"] for e in events(g)}) >= 3, events(g)
    assert ckpt(g, n) == ckpt(tmp_path / "clean", n), "final checkpoint differs from the clean emulated run"
    emu(small(data, tmp_path / "quiet", **{**base, "-steps": 20, "-save": "none"}, **{"-protect": "bound"}))
    assert sum(r["alarms"] for r in steps(tmp_path / "quiet").values()) == 0


def test_ew_clean_run_raises_no_alarm(data, tmp_path):
    """50 clean bf16 steps under -protect ew (tiny-llama; 150 and tiny-nanochat too with TSDC_EMU_FULL=1) raise no
    alarm and end with the unprotected run's weights: each recomputation rounds as its producing kernel. Catches:
    a check whose rounding differs from the kernel it checks (another operation order, a missing bf16 rounding of
    the fused backward's d act, a mean square summed in another order)."""
    n = 150 if FULL else 50
    for preset in (["tiny-llama", "tiny-nanochat"] if FULL else ["tiny-llama"]):
        kw = {"-preset": preset, "-steps": n, "-warmup": 5, "-save": "none"}
        p = emu(small(data, tmp_path / f"ew_{preset}", **kw, **{"-protect": "ew"}))
        q = emu(small(data, tmp_path / f"none_{preset}", **kw))
        st = steps(tmp_path / f"ew_{preset}")
        assert len(st) == n and sum(r["alarms"] for r in st.values()) == 0, [(r["step"], r["alarm"]) for r in st.values() if r["alarms"]]
        fin = [re.search(r"final weights ([0-9a-f]{16})", x.stdout) for x in (p, q)]
        assert all(fin) and fin[0].group(1) == fin[1].group(1), (preset, p.stdout[-300:], q.stdout[-300:])
def fault_events(out):
    """(step, microbatch, layer, site, pass) of every injected event of a run"""
    return [(r["step"], r["microbatch"], r["layer"], r["site"], r["pass"]) for r in map(json.loads, open(os.path.join(out, "faults.jsonl")))]


def caught_by(out):
    """per step: replayed and the kinds that alarmed"""
    return {s: (r["replayed"], r["by"]) for s, r in steps(out).items()}


# the three attention paths of the GPU backward that -protect qk_bwd recomputes: the fused (flash) backward rerun,
# the materialised one rerun (-detect abft selects it: ATTNChecker's checksums read the stored tensors), the split one
# from the stored dlogits (att_bwd on the materialised path selects it; -protect att and att_bwd alone stay fused)
QKB_PATHS = {"flash": {"-protect": "qk_bwd"}, "materialised": {"-protect": "qk_bwd", "-detect": "abft"},
             "split": {"-protect": "qk_bwd,att_bwd", "-detect": "abft"}}
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
    base = {"-preset": preset, "-steps": 4, "-accum": 2, "-warmup": 2, **QKB_PATHS[path]}
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
    """-protect att_bwd on the GPU trainer (the fused attention's dq kernel row sums and the dV column check, and at a
    layer where an att_probs / att_logits event is due the split backward's stored tensors):
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


def test_guard_statistics_match_the_cpu_trainer(data, tmp_path):
    """Every statistic the forward guards and the backward guard read from the device, dumped by both trainers
    (TSDC_CHECK_DUMP, test-only: llmc/sdc/checks.h) for the same forward (or backward-guard evaluation), layer and
    microbatch of the same plan: 5 steps x 3 microbatches from the reference checkpoint under -protect
    qk,att,rgg,bwd, step 1 clean, one forward exponent fault event a step after it (q_rope, k_rope, att_logits,
    att_probs).
    Everywhere: the Q/K recomputation's flags and the attention checks' failed heads equal the CPU trainer's (and
    some are not zero); on the GPU the fingerprints the device reduced equal the CPU's qk_fingerprint of the
    downloaded Q and K, and the recomputation's equal them exactly where the flag is 0.
    On step 1 (both trainers hold the same weights; after an update AdamW's per-element normalisation amplifies the
    fp32 summation-order differences, see the 4-rank test): the Residual Gain Guard's sums of mean squares within 1e-3
    relative and its gains within 1e-3 (measured: 4.7e-4 / 1.8e-4 at most); each tensor's gradient sum of squares
    within 1e-2 (measured: 3e-3, the bf16 rounding of the gradients the two trainers sum in different orders);
    the attention checks' bound sums within 2e-3, their |reference| sums and logits row sums within 5e-3 (rows
    whose dot products nearly cancel carry most of the difference) and the probability row sums within 1e-4
    (measured 2.2e-4, 1.8e-3, 1.7e-3, 4e-5). After step 1 only the flags and counts are compared: besides the weights'
    drift, a faulty attempt's gradients legitimately differ (an exponent flip in K: 2.7e22 on the fused backward,
    whose D comes from the bf16 output, against the CPU's 20.7; docs/gpu.md).
    Catches: a reduction off by one token (an RGG sum moves by 1/64 = 1.6% at B 2 x T 32), by one row of a gradient
    (1/64 of a [64, 128] tensor's sum on average) or by one prefix entry (a bound or reference sum moves by about
    1/T = 3%; a probability row sum without its diagonal by far more), a fingerprint reduction that drops blocks, a
    device flag or count that is not the check's."""
    base = {"-preset": "tiny-llama", "-init": ref_ckpt("tiny-llama"), "-steps": 5, "-accum": 3, "-protect": "qk,att,rgg,bwd",
            "-fault_mode": "campaign", "-fault_sites": "att_logits,att_probs,q_rope,k_rope", "-fault_pass": "fwd",
            "-fault_field": "exponent", "-fault_m": 3, "-fault_seed": 7, "-fault_mb": -1, "-fault_start": 2, "-save": "none"}
    dumps = {}
    for name, fn in (("gpu", emu), ("cpu", cpu)):
        dump = tmp_path / f"{name}.jsonl"
        fn(small(data, tmp_path / name, **base), env_extra={"TSDC_CHECK_DUMP": str(dump)})
        d = {}
        for r in map(json.loads, open(dump)):
            key = (r["kind"], r.get("fwd", r.get("n")), r.get("layer", -1))
            assert key not in d, key
            d[key] = r
        dumps[name] = d
    g, c = dumps["gpu"], dumps["cpu"]
    assert sorted(g) == sorted(c), sorted(set(g) ^ set(c))[:8]
    assert fault_events(tmp_path / "gpu") == fault_events(tmp_path / "cpu")
    assert caught_by(tmp_path / "gpu") == caught_by(tmp_path / "cpu")
    kinds = {k[0] for k in g}
    assert kinds == {"qkf", "attf", "rgg", "gss"}, kinds
    st = steps(tmp_path / "gpu")
    assert 1 not in {e[0] for e in fault_events(tmp_path / "gpu")} and st[1]["replayed"] == 0
    # step 1: its 3 forwards and its one backward-guard evaluation
    worst = {}

    def close(what, a, b, rel):
        for x, y in zip(a, b):
            e = abs(x - y) / max(abs(y), 1e-300) if rel else abs(x - y)
            worst[what] = max(worst.get(what, 0.0), e)

    for key, rg in g.items():
        rc = c[key]
        kind, n, layer = key
        if kind == "qkf":
            assert rg["qkf"] == rc["qkf"], (key, rg, rc)
            assert rg["fp_dev"] == rg["fp_host"], (key, rg)
            assert (rg["fp_rec"] == rg["fp_dev"]) == (rg["qkf"] == 0), (key, rg)
        elif kind == "attf":
            assert rg["att"] == rc["att"], (key, rg, rc)
            if n <= 3:
                close("attf bounds", rg["sums"][:1], rc["sums"][:1], True)
                close("attf refs", rg["sums"][1:2], rc["sums"][1:2], True)
                close("attf logits rows", rg["sums"][2:3], rc["sums"][2:3], True)
                close("attf probs rows", rg["sums"][3:], rc["sums"][3:], True)
        elif kind == "rgg" and n <= 3:
            close("rgg sums", rg["ss"], rc["ss"], True)
            close("rgg gains", rg["gain"], rc["gain"], False)
        elif kind == "gss" and n == 1:
            assert len(rg["ss"]) == len(rc["ss"]) > 0
            close("grad sumsq", rg["ss"], rc["ss"], True)
    print("worst differences GPU vs CPU on step 1:", {k: f"{v:.2e}" for k, v in worst.items()})
    bounds = {"rgg sums": 1e-3, "rgg gains": 1e-3, "grad sumsq": 1e-2, "attf bounds": 2e-3, "attf refs": 5e-3,
              "attf logits rows": 5e-3, "attf probs rows": 1e-4}
    assert set(worst) == set(bounds), worst
    for k, b in bounds.items():
        assert worst[k] < b, (k, worst[k], b)
    assert any(r["qkf"] for k, r in g.items() if k[0] == "qkf"), "no Q/K alarm: the plan hit no Q/K-path element"
    assert any(sum(r["att"]) for k, r in g.items() if k[0] == "attf"), "no attention-check alarm"


def test_backward_checks_clean_runs_are_quiet(data, tmp_path):
    """50 clean bf16 steps under -protect qk_bwd,att_bwd with -detect abft beside (the materialised attention and its
    split backward: the three checks on the stored tensors, the Q/K recomputation from the stored dlogits): no alarm.
    The fused backward (its dq kernel's row sums and the dV column check at their bounds, the Q/K recomputation
    rerunning it) is in test_calibrated_clean_steps_raise_no_alarm's 200 steps under -protect all. Catches: a bound
    tighter than the GPU's bf16 rounding, a recomputation that is not bitwise."""
    for name, extra in (("split", {"-detect": "abft"}),):
        out = tmp_path / name
        emu(small(data, out, **{"-preset": "tiny-llama", "-steps": 50, "-warmup": 5, "-protect": "qk_bwd,att_bwd", "-save": "none",
                                **extra}))
        st = steps(out)
        assert len(st) == 50 and sum(r["alarms"] for r in st.values()) == 0, [(s, r["alarm"]) for s, r in st.items() if r["alarms"]]


def test_calibrated_clean_steps_raise_no_alarm(data, tmp_path):
    """100 clean calibration steps (-rgg_calibrate; 3 microbatches a step, the peers of the Residual Gain Guard on one
    process), then 200 protected clean steps under -protect all: no alarm, the settings of tests/test_protect.py's
    CPU test (warmup 2). Catches: a GPU check whose clean rounding trips it (a Q/K or backward recomputation that is
    not bitwise, an element-wise check that rounds otherwise than its kernel, an attention bound tighter than the
    fused kernels' rounding, an RGG or backward-guard statistic computed differently from the calibration).
    Found while choosing the settings: with -warmup 5 the Residual Gain Guard raises one z alarm at step 185
    (layer 2, attention, microbatch 2: z 7.35 against 6.59) on this trainer, and the CPU trainer raises the same one
    at the same step, layer and microbatch under -perturb -2 (z 7.44 against 6.23; its unperturbed run stays just
    under): an outlier microbatch for a 64-token guard, not a difference of the trainers (their gains agree to 2e-4:
    test_guard_statistics_match_the_cpu_trainer). With warmup 2 the CPU trainer stays quiet under -perturb 0, +-1,
    +-2, +-3."""
    n = 200
    cal = tmp_path / "rgg.cal"
    kw = {"-preset": "tiny-llama", "-steps": 100 + n, "-accum": 3}
    emu(small(data, tmp_path / "cal", **kw, **{"-stop_at": 100, "-rgg_calibrate": cal}))
    emu(small(data, tmp_path / "cal", **kw, **{"-resume": tmp_path / "cal" / "step_000100.ckpt", "-protect": GPU_ALL,
                                              "-rgg_calibration": cal, "-save": "none"}))
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
    """Protection without host round-trips in the layer loops, counted by the emulation (-stats): a protected step
    (every kind the GPU trainer runs, GPU_ALL: Q/K recomputation, Residual Gain Guard, attention checks, element-wise
    recomputation, backward guard, exponent scaling; 4 microbatches, so the RGG has its peers) synchronises the host
    nowhere inside the forward's and backward's layer loops; the forward's checks add no synchronisation (the Q/K
    fingerprints accumulated on the device and compared on the host from the report, the RGG sums reduced there, the attention and element-wise flags: all come
    back with the losses in the forward's one copy: -protect qk,rgg,att,bwd,exp syncs as -protect none); the backward's
    checks (ew's gradient comparisons, the qk_bwd fingerprints, the att_bwd counts) add one copy and one synchronisation per microbatch, after the backward's
    layer loop; and none of it grows with the layers (2 vs 4). A host round-trip planted in the layer loop (a stream
    synchronisation, a pageable copy) fails all of it. ew adds no launch and no element-wise byte on a clean step."""
    geo = {"-preset": "tiny-llama", "-accum": 4}
    prot2 = stats_of(data, tmp_path / "p2", **geo, **{"-n_layer": 2, "-protect": GPU_ALL})
    prot4 = stats_of(data, tmp_path / "p4", **geo, **{"-n_layer": 4, "-protect": GPU_ALL})
    fwd2 = stats_of(data, tmp_path / "f2", **geo, **{"-n_layer": 2, "-protect": "qk,rgg,att,bwd,exp"})
    none2 = stats_of(data, tmp_path / "n2", **geo, **{"-n_layer": 2, "-protect": "none"})
    none4 = stats_of(data, tmp_path / "n4", **geo, **{"-n_layer": 4, "-protect": "none"})
    print("stats per step: protect", GPU_ALL, "L2", prot2, "L4", prot4, "| forward checks L2", fwd2, "| none L2", none2, "L4", none4)
    for name, st in (("all L2", prot2), ("all L4", prot4), ("fwd L2", fwd2), ("none L2", none2), ("none L4", none4)):
        assert st["loop_syncs"] == 0, f"{name}: {st['loop_syncs']} host synchronisations inside the layer loops"
    assert fwd2["syncs"] == none2["syncs"] and fwd2["d2h"] == none2["d2h"], \
        f"forward checks add host synchronisations: {fwd2['syncs']} vs {none2['syncs']}, copies {fwd2['d2h']} vs {none2['d2h']}"
    bwd_reports = 4   # one per microbatch: the backward's check flags
    assert prot2["syncs"] == none2["syncs"] + bwd_reports and prot4["syncs"] == none4["syncs"] + bwd_reports, \
        f"protection adds host synchronisations: {prot2['syncs']} vs {none2['syncs']} (L2), {prot4['syncs']} vs {none4['syncs']} (L4)"
    assert prot2["syncs"] == prot4["syncs"], f"host synchronisations grow with the layers: {prot2['syncs']} (L2) vs {prot4['syncs']} (L4)"
    # a small constant: per microbatch the token upload, the forward's report and the backward's, plus the step's norms
    assert prot2["syncs"] <= 3 * 4 + 2, prot2
    # per microbatch the forward's report (and the backward's, protected), one copy for the norms
    assert prot2["d2h"] == none2["d2h"] + bwd_reports == prot4["d2h"], (prot2, none2, prot4)
    # the backward checks' and bound's bytes show in -stats
    assert prot2["ew_read"] > fwd2["ew_read"], (prot2, fwd2)
    assert prot4["launches"] > prot2["launches"] > none2["launches"] > 0
    # ew is inside the element-wise kernels (llmc/sdc/ewdup.cuh): a clean step reads no byte and launches no kernel
    # more for it (a recomputation kernel planted back into the clean path fails this)
    ew2 = stats_of(data, tmp_path / "e2", **geo, **{"-n_layer": 2, "-protect": "qk,rgg,att,bwd,exp,ew"})
    assert ew2["ew_read"] == fwd2["ew_read"] and ew2["launches"] == fwd2["launches"], (ew2, fwd2)
