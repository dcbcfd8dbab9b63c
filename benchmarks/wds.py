"""Benchmark: dsconvert's wds shards against the baselines, measured in one run.

Conversion (photos/s, single process unless said): dsconvert (--no-verify, and with its
default verification), webdataset's own ShardWriter loop, and GNU `tar -cf`.
Reading (samples/s and MB/s): the original small files, our shards (decode="raw": bytes
copied out of the map; decode="buffer": zero-copy uint8 views, as litdata's memoryviews; every
reader's consumer reads one byte per 4 kB page of each sample, so lazy views are paid for), the same
shards through webdataset.WebDataset, and litdata's StreamingDataset over the same photos
written by litdata.optimize(); warm (page cache hot; each reader in its own process, best of
5 runs after a warm-up, the readers taking turns for 3 rounds) and cold
(every file's pages written back and evicted with posix_fadvise, then one run in a fresh
process, median of 5 processes; a reader that keeps files mapped cannot fake a cold run). Then
the same reads through a FUSE passthrough that sleeps --delay-ms in every open() and read(), as
network storage would.

    python -m benchmarks wds --photos 4000 --json bench_wds.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from benchmarks.common import ROOT, fmt_range, meta, ratio_table, run_self, spread
from dsconvert import convert, open_dataset
from dsconvert.demo import make_demo_dataset
from dsconvert.io.localfs import evict_page_cache
from dsconvert.source import scan


def _cpu_seconds() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], int]) -> Dict[str, float]:
    """Items/s of one run, and the cores it kept busy (CPU time of this process and of the
    children it waited for, over the wall time)."""
    cpu = _cpu_seconds()
    t = time.perf_counter()
    n = fn()
    dt = time.perf_counter() - t
    return {"seconds": dt, "items": n, "per_s": n / dt, "cores": (_cpu_seconds() - cpu) / dt}


def files_of(folder: str) -> List[str]:
    return sorted(p for p in glob.glob(os.path.join(folder, "**", "*"), recursive=True) if os.path.isfile(p))


# --- conversion -------------------------------------------------------------------------


def wds_shardwriter(src: str, out: str, per_shard: int) -> int:
    import webdataset as wds

    source = scan(src)
    os.makedirs(out, exist_ok=True)
    n = 0
    with wds.ShardWriter(os.path.join(out, "s-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for s in source.samples:
            f = s.files[0]
            with open(os.path.join(src, f.path), "rb") as fh:
                sink.write({"__key__": s.key, f.field: fh.read(), "cls": str(s.label).encode()})
            n += 1
    return n


def bench_convert(src: str, work: str, per_shard: int, workers: int, rounds: int = 3) -> Dict[str, Dict]:
    """Each writer once per round, in turn; per writer the median round (and the range)."""
    n = len(scan(src).samples)

    def ours(name: str, **kw) -> Callable[[], int]:
        out = os.path.join(work, name)
        kw.setdefault("samples_per_shard", per_shard)

        def run() -> int:
            shutil.rmtree(out, ignore_errors=True)
            return convert(src, out, **kw).manifest.num_samples
        return run

    def shardwriter() -> int:
        out = os.path.join(work, "wds_shardwriter")
        shutil.rmtree(out, ignore_errors=True)
        return wds_shardwriter(src, out, per_shard)

    tar_out = os.path.join(work, "tree.tar")
    writers = {
        "dsconvert_noverify_1proc": ours("dsconvert_noverify_1proc", workers=1, verify=False),
        "dsconvert_verify_1proc": ours("dsconvert_verify_1proc", workers=1, verify=True),
        f"dsconvert_verify_{workers}proc": ours(f"dsconvert_verify_{workers}proc", workers=workers, verify=True),
        # the default limits (10,000 samples, 1 GB): spread over up to 16 shards, or (min_shards=1) as
        # the limits alone plan it, one shard for a small source
        f"dsconvert_defaults_{workers}proc": ours(f"dsconvert_defaults_{workers}proc", workers=workers,
                                                  samples_per_shard=10000),
        f"dsconvert_defaults_{workers}proc_min_shards_1": ours(f"dsconvert_defaults_{workers}proc_min_shards_1",
                                                               workers=workers, samples_per_shard=10000,
                                                               min_shards=1),
        "webdataset_shardwriter_1proc": shardwriter,
        "gnu_tar_cf": lambda: (subprocess.run(["tar", "-cf", tar_out, "-C", src, "."], check=True), n)[1],
    }
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in writers}
    for _ in range(rounds):
        for name, fn in writers.items():
            runs[name].append(timed(fn))
    res = {}
    for name, rs in runs.items():
        rates = sorted(r["per_s"] for r in rs)
        res[name] = dict(sorted(rs, key=lambda r: r["per_s"])[len(rs) // 2], min_per_s=rates[0], max_per_s=rates[-1])
    base = runs["webdataset_shardwriter_1proc"]
    for name, rs in runs.items():
        ratios = sorted(r["per_s"] / b["per_s"] for r, b in zip(rs, base))
        res[name]["vs_shardwriter"] = ratios[len(ratios) // 2]
    return res


# --- reading ----------------------------------------------------------------------------


def _small_files(src: str) -> Callable[[], int]:
    paths = files_of(src)

    def run() -> int:
        for p in paths:
            with open(p, "rb") as f:
                f.read()
        return len(paths)
    return run


def touch(data) -> int:
    """Read one byte of every 4 kB page: what any consumer does, and what makes a lazy
    (zero-copy) reader really fetch the data it handed out."""
    return len(bytes(memoryview(data)[::4096]))


def _ours(out: str) -> Callable[[], int]:
    open_dataset(out, decode="raw")  # imports (torch's IterableDataset) outside the timing

    def run() -> int:
        return sum(1 for image, _ in open_dataset(out, decode="raw") if touch(image))
    return run


def _ours_buffer(out: str) -> Callable[[], int]:
    open_dataset(out, decode="buffer")

    def run() -> int:
        return sum(1 for image, _ in open_dataset(out, decode="buffer") if touch(image))
    return run


def _webdataset(out: str) -> Callable[[], int]:
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(out, "*.tar")))

    def run() -> int:
        return sum(1 for s in wds.WebDataset(urls, shardshuffle=False) if touch(s["jpg"]))
    return run


def _litdata(out: str) -> Callable[[], int]:
    import litdata

    def run() -> int:
        return sum(1 for s in litdata.StreamingDataset(out) if touch(s["image"]))
    return run


READERS = {"small_files": _small_files, "dsconvert_wds": _ours, "dsconvert_wds_buffer": _ours_buffer,
           "webdataset_reader": _webdataset,
           "litdata_streaming": _litdata}


def read_child(reader: str, path: str, mode: str, repeats: int) -> float:
    """In a fresh process, one cold run: pages evicted first, and no earlier run in this
    process can keep them mapped; or warm runs (:func:`warm_child`)."""
    if mode == "warm":
        return warm_child(reader, path, repeats)
    fn = READERS[reader](path)
    evict_page_cache(files_of(path))
    return timed(fn)["per_s"]


def warm_child(reader: str, path: str, repeats: int) -> float:
    """In a fresh process: a warm-up run, then the best of ``repeats`` warm runs."""
    fn = READERS[reader](path)
    fn()
    return max(timed(fn)["per_s"] for _ in range(repeats))


def _child(args: List[str], python: str = sys.executable) -> str:
    return run_self("wds", args, python=python, check=True).stdout.strip().splitlines()[-1]


def measure_reads(pairs: List[List[str]], n: int, nbytes: int, res: Dict, rounds: int = 3,
                  repeats: int = 5, pythons: Optional[Dict[str, str]] = None) -> List[Dict[str, float]]:
    """Each reader in its own process (one reader's garbage must not tax another's allocator),
    warm (best of ``repeats`` after a warm-up) and cold (pages evicted), the readers taking
    turns in a rotating order, round after round, so that all of them see the same background
    load. ``res`` gets each reader's median [min-max] over rounds; the per-round rates are
    returned for same-round ratios. ``pythons``: the interpreter a reader runs in (a peer in
    its own virtual environment), by reader name."""
    pythons = pythons or {}
    per_round: List[Dict[str, float]] = []
    for i in range(rounds):
        rates: Dict[str, float] = {}
        for reader, path in pairs[i % len(pairs):] + pairs[:i % len(pairs)]:
            py = pythons.get(reader, sys.executable)
            rates[f"{reader}_warm"] = float(_child(["--child", reader, path, "warm", "--repeats", str(repeats)], py))
            rates[f"{reader}_cold"] = float(_child(["--child", reader, path, "cold"], py))
        per_round.append(rates)
        print(f"read round {i + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()), flush=True)
    for key in per_round[0]:
        values = [r[key] for r in per_round]
        med = statistics.median(values)
        res[key] = {"per_s": med, "min_per_s": min(values), "max_per_s": max(values), "rounds": values,
                    "items": n, "mb_per_s": med * nbytes / n / 1e6}
    return per_round


def bench_read(src: str, ours_out: str, work: str, with_litdata: bool, rounds: int = 3,
               python_litdata: Optional[str] = None) -> Tuple[Dict[str, Dict], List[Dict[str, float]]]:
    res: Dict[str, Dict] = {}
    small = files_of(src)
    n, nbytes = len(small), sum(os.path.getsize(p) for p in small)
    pairs = [["small_files", src], ["dsconvert_wds", ours_out], ["dsconvert_wds_buffer", ours_out],
             ["webdataset_reader", ours_out]]
    if with_litdata:
        lit = os.path.join(work, "litdata")
        if python_litdata:  # litdata in its own virtual environment, with the torch it installs
            run_self("wds", ["--child-optimize", src, lit], python=python_litdata, check=True, capture_output=False)
        else:
            litdata_optimize(src, lit)
        pairs.append(["litdata_streaming", lit])
    pythons = {"litdata_streaming": python_litdata} if python_litdata else {}
    # the outputs were just written: their pages go to disk now, not while the first round reads
    # (the first readers measured 0.6x of later rounds while the kernel wrote them back)
    os.sync()
    return res, measure_reads(pairs, n, nbytes, res, rounds, pythons=pythons)


def litdata_optimize(src: str, out: str) -> None:
    import litdata

    source = scan(src)
    items = [(os.path.join(src, s.files[0].path), s.label) for s in source.samples]
    shutil.rmtree(out, ignore_errors=True)
    litdata.optimize(fn=_litdata_item, inputs=items, output_dir=out, chunk_bytes="64MB", num_workers=1)


def _litdata_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def bench_slow_mount(src: str, work: str, delay_ms: float, limit: int) -> Dict[str, Dict]:
    """Small files vs shards read through the FUSE passthrough that sleeps in open/read."""
    subset_src = os.path.join(work, "slow_src")
    subset_out = os.path.join(work, "slow_wds")
    if not os.path.isdir(subset_out):
        shutil.rmtree(subset_src, ignore_errors=True)
        paths = files_of(src)[:limit]
        for p in paths:
            dst = os.path.join(subset_src, os.path.relpath(p, src))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(p, dst)
        convert(subset_src, subset_out, workers=1)
    from tests.support import slowfs

    mnt = tempfile.mkdtemp(prefix="slowfs-")
    try:
        with slowfs.mount(work, mnt, delay_ms):
            return _slow_reads(mnt)
    finally:
        os.rmdir(mnt)


def _slow_reads(mnt: str) -> Dict[str, Dict]:
    """The small files and the shards read through the mount."""
    res: Dict[str, Dict] = {}
    small = files_of(os.path.join(mnt, "slow_src"))
    nbytes = sum(os.path.getsize(p) for p in small)
    r = timed(_small_files(os.path.join(mnt, "slow_src")))
    r["mb_per_s"] = nbytes / r["seconds"] / 1e6
    res["slow_small_files"] = r
    mounted_out = os.path.join(mnt, "slow_wds")
    evict_page_cache(files_of(mounted_out))
    r = timed(_ours(mounted_out))
    r["mb_per_s"] = nbytes / r["seconds"] / 1e6
    res["slow_dsconvert_wds"] = r
    return res


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=4000)
    p.add_argument("--per-shard", type=int, default=1000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench"))
    p.add_argument("--delay-ms", type=float, default=5.0)
    p.add_argument("--slow-files", type=int, default=500, help="files read through the slow mount")
    p.add_argument("--no-litdata", action="store_true")
    p.add_argument("--no-fuse", action="store_true")
    p.add_argument("--no-read", action="store_true", help="conversion only")
    p.add_argument("--no-convert", action="store_true",
                   help="reads only (the output they read is converted once, untimed)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--python-litdata", help="run litdata (optimize and its reader) with this interpreter: a venv "
                   "where `pip install litdata` installed it with its own dependencies")
    p.add_argument("--child", nargs=3, metavar=("READER", "PATH", "MODE"), help=argparse.SUPPRESS)
    p.add_argument("--child-optimize", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=3, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.child:
        print(read_child(*args.child, repeats=args.repeats))
        return
    if args.child_optimize:
        litdata_optimize(*args.child_optimize)
        return

    src = os.path.join(args.work, "photos")
    classes = 8
    make_demo_dataset(src, num_per_class=-(-args.photos // classes))
    n = len(scan(src).samples)
    total = sum(os.path.getsize(f) for f in files_of(src))
    print(f"dataset: {n} photos, {total / 1e6:.1f} MB, mean {total / n / 1e3:.0f} kB", flush=True)

    results: Dict[str, Any] = {"meta": meta(), "rounds": args.rounds, "dataset": {"photos": n, "bytes": total}}
    ours_out = os.path.join(args.work, "dsconvert_noverify_1proc")
    if args.no_convert:
        shutil.rmtree(ours_out, ignore_errors=True)
        convert(src, ours_out, samples_per_shard=args.per_shard, workers=1, verify=False)
    else:
        results["convert"] = bench_convert(src, args.work, args.per_shard, args.workers, args.rounds)
    if args.no_read:
        for name, r in results["convert"].items():
            print(f"convert    {name:44s} {r['per_s']:8.0f} /s ({r['min_per_s']:.0f}-{r['max_per_s']:.0f}), "
                  f"{r['cores']:.2f} cores, "
                  f"{r['vs_shardwriter']:.2f}x ShardWriter")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    results["read"], per_round = bench_read(src, ours_out, args.work, not args.no_litdata, args.rounds,
                                            args.python_litdata)
    if args.python_litdata and not args.no_litdata:  # what litdata ran with, in its own environment
        code = ("import json; from benchmarks.common import versions; "
                "print(json.dumps(versions(('litdata', 'torch', 'numpy'))))")
        out = subprocess.run([args.python_litdata, "-c", code], capture_output=True, text=True, check=True,
                             cwd=ROOT).stdout
        results["litdata_env"] = {"python": args.python_litdata, "versions": json.loads(out)}
    if not args.no_fuse:
        results["slow_mount"] = bench_slow_mount(src, args.work, args.delay_ms, args.slow_files)
    for section in ("convert", "read", "slow_mount"):
        for name, r in results.get(section, {}).items():
            extra = f"  {r['mb_per_s']:8.1f} MB/s" if "mb_per_s" in r else ""
            print(f"{section:10s} {name:36s} {r['per_s']:12.0f} /s{extra}")
    pairs = {"read_warm_vs_small_files": ("dsconvert_wds_warm", "small_files_warm"),
             "read_cold_vs_small_files": ("dsconvert_wds_cold", "small_files_cold"),
             "read_warm_vs_webdataset": ("dsconvert_wds_warm", "webdataset_reader_warm"),
             "read_cold_vs_webdataset": ("dsconvert_wds_cold", "webdataset_reader_cold")}
    # litdata hands out memoryviews of its chunks: compare like with like (zero-copy
    # decode="buffer"), and also our bytes-copying decode="raw"
    for ours, mode in (("dsconvert_wds_buffer", "buffer"), ("dsconvert_wds", "raw")):
        for t in ("warm", "cold"):
            pairs[f"read_{t}_{mode}_vs_litdata"] = (f"{ours}_{t}", f"litdata_streaming_{t}")
    ratios: Dict[str, Any] = {}
    for name, (a, b) in pairs.items():  # each the median of the same round's ratios
        if a in per_round[0] and b in per_round[0]:
            ratios[name] = spread([r[a] / r[b] for r in per_round])
    if "convert" in results:
        c = results["convert"]
        ratios["convert_noverify_vs_shardwriter"] = c["dsconvert_noverify_1proc"]["vs_shardwriter"]
    if "slow_mount" in results:
        s = results["slow_mount"]
        ratios["slow_mount_vs_small_files"] = s["slow_dsconvert_wds"]["per_s"] / s["slow_small_files"]["per_s"]
    results["ratios"] = ratios
    for k, v in ratios.items():
        print(f"ratio      {k:36s} " + (f"{v['median']:12.2f}x [{v['min']:.2f}-{v['max']:.2f}]"
                                         if isinstance(v, dict) else f"{v:12.2f}x"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def render_convert(data: Dict[str, Any]) -> str:
    rounds = data.get("rounds")
    lines = [f"{data['dataset']['photos']:,} photos ({data['dataset']['bytes'] / 1e6:.0f} MB); each writer once "
             f"per round{f', {rounds} rounds' if rounds else ''}; median [range]; cores = CPU time of the process "
             "and its pool over the wall time; the ratio is the median of the per-round ratios.", "",
             "| writer | photos/s | cores | vs ShardWriter |", "| --- | --- | --- | --- |"]
    for name, r in data["convert"].items():
        lines.append(f"| {name} | {fmt_range(r['per_s'], r['min_per_s'], r['max_per_s'])} | "
                     f"{r.get('cores', float('nan')):.2f} | {r['vs_shardwriter']:.2f}x |")
    return "\n".join(lines) + "\n"


def render_reads(data: Dict[str, Any]) -> str:
    read, ratios = data["read"], data["ratios"]
    d = data["dataset"]
    lines = [f"{d['photos']:,} photos ({d['bytes'] / 1e6:.0f} MB), the same photos as small files, in wds shards "
             "(read by dsconvert and by webdataset's `WebDataset`) and written by `litdata.optimize()`. Every "
             "consumer reads one byte of each 4 kB page of each sample, so readers that hand out views pay for the "
             "data as the copying ones do. Each reader in its own process: warm, best of 5 after a warm-up; cold, "
             f"pages evicted first; {data['rounds']} rounds, the readers in a rotating order; median [range]; "
             "each ratio is the median of the same round's ratios.", "",
             "| reader | warm samples/s | cold samples/s | warm MB/s | cold MB/s |", "| --- | --- | --- | --- | --- |"]
    for reader in dict.fromkeys(k.rsplit("_", 1)[0] for k in read):
        w, c = read[f"{reader}_warm"], read[f"{reader}_cold"]
        lines.append(f"| {reader} | {fmt_range(w['per_s'], w['min_per_s'], w['max_per_s'])} | "
                     f"{fmt_range(c['per_s'], c['min_per_s'], c['max_per_s'])} | {w['mb_per_s']:,.0f} | "
                     f"{c['mb_per_s']:,.0f} |")
    lines += ratio_table("ratio (same round)", ((name, r) for name, r in ratios.items() if isinstance(r, dict)))
    env = data.get("litdata_env")
    if env:
        lines += ["", "litdata ran in its own virtual environment (`--python-litdata`), with "
                  + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if k != "libturbojpeg") + "."]
    else:
        lines += ["", "litdata ran in dsconvert's own environment (no `--python-litdata` given)."]
    slow = data.get("slow_mount")
    if slow:
        lines += ["", "Behind a FUSE passthrough (`tests/support/slowfs.py`) that sleeps in every `open()` and "
                  "`read()`, as network storage would (one run):", "", "| reader | samples/s | MB/s |",
                  "| --- | --- | --- |"]
        for name, r in slow.items():
            lines.append(f"| {name} | {r['per_s']:,.0f} | {r['mb_per_s']:,.1f} |")
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "40", "--per-shard", "10", "--workers", "1", "--rounds", "1", "--repeats", "1",
         "--slow-files", "8", "--no-litdata",
         "--work", os.path.join(tempfile.gettempdir(), "dsconvert-bench-quick")]
TABLES = {
    "wds_convert": {"argv": lambda a: ["--photos", str(a.photos), "--no-read", "--rounds", str(a.rounds + 2)],
                    "render": render_convert},
    "wds_reads": {"argv": lambda a: ["--photos", str(a.photos), "--no-convert", "--rounds", str(a.rounds)]
                  + (["--python-litdata", a.python_litdata] if a.python_litdata else []),
                  "render": render_reads},
}
