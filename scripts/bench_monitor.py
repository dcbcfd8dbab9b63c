"""Benchmark: DataLoadingMonitor's cost per training step, against the bare loop and against
timing the loop by hand with two perf_counter() calls, in the same run.

    python scripts/bench_monitor.py --steps 1000000 --json bench_monitor.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dsconvert import DataLoadingMonitor  # noqa: E402


def bare(items) -> None:
    for _ in items:
        pass


def by_hand(items) -> None:
    """What a user writes without the monitor: two clock reads and an append per step."""
    loads, computes = [], []
    clock = time.perf_counter
    requested = clock()
    for _ in items:
        received = clock()
        loads.append(received - requested)
        requested = clock()
        computes.append(requested - received)


def monitored(items) -> None:
    for _ in DataLoadingMonitor().wrap(items):
        pass


def best_ns(fn, items, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn(items)
        best = min(best, time.perf_counter() - t)
    return best / len(items) * 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()
    items = list(range(args.steps))
    res = {name: best_ns(fn, items, args.repeats) for name, fn in
           (("bare_ns", bare), ("by_hand_ns", by_hand), ("monitor_ns", monitored))}
    m = DataLoadingMonitor(window=100)
    for _ in m.wrap(items[:1000]):
        pass
    t = time.perf_counter()
    for _ in range(1000):
        m.summary()
    res["summary_us"] = (time.perf_counter() - t) / 1000 * 1e6
    res["monitor_overhead_us"] = (res["monitor_ns"] - res["bare_ns"]) / 1000
    res["by_hand_overhead_us"] = (res["by_hand_ns"] - res["bare_ns"]) / 1000
    res["monitor_vs_by_hand"] = res["monitor_overhead_us"] / res["by_hand_overhead_us"]
    for k, v in res.items():
        print(f"{k:24s} {v:10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
