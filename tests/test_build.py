"""The build follows its configuration, and a single-process binary refuses to run as many:
- make NO_MPI=1, then make: the second build relinks train_sdc with MPI (build/config-c.stamp changed);
  the same configuration again builds nothing; another (NATIVE=0) rebuilds;
- a train_sdc built without MPI, started by a launcher with several ranks (their environment variables,
  and a real mpirun -np 2), exits at once with one line: built without MPI, how to rebuild;
- without OpenMPI (a NO_MPI build and a PATH that hides mpirun) the MPI tests skip with a reason.
Everything is built in a scratch copy of the tree (NO_CUDA=1: the C trainer only)."""
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_trainer import DATA_DIR, MPI_ENV, ROOT  # noqa: E402

MPICC = shutil.which("mpicc")
MPIRUN = shutil.which("mpirun")
SRC = ["Makefile", "train_sdc.c", "test_sdc.c", "requirements.txt", "llmc", "dev", "tests", "scripts"]


def make(tree, *args):
    p = subprocess.run(["make", "-C", str(tree), "NO_CUDA=1"] + list(args), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


def version(binary, env=None):
    return subprocess.run([str(binary), "-version"], capture_output=True, text=True, env=env).stdout


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """a scratch copy of the sources, built with NO_MPI=1; the single-process binary kept as train_sdc_nompi"""
    t = tmp_path_factory.mktemp("tree")
    for name in SRC:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, t / name, ignore=shutil.ignore_patterns("__pycache__", "states"))
        else:
            shutil.copy2(src, t / name)
    os.symlink(os.path.join(ROOT, "dev", "reference", "states"), t / "dev" / "reference" / "states")
    out = make(t, "NO_MPI=1", "train_sdc")
    assert "MPI: no mpicc" in out
    assert "MPI: no" in version(t / "train_sdc")
    shutil.copy2(t / "train_sdc", t / "train_sdc_nompi")
    return t


def test_config_change_rebuilds(tree):
    """make after make NO_MPI=1 relinks train_sdc with MPI (where mpicc exists); the same configuration again is up
    to date; NATIVE=0 drops -march=native. Catches: a build that ignores a changed configuration (a stale
    single-process binary after OpenMPI is installed), a rebuild on every make, NATIVE=0 ignored."""
    before = os.stat(tree / "train_sdc").st_mtime_ns
    out = make(tree, "train_sdc")  # mpicc is found now (if installed): another configuration
    if MPICC:
        assert "build configuration new or changed" in out
        assert "MPI: yes" in version(tree / "train_sdc"), "make did not rebuild train_sdc with MPI"
        ldd = subprocess.run(["ldd", str(tree / "train_sdc")], capture_output=True, text=True).stdout
        assert "libmpi" in ldd, ldd
    else:  # no mpicc: the same configuration, nothing to rebuild
        assert os.stat(tree / "train_sdc").st_mtime_ns == before
    # the same configuration again: up to date (make -q exits 0); NATIVE=0 is another one
    assert subprocess.run(["make", "-C", str(tree), "-q", "NO_CUDA=1", "train_sdc"], capture_output=True).returncode == 0
    dry = subprocess.run(["make", "-C", str(tree), "-n", "NO_CUDA=1", "NATIVE=0", "train_sdc"], capture_output=True, text=True).stdout
    assert "-o train_sdc train_sdc.c" in dry and "-march=native" not in dry


