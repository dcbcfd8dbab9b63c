"""Writing speed from Python, the same samples the same run: dsconvert.optimize and LitData's
optimize on N worker processes, dsconvert.Writer and WebDataset's ShardWriter in one process.

Each sample is made by the same function, ``make(i)``: a crop of a real photograph (scikit-image's
demo photos), resized to SIZE x SIZE and JPEG-encoded at quality 90, with a label; every writer
gets the encoded bytes, so what is measured is the work of making the samples plus the writer's
own cost (serialising, hashing, shard files, index, manifest). The JPEG encode dominates; the
differences are the writers' overheads (LitData's and dsconvert's process pools start their
workers inside the timing).

    python -m benchmarks writer --samples 2000 --workers 2 --rounds 3
    python benchmarks/writer.py --samples 2000 --workers 2 --rounds 3   # the same, as a script

Prints one line per writer and round, then the median of each (seconds, samples/s, output MB);
``--json FILE`` writes them. LitData and webdataset are skipped (said so) where not installed.
A suite of ``python -m benchmarks`` (``add_arguments``, ``run``, ``QUICK``; no docs table: the
figures are quoted in docs/writer.md).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIZE = 224
_PHOTOS: List = []


def make(i: int) -> Dict[str, object]:
    """Sample i: a JPEG of a crop of a real photo, and its label (the same bytes in every process)."""
    from PIL import Image

    if not _PHOTOS:
        from dsconvert.demo import load_photos

        _PHOTOS.extend(p.convert("RGB") for _, p in sorted(load_photos().items()))
    photo = _PHOTOS[i % len(_PHOTOS)]
    w, h = photo.size
    rng = np.random.default_rng(i)
    cw, ch = int(rng.integers(w // 3, w)), int(rng.integers(h // 3, h))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    buf = io.BytesIO()
    photo.crop((x, y, x + cw, y + ch)).resize((SIZE, SIZE), Image.BILINEAR).save(buf, "JPEG", quality=90)
    return {"jpg": buf.getvalue(), "cls": i % 10}


def make_litdata(i: int) -> Dict[str, object]:
    s = make(i)
    return {"image": s["jpg"], "label": s["cls"]}


def _bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run_dsconvert_optimize(n: int, workers: int, out: str) -> None:
    import dsconvert

    dsconvert.optimize(make, range(n), out, workers=workers, samples_per_shard=1000)


def run_litdata_optimize(n: int, workers: int, out: str) -> None:
    from litdata import optimize

    optimize(fn=make_litdata, inputs=list(range(n)), output_dir=out, num_workers=workers, chunk_bytes="64MB")


def run_dsconvert_writer(n: int, workers: int, out: str) -> None:
    import dsconvert

    with dsconvert.Writer(out, samples_per_shard=1000) as w:
        for i in range(n):
            w.write(make(i))


def run_shardwriter(n: int, workers: int, out: str) -> None:
    import webdataset as wds

    os.makedirs(out)
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=1000, verbose=0) as sink:
        for i in range(n):
            s = make(i)
            sink.write({"__key__": f"{i:08d}", "jpg": s["jpg"], "cls": s["cls"]})


RUNS: Dict[str, Callable[[int, int, str], None]] = {
    "dsconvert.optimize": run_dsconvert_optimize,
    "litdata.optimize": run_litdata_optimize,
    "dsconvert.Writer (1 process)": run_dsconvert_writer,
    "webdataset.ShardWriter (1 process)": run_shardwriter,
}
NEEDS = {"litdata.optimize": "litdata", "webdataset.ShardWriter (1 process)": "webdataset"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2, help="processes of the optimize runs")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", help="write the results here")


def run(args: argparse.Namespace) -> int:
    runs = {}
    for name, fn in RUNS.items():
        need = NEEDS.get(name)
        if need:
            try:
                __import__(need)
            except ImportError:
                print(f"{name}: skipped ({need} is not installed)")
                continue
        runs[name] = fn
    make(0)  # the photos loaded before any timing (workers load their own, inside it)
    seconds: Dict[str, List[float]] = {name: [] for name in runs}
    sizes: Dict[str, int] = {}
    for r in range(args.rounds):
        for name, fn in runs.items():
            tmp = tempfile.mkdtemp(prefix="bench-writer-")
            out = os.path.join(tmp, "out")
            try:
                started = time.perf_counter()
                fn(args.samples, args.workers, out)
                took = time.perf_counter() - started
                sizes[name] = _bytes(out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            seconds[name].append(took)
            print(f"round {r + 1}: {name:36s} {took:7.2f} s", flush=True)
    rows = []
    print(f"\n{args.samples} samples ({SIZE}x{SIZE} JPEGs), {args.workers} workers for the optimize runs; "
          f"median of {args.rounds} round(s)")
    for name in runs:
        med = statistics.median(seconds[name])
        rows.append({"writer": name, "seconds": seconds[name], "median_s": med,
                     "samples_per_s": args.samples / med, "output_mb": sizes[name] / 1e6})
        print(f"{name:36s} {med:7.2f} s  {args.samples / med:8.0f} samples/s  {sizes[name] / 1e6:7.1f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": args.samples, "workers": args.workers, "size": SIZE, "cpus": os.cpu_count(),
                       "results": rows}, f, indent=2)
    return 0


QUICK = ["--samples", "40", "--rounds", "1"]
TABLES: Dict[str, Any] = {}  # it prints; its figures are quoted in docs/writer.md


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
