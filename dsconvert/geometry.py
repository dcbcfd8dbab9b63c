"""Image size arithmetic, pure and dependency-free: the output size of ``--resize``/``--size``
and of torchvision's ``Resize`` (shared by the fused decoders and the transforms that match
torchvision's), the DCT scale a JPEG can be decoded at for an output size, and ``HxW`` parsing."""

from __future__ import annotations

from typing import Any, Optional, Tuple

__all__ = ["resized_shape", "resized_size", "scaled_eighths", "parse_hw"]


def resized_size(height: int, width: int, resize: Any, max_size: Optional[int] = None) -> Tuple[int, int]:
    """(h, w) after torchvision's ``Resize(resize, max_size)``."""
    if not isinstance(resize, int):
        return int(resize[0]), int(resize[1])
    short, long_ = (width, height) if width <= height else (height, width)
    new_short, new_long = resize, int(resize * long_ / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if width <= height else (new_short, new_long)



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


def parse_hw(text: str) -> Tuple[int, int]:
    """'224x224' -> (224, 224): height x width."""
    try:
        h, w = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"size must be HxW, e.g. 224x224, not {text!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"size must be positive, not {text!r}")
    return h, w
