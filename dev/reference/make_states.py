#!/usr/bin/env python3
"""Build the debug reference states of the three tiny presets (docs/formats.md, "Debug reference
state") with PyTorch, in fp32 on the CPU, deterministically:

    python dev/reference/make_states.py [--out DIR]      (default DIR: dev/reference/states)

writes, for each preset P of tiny-llama, tiny-qwen3, tiny-nanochat:
    DIR/P/           the model's initial weights as the model's own format saves them, bf16:
                     HF save_pretrained (config.json + model.safetensors) for tiny-llama
                     (LlamaForCausalLM) and tiny-qwen3 (Qwen3ForCausalLM); for tiny-nanochat a
                     model.safetensors with nanochat's state-dict keys + a nanochat meta.json
    DIR/P.state      tokens, logits, loss, every parameter gradient (checkpoint order), and the
                     loss before each of 10 AdamW steps on the same batch

The models: HF transformers' own LlamaForCausalLM / Qwen3ForCausalLM (attn_implementation="eager")
and nanochat_model.GPT (a re-implementation of nanochat's gpt.py). Vocabulary 256, sequence 32,
batch 2. Weights: seed 8, drawn in checkpoint parameter order (tsdc_io.param_layout): matrices and
embeddings normal(0, 0.02), norm weights 1 + 0.1 * normal, then all rounded to bf16 (round to
nearest even), so the bf16 files hold them exactly. Tokens: torch.randint(0, 256, (2, 33)) from a
generator seeded 1008. One CPU thread and torch.use_deterministic_algorithms(True)."""
import argparse
import copy
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import tsdc_io  # noqa: E402
from check_state import write_state, verify  # noqa: E402
from hf_to_ckpt import hf_key_map, nanochat_key_map, FP32_EPS  # noqa: E402
from nanochat_model import GPT, GPTConfig  # noqa: E402
from safetensors_np import write_safetensors  # noqa: E402

WEIGHT_SEED = 8
TOKEN_SEED = 1008
B, T, V = 2, 32, 256
TRAIN = dict(max_lr=1e-3, warmup=3, n_steps=10, final_frac=0.1, beta1=0.9, beta2=0.95,
             adam_eps=1e-8, weight_decay=0.1, grad_clip=1.0)


def _cfg(**kw):
    c = {k: 0 for k in tsdc_io.CONFIG_FIELDS_I}
    c.update({k: 0.0 for k in tsdc_io.CONFIG_FIELDS_D})
    c.update(kw)
    return c


# train_sdc configs of the tiny presets, vocabulary and sequence length overridden to 256 and 32
PRESETS = {
    "tiny-llama": _cfg(n_layer=4, d_model=128, n_head=4, n_kv_head=2, head_dim=32, ffn_dim=384,
                       vocab_size=V, seq_len=T, mlp=0, norm_weighted=1, qk_norm=0, rope_style=0,
                       rope_llama3=1, tied=1, embed_norm=0, rope_theta=500000.0, norm_eps=1e-5,
                       softcap=0.0, rope_factor=32.0, rope_low=1.0, rope_high=4.0, rope_orig=8192.0),
    "tiny-qwen3": _cfg(n_layer=4, d_model=128, n_head=4, n_kv_head=2, head_dim=64, ffn_dim=384,
                       vocab_size=V, seq_len=T, mlp=0, norm_weighted=1, qk_norm=1, rope_style=0,
                       rope_llama3=0, tied=1, embed_norm=0, rope_theta=1e6, norm_eps=1e-6, softcap=0.0),
    "tiny-nanochat": _cfg(n_layer=4, d_model=128, n_head=2, n_kv_head=2, head_dim=64, ffn_dim=512,
                          vocab_size=V, seq_len=T, mlp=1, norm_weighted=0, qk_norm=2, rope_style=1,
                          rope_llama3=0, tied=0, embed_norm=1, rope_theta=10000.0, norm_eps=FP32_EPS,
                          softcap=15.0),
}
KIND = {"tiny-llama": "llama", "tiny-qwen3": "qwen3", "tiny-nanochat": "nanochat"}


