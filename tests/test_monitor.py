"""DataLoadingMonitor: statistics against numpy, the sustained alert, a real DataLoader; every
duration on a fake clock, so a loaded machine cannot change what is measured."""

import logging
import math
import time

import numpy as np
import pytest

from dsconvert import DataLoadingMonitor
from dsconvert.monitor import Alert


class FakeClock:
    """A clock the test moves: the iterable advances it by the load time, the loop body by
    the compute time, so every step's split is known exactly."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def timed_items(clock, loads):
    for load in loads:
        clock.advance(load)
        yield load


def run(monitor, clock, loads, computes):
    seen = []
    for item, compute in zip(monitor.wrap(timed_items(clock, loads)), computes):
        seen.append(item)
        clock.advance(compute)
    return seen


def test_statistics_match_numpy():
    rng = np.random.default_rng(0)
    loads = rng.exponential(0.01, 250).tolist()
    computes = rng.uniform(0.005, 0.03, 250).tolist()
    clock = FakeClock()
    m = DataLoadingMonitor(window=100, warmup=1, clock=clock)
    assert run(m, clock, loads, computes) == loads
    s = m.summary()
    # the window holds the last 100 steps; warm-up excluded the first
    win_load = np.array(loads[-100:]) * 1000
    win_comp = np.array(computes[-100:]) * 1000
    assert s["steps"] == 250 and s["window"] == 100
    for q, key in ((0.5, "p50"), (0.99, "p99")):
        assert s["load_ms"][key] == pytest.approx(np.quantile(win_load, q))
        assert s["compute_ms"][key] == pytest.approx(np.quantile(win_comp, q))
    # p99 of 100 values interpolates between the two largest, not "sorted[int(n * 0.99)]"
    ordered = np.sort(win_load)
    assert ordered[-2] <= s["load_ms"]["p99"] <= ordered[-1]
    assert s["load_ms"]["p99"] != ordered[int(len(ordered) * 0.99)] or ordered[-1] == ordered[-2]
    assert s["load_ms"]["mean"] == pytest.approx(win_load.mean())
    assert s["load_share"] == pytest.approx(win_load.sum() / (win_load.sum() + win_comp.sum()))
    assert s["load_dominated_steps"] == pytest.approx(np.mean(win_load > win_comp))
    assert s["startup_s"] == pytest.approx(loads[0])
    assert s["total_load_s"] == pytest.approx(sum(loads[1:]))
    assert s["total_compute_s"] == pytest.approx(sum(computes[1:]))
    assert s["steps_per_s"] == pytest.approx(100 / ((win_load.sum() + win_comp.sum()) / 1000))


def test_verdicts():
    clock = FakeClock()
    m = DataLoadingMonitor(clock=clock, warmup=0)
    assert m.summary()["verdict"] == "unknown" and m.describe() == "no steps yet"
    run(m, clock, [0.03] * 10, [0.01] * 10)
    assert m.summary()["verdict"] == "input-bound"
    m.reset()
    run(m, clock, [0.001] * 10, [0.05] * 10)
    s = m.summary()
    assert s["verdict"] == "compute-bound" and s["load_share"] == pytest.approx(1 / 51)


def test_alert_is_sustained_fires_once_and_rearms():
    clock = FakeClock()
    alerts = []
    m = DataLoadingMonitor(threshold=0.5, patience=5, warmup=0, on_alert=alerts.append, clock=clock)
    # a lone slow step (prefetch sawtooth) must not alert: share over 5 steps stays below half
    run(m, clock, [0.0, 0.0, 0.0, 0.0, 0.04, 0.0, 0.0], [0.01] * 7)
    assert alerts == []
    # sustained: loading 30 ms vs 10 ms compute; fires once when the 5-step share passes 0.5
    run(m, clock, [0.03] * 12, [0.01] * 12)
    assert len(alerts) == 1
    alert = alerts[0]
    assert isinstance(alert, Alert) and alert.steps == 5 and alert.load_share > 0.5
    assert "input-bound" in alert.message and "dsconvert diagnose" in alert.message
    # recovery re-arms it; the next sustained stretch fires again
    run(m, clock, [0.0] * 6, [0.05] * 6)
    assert not m.summary()["alerting"]
    run(m, clock, [0.03] * 6, [0.01] * 6)
    assert len(alerts) == 2 and m.summary()["alerts"] == 2


def test_logging_and_progress(caplog):
    clock = FakeClock()
    log = logging.getLogger("train")
    m = DataLoadingMonitor(patience=3, warmup=0, logger=log, log_every=4, clock=clock)

    class Bar:
        def __init__(self):
            self.n, self.postfix = 0, None

        def update(self, n):
            self.n += n

        def set_postfix(self, d, refresh=True):
            self.postfix = d

    bar = Bar()
    with caplog.at_level(logging.INFO, logger="train"):
        for _, compute in zip(m.wrap(timed_items(clock, [0.02] * 8), progress=bar, refresh_every=2), [0.01] * 8):
            clock.advance(compute)
    assert bar.n == 8 and bar.postfix["load"] == "67%" and bar.postfix["wait_p99"] == "20.0ms"
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(infos) == 2 and "load p50 20.0 ms" in infos[0].getMessage()
    assert len(warnings) == 1 and "input-bound" in warnings[0].getMessage()


def test_sync_is_timed_as_compute():
    clock = FakeClock()
    m = DataLoadingMonitor(warmup=0, sync=lambda: clock.advance(0.02), clock=clock)  # the GPU finishing
    run(m, clock, [0.001] * 5, [0.001] * 5)
    assert m.summary()["compute_ms"]["p50"] == pytest.approx(21.0)


def test_record_and_early_break():
    m = DataLoadingMonitor(warmup=0)
    m.record(0.002, 0.008)
    assert m.summary()["load_share"] == pytest.approx(0.2)
    m.reset()
    clock = FakeClock()
    m.clock = clock
    for i, _ in enumerate(m.wrap(timed_items(clock, [0.01] * 10))):
        clock.advance(0.01)
        if i == 3:
            break  # the step cut short has no compute time: not recorded
    assert m.summary()["steps"] == 3


def test_invalid_settings():
    for kw in ({"window": 0}, {"patience": 0}, {"threshold": 1.5}, {"threshold": 0}, {"warmup": -1}):
        with pytest.raises(ValueError):
            DataLoadingMonitor(**kw)


def test_sleeps_timed_on_the_fake_clock():
    """What real sleeps showed, with sleeps the clock plays: a loaded CI machine can neither
    stretch nor shrink them."""
    assert DataLoadingMonitor().clock is time.perf_counter  # wall time unless told otherwise
    clock = FakeClock()

    def slow(n, seconds):
        for i in range(n):
            clock.advance(seconds)  # a sleep of exactly ``seconds``
            yield i

    m = DataLoadingMonitor(warmup=0, clock=clock)
    for _ in m.wrap(slow(12, 0.02)):
        clock.advance(0.005)
    s = m.summary()
    assert s["steps"] == 12 and s["window"] == 12
    # exact on this clock, so inside the bounds real sleeps were allowed (20-60 ms, 5-45 ms)
    assert s["load_ms"]["p50"] == pytest.approx(20.0) and s["compute_ms"]["p50"] == pytest.approx(5.0)
    assert s["load_ms"]["p50"] > s["compute_ms"]["p50"] and s["verdict"] == "input-bound"


class Numbers:
    """A map-style dataset of 0..23 that says which DataLoader worker read each sample."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        import torch

        return i, torch.utils.data.get_worker_info().id


