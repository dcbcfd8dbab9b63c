"""The Datasets, for users: ``open_dataset``, ``CachedDataset``, and ``ResumableSampler`` for
map-style outputs that resume mid-epoch.

Importing this module imports torch (when installed); ``dsconvert.open_dataset`` does not
until it makes a Dataset.
"""

from .readers.cached import CachedDataset
from .readers.map import MapDataset
from .readers.open import open_dataset
from .readers.sampler import ResumableSampler
from .readers.stream import StreamDataset

__all__ = ["open_dataset", "CachedDataset", "MapDataset", "StreamDataset", "ResumableSampler"]
