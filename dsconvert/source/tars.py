"""Tar shards that another tool wrote (webdataset's ShardWriter, GNU tar, img2dataset), indexed
and scanned as a source for conversion; their members are read by :mod:`dsconvert.inputs.tars`
for a conversion, and :mod:`dsconvert.readers.tars` opens the indexed tars as a dataset.

A tar is indexed once by walking its headers (``tarfile`` seeks over the data): each member's
data offset and size, grouped into samples exactly as ``webdataset.WebDataset`` groups them
(the key is the name up to the first dot of its basename, the field the rest, lower-cased;
consecutive members of one key form a sample; directories and ``__meta__`` names are not
members; other non-regular members, names without an extension, unsafe or non-UTF-8 names,
a field repeated within a sample and data past the file's end are skipped with their reason).
The index is a wds shard record (:class:`dsconvert.formats.base.ShardRecord`), so the same
indexed reader that reads dsconvert's own shards reads it; it is saved as
``.dsconvert-index/NAME.json`` beside the tars when that folder is writable, else under a
cache folder (object stores, read-only mounts), and it names the tar's size and mtime (or
ETag): a tar that changes is indexed again. It carries the sha256 of its own content, so an
index damaged or edited by hand is indexed again rather than read (one that is rewritten
whole with a matching digest is trusted: whoever can do that can rewrite the tars too).

``label``: where a sample's class label is, ``cls`` (a member's decimal text, or a class name)
or a JSON key inside a member (``json.label``). Labels are read while indexing (they are
small members beside the headers); names become indices in sorted order, as ImageFolder's
class folders do.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tarfile
import tempfile
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..codecs import field_kind, is_image_field
from ..errors import BadInputError, ManifestError, SourceError
from ..formats.base import part_of
from ..formats.wds import Wds
from ..io.decompress import (
    COMPRESSED_TAR_SUFFIXES,
    COMPRESSIONS,
    CorruptStream,
    DecompressedBytes,
    DecompressedFile,
    compression_of,
)
from ..io.default_cache import cache_home
from ..io.localfs import SizeBoundedFile, atomic_write, open_regular
from ..io.location import Location, json_bytes, mtime_ns_of
from ..io.tar_next import next_member
from ..keys import disambiguate, encode_key, escape_path, is_utf8
from ..samples import Sample, Skipped, Source, SourceFile
from ..scan_table import ScanTable
from .tar_walk import PlainHeaders, PlainMember

__all__ = ["TarShards", "TarSummary", "list_tars", "looks_like_tars", "tar_source", "parse_label", "label_index",
           "check_label_field", "read_bounded", "INDEX_FOLDER"]

INDEX_FOLDER = ".dsconvert-index"
INDEX_SCHEMA = 2  # 2: the index's own sha256
LABEL_MEMBER_BYTES = 1 << 16  # a label member larger than this is not a label
# a saved index is at most this many bytes per byte of its tar, and a base: every member takes
# 512 bytes of header in the tar and far fewer in the index (a larger file is not read: indexed again)
INDEX_BYTES_PER_TAR_BYTE = 64
INDEX_BASE_BYTES = 1 << 20
_SAFE_TAR = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,254}")
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
_TAR_SUFFIXES = (".tar",) + COMPRESSED_TAR_SUFFIXES
# a compressed tar's decompressed length is learnt by reading it: headers are read up to this
# many bytes at a time (a PAX header declaring more is not read), and zeros after the archive's
# end up to this many (the rest of a stream of zeros says nothing)
HEADER_READ_BYTES = 16 << 20
TRAILING_ZEROS_READ = 16 << 20
LOCAL_INDEX_THREADS = 2  # local tars indexed (or their saved indexes checked) at once
WALK_PLAIN = True  # plain headers walked in bulk (:mod:`.tar_walk`); False: tarfile reads every member


def base_plus_ext(name: str) -> Tuple[Optional[str], Optional[str]]:
    """webdataset's split of a member name: (key, field), or (None, None) without an extension."""
    m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)  # webdataset's own pattern, flags and all
    return (m.group(1), m.group(2)) if m else (None, None)


def parse_label(spec: Optional[str]) -> Optional[Tuple[str, List[str]]]:
    """``"cls"`` -> ("cls", []); ``"json.label"`` -> ("json", ["label"]); None -> None."""
    if spec is None:
        return None
    field, *path = str(spec).split(".")
    if not field or any(not p for p in path):
        raise SourceError(f"--label must name a field (cls) or a JSON key in one (json.label), not {spec!r}")
    return field.lower(), path


