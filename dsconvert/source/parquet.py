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
feature of a Hugging Face export, else the one integer column named ``label`` or ``labels``
(several candidates: none, and the source's ``chosen`` says so); ``label=False``: none.
``ClassLabel`` ints index its ``names``, a plain integer column gives the labels as they are
(classes "0" .. the largest), a string column gives class names, sorted into indices as
ImageFolder's folders are. Without a label the samples are dicts: the image and a ``json``
field holding the row's other (JSON-able) columns, built when the row is read.

Each row is one sample, keyed ``STEM/NNNNNNNNN`` (the file's name without ``.parquet`` and the
row number); its inputs name the file (``container``) and the row (``offset``). Conversion
reads each file once, only the row groups holding its rows, one at a time, in record batches
of 256 rows, so memory is flat in the file's size (pyarrow decodes a row group's column chunk
whole: a file of one huge row group costs about 3x that row group). A row group that a shard
boundary cuts is read whole once and kept by the worker for the neighbouring shard (one group
at a time), rather than read again from its start. A row whose image is null, or a Hugging Face image
that only names a ``path`` it cannot read (below), is skipped with its reason.

**Images named by path.** ``datasets`` writes an ``Image`` built from local files as
``{"bytes": null, "path": ...}`` (``to_parquet`` does not embed them). Such a row's image is
the file the path names, read as ``datasets`` reads it: an absolute path as it is, a relative
one against the Parquet file's folder (``..`` included: paths outside that folder are allowed,
as ``datasets`` allows them). Only a regular file is read, and its bytes pass the same checks
and the per-sample byte bound as any input file; a missing file, a FIFO, a device, a URL, or a
path in a remote Parquet file is a skipped row with its reason. Where the scan reads a row
group's image column (groups of path-only rows are small), it stats each file: sizes are
known before reading and a missing file is skipped at scan.

**Columns.** Every column is accounted for. Without a label the samples are dicts: the image
and ``json`` (every other column). With a label (named or found), the samples are ``(image,
label)`` and each other column is listed in the source's ``ignored`` with the reason; so is a
column holding binary data (not JSON), in either case.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ..errors import BadInputError, NotRegularFileError, SourceError
from ..io.localfs import open_regular, regular_size
from ..io.location import Location, mtime_ns_of
from ..keys import disambiguate, encode_key, escape_path
from ..samples import LABEL_MAX, Sample, Skipped, Source, SourceFile
from ..scan_table import ScanTable
from ..skips import row_run
from .arrow import (
    ARROW_SUFFIX,
    INFO_NAME,
    STATE_NAME,
    is_arrow_name,
    looks_like_saved,
    open_arrow,
    refuse_dataset_dict,
    saved_features,
    saved_files,
)
from .folders import is_ignored

__all__ = ["looks_like_parquet", "looks_like_arrow", "parquet_source", "format_of", "import_pyarrow", "open_file",
           "open_table", "image_column",
           "hf_features", "is_binary", "has_binary", "IMAGE_NOT_EMBEDDED", "image_path", "path_reason", "kept_columns"]

SUFFIX = ".parquet"
LABEL_BATCH_ROWS = 1 << 16
_MAGIC = {b"\xff\xd8\xff": "jpg", b"\x89PNG\r\n\x1a\n": "png"}
IMAGE_NOT_EMBEDDED = "image not embedded in the Parquet file"


def import_pyarrow() -> Any:
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


def looks_like_arrow(src: str, storage_options: Optional[Dict[str, Any]] = None) -> bool:
    """Whether ``src`` is an ``.arrow`` file, a ``save_to_disk`` folder (``.arrow`` files beside
    ``dataset_info.json`` or ``state.json``) or a ``DatasetDict`` one (``dataset_dict.json``).
    Lists only; False on any error."""
    if "{" in src and ".." in src:
        return False
    try:
        location = Location(src, storage_options, flat=False)
        info = location.fs.info(location.path())
        if info.get("type") == "file":
            return is_arrow_name(location.path())
        names = [n for n, t, _ in _entries(location) if t in ("file", "directory")]
    except Exception:  # an unreachable store, a bad URL: not Arrow, and scan() says why
        return False
    return looks_like_saved(names) or "dataset_dict.json" in names


