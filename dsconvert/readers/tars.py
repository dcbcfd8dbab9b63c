"""Tar shards that another tool wrote, read directly by :func:`dsconvert.open_dataset`: the
indexes the scan made (:mod:`dsconvert.source.tars`) stand in for a manifest and shard records,
so the same wds shard reader that reads dsconvert's own shards reads them."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..codecs import is_image_field
from ..errors import BadInputError, ManifestError, SourceError
from ..formats.base import part_of
from ..io.localfs import check_name, open_regular
from ..io.location import json_bytes
from ..io.shard_cache import ShardAccess
from ..manifest import Manifest, ShardEntry
from ..source.tars import TarShards, check_label_field, label_index, list_tars, read_bounded

__all__ = ["TarAccess", "open_tars"]


class TarAccess(ShardAccess):
    """Shard access for tars without a manifest: their indexes come from the index folder
    (with labels and image columns filled in for ``label``), a cached copy is checked by size."""

    # members are named as their tar's writer chose (./a/B.JPG): an index's key.field (its field
    # lower-cased, as webdataset does) is not their name, so a read checks their header's size only
    own_names = False

    def __init__(self, root: str, storage_options: Optional[Dict[str, Any]], cache_dir: Optional[str],
                 cache_size: Any, index_dir: str, label: Optional[str], classes: Optional[List[str]],
                 keep: Dict[str, Any], unsaved: Optional[Dict[str, bytes]] = None):
        super().__init__(root, storage_options, cache_dir, cache_size)
        self.index_dir = index_dir
        self.label = label
        self.classes = classes
        # per tar, the samples read (those with a label and an image, for ``label``): a range, or an
        # int64 array, never a list of ints (the access is pickled into every DataLoader worker)
        self.keep = keep
        self.unsaved = dict(unsaved or {})  # by index name: indexes open_tars could not save
        self.compressed = False  # set by open_tars where any tar is compressed

    def file_bytes(self, name: str, part: Optional[Dict[str, Any]] = None, refresh: bool = False) -> bytes:
        """The index of tar ``name[:-5]`` as open_tars validated it: ``part`` (the manifest's
        {bytes, sha256} of it, taken at open) checked at every read, since the file may have
        been rewritten, emptied or removed since."""
        tar = name[: -len(".json")]
        path = os.path.join(self.index_dir, check_name(name, self.index_dir))
        if part is None:
            raise ManifestError(f"{path}: no digest of the index of {tar} was taken when the tars were opened", path)
        data = self.unsaved.get(name)
        if data is None:
            try:
                with open_regular(path) as f:
                    data = read_bounded(f, int(part["bytes"]))
            except OSError as exc:
                raise ManifestError(f"{path}: the index of {tar} is unreadable since the dataset was opened "
                                    f"({exc.strerror or exc}); open the dataset again", path) from None
        if data is None or part_of(data) != {"bytes": part["bytes"], "sha256": part["sha256"]}:
            raise ManifestError(f"{path}: the index of {tar} changed since the dataset was opened (another "
                                "--label, or edited); open the dataset again", path)
        if self.label is None:
            return data
        d = json.loads(data)
        keep = self.keep[tar].tolist() if isinstance(self.keep[tar], np.ndarray) else self.keep[tar]
        values = d["label_values"][self.label]
        d["keys"] = [d["keys"][j] for j in keep]
        d["labels"] = [label_index(values[j], self.classes) for j in keep]
        d["sources"] = [[] for _ in keep]
        d["num_samples"] = len(keep)
        d["members"] = {f: {"offset": [c["offset"][j] for j in keep], "size": [c["size"][j] for j in keep]}
                        for f, c in d["members"].items() if is_image_field(f)}
        return json_bytes(d)

    def mapped_file(self, name: str, part: Optional[Dict[str, Any]] = None) -> Any:
        """Indexes of foreign tars are JSON in the index folder, checked at every read."""
        return self.file_bytes(name, part)

    def local_shard(self, entry: ShardEntry) -> Optional[str]:
        if self.cache is None:
            return super().local_shard(entry)
        path = self.cache.get(self.url_of(entry.name), None, entry.bytes)
        if os.path.getsize(path) != entry.bytes:  # a copy of an earlier version of the tar
            path = self.cache.get(self.url_of(entry.name), None, entry.bytes, refresh=True)
        return path


def open_tars(path: str, storage_options: Optional[Dict[str, Any]] = None, cache_dir: Optional[str] = None,
              cache_size: Any = None, label: Optional[str] = None,
              index_dir: Optional[str] = None) -> Tuple[Manifest, TarAccess]:
    """A manifest and shard access for tars another tool wrote (see the module doc), for
    :func:`dsconvert.open_dataset`: dict samples as ``webdataset.WebDataset`` gives them, or
    with ``label`` (image, label) samples; samples without a label or an image are left out,
    and said in one warning."""
    location, names, skipped, _ = list_tars(path, storage_options)
    shards = TarShards(location, names, label, index_dir)
    skipped += shards.failed
    check_label_field(shards, path)
    classes = shards.classes()
    entries: List[ShardEntry] = []
    keep: Dict[str, Any] = {}
    fields: Dict[str, str] = {}
    left_out = 0
    for name in shards.names:
        summary = shards.summaries[name]
        if label is None:
            keep[name] = range(summary.num_samples)  # O(1), pickled into every worker
            fields.update(summary.fields)
        else:
            record = shards.record(name)  # one tar's at a time
            members = record["members"]
            values = shards.labels_of(record)
            images = {f: c for f, c in members.items() if is_image_field(f)}
            keep[name] = np.array([j for j in range(record["num_samples"])
                                   if not isinstance(label_index(values[j], classes), BadInputError)
                                   and any(c["offset"][j] >= 0 for c in images.values())], dtype=np.int64)
            left_out += summary.num_samples - len(keep[name])
            fields.update({f: "image" for f in images})
            del record, members, values
        entries.append(ShardEntry(name, len(keep[name]), summary.bytes, summary.sha256, name + ".json",
                                  {name + ".json": shards.parts[name]}))
        skipped += summary.skipped
    if not entries:
        raise SourceError(f"no readable .tar shards in {path}" + (f" ({skipped[0].path}: {skipped[0].reason})"
                                                                 if skipped else ""), path)
    if label is not None:
        fields["cls"] = "class"
    if left_out or skipped:
        warnings.warn(f"{path}: {left_out + len(skipped):,} sample(s) or member(s) not read"
                      + (f" ({left_out:,} without a label or an image)" if left_out else "")
                      + (f"; first: {skipped[0].path}: {skipped[0].reason}" if skipped else ""), stacklevel=3)
    manifest = Manifest(format="wds", source={"url": location.url, "layout": "tars"},
                        sample_type="classification" if label is not None else "dict", classes=classes,
                        fields=dict(sorted(fields.items())), num_samples=sum(e.num_samples for e in entries),
                        shards=entries, skipped=[{"path": s.path, "reason": s.reason} for s in skipped])
    access = TarAccess(location.url, storage_options, cache_dir, cache_size, shards.index_dir, label, classes, keep,
                       {n + ".json": data for n, data in shards.unsaved.items() if n in keep})
    access.compressed = any(shards.summaries[n].compressed for n in shards.names)
    return manifest, access
