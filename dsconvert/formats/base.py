"""The format interface: everything a format knows about itself, and what formats share.

A format is one subclass of :class:`Format` in one module of this package, registered by id
in ``formats/__init__.py``. It knows

* how its shards are named and which files each shard has (``files_of``);
* how to write a shard (``write_shard(spec, samples)``: the samples it is handed, each with
  its fields as read or the error that skips it, written through ``open_sink``, a
  :class:`Sink` that takes them one by one; the loop around it, resume and the shard record
  are here, once). Reading the inputs is not a format's: the caller hands them over
  (:func:`dsconvert.convert.write_shard` composes :func:`dsconvert.inputs.read_samples` and
  this);
* how many bytes a sample takes in it (``sample_bytes``, for planning and the space check);
* how to load and check its shard record (``load_record``) and the shard's own structure
  (``structure_problems``, for ``verify``);
* how to read a shard (``open_shard``: a :class:`ShardReader` giving each sample's stored
  image or fields, and, for formats read as streams, the byte spans of its samples; the
  Datasets in :mod:`dsconvert.readers` do the rest).

:class:`Format`, :class:`Sink` and :class:`ShardReader` are abstract base classes: what a new
format must provide is marked ``@abstractmethod``.

Code outside this package asks the registry (:func:`dsconvert.formats.get`) and never
compares format ids. Nothing here imports torch: conversion never pays for it.

Every shard has a record, ``NAME.idx`` (binary columns, :mod:`dsconvert.formats.columns`;
``NAME.index.json`` in outputs of dsconvert 0.1's earlier releases, still read), written after
the shard: its presence marks the shard done, and its spec digest lets a resumed run reuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import chain
from typing import Any, ClassVar, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from PIL import UnidentifiedImageError

from .. import skips
from ..codecs import decode_resized, field_kind, pixel_limit
from ..errors import BadInputError, ManifestError
from ..io.localfs import file_sha256, open_regular
from ..io.location import Location, json_bytes
from ..io.owner import note, temp_noter
from ..keys import escape_path
from ..manifest import (
    Manifest,
    ShardEntry,
    expect,
    is_int,
    is_int_list,
    is_list_of_lists,
    is_str_list,
)
from ..plan import ShardResult, ShardSpec
from ..samples import Fetched, Fields, Sample, Skipped
from .columns import RECORD_SUFFIX, Columns, encode_record, is_binary

__all__ = ["Format", "Sink", "ShardReader", "SpansNotSupported", "ShardRecord", "Problem", "part_of", "part_problems",
           "write_owned", "pixels_for", "image_field", "manifest_image_field"]


@dataclass
class Problem:
    """One thing ``verify`` found wrong with an output."""

    kind: str  # missing-file, unsafe-file, size, checksum, record, structure, unsafe-member, decode, extra-file
    path: str  # the shard (or file) it is about, relative to the output
    message: str
    severity: str = "error"  # or "warning"


RECORD_SCHEMA = 1


def part_of(data: bytes) -> Dict[str, Any]:
    """A file's entry in a manifest's ``parts``: what a copy of it must be."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _skip_list(spec: ShardSpec, skipped: List[Skipped]) -> List[Dict[str, Any]]:
    listed = [{"path": s.path, "reason": s.reason, **({"count": s.count} if s.count != 1 else {})} for s in skipped]
    return skips.compact(listed) if spec.source_kind in skips.ROW_KINDS else listed


