#!/usr/bin/env python3
"""The reproduction of the paper's evaluation (Section 5, Appendix A.2-A.3): every run, then REPORT.md
with Tables 1, 2, 3, 5, 6 and Figures 3 and 5 in the paper's layout, the paper's numbers beside ours.
scripts/reproduce.sh is the front door; see its header for the presets.

Runs (each model; all but the pre-training resume from one common checkpoint, as the paper's resume
from step 1221, and use the same data order; a faulty and a protected run share one campaign):
  pre          clean pre-training to the common checkpoint (checkpoints along the way: Figure 5); its
               last `cal` steps calibrate the Residual Gain Guard
  clean        fault-free reference, detector features observed (-detect_observe: no effect on the math)
  clean_prot   fault-free, TrainSDC on (Table 5's clean false-positive rate)
  <method>_m<M>   the campaign at m elements an event (one event a step, site/pass/rank/microbatch/layer drawn)
               for Fault, Loss spike, Inf/NaN, ATTNChecker, Harmful-update, LLMFT, TrainSDC (Table 1), its
               components alone (Table 2), TrainSDC + the cheap attention checks (beyond the paper)
  llmft_train  the learned detector's training campaign (another fault seed; features observed)
  alpha<A>_*   Table 3: -protect rgg at alpha A: 200 held-out clean steps, 48 + 48 residual-path events
  peers_*      single process (1 rank x 3 microbatches) against 3 MPI ranks x 1 microbatch (issue 5)
  expk<K>      Figure 3: exponent scaling alone at k = K under backward faults
  profile      clean exponent profile at the common checkpoint (R_amp for Figure 3); prof_<step> at every
               pre-training checkpoint (Figure 5)
  overhead     fault-free step time of every method, measured one after another (not in parallel)

Every run is skipped when its log already ends at its last step, so an interrupted job resumes."""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import sdc_metrics as sm  # noqa: E402
import expscale_select as es  # noqa: E402

PRESETS = {
    # the continuation regime (issue 12, item 7), the paper's: a pre-trained model (base: 300 steps at lr
    # 2e-3, warmup 30, cosine to 10%) continued with a fresh AdamW at lr 2e-4 (warmup 30, cosine to 10% over
    # 300 steps), faults after its step 200; measured and justified in REPORT.md
    "tiny": dict(models=["tiny-llama", "tiny-qwen3"], trainer="./train_sdc", ranks=1, B=4, T=128, accum=3,
                 lr=2e-4, warmup=30, pre=200, cal=100, window=100, eval_tokens=8192, precision="bf16",
                 base=300, base_lr=2e-3,
                 m={"tiny-llama": (10, 31, 3125), "tiny-qwen3": (10, 62, 6250)},
                 alpha_clean=200, alpha_events=48, fig3_k=9, jobs=2, threads=1, overhead_steps=30, overhead_rounds=3,
                 ckpt_every=20, peers=True, profile_steps=4),
    # what fits a shared, oversubscribed 2-core machine in about an hour (issue 12): tiny-llama, m = 10, a
    # 60-step window, every Table 1 method and Table 2 in both fault dtypes, and Figure 3 over 5 values of k
    # in both; no alpha sweep, peers, Figure 5 or overhead pass (scripts/reproduce.sh --preset tiny --reduced). The regime is the paper's:
    # a pre-trained model (the main job's common checkpoint, step 300 of tiny-llama's recipe: run
    # scripts/sdc_compare.sh first) continued with a fresh AdamW at a low learning rate (2e-4, 10x below the
    # pre-training's peak; warmup 30, cosine to 10% over 190 steps), faults from step 131
    "tiny_reduced": dict(models=["tiny-llama"], trainer="./train_sdc", ranks=1, B=4, T=128, accum=3,
                         lr=2e-4, warmup=30, pre=130, cal=66, window=60, eval_tokens=8192, precision="bf16",
                         init="out/sdc_compare/pre/step_000300.ckpt",
                         m={"tiny-llama": (10, 31, 3125)}, reduced=True, pre_threads=2,
                         alpha_clean=200, alpha_events=48, fig3_k=5, jobs=3, threads=1, overhead_steps=30, overhead_rounds=3,
                         ckpt_every=100, peers=False, profile_steps=4),
    "smoke": dict(models=["tiny-llama"], trainer="./train_sdc", ranks=1, B=2, T=64, accum=3,
                  lr=2e-3, warmup=10, pre=130, cal=66, window=12, eval_tokens=1024, precision="bf16",
                  m={"tiny-llama": (10, 31, 1562)},
                  alpha_clean=8, alpha_events=4, fig3_k=3, jobs=2, threads=1, overhead_steps=6, overhead_rounds=1,
                  ckpt_every=65, peers=True, profile_steps=1, fidelity_k=False, fidelity=["fault", "ours_all"]),
    # the paper's settings on 6 GPU ranks (B 1 x T 1024 x accum 8, lr 5e-5, warmup
    # 100, common checkpoint 1221, end 2035, 10 / 1,000 / 100,000 elements)
    "paper": dict(models=["llama3.2-1b", "qwen3-0.6b"], trainer="./train_sdc_cu", ranks=6, B=1, T=1024, accum=8,
                  lr=5e-5, warmup=100, pre=1221, cal=100, window=814, eval_tokens=614400, precision="bf16",
                  m={"llama3.2-1b": (10, 1000, 100000), "qwen3-0.6b": (10, 1000, 100000)},
                  alpha_clean=200, alpha_events=48, fig3_k=9, jobs=1, threads=0, overhead_steps=100, overhead_rounds=2,
                  ckpt_every=100, peers=False, profile_steps=12),
}
METHODS = [  # Table 1 rows: name, label, flags (besides the campaign)
    ("fault", "Fault", ["-detect", "loss,nan,harmful", "-detect_observe", "1"]),
    ("loss", "Loss spike", ["-detect", "loss"]),
    ("nan", "Inf/NaN", ["-detect", "nan"]),
    ("abft", "ATTNChecker", ["-detect", "abft"]),
    ("harmful", "Harmful-update", ["-detect", "harmful"]),
    ("llmft", "LLMFT", ["-detect", "llmft"]),
    ("ours", "TrainSDC (ours)", ["-protect", "paper"]),
]
ABLATION = [("qk", "Q/K path only", ["-protect", "qk"]), ("rgg", "Residual only", ["-protect", "rgg"]),
            ("exp", "Exponent scaling only", ["-protect", "exp"]), ("ours", "Complete", ["-protect", "paper"])]
EXTRA = [("ours_att", "TrainSDC + attention checks", ["-protect", "paper,att"]),
         ("ours_att_nan", "TrainSDC + attention checks + replay on Inf/NaN", ["-protect", "paper,att", "-detect", "nan"]),
         ("ours_att_harmful", "TrainSDC + attention checks + harmful-update guard", ["-protect", "paper,att", "-detect", "nan,harmful"]),
         ("ours_all", "-protect all (ours: + attention checks, backward guard, k from the run's profile)", ["-protect", "all"])]
# issue 12, item 6: the paper's models ran under PyTorch autocast; these rows again with -fault_dtype autocast
FIDELITY = ["fault", "nan", "ours", "ours_all", "qk", "rgg", "exp"]
RESIDUAL_SITES = "o_proj,attn_residual,down_proj,block_out"
ALPHAS = [1.0, 1.5, 2.0, 2.5, 3.0]
SEED_EVAL, SEED_LLMFT, SEED_ALPHA, SEED_FIG3 = 2026, 777, 4242, 99

# the paper's numbers (Tables 1, 2, 3, 5, 6; "-" where it reports none)
PAPER_T1 = {
    "Llama 3.2-1B": {"Fault": ("0.00 / 0.00", "+1.72e-2 / nonfinite", "1.23e-1 / nonfinite", "4.04 / -", "94.20 / -", "0.69 / -"),
                     "Loss spike": ("~0 / ~0", "+1.72e-2 / +1.15e-1", "1.24e-1 / 2.84e-1", "4.03 / 27.60", "94.40 / 82.60", "0.692 / 2.10"),
                     "Inf/NaN": ("~0 / ~0", "+1.72e-2 / +1.18e-1", "1.23e-1 / 4.28e-1", "4.04 / 28.60", "94.20 / 82.20", "0.69 / 2.15"),
                     "ATTNChecker": ("7.65 / 7.65", "+1.75e-2 / +1.07e-1", "3.73e-2 / 3.86e-1", "4.07 / 25.40", "94.30 / 83.40", "0.692 / 2.00"),
                     "Harmful-update": ("12.10 / 12.10", "+1.08e-2 / +5.37e-3", "1.15e-1 / 1.57e-1", "2.49 / 1.25", "95.00 / 96.90", "0.510 / 0.480"),
                     "LLMFT": ("13.50 / 13.50", "+1.68e-2 / +9.43e-2", "9.37e-2 / 2.42e-1", "3.86 / 22.20", "94.50 / 84.60", "0.679 / 1.84"),
                     "TrainSDC (ours)": ("1.65 / 1.65", "-3.86e-5 / +6.32e-4", "2.86e-4 / 9.14e-3", "-3.37e-3 / 0.173", "99.10 / 98.60", "2.83e-2 / 0.149")},
    "Qwen3 0.6B": {"Fault": ("0.00 / 0.00", "+2.30e-2 / nonfinite", "9.65e-2 / nonfinite", "5.43 / -", "93.10 / -", "0.69 / -"),
                   "Loss spike": ("~0 / ~0", "+2.17e-2 / +1.25e-1", "9.59e-2 / 2.82e-1", "5.24 / 36.30", "93.60 / 81.80", "0.677 / 2.60"),
                   "Inf/NaN": ("~0 / ~0", "+2.30e-2 / +1.27e-1", "9.65e-2 / 3.21e-1", "5.43 / 36.90", "93.10 / 81.70", "0.690 / 2.67"),
                   "ATTNChecker": ("36.70 / 36.70", "+2.10e-2 / +1.26e-1", "2.67e-2 / 2.93e-1", "5.06 / 37.10", "93.70 / 81.70", "0.656 / 2.69"),
                   "Harmful-update": ("11.20 / 11.20", "+1.39e-2 / +3.82e-3", "8.85e-2 / 1.56e-1", "3.24 / 1.14", "94.50 / 97.90", "0.471 / 0.361"),
                   "LLMFT": ("5.62 / 5.62", "+2.17e-2 / +1.05e-1", "7.06e-2 / 2.48e-1", "5.33 / 29.50", "93.60 / 84.20", "0.676 / 2.25"),
                   "TrainSDC (ours)": ("6.76 / 6.76", "+3.87e-6 / +6.15e-4", "2.22e-4 / 1.48e-2", "-1.25e-3 / 0.175", "99.10 / 98.80", "2.16e-2 / 0.109")},
}
PAPER_T2 = {"Llama": {"Q/K path only": ("+1.69e-2 / +9.03e-2", "4.00 / 21.70"), "Residual only": ("+1.44e-2 / +9.02e-2", "3.37 / 21.40"),
                      "Exponent scaling only": ("+3.03e-4 / Inf", "7.28e-2 / -"), "Complete": ("-3.86e-5 / +6.32e-4", "-3.37e-3 / 0.173")},
            "Qwen": {"Q/K path only": ("+2.15e-2 / +1.02e-1", "5.22 / 28.50"), "Residual only": ("+1.98e-2 / +1.04e-1", "4.59 / 29.10"),
                     "Exponent scaling only": ("+1.12e-3 / Inf", "0.250 / -"), "Complete": ("+3.87e-6 / +6.15e-4", "-1.25e-3 / 0.175")}}
