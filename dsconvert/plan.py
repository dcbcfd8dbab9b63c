"""What a shard is before and after it is written: the spec a worker gets, the result it
returns, how samples are planned into shards, and how a spec's input files are read.

A spec is plain, picklable data and fully determines the shard's bytes, so the same spec
gives the same shard on any worker of any executor. Its digest (which leaves out the output
folder) is stored with the finished shard; a resumed run reuses a shard only when the
digest matches, i.e. same samples, same source sizes and mtimes, same options.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from fractions import Fraction
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .codecs import check_field, is_image_field
from .reencode import DEFAULT_QUALITY, shrink_image
from .errors import BadInputError, OptionError
from .keys import escape_path
from .manifest import ShardEntry
from .io.location import filesystem, is_remote
from .source import Sample, Skipped

__all__ = ["ShardSpec", "ShardResult", "plan_shards", "parse_size", "read_samples", "CHANGED_DURING"]


@dataclass(frozen=True)
class ShardSpec:
    format: str
    index: int
    name: str
    root: str
    out_dir: str
    sample_type: str
    samples: Tuple[Sample, ...]
    verify: bool = True
    max_image_pixels: Optional[int] = None
    strict: bool = False
    options: Dict[str, Any] = field(default_factory=dict)  # format-specific (decode, resize...)
    storage_options: Dict[str, Any] = field(default_factory=dict)  # for remote root/out_dir (credentials...)
    source_kind: str = "files"  # how inputs are read: files, or from containers (tar, parquet, output)
    # each sample's place in the source's order, when the output stores a shuffled order
    # (empty: the samples are in source order); recorded per written sample
    positions: Tuple[int, ...] = ()
    # the output's owner token (dsconvert.io.owner): writers note each file they move in under
    # it, so cleanup can prove what it wrote; empty: not noted. Not content: out of the digest
    owner: str = ""

    def digest(self) -> str:
        d = asdict(self)
        if not d["positions"]:  # source order: left out, so earlier outputs still match
            d.pop("positions")
        for volatile in ("out_dir", "strict", "storage_options", "owner"):  # where it goes, how errors end, how to
            d.pop(volatile)                                         # reach it: not content
        if d["source_kind"] == "files":  # left out where it has its old meaning: earlier outputs still match
            d.pop("source_kind")
            for sample in d["samples"]:
                for f in sample["files"]:
                    f.pop("container")
                    f.pop("offset")
        blob = json.dumps(d, sort_keys=True, ensure_ascii=True).encode()
        return hashlib.sha256(blob).hexdigest()


@dataclass
class ShardResult:
    entry: ShardEntry
    skipped: List[Skipped] = field(default_factory=list)
    fields: Dict[str, str] = field(default_factory=dict)
    files_written: int = 0
    resumed: bool = False
    positions: Optional[List[int]] = None  # source positions of the written samples (shuffled order)


def plan_shards(
    samples: Sequence[Sample], max_samples: int, max_bytes: int, size_of=lambda s: s.nbytes
) -> List[Tuple[int, int]]:
    """Cut the sample sequence into [start, stop) ranges: a new shard starts when the next
    sample would pass ``max_samples`` or ``max_bytes`` (a single larger sample gets a shard of
    its own). Pure and order-preserving, so the plan never depends on the worker count."""
    if max_samples < 1 or max_bytes < 1:
        raise ValueError("shard limits must be positive")
    ranges: List[Tuple[int, int]] = []
    start, count, nbytes = 0, 0, 0
    for i, sample in enumerate(samples):
        size = size_of(sample)
        if count and (count + 1 > max_samples or nbytes + size > max_bytes):
            ranges.append((start, i))
            start, count, nbytes = i, 0, 0
        count += 1
        nbytes += size
    if count:
        ranges.append((start, len(samples)))
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
        spread += [(a + x, a + y) for x, y in plan_shards(samples[a:b], max_samples, max_bytes, size_of)]
    return spread


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_size(text: str) -> int:
    """'1GB' -> 10**9, '512MiB' -> 2**29, '4096' -> 4096. An OptionError (a ValueError) for
    anything else; exact arithmetic, so no float rounding and no overflow on huge numbers."""
    m = _SIZE.match(str(text))
    if not m:
        raise OptionError(f"not a size: {text!r} (use e.g. 1GB, 512MiB, 1000000)")
    unit = (m.group(2) or "").lower().rstrip("b")
    return int(Fraction(m.group(1)) * _UNITS[unit])


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
REMOTE_BATCH_FILES = 64  # remote sources: files fetched concurrently per request batch
REMOTE_BATCH_BYTES = 64 << 20

Fetched = Union[Dict[str, bytes], BadInputError]


def _checked(spec: ShardSpec, sample: Sample, contents: Dict[str, Tuple[bytes, bool]]) -> Fetched:
    """Fields of a sample from (bytes, still as scanned) per file; the first bad file decides."""
    fields: Dict[str, bytes] = {}
    limit = sample_bytes_limit(spec)
    for f in sample.files:
        data, unchanged = contents[f.path]
        if limit is not None and len(data) > limit:  # before any decode: a byte bomb costs no more work
            return BadInputError(over_limit(len(data), limit), escape_path(f.path))
        if not unchanged or len(data) != f.size:
            return BadInputError(f"{CHANGED_DURING} (size or mtime differs from the scan); run the same "
                                 "command again to include it", escape_path(f.path))
        try:
            check_field(f.field, data, spec.verify, spec.max_image_pixels)
            if spec.options.get("max_size") and is_image_field(f.field):
                data = shrink_image(data, spec.options["max_size"], spec.options.get("quality", DEFAULT_QUALITY),
                                    spec.max_image_pixels)
        except BadInputError as exc:
            return BadInputError(exc.reason, escape_path(f.path))
        fields[f.field] = data
    return fields


def _read_local(spec: ShardSpec, sample: Sample) -> Fetched:
    contents: Dict[str, Tuple[bytes, bool]] = {}
    for f in sample.files:
        path = f.path if os.path.isabs(f.path) else os.path.join(spec.root, f.path)
        try:
            with open(path, "rb") as fh:
                data = fh.read(f.size + 1)  # bounded by the scan: a file grown since is 'changed'
                st = os.fstat(fh.fileno())
        except OSError as exc:
            return BadInputError(f"unreadable: {exc.strerror or exc}", escape_path(f.path))
        contents[f.path] = (data, st.st_size == f.size and st.st_mtime_ns == f.mtime_ns)
    return _checked(spec, sample, contents)


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


def read_samples(spec: ShardSpec) -> Iterator[Tuple[Sample, Fetched]]:
    """Each sample of the spec with its checked fields, or the BadInputError naming its bad file.

    Local sources are read file by file (with fstat: a file whose size or mtime differs from
    the scan changed during the conversion). Remote sources are fetched in batches of
    concurrent GETs (``fs.cat`` of many paths), since each request pays a round trip; there
    only the size can be compared with the scan. Inputs inside containers (tar members,
    Parquet rows, samples of an output) are read by their kind's reader."""
    if spec.source_kind != "files":
        from .source import container_reader

        yield from container_reader(spec.source_kind)(spec, _checked)
        return
    if not is_remote(spec.root):
        for sample in spec.samples:
            yield sample, _read_local(spec, sample)
        return
    fs, base = filesystem(spec.root, spec.storage_options)
    for batch in _remote_batches(spec):
        paths = {f.path: f"{base}/{f.path}" for s in batch for f in s.files}
        got = fs.cat(list(paths.values()), on_error="return")
        for sample in batch:
            contents: Dict[str, Tuple[bytes, bool]] = {}
            failed: Optional[BadInputError] = None
            for f in sample.files:
                data = got.get(paths[f.path])
                if not isinstance(data, bytes):
                    reason = "no longer there" if isinstance(data, FileNotFoundError) else f"unreadable: {data}"
                    failed = BadInputError(reason, escape_path(f.path))
                    break
                contents[f.path] = (data, True)
            yield sample, failed or _checked(spec, sample, contents)
