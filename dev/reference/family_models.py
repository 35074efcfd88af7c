#!/usr/bin/env python3
"""Two models of the family whose shapes are not presets, as Hugging Face directories,
numpy only, deterministically from a seed, so a test can rebuild them without torch:

  smollm2-360m-2l  SmolLM2-360M's config.json (LlamaForCausalLM: d 960, 15 heads, 5 kv heads, head_dim
                   64, ffn 2560, tied, theta 100000, eps 1e-5, max_position_embeddings 8192) with 2 of its
                   32 layers and vocabulary 256;
  qwen3-1.7b-1l    Qwen3-1.7B's (Qwen3ForCausalLM: d 2048, 16 heads, 8 kv heads, head_dim 128, ffn 6144,
                   QK norm, theta 1e6, eps 1e-6, max_position_embeddings 40960), untied, with 1 of its 28
                   layers and vocabulary 256.

    python dev/reference/family_models.py NAME OUT_DIR        # writes OUT_DIR/config.json + model.safetensors

Weights: numpy PCG64 seeded SEED, drawn in HF tensor order (sorted names): matrices and embeddings
0.02 * normal, norm weights 1 + 0.1 * normal, float32. Tokens: `tokens(name)` (uniform over the
vocabulary, seeded). dev/reference/make_family_states.py trains them with transformers + torch AdamW and
writes the reference facts (states/family/NAME.npz) that tests/test_model.py compares ./train_sdc with."""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from safetensors_np import write_safetensors  # noqa: E402

SEED = 15
B, T, STEPS = 2, 32, 4  # batch, sequence, schedule length (the test trains 3 of the 4 steps)
TRAIN = dict(lr=1e-3, warmup=1, final_frac=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8, weight_decay=0.1, grad_clip=1.0)

MODELS = {
    # https://huggingface.co/HuggingFaceTB/SmolLM2-360M/blob/main/config.json, layers and vocabulary reduced
    "smollm2-360m-2l": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
        "eos_token_id": 0, "head_dim": 64, "hidden_act": "silu", "hidden_size": 960, "initializer_range": 0.02,
        "intermediate_size": 2560, "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 15, "num_hidden_layers": 2, "num_key_value_heads": 5, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
        "torch_dtype": "float32", "use_cache": True, "vocab_size": 256},
    # https://huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json, layers and vocabulary reduced, untied
    "qwen3-1.7b-1l": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
        "eos_token_id": 0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 1, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "float32", "use_cache": True, "use_sliding_window": False, "vocab_size": 256},
}


def hf_shapes(hf):
    """{HF tensor name: shape} of a Llama / Qwen3 config"""
    d, F, V, hd = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["head_dim"]
    H, KV = hf["num_attention_heads"], hf["num_key_value_heads"]
    s = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,)}
    for l in range(hf["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                  p + "self_attn.q_proj.weight": (H * hd, d), p + "self_attn.k_proj.weight": (KV * hd, d),
                  p + "self_attn.v_proj.weight": (KV * hd, d), p + "self_attn.o_proj.weight": (d, H * hd),
                  p + "mlp.gate_proj.weight": (F, d), p + "mlp.up_proj.weight": (F, d), p + "mlp.down_proj.weight": (d, F)})
        if hf["model_type"] == "qwen3":
            s.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    if not hf["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, d)
    return s


def weights(name):
    rng = np.random.default_rng(SEED)
    out = {}
    for k, shape in sorted(hf_shapes(MODELS[name]).items()):
        z = rng.standard_normal(shape, dtype=np.float32)
        out[k] = (1.0 + 0.1 * z if len(shape) == 1 else 0.02 * z).astype(np.float32)
    return out


def tokens(name):
    """STEPS * B * T + 1 tokens: step s's sequence j is tokens[(s*B + j)*T : (s*B + j)*T + T + 1] (the trainer's
    batch order on one rank)"""
    rng = np.random.default_rng(SEED + 1000)
    return rng.integers(0, MODELS[name]["vocab_size"], STEPS * B * T + 1, dtype=np.int64)


def write_hf_dir(name, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(MODELS[name], f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), weights(name), dtype="F32")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: family_models.py {{{','.join(MODELS)}}} OUT_DIR")
    write_hf_dir(sys.argv[1], sys.argv[2])
