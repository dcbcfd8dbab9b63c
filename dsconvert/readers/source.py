"""The source as it is, as a map-style Dataset: the baseline a conversion is measured against.

For ImageFolder and list sources a sample is ``(RGB PIL image, class index)`` in exactly
``torchvision.datasets.ImageFolder``'s order and pixels (one file opened, read and decoded
per sample), without needing torchvision. Flat sources give dicts of decoded fields, as
``open_dataset`` does for them. ``dsconvert bench SRC`` reads sources through this class.

Sources inside containers are read where they are: a tar member by one ranged read (a
compressed tar's through its decompressed stream), a sample
of a dsconvert output through its shard reader, a Parquet row from its row group (random
access decodes the row group: the cost a training job reading Parquet by index pays).

The samples are the scan's table on disk (:class:`dsconvert.scan_table.ScanTable`): a forked
DataLoader worker reads the parent's files, a spawned one opens the same files again (the
table pickles as a reference), so no worker holds a copy of the samples.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

from ..codecs import decode_field, encode_class
from ..inputs.outputs import OutputShards
from ..inputs.parquet import ParquetRows
from ..inputs.tars import OpenTar
from ..io.location import Location
from ..processes import settle_worker
from ..samples import Source, SourceFile
from .base import TorchDataset, Transforms, sample_index

__all__ = ["SourceDataset"]


class SourceDataset(Transforms, TorchDataset):
    """Map-style dataset over a scanned source; see the module doc."""

    def __init__(self, source: Source, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, decode: str = "pil",
                 storage_options: Optional[Dict[str, Any]] = None):
        super().__init__(transform, target_transform, decode, source.classes)
        self.source = source
        flush = getattr(source.samples, "flush", None)  # a scan table: written whole before workers fork or
        if flush is not None:  # reopen it (pickled as a reference to its files, never as its samples)
            flush()
        self.location = Location(source.root, storage_options, flat=False)  # remote sources: one GET per file
        self.classification = source.sample_type == "classification"
        self._fused_needs_images(self.classification)
        self._containers: Dict[str, Any] = {}  # open containers, per process (not pickled)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_containers"] = {}
        return state

    def __del__(self) -> None:
        for handle in getattr(self, "_containers", {}).values():
            close = getattr(handle, "close", None)
            if close is not None:
                close()
            elif isinstance(handle, int):
                os.close(handle)

    def __len__(self) -> int:
        return len(self.source.samples)

    def paths(self, index: int) -> List[str]:
        """The files sample ``index`` is read from (paths, or URLs for remote sources; for
        inputs inside containers, the container files)."""
        files = self.source.samples[sample_index(index, len(self.source.samples))].files
        names = list(dict.fromkeys(f.container for f in files)) if self.source.kind != "files" else \
            [f.path for f in files]
        return [p if os.path.isabs(p) else self.location.url_of(p) for p in names]

    def _read(self, f: SourceFile) -> bytes:
        """One input's bytes, from its file or its container."""
        kind = self.source.kind
        if kind == "files":
            if os.path.isabs(f.path) or not self.location.remote:
                with open(f.path if os.path.isabs(f.path) else self.location.url_of(f.path), "rb") as fh:
                    return fh.read()
            return self.location.read_bytes(f.path)
        if kind == "tar":  # one ranged read, or the decompressed stream of a compressed tar
            tar = self._containers.get(f.container)
            if tar is None:
                tar = self._containers[f.container] = OpenTar(self.location, f.container)
            return tar.read(f.offset, f.size)
        reader = self._containers.get(f.container)
        if reader is None:
            if kind == "output":
                reader = self._containers.setdefault("", OutputShards(self.source.root, self.location.storage_options))
            else:
                reader = self._containers[f.container] = ParquetRows(self.location, f.container,
                                                                     not self.classification)
        return reader.read(f)

    def __getitem__(self, index: int) -> Any:
        settle_worker()  # a DataLoader worker freezes what it inherited (dsconvert.processes), as the readers do
        sample = self.source.samples[sample_index(index, len(self.source.samples))]
        if self.classification:
            return self._finish(self._image(self._read(sample.files[0])), sample.label)
        out: Dict[str, Any] = {"__key__": sample.key}
        for file in sample.files:
            label = sample.label if file.field == "cls" and self.source.kind == "parquet" else None
            data = encode_class(label) if label is not None else self._read(file)
            out[file.field] = decode_field(file.field, data, self.decode)
        return self._finish_dict(out)
