"""Shard records as the tests read and tamper with them: the JSON form's dict, whatever the
file holds (binary columns, ``NAME.idx``, or an older output's ``NAME.index.json``).

``write_record`` writes a dict back in the file's own form; values a binary column cannot hold
(a string among offsets, a list where an object belongs) go into the binary record's header as
they are, which is what a hostile file could hold too (its readers must refuse them)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict

from dsconvert.formats.columns import MAGIC, PER_SAMPLE, Columns, encode_record, is_binary


def record_path(out: str, shard: str) -> str:
    """The record file of shard ``shard`` (its name in the manifest) of output ``out``."""
    manifest = json.load(open(os.path.join(out, "dsconvert.json")))
    entry = next(s for s in manifest["shards"] if s["name"] == shard)
    return os.path.join(out, entry["index"])


def read_record(path: str) -> Dict[str, Any]:
    data = open(path, "rb").read()
    return Columns(data, path).to_dict() if is_binary(data) else json.loads(data)


def write_record(path: str, d: Dict[str, Any]) -> None:
    if path.endswith(".json"):
        json.dump(d, open(path, "w"))
        return
    try:
        data = encode_record(d)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
        data = _with_raw_header(d)
    with open(path, "wb") as f:
        f.write(data)


def _with_raw_header(d: Dict[str, Any]) -> bytes:
    """A binary record whose header holds ``d`` whole (per-sample entries included, unencoded)."""
    header = json.dumps({"record": d, "columns": {}}).encode()
    return MAGIC + len(header).to_bytes(8, "little") + header


__all__ = ["record_path", "read_record", "write_record", "PER_SAMPLE"]
