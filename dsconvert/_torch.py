"""Datasets that are torch Datasets when torch is installed, plain classes otherwise.

DataLoader treats a dataset as iterable only if it subclasses IterableDataset, so the base
class must be torch's. It is attached on first use, so ``import dsconvert`` and conversion
never pay torch's import (1-2 s).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from .optional import optional_import

__all__ = ["iterable_dataset", "map_dataset", "lazy_module_attr"]

_made: Dict[str, type] = {}


def _with_torch_base(cls: type, name: str, base: str) -> type:
    key = f"{cls.__module__}.{name}"
    if key not in _made:
        data = optional_import("torch.utils.data")
        bases = (cls,) if data is None else (cls, getattr(data, base))
        made = type(name, bases, {})
        made.__module__ = cls.__module__
        made.__qualname__ = name
        made.__doc__ = cls.__doc__
        _made[key] = made
    return _made[key]


def iterable_dataset(cls: type, name: str) -> type:
    """``cls`` with ``torch.utils.data.IterableDataset`` as second base, named ``name`` in
    ``cls``'s module (so instances pickle into DataLoader workers); ``cls`` without torch."""
    return _with_torch_base(cls, name, "IterableDataset")


def map_dataset(cls: type, name: str) -> type:
    """The same with ``torch.utils.data.Dataset``: a map-style dataset for samplers."""
    return _with_torch_base(cls, name, "Dataset")


def lazy_module_attr(namespace: Dict[str, Any], name: str, cls: type, kind: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that makes ``name`` (``cls`` on torch's base of ``kind``,
    "iterable" or "map") on first access, so importing the module never imports torch."""
    make = iterable_dataset if kind == "iterable" else map_dataset

    def __getattr__(attr: str) -> Any:
        if attr == name:
            made = namespace[name] = make(cls, name)
            return made
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {attr!r}")

    return __getattr__