# --- the schema: which column is the image, which the label ----------------------------------


def hf_features(schema: Any) -> Dict[str, Any]:
    """The Hugging Face ``datasets`` features a file's schema metadata names ({} if none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw.decode("utf-8")).get("info", {}).get("features", {})
    except (ValueError, AttributeError, RecursionError):
        return {}
    return features if isinstance(features, dict) else {}


def is_binary(t: Any) -> bool:
    import pyarrow as pa

    is_view = getattr(pa.types, "is_binary_view", None)  # pyarrow >= 16
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or bool(is_view and is_view(t))


def has_binary(t: Any) -> bool:
    """Whether a column type holds binary data anywhere (not JSON-able)."""
    import pyarrow as pa

    if is_binary(t):
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


def kept_columns(schema: Any, image: str, label: Optional[str]) -> List[str]:
    """The columns a dict sample's ``json`` field holds: all but the image and the label, and
    none holding binary data."""
    return [str(f.name) for f in schema if f.name not in (image, label) and not has_binary(f.type)]


def image_path(location: Location, name: str, path: str) -> str:
    """The local file a path-only image of the Parquet file ``name`` names (see the module
    doc), or BadInputError with the reason it is not read."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise BadInputError(f"{IMAGE_NOT_EMBEDDED} and its path {path!r} names no file")
    if "://" in path or path.startswith("hf:"):
        raise BadInputError(f"{IMAGE_NOT_EMBEDDED}: its path {path[:200]!r} is a URL, not fetched (download the files "
                            "and name them by local path, or embed the images: datasets' save_to_disk embeds them)")
    if location.remote:
        raise BadInputError(f"{IMAGE_NOT_EMBEDDED}: its path {path[:200]!r} is not read from a remote Parquet file "
                            "(paths are read for local Parquet files only)")
    return os.path.normpath(os.path.join(os.path.dirname(location.path(name)), path))


def path_reason(path: str, exc: BaseException) -> str:
    """Why the file a path-only image names cannot be read."""
    shown = escape_path(path)[:200]
    if isinstance(exc, FileNotFoundError):
        return f"{IMAGE_NOT_EMBEDDED} and the file its path names does not exist: {shown}"
    if isinstance(exc, BadInputError):
        return exc.reason
    if isinstance(exc, NotRegularFileError):
        return f"{IMAGE_NOT_EMBEDDED} and its path names no regular file (a device, FIFO, socket or folder): {shown}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{IMAGE_NOT_EMBEDDED} and the file its path names cannot be read ({exc.strerror}): {shown}"
    return f"{IMAGE_NOT_EMBEDDED} and the file its path names cannot be read ({type(exc).__name__}): {shown}"


def image_column(schema: Any, features: Dict[str, Any]) -> Optional[str]:
    """The first image column (see the module doc), or None."""
    import pyarrow as pa

    def is_feature_image(name: str) -> bool:
        f = features.get(name)
        return isinstance(f, dict) and f.get("_type") == "Image"

    def struct_with_bytes(t: Any) -> bool:
        return pa.types.is_struct(t) and any(t.field(i).name == "bytes" and is_binary(t.field(i).type)
                                             for i in range(t.num_fields))

    for test in (lambda fld: is_feature_image(fld.name) and (struct_with_bytes(fld.type) or is_binary(fld.type)),
                 lambda fld: struct_with_bytes(fld.type),
                 lambda fld: is_binary(fld.type)):
        for fld in schema:
            if test(fld):
                return str(fld.name)
    return None


LABEL_NAMES = ("label", "labels")  # an integer column of one of these names is the label, found by itself
INT_CLASSES_MAX = 100_000  # integer labels name their classes "0".."N-1" up to this many; more: no class names


