"""The work accounting of the GPU trainer (launch_account / ew_account at every launcher, llmc/cuda/cuda_common.cuh),
its -cost_out records, the emulator's cost-only mode (EMU_COST_ONLY=1, dev/cuda_emu/emu_runtime.cpp) and
scripts/cost_model.py (docs/cost_model.md).

- The GEMM FLOPs and bytes of a step equal 2 m n k (A, B read, C written) summed over the projections' shapes,
  recomputed here from the preset's dimensions (forward, dx and dW of every linear layer and the tied lm
  head), and the records of known element-wise kernels carry their documented bytes.
- A cost-only step records exactly the launch sequence (kernel, grid, component, FLOPs, bytes) of a real
  emulated step of the same configuration: the cost run is the code's own schedule.
- Every kernel launch and cuBLASLt call the emulator counts in the window has its record (the trainer
  refuses to write the file otherwise).
- The script runs end to end on a tiny preset: n/a for a configuration the trainer refuses, the times'
  components add up, the MFU is the model FLOPs over the time and the peak, memory grows with B.
Cheap: tiny-llama, -vocab 256, -seq 32, two layers."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
import tsdc_io  # noqa: E402

EMU = os.path.join(ROOT, "train_sdc_emu")
CPU = os.path.join(ROOT, "train_sdc")
pytestmark = pytest.mark.skipif(not os.path.exists(EMU), reason="train_sdc_emu not built (make emu)")

# tiny-llama (llmc/host/config.h) with the overrides below
L, D, H, KV, HD, F, V, T = 2, 128, 4, 2, 32, 384, 256, 32


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    p = tmp_path_factory.mktemp("cost") / "train.bin"
    tsdc_io.write_shard(str(p), np.random.default_rng(1).integers(0, V, size=4000), V)
    return str(p)


def cost_run(tmp, shard, B, accum, protect, cost_only=True, extra=()):
    rec = os.path.join(tmp, f"rec_{B}_{accum}_{protect}_{int(cost_only)}.jsonl")
    out = os.path.join(tmp, f"out_{B}_{accum}_{protect}_{int(cost_only)}")
    env = dict(os.environ, OMP_NUM_THREADS="1", EMU_COST_ONLY="1" if cost_only else "0")
    cmd = [EMU, "-preset", "tiny-llama", "-n_layer", str(L), "-vocab", str(V), "-seq", str(T), "-train", shard, "-B", str(B),
           "-accum", str(accum), "-steps", "1", "-save", "none", "-quiet", "-out", out, "-protect", protect, "-cost_out", rec, *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in open(rec)]
    return lines[0], lines[1:]


def test_gemm_flops_and_bytes_are_2mnk_of_the_step(tmp_path, shard):
    B, accum = 2, 1
    head, recs = cost_run(str(tmp_path), shard, B, accum, "none")
    N = B * T * accum
    qd, kd = H * HD, KV * HD
    # the linear layers (rows N, in, out): the fused q/k/v, o, the fused gate/up, down per layer, the tied lm head
    lin = [(D, qd + 2 * kd), (qd, D), (D, 2 * F), (F, D)] * L + [(D, V)]
    fwd = sum(2 * N * i * o for i, o in lin)
    gemm = [r for r in recs if r["kernel"] == "cublasLtMatmul"]
    assert all(r["comp"] == "gemm" and r["unit"] == "tc_bf16" for r in gemm)   # the fused attention has no GEMM
    assert len(gemm) == 3 * len(lin)                                           # forward, dx, dW
    assert sum(r["flops"] for r in gemm) == 3 * fwd
    # bytes: forward y = x W^T (x, W in, bf16 y out), the forward's GEMMs first, in the layers' order
    fwd_bytes = sum(N * i * 2 + i * o * 2 + N * o * 2 for i, o in lin)
    assert [r["read"] + r["written"] for r in gemm[:len(lin)]] == [N * i * 2 + i * o * 2 + N * o * 2 for i, o in lin]
    assert sum(r["read"] + r["written"] for r in gemm) > 3 * fwd_bytes * 0.9
    # known element-wise kernels: swiglu forward reads gate and up, writes act and prod (bf16 [N, F]) once a layer
    sw = [r for r in recs if r["kernel"] == "swiglu_forward_kernel"]
    assert len(sw) == L and all(r["read"] == 2 * 2 * N * F and r["written"] == 2 * 2 * N * F for r in sw)
    ce = [r for r in recs if r["kernel"] == "crossentropy_fused_kernel"]   # losses and dlogits in one pass over the logits
    assert len(ce) == 1 and ce[0]["read"] == N * V * 2 + N * 4 and ce[0]["written"] == N * V * 2 + N * 8 and ce[0]["comp"] == "classifier"
    opt = [r for r in recs if r["kernel"] == "adamw_multi_tensor_kernel"]
    assert len(opt) == 1 and opt[0]["read"] == 16 * head["params"] and opt[0]["written"] == 14 * head["params"]
    assert head["launches"] == head["emu_launches"] and head["gemms"] == head["emu_gemms"]


def test_cost_only_step_is_the_real_steps_launch_sequence(tmp_path, shard):
    """one attempt of one step under -protect all (every kind, both trainers), 3 microbatches"""
    h1, real = cost_run(str(tmp_path), shard, 1, 3, "all", cost_only=False)
    h2, co = cost_run(str(tmp_path), shard, 1, 3, "all", cost_only=True)
    assert h1["cost_only"] == 0 and h2["cost_only"] == 1
    assert len(real) == len(co) == h1["records"]
    assert real == co
    assert h1["peak_device_bytes"] == h2["peak_device_bytes"]
    comps = {r["comp"] for r in co}
    assert {"gemm", "attention", "norm", "elementwise", "classifier", "embedding", "optimizer", "qk", "rgg", "att"} <= comps
    assert {"qk_bwd", "att_bwd", "bound"} <= comps, comps
    # -protect ew: inside the element-wise kernels (llmc/sdc/ewdup.cuh), no launch of its own on a clean step; the
    # duplicated variants run in their place
    assert "ew" not in comps, comps
    dup = {r["kernel"] for r in co if r["kernel"].endswith("_dup")}
    assert {"residual_rmsnorm_forward_kernel_dup", "swiglu_forward_kernel_dup", "swiglu_backward_kernel_dup",
            "rmsnorm_backward_dx_kernel_dup"} <= dup, dup
    # -protect bound: no check launch of its own on a clean step: v on the launch that rotates q and k, o and down inside
    # the residual adds and norms that read them, gate and up inside SwiGLU's forward; no input-norm launch either
    assert sum(r["kernel"] in ("mmb_check_kernel", "mmb_row_norms_kernel") for r in co) == 0
    # the weights' row norms once a step, made by the optimizer's launch as it writes the bf16 weights (multi_tensor.cuh
    # MtRows): riding work, no pass of their own after the first step
    assert sum(r["kernel"] == "mmb_row_norms_jobs_kernel" for r in co) == 0
    rides = [r for r in co if r["kernel"] == "adamw_row_norms_ride"]
    assert len(rides) == 1 and rides[0]["comp"] == "bound" and rides[0].get("ride"), rides
    # -protect qk_bwd's rerun of the flash backward: dq and dk alone, one launch a layer a microbatch; -protect att_bwd on
    # the flash backward: its row checks and the dV check, riding on the RoPE backward's launch a layer a microbatch
    assert sum(r["kernel"] == "flash_attention_backward_dqdk_kernel" and r["comp"] == "qk_bwd" for r in co) == L * 3
    # ... with RoPE's backward and the fingerprints in its epilogue: no other qk_bwd launch on a clean step
    assert [r["kernel"] for r in co if r["comp"] == "qk_bwd"] == ["flash_attention_backward_dqdk_kernel"] * (L * 3)
    assert [r["kernel"] for r in co if r["comp"] == "att_bwd"] == ["attbwd_fused_ride"] * (L * 3)
    assert all(r.get("ride") == 1 for r in co if r["comp"] == "att_bwd")   # extra blocks of the RoPE backward's launch
    # -protect qk's recomputation: one GEMM over [wq; wk] labelled qk, one a layer a microbatch
    assert sum(r["kernel"] == "cublasLtMatmul" and r["comp"] == "qk" for r in co) == L * 3
    # every RMSNorm backward's weight gradient rides on its dx launch (two norms a layer and the final one, a microbatch):
    # no dw launch of its own
    assert sum(r["kernel"] == "rmsnorm_dw_partial_kernel" for r in co) == 0
    dw = [r for r in co if r["kernel"] == "rmsnorm_dw_partial_ride"]
    assert len(dw) == (2 * L + 1) * 3 and all(r.get("ride") == 1 and r["comp"] == "norm" for r in dw)


def test_qwen3_backward_qk_norm_and_rope_in_one_launch(tmp_path, shard):
    """tiny-qwen3 under -protect all: the first pass's RoPE and QK-norm backward of q and k is one launch a layer a
    microbatch (fingerprinting, with the backward attention checks and both norms' dw riding on it): no RoPE backward
    and no QK-norm dx launch of their own"""
    h, co = cost_run(str(tmp_path), shard, 1, 3, "all", extra=("-preset", "tiny-qwen3"))
    assert sum(r["kernel"] == "rope_qknorm_backward_kernel_fp" for r in co) == L * 3
    assert sum(r["kernel"].startswith("rope_kernel") for r in co) == 0   # the forward's RoPE is the fused norm + RoPE kernel
    assert sum(r["kernel"] == "rmsnorm_backward_dx_kernel_fp" for r in co) == 0
    # rides: both QK norms' dw and the two block norms' a layer, the final norm's; the attention checks a layer
    assert sum(r["kernel"] == "rmsnorm_dw_partial_ride" for r in co) == (4 * L + 1) * 3
    assert sum(r["kernel"] == "attbwd_fused_ride" for r in co) == L * 3


def test_cpu_trainer_refuses_cost_out(tmp_path, shard):
    if not os.path.exists(CPU):
        pytest.skip("train_sdc not built")
    p = subprocess.run([CPU, "-preset", "tiny-llama", "-vocab", str(V), "-seq", str(T), "-train", shard, "-steps", "1", "-save", "none",
                        "-out", str(tmp_path / "o"), "-cost_out", str(tmp_path / "c.jsonl")], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "-cost_out" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_cost_model_script_end_to_end(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import cost_model
    js = tmp_path / "c.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "cost_model.py"), "--no-build", "--work", str(tmp_path / "w"),
                        "--presets", "tiny-llama", "--configs", "2x1,1x3", "--seq", "64", "--mem-bs", "1,2,4", "--mem-caps", "0.075,0.1",
                        "--json", str(js), "--md", str(tmp_path / "c.md")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    res = json.load(open(js))
    md = open(tmp_path / "c.md").read()
    assert "not measured" in md and "not yet" in md
    rows = {(r["B"], r["accum"], r["protect"]): r for r in res["rows"]}
    assert "Residual Gain Guard" in rows[(2, 1, "paper")]["na"]   # refused by the trainer: n/a, not a number
    for key in ((2, 1, "none"), (1, 3, "none"), (1, 3, "paper"), (1, 3, "all")):
        r = rows[key]
        for g, pr in r["pred"].items():
            assert abs(sum(v for k, v in pr["comp_ms"].items() if k != "allreduce") - pr["ms"]) < 1e-6 * pr["ms"]
            P = 8192 * 128 + 128 + 4 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 384 + 2 * 128)   # tiny-llama, tied
            tokens = r["B"] * r["accum"] * 64
            mfu = (6 * P + 12 * 4 * 4 * 32 * 64) * tokens / (pr["ms"] / 1e3) / cost_model.GPUS[g]["tc_bf16"]
            assert abs(mfu - pr["mfu"]) < 1e-9
        assert r["pred"]["H200"]["ms"] <= r["pred"]["H100"]["ms"] <= r["pred"]["A100"]["ms"]
    assert rows[(1, 3, "paper")]["pred"]["H200"]["comp_ms"]["qk"] > 0
    m = [x for x in res["memory"] if x["protect"] == "none"][0]
    pk = [m["peaks"][b] for b in ("1", "2", "4")]
    assert pk[0] < pk[1] < pk[2]
    for cap, b in m["largest_B"].items():   # the largest B that fits: it fits, B + 1 does not
        assert m["peaks"][str(b)] <= float(cap) * 1e9 < m["peaks"][str(b + 1)]
