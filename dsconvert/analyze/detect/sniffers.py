"""One file: what its first and last bytes say. Each format recognised is one small sniffer
function of a :class:`Head`, returning a :class:`Sniff` or None; :data:`SNIFFERS` holds them
in the order they are tried, first answer wins. A file's extension is only a hint: it names a
file whose content matches nothing (then it is *damaged*)."""

from __future__ import annotations

import io
import pickletools
import re
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...codecs import NPY_HEADER_ERRORS
from ...optional import optional_import
from . import limits
from .crc import masked_crc32c
from .kinds import NAMES, shape_text, short_error
from .walk import Entry, Store

__all__ = ["Sniff", "Head", "Sniffer", "SNIFFERS", "HINTS", "sniff", "hint_of"]

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
NPY_MAGIC = b"\x93NUMPY"
LMDB_MAGIC = 0xBEEFC0DE

# extension -> the kind a file of that name claims to be (a hint: the content decides)
HINTS = {"npy": "npy", "npz": "npz", "h5": "hdf5", "hdf5": "hdf5", "hdf": "hdf5", "he5": "hdf5",
          "parquet": "parquet", "pq": "parquet", "arrow": "arrow", "arrows": "arrow", "feather": "arrow",
          "ipc": "arrow", "tar": "webdataset", "tgz": "webdataset", "tfrecord": "tfrecord",
          "tfrecords": "tfrecord", "tfrec": "tfrecord", "pkl": "pickle", "pickle": "pickle", "pt": "pickle",
          "pth": "pickle", "mdb": "lmdb"}


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
class Sniff:
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
    shape, fortran, dtype = reader(f, max_header_size=limits.HEAD)
    return {"shape": tuple(int(n) for n in shape), "dtype": dtype, "offset": f.tell()}


def npy_sniff(head: bytes, size: int) -> Sniff:
    try:
        h = _npy_header(head)
    except NPY_HEADER_ERRORS as exc:
        return Sniff("npy", f"the .npy header does not parse ({short_error(exc)})")
    except Exception as exc:  # numpy's header parser on hostile text: whatever it raises
        return Sniff("npy", f"the .npy header does not parse ({short_error(exc)})")
    dtype = h["dtype"]
    info = {"shape": h["shape"], "dtype": str(dtype), "object": bool(dtype.hasobject)}
    if dtype.hasobject:
        return Sniff("npy", "", info)
    needed = dtype.itemsize
    for n in h["shape"]:
        needed *= n
    if needed + h["offset"] > size:
        return Sniff("npy", f"truncated: the header declares {shape_text(h['shape'])} {dtype} "
                             f"({needed:,} bytes) but the file holds {max(0, size - h['offset']):,}", info)
    return Sniff("npy", "", info)


def _tar_header_ok(block: bytes) -> bool:
    if len(block) < 512:
        return False
    try:
        tarfile.TarInfo.frombuf(block[:512], "utf-8", "surrogateescape")
    except Exception:  # HeaderError (checksum, empty block), or a number field that does not parse
        return False
    return True


def _gzip_head(store: Store, path: str, n: int = 1024) -> bytes:
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


def _zip_members(store: Store, path: str, size: int) -> Tuple[Optional[List[str]], str]:
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
    if cd_size > limits.MAX_ZIP_DIRECTORY:
        return None, f"its member list is {cd_size:,} bytes long, more than is read here"
    try:
        with store.open(path) as f, zipfile.ZipFile(f) as zf:
            infos = zf.infolist()
            if sum(len(i.filename) for i in infos) > limits.MAX_ZIP_DIRECTORY:
                return None, "its member list is longer than is read here"
            return [i.filename for i in infos], ""
    except Exception as exc:  # BadZipFile, a zip64 record that lies, ...
        return None, f"the zip does not open ({short_error(exc)})"


def _npz_arrays(store: Store, path: str, names: Sequence[str]) -> Tuple[Dict[str, Dict[str, Any]], str]:
    """shape and dtype of the first few .npy members, each from its first bytes only."""
    arrays: Dict[str, Dict[str, Any]] = {}
    try:
        with store.open(path) as f, zipfile.ZipFile(f) as zf:
            for name in [n for n in names if n.endswith(".npy")][:16]:
                with zf.open(name) as member:
                    head = member.read(limits.HEAD)
                sniff = npy_sniff(head, zf.getinfo(name).file_size)
                if sniff.damaged:
                    return arrays, f"member {name}: {sniff.damaged}"
                arrays[name[:-4]] = sniff.info
    except Exception as exc:
        return arrays, f"a member does not read ({short_error(exc)})"
    return arrays, ""




@dataclass(frozen=True)
class Head:
    """What a sniffer is given: the file, its first HEAD bytes and last 8, the kind its name
    claims (a hint: the content decides), and the store to read more through."""

    store: Store
    entry: Entry
    head: bytes
    tail: bytes
    hint: Optional[str]

    @property
    def size(self) -> int:
        return self.entry.size


