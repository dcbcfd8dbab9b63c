"""Field codecs by extension: what a field is, how to check it, how to decode it.

A field's name is its file extension, lower-cased (``img.JPEG`` -> ``jpeg``), as the
webdataset reader lower-cases it. Images are recognised by torchvision's list of
extensions, so an ImageFolder source yields exactly the files ImageFolder would load.

JPEG decoding to arrays goes through a chain: PyTurboJPEG (when libturbojpeg loads) ->
simplejpeg (its wheel bundles libjpeg-turbo) -> PIL. The fast decoders reject CMYK and
anything that is not really a JPEG (a PNG named ``.JPEG``); those fall back to PIL, so every
path gives the RGB image that ``PIL.Image.open(f).convert("RGB")`` gives. ``decode="fused"``
also decodes regions (:func:`region_decode`) through dsconvert's own libjpeg extension.

The package, by layer: :mod:`.fields` (what a field is) and :mod:`.npy` at the bottom;
:mod:`.compress` (zstd-compressed fields, ``--compress``); :mod:`.checks` (pixel limit,
decoder policy, input checks); :mod:`.jpeg` (the decoder chain); :mod:`.decode` (fields and
images when reading) and :mod:`.resize` (decoded caches).
The submodules import each other, never this package; the size arithmetic lives in
:mod:`dsconvert.geometry`. Every public name is handed on here.
"""

from __future__ import annotations

from ..geometry import parse_hw, resized_shape, scaled_eighths
from .checks import (
    ARITHMETIC_REASON,
    JPEG_MAGIC,
    check_field,
    check_image,
    check_pixels,
    pil_open,
    pil_rgb,
    pixel_limit,
    refuse_unverifiable,
)
from .compress import (
    ALREADY_COMPRESSED,
    CODECS,
    DEFAULT_LEVEL,
    MAX_LEVEL,
    SUFFIX,
    Compressor,
    codec_version,
    compressed_bound,
    compression_label,
    decompress_field,
    is_compressible,
    parse_compression,
    require_codec,
    stored_name,
)
from .decode import (
    PILLOW_DECODE_ERRORS,
    as_buffer,
    decode_errors_naming,
    decode_field,
    decode_image,
    image_size,
)
from .fields import (
    CLASS_EXTENSIONS,
    DECODE_MODES,
    ENCODED_MODES,
    IMAGE_EXTENSIONS,
    PICKLE_EXTENSIONS,
    TEXT_EXTENSIONS,
    encode_class,
    field_kind,
    is_image_field,
)
from .jpeg import (
    DECODERS,
    REGION_EDGE,
    FastJpeg,
    Region,
    decode_rgb,
    fast_decode,
    jpeg_decoders,
    region_decode,
    resolve_decoder,
    restart_marked,
)
from .npy import NPY_HEADER_ERRORS, load_npy
from .resize import RESAMPLERS, bilinear, decode_resized, nchw_view, resolve_resampler

__all__ = [
    "IMAGE_EXTENSIONS", "CLASS_EXTENSIONS", "TEXT_EXTENSIONS", "PICKLE_EXTENSIONS", "DECODE_MODES", "ENCODED_MODES",
    "field_kind", "is_image_field", "encode_class",
    "pixel_limit", "pil_open", "pil_rgb", "check_pixels", "check_image", "check_field", "refuse_unverifiable",
    "ARITHMETIC_REASON", "JPEG_MAGIC",
    "jpeg_decoders", "FastJpeg", "DECODERS", "resolve_decoder", "decode_rgb", "fast_decode", "region_decode",
    "restart_marked", "Region", "REGION_EDGE",
    "load_npy", "NPY_HEADER_ERRORS",
    "CODECS", "DEFAULT_LEVEL", "MAX_LEVEL", "SUFFIX", "ALREADY_COMPRESSED", "parse_compression", "compression_label",
    "require_codec", "is_compressible", "stored_name", "compressed_bound", "codec_version", "Compressor",
    "decompress_field",
    "as_buffer", "decode_image", "decode_field", "decode_errors_naming", "PILLOW_DECODE_ERRORS", "image_size",
    "RESAMPLERS", "resolve_resampler", "decode_resized", "bilinear", "nchw_view",
    "resized_shape", "scaled_eighths", "parse_hw",
]
