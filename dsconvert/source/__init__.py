"""The scanner: what the user already has, a folder or URL, scanned into an ordered list of
samples (:class:`dsconvert.samples.Source`) without reading their contents. Folders and list
files (:mod:`.folders`), and the samples of what another tool packed: tar shards
(:mod:`.tars`), Parquet files (:mod:`.parquet`) and Arrow files (Hugging Face ``save_to_disk``
folders: :mod:`.arrow`, read as Parquet files are), a dsconvert output (:mod:`.outputs`).

Reading the inputs a scan found is :mod:`dsconvert.inputs`' (for a conversion) and
:mod:`dsconvert.readers`' (a source read in place, tars read directly)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

from ..errors import SourceError
from ..io.location import Location, local_form
from ..keys import escape_path
from ..manifest import MANIFEST_NAME
from ..samples import CONTAINER_LAYOUTS, LAYOUTS, Sample, Skipped, Source, SourceFile
from .folders import FolderListing, ProgressFn, is_ignored, looks_like_image_folder, scan_files
from .outputs import output_source
from .parquet import looks_like_arrow, looks_like_parquet, parquet_source
from .tars import looks_like_tars, tar_source

__all__ = ["scan", "container_layout", "LAYOUTS", "SourceFile", "Sample", "Skipped", "Source", "FolderListing",
           "looks_like_image_folder", "is_ignored"]


def scan(src: str, layout: str = "auto", progress: Optional[ProgressFn] = None,
         storage_options: Optional[Dict[str, Any]] = None, label: Union[str, bool, None] = None) -> Source:
    """Scan ``src`` (a folder or list file: a path, or a URL fsspec reaches) into a
    :class:`Source`, reading no contents; or the samples of what another tool packed: tar
    shards (:mod:`.tars`), Parquet files (:mod:`.parquet`), a dsconvert output (:mod:`.outputs`),
    reading their headers and metadata (and labels: ``label``, where a sample's class label is;
    for Parquet and Arrow None finds it, False asks for dict samples of every column).

    ``progress`` is called with the number of files found in each folder walked (the members
    indexed in each tar).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    src = local_form(src)  # file:// URLs as the paths they name
    container = (layout if layout in CONTAINER_LAYOUTS else
                 container_layout(src, storage_options) if layout == "auto" else None)
    if label is not None and not isinstance(label, str) and not (label is False and container in ("parquet", "arrow")):
        raise SourceError(f"label must be a column or field name (or False for Parquet and Arrow: dict samples), "
                          f"not {label!r}", src)
    if container == "tars":
        return tar_source(src, label or None, storage_options, progress)
    if container in ("parquet", "arrow"):  # Arrow files (save_to_disk folders) are read as Parquet files are
        return parquet_source(src, label, storage_options, arrow=container == "arrow")
    if container == "output":
        if label is not None:
            raise SourceError("--label is for tar shards and Parquet files: a dsconvert output keeps its labels", src)
        return output_source(src, storage_options)
    if label is not None:
        raise SourceError(f"--label names where the label is inside tar shards or Parquet rows; {escape_path(src)} "
                          "is a folder or list source (labels come from class folders or the list)", src)
    return scan_files(src, layout, progress, storage_options)


def container_layout(src: str, storage_options: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """``output`` (a dsconvert output), ``parquet``, ``arrow`` (Hugging Face ``save_to_disk``
    folders), ``tars``, or None for files and lists."""
    if "{" not in src:
        try:
            if Location(src, storage_options, flat=False).exists(MANIFEST_NAME):
                return "output"
        except (OSError, ValueError):
            pass
    if looks_like_parquet(src, storage_options):
        return "parquet"
    if looks_like_arrow(src, storage_options):
        return "arrow"
    if looks_like_tars(src, storage_options):
        return "tars"
    return None
