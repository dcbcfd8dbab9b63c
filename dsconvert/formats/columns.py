"""The shard record on disk: fixed-width binary columns a reader memory-maps, not JSON it parses.

Why: a JSON record is parsed whole into Python objects (keys, offsets, sizes, sources: about
0.8 kB of private memory a sample), and a shuffled map-style read touches every shard, so every
DataLoader worker ended up holding the whole dataset's index (810 MB a worker at 1M samples).
A binary record is mapped: its pages are file-backed and shared by every process that reads
it, a shard opens by parsing one small header (nothing per sample), and a sample's offset is
one array lookup.

Layout of ``shard-NNNNNN.idx`` (every integer little-endian)::

    8 bytes   MAGIC (b"DSCIDX" + format version 1 as two bytes)
    8 bytes   H, the header's length
    H bytes   the header, UTF-8 JSON: {"record": the shard-level fields of the record
              (shard, spec_sha256, bytes, sha256, num_samples, fields, skipped, ...),
              "columns": {name: [dtype, base, offset, count]}}
    ...       each column's data at its offset (8-byte aligned), ``count`` values of
              ``dtype`` ("u1", "u2", "u4", "u8", or "" when every value equals ``base``)

An integer column stores ``value - base`` in the narrowest unsigned type that holds its range
(frame of reference: sizes of small images take 2 bytes, a shard's offsets 4). A string
column is two: ``NAME.ends`` (end offsets) and ``NAME.blob`` (UTF-8 bytes). Per sample, the
record keeps ``keys``, ``labels``, ``positions``, each member column of wds shards
(``members/FIELD/offset``, ``/size``, ``/raw_size``), and the source paths with their
[size, mtime_ns]: ``sources.count`` per sample, then per path an id into a table of distinct
strings (a path that holds its sample's key is stored as what stands around it, so the table
of an ImageFolder's paths holds ".JPEG" once, a tar's "part-000.tar/" and ".jpg"),
``stats.size`` and ``stats.mtime``.

Nothing in a record is trusted: the header is bounded and checked, every column must lie
inside the file with the count its name implies, and readers bound every value they use.
"""

from __future__ import annotations

import json
import mmap
import struct
from typing import Any, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import ManifestError

__all__ = ["MAGIC", "is_binary", "encode_record", "Columns", "IntColumn", "StringColumn", "PER_SAMPLE",
           "RECORD_SUFFIX"]

MAGIC = b"DSCIDX\x00\x01"
RECORD_SUFFIX = ".idx"
MAX_SOURCES = 4096  # input files of one sample (its fields): far past any dataset's
_HEADER_LIMIT = 64 << 20  # a header holds shard-level fields and skipped inputs (compacted), never per-sample data
_DTYPES = {"": 0, "u1": 1, "u2": 2, "u4": 4, "u8": 8}
# the record's per-sample entries, stored as columns (everything else is shard-level JSON)
PER_SAMPLE = ("keys", "labels", "positions", "sources", "stats", "members")


def is_binary(data: Any) -> bool:
    return bytes(data[: len(MAGIC)]) == MAGIC


def _narrow(values: np.ndarray) -> Tuple[str, int, bytes]:
    """(dtype, base, bytes) of an integer column: values - min in the narrowest unsigned type."""
    if not len(values):
        return "", 0, b""
    lo, hi = int(values.min()), int(values.max())
    span = hi - lo
    if span == 0:
        return "", lo, b""
    for name in ("u1", "u2", "u4", "u8"):
        if span < 1 << (8 * _DTYPES[name]):
            data = (values.astype(np.int64) - lo) if name != "u8" else (values - lo)
            return name, lo, np.asarray(data).astype("<" + name).tobytes()
    raise ValueError("an integer column spans more than 64 bits")


def _ints(values: Sequence[int]) -> np.ndarray:
    arr = np.asarray(values, dtype=object if any(abs(v) >= 1 << 62 for v in values) else np.int64)
    if arr.dtype == object:  # past int64 (hostile or absurd): the writer never produces them
        raise ValueError("a record column holds an integer past int64")
    return arr


def _string_table(strings: Sequence[str]) -> Tuple[np.ndarray, bytes]:
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    ends = np.cumsum([len(b) for b in encoded], dtype=np.int64) if encoded else np.zeros(0, np.int64)
    return ends, b"".join(encoded)


