"""Benchmark: `dsconvert verify` against `sha256sum` of the same shard files (the checksum
floor) and, for --decode, against decoding the source JPEGs with Pillow in one process, in
the same run. Page cache warm.

    python scripts/bench_verify.py --photos 2000 --json bench_verify.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from PIL import Image  # noqa: E402

from dsconvert import convert  # noqa: E402
from dsconvert.demo import make_demo_dataset  # noqa: E402
from dsconvert.verify import verify  # noqa: E402


def timed(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-verify"))
    p.add_argument("--json")
    args = p.parse_args()
    src = make_demo_dataset(os.path.join(args.work, "photos"), num_per_class=args.photos // 8)
    res = {}
    for fmt in ("wds", "hdf5"):
        out = os.path.join(args.work, fmt)
        convert(src, out, fmt, samples_per_shard=500)
        shards = sorted(glob.glob(os.path.join(out, "shard-*")))
        mb = sum(os.path.getsize(f) for f in shards if not f.endswith(".json")) / 1e6
        res[f"{fmt}_mb"] = mb
        res[f"{fmt}_sha256sum_s"], _ = timed(lambda: subprocess.run(["sha256sum", *shards], check=True,
                                                                    stdout=subprocess.DEVNULL))
        res[f"{fmt}_verify_1thread_s"], r = timed(lambda: verify(out, workers=1))
        assert r["ok"]
        res[f"{fmt}_verify_s"], _ = timed(lambda: verify(out))
        res[f"{fmt}_verify_decode_s"], r = timed(lambda: verify(out, decode=True), repeats=1)
        res[f"{fmt}_verify_vs_sha256sum"] = res[f"{fmt}_sha256sum_s"] / res[f"{fmt}_verify_s"]
    jpegs = sorted(glob.glob(os.path.join(src, "*", "*.jpg")))

    def pil_decode_all():
        for path in jpegs:
            with Image.open(path) as img:
                img.convert("RGB")
    res["pil_decode_all_1proc_s"], _ = timed(pil_decode_all, repeats=1)
    res["samples"] = len(jpegs)
    res["wds_verify_decode_vs_pil_1proc"] = res["pil_decode_all_1proc_s"] / res["wds_verify_decode_s"]
    for k, v in res.items():
        print(f"{k:34s} {v:10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
