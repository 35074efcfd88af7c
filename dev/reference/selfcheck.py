#!/usr/bin/env python3
"""Self-checks of the reference states and the weight converters (needs torch + transformers):

    python dev/reference/selfcheck.py [--skip-determinism]

(a) hf_to_ckpt on each states/<preset>/ gives a checkpoint whose weights equal the model's exactly
    (the generated weights, transformers' own from_pretrained, the safetensors package's reader);
(b) numpy_forward.py on that checkpoint reproduces the stored logits and loss;
(c) make_states.py run twice (into temporary directories) gives byte-identical files, equal to the
    committed ones;
(d) round trips: ckpt -> ckpt_to_hf -> hf_to_ckpt is byte-identical, and transformers' forward of
    the exported directory (LlamaForCausalLM, Qwen3ForCausalLM, NanoChatForCausalLM) reproduces the
    stored logits -- for tiny-nanochat this checks nanochat_model.py against HF's NanoChat;
(e) converter errors: unknown / missing tensor, shape mismatch, bad dtype, unsupported config;
(f) the parameter counts of the presets (docs/flags.md) from tsdc_io.param_layout;
(g) the stored gradients against central finite differences of the float64 numpy loss;
(h) nanochat_model.py: written-out attention vs F.scaled_dot_product_attention;
(i) sharded safetensors and pytorch_model.bin inputs of hf_to_ckpt.py."""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import tsdc_io  # noqa: E402
import hf_to_ckpt  # noqa: E402
import ckpt_to_hf  # noqa: E402
from check_state import read_state  # noqa: E402
from numpy_forward import forward, cross_entropy  # noqa: E402
from safetensors_np import read_safetensors, write_safetensors  # noqa: E402

STATES = os.path.join(HERE, "states")
PRESET_NAMES = ["tiny-llama", "tiny-qwen3", "tiny-nanochat"]
failures = []


def check(ok, msg):
    print(("  ok   " if ok else "  FAIL ") + msg)
    if not ok:
        failures.append(msg)


