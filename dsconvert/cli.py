"""The ``dsconvert`` command: parse arguments, call one library function, render its result.

``main(argv) -> int`` is testable without a subprocess. Library errors become one line on
stderr and exit status 1; usage errors exit 2 (argparse); a conversion that finished but
skipped inputs exits 3, so scripts notice.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import select
import sys
from collections import Counter
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator, List, Optional

from . import __version__, skips
from .codecs import DECODE_MODES, DECODERS, parse_hw
from .convert import EXIT_SKIPPED, convert
from .errors import DsconvertError, OptionError, SourceError
from .formats import FORMATS
from .manifest import Manifest
from .shuffle import ORDERS
from .plan import MAX_SAMPLE_BYTES, MIN_SHARDS, MIN_SPREAD_SAMPLES, parse_size
from .io.location import is_remote, parse_storage_options
from .sizing import format_size
from .source import LAYOUTS

__all__ = ["main", "build_parser"]


def _quality(text: str) -> int:
    value = _positive_int(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"quality must be within 1..100, not {value}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _path(text: str) -> str:
    """A path or URL: not empty ('' would silently mean the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):  # float() also takes 'nan' and 'inf'
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    """A rate: a finite number > 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A time budget: a finite number >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _size(text: str) -> int:
    """A byte count such as 512MB or 1GiB, >= 1 byte: a usage error, not a traceback, when not."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def _int_list(minimum: int):
    """argparse type for '0,1,2,4': a list of ints >= minimum."""
    def parse(text: str) -> List[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected numbers >= {minimum}, got {text!r}")
        return values
    return parse


def _option(*names: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A parent parser holding one argument, for ``add_parser(..., parents=[...])``: an argument
    that several subcommands share is defined once."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(*names, **kwargs)
    return parent


def _quiet(help: str = "no progress") -> argparse.ArgumentParser:
    return _option("-q", "--quiet", action="store_true", help=help)


def _json(what: str, schema: Optional[str] = None) -> argparse.ArgumentParser:
    """--json, whose help says what it prints and in which schema."""
    return _option("--json", action="store_true",
                   help=f"print {what} as JSON" + (f" (schema {schema})" if schema else ""))


def _storage_options() -> argparse.ArgumentParser:
    return _option("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec option for URLs (s3://, gs://, ...), repeatable: values are JSON when they "
                   "parse, dotted keys nest, e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000 or anon=true; "
                   "fsspec's config and FSSPEC_<PROTOCOL>_* variables apply first")


def _hw(text: str):
    try:
        return parse_hw(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsconvert",
        description="Find and remove the data-loading bottleneck in deep-learning training: "
        "rewrite many small files into shards that a DataLoader reads fast.",
        epilog="Exit status: 0 done, 1 error, 2 usage error, 3 done but some inputs were skipped "
        "(listed in OUT/dsconvert.json), 4 verify found problems.",
    )
    parser.add_argument("--version", action="version", version=f"dsconvert {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    # arguments that several subcommands share, each defined once (their options list first in --help)
    quiet = _quiet()
    storage = _storage_options()
    report = _option("--report", type=_path, metavar="FILE.html",
                     help="also write a self-contained HTML report with plots (pip install 'dsconvert[report]')")
    output = _option("path", type=_path, metavar="OUT", help="a dsconvert output folder")

    p = sub.add_parser(
        "shard",
        help="convert a dataset of many small files into shards",
        description="Convert SRC (a folder, a CSV/JSONL list of path,label, tar shards another "
        "tool wrote, Parquet files, or a dsconvert output) into shards in OUT. Every input ends "
        "up in a shard or in the manifest's skipped list with its reason. Killed runs resume "
        "when the same command is run again.",
        parents=[_quiet("no progress bars or summary"), storage],
    )
    p.add_argument("src", type=_path, metavar="SRC",
                   help="source folder (ImageFolder or flat), list file, folder or brace pattern of .tar "
                   "shards, .parquet file(s), or a dsconvert output (re-conversion)")
    p.add_argument("-o", "--output", required=True, type=_path, metavar="OUT", help="output folder")
    p.add_argument("--format", choices=sorted(FORMATS), default="wds",
                   help="output format: wds = WebDataset tar shards; hdf5 = HDF5 files (encoded "
                   "bytes, or pixels with --decode); npy = decoded, memory-mappable pixel cache "
                   "for local SSD (default: %(default)s)")
    p.add_argument("--layout", choices=LAYOUTS, default="auto",
                   help="source layout; auto detects ImageFolder class folders, flat "
                   "basename-grouped files with sidecars, a list file, tar shards, Parquet files or a "
                   "dsconvert output (default: %(default)s)")
    p.add_argument("--label", metavar="FIELD",
                   help="tar shards and Parquet: where the class label is (cls, a JSON key such as "
                   "json.label, or a Parquet column); makes (image, label) samples")
    p.add_argument("--samples-per-shard", type=_positive_int, default=10000, metavar="N",
                   help="at most N samples per shard (default: %(default)s)")
    p.add_argument("--shard-size", type=_size, default="1GB", metavar="SIZE",
                   help="at most SIZE bytes per shard, e.g. 512MB, 1GiB; whichever limit comes "
                   "first ends a shard (default: %(default)s)")
    p.add_argument("--min-shards", type=_positive_int, default=MIN_SHARDS, metavar="N",
                   help="spread a source the limits would pack into fewer shards over up to N of "
                   "them (at least 64 samples each), so that N workers have work; 1 keeps the "
                   "limits' plan (default: %(default)s)")
    p.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="parallel writer processes (default: the number of CPUs); the output "
                   "is byte-identical for any N")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="write the shards on a Dask cluster instead: tcp://scheduler:8786, or local:N for a "
                   "LocalCluster of N workers (pip install 'dsconvert[dask]'); the same bytes as a local run")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="do not decode every image once during conversion (faster; corrupt "
                   "images then surface at training time)")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first bad input instead of skipping it")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished conversion in OUT instead of leaving it as it is")
    p.add_argument("--max-image-pixels", type=_positive_int, default=None, metavar="N",
                   help="skip images with more pixels than N as decompression bombs "
                   "(default: Pillow's MAX_IMAGE_PIXELS)")
    p.add_argument("--max-sample-bytes", type=parse_size, default=MAX_SAMPLE_BYTES, metavar="SIZE",
                   help="skip an input value larger than SIZE before reading or decoding it (e.g. 256MiB; "
                   "0: no limit; default: 64MiB), the byte bound beside the pixel bound")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default: %(default)s)")
    p.add_argument("--order", choices=ORDERS, default="auto",
                   help="the order the shards store samples in: shuffled (seeded by --seed, so that a streaming "
                   "read mixes classes like a uniform shuffle), or the source's; auto: shuffled for labelled "
                   "samples in wds shards, the source's otherwise. Random access returns the source's order "
                   "either way (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of --order shuffled (default: %(default)s)")
    e = p.add_argument_group("encoded outputs (wds, hdf5)")
    e.add_argument("--max-size", type=_positive_int, metavar="PIXELS", default=None,
                   help="re-encode images whose longer side exceeds PIXELS to that size, once, so that "
                   "training never decodes pixels it throws away (JPEG at --quality; PNG, WebP lossless)")
    e.add_argument("--quality", type=_quality, default=90, metavar="Q",
                   help="JPEG quality of images re-encoded by --max-size (default: %(default)s, as FFCV)")
    d = p.add_argument_group("decoded outputs (--format npy, or hdf5 with --decode)")
    d.add_argument("--decode", action="store_true",
                   help="hdf5: store decoded RGB pixels instead of the encoded bytes")
    size = d.add_mutually_exclusive_group()
    size.add_argument("--resize", type=_positive_int, metavar="SHORT",
                      help="resize the shorter side to SHORT pixels (aspect kept; Pillow's bilinear "
                      "filter, as torchvision's Resize(SHORT) on PIL images)")
    size.add_argument("--size", type=_hw, metavar="HxW",
                      help="resize every image to exactly H x W pixels (bilinear)")
    d.add_argument("--decoder", choices=DECODERS, default="auto",
                   help="JPEG decoder: auto = PyTurboJPEG or simplejpeg when they load (within one "
                   "level of Pillow on average; with --resize/--size large JPEGs are decoded at reduced DCT "
                   "scale), pil = Pillow's exact pixels and resize (default: %(default)s)")
    d.add_argument("--force", action="store_true",
                   help="write even when the estimated output is larger than the free space")
    p.set_defaults(func=_cmd_shard)

    p = sub.add_parser(
        "analyze", help="find why loading SRC is slow, and the command that fixes it",
        description="Say what SRC holds (a source of files, a dsconvert output, or another training "
        "format), measure it at rest (inventory, read latency and throughput cold and warm, 1..N "
        "concurrent readers, decode cost per codec and library) and through a real DataLoader with "
        "the machine's workers and a reference transform: as it is, from memory, and as each output "
        "made from the sample. Then name the bottleneck and the command that removes it, with the "
        "samples/s each output measured.",
        parents=[_json("the report", "dsconvert.analyze/2"), report, quiet, storage])
    p.add_argument("src", type=_path, metavar="SRC",
                   help="source folder, list file, tar shards, Parquet file(s) or dsconvert output")
    p.add_argument("--label", metavar="FIELD",
                   help="tar shards and Parquet: where the class label is (cls, json.label, a column; "
                   "default: cls when every sampled tar sample has one, Parquet's ClassLabel column)")
    p.add_argument("--target", type=_positive_float, metavar="N",
                   help="samples/s the GPUs consume: say whether the loader keeps up")
    p.add_argument("--sample", type=_positive_int, default=256, metavar="N",
                   help="files to measure, stratified by folder and size (default: %(default)s)")
    p.add_argument("--transform", default="eval", metavar="T",
                   help="what each sample goes through in the DataLoader passes: eval (resize 256, centre "
                   "crop 224), train (random resized crop 224 + flip), module:callable (your own), none "
                   "(default: %(default)s)")
    p.add_argument("--workers", type=_positive_int, metavar="N",
                   help="DataLoader workers of the passes (default: the CPUs available)")
    p.add_argument("--cache", choices=("auto", "cold", "warm"), default="auto",
                   help="which passes predict training: warm (epochs after the first, read from the page "
                   "cache), cold, or auto: warm when the data fits in half the memory (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--time-budget", type=_seconds, default=30.0, metavar="S",
                   help="seconds for the inventory walk; beyond it the rest is estimated (default: %(default)s)")
    p.add_argument("--output-dir", type=_path, metavar="DIR",
                   help="where a conversion would go: the outputs are measured there, its free space decides "
                   "which fit, and the commands write there (default: beside a local source; the current "
                   "folder for a remote source or one on network storage)")
    p.set_defaults(func=_cmd_analyze)

    p = sub.add_parser(
        "bench", help="measure DataLoader throughput of sources and converted outputs",
        description="Read each PATH (a source tree, read file by file as ImageFolder does, or a "
        "dsconvert output) through a real torch DataLoader for every worker count and batch size, "
        "cold (page cache evicted) and warm, and print samples/s, MB/s, the wait for each batch and "
        "the workers' CPU use. Several PATHs are compared config by config: before and after "
        "conversion in one command.",
        parents=[_json("the report", "dsconvert.bench/1"), report, quiet, storage])
    p.add_argument("paths", nargs="+", type=_path, metavar="PATH", help="source folders, list files or dsconvert outputs")
    p.add_argument("--workers", type=_int_list(0), metavar="N,N,...",
                   help="DataLoader worker counts to sweep (default: 0,1,2,4,... up to the CPUs)")
    p.add_argument("--batch-size", type=_int_list(1), default=[64], metavar="N,N,...",
                   help="batch sizes to sweep (default: 64)")
    p.add_argument("--decode", choices=DECODE_MODES, default="pil",
                   help="how images are decoded: pil (as ImageFolder), numpy (the fast JPEG decoder), "
                   "raw (no decode) (default: %(default)s)")
    p.add_argument("--transform", default="eval", metavar="T",
                   help="what each sample goes through: eval (shorter side to 256/224 S, centre crop SxS), "
                   "train (random resized crop SxS + flip), both to uint8 tensors; module:callable (your "
                   "own); none (samples as they come) (default: %(default)s)")
    p.add_argument("--size", type=int, default=224, metavar="S",
                   help="the transform's output size; 0 = no transform (default: %(default)s)")
    p.add_argument("--max-samples", type=_positive_int, default=2000, metavar="N",
                   help="samples per pass: a seeded random subset of map-style datasets, the first N "
                   "of wds shards (default: %(default)s)")
    p.add_argument("--cache", choices=("both", "cold", "warm"), default="both",
                   help="page cache state of the passes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="subset seed (default: %(default)s)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "diagnose", help="find why a running training job waits for data (py-spy)",
        usage="dsconvert diagnose (--pid PID | [--wait S] [--keep-running] -- COMMAND ...) [options]",
        description="Sample a running training job and its DataLoader workers with py-spy (wall and "
        "CPU time), classify where the time goes (waiting for batches, JPEG/PNG decode, file reads, "
        "np.load, remote storage, unpickling, augmentation, IPC, model compute), say whether the job "
        "is input-bound and which dsconvert command fixes it. With -- COMMAND, run the command, "
        "sample it after --wait seconds, then stop it (unless --keep-running).",
        parents=[_json("the report", "dsconvert.diagnose/2"), quiet])
    p.add_argument("--pid", type=_positive_int, help="the training process (the one running the loop)")
    p.add_argument("--duration", type=float, default=10.0, metavar="S",
                   help="seconds to sample (default: %(default)s)")
    p.add_argument("--rate", type=_positive_int, default=100, metavar="HZ",
                   help="samples per second (default: %(default)s)")
    p.add_argument("--syscalls", type=float, nargs="?", const=5.0, default=None, metavar="S",
                   help="also trace read/openat latency for S seconds (default 5), per process, and the "
                   "block layer where perf may (the job runs slower while traced)")
    p.add_argument("--tracer", choices=("auto", "perf", "strace"), default="auto",
                   help="with --syscalls: perf trace (light), strace, or auto: perf, strace where perf is "
                   "missing or refused (default: %(default)s)")
    p.add_argument("--wait", type=float, default=10.0, metavar="S",
                   help="with COMMAND: seconds to let it reach its training loop first (default: %(default)s)")
    p.add_argument("--keep-running", action="store_true",
                   help="with COMMAND: let it run to its end after the diagnosis instead of stopping it")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="after --: the training command to launch and diagnose")
    p.set_defaults(func=_cmd_diagnose)

    p = sub.add_parser(
        "verify", help="check an output against its manifest (and its source)",
        description="Check every shard of OUT against the manifest (size, sha256, shard record, the "
        "format's structure; for wds the tar's own headers: unsafe or unindexed members), decode every "
        "sample with --decode, and compare with the source with --source: files missing, extra or "
        "changed since the conversion. Exit status 0 when all is well, 4 when problems were found.",
        parents=[output, _json("the report", "dsconvert.verify/1"), quiet, storage])
    p.add_argument("--decode", action="store_true",
                   help="also read every sample through the reader and decode every image in full")
    p.add_argument("--source", type=_path, metavar="SRC", help="also compare with the source: missing, extra, changed files")
    p.add_argument("--workers", type=_positive_int, metavar="N",
                   help="parallel hashing threads and decoding processes (default: the number of CPUs)")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser(
        "cache", help="copy a remote output's shards to local SSD, verified",
        description="Fetch every shard (and index) of the dsconvert output at URL into CACHE_DIR and verify "
        "each against the manifest's sha256, in parallel. open_dataset(URL, cache_dir=CACHE_DIR) then reads "
        "only the local copies; shards already cached and verified are not fetched again.",
        parents=[_json("the summary"), quiet, storage])
    p.add_argument("url", type=_path, metavar="URL", help="a dsconvert output: s3://bucket/train-wds, gs://..., or a "
                   "path on a network file system")
    p.add_argument("cache_dir", type=_path, metavar="CACHE_DIR", help="a folder on local SSD")
    p.add_argument("--max-size", type=_size, metavar="SIZE", help="the cache's cap, e.g. 500GB: training reads evict the "
                   "least recently used shards beyond it (default: no cap)")
    p.add_argument("--workers", type=_positive_int, default=8, metavar="N",
                   help="shards fetched at once (default: %(default)s)")
    p.set_defaults(func=_cmd_cache)

    p = sub.add_parser("info", help="summarise a dsconvert output from its manifest",
                       description="Print what OUT/dsconvert.json records: format, samples, "
                       "shards, classes and every skipped input with its reason.",
                       parents=[output, storage])
    p.add_argument("--skipped", action="store_true", help="list every skipped input")
    p.set_defaults(func=_cmd_info)
    return parser


