"""The trainer binary against the reference states of dev/reference (HF transformers / nanochat,
PyTorch AdamW), through the real training loop (llmc/host/train_loop.h), not through test_sdc.c's own
optimizer calls.

The reference batch (2 independent rows of T+1 = 33 tokens) is written as a row shard
(docs/formats.md), so that `./train_sdc -init build/ref/PRESET.ckpt` reads exactly those rows at every
step (the shard wraps after one step's batch); the state header's settings become flags: -lr max_lr
-warmup 3 -steps 10 -final_lr_frac 0.1 (the trainer's schedule is the reference's lr_at), -beta1,
-beta2, -adam_eps, -wd, -clip. The reference losses are `losses[s]`, the loss before update s, which is
the trainer's logged loss of step s+1.

Gradient norms: the states store the gradients of step 0 only (before clipping), so the reference
norm of step 1 is sqrt(sum_i g_i^2) over the stored gradients, in float64: that is the n that torch's
clip_grad_norm_ computed at step 0, and the trainer logs the same pre-clip norm as grad_norm. For steps
2..10 the states hold no gradient; there the 1-rank run is the reference for the accumulated and
data-parallel runs (to 1e-5 relative), and the reference losses, which depend on every update, check
its updates.

Each configuration splits the same 2 rows differently: 1 rank x B 2; 1 rank x -accum 2 x B 1;
`mpirun -np 2` x B 1 (rank r reads row r). Bugs caught: the data-parallel scaling without `* world`
(2-rank gradients twice as large: grad_norm 2x), the accumulation without its 1/accum factor (same),
weight decay not reaching AdamW (losses drift from the reference's, see test_weight_decay_is_visible),
wrong lr schedule, betas, eps or clipping in the loop, and any loss of the loss or norm computation
between the model and the log."""
import json
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_trainer import MPIRUN, ROOT, run  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "dev"))
sys.path.insert(0, os.path.join(ROOT, "dev", "reference"))
import tsdc_io  # noqa: E402
from check_state import read_state  # noqa: E402

PRESETS = ["tiny-llama", "tiny-qwen3", "tiny-nanochat"]
REL = 1e-5       # losses and the step-1 grad_norm to 1e-5 relative (measured: <= 3e-7, printed)
# later steps' grad_norm, B 2 vs accum 2: the two summation orders differ by float rounding (1e-7) that
# 9 Adam updates amplify; measured up to 4.4e-5 (tiny-llama, step 9). A missing 1/accum or 1/world is 2x.
SPLIT_REL = 2e-4


def state(preset):
    return read_state(os.path.join(ROOT, "dev", "reference", "states", f"{preset}.state"))


def ref_ckpt(preset):
    ck = os.path.join(ROOT, "build", "ref", f"{preset}.ckpt")
    if not os.path.exists(ck):
        pytest.skip("build/ref not built (make refckpts)")
    return ck


def g7(x):
    """a float32 header value as the decimal the reference script used (0.001, not 0.0010000000475)"""
    return f"{float(x):.7g}"


def ref_args(preset, st, shard, out, B, accum=1, extra=()):
    h = st["hyper"]
    return ["-preset", preset, "-vocab", st["V"], "-seq", st["T"], "-B", B, "-accum", accum,
            "-init", ref_ckpt(preset), "-train", shard, "-steps", st["n_steps"],
            "-lr", g7(h["max_lr"]), "-warmup", st["warmup"], "-final_lr_frac", g7(h["final_frac"]),
            "-beta1", g7(h["beta1"]), "-beta2", g7(h["beta2"]), "-adam_eps", g7(h["adam_eps"]),
            "-wd", g7(h["weight_decay"]), "-clip", g7(h["grad_clip"]), "-eval_every", 0, "-out", out, "-quiet", *extra]


def write_ref_shard(st, path):
    tsdc_io.write_shard(path, st["tokens"], st["V"], row=st["T"] + 1)
    return path