def setup_determinism():
    torch.manual_seed(WEIGHT_SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def make_weights(cfg):
    """{tsdc name: fp32 tensor}, bf16-exact, drawn in checkpoint order from a generator seeded 8."""
    g = torch.Generator().manual_seed(WEIGHT_SEED)
    out = {}
    for name, shape in tsdc_io.param_layout(cfg):
        z = torch.randn(shape, generator=g, dtype=torch.float32)
        w = 1.0 + 0.1 * z if len(shape) == 1 else 0.02 * z  # 1-D tensors are exactly the norm weights
        out[name] = w.to(torch.bfloat16).to(torch.float32)  # round to nearest even
    return out


def make_tokens():
    g = torch.Generator().manual_seed(TOKEN_SEED)
    return torch.randint(0, V, (B, T + 1), generator=g, dtype=torch.int64)


def hf_config(cfg, kind):
    """The transformers config object of a tiny HF preset."""
    from transformers import LlamaConfig, Qwen3Config
    common = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["ffn_dim"],
                  num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
                  num_key_value_heads=cfg["n_kv_head"], head_dim=cfg["head_dim"], hidden_act="silu",
                  max_position_embeddings=cfg["seq_len"], rms_norm_eps=cfg["norm_eps"],
                  tie_word_embeddings=bool(cfg["tied"]), attention_bias=False, attention_dropout=0.0,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=False)
    if kind == "llama":
        # transformers >= 5 takes RoPE settings as `rope_parameters` (theta included); the 4.x
        # `rope_theta` + `rope_scaling` kwargs are converted by standardize_rope_params().
        rope = {"rope_type": "llama3", "rope_theta": cfg["rope_theta"], "factor": cfg["rope_factor"],
                "low_freq_factor": cfg["rope_low"], "high_freq_factor": cfg["rope_high"],
                "original_max_position_embeddings": int(cfg["rope_orig"])}
        return LlamaConfig(**common, mlp_bias=False, rope_parameters=rope, attn_implementation="eager")
    rope = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    return Qwen3Config(**common, rope_parameters=rope, use_sliding_window=False, sliding_window=None,
                       max_window_layers=cfg["n_layer"], attn_implementation="eager")


