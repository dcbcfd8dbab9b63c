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
        f = h5py.File(local if local is not None else self.access.location.open(entry.name), "r")
        shapes = f["shapes"][()] if "shapes" in f else None
        return f, f["images"], shapes, f["labels"][()].tolist()

    def _read(self, handle: Any, j: int) -> Tuple[Any, int]:
        _, images, shapes, labels = handle
        item = images[j]
        if self.stored == "encoded":
            return item.tobytes(), labels[j]
        if shapes is not None:
            item = item.reshape(tuple(shapes[j]))
        return item, labels[j]


# HdfDataset subclasses torch's Dataset when torch is installed, made on first use
__getattr__ = lazy_module_attr(globals(), "HdfDataset", _HdfDataset, "map")
