"""``DataLoadingMonitor``: in the training loop, how long each step waits for its batch.

A step has two parts seen from the consumer: *load*, the time blocked in ``next(loader)``
(zero when the workers kept up), and *compute*, the time from receiving the batch until the
next one is requested (forward, backward, optimizer, logging). When load is a large share of
the step, the GPU idles and the job is input-bound; that is the symptom "GPU utilisation
drops to 0 % and back" looks like from the host.

With ``gpu=True`` (or a :class:`dsconvert.gpu.GpuSampler`), GPU utilisation is sampled in a
background thread while ``wrap`` runs, and ``summary()["gpu"]`` says per GPU the job uses: mean
utilisation, the share of samples below 10 %, and the share of those low samples that fell
inside the loop's waits for a batch (beside the share of time the waits covered: what chance
alone would give). Without an NVIDIA GPU it says so in ``summary()["gpu"]["reason"]``.

Only the consumer side is timed, so it works with any number of DataLoader workers (or any
iterable). With CUDA, kernels run asynchronously: pass ``sync=torch.cuda.synchronize`` so the
compute time ends when the GPU's work has, not when it was queued.

The per-step cost is a few additions (well under 2 µs, see ``benchmarks/monitor.py``);
statistics are computed when asked for. Quantiles interpolate linearly between order
statistics (numpy's default), so p99 of 100 steps is not simply the largest one.

The alert condition is *sustained*: over the last ``patience`` steps, the load share
(sum of load / sum of load and compute) stays above ``threshold``. Prefetching makes single
steps misleading (one step waits for a whole round of workers, the next few wait for nothing),
so single steps never alert. An alert fires once when the condition starts to hold and again
only after the share has fallen below the threshold in between.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Generator, Iterable, Optional, Tuple, Union

import numpy as np

__all__ = ["DataLoadingMonitor", "Alert"]


@dataclass(frozen=True)
class Alert:
    """A sustained input-bound stretch: the load share over the last ``steps`` steps."""

    step: int
    steps: int
    load_share: float
    load_ms_mean: float
    compute_ms_mean: float

    @property
    def message(self) -> str:
        return (f"input-bound at step {self.step}: loading took {self.load_share:.0%} of the last "
                f"{self.steps} steps ({self.load_ms_mean:.1f} ms waiting for each batch, "
                f"{self.compute_ms_mean:.1f} ms computing); `dsconvert analyze DATA` or "
                "`dsconvert diagnose --pid PID` tells why")


def _quantile(values: np.ndarray, q: float) -> float:
    return float(np.quantile(values, q)) if len(values) else math.nan


class DataLoadingMonitor:
    """Time load vs compute for each step of a training loop.

    ::

        monitor = DataLoadingMonitor(sync=torch.cuda.synchronize, logger=log, log_every=100)
        for images, labels in monitor.wrap(loader):
            train_step(images, labels)
        print(monitor.summary())

    ``window``: steps kept for the statistics. ``threshold``: load share above which the job
    counts as input-bound. ``patience``: steps the share must stay above ``threshold`` before
    ``on_alert`` is called (and a warning logged). ``warmup``: first steps left out of the
    statistics (the first batch includes starting the workers; see ``startup_s``).
    ``batch_size``: samples per batch, for samples/s. ``clock``: a monotonic clock in seconds.
    ``gpu``: True to sample GPU utilisation while ``wrap`` runs (a :class:`~dsconvert.gpu.GpuSampler`
    of this process), or a sampler of your own (sharing ``clock``); :meth:`close` stops it.
    """

    def __init__(
        self,
        window: int = 100,
        threshold: float = 0.5,
        patience: int = 20,
        warmup: int = 1,
        sync: Optional[Callable[[], Any]] = None,
        on_alert: Optional[Callable[[Alert], Any]] = None,
        logger: Optional[logging.Logger] = None,
        log_every: int = 0,
        batch_size: Optional[int] = None,
        clock: Callable[[], float] = time.perf_counter,
        gpu: Union[bool, Any] = False,
    ):
        if window < 1 or patience < 1:
            raise ValueError("window and patience must be >= 1")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold is a share of the step time, between 0 and 1; got {threshold}")
        if warmup < 0 or log_every < 0:
            raise ValueError("warmup and log_every must be >= 0")
        self.window = int(window)
        self.threshold = float(threshold)
        self.patience = int(patience)
        self.warmup = int(warmup)
        self.sync = sync
        self.on_alert = on_alert
        self.logger = logger
        self.log_every = int(log_every)
        self.batch_size = batch_size
        self.clock = clock
        if gpu is True:
            import os

            from .gpu import GpuSampler

            gpu = GpuSampler(pids=[os.getpid()], clock=clock)
        self.gpu = gpu or None
        self.reset()

    def reset(self) -> None:
        """Forget every step (the settings stay)."""
        self._steps: Deque[Tuple[float, float]] = deque(maxlen=self.window)  # (load, compute) s
        self._recent: Deque[Tuple[float, float]] = deque()  # the last ``patience`` steps
        self._recent_load = 0.0
        self._recent_total = 0.0
        self._alerting = False
        self.steps = 0  # steps recorded, warm-up included
        self.alerts = 0
        self.startup_s: Optional[float] = None  # the first batch's wait (worker start-up)
        self.total_load_s = 0.0  # after warm-up, over the whole run
        self.total_compute_s = 0.0
        self._waits: Deque[Tuple[float, float]] = deque(maxlen=200_000)  # (requested, received), with gpu

    # -- recording ------------------------------------------------------------------------

    def record(self, load_s: float, compute_s: float) -> None:
        """Record one step timed by the caller (CUDA events, say), in seconds."""
        self.steps += 1
        if self.steps == 1:
            self.startup_s = load_s
        if self.steps <= self.warmup:
            return
        self._steps.append((load_s, compute_s))
        self.total_load_s += load_s
        self.total_compute_s += compute_s
        recent = self._recent
        recent.append((load_s, compute_s))
        self._recent_load += load_s
        self._recent_total += load_s + compute_s
        if len(recent) > self.patience:
            old_load, old_compute = recent.popleft()
            self._recent_load -= old_load
            self._recent_total -= old_load + old_compute
        if len(recent) == self.patience:
            share = self._recent_load / self._recent_total if self._recent_total > 0 else 0.0
            if share > self.threshold:
                if not self._alerting:
                    self._alerting = True
                    self._alert(share)
            elif self._alerting:
                self._alerting = False
        if self.log_every and self.logger is not None and self.steps % self.log_every == 0:
            self.logger.info("data loading: %s", self.describe())

    def _alert(self, share: float) -> None:
        self.alerts += 1
        # exact sums for the message (the running ones accumulate rounding); alerts are rare
        self._recent_load = sum(load for load, _ in self._recent)
        self._recent_total = sum(load + comp for load, comp in self._recent)
        n = len(self._recent)
        alert = Alert(self.steps, n, share, self._recent_load / n * 1000,
                      (self._recent_total - self._recent_load) / n * 1000)
        if self.logger is not None:
            self.logger.warning("%s", alert.message)
        if self.on_alert is not None:
            self.on_alert(alert)

    def wrap(self, iterable: Iterable[Any], progress: Any = None,
             refresh_every: int = 10) -> Generator[Any, None, None]:
        """Yield ``iterable``'s items, timing each step.

        ``progress``: a tqdm bar (or ``True`` for a new one) that is advanced each step and
        shows the load share and p99 wait as its postfix every ``refresh_every`` steps.
        """
        bar, own_bar = self._bar(progress, iterable)
        clock, sync, record = self.clock, self.sync, self.record
        waits = self._waits if self.gpu is not None else None
        if self.gpu is not None:
            self.gpu.start()
        requested = clock()
        it = iter(iterable)  # a DataLoader starts its workers here: part of the first wait
        try:
            while True:
                try:
                    item = next(it)
                except StopIteration:
                    break
                received = clock()
                if waits is not None:
                    waits.append((requested, received))
                yield item
                if sync is not None:
                    sync()
                now = clock()
                record(received - requested, now - received)
                requested = now
                if bar is not None:
                    bar.update(1)
                    if self.steps % refresh_every == 0:
                        bar.set_postfix(self.postfix(), refresh=False)
        finally:
            if own_bar:
                bar.close()

    def close(self) -> None:
        """Stop the GPU sampler (its samples stay for :meth:`summary`)."""
        if self.gpu is not None:
            self.gpu.stop()

    def __enter__(self) -> DataLoadingMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _bar(self, progress: Any, iterable: Any) -> Tuple[Any, bool]:
        if progress is None or progress is False:
            return None, False
        if progress is True:
            from tqdm import tqdm

            try:
                total = len(iterable)
            except TypeError:
                total = None
            return tqdm(total=total, unit="step", dynamic_ncols=True), True
        return progress, False

    # -- statistics -----------------------------------------------------------------------

    def _arrays(self) -> Tuple[np.ndarray, np.ndarray]:
        if not self._steps:
            return np.empty(0), np.empty(0)
        arr = np.asarray(self._steps, dtype=float)
        return arr[:, 0], arr[:, 1]

    def summary(self, gpu: bool = True) -> Dict[str, Any]:
        """Statistics over the window (``load_ms``, ``compute_ms``: mean, p50, p99, max), the
        load share and the fraction of steps where loading took longer than computing, the
        verdict (``input-bound``, ``compute-bound``, or ``unknown`` before any step), and
        totals over the whole run; with a GPU sampler (and ``gpu``), ``gpu``: its summary
        lined up with the waits of the steps ``wrap`` timed (see :mod:`dsconvert.gpu`)."""
        load, compute = self._arrays()
        n = len(load)

        def stats(values: np.ndarray) -> Dict[str, float]:
            ms = values * 1000
            return {"mean": float(ms.mean()) if n else math.nan, "p50": _quantile(ms, 0.5),
                    "p99": _quantile(ms, 0.99), "max": float(ms.max()) if n else math.nan}

        total = float(load.sum() + compute.sum())
        share = float(load.sum()) / total if total > 0 else (0.0 if n else math.nan)
        if not n:
            verdict = "unknown"
        else:
            verdict = "input-bound" if share > self.threshold else "compute-bound"
        run_total = self.total_load_s + self.total_compute_s
        out: Dict[str, Any] = {
            "steps": self.steps,
            "window": n,
            "load_ms": stats(load),
            "compute_ms": stats(compute),
            "load_share": share,
            "load_dominated_steps": float((load > compute).mean()) if n else math.nan,
            "verdict": verdict,
            "threshold": self.threshold,
            "alerts": self.alerts,
            "alerting": self._alerting,
            "startup_s": self.startup_s,
            "steps_per_s": n / total if total > 0 else math.nan,
            "total_load_s": self.total_load_s,
            "total_compute_s": self.total_compute_s,
            "total_load_share": self.total_load_s / run_total if run_total > 0 else math.nan,
        }
        if self.batch_size:
            out["samples_per_s"] = out["steps_per_s"] * self.batch_size
        if gpu and self.gpu is not None:
            out["gpu"] = self.gpu.summary(waits=list(self._waits))
        return out

    def postfix(self) -> Dict[str, str]:
        """A short dict for ``tqdm.set_postfix``: load share and p99 wait over the window."""
        load, compute = self._arrays()
        if not len(load):
            return {}
        total = float(load.sum() + compute.sum())
        share = float(load.sum()) / total if total > 0 else 0.0
        return {"load": f"{share:.0%}", "wait_p99": f"{_quantile(load, 0.99) * 1000:.1f}ms"}

    def describe(self) -> str:
        """One line for a log."""
        s = self.summary(gpu=False)  # a log line needs no GPU query
        if not s["window"]:
            return "no steps yet"
        return (f"load p50 {s['load_ms']['p50']:.1f} ms, p99 {s['load_ms']['p99']:.1f} ms; compute p50 "
                f"{s['compute_ms']['p50']:.1f} ms; loading {s['load_share']:.0%} of the last {s['window']} "
                f"steps ({s['verdict']})")

    def __repr__(self) -> str:
        return f"DataLoadingMonitor({self.describe()})"