def build_model(preset):
    """(model, {tsdc name: model parameter}) with the preset's weights loaded, fp32, CPU."""
    cfg, kind = PRESETS[preset], KIND[preset]
    weights = make_weights(cfg)
    if kind == "nanochat":
        model = GPT(GPTConfig(sequence_len=cfg["seq_len"], vocab_size=cfg["vocab_size"],
                              n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_kv_head=cfg["n_kv_head"],
                              n_embd=cfg["d_model"], head_dim=cfg["head_dim"], ffn_dim=cfg["ffn_dim"],
                              rope_theta=cfg["rope_theta"], softcap=cfg["softcap"]))
        keymap = nanochat_key_map(cfg)
    else:
        from transformers import LlamaForCausalLM, Qwen3ForCausalLM
        hfc = hf_config(cfg, kind)
        model = (LlamaForCausalLM if kind == "llama" else Qwen3ForCausalLM)(hfc)
        keymap = hf_key_map(cfg, kind)
    model = model.to(torch.float32)
    named = dict(model.named_parameters())  # tied parameters appear once
    if set(named) != set(keymap):
        raise SystemExit(f"{preset}: model parameters {sorted(set(named) ^ set(keymap))} do not match the "
                         "checkpoint layout")
    byname = {}
    with torch.no_grad():
        for hk, t in keymap.items():
            named[hk].copy_(weights[t])
            byname[t] = named[hk]
    if cfg["tied"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "lm_head not tied"
    model.train()
    return model, byname


def logits_of(model, kind, inputs):
    if kind == "nanochat":
        return model(inputs)
    return model(input_ids=inputs, use_cache=False).logits


def check_rope(model, cfg, kind):
    """The model's inv_freq against a float64 hand computation of HF's formula (docs/design.md)."""
    sys.path.insert(0, HERE)
    from numpy_forward import rope_inv_freq
    ref = rope_inv_freq(cfg)
    if kind == "nanochat":
        got = (1.0 / (cfg["rope_theta"] ** (torch.arange(0, cfg["head_dim"], 2, dtype=torch.float32)
                                            / cfg["head_dim"]))).numpy()
    else:
        got = model.model.rotary_emb.inv_freq.detach().double().numpy()
    rel = float(np.max(np.abs(got - ref) / ref))
    if rel > 1e-6:
        raise SystemExit(f"inv_freq differs from HF's formula: max rel err {rel:.2e}")
    return rel


def save_model(model, kind, cfg, byname, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    if kind == "nanochat":
        keymap = nanochat_key_map(cfg)
        write_safetensors(os.path.join(out_dir, "model.safetensors"),
                          {hk: byname[t].detach().numpy() for hk, t in keymap.items()}, dtype="BF16")
        meta = {"model_config": {"sequence_len": cfg["seq_len"], "vocab_size": cfg["vocab_size"],
                                 "n_layer": cfg["n_layer"], "n_head": cfg["n_head"],
                                 "n_kv_head": cfg["n_kv_head"], "n_embd": cfg["d_model"]},
                "head_dim": cfg["head_dim"], "ffn_dim": cfg["ffn_dim"],
                "note": "nanochat state dict (bf16) of tiny-nanochat; head_dim and ffn_dim are extensions "
                        "(nanochat: n_embd // n_head and 4 * n_embd)"}
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
    else:
        m = copy.deepcopy(model).to(torch.bfloat16)  # lossless: the weights are bf16-exact
        m.save_pretrained(out_dir)  # transformers >= 5 always writes safetensors
        gen = os.path.join(out_dir, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)  # nothing to generate with (no tokenizer); keep the directory minimal
        os.chmod(os.path.join(out_dir, "model.safetensors"), 0o644)  # HF writes it 0600


def make_state(preset, out):
    cfg, kind = PRESETS[preset], KIND[preset]
    setup_determinism()
    model, byname = build_model(preset)
    rope_err = check_rope(model, cfg, kind)
    save_model(model, kind, cfg, byname, os.path.join(out, preset))

    tokens = make_tokens()
    inputs, targets = tokens[:, :T], tokens[:, 1:]
    order = [t for t, _ in tsdc_io.param_layout(cfg)]
    params = [byname[t] for t in order]
    decay = [byname[t] for t in order if byname[t].dim() >= 2]      # matrices and embeddings
    no_decay = [byname[t] for t in order if byname[t].dim() < 2]    # norm weights
    tr = TRAIN
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tr["max_lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["adam_eps"],
                            foreach=False, fused=False)
    losses = []
    for step in range(tr["n_steps"]):
        opt.zero_grad(set_to_none=True)
        logits = logits_of(model, kind, inputs)
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            logits0 = logits.detach().numpy().copy()
            loss0 = loss.item()
            grads0 = np.concatenate([p.grad.detach().numpy().reshape(-1) for p in params]).copy()
        torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"], foreach=False)
        lr = tsdc_io.lr_at(step, tr["max_lr"], tr["warmup"], tr["n_steps"], tr["final_frac"])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()

    path = os.path.join(out, preset + ".state")
    write_state(path, tokens.numpy(), logits0, loss0, grads0, losses, tr["warmup"],
                {k: tr[k] for k in ("max_lr", "final_frac", "beta1", "beta2", "adam_eps",
                                    "weight_decay", "grad_clip")})
    verify(path, cfg)
    return path, rope_err, losses


def main(argv=None):
    ap = argparse.ArgumentParser(description="build dev/reference/states")
    ap.add_argument("--out", default=os.path.join(HERE, "states"))
    ap.add_argument("--preset", action="append", choices=list(PRESETS), help="only these presets")
    a = ap.parse_args(argv)
    import transformers
    transformers.logging.set_verbosity_error()  # the llama3 "original_max_position_embeddings must be
    transformers.logging.disable_progress_bar()  # less than max_position_embeddings" warning is benign
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    os.makedirs(a.out, exist_ok=True)
    for preset in a.preset or list(PRESETS):
        path, rope_err, losses = make_state(preset, a.out)
        n = sum(int(np.prod(s)) for _, s in tsdc_io.param_layout(PRESETS[preset]))
        print(f"{preset}: {n:,} params, inv_freq rel err vs formula {rope_err:.1e}, "
              f"loss {losses[0]:.6f} -> {losses[-1]:.6f}")
        files = [path] + sorted(os.path.join(a.out, preset, f) for f in os.listdir(os.path.join(a.out, preset)))
        for f in files:
            print(f"  {os.path.relpath(f, a.out):40s} {os.path.getsize(f):>10,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
