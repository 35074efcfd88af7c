"""scripts/gpu_check.sh without a GPU: its --dry plan (every phase with an estimate, phases 1-4 within
540 s), --phases parsing (numbers, names, ranges; order and duplicates), the bad-input errors, and that
its per-test fallback list names every test test_sdc_cu's -only takes."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")
NAMES = {1: "info", 2: "build", 3: "test", 4: "bench", 5: "overhead", 6: "rest"}


def dry(*args, env=None):
    e = dict(os.environ)
    e.pop("OUT", None)
    e.update(env or {})
    return subprocess.run([SCRIPT, "--dry", *args], capture_output=True, text=True, cwd=ROOT, env=e, timeout=60)


def plan(p):
    """{phase number: (name, estimate seconds)} of a --dry output"""
    rows = re.findall(r"^phase (\d) (\w+) +~ *(\d+) s", p.stdout, re.M)
    return {int(n): (name, int(est)) for n, name, est in rows}


def test_dry_plan_has_every_phase_and_1_to_4_fit_540_s():
    """Catches: a phase missing from the plan, phases 1-4 estimated over the 540 s device budget, a summary line
    that disagrees with the phases' estimates, benchmarks that save checkpoints."""
    p = dry()
    assert p.returncode in (0, 1), p.stderr          # 1 only when a required file is missing here
    if os.path.isdir(os.path.join(ROOT, "build", "ref")):
        assert p.returncode == 0, p.stdout[-2000:]
    ph = plan(p)
    assert sorted(ph) == [1, 2, 3, 4, 5, 6]
    assert {n: name for n, (name, _) in ph.items()} == NAMES
    assert all(est > 0 for _, est in ph.values())
    t14 = sum(ph[i][1] for i in (1, 2, 3, 4))
    assert t14 <= 540, ph
    assert f"estimate: {t14} s for phases 1-4 (must be <= 540 s: ok)" in p.stdout
    assert f"estimate: {sum(e for _, e in ph.values())} s for the phases selected, of the 560 s budget" in p.stdout
    # the plan names what it runs, with -save none for the benchmarks, and the MFU formula is in the help
    assert "-save none" in p.stdout and "llama3.2-1b" in p.stdout and "qwen3-0.6b" in p.stdout
    h = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert h.returncode == 0 and "6 P + 12 L H hd T" in h.stdout and 'carry: ["build/ref"]' in h.stdout


@pytest.mark.parametrize("arg,want", [
    ("1,2,3,4", [1, 2, 3, 4]),
    ("4,1", [1, 4]),                      # run in phase order
    ("1-4", [1, 2, 3, 4]),
    ("3-5,1", [1, 3, 4, 5]),
    ("bench,info", [1, 4]),
    ("overhead,rest,5", [5, 6]),          # duplicates once
    ("6", [6]),
])
def test_phases_parsing(arg, want):
    """--phases takes numbers, names and ranges, runs in phase order, each once. Catches: phases run in the given
    order or twice, a name or range misread."""
    p = dry("--phases", arg)
    assert p.returncode in (0, 1), p.stderr
    assert sorted(plan(p)) == want
    assert f"phases {','.join(map(str, want))};" in p.stdout


@pytest.mark.parametrize("args,needle", [
    (["--phases", "7"], "'7' is not a phase"),
    (["--phases", "0"], "'0' is not a phase"),
    (["--phases", "x"], "'x' is not a phase"),
    (["--phases", ""], "--phases is empty"),
    (["--phases", "1,,2"], "'' is not a phase"),
    (["--phases", "1,"], "'' is not a phase"),
    (["--phases", "4-2"], "range '4-2' runs backwards"),
    (["--phases", "1-7"], "'1-7' is not a phase"),
    (["--phases"], "--phases needs a value"),
    (["--budget", "0"], "--budget must be a positive integer"),
    (["--budget", "1e3"], "--budget must be a positive integer"),
    (["--budget", "30"], "--budget must be at least 60 seconds"),
    (["--B", "-1"], "--B must be a positive integer"),
    (["--steps", "two"], "--steps must be a positive integer"),
    (["--continue", "/nonexistent/state"], "--continue: no such file"),
    (["--continue", "README.md"], "is not a gpu_check state file"),
    (["--bogus"], "unknown argument '--bogus'"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    """each bad option: exit 2, one 'gpu_check: ' line naming it, no plan. Catches: bad input that starts a (costly)
    device run or fails with a shell error."""
    p = dry(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith("gpu_check: ") and needle in err[0], err
    assert "plan (" not in p.stdout


def test_budget_and_continue_in_the_plan(tmp_path):
    """--budget and --continue in the plan: over the budget, it says the later runs will be skipped; the state
    file's done checks are skipped. Catches: --budget or --continue ignored (a rerun that repeats done work or
    overruns the device time)."""
    st = tmp_path / "gpu_check.state"
    st.write_text("# gpu_check state v1\ndone\tinfo\t| 1 | machine | x | - | - | - | - | - |\n"
                  "done\ttest_sdc_cu\t| 3 | test_sdc_cu | 90 passed, 0 failed | - | - | - | - | - |\n")
    p = dry("--phases", "1-4", "--budget", "300", "--continue", str(st))
    assert p.returncode in (0, 1), p.stderr
    assert "budget 300 s" in p.stdout
    assert "(more than the budget: the later runs will be skipped and listed" in p.stdout   # 430 s > 300 s
    assert f"continue: 2 checks done in {st} are skipped" in p.stdout


def test_fallback_list_names_every_test_of_test_sdc_cu():
    """a crashed test_sdc_cu is rerun one test a process from TEST_NAMES: it must hold every -only name.
    Catches: a test added to test_sdc_cu but not to TEST_NAMES (never rerun after a crash), or a stale name
    there."""
    src = open(os.path.join(ROOT, "test_sdc.cu")).read()
    main = src[src.index("int main("):]
    kernels = set(re.findall(r'\{"(\w+)", test_\w+\}', main))
    groups = set(re.findall(r'want\("(\w+)", NULL\)', main))
    assert kernels and "init" in groups and "att_faults" in groups
    names = re.search(r'^TEST_NAMES="([^"]*)"', open(SCRIPT).read(), re.M).group(1).split()
    assert set(names) == kernels | groups, (set(names) ^ (kernels | groups))
