"""The source as it is, as a map-style Dataset: the baseline a conversion is measured against.

For ImageFolder and list sources a sample is ``(RGB PIL image, class index)`` in exactly
``torchvision.datasets.ImageFolder``'s order and pixels (one file opened, read and decoded
per sample), without needing torchvision. Flat sources give dicts of decoded fields, as
``open_dataset`` does for them. ``dsconvert bench SRC`` reads sources through this class.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

from ..codecs import decode_field
from ..io.location import Location
from ..readers.base import TorchDataset, Transforms
from .samples import Source

__all__ = ["SourceDataset"]


class SourceDataset(Transforms, TorchDataset):
    """Map-style dataset over a scanned source; see the module doc."""

    def __init__(self, source: Source, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, decode: str = "pil",
                 storage_options: Optional[Dict[str, Any]] = None):
        super().__init__(transform, target_transform, decode, source.classes)
        self.source = source
        self.location = Location(source.root, storage_options, flat=False)  # remote sources: one GET per file
        self.classification = source.sample_type == "classification"
        self._fused_needs_images(self.classification)

    def __len__(self) -> int:
        return len(self.source.samples)

    def paths(self, index: int) -> List[str]:
        """The files sample ``index`` is read from (paths, or URLs for remote sources)."""
        return [f.path if os.path.isabs(f.path) else self.location.url_of(f.path)
                for f in self.source.samples[index].files]

    def _read(self, rel: str) -> bytes:
        if os.path.isabs(rel) or not self.location.remote:
            with open(rel if os.path.isabs(rel) else self.location.url_of(rel), "rb") as f:
                return f.read()
        return self.location.read_bytes(rel)

    def __getitem__(self, index: int) -> Any:
        sample = self.source.samples[index]
        if self.classification:
            return self._finish(self._image(self._read(sample.files[0].path)), sample.label)
        out: Dict[str, Any] = {"__key__": sample.key}
        for file in sample.files:
            out[file.field] = decode_field(file.field, self._read(file.path), self.decode)
        return self._finish_dict(out)
