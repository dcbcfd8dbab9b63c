"""Field codecs by extension: what a field is, how to check it, how to decode it.

A field's name is its file extension, lower-cased (``img.JPEG`` -> ``jpeg``), as the
webdataset reader lower-cases it. Images are recognised by torchvision's list of
extensions, so an ImageFolder source yields exactly the files ImageFolder would load.

JPEG decoding to arrays goes through a chain: PyTurboJPEG (when libturbojpeg loads) ->
simplejpeg (its wheel bundles libjpeg-turbo) -> PIL. The fast decoders reject CMYK and
anything that is not really a JPEG (a PNG named ``.JPEG``); those fall back to PIL, so every
path gives the RGB image that ``PIL.Image.open(f).convert("RGB")`` gives. ``decode="fused"``
also decodes regions (:func:`region_decode`) through dsconvert's own libjpeg extension.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import tokenize
import warnings
from fractions import Fraction
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np
from PIL import Image, UnidentifiedImageError

from . import optional
from .errors import BadInputError, DsconvertError
from .jpeg_structure import arithmetic, top_rows
from .jpeg_structure import whole as jpeg_whole
from .processes import ProcessLocal

__all__ = [
    "IMAGE_EXTENSIONS",
    "DECODE_MODES",
    "field_kind",
    "is_image_field",
    "check_field",
    "decode_field",
    "decode_image",
    "encode_class",
    "jpeg_decoders",
    "DECODERS",
    "resolve_decoder",
    "decode_rgb",
    "fast_decode",
    "region_decode",
    "Region",
    "REGION_EDGE",
    "decode_resized",
    "bilinear",
    "nchw_view",
    "resolve_resampler",
    "scaled_eighths",
    "resized_shape",
    "image_size",
    "parse_hw",
    "check_pixels",
    "pixel_limit",
    "load_npy",
    "NPY_HEADER_ERRORS",
    "FastJpeg",
    "decode_errors_naming",
]

# torchvision.datasets.folder.IMG_EXTENSIONS, without the dots
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")
CLASS_EXTENSIONS = ("cls", "cls2", "class", "label", "index")
TEXT_EXTENSIONS = ("txt", "text")
PICKLE_EXTENSIONS = ("pyd", "pickle", "pkl")  # unpickled only with allow_pickle=True: it runs code
DECODE_MODES = ("pil", "numpy", "raw", "buffer", "fused")  # fused: decoding fused with the transform (fused.py)
ENCODED_MODES = ("raw", "buffer")  # modes that hand out the encoded bytes themselves

# the one warning a frame cut by top_rows raises: the entropy-coded data it did not read
_CUT_WARNING = re.compile(r"Corrupt JPEG data: \d+ extraneous bytes before marker 0xd9$")
_JPEG_MAGIC = b"\xff\xd8\xff"
# what a region decode is asked for: (height, width, k) -> (top, bottom, left, right), full resolution
Region = Callable[[int, int, int], Tuple[int, int, int, int]]
# output pixels decoded beyond each side of a region: libjpeg's fancy chroma upsampling reads
# one chroma sample (two pixels) across the region's edge, where a region decode replicates the
# edge instead; the tests find 1 enough at every scale and subsampling; 4 leaves room
REGION_EDGE = 4


def field_kind(field: str) -> str:
    """One of ``image``, ``class``, ``json``, ``text``, ``npy``, ``pickle``, ``bytes``."""
    ext = field.rsplit(".", 1)[-1].lower()
    if ext in IMAGE_EXTENSIONS:
        return "image"
    if ext in CLASS_EXTENSIONS:
        return "class"
    if ext == "json":
        return "json"
    if ext in TEXT_EXTENSIONS:
        return "text"
    if ext == "npy":
        return "npy"
    if ext in PICKLE_EXTENSIONS:
        return "pickle"
    return "bytes"


def is_image_field(field: str) -> bool:
    return field_kind(field) == "image"


def encode_class(label: int) -> bytes:
    """``cls`` members hold the class index as decimal text, the webdataset convention."""
    return str(int(label)).encode("ascii")


# --- checking inputs during conversion ---------------------------------------------------


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


def _pil_open(data: Any) -> Image.Image:
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
        raise _over_limit(f"decompression bomb: {size}") from None
    return img


def check_image(data: bytes, max_pixels: Optional[int] = None, full: bool = False) -> None:
    """Check that an image decodes, so that a bad file is found now, not in epoch 5.

    Pillow reads the header (format, size, pixel limit). Unless ``full``, a JPEG that
    :func:`dsconvert.jpeg_structure.whole` finds complete (one sequential Huffman-coded scan,
    every table libjpeg needs, the entropy-coded data ending at EOI: what Pillow needs to
    decode it without error) is not decoded: ~40 us instead of ~500 us. Other JPEGs are
    decoded with libjpeg's DCT scaling at 1/8 (every entropy-coded byte is still decoded, so
    they fail exactly as in a full decode); other codecs are decoded fully.
    """
    if not data:
        raise BadInputError("empty file (0 bytes)")
    refuse_unverifiable(data)
    try:
        with pixel_limit(max_pixels):
            img = _pil_open(data)
            if img.format in ("JPEG", "MPO") and not full:
                if jpeg_whole(data):
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


# --- decoding when reading --------------------------------------------------------------


ARITHMETIC_REASON = ("arithmetic-coded JPEG: a truncated one decodes as zeros without any error, so none can be "
                     "trusted, and Pillow (ImageFolder's decoder) refuses those over about 64 kB; re-encode it "
                     "losslessly with `jpegtran -optimize -copy all IN > OUT`")


def refuse_unverifiable(data: Any) -> None:
    """The one decoder policy's first rule, on every path (checks, pil, numpy, fused,
    decoded outputs): a JPEG that no decoder can verify is refused."""
    if data[:3] == _JPEG_MAGIC and arithmetic(bytes(data[:65536]) if not isinstance(data, bytes) else data):
        raise BadInputError(ARITHMETIC_REASON)


def _over_limit(what: str) -> BadInputError:
    return BadInputError(f"{what} exceeds the limit of {Image.MAX_IMAGE_PIXELS} "
                         "(PIL.Image.MAX_IMAGE_PIXELS; raise it with --max-image-pixels)")


def check_pixels(width: int, height: int, resized_from: Optional[Tuple[int, int]] = None) -> None:
    """Refuse to decode an image larger than ``PIL.Image.MAX_IMAGE_PIXELS`` (None: no limit;
    :func:`pixel_limit` sets it), for the fast JPEG decoders, which do not check at all: a
    50 kB file declaring 30000 x 30000 pixels would allocate 2.7 GB. (Pillow checks the same
    limit itself: :func:`_pil_open`.) ``resized_from`` = (width, height): the same limit on what
    a resize of that image would allocate (``--resize 256`` makes a 1 x 65000 strip, 65,000
    pixels, 256 x 16,640,000: a 12 GB array)."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > limit:
        what = (f"resizing {resized_from[0]}x{resized_from[1]} to" if resized_from is not None
                else "decompression bomb:")
        raise _over_limit(f"{what} {width}x{height} = {width * height} pixels")


