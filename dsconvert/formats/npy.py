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

Pixels are what ``Image.open(f).convert("RGB")`` gives (PNG exactly; JPEG exactly through
Pillow, within one level on average through PyTurboJPEG/simplejpeg), then resized with
Pillow's bilinear filter when ``--resize SHORT`` or ``--size HxW`` was given.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from typing import IO, Any, Dict, List, Optional, Tuple

import numpy as np

from .._torch import lazy_module_attr
from ..codecs import NPY_HEADER_ERRORS, decode_rgb, load_npy, resize_rgb
from ..errors import BadInputError, ManifestError, OptionError
from ..manifest import ShardEntry
from ..shards import ShardSpec, part_of
from ..source import Sample
from ..remote import Location
from ..storage import open_regular
from ._base import BaseWriter, Sink
from ._map import MapReader

__all__ = ["NpyWriter", "NpyDataset", "SAMPLE_DTYPE", "decode_sample_pixels"]  # noqa: F822

HEADER_BYTES = 128
SAMPLE_DTYPE = np.dtype([("offset", "<i8"), ("height", "<i4"), ("width", "<i4"),
                         ("channels", "<i4"), ("label", "<i8")])


def npy_header(length: int) -> bytes:
    """The .npy (version 1.0) header of a 1-D uint8 array, padded to HEADER_BYTES, so that
    it can be written first as a placeholder and rewritten in place once the length is known."""
    text = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % length
    body = text.ljust(HEADER_BYTES - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")


def decode_sample_pixels(spec: ShardSpec, data: bytes) -> np.ndarray:
    """Decode (and resize) one image as the spec says, or raise BadInputError."""
    opts = spec.options
    try:
        pixels = decode_rgb(data, opts.get("decoder", "pil"))
        size = tuple(opts["size"]) if opts.get("size") else None
        return np.ascontiguousarray(resize_rgb(pixels, opts.get("resize"), size))
    except BadInputError:
        raise
    except Exception as exc:  # --no-verify let a bad image through: skip it now
        raise BadInputError(f"cannot decode image: {exc}") from None


def image_field(data: Dict[str, bytes]) -> str:
    return next(name for name in data if name != "cls")


class _PixelSink(Sink):
    def __init__(self, spec: ShardSpec, file: Any):
        self.spec = spec
        self.file = file
        self.file.write(npy_header(0))
        self.length = 0
        self.rows: List[Tuple[int, int, int, int, int]] = []

    def add(self, sample: Sample, data: Dict[str, bytes]) -> Dict[str, bytes]:
        name = image_field(data)
        pixels = decode_sample_pixels(self.spec, data[name])
        h, w, c = pixels.shape
        self.file.write(pixels.data)
        self.rows.append((self.length, h, w, c, int(sample.label)))
        self.length += pixels.nbytes
        return {name: data[name]}

    def close(self) -> Dict[str, Any]:
        self.file.seek(0)
        self.file.write(npy_header(self.length))
        self.file.seek(0, os.SEEK_END)
        rows_name = NpyWriter.rows_name(self.spec.name)
        table = io.BytesIO()
        np.save(table, np.array(self.rows, dtype=SAMPLE_DTYPE))
        Location(self.spec.out_dir, self.spec.storage_options).write_bytes(rows_name, table.getvalue())
        return {"samples_file": rows_name, "samples_sha256": hashlib.sha256(table.getvalue()).hexdigest(),
                "parts": {rows_name: part_of(table.getvalue())}}


class NpyWriter(BaseWriter):
    format = "npy"
    suffix = ".npy"
    overhead = HEADER_BYTES

    @staticmethod
    def rows_name(shard_name: str) -> str:
        return shard_name[: -len(".npy")] + ".samples.npy"

    @classmethod
    def files_of(cls, entry: ShardEntry) -> List[str]:
        return super().files_of(entry) + [cls.rows_name(entry.name)]

    @classmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        return _PixelSink(spec, file)


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


class _NpyDataset(MapReader):
    """Map-style dataset over npy caches: ``decode="numpy"`` returns zero-copy, read-only
    views of the memory map; ``"pil"`` PIL images. See :func:`dsconvert.open_dataset`."""

    def _open(self, entry: ShardEntry) -> Any:
        local = self.access.local_shard(entry)
        if local is None:
            raise OptionError(f"{self.access.url_of(entry.name)}: npy caches are memory-mapped from local disk; "
                              "open it with cache_dir=... (a local SSD folder) to read it from there")
        pixels = open_pixels(local)
        rows_name = NpyWriter.rows_name(entry.name)
        try:
            rows = load_rows(self.access.file_bytes(rows_name, entry.parts.get(rows_name)))
        except ManifestError as exc:
            raise ManifestError(f"{self.access.url_of(rows_name)}: {exc}") from None
        problem = rows_problem(rows, entry.num_samples, len(pixels))
        if problem:
            raise ManifestError(f"{self.access.url_of(rows_name)}: {problem}")
        spans = [(int(o), (int(h), int(w), int(c)), int(h) * int(w) * int(c))
                 for o, h, w, c in zip(rows["offset"], rows["height"], rows["width"], rows["channels"])]
        return pixels, spans, rows["label"].tolist()

    def _read(self, handle: Any, j: int) -> Tuple[Any, int]:
        pixels, spans, labels = handle
        o, shape, n = spans[j]
        return pixels[o: o + n].reshape(shape), labels[j]


# NpyDataset subclasses torch's Dataset when torch is installed, made on first use
__getattr__ = lazy_module_attr(globals(), "NpyDataset", _NpyDataset, "map")
