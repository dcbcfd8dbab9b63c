"""What a field is, by its name: the extension, lower-cased (``img.JPEG`` -> ``jpeg``), as the
webdataset reader lower-cases it. Images are recognised by torchvision's list of extensions,
so an ImageFolder source yields exactly the files ImageFolder would load."""

from __future__ import annotations

__all__ = ["IMAGE_EXTENSIONS", "CLASS_EXTENSIONS", "TEXT_EXTENSIONS", "PICKLE_EXTENSIONS", "DECODE_MODES",
           "ENCODED_MODES", "field_kind", "is_image_field", "encode_class"]

# torchvision.datasets.folder.IMG_EXTENSIONS, without the dots
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")
CLASS_EXTENSIONS = ("cls", "cls2", "class", "label", "index")
TEXT_EXTENSIONS = ("txt", "text")
PICKLE_EXTENSIONS = ("pyd", "pickle", "pkl")  # unpickled only with allow_pickle=True: it runs code
DECODE_MODES = ("pil", "numpy", "raw", "buffer", "fused")  # fused: decoding fused with the transform (fused.py)
ENCODED_MODES = ("raw", "buffer")  # modes that hand out the encoded bytes themselves


def field_kind(field: str) -> str:
    """One of ``image``, ``class``, ``json``, ``text``, ``npy``, ``pickle``, ``bytes``."""
    ext = field.rsplit(".", 1)[-1].lower()
    if ext in IMAGE_EXTENSIONS:
        return "image"
    if ext in CLASS_EXTENSIONS:
        return "class"
    if ext == "json":
        return "json"
    if ext in TEXT_EXTENSIONS:
        return "text"
    if ext == "npy":
        return "npy"
    if ext in PICKLE_EXTENSIONS:
        return "pickle"
    return "bytes"


def is_image_field(field: str) -> bool:
    return field_kind(field) == "image"


def encode_class(label: int) -> bytes:
    """``cls`` members hold the class index as decimal text, the webdataset convention."""
    return str(int(label)).encode("ascii")
