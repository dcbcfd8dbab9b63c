"""The cost of issue 13's decode checks, against the codecs module of a git revision.

The fast decoder's own header read (for the pixel limit) and strict libjpeg warnings, against
the codecs module of a given git revision, interleaved.

    python -m benchmarks decode_checks [REV]   # REV: the revision to compare with (b327f7e)
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import statistics
import subprocess
import tempfile
import time
from typing import Any, Dict

from benchmarks.common import ROOT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rev", nargs="?", default="b327f7e", help="the revision to compare with (default: %(default)s)")
    p.add_argument("--copies", type=int, default=100, help="times each photo is decoded per round")
    p.add_argument("--rounds", type=int, default=5)


def run(args: argparse.Namespace) -> None:
    from dsconvert import codecs as new
    from dsconvert.demo import load_photos

    old_path = os.path.join(tempfile.mkdtemp(), "codecs_old.py")
    with open(old_path, "wb") as f:
        f.write(subprocess.run(["git", "show", f"{args.rev}:dsconvert/codecs.py"], cwd=ROOT, capture_output=True,
                               check=True).stdout)
    spec = importlib.util.spec_from_file_location("dsconvert.codecs_old", old_path)
    old = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(old)  # type: ignore[union-attr]
    photos = load_photos(("astronaut", "coffee", "chelsea"))
    imgs = []
    for side in (64, 160, 500):
        for p in photos.values():
            b = io.BytesIO()
            p.resize((side, int(side * .75))).save(b, "JPEG", quality=90)
            imgs.append((side, b.getvalue()))
    for side in (64, 160, 500):
        data = [d for s, d in imgs if s == side] * args.copies
        ratios = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            [old.decode_rgb(d, "turbojpeg") for d in data]
            a = time.perf_counter() - t
            t = time.perf_counter()
            [new.decode_rgb(d, "turbojpeg") for d in data]
            b = time.perf_counter() - t
            ratios.append(b / a)
        print(f"{side}px: new/old time median {statistics.median(ratios):.3f} range {min(ratios):.3f}-"
              f"{max(ratios):.3f}; old {a / len(data) * 1e6:.0f} us/img")


QUICK = ["--copies", "2", "--rounds", "1"]
TABLES: Dict[str, Any] = {}  # it prints; its figures are quoted in the prose of docs/benchmarks.md
