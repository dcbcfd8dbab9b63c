"""Decoded ``.npy`` caches for local SSD: pixels memory-mapped, no decode at read time.

Byte layout of one output folder::

    shard-000000.npy           a 1-D uint8 array (NumPy's .npy format, header padded to 128
                               bytes): the RGB pixels of every sample, HWC, packed back to
                               back, so images of any size need no padding
    shard-000000.samples.npy   a structured array, one row per sample: offset (int64, into
                               the pixel array), height, width, channels (int32), label (int64)
    shard-000000.index.json    the shard record (keys, source paths, skipped inputs, digest)
    dsconvert.json             the manifest; ``options.decoder`` names the JPEG decoder used

Without dsconvert::

    pixels = np.load("shard-000000.npy", mmap_mode="r")
    rows = np.load("shard-000000.samples.npy")
    o, h, w, c, label = rows[i]
    image = pixels[o:o + h * w * c].reshape(h, w, c)

A folder of same-shape ``.npy`` arrays (flat, or in class folders: one ``.npy`` file a sample,
as ``np.save`` wrote them) is packed as it is, nothing decoded: ``shard-000000.npy`` is then one
N-D array of shape (samples, *the arrays' shape) and their dtype, memory-mapped by readers,
sample j its ``[j]`` (``np.load("shard-000000.npy", mmap_mode="r")[j]``); the samples table
holds each one's byte offset. The first loadable array (in the source's order) fixes shape and
dtype; an array of another shape or dtype, or one that is not a numeric .npy (pickled
objects, a header past its bytes, truncated), is skipped with its reason, never unpickled.
It reads back as the source's dict samples, ``{"__key__": key, "npy": array}``.

Pixels are what ``Image.open(f).convert("RGB")`` gives (PNG exactly; JPEG exactly through
Pillow, within one level on average through PyTurboJPEG/simplejpeg), then resized with
Pillow's bilinear filter when ``--resize SHORT`` or ``--size HxW`` was given (torch's kernel for
it where torch is installed, and large JPEGs decoded at reduced DCT scale by the fast decoders:
:func:`dsconvert.codecs.decode_resized`; the manifest's options say which).
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..codecs import NPY_HEADER_ERRORS, field_kind, load_npy
from ..errors import BadInputError, ManifestError, OptionError, SourceError
from ..io.localfs import open_regular
from ..io.location import Location, filesystem, is_remote
from ..manifest import Manifest, ShardEntry
from ..plan import ShardSpec
from ..samples import Sample, Source
from .base import (
    Format,
    Problem,
    ShardReader,
    ShardRecord,
    Sink,
    image_field,
    manifest_image_field,
    part_of,
    pixels_for,
    write_owned,
)

__all__ = ["Npy", "FORMAT", "SAMPLE_DTYPE", "load_rows", "rows_problem", "pixels_extent", "open_pixels",
           "arrays_source", "array_spec", "open_arrays"]

HEADER_BYTES = 128
ARRAY_KINDS = "biufc"  # numeric and bool arrays are packed; anything else (strings, records, objects) is not
MAX_HEADER_BYTES = 10_000  # numpy's own bound on a .npy header it parses without allow_pickle
FIRST_ARRAY_TRIES = 1000  # inputs tried for the first loadable array, which fixes the cache's shape and dtype
SAMPLE_DTYPE = np.dtype([("offset", "<i8"), ("height", "<i4"), ("width", "<i4"),
                         ("channels", "<i4"), ("label", "<i8")])


def npy_header(length: int) -> bytes:
    """The .npy (version 1.0) header of a 1-D uint8 array, by numpy's own writer, which pads
    it for the length to grow: written first as a placeholder, rewritten in place once the
    length is known. Always HEADER_BYTES long, whatever the length."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": (length,)})
    header = buf.getvalue()
    if len(header) != HEADER_BYTES:  # a numpy that pads otherwise: the in-place rewrite would break
        raise RuntimeError(f"numpy wrote a {len(header)}-byte .npy header, not {HEADER_BYTES}")
    return header


