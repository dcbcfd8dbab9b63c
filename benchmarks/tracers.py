"""Benchmark: what each of diagnose's recorders costs the job it watches. One real training-like
job (tests/support/train_job.py on large JPEGs, DataLoader workers, a numpy "model", --print-rate)
runs throughout; its steps per second are measured untraced, under py-spy (the two recordings
`dsconvert diagnose` runs, wall and CPU), under perf trace (`--syscalls --tracer perf`, with the
block-layer recording beside it) and under strace (`--tracer strace`), in interleaved rounds so
that a drifting machine affects every phase alike. Each phase's figure is the median of the
job's per-second rates inside it (its first second left out: attaching); medians and ranges
over the rounds are reported.

    python -m benchmarks tracers --rounds 3 --seconds 6 --json bench_tracers.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Any, Dict

from benchmarks.common import RateReader, fmt_range, job_data, meta, start_job
from dsconvert.diagnose import syscalls
from dsconvert.diagnose.procs import descendants
from dsconvert.diagnose.pyspy import record

PHASES = ("untraced", "pyspy", "perf", "strace")


def run_phase(name: str, job: subprocess.Popen, seconds: float) -> dict:
    pids = [job.pid] + descendants(job.pid)
    t0 = time.monotonic()
    info: dict = {}
    if name == "untraced":
        time.sleep(seconds)
    elif name == "pyspy":
        wall, _ = record(job.pid, seconds, 100)
        info["stacks"] = len(wall)
    else:
        report = syscalls.trace(pids, seconds, name)
        info["tracer"] = report["tracer"]
        info["calls"] = sum(g["count"] for g in report["groups"].values())
        info["lost_events"] = report["lost_events"]
    info["window"] = (t0 + 1, t0 + seconds)
    return info


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-diagnose"))
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    job = start_job(job_data(os.path.join(args.work, "train")), args.workers)
    per_round = {name: [] for name in PHASES}
    infos = {name: [] for name in PHASES}
    started = time.monotonic()
    try:
        assert job.stdout.readline().strip() == "ready"
        reader = RateReader(job)
        reader.start()
        time.sleep(2)  # past start-up
        for r in range(args.rounds):
            order = PHASES if r % 2 == 0 else PHASES[::-1]  # alternate the order: no phase always follows another
            for name in order:
                info = run_phase(name, job, args.seconds)
                time.sleep(1.2)  # the last rate line of the window arrives
                rates = reader.between(*info.pop("window"))
                per_round[name].append(statistics.median(rates) if rates else 0.0)
                infos[name].append(info)
                print(f"round {r + 1} {name:9s} {per_round[name][-1]:6.1f} steps/s {info}", flush=True)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    res = {"meta": meta(), "rounds": args.rounds, "seconds_per_phase": args.seconds, "workers": args.workers,
           "wall_s": time.monotonic() - started, "phases": {}}
    for name in PHASES:
        vals = per_round[name]
        med = statistics.median(vals)
        # the slowdown is the median of the per-round slowdowns against that round's untraced rate
        slow = [1 - v / u for v, u in zip(vals, per_round["untraced"]) if u]
        res["phases"][name] = {"steps_per_s_per_round": vals, "median": med, "min": min(vals), "max": max(vals),
                               "slowdown_vs_untraced": statistics.median(slow) if slow else None,
                               "slowdown_range": [min(slow), max(slow)] if slow else None, "runs": infos[name]}
    print(f"\n{'phase':10s}{'median':>9s}{'range':>16s}{'slowdown':>10s}   (steps/s, {args.rounds} rounds)")
    for name, r in res["phases"].items():
        print(f"{name:10s}{r['median']:9.1f}{r['min']:8.1f}-{r['max']:<7.1f}{r['slowdown_vs_untraced']:10.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    labels = {"untraced": "untraced", "pyspy": "py-spy (diagnose's two recordings, 100 Hz, `--nonblocking`)",
              "perf": "perf trace (`--tracer perf`, with the block-layer recording)",
              "strace": "strace (`--tracer strace`)"}
    lines = [f"One decode-bound job (`tests/support/train_job.py`, large JPEGs, {data['workers']} workers) prints "
             f"its steps per second; {data['rounds']} interleaved rounds of {data['seconds_per_phase']:g} s per phase "
             "against the same running job; steps/s, median [range]; the slowdown is the median of the per-round "
             "slowdowns against that round's untraced rate.", "",
             "| phase | steps/s | slowdown | tracer used |", "| --- | --- | --- | --- |"]
    for name, p in data["phases"].items():
        rng = p.get("slowdown_range")
        slow = ("-" if name == "untraced" else
                fmt_range(p["slowdown_vs_untraced"] * 100, rng[0] * 100, rng[1] * 100, "{:.0f} %") if rng else
                f"{p['slowdown_vs_untraced']:.0%}")
        used = ", ".join(sorted({run.get("tracer") for run in p.get("runs", []) if run.get("tracer")})) or "-"
        lines.append(f"| {labels.get(name, name)} | {fmt_range(p['median'], p['min'], p['max'], '{:.1f}')} | {slow} | "
                     f"{used} |")
    return "\n".join(lines) + "\n"


QUICK = ["--seconds", "2", "--rounds", "1", "--workers", "1"]
TABLES = {"tracers": {"argv": lambda a: ["--seconds", "8", "--rounds", str(a.rounds + 1)], "render": render}}
