"""Behaviour of the CPU trainer binary (./train_sdc), run as a user runs it:
determinism (same command twice: same loss bits and checkpoint bytes), exact resume, R ranks x A
microbatches vs 1 rank x R*A microbatches, evaluation predictions, sampling, the HF import path, and
one test per bad-input case (one-line error naming the file, non-zero exit, never a crash).
Data: byte-level shards of ../shared/data/tinyshakespeare.txt (TSDC_DATA_DIR), written with tsdc_io."""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
import tsdc_io  # noqa: E402

BIN = os.path.join(ROOT, "train_sdc")
DATA_DIR = os.environ.get("TSDC_DATA_DIR", os.path.join(ROOT, "..", "shared", "data"))


def mpi_available(binary):
    """(mpirun path or None, skip reason): MPI tests need mpirun and a binary built with MPI (its
    -version line says so; a single-process build refuses to run as several ranks)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None, "OpenMPI not installed (no mpirun): the MPI tests need it"
    try:
        out = subprocess.run([binary, "-version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None, f"{os.path.basename(binary)} not built"
    if "MPI: yes" not in out:
        return None, f"{os.path.basename(binary)} built without MPI (install OpenMPI, then make rebuilds it)"
    return mpirun, None


MPIRUN, MPI_SKIP = mpi_available(BIN)
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    raw = np.frombuffer(open(os.path.join(DATA_DIR, "tinyshakespeare.txt"), "rb").read()[:400_000], dtype=np.uint8)
    n = len(raw) * 9 // 10
    tsdc_io.write_shard(d / "train.bin", raw[:n], 256)
    tsdc_io.write_shard(d / "val.bin", raw[n:], 256)
    tsdc_io.write_vocab(d / "tokenizer.bin", [bytes([i]) for i in range(256)])
    return d


def run(args, check=True, env=None, mpi=0, timeout=600, binary=BIN):
    """binary (a path, or a list: the path and its first arguments) with args, under mpirun with `mpi` ranks when
    mpi > 0; an AssertionError with the output's tail when it fails and `check`"""
    cmd = ([MPIRUN, "-np", str(mpi)] if mpi else []) + (binary if isinstance(binary, list) else [binary]) + [str(a) for a in args]
    e = dict(os.environ)
    e.update(env or {})
    if mpi:
        e.update(MPI_ENV)
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=e, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def base(data, out, **kw):
    a = {"-preset": "tiny-llama", "-vocab": 256, "-seq": 64, "-B": 4, "-train": data / "train.bin",
         "-val": data / "val.bin", "-steps": 8, "-lr": 1e-3, "-warmup": 2, "-eval_every": 4,
         "-eval_tokens": 1024, "-out": out, "-quiet": None}
    a.update(kw)
    out_args = []
    for k, v in a.items():
        if v is None and k == "-quiet":
            out_args.append(k)
        elif v is not None:
            out_args += [k, v]
    return out_args


