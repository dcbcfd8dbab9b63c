"""``dsconvert verify``: is an output what its manifest says it is?

Three levels, each a superset of what the readers rely on:

1. **Files** (always): every shard listed in the manifest exists with the recorded size and
   sha256; its record (``NAME.idx``, or an older output's ``NAME.index.json``) loads, every
   column checked, and agrees with the manifest; the format's structure holds. For wds that
   means reading the tar's own headers: every indexed member is a regular file named
   ``<key>.<field>`` at the indexed offset and size, and no member has an unsafe name
   (absolute, ``..``), an unsafe type (symlink, hard link, device, FIFO) or is left out of the
   index, since `tar -x` or another reader would meet them. For npy, the samples table fits the
   pixel array; for hdf5, the datasets and attributes are there with the right lengths. Shard
   files in the folder that the manifest does not list are reported as warnings.
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
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple, Type

import numpy as np

from .errors import BadInputError, DsconvertError, ManifestError, NotRegularFileError
from .formats import FORMATS, Format, get
from .formats.base import Problem, ShardRecord, part_problems
from .io.localfs import SizeBoundedFile, open_regular, stream_sha256
from .io.location import Location, is_remote, local_form
from .keys import escape_path
from .manifest import MANIFEST_NAME, ORDER_NAME, Manifest, ShardEntry
from .processes import available_cpus, process_pool
from .shuffle import StoredPositions, order_header
from .skips import ROW_KINDS, InputSet, count_of

__all__ = ["verify", "Problem", "render_text", "VERIFY_SCHEMA", "VERIFY_VERSION", "EXIT_PROBLEMS"]

VERIFY_SCHEMA = "dsconvert.verify"
VERIFY_VERSION = 1
EXIT_PROBLEMS = 4  # the CLI's exit status when verification found problems


def _check_shard(out: Location, manifest: Manifest, entry: ShardEntry) -> Tuple[List[Problem], int,
                                                                           Optional[ShardRecord]]:
    """(problems, bytes hashed, record) for one shard."""
    fmt = get(manifest.format)
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
    index_name = fmt.record_name(entry)
    try:
        index_bytes = out.read_bytes(index_name)
        record_problems = part_problems(entry, index_name, index_bytes)
        problems += record_problems
        record = fmt.load_record(out.url_of(index_name), index_bytes)
    except FileNotFoundError:
        return problems + [Problem("record", entry.name, "its index (shard record) is missing")], size, None
    except (ManifestError, NotRegularFileError) as exc:
        return problems + [Problem("record", entry.name, str(exc))], size, None
    except OSError as exc:  # a symlink loop, a folder where the record goes, EIO...
        return problems + [Problem("record", entry.name, f"its index (shard record) is unreadable: "
                                   f"{exc.strerror or exc}")], size, None
    mismatched = [Problem("record", entry.name, f"the record's {field} {mine!r} differs from the manifest's "
                          f"{theirs!r}")
                  for field, mine, theirs in (("num_samples", record.d["num_samples"], entry.num_samples),
                                              ("bytes", record.bytes, entry.bytes),
                                              ("sha256", record.d["sha256"], entry.sha256)) if mine != theirs]
    problems += mismatched
    record_problems += mismatched
    parts: Dict[str, bytes] = {}  # the shard's other files (npy's samples table), read once
    for name in sorted(set(entry.parts) - {index_name}):
        try:
            parts[name] = out.read_bytes(name)
            problems += part_problems(entry, name, parts[name])
        except FileNotFoundError:
            problems.append(Problem("missing-file", name, "a file of the shard is missing"))
        except NotRegularFileError as exc:
            problems.append(Problem("unsafe-file", name, str(exc)))
    if record.labels is not None and manifest.classes is not None:
        bad = [v for v in record.labels if not 0 <= v < len(manifest.classes)]
        if bad:
            problems.append(Problem("record", entry.name, f"{len(bad)} label(s) outside the {len(manifest.classes)} "
                                    f"classes (first: {bad[0]})"))
    problems += _compression_problems(manifest, entry, record)
    if size == entry.bytes and not record_problems:
        # parsed only when the shard is whole and its record describes it (a truncated shard
        # has its size problem; a record that is not the manifest's says nothing of the shard)
        problems += fmt.structure_problems(out, entry, record, parts)
    return problems, size, record


def _decode_shard(out_url: str, k: int, storage_options: Dict[str, Any],
                  cache_dir: Optional[str]) -> Tuple[int, List[Tuple[str, str]]]:
    """(samples read, [(key, reason)]) for shard ``k``: every field of every sample through
    the format's own shard reader, every image decoded in full (never unpickling anything);
    pixels read back with their shapes. Runs in a worker process."""
    from PIL import Image

    from .codecs import check_field, check_image, field_kind
    from .io.shard_cache import ShardAccess

    out = Location(out_url, storage_options)
    manifest = Manifest.load(out)
    fmt = get(manifest.format)
    entry = manifest.shards[k]
    record_name = fmt.record_name(entry)
    record = fmt.load_record(out.url_of(record_name), out.read_bytes(record_name))
    failures: List[Tuple[str, str]] = []
    limit = Image.MAX_IMAGE_PIXELS
    pixels = manifest.stored == "decoded"
    try:
        shard = fmt.open_shard(ShardAccess(out_url, storage_options, cache_dir), entry, manifest)
        shard.prepare(0, entry.num_samples, prefetch=False)
    except Exception as exc:  # a reader that refuses the shard cannot read any of its samples
        return entry.num_samples, [(key, f"cannot read: {exc}") for key in record.keys]
    try:
        for j, key in enumerate(record.keys):
            try:
                fields = shard.fields(j)
            except Exception as exc:  # a reader error is what verify exists to find
                failures.append((key, f"cannot read: {exc}"))
                continue
            for name, data in fields.items():
                if pixels:
                    if getattr(data, "ndim", 0) not in (2, 3) or 0 in data.shape:
                        failures.append((key, f"pixels of shape {getattr(data, 'shape', None)}"))
                    continue
                try:
                    if field_kind(name) == "image":
                        check_image(bytes(data), limit, full=True)
                    else:
                        check_field(name, bytes(data), True, limit)
                except BadInputError as exc:
                    failures.append((key, f"{name}: {exc.reason}"))
    finally:
        shard.close()
    return entry.num_samples, failures


def _source_diff(manifest: Manifest, records: List[ShardRecord], src: str,
                 storage_options: Dict[str, Any]) -> Dict[str, Any]:
    """Missing, extra and changed source files against what the output accounts for."""
    from .source import LAYOUTS, scan

    layout = manifest.source.get("layout", "auto")
    source = scan(src, layout if layout in LAYOUTS else "auto", storage_options=storage_options,
                  label=manifest.options.get("label"))
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
    rows = manifest.source.get("layout") in ("parquet", "arrow") or source.kind in ROW_KINDS
    accounted, current = InputSet(rows), InputSet(rows)
    for p in recorded:
        accounted.add(p)
    for s in manifest.skipped:
        accounted.add(s["path"], count_of(s))
    for p in now:
        current.add(p)
    for sk in source.skipped:
        current.add(escape_path(sk.path), sk.count)
    missing = accounted.minus(current)
    extra = current.minus(accounted)
    changed = sorted(p for p, st in recorded.items() if st is not None and p in now and now[p] != st)
    # a shuffled output: each written sample's recorded source position names that sample in
    # today's scan (what ds[i] relies on), when the source is as it was
    misplaced = []
    if not (missing or extra or changed):
        # a shuffled output as the source: its places, each mapped to its sample's index (one
        # int64 a sample, not a dict of every sample's path), the sample read when asked for
        n = len(source.samples)
        given = source.positions
        at = None
        if given is not None:
            at = np.full(int(given.max()) + 1 if n else 0, -1, dtype=np.int64)
            at[given] = np.arange(n, dtype=np.int64)

        def first(place: Any) -> Optional[str]:
            if type(place) is not int or not 0 <= place < (n if at is None else len(at)):
                return None
            index = place if at is None else int(at[place])
            files = source.samples[index].files if index >= 0 else ()
            return escape_path(files[0].path) if files else None

        for record in records:
            for j, place in enumerate(record.d.get("positions") or []):
                paths = record.d["sources"][j]
                if not paths or first(place) != paths[0]:
                    misplaced.append(paths[0] if paths else f"{record.name}[{j}]")
    return {"source": os.path.abspath(src), "files": len(current), "missing": missing, "extra": extra,
            "changed": changed, "unchecked": unchecked, "misplaced": sorted(misplaced)}


class _OrderCheck:
    """A shuffled output's order file, checked in bounded memory.

    The file is read once, in chunks through one buffer (never mapped whole, never held): its
    size and sha256 against the manifest's, its header, and that it is a permutation (a bitmap,
    1 bit a sample). Then that it agrees with the source positions the shard records hold: the
    order lists the stored places by source position, i.e. it is ``argsort`` of the positions
    in stored order (so the positions read through it rise strictly). The records' positions go
    to disk as they are read (:class:`StoredPositions`, 8 bytes a sample on disk, none in
    memory), the order they imply is rebuilt from there in buckets, and its sha256 compared
    with that of the file's positions."""

    CHUNK = 1 << 20  # bytes of the order file read at once (one buffer, reused)

    def __init__(self, out: Location, manifest: Manifest):
        self.out, self.manifest = out, manifest
        self.problems: List[Problem] = []
        self.ok = False  # the file is whole and a permutation of the manifest's samples
        self.values_sha256 = ""  # the sha256 of its positions (the bytes after its header)
        self.stored: Optional[StoredPositions] = None  # the records' positions, by shard
        self.shards: List[int] = []  # the shards whose positions ``stored`` holds, in stored order
        self.positions = 0  # source positions seen in records
        self.some_positions = False
        self.mismatch = False
        self.complete = True
        if manifest.order is None:
            return
        name = ORDER_NAME
        try:
            path = out.local_path(name)
            with (open_regular(path) if path is not None else out.open(name, block_size=self.CHUNK)) as f:
                size, digest, problem = self._scan(f, out.url_of(name))
        except OSError as exc:
            self.problems.append(Problem("missing", name, f"the order file is unreadable: {exc}"))
            return
        if (size, digest) != (manifest.order["bytes"], manifest.order["sha256"]):
            self.problems.append(Problem("checksum", name, "its size or sha256 differs from the manifest's"))
            return
        if problem is not None:
            self.problems.append(Problem("structure", name, problem))
            return
        self.ok = True
        self.stored = StoredPositions()

    def _scan(self, f: Any, where: str) -> Tuple[int, str, Optional[str]]:
        """(bytes, sha256, what is wrong with it or None) of the order file ``f``, read once."""
        n = self.manifest.num_samples
        digest, values = hashlib.sha256(), hashlib.sha256()
        start = _read_upto(f, 4096)
        digest.update(start)
        size = len(start)
        try:
            offset: Optional[int] = order_header(start, n, where)
        except ManifestError as exc:
            header_problem: Optional[str] = str(exc)
            offset = None
        else:
            header_problem = None
        seen = _Bitmap(n)
        pending = start[offset:] if offset is not None else b""
        while True:
            chunk = f.read(self.CHUNK)
            if chunk:
                digest.update(chunk)
                size += len(chunk)
            if offset is not None:
                data = pending + chunk if pending else chunk
                whole = len(data) - len(data) % 8
                if whole:
                    values.update(memoryview(data)[:whole])
                    seen.add(np.frombuffer(data, dtype="<i8", count=whole // 8))
                pending = data[whole:]
            if not chunk:
                break
        self.values_sha256 = values.hexdigest()
        if header_problem is not None or offset is None:
            return size, digest.hexdigest(), header_problem
        if size != offset + 8 * n:
            return size, digest.hexdigest(), f"{where}: {size:,} bytes, not the {offset + 8 * n:,} of {n} positions"
        problem = seen.problem(where)
        return size, digest.hexdigest(), problem

    def shard(self, start: int, count: int, positions: Optional[List[int]]) -> None:
        """The source positions in the record of the shard whose ``count`` samples are stored
        from place ``start`` on ([]: none; None: the record is unreadable)."""
        if positions is None:
            self.complete = False
            return
        if not positions:
            return
        self.some_positions = True
        self.positions += len(positions)
        if self.stored is None or self.mismatch:
            return
        if len(positions) != count or start + len(positions) > self.manifest.num_samples:
            self.mismatch = True  # places unset or set twice: the positions cannot rise through the order
            return
        try:
            self.stored.add(len(self.shards), positions)
        except (OverflowError, ValueError, TypeError):  # an older JSON record's position past int64
            self.mismatch = True
            return
        self.shards.append(len(self.shards))

    def finish(self) -> List[Problem]:
        if self.manifest.order is None:
            if self.some_positions:
                return [Problem("structure", MANIFEST_NAME, "the shard records hold a shuffled order's source "
                                "positions but the manifest names no order file: reading by index would not give the "
                                "source's order")]
            return []
        if self.problems or not self.complete:
            return self.problems
        if self.mismatch or self.positions != self.manifest.num_samples or not self._rises():
            return [Problem("structure", ORDER_NAME, "does not match the source positions in the shard records")]
        return []

    def _rises(self) -> bool:
        """Whether the order file is ``argsort`` of the records' positions (distinct ones: read
        through it they rise strictly): the order they imply, rebuilt on disk, has the file's
        positions' sha256."""
        stored = self.stored
        if stored is None or not self.ok:
            return self.manifest.num_samples == 0
        if stored.largest >= 4 * stored.count + (1 << 24):
            # far sparser than any conversion writes (its buckets would span them): a hostile
            # record's, checked in memory (8 bytes a sample, this case only)
            return self._rises_in_memory()
        digest = hashlib.sha256()
        try:
            for chunk in stored.order_chunks(self.shards):
                digest.update(chunk)
        except ValueError:  # a position stored twice
            return False
        return digest.hexdigest() == self.values_sha256

    def _rises_in_memory(self) -> bool:
        stored = self.stored
        assert stored is not None
        positions = np.concatenate([stored.positions_of(k) for k in self.shards] or [np.zeros(0, np.int64)])
        if len(np.unique(positions)) != len(positions):
            return False
        order = np.argsort(positions, kind="stable").astype("<i8")
        return hashlib.sha256(order.tobytes()).hexdigest() == self.values_sha256

    def close(self) -> None:
        if self.stored is not None:
            self.stored.close()


class _Bitmap:
    """Which of the positions ``range(n)`` were seen: 1 bit each (not a byte, not a set)."""

    def __init__(self, n: int):
        self.n = n
        self.bits = np.zeros(n // 8 + 1, dtype=np.uint8)
        self.outside = False

    def add(self, v: np.ndarray) -> None:
        if not len(v) or self.outside:
            return
        if v.min() < 0 or v.max() >= self.n:
            self.outside = True
            return
        np.bitwise_or.at(self.bits, v >> 3, np.left_shift(np.uint8(1), (v & 7).astype(np.uint8)))

    def full(self, chunk: int = 1 << 20) -> bool:
        whole = self.n // 8
        for a in range(0, whole, chunk):
            if not bool((self.bits[a: min(whole, a + chunk)] == 0xFF).all()):
                return False
        return int(self.bits[whole]) == (1 << (self.n % 8)) - 1

    def problem(self, where: str) -> Optional[str]:
        """What keeps the positions seen from being a permutation of ``range(n)``, or None."""
        if self.outside:
            return f"{where}: positions outside 0..{self.n - 1}"
        if not self.full():  # n positions in range, one missing: another is repeated
            return f"{where}: not a permutation (a position is repeated)"
        return None


def _read_upto(f: Any, size: int) -> bytes:
    """Up to ``size`` bytes of ``f``: fewer only at its end."""
    parts: List[bytes] = []
    while size > 0:
        part = f.read(size)
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _check_permutation(order: np.ndarray, where: str, chunk: int = 1 << 20) -> None:
    """That ``order`` holds every position of range(len(order)) once: each marked in a bitmap
    (a repeat leaves another unmarked), read in chunks (of a mapped file: its pages read once)."""
    seen = _Bitmap(len(order))
    for a in range(0, len(order), chunk):
        seen.add(np.asarray(order[a: a + chunk], dtype=np.int64))
    problem = seen.problem(where)
    if problem is not None:
        raise ManifestError(problem, where)


def _bounded_map(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: List[Any], ahead: int) -> Iterator[Any]:
    """``pool.map`` with at most ``ahead`` results waiting: a shard's record is consumed and
    dropped before many more are read (``Executor.map`` submits everything at once)."""
    window: Deque[Any] = deque()
    for item in items:
        window.append(pool.submit(fn, item))
        if len(window) >= ahead:
            yield window.popleft().result()
    while window:
        yield window.popleft().result()


def _compression_problems(manifest: Manifest, entry: ShardEntry, record: Any) -> List[Problem]:
    """A shard record's compressed fields (``--compress``) as the manifest names them: a record
    that compresses where the manifest says nothing is, or keeps ``F.zst`` members of a field
    the manifest says is compressed without saying so, would give readers compressed bytes."""
    said = manifest.compression
    packed = record.d.get("compression")
    members = record.d.get("members") or {}
    if packed is not None and said is None:
        return [Problem("record", entry.name, "its record compresses fields the manifest does not name")]
    if said is None:
        return []
    fields = set(said.get("fields") or [])
    mine = set((packed or {}).get("fields", {}).values())
    if packed is not None and packed.get("codec") != said.get("codec") or not mine <= fields:
        codec = (packed or {}).get("codec")
        return [Problem("record", entry.name, f"its compressed fields {sorted(mine)} (codec {codec!r}) are not the "
                        f"manifest's {sorted(fields)} ({said.get('codec')!r})")]
    unsaid = sorted(m for m in members if m.endswith(".zst") and m[:-4] in fields and m[:-4] not in mine)
    if unsaid:
        return [Problem("record", entry.name, f"members {unsaid} hold compressed fields its record does not name")]
    return []


def verify(out: str, decode: bool = False, source: Optional[str] = None, workers: Optional[int] = None,
           log: Optional[Callable[[str], None]] = None,
           storage_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Verify the output at ``out`` (a path or a URL, with ``storage_options``); see the
    module doc. Returns the report (schema ``dsconvert.verify``, version 1)."""
    from .write.output import shard_files

    say = log or (lambda msg: None)
    source = local_form(source) if source is not None else None  # file:// URLs as the paths they name
    location = Location(out, storage_options)
    out = location.url
    storage_options = dict(storage_options or {})
    manifest = Manifest.load(location)
    if manifest.format not in FORMATS:
        raise ManifestError(f"{out}: format {manifest.format!r} is not one this dsconvert reads", out)
    workers = workers or available_cpus()
    started = time.perf_counter()
    problems: List[Problem] = []
    read_ok: List[bool] = []  # per shard: its record loaded
    kept: List[ShardRecord] = []  # records, only for the source comparison (which lists every file anyway)
    hashed = 0
    say(f"checking {len(manifest.shards)} shard(s) against {MANIFEST_NAME}")
    order = _OrderCheck(location, manifest)
    start = 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as threads:  # hashing releases the GIL
        def check(entry: ShardEntry) -> Tuple[List[Problem], int, Optional[ShardRecord], Optional[List[int]]]:
            """A shard checked, and of its record what is used after: its positions (the record's
            whole dict is ~1 kB a sample, 10 MB for a shard of 10,000), all of it for ``source``."""
            found, nbytes, record = _check_shard(location, manifest, entry)
            positions = None if record is None else record.d.get("positions") or []
            return found, nbytes, record if source is not None else None, positions

        checks = _bounded_map(threads, check, manifest.shards, workers + 1)
        for entry, (found, nbytes, record, positions) in zip(manifest.shards, checks):
            problems += found
            hashed += nbytes
            read_ok.append(positions is not None)
            order.shard(start, entry.num_samples, positions)
            start += entry.num_samples
            if record is not None and source is not None:
                kept.append(record)
    try:
        problems += order.finish()
    finally:
        order.close()
    hash_seconds = time.perf_counter() - started
    fmt: Type[Format] = get(manifest.format)
    listed = {n for e in manifest.shards for n in fmt.files_of(e)}
    prefix = manifest.options.get("prefix", "shard")
    pattern = re.compile(rf"^{shard_files(prefix)}$")
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
        readable = [k for k, ok in enumerate(read_ok) if ok and not any(
            p.path == manifest.shards[k].name and p.severity == "error" for p in problems)]
        failures: List[Tuple[str, str]] = []
        decoded = 0
        t = time.perf_counter()
        # formats read from local files only (memory-mapped) read remote outputs through a
        # temporary cache for the pass; the others read ranges of the remote shards
        scratch = tempfile.mkdtemp(prefix="dsconvert-verify-") if location.remote and fmt.local_only else None
        n = len(readable)
        try:
            if workers > 1 and n > 1:
                with process_pool(min(workers, n)) as pool:
                    results = list(pool.map(_decode_shard, [out] * n, readable, [storage_options] * n, [scratch] * n))
            else:
                results = [_decode_shard(out, k, storage_options, scratch) for k in readable]
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
        diff = _source_diff(manifest, kept, source, storage_options)
        report["source"] = diff
        for kind in ("missing", "extra", "changed", "misplaced"):
            for p in diff[kind]:
                problems.append(Problem(f"source-{kind}", p, {
                    "missing": "in the output's accounting, but no longer in the source",
                    "extra": "in the source, but not in the output (added since the conversion)",
                    "changed": "changed since the conversion (size or mtime differs)",
                    "misplaced": "its recorded position in the source's order names another input: reading by "
                                 "index would return it in another's place"}[kind]))
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
