"""The checkpoint carries the model: with -init or -resume the model config is the
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
    """-init without -preset and -vocab trains bit for bit like with them; -resume needs no model flag either.
    Catches: a model built from default flags instead of the checkpoint's config."""
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
    """Catches: a contradicting flag that silently overrides, or is silently overridden by, the checkpoint."""
    ck = ref_ckpt("tiny-llama")
    expect_error(run(small(data, tmp_path / "o", "-init", ck, *extra), check=False), ck, *needles)


def test_resume_keeps_the_depth_and_seq(data, tmp_path):
    """Catches: a resume that accepts another depth or sequence length than the checkpoint was trained with."""
    ck = ref_ckpt("tiny-llama")
    run(small(data, tmp_path / "a", "-init", ck, "-n_layer", 2))
    c = tmp_path / "a" / "step_000003.ckpt"
    expect_error(run(small(data, tmp_path / "b", "-resume", c, "-n_layer", 1), check=False), c, "n_layer 2", "-n_layer 1")
    expect_error(run(small(data, tmp_path / "b", "-resume", c, "-seq", 16), check=False), c, "-seq", "32", "16")


def test_n_layer_init_is_the_checkpoints_first_layers(data, tmp_path):
    """-init CKPT -n_layer 2 trains bit for bit like -init of the checkpoint cut to 2 layers in Python
    (embedding, layers 0 and 1, final norm, head).
    Catches: -n_layer keeping other layers than the first N, or losing the final norm or head."""
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
    """-n_layer 1 of tiny-llama has the parameter count of the 1-layer layout; more layers than the preset has is an
    error. Catches: -n_layer ignored for a preset, or allowed past its depth."""
    p = run(small(data, tmp_path / "o", "-preset", "tiny-llama", "-vocab", 256, "-n_layer", 1, "-steps", 1))
    full = sum(int(np.prod(s)) for _, s in tsdc_io.param_layout(dict(tsdc_io.read_checkpoint(ref_ckpt("tiny-llama"))[1], n_layer=1)))
    assert f"| {full} parameters |" in p.stdout
    expect_error(run(small(data, tmp_path / "o", "-preset", "tiny-llama", "-vocab", 256, "-n_layer", 5), check=False),
                 "-n_layer 5", "tiny-llama has 4 layers")


# ------------------------------------------------------------- any model of the family, from its config.json
sys.path.insert(0, os.path.join(ROOT, "dev", "reference"))
import family_models as fm  # noqa: E402

FAMILY_STATES = os.path.join(ROOT, "dev", "reference", "states", "family")
PY = sys.executable
REF_PY = os.environ.get("TSDC_REF_PYTHON", os.path.join(ROOT, ".venv-ref", "bin", "python"))


def tool(*args):
    p = __import__("subprocess").run([PY] + [str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


@pytest.fixture(scope="module", params=list(fm.MODELS))
def family_run(request, tmp_path_factory):
    """a non-preset HF model (family_models.py) imported without --preset, trained 3 of 4 AdamW steps by
    ./train_sdc without any model flag, and exported back with ckpt_to_hf.py"""
    name = request.param
    d = tmp_path_factory.mktemp(name)
    fm.write_hf_dir(name, d / "hf")
    p = tool(os.path.join(ROOT, "dev", "reference", "hf_to_ckpt.py"), d / "hf", d / "in.ckpt")
    tsdc_io.write_shard(d / "train.bin", fm.tokens(name), fm.MODELS[name]["vocab_size"])
    tr = fm.TRAIN
    run(["-init", d / "in.ckpt", "-train", d / "train.bin", "-B", fm.B, "-seq", fm.T, "-steps", fm.STEPS, "-stop_at", 3,
         "-lr", tr["lr"], "-warmup", tr["warmup"], "-final_lr_frac", tr["final_frac"], "-beta1", tr["beta1"],
         "-beta2", tr["beta2"], "-adam_eps", tr["adam_eps"], "-wd", tr["weight_decay"], "-clip", tr["grad_clip"],
         "-eval_every", 0, "-out", d / "run", "-quiet"])
    tool(os.path.join(ROOT, "dev", "reference", "ckpt_to_hf.py"), d / "run" / "step_000003.ckpt", d / "export")
    ref = np.load(os.path.join(FAMILY_STATES, f"{name}.npz"))
    return name, d, ref


def test_family_model_trains_like_transformers(family_run):
    """./train_sdc's losses of 3 AdamW steps equal transformers + torch AdamW's (committed) to 1e-5 relative.
    Catches: a config.json field misimported (the geometry check) or a family variant trained unlike
    transformers."""
    name, d, ref = family_run
    got = [steps(d / "run")[s]["loss"] for s in (1, 2, 3)]
    rel = [abs(g - float(r)) / abs(float(r)) for g, r in zip(got, ref["losses"][:3])]
    print(f"{name}: losses {got} vs torch {ref['losses'][:3].tolist()}; largest relative difference {max(rel):.2e}")
    assert max(rel) <= 1e-5
    _, cfg, _h, _p, _m, _v = tsdc_io.read_checkpoint(d / "in.ckpt")
    hf = fm.MODELS[name]
    assert (cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"], cfg["ffn_dim"], cfg["tied"]) == \
        (hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"],
         hf["intermediate_size"], int(hf["tie_word_embeddings"]))


def test_family_model_exports_back(family_run):
    """the trained checkpoint exported with ckpt_to_hf.py: the same config.json geometry, every tensor equal to the
    checkpoint's bit for bit, and its logits (numpy forward, float64) equal to transformers' logits of the model torch
    trained, and the loss of the 4th batch to torch's.
    Catches: ckpt_to_hf.py writing a wrong key, a transposed tensor or a wrong config field."""
    import hf_to_ckpt
    import json
    import numpy_forward
    from safetensors_np import read_safetensors
    name, d, ref = family_run
    hf, out = fm.MODELS[name], json.load(open(d / "export" / "config.json"))
    for k in ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "tie_word_embeddings", "rms_norm_eps"):
        assert out[k] == hf[k], k
    _, cfg, _h, params, _m, _v = tsdc_io.read_checkpoint(d / "run" / "step_000003.ckpt")
    tensors = read_safetensors(str(d / "export" / "model.safetensors"))
    keymap = hf_to_ckpt.hf_key_map(cfg, "qwen3" if cfg["qk_norm"] == 1 else "llama")
    assert sorted(tensors) == sorted(keymap)
    for hk, t in keymap.items():
        assert np.array_equal(tensors[hk], params[t]), hk
    cfg2, params2, _, _ = hf_to_ckpt.convert(str(d / "export"))
    tok = fm.tokens(name)
    z = numpy_forward.forward(cfg2, params2, tok[None, :fm.T])[0]
    err = float(np.max(np.abs(z - ref["logits"])))
    s = fm.STEPS - 1
    rows = np.stack([tok[(s * fm.B + j) * fm.T:(s * fm.B + j) * fm.T + fm.T + 1] for j in range(fm.B)])
    loss = numpy_forward.cross_entropy(numpy_forward.forward(cfg2, params2, rows[:, :-1]), rows[:, 1:])
    print(f"{name}: exported logits vs transformers' after 3 torch AdamW steps: max abs {err:.2e} (scale "
          f"{np.max(np.abs(ref['logits'])):.2f}); 4th loss {loss:.7f} vs {float(ref['losses'][3]):.7f}")
    # two trainings (C and torch) agree to rounding, which AdamW's first steps amplify where a gradient is
    # near 0 (lr * sign(g)): hence a tolerance relative to the logits' scale (measured: 6e-6 and 5e-5)
    assert err <= 1e-4 * np.max(np.abs(ref["logits"]))
    assert abs(loss - float(ref["losses"][3])) <= 1e-5 * abs(float(ref["losses"][3]))


