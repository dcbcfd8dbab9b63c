"""Image geometry as torchvision computes it, shared by the fused decoders and the transforms
that match torchvision's."""

from __future__ import annotations

from typing import Any, Optional, Tuple

__all__ = ["resized_size"]


def resized_size(height: int, width: int, resize: Any, max_size: Optional[int] = None) -> Tuple[int, int]:
    """(h, w) after torchvision's ``Resize(resize, max_size)``."""
    if not isinstance(resize, int):
        return int(resize[0]), int(resize[1])
    short, long_ = (width, height) if width <= height else (height, width)
    new_short, new_long = resize, int(resize * long_ / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if width <= height else (new_short, new_long)
