"""What the user already has: a folder or URL scanned into an ordered list of samples
(:mod:`.samples`), and the same source read as a Dataset without conversion (:mod:`.dataset`)."""

from typing import Any, Callable, Dict, Optional

from .samples import (LAYOUTS, FolderListing, Sample, Skipped, Source, SourceFile, is_ignored,
                      looks_like_image_folder, scan)

__all__ = ["container_reader", "LAYOUTS", "SourceFile", "Sample", "Skipped", "Source", "scan", "FolderListing",
           "looks_like_image_folder", "is_ignored", "open_source"]


def open_source(src: str, transform: Optional[Callable] = None, target_transform: Optional[Callable] = None,
                decode: str = "pil", layout: str = "auto", storage_options: Optional[Dict[str, Any]] = None) -> Any:
    """Scan ``src`` (a path or URL) and return it as a map-style Dataset, without conversion:
    :class:`dsconvert.source.dataset.SourceDataset` (imported here: Dataset modules import torch)."""
    from .dataset import SourceDataset

    return SourceDataset(scan(src, layout, storage_options=storage_options), transform=transform,
                         target_transform=target_transform, decode=decode, storage_options=storage_options)


def container_reader(kind: str) -> Callable[..., Any]:
    """How a conversion reads the inputs of a source of ``kind`` (tar, parquet, output):
    ``reader(spec, checked)`` yields (sample, fields or BadInputError) in the spec's order."""
    if kind == "tar":
        from .tars import read_tar_samples

        return read_tar_samples
    if kind == "parquet":
        from .parquet import read_parquet_samples

        return read_parquet_samples
    if kind == "output":
        from .outputs import read_output_samples

        return read_output_samples
    raise ValueError(f"no reader for sources of kind {kind!r}")