def steps(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    return {r["step"]: r for r in rows if r["type"] == "step"}


def loss_bits(out):
    return {s: struct.pack("<f", r["loss"]) for s, r in steps(out).items()}


# ------------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("preset,precision", [("tiny-llama", "fp32"), ("tiny-qwen3", "bf16"), ("tiny-nanochat", "fp32")])
def test_same_command_twice_is_bitwise_identical(data, tmp_path, preset, precision):
    """Catches: nondeterminism (uninitialised memory, a time-based seed, a racy reduction)."""
    for name in ("a", "b"):
        run(base(data, tmp_path / name, **{"-preset": preset, "-precision": precision, "-steps": 6}))
    assert loss_bits(tmp_path / "a") == loss_bits(tmp_path / "b")
    ca = open(tmp_path / "a" / "step_000006.ckpt", "rb").read()
    cb = open(tmp_path / "b" / "step_000006.ckpt", "rb").read()
    assert ca == cb, "checkpoint bytes differ between two identical runs"


def test_thread_count_does_not_change_bits(data, tmp_path):
    """Catches: results that depend on -threads (a reduction split by thread)."""
    run(base(data, tmp_path / "t1", **{"-threads": 1, "-steps": 4}))
    run(base(data, tmp_path / "t2", **{"-threads": 2, "-steps": 4}))
    assert loss_bits(tmp_path / "t1") == loss_bits(tmp_path / "t2")
    assert open(tmp_path / "t1" / "step_000004.ckpt", "rb").read() == open(tmp_path / "t2" / "step_000004.ckpt", "rb").read()


def test_resume_continues_bit_for_bit(data, tmp_path):
    """stop at 5, resume to 10: losses and final checkpoint equal the uninterrupted run's. Catches: a resume that
    restarts the data position or lr schedule at 0, loses the Adam moments or the step count."""
    full, part = tmp_path / "full", tmp_path / "part"
    run(base(data, full, **{"-steps": 10, "-ckpt_every": 5}))
    run(base(data, part, **{"-steps": 10, "-stop_at": 5}))
    p = run(base(data, part, **{"-steps": 10, "-resume": part / "step_000005.ckpt"}))
    assert "resumed from" in p.stdout
    a, b = loss_bits(full), loss_bits(part)
    assert sorted(b) == list(range(1, 11))
    assert a == b, "losses after resume differ from the uninterrupted run"
    assert open(full / "step_000010.ckpt", "rb").read() == open(part / "step_000010.ckpt", "rb").read()


@pytest.mark.skipif(MPIRUN is None, reason=str(MPI_SKIP))
def test_ranks_times_accum_matches_one_rank(data, tmp_path):
    """2 ranks x 2 microbatches vs 1 rank x 4 on the same data: losses and grad_norm within 1e-5 relative (measured
    1e-7 and 6e-8). Catches: ranks reading overlapping data, gradients averaged wrongly across ranks (a missing
    world factor: grad_norm 2x, which losses alone hide under clipping and Adam)."""
    # 2 ranks x 2 microbatches vs 1 rank x 4 microbatches on the same data
    run(base(data, tmp_path / "r2", **{"-accum": 2, "-threads": 1}), mpi=2)
    run(base(data, tmp_path / "r1", **{"-accum": 4}))
    a, b = steps(tmp_path / "r2"), steps(tmp_path / "r1")
    assert sorted(a) == sorted(b) == list(range(1, 9))
    worst = max(abs(a[s]["loss"] - b[s]["loss"]) / abs(b[s]["loss"]) for s in a)
    worst_gn = max(abs(a[s]["grad_norm"] - b[s]["grad_norm"]) / abs(b[s]["grad_norm"]) for s in a)
    print(f"largest relative difference over 8 steps: loss {worst:.3e}, grad_norm {worst_gn:.3e}")
    assert worst <= 1e-5
    assert worst_gn <= 1e-5


@pytest.mark.skipif(MPIRUN is None, reason=str(MPI_SKIP))
def test_mpi_ranks_hold_identical_weights(data, tmp_path):
    """3 ranks, a checkpoint every step: the trainer's cross-rank comparison reports identical weights. Catches:
    ranks whose weights drift apart (an init not broadcast, an update from unreduced gradients), as far as the
    trainer's own check sees it."""
    p = run(base(data, tmp_path / "r3", **{"-steps": 3, "-threads": 1, "-ckpt_every": 1}), mpi=3)
    assert "3 ranks" in p.stdout and "identical on all ranks" in p.stdout


def test_build_without_mpi_runs_single_process(data, tmp_path):
    """Catches: train_sdc.c that cannot build without mpi.h, a single-process build that does not say so."""
    exe = tmp_path / "train_sdc_nompi"
    subprocess.run(["cc", "-O2", "-fopenmp", "-o", str(exe), os.path.join(ROOT, "train_sdc.c"), "-lm"], check=True, cwd=ROOT)
    p = subprocess.run([str(exe)] + [str(a) for a in base(data, tmp_path / "o", **{"-steps": 1})], capture_output=True, text=True)
    assert p.returncode == 0 and "built without MPI: single process" in p.stdout


# ------------------------------------------------------------------------- evaluation, sampling, import
def test_eval_predictions_and_sample(data, tmp_path):
    """Catches: -pred_out not written or of the wrong length (-eval_tokens ignored), evaluation at other steps than
    -eval_every, ppl not exp(val_loss), sampling not run."""
    pred = tmp_path / "pred.bin"
    p = run(base(data, tmp_path / "o", **{"-steps": 4, "-pred_out": pred, "-sample_every": 4, "-sample_len": 16}))
    assert "sample: " in p.stdout
    preds, vocab = tsdc_io.read_shard(pred)
    assert vocab == 256 and len(preds) == 1024 and preds.max() < 256
    evals = [json.loads(l) for l in open(tmp_path / "o" / "log.jsonl") if '"eval"' in l]
    assert [e["step"] for e in evals] == [4] and abs(evals[0]["ppl"] - np.exp(evals[0]["val_loss"])) < 1e-3 * evals[0]["ppl"]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-nanochat"])
@pytest.mark.parametrize("entry", ["train", "eval"])
def test_binary_reproduces_reference_loss(tmp_path, preset, entry):
    """The trainer binary, from the imported HF weights (-init), on row 0 of the reference batch: its
    step-1 training loss and its evaluation loss must equal the cross-entropy of PyTorch's logits.
    Catches: a training or evaluation loss off the model's (a wrong mean, targets shifted by one, evaluation on
    other tokens)."""
    ck = os.path.join(ROOT, "build", "ref", f"{preset}.ckpt")
    if not os.path.exists(ck):
        pytest.skip("build/ref not built (make refckpts)")
    sys.path.insert(0, os.path.join(ROOT, "dev", "reference"))
    from check_state import read_state
    st = read_state(os.path.join(ROOT, "dev", "reference", "states", f"{preset}.state"))
    T, V = st["T"], st["V"]
    row = st["tokens"][0]                                # T+1 tokens
    z = st["logits"][0].astype(np.float64)               # [T, V]
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    expect = float(np.mean(lse - z[np.arange(T), row[1:]]))
    shard = tmp_path / "ref.bin"
    tsdc_io.write_shard(shard, np.concatenate([row, np.zeros(T, dtype=np.int64)]), V)
    args = ["-preset", preset, "-vocab", V, "-seq", T, "-B", 1, "-init", ck, "-out", tmp_path / "o", "-quiet",
            "-eval_tokens", T, "-eval_every", 0]
    if entry == "train":
        run(args + ["-train", shard, "-steps", 1, "-lr", 0])
        got = steps(tmp_path / "o")[1]["loss"]
    else:
        run(args + ["-val", shard, "-steps", 0])
        got = [json.loads(l) for l in open(tmp_path / "o" / "log.jsonl") if '"eval"' in l][0]["val_loss"]
    assert abs(got - expect) <= 2e-5 * abs(expect), (got, expect)


# ------------------------------------------------------------------------------------------ bad input
def expect_error(p, *needles):
    assert p.returncode == 1, f"exit {p.returncode} (a signal is negative): {p.stderr}"
    err = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1, p.stderr
    for n in needles:
        assert str(n) in err[0], f"{n!r} not in {err[0]!r}"
    return err[0]


def corrupt(src, dst, fn):
    b = bytearray(open(src, "rb").read())
    b = fn(b)
    open(dst, "wb").write(bytes(b))
    return dst


def flip_bit(at):
    """for corrupt(): the lowest bit of byte `at` flipped"""
    def flip(b):
        b[at] ^= 0x01
        return b
    return flip


def test_bad_shard_magic(data, tmp_path):
    """Catches: a file without the shard magic read as tokens."""
    f = corrupt(data / "train.bin", tmp_path / "x.bin", lambda b: b"XXXX" + b[4:])
    expect_error(run(base(data, tmp_path / "o", **{"-train": f}), check=False), f, "magic")


def test_bad_shard_version(data, tmp_path):
    """Catches: a shard of an unknown format version read as version 1."""
    f = corrupt(data / "train.bin", tmp_path / "x.bin", lambda b: b[:8] + struct.pack("<I", 7) + b[12:])
    expect_error(run(base(data, tmp_path / "o", **{"-train": f}), check=False), f, "version")


def test_truncated_shard(data, tmp_path):
    """Catches: a truncated shard read past its end."""
    f = corrupt(data / "train.bin", tmp_path / "x.bin", lambda b: b[:-100])
    expect_error(run(base(data, tmp_path / "o", **{"-train": f}), check=False), f, "truncated")


def test_shard_checksum_mismatch(data, tmp_path):
    """Catches: a corrupted shard (one flipped bit) trained on silently."""
    f = corrupt(data / "train.bin", tmp_path / "x.bin", flip_bit(1000))
    expect_error(run(base(data, tmp_path / "o", **{"-train": f}), check=False), f, "checksum")


def test_token_id_beyond_vocab(data, tmp_path):
    """Catches: a token id >= the model's vocab used as an embedding row (out-of-bounds read)."""
    f = tmp_path / "big.bin"
    tsdc_io.write_shard(f, np.arange(5000) % 300, 300)
    expect_error(run(base(data, tmp_path / "o", **{"-train": f}), check=False), f, "token id 299", ">= model vocab")


def test_shard_shorter_than_one_batch(data, tmp_path):
    """Catches: a shard shorter than one batch read out of bounds."""
    f = tmp_path / "short.bin"
    tsdc_io.write_shard(f, np.arange(100) % 256, 256)
    expect_error(run(base(data, tmp_path / "o", **{"-train": f}), check=False), f, "shorter than one")


def test_missing_file(data, tmp_path):
    """Catches: a missing -val file ignored or a crash instead of one line."""
    expect_error(run(base(data, tmp_path / "o", **{"-val": tmp_path / "nope.bin"}), check=False), "nope.bin", "cannot open")


@pytest.fixture(scope="module")
def ckpt(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ck")
    run(base(data, out, **{"-steps": 2}))
    return out / "step_000002.ckpt"


def test_checkpoint_bad_magic(data, ckpt, tmp_path):
    """Catches: a file that is not a checkpoint resumed from."""
    f = corrupt(ckpt, tmp_path / "c.ckpt", lambda b: b"NOTACKPT" + b[8:])
    expect_error(run(base(data, tmp_path / "o", **{"-resume": f}), check=False), f, "magic")


def test_checkpoint_truncated(data, ckpt, tmp_path):
    """Catches: a truncated checkpoint resumed from (weights partly zero)."""
    f = corrupt(ckpt, tmp_path / "c.ckpt", lambda b: b[:len(b) // 2])
    expect_error(run(base(data, tmp_path / "o", **{"-resume": f}), check=False), f, "truncated")


def test_checkpoint_checksum_mismatch(data, ckpt, tmp_path):
    """Catches: a corrupted checkpoint (one flipped bit) resumed from silently."""
    def flip(b):
        b[5000] ^= 0x40
        return b
    f = corrupt(ckpt, tmp_path / "c.ckpt", flip)
    expect_error(run(base(data, tmp_path / "o", **{"-resume": f}), check=False), f, "checksum")


def test_checkpoint_config_differs_from_flags(data, ckpt, tmp_path):
    """Catches: a resume onto another model than the checkpoint's."""
    expect_error(run(base(data, tmp_path / "o", **{"-resume": ckpt, "-preset": "tiny-qwen3"}), check=False), ckpt, "differs")


def test_checkpoint_training_flags_differ(data, ckpt, tmp_path):
    """Catches: a resume with another -B (a different data order) accepted."""
    expect_error(run(base(data, tmp_path / "o", **{"-resume": ckpt, "-B": 2}), check=False), ckpt, "-B")


def test_tokenizer_checksum_and_magic(data, tmp_path):
    """Catches: a corrupted or foreign tokenizer file used for decoding."""
    f = corrupt(data / "tokenizer.bin", tmp_path / "t.bin", flip_bit(70))
    expect_error(run(base(data, tmp_path / "o", **{"-tokenizer": f}), check=False), f, "checksum")
    g = corrupt(data / "tokenizer.bin", tmp_path / "t2.bin", lambda b: b"XX" + b[2:])
    expect_error(run(base(data, tmp_path / "o", **{"-tokenizer": g}), check=False), g, "magic")


@pytest.mark.parametrize("args,needle", [
    (["-bogus", "1"], "unknown flag -bogus"),
    (["-steps", "ten"], "flag -steps: not an integer"),
    (["-lr", "1e-3x"], "flag -lr: not a number"),
    (["-precision", "fp8"], "flag -precision"),
    (["-preset", "gpt5"], "unknown preset"),
    (["-B"], "needs a value"),
    (["-save", "some"], "flag -save: 'some' is not all or none"),
])
def test_bad_flags_print_one_line(data, tmp_path, args, needle):
    """a flag error: exit 1, one stderr line naming the flag, "(see -h)" and no usage text. Catches: unknown flags,
    malformed values or a missing value silently ignored or defaulted; the error scrolled away by the usage."""
    p = subprocess.run([BIN] + args, capture_output=True, text=True)
    assert p.returncode == 1
    assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "usage: train_sdc" not in p.stderr
    if "preset" not in needle:
        assert "(see -h)" in p.stderr



def test_save_none_writes_no_checkpoint_and_same_losses(data, tmp_path):
    """-save none (benchmarks): no checkpoint at -ckpt_every nor at the end, the same training otherwise;
    the start-up line reports the counter-based initialisation.
    Catches: -save none still writing checkpoints, or changing the training."""
    a = run(base(data, tmp_path / "all", **{"-steps": 4, "-ckpt_every": 2}))
    run(base(data, tmp_path / "none", **{"-steps": 4, "-ckpt_every": 2, "-save": "none"}))
    assert sorted(f for f in os.listdir(tmp_path / "all") if f.endswith(".ckpt")) == ["step_000002.ckpt", "step_000004.ckpt"]
    assert not [f for f in os.listdir(tmp_path / "none") if f.endswith(".ckpt")]
    assert loss_bits(tmp_path / "all") == loss_bits(tmp_path / "none")
    assert any(l.startswith("init: ") and " weights in " in l for l in a.stdout.splitlines()), a.stdout[:500]

# ------------------------------------------------------------------------------------ GPU binary
GPU_BIN = os.path.join(ROOT, "train_sdc_cu")


@pytest.mark.skipif(not os.path.exists(GPU_BIN), reason="train_sdc_cu not built (no nvcc)")
def test_gpu_binary_without_gpu_says_so_in_one_line(data, tmp_path):
    """Catches: a CUDA error, a crash or several lines instead of one message on a machine without a GPU."""
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is present")
    p = subprocess.run([GPU_BIN] + [str(a) for a in base(data, tmp_path / "o", **{"-steps": 1})],
                       capture_output=True, text=True, errors="replace")
    assert p.returncode == 1, p
    err = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith("error: no usable CUDA GPU (") and "./train_sdc is the CPU trainer" in err[0], err
