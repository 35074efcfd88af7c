"""A run survives what clusters do to it, and tells a person what happened.

- Graceful stop: SIGINT, SIGTERM and SIGUSR1 finish the step in progress, write a checkpoint through the
  atomic path and the log's end record with the signal, and exit 128 + the signal; -resume from that
  checkpoint ends with the uninterrupted run's final weights, bit for bit (1 process, and 2 MPI ranks of
  which only one was signalled: both stop at the same step). A second signal exits at once.
- Nothing lost to a full disk: a log, fault log or checkpoint write that fails is one error line naming the
  file, a non-zero exit, and no .tmp left behind (/dev/full, always; a small tmpfs where mounting works).
- Early checks: bad output paths, a checkpoint path that is a directory, a shard of another vocabulary,
  -fault_bits beyond the storage, a fresh run into an -out that holds a run: one line, before any step.
- The end summary counts fault events injected, caught and missed by site, matching faults.jsonl.
- The Slurm script resubmits itself when the trainer stopped for a signal, and only then.
Data: the byte-level shards of test_trainer.py."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_trainer import BIN, MPI_ENV, MPI_SKIP, MPIRUN, ROOT, base, data, expect_error, run  # noqa: E402,F401


def targs(data, out, **kw):
    """test_trainer.base's arguments; a value True adds a flag without a value (-force), False removes one (-quiet)"""
    flags = [k for k, v in kw.items() if v is True]
    drop = [k for k, v in kw.items() if v is False]
    a = base(data, out, **{k: v for k, v in kw.items() if not isinstance(v, bool)})
    return [x for x in a if x not in drop] + flags


def records(out):
    return [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]


def end_record(out):
    ends = [r for r in records(out) if r["type"] == "end"]
    assert len(ends) == 1, ends
    return ends[0]


def start(args, mpi=0):
    cmd = ([MPIRUN, "-np", str(mpi)] if mpi else []) + [BIN] + [str(a) for a in args]
    env = dict(os.environ)
    if mpi:
        env.update(MPI_ENV)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_step(out, step, proc, timeout=120):
    """block until the run's log has a step record >= step"""
    t0 = time.time()
    path = os.path.join(out, "log.jsonl")
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        if os.path.exists(path):
            try:
                if any(json.loads(l).get("step", 0) >= step for l in open(path) if '"type":"step"' in l):
                    return
            except json.JSONDecodeError:
                pass   # a line being written
        time.sleep(0.05)
    raise AssertionError(f"no step {step} in {path} after {timeout} s")


# 30 steps of ~50 ms: long enough to signal mid-run, short enough for make test
def sig_args(data, out, **kw):
    a = {"-steps": 30, "-eval_every": 0, "-threads": 1, "-B": 2}
    a.update(kw)
    return targs(data, out, **a)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "o"
    run(sig_args(data, out))
    return end_record(out)["weights"]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGUSR1, 138)])
def test_signal_stops_with_a_checkpoint_and_resume_is_exact(data, tmp_path, uninterrupted, sig, code):
    """a signal mid-run: exit 128 + signal, a checkpoint at the step it stopped after, the end record with the
    signal's name; -resume from it reaches the uninterrupted run's final weights bit for bit. Catches: a run
    killed at once by SIGTERM (Slurm's preemption) with nothing saved, a checkpoint of a half step (resume
    differs), an end record missing or claiming a normal end, exit 0 after a signal."""
    out = tmp_path / "o"
    p = start(sig_args(data, out))
    wait_for_step(str(out), 3, p)
    p.send_signal(sig)
    so, se = p.communicate(timeout=120)
    assert p.returncode == code, (p.returncode, so[-1000:], se[-1000:])
    end = end_record(out)
    assert end["reason"] == signal.Signals(sig).name and 3 <= end["step"] < 30, end
    ck = out / f"step_{end['step']:06d}.ckpt"
    assert ck.exists() and not list(out.glob("*.tmp")), sorted(os.listdir(out))
    assert f"-resume {ck}" in so, so[-500:]
    run(sig_args(data, out, **{"-resume": ck}))
    ends = [r for r in records(out) if r["type"] == "end"]
    assert ends[-1]["reason"] == "done" and ends[-1]["step"] == 30
    assert ends[-1]["weights"] == uninterrupted