def _save_rows(spec: ShardSpec, rows: Sequence[Tuple[int, ...]]) -> Dict[str, Any]:
    """Write a shard's rows table (each sample's offset, shape and label) beside its pixels; the
    shard entry's fields that name it."""
    rows_name = Npy.rows_name(spec.name)
    table = io.BytesIO()
    np.save(table, np.array(rows, dtype=SAMPLE_DTYPE))
    write_owned(Location(spec.out_dir, spec.storage_options), spec.owner, rows_name, table.getvalue())
    return {"samples_file": rows_name, "samples_sha256": hashlib.sha256(table.getvalue()).hexdigest(),
            "parts": {rows_name: part_of(table.getvalue())}}


class _PixelSink(Sink):
    def __init__(self, spec: ShardSpec, file: Any):
        self.spec = spec
        self.file = file
        self.file.write(npy_header(0))
        self.length = 0
        self.rows: List[Tuple[int, int, int, int, int]] = []

    def add(self, sample: Sample, data: Dict[str, bytes]) -> Dict[str, bytes]:
        name = image_field(data)
        pixels = pixels_for(self.spec, data[name])
        h, w, c = pixels.shape
        self.file.write(pixels.data)
        assert sample.label is not None  # a classification source labels every sample
        self.rows.append((self.length, h, w, c, int(sample.label)))
        self.length += pixels.nbytes
        return {name: data[name]}

    def close(self) -> Dict[str, Any]:
        self.file.seek(0)
        self.file.write(npy_header(self.length))
        self.file.seek(0, os.SEEK_END)
        return _save_rows(self.spec, self.rows)


def arrays_source(source: Source) -> bool:
    """Every sample is one ``.npy`` file (a folder of arrays, flat or in class folders)."""
    return bool(source.samples) and source.kind == "files" and all(
        len(s.files) == 1 and field_kind(s.files[0].field) == "npy" for s in source.samples)