class ShardRecord:
    """A finished shard's record, ``NAME.idx`` (or an older output's ``NAME.index.json``),
    written after the shard itself.

    Common to every format: the spec digest (for resume), size and sha256, and per sample the
    key, label, source paths and their [size, mtime_ns] (``stats``, for ``verify --source``;
    absent in older records), plus what the shard skipped. A format adds its own columns in
    ``extra`` (wds: each member's data offset and size).
    """

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
              skipped: List[Skipped], fields: Dict[str, str], extra: Dict[str, Any]) -> ShardRecord:
        d: Dict[str, Any] = {
            "schema_version": RECORD_SCHEMA, "format": fmt, "shard": spec.name,
            "spec_sha256": spec.digest(), "bytes": nbytes, "sha256": sha256,
            "num_samples": len(keys), "fields": dict(sorted(fields.items())), "keys": keys,
            "labels": labels, "sources": sources, "stats": stats,
            "skipped": _skip_list(spec, skipped),
        }
        d.update(extra)
        return cls(d)

    def save(self, out: Location, name: str, owner: str = "") -> Dict[str, Any]:
        """Write the record as ``name`` (noted as ``owner``'s first); return its {bytes, sha256}
        for the manifest. Binary columns (:mod:`dsconvert.formats.columns`), unless ``name``
        is an older output's JSON record."""
        data = json_bytes(self.d) if name.endswith(".json") else encode_record(self.d)
        write_owned(out, owner, name, data)
        return part_of(data)

    @classmethod
    def load(cls, path: str, fmt: str, data: Optional[bytes] = None) -> ShardRecord:
        """Parse the record at ``path`` (or ``data``, its bytes, read from anywhere): binary
        columns, or an older output's JSON, into the JSON form's dict (one shard's worth: the
        readers of a shard's samples map its columns instead, :class:`Columns`)."""
        try:
            if data is None:
                with open_regular(path) as f:
                    data = f.read()
            d = Columns(data, path).to_dict() if is_binary(data) else json.loads(data)
        except ManifestError:  # a binary record's own refusal, already naming the problem
            raise
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
        ShardRecord.check_shard_level(d, path)
        n: Any = d["num_samples"]
        for name, ok, what in (
            ("keys", is_str_list(d.get("keys"), n), f"a list of {n} strings"),
            ("labels", d.get("labels", 0) is None or is_int_list(d.get("labels"), n),
             f"null or a list of {n} integers"),
            ("sources", is_list_of_lists(d.get("sources"), n)
             and set(map(type, chain.from_iterable(d["sources"]))) <= {str}, f"a list of {n} lists of paths"),
            ("positions", "positions" not in d or is_int_list(d["positions"], n, 0),
             f"a list of {n} integers >= 0"),
            ("stats", "stats" not in d or (is_list_of_lists(d["stats"], n) and _pairs_of_ints(d["stats"])),
             f"a list of {n} lists of [size, mtime_ns]"),
        ):
            expect(ok, path, name, what)

    @staticmethod
    def check_shard_level(d: Dict[str, Any], path: str) -> None:
        """The shard-level fields of a record (a binary record's header: what a reader checks
        at open, nothing per sample), of the right kind, or a ManifestError naming the field."""
        n: Any = d.get("num_samples")  # unchecked JSON until expect() passes
        expect(is_int(n) and n >= 0, path, "num_samples", "an integer >= 0")
        for name, ok, what in (
            ("shard", isinstance(d.get("shard"), str), "a string"),
            ("spec_sha256", isinstance(d.get("spec_sha256"), str), "a string"),
            ("sha256", isinstance(d.get("sha256"), str), "a string"),
            ("bytes", is_int(d.get("bytes")) and d["bytes"] >= 0, "an integer >= 0"),
            ("fields", isinstance(d.get("fields"), dict), "an object"),
            ("parts", "parts" not in d or (isinstance(d["parts"], dict) and all(
                isinstance(p, dict) and is_int(p.get("bytes")) and isinstance(p.get("sha256"), str)
                for p in d["parts"].values())), "an object of file name -> {bytes, sha256}"),
            ("skipped", isinstance(d.get("skipped"), list) and all(
                isinstance(x, dict) and isinstance(x.get("path"), str) and isinstance(x.get("reason"), str)
                and (is_int(x.get("count", 1)) and x.get("count", 1) >= 1) for x in d["skipped"]),
             "a list of {path, reason[, count >= 1]} objects"),
        ):
            expect(ok, path, name, what)

    def result(self, index_name: str, index_part: Dict[str, Any]) -> ShardResult:
        """What the manifest lists for this shard; ``index_part``: the record file's own
        {bytes, sha256}, with the other files' the record lists in ``parts``."""
        d = self.d
        parts = {index_name: index_part, **d.get("parts", {})}
        entry = ShardEntry(d["shard"], d["num_samples"], d["bytes"], d["sha256"], index_name,
                           dict(sorted(parts.items())))
        skipped = [Skipped(s["path"], s["reason"], skips.count_of(s)) for s in d["skipped"]]
        files = sum(len(s) for s in d["sources"])
        compressed = sorted(set(d.get("compression", {}).get("fields", {}).values()))
        return ShardResult(entry, skipped, dict(d["fields"]), files, positions=d.get("positions"),
                           compressed=compressed)