def _pil_rgb(data: bytes) -> Image.Image:
    # Exactly torchvision's pil_loader: open, then convert("RGB") (which loads), within the
    # pixel limit; a JPEG no decoder can verify refused, as on every path.
    refuse_unverifiable(data)
    return _pil_open(data).convert("RGB")


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
    return np.asarray(_pil_rgb(data))


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
        return _pil_rgb(data)
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


# --- decoded caches ---------------------------------------------------------------------

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
        from .errors import MissingDependencyError

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
    DCT and colour conversion, and rows below it are not read. What lies below is not seen,
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


def decode_rgb(data: bytes, decoder: str = "pil") -> np.ndarray:
    """HWC uint8 RGB pixels, as ``np.asarray(Image.open(f).convert("RGB"))``, with JPEGs
    through the named fast decoder (:func:`fast_decode`); CMYK, non-JPEG data, and anything
    libjpeg warns about go through Pillow, which decides exactly as it does for ``decode="pil"``."""
    refuse_unverifiable(data)
    if decoder != "pil" and data[:3] == _JPEG_MAGIC:
        fast = next((fn for name, fn in jpeg_decoders() if name == decoder), None)
        if isinstance(fast, FastJpeg):
            decoded = fast_decode(data, fast)
            if decoded is not None:
                return np.ascontiguousarray(decoded[0])
    return _pil_decoder(data)


