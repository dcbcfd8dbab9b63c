"""WebDataset tar shards: the writer, the shard index, and the Dataset that reads them.

Byte layout of one output folder::

    shard-000000.tar          a POSIX (PAX) tar in webdataset's layout: for each sample,
                              members ``<key>.<field>`` in sorted field order, data
                              copied from the source files unchanged; ImageFolder/list
                              samples also get ``<key>.cls`` (the label as decimal text).
                              mtime 0, uid/gid 0, mode 0444, no user/group names: the same input gives the same
                              bytes on any machine, with any number of workers.
    shard-000000.index.json   the shard's index (written after the tar is complete, so its
                              presence marks a finished shard): keys, labels, source paths,
                              and for each field the data offset and size of every member.
    dsconvert.json            the manifest (dsconvert.manifest), written last.

Keys are encoded (dsconvert.keys) so that ``webdataset.WebDataset``, which splits member
names at the first dot of the basename, sees exactly our samples and fields; GNU ``tar``
lists and extracts the shards as usual.

The tar is written with the standard library's ``tarfile`` (what webdataset's ``TarWriter``
wraps) rather than through webdataset itself, whose import pulls in torch: that cost 1-2 s
and ~300 MB per conversion worker for nothing. The webdataset reader is the test oracle.

Reading does not stream the tar through Python's tarfile: the index gives each member's
offset, so a shard is memory-mapped and samples are sliced out of it. That makes splitting a
shard between ranks at any sample boundary free, and raw reads cost a slice, not a parse.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import operator
import os
import random
import tarfile
from bisect import bisect_right
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .._torch import lazy_module_attr
from ..codecs import (DECODE_MODES, ENCODED_MODES, decode_errors_naming, decode_field, decode_image,
                      encode_class)
from ..distributed import distributed_initialized, rank_span, split_range, worker_info, world_info
from ..errors import ManifestError
from ..cache import ShardAccess
from ..manifest import Manifest, ShardEntry, expect, is_int
from ..remote import Location
from ..shards import ShardRecord, ShardSpec
from ..source import Sample
from ..storage import is_latency_bound
from ._base import BaseWriter, Sink

__all__ = ["WdsWriter", "WdsDataset", "load_record"]  # noqa: F822 (WdsDataset: see __getattr__)

TAR_MTIME = 0


class _HashingFile(io.RawIOBase):
    """A write-only file that feeds a sha256 as bytes pass through to the real file."""

    def __init__(self, f):
        self.f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, b) -> int:
        self.sha256.update(b)
        self.f.write(b)
        self.size += len(b)
        return len(b)


def _add_member(tf: tarfile.TarFile, name: str, data: bytes) -> Tuple[int, int]:
    """Append one member; return (data offset, size) in the archive."""
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = TAR_MTIME
    ti.mode = 0o444
    tf.addfile(ti, io.BytesIO(data))
    end = tf.offset  # after the header(s) and the data padded to a 512-byte block
    return end - -(-len(data) // 512) * 512, len(data)


TAR_TRAILER = 1024 + 10240  # end-of-archive blocks plus padding to a full record, at most


def _tar_member_bytes(name: str, size: int) -> int:
    """An upper bound on a member's bytes: header(s) plus data padded to 512-byte blocks."""
    raw = name.encode("utf-8")
    header = 512
    if len(raw) > 100 or not name.isascii():  # tarfile then writes a PAX header record first
        header += 512 + -(-(len(raw) + 32) // 512) * 512
    return header + -(-size // 512) * 512


def sample_tar_bytes(sample: Sample, with_cls: bool) -> int:
    """Bytes a sample takes in a tar shard (an upper bound)."""
    total = sum(_tar_member_bytes(f"{sample.key}.{f.field}", f.size) for f in sample.files)
    return total + (_tar_member_bytes(f"{sample.key}.cls", 8) if with_cls else 0)


class _TarSink(Sink):
    """Appends samples as tar members, hashing the bytes as they pass."""

    def __init__(self, spec: ShardSpec, file: Any):
        self.hashing = _HashingFile(file)
        self.tf = tarfile.TarFile(fileobj=self.hashing, mode="w", format=tarfile.PAX_FORMAT)
        self.classification = spec.sample_type == "classification"
        self.members: List[Tuple[str, int, int, int]] = []  # (field, offset, size, sample) per member
        self.count = 0

    def add(self, sample: Sample, data: Dict[str, bytes]) -> Dict[str, bytes]:
        if self.classification:
            data["cls"] = encode_class(sample.label)
        for name in sorted(data):
            offset, size = _add_member(self.tf, f"{sample.key}.{name}", data[name])
            self.members.append((name, offset, size, self.count))
        self.count += 1
        return data

    def close(self) -> Dict[str, Any]:
        self.tf.close()
        self.sha256 = self.hashing.sha256.hexdigest()
        columns: Dict[str, Dict[str, List[int]]] = {}
        for name, offset, size, i in self.members:
            col = columns.setdefault(name, {"offset": [-1] * self.count, "size": [-1] * self.count})
            col["offset"][i] = offset
            col["size"][i] = size
        return {"members": dict(sorted(columns.items()))}


class WdsWriter(BaseWriter):
    """Writes one tar shard per spec; stateless, so it runs on any executor's worker."""

    format = "wds"
    suffix = ".tar"
    overhead = TAR_TRAILER

    @staticmethod
    def sample_bytes(sample: Sample, classification: bool) -> int:
        return sample_tar_bytes(sample, classification)

    @classmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        return _TarSink(spec, file)


def load_record(path: str, data: Optional[bytes] = None) -> ShardRecord:
    """A wds shard record (from ``path``, or ``data`` read from it), checked to have, per
    field, integer offset and size columns as long as the keys (-1: a field a sample lacks)."""
    record = ShardRecord.load(path, "wds", data)
    members = record.d.get("members")
    n = len(record.keys)
    expect(isinstance(members, dict) and all(isinstance(k, str) for k in members), path, "members",
           "an object of per-field columns")
    for name, col in members.items():
        for part in ("offset", "size"):
            values = col.get(part) if isinstance(col, dict) else None
            expect(isinstance(values, list) and len(values) == n and all(is_int(v) and v >= -1 for v in values),
                   path, f"members.{name}.{part}", f"a list of {n} integers >= -1")
    return record


class _MappedBytes:
    """Local files: slices of a memory map (the page cache serves them without a syscall)."""

    def __init__(self, path: str, size: int):
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def get(self, offset: int, size: int) -> bytes:
        return self.mm[offset: offset + size] if self.mm is not None else b""

    def close(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # decode="buffer" views still use it; it closes when they are gone


_pools: Dict[int, ThreadPoolExecutor] = {}


def _io_pool(threads: int) -> ThreadPoolExecutor:
    pid = os.getpid()  # a forked DataLoader worker makes its own threads
    if pid not in _pools:
        _pools.clear()
        _pools[pid] = ThreadPoolExecutor(threads, thread_name_prefix="dsconvert-read")
    return _pools[pid]


class _PrefetchedBytes:
    """Latency-bound storage (NFS, CephFS, FUSE, object stores): a forward window over the
    bytes this worker needs, filled by concurrent ranged reads, with the next window fetched in
    the background.

    Page faults or one large read() would pay the storage's round trip once per 128 kB
    request, one request at a time; 8 concurrent 1 MB requests hide most of it. ``fill(view,
    offset)`` reads into ``view`` from ``offset`` and returns the bytes read: ``os.preadv`` on
    a local descriptor, or a ranged GET of the object.
    """

    def __init__(self, fill: Callable[[memoryview, int], int], end: int, close: Callable[[], None] = lambda: None,
                 window: int = 16 << 20, threads: int = 8, piece: int = 1 << 20):
        self.fill = fill
        self._close = close
        self.piece = piece  # bytes per request
        self.end = end
        self.window = window
        self.pool = _io_pool(threads)
        self.base = 0
        self.buf = bytearray()
        self.ahead: Optional[Tuple[int, bytearray, List[Future]]] = None

    def _start(self, offset: int, length: int) -> Tuple[int, bytearray, List[Future]]:
        buf = bytearray(length)
        view = memoryview(buf)
        futures = [self.pool.submit(self.fill, view[a: a + self.piece], offset + a)
                   for a in range(0, length, self.piece)]
        return offset, buf, futures

    @staticmethod
    def _finish(job: Tuple[int, bytearray, List[Future]]) -> Tuple[int, bytearray]:
        offset, buf, futures = job
        got = sum(f.result() for f in futures)
        return offset, buf[:got] if got < len(buf) else buf

    def get(self, offset: int, size: int) -> bytes:
        lo = offset - self.base
        if 0 <= lo and offset + size <= self.base + len(self.buf):
            return bytes(self.buf[lo: lo + size])
        if size > self.window:
            _, buf = self._finish(self._start(offset, size))
            return bytes(buf)
        job = self.ahead
        self.ahead = None
        if job is None or not (job[0] <= offset and offset + size <= job[0] + len(job[1])):
            if job is not None:
                self._finish(job)
            job = self._start(offset, max(size, min(self.window, self.end - offset)))
        self.base, self.buf = self._finish(job)
        nxt = self.base + len(self.buf)
        if nxt < self.end:
            self.ahead = self._start(nxt, min(self.window, self.end - nxt))
        lo = offset - self.base
        return bytes(self.buf[lo: lo + size])

    def close(self) -> None:
        if self.ahead is not None:
            self._finish(self.ahead)
            self.ahead = None
        self._close()

    @classmethod
    def local(cls, path: str, end: int, **kw: Any) -> "_PrefetchedBytes":
        fd = os.open(path, os.O_RDONLY)
        return cls(lambda view, offset: os.preadv(fd, [view], offset), end, lambda: os.close(fd), **kw)

    @classmethod
    def remote(cls, location: Location, name: str, end: int, **kw: Any) -> "_PrefetchedBytes":
        """Object stores: 4 MB ranged GETs, 8 at a time (a request costs a round trip and
        some server work whatever its size; stores advise parts of several MB)."""
        kw.setdefault("piece", 4 << 20)
        kw.setdefault("window", 32 << 20)

        def fill(view: memoryview, offset: int) -> int:
            data = location.read_range(name, offset, offset + len(view))
            view[: len(data)] = data
            return len(data)

        return cls(fill, end, **kw)


class _OpenShard:
    """A shard and its index, as columns of Python ints, read through one byte source."""

    def __init__(self, access: ShardAccess, entry: ShardEntry, bytes_limit: int):
        index_name = entry.index or WdsWriter.index_name(entry.name)
        part = entry.parts.get(index_name)  # older manifests carry no digest of the index
        index = load_record(access.url_of(index_name), access.file_bytes(index_name, part))
        if (index.d["sha256"], index.bytes) != (entry.sha256, entry.bytes) and access.cache is not None and not part:
            index = load_record(access.url_of(index_name), access.file_bytes(index_name, refresh=True))  # stale copy
        if (index.d["sha256"], index.bytes, index.d["num_samples"]) != (entry.sha256, entry.bytes, entry.num_samples):
            raise ManifestError(f"{access.url_of(index_name)} describes another version of {entry.name} than the "
                                "manifest (was the output rewritten while being read?)", access.url_of(index_name))
        self.access = access
        self.name = entry.name
        self.path = access.local_shard(entry)  # None: read ranges of the remote object
        self.size = os.path.getsize(self.path) if self.path is not None else entry.bytes
        if self.size != index.bytes:
            raise ManifestError(f"{self.path}: {self.size} bytes, but its index says {index.bytes}", self.path)
        self.index = index
        self._image: Optional[List[Tuple[int, int]]] = None
        self.fields = [(name, col["offset"], col["size"]) for name, col in index.d["members"].items()]
        for _, offsets, sizes in self.fields:  # absent members are (-1, -1)
            if offsets and (max(map(operator.add, offsets, sizes)) > self.size or max(sizes) > bytes_limit
                            or min(offsets) < -1 or min(sizes) < -1):
                raise ManifestError(f"{access.url_of(entry.name)}: index points outside the shard", self.path)
        self.source: Any = None

    def open(self, first: int, stop: int, prefetch: bool) -> None:
        """Prepare to read samples [first, stop) of this shard, in order: a memory map of the
        local file, or concurrent ranged reads ahead (latency-bound mounts, remote objects)."""
        if prefetch or self.path is None:
            end = max((o[i] + sz[i] for _, o, sz in self.fields for i in range(first, stop) if o[i] >= 0),
                      default=0)
            self.source = (_PrefetchedBytes.local(self.path, end) if self.path is not None
                           else _PrefetchedBytes.remote(self.access.location, self.name, end))
        else:
            self.source = _MappedBytes(self.path, self.size)

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
            self.source = None

    def raw_fields(self, i: int) -> Dict[str, bytes]:
        get = self.source.get
        return {name: get(o[i], s[i]) for name, o, s in self.fields if o[i] >= 0}

    def _image_spans(self) -> List[Tuple[int, int]]:
        """Per sample, (offset, size) of the one member that is not the label."""
        if self._image is None:
            cols = [(o, sz) for name, o, sz in self.fields if name != "cls"]
            if len(cols) == 1 and (not cols[0][0] or min(cols[0][0]) >= 0):  # one image field
                self._image = list(zip(*cols[0]))
                return self._image
            spans = []
            for j in range(len(self.index.keys)):
                span = next(((o[j], sz[j]) for o, sz in cols if o[j] >= 0), None)
                if span is None:
                    raise ManifestError(f"{self.index.name}: sample {self.index.keys[j]} has no image member")
                spans.append(span)
            self._image = spans
        return self._image

    def images(self, first: int, stop: int, views: bool = False) -> Iterator[Tuple[int, Any]]:
        """(position, image bytes) of samples [first, stop): the hot loop of raw reading,
        so it slices the memory map directly when there is one. With ``views``, zero-copy
        uint8 array views of the map instead of bytes, where the shard is mapped."""
        spans = self._image_spans()
        mm = getattr(self.source, "mm", None)
        if mm is not None and views:
            whole = np.frombuffer(mm, dtype=np.uint8)
            for i in range(first, stop):
                o, sz = spans[i]
                yield i, whole[o: o + sz]
        elif mm is not None:
            for i in range(first, stop):
                o, sz = spans[i]
                yield i, mm[o: o + sz]
        else:
            get = self.source.get
            for i in range(first, stop):
                o, sz = spans[i]
                data = get(o, sz)
                yield i, np.frombuffer(data, dtype=np.uint8) if views else data


class _WdsDataset:
    """Iterable dataset over dsconvert wds shards; a drop-in for ImageFolder in a DataLoader.

    Samples are ``(image, label)`` for ImageFolder and list sources, dicts of decoded fields
    otherwise. ``len()`` is exact for this rank. See :func:`dsconvert.open_dataset`.
    """

    def __init__(
        self,
        root: str,
        manifest: Manifest,
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        decode: str = "pil",
        shuffle: bool = False,
        seed: int = 0,
        buffer_size: int = 1000,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        even: Optional[str] = None,
        max_member_bytes: int = 1 << 31,
        prefetch: Optional[bool] = None,
        allow_pickle: bool = False,
        access: Optional[ShardAccess] = None,
    ):
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, not {decode!r}")
        if buffer_size < 1:
            raise ValueError("buffer_size must be >= 1")
        rank_span(0, 0, 1, even)  # validates ``even``
        self.root = root
        self.access = access or ShardAccess(root)
        self.manifest = manifest
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_size = buffer_size
        self.rank = rank
        self.world_size = world_size
        if (rank is None or world_size is None) and distributed_initialized():
            # fixed now, in the trainer's process: spawned DataLoader workers have no group
            self.rank, self.world_size = world_info(rank, world_size)
        self.even = even
        self.max_member_bytes = max_member_bytes
        self.prefetch = prefetch  # None: decided by the storage (latency-bound or not)
        self.allow_pickle = allow_pickle  # pickled fields run code when loaded: only for trusted data
        self.epoch = 0
        self.classes = manifest.classes
        self.class_to_idx = {c: i for i, c in enumerate(manifest.classes or [])}

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for this epoch (call before iterating, on every rank)."""
        self.epoch = int(epoch)

    def _span(self) -> Tuple[int, int]:
        rank, world = world_info(self.rank, self.world_size)
        return rank_span(self.manifest.num_samples, rank, world, self.even)

    def __len__(self) -> int:
        start, stop = self._span()
        return stop - start

    def _shard_order(self) -> List[ShardEntry]:
        shards = list(self.manifest.shards)
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(shards)
        return shards

    def _positions(self) -> Tuple[List[ShardEntry], int, int]:
        """Shard order and this worker's [start, stop) in the global sequence."""
        start, stop = self._span()
        wid, nworkers = worker_info()
        lo, hi = split_range(stop - start, nworkers, wid)
        return self._shard_order(), start + lo, start + hi

    def _raw_samples(self) -> Iterator[Tuple[_OpenShard, int, Any]]:
        """(shard, position, raw bytes) for this worker's samples, read in file order."""
        shards, start, stop = self._positions()
        n = self.manifest.num_samples
        if n == 0 or start >= stop:
            return
        if self.prefetch is None:  # remote objects are always read ahead, by ranges or into the cache
            self.prefetch = not self.access.remote and is_latency_bound(self.access.cache_dir_or_root())
        classification = self.manifest.sample_type == "classification"
        ends = []
        total = 0
        for s in shards:
            total += s.num_samples
            ends.append(total)
        pos = start
        while pos < stop:
            p = pos % n  # positions past n wrap around (even="pad")
            k = bisect_right(ends, p)
            first = p - (ends[k] - shards[k].num_samples)
            run = min(ends[k] - p, stop - pos)
            shard = _OpenShard(self.access, shards[k], self.max_member_bytes)
            shard.open(first, first + run, self.prefetch)
            try:
                if classification:
                    for i, raw in shard.images(first, first + run, views=self.decode == "buffer"):
                        yield shard, i, raw
                else:
                    for i in range(first, first + run):
                        yield shard, i, shard.raw_fields(i)
            finally:
                shard.close()
            pos += run

    def _decode(self, shard: _OpenShard, i: int, raw: Any) -> Any:
        if self.manifest.sample_type == "classification":
            with decode_errors_naming(f"{shard.index.name}: {shard.index.keys[i]}"):
                image = decode_image(raw, self.decode)
            label = shard.index.labels[i]
            if self.transform is not None:
                image = self.transform(image)
            if self.target_transform is not None:
                label = self.target_transform(label)
            return image, label
        sample: Dict[str, Any] = {"__key__": shard.index.keys[i]}
        with decode_errors_naming(f"{shard.index.name}: {shard.index.keys[i]}"):
            for name, data in raw.items():
                sample[name] = decode_field(name, data, self.decode, self.allow_pickle)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample

    def __iter__(self) -> Iterator[Any]:
        items: Iterator[Tuple[_OpenShard, int, Any]] = self._raw_samples()
        if self.shuffle and self.buffer_size > 1:
            rank, _ = world_info(self.rank, self.world_size)
            wid, _ = worker_info()
            rng = random.Random(f"{self.seed}:{self.epoch}:{rank}:{wid}")
            items = _shuffled(items, self.buffer_size, rng)
        plain = (self.manifest.sample_type == "classification" and self.decode in ENCODED_MODES
                 and self.transform is None and self.target_transform is None)
        if plain:  # the raw fast path: nothing to decode or transform
            for shard, i, raw in items:
                yield raw, shard.index.labels[i]
            return
        for shard, i, raw in items:
            yield self._decode(shard, i, raw)


def _shuffled(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Bounded-buffer shuffle; holds encoded bytes, never decoded samples."""
    buffer: List[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer


# WdsDataset subclasses torch's Dataset when torch is installed, made on first use
__getattr__ = lazy_module_attr(globals(), "WdsDataset", _WdsDataset, "iterable")
