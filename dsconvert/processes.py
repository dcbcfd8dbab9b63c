"""Processes: how many CPUs this one may use, worker pools that die with it, and state
that belongs to one process and is dropped in a forked child.

A ``ProcessPoolExecutor``'s workers outlive a SIGKILLed parent: they sit on their call
queue, holding whatever they inherited (an output's lock, say), so every resume is refused
until someone finds and kills them by hand. Each worker here asks the kernel to SIGKILL it
when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux), and checks that the parent is
still the one that started it (the parent may already have died before the request).
Elsewhere a daemon thread polls the parent instead.

File handles, memory maps, thread pools and fsspec clients must not be shared with a forked
child (a DataLoader worker): :class:`ProcessLocal` is a dict that a fork empties in the
child, through one ``os.register_at_fork`` hook, and that pickles (into spawned workers)
empty.

A forked DataLoader worker inherits every object its parent made (torch alone is ~180,000
that the garbage collector tracks). Its first full collection walks them all and writes to
each one's header, copying every page of the parent's heap: 180 ms per worker per epoch, a
quarter of a 4,000-sample epoch of a decoded cache (measured). :func:`settle_worker` moves
them out of the collector's reach (``gc.freeze()``, what CPython's documentation advises
for a fork that does not exec) once per worker; the readers and the source's dataset call it.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import ctypes.util
import gc
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Tuple

__all__ = ["available_cpus", "process_pool", "die_with_parent", "ProcessLocal", "settle_worker"]

PR_SET_PDEATHSIG = 1


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(1.0)


IN_POOL = False  # True in the workers of process_pool: one core each, so no intra-op threads


def die_with_parent(parent: int) -> None:
    """Pool initializer: end this process when ``parent`` dies."""
    global IN_POOL
    IN_POOL = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="dsconvert-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def process_pool(max_workers: int) -> cf.ProcessPoolExecutor:
    """A process pool whose workers die with this process (see the module doc)."""
    return cf.ProcessPoolExecutor(max_workers=max_workers, initializer=die_with_parent, initargs=(os.getpid(),))


def available_cpus() -> int:
    """CPUs this process may run on (a container's limit, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ProcessLocal(dict):
    """A dict of per-process state: empty again in a forked child, and pickled empty."""

    # identity: for the registry below (dict's stub types __hash__ as None, what this undoes)
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        _process_locals.add(self)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (ProcessLocal, ())


_process_locals: weakref.WeakSet[ProcessLocal] = weakref.WeakSet()


def _forked_child() -> None:
    for local in list(_process_locals):
        dict.clear(local)


os.register_at_fork(after_in_child=_forked_child)


_settled = ProcessLocal()


def settle_worker() -> None:
    """In a DataLoader worker, once: ``gc.freeze()`` the objects it started with (see the
    module doc). They stay alive as long as the worker, as they would have anyway: the
    parent holds them. New objects are collected as before."""
    if _settled:
        return
    _settled["done"] = True
    if "torch" in sys.modules:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            gc.freeze()