def label_value(data: bytes, path: Sequence[str]) -> Any:
    """The label a member holds: an int or a class name; BadInputError when it holds none."""
    if len(data) > LABEL_MEMBER_BYTES:
        raise BadInputError(f"the label member has {len(data):,} bytes: not a label")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInputError("the label member is not UTF-8 text") from None
    if path:
        try:
            value: Any = json.loads(text)
        except (ValueError, RecursionError):
            raise BadInputError("the label member is not valid JSON") from None
        for key in path:
            if not isinstance(value, dict) or key not in value:
                raise BadInputError(f"no key {'.'.join(path)!r} in the label member")
            value = value[key]
    else:
        value = text.strip()
        if re.fullmatch(r"-?\d{1,18}", value):
            value = int(value)
    if type(value) is int and 0 <= value < 2**63:
        return value
    if isinstance(value, str) and value and len(value) <= 1000:
        return value
    raise BadInputError(f"the label {str(value)[:40]!r} is neither an integer >= 0 nor a class name")


# --- indexing one tar ----------------------------------------------------------------------


def _identity(info: Dict[str, Any]) -> Dict[str, Any]:
    """What names a version of a tar: its size and mtime (or ETag where a store gives one)."""
    etag = info.get("ETag") or info.get("etag")
    return {"size": int(info["size"]), "mtime_ns": mtime_ns_of(info), **({"etag": str(etag)} if etag else {})}


class _CappedReads(DecompressedFile):
    """A compressed tar's stream as tarfile walks it: no read larger than a header can be."""

    def read(self, n: Optional[int] = -1) -> bytes:
        return super().read(HEADER_READ_BYTES if n is None or n < 0 else min(n, HEADER_READ_BYTES))