class _Places:
    """Each written sample's source position (``spec.positions``), found by its key: readers
    hand the samples in the spec's order (then each is the next one, and nothing is held), or,
    where one does not (a Parquet file's missing rows come last), the rest of the spec's keys are
    looked up once. A key is unique in a source, so it names one sample of a spec."""

    def __init__(self, spec: ShardSpec):
        self.spec = spec
        keys = getattr(spec.samples, "iter_keys", None)  # packed samples: no sample made
        self.keys: Iterator[str] = keys() if keys is not None else (s.key for s in spec.samples)
        self.at = 0  # the spec's samples taken in order so far
        self.rest: Optional[Dict[str, int]] = None  # key -> position of those not taken in order

    def of(self, sample: Sample) -> int:
        if self.rest is None:
            key = next(self.keys, None)
            if key == sample.key:
                self.at += 1
                return int(self.spec.positions[self.at - 1])
            self.rest = {}
            for j, other in enumerate(chain([] if key is None else [key], self.keys), self.at):
                self.rest[other] = int(self.spec.positions[j])
        return self.rest.pop(sample.key)


def _pairs_of_ints(stats: List[List[Any]]) -> bool:
    """Each sample's [[size, mtime_ns], ...]: lists of two ints, checked in C (the records of
    every shard are read by every worker, every epoch)."""
    pairs = list(chain.from_iterable(stats))
    return (set(map(type, pairs)) <= {list} and set(map(len, pairs)) <= {2}
            and is_int_list(list(chain.from_iterable(pairs))))


def write_owned(out: Location, owner: str, name: str, data: bytes) -> None:
    """Write ``name`` whole, noted first as the output ``owner``'s (none when empty)."""
    if owner:
        note(out, owner, name, len(data), hashlib.sha256(data).hexdigest())
    out.write_bytes(name, data, temp_noter(out, owner))


def part_problems(entry: ShardEntry, name: str, data: bytes) -> List[Problem]:
    """A shard's file (its index, its samples table) against the manifest's size and sha256."""
    want = entry.parts.get(name)
    if want is None or part_of(data) == {"bytes": want["bytes"], "sha256": want["sha256"]}:
        return []
    return [Problem("checksum", name, f"{len(data)} bytes with another sha256 than the manifest's "
                    f"{want['bytes']} bytes, {want['sha256'][:16]}...")]


def image_field(data: Dict[str, Any]) -> str:
    """The name of a classification sample's image field (the one that is not the label)."""
    return next(name for name in data if name != "cls")


def manifest_image_field(manifest: Manifest) -> str:
    """The image field an output's samples came with (``jpg`` for outputs that list none)."""
    return next((f for f, kind in manifest.fields.items() if kind == "image"), "jpg")


