"""The walk: a bounded, breadth-first listing of a local folder or an fsspec path, through
:class:`Store` (local paths, or an fsspec file system)."""

from __future__ import annotations

import os
import stat as stat_mod
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any, List, Optional, Sequence, Tuple

from ...source.folders import FolderListing, is_ignored
from . import limits

__all__ = ["Store", "Entry", "Walk", "walk_tree", "name_list"]


class Store:
    def __init__(self, fs: Any = None):
        self.fs = fs

    def join(self, base: str, name: str) -> str:
        return f"{base.rstrip('/')}/{name}" if self.fs is not None else os.path.join(base, name)

    def open(self, path: str) -> IO[bytes]:
        if self.fs is not None:
            return self.fs.open(path, "rb")
        return open(path, "rb")

    def read_range(self, path: str, start: int, n: int) -> bytes:
        with self.open(path) as f:
            f.seek(start)
            return f.read(n)

    def info(self, path: str) -> Tuple[str, int]:
        """("dir" | "file" | "other", size)."""
        if self.fs is not None:
            info = self.fs.info(path)
            kind = info.get("type")
            return ("dir" if kind == "directory" else "file" if kind == "file" else "other",
                    int(info.get("size") or 0))
        st = os.stat(path)
        if stat_mod.S_ISDIR(st.st_mode):
            return "dir", 0
        return ("file" if stat_mod.S_ISREG(st.st_mode) else "other"), st.st_size


@dataclass
class Entry:
    rel: str
    path: str
    size: int

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]

    @property
    def ext(self) -> str:
        name = self.name.lower()
        if name.endswith(".tar.gz"):
            return "tar.gz"
        stem, dot, ext = name.rpartition(".")
        return ext if dot and stem else ""


@dataclass
class Walk:
    entries: List[Entry] = field(default_factory=list)
    listings: List[FolderListing] = field(default_factory=list)
    complete: bool = True
    outside_links: List[str] = field(default_factory=list)
    unreadable: List[str] = field(default_factory=list)


def walk_tree(store: Store, root: str, limit: Optional[int] = None) -> Walk:
    """Breadth-first listing of ``root``, at most ``limit`` entries; hidden files and OS litter
    left out as the scanner leaves them out; symlinks followed only where they stay inside the
    tree, and a folder reached twice listed once."""
    limit = limits.MAX_ENTRIES if limit is None else limit
    out = Walk()
    real_root = os.path.realpath(root) if store.fs is None else root
    seen = set()
    if store.fs is None:
        st = os.stat(root)
        seen.add((st.st_dev, st.st_ino))  # a link back to the root is a loop
    queue = deque([""])
    listed = 0
    while queue:
        rel = queue.popleft()
        path = store.join(root, rel) if rel else root
        files: List[Tuple[str, int, int]] = []
        try:
            items = _list_dir(store, path, real_root, out)
        except OSError as exc:
            out.unreadable.append(f"{rel or '.'}: {exc.strerror or exc}")
            continue
        subdirs = []
        for name, kind, size, ident in sorted(items):
            listed += 1
            if listed > limit:
                out.complete = False
                break
            if is_ignored(name):
                continue
            child = f"{rel}/{name}" if rel else name
            if kind == "dir":
                if ident in seen:
                    continue
                seen.add(ident)
                subdirs.append(child)
            elif kind == "file":
                files.append((name, size, 0))
                out.entries.append(Entry(child, store.join(root, child), size))
        out.listings.append(FolderListing(rel, files))
        if not out.complete:
            break
        queue.extend(subdirs)
    out.listings.sort(key=lambda d: d.rel)
    return out


def _list_dir(store: Store, path: str, real_root: str, walk: Walk) -> List[Tuple[str, str, int, Any]]:
    items = []
    if store.fs is not None:
        for e in store.fs.ls(path, detail=True):
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            if not name:
                continue
            kind = "dir" if e.get("type") == "directory" else "file" if e.get("type") == "file" else "other"
            items.append((name, kind, int(e.get("size") or 0), e["name"]))
        return items
    with os.scandir(path) as it:
        for entry in it:
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if os.path.commonpath([target, real_root]) != real_root:
                        walk.outside_links.append(entry.name)
                        continue
                st = entry.stat(follow_symlinks=True)
            except (OSError, ValueError):
                continue  # broken link, loop, vanished: nothing to read
            if stat_mod.S_ISDIR(st.st_mode):
                items.append((entry.name, "dir", 0, (st.st_dev, st.st_ino)))
            elif stat_mod.S_ISREG(st.st_mode):
                items.append((entry.name, "file", st.st_size, None))
    return items


def name_list(entries: Sequence[Entry], k: int = 3) -> str:
    return ", ".join(e.rel for e in entries[:k]) + (", ..." if len(entries) > k else "")
