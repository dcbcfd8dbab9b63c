"""``dsconvert bench``: its parser and its handler."""

from __future__ import annotations

import argparse
import json

from ..codecs import DECODE_MODES
from ..io.location import parse_storage_options
from .args import Shared, int_list, json_option, path_arg, positive_int
from .common import check_report_path, stderr_log, write_report

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser(
        "bench", help="measure DataLoader throughput of sources and converted outputs",
        description="Read each PATH (a source tree, read file by file as ImageFolder does, or a "
        "dsconvert output) through a real torch DataLoader for every worker count and batch size, "
        "cold (page cache evicted) and warm, and print samples/s, MB/s, the wait for each batch and "
        "the workers' CPU use. Several PATHs are compared config by config: before and after "
        "conversion in one command.",
        parents=[json_option("the report", "dsconvert.bench/1"), shared.report, shared.quiet, shared.storage])
    p.add_argument("paths", nargs="+", type=path_arg, metavar="PATH",
                   help="source folders, list files or dsconvert outputs")
    p.add_argument("--workers", type=int_list(0), metavar="N,N,...",
                   help="DataLoader worker counts to sweep (default: 0,1,2,4,... up to the CPUs)")
    p.add_argument("--batch-size", type=int_list(1), default=[64], metavar="N,N,...",
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
    p.add_argument("--max-samples", type=positive_int, default=2000, metavar="N",
                   help="samples per pass: a seeded random subset of map-style datasets, the first N "
                   "of wds shards (default: %(default)s)")
    p.add_argument("--cache", choices=("both", "cold", "warm"), default="both",
                   help="page cache state of the passes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="subset seed (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench import bench, render_text

    check_report_path(args.report)
    log = stderr_log(args)
    caches = ("cold", "warm") if args.cache == "both" else (args.cache,)
    report = bench(args.paths, workers=args.workers, batch_sizes=args.batch_size, decode=args.decode,
                   size=args.size, max_samples=args.max_samples, caches=caches, seed=args.seed, log=log,
                   storage_options=parse_storage_options(args.storage_option), transform=args.transform)
    print(json.dumps(report, indent=1) if args.json else render_text(report))
    write_report(args, "bench_html", report)
    return 0
