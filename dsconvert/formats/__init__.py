"""The format registry: one id per format, used as CLI value, module name and manifest key.

Entries name an import path, so a format's dependencies (h5py...) load only when used.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

__all__ = ["FORMATS", "DECODED_ONLY", "CAN_DECODE", "writer_class", "dataset_class"]

# id -> (module, writer class, dataset class)
FORMATS: Dict[str, Tuple[str, str, str]] = {
    "wds": ("dsconvert.formats.wds", "WdsWriter", "WdsDataset"),
    "hdf5": ("dsconvert.formats.hdf5", "HdfWriter", "HdfDataset"),
    "npy": ("dsconvert.formats.npy", "NpyWriter", "NpyDataset"),
}
# formats that hold decoded pixels always, or when asked (--decode)
DECODED_ONLY = ("npy",)
CAN_DECODE = ("hdf5", "npy")


def _load(fmt: str, slot: int) -> Any:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    entry = FORMATS[fmt]
    return getattr(importlib.import_module(entry[0]), entry[slot])


def writer_class(fmt: str) -> Any:
    return _load(fmt, 1)


def dataset_class(fmt: str) -> Any:
    return _load(fmt, 2)
