"""The ``dsconvert shard`` fix command, built in one place for every command that suggests it.

``dsconvert analyze`` (from measurements) and ``dsconvert diagnose`` (from a training job's
stacks) both end in the same advice: convert the data with ``dsconvert shard``. They build
that line here, so the same situation gets the same flags in the same order::

    dsconvert shard SRC --format FMT [--label LABEL] -o OUT [--option VALUE ...]   # comment

Paths are quoted for the shell (spaces and all), options are spelled as the CLI spells them
(``max_size`` -> ``--max-size``), and the output is named after the source: ``<name>-<fmt>``
in the output folder, by default beside the source. A list file (``train.csv``) names its
outputs without the suffix (``train-npy``).

Pure string functions of the standard library only: a ground-floor module that analyze and
diagnose may both import.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Mapping, Optional

__all__ = ["LIST_SUFFIXES", "source_stem", "output_for", "shard_command"]

LIST_SUFFIXES = (".csv", ".tsv", ".jsonl", ".txt")  # sources that are lists of files, not folders


def source_stem(source: str) -> str:
    """The source without trailing slashes, and without the suffix of a list file: what its
    outputs are named after (``/data/train.csv`` -> ``/data/train``)."""
    stem = source.rstrip("/")
    if stem.lower().endswith(LIST_SUFFIXES):
        stem = posixpath.splitext(stem)[0]
    return stem


def output_for(source: str, fmt: str, output_dir: Optional[str] = None) -> str:
    """Where a suggested conversion of ``source`` into ``fmt`` writes: ``<name>-<fmt>`` in
    ``output_dir``, or beside the source when that is None (``/data/train`` -> ``/data/train-wds``;
    the root folder's outputs are ``/data-<fmt>``)."""
    stem = source_stem(source)
    name = posixpath.basename(stem)
    if output_dir is not None:
        return posixpath.join(output_dir, f"{name or 'data'}-{fmt}")
    if name:
        return f"{stem}-{fmt}"
    return posixpath.join(stem or "/", f"data-{fmt}")


def shard_command(source: str, fmt: str, output: Optional[str] = None, *, label: Optional[str] = None,
                  options: Optional[Mapping[str, object]] = None, comment: Optional[str] = None,
                  output_dir: Optional[str] = None) -> str:
    """The ``dsconvert shard`` command line converting ``source`` into ``fmt``.

    Args:
        source: the dataset as the user named it (a folder, a list file, a URL).
        fmt: the output format id (``wds``, ``hdf5``, ``npy``).
        output: where the output goes; by default :func:`output_for` of ``source`` in ``output_dir``.
        label: the ``--label`` of tar shards and Parquet sources, if any.
        options: further options in order, by their Python names (``{"resize": 256}``).
        comment: a shell comment after the command (what it does, what to run next).
        output_dir: the folder :func:`output_for` names the output in (None: beside the source).

    Returns:
        One shell line; ``shlex.split(line, comments=True)`` gives back the arguments.
    """
    q = shlex.quote
    out = output if output is not None else output_for(source, fmt, output_dir)
    line = f"dsconvert shard {q(source)} --format {fmt}"
    if label:
        line += f" --label {q(label)}"
    line += f" -o {q(out)}"
    for key, value in (options or {}).items():
        line += f" --{key.replace('_', '-')} {q(str(value))}"
    if comment:
        line += f"   # {comment}"
    return line
