"""Input files read for a conversion: local files one by one (with fstat: a file whose size or
mtime differs from the scan changed during the conversion), remote ones in batches of
concurrent GETs (``fs.cat`` of many paths), since each request pays a round trip."""

from __future__ import annotations

import os
from typing import Iterator, List, Optional, Tuple

from ..errors import BadInputError
from ..io.location import filesystem, is_remote
from ..keys import escape_path
from ..plan import ShardSpec
from ..samples import Fetched, Sample
from .check import Check, Contents

__all__ = ["read_file_samples"]

REMOTE_BATCH_FILES = 64  # remote sources: files fetched concurrently per request batch
REMOTE_BATCH_BYTES = 64 << 20


def _read_local_file(path: str, size: int) -> Tuple[bytes, os.stat_result]:
    """The file's first ``size`` bytes (the size the scan saw; fewer at its end) and its fstat
    after the read, by descriptor: ``open()``'s buffered file object cost more than reading a
    small file (1.2 kB thumbnails). A file grown or changed since the scan shows in the fstat."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        parts, got = [], 0
        while got < size:  # one read, unless a read stops short (past 2 GiB on Linux)
            chunk = os.read(fd, size - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return (parts[0] if len(parts) == 1 else b"".join(parts)), os.fstat(fd)
    finally:
        os.close(fd)


def _read_local(spec: ShardSpec, sample: Sample, checked: Check) -> Fetched:
    contents: Contents = {}
    for f in sample.files:
        path = f.path if os.path.isabs(f.path) else os.path.join(spec.root, f.path)
        try:
            data, st = _read_local_file(path, f.size)  # bounded by the scan: a file grown since is 'changed'
        except OSError as exc:
            return BadInputError(f"unreadable: {exc.strerror or exc}", escape_path(f.path))
        contents[f.path] = (data, st.st_size == f.size and st.st_mtime_ns == f.mtime_ns)
    return checked(spec, sample, contents)


def _remote_batches(spec: ShardSpec) -> Iterator[List[Sample]]:
    batch: List[Sample] = []
    nfiles = nbytes = 0
    for sample in spec.samples:
        batch.append(sample)
        nfiles += len(sample.files)
        nbytes += sample.nbytes
        if nfiles >= REMOTE_BATCH_FILES or nbytes >= REMOTE_BATCH_BYTES:
            yield batch
            batch, nfiles, nbytes = [], 0, 0
    if batch:
        yield batch


def read_file_samples(spec: ShardSpec, checked: Check) -> Iterator[Tuple[Sample, Fetched]]:
    """Each sample of a spec with its checked fields, or the BadInputError naming its bad file
    (see the module doc; remote files: only the size can be compared with the scan)."""
    if not is_remote(spec.root):
        for sample in spec.samples:
            yield sample, _read_local(spec, sample, checked)
        return
    fs, base = filesystem(spec.root, spec.storage_options)
    for batch in _remote_batches(spec):
        paths = {f.path: f"{base}/{f.path}" for s in batch for f in s.files}
        got = fs.cat(list(paths.values()), on_error="return")
        for sample in batch:
            contents: Contents = {}
            failed: Optional[BadInputError] = None
            for f in sample.files:
                data = got.get(paths[f.path])
                if not isinstance(data, bytes):
                    reason = "no longer there" if isinstance(data, FileNotFoundError) else f"unreadable: {data}"
                    failed = BadInputError(reason, escape_path(f.path))
                    break
                contents[f.path] = (data, True)
            yield sample, failed or checked(spec, sample, contents)