def pixels_for(spec: ShardSpec, data: bytes) -> np.ndarray:
    """An image decoded (and resized) as the spec says, for formats that store pixels; a
    BadInputError when it does not decode."""
    opts = spec.options
    try:
        size = tuple(opts["size"]) if opts.get("size") else None
        return np.ascontiguousarray(decode_resized(data, opts.get("decoder", "pil"), opts.get("resize"), size,
                                                   scaled=bool(opts.get("scaled_decode")),
                                                   resampler=opts.get("resampler", "pil")))
    except BadInputError:
        raise
    except UnidentifiedImageError:  # its message names a BytesIO by address: not the same twice
        raise BadInputError("cannot decode image: Pillow cannot identify the format") from None
    except Exception as exc:  # --no-verify let a bad image through: skip it now
        raise BadInputError(f"cannot decode image: {re.sub(' at 0x[0-9a-fA-F]+', '', str(exc))}") from None


class Sink(ABC):
    """Receives a shard's samples in order. ``add`` may raise BadInputError (the sample is
    then skipped, and must leave no trace); ``close`` returns format-specific record data."""

    sha256: Optional[str] = None  # set by sinks that hash while they write

    @abstractmethod
    def add(self, sample: Sample, data: Fields) -> Fields:
        """Write one sample; return the fields as stored (name -> bytes, for the record)."""

    @abstractmethod
    def close(self) -> Dict[str, Any]:
        """Finish the shard's file; return the format's own columns for the record."""


class SpansNotSupported(NotImplementedError):
    """A shard reader was asked for the byte spans of its samples, and its format does not keep
    samples as spans of one file (it stores pixels, or reads through a library): read it with
    ``image``, ``images`` or ``fields``. Only formats read as streams (``Format.iterable``)
    have spans; the readers ask for them only there."""

    def __init__(self, reader: ShardReader, what: str):
        super().__init__(f"{type(reader).__name__} ({reader.name}) has no byte spans of its samples: {what} is "
                         "for formats read as streams (Format.iterable)")


class ShardReader(ABC):
    """One shard opened for reading, in the process that reads it.

    ``image(j)`` is sample j's stored image: encoded bytes, or a pixel array for formats
    that store pixels. ``fields(j)`` is every field of sample j (dict samples). ``images``
    walks a run of samples in file order, the hot loop of sequential reading; ``prepare``
    says which run will be read next, so a format can map or fetch ahead.

    Formats read as streams (``Format.iterable``; ``ranged`` is True) keep each sample as byte
    spans of the shard's one file, and the stream reader reads those spans itself:
    ``image_spans``, ``sample_bytes``, ``scattered`` and the byte ``source`` that ``prepare``
    opened. Other readers answer them with :class:`SpansNotSupported`."""

    name: str = ""
    keys: Sequence[str]
    labels: Sequence[int]
    image_field = "jpg"  # the image's field name, for formats that keep only the image
    ranged: ClassVar[bool] = False  # samples are byte spans of one file (see the class doc)
    source: Any = None  # the byte source prepare() opened (ranged readers; see dsconvert.io.ranges)

    def prepare(self, first: int, stop: int, prefetch: bool, views: bool = False) -> None:  # noqa: B027 - optional hook
        """Samples [first, stop) are read next, in order (``prefetch``: read ahead concurrently;
        ``views``: they will be asked for as zero-copy views)."""

    @abstractmethod
    def image(self, j: int) -> Any:
        """Sample j's stored image: encoded bytes, or a pixel array."""

    def images(self, first: int, stop: int, views: bool = False) -> Iterator[Tuple[int, Any]]:
        """(j, image) for samples [first, stop); ``views``: zero-copy uint8 arrays where possible."""
        for j in range(first, stop):
            yield j, self.image(j)

    def fields(self, j: int, source: Any = None) -> Dict[str, Any]:
        """Every stored field of sample j by name (formats that keep only the image: it alone);
        ``source``: a byte source that ``scattered`` gave, to read them from (ranged readers)."""
        return {self.image_field: self.image(j)}

    def image_spans(self) -> Sequence[Tuple[int, int]]:
        """(offset, size) of each sample's image in the shard's file, by sample (ranged readers)."""
        raise SpansNotSupported(self, "image_spans")

    def sample_bytes(self, j: int, image_only: bool) -> int:
        """Bytes read for sample j: its image, or every field (ranged readers)."""
        raise SpansNotSupported(self, "sample_bytes")

    def scattered(self, samples: Sequence[int], image_only: bool) -> Any:
        """The bytes of ``samples`` (their image, or every field), requested now, concurrently: a
        :class:`dsconvert.io.ranges.ScatteredBytes` to ``close()`` when read (ranged readers)."""
        raise SpansNotSupported(self, "scattered")

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for readers that hold nothing
        """Release file handles and maps (open views stay valid where the format allows)."""


