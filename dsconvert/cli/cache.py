"""``dsconvert cache``: its parser and its handler."""

from __future__ import annotations

import argparse
import json

from ..io.location import parse_storage_options
from ..units import format_size
from .args import Shared, byte_size, json_option, path_arg, positive_int
from .common import local_folder, stderr_log

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser(
        "cache", help="copy a remote output's shards to local SSD, verified",
        description="Fetch every shard (and index) of the dsconvert output at URL into CACHE_DIR and verify "
        "each against the manifest's sha256, in parallel. open_dataset(URL, cache_dir=CACHE_DIR) then reads "
        "only the local copies; shards already cached and verified are not fetched again.",
        parents=[json_option("the summary"), shared.quiet, shared.storage])
    p.add_argument("url", type=path_arg, metavar="URL",
                   help="a dsconvert output: s3://bucket/train-wds, gs://..., or a path on a network file system")
    p.add_argument("cache_dir", type=path_arg, metavar="CACHE_DIR", help="a folder on local SSD")
    p.add_argument("--max-size", type=byte_size, metavar="SIZE",
                   help="the cache's cap, e.g. 500GB: training reads evict the least recently used shards beyond it "
                   "(default: no cap)")
    p.add_argument("--workers", type=positive_int, default=8, metavar="N",
                   help="shards fetched at once (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..readers.prefetch import prefetch

    local_folder(args.cache_dir, "the cache folder")
    report = prefetch(args.url, args.cache_dir, args.max_size, parse_storage_options(args.storage_option),
                      args.workers, log=stderr_log(args))
    if args.json:
        print(json.dumps(report, indent=1))
    elif not args.quiet:
        rate = report["downloaded_bytes"] / report["seconds"] / 1e6 if report["seconds"] else 0.0
        print(f"{report['shards']} shard(s) of {report['url']} in {report['cache_dir']}: {report['downloaded']} "
              f"fetched ({format_size(report['downloaded_bytes'])}, {rate:,.0f} MB/s), {report['already_cached']} "
              f"already cached; all verified against the manifest. Read them with open_dataset({report['url']!r}, "
              f"cache_dir={report['cache_dir']!r})")
    return 0
