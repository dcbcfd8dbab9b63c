"""Conversion: scan, plan shards, write them on an executor, resume, write the manifest.

Conversion is a map of a pure function (:class:`ShardSpec` -> :class:`ShardResult`) over a
``concurrent.futures.Executor``: a process pool by default, in-process for one worker, or
any executor the caller passes (``dask.distributed.Client.get_executor()``, say). Each shard
is written under a temporary name and renamed; its index, written after, marks it done. A
killed run, started again with the same arguments, keeps every finished shard whose spec is
unchanged and writes the rest, so no sample is lost or duplicated. The manifest comes last.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import errno
import os
import pickle
import re
import stat
import sys
import tempfile
import time
from array import array
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Type, Union

import numpy as np

from . import skips
from .codecs import (
    compression_label,
    parse_compression,
    pixel_limit,
    require_codec,
    resolve_decoder,
    resolve_resampler,
)
from .errors import (
    BadInputError,
    DsconvertError,
    InsufficientSpaceError,
    OptionError,
    OutputExistsError,
    OutputLockedError,
    SourceError,
)
from .formats import FORMATS, Format, get
from .inputs import read_samples
from .io.localfs import free_bytes, mount_of
from .io.location import Location, is_remote, local_form
from .io.locks import file_lock
from .io.owner import LOCK_NAME, OWNER_NAME, Owned, owner_token, temp_noter
from .keys import escape_path
from .manifest import MANIFEST_NAME, ORDER_NAME, Manifest
from .plan import (
    CHANGED_DURING,
    MAX_SAMPLE_BYTES,
    MIN_SHARDS,
    ShardResult,
    ShardSpec,
    over_limit,
    parse_size,
    spread_plan,
)
from .processes import available_cpus, process_pool
from .progress import progress_bar
from .reencode import DEFAULT_QUALITY
from .samples import LAYOUTS, Skipped, Source
from .scan_table import Reordered, ScanTable, SpilledInts
from .shuffle import ORDERS, StoredPositions, shuffled_order
from .sizing import SizeEstimate, estimate_output_bytes, format_size
from .source import scan
from .source.arrow import dataset_folder
from .version import __version__

__all__ = ["convert", "ConvertResult", "write_shard", "EXIT_SKIPPED", "accepts",
           # the output handling dsconvert.writer shares
           "output_lock", "claim_output", "remove_previous", "remove_stale", "refuse_foreign",
           "out_of_space_is_resumable", "raise_worker_cause", "build_manifest"]

EXIT_SKIPPED = 3  # the CLI's exit status when the conversion finished but skipped inputs


@dataclass
class ConvertResult:
    manifest: Manifest
    out_dir: str
    already_complete: bool = False
    shards_written: int = 0
    shards_resumed: int = 0
    seconds: float = 0.0
    workers: int = 0  # local writer processes (0: another executor, or nothing was written)

    @property
    def idle_workers(self) -> int:
        """Workers the plan left without a shard (fewer shards than workers)."""
        return max(0, self.workers - len(self.manifest.shards)) if not self.already_complete else 0


@contextlib.contextmanager
def output_lock(out_dir: str) -> Iterator[None]:
    """An exclusive lock on OUT/.dsconvert.lock: two conversions (or Writers) never share an
    output, in two processes or in one. A process lock (:func:`dsconvert.io.locks.file_lock`),
    so a killed conversion's lock dies with its main process, whatever its pool workers do;
    taken on the folder's resolved path and held by the lock file's identity, so that another
    spelling of the folder (a symlink to it) is the same lock."""
    path = os.path.join(os.path.realpath(out_dir), LOCK_NAME)
    check_control_files(out_dir)
    with contextlib.ExitStack() as stack:
        try:
            got = stack.enter_context(file_lock(path, wait=False, process=True))
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # a link put there since the check
                raise
            raise _linked_control_file(out_dir, LOCK_NAME) from None
        if not got:
            raise OutputLockedError(f"another dsconvert process (or another conversion or Writer in this one) "
                                    f"is writing into {out_dir}", path)
        yield


def _linked_control_file(out_dir: str, name: str) -> OutputExistsError:
    path = os.path.join(out_dir, name)
    return OutputExistsError(
        f"{path} is a symbolic link or not a regular file: dsconvert never follows its control files (lock, owner "
        f"journal), and a folder copied with links (cp -rs) is not an output of its own; remove {name} from "
        f"{out_dir} (and any other linked control file), or choose another folder", path)


def check_control_files(out_dir: str) -> None:
    """A local output whose lock file or owner journal is a link (or anything but a regular
    file) is refused: appending to it, or creating it, would write where the link points,
    outside the output (another output's journal, a file anywhere)."""
    for name in (LOCK_NAME, OWNER_NAME):
        try:
            st = os.lstat(os.path.join(out_dir, name))
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise _linked_control_file(out_dir, name)


def claim_output(out: Location, overwrite: bool) -> None:
    """Refuse to write into a folder that holds files dsconvert did not write, unless
    ``overwrite``; then mark the folder as a dsconvert output (the lock file, kept after the
    run). Without this, a user's ``shard-000007.tar`` (webdataset's own naming) would be
    removed as a stale shard of an earlier plan."""
    # one listing, not an exists() check then a listing: a conversion started a moment earlier
    # makes its lock file (before any other) in between, and was taken for a foreign file
    if not out.remote:
        check_control_files(out.url)
    present = out.listdir()
    if MANIFEST_NAME in present or LOCK_NAME in present or OWNER_NAME in present:
        return
    if present and not overwrite:
        shown = ", ".join(repr(n) for n in present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        raise OutputExistsError(
            f"{out.url} is not empty and is not a dsconvert output (it holds {shown}); choose a new or empty "
            "folder, or pass --overwrite to write into it (files named like dsconvert's shards are then replaced)",
            out.url)
    if out.remote:
        with out.write(LOCK_NAME) as f:  # object stores have no lock: the object marks the output as ours
            f.write(b"")


def _shaping_options(**options: Any) -> Dict[str, Any]:
    """The options that decide the output's bytes; a rerun with others must not reuse it."""
    return dict(sorted(options.items()))


def _check_paths(src: str, out: str) -> None:
    if is_remote(src) or is_remote(out):
        if src.rstrip("/") == out.rstrip("/") or out.startswith(src.rstrip("/") + "/"):
            raise DsconvertError(f"the output {out} is inside the source {src}; choose another folder", out)
        return
    src_real, out_real = os.path.realpath(src), os.path.realpath(out)
    if os.path.isdir(src_real) and (out_real == src_real or out_real.startswith(src_real + os.sep)):
        raise DsconvertError(f"the output {out} is inside the source {src}; choose another folder", out)


def remove_previous(out: Location, manifest: Manifest) -> None:
    """Remove a finished output's manifest (first), order file and every shard file it lists."""
    out.remove(MANIFEST_NAME)  # first: the output is unfinished from here on
    if manifest.order is not None:
        out.remove(ORDER_NAME)
    fmt = get(manifest.format)
    for entry in manifest.shards:
        for name in fmt.files_of(entry):
            out.remove(name)


def _shard_files(prefix: str) -> str:
    """The pattern of the files a conversion writes per shard: PREFIX-NNNNNN.<suffixes>."""
    return rf"{re.escape(prefix)}-\d{{6}}\.[a-z0-9.]+"


def remove_stale(out: Location, prefix: str, keep: set, owned: Owned) -> None:
    """Remove our shards and indexes that the current plan does not contain, and temp files
    left by killed writers (``.NAME.RANDOM.tmp``, see :func:`dsconvert.io.localfs.atomic_write`).
    Only files the owner journal proves ours: a user's file named like a shard, or like a
    temporary file, stays."""
    stale = re.compile(rf"^{_shard_files(prefix)}$")
    for name in out.listdir():
        if owned.proves_temp(name) or (stale.match(name) and name not in keep and owned.proves(name)):
            out.remove(name)


def _adopt(owned: Owned, manifest: Manifest) -> None:
    """Note a finished output's files as ours before its manifest goes (an output written
    before the owner journal existed has no other proof of them)."""
    for entry in manifest.shards:
        owned.add(entry.name, entry.bytes, entry.sha256)
        for name, part in entry.parts.items():
            owned.add(name, part["bytes"], part["sha256"])


def refuse_foreign(out: Location, fmt: Type[Format], todo: List[ShardSpec], owned: Owned) -> None:
    """Before any shard is written: a file already where a planned one goes must be one this
    output wrote (a kill's leftover), else the conversion stops rather than replace it."""
    present = set(out.listdir())
    for spec in todo:
        for name in fmt.planned_files(spec.name):
            if name in present and not owned.proves(name):
                raise OutputExistsError(
                    f"{out.url_of(name)} is not a file this conversion wrote, and shard {spec.index} goes there: "
                    "move it away (or pass --overwrite to replace it) and run the same command again",
                    out.url_of(name))


def _make_specs(source: Source, fmt: Type[Format], out: Location, prefix: str, samples_per_shard: int,
                shard_bytes: int, min_shards: int, verify: bool, strict: bool, max_image_pixels: Optional[int],
                format_options: Dict[str, Any], bytes_ratio: float,
                storage_options: Dict[str, Any], positions: Any = None,
                owner: str = "") -> _LazySpecs:
    """Plan shards: the specs, each made when asked for (it holds only its own samples);
    ``bytes_ratio`` scales source bytes to output bytes (decoded pixels);
    ``positions``: the samples' stored order, as source positions (an array or
    :class:`SpilledInts`; None: the source's), each
    then recorded as the sample's place in the original order (``source.positions`` maps it
    further, for a source that is itself a shuffled output)."""
    sample_type = source.sample_type
    classification = sample_type == "classification"
    compressed = bool(format_options.get("compress"))
    samples = source.samples if positions is None else Reordered(source.samples, positions)
    if source.positions is not None:  # the original order's places, carried through
        given = np.asarray(source.positions, dtype=np.int64)
        positions = given if positions is None else given[np.asarray(positions[0:len(positions)])]
    ranges = spread_plan(samples, samples_per_shard, max(1, shard_bytes - fmt.overhead), min_shards,
                         size_of=lambda s: int(fmt.sample_bytes(s, classification, compressed) * bytes_ratio))

    def make(i: int) -> ShardSpec:
        a, b = ranges[i]
        return ShardSpec(fmt.id, i, fmt.shard_name(prefix, i), source.root, out.url, sample_type,
                         tuple(samples[a:b]), verify, max_image_pixels, strict, format_options, storage_options,
                         source.kind, tuple(positions[a:b].tolist()) if positions is not None else (), owner)

    return _LazySpecs([fmt.shard_name(prefix, i) for i in range(len(ranges))], make)


SHUFFLABLE_KINDS = ("files", "tar")  # sources read in any order at no extra cost (a file, a member)


def resolve_order(order: str, fmt: Type[Format], source: Source) -> str:
    """``shuffled`` or ``source``. ``auto`` shuffles labelled samples written into an iterable
    format (wds): a streaming read mixes classes only as well as the stored order does, and an
    ImageFolder source is sorted by class. Map-style formats (hdf5, npy) keep the source's order:
    their reader's sampler shuffles globally, and a source-ordered file reads sequentially.
    Parquet and dsconvert-output sources are read row group by row group, so a shuffled
    order would read each many times: they keep theirs."""
    if order == "source":
        return "source"
    if source.kind not in SHUFFLABLE_KINDS:
        if order == "shuffled":
            raise OptionError(f"--order shuffled reads inputs in a random order, and {source.kind} sources are "
                              "read in row groups (each would be read many times): use --order source")
        return "source"
    if order == "shuffled":
        return "shuffled"
    return "shuffled" if fmt.iterable and source.sample_type == "classification" else "source"


def _check_space(out_dir: str, prefix: str, needed: SizeEstimate, fmt: Type[Format]) -> None:
    """Refuse to start when the output cannot fit (shards already there count as written)."""
    shard = re.compile(rf"^{_shard_files(prefix)}$")
    present = sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir) if shard.match(n))
    free = free_bytes(out_dir)
    if needed.bytes - present > free:
        hint = " (--resize SHORT or --size HxW shrinks decoded caches)" if fmt.pixels != "never" else ""
        raise InsufficientSpaceError(
            f"the {fmt.id} output needs {needed.describe()} but {mount_of(out_dir)[0]} has "
            f"{format_size(free)} free; free some room, choose another --output{hint}, or pass --force",
            out_dir,
        )