class Format(ABC):
    """Everything about one format; see the module doc. Subclasses set the class attributes
    and implement ``open_sink`` and ``open_shard``. A format is used as its class (every
    method is a classmethod): never instantiated."""

    id: ClassVar[str] = ""
    suffix: ClassVar[str] = ""  # of the shard file
    overhead: ClassVar[int] = 0  # bytes a shard has beyond its samples, for planning by size
    pixels: ClassVar[str] = "never"  # decoded pixels: "never", "optional" (--decode) or "always"
    any_samples: ClassVar[bool] = False  # holds dict samples too (not only (image, label))
    # stores non-image fields zstd-compressed with --compress (dsconvert.codecs.compress); formats
    # that hold (image, label) samples only have no such field
    compresses_fields: ClassVar[bool] = False
    iterable: ClassVar[bool] = False  # read as a stream of shards (True: its ShardReader has spans) or by index
    local_only: ClassVar[bool] = False  # read from local files only (memory-mapped): remote needs a cache
    # libhdf5 (2.0) segfaults when it frees a file whose write failed (a full disk): such
    # formats are written in a child process even for one worker
    write_in_child: ClassVar[bool] = False

    # --- names --------------------------------------------------------------------------

    @classmethod
    def shard_name(cls, prefix: str, index: int) -> str:
        return f"{prefix}-{index:06d}{cls.suffix}"

    @classmethod
    def index_name(cls, shard_name: str) -> str:
        return shard_name[: -len(cls.suffix)] + RECORD_SUFFIX

    @classmethod
    def record_name(cls, entry: ShardEntry) -> str:
        return entry.index or cls.index_name(entry.name)

    @classmethod
    def files_of(cls, entry: ShardEntry) -> List[str]:
        """Every file of a shard: the shard first, then its record and any others."""
        return [entry.name] + ([entry.index] if entry.index else [])

    @classmethod
    def planned_files(cls, shard_name: str) -> List[str]:
        """Every file writing the shard ``shard_name`` makes (files_of, before it exists)."""
        return cls.files_of(ShardEntry(shard_name, 0, 0, "", cls.index_name(shard_name)))

    # --- writing ------------------------------------------------------------------------

    @classmethod
    def sample_bytes(cls, sample: Sample, classification: bool, compressed: bool = False) -> int:
        """Bytes ``sample`` takes in a shard (an upper bound), encoded (``compressed``: with its
        compressible fields compressed, where the format compresses fields)."""
        return sample.nbytes

    @classmethod
    def accepts_source(cls, source: Any) -> bool:
        """Whether the format takes ``source`` beyond what ``any_samples`` says (dict samples of
        one kind it holds, such as a folder of .npy arrays for npy)."""
        return False

    @classmethod
    def holds_dicts(cls, manifest: Manifest) -> bool:
        """Whether an output of this format with ``manifest`` reads back as dict samples."""
        return cls.any_samples

    @classmethod
    def writer_options(cls, source: Any) -> Dict[str, Any]:
        """Format-specific options a shard spec carries (from the scanned source)."""
        return {}

    @classmethod
    @abstractmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        """A sink writing the shard of ``spec`` into ``file`` (an open temporary file; ``path``,
        its name, for libraries that write through a path)."""

    @classmethod
    def write_shard(cls, spec: ShardSpec, samples: Iterable[Tuple[Sample, Fetched]]) -> ShardResult:
        """Write the shard of ``spec`` from ``samples``: each of the spec's samples with its fields
        as read, or the BadInputError that skips it (with ``spec.strict``, ends the shard). The
        good ones are written atomically, then the shard's record; the result is what the
        manifest lists. ``samples`` may come in another order than the spec's (its ``positions``
        are found by key: :class:`_Places`)."""
        classification = spec.sample_type == "classification"
        skipped: List[Skipped] = []
        keys: List[str] = []
        labels: List[int] = []
        sources: List[List[str]] = []
        stats: List[List[List[int]]] = []
        positions: List[int] = []
        fields: Dict[str, str] = {}
        out = Location(spec.out_dir, spec.storage_options)
        with pixel_limit(spec.max_image_pixels), out.write(spec.name, before=temp_noter(out, spec.owner)) as f:
            sink = cls.open_sink(spec, f, f.name)
            place = _Places(spec) if len(spec.positions) else None
            for sample, fetched in samples:
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
                if place is not None:
                    positions.append(place.of(sample))
                if classification:
                    assert sample.label is not None  # a classification source labels every sample
                    labels.append(int(sample.label))
                sources.append([escape_path(file.path) for file in sample.files])
                stats.append([[file.size, file.mtime_ns] for file in sample.files])
                for name in stored:
                    fields[name] = field_kind(name)
            extra = sink.close()
            f.flush()
            nbytes = os.fstat(f.fileno()).st_size  # a sink may write through the path (h5py)
            digest = sink.sha256 or file_sha256(f.name)
            if spec.owner:  # before the move into place: a kill after it leaves a file we can prove ours
                note(out, spec.owner, spec.name, nbytes, digest)
        if place is not None:
            extra = dict(extra, positions=positions)
        record = ShardRecord.build(cls.id, spec, keys, labels if classification else None, sources, stats,
                                   nbytes, digest, skipped, fields, extra)
        index_part = record.save(out, cls.index_name(spec.name), spec.owner)
        return record.result(cls.index_name(spec.name), index_part)

    @classmethod
    def completed(cls, spec: ShardSpec) -> Optional[ShardResult]:
        """The result of an earlier run of exactly this spec, if its shard is intact."""
        index = cls.index_name(spec.name)
        out = Location(spec.out_dir, spec.storage_options)
        try:
            data = out.read_bytes(index)
            record = ShardRecord.load(out.url_of(index), cls.id, data)
            size = out.size(spec.name)
            parts_present = all(out.size(name) == part["bytes"] for name, part in record.d.get("parts", {}).items())
        except (OSError, ManifestError):
            return None
        if record.spec_sha256 != spec.digest() or size != record.bytes or not parts_present:
            return None
        result = record.result(index, part_of(data))
        result.resumed = True
        return result

    # --- records and checks -------------------------------------------------------------

    @classmethod
    def load_record(cls, path: str, data: Optional[bytes] = None) -> ShardRecord:
        """A shard record of this format from ``path`` (or ``data``, its bytes), every column
        a reader uses checked."""
        return ShardRecord.load(path, cls.id, data)

    @classmethod
    def structure_problems(cls, out: Location, entry: ShardEntry, record: ShardRecord,
                           parts: Dict[str, bytes]) -> List[Problem]:
        """What ``verify`` finds wrong in the shard's own structure, beyond its checksum.
        ``parts``: the shard's other files that verify already read (name -> bytes)."""
        return []

    # --- reading ------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def open_shard(cls, access: Any, entry: ShardEntry, manifest: Manifest, **options: Any) -> ShardReader:
        """The shard ready to read (``access``: a :class:`dsconvert.io.shard_cache.ShardAccess`)."""
