"""``.npy`` arrays held in memory, their header checked against their length before anything
is allocated."""

from __future__ import annotations

import io
import struct
import tokenize
from typing import Any

import numpy as np

from ..errors import BadInputError

__all__ = ["NPY_HEADER_ERRORS", "load_npy"]

# what numpy's .npy header parser raises on a damaged header (it tokenizes the header's text)
NPY_HEADER_ERRORS = (ValueError, SyntaxError, TypeError, EOFError, struct.error, tokenize.TokenError, MemoryError,
                     RecursionError)


def load_npy(data: Any, allow_pickle: bool = False) -> np.ndarray:
    """An ``.npy`` held in memory, its header checked against its length before anything is
    allocated: a 128-byte file may declare a terabyte. Only ``.npy`` (not ``.npz``), and
    object arrays only with ``allow_pickle`` (loading them runs code from the data)."""
    data = bytes(data) if not isinstance(data, bytes) else data
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f"format version {version[0]}.{version[1]} is not read here (1.0 and 2.0 are)")
        shape, _, dtype = read_header(f, max_header_size=10000)
    except NPY_HEADER_ERRORS as exc:
        raise BadInputError(f"not a .npy array: {exc}") from None
    if dtype.hasobject:
        if not allow_pickle:
            raise BadInputError("the .npy holds pickled objects, which are never loaded unless "
                                "allow_pickle=True (loading them runs code from the data)")
    else:
        count = 1
        for n in shape:
            count *= int(n)
        if count * dtype.itemsize != len(data) - f.tell():
            raise BadInputError(f"the .npy header declares {shape} {dtype} ({count * dtype.itemsize:,} bytes) but "
                                f"{len(data) - f.tell():,} bytes follow it")
    f.seek(0)
    try:
        return np.load(f, allow_pickle=allow_pickle)
    except (ValueError, OSError, EOFError) as exc:
        raise BadInputError(f"not a loadable .npy array: {exc}") from None