def _found_label(schema: Any, features: Dict[str, Any], image: str) -> Tuple[Optional[str], str]:
    """The label column found without being named, and how (for ``info``): the one ``ClassLabel``
    feature, else the one integer column named ``label`` or ``labels``; None with the reason
    when there is none, or more than one (which one is the label is then the user's say)."""
    import pyarrow as pa

    found = [n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "ClassLabel"
             and n in schema.names and n != image]
    if len(found) == 1:
        return found[0], "its ClassLabel column"
    if found:
        return None, f"several ClassLabel columns ({', '.join(found)}): --label names the one to use"

    def integer(name: str) -> bool:
        t = schema.field(name).type
        return pa.types.is_integer(t.value_type if pa.types.is_dictionary(t) else t)

    named = [n for n in LABEL_NAMES if n in schema.names and n != image and integer(n)]
    if len(named) == 1:
        return named[0], f"an integer column named {named[0]!r}"
    if named:
        return None, "integer columns named both 'label' and 'labels': --label names the one to use"
    return None, "no ClassLabel column and no integer column named 'label' or 'labels' (--label names one)"


def int_classes(labels: List[Any]) -> Optional[List[str]]:
    """The class names of integer labels: "0" .. "N-1" for the largest label N-1 (so that
    ``classes[label]`` names a sample's class and ``len(classes)`` is the number of outputs a
    model needs, as ImageFolder's), or None past ``INT_CLASSES_MAX`` (ids, not classes)."""
    top = max((v for v in labels if type(v) is int and 0 <= v), default=-1)
    return [str(i) for i in range(top + 1)] if top < INT_CLASSES_MAX else None


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
        self.paths: List[Dict[int, str]] = []  # per row group: rows naming their image by path only (when read)
        self.labelled = False  # its labels were read (and are read again, a batch at a time, to make samples)
        self.class_names: set = set()  # its labels that are names (kind "name")
        self.top = -1  # its largest int label >= 0 (kind "int")


def open_file(location: Location, name: str) -> Any:
    if location.remote:
        return location.fs.open(location.path(name), "rb", block_size=4 << 20, cache_type="readahead")
    return open_regular(location.path(name))


@contextlib.contextmanager
def open_table(location: Location, name: str) -> Iterator[Tuple[Any, Any]]:
    """(the open file, its table) for a Parquet file (``pyarrow.parquet.ParquetFile``) or an
    Arrow IPC file (:class:`.arrow.ArrowFile`, with the features of the folder's
    ``dataset_info.json`` where it has them)."""
    pq = import_pyarrow()
    with open_file(location, name) as f:
        if is_arrow_name(name):
            yield f, open_arrow(location, name, f, saved_features(location))
        else:
            yield f, pq.ParquetFile(f)


def _stem(name: str) -> str:
    """A file's name without its .parquet or .arrow suffix."""
    for suffix in (SUFFIX, ARROW_SUFFIX):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


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


