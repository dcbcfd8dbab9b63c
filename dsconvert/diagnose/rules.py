"""What a frame of a sampled stack is doing, as data: ordered tables of rule records that
:mod:`dsconvert.diagnose.classify` reads, leaf-most frame first, first match wins.

A :class:`FrameRule` names a category and a detail for a frame whose file (and, where given,
function) matches; a :class:`LineRule` does the same from the frame's source line (C functions
py-spy does not see: ``np.fromfile(...)``, ``cv2.imdecode(...)``). Adding a library is adding
a row, in the place its precedence asks for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["FrameRule", "LineRule", "FRAME_RULES", "LINE_RULES", "COMPUTE_RULES", "COMPUTE_LIBRARIES",
           "COMPUTE_LINES"]


@dataclass(frozen=True)
class FrameRule:
    """Frames whose file matches ``file`` (and function ``func``, when given) are ``category``."""

    category: str
    detail: str
    file: re.Pattern[str]
    func: Optional[re.Pattern[str]] = None

    def matches(self, file: str, func: str) -> bool:
        return bool(self.file.search(file)) and (self.func is None or bool(self.func.search(func)))


@dataclass(frozen=True)
class LineRule:
    """A leaf frame whose source line matches ``pattern`` is ``category``."""

    category: str
    detail: str
    pattern: re.Pattern[str]

    def matches(self, line: str) -> bool:
        return bool(self.pattern.search(line))


# (category, detail, file pattern, function pattern or None), checked leaf-most frame first
FRAME_RULES: Tuple[FrameRule, ...] = tuple(
    FrameRule(c, d, re.compile(f), re.compile(fn) if fn else None) for c, d, f, fn in (
        ("ipc", "unpickling tensors from workers", r"torch/multiprocessing/reductions\.py$", r"rebuild"),
        ("ipc", "pickling tensors for the main process", r"torch/multiprocessing/reductions\.py$", None),
        ("unpickle", "pickle.load", r"(^|/)pickle\.py$", r"load|Unpickler"),
        ("unpickle", "torch.load", r"torch/serialization\.py$", r"load"),
        ("decode", "PyTurboJPEG", r"(^|/)turbojpeg\.py$", None),
        ("decode", "simplejpeg", r"simplejpeg", None),
        ("decode", "torchvision.io", r"torchvision/io/", None),
        ("decode", "PNG (Pillow)", r"PIL/PngImagePlugin\.py$", r"load|chunk|read"),
        ("decode", "JPEG (Pillow)", r"PIL/JpegImagePlugin\.py$", r"load_read|draft|load_prepare"),
        ("read", "Image.open (open + header)", r"PIL/Image\.py$", r"^open$|_open_core|^_open$"),
        ("read", "Image.open (open + header)", r"PIL/\w+ImagePlugin\.py$", r"_open|factory|__init__"),
        ("read", "Image.open (open + header)", r"PIL/ImageFile\.py$", r"__init__"),
        ("decode", "Pillow", r"PIL/ImageFile\.py$", r"load"),
        ("decode", "Pillow (to RGB / array)", r"PIL/Image\.py$",
         r"^(Image\.)?(convert|tobytes|__array_interface__|copy|load|frombuffer|_new|_copy_info)"),
        ("augment", "Pillow transforms", r"PIL/(Image|ImageOps|ImageEnhance|ImageFilter|ImageTransform)\.py$", None),
        ("augment", "torchvision transforms", r"torchvision/transforms/", None),
        ("augment", "albumentations", r"albumentations/", None),
        ("read", "np.load", r"numpy/lib/(npyio|_npyio_impl|format|_format_impl)\.py$", None),
        ("read", "np.memmap", r"numpy/(core|_core)/memmap\.py$", None),
        ("read", "h5py", r"h5py/", None),
        ("read", "tarfile", r"(^|/)tarfile\.py$", None),
        ("read", "webdataset", r"webdataset/", None),
        ("read", "dsconvert shards", r"dsconvert/(formats|readers|io)/", None),
        ("decode", "dsconvert (Pillow/turbojpeg chain)", r"dsconvert/codecs(\.py|/\w+\.py)$", r"decode|pil_"),
        ("remote", "S3 (s3fs/botocore)", r"(s3fs|botocore|boto3|aiobotocore)/", None),
        ("remote", "HTTP", r"(urllib3|requests|aiohttp|httpx)/|http/client\.py$|fsspec/implementations/http", None),
        ("remote", "GCS / Azure", r"(gcsfs|adlfs|google/cloud/storage)/", None),
        ("read", "fsspec (local files)", r"fsspec/implementations/(local|cached)\.py$", None),
        ("remote", "fsspec", r"fsspec/", None),
        ("remote", "socket", r"(^|/)(socket|ssl|selectors)\.py$", None),
        ("collate", "default_collate", r"torch/utils/data/_utils/collate\.py$", None),
        ("pin", "pin memory", r"torch/utils/data/_utils/pin_memory\.py$", None),
    )
)

# what the leaf frame's source line calls (C functions py-spy does not see)
LINE_RULES: Tuple[LineRule, ...] = tuple(
    LineRule(c, d, re.compile(p)) for c, d, p in (
        ("read", "np.fromfile", r"\bfromfile\("),
        ("decode", "OpenCV", r"\bcv2\.(imdecode|imread)\("),
        ("augment", "OpenCV", r"\bcv2\.(?!imdecode|imread|imwrite)\w+\("),
        ("unpickle", "pickle.load", r"\b(pickle|cPickle|_pickle)\.loads?\(|\bloads?\(.*pickle"),
        ("remote", "socket recv", r"\.recv(_into|from)?\("),
        ("read", "file read", r"\.(read|readinto|readline|readlines)\(|\bopen\(|\bos\.(pread|read)\("),
    )
)

COMPUTE_RULES: Tuple[FrameRule, ...] = tuple(
    FrameRule("compute", d, re.compile(f), re.compile(fn) if fn else None) for d, f, fn in (
        ("waiting for the GPU (synchronize)", r"torch/cuda/", r"synchronize"),
        ("backward", r"torch/autograd/|torch/_tensor\.py$", r"backward|_engine_run_backward|run_backward"),
        ("optimizer step", r"torch/optim/", None),
        ("model forward", r"torch/nn/modules/", None),
        ("torch (other)", r"torch/", None),
        ("numpy", r"numpy/", None),
    )
)


# Array and image libraries: their frames below the dataset's __getitem__ are preprocessing
# (checked after the I/O rules above, which claim np.load, torch.load, torchvision.io...)
COMPUTE_LIBRARIES: Tuple[FrameRule, ...] = tuple(
    FrameRule("augment", d, re.compile(f)) for d, f in (
        ("scipy.ndimage", r"(^|/)scipy/ndimage/"),
        ("scipy", r"(^|/)scipy/"),
        ("scikit-image", r"(^|/)skimage/"),
        ("kornia (CPU)", r"(^|/)kornia/"),
        ("albumentations", r"(^|/)albumentations/"),
        ("imgaug", r"(^|/)imgaug/"),
        ("MONAI", r"(^|/)monai/"),
        ("OpenCV", r"(^|/)cv2/"),
        ("torchvision transforms", r"(^|/)torchvision/"),
        ("torch CPU ops", r"(^|/)torch/(?!utils/data/)"),
        ("numpy", r"(^|/)numpy/"),
        ("Pillow transforms", r"(^|/)PIL/"),
    )
)

# what the leaf's source line calls in an array/image library (C functions py-spy does not see)
COMPUTE_LINES: Tuple[LineRule, ...] = tuple(
    LineRule("augment", d, re.compile(p)) for d, p in (
        ("OpenCV", r"\bcv2\.\w+\("),
        ("scipy.ndimage", r"\bndimage\.\w+\("),
        ("scipy", r"\bscipy\.[\w.]+\("),
        ("scikit-image", r"\bskimage\.[\w.]+\("),
        ("kornia (CPU)", r"\bkornia\.[\w.]+\("),
        ("torch CPU ops", r"\btorch\.\w|\bF\.\w+\("),
        ("numpy", r"\b(np|numpy)\.\w"),
    )
)
