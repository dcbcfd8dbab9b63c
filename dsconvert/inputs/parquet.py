"""Parquet rows read for a conversion (:func:`read_parquet_samples`: each file opened once, only
the row groups holding a shard's rows, in record batches, so memory stays flat) and in place
(:class:`ParquetRows`, for :class:`dsconvert.readers.source.SourceDataset`). Which column is
the image and which files hold which rows is the scan's (:mod:`dsconvert.source.parquet`)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from itertools import groupby
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..codecs import encode_class, is_image_field
from ..errors import BadInputError
from ..io.localfs import open_regular
from ..io.location import Location
from ..keys import escape_path
from ..plan import CHANGED_DURING, MAX_SAMPLE_BYTES, ShardSpec, over_limit, sample_bytes_limit
from ..samples import Fetched, Sample, SourceFile
from ..source.arrow import is_arrow_name
from ..source.parquet import (
    format_of,
    hf_features,
    image_column,
    image_path,
    kept_columns,
    open_table,
    path_reason,
)
from .check import Check, Contents

__all__ = ["read_parquet_samples", "ParquetRows"]

BATCH_ROWS = 256  # rows per record batch when reading images: memory stays flat


def _jsonable(value: Any) -> Any:
    """A column value as JSON: numbers (non-finite floats as null), strings, bools, null, lists
    and dicts of those; anything else (dates, decimals) as its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):  # a map column
            return {str(k): _jsonable(v) for k, v in value}
        return [_jsonable(x) for x in value]
    return str(value)


def _json_bytes(row: Dict[str, Any]) -> bytes:
    """A row's other columns as the ``json`` field's bytes."""
    return json.dumps(_jsonable(row), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _json_columns(schema: Any, image: str) -> List[str]:
    """The columns that go into the json field: all but the image, and none holding binary."""
    return kept_columns(schema, image, None)


def read_image_file(location: Location, name: str, path: str, limit: Optional[int]) -> bytes:
    """The bytes of the file a path-only image of the Parquet file ``name`` names
    (:func:`dsconvert.source.parquet.image_path`): a regular file only, refused unread when
    its size is over ``limit``; BadInputError with the reason otherwise."""
    try:
        with open_regular(image_path(location, name, path)) as fh:
            size = os.fstat(fh.fileno()).st_size
            if limit is not None and size > limit:
                raise BadInputError(over_limit(size, limit))
            return fh.read(size + 1 if limit is None else min(size + 1, limit + 1))
    except (OSError, ValueError) as exc:
        raise BadInputError(path_reason(path, exc)) from None


_last_group: Dict[str, Any] = {}  # this process's last row group read whole: {"key": ..., "table": ...}


def _rows(pf: Any, image: str, json_cols: Optional[List[str]], first: int, last: int, identity: Any
          ) -> Iterator[Tuple[int, Any, Optional[str], Optional[bytes]]]:
    """(row, image bytes or None, the image's path, json bytes) for rows first..last, reading
    only the row groups that hold them, one at a time. A group whose rows are all wanted is
    streamed in record batches; one cut by first or last (shared with a neighbouring shard,
    which this worker likely reads next) is read whole and kept until another is, since
    pyarrow reads a row group only from its start. ``identity`` names the file's version."""
    meta = pf.metadata
    columns = [image] + (json_cols or [])
    at = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if at > last:
            return
        if at + n > first:
            if first <= at and at + n - 1 <= last:  # wholly this shard's: streamed
                batches: Iterator[Any] = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=columns,
                                                         use_threads=False)
                start = at
            else:
                key = (identity, g, tuple(columns))
                if _last_group.get("key") != key:
                    _last_group.clear()  # one group held at a time
                    _last_group.update(key=key, table=pf.read_row_group(g, columns=columns, use_threads=False))
                start = max(at, first)
                batches = iter(_last_group["table"].slice(start - at).to_batches(max_chunksize=BATCH_ROWS))
            try:
                yield from _batch_rows(batches, start, first, last, json_cols)
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
        at += n


def _batch_rows(batches: Iterator[Any], row: int, first: int, last: int, json_cols: Optional[List[str]]
                ) -> Iterator[Tuple[int, Any, Optional[str], Optional[bytes]]]:
    import pyarrow as pa

    for batch in batches:
        n = batch.num_rows
        if row + n <= first:
            row += n
            continue
        lo, hi = max(0, first - row), min(n, last - row + 1)
        part = batch.slice(lo, hi - lo)
        col = part.column(0)
        if pa.types.is_struct(col.type):
            valid = col.is_valid().to_pylist()
            datas = [d if ok else None for d, ok in zip(col.field("bytes").to_pylist(), valid)]
            paths = ([p if ok else None for p, ok in zip(col.field("path").to_pylist(), valid)]
                     if col.type.get_field_index("path") >= 0 else [None] * len(datas))
        else:
            datas, paths = col.to_pylist(), [None] * len(col)
        jsons: List[Optional[bytes]] = [None] * len(datas)
        if json_cols is not None:
            other = part.select(json_cols).to_pylist()
            jsons = [_json_bytes(r) for r in other]
        for i in range(len(datas)):
            yield row + lo + i, datas[i], paths[i], jsons[i]
        row += n
        if row > last:
            return


