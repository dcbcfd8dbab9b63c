"""Benchmark: memory and time as the dataset grows — every process that touches an output, at
10k, 100k, 1M (and 10M) samples, and how each figure grows per sample.

Sources: ImageFolder trees of tiny JPEGs (1,000 classes, 1,000 distinct 32x32 blobs written
with ``os.write``), and the same samples as foreign tar shards (10,000 a tar). Each size is
converted with ``dsconvert shard --format wds --workers 2`` in a fresh process; its process
tree is sampled every 20 ms for the peak RSS of the parent and of each conversion worker.
Then, each in a fresh process: ``dsconvert verify`` (peak RSS by ``wait4``), a map-style
``DataLoader(open_dataset(out, decode="raw"), shuffle=True, batch_size=64, num_workers=2,
persistent_workers=True)`` read for 20 batches, and the same with ``stream=True``: the time
to open, the time to the first batch, and each worker's private memory
(``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup``; the clean part is file pages
only this worker has mapped, such as the records it opened, which the kernel can drop; the dirty
part is its own) after the 20 batches. The
records on disk are measured per sample. Growth per sample is the difference between two
sizes over the difference in samples; the exponent is log(ratio of values) / log(ratio of
sizes); the extrapolation to 14M and 400M is linear in the growth of the last step (the smaller
steps carry per-shard and per-tar costs that stop growing once shards are full).

The trees up to ``--peers-up-to`` (1M) are also written by webdataset's ``ShardWriter`` (one
process, shards of 10,000, as its docs write them) and by litdata's ``optimize`` (2 workers, the
inputs listed in the parent as its docs show; in its own venv, ``--python-litdata``): wall, CPU,
peak RSS of the parent and of its largest child.

Timings move with the machine's load; memory does not (much): compare within one table.

    python -m benchmarks scale --sizes 10000 100000 1000000 --python-litdata /tmp/peer-litdata/bin/python \
        --json docs/bench/scale.json
    python -m benchmarks scale --kinds tars --sizes 100000 1000000 10000000 --drop --json docs/bench/scale_tars.json

10M samples as tars take ~31 GB of source and ~31 GB of output; ``--drop`` removes each size's
source and output once it is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from benchmarks.common import ROOT

CLASSES = 1000
BLOBS = 1000


def _blobs() -> List[bytes]:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(BLOBS):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
        out.append(buf.getvalue())
    return out


def make_tree(root: str, n: int) -> None:
    """An ImageFolder of ``n`` tiny JPEGs in 1,000 classes (kept between runs: it is the slow part)."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return
    shutil.rmtree(root, ignore_errors=True)
    blobs = _blobs()
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, f"c{c:04d}"))
    for i in range(n):
        c = i % CLASSES
        fd = os.open(os.path.join(root, f"c{c:04d}", f"img_{i:08d}.jpg"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, blobs[i % BLOBS])
        os.close(fd)
    open(done, "w").close()


def make_tars(root: str, n: int, per_tar: int = 10000) -> None:
    """The same samples as webdataset-style tars (``KEY.cls`` + ``KEY.jpg``), written as raw
    bytes: each member's header from :mod:`dsconvert.formats.tar_members`' template (what
    ``tarfile`` writes for a plain member, mode 0444 and mtime 0), a tar joined in memory and
    written with one call. ``tarfile.addfile`` took ~50 minutes for 10M samples; this is disk-bound
    (GNU tar and ``tarfile`` read the result; ``tests/test_bench_scale.py``)."""
    from dsconvert.formats.tar_members import archive_end, member_header, padding

    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    blobs = _blobs()
    jpg_tail = [padding(len(b)) for b in blobs]
    labels = [str(c).encode() for c in range(CLASSES)]
    for t in range(-(-n // per_tar)):
        parts: List[bytes] = []
        for i in range(t * per_tar, min(n, (t + 1) * per_tar)):
            label, blob = labels[i % CLASSES], blobs[i % BLOBS]
            parts += (member_header(f"s{i:09d}.cls", len(label)), label, padding(len(label)),
                      member_header(f"s{i:09d}.jpg", len(blob)), blob, jpg_tail[i % BLOBS])
        body = b"".join(parts)
        path = os.path.join(root, f"part-{t:06d}.tar")
        with open(path + ".tmp", "wb") as f:
            f.write(body + archive_end(len(body)))
        os.replace(path + ".tmp", path)
    open(done, "w").close()


def _rss(pid: int, field: str = "VmHWM:") -> int:
    """A process's peak RSS so far (``VmHWM``: its own memory's high-water mark since its exec
    or fork), 0 where it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> List[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def run_sampled(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run ``cmd``; the peak RSS of the process and of each of its descendants (each one's
    ``VmHWM``, read every 20 ms: a high-water mark, so only a peak in the last 20 ms of a
    process is missed), and the wall and CPU time. Not ``wait4``'s ``ru_maxrss``: Linux counts in
    it the memory of the process that spawned the command, as it was at the exec (a benchmark
    runner holding 138 MB made every command's peak read 138 MB)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    peaks: Dict[int, int] = {}
    stop = threading.Event()
    out: List[bytes] = []

    def sample() -> None:
        while not stop.is_set():
            todo = [proc.pid]
            while todo:
                pid = todo.pop()
                peaks[pid] = max(peaks.get(pid, 0), _rss(pid))
                todo += _children(pid)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    sampler.join()
    reader.join()
    text = b"".join(out).decode(errors="replace")
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{text[-3000:]}")
    own = peaks.pop(proc.pid, 0) or usage.ru_maxrss * 1024  # (wait4's only where it was never read)
    return {"seconds": time.perf_counter() - t, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss": own, "children_peak_rss": max(peaks.values(), default=0), "output": text}


READER = r"""
import json, os, sys, time
import torch
from torch.utils.data import DataLoader
from dsconvert import open_dataset

def private(pid, kinds=("Private_Clean:", "Private_Dirty:")):
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(kinds):
                total += int(line.split()[1]) * 1024
    return total

out, stream = sys.argv[1], sys.argv[2] == "stream"
t = time.perf_counter()
ds = open_dataset(out, decode="raw", stream=stream, **({"shuffle": True, "batch_size": 64} if stream else {}))
opened = time.perf_counter() - t
collate = (lambda b: b) if not stream else None
kw = dict(batch_size=None) if stream else dict(batch_size=64, shuffle=True, collate_fn=collate)
loader = DataLoader(ds, num_workers=2, persistent_workers=True, **kw)
t = time.perf_counter()
first, batches = None, 0
while batches < 20:  # epochs again where the dataset is short (the workers persist)
    for _ in loader:
        first = first if first is not None else time.perf_counter() - t
        batches += 1
        if batches == 20:
            break
pids = [w.pid for w in loader._iterator._workers]
print(json.dumps({"open_seconds": opened, "first_batch_seconds": first,
                  "worker_private": [private(p) for p in pids],
                  "worker_private_dirty": [private(p, ("Private_Dirty:",)) for p in pids],
                  "main_rss": private(os.getpid())}))
"""


def measure_reads(out: str, stream: bool) -> Dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", READER, out, "stream" if stream else "map"], capture_output=True,
                       text=True, cwd=ROOT)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


PEER_WDS = r"""
import os, sys
import webdataset as wds
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=10000, verbose=0) as sink:
    for label, cls in enumerate(sorted(os.listdir(src))):
        folder = os.path.join(src, cls)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
                sink.write({"__key__": f"{cls}/{name[:-4]}", "jpg": f.read(), "cls": label})
"""

PEER_LITDATA = r"""
import os, sys
from litdata import optimize

def load(item):
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}

if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    inputs = []  # what litdata's docs show: the inputs listed in the parent
    for label, cls in enumerate(sorted(os.listdir(src))):
        folder = os.path.join(src, cls)
        if os.path.isdir(folder):
            inputs += [(os.path.join(folder, name), label) for name in sorted(os.listdir(folder))]
    optimize(fn=load, inputs=inputs, output_dir=out, num_workers=2, chunk_bytes="64MB")
"""


def measure_peers(work: str, n: int, python_litdata: Optional[str]) -> Dict[str, Any]:
    """The same ImageFolder tree written by webdataset's ``ShardWriter`` (one process, as its
    docs write shards) and by litdata's ``optimize`` (2 workers, in litdata's own venv): wall,
    CPU, the peak RSS of the parent and of its largest child."""
    src = os.path.join(work, f"tree-{n}")
    found: Dict[str, Any] = {}
    runs = [("webdataset", [sys.executable, "-c", PEER_WDS])]
    if python_litdata:
        runs.append(("litdata", [python_litdata, "-c", PEER_LITDATA]))
    for name, cmd in runs:
        out = os.path.join(work, f"peer-{name}-{n}")
        shutil.rmtree(out, ignore_errors=True)
        r = run_sampled(cmd + [src, out], env={**os.environ, "TQDM_DISABLE": "1"})
        found[name] = {"seconds": r["seconds"], "cpu_seconds": r["cpu_seconds"], "parent_rss": r["peak_rss"],
                       "child_rss": r["children_peak_rss"]}
        shutil.rmtree(out, ignore_errors=True)
    return found


def measure(work: str, n: int, kind: str, peers_up_to: int = 0, python_litdata: Optional[str] = None,
            drop_source: bool = False) -> Dict[str, Any]:
    src = os.path.join(work, f"{kind}-{n}")
    (make_tree if kind == "tree" else make_tars)(src, n)
    out = os.path.join(work, f"out-{kind}-{n}")
    shutil.rmtree(out, ignore_errors=True)
    dsconvert = [sys.executable, "-m", "dsconvert"]
    extra = ["--label", "cls"] if kind == "tars" else []
    # a first conversion: the tars' saved indexes (beside them) are built again, as a user's first run builds them
    shutil.rmtree(os.path.join(src, ".dsconvert-index"), ignore_errors=True)
    conv = run_sampled(dsconvert + ["shard", src, "-o", out, "--format", "wds", "--workers", "2"] + extra)
    ver = run_sampled(dsconvert + ["verify", out])
    records = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)
                  if f.endswith((".idx", ".index.json")))
    row = {"kind": kind, "samples": n, "convert_seconds": conv["seconds"], "convert_cpu_seconds": conv["cpu_seconds"],
           "convert_parent_rss": conv["peak_rss"], "convert_worker_rss": conv["children_peak_rss"],
           "verify_rss": ver["peak_rss"], "verify_seconds": ver["seconds"], "record_bytes": records,
           "map": measure_reads(out, False), "stream": measure_reads(out, True)}
    if kind == "tree" and n <= peers_up_to:
        row["peers"] = measure_peers(work, n, python_litdata)
    if drop_source:  # the largest sizes: the next one needs the disk
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(row), flush=True)
    return row


FIGURES = (("conversion parent, peak RSS", lambda r: r["convert_parent_rss"]),
           ("conversion worker, peak RSS", lambda r: r["convert_worker_rss"]),
           ("verify, peak RSS", lambda r: r["verify_rss"]),
           ("map-style worker, private after 20 batches", lambda r: max(r["map"]["worker_private"])),
           ("... of which dirty (not the page cache's)",
            lambda r: max(r["map"]["worker_private_dirty"]) if "worker_private_dirty" in r["map"] else None),
           ("stream worker, private after 20 batches", lambda r: max(r["stream"]["worker_private"])),
           ("shard records on disk", lambda r: r["record_bytes"]))


def growth(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per figure, bytes per sample between consecutive sizes, and the exponent."""
    out = []
    for name, get in FIGURES:
        if any(get(r) is None for r in rows):  # not measured by the run that wrote these rows
            continue
        steps = []
        for a, b in zip(rows, rows[1:]):
            va, vb = get(a), get(b)
            steps.append({"from": a["samples"], "to": b["samples"],
                          "bytes_per_sample": (vb - va) / (b["samples"] - a["samples"]),
                          "exponent": math.log(max(vb, 1) / max(va, 1)) / math.log(b["samples"] / a["samples"])})
        # the last step's growth: the smaller steps carry per-shard and per-tar costs that stop
        # growing once shards are full (10,000 samples); negative growth extrapolates as none
        rate = max(steps[-1]["bytes_per_sample"], 0.0) if steps else 0.0
        last = get(rows[-1])
        out.append({"figure": name, "steps": steps, "at_14M": last + rate * (14e6 - rows[-1]["samples"]),
                    "at_400M": last + rate * (400e6 - rows[-1]["samples"])})
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000, 1000000])
    p.add_argument("--kinds", nargs="+", default=["tree", "tars"], choices=["tree", "tars"])
    p.add_argument("--work", help="a scratch folder (default: in the temp dir; trees are kept there between runs)")
    p.add_argument("--peers-up-to", type=int, default=1000000,
                   help="write the trees up to this size with webdataset's ShardWriter and litdata's optimize too")
    p.add_argument("--python-litdata", help="litdata's interpreter (its own venv; without it litdata is left out)")
    p.add_argument("--drop", action="store_true",
                   help="remove each size's source and output once measured (the disk the next size needs)")
    p.add_argument("--json")


