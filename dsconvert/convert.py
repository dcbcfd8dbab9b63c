"""Conversion: scan, plan shards, write them on an executor, resume, write the manifest.

Conversion is a map of a pure function (:class:`ShardSpec` -> :class:`ShardResult`) over a
``concurrent.futures.Executor``: a process pool by default, in-process for one worker, or
any executor the caller passes (``dask.distributed.Client.get_executor()``, say). Each shard
is written under a temporary name and renamed; its index, written after, marks it done. A
killed run, started again with the same arguments, keeps every finished shard whose spec is
unchanged and writes the rest, so no sample is lost or duplicated. The manifest comes last.

What every writer shares lives in :mod:`dsconvert.write`: the option checks, the output's life
cycle (claim, lock, owner journal, a finished output reused or refused, stale files, the
manifest saved) and the executor loop (:func:`dsconvert.write.loop.run_shards`); this module is
conversion's own steps: checks -> open the output -> scan -> plan -> run -> manifest.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import os
import pickle
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

import numpy as np

from . import optional, skips
from .codecs import compression_label, pixel_limit, resolve_decoder, resolve_resampler
from .errors import BadInputError, DsconvertError, OptionError, SourceError
from .formats import FORMATS, Format, get
from .inputs import read_samples
from .io.location import Location, is_remote, local_form
from .io.owner import temp_noter
from .keys import escape_path
from .manifest import ORDER_NAME, Manifest
from .packed_samples import pack_samples
from .plan import (
    CHANGED_DURING,
    MAX_SAMPLE_BYTES,
    MIN_SHARDS,
    ShardResult,
    ShardSpec,
    over_limit,
    spread_plan,
)
from .processes import available_cpus
from .progress import progress_bar
from .reencode import DEFAULT_QUALITY
from .samples import LAYOUTS, Skipped, Source
from .scan_table import Reordered, ScanTable, SpilledInts
from .shuffle import ORDERS, StoredPositions, shuffled_order
from .sizing import SizeEstimate, estimate_output_bytes
from .source import scan
from .source.arrow import dataset_folder
from .version import __version__
from .write import loop
from .write.options import (
    check_compression,
    check_decode,
    check_format,
    check_positive,
    check_prefix,
    check_quality,
    check_shard_size,
)
from .write.output import check_space, open_output

__all__ = ["convert", "ConvertResult", "write_shard", "EXIT_SKIPPED", "accepts", "resolve_order", "build_manifest"]

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


def _make_specs(source: Source, fmt: Type[Format], out: Location, prefix: str, samples_per_shard: int,
                shard_bytes: int, min_shards: int, verify: bool, strict: bool, max_image_pixels: Optional[int],
                format_options: Dict[str, Any], bytes_ratio: float,
                storage_options: Dict[str, Any], positions: Any = None,
                owner: str = "") -> _LazySpecs:
    """Plan shards: the specs, each made when asked for (it holds only its own samples, packed:
    :mod:`dsconvert.packed_samples`; its positions as an int64 array);
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
                         pack_samples(samples, a, b), verify, max_image_pixels, strict, format_options,
                         storage_options, source.kind,
                         np.asarray(positions[a:b], dtype=np.int64) if positions is not None else (), owner)

    return _LazySpecs([fmt.shard_name(prefix, i) for i in range(len(ranges))], make)


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


def write_shard(spec: ShardSpec) -> ShardResult:
    """One shard written: its inputs read (:func:`dsconvert.inputs.read_samples`) and handed to
    its format (``Format.write_shard``). The pure function the executor maps."""
    return get(spec.format).write_shard(spec, read_samples(spec))


def write_pickled_shard(blob: bytes) -> ShardResult:
    """:func:`write_shard` of a pickled spec: what a conversion sends an executor, so that the
    specs in flight are held as bytes (their packed columns: ~75 bytes a sample of tar members),
    never as objects."""
    return write_shard(pickle.loads(blob))


def _write_job(spec: ShardSpec) -> loop.Job:
    return write_pickled_shard, (pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL),)


@dataclass(frozen=True)
class _Checked:
    """Conversion's options, checked, and what they resolve to."""
    fmt: Type[Format]
    compression: Optional[Dict[str, Any]]
    decode: bool
    decoder: Optional[str]
    resampling: Dict[str, Any]  # how decoded images are resized (recorded: the bytes depend on it)
    shrink: Dict[str, Any]  # max_size and quality, recorded only when given
    restart: Dict[str, Any]  # jpeg_restart, recorded only when given
    spread: Dict[str, Any]  # min_shards, recorded when not the default
    shard_bytes: int


def _check_options(format: Any, layout: Any, order: Any, seed: Any, prefix: Any, compress: Any, decode: Any,
                   resize: Any, size: Any, max_size: Any, quality: Any, min_shards: Any, samples_per_shard: Any,
                   shard_size: Any, decoder: str, resampler: str, jpeg_restart: Any = False) -> _Checked:
    """Every option checked before the output is touched: the shared ones by
    :mod:`dsconvert.write.options` (one message for convert, Writer and optimize), then
    conversion's own."""
    fmt = check_format(format)
    if layout not in LAYOUTS:
        raise OptionError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if order not in ORDERS:
        raise OptionError(f"order must be one of {ORDERS}, not {order!r}")
    if type(seed) is not int:
        raise OptionError(f"seed must be an int, not {seed!r}")
    check_prefix(prefix)
    compression = check_compression(fmt, compress)
    decode = check_decode(fmt, decode)
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
    check_quality(quality)
    if jpeg_restart:
        if decode:
            raise OptionError("jpeg_restart rewrites the JPEGs an encoded output stores; decoded ones store pixels")
        if optional.jpeg_region() is None:
            raise OptionError("jpeg_restart needs dsconvert's region extension, which did not build here: "
                              f"{optional.BUILD_PACKAGES}, then {optional.REBUILD}")
    restart = {"jpeg_restart": True} if jpeg_restart else {}
    # recorded only when given: outputs written before these options existed stay "the same"
    shrink = {"max_size": int(max_size), "quality": quality} if max_size is not None else {}
    check_positive("min_shards", min_shards)
    check_positive("samples_per_shard", samples_per_shard)
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
    return _Checked(fmt, compression, decode, decoder_name, resampling, shrink, restart, spread,
                    check_shard_size(shard_size))


