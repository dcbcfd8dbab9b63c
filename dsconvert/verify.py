"""``dsconvert verify``: is an output what its manifest says it is?

Three levels, each a superset of what the readers rely on:

1. **Files** (always): every shard listed in the manifest exists with the recorded size and
   sha256; its record (``NAME.index.json``) loads, every column checked, and agrees with the
   manifest; the format's structure holds. For wds that means reading the tar's own headers:
   every indexed member is a regular file named ``<key>.<field>`` at the indexed offset and
   size, and no member has an unsafe name (absolute, ``..``), an unsafe type (symlink, hard
   link, device, FIFO) or is left out of the index, since `tar -x` or another reader would meet
   them. For npy, the samples table fits the pixel array; for hdf5, the datasets and
   attributes are there with the right lengths. Shard files in the folder that the manifest
   does not list are reported as warnings.
2. **Samples** (``decode=True``): every sample is read through the format's reader and every
   image decoded in full (encoded formats; never unpickling anything), within the
   decompression-bomb limit; decoded formats' pixels are read back with their shapes.
3. **Source** (``source=SRC``): the source is scanned again and compared with what the output
   accounts for: files *missing* now, *extra* files the output does not know, and files
   *changed* since (size or mtime differs from the one recorded at conversion).

Problems are collected, never raised; the report's ``ok`` is False when any was found.
A manifest that cannot be read at all is an error (ManifestError).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import BadInputError, DsconvertError, ManifestError, NotRegularFileError
from .formats import FORMATS, writer_class
from .keys import escape_path
from .manifest import MANIFEST_NAME, Manifest, ShardEntry
from .pool import process_pool
from .remote import Location, is_remote
from .storage import SizeBoundedFile, stream_sha256
from .shards import ShardRecord

__all__ = ["verify", "Problem", "render_text", "VERIFY_SCHEMA", "VERIFY_VERSION", "EXIT_PROBLEMS"]

VERIFY_SCHEMA = "dsconvert.verify"
VERIFY_VERSION = 1
EXIT_PROBLEMS = 4  # the CLI's exit status when verification found problems


@dataclass
class Problem:
    kind: str  # missing-file, unsafe-file, size, checksum, record, structure, unsafe-member, decode, extra-file
    path: str  # the shard (or file) it is about, relative to the output
    message: str
    severity: str = "error"  # or "warning"


def _part_problems(entry: ShardEntry, name: str, data: bytes) -> List[Problem]:
    """A shard's file (its index, its samples table) against the manifest's size and sha256."""
    from .shards import part_of

    want = entry.parts.get(name)
    if want is None or part_of(data) == {"bytes": want["bytes"], "sha256": want["sha256"]}:
        return []
    return [Problem("checksum", name, f"{len(data)} bytes with another sha256 than the manifest's "
                    f"{want['bytes']} bytes, {want['sha256'][:16]}...")]


def _load_record(out: Location, fmt: str, entry: ShardEntry, data: Optional[bytes] = None) -> ShardRecord:
    name = entry.index or writer_class(fmt).index_name(entry.name)
    data = out.read_bytes(name) if data is None else data
    if fmt == "wds":
        from .formats.wds import load_record

        return load_record(out.url_of(name), data)
    return ShardRecord.load(out.url_of(name), fmt, data)


def _unsafe_name(name: str) -> bool:
    return name.startswith("/") or name.startswith("\\") or ".." in re.split(r"[/\\]", name)


def _check_tar(out: Location, name: str, record: ShardRecord) -> List[Problem]:
    """The tar's own headers against the index; unsafe members; nothing extracted."""
    problems: List[Problem] = []
    expected: Dict[str, Tuple[int, int]] = {}
    for field, col in record.d["members"].items():
        for key, offset, size in zip(record.keys, col["offset"], col["size"]):
            if offset >= 0:
                expected[f"{key}.{field}"] = (offset, size)
    seen = set()
    try:
        size = out.size(name)
        # headers only, nothing extracted; no read past the file's end, whatever a header declares
        bounded = SizeBoundedFile(raw := out.open(name), size)
        with raw, tarfile.open(fileobj=bounded, mode="r:") as tf:
            for m in tf:
                if _unsafe_name(m.name):
                    problems.append(Problem("unsafe-member", name, f"member {m.name!r} has an unsafe path "
                                            "(absolute or '..'): tar -x would write outside its folder"))
                if not m.isreg():
                    kind = ("symlink" if m.issym() else "hard link" if m.islnk() else "device" if m.isdev()
                            else "FIFO" if m.isfifo() else "directory" if m.isdir() else f"type {m.type!r}")
                    problems.append(Problem("unsafe-member", name, f"member {m.name!r} is a {kind}"
                                            + (f" to {m.linkname!r}" if m.linkname else "")))
                    continue
                want = expected.get(m.name)
                if want is None:
                    problems.append(Problem("structure", name, f"member {m.name!r} is not in the index"))
                elif want != (m.offset_data, m.size):
                    problems.append(Problem("structure", name, f"member {m.name!r} is at {m.offset_data}+{m.size}, "
                                            f"the index says {want[0]}+{want[1]}"))
                seen.add(m.name)
    except (tarfile.TarError, EOFError, OSError, ValueError, OverflowError, MemoryError) as exc:
        problems.append(Problem("structure", name, f"not a readable tar: {exc}"))
        return problems
    if bounded.overrun:
        problems.append(Problem("structure", name, f"a header declares {bounded.overrun:,} bytes more than the file "
                                "holds (not read)"))
    for missing in sorted(set(expected) - seen)[:20]:
        problems.append(Problem("structure", name, f"indexed member {missing!r} is not in the tar"))
    return problems


