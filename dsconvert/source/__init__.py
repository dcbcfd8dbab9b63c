"""What the user already has: a folder or URL scanned into an ordered list of samples
(:mod:`.samples`), and the same source read as a Dataset without conversion (:mod:`.dataset`)."""

from typing import Any

from .samples import (LAYOUTS, FolderListing, Sample, Skipped, Source, SourceFile, is_ignored,
                      looks_like_image_folder, scan)

__all__ = ["LAYOUTS", "SourceFile", "Sample", "Skipped", "Source", "scan", "FolderListing",
           "looks_like_image_folder", "is_ignored", "open_source"]


def open_source(*args: Any, **kwargs: Any) -> Any:
    """Scan a source and return it as a Dataset: :func:`dsconvert.source.dataset.open_source`
    (imported on use, since Dataset modules import torch)."""
    from .dataset import open_source as _open_source

    return _open_source(*args, **kwargs)