def accepts(format: str, source: Source) -> bool:
    """Whether :func:`convert` takes the scanned ``source`` for ``format``: formats that hold
    only (image, label) samples need an ImageFolder or list source, or one they take as it is
    (npy: a folder of .npy arrays)."""
    fmt = get(format)
    return fmt.any_samples or source.sample_type == "classification" or fmt.accepts_source(source)


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
    jpeg_restart: bool = False,
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

    ``jpeg_restart``: every stored JPEG is rewritten losslessly with a restart marker after
    every MCU (:func:`dsconvert.codecs.restart_marked`: the same DCT coefficients, so every
    decoder gives the same pixels), so that ``decode="fused"`` entropy-decodes only the part of
    each image a crop needs: about a quarter less decoding CPU for ``RandomResizedCrop``, an
    eighth for ``Resize`` + ``CenterCrop``, for ~6% more bytes. The stored bytes are then not
    the source's (``decode="raw"`` returns the rewritten files; their pixels are the source's).
    """
    if not isinstance(src, str) and hasattr(src, "save_to_disk") and hasattr(src, "features"):
        src = dataset_folder(src, local_form(out))  # a datasets.Dataset: read as its save_to_disk folder
    src, out = local_form(src), local_form(out)  # file:// URLs as the paths they name
    checked = _check_options(format, layout, order, seed, prefix, compress, decode, resize, size, max_size,
                             quality, min_shards, samples_per_shard, shard_size, decoder, resampler, jpeg_restart)
    fmt, compression, decode, decoder_name = checked.fmt, checked.compression, checked.decode, checked.decoder
    resampling, shrink, spread, shard_bytes = checked.resampling, checked.shrink, checked.spread, checked.shard_bytes
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
        **checked.restart,
        **resampling, **spread, **({"label": label} if label is not None else {}), order=order,
        **({"seed": seed} if order != "source" else {}),
        **({"max_sample_bytes": max_sample_bytes or 0} if max_sample_bytes != MAX_SAMPLE_BYTES else {}),
        **({"compress": compression_label(compression)} if compression else {}),
    )
    started = time.perf_counter()
    with open_output(location, overwrite, overwrite_flag="--overwrite") as output, contextlib.ExitStack() as stack:
        owned = output.owned
        previous = output.finished("conversion made with other options or another source",
                                   reusable=lambda m: m.options == options and m.source.get("url") == src_abs)
        if previous is not None:
            if not any(x["reason"].startswith(CHANGED_DURING) for x in previous.skipped):
                return ConvertResult(previous, out_dir, already_complete=True)
            # inputs changed while it ran: rescan; shards whose inputs did not change are kept
            output.reopen(previous)

        # the workers are forked now, before the scan: they never hold (nor touch, making them
        # private) the parent's object of every input; each is sent one shard's spec at a time
        pool = loop.started_pool(workers) if executor is None and workers > 1 else None
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
            arrays = " or same-shape .npy arrays" if format == "npy" else ""
            raise SourceError(
                f"the {format} format holds (image, label) samples{arrays}: it needs an ImageFolder or list "
                f"source{hint}, and {src_abs} was scanned as {source.layout} (use --format {able})", src_abs)
        classification = source.sample_type == "classification"
        writer_options = fmt.writer_options(source)
        packed = "array" in writer_options  # arrays stored as they are: nothing to decode or resize
        if packed and (resize is not None or size is not None):
            raise OptionError(f"{src_abs} holds .npy arrays, which are packed as they are: resize/size apply to "
                              "images")
        with pixel_limit(max_image_pixels):  # images past it are skipped, and take no room
            estimate = estimate_output_bytes(source, decode and not packed, resize, size,
                                             stored_bytes=lambda s: fmt.sample_bytes(s, classification,
                                                                                     bool(compression)))
        if not force and not location.remote:  # each shard also has a fixed part (a tar's end, HDF5 headers)
            shards_at_least = -(-len(source.samples) // samples_per_shard)
            check_space(out_dir, prefix, SizeEstimate(estimate.bytes + shards_at_least * fmt.overhead,
                                                      estimate.sampled, estimate.exact), fmt)
        format_options = {"decode": decode, "resize": resize, "size": list(size) if size else None,
                          "decoder": decoder_name, **resampling, **shrink, **checked.restart, **writer_options}
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
            results = loop.run_shards(specs, len(specs), _write_job, workers=workers, executor=executor, bar=bar,
                                      owned=output.guarded, pool=pool, on_result=keep_positions)

        output.remove_stale(fmt, prefix, results)
        manifest = build_manifest(src_abs, source, format, results, options, decode, compression)
        if shuffled or source.positions is not None:  # before the manifest, which names it: a kill in between
            # leaves no finished output
            manifest.order = _save_order(location, results, stored, owned.token)
        output.save(manifest)
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
