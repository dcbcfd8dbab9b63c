"""Checking inputs: the pixel limit, the decoder policy's first rule (a JPEG no decoder can
verify is refused), and checking that a field's bytes are what its extension says, during
conversion, so that a bad file is found now, not in epoch 5."""

from __future__ import annotations

import contextlib
import io
import json
import re
import warnings
from typing import Any, Dict, Iterator, Optional, Tuple

from PIL import Image, UnidentifiedImageError

from ..errors import BadInputError
from ..jpeg_structure import arithmetic, scan_whole, whole_head
from .fields import field_kind
from .npy import load_npy

__all__ = ["JPEG_MAGIC", "ARITHMETIC_REASON", "pixel_limit", "pil_open", "pil_rgb", "over_limit", "check_pixels",
           "refuse_unverifiable", "check_image", "check_field"]

JPEG_MAGIC = b"\xff\xd8\xff"  # what every JPEG starts with

@contextlib.contextmanager
def pixel_limit(limit: Optional[int]) -> Iterator[None]:
    """Decode within ``limit`` pixels (None: leave ``PIL.Image.MAX_IMAGE_PIXELS`` as it is).

    The limit is Pillow's global, because Pillow's own checks read it: lowering only our check
    would leave Pillow refusing at 2x its default anyway, so ``--max-image-pixels`` could never
    raise the limit. Conversion sets it per shard in its worker; restored on exit."""
    if limit is None:
        yield
        return
    before = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = int(limit)
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = before


def pil_open(data: Any) -> Image.Image:
    """``Image.open`` (header only) within the pixel limit, as an error on every level.

    Pillow only *warns* between ``MAX_IMAGE_PIXELS`` and twice that; in a worker process a
    warning is lost, so the warning level is the limit."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # past twice the limit Pillow's error quotes 2 x MAX_IMAGE_PIXELS: say the limit applied
        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{found.group(1)} pixels" if found else "the image"
        raise over_limit(f"decompression bomb: {size}") from None
    return img


def over_limit(what: str) -> BadInputError:
    return BadInputError(f"{what} exceeds the limit of {Image.MAX_IMAGE_PIXELS} "
                         "(PIL.Image.MAX_IMAGE_PIXELS; raise it with --max-image-pixels)")


def check_pixels(width: int, height: int, resized_from: Optional[Tuple[int, int]] = None) -> None:
    """Refuse to decode an image larger than ``PIL.Image.MAX_IMAGE_PIXELS`` (None: no limit;
    :func:`pixel_limit` sets it), for the fast JPEG decoders, which do not check at all: a
    50 kB file declaring 30000 x 30000 pixels would allocate 2.7 GB. (Pillow checks the same
    limit itself: :func:`pil_open`.) ``resized_from`` = (width, height): the same limit on what
    a resize of that image would allocate (``--resize 256`` makes a 1 x 65000 strip, 65,000
    pixels, 256 x 16,640,000: a 12 GB array)."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > limit:
        what = (f"resizing {resized_from[0]}x{resized_from[1]} to" if resized_from is not None
                else "decompression bomb:")
        raise over_limit(f"{what} {width}x{height} = {width * height} pixels")


ARITHMETIC_REASON = ("arithmetic-coded JPEG: a truncated one decodes as zeros without any error, so none can be "
                     "trusted, and Pillow (ImageFolder's decoder) refuses those over about 64 kB; re-encode it "
                     "losslessly with `jpegtran -optimize -copy all IN > OUT`")


def refuse_unverifiable(data: Any) -> None:
    """The one decoder policy's first rule, on every path (checks, pil, numpy, fused,
    decoded outputs): a JPEG that no decoder can verify is refused."""
    if data[:3] == JPEG_MAGIC and arithmetic(bytes(data[:65536]) if not isinstance(data, bytes) else data):
        raise BadInputError(ARITHMETIC_REASON)


def pil_rgb(data: bytes) -> Image.Image:
    # Exactly torchvision's pil_loader: open, then convert("RGB") (which loads), within the
    # pixel limit; a JPEG no decoder can verify refused, as on every path.
    refuse_unverifiable(data)
    return pil_open(data).convert("RGB")


