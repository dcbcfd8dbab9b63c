"""Read latency of a running job, per system call, from ``strace -f -T``.

py-spy says *where* in Python the time goes; this says how long each ``read`` and ``openat``
took at the system call boundary, grouped by what the file descriptor is (a data file, a
socket, a pipe between DataLoader processes). The seed's rule of thumb: a local disk answers
in under 1 ms, network storage in 5 ms or more; frequent reads over 10 ms call for a local
SSD copy.

strace stops the traced threads at every traced system call, so the job runs slower while
traced and latencies are upper bounds: trace for a few seconds, not the whole run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DsconvertError, MissingDependencyError
from .pyspy import _PTRACE_HINT, PtraceError

__all__ = ["trace", "parse_strace", "summarize", "SYSCALLS", "BUCKETS_US"]

SYSCALLS = ("openat", "read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg")
BUCKETS_US = [2 ** k for k in range(0, 21)]  # 1 us .. ~1 s, and above

_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>(.*)|(\w+)\((.*))$")
_RESULT = re.compile(r"=\s+(-?\d+|\?)(?:\s+\w+(?:\s+\(.*\))?)?\s+<(\d+\.\d+)>\s*$")
_UNFINISHED = "<unfinished ...>"


def parse_strace(text: str) -> List[Tuple[int, str, str, float, int]]:
    """(thread id, syscall, argument text, seconds, result) per completed call of an
    ``strace -f -T -o FILE`` log, in order, with unfinished/resumed halves joined."""
    pending: Dict[Tuple[int, str], str] = {}
    out: List[Tuple[int, str, str, float, int]] = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        tid = int(m.group(1))
        if m.group(2):  # "<... read resumed>rest"
            name, rest = m.group(2), m.group(3)
            args = pending.pop((tid, name), "") + rest
        else:
            name, args = m.group(4), m.group(5)
            if args.rstrip().endswith(_UNFINISHED):
                pending[(tid, name)] = args.rstrip()[: -len(_UNFINISHED)]
                continue
        r = _RESULT.search(args)
        if not r or name not in SYSCALLS:
            continue
        result = int(r.group(1)) if r.group(1) != "?" else -1
        out.append((tid, name, args, float(r.group(2)), result))
    return out


def _fd_kind(target: str) -> str:
    if target.startswith("socket:"):
        return "socket"
    if target.startswith(("pipe:", "anon_inode:")):
        return "pipe"
    if target.startswith(("/dev/", "/proc/", "/sys/")):
        return "device"
    return "file" if target.startswith("/") else "other"


_PATH = re.compile(r'"((?:[^"\\]|\\.)*)"')


def summarize(calls: Sequence[Tuple[int, str, str, float, int]],
              fd_targets: Optional[Dict[Tuple[int, int], str]] = None) -> Dict[str, Dict]:
    """Per group (``open``, ``file read``, ``socket read``, ``pipe read``, ...): count, bytes,
    p50/p90/p99/max ms, the share over 10 ms, and a log2 histogram in microseconds.

    ``calls`` are (process id, syscall, arguments, seconds, result) in time order;
    ``fd_targets`` what each (process, fd) pointed at when tracing began. Each successful
    ``openat`` then rebinds its descriptor, since numbers are reused as files come and go."""
    targets: Dict[Tuple[int, int], str] = dict(fd_targets or {})
    groups: Dict[str, List[float]] = defaultdict(list)
    nbytes: Dict[str, int] = defaultdict(int)
    for pid, name, args, seconds, result in calls:
        if name == "openat":
            group = "open"
            path = _PATH.search(args)
            if path and result >= 0:
                targets[(pid, result)] = path.group(1)
        else:
            try:
                fd = int(args.split(",", 1)[0])
            except ValueError:
                continue
            kind = "socket" if name.startswith("recv") else _fd_kind(targets.get((pid, fd), ""))
            group = f"{kind} read"
            if result > 0:
                nbytes[group] += result
        groups[group].append(seconds * 1e6)
    out: Dict[str, Dict] = {}
    for group, us in sorted(groups.items()):
        arr = np.asarray(us)
        counts, _ = np.histogram(arr, bins=[0] + BUCKETS_US + [np.inf])
        out[group] = {
            "count": int(len(arr)), "bytes": int(nbytes.get(group, 0)),
            "ms": {q: float(np.quantile(arr, v)) / 1000 for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
            "max_ms": float(arr.max()) / 1000, "mean_ms": float(arr.mean()) / 1000,
            "over_10ms": float((arr > 10_000).mean()),
            "histogram_us": [{"le": edge, "count": int(n)} for edge, n in zip(BUCKETS_US + [None], counts) if n],
        }
    return out


def _thread_groups(pids: Sequence[int]) -> Dict[int, int]:
    """thread id -> process id, for the threads of ``pids`` alive now."""
    out: Dict[int, int] = {}
    for pid in pids:
        try:
            out.update((int(tid), pid) for tid in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return out


def _fd_snapshot(pids: Sequence[int]) -> Dict[Tuple[int, int], str]:
    out: Dict[Tuple[int, int], str] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                out[(pid, int(fd))] = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
    return out


def trace(pids: Sequence[int], seconds: float = 5.0) -> Dict[str, Dict]:
    """Trace ``pids`` (and their threads) for ``seconds``; return :func:`summarize`'s groups."""
    exe = shutil.which("strace")
    if not exe:
        raise MissingDependencyError("--syscalls needs strace: run `apt-get install -y strace`")
    with tempfile.TemporaryDirectory(prefix="dsconvert-strace-") as tmp:
        log = os.path.join(tmp, "strace.log")
        cmd = [exe, "-f", "-T", "-qq", "-s", "0", "-e", "trace=" + ",".join(SYSCALLS), "-e", "signal=none",
               "-o", log]
        for pid in pids:
            cmd += ["-p", str(pid)]
        before = _fd_snapshot(pids)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # strace detaches from every thread and exits
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
    if not text and re.search(r"not permitted|ermission denied", err or ""):
        raise PtraceError(f"strace could not attach: {err.strip().splitlines()[-1]}. {_PTRACE_HINT}")
    if not text and proc.returncode not in (0, -signal.SIGINT, 130):
        raise DsconvertError(f"strace failed: {(err or '').strip()[-300:]}")
    group_of = _thread_groups(pids)  # strace -f prints thread ids; descriptors belong to processes
    calls = [(group_of.get(tid, tid), name, args, sec, res) for tid, name, args, sec, res in parse_strace(text)]
    return summarize(calls, before)
