"""``open_dataset``: read a manifest and return the right Dataset for its format."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from .formats import FORMATS, dataset_class
from .manifest import Manifest

__all__ = ["open_dataset", "CachedDataset"]  # noqa: F822 (CachedDataset: see __getattr__)


def __getattr__(name: str) -> Any:
    if name == "CachedDataset":  # imported on first use (it subclasses torch's Dataset)
        from .cached import CachedDataset

        return CachedDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_dataset(
    path: str,
    transform: Optional[Callable] = None,
    target_transform: Optional[Callable] = None,
    decode: str = "pil",
    **options: Any,
) -> Any:
    """Open a dsconvert output as a Dataset, a drop-in for ``ImageFolder(root, transform)``.

    ``decode``: ``"pil"`` (RGB PIL images, exactly as ImageFolder loads them), ``"numpy"``
    (HWC uint8 arrays through the fastest JPEG decoder that loads) or ``"raw"`` (the encoded
    bytes). For ImageFolder and list sources a sample is ``(image, label)``; for other
    sources a dict of decoded fields with ``__key__``.

    Format options (wds): ``shuffle``, ``seed``, ``buffer_size``, ``rank``, ``world_size``,
    ``even`` (None | "pad" | "drop"), ``prefetch``, ``allow_pickle`` (default False: pickled
    fields stay bytes, since loading them runs code from the data); see
    :class:`dsconvert.formats.wds.WdsDataset`. Images larger than
    ``PIL.Image.MAX_IMAGE_PIXELS`` raise BadInputError (decompression bombs), on every decode path.
    hdf5 and npy outputs are map-style (``len``, indexing; shuffle and DDP through the
    DataLoader's sampler, e.g. ``DistributedSampler``); decoded ones have no ``"raw"`` mode,
    and npy's ``"numpy"`` mode returns zero-copy, read-only views of the memory map.
    """
    root = os.path.abspath(path)
    manifest = Manifest.load(root)
    if manifest.format not in FORMATS:
        raise ValueError(f"{root}: format {manifest.format!r} is not one this dsconvert reads")
    cls = dataset_class(manifest.format)
    return cls(root, manifest, transform=transform, target_transform=target_transform,
               decode=decode, **options)
