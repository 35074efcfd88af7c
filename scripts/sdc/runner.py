"""Running the plan: jobs in parallel in dependency order, resuming (a finished run is never run again), progress
and ETA; the learned detector's training, the overhead pass (scripts/reproduce.py); the per-run helpers that
scripts/characterize.sh calls: trim a log to a checkpoint, a command resumed from it, W_L2 after a run."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import sdc_metrics as sm

from . import HERE, ROOT, Error
from .plan import ABLATION, EXTRA, METHODS, job_done, uses_rgg


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------- reproduce.py
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
            if "/control" in j["name"]:   # the faulty run's lost updates (the lost-step control)
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


# -------------------------------------------------------------------- characterize.sh's helpers
def cmd_trim(run, step):
    for name in ("log.jsonl", "faults.jsonl", "trace.jsonl"):
        p = os.path.join(run, name)
        if not os.path.exists(p):
            continue
        keep = []
        with open(p) as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue          # a line cut short by the interruption
                s = rec.get("step")
                if isinstance(s, (int, float)) and s > step:
                    continue
                keep.append(line if line.endswith("\n") else line + "\n")
        tmp = p + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, p)


def cmd_resume(cmd, ckpt):
    a = shlex.split(cmd)
    out, i = [], 0
    while i < len(a):
        if a[i] in ("-resume", "-init") and i + 1 < len(a):
            i += 2
            continue
        out.append(a[i])
        i += 1
    return shlex.join(out + ["-resume", ckpt])


def cmd_postrun(run, clean, keep):
    fc, cc = sm.final_checkpoint(run), sm.final_checkpoint(clean)
    if not fc:
        raise Error(f"{run}: no checkpoint")
    if not cc:
        raise Error(f"{clean}: no checkpoint")
    a, c = sm.Checkpoint(fc), sm.Checkpoint(cc)
    if a.step != c.step:
        raise Error(f"{fc}: step {a.step}, the clean run's final checkpoint {cc} is at step {c.step}")
    w = sm.weight_l2(a, c)
    with open(os.path.join(run, "wl2.json"), "w") as f:
        json.dump({"w_l2_pct": w, "ckpt_step": a.step, "clean_ckpt": cc}, f)
    print(f"W_L2 {w:.6g} % (step {a.step}, against {cc})")
    if not keep:
        del a
        for name in os.listdir(run):
            if name.startswith("step_") and name.endswith(".ckpt"):
                os.remove(os.path.join(run, name))
