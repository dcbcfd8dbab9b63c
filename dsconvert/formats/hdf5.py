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

import h5py
import numpy as np
from h5py import h5d

from ..errors import BadInputError, ManifestError
from ..io.location import Location
from ..manifest import Manifest, ShardEntry
from ..plan import ShardSpec
from ..samples import Sample
from .base import (
    Format,
    Problem,
    ShardReader,
    ShardRecord,
    Sink,
    image_field,
    manifest_image_field,
    pixels_for,
)

__all__ = ["Hdf5", "FORMAT", "layout_problems", "HDF5_ERRORS"]

SCHEMA_VERSION = 1
CHUNK = 64  # samples per chunk of the per-sample datasets
BATCH = 64  # samples buffered in memory before they are appended


class _HdfSink(Sink):
    def __init__(self, spec: ShardSpec, path: str):
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
            item: Any = pixels_for(self.spec, data[name])
        else:
            item = np.frombuffer(data[name], dtype=np.uint8)
        assert sample.label is not None  # a classification source labels every sample
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


class Hdf5Shard(ShardReader):
    """An hdf5 shard, its layout checked before a byte of sample data is read; remote without
    a cache, h5py reads through fsspec's file object, 1 MB ahead per request."""

    def __init__(self, access: Any, entry: ShardEntry, stored: str):
        self.name = entry.name
        self.stored = stored
        where = access.url_of(entry.name)
        local = access.local_shard(entry)
        f = None
        try:  # libhdf5 reports damaged metadata as any of HDF5_ERRORS
            f = h5py.File(local if local is not None else access.location.open(entry.name), "r")
            problems = layout_problems(f, entry.num_samples)
            if not problems and f.attrs["stored"] != stored:
                problems.append(f"it stores {f.attrs['stored']} images, the manifest says {stored}")
            if problems:
                raise ManifestError(f"{where}: refused: {problems[0]}")
            self.shapes = f["shapes"][()] if "shapes" in f else None
            self.labels = f["labels"][()].tolist()
        except ManifestError:
            f is not None and f.close()
            raise
        except HDF5_ERRORS as exc:
            f is not None and f.close()
            raise ManifestError(f"{where}: not a readable HDF5 shard ({exc})") from None
        self.file = f
        self.data = f["images"]

    def image(self, j: int) -> Any:
        try:
            item = self.data[j]
        except HDF5_ERRORS as exc:
            raise BadInputError(f"damaged HDF5 data: {exc}") from None
        if self.stored == "encoded":
            return item.tobytes()
        if self.shapes is not None:
            shape = tuple(int(v) for v in self.shapes[j])
            if len(shape) != 3 or min(shape) < 1 or shape[2] not in (1, 3, 4) or \
                    shape[0] * shape[1] * shape[2] != item.size:
                raise BadInputError(f"shape {shape} does not fit its {item.size} pixel values")
            item = item.reshape(shape)
        return item

    def close(self) -> None:
        self.file.close()


class Hdf5(Format):
    """HDF5 shards; see the module doc."""

    id = "hdf5"
    suffix = ".h5"
    overhead = 1 << 16  # superblock, object headers, B-trees: generous
    pixels = "optional"
    write_in_child = True

    @classmethod
    def writer_options(cls, source: Any) -> Dict[str, Any]:
        return {"classes": source.classes}  # kept in the file's attributes

    @classmethod
    def open_sink(cls, spec: ShardSpec, file: Any, path: str) -> Sink:
        return _HdfSink(spec, path)

    @classmethod
    def structure_problems(cls, out: Location, entry: ShardEntry, record: ShardRecord,
                           parts: Dict[str, bytes]) -> List[Problem]:
        try:
            with out.open(entry.name) as raw, h5py.File(raw, "r") as f:
                return [Problem("structure", entry.name, p) for p in layout_problems(f, entry.num_samples)]
        except HDF5_ERRORS as exc:
            return [Problem("structure", entry.name, f"not a readable HDF5 file: {exc}")]

    @classmethod
    def open_shard(cls, access: Any, entry: ShardEntry, manifest: Manifest, **options: Any) -> Hdf5Shard:
        shard = Hdf5Shard(access, entry, manifest.stored)
        shard.image_field = manifest_image_field(manifest)
        return shard


FORMAT = Hdf5
