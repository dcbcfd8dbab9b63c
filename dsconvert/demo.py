"""A demo dataset made from real photographs: the ones scikit-image ships in its wheel.

Each photograph is a class; each sample is a random crop, flip and resize of it, saved as a
JPEG of ImageNet-like size and quality, so decode and read costs resemble real data. The
grayscale ``camera`` photo gives a grayscale class. Deterministic for a given seed.
"""

from __future__ import annotations

import os
import random
from typing import Dict, Optional, Sequence

import numpy as np
from PIL import Image

from .optional import require

__all__ = ["PHOTOS", "load_photos", "make_demo_dataset"]

# scikit-image data functions whose images are in the wheel (no download)
PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "hubble_deep_field", "immunohistochemistry",
          "motorcycle_left", "retina", "rocket")


def load_photos(names: Sequence[str] = PHOTOS) -> Dict[str, Image.Image]:
    data = require("skimage.data", "the demo dataset")
    photos = {}
    for name in names:
        loader = getattr(data, name, None)
        if loader is None:
            continue
        try:
            photos[name] = Image.fromarray(np.asarray(loader()))
        except Exception:  # an image this scikit-image version would have to download
            continue
    if not photos:
        raise RuntimeError("scikit-image ships none of the demo photographs")
    return photos


def _variant(photo: Image.Image, rng: random.Random, short: int) -> Image.Image:
    w, h = photo.size
    area = w * h * rng.uniform(0.25, 1.0)
    aspect = rng.uniform(3 / 4, 4 / 3)
    cw = min(w, int(round((area * aspect) ** 0.5)))
    ch = min(h, int(round((area / aspect) ** 0.5)))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    img = photo.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    long_side = int(short * rng.uniform(1.2, 1.5))
    size = (long_side, short) if rng.random() < 0.7 else (short, long_side)
    return img.resize(size, Image.Resampling.BICUBIC)


def make_demo_dataset(
    root: str,
    num_per_class: int = 100,
    short_side: int = 375,
    seed: int = 0,
    classes: Optional[Sequence[str]] = None,
) -> str:
    """Write ``root/<photo>/<photo>_<i>.jpg`` (an ImageFolder tree) and return ``root``."""
    photos = load_photos(classes or PHOTOS)
    for name, photo in photos.items():
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        rng = random.Random(f"{seed}:{name}")
        for i in range(num_per_class):
            path = os.path.join(folder, f"{name}_{i:05d}.jpg")
            if os.path.exists(path):
                continue
            img = _variant(photo, rng, short_side)
            img.save(path, "JPEG", quality=rng.randint(75, 95))
    return root