def resized_shape(height: int, width: int, resize: Optional[int] = None,
                  size: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """(h, w) after ``--resize SHORT`` (shorter side to SHORT, torchvision's rounding) or
    ``--size HxW``; unchanged without either."""
    if size is not None:
        return int(size[0]), int(size[1])
    if resize is None:
        return height, width
    short, long_ = (height, width) if height <= width else (width, height)
    new_long = int(resize * long_ / short)
    return (resize, new_long) if height <= width else (new_long, resize)


def scaled_eighths(height: int, width: int, out_h: int, out_w: int) -> int:
    """The smallest n of 1/8, 2/8, 4/8 (DCT scaling) at which a ``height`` x ``width`` JPEG
    still covers ``out_h`` x ``out_w`` pixels 2.5 times over; 8 (a full decode) when none does.

    The DCT scaling filters unlike the bilinear filter (at 1/8 each pixel is its 8x8 block's
    mean), so the bilinear filter must still reduce by 2.5 for the output to stay within 1.5
    mean levels of a full decode and Pillow's resize: on 725 photos, odd sizes, subsamplings and
    a scanned text page at 32-256 pixels the worst was 1.37 (with 12/11 to spare it was 8.4, on
    the text page, and 5.0 on a photo at 32 pixels; with 2, 2.5). libjpeg-turbo's other n/8
    scales (3/8, 5/8, 3/4, 7/8) decode slower than the full size, whose IDCT and colour
    conversion are SIMD (3/4: 0.89 ms against 0.55 ms for a 375x500 photo, 8.1 ms against 4.4 ms
    at 1600x1200; 1/4: 0.40 and 3.0 ms)."""
    for n in (1, 2, 4):
        if height * n * 2 >= out_h * 8 * 5 and width * n * 2 >= out_w * 8 * 5:
            return n
    return 8


RESAMPLERS = ("pil", "torch")


def resolve_resampler(name: str = "auto") -> str:
    """The bilinear kernel a decoded cache is resized with: ``auto`` -> ``torch`` where torch is
    installed (its uint8 kernel, given Pillow's scales, equals Pillow's to within one level on
    a few pixels in 10,000, at a third of the time), else ``pil``. Recorded in the manifest:
    the bytes depend on it."""
    if name == "auto":
        import importlib.util

        return "torch" if importlib.util.find_spec("torch") is not None else "pil"
    if name not in RESAMPLERS:
        raise ValueError(f"resampler must be one of {RESAMPLERS}, not {name!r}")
    return name


_torch_threads = ProcessLocal()


def nchw_view(pixels: np.ndarray) -> Any:
    """HWC uint8 ``pixels`` as a 1 x C x H x W torch view, channels-last (torch's fast uint8
    resize path), no copy. A read-only array (a memory map, Pillow's buffer) is only read by
    the resize: torch warns about it all the same, so the warning is silenced for those only."""
    import torch

    if pixels.flags.writeable:
        x = torch.from_numpy(pixels)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            x = torch.from_numpy(pixels)
    return x.permute(2, 0, 1).unsqueeze(0)


def bilinear(pixels: np.ndarray, out_h: int, out_w: int, box: Optional[Tuple[float, float]] = None,
             resampler: str = "pil") -> np.ndarray:
    """Pillow's antialiased bilinear resize (``torchvision.transforms.Resize`` on PIL images) of
    HWC uint8 ``pixels`` to ``out_h`` x ``out_w``; ``box`` = (width, height): the area from the
    origin that the output covers (default: all of it)."""
    h, w = pixels.shape[:2]
    box_w, box_h = box if box is not None else (float(w), float(h))
    if (out_h, out_w) == (h, w) and (box_w, box_h) == (w, h):
        return pixels
    # torch's kernel resizes the width first, through a height x out_w array: a 1 x 4,000,000
    # strip at --size 224x224 would take 2.7 GB there (Pillow's reads only the rows it needs)
    if resampler == "torch" and h * out_w <= 4 * max(h * w, out_h * out_w):
        import torch
        import torch.nn.functional as F

        from . import processes

        if processes.IN_POOL and "set" not in _torch_threads:  # a pool worker has one core
            torch.set_num_threads(1)
            _torch_threads["set"] = True
        x = nchw_view(np.ascontiguousarray(pixels))
        # Pillow's scales (box / output), not torch's own (input / output): the same filter
        out = F.interpolate(x, scale_factor=(out_h / box_h, out_w / box_w), recompute_scale_factor=False,
                            mode="bilinear", antialias=True, align_corners=False)
        if tuple(out.shape[2:]) == (out_h, out_w):
            return out[0].permute(1, 2, 0).numpy()
        # floor(input * scale) missed the size by a rounding: Pillow's own kernel, below
    img = Image.fromarray(np.ascontiguousarray(pixels))
    return np.asarray(img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=(0.0, 0.0, box_w, box_h)))


