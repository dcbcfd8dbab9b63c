"""Arrow IPC files (Hugging Face ``datasets``' ``save_to_disk`` folders, ``Dataset.from_file``)
read as the Parquet source reads Parquet files (:mod:`.parquet`): the same columns, labels,
keys and skips, each record batch standing for a row group.

A ``save_to_disk`` folder holds ``data-NNNNN-of-NNNNN.arrow`` files (Arrow IPC streams),
``state.json`` (which files, in order) and ``dataset_info.json`` (the features: which column
is the ``Image``, the ``ClassLabel`` names). The files ``state.json`` lists are read in its
order (without a readable one, the folder's ``.arrow`` files by name); the features come from
``dataset_info.json`` where it holds them, else from each file's own schema metadata. The
features only name columns: a column is still read as an image only if its type holds image
bytes, so a lying ``dataset_info.json`` changes labels (class names) at most, and a label out
of range of its names is a skipped row. A file that is not Arrow is skipped whole with
pyarrow's one line, as a Parquet file that is not Parquet is.

A local file is memory-mapped (its batches are read where they lie, so memory stays flat);
a remote one is read whole into memory first. A ``DatasetDict`` folder (``dataset_dict.json``
and one folder per split) is refused with the splits to choose from.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..errors import SourceError
from ..io.location import Location
from ..keys import escape_path

__all__ = ["ARROW_SUFFIX", "ArrowFile", "looks_like_saved", "saved_files", "saved_features", "dataset_dict_splits",
           "INFO_NAME", "STATE_NAME"]

ARROW_SUFFIX = ".arrow"
INFO_NAME = "dataset_info.json"
STATE_NAME = "state.json"
DICT_NAME = "dataset_dict.json"
MAX_JSON_BYTES = 16 << 20  # a save_to_disk metadata file larger than this is not read


class _Column:
    def __init__(self, name: str, nbytes: int):
        self.path_in_schema = name
        self.total_uncompressed_size = nbytes
        self.statistics = None


class _Group:
    def __init__(self, batch: Any):
        self.num_rows = batch.num_rows
        self._columns = [_Column(str(name), int(batch.column(i).nbytes)) for i, name in enumerate(batch.schema.names)]
        self.num_columns = len(self._columns)

    def column(self, i: int) -> _Column:
        return self._columns[i]


class _Meta:
    def __init__(self, batches: List[Any]):
        self.groups = [_Group(b) for b in batches]
        self.num_row_groups = len(batches)
        self.num_rows = sum(g.num_rows for g in self.groups)

    def row_group(self, g: int) -> _Group:
        return self.groups[g]


class ArrowFile:
    """An Arrow IPC file (stream or file format) with the part of ``pyarrow.parquet.ParquetFile``'s
    interface the Parquet source uses: ``metadata`` (each record batch a row group; sizes from
    the batches' buffers, no statistics), ``schema_arrow`` (with ``features``, where given, as
    its Hugging Face metadata), ``read_row_group`` and ``iter_batches``."""

    def __init__(self, source: Any, features: Optional[Dict[str, Any]] = None):
        import pyarrow as pa

        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            if hasattr(source, "seek"):
                source.seek(0)
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            schema = reader.schema
        else:
            batches = list(reader)
            schema = reader.schema
        if features:
            meta = dict(schema.metadata or {})
            meta[b"huggingface"] = json.dumps({"info": {"features": features}}).encode("utf-8")
            schema = schema.with_metadata(meta)
        self.schema_arrow = schema
        self.batches = [b for b in batches if b.num_rows]
        self.metadata = _Meta(self.batches)

    def read_row_group(self, g: int, columns: Optional[List[str]] = None, use_threads: bool = False) -> Any:
        import pyarrow as pa

        batch = self.batches[g]
        return pa.Table.from_batches([batch.select(columns) if columns is not None else batch])

    def iter_batches(self, batch_size: int = 65536, row_groups: Optional[List[int]] = None,
                     columns: Optional[List[str]] = None, use_threads: bool = False) -> Iterator[Any]:
        for g in (range(len(self.batches)) if row_groups is None else row_groups):
            batch = self.batches[g]
            if columns is not None:
                batch = batch.select(columns)
            for at in range(0, batch.num_rows, batch_size):
                yield batch.slice(at, batch_size)


def open_arrow(location: Location, name: str, f: Any, features: Optional[Dict[str, Any]]) -> ArrowFile:
    """The Arrow file ``name`` (opened as ``f``, a regular file) read as :class:`ArrowFile`."""
    import pyarrow as pa

    if location.remote:
        return ArrowFile(pa.BufferReader(f.read()), features)
    return ArrowFile(pa.memory_map(location.path(name)), features)


def _read_json(location: Location, name: str) -> Any:
    """A small JSON file of the folder, or None (missing, too large, not JSON)."""
    try:
        with location.fs.open(location.path(name), "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            return None
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def looks_like_saved(names: List[str]) -> bool:
    """Whether a folder's entry names are a ``save_to_disk`` folder's: ``.arrow`` files beside
    ``dataset_info.json`` or ``state.json``."""
    return any(n.lower().endswith(ARROW_SUFFIX) for n in names) and (INFO_NAME in names or STATE_NAME in names)


def dataset_dict_splits(location: Location) -> Optional[List[str]]:
    """The splits of a ``DatasetDict`` folder (its ``dataset_dict.json``), or None."""
    try:
        if not location.exists(DICT_NAME):
            return None
    except (OSError, ValueError):
        return None
    got = _read_json(location, DICT_NAME)
    splits = got.get("splits") if isinstance(got, dict) else None
    return [str(s) for s in splits] if isinstance(splits, list) else []


def refuse_dataset_dict(location: Location, src: str) -> None:
    """A one-line SourceError for a ``DatasetDict`` folder (``save_to_disk`` of several splits)."""
    splits = dataset_dict_splits(location)
    if splits is not None:
        which = ", ".join(escape_path(os.path.join(src, s)) for s in splits[:8]) or "SRC/SPLIT"
        raise SourceError(f"{escape_path(src)} is a DatasetDict saved with save_to_disk: convert one split at a time "
                          f"({which})", src)


def saved_files(location: Location, arrow_names: List[str]) -> Tuple[List[str], List[Tuple[str, str]]]:
    """The ``.arrow`` files of a ``save_to_disk`` folder in the order ``state.json`` lists them
    (those of ``arrow_names`` only), and (name, reason) for the folder's files left out."""
    state = _read_json(location, STATE_NAME)
    listed = state.get("_data_files") if isinstance(state, dict) else None
    names: List[str] = []
    if isinstance(listed, list):
        for entry in listed:
            name = entry.get("filename") if isinstance(entry, dict) else None
            if isinstance(name, str) and name in arrow_names and name not in names:
                names.append(name)
    if not names:
        names = sorted(arrow_names)
    left = [(n, f"not listed in {STATE_NAME}: not part of the saved dataset") for n in arrow_names if n not in names]
    return names, left


