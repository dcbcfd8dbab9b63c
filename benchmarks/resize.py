"""Benchmark: decoded caches at a training resolution (`dsconvert shard --format npy --resize
256`), this checkout against the code issue 16 was filed on, in interleaved rounds.

    python -m benchmarks resize --photos 4000 --large 600 --rounds 3 --json docs/bench/resize.json

Writers, each a fresh process converting the same photos with 2 workers (verification on, the
default): ``before`` (git revision ``--rev``, the default decoder there), ``previous`` (git
revision ``--previous-rev``: the last version before the DCT scaling and torch's resize kernel,
which decoded with the fast decoder and resized with Pillow), ``pil`` (this
checkout, ``--decoder pil``: Pillow's full decode, then its bilinear resize), ``full`` (this
checkout's fast decoder with the DCT scaling switched off: what the code did before it) and
``scaled`` (this checkout's default: 1/2, 1/4 or 1/8 DCT scale where that covers the output 2.5
times over, then the bilinear filter). Two sources: the demo photos (375-pixel short side: no
scale covers 256 so, they decode in full) and large photos (2400x1800: 1/2). photos/s, median
[range]; each ratio is the median of the same round's ratios to ``before``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from benchmarks.common import ROOT, fmt_spread, meta, spread

# a fresh process converting with the dsconvert of the tree in argv[1] (a revision's worktree,
# or this checkout): the one place a path is put first on purpose
CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import dsconvert
assert dsconvert.__file__.startswith(sys.argv[1]), dsconvert.__file__  # the tree asked for, not the installed one
from dsconvert import convert
import dsconvert.codecs as codecs
mode, src, out = sys.argv[2:5]
opts = {"decoder": "pil"} if mode == "pil" else {}
if mode == "full":  # the fast decoder in full, as before the DCT scaling: where the resize reads it
    import importlib
    where = importlib.import_module("dsconvert.codecs.resize") if hasattr(codecs, "__path__") else codecs
    if hasattr(where, "scaled_eighths"):
        where.scaled_eighths = lambda *a: 8
t = time.perf_counter()
n = convert(src, out, "npy", resize=256, workers=2, **opts).manifest.num_samples
print(n / (time.perf_counter() - t))
"""


def large_photos(root: str, count: int) -> str:
    from PIL import Image

    from dsconvert.demo import load_photos

    photos = load_photos()
    names = sorted(photos)
    for i in range(count):
        cls = names[i % len(names)]
        folder = os.path.join(root, cls)
        os.makedirs(folder, exist_ok=True)
        img = photos[cls].convert("RGB").resize((2400, 1800), Image.Resampling.BICUBIC).rotate(i % 13)
        img.save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)
    return root


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=4000)
    p.add_argument("--large", type=int, default=600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rev", default="f95f585", help="the 'before' revision (default: when issue 16 was filed)")
    p.add_argument("--previous-rev", default="e737de3", help="the revision before the DCT-scaled resize")
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    from dsconvert.demo import make_demo_dataset

    work = tempfile.mkdtemp(prefix="bench-resize-")
    old_trees = {"before": os.path.join(work, "before-tree"), "previous": os.path.join(work, "previous-tree")}
    for name, rev in (("before", args.rev), ("previous", args.previous_rev)):
        subprocess.run(["git", "worktree", "add", "-q", "--detach", old_trees[name], rev], cwd=ROOT, check=True)
    trees = {**old_trees, "pil": ROOT, "full": ROOT, "scaled": ROOT}
    try:
        sources = {"demo photos (375-pixel short side)": make_demo_dataset(os.path.join(work, "demo"),
                                                                          -(-args.photos // 8)),
                   "large photos (2400x1800)": large_photos(os.path.join(work, "large"), args.large)}
        per: Dict[tuple, List[float]] = {}
        ratios: Dict[tuple, List[float]] = {}
        writers = list(trees)
        for r in range(args.rounds):
            for source, src in sources.items():
                rates = {}
                for w in writers[r % len(writers):] + writers[:r % len(writers)]:
                    out = os.path.join(work, "out")
                    shutil.rmtree(out, ignore_errors=True)
                    done = subprocess.run([sys.executable, "-c", CHILD, trees[w], w, src, out], check=True,
                                          capture_output=True, text=True, cwd=work)
                    rates[w] = float(done.stdout.strip().splitlines()[-1])
                    per.setdefault((source, w), []).append(rates[w])
                for w, rate in rates.items():
                    ratios.setdefault((source, w), []).append(rate / rates["before"])
                print(f"round {r + 1} {source}: " + ", ".join(f"{w} {v:,.0f}/s" for w, v in rates.items()), flush=True)
    finally:
        for tree in old_trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, check=False)
        shutil.rmtree(work, ignore_errors=True)
    rows = [{"source": s, "writer": w, "per_s": spread(v), "vs_before": spread(ratios[(s, w)])}
            for (s, w), v in per.items()]
    res = {"meta": dict(meta(), rounds=args.rounds, rev=args.rev, previous_rev=args.previous_rev,
                        photos=args.photos, large=args.large,
                        workers=2), "rows": rows}
    for row in rows:
        print(f"{row['source']:36s} {row['writer']:7s} {row['per_s']['median']:7,.0f}/s  "
              f"{row['vs_before']['median']:.2f}x [{row['vs_before']['min']:.2f}-{row['vs_before']['max']:.2f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)



def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    labels = {"before": f"before: revision {meta['rev']} (when issue 16 was filed)",
              "previous": f"previous: revision {meta.get('previous_rev')} (fast decoder in full, Pillow's resize)",
              "pil": "`--decoder pil` (Pillow's full decode, then its bilinear resize)",
              "full": "the fast decoder in full, then torch's bilinear kernel (the DCT scaling switched off)",
              "scaled": "default: the fast decoder at 1/2, 1/4 or 1/8 DCT scale where that covers the output "
                        "2.5 times over, then torch's bilinear kernel"}
    lines = [f"`dsconvert shard SRC --format npy --resize 256`, {meta['workers']} workers, verification on; each "
             f"writer a fresh process per round, {meta['rounds']} interleaved rounds (the writers in a rotating "
             "order), photos/s, median [range]; the ratio is the median of the same round's ratios to *before*.", "",
             "| source | writer | photos/s | vs before |", "| --- | --- | --- | --- |"]
    for r in data["rows"]:
        vs = "(baseline)" if r["writer"] == "before" else fmt_spread(r["vs_before"], "{:.2f}x")
        lines.append(f"| {r['source']} | {labels.get(r['writer'], r['writer'])} | {fmt_spread(r['per_s'])} | {vs} |")
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "16", "--large", "4", "--rounds", "1"]
TABLES = {"resize": {"argv": lambda a: ["--photos", str(a.photos), "--large", "400", "--rounds", str(a.rounds)],
                     "render": render}}