def test_second_signal_exits_at_once(data, tmp_path):
    """two signals in a row: the second exits at once (128 + signal) without finishing the step. Catches: a run
    that cannot be stopped by a user who means it (a hung filesystem, a step of minutes)."""
    out = tmp_path / "o"
    p = start(sig_args(data, out, **{"-B": 8, "-steps": 200}))
    wait_for_step(str(out), 1, p)
    p.send_signal(signal.SIGTERM)
    p.send_signal(signal.SIGTERM)
    so, se = p.communicate(timeout=60)
    assert p.returncode == 143 and "second signal" in se, (p.returncode, se)


@pytest.mark.skipif(MPIRUN is None or MPI_SKIP is not None, reason=str(MPI_SKIP))
def test_signal_to_one_rank_stops_every_rank_at_the_same_step(data, tmp_path):
    """2 MPI ranks, SIGTERM to rank 1 only: both stop after the same step (one checkpoint, consistent: resuming it
    with 2 ranks gives the uninterrupted 2-rank run's final weights). Catches: ranks stopping at different steps
    (a hang in the next all-reduce, or a checkpoint mixing steps)."""
    full = tmp_path / "full"
    run(sig_args(data, full, **{"-steps": 16}), mpi=2)
    out = tmp_path / "o"
    p = start(sig_args(data, out, **{"-steps": 16}), mpi=2)
    wait_for_step(str(out), 3, p)
    kids = ranks_of(out)
    assert len(kids) == 2, kids
    os.kill(sorted(kids)[1], signal.SIGTERM)
    p.communicate(timeout=120)
    end = end_record(out)
    assert end["reason"] == "SIGTERM" and end["step"] < 16, end
    cks = sorted(out.glob("step_*.ckpt"))
    assert [c.name for c in cks] == [f"step_{end['step']:06d}.ckpt"], cks
    run(sig_args(data, out, **{"-steps": 16, "-resume": cks[0]}), mpi=2)
    assert [r for r in records(out) if r["type"] == "end"][-1]["weights"] == end_record(full)["weights"]


def ranks_of(out):
    """the pids of the trainer processes writing into out (from /proc: no procps needed)"""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace") == BIN and str(out).encode() in argv:
            pids.append(int(d))
    return pids


def test_full_disk_log_and_checkpoint(data, tmp_path):
    """the log and a checkpoint's .tmp on /dev/full (every write fails with ENOSPC): exit 1, one error line naming
    the file and the reason, the .tmp removed. Catches: a log cut mid-record and exit 0; a failed checkpoint
    write leaving a partial .tmp on the full disk; an error that does not say which file."""
    logdir = tmp_path / "log"
    logdir.mkdir()
    os.symlink("/dev/full", logdir / "log.jsonl")
    expect_error(run(targs(data, logdir, **{"-force": True, "-steps": 2}), check=False), "log.jsonl", "No space left")
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    os.symlink("/dev/full", ckdir / "step_000002.ckpt.tmp")
    expect_error(run(base(data, ckdir, **{"-steps": 2}), check=False), "step_000002.ckpt", "No space left", "removed")
    assert sorted(os.listdir(ckdir)) == ["log.jsonl"], os.listdir(ckdir)


def test_full_disk_fault_log(data, tmp_path):
    """faults.jsonl on /dev/full under a campaign: exit 1 naming it. Catches: fault events lost without a word."""
    d = tmp_path / "o"
    d.mkdir()
    os.symlink("/dev/full", d / "faults.jsonl")
    p = run(targs(data, d, **{"-force": True, "-steps": 3, "-fault_mode": "campaign", "-fault_m": 10}), check=False)
    expect_error(p, "faults.jsonl", "No space left")


