"""Every suite below run on a git revision ("before") and on this checkout ("after"),
in alternating order, and every number they report compared: after/before per round, median.

Each suite runs from its own tree (its own benchmarks and dsconvert, PYTHONPATH pointing at that
tree; a revision from before benchmarks/ runs its scripts/bench_NAME.py), with the small sizes
below so that the whole comparison fits in about half an hour on 2 cores. The suites already
measure dsconvert against its peers in one run; this adds the revision as one more axis.
Numbers are the JSON leaves each suite writes.

    python -m benchmarks compare REV [--rounds 2] [--only wds,cache] [--json out.json]

A ratio is "better" or "worse" by the leaf's name: rates (``per_s``, ``mb_s``, ``rate``,
``speedup``) are better higher, times (``seconds``, ``_s``, ``ms``) and memory (``rss``,
``bytes``) better lower; other leaves are listed without a verdict. A change within the two
rounds' spread of the "before" figures is noise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from benchmarks.common import ROOT

# name -> arguments (small: the comparison, not the headline figures of docs/benchmarks.md)
BENCHES = {
    "wds": ["--photos", "1500", "--per-shard", "500", "--workers", "2", "--slow-files", "150", "--no-litdata"],
    "cache": ["--photos", "800"],
    "verify": ["--photos", "800"],
    "analyze": ["--files", "20000"],
    "monitor": ["--steps", "200000", "--repeats", "3"],
    "diagnose": ["--seconds", "4"],
    "remote": ["--photos", "600", "--small-files", "100", "--delays", "0,10"],
}
HIGHER = re.compile(r"(per_s|_per_sec|mb_s|mbps|rate|speedup|throughput|samples_s|files_s)", re.I)
LOWER = re.compile(r"(seconds|_s$|_ms$|^ms|latency|rss|_bytes$|overhead|cost)", re.I)


def leaves(obj: Any, prefix: str = "") -> Dict[str, float]:
    out: Dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            key = v.get("name") or v.get("reader") or v.get("label") if isinstance(v, dict) else None
            out.update(leaves(v, f"{prefix}[{key if isinstance(key, str) else i}]"))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix] = float(obj)
    return out


def run_in(tree: str, bench: str, args: List[str], work: str) -> Dict[str, float]:
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, f"{bench}.json")
    scratch = os.path.join(work, f"scratch-{bench}")
    shutil.rmtree(scratch, ignore_errors=True)
    if os.path.exists(os.path.join(tree, "benchmarks", "__main__.py")):
        cmd = [sys.executable, "-m", "benchmarks", bench, *args, "--json", out]
    else:  # a revision from before benchmarks/: its script
        cmd = [sys.executable, os.path.join(tree, "scripts", f"bench_{bench}.py"), *args, "--json", out]
    if "--work" not in args and bench != "monitor":
        cmd += ["--work", scratch]
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {bench} in {tree} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return {}
    with open(out) as f:
        return leaves(json.load(f))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rev")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", help="comma-separated benchmark names: " + ",".join(BENCHES))
    p.add_argument("--json")


def run(args: argparse.Namespace) -> int:
    names = args.only.split(",") if args.only else list(BENCHES)
    work = tempfile.mkdtemp(prefix="dsconvert-compare-")
    before = os.path.join(work, "before-tree")
    subprocess.run(["git", "worktree", "add", "-q", "--detach", before, args.rev], cwd=ROOT, check=True)
    trees = {"before": before, "after": ROOT}
    results: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    try:
        for bench in names:
            for rnd in range(args.rounds):
                order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
                for side in order:
                    print(f"{bench}: round {rnd + 1}, {side}", file=sys.stderr, flush=True)
                    got = run_in(trees[side], bench, BENCHES[bench], os.path.join(work, side))
                    for key, value in got.items():
                        results.setdefault(bench, {}).setdefault(key, {}).setdefault(side, []).append(value)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", before], cwd=ROOT, check=False)
        shutil.rmtree(work, ignore_errors=True)
    report = []
    for bench, keys in results.items():
        print(f"\n## {bench}")
        for key, sides in sorted(keys.items()):
            b, a = sides.get("before", []), sides.get("after", [])
            if not b or not a or len(b) != len(a) or statistics.median(b) == 0:
                continue
            ratio = statistics.median(a) / statistics.median(b)
            spread = (max(b) - min(b)) / statistics.median(b) if len(b) > 1 else 0.0
            direction = "higher" if HIGHER.search(key) else "lower" if LOWER.search(key) else ""
            change = ratio - 1 if direction == "higher" else 1 - ratio if direction == "lower" else 0.0
            verdict = ("" if not direction else "noise" if abs(ratio - 1) <= max(spread, 0.05)
                       else "better" if change > 0 else "WORSE")
            report.append({"bench": bench, "key": key, "before": b, "after": a, "ratio": ratio,
                           "before_spread": spread, "better_when": direction, "verdict": verdict})
            if direction:
                print(f"  {key:60s} {statistics.median(b):12.4g} -> {statistics.median(a):12.4g}  "
                      f"x{ratio:5.2f}  {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rev": args.rev, "rounds": args.rounds, "results": report}, f, indent=1)
    worse = [r for r in report if r["verdict"] == "WORSE"]
    print(f"\n{len(report)} figures compared; {len(worse)} worse beyond the before-spread and 5 %")
    return 0


QUICK = ["--only", "monitor", "--rounds", "1"]  # with a REV: one suite, once on each side
TABLES: Dict[str, Any] = {}  # it prints (and writes --json); no table of the docs
