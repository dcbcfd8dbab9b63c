"""A scan on disk: the samples a scanner found, appended one at a time to an unnamed temporary
file and read back one at a time, so that a source of 400M inputs costs the parent process no
Python object (nor a numpy entry) per input.

Why: a frozen :class:`Sample` with its :class:`SourceFile` takes ~0.6 kB of memory, and a
conversion parent held one per input from the scan to the manifest (880 MB at 1M inputs).
Here each sample is one marshal record in a file of records, and its end offset one uint64 in
a second file; both are unlinked at creation (they vanish with the table), read with
``os.pread`` (no map whose touched pages would stay resident). What the callers need of the
whole (count, input files, bytes, the largest input) is summed at append time, so no pass is
needed for it. :class:`Reordered` reads a table (or any sequence) in another order.
"""

from __future__ import annotations

import marshal
import os
import struct
import tempfile
from array import array
from collections.abc import Sequence
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union, overload

import numpy as np

from .samples import Sample, quick_file, quick_sample

__all__ = ["ScanTable", "Reordered", "SpilledInts", "iter_range"]

_END, _TWO_ENDS = struct.Struct("<Q"), struct.Struct("<QQ")
_FLUSH_BYTES = 1 << 18  # records buffered before a write
_READ_CHUNK = 1024  # samples decoded per read when iterating (a bounded slice: ~0.6 MB of objects)
_SORT_CHUNK = 1 << 16  # hashes handled per numpy step (bounds the temporaries: 0.5 MB)
_MASK64 = (1 << 64) - 1


