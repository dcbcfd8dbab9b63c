"""``dsconvert upgrade``: its parser and its handler."""

from __future__ import annotations

import argparse
import sys

from ..io.location import parse_storage_options
from ..upgrade import upgrade
from .args import Shared
from .common import existing_output

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser("upgrade", help="bring an output of an earlier dsconvert to today's layout, in place",
                       description="Rewrite the JSON shard records of an output written by an earlier dsconvert "
                       "as binary records (memory-mapped by readers: memory that does not grow with the dataset). "
                       "Shards are not touched; each record is checked against the manifest first.",
                       parents=[shared.output, shared.storage])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    existing_output(args.path)
    result = upgrade(args.path, parse_storage_options(args.storage_option),
                     log=lambda msg: print(msg, file=sys.stderr))
    if result["records"]:
        print(f"upgraded {args.path}: {result['records']} shard record(s) now binary "
              f"({result['bytes_before']:,} -> {result['bytes_after']:,} bytes)")
    elif result["removed"]:
        print(f"{args.path} was upgraded: {result['removed']} JSON record(s) a killed run left behind removed")
    else:
        print(f"{args.path} is up to date: nothing to upgrade")
    return 0
