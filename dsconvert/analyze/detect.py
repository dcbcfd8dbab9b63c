"""What a path holds, from file headers alone: :func:`detect`.

``dsconvert analyze`` calls it first, so that data already converted (a dsconvert output, a
folder of decoded ``.npy`` arrays, WebDataset shards, an HDF5 file...) is named for what it
is instead of being measured as loose files.

Recognition is by content (magic bytes and headers); a file's extension is only a hint, used
to name a file whose content matches nothing (then it is reported *damaged*) and to pick which
files of a big folder to sniff. Reading is bounded: a few KiB from the head and the tail of a
sampled set of files, the tar headers of a few shards, HDF5 and Parquet metadata through their
libraries, never a whole data file. Symlinks that lead out of the tree are not followed. Every
byte may be hostile: whatever a file holds, :func:`detect` returns a :class:`Detected` and
never raises (a file h5py refuses is "damaged", not an exception). One caveat: h5py's C
library parses HDF5 metadata in this process, and a crafted file that crashes libhdf5 itself
is out of reach of any ``except``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickletools
import posixpath
import re
import stat as stat_mod
import struct
import tarfile
import zipfile
import zlib
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, IO, List, Optional, Sequence, Tuple

import numpy as np

from ..codecs import NPY_HEADER_ERRORS, is_image_field
from ..manifest import MANIFEST_NAME, Manifest
from ..optional import optional_import
from ..source.folders import LIST_SUFFIXES, FolderListing, is_ignored, looks_like_image_folder

__all__ = ["Detected", "detect", "KINDS", "crc32c", "masked_crc32c"]

KINDS = ("dsconvert", "webdataset", "hdf5", "npy", "npz", "parquet", "arrow", "lmdb", "tfrecord",
         "pickle", "files", "unknown")

MAX_ENTRIES = 100_000  # folder entries listed before the walk stops
MAX_SNIFF = 256  # files whose first bytes are read, over the whole folder
SNIFF_PER_GROUP = 8  # ... and per extension
MAX_DETAIL = 4  # files of the dominant kind read further (HDF5 datasets, tar headers, footers)
MAX_TAR_MEMBERS = 50_000  # tar headers read per shard (tarfile reads ~25,000 a second), then counted in proportion
GZ_TAR_BUDGET = 16 << 20  # compressed bytes read from one .tar.gz to count its members
TAR_INFLATE_BUDGET = 1 << 30  # ... and the bytes inflated from them (a gzip bomb inflates a thousandfold)
TAR_HEADER_BUDGET = 128 << 20  # header bytes read from one plain tar
MAX_MANIFEST = 64 << 20
MAX_FOOTER = 64 << 20  # a Parquet footer longer than this is not handed to pyarrow
MAX_ZIP_DIRECTORY = 16 << 20  # a zip central directory longer than this is not parsed
MAX_H5_DATASETS = 64
MAX_NESTED = 64  # dsconvert outputs in subfolders read by their manifests
SCAN_FILES = 20_000  # a "files" tree this small is scanned by dsconvert.source.scan for its sample count
HEAD = 16 << 10

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_NPY_MAGIC = b"\x93NUMPY"
_LMDB_MAGIC = 0xBEEFC0DE

# extension -> the kind a file of that name claims to be (a hint: the content decides)
_HINTS = {"npy": "npy", "npz": "npz", "h5": "hdf5", "hdf5": "hdf5", "hdf": "hdf5", "he5": "hdf5",
          "parquet": "parquet", "pq": "parquet", "arrow": "arrow", "arrows": "arrow", "feather": "arrow",
          "ipc": "arrow", "tar": "webdataset", "tgz": "webdataset", "tfrecord": "tfrecord",
          "tfrecords": "tfrecord", "tfrec": "tfrecord", "pkl": "pickle", "pickle": "pickle", "pt": "pickle",
          "pth": "pickle", "mdb": "lmdb"}

READERS = {
    "dsconvert": "dsconvert.open_dataset",
    "webdataset": "webdataset.WebDataset",
    "hdf5": "h5py",
    "npy": "np.load(mmap_mode='r')",
    "npz": "np.load",
    "parquet": "pyarrow.parquet / datasets.load_dataset('parquet')",
    "arrow": "pyarrow.ipc / datasets.Dataset.from_file",
    "lmdb": "lmdb",
    "tfrecord": "tf.data.TFRecordDataset / the tfrecord package",
    "pickle": "pickle / torch.load",
    "files": "dsconvert.open_source / torchvision.datasets.ImageFolder",
    "unknown": "",
}

# what a file of a kind is, for "named .npy but its content is not an .npy array"
NAMES = {"webdataset": "a tar archive", "hdf5": "HDF5", "npy": "an .npy array", "npz": "an .npz archive",
         "parquet": "Parquet", "arrow": "Arrow IPC", "lmdb": "LMDB", "tfrecord": "TFRecord",
         "pickle": "a pickle"}
# what one file of a kind is called when files are counted: "3 HDF5 files"
FILE_LABELS = {"webdataset": "tar", "hdf5": "HDF5", "npy": ".npy", "npz": ".npz", "parquet": "Parquet",
               "arrow": "Arrow", "lmdb": "LMDB", "tfrecord": "TFRecord", "pickle": "pickle", "files": "other",
               "unknown": "unrecognised"}


def _count(n: int, kind: str) -> str:
    return f"{n:,} {FILE_LABELS.get(kind, kind)} file{'s' if n != 1 else ''}"


@dataclass
class Detected:
    """What a path holds. ``kind`` is one of :data:`KINDS`; ``files`` are its data files (of a
    big folder, those listed before the walk stopped); ``num_samples`` is None where headers
    cannot tell, and then ``estimated_samples`` may hold an extrapolation from the files read;
    ``convertible``: whether ``dsconvert shard`` takes it as a source today (only "files"
    sources); ``others``: the other kinds found beside the dominant one (kind -> file count);
    ``damaged``: "path: why" for every file read that is not what it claims to be."""

    path: str
    kind: str
    description: str
    files: List[str] = field(default_factory=list)
    num_samples: Optional[int] = None
    reader: str = ""
    convertible: bool = False
    advice: str = ""
    format: Optional[str] = None  # dsconvert outputs: the manifest's format id (wds, hdf5, npy)
    estimated_samples: Optional[int] = None
    others: Dict[str, int] = field(default_factory=dict)
    damaged: List[str] = field(default_factory=list)
    complete: bool = True  # False: a big folder, listed only in part
    details: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), as TFRecord frames its records

def _crc32c_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C of ``data`` (pure Python: meant for headers and small records)."""
    crc ^= 0xFFFFFFFF
    table = _CRC32C
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits, add 0xa282ead8."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# storage: local paths, or an fsspec file system

