#!/usr/bin/env python3
"""PyTorch side of the GPU speed benchmark (scripts/gpu_check.sh runs it beside train_sdc_cu).

Trains the HF model of a train_sdc preset -- LlamaForCausalLM for llama3.2-1b / tiny-llama,
Qwen3ForCausalLM for qwen3-0.6b / tiny-qwen3, random init, the exact preset config of llmc/host/config.h --
the way a typical PyTorch user would on one GPU: fp32 master weights, bf16 autocast, SDPA attention
(flash / memory-efficient kernels: attention is NOT materialised, unlike train_sdc_cu), loss on the
fp32-upcast logits, global grad-norm clip 1.0, fused AdamW (betas 0.9/0.95, eps 1e-8, weight decay
0.1 on matrices and embeddings). No torch.compile. Batches come from the same token shard as
train_sdc_cu, in its order (B consecutive windows of T+1 tokens per step, advancing B*T a step), or
are random tokens when --train is not given.

    python dev/bench/bench_gpu_torch.py --preset llama3.2-1b [--B 8] [--T 1024] [--warmup 5] [--steps 20]
                                        [--train SHARD] [--device cuda|cpu] [--attn sdpa|eager]

Prints one JSON line: {"impl": "pytorch", "preset", "B", "T", "params", "ms_step", "ms_median", "tok_s",
"peak_alloc_gib", "peak_reserved_gib", "attn", "torch", "transformers", "loss", ...}. Timing: each timed
step is synchronised (loss.item()) and measured with a wall clock; ms_step is the mean, ms_median the
median. Peak memory: torch.cuda.max_memory_allocated / max_memory_reserved over the whole run
(weights, gradients and AdamW state included); the CUDA context is not counted (nvidia-smi shows it).
--device cpu exists to test this script without a GPU (tiny presets)."""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from hf_presets import PRESETS, batch_reader, hf_config  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="llama3.2-1b", choices=sorted(PRESETS))
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--train", default="", help="token shard (docs/formats.md); default: random tokens")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=8)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM
    transformers.logging.set_verbosity_error()
    dev = torch.device(args.device)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: torch sees no CUDA device")
    torch.manual_seed(args.seed)
    cfg = PRESETS[args.preset]
    B, T, V = args.B, args.T, cfg["vocab_size"]

    if args.train:
        import tsdc_io
        tokens, _ = tsdc_io.read_shard(args.train)
        if tokens.size and int(tokens.max()) >= V:
            raise SystemExit(f"error: {args.train}: token id {int(tokens.max())} >= vocab {V}")
        if tokens.size < B * T + 1:
            raise SystemExit(f"error: {args.train}: {tokens.size} tokens, need at least B*T+1 = {B * T + 1}")
        data = torch.from_numpy(tokens)
    else:
        n = (args.warmup + args.steps) * B * T + 1
        data = torch.randint(0, min(V, 8192), (n,), dtype=torch.int64)

    t0 = time.perf_counter()
    model_cls = LlamaForCausalLM if cfg["kind"] == "llama" else Qwen3ForCausalLM
    with dev:
        model = model_cls(hf_config(cfg, T, args.attn)).to(torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = args.device == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    n_params = sum(p.numel() for p in model.parameters())
    t_build = time.perf_counter() - t0

    next_batch = batch_reader(data, B, T, dev)

    def step():
        x, y = next_batch()
        with torch.autocast(device_type=args.device, dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    times = []
    loss = float("nan")
    for _ in range(args.steps):
        t1 = time.perf_counter()
        loss = step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t1)
    ms = 1000.0 * sum(times) / len(times)
    med = 1000.0 * statistics.median(times)
    out = {"impl": "pytorch", "preset": args.preset, "B": B, "T": T, "params": n_params,
           "ms_step": round(ms, 3), "ms_median": round(med, 3), "tok_s": round(B * T / (ms / 1000.0), 1),
           "steps": args.steps, "warmup": args.warmup, "loss": round(loss, 5), "attn": model.config._attn_implementation,
           "fused_adamw": fused, "build_s": round(t_build, 1), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": args.device}
    if args.device == "cuda":
        out["peak_alloc_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        out["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