class ScanTable(Sequence[Sample]):
    """An append-only table of samples on disk, read as a ``Sequence[Sample]`` (each sample
    decoded when asked for; slices are lists). A file path that begins with the sample's key
    stores only the rest; container names are stored once each (a tar shard, a Parquet file)."""

    def __init__(self, repeated_keys: bool = False) -> None:
        # each key's hash, for with_repeats_renamed (None: the scanner's keys are unique by construction)
        self._key_hashes: Optional[array] = array("Q") if repeated_keys else None  # those not yet on disk
        self._hash_file: Any = tempfile.TemporaryFile(prefix="dsconvert-scan-keys-") if repeated_keys else None
        self._hashes_flushed = 0
        self._records: Any = tempfile.TemporaryFile(prefix="dsconvert-scan-")  # or a reopened copy's (_reopen)
        self._ends: Any = tempfile.TemporaryFile(prefix="dsconvert-scan-ends-")
        self._buffer = bytearray()
        self._pending_ends = array("Q")
        self._flushed_bytes = 0  # bytes of records on disk
        self._flushed_count = 0  # ends on disk
        self._containers: List[str] = [""]
        self._container_ids: Dict[str, int] = {"": 0}
        self.length = 0  # samples appended
        self.num_files = 0  # input files in all samples
        self.nbytes = 0  # their bytes
        self.max_file_size = -1  # the largest input file's size (-1: no file)

    # -- writing --------------------------------------------------------------------------

    def append(self, sample: Sample) -> None:
        key = sample.key
        files = []
        for f in sample.files:
            cid = self._container_ids.get(f.container)
            if cid is None:
                cid = self._container_ids[f.container] = len(self._containers)
                self._containers.append(f.container)
            path = f.path
            if len(path) > len(key) and path.startswith(key):  # stored as the key's suffix
                files.append((f.field, path[len(key):], 1, f.size, f.mtime_ns, cid, f.offset))
            else:
                files.append((f.field, path, 0, f.size, f.mtime_ns, cid, f.offset))
            self.nbytes += f.size
            if f.size > self.max_file_size:
                self.max_file_size = f.size
        self.num_files += len(files)
        if self._key_hashes is not None:
            self._key_hashes.append(hash(key) & _MASK64)
            if len(self._key_hashes) >= _FLUSH_BYTES // 8:  # on disk until they are sorted: no array regrown
                self._flush_hashes()
        self._buffer += marshal.dumps((key, sample.label, tuple(files)))
        self._pending_ends.append(self._flushed_bytes + len(self._buffer))
        self.length += 1
        if len(self._buffer) >= _FLUSH_BYTES:
            self._flush()

    def extend(self, samples: Any) -> None:
        for sample in samples:
            self.append(sample)

    def _flush(self) -> None:
        if self._buffer:
            os.pwrite(self._records.fileno(), self._buffer, self._flushed_bytes)
            self._flushed_bytes += len(self._buffer)
            self._buffer = bytearray()
        if self._pending_ends:
            os.pwrite(self._ends.fileno(), self._pending_ends.tobytes(), 8 * self._flushed_count)
            self._flushed_count += len(self._pending_ends)
            self._pending_ends = array("Q")

    # -- reading --------------------------------------------------------------------------

    def with_repeats_renamed(self, rename: Callable[[str, int], str]) -> ScanTable:
        """This table with the n-th repeat (n >= 1) of each key, in table order, keyed
        ``rename(key, n)``: itself when no key repeats, else a copy (the module doc says how)."""
        if self._key_hashes is None:
            raise ValueError("a scan table made without repeated_keys=True keeps no key hashes")
        self._flush_hashes()
        hashes = np.empty(self._hashes_flushed, dtype=np.uint64)  # 8 bytes a sample while they are sorted
        if len(hashes) and self._hash_file.readinto(hashes.data.cast("B")) != 8 * len(hashes):
            raise OSError("the scan's key hashes could not be read back")
        self._key_hashes = self._hash_file = None
        repeats = self._repeats(hashes)
        del hashes
        if not len(repeats):
            return self
        out = ScanTable()
        pending = iter(repeats)
        at, rank = _unpack(next(pending))
        for i, sample in enumerate(self):
            if i == at:
                sample = Sample(rename(sample.key, rank), sample.files, sample.label)
                at, rank = _unpack(next(pending, np.uint64(_MASK64)))
            out.append(sample)
        return out

    def _flush_hashes(self) -> None:
        if self._key_hashes:
            os.pwrite(self._hash_file.fileno(), self._key_hashes.tobytes(), 8 * self._hashes_flushed)
            self._hashes_flushed += len(self._key_hashes)
            self._key_hashes = array("Q")

    def _repeats(self, hashes: np.ndarray) -> np.ndarray:
        """Every repeated key's place and number, ``place << 32 | number``, in table order.
        ``hashes`` (writable, one per sample) is reused: each becomes its hash's high bits and
        its place in the low bits, sorted in place, so equal high bits are neighbours in table
        order; each such run is then numbered on the keys themselves."""
        n = len(hashes)
        if n >= 1 << 32:
            raise ValueError(f"{n:,} samples in one scan: at most {(1 << 32) - 1:,} can be numbered")
        if n < 2:
            return np.zeros(0, dtype=np.uint64)
        bits = np.uint64((n - 1).bit_length())
        high = np.uint64(_MASK64 ^ ((1 << int(bits)) - 1))
        for a in range(0, n, _SORT_CHUNK):
            part = hashes[a:a + _SORT_CHUNK]
            part &= high
            part |= np.arange(a, a + len(part), dtype=np.uint64)
        hashes.sort()
        starts = []  # each p where entries p and p + 1 share their high bits
        for a in range(0, n - 1, _SORT_CHUNK):
            tops = hashes[a:a + _SORT_CHUNK + 1] >> bits
            starts.append(np.flatnonzero(tops[1:] == tops[:-1]) + a)
        pairs = np.concatenate(starts)
        low = np.uint64((1 << int(bits)) - 1)
        found = array("Q")
        i = 0
        while i < len(pairs):
            j = i
            while j + 1 < len(pairs) and pairs[j + 1] == pairs[j] + 1:
                j += 1
            counts: Dict[str, int] = {}  # the run's keys (one, unless their hashes collide)
            for a in range(int(pairs[i]), int(pairs[j]) + 2, _READ_CHUNK):  # ascending places: one run
                for place in (hashes[a:min(int(pairs[j]) + 2, a + _READ_CHUNK)] & low).tolist():
                    key = self[place].key
                    count = counts.get(key, 0)
                    counts[key] = count + 1
                    if count:
                        found.append(place << 32 | count)
            i = j + 1
        out = np.frombuffer(found, dtype=np.uint64).copy() if len(found) else np.zeros(0, dtype=np.uint64)
        out.sort()
        return out

    def __len__(self) -> int:
        return self.length

    def _bounds(self, start: int, stop: int) -> np.ndarray:
        """The byte offsets of records start..stop (``stop - start + 1`` values)."""
        if start == 0:
            raw = os.pread(self._ends.fileno(), 8 * stop, 0)
            return np.concatenate([np.zeros(1, dtype="<u8"), np.frombuffer(raw, dtype="<u8")])
        raw = os.pread(self._ends.fileno(), 8 * (stop - start + 1), 8 * (start - 1))
        return np.frombuffer(raw, dtype="<u8")

    def _decode(self, raw: bytes) -> Sample:
        key, label, files = marshal.loads(raw)
        containers = self._containers
        return quick_sample(key, tuple([quick_file(fld, key + path if suffix else path, size, mtime, containers[cid],
                                                   offset) for fld, path, suffix, size, mtime, cid, offset in files]),
                            label)

    def _read(self, start: int, stop: int) -> List[Sample]:
        """Samples start..stop, from one read of their records."""
        if self._buffer or self._pending_ends:
            self._flush()
        if start >= stop:
            return []
        bounds = self._bounds(start, stop).tolist()
        first = bounds[0]
        raw = os.pread(self._records.fileno(), bounds[-1] - first, first)
        return [self._decode(raw[a - first:b - first]) for a, b in zip(bounds, bounds[1:])]

    @overload
    def __getitem__(self, index: int) -> Sample: ...

    @overload
    def __getitem__(self, index: slice) -> List[Sample]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Sample, List[Sample]]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            if step == 1:
                return [s for a in range(start, stop, _READ_CHUNK) for s in self._read(a, min(stop, a + _READ_CHUNK))]
            return [self[i] for i in range(start, stop, step)]
        i = int(index)
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError("scan table index out of range")
        if self._buffer or self._pending_ends:
            self._flush()
        # one sample (a shuffled plan reads them one at a time): two reads, no numpy
        if i == 0:
            start, (end,) = 0, _END.unpack(os.pread(self._ends.fileno(), 8, 0))
        else:
            start, end = _TWO_ENDS.unpack(os.pread(self._ends.fileno(), 16, 8 * (i - 1)))
        return self._decode(os.pread(self._records.fileno(), end - start, start))

    def __iter__(self) -> Iterator[Sample]:
        for a in range(0, self.length, _READ_CHUNK):
            yield from self._read(a, min(self.length, a + _READ_CHUNK))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Sequence, ScanTable)) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<ScanTable of {self.length} samples>"

    def flush(self) -> None:
        """Every appended sample written to the files (before processes that read it fork)."""
        self._flush()

    def __reduce__(self) -> Tuple[Any, ...]:
        """Pickled (a Dataset over a source sent to spawned DataLoader workers) as a reference
        to its files, not their bytes: the unpickling process opens them again through
        ``/proc/PID/fd`` of this process (their device and inode checked), so every worker
        reads the one table on disk and holds none of it. Only a process of this machine can
        unpickle it while this one runs; the copy is read-only."""
        self._flush()
        ref = (os.getpid(), [(f.fileno(),) + _identity(f) for f in (self._records, self._ends)])
        sums = (self.length, self.num_files, self.nbytes, self.max_file_size, self._containers,
                self._flushed_bytes, self._flushed_count)
        return (_reopen, (ref, sums))