class _Store:
    def __init__(self, fs: Any = None):
        self.fs = fs

    def join(self, base: str, name: str) -> str:
        return f"{base.rstrip('/')}/{name}" if self.fs is not None else os.path.join(base, name)

    def open(self, path: str) -> IO[bytes]:
        if self.fs is not None:
            return self.fs.open(path, "rb")
        return open(path, "rb")

    def read_range(self, path: str, start: int, n: int) -> bytes:
        with self.open(path) as f:
            f.seek(start)
            return f.read(n)

    def info(self, path: str) -> Tuple[str, int]:
        """("dir" | "file" | "other", size)."""
        if self.fs is not None:
            info = self.fs.info(path)
            kind = info.get("type")
            return ("dir" if kind == "directory" else "file" if kind == "file" else "other",
                    int(info.get("size") or 0))
        st = os.stat(path)
        if stat_mod.S_ISDIR(st.st_mode):
            return "dir", 0
        return ("file" if stat_mod.S_ISREG(st.st_mode) else "other"), st.st_size


@dataclass
class _Entry:
    rel: str
    path: str
    size: int

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]

    @property
    def ext(self) -> str:
        name = self.name.lower()
        if name.endswith(".tar.gz"):
            return "tar.gz"
        stem, dot, ext = name.rpartition(".")
        return ext if dot and stem else ""


@dataclass
class _Walk:
    entries: List[_Entry] = field(default_factory=list)
    listings: List[FolderListing] = field(default_factory=list)
    complete: bool = True
    outside_links: List[str] = field(default_factory=list)
    unreadable: List[str] = field(default_factory=list)


def _walk(store: _Store, root: str, limit: Optional[int] = None) -> _Walk:
    """Breadth-first listing of ``root``, at most ``limit`` entries; hidden files and OS litter
    left out as the scanner leaves them out; symlinks followed only where they stay inside the
    tree, and a folder reached twice listed once."""
    limit = MAX_ENTRIES if limit is None else limit
    out = _Walk()
    real_root = os.path.realpath(root) if store.fs is None else root
    seen = set()
    if store.fs is None:
        st = os.stat(root)
        seen.add((st.st_dev, st.st_ino))  # a link back to the root is a loop
    queue = deque([""])
    listed = 0
    while queue:
        rel = queue.popleft()
        path = store.join(root, rel) if rel else root
        files: List[Tuple[str, int, int]] = []
        try:
            items = _list_dir(store, path, real_root, out)
        except OSError as exc:
            out.unreadable.append(f"{rel or '.'}: {exc.strerror or exc}")
            continue
        subdirs = []
        for name, kind, size, ident in sorted(items):
            listed += 1
            if listed > limit:
                out.complete = False
                break
            if is_ignored(name):
                continue
            child = f"{rel}/{name}" if rel else name
            if kind == "dir":
                if ident in seen:
                    continue
                seen.add(ident)
                subdirs.append(child)
            elif kind == "file":
                files.append((name, size, 0))
                out.entries.append(_Entry(child, store.join(root, child), size))
        out.listings.append(FolderListing(rel, files))
        if not out.complete:
            break
        queue.extend(subdirs)
    out.listings.sort(key=lambda d: d.rel)
    return out


def _list_dir(store: _Store, path: str, real_root: str, walk: _Walk) -> List[Tuple[str, str, int, Any]]:
    items = []
    if store.fs is not None:
        for e in store.fs.ls(path, detail=True):
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            if not name:
                continue
            kind = "dir" if e.get("type") == "directory" else "file" if e.get("type") == "file" else "other"
            items.append((name, kind, int(e.get("size") or 0), e["name"]))
        return items
    with os.scandir(path) as it:
        for entry in it:
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if os.path.commonpath([target, real_root]) != real_root:
                        walk.outside_links.append(entry.name)
                        continue
                st = entry.stat(follow_symlinks=True)
            except (OSError, ValueError):
                continue  # broken link, loop, vanished: nothing to read
            if stat_mod.S_ISDIR(st.st_mode):
                items.append((entry.name, "dir", 0, (st.st_dev, st.st_ino)))
            elif stat_mod.S_ISREG(st.st_mode):
                items.append((entry.name, "file", st.st_size, None))
    return items


# ---------------------------------------------------------------------------------------------
# one file: what its first and last bytes say

# protocols 0 and 1 have no magic: a pickle of theirs starts with any of their opcodes
_TEXT_PICKLE_STARTS = frozenset(op.code.encode("latin-1") for op in pickletools.opcodes if op.proto <= 1)
_DECLARED = re.compile(r"expected (\d+) bytes in a .*, but only (\d+) remain")


def _pickle_damage(head: bytes, size: int) -> str:
    """Why the first bytes of a ``size``-byte pickle are not one ("" when they parse as far as
    they go: to its STOP when ``head`` is the whole file; an argument cut by the head's end
    must fit in the file). ``pickletools.genops`` only disassembles: nothing is loaded or run."""
    whole = size <= len(head)
    try:
        for _ in pickletools.genops(io.BytesIO(head)):
            pass
    except Exception as exc:  # ValueError mostly; whatever a malformed argument makes the readers raise
        text = str(exc)
        cut = any(c in text for c in ("exhausted", "no newline found", "not enough data", "but only"))
        if whole or not cut:  # an unknown opcode, a malformed argument, or a whole file without its end
            return f"not a pickle: {text[:120]}"
        m = _DECLARED.search(text)
        if m and len(head) - int(m.group(2)) + int(m.group(1)) > size:
            return f"not a pickle: an argument declares {int(m.group(1)):,} bytes, past the file's end"
    return ""


@dataclass
class _Sniff:
    kind: str  # a KINDS value, or "other": an image or any other file the scanner takes
    damaged: str = ""  # why the file is not what it claims to be
    info: Dict[str, Any] = field(default_factory=dict)


def _npy_header(head: bytes) -> Dict[str, Any]:
    """shape, dtype and the header's length, from the first bytes (numpy's own readers)."""
    f = io.BytesIO(head)
    version = np.lib.format.read_magic(f)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0,
              (3, 0): np.lib.format.read_array_header_2_0}.get(version)
    if reader is None:
        raise ValueError(f"npy format version {version} is not one numpy writes")
    shape, fortran, dtype = reader(f, max_header_size=HEAD)
    return {"shape": tuple(int(n) for n in shape), "dtype": dtype, "offset": f.tell()}


def _npy_sniff(head: bytes, size: int) -> _Sniff:
    try:
        h = _npy_header(head)
    except NPY_HEADER_ERRORS as exc:
        return _Sniff("npy", f"the .npy header does not parse ({_short(exc)})")
    except Exception as exc:  # numpy's header parser on hostile text: whatever it raises
        return _Sniff("npy", f"the .npy header does not parse ({_short(exc)})")
    dtype = h["dtype"]
    info = {"shape": h["shape"], "dtype": str(dtype), "object": bool(dtype.hasobject)}
    if dtype.hasobject:
        return _Sniff("npy", "", info)
    needed = dtype.itemsize
    for n in h["shape"]:
        needed *= n
    if needed + h["offset"] > size:
        return _Sniff("npy", f"truncated: the header declares {_shape(h['shape'])} {dtype} "
                             f"({needed:,} bytes) but the file holds {max(0, size - h['offset']):,}", info)
    return _Sniff("npy", "", info)


def _tar_header_ok(block: bytes) -> bool:
    if len(block) < 512:
        return False
    try:
        tarfile.TarInfo.frombuf(block[:512], "utf-8", "surrogateescape")
    except Exception:  # HeaderError (checksum, empty block), or a number field that does not parse
        return False
    return True