def _array_header(f: IO[bytes]) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy header at ``f``, bounded (never unpickles)."""
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise ValueError(f"format version {version[0]}.{version[1]} is not read here (1.0 and 2.0 are)")
    return read(f, max_header_size=MAX_HEADER_BYTES)


def _array_problem(shape: Tuple[int, ...], dtype: np.dtype) -> Optional[str]:
    if dtype.hasobject:
        return "the .npy holds pickled objects, which are never loaded (loading them runs code from the data)"
    if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        return f"a {dtype} array: only numeric and bool arrays are packed"
    return None


def _head(root: str, path: str, n: int) -> bytes:
    """The first ``n`` bytes of an input file (``path`` relative to the source's ``root``)."""
    if not is_remote(root):
        with open_regular(path if os.path.isabs(path) else os.path.join(root, path)) as f:
            return f.read(n)
    fs, base = filesystem(root, None)
    return bytes(fs.cat_file(f"{base}/{path}", start=0, end=n))


def array_spec(source: Source) -> Dict[str, Any]:
    """The shape and dtype of the cache: the first array (in the source's order) whose header
    loads; a SourceError when none of the first ``FIRST_ARRAY_TRIES`` does."""
    seen: List[str] = []
    for sample in source.samples[:FIRST_ARRAY_TRIES]:
        path = sample.files[0].path
        try:
            shape, _, dtype = _array_header(io.BytesIO(_head(source.root, path, MAX_HEADER_BYTES + 16)))
        except (OSError, *NPY_HEADER_ERRORS) as exc:
            seen.append(f"{path}: {exc}")
            continue
        problem = _array_problem(shape, dtype)
        if problem:
            seen.append(f"{path}: {problem}")
            continue
        return {"shape": [int(n) for n in shape], "dtype": np.lib.format.dtype_to_descr(dtype)}
    raise SourceError(f"{source.root}: none of the first {len(seen):,} .npy files is a loadable numeric array "
                      f"(first: {seen[0] if seen else 'none'})", source.root)


def _array_header_bytes(shape: Tuple[int, ...], dtype: np.dtype) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


class _ArraySink(Sink):
    """Same-shape arrays back to back after one .npy header, rewritten in place at the end with
    the count (numpy pads the header for the first axis to grow: its length does not change)."""

    def __init__(self, spec: ShardSpec, file: Any):
        self.spec = spec
        self.file = file
        self.shape = tuple(int(n) for n in spec.options["array"]["shape"])
        self.dtype = np.dtype(spec.options["array"]["dtype"])
        self.header = _array_header_bytes((0,) + self.shape, self.dtype)
        self.file.write(self.header)
        self.item_bytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.rows: List[Tuple[int, int, int, int, int]] = []

    def add(self, sample: Sample, data: Dict[str, bytes]) -> Dict[str, bytes]:
        name = image_field(data)
        array = load_npy(data[name], allow_pickle=False)  # pickles, lying and truncated headers: BadInputError
        problem = _array_problem(array.shape, array.dtype)
        if problem:
            raise BadInputError(problem)
        if array.shape != self.shape or array.dtype != self.dtype:
            raise BadInputError(f"a {array.dtype} array of shape {array.shape}, not the cache's {self.dtype} "
                                f"{self.shape} (the first array's)")
        self.file.write(np.ascontiguousarray(array).data)
        self.rows.append((len(self.rows) * self.item_bytes, 0, 0, 0, -1))
        return {name: data[name]}

    def close(self) -> Dict[str, Any]:
        header = _array_header_bytes((len(self.rows),) + self.shape, self.dtype)
        if len(header) != len(self.header):  # a numpy that pads otherwise: the in-place rewrite would break
            raise RuntimeError(f"numpy wrote a {len(header)}-byte .npy header, then {len(self.header)}")
        self.file.seek(0)
        self.file.write(header)
        self.file.seek(0, os.SEEK_END)
        return {**_save_rows(self.spec, self.rows), "arrays": True}


def arrays_extent(f: IO[bytes], size: int, num_samples: int, where: str) -> Tuple[int, Tuple[int, ...], np.dtype]:
    """(offset, shape, dtype) of an arrays shard from its .npy header at ``f``: numeric, C
    order, ``num_samples`` arrays that fill exactly the file's ``size`` bytes."""
    try:
        shape, fortran, dtype = _array_header(f)
    except NPY_HEADER_ERRORS as exc:
        raise ManifestError(f"{where}: not a .npy array ({exc})", where) from None
    offset = f.tell()
    problem = _array_problem(shape, dtype)
    count = 1
    for n in shape:
        count *= int(n)
    if problem or fortran or not shape or shape[0] != num_samples or offset + count * dtype.itemsize != size:
        raise ManifestError(f"{where}: a {dtype} array of shape {shape}{' (Fortran order)' if fortran else ''}, "
                            f"not {num_samples} numeric arrays filling the file's {size} bytes", where)
    return offset, tuple(int(n) for n in shape), dtype


def open_arrays(path: str, num_samples: int) -> np.ndarray:
    """The arrays of a shard, memory-mapped, its header checked (:func:`arrays_extent`)."""
    with open_regular(path) as f:
        offset, shape, dtype = arrays_extent(f, os.fstat(f.fileno()).st_size, num_samples, path)
    if not num_samples:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape).view(np.ndarray)


def load_rows(data: bytes) -> np.ndarray:
    """A samples table from its bytes: a 1-D .npy of SAMPLE_DTYPE, nothing else (not an
    .npz, never pickled objects), its header checked against its length first."""
    try:
        rows = load_npy(data, allow_pickle=False)
    except BadInputError as exc:
        raise ManifestError(f"the samples table is {exc.reason}") from None
    if rows.dtype != SAMPLE_DTYPE or rows.ndim != 1:
        raise ManifestError(f"the samples table is {rows.dtype} {rows.shape}, not 1-D {SAMPLE_DTYPE}")
    return rows