def _scan(f: Any, size: int, name: str, label: Optional[Tuple[str, List[str]]]) -> Dict[str, Any]:
    """Walk one tar's headers into a wds record (see the module doc); ``f`` is seekable. A
    compressed tar (by its magic number, whatever its name) is walked through its decompressed
    stream, and its offsets are offsets in that stream (:mod:`dsconvert.io.decompress`)."""
    head = f.read(6)
    f.seek(0)
    kind = compression_of(head)
    stream: Optional[DecompressedBytes] = None
    if kind is not None:
        raw = f
        stream = DecompressedBytes(lambda: raw, kind, name)
        f = _CappedReads(stream)
        size = 1 << 62  # learnt at the end; members past it are found then
    keys: List[str] = []
    fields: List[Dict[str, Tuple[int, int]]] = []
    skipped: List[Dict[str, str]] = []
    values: Optional[List[Any]] = [] if label is not None else None
    corrupt: Optional[CorruptStream] = None  # compressed data that failed: what precedes its member is kept

    def skip(member: str, reason: str) -> None:
        skipped.append({"path": f"{name}/{escape_path(member)}", "reason": reason})

    bounded = SizeBoundedFile(f, size)
    try:
        # typeshed's _Fileobj wants write() too; reading, tarfile calls read/seek/tell only
        tf = tarfile.open(fileobj=bounded, mode="r:")  # type: ignore[call-overload]
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if size == 0 or stream is not None and stream.end == 0 and not isinstance(exc, BadInputError):
            return _record(name, [], [], skipped, values, kind, 0)  # an empty file, or an empty stream
        raise BadInputError(f"not a readable {kind + '-compressed ' if kind else ''}tar: {exc}") from None
    current: Optional[str] = None
    fields_open = False  # whether fields[-1] is the sample of ``current``
    # runs of plain headers walked in bulk; tarfile reads every other member (and all of a
    # compressed stream's, which is read forward only)
    walker = PlainHeaders(f, size, tf.encoding, tf.errors) if stream is None and WALK_PLAIN else None
    plain: Deque[PlainMember] = deque()
    while True:
        m: Any = None
        if not plain and walker is not None and tf.firstmember is None and not tf.pax_headers:
            try:
                plain.extend(walker.run(tf.offset))
            except OSError as exc:
                skip("(rest of the tar)", f"unreadable after byte {tf.offset:,}: {exc}")
                break
        if plain:
            m = plain.popleft()
            tf.offset = m.next_offset
        else:
            try:
                m = next_member(tf)
            except (tarfile.TarError, EOFError, OSError, ValueError, OverflowError, MemoryError) as exc:
                skip("(rest of the tar)", f"unreadable after byte {tf.offset:,}: {exc}")
                corrupt = exc if isinstance(exc, CorruptStream) else corrupt
                break
            if m is None:
                break
        mname = m.name
        if m.isdir():
            continue
        if "/" not in mname and mname.startswith("__") and mname.endswith("__") or _META.match(mname):
            continue  # webdataset's metadata names are not samples
        if not m.isreg():
            kind = ("symlink" if m.issym() else "hard link" if m.islnk() else "device" if m.isdev()
                    else "FIFO" if m.isfifo() else f"type {m.type!r}")
            skip(mname, f"a {kind}, not a file: not read")
            continue
        key, ext = base_plus_ext(mname)
        if key is None or ext is None:
            skip(mname, "no extension after the key (webdataset skips it too)")
            continue
        ext = ext.lower()
        why = ("member name is not valid UTF-8" if not is_utf8(mname)
               else "unsafe member name (absolute or '..')"
               if mname.startswith("/") or ".." in re.split(r"[/\\]", mname)
               else "a sparse member (its data is not stored in one piece): not read" if m.issparse()
               else f"truncated: its {m.size:,} bytes run past the end of the tar" if m.offset_data + m.size > size
               else f"field {ext!r} is a name webdataset reserves" if ext.startswith("__")
               else None)
        if why is not None:
            skip(mname, why)
            if key != current:  # webdataset would have made it a sample of its own: the run of ``current`` ends
                current, fields_open = key, False
            continue
        if current != key or not fields_open:
            keys.append(key)
            fields.append({})
            if values is not None:
                values.append(None)
            current, fields_open = key, True
        if ext in fields[-1]:
            skip(mname, f"field {ext!r} repeats within sample {key!r} (webdataset raises on it)")
            continue
        fields[-1][ext] = (m.offset_data, m.size)
        if label is not None and values is not None and ext == label[0]:
            # read now, in stream order (a compressed stream goes back at a cost); tarfile seeks to its next header
            n = min(m.size, LABEL_MEMBER_BYTES + 1)
            data = walker.held(m.offset_data, n) if walker is not None else None
            if data is None:
                f.seek(m.offset_data)
                data = f.read(n)
            try:
                values[-1] = label_value(data, label[1])
            except BadInputError as exc:
                values[-1] = {"error": exc.reason}
    if not any(s["path"].endswith("/(rest of the tar)") for s in skipped):  # the end said once, first cause first
        try:
            rest = _unread_after(f, tf.offset, size, TRAILING_ZEROS_READ if stream is not None else None)
        except BadInputError as exc:  # a compressed stream cut or damaged after the archive's last member
            skip("(rest of the tar)", exc.reason)
            corrupt = exc if isinstance(exc, CorruptStream) else corrupt
            rest = 0
        if rest:
            skip("(rest of the tar)", f"truncated: the tar ends {rest:,} bytes into a header at byte {tf.offset:,}"
                 if rest < tarfile.BLOCKSIZE else f"an invalid tar header at byte {tf.offset:,}: the "
                 f"{rest:,}{'+' if stream is not None and rest >= tarfile.RECORDSIZE else ''} bytes after it are "
                 "not read (tar tf says more)")
        elif bounded.overrun:
            skip("(rest of the tar)", f"truncated: the tar ends {bounded.overrun:,} bytes short of a header it began")
    if stream is not None and corrupt is None and any(s["path"].endswith("/(rest of the tar)") for s in skipped):
        # the walk stopped early (a damaged header?): the stream's checksum says whether what came before is sound
        corrupt = stream.check_member(max(4 * stream.end, 256 << 20))
        if corrupt is not None:
            cut = next(s for s in skipped if s["path"].endswith("/(rest of the tar)"))
            cut["reason"] += f"; and the {kind} stream fails its check: {corrupt.reason}"
    if stream is not None:  # what the stream held: members past its end were truncated
        size = stream.end
        why = "truncated: its {:,} bytes run past the end of the decompressed tar"
        if corrupt is not None:  # a checksum or the data failed: nothing of that member is trusted
            size = min(size, corrupt.verified)
            why = (f"in a damaged part of the {kind} stream (its bytes cannot be trusted, even those that "
                   f"decompress): {corrupt.reason}")
        keys, fields, values = _within(size, keys, fields, values, skip, label[0] if label else None, why)
    if label is not None and values is not None:
        missing = {"error": f"no {label[0]!r} member (--label {'.'.join([label[0], *label[1]])})"}
        values = [missing if v is None else v for v in values]
    return _record(name, keys, fields, skipped, values, kind, size if stream is not None else None)


