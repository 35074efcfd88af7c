"""PyTorch re-implementation of nanochat's GPT (karpathy/nanochat, nanochat/gpt.py), fp32, for the
debug reference states. Same module tree and state-dict keys as nanochat:

    transformer.wte.weight                       [V, d]
    transformer.h.{i}.attn.c_q.weight            [H*hd, d]
    transformer.h.{i}.attn.c_k.weight            [KV*hd, d]
    transformer.h.{i}.attn.c_v.weight            [KV*hd, d]
    transformer.h.{i}.attn.c_proj.weight         [d, H*hd]
    transformer.h.{i}.mlp.c_fc.weight            [F, d]
    transformer.h.{i}.mlp.c_proj.weight          [d, F]
    lm_head.weight                               [V, d]

Math (docs/design.md, the model family, nanochat variant):
    norm(x)  = F.rms_norm(x, (x.size(-1),))        parameter-free, eps = fp32 machine eps
    x        = norm(wte(idx))
    per block: x = x + attn(norm(x)); x = x + mlp(norm(x))
    attn:    q, k, v = c_q, c_k, c_v (B, T, heads, hd); RoPE (nanochat rotation on the half-split
             layout); q, k = norm(q), norm(k)  (after RoPE); causal SDPA with GQA, scale 1/sqrt(hd);
             c_proj
    mlp:     c_proj(relu(c_fc(x))^2)
    logits = softcap * tanh(lm_head(norm(x)) / softcap), softcap 15; loss = mean cross-entropy.

Differences from nanochat, all deliberate: everything is fp32 (nanochat keeps wte and the cos/sin
tables in bf16 and runs under bf16 autocast); the attention is written out (QK^T, mask, softmax, V)
instead of F.scaled_dot_product_attention (the same math; GPTConfig(sdpa=True) uses SDPA, and
selfcheck.py compares the two); head_dim is a free parameter
(nanochat derives it as n_embd // n_head) and the MLP width is a parameter (nanochat: 4 * n_embd);
no KV cache, no optimizer setup, no generation."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    sequence_len: int = 1024
    vocab_size: int = 65536
    n_layer: int = 12
    n_head: int = 6
    n_kv_head: int = 6
    n_embd: int = 768
    head_dim: int = 0        # 0: n_embd // n_head, as nanochat
    ffn_dim: int = 0         # 0: 4 * n_embd, as nanochat
    rope_theta: float = 10000.0
    softcap: float = 15.0
    sdpa: bool = False       # True: F.scaled_dot_product_attention as nanochat; False: written out


def norm(x):
    # purely functional RMSNorm, no learnable parameters; eps=None -> torch.finfo(x.dtype).eps
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary_emb(x, cos, sin):
    assert x.ndim == 4  # (B, T, heads, hd)
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat([y1, y2], 3)


def repeat_kv(x, n_rep):
    """(B, KV, T, hd) -> (B, KV*n_rep, T, hd); kv head j serves query heads j*n_rep .. j*n_rep+n_rep-1."""
    if n_rep == 1:
        return x
    bs, n_kv, slen, hd = x.shape
    return x[:, :, None, :, :].expand(bs, n_kv, n_rep, slen, hd).reshape(bs, n_kv * n_rep, slen, hd)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.n_embd = config.n_embd
        self.head_dim = config.head_dim
        assert self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0
        self.c_q = nn.Linear(self.n_embd, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(self.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(self.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(self.n_head * self.head_dim, self.n_embd, bias=False)
        self.sdpa = config.sdpa

    def forward(self, x, cos_sin):
        B, T, C = x.size()
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        cos, sin = cos_sin
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        q, k = norm(q), norm(k)  # QK norm, after RoPE
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        nrep = self.n_head // self.n_kv_head
        k, v = repeat_kv(k, nrep), repeat_kv(v, nrep)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the same causal attention, spelled out
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, -1)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.ffn_dim, bias=False)
        self.c_proj = nn.Linear(config.ffn_dim, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x, cos_sin):
        x = x + self.attn(norm(x), cos_sin)
        x = x + self.mlp(norm(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        if not config.head_dim:
            config.head_dim = config.n_embd // config.n_head
        if not config.ffn_dim:
            config.ffn_dim = 4 * config.n_embd
        self.config = config
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "h": nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        cos, sin = self.precompute_rotary(config.sequence_len, config.head_dim, config.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @staticmethod
    def precompute_rotary(seq_len, head_dim, base):
        channel_range = torch.arange(0, head_dim, 2, dtype=torch.float32)
        inv_freq = 1.0 / (base ** (channel_range / head_dim))
        t = torch.arange(seq_len, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        cos, sin = freqs.cos(), freqs.sin()  # fp32 (nanochat: bf16)
        return cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, hd/2)

    def forward(self, idx, targets=None):
        B, T = idx.size()
        assert T <= self.cos.size(1)
        cos_sin = self.cos[:, :T], self.sin[:, :T]
        x = self.transformer.wte(idx)
        x = norm(x)
        for block in self.transformer.h:
            x = block(x, cos_sin)
        x = norm(x)
        logits = self.lm_head(x)
        c = self.config.softcap
        if c:
            logits = c * torch.tanh(logits / c)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