def _present(pf: Any, g: int, image: str) -> Tuple[Any, Dict[int, str]]:
    """Which rows of row group ``g`` hold an image (bytes, or a path naming one), as a numpy
    bool array, and the paths of the rows that name their image only by path (row in the group
    -> path). Read at scan only where the group's image data is too small to hold an image a
    row (``MIN_IMAGE_BYTES``): then reading it costs little, and the null rows become one
    skipped run instead of millions of planned samples."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    col = pf.read_row_group(g, columns=[image], use_threads=False).column(0)
    paths: Dict[int, str] = {}
    if pa.types.is_struct(col.type):
        data = pc.is_valid(pc.struct_field(col, "bytes"))
        has = data
        if col.type.get_field_index("path") >= 0:
            path_col = pc.struct_field(col, "path")
            only = pc.and_(pc.and_(pc.invert(data), pc.is_valid(path_col)), pc.is_valid(col))
            if pc.any(only).as_py():
                named = path_col.to_pylist()
                paths = {int(i): named[i] for i in np.flatnonzero(np.asarray(only.to_numpy(zero_copy_only=False)))}
            has = pc.or_(has, pc.is_valid(path_col))
        has = pc.and_(has, pc.is_valid(col))
    else:
        has = pc.is_valid(col)
    return np.asarray(has.to_numpy(zero_copy_only=False), dtype=bool), paths


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


def _named_format(location: Location, name: str, path: str) -> Optional[str]:
    """The field name the file a path-only image names calls for (its first bytes), or None."""
    try:
        with open_regular(image_path(location, name, path)) as f:
            return format_of(f.read(12))
    except (OSError, ValueError, BadInputError):
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


def _label_batches(pf: Any, column: str) -> Iterator[List[Any]]:
    for batch in pf.iter_batches(batch_size=LABEL_BATCH_ROWS, columns=[column], use_threads=False):
        yield batch.column(0).to_pylist()


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


def parquet_source(src: str, label: Union[str, bool, None] = None,
                   storage_options: Optional[Dict[str, Any]] = None, arrow: bool = False) -> Source:
    """The rows of a Parquet file, or of a folder's ``.parquet`` files (sorted by name), as a
    :class:`Source` of kind ``parquet``: see the module doc. Reads footers and the label
    column only. A file that is not readable Parquet (or lacks the columns the first readable
    file has) is skipped whole; with no image column at all, a one-line SourceError. ``label``:
    the label column; None finds it (:func:`_found_label`); False: none, dict samples of every
    column. The source's ``chosen`` says which, and why. ``arrow``:
    a folder's ``.arrow`` files are read (:mod:`.arrow`), as they are in a ``save_to_disk``
    folder without asking."""
    import_pyarrow()
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
        arrow = is_arrow_name(name)
    else:
        refuse_dataset_dict(location, src)
        entries = [(n, t, e) for n, t, e in _entries(location) if not is_ignored(n)]
        arrow = arrow or looks_like_saved([n for n, t, _ in entries if t == "file"])
        suffix = ARROW_SUFFIX if arrow else SUFFIX
        listed = []
        for n, t, e in entries:
            if t == "file" and n.lower().endswith(suffix):
                listed.append((n, e))
            elif arrow and t == "file" and n in (INFO_NAME, STATE_NAME):
                ignored.append(Skipped(escape_path(n), "save_to_disk metadata: read for the files' order and the "
                                                       "features, not a sample"))
            else:
                ignored.append(Skipped(escape_path(n), NOT_REGULAR if _not_regular(t) else f"not a {suffix} file"))
        if arrow:
            order, left = saved_files(location, [n for n, _ in listed])
            by_name = dict(listed)
            listed = [(n, by_name[n]) for n in order]
            ignored.extend(Skipped(escape_path(n), why) for n, why in left)
    what = "Arrow" if arrow else "Parquet"
    if not listed:
        raise SourceError(f"no {ARROW_SUFFIX if arrow else SUFFIX} files in {escape_path(src)}", src)

    skipped: List[Skipped] = []
    files: List[_File] = []
    image: Optional[str] = None
    field: Optional[str] = None
    label_col = label if isinstance(label, str) else None
    kind, names = "", None
    dicts = True  # dict samples (image and json), else (image, label)
    how = "--label" if isinstance(label, str) else "label=False (--no-label)"
    for name, e in listed:
        try:
            pf_info = _File(name, mtime_ns_of(e) if location.remote else os.stat(location.path(name)).st_mtime_ns)
            with open_table(location, name) as (_, pf):
                meta, schema = pf.metadata, pf.schema_arrow
                features = hf_features(schema)
                if image is None:  # the first readable file decides the columns
                    image = image_column(schema, features)
                    if image is None:
                        raise SourceError(
                            f"no image column in {escape_path(name)} (looked for a Hugging Face Image feature, a "
                            f"struct with binary 'bytes', a binary column; columns: {', '.join(schema.names)})", src)
                    if label is None:
                        label_col, how = _found_label(schema, features, image)
                    if label_col is not None:
                        if label_col not in schema.names:
                            raise SourceError(f"no column {label_col!r} in {escape_path(name)} (--label); columns: "
                                              f"{', '.join(schema.names)}", src)
                        if label_col == image:
                            raise SourceError(f"--label {label_col} names the image column", src)
                        kind, names = _label_kind(schema, features, label_col, escape_path(name))
                    dicts = label_col is None
                    ignored.extend(_left_out(schema, image, label_col, label, escape_path(name)))
                missing = [c for c in (image, label_col) if c is not None and c not in schema.names]
                if missing:
                    skipped.append(Skipped(escape_path(name), f"no column {missing[0]!r} (the first file has it)"))
                    continue
                if image_column(schema, features) != image:  # the same name, another kind of data
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
                    present, paths = (_present(pf, g, image) if not pf_info.empty[-1] and
                                      _column_bytes(rg, image) < MIN_IMAGE_BYTES * rg.num_rows else (None, {}))
                    pf_info.present.append(present)
                    pf_info.paths.append(paths)
                    if field is None and paths:  # no embedded image named the field: the first named file does
                        field = _named_format(location, name, paths[min(paths)])
                    if pf_info.present[-1] is not None and len(pf_info.present[-1]) != rg.num_rows:
                        raise ValueError(f"its footer declares {rg.num_rows} rows in row group {g}, its image column "
                                         f"holds {len(pf_info.present[-1])}")
                if label_col is not None:
                    rows = 0
                    for values in _label_batches(pf, label_col):  # what all files' classes need, not each label
                        rows += len(values)
                        if kind == "name":
                            pf_info.class_names.update(v for v in values if isinstance(v, str) and v)
                        elif kind == "int":
                            pf_info.top = max(pf_info.top, max((v for v in values if type(v) is int and 0 <= v),
                                                               default=-1))
                    if rows != meta.num_rows:  # the footer counts rows the data does not hold
                        raise ValueError(f"its footer declares {meta.num_rows} rows, its label column holds {rows}")
                    pf_info.labelled = True
        except SourceError:
            raise
        except Exception as exc:  # pyarrow's ArrowInvalid, OSError, a truncated footer...
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            skipped.append(Skipped(escape_path(name), f"not a readable {what} file: {text[:200]}"))
            continue
        files.append(pf_info)
    field = field or "jpg"

    index: Dict[str, int] = {}
    classes: Optional[List[str]] = None
    if kind == "classlabel":
        classes = list(names or [])
    elif kind == "name":
        classes = sorted({v for f in files for v in f.class_names})
        index = {c: i for i, c in enumerate(classes)}
    elif kind == "int":
        classes = int_classes([f.top for f in files])
    chosen = _chosen(image, label_col, how, kind, classes)

    samples = ScanTable(repeated_keys=True)  # on disk; a repeated key numbered at the end
    for f in files:
        with contextlib.ExitStack() as stack:
            labels = _Labels(stack, location, f.name, label_col) if f.labelled and label_col is not None else None
            _add_rows(samples, skipped, location, f, field, dicts, labels, kind, names, index)
    samples = samples.with_repeats_renamed(lambda key, count: disambiguate(key, str(count)))
    if not samples and not skipped:
        raise SourceError(f"no rows in the {what} files of {escape_path(src)}", src)
    return Source(location.url, "arrow" if arrow else "parquet", samples, classes, skipped, ignored, kind="parquet",
                  labelled=not dicts, options={"label": label} if label is not None else {}, chosen=chosen)


class _Labels:
    """A file's label column read again in batches, row by row in increasing order: one batch
    in memory, not the file's labels."""

    def __init__(self, stack: contextlib.ExitStack, location: Location, name: str, column: str):
        self.name, self.url = name, location.url
        try:
            _, pf = stack.enter_context(open_table(location, name))
            self.batches = _label_batches(pf, column)
        except Exception as exc:  # removed or rewritten since it was read
            raise SourceError(f"{escape_path(name)} became unreadable during the scan: {exc}", location.url) from None
        self.start = 0  # the batch in hand: its first row and its labels
        self.values: List[Any] = []

    def at(self, row: int) -> Any:
        while row >= self.start + len(self.values):
            self.start += len(self.values)
            values = next(self.batches, None)
            if values is None:
                raise SourceError(f"{escape_path(self.name)} changed during the scan: fewer labels than rows",
                                  self.url)
            self.values = values
        return self.values[row - self.start]


