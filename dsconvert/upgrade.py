"""``dsconvert upgrade OUT``: an output written by an earlier dsconvert, brought to today's
layout in place, without touching a shard.

What changes: shard records written as JSON (``NAME.index.json``, parsed whole by every reader
that opens the shard) are rewritten as binary records (``NAME.idx``, memory-mapped:
:mod:`dsconvert.formats.columns`), each checked against the manifest's digest before it is
trusted; then the manifest names the new records, and only then are the JSON records removed.
A kill at any point leaves an output that reads: before the manifest is replaced it names the
JSON records, after it the binary ones (the JSON records left behind are removed by the next
run). Older outputs still read without it; they just cost a parse of each record at every
open, and memory that grows with the shards a process holds open.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Callable, Dict, Optional

from .errors import ManifestError
from .formats import get
from .formats.base import part_of
from .formats.columns import RECORD_SUFFIX, encode_record
from .io.location import Location
from .io.owner import Owned, note, owner_token, temp_noter
from .manifest import Manifest

__all__ = ["upgrade", "needs_upgrade", "UPGRADE_HINT"]

UPGRADE_HINT = "dsconvert upgrade {out}"


def needs_upgrade(manifest: Manifest) -> bool:
    """Whether the output's shard records are JSON (written before binary records)."""
    return any((e.index or "").endswith(".index.json") for e in manifest.shards)


def upgrade(out: str, storage_options: Optional[Dict[str, Any]] = None,
            log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Rewrite the JSON shard records of the output at ``out`` as binary records; returns
    {"records": rewritten, "removed": JSON records removed, "bytes_before", "bytes_after"}."""
    from .write.output import output_lock

    say = log or (lambda msg: None)
    location = Location(out, storage_options)
    manifest = Manifest.load(location)
    fmt = get(manifest.format)
    lock = contextlib.nullcontext() if location.remote else output_lock(location.url)
    rewritten = before = after = 0
    old = []
    with lock:
        token = owner_token(location)
        owned = Owned(location, token)
        for entry in manifest.shards:
            name = entry.index or ""
            if name.endswith(RECORD_SUFFIX):  # upgraded; its JSON record is left if a run was killed after the manifest
                left = name[: -len(RECORD_SUFFIX)] + ".index.json"
                if location.exists(left) and owned.proves(left):  # never a file the journal does not prove ours
                    old.append(left)
                continue
            if not name.endswith(".index.json"):
                continue
            data = location.read_bytes(name)
            want = entry.parts.get(name)
            if want is not None and part_of(data) != {"bytes": want["bytes"], "sha256": want["sha256"]}:
                raise ManifestError(f"{location.url_of(name)}: its sha256 differs from the manifest's: not "
                                    "upgraded (run dsconvert verify)", location.url_of(name))
            record = fmt.load_record(location.url_of(name), data)
            binary = encode_record(record.d)
            new = name[: -len(".index.json")] + RECORD_SUFFIX
            note(location, token, new, len(binary), hashlib.sha256(binary).hexdigest())
            location.write_bytes(new, binary, before=temp_noter(location, token))
            parts = {k: v for k, v in entry.parts.items() if k != name}
            parts[new] = part_of(binary)
            entry.index, entry.parts = new, dict(sorted(parts.items()))
            old.append(name)
            rewritten += 1
            before += len(data)
            after += len(binary)
        if rewritten:
            manifest.save(location, temp_noter(location, token))  # it names the new records from here on
        for name in old:
            with contextlib.suppress(FileNotFoundError):
                location.remove(name)
    if old:
        say(f"{rewritten} shard record(s) rewritten as binary: {before:,} -> {after:,} bytes"
            + (f"; {len(old) - rewritten} left by a killed run removed" if len(old) > rewritten else ""))
    return {"records": rewritten, "removed": len(old), "bytes_before": before, "bytes_after": after}
