#!/usr/bin/env python3
"""Reference facts for the two non-preset models of family_models.py, made with transformers +
torch on the CPU in fp32 (attn_implementation="eager", one thread, deterministic algorithms):

    pip install -r dev/reference/requirements.txt
    python dev/reference/make_family_states.py [--out DIR]     (default DIR: dev/reference/states/family)

writes DIR/NAME.npz for each model: `losses` (float32 [4]): the loss before each of 4 AdamW updates,
update s on the batch the trainer reads at step s + 1 (family_models.tokens); the first 3 are what
./train_sdc -steps 4 -stop_at 3 logs, the 4th is the loss of the model after 3 updates; `logits` (float32
[T, V]): that model's logits on the first sequence, tokens[:T]; `versions`. The weights are not stored:
family_models.py rebuilds them bit for bit from the seed with numpy.

Per update s: forward, mean cross-entropy over B*T positions, backward; clip_grad_norm_(1.0) (torch's
g *= 1 / (norm + 1e-6) when above); lr = tsdc_io.lr_at(s, 1e-3, 1, 4, 0.1); torch.optim.AdamW (non-foreach)
betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D tensors, 0 on norm weights."""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import tsdc_io  # noqa: E402
import family_models as fm  # noqa: E402


def train(name):
    from transformers import AutoModelForCausalLM
    import transformers
    with tempfile.TemporaryDirectory() as d:
        fm.write_hf_dir(name, d)
        model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32)
    model.train()
    tr = fm.TRAIN
    params = [p for p in model.parameters()]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": tr["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["adam_eps"], foreach=False)
    tok = torch.from_numpy(fm.tokens(name))
    B, T, V = fm.B, fm.T, fm.MODELS[name]["vocab_size"]

    def batch(s):
        rows = torch.stack([tok[(s * B + j) * T:(s * B + j) * T + T + 1] for j in range(B)])
        return rows[:, :T], rows[:, 1:]

    losses = []
    for s in range(fm.STEPS):
        x, y = batch(s)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        losses.append(loss.item())
        if s == fm.STEPS - 1:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = tsdc_io.lr_at(s, tr["lr"], tr["warmup"], fm.STEPS, tr["final_frac"])
        opt.step()
    model.eval()
    with torch.no_grad():
        z = model(input_ids=tok[:T][None]).logits[0].numpy().astype(np.float32)
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}"
    return np.array(losses, dtype=np.float32), z, versions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "states", "family"))
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    for name in fm.MODELS:
        losses, z, versions = train(name)
        np.savez_compressed(os.path.join(a.out, f"{name}.npz"), losses=losses, logits=z, versions=np.array(versions))
        print(f"{name}: losses {' '.join(f'{l:.7f}' for l in losses)}; logits {z.shape} ({versions})")


if __name__ == "__main__":
    main()
