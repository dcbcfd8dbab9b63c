"""What the suites share: where the docs are, what every JSON records beside its figures (so
that a table can say exactly what produced it: the command, the date, the machine and the
versions of what was compared), interleaved timing rounds and their medians, the pieces of the
Markdown tables, a suite running itself in a fresh process, and the training-like job that
diagnose and tracers watch. The standard library only: every suite imports this first, in any
interpreter (peers' virtual environments included)."""

from __future__ import annotations

import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from importlib import metadata
from typing import Any, Callable, Dict, Iterable, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "docs", "bench")  # each table's JSON: docs/bench/NAME.json
DOCS = os.path.join(ROOT, "docs")  # the tables: in its Markdown, between <!-- bench_all:NAME begin/end -->
MARKER = "<!-- bench_all:"


def marked_pages(root: str = DOCS) -> List[str]:
    """The Markdown files under ``root`` that hold a table's markers (docs/benchmarks.md, or the
    pages of docs/benchmarks/ by topic), in a stable order."""
    pages = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if name.endswith(".md"):
                with open(path, encoding="utf-8") as f:
                    if MARKER in f.read():
                        pages.append(path)
    return pages

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


def meta(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """The record: ``command`` is what reproduces the figures (run from the repository root);
    ``argv``: the suite's name and options (default: this process's, ``python -m benchmarks``'s)."""
    args = sys.argv[1:] if argv is None else argv
    return {"command": " ".join(["python", "-m", "benchmarks", *args]),
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


# --- a suite in a fresh process -----------------------------------------------------------


def self_command(suite: str, *args: str, python: Optional[str] = None) -> List[str]:
    """The command that runs ``python -m benchmarks SUITE ARGS`` (with ``python``: another
    interpreter, a peer's virtual environment); run it with ``cwd=ROOT``."""
    return [python or sys.executable, "-m", "benchmarks", suite, *args]


def run_self(suite: str, args: List[str], python: Optional[str] = None, **kw: Any) -> subprocess.CompletedProcess:
    """``self_command`` run from the repository root (where ``benchmarks`` and ``dsconvert``
    import), its output captured as text unless ``kw`` says otherwise."""
    kw.setdefault("cwd", ROOT)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(self_command(suite, *args, python=python), **kw)


# --- the Markdown tables ------------------------------------------------------------------


def header(meta: Dict[str, Any], source: str) -> str:
    """What every table starts with: the command that made it, the date, machine and versions;
    ``source``: the JSON it was rendered from (docs/bench/NAME.json)."""
    m = meta.get("machine", {})
    v = meta.get("versions", {})
    versions = ", ".join(f"{k} {val}" for k, val in v.items() if k != "libturbojpeg")
    return (f"```\n{meta.get('command', '?')}\n```\n\n*{meta.get('date', '?')}; {m.get('cpus', '?')} CPUs "
            f"({m.get('cpu') or 'unknown CPU'}), {m.get('system', '')}, Python {m.get('python', '?')}; "
            f"{versions}. Generated by python -m benchmarks from {source}.*\n")


def fmt_range(median: float, lo: float, hi: float, fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(median)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def fmt_spread(r: Dict[str, Any], fmt: str = "{:,.0f}") -> str:
    """A record of :func:`spread`: its median [range]."""
    return fmt_range(r["median"], r["min"], r["max"], fmt)


def ratio_table(title: str, rows: Any) -> List[str]:
    """A table of ratios, (name, spread record) per row, after a blank line."""
    return ["", f"| {title} | median [range] |", "| --- | --- |"] + [
        f"| {name} | {fmt_spread(r, '{:.2f}x')} |" for name, r in rows]


# --- the training-like job that diagnose and tracers watch ---------------------------------


def job_data(root: str, per_class: int = 8) -> str:
    """Large JPEGs (1280x960, quality 95) in 4 classes: a decode-bound job's data, made once."""
    if not os.path.isdir(root):
        from dsconvert.demo import load_photos

        for name, photo in load_photos(("astronaut", "chelsea", "coffee", "rocket")).items():
            os.makedirs(os.path.join(root, name))
            for i in range(per_class):
                photo.convert("RGB").resize((1280, 960)).rotate(i).save(
                    os.path.join(root, name, f"{i}.jpg"), "JPEG", quality=95)
    return root


def start_job(data: str, workers: int) -> subprocess.Popen:
    """tests/support/train_job.py on ``data`` printing its steps per second, in its own session
    (end it with ``os.killpg(job.pid, signal.SIGKILL)``)."""
    from tests.support import TRAIN_JOB

    return subprocess.Popen([sys.executable, TRAIN_JOB, "--data", data, "--workers", str(workers), "--batch", "4",
                             "--compute-ms", "5", "--print-rate"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


class RateReader(threading.Thread):
    """Collects the job's "rate N" lines with the time they arrived."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(daemon=True)
        self.proc, self.rates = proc, []  # type: ignore[var-annotated]

    def run(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith("rate "):
                self.rates.append((time.monotonic(), int(line.split()[1])))

    def between(self, a: float, b: float) -> List[int]:
        return [r for t, r in self.rates if a < t <= b]
