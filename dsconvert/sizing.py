"""How big an output will be, before writing it: exact for encoded bytes, sampled for pixels.

Decoded caches hold H x W x 3 bytes per image, which can be 10x the JPEGs; finding that out
when the disk fills at 80 % is the outcome this prevents. Image sizes come from file headers
(no decode) of a seeded random sample, exact when the dataset is no larger than the sample.
"""

from __future__ import annotations

import io
import os
import random
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from PIL import Image

from .codecs import check_pixels, image_size, is_image_field, resized_shape
from .errors import BadInputError
from .io.location import is_remote
from .samples import Sample, Source, SourceFile
from .units import format_size  # handed on: where it was defined before dsconvert.units

__all__ = ["SizeEstimate", "estimate_output_bytes", "format_size"]


@dataclass
class SizeEstimate:
    bytes: int
    sampled: int  # images whose headers were read (0: sizes came from the scan)
    exact: bool

    def describe(self) -> str:
        how = "exact" if self.exact else f"estimated from {self.sampled} sampled images"
        return f"{format_size(self.bytes)} ({how})"


def _image_size(source: Source, f: SourceFile) -> Tuple[int, int]:
    """(height, width) of one input image from its header: a file, or a member of a local tar
    (other containers are not estimated: a ValueError)."""
    if source.kind == "tar" and not is_remote(source.root):
        fd = os.open(os.path.join(source.root, f.container), os.O_RDONLY)
        try:
            head = os.pread(fd, min(f.size, 1 << 20), f.offset)
        finally:
            os.close(fd)
        with Image.open(io.BytesIO(head)) as img:
            w, h = img.size
        return h, w
    if source.kind != "files":
        raise ValueError("not estimated")
    return image_size(f.path if os.path.isabs(f.path) else os.path.join(source.root, f.path))


def estimate_output_bytes(source: Source, decoded: bool, resize: Optional[int] = None,
                          size: Optional[Tuple[int, int]] = None, sample: int = 500,
                          seed: int = 0, stored_bytes: Optional[Callable[[Sample], int]] = None) -> SizeEstimate:
    """Bytes of the output: what each sample takes when stored encoded (``stored_bytes``: the
    format's own count, tar headers and padding included; the source's bytes without it),
    pixels when decoded."""
    if not decoded:
        per = stored_bytes or (lambda s: s.nbytes)
        return SizeEstimate(sum(per(s) for s in source.samples), 0, True)
    # the image files are counted, then the picked ones found in a second pass: random.sample
    # picks by index, so sampling range(count) picks what sampling a list of them did
    count = sum(1 for s in source.samples for f in s.files if is_image_field(f.field))
    if not count:
        return SizeEstimate(0, 0, True)
    if size is not None:
        return SizeEstimate(count * size[0] * size[1] * 3, 0, True)
    wanted = set(range(count) if count <= sample else random.Random(seed).sample(range(count), sample))
    picked: List[SourceFile] = []
    images = (f for s in source.samples for f in s.files if is_image_field(f.field))
    for i, f in enumerate(images):
        if i in wanted:
            picked.append(f)
    total = counted = 0
    for f in picked:
        try:
            h, w = resized_shape(*_image_size(source, f), resize=resize)
        except Exception:
            continue  # unreadable now: it will be skipped, and takes no room
        try:
            check_pixels(w, h)
        except BadInputError:
            continue  # past the pixel limit (a strip --resize would blow up): skipped too
        total += h * w * 3
        counted += 1
    if counted == 0:
        return SizeEstimate(0, len(picked), False)
    exact = len(picked) == count
    return SizeEstimate(total if exact else int(total / counted * count), len(picked), exact)
