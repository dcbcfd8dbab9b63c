"""What :func:`~dsconvert.analyze.detect.detect` answers: the kinds of data it names, their
readers and labels, :class:`Detected`, and the small text helpers its descriptions share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["KINDS", "READERS", "NAMES", "FILE_LABELS", "Detected", "count_files", "plain_kind", "product",
           "shape_text", "short_error"]

KINDS = ("dsconvert", "webdataset", "hdf5", "npy", "npz", "parquet", "arrow", "lmdb", "tfrecord",
         "pickle", "files", "unknown")

READERS = {
    "dsconvert": "dsconvert.open_dataset",
    "webdataset": "webdataset.WebDataset",
    "hdf5": "h5py",
    "npy": "np.load(mmap_mode='r')",
    "npz": "np.load",
    "parquet": "pyarrow.parquet / datasets.load_dataset('parquet')",
    "arrow": "pyarrow.ipc / datasets.Dataset.from_file",
    "lmdb": "lmdb",
    "tfrecord": "tf.data.TFRecordDataset / the tfrecord package",
    "pickle": "pickle / torch.load",
    "files": "dsconvert.open_source / torchvision.datasets.ImageFolder",
    "unknown": "",
}

# what a file of a kind is, for "named .npy but its content is not an .npy array"
NAMES = {"webdataset": "a tar archive", "hdf5": "HDF5", "npy": "an .npy array", "npz": "an .npz archive",
         "parquet": "Parquet", "arrow": "Arrow IPC", "lmdb": "LMDB", "tfrecord": "TFRecord",
         "pickle": "a pickle"}
# what one file of a kind is called when files are counted: "3 HDF5 files"
FILE_LABELS = {"webdataset": "tar", "hdf5": "HDF5", "npy": ".npy", "npz": ".npz", "parquet": "Parquet",
               "arrow": "Arrow", "lmdb": "LMDB", "tfrecord": "TFRecord", "pickle": "pickle", "files": "other",
               "unknown": "unrecognised"}


def count_files(n: int, kind: str) -> str:
    return f"{n:,} {FILE_LABELS.get(kind, kind)} file{'s' if n != 1 else ''}"


@dataclass
class Detected:
    """What a path holds. ``kind`` is one of :data:`KINDS`; ``files`` are its data files (of a
    big folder, those listed before the walk stopped); ``num_samples`` is None where headers
    cannot tell, and then ``estimated_samples`` may hold an extrapolation from the files read;
    ``convertible``: whether ``dsconvert shard`` takes it as a source today (only "files"
    sources); ``others``: the other kinds found beside the dominant one (kind -> file count);
    ``damaged``: "path: why" for every file read that is not what it claims to be."""

    path: str
    kind: str
    description: str
    files: List[str] = field(default_factory=list)
    num_samples: Optional[int] = None
    reader: str = ""
    convertible: bool = False
    advice: str = ""
    format: Optional[str] = None  # dsconvert outputs: the manifest's format id (wds, hdf5, npy)
    estimated_samples: Optional[int] = None
    others: Dict[str, int] = field(default_factory=dict)
    damaged: List[str] = field(default_factory=list)
    complete: bool = True  # False: a big folder, listed only in part
    details: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def plain_kind(kind: str) -> str:
    """A sniffed kind as a Detected kind: any file the scanner takes is "files"."""
    return "files" if kind == "other" else kind


def product(shape: Sequence[int]) -> int:
    p = 1
    for n in shape:
        p *= n
    return p


def shape_text(shape: Any) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def short_error(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
