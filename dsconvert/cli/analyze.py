"""``dsconvert analyze``: its parser and its handler."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import SourceError
from ..io.location import is_remote, parse_storage_options
from .args import Shared, json_option, path_arg, positive_float, positive_int, seconds
from .common import check_report_path, stderr_log, write_report

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser(
        "analyze", help="find why loading SRC is slow, and the command that fixes it",
        description="Say what SRC holds (a source of files, a dsconvert output, or another training "
        "format), measure it at rest (inventory, read latency and throughput cold and warm, 1..N "
        "concurrent readers, decode cost per codec and library) and through a real DataLoader with "
        "the machine's workers and a reference transform: as it is, from memory, and as each output "
        "made from the sample. Then name the bottleneck and the command that removes it, with the "
        "samples/s each output measured.",
        parents=[json_option("the report", "dsconvert.analyze/2"), shared.report, shared.quiet, shared.storage])
    p.add_argument("src", type=path_arg, metavar="SRC",
                   help="source folder, list file, tar shards, Parquet file(s) or dsconvert output")
    p.add_argument("--label", metavar="FIELD",
                   help="tar shards and Parquet: where the class label is (cls, json.label, a column; "
                   "default: cls when every sampled tar sample has one, Parquet's ClassLabel column)")
    p.add_argument("--target", type=positive_float, metavar="N",
                   help="samples/s the GPUs consume: say whether the loader keeps up")
    p.add_argument("--sample", type=positive_int, default=256, metavar="N",
                   help="files to measure, stratified by folder and size (default: %(default)s)")
    p.add_argument("--transform", default="eval", metavar="T",
                   help="what each sample goes through in the DataLoader passes: eval (resize 256, centre "
                   "crop 224), train (random resized crop 224 + flip), module:callable (your own), none "
                   "(default: %(default)s)")
    p.add_argument("--workers", type=positive_int, metavar="N",
                   help="DataLoader workers of the passes (default: the CPUs available)")
    p.add_argument("--cache", choices=("auto", "cold", "warm"), default="auto",
                   help="which passes predict training: warm (epochs after the first, read from the page "
                   "cache), cold, or auto: warm when the data fits in half the memory (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--time-budget", type=seconds, default=30.0, metavar="S",
                   help="seconds for the inventory walk; beyond it the rest is estimated (default: %(default)s)")
    p.add_argument("--output-dir", type=path_arg, metavar="DIR",
                   help="where a conversion would go: the outputs are measured there, its free space decides "
                   "which fit, and the commands write there (default: beside a local source; the current "
                   "folder for a remote source or one on network storage)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analyze import analyze
    from ..analyze.report import render_json, render_text

    if not is_remote(args.src) and not os.path.exists(args.src):
        raise SourceError(f"source does not exist: {args.src}", args.src)
    check_report_path(args.report)
    log = stderr_log(args)
    report = analyze(args.src, target=args.target, sample=args.sample, seed=args.seed,
                     time_budget=args.time_budget, output_dir=args.output_dir, log=log,
                     progress=not args.quiet and sys.stderr.isatty(),
                     storage_options=parse_storage_options(args.storage_option), transform=args.transform,
                     workers=args.workers, cache=args.cache, label=args.label)
    print(render_json(report) if args.json else render_text(report))
    write_report(args, "analyze_html", report)
    return 0
