"""What the map-style (random access) readers share: locating sample ``i`` in its shard,
per-process handles that never cross a fork, and the ImageFolder-shaped sample."""

from __future__ import annotations

import os
from bisect import bisect_right
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from ..cache import ShardAccess
from ..codecs import DECODE_MODES, ENCODED_MODES, decode_errors_naming, decode_image
from ..manifest import Manifest, ShardEntry

__all__ = ["MapReader"]


class MapReader:
    """Base of HdfDataset and NpyDataset: ``len``, indexing, negative indices, lazy shards.

    Subclasses implement ``_open(entry) -> handle`` and ``_read(handle, j) -> (pixels or
    encoded bytes, label)``. Handles are opened in the process that reads, and dropped when
    the dataset is pickled into a DataLoader worker (h5py and mmap handles must not be shared
    across fork).
    """

    def __init__(self, root: str, manifest: Manifest, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, decode: str = "pil",
                 access: Optional[ShardAccess] = None):
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, not {decode!r}")
        if manifest.sample_type != "classification":
            raise ValueError(f"{root}: {manifest.format} outputs hold (image, label) samples only")
        self.stored = getattr(manifest, "stored", "encoded")
        if decode in ENCODED_MODES and self.stored == "decoded":
            raise ValueError(f"{root} stores decoded pixels, so there are no encoded bytes for "
                             f"decode={decode!r}; use decode='numpy' or 'pil'")
        self.root = root
        self.access = access or ShardAccess(root)
        self.manifest = manifest
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.classes = manifest.classes
        self.class_to_idx = {c: i for i, c in enumerate(manifest.classes or [])}
        self._ends: List[int] = []
        total = 0
        for s in manifest.shards:
            total += s.num_samples
            self._ends.append(total)
        self._handles: Dict[int, Any] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        return state

    def _locate(self, index: int) -> Tuple[int, int]:
        n = self.manifest.num_samples
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples")
        k = bisect_right(self._ends, index)
        return k, index - (self._ends[k] - self.manifest.shards[k].num_samples)

    def _handle(self, k: int) -> Any:
        if self._pid != os.getpid():  # forked after opening: never reuse the parent's
            self._handles = {}
            self._pid = os.getpid()
        h = self._handles.get(k)
        if h is None:
            h = self._handles[k] = self._open(self.manifest.shards[k])
        return h

    def _open(self, entry: ShardEntry) -> Any:
        raise NotImplementedError

    def _read(self, handle: Any, j: int) -> Tuple[Any, int]:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Tuple[Any, Any]:
        k, j = self._locate(int(index))
        handle = self._handle(k)
        try:  # a plain try: free on the hot path, where a context manager costs as much as the read
            data, label = self._read(handle, j)
            if self.stored == "decoded":
                image = data if self.decode == "numpy" else Image.fromarray(np.asarray(data))
            else:
                image = decode_image(data, self.decode)
        except Exception:
            with decode_errors_naming(f"{self.manifest.shards[k].name}[{j}]"):
                raise
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label
