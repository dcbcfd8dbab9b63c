"""The one executor loop: shard specs in, shard results out, for every writer that maps a shard
task over an executor (``convert``, ``optimize``).

Each spec is first looked up as finished by an earlier run (resumed, not written again); a
file where one of its shards goes must be provably this output's; the rest are written in
this process (one worker), on a pool of our own (forked now, or before the scan:
:func:`started_pool`), or on the caller's executor (a ``dask.distributed`` client's). The first
error cancels what has not started and is raised as its cause (:func:`raise_worker_cause`).

Specs may come from a generator: they are pulled one at a time, only when fewer than about two
per worker are outstanding, so the parent never holds more than that many specs (each carries
its shard's samples) and a generator that builds them one by one stays flat in memory.
"""

from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Type

from ..errors import DsconvertError
from ..formats import Format, get
from ..io.localfs import free_bytes
from ..io.location import is_remote
from ..io.owner import Owned
from ..plan import ShardResult, ShardSpec
from ..processes import process_pool
from ..progress import progress_bar
from .output import NEARLY_FULL, ForeignFiles, is_out_of_space

__all__ = ["run_shards", "Job", "started_pool", "raise_worker_cause", "in_flight_bound"]

# what a worker runs for one spec: a picklable function and its arguments
Job = Tuple[Callable[..., Any], Tuple[Any, ...]]


def _itself(result: Any) -> ShardResult:
    return result


def run_shards(specs: Iterable[ShardSpec], total: int, job: Callable[[ShardSpec], Job], *, workers: int,
               executor: Optional[cf.Executor] = None, bar: Any = None, owned: Optional[Owned] = None,
               pool: Optional[cf.ProcessPoolExecutor] = None,
               completed: Optional[Callable[[ShardSpec], Any]] = None,
               shard_result: Callable[[Any], ShardResult] = _itself,
               in_flight: Optional[int] = None,
               on_result: Optional[Callable[[int, Any], None]] = None) -> List[Any]:
    """Every one of the ``total`` specs done, their results in spec order; see the module doc.

    ``job(spec)``: what writes the spec's shard. ``completed(spec)``: an earlier run's result for
    it, or None (default: its format's ``completed``). ``shard_result``: the ShardResult in a
    result (results may carry more). ``owned``: a file where a shard goes that this journal
    cannot prove ours stops the run (None: replaced). ``pool``: a process pool started earlier,
    used as our own. ``in_flight``: the most specs submitted and not yet finished (default:
    twice the workers, or the executor's slots where it says). ``on_result(i, result)``: sees
    each result as it comes, resumed ones too (conversion moves a shard's positions to disk)."""
    bar = bar if bar is not None else progress_bar(False, "")
    results: List[Any] = [None] * total
    count = resumed = 0
    nbytes = 0
    started = time.perf_counter()
    fmt: Optional[Type[Format]] = None
    out_dir = ""

    def finished(i: int, samples: int, result: Any) -> None:
        nonlocal count, nbytes
        results[i] = result
        if on_result is not None:
            on_result(i, result)
        count += 1
        nbytes += shard_result(result).entry.bytes
        bar.update(samples)
        rate = nbytes / max(time.perf_counter() - started, 1e-9) / 1e6
        bar.set_postfix_str(f"{count}/{total} shards, {rate:.0f} MB/s")

    def to_write() -> Iterator[Tuple[int, ShardSpec]]:
        """The specs still to write, pulled from ``specs`` one at a time as asked for."""
        nonlocal fmt, out_dir, count, resumed
        foreign: Optional[ForeignFiles] = None
        seen = 0
        for i, spec in enumerate(specs):
            if i >= total:
                raise RuntimeError(f"internal error: more than the {total} shard specs announced")
            seen += 1
            if fmt is None:
                fmt, out_dir = get(spec.format), spec.out_dir
            found = (completed or fmt.completed)(spec)
            if found is not None:
                results[i] = found
                if on_result is not None:
                    on_result(i, found)
                count += 1
                resumed += 1
                bar.update(len(spec.samples))
                continue
            if owned is not None:
                if foreign is None:  # one listing, before the first shard is written
                    foreign = ForeignFiles(owned)
                foreign.refuse(fmt, spec)
            yield i, spec
        if seen != total:
            raise RuntimeError(f"internal error: {seen} shard specs, not the {total} announced")

    todo = _Lookahead(to_write())
    first = todo.peek()
    if first is None:
        return results
    assert fmt is not None
    own_pool = None
    # a format whose native library may crash on a failed write is written in a child process
    # even for one worker, so that a crash there is one clear error here
    if executor is None and pool is not None:
        executor = pool
    elif executor is None and ((workers > 1 and todo.peek(1) is not None) or fmt.write_in_child):
        own_pool = executor = process_pool(min(workers, total - resumed))
    try:
        if executor is None:
            for i, spec in todo:
                function, args = job(spec)
                finished(i, len(spec.samples), function(*args))
        else:
            ours = executor is own_pool or executor is pool
            _submit_bounded(todo, job, executor, ours, in_flight or in_flight_bound(executor, workers),
                            finished, out_dir)
    finally:
        if own_pool is not None:
            own_pool.shutdown(wait=True, cancel_futures=True)
    return results


