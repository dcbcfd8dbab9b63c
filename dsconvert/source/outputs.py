"""A dsconvert output as the source of another conversion (wds -> npy at a new ``--resize``,
hdf5 -> wds, ...), scanned from its manifest and shard records, not by walking its files; its
samples are read through the output's own shard reader (:mod:`dsconvert.inputs.outputs`).

The samples are the output's, in its order, with its keys, labels and classes (a shuffled
output's samples also carry their places in the original source's order, which the new output
keeps: its ``ds[i]`` is still the original source's sample i); each input is
``SHARD/KEY.FIELD`` (kind ``output``). Only outputs that hold the encoded images can be
converted again: decoded pixels (npy, hdf5 ``--decode``) would have to be re-encoded, which
loses quality and is never what a user wants, so such an output is refused with the source
it was made from.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ..errors import SourceError
from ..formats import get
from ..formats.base import manifest_image_field
from ..io.location import mtime_ns_of
from ..io.shard_cache import ShardAccess
from ..keys import escape_path
from ..manifest import ORDER_NAME, Manifest
from ..samples import Sample, Source, SourceFile
from ..scan_table import ScanTable
from ..shuffle import load_order

__all__ = ["output_source"]


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
    samples = ScanTable()  # on disk: one shard's record in memory at a time (its keys are unique already)
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
        packed = (record.d.get("compression") or {}).get("fields", {})  # wds --compress: json.zst holds json
        per_sample = entry.bytes // max(1, entry.num_samples)
        for j, key in enumerate(record.keys):
            if members is not None:  # wds: every member's exact size (a compressed one's decompressed)
                have = [(packed.get(f, f), col["raw_size"][j] if f in packed else col["size"][j])
                        for f, col in members.items() if col["offset"][j] >= 0 and not (classification and f == "cls")]
            else:
                size = sum(s for s, _ in stats[j]) if stats else per_sample
                have = [(image_field, size)]
            files = tuple(SourceFile(f, f"{entry.name}/{escape_path(key)}.{f}", size, mtime, entry.name, j)
                          for f, size in have)
            samples.append(Sample(key, files, record.labels[j] if classification and record.labels else None))
    positions = None
    if manifest.order is not None:  # read in stored order; each sample keeps its place in the original source
        order = load_order(access.file_bytes(ORDER_NAME, manifest.order), manifest.num_samples,
                           access.url_of(ORDER_NAME))
        inverse = np.empty(len(order), dtype=np.int64)  # 8 bytes a sample, kept as the source's positions
        step = 1 << 20
        for a in range(0, len(order), step):  # no arange of every place beside the two arrays
            inverse[order[a:a + step]] = np.arange(a, min(len(order), a + step), dtype=np.int64)
        del order
        positions = inverse
    return Source(access.location.url, "output", samples, manifest.classes, kind="output",
                  labelled=classification, positions=positions)
