"""The read and write paths of a git revision ("before") against this checkout ("after").

In alternating fresh processes, 5 rounds, medians and ranges of the per-round ratios: 4,000
photos of 160x120, conversion with one worker and --no-verify, a warm pass of every sample
(wds decode="raw", npy decode="numpy").

    python -m benchmarks before_after [REV]   # REV defaults to b327f7e
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from benchmarks.common import ROOT

# each child loads the dsconvert of the tree in argv[1] (the revision's worktree, or this
# checkout): the one place a path is put first on purpose
READ = """
import sys, time; sys.path.insert(0, sys.argv[1])
from dsconvert import open_dataset
ds = open_dataset(sys.argv[2], decode=sys.argv[3])
list(ds)  # warm-up
t = time.perf_counter(); n = sum(1 for _ in ds); print(n / (time.perf_counter() - t))
"""
WRITE = """
import sys, time, shutil; sys.path.insert(0, sys.argv[1])
from dsconvert import convert
t = time.perf_counter(); convert(sys.argv[2], sys.argv[3], sys.argv[4], samples_per_shard=1000, workers=1, verify=False)
print({photos} / (time.perf_counter() - t))
"""
SOURCE = """
import sys
from tests.conftest import make_image_folder
from dsconvert.demo import load_photos
n = int(sys.argv[2]) // 4
make_image_folder(sys.argv[1], load_photos(('astronaut','coffee','chelsea','rocket','camera')),
                  {'a': n, 'b': n, 'c': n, 'd': n}, size=(160, 120))
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rev", nargs="?", default="b327f7e", help="the 'before' revision (default: %(default)s)")
    p.add_argument("--photos", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=5)


def run(args: argparse.Namespace) -> None:
    py = sys.executable
    work = tempfile.mkdtemp()
    old_tree = os.path.join(work, "before-tree")
    subprocess.run(["git", "worktree", "add", "-q", "--detach", old_tree, args.rev], cwd=ROOT, check=True)
    trees = {"before": old_tree, "after": ROOT}
    write = WRITE.replace("{photos}", str(args.photos))
    try:
        src = os.path.join(work, "src")
        subprocess.run([py, "-c", SOURCE, src, str(args.photos)], check=True, cwd=ROOT)
        res: Dict[str, List[float]] = {}
        for fmt in ("wds", "npy"):
            out = os.path.join(work, f"out-{fmt}")
            subprocess.run([py, "-c", write, ROOT, src, out, fmt], check=True, capture_output=True)
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    for mode in (("raw",) if fmt == "wds" else ("numpy",)):
                        r = float(subprocess.run([py, "-c", READ, tree, out, mode], check=True, capture_output=True,
                                                 text=True, cwd="/tmp").stdout)
                        res.setdefault(f"read {fmt} {mode} {name}", []).append(r)
                    o = os.path.join(work, f"w-{name}-{fmt}")
                    shutil.rmtree(o, ignore_errors=True)
                    w = float(subprocess.run([py, "-c", write, tree, src, o, fmt], check=True, capture_output=True,
                                             text=True, cwd="/tmp").stdout)
                    res.setdefault(f"write {fmt} {name}", []).append(w)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", old_tree], cwd=ROOT, check=False)
        shutil.rmtree(work, ignore_errors=True)
    for k in sorted(res):
        v = res[k]
        print(f"{k:28s} median {statistics.median(v):10,.0f}/s  range {min(v):,.0f}-{max(v):,.0f}")
    for key in sorted({k.rsplit(' ', 1)[0] for k in res}):
        a, b = res[key + " before"], res[key + " after"]
        ratios = [y / x for x, y in zip(a, b)]
        print(f"{key:22s} after/before median {statistics.median(ratios):.2f} range {min(ratios):.2f}-"
              f"{max(ratios):.2f}")


QUICK = ["--photos", "40", "--rounds", "1"]
TABLES: Dict[str, Any] = {}  # it prints; its figures are quoted in the prose of docs/benchmarks.md
