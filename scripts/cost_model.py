#!/usr/bin/env python3
"""cost_model.py: train_sdc's GPU speed and memory, PREDICTED from the code's own work accounting.

Nothing here is a measurement. For each configuration (preset, B, -accum, -protect) the GPU trainer runs one
training step under the CUDA emulation's cost-only mode (EMU_COST_ONLY=1: every launch is checked and
counted but not run, device memory is reserved but never touched; dev/cuda_emu/emu_runtime.cpp), with
-cost_out: the work records of that step, one a launch, as the launchers account them (component, unit,
FLOPs, bytes read and written, kernel, grid; llmc/cuda/cuda_common.cuh launch_account). The step is the
code's own schedule (model_forward_step / model_backward_step / model_update, every microbatch). This
script turns the records into time (docs/cost_model.md):

    t(launch) = max(FLOPs / (peak(unit) x eff(unit) x occ), bytes / (HBM x eff_hbm x occ)) + launch overhead
    occ       = min(1, grid / SMs) for a kernel (a block runs on one SM), 1 for a library call
    (a record marked "ride": blocks riding on another launch, ride_account: no launch overhead of its own)

and sums them (launches in one stream run one after another; the gradient all-reduces, which run on their own
stream overlapped with the backward, are listed but not added). MFU = model FLOPs / time / dense bf16 peak,
model FLOPs = (6 P + 12 L H hd T) x tokens (PaLM's convention, as llm.c and scripts/gpu_check.sh: P all
parameters, the attention term non-causal). Peak device memory is the emulator's counter (every cudaMalloc
of the run up to the end of the step; the CUDA context and the allocator's rounding are not in it).

One command regenerates everything (it builds train_sdc_emu first):
    python3 scripts/cost_model.py --md build/cost/cost_model.md --json build/cost/cost_model.json
and, after other changes land, against the committed snapshot of today's code:
    python3 scripts/cost_model.py --before docs/cost_model_before.json --md build/cost/after.md
A configuration the trainer refuses (e.g. -protect paper at B 8 x accum 1: the Residual Gain Guard needs
three observations a step) is reported as n/a with the trainer's own error line.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "dev"))

# Vendor datasheets (dense, no sparsity; SXM parts):
#  A100 SXM4 80GB: NVIDIA A100 Tensor Core GPU datasheet: BF16 tensor 312 TFLOP/s, FP32 19.5, FP64 9.7 (non-tensor),
#                  HBM2e 2,039 GB/s, NVLink 600 GB/s, 108 SMs.
#  H100 SXM5 80GB: NVIDIA H100 Tensor Core GPU datasheet: BF16 tensor 1,979 TFLOP/s with sparsity = 989.5 dense,
#                  FP32 67, FP64 34, HBM3 3.35 TB/s, NVLink 900 GB/s, 132 SMs.
#  H200 SXM 141GB: NVIDIA H200 datasheet: the H100's compute (989 dense bf16, 67 fp32, 34 fp64), HBM3e 4.8 TB/s,
#                  141 GB, NVLink 900 GB/s, 132 SMs.
# "net" is the NVLink bandwidth one GPU has to its peers (per direction: half the datasheet's bidirectional).
GPUS = {
    "A100": {"tc_bf16": 312e12, "fp32": 19.5e12, "fp64": 9.7e12, "hbm": 2.039e12, "net": 300e9, "sms": 108, "mem_gb": 80},
    "H100": {"tc_bf16": 989e12, "fp32": 67e12, "fp64": 34e12, "hbm": 3.35e12, "net": 450e9, "sms": 132, "mem_gb": 80},
    "H200": {"tc_bf16": 989e12, "fp32": 67e12, "fp64": 34e12, "hbm": 4.8e12, "net": 450e9, "sms": 132, "mem_gb": 141},
}
# Efficiencies (the share of a peak a launch of that kind reaches), and where each number comes from:
#  tc_bf16 0.70  cuBLASLt bf16 GEMMs of these shapes (k 2048..8192, m = B T) reach 70-80% of the dense peak on
#                A100/H100 in NVIDIA's and llm.c's published runs; 0.70 also covers the smaller dW / attention
#                GEMMs. scripts/gpu_check.sh's bench_matmul measures it (--eff tc_bf16=X replaces it).
#  fp32    0.40  the CUDA-core kernels with real arithmetic are the fused attention (shared-memory tiles, fp32
#                FMAs, no tensor cores): a hand-tiled SGEMM-like loop reaches 40-60% of the FP32 peak; 0.40
#                since these tiles are small (64 x 64) and include the online softmax.
#  fp64    0.50  the attention checks' double sums (CUDA cores); they are bound by their bytes anyway.
#  hbm     0.80  STREAM-like copy kernels reach 80-90% of the datasheet bandwidth on A100/H100.
#  net     0.80  NCCL ring all-reduce bus bandwidth on one NVLink node (nccl-tests) relative to the link rate.
EFF = {"tc_bf16": 0.70, "fp32": 0.40, "fp64": 0.50, "hbm": 0.80, "net": 0.80}
# Launch overhead a launch (s): back-to-back kernels on one stream without CUDA graphs run 2-4 us apart when
# the GPU is the bottleneck; cuBLASLt adds its host-side dispatch; an NCCL call ~10 us of latency.
LAUNCH_S = {"kernel": 3e-6, "cublasLtMatmul": 4e-6, "ncclAllReduce": 10e-6}

COMPONENTS = ["gemm", "attention", "norm", "elementwise", "classifier", "embedding", "optimizer", "allreduce"]
PROTECTION = ["qk", "rgg", "att", "qk_bwd", "att_bwd", "ew", "bound", "bwd", "exp", "fault", "detectors"]


def launch_time(r, g, eff):
    lib = r["kernel"] in ("cublasLtMatmul", "ncclAllReduce")
    occ = 1.0 if lib else min(1.0, r["grid"] / g["sms"])
    unit = r["unit"]
    nbytes = r["read"] + r["written"]
    if unit == "net":
        t = nbytes / 2 / (g["net"] * eff["net"])   # sent and received at once
    else:
        t = max(r["flops"] / (g[unit] * eff[unit] * occ), nbytes / (g["hbm"] * eff["hbm"] * occ))
    if r.get("ride"):   # blocks riding on another launch (ride_account): their work, no launch of their own
        return t
    return t + LAUNCH_S.get(r["kernel"], LAUNCH_S["kernel"])


def read_records(path):
    head, recs = None, []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if d.get("type") == "header":
                head = d
            else:
                recs.append(d)
    if head is None or head["records"] != len(recs):
        raise SystemExit(f"error: {path}: not a complete -cost_out file")
    return head, recs


def model_flops_per_token(h):
    return 6.0 * h["params"] + 12.0 * h["n_layer"] * h["n_head"] * h["head_dim"] * h["T"]


def predict(head, recs, gpu, eff):
    g = GPUS[gpu]
    comp, total = {}, 0.0
    for r in recs:
        t = launch_time(r, g, eff)
        comp[r["comp"]] = comp.get(r["comp"], 0.0) + t
        if r["comp"] != "allreduce":   # the buckets' all-reduces run on their own stream, overlapped with the backward
            total += t
    tokens = head["B"] * head["T"] * head["accum"]
    mfu = model_flops_per_token(head) * tokens / total / g["tc_bf16"]
    return {"ms": total * 1e3, "tok_s": tokens / total, "mfu": mfu, "comp_ms": {k: v * 1e3 for k, v in comp.items()}}


def presets_from_config():
    """name -> (vocab, seq) from llmc/host/config.h's preset table"""
    src = open(os.path.join(ROOT, "llmc/host/config.h")).read()
    out = {}
    for m in re.finditer(r'\{"([\w.\-]+)",\s*\{"[\w.\-]+",\s*([0-9,\s]+)', src):
        nums = [int(x) for x in m.group(2).replace("\n", " ").split(",") if x.strip()]
        if len(nums) >= 8:
            out[m.group(1)] = (nums[6], nums[7])
    return out