_NO_SPACE_TEXT = re.compile(rf"No space left on device|Disk quota exceeded|errno = ({errno.ENOSPC}|{errno.EDQUOT})\b")


def _is_out_of_space(exc: BaseException) -> bool:
    """ENOSPC or EDQUOT. h5py reports them as an OSError without errno, or (when a flush or
    close fails) as a RuntimeError, with libhdf5's text ``errno = 28`` in the message."""
    if isinstance(exc, DsconvertError) or not isinstance(exc, (OSError, RuntimeError)):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return _NO_SPACE_TEXT.search(str(exc)) is not None


@contextlib.contextmanager
def out_of_space_is_resumable(out: Location) -> Iterator[None]:
    """A full disk mid-run is one clear error: what was written is complete (shards are
    renamed into place only when whole), and the same command resumes once there is room."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if not _is_out_of_space(exc):
            raise
        local = tempfile.gettempdir() if out.remote else out.url  # remote shards are staged locally
        point = mount_of(local)[0]
        raise InsufficientSpaceError(
            f"no space left on {point} ({format_size(free_bytes(local))} free) while writing {out.url}: "
            "finished shards are kept; free some room (or choose another --output) and run the same "
            "command again to resume", out.url) from None


def _run(specs: Sequence[ShardSpec], workers: int, executor: Optional[cf.Executor], bar,
         owned: Optional[Owned] = None, pool: Optional[cf.ProcessPoolExecutor] = None,
         on_result: Optional[Callable[[int, ShardResult], None]] = None) -> List[ShardResult]:
    """Write every spec, reporting each finished shard; the first error cancels the rest.
    With ``owned``, a file this output cannot prove it wrote where a shard goes stops it first.
    ``pool``: a process pool started before the scan (:func:`started_pool`), used as this run's own.

    ``specs`` is read by index, each spec made when it is needed (:class:`_LazySpecs`): only the
    shards whose files are already there are looked at before writing (finished, or a foreign
    file), and at most two specs per worker are in flight, so the parent never holds every
    spec's samples. ``on_result(index, result)`` sees each result as it comes."""
    count = len(specs)
    if not count:
        return []
    first = specs[0]
    fmt = get(first.format)
    out = Location(first.out_dir, first.storage_options)
    results: Dict[int, ShardResult] = {}

    def take(index: int, result: ShardResult) -> None:
        results[index] = result
        if on_result is not None:
            on_result(index, result)

    names = specs.names if isinstance(specs, _LazySpecs) else [spec.name for spec in specs]
    present = set(out.listdir())
    todo: List[int] = []
    for i, name in enumerate(names):
        if not any(n in present for n in fmt.planned_files(name)):
            todo.append(i)  # nothing there: neither finished nor in the way
            continue
        spec = specs[i]
        done = fmt.completed(spec)
        if done is not None:
            take(i, done)
            bar.update(len(spec.samples))
            continue
        if owned is not None:
            refuse_foreign(owned.out, fmt, [spec], owned)
        todo.append(i)
    started = time.perf_counter()
    nbytes = 0

    def finished(index: int, samples: int, result: ShardResult) -> None:
        nonlocal nbytes
        take(index, result)
        nbytes += result.entry.bytes
        bar.update(samples)
        rate = nbytes / max(time.perf_counter() - started, 1e-9) / 1e6
        bar.set_postfix_str(f"{len(results)}/{count} shards, {rate:.0f} MB/s")

    own_pool = None
    # a format whose native library may crash on a failed write is written in a child process
    # even for one worker, so that a crash there is one clear error here
    isolate = bool(todo) and fmt.write_in_child
    if executor is None and pool is not None and todo:
        executor = pool
    elif executor is None and ((workers > 1 and len(todo) > 1) or isolate):
        own_pool = executor = process_pool(min(workers, len(todo)))
    try:
        if executor is None:
            for i in todo:
                spec = specs[i]
                finished(i, len(spec.samples), write_shard(spec))
        else:
            task = _write_pickled_quietly if own_pool is not None or executor is pool else write_pickled_shard
            limit = 2 * max(1, workers)  # specs in flight: every worker busy, one more queued each
            waiting = iter(todo)
            # each in flight as its pickle (~0.2 kB a sample, where its objects take ~0.7 kB)
            futures: Dict[cf.Future, Tuple[int, int]] = {}
            try:
                while True:
                    while len(futures) < limit:
                        following = next(waiting, None)
                        if following is None:
                            break
                        spec = specs[following]
                        blob = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
                        futures[executor.submit(task, blob)] = (spec.index, len(spec.samples))
                        del spec, blob
                    if not futures:
                        break
                    done_now, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
                    for future in sorted(done_now, key=lambda f: futures[f][0]):
                        finished(*futures[future], future.result())
                        del futures[future]
            except BaseException as exc:
                for future in futures:
                    future.cancel()
                raise_worker_cause(exc, futures, first.out_dir)
                raise
    finally:
        if own_pool is not None:
            own_pool.shutdown(wait=True, cancel_futures=True)
    return [results[i] for i in range(count)]