def rows_problem(rows: np.ndarray, num_samples: int, pixels_len: int) -> Optional[str]:
    """Why ``rows`` cannot describe ``num_samples`` images inside ``pixels_len`` bytes, or None.

    Heights, widths and channels come from disk: their product is computed in floating point
    first, so a row whose height x width x channels overflows int64 cannot wrap around into
    a small (or negative) extent that passes the bounds check."""
    if len(rows) != num_samples:
        return f"{len(rows)} rows for {num_samples} samples"
    if not len(rows):
        return None
    h, w, c, o = rows["height"], rows["width"], rows["channels"], rows["offset"]
    rough = o.astype(np.float64) + h.astype(np.float64) * w * c
    bad = (o < 0) | (h < 1) | (w < 1) | ~np.isin(c, (1, 3, 4)) | (rough > float(pixels_len) + 1.0)
    if not bad.any():
        extent = o + h.astype(np.int64) * w.astype(np.int64) * c.astype(np.int64)  # exact now: < 2**53
        bad |= extent > pixels_len
    if bad.any():
        first = int(np.argmax(bad))
        return (f"{int(bad.sum())} row(s) point outside the pixels or have impossible shapes (first: sample {first}, "
                f"offset {int(o[first])}, {int(h[first])}x{int(w[first])}x{int(c[first])})")
    return None


def pixels_extent(f: IO[bytes], size: int, where: str) -> Tuple[int, int]:
    """(offset, length) of a shard's pixels from its .npy header at ``f``: a 1-D uint8 array
    whose length is exactly what the file's ``size`` holds (a header may declare anything)."""
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    except NPY_HEADER_ERRORS as exc:
        raise ManifestError(f"{where}: not a .npy pixel array ({exc})", where) from None
    offset = f.tell()
    if dtype != np.uint8 or len(shape) != 1 or offset + shape[0] != size:
        raise ManifestError(f"{where}: pixels are {dtype} {shape}, not 1-D uint8 filling the file's {size} bytes",
                            where)
    return offset, shape[0]


def open_pixels(path: str) -> np.ndarray:
    """The pixel array of a shard, memory-mapped, its header checked (:func:`pixels_extent`)."""
    with open_regular(path) as f:
        offset, length = pixels_extent(f, os.fstat(f.fileno()).st_size, path)
    if not length:
        return np.zeros(0, np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(length,)).view(np.ndarray)


class NpyShard(ShardReader):
    """Pixels memory-mapped, the samples table checked against them: ``image(j)`` is a
    zero-copy, read-only view of the map (of a packed array: sample j of the N-D array)."""

    arrays: Optional[np.ndarray] = None

    def __init__(self, access: Any, entry: ShardEntry, arrays: bool = False):
        self.name = entry.name
        local = access.local_shard(entry)
        if local is None:
            raise OptionError(f"{access.url_of(entry.name)}: npy caches are memory-mapped from local disk; "
                              "open it with cache_dir=... (a local SSD folder) to read it from there")
        if arrays:
            self._open_arrays(access, entry, local)
            return
        self.pixels = open_pixels(local)
        rows_name = Npy.rows_name(entry.name)
        try:
            rows = load_rows(access.file_bytes(rows_name, entry.parts.get(rows_name)))
        except ManifestError as exc:
            raise ManifestError(f"{access.url_of(rows_name)}: {exc}") from None
        problem = rows_problem(rows, entry.num_samples, len(self.pixels))
        if problem:
            raise ManifestError(f"{access.url_of(rows_name)}: {problem}")
        self.spans = [(int(o), (int(h), int(w), int(c)), int(h) * int(w) * int(c))
                      for o, h, w, c in zip(rows["offset"], rows["height"], rows["width"], rows["channels"])]
        self.labels = rows["label"].tolist()

    def _open_arrays(self, access: Any, entry: ShardEntry, local: str) -> None:
        from .columns import Columns, is_binary

        self.arrays = open_arrays(local, entry.num_samples)
        index = Npy.record_name(entry)
        data = access.mapped_file(index, entry.parts.get(index))
        if not is_binary(data):
            raise ManifestError(f"{access.url_of(index)}: not a binary shard record", access.url_of(index))
        cols = Columns(data, access.url_of(index))
        if cols.n != entry.num_samples:
            raise ManifestError(f"{access.url_of(index)}: {cols.n} keys for {entry.num_samples} samples",
                                access.url_of(index))
        self.keys = cols.strings("keys")
        self.labels = []

    def image(self, j: int) -> np.ndarray:
        if self.arrays is not None:
            return self.arrays[j]
        o, shape, n = self.spans[j]
        return self.pixels[o: o + n].reshape(shape)


