"""Reading the inputs a scan found: each sample of a shard spec with its fields read and checked,
or the error naming its bad file. The read side of a conversion (which hands what it reads to
a format's ``write_shard``), kept apart from the scanner (:mod:`dsconvert.source`, which reads
no contents) and from the Datasets (:mod:`dsconvert.readers`, which read outputs).

``files.py``    input files, local or remote
``tars.py``     members of tar shards another tool wrote
``parquet.py``  rows of Parquet files
``outputs.py``  samples of a dsconvert output, through its own shard reader
``check.py``    what every reader does with the bytes it read
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, Tuple

from ..plan import ShardSpec
from ..samples import Fetched, Sample
from .check import Check, checked
from .files import read_file_samples
from .outputs import read_output_samples
from .parquet import read_parquet_samples
from .tars import read_tar_samples

__all__ = ["read_samples", "checked", "READERS"]

Reader = Callable[[ShardSpec, Check], Iterator[Tuple[Sample, Fetched]]]

# how the inputs of a source of each kind (Source.kind, ShardSpec.source_kind) are read
READERS: Dict[str, Reader] = {
    "files": read_file_samples,
    "tar": read_tar_samples,
    "parquet": read_parquet_samples,
    "output": read_output_samples,
}


def read_samples(spec: ShardSpec) -> Iterator[Tuple[Sample, Fetched]]:
    """Each sample of the spec with its checked fields, or the BadInputError naming its bad
    file, read by its source kind's reader (not always in the spec's order: a reader yields
    the spec's own sample objects)."""
    reader = READERS.get(spec.source_kind)
    if reader is None:
        raise ValueError(f"no reader for sources of kind {spec.source_kind!r}")
    return reader(spec, checked)
