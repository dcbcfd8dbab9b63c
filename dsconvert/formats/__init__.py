"""The format registry: one id per format, used as CLI value, module name and manifest key.

Each id names a module of this package that defines one :class:`~.base.Format` subclass,
``FORMAT``; it is imported on first use. Adding a format means adding its module and its id
here; the contract tests (``tests/test_format_contract.py``) then run it through conversion,
reading, ``verify`` and the attacks every format must withstand.
"""

from __future__ import annotations

import importlib
from typing import Tuple, Type

from .base import Format

__all__ = ["FORMATS", "get", "Format"]

FORMATS: Tuple[str, ...] = ("wds", "hdf5", "npy")


def get(fmt: str) -> Type[Format]:
    """The format ``fmt``; a ValueError naming the known ones for anything else."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    return importlib.import_module(f"{__name__}.{fmt}").FORMAT