def test_full_disk_tmpfs(data, tmp_path):
    """a real small file system (tmpfs, 256 KiB) filling up with the checkpoint: exit 1 naming it, no .tmp, the log
    complete up to the failure. Needs root to mount; skipped with the reason where mounting is refused."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")
    try:
        out = mnt / "o"
        expect_error(run(base(data, out, **{"-steps": 2}), check=False), "step_000002.ckpt", "No space left")
        assert not list(out.glob("*.tmp")), os.listdir(out)
        assert [r["step"] for r in records(out) if r["type"] == "step"] == [1, 2]
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.mark.parametrize("flags,needles", [
    ({"-pred_out": "/nonexistent/p.bin"}, ["-pred_out", "/nonexistent", "does not exist"]),
    ({"-rgg_calibrate": "{tmp}"}, ["-rgg_calibrate", "is a directory"]),
    ({"-bwd_calibrate": "/nonexistent/b.cal"}, ["-bwd_calibrate", "does not exist"]),
    ({"-exp_profile": "{tmp}/afile/x.json"}, ["-exp_profile", "is not a directory"]),
    ({"-trace_out": "/nonexistent/t.jsonl"}, ["-trace_out", "does not exist"]),
    ({"-resume": "{tmp}"}, ["is a directory, not a checkpoint"]),
    ({"-init": "{tmp}"}, ["is a directory, not a checkpoint"]),
    ({"-val": "{tmp}"}, ["is a directory, not a token shard"]),
    ({"-vocab": 300}, ["tokenised for a vocabulary of 256", "the model has 300"]),
    ({"-precision": "bf16", "-fault_mode": "campaign", "-fault_bits": 17}, ["-fault_bits 17", "16 bits of the bf16"]),
    ({"-fault_mode": "campaign", "-fault_bits": 9, "-fault_field": "exponent"}, ["-fault_bits 9", "8 bits of the exponent"]),
    ({"-pred_out": "{tmp}/p.bin", "-val": None}, ["-pred_out", "needs -val"]),
])
def test_early_checks(data, tmp_path, flags, needles):
    """each bad output path or input: one error line naming the flag or file, exit 1, before the first step (no
    step record). Catches: a bad -pred_out / calibration path found only after training (the final checkpoint then
    not written), a directory read as a 9.2e18-byte checkpoint, a shard of another tokenizer trained on silently,
    -fault_bits 17 clamped to 16 while faults.jsonl records 17."""
    (tmp_path / "afile").write_text("")
    flags = {k: (str(v).replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v) for k, v in flags.items()}
    out = tmp_path / "o"
    p = run(base(data, out, **{"-steps": 2, **flags}), check=False)
    err = expect_error(p, *[n.replace("{tmp}", str(tmp_path)) for n in needles])
    assert "usage" not in p.stderr, err
    assert not (out / "log.jsonl").exists() or not [r for r in records(out) if r["type"] == "step"]


@pytest.mark.parametrize("argv,needle", [(["-bogus"], "unknown flag -bogus (see -h)"),
                                         (["-lr"], "flag -lr needs a value (see -h)"),
                                         (["-B", "0"], "out of range"),
                                         (["-steps", "x"], "not an integer (see -h)")])
def test_flag_error_is_one_line(argv, needle, tmp_path):
    """a flag error: exactly one stderr line, ending in "(see -h)", no usage text. Catches: 125 lines of usage after
    the error (the error scrolls away); an unknown flag at the end of the line reported as "needs a value"."""
    p = subprocess.run([BIN, "-out", str(tmp_path / "o")] + argv, capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [p.stderr.strip()], p.stderr
    assert needle in p.stderr and "(see -h)" in p.stderr, p.stderr


def test_fresh_run_into_a_used_out_is_refused(data, tmp_path):
    """a second fresh run into the same -out: refused in one line naming -resume with the newest checkpoint and
    -force; -force runs; -resume runs. Catches: a repeated command line replacing a finished run's log."""
    out = tmp_path / "o"
    run(base(data, out, **{"-steps": 2}))
    err = expect_error(run(base(data, out, **{"-steps": 2}), check=False), "holds a run already", "-force",
                       f"-resume {out}/step_000002.ckpt")
    assert "log.jsonl" in err and "1 checkpoint" in err
    assert len([r for r in records(out) if r["type"] == "step"]) == 2   # the old log untouched
    run(targs(data, out, **{"-steps": 2, "-force": True}))
    assert len([r for r in records(out) if r["type"] == "step"]) == 2   # replaced, not appended


