"""A dsconvert output as the source of another conversion (wds -> npy at a new ``--resize``,
hdf5 -> wds, ...), read through the output's own reader, not by walking its files.

The samples are the output's, in its order, with its keys, labels and classes (a shuffled
output's samples also carry their places in the original source's order, which the new output
keeps: its ``ds[i]`` is still the original source's sample i); each input is
``SHARD/KEY.FIELD`` (kind ``output``). Only outputs that hold the encoded images can be
converted again: decoded pixels (npy, hdf5 ``--decode``) would have to be re-encoded, which
loses quality and is never what a user wants, so such an output is refused with the source
it was made from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..errors import BadInputError, DsconvertError, SourceError
from ..formats import get
from ..formats.base import manifest_image_field
from ..io.localfs import file_sha256
from ..io.location import mtime_ns_of
from ..io.shard_cache import ShardAccess
from ..keys import escape_path
from ..manifest import ORDER_NAME, Manifest
from .samples import Sample, Source, SourceFile

__all__ = ["output_source", "read_output_samples", "OutputShards"]


def output_source(src: str, storage_options: Optional[Dict[str, Any]] = None) -> Source:
    """The samples of the dsconvert output at ``src`` (see the module doc)."""
    access = ShardAccess(src, storage_options)
    manifest = Manifest.load(access.location)
    if manifest.stored == "decoded":
        raise SourceError(
            f"{access.location.url} holds decoded pixels ({manifest.format}): converting them again would re-encode "
            f"decoded images; convert from the source it was made from, {manifest.source.get('url')}", src)
    fmt = get(manifest.format)
    classification = manifest.sample_type == "classification"
    image_field = manifest_image_field(manifest)
    samples: List[Sample] = []
    for entry in manifest.shards:
        for name in fmt.files_of(entry)[1:]:
            access.file_bytes(name, entry.parts.get(name))  # checked against the manifest before use
        record = fmt.load_record(access.url_of(fmt.record_name(entry)),
                                 access.file_bytes(fmt.record_name(entry), entry.parts.get(fmt.record_name(entry))))
        if record.d["num_samples"] != entry.num_samples:
            raise SourceError(f"{access.url_of(entry.name)}: its record lists {record.d['num_samples']} samples, "
                              f"the manifest {entry.num_samples}", src)
        mtime = mtime_ns_of(access.location.fs.info(access.location.path(entry.name)))
        members = record.d.get("members")
        stats = record.d.get("stats")
        per_sample = entry.bytes // max(1, entry.num_samples)
        for j, key in enumerate(record.keys):
            if members is not None:  # wds: every member's exact size
                have = [(f, col["size"][j]) for f, col in members.items() if col["offset"][j] >= 0
                        and not (classification and f == "cls")]
            else:
                size = sum(s for s, _ in stats[j]) if stats else per_sample
                have = [(image_field, size)]
            files = tuple(SourceFile(f, f"{entry.name}/{escape_path(key)}.{f}", size, mtime, entry.name, j)
                          for f, size in have)
            samples.append(Sample(key, files, record.labels[j] if classification and record.labels else None))
    positions = None
    if manifest.order is not None:  # read in stored order; each sample keeps its place in the original source
        from ..shuffle import load_order

        order = load_order(access.file_bytes(ORDER_NAME, manifest.order), manifest.num_samples,
                           access.url_of(ORDER_NAME))
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order), dtype=np.int64)
        positions = inverse.tolist()
    return Source(access.location.url, "output", samples, manifest.classes, kind="output",
                  labelled=classification, positions=positions)


def read_output_samples(spec: Any, checked: Any) -> Iterator[Tuple[Sample, Any]]:
    """Each sample of a spec read through the output's shard reader (one open per shard);
    a shard rewritten since the scan makes its samples "changed during the conversion"."""
    from ..plan import CHANGED_DURING

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
            contents: Dict[str, Tuple[bytes, bool]] = {}
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
    place (:class:`dsconvert.source.dataset.SourceDataset`); shards open on first use."""

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
