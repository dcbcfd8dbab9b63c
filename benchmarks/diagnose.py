"""Benchmark: what `dsconvert diagnose` costs the job it samples. A decode-bound training
job (tests/support/train_job.py: large JPEGs, DataLoader workers, a numpy "model") reports its
steps per second; the rate is compared untraced, while `diagnose` samples it with py-spy, and
while `diagnose --syscalls` traces its reads (perf trace, or strace where perf is missing or
refused; ``--tracer`` as diagnose's), in interleaved rounds (every phase once per round, in a
rotating order, against the same running job). Each phase's figure is the median of the job's
per-second rates inside it; medians and ranges over rounds are reported, and each slowdown is
the median of the per-round slowdowns against that round's untraced rate.

    python -m benchmarks diagnose --seconds 6 --rounds 3 --json docs/bench/diagnose.json

A phase whose tool is missing (py-spy, or both perf and strace) or whose run fails is recorded
as not measured, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from benchmarks.common import (
    RateReader,
    fmt_range,
    fmt_spread,
    job_data,
    meta,
    spread,
    start_job,
)

PHASES = ("baseline", "pyspy", "syscalls")


def tools(tracer: str) -> Dict[str, Any]:
    """Where each tool is (None: missing) and, per phase, why it cannot be measured (None: it can)."""
    from dsconvert.diagnose.pyspy import pyspy_path

    found: Dict[str, Any] = {"perf": shutil.which("perf"), "strace": shutil.which("strace")}
    try:
        found["py-spy"] = pyspy_path()
        no_pyspy = None
    except Exception as exc:  # MissingDependencyError
        found["py-spy"] = None
        no_pyspy = f"py-spy is not installed ({exc})"
    tracers = {"auto": ("perf", "strace"), "perf": ("perf",), "strace": ("strace",)}[tracer]
    no_tracer = None if any(found[t] for t in tracers) else f"{' and '.join(tracers)} not installed"
    why_not = {"baseline": None, "pyspy": no_pyspy, "syscalls": no_pyspy or no_tracer}
    return {"paths": found, "why_not": why_not}


def run_diagnose(pid: int, extra: List[str]) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "dsconvert", "diagnose", "--pid", str(pid), "--json", "-q", *extra]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        return {"error": f"`dsconvert diagnose {' '.join(extra)}` exited with {run.returncode}: "
                         f"{lines[-1] if lines else '(no message)'}"}
    report = json.loads(run.stdout)
    return {"verdict": report["diagnosis"]["verdict"], "bottleneck": report["diagnosis"].get("bottleneck"),
            "tracer": (report.get("syscalls") or {}).get("tracer")}



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=6, help="seconds per phase")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tracer", choices=("auto", "perf", "strace"), default="auto",
                   help="diagnose's --tracer in the --syscalls phase (default: %(default)s, as diagnose's)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-diagnose"))
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    found = tools(args.tracer)
    why_not: Dict[str, Optional[str]] = dict(found["why_not"])
    for name, reason in why_not.items():
        if reason:
            print(f"{name}: not measured: {reason}", file=sys.stderr)
    job = start_job(job_data(os.path.join(args.work, "train")), args.workers)
    rates: Dict[str, List[float]] = {name: [] for name in PHASES}
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in PHASES}
    round_of: Dict[str, List[int]] = {name: [] for name in PHASES}
    started = time.monotonic()
    try:
        assert job.stdout.readline().strip() == "ready"
        reader = RateReader(job)
        reader.start()
        time.sleep(2)  # past start-up
        for r in range(args.rounds):
            order = PHASES[r % len(PHASES):] + PHASES[: r % len(PHASES)]  # rotate: no phase always follows another
            for name in order:
                if why_not[name]:
                    continue
                t0 = time.monotonic()
                info: Dict[str, Any] = {}
                if name == "baseline":
                    time.sleep(args.seconds)
                elif name == "pyspy":
                    info = run_diagnose(job.pid, ["--duration", str(args.seconds)])
                else:  # sample briefly, then trace for the phase
                    info = run_diagnose(job.pid, ["--duration", "1", "--syscalls", str(args.seconds),
                                                  "--tracer", args.tracer])
                    t0 = time.monotonic() - args.seconds  # only the traced seconds
                if "error" in info:
                    why_not[name] = f"round {r + 1}: {info['error']}"
                    print(f"{name}: not measured: {why_not[name]}", file=sys.stderr, flush=True)
                    continue
                got = reader.between(t0 + 1, time.monotonic())
                rates[name].append(statistics.median(got) if got else 0.0)
                runs[name].append(info)
                round_of[name].append(r)
                print(f"round {r + 1} {name:9s} {rates[name][-1]:6.1f} steps/s {info or ''}", flush=True)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    base = dict(zip(round_of["baseline"], rates["baseline"]))
    res: Dict[str, Any] = {"meta": meta(), "rounds": args.rounds, "seconds": args.seconds,
                           "workers": args.workers, "tracer": args.tracer, "tools": found["paths"],
                           "wall_s": time.monotonic() - started, "phases": {}}
    for name in PHASES:
        if why_not[name] or not rates[name]:
            res["phases"][name] = {"measured": False, "reason": why_not[name] or "no rounds"}
            continue
        row: Dict[str, Any] = dict(spread(rates[name]), measured=True)
        if name != "baseline":
            slow = [1 - v / base[r] for v, r in zip(rates[name], round_of[name]) if base.get(r)]
            row["slowdown"] = spread(slow) if slow else None
            row["verdicts"] = [i["verdict"] for i in runs[name]]
            row["bottlenecks"] = [i["bottleneck"] for i in runs[name]]
        if name == "syscalls":
            row["tracers"] = [i["tracer"] for i in runs[name]]
        res["phases"][name] = row
    print(f"\n{'phase':10s}{'steps/s':>9s}{'range':>14s}{'slowdown':>10s}   "
          f"({args.rounds} rounds of {args.seconds:g} s)")
    for name, r in res["phases"].items():
        if not r["measured"]:
            print(f"{name:10s} not measured: {r['reason']}")
            continue
        slow = r.get("slowdown")
        print(f"{name:10s}{r['median']:9.1f}{r['min']:7.1f}-{r['max']:<6.1f}"
              f"{format(slow['median'], '10.1%') if slow else '':>10s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    from collections import Counter

    phases = data["phases"]
    tracers = ", ".join(sorted({t for t in phases.get("syscalls", {}).get("tracers", []) if t}))
    labels = {"baseline": "untraced (baseline)",
              "pyspy": "`diagnose` (py-spy: two recordings at 100 Hz, `--subprocesses`)",
              "syscalls": f"`diagnose --syscalls` (1 s of py-spy, then read/openat of every process traced; "
                          f"tracer: {tracers or data.get('tracer', 'auto')})"}
    lines = [f"A decode-bound job (`tests/support/train_job.py`: 1280x960 q95 JPEGs, {data['workers']} DataLoader "
             "workers, batches of 4, a numpy \"model\" of 5 ms per step) prints its steps per second; "
             f"{data['rounds']} interleaved rounds (every phase once per round, in a rotating order) of "
             f"{data['seconds']:g} s each, against the same running job; steps/s, median [range]; the slowdown "
             "is the median of the per-round slowdowns against that round's untraced rate.", "",
             "| phase | steps/s | slowdown | diagnosed as |", "| --- | --- | --- | --- |"]
    for name, p in phases.items():
        label = labels.get(name, name)
        if not p.get("measured"):
            lines.append(f"| {label} | not measured: {p.get('reason') or 'unknown'} | | |")
            continue
        slow = p.get("slowdown")
        slow_cell = "-" if name == "baseline" else (
            fmt_range(slow["median"] * 100, slow["min"] * 100, slow["max"] * 100, "{:.0f} %") if slow else "n/a")
        seen = Counter(f"{v} ({b})" if b else v for v, b in zip(p.get("verdicts", []), p.get("bottlenecks", [])))
        verdict = ", ".join(f"{v}: {n} of {len(p['rounds'])}" for v, n in seen.most_common())
        lines.append(f"| {label} | {fmt_spread(p, '{:.1f}')} | {slow_cell} | {verdict} |")
    return "\n".join(lines) + "\n"


QUICK = ["--seconds", "2", "--rounds", "1", "--workers", "1"]
TABLES = {"diagnose": {"argv": lambda a: ["--seconds", "6", "--rounds", str(a.rounds + 2)], "render": render}}