QUICK = ["--sizes", "300", "900", "--kinds", "tree"]


def run(args: argparse.Namespace) -> None:
    work = args.work or os.path.join(tempfile.gettempdir(), "dsconvert-bench-scale")
    os.makedirs(work, exist_ok=True)
    need = max(args.sizes) * 5000 * (1 if "tree" in args.kinds else 0)
    free = shutil.disk_usage(work).free
    if need > free:
        raise SystemExit(f"the largest tree needs about {need / 1e9:.0f} GB of file-system blocks, "
                         f"{free / 1e9:.0f} GB are free in {work}")
    result: Dict[str, Any] = {}
    for kind in args.kinds:
        rows = [measure(work, n, kind, args.peers_up_to, args.python_litdata, args.drop) for n in sorted(args.sizes)]
        result[kind] = {"rows": rows, "growth": growth(rows)}
    print(render_text(result))
    if args.json:
        from benchmarks.common import meta

        with open(args.json, "w") as f:
            json.dump({"meta": meta(), **result}, f, indent=1)


def _mb(v: float) -> str:
    return f"{v / 1e6:,.0f} MB" if abs(v) >= 1e6 else f"{v / 1e3:,.0f} kB"


def render_text(result: Dict[str, Any]) -> str:
    lines = []
    for kind, data in result.items():
        if kind == "meta":
            continue
        rows = data["rows"]
        lines.append(f"\n**{'ImageFolder of tiny JPEGs' if kind == 'tree' else 'foreign tar shards'}** "
                     f"(`--format wds --workers 2`)\n")
        sizes = [f"{r['samples']:,}" for r in rows]
        lines.append("| what | " + " | ".join(sizes) + " | per sample (each step) | exponent | at 14M | at 400M |")
        lines.append("| --- |" + " --- |" * (len(sizes) + 4))
        measured = {g["figure"]: g for g in growth(rows)}  # from the rows: the rule of this version
        for name, get in FIGURES:
            g = measured.get(name)
            if g is None:
                continue
            per = ", ".join(f"{s['bytes_per_sample']:,.1f} B" for s in g["steps"])
            exp = ", ".join(f"{s['exponent']:.2f}" for s in g["steps"])
            lines.append(f"| {name} | " + " | ".join(_mb(get(r)) for r in rows)
                         + f" | {per} | {exp} | {_mb(g['at_14M'])} | {_mb(g['at_400M'])} |")
        lines.append("| map-style: open, first batch | " + " | ".join(
            f"{r['map']['open_seconds']:.2f} s, {r['map']['first_batch_seconds']:.2f} s" for r in rows) + " | | | | |")
        lines.append("| stream: open, first batch | " + " | ".join(
            f"{r['stream']['open_seconds']:.2f} s, {r['stream']['first_batch_seconds']:.2f} s" for r in rows)
            + " | | | | |")
        lines.append("| conversion: wall, CPU | " + " | ".join(
            f"{r['convert_seconds']:.0f} s, {r['convert_cpu_seconds']:.0f} s" for r in rows) + " | | | | |")
        lines.append("| shard records, bytes per sample | " + " | ".join(
            f"{r['record_bytes'] / r['samples']:.1f}" for r in rows) + " | | | | |")
        lines += _peer_rows(rows)
    return "\n".join(lines)