def _within(size: int, keys: List[str], fields: List[Dict[str, Tuple[int, int]]], values: Optional[List[Any]],
            skip: Callable[[str, str], None], label_field: Optional[str], why: str
            ) -> Tuple[List[str], List[Dict[str, Tuple[int, int]]], Optional[List[Any]]]:
    """The samples with their members that end within the first ``size`` bytes of a stream;
    the others skipped, ``why`` (formatted with the member's size) their reason (a sample left
    with no member goes, and its label with it; a label read from a member skipped is none)."""
    out_keys: List[str] = []
    out_fields: List[Dict[str, Tuple[int, int]]] = []
    out_values: Optional[List[Any]] = [] if values is not None else None
    for i, (key, sample) in enumerate(zip(keys, fields)):
        kept = {}
        for ext, (offset, n) in sample.items():
            if offset + n > size:
                skip(f"{key}.{ext}", why.format(n))
                if ext == label_field and values is not None:
                    values[i] = {"error": "the label member is not read: " + why.format(n)}
            else:
                kept[ext] = (offset, n)
        if kept:
            out_keys.append(key)
            out_fields.append(kept)
            if out_values is not None and values is not None:
                out_values.append(values[i])
    return out_keys, out_fields, out_values


def _unread_after(f: Any, offset: int, size: int, zeros: Optional[int] = None) -> int:
    """Bytes of data after where tarfile stopped (those read, where the file is shorter than
    ``size``): 0 when only end-of-archive zeros (or nothing) follow, read up to ``zeros`` bytes
    where given. tarfile ends an archive quietly at an invalid header past the first."""
    f.seek(offset)
    at = offset
    while at < size and (zeros is None or at - offset < zeros):
        block = f.read(min(1 << 20, size - at))
        if not block:
            break
        if block.strip(b"\0"):
            return min(size, at + len(block)) - offset if zeros is not None else size - offset
        at += len(block)
    return 0


def _record(name: str, keys: List[str], fields: List[Dict[str, Tuple[int, int]]],
            skipped: List[Dict[str, str]], label_values: Optional[List[Any]], compression: Optional[str] = None,
            stream_bytes: Optional[int] = None) -> Dict[str, Any]:
    n = len(keys)
    columns: Dict[str, Dict[str, List[int]]] = {}
    for i, sample in enumerate(fields):
        for field, (offset, size) in sample.items():
            col = columns.get(field)
            if col is None:  # not setdefault: its default would be two lists of n built for every member
                col = columns[field] = {"offset": [-1] * n, "size": [-1] * n}
            col["offset"][i] = offset
            col["size"][i] = size
    return {
        "schema_version": 1, "format": "wds", "shard": name, "spec_sha256": "foreign", "bytes": 0,
        "sha256": "", "num_samples": n, "fields": {f: field_kind(f) for f in sorted(columns)}, "keys": keys,
        "labels": None, "sources": [[] for _ in range(n)], "skipped": skipped,
        "members": dict(sorted(columns.items())), "label_values": label_values,
        **({"stream_compression": compression, "stream_bytes": stream_bytes} if compression else {}),
    }


# --- a folder (or pattern) of tars ----------------------------------------------------------


