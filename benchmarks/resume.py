"""Benchmark: how long a resumed job waits for its first batch, by how far into the epoch it
had gone, through torchdata's StatefulDataLoader (the loader Lightning checkpoints).

    dsconvert          open_dataset(wds, shuffle=True): the readers' own state; a worker finds
                       its place by arithmetic and reads nothing before it
    dsconvert_forward  the same reader with its state hidden: the StatefulDataLoader
                       fast-forwards, reading, decoding and dropping every batch before the place
                       (what any IterableDataset without state_dict gets)
    webdataset         webdataset.WebDataset over the same tars: fast-forwarded likewise

Every sample is decoded and cropped by the reference train transform (RandomResizedCrop 224 +
flip to a uint8 tensor), batches of ``--batch``, ``--workers`` workers. The state at each
position is made once (outside the timing); each measurement is a fresh process that loads it
and times ``load_state_dict`` to the first batch (worker start included), in interleaved
rounds; the figure is the median with the range.

    python -m benchmarks resume --photos /tmp/bw4000/photos --rounds 3 --json docs/bench/resume.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

from benchmarks.common import fmt_range, run_self

READERS = ("dsconvert", "dsconvert_forward", "webdataset")


def make_loader(reader: str, out: str, batch: int, workers: int) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from dsconvert import open_dataset
    from dsconvert.transforms import load_transform

    transform = load_transform("train")
    if reader == "webdataset":
        import glob

        import webdataset as wds

        urls = sorted(glob.glob(os.path.join(out, "*.tar")))
        ds = (wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil")
              .to_tuple("jpg;jpeg;png", "cls").map_tuple(transform, int))
        return StatefulDataLoader(ds, batch_size=batch, num_workers=workers)
    ds = open_dataset(out, transform=transform, decode="pil", shuffle=True, seed=0, batch_size=batch)
    if reader == "dsconvert_forward":
        ds = _Hidden(ds)
    return StatefulDataLoader(ds, batch_size=None, num_workers=workers)


class _Hidden:
    """An IterableDataset that does not expose its reader's state."""

    def __new__(cls, ds: Any) -> Any:
        import torch.utils.data

        class Hidden(torch.utils.data.IterableDataset):
            def __init__(self, inner: Any):
                self.inner = inner

            def __iter__(self) -> Any:
                return iter(self.inner)

            def __len__(self) -> int:
                return len(self.inner)

        return Hidden(ds)


def child(args: argparse.Namespace) -> None:
    """One measurement: ``--make K`` saves the state after K batches; ``--resume`` times it."""
    loader = make_loader(args.reader, args.out, args.batch, args.workers)
    if args.make is not None:
        it = iter(loader)
        for _ in range(args.make):
            next(it)
        with open(args.state, "wb") as f:
            pickle.dump(loader.state_dict(), f)
        return
    with open(args.state, "rb") as f:
        state = pickle.load(f)
    t0 = time.perf_counter()
    loader.load_state_dict(state)
    it = iter(loader)
    next(it)
    print(json.dumps({"first_batch_s": time.perf_counter() - t0}))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--photos", help="an ImageFolder to convert (once) into --out")
    ap.add_argument("--out", help="a dsconvert wds output (made from --photos when absent)")
    ap.add_argument("--demo-photos", type=int, metavar="N",
                    help="without --photos: convert N demo photos (a tiny run; the docs' figures resume in 4,000)")
    ap.add_argument("--positions", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 0.95])
    ap.add_argument("--readers", nargs="+", default=list(READERS), choices=READERS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reader", help=argparse.SUPPRESS)
    ap.add_argument("--make", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.child:
        return child(args)

    work = tempfile.mkdtemp(prefix="bench-resume-")
    out = args.out or os.path.join(work, "wds")
    if not os.path.exists(os.path.join(out, "dsconvert.json")):
        from dsconvert import convert

        photos = args.photos
        if photos is None:
            if not args.demo_photos:
                sys.exit("give --out (a wds output), --photos (an ImageFolder) or --demo-photos N")
            from dsconvert.demo import make_demo_dataset

            photos = make_demo_dataset(os.path.join(work, "photos"), -(-args.demo_photos // 8))
        convert(photos, out, format="wds", samples_per_shard=1000)
    from dsconvert import open_dataset

    n = open_dataset(out).manifest.num_samples
    steps = -(-n // args.batch)

    def run(*extra: str) -> Dict[str, Any]:
        done = run_self("resume", ["--child", "--out", out, "--batch", str(args.batch),
                                   "--workers", str(args.workers), *extra], check=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {}

    jobs = []
    for reader in args.readers:
        for p in args.positions:
            k = min(steps - 1, int(round(p * steps)))
            state = os.path.join(work, f"{reader}-{k}.pkl")
            t0 = time.perf_counter()
            run("--reader", reader, "--make", str(k), "--state", state)
            print(f"  state of {reader} after {k} batches made in {time.perf_counter() - t0:.1f} s", flush=True)
            jobs.append((reader, p, k, state))
    times: Dict[str, List[float]] = {}
    for r in range(args.rounds):
        random.Random(r).shuffle(jobs)
        for reader, p, k, state in jobs:
            got = run("--reader", reader, "--state", state)["first_batch_s"]
            times.setdefault(f"{reader}@{p}", []).append(got)
            print(f"round {r + 1}: {reader:18s} at {p:4.0%} (batch {k}): first batch after {got:.2f} s", flush=True)

    rows = []
    print(f"\n{n} samples, batch {args.batch}, {args.workers} workers, {args.rounds} rounds: seconds from "
          "load_state_dict to the first batch, median [range]")
    print(f"{'position':>9s} " + " ".join(f"{r:>24s}" for r in args.readers))
    for p in args.positions:
        cells = []
        for reader in args.readers:
            t = times[f"{reader}@{p}"]
            rows.append({"reader": reader, "position": p, "median_s": statistics.median(t), "min_s": min(t),
                         "max_s": max(t), "rounds": t})
            cells.append(f"{statistics.median(t):7.2f} [{min(t):.2f}-{max(t):.2f}]")
        print(f"{p:9.0%} " + " ".join(f"{c:>24s}" for c in cells))
    if args.json:
        from benchmarks.common import meta as record

        meta = dict(record(), samples=n, batch=args.batch, workers=args.workers, rounds=args.rounds)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    rows = data["rows"]
    readers = list(dict.fromkeys(r["reader"] for r in rows))
    positions = list(dict.fromkeys(r["position"] for r in rows))
    lines = [f"{meta.get('samples', '?'):,} samples, batches of {meta.get('batch', '?')}, {meta.get('workers', '?')} "
             f"workers, {meta.get('rounds', '?')} interleaved rounds: seconds from `load_state_dict` to the first "
             "batch, median [range].", "",
             "| position | " + " | ".join(readers) + " |", "| --- |" + " --- |" * len(readers)]
    for p in positions:
        cells = []
        for reader in readers:
            r = next(x for x in rows if x["reader"] == reader and x["position"] == p)
            cells.append(fmt_range(r["median_s"], r["min_s"], r["max_s"], "{:.2f}"))
        lines.append(f"| {p:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


QUICK = ["--demo-photos", "48", "--positions", "0", "0.5", "--rounds", "1", "--batch", "8", "--workers", "1"]
TABLES = {"resume": {"argv": lambda a: ["--rounds", str(a.rounds)]
                     + (["--out", a.wds] if a.wds else ["--photos", a.photo_folder] if a.photo_folder else []),
                     "render": render, "needs": lambda a: a.wds or a.photo_folder}}
