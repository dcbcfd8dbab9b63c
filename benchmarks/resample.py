"""Benchmark: the antialiased resize of the standard ImageNet transforms, dsconvert's window
kernel (dsconvert.resample) against torch's own (what torchvision runs on uint8 tensors),
OpenCV's INTER_AREA (FFCV's) and Pillow's (torchvision on PIL images), on the same decoded
photos, one thread each, in interleaved rounds (a shuffled order per round); median and range
of ms per image and of the ratio to torch per round.

    python -m benchmarks resample --photos 1000 --rounds 7 --json docs/bench/resample.json

dsconvert_plain_c is the kernel's portable loops, which run nowhere by default (where AVX2 is
missing, torch resizes): for the record.

eval: Resize(256) + CenterCrop(224) (dsconvert: the crop's pixels only; torch: the whole
resize, then the crop; OpenCV: FFCV's centre crop of ratio 224/256, then the resize). train:
a RandomResizedCrop(224) box, seeded, resized to 224 x 224. dsconvert's and torch's pixels are
checked equal before timing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
from typing import Any, Callable, Dict, List

from benchmarks.common import interleaved, meta


def resizers(kind: str, images: List, boxes: List) -> Dict[str, Callable[[int], object]]:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from PIL import Image

    from dsconvert import resample
    from dsconvert.geometry import resized_size

    torch.set_num_threads(1)
    out: Dict[str, Callable[[int], object]] = {}

    def nchw(pixels):
        return torch.from_numpy(pixels).permute(2, 0, 1)[None]

    if kind == "eval":
        def plan(i):
            h, w = images[i].shape[:2]
            target = resized_size(h, w, 256)
            return (h, w), target, (int(round((target[0] - 224) / 2.0)), int(round((target[1] - 224) / 2.0)))

        plans = [plan(i) for i in range(len(images))]

        def torch_full(i):
            (h, w), target, (top, left) = plans[i]
            return F.interpolate(nchw(images[i]), size=target, mode="bilinear", antialias=True)[0, :, top:top + 224,
                                                                                                 left:left + 224]

        def kernel(i, simd=True):
            shape, target, (top, left) = plans[i]
            return resample.resize_window(images[i], (0, 0), shape, target, (top, left, 224, 224), "bilinear",
                                          simd=simd)

        def pillow(i):
            (h, w), target, (top, left) = plans[i]
            img = Image.fromarray(images[i]).resize((target[1], target[0]), Image.Resampling.BILINEAR)
            return np.asarray(img)[top:top + 224, left:left + 224]

        out["torch"], out["dsconvert"], out["pillow"] = torch_full, kernel, pillow
        try:
            import cv2

            cv2.setNumThreads(1)

            def ffcv_like(i):  # CenterCropRGBImageDecoder: a centre square of 224/256 of the short side
                h, w = images[i].shape[:2]
                side = int(min(h, w) * 224 / 256)
                top, left = (h - side) // 2, (w - side) // 2
                return cv2.resize(images[i][top:top + side, left:left + side], (224, 224),
                                  interpolation=cv2.INTER_AREA)

            out["opencv_area"] = ffcv_like
        except ImportError:
            print("OpenCV: not installed", file=sys.stderr)
    else:
        def torch_box(i):
            top, left, h, w = boxes[i]
            return F.interpolate(nchw(images[i][top:top + h, left:left + w]), size=(224, 224), mode="bilinear",
                                 antialias=True)[0]

        def kernel(i, simd=True):
            top, left, h, w = boxes[i]
            return resample.resize_window(images[i], (-top, -left), (h, w), (224, 224), (0, 0, 224, 224), "bilinear",
                                          simd=simd)

        def pillow(i):
            top, left, h, w = boxes[i]
            return np.asarray(Image.fromarray(images[i]).resize((224, 224), Image.Resampling.BILINEAR,
                                                                box=(left, top, left + w, top + h)))

        out["torch"], out["dsconvert"], out["pillow"] = torch_box, kernel, pillow
        try:
            import cv2

            cv2.setNumThreads(1)
            out["opencv_area"] = lambda i: cv2.resize(images[i][boxes[i][0]:boxes[i][0] + boxes[i][2],
                                                                boxes[i][1]:boxes[i][1] + boxes[i][3]],
                                                      (224, 224), interpolation=cv2.INTER_AREA)
        except ImportError:
            pass
    out["dsconvert_plain_c"] = lambda i: out["dsconvert"](i, simd=False)  # type: ignore[call-arg]
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--photos", type=int, default=1000)
    ap.add_argument("--folder", help="JPEGs to resize (default: the demo photos)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    from PIL import Image

    from dsconvert import resample
    from dsconvert.fused import rrc_box

    if not resample.available("bilinear"):
        sys.exit("dsconvert's resize kernel does not run here (not built, or no AVX2)")
    folder = args.folder
    if folder is None:
        from dsconvert.demo import PHOTOS, load_photos, make_demo_dataset

        folder = os.path.join(tempfile.gettempdir(), f"dsconvert-bench-decode-{args.photos}")
        classes = len(load_photos(PHOTOS))
        make_demo_dataset(folder, num_per_class=-(-args.photos // classes))
    paths = sorted(glob.glob(os.path.join(folder, "**", "*.jp*g"), recursive=True))[: args.photos]
    images = [np.array(Image.open(p).convert("RGB")) for p in paths]
    torch.manual_seed(0)
    boxes = [rrc_box(im.shape[0], im.shape[1], (0.08, 1.0), (3 / 4, 4 / 3)) for im in images]
    print(f"{len(images)} photos, median {int(np.median([im.shape[1] for im in images]))}x"
          f"{int(np.median([im.shape[0] for im in images]))}", flush=True)
    rows = []
    for kind in ("train", "eval"):
        fns = resizers(kind, images, boxes)
        for i in range(len(images)):  # the kernel is torch's, pixel for pixel
            a, b = fns["dsconvert"](i), fns["torch"](i)
            assert np.array_equal(np.asarray(a).transpose(2, 0, 1), b.numpy()), (kind, i)
        seconds = interleaved({name: (lambda fn=fn: [fn(i) for i in range(len(images))]) for name, fn in fns.items()},
                              args.rounds)
        ms = {name: [t / len(images) * 1e3 for t in ts] for name, ts in seconds.items()}
        ratios = {name: [t / own for t, own in zip(ms["torch"], ms[name])] for name in fns}
        for name in fns:
            row = {"kind": kind, "resizer": name, "median_ms": statistics.median(ms[name]), "min_ms": min(ms[name]),
                   "max_ms": max(ms[name]), "speed_vs_torch": statistics.median(ratios[name]),
                   "speed_vs_torch_min": min(ratios[name]), "speed_vs_torch_max": max(ratios[name]), "rounds": ms[name]}
            rows.append(row)
            print(f"{kind:5s} {name:12s} {row['median_ms']:.3f} ms [{row['min_ms']:.3f}-{row['max_ms']:.3f}]  "
                  f"{row['speed_vs_torch']:.2f}x torch's speed [{row['speed_vs_torch_min']:.2f}-"
                  f"{row['speed_vs_torch_max']:.2f}]", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta(), "images": len(images), "rounds": args.rounds, "rows": rows}, f, indent=1)


QUICK = ["--photos", "8", "--rounds", "1"]
TABLES: Dict[str, Any] = {}  # its figures are quoted in the prose of docs/benchmarks.md, no generated table