def test_steps_0_samples_without_val(data, tmp_path):
    """-steps 0 -sample_every 1 without -val prints a sample. Catches: an evaluation-only run that does nothing and
    exits 0."""
    p = run(["-preset", "tiny-llama", "-vocab", 256, "-seq", 32, "-steps", 0, "-sample_every", 1, "-sample_len", 8,
             "-tokenizer", data / "tokenizer.bin", "-out", tmp_path / "o"])
    assert "sample: " in p.stdout, p.stdout


def test_threads_above_cores_warns(data, tmp_path):
    """-threads above the machine's cores: a warning line naming both. Catches: a 60x slower run without a word."""
    n = os.cpu_count() or 1
    p = run(base(data, tmp_path / "o", **{"-steps": 1, "-threads": n + 3}))
    assert f"warning: -threads {n + 3} is more than the {n} cores" in p.stderr, p.stderr


def test_end_summary_names_faults_by_site(data, tmp_path):
    """an unprotected campaign and a protected one: the summary's injected / caught / missed counts and its per-site
    caught/injected pairs agree with faults.jsonl and the step records; the banner names the sites; no step line
    prints a 20-digit number. Catches: a summary that says how many alarms but not how many faults were missed,
    sites as a bitmask, huge norms in fixed point."""
    for prot in ("none", "qk"):
        out = tmp_path / prot
        p = run(targs(data, out, **{"-steps": 12, "-fault_mode": "campaign", "-fault_sites": "q_proj,k_proj,mlp_product",
                                   "-fault_m": 100, "-fault_field": "exponent", "-protect": prot, "-eval_every": 0,
                                   "-quiet": False}))
        assert "sites q_proj,k_proj,mlp_product," in p.stdout, p.stdout[:600]
        assert not re.search(r"\d{12,}", "\n".join(l for l in p.stdout.splitlines() if l.startswith("step "))), p.stdout
        ev = [json.loads(l) for l in open(out / "faults.jsonl")]
        steps = {r["step"]: r for r in records(out) if r["type"] == "step"}
        inj = {}
        for e in ev:
            k = (e["site"], e["pass"])
            c = inj.setdefault(k, [0, 0])
            c[0] += steps[e["step"]]["replayed"]
            c[1] += 1
        m = re.search(r"faults: (\d+) events? injected, (\d+) caught \(step replayed\), (\d+) missed", p.stdout)
        assert m, p.stdout[-800:]
        caught = sum(c[0] for c in inj.values())
        assert (int(m.group(1)), int(m.group(2)), int(m.group(3))) == (len(ev), caught, len(ev) - caught)
        fwd = re.search(r"forward, caught/injected: (.*)", p.stdout).group(1)
        got = {s.split()[0]: s.split()[1] for s in fwd.split(", ")}
        assert got == {s: f"{c[0]}/{c[1]}" for (s, ps), c in inj.items() if ps == "fwd"}, (got, inj)
        if prot == "qk":   # the Q/K recomputation catches every q_proj / k_proj event
            assert all(c[0] == c[1] for (s, ps), c in inj.items() if s in ("q_proj", "k_proj")), inj
            assert "by check: qk " in p.stdout


