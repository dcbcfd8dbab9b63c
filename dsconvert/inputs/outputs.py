"""The samples of a dsconvert output read for another conversion (:func:`read_output_samples`:
one open per shard, a shard rewritten since the scan makes its samples "changed during the
conversion") and in place (:class:`OutputShards`), through the output's own shard reader."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, Optional, Tuple

from ..errors import BadInputError, DsconvertError
from ..formats import get
from ..io.localfs import file_sha256
from ..io.location import mtime_ns_of
from ..io.shard_cache import ShardAccess
from ..keys import escape_path
from ..manifest import Manifest
from ..plan import CHANGED_DURING, ShardSpec
from ..samples import Fetched, Sample, SourceFile
from .check import Check, Contents

__all__ = ["read_output_samples", "OutputShards"]


def read_output_samples(spec: ShardSpec, checked: Check) -> Iterator[Tuple[Sample, Fetched]]:
    """Each sample of a spec read through the output's shard reader (one open per shard);
    a shard rewritten since the scan makes its samples "changed during the conversion"."""
    access = ShardAccess(spec.root, spec.storage_options)
    manifest = Manifest.load(access.location)
    fmt = get(manifest.format)
    entries = {e.name: e for e in manifest.shards}
    shard: Any = None
    shard_name = ""
    unchanged = True
    damaged = False
    try:
        for sample in spec.samples:
            container = sample.files[0].container
            if container != shard_name:
                if shard is not None:
                    shard.close()
                    shard = None
                shard_name = container
                entry = entries.get(container)
                damaged = False
                if entry is None:
                    unchanged = False
                else:
                    now = mtime_ns_of(access.location.fs.info(access.location.path(container)))
                    unchanged = now == sample.files[0].mtime_ns
                    try:
                        local = access.local_shard(entry)  # a local shard is checked whole before use
                        damaged = local is not None and file_sha256(local) != entry.sha256
                        shard = None if damaged else fmt.open_shard(access, entry, manifest)
                    except (DsconvertError, OSError):
                        shard, unchanged = None, False
            if damaged:
                yield sample, BadInputError(f"the output's shard {container} differs from its manifest (sha256): "
                                            f"dsconvert verify {spec.root} says what is wrong",
                                            escape_path(sample.files[0].path))
                continue
            if not unchanged or shard is None:
                yield sample, BadInputError(f"{CHANGED_DURING} (the output's shard was rewritten); run the same "
                                            "command again to include it", escape_path(sample.files[0].path))
                continue
            j = sample.files[0].offset
            try:
                got = shard.fields(j)
            except BadInputError as exc:
                yield sample, BadInputError(exc.reason, escape_path(sample.files[0].path))
                continue
            contents: Contents = {}
            files = []
            for f in sample.files:
                data = got.get(f.field)
                if data is None:
                    break
                data = bytes(data)
                contents[f.path] = (data, True)
                files.append(dataclasses.replace(f, size=len(data)))  # hdf5 records no stored sizes
            if len(files) != len(sample.files):
                yield sample, BadInputError("the output's shard no longer holds this field", escape_path(f.path))
                continue
            yield sample, checked(spec, dataclasses.replace(sample, files=tuple(files)), contents)
    finally:
        if shard is not None:
            shard.close()


class OutputShards:
    """Random access to an output's samples by (shard, index), for reading it as a source in
    place (:class:`dsconvert.readers.source.SourceDataset`); shards open on first use."""

    def __init__(self, root: str, storage_options: Optional[Dict[str, Any]] = None):
        self.access = ShardAccess(root, storage_options)
        self.manifest = Manifest.load(self.access.location)
        self.format = get(self.manifest.format)
        self.entries = {e.name: e for e in self.manifest.shards}
        self.open: Dict[str, Any] = {}

    def read(self, f: SourceFile) -> bytes:
        shard = self.open.get(f.container)
        if shard is None:
            entry = self.entries.get(f.container)
            if entry is None:
                raise BadInputError("the output no longer holds this shard", escape_path(f.path))
            shard = self.open[f.container] = self.format.open_shard(self.access, entry, self.manifest)
        data = shard.fields(f.offset).get(f.field)
        if data is None:
            raise BadInputError("the output's shard no longer holds this field", escape_path(f.path))
        return bytes(data)

    def close(self) -> None:
        for shard in self.open.values():
            shard.close()
        self.open = {}
