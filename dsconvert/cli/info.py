"""``dsconvert info``: its parser and its handler."""

from __future__ import annotations

import argparse
from typing import Any

from .. import skips
from ..codecs import SUFFIX
from ..io.location import parse_storage_options
from ..manifest import Manifest
from ..units import format_size
from .args import Shared
from .common import existing_output, skip_summary

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], shared: Shared) -> None:
    p = sub.add_parser("info", help="summarise a dsconvert output from its manifest",
                       description="Print what OUT/dsconvert.json records: format, samples, "
                       "shards, classes and every skipped input with its reason.",
                       parents=[shared.output, shared.storage])
    p.add_argument("--skipped", action="store_true", help="list every skipped input")
    p.set_defaults(func=run)


def _known(value: Any, missing: str = "unknown") -> str:
    """A manifest value for a message: never 'None' or '' (older or hand-made manifests)."""
    return missing if value is None or value == "" else str(value)


def run(args: argparse.Namespace) -> int:
    existing_output(args.path)
    m = Manifest.load(args.path, parse_storage_options(args.storage_option))
    total = sum(s.bytes for s in m.shards)
    print(f"format:      {m.format} (schema {m.schema_version}, written by {_known(m.created_by)})")
    print(f"source:      {_known(m.source.get('url'))} (layout {_known(m.source.get('layout'))})")
    print(f"samples:     {m.num_samples} ({m.sample_type}, {m.stored})")
    if m.source.get("chosen"):
        print(f"chosen:      {m.source['chosen']}")
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
    if m.options.get("jpeg_restart"):
        print("jpegs:       rewritten losslessly with a restart marker every MCU (the source's pixels, not its "
              "bytes): decode=\"fused\" decodes only what a crop needs")
    print(f"shards:      {len(m.shards)}, {format_size(total)}")
    print(f"fields:      {', '.join(f'{k} ({v})' for k, v in m.fields.items()) or 'none'}")
    if m.compression is not None:
        c = m.compression
        print(f"compressed:  {c['codec']} level {c['level']}: {', '.join(c['fields']) or 'no field'} "
              f"(members KEY.FIELD.{SUFFIX}; read back decompressed)")
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
        print("\n".join(skip_summary(m, len(m.skipped) if args.skipped else 10)))
    return 0
