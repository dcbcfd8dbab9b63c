"""``dsconvert diagnose``: why a *running* training job waits for data.

The diagnosis flow of the mission: GPU utilisation drops -> Python stacks -> system calls.

1. :func:`dsconvert.diagnose.pyspy.record` samples the job and its DataLoader workers with
   py-spy for a few seconds (wall time with ``--idle`` and CPU time without it, side by side);
2. :mod:`dsconvert.diagnose.classify` sorts every sample into what the training loop and the
   workers were doing and decides whether the job is input-bound, why, and which dsconvert
   command removes the cause;
3. optionally (``syscalls=SECONDS``) :mod:`dsconvert.diagnose.syscalls` traces the read
   latency of every process with strace;
4. the data files the processes hold open (from /proc) name the dataset folder, so the
   suggested commands are ready to run, and the storage it lives on.

The report is a plain dict, schema ``dsconvert.diagnose`` version 1, rendered by
:mod:`dsconvert.diagnose.report`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import DsconvertError, OptionError
from .classify import diagnose_stacks, worker_pids
from .procs import FileWatcher, cmdline, descendants, guess_dataset_root, is_alive
from .pyspy import record

__all__ = ["diagnose", "launch", "stop", "shard_formats", "REPORT_SCHEMA", "REPORT_VERSION"]

REPORT_SCHEMA = "dsconvert.diagnose"
REPORT_VERSION = 1
DATA_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".npy", ".npz",
                   ".tar", ".h5", ".hdf5", ".pkl", ".pickle", ".pt", ".bin", ".json", ".txt", ".cls", ".mdb",
                   ".parquet", ".arrow", ".tfrecord", ".record", ".lmdb")


def launch(command: Sequence[str], wait: float, log: Callable[[str], None] = lambda m: None) -> subprocess.Popen:
    """Start ``command`` in a session of its own (so it can be stopped with its workers) and
    give it ``wait`` seconds to reach its training loop. Its stdout goes to our stderr, so
    our stdout holds only the report."""
    if not command:
        raise OptionError("give the command to run after --, e.g. dsconvert diagnose -- python train.py")
    try:
        proc = subprocess.Popen(list(command), stdout=sys.stderr, start_new_session=True)
    except OSError as exc:
        raise DsconvertError(f"cannot run {command[0]}: {exc.strerror or exc}", command[0]) from None
    log(f"started pid {proc.pid}: {' '.join(command)}; sampling in {wait:.0f} s")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DsconvertError(f"{command[0]} exited with status {proc.returncode} after "
                                 f"{wait - (deadline - time.monotonic()):.1f} s, before sampling started; "
                                 "diagnose a job that runs longer, or lower --wait")
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen, grace: float = 10.0) -> Optional[int]:
    """End a launched job and its workers: SIGTERM to its session, SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return proc.returncode
    for sig, timeout in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)  # the session we created for it: the job and its workers
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def _data_files(seen: Dict[str, int]) -> List[str]:
    files = [p for p in seen if p.lower().endswith(DATA_EXTENSIONS) and os.path.isfile(p)]
    return sorted(files, key=lambda p: -seen[p])


def diagnose(pid: int, duration: float = 10.0, rate: int = 100, syscalls: Optional[float] = None,
             log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Sample process ``pid`` (a training job) and its subprocesses; return the report."""
    from ..codecs import jpeg_decoders
    from ..processes import available_cpus
    from ..io.localfs import storage_kind

    say = log or (lambda msg: None)
    if duration <= 0 or rate < 1:
        raise OptionError("duration must be > 0 and rate >= 1")
    if not is_alive(pid):
        raise DsconvertError(f"no running process with pid {pid}", str(pid))
    started = time.perf_counter()
    say(f"sampling pid {pid} and its subprocesses with py-spy for {duration:g} s at {rate} Hz")
    with FileWatcher(pid) as watcher:
        wall, cpu = record(pid, duration, rate)
    files = _data_files(watcher.seen)
    root = guess_dataset_root(files)
    processes = {p: cmdline(p) for p in [pid] + descendants(pid)}
    trace = None
    if syscalls:
        from .syscalls import trace as strace

        say(f"tracing read latency of {len(processes)} process(es) with strace for {syscalls:g} s")
        trace = strace(sorted(p for p in processes if is_alive(p)), syscalls)
    if root:
        say(f"scanning {root} for the formats dsconvert shard takes it for")
    diag = diagnose_stacks(wall, cpu, pid, available_cpus(), data_root=root, fast_decoder=jpeg_decoders()[0][0],
                           shard_formats=shard_formats(root) if root else ())
    storage = storage_kind(root) if root else None
    if storage:
        diag.evidence.append(f"{len(files)} data file(s) seen open under {root}, on {storage['kind']} "
                             f"({storage['fstype']} at {storage['mount']})")
    if trace:
        _syscall_evidence(trace, diag.evidence, diag.notes)
    return {
        "schema": REPORT_SCHEMA, "schema_version": REPORT_VERSION,
        "target": {"pid": pid, "cmdline": processes.get(pid, ""), "workers": worker_pids(wall),
                   "processes": processes},
        "duration_s": duration, "rate_hz": rate, "seconds": time.perf_counter() - started,
        "data": {"files_seen": len(files), "examples": files[:5], "root": root, "storage": storage},
        "syscalls": trace,
        "diagnosis": diag.to_dict(),
    }


class _ScanTooLong(Exception):
    pass


def shard_formats(root: str, budget: float = 30.0) -> Optional[List[str]]:
    """The formats ``dsconvert shard ROOT`` converts ROOT to, by the scanner and the check
    :func:`dsconvert.convert.convert` makes: none when it cannot scan ROOT, None when the scan
    takes over ``budget`` seconds (a guessed root can be a very large tree)."""
    from ..convert import accepts
    from ..formats import FORMATS
    from ..source import scan

    deadline = time.monotonic() + budget

    def in_time(files: int) -> None:
        if time.monotonic() > deadline:
            raise _ScanTooLong

    try:
        source = scan(root, progress=in_time)
    except _ScanTooLong:
        return None
    except (DsconvertError, OSError, ValueError):
        return []
    return [fmt for fmt in FORMATS if source.samples and accepts(fmt, source)]


def _syscall_evidence(trace: Dict[str, Dict], evidence: List[str], notes: List[str]) -> None:
    reads = trace.get("file read")
    if reads:
        evidence.append(f"file reads (strace): {reads['count']:,} calls, p50 {reads['ms']['p50']:.3f} ms, "
                        f"p99 {reads['ms']['p99']:.2f} ms, {reads['over_10ms']:.1%} over 10 ms")
        if reads["over_10ms"] >= 0.01 or reads["ms"]["p99"] >= 10:
            notes.append("reads over 10 ms are network-storage latency: copy the data to local SSD "
                         "(the wds/npy conversion does that)")
    opens = trace.get("open")
    if opens:
        evidence.append(f"file opens (strace): {opens['count']:,} calls, p50 {opens['ms']['p50']:.3f} ms, "
                        f"p99 {opens['ms']['p99']:.2f} ms")
    sockets = trace.get("socket read")
    if sockets:
        evidence.append(f"socket reads (strace): {sockets['count']:,} calls, p99 {sockets['ms']['p99']:.2f} ms, "
                        f"{sockets['bytes'] / 1e6:,.1f} MB")
