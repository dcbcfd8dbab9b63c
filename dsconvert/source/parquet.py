"""Parquet files (Hugging Face ``datasets`` exports, ``to_parquet``, Spark, pandas) as a source
for conversion: images are read out of their rows in place, byte for byte, without first
unpacking millions of files onto disk.

A scan reads each file's footer (metadata and schema) and only the small label column, not
the images (but for one batch of the first row group, whose first image names the field: jpg,
png or webp; sizes are estimated from the column chunks' sizes). The first readable file
decides the columns; a later file without them is skipped whole, as is one that is not
readable Parquet. The image column is, in this order: the Hugging Face ``Image`` feature
(named in the Arrow schema's ``huggingface`` metadata; stored as a struct ``{bytes, path}``),
else a struct column with a binary ``bytes`` child, else a top-level binary column; with
several candidates the first in schema order is taken (``--label`` does not change that).
The label is the column ``label`` names, or, when none is named, the one ``ClassLabel``
feature of a Hugging Face export (with several, none): ``ClassLabel`` ints index its ``names``, a
plain integer column gives the labels as they are, a string column gives class names, sorted
into indices as ImageFolder's folders are. Without a label the samples are dicts: the image
and a ``json`` field holding the row's other (JSON-able) columns, built when the row is read.

Each row is one sample, keyed ``STEM/NNNNNNNNN`` (the file's name without ``.parquet`` and the
row number); its inputs name the file (``container``) and the row (``offset``). Conversion
reads each file once, only the row groups holding its rows, one at a time, in record batches
of 256 rows, so memory is flat in the file's size (pyarrow decodes a row group's column chunk
whole: a file of one huge row group costs about 3x that row group). A row group that a shard
boundary cuts is read whole once and kept by the worker for the neighbouring shard (one group
at a time), rather than read again from its start. A row whose image is null, or a Hugging Face image
that only names an external ``path`` (bytes not embedded), is skipped with its reason.
"""

from __future__ import annotations

import json
import math
import os
from itertools import groupby
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..codecs import is_image_field
from ..errors import BadInputError, SourceError
from ..io.localfs import open_regular
from ..io.location import Location, mtime_ns_of
from ..keys import disambiguate, encode_key, escape_path
from ..skips import row_run
from .samples import LABEL_MAX, Sample, Skipped, Source, SourceFile, is_ignored

__all__ = ["looks_like_parquet", "parquet_source", "read_parquet_samples", "ParquetRows"]

SUFFIX = ".parquet"
BATCH_ROWS = 256  # rows per record batch when reading images: memory stays flat
LABEL_BATCH_ROWS = 1 << 16
_MAGIC = {b"\xff\xd8\xff": "jpg", b"\x89PNG\r\n\x1a\n": "png"}
_IMAGE_NOT_EMBEDDED = "image not embedded in the Parquet file"


def _import_pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        from ..errors import MissingDependencyError

        raise MissingDependencyError("reading Parquet files needs pyarrow: pip install 'dsconvert[parquet]'") \
            from None
    return pq


def _entries(location: Location) -> List[Tuple[str, str, Dict[str, Any]]]:
    """(name, type, info) of a folder's entries, sorted by name."""
    fs, base = location.fs, location.path()
    out = []
    for e in fs.ls(base, detail=True):
        name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
        if str(e["name"]).rstrip("/") == base.rstrip("/"):
            continue
        out.append((name, str(e.get("type", "file")), e))
    return sorted(out, key=lambda x: x[0])


NOT_REGULAR = "not a regular file (a device, FIFO, socket or broken link): not read"


def _not_regular(kind: str) -> bool:
    """A listing entry that is neither a file nor a folder (fsspec's ``other``: a FIFO, a
    device, ``/dev/zero`` behind a link): never read, and no say in what the folder is."""
    return kind not in ("file", "directory")


