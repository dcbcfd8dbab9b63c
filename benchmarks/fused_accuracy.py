"""How far ``decode="fused"`` samples are from torchvision's, per filter, output size and content.

Each transform is run by torchvision on the whole decoded image (``decode="pil"``, what
ImageFolder gives it) and by dsconvert's fused path on the JPEG's bytes, on the same seeds
(the same crop boxes); the figure is the largest mean absolute difference in levels (0-255)
over the seeds. Contents: a photograph (scikit-image's astronaut at 1600x1600), and a page of
black text on white at 1601x1203, at JPEG quality 75 and 5 (4:2:0). The DCT-domain reduction
(1/2, 1/4, 1/8) is where fused pixels part from torchvision's; it is taken for bilinear and
bicubic only, when the reduced image still covers the output 2.5 times over.

    python -m benchmarks fused_accuracy --json docs/bench/fused_accuracy.json
"""

from __future__ import annotations

import argparse
import io
import json
from typing import Any, Dict, Tuple

import numpy as np

from benchmarks import common


def text_page(quality: int) -> bytes:
    from PIL import Image, ImageDraw

    page = Image.new("RGB", (1601, 1203), "white")
    draw = ImageDraw.Draw(page)
    for row in range(0, 1190, 14):
        draw.text((8, row), "The quick brown fox jumps over the lazy dog 0123456789 " * 6, fill="black")
    buf = io.BytesIO()
    page.save(buf, "JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


def photograph(quality: int) -> bytes:
    from PIL import Image
    from skimage import data

    img = Image.fromarray(data.astronaut()).resize((1600, 1600), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def transforms(sizes: Tuple[int, ...] = (32, 56, 96, 224)) -> Dict[str, Any]:
    import torchvision.transforms as T

    out: Dict[str, Any] = {}
    for name in ("bilinear", "bicubic", "nearest"):
        mode = getattr(T.InterpolationMode, name.upper())
        for size in sizes:
            out[f"RandomResizedCrop({size}), {name}"] = T.Compose(
                [T.RandomResizedCrop(size, interpolation=mode), T.PILToTensor()])
            out[f"Resize({size * 8 // 7}) + CenterCrop({size}), {name}"] = T.Compose(
                [T.Resize(size * 8 // 7, interpolation=mode), T.CenterCrop(size), T.PILToTensor()])
    out["Resize(30, max_size=40), bilinear"] = T.Compose([T.Resize(30, max_size=40), T.PILToTensor()])
    return out


def distance(transform: Any, data: bytes, seeds: int) -> float:
    import torch

    from dsconvert.codecs import decode_image
    from dsconvert.fused import fuse

    fused = fuse(transform)
    worst = 0.0
    for seed in range(seeds):
        torch.manual_seed(seed)
        a = np.asarray(fused.from_bytes(data), dtype=np.float64)
        torch.manual_seed(seed)
        b = np.asarray(transform(decode_image(data, "pil")), dtype=np.float64)
        worst = max(worst, float(np.abs(a - b).mean()))
    return worst


def render(data: Dict[str, Any]) -> str:
    names = list(data["contents"])
    lines = ["| transform | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for name, row in data["rows"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in names) + " |")
    return "\n".join(lines) + "\n"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--sizes", default="32,56,96,224", help="output sizes, comma-separated")
    ap.add_argument("--json", default=None)


def run(a: argparse.Namespace) -> None:
    contents = {"photograph, q75": photograph(75), "text, q75": text_page(75), "text, q5": text_page(5)}
    chosen = transforms(tuple(int(x) for x in a.sizes.split(",")))
    rows = {name: {c: distance(t, d, a.seeds) for c, d in contents.items()} for name, t in chosen.items()}
    out = {"meta": common.meta(), "contents": list(contents), "rows": rows, "seeds": a.seeds}
    print(render(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


QUICK = ["--seeds", "1", "--sizes", "32"]
TABLES = {"fused_accuracy": {"argv": lambda a: [], "render": render}}
