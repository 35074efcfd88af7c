"""The checkpoint carries the model (issue 15): with -init or -resume the model config is the
checkpoint's, -preset is optional, and a flag that contradicts the checkpoint is a one-line error naming
both values; -n_layer N keeps the first N layers of a preset or of a checkpoint (-init)."""
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tsdc_io  # noqa: E402
from test_trainer import data, expect_error, loss_bits, run, steps  # noqa: E402,F401

REF = os.path.join(ROOT, "build", "ref")


def ref_ckpt(preset):
    ck = os.path.join(REF, f"{preset}.ckpt")
    if not os.path.exists(ck):
        pytest.skip("build/ref not built (make refckpts)")
    return ck


def small(data, out, *extra):
    return ["-train", data / "train.bin", "-steps", 3, "-lr", 1e-3, "-warmup", 1, "-B", 2, "-seq", 32,
            "-eval_every", 0, "-out", out, "-quiet", "-threads", 1] + list(extra)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-nanochat"])
def test_init_takes_the_model_from_the_checkpoint(data, tmp_path, preset):
    ck = ref_ckpt(preset)
    run(small(data, tmp_path / "a", "-init", ck))                                   # no -preset, no -vocab
    run(small(data, tmp_path / "b", "-init", ck, "-preset", preset, "-vocab", 256))  # the old way
    assert loss_bits(tmp_path / "a") == loss_bits(tmp_path / "b")
    assert open(tmp_path / "a" / "step_000003.ckpt", "rb").read() == open(tmp_path / "b" / "step_000003.ckpt", "rb").read()
    # and -resume of it needs no model flag either
    run(small(data, tmp_path / "a", "-resume", tmp_path / "a" / "step_000003.ckpt", "-steps", 3))


@pytest.mark.parametrize("extra,needles", [
    (["-preset", "tiny-qwen3", "-vocab", 256], ["head_dim 32 in the checkpoint, 64 in -preset tiny-qwen3"]),
    (["-preset", "tiny-llama"], ["vocab_size 256 in the checkpoint, 8192 in -preset tiny-llama"]),
    (["-vocab", 512], ["checkpoint has vocab 256", "-vocab 512"]),
    (["-n_layer", 5], ["checkpoint has n_layer 4", "-n_layer 5"]),
])
def test_flag_contradicting_the_checkpoint_is_one_line(data, tmp_path, extra, needles):
    ck = ref_ckpt("tiny-llama")
    expect_error(run(small(data, tmp_path / "o", "-init", ck, *extra), check=False), ck, *needles)


def test_resume_keeps_the_depth_and_seq(data, tmp_path):
    ck = ref_ckpt("tiny-llama")
    run(small(data, tmp_path / "a", "-init", ck, "-n_layer", 2))
    c = tmp_path / "a" / "step_000003.ckpt"
    expect_error(run(small(data, tmp_path / "b", "-resume", c, "-n_layer", 1), check=False), c, "n_layer 2", "-n_layer 1")
    expect_error(run(small(data, tmp_path / "b", "-resume", c, "-seq", 16), check=False), c, "-seq", "32", "16")


def test_n_layer_init_is_the_checkpoints_first_layers(data, tmp_path):
    """-init CKPT -n_layer 2 trains bit for bit like -init of the checkpoint cut to 2 layers in Python
    (embedding, layers 0 and 1, final norm, head)."""
    for preset in ("tiny-qwen3", "tiny-nanochat"):  # tied with QK norm; untied with embedding norm
        ck = ref_ckpt(preset)
        name, cfg, _h, params, _m, _v = tsdc_io.read_checkpoint(ck)
        cut = dict(cfg, n_layer=2)
        keep = {k: params[k] for k, _ in tsdc_io.param_layout(cut)}
        assert all(not k.startswith(("layers.2.", "layers.3.")) for k in keep)
        cut_path = tmp_path / f"{preset}-2.ckpt"
        tsdc_io.write_checkpoint(cut_path, name, cut, keep)
        p = run(small(data, tmp_path / f"{preset}-a", "-init", ck, "-n_layer", 2))
        assert "its first 2 of 4 layers" in p.stdout
        run(small(data, tmp_path / f"{preset}-b", "-init", cut_path))
        a, b = loss_bits(tmp_path / f"{preset}-a"), loss_bits(tmp_path / f"{preset}-b")
        assert len(a) == 3 and a == b
        _, cfg_a, _h, pa, _m, _v = tsdc_io.read_checkpoint(tmp_path / f"{preset}-a" / "step_000003.ckpt")
        assert cfg_a["n_layer"] == 2


def test_n_layer_from_a_preset(data, tmp_path):
    p = run(small(data, tmp_path / "o", "-preset", "tiny-llama", "-vocab", 256, "-n_layer", 1, "-steps", 1))
    full = sum(int(np.prod(s)) for _, s in tsdc_io.param_layout(dict(tsdc_io.read_checkpoint(ref_ckpt("tiny-llama"))[1], n_layer=1)))
    assert f"| {full} parameters |" in p.stdout
    expect_error(run(small(data, tmp_path / "o", "-preset", "tiny-llama", "-vocab", 256, "-n_layer", 5), check=False),
                 "-n_layer 5", "tiny-llama has 4 layers")