class _KnownHeads:
    """The JPEG headers :func:`check_image` has seen pass: what Pillow's open reads and what
    :func:`~dsconvert.jpeg_structure.whole_head` reads, both from the file's start, with the
    pixel limit they passed under. A file that starts with one of them opens the same and
    passes the same checks, so only the rest (:func:`~dsconvert.jpeg_structure.scan_whole`:
    the entropy-coded data ending at EOI) is left to check: ~5 us instead of ~60 us where a
    pipeline wrote every file with one encoder at one size (resized crops, web exports), as the
    same Huffman and quantisation tables. Bounded: the first ``MAX_HEADS`` headers of at most
    ``MAX_HEAD_BYTES`` (an EXIF block makes a header unique: not kept), of ``MAX_LENGTHS``
    lengths (a lookup costs one slice and hash per length)."""

    MAX_HEADS, MAX_HEAD_BYTES, MAX_LENGTHS = 64, 4096, 8

    def __init__(self) -> None:
        self.heads: Dict[Tuple[bytes, Optional[int]], int] = {}  # (header, pixel limit) -> where the scan starts
        self.lengths: Dict[int, None] = {}  # insertion-ordered: the first lengths seen are tried first

    def known_whole(self, data: bytes) -> bool:
        """Whether ``data`` starts with a known header and its scan then ends at EOI."""
        if not self.heads or data[:3] != JPEG_MAGIC:
            return False
        limit = Image.MAX_IMAGE_PIXELS
        for length in tuple(self.lengths):  # a copy: another thread (a Dask worker's) may be learning
            start = self.heads.get((bytes(data[:length]), limit))
            if start is not None:
                return scan_whole(data, start)
        return False

    def learn(self, data: bytes, start: int, opened: int) -> None:
        """Note the header of a file that opened as JPEG (Pillow read ``opened`` bytes) and passed
        whole, its scan starting at ``start``."""
        length = max(start, opened)
        if 0 < start and 0 < opened and length <= self.MAX_HEAD_BYTES and len(self.heads) < self.MAX_HEADS and (
                length in self.lengths or len(self.lengths) < self.MAX_LENGTHS):
            self.heads[(bytes(data[:length]), Image.MAX_IMAGE_PIXELS)] = start
            self.lengths[length] = None


_WHOLE_HEADS = _KnownHeads()  # per process: conversion workers check a shard's files one after another


def check_image(data: bytes, max_pixels: Optional[int] = None, full: bool = False) -> None:
    """Check that an image decodes, so that a bad file is found now, not in epoch 5.

    Pillow reads the header (format, size, pixel limit). Unless ``full``, a JPEG that
    :func:`dsconvert.jpeg_structure.whole` finds complete (one sequential Huffman-coded scan,
    every table libjpeg needs, the entropy-coded data ending at EOI: what Pillow needs to
    decode it without error) is not decoded: ~40 us instead of ~500 us, ~5 us where its header is
    one already seen (:class:`_KnownHeads`). Other JPEGs are
    decoded with libjpeg's DCT scaling at 1/8 (every entropy-coded byte is still decoded, so
    they fail exactly as in a full decode); other codecs are decoded fully.
    """
    if not data:
        raise BadInputError("empty file (0 bytes)")
    refuse_unverifiable(data)
    try:
        with pixel_limit(max_pixels):
            if not full and _WHOLE_HEADS.known_whole(data):
                return
            img = pil_open(data)
            if img.format in ("JPEG", "MPO") and not full:
                head = whole_head(data)
                if scan_whole(data, head):
                    fp = getattr(img, "fp", None)  # an ImageFile's: where Pillow's parse stopped
                    if img.format == "JPEG" and fp is not None:
                        _WHOLE_HEADS.learn(data, head, fp.tell())
                    return
                img.draft(img.mode, (max(1, img.size[0] // 8), max(1, img.size[1] // 8)))
            img.load()
    except BadInputError:
        raise
    except UnidentifiedImageError:
        raise BadInputError("not a decodable image (Pillow cannot identify the format)") from None
    except Exception as exc:  # Pillow's plugins raise what they like (NotImplementedError, RuntimeError,
        # OverflowError, AttributeError...): only Pillow runs here, so every failure is the file's
        raise BadInputError(f"corrupt or truncated image: {type(exc).__name__}: {exc}"
                            if not isinstance(exc, (OSError, SyntaxError, ValueError)) else
                            f"corrupt or truncated image: {exc}") from None


def check_field(field: str, data: bytes, verify: bool, max_pixels: Optional[int] = None) -> None:
    """Raise :class:`BadInputError` when a field's bytes cannot be what its extension says.

    Cheap checks (an empty image) always run; decoding only with ``verify``.
    """
    kind = field_kind(field)
    if kind == "image":
        if not data:
            raise BadInputError("empty file (0 bytes)")
        if verify:
            check_image(data, max_pixels)
        return
    if not verify:
        return
    try:
        if kind == "class":
            int(data.decode("ascii").strip())
        elif kind == "json":
            json.loads(data.decode("utf-8"))
        elif kind == "text":
            data.decode("utf-8")
        elif kind == "npy":
            load_npy(data, allow_pickle=False)
    except Exception as exc:
        hint = (" (a class index; class names make (image, label) samples with --label " + field + ")"
                if kind == "class" else "")
        raise BadInputError(f"not a valid .{field} file: {exc}{hint}") from None