class TimedLoader:
    """A real DataLoader whose waits the fake clock plays: ``iter()`` starts the workers
    (``start_s``), each sample takes ``sample_s`` to read, the first batch from one worker,
    later ones from all of them in parallel."""

    def __init__(self, loader, clock, start_s, sample_s):
        self.loader, self.clock, self.start_s, self.sample_s = loader, clock, start_s, sample_s

    def __iter__(self):
        self.clock.advance(self.start_s)
        return self._batches(iter(self.loader))

    def _batches(self, it):
        for k, batch in enumerate(it):
            parallel = 1 if k == 0 else self.loader.num_workers
            self.clock.advance(len(batch[0]) * self.sample_s / parallel)
            yield batch


def test_dataloader_with_workers(torch):
    clock = FakeClock()
    loader = torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=2)
    m = DataLoadingMonitor(warmup=1, clock=clock)
    seen, workers = [], set()
    for batch, wids in m.wrap(TimedLoader(loader, clock, start_s=0.05, sample_s=0.02)):
        seen.extend(batch.tolist())
        workers.update(wids.tolist())
        clock.advance(0.002)
    s = m.summary()
    assert sorted(seen) == list(range(24)) and workers == {0, 1}  # both workers really read
    assert s["steps"] == 6 and s["window"] == 5
    assert s["startup_s"] is not None and s["startup_s"] >= 0.08  # the first batch: 4 samples x 20 ms
    assert s["startup_s"] == pytest.approx(0.05 + 0.08)  # and starting the workers, inside the first wait
    assert s["load_ms"]["p50"] == pytest.approx(40.0) and s["compute_ms"]["p50"] == pytest.approx(2.0)
    assert s["verdict"] == "input-bound" and not math.isnan(s["load_ms"]["p99"])
