"""The value types every layer passes around: a scanned source, its samples and their input
files, what was skipped and why, and a sample's fields as read. Plain data, importing nothing
of dsconvert but its errors: the scanner (:mod:`dsconvert.source`) makes them, the plan, the
formats, the manifest and the readers take them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import BadInputError

__all__ = ["LAYOUTS", "CONTAINER_LAYOUTS", "CLASSIFICATION_LAYOUTS", "LABEL_MAX", "SourceFile", "Sample", "Skipped",
           "Source", "Fields", "Fetched", "quick_file", "quick_sample"]

LAYOUTS = ("auto", "imagefolder", "flat", "list", "tars", "parquet", "arrow", "output")
CONTAINER_LAYOUTS = ("tars", "parquet", "arrow", "output")  # inputs inside files: see Source.kind
CLASSIFICATION_LAYOUTS = ("imagefolder", "list")  # one image and a label per sample
LABEL_MAX = 2**63 - 1  # labels are stored as int64 (hdf5, npy, torch tensors)


@dataclass(frozen=True)
class SourceFile:
    """One input file of a sample. ``path`` is relative to the source root (or absolute).

    An input inside a container (a tar member, a Parquet row's image, a sample of a dsconvert
    output) names the container's file in ``container`` and its place there in ``offset`` (a
    member's data offset, a row, a sample index); ``path`` then reads ``CONTAINER/MEMBER`` and
    ``mtime_ns`` is the container's."""

    field: str
    path: str
    size: int
    mtime_ns: int
    container: str = ""
    offset: int = -1


@dataclass(frozen=True)
class Sample:
    key: str
    files: Tuple[SourceFile, ...]
    label: Optional[int] = None

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files)


_new = object.__new__


def quick_file(field: str, path: str, size: int, mtime_ns: int, container: str, offset: int) -> SourceFile:
    """``SourceFile(...)``, the same object, made without the frozen dataclass's ``__setattr__``
    per field (half the time: a scan table decodes every sample several times per conversion)."""
    made = _new(SourceFile)
    made.__dict__.update(field=field, path=path, size=size, mtime_ns=mtime_ns, container=container, offset=offset)
    return made


def quick_sample(key: str, files: Tuple[SourceFile, ...], label: Optional[int]) -> Sample:
    """``Sample(key, files, label)``, made as :func:`quick_file` makes a file."""
    made = _new(Sample)
    made.__dict__.update(key=key, files=files, label=label)
    return made


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str
    count: int = 1  # a run of rows skipped for one reason (``a.parquet/rows 3-9``): dsconvert.skips


@dataclass
class Source:
    """The result of a scan: what will be converted, and what will not, with reasons.

    ``kind`` says how the inputs are read: ``files`` (each a file), or from containers:
    ``tar`` (members of existing tar shards), ``parquet`` (rows of Parquet files), ``output``
    (samples of a dsconvert output, read through its own reader)."""

    root: str
    layout: str
    samples: Sequence[Sample]  # a list, or a dsconvert.scan_table.ScanTable on disk
    classes: Optional[List[str]] = None
    skipped: List[Skipped] = field(default_factory=list)
    ignored: List[Skipped] = field(default_factory=list)
    kind: str = "files"
    labelled: Optional[bool] = None  # container sources: (image, label) samples, or dicts
    options: Dict[str, Any] = field(default_factory=dict)  # what shaped the scan (label=...), recorded
    # each sample's place in the order its data was first converted from, when the samples come
    # in another (a shuffled dsconvert output, read in its stored order); None: this order
    positions: Optional[np.ndarray] = None  # int64
    chosen: str = ""  # container sources: what the samples are and why (the label column found, or none)

    @property
    def sample_type(self) -> str:
        """``classification`` ((image, label) samples: ImageFolder and list sources) or ``dict``."""
        if self.labelled is not None:
            return "classification" if self.labelled else "dict"
        return "classification" if self.layout in CLASSIFICATION_LAYOUTS else "dict"

    @property
    def num_files(self) -> int:
        """Input files seen: in a sample or skipped (ignored litter is not counted)."""
        in_samples = getattr(self.samples, "num_files", None)  # a scan table's sum, kept as it was written
        if in_samples is None:
            in_samples = sum(len(s.files) for s in self.samples)
        return in_samples + sum(s.count for s in self.skipped)

    @property
    def nbytes(self) -> int:
        summed = getattr(self.samples, "nbytes", None)
        return summed if summed is not None else sum(s.nbytes for s in self.samples)


Fields = Dict[str, bytes]  # a sample's fields by name (the input files' extensions), as bytes
Fetched = Union[Fields, BadInputError]  # a sample's fields as read and checked, or why they could not be
