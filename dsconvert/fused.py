"""Decode only what the transform keeps (``decode="fused"``).

The user keeps the transform they already have. :func:`fuse` reads the leading geometric
operations of a torchvision ``Compose`` (transforms v1 or v2), or of dsconvert's reference
transforms, and folds them into decoding:

* ``RandomResizedCrop`` picks its crop box first, with torch's generator in exactly the order
  torchvision's ``get_params`` draws (so a seeded run crops the same boxes), then decodes the
  JPEG at the largest DCT-domain reduction (1/2, 1/4, 1/8) that still leaves the box 2.5 times
  the output size (``DCT_MARGIN``: the bilinear filter must still do most of the reduction,
  or text and fine detail drift from torchvision's pixels; bilinear and bicubic only: nearest
  and Pillow's other filters decode at full scale), and resizes only the box;
* ``Resize`` (shorter side or exact size), optionally followed by ``CenterCrop``, decodes at the
  largest reduction that leaves the image 2.5 times the resized size; ``RandomCrop`` and
  ``CenterCrop`` alone crop the decoded pixels;
* a following ``RandomHorizontalFlip`` and the conversion to a tensor (``PILToTensor``,
  ``ToTensor``, v2's ``ToImage``) are applied to the array, never through a PIL image; every
  later operation (``Normalize``, ``ToDtype``...) gets what it would have got.

Only the region the crop and its filter read is decoded, on the same pixels as decoding it all:
dsconvert's libjpeg extension (:func:`dsconvert.codecs.region_decode`) skips the inverse DCT
and colour conversion of the rows above the region and the columns beside it (their entropy-coded
data is still read: a scan has no entry point in its middle) and reads nothing below it. A JPEG
with restart markers (``dsconvert shard --jpeg-restart`` writes one after every MCU, losslessly)
has entry points: only the restart segments the region covers are read, as a smaller JPEG of
those segments (the same pixels). Where the extension is not built, libjpeg-turbo gets the file
with its frame's height cut to just under the last row the crop reads
(:func:`dsconvert.jpeg_structure.top_rows`) and stops there. A file
neither can take that way (progressive, several scans; restart markers for the cut) or one with
damage where it is decoded decodes whole, as before. Damage below the region is not seen (a
truncated file still is: its end is missing), so such a file, which Pillow decodes with a
warning, is decoded as an intact one.

Resizing is torch's antialiased bilinear/bicubic on uint8 (what torchvision v2 does; within
0.1 mean levels of Pillow's on the same box), computed by :mod:`dsconvert.resample`'s kernel
for the crop's pixels only, pixel for pixel torch's, or by torch where the kernel does not run;
other filters go through Pillow's ``resize(box=...)``. Images are given to the transform as PIL
images by an ImageFolder, so antialiasing is always on, as torchvision does for PIL input.

What is not fused is still correct: an unrecognised transform, a ``RandomCrop`` with padding,
a crop larger than the image, non-JPEG data and CMYK JPEGs decode in full (``decode="pil"``)
and get the transform as given.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np
from PIL import Image

from . import optional, resample
from .codecs import (
    JPEG_MAGIC,
    REGION_EDGE,
    FastJpeg,
    Region,
    bilinear,
    check_pixels,
    fast_decode,
    jpeg_decoders,
    nchw_view,
    pil_open,
    pil_rgb,
    refuse_unverifiable,
    region_decode,
)
from .errors import BadInputError
from .geometry import resized_size

__all__ = ["Geometry", "FusedTransform", "fuse", "rrc_box"]

REDUCTIONS = (8, 4, 2)  # DCT-domain scaling factors 1/8, 1/4, 1/2, largest reduction first
DCT_MARGIN = 2.5  # a reduced decode must cover the output this many times over (codecs.scaled_eighths)
_TORCH_FILTERS = {"bilinear": "bilinear", "bicubic": "bicubic"}
_PIL_FILTERS = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
                "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS,
                "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}
_PIL_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True)
class Geometry:
    """What the leading operations do to an image of any size.

    ``kind``: ``random_resized_crop`` (``size``, ``scale``, ``ratio``), ``resize`` (``resize``:
    an int for the shorter side or (h, w), ``max_size``; then ``crop``, a centre crop, if
    given), ``center_crop`` or ``random_crop`` (``crop``)."""

    kind: str
    size: Optional[Tuple[int, int]] = None
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    resize: Any = None
    max_size: Optional[int] = None
    crop: Optional[Tuple[int, int]] = None
    interpolation: str = "bilinear"


# --- reading the user's transform -------------------------------------------------------


def _ops(transform: Any) -> Optional[List[Any]]:
    if type(transform).__name__ == "Compose" and isinstance(getattr(transform, "transforms", None), (list, tuple)):
        return list(transform.transforms)
    return None


def _from_torchvision(op: Any) -> bool:
    return type(op).__module__.startswith("torchvision.transforms")


def _pair(size: Any) -> Optional[Tuple[int, int]]:
    """torchvision's size argument: an int or a one-element sequence is square, two is (h, w)."""
    if isinstance(size, int):
        return (size, size)
    if isinstance(size, (list, tuple)) and len(size) in (1, 2) and all(isinstance(s, int) for s in size):
        return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])
    return None


def _interpolation(op: Any) -> Optional[str]:
    mode = getattr(op, "interpolation", "bilinear")
    name = getattr(mode, "value", mode)
    if isinstance(name, int):
        name = _PIL_NAMES.get(name)
    return name if name in _PIL_FILTERS else None


