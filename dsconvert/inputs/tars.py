"""Tar members read for a conversion: one open (and fstat) per tar and one ``pread`` per member
locally; remote tars by concurrent ranged requests. A compressed tar (``.tar.gz``, ``.tar.zst``...,
known by its magic number) is read through its decompressed stream, in the scan's order, so
each is decompressed about once (:mod:`dsconvert.io.decompress`). Where the members are is the
scan's (:mod:`dsconvert.source.tars`): each input names its tar and its data's offset (in the
decompressed stream, for a compressed tar)."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..errors import BadInputError
from ..io.decompress import DecompressedBytes, compression_of
from ..io.location import Location
from ..keys import escape_path
from ..plan import CHANGED_DURING, ShardSpec
from ..samples import Fetched, Sample
from .check import Check, Contents

__all__ = ["read_tar_samples", "OpenTar"]


class OpenTar:
    """One tar, opened once: a descriptor for ``pread`` (a ranged request, remote), or the
    decompressed stream of a compressed tar; ``unchanged``: its mtime is the one the scan saw
    (local tars, where ``mtime_ns`` is given)."""

    def __init__(self, location: Location, name: str, mtime_ns: Optional[int] = None):
        self.location, self.name = location, name
        self.stream: Optional[DecompressedBytes] = None
        self.fd = -1
        self.unchanged = True
        path = location.path(name)
        if location.remote:
            head = location.read_range(name, 0, 6)
            def opener() -> Any:
                return location.fs.open(path, "rb", block_size=4 << 20, cache_type="readahead")
        else:
            self.fd = os.open(path, os.O_RDONLY)
            st = os.fstat(self.fd)
            self.unchanged = mtime_ns is None or st.st_mtime_ns == mtime_ns
            head = os.pread(self.fd, 6, 0)
            def opener() -> Any:  # a file of its own, with an offset of its own (never dup(): it shares the offset)
                return open(path, "rb")
        kind = compression_of(head)
        if kind is not None:
            self.stream = DecompressedBytes(opener, kind, name)

    def read(self, offset: int, size: int) -> bytes:
        if self.stream is not None:
            return self.stream.read_at(offset, size)
        if self.fd < 0:
            return self.location.read_range(self.name, offset, offset + size)
        return os.pread(self.fd, size, offset)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_tar_samples(spec: ShardSpec, checked: Check) -> Iterator[Tuple[Sample, Fetched]]:
    """Each sample of a spec from tar members: one open (and fstat) per tar, one ``pread`` per
    member locally; remote tars by concurrent ranged requests, 64 members at a time; compressed
    tars through their decompressed streams."""
    location = Location(spec.root, spec.storage_options, flat=False)
    tars: Dict[str, OpenTar] = {}

    def tar_of(name: str, mtime_ns: int) -> OpenTar:
        tar = tars.get(name)
        if tar is None:
            tar = tars[name] = OpenTar(location, name, mtime_ns)
        return tar

    def read_one(sample: Sample) -> Fetched:
        """A sample read member by member (local tars, compressed ones anywhere)."""
        contents: Contents = {}
        for f in sample.files:
            try:
                tar = tar_of(f.container, f.mtime_ns)
                data = tar.read(f.offset, f.size)
            except BadInputError as exc:
                return BadInputError(exc.reason, escape_path(f.path))
            except OSError as exc:
                return BadInputError(f"unreadable: {exc.strerror or exc}", escape_path(f.path))
            contents[f.path] = (data, tar.unchanged)
        return checked(spec, sample, contents)

    try:
        if not location.remote:
            for sample in spec.samples:
                yield sample, read_one(sample)
            return
        batch: List[Sample] = []
        for sample in spec.samples:
            try:
                compressed = any(tar_of(f.container, f.mtime_ns).stream is not None for f in sample.files)
            except OSError:
                compressed = False  # its ranged read below says why
            if compressed:
                yield from _ranged(location, batch, spec, checked)
                batch = []
                yield sample, read_one(sample)
                continue
            batch.append(sample)
            if sum(len(s.files) for s in batch) >= 64:
                yield from _ranged(location, batch, spec, checked)
                batch = []
        yield from _ranged(location, batch, spec, checked)
    finally:
        for tar in tars.values():
            tar.close()


def _ranged(location: Location, batch: List[Sample], spec: ShardSpec, checked: Check
            ) -> Iterator[Tuple[Sample, Fetched]]:
    """A batch of samples of plain remote tars, their members requested at once."""
    if not batch:
        return
    fs = location.fs
    files = [f for s in batch for f in s.files]
    paths = [location.path(f.container) for f in files]
    got = fs.cat_ranges(paths, [f.offset for f in files], [f.offset + f.size for f in files], on_error="return")
    by_path = dict(zip([f.path for f in files], got))
    for sample in batch:
        contents: Contents = {}
        failed = None
        for f in sample.files:
            data = by_path[f.path]
            if not isinstance(data, bytes):
                failed = BadInputError(f"unreadable: {data}", escape_path(f.path))
                break
            contents[f.path] = (data, len(data) == f.size)
        if failed is None and any(not ok for _, ok in contents.values()):
            failed = BadInputError(f"{CHANGED_DURING} (the tar is shorter than when indexed); run the same "
                                   "command again to include it", escape_path(sample.files[0].path))
        yield sample, failed or checked(spec, sample, contents)
