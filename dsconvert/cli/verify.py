"""``dsconvert verify``: its parser and its handler."""

from __future__ import annotations

import argparse
import json

from ..io.location import parse_storage_options
from .args import Shared, json_option, path_arg, positive_int
from .common import existing_output, stderr_log

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser(
        "verify", help="check an output against its manifest (and its source)",
        description="Check every shard of OUT against the manifest (size, sha256, shard record, the "
        "format's structure; for wds the tar's own headers: unsafe or unindexed members), decode every "
        "sample with --decode, and compare with the source with --source: files missing, extra or "
        "changed since the conversion. Exit status 0 when all is well, 4 when problems were found.",
        parents=[shared.output, json_option("the report", "dsconvert.verify/1"), shared.quiet, shared.storage])
    p.add_argument("--decode", action="store_true",
                   help="also read every sample through the reader and decode every image in full")
    p.add_argument("--source", type=path_arg, metavar="SRC",
                   help="also compare with the source: missing, extra, changed files")
    p.add_argument("--workers", type=positive_int, metavar="N",
                   help="parallel hashing threads and decoding processes (default: the number of CPUs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..verify import EXIT_PROBLEMS, render_text, verify

    existing_output(args.path)
    log = stderr_log(args)
    report = verify(args.path, decode=args.decode, source=args.source, workers=args.workers, log=log,
                    storage_options=parse_storage_options(args.storage_option))
    print(json.dumps(report, indent=1) if args.json else render_text(report))
    return 0 if report["ok"] else EXIT_PROBLEMS
