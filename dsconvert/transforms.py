"""Reference transforms: what a training job does to each sample before the GPU.

``analyze`` predicts, and ``bench`` measures, a DataLoader's rate *with* a transform, since a
loader that only decodes is a ceiling no training loop reaches. The two standard ImageNet
pipelines are here without torchvision (whose CPU wheel is not always installable beside
torch), with the same geometry: ``eval`` is ``Resize(256)`` + ``CenterCrop(224)`` and
``train`` is ``RandomResizedCrop(224)`` (scale (0.08, 1), ratio (3/4, 4/3), ten tries then the
centre-crop fallback, as torchvision) + ``RandomHorizontalFlip``. Both resize with Pillow's
bilinear filter and return uint8 CHW tensors: the float conversion and normalisation belong on
the GPU (4x less to move between processes). A user's own transform is named
``module:callable`` (a callable, or a class instantiated with no arguments).
"""

from __future__ import annotations

import importlib
import math
import random
from typing import Any, Callable, Optional, Tuple

import numpy as np

from .errors import OptionError
from .geometry import resized_size

__all__ = ["CropToTensor", "RandomResizedCropToTensor", "load_transform", "TRANSFORMS"]

TRANSFORMS = ("eval", "train", "none")


def _pil(image: Any) -> Any:
    from PIL import Image

    if isinstance(image, np.ndarray):
        return Image.fromarray(image)
    return image


def _to_tensor(image: Any) -> Any:
    import torch

    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return torch.from_numpy(np.array(pixels.transpose(2, 0, 1), order="C"))  # CHW uint8, a writable copy


class CropToTensor:
    """Shorter side to ``resize`` (default ``size``; Pillow bilinear), centre crop ``size`` x
    ``size``, uint8 CHW tensor: ``eval`` is ``CropToTensor(224, resize=256)``."""

    def __init__(self, size: int, resize: Optional[int] = None):
        self.size = int(size)
        self.resize = int(resize or size)

    def __call__(self, image: Any) -> Any:
        from PIL import Image

        image = _pil(image)
        s, r = self.size, self.resize
        w, h = image.size
        nh, nw = resized_size(h, w, r)  # torchvision's Resize(r) size: the longer side truncated
        image = image.resize((nw, nh), Image.Resampling.BILINEAR)
        w, h = image.size
        left, top = int(round((w - s) / 2.0)), int(round((h - s) / 2.0))  # torchvision's CenterCrop
        return _to_tensor(image.crop((left, top, left + s, top + s)))

    def __repr__(self) -> str:
        return f"CropToTensor(size={self.size}, resize={self.resize})"


class RandomResizedCropToTensor:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` + ``RandomHorizontalFlip()``,
    uint8 CHW tensor. The crop box follows torchvision's ``get_params`` exactly (area and log-
    uniform aspect ratio, ten tries, then the centre crop clamped to the ratio range)."""

    def __init__(self, size: int = 224, scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3), flip: float = 0.5):
        self.size = int(size)
        self.scale = scale
        self.ratio = ratio
        self.flip = flip

    def box(self, width: int, height: int, rng: Any = random) -> Tuple[int, int, int, int]:
        """(top, left, height, width) of the crop, as ``RandomResizedCrop.get_params``."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return rng.randint(0, height - h), rng.randint(0, width - w), h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: Any) -> Any:
        from PIL import Image

        image = _pil(image)
        top, left, h, w = self.box(*image.size)
        image = image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if random.random() < self.flip:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return _to_tensor(image)

    def __repr__(self) -> str:
        return f"RandomResizedCropToTensor(size={self.size}, scale={self.scale}, ratio={self.ratio})"


def load_transform(spec: Optional[str], size: int = 224) -> Optional[Callable]:
    """``eval``, ``train``, ``none`` (or None), or ``module:callable`` (a class named there is
    instantiated with no arguments)."""
    if spec is None or spec == "none":
        return None
    if spec == "eval":
        return CropToTensor(size, resize=round(size * 256 / 224))
    if spec == "train":
        return RandomResizedCropToTensor(size)
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise OptionError(f"transform must be one of {', '.join(TRANSFORMS)} or module:callable, not {spec!r}")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise OptionError(f"cannot load the transform {spec}: {exc}") from None
    if isinstance(obj, type):
        obj = obj()
    if not callable(obj):
        raise OptionError(f"the transform {spec} is not callable")
    return obj
