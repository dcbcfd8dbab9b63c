"""The main job end to end on the embedded demo dataset.

1. Generate an ImageFolder of JPEGs from the photographs scikit-image ships, and
   `dsconvert analyze` it: what bounds loading, and which command fixes it (with the plots in
   demo-out/analyze.html).
2. `dsconvert shard` it into WebDataset tar shards (verifying every image).
3. Read it back with `dsconvert.open_dataset` through a DataLoader, check that the samples
   are the ones ImageFolder would give, and compare read rates of the small files and the
   shards, warm and cold (page cache evicted with posix_fadvise).

    python examples/demo.py [--out demo-out] [--per-class 150]   # after pip install -e '.[demo]'
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import sys
import time

from PIL import Image

from dsconvert import open_dataset
from dsconvert.cli import main as dsconvert_main
from dsconvert.demo import make_demo_dataset
from dsconvert.io.localfs import evict_page_cache
from dsconvert.source import scan


def to_tensor_64(image):
    """A stand-in for a torchvision transform: resize, HWC uint8 tensor."""
    import numpy as np
    import torch

    return torch.from_numpy(np.array(image.resize((64, 64))))


def rate(fn, files):
    evict_page_cache(files)
    t = time.perf_counter()
    n = fn()
    cold = n / (time.perf_counter() - t)
    t = time.perf_counter()
    n = fn()
    return cold, n / (time.perf_counter() - t)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="demo-out")
    p.add_argument("--per-class", type=int, default=150)
    args = p.parse_args()
    photos = os.path.join(args.out, "photos")
    shards = os.path.join(args.out, "photos-wds")

    print(f"1. generating the demo dataset in {photos}", flush=True)
    make_demo_dataset(photos, num_per_class=args.per_class)
    source = scan(photos)
    print(f"   {len(source.samples)} JPEGs in {len(source.classes)} classes: {', '.join(source.classes)}")
    report = os.path.join(args.out, "analyze.html")
    print(f"\n   dsconvert analyze {photos} --sample 100 --report {report}", flush=True)
    dsconvert_main(["analyze", photos, "--sample", "100", "-q", "--output-dir", args.out, "--report", report])
    print(f"   (open {report} in a browser for the plots)")

    print(f"\n2. dsconvert shard {photos} -o {shards} --samples-per-shard 250", flush=True)
    status = dsconvert_main(["shard", photos, "-o", shards, "--samples-per-shard", "250"])
    if status not in (0, 3):
        return status

    print("\n3. reading it back", flush=True)
    ds = open_dataset(shards)
    first_image, first_label = next(iter(ds))
    path = os.path.join(photos, source.samples[0].files[0].path)
    with open(path, "rb") as f:
        reference = Image.open(io.BytesIO(f.read())).convert("RGB")
    same = first_image.tobytes() == reference.tobytes() and first_label == source.samples[0].label
    print(f"   first sample: {first_image.size} RGB, class {ds.classes[first_label]!r}; "
          f"identical to ImageFolder's: {same}")
    try:
        import torch

        loader = torch.utils.data.DataLoader(open_dataset(shards, transform=to_tensor_64),
                                             batch_size=64, shuffle=True, num_workers=2)
        t = time.perf_counter()
        n = sum(len(labels) for _, labels in loader)
        print(f"   DataLoader (2 workers, PIL decode + resize): {n} samples, {n / (time.perf_counter() - t):.0f} samples/s")
    except ImportError:
        print("   (torch is not installed: skipping the DataLoader pass)")

    small = sorted(glob.glob(os.path.join(photos, "*", "*.jpg")))

    def read_small() -> int:
        for path in small:
            with open(path, "rb") as f:
                f.read()
        return len(small)

    def read_shards() -> int:
        return sum(1 for _ in open_dataset(shards, decode="raw"))

    read_shards()
    sc, sw = rate(read_small, small)
    wc, ww = rate(read_shards, glob.glob(os.path.join(shards, "*")))
    print(f"   raw reads, small files: {sc:,.0f}/s cold, {sw:,.0f}/s warm")
    print(f"   raw reads, wds shards:  {wc:,.0f}/s cold, {ww:,.0f}/s warm  ({wc / sc:.1f}x cold)")
    print(f"\n   `dsconvert info {shards}` summarises the manifest.")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
