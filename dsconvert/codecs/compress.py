"""zstd-compressed fields (``--compress zstd[:LEVEL]``): which fields are compressed, how, and
how they are read back within a bound.

Only fields that zstd can shrink are compressed: not images (JPEG, PNG, WebP... are compressed
already), not audio, video or archives (``gz``, ``zst``, ``npz``...), and not class labels (a
few digits, which a zstd frame would make three times larger, and which webdataset users read
as ``cls``). Which fields those are depends on the field's name only, so every sample of an
output stores a field the same way: a webdataset user sees ``json.zst`` in every sample, never
``json`` in some and ``json.zst`` in others.

A compressed field is one zstd frame (:data:`SUFFIX` appended to the member's name) with its
content size and a checksum in the frame header: the same bytes for the same input, level and
libzstd version (one thread, no dictionary). Reading refuses a frame whose declared size is not
the size recorded at writing before anything is allocated, so a hostile member (a tiny frame
declaring a terabyte) costs nothing: :func:`decompress_field`.

``zstandard`` is an optional dependency (``pip install 'dsconvert[zstd]'``), imported on first
use only.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Dict, Optional

from ..errors import BadInputError, OptionError
from ..optional import require
from .fields import CLASS_EXTENSIONS, IMAGE_EXTENSIONS

__all__ = ["CODECS", "DEFAULT_LEVEL", "MAX_LEVEL", "SUFFIX", "ALREADY_COMPRESSED", "parse_compression",
           "compression_label", "require_codec", "is_compressible", "stored_name", "compressed_bound",
           "codec_version", "Compressor", "decompress_field"]

CODECS = ("zstd",)
# zstd's own default. On the benchmark's non-image fields (docs/benchmarks/conversion-and-reads.md)
# levels 1-19 stored within 1% of each other; 3 wrote as fast as no compression, 9 and 19 took
# 1.25x and 2.3x as long
DEFAULT_LEVEL = 3
MAX_LEVEL = 22
SUFFIX = "zst"  # a compressed member is <key>.<field>.zst: webdataset sees the field "<field>.zst"
# fields compressed already (or pointless to compress): images beyond torchvision's list, audio,
# video and archives
ALREADY_COMPRESSED = frozenset(IMAGE_EXTENSIONS) | {
    "gif", "avif", "heic", "heif", "jxl", "jp2",
    "mp3", "mp4", "m4a", "m4v", "aac", "ogg", "oga", "opus", "flac", "webm", "mkv", "mov", "avi",
    "gz", "tgz", "bz2", "xz", "lzma", "zst", "zstd", "lz4", "br", "zip", "7z", "npz", "parquet",
}
_SPEC = re.compile(r"(?P<codec>[a-z]+)(?::(?P<level>-?\d+))?")


def parse_compression(value: Optional[str]) -> Optional[Dict[str, Any]]:
    """``"zstd"`` or ``"zstd:LEVEL"`` as ``{"codec": "zstd", "level": LEVEL}`` (None, ``""`` or
    ``"none"``: None); anything else a one-line OptionError. Plain data: it rides in shard specs,
    whose digest it enters."""
    if value is None or value in ("", "none"):
        return None
    m = _SPEC.fullmatch(value) if isinstance(value, str) else None
    if m is None or m["codec"] not in CODECS:
        raise OptionError(f"compress must be 'zstd' or 'zstd:LEVEL' (LEVEL 1..{MAX_LEVEL}), not {value!r}")
    level = int(m["level"]) if m["level"] is not None else DEFAULT_LEVEL
    if not 1 <= level <= MAX_LEVEL:
        raise OptionError(f"the zstd level must be within 1..{MAX_LEVEL}, not {level}")
    return {"codec": m["codec"], "level": level}


def compression_label(compression: Dict[str, Any]) -> str:
    """The setting as it is written (``zstd:3``): the manifest's ``options.compress``."""
    return f"{compression['codec']}:{compression['level']}"