def list_tars(src: str, storage_options: Optional[Dict[str, Any]] = None
              ) -> Tuple[Location, List[str], List[Skipped], List[Skipped]]:
    """The tars ``src`` names: a folder of ``.tar`` files, one ``.tar`` file, or a brace
    pattern (``shards/train-{000000..000099}.tar``), all in one folder. Returns the folder, the
    tar names (in order), names a shard cannot have (skipped), and other
    files (ignored)."""
    names: List[str]
    if "{" in src and ".." in src:
        try:
            from braceexpand import braceexpand
        except ImportError:  # pragma: no cover - webdataset depends on it
            raise SourceError("a brace pattern needs braceexpand (pip install braceexpand)", src) from None
        paths = list(braceexpand(src))
        folders = {p.rstrip("/").rsplit("/", 1)[0] for p in paths}
        if len(folders) != 1:
            raise SourceError(f"the pattern {src} names tars in {len(folders)} folders; give one folder's", src)
        folder = folders.pop()
        names = [p.rsplit("/", 1)[1] for p in paths]
        location = Location(folder, storage_options, flat=False)
        present = set(location.listdir())
        missing = [n for n in names if n not in present]
        if missing:
            raise SourceError(f"{len(missing)} tar(s) of the pattern are not there: {', '.join(missing[:3])}", src)
        others: List[str] = []
    else:
        location = Location(src, storage_options, flat=False)
        fs, path = location.fs, location.path()
        try:
            info = fs.info(path)
        except FileNotFoundError:
            raise SourceError(f"source does not exist: {src}", src) from None
        if info.get("type") == "file":
            folder, name = location.url.rsplit("/", 1)
            location = Location(folder, storage_options, flat=False)
            names, others = [name], []
        else:
            listed = location.listdir()
            names = [n for n in listed if n.lower().endswith(_TAR_SUFFIXES) and not n.startswith(".")]
            others = [n for n in listed if n not in names]
    skipped: List[Skipped] = []
    ignored: List[Skipped] = []
    good: List[str] = []
    for n in names:
        if not _SAFE_TAR.fullmatch(n) or n in (".", ".."):
            skipped.append(Skipped(escape_path(n), "a tar name with characters dsconvert does not read "
                                   "(letters, digits, '_', '.', '-'): rename it"))
        else:
            good.append(n)
    for n in others:
        if n.startswith(".") or n == INDEX_FOLDER:
            continue
        if location.fs.isdir(location.path(n)):
            ignored.append(Skipped(escape_path(n), "a folder: only the tars directly in the source are read"))
        else:
            ignored.append(Skipped(escape_path(n), "not a tar shard (.tar, .tar.gz, .tgz, .tar.zst, .tar.bz2, "
                                   ".tar.xz)"))
    return location, good, skipped, ignored


def looks_like_tars(src: str, storage_options: Optional[Dict[str, Any]] = None) -> bool:
    """Whether ``src`` is tar shards and nothing a folder source would be: a ``.tar`` file, a
    brace pattern, or a folder whose files are tars (and no images, no subfolders)."""
    if "{" in src and ".." in src and src.rstrip("}").lower().endswith(_TAR_SUFFIXES + ("}",)):
        return True
    try:
        location = Location(src, storage_options, flat=False)
        fs, path = location.fs, location.path()
        info = fs.info(path)
        if info.get("type") == "file":
            return path.lower().endswith(_TAR_SUFFIXES)
        entries = fs.ls(path, detail=True)
    except (OSError, ValueError):
        return False
    tars = 0
    folders = []
    for e in entries:
        name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(".") or name == INDEX_FOLDER:
            continue
        if e.get("type") == "directory":
            folders.append(e["name"])
        elif is_image_field(name.rsplit(".", 1)[-1].lower()):
            return False
        else:
            tars += name.lower().endswith(_TAR_SUFFIXES)
    if not tars:
        return False
    for folder in folders[:32]:  # class folders of images make it an ImageFolder, whatever else is there
        try:
            if any(is_image_field(str(n).rsplit(".", 1)[-1].lower()) for n in fs.ls(folder, detail=False)[:1000]):
                return False
        except OSError:
            continue
    return True


def _default_index_dir(url: str) -> str:
    digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(cache_home(), "tar-index", digest)