PAPER_T3 = {"Llama 3.2-1B": ["33/200 (16.5%) | 48/48 | 48/48", "3/200 (1.5%) | 17/48 | 41/48", "1/200 (0.5%) | 17/48 | 41/48",
                             "0/200 (0%) | 17/48 | 41/48", "0/200 (0%) | 17/48 | 41/48"],
            "Qwen3-0.6B": ["17/200 (8.5%) | 7/48 | 32/48", "0/200 (0%) | 7/48 | 32/48", "0/200 (0%) | 7/48 | 32/48",
                           "0/200 (0%) | 7/48 | 32/48", "0/200 (0%) | 7/48 | 32/48"]}
PAPER_T5 = {"Llama 3.2-1B": ("1/814 (0.12%)", "175/403 (43.42%)", "338/403 (83.87%)", "348/403 (86.35%)", "861/1209 (71.22%)"),
            "Qwen3-0.6B": ("0/814 (0%)", "165/403 (40.94%)", "279/403 (69.23%)", "316/403 (78.41%)", "760/1209 (62.86%)")}
PAPER_T6 = [("Attention weights", "att_probs", 45, 45, 45), ("Attention logits", "att_logits", 32, 32, 32),
            ("Down projection", "down_proj", 39, 28, 20), ("Attention residual", "attn_residual", 28, 28, 27),
            ("Pre-o attention output", "att_out", 42, 17, 8), ("Output projection", "o_proj", 25, 21, 10),
            ("Input RMSNorm", "attn_norm", 48, 0, 0), ("SiLU output", "act", 37, 7, 0), ("Up projection", "up_proj", 35, 1, 0),
            ("Gate projection", "gate_proj", 32, 3, 0), ("Post-attention RMSNorm", "mlp_norm", 33, 0, 0),
            ("Gated MLP product", "mlp_product", 27, 3, 0), ("Value projection", "v_proj", 25, 3, 1),
            ("Block output", "block_out", 18, 1, 0)]
QK_SITES = {"q_proj", "k_proj", "q_norm", "k_norm", "q_rope", "k_rope"}


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Plan:
    def __init__(self, a, P):
        self.a, self.P = a, P
        self.out = a.out
        self.jobs = []          # dicts: name, model, cmds (list of argv lists), done (path, step), deps
        self.total = P["pre"] + P["window"]

    def launch(self, ranks=None):
        r = ranks or self.P["ranks"]
        if r <= 1:
            return []
        l = ["mpirun", "-np", str(r), "--oversubscribe"]
        if os.geteuid() == 0:
            l.append("--allow-run-as-root")
        return l

    def common(self, model, total=None, accum=None):
        P = self.P
        c = ["-preset", model, "-train", self.a.train, "-val", self.a.val, "-B", P["B"], "-accum", accum or P["accum"],
             "-seq", P["T"], "-steps", total or self.total, "-lr", P["lr"], "-warmup", P["warmup"], "-precision", P["precision"],
             "-eval_every", 0, "-eval_tokens", P["eval_tokens"], "-quiet"]
        if P["threads"]:
            c += ["-threads", P["threads"]]
        return [str(x) for x in c]

    def d(self, model, name):
        return os.path.join(self.out, model, name)

    def ckpt(self, model):
        return os.path.join(self.d(model, "pre"), f"step_{self.P['pre']:06d}.ckpt")

    def cal(self, model):
        return os.path.join(self.d(model, "pre"), "rgg.cal")

    def bcal(self, model):
        return os.path.join(self.d(model, "pre"), "bwd.cal")

    def skip_file(self, model, name):
        return os.path.join(self.out, model, f"{name}.skip")

    def llmft_model(self, model):
        return os.path.join(self.d(model, "llmft_train"), "llmft.txt")

    def campaign(self, m, seed, sites="all", pass_="both", start=None, end=None, dtype="storage"):
        """one event a step from `start` to `end` (default: the window but its last step, which stays clean
        so that D_final measures the damage left, as the paper's 813 events in 814 steps)"""
        return (["-fault_dtype", dtype] if dtype != "storage" else []) + ["-fault_mode", "campaign", "-fault_sites", sites, "-fault_pass", pass_, "-fault_m", str(m),
                "-fault_rank", "-1", "-fault_mb", "-1", "-fault_start", str(start or self.P["pre"] + 1),
                "-fault_end", str(end or self.total - 1), "-fault_seed", str(seed)]

    def add(self, model, name, extra, deps=(), total=None, stop=None, ranks=None, accum=None):
        d = self.d(model, name)
        trainer = [self.P["trainer"]]
        cmd = self.launch(ranks) + trainer + self.common(model, total, accum) + ["-out", d, "-resume", self.ckpt(model),
                                                                            "-pred_out", os.path.join(d, "pred.bin")] + extra
        if stop:
            cmd += ["-stop_at", str(stop)]
        end = min(stop or total or self.total, total or self.total)   # -stop_at past -steps stops at -steps
        self.jobs.append(dict(name=f"{model}/{name}", dir=d, cmds=[cmd], end=end,
                              deps=[f"{model}/pre"] + list(deps)))


def job_done(j):
    p = os.path.join(j["dir"], "log.jsonl")
    if not os.path.exists(p):
        return False
    for line in open(p):
        if line.startswith('{"type":"end","step":%d,' % j["end"]):
            return True
    return False


