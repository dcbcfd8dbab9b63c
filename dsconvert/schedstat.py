"""Time a thread or process spent runnable but waiting for a CPU, from Linux's schedstat.

Why: analyze's verdicts compare rates measured one after another. On a shared machine (a
training node rarely is idle) other processes take the CPU for part of each pass, by a share
that changes from pass to pass, so wall rates move with the load, and a verdict that compares
them flips. The time a task waited in the run queue is what that load cost it: a wall time
less that wait is what the task took for itself, on the CPU or blocked in I/O, which is what
the verdict is about. ``/proc/<pid>/task/<tid>/schedstat`` gives it (on CPU ns, run-queue wait
ns, time slices); where it is missing (not Linux, schedstats off) every wait reads as 0 and
the wall figures stand as before.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Tuple

__all__ = ["thread_wait_s", "waits_of", "children", "unloaded", "cpu_s_of", "main_thread_times", "on_cpu_shares"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> Optional[Tuple[int, int]]:
    try:
        with open(path, "rb") as f:
            on_cpu, waited = f.read().split()[:2]
        return int(on_cpu), int(waited)
    except (OSError, ValueError):
        return None


def thread_wait_s() -> float:
    """Seconds the calling thread has waited in the run queue over its life (0.0 if unknown)."""
    got = _read("/proc/thread-self/schedstat")
    return got[1] / 1e9 if got else 0.0


def children(pid: Optional[int] = None) -> List[int]:
    """The child processes of ``pid`` (this process by default), from every thread's list."""
    pid = pid or os.getpid()
    out: List[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
    return sorted(set(out))


def _uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def waits_of(pids: Iterable[int]) -> Dict[int, Tuple[float, float]]:
    """For each live process in ``pids``: (seconds alive, seconds its main thread waited in the
    run queue). The main thread's wait is what delays the samples a DataLoader worker makes;
    its helper threads' waits delay only their read-ahead."""
    out: Dict[int, Tuple[float, float]] = {}
    try:
        now = _uptime()
    except OSError:
        return out
    for pid in pids:
        got = _read(f"/proc/{pid}/task/{pid}/schedstat")
        try:
            with open(f"/proc/{pid}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19]) / _TICKS
        except (OSError, ValueError, IndexError):
            continue
        if got is not None:
            out[pid] = (max(0.0, now - started), got[1] / 1e9)
    return out


def cpu_s_of(pids: Iterable[int]) -> Dict[int, float]:
    """For each live process in ``pids``: the CPU seconds all its threads have run so far (on
    CPU, from schedstat; from ``/proc/<pid>/stat``'s ticks where schedstat is off). CPU time is
    what a sample costs whatever else runs on the machine: load makes a worker wait, not work."""
    out: Dict[int, float] = {}
    for pid in pids:
        total, known = 0.0, False
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            got = _read(f"/proc/{pid}/task/{tid}/schedstat")
            if got is not None:
                total += got[0] / 1e9
                known = True
        if not known:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total, known = (int(fields[11]) + int(fields[12])) / _TICKS, True
            except (OSError, ValueError, IndexError):
                pass
        if known:
            out[pid] = total
    return out


def unloaded(rate: float, waits: Dict[int, Tuple[float, float]]) -> float:
    """``rate`` as the processes would have made it had they not waited for a CPU: scaled by
    their time alive over their time alive less the wait (no waits known: ``rate``)."""
    alive = sum(a for a, _ in waits.values())
    waited = sum(min(w, a) for a, w in waits.values())
    if alive <= 0 or waited <= 0 or waited >= alive:
        return rate
    return rate * alive / (alive - waited)


def main_thread_times(pids: Iterable[int]) -> Dict[int, Tuple[float, float]]:
    """For each live process in ``pids``: (seconds on a CPU, seconds waiting in the run queue) of
    its main thread so far. Unknown (schedstats off, the process gone): left out."""
    out: Dict[int, Tuple[float, float]] = {}
    for pid in pids:
        got = _read(f"/proc/{pid}/task/{pid}/schedstat")
        if got is not None:
            out[pid] = (got[0] / 1e9, got[1] / 1e9)
    return out


def on_cpu_shares(before: Dict[int, Tuple[float, float]], after: Dict[int, Tuple[float, float]]
                  ) -> Dict[int, float]:
    """Between two :func:`main_thread_times`: for each process in both, the share of its main
    thread's runnable time (on a CPU, or ready and waiting for one) it spent on a CPU. A stack
    sampler's "active" samples count both; on a loaded machine the waiting part is the load's,
    not the work's, and a thread that wakes often (receiving batches) waits more of it than one
    that computes without pause."""
    out: Dict[int, float] = {}
    for pid, (on_1, wait_1) in after.items():
        if pid not in before:
            continue
        on, wait = on_1 - before[pid][0], wait_1 - before[pid][1]
        if on > 0 and wait >= 0:
            out[pid] = on / (on + wait)
    return out