class Npy(Format):
    """Decoded .npy caches; see the module doc."""

    id = "npy"
    suffix = ".npy"
    overhead = HEADER_BYTES
    pixels = "always"
    local_only = True

    @staticmethod
    def rows_name(shard_name: str) -> str:
        return shard_name[: -len(".npy")] + ".samples.npy"

    @classmethod
    def files_of(cls, entry: ShardEntry) -> List[str]:
        return super().files_of(entry) + [cls.rows_name(entry.name)]

    @classmethod
    def accepts_source(cls, source: Source) -> bool:
        """Besides (image, label) sources: a folder of .npy arrays, packed as they are."""
        return arrays_source(source)

    @classmethod
    def holds_dicts(cls, manifest: Manifest) -> bool:
        return manifest.sample_type != "classification"  # a packed folder of arrays

    @classmethod
    def writer_options(cls, source: Any) -> Dict[str, Any]:
        return {"array": array_spec(source)} if source.sample_type != "classification" and arrays_source(source) \
            else {}

    @classmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        return _ArraySink(spec, file) if spec.options.get("array") else _PixelSink(spec, file)

    @classmethod
    def structure_problems(cls, out: Location, entry: ShardEntry, record: ShardRecord,
                           parts: Dict[str, bytes]) -> List[Problem]:
        """The samples table fits the pixel array (whose .npy header, in its first 4 kB, says
        its length) and is the one the record describes."""
        rows_name = cls.rows_name(entry.name)
        arrays = bool(record.d.get("arrays"))
        try:
            head = io.BytesIO(out.read_range(entry.name, 0, MAX_HEADER_BYTES + 16))
            if arrays:
                _, shape, dtype = arrays_extent(head, entry.bytes, entry.num_samples, entry.name)
            else:
                _, length = pixels_extent(head, entry.bytes, entry.name)
            rows_bytes = parts[rows_name] if rows_name in parts else out.read_bytes(rows_name)
            rows = load_rows(rows_bytes)
        except (OSError, ManifestError) as exc:
            return [Problem("structure", entry.name, f"not loadable as .npy: {exc}")]
        problems: List[Problem] = []  # the table's digest against the manifest: verify checks every part
        if arrays:
            item = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            problem = None if len(rows) == entry.num_samples and bool(
                (rows["offset"] == np.arange(len(rows), dtype=np.int64) * item).all()) else \
                f"{len(rows)} rows for {entry.num_samples} arrays of {item} bytes, or offsets out of place"
        else:
            problem = rows_problem(rows, entry.num_samples, length)
        if problem:
            problems.append(Problem("structure", rows_name, problem))
        want = record.d.get("samples_sha256")
        if want and hashlib.sha256(rows_bytes).hexdigest() != want:
            problems.append(Problem("checksum", rows_name, "sha256 differs from the one recorded"))
        return problems

    @classmethod
    def open_shard(cls, access: Any, entry: ShardEntry, manifest: Manifest, **options: Any) -> NpyShard:
        arrays = cls.holds_dicts(manifest)
        shard = NpyShard(access, entry, arrays)
        shard.image_field = next((f for f, kind in manifest.fields.items() if kind == "npy"), "npy") if arrays \
            else manifest_image_field(manifest)
        return shard


FORMAT = Npy
