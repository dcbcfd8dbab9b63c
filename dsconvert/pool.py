"""Worker processes that die with the process that started them.

A ``ProcessPoolExecutor``'s workers outlive a SIGKILLed parent: they sit on their call
queue, holding whatever they inherited (an output's lock, say), so every resume is refused
until someone finds and kills them by hand. Each worker here asks the kernel to SIGKILL it
when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux), and checks that the parent is
still the one that started it (the parent may already have died before the request).
Elsewhere a daemon thread polls the parent instead.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import ctypes.util
import os
import signal
import threading
import time

__all__ = ["process_pool", "die_with_parent"]

PR_SET_PDEATHSIG = 1


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(1.0)


def die_with_parent(parent: int) -> None:
    """Pool initializer: end this process when ``parent`` dies."""
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
