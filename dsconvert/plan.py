"""What a shard is before and after it is written: the spec a worker gets, the result it
returns, and how samples are planned into shards. Plain data and arithmetic: reading a spec's
inputs is :mod:`dsconvert.inputs`', writing its shard its format's.

A spec is plain, picklable data and fully determines the shard's bytes, so the same spec
gives the same shard on any worker of any executor. Its digest (which leaves out the output
folder) is stored with the finished shard; a resumed run reuses a shard only when the
digest matches, i.e. same samples, same source sizes and mtimes, same options.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .manifest import ShardEntry
from .samples import Sample, Skipped, SourceFile
from .scan_table import iter_range
from .units import parse_size

__all__ = ["ShardSpec", "ShardResult", "plan_shards", "spread_plan", "parse_size", "CHANGED_DURING", "MIN_SHARDS",
           "MIN_SPREAD_SAMPLES"]


_FILE_FIELDS = tuple(f.name for f in fields(SourceFile))


@dataclass(frozen=True)
class ShardSpec:
    format: str
    index: int
    name: str
    root: str
    out_dir: str
    sample_type: str
    # a tuple or list of Sample, or the same packed (dsconvert.packed_samples: what a conversion sends)
    samples: Sequence[Sample]
    verify: bool = True
    max_image_pixels: Optional[int] = None
    strict: bool = False
    options: Dict[str, Any] = field(default_factory=dict)  # format-specific (decode, resize...)
    storage_options: Dict[str, Any] = field(default_factory=dict)  # for remote root/out_dir (credentials...)
    source_kind: str = "files"  # how inputs are read: files, or from containers (tar, parquet, output)
    # each sample's place in the source's order, when the output stores a shuffled order
    # (empty: the samples are in source order); recorded per written sample. A tuple, or an
    # int64 array (what a conversion sends): the same digest
    positions: Union[Sequence[int], np.ndarray] = ()
    # the output's owner token (dsconvert.io.owner): writers note each file they move in under
    # it, so cleanup can prove what it wrote; empty: not noted. Not content: out of the digest
    owner: str = ""

    def digest(self) -> str:
        """The sha256 of the spec's JSON (sorted keys, ASCII) less what is not content, as it
        always was (a resumed run compares it with finished shards' records, those of earlier
        versions included), streamed into the hash a slice of samples at a time: no list of
        every sample's dict, nor one string of them all, is ever held."""
        d = asdict(replace(self, samples=(), positions=()))
        if len(self.positions):  # source order: left out, so earlier outputs still match
            d["positions"] = None  # streamed below
        else:
            d.pop("positions")
        for volatile in ("out_dir", "strict", "storage_options", "owner"):  # where it goes, how errors end, how to
            d.pop(volatile)                                         # reach it: not content
        files_kind = d["source_kind"] == "files"
        if files_kind:  # left out where it has its old meaning (and each file's container, offset): earlier
            d.pop("source_kind")  # outputs still match
        hashed = hashlib.sha256(b"{")
        for i, name in enumerate(sorted(d)):  # json.dumps(sort_keys=True) of the whole, piece by piece
            hashed.update((b", " if i else b"") + _json(name) + b": ")
            if name == "samples":
                pieces = _samples_json(self.samples, files_kind)
            elif name == "positions":
                pieces = _ints_json(self.positions)
            else:
                pieces = iter((_json(d[name]),))
            for piece in pieces:
                hashed.update(piece)
        hashed.update(b"}")
        return hashed.hexdigest()


_DIGEST_CHUNK = 256  # samples (or positions) put in JSON per step (a sample's dicts and JSON: ~4 kB)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=True).encode()


def _joined(parts: Iterator[str]) -> Iterator[bytes]:
    """``"[" + ", ".join(parts) + "]"``, encoded piece by piece (empty parts left out)."""
    yield b"["
    first = True
    for part in parts:
        if part:
            yield part.encode() if first else b", " + part.encode()
            first = False
    yield b"]"


def _samples_json(samples: Sequence[Sample], files_kind: bool) -> Iterator[bytes]:
    """The JSON of the samples' list as the digest has always had it (each sample's key, files
    and label; a file's container and offset left out for sources of kind ``files``), a slice at
    a time: each slice's list dumped and its brackets dropped."""
    packed = getattr(samples, "json_parts", None)  # dsconvert.packed_samples: made from its columns
    if packed is not None:
        return _joined(packed(files_kind))

    def parts() -> Iterator[str]:
        chunk = []
        for sample in samples:
            files = []
            for f in sample.files:
                fd = {name: getattr(f, name) for name in _FILE_FIELDS}
                if files_kind:
                    del fd["container"], fd["offset"]
                files.append(fd)
            chunk.append({"key": sample.key, "files": files, "label": sample.label})
            if len(chunk) == _DIGEST_CHUNK:
                yield json.dumps(chunk, sort_keys=True, ensure_ascii=True)[1:-1]
                chunk = []
        yield json.dumps(chunk, sort_keys=True, ensure_ascii=True)[1:-1]
    return _joined(parts())


