#!/usr/bin/env python3
"""emu_counts.py: the device work of one training step, counted on the CUDA emulation.

Runs ./train_sdc_emu -stats for each preset, without protection and with -protect all, and prints one
markdown table row per run from the "stats" field of the log's step 2 (step 1 holds the one-off
allocations): kernel launches, host synchronisations (those inside the layer loops in brackets),
device-to-host copies, device memory, and the element-wise kernels' bytes (their own accounting).
Counts, not times: the emulation runs every kernel on the CPU. The geometry is the preset's, with the
vocabulary, sequence and layers cut where noted so that the emulation runs in minutes; launches and
synchronisations do not depend on those sizes except through the layer count.

usage: scripts/emu_counts.py [--presets tiny-llama,tiny-qwen3,...] [--big] [--bin ./train_sdc_emu] DATA/train.bin
  --big adds llama3.2-1b and qwen3-0.6b at -n_layer 2 -vocab 4096 -seq 32 (minutes each)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"-B": 1, "-accum": 4, "-seq": 64, "-vocab": 256}
BIG = {"-B": 1, "-accum": 4, "-seq": 32, "-vocab": 4096, "-n_layer": 2}


def run(binary, preset, geo, protect, train):
    with tempfile.TemporaryDirectory() as out:
        cmd = [binary, "-preset", preset, "-train", train, "-steps", "2", "-lr", "1e-3", "-warmup", "1", "-eval_every", "0",
               "-save", "none", "-quiet", "-stats", "-protect", protect, "-out", out]
        for k, v in geo.items():
            cmd += [k, str(v)]
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        rows = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
        st = [r for r in rows if r.get("type") == "step" and r["step"] == 2][0]["stats"]
        return st, " ".join(f"{k} {v}" for k, v in geo.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("--presets", default="tiny-llama,tiny-qwen3")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--bin", default=os.path.join(ROOT, "train_sdc_emu"))
    a = ap.parse_args()
    runs = [(p, SMALL) for p in a.presets.split(",") if p]
    if a.big:
        runs += [("llama3.2-1b", BIG), ("qwen3-0.6b", BIG)]
    print("| preset | geometry | protect | launches | host syncs (in layer loops) | D2H copies | device MB | element-wise MB read / written |")
    print("|---|---|---|---|---|---|---|---|")
    for preset, geo in runs:
        for protect in ("none", "all"):
            st, g = run(a.bin, preset, geo, protect, a.train)
            ew = "—" if st["ew_read"] is None or st["ew_read"] + st["ew_written"] == 0 else f"{st['ew_read'] / 1e6:.2f} / {st['ew_written'] / 1e6:.2f}"
            print(f"| {preset} | {g} | {protect} | {st['launches']} | {st['syncs']} ({st['loop_syncs']}) | {st['d2h']} | "
                  f"{st['dev_bytes'] / 1e6:.1f} | {ew} |", flush=True)


if __name__ == "__main__":
    main()
