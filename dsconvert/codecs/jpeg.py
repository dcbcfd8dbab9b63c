"""The JPEG decoder chain: PyTurboJPEG (when libturbojpeg loads) -> simplejpeg (its wheel
bundles libjpeg-turbo) -> Pillow. The fast decoders reject CMYK and anything that is not really
a JPEG (a PNG named ``.JPEG``); those fall back to Pillow, so every path gives the RGB image
that ``PIL.Image.open(f).convert("RGB")`` gives. ``decode="fused"`` also decodes regions
(:func:`region_decode`) through dsconvert's own libjpeg extension."""

from __future__ import annotations

import re
import warnings
from fractions import Fraction
from typing import Callable, List, Optional, Tuple

import numpy as np

from .. import optional
from ..jpeg_structure import top_rows
from ..processes import ProcessLocal
from .checks import JPEG_MAGIC, check_pixels, pil_rgb, refuse_unverifiable

__all__ = ["Region", "REGION_EDGE", "FastJpeg", "jpeg_decoders", "DECODERS", "resolve_decoder", "fast_decode",
           "region_decode", "restart_marked", "decode_rgb"]

# the one warning a frame cut by top_rows raises: the entropy-coded data it did not read
_CUT_WARNING = re.compile(r"Corrupt JPEG data: \d+ extraneous bytes before marker 0xd9$")


# what a region decode is asked for: (height, width, k) -> (top, bottom, left, right), full resolution
Region = Callable[[int, int, int], Tuple[int, int, int, int]]


# output pixels decoded beyond each side of a region: libjpeg's fancy chroma upsampling reads
# one chroma sample (two pixels) across the region's edge, where a region decode replicates the
# edge instead; the tests find 1 enough at every scale and subsampling; 4 leaves room
REGION_EDGE = 4


class FastJpeg:
    """A libjpeg-turbo binding: its own header reader (the dimensions it will decode to, so
    the pixel limit is checked on exactly what is allocated) and a strict decode.

    ``header(data) -> (height, width, cmyk)`` raises on anything libjpeg cannot parse.
    ``decode(data)`` raises on every libjpeg warning (premature end of data, corrupt data):
    the caller then lets Pillow decide, so the fast path accepts exactly what Pillow accepts
    (a truncated file raises there; extraneous bytes do not)."""

    def __init__(self, name: str, header: Callable[[bytes], Tuple[int, int, bool]],
                 decode: Callable[[bytes], np.ndarray], reduced: Callable[[bytes, int], np.ndarray],
                 eighths: Callable[[bytes, int], np.ndarray],
                 cut: Optional[Callable[[bytes, int], np.ndarray]] = None):
        self.name = name
        self.header = header
        self.decode = decode
        self.reduced = reduced  # (data, k) -> decoded at 1/k in the DCT domain, k in 1, 2, 4, 8
        # (data, n) -> decoded at n/8 in the DCT domain, n in 1..8: ceil(height * n / 8) rows
        self.eighths = eighths
        # (data, k) -> a frame cut by jpeg_structure.top_rows decoded at 1/k: strict, but for the
        # one warning the cut itself raises once every row is out; None: the binding cannot stop
        # at its first warning, so it could not tell that one from an earlier one
        self.cut = cut

    def __call__(self, data: bytes) -> np.ndarray:
        return self.decode(data)


def _turbo_decoder() -> Optional[FastJpeg]:
    tj = optional.turbojpeg()
    if tj is None:
        return None
    import turbojpeg
    from turbojpeg import TJPF_RGB

    # the cut decode relies on 1.x's flags over libjpeg-turbo 2.x's API (stop at the first
    # warning, report it); 2.x wraps the TurboJPEG 3 API, which was not measured here
    stop_flag = getattr(turbojpeg, "TJFLAG_STOPONWARNING", None)
    if not str(getattr(turbojpeg, "__version__", "")).startswith("1."):
        stop_flag = None

    cmyk_spaces = (3, 4)  # TJCS_CMYK, TJCS_YCCK

    def header(data: bytes) -> Tuple[int, int, bool]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a header libjpeg only warns about is not one we trust
            width, height, _, colorspace = tj.decode_header(data)
        return height, width, colorspace in cmyk_spaces

    def scaled(data: bytes, factor: Optional[Tuple[int, int]]) -> np.ndarray:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # PyTurboJPEG reports libjpeg's warnings as Python warnings
            pixels = tj.decode(data, pixel_format=TJPF_RGB, scaling_factor=factor)
        if caught:
            raise ValueError(f"libjpeg: {caught[0].message}")
        return pixels

    def reduced(data: bytes, k: int) -> np.ndarray:
        return scaled(data, (1, k) if k != 1 else None)

    def eighths(data: bytes, n: int) -> np.ndarray:
        f = Fraction(n, 8)
        return scaled(data, (f.numerator, f.denominator) if n != 8 else None)

    def cut(data: bytes, k: int) -> np.ndarray:
        # stop at the first warning: the cut's own comes only after the last row is out (when
        # libjpeg looks for the marker after the scan), so any other comes first and is raised
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pixels = tj.decode(data, pixel_format=TJPF_RGB, scaling_factor=(1, k) if k != 1 else None,
                               flags=stop_flag)
        if caught and not (len(caught) == 1 and _CUT_WARNING.match(str(caught[0].message))):
            raise ValueError(f"libjpeg: {caught[0].message}")
        return pixels

    return FastJpeg("turbojpeg", header, lambda data: reduced(data, 1), reduced, eighths,
                    cut if stop_flag is not None else None)