def require_codec(compression: Optional[Dict[str, Any]]) -> None:
    """A one-line MissingDependencyError naming ``pip install 'dsconvert[zstd]'`` when the codec's
    package is not installed: said before any shard is written, not by every worker."""
    if compression is not None:
        require("zstandard", f"--compress {compression['codec']}")


def is_compressible(field: str) -> bool:
    """Whether a field of this name is stored compressed (see the module doc)."""
    ext = field.rsplit(".", 1)[-1].lower()
    return ext not in ALREADY_COMPRESSED and ext not in CLASS_EXTENSIONS


def stored_name(field: str) -> str:
    """The field's name in the tar once compressed (``json`` -> ``json.zst``)."""
    return f"{field}.{SUFFIX}"


def compressed_bound(size: int) -> int:
    """At most this many bytes for ``size`` bytes compressed: libzstd's ``ZSTD_COMPRESSBOUND``
    plus the frame header and checksum (incompressible data grows a little), for planning shards
    by size without compressing."""
    margin = (128 * 1024 - size) >> 11 if size < 128 * 1024 else 0
    return size + (size >> 8) + margin + 32


def codec_version() -> str:
    """The libzstd version that writes (recorded with each shard: the bytes depend on it)."""
    zstandard = require("zstandard", "--compress zstd")
    return f"zstd {zstandard.ZSTD_VERSION[0]}.{zstandard.ZSTD_VERSION[1]}.{zstandard.ZSTD_VERSION[2]}"


class Compressor:
    """Compresses fields at one setting, deterministically: one thread, no dictionary, the
    content size and a checksum in every frame (readers bound and check by them)."""

    def __init__(self, compression: Dict[str, Any]):
        zstandard = require("zstandard", f"--compress {compression['codec']}")
        self.ctx = zstandard.ZstdCompressor(level=int(compression["level"]), write_checksum=True,
                                            write_content_size=True, threads=0)

    def compress(self, data: bytes) -> bytes:
        return self.ctx.compress(data)


_local = threading.local()  # a decompression context per thread: a ZstdDecompressor is not thread-safe


def _decompressor() -> Any:
    """This thread's ZstdDecompressor (its module beside it, for its error class)."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        _local.zstandard = require("zstandard", "reading zstd-compressed fields")
        dctx = _local.dctx = _local.zstandard.ZstdDecompressor()
    return dctx


def decompress_field(data: Any, size: int, limit: int) -> bytes:
    """One compressed field back, checked to be ``size`` bytes (the size recorded at writing)
    and at most ``limit``: the frame header's declared size is checked first, so a frame that
    declares more (a zstd bomb) allocates nothing, and one that declares none is refused. A
    BadInputError, in one line, for a frame that is damaged, declares another size, or has
    anything after it."""
    dctx = _decompressor()
    zstandard = _local.zstandard
    if size < 0:
        raise BadInputError("damaged zstd field: the record gives it no size")
    if size > limit:
        raise BadInputError(f"a zstd field of {size:,} bytes decompressed is over the limit of {limit:,} bytes "
                            "(max_member_bytes)")
    if bytes(data[:4]) != b"\x28\xb5\x2f\xfd":  # one zstd frame, as written: not a skippable frame first
        raise BadInputError("damaged zstd field: it does not start with a zstd frame")
    try:
        declared = zstandard.frame_content_size(data)  # -1: not declared
        if declared != size:
            what = "no content size" if declared < 0 else f"{declared:,} bytes"
            raise BadInputError(f"damaged zstd field: its frame declares {what}, the record {size:,} bytes")
        if size:
            return dctx.decompress(data, allow_extra_data=False)
        whole = dctx.decompressobj()  # an empty frame: decompress() would take anything after it
        if whole.decompress(bytes(data)) or not whole.eof or whole.unused_data:
            raise BadInputError("damaged zstd field: not one empty frame, as the record says")
        return b""
    except zstandard.ZstdError as exc:
        raise BadInputError(f"damaged zstd field: {exc}") from None
