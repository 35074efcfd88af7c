#!/usr/bin/env python3
"""Import Hugging Face (Llama, Qwen3, NanoChat) or nanochat weights into a train_sdc checkpoint.

    python dev/reference/hf_to_ckpt.py MODEL_DIR out.ckpt [--preset NAME] [--seq_len N]
    python dev/reference/hf_to_ckpt.py model.safetensors out.ckpt --config config.json
    python dev/reference/hf_to_ckpt.py nanochat_model.safetensors out.ckpt [--n_head H] [--seq_len N]

Sources:
  * an HF model directory: config.json plus model.safetensors, a sharded model.safetensors.index.json,
    or pytorch_model.bin[.index.json] (the .bin forms need torch);
    architectures LlamaForCausalLM (Llama 3.x, SmolLM2, ...), Qwen3ForCausalLM, NanoChatForCausalLM;
  * a single .safetensors (or .bin/.pt) file with --config CONFIG.json;
  * a nanochat state dict (keys transformer.wte.weight, transformer.h.N.attn.c_q.weight, ...; the
    `_orig_mod.` prefix of torch.compile is stripped), as .safetensors or a torch .pt file, with an
    optional nanochat meta json ({"model_config": {...}}) through --config or beside it in a directory.
    Without a config, shapes come from the tensors; n_head from --n_head, else head_dim 128 as in
    nanochat; seq_len from --seq_len, else 2048.

Safetensors are parsed with numpy alone (dev/reference/safetensors_np.py): F32, BF16 and F16 tensors
are converted to fp32 exactly. The checkpoint is weights-only (step 0, no optimizer state), in the
parameter order of docs/formats.md. Any unknown or missing tensor, or shape mismatch, is a one-line
error naming the file and the tensor, exit status 1."""
import argparse
import glob
import json
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # dev/ for tsdc_io
sys.path.insert(0, HERE)
import tsdc_io  # noqa: E402
from safetensors_np import SafetensorsError, read_safetensors  # noqa: E402

FP32_EPS = float(np.finfo(np.float32).eps)  # 1.1920928955078125e-07, F.rms_norm's default eps


class ImportError_(Exception):
    """A one-line user-facing error."""


def fail(msg):
    raise ImportError_(msg)


# ---------------------------------------------------------------- reading tensors
def _torch_load(path):
    try:
        import torch
    except ImportError:
        fail(f"{path}: reading PyTorch .bin/.pt files needs torch; convert to safetensors or install torch")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        fail(f"{path}: cannot load with torch.load ({type(e).__name__}: {e})")
    if isinstance(sd, dict) and "model" in sd and isinstance(sd["model"], dict):
        sd = sd["model"]
    if not isinstance(sd, dict):
        fail(f"{path}: not a state dict")
    out = {}
    for k, v in sd.items():
        if not hasattr(v, "dtype"):
            fail(f"{path}: tensor {k}: not a tensor")
        out[k] = v.detach().to(torch.float32).contiguous().numpy()
    return out


def load_tensor_file(path):
    """{name: (fp32 array, file)} of one weights file."""
    if path.endswith(".safetensors"):
        try:
            t = read_safetensors(path)
        except SafetensorsError as e:
            fail(str(e))
        except OSError as e:
            fail(f"{path}: {e.strerror}")
    else:
        t = _torch_load(path)
    return {k: (v, path) for k, v in t.items()}


def load_tensor_files(paths):
    out = {}
    for p in paths:
        for k, v in load_tensor_file(p).items():
            if k in out:
                fail(f"{p}: tensor {k}: also in {out[k][1]}")
            out[k] = v
    return out


def weight_files_in_dir(d):
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        ip = os.path.join(d, index)
        if os.path.exists(ip):
            with open(ip) as f:
                try:
                    wm = json.load(f)["weight_map"]
                except (json.JSONDecodeError, KeyError):
                    fail(f"{ip}: not a weights index (no weight_map)")
            files = sorted(set(wm.values()))
            paths = [os.path.join(d, x) for x in files]
            for p in paths:
                if not os.path.exists(p):
                    fail(f"{ip}: shard {os.path.basename(p)} is missing")
            return paths
    for single in ("model.safetensors", "pytorch_model.bin"):
        p = os.path.join(d, single)
        if os.path.exists(p):
            return [p]
    st = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if len(st) == 1:
        return st
    pts = sorted(glob.glob(os.path.join(d, "model_*.pt")))  # nanochat checkpoint directory
    if pts:
        return [pts[-1]]
    fail(f"{d}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or model_*.pt found")