def _geometry(ops: List[Any]) -> Tuple[Optional[Geometry], int]:
    """The geometry of the leading torchvision ops, and how many ops it covers."""
    if not ops or not _from_torchvision(ops[0]):
        return None, 0
    op, name = ops[0], type(ops[0]).__name__
    if name == "RandomResizedCrop":
        size, interp = _pair(op.size), _interpolation(op)
        if size is None or interp is None:
            return None, 0
        return Geometry("random_resized_crop", size=size, scale=tuple(op.scale), ratio=tuple(op.ratio),
                        interpolation=interp), 1
    if name == "Resize":
        interp = _interpolation(op)
        size = op.size
        if isinstance(size, (list, tuple)) and len(size) == 1:
            size = size[0]
        if interp is None or not (isinstance(size, int) or _pair(size)):
            return None, 0
        crop, used = None, 1
        if len(ops) > 1 and _from_torchvision(ops[1]) and type(ops[1]).__name__ == "CenterCrop":
            crop, used = _pair(ops[1].size), 2
            if crop is None:
                return None, 0
        return Geometry("resize", resize=size if isinstance(size, int) else _pair(size),
                        max_size=getattr(op, "max_size", None), crop=crop, interpolation=interp), used
    if name == "CenterCrop" and _pair(op.size):
        return Geometry("center_crop", crop=_pair(op.size)), 1
    if (name == "RandomCrop" and _pair(op.size) and not getattr(op, "padding", None)
            and not getattr(op, "pad_if_needed", False)):
        return Geometry("random_crop", crop=_pair(op.size)), 1
    return None, 0


def fuse(transform: Optional[Callable]) -> FusedTransform:
    """The fused form of ``transform`` (see the module doc); ``fused.geometry`` is None when
    nothing could be fused, and the transform then runs as given after a full decode. The first
    call in a process says, in one line, which of dsconvert's C extensions did not build."""
    from .transforms import CropToTensor, RandomResizedCropToTensor

    optional.warn_missing_extensions()

    if isinstance(transform, RandomResizedCropToTensor):
        # the transform's (lo, hi) pairs, as tuples
        return FusedTransform(Geometry("random_resized_crop", size=(transform.size, transform.size),
                                       scale=cast(Tuple[float, float], tuple(transform.scale)),
                                       ratio=cast(Tuple[float, float], tuple(transform.ratio))),
                              flip=transform.flip, output="uint8", rest=[], original=transform)
    if isinstance(transform, CropToTensor):
        return FusedTransform(Geometry("resize", resize=transform.resize, crop=(transform.size, transform.size)),
                              flip=None, output="uint8", rest=[], original=transform)
    ops = _ops(transform)
    if ops is None:
        what = "no transform" if transform is None else f"the transform ({_name(transform)}) is not a Compose"
        return FusedTransform(None, None, "pil", [], transform, f"{what}: nothing to fold")
    # v2's recommended order converts first (ToImage, then the geometry on a uint8 tensor, which
    # torchvision resizes with the same antialiased kernel); an explicit antialias=False is left as given
    first = _conversion(ops[0])
    if first in ("uint8", "image"):
        unaliased = next((op for op in ops[1:3] if getattr(op, "antialias", True) is False), None)
        if unaliased is not None:
            return FusedTransform(None, None, "pil", [], transform,
                                  f"{_name(unaliased)}(antialias=False) resizes without the antialiasing "
                                  "fused decoding reproduces")
        ops = ops[1:]
    geometry, used = _geometry(ops)
    if geometry is None:
        return FusedTransform(None, None, "pil", [], transform, _why_not(ops))
    rest = ops[used:]
    flip: Optional[float] = None
    if rest and _from_torchvision(rest[0]) and type(rest[0]).__name__ == "RandomHorizontalFlip":
        flip = float(rest[0].p)
        rest = rest[1:]
    output = first if first in ("uint8", "image") else "pil"
    if output == "pil" and rest and _conversion(rest[0]) != "pil":
        output, rest = _conversion(rest[0]), rest[1:]
    return FusedTransform(geometry, flip, output, rest, transform)


def _name(op: Any) -> str:
    return type(op).__name__


def _why_not(ops: List[Any]) -> str:
    """Why :func:`_geometry` found nothing to fold in ``ops``, naming the step."""
    if not ops:
        return "the Compose has no crop or resize to fold"
    op, name = ops[0], _name(ops[0])
    if not _from_torchvision(op):
        return f"its first step, {name}, is not a torchvision crop or resize (folded: RandomResizedCrop, Resize, " \
               "CenterCrop, RandomCrop, first)"
    if name in ("RandomResizedCrop", "Resize") and _interpolation(op) is None:
        return f"{name} uses an interpolation fused decoding does not reproduce ({getattr(op, 'interpolation', None)})"
    if name == "Resize" and len(ops) > 1 and _name(ops[1]) == "CenterCrop":
        return f"CenterCrop after Resize has a size fused decoding does not read ({getattr(ops[1], 'size', None)!r})"
    if name == "RandomCrop":
        return "RandomCrop pads (padding or pad_if_needed), which fused decoding does not reproduce"
    if name in ("RandomResizedCrop", "Resize", "CenterCrop"):
        return f"{name} has a size fused decoding does not read ({getattr(op, 'size', None)!r})"
    return f"its first step, {name}, is not a crop or resize (folded: RandomResizedCrop, Resize, CenterCrop, " \
           "RandomCrop, first)"


