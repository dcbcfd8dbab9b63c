"""Every code block of README.md and docs/**/*.md runs as written, and the docs site builds.

Each ```python, ```bash, ```sh and ```console block is one test. It runs in a fresh folder
that holds ``train/`` (an ImageFolder of small real JPEGs, 3 classes), so the docs use
relative paths. An HTML comment on the line before a block says what else it needs or why it
cannot run here; the comments are invisible on the rendered page:

* ``<!-- needs: train-wds train-npy -->``: inputs made before the block runs (see PROVIDES).
* ``<!-- continues -->``: a Python block that goes on from the previous Python block of its
  page (that block runs first, in the same namespace).
* ``<!-- skip: REASON -->``: the block needs what a test cannot have (a GPU, an S3 bucket, a
  running job's PID, a fresh virtual environment); it is reported as skipped with REASON.
* ``<!-- skip-page: REASON -->`` anywhere on a page: every block of the page is skipped with
  REASON (the benchmark pages: each block is a benchmark run).
* ``<!-- run-by: tests/test_x.py -->`` anywhere on a page: its blocks need a setting of their
  own (several datasets, a Hugging Face export) and are run as written by that test file, which
  must read the page (``test_pages_run_by_another_test_are_run_there`` checks that it does).

Python blocks run in this process (torch is imported once); shell blocks run under ``bash -e``
with this interpreter's ``bin/`` first on PATH (``dsconvert`` and ``python`` are the
environment's). Output samples are ```text blocks; every fence names its language. The tables
that the benchmark runner writes between ``<!-- bench_all:NAME begin/end -->`` markers are
records of a run, not instructions, and are not read.

Tiers: the checks of the pages themselves (fences, nav, the README's set-up commands, the
extras table) are fast; running the blocks and building the site take seconds each, so they
are ``slow`` (and ``system`` where a block starts processes of its own), run by ``.ci/run``.
The whole file took 2 min 20 s and 3 min 24 s in two runs on a 2-core machine (about 8 minutes
when it shares the cores with other jobs), most of it in `analyze`, `diagnose` and Lightning.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pytest

from conftest import make_image_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
RUN = {"python", "bash", "sh", "console"}
LANGUAGES = RUN | {"text", "yaml", "toml", "json", "c"}
CLASSES = {"cat": 8, "dog": 8, "fox": 8}  # ImageFolder's order: cat 0, dog 1, fox 2
# every block takes seconds (torch, DataLoader workers): the full tier. Blocks that run a job
# in processes of their own (DataLoader workers in a CLI subprocess, gloo ranks, a Dask
# cluster, py-spy on a process) are system tests too.
SYSTEM = re.compile(r"dsconvert (analyze|bench|diagnose)\b|lightning_resume|--cluster|torchrun")

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
GENERATED = re.compile(r"<!-- bench_all:(\w+) begin -->.*?<!-- bench_all:\1 end -->", re.S)
MARK = re.compile(r"<!--\s*(needs|skip-page|skip|continues|run-by)\s*:?\s*(.*?)\s*-->", re.S)


@dataclass
class Block:
    page: str  # relative to the repository
    line: int
    lang: str
    code: str
    needs: List[str] = field(default_factory=list)
    skip: Optional[str] = None
    run_by: Optional[str] = None  # the test file that runs this page's blocks in their own setting
    continues: bool = False
    previous: Optional[Block] = None  # the page's previous Python block

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> List[str]:
    return [README] + sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))


def fences(path: str):
    """(line, language, code, marks before it) of every fenced block outside generated tables."""
    text = open(path, encoding="utf-8").read()
    blanked = GENERATED.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    end = 0
    for m in FENCE.finditer(blanked):
        before = blanked[end:m.start()]
        # the marks that belong to a block are the comments between it and the previous block,
        # on the lines right above it
        tail = before.rstrip("\n").rsplit("\n\n", 1)[-1]
        yield text.count("\n", 0, m.start()) + 1, m.group(1).strip(), text[m.start(2):m.end(2)], \
            MARK.findall(tail)
        end = m.end()


def blocks() -> List[Block]:
    found = []
    for path in pages():
        page = os.path.relpath(path, ROOT)
        page_skip = run_by = None
        for kind, arg in MARK.findall(open(path, encoding="utf-8").read()):
            if kind == "skip-page":
                page_skip = arg
            elif kind == "run-by":
                run_by = arg
        previous = None
        for line, lang, code, marks in fences(path):
            if lang not in RUN:
                continue
            b = Block(page, line, lang, code, skip=page_skip, run_by=run_by, previous=previous)
            for kind, arg in marks:
                if kind == "needs":
                    b.needs += arg.split()
                elif kind == "skip":
                    b.skip = arg
                elif kind == "continues":
                    b.continues = True
            found.append(b)
            if lang == "python":
                previous = b
    return found


BLOCKS = blocks()


# --- what the blocks run on ----------------------------------------------------------------

TRAIN_PY = '''\
"""A training loop on train/ as ImageFolder gives it (the docs' stand-in for yours)."""
import torch
from torchvision import datasets, transforms

T = transforms.Compose([transforms.RandomResizedCrop(64), transforms.ToTensor()])
loader = torch.utils.data.DataLoader(datasets.ImageFolder("train", transform=T), batch_size=8,
                                     shuffle=True, num_workers=2)
for epoch in range(1000):
    for images, labels in loader:
        pass
'''


def _provide_train(base: str, photos) -> None:
    make_image_folder(os.path.join(base, "train"), photos, CLASSES, size=(160, 120))


def _convert(name: str, **options):
    def make(base: str, photos) -> None:
        from dsconvert import convert

        convert(os.path.join(base, "train"), os.path.join(base, name), workers=1, **options)
    return make


def _provide_shards(base: str, photos) -> None:
    """Tar shards another tool wrote: webdataset's ShardWriter, a jpg and a cls member each."""
    import webdataset as wds
    from torchvision.datasets import ImageFolder

    os.makedirs(os.path.join(base, "shards"))
    pattern = os.path.join(base, "shards", "train-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=12, verbose=0) as sink:
        for i, (path, label) in enumerate(ImageFolder(os.path.join(base, "train")).samples):
            with open(path, "rb") as f:
                sink.write({"__key__": f"{i:06d}", "jpg": f.read(), "cls": label})


def _provide_list(base: str, photos) -> None:
    from torchvision.datasets import ImageFolder

    with open(os.path.join(base, "train.csv"), "w") as f:
        f.write("path,label\n")
        for path, label in ImageFolder(os.path.join(base, "train")).samples:
            f.write(f"{os.path.relpath(path, base)},{label}\n")


def _provide_examples(base: str, photos) -> None:
    shutil.copytree(os.path.join(ROOT, "examples"), os.path.join(base, "examples"))


def _provide_train_py(base: str, photos) -> None:
    with open(os.path.join(base, "train.py"), "w") as f:
        f.write(TRAIN_PY)


PROVIDES = {
    "train-wds": _convert("train-wds"),
    "train-npy": _convert("train-npy", format="npy", resize=256),
    "train-hdf5": _convert("train-hdf5", format="hdf5"),
    "train-hdf5-pixels": _convert("train-hdf5-pixels", format="hdf5", decode=True),
    "shards": _provide_shards,
    "train.csv": _provide_list,
    "train.py": _provide_train_py,
    "examples": _provide_examples,
}


@pytest.fixture(scope="session")
def made(tmp_path_factory, photos):
    """Everything a block may need, made once; each block gets its own copy."""
    base = str(tmp_path_factory.mktemp("docs-inputs"))
    _provide_train(base, photos)
    done = set()

    def get(names: List[str]) -> str:
        for name in names:
            if name not in PROVIDES:
                raise AssertionError(f"needs: {name!r} is not one of {sorted(PROVIDES)}")
            if name not in done:
                PROVIDES[name](base, photos)
                done.add(name)
        return base
    return get


def _sandbox(tmp_path, made, block: Block) -> str:
    needs = list(block.needs)
    b = block
    while b.continues and b.previous is not None:
        b = b.previous
        needs += b.needs
    base = made(needs)
    cwd = str(tmp_path / "cwd")
    os.makedirs(cwd)
    for name in ["train"] + needs:
        src, dst = os.path.join(base, name), os.path.join(cwd, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, dst)
    return cwd


def _chain(block: Block) -> List[Block]:
    chain = [block]
    while chain[0].continues:
        assert chain[0].previous is not None, f"{chain[0].id}: 'continues' needs a Python block before it"
        chain.insert(0, chain[0].previous)
    return chain


def _shell(block: Block) -> str:
    if block.lang != "console":
        return block.code
    return "\n".join(line[2:] for line in block.code.splitlines() if line.startswith("$ "))


def _params():
    for b in BLOCKS:
        marks = [pytest.mark.slow] + ([pytest.mark.system] if SYSTEM.search(b.code) else [])
        yield pytest.param(b, id=b.id, marks=marks)


@pytest.mark.parametrize("block", list(_params()))
def test_the_block_runs_as_written(block: Block, tmp_path, made, monkeypatch):
    if block.skip:
        pytest.skip(block.skip)
    if block.run_by:
        pytest.skip(f"run as written by {block.run_by}, in the setting the page describes")
    if block.lang == "python" or "torch" in block.code or "dsconvert " in block.code:
        pytest.importorskip("torchvision", reason="the docs' examples need torch and torchvision "
                            "(pip install -e '.[test]')")
    diagnose = "dsconvert diagnose" in block.code
    if diagnose and not shutil.which("py-spy", path=os.path.dirname(sys.executable)):
        pytest.skip("py-spy is not installed (pip install 'dsconvert[diagnose]')")
    cwd = _sandbox(tmp_path, made, block)
    monkeypatch.chdir(cwd)
    if block.lang == "python":
        namespace: Dict[str, object] = {"__name__": "__main__"}
        for b in _chain(block):
            exec(compile(b.code, f"{b.page}:{b.line}", "exec"), namespace)
        return
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", _shell(block)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    if diagnose and done.returncode != 0 and "need to read the process's memory" in done.stderr:
        pytest.skip(f"py-spy may not attach here (ptrace is restricted): {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.system
def test_the_lightning_example_trains_on_more_than_two_classes(tmp_path, made):
    """examples/lightning_resume.py sizes its model from the output's classes (it had
    Linear(1, 2), and failed on any output of more than 2 classes): 3 classes here, killed
    mid-epoch and resumed."""
    pytest.importorskip("lightning.pytorch")
    pytest.importorskip("torchdata.stateful_dataloader")
    out = os.path.join(made(["train-wds"]), "train-wds")
    example = os.path.join(ROOT, "examples", "lightning_resume.py")
    work = str(tmp_path / "work")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    crashed = subprocess.run([sys.executable, example, out, work, "--crash-at", "2", "--workers", "1"],
                             capture_output=True, text=True, timeout=300, env=env)
    assert crashed.returncode != 0 and "preempted before step 2" in crashed.stderr, crashed.stderr[-2000:]
    resumed = subprocess.run([sys.executable, example, out, work, "--workers", "1"],
                             capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    import json

    steps = [json.loads(line)["step"] for line in open(os.path.join(work, "seen.jsonl"))]
    assert steps == list(range(len(steps))) and len(steps) == 6  # 24 samples in batches of 4


# --- the pages themselves --------------------------------------------------------------------

def test_every_fence_names_its_language():
    unnamed = [f"{os.path.relpath(p, ROOT)}:{line}" for p in pages() for line, lang, _, _ in fences(p)
               if lang not in LANGUAGES]
    assert not unnamed, f"fences without a known language (python, bash, console, text...): {unnamed}"


def test_pages_run_by_another_test_are_run_there():
    """A page whose blocks another test runs is read by that test: the file exists and names it."""
    for page, run_by in sorted({(b.page, b.run_by) for b in BLOCKS if b.run_by}):
        path = os.path.join(ROOT, run_by)
        assert os.path.isfile(path), (page, run_by)
        name = os.path.basename(page)
        assert name in open(path, encoding="utf-8").read(), f"{run_by} does not read {page}"


def test_skips_are_few_and_say_why():
    skipped = [b for b in BLOCKS if b.skip and not b.page.startswith(os.path.join("docs", "benchmarks"))]
    assert all(len(b.skip) > 10 for b in skipped)
    assert len(skipped) <= len(BLOCKS) // 4, [b.id for b in skipped]


def test_the_readme_is_short_and_links_the_docs():
    text = open(README, encoding="utf-8").read()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert os.path.exists(os.path.join(ROOT, target)), target


def test_the_readme_setup_commands_are_the_ones_ci_runs():
    """The README's two set-up commands: the test command installs the extra .ci/run installs
    and runs pytest; the demo command names a script that exists; both extras install what the
    examples import (a torch and torchvision pair)."""
    text = open(README, encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    test = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
    assert test in text
    assert re.search(r"\.venv/bin/pip install (-q )?-e '\.\[test\]'", ci) and ".venv/bin/python -m pytest" in ci
    demo = re.search(r"\.venv/bin/pip install -e '\.\[demo\]' && \.venv/bin/python (\S+)", text)
    assert demo and os.path.exists(os.path.join(ROOT, demo.group(1))), "the README's demo command"
    pyproject = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    for extra in ("demo", "test"):
        line = re.search(rf"^{extra} = \[(.*?)\]$", pyproject, re.S | re.M).group(1)
        assert "torchvision==" in line and "torch==" in line, extra


def test_every_extra_is_in_the_install_table():
    pyproject = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = re.findall(r"^([a-z][a-z0-9_-]*) = \[", section, re.M)
    index = open(os.path.join(DOCS, "index.md"), encoding="utf-8").read()
    assert extras and all(f"| `[{e}]`" in index for e in extras), \
        [e for e in extras if f"| `[{e}]`" not in index]


def test_every_page_is_in_the_site_nav():
    config = open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8").read()
    for path in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True):
        assert os.path.relpath(path, DOCS) in config, path


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    # not -q: it hides the warnings, and --strict then passes whatever they say
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", os.path.join(ROOT, "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert os.path.exists(tmp_path / "site" / "index.html")