def _simplejpeg_decoder() -> Optional[FastJpeg]:
    sj = optional.simplejpeg()
    if sj is None:
        return None

    def header(data: bytes) -> Tuple[int, int, bool]:
        height, width, colorspace, _ = sj.decode_jpeg_header(data)
        return height, width, str(colorspace).upper() in ("CMYK", "YCCK")

    def reduced(data: bytes, k: int) -> np.ndarray:
        if k == 1:
            return sj.decode_jpeg(data, colorspace="RGB", strict=True)
        height, width, _, _ = sj.decode_jpeg_header(data)  # the smallest scale at least this size is 1/k
        return sj.decode_jpeg(data, colorspace="RGB", strict=True, min_height=-(-height // k),
                              min_width=-(-width // k))

    def eighths(data: bytes, n: int) -> np.ndarray:
        if n == 8:
            return sj.decode_jpeg(data, colorspace="RGB", strict=True)
        height, width, _, _ = sj.decode_jpeg_header(data)  # libjpeg-turbo's smallest n/8 at least this size
        return sj.decode_jpeg(data, colorspace="RGB", strict=True, min_height=-(-height * n // 8),
                              min_width=-(-width * n // 8))

    return FastJpeg("simplejpeg", header, lambda data: reduced(data, 1), reduced, eighths)


def _pil_decoder(data: bytes) -> np.ndarray:
    return np.asarray(pil_rgb(data))


_decoders = ProcessLocal()


def jpeg_decoders() -> List[Tuple[str, Callable[[bytes], np.ndarray]]]:
    """The JPEG -> RGB array decoders that load in this process, fastest first (probed once
    per process: a forked worker probes again, so no C handle crosses a fork)."""
    if "jpeg" not in _decoders:
        found: List[Tuple[str, Callable[[bytes], np.ndarray]]] = []
        for name, make in (("turbojpeg", _turbo_decoder), ("simplejpeg", _simplejpeg_decoder)):
            decoder = make()
            if decoder is not None:
                found.append((name, decoder))
        found.append(("pil", _pil_decoder))
        _decoders["jpeg"] = found
    return _decoders["jpeg"]


DECODERS = ("auto", "pil", "turbojpeg", "simplejpeg")


def resolve_decoder(name: str = "auto") -> str:
    """The JPEG decoder a decoded cache will be written with: ``auto`` -> the fastest that
    loads here. A named one that does not load is an error, never a silent substitute."""
    if name not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, not {name!r}")
    loaded = [n for n, _ in jpeg_decoders()]
    if name == "auto":
        return loaded[0]
    if name not in loaded:
        from ..errors import MissingDependencyError

        hint = optional.INSTALL_HINTS.get(name, f"pip install {name}")
        raise MissingDependencyError(f"the {name} decoder does not load here: run `{hint}`")
    return name


def fast_decode(data: bytes, fast: FastJpeg,
                reduction: Callable[[int, int], int] = lambda height, width: 1,
                rows: Optional[Callable[[int, int, int], int]] = None) -> Optional[Tuple[np.ndarray, int]]:
    """(pixels, k): a JPEG through a libjpeg-turbo binding at 1/k, k = ``reduction(height,
    width)``; the pixel limit checked on the dimensions the decoder's own header reader gives.
    ``rows(height, width, k)``: how many rows from the top the caller reads (at full
    resolution); where the file allows, only those are decoded (:func:`top_rows`) and the
    pixels may stop soon after them. What lies below them is not seen, damage included: a
    file whose only fault is there (which Pillow decodes, warning) is decoded as an intact one,
    where the whole-file path gives it to Pillow; a truncated one is still refused (its missing
    end is seen). None where Pillow must decide instead: a header libjpeg-turbo does not read
    cleanly, CMYK, an empty frame, anything libjpeg warns about."""
    try:
        height, width, cmyk = fast.header(data)
    except Exception:
        return None
    if cmyk or height <= 0 or width <= 0:
        return None
    check_pixels(width, height)
    k = reduction(height, width)
    if rows is not None and fast.cut is not None:
        cut = top_rows(data, rows(height, width, k))
        if cut is not None:
            try:
                return np.asarray(fast.cut(cut, k)), k
            except Exception:
                pass  # the whole file decides, as it would have
    try:
        return np.asarray(fast.reduced(data, k)), k
    except Exception:
        return None  # a warning or an error: Pillow decides, raising on what it refuses


def region_decode(data: bytes, reduction: Callable[[int, int], int],
                  region: Region) -> Optional[Tuple[np.ndarray, int, Tuple[int, int]]]:
    """(pixels, k, (top, left)): the part of a JPEG that ``region(height, width, k)`` asks for
    (top, bottom, left, right in full-resolution pixels), decoded at 1/k, k = ``reduction(height,
    width)``, by dsconvert's libjpeg extension (:func:`dsconvert.optional.jpeg_region`); (top,
    left) is where the pixels start in the image at 1/k. The pixels are those of the whole
    decode: rows above the region and columns beside it are entropy-decoded but skip the inverse
    DCT and colour conversion, and rows below it are not read; in a file with restart markers
    every MCU (:func:`restart_marked`) or every few, only the restart segments the region
    covers are entropy-decoded at all. What lies below (or outside those segments) is not seen,
    damage included, as for :func:`fast_decode`'s rows; a truncated file is still refused.
    None where the extension is not built or the file is not one it decodes (progressive,
    multi-scan, CMYK); raises ValueError on what libjpeg refuses or warns about, and
    :class:`BadInputError` past the pixel limit (checked on the frame's own header)."""
    ext = optional.jpeg_region()
    if ext is None:
        return None
    scale: List[int] = []

    def plan(height: int, width: int) -> Tuple[int, int, int, int, int]:
        check_pixels(width, height)
        k = reduction(height, width)
        top, bottom, left, right = region(height, width, k)
        edge = REGION_EDGE * k
        scale.append(k)
        return k, max(0, top - edge), max(1, bottom + edge), max(0, left - edge), max(1, right + edge)

    decoded = ext.region(data, plan)
    if decoded is None:
        return None
    buf, rows, columns, top, left = decoded
    return np.frombuffer(buf, np.uint8).reshape(rows, columns, 3), scale[0], (top, left)


def restart_marked(data: bytes) -> bytes:
    """``data`` losslessly rewritten with a restart marker after every MCU (the DCT coefficients
    copied, Huffman tables optimised, APPn and COM markers kept: every decoder gives the same
    pixels), so that :func:`region_decode` reads only the restart segments a crop needs, not
    every row above it: 23-27% less CPU for a RandomResizedCrop of the demo photos, for 6.5%
    more bytes. ``data`` unchanged where it is not a JPEG this helps (progressive, arithmetic-coded,
    CMYK, several scans, marked already), libjpeg refuses or warns about it, or the extension is
    not built (:func:`dsconvert.optional.jpeg_region`)."""
    ext = optional.jpeg_region()
    if ext is None or data[:3] != JPEG_MAGIC:
        return data
    try:
        marked = ext.restart(data)
    except ValueError:
        return data
    return data if marked is None else marked


def decode_rgb(data: bytes, decoder: str = "pil") -> np.ndarray:
    """HWC uint8 RGB pixels, as ``np.asarray(Image.open(f).convert("RGB"))``, with JPEGs
    through the named fast decoder (:func:`fast_decode`); CMYK, non-JPEG data, and anything
    libjpeg warns about go through Pillow, which decides exactly as it does for ``decode="pil"``."""
    refuse_unverifiable(data)
    if decoder != "pil" and data[:3] == JPEG_MAGIC:
        fast = next((fn for name, fn in jpeg_decoders() if name == decoder), None)
        if isinstance(fast, FastJpeg):
            decoded = fast_decode(data, fast)
            if decoded is not None:
                return np.ascontiguousarray(decoded[0])
    return _pil_decoder(data)