def log_steps(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    return [r for r in rows if r["type"] == "step"]


def rel(a, b):
    return abs(a - b) / abs(b)


def check_against_reference(st, rows, what):
    losses = np.asarray(st["losses"], dtype=np.float64)
    ref_norm0 = math.sqrt(float(np.sum(np.asarray(st["grads"], dtype=np.float64) ** 2)))
    assert [r["step"] for r in rows] == list(range(1, len(losses) + 1)), f"{what}: steps {[r['step'] for r in rows]}"
    got = np.array([r["loss"] for r in rows])
    worst = float(np.max(np.abs(got - losses) / np.abs(losses)))
    print(f"{what}: losses max rel err {worst:.2e}; step-1 grad_norm {rows[0]['grad_norm']:.7g} vs reference "
          f"{ref_norm0:.7g} (rel {rel(rows[0]['grad_norm'], ref_norm0):.2e})")
    for s, (g, r) in enumerate(zip(got, losses)):
        assert rel(g, r) <= REL, f"{what}: loss before update {s}: {g!r} vs reference {r!r} (rel {rel(g, r):.2e})"
    assert rel(rows[0]["grad_norm"], ref_norm0) <= REL, \
        f"{what}: step-1 grad_norm {rows[0]['grad_norm']!r} vs reference {ref_norm0!r}"


@pytest.mark.parametrize("preset", PRESETS)
def test_binary_reproduces_reference_training(tmp_path, preset):
    """1 rank x B 2, then 1 rank x -accum 2 x B 1, then 2 MPI ranks x B 1: each reproduces the reference's
    10 losses and step-0 gradient norm; every step's grad_norm agrees with the 1-rank B 2 run's to
    SPLIT_REL (the runs sum the row gradients in other orders: accumulation adds inside the backward
    GEMMs, the all-reduce after it).
    Catches: a missing world or 1/accum factor (grad_norm 2x), weight decay, lr schedule, betas, eps or clipping
    wrong in the training loop."""
    st = state(preset)
    shard = write_ref_shard(st, tmp_path / "ref.bin")
    run(ref_args(preset, st, shard, tmp_path / "one", B=st["B"], extra=["-threads", 2]))
    one = log_steps(tmp_path / "one")
    check_against_reference(st, one, f"{preset} 1 rank x B {st['B']}")
    run(ref_args(preset, st, shard, tmp_path / "accum", B=1, accum=st["B"], extra=["-threads", 1]))
    acc = log_steps(tmp_path / "accum")
    check_against_reference(st, acc, f"{preset} 1 rank x accum {st['B']}")
    worst = max(rel(a["grad_norm"], b["grad_norm"]) for a, b in zip(acc, one))
    print(f"{preset}: grad_norm accum {st['B']} vs B {st['B']}, all steps: max rel diff {worst:.2e}")
    for a, b in zip(acc, one):
        assert rel(a["grad_norm"], b["grad_norm"]) <= SPLIT_REL, \
            f"{preset} accum: step {a['step']} grad_norm {a['grad_norm']!r} vs B {st['B']} {b['grad_norm']!r}"
    if not MPIRUN:
        pytest.skip("mpirun not installed: the 2-rank split was not run")
    run(ref_args(preset, st, shard, tmp_path / "mpi", B=1, extra=["-threads", 1]), mpi=st["B"])
    mpi = log_steps(tmp_path / "mpi")
    check_against_reference(st, mpi, f"{preset} {st['B']} ranks")
    for a, b in zip(mpi, one):
        assert rel(a["grad_norm"], b["grad_norm"]) <= SPLIT_REL, \
            f"{preset} {st['B']} ranks: step {a['step']} grad_norm {a['grad_norm']!r} vs 1 rank {b['grad_norm']!r}"


def test_weight_decay_is_visible(tmp_path):
    """The reference comparison is sensitive to weight decay: the same run with -wd 0 misses the reference
    losses by more than the tolerance (so a training loop that drops weight decay fails the test above). Catches: a reference test too loose to see weight decay."""
    preset = "tiny-llama"
    st = state(preset)
    shard = write_ref_shard(st, tmp_path / "ref.bin")
    args = ref_args(preset, st, shard, tmp_path / "wd0", B=st["B"], extra=["-threads", 2])
    args[args.index("-wd") + 1] = "0"
    run(args)
    got = np.array([r["loss"] for r in log_steps(tmp_path / "wd0")])
    worst = float(np.max(np.abs(got - st["losses"]) / np.abs(st["losses"])))
    print(f"-wd 0: losses max rel err vs the reference {worst:.2e} (tolerance {REL:g})")
    assert worst > 3 * REL


def bf16_bounds(n_layer):
    """BF16_LAMBDA, BF16_U and the rounding counts of tests/bf16_bounds.h (the one place they are written)"""
    import re
    h = open(os.path.join(ROOT, "tests", "bf16_bounds.h")).read()
    lam = float(re.search(r"#define BF16_LAMBDA ([0-9.e+-]+)", h).group(1))
    u = float(re.search(r"#define BF16_U ([0-9.e+-]+)", h).group(1))
    a, b = (int(x) for x in re.search(r"#define BF16_FWD_ROUNDINGS\(L\) \((\d+) \* \(L\) \+ (\d+)\)", h).groups())
    c, d = (int(x) for x in re.search(r"#define BF16_BWD_ROUNDINGS\(L\) \((\d+) \* \(L\) \+ (\d+)\)", h).groups())
    nf, nb = a * n_layer + b, c * n_layer + d
    return lam * math.sqrt(nf) * u, lam * math.sqrt(nf + nb) * u


@pytest.mark.parametrize("preset", PRESETS)
def test_binary_bf16_training_within_the_fixed_bounds(tmp_path, preset):
    """-precision bf16 through the real training loop on the reference batch: each of the 10 losses within
    bf16_losses_bound of tests/bf16_bounds.h (derived from bf16 rounding; test_sdc.c checks the logits and
    every gradient under the same header). Catches a bf16 weight copy left stale after the update
    (training stops learning: the loss stays near 5.5 instead of falling to 3.8)."""
    st = state(preset)
    shard = write_ref_shard(st, tmp_path / "ref.bin")
    run(ref_args(preset, st, shard, tmp_path / "bf16", B=st["B"], extra=["-threads", 2, "-precision", "bf16"]))
    rows = log_steps(tmp_path / "bf16")
    n_layer = tsdc_io.read_checkpoint(ref_ckpt(preset))[1]["n_layer"]
    logits_rl2, grad_rl2 = bf16_bounds(n_layer)
    z = np.asarray(st["logits"], dtype=np.float64)
    N = z.shape[0] * z.shape[1]
    loss0_bound = math.sqrt(2) * logits_rl2 * math.sqrt(float(np.sum(z * z))) / N
    ref = np.asarray(st["losses"], dtype=np.float64)
    got = np.array([r["loss"] for r in rows])
    bound = loss0_bound + grad_rl2 * np.abs(ref[0] - ref)
    print(f"{preset} bf16: |loss - reference| / bound per step: " + " ".join(f"{x:.2f}" for x in np.abs(got - ref) / bound))
    assert len(got) == len(ref)
    bad = np.nonzero(~(np.abs(got - ref) <= bound))[0]
    assert bad.size == 0, f"{preset} bf16: losses {got[bad]} vs reference {ref[bad]} (bounds {bound[bad]}) at steps {bad + 1}"


@pytest.mark.parametrize("preset", PRESETS)
def test_pred_out_is_the_argmax_of_the_reference_logits(tmp_path, preset):
    """-pred_out on the reference rows (a row shard as -val, -steps 0) equals, position by position, the
    argmax of PyTorch's logits on the same tokens; positions whose two largest reference logits lie within
    1e-4 (a tie at fp32 accuracy) are left out. Catches an argmax with a wrong row stride or offset, a
    wrong evaluation order of the held-out sequences, predictions shifted by a position."""
    st = state(preset)
    shard = write_ref_shard(st, tmp_path / "ref.bin")
    B, T, V = st["B"], st["T"], st["V"]
    run(["-preset", preset, "-vocab", V, "-seq", T, "-B", B, "-init", ref_ckpt(preset), "-val", shard, "-steps", 0,
         "-eval_tokens", B * T, "-pred_out", tmp_path / "pred.bin", "-out", tmp_path / "o", "-quiet", "-threads", 2])
    pred, vocab = tsdc_io.read_shard(tmp_path / "pred.bin")
    z = np.asarray(st["logits"], dtype=np.float64).reshape(B * T, V)
    top2 = np.sort(z, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4
    want = z.argmax(1)
    assert vocab == V and len(pred) == B * T
    print(f"{preset}: {int(clear.sum())} of {B * T} positions without a near-tie; "
          f"{int((pred == want).sum())} equal the reference argmax")
    assert clear.sum() >= B * T - 4
    assert np.array_equal(pred[clear], want[clear]), f"{preset}: predictions differ at {np.nonzero(clear & (pred != want))[0]}"


def test_row_shard_needs_rows_of_seq_plus_one(tmp_path):
    """A row shard read with another -seq is a one-line error naming the file (never rows read across
    their ends); a row length that does not divide the file is rejected at load.
    Catches: rows read across their ends under another -seq, a corrupt row length accepted."""
    from test_trainer import expect_error
    st = state("tiny-llama")
    shard = write_ref_shard(st, tmp_path / "ref.bin")
    args = ["-preset", "tiny-llama", "-vocab", st["V"], "-seq", 16, "-B", 1, "-train", shard, "-steps", 1, "-out", tmp_path / "o"]
    expect_error(run(args, check=False), shard, "rows of 33 tokens", "-seq 32")
    bad = tmp_path / "bad.bin"
    b = bytearray(open(shard, "rb").read())
    b[20:24] = (5).to_bytes(4, "little")          # 66 tokens are not rows of 5
    open(bad, "wb").write(bytes(b))
    expect_error(run(args[:-6] + ["-train", bad, "-steps", 1, "-out", tmp_path / "o2"], check=False), bad, "row length 5")
