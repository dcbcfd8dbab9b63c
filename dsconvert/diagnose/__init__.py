"""``dsconvert diagnose``: why a *running* training job waits for data.

The diagnosis flow of the mission: GPU utilisation drops -> Python stacks -> system calls.

0. :class:`dsconvert.gpu.GpuSampler` samples GPU utilisation over the same seconds as py-spy
   (one line saying so where there is no NVIDIA GPU);
1. :func:`dsconvert.diagnose.pyspy.record` samples the job and its DataLoader workers with
   py-spy for a few seconds (wall time with ``--idle`` and CPU time without it, side by side);
2. :mod:`dsconvert.diagnose.classify` sorts every sample into what the training loop and the
   workers were doing and decides whether the job is input-bound, why, and which dsconvert
   command removes the cause;
3. optionally (``syscalls=SECONDS``) :mod:`dsconvert.diagnose.syscalls` traces the read
   latency of every process with perf trace (strace where perf is missing or refused), and
   the block layer where perf may, to tell network storage from a slow local disk;
4. the data files the processes hold open (from /proc) name the dataset folder, so the
   suggested commands are ready to run, and the storage it lives on.

The report is a plain dict, schema ``dsconvert.diagnose`` version 2, rendered by
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
from ..gpu import GpuSampler
from ..schedstat import main_thread_times, on_cpu_shares
from .classify import diagnose_stacks, worker_pids
from .procs import FileWatcher, cmdline, descendants, guess_dataset_root, is_alive
from .pyspy import record

__all__ = ["diagnose", "launch", "stop", "shard_formats", "REPORT_SCHEMA", "REPORT_VERSION"]

REPORT_SCHEMA = "dsconvert.diagnose"
REPORT_VERSION = 2  # 2: syscalls became {tracer, groups, processes, block, ...}; gpu added
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
             log: Optional[Callable[[str], None]] = None, tracer: str = "auto") -> Dict[str, Any]:
    """Sample process ``pid`` (a training job) and its subprocesses; return the report."""
    from ..codecs import jpeg_decoders
    from ..io.localfs import storage_kind
    from ..processes import available_cpus

    say = log or (lambda msg: None)
    if duration <= 0 or rate < 1:
        raise OptionError("duration must be > 0 and rate >= 1")
    if not is_alive(pid):
        raise DsconvertError(f"no running process with pid {pid}", str(pid))
    started = time.perf_counter()
    say(f"sampling pid {pid} and its subprocesses with py-spy for {duration:g} s at {rate} Hz")
    gpu_sampler = GpuSampler(pids=[pid] + descendants(pid))
    with FileWatcher(pid) as watcher, gpu_sampler:
        before = main_thread_times([pid] + descendants(pid))
        wall, cpu = record(pid, duration, rate)
        on_cpu = on_cpu_shares(before, main_thread_times(before))
    files = _data_files(watcher.seen)
    root = guess_dataset_root(files)
    processes = {p: cmdline(p) for p in [pid] + descendants(pid)}
    trace = None
    if syscalls:
        from .syscalls import trace as trace_syscalls

        say(f"tracing read latency of {len(processes)} process(es) for {syscalls:g} s (tracer: {tracer})")
        trace = trace_syscalls(sorted(p for p in processes if is_alive(p)), syscalls, tracer)
    if root:
        say(f"scanning {root} for the formats dsconvert shard takes it for")
    diag = diagnose_stacks(wall, cpu, pid, available_cpus(), data_root=root, fast_decoder=jpeg_decoders()[0][0],
                           shard_formats=shard_formats(root) if root else (), on_cpu=on_cpu)
    storage = storage_kind(root) if root else None
    if storage:
        diag.evidence.append(f"{len(files)} data file(s) seen open under {root}, on {storage['kind']} "
                             f"({storage['fstype']} at {storage['mount']})")
    if trace:
        _syscall_evidence(trace, diag.evidence, diag.notes)
    gpu = _gpu_report(gpu_sampler, diag.main)
    return {
        "schema": REPORT_SCHEMA, "schema_version": REPORT_VERSION,
        "target": {"pid": pid, "cmdline": processes.get(pid, ""), "workers": worker_pids(wall),
                   "processes": processes},
        "duration_s": duration, "rate_hz": rate, "seconds": time.perf_counter() - started,
        "data": {"files_seen": len(files), "examples": files[:5], "root": root, "storage": storage},
        "gpu": gpu,
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


def _gpu_report(sampler: GpuSampler, main: Dict[str, Dict]) -> Dict[str, Any]:
    """The sampler's summary, with the main thread's wait share beside each used GPU's idle share.
    py-spy's wall samples carry no timestamps, so the two can only be compared as shares of the
    same seconds, not sample by sample."""
    out = sampler.summary()
    wait = main.get("wait", {}).get("share") if main else None
    out["wait_share"] = wait
    if out["available"] and main:  # no wait sample among the loop's: it waited in 0 % of them
        waited = wait or 0.0
        parts = [f"GPU {i} below 10 % in {out['gpus'][i]['low_share']:.0%} of samples" for i in out["job_gpus"]
                 if i in out["gpus"]]
        out["comparison"] = (
            f"{'; '.join(parts)}; the training loop waited for a batch in {waited:.0%} of py-spy's wall samples over "
            "the same seconds. py-spy's samples carry no timestamps, so these are shares of the period compared, "
            "not samples lined up: similar shares fit a GPU idling while the loop waits for data; an idle share "
            "well above the wait share points elsewhere (synchronisation, CPU work in the loop, another job)")
    return out


def _syscall_evidence(trace: Dict[str, Any], evidence: List[str], notes: List[str]) -> None:
    groups, how = trace["groups"], trace["tracer"]
    reads = groups.get("file read")
    slow = False
    if reads:
        evidence.append(f"file reads ({how}): {reads['count']:,} calls, p50 {reads['ms']['p50']:.3f} ms, "
                        f"p99 {reads['ms']['p99']:.2f} ms, {reads['over_10ms']:.1%} over 10 ms")
        slow = reads["over_10ms"] >= 0.01 or reads["ms"]["p99"] >= 10
    opens = groups.get("open")
    if opens:
        evidence.append(f"file opens ({how}): {opens['count']:,} calls, p50 {opens['ms']['p50']:.3f} ms, "
                        f"p99 {opens['ms']['p99']:.2f} ms")
        slow = slow or opens["ms"]["p50"] >= 10
    sockets = groups.get("socket read")
    if sockets:
        evidence.append(f"socket reads ({how}): {sockets['count']:,} calls, p99 {sockets['ms']['p99']:.2f} ms, "
                        f"{sockets['bytes'] / 1e6:,.1f} MB")
    block = trace.get("block") or {}
    if not slow:
        return
    notes.append("reads or opens over 10 ms are network-storage latency: pre-cache a dsconvert output on local SSD "
                 "with `dsconvert cache URL CACHE_DIR`, or convert a source to shards on local SSD "
                 "(`dsconvert shard SRC --format wds -o /local/ssd/OUT`)")
    if block.get("permitted"):
        file_bytes = reads["bytes"] if reads else 0
        lat = block.get("ms")
        if block["read_requests"] == 0 or (file_bytes and block["read_bytes"] < 0.1 * file_bytes):
            evidence.append(f"block layer (system-wide, same seconds): {block['read_requests']:,} read request(s), "
                            f"{block['read_bytes'] / 1e6:,.1f} MB against {file_bytes / 1e6:,.1f} MB read by the job: "
                            "the slow reads did not wait for a local disk (network storage or FUSE)")
        elif lat and lat["p99"] >= 10:
            evidence.append(f"block layer: {block['read_requests']:,} read requests, p99 {lat['p99']:.1f} ms "
                            "from issue to completion: the local disk itself is slow")
        else:
            evidence.append(f"block layer (system-wide): {block['read_requests']:,} read requests "
                            f"({block['read_bytes'] / 1e6:,.1f} MB)" + (f", p99 {lat['p99']:.2f} ms" if lat else "")
                            + ": the disk answers quickly, so the slow reads waited for something else "
                            "(network storage or FUSE), not the local disk")
    else:
        evidence.append(f"block layer not traced ({block.get('reason', 'not asked for')}): disk and network "
                        "storage cannot be told apart here")