def _check_npy(out: Location, entry: ShardEntry, record: ShardRecord) -> List[Problem]:
    import io

    from .formats.npy import NpyWriter, load_rows, pixels_extent, rows_problem

    rows_name = NpyWriter.rows_name(entry.name)
    try:  # the .npy header (in its first 4 kB) says the pixels' length
        _, length = pixels_extent(io.BytesIO(out.read_range(entry.name, 0, 4096)), entry.bytes, entry.name)
        rows_bytes = out.read_bytes(rows_name)
        rows = load_rows(rows_bytes)
    except (OSError, ManifestError) as exc:
        return [Problem("structure", entry.name, f"not loadable as .npy: {exc}")]
    problems = _part_problems(entry, rows_name, rows_bytes)
    problem = rows_problem(rows, entry.num_samples, length)
    if problem:
        problems.append(Problem("structure", rows_name, problem))
    want = record.d.get("samples_sha256")
    if want and hashlib.sha256(rows_bytes).hexdigest() != want:
        problems.append(Problem("checksum", rows_name, "sha256 differs from the one recorded"))
    return problems


def _check_hdf5(out: Location, entry: ShardEntry) -> List[Problem]:
    from .formats.hdf5 import HDF5_ERRORS, layout_problems
    from .optional import require

    h5py = require("h5py", "verifying hdf5 shards")
    try:
        with out.open(entry.name) as raw, h5py.File(raw, "r") as f:
            return [Problem("structure", entry.name, p) for p in layout_problems(f, entry.num_samples)]
    except HDF5_ERRORS as exc:
        return [Problem("structure", entry.name, f"not a readable HDF5 file: {exc}")]


