"""Benchmark: analyze's own time on a large tree of small files, against listing the tree with
`find` and with os.walk + stat, in interleaved rounds (every step once per round, in a
rotating order), median and range of the seconds and of the same-round ratios.

    python -m benchmarks analyze --files 100000 --rounds 3 --json docs/bench/analyze.json

The tree (tiny JPEGs, ``--per-dir`` to a folder) is made once under ``--work`` and kept; the
page cache is warm for its metadata (every step lists it).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List

from PIL import Image

from benchmarks.common import fmt_spread, meta, spread
from dsconvert.analyze import analyze
from dsconvert.analyze.inventory import take_inventory

BUDGET = 0.2  # seconds: the time-budgeted inventory's budget


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


def timed(fn: Callable[[], Any]) -> Any:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out



# (key, what the table calls it): every step is one measurement per round
STEPS = (("find", "`find ROOT -type f` (listing only, no stat from Python)"),
         ("os_walk_stat", "`os.walk` + `os.stat` per file (the Python floor)"),
         ("inventory_1_thread", "inventory, 1 thread"),
         ("inventory_2_threads", "inventory, 2 threads"),
         ("inventory_8_threads", "inventory, 8 threads"),
         ("inventory_default", "inventory, default threads (2 on a local disk)"),
         ("inventory_budget", f"inventory with `--time-budget {BUDGET:g}`"),
         ("analyze", "whole `analyze` (inventory + sample: reads, sweep, decode, DataLoader passes)"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--per-dir", type=int, default=1000, help="files per folder")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-analyze"))
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    root = os.path.join(args.work, f"tree-{args.files}-{args.per_dir}")
    t = time.perf_counter()
    make_tree(root, args.files, args.per_dir)
    print(f"tree of {args.files:,} files ready in {time.perf_counter() - t:.1f} s", flush=True)

    def run_step(key: str) -> Any:
        if key == "find":
            return timed(lambda: subprocess.run(["find", root, "-type", "f"], check=True, stdout=subprocess.DEVNULL))
        if key == "os_walk_stat":
            return timed(lambda: walk_stat(root))
        if key == "inventory_default":
            return timed(lambda: take_inventory(root))
        if key == "inventory_budget":
            return timed(lambda: take_inventory(root, time_budget=BUDGET))
        if key == "analyze":
            return timed(lambda: analyze(root))
        threads = int(key.split("_")[1])
        return timed(lambda: take_inventory(root, threads=threads))

    keys = [k for k, _ in STEPS]
    seconds: Dict[str, List[float]] = {k: [] for k in keys}
    budget: Dict[str, List[Any]] = {"files_seen": [], "estimated_files": [], "complete": []}
    analyzed: Dict[str, List[Any]] = {"verdict": [], "inventory_seconds": [], "report_seconds": []}
    inventory_files: List[int] = []
    started = time.perf_counter()
    for r in range(args.rounds):
        order = keys[r % len(keys):] + keys[: r % len(keys)]  # rotate: no step always runs first
        for key in order:
            s, out = run_step(key)
            seconds[key].append(s)
            if key == "inventory_default":
                inventory_files.append(out.files)
            elif key == "inventory_budget":
                budget["files_seen"].append(out.files)
                budget["estimated_files"].append(out.estimated_files)
                budget["complete"].append(out.complete)
            elif key == "analyze":
                analyzed["verdict"].append(out["verdict"]["bottleneck"])
                analyzed["inventory_seconds"].append(out["inventory"]["seconds"])
                analyzed["report_seconds"].append(out["seconds"])
            print(f"round {r + 1} {key:20s} {s:8.3f} s", flush=True)
    ratios = {"inventory_vs_os_walk_stat": [a / b for a, b in zip(seconds["inventory_default"],
                                                                   seconds["os_walk_stat"])],
              "analyze_vs_find": [a / b for a, b in zip(seconds["analyze"], seconds["find"])]}
    res = {"meta": meta(), "files": args.files, "folders": -(-args.files // args.per_dir),
           "rounds": args.rounds, "wall_s": time.perf_counter() - started, "inventory_files": inventory_files,
           "steps": [dict(spread(seconds[k]), name=k, label=label) for k, label in STEPS],
           "budget": dict(budget, seconds=BUDGET), "analyze": analyzed,
           "ratios": {k: spread(v) for k, v in ratios.items()}}
    print(f"\n{args.files:,} files, {args.rounds} rounds: seconds, median [range]")
    for row in res["steps"]:
        print(f"{row['name']:20s} {row['median']:8.3f} [{row['min']:.3f}-{row['max']:.3f}]")
    for k, v in res["ratios"].items():
        print(f"{k:26s} {v['median']:8.2f}x [{v['min']:.2f}-{v['max']:.2f}]")
    print(f"analyze's verdict per round: {', '.join(analyzed['verdict'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    import statistics
    from collections import Counter

    lines = [f"{data['files']:,} files (tiny JPEGs) in {data['folders']:,} folders on the local disk, page cache "
             f"warm for the metadata; {data['rounds']} interleaved rounds (every step once per round, in a "
             "rotating order): seconds, median [range]; each ratio is the median of the per-round ratios.", "",
             "| step | seconds |", "| --- | --- |"]
    budget = data["budget"]
    for s in data["steps"]:
        cell = fmt_spread(s, "{:.3f}" if s["median"] < 0.1 else "{:.2f}")
        if s["name"] == "inventory_budget" and budget["files_seen"]:
            cell += (f": saw {statistics.median(budget['files_seen']):,.0f} files, estimated "
                     f"{statistics.median(budget['estimated_files']):,.0f} (true: {data['files']:,}), medians")
        lines.append(f"| {s['label']} | {cell} |")
    names = {"inventory_vs_os_walk_stat": "inventory (default threads) vs `os.walk` + `os.stat`",
             "analyze_vs_find": "whole `analyze` vs `find`"}
    lines += ["", "| ratio (same round) | median [range] |", "| --- | --- |"]
    for key, r in data["ratios"].items():
        fmt = "{:.2f}x" if r["median"] < 10 else "{:,.0f}x"
        lines.append(f"| {names.get(key, key)} | {fmt_spread(r, fmt)} |")
    verdicts = Counter(data["analyze"]["verdict"])
    lines += ["", "analyze's verdict: " + ", ".join(f"`{v}` ({n} of {data['rounds']} rounds)"
                                                   for v, n in verdicts.most_common()) + "."]
    return "\n".join(lines) + "\n"


QUICK = ["--files", "200", "--per-dir", "50", "--rounds", "1"]
TABLES = {"analyze": {"argv": lambda a: ["--files", "100000", "--rounds", str(a.rounds + 2)], "render": render}}