def _add_rows(samples: ScanTable, skipped: List[Skipped], location: Location, f: _File, field: str, dicts: bool,
              labels: Optional[_Labels], kind: str, names: Optional[List[str]], index: Dict[str, int]) -> None:
    """One file's rows appended as samples (or skipped, in runs, with their reasons)."""
    stem = _stem(f.name)
    shown = escape_path(f.name)
    runs = _Runs(shown, skipped)  # rows skipped for one reason, one after another: one entry
    base = 0
    for g, nrows in enumerate(f.group_rows):
        size = f.sizes[g]
        base += nrows
        if f.empty[g]:
            runs.skip(base - nrows, "no image (null): the row group's statistics count every image null", nrows)
            continue
        present, named = f.present[g], f.paths[g]
        for row in range(base - nrows, base):
            if present is not None and not present[row - base + nrows]:
                runs.skip(row, "no image (null)")
                continue
            row_size = size
            if row - base + nrows in named:  # an image named by path only: the file's own size
                try:
                    row_size = regular_size(image_path(location, f.name, named[row - base + nrows]))
                except (OSError, BadInputError, ValueError) as exc:
                    runs.skip(row, path_reason(named[row - base + nrows], exc))
                    continue
            path = f"{shown}/row {row}"
            sample_label = None
            if labels is not None:
                value = _label_of(labels.at(row), kind, names, index)
                if isinstance(value, str):
                    runs.skip(row, value)
                    continue
                sample_label = value
            runs.flush()
            try:
                key = encode_key(f"{stem}/{row:09d}")
            except ValueError:
                key = encode_key(f"{shown}/{row:09d}")
            inputs = [SourceFile(field, path, row_size, f.mtime_ns, f.name, row)]
            if dicts:
                inputs.append(SourceFile("json", f"{path}/json", 0, f.mtime_ns, f.name, row))
            samples.append(Sample(key, tuple(inputs), sample_label))
    runs.flush()


