#!/usr/bin/env python3
"""PyTorch side of the CPU speed benchmark (scripts/bench_cpu.sh runs it beside train_sdc).

Trains the HF model of a tiny train_sdc preset -- LlamaForCausalLM for tiny-llama, Qwen3ForCausalLM
for tiny-qwen3, built with the exact preset config (llmc/config.h; the same HF config that
dev/reference/make_states.py uses, at the preset's full vocabulary and sequence length) -- in fp32
on the CPU, the way train_sdc does a step: forward, backward, global grad-norm clip 1.0, AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices and embeddings, none on norm weights).
Batches are read from the same token shard train_sdc trains on (tsdc_io.read_shard), in the same
order (B consecutive windows of T+1 tokens per step, advancing B*T tokens a step).

    python dev/bench/bench_torch.py --train SHARD [--preset tiny-llama] [--B 8] [--T 128]
                                    [--threads N] [--warmup 3] [--steps 10] [--attn sdpa|eager]
                                    [--parallel-info]

Runs --warmup untimed steps, then --steps timed steps, and prints one JSON line:
    {"impl": "pytorch", "tok_s": ..., "ms_step": ..., "threads": ..., "B": ..., "T": ..., ...}
ms_step is the mean wall time of a timed step; tok_s = B*T / (ms_step / 1000)."""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import tsdc_io  # noqa: E402

# The tiny presets of llmc/config.h (the HF-modelled ones).
PRESETS = {
    "tiny-llama": dict(kind="llama", n_layer=4, d_model=128, n_head=4, n_kv_head=2, head_dim=32, ffn_dim=384,
                       vocab_size=8192, seq_len=128, rope_theta=500000.0, norm_eps=1e-5, tied=1,
                       rope_factor=32.0, rope_low=1.0, rope_high=4.0, rope_orig=8192),
    "tiny-qwen3": dict(kind="qwen3", n_layer=4, d_model=128, n_head=4, n_kv_head=2, head_dim=64, ffn_dim=384,
                       vocab_size=8192, seq_len=128, rope_theta=1e6, norm_eps=1e-6, tied=1),
}


def hf_config(cfg, T, attn):
    from transformers import LlamaConfig, Qwen3Config
    common = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["ffn_dim"],
                  num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
                  num_key_value_heads=cfg["n_kv_head"], head_dim=cfg["head_dim"], hidden_act="silu",
                  max_position_embeddings=max(T, cfg["seq_len"]), rms_norm_eps=cfg["norm_eps"],
                  tie_word_embeddings=bool(cfg["tied"]), attention_bias=False, attention_dropout=0.0,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=False)
    if cfg["kind"] == "llama":
        rope = {"rope_type": "llama3", "rope_theta": cfg["rope_theta"], "factor": cfg["rope_factor"],
                "low_freq_factor": cfg["rope_low"], "high_freq_factor": cfg["rope_high"],
                "original_max_position_embeddings": int(cfg["rope_orig"])}
        return LlamaConfig(**common, mlp_bias=False, rope_parameters=rope, attn_implementation=attn)
    rope = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    return Qwen3Config(**common, rope_parameters=rope, use_sliding_window=False, sliding_window=None,
                       max_window_layers=cfg["n_layer"], attn_implementation=attn)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="token shard (docs/formats.md)")
    ap.add_argument("--preset", default="tiny-llama", choices=sorted(PRESETS))
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--parallel-info", action="store_true",
                    help="print torch.__config__.parallel_info() to stderr after setting the threads")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    if args.parallel_info:
        print(torch.__config__.parallel_info(), file=sys.stderr, flush=True)
    import transformers
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM
    # silences the (harmless) warning that the llama3 rope's original_max_position_embeddings 8192
    # exceeds max_position_embeddings: the preset is defined that way (llmc/config.h)
    transformers.logging.set_verbosity_error()

    cfg = PRESETS[args.preset]
    tokens, shard_vocab = tsdc_io.read_shard(args.train)
    if tokens.size and int(tokens.max()) >= cfg["vocab_size"]:
        raise SystemExit(f"{args.train}: token id {int(tokens.max())} >= vocab {cfg['vocab_size']}")
    B, T = args.B, args.T
    if tokens.size < B * T + 1:
        raise SystemExit(f"{args.train}: {tokens.size} tokens, need at least B*T+1 = {B * T + 1}")
    data = torch.from_numpy(tokens)

    model_cls = LlamaForCausalLM if cfg["kind"] == "llama" else Qwen3ForCausalLM
    model = model_cls(hf_config(cfg, T, args.attn)).to(torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    n_params = sum(p.numel() for p in model.parameters())

    pos = 0
    def next_batch():
        nonlocal pos
        if pos + B * T + 1 > data.numel():
            pos = 0
        starts = pos + T * torch.arange(B)
        idx = starts[:, None] + torch.arange(T + 1)[None, :]
        buf = data[idx]
        pos += B * T
        return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()

    def step():
        x, y = next_batch()
        logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    loss = float("nan")
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    ms = 1000.0 * sum(times) / len(times)
    print(json.dumps({"impl": "pytorch", "tok_s": round(B * T / (ms / 1000.0), 1), "ms_step": round(ms, 3),
                      "threads": torch.get_num_threads(), "B": B, "T": T, "preset": args.preset,
                      "attn": args.attn, "params": n_params, "steps": args.steps, "warmup": args.warmup,
                      "loss": round(loss, 5), "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