def saved_features(location: Location) -> Optional[Dict[str, Any]]:
    """The features ``dataset_info.json`` names (None: none readable)."""
    info = _read_json(location, INFO_NAME)
    features = info.get("features") if isinstance(info, dict) else None
    return features if isinstance(features, dict) and features else None


def is_arrow_name(name: str) -> bool:
    """Whether a file name is an Arrow file's (``.arrow``): read as :class:`ArrowFile`."""
    return bool(re.search(r"\.arrow$", name, re.IGNORECASE))


def dataset_folder(ds: Any, out: str) -> str:
    """The folder a ``datasets.Dataset`` object is converted from: the ``save_to_disk`` folder
    it was loaded from (``load_from_disk``) where its rows and features are that folder's as
    saved (the same files, features and number of rows); otherwise (in memory, a selection or
    shuffle of rows, cast features, cache files of ``map``) it is saved once with
    ``save_to_disk`` (images embedded) into ``OUT.hf-FINGERPRINT`` beside a local output
    (under the temporary folder for a remote one) and read from there: the same Dataset,
    converted again, reuses that copy, so a conversion resumes."""
    import tempfile

    files = [str(c.get("filename", "")) for c in (getattr(ds, "cache_files", None) or []) if isinstance(c, dict)]
    folders = {os.path.dirname(f) for f in files}
    if files and len(folders) == 1 and getattr(ds, "_indices", None) is None:
        folder = folders.pop()
        location = Location(folder, flat=False)
        state = _read_json(location, STATE_NAME)
        listed = [e.get("filename") for e in state.get("_data_files", [])] if isinstance(state, dict) else []
        try:
            same_features = saved_features(location) == json.loads(json.dumps(ds.features.to_dict()))
        except (TypeError, ValueError, AttributeError):
            same_features = False
        same_rows = _rows_in(files) == getattr(ds, "num_rows", None)  # a contiguous select() slices the same files
        if listed == [os.path.basename(f) for f in files] and same_features and same_rows:
            return folder
    fingerprint = re.sub(r"[^A-Za-z0-9]", "", str(getattr(ds, "_fingerprint", "")))[:32] or "dataset"
    remote = "://" in out and not out.startswith("file://")
    base = os.path.join(tempfile.gettempdir(), f"dsconvert-{fingerprint}") if remote else \
        f"{os.path.abspath(out).rstrip(os.sep)}.hf-{fingerprint}"
    if os.path.isfile(os.path.join(base, STATE_NAME)):
        return base
    staging = f"{base}.partial"
    if os.path.isdir(staging):
        import shutil

        shutil.rmtree(staging)
    ds.save_to_disk(staging)
    os.replace(staging, base)
    return base


def _rows_in(files: List[str]) -> Optional[int]:
    """The rows the Arrow files hold (None: one is not readable Arrow)."""
    import pyarrow as pa

    try:
        return sum(ArrowFile(pa.memory_map(f)).metadata.num_rows for f in files)
    except (OSError, ValueError, pa.ArrowException):
        return None