def decode_resized(data: bytes, decoder: str = "pil", resize: Optional[int] = None,
                   size: Optional[Tuple[int, int]] = None, scaled: bool = True, resampler: str = "pil") -> np.ndarray:
    """:func:`decode_rgb` then :func:`bilinear` to the size ``resize`` (shorter side) or ``size``
    give, with a JPEG decoded by a fast decoder at the smallest n/8 DCT scale that still covers
    the output (``scaled``; :func:`scaled_eighths`, 8/8 when none does): decode time falls with
    the pixels, and the bilinear filter then maps the exact area those pixels cover (a float box:
    ceil(width * n / 8) columns cover width * n / 8 of them) to the output, so nothing shifts.
    ``decoder="pil"`` with ``resampler="pil"`` is Pillow's exact pipeline (full decode, then
    resize); ``resampler``: see :func:`resolve_resampler`."""
    refuse_unverifiable(data)
    if scaled and (resize is not None or size is not None) and decoder != "pil" and data[:3] == _JPEG_MAGIC:
        fast = next((fn for name, fn in jpeg_decoders() if name == decoder), None)
        header = None
        if isinstance(fast, FastJpeg):
            try:
                header = fast.header(data)
            except Exception:
                pass  # Pillow decides, below
        if header is not None and not header[2] and header[0] > 0 and header[1] > 0:
            height, width, _ = header
            check_pixels(width, height)
            out_h, out_w = resized_shape(height, width, resize, size)
            check_pixels(out_w, out_h, resized_from=(width, height))
            n = scaled_eighths(height, width, out_h, out_w)
            try:  # one header read: the full size (n = 8) is decoded here too
                pixels = fast.eighths(data, n)
            except Exception:
                pixels = None  # a libjpeg warning: the full decode below lets Pillow decide
            if pixels is not None:
                return bilinear(pixels, out_h, out_w, (width * n / 8, height * n / 8), resampler)
    pixels = decode_rgb(data, decoder)
    out_h, out_w = resized_shape(pixels.shape[0], pixels.shape[1], resize, size)
    check_pixels(out_w, out_h, resized_from=(pixels.shape[1], pixels.shape[0]))
    return bilinear(pixels, out_h, out_w, resampler=resampler)


def image_size(path: str) -> Tuple[int, int]:
    """(height, width) from the file's header, without decoding."""
    with Image.open(path) as img:
        w, h = img.size
    return h, w


def parse_hw(text: str) -> Tuple[int, int]:
    """'224x224' -> (224, 224): height x width."""
    try:
        h, w = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"size must be HxW, e.g. 224x224, not {text!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"size must be positive, not {text!r}")
    return h, w