def _submit_bounded(todo: Iterator[Tuple[int, ShardSpec]], job: Callable[[ShardSpec], Job], executor: cf.Executor,
                    ours: bool, bound: int, finished: Callable[[int, int, Any], None], out_dir: str) -> None:
    """Keep at most ``bound`` specs outstanding: the next is pulled only when one has finished.
    An outstanding spec is held as its job's arguments only (its index and sample count here)."""
    outstanding: Dict[cf.Future, Tuple[int, int]] = {}

    def collect() -> None:
        done, _ = cf.wait(outstanding, return_when=cf.FIRST_COMPLETED)
        for future in done:
            result = future.result()
            i, samples = outstanding.pop(future)
            finished(i, samples, result)

    try:
        while True:
            while len(outstanding) >= bound:
                collect()
            nxt = next(todo, None)
            if nxt is None:
                break
            function, args = job(nxt[1])
            future = executor.submit(_quietly, function, *args) if ours else executor.submit(function, *args)
            outstanding[future] = (nxt[0], len(nxt[1].samples))
            del nxt, args
        while outstanding:
            collect()
    except BaseException as exc:
        for future in outstanding:
            future.cancel()
        raise_worker_cause(exc, outstanding, out_dir)
        raise


def in_flight_bound(executor: Any, workers: int) -> int:
    """Twice the tasks ``executor`` runs at once (so that none waits for the parent), where it
    says: a ``concurrent.futures`` pool's ``max_workers``, a Dask client's threads; else twice
    ``workers``."""
    slots = getattr(executor, "_max_workers", None)
    if not isinstance(slots, int):
        slots = 0
        client = getattr(executor, "_client", None)  # dask.distributed's ClientExecutor
        if client is not None:
            try:
                slots = sum(client.nthreads().values())
            except Exception:  # noqa: BLE001 - a client that cannot say: the workers decide
                slots = 0
    return 2 * max(1, workers, slots)


class _Lookahead:
    """An iterator that can look at its next items without taking them."""

    def __init__(self, items: Iterator[Tuple[int, ShardSpec]]):
        self.items = items
        self.ahead: List[Tuple[int, ShardSpec]] = []

    def peek(self, k: int = 0) -> Optional[Tuple[int, ShardSpec]]:
        while len(self.ahead) <= k:
            item = next(self.items, None)
            if item is None:
                return None
            self.ahead.append(item)
        return self.ahead[k]

    def __iter__(self) -> _Lookahead:
        return self

    def __next__(self) -> Tuple[int, ShardSpec]:
        if self.ahead:
            return self.ahead.pop(0)
        return next(self.items)


def started_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A process pool whose workers are forked now (a fork pool starts them all at its first
    task): what the parent builds afterwards (the scan, the plan) is not in their memory."""
    pool = process_pool(workers)
    pool.submit(os.getpid).result()
    return pool


def _quiet_unraisable(unraisable: Any) -> None:
    """A worker's hook for errors in finalizers: a full disk is reported once, by the parent;
    h5py's objects failing to flush as they are freed afterwards is not news (tracebacks)."""
    if not is_out_of_space(unraisable.exc_value):
        sys.__unraisablehook__(unraisable)


def _quiet_excepthook(kind: Any, value: BaseException, tb: Any) -> None:
    """Cython finalizers (h5py's) print their error through sys.excepthook first."""
    if not is_out_of_space(value):
        sys.__excepthook__(kind, value, tb)


def _quietly(function: Callable[..., Any], *args: Any) -> Any:
    """What our own pool's workers run: the job, with quiet finalizers."""
    sys.unraisablehook, sys.excepthook = _quiet_unraisable, _quiet_excepthook
    return function(*args)


def raise_worker_cause(exc: BaseException, futures: Iterable[cf.Future], out_dir: str) -> None:
    """Raise what the user needs to know when a shard failed, if it is not ``exc`` itself.

    A worker that dies (SIGKILL, the OOM killer, a crash in a native library) breaks the
    pool, and every pending shard then fails with BrokenProcessPool: the first real error of
    another shard (a full disk, typically) says more. A dead worker alone is one line saying
    so; finished shards are whole, so the same command resumes."""
    if not isinstance(exc, Exception):
        return  # KeyboardInterrupt, SystemExit: as they are
    for future in futures:
        if future.done() and not future.cancelled():
            other = future.exception()
            if other is not None and is_out_of_space(other):
                raise other from None
    if isinstance(exc, BrokenProcessPool):
        if not is_remote(out_dir) and free_bytes(out_dir) < NEARLY_FULL:
            # libhdf5 may crash the worker before it reports the full disk
            raise OSError(errno.ENOSPC, "No space left on device", out_dir) from None
        raise DsconvertError(
            f"a worker process died unexpectedly (killed, out of memory, or a crash in a native library) "
            f"while writing {out_dir}: finished shards are kept; run the same command again to resume",
            out_dir) from None