def _skip_summary(manifest: Manifest, limit: int) -> List[str]:
    reasons: Counter = Counter()
    for s in manifest.skipped:
        reasons[s["reason"].split(":")[0]] += skips.count_of(s)
    lines = [f"skipped {skips.total(manifest.skipped)} input(s):"]
    lines += [f"  {n:>6}  {reason}" for reason, n in reasons.most_common()]
    for s in manifest.skipped[:limit]:
        lines.append(f"  {s['path']}: {s['reason']}")
    if len(manifest.skipped) > limit:
        more = skips.total(manifest.skipped[limit:])
        lines.append(f"  ... ({more} more; `dsconvert info --skipped OUT`)")
    return lines


def _local_folder(path: str, what: str) -> None:
    """Refuse an output folder that is a file, or lies inside one, naming it: makedirs' own
    error ('File exists', 'Not a directory') does not say which path is wrong."""
    if is_remote(path):
        return
    probe = os.path.abspath(path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if os.path.exists(probe) and not os.path.isdir(probe):
        where = "is a file" if probe == os.path.abspath(path) else f"is inside {probe}, which is a file"
        raise OptionError(f"{what} {path} {where}, not a folder", path)


def _cmd_shard(args: argparse.Namespace) -> int:
    _local_folder(args.output, "the output")
    if args.cluster:
        from .cluster import cluster_executor

        with cluster_executor(args.cluster) as executor:
            return _shard(args, executor)
    return _shard(args, None)


def _shard(args: argparse.Namespace, executor: Any) -> int:
    result = convert(
        args.src, args.output, args.format, layout=args.layout, label=args.label,
        samples_per_shard=args.samples_per_shard, shard_size=args.shard_size,
        workers=args.workers, verify=args.verify, strict=args.strict, overwrite=args.overwrite,
        max_image_pixels=args.max_image_pixels,
        max_sample_bytes=args.max_sample_bytes or None, prefix=args.prefix, decode=args.decode,
        resize=args.resize, size=args.size, decoder=args.decoder, force=args.force,
        max_size=args.max_size, quality=args.quality, min_shards=args.min_shards, progress=not args.quiet,
        storage_options=parse_storage_options(args.storage_option), executor=executor, order=args.order, seed=args.seed,
    )
    m = result.manifest
    if not args.quiet:
        total = sum(s.bytes for s in m.shards)
        if result.already_complete:
            print(f"{result.out_dir} is already complete: {m.num_samples} samples in "
                  f"{len(m.shards)} shard(s); --overwrite rebuilds it")
        else:
            rate = m.num_samples / result.seconds if result.seconds else 0.0
            resumed = f", {result.shards_resumed} kept from an earlier run" if result.shards_resumed else ""
            print(f"wrote {m.num_samples} samples in {len(m.shards)} {m.format} shard(s), "
                  f"{format_size(total)}, to {result.out_dir} in {result.seconds:.1f} s "
                  f"({rate:.0f} samples/s){resumed}")
            if result.idle_workers and m.num_samples >= 2 * MIN_SPREAD_SAMPLES:
                per = max(MIN_SPREAD_SAMPLES, -(-m.num_samples // result.workers))
                print(f"note: {len(m.shards)} shard(s) for {result.workers} workers left {result.idle_workers} "
                      f"idle (one worker writes one shard); --samples-per-shard {per} gives each one work")
        if m.skipped:
            print("\n".join(_skip_summary(m, 10)), file=sys.stderr)
    return EXIT_SKIPPED if m.skipped else 0


def _stderr_log(args: argparse.Namespace) -> Optional[Callable[[str], None]]:
    """Progress lines on stderr, unless -q or --json (stdout then holds only the report)."""
    if args.quiet or getattr(args, "json", False):
        return None
    return lambda msg: print(msg, file=sys.stderr, flush=True)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .analyze import analyze
    from .analyze.report import render_json, render_text

    if not is_remote(args.src) and not os.path.exists(args.src):
        raise SourceError(f"source does not exist: {args.src}", args.src)
    _check_report_path(args.report)
    log = _stderr_log(args)
    report = analyze(args.src, target=args.target, sample=args.sample, seed=args.seed,
                     time_budget=args.time_budget, output_dir=args.output_dir, log=log,
                     progress=not args.quiet and sys.stderr.isatty(),
                     storage_options=parse_storage_options(args.storage_option), transform=args.transform,
                     workers=args.workers, cache=args.cache, label=args.label)
    print(render_json(report) if args.json else render_text(report))
    _write_report(args, "analyze_html", report)
    return 0


def _check_report_path(path: Optional[str]) -> None:
    """Refuse a --report path that cannot be written, before minutes of measuring, not after."""
    if path is None:
        return
    if os.path.isdir(path):
        raise OptionError(f"--report {path} is a folder; give a file name such as report.html", path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OptionError(f"--report {path}: {folder} is not an existing folder", path)
    from .optional import require

    require("matplotlib", "the HTML report")  # its figures: said now, not after the measuring


def _write_report(args: argparse.Namespace, renderer: str, report: dict) -> None:
    if not args.report:
        return
    from . import html_report

    page = getattr(html_report, renderer)(report)
    # names with undecodable bytes (surrogate escapes) show as \udcXX, as on stderr; UTF-8 has no room for them
    page = page.encode("utf-8", "backslashreplace").decode("utf-8")
    path = html_report.write(args.report, page)
    if not args.quiet:
        print(f"report written to {path}", file=sys.stderr)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench, render_text

    _check_report_path(args.report)
    log = _stderr_log(args)
    caches = ("cold", "warm") if args.cache == "both" else (args.cache,)
    report = bench(args.paths, workers=args.workers, batch_sizes=args.batch_size, decode=args.decode,
                   size=args.size, max_samples=args.max_samples, caches=caches, seed=args.seed, log=log,
                   storage_options=parse_storage_options(args.storage_option), transform=args.transform)
    print(json.dumps(report, indent=1) if args.json else render_text(report))
    _write_report(args, "bench_html", report)
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from .diagnose import diagnose, launch, stop
    from .diagnose.report import render_json, render_text
    from .errors import OptionError

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if (args.pid is None) == (not command):
        raise OptionError("give either --pid PID or a command after --, not both or neither")
    log = _stderr_log(args)
    proc = launch(command, args.wait, log or (lambda msg: None)) if command else None
    try:
        report = diagnose(proc.pid if proc else args.pid, duration=args.duration, rate=args.rate,
                          syscalls=args.syscalls, log=log, tracer=args.tracer)
        print(render_json(report) if args.json else render_text(report), flush=True)
    finally:
        if proc is not None and not args.keep_running:
            stop(proc)
    if proc is not None and args.keep_running:
        return proc.wait()
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import EXIT_PROBLEMS, render_text, verify

    _existing_output(args.path)
    log = _stderr_log(args)
    report = verify(args.path, decode=args.decode, source=args.source, workers=args.workers, log=log,
                    storage_options=parse_storage_options(args.storage_option))
    print(json.dumps(report, indent=1) if args.json else render_text(report))
    return 0 if report["ok"] else EXIT_PROBLEMS


def _cmd_cache(args: argparse.Namespace) -> int:
    from .readers.prefetch import prefetch

    _local_folder(args.cache_dir, "the cache folder")
    report = prefetch(args.url, args.cache_dir, args.max_size, parse_storage_options(args.storage_option),
                      args.workers, log=_stderr_log(args))
    if args.json:
        print(json.dumps(report, indent=1))
    elif not args.quiet:
        rate = report["downloaded_bytes"] / report["seconds"] / 1e6 if report["seconds"] else 0.0
        print(f"{report['shards']} shard(s) of {report['url']} in {report['cache_dir']}: {report['downloaded']} "
              f"fetched ({format_size(report['downloaded_bytes'])}, {rate:,.0f} MB/s), {report['already_cached']} "
              f"already cached; all verified against the manifest. Read them with open_dataset({report['url']!r}, "
              f"cache_dir={report['cache_dir']!r})")
    return 0


def _existing_output(path: str) -> None:
    """An OUT that does not exist, or is a file, said as such (not as a missing manifest)."""
    if is_remote(path) or path.endswith(".json"):
        return
    if not os.path.lexists(path):
        raise SourceError(f"{path} does not exist (expected a dsconvert output folder)", path)
    if not os.path.isdir(path):
        raise SourceError(f"{path} is a file, not a dsconvert output folder", path)


def _known(value: Any, missing: str = "unknown") -> str:
    """A manifest value for a message: never 'None' or '' (older or hand-made manifests)."""
    return missing if value is None or value == "" else str(value)


def _cmd_info(args: argparse.Namespace) -> int:
    _existing_output(args.path)
    m = Manifest.load(args.path, parse_storage_options(args.storage_option))
    total = sum(s.bytes for s in m.shards)
    print(f"format:      {m.format} (schema {m.schema_version}, written by {_known(m.created_by)})")
    print(f"source:      {_known(m.source.get('url'))} (layout {_known(m.source.get('layout'))})")
    print(f"samples:     {m.num_samples} ({m.sample_type}, {m.stored})")
    if m.stored == "decoded":
        o = m.options
        shape = f"resize {o['resize']}" if o.get("resize") else (
            f"size {o['size'][0]}x{o['size'][1]}" if o.get("size") else "full size")
        how = (", large JPEGs decoded at 1/2-1/8 DCT scale (covering the size 2.5x over)" if o.get("scaled_decode")
               else "") + (
            f", resized by {o['resampler']}'s bilinear kernel" if o.get("resampler") else "")
        print(f"pixels:      RGB uint8, {shape}, JPEG decoder {_known(o.get('decoder'))}{how}")
    elif m.options.get("max_size"):
        print(f"images:      longer side at most {m.options['max_size']} (larger ones re-encoded, JPEG "
              f"quality {m.options.get('quality')})")
    print(f"shards:      {len(m.shards)}, {format_size(total)}")
    print(f"fields:      {', '.join(f'{k} ({v})' for k, v in m.fields.items()) or 'none'}")
    if m.classes is not None:
        shown = ", ".join(m.classes[:8]) + (", ..." if len(m.classes) > 8 else "")
        print(f"classes:     {len(m.classes)}: {shown}")
    a = m.accounting
    counts = ("files_seen", "files_written", "files_skipped", "files_ignored")
    if all(k in a for k in counts):
        first = m.ignored[0] if m.ignored else None  # hidden files, other files, a tar's members not kept
        print(f"inputs:      {a['files_seen']} seen = {a['files_written']} written + "
              f"{a['files_skipped']} skipped ({a['files_ignored']} ignored"
              + (f"; first: {first.get('path')}: {first.get('reason')}" if first else "") + ")")
    else:
        print(f"inputs:      not recorded; {skips.total(m.skipped)} skipped, {len(m.ignored)} ignored")
    if m.skipped:
        print("\n".join(_skip_summary(m, len(m.skipped) if args.skipped else 10)))
    return 0


_STORAGE_LIBRARIES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "fsspec", "google")


def _storage_error(exc: BaseException) -> bool:
    """An error from a remote storage client (no endpoint, no credentials, access denied...)."""
    return type(exc).__module__.split(".")[0] in _STORAGE_LIBRARIES or isinstance(exc, PermissionError)


def _os_message(exc: OSError) -> str:
    """'permission denied: /data/x': what the system said, and about which path."""
    what = exc.strerror or str(exc) or type(exc).__name__
    what = what[:1].lower() + what[1:]
    names = [os.fsdecode(n) if isinstance(n, bytes) else str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{what}: {' -> '.join(names)}" if names else what


def _message(exc: BaseException) -> str:
    """The one line that stands for ``exc``: every error the CLI can meet, named."""
    if isinstance(exc, DsconvertError):
        return str(exc)
    if isinstance(exc, BrokenProcessPool):
        return ("a worker process died unexpectedly (killed, out of memory, or a crash in a native library); "
                "run the same command again (a conversion resumes where it stopped)")
    if isinstance(exc, OSError) and exc.filename is not None and type(exc).__module__ == "builtins":
        return _os_message(exc)  # a local file: its path says more than a storage hint
    if _storage_error(exc):
        return (f"storage: {type(exc).__name__}: {exc} (check the URL, the credentials and --storage-option, "
                "e.g. client_kwargs.endpoint_url=...)")
    if isinstance(exc, OSError):
        return _os_message(exc)
    if isinstance(exc, MemoryError):
        return "out of memory"
    detail = f": {exc}" if str(exc) else ""
    return f"internal error: {type(exc).__name__}{detail} (set DSCONVERT_DEBUG=1 to see where; please report it)"


_LINE_BREAKS = re.compile(r"\s*[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+\s*")  # what splitlines() splits at


def _one_line(text: str) -> str:
    """Messages quote paths and library errors, which may hold line breaks."""
    return _LINE_BREAKS.sub(" ", text).strip()


@contextlib.contextmanager
def _errors_as_messages() -> Iterator[None]:
    """Every exception becomes ``dsconvert: error: ...`` on one line and exit status 1 (with
    DSCONVERT_DEBUG set, unexpected ones keep their traceback). A broken pipe is main's."""
    try:
        yield
    except BrokenPipeError:
        raise
    except Exception as exc:
        if os.environ.get("DSCONVERT_DEBUG") and not isinstance(exc, DsconvertError):
            raise
        red = "\033[31m" if sys.stderr.isatty() and not os.environ.get("NO_COLOR") else ""
        reset = "\033[0m" if red else ""
        print(f"{red}dsconvert: error:{reset} {_one_line(_message(exc))}", file=sys.stderr)
        raise SystemExit(1) from None


@contextlib.contextmanager
def _tolerant_streams() -> Iterator[None]:
    """Names with undecodable bytes (surrogate escapes) print as escapes instead of raising
    UnicodeEncodeError on a strict stdout (PYTHONIOENCODING=utf-8, some locales)."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            try:
                stream.reconfigure(errors="backslashreplace")
                changed.append(stream)
            except (ValueError, OSError):
                pass
    try:
        yield
    finally:
        for stream in changed:
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="strict")


def _pipe_closed(stream: Any) -> bool:
    """Whether ``stream`` is a pipe whose reader has gone (``dsconvert info OUT | head -1``)."""
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _silence(streams: List[Any]) -> None:
    """Point the closed output at /dev/null, so the interpreter's last flush does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in streams:
            with contextlib.suppress(AttributeError, OSError, ValueError):
                os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


def _exit_status(code: Any) -> int:
    """SystemExit's code as a status: None is 0, a message is printed and is 1."""
    if code is None or isinstance(code, int):
        return int(code or 0)
    print(f"dsconvert: error: {_one_line(str(code))}", file=sys.stderr)
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line ``argv``; return the exit status (see the parser's epilog)."""
    with _tolerant_streams():
        try:
            args = build_parser().parse_args(argv)
            with _errors_as_messages():
                status = args.func(args)
                sys.stdout.flush()  # here, so that a closed pipe is seen here and not at exit
                return status
        except KeyboardInterrupt:
            print("dsconvert: interrupted; run the same command again to resume", file=sys.stderr)
            return 130
        except BrokenPipeError as exc:
            closed = [s for s in (sys.stdout, sys.stderr) if _pipe_closed(s)]
            if closed:  # the reader stopped reading: nothing more to say, and nowhere to say it
                _silence(closed)
                return 141  # as a process killed by SIGPIPE, which is what `cat` would do
            print(f"dsconvert: error: {_one_line(_message(exc))}", file=sys.stderr)
            return 1
        except SystemExit as exc:
            return _exit_status(exc.code)