def looks_like_parquet(src: str, storage_options: Optional[Dict[str, Any]] = None) -> bool:
    """Whether ``src`` is a ``.parquet`` file, or a folder whose non-hidden entries are all
    ``.parquet`` files (at least one; entries that are not regular files or folders are left
    out). Lists only; False on any error."""
    if "{" in src and ".." in src:
        return False
    try:
        location = Location(src, storage_options, flat=False)
        info = location.fs.info(location.path())
        if info.get("type") == "file":
            return location.path().lower().endswith(SUFFIX)
        entries = _entries(location)
    except Exception:  # an unreachable store, a bad URL: not Parquet, and scan() says why
        return False
    names = [(n, t) for n, t, _ in entries if not is_ignored(n) and not _not_regular(t)]
    return bool(names) and all(t == "file" and n.lower().endswith(SUFFIX) for n, t in names)


# --- the schema: which column is the image, which the label ----------------------------------


def _hf_features(schema: Any) -> Dict[str, Any]:
    """The Hugging Face ``datasets`` features a file's schema metadata names ({} if none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw.decode("utf-8")).get("info", {}).get("features", {})
    except (ValueError, AttributeError, RecursionError):
        return {}
    return features if isinstance(features, dict) else {}


def _is_binary(t: Any) -> bool:
    import pyarrow as pa

    is_view = getattr(pa.types, "is_binary_view", None)  # pyarrow >= 16
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or bool(is_view and is_view(t))


def _image_column(schema: Any, features: Dict[str, Any]) -> Optional[str]:
    """The first image column (see the module doc), or None."""
    import pyarrow as pa

    def is_feature_image(name: str) -> bool:
        f = features.get(name)
        return isinstance(f, dict) and f.get("_type") == "Image"

    def struct_with_bytes(t: Any) -> bool:
        return pa.types.is_struct(t) and any(t.field(i).name == "bytes" and _is_binary(t.field(i).type)
                                             for i in range(t.num_fields))

    for test in (lambda fld: is_feature_image(fld.name) and (struct_with_bytes(fld.type) or _is_binary(fld.type)),
                 lambda fld: struct_with_bytes(fld.type),
                 lambda fld: _is_binary(fld.type)):
        for fld in schema:
            if test(fld):
                return str(fld.name)
    return None


def _class_label(features: Dict[str, Any]) -> Optional[str]:
    """The one ClassLabel feature's column, or None (none, or several)."""
    found = [n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "ClassLabel"]
    return found[0] if len(found) == 1 else None


