"""GPU utilisation, sampled in a background thread: the symptom users see of an input-bound job.

:class:`GpuSampler` reads every GPU's utilisation (the share of the last sample period, 1/6 s
to 1 s depending on the GPU, during which a kernel ran) and memory in use, every ``interval``
seconds, through NVML (``pip install 'dsconvert[gpu]'``, i.e. nvidia-ml-py: ``import pynvml``)
when it is importable and finds a device, else from ``nvidia-smi --query-gpu=index,
utilization.gpu,memory.used --format=csv,noheader,nounits -lms MS`` read line by line. Each
sample is stamped with ``clock`` (``time.perf_counter``, the clock ``DataLoadingMonitor``
uses) when it is read, so samples can be lined up with the training loop's waits.

:meth:`GpuSampler.job_gpus` says which GPUs the job's processes hold (NVML's running compute
processes, or ``nvidia-smi --query-compute-apps=pid,gpu_uuid``), and :meth:`GpuSampler.summary`
gives per GPU: mean utilisation, the share of samples below 10 % and, given the intervals the
loop waited for a batch, the share of those low samples that fell inside a wait (with the share
of time the waits covered, which is what chance alone would give).

Without an NVIDIA GPU (no NVML library, no nvidia-smi, no device) the summary says so in
``reason`` and holds no samples; nothing raises.
"""

from __future__ import annotations

import bisect
import shutil
import subprocess
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

__all__ = ["GpuSampler", "parse_smi_line", "parse_csv_pairs", "utilisation", "align_with_waits", "LOW_UTIL"]

