"""Benchmark: JPEG decode to RGB pixels, Pillow against PyTurboJPEG and simplejpeg, in
interleaved rounds (each decoder once per round, in a shuffled order, over the same bytes in
memory, one process), median and range of images/s and of the ratio to Pillow per round.

    python -m benchmarks decode --photos 1000 --rounds 7 --json docs/bench/decode.json

The photos are the demo's (scikit-image's photographs, ~45 kB JPEGs); ``--folder`` takes any
folder of JPEGs instead. Full-size decode, and at DCT scale 1/2 (what ``decode="fused"`` and
analyze's checks use) where the decoder offers it.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import statistics
import sys
import tempfile
from typing import Any, Callable, Dict

from benchmarks.common import fmt_range, interleaved, meta


def decoders(half: bool) -> Dict[str, Callable[[bytes], object]]:
    import numpy as np
    from PIL import Image

    def pil(data: bytes) -> object:
        with Image.open(io.BytesIO(data)) as im:
            if half:
                im.draft("RGB", (im.width // 2, im.height // 2))
            return np.asarray(im.convert("RGB"))

    out: Dict[str, Callable[[bytes], object]] = {"pillow": pil}
    try:
        from turbojpeg import TJPF_RGB, TurboJPEG

        tj = TurboJPEG()
        out["pyturbojpeg"] = (lambda d: tj.decode(d, pixel_format=TJPF_RGB, scaling_factor=(1, 2))) if half else \
            (lambda d: tj.decode(d, pixel_format=TJPF_RGB))
    except Exception as exc:  # libturbojpeg missing or too old
        if not half:
            print(f"PyTurboJPEG: not measured ({exc})", file=sys.stderr)
    try:
        import simplejpeg

        out["simplejpeg"] = (lambda d: simplejpeg.decode_jpeg(d, "RGB", min_height=1, min_width=1)) if not half \
            else (lambda d: simplejpeg.decode_jpeg(d, "RGB", min_factor=2))
    except ImportError:
        if not half:
            print("simplejpeg: not installed", file=sys.stderr)
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--photos", type=int, default=1000)
    ap.add_argument("--folder", help="JPEGs to decode (default: the demo photos)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    folder = args.folder
    if folder is None:
        from dsconvert.demo import PHOTOS, load_photos, make_demo_dataset

        folder = os.path.join(tempfile.gettempdir(), f"dsconvert-bench-decode-{args.photos}")
        classes = len(load_photos(PHOTOS))  # those this scikit-image ships
        make_demo_dataset(folder, num_per_class=-(-args.photos // classes))
    paths = sorted(glob.glob(os.path.join(folder, "**", "*.jp*g"), recursive=True))[: args.photos]
    blobs = [open(p, "rb").read() for p in paths]
    print(f"{len(blobs)} JPEGs, mean {sum(map(len, blobs)) / len(blobs) / 1e3:.0f} kB", flush=True)
    rows = []
    for half in (False, True):
        fns = decoders(half)
        seconds = interleaved({name: (lambda fn=fn: [fn(b) for b in blobs]) for name, fn in fns.items()}, args.rounds)
        rates = {name: [len(blobs) / t for t in ts] for name, ts in seconds.items()}
        ratios = {name: [r / p for r, p in zip(rates[name], rates["pillow"])] for name in fns}
        for name in fns:
            row = {"decoder": name, "scale": "1/2" if half else "1", "median_per_s": statistics.median(rates[name]),
                   "min_per_s": min(rates[name]), "max_per_s": max(rates[name]),
                   "vs_pillow": statistics.median(ratios[name]), "vs_pillow_min": min(ratios[name]),
                   "vs_pillow_max": max(ratios[name]), "rounds": rates[name]}
            rows.append(row)
            print(f"scale {row['scale']:3s} {name:12s} {row['median_per_s']:7.0f}/s "
                  f"[{row['min_per_s']:.0f}-{row['max_per_s']:.0f}]  {row['vs_pillow']:.2f}x Pillow "
                  f"[{row['vs_pillow_min']:.2f}-{row['vs_pillow_max']:.2f}]", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta(), "images": len(blobs), "rounds": args.rounds, "rows": rows}, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    lines = [f"{data['images']:,} JPEGs in memory, {data['rounds']} interleaved rounds, one process; images/s and "
             "the per-round ratio to Pillow, median [range].", "",
             "| scale | decoder | images/s | vs Pillow |", "| --- | --- | --- | --- |"]
    for r in data["rows"]:
        lines.append(f"| {r['scale']} | {r['decoder']} "
                     f"| {fmt_range(r['median_per_s'], r['min_per_s'], r['max_per_s'])} "
                     f"| {fmt_range(r['vs_pillow'], r['vs_pillow_min'], r['vs_pillow_max'], '{:.2f}x')} |")
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "24", "--rounds", "1"]
TABLES = {"decode": {"argv": lambda a: ["--photos", "1000", "--rounds", str(a.rounds + 4)], "render": render}}