def _gzip_head(store: _Store, path: str, n: int = 1024) -> bytes:
    """The first ``n`` bytes of a gzip stream's content (bounded: a bomb stops at ``n``)."""
    d = zlib.decompressobj(wbits=31)
    out = b""
    with store.open(path) as f:
        for _ in range(64):
            chunk = f.read(4096)
            if not chunk:
                break
            out += d.decompress(chunk, n - len(out))
            if len(out) >= n or d.eof:
                break
            while d.unconsumed_tail and len(out) < n:
                out += d.decompress(d.unconsumed_tail, n - len(out))
    return out


def _zip_members(store: _Store, path: str, size: int) -> Tuple[Optional[List[str]], str]:
    """The member names of a zip, or (None, why) when its central directory is missing or too
    long to parse (a bomb of a member list is refused from its end record, before zipfile)."""
    tail_len = min(size, (1 << 16) + 22)
    tail = store.read_range(path, size - tail_len, tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None, "no zip end record (truncated?)"
    cd_size = struct.unpack_from("<I", tail, at + 12)[0]
    if cd_size == 0xFFFFFFFF:  # zip64: the size is in the zip64 end record, before the end record's locator
        at64 = tail.rfind(b"PK\x06\x06", 0, at)
        if at64 < 0 or at64 + 48 > len(tail):
            return None, "a zip64 archive whose zip64 end record is not where it belongs"
        cd_size = struct.unpack_from("<Q", tail, at64 + 40)[0]
    if cd_size > MAX_ZIP_DIRECTORY:
        return None, f"its member list is {cd_size:,} bytes long, more than is read here"
    try:
        with store.open(path) as f, zipfile.ZipFile(f) as zf:
            infos = zf.infolist()
            if sum(len(i.filename) for i in infos) > MAX_ZIP_DIRECTORY:
                return None, "its member list is longer than is read here"
            return [i.filename for i in infos], ""
    except Exception as exc:  # BadZipFile, a zip64 record that lies, ...
        return None, f"the zip does not open ({_short(exc)})"


def _npz_arrays(store: _Store, path: str, names: Sequence[str]) -> Tuple[Dict[str, Dict[str, Any]], str]:
    """shape and dtype of the first few .npy members, each from its first bytes only."""
    arrays: Dict[str, Dict[str, Any]] = {}
    try:
        with store.open(path) as f, zipfile.ZipFile(f) as zf:
            for name in [n for n in names if n.endswith(".npy")][:16]:
                with zf.open(name) as member:
                    head = member.read(HEAD)
                sniff = _npy_sniff(head, zf.getinfo(name).file_size)
                if sniff.damaged:
                    return arrays, f"member {name}: {sniff.damaged}"
                arrays[name[:-4]] = sniff.info
    except Exception as exc:
        return arrays, f"a member does not read ({_short(exc)})"
    return arrays, ""


def _sniff(store: _Store, e: _Entry) -> _Sniff:
    try:
        return _sniff_unsafe(store, e)
    except Exception as exc:  # an unreadable file, or a parser surprised by hostile bytes
        return _Sniff(_hint(e) or "other", f"unreadable ({_short(exc)})")


def _hint(e: _Entry) -> Optional[str]:
    """The kind ``e``'s name claims."""
    return _HINTS.get("tgz" if e.ext == "tar.gz" else e.ext)


def _sniff_unsafe(store: _Store, e: _Entry) -> _Sniff:
    hint = _hint(e)
    size = e.size
    if e.name == "lock.mdb":
        return _Sniff("lmdb", info={"lock": True})
    with store.open(e.path) as f:
        head = f.read(HEAD)
        tail = b""
        if size >= 8:
            f.seek(max(0, size - 8))
            tail = f.read(8)
    if not head:
        return _Sniff(hint or "other", "empty file" if hint else "")
    if head.startswith(_NPY_MAGIC):
        return _npy_sniff(head, size)
    if head.startswith(_HDF5_MAGIC):
        return _Sniff("hdf5")
    if head.startswith(b"PAR1"):
        if tail.endswith(b"PAR1") and size >= 12:
            footer = struct.unpack("<I", tail[:4])[0]
            if footer + 12 > size:
                return _Sniff("parquet", f"the footer length ({footer:,}) is longer than the file")
            return _Sniff("parquet", info={"footer": footer})
        return _Sniff("parquet", "truncated: no PAR1 footer at the end")
    if head.startswith(b"ARROW1"):
        if not tail.endswith(b"ARROW1"):
            return _Sniff("arrow", "truncated: no ARROW1 magic at the end", {"ipc": "file"})
        return _Sniff("arrow", info={"ipc": "file"})
    if head.startswith(b"\xff\xff\xff\xff") and len(head) >= 8:
        meta = struct.unpack_from("<i", head, 4)[0]
        if 0 < meta <= size - 8 and (hint == "arrow" or _arrow_stream_ok(store, e.path)):
            return _Sniff("arrow", info={"ipc": "stream"})
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _zip_sniff(store, e, hint)
    if head.startswith(b"\x1f\x8b"):
        inner = _gzip_head(store, e.path)
        if _tar_header_ok(inner):
            return _Sniff("webdataset", info={"gzip": True})
        if hint == "webdataset":
            return _Sniff("webdataset", "gzip data that does not hold a tar archive", {"gzip": True})
        return _Sniff("other")
    if _tar_header_ok(head):
        return _Sniff("webdataset")
    if e.name == "data.mdb" or _lmdb_meta_page(head):
        return _lmdb_sniff(head)
    if len(head) >= 12:
        length, crc = struct.unpack_from("<QI", head)
        if crc == masked_crc32c(head[:8]):
            if length + 16 > size:
                return _Sniff("tfrecord", f"truncated: the first record declares {length:,} bytes")
            return _Sniff("tfrecord", info={"first_record": length})
    if len(head) > 2 and head[0] == 0x80 and 2 <= head[1] <= 5 and chr(head[2]) in pickletools.code2op:
        return _Sniff("pickle", _pickle_damage(head, size), info={"protocol": head[1]})
    if size > 512:
        at = _hdf5_userblock(store, e.path, size)
        if at:
            return _Sniff("hdf5", info={"userblock": at})
    if hint == "pickle" and head[:1] in _TEXT_PICKLE_STARTS:
        # the old protocols have no magic: their opcodes must parse
        return _Sniff("pickle", _pickle_damage(head, size), info={"protocol": "0 or 1"})
    if hint == "webdataset" and len(head) >= 1024 and not head.strip(b"\0"):
        return _Sniff("webdataset", "an empty tar archive (only end-of-archive blocks)")
    if hint:
        return _Sniff(hint, f"named .{e.ext} but its content is not {NAMES.get(hint, hint)}")
    return _Sniff("other")


def _arrow_stream_ok(store: _Store, path: str) -> bool:
    pa = optional_import("pyarrow")
    if pa is None:
        return False
    try:
        with store.open(path) as f:
            pa.ipc.open_stream(f).schema
        return True
    except Exception:
        return False


def _zip_sniff(store: _Store, e: _Entry, hint: Optional[str]) -> _Sniff:
    names, why = _zip_members(store, e.path, e.size)
    if names is None:
        if hint is None:
            return _Sniff("other")  # some other zip: the scanner takes it as a file like any other
        return _Sniff(hint, f"a damaged zip archive: {why}")
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return _Sniff("pickle", info={"torch_zip": True})
    npys = [n for n in names if n.endswith(".npy")]
    if npys and len(npys) == len([n for n in names if not n.endswith("/")]):
        arrays, why = _npz_arrays(store, e.path, names)
        return _Sniff("npz", why, {"arrays": arrays, "members": len(npys)})
    if hint == "npz":
        return _Sniff("npz", "a zip archive without .npy members")
    return _Sniff("other")


def _lmdb_meta_page(head: bytes) -> bool:
    """LMDB's first page, by content: P_META in the page flags, the meta magic after the header
    (an environment opened with MDB_NOSUBDIR has no data.mdb name to go by)."""
    return (len(head) >= 20 and struct.unpack_from("<H", head, 10)[0] & 0x08 != 0
            and struct.unpack_from("<I", head, 16)[0] == _LMDB_MAGIC)


def _lmdb_sniff(head: bytes) -> _Sniff:
    """LMDB's meta pages: MDB_meta (magic 0xBEEFC0DE) after the 16-byte page header of 64-bit
    builds (12 on 32-bit ones); two meta pages, the later transaction current."""
    for hdr in (16, 12):
        if len(head) >= hdr + 4 and struct.unpack_from("<I", head, hdr)[0] == _LMDB_MAGIC:
            break
    else:
        return _Sniff("lmdb", "data.mdb without the LMDB meta-page magic")
    if hdr != 16:
        return _Sniff("lmdb", info={"entries": None, "note": "a 32-bit LMDB"})
    psize = struct.unpack_from("<I", head, 16 + 24)[0]  # the free DB's md_pad holds the page size
    best = None
    for page in (0, psize):
        m = page + 16
        if m + 136 <= len(head) and struct.unpack_from("<I", head, m)[0] == _LMDB_MAGIC:
            entries = struct.unpack_from("<Q", head, m + 24 + 48 + 32)[0]  # mm_dbs[MAIN_DBI].md_entries
            txnid = struct.unpack_from("<Q", head, m + 128)[0]
            if best is None or txnid >= best[0]:
                best = (txnid, entries)
    return _Sniff("lmdb", info={"entries": best[1] if best else None, "page_size": psize})


def _hdf5_userblock(store: _Store, path: str, size: int) -> int:
    """HDF5's signature after a user block: at 512, 1024, 2048, ... bytes."""
    at = 512
    with store.open(path) as f:
        while at + 8 <= size:
            f.seek(at)
            if f.read(8) == _HDF5_MAGIC:
                return at
            at *= 2
    return 0


# ---------------------------------------------------------------------------------------------
# the dominant kind's files, read further

def _h5_summary(store: _Store, path: str) -> Tuple[Dict[str, Any], str]:
    h5py = optional_import("h5py")
    if h5py is None:
        return {}, ""
    datasets: List[Dict[str, Any]] = []
    try:
        with contextlib.ExitStack() as stack:
            target = path if store.fs is None else stack.enter_context(store.open(path))
            f = stack.enter_context(h5py.File(target, "r"))

            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    datasets.append({"name": name, "shape": tuple(int(n) for n in (obj.shape or ())),
                                     "dtype": str(obj.dtype), "chunks": obj.chunks, "compression": obj.compression})
                return None if len(datasets) < MAX_H5_DATASETS else True
            f.visititems(visit)
            attrs = {k: f.attrs[k] for k in ("dsconvert_format",) if k in f.attrs}
    except Exception as exc:  # OSError "file signature not found", "truncated file", ...
        return {}, f"h5py cannot open it ({_short(exc)})"
    return {"datasets": datasets, "attrs": {k: str(v) for k, v in attrs.items()}}, ""


class _Budget(Exception):
    """A bounded read reached its bound: the count so far is a part, not an error."""


class _Guard(io.RawIOBase):
    """A file as tarfile sees it, bounded: no single read over ``max_read`` (a PAX or GNU
    long-name header that declares gigabytes), no more than ``budget`` bytes read in all, no
    seek past ``max_seek`` (a gzip stream seeks forward by inflating)."""

    def __init__(self, f: Any, max_read: int, budget: int, max_seek: Optional[int] = None):
        self.f, self.max_read, self.budget, self.max_seek = f, max_read, budget, max_seek
        self.done = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.max_read:  # damage, not a bound reached
            raise OSError(f"a header declares {'all' if n is None or n < 0 else f'{n:,}'} bytes of header data")
        if self.done + n > self.budget:
            raise _Budget("the read budget")
        data = self.f.read(n)
        self.done += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(min(len(b), self.max_read))
        b[:len(data)] = data
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0 and self.max_seek is not None and pos > self.max_seek:
            raise _Budget("the seek budget")
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        return self.f.tell()


def _tar_keys(store: _Store, path: str, gz: bool) -> Tuple[Dict[str, Any], str]:
    """Samples (consecutive member names grouped by key, as webdataset groups them) and fields,
    from the tar headers: a plain tar is read by seeking from header to header; a gzipped one
    is inflated up to GZ_TAR_BUDGET compressed bytes (and TAR_INFLATE_BUDGET inflated), and
    counted in proportion when it goes on."""
    import gzip

    samples = 0
    fields: Counter = Counter()
    keys: set = set()
    last = None
    members = 0
    complete = True
    fraction = 1.0
    why = ""
    with store.open(path) as raw:
        size = raw.seek(0, 2)
        raw.seek(0)
        if gz:
            counted = _Guard(raw, 1 << 20, GZ_TAR_BUDGET)
            source: Any = _Guard(gzip.GzipFile(fileobj=counted, mode="rb"), 1 << 20, 1 << 40, TAR_INFLATE_BUDGET)
        else:
            source = _Guard(raw, 1 << 20, TAR_HEADER_BUDGET)
        try:
            tf = tarfile.open(fileobj=source, mode="r:")
            while True:
                m = tf.next()
                if m is None:
                    break
                tf.members = []  # headers only: no member list kept
                members += 1
                if m.isfile():
                    key, field_ = _wds_key(m.name)
                    if key != last:
                        samples += 1
                        last = key
                        keys.add(key)
                    fields[field_] += 1
                if members >= MAX_TAR_MEMBERS:
                    raise _Budget("the member count")
        except _Budget:
            complete = False
            fraction = raw.tell() / max(1, size)
        except Exception as exc:  # ReadError on a damaged header, EOFError on a truncated member
            why = f"the tar breaks after {members:,} members ({_short(exc)})"
    return {"samples": samples, "fields": dict(fields), "members": members, "complete": complete and not why,
            "fraction": fraction, "split": samples - len(keys)}, why


def _wds_key(name: str) -> Tuple[str, str]:
    """webdataset's base_plus_ext: the key is the path up to the first dot of the basename."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (ext.lower() if dot else "")


def _parquet_meta(store: _Store, path: str) -> Tuple[Dict[str, Any], str]:
    pq = optional_import("pyarrow.parquet")
    if pq is None:
        return {}, ""
    try:
        with store.open(path) as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - 8))
            footer = struct.unpack("<I", f.read(8)[:4])[0]
            if footer > MAX_FOOTER:
                return {"rows": None, "columns": [f"(a {footer:,}-byte footer, not read here)"]}, ""
            f.seek(0)
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
            return {"rows": int(meta.num_rows), "row_groups": int(meta.num_row_groups),
                    "columns": [_arrow_field(fl) for fl in schema]}, ""
    except Exception as exc:
        return {}, f"pyarrow cannot read its footer ({_short(exc)})"


def _arrow_field(fl: Any) -> str:
    t = fl.type
    if hasattr(t, "num_fields") and t.num_fields and str(t).startswith("struct"):
        return f"{fl.name}{{{','.join(t.field(i).name for i in range(t.num_fields))}}}"
    return fl.name


def _arrow_meta(store: _Store, path: str, ipc: str) -> Tuple[Dict[str, Any], str]:
    pa = optional_import("pyarrow")
    if pa is None:
        return {}, ""
    try:
        if ipc == "file" and store.fs is None:
            with pa.memory_map(path) as source:  # batches mapped, not read: their lengths come from metadata
                reader = pa.ipc.open_file(source)
                rows = sum(reader.get_batch(i).num_rows for i in range(min(reader.num_record_batches, 100_000)))
                exact = reader.num_record_batches <= 100_000
                return {"rows": rows if exact else None, "columns": [_arrow_field(fl) for fl in reader.schema]}, ""
        if ipc == "file":  # remote: a batch's length would cost reading the batch
            with store.open(path) as f:
                return {"rows": None, "columns": [_arrow_field(fl) for fl in pa.ipc.open_file(f).schema]}, ""
        with store.open(path) as f:
            schema = pa.ipc.open_stream(f).schema  # rows: only by reading every batch, so not here
            return {"rows": None, "columns": [_arrow_field(fl) for fl in schema]}, ""
    except Exception as exc:
        return {}, f"pyarrow cannot read it ({_short(exc)})"


def _tfrecord_first(store: _Store, path: str, length: int) -> str:
    """Check the first record's data CRC where it is small; '' when it holds."""
    if length > 1 << 16:
        return ""
    with store.open(path) as f:
        f.seek(12)
        data = f.read(length)
        crc = f.read(4)
    if len(data) < length or len(crc) < 4:
        return "truncated first record"
    if struct.unpack("<I", crc)[0] != masked_crc32c(data):
        return "the first record's data CRC does not match"
    return ""


# ---------------------------------------------------------------------------------------------
# putting it together

def detect(path: str, fs: Any = None) -> Detected:
    """What ``path`` holds (a local path, or a path within ``fs``, an fsspec file system), from
    headers: see the module doc. Never raises."""
    store = _Store(fs)
    try:
        kind, size = store.info(path)
    except Exception as exc:
        return Detected(path, "unknown", f"cannot read {path}: {_short(exc)}")
    try:
        if kind == "dir":
            return _detect_folder(store, path)
        if kind != "file":
            return Detected(path, "unknown", f"{path} is not a regular file or folder")
        name = posixpath.basename(path.rstrip("/")) if fs is not None else os.path.basename(path)
        folder = path.rstrip("/").rsplit("/", 1)[0] if fs is not None else os.path.dirname(os.path.abspath(path))
        if name == MANIFEST_NAME:  # the manifest names its folder
            return _detect_folder(store, folder)
        found = _detect_entries(store, path, [_Entry(name, path, size)], _Walk(), single=True)
        try:
            store.info(store.join(folder, MANIFEST_NAME))
        except Exception:
            return found
        found.description += f"; one file of the dsconvert output in {folder} (read it whole with dsconvert.open_dataset)"
        return found
    except Exception as exc:  # a bug's last line of defence: say so rather than crash analyze
        return Detected(path, "unknown", f"could not be recognised ({type(exc).__name__}: {_short(exc)})")


def _detect_folder(store: _Store, root: str) -> Detected:
    walk = _walk(store, root)
    top = [e for e in walk.entries if "/" not in e.rel]
    if any(e.name == MANIFEST_NAME for e in top):
        found = _dsconvert(store, root, walk)
        if found is not None:
            return found
    nested = [e.rel.rsplit("/", 1)[0] for e in walk.entries if e.name == MANIFEST_NAME and "/" in e.rel]
    if nested:
        return _nested_outputs(store, root, walk, sorted(nested)[:MAX_NESTED])
    return _detect_entries(store, root, walk.entries, walk)


def _nested_outputs(store: _Store, root: str, walk: _Walk, folders: List[str]) -> Detected:
    """Outputs in subfolders (train/ and val/, say): each named by its manifest, the rest by content,
    and the one holding more bytes is the answer."""
    outs: List[Tuple[str, Detected]] = []
    rest = list(walk.entries)
    for folder in folders:
        if any(folder.startswith(f + "/") for f, _ in outs):
            continue  # an output copied inside another: that one's stray files
        prefix = folder + "/"
        sub = _Walk([_Entry(e.rel[len(prefix):], e.path, e.size) for e in rest if e.rel.startswith(prefix)],
                    complete=walk.complete)
        found = _dsconvert(store, store.join(root, folder), sub)
        if found.kind != "dsconvert":
            continue  # a manifest that does not load: its files are judged by content with the rest
        outs.append((folder, found))
        rest = [e for e in rest if not e.rel.startswith(prefix)]
    if not outs:
        return _detect_entries(store, root, walk.entries, walk)
    inside = sum(e.size for e in walk.entries) - sum(e.size for e in rest)
    names = ", ".join(f"{f} ({d.format}, {d.num_samples:,} samples)" for f, d in outs)
    if rest and sum(e.size for e in rest) > inside:
        found = _detect_entries(store, root, rest, walk)
        found.others["dsconvert"] = len(outs)
        found.description += f"; also {len(outs):,} dsconvert output{'s' if len(outs) != 1 else ''}: {names}"
        return found
    formats = {d.format for _, d in outs}
    n = len(outs)
    found = Detected(
        root, "dsconvert", f"{n:,} dsconvert output{'s' if n != 1 else ''} in subfolders: {names}",
        files=[f for _, d in outs for f in d.files], num_samples=sum(d.num_samples or 0 for _, d in outs),
        reader=READERS["dsconvert"], format=formats.pop() if len(formats) == 1 else None,
        advice=outs[0][1].advice, damaged=[f"{f}/{x}" for f, d in outs for x in d.damaged],
        complete=walk.complete, details={"outputs": {f: d.to_dict() for f, d in outs}})
    if rest:
        kinds = Counter(_plain(k) for k in _classify_all(store, rest)[0].values())
        found.others = dict(kinds)
        found.description += ("; also " + ", ".join(_count(c, k) for k, c in sorted(kinds.items()))
                              + f" ({_names(rest)})")
    return found


def _dsconvert(store: _Store, root: str, walk: _Walk) -> Detected:
    mpath = store.join(root, MANIFEST_NAME)
    entry = next(e for e in walk.entries if e.rel == MANIFEST_NAME)
    try:
        if entry.size > MAX_MANIFEST:
            raise ValueError(f"{entry.size:,} bytes, more than a manifest holds")
        with store.open(mpath) as f:
            m = Manifest.from_dict(json.loads(f.read(MAX_MANIFEST + 1)), where=mpath)
    except Exception as exc:  # ManifestError, JSON errors, RecursionError...
        found = _detect_entries(store, root, [e for e in walk.entries if e.rel != MANIFEST_NAME], walk)
        found.description = f"{found.description}; beside a {MANIFEST_NAME} that is not a valid manifest ({_short(exc)})"
        found.damaged.append(f"{MANIFEST_NAME}: {_short(exc)}")
        return found
    names = {e.rel for e in walk.entries}
    own = set(m.own_files())
    for s in m.shards:
        own.add(s.name)
        own.update(p for p in [s.index, *s.parts] if p)
    shard_files = [store.join(root, s.name) for s in m.shards]
    missing = [s.name for s in m.shards if s.name not in names]
    stray = [e for e in walk.entries if e.rel not in own]
    fmt = m.format
    parts = [f"a dsconvert {fmt} output: {m.num_samples:,} samples in {len(m.shards):,} "
             f"shard{'s' if len(m.shards) != 1 else ''}", _stored(m)]
    if missing:
        parts.append(f"{len(missing):,} shard{'s' if len(missing) != 1 else ''} listed in the manifest "
                     f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    others: Dict[str, int] = {}
    if stray:
        kinds = Counter(_plain(k) for k in _classify_all(store, stray)[0].values())
        others = dict(kinds)
        parts.append(f"also {len(stray):,} file{'s' if len(stray) != 1 else ''} not in the manifest ("
                     + ", ".join(_count(n, k) for k, n in sorted(kinds.items()))
                     + f": {_names(stray)})")
    return Detected(
        root, "dsconvert", ", ".join(p for p in parts if p), files=shard_files, num_samples=m.num_samples,
        reader=READERS["dsconvert"], convertible=False, format=fmt, others=others,
        damaged=[f"{n}: missing" for n in missing], complete=walk.complete,
        advice=("already converted: read it with dsconvert.open_dataset(path) (`dsconvert verify` checks it); "
                "converting it again would not make reading faster"),
        details={"fields": m.fields, "classes": len(m.classes) if m.classes is not None else None,
                 "stored": m.stored, "options": {k: m.options.get(k) for k in ("size", "resize", "decode")}},
    )


def _stored(m: Manifest) -> str:
    classes = f", {len(m.classes):,} classes" if m.classes else ""
    if m.stored == "decoded":
        size, resize = m.options.get("size"), m.options.get("resize")
        if size:
            geometry = f"{size[0]}x{size[1]} uint8 RGB"
        elif resize:
            geometry = f"uint8 RGB, short side {resize}"
        else:
            geometry = "uint8 RGB at the source's sizes"
        return geometry + classes
    fields = "+".join(sorted(m.fields)) or "no fields"
    return f"encoded {fields}{classes}"


def _classify_all(store: _Store, entries: Sequence[_Entry]) -> Tuple[Dict[str, str], Dict[str, _Sniff]]:
    """kind of every entry: the files sniffed (up to SNIFF_PER_GROUP per extension, MAX_SNIFF in
    all, spread over each group) by content, the rest as the majority of their extension."""
    groups: Dict[str, List[_Entry]] = {}
    for e in entries:
        groups.setdefault(e.ext, []).append(e)
    sniffs: Dict[str, _Sniff] = {}
    budget = MAX_SNIFF
    for ext in sorted(groups, key=lambda x: -len(groups[x])):
        group = groups[ext]
        if ext in ("mdb",):
            pick = group  # LMDB's two files are read together
        elif is_image_field(ext) and len(group) > 2:
            pick = [group[0], group[-1]]  # images are taken by name, as the scanner takes them
        else:
            n = min(len(group), SNIFF_PER_GROUP, max(0, budget))
            pick = [group[i * len(group) // n] for i in range(n)]
        for e in pick:
            sniffs[e.rel] = _sniff(store, e)
        budget -= len(pick)
    kinds: Dict[str, str] = {}
    for ext, group in groups.items():
        seen = Counter(sniffs[e.rel].kind for e in group if e.rel in sniffs)
        majority = seen.most_common(1)[0][0] if seen else None
        for e in group:  # past the budget, a file is what its name says
            kinds[e.rel] = sniffs[e.rel].kind if e.rel in sniffs else majority or _hint(e) or "other"
    return kinds, sniffs


def _detect_entries(store: _Store, root: str, entries: List[_Entry], walk: _Walk,
                    single: bool = False) -> Detected:
    if not entries:
        why = "an empty folder" if not walk.unreadable else f"an unreadable folder ({walk.unreadable[0]})"
        if walk.outside_links:
            why += f" (symlinks out of the tree not followed: {', '.join(walk.outside_links[:3])})"
        return Detected(root, "unknown", why, complete=walk.complete)
    kinds, sniffs = _classify_all(store, entries)
    weight: Counter = Counter()
    count: Counter = Counter()
    for e in entries:
        k = kinds[e.rel] = _plain(kinds[e.rel])
        weight[k] += max(1, e.size)
        count[k] += 1
    dominant = weight.most_common(1)[0][0]
    mine = [e for e in entries if kinds[e.rel] == dominant]
    others = {k: n for k, n in count.items() if k != dominant}
    damaged = [f"{e.rel}: {sniffs[e.rel].damaged}" for e in entries if e.rel in sniffs and sniffs[e.rel].damaged]
    found = _describe(store, root, dominant, mine, sniffs, walk, single)
    found.others = others
    found.damaged = damaged + found.damaged
    found.complete = walk.complete
    extra = []
    if others:
        extra.append("also " + ", ".join(_count(n, k) for k, n in sorted(others.items())))
    rels = {e.rel for e in mine}
    bad = sorted({d.split(": ", 1)[0] for d in found.damaged if d.split(": ", 1)[0] in rels})
    if bad and "damaged" not in found.description:
        first = next(d for d in found.damaged if d.split(": ", 1)[0] in rels)
        read = sum(1 for e in mine if e.rel in sniffs)
        extra.append(f"{len(bad):,} of the {read:,} files read {'is' if len(bad) == 1 else 'are'} damaged "
                     f"({first}{'; ...' if len(bad) > 1 else ''})")
    if not walk.complete:
        extra.append(f"only the first {MAX_ENTRIES:,} entries of the folder were listed")
    if walk.outside_links:
        extra.append(f"{len(walk.outside_links):,} symlinks out of the tree not followed")
    if extra:
        found.description += "; " + "; ".join(extra)
    return found


def _describe(store: _Store, root: str, kind: str, mine: List[_Entry], sniffs: Dict[str, _Sniff], walk: _Walk,
              single: bool) -> Detected:
    files = [e.path for e in mine]
    n = len(mine)
    nfiles = f"{n:,} file{'s' if n != 1 else ''}"
    read = [sniffs[e.rel] for e in mine if e.rel in sniffs]
    good = [(e, sniffs[e.rel]) for e in mine if e.rel in sniffs and not sniffs[e.rel].damaged]
    d = Detected(root, kind, "", files=files, reader=READERS[kind])
    if good == [] and read and kind not in ("files", "unknown"):
        d.description = (f"a damaged {FILE_LABELS[kind]} file: {read[0].damaged}" if n == 1 else
                         f"{_count(n, kind)}, damaged ({read[0].damaged})")
        d.advice = "the files are damaged: regenerate or re-download them"
        return d
    if kind == "npy":
        _describe_npy(d, mine, good, nfiles, single)
    elif kind == "npz":
        arrays = good[0][1].info.get("arrays", {}) if good else {}
        listing = ", ".join(f"{k} {_shape(v['shape'])} {v['dtype']}" for k, v in list(arrays.items())[:4])
        d.description = f"{'an .npz archive' if single else f'.npz archives: {nfiles}'}" + (
            f": arrays {listing}" if listing else "")
        firsts = {v["shape"][0] for v in arrays.values() if v["shape"]}
        if single and len(firsts) == 1:
            d.num_samples = firsts.pop()
        d.advice = ("np.load on an .npz reads (and for savez_compressed inflates) a whole array on each access and "
                    "cannot memory-map it: store the arrays with np.save and read them with np.load(mmap_mode='r')")
    elif kind == "hdf5":
        _describe_hdf5(store, d, mine, good, nfiles, single)
    elif kind == "webdataset":
        _describe_tar(store, d, mine, good, n)
    elif kind == "parquet":
        _describe_table(store, d, mine, good, nfiles, "Parquet", _parquet_meta)
        d.advice = ("columnar row groups: read with pyarrow.parquet (iter_batches) or datasets.load_dataset('parquet'); "
                    "random access decodes a whole row group, so keep row groups small for shuffled reads; dsconvert "
                    "shard takes Parquet with an image column as a source (--label names the label column)")
    elif kind == "arrow":
        ipc = {e.path: s.info.get("ipc", "file") for e, s in good}
        _describe_table(store, d, mine, good, nfiles, "Arrow IPC", lambda st, p: _arrow_meta(st, p, ipc[p]))
        d.advice = ("memory-mappable: datasets.Dataset.from_file / pyarrow.memory_map read it without copying; "
                    "conversion would not make reading faster")
        names = {e.name for e in walk.entries if "/" not in e.rel}
        if {"state.json", "dataset_info.json"} <= names:
            d.description = "a Hugging Face datasets folder (save_to_disk): " + d.description
            d.reader = "datasets.load_from_disk"
    elif kind == "lmdb":
        data = [(e, s) for e, s in good if e.name == "data.mdb"]
        entries = [s.info.get("entries") for _, s in data]
        envs = len(data)
        if envs and all(isinstance(x, int) for x in entries):
            d.num_samples = sum(entries)
        d.files = [e.path for e, _ in data] or files
        has_lock = any(e.name == "lock.mdb" for e in mine)
        d.description = (f"LMDB: {envs or 'no'} environment{'s' if envs != 1 else ''} (data.mdb"
                         f"{' + lock.mdb' if has_lock else ', no lock.mdb'}, meta-page magic checked)"
                         + (f", {d.num_samples:,} entries in the main database" if d.num_samples is not None else ""))
        d.advice = ("key-value pages read by mmap: open the environment in each DataLoader worker (readonly=True, "
                    "lock=False); random reads are fast while the data fits the page cache")
    elif kind == "tfrecord":
        bad = ""
        if good:
            bad = _tfrecord_first(store, good[0][0].path, good[0][1].info.get("first_record", 0))
        d.description = f"TFRecord: {nfiles} (first record's length CRC checked" + (
            f"; {good[0][0].rel}: {bad})" if bad else ")")
        if bad:
            d.damaged.append(f"{good[0][0].rel}: {bad}")
        d.advice = ("sequential record files: read with tf.data.TFRecordDataset or the tfrecord package (with an index "
                    "for random access); dsconvert cannot take them as a source")
    elif kind == "pickle":
        torch = any(s.info.get("torch_zip") for _, s in good)
        d.description = (f"{'a pickle' if single else f'pickles: {nfiles}'}"
                         + (" (torch.save zip archives)" if torch else "") + "; not unpickled (it runs code)")
        d.advice = ("pickled samples run code when loaded and are slow to unpickle: store arrays with np.save/np.savez "
                    "(or convert the original files with dsconvert shard)")
    elif kind == "files":
        _describe_files(store, root, d, mine, walk, single)
    else:
        d.description = f"{'a file' if single else nfiles} of no format recognised here"
    return d


def _describe_npy(d: Detected, mine: List[_Entry], good: List[Tuple[_Entry, _Sniff]], nfiles: str,
                  single: bool) -> None:
    infos = [s.info for _, s in good]
    objects = any(i.get("object") for i in infos)
    if single and infos:
        i = infos[0]
        d.description = f"an .npy array: {_shape(i['shape'])} {i['dtype']}"
        d.num_samples = i["shape"][0] if i["shape"] else None
    else:
        shapes = Counter((i["shape"], i["dtype"]) for i in infos)
        if len(shapes) == 1:
            (shape, dtype), = shapes
            d.description = f"a folder of .npy arrays: {nfiles}, each {_shape(shape)} {dtype}"
            if len(good) == len(mine):  # one sample per file, every file read
                d.num_samples = len(mine)
            else:
                d.estimated_samples = len(mine)
        else:
            firsts = {i["shape"][0] for i in infos if i["shape"]}
            listing = ", ".join(f"{e.name} {_shape(s.info['shape'])} {s.info['dtype']}" for e, s in good[:4])
            d.description = f"a folder of .npy arrays: {nfiles} ({listing}{', ...' if len(good) > 4 else ''})"
            if len(firsts) == 1 and len(good) == len(mine):  # X (N, ...) and y (N,): N samples
                d.num_samples = firsts.pop()
    if any("'offset'" in i["dtype"] and "'height'" in i["dtype"] for i in infos):
        d.description += ("; the samples tables of dsconvert npy shards, without their manifest "
                          "(an unfinished conversion or copied shards)")
    if objects:
        d.description += "; holds pickled Python objects (dtype object)"
        d.advice = ("object arrays are pickles (loading them runs code and is slow): store numeric arrays with np.save, "
                    "read with np.load(mmap_mode='r')")
    else:
        d.advice = ("already decoded arrays: read with np.load(mmap_mode='r') in the workers; conversion would not "
                    "make reading faster")


def _read_details(store: _Store, d: Detected, good: List[Tuple[_Entry, _Sniff]], read: Any) -> List[Dict[str, Any]]:
    """What ``read(store, path)`` -> (details, why not) gives for the first few good files; a
    file it cannot read is noted as damaged."""
    found = []
    for e, _ in good[:MAX_DETAIL]:
        details, why = read(store, e.path)
        if why:
            d.damaged.append(f"{e.rel}: {why}")
        elif details:
            found.append(details)
    return found


def _describe_hdf5(store: _Store, d: Detected, mine: List[_Entry], good: List[Tuple[_Entry, _Sniff]],
                   nfiles: str, single: bool) -> None:
    summaries = _read_details(store, d, good, _h5_summary)
    head = "an HDF5 file" if single else f"HDF5: {nfiles}"
    if not summaries:
        d.description = head + (f", damaged ({d.damaged[0].split(': ', 1)[1]})" if d.damaged else "")
        d.advice = "h5py cannot open it: regenerate or re-download it" if d.damaged else ""
        return
    sets = summaries[0]["datasets"]
    main = sorted(sets, key=lambda s: -_prod(s["shape"]))
    text = []
    for s in main[:3]:
        chunked = f" chunked {_shape(s['chunks'])}" if s["chunks"] else " contiguous"
        comp = f", {s['compression']}" if s["compression"] else ""
        text.append(f"'{s['name']}' {_shape(s['shape'])} {s['dtype']}{chunked}{comp}")
    more = f" (+{len(sets) - 3} more)" if len(sets) > 3 else ""
    noun = "dataset" if len(sets) == 1 else "datasets"
    d.description = f"{head}: {noun} {', '.join(text) or 'none'}{more}" + ("" if single else " (first file)")
    firsts = [{s["shape"][0] for s in sm["datasets"] if s["shape"]} for sm in summaries]
    if all(len(f) == 1 for f in firsts) and firsts:
        total = sum(f.pop() for f in firsts)
        if len(summaries) == len(mine):
            d.num_samples = total
        else:
            d.estimated_samples = total * len(mine) // len(summaries)
    if summaries[0]["attrs"].get("dsconvert_format"):
        d.description += "; written by dsconvert, without its manifest (an unfinished conversion or a copied shard)"
    notes = []
    big = main[0] if main else None
    if big and big["chunks"] and big["shape"] and big["chunks"][0] > 1:
        notes.append(f"a random read of one sample reads a whole chunk of {big['chunks'][0]}")
    if big and big["compression"] == "gzip":
        notes.append("gzip chunks cost CPU on every read (lzf or none reads faster)")
    d.advice = ("read with h5py, opening the file in each DataLoader worker (not before the fork)"
                + (f"; {'; '.join(notes)}" if notes else ""))


def _describe_tar(store: _Store, d: Detected, mine: List[_Entry], good: List[Tuple[_Entry, _Sniff]], n: int) -> None:
    counted = []
    fields: Counter = Counter()
    exact = True
    split = 0  # keys met again after another key: webdataset yields each run as its own sample
    for e, s in good[:MAX_DETAIL]:
        keys, why = _tar_keys(store, e.path, bool(s.info.get("gzip")))
        if why:
            d.damaged.append(f"{e.rel}: {why}")
            exact = False
        if not keys["complete"]:
            exact = False
        share = keys["fraction"] if keys["fraction"] > 0 else 1.0
        counted.append(keys["samples"] / share if not keys["complete"] and not why else keys["samples"])
        fields.update(keys["fields"])
        split += keys["split"]
    gz = sum(1 for _, s in good if s.info.get("gzip"))
    what = "tar.gz" if gz == len(good) and gz else "tar"
    desc = f"WebDataset shards: {n:,} {what} file{'s' if n != 1 else ''}"
    if counted:
        total = sum(counted) * n / len(counted)
        if exact and len(counted) == n:
            d.num_samples = int(total)
            desc += f", {int(total):,} samples"
        else:
            d.estimated_samples = int(round(total))
            desc += f", ~{int(round(total)):,} samples"
        kinds = "+".join(f for f, _ in fields.most_common(6) if f) or "no fields"
        desc += f" of {kinds} (keys from tar headers)"
        if split:
            desc += (f"; {split:,} keys recur after other keys' members, and webdataset yields each run as a "
                     "separate sample (write members sorted by key)")
    d.description = desc
    d.advice = ("already sharded for sequential reads: read them in place with open_dataset(FOLDER) (indexed by their "
                "headers on first open; label='cls' for (image, label) samples) or webdataset.WebDataset; dsconvert "
                "shard takes them as a source (--label names the class field)" if not gz else
                "gzip-compressed tars are read only as streams (webdataset.WebDataset): decompress them for dsconvert's "
                "indexed reader and for dsconvert shard")


def _describe_table(store: _Store, d: Detected, mine: List[_Entry], good: List[Tuple[_Entry, _Sniff]],
                    nfiles: str, name: str, meta_of: Any) -> None:
    unavailable = optional_import("pyarrow") is None
    metas = _read_details(store, d, good, meta_of)
    desc = f"{name}: {nfiles}"
    if metas:
        rows = [m.get("rows") for m in metas]
        if all(isinstance(r, int) for r in rows):
            if len(metas) == len(mine):
                d.num_samples = sum(rows)
                desc += f", {d.num_samples:,} rows"
            else:
                d.estimated_samples = sum(rows) * len(mine) // len(metas)
                desc += f", ~{d.estimated_samples:,} rows"
        else:
            desc += ", rows unknown from the header"
        desc += f", columns {', '.join(metas[0]['columns'][:8])}"
    elif unavailable:
        desc += ", rows unknown (pyarrow is not installed to read the footer)"
    d.description = desc


def _describe_files(store: _Store, root: str, d: Detected, mine: List[_Entry], walk: _Walk, single: bool) -> None:
    from ..source import scan

    exts = Counter(e.ext or "(none)" for e in mine)
    kinds = ", ".join(f"{n:,} {x}" for x, n in exts.most_common(4)) + (", ..." if len(exts) > 4 else "")
    n = len(mine)
    layout = None
    if not single and walk.listings:
        layout = "imagefolder" if looks_like_image_folder(walk.listings[:256]) else "flat"
    if single and mine[0].name.lower().endswith(LIST_SUFFIXES):
        layout = "list"
    d.convertible = layout is not None
    scanned = None
    refused = ""
    if store.fs is None and walk.complete and (layout in ("imagefolder", "flat") and n <= SCAN_FILES
                                               or layout == "list" and mine[0].size <= 8 << 20):
        try:
            scanned = scan(root)
        except Exception as exc:  # SourceError "no samples found", an unreadable list...
            d.convertible = False
            refused = f"dsconvert's scanner refuses it ({_short(exc)})"
            d.damaged.append(f"{posixpath.basename(root)}: {refused}")
    if scanned is not None:
        d.num_samples = len(scanned.samples)
        layout = scanned.layout
    if layout == "list":
        d.description = "a list of files (" + mine[0].name + ")" + (
            f": {d.num_samples:,} samples" if d.num_samples is not None else "")
    elif layout is None:
        d.description = f"a file ({mine[0].ext or 'no extension'}) of no dataset format recognised here"
        d.kind = "unknown"
        d.reader = ""
    else:
        classes = f", {len(scanned.classes):,} classes" if scanned is not None and scanned.classes else ""
        samples = f", {d.num_samples:,} samples" if d.num_samples is not None else ""
        d.description = (f"{'an ImageFolder tree' if layout == 'imagefolder' else 'a flat folder of files'}: "
                         f"{n:,} files ({kinds}){samples}{classes}")
    if refused:
        d.description += f"; {refused}"
    if d.kind == "files":
        d.advice = ("loose files: each sample costs an open and a read; `dsconvert analyze` measures whether that "
                    "limits loading, and `dsconvert shard` converts it")


def _plain(kind: str) -> str:
    """A sniffed kind as a Detected kind: any file the scanner takes is "files"."""
    return "files" if kind == "other" else kind


def _prod(shape: Sequence[int]) -> int:
    p = 1
    for n in shape:
        p *= n
    return p


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _names(entries: Sequence[_Entry], k: int = 3) -> str:
    return ", ".join(e.rel for e in entries[:k]) + (", ..." if len(entries) > k else "")


def _short(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
