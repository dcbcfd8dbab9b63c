"""``--max-size``: images larger than the training resolution are made smaller once, at
conversion, instead of being decoded at full size every epoch.

An image whose longer side exceeds ``max_size`` pixels is resized so that its longer side is
``max_size`` (aspect kept; Pillow's Lanczos filter after a DCT-domain reduction for JPEGs,
never below the target) and re-encoded in its own format: JPEG at ``quality`` (default 90, as
FFCV's ``RGBImageField(jpeg_quality=90)``), PNG and WebP losslessly. Smaller images keep their
bytes. Deterministic for a given Pillow: a resumed conversion writes the same shards.
"""

from __future__ import annotations

import io
from typing import Optional

from PIL import Image

from .codecs import pil_open, pixel_limit
from .errors import BadInputError

__all__ = ["shrink_image", "DEFAULT_QUALITY", "REENCODED_FORMATS"]

DEFAULT_QUALITY = 90
REENCODED_FORMATS = ("JPEG", "MPO", "PNG", "WEBP")  # others keep their bytes (a format Pillow may not write)


def shrink_image(data: bytes, max_size: int, quality: int = DEFAULT_QUALITY,
                 max_pixels: Optional[int] = None) -> bytes:
    """``data`` re-encoded with its longer side at ``max_size``, or unchanged when it is not
    larger (or is in a format not re-encoded here). Raises :class:`BadInputError` on what
    cannot be decoded."""
    try:
        with pixel_limit(max_pixels):
            img = pil_open(data)
            width, height, fmt = img.size[0], img.size[1], img.format
            if max(width, height) <= max_size or fmt not in REENCODED_FORMATS:
                return data
            scale = max_size / max(width, height)
            target = (max(1, round(width * scale)), max(1, round(height * scale)))
            jpeg = fmt in ("JPEG", "MPO")
            if jpeg:
                img.draft(img.mode, target)  # decode at a DCT reduction that stays >= target
            icc = img.info.get("icc_profile")
            keep = ("RGB", "L", "CMYK") if jpeg else ("RGB", "RGBA", "L", "LA")
            if img.mode not in keep:
                img = img.convert("RGBA" if not jpeg and ("transparency" in img.info or "A" in img.mode) else "RGB")
            img = img.resize(target, Image.Resampling.LANCZOS)
            out = io.BytesIO()
            if jpeg:
                img.save(out, "JPEG", quality=int(quality), icc_profile=icc)
            elif fmt == "WEBP":
                img.save(out, "WEBP", lossless=True, icc_profile=icc)
            else:
                img.save(out, "PNG", icc_profile=icc)
            return out.getvalue()
    except BadInputError:
        raise
    except Exception as exc:  # only Pillow runs here: whatever its plugins raise is the file's
        raise BadInputError(f"cannot re-encode at --max-size: {type(exc).__name__}: {exc}") from None