class TarShards:
    """The indexes of a folder's tars: loaded where they are current, built (in threads) where
    they are missing, stale or unreadable, and saved (see the module doc). What is kept of each
    is a summary (:class:`TarSummary`) and its bytes in an unnamed temporary file: a tar's
    record is parsed again when :meth:`record` asks for it, so a scan of millions of samples
    holds one tar's record at a time, never all of them."""

    def __init__(self, location: Location, names: Sequence[str], label: Optional[str] = None,
                 index_dir: Optional[str] = None, workers: int = 8,
                 progress: Optional[Callable[[int], None]] = None):
        self.location = location
        self.names = list(names)
        self.label_spec = label
        self.label = parse_label(label)
        self.index_dir = index_dir or self._index_dir()
        infos = self._infos()
        # each index's {bytes, sha256} as validated here, so that a later read can check it is the same
        self.parts: Dict[str, Dict[str, Any]] = {}
        self.unsaved: Dict[str, bytes] = {}  # indexes that could not be saved (a read-only cache, a folder there)
        self._spool = tempfile.TemporaryFile(prefix="dsconvert-tar-indexes-")  # each index's bytes, as validated
        self._spooled: Dict[str, Tuple[int, int]] = {}  # name -> (offset, length) in the spool
        self._spool_lock = threading.Lock()
        if not location.remote:  # walking headers and parsing JSON hold the GIL: more threads buy no time
            workers = min(workers, LOCAL_INDEX_THREADS)  # and each holds a tar's record while it works
        results = []
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(self.names) or 1))) as pool:
            for result in pool.map(lambda n: self._index(n, infos[n]), self.names):
                results.append(result)
                if progress is not None and result[0] is not None:  # the members found, as a folder's files
                    progress(result[0].files)
        self.summaries: Dict[str, TarSummary] = {}
        self.failed: List[Skipped] = []
        for name, (summary, error) in zip(self.names, results):
            if summary is not None:
                self.summaries[name] = summary
            else:
                self.failed.append(Skipped(name, error or "unreadable"))
        self.names = [n for n in self.names if n in self.summaries]

    def record(self, name: str) -> Dict[str, Any]:
        """Tar ``name``'s index as it was validated (parsed again from the bytes kept)."""
        offset, length = self._spooled[name]
        return json.loads(os.pread(self._spool.fileno(), length, offset))

    def _keep(self, name: str, record: Dict[str, Any], data: bytes) -> TarSummary:
        """The index's bytes spooled, and its summary (what is needed of all tars at once)."""
        with self._spool_lock:
            offset = self._spool.seek(0, os.SEEK_END)
            self._spool.write(data)
            self._spool.flush()
            self._spooled[name] = (offset, len(data))
        values = record["label_values"].get(self.label_spec, []) if self.label_spec else []
        return TarSummary(int(record["num_samples"]), int(record["bytes"]), str(record["sha256"]),
                          dict(record["fields"]), sorted(record["members"]), "stream_compression" in record,
                          [Skipped(s["path"], s["reason"]) for s in record["skipped"]],
                          sorted({v for v in values if isinstance(v, str)}),
                          sum(len(col["offset"]) - col["offset"].count(-1) for col in record["members"].values()))

    def _index_dir(self) -> str:
        local = self.location.local_path("") if not self.location.remote else None
        if local is not None:
            folder = os.path.join(local, INDEX_FOLDER)
            try:
                os.makedirs(folder, exist_ok=True)
                if os.access(folder, os.W_OK):
                    return folder
            except OSError:
                pass
        return _default_index_dir(self.location.url)

    def _infos(self) -> Dict[str, Dict[str, Any]]:
        """Each tar's size, mtime and type; a tar that cannot be looked at (a dangling link,
        one removed since the listing) is ``{"type": "error", "reason"}``: skipped, counted."""
        fs, base = self.location.fs, self.location.path()
        out: Dict[str, Dict[str, Any]] = {}
        if self.location.remote:
            listed = {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e for e in fs.ls(base, detail=True)}
            for n in self.names:
                try:
                    out[n] = listed.get(n) or fs.info(f"{base}/{n}")
                except OSError as exc:
                    out[n] = {"type": "error", "reason": f"unreadable: {exc.strerror or exc}"}
            return out
        for n in self.names:
            try:
                st = os.stat(os.path.join(base, n))
            except OSError as exc:  # a dangling symlink: ENOENT
                why = "a broken symlink" if os.path.islink(os.path.join(base, n)) else "unreadable"
                out[n] = {"type": "error", "reason": f"{why}: {exc.strerror or exc}"}
                continue
            kind = "file" if stat.S_ISREG(st.st_mode) else "other"  # a FIFO, a device: skipped, never opened
            out[n] = {"size": st.st_size, "mtime": st.st_mtime_ns, "type": kind}
        return out

    def index_path(self, name: str) -> str:
        return os.path.join(self.index_dir, name + ".json")

    def _index(self, name: str, info: Dict[str, Any]) -> Tuple[Optional[TarSummary], Optional[str]]:
        if info.get("type") == "error":
            return None, info["reason"]
        if info.get("type", "file") != "file":
            return None, "not a regular file"
        identity = _identity(info)
        loaded = self._load(name, identity)
        saved = loaded[0] if loaded is not None else None
        if loaded is not None and (self.label is None or self.label_spec in loaded[0]["label_values"]):
            self.parts[name] = part_of(loaded[1])
            return self._keep(name, loaded[0], loaded[1]), None
        try:
            if self.location.remote:
                f = self.location.fs.open(self.location.path(name), "rb", block_size=4 << 20,
                                          cache_type="readahead")
            else:
                f = open_regular(self.location.path(name))
            with f:
                record = _scan(f, identity["size"], name, self.label)
        except BadInputError as exc:
            return None, exc.reason
        except OSError as exc:
            return None, f"unreadable: {exc.strerror or exc}"
        values = record.pop("label_values")
        known = dict(saved["label_values"]) if saved is not None else {}  # labels other --label runs read
        if values is not None:
            known[self.label_spec] = values
        record.update({"bytes": identity["size"], "sha256": _sha_of(identity), "tar": identity,
                       "index_schema": INDEX_SCHEMA, "label_values": dict(sorted(known.items()))})
        data = json_bytes({**record, "index_sha256": _digest(record)})
        self.parts[name] = part_of(data)
        try:
            os.makedirs(self.index_dir, exist_ok=True)
            with atomic_write(self.index_path(name)) as out:
                out.write(data)
        except OSError:  # a read-only cache, a folder where the index goes: rebuilt next time, kept in memory now
            self.unsaved[name] = data
        return self._keep(name, record, data), None

    def _load(self, name: str, identity: Dict[str, Any]) -> Optional[Tuple[Dict[str, Any], bytes]]:
        """A saved index of this very tar (same identity and schema), every column a reader
        uses checked, and its bytes; None when there is none (or it is not trustworthy). A file
        larger than such a tar's index can be is not read (a sparse file of gigabytes, say)."""
        try:
            with open_regular(self.index_path(name)) as f:
                data = read_bounded(f, index_bound(identity["size"]))
            if data is None:
                return None
            record = Wds.load_record(self.index_path(name), data).d
        except (OSError, ManifestError):
            return None
        written = {k: v for k, v in record.items() if k != "index_sha256"}  # as parsed, key order kept
        if record.get("index_sha256") != _digest(written):
            return None  # damaged, or edited by hand
        values = record.get("label_values")
        if (record.get("tar") != identity or record.get("index_schema") != INDEX_SCHEMA
                or record.get("shard") != name or record.get("sha256") != _sha_of(identity)
                or record.get("bytes") != identity["size"] or not isinstance(values, dict)
                or not all(isinstance(v, list) and len(v) == record["num_samples"] for v in values.values())):
            return None
        if not all(_is_label_value(v) for vs in values.values() for v in vs):
            return None
        end = identity["size"]
        if "stream_compression" in record or "stream_bytes" in record:  # offsets in the decompressed stream
            end = record.get("stream_bytes")
            if record.get("stream_compression") not in COMPRESSIONS or type(end) is not int or end < 0:
                return None
        for col in record["members"].values():  # every member inside the tar, or indexed again
            if any(o >= 0 and (o + n > end or n < 0) for o, n in zip(col["offset"], col["size"])):
                return None
        return record, data

    def labels_of(self, record: Dict[str, Any]) -> List[Any]:
        """The label values of a tar's samples (its record), for this object's ``label``."""
        return record["label_values"][self.label_spec]

    def classes(self) -> Optional[List[str]]:
        """Sorted class names when any label is a name; None when every label is an int."""
        if self.label is None:
            return None
        names = sorted({v for n in self.names for v in self.summaries[n].class_names})
        return names or None