Sniffer = Callable[[Head], Optional[Sniff]]


def sniff_npy(h: Head) -> Optional[Sniff]:
    return npy_sniff(h.head, h.size) if h.head.startswith(NPY_MAGIC) else None


def sniff_hdf5(h: Head) -> Optional[Sniff]:
    return Sniff("hdf5") if h.head.startswith(HDF5_MAGIC) else None


def sniff_parquet(h: Head) -> Optional[Sniff]:
    if not h.head.startswith(b"PAR1"):
        return None
    if h.tail.endswith(b"PAR1") and h.size >= 12:
        footer = struct.unpack("<I", h.tail[:4])[0]
        if footer + 12 > h.size:
            return Sniff("parquet", f"the footer length ({footer:,}) is longer than the file")
        return Sniff("parquet", info={"footer": footer})
    return Sniff("parquet", "truncated: no PAR1 footer at the end")


def sniff_arrow_file(h: Head) -> Optional[Sniff]:
    if not h.head.startswith(b"ARROW1"):
        return None
    if not h.tail.endswith(b"ARROW1"):
        return Sniff("arrow", "truncated: no ARROW1 magic at the end", {"ipc": "file"})
    return Sniff("arrow", info={"ipc": "file"})


def sniff_arrow_stream(h: Head) -> Optional[Sniff]:
    if h.head.startswith(b"\xff\xff\xff\xff") and len(h.head) >= 8:
        meta = struct.unpack_from("<i", h.head, 4)[0]
        if 0 < meta <= h.size - 8 and (h.hint == "arrow" or _arrow_stream_ok(h.store, h.entry.path)):
            return Sniff("arrow", info={"ipc": "stream"})
    return None


def sniff_zip(h: Head) -> Optional[Sniff]:
    if h.head.startswith(b"PK\x03\x04") or h.head.startswith(b"PK\x05\x06"):
        return _zip_sniff(h.store, h.entry, h.hint)
    return None


def sniff_gzip(h: Head) -> Optional[Sniff]:
    if not h.head.startswith(b"\x1f\x8b"):
        return None
    if _tar_header_ok(_gzip_head(h.store, h.entry.path)):
        return Sniff("webdataset", info={"gzip": True})
    if h.hint == "webdataset":
        return Sniff("webdataset", "gzip data that does not hold a tar archive", {"gzip": True})
    return Sniff("other")


def sniff_tar(h: Head) -> Optional[Sniff]:
    return Sniff("webdataset") if _tar_header_ok(h.head) else None


def sniff_lmdb(h: Head) -> Optional[Sniff]:
    if h.entry.name == "data.mdb" or _lmdb_meta_page(h.head):
        return _lmdb_sniff(h.head)
    return None


def sniff_tfrecord(h: Head) -> Optional[Sniff]:
    if len(h.head) >= 12:
        length, crc = struct.unpack_from("<QI", h.head)
        if crc == masked_crc32c(h.head[:8]):
            if length + 16 > h.size:
                return Sniff("tfrecord", f"truncated: the first record declares {length:,} bytes")
            return Sniff("tfrecord", info={"first_record": length})
    return None


def sniff_pickle(h: Head) -> Optional[Sniff]:
    head = h.head
    # code2op: pickletools' opcode table, a module global that typeshed leaves out
    if (len(head) > 2 and head[0] == 0x80 and 2 <= head[1] <= 5
            and chr(head[2]) in pickletools.code2op):  # type: ignore[attr-defined]
        return Sniff("pickle", _pickle_damage(head, h.size), info={"protocol": head[1]})
    return None


def sniff_hdf5_userblock(h: Head) -> Optional[Sniff]:
    if h.size > 512:
        at = _hdf5_userblock(h.store, h.entry.path, h.size)
        if at:
            return Sniff("hdf5", info={"userblock": at})
    return None


def sniff_old_pickle(h: Head) -> Optional[Sniff]:
    """The old protocols have no magic: a file named as a pickle whose opcodes parse."""
    if h.hint == "pickle" and h.head[:1] in _TEXT_PICKLE_STARTS:
        return Sniff("pickle", _pickle_damage(h.head, h.size), info={"protocol": "0 or 1"})
    return None


def sniff_empty_tar(h: Head) -> Optional[Sniff]:
    if h.hint == "webdataset" and len(h.head) >= 1024 and not h.head.strip(b"\0"):
        return Sniff("webdataset", "an empty tar archive (only end-of-archive blocks)")
    return None