def test_slurm_script_resubmits_after_a_signal_stop(tmp_path):
    """scripts/slurm_train.sbatch with a stand-in trainer: exit 138 (stopped by SIGUSR1 with a checkpoint) submits
    the script again with the same arguments and one resubmission less; the next job resumes from the newest
    checkpoint; a failure (exit 1) is not resubmitted. Catches: a job chain that ends at the first time limit, or
    one that resubmits a broken run forever."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for f in ("slurm_train.sbatch", "run_gpu.sh"):
        shutil.copy2(os.path.join(ROOT, "scripts", f), tree / "scripts" / f)
    (tree / "data" / "d").mkdir(parents=True)
    (tree / "data" / "d" / "train.bin").write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    stub = "#!/bin/bash\necho \"$(basename $0) $*\" >> %s\n" % log
    (bin_dir / "make").write_text(stub)
    (bin_dir / "sbatch").write_text(stub)
    (bin_dir / "srun").write_text(stub + 'while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (tree / "train_sdc_cu").write_text(stub + 'out=$(echo "$*" | sed -n "s/.*-out \\([^ ]*\\).*/\\1/p")\n'
                                       'mkdir -p "$out" && touch "$out/step_000010.ckpt"\nexit ${STUB_EXIT}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    (tree / "train_sdc_cu").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(tree), SLURM_NTASKS="2",
               DATA="data/d", OUT="runs/x", RESUBMITS="3")
    for code in (138, 1):
        log.write_text("")
        p = subprocess.run(["bash", str(tree / "scripts" / "slurm_train.sbatch"), "tiny-llama", "50"], cwd=str(tree),
                           env=dict(env, STUB_EXIT=str(code)), capture_output=True, text=True)
        calls = log.read_text().splitlines()
        assert p.returncode == code, p.stdout + p.stderr
        sb = [c for c in calls if c.startswith("sbatch")]
        if code == 138:
            assert sb == [f"sbatch --export=ALL {tree}/scripts/slurm_train.sbatch tiny-llama 50"], calls
            assert "resubmitting (3 resubmission(s) left)" in p.stdout
        else:
            assert sb == [], calls
        # the second job (and this one, after the first) resumes from the checkpoint the stopped run left
    tr = [c for c in log.read_text().splitlines() if c.startswith("train_sdc_cu")]
    assert "-resume runs/x/step_000010.ckpt" in tr[0], tr


def test_reap_one_finds_runs_that_ended_while_the_driver_was_busy():
    """scripts/reap.sh's reap_one, which sdc_compare.sh and characterize.sh use to start the next run when any of theirs
    ends: two children that both end while the shell is busy elsewhere (a sleep, as a driver launching a run or
    printing progress) are each found with its own exit status, and a child still running is waited for. Catches:
    `wait -n -p`, which bash (5.2) answers here by waiting for another child or with 127 and no pid, the ended run's
    status lost (a failed run taken for a success, or a driver stuck or stopped with a wrong failure)."""
    script = f"""
set -euo pipefail
. {os.path.join(ROOT, "scripts", "reap.sh")}
(exit 0) & a=$!
(exit 5) & b=$!
(sleep 1.5; exit 7) & c=$!
sleep 0.5
left=("$a" "$b" "$c")
for k in 1 2 3; do
  reap_one "${{left[@]}}"
  echo "$REAP_PID $REAP_STATUS"
  rest=(); for p in "${{left[@]}}"; do [ "$p" = "$REAP_PID" ] || rest+=("$p"); done; left=("${{rest[@]}}")
done
echo "pids $a $b $c"
reap_one || echo "none: $?"
"""
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    a, b, c = lines[3].split()[1:]
    got = dict(line.split() for line in lines[:3])
    assert got == {a: "0", b: "5", c: "7"}, p.stdout
    assert lines[2].split()[0] == c, p.stdout   # the running one last
    assert lines[4] == "none: 1", p.stdout
