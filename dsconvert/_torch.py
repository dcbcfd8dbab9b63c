"""Datasets that are torch Datasets when torch is installed, plain classes otherwise.

DataLoader treats a dataset as iterable only if it subclasses IterableDataset, so the base
class must be torch's. It is attached on first use, so ``import dsconvert`` and conversion
never pay torch's import (1-2 s).
"""

from __future__ import annotations

from typing import Dict

from .optional import optional_import

__all__ = ["iterable_dataset"]

_made: Dict[str, type] = {}


def iterable_dataset(cls: type, name: str) -> type:
    """``cls`` with ``torch.utils.data.IterableDataset`` as second base, named ``name`` in
    ``cls``'s module (so instances pickle into DataLoader workers); ``cls`` without torch."""
    key = f"{cls.__module__}.{name}"
    if key not in _made:
        data = optional_import("torch.utils.data")
        if data is None:
            made = type(name, (cls,), {})
        else:
            made = type(name, (cls, data.IterableDataset), {})
        made.__module__ = cls.__module__
        made.__qualname__ = name
        made.__doc__ = cls.__doc__
        _made[key] = made
    return _made[key]
