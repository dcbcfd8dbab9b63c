"""What every benchmark's JSON records beside its figures, so that a table can say exactly
what produced it: the command, the date, the machine and the versions of what was compared."""

from __future__ import annotations

import os
import platform
import random
import statistics
import sys
import time
from importlib import metadata
from typing import Any, Callable, Dict, Iterable, List, Optional

PACKAGES = ("dsconvert", "numpy", "pillow", "torch", "torchdata", "PyTurboJPEG", "simplejpeg", "webdataset",
            "litdata", "mosaicml-streaming", "h5py", "opencv-python-headless", "pyarrow", "datasets")


def versions(packages: Iterable[str] = PACKAGES) -> Dict[str, str]:
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import ctypes.util

        lib = ctypes.util.find_library("turbojpeg")
        if lib:
            out["libturbojpeg"] = lib
    except Exception:
        pass
    return out


def machine() -> Dict[str, Any]:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    return {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cpu": cpu, "memory_bytes": mem, "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version()}


def meta(script: str, argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """The record: ``command`` is what reproduces the figures (run from the repository root)."""
    args = sys.argv[1:] if argv is None else argv
    return {"command": " ".join(["python", f"scripts/{os.path.basename(script)}", *args]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
            "versions": versions()}


def spread(values: List[float]) -> Dict[str, Any]:
    """Figures over interleaved rounds: the median, the range, and the rounds themselves."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": list(values)}


def interleaved(runs: Dict[str, Callable[[], Any]], rounds: int) -> Dict[str, List[float]]:
    """Seconds each of ``runs`` takes, once per round, in an order shuffled per round (seeded by
    the round), so that a shared machine's drifts fall on every contender alike; list i is
    round i."""
    seconds: Dict[str, List[float]] = {name: [] for name in runs}
    for r in range(rounds):
        order = list(runs)
        random.Random(r).shuffle(order)
        for name in order:
            t = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - t)
    return seconds
