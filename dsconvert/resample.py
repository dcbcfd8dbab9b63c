"""torch's antialiased uint8 resize, computed for a window of its output only.

``decode="fused"`` resizes as torchvision does on uint8 tensors (``F.interpolate(...,
antialias=True)``), pixel for pixel. torch's kernel has no offset: a ``Resize(256)`` +
``CenterCrop(224)`` must compute every row and column before the crop too, and it copies its
RGB input into an RGBA buffer and its output back. dsconvert's C kernel
(``dsconvert/_resize.c``) computes the window's pixels only, from only the input pixels their
filters reach, with torch's int16 weights and rounding, into a planar (CHW) or interleaved array:
on the benchmark's ~480 x 375 photos to 256 then 224, 0.17 ms against 0.46 ms for torch's resize
then crop (``benchmarks/resample.py``). It needs AVX2 (x86-64 since 2013); elsewhere, or where
it was not built, :func:`available` is False and callers use torch, which gives the same pixels.

"torch's pixels" are those of torch's AVX2 and AVX-512 kernels, which x86-64 CPUs with AVX2
run. torch's own generic loops (``ATEN_CPU_CAPABILITY=default``) differ from them on some
extreme shapes (a review found 25 x 158 to 183 x 1 up to 19 levels apart): torch is not
consistent with itself there, and the kernel follows what nearly every x86 user gets.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Optional, Tuple

import numpy as np

from . import optional

__all__ = ["FILTERS", "available", "state", "span", "resize_window"]

FILTERS = {"bilinear": 0, "bicubic": 1}


@functools.cache
def state() -> str:
    """``runs``, ``not built`` (no compiler at install) or ``no AVX2`` (this CPU; the kernel's
    plain C loops give the same pixels, but slower than torch's: they are kept for the tests and
    as a reference, bench_resample.py). analyze's notes say which."""
    module = optional.resize_kernel()
    return "not built" if module is None else "runs" if module.simd() else "no AVX2"


SIDE_LIMIT = 1 << 24  # the kernel's bound on every side and offset (_resize.c)


def available(interpolation: str, in_shape: Optional[Tuple[int, int]] = None,
              out_shape: Optional[Tuple[int, int]] = None, pixels: Optional[np.ndarray] = None) -> bool:
    """Whether :func:`resize_window` runs here for this filter and, where given, these sides
    (under 2**24) and ``pixels`` (uint8, 3 channels, each pixel's bytes together, rows in order:
    a decode or a crop of one). torch takes the rest, on the same pixels."""
    if interpolation not in FILTERS or state() != "runs":
        return False
    if any(not 0 < side < SIDE_LIMIT for shape in (in_shape, out_shape) if shape is not None for side in shape):
        return False
    if pixels is not None:
        strides = pixels.strides
        return (pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3 and strides[2] == 1
                and strides[1] == 3 and strides[0] >= 3 * pixels.shape[1])
    return True


def _kernel() -> ModuleType:
    """The C kernel; callers check :func:`available` first."""
    module = optional.resize_kernel()
    if module is None:
        raise RuntimeError("dsconvert's resize kernel (dsconvert._resize) was not built")
    return module


def span(in_size: int, out_size: int, start: int, count: int, interpolation: str) -> Tuple[int, int]:
    """The input pixels [lo, hi) along one axis that outputs [start, start + count) of a resize
    from ``in_size`` to ``out_size`` read."""
    return _kernel().span(in_size, out_size, start, count, FILTERS[interpolation])


def resize_window(pixels: np.ndarray, origin: Tuple[int, int], in_shape: Tuple[int, int],
                  out_shape: Tuple[int, int], window: Tuple[int, int, int, int], interpolation: str,
                  planar: bool = True, simd: bool = True, flip: bool = False,
                  out: Optional[np.ndarray] = None) -> np.ndarray:
    """The ``window`` (top, left, height, width) of an ``in_shape`` image resized to
    ``out_shape``, exactly as torch's antialiased uint8 ``interpolation`` gives it. ``pixels``:
    HWC uint8 (3 or 4 channels, any row stride), the image's rows and columns from ``origin``
    (top, left; negative where they start before it). Returns HWC; with ``planar``, a view of a
    new C x H x W array (a CHW tensor without a copy). ``flip``: mirrored left to right (the
    same pixels as flipping the result, without the copy). ``out``: the C x H x W (planar) or
    H x W x C array to write, C-contiguous and of the window's size (a row of a batch), instead
    of a new one. ValueError when ``pixels`` lack an input pixel the window reads."""
    top, left, height, width = window
    if out is None:
        out = np.empty((3, height, width) if planar else (height, width, 3), np.uint8)
    elif out.shape != ((3, height, width) if planar else (height, width, 3)):
        raise ValueError(f"resize_window: out is {out.shape}, the window {(height, width)}")
    _kernel().window(pixels, origin[0], origin[1], in_shape[0], in_shape[1], out_shape[0],
                     out_shape[1], top, left, out, FILTERS[interpolation], planar, simd, flip)
    return out.transpose(1, 2, 0) if planar else out