def _check_shard(out: Location, manifest: Manifest, entry: ShardEntry) -> Tuple[List[Problem], int,
                                                                           Optional[ShardRecord]]:
    """(problems, bytes hashed, record) for one shard."""
    fmt = manifest.format
    try:
        size = out.size(entry.name)
    except NotRegularFileError as exc:
        return [Problem("unsafe-file", entry.name, str(exc))], 0, None
    except OSError:
        return [Problem("missing-file", entry.name, "the shard is missing")], 0, None
    problems: List[Problem] = []
    if size != entry.bytes:
        problems.append(Problem("size", entry.name, f"{size} bytes, the manifest says {entry.bytes} (truncated or "
                                "rewritten)"))
    try:
        with out.open(entry.name, block_size=8 << 20) as f:
            digest = stream_sha256(SizeBoundedFile(f, size), 8 << 20)  # no more than it had when measured
    except NotRegularFileError as exc:  # swapped since it was measured
        return [Problem("unsafe-file", entry.name, str(exc))], 0, None
    if digest != entry.sha256:
        problems.append(Problem("checksum", entry.name, f"sha256 {digest[:16]}... differs from the manifest's "
                                f"{entry.sha256[:16]}..."))
    index_name = entry.index or writer_class(fmt).index_name(entry.name)
    try:
        index_bytes = out.read_bytes(index_name)
        problems += _part_problems(entry, index_name, index_bytes)
        record = _load_record(out, fmt, entry, index_bytes)
    except FileNotFoundError:
        return problems + [Problem("record", entry.name, "its index (shard record) is missing")], size, None
    except (ManifestError, NotRegularFileError) as exc:
        return problems + [Problem("record", entry.name, str(exc))], size, None
    for field, mine, theirs in (("num_samples", record.d["num_samples"], entry.num_samples),
                                ("bytes", record.bytes, entry.bytes), ("sha256", record.d["sha256"], entry.sha256)):
        if mine != theirs:
            problems.append(Problem("record", entry.name, f"the record's {field} {mine!r} differs from the "
                                    f"manifest's {theirs!r}"))
    if record.labels is not None and manifest.classes is not None:
        bad = [v for v in record.labels if not 0 <= v < len(manifest.classes)]
        if bad:
            problems.append(Problem("record", entry.name, f"{len(bad)} label(s) outside the {len(manifest.classes)} "
                                    f"classes (first: {bad[0]})"))
    if fmt == "wds" and not problems:
        problems += _check_tar(out, entry.name, record)
    elif fmt == "npy":
        problems += _check_npy(out, entry, record)
    elif fmt == "hdf5":
        problems += _check_hdf5(out, entry)
    return problems, size, record


def _decode_shard(out_url: str, fmt: str, k: int, storage_options: Dict[str, Any],
                  cache_dir: Optional[str]) -> Tuple[int, List[Tuple[str, str]]]:
    """(samples read, [(key, reason)]) for shard ``k``: every sample through the format's
    reader, every image decoded in full. Runs in a worker process."""
    from PIL import Image

    from .cache import ShardAccess
    from .codecs import check_field, check_image, field_kind

    out = Location(out_url, storage_options)
    manifest = Manifest.load(out)
    entry = manifest.shards[k]
    record = _load_record(out, fmt, entry)
    failures: List[Tuple[str, str]] = []
    limit = Image.MAX_IMAGE_PIXELS

    def check(key: str, name: str, data: bytes) -> None:
        try:
            if field_kind(name) == "image":
                check_image(data, limit, full=True)
            else:
                check_field(name, data, True, limit)
        except BadInputError as exc:
            failures.append((key, f"{name}: {exc.reason}"))

    if fmt == "wds":
        from .formats.wds import _OpenShard

        shard = _OpenShard(ShardAccess(out_url, storage_options), entry, 1 << 31)
        shard.open(0, entry.num_samples, prefetch=False)
        try:
            for i, key in enumerate(record.keys):
                for name, data in shard.raw_fields(i).items():
                    check(key, name, data)
        finally:
            shard.close()
        return entry.num_samples, failures
    from .data import open_dataset

    ds = open_dataset(out_url, decode="numpy" if manifest.stored == "decoded" else "raw",
                      storage_options=storage_options, cache_dir=cache_dir)
    start = sum(s.num_samples for s in manifest.shards[:k])
    image_field = next((f for f, kind in manifest.fields.items() if kind == "image"), "jpg")
    for j, key in enumerate(record.keys):
        try:
            data, _ = ds[start + j]
        except Exception as exc:  # a reader error is what verify exists to find
            failures.append((key, f"cannot read: {exc}"))
            continue
        if manifest.stored == "decoded":
            if getattr(data, "ndim", 0) not in (2, 3) or 0 in data.shape:
                failures.append((key, f"pixels of shape {getattr(data, 'shape', None)}"))
        else:
            check(key, image_field, data)
    return entry.num_samples, failures


