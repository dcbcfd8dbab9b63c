"""A shard spec's samples packed into a few numpy columns and one string table, each
:class:`Sample` made when it is asked for.

Why: a conversion worker held its shard's samples as a tuple of frozen ``Sample`` objects, each
with a tuple of ``SourceFile`` objects (~1.5 kB a sample), and the parent pickled them for every
spec in flight. Packed, a sample costs its key's bytes and ~60 bytes of columns per input file
(a 10,000-sample spec of tar members: ~1 MB), pickles as those arrays, and reads back as the same
``Sample`` values, one at a time.

Layout: per sample, its key (UTF-8 with lone surrogates passed through, in one blob with end
offsets), its label (int64, and whether it has none) and the end of its files; per file, its
field, its path, size, mtime, container and offset. Fields, containers and the rest of each path
are ids into a table of distinct strings: a path is stored as the part that follows its
container's ``NAME/`` and/or the sample's key when it begins so (a tar member's
``part-0.tar/KEY.jpg`` is the string ``.jpg``, shared by every sample).

Only samples whose values are exactly ``str``, ``int`` (within int64) and ``None`` are packed:
:func:`pack_samples` gives anything else back as a tuple, so a sample always reads back equal
(and its JSON, hence a spec digest, is the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from json.encoder import encode_basestring_ascii
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union, overload

import numpy as np

from .samples import Sample, quick_file, quick_sample
from .scan_table import iter_range

__all__ = ["PackedSamples", "pack_samples"]

_CHUNK = 256  # samples made (or put in JSON) per step: a bounded slice of objects (~1.5 kB each)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_File = Tuple[str, str, int, int, str, int]  # field, path, size, mtime_ns, container, offset
# how a file's path is rebuilt from its stored rest: as it is, after the sample's key, after its
# container's "NAME/", after "NAME/" and the key
_PLAIN, _AFTER_KEY, _IN_CONTAINER, _IN_CONTAINER_AFTER_KEY = range(4)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class _NotPackable(Exception):
    """A value that the columns would not give back as it is (a bool label, a float size...)."""


def _int64(value: Any) -> int:
    if type(value) is not int or not _INT64[0] <= value <= _INT64[1]:
        raise _NotPackable
    return value


def _text(value: Any) -> str:
    if type(value) is not str:
        raise _NotPackable
    return value


class _Strings:
    """A table of distinct strings, built by id."""

    def __init__(self) -> None:
        self.ids: Dict[str, int] = {}

    def id(self, text: str) -> int:
        found = self.ids.get(text)
        if found is None:
            found = self.ids[text] = len(self.ids)
        return found

    def packed(self) -> Tuple[bytes, np.ndarray]:
        encoded = [_utf8(s) for s in self.ids]  # dicts keep insertion order: the ids' order
        return b"".join(encoded), np.cumsum([len(b) for b in encoded], dtype=np.int64)


class PackedSamples(Sequence[Sample]):
    """Samples as columns (see the module doc): ``len``, iteration, indexing (a ``Sample``) and
    slicing (a list of them), equal to any sequence of equal samples; made by :func:`pack_samples`."""

    keys: bytes  # every key's UTF-8, back to back
    key_ends: np.ndarray  # int64, per sample
    labels: np.ndarray  # int64, per sample (0 where it has none)
    unlabelled: np.ndarray  # bool, per sample: its label is None
    file_ends: np.ndarray  # int64, per sample: the end of its files in the file columns
    field: np.ndarray  # int32 string id, per file
    path_kind: np.ndarray  # uint8 (_PLAIN...), per file
    path_rest: np.ndarray  # int32 string id, per file
    size: np.ndarray  # int64, per file
    mtime_ns: np.ndarray  # int64, per file
    container: np.ndarray  # int32 string id, per file
    offset: np.ndarray  # int64, per file
    strings: bytes  # the distinct strings' UTF-8, back to back
    string_ends: np.ndarray  # int64

    @classmethod
    def pack(cls, samples: Iterable[Sample]) -> PackedSamples:
        """The samples packed; :class:`_NotPackable` where a value is not exactly str, int or
        None (see the module doc)."""
        strings = _Strings()
        keys = bytearray()
        key_ends: List[int] = []
        labels: List[int] = []
        unlabelled: List[bool] = []
        file_ends: List[int] = []
        field: List[int] = []
        kind: List[int] = []
        rest: List[int] = []
        size: List[int] = []
        mtime: List[int] = []
        container: List[int] = []
        offset: List[int] = []
        for sample in samples:
            key = _text(sample.key)
            keys += _utf8(key)
            key_ends.append(len(keys))
            label = sample.label
            unlabelled.append(label is None)
            labels.append(0 if label is None else _int64(label))
            for f in sample.files:
                path, where = _text(f.path), _text(f.container)
                how = _PLAIN
                if where and path.startswith(where + "/"):
                    path, how = path[len(where) + 1:], _IN_CONTAINER
                if path.startswith(key):
                    path, how = path[len(key):], how + 1
                field.append(strings.id(_text(f.field)))
                kind.append(how)
                rest.append(strings.id(path))
                size.append(_int64(f.size))
                mtime.append(_int64(f.mtime_ns))
                container.append(strings.id(where))
                offset.append(_int64(f.offset))
            file_ends.append(len(field))
        made = cls.__new__(cls)
        made.keys = bytes(keys)
        made.key_ends = np.array(key_ends, dtype=np.int64)
        made.labels = np.array(labels, dtype=np.int64)
        made.unlabelled = np.array(unlabelled, dtype=bool)
        made.file_ends = np.array(file_ends, dtype=np.int64)
        made.field = np.array(field, dtype=np.int32)
        made.path_kind = np.array(kind, dtype=np.uint8)
        made.path_rest = np.array(rest, dtype=np.int32)
        made.size = np.array(size, dtype=np.int64)
        made.mtime_ns = np.array(mtime, dtype=np.int64)
        made.container = np.array(container, dtype=np.int32)
        made.offset = np.array(offset, dtype=np.int64)
        made.strings, made.string_ends = strings.packed()
        return made

    def __len__(self) -> int:
        return len(self.key_ends)

    @property
    def nbytes(self) -> int:
        """What the columns hold, in bytes."""
        return len(self.keys) + len(self.strings) + sum(
            a.nbytes for a in (self.key_ends, self.labels, self.unlabelled, self.file_ends, self.field,
                               self.path_kind, self.path_rest, self.size, self.mtime_ns, self.container,
                               self.offset, self.string_ends))

    def _strings(self, ids: Iterable[int]) -> Dict[int, str]:
        ends = self.string_ends
        out = {}
        for i in ids:
            start = int(ends[i - 1]) if i else 0
            out[i] = self.strings[start:int(ends[i])].decode("utf-8", "surrogatepass")
        return out

    def _rows(self, start: int, stop: int) -> Iterator[Tuple[str, Optional[int], List[_File]]]:
        """(key, label, files) of samples start..stop, each file as (field, path, size,
        mtime_ns, container, offset), from one slice of each column."""
        if start >= stop:
            return
        key_ends = self.key_ends[max(0, start - 1):stop].tolist()
        k = key_ends.pop(0) if start else 0
        first_file = int(self.file_ends[start - 1]) if start else 0
        file_ends = [e - first_file for e in self.file_ends[start:stop].tolist()]
        span = slice(first_file, first_file + file_ends[-1])
        fields, kinds, rests = self.field[span].tolist(), self.path_kind[span].tolist(), self.path_rest[span].tolist()
        sizes, mtimes, offsets = self.size[span].tolist(), self.mtime_ns[span].tolist(), self.offset[span].tolist()
        containers = self.container[span].tolist()
        text = self._strings(set(fields) | set(rests) | set(containers))
        labels, unlabelled = self.labels[start:stop].tolist(), self.unlabelled[start:stop].tolist()
        keys, j = self.keys, 0
        for i, end in enumerate(file_ends):
            key = keys[k:key_ends[i]].decode("utf-8", "surrogatepass")
            k = key_ends[i]
            files = []
            while j < end:
                where, how, rest = text[containers[j]], kinds[j], text[rests[j]]
                if how == _PLAIN:
                    path = rest
                elif how == _AFTER_KEY:
                    path = key + rest
                elif how == _IN_CONTAINER:
                    path = f"{where}/{rest}"
                else:
                    path = f"{where}/{key}{rest}"
                files.append((text[fields[j]], path, sizes[j], mtimes[j], where, offsets[j]))
                j += 1
            yield key, None if unlabelled[i] else labels[i], files

    def _read(self, start: int, stop: int) -> List[Sample]:
        """Samples start..stop, made from their slices of the columns."""
        return [quick_sample(key, tuple([quick_file(*f) for f in files]), label)
                for key, label, files in self._rows(start, stop)]

    def json_parts(self, files_kind: bool) -> Iterator[str]:
        """The JSON of the samples' list as :meth:`dsconvert.plan.ShardSpec.digest` has it, a
        slice of samples at a time, without the brackets (each part is what
        ``json.dumps(dicts, sort_keys=True, ensure_ascii=True)[1:-1]`` gives for the slice's
        ``{"key", "files", "label"}`` dicts; ``files_kind``: a file's container and offset left
        out), made from the columns without a Sample or a dict."""
        quoted = encode_basestring_ascii  # json's own (C) encoder of a str, quotes included
        for a in range(0, len(self), _CHUNK):
            parts = []
            for key, label, files in self._rows(a, min(len(self), a + _CHUNK)):
                if files_kind:
                    listed = ", ".join([f'{{"field": {quoted(fld)}, "mtime_ns": {mtime}, "path": {quoted(path)}, '
                                        f'"size": {size}}}' for fld, path, size, mtime, _, _ in files])
                else:
                    listed = ", ".join([f'{{"container": {quoted(where)}, "field": {quoted(fld)}, "mtime_ns": {mtime}, '
                                        f'"offset": {offset}, "path": {quoted(path)}, "size": {size}}}'
                                        for fld, path, size, mtime, where, offset in files])
                parts.append(f'{{"files": [{listed}], "key": {quoted(key)}, '
                             f'"label": {"null" if label is None else label}}}')
            yield ", ".join(parts)

    @overload
    def __getitem__(self, index: int) -> Sample: ...

    @overload
    def __getitem__(self, index: slice) -> List[Sample]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Sample, List[Sample]]:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return [s for a in range(start, stop, _CHUNK) for s in self._read(a, min(stop, a + _CHUNK))]
            return [self[i] for i in range(start, stop, step)]
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("sample index out of range")
        return self._read(i, i + 1)[0]

    def __iter__(self) -> Iterator[Sample]:
        for a in range(0, len(self), _CHUNK):
            yield from self._read(a, min(len(self), a + _CHUNK))

    def iter_keys(self) -> Iterator[str]:
        """Each sample's key, in order (no sample made)."""
        ends, start = self.key_ends.tolist(), 0
        for end in ends:
            yield self.keys[start:end].decode("utf-8", "surrogatepass")
            start = end

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<PackedSamples of {len(self)} samples, {self.nbytes:,} bytes>"


def pack_samples(samples: Sequence[Sample], start: int = 0, stop: Optional[int] = None
                 ) -> Union[PackedSamples, Tuple[Sample, ...]]:
    """``samples[start:stop]`` packed (:class:`PackedSamples`; read a bounded slice at a time, so
    a table on disk is never held whole), or as a tuple where a value is not one that the
    columns give back exactly (see the module doc)."""
    stop = len(samples) if stop is None else stop
    try:
        return PackedSamples.pack(iter_range(samples, start, stop))
    except _NotPackable:
        return tuple(iter_range(samples, start, stop))