class TarSummary(NamedTuple):
    """What is kept in memory of one tar's index while the tars are scanned or read."""

    num_samples: int
    bytes: int
    sha256: str
    fields: Dict[str, str]
    members: List[str]  # the fields its members have
    compressed: bool
    skipped: List[Skipped]
    class_names: List[str]  # the labels (for the TarShards' label) that are names
    files: int = 0  # its members indexed (what a scan's progress counts)


def index_bound(tar_bytes: int) -> int:
    """The most bytes a saved index of a tar of ``tar_bytes`` is read up to."""
    return INDEX_BASE_BYTES + INDEX_BYTES_PER_TAR_BYTE * tar_bytes


def read_bounded(f: Any, limit: int) -> Optional[bytes]:
    """All of a regular file ``f`` if it holds at most ``limit`` bytes (its size checked
    before reading, and no more than that read however it grows: one that grows in between
    gives None), else None. The read asks for the size, not the limit: a read allocates what
    it asks for (``index_bound`` of a 1 GB tar is 64 GB)."""
    size = os.fstat(f.fileno()).st_size
    if size > limit:
        return None
    data = f.read(size + 1)
    return data if len(data) <= size else None


def _is_label_value(value: Any) -> bool:
    """What :func:`label_value` can give (an int in int64, a class name) or a reason it gave none."""
    if type(value) is int:
        return 0 <= value < 2**63
    if isinstance(value, str):
        return 0 < len(value) <= 1000
    return isinstance(value, dict) and list(value) == ["error"] and isinstance(value["error"], str)


