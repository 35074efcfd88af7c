"""What to run: the presets, the methods and their flags, and every run's command line (scripts/reproduce.py);
the sites the trainer can corrupt; the plan characterize.sh writes into its output directory
(scripts/characterize.py)."""
import os
import shutil
import subprocess
import sys

from . import ROOT, Error


# -------------------------------------------------------------------------- the trainer's sites
SITES = ["attn_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope", "att_logits", "att_probs",
         "att_out", "o_proj", "attn_residual", "mlp_norm", "gate_proj", "up_proj", "act", "mlp_product", "down_proj",
         "block_out"]
QK_SITES = {"q_proj", "k_proj", "q_norm", "k_norm", "q_rope", "k_rope"}


# ------------------------------------------------------------ reproduce.py: presets and methods
PRESETS = {
    # the continuation regime, the paper's: a pre-trained model (base: 300 steps at lr
    # 2e-3, warmup 30, cosine to 10%) continued with a fresh AdamW at lr 2e-4 (warmup 30, cosine to 10% over
    # 300 steps), faults after its step 200; measured and justified in REPORT.md
    "tiny": dict(models=["tiny-llama", "tiny-qwen3"], trainer="./train_sdc", ranks=1, B=4, T=128, accum=3,
                 lr=2e-4, warmup=30, pre=200, cal=100, window=100, eval_tokens=8192, precision="bf16",
                 base=300, base_lr=2e-3,
                 m={"tiny-llama": (10, 31, 3125), "tiny-qwen3": (10, 62, 6250)},
                 alpha_clean=200, alpha_events=48, fig3_k=9, jobs=2, threads=1, overhead_steps=30, overhead_rounds=3,
                 ckpt_every=20, peers=True, profile_steps=4),
    # what fits a shared, oversubscribed 2-core machine in about an hour: tiny-llama, m = 10, a
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
    # docs/design.md section 4: the paper's settings on 6 GPU ranks (B 1 x T 1024 x accum 8, lr 5e-5, warmup
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
# the paper's models ran under PyTorch autocast; these rows again with -fault_dtype autocast
FIDELITY = ["fault", "nan", "ours", "ours_all", "qk", "rgg", "exp"]
RESIDUAL_SITES = "o_proj,attn_residual,down_proj,block_out"
ALPHAS = [1.0, 1.5, 2.0, 2.5, 3.0]
SEED_EVAL, SEED_LLMFT, SEED_ALPHA, SEED_FIG3 = 2026, 777, 4242, 99
K_MAX = 48   # candidate k: 0..48 (the paper does not list its set; ours spans the shift at which the top
             # exponent bit of the tiny models' gradient codes turns on)


# ----------------------------------------------------------------------- reproduce.py: the plan
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


def job_done_dir(pl, model, name):
    return any(j["name"] == f"{model}/{name}" and job_done(j) for j in pl.jobs)


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
        # the pre-training's fresh runs start over in a folder a killed attempt may have left (-force)
        c1 = launch + [P["trainer"]] + base + ["-out", dpre, "-force", "-stop_at", str(pre - cal), "-ckpt_every", str(P["ckpt_every"])]
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
            c0 = launch + [P["trainer"]] + c0 + ["-out", dbase, "-force", "-stop_at", str(P["base"])]
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
        pl.add(model, "clean_p1", ["-perturb", "1"])          # the clean envelope E
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
            for key in P.get("fidelity", FIDELITY):   # the same rows with autocast's storage dtypes
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
        # peers from microbatches (1 rank x 3) vs from ranks (3 x 1), alpha 2.5, first model only
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
    """the lost-step control: fault-free, skipping the updates the unprotected faulty run lost
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
    # Figure 3 (does it reproduce?): the exponent profile at the common checkpoint, then
    # exponent scaling alone at fig3_k values of k under backward faults, in both fault dtypes
    pl.add(model, "profile", ["-exp_profile", os.path.join(pl.d(model, "profile"), "profile.json")], stop=P["pre"] + P["profile_steps"])
    for k in fig3_candidates(P):
        for dtype, tag in (("storage", ""), ("autocast", "_ac")):
            pl.add(model, f"expk{k}{tag}", ["-protect", "exp", "-expscale_k", str(k)] +
                   pl.campaign(P["m"][model][1], SEED_FIG3, pass_="bwd", dtype=dtype))


def fig3_candidates(P):
    n = P["fig3_k"]
    return [int(round(i * K_MAX / (n - 1))) for i in range(n)] if n > 1 else [15]   # 0, 6, ..., 48


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


# ----------------------------------- characterize.sh's plan, as written to its output directory
def read_settings(out):
    p = os.path.join(out, "settings.txt")
    if not os.path.exists(p):
        raise Error(f"{p}: no such file (not a characterize.sh output directory)")
    st = {}
    for line in open(p):
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            st[k] = v
    return st


def read_plan(out):
    p = os.path.join(out, "plan.tsv")
    rows = []
    for line in open(p):
        if not line.strip():
            continue
        model, kind, pas, site, perturb, d = line.rstrip("\n").split("\t")
        rows.append({"model": model, "kind": kind, "pass": pas, "site": site, "perturb": int(perturb), "dir": d})
    return rows