def _ints_json(values: Union[Sequence[int], np.ndarray]) -> Iterator[bytes]:
    """The JSON of a list of ints (a tuple, or an int64 array), a slice at a time."""
    def parts() -> Iterator[str]:
        for a in range(0, len(values), _DIGEST_CHUNK):
            chunk = values[a:a + _DIGEST_CHUNK]
            yield json.dumps(chunk.tolist() if isinstance(chunk, np.ndarray) else list(chunk))[1:-1]
    return _joined(parts())


@dataclass
class ShardResult:
    entry: ShardEntry
    skipped: List[Skipped] = field(default_factory=list)
    fields: Dict[str, str] = field(default_factory=dict)
    files_written: int = 0
    resumed: bool = False
    # source positions of the written samples (shuffled order); a conversion moves them to disk
    # as each shard finishes (dsconvert.shuffle.StoredPositions)
    positions: Optional[List[int]] = None
    compressed: List[str] = field(default_factory=list)  # the fields stored compressed (--compress)


def plan_shards(
    samples: Sequence[Sample], max_samples: int, max_bytes: int, size_of=lambda s: s.nbytes
) -> List[Tuple[int, int]]:
    """Cut the sample sequence into [start, stop) ranges: a new shard starts when the next
    sample would pass ``max_samples`` or ``max_bytes`` (a single larger sample gets a shard of
    its own). Pure and order-preserving, so the plan never depends on the worker count."""
    return _plan_run(samples, 0, len(samples), max_samples, max_bytes, size_of)


def _plan_run(samples: Sequence[Sample], first: int, end: int, max_samples: int, max_bytes: int,
              size_of) -> List[Tuple[int, int]]:
    """:func:`plan_shards` of ``samples[first:end]``, read a bounded slice at a time (the
    samples may be a table on disk), as ranges of ``samples``."""
    if max_samples < 1 or max_bytes < 1:
        raise ValueError("shard limits must be positive")
    ranges: List[Tuple[int, int]] = []
    start, count, nbytes = first, 0, 0
    for i, sample in enumerate(iter_range(samples, first, end), first):
        size = size_of(sample)
        if count and (count + 1 > max_samples or nbytes + size > max_bytes):
            ranges.append((start, i))
            start, count, nbytes = i, 0, 0
        count += 1
        nbytes += size
    if count:
        ranges.append((start, end))
    return ranges


MIN_SHARDS = 16  # a small source is spread over up to this many shards, so that workers have work
MIN_SPREAD_SAMPLES = 64  # ... never fewer samples than this per shard


def spread_plan(samples: Sequence[Sample], max_samples: int, max_bytes: int, min_shards: int,
                size_of=lambda s: s.nbytes) -> List[Tuple[int, int]]:
    """:func:`plan_shards`, and when the limits make fewer than ``min_shards`` shards, the
    source cut into up to ``min_shards`` runs of near-equal length (at least
    ``MIN_SPREAD_SAMPLES`` each), each run then planned with the limits (a run past the byte
    limit is cut further): one shard is written by one worker, so 4,000 photos in one shard
    used one core of many. A pure function of the source and the options: the worker count
    never enters, so the bytes are the same for any."""
    ranges = plan_shards(samples, max_samples, max_bytes, size_of)
    n = len(samples)
    want = min(min_shards, n // MIN_SPREAD_SAMPLES)
    if len(ranges) >= want:
        return ranges
    spread: List[Tuple[int, int]] = []
    for i in range(want):
        a, b = (i * n) // want, ((i + 1) * n) // want
        spread += _plan_run(samples, a, b, max_samples, max_bytes, size_of)
    return spread


CHANGED_DURING = "changed during the conversion"  # a skip reason that a rerun undoes
# The byte bound beside the pixel bound: an input value larger than this is skipped before it is
# decoded, verified or (where its size is known ahead, as a file's or a Parquet row group's) read.
# A compressed container can hold far more than its bytes on disk (a 25 kB zstd Parquet held one
# 256 MiB value); the largest ImageNet JPEG is 15 MB. ``max_sample_bytes=None`` lifts it.
MAX_SAMPLE_BYTES = 64 << 20


def sample_bytes_limit(spec: ShardSpec) -> Optional[int]:
    """The spec's per-input byte bound (None: unbounded)."""
    limit = spec.options.get("max_sample_bytes", MAX_SAMPLE_BYTES)
    return int(limit) if limit else None


def over_limit(size: int, limit: int) -> str:
    """The skip reason of an input of ``size`` bytes over the bound."""
    return (f"{size} bytes, over the per-sample limit of {limit} bytes (raise it with --max-sample-bytes, "
            "or 0 for none)")
