"""Benchmark: analyze's own time on a 100k-file tree, against listing the tree with
`find` and with os.walk + stat, in the same run.

    python scripts/bench_analyze.py --files 100000 --json bench_analyze.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from PIL import Image  # noqa: E402

from dsconvert.analyze import analyze  # noqa: E402
from dsconvert.analyze.inventory import take_inventory  # noqa: E402


def make_tree(root: str, files: int, per_dir: int = 1000) -> None:
    if os.path.exists(os.path.join(root, ".done")):
        return
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (120, 60, 200)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    for i in range(files):
        d = os.path.join(root, f"class{i // per_dir:04d}")
        if i % per_dir == 0:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"img{i:07d}.jpg"), "wb") as f:
            f.write(data)
    open(os.path.join(root, ".done"), "w").close()


def walk_stat(root: str) -> int:
    n = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            os.stat(os.path.join(dirpath, name))
            n += 1
    return n


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-analyze"))
    p.add_argument("--json")
    args = p.parse_args()
    root = os.path.join(args.work, "tree")
    make_tree(root, args.files)
    res = {}
    res["find_seconds"], _ = timed(lambda: subprocess.run(["find", root, "-type", "f"], check=True,
                                                          stdout=subprocess.DEVNULL))
    res["os_walk_stat_seconds"], n = timed(lambda: walk_stat(root))
    for threads in (1, 2, 8):
        res[f"inventory_{threads}_threads_seconds"], inv = timed(lambda: take_inventory(root, threads=threads))
    res["inventory_default_seconds"], inv = timed(lambda: take_inventory(root))
    res["inventory_files"] = inv.files
    res["inventory_budget_0.2s_seconds"], partial = timed(lambda: take_inventory(root, time_budget=0.2))
    res["inventory_budget_0.2s"] = {"files_seen": partial.files, "estimated_files": partial.estimated_files,
                                  "complete": partial.complete}
    res["analyze_seconds"], report = timed(lambda: analyze(root))
    res["analyze_phases"] = {"inventory_seconds": report["inventory"]["seconds"]}
    res["analyze_verdict"] = report["verdict"]["bottleneck"]
    res["analyze_overhead_vs_find"] = res["analyze_seconds"] / res["find_seconds"]
    res["inventory_vs_os_walk_stat"] = res["inventory_default_seconds"] / res["os_walk_stat_seconds"]
    for k, v in res.items():
        print(f"{k:34s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
