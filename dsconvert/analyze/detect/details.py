"""The dominant kind's files, read further: HDF5 datasets, tar headers, Parquet and Arrow
metadata, TFRecord's first record; each bounded, each returning (details, why not)."""

from __future__ import annotations

import contextlib
import io
import struct
import tarfile
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from ...io.tar_next import next_member
from ...optional import optional_import
from . import limits
from .crc import masked_crc32c
from .kinds import short_error
from .walk import Store

__all__ = ["h5_summary", "tar_keys", "parquet_meta", "arrow_meta", "tfrecord_first"]


def h5_summary(store: Store, path: str) -> Tuple[Dict[str, Any], str]:
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
                return None if len(datasets) < limits.MAX_H5_DATASETS else True
            f.visititems(visit)
            attrs = {k: f.attrs[k] for k in ("dsconvert_format",) if k in f.attrs}
    except Exception as exc:  # OSError "file signature not found", "truncated file", ...
        return {}, f"h5py cannot open it ({short_error(exc)})"
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


def tar_keys(store: Store, path: str, gz: bool) -> Tuple[Dict[str, Any], str]:
    """Samples (consecutive member names grouped by key, as webdataset groups them) and fields,
    from the tar headers: a plain tar is read by seeking from header to header; a gzipped one
    is inflated up to limits.GZ_TAR_BUDGET compressed bytes (and limits.TAR_INFLATE_BUDGET inflated), and
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
            counted = _Guard(raw, 1 << 20, limits.GZ_TAR_BUDGET)
            source: Any = _Guard(gzip.GzipFile(fileobj=counted, mode="rb"), 1 << 20, 1 << 40, limits.TAR_INFLATE_BUDGET)
        else:
            source = _Guard(raw, 1 << 20, limits.TAR_HEADER_BUDGET)
        try:
            tf = tarfile.open(fileobj=source, mode="r:")
            while True:
                m = next_member(tf)  # headers only, none kept; a negative size ends the walk
                if m is None:
                    break
                members += 1
                if m.isfile():
                    key, field_ = _wds_key(m.name)
                    if key != last:
                        samples += 1
                        last = key
                        keys.add(key)
                    fields[field_] += 1
                if members >= limits.MAX_TAR_MEMBERS:
                    raise _Budget("the member count")
        except _Budget:
            complete = False
            fraction = raw.tell() / max(1, size)
        except Exception as exc:  # ReadError on a damaged header, EOFError on a truncated member
            why = f"the tar breaks after {members:,} members ({short_error(exc)})"
    return {"samples": samples, "fields": dict(fields), "members": members, "complete": complete and not why,
            "fraction": fraction, "split": samples - len(keys)}, why


def _wds_key(name: str) -> Tuple[str, str]:
    """webdataset's base_plus_ext: the key is the path up to the first dot of the basename."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (ext.lower() if dot else "")


def parquet_meta(store: Store, path: str) -> Tuple[Dict[str, Any], str]:
    pq = optional_import("pyarrow.parquet")
    if pq is None:
        return {}, ""
    try:
        with store.open(path) as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - 8))
            footer = struct.unpack("<I", f.read(8)[:4])[0]
            if footer > limits.MAX_FOOTER:
                return {"rows": None, "columns": [f"(a {footer:,}-byte footer, not read here)"]}, ""
            f.seek(0)
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
            return {"rows": int(meta.num_rows), "row_groups": int(meta.num_row_groups),
                    "columns": [_arrow_field(fl) for fl in schema]}, ""
    except Exception as exc:
        return {}, f"pyarrow cannot read its footer ({short_error(exc)})"


def _arrow_field(fl: Any) -> str:
    t = fl.type
    if hasattr(t, "num_fields") and t.num_fields and str(t).startswith("struct"):
        return f"{fl.name}{{{','.join(t.field(i).name for i in range(t.num_fields))}}}"
    return fl.name


def arrow_meta(store: Store, path: str, ipc: str) -> Tuple[Dict[str, Any], str]:
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
        return {}, f"pyarrow cannot read it ({short_error(exc)})"


def tfrecord_first(store: Store, path: str, length: int) -> str:
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