@pytest.mark.parametrize("env", [{"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}, {"PMI_SIZE": "4", "PMI_RANK": "0"},
                                 {"SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "0"}, {"PMIX_SIZE": "2"}])
def test_single_process_binary_refuses_many_ranks(tree, tmp_path, env):
    """a NO_MPI binary started with a launcher's rank variables (OpenMPI, PMI, Slurm, PMIx): exit 1, one line, no
    output directory; the other ranks exit silently. Catches: a single-process binary that runs as N uncoordinated
    copies under a launcher (N runs writing one -out), or N copies of the error."""
    e = dict(os.environ, **env)
    p = subprocess.run([str(tree / "train_sdc_nompi"), "-steps", "0", "-out", str(tmp_path / "o")], capture_output=True,
                       text=True, env=e, timeout=60)
    assert p.returncode == 1 and p.stdout == "", p.stdout
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train_sdc_nompi was built without MPI"), p.stderr
    assert "rebuild with make" in lines[0] and "openmpi" in lines[0]
    assert not (tmp_path / "o").exists()
    # another rank than the first exits silently (one line in all)
    other = {k: ("1" if k.endswith(("RANK", "PROCID")) else v) for k, v in env.items()}
    if other != env:
        p = subprocess.run([str(tree / "train_sdc_nompi"), "-steps", "0"], capture_output=True, text=True,
                           env=dict(os.environ, **other), timeout=60)
        assert p.returncode == 1 and p.stderr == ""


def test_single_process_binary_runs_in_a_one_task_allocation(tree, tmp_path):
    """SLURM_NTASKS 4 with a world size of 1 (sbatch, no srun) is no multi-rank launch: the binary runs. Catches: a
    launch detection that refuses every multi-task allocation."""
    # sbatch with several tasks, the binary started once (no srun): SLURM_NTASKS alone is no launch
    e = dict(os.environ, SLURM_NTASKS="4", OMPI_COMM_WORLD_SIZE="1")
    p = subprocess.run([str(tree / "train_sdc_nompi"), "-vocab", "256", "-steps", "0", "-out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=e, timeout=60)
    assert p.returncode == 0 and "built without MPI: single process" in p.stdout, p.stderr


@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI not installed (no mpirun)")
def test_single_process_binary_under_mpirun(tree, tmp_path):
    """a real mpirun -np 2 of the NO_MPI binary: one error line naming 2 processes, no output directory. Catches: a
    launch detection that misses the environment OpenMPI really sets."""
    p = subprocess.run([MPIRUN, "-np", "2", str(tree / "train_sdc_nompi"), "-steps", "0", "-out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=dict(os.environ, **MPI_ENV), timeout=120)
    assert p.returncode != 0
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "built without MPI" in errs[0] and "2 processes" in errs[0], p.stderr
    assert not (tmp_path / "o").exists()


def hide_mpi_path(tmp_path):
    """a PATH with every program of the current PATH except the MPI launchers and compilers"""
    hidden = {"mpirun", "mpiexec", "mpicc", "orterun", "prterun", "mpiexec.hydra", "srun"}
    b = tmp_path / "bin"
    b.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name not in hidden and not (b / name).exists():
                os.symlink(os.path.join(d, name), b / name)
    return str(b)


def test_without_openmpi_the_mpi_tests_skip_with_a_reason(tree, tmp_path):
    """the single-process build and no mpirun on PATH (a machine without OpenMPI): the MPI tests of the
    suite skip, saying why, instead of failing.
    Catches: MPI tests that fail instead of skipping without OpenMPI, a skip without its reason, a reason that does
    not name the single-process build."""
    shutil.copy2(tree / "train_sdc_nompi", tree / "train_sdc")  # test_config_change_rebuilds may have rebuilt it
    env = dict(os.environ, PATH=hide_mpi_path(tmp_path), TSDC_DATA_DIR=os.path.abspath(DATA_DIR))
    assert subprocess.run(["sh", "-c", "command -v mpirun"], env=env, capture_output=True).returncode != 0
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_trainer.py",
                        "-k", "ranks or mpi"], cwd=tree, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:]
    skips = [l for l in p.stdout.splitlines() if l.startswith("SKIPPED")]
    assert len(skips) == 2 and all("OpenMPI not installed" in l for l in skips), p.stdout[-3000:]
    # with mpirun present but the binary single-process, the reason names the build
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_trainer.py",
                        "-k", "ranks or mpi"], cwd=tree, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TSDC_DATA_DIR=os.path.abspath(DATA_DIR)))
    if MPIRUN:
        assert "built without MPI" in p.stdout, p.stdout[-3000:]


def test_bare_make_builds_the_trainers_and_tests(tree):
    """a bare `make` (no target) builds train_sdc and test_sdc. Catches: a Makefile whose first rule is not `all`
    (a configuration stamp first: `make` says the stamp is up to date and builds nothing)."""
    dry = subprocess.run(["make", "-C", str(tree), "-n", "NO_CUDA=1"], capture_output=True, text=True, timeout=120).stdout
    assert "-o train_sdc train_sdc.c" in dry and "-o test_sdc test_sdc.c" in dry, dry[-2000:]


def test_test_sdc_on_a_fresh_clone_names_the_missing_step(tree):
    """./test_sdc where the reference checkpoints were never built (a fresh clone after `make`): exit 2 with one
    line naming the file and `make refckpts`. Catches: a fresh clone's test binary failing test by test with
    `cannot open checkpoint` and no hint which command builds what it needs."""
    make(tree, "test_sdc")
    p = subprocess.run(["./test_sdc"], cwd=str(tree), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout[-1000:] + p.stderr[-1000:]
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "build/ref/tiny-llama.ckpt" in err[0] and "make refckpts" in err[0], p.stderr
