"""The options every writer (``convert``, ``Writer``, ``optimize``) takes, each checked here
once, with one message: a bad one is an :class:`OptionError` before anything is written (found
at ``close()`` it would lose a whole run's samples), and the same mistake reads the same
whichever way the output is written."""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Type

from ..codecs import parse_compression, require_codec
from ..errors import OptionError
from ..formats import FORMATS, Format, get
from ..plan import parse_size

__all__ = ["check_format", "check_prefix", "check_quality", "check_positive", "check_shard_size",
           "check_compression", "check_decode", "check_flag", "check_storage_options"]

_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def check_format(format: Any) -> Type[Format]:
    """The format named ``format``."""
    if not isinstance(format, str) or format not in FORMATS:
        raise OptionError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    return get(format)


def check_prefix(prefix: Any) -> str:
    """A plain file name stem: shards are named PREFIX-NNNNNN.<suffix> inside the output."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise OptionError(f"prefix must be a plain file name stem, not {prefix!r}")
    return prefix


def check_quality(quality: Any) -> int:
    """A JPEG/WebP quality, 1..100."""
    if type(quality) is not int or not 1 <= quality <= 100:
        raise OptionError(f"quality must be an int within 1..100, not {quality!r}")
    return quality


def check_positive(name: str, value: Any) -> int:
    """A count that must be at least 1 (``samples_per_shard``, ``min_shards``)."""
    if type(value) is not int or value < 1:
        raise OptionError(f"{name} must be a positive int, not {value!r}")
    return value


def check_shard_size(shard_size: Any) -> int:
    """A shard's byte bound: an int of bytes, or a size such as ``'1GB'``."""
    if isinstance(shard_size, str):
        nbytes = parse_size(shard_size)
    elif type(shard_size) is int:
        nbytes = shard_size
    else:
        raise OptionError(f"shard_size must be a size (an int of bytes, or a str such as '1GB'), not {shard_size!r}")
    if nbytes < 1:
        raise OptionError(f"shard_size must be positive, not {shard_size!r}")
    return nbytes


def check_compression(fmt: Type[Format], compress: Any) -> Optional[Dict[str, Any]]:
    """``compress`` parsed (None: off), for a format that compresses fields, its codec loaded."""
    compression = parse_compression(compress)
    if compression is not None:
        if not fmt.compresses_fields:
            able = ", ".join(f for f in FORMATS if get(f).compresses_fields)
            raise OptionError(f"compress applies to {able} outputs: {fmt.id} holds images and labels only, which "
                              "are not compressed")
        require_codec(compression)
    return compression


def check_decode(fmt: Type[Format], decode: Any) -> bool:
    """Whether the output stores decoded pixels: asked, or the format's only way."""
    decode = bool(decode) or fmt.pixels == "always"
    if decode and fmt.pixels == "never":
        can = ", ".join(f for f in FORMATS if get(f).pixels != "never")
        raise OptionError(f"decode=True needs a format that stores pixels ({can})")
    return decode


def check_flag(name: str, value: Any) -> bool:
    """A True/False option (``decode``, ``overwrite``, ``progress``)."""
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be True or False, not {value!r}")
    return value


def check_storage_options(storage_options: Any) -> None:
    """None, or fsspec's options as a dict of names to values."""
    if storage_options is not None and not (isinstance(storage_options, Mapping)
                                            and all(isinstance(k, str) for k in storage_options)):
        raise OptionError(f"storage_options must be a dict of option names to values, not {storage_options!r}")
