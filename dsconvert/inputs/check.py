"""What every input reader does with the bytes it read: a sample's fields checked (each decodes,
within the pixel limit; images shrunk to ``--max-size``, JPEGs restart-marked by
``--jpeg-restart``), or the first bad file's error."""

from __future__ import annotations

from typing import Callable, Dict, Tuple

from ..codecs import check_field, is_image_field, restart_marked
from ..errors import BadInputError
from ..keys import escape_path
from ..plan import CHANGED_DURING, ShardSpec, over_limit, sample_bytes_limit
from ..reencode import DEFAULT_QUALITY, shrink_image
from ..samples import Fetched, Fields, Sample

__all__ = ["checked", "Check", "Contents"]

Contents = Dict[str, Tuple[bytes, bool]]  # per input path: (bytes, still as scanned)
Check = Callable[[ShardSpec, Sample, Contents], Fetched]  # what a container's reader is handed: checked


def checked(spec: ShardSpec, sample: Sample, contents: Contents) -> Fetched:
    """Fields of a sample from (bytes, still as scanned) per file; the first bad file decides."""
    fields: Fields = {}
    limit = sample_bytes_limit(spec)
    for f in sample.files:
        data, unchanged = contents[f.path]
        if limit is not None and len(data) > limit:  # before any decode: a byte bomb costs no more work
            return BadInputError(over_limit(len(data), limit), escape_path(f.path))
        if not unchanged or len(data) != f.size:
            return BadInputError(f"{CHANGED_DURING} (size or mtime differs from the scan); run the same "
                                 "command again to include it", escape_path(f.path))
        try:
            check_field(f.field, data, spec.verify, spec.max_image_pixels)
            if spec.options.get("max_size") and is_image_field(f.field):
                data = shrink_image(data, spec.options["max_size"], spec.options.get("quality", DEFAULT_QUALITY),
                                    spec.max_image_pixels)
            if spec.options.get("jpeg_restart") and is_image_field(f.field):
                data = restart_marked(data)  # the same pixels, decodable by segments (convert's jpeg_restart)
        except BadInputError as exc:
            return BadInputError(exc.reason, escape_path(f.path))
        fields[f.field] = data
    return fields
