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
                              With ``--compress zstd``, non-image fields are stored as members
                              ``<key>.<field>.zst`` (:mod:`dsconvert.codecs.compress`): their
                              columns are named ``<field>.zst`` as the tar names them, with
                              ``raw_size`` (the field's size decompressed) beside ``size``, and
                              ``compression`` maps each such column to its field.
    dsconvert.json            the manifest (dsconvert.manifest), written last.

Keys are encoded (dsconvert.keys) so that ``webdataset.WebDataset``, which splits member
names at the first dot of the basename, sees exactly our samples and fields; GNU ``tar``
lists and extracts the shards as usual.

The tar is written with the standard library's ``tarfile`` (what webdataset's ``TarWriter``
wraps) rather than through webdataset itself, whose import pulls in torch: that cost 1-2 s
and ~300 MB per conversion worker for nothing. The webdataset reader is the test oracle.

Reading does not stream the tar through Python's tarfile: the index gives each member's
offset, so a shard is memory-mapped (or read ahead by ranges, :mod:`dsconvert.io.ranges`) and
samples are sliced out of it. That makes splitting a shard between ranks at any sample
boundary free, and raw reads cost a slice, not a parse. The Dataset that streams shards is
:class:`dsconvert.readers.stream.StreamDataset`; ``verify`` checks the tar's own headers
against the index (:meth:`Wds.structure_problems`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import tarfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..codecs import (
    Compressor,
    codec_version,
    compressed_bound,
    decompress_field,
    encode_class,
    is_compressible,
    stored_name,
)
from ..errors import BadInputError, ManifestError
from ..io.decompress import COMPRESSIONS, DecompressedBytes, SpansRead
from ..io.localfs import SizeBoundedFile, regular_size
from ..io.location import Location
from ..io.ranges import (
    MappedBytes,
    PreadBytes,
    PrefetchedBytes,
    ScatteredBytes,
    local_fill,
    remote_fill,
)
from ..io.tar_next import next_member
from ..manifest import Manifest, ShardEntry, expect, is_int_list
from ..plan import ShardSpec
from ..samples import Sample
from .base import Format, Problem, ShardReader, ShardRecord, Sink
from .columns import Columns, IntColumn, encode_record, is_binary
from .tar_members import MODE, MTIME, archive_end, member_header, padding

__all__ = ["Wds", "FORMAT", "sample_tar_bytes"]

TAR_MTIME = MTIME
WRITE_BYTES = 1 << 20  # a shard is written in pieces of about this size


TAR_TRAILER = 1024 + 10240  # end-of-archive blocks plus padding to a full record, at most
_PLAIN_HEADER = 512


@functools.lru_cache(maxsize=4096)
def _header_bytes(name_bytes: int, ascii: bool, big_size: int) -> int:
    """Header bytes ``TarInfo.tobuf`` writes for a member whose name has ``name_bytes`` UTF-8
    bytes (ASCII or not) and whose size is ``big_size`` when it needs a PAX record (else 0):
    they depend on nothing else, so one measurement serves every name of that length."""
    name = "a" * name_bytes if ascii else "\u00e9" + "a" * (name_bytes - 2)
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = big_size, TAR_MTIME, MODE
    return len(ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))