# the sniffers in the order they are tried, first answer wins: magic bytes first, then the
# checks that read more or that a file of another kind could pass by chance
SNIFFERS: Tuple[Tuple[str, Sniffer], ...] = (
    ("npy", sniff_npy),
    ("hdf5", sniff_hdf5),
    ("parquet", sniff_parquet),
    ("arrow file", sniff_arrow_file),
    ("arrow stream", sniff_arrow_stream),
    ("zip (npz, torch.save)", sniff_zip),
    ("gzip (tar.gz)", sniff_gzip),
    ("tar", sniff_tar),
    ("lmdb", sniff_lmdb),
    ("tfrecord", sniff_tfrecord),
    ("pickle", sniff_pickle),
    ("hdf5 after a user block", sniff_hdf5_userblock),
    ("pickle, protocol 0 or 1", sniff_old_pickle),
    ("empty tar", sniff_empty_tar),
)


def sniff(store: Store, e: Entry) -> Sniff:
    """What ``e`` is, from its content (see :data:`SNIFFERS`); never raises."""
    try:
        return _sniff_unsafe(store, e)
    except Exception as exc:  # an unreadable file, or a parser surprised by hostile bytes
        return Sniff(hint_of(e) or "other", f"unreadable ({short_error(exc)})")


def hint_of(e: Entry) -> Optional[str]:
    """The kind ``e``'s name claims."""
    return HINTS.get("tgz" if e.ext == "tar.gz" else e.ext)


def _sniff_unsafe(store: Store, e: Entry) -> Sniff:
    hint = hint_of(e)
    size = e.size
    if e.name == "lock.mdb":
        return Sniff("lmdb", info={"lock": True})
    with store.open(e.path) as f:
        head = f.read(limits.HEAD)
        tail = b""
        if size >= 8:
            f.seek(max(0, size - 8))
            tail = f.read(8)
    if not head:
        return Sniff(hint or "other", "empty file" if hint else "")
    h = Head(store, e, head, tail, hint)
    for _, sniffer in SNIFFERS:
        found = sniffer(h)
        if found is not None:
            return found
    if hint:
        return Sniff(hint, f"named .{e.ext} but its content is not {NAMES.get(hint, hint)}")
    return Sniff("other")


def _arrow_stream_ok(store: Store, path: str) -> bool:
    pa = optional_import("pyarrow")
    if pa is None:
        return False
    try:
        with store.open(path) as f:
            _ = pa.ipc.open_stream(f).schema  # reading the schema is the check
        return True
    except Exception:
        return False


def _zip_sniff(store: Store, e: Entry, hint: Optional[str]) -> Sniff:
    names, why = _zip_members(store, e.path, e.size)
    if names is None:
        if hint is None:
            return Sniff("other")  # some other zip: the scanner takes it as a file like any other
        return Sniff(hint, f"a damaged zip archive: {why}")
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return Sniff("pickle", info={"torch_zip": True})
    npys = [n for n in names if n.endswith(".npy")]
    if npys and len(npys) == len([n for n in names if not n.endswith("/")]):
        arrays, why = _npz_arrays(store, e.path, names)
        return Sniff("npz", why, {"arrays": arrays, "members": len(npys)})
    if hint == "npz":
        return Sniff("npz", "a zip archive without .npy members")
    return Sniff("other")


def _lmdb_meta_page(head: bytes) -> bool:
    """LMDB's first page, by content: P_META in the page flags, the meta magic after the header
    (an environment opened with MDB_NOSUBDIR has no data.mdb name to go by)."""
    return (len(head) >= 20 and struct.unpack_from("<H", head, 10)[0] & 0x08 != 0
            and struct.unpack_from("<I", head, 16)[0] == LMDB_MAGIC)


def _lmdb_sniff(head: bytes) -> Sniff:
    """LMDB's meta pages: MDB_meta (magic 0xBEEFC0DE) after the 16-byte page header of 64-bit
    builds (12 on 32-bit ones); two meta pages, the later transaction current."""
    for hdr in (16, 12):
        if len(head) >= hdr + 4 and struct.unpack_from("<I", head, hdr)[0] == LMDB_MAGIC:
            break
    else:
        return Sniff("lmdb", "data.mdb without the LMDB meta-page magic")
    if hdr != 16:
        return Sniff("lmdb", info={"entries": None, "note": "a 32-bit LMDB"})
    psize = struct.unpack_from("<I", head, 16 + 24)[0]  # the free DB's md_pad holds the page size
    best = None
    for page in (0, psize):
        m = page + 16
        if m + 136 <= len(head) and struct.unpack_from("<I", head, m)[0] == LMDB_MAGIC:
            entries = struct.unpack_from("<Q", head, m + 24 + 48 + 32)[0]  # mm_dbs[MAIN_DBI].md_entries
            txnid = struct.unpack_from("<Q", head, m + 128)[0]
            if best is None or txnid >= best[0]:
                best = (txnid, entries)
    return Sniff("lmdb", info={"entries": best[1] if best else None, "page_size": psize})


def _hdf5_userblock(store: Store, path: str, size: int) -> int:
    """HDF5's signature after a user block: at 512, 1024, 2048, ... bytes."""
    at = 512
    with store.open(path) as f:
        while at + 8 <= size:
            f.seek(at)
            if f.read(8) == HDF5_MAGIC:
                return at
            at *= 2
    return 0
