"""What every format's writer shares: shard naming, the shard record, resume, the loop.

A format supplies a *sink* (``open_sink``): something that takes samples one by one and
writes the format's shard file at a temporary path. This class turns that into the pure
function the executor maps: read and check each sample's inputs, skip the bad ones with
their reason, write the shard atomically, then its record (``NAME.index.json``), whose
presence marks the shard done and whose spec digest lets a resumed run reuse it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ..codecs import field_kind, pixel_limit
from ..errors import BadInputError, ManifestError
from ..keys import escape_path
from ..manifest import ShardEntry
from ..remote import Location
from ..storage import file_sha256
from ..shards import ShardRecord, ShardResult, ShardSpec, part_of, read_samples
from ..source import Sample, Skipped

__all__ = ["BaseWriter", "Sink"]


class Sink:
    """Receives a shard's samples in order. ``add`` may raise BadInputError (the sample is
    then skipped, and must leave no trace); ``close`` returns format-specific index data."""

    sha256: Optional[str] = None  # set by sinks that hash while they write

    def add(self, sample: Sample, data: Dict[str, bytes]) -> Dict[str, bytes]:
        """Write one sample; return the fields as stored (name -> bytes, for the record)."""
        raise NotImplementedError

    def close(self) -> Dict[str, Any]:
        raise NotImplementedError


class BaseWriter:
    format = ""
    suffix = ""
    overhead = 0  # bytes a shard has beyond its samples, for planning by size

    @classmethod
    def shard_name(cls, prefix: str, index: int) -> str:
        return f"{prefix}-{index:06d}{cls.suffix}"

    @classmethod
    def index_name(cls, shard_name: str) -> str:
        return shard_name[: -len(cls.suffix)] + ".index.json"

    @classmethod
    def files_of(cls, entry: ShardEntry) -> List[str]:
        return [entry.name] + ([entry.index] if entry.index else [])

    @staticmethod
    def sample_bytes(sample: Sample, classification: bool) -> int:
        return sample.nbytes

    @classmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        raise NotImplementedError

    @classmethod
    def write_shard(cls, spec: ShardSpec) -> ShardResult:
        classification = spec.sample_type == "classification"
        skipped: List[Skipped] = []
        keys: List[str] = []
        labels: List[int] = []
        sources: List[List[str]] = []
        stats: List[List[List[int]]] = []
        fields: Dict[str, str] = {}
        out = Location(spec.out_dir, spec.storage_options)
        with pixel_limit(spec.max_image_pixels), out.write(spec.name) as f:
            sink = cls.open_sink(spec, f, f.name)
            for sample, fetched in read_samples(spec):
                try:
                    if isinstance(fetched, BadInputError):
                        raise fetched
                    stored = sink.add(sample, fetched)
                except BadInputError as exc:
                    if spec.strict:
                        raise BadInputError(exc.reason, exc.path or escape_path(sample.files[0].path)) from None
                    for file in sample.files:
                        skipped.append(Skipped(escape_path(file.path), exc.reason))
                    continue
                keys.append(sample.key)
                if classification:
                    labels.append(int(sample.label))
                sources.append([escape_path(file.path) for file in sample.files])
                stats.append([[file.size, file.mtime_ns] for file in sample.files])
                for name in stored:
                    fields[name] = field_kind(name)
            extra = sink.close()
            f.flush()
            nbytes = os.fstat(f.fileno()).st_size  # a sink may write through the path (h5py)
            digest = sink.sha256 or file_sha256(f.name)
        record = ShardRecord.build(cls.format, spec, keys, labels if classification else None, sources, stats,
                                   nbytes, digest, skipped, fields, extra)
        index_part = record.save(out, cls.index_name(spec.name))
        return record.result(cls.index_name(spec.name), index_part)

    @classmethod
    def completed(cls, spec: ShardSpec) -> Optional[ShardResult]:
        """The result of an earlier run of exactly this spec, if its shard is intact."""
        index = cls.index_name(spec.name)
        out = Location(spec.out_dir, spec.storage_options)
        try:
            data = out.read_bytes(index)
            record = ShardRecord.load(out.url_of(index), cls.format, data)
            size = out.size(spec.name)
            parts_present = all(out.size(name) == part["bytes"] for name, part in record.d.get("parts", {}).items())
        except (OSError, ManifestError):
            return None
        if record.spec_sha256 != spec.digest() or size != record.bytes or not parts_present:
            return None
        result = record.result(index, part_of(data))
        result.resumed = True
        return result
