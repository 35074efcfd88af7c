#!/usr/bin/env python3
"""PyTorch side of the CPU speed benchmark (scripts/bench_cpu.sh runs it beside train_sdc).

Trains the HF model of a tiny train_sdc preset -- LlamaForCausalLM for tiny-llama, Qwen3ForCausalLM
for tiny-qwen3, built with the exact preset config (llmc/host/config.h; the same HF config that
dev/reference/make_states.py uses, at the preset's full vocabulary and sequence length) -- in fp32
on the CPU, the way train_sdc does a step: forward, backward, global grad-norm clip 1.0, AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices and embeddings, none on norm weights).
Batches are read from the same token shard train_sdc trains on (tsdc_io.read_shard), in the same
order (B consecutive windows of T+1 tokens per step, advancing B*T tokens a step).

    python dev/bench/bench_torch.py --train SHARD [--preset tiny-llama] [--B 8] [--T 128]
                                    [--threads N] [--warmup 3] [--steps 10] [--attn sdpa|eager]
                                    [--n-layer L] [--vocab V] [--precision fp32|bf16] [--parallel-info]

--n-layer and --vocab override the preset's (the wide row of scripts/bench_cpu.sh: smollm2-135m at 4
layers and vocabulary 8192, as train_sdc's -n_layer / -vocab). --precision bf16 runs the forward and the
loss under torch.autocast("cpu", dtype=torch.bfloat16) (bf16 matmuls on oneDNN, fp32 master weights and
AdamW), the counterpart of train_sdc's -precision bf16.

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

from hf_presets import PRESETS, batch_reader, hf_config  # noqa: E402


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
    ap.add_argument("--n-layer", type=int, default=0, help="override the preset's layer count")
    ap.add_argument("--vocab", type=int, default=0, help="override the preset's vocabulary")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
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
    # exceeds max_position_embeddings: the preset is defined that way (llmc/host/config.h)
    transformers.logging.set_verbosity_error()

    cfg = dict(PRESETS[args.preset])
    if args.n_layer > 0:
        cfg["n_layer"] = args.n_layer
    if args.vocab > 0:
        cfg["vocab_size"] = args.vocab
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

    next_batch = batch_reader(data, B, T)

    import contextlib
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" else contextlib.nullcontext

    def step():
        x, y = next_batch()
        with amp():
            logits = model(input_ids=x, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
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
                      "attn": args.attn, "precision": args.precision, "n_layer": cfg["n_layer"],
                      "vocab": cfg["vocab_size"], "params": n_params, "steps": args.steps, "warmup": args.warmup,
                      "loss": round(loss, 5), "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