class _LazySpecs(Sequence[ShardSpec]):
    """A plan's shard specs, each made when asked for (it holds its samples), with every
    shard's name known ahead."""

    def __init__(self, names: List[str], make: Callable[[int], ShardSpec]):
        self.names = names
        self.make = make

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.make(i) for i in range(*index.indices(len(self.names)))]
        return self.make(int(index))


def started_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A process pool whose workers are forked now (a fork pool starts them all at its first
    task): what the parent builds afterwards (the scan, the plan) is not in their memory."""
    pool = process_pool(workers)
    pool.submit(os.getpid).result()
    return pool


def _quiet_unraisable(unraisable: Any) -> None:
    """A worker's hook for errors in finalizers: a full disk is reported once, by the parent;
    h5py's objects failing to flush as they are freed afterwards is not news (tracebacks)."""
    if not _is_out_of_space(unraisable.exc_value):
        sys.__unraisablehook__(unraisable)


def _quiet_excepthook(kind: Any, value: BaseException, tb: Any) -> None:
    """Cython finalizers (h5py's) print their error through sys.excepthook first."""
    if not _is_out_of_space(value):
        sys.__excepthook__(kind, value, tb)


def write_shard(spec: ShardSpec) -> ShardResult:
    """One shard written: its inputs read (:func:`dsconvert.inputs.read_samples`) and handed to
    its format (``Format.write_shard``). The pure function the executor maps."""
    return get(spec.format).write_shard(spec, read_samples(spec))