def run_cli(script, *args):
    r = subprocess.run([sys.executable, os.path.join(HERE, script), *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def hf_logits(model_dir, tokens):
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return m(input_ids=torch.from_numpy(tokens), use_cache=False).logits.numpy(), m


def part_a_b_d(tmp):
    import torch
    from make_states import PRESETS, make_weights
    torch.set_num_threads(1)
    maxerr = {}
    for preset in PRESET_NAMES:
        print(f"[{preset}]")
        src = os.path.join(STATES, preset)
        ckpt = os.path.join(tmp, preset + ".ckpt")
        rc, out, err = run_cli("hf_to_ckpt.py", src, ckpt, "--preset", preset)
        check(rc == 0, f"hf_to_ckpt {preset} (rc {rc}) {err.strip()}")
        name, cfg, hdr, params, m, v = tsdc_io.read_checkpoint(ckpt)
        check(name == preset and hdr["step"] == 0 and m is None, "preset name, step 0, no optimizer state")
        check(cfg == PRESETS[preset], f"config equals the preset's: {cfg == PRESETS[preset]}")
        # (a) weights equal exactly
        want = {k: t.numpy() for k, t in make_weights(PRESETS[preset]).items()}
        check(all(np.array_equal(params[k], want[k]) for k in want) and set(params) == set(want),
              "(a) checkpoint weights == generated model weights, bit for bit")
        from safetensors.torch import load_file
        st_lib = {k: t.float().numpy() for k, t in load_file(os.path.join(src, "model.safetensors")).items()}
        mine = read_safetensors(os.path.join(src, "model.safetensors"))
        same_keys = set(st_lib) == set(mine)
        same_vals = same_keys and all(
            np.array_equal(np.asarray(st_lib[k]).astype(np.float32), mine[k]) for k in mine)
        check(same_vals, "(a) safetensors_np reader == safetensors package reader")
        if preset != "tiny-nanochat":
            from transformers import AutoModelForCausalLM
            hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
            sd = {k: t.detach().numpy() for k, t in hf.named_parameters()}
            km = hf_to_ckpt.hf_key_map(cfg, "llama" if preset == "tiny-llama" else "qwen3")
            check(set(sd) == set(km) and all(np.array_equal(sd[h], params[t]) for h, t in km.items()),
                  "(a) checkpoint weights == transformers from_pretrained(states/<preset>) weights")
        # (b) numpy forward vs stored logits / loss
        st = read_state(os.path.join(STATES, preset + ".state"))
        tokens = st["tokens"]
        for dt in (np.float64, np.float32):
            lg = forward(cfg, params, tokens[:, :-1], dtype=dt)
            loss = cross_entropy(lg.astype(np.float64), tokens[:, 1:])
            el = float(np.max(np.abs(lg - st["logits"])))
            eloss = abs(loss - float(st["loss"]))
            maxerr[(preset, np.dtype(dt).name)] = (el, eloss)
            check(el < 1e-5 and eloss < 1e-5,
                  f"(b) numpy forward ({np.dtype(dt).name}): max |dlogits| {el:.2e}, |dloss| {eloss:.2e}")
        # (d) round trip ckpt -> HF dir -> ckpt
        hfdir = os.path.join(tmp, preset + "-hf")
        rc, out, err = run_cli("ckpt_to_hf.py", ckpt, hfdir)
        check(rc == 0, f"ckpt_to_hf {preset} (rc {rc}) {err.strip()}")
        back = os.path.join(tmp, preset + "-back.ckpt")
        rc, out, err = run_cli("hf_to_ckpt.py", hfdir, back, "--preset", preset)
        check(rc == 0 and filecmp.cmp(ckpt, back, shallow=False),
              f"(d) ckpt -> ckpt_to_hf -> hf_to_ckpt byte-identical {err.strip()}")
        lg, model = hf_logits(hfdir, tokens[:, :-1])
        e = float(np.max(np.abs(lg - st["logits"])))
        check(e < 1e-5, f"(d) transformers {type(model).__name__} on the exported dir: "
                        f"max |dlogits| {e:.2e} vs the state")
        if preset == "tiny-nanochat":
            ncdir = os.path.join(tmp, preset + "-nc")
            rc, out, err = run_cli("ckpt_to_hf.py", ckpt, ncdir, "--nanochat")
            back2 = os.path.join(tmp, preset + "-back2.ckpt")
            rc2, out, err2 = run_cli("hf_to_ckpt.py", ncdir, back2, "--preset", preset)
            check(rc == 0 and rc2 == 0 and filecmp.cmp(ckpt, back2, shallow=False),
                  f"(d) --nanochat export and reimport byte-identical {err.strip()} {err2.strip()}")
            # a bare nanochat state dict file (no meta): shapes inferred, --n_head needed (hd 64 != 128)
            rc, out, err = run_cli("hf_to_ckpt.py", os.path.join(src, "model.safetensors"),
                                   os.path.join(tmp, "x.ckpt"), "--n_head", "2", "--seq_len", "32",
                                   "--preset", preset)
            check(rc == 0 and filecmp.cmp(ckpt, os.path.join(tmp, "x.ckpt"), shallow=False),
                  f"(d) bare nanochat .safetensors with --n_head 2 --seq_len 32 {err.strip()}")
        # legacy (transformers 4.x) config fields only
        if preset == "tiny-llama":
            with open(os.path.join(src, "config.json")) as f:
                c = json.load(f)
            rp = c.pop("rope_parameters")
            c["rope_theta"] = rp.pop("rope_theta")
            c["rope_scaling"] = rp
            old = os.path.join(tmp, "old-config.json")
            with open(old, "w") as f:
                json.dump(c, f)
            rc, out, err = run_cli("hf_to_ckpt.py", os.path.join(src, "model.safetensors"),
                                   os.path.join(tmp, "old.ckpt"), "--config", old, "--preset", preset)
            check(rc == 0 and filecmp.cmp(ckpt, os.path.join(tmp, "old.ckpt"), shallow=False),
                  f"4.x-style config (rope_theta + rope_scaling) with a single .safetensors {err.strip()}")
    return maxerr


def part_g(tmp):
    """Central finite differences of the float64 numpy loss vs the stored (fp32 PyTorch) gradient,
    at the largest-|grad| entry and one random entry of every tensor."""
    from check_state import unflatten
    print("[gradients vs finite differences of the numpy forward]")
    worst = {}
    rng = np.random.default_rng(0)
    for preset in PRESET_NAMES:
        ckpt = os.path.join(tmp, preset + ".ckpt")
        _, cfg, _, params, _, _ = tsdc_io.read_checkpoint(ckpt)
        st = read_state(os.path.join(STATES, preset + ".state"))
        grads = unflatten(st["grads"], cfg)
        x, y = st["tokens"][:, :-1], st["tokens"][:, 1:]
        p64 = {k: v.astype(np.float64) for k, v in params.items()}
        h, worst_rel, n = 1e-4, 0.0, 0
        for name, _ in tsdc_io.param_layout(cfg):
            g = grads[name]
            for idx in {int(np.argmax(np.abs(g))), int(rng.integers(g.size))}:
                w = p64[name].reshape(-1)
                w0 = w[idx]
                w[idx] = w0 + h
                lp = cross_entropy(forward(cfg, p64, x), y)
                w[idx] = w0 - h
                lm = cross_entropy(forward(cfg, p64, x), y)
                w[idx] = w0
                fd = (lp - lm) / (2 * h)
                an = float(g.reshape(-1)[idx])
                rel = abs(fd - an) / max(abs(fd), 1e-4)
                worst_rel = max(worst_rel, rel)
                n += 1
        worst[preset] = worst_rel
        check(worst_rel < 2e-3, f"{preset}: {n} entries, max |fd - grad| / max(|fd|, 1e-4) = {worst_rel:.2e}")
    return worst


def part_h():
    """nanochat_model: written-out attention vs F.scaled_dot_product_attention."""
    import torch
    from make_states import build_model, make_tokens, T
    print("[nanochat_model attention vs SDPA]")
    model, _ = build_model("tiny-nanochat")
    x = make_tokens()[:, :T]
    with torch.no_grad():
        a = model(x)
        for blk in model.transformer.h:
            blk.attn.sdpa = True
        b = model(x)
    e = float((a - b).abs().max())
    check(e < 1e-5, f"max |dlogits| {e:.2e}")


def part_i(tmp):
    """Other input forms: a sharded safetensors directory, and pytorch_model.bin (bf16, with the tied
    lm_head.weight present, as a state_dict() of a tied model has it)."""
    import torch
    from transformers import AutoModelForCausalLM
    print("[sharded safetensors, pytorch_model.bin]")
    src = os.path.join(STATES, "tiny-qwen3")
    ref = os.path.join(tmp, "tiny-qwen3.ckpt")
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    sharded = os.path.join(tmp, "sharded")
    m.save_pretrained(sharded, max_shard_size="500KB")
    n = len([f for f in os.listdir(sharded) if f.endswith(".safetensors")])
    rc, out, err = run_cli("hf_to_ckpt.py", sharded, os.path.join(tmp, "s.ckpt"), "--preset", "tiny-qwen3")
    check(rc == 0 and filecmp.cmp(ref, os.path.join(tmp, "s.ckpt"), shallow=False),
          f"{n} shards + model.safetensors.index.json {err.strip()}")
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    shutil.copy(os.path.join(src, "config.json"), bindir)
    torch.save({k: v.to(torch.bfloat16) for k, v in m.state_dict().items()},
               os.path.join(bindir, "pytorch_model.bin"))
    rc, out, err = run_cli("hf_to_ckpt.py", bindir, os.path.join(tmp, "b.ckpt"), "--preset", "tiny-qwen3")
    check(rc == 0 and filecmp.cmp(ref, os.path.join(tmp, "b.ckpt"), shallow=False),
          f"pytorch_model.bin {err.strip()}")


def part_e(tmp):
    print("[converter errors]")
    src = os.path.join(STATES, "tiny-qwen3")
    base = read_safetensors(os.path.join(src, "model.safetensors"))
    cases = {
        "unknown": dict(base, **{"model.layers.0.self_attn.q_proj.bias": np.zeros(256, np.float32)}),
        "missing": {k: v for k, v in base.items() if k != "model.layers.3.mlp.up_proj.weight"},
        "shape": dict(base, **{"model.layers.1.self_attn.k_proj.weight": np.zeros((64, 128), np.float32)}),
    }
    expect = {"unknown": "unknown tensor model.layers.0.self_attn.q_proj.bias",
              "missing": "tensor model.layers.3.mlp.up_proj.weight missing",
              "shape": "tensor model.layers.1.self_attn.k_proj.weight: shape [64, 128], expected [128, 128]"}
    for name, tensors in cases.items():
        d = os.path.join(tmp, "err-" + name)
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(src, "config.json"), d)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        rc, out, err = run_cli("hf_to_ckpt.py", d, os.path.join(tmp, "e.ckpt"))
        check(rc == 1 and expect[name] in err and err.count("\n") == 1 and "model.safetensors" in err,
              f"{name}: rc {rc}: {err.strip()}")
    # an I32 tensor
    d = os.path.join(tmp, "err-dtype")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), d)
    hdr = json.dumps({"model.norm.weight": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 4)
    rc, out, err = run_cli("hf_to_ckpt.py", d, os.path.join(tmp, "e.ckpt"))
    check(rc == 1 and "model.norm.weight: unsupported dtype I32" in err, f"dtype: rc {rc}: {err.strip()}")
    # unsupported config
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    c["architectures"] = ["Qwen2ForCausalLM"]
    d = os.path.join(tmp, "err-arch")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    shutil.copy(os.path.join(src, "model.safetensors"), d)
    rc, out, err = run_cli("hf_to_ckpt.py", d, os.path.join(tmp, "e.ckpt"))
    check(rc == 1 and "unsupported architecture" in err, f"arch: rc {rc}: {err.strip()}")
    # a tied model saved with an explicit, different lm_head
    d = os.path.join(tmp, "err-tied")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), d)
    write_safetensors(os.path.join(d, "model.safetensors"),
                      dict(base, **{"lm_head.weight": base["model.embed_tokens.weight"] * 2}))
    rc, out, err = run_cli("hf_to_ckpt.py", d, os.path.join(tmp, "e.ckpt"))
    check(rc == 1 and "lm_head.weight differs" in err, f"tied lm_head differs: rc {rc}: {err.strip()}")
    write_safetensors(os.path.join(d, "model.safetensors"),
                      dict(base, **{"lm_head.weight": base["model.embed_tokens.weight"]}))
    rc, out, err = run_cli("hf_to_ckpt.py", d, os.path.join(tmp, "e.ckpt"))
    check(rc == 0, f"tied model with an equal lm_head copy is accepted (rc {rc}) {err.strip()}")


