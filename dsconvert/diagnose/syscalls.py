"""Read latency of a running job, per system call: ``perf trace`` first, ``strace`` as the fallback.

py-spy says *where* in Python the time goes; this says how long each ``read`` and ``openat``
took at the system call boundary, grouped by what the file descriptor is (a data file, a
socket, a pipe between DataLoader processes), for the whole job and per process. The seed's
rule of thumb: a local disk answers in under 1 ms, network storage in 5 ms or more; frequent
reads over 10 ms call for a local SSD copy.

Two tracers give the same groups and quantiles:

* ``perf trace -p PIDS -e openat,read,...`` (the first choice) reads the kernel's syscall
  tracepoints through a ring buffer: the traced threads are not stopped at each call, so the
  job slows down far less than under strace. It needs ``perf`` and permission to use
  tracepoints (root, or ``kernel.perf_event_paranoid`` <= -1 / CAP_PERFMON with tracefs
  readable). Without BPF augmentation it prints ``openat``'s file name as an address, so a
  descriptor ``openat`` returns counts as a file (paths are known only for the descriptors
  open when tracing began, from /proc).
* ``strace -f -T`` stops the traced threads at every traced system call, so the job runs
  slower while traced and latencies are upper bounds: trace for a few seconds.

Where perf may, the block layer is recorded too (``perf record -a -e block:block_rq_issue,
block:block_rq_complete``, system-wide: the disk is shared): slow file reads with few or no
block-layer read requests did not wait for a local disk (network storage, FUSE); slow reads
with slow block requests did.
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DsconvertError, MissingDependencyError, OptionError
from .pyspy import PTRACE_HINT, PtraceError

__all__ = ["trace", "parse_strace", "parse_perf", "parse_block", "summarize", "summarize_processes",
           "block_summary", "SYSCALLS", "BUCKETS_US", "TRACERS", "PerfUnavailable"]

SYSCALLS = ("openat", "read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg")
BUCKETS_US = [2 ** k for k in range(0, 21)]  # 1 us .. ~1 s, and above
TRACERS = ("auto", "perf", "strace")

_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>(.*)|(\w+)\((.*))$")
_RESULT = re.compile(r"=\s+(-?\d+|\?)(?:\s+\w+(?:\s+\(.*\))?)?\s+<(\d+\.\d+)>\s*$")
_UNFINISHED = "<unfinished ...>"

Call = Tuple[int, str, str, Optional[float], int]  # (thread or process id, syscall, arguments, seconds, result)


class PerfUnavailable(DsconvertError):
    """perf is not installed, or may not trace here; the message says which and why."""


def parse_strace(text: str) -> List[Call]:
    """(thread id, syscall, argument text, seconds, result) per completed call of an
    ``strace -f -T -o FILE`` log, in order, with unfinished/resumed halves joined."""
    pending: Dict[Tuple[int, str], str] = {}
    out: List[Call] = []
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


# "    11.780 (15.414 ms): python/5516  ... [continued]: read())      = 20000"
# "    11.780 (         ): python/5516 read(fd: 4, buf: 0x7f4c4c001c30, count: 20001)     ..."
# "         ? (         ): python/5515  ... [continued]: openat())      = 3"
_PERF_LINE = re.compile(
    r"^\s*(?:[\d.]+|\?)\s+\(\s*(?:(?P<ms>[\d.]+) ms)?\s*\):\s+(?P<comm>.*?)/(?P<tid>\d+)\s+"
    r"(?:\.\.\. \[continued\]: (?P<cname>\w+)\(\)\)(?P<crest>.*)|(?P<name>\w+)\((?P<args>.*))$")
_PERF_RESULT = re.compile(r"=\s+(-?\d+|0x[0-9a-fA-F]+)(?:\s+[A-Z]\w*(?:\s+\(.*\))?)?\s*$")
_PERF_LOST = re.compile(r"LOST (\d+) events")


def parse_perf(text: str) -> Tuple[List[Call], int]:
    """The completed calls of a ``perf trace -o FILE`` log as (thread id, syscall, argument
    text, seconds, result), with interrupted/continued halves joined; and the number of events
    perf reports lost. A call that began before tracing did (``? (   ):``) has no duration:
    its seconds are None (an ``openat``'s result still names a file descriptor)."""
    pending: Dict[Tuple[int, str], str] = {}
    out: List[Call] = []
    lost = 0
    for line in text.splitlines():
        m = _PERF_LINE.match(line)
        if not m:
            lm = _PERF_LOST.search(line)
            if lm:
                lost += int(lm.group(1))
            continue
        tid = int(m.group("tid"))
        if m.group("cname"):
            name, rest = m.group("cname"), m.group("crest")
            args = pending.pop((tid, name), "") + rest
        else:
            name, args = m.group("name"), m.group("args")
            if args.rstrip().endswith("..."):  # interrupted by another thread's event; continued later
                pending[(tid, name)] = args.rstrip()[:-3]
                continue
        if name not in SYSCALLS:
            continue
        r = _PERF_RESULT.search(args)
        if not r:
            continue
        result = int(r.group(1), 0)
        seconds = float(m.group("ms")) / 1000 if m.group("ms") else None
        out.append((tid, name, args, seconds, result))
    return out, lost


def _fd_kind(target: str) -> str:
    if target.startswith("socket:"):
        return "socket"
    if target.startswith(("pipe:", "anon_inode:")):
        return "pipe"
    if target.startswith(("/dev/", "/proc/", "/sys/")):
        return "device"
    return "file" if target.startswith("/") or target == OPENED else "other"


_PATH = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD = re.compile(r"^\s*(?:fd:\s*)?(\d+)(?:<([^>]*)>)?")
OPENED = "<opened by openat while traced>"  # perf trace without BPF shows no file names


def _classify(calls: Sequence[Call], fd_targets: Optional[Dict[Tuple[int, int], str]]
              ) -> List[Tuple[int, str, Optional[float], int]]:
    """(process id, group, seconds, bytes) per call, following descriptors over time."""
    targets: Dict[Tuple[int, int], str] = dict(fd_targets or {})
    out: List[Tuple[int, str, Optional[float], int]] = []
    for pid, name, args, seconds, result in calls:
        if name == "openat":
            group = "open"
            if result >= 0:
                path = _PATH.search(args)
                targets[(pid, result)] = path.group(1) if path else OPENED
            nbytes = 0
        else:
            fd_match = _FD.match(args)
            if not fd_match:
                continue
            fd = int(fd_match.group(1))
            if fd_match.group(2):  # perf names the file when it knows it: "fd: 3</data/x.jpg>"
                targets[(pid, fd)] = fd_match.group(2)
            kind = "socket" if name.startswith("recv") else _fd_kind(targets.get((pid, fd), ""))
            group = f"{kind} read"
            nbytes = max(result, 0)
        out.append((pid, group, seconds, nbytes))
    return out


def _stats(us: Sequence[float], count: int, nbytes: int, histogram: bool = True) -> Dict[str, Any]:
    """``count`` calls, of which ``us`` are the durations known (microseconds)."""
    arr = np.asarray(us, dtype=float)
    out: Dict[str, Any] = {"count": int(count), "bytes": int(nbytes)}
    if not len(arr):  # every call of the group began before tracing: no duration known
        out.update(ms={"p50": 0.0, "p90": 0.0, "p99": 0.0}, max_ms=0.0, mean_ms=0.0, over_10ms=0.0)
    else:
        out.update(ms={q: float(np.quantile(arr, v)) / 1000 for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
                   max_ms=float(arr.max()) / 1000, mean_ms=float(arr.mean()) / 1000,
                   over_10ms=float((arr > 10_000).mean()))
    if histogram:
        counts, _ = np.histogram(arr, bins=[0] + BUCKETS_US + [np.inf])
        out["histogram_us"] = [{"le": edge, "count": int(n)} for edge, n in zip(BUCKETS_US + [None], counts) if n]
    return out


def _groups(rows: Sequence[Tuple[int, str, Optional[float], int]], histogram: bool) -> Dict[str, Dict]:
    us: Dict[str, List[float]] = defaultdict(list)
    nbytes: Dict[str, int] = defaultdict(int)
    counts: Dict[str, int] = defaultdict(int)
    for _, group, seconds, n in rows:
        us.setdefault(group, [])
        if seconds is not None:
            us[group].append(seconds * 1e6)
        nbytes[group] += n
        counts[group] += 1
    return {group: _stats(values, counts[group], nbytes[group], histogram) for group, values in sorted(us.items())}


def summarize(calls: Sequence[Call], fd_targets: Optional[Dict[Tuple[int, int], str]] = None) -> Dict[str, Dict]:
    """Per group (``open``, ``file read``, ``socket read``, ``pipe read``, ...): count, bytes,
    p50/p90/p99/max ms, the share over 10 ms, and a log2 histogram in microseconds.

    ``calls`` are (process id, syscall, arguments, seconds, result) in time order, arguments
    as strace (``7, ""..., 4096``) or perf trace (``fd: 7</data/a.jpg>, buf: ...``) print them;
    ``fd_targets`` what each (process, fd) pointed at when tracing began. Each successful
    ``openat`` then rebinds its descriptor, since numbers are reused as files come and go.
    Calls without a duration (seconds None) are counted but not in the quantiles."""
    return _groups(_classify(calls, fd_targets), histogram=True)


def summarize_processes(calls: Sequence[Call], fd_targets: Optional[Dict[Tuple[int, int], str]] = None
                        ) -> Dict[int, Dict[str, Dict]]:
    """:func:`summarize`'s groups for each process apart (no histograms)."""
    rows = _classify(calls, fd_targets)
    by_pid: Dict[int, list] = defaultdict(list)
    for row in rows:
        by_pid[row[0]].append(row)
    return {pid: _groups(rows, histogram=False) for pid, rows in sorted(by_pid.items())}


# perf script -F tid,time,event,trace of block:block_rq_issue / block:block_rq_complete:
#  5202 13666.326879:    block:block_rq_issue: 254,0 RM 4096 () 174850056 + 8 0x2,0,4 [python]
#  5202 13666.332027: block:block_rq_complete: 254,0 RM () 68687480 + 8 0x2,0,4 [0]
_BLOCK = re.compile(r"^\s*\d+\s+([\d.]+):\s+block:block_rq_(issue|complete):\s+(\d+),(\d+)\s+(\S+)\s+"
                    r"(?:(\d+)\s+)?\(.*?\)\s+(\d+)\s+\+\s+(\d+)")


def parse_block(text: str) -> List[Tuple[float, str, str, str, int, int]]:
    """(seconds, issue|complete, device "major:minor", rwbs, sector, sectors) per block request
    event of ``perf script -F tid,time,event,trace``."""
    out = []
    for line in text.splitlines():
        m = _BLOCK.match(line)
        if m:
            out.append((float(m.group(1)), m.group(2), f"{m.group(3)}:{m.group(4)}", m.group(5), int(m.group(7)),
                        int(m.group(8))))
    return out


def block_summary(events: Sequence[Tuple[float, str, str, str, int, int]]) -> Dict[str, Any]:
    """Block-layer read requests: how many were issued, bytes (512-byte sectors), and the
    latency from issue to completion of those seen both issued and completed, per device too."""
    issued: Dict[Tuple[str, int], float] = {}
    latencies: List[float] = []
    reads = 0
    nbytes = 0
    per_dev: Dict[str, Dict[str, int]] = defaultdict(lambda: {"read_requests": 0, "read_bytes": 0})
    for t, kind, dev, rwbs, sector, sectors in events:
        if "R" not in rwbs:
            continue
        if kind == "issue":
            reads += 1
            nbytes += sectors * 512
            per_dev[dev]["read_requests"] += 1
            per_dev[dev]["read_bytes"] += sectors * 512
            issued[(dev, sector)] = t
        else:
            start = issued.pop((dev, sector), None)
            if start is not None:
                latencies.append((t - start) * 1000)
    arr = np.asarray(latencies)
    return {
        "read_requests": reads, "read_bytes": nbytes, "completed": int(len(arr)),
        "ms": {q: float(np.quantile(arr, v)) for q, v in (("p50", 0.5), ("p99", 0.99))} if len(arr) else None,
        "max_ms": float(arr.max()) if len(arr) else None,
        "devices": {dev: dict(v) for dev, v in sorted(per_dev.items())},
    }


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


def _run_for(cmd: List[str], seconds: float, stop: int, log: Optional[str] = None) -> Tuple[Optional[int], str, str]:
    """Run a tracer for ``seconds`` (or until it exits), stop it with ``stop``; (return code,
    stderr, the log's text). The return code is None when the tracer was still running at the
    deadline (it stopped only because it was told to)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    early = proc.poll()
    if early is None:
        proc.send_signal(stop)  # strace detaches from every thread, perf flushes its log
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    text = ""
    if log and os.path.exists(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
    return early, err or "", text


_REFUSED = re.compile(r"ermission|not permitted|perf_event_paranoid|No permissions|EACCES|EPERM")


def _perf_refusal(err: str) -> str:
    lines = [ln.strip() for ln in err.strip().splitlines() if ln.strip()]
    hit = next((ln for ln in lines if _REFUSED.search(ln)), lines[0] if lines else "no output")
    return hit[:200]


def _strace_calls(pids: Sequence[int], seconds: float, tmp: str) -> List[Call]:
    exe = shutil.which("strace")
    if not exe:
        raise MissingDependencyError("--syscalls needs perf or strace: run `apt-get install -y strace` "
                                     "(or linux-perf / linux-tools for perf trace)")
    log = os.path.join(tmp, "strace.log")
    cmd = [exe, "-f", "-T", "-qq", "-s", "0", "-e", "trace=" + ",".join(SYSCALLS), "-e", "signal=none", "-o", log]
    for pid in pids:
        cmd += ["-p", str(pid)]
    early, err, text = _run_for(cmd, seconds, signal.SIGINT, log)
    if not text and re.search(r"not permitted|ermission denied", err):
        raise PtraceError(f"strace could not attach: {err.strip().splitlines()[-1]}. {PTRACE_HINT}")
    if not text and early not in (None, 0):
        raise DsconvertError(f"strace failed: {err.strip()[-300:]}")
    return parse_strace(text)


def _perf_calls(pids: Sequence[int], seconds: float, tmp: str) -> Tuple[List[Call], int]:
    exe = shutil.which("perf")
    if not exe:
        raise PerfUnavailable("perf is not installed (apt-get install linux-perf, or linux-tools-$(uname -r))")
    log = os.path.join(tmp, "perf-trace.log")
    cmd = [exe, "trace", "-p", ",".join(str(p) for p in pids), "-e", ",".join(SYSCALLS), "-m", "1024", "-o", log]
    early, err, text = _run_for(cmd, seconds, signal.SIGINT, log)
    if early not in (None, 0) or (not text.strip() and _REFUSED.search(err)):
        raise PerfUnavailable(f"perf trace refused: {_perf_refusal(err)}")
    return parse_perf(text)


def _start_block(tmp: str, seconds: float) -> Tuple[Optional[subprocess.Popen], str, Optional[str]]:
    """Start recording block-layer requests system-wide for ``seconds``; (process, data file,
    why not) with process None when perf is missing."""
    exe = shutil.which("perf")
    data = os.path.join(tmp, "block.data")
    if not exe:
        return None, data, "perf is not installed"
    cmd = [exe, "record", "-q", "-a", "-e", "block:block_rq_issue,block:block_rq_complete", "-o", data,
           "--", "sleep", f"{seconds:g}"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), data, None


def _finish_block(proc: Optional[subprocess.Popen], data: str, why_not: Optional[str]) -> Dict[str, Any]:
    if proc is None:
        return {"permitted": False, "reason": why_not}
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    if proc.returncode != 0 or not os.path.exists(data):
        return {"permitted": False, "reason": f"perf record -e block:... refused: {_perf_refusal(err or '')}"}
    script = subprocess.run([shutil.which("perf") or "perf", "script", "-i", data, "-F", "tid,time,event,trace"],
                            capture_output=True, text=True, timeout=120)
    if script.returncode != 0:
        return {"permitted": False, "reason": f"perf script failed: {_perf_refusal(script.stderr)}"}
    out: Dict[str, Any] = {"permitted": True, "scope": "system-wide"}
    out.update(block_summary(parse_block(script.stdout)))
    return out


def trace(pids: Sequence[int], seconds: float = 5.0, tracer: str = "auto", block: bool = True) -> Dict[str, Any]:
    """Trace the reads and opens of ``pids`` (and their threads) for ``seconds``.

    ``tracer``: ``perf`` (perf trace), ``strace``, or ``auto`` (perf, and strace when perf is
    missing or refused). Returns ``{tracer, seconds, groups, processes, lost_events, block,
    notes}``: :func:`summarize`'s groups for the whole job and for each process, events perf
    lost (its ring buffer overflowed; None under strace), and with ``block`` the block-layer
    read requests over the same seconds (:func:`block_summary`, or ``{permitted: false,
    reason}``)."""
    if tracer not in TRACERS:
        raise OptionError(f"--tracer is one of {', '.join(TRACERS)}; got {tracer!r}")
    notes: List[str] = []
    with tempfile.TemporaryDirectory(prefix="dsconvert-trace-") as tmp:
        before = _fd_snapshot(pids)
        blk = _start_block(tmp, seconds) if block else (None, "", "not asked for")
        used, lost = tracer, None
        try:
            calls: List[Call] = []
            if tracer in ("auto", "perf"):
                try:
                    calls, lost = _perf_calls(pids, seconds, tmp)
                    used = "perf"
                except PerfUnavailable as exc:
                    if tracer == "perf":
                        raise
                    notes.append(f"{exc}; traced with strace instead (slower for the job: latencies are upper bounds)")
                    used = "strace"
            if used == "strace":
                calls = _strace_calls(pids, seconds, tmp)
        finally:
            block_report = _finish_block(*blk) if block else {"permitted": False, "reason": "not asked for"}
        after = _fd_snapshot(pids)
    group_of = _thread_groups(pids)  # tracers print thread ids; descriptors belong to processes
    calls = [(group_of.get(tid, tid), name, args, sec, res) for tid, name, args, sec, res in calls]
    # descriptors opened and left open while traced, by calls that began before: /proc names them now
    targets = dict(after)
    targets.update(before)
    if lost:
        notes.append(f"perf lost {lost:,} events (its ring buffer overflowed): the counts are lower bounds")
    return {"tracer": used, "seconds": seconds, "groups": summarize(calls, targets),
            "processes": {str(pid): groups for pid, groups in summarize_processes(calls, targets).items()},
            "lost_events": lost, "block": block_report, "notes": notes}
