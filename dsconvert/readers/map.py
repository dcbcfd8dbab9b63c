"""``MapDataset``: random access (``len``, indexing) over the shards of any format; hdf5 and
npy outputs open as this. Shuffling and DDP come from the DataLoader's sampler."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ..codecs import ENCODED_MODES, decode_errors_naming
from ..formats.base import ShardReader
from ..io.shard_cache import ShardAccess
from ..manifest import Manifest
from ..processes import ProcessLocal, settle_worker
from .base import ShardDataset, TorchDataset, cumulative, locate

__all__ = ["MapDataset"]


class MapDataset(ShardDataset, TorchDataset):
    """Map-style Dataset of ``(image, label)``; a drop-in for ImageFolder. Shards open lazily,
    in the process that reads (h5py and mmap handles never cross a fork). Outputs that store
    pixels give them as zero-copy views (npy) with ``decode="numpy"``. See
    :func:`dsconvert.open_dataset`."""

    def __init__(self, root: str, manifest: Manifest, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, decode: str = "pil",
                 access: Optional[ShardAccess] = None):
        super().__init__(root, manifest, transform, target_transform, decode, access)
        if not self.classification:
            raise ValueError(f"{root}: {manifest.format} outputs hold (image, label) samples only")
        self.stored = manifest.stored
        if decode in ENCODED_MODES and self.stored == "decoded":
            raise ValueError(f"{root} stores decoded pixels, so there are no encoded bytes for "
                             f"decode={decode!r}; use decode='numpy' or 'pil'")
        self._sizes = [s.num_samples for s in manifest.shards]
        self._ends = cumulative(self._sizes)
        self._shards: Dict[int, ShardReader] = ProcessLocal()

    def __len__(self) -> int:
        return self.manifest.num_samples

    def shard(self, k: int) -> ShardReader:
        """Shard k, opened in this process on first use."""
        shard = self._shards.get(k)
        if shard is None:
            settle_worker()
            shard = self._shards[k] = self.format.open_shard(self.access, self.manifest.shards[k], self.manifest)
        return shard

    def __getitem__(self, index: int) -> Tuple[Any, Any]:
        n = self.manifest.num_samples
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {index} out of range for {n} samples")
        k, j = locate(self._ends, i, self._sizes)
        shard = self.shard(k)
        try:  # a plain try: free on the hot path, where a context manager costs as much as the read
            image = self._image(shard.image(j), self.stored == "decoded")
        except Exception:
            with decode_errors_naming(f"{self.manifest.shards[k].name}[{j}]"):
                raise
        return self._finish(image, shard.labels[j])

    def __getitems__(self, indices: List[int]) -> List[Tuple[Any, Any]]:
        """The samples of one batch (torch's DataLoader calls this once per batch, then
        collates): one call instead of ``len(indices)`` from the fetcher."""
        getitem = self.__getitem__
        return [getitem(i) for i in indices]
