"""Decoding when reading: a field by its kind, an image by the decode mode, and decode errors
named by the sample they are about."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any, Iterator, Tuple

import numpy as np
from PIL import Image

from ..errors import BadInputError, DsconvertError
from .checks import pil_rgb
from .fields import DECODE_MODES, field_kind
from .jpeg import decode_rgb, jpeg_decoders
from .npy import load_npy

__all__ = ["as_buffer", "decode_image", "PILLOW_DECODE_ERRORS", "decode_errors_naming", "decode_field", "image_size"]


def as_buffer(data: Any) -> np.ndarray:
    """Encoded bytes as a read-only 1-D uint8 array (zero-copy where ``data`` is a view)."""
    return data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)


def decode_image(data: Any, mode: str = "pil") -> Any:
    """Decode image bytes: ``pil`` -> RGB PIL image, ``numpy`` -> HWC uint8, ``raw`` -> bytes,
    ``buffer`` -> the encoded bytes as a uint8 array (zero-copy from a memory map)."""
    if mode == "raw":
        return bytes(data) if not isinstance(data, bytes) else data
    if mode == "buffer":
        return as_buffer(data)
    if mode == "pil":
        return pil_rgb(data)
    if mode == "numpy":
        return decode_rgb(data, jpeg_decoders()[0][0])
    raise ValueError(f"decode must be one of {DECODE_MODES}, not {mode!r}")


# what Pillow and its format plugins raise on a bad file (a reader's transform may raise other
# things, which stay as they are)
PILLOW_DECODE_ERRORS = (OSError, SyntaxError, ValueError, RecursionError, MemoryError, EOFError, IndexError,
                        struct.error, NotImplementedError, RuntimeError, OverflowError)


@contextlib.contextmanager
def decode_errors_naming(where: str) -> Iterator[None]:
    """Decode errors raised inside name ``where`` (a shard and sample): the message alone does
    not find the bad sample. Pillow says "corrupt" as OSError, SyntaxError or ValueError."""
    try:
        yield
    except BadInputError as exc:
        raise BadInputError(exc.reason, where) from None
    except DsconvertError:
        raise  # about the output, not this sample's bytes
    except PILLOW_DECODE_ERRORS as exc:
        raise BadInputError(f"cannot decode: {exc}", where) from None


def decode_field(field: str, data: Any, mode: str = "pil", allow_pickle: bool = False) -> Any:
    """Decode one field of a dict sample by its kind. Pickles (``.pyd``, ``.pickle``,
    ``.pkl``, object arrays in ``.npy``) run code when loaded: they stay bytes (or raise, for
    ``.npy``) unless ``allow_pickle``, for data you trust."""
    if mode == "raw":
        return bytes(data) if not isinstance(data, bytes) else data
    if mode == "buffer":
        return as_buffer(data)
    data = bytes(data) if not isinstance(data, bytes) else data
    kind = field_kind(field)
    if kind == "image":
        return decode_image(data, mode)
    if kind == "class":
        return int(data.decode("ascii").strip())
    if kind == "json":
        return json.loads(data.decode("utf-8"))
    if kind == "text":
        return data.decode("utf-8")
    if kind == "npy":
        try:
            return load_npy(data, allow_pickle)
        except BadInputError as exc:
            raise BadInputError(f".{field}: {exc.reason}") from None
    if kind == "pickle" and allow_pickle:
        import pickle

        return pickle.loads(data)
    return data


def image_size(path: str) -> Tuple[int, int]:
    """(height, width) from the file's header, without decoding."""
    with Image.open(path) as img:
        w, h = img.size
    return h, w
