"""Resizing decoded pixels: Pillow's antialiased bilinear filter (or torch's uint8 kernel, given
Pillow's scales), and decode + resize with a JPEG decoded at the smallest DCT scale that still
covers the output. The size arithmetic is :mod:`dsconvert.geometry`'s."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

import numpy as np
from PIL import Image

from ..geometry import resized_shape, scaled_eighths
from ..processes import ProcessLocal
from .checks import JPEG_MAGIC, check_pixels, refuse_unverifiable
from .jpeg import FastJpeg, decode_rgb, jpeg_decoders

__all__ = ["RESAMPLERS", "resolve_resampler", "nchw_view", "bilinear", "decode_resized"]

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

        from .. import processes

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
    if scaled and (resize is not None or size is not None) and decoder != "pil" and data[:3] == JPEG_MAGIC:
        fast = next((fn for name, fn in jpeg_decoders() if name == decoder), None)
        header = None
        if isinstance(fast, FastJpeg):
            try:
                header = fast.header(data)
            except Exception:
                pass  # Pillow decides, below
        if isinstance(fast, FastJpeg) and header is not None and not header[2] and header[0] > 0 and header[1] > 0:
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
