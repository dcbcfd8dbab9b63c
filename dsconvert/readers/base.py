"""What every Dataset of dsconvert shares, written once: torch's Dataset bases, decode modes
and transforms, and locating a sample in a run of shards.

Dataset modules import torch at their top (through this one) and are imported only when a
Dataset is made (``open_dataset``, ``open_source``, ``dsconvert.data``), so ``import
dsconvert`` and conversion never pay torch's import. Without torch they are plain classes
with the same interface.
"""

from __future__ import annotations

import operator
import warnings
from bisect import bisect_right
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from ..codecs import DECODE_MODES, decode_image
from ..errors import FusedFallbackWarning
from ..formats import Format, get
from ..fused import fuse
from ..io.shard_cache import ShardAccess
from ..manifest import Manifest
from ..optional import optional_import

__all__ = ["TorchDataset", "TorchIterableDataset", "Transforms", "ShardDataset", "locate", "sample_index"]

_torch_data = optional_import("torch.utils.data")
# Any to the type checker, as sampler.py's _Sampler: torch's classes, or the stand-ins below
TorchDataset: Any
TorchIterableDataset: Any
if _torch_data is not None:
    TorchDataset = _torch_data.Dataset
    TorchIterableDataset = _torch_data.IterableDataset
else:  # torch is optional: the same classes, without DataLoader's base
    class TorchDataset:  # type: ignore[no-redef]
        pass

    class TorchIterableDataset:  # type: ignore[no-redef]
        pass


class Transforms:
    """The ImageFolder-shaped part of a Dataset: ``decode`` mode, ``transform`` on the image
    (or on a dict sample), ``target_transform`` on the label, ``classes``/``class_to_idx``."""

    def __init__(self, transform: Optional[Callable] = None, target_transform: Optional[Callable] = None,
                 decode: str = "pil", classes: Optional[List[str]] = None,
                 modes: Sequence[str] = DECODE_MODES):
        if decode not in modes:
            raise ValueError(f"decode must be one of {tuple(modes)}, not {decode!r}")
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.classes = classes
        self.class_to_idx = {c: i for i, c in enumerate(classes or [])}
        # decode="fused": the transform's leading crop/resize folded into decoding (fused.py)
        self.fused = fuse(transform) if decode == "fused" else None
        if self.fused is not None and not self.fused.fused and transform is not None:
            warnings.warn(f"decode='fused' decodes whole images for this dataset: {self.fused.why_not}. The samples "
                          "are the transform's, only slower; put the crop or resize first to fold it into decoding",
                          FusedFallbackWarning, stacklevel=4)

    def _fused_needs_images(self, classification: bool) -> None:
        if self.fused is not None and not classification:
            raise ValueError("decode='fused' fuses an image transform with decoding: it needs (image, label) "
                             "samples (ImageFolder and list sources), not dicts of fields")

    def _image(self, data: Any, decoded: bool = False) -> Any:
        """One image's bytes (or decoded HWC pixels) -> the transformed image; with
        ``decode="fused"`` the transform is applied here, so :meth:`_finish` skips it."""
        if self.fused is not None:
            return self.fused.from_pixels(np.asarray(data)) if decoded else self.fused.from_bytes(data)
        if decoded:
            return data if self.decode == "numpy" else Image.fromarray(np.asarray(data))
        return decode_image(data, self.decode)

    def _finish(self, image: Any, label: Any) -> Tuple[Any, Any]:
        """``(image, label)`` with the user's transforms applied."""
        if self.transform is not None and self.fused is None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def _finish_dict(self, sample: Dict[str, Any]) -> Any:
        return self.transform(sample) if self.transform is not None else sample


def collate(samples: List[Any], encoded: bool = False) -> Any:
    """A batch from its samples, as the DataLoader would build it: torch's ``default_collate``
    (same-shape tensors stacked into one contiguous tensor, allocated in shared memory inside a
    DataLoader worker so that it reaches the trainer without a copy). ``encoded`` images (bytes
    of differing lengths) stay a list beside the stacked labels."""
    from torch.utils.data import default_collate

    if encoded and samples and isinstance(samples[0], tuple):
        images, labels = zip(*samples)
        return list(images), default_collate(list(labels))
    if samples and isinstance(samples[0], dict):
        fields = set(samples[0])
        odd = next((s for s in samples if set(s) != fields), None)
        if odd is not None:
            raise ValueError(f"samples {samples[0].get('__key__')!r} and {odd.get('__key__')!r} hold different "
                             f"fields ({sorted(fields ^ set(odd))} in one only), so they cannot be batched: "
                             "read without batch_size, or give the DataLoader a collate_fn")
    return default_collate(samples)


def sample_index(index: Any, n: int) -> int:
    """``index`` as a sample number in [0, n), by the one rule of every dsconvert Dataset: what
    ImageFolder's list indexing takes (anything with ``__index__``: ints, numpy integers,
    integer tensors of one element, as ``Subset(ds, torch.randperm(n)[:k])`` passes), negative
    counting from the end. Anything else (a float, a string, a float tensor) is a TypeError,
    never rounded; out of range an IndexError."""
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(f"sample indices are integers (what a list takes), not {type(index).__name__} "
                        f"{index!r:.40}") from None
    given = i
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"sample index {given} out of range for {n} samples")
    return i


def locate(ends: List[int], position: int, sizes: Sequence[int]) -> Tuple[int, int]:
    """(shard k, sample j within it) of ``position`` in a run of shards whose cumulative
    sample counts are ``ends`` and counts ``sizes``."""
    k = bisect_right(ends, position)
    return k, position - (ends[k] - sizes[k])


def cumulative(sizes: Sequence[int]) -> List[int]:
    ends: List[int] = []
    total = 0
    for n in sizes:
        total += n
        ends.append(total)
    return ends


class ShardDataset(Transforms):
    """Base of the Datasets over a dsconvert output: the manifest, its format (which opens
    shards, :class:`dsconvert.formats.base.ShardReader`), where shards are reached
    (``access``)."""

    def __init__(self, root: str, manifest: Manifest, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, decode: str = "pil",
                 access: Optional[ShardAccess] = None):
        super().__init__(transform, target_transform, decode, manifest.classes)
        self.root = root
        self.access = access or ShardAccess(root)
        self.manifest = manifest
        self.format: type[Format] = get(manifest.format)
        self.classification = manifest.sample_type == "classification"
        self._fused_needs_images(self.classification)