def _source_diff(manifest: Manifest, records: List[ShardRecord], src: str,
                 storage_options: Dict[str, Any]) -> Dict[str, Any]:
    """Missing, extra and changed source files against what the output accounts for."""
    from .source import scan

    layout = manifest.source.get("layout", "auto")
    source = scan(src, layout if layout in ("imagefolder", "flat", "list") else "auto",
                  storage_options=storage_options)
    now: Dict[str, Tuple[int, int]] = {}
    for sample in source.samples:
        for f in sample.files:
            now[escape_path(f.path)] = (f.size, f.mtime_ns)
    recorded: Dict[str, Optional[Tuple[int, int]]] = {}
    unchecked = 0
    for record in records:
        stats = record.d.get("stats")
        for i, paths in enumerate(record.d["sources"]):
            for j, p in enumerate(paths):
                if stats is None:
                    recorded[p] = None
                    unchecked += 1
                else:
                    recorded[p] = tuple(stats[i][j])
    for s in manifest.skipped:
        recorded.setdefault(s["path"], None)
    current = set(now) | {escape_path(s.path) for s in source.skipped}
    missing = sorted(set(recorded) - current)
    extra = sorted(current - set(recorded))
    changed = sorted(p for p, st in recorded.items() if st is not None and p in now and now[p] != st)
    return {"source": os.path.abspath(src), "files": len(current), "missing": missing, "extra": extra,
            "changed": changed, "unchecked": unchecked}