def encode_record(d: Dict[str, Any]) -> bytes:
    """The binary form of a record dict as :class:`dsconvert.formats.base.ShardRecord` builds it."""
    n = d["num_samples"]
    shard_level = {k: v for k, v in d.items() if k not in PER_SAMPLE}
    if "members" in d:  # a wds record, even one of no samples (no member columns)
        shard_level["_members"] = True
    columns: List[Tuple[str, str, int, bytes, int]] = []  # name, dtype, base, data, count

    def ints(name: str, values: Any) -> None:
        dtype, base, data = _narrow(_ints(values))
        columns.append((name, dtype, base, data, len(values)))

    def strings(name: str, values: Sequence[str]) -> None:
        ends, blob = _string_table(values)
        ints(name + ".ends", ends)
        columns.append((name + ".blob", "u1", 0, blob, len(blob)))

    strings("keys", d["keys"])
    if d.get("labels") is not None:
        ints("labels", d["labels"])
    if "positions" in d:
        ints("positions", d["positions"])
    for field, col in (d.get("members") or {}).items():
        for part, values in col.items():
            ints(f"members/{field}/{part}", values)
    sources = d.get("sources") or [[] for _ in range(n)]
    ints("sources.count", [len(s) for s in sources])
    table: Dict[str, int] = {}
    ids = []
    for key, paths in zip(d["keys"], sources):
        for path in paths:
            # a path holding its sample's key is stored as "\x00" + what stands before the key +
            # "\x00" + what follows it (ImageFolder: "", ".JPEG"; a tar's member: "part-000.tar/",
            # ".jpg"): a handful of distinct strings a shard. "\x01" escapes a path that starts
            # with either marker (no file system path does, an object key may)
            at = path.rfind(key) if key else -1
            before, after = (path[:at], path[at + len(key):]) if at >= 0 else ("", "")
            if at >= 0 and "\x00" not in before and "\x00" not in after:
                stored = "\x00" + before + "\x00" + after
            else:
                stored = "\x01" + path if path[:1] in ("\x00", "\x01") else path
            ids.append(table.setdefault(stored, len(table)))
    strings("sources.table", list(table))
    ints("sources.id", ids)
    if "stats" in d:
        flat = [pair for sample in d["stats"] for pair in sample]
        ints("stats.size", [p[0] for p in flat])
        ints("stats.mtime", [p[1] for p in flat])
    directory: Dict[str, List[Any]] = {}
    offset = 0
    for name, dtype, base, data, count in columns:
        directory[name] = [dtype, base, offset, count]
        offset += -(-len(data) // 8) * 8
    header = json.dumps({"record": shard_level, "columns": directory}, sort_keys=True,
                        separators=(",", ":"), ensure_ascii=True).encode()
    header += b" " * (-(len(MAGIC) + 8 + len(header)) % 8)
    parts = [MAGIC, struct.pack("<Q", len(header)), header]
    for _, _, _, data, _ in columns:
        parts.append(data + b"\0" * (-len(data) % 8))
    return b"".join(parts)


def _field(column: str) -> str:
    """A column's name as the JSON form of the record names the field (members.jpg.offset;
    keys for keys.ends, sources for sources.count, stats for stats.size)."""
    if column.startswith("members/"):
        return column.replace("/", ".")
    return column.split(".", 1)[0]


def _named(column: str) -> str:
    """'field' (column 'field.part'): the record's field, and the column where it is not the same."""
    field = _field(column)
    return repr(field) if field == column.replace("/", ".") else f"{field!r} (column {column!r})"


class IntColumn(Sequence[int]):
    """An integer column over a mapped (or read) record: ``col[j]`` is one lookup, nothing is
    materialised; ``array()`` gives every value as int64 (vectorised checks)."""

    __slots__ = ("data", "base", "n")

    def __init__(self, data: Optional[np.ndarray], base: int, n: int):
        self.data, self.base, self.n = data, base, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(self.n))]
        if self.data is None:
            if not -self.n <= j < self.n:
                raise IndexError("record column index out of range")
            return self.base
        return int(self.data[j]) + self.base

    def __iter__(self) -> Iterator[int]:
        return iter(self.array().tolist())

    def array(self) -> np.ndarray:
        if self.data is None:
            return np.full(self.n, self.base, dtype=np.int64)
        if self.data.dtype == np.dtype("<u8") and len(self.data) and int(self.data.max()) >= 1 << 63:
            raise ManifestError("a record column holds an integer past int64")
        return self.data.astype(np.int64) + self.base

    def min(self) -> int:
        return self.base if self.data is None or not self.n else int(self.data.min()) + self.base

    def max(self) -> int:
        return self.base if self.data is None or not self.n else int(self.data.max()) + self.base