def _write_shard(spec: ShardSpec) -> ShardResult:
    """What our own pool's workers run: :func:`write_shard`, with quiet finalizers."""
    sys.unraisablehook, sys.excepthook = _quiet_unraisable, _quiet_excepthook
    return write_shard(spec)


def write_pickled_shard(blob: bytes) -> ShardResult:
    """:func:`write_shard` of a pickled spec: what a conversion sends an executor, so that the
    specs in flight are held as bytes, not as an object per sample."""
    return write_shard(pickle.loads(blob))


def _write_pickled_quietly(blob: bytes) -> ShardResult:
    """What our own pool's workers run: :func:`write_pickled_shard`, with quiet finalizers."""
    return _write_shard(pickle.loads(blob))


def raise_worker_cause(exc: BaseException, futures: Dict[cf.Future, Any], out_dir: str) -> None:
    """Raise what the user needs to know when a shard failed, if it is not ``exc`` itself.

    A worker that dies (SIGKILL, the OOM killer, a crash in a native library) breaks the
    pool, and every pending shard then fails with BrokenProcessPool: the first real error of
    another shard (a full disk, typically) says more. A dead worker alone is one line saying
    so; finished shards are whole, so the same command resumes."""
    if not isinstance(exc, Exception):
        return  # KeyboardInterrupt, SystemExit: as they are
    for future in futures:
        if future.done() and not future.cancelled():
            other = future.exception()
            if other is not None and _is_out_of_space(other):
                raise other from None
    if isinstance(exc, BrokenProcessPool):
        if not is_remote(out_dir) and free_bytes(out_dir) < _NEARLY_FULL:
            # libhdf5 may crash the worker before it reports the full disk
            raise OSError(errno.ENOSPC, "No space left on device", out_dir) from None
        raise DsconvertError(
            f"a worker process died unexpectedly (killed, out of memory, or a crash in a native library) "
            f"while writing {out_dir}: finished shards are kept; run the same command again to resume",
            out_dir) from None