def build_plan(a, P):
    pl = Plan(a, P)
    pre, cal, W = P["pre"], P["cal"], P["window"]
    for model in P["models"]:
        m_lo, m_mid, m_hi = P["m"][model]
        dpre = pl.d(model, "pre")
        base = pl.common(model)
        launch = pl.launch()
        if P.get("pre_threads"):   # the pre-training runs alone: more threads
            base = [x if i == 0 or base[i - 1] != "-threads" else str(P["pre_threads"]) for i, x in enumerate(base)]
        c1 = launch + [P["trainer"]] + base + ["-out", dpre, "-stop_at", str(pre - cal), "-ckpt_every", str(P["ckpt_every"])]
        cmds = [c1]
        if P.get("init"):          # continue a pre-trained model with a fresh optimizer (as the paper does)
            if not os.path.exists(os.path.join(ROOT, P["init"])) and not a.dry:
                sys.exit(f"error: {P['init']}: no such checkpoint (the reduced plan starts from the main job's: run scripts/sdc_compare.sh)")
            c1 += ["-init", P["init"]]
        elif P.get("base"):        # pre-train the base model first (its own schedule), then continue from it
            dbase = pl.d(model, "base")
            c0 = [x for x in base]
            for flag, val in (("-steps", P["base"]), ("-lr", P["base_lr"])):
                c0[c0.index(flag) + 1] = str(val)
            c0 = launch + [P["trainer"]] + c0 + ["-out", dbase, "-stop_at", str(P["base"])]
            c1 += ["-init", os.path.join(dbase, f"step_{P['base']:06d}.ckpt")]
            cmds = [c0, c1]
        c2 = launch + [P["trainer"]] + base + ["-out", dpre, "-stop_at", str(pre), "-ckpt_every", str(P["ckpt_every"]),
                                                "-resume", os.path.join(dpre, f"step_{pre - cal:06d}.ckpt"),
                                                "-rgg_calibrate", pl.cal(model), "-bwd_calibrate", pl.bcal(model)]
        pl.jobs.append(dict(name=f"{model}/pre", dir=dpre, cmds=cmds + [c2], end=pre, deps=[]))
        prot = ["-rgg_calibration", pl.cal(model)]
        obs = ["-detect", "loss,nan,harmful", "-detect_observe", "1"]
        pl.add(model, "clean", obs)
        if P.get("reduced"):
            build_reduced(pl, model, obs, prot)
            continue
        pl.add(model, "clean_p1", ["-perturb", "1"])          # the clean envelope E (issue 12)
        pl.add(model, "clean_m1", ["-perturb", "-1"])
        pl.add(model, "clean_prot", ["-protect", "paper"] + prot)
        pl.add(model, "clean_prot_all", ["-protect", "all"] + prot_all(pl, model))
        pl.add(model, "llmft_train", pl.campaign(m_mid, SEED_LLMFT, start=pre + 1 + W // 3) + obs)
        llmft_dep = [f"{model}/llmft_train", f"{model}/clean"]
        for m in (m_lo, m_hi):
            for key, _, flags in METHODS + ABLATION[:3] + EXTRA:
                extra = flags + pl.campaign(m, SEED_EVAL)
                deps = ()
                if key == "llmft":
                    extra += ["-llmft_model", pl.llmft_model(model)]
                    deps = llmft_dep
                extra += protect_files(pl, model, flags)
                pl.add(model, f"{key}_m{m}", extra, deps=deps)
            add_control(pl, model, m)
            if m != m_lo and "fidelity" in P:
                continue           # the smoke preset: the fidelity rows at m = low only
            for key in P.get("fidelity", FIDELITY):   # issue 12, item 6: the same rows with autocast's storage dtypes
                flags = dict((k, f) for k, _, f in METHODS + ABLATION + EXTRA)[key]
                pl.add(model, f"{key}_ac_m{m}", flags + protect_files(pl, model, flags) +
                       pl.campaign(m, SEED_EVAL, dtype="autocast"))
            add_control(pl, model, m, "_ac")
        for key in ("ours", "ours_att"):
            flags = ["-protect", "paper,att" if key == "ours_att" else "paper"] + prot
            pl.add(model, f"{key}_m{m_mid}", flags + pl.campaign(m_mid, SEED_EVAL))
        # forward faults only (what the detection covers): with every event caught, W_L2 must be exactly 0
        for m in (m_lo, m_hi):
            pl.add(model, f"fwdonly_ours_att_m{m}", ["-protect", "paper,att"] + prot + pl.campaign(m, SEED_EVAL, pass_="fwd"))
        # Table 3: alpha sweep (held-out clean steps, then 48 + 48 residual-path events)
        nc, ne = P["alpha_clean"], P["alpha_events"]
        for alpha in ALPHAS:
            rg = ["-protect", "rgg", "-rgg_alpha", str(alpha)] + prot
            pl.add(model, f"alpha{alpha}_clean", rg, stop=pre + nc)
            for m in (m_lo, m_hi):
                pl.add(model, f"alpha{alpha}_m{m}", rg + pl.campaign(m, SEED_ALPHA, sites=RESIDUAL_SITES, pass_="fwd"),
                       stop=pre + ne)
        # issue 5: peers from microbatches (1 rank x 3) vs from ranks (3 x 1), alpha 2.5, first model only
        if P["peers"] and model == P["models"][0] and P["ranks"] == 1 and P["accum"] == 3 and mpi_ready(P["trainer"]):
            rg = ["-protect", "rgg"] + prot
            pl.add(model, "peers_ranks_clean", rg + ["-threads", "1"], stop=pre + nc, ranks=3, accum=1)
            for m in (m_lo, m_hi):
                pl.add(model, f"peers_ranks_m{m}", rg + ["-threads", "1"] + pl.campaign(m, SEED_ALPHA, sites=RESIDUAL_SITES, pass_="fwd"),
                       stop=pre + ne, ranks=3, accum=1)
        # Figure 3: exponent profile at the common checkpoint, then exp-only runs over candidate k
        pl.add(model, "profile", ["-exp_profile", os.path.join(pl.d(model, "profile"), "profile.json")],
               stop=pre + P["profile_steps"])
        for k in fig3_candidates(P):
            pl.add(model, f"expk{k}", ["-protect", "exp", "-expscale_k", str(k)] + pl.campaign(m_mid, SEED_FIG3, pass_="bwd"))
            if P.get("fidelity_k", True):
                pl.add(model, f"expk{k}_ac", ["-protect", "exp", "-expscale_k", str(k)] +
                       pl.campaign(m_mid, SEED_FIG3, pass_="bwd", dtype="autocast"))
        # Figure 5: a profile at every pre-training checkpoint (first model)
        if model == P["models"][0]:
            for s in range(P["ckpt_every"], pre + 1, P["ckpt_every"]):
                dp = pl.d(model, f"prof_{s:06d}")
                ck = os.path.join(dpre, f"step_{s:06d}.ckpt")
                cmd = launch + [P["trainer"]] + pl.common(model) + ["-out", dp, "-resume", ck, "-stop_at", str(s + P["profile_steps"]),
                                                                    "-exp_profile", os.path.join(dp, "profile.json")]
                pl.jobs.append(dict(name=f"{model}/prof_{s:06d}", dir=dp, cmds=[cmd], end=s + P["profile_steps"],
                                    deps=[f"{model}/pre"]))
    return pl


def uses_rgg(flags):
    """-rgg_calibration goes with -protect rgg, paper or all only"""
    return "-protect" in flags and any(t in ("rgg", "paper", "all") for t in flags[flags.index("-protect") + 1].split(","))


def prot_all(pl, model):
    return ["-rgg_calibration", pl.cal(model), "-bwd_calibration", pl.bcal(model)]


def protect_files(pl, model, flags):
    """the calibration files a -protect list needs (Residual Gain Guard; backward guard)"""
    if "-protect" not in flags:
        return []
    toks = flags[flags.index("-protect") + 1].split(",")
    out = ["-rgg_calibration", pl.cal(model)] if uses_rgg(flags) else []
    return out + (["-bwd_calibration", pl.bcal(model)] if any(t in ("bwd", "all") for t in toks) else [])


def add_control(pl, model, m, tag=""):
    """the lost-step control (issue 12): fault-free, skipping the updates the unprotected faulty run lost
    (its -skip_steps file is written when the faulty run has finished)"""
    pl.add(model, f"control{tag}_m{m}", ["-skip_steps", pl.skip_file(model, f"control{tag}_m{m}")],
           deps=[f"{model}/fault{tag}_m{m}"])


def build_reduced(pl, model, obs, prot):
    """the reduced plan, in the order it runs (the most needed first): Table 1 at m = low with the new rows
    and the lost-step control, the autocast fidelity rows, Table 2, the remaining baselines, Figure 3"""
    P = pl.P
    m = P["m"][model][0]
    flags = dict((k, f) for k, _, f in METHODS + ABLATION + EXTRA)
    for key in ("fault", "ours", "ours_all"):
        pl.add(model, f"{key}_m{m}", flags[key] + protect_files(pl, model, flags[key]) + pl.campaign(m, SEED_EVAL))
    add_control(pl, model, m)
    pl.add(model, "clean_p1", ["-perturb", "1"])          # the clean envelope E
    for key in ("fault", "nan", "ours"):
        pl.add(model, f"{key}_ac_m{m}", flags[key] + protect_files(pl, model, flags[key]) + pl.campaign(m, SEED_EVAL, dtype="autocast"))
    for key in ("nan", "exp"):
        pl.add(model, f"{key}_m{m}", flags[key] + protect_files(pl, model, flags[key]) + pl.campaign(m, SEED_EVAL))
    for key in ("exp", "qk", "rgg", "ours_all"):
        pl.add(model, f"{key}_ac_m{m}", flags[key] + protect_files(pl, model, flags[key]) + pl.campaign(m, SEED_EVAL, dtype="autocast"))
    pl.add(model, "clean_prot_all", ["-protect", "all"] + prot_all(pl, model))
    for key in ("qk", "rgg", "harmful", "loss", "abft"):
        pl.add(model, f"{key}_m{m}", flags[key] + protect_files(pl, model, flags[key]) + pl.campaign(m, SEED_EVAL))
    add_control(pl, model, m, "_ac")
    pl.add(model, "clean_m1", ["-perturb", "-1"])
    pl.add(model, "llmft_train", pl.campaign(m, SEED_LLMFT, start=P["pre"] + 1 + P["window"] // 3) + obs)
    pl.add(model, f"llmft_m{m}", flags["llmft"] + ["-llmft_model", pl.llmft_model(model)] + pl.campaign(m, SEED_EVAL),
           deps=[f"{model}/llmft_train", f"{model}/clean"])
    # Figure 3 (item 6 asks whether it reproduces): the exponent profile at the common checkpoint, then
    # exponent scaling alone at fig3_k values of k under backward faults, in both fault dtypes
    pl.add(model, "profile", ["-exp_profile", os.path.join(pl.d(model, "profile"), "profile.json")], stop=P["pre"] + P["profile_steps"])
    for k in fig3_candidates(P):
        for dtype, tag in (("storage", ""), ("autocast", "_ac")):
            pl.add(model, f"expk{k}{tag}", ["-protect", "exp", "-expscale_k", str(k)] +
                   pl.campaign(P["m"][model][1], SEED_FIG3, pass_="bwd", dtype=dtype))


K_MAX = 48   # candidate k: 0..48 (the paper does not list its set; ours spans the shift at which the top
             # exponent bit of the tiny models' gradient codes turns on)


def fig3_candidates(P):
    n = P["fig3_k"]
    return [int(round(i * K_MAX / (n - 1))) for i in range(n)] if n > 1 else [15]   # 0, 6, ..., 48


def train_llmft(pl, model):
    path = pl.llmft_model(model)
    if os.path.exists(path):
        return
    r = subprocess.run([sys.executable, os.path.join(HERE, "llmft_train.py"), "--run", pl.d(model, "llmft_train"),
                        "--run", pl.d(model, "clean"), "--out", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: llmft_train.py failed: {r.stderr.strip()}")
    say(r.stdout.strip())


def run_jobs(pl, jobs_n, dry):
    pending = [j for j in pl.jobs if not job_done(j)]
    done_names = {j["name"] for j in pl.jobs if job_done(j)}
    total = len(pending)
    say(f"{len(pl.jobs)} runs planned, {len(done_names)} done already, {total} to run, {jobs_n} at a time")
    if dry:
        for j in pending:
            for c in j["cmds"]:
                print(" ".join(c))
        return
    running = []
    t0 = time.time()
    finished, work_s = 0, 0.0
    while pending or running:
        for j, p, ci, ts in list(running):
            rc = p.poll()
            if rc is None:
                continue
            running.remove((j, p, ci, ts))
            if rc != 0 or (ci + 1 == len(j["cmds"]) and not job_done(j)):
                log = os.path.join(j["dir"], "stderr.txt")
                for _, q, _, _ in running:    # stop the others: the job fails as a whole
                    q.terminate()
                tail = open(log).read().strip().splitlines()[-5:] if os.path.exists(log) else []
                why = f"exit {rc}" if rc != 0 else f"exit 0 but no end record at step {j['end']} in its log"
                sys.exit(f"error: run {j['name']} failed ({why}); its output: {log}" + "".join("\n  " + t for t in tail))
            if ci + 1 < len(j["cmds"]):
                running.append((j, start(j, ci + 1), ci + 1, ts))
                continue
            finished += 1
            done_names.add(j["name"])
            dt = time.time() - ts
            work_s += dt
            eta = work_s / finished * (total - finished) / jobs_n
            say(f"[{finished}/{total}] {j['name']} done in {dt:.0f}s | elapsed {time.time() - t0:.0f}s | ETA {eta / 60:.1f} min")
        while len(running) < jobs_n:
            ready = [j for j in pending if all(d in done_names for d in j["deps"])]
            if not ready:
                break
            j = ready[0]
            pending.remove(j)
            if "/llmft_m" in j["name"]:
                train_llmft(pl, j["name"].split("/")[0])
            if "/control" in j["name"]:   # the faulty run's lost updates (issue 12's lost-step control)
                model, name = j["name"].split("/")
                fault = pl.d(model, name.replace("control", "fault"))
                with open(pl.skip_file(model, name), "w") as f:
                    f.write("".join(f"{x}\n" for x in sm.lost_updates(fault)["lost"]))
            if os.path.isdir(j["dir"]) and j["name"].split("/")[1] != "pre":
                shutil.rmtree(j["dir"])   # a partial run starts again
            running.append((j, start(j, 0), 0, time.time()))
        if not running and pending:
            sys.exit("error: runs wait on runs that cannot finish: " + ", ".join(j["name"] for j in pending))
        time.sleep(0.5)


def start(j, ci):
    os.makedirs(j["dir"], exist_ok=True)
    cmd = j["cmds"][ci]
    if j["name"].endswith("/pre") and ci == 0 and os.path.exists(cmd[cmd.index("-out") + 1] + "/step_%06d.ckpt" % int(cmd[cmd.index("-stop_at") + 1])):
        cmd = ["true"]   # first half of the pre-training already there
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "passive")
    if "mpirun" in cmd[0]:
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    f = open(os.path.join(j["dir"], "stdout.txt" if ci == 0 else f"stdout{ci}.txt"), "w")
    e = open(os.path.join(j["dir"], "stderr.txt"), "a")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=e, env=env)


# ------------------------------------------------------------------------------- overhead
def overhead_pass(pl, model):
    """fault-free steps from the common checkpoint, one configuration after another (never two at once),
    in `overhead_rounds` interleaved rounds so that a change of machine load hits every configuration
    alike; per configuration the median over all timed steps of the step's wall time and CPU time (all
    threads, the log's cpu_ms); overhead against no protection"""
    P = pl.P
    path = os.path.join(pl.out, model, "overhead.json")
    if os.path.exists(path):
        return json.load(open(path))
    prot = ["-rgg_calibration", pl.cal(model)]
    configs = [("none", [])] + [(k, f + (["-llmft_model", pl.llmft_model(model)] if k == "llmft" else []) +
                                 (prot if uses_rgg(f) else []))
                                for k, _, f in METHODS[1:] + ABLATION[:3] + EXTRA]
    steps, rounds = P["overhead_steps"], P["overhead_rounds"]
    threads = ["-threads", str(os.cpu_count() or 1)] if os.path.basename(P["trainer"]) == "train_sdc" else []
    samples = {k: ([], [], 0) for k, _ in configs}
    for r in range(rounds):
        for key, flags in configs:
            d = os.path.join(pl.out, model, "overhead", key)
            shutil.rmtree(d, ignore_errors=True)
            cmd = pl.launch() + [P["trainer"]] + pl.common(model) + threads + ["-out", d, "-resume", pl.ckpt(model),
                                                                              "-stop_at", str(P["pre"] + steps + 2)] + flags
            env = dict(os.environ)
            env.setdefault("OMP_WAIT_POLICY", "passive")
            subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
            st = sm.read_log(d).steps
            keep = sorted(st)[2:]   # the first two steps warm up
            w, c, a = samples[key]
            samples[key] = (w + [st[s]["ms"] for s in keep], c + [st[s]["cpu_ms"] for s in keep],
                            a + sum(st[s].get("alarms", 0) for s in keep))
        say(f"overhead {model}: round {r + 1}/{rounds} done")
    med = lambda v: sorted(v)[len(v) // 2]
    res = {k: {"ms": med(w), "cpu_ms": med(c), "alarms": a, "n_steps": len(w)} for k, (w, c, a) in samples.items()}
    for key in res:
        res[key]["wall_pct"] = 100 * (res[key]["ms"] / res["none"]["ms"] - 1)
        res[key]["cpu_pct"] = 100 * (res[key]["cpu_ms"] / res["none"]["cpu_ms"] - 1)
        say(f"overhead {model} {key}: {res[key]['ms']:.1f} ms wall, {res[key]['cpu_ms']:.1f} ms CPU a step "
            f"({res[key]['cpu_pct']:+.2f}% CPU, {res[key]['wall_pct']:+.2f}% wall)")
    json.dump(res, open(path, "w"), indent=1)
    return res


# --------------------------------------------------------------------------------- metrics
def detection(d):
    """forward events detected (the event's step was replayed), by site; dead = every flipped element in
    the masked attention triangle (harmless)"""
    st = sm.read_log(d).steps
    ev = [json.loads(l) for l in open(os.path.join(d, "faults.jsonl"))] if os.path.exists(os.path.join(d, "faults.jsonl")) else []
    fwd = [e for e in ev if e["pass"] == "fwd"]
    det = [e for e in fwd if st.get(e["step"], {}).get("replayed", 0)]
    missed = [e for e in fwd if not st.get(e["step"], {}).get("replayed", 0)]
    rep_all = sum(1 for e in ev if st.get(e["step"], {}).get("replayed", 0))
    dead = sum(1 for e in ev if not st.get(e["step"], {}).get("replayed", 0) and e.get("live", e["m"]) == 0)
    return dict(n_ev=len(ev), n_fwd=len(fwd), fwd_det=len(det), missed=missed, detected_any=rep_all, dead=dead,
                false=sum(1 for s, r in st.items() if r.get("replayed") and r.get("injections", 0) == 0))


def metrics(pl, model, name):
    d = pl.d(model, name)
    r = sm.compare(pl.d(model, "clean"), d, window_start=pl.P["pre"] + 1)
    r.update(detection(d))
    r["det"] = sm.detection(d)
    st = sm.read_log(d).steps
    r["found_inf"] = sum(1 for x in st.values() if x.get("found_inf"))
    # D_max over the steps where both losses are finite, and how many were not (sm's D_max is +inf
    # after a single non-finite step, which hides everything else)
    cl = sm.read_log(pl.d(model, "clean")).steps
    t_f = pl.P["pre"] + 1
    ds = [st[t]["loss"] - cl[t]["loss"] for t in st if t >= t_f and t in cl
          and math.isfinite(st[t]["loss"]) and math.isfinite(cl[t]["loss"])]
    r["D_max_finite"] = max(ds) if ds else None
    r["nonfinite_steps"] = sum(1 for t in st if t >= t_f and not math.isfinite(st[t]["loss"]))
    return r


def f_e(x, sign=True):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "nonfinite"
    return f"{x:+.2e}" if sign else f"{x:.2e}"


def f_f(x, fmt="{:.2f}"):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "nonfinite"
    return fmt.format(x)


def pair(a, b):
    return f"{a} / {b}"


def run_ok(r):
    """the final model evaluated to a finite held-out loss (else PPL and Top-1 mean nothing: '-')"""
    return r.get("delta_ppl") is not None and math.isfinite(r["delta_ppl"])


def dmax_cell(r):
    x = f_e(r["D_max_finite"], False)
    return x + (f" ({r['nonfinite_steps']} nf)" if r["nonfinite_steps"] else "")


def table1(pl, res, oh):
    P = pl.P
    lines = []
    for model in P["models"]:
        lo, _, hi = P["m"][model]
        lines.append(f"\n**{model}** (m = {lo} / {hi} corrupted elements an event; overhead on fault-free steps, CPU time)\n")
        lines.append("| Method | Overhead (%) | D_final | D_max (nf: steps with a non-finite loss) | delta-PPL | Top-1 (%) | W_L2 (%) | fwd events detected |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for key, label, _ in METHODS + EXTRA:
            a, b = res[model].get(f"{key}_m{lo}"), res[model].get(f"{key}_m{hi}")
            if a is None or b is None:
                continue
            o = oh[model].get(key if key != "fault" else "none", {}).get("cpu_pct") if oh.get(model) else None
            o = 0.0 if key == "fault" else o
            cells = [pair(f_f(o), f_f(o)), pair(f_e(a["D_final"]), f_e(b["D_final"])), pair(dmax_cell(a), dmax_cell(b)),
                     pair(f_f(a["delta_ppl"], "{:.3g}") if run_ok(a) else "-", f_f(b["delta_ppl"], "{:.3g}") if run_ok(b) else "-"),
                     pair(f_f(100 * a["top1"]) if a["top1"] is not None and run_ok(a) else "-",
                          f_f(100 * b["top1"]) if b["top1"] is not None and run_ok(b) else "-"),
                     pair(f_f(a["w_l2_pct"], "{:.3g}"), f_f(b["w_l2_pct"], "{:.3g}")),
                     pair(f"{a['fwd_det']}/{a['n_fwd']}", f"{b['fwd_det']}/{b['n_fwd']}")]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("\nThe paper (Table 1; 10 / 100,000 elements; A100 x 6):\n")
    lines.append("| Network | Method | Overhead (%) | D_final | D_max | delta-PPL | Top-1 (%) | W_L2 (%) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for net, rows in PAPER_T1.items():
        for label, cells in rows.items():
            lines.append(f"| {net} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table2(pl, res):
    P = pl.P
    lines = ["| Network | Variant | D_final | delta-PPL | found_inf steps | fwd events detected |", "|---|---|---|---|---|---|"]
    for model in P["models"]:
        lo, _, hi = P["m"][model]
        for key, label, _ in ABLATION:
            a, b = res[model].get(f"{key}_m{lo}"), res[model].get(f"{key}_m{hi}")
            if a is None or b is None:
                continue
            lines.append(f"| {model} | {label} | {pair(f_e(a['D_final']), f_e(b['D_final']))} | "
                         f"{pair(f_f(a['delta_ppl'], '{:.3g}') if run_ok(a) else '-', f_f(b['delta_ppl'], '{:.3g}') if run_ok(b) else '-')} | "
                         f"{pair(a['found_inf'], b['found_inf'])} | {pair(str(a['fwd_det']) + '/' + str(a['n_fwd']), str(b['fwd_det']) + '/' + str(b['n_fwd']))} |")
    lines.append("\nThe paper (Table 2; D_final, delta-PPL; 10 / 100,000 elements):\n")
    lines.append("| Network | Variant | D_final | delta-PPL |")
    lines.append("|---|---|---|---|")
    for net, rows in PAPER_T2.items():
        for label, (df, dp) in rows.items():
            lines.append(f"| {net} | {label} | {df} | {dp} |")
    return "\n".join(lines)


def alpha_row(pl, model, prefix):
    P = pl.P
    lo, _, hi = P["m"][model]
    c = sm.read_log(pl.d(model, f"{prefix}_clean")).steps
    clean = [r for s, r in c.items() if s > P["pre"]]
    fp = sum(1 for r in clean if r.get("replayed"))
    out = [f"{fp}/{len(clean)} ({100 * fp / max(len(clean), 1):.1f}%)"]
    for m in (lo, hi):
        d = detection(pl.d(model, f"{prefix}_m{m}"))
        out.append(f"{d['fwd_det']}/{d['n_fwd']} ({100 * d['fwd_det'] / max(d['n_fwd'], 1):.1f}%)")
    return out


def table3(pl):
    P = pl.P
    lines = ["| Network | alpha | Clean step FPR | recall, m = low | recall, m = high |", "|---|---|---|---|---|"]
    for model in P["models"]:
        lo, _, hi = P["m"][model]
        for alpha in ALPHAS:
            try:
                row = alpha_row(pl, model, f"alpha{alpha}")
            except (sm.MetricsError, OSError):
                continue
            lines.append(f"| {model} (m = {lo} / {hi}) | {alpha} | " + " | ".join(row) + " |")
    lines.append("\nThe paper (Table 3; clean FPR on 200 steps | 10-element recall | 100,000-element recall):\n")
    lines.append("| Network | alpha | FPR / recall / recall |")
    lines.append("|---|---|---|")
    for net, rows in PAPER_T3.items():
        for alpha, r in zip(ALPHAS, rows):
            lines.append(f"| {net} | {alpha} | {r} |")
    return "\n".join(lines)


def mpi_ready(trainer):
    """True when runs of `trainer` on several MPI ranks are possible: mpirun is installed and the binary was
    built with MPI (its -version line); else False, with the reason in mpi_ready.why."""
    if shutil.which("mpirun") is None:
        mpi_ready.why = "OpenMPI is not installed (no mpirun)"
        return False
    try:
        out = subprocess.run([trainer, "-version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        out = ""
    if "MPI: yes" not in out:
        mpi_ready.why = f"{trainer} was built without MPI (install OpenMPI, then make rebuilds it)"
        return False
    return True


def table_peers(pl):
    P = pl.P
    model = P["models"][0]
    if not os.path.isdir(pl.d(model, "peers_ranks_clean")):
        return None
    lo, _, hi = P["m"][model]
    lines = [f"| {model}, alpha 2.5 | Clean step FPR | recall, m = {lo} | recall, m = {hi} |", "|---|---|---|---|",
             "| 1 process x 3 microbatches (peers: the other microbatches) | " + " | ".join(alpha_row(pl, model, "alpha2.5")) + " |",
             "| 3 MPI ranks x 1 microbatch (peers: the other ranks) | " + " | ".join(alpha_row(pl, model, "peers_ranks")) + " |"]
    return "\n".join(lines)


def table5(pl, res):
    P = pl.P
    lines = ["| Network | Clean alarms | m = low | m = mid | m = high | All fault runs |", "|---|---|---|---|---|---|"]
    for model in P["models"]:
        ms = P["m"][model]
        c = sm.read_log(pl.d(model, "clean_prot")).steps
        fp = sum(1 for s, r in c.items() if s > P["pre"] and r.get("replayed"))
        cells = [f"{fp}/{len(c)} ({100 * fp / max(len(c), 1):.2f}%)"]
        tot_d = tot_n = 0
        for m in ms:
            r = res[model][f"ours_m{m}"]
            cells.append(f"{r['fwd_det']}/{r['n_fwd']} ({100 * r['fwd_det'] / max(r['n_fwd'], 1):.1f}%) [m={m}]")
            tot_d += r["fwd_det"]; tot_n += r["n_fwd"]
        cells.append(f"{tot_d}/{tot_n} ({100 * tot_d / max(tot_n, 1):.1f}%)")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
        # with the attention checks
        cells = ["-"]
        tot_d = tot_n = 0
        for m in ms:
            r = res[model][f"ours_att_m{m}"]
            cells.append(f"{r['fwd_det']}/{r['n_fwd']} ({100 * r['fwd_det'] / max(r['n_fwd'], 1):.1f}%)")
            tot_d += r["fwd_det"]; tot_n += r["n_fwd"]
        cells.append(f"{tot_d}/{tot_n} ({100 * tot_d / max(tot_n, 1):.1f}%)")
        lines.append(f"| {model} + attention checks | " + " | ".join(cells) + " |")
    lines.append("\nThe paper (Table 5; 10 / 1,000 / 100,000 elements):\n")
    lines.append("| Network | Clean alarms | 10 | 1,000 | 100,000 | All fault runs |")
    lines.append("|---|---|---|---|---|---|")
    for net, cells in PAPER_T5.items():
        lines.append(f"| {net} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table6(pl, res, key):
    P = pl.P
    miss = {}
    dead = 0
    for model in P["models"]:
        for i, m in enumerate(P["m"][model]):
            for e in res[model][f"{key}_m{m}"]["missed"]:
                if e.get("live", e["m"]) == 0:
                    dead += 1
                    continue
                miss.setdefault(e["site"], [0, 0, 0])[i] += 1
    total = sum(sum(v) for v in miss.values())
    lines = ["| Injection site | m = low | m = mid | m = high | Total | Share (%) |", "|---|---|---|---|---|---|"]
    for site, v in sorted(miss.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {site} | {v[0]} | {v[1]} | {v[2]} | {sum(v)} | {100 * sum(v) / max(total, 1):.2f} |")
    qk = sum(sum(v) for s, v in miss.items() if s in QK_SITES)
    lines.append(f"| All protected Q/K-path targets | | | | {qk} | {100 * qk / max(total, 1):.2f} |")
    lines.append(f"\n{total} missed forward events (both models, three intensities); {dead} more events fell wholly in the "
                 "masked attention triangle (never read by the model: harmless, not counted).")
    return "\n".join(lines), miss, total


def paper_t6():
    lines = ["| Injection site | 10 | 1,000 | 100,000 | Total |", "|---|---|---|---|---|"]
    for label, site, a, b, c in PAPER_T6:
        lines.append(f"| {label} ({site}) | {a} | {b} | {c} | {a + b + c} |")
    return "\n".join(lines)


def spearman_exact(x, y):
    """Spearman's rho and the exact two-sided permutation p (all n! orders; n <= 9)"""
    import itertools
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    def rho(a, b):
        ma, mb = sum(a) / n, sum(b) / n
        num = sum((p - ma) * (q - mb) for p, q in zip(a, b))
        den = math.sqrt(sum((p - ma) ** 2 for p in a) * sum((q - mb) ** 2 for q in b))
        return num / den if den else 0.0
    r0 = rho(rx, ry)
    if n > 9:
        return r0, None
    cnt = tot = 0
    for perm in itertools.permutations(ry):
        tot += 1
        if abs(rho(rx, list(perm))) >= abs(r0) - 1e-12:
            cnt += 1
    return r0, cnt / tot


def figure3(pl, res, figdir, tag="", label=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    P = pl.P
    ks = fig3_candidates(P)
    fig, axes = plt.subplots(1, len(P["models"]), figsize=(5.5 * len(P["models"]), 4), squeeze=False)
    rows = []
    for ax, model in zip(axes[0], P["models"]):
        _, hists = es.load_profile(os.path.join(pl.d(model, "profile"), "profile.json"))
        H = es.pooled(hists)
        safe = set(es.k_safe(H, 0, K_MAX))
        sel = es.select(H, 0, K_MAX)
        ramp, dfin = [], []
        for k in ks:
            r = res[model].get(f"expk{k}{tag}")
            if r is None or k not in safe:
                continue
            ramp.append(float(es.r_amp_exact(H, k)))
            dfin.append(r["D_final"] if r["D_final"] is not None and math.isfinite(r["D_final"]) else float("inf"))
        finite = [(a, b) for a, b in zip(ramp, dfin) if math.isfinite(b)]
        rho, p = spearman_exact([a for a, _ in finite], [b for _, b in finite]) if len(finite) >= 3 else (float("nan"), None)
        rows.append((model, sel["k_star"], len(finite), rho, p))
        kk = [k for k in ks if k in safe and res[model].get(f"expk{k}{tag}")]
        ax.plot(kk, [abs(v) if math.isfinite(v) else float("nan") for v in dfin], "o-", color="C0", label="|D_final| (measured)")
        ax.set_yscale("log")
        ax.set_xlabel("k")
        ax.set_ylabel("|D_final|", color="C0")
        ax2 = ax.twinx()
        ax2.plot(kk, ramp, "s--", color="C3", label="R_amp(k)")
        ax2.set_yscale("log")
        ax2.set_ylabel("R_amp(k; H)", color="C3")
        ax.axvline(sel["k_star"], color="gray", ls=":")
        ax.set_title(f"{model}{label}: rho = {rho:.3f}, p_perm = {p if p is None else round(p, 3)} (n = {len(finite)})")
    fig.tight_layout()
    path = os.path.join(figdir, f"figure3{tag}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, rows


# ------------------------------------------------------------------ issue 12: honest metrics, fidelity, regime
def envelope_of(pl, model):
    reps = [pl.d(model, n) for n in ("clean", "clean_p1", "clean_m1") if job_done_dir(pl, model, n)]
    return sm.envelope_all(reps, window_start=pl.P["pre"] + 1) if len(reps) >= 2 else None


def job_done_dir(pl, model, name):
    return any(j["name"] == f"{model}/{name}" and job_done(j) for j in pl.jobs)


def xe(x, e, fmt="{:+.2e}"):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "nonfinite"
    if e is None:
        return fmt.format(x)
    return fmt.format(x) + (f" ({abs(x) / e:.2g}E)" if e > 0 else (" (0E)" if x == 0 else " (inf E)"))


HONEST_ROWS = [(k, lab) for k, lab, _ in METHODS] + [("ours_all", "-protect all (ours)")] + \
              [("control", "clean, skipping the Fault run's lost updates")]


def table_honest(pl, res, tag=""):
    """every method at each m with the metrics of issue 12, each deviation against the clean envelope"""
    P = pl.P
    L = []
    for model in P["models"]:
        E = envelope_of(pl, model) or {}
        for m in sorted({x for x in P["m"][model][:1] + P["m"][model][2:]}):
            rows = [(lab, res[model].get(f"{k}{tag}_m{m}")) for k, lab in HONEST_ROWS]
            rows = [(lab, r) for lab, r in rows if r is not None]
            if not rows:
                continue
            L.append(f"\n**{model}, m = {m}{' (-fault_dtype autocast)' if tag else ''}**\n")
            L.append("| Method | D_final | mean D, last 50 steps | held-out loss diff | delta-PPL | lost updates | "
                     "events the model reads caught | Q/K-path events caught | found_inf | replayed | W_L2 (%) |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for lab, r in rows:
                det = r["det"]
                L.append(f"| {lab} | {xe(r['D_final'], E.get('E_final'))} | {xe(r['mean_dev_lastK'], E.get('E_lastK'))} | "
                         f"{xe(r.get('delta_val_loss'), E.get('E_val'))} | {xe(r.get('delta_ppl'), E.get('E_ppl'), '{:+.3g}')} | "
                         f"{r['lost_updates']} | {det['caught_read']}/{det['read']} | {det['qk_caught']}/{det['qk']} | "
                         f"{det['found_inf']} | {det['replayed']} | {f_f(r['w_l2_pct'], '{:.3g}')} |")
        if E:
            L.append(f"\nClean envelope ({E['n_clean']} fault-free runs: the reference and -perturb +-1 bf16 ulp): E_final "
                     f"{E['E_final']:.2e}, E_last50 {E['E_lastK']:.2e}, E_val {f_e(E['E_val'], False)}, E_ppl "
                     f"{f_e(E['E_ppl'], False)}; (xE) = |deviation| / E, inside the envelope when <= 1.")
    return "\n".join(L)


def table_fidelity(pl, res):
    """Fault against Inf/NaN, and Table 2, in the storage dtype (bf16) and under autocast's dtypes"""
    P = pl.P
    L = ["| Network | fault dtype | Method | D_final | D_max (nf) | delta-PPL | found_inf steps | lost updates | "
         "Fault row = Inf/NaN row |", "|---|---|---|---|---|---|---|---|---|"]
    for model in P["models"]:
        m = P["m"][model][0]
        for tag, dt in (("", "bf16 (storage)"), ("_ac", "autocast")):
            a, b = res[model].get(f"fault{tag}_m{m}"), res[model].get(f"nan{tag}_m{m}")
            same = "-" if a is None or b is None else ("yes" if a["D_final"] == b["D_final"] and a.get("delta_ppl") == b.get("delta_ppl") else "no")
            for key, lab in (("fault", "Fault"), ("nan", "Inf/NaN"), ("qk", "Q/K path only"), ("rgg", "Residual only"),
                             ("exp", "Exponent scaling only"), ("ours", "Complete (paper)"), ("ours_all", "-protect all")):
                r = res[model].get(f"{key}{tag}_m{m}")
                if r is None:
                    continue
                L.append(f"| {model} (m = {m}) | {dt} | {lab} | {f_e(r['D_final'])} | {dmax_cell(r)} | "
                         f"{f_f(r['delta_ppl'], '{:.3g}') if run_ok(r) else '-'} | {r['found_inf']} | {r['lost_updates']} | "
                         f"{same if key in ('fault', 'nan') else ''} |")
    return "\n".join(L)


def regime_rows(pl):
    """how fast the clean loss falls in the window, the held-out loss along the way (base model, common
    checkpoint, end), and what one lost update costs (the control)"""
    P = pl.P
    out = []
    for model in P["models"]:
        try:
            st = sm.read_log(pl.d(model, "clean")).steps
        except sm.MetricsError:
            continue
        a, b = P["pre"] + 1, P["pre"] + P["window"]
        first = [st[s]["loss"] for s in range(a, a + 20) if s in st]
        last = [st[s]["loss"] for s in range(b - 19, b + 1) if s in st]
        lr = (st[a]["lr"], st[b]["lr"]) if a in st and b in st else (None, None)
        val = {}
        for name, key in (("base", "base"), ("pre", "start"), ("clean", "end")):
            try:
                ev = sm.read_log(pl.d(model, name)).evals
                val[key] = ev[max(ev)]["val_loss"] if ev else None
            except sm.MetricsError:
                val[key] = None
        m = P["m"][model][0]
        c = res_get(pl, model, f"control_m{m}")
        out.append((model, sum(first) / max(len(first), 1), sum(last) / max(len(last), 1), lr, val, c))
    return out


def regime_lines(pl):
    """the report's lines on the continuation regime (both plans)"""
    L = []
    for model, l0, l1, lr, val, c in regime_rows(pl):
        per = f"{c['mean_dev_lastK'] / c['lost_updates']:.2e}" if c and c["lost_updates"] else "-"
        vals = " -> ".join(f"{val[k]:.4f} ({lab})" for k, lab in (("base", "base model"), ("start", "common checkpoint"),
                                                                   ("end", "end of the window")) if val.get(k) is not None)
        L.append(f"- {model}: clean training loss {l0:.4f} (mean of the window's first 20 steps) -> {l1:.4f} (last 20): "
                 f"{100 * (l0 - l1) / l0:.2f}% over {pl.P['window']} steps; lr {lr[0]:.2e} -> {lr[1]:.2e}" +
                 (f"; held-out loss {vals}" if vals else "") +
                 (f"; the lost-step control skipping {c['lost_updates']} updates ends with a mean deviation of "
                  f"{c['mean_dev_lastK']:+.2e} over the last 50 steps ({per} a lost update)" if c else "") +
                 (f" and a held-out loss difference of {c['delta_val_loss']:+.2e}" if c and c.get("delta_val_loss") is not None else ""))
    return L


def res_get(pl, model, name):
    if not job_done_dir(pl, model, name):
        return None
    try:
        return metrics(pl, model, name)
    except sm.MetricsError:
        return None


def report_reduced(pl, args_line):
    P = pl.P
    res = {}
    for model in P["models"]:
        res[model] = {}
        for j in pl.jobs:
            mname, name = j["name"].split("/", 1)
            if mname != model or not job_done(j) or name.startswith(("pre", "profile", "clean")) or name == "llmft_train":
                continue
            res[model][name] = metrics(pl, model, name)
    figdir = os.path.join(pl.a.report_dir, "figures") if pl.a.report_dir else os.path.join(pl.out, "figures")
    os.makedirs(figdir, exist_ok=True)
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(pl.a.report)))  # noqa: E731
    L = [f"# Reproduction of the TrainSDC evaluation: preset `{pl.a.preset}`\n",
         f"Made by `{args_line}{'' if '--reduced' in args_line else ' --reduced'}` on {time.strftime('%Y-%m-%d')} ({pl.a.machine}), "
         f"report written at commit {git_commit()}.\n",
         "This is the **reduced** tiny plan (issue 12): what fits a shared 2-core machine in an hour. It runs one model "
         f"({', '.join(P['models'])}) at m = {P['m'][P['models'][0]][0]} only, over a {P['window']}-step window: Table 1's methods "
         "plus `-protect all` and the lost-step control, Table 2 and the Fault / Inf/NaN rows under both fault dtypes, in that "
         f"order of priority, then Figure 3 over {len(fig3_candidates(P))} values of k in both fault dtypes (a run missing below did "
         "not finish in the time); no alpha sweep, peers, Tables 5/6, Figure 5 or overhead pass. The full recipe is `scripts/reproduce.sh --preset tiny` (both models, m = low and high, "
         "every table and figure, both fault dtypes).\n",
         "## Settings\n",
         f"- trainer `{P.get('trainer_shown', P['trainer'])}`, B {P['B']} x T {P['T']} x accum {P['accum']}, {P['precision']}, AdamW lr "
         f"{P['lr']} warmup {P['warmup']} cosine to 10% over {pl.total} steps, clip 1.0",
         f"- common checkpoint at step {P['pre']} (its last {P['cal']} steps calibrate the Residual Gain Guard and the backward "
         f"guard); every compared run continues for {P['window']} steps with the same data order; one fault event a step "
         f"(seed {SEED_EVAL}), none on the last step",
         "- metrics: scripts/sdc_metrics.py; E from the fault-free run and its -perturb +-1 repeats\n",
         "## The continuation regime\n"]
    L += regime_lines(pl)
    L.append("\n## Table 1 at m = low, with the metrics of issue 12\n")
    L.append(table_honest(pl, res))
    L.append("\n## Fidelity: bf16 storage against autocast's dtypes (issue 12, item 6)\n")
    L.append("`-fault_dtype autocast` flips the bits of each site in the dtype PyTorch autocast stores it in (fp32: the "
             "residual stream, the RMSNorm outputs, q/k after the QK norm and RoPE, the attention logits and probabilities, and "
             "their gradients; bf16: every projection output, the attention output, SiLU and the MLP product; README).\n")
    L.append(table_fidelity(pl, res))
    L.append("\nThe same rows' metrics of issue 12 under autocast:\n")
    L.append(table_honest(pl, res, "_ac"))
    L.append("\n## Figure 3: R_amp(k) against the measured final deviation, both fault dtypes\n")
    if not all(os.path.exists(os.path.join(pl.d(m, "profile"), "profile.json")) for m in P["models"]):
        L.append("Not run in the reduced plan (it needs a profile and 9 exponent-scaling runs a fault dtype); the full "
                 "plan (`scripts/reproduce.sh --preset tiny`) draws it for both fault dtypes.")
    for tag, lab in (("", " (bf16 storage)"), ("_ac", " (autocast)")) if "Not run" not in L[-1] else ():
        try:
            f3, rows = figure3(pl, res, figdir, tag, lab)
        except (OSError, ValueError, sm.MetricsError) as e:
            L.append(f"(Figure 3{lab} not drawn: {e})")
            continue
        L.append(f"![Figure 3{lab}]({rel(f3)})\n")
        L.append("| Network | fault dtype | k* | n | Spearman rho | exact p_perm |")
        L.append("|---|---|---|---|---|---|")
        for model, ks, n, rho, p in rows:
            L.append(f"| {model} | {lab.strip(' ()')} | {ks} | {n} | {rho:.3f} | {'-' if p is None else f'{p:.3f}'} |")
        L.append("")
    L.append("\nThe paper: rho = 0.650, p_perm = 0.067 (Llama-3.2-1B), rho = 0.867, p_perm = 0.005 (Qwen3-0.6B), n = 9; k = 15.\n")
    notes = os.path.join(ROOT, "docs", f"report_reading_{pl.a.preset}.md")
    if os.path.exists(notes):
        L.append("\n## Reading\n")
        L.append(f"(Written by hand from this run: `{os.path.relpath(notes, ROOT)}`.)\n")
        L.append(open(notes).read().strip())
    txt = "\n".join(L) + "\n"
    tmp = pl.a.report + ".tmp"
    open(tmp, "w").write(txt)
    os.replace(tmp, pl.a.report)
    say(f"report {pl.a.report}")


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def figure5(pl, figdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    P = pl.P
    model = P["models"][0]
    pts = []
    for s in range(P["ckpt_every"], P["pre"] + 1, P["ckpt_every"]):
        f = os.path.join(pl.d(model, f"prof_{s:06d}"), "profile.json")
        if not os.path.exists(f):
            continue
        _, hists = es.load_profile(f)
        H = es.pooled(hists)
        sel = es.select(H, 0, K_MAX)
        pts.append((s, H, sel))
    if not pts:
        return None, []
    held, rows = None, []
    for s, H, sel in pts:
        reassess = False
        if held is None:
            held, reassess = sel["k_star"], True
        else:
            h = es.select(H, 0, K_MAX, held=held)
            if not h["hold"]:
                held, reassess = sel["k_star"], True
        within = [k for k, v in sel["r_amp"].items() if v <= 1.25 * sel["r_min"]]
        excess = sel["r_amp"][held] / sel["r_min"] - 1 if held in sel["r_amp"] else float("nan")
        rows.append((s, sel["k_star"], held, reassess, min(within), max(within), excess))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    xs = [r[0] for r in rows]
    a1.fill_between(xs, [r[4] for r in rows], [r[5] for r in rows], color="C0", alpha=0.2, label="within 25% of min R_amp")
    a1.plot(xs, [r[1] for r in rows], "o", color="C0", label="k* (pointwise)")
    a1.step(xs, [r[2] for r in rows], where="post", color="C3", label="held k")
    for r in rows:
        if r[3] and r[0] != xs[0]:
            a1.axvline(r[0], color="gray", ls="--")
    a1.axvspan(0, P["warmup"], color="gray", alpha=0.15)
    a1.set_ylabel("k")
    a1.legend(fontsize=8)
    a2.plot(xs, [100 * r[6] for r in rows], "-", color="C3")
    a2.axhline(25, color="gray", ls=":")
    a2.axvspan(0, P["warmup"], color="gray", alpha=0.15)
    a2.set_ylabel("excess risk of held k (%)")
    a2.set_xlabel("training step")
    fig.tight_layout()
    path = os.path.join(figdir, "figure5.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, rows


def report(pl, args_line):
    P = pl.P
    res = {}
    for model in P["models"]:
        res[model] = {}
        for j in pl.jobs:
            mname, name = j["name"].split("/", 1)
            if mname != model or not job_done(j):
                continue
            if name.startswith(("pre", "prof_", "alpha", "peers", "profile", "clean")) or name == "llmft_train":
                continue
            res[model][name] = metrics(pl, model, name)
    oh = {m: json.load(open(os.path.join(pl.out, m, "overhead.json"))) for m in P["models"]
          if os.path.exists(os.path.join(pl.out, m, "overhead.json"))}
    figdir = os.path.join(pl.a.report_dir, "figures") if pl.a.report_dir else os.path.join(pl.out, "figures")
    os.makedirs(figdir, exist_ok=True)
    f3, f3rows = figure3(pl, res, figdir)
    f5, f5rows = figure5(pl, figdir)
    t6, miss, tot = table6(pl, res, "ours")
    t6a, missa, tota = table6(pl, res, "ours_att")
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(pl.a.report)))
    L = []
    L.append(f"# Reproduction of the TrainSDC evaluation: preset `{pl.a.preset}`\n")
    L.append(f"Made by `{args_line}` on {time.strftime('%Y-%m-%d')} ({pl.a.machine}), report written at commit {git_commit()}.\n")
    L.append("## Settings\n")
    L.append(f"- models: {', '.join(P['models'])}; trainer `{P.get('trainer_shown', P['trainer'])}`, {P['ranks']} rank(s), B {P['B']} x T {P['T']} x "
             f"accum {P['accum']}, {P['precision']}, AdamW lr {P['lr']} warmup {P['warmup']} cosine to 10%"
             f"{f' over {pl.total} steps' if P.get('base') else ''}, clip 1.0")
    if P.get("base"):
        L.append(f"- the continuation regime (issue 12): a base model pre-trained for {P['base']} steps (lr {P['base_lr']}, warmup "
                 f"{P['warmup']}, cosine to 10%) is continued with a fresh AdamW at the lr above; steps are counted from the start "
                 "of the continuation")
    L.append(f"- common checkpoint at step {P['pre']} (clean training; its last {P['cal']} steps calibrate the Residual Gain "
             f"Guard and the backward guard); every compared run continues from it for {P['window']} steps (to step {pl.total}) "
             "with the same data order; no fault on the last step")
    L.append(f"- fault campaign: one event a step over the window, site (all 20), pass (forward or backward), layer, rank and "
             f"microbatch drawn, 4 bits flipped in each of m elements of the storage dtype; the same campaign (seed {SEED_EVAL}) in "
             "every compared run")
    ms = "; ".join(f"{m}: {' / '.join(str(x) for x in P['m'][m])}" for m in P["models"])
    L.append(f"- m (corrupted elements an event), low / mid / high: {ms}. The paper's 10 / 1,000 / 100,000 are for tensors of "
             "1024 tokens x 2048 (Llama) or x 1024 (Qwen); the tiny preset keeps 10 and scales 1,000 and 100,000 by the share of "
             "a [tokens, d_model] tensor they are in the paper (4.8% for Llama's 100,000, 9.5% for Qwen's).")
    L.append("- detectors: see llmc/sdc/detect.h and llmc/sdc/attcheck.h (thresholds there and in README.md); LLMFT is trained on "
             f"another campaign (seed {SEED_LLMFT}, m = mid, faults in the last two thirds) plus the clean run, then applied unchanged")
    L.append("- metrics: scripts/sdc_metrics.py (docs/design.md) against the fault-free run; delta-PPL and Top-1 on the "
             f"first {P['eval_tokens']} held-out positions; '-' where the run's loss went non-finite (as the paper)\n")
    if P.get("base"):
        L.append("## The continuation regime\n")
        L += regime_lines(pl)
        L.append("")
    L.append("## Table 1: evaluation under the transient-fault protocol\n")
    L.append("Each cell: m = low / m = high. Overhead: the change of fault-free CPU time per step (the overhead pass runs the "
             "methods one after another on the whole machine; wall times in the JSON beside the runs). 'fwd events detected': "
             "forward events whose step was replayed.\n")
    L.append(table1(pl, res, oh))
    L.append("\n## Table 2: component ablation\n")
    L.append(table2(pl, res))
    L.append("\n## Table 3: the Residual Gain Guard's alpha\n")
    n_clean = min(P["alpha_clean"], P["window"])
    L.append(f"-protect rgg alone; clean FPR over {n_clean} held-out clean steps after the common checkpoint "
             f"({'the paper: 200; the window of this preset is ' + str(P['window']) + ' steps' if n_clean < 200 else 'as the paper'}); recall "
             f"over {P['alpha_events']} forward events each at m = low and m = high on the residual-path sites ({RESIDUAL_SITES}), "
             "an event detected when its step is replayed.\n")
    L.append(table3(pl))
    tp = table_peers(pl)
    if tp:
        L.append("\n### One process against three ranks (beyond the paper)\n")
        L.append("The same 3 observations a step (the same token batches: rank r's microbatch is the single process's "
                 "microbatch r), the same calibration file; alpha 2.5.\n")
        L.append(tp)
    elif P["peers"] and not mpi_ready(P["trainer"]):
        L.append(f"\n(One process against three ranks: left out, {mpi_ready.why}.)\n")
    L.append("\n## Table 5: complete-run clean FPR and forward-alarm recall (alpha 2.5)\n")
    L.append(table5(pl, res))
    L.append("\n## Table 6: missed forward events by injection site (TrainSDC, alpha 2.5)\n")
    L.append(t6)
    L.append("\nWith the cheap attention checks on (`-protect all,att`):\n")
    L.append(t6a)
    L.append("\nThe paper (Table 6, both networks):\n")
    L.append(paper_t6())
    L.append("\n## Figure 3: R_amp(k) against the measured final deviation\n")
    L.append(f"Exponent scaling alone (`-protect exp -expscale_k K`) under backward faults (m = mid, seed {SEED_FIG3}); R_amp from "
             f"the clean exponent profile at the common checkpoint ({P['profile_steps']} steps, 8192 samples a projection a microbatch).\n")
    L.append(f"![Figure 3]({rel(f3)})\n")
    L.append("| Network | k* | n | Spearman rho | exact p_perm |")
    L.append("|---|---|---|---|---|")
    for model, ks, n, rho, p in f3rows:
        L.append(f"| {model} | {ks} | {n} | {rho:.3f} | {'-' if p is None else f'{p:.3f}'} |")
    L.append("\nThe paper: rho = 0.650, p_perm = 0.067 (Llama-3.2-1B), rho = 0.867, p_perm = 0.005 (Qwen3-0.6B), n = 9; k = 15.\n")
    L.append("## Figure 5 (analogue): k* along one run of ours\n")
    if f5:
        L.append(f"Profiles at every pre-training checkpoint of {P['models'][0]} (every {P['ckpt_every']} steps); a held k is "
                 "kept while its R_amp is within 25% of the pointwise minimum, else the run re-profiles and moves to k*.\n")
        L.append(f"![Figure 5]({rel(f5)})\n")
        L.append("| step | k* | held k | reassessed | within 25% | excess risk of held k |")
        L.append("|---|---|---|---|---|---|")
        for s, ks, held, re_, lo, hi, ex in f5rows:
            L.append(f"| {s} | {ks} | {held} | {'yes' if re_ else ''} | {lo}..{hi} | {100 * ex:.1f}% |")
    L.append("\n## Beyond the paper\n")
    L.append("| run (TrainSDC) | events | caught (replayed) | harmless (masked triangle only) | W_L2 (%) | D_final |")
    L.append("|---|---|---|---|---|---|")
    for model in P["models"]:
        for name in sorted(res[model]):
            if not (name.startswith("ours") or name.startswith("fwdonly")):
                continue
            r = res[model][name]
            L.append(f"| {model} {name} | {r['n_ev']} ({r['n_fwd']} fwd) | {r['detected_any']} | {r['dead']} | {f_f(r['w_l2_pct'], '{:.3g}')} | "
                     f"{f_e(r['D_final'])} |")
    caught_all = lambda r: r["n_ev"] and r["detected_any"] + r["dead"] == r["n_ev"]
    ours = lambda n: n.startswith(("ours", "fwdonly"))
    exact = [f"{m} {n}" for m in P["models"] for n, r in res[m].items() if caught_all(r) and ours(n)]
    exact0 = [f"{m} {n}" for m in P["models"] for n, r in res[m].items() if caught_all(r) and ours(n) and r["w_l2_pct"] == 0]
    base = [f"{m} {n}" for m in P["models"] for n, r in res[m].items() if caught_all(r) and not ours(n)]
    base0 = [x for x in base if res[x.split()[0]][x.split()[1]]["w_l2_pct"] == 0]
    L.append(f"\n- Exact fault-free reference: {len(exact)} TrainSDC run(s) caught every event that the model reads "
             f"({', '.join(exact) or 'none'}); W_L2 is exactly 0 in {len(exact0)} of them (goal: all). So did "
             f"{len(base)} baseline run(s) ({', '.join(base) or 'none'}; W_L2 = 0 in {len(base0)}): the replay is exact "
             "whichever detector asks for it. The paper's method (`ours`: exponent scaling is its answer to backward events) "
             "detects no backward event: its runs catch them all only in a forward-only campaign (`fwdonly_`) or with the "
             "Inf/NaN or harmful-update guard added, when every backward event overflows (m = high); `-protect all` (`ours_all`) "
             "adds the backward guard and the backward checks.")
    for model in P["models"]:
        if model in oh:
            o = oh[model]
            L.append(f"- overhead ({model}, CPU time): TrainSDC {o['ours']['cpu_pct']:+.2f}%, + attention checks "
                     f"{o['ours_att']['cpu_pct']:+.2f}%; wall {o['ours']['wall_pct']:+.2f}% / {o['ours_att']['wall_pct']:+.2f}%")
    L.append(f"- missed forward events: {tot} without the attention checks, {tota} with them; attention sites "
             f"(att_logits + att_probs) {sum(sum(miss.get(s, [0])) for s in ('att_logits', 'att_probs'))} -> "
             f"{sum(sum(missa.get(s, [0])) for s in ('att_logits', 'att_probs'))}")
    L.append("\n## Beyond the paper: lost updates, the held-out loss and the clean envelope (issue 12)\n")
    L.append(table_honest(pl, res))
    L.append("\n## Fidelity: bf16 storage against autocast's dtypes (issue 12, item 6)\n")
    L.append(table_fidelity(pl, res))
    L.append(table_honest(pl, res, "_ac"))
    try:
        f3a, f3arows = figure3(pl, res, figdir, "_ac", " (autocast)")
        L.append(f"\n![Figure 3 (autocast)]({rel(f3a)})\n")
        L.append("| Network | k* | n | Spearman rho (autocast) | exact p_perm |")
        L.append("|---|---|---|---|---|")
        for model, ks, n, rho, p in f3arows:
            L.append(f"| {model} | {ks} | {n} | {rho:.3f} | {'-' if p is None else f'{p:.3f}'} |")
    except (OSError, ValueError, sm.MetricsError) as e:
        L.append(f"(Figure 3 under autocast not drawn: {e})")
    notes = os.path.join(ROOT, "docs", f"report_reading_{pl.a.preset}.md")
    if os.path.exists(notes):
        L.append("\n## Reading\n")
        L.append(f"(Written by hand from this run: `{os.path.relpath(notes, ROOT)}`.)\n")
        L.append(open(notes).read().strip())
    txt = "\n".join(L) + "\n"
    tmp = pl.a.report + ".tmp"
    open(tmp, "w").write(txt)
    os.replace(tmp, pl.a.report)
    say(f"report {pl.a.report}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=PRESETS, default="tiny")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reduced", action="store_true", help="the tiny preset's reduced plan (tiny-llama, m = 10; see PRESETS)")
    ap.add_argument("--report-only", action="store_true", help="write the report from the runs finished so far (reduced plan)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--report", default=None)
    ap.add_argument("--report-dir", default=None, help="where the figures go (default: beside the runs)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--machine", default="")
    ap.add_argument("--args-line", default="scripts/reproduce.sh")
    a = ap.parse_args()
    name = "smoke" if a.smoke else ("tiny_reduced" if a.reduced and a.preset == "tiny" else a.preset)
    P = dict(PRESETS[name])
    if a.window:
        P["window"] = a.window
    a.preset = name
    a.out = a.out or os.path.join("out", f"reproduce_{name}")
    a.report = a.report or os.path.join(a.out, "REPORT.md")
    if not a.dry and not a.report_only and os.path.exists(os.path.join(ROOT, P["trainer"])):
        # run a private copy of the trainer: a rebuild while the job runs cannot mix two binaries
        os.makedirs(os.path.join(a.out, "bin"), exist_ok=True)
        dst = os.path.join(a.out, "bin", os.path.basename(P["trainer"]))
        shutil.copy2(os.path.join(ROOT, P["trainer"]), dst + ".tmp")
        os.replace(dst + ".tmp", dst)     # a rename works while an old copy still runs
        P["trainer_shown"] = P["trainer"]
        P["trainer"] = os.path.abspath(dst)
    pl = build_plan(a, P)
    if a.report_only:
        (report_reduced if P.get("reduced") else report)(pl, a.args_line)
        return
    run_jobs(pl, a.jobs or P["jobs"], a.dry)
    if a.dry:
        return
    for model in P["models"]:
        train_llmft(pl, model)
        if not P.get("reduced"):
            overhead_pass(pl, model)
    (report_reduced if P.get("reduced") else report)(pl, a.args_line)


if __name__ == "__main__":
    main()