def _read_file(location: Location, name: str, mtime_ns: int, dict_samples: bool, first: int, last: int
               ) -> Iterator[Tuple[Any, ...]]:
    """("row", row, image bytes, image path, json bytes, unchanged) for rows first..last of one
    file, then ("error", reason) if reading it failed part way (or at once)."""
    try:
        with open_table(location, name) as (f, pf):
            unchanged = True if location.remote else os.fstat(f.fileno()).st_mtime_ns == mtime_ns
            schema = pf.schema_arrow
            image = image_column(schema, hf_features(schema))
            if image is None:
                yield ("error", "the file has no image column any more")
                return
            json_cols = _json_columns(schema, image) if dict_samples else None
            identity = (location.url, name, mtime_ns)
            for row, data, img_path, js in _rows(pf, image, json_cols, first, last, identity):
                yield ("row", row, data, img_path, js, unchanged)
    except Exception as exc:  # pyarrow's ArrowInvalid, OSError: the file changed or went
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        yield ("error", f"unreadable {'Arrow' if is_arrow_name(name) else 'Parquet'} file: {text[:200]}")


def read_parquet_samples(spec: ShardSpec, checked: Check) -> Iterator[Tuple[Sample, Fetched]]:
    """Each sample of a spec from its Parquet rows (see the module doc): each file opened once,
    its rows read in record batches; images byte-exact. ``checked(spec, sample, contents)`` gets
    the bytes as read (the scan's sizes are estimates, so the sample it checks carries the
    read sizes); the sample yielded is the spec's. A file's run of samples is held as their
    places in the spec (each sample made again when its row comes: packed samples are made one
    at a time, :mod:`dsconvert.packed_samples`)."""
    location = Location(spec.root, spec.storage_options, flat=False)
    samples = spec.samples
    for name, run in groupby(enumerate(samples), key=lambda js: js[1].files[0].container):
        by_row: Dict[int, int] = {}  # row -> place in the spec
        first: Optional[Sample] = None
        for j, s in run:
            first = s if first is None else first
            by_row[s.files[0].offset] = j
        assert first is not None  # a run of groupby has an item
        done = set()
        failed = None
        for item in _read_file(location, name, first.files[0].mtime_ns, len(first.files) > 1,
                               min(by_row), max(by_row)):
            if item[0] == "error":
                failed = item[1]
                break
            _, row, data, img_path, js, unchanged = item
            at = by_row.get(row)
            if at is None:
                continue
            sample = samples[at]
            done.add(row)
            img = sample.files[0]
            if data is None:
                if not img_path:
                    yield sample, BadInputError("no image (null)", img.path)
                    continue
                try:  # an image named by path only: the file it names, as any input file
                    data = read_image_file(location, name, img_path, sample_bytes_limit(spec))
                except BadInputError as exc:
                    yield sample, BadInputError(exc.reason, img.path)
                    continue
            contents: Contents = {img.path: (data, unchanged)}
            files = [replace(img, size=len(data))]
            for other in sample.files[1:]:
                labelled = other.field == "cls" and sample.label is not None  # a cls field: the row's label
                value = encode_class(sample.label) if labelled and sample.label is not None else js or b"{}"
                contents[other.path] = (value, unchanged)
                files.append(replace(other, size=len(value)))
            got = checked(spec, replace(sample, files=tuple(files)), contents)
            named = format_of(data)
            if isinstance(got, dict) and named and named != img.field and img.field in got and is_image_field(named):
                got = {(named if k == img.field else k): v for k, v in got.items()}  # a PNG among JPEGs stays .png
            yield sample, got
        for row, at in by_row.items():
            if row not in done:
                s = samples[at]
                reason = failed or (f"{CHANGED_DURING} (the file has fewer rows than when scanned); run the same "
                                    "command again to include it")
                yield s, BadInputError(reason, s.files[0].path)


class ParquetRows:
    """Random access to one Parquet file's rows, for reading it in place
    (:class:`dsconvert.readers.source.SourceDataset`): a row's whole row group is read (what
    a reader by index pays) and kept, since the next rows asked for are likely in it."""

    def __init__(self, location: Location, name: str, dict_samples: bool):
        self.location = location
        self.name = name
        self.dict_samples = dict_samples
        self.file: Any = None
        self.pf: Any = None
        self.image = ""
        self.json_cols: Optional[List[str]] = None
        self.starts: List[int] = []
        self.group = -1
        self.table: Any = None

    def _open(self) -> None:
        self.opened = open_table(self.location, self.name)
        self.file, self.pf = self.opened.__enter__()
        schema = self.pf.schema_arrow
        image = image_column(schema, hf_features(schema))
        if image is None:
            raise BadInputError("the file has no image column any more", self.name)
        self.image = image
        self.json_cols = _json_columns(schema, image) if self.dict_samples else None
        meta, at = self.pf.metadata, 0
        for g in range(meta.num_row_groups):
            self.starts.append(at)
            at += meta.row_group(g).num_rows
        self.starts.append(at)

    def read(self, f: SourceFile) -> bytes:
        import bisect

        if self.pf is None:
            self._open()
        row = f.offset
        g = bisect.bisect_right(self.starts, row) - 1
        if not 0 <= g < len(self.starts) - 1:
            raise BadInputError("the file has fewer rows than when scanned", escape_path(f.path))
        if g != self.group:  # the row group as Arrow columns, not Python objects: held once
            self.table = self.pf.read_row_group(g, columns=[self.image] + (self.json_cols or []), use_threads=False)
            self.group = g
        i = row - self.starts[g]
        if f.field == "json":
            other = self.table.select(self.json_cols or []).slice(i, 1).to_pylist()[0]
            return _json_bytes(other)
        value = self.table.column(self.image)[i].as_py()
        data, path = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else (value, None)
        if data is None:
            if not path:
                raise BadInputError("no image (null)", escape_path(f.path))
            try:  # an image named by path only: the file it names, as a conversion reads it
                return read_image_file(self.location, self.name, path, MAX_SAMPLE_BYTES)
            except BadInputError as exc:
                raise BadInputError(exc.reason, escape_path(f.path)) from None
        return data

    def close(self) -> None:
        if self.file is not None:
            self.opened.__exit__(None, None, None)
            self.file = self.pf = None