def _chosen(image: Optional[str], label_col: Optional[str], how: str, kind: str, classes: Optional[List[str]]) -> str:
    """What the samples are and why, in one line (``dsconvert info`` prints it)."""
    if label_col is None:
        return (f"dict samples (the image and json, every other column) from image column {image!r}: no label, "
                f"{how}")
    if classes is None:
        named = "no class names (labels past 100,000: ids, not classes)" if kind == "int" else "no class names"
    elif kind == "classlabel":
        named = f"classes: the ClassLabel's {len(classes)} names"
    elif kind == "name":
        named = f"classes: its {len(classes)} distinct names, sorted (labels index them)"
    else:
        named = f"classes: '0'..'{len(classes) - 1}' (the labels as they are, up to the largest)"
    return (f"(image, label) samples: image column {image!r}, label column {label_col!r} ({how}); {named}; "
            "--no-label (label=False) keeps every column as dict samples instead")


def _left_out(schema: Any, image: str, label_col: Optional[str], label: Union[str, bool, None],
              shown: str) -> List[Skipped]:
    """The columns the samples do not keep, each with the reason (see the module doc)."""
    out = []
    dicts = label_col is None
    given = f"label={label!r}" if isinstance(label, str) else f"the label column {label_col!r}"
    for fld in schema:
        if fld.name in (image, label_col):
            continue
        where = f"{shown}/column {escape_path(str(fld.name))}"
        if has_binary(fld.type):
            other = "another image column" if image_column_like(fld.type) else "binary data"
            out.append(Skipped(where, f"not kept: it holds {other} ({fld.type}); one image column is read "
                                      f"({image!r}), and the json field holds JSON only"))
        elif not dicts:
            out.append(Skipped(where, f"not kept: {given} makes (image, label) samples; --no-label (label=False) "
                                      "keeps every column (dict samples: the image and json)"))
    return out


def image_column_like(t: Any) -> bool:
    """Whether a column type is a struct with a ``bytes`` child (an image column's shape)."""
    import pyarrow as pa

    return pa.types.is_struct(t) and any(t.field(i).name == "bytes" for i in range(t.num_fields))
