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

from .codecs import check_field
from .errors import BadInputError, ManifestError, OptionError
from .keys import escape_path
from .manifest import ShardEntry, expect, is_int, is_str_list
from .remote import Location, filesystem, is_remote, json_bytes
from .source import Sample, Skipped

__all__ = ["part_of", "ShardSpec", "ShardResult", "ShardRecord", "plan_shards", "parse_size", "read_samples", "CHANGED_DURING"]


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

    def digest(self) -> str:
        d = asdict(self)
        for volatile in ("out_dir", "strict", "storage_options"):  # where it goes, how errors end, how to
            d.pop(volatile)                                         # reach it: not content
        blob = json.dumps(d, sort_keys=True, ensure_ascii=True).encode()
        return hashlib.sha256(blob).hexdigest()


@dataclass
class ShardResult:
    entry: ShardEntry
    skipped: List[Skipped] = field(default_factory=list)
    fields: Dict[str, str] = field(default_factory=dict)
    files_written: int = 0
    resumed: bool = False


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
REMOTE_BATCH_FILES = 64  # remote sources: files fetched concurrently per request batch
REMOTE_BATCH_BYTES = 64 << 20

Fetched = Union[Dict[str, bytes], BadInputError]


def _checked(spec: ShardSpec, sample: Sample, contents: Dict[str, Tuple[bytes, bool]]) -> Fetched:
    """Fields of a sample from (bytes, still as scanned) per file; the first bad file decides."""
    fields: Dict[str, bytes] = {}
    for f in sample.files:
        data, unchanged = contents[f.path]
        if not unchanged or len(data) != f.size:
            return BadInputError(f"{CHANGED_DURING} (size or mtime differs from the scan); run the same "
                                 "command again to include it", escape_path(f.path))
        try:
            check_field(f.field, data, spec.verify, spec.max_image_pixels)
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
                data = fh.read()
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
    only the size can be compared with the scan."""
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


RECORD_SCHEMA = 1


def part_of(data: bytes) -> Dict[str, Any]:
    """A file's entry in a manifest's ``parts``: what a copy of it must be."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class ShardRecord:
    """A finished shard's record, ``NAME.index.json``, written after the shard itself.

    Common to every format: the spec digest (for resume), size and sha256, and per sample the
    key, label and source paths (columns), plus what the shard skipped. A format adds its own
    columns in ``extra`` (wds: each member's data offset and size).
    """

    COMMON = ("schema_version", "format", "shard", "spec_sha256", "bytes", "sha256", "num_samples",
              "fields", "keys", "labels", "sources", "skipped")
    # optional: "stats", per sample [[size, mtime_ns] per source file] (for `verify --source`)

    def __init__(self, d: Dict[str, Any]):
        self.d = d
        self.name: str = d["shard"]
        self.spec_sha256: str = d["spec_sha256"]
        self.bytes: int = d["bytes"]
        self.keys: List[str] = d["keys"]
        self.labels: Optional[List[int]] = d["labels"]

    @classmethod
    def build(cls, fmt: str, spec: ShardSpec, keys: List[str], labels: Optional[List[int]],
              sources: List[List[str]], stats: List[List[List[int]]], nbytes: int, sha256: str,
              skipped: List[Skipped], fields: Dict[str, str], extra: Dict[str, Any]) -> "ShardRecord":
        d: Dict[str, Any] = {
            "schema_version": RECORD_SCHEMA, "format": fmt, "shard": spec.name,
            "spec_sha256": spec.digest(), "bytes": nbytes, "sha256": sha256,
            "num_samples": len(keys), "fields": dict(sorted(fields.items())), "keys": keys,
            "labels": labels, "sources": sources, "stats": stats,
            "skipped": [{"path": s.path, "reason": s.reason} for s in skipped],
        }
        d.update(extra)
        return cls(d)

    def save(self, out: Location, name: str) -> Dict[str, Any]:
        """Write the record as ``name``; return its {bytes, sha256} for the manifest."""
        data = json_bytes(self.d)
        out.write_bytes(name, data)
        return part_of(data)

    @classmethod
    def load(cls, path: str, fmt: str, data: Optional[bytes] = None) -> "ShardRecord":
        """Parse the record at ``path`` (or ``data``, its bytes, read from anywhere)."""
        try:
            if data is None:
                with open(path, "rb") as f:
                    data = f.read()
            d = json.loads(data)
        except ValueError as exc:  # UnicodeDecodeError included
            raise ManifestError(f"{path}: not valid JSON ({exc})", path) from None
        except RecursionError:  # "[[[[..." deeper than the interpreter's stack
            raise ManifestError(f"{path}: not a shard record (JSON nested too deeply)", path) from None
        if not isinstance(d, dict) or d.get("format") != fmt or not is_int(d.get("schema_version")):
            raise ManifestError(f"{path}: not a dsconvert {fmt} shard record", path)
        if d["schema_version"] > RECORD_SCHEMA:
            raise ManifestError(f"{path}: record schema {d['schema_version']} is newer than supported", path)
        cls.check(d, path)
        return cls(d)

    @staticmethod
    def check(d: Dict[str, Any], path: str) -> None:
        """Every column of a record that a reader uses, of the right kind and length, or a
        ManifestError naming the field: a record is data from disk, and may be hostile."""
        n = d.get("num_samples")
        expect(is_int(n) and n >= 0, path, "num_samples", "an integer >= 0")
        for name, ok, what in (
            ("shard", isinstance(d.get("shard"), str), "a string"),
            ("spec_sha256", isinstance(d.get("spec_sha256"), str), "a string"),
            ("sha256", isinstance(d.get("sha256"), str), "a string"),
            ("bytes", is_int(d.get("bytes")) and d["bytes"] >= 0, "an integer >= 0"),
            ("fields", isinstance(d.get("fields"), dict), "an object"),
            ("keys", is_str_list(d.get("keys"), n), f"a list of {n} strings"),
            ("labels", d.get("labels", 0) is None or (isinstance(d.get("labels"), list) and len(d["labels"]) == n
                                                        and all(is_int(v) for v in d["labels"])),
             f"null or a list of {n} integers"),
            ("sources", isinstance(d.get("sources"), list) and len(d["sources"]) == n
             and all(is_str_list(s) for s in d["sources"]), f"a list of {n} lists of paths"),
            ("stats", "stats" not in d or (isinstance(d["stats"], list) and len(d["stats"]) == n and all(
                isinstance(s, list) and all(isinstance(p, list) and len(p) == 2 and all(is_int(v) for v in p)
                                            for p in s) for s in d["stats"])),
             f"a list of {n} lists of [size, mtime_ns]"),
            ("parts", "parts" not in d or (isinstance(d["parts"], dict) and all(
                isinstance(p, dict) and is_int(p.get("bytes")) and isinstance(p.get("sha256"), str)
                for p in d["parts"].values())), "an object of file name -> {bytes, sha256}"),
            ("skipped", isinstance(d.get("skipped"), list) and all(
                isinstance(x, dict) and isinstance(x.get("path"), str) and isinstance(x.get("reason"), str)
                for x in d["skipped"]), "a list of {path, reason} objects"),
        ):
            expect(ok, path, name, what)

    def result(self, index_name: str, index_part: Dict[str, Any]) -> ShardResult:
        """What the manifest lists for this shard; ``index_part``: the record file's own
        {bytes, sha256}, with the other files' the record lists in ``parts``."""
        d = self.d
        parts = {index_name: index_part, **d.get("parts", {})}
        entry = ShardEntry(d["shard"], d["num_samples"], d["bytes"], d["sha256"], index_name, dict(sorted(parts.items())))
        skipped = [Skipped(s["path"], s["reason"]) for s in d["skipped"]]
        files = sum(len(s) for s in d["sources"])
        return ShardResult(entry, skipped, dict(d["fields"]), files)