@pytest.mark.skipif(not os.path.exists(REF_PY), reason="no .venv-ref with torch + transformers (TSDC_REF_PYTHON): "
                    "the committed logits are compared instead (test_family_model_exports_back)")
def test_family_model_export_loads_in_transformers(family_run):
    """where torch + transformers are installed (.venv-ref, as the bench scripts make it): transformers loads the
    exported directory and its logits equal those of the trained checkpoint (numpy forward, float64).
    Catches: an export that transformers reads as another model (its logits differ from the checkpoint's)."""
    import numpy_forward
    name, d, ref = family_run
    code = ("import sys, numpy as np, torch\nfrom transformers import AutoModelForCausalLM\n"
            "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation='eager', dtype=torch.float32)\n"
            "tok = torch.from_numpy(np.load(sys.argv[2]))\n"
            "with torch.no_grad(): z = m(input_ids=tok[None]).logits[0].numpy()\n"
            "np.save(sys.argv[3], z)\n")
    np.save(d / "tok.npy", fm.tokens(name)[:fm.T])
    p = __import__("subprocess").run([REF_PY, "-c", code, str(d / "export"), str(d / "tok.npy"), str(d / "z.npy")],
                                     capture_output=True, text=True, timeout=600)
    if p.returncode != 0 and "No module named" in p.stderr:
        pytest.skip(f"{REF_PY}: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stderr[-2000:]
    z = np.load(d / "z.npy")
    _, cfg, _h, params, _m, _v = tsdc_io.read_checkpoint(d / "run" / "step_000003.ckpt")
    want = numpy_forward.forward(cfg, params, fm.tokens(name)[None, :fm.T])[0]
    err = float(np.max(np.abs(z - want)))
    print(f"{name}: transformers' logits of the exported model vs the checkpoint's: max abs {err:.2e}")
    assert err <= 1e-4


@pytest.mark.parametrize("change,needle", [
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "MistralForCausalLM"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
])
def test_importer_names_what_it_cannot_represent(tmp_path, change, needle):
    """hf_to_ckpt.py refuses a config it cannot represent (biases, gelu, yarn, another architecture, a KV head
    count that does not divide the heads) with one line naming the field. Catches: an import that silently drops a
    feature and trains another model."""
    import json
    src = os.path.join(ROOT, "dev", "reference", "states", "tiny-llama")
    d = tmp_path / "m"
    d.mkdir()
    hf = json.load(open(os.path.join(src, "config.json")))
    hf.update(change)
    json.dump(hf, open(d / "config.json", "w"))
    os.symlink(os.path.join(src, "model.safetensors"), d / "model.safetensors")
    p = __import__("subprocess").run([PY, os.path.join(ROOT, "dev", "reference", "hf_to_ckpt.py"), str(d), str(tmp_path / "o.ckpt")],
                                     capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and needle in p.stderr, p.stderr
