"""``dsconvert shard``: its parser and its handler."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..codecs import DECODERS, DEFAULT_LEVEL, MAX_LEVEL
from ..convert import EXIT_SKIPPED, convert
from ..formats import FORMATS
from ..io.location import parse_storage_options
from ..plan import MAX_SAMPLE_BYTES, MIN_SHARDS, MIN_SPREAD_SAMPLES
from ..shuffle import ORDERS
from ..source import LAYOUTS
from ..units import format_size
from .args import (
    Shared,
    byte_limit,
    byte_size,
    compression,
    height_width,
    path_arg,
    positive_int,
    quality,
    quiet_option,
)
from .common import local_folder, skip_summary

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser(
        "shard",
        help="convert a dataset of many small files into shards",
        description="Convert SRC (a folder, a CSV/JSONL list of path,label, tar shards another "
        "tool wrote, Parquet files, or a dsconvert output) into shards in OUT. Every input ends "
        "up in a shard or in the manifest's skipped list with its reason. Killed runs resume "
        "when the same command is run again.",
        parents=[quiet_option("no progress bars or summary"), shared.storage],
    )
    p.add_argument("src", type=path_arg, metavar="SRC",
                   help="source folder (ImageFolder or flat), list file, folder or brace pattern of tar "
                   "shards (.tar, .tar.gz, .tar.zst...), .parquet file(s), a Hugging Face save_to_disk folder "
                   "(.arrow), or a dsconvert output (re-conversion)")
    p.add_argument("-o", "--output", required=True, type=path_arg, metavar="OUT", help="output folder")
    p.add_argument("--format", choices=sorted(FORMATS), default="wds",
                   help="output format: wds = WebDataset tar shards; hdf5 = HDF5 files (encoded "
                   "bytes, or pixels with --decode); npy = decoded, memory-mappable pixel cache "
                   "for local SSD (default: %(default)s)")
    p.add_argument("--layout", choices=LAYOUTS, default="auto",
                   help="source layout; auto detects ImageFolder class folders, flat "
                   "basename-grouped files with sidecars, a list file, tar shards, Parquet files or a "
                   "dsconvert output (default: %(default)s)")
    labels = p.add_mutually_exclusive_group()
    labels.add_argument("--label", metavar="FIELD",
                        help="tar shards and Parquet/Arrow: where the class label is (cls, a JSON key such as "
                        "json.label, or a column); makes (image, label) samples. Parquet/Arrow find it by "
                        "themselves: the one ClassLabel column, else an integer column named label or labels")
    labels.add_argument("--no-label", dest="label", action="store_const", const=False,
                        help="Parquet/Arrow: no label column, dict samples keeping every column (the image and json)")
    p.add_argument("--samples-per-shard", type=positive_int, default=10000, metavar="N",
                   help="at most N samples per shard (default: %(default)s)")
    p.add_argument("--shard-size", type=byte_size, default="1GB", metavar="SIZE",
                   help="at most SIZE bytes per shard, e.g. 512MB, 1GiB; whichever limit comes "
                   "first ends a shard (default: %(default)s)")
    p.add_argument("--min-shards", type=positive_int, default=MIN_SHARDS, metavar="N",
                   help="spread a source the limits would pack into fewer shards over up to N of "
                   "them (at least 64 samples each), so that N workers have work; 1 keeps the "
                   "limits' plan (default: %(default)s)")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
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
    p.add_argument("--max-sample-bytes", type=byte_limit, default=MAX_SAMPLE_BYTES, metavar="SIZE",
                   help="skip an input value larger than SIZE before reading or decoding it (e.g. 256MiB; "
                   "0: no limit; default: 64MiB), the byte bound beside the pixel bound")
    p.add_argument("--max-image-pixels", type=positive_int, default=None, metavar="N",
                   help="skip images with more pixels than N as decompression bombs "
                   "(default: Pillow's MAX_IMAGE_PIXELS)")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default: %(default)s)")
    p.add_argument("--order", choices=ORDERS, default="auto",
                   help="the order the shards store samples in: shuffled (seeded by --seed, so that a streaming "
                   "read mixes classes like a uniform shuffle), or the source's; auto: shuffled for labelled "
                   "samples in wds shards, the source's otherwise. Random access returns the source's order "
                   "either way (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of --order shuffled (default: %(default)s)")
    e = p.add_argument_group("encoded outputs (wds, hdf5)")
    e.add_argument("--max-size", type=positive_int, metavar="PIXELS", default=None,
                   help="re-encode images whose longer side exceeds PIXELS to that size, once, so that "
                   "training never decodes pixels it throws away (JPEG at --quality; PNG, WebP lossless)")
    e.add_argument("--quality", type=quality, default=90, metavar="Q",
                   help="JPEG quality of images re-encoded by --max-size (default: %(default)s, as FFCV)")
    e.add_argument("--jpeg-restart", action="store_true",
                   help="rewrite every JPEG losslessly with a restart marker every MCU (the same pixels, ~6%% more "
                   "bytes), so that decode=\"fused\" decodes only the part of each image a crop needs "
                   "(about a quarter less CPU for RandomResizedCrop); the stored bytes are then not the source's")
    e.add_argument("--compress", type=compression, default=None, metavar="zstd[:LEVEL]",
                   help=f"wds: store every non-image field (npy, json, txt...; not images, labels or files "
                   f"compressed already) zstd-compressed, as member KEY.FIELD.zst, at LEVEL 1..{MAX_LEVEL} "
                   f"(default: {DEFAULT_LEVEL}); dsconvert's readers decompress them (pip install 'dsconvert[zstd]')")
    d = p.add_argument_group("decoded outputs (--format npy, or hdf5 with --decode)")
    d.add_argument("--decode", action="store_true",
                   help="hdf5: store decoded RGB pixels instead of the encoded bytes")
    size = d.add_mutually_exclusive_group()
    size.add_argument("--resize", type=positive_int, metavar="SHORT",
                      help="resize the shorter side to SHORT pixels (aspect kept; Pillow's bilinear "
                      "filter, as torchvision's Resize(SHORT) on PIL images)")
    size.add_argument("--size", type=height_width, metavar="HxW",
                      help="resize every image to exactly H x W pixels (bilinear)")
    d.add_argument("--decoder", choices=DECODERS, default="auto",
                   help="JPEG decoder: auto = PyTurboJPEG or simplejpeg when they load (within one "
                   "level of Pillow on average; with --resize/--size large JPEGs are decoded at reduced DCT "
                   "scale), pil = Pillow's exact pixels and resize (default: %(default)s)")
    d.add_argument("--force", action="store_true",
                   help="write even when the estimated output is larger than the free space")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    local_folder(args.output, "the output")
    if args.cluster:
        from ..cluster import cluster_executor

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
        compress=args.compress, jpeg_restart=args.jpeg_restart,
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
        columns = sorted({e["path"].rsplit("/column ", 1)[1] for e in m.ignored
                          if "/column " in e["path"] and "--no-label" in e["reason"]})
        if columns:  # a label column was found or named: say what the samples leave out, and how to keep it
            print(f"note: (image, label) samples; column(s) not kept: {', '.join(columns)} (--no-label keeps every "
                  "column, as dict samples)")
        if m.skipped:
            print("\n".join(skip_summary(m, 10)), file=sys.stderr)
    return EXIT_SKIPPED if m.skipped else 0