class StringColumn(Sequence[str]):
    """A string column: ``col[j]`` decodes one string out of the blob."""

    __slots__ = ("ends", "blob", "n")

    def __init__(self, ends: IntColumn, blob: Any):
        self.ends, self.blob, self.n = ends, blob, len(ends)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(self.n))]
        if j < 0:
            j += self.n
        if not 0 <= j < self.n:
            raise IndexError("record column index out of range")
        start = self.ends[j - 1] if j else 0
        return bytes(self.blob[start: self.ends[j]]).decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        ends = self.ends.array().tolist()
        blob = bytes(self.blob)
        start = 0
        for end in ends:
            yield blob[start:end].decode("utf-8", "surrogateescape")
            start = end


Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]


class Columns:
    """A binary record opened over ``buf`` (bytes, or a memory map): the shard-level fields as
    ``record``, and each column on demand. Checks the header and that every column lies in the
    buffer with the length its name implies; values are bounded by whoever uses them."""

    def __init__(self, buf: Buffer, where: str):
        self.buf, self.where = buf, where
        size = len(buf)
        if size < 16 or not is_binary(buf):
            self._bad("not a dsconvert binary record")
        (h,) = struct.unpack("<Q", bytes(buf[8:16]))
        if h > min(size - 16, _HEADER_LIMIT):
            self._bad(f"its header declares {h:,} bytes")
        try:
            head = json.loads(bytes(buf[16: 16 + h]))
        except (ValueError, RecursionError):
            self._bad("its header is not JSON")
        if not isinstance(head, dict) or not isinstance(head.get("record"), dict) \
                or not isinstance(head.get("columns"), dict):
            self._bad("its header has no record and columns")
        self.record: Dict[str, Any] = head["record"]
        for name in PER_SAMPLE:  # per-sample data lives in columns only: a header cannot stand in for them
            if name in self.record:
                self._bad(f"field {name!r} is in its header, not in columns")
        self.start = 16 + h
        self._dir: Dict[str, Tuple[str, int, int, int]] = {}
        for name, spec in head["columns"].items():
            if not (isinstance(spec, list) and len(spec) == 4 and isinstance(spec[0], str) and spec[0] in _DTYPES
                    and all(type(v) is int for v in spec[1:]) and -(1 << 63) <= spec[1] < 1 << 63
                    and spec[2] >= 0 and spec[3] >= 0):
                self._bad(f"column {name!r} is not [dtype, base, offset, count]")
            dtype, base, offset, count = spec
            if self.start + offset + _DTYPES[dtype] * count > size:
                self._bad(f"column {name!r} lies past the end of the file")
            self._dir[name] = (dtype, base, offset, count)
        n = self.record.get("num_samples")
        if type(n) is not int or n < 0:
            self._bad("field 'num_samples' is not an integer >= 0")
        blob = self._dir.get("keys.blob")
        if n > 1 and (blob is None or blob[0] != "u1" or n > blob[3] + 1):  # unique keys: all but one take a byte
            self._bad(f"field 'num_samples' is {n:,}, more samples than its keys can name")
        self.n: int = n
        self._cache: Dict[str, Any] = {}

    def _bad(self, what: str) -> NoReturn:
        raise ManifestError(f"{self.where}: {what} (a damaged shard record)", self.where)

    def has(self, name: str) -> bool:
        return name in self._dir

    def names(self) -> List[str]:
        return list(self._dir)

    def ints(self, name: str, count: Optional[int] = None) -> IntColumn:
        """Column ``name``, checked to hold ``count`` values (the sample count by default)."""
        col = self._cache.get(name)
        if col is None:
            spec = self._dir.get(name)
            if spec is None:
                self._bad(f"field {_named(name)} is missing")
            dtype, base, offset, n = spec
            want = self.n if count is None else count
            if n != want:
                self._bad(f"field {_named(name)} holds {n} values, not {want}")
            data = (np.frombuffer(self.buf, dtype="<" + dtype, count=n, offset=self.start + offset)
                    if dtype else None)
            col = self._cache[name] = IntColumn(data, base, n)
        return col

    def strings(self, name: str, count: Optional[int] = None) -> StringColumn:
        col = self._cache.get(name)
        if col is None:
            ends = self.ints(name + ".ends", count)
            spec = self._dir.get(name + ".blob")
            if spec is None or spec[0] != "u1":
                self._bad(f"column {name!r} has no blob")
            _, _, offset, n = spec
            if len(ends) and (ends.min() < 0 or ends.max() > n or (len(ends) > 1 and bool(
                    (np.diff(ends.array()) < 0).any()))):
                self._bad(f"column {name!r} has string ends outside its blob")
            blob = memoryview(self.buf)[self.start + offset: self.start + offset + n]
            col = self._cache[name] = StringColumn(ends, blob)
        return col

    def fields(self) -> Dict[str, Dict[str, IntColumn]]:
        """wds member columns: field -> {"offset", "size"[, "raw_size"]}."""
        out: Dict[str, Dict[str, IntColumn]] = {}
        for name in self._dir:
            if name.startswith("members/"):
                field, _, part = name[len("members/"):].rpartition("/")
                if part not in ("offset", "size", "raw_size") or not field:
                    self._bad(f"column {name!r} is not a member column")
                out.setdefault(field, {})[part] = self.ints(name)
        for field, col in out.items():
            if "offset" not in col or "size" not in col:
                self._bad(f"member {field!r} lacks its offset or size column")
        return dict(sorted(out.items()))

    def _source_counts(self) -> np.ndarray:
        """Input files per sample, bounded: a column of one repeated value takes no bytes, so a
        tiny hostile record could otherwise declare a billion paths a sample."""
        counts = self.ints("sources.count").array()
        if len(counts) and (counts.min() < 0 or counts.max() > MAX_SOURCES):
            self._bad(f"field 'sources' holds a sample of {counts.max() if counts.min() >= 0 else counts.min()} "
                      f"input files (0 to {MAX_SOURCES})")
        return counts

    def sources(self) -> List[List[str]]:
        """Every sample's source paths (the cold path: verify, a scan of an output)."""
        counts = self._source_counts()
        total = int(counts.sum()) if len(counts) else 0
        ids = self.ints("sources.id", total).array()
        table = list(self.strings("sources.table", self._dir.get("sources.table.ends", ("", 0, 0, 0))[3]))
        if len(ids) and (ids.min() < 0 or ids.max() >= len(table)):
            self._bad("sources.id points outside its table")
        keys = self.strings("keys")
        out: List[List[str]] = []
        at = 0
        for key, c in zip(keys, counts.tolist()):
            paths = []
            for i in ids[at: at + c].tolist():
                s = table[i]
                if s.startswith("\x00"):
                    before, _, after = s[1:].partition("\x00")
                    paths.append(before + key + after)
                else:
                    paths.append(s[1:] if s.startswith("\x01") else s)
            out.append(paths)
            at += c
        return out

    def stats(self) -> Optional[List[List[List[int]]]]:
        if not self.has("stats.size"):
            return None
        counts = self._source_counts().tolist()
        total = sum(counts)
        size = self.ints("stats.size", total).array().tolist()
        mtime = self.ints("stats.mtime", total).array().tolist()
        out, at = [], 0
        for c in counts:
            out.append([[size[i], mtime[i]] for i in range(at, at + c)])
            at += c
        return out

    def to_dict(self) -> Dict[str, Any]:
        """The whole record as the JSON form's dict (one shard's worth, for the cold paths)."""
        d = dict(self.record)
        wds = bool(d.pop("_members", False))
        d["keys"] = list(self.strings("keys"))
        d["labels"] = self.ints("labels").array().tolist() if self.has("labels") else None
        if self.has("positions"):
            d["positions"] = self.ints("positions").array().tolist()
        d["sources"] = self.sources()
        stats = self.stats()
        if stats is not None:
            d["stats"] = stats
        members = self.fields()
        if members or wds:
            d["members"] = {f: {p: c.array().tolist() for p, c in col.items()} for f, col in members.items()}
        return d
