#!/usr/bin/env python3
"""Train the LLMFT-style learned detector (-detect llmft) on the per-step features of runs made with
-detect loss,nan,harmful -detect_observe 1 (llmc/sdc/detect.h lists the features), and write the model file
the trainers load with -llmft_model.

  scripts/llmft_train.py --run DIR [--run DIR ...] --out MODEL [--max-fpr 0.01]

Labels: a step is positive when the run's faults.jsonl has an event at that step (any pass), negative
otherwise (a run without faults.jsonl is all negative: give a clean run, or a campaign whose fault window
leaves clean steps). Steps before the detectors have 8 steps of history are left out.

Model: logistic regression on the standardised features (mean and std of the training set), class-
balanced, L2 penalty 1 (the faulty steps are often separable; the penalty keeps the weights finite), fitted by Newton's method (IRLS). Threshold: the smallest probability (at
least 0.5) at which the clean training steps raise alarms at a rate of at most --max-fpr. Prints the
training recall and false-positive rate. The model is trained on one campaign and applied unchanged
to others (paper Table 1's LLMFT row)."""
import argparse
import json
import math
import os
import sys

import numpy as np

FEATURES = ["z_loss", "z_grad_norm", "z_update_norm", "nonfinite", "loss_jump"]
MIN_HISTORY = 8


def load_run(d):
    path = os.path.join(d, "log.jsonl")
    if not os.path.exists(path):
        sys.exit(f"error: --run {d}: no log.jsonl")
    rows = []
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "step":
            rows.append(r)
    if not rows or "feat" not in rows[0]:
        sys.exit(f"error: --run {d}: its steps have no detector features (run it with -detect loss,nan,harmful -detect_observe 1)")
    faulty = set()
    fpath = os.path.join(d, "faults.jsonl")
    if os.path.exists(fpath):
        for line in open(fpath):
            e = json.loads(line)
            faulty.add(e["step"])
    X, y = [], []
    for i, r in enumerate(rows):
        if i < MIN_HISTORY:
            continue
        X.append([float(v) if math.isfinite(float(v)) else 50.0 for v in r["feat"]])
        y.append(1 if r["step"] in faulty else 0)
    return np.array(X, dtype=np.float64), np.array(y, dtype=np.float64)


def fit_logistic(Z, y, l2=1.0, iters=100):
    n, k = Z.shape
    A = np.hstack([Z, np.ones((n, 1))])
    pos = y.sum()
    w_pos = n / (2 * pos) if pos else 1.0
    w_neg = n / (2 * (n - pos)) if n - pos else 1.0
    sw = np.where(y > 0, w_pos, w_neg)
    w = np.zeros(k + 1)
    for _ in range(iters):
        p = 1 / (1 + np.exp(-np.clip(A @ w, -500, 500)))
        g = A.T @ (sw * (p - y)) + l2 * np.r_[w[:k], 0]
        H = (A * (sw * p * (1 - p))[:, None]).T @ A + l2 * np.eye(k + 1)
        step = np.linalg.solve(H, g)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return w[:k], w[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, help="run directory (log.jsonl [+ faults.jsonl])")
    ap.add_argument("--out", required=True, help="model file to write")
    ap.add_argument("--max-fpr", type=float, default=0.01)
    a = ap.parse_args()
    Xs, ys = zip(*(load_run(d) for d in a.run))
    X, y = np.vstack(Xs), np.concatenate(ys)
    if y.sum() == 0 or y.sum() == len(y):
        sys.exit(f"error: the runs give {int(y.sum())} faulty of {len(y)} steps: need both clean and faulty steps")
    mean = X.mean(0)
    sd = X.std(0)
    sd[sd < 1e-6] = 1.0
    Z = (X - mean) / sd
    w, b = fit_logistic(Z, y)
    p = 1 / (1 + np.exp(-np.clip(Z @ w + b, -500, 500)))
    clean = np.sort(p[y == 0])
    allowed = int(math.floor(a.max_fpr * len(clean)))
    thr = 0.5
    if len(clean) > allowed:
        # alarms fire at p >= thr: put thr just above the (allowed+1)-th largest clean score
        cut = clean[len(clean) - 1 - allowed]
        thr = max(0.5, float(np.nextafter(cut, 1.0)))
    thr = min(thr, 1 - 1e-12)
    fpr = float(np.mean(p[y == 0] >= thr))
    rec = float(np.mean(p[y == 1] >= thr))
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        f.write("TSDC-LLMFT 1\n")
        f.write("features " + " ".join(FEATURES) + "\n")
        f.write("mean " + " ".join(f"{v:.17g}" for v in mean) + "\n")
        f.write("std " + " ".join(f"{v:.17g}" for v in sd) + "\n")
        f.write("weights " + " ".join(f"{v:.17g}" for v in w) + "\n")
        f.write(f"bias {b:.17g}\n")
        f.write(f"threshold {thr:.17g}\n")
    os.replace(tmp, a.out)
    print(f"llmft: {len(y)} steps ({int(y.sum())} faulty) from {len(a.run)} run(s); threshold {thr:.4g}; "
          f"training recall {rec:.3f}, clean false-positive rate {fpr:.4f}; weights "
          + ", ".join(f"{n} {v:+.3g}" for n, v in zip(FEATURES, w)) + f"; model {a.out}")


if __name__ == "__main__":
    main()