def verify(out: str, decode: bool = False, source: Optional[str] = None, workers: Optional[int] = None,
           log: Optional[Callable[[str], None]] = None,
           storage_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Verify the output at ``out`` (a path or a URL, with ``storage_options``); see the
    module doc. Returns the report (schema ``dsconvert.verify``, version 1)."""
    from .convert import _shard_files, available_cpus

    say = log or (lambda msg: None)
    location = Location(out, storage_options)
    out = location.url
    storage_options = dict(storage_options or {})
    manifest = Manifest.load(location)
    if manifest.format not in FORMATS:
        raise ManifestError(f"{out}: format {manifest.format!r} is not one this dsconvert reads", out)
    workers = workers or available_cpus()
    started = time.perf_counter()
    problems: List[Problem] = []
    records: List[Optional[ShardRecord]] = []
    hashed = 0
    say(f"checking {len(manifest.shards)} shard(s) against {MANIFEST_NAME}")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # hashing releases the GIL
        for found, nbytes, record in pool.map(lambda e: _check_shard(location, manifest, e), manifest.shards):
            problems += found
            hashed += nbytes
            records.append(record)
    hash_seconds = time.perf_counter() - started
    listed = {n for e in manifest.shards for n in writer_class(manifest.format).files_of(e)}
    prefix = manifest.options.get("prefix", "shard")
    pattern = re.compile(rf"^{_shard_files(prefix)}$")
    for name in location.listdir():
        if pattern.match(name) and name not in listed:
            problems.append(Problem("extra-file", name, "a shard file the manifest does not list (left by "
                                    "another conversion?)", "warning"))
    report: Dict[str, Any] = {
        "schema": VERIFY_SCHEMA, "schema_version": VERIFY_VERSION, "output": out, "format": manifest.format,
        "shards": len(manifest.shards), "num_samples": manifest.num_samples, "bytes": hashed,
        "hash_seconds": hash_seconds, "decode": None, "source": None,
    }
    if decode:
        say(f"decoding every sample of {manifest.num_samples}")
        readable = [k for k, r in enumerate(records) if r is not None and not any(
            p.path == manifest.shards[k].name and p.severity == "error" for p in problems)]
        failures: List[Tuple[str, str]] = []
        decoded = 0
        t = time.perf_counter()
        # remote npy caches are memory-mapped from a local copy: a temporary cache for the pass
        scratch = tempfile.mkdtemp(prefix="dsconvert-verify-") if location.remote and manifest.format == "npy" else None
        n = len(readable)
        try:
            if workers > 1 and n > 1:
                with process_pool(min(workers, n)) as pool:
                    results = list(pool.map(_decode_shard, [out] * n, [manifest.format] * n, readable,
                                            [storage_options] * n, [scratch] * n))
            else:
                results = [_decode_shard(out, manifest.format, k, storage_options, scratch) for k in readable]
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        for n, fails in results:
            decoded += n
            failures += fails
        for key, reason in failures:
            problems.append(Problem("decode", key, reason))
        report["decode"] = {"samples": decoded, "failed": len(failures), "seconds": time.perf_counter() - t,
                            "skipped_shards": len(manifest.shards) - len(readable)}
    if source is not None:
        if not is_remote(source) and not os.path.exists(source):
            raise DsconvertError(f"source does not exist: {source}", source)
        say(f"comparing with the source {source}")
        diff = _source_diff(manifest, [r for r in records if r is not None], source, storage_options)
        report["source"] = diff
        for kind in ("missing", "extra", "changed"):
            for p in diff[kind]:
                problems.append(Problem(f"source-{kind}", p, {
                    "missing": "in the output's accounting, but no longer in the source",
                    "extra": "in the source, but not in the output (added since the conversion)",
                    "changed": "changed since the conversion (size or mtime differs)"}[kind]))
    report["problems"] = [asdict(p) for p in problems]
    report["errors"] = sum(p.severity == "error" for p in problems)
    report["warnings"] = sum(p.severity == "warning" for p in problems)
    report["ok"] = report["errors"] == 0
    report["seconds"] = time.perf_counter() - started
    return report


def render_text(report: Dict[str, Any], limit: int = 20) -> str:
    from .sizing import format_size

    lines = [f"dsconvert verify {report['output']}: {report['format']}, {report['shards']} shard(s), "
             f"{report['num_samples']:,} samples"]
    rate = report["bytes"] / report["hash_seconds"] / 1e6 if report["hash_seconds"] else 0.0
    checks = sum(p["kind"] in ("missing-file", "unsafe-file", "size", "checksum", "record") for p in report["problems"])
    lines.append(f"  files:     {format_size(report['bytes'])} hashed ({rate:,.0f} MB/s); "
                 + ("sizes, checksums and records match the manifest" if not checks else f"{checks} problem(s)"))
    structure = sum(p["kind"] in ("structure", "unsafe-member") for p in report["problems"])
    lines.append(f"  structure: {'as the index says' if not structure else f'{structure} problem(s)'}")
    if report["decode"] is not None:
        d = report["decode"]
        lines.append(f"  decode:    {d['samples']:,} samples read, {d['failed']} failed"
                     + (f", {d['skipped_shards']} damaged shard(s) not read" if d["skipped_shards"] else ""))
    if report["source"] is not None:
        s = report["source"]
        lines.append(f"  source:    {s['source']}: {len(s['missing'])} missing, {len(s['extra'])} extra, "
                     f"{len(s['changed'])} changed of {s['files']:,} files"
                     + (f" ({s['unchecked']} written by an older dsconvert without stats: change not checked)"
                        if s["unchecked"] else ""))
    for p in report["problems"][:limit]:
        lines.append(f"  {p['severity']}: {p['kind']}: {p['path']}: {p['message']}")
    if len(report["problems"]) > limit:
        lines.append(f"  ... {len(report['problems']) - limit} more (--json lists them all)")
    lines.append("OK" if report["ok"] else f"FAILED: {report['errors']} problem(s)")
    return "\n".join(lines)
