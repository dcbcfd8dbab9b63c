"""HDF5 shards (h5py): encoded bytes by default, decoded pixels with ``--decode``.

Layout of one ``shard-000000.h5`` (readable with h5py alone; see the README)::

    /images   encoded (default): variable-length uint8, one element per sample, the source
              file's bytes unchanged
              decoded, --size HxW: uint8 (n, H, W, 3), chunked one image per chunk
              decoded otherwise:   variable-length uint8 of the flattened HWC pixels, with
    /shapes   int32 (n, 3): height, width, channels of each image
    /labels   int64 (n,)
    /keys     variable-length UTF-8 strings: the sample keys (dsconvert.keys)
    attrs     dsconvert_format="hdf5", schema_version=1, stored="encoded"|"decoded",
              classes (JSON list), decoder (for decoded), num_samples

Datasets are chunked along the sample axis (CHUNK samples, or one image for fixed-size
pixels), so a random read touches one chunk, and grow as samples arrive. Files use h5py's
default (earliest) format, so Debian's h5ls 1.10 reads them, and no timestamps, so the same
input gives the same bytes. Readers open each file lazily in the process that reads.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._torch import lazy_module_attr
from ..errors import BadInputError, ManifestError
from ..manifest import ShardEntry
from ..optional import require
from ..shards import ShardSpec
from ..source import Sample
from ._base import BaseWriter, Sink
from ._map import MapReader
from .npy import decode_sample_pixels, image_field

__all__ = ["HdfWriter", "HdfDataset"]  # noqa: F822 (HdfDataset: see __getattr__)

SCHEMA_VERSION = 1
CHUNK = 64  # samples per chunk of the per-sample datasets
BATCH = 64  # samples buffered in memory before they are appended


class _HdfSink(Sink):
    def __init__(self, spec: ShardSpec, path: str):
        h5py = require("h5py", "the hdf5 format")
        self.h5py = h5py
        self.spec = spec
        self.decoded = bool(spec.options.get("decode"))
        self.size: Optional[Tuple[int, int]] = tuple(spec.options["size"]) if spec.options.get("size") else None
        self.f = h5py.File(path, "w", track_order=False)
        vlen = h5py.vlen_dtype(np.uint8)
        common = {"maxshape": (None,), "chunks": (CHUNK,), "track_times": False}
        if self.decoded and self.size:
            h, w = self.size
            self.images = self.f.create_dataset("images", (0, h, w, 3), np.uint8, maxshape=(None, h, w, 3),
                                                chunks=(1, h, w, 3), track_times=False)
        else:
            self.images = self.f.create_dataset("images", (0,), vlen, **common)
        self.shapes = (self.f.create_dataset("shapes", (0, 3), np.int32, maxshape=(None, 3),
                                             chunks=(CHUNK, 3), track_times=False)
                       if self.decoded and not self.size else None)
        self.labels = self.f.create_dataset("labels", (0,), np.int64, **common)
        self.keys = self.f.create_dataset("keys", (0,), h5py.string_dtype("utf-8"), **common)
        self.batch: List[Tuple[Any, int, str]] = []
        self.count = 0

    def add(self, sample: Sample, data: Dict[str, bytes]) -> Dict[str, bytes]:
        name = image_field(data)
        if self.decoded:
            item: Any = decode_sample_pixels(self.spec, data[name])
        else:
            item = np.frombuffer(data[name], dtype=np.uint8)
        self.batch.append((item, int(sample.label), sample.key))
        if len(self.batch) >= BATCH:
            self._flush()
        return {name: data[name]}

    def _flush(self) -> None:
        if not self.batch:
            return
        a, b = self.count, self.count + len(self.batch)
        for ds in (self.images, self.labels, self.keys) + ((self.shapes,) if self.shapes is not None else ()):
            ds.resize(b, axis=0)
        if self.decoded and self.size:
            self.images[a:b] = np.stack([item for item, _, _ in self.batch])
        else:
            for k, (item, _, _) in enumerate(self.batch):
                # one element at a time: h5py turns a batch of equal-length arrays into a
                # 2-D array that a 1-D variable-length dataset does not take
                self.images[a + k] = item.reshape(-1)
            if self.shapes is not None:
                self.shapes[a:b] = np.array([item.shape for item, _, _ in self.batch], dtype=np.int32)
        self.labels[a:b] = np.array([label for _, label, _ in self.batch], dtype=np.int64)
        self.keys[a:b] = [key for _, _, key in self.batch]
        self.count = b
        self.batch = []

    def close(self) -> Dict[str, Any]:
        self._flush()
        attrs = self.f.attrs
        attrs["dsconvert_format"] = "hdf5"
        attrs["schema_version"] = SCHEMA_VERSION
        attrs["stored"] = "decoded" if self.decoded else "encoded"
        attrs["num_samples"] = self.count
        attrs["classes"] = json.dumps(self.spec.options.get("classes"))
        if self.decoded:
            attrs["decoder"] = self.spec.options.get("decoder", "pil")
        self.f.close()
        return {}


_DATASETS = {"images", "shapes", "labels", "keys"}
# what h5py raises on a damaged file: libhdf5's errors map to OSError, RuntimeError, KeyError...
HDF5_ERRORS = (OSError, RuntimeError, KeyError, TypeError, ValueError, IndexError, OverflowError)


def layout_problems(f: Any, num_samples: int) -> List[str]:
    """What makes an open shard more than the layout above, as messages (empty: none).

    A shard is data, possibly hostile, and HDF5 can make a dataset read *other* files:
    external storage (raw data in any file, ``/etc/passwd`` say), external links, virtual
    datasets, soft links. Every one of those, any filter (we write none), any object beyond
    the four datasets, and any dataset of another kind or length is refused, in the reader
    and in ``verify``, before a byte of sample data is read."""
    h5py = require("h5py", "reading hdf5 shards")
    from h5py import h5d

    problems: List[str] = []
    if f.attrs.get("dsconvert_format") != "hdf5":
        problems.append("no dsconvert_format='hdf5' attribute")
    stored = f.attrs.get("stored")
    if stored not in ("encoded", "decoded"):
        problems.append(f"attribute stored is {stored!r}, not 'encoded' or 'decoded'")
    names = list(f.keys())
    datasets: Dict[str, Any] = {}  # the names that are hard-linked datasets of the layout
    for name in names:
        link = f.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            problems.append(f"/{name} is a {type(link).__name__}, which may point outside the shard")
            continue
        if name not in _DATASETS:
            problems.append(f"/{name} is not part of the layout")
            continue
        obj = f[name]
        if not isinstance(obj, h5py.Dataset):
            problems.append(f"/{name} is a {type(obj).__name__}, not a dataset")
            continue
        datasets[name] = obj
        plist = obj.id.get_create_plist()
        if plist.get_layout() not in (h5d.CHUNKED, h5d.CONTIGUOUS, h5d.COMPACT):
            problems.append(f"/{name} is a virtual dataset, which reads other files")
        elif plist.get_external_count() or obj.external:
            problems.append(f"/{name} keeps its data in external files {obj.external!r}")
        elif plist.get_nfilters():
            problems.append(f"/{name} has {plist.get_nfilters()} filter(s), which dsconvert never writes")
        elif not obj.shape or obj.shape[0] != num_samples:
            problems.append(f"/{name} holds {obj.shape[0] if obj.shape else 0} rows, not {num_samples}")
        elif not _expected_kind(name, obj, stored):
            problems.append(f"/{name} is {obj.dtype} of shape {obj.shape}, not what dsconvert writes")
    pixels_1d = stored == "decoded" and "images" in datasets and len(datasets["images"].shape) == 1
    for name in ("images", "labels", "keys") + (("shapes",) if pixels_1d else ()):
        if name not in names:
            problems.append(f"/{name} is missing")
    return problems


def _expected_kind(name: str, ds: Any, stored: Any) -> bool:
    h5py = require("h5py", "reading hdf5 shards")
    vlen = h5py.check_vlen_dtype(ds.dtype)
    if name == "images":
        if len(ds.shape) == 1:
            return vlen == np.dtype(np.uint8)
        return stored == "decoded" and ds.dtype == np.uint8 and len(ds.shape) == 4 and ds.shape[3] == 3
    if name == "shapes":
        return ds.dtype == np.int32 and ds.shape[1:] == (3,)
    if name == "labels":
        return ds.dtype == np.int64 and len(ds.shape) == 1
    return h5py.check_string_dtype(ds.dtype) is not None and len(ds.shape) == 1


class HdfWriter(BaseWriter):
    format = "hdf5"
    suffix = ".h5"
    overhead = 1 << 16  # superblock, object headers, B-trees: generous

    @classmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        return _HdfSink(spec, path)


class _HdfDataset(MapReader):
    """Map-style dataset over hdf5 shards; each file opened lazily per reading process."""

    def _open(self, entry: ShardEntry) -> Any:
        h5py = require("h5py", "reading hdf5 shards")
        local = self.access.local_shard(entry)
        # remote without a cache: h5py reads through fsspec's file object, 1 MB ahead per request
        f = None
        try:  # libhdf5 reports damaged metadata as any of these
            f = h5py.File(local if local is not None else self.access.location.open(entry.name), "r")
            problems = layout_problems(f, entry.num_samples)
            if not problems and f.attrs["stored"] != self.stored:
                problems.append(f"it stores {f.attrs['stored']} images, the manifest says {self.stored}")
            if problems:
                raise ManifestError(f"{self.access.url_of(entry.name)}: refused: {problems[0]}")
            shapes = f["shapes"][()] if "shapes" in f else None
            return f, f["images"], shapes, f["labels"][()].tolist()
        except ManifestError:
            f is not None and f.close()
            raise
        except HDF5_ERRORS as exc:
            f is not None and f.close()
            raise ManifestError(f"{self.access.url_of(entry.name)}: not a readable HDF5 shard ({exc})") from None

    def _read(self, handle: Any, j: int) -> Tuple[Any, int]:
        _, images, shapes, labels = handle
        try:
            item = images[j]
        except HDF5_ERRORS as exc:
            raise BadInputError(f"damaged HDF5 data: {exc}") from None
        if self.stored == "encoded":
            return item.tobytes(), labels[j]
        if shapes is not None:
            shape = tuple(int(v) for v in shapes[j])
            if len(shape) != 3 or min(shape) < 1 or shape[2] not in (1, 3, 4) or \
                    shape[0] * shape[1] * shape[2] != item.size:
                raise BadInputError(f"shape {shape} does not fit its {item.size} pixel values")
            item = item.reshape(shape)
        return item, labels[j]


# HdfDataset subclasses torch's Dataset when torch is installed, made on first use
__getattr__ = lazy_module_attr(globals(), "HdfDataset", _HdfDataset, "map")
