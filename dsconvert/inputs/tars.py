"""Tar members read for a conversion: one open (and fstat) per tar and one ``pread`` per member
locally; remote tars by concurrent ranged requests. Where the members are is the scan's
(:mod:`dsconvert.source.tars`): each input names its tar and its data's offset."""

from __future__ import annotations

import os
from typing import Dict, Iterator, List, Tuple

from ..errors import BadInputError
from ..io.location import Location
from ..keys import escape_path
from ..plan import CHANGED_DURING, ShardSpec
from ..samples import Fetched, Sample
from .check import Check, Contents

__all__ = ["read_tar_samples"]


def read_tar_samples(spec: ShardSpec, checked: Check) -> Iterator[Tuple[Sample, Fetched]]:
    """Each sample of a spec from tar members: one open (and fstat) per tar, one ``pread`` per
    member locally; remote tars by concurrent ranged requests, 64 members at a time."""
    location = Location(spec.root, spec.storage_options, flat=False)
    if not location.remote:
        fds: Dict[str, Tuple[int, bool]] = {}
        try:
            for sample in spec.samples:
                contents: Contents = {}
                failed = None
                for f in sample.files:
                    if f.container not in fds:
                        try:
                            fd = os.open(location.path(f.container), os.O_RDONLY)
                            st = os.fstat(fd)
                            fds[f.container] = (fd, st.st_mtime_ns == f.mtime_ns)
                        except OSError as exc:
                            failed = BadInputError(f"unreadable: {exc.strerror or exc}", escape_path(f.path))
                            break
                    fd, unchanged = fds[f.container]
                    try:
                        data = os.pread(fd, f.size, f.offset)
                    except OSError as exc:
                        failed = BadInputError(f"unreadable: {exc.strerror or exc}", escape_path(f.path))
                        break
                    contents[f.path] = (data, unchanged)
                yield sample, failed or checked(spec, sample, contents)
        finally:
            for fd, _ in fds.values():
                os.close(fd)
        return
    fs = location.fs
    batch: List[Sample] = []

    def flush() -> Iterator[Tuple[Sample, Fetched]]:
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

    for sample in spec.samples:
        batch.append(sample)
        if sum(len(s.files) for s in batch) >= 64:
            yield from flush()
            batch = []
    if batch:
        yield from flush()