def _unpack(packed: Any) -> Tuple[int, int]:
    value = int(packed)
    return value >> 32, value & 0xFFFFFFFF


def _identity(f: Any) -> Tuple[int, int]:
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino


def _reopen(ref: Tuple[int, List[Tuple[int, int, int]]], sums: Tuple[Any, ...]) -> ScanTable:
    pid, files = ref
    opened: List[Any] = []
    for fd, dev, ino in files:
        try:
            f = open(f"/proc/{pid}/fd/{fd}", "rb", buffering=0)  # noqa: SIM115 - kept open by the table
        except OSError as exc:
            for g in opened:
                g.close()
            raise ValueError(f"a scan table is read through the files of process {pid}, which this process cannot "
                             f"open ({exc.strerror or exc}): it is gone or on another machine; scan the source again"
                             ) from None
        opened.append(f)
        if _identity(f) != (dev, ino):
            for g in opened:
                g.close()
            raise ValueError(f"a scan table's files in process {pid} are gone (another file has its number): "
                             "scan the source again")
    table = ScanTable.__new__(ScanTable)
    table._key_hashes = table._hash_file = None
    table._records, table._ends = opened
    table._buffer, table._pending_ends = bytearray(), array("Q")
    (table.length, table.num_files, table.nbytes, table.max_file_size, containers,
     table._flushed_bytes, table._flushed_count) = sums
    table._containers = list(containers)
    table._container_ids = {c: i for i, c in enumerate(containers)}
    return table


class SpilledInts:
    """An int64 array moved to an unnamed temporary file and read back by index or slice
    (``pread``): a shuffled plan's order stays out of memory while the shards are written."""

    def __init__(self, values: np.ndarray):
        self._file = tempfile.TemporaryFile(prefix="dsconvert-ints-")
        self.length = len(values)
        step = 1 << 16
        for a in range(0, self.length, step):
            os.pwrite(self._file.fileno(), np.ascontiguousarray(values[a:a + step], dtype="<i8").tobytes(), 8 * a)

    def __len__(self) -> int:
        return self.length

    def _read(self, start: int, stop: int) -> np.ndarray:
        if start >= stop:
            return np.zeros(0, dtype=np.int64)
        return np.frombuffer(os.pread(self._file.fileno(), 8 * (stop - start), 8 * start), dtype="<i8")

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            values = self._read(start, stop) if step > 0 else self._read(0, self.length)
            return values if step == 1 else values[index] if step < 0 else values[::step]
        i = int(index)
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError("index out of range")
        return int(self._read(i, i + 1)[0])


class Reordered(Sequence[Sample]):
    """``base`` read in the order ``order`` (an array of its indices): item i is
    ``base[order[i]]``; a shuffled plan reads its table through one."""

    def __init__(self, base: Sequence[Sample], order: Any):  # an array, or SpilledInts
        self.base = base
        self.order = order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.base[p] for p in self.order[index].tolist()]
        return self.base[int(self.order[index])]


def iter_range(samples: Sequence[Any], start: int, stop: int) -> Iterator[Any]:
    """``samples[start:stop]`` one at a time, read a bounded slice at a time."""
    for a in range(start, stop, _READ_CHUNK):
        yield from samples[a:min(stop, a + _READ_CHUNK)]