def _label_kind(schema: Any, features: Dict[str, Any], column: str, where: str) -> Tuple[str, Optional[List[str]]]:
    """("classlabel", names) | ("int", None) | ("name", None); SourceError for other types."""
    import pyarrow as pa

    t = schema.field(column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    feature = features.get(column)
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and pa.types.is_integer(t):
        names = feature.get("names")
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return "classlabel", names
    if pa.types.is_integer(t):
        return "int", None
    is_view = getattr(pa.types, "is_string_view", None)  # pyarrow >= 16
    if pa.types.is_string(t) or pa.types.is_large_string(t) or bool(is_view and is_view(t)):
        return "name", None
    raise SourceError(f"the label column {column!r} of {where} holds {t}: labels must be integers or class "
                      "names (strings)", where)


# --- scanning ----------------------------------------------------------------------------


class _File:
    """What a scan learns from one Parquet file: rows, per-row size estimates, labels."""

    def __init__(self, name: str, mtime_ns: int):
        self.name = name
        self.mtime_ns = mtime_ns
        self.num_rows = 0
        self.sizes: List[int] = []  # per row group: estimated image bytes per row
        self.group_rows: List[int] = []
        self.empty: List[bool] = []  # per row group: its statistics count every image null
        self.present: List[Any] = []  # per row group: which rows hold an image (read when cheap), or None
        self.labels: Optional[List[Any]] = None


def _open(location: Location, name: str) -> Any:
    if location.remote:
        return location.fs.open(location.path(name), "rb", block_size=4 << 20, cache_type="readahead")
    return open_regular(location.path(name))


def _column_bytes(rg: Any, image: str) -> int:
    """Uncompressed bytes of a row group's image data (a struct's ``bytes`` child)."""
    total = 0
    for i in range(rg.num_columns):
        col = rg.column(i)
        path = col.path_in_schema
        if path == image or path == f"{image}.bytes":
            total += int(col.total_uncompressed_size or 0)
    return total


def _all_null(rg: Any, image: str) -> bool:
    """Whether a row group's statistics count every row's image null (bytes, and path where
    there is one): its rows are skipped as one run, unread. A file whose statistics lie only
    skips its own rows; a file without statistics is read row by row."""
    leaves = [rg.column(i) for i in range(rg.num_columns)
              if rg.column(i).path_in_schema in (image, f"{image}.bytes", f"{image}.path")]
    if not leaves:
        return False
    for col in leaves:
        stats = col.statistics
        if stats is None or not stats.has_null_count or stats.null_count < rg.num_rows:
            return False
    return True


MIN_IMAGE_BYTES = 32  # below any JPEG, PNG or WebP file: a group holding less a row cannot hold one in each


def _present(pf: Any, g: int, image: str) -> Any:
    """Which rows of row group ``g`` hold an image (bytes, or a path naming one), as a numpy
    bool array. Read at scan only where the group's image data is too small to hold an image a
    row (``MIN_IMAGE_BYTES``): then reading it costs little, and the null rows become one
    skipped run instead of millions of planned samples."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    col = pf.read_row_group(g, columns=[image], use_threads=False).column(0)
    if pa.types.is_struct(col.type):
        has = pc.is_valid(pc.struct_field(col, "bytes"))
        if col.type.get_field_index("path") >= 0:
            has = pc.or_(has, pc.is_valid(pc.struct_field(col, "path")))
        has = pc.and_(has, pc.is_valid(col))
    else:
        has = pc.is_valid(col)
    return np.asarray(has.to_numpy(zero_copy_only=False), dtype=bool)


SNIFF_GROUP_BYTES = 64 << 20  # the sniff reads the first row group whose image data is at most this


def _sniff(pf: Any, image: str) -> Optional[str]:
    """The field name of the first non-null image of the first row group small enough to read
    (jpg, png, webp; None: none was). Conversion names each image by its own magic anyway."""
    meta = pf.metadata
    small = [g for g in range(meta.num_row_groups) if _column_bytes(meta.row_group(g), image) <= SNIFF_GROUP_BYTES]
    if not small:
        return None
    batches = pf.iter_batches(batch_size=16, row_groups=[small[0]], columns=[image], use_threads=False)
    try:
        return _first_format(batches)
    finally:
        batches.close()


def _first_format(batches: Iterator[Any]) -> Optional[str]:
    import pyarrow as pa

    for batch in batches:
        col = batch.column(0)
        if pa.types.is_struct(col.type):
            col = col.field("bytes")
        for i in range(len(col)):
            if col[i].is_valid:
                return format_of(col[i].as_py()[:12]) or "jpg"
    return None


def format_of(data: bytes) -> Optional[str]:
    """The field name an image's bytes call for, from their magic (jpg, png, webp, gif);
    None for anything else."""
    head = bytes(data[:12])
    for magic, fld in _MAGIC.items():
        if head.startswith(magic):
            return fld
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    return None


def _read_labels(pf: Any, column: str) -> List[Any]:
    out: List[Any] = []
    for batch in pf.iter_batches(batch_size=LABEL_BATCH_ROWS, columns=[column], use_threads=False):
        out.extend(batch.column(0).to_pylist())
    return out


def _label_of(value: Any, kind: str, names: Optional[List[str]], index: Dict[str, int]) -> Any:
    """A row's label as an int, or the reason it has none (a str)."""
    if value is None:
        return "no label (null)"
    if kind == "name":
        return index[value] if value else "empty class name"
    if value < 0:
        return f"no label ({value})" if value == -1 else f"negative label {value}"
    if names is not None and value >= len(names):
        return f"label {value} is out of range for the {len(names)} class names"
    if value > LABEL_MAX:
        return f"label {value} is out of range: labels are int64 class indices"
    return int(value)


class _Runs:
    """Skipped rows gathered into runs (consecutive rows, one reason), each one :class:`Skipped`
    with its count: a file declaring millions of null rows costs one entry, not millions."""

    def __init__(self, shown: str, out: List[Skipped]):
        self.shown, self.out = shown, out
        self.first = self.last = -1
        self.reason = ""

    def skip(self, row: int, reason: str, count: int = 1) -> None:
        if self.first >= 0 and row == self.last + 1 and reason == self.reason:
            self.last = row + count - 1
            return
        self.flush()
        self.first, self.last, self.reason = row, row + count - 1, reason

    def flush(self) -> None:
        if self.first >= 0:
            self.out.append(Skipped(row_run(self.shown, self.first, self.last), self.reason,
                                    self.last - self.first + 1))
            self.first = -1


def parquet_source(src: str, label: Optional[str] = None,
                   storage_options: Optional[Dict[str, Any]] = None) -> Source:
    """The rows of a Parquet file, or of a folder's ``.parquet`` files (sorted by name), as a
    :class:`Source` of kind ``parquet``: see the module doc. Reads footers and the label
    column only. A file that is not readable Parquet (or lacks the columns the first readable
    file has) is skipped whole; with no image column at all, a one-line SourceError."""
    pq = _import_pyarrow()
    location = Location(src, storage_options, flat=False)
    fs = location.fs
    try:
        info = fs.info(location.path())
    except FileNotFoundError:
        raise SourceError(f"source does not exist: {escape_path(src)}", src) from None
    except OSError as exc:
        raise SourceError(f"cannot read {escape_path(src)}: {exc}", src) from None
    ignored: List[Skipped] = []
    if info.get("type") == "file":
        folder, name = location.url.rsplit("/", 1) if location.remote else os.path.split(location.url)
        location = Location(folder, storage_options, flat=False)
        listed = [(name, info)]
    else:
        listed = []
        for n, t, e in _entries(location):
            if is_ignored(n):
                continue
            if t == "file" and n.lower().endswith(SUFFIX):
                listed.append((n, e))
            else:
                ignored.append(Skipped(escape_path(n), NOT_REGULAR if _not_regular(t) else "not a .parquet file"))
    if not listed:
        raise SourceError(f"no .parquet files in {escape_path(src)}", src)

    skipped: List[Skipped] = []
    files: List[_File] = []
    image: Optional[str] = None
    field: Optional[str] = None
    label_col = label
    kind, names = "", None
    for name, e in listed:
        try:
            pf_info = _File(name, mtime_ns_of(e) if location.remote else os.stat(location.path(name)).st_mtime_ns)
            with _open(location, name) as f:
                pf = pq.ParquetFile(f)
                meta, schema = pf.metadata, pf.schema_arrow
                features = _hf_features(schema)
                if image is None:  # the first readable file decides the columns
                    image = _image_column(schema, features)
                    if image is None:
                        raise SourceError(
                            f"no image column in {escape_path(name)} (looked for a Hugging Face Image feature, a "
                            f"struct with binary 'bytes', a binary column; columns: {', '.join(schema.names)})", src)
                    if label_col is None:
                        label_col = _class_label(features)
                    if label_col is not None:
                        if label_col not in schema.names:
                            raise SourceError(f"no column {label_col!r} in {escape_path(name)} (--label); columns: "
                                              f"{', '.join(schema.names)}", src)
                        if label_col == image:
                            raise SourceError(f"--label {label_col} names the image column", src)
                        kind, names = _label_kind(schema, features, label_col, escape_path(name))
                missing = [c for c in (image, label_col) if c is not None and c not in schema.names]
                if missing:
                    skipped.append(Skipped(escape_path(name), f"no column {missing[0]!r} (the first file has it)"))
                    continue
                if _image_column(schema, features) != image:  # the same name, another kind of data
                    skipped.append(Skipped(escape_path(name), f"its column {image!r} does not hold images as in the "
                                           "first file (or another column comes first)"))
                    continue
                if label_col is not None:
                    try:
                        same = _label_kind(schema, features, label_col, escape_path(name)) == (kind, names)
                    except SourceError:
                        same = False
                    if not same:
                        skipped.append(Skipped(escape_path(name), f"the label column {label_col!r} holds other "
                                               "labels (type or class names) than in the first file"))
                        continue
                if field is None:
                    field = _sniff(pf, image)
                pf_info.num_rows = meta.num_rows
                for g in range(meta.num_row_groups):
                    rg = meta.row_group(g)
                    pf_info.group_rows.append(rg.num_rows)
                    pf_info.sizes.append(_column_bytes(rg, image) // max(1, rg.num_rows))
                    pf_info.empty.append(_all_null(rg, image))
                    pf_info.present.append(_present(pf, g, image) if not pf_info.empty[-1] and
                                           _column_bytes(rg, image) < MIN_IMAGE_BYTES * rg.num_rows else None)
                    if pf_info.present[-1] is not None and len(pf_info.present[-1]) != rg.num_rows:
                        raise ValueError(f"its footer declares {rg.num_rows} rows in row group {g}, its image column "
                                         f"holds {len(pf_info.present[-1])}")
                if label_col is not None:
                    pf_info.labels = _read_labels(pf, label_col)
                    if len(pf_info.labels) != meta.num_rows:  # the footer counts rows the data does not hold
                        raise ValueError(f"its footer declares {meta.num_rows} rows, its label column holds "
                                         f"{len(pf_info.labels)}")
        except SourceError:
            raise
        except Exception as exc:  # pyarrow's ArrowInvalid, OSError, a truncated footer...
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            skipped.append(Skipped(escape_path(name), f"not a readable Parquet file: {text[:200]}"))
            continue
        files.append(pf_info)
    field = field or "jpg"

    index: Dict[str, int] = {}
    classes: Optional[List[str]] = None
    if kind == "classlabel":
        classes = list(names or [])
    elif kind == "name":
        classes = sorted({v for f in files for v in (f.labels or []) if isinstance(v, str) and v})
        index = {c: i for i, c in enumerate(classes)}

    samples: List[Sample] = []
    seen: Dict[str, int] = {}
    for f in files:
        stem = f.name[: -len(SUFFIX)] if f.name.lower().endswith(SUFFIX) else f.name
        shown = escape_path(f.name)
        runs = _Runs(shown, skipped)  # rows skipped for one reason, one after another: one entry
        base = 0
        for g, nrows in enumerate(f.group_rows):
            size = f.sizes[g]
            base += nrows
            if f.empty[g]:
                runs.skip(base - nrows, "no image (null): the row group's statistics count every image null", nrows)
                continue
            present = f.present[g]
            for row in range(base - nrows, base):
                if present is not None and not present[row - base + nrows]:
                    runs.skip(row, "no image (null)")
                    continue
                path = f"{shown}/row {row}"
                sample_label = None
                if f.labels is not None:
                    value = _label_of(f.labels[row], kind, names, index)
                    if isinstance(value, str):
                        runs.skip(row, value)
                        continue
                    sample_label = value
                runs.flush()
                try:
                    key = encode_key(f"{stem}/{row:09d}")
                except ValueError:
                    key = encode_key(f"{shown}/{row:09d}")
                count = seen.get(key, 0)
                seen[key] = count + 1
                if count:
                    key = disambiguate(key, str(count))
                inputs = [SourceFile(field, path, size, f.mtime_ns, f.name, row)]
                if label_col is None:
                    inputs.append(SourceFile("json", f"{path}/json", 0, f.mtime_ns, f.name, row))
                samples.append(Sample(key, tuple(inputs), sample_label))
        runs.flush()
    if not samples and not skipped:
        raise SourceError(f"no rows in the Parquet files of {escape_path(src)}", src)
    return Source(location.url, "parquet", samples, classes, skipped, ignored, kind="parquet",
                  labelled=label_col is not None, options={"label": label} if label is not None else {})


# --- reading rows during conversion --------------------------------------------------------


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
    import pyarrow as pa

    def has_binary(t: Any) -> bool:
        if _is_binary(t):
            return True
        if pa.types.is_struct(t):
            return any(has_binary(t.field(i).type) for i in range(t.num_fields))
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return has_binary(t.value_type)
        if pa.types.is_map(t):
            return has_binary(t.key_type) or has_binary(t.item_type)
        if pa.types.is_dictionary(t):
            return has_binary(t.value_type)
        return False

    return [str(f.name) for f in schema if f.name != image and not has_binary(f.type)]


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
    pq = _import_pyarrow()
    try:
        with _open(location, name) as f:
            unchanged = True if location.remote else os.fstat(f.fileno()).st_mtime_ns == mtime_ns
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
            image = _image_column(schema, _hf_features(schema))
            if image is None:
                yield ("error", "the file has no image column any more")
                return
            json_cols = _json_columns(schema, image) if dict_samples else None
            identity = (location.url, name, mtime_ns)
            for row, data, img_path, js in _rows(pf, image, json_cols, first, last, identity):
                yield ("row", row, data, img_path, js, unchanged)
    except Exception as exc:  # pyarrow's ArrowInvalid, OSError: the file changed or went
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        yield ("error", f"unreadable Parquet file: {text[:200]}")


def read_parquet_samples(spec: Any, checked: Any) -> Iterator[Tuple[Sample, Any]]:
    """Each sample of a spec from its Parquet rows (see the module doc): each file opened once,
    its rows read in record batches; images byte-exact. ``checked(spec, sample, contents)`` gets
    the bytes as read (the scan's sizes are estimates, so the sample it checks carries the
    read sizes); the sample yielded is the spec's."""
    from dataclasses import replace

    from ..plan import CHANGED_DURING

    location = Location(spec.root, spec.storage_options, flat=False)
    for name, run in groupby(spec.samples, key=lambda s: s.files[0].container):
        todo = list(run)
        by_row = {s.files[0].offset: s for s in todo}
        done = set()
        failed = None
        for item in _read_file(location, name, todo[0].files[0].mtime_ns, len(todo[0].files) > 1,
                               min(by_row), max(by_row)):
            if item[0] == "error":
                failed = item[1]
                break
            _, row, data, img_path, js, unchanged = item
            sample = by_row.get(row)
            if sample is None:
                continue
            done.add(row)
            img = sample.files[0]
            if data is None:
                reason = f"{_IMAGE_NOT_EMBEDDED} (path {img_path!r})" if img_path else "no image (null)"
                yield sample, BadInputError(reason, img.path)
                continue
            contents = {img.path: (data, unchanged)}
            files = [replace(img, size=len(data))]
            if len(sample.files) > 1:
                contents[sample.files[1].path] = (js or b"{}", unchanged)
                files.append(replace(sample.files[1], size=len(js or b"{}")))
            got = checked(spec, replace(sample, files=tuple(files)), contents)
            named = format_of(data)
            if isinstance(got, dict) and named and named != img.field and img.field in got and is_image_field(named):
                got = {(named if k == img.field else k): v for k, v in got.items()}  # a PNG among JPEGs stays .png
            yield sample, got
        for s in todo:
            if s.files[0].offset not in done:
                reason = failed or (f"{CHANGED_DURING} (the file has fewer rows than when scanned); run the same "
                                    "command again to include it")
                yield s, BadInputError(reason, s.files[0].path)


class ParquetRows:
    """Random access to one Parquet file's rows, for reading it in place
    (:class:`dsconvert.source.dataset.SourceDataset`): a row's whole row group is read (what
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
        pq = _import_pyarrow()
        self.file = _open(self.location, self.name)
        self.pf = pq.ParquetFile(self.file)
        schema = self.pf.schema_arrow
        image = _image_column(schema, _hf_features(schema))
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
            raise BadInputError(f"{_IMAGE_NOT_EMBEDDED} (path {path!r})" if path else "no image (null)",
                                escape_path(f.path))
        return data

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = self.pf = None