def accepts(format: str, source: Source) -> bool:
    """Whether :func:`convert` takes the scanned ``source`` for ``format``: formats that hold
    only (image, label) samples need an ImageFolder or list source."""
    return get(format).any_samples or source.sample_type == "classification"


_NEARLY_FULL = 1 << 20  # free bytes below which a dead writer most likely met a full disk


def convert(
    src: Any,
    out: str,
    format: str = "wds",
    *,
    layout: str = "auto",
    label: Union[str, bool, None] = None,
    samples_per_shard: int = 10000,
    shard_size: Union[int, str] = "1GB",
    workers: Optional[int] = None,
    verify: bool = True,
    strict: bool = False,
    overwrite: bool = False,
    max_image_pixels: Optional[int] = None,
    max_sample_bytes: Optional[int] = MAX_SAMPLE_BYTES,
    prefix: str = "shard",
    decode: bool = False,
    resize: Optional[int] = None,
    size: Optional[Tuple[int, int]] = None,
    decoder: str = "auto",
    resampler: str = "auto",
    max_size: Optional[int] = None,
    quality: int = DEFAULT_QUALITY,
    min_shards: int = MIN_SHARDS,
    force: bool = False,
    executor: Optional[cf.Executor] = None,
    progress: bool = False,
    storage_options: Optional[Dict[str, Any]] = None,
    scanned: Optional[Source] = None,
    order: str = "auto",
    seed: int = 0,
    compress: Optional[str] = None,
) -> ConvertResult:
    """Convert the dataset at ``src`` into ``format`` shards in ``out``; see the module doc.

    Returns when the manifest is written. Bad inputs are skipped and listed in
    ``result.manifest.skipped`` (``strict=True`` raises :class:`BadInputError` instead). A
    finished output is left as it is (``already_complete``) unless ``overwrite``; a finished
    output made with other options raises :class:`OutputExistsError`.

    Decoded outputs (``format="npy"``, or ``"hdf5"`` with ``decode=True``) hold RGB pixels,
    optionally resized (``resize`` = shorter side, or ``size`` = (height, width)); JPEGs are
    decoded with ``decoder`` (``auto``: the fastest that loads; ``pil`` for Pillow's exact
    pixels); with ``resize`` or ``size`` a fast decoder decodes large JPEGs at 1/2, 1/4 or 1/8
    DCT scale where that covers the output, then resizes with ``resampler`` (``auto``: torch's
    kernel where torch is installed, else Pillow's; the same bilinear filter:
    :func:`dsconvert.codecs.decode_resized`). Encoded outputs shrink images whose longer side
    exceeds ``max_size`` (re-encoded once, JPEGs at ``quality``: :mod:`dsconvert.reencode`).
    Before writing, the output's size is estimated and a file system without room for it refuses
    the conversion with :class:`InsufficientSpaceError` unless ``force``.

    Shards hold at most ``samples_per_shard`` samples and ``shard_size`` bytes; a source those
    limits would pack into fewer than ``min_shards`` shards is spread over up to that many
    (never under 64 samples each), so that up to ``min_shards`` workers have work. The plan
    depends on the source and these options only: the bytes are the same for any ``workers``.

    ``src`` and ``out`` may be URLs of anything fsspec reaches (``s3://bucket/train``), with
    ``storage_options`` (credentials, endpoint) for them. Remote shards are staged on local
    disk and uploaded whole, the manifest last. On object stores there is no lock against a
    second conversion into the same prefix, and no free-space check.

    ``src`` may also be what another tool packed, read in place: a folder (or brace pattern) of
    tar shards, Parquet files (Hugging Face ``datasets`` exports included), or a dsconvert
    output holding encoded images (re-conversion); ``label`` names where their class label is
    (``cls``, ``json.label``, a Parquet column; for Parquet and Arrow it is found by itself, and
    ``label=False`` makes dict samples of every column): see :mod:`dsconvert.source`. Hugging Face
    exports: Parquet files (images embedded, or named by local paths), ``save_to_disk``
    folders, and a ``datasets.Dataset`` object itself (read as its ``save_to_disk`` folder:
    :func:`dsconvert.source.arrow.dataset_folder`).

    ``order``: the order the shards store the samples in. ``shuffled``: a seeded permutation of
    the source (``seed``; the same for any ``workers``), so that reading the shards in a stream
    mixes classes as a uniform shuffle does; random access (``ds[i]``) still returns the
    source's sample i. ``source``: the source's order. ``auto`` (the default): shuffled for
    (image, label) samples in wds shards, the source's order otherwise (:func:`resolve_order`).

    ``scanned``: a :class:`Source` of ``src`` already scanned (or a part of one: analyze
    converts its measured sample this way) to convert instead of scanning ``src`` again.

    ``compress``: ``"zstd"`` or ``"zstd:LEVEL"`` (1..22, default 3) stores every non-image field
    of a wds output zstd-compressed, as member ``<key>.<field>.zst``; readers give it back under
    its own name (:mod:`dsconvert.codecs.compress`; ``pip install 'dsconvert[zstd]'``).
    """
    if not isinstance(src, str) and hasattr(src, "save_to_disk") and hasattr(src, "features"):
        src = dataset_folder(src, local_form(out))  # a datasets.Dataset: read as its save_to_disk folder
    src, out = local_form(src), local_form(out)  # file:// URLs as the paths they name
    if format not in FORMATS:
        raise OptionError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    if layout not in LAYOUTS:
        raise OptionError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if order not in ORDERS:
        raise OptionError(f"order must be one of {ORDERS}, not {order!r}")
    if type(seed) is not int:
        raise OptionError(f"seed must be an int, not {seed!r}")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", prefix):
        raise OptionError(f"prefix must be a plain file name stem, not {prefix!r}")
    fmt = get(format)
    compression = parse_compression(compress)
    if compression is not None:
        if not fmt.compresses_fields:
            able = ", ".join(f for f in FORMATS if get(f).compresses_fields)
            raise OptionError(f"compress applies to {able} outputs: {format} holds images and labels only, which "
                              "are not compressed")
        require_codec(compression)
    decode = decode or fmt.pixels == "always"
    if decode and fmt.pixels == "never":
        can = ", ".join(f for f in FORMATS if get(f).pixels != "never")
        raise OptionError(f"decode=True needs a format that stores pixels ({can})")
    if (resize is not None or size is not None) and not decode:
        ways = [f"--format {f}" + (" with --decode" if get(f).pixels == "optional" else "")
                for f in FORMATS if get(f).pixels != "never"]
        raise OptionError(f"resize/size apply to decoded outputs: {' or '.join(ways)}")
    if resize is not None and size is not None:
        raise OptionError("give resize (shorter side) or size (HxW), not both")
    if resize is not None and int(resize) < 1:
        raise OptionError(f"resize must be >= 1, not {resize}")
    if max_size is not None:
        if decode:
            raise OptionError("max_size re-encodes encoded outputs; decoded ones take resize or size")
        if int(max_size) < 1:
            raise OptionError(f"max_size must be >= 1, not {max_size}")
    if not 1 <= int(quality) <= 100:
        raise OptionError(f"quality must be within 1..100, not {quality}")
    # recorded only when given: outputs written before these options existed stay "the same"
    shrink = {"max_size": int(max_size), "quality": int(quality)} if max_size is not None else {}
    if type(min_shards) is not int or min_shards < 1:
        raise OptionError(f"min_shards must be a positive int, not {min_shards!r}")
    spread = {"min_shards": min_shards} if min_shards != MIN_SHARDS else {}  # recorded when not the default
    decoder_name = resolve_decoder(decoder) if decode else None
    # resizing, a fast decoder decodes large JPEGs at a reduced DCT scale, and the bilinear filter
    # runs on torch's kernel where torch is installed (codecs.decode_resized); both recorded,
    # because the bytes depend on them. decoder="pil" keeps Pillow's exact pipeline.
    resampling: Dict[str, Any] = {}
    if decode and (resize is not None or size is not None):
        if decoder_name != "pil":
            resampling["scaled_decode"] = True
        resampling["resampler"] = "pil" if decoder_name == "pil" else resolve_resampler(resampler)
    shard_bytes = parse_size(shard_size) if isinstance(shard_size, str) else int(shard_size)
    workers = available_cpus() if workers is None else max(1, int(workers))
    src_abs = src.rstrip("/") if is_remote(src) else os.path.abspath(src)
    location = Location(out, storage_options)
    out_dir = location.url
    if scanned is None or scanned.kind == "files":  # containers are read by name: a folder beside them is not input
        _check_paths(src_abs, out_dir)
    options = _shaping_options(
        format=format, layout=layout, samples_per_shard=samples_per_shard, shard_size=shard_bytes,
        verify=verify, max_image_pixels=max_image_pixels, prefix=prefix,
        decode=decode, resize=resize, size=list(size) if size else None, decoder=decoder_name, **shrink,
        **resampling, **spread, **({"label": label} if label is not None else {}), order=order,
        **({"seed": seed} if order != "source" else {}),
        **({"max_sample_bytes": max_sample_bytes or 0} if max_sample_bytes != MAX_SAMPLE_BYTES else {}),
        **({"compress": compression_label(compression)} if compression else {}),
    )
    started = time.perf_counter()
    location.makedirs()
    claim_output(location, overwrite)
    lock = contextlib.nullcontext() if location.remote else output_lock(out_dir)
    with lock, out_of_space_is_resumable(location), contextlib.ExitStack() as stack:
        owned = Owned(location, owner_token(location))
        if location.exists(MANIFEST_NAME):
            previous = Manifest.load(location)
            same = previous.options == options and previous.source.get("url") == src_abs
            if overwrite:
                remove_previous(location, previous)
            elif not same:
                raise OutputExistsError(
                    f"{out_dir} already holds a finished conversion made with other options or "
                    "another source; pass --overwrite to replace it", out_dir)
            elif not any(x["reason"].startswith(CHANGED_DURING) for x in previous.skipped):
                return ConvertResult(previous, out_dir, already_complete=True)
            # else inputs changed while it ran: rescan; shards whose inputs did not change are kept.
            # The manifest goes first: from the first rewritten shard on it would describe shards
            # that are no longer there, and a kill then would leave it lying. Its files are noted
            # ours first: the manifest was their proof.
            if not overwrite:
                _adopt(owned, previous)
            location.remove(MANIFEST_NAME)

        # the workers are forked now, before the scan: they never hold (nor touch, making them
        # private) the parent's object of every input; each is sent one shard's spec at a time
        pool = started_pool(workers) if executor is None and workers > 1 else None
        if pool is not None:
            stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        if scanned is not None:
            source = scanned
        else:
            with progress_bar(progress, "scanning", unit=" files") as bar:
                source = scan(src_abs, layout, progress=bar.update, storage_options=storage_options, label=label)
        source = _drop_over_limit(source, max_sample_bytes)
        if strict and source.skipped:
            first = source.skipped[0]
            raise BadInputError(first.reason, first.path)

        if not accepts(format, source):
            able = ", ".join(f for f in FORMATS if get(f).any_samples)
            hint = " or --label naming where the class label is" if source.kind in ("tar", "parquet") else ""
            raise SourceError(
                f"the {format} format holds (image, label) samples: it needs an ImageFolder or list "
                f"source{hint}, and {src_abs} was scanned as {source.layout} (use --format {able})", src_abs)
        classification = source.sample_type == "classification"
        with pixel_limit(max_image_pixels):  # images past it are skipped, and take no room
            estimate = estimate_output_bytes(source, decode, resize, size,
                                             stored_bytes=lambda s: fmt.sample_bytes(s, classification,
                                                                                     bool(compression)))
        if not force and not location.remote:  # each shard also has a fixed part (a tar's end, HDF5 headers)
            shards_at_least = -(-len(source.samples) // samples_per_shard)
            _check_space(out_dir, prefix, SizeEstimate(estimate.bytes + shards_at_least * fmt.overhead,
                                                       estimate.sampled, estimate.exact), fmt)
        format_options = {"decode": decode, "resize": resize, "size": list(size) if size else None,
                          "decoder": decoder_name, **resampling, **shrink, **fmt.writer_options(source)}
        if max_sample_bytes != MAX_SAMPLE_BYTES:  # the default left out: earlier outputs' specs still match
            format_options["max_sample_bytes"] = max_sample_bytes or 0
        if compression:  # likewise: in the spec digest only when given
            format_options["compress"] = compression
        ratio = estimate.bytes / source.nbytes if decode and source.nbytes and estimate.bytes else 1.0
        shuffled = resolve_order(order, fmt, source) == "shuffled"
        # the order on disk while the shards are written: its 8 bytes a sample are the sort's peak only
        positions = SpilledInts(shuffled_order(len(source.samples), seed)) if shuffled else None
        specs = _make_specs(source, fmt, location, prefix, samples_per_shard, shard_bytes, min_shards,
                            verify, strict, max_image_pixels, format_options, ratio, dict(storage_options or {}),
                            positions, owned.token)
        stored = StoredPositions()  # each shard's positions, on disk as it finishes: the order file's

        def keep_positions(index: int, result: ShardResult) -> None:
            if result.positions is not None:
                stored.add(index, result.positions)
                result.positions = None

        with progress_bar(progress, f"writing {format}", total=len(source.samples), unit=" samples") as bar:
            results = _run(specs, workers, executor, bar, None if overwrite else owned, pool, keep_positions)

        keep = {name for r in results for name in fmt.files_of(r.entry)}
        remove_stale(location, prefix, keep, Owned(location, owned.token))  # read again: the writers added
        manifest = build_manifest(src_abs, source, format, results, options, decode, compression)
        if shuffled or source.positions is not None:  # before the manifest, which names it: a kill in between
            # leaves no finished output
            manifest.order = _save_order(location, results, stored, owned.token)
        manifest.save(location, temp_noter(location, owned.token))
    resumed = sum(r.resumed for r in results)
    return ConvertResult(manifest, out_dir, False, len(results) - resumed, resumed,
                         time.perf_counter() - started, workers if executor is None else 0)


def _drop_over_limit(source: Source, limit: Optional[int]) -> Source:
    """The source less the samples with an input the scan already knows is over the byte bound
    (a file's size, a tar member's, a Parquet row group's bytes per row): skipped unread. A
    scan table knows its largest input without a pass; the kept samples go to a new one."""
    if not limit:
        return source
    largest = getattr(source.samples, "max_file_size", None)
    if largest is not None and largest <= limit:
        return source
    if largest is None and not any(f.size > limit for s in source.samples for f in s.files):
        return source
    kept, skipped = ScanTable(), list(source.skipped)
    given = source.positions
    places = array("q")  # the kept samples' indexes, when they carry positions
    for i, sample in enumerate(source.samples):
        big = next((f for f in sample.files if f.size > limit), None)
        if big is None:
            kept.append(sample)
            if given is not None:
                places.append(i)
            continue
        reason = over_limit(big.size, limit)
        if source.kind == "parquet":
            reason = "about " + reason.replace(" bytes, over", " bytes a row in its row group, over", 1)
        skipped.extend(Skipped(f.path, reason) for f in sample.files)
    positions = None if given is None else np.asarray(given, dtype=np.int64)[np.frombuffer(places, dtype=np.int64)]
    return dataclasses.replace(source, samples=kept, skipped=skipped, positions=positions)


def _save_order(out: Location, results: List[ShardResult], stored: StoredPositions, owner: str = "") -> Dict[str, Any]:
    """Write the order file of a shuffled output (:mod:`dsconvert.shuffle`), from the shards'
    positions ``stored`` as they finished; its manifest entry."""
    for i, r in enumerate(results):
        if stored.count_of(i) != r.entry.num_samples:
            raise RuntimeError(f"internal error: shard {r.entry.name} has no source positions")
    with out.write(ORDER_NAME, before=temp_noter(out, owner)) as f:
        nbytes, sha256 = stored.write_order(f, range(len(results)))
    return {"name": ORDER_NAME, "bytes": nbytes, "sha256": sha256}


def _skip_entry(path: str, s: Skipped) -> Dict[str, Any]:
    return {"path": path, "reason": s.reason, **({"count": s.count} if s.count != 1 else {})}


def build_manifest(url: str, source: Source, fmt: str, results: List[ShardResult],
                   options: Dict[str, Any], decoded: bool, compression: Optional[Dict[str, Any]] = None) -> Manifest:
    """The manifest of the shards ``results`` written from ``source`` (at ``url``): every input
    accounted for (written or skipped), or a RuntimeError. ``compression``: the ``--compress``
    setting, recorded with the fields the shards store compressed."""
    listed = [_skip_entry(escape_path(s.path), s) for s in source.skipped]
    for r in results:
        listed.extend(_skip_entry(s.path, s) for s in r.skipped)
    skipped = skips.compact(listed) if source.kind in skips.ROW_KINDS else listed
    fields: Dict[str, str] = {}
    for r in results:
        fields.update(r.fields)
    written = sum(r.files_written for r in results)
    accounting = {
        "files_seen": source.num_files,
        "files_written": written,
        "files_skipped": skips.total(skipped),
        "files_ignored": len(source.ignored),
    }
    if accounting["files_seen"] != written + accounting["files_skipped"]:
        raise RuntimeError(f"internal error: input accounting does not add up: {accounting}")
    entries = [r.entry for r in results]
    return Manifest(
        format=fmt,
        source={"url": url, "root": source.root, "layout": source.layout,
                **({"chosen": source.chosen} if source.chosen else {})},
        sample_type=source.sample_type,
        classes=source.classes,
        fields=dict(sorted(fields.items())),
        num_samples=sum(e.num_samples for e in entries),
        shards=entries,
        skipped=skipped,
        ignored=[{"path": escape_path(s.path), "reason": s.reason} for s in source.ignored],
        accounting=accounting,
        options=options,
        created_by=f"dsconvert {__version__}",
        stored="decoded" if decoded else "encoded",
        compression=None if compression is None else {
            "codec": compression["codec"], "level": compression["level"],
            "fields": sorted({f for r in results for f in r.compressed})},
    )
