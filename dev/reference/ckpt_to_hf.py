#!/usr/bin/env python3
"""Export a train_sdc checkpoint to a Hugging Face model directory (config.json + model.safetensors,
fp32), the reverse of hf_to_ckpt.py. numpy only.

    python dev/reference/ckpt_to_hf.py model.ckpt OUT_DIR [--dtype bf16]
    python dev/reference/ckpt_to_hf.py model.ckpt OUT_DIR --nanochat   # nanochat keys + meta.json

Architectures: Llama-style checkpoints (SwiGLU, weighted RMSNorm, no QK norm) -> LlamaForCausalLM;
with weighted QK norm before RoPE -> Qwen3ForCausalLM; nanochat-style (ReLU^2, parameter-free norms,
QK norm after RoPE, embedding norm) -> NanoChatForCausalLM (transformers >= 5), or with --nanochat a
nanochat state dict (transformer.wte.weight, ...) plus a nanochat meta.json. The config.json carries
both the transformers 4.x fields (rope_theta, rope_scaling, torch_dtype) and the 5.x fields
(rope_parameters, dtype), so either version loads it. Optimizer state in the checkpoint is ignored."""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import tsdc_io  # noqa: E402
from hf_to_ckpt import hf_key_map, nanochat_key_map, FP32_EPS  # noqa: E402
from safetensors_np import write_safetensors  # noqa: E402


class ExportError(Exception):
    pass


def ckpt_kind(cfg):
    c = cfg
    if c["mlp"] == 0 and c["norm_weighted"] == 1 and c["rope_style"] == 0 and c["embed_norm"] == 0 \
            and c["softcap"] == 0 and c["qk_norm"] in (0, 1):
        return "qwen3" if c["qk_norm"] == 1 else "llama"
    if c["mlp"] == 1 and c["norm_weighted"] == 0 and c["qk_norm"] == 2 and c["rope_style"] == 1 \
            and c["embed_norm"] == 1 and c["rope_llama3"] == 0:
        return "nanochat"
    raise ExportError("this combination of model options has no Hugging Face architecture "
                      f"(mlp={c['mlp']} norm_weighted={c['norm_weighted']} qk_norm={c['qk_norm']} "
                      f"rope_style={c['rope_style']} embed_norm={c['embed_norm']} softcap={c['softcap']})")


def hf_config(cfg, kind, dtype):
    arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "nanochat": "NanoChatForCausalLM"}[kind]
    rope = {"rope_theta": cfg["rope_theta"], "rope_type": "default"}
    scaling = None
    if cfg["rope_llama3"]:
        scaling = {"rope_type": "llama3", "factor": cfg["rope_factor"], "low_freq_factor": cfg["rope_low"],
                   "high_freq_factor": cfg["rope_high"],
                   "original_max_position_embeddings": int(cfg["rope_orig"])}
        rope = {"rope_theta": cfg["rope_theta"], **scaling}
    torch_dtype = {"F32": "float32", "BF16": "bfloat16"}[dtype]
    hf = {
        "architectures": [arch],
        "model_type": kind,
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["d_model"],
        "intermediate_size": cfg["ffn_dim"],
        "num_hidden_layers": cfg["n_layer"],
        "num_attention_heads": cfg["n_head"],
        "num_key_value_heads": cfg["n_kv_head"],
        "head_dim": cfg["head_dim"],
        "hidden_act": "relu2" if kind == "nanochat" else "silu",
        "max_position_embeddings": cfg["seq_len"],
        "rms_norm_eps": cfg["norm_eps"],
        "tie_word_embeddings": bool(cfg["tied"]),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": cfg["rope_theta"],
        "rope_scaling": scaling,
        "rope_parameters": rope,
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
        "use_cache": True,
    }
    if kind == "llama":
        hf["mlp_bias"] = False
    if kind == "qwen3":
        hf["use_sliding_window"] = False
        hf["sliding_window"] = None
        hf["layer_types"] = ["full_attention"] * cfg["n_layer"]
    if kind == "nanochat":
        hf["final_logit_softcapping"] = cfg["softcap"] or None
    return hf


def export(ckpt, out_dir, dtype="F32", nanochat=False):
    preset, cfg, _hdr, params, _m, _v = tsdc_io.read_checkpoint(ckpt)
    kind = ckpt_kind(cfg)
    if nanochat and kind != "nanochat":
        raise ExportError(f"--nanochat: {ckpt} is a {kind} model, not nanochat-style")
    if nanochat and (cfg["tied"] or cfg["norm_eps"] != FP32_EPS or cfg["rope_theta"] != 10000.0
                     or cfg["softcap"] != 15.0):
        raise ExportError(f"--nanochat: {ckpt} differs from nanochat's fixed settings (untied, "
                          "eps = fp32 machine eps, theta 10000, softcap 15); export without --nanochat")
    keymap = nanochat_key_map(cfg) if nanochat else hf_key_map(cfg, kind)
    tensors = {hk: params[t] for hk, t in keymap.items()}
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype=dtype)
    if nanochat:
        meta = {"model_config": {"sequence_len": cfg["seq_len"], "vocab_size": cfg["vocab_size"],
                                 "n_layer": cfg["n_layer"], "n_head": cfg["n_head"],
                                 "n_kv_head": cfg["n_kv_head"], "n_embd": cfg["d_model"]},
                "head_dim": cfg["head_dim"], "ffn_dim": cfg["ffn_dim"], "source": preset}
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
    else:
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(hf_config(cfg, kind, dtype), f, indent=2)
            f.write("\n")
    return preset, cfg, kind, sum(a.size for a in tensors.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="storage dtype of model.safetensors (bf16 rounds to nearest even)")
    ap.add_argument("--nanochat", action="store_true", help="write a nanochat state dict + meta.json")
    a = ap.parse_args(argv)
    try:
        preset, cfg, kind, n = export(a.ckpt, a.out_dir, dtype={"fp32": "F32", "bf16": "BF16"}[a.dtype],
                                      nanochat=a.nanochat)
    except (ExportError, ValueError) as e:
        print(f"ckpt_to_hf: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"ckpt_to_hf: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"{a.ckpt}: preset {preset!r} -> {kind}, {n:,} parameters, wrote {a.out_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