def _digest(record: Dict[str, Any]) -> str:
    """The sha256 of an index's content as written (key order kept), its own digest left out."""
    return hashlib.sha256(json_bytes(record)).hexdigest()


def _sha_of(identity: Dict[str, Any]) -> str:
    """A stand-in for the tar's sha256 (never computed: that reads the data): the identity's."""
    return "tar:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def check_label_field(shards: TarShards, src: str) -> None:
    """A ``label`` whose field no tar has is a typo, said at once (not a skip per sample)."""
    if shards.label is None or not shards.names:
        return
    field = shards.label[0]
    if not any(field in shards.summaries[n].members for n in shards.names):
        have = sorted({f for n in shards.names for f in shards.summaries[n].members})
        raise SourceError(f"--label {shards.label_spec}: no sample has a {field!r} member (fields: "
                          f"{', '.join(have) or 'none'})", src)


def label_index(value: Any, classes: Optional[List[str]]) -> Any:
    """A label value as a class index, or the reason it is none."""
    if isinstance(value, dict):
        return BadInputError(str(value.get("error", "no label")))
    if isinstance(value, str):
        return classes.index(value) if classes else BadInputError(f"class name {value!r} without classes")
    if classes is not None:
        return BadInputError(f"the label {value} is a number where the others are class names")
    return value


# --- tars as a conversion source ----------------------------------------------------------


def tar_source(src: str, label: Optional[str] = None,
               storage_options: Optional[Dict[str, Any]] = None,
               progress: Optional[Callable[[int], None]] = None) -> Source:
    """The samples of tar shards as a :class:`Source` of kind ``tar``: each member an input
    file (``TAR/MEMBER``), keys made unique and tar-safe. With ``label`` the source holds
    (image, label) samples: each sample's first image field is its input, the label member is
    read already, and the other members are ignored (counted per tar)."""
    location, names, skipped, ignored = list_tars(src, storage_options)
    if not names and not skipped:
        raise SourceError(f"no .tar shards in {src}", src)
    shards = TarShards(location, names, label, progress=progress)
    skipped += shards.failed
    check_label_field(shards, src)
    classes = shards.classes() if label else None
    label_field, label_path = shards.label if shards.label is not None else ("", [])
    samples = ScanTable(repeated_keys=True)  # on disk, one tar's record in memory at a time
    for name in shards.names:
        record = shards.record(name)
        mtime = int(record["tar"]["mtime_ns"])
        skipped += shards.summaries[name].skipped
        members = record["members"]
        values = shards.labels_of(record) if label else []
        unused: Dict[str, int] = {}
        for j, key in enumerate(record["keys"]):
            have = [(f, col["offset"][j], col["size"][j]) for f, col in members.items() if col["offset"][j] >= 0]
            files = [SourceFile(f, f"{name}/{escape_path(key)}.{f}", size, mtime, name, offset)
                     for f, offset, size in have]
            sample_label = None
            if label is not None:
                value = label_index(values[j], classes)
                images = [sf for sf in files if is_image_field(sf.field)]
                if isinstance(value, BadInputError) or not images:
                    reason = value.reason if isinstance(value, BadInputError) else "no image member"
                    skipped += [Skipped(sf.path, reason) for sf in files]
                    continue
                for sf in files:
                    if sf is not images[0] and not (sf.field == label_field and not label_path):  # kept: the label
                        unused[sf.field] = unused.get(sf.field, 0) + 1
                files, sample_label = [images[0]], value
            try:
                out_key = encode_key(key) if key else ""
            except ValueError:
                out_key = ""
            if not out_key:
                skipped += [Skipped(sf.path, "the key is not a relative name") for sf in files]
                continue
            samples.append(Sample(out_key, tuple(files), sample_label))  # a repeated key numbered below
        if unused:
            fields = ", ".join(f"{n:,} {f}" for f, n in sorted(unused.items()))
            ignored.append(Skipped(name, f"members not kept ({fields}): a classification output keeps the image "
                                   f"and its label (--label {label})"))
    samples = samples.with_repeats_renamed(lambda key, count: disambiguate(key, f"{count}"))
    if not samples and not skipped:
        raise SourceError(f"no samples in the tars of {src}", src)
    return Source(location.url, "tars", samples, classes, skipped, ignored, kind="tar",
                  labelled=label is not None, options={"label": label} if label else {})
