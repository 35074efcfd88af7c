"""The README as a user reads it: a front door of at most 320 lines whose every relative link (and every
link of docs/*.md) names a file that exists; its quick-start commands, run in order as they are written
(the bash blocks of its "Quick start" section, from the repository root, every output under
out/quickstart/), finish and leave what they promise; and docs/flags.md's usage block is the trainer's
own -h text, so that the flag documentation cannot drift from the binary
(scripts/update_flag_docs.sh regenerates it)."""
import json
import os
import re
import shutil
import subprocess

import pytest

from test_trainer import BIN, DATA_DIR, ROOT

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
FLAGS_MD = os.path.join(DOCS, "flags.md")
QUICK = os.path.join(ROOT, "out", "quickstart")
USAGE_MARK = "<!-- usage: scripts/update_flag_docs.sh writes the block below from ./train_sdc -h -->"

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def md_files():
    return [README] + sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


def relative_links(path):
    """(line number, target) of every markdown link that is not a URL or a pure anchor; code spans and
    fenced blocks are not links"""
    out, fenced = [], False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            out.append((n, target.split("#")[0]))
    return out


def section_blocks(text, heading, lang="bash"):
    """the ```lang fenced blocks between the level-2 heading `heading` and the next level-2 heading"""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README.md has no '## {heading}' section"
    return re.findall(rf"^```{lang}\n(.*?)^```", m.group(1), re.M | re.S)


def test_readme_is_a_front_door():
    """Catches: the README growing back into a lab notebook, a missing table of contents, the two
    commands without how long they take."""
    text = open(README, encoding="utf-8").read()
    assert len(text.splitlines()) <= 320, f"README.md has {len(text.splitlines())} lines (at most 320)"
    assert "## Contents" in text
    for needle in ("scripts/sdc_compare.sh --smoke", "make test", "~5 min", "~2.5 min", "--trainer emu", "--paper", "-protect all"):
        assert needle in text, needle
    # the test command with how long it takes
    assert re.search(r"^make test +# .*~\d+ min", text, re.M), "README.md: the make test line without its time"


def test_relative_links_point_to_existing_files():
    """Catches: a link to a moved, renamed or never-written file in README.md or docs/*.md (the figure of the
    main job included)."""
    broken = []
    for path in md_files():
        # docs/report_reading_*.md are also embedded into the generated reports (REPORT.md at the top level),
        # so their links may be relative to the repository root as well
        bases = [os.path.dirname(path)] + ([ROOT] if os.path.basename(path).startswith("report_reading_") else [])
        for n, target in relative_links(path):
            if target and not any(os.path.exists(os.path.normpath(os.path.join(b, target))) for b in bases):
                broken.append(f"{os.path.relpath(path, ROOT)}:{n}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_docs_do_not_point_outside_the_repository():
    """Catches: documentation that sends the reader to the design brief outside the repository instead of
    docs/design.md."""
    hits = []
    for path in md_files():
        if os.path.basename(path) == "flags.md":    # the -h text: its block is the binary's own
            text = open(path, encoding="utf-8").read().split(USAGE_MARK)[0]
        else:
            text = open(path, encoding="utf-8").read()
        for n, line in enumerate(text.splitlines(), 1):
            if re.search(r"DESIGN\.md|STYLE\.md|\.\./shared/(?!data\b)", line):
                hits.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_flag_docs_are_the_trainers_usage_text():
    """Catches: a flag added, removed or reworded in the trainer but not in docs/flags.md (run
    scripts/update_flag_docs.sh after changing the flags)."""
    text = open(FLAGS_MD, encoding="utf-8").read()
    assert USAGE_MARK in text, f"docs/flags.md lacks the marker line {USAGE_MARK}"
    m = re.match(r"\s*```text\n(.*?)^```", text.split(USAGE_MARK, 1)[1], re.M | re.S)
    assert m, "docs/flags.md: no ```text block right after the usage marker"
    live = subprocess.run([BIN, "-h"], capture_output=True, text=True, timeout=60)
    assert live.returncode == 0, live.stderr
    assert m.group(1) == live.stdout, "docs/flags.md's usage block differs from ./train_sdc -h: run scripts/update_flag_docs.sh"


def test_quick_start_runs_as_written():
    """Catches: a quick-start command that no longer runs (a renamed flag, a changed default, a resume that
    the checkpoint refuses), or one that runs but leaves no checkpoint, no log end record or no fault log.
    The text comes from the data folder as CI provides it (the data script reuses a copy it finds in its
    output folder instead of downloading); `make` builds only what the quick start runs, since `make test`
    has built the rest."""
    blocks = section_blocks(open(README, encoding="utf-8").read(), "Quick start")
    assert blocks, "no ```bash block in the README's Quick start"
    script = "\n".join(blocks)
    script = re.sub(r"^make(\s+#.*)?$", "make -s train_sdc", script, flags=re.M)
    shutil.rmtree(QUICK, ignore_errors=True)
    os.makedirs(os.path.join(QUICK, "data"))
    shutil.copy(os.path.join(DATA_DIR, "tinyshakespeare.txt"), os.path.join(QUICK, "data", "tinyshakespeare.txt"))
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    env.setdefault("OMP_NUM_THREADS", "2")
    p = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, capture_output=True, text=True, errors="replace",
                       env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    def ends(run):
        recs = [json.loads(l) for l in open(os.path.join(QUICK, run, "log.jsonl"))]
        return [r for r in recs if r["type"] == "end"]

    for f in ("train.bin", "val.bin", "tokenizer.bin"):
        assert os.path.isfile(os.path.join(QUICK, "data", f)), f
    assert os.path.isfile(os.path.join(QUICK, "train", "step_000020.ckpt"))
    assert os.path.isfile(os.path.join(QUICK, "train", "step_000040.ckpt"))
    assert ends("train") and ends("train")[-1]["step"] == 40
    assert "sample" in p.stdout.lower() and ends("sample")
    for run in ("clean", "faulty", "protected"):
        assert os.path.isfile(os.path.join(QUICK, run, "step_000036.ckpt")), run
        assert ends(run) and ends(run)[-1]["step"] == 36, run
    for run in ("faulty", "protected"):
        events = [json.loads(l) for l in open(os.path.join(QUICK, run, "faults.jsonl"))]
        assert [e["step"] for e in events] == list(range(21, 36)), run
    # every fault caught and replayed: the protected run ends with the clean run's weights
    final = {run: re.findall(rf"checkpoint out/quickstart/{run}/step_000036.ckpt \(step 36, weights (\w+)\)", p.stdout)
             for run in ("clean", "faulty", "protected")}
    assert final["clean"] and final["clean"] == final["protected"] != final["faulty"], final
