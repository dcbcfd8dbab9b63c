"""Shard records as the tests read and tamper with them: the JSON form's dict, whatever the
file holds (binary columns, ``NAME.idx``, or an older output's ``NAME.index.json``).

``write_record`` writes a dict back in the file's own form; values a binary column cannot hold
(a string among offsets, a list where an object belongs) go into the binary record's header as
they are, which is what a hostile file could hold too (its readers must refuse them)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict

from dsconvert.formats.columns import (
    MAGIC,
    PER_SAMPLE,
    RECORD_SUFFIX,
    Columns,
    encode_record,
    is_binary,
)
from dsconvert.io.location import json_bytes


def record_path(out: str, shard: str) -> str:
    """The record file of shard ``shard`` (its name in the manifest) of output ``out``."""
    manifest = json.load(open(os.path.join(out, "dsconvert.json")))
    entry = next(s for s in manifest["shards"] if s["name"] == shard)
    return os.path.join(out, entry["index"])


def read_record(path: str) -> Dict[str, Any]:
    return read_record_bytes(open(path, "rb").read(), path)


def read_record_bytes(data: bytes, where: str = "record") -> Dict[str, Any]:
    """A record's dict from its bytes (an object store's copy, say)."""
    return Columns(data, where).to_dict() if is_binary(data) else json.loads(data)


def write_record(path: str, d: Dict[str, Any]) -> None:
    if path.endswith(".json"):
        json.dump(d, open(path, "w"))
        return
    try:
        data = encode_record(d)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError):
        data = _with_raw_header(d)
    with open(path, "wb") as f:
        f.write(data)


def to_json_records(out: str) -> None:
    """Rewrite output ``out`` as the previous release wrote it: each shard's record as JSON,
    ``NAME.index.json`` (the binary ``NAME.idx`` removed), the manifest's ``index`` and
    ``parts`` entries naming and digesting the JSON file."""
    path = os.path.join(out, "dsconvert.json")
    manifest = json.load(open(path))
    for shard in manifest["shards"]:
        old = shard["index"]
        if not old.endswith(RECORD_SUFFIX):
            continue
        new = old[: -len(RECORD_SUFFIX)] + ".index.json"
        data = json_bytes(read_record(os.path.join(out, old)))
        with open(os.path.join(out, new), "wb") as f:
            f.write(data)
        os.remove(os.path.join(out, old))
        shard["index"] = new
        parts = shard.get("parts", {})
        parts.pop(old, None)
        parts[new] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        shard["parts"] = dict(sorted(parts.items()))
    json.dump(manifest, open(path, "w"))


def _with_raw_header(d: Any) -> bytes:
    """A binary record of ``d`` whose per-sample entries that no column can hold are in its
    header as they are (the others in columns), so that a reader's refusal can name them;
    where even that cannot be encoded (its shard-level fields are what is broken, or ``d`` is
    no dict), a header that holds ``d`` whole and no columns."""
    try:
        return _some_in_header(d)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError):
        header = json.dumps({"record": d, "columns": {}}).encode()
        return MAGIC + len(header).to_bytes(8, "little") + header


def _some_in_header(d: Dict[str, Any]) -> bytes:
    raw = {k: d[k] for k in PER_SAMPLE if k in d and not _encodes({**_bare(d), k: d[k]})}
    rest = {k: v for k, v in d.items() if k not in raw}
    if "keys" in raw:
        rest["keys"] = _bare(d)["keys"]  # placeholders: the header's keys are what a reader must refuse
    if not _encodes(rest):  # they fail only together: the header holds every per-sample entry
        raw = {k: d[k] for k in PER_SAMPLE if k in d}
        rest = {**_bare(d), "keys": []}
    data = encode_record(rest)
    h = int.from_bytes(data[8:16], "little")
    head = json.loads(data[16:16 + h])
    head["record"].update(raw)
    header = json.dumps(head).encode()
    header += b" " * (-(len(MAGIC) + 8 + len(header)) % 8)
    return MAGIC + len(header).to_bytes(8, "little") + header + data[16 + h:]


def _bare(d: Dict[str, Any]) -> Dict[str, Any]:
    """``d`` with its keys and none of its other per-sample entries."""
    keys = d.get("keys")
    ok = isinstance(keys, list) and all(isinstance(k, str) for k in keys)
    return {**{k: v for k, v in d.items() if k not in PER_SAMPLE}, "keys": keys if ok else [""] * len(keys or [])}


def _encodes(d: Dict[str, Any]) -> bool:
    try:
        encode_record(d)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError):
        return False
    return True


__all__ = ["record_path", "read_record", "read_record_bytes", "write_record", "to_json_records", "PER_SAMPLE"]
