"""What a training job is made of, read from /proc: its process tree, command lines, and
the data files its processes hold open (which tells where the dataset lives).

Everything here is best effort: a process can end between two reads, and /proc of another
user's process may not be readable; such processes are simply left out.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Dict, List, Optional, Sequence

from ..manifest import MANIFEST_NAME

__all__ = ["descendants", "cmdline", "open_files", "FileWatcher", "guess_dataset_root", "is_alive"]

# files a Python process holds that are never the dataset
_NOT_DATA_PREFIXES = ("/dev/", "/proc/", "/sys/", "/usr/lib", "/lib", "/etc/", "/run/")
_NOT_DATA_SUFFIXES = (".so", ".py", ".pyc", ".pth", ".log", ".lock", ".whl", ".egg")


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _parents() -> Dict[int, int]:
    """pid -> parent pid, for every process /proc shows."""
    out: Dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            out[int(name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(pid: int) -> List[int]:
    """Every process below ``pid`` (DataLoader workers, their helpers), sorted."""
    children: Dict[int, List[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    out: List[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def open_files(pid: int) -> List[str]:
    """Regular files ``pid`` has open that could be data (not libraries, devices, sources)."""
    out: List[str] = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (not target.startswith("/") or target.startswith(_NOT_DATA_PREFIXES) or target.endswith(_NOT_DATA_SUFFIXES)
                or "site-packages" in target or "/pymp-" in target or target.endswith(" (deleted)")):
            continue
        out.append(target)
    return out


class FileWatcher:
    """Polls the open files of ``pid`` and its descendants in a background thread while the
    profiler records, counting how often each file was seen open."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid = pid
        self.interval = interval
        self.seen: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dsconvert-filewatch", daemon=True)

    def _run(self) -> None:
        pids = [self.pid] + descendants(self.pid)
        refreshed = time.monotonic()
        while not self._stop.is_set():
            for pid in pids:
                self.seen.update(open_files(pid))
            if time.monotonic() - refreshed > 1.0:  # workers come and go between epochs
                pids = [self.pid] + descendants(self.pid)
                refreshed = time.monotonic()
            self._stop.wait(self.interval)

    def __enter__(self) -> FileWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def guess_dataset_root(paths: Sequence[str]) -> Optional[str]:
    """The folder the data files come from: their common folder, or, when they all sit in one
    class folder of an ImageFolder tree, the tree's root (the folder ``dsconvert shard`` takes)."""
    paths = [p for p in paths if os.path.isabs(p)]
    if not paths:
        return None
    folders = sorted({os.path.dirname(p) for p in paths})
    root = os.path.commonpath(folders)
    if len(folders) == 1:
        parent = os.path.dirname(root)
        ext = os.path.splitext(paths[0])[1].lower()
        try:
            siblings = [e for e in os.scandir(parent) if e.is_dir() and not e.name.startswith(".")]
        except OSError:
            return root
        if len(siblings) >= 2 and ext:
            def holds(folder: str) -> bool:
                """A class folder's like: files of that extension, and not a dsconvert output (an
                npy cache beside a folder of .npy arrays holds .npy files too)."""
                try:
                    names = os.listdir(folder)
                except OSError:
                    return False
                return MANIFEST_NAME not in names and any(n.lower().endswith(ext) for n in names[:64])

            looked = siblings[:8]
            alike = sum(holds(e.path) for e in looked)
            if alike >= 2 and 2 * alike >= len(looked):  # most folders beside it are alike: a class tree
                return parent
    return root
