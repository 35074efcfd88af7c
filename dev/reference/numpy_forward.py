#!/usr/bin/env python3
"""A plain numpy forward pass of the train_sdc model family (docs/design.md), reading the
train_sdc parameter layout (docs/formats.md) -- a second, torch-free reference for the C trainer.

    python dev/reference/numpy_forward.py model.ckpt dev/reference/states/tiny-llama.state

compares this forward on the checkpoint's weights with the logits and loss stored in the state.
The arithmetic runs in float64 by default (pass --fp32 for float32), so it is an accurate target
for both the fp32 PyTorch states and the C trainer.

Shapes: B batch, T time, d model width, H query heads, KV key/value heads, hd head_dim, F ffn."""
import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import tsdc_io  # noqa: E402


def rmsnorm(x, weight, eps):
    """RMSNorm over the last axis; weight None for the parameter-free variant."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    y = x / np.sqrt(ms + eps)
    return y if weight is None else y * weight


def rope_inv_freq(cfg):
    """inv_freq[i] = theta^(-2i/hd), i < hd/2, with the optional Llama-3 frequency scaling."""
    hd = cfg["head_dim"]
    i = np.arange(hd // 2, dtype=np.float64)
    inv_freq = cfg["rope_theta"] ** (-2.0 * i / hd)
    if cfg["rope_llama3"]:
        f, low, high, orig = cfg["rope_factor"], cfg["rope_low"], cfg["rope_high"], cfg["rope_orig"]
        out = np.empty_like(inv_freq)
        for j, freq in enumerate(inv_freq):
            wl = 2.0 * math.pi / freq
            if wl < orig / high:          # high frequencies: unchanged
                out[j] = freq
            elif wl > orig / low:         # low frequencies: divided by the factor
                out[j] = freq / f
            else:                         # in between: smooth interpolation
                s = (orig / wl - low) / (high - low)
                out[j] = (1.0 - s) * freq / f + s * freq
        inv_freq = out
    return inv_freq


def rope_tables(cfg, T):
    """cos, sin of angle[t, i] = t * inv_freq[i]; shape (T, hd/2)."""
    ang = np.arange(T, dtype=np.float64)[:, None] * rope_inv_freq(cfg)[None, :]
    return np.cos(ang), np.sin(ang)


def apply_rope(x, cos, sin, style):
    """x: (B, heads, T, hd), split into halves x1 = x[..., :hd/2], x2 = x[..., hd/2:].
    style 0 (HF): x*cos + rotate_half(x)*sin, rotate_half(x) = cat(-x2, x1)
                  -> y1 = x1*cos - x2*sin, y2 = x2*cos + x1*sin
    style 1 (nanochat): y1 = x1*cos + x2*sin, y2 = -x1*sin + x2*cos"""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    if style == 0:
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
    else:
        y1 = x1 * cos + x2 * sin
        y2 = -x1 * sin + x2 * cos
    return np.concatenate([y1, y2], axis=-1)


def softmax(z):
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def attention(cfg, p, pre, x, cos, sin):
    """x: (B, T, d) normalised input -> (B, T, d)."""
    B, T, _ = x.shape
    H, KV, hd = cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    eps = cfg["norm_eps"]
    q = (x @ p[pre + "wq"].T).reshape(B, T, H, hd).transpose(0, 2, 1, 3)    # (B, H, T, hd)
    k = (x @ p[pre + "wk"].T).reshape(B, T, KV, hd).transpose(0, 2, 1, 3)   # (B, KV, T, hd)
    v = (x @ p[pre + "wv"].T).reshape(B, T, KV, hd).transpose(0, 2, 1, 3)
    if cfg["qk_norm"] == 1:           # Qwen3: weighted per-head RMSNorm before RoPE
        q = rmsnorm(q, p[pre + "q_norm_w"], eps)
        k = rmsnorm(k, p[pre + "k_norm_w"], eps)
    q = apply_rope(q, cos, sin, cfg["rope_style"])
    k = apply_rope(k, cos, sin, cfg["rope_style"])
    if cfg["qk_norm"] == 2:           # nanochat: parameter-free RMSNorm after RoPE
        q = rmsnorm(q, None, eps)
        k = rmsnorm(k, None, eps)
    g = H // KV                       # kv head j serves query heads j*g .. j*g+g-1
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(hd)                 # (B, H, T, T)
    causal = np.tril(np.ones((T, T), dtype=bool))
    scores = np.where(causal, scores, -np.inf)
    y = softmax(scores) @ v                                                # (B, H, T, hd)
    y = y.transpose(0, 2, 1, 3).reshape(B, T, H * hd)
    return y @ p[pre + "wo"].T


def mlp(cfg, p, pre, x):
    if cfg["mlp"] == 0:               # SwiGLU: down(silu(gate(x)) * up(x))
        a = x @ p[pre + "w_gate"].T
        u = x @ p[pre + "w_up"].T
        h = a / (1.0 + np.exp(-a)) * u
    else:                             # ReLU^2: down(relu(fc(x))^2)
        h = np.maximum(x @ p[pre + "w_fc"].T, 0.0) ** 2
    return h @ p[pre + "w_down"].T


def forward(cfg, params, tokens, dtype=np.float64):
    """tokens: (B, T) int -> logits (B, T, V) in `dtype`."""
    p = {k: np.asarray(v, dtype=dtype) for k, v in params.items()}
    eps = cfg["norm_eps"]
    w = lambda name: p[name] if cfg["norm_weighted"] else None  # noqa: E731
    B, T = tokens.shape
    cos, sin = (a.astype(dtype) for a in rope_tables(cfg, T))
    x = p["wte"][tokens]                                                   # (B, T, d)
    if cfg["embed_norm"]:
        x = rmsnorm(x, w("embed_norm_w"), eps)
    for l in range(cfg["n_layer"]):
        pre = f"layers.{l}."
        x = x + attention(cfg, p, pre, rmsnorm(x, w(pre + "attn_norm_w"), eps), cos, sin)
        x = x + mlp(cfg, p, pre, rmsnorm(x, w(pre + "mlp_norm_w"), eps))
    x = rmsnorm(x, w("final_norm_w"), eps)
    lm_head = p["wte"] if cfg["tied"] else p["lm_head"]
    logits = x @ lm_head.T
    if cfg["softcap"]:
        c = cfg["softcap"]
        logits = c * np.tanh(logits / c)
    return logits


def cross_entropy(logits, targets):
    """Mean over all positions of -log softmax(logits)[target]."""
    z = logits - np.max(logits, axis=-1, keepdims=True)
    logp = z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return float(-np.mean(picked))


def compare(ckpt, state_path, dtype=np.float64):
    """(max |logits diff|, |loss diff|, loss here, loss stored) of this forward vs a state file."""
    from check_state import read_state
    _, cfg, _, params, _, _ = tsdc_io.read_checkpoint(ckpt)
    st = read_state(state_path)
    tokens = st["tokens"]
    logits = forward(cfg, params, tokens[:, :-1], dtype=dtype)
    loss = cross_entropy(logits, tokens[:, 1:])
    return (float(np.max(np.abs(logits - st["logits"]))), abs(loss - float(st["loss"])), loss,
            float(st["loss"]))


def main():
    sys.path.insert(0, HERE)
    ap = argparse.ArgumentParser(description="numpy forward vs a debug reference state")
    ap.add_argument("ckpt")
    ap.add_argument("state")
    ap.add_argument("--fp32", action="store_true", help="compute in float32 instead of float64")
    a = ap.parse_args()
    dl, dloss, loss, ref = compare(a.ckpt, a.state, np.float32 if a.fp32 else np.float64)
    print(f"loss {loss:.7f} (state {ref:.7f}); max |logits diff| {dl:.3e}, |loss diff| {dloss:.3e}")
    return 0 if dl < 1e-4 and dloss < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