def _tar_member_bytes(name: str, size: int) -> int:
    """A member's bytes in our tars: its header(s), as ``tarfile`` writes them, plus the
    data padded to 512-byte blocks. A short ASCII name has one 512-byte header; anything
    else (long or non-ASCII names, PAX records) is measured by ``TarInfo.tobuf`` itself."""
    big = size >= 8 ** 11  # past the ustar size field: a PAX size record
    if len(name) > 100 or not name.isascii() or big:
        header = _header_bytes(len(name.encode("utf-8", "surrogateescape")), name.isascii(), size if big else 0)
    else:
        header = _PLAIN_HEADER
    return header + -(-size // 512) * 512


def sample_tar_bytes(sample: Sample, with_cls: bool, compressed: bool = False) -> int:
    """Bytes a sample takes in a tar shard (an upper bound); ``compressed``: its compressible
    fields zstd-compressed (bounded by libzstd's worst case, not compressed to measure)."""
    key, total = sample.key, 0
    if not compressed and len(key) <= 90 and key.isascii():  # the common case, without building names
        for f in sample.files:
            if len(key) + len(f.field) < 100 and f.field.isascii() and f.size < 8 ** 11:  # one 512-byte header
                total += _PLAIN_HEADER + -(-f.size // 512) * 512
            else:
                total += _tar_member_bytes(f"{key}.{f.field}", f.size)
        return total + (2 * _PLAIN_HEADER if with_cls else 0)  # KEY.cls: a header and one block
    for f in sample.files:
        if compressed and is_compressible(f.field):
            total += _tar_member_bytes(f"{sample.key}.{stored_name(f.field)}", compressed_bound(f.size))
        else:
            total += _tar_member_bytes(f"{sample.key}.{f.field}", f.size)
    return total + (_tar_member_bytes(f"{sample.key}.cls", 8) if with_cls else 0)


class _TarSink(Sink):
    """Appends samples as tar members (:mod:`.tar_members`: the bytes ``tarfile`` writes),
    gathered into writes of about 1 MiB, hashed as they pass."""

    def __init__(self, spec: ShardSpec, file: Any):
        self.file = file
        self.digest = hashlib.sha256()
        self.offset = 0  # bytes of the archive so far, buffered ones included
        self.buffer: List[bytes] = []
        self.flushed = 0  # bytes written to the file
        self.classification = spec.sample_type == "classification"
        # (member's field, offset, size, sample, size before compression or -1) per member
        self.members: List[Tuple[str, int, int, int, int]] = []
        self.count = 0
        self.compression: Optional[Dict[str, Any]] = spec.options.get("compress")
        self.compressor = Compressor(self.compression) if self.compression else None
        self.packed: Dict[str, str] = {}  # compressed member's field -> the field (json.zst -> json)

    def add(self, sample: Sample, data: Dict[str, bytes]) -> Dict[str, bytes]:
        if self.classification:
            assert sample.label is not None  # a classification source labels every sample
            data["cls"] = encode_class(sample.label)
        if self.compressor is not None:
            stored = {name: stored_name(name) if is_compressible(name) else name for name in data}
            if len(set(stored.values())) < len(stored):  # json and json.zst: one member name for two fields
                clash = sorted(n for n in data if n.endswith(".zst") and n in stored.values())
                raise BadInputError(f"fields {clash[0][:-4]!r} and {clash[0]!r} would both be stored as member "
                                    f"{clash[0]!r} under --compress zstd: rename {clash[0]!r}, or convert without "
                                    "--compress")
            lone = sorted(n for n in data if n.lower().endswith(".zst") and stored[n] == n)
            if lone:  # alone, it would be read back as the compressed form of another field
                raise BadInputError(f"field {lone[0]!r} would be read back as field {lone[0][:-4]!r} compressed "
                                    f"under --compress zstd: rename {lone[0]!r}, or convert without --compress")
        for name in sorted(data):
            member, payload, raw = name, data[name], -1
            if self.compressor is not None and is_compressible(name):
                member, payload, raw = stored_name(name), self.compressor.compress(payload), len(payload)
                self.packed[member] = name
            header = member_header(f"{sample.key}.{member}", len(payload))
            pad = padding(len(payload))
            self.buffer += (header, payload, pad)
            offset = self.offset + len(header)
            self.offset = offset + len(payload) + len(pad)
            self.members.append((member, offset, len(payload), self.count, raw))
        self.count += 1
        if self.offset - self.flushed >= WRITE_BYTES:
            self.flush()
        return data

    def flush(self) -> None:
        data = b"".join(self.buffer)
        self.digest.update(data)
        self.file.write(data)
        self.buffer = []
        self.flushed = self.offset

    def close(self) -> Dict[str, Any]:
        end = archive_end(self.offset)
        self.buffer.append(end)
        self.offset += len(end)
        self.flush()
        self.sha256 = self.digest.hexdigest()
        columns: Dict[str, Dict[str, List[int]]] = {}
        for name, offset, size, i, raw in self.members:
            col = columns.get(name)
            if col is None:  # made once per field: a default built per member cost ~60 us a sample
                col = columns[name] = {"offset": [-1] * self.count, "size": [-1] * self.count}
                if name in self.packed:
                    col["raw_size"] = [-1] * self.count
            col["offset"][i] = offset
            col["size"][i] = size
            if name in self.packed:
                col["raw_size"][i] = raw
        extra: Dict[str, Any] = {"members": dict(sorted(columns.items()))}
        if self.compression:
            extra["compression"] = {**self.compression, "library": codec_version(),
                                    "fields": dict(sorted(self.packed.items()))}
        return extra


def _unsafe_name(name: str) -> bool:
    return name.startswith("/") or name.startswith("\\") or ".." in re.split(r"[/\\]", name)


def check_tar(out: Location, name: str, record: ShardRecord) -> List[Problem]:
    """The tar's own headers against the index, and members that ``tar -x`` or another reader
    would meet: unsafe paths, links, devices. Headers only, nothing extracted, no read past
    the file's end whatever a header declares."""
    problems: List[Problem] = []
    expected: Dict[str, Tuple[int, int]] = {}
    for field, col in record.d["members"].items():
        for key, offset, size in zip(record.keys, col["offset"], col["size"]):
            if offset >= 0:
                expected[f"{key}.{field}"] = (offset, size)
    seen = set()
    try:
        size = out.size(name)
        bounded = SizeBoundedFile(raw := out.open(name), size)
        # typeshed's _Fileobj wants write() too; reading, tarfile calls read/seek/tell only
        with raw, tarfile.open(fileobj=bounded, mode="r:") as tf:  # type: ignore[call-overload]
            while (m := next_member(tf)) is not None:  # none kept; a negative size refused, not walked forever
                if _unsafe_name(m.name):
                    problems.append(Problem("unsafe-member", name, f"member {m.name!r} has an unsafe path "
                                            "(absolute or '..'): tar -x would write outside its folder"))
                if not m.isreg():
                    kind = ("symlink" if m.issym() else "hard link" if m.islnk() else "device" if m.isdev()
                            else "FIFO" if m.isfifo() else "directory" if m.isdir() else f"type {m.type!r}")
                    problems.append(Problem("unsafe-member", name, f"member {m.name!r} is a {kind}"
                                            + (f" to {m.linkname!r}" if m.linkname else "")))
                    continue
                want = expected.get(m.name)
                if want is None:
                    problems.append(Problem("structure", name, f"member {m.name!r} is not in the index"))
                elif want != (m.offset_data, m.size):
                    problems.append(Problem("structure", name, f"member {m.name!r} is at {m.offset_data}+{m.size}, "
                                            f"the index says {want[0]}+{want[1]}"))
                seen.add(m.name)
    except (tarfile.TarError, EOFError, OSError, ValueError, OverflowError, MemoryError) as exc:
        problems.append(Problem("structure", name, f"not a readable tar: {exc}"))
        return problems
    if bounded.overrun:
        problems.append(Problem("structure", name, f"a header declares {bounded.overrun:,} bytes more than the file "
                                "holds (not read)"))
    for missing in sorted(set(expected) - seen)[:20]:
        problems.append(Problem("structure", name, f"indexed member {missing!r} is not in the tar"))
    return problems


def _header_problem(header: Any, name: Optional[str], size: int) -> Optional[str]:
    """What is wrong with a member's own headers (the bytes before its data: the 512-byte ustar
    header, after a PAX record where the name is long or not ASCII) for the member the index
    names, or None: the size field, and (``name``: our own shards, whose member names are
    ``KEY.FIELD``) the name as ``tarfile`` writes it: in the ustar header its first 100 bytes,
    ASCII with '?', and whole in the PAX record's ``path``. Cheap enough for every read: a shard
    replaced under a reader gives other samples at the old offsets, and their headers say so."""
    header = bytes(header)
    if len(header) < 512:
        return "its tar header is missing"
    ustar = header[-512:]
    field = ustar[124:136]
    if not field[0] & 0x80:  # base-256 sizes (past 8 GiB) are not ours to compare
        try:
            declared = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            return "no tar header where the index puts one"
        if declared != size:
            return f"its tar header declares {declared:,} bytes, the index {size:,}"
    if name is not None:
        have = ustar[:100].split(b"\0", 1)[0]
        if have != name.encode("ascii", "replace")[:100]:
            return f"its tar header names {have.decode('ascii', 'replace')!r}"
        if len(header) > 512 and b"path=" + name.encode("utf-8", "surrogateescape") + b"\n" not in header[:-512]:
            return "its PAX header names another member"
    return None


def _header_len(name: str, size: int) -> int:
    """Bytes of a member's headers in our tars (what ``_tar_member_bytes`` adds to the data)."""
    if len(name) <= 100 and name.isascii() and size < 8 ** 11:
        return _PLAIN_HEADER
    return _tar_member_bytes(name, size) - -(-size // 512) * 512


class WdsShard(ShardReader):
    """A tar shard and its record, the record's columns mapped (:mod:`.columns`: nothing per
    sample is parsed or held), the tar read through one byte source (``pread``, a memory map,
    or ranged reads ahead: :mod:`dsconvert.io.ranges`).

    Every read of a plain tar takes the member's own header with its data (one ``pread`` of
    512 bytes more) and checks its name and size against the record: a shard replaced after
    the dataset opened gives a one-line error naming it, not another sample's bytes."""

    ranged = True  # every member is a byte span of the tar

    def __init__(self, access: Any, entry: ShardEntry, max_member_bytes: int = 1 << 31):
        index_name = Wds.record_name(entry)
        where = access.url_of(index_name)
        part = entry.parts.get(index_name)  # older manifests carry no digest of the index
        cols = _open_columns(access, index_name, part, where)
        head = cols.record
        if (head.get("sha256"), head.get("bytes")) != (entry.sha256, entry.bytes) and access.cache is not None \
                and not part:
            cols = _open_columns(access, index_name, None, where, refresh=True)  # a stale copy
            head = cols.record
        ShardRecord.check_shard_level(head, where)  # the header only: nothing per sample is parsed here
        if (head.get("sha256"), head.get("bytes"), cols.n) != (entry.sha256, entry.bytes, entry.num_samples):
            raise ManifestError(f"{where} describes another version of {entry.name} than the manifest (was the "
                                "output rewritten while being read?)", where)
        self.access = access
        self.name = entry.name
        self.entry = entry
        self.where = where
        self.path = access.local_shard(entry)  # None: read ranges of the remote object
        self.size = regular_size(self.path) if self.path is not None else entry.bytes
        if self.size != head.get("bytes"):
            raise ManifestError(f"{self.path}: {self.size} bytes, but its index says {head.get('bytes')}", self.path)
        self.cols = cols
        self.keys = cols.strings("keys")
        self.labels = cols.ints("labels") if cols.has("labels") else []
        members = cols.fields()
        self.columns: List[Tuple[str, IntColumn, IntColumn]] = [
            (name, col["offset"], col["size"]) for name, col in members.items()]
        # a compressed tar another tool wrote (.tar.gz...): offsets are in its decompressed stream
        self.stream_kind: Optional[str] = head.get("stream_compression")
        end: Any = self.size
        if self.stream_kind is not None:
            end = head.get("stream_bytes")
            if self.stream_kind not in COMPRESSIONS or type(end) is not int or end < 0:
                raise ManifestError(f"{where}: not an index of a compressed tar this dsconvert reads", self.path)
        for member, offsets, sizes in self.columns:  # absent members are (-1, -1); checked vectorised, on the map
            if not len(offsets):
                continue
            o, s = offsets.array(), sizes.array()
            for column, values in (("offset", o), ("size", s)):  # a hostile value is named, as the JSON checks do
                expect(int(values.min()) >= -1, where, f"members.{member}.{column}",
                       f"a list of {len(o)} integers >= -1")
            present = o[o >= 0]
            # a plain tar's first data follows a 512-byte header: each read takes the header with it
            first = 0 if self.stream_kind is not None else 512
            if (o.min() < -1 or s.min() < -1 or s.max() > max_member_bytes or int((o + s).max()) > end
                    or (present.size and int(present.min()) < first) or bool(((o >= 0) != (s >= 0)).any())):
                raise ManifestError(f"{access.url_of(entry.name)}: index points outside the shard", self.path)
        self.max_member_bytes = max_member_bytes
        compression = head.get("compression") or {}
        packed = compression.get("fields", {}) if isinstance(compression, dict) else {}
        # compressed columns: member's field -> (the field, sizes decompressed), read back by fields()
        self.packed: Dict[str, Tuple[str, IntColumn]] = {}
        for member, field in (packed.items() if isinstance(packed, dict) else ()):
            raw = members.get(member, {}).get("raw_size")
            if raw is None:
                raise ManifestError(f"{where}: compressed member {member!r} has no raw_size column", where)
            self.packed[member] = (field, raw)
        # each member's header is checked on reads of plain tars; the name too where the tar is ours
        self.check_headers = self.stream_kind is None
        self.own_names = getattr(access, "own_names", True)
        self._image_cols = [(name, o, s) for name, o, s in self.columns if name != "cls"]
        self.source: Any = None
        self._whole: Optional[np.ndarray] = None  # the mapped shard, for views (decode="buffer")

    # --- reading one member --------------------------------------------------------------

    def member_name(self, j: int, field: str) -> Optional[str]:
        return f"{self.keys[j]}.{field}" if self.own_names else None

    def header_len(self, j: int, field: str, o: int, size: int, name: Optional[str] = None) -> int:
        """Bytes of the member's headers read with it: 512, or with its PAX record where our
        writer made one (a name past 100 bytes or not ASCII); never before the file's start.
        ``name``: :meth:`member_name`, where the caller has it."""
        if name is None and self.own_names:
            name = self.member_name(j, field)
        h = _header_len(name, size) if name is not None else _PLAIN_HEADER
        if o < h:
            raise ManifestError(f"{self.where}: sample {self.keys[j]!r} ({field}) starts at byte {o}, before its "
                                "own tar header could end (a damaged record)", self.where)
        return h

    def check_header(self, header: Any, j: int, field: str, size: int) -> None:
        problem = _header_problem(header, self.member_name(j, field), size)
        if problem is not None:
            raise ManifestError(f"{self.access.url_of(self.name)}: sample {self.keys[j]!r} ({field}): {problem}: "
                                "the shard is not the one its index describes (replaced or rewritten since); "
                                "open the dataset again, or run dsconvert verify", self.access.url_of(self.name))

    def read(self, get: Callable[[int, int], Any], j: int, field: str, o: int, size: int) -> Any:
        """The member's bytes through ``get``, its headers checked with them (plain tars)."""
        if not self.check_headers:
            return get(o, size)
        name = self.member_name(j, field)  # once: the sample's key is decoded from the record
        h = self.header_len(j, field, o, size, name)
        raw = get(o - h, size + h)
        if _header_problem(raw[:h], name, size) is not None:
            self.check_header(raw[:h], j, field, size)  # raises, naming the problem
        return raw[h:]

    def span(self, j: int, field: str, o: int, size: int) -> Tuple[int, int]:
        """The bytes a read of a member takes: with its headers, for plain tars."""
        if not self.check_headers:
            return o, size
        h = self.header_len(j, field, o, size)
        return o - h, size + h

    # --- sources ---------------------------------------------------------------------------

    def prepare(self, first: int, stop: int, prefetch: bool, views: bool = False) -> None:
        """A local file read by ``pread`` (or memory-mapped for zero-copy ``views``), or
        concurrent ranged reads ahead of samples [first, stop) (latency-bound mounts, remote
        objects). A compressed tar is read through its decompressed stream, one per shard,
        kept from one call to the next (its position is what makes reading in order cheap)."""
        if self.stream_kind is not None:
            self._decompressed()
            return
        self.close()
        if prefetch or self.path is None:
            end = 0
            for _, o, sz in self.columns:
                if stop > first:
                    ends = o.array()[first:stop] + sz.array()[first:stop]
                    end = max(end, int(ends.max()))
            self.source = (PrefetchedBytes.local(self.path, end) if self.path is not None
                           else PrefetchedBytes.remote(self.access.location, self.entry.name, end))
        elif views:  # zero-copy views of the map (decode="buffer")
            self.source = MappedBytes(self.path, self.size)
            if self.source.mm is not None:
                self._whole = np.frombuffer(self.source.mm, dtype=np.uint8)
        else:
            self.source = PreadBytes(self.path, self.size)

    def _decompressed(self) -> DecompressedBytes:
        if self.source is None:
            path, location, name = self.path, self.access.location, self.entry.name

            def opener() -> Any:
                return open(path, "rb") if path is not None else location.open(name, block_size=4 << 20)
            self.source = DecompressedBytes(opener, str(self.stream_kind), self.access.url_of(name))
        return self.source

    def close(self) -> None:
        self._whole = None
        if self.source is not None:
            self.source.close()
            self.source = None

    def _source(self) -> Any:
        if self.source is None:
            self.prepare(0, len(self.keys), False)
        return self.source

    # --- samples ---------------------------------------------------------------------------

    def fields(self, j: int, source: Any = None) -> Dict[str, bytes]:
        get = (source if source is not None else self._source()).get
        stored = {}
        for name, o, s in self.columns:
            offset = o[j]
            if offset >= 0:
                stored[name] = self.read(get, j, name, offset, s[j])
        return self._unpacked(stored, j) if self.packed else stored

    def _unpacked(self, stored: Dict[str, Any], j: int) -> Dict[str, bytes]:
        """Sample j's fields with the compressed ones decompressed under their own names, in
        field order (as the output without compression gives them)."""
        out: Dict[str, Any] = {}
        total = sum(raw[j] for member, (_, raw) in self.packed.items() if member in stored and raw[j] > 0)
        if total > self.max_member_bytes:  # each field within the bound, many of them past it: a zstd bomb
            raise BadInputError(f"the zstd fields of this sample hold {total:,} bytes decompressed, over the limit "
                                f"of {self.max_member_bytes:,} bytes (max_member_bytes)")
        for name, data in stored.items():
            packed = self.packed.get(name)
            if packed is None:
                out[name] = data
            else:
                field, raw = packed
                out[field] = decompress_field(data, raw[j], self.max_member_bytes)
        return dict(sorted(out.items()))

    def sample_bytes(self, j: int, image_only: bool) -> int:
        """Bytes read for sample j (its image, or every member)."""
        if image_only:
            return self.image_member(j)[2]
        return sum(s[j] for _, o, s in self.columns if o[j] >= 0)

    def scattered(self, samples: Sequence[int], image_only: bool) -> ScatteredBytes:
        """The bytes of ``samples`` (their image, or every member), requested now, concurrently
        (see :class:`~dsconvert.io.ranges.ScatteredBytes`); ``close()`` it when read."""
        if image_only:
            spans = [self.span(j, *self.image_member(j)) for j in samples]
        else:
            spans = [self.span(j, name, o[j], s[j]) for j in samples for name, o, s in self.columns if o[j] >= 0]
        if self.stream_kind is not None:
            return SpansRead(self._decompressed(), spans)  # type: ignore[return-value]
        if self.path is not None:
            fill, close = local_fill(self.path)
            source = ScatteredBytes(fill, spans)
            source.close = _then(source.close, close)  # type: ignore[method-assign]
            return source
        return ScatteredBytes(remote_fill(self.access.location, self.entry.name), spans)

    def image_member(self, j: int) -> Tuple[str, int, int]:
        """(field, offset, size) of sample j's image: its one member that is not the label."""
        for name, o, s in self._image_cols:
            offset = o[j]
            if offset >= 0:
                return name, offset, s[j]
        raise ManifestError(f"{self.where}: sample {self.keys[j]} has no image member", self.where)

    def image(self, j: int, source: Any = None) -> Any:
        """Sample j's image bytes; a zero-copy uint8 view of the map after ``prepare(views=True)``;
        ``source``: a byte source that ``scattered`` gave, to read it from."""
        field, o, sz = self.image_member(j)
        if source is None:
            source = self._source()
            if self._whole is not None:
                if self.check_headers:
                    self.check_header(self._whole[o - self.header_len(j, field, o, sz): o], j, field, sz)
                return self._whole[o: o + sz]
        return self.read(source.get, j, field, o, sz)

    def image_spans(self) -> Sequence[Tuple[int, int]]:
        """(offset, size) of each sample's image member, by sample (computed on access)."""
        return _ImageSpans(self)

    def images(self, first: int, stop: int, views: bool = False) -> Iterator[Tuple[int, Any]]:
        """The hot loop of raw reading, each member's header checked with it. With ``views``,
        zero-copy uint8 array views of the map instead of bytes."""
        if self.source is None or (views and getattr(self.source, "mm", None) is None
                                   and not isinstance(self.source, PrefetchedBytes)):
            self.prepare(first, stop, False, views)
        mm = getattr(self.source, "mm", None)
        if mm is not None:
            whole = np.frombuffer(mm, dtype=np.uint8)
            for i in range(first, stop):
                field, o, sz = self.image_member(i)
                if self.check_headers:
                    self.check_header(whole[o - self.header_len(i, field, o, sz): o], i, field, sz)
                yield i, whole[o: o + sz] if views else mm[o: o + sz]
        else:
            get = self.source.get
            for i in range(first, stop):
                field, o, sz = self.image_member(i)
                data = self.read(get, i, field, o, sz)
                yield i, np.frombuffer(data, dtype=np.uint8) if views else data


class _ImageSpans(Sequence[Tuple[int, int]]):
    """A shard's image spans as a sequence, each computed from the mapped columns when asked."""

    def __init__(self, shard: WdsShard):
        self.shard = shard

    def __len__(self) -> int:
        return len(self.shard.keys)

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        _, o, s = self.shard.image_member(j)
        return o, s


def _open_columns(access: Any, name: str, part: Optional[Dict[str, Any]], where: str,
                  refresh: bool = False) -> Columns:
    """A shard's record as columns: mapped where it is a local binary record, else read (an
    older output's JSON record, or a foreign tar's index, is turned into columns in memory:
    such a record costs its parse at every open, as before)."""
    data = access.file_bytes(name, refresh=True) if refresh else access.mapped_file(name, part)
    if is_binary(data):
        return Columns(data, where)
    record = Wds.load_record(where, bytes(data))
    # what a reader uses (the source paths and their stats are verify's)
    d = {k: v for k, v in record.d.items() if k not in ("sources", "stats")}
    try:
        return Columns(encode_record(d), where)
    except ValueError as exc:  # an integer past int64: no writer makes one
        raise ManifestError(f"{where}: {exc} (a damaged shard record)", where) from None


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        try:
            first()
        finally:
            second()
    return both


class Wds(Format):
    """WebDataset tar shards; see the module doc."""

    id = "wds"
    suffix = ".tar"
    overhead = TAR_TRAILER
    any_samples = True
    iterable = True

    compresses_fields = True

    @classmethod
    def sample_bytes(cls, sample: Sample, classification: bool, compressed: bool = False) -> int:
        return sample_tar_bytes(sample, classification, compressed)

    @classmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        return _TarSink(spec, file)

    @classmethod
    def load_record(cls, path: str, data: Optional[bytes] = None) -> ShardRecord:
        """The record, checked to have, per field, integer offset and size columns as long as
        the keys (-1: a field a sample lacks)."""
        record = ShardRecord.load(path, cls.id, data)
        members: Any = record.d.get("members")  # unchecked JSON until expect() passes
        n = len(record.keys)
        expect(isinstance(members, dict) and all(isinstance(k, str) for k in members), path, "members",
               "an object of per-field columns")
        for name, col in members.items():
            for part in ("offset", "size"):
                values = col.get(part) if isinstance(col, dict) else None
                expect(is_int_list(values, n, -1), path, f"members.{name}.{part}", f"a list of {n} integers >= -1")
        compression: Any = record.d.get("compression")
        if "compression" in record.d:
            packed = compression.get("fields") if isinstance(compression, dict) else None
            if not isinstance(packed, dict) or compression.get("codec") != "zstd":
                expect(False, path, "compression", 'an object {"codec": "zstd", "fields": {"<field>.zst": "<field>"}}')
                return record
            for member, field in packed.items():
                expect(isinstance(field, str) and member == stored_name(field) and member in members, path,
                       f"compression.fields.{member}", "a field whose compressed column is in members")
                expect(is_int_list(members[member].get("raw_size"), n, -1), path, f"members.{member}.raw_size",
                       f"a list of {n} integers >= -1")
        return record

    @classmethod
    def structure_problems(cls, out: Location, entry: ShardEntry, record: ShardRecord,
                           parts: Dict[str, bytes]) -> List[Problem]:
        return check_tar(out, entry.name, record)

    @classmethod
    def open_shard(cls, access: Any, entry: ShardEntry, manifest: Manifest, **options: Any) -> WdsShard:
        shard = WdsShard(access, entry, options.get("max_member_bytes", 1 << 31))
        labels = shard.labels
        if isinstance(labels, IntColumn) and len(labels) and manifest.classes is not None and (
                labels.min() < 0 or labels.max() >= len(manifest.classes)):  # checked on the map, vectorised
            shard.close()
            raise ManifestError(f"{shard.where}: labels outside the {len(manifest.classes)} classes (a damaged "
                                "record)", shard.where)
        fields = set((manifest.compression or {}).get("fields") or [])
        unsaid = sorted(n for n, _, _ in shard.columns if n.endswith(".zst") and n[:-4] in fields
                        and n not in shard.packed)
        if unsaid or shard.packed and manifest.compression is None:  # compressed bytes would pass for fields
            shard.close()
            raise ManifestError(f"{access.url_of(Wds.record_name(entry))}: its compressed fields are not the "
                                f"manifest's ({', '.join(unsaid) or 'the manifest names none'}): a damaged output",
                                access.url_of(Wds.record_name(entry)))
        return shard


FORMAT = Wds