LOW_UTIL = 10.0  # percent: below it, the GPU counts as idle
Sample = Tuple[float, int, float, float]  # (clock seconds, GPU index, utilisation %, memory MiB)
SMI_QUERY = ["--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]


def parse_smi_line(line: str) -> Optional[Tuple[int, float, float]]:
    """``"0, 35, 1024"`` -> (0, 35.0, 1024.0); None for anything else (headers, ``[N/A]``,
    error messages)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        return int(parts[0]), float(parts[1]), float(parts[2])
    except ValueError:
        return None


def parse_csv_pairs(text: str) -> List[Tuple[str, str]]:
    """The two-column lines of an ``nvidia-smi --query-...=a,b --format=csv,noheader`` answer."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and all(parts):
            out.append((parts[0], parts[1]))
    return out


def utilisation(samples: Sequence[Sample], low: float = LOW_UTIL) -> Dict[int, Dict[str, Any]]:
    """Per GPU index: samples, mean utilisation (%), share of samples below ``low`` %, the most
    memory in use (MiB)."""
    by_gpu: Dict[int, List[Sample]] = {}
    for s in samples:
        by_gpu.setdefault(s[1], []).append(s)
    out = {}
    for index, rows in sorted(by_gpu.items()):
        utils = [r[2] for r in rows]
        out[index] = {"samples": len(rows), "mean_util": sum(utils) / len(utils),
                      "low_share": sum(u < low for u in utils) / len(utils),
                      "max_memory_mib": max(r[3] for r in rows)}
    return out


def align_with_waits(times: Sequence[float], utils: Sequence[float], waits: Sequence[Tuple[float, float]],
                     low: float = LOW_UTIL) -> Dict[str, Any]:
    """How the low-utilisation samples (at ``times``, clock seconds) line up with ``waits``,
    the (start, end) intervals the training loop spent waiting for a batch.

    ``low_in_wait_share``: the share of samples below ``low`` % taken inside a wait;
    ``wait_time_share``: the share of the sampled span (first to last sample) the waits cover,
    i.e. what ``low_in_wait_share`` would be if idleness and waits were unrelated. A sample
    stamps the moment it was read; the GPU's own figure averages the preceding 1/6-1 s, so
    only waits longer than that line up sample by sample."""
    ordered = sorted((a, b) for a, b in waits if b > a)
    merged: List[List[float]] = []
    for a, b in ordered:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [m[0] for m in merged]

    def inside(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t <= merged[i][1]

    low_times = [t for t, u in zip(times, utils) if u < low]
    in_wait = sum(inside(t) for t in low_times)
    span = (min(times), max(times)) if times else (0.0, 0.0)
    covered = sum(max(0.0, min(b, span[1]) - max(a, span[0])) for a, b in merged)
    length = span[1] - span[0]
    return {"low_samples": len(low_times), "low_in_wait": in_wait,
            "low_in_wait_share": in_wait / len(low_times) if low_times else None,
            "wait_time_share": covered / length if length > 0 else None}


class GpuSampler:
    """Sample GPU utilisation every ``interval`` seconds in a background thread.

    ::

        with GpuSampler(pids=[job_pid]) as gpu:
            ...
        print(gpu.summary())

    ``pids``: the job's processes, to tell which GPUs it uses (:meth:`job_gpus`).
    ``backend``: ``"nvml"``, ``"nvidia-smi"`` or None to try them in that order.
    ``max_samples``: samples kept (the oldest are dropped), for long runs.
    """

    def __init__(self, interval: float = 0.1, pids: Sequence[int] = (), backend: Optional[str] = None,
                 clock: Callable[[], float] = time.perf_counter, max_samples: int = 200_000, low: float = LOW_UTIL):
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if backend not in (None, "nvml", "nvidia-smi"):
            raise ValueError(f"backend is 'nvml', 'nvidia-smi' or None; got {backend!r}")
        self.interval = float(interval)
        self.pids = list(pids)
        self.backend = backend
        self.clock = clock
        self.low = low
        self.samples: Deque[Sample] = deque(maxlen=max_samples)
        self.reason: Optional[str] = None  # why there are no samples
        self.used: Optional[str] = None  # the backend that sampled
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._proc: Optional[subprocess.Popen] = None
        self._smi_output: List[str] = []  # nvidia-smi's lines that were not samples (its errors)
        self._nvml: Any = None
        self._job_gpus: List[int] = []

    # -- backends ---------------------------------------------------------------------------

    def _try_nvml(self) -> Optional[str]:
        """Set up NVML; None when it works, else why not."""
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return "nvidia-ml-py is not installed"
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return f"NVML: {exc}"
        if not count:
            pynvml.nvmlShutdown()
            return "NVML found no GPU"
        self._nvml = (pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)])
        return None

    def _run_nvml(self) -> None:
        pynvml, handles = self._nvml
        while not self._stop.is_set():
            for index, handle in enumerate(handles):
                try:
                    util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                    mem = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2 ** 20
                except Exception:
                    continue
                self.samples.append((self.clock(), index, float(util), float(mem)))
            self._stop.wait(self.interval)

    def _run_smi(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            parsed = parse_smi_line(line)
            if parsed is None:
                if line.strip() and len(self._smi_output) < 20:
                    self._smi_output.append(line.strip())
                continue
            self.samples.append((self.clock(), *parsed))
        proc.wait()

    # -- control ----------------------------------------------------------------------------

    def start(self) -> GpuSampler:
        """Start sampling (again: no-op while running). Never raises for a missing GPU."""
        if self._thread is not None:
            return self
        self._stop.clear()
        reasons = []
        if self.backend in (None, "nvml"):
            why = self._try_nvml()
            if why is None:
                self.used = "nvml"
                self._thread = threading.Thread(target=self._run_nvml, name="dsconvert-gpu", daemon=True)
            else:
                reasons.append(why)
        if self._thread is None and self.backend in (None, "nvidia-smi"):
            exe = shutil.which("nvidia-smi")
            if not exe:
                reasons.append("nvidia-smi is not on PATH")
            else:
                try:
                    self._proc = subprocess.Popen([exe, *SMI_QUERY, "-lms", str(max(1, round(self.interval * 1000)))],
                                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                  bufsize=1)
                except OSError as exc:
                    reasons.append(f"nvidia-smi: {exc}")
                else:
                    self.used = "nvidia-smi"
                    self._thread = threading.Thread(target=self._run_smi, name="dsconvert-gpu", daemon=True)
        if self._thread is None:
            self.reason = "no NVIDIA GPU: " + "; ".join(reasons)
            return self
        self.reason = None
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling; the samples stay."""
        self._stop.set()
        if self._proc is not None and not self.samples:
            try:  # nothing read yet: let a failing nvidia-smi finish saying why
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if not self.samples:  # it printed why: "No devices were found", "couldn't communicate with the driver"
                said = " ".join(self._smi_output)[:300] or f"exit status {self._proc.returncode}"
                self.reason = f"no NVIDIA GPU: nvidia-smi: {said}"
            self._proc = None
        if self._nvml is not None:
            try:
                self._nvml[0].nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
        self._thread = None

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results ----------------------------------------------------------------------------

    def job_gpus(self) -> List[int]:
        """The GPU indices on which one of ``pids`` runs (empty when none was found, or no
        backend answers)."""
        if not self._job_gpus:
            self._job_gpus = self._find_job_gpus()  # a job keeps its GPUs: asked until found
        return list(self._job_gpus)

    def _find_job_gpus(self) -> List[int]:
        pids = set(self.pids)
        if not pids:
            return []
        if self._nvml is not None or self.used == "nvml":
            try:
                import pynvml

                pynvml.nvmlInit()
                try:
                    found = []
                    for i in range(pynvml.nvmlDeviceGetCount()):
                        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))
                        if any(p.pid in pids for p in procs):
                            found.append(i)
                    return found
                finally:
                    pynvml.nvmlShutdown()
            except Exception:
                return []
        exe = shutil.which("nvidia-smi")
        if not exe:
            return []
        try:
            apps = subprocess.run([exe, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout
            uuids = subprocess.run([exe, "--query-gpu=index,uuid", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        index_of = {uuid: int(i) for i, uuid in parse_csv_pairs(uuids) if i.isdigit()}
        return sorted({index_of[uuid] for pid, uuid in parse_csv_pairs(apps)
                       if pid.isdigit() and int(pid) in pids and uuid in index_of})

    def summary(self, waits: Optional[Sequence[Tuple[float, float]]] = None) -> Dict[str, Any]:
        """``{available, backend, reason, interval_s, job_gpus, gpus{index: {samples, mean_util,
        low_share, max_memory_mib[, low_in_wait_share, wait_time_share, low_samples]}}}``; the
        alignment with ``waits`` (clock seconds) when given. ``job_gpus`` lists every sampled
        GPU when none of ``pids`` was seen on one (``job_gpus_found`` false)."""
        samples = list(self.samples)
        if not samples:
            return {"available": False, "backend": self.used, "reason": self.reason or "no samples yet",
                    "interval_s": self.interval, "job_gpus": [], "gpus": {}}
        gpus = utilisation(samples, self.low)
        found = self.job_gpus()
        if waits is not None:
            for index, entry in gpus.items():
                rows = [s for s in samples if s[1] == index]
                entry.update(align_with_waits([s[0] for s in rows], [s[2] for s in rows], waits, self.low))
        return {"available": True, "backend": self.used, "reason": None, "interval_s": self.interval,
                "job_gpus": found or sorted(gpus), "job_gpus_found": bool(found), "gpus": gpus}