class Runner:
    def __init__(self, emu, work, seq):
        self.emu, self.work, self.seq = emu, work, seq
        self.presets = presets_from_config()
        os.makedirs(work, exist_ok=True)
        self.n = 0

    def shard(self, preset):
        vocab = self.presets[preset][0]
        path = os.path.join(self.work, f"synthetic_{vocab}.bin")
        if not os.path.exists(path):   # random tokens of the preset's vocabulary: the cost does not depend on them
            import numpy as np
            import tsdc_io
            tsdc_io.write_shard(path, np.random.default_rng(0).integers(0, vocab, size=600000), vocab)
        return path

    def run(self, preset, B, accum, protect):
        """(header, records) of one cost-only step, or (None, the trainer's error line)"""
        if preset not in self.presets:
            raise SystemExit(f"error: preset {preset} is not in llmc/host/config.h")
        self.n += 1
        out = os.path.join(self.work, f"run_{self.n}")
        shutil.rmtree(out, ignore_errors=True)
        rec = os.path.join(self.work, f"{preset}_B{B}_a{accum}_{protect}.jsonl")
        cmd = [self.emu, "-preset", preset, "-train", self.shard(preset), "-B", str(B), "-accum", str(accum), "-steps", "1",
               "-save", "none", "-quiet", "-out", out, "-protect", protect, "-cost_out", rec]
        if self.seq:
            cmd += ["-seq", str(self.seq)]
        env = dict(os.environ, EMU_COST_ONLY="1", OMP_NUM_THREADS="1")
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        shutil.rmtree(out, ignore_errors=True)
        if p.returncode != 0:
            err = [ln for ln in p.stderr.splitlines() if ln.startswith("error")]
            return None, (err[-1] if err else f"exit {p.returncode}")
        return read_records(rec)


