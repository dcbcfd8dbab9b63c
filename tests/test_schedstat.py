"""Rates less what other processes' load cost (dsconvert.schedstat), which analyze decides on
(issue 33, class 8): the arithmetic on recorded figures, and the run-queue wait read from a
real process made to share one CPU with a busy one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dsconvert import schedstat
from dsconvert.analyze.measure import _summary

linux = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="needs Linux schedstat")


def test_unloaded_rates_on_recorded_waits():
    # two workers alive 10 s each, one waited 4 s for a CPU, the other 6 s: half their time was load
    assert schedstat.unloaded(100.0, {1: (10.0, 4.0), 2: (10.0, 6.0)}) == pytest.approx(200.0)
    assert schedstat.unloaded(100.0, {}) == 100.0  # nothing known: the wall rate stands
    assert schedstat.unloaded(100.0, {1: (10.0, 0.0)}) == 100.0
    assert schedstat.unloaded(100.0, {1: (10.0, 10.0)}) == 100.0  # no time of its own: not divided by zero
    assert schedstat.unloaded(100.0, {1: (0.0, 0.0)}) == 100.0


def test_read_rates_less_the_readers_waits():
    # 4 reads of 1 MB, 10 ms each of the storage's own time; the pass took 80 ms of wall, 40 ms of which
    # the one reader waited for a CPU: 4 MB in 40 ms
    results = [(1_000_000, 0.010, 0.010)] * 4
    row = _summary(results, 0.080)
    assert row["mb_per_s"] == pytest.approx(100.0)
    assert row["latency_ms"]["p50"] == pytest.approx(10.0)
    # with 2 readers the same waits are spread over both threads
    assert _summary(results, 0.080, threads=2)["mb_per_s"] == pytest.approx(4 / 0.060)


@linux
def test_thread_wait_grows_only_while_waiting():
    before = schedstat.thread_wait_s()
    assert before >= 0.0
    time.sleep(0.05)  # blocked, not runnable: no run-queue wait
    assert schedstat.thread_wait_s() - before < 0.05


@linux
def test_a_worker_sharing_its_cpu_has_its_wait_counted():
    """A busy child and a busy competitor pinned to one CPU share it: the child's run-queue
    wait is a large part of its life, and the unloaded rate is about twice the wall rate."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    busy = f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nt = time.time()\nwhile time.time() - t < 3: pass\n"
    competitor = subprocess.Popen([sys.executable, "-c", busy])
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        time.sleep(1.5)
        assert child.pid in schedstat.children()
        waits = schedstat.waits_of([child.pid])
        alive, waited = waits[child.pid]
        assert 0 < alive < 10
        assert waited > 0.2 * alive, waits  # two runnable processes on one CPU: each waits for the other
        assert schedstat.unloaded(1.0, waits) > 1.25
    finally:
        for p in (competitor, child):
            p.kill()
            p.wait()
    assert schedstat.waits_of([child.pid]) == {}  # gone: nothing to read


@linux
def test_cpu_time_counts_work_not_waiting():
    """A child that computes gains CPU seconds; one that sleeps does not, however long it lives:
    the per-sample cost analyze decides on counts work, which load does not add to."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(30)\n"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.time() + 20
        while time.time() < deadline and schedstat.cpu_s_of([busy.pid]).get(busy.pid, 0.0) < 0.4:
            time.sleep(0.1)
        got = schedstat.cpu_s_of([busy.pid, idle.pid])
        assert got[busy.pid] >= 0.4
        assert got[idle.pid] < 0.3  # the interpreter's start, then nothing while it sleeps
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    assert schedstat.cpu_s_of([busy.pid]) == {}


def test_no_such_process():
    assert schedstat.waits_of([2 ** 22 + 12345]) == {}
    assert schedstat.children(2 ** 22 + 12345) == []
