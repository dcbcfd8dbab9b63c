"""Benchmark: DataLoadingMonitor's cost per training step, against the bare loop and against
timing the loop by hand with two perf_counter() calls, in interleaved rounds.

Each round times the three loops over the same list of ``--steps`` items (best of
``--repeats`` each, in a rotating order, one process) and the monitor's ``summary()`` over a
100-step window. The figures are the median and range over rounds; the overheads (ns per step
over the bare loop's) and their ratio are computed per round, and their median reported.

    python -m benchmarks monitor --steps 1000000 --rounds 7 --json docs/bench/monitor.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable, Dict, List

from benchmarks.common import fmt_spread, spread
from dsconvert import DataLoadingMonitor


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


LOOPS: Dict[str, Callable[[Any], None]] = {"bare": bare, "by_hand": by_hand, "monitor": monitored}


def best_ns(fn, items, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn(items)
        best = min(best, time.perf_counter() - t)
    return best / len(items) * 1e9


def summary_us(items) -> float:
    m = DataLoadingMonitor(window=100)
    for _ in m.wrap(items[:1000]):
        pass
    t = time.perf_counter()
    for _ in range(1000):
        m.summary()
    return (time.perf_counter() - t) / 1000 * 1e6



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    items = list(range(args.steps))
    names = list(LOOPS)
    ns: Dict[str, List[float]] = {name: [] for name in names}
    summary: List[float] = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            ns[name].append(best_ns(LOOPS[name], items, args.repeats))
        summary.append(summary_us(items))
        print(f"round {r + 1}: " + "  ".join(f"{name} {ns[name][-1]:.0f} ns" for name in names)
              + f"  summary() {summary[-1]:.0f} us", flush=True)

    overhead = {name: [(a - b) / 1000 for a, b in zip(ns[name], ns["bare"])] for name in ("by_hand", "monitor")}
    ratio = [m / h for m, h in zip(overhead["monitor"], overhead["by_hand"])]
    res = {"loops": [dict(loop=name, **spread(ns[name])) for name in names],
           "overhead_us": [dict(loop=name, **spread(v)) for name, v in overhead.items()],
           "monitor_vs_by_hand": spread(ratio), "summary_us": spread(summary)}
    print(f"\n{args.steps} steps, best of {args.repeats}, {args.rounds} rounds: median [range]")
    for row in res["loops"]:
        print(f"{row['loop']:10s} {row['median']:8.0f} ns per step [{row['min']:.0f}-{row['max']:.0f}]")
    for row in res["overhead_us"]:
        print(f"{row['loop']:10s} {row['median']:8.3f} us per step over bare [{row['min']:.3f}-{row['max']:.3f}]")
    r = res["monitor_vs_by_hand"]
    print(f"monitor overhead / by-hand overhead {r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]")
    s = res["summary_us"]
    print(f"summary() {s['median']:.0f} us [{s['min']:.0f}-{s['max']:.0f}]")
    if args.json:
        from benchmarks.common import meta as record

        meta = dict(record(), steps=args.steps, repeats=args.repeats, rounds=args.rounds)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, **res}, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    loops = {r["loop"]: r for r in data["loops"]}
    over = {r["loop"]: r for r in data["overhead_us"]}
    labels = (("bare", "bare `for` loop"),
              ("by_hand", "timed by hand (two `perf_counter()` calls and two list appends per step)"),
              ("monitor", "`monitor.wrap(...)`"))
    lines = [f"A loop over a list of {meta['steps']:,} items, best of {meta['repeats']} in each of {meta['rounds']} "
             "interleaved rounds, one process, median [range]; the overhead is the loop's time per step less the "
             "bare loop's in the same round.", "",
             "| loop | ns per step | overhead, µs per step |", "| --- | --- | --- |"]
    for name, label in labels:
        r = loops[name]
        o = over.get(name)
        cell = fmt_spread(o, "{:.3f}") if o else "(baseline)"
        lines.append(f"| {label} | {fmt_spread(r)} | {cell} |")
    ratio, s = data["monitor_vs_by_hand"], data["summary_us"]
    lines += ["", "| same run | median [range] |", "| --- | --- |",
              f"| the monitor's overhead over the hand-written timing's | "
              f"{fmt_spread(ratio, '{:.2f}x')} |",
              f"| `summary()` over a 100-step window, µs | {fmt_spread(s)} |"]
    return "\n".join(lines) + "\n"


QUICK = ["--steps", "2000", "--repeats", "1", "--rounds", "1"]
TABLES = {"monitor": {"argv": lambda a: ["--steps", "1000000", "--rounds", str(a.rounds + 4)], "render": render}}