# ---------------------------------------------------------------- configs
# class defaults of the HF configs (save_pretrained omits values equal to these)
HF_DEFAULTS = {
    "llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu"),
    "qwen3": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu"),
    "nanochat": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     hidden_act="relu2", final_logit_softcapping=15.0),
}
ARCHS = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "NanoChatForCausalLM": "nanochat"}


def hf_kind(hf, path):
    archs = hf.get("architectures") or []
    for a in archs:
        if a in ARCHS:
            return ARCHS[a]
    mt = hf.get("model_type")
    if not archs and mt in ("llama", "qwen3", "nanochat"):
        return mt
    fail(f"{path}: unsupported architecture {archs or mt} (supported: {', '.join(ARCHS)})")


def hf_rope(hf, path):
    """(theta, llama3 params or None) from either the transformers>=5 `rope_parameters` or the older
    `rope_theta` + `rope_scaling` fields."""
    rp = hf.get("rope_parameters") or {}
    if rp and all(isinstance(v, dict) or v is None for v in rp.values()):  # nested per layer type
        vals = [v for v in rp.values() if v]
        if any(v != vals[0] for v in vals):
            fail(f"{path}: per-layer-type rope_parameters differ; not supported")
        rp = vals[0] if vals else {}
    theta = rp.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or rp
    rtype = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if float(scaling.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        fail(f"{path}: partial_rotary_factor != 1 not supported")
    if rtype == "default":
        return float(theta), None
    if rtype != "llama3":
        fail(f"{path}: rope type {rtype!r} not supported (default and llama3 only)")
    try:
        l3 = dict(factor=float(scaling["factor"]), low=float(scaling["low_freq_factor"]),
                  high=float(scaling["high_freq_factor"]),
                  orig=float(scaling.get("original_max_position_embeddings",
                                         hf.get("max_position_embeddings", 0))))
    except KeyError as e:
        fail(f"{path}: llama3 rope scaling lacks {e.args[0]}")
    if not (l3["factor"] > 0 and l3["high"] > l3["low"] > 0 and l3["orig"] > 0):
        fail(f"{path}: bad llama3 rope scaling {scaling}")
    return float(theta), l3


def base_cfg():
    cfg = {k: 0 for k in tsdc_io.CONFIG_FIELDS_I}
    cfg.update({k: 0.0 for k in tsdc_io.CONFIG_FIELDS_D})
    return cfg


def hf_config_to_tsdc(hf, path, seq_len=None):
    """HF config.json dict -> (tsdc cfg, kind, default preset name)."""
    kind = hf_kind(hf, path)
    dflt = HF_DEFAULTS[kind]
    get = lambda k: hf.get(k, dflt.get(k))  # noqa: E731
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if k not in hf:
            fail(f"{path}: config lacks {k}")
    if hf.get("attention_bias"):
        fail(f"{path}: attention_bias true not supported")
    if hf.get("mlp_bias"):
        fail(f"{path}: mlp_bias true not supported")
    want_act = "relu2" if kind == "nanochat" else "silu"
    if get("hidden_act") != want_act:
        fail(f"{path}: hidden_act {get('hidden_act')!r} not supported for {kind} (want {want_act!r})")
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in (hf.get("layer_types") or [])):
        fail(f"{path}: sliding-window attention not supported")
    d, H = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    theta, l3 = hf_rope(hf, path)
    cfg = base_cfg()
    cfg.update(n_layer=int(hf["num_hidden_layers"]), d_model=d, n_head=H,
               n_kv_head=int(hf.get("num_key_value_heads") or H),
               head_dim=int(hf.get("head_dim") or d // H), ffn_dim=int(hf["intermediate_size"]),
               vocab_size=int(hf["vocab_size"]),
               seq_len=int(seq_len or get("max_position_embeddings")),
               rope_theta=theta, norm_eps=float(get("rms_norm_eps")),
               tied=int(bool(get("tie_word_embeddings"))))
    if kind == "nanochat":
        cfg.update(mlp=1, norm_weighted=0, qk_norm=2, rope_style=1, embed_norm=1,
                   softcap=float(get("final_logit_softcapping") or 0.0))
    else:
        cfg.update(mlp=0, norm_weighted=1, qk_norm=1 if kind == "qwen3" else 0, rope_style=0,
                   embed_norm=0, softcap=0.0)
    if l3:
        cfg.update(rope_llama3=1, rope_factor=l3["factor"], rope_low=l3["low"], rope_high=l3["high"],
                   rope_orig=l3["orig"])
    if cfg["n_head"] % cfg["n_kv_head"]:
        fail(f"{path}: num_key_value_heads {cfg['n_kv_head']} does not divide num_attention_heads {H}")
    return cfg, kind, "hf-" + kind


def nanochat_cfg(tensors, meta, path, n_head=None, seq_len=None):
    """tsdc cfg of a nanochat state dict; shapes from the tensors, checked against meta if given."""
    mc = (meta or {}).get("model_config", meta or {})
    if "transformer.wte.weight" not in tensors:
        fail(f"{path}: tensor transformer.wte.weight missing")
    V, d = tensors["transformer.wte.weight"][0].shape
    layers = {int(m.group(1)) for k in tensors for m in [re.match(r"transformer\.h\.(\d+)\.", k)] if m}
    L = max(layers) + 1 if layers else 0
    if L == 0:
        fail(f"{path}: no transformer.h.N tensors")
    def shape(name):
        if name not in tensors:
            fail(f"{path}: tensor {name} missing")
        return tensors[name][0].shape
    q_out = shape("transformer.h.0.attn.c_q.weight")[0]
    k_out = shape("transformer.h.0.attn.c_k.weight")[0]
    F = shape("transformer.h.0.mlp.c_fc.weight")[0]
    H = int(n_head or mc.get("n_head") or 0)
    if not H:
        if q_out % 128:
            fail(f"{path}: cannot infer n_head (c_q out {q_out} not a multiple of head_dim 128); pass --n_head")
        H = q_out // 128
    if q_out % H:
        fail(f"{path}: tensor transformer.h.0.attn.c_q.weight: {q_out} rows not divisible by n_head {H}")
    hd = q_out // H
    if k_out % hd:
        fail(f"{path}: tensor transformer.h.0.attn.c_k.weight: {k_out} rows not a multiple of head_dim {hd}")
    KV = k_out // hd
    for key, val in (("n_layer", L), ("n_embd", d), ("vocab_size", V), ("n_kv_head", KV)):
        if key in mc and int(mc[key]) != val:
            fail(f"{path}: config {key}={mc[key]} but the tensors say {val}")
    cfg = base_cfg()
    cfg.update(n_layer=L, d_model=d, n_head=H, n_kv_head=KV, head_dim=hd, ffn_dim=F, vocab_size=V,
               seq_len=int(seq_len or mc.get("sequence_len") or 2048),
               mlp=1, norm_weighted=0, qk_norm=2, rope_style=1, tied=0, embed_norm=1,
               rope_theta=10000.0, norm_eps=FP32_EPS, softcap=15.0)
    if H % KV:
        fail(f"{path}: n_kv_head {KV} does not divide n_head {H}")
    return cfg


# ---------------------------------------------------------------- key maps
def hf_key_map(cfg, kind):
    """{hf name: tsdc name} for every tensor a checkpoint of this config must have."""
    m = {"model.embed_tokens.weight": "wte"}
    for l in range(cfg["n_layer"]):
        h, t = f"model.layers.{l}.", f"layers.{l}."
        m.update({h + "self_attn.q_proj.weight": t + "wq", h + "self_attn.k_proj.weight": t + "wk",
                  h + "self_attn.v_proj.weight": t + "wv", h + "self_attn.o_proj.weight": t + "wo"})
        if kind == "nanochat":
            m.update({h + "mlp.fc1.weight": t + "w_fc", h + "mlp.fc2.weight": t + "w_down"})
        else:
            m.update({h + "input_layernorm.weight": t + "attn_norm_w",
                      h + "post_attention_layernorm.weight": t + "mlp_norm_w",
                      h + "mlp.gate_proj.weight": t + "w_gate", h + "mlp.up_proj.weight": t + "w_up",
                      h + "mlp.down_proj.weight": t + "w_down"})
        if kind == "qwen3":
            m.update({h + "self_attn.q_norm.weight": t + "q_norm_w",
                      h + "self_attn.k_norm.weight": t + "k_norm_w"})
    if kind != "nanochat":
        m["model.norm.weight"] = "final_norm_w"
    if not cfg["tied"]:
        m["lm_head.weight"] = "lm_head"
    return m


def nanochat_key_map(cfg):
    m = {"transformer.wte.weight": "wte"}
    for l in range(cfg["n_layer"]):
        h, t = f"transformer.h.{l}.", f"layers.{l}."
        m.update({h + "attn.c_q.weight": t + "wq", h + "attn.c_k.weight": t + "wk",
                  h + "attn.c_v.weight": t + "wv", h + "attn.c_proj.weight": t + "wo",
                  h + "mlp.c_fc.weight": t + "w_fc", h + "mlp.c_proj.weight": t + "w_down"})
    m["lm_head.weight"] = "lm_head"
    return m


def map_tensors(tensors, keymap, cfg, src):
    """Apply keymap, checking names and shapes; returns the params dict for write_checkpoint."""
    shapes = dict(tsdc_io.param_layout(cfg))
    tensors = dict(tensors)
    if cfg["tied"] and "lm_head.weight" in tensors and "lm_head.weight" not in keymap:
        # tied model saved with an explicit lm_head copy: must equal the embedding
        emb_key = next(k for k, v in keymap.items() if v == "wte")
        a, f = tensors.pop("lm_head.weight")
        if emb_key in tensors and not np.array_equal(a, tensors[emb_key][0]):
            fail(f"{f}: tensor lm_head.weight differs from {emb_key} but tie_word_embeddings is true")
    params = {}
    for name, (a, f) in tensors.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue  # a derived buffer some old checkpoints carry, not a parameter
        if name not in keymap:
            fail(f"{f}: unknown tensor {name} {list(a.shape)}")
        t = keymap[name]
        if tuple(a.shape) != tuple(shapes[t]):
            fail(f"{f}: tensor {name}: shape {list(a.shape)}, expected {list(shapes[t])}")
        if not np.all(np.isfinite(a)):
            fail(f"{f}: tensor {name}: non-finite values")
        params[t] = a
    for hk, t in keymap.items():
        if t not in params:
            fail(f"{src}: tensor {hk} missing")
    return params


def _strip_prefix(tensors):
    return {(k[len("_orig_mod."):] if k.startswith("_orig_mod.") else k): v for k, v in tensors.items()}


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{path}: bad JSON ({e})")


def convert(src, config=None, seq_len=None, n_head=None):
    """Returns (cfg, params dict, default preset name, description)."""
    if not os.path.exists(src):
        fail(f"{src}: no such file or directory")
    if os.path.isdir(src):
        files = weight_files_in_dir(src)
        if config is None:
            for cp in [os.path.join(src, "config.json")] + sorted(glob.glob(os.path.join(src, "meta*.json"))):
                if os.path.exists(cp):
                    config = cp
                    break
    else:
        files = [src]
    tensors = _strip_prefix(load_tensor_files(files))
    cj = _read_json(config) if config else None
    is_nanochat_sd = "transformer.wte.weight" in tensors
    if is_nanochat_sd:
        cfg = nanochat_cfg(tensors, cj, files[0], n_head=n_head, seq_len=seq_len)
        keymap, kind, preset = nanochat_key_map(cfg), "nanochat", "nanochat"
    else:
        if cj is None:
            fail(f"{src}: no config.json; pass --config CONFIG.json")
        cfg, kind, preset = hf_config_to_tsdc(cj, config, seq_len=seq_len)
        keymap = hf_key_map(cfg, kind)
    params = map_tensors(tensors, keymap, cfg, files[0] if len(files) == 1 else src)
    return cfg, params, preset, kind


def summary(preset, cfg, n_params, kind):
    lines = [f"preset {preset!r} ({kind})"]
    lines.append("  " + " ".join(f"{k}={cfg[k]}" for k in tsdc_io.CONFIG_FIELDS_I))
    lines.append("  " + " ".join(f"{k}={cfg[k]:g}" for k in tsdc_io.CONFIG_FIELDS_D))
    lines.append(f"  parameters: {n_params:,}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="HF model directory, .safetensors/.bin/.pt file, or nanochat state dict")
    ap.add_argument("out", help="output train_sdc checkpoint (.ckpt)")
    ap.add_argument("--config", help="config.json (HF) or nanochat meta json, for a single weights file")
    ap.add_argument("--preset", help="preset name stored in the checkpoint (default: hf-llama, hf-qwen3, "
                                     "hf-nanochat or nanochat)")
    ap.add_argument("--seq_len", type=int, help="max sequence length (default: max_position_embeddings)")
    ap.add_argument("--n_head", type=int, help="nanochat state dicts: number of query heads")
    a = ap.parse_args(argv)
    try:
        cfg, params, preset, kind = convert(a.src, config=a.config, seq_len=a.seq_len, n_head=a.n_head)
        preset = a.preset or preset
        if len(preset.encode()) > 31:
            fail(f"--preset {preset!r}: longer than 31 bytes")
        tsdc_io.write_checkpoint(a.out, preset, cfg, params)
    except ImportError_ as e:
        print(f"hf_to_ckpt: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"hf_to_ckpt: {getattr(e, 'filename', '') or a.out}: {e.strerror}", file=sys.stderr)
        return 1
    n = sum(int(np.prod(s)) for _, s in tsdc_io.param_layout(cfg))
    print(summary(preset, cfg, n, kind))
    print(f"wrote {a.out} ({os.path.getsize(a.out):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