def part_c(tmp):
    print("[determinism]")
    outs = []
    for i in (1, 2):
        o = os.path.join(tmp, f"run{i}")
        rc, out, err = run_cli("make_states.py", "--out", o)
        check(rc == 0, f"make_states.py --out run{i} (rc {rc}) {err.strip()[-300:] if rc else ''}")
        outs.append(o)
    for preset in PRESET_NAMES:
        rels = [preset + ".state"] + [os.path.join(preset, f) for f in sorted(os.listdir(os.path.join(STATES, preset)))]
        for r in rels:
            a, b, c = (os.path.join(x, r) for x in (outs[0], outs[1], STATES))
            check(filecmp.cmp(a, b, shallow=False), f"{r}: two runs byte-identical")
            check(filecmp.cmp(a, c, shallow=False), f"{r}: equals the committed file")


def part_f():
    print("[preset parameter counts]")
    def cfg(L, d, H, KV, hd, F, V, qk=0):
        return dict(n_layer=L, d_model=d, n_head=H, n_kv_head=KV, head_dim=hd, ffn_dim=F, vocab_size=V,
                    mlp=0, norm_weighted=1, qk_norm=qk, embed_norm=0, tied=1)
    for name, c, want in [("llama3.2-1b", cfg(16, 2048, 32, 8, 64, 8192, 128256), 1235814400),
                          ("qwen3-0.6b", cfg(28, 1024, 16, 8, 128, 3072, 151936, qk=1), 596049920),
                          ("smollm2-135m", cfg(30, 576, 9, 3, 64, 1536, 49152), 134515008)]:
        n = sum(int(np.prod(s)) for _, s in tsdc_io.param_layout(c))
        check(n == want, f"{name}: {n:,} (expected {want:,})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-determinism", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tsdc_selfcheck_")
    try:
        maxerr = part_a_b_d(tmp)
        part_g(tmp)
        part_h()
        part_i(tmp)
        part_e(tmp)
        part_f()
        if not a.skip_determinism:
            part_c(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("[max errors of the numpy forward vs the states]")
    for (p, dt), (el, eloss) in maxerr.items():
        print(f"  {p:14s} {dt:8s} logits {el:.2e}  loss {eloss:.2e}")
    print("FAILED: %d" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