def _conversion(op: Any) -> str:
    """What a torchvision conversion op makes of a PIL image: ``uint8`` (PILToTensor), ``image``
    (v2 ToImage), ``float`` (ToTensor); ``pil`` for any other op."""
    if not _from_torchvision(op):
        return "pil"
    return {"PILToTensor": "uint8", "ToImage": "image", "ToTensor": "float"}.get(type(op).__name__, "pil")


# --- the crop box, as torchvision draws it ------------------------------------------------


@functools.lru_cache(maxsize=16)
def _log_ratio(ratio: Tuple[float, float]) -> Tuple[float, float]:
    """torchvision's ``torch.log(torch.tensor(ratio))``: float32 values, as it draws from them
    (once per ratio: 6 us a sample otherwise)."""
    import torch

    low, high = torch.log(torch.tensor(ratio)).tolist()
    return low, high


def rrc_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float]) -> Tuple[int, int, int, int]:
    """(top, left, h, w): ``RandomResizedCrop.get_params``, drawing from torch's generator in
    the same order and with the same calls, so a seeded run gives torchvision's boxes."""
    import torch

    area = height * width
    log_ratio = _log_ratio(tuple(ratio))
    # one float32 and one int64 tensor drawn into in place: uniform_ as torchvision's
    # torch.empty(1).uniform_, exp_ the same float32 kernel as its torch.exp, random_(lo, hi) what
    # torch.randint(lo, hi, (1,)) runs on a new int64 tensor; the same draws, without a new
    # tensor for each (a third of the box's cost)
    draw, position = torch.empty(1), torch.empty(1, dtype=torch.int64)
    for _ in range(10):
        target_area = area * draw.uniform_(scale[0], scale[1]).item()
        aspect_ratio = draw.uniform_(log_ratio[0], log_ratio[1]).exp_().item()  # float32, as torchvision
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(position.random_(0, height - h + 1).item())
            j = int(position.random_(0, width - w + 1).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


# --- decoding at reduced scale -----------------------------------------------------------


def _reduction(height: int, width: int, need_h: float, need_w: float) -> int:
    """The largest DCT reduction k (1/k) that keeps a ``height`` x ``width`` region at least
    ``DCT_MARGIN`` times ``need_h`` x ``need_w`` pixels: the DCT scaling filters unlike the
    bilinear filter, which must still do most of the reduction (see
    :func:`dsconvert.codecs.scaled_eighths`; with no margin a page of text resized to 256 was 5.8
    mean levels from torchvision's pixels)."""
    for k in REDUCTIONS:
        if height / k >= need_h * DCT_MARGIN and width / k >= need_w * DCT_MARGIN:
            return k
    return 1


def _whole(need: Callable[[int, int], Tuple[float, float]]) -> Callable[[int, int], Tuple[float, float]]:
    """``need`` (for what it draws or computes), asking for the whole image: no DCT reduction."""
    def whole(height: int, width: int) -> Tuple[float, float]:
        need(height, width)
        return float(height), float(width)
    return whole


def _decode(data: Any, need: Callable[[int, int], Tuple[float, float]],
            region: Optional[Region] = None) -> Tuple[np.ndarray, int, Tuple[int, int]]:
    """(pixels, k, (top, left)): a JPEG decoded at the largest reduction 1/k that still leaves
    ``need(height, width)`` pixels, by libjpeg-turbo or else Pillow's ``draft`` (also for a JPEG
    libjpeg-turbo refuses or warns about: Pillow then accepts or refuses it as
    ``decode="pil"`` does); non-JPEG data and CMYK in full through Pillow (k = 1), exactly as
    ``decode="pil"`` decodes them. ``region(height, width, k)``: the part of the image that the
    caller reads, (top, bottom, left, right) at full resolution; the pixels may cover only that
    much, starting at (top, left) of the image at 1/k: through dsconvert's libjpeg extension
    (:func:`dsconvert.codecs.region_decode`), or where it is not built, down to the region's
    bottom row (:func:`dsconvert.codecs.fast_decode`)."""
    data = bytes(data) if not isinstance(data, bytes) else data
    if data[:3] == JPEG_MAGIC:
        refuse_unverifiable(data)

        def reduction(height: int, width: int) -> int:
            return _reduction(height, width, *need(height, width))

        if region is not None:
            try:
                cropped = region_decode(data, reduction, region)
            except BadInputError:
                raise
            except ValueError:
                cropped = None  # libjpeg warned: the whole file decides, as it would have
            if cropped is not None:
                return cropped
        fast = next((fn for _, fn in jpeg_decoders() if isinstance(fn, FastJpeg)), None)
        if fast is not None:
            rows = (lambda height, width, k: region(height, width, k)[1]) if region is not None else None
            decoded = fast_decode(data, fast, reduction, rows)
            if decoded is not None:
                return decoded[0], decoded[1], (0, 0)
        # Pillow's draft reduces as libjpeg-turbo would have: also for a file the binding refused
        # but the region decode might have taken (a sampling TurboJPEG 2.x cannot name, 4x2 or
        # 3x1), so the scale, and the sample, do not depend on which decoders are installed
        img = pil_open(data)
        if img.format == "JPEG" and img.mode in ("RGB", "L") and min(img.size) > 0:
            width, height = img.size
            k = reduction(height, width)
            if k > 1:  # draft takes the largest scale <= size // asked: w // (w // k) lies in [k, 2k)
                drafted = img.draft(img.mode, (max(1, width // k), max(1, height // k)))
                # draft's box is the image at the scale it chose (width / scale); None: it chose
                # none (a file with no scan to decode, which load() then refuses)
                k = round(width / drafted[1][2]) if drafted is not None else 1
            return np.asarray(img.convert("RGB")), k, (0, 0)
    return np.asarray(pil_rgb(data)), 1, (0, 0)


@functools.lru_cache(maxsize=1)
def _cv2() -> Any:
    """OpenCV when it imports (optional: for the HWC -> CHW copy)."""
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def _resize(pixels: np.ndarray, out_h: int, out_w: int, interpolation: str, origin: Tuple[int, int] = (0, 0),
            shape: Optional[Tuple[int, int]] = None, planar: bool = True) -> np.ndarray:
    """An HWC uint8 image resized with antialiasing: torch's uint8 kernels (through
    :mod:`dsconvert.resample` where it runs: the same pixels, and planar if asked, for the CHW
    copy); Pillow for other filters. The image is ``shape`` (default: all of ``pixels``), and
    ``pixels`` start at ``origin`` of it (at or before its top left): the memory around it lets
    the kernel read without copying."""
    h, w = shape or pixels.shape[:2]
    if origin[0] > 0 or origin[1] > 0:
        raise ValueError(f"_resize: the pixels must hold the whole image, from {origin} they cannot")
    if (h, w) != (out_h, out_w) and resample.available(interpolation, (h, w), (out_h, out_w), pixels):
        return resample.resize_window(pixels, origin, (h, w), (out_h, out_w), (0, 0, out_h, out_w), interpolation,
                                      planar)
    pixels = pixels[-origin[0]:h - origin[0], -origin[1]:w - origin[1]]
    if (h, w) == (out_h, out_w):
        return pixels
    mode = _TORCH_FILTERS.get(interpolation)
    if mode is not None:
        import torch.nn.functional as F

        out = F.interpolate(nchw_view(pixels), size=(out_h, out_w), mode=mode, antialias=True, align_corners=False)
        return out[0].permute(1, 2, 0).numpy()
    img = Image.fromarray(np.ascontiguousarray(pixels))
    return np.asarray(img.resize((out_w, out_h), _PIL_FILTERS[interpolation]))


def _crop_only(target: Tuple[int, int], g: Geometry) -> bool:
    """Whether :func:`_resized_centre` takes this Resize + CenterCrop: torch's filters and a crop
    inside the resized image."""
    (out_h, out_w), (crop_h, crop_w) = target, g.crop  # type: ignore[misc]
    return g.interpolation in _TORCH_FILTERS and crop_h <= out_h and crop_w <= out_w


def _reach(span: int, k: int, out: int) -> int:
    """Pixels at 1/k beyond a ``span``-pixel (full resolution) side of a box that Pillow's
    resize of the box to ``out`` pixels reads: its widest filter (Lanczos) reaches 3 output
    pixels' worth, and one more for rounding."""
    return math.ceil(3 * max(1.0, span / k / out)) + 1


def _centre_start(size: int, crop: int) -> int:
    """Where a centre crop starts along one axis, as torchvision's ``CenterCrop`` rounds it."""
    return int(round((size - crop) / 2.0))


def _centre(shape: Tuple[int, int], crop: Tuple[int, int]) -> Tuple[int, int]:
    """(top, left) of a ``crop`` in the centre of a ``shape`` image."""
    return _centre_start(shape[0], crop[0]), _centre_start(shape[1], crop[1])


def _centre_region(shape: Tuple[int, int], target: Tuple[int, int], crop: Tuple[int, int],
                   interpolation: str) -> Tuple[int, int, int, int]:
    """(top, bottom, left, right): the input that :func:`_resized_centre` reads of a ``shape``
    image resized to ``target`` then cropped to ``crop`` in the centre: only the filters' reach
    around the crop where :mod:`dsconvert.resample` runs, else from the origin."""
    (h, w), (out_h, out_w), (crop_h, crop_w) = shape, target, crop
    if resample.available(interpolation, shape, target):
        top, left = _centre(target, crop)
        return (*resample.span(h, out_h, top, crop_h, interpolation),
                *resample.span(w, out_w, left, crop_w, interpolation))
    return 0, _centre_reach(h, out_h, crop_h), 0, _centre_reach(w, out_w, crop_w)


def _centre_reach(size: int, out: int, crop: int) -> int:
    """The input pixels along one axis (``size`` long, resized to ``out``, then cropped to
    ``crop`` in the centre) that :func:`_resized_centre` reads, from the origin: up to the
    filter's reach past the crop (bicubic reaches 2 * max(scale, 1) pixels; bilinear half)."""
    start = _centre_start(out, crop)
    scale = size / out
    return min(size, int(scale * (start + crop) + 2 * max(scale, 1.0)) + 2)


def _resized_centre(pixels: np.ndarray, target: Tuple[int, int], crop: Tuple[int, int],
                    interpolation: str, shape: Optional[Tuple[int, int]] = None, origin: Tuple[int, int] = (0, 0),
                    planar: bool = True) -> np.ndarray:
    """torchvision's ``Resize(target)`` then ``CenterCrop(crop)`` of HWC uint8 ``pixels``, pixel
    for pixel. ``shape``: the image's (height, width), where ``pixels`` hold only the part
    :func:`_centre_region` gives, from ``origin`` (top, left). :mod:`dsconvert.resample`
    computes the crop's pixels only. Where it does not run, torch resizes up to the crop's far
    edges: its kernel places output pixel i at (i + 0.5) * scale from the origin, so the rows
    and columns before the crop are computed too, from pixels that start at the origin."""
    import torch

    h, w = shape or pixels.shape[:2]
    (out_h, out_w), (crop_h, crop_w) = target, crop
    top, left = _centre(target, crop)
    if resample.available(interpolation, (h, w), target, pixels):
        return resample.resize_window(pixels, origin, (h, w), target, (top, left, crop_h, crop_w), interpolation,
                                      planar)
    if origin != (0, 0):  # only the kernel's region (_centre_region) starts elsewhere: a decode, which it takes
        raise RuntimeError(f"torch resizes from the image's origin; these pixels start at {origin}")
    rows, cols = _centre_reach(h, out_h, crop_h), _centre_reach(w, out_w, crop_w)
    op = (torch.ops.aten._upsample_bilinear2d_aa if interpolation == "bilinear"
          else torch.ops.aten._upsample_bicubic2d_aa)
    # the scales of the whole resize (out / in), for an output that stops at the crop's far edge;
    # torch skips an axis whose output is as long as its input whatever the scale, so such an
    # axis (only when enlarging) gets one more pixel, sliced off below
    stop_h, stop_w = top + crop_h, left + crop_w
    size = [stop_h + (stop_h == rows and out_h != h), stop_w + (stop_w == cols and out_w != w)]
    out = op(nchw_view(pixels[:rows, :cols]), size, False, out_h / h, out_w / w)
    return out[0, :, top:stop_h, left:stop_w].permute(1, 2, 0).numpy()


def _chw(pixels: np.ndarray, flip: bool) -> np.ndarray:
    """HWC uint8 as a contiguous CHW array, flipped left to right if asked, in at most one copy
    with OpenCV: interleaved pixels (a decode, a crop of one) are split into the planes of a new
    array, 5x as fast as numpy's strided copy (8 against 42 us at 224 x 224); planar ones (a view
    of torch's resize output, which is CHW) are returned as they are, or flipped as one 2-D
    image (8 against 46 us). numpy where OpenCV is not installed."""
    h, w, c = pixels.shape
    cv2 = _cv2()
    if cv2 is not None and h and w and 1 <= c <= 4 and pixels.dtype == np.uint8:
        if pixels.strides[1] == 1:  # planar: each channel's rows are contiguous
            planes = np.ascontiguousarray(pixels.transpose(2, 0, 1))
            return cv2.flip(planes.reshape(c * h, w), 1).reshape(c, h, w) if flip else planes
        if pixels.strides[1:] == (c, 1):
            out = np.empty((c, h, w), np.uint8)
            cv2.split(cv2.flip(pixels, 1) if flip else pixels, list(out))
            return out
    return np.ascontiguousarray((pixels[:, ::-1] if flip else pixels).transpose(2, 0, 1))


class _Elsewhere(Exception):
    """Raised through the region decode by :meth:`FusedTransform._centre_into`'s plan: the
    image goes the general way."""


def _fill(out: np.ndarray, sample: Any) -> None:
    """A sample (a CHW uint8 tensor) copied into its row of a batch."""
    import torch

    if not isinstance(sample, torch.Tensor) or sample.dtype != torch.uint8 or tuple(sample.shape) != out.shape:
        raise ValueError(f"a sample of {getattr(sample, 'shape', type(sample).__name__)} does not fit a batch of "
                         f"{out.shape} uint8 images")
    np.copyto(out, sample.numpy())


class FusedTransform:
    """``transform`` with its leading geometry fused into decoding; call it on encoded bytes
    (:meth:`from_bytes`) or on decoded HWC pixels (:meth:`from_pixels`, for outputs that store
    pixels). See the module doc."""

    def __init__(self, geometry: Optional[Geometry], flip: Optional[float], output: str, rest: List[Any],
                 original: Optional[Callable], why_not: str = ""):
        self.geometry = geometry
        self.why_not = why_not  # when nothing is fused: the step that stopped it, in words
        # a RandomHorizontalFlip's p; None: no flip. A flip draws torch.rand(1) on every sample,
        # as torchvision's does, p = 0 included, so the random stream stays torchvision's
        self.flip = flip
        self.output = output  # "pil", "uint8" (CHW tensor), "image" (tv_tensors.Image), "float" (ToTensor)
        self.rest = rest
        self.original = original
        # image size -> what a Resize + CenterCrop does to it (_centre_plan), in each process
        self._centre_plans: Dict[Tuple[int, int], Any] = {}

    @property
    def fused(self) -> bool:
        return self.geometry is not None

    @property
    def _reduces(self) -> bool:
        """Whether a JPEG may be decoded at a DCT-domain reduction: for the bilinear and bicubic
        filters only. Nearest (and Pillow's other filters) pick or weigh single source pixels,
        which a reduced decode replaces by block averages: up to 93 levels off on photographs."""
        return self.geometry is not None and self.geometry.interpolation in _TORCH_FILTERS

    @property
    def _planar(self) -> bool:
        """Whether resizes write CHW planes: for every output but a PIL image."""
        return self.output != "pil"

    def __repr__(self) -> str:
        return f"FusedTransform(geometry={self.geometry}, flip={self.flip}, output={self.output!r}, rest={self.rest})"

    @property
    def batch_shape(self) -> Optional[Tuple[int, int, int]]:
        """(3, height, width) of every sample, where :meth:`into` can write them into one batch
        tensor: a crop of known size, ending in ``PILToTensor`` with nothing after it; else None."""
        g = self.geometry
        if g is None or self.output != "uint8" or self.rest:
            return None
        if g.kind == "random_resized_crop" and g.size is not None:
            return (3, g.size[0], g.size[1])
        if g.kind in ("resize", "center_crop", "random_crop") and g.crop is not None:
            return (3, g.crop[0], g.crop[1])
        return None

    def into(self, data: Any, out: np.ndarray) -> None:
        """:meth:`from_bytes` written into ``out``, a C x H x W uint8 array (a row of one batch
        tensor, so the DataLoader's collate has nothing to copy). Where the resize kernel runs,
        it writes the crop there directly, mirrored when the flip is drawn: no per-sample
        array, tensor, CHW copy or flip copy. Elsewhere the sample is made as :meth:`from_bytes`
        makes it, then copied. The random draws are the same, in the same order."""
        g = self.geometry
        shape = self.batch_shape
        if g is not None and shape is not None and out.shape == shape:
            if g.kind == "random_resized_crop":
                size = cast(Tuple[int, int], g.size)
                pixels, k, origin, box = self._rrc_decode(data)
                top, left, h, w = box
                if k == 1 and (h, w) != size and resample.available(g.interpolation, (h, w), size, pixels):
                    resample.resize_window(pixels, (origin[0] - top, origin[1] - left), (h, w), size,
                                           (0, 0, size[0], size[1]), g.interpolation, True, flip=self._flips(),
                                           out=out)
                    return
                return _fill(out, self._finish(self._crop_resize(pixels, box, k, g, origin, True)))
            if g.kind == "resize":
                if self._centre_into(data, out):
                    return
                pixels, k, origin, target, full = self._resize_decode(data)
                crop = cast(Tuple[int, int], g.crop)
                if (k == 1 and target is not None and full is not None and _crop_only(target, g)
                        and resample.available(g.interpolation, full, target, pixels)):
                    check_pixels(target[1], target[0])  # as _from_resize does
                    top, left = _centre(target, crop)
                    resample.resize_window(pixels, origin, full, target, (top, left, crop[0], crop[1]),
                                           g.interpolation, True, flip=self._flips(), out=out)
                    return
                area = (full[1] / k, full[0] / k) if k > 1 and full is not None else None
                return _fill(out, self._from_resize(pixels, target, area, full, origin))
        _fill(out, self.from_bytes(data))

    def _centre_into(self, data: Any, out: np.ndarray) -> bool:
        """A Resize + CenterCrop written into ``out`` the way :meth:`into` writes it (the same
        region decode, kernel window and flip draw), with what depends only on the image's size
        (the reduction, the region, the resize and its window) looked up per size instead of
        recomputed per sample: the Python per sample of an evaluation pass. False, having drawn
        nothing, where that path does not apply (not a JPEG the region decode takes, a reduced
        decode, no kernel): :meth:`into` then goes the general way."""
        g = self.geometry
        if g is None or g.crop is None or not self._reduces:
            return False
        ext = optional.jpeg_region()
        if ext is None:
            return False
        data = bytes(data) if not isinstance(data, bytes) else data
        if data[:3] != JPEG_MAGIC:
            return False
        refuse_unverifiable(data)
        planned: List[Tuple[Tuple[int, int, int, int, int], Tuple[int, int], Tuple[int, int]]] = []
        plans = self.__dict__.setdefault("_centre_plans", {})  # (an instance unpickled from before it)

        def plan(height: int, width: int) -> Tuple[int, int, int, int, int]:
            check_pixels(width, height)  # as region_decode's plan, before anything is decoded
            found = plans.get((height, width))
            if found is None:
                found = self._centre_plan(height, width)
                if len(plans) >= 4096:  # a bound for datasets of many sizes
                    plans.clear()
                plans[(height, width)] = found
            if not found:
                raise _Elsewhere
            planned.append(found)
            return found[0]

        try:
            decoded = ext.region(data, plan)
        except _Elsewhere:
            return False
        except BadInputError:
            raise
        except ValueError:
            return False  # libjpeg warned: the general way decides, as it would have
        if decoded is None:
            return False
        region, target, full = planned[0]
        buf, rows, columns, top, left = decoded
        pixels = np.frombuffer(buf, np.uint8).reshape(rows, columns, 3)
        check_pixels(target[1], target[0])  # as _from_resize does
        crop = g.crop
        ctop, cleft = _centre(target, crop)
        resample.resize_window(pixels, (top, left), full, target, (ctop, cleft, crop[0], crop[1]), g.interpolation,
                               True, flip=self._flips(), out=out)
        return True

    def _centre_plan(self, height: int, width: int) -> Any:
        """(region decode's plan, resized size, image size) of a Resize + CenterCrop of a
        ``height`` x ``width`` JPEG, as :meth:`_resize_decode` and :func:`dsconvert.codecs.region_decode`
        compute them, where it is decoded at full scale and the kernel resizes the crop's window
        only; else () (:meth:`_centre_into` does not apply)."""
        g = self.geometry
        assert g is not None and g.crop is not None
        target = resized_size(height, width, g.resize, g.max_size)
        if (_reduction(height, width, *target) != 1 or not _crop_only(target, g)
                or not resample.available(g.interpolation, (height, width), target)):
            return ()
        top, bottom, left, right = _centre_region((height, width), target, g.crop, g.interpolation)
        edge = REGION_EDGE  # at full scale (region_decode's plan: REGION_EDGE * k)
        return ((1, max(0, top - edge), max(1, bottom + edge), max(0, left - edge), max(1, right + edge)),
                target, (height, width))

    def _rrc_decode(self, data: Any) -> Tuple[np.ndarray, int, Tuple[int, int], Tuple[int, int, int, int]]:
        """(pixels, k, origin, box) of a RandomResizedCrop: the box drawn as torchvision draws it,
        the JPEG decoded at 1/k, only the region the box's resize reads (see :func:`_decode`)."""
        g = self.geometry
        assert g is not None and g.size is not None  # a random_resized_crop always has one
        size = g.size
        box: List[Tuple[int, int, int, int]] = []

        def need(height: int, width: int) -> Tuple[float, float]:
            if not box:  # drawn once, though a refused region decode asks again
                box.append(rrc_box(height, width, g.scale, g.ratio))
            # reduce only while the box stays DCT_MARGIN times the output size
            return size[0] * height / box[0][2], size[1] * width / box[0][3]

        def region(height: int, width: int, k: int) -> Tuple[int, int, int, int]:
            top, left, h, w = box[0]
            if k == 1:  # the crop is sliced out, then resized
                return top, top + h, left, left + w
            # Pillow reads the filter's reach around the box (_crop_resize)
            ry, rx = _reach(h, k, size[0]), _reach(w, k, size[1])
            return (top // k - ry) * k, (-(-(top + h) // k) + ry) * k, (left // k - rx) * k, \
                (-(-(left + w) // k) + rx) * k

        pixels, k, origin = _decode(data, need if self._reduces else _whole(need), region)
        if not box:  # decoded by Pillow without a header read: draw the box now
            box.append(rrc_box(pixels.shape[0], pixels.shape[1], g.scale, g.ratio))
        return pixels, k, origin, box[0]

    def _resize_decode(self, data: Any) -> Tuple[np.ndarray, int, Tuple[int, int], Optional[Tuple[int, int]],
                                                 Optional[Tuple[int, int]]]:
        """(pixels, k, origin, resized size, image size) of a Resize (+ CenterCrop): the JPEG
        decoded at 1/k, only the region the centre crop's resize reads where that is all it
        needs; the sizes are None where the header was not read (Pillow decoded it whole)."""
        g = self.geometry
        assert g is not None
        target: List[Tuple[int, int]] = []
        full: List[Tuple[int, int]] = []

        def need_resized(height: int, width: int) -> Tuple[float, float]:
            if not full:
                full.append((height, width))
                target.append(resized_size(height, width, g.resize, g.max_size))
            return target[0]

        def region_resized(height: int, width: int, k: int) -> Tuple[int, int, int, int]:
            if k == 1 and g.crop is not None and _crop_only(target[0], g):
                return _centre_region((height, width), target[0], g.crop, g.interpolation)
            return 0, height, 0, width  # the whole image is resized, then cropped

        pixels, k, origin = _decode(data, need_resized if self._reduces else _whole(need_resized), region_resized)
        return pixels, k, origin, target[0] if target else None, full[0] if full else None

    def from_bytes(self, data: Any) -> Any:
        g = self.geometry
        if g is None:
            return self._unfused(pil_rgb(bytes(data) if not isinstance(data, bytes) else data))
        if g.kind == "random_resized_crop":
            pixels, k, origin, rrc = self._rrc_decode(data)
            return self._finish(self._crop_resize(pixels, rrc, k, g, origin, self._planar))
        if g.kind == "resize":
            pixels, k, origin, resized, image = self._resize_decode(data)
            # at 1/k the image's ceil(width / k) columns cover width / k of it: the resize maps
            # exactly that area (resizing all the columns would stretch it by up to one pixel)
            area = (image[1] / k, image[0] / k) if k > 1 and image is not None else None
            return self._from_resize(pixels, resized, area, image, origin)
        pixels, _, _ = _decode(data, lambda h, w: (h, w))
        return self.from_pixels(pixels)

    def from_pixels(self, pixels: np.ndarray) -> Any:
        """The transform on HWC uint8 pixels already decoded (a decoded output's samples)."""
        g = self.geometry
        if pixels.ndim == 2:
            pixels = np.repeat(pixels[:, :, None], 3, axis=2)
        if g is None:
            return self._unfused(Image.fromarray(np.ascontiguousarray(pixels)))
        height, width = pixels.shape[:2]
        if g.kind == "random_resized_crop":
            return self._finish(self._crop_resize(pixels, rrc_box(height, width, g.scale, g.ratio), 1, g,
                                                  planar=self._planar))
        if g.kind == "resize":
            return self._from_resize(pixels, None)
        ch, cw = g.crop  # type: ignore[misc]
        if ch > height or cw > width:  # torchvision pads: not fused
            return self._unfused(Image.fromarray(np.ascontiguousarray(pixels)))
        if g.kind == "center_crop":
            top, left = _centre((height, width), (ch, cw))
        else:
            import torch

            top = int(torch.randint(0, height - ch + 1, size=(1,)).item()) if height != ch else 0
            left = int(torch.randint(0, width - cw + 1, size=(1,)).item()) if width != cw else 0
        return self._finish(pixels[top:top + ch, left:left + cw])

    # --- steps -------------------------------------------------------------------------

    def _from_resize(self, pixels: np.ndarray, target: Optional[Tuple[int, int]],
                     area: Optional[Tuple[float, float]] = None, shape: Optional[Tuple[int, int]] = None,
                     origin: Tuple[int, int] = (0, 0)) -> Any:
        """``area``: (width, height) of ``pixels`` that the image covers, when decoded at 1/k.
        ``shape``: the image's (height, width) at full resolution, where ``pixels`` may hold only
        the part the crop reads (:func:`_centre_region`), from ``origin``."""
        g = self.geometry
        assert g is not None
        if target is None:  # pixels at full resolution
            target = resized_size(pixels.shape[0], pixels.shape[1], g.resize, g.max_size)
        # a 12000 x 1 image resized to a 256 shorter side would be 3 million pixels long: refused
        # as the pixel limit refuses a bomb, not allocated (torchvision would allocate it)
        check_pixels(target[1], target[0])
        shape = shape or pixels.shape[:2]
        if area is None and g.crop is not None and _crop_only(target, g):
            return self._finish(_resized_centre(pixels, target, g.crop, g.interpolation, shape, origin,
                                                self._planar))
        if area is None:
            resized = _resize(pixels, target[0], target[1], g.interpolation, planar=self._planar)
        elif g.interpolation == "bilinear":
            resized = bilinear(pixels, target[0], target[1], area, "torch")  # fused runs on torch (_finish)
        else:
            img = Image.fromarray(np.ascontiguousarray(pixels))
            resized = np.asarray(img.resize((target[1], target[0]), _PIL_FILTERS[g.interpolation],
                                            box=(0.0, 0.0, area[0], area[1])))
        if g.crop is None:
            return self._finish(resized)
        ch, cw = g.crop
        h, w = resized.shape[:2]
        if ch > h or cw > w:  # torchvision pads: not fused
            return self._unfused(Image.fromarray(np.ascontiguousarray(resized)), resized=True)
        top, left = _centre((h, w), (ch, cw))
        return self._finish(resized[top:top + ch, left:left + cw])

    @staticmethod
    def _crop_resize(pixels: np.ndarray, box: Tuple[int, int, int, int], k: int, g: Geometry,
                     origin: Tuple[int, int] = (0, 0), planar: bool = True) -> np.ndarray:
        """The full-resolution ``box`` (top, left, h, w) of an image decoded at 1/k, resized to
        the output size; ``pixels`` start at ``origin`` (top, left) of the image at 1/k. At 1/k
        the box falls between pixels: Pillow's resize takes it exactly (rounding it to whole
        pixels would shift the crop by up to k/2 pixels: 2-5 mean levels)."""
        top, left, h, w = box
        out_h, out_w = g.size  # type: ignore[misc]
        oy, ox = origin
        if k == 1:
            return _resize(pixels, out_h, out_w, g.interpolation, (oy - top, ox - left), (h, w), planar)
        # only the box and the filter's reach around it go to Pillow: its result must not depend
        # on the rest of the image (Pillow 13 orders its two passes by the whole image's shape,
        # which would make the pixels depend on where decoding stopped: 1 level on some crops)
        ry, rx = _reach(h, k, out_h), _reach(w, k, out_w)
        r0, c0 = max(0, top // k - ry), max(0, left // k - rx)
        r1, c1 = -(-(top + h) // k) + ry, -(-(left + w) // k) + rx
        img = Image.fromarray(np.ascontiguousarray(pixels[r0 - oy:r1 - oy, c0 - ox:c1 - ox]))
        return np.asarray(img.resize((out_w, out_h), _PIL_FILTERS[g.interpolation],
                                     box=(left / k - c0, top / k - r0, (left + w) / k - c0, (top + h) / k - r0)))

    def _unfused(self, image: Image.Image, resized: bool = False) -> Any:
        """The transform as given on a PIL image; ``resized``: the image has been through the
        transform's ``Resize`` already, which is left out (v2's ``ToImage`` before it is not)."""
        ops = _ops(self.original)
        if self.original is None:
            return image
        if ops is None or not resized:
            return self.original(image)
        at = 1 if _conversion(ops[0]) in ("uint8", "image") else 0  # where fuse() found the Resize
        for op in ops[:at] + ops[at + 1:]:
            image = op(image)
        return image

    def _flips(self) -> bool:
        """Whether this sample is flipped: a RandomHorizontalFlip's draw, torchvision's
        ``torch.rand(1) < p``, on every sample (p = 0 included)."""
        import torch

        return self.flip is not None and torch.rand(1).item() < self.flip

    def _finish(self, pixels: np.ndarray) -> Any:
        """Flip, convert to the output type, then the rest of the transform."""
        import torch

        flip = self._flips()
        if self.output == "pil":
            out: Any = Image.fromarray(np.ascontiguousarray(pixels[:, ::-1] if flip else pixels))
        else:
            out = torch.from_numpy(_chw(pixels, flip))
            if self.output == "float":
                out = out.float().div_(255)
            elif self.output == "image":
                from torchvision import tv_tensors

                out = tv_tensors.Image(out)
        for op in self.rest:
            out = op(out)
        return out