PEER_ROWS = (("webdataset `ShardWriter` (1 process), peak RSS", "webdataset", "parent_rss"),
             ("webdataset `ShardWriter`: wall, CPU", "webdataset", None),
             ("litdata `optimize` parent, peak RSS", "litdata", "parent_rss"),
             ("litdata `optimize` worker, peak RSS", "litdata", "child_rss"),
             ("litdata `optimize`: wall, CPU", "litdata", None))


def _peer_rows(rows: List[Dict[str, Any]]) -> List[str]:
    """The peers' rows, where a size has them (``–`` where it was not run); memory with its
    growth per sample between the sizes that have it."""
    lines = []
    for name, peer, field in PEER_ROWS:
        had = [r for r in rows if peer in r.get("peers", {})]
        if not had:
            continue
        cells = []
        for r in rows:
            p = r.get("peers", {}).get(peer)
            cells.append("–" if p is None else _mb(p[field]) if field else
                         f"{p['seconds']:.0f} s, {p['cpu_seconds']:.0f} s")
        per = ", ".join(f"{(b['peers'][peer][field] - a['peers'][peer][field]) / (b['samples'] - a['samples']):,.1f} B"
                        for a, b in zip(had, had[1:])) if field else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {per} | | | |")
    return lines


def render(data: Dict[str, Any]) -> str:
    return render_text({k: v for k, v in data.items() if k != "meta"}).lstrip("\n") + "\n"


TABLES = {"scale": {"argv": lambda a: ["--sizes", "10000", "100000", "1000000", "--kinds", "tree", "--drop"]
                     + (["--python-litdata", a.python_litdata] if a.python_litdata else []), "render": render},
          # 10M samples as tars: ~31 GB of source and ~31 GB of output at once
          "scale_tars": {"argv": lambda a: ["--sizes", "100000", "1000000", "10000000", "--kinds", "tars", "--drop"],
                         "render": render}}