def fmt_cell(p):
    return f"{p['ms']:.1f} ms, {p['tok_s'] / 1e3:.1f}k tok/s, {100 * p['mfu']:.1f}% MFU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emu", default=os.path.join(ROOT, "train_sdc_emu"), help="the emulated GPU trainer (built unless --no-build)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--work", default=os.path.join(ROOT, "build/cost"), help="records and synthetic shards (default build/cost)")
    ap.add_argument("--presets", default="llama3.2-1b,qwen3-0.6b")
    ap.add_argument("--configs", default="8x1,1x8", help="BxACCUM list (default 8x1,1x8)")
    ap.add_argument("--protects", default="none,paper,all")
    ap.add_argument("--gpus", default="A100,H100,H200")
    ap.add_argument("--seq", type=int, default=0, help="-seq for every run (default: the preset's, 1024)")
    ap.add_argument("--mem-bs", default="1,2,4,8,16", help="B values whose peak device memory is listed (-protect none, accum 1)")
    ap.add_argument("--mem-caps", default="40,80,141", help="GB (10^9 bytes) for the largest B that fits")
    ap.add_argument("--no-mem", action="store_true", help="skip the peak-memory search (small presets: their largest B is huge)")
    ap.add_argument("--eff", action="append", default=[], help="UNIT=X replaces an efficiency (tc_bf16, fp32, fp64, hbm, net)")
    ap.add_argument("--md", help="write the markdown tables here (also printed)")
    ap.add_argument("--json", help="write the predictions as JSON here")
    ap.add_argument("--before", help="a JSON of an earlier run: its ms/step beside this one's")
    a = ap.parse_args()
    eff = dict(EFF)
    for e in a.eff:
        k, _, v = e.partition("=")
        if k not in eff:
            raise SystemExit(f"error: --eff {e}: unit {k} is not one of {', '.join(eff)}")
        eff[k] = float(v)
    gpus = a.gpus.split(",")
    for gname in gpus:
        if gname not in GPUS:
            raise SystemExit(f"error: --gpus: {gname} is not one of {', '.join(GPUS)}")
    if not a.no_build:
        subprocess.run(["make", "-j2", "train_sdc_emu"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    if not os.access(a.emu, os.X_OK):
        raise SystemExit(f"error: --emu {a.emu}: not an executable (make train_sdc_emu)")
    before = json.load(open(a.before)) if a.before else None
    R = Runner(a.emu, a.work, a.seq)
    configs = []
    for c in a.configs.split(","):
        B, _, acc = c.partition("x")
        configs.append((int(B), int(acc or 1)))
    rows = []
    for preset in a.presets.split(","):
        for B, acc in configs:
            for prot in a.protects.split(","):
                head, recs = R.run(preset, B, acc, prot)
                row = {"preset": preset, "B": B, "accum": acc, "protect": prot}
                if head is None:
                    row["na"] = recs
                else:
                    row["T"] = head["T"]
                    row["launches"] = head["launches"] + head["gemms"]
                    row["peak_device_bytes"] = head["peak_device_bytes"]
                    row["pred"] = {gname: predict(head, recs, gname, eff) for gname in gpus}
                rows.append(row)
    mem = []
    caps = [float(x) for x in a.mem_caps.split(",")]
    for preset in ([] if a.no_mem else a.presets.split(",")):
        for prot in ("none", "all"):
            peaks = {}
            def peak(B):
                if B not in peaks:
                    head, recs = R.run(preset, B, 1 if prot == "none" else 3, prot)
                    peaks[B] = head["peak_device_bytes"] if head else None
                return peaks[B]
            for B in [int(x) for x in a.mem_bs.split(",")]:
                peak(B)
            fits = {}
            p1, p2 = peak(1), peak(2)
            for cap in caps:
                if p1 is None or p1 > cap * 1e9:
                    fits[cap] = 0
                    continue
                b = max(1, int((cap * 1e9 - p1) / (p2 - p1)) + 1) if p2 and p2 > p1 else 1   # affine in B: a guess ...
                while b > 1 and (peak(b) is None or peak(b) > cap * 1e9):                      # ... checked by runs
                    b -= 1
                while peak(b + 1) is not None and peak(b + 1) <= cap * 1e9:
                    b += 1
                fits[cap] = b
            mem.append({"preset": preset, "protect": prot, "accum": 1 if prot == "none" else 3,
                        "peaks": {str(k): v for k, v in sorted(peaks.items())}, "largest_B": {f"{c:g}": v for c, v in fits.items()}})
    res = {"gpus": {gname: GPUS[gname] for gname in gpus}, "eff": eff, "launch_s": LAUNCH_S, "rows": rows, "memory": mem}
    md = render(res, gpus, before, [int(x) for x in a.mem_bs.split(",")], caps)
    print(md)
    if a.md:
        os.makedirs(os.path.dirname(os.path.abspath(a.md)), exist_ok=True)
        open(a.md, "w").write(md)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        json.dump(res, open(a.json, "w"), indent=1, sort_keys=True)


def kinds_of(protect):
    """the -protect kinds a value names (llmc/sdc/checks.h: paper = qk, rgg, exp; all = every kind)"""
    if protect == "all":
        return set(PROTECTION[:8]) | {"exp"}
    if protect == "paper":
        return {"qk", "rgg", "exp"}
    return set() if protect == "none" else set(protect.split(","))


def render(res, gpus, before, mem_bs, caps):
    L = ["**Predicted by the cost model (scripts/cost_model.py), not measured.**", ""]
    bmap = {}
    if before:
        for r in before["rows"]:
            bmap[(r["preset"], r["B"], r["accum"], r["protect"])] = r
    L.append("| preset | B x accum | -protect | " + " | ".join(f"{g} predicted" for g in gpus) +
             (" | H200 before" if before else "") + " | measured |")
    L.append("|---|---|---|" + "---|" * len(gpus) + ("---|" if before else "") + "---|")
    for r in res["rows"]:
        cells = ["n/a"] * len(gpus) if "na" in r else [fmt_cell(r["pred"][g]) for g in gpus]
        line = f"| {r['preset']} | {r['B']} x {r['accum']} | {r['protect']} | " + " | ".join(cells)
        if before:
            b = bmap.get((r["preset"], r["B"], r["accum"], r["protect"]))
            line += " | " + (fmt_cell(b["pred"]["H200"]) if b and "pred" in b and "H200" in b["pred"] else "n/a")
        L.append(line + " | not yet |")
    nas = [r for r in res["rows"] if "na" in r]
    if nas:
        L.append("")
        for r in nas:
            L.append(f"- n/a: {r['preset']} B {r['B']} x accum {r['accum']} -protect {r['protect']}: the trainer refuses it "
                     f"(`{r['na']}`)")
    g = "H200" if "H200" in gpus else gpus[-1]
    L += ["", f"Where the time goes, {g}, ms a step (each launch in its component; the protection kinds are the launches "
          "that exist only because the kind is on):", ""]
    comps = COMPONENTS + PROTECTION
    used = [c for c in comps if any("pred" in r and c in r["pred"][g]["comp_ms"] for r in res["rows"])]
    used += sorted({c for r in res["rows"] if "pred" in r for c in r["pred"][g]["comp_ms"]} - set(used))
    L.append("| preset | B x accum | -protect | launches | " + " | ".join(used) + " | total |")
    L.append("|---|---|---|---|" + "---|" * len(used) + "---|")
    for r in res["rows"]:
        if "pred" not in r:
            continue
        p = r["pred"][g]
        L.append(f"| {r['preset']} | {r['B']} x {r['accum']} | {r['protect']} | {r['launches']} | " +
                 " | ".join(f"{p['comp_ms'].get(c, 0.0):.2f}" for c in used) + f" | {p['ms']:.1f} |")
    L += ["", f"Protection on {g}: each kind's own launches, and the whole step against -protect none (which also "
          "holds what protection changes in the model's own launches: e.g. -protect att and att_bwd run the fused attention "
          "kernels' row-sum variants):", ""]
    L.append("| preset | B x accum | -protect | " + " | ".join(PROTECTION[:8]) + " | step vs none |")
    L.append("|---|---|---|" + "---|" * len(PROTECTION[:8]) + "---|")
    base = {(r["preset"], r["B"], r["accum"]): r for r in res["rows"] if r["protect"] == "none" and "pred" in r}
    for r in res["rows"]:
        if r["protect"] == "none":
            continue
        b = base.get((r["preset"], r["B"], r["accum"]))
        if "pred" not in r or not b:
            L.append(f"| {r['preset']} | {r['B']} x {r['accum']} | {r['protect']} | " + " | ".join(["n/a"] * len(PROTECTION[:8])) + " | n/a |")
            continue
        p, q = r["pred"][g], b["pred"][g]
        on = kinds_of(r["protect"])   # a kind on without a launch of its own (folded into other kernels): 0
        L.append(f"| {r['preset']} | {r['B']} x {r['accum']} | {r['protect']} | " +
                 " | ".join(f"{100 * p['comp_ms'][c] / q['ms']:.2f}%" if c in p["comp_ms"] else ("0 (in kernels)" if c in on else "-")
                            for c in PROTECTION[:8]) + f" | {100 * (p['ms'] / q['ms'] - 1):+.1f}% |")
    L += ["", "Peak device memory (the emulator's counter: every cudaMalloc up to the end of the first step; the CUDA "
          "context, ~0.5 GB, is not in it), GB, and the largest B that fits:", ""]
    L.append("| preset | -protect | " + " | ".join(f"B {b}" for b in mem_bs) + " | " +
             " | ".join(f"largest B in {c:g} GB" for c in caps) + " |")
    L.append("|---|---|" + "---|" * (len(mem_bs) + len(caps)))
    for m in res["memory"]:
        L.append(f"| {m['preset']} | {m['protect']} (accum {m['accum']}) | " +
                 " | ".join(f"{m['peaks'][str(b)] / 1e9:.1f}" if m["peaks"].get(str(b)) else "n/a" for b in mem_bs) + " | " +
                 " | ".join(str(m["largest_B"][f"{c:g}"]) for c in caps) + " |")
    L += ["", "Rates: " + "; ".join(f"{k} {v['tc_bf16'] / 1e12:g} TFLOP/s bf16, {v['fp32'] / 1e12:g} fp32, {v['hbm'] / 1e12:g} TB/s"
                                     for k, v in res["gpus"].items()) +
          ". Efficiencies: " + ", ".join(f"{k} {v:g}" for k, v in res["eff"].items()) +
          f"; launch overhead {LAUNCH_S['kernel'] * 1e6:g} us a kernel, {LAUNCH_S['cublasLtMatmul'] * 1e6:g} us a GEMM.", ""]
    return "\n".join(L)


if __name__ == "__main__":
    main()
