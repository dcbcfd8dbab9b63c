"""Benchmark: where each sample's CPU time goes on the drop-in path, stage by stage.

The README's drop-in, ``DataLoader(open_dataset(out, T, decode="fused"), batch_size=B,
shuffle=True, num_workers=2)``, with the standard ImageNet train and eval transforms ending in
``PILToTensor``, runs over an output of demo photos while every stage is timed with the thread's
CPU clock (``time.thread_time_ns``: what a stage costs does not move with the load other
processes put on the machine, where wall time would). Each stage is a function of the path,
wrapped in its worker; its time is exclusive (a stage called inside another is not counted
twice). What no wrapper covers is named by where it runs:

* in each worker, the process's CPU time minus the wrapped stages: torch's worker loop (the
  index queue), the pickling and sending of each batch (the feeder thread: the IPC of the batch)
  and the wrappers' own clock reads;
* in the trainer's process, its whole CPU time while it iterates: the sampler, and receiving
  each batch (unpickling, mapping its shared memory). The sampler alone is timed too.

A second, unwrapped run of the same loader gives the total CPU per sample without the wrappers
(every process's CPU time: the workers' and the trainer's), which the stages add up to, less
the wrappers' cost.

With ``--before DIR`` (a checkout of an earlier revision: ``git worktree add DIR REV``) every
run is made with that checkout's dsconvert too, interleaved with this one's, and the table
shows both side by side. ``--outputs wds,wds-restart`` measures the shards written with
``--jpeg-restart`` too (columns marked ``restart``), in the same rounds.

    python -m benchmarks stages --photos 4000 --batch 64,256 --before ../main --json docs/bench/stages.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

from benchmarks.common import ROOT, meta

# (label, where it lives): the wrapped stages, in the order the table lists them
STAGES = [
    ("index lookup (order file, shard, sample)", "index"),
    ("shard read (pread, member header check)", "read"),
    ("JPEG policy check (arithmetic coding)", "check"),
    ("crop box draw (torch's generator)", "box"),
    ("region decode (libjpeg: entropy, IDCT, colour)", "decode"),
    ("resize (C kernel / Pillow)", "resize"),
    ("flip + CHW copy", "chw"),
    ("batch assembly (collate)", "collate"),
    ("batch tensor in shared memory, its pages made present", "alloc"),
    ("Python per sample (the rest of __getitems__)", "python"),
]


class Clock:
    """Exclusive thread-CPU time per stage: a stage's time less that of stages called inside it."""

    def __init__(self) -> None:
        self.totals: Dict[str, int] = {}
        self.stack: List[List[Any]] = []

    def wrap(self, name: str, fn: Callable) -> Callable:
        clock, now = self, time.thread_time_ns

        @functools.wraps(fn)
        def timed(*args: Any, **kw: Any) -> Any:
            frame = [now(), 0]
            clock.stack.append(frame)
            try:
                return fn(*args, **kw)
            finally:
                spent = now() - frame[0]
                clock.stack.pop()
                clock.totals[name] = clock.totals.get(name, 0) + spent - frame[1]
                if clock.stack:
                    clock.stack[-1][1] += spent
        return timed


def transform(kind: str) -> Any:
    import torchvision.transforms as T

    if kind == "train":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])


def instrument(ds: Any, clock: Clock, dump: str) -> None:
    """Wrap the drop-in path's stages (in this process: the workers inherit it by fork)."""
    import torch.utils.data._utils.collate as collate
    from PIL import Image

    from dsconvert import fused, optional, resample

    shard_type = type(ds.shard(0))
    shard_type.image = clock.wrap("read", shard_type.image)
    ds.where = clock.wrap("index", ds.where)
    fused.refuse_unverifiable = clock.wrap("check", fused.refuse_unverifiable)
    fused.rrc_box = clock.wrap("box", fused.rrc_box)
    ext = optional.jpeg_region()
    if ext is not None:
        class TimedRegion:
            region = staticmethod(clock.wrap("decode", ext.region))
        optional.jpeg_region = lambda: TimedRegion  # type: ignore[assignment]
    resample.resize_window = clock.wrap("resize", resample.resize_window)
    Image.Image.resize = clock.wrap("resize", Image.Image.resize)  # type: ignore[method-assign]
    fused._chw = clock.wrap("chw", fused._chw)
    if hasattr(fused, "_planes_into"):
        fused._planes_into = clock.wrap("chw", fused._planes_into)
    collate.default_collate = clock.wrap("collate", collate.default_collate)
    try:  # where a batch is decoded into one tensor: allocating it (the collate's pages, before)
        from dsconvert.readers import into_batch
    except ImportError:
        pass
    else:
        into_batch.new_batch = clock.wrap("alloc", into_batch.new_batch)
    getitems = clock.wrap("python", ds.__getitems__)
    pid_started: Dict[str, float] = {}

    def batch(indices: List[int]) -> Any:
        started = pid_started.setdefault("cpu", time.process_time())
        out = getitems(indices)
        clock.totals["samples"] = clock.totals.get("samples", 0) + len(indices)
        t = time.process_time_ns()
        with open(os.path.join(dump, f"{os.getpid()}.json"), "w") as f:
            json.dump({"totals": clock.totals, "cpu_ns": int((time.process_time() - started) * 1e9),
                       "dump_ns": clock.totals.get("dump", 0)}, f)
        clock.totals["dump"] = clock.totals.get("dump", 0) + time.process_time_ns() - t
        return out

    ds.__getitems__ = batch


def one_run(path: str, kind: str, batch: int, wrapped: bool) -> Dict[str, Any]:
    """One epoch of the drop-in; per-sample CPU microseconds by stage (``wrapped``) or in total."""
    import torch
    from torch.utils.data import DataLoader

    from dsconvert import open_dataset

    torch.manual_seed(0)
    ds = open_dataset(path, transform=transform(kind), decode="fused")
    dump = tempfile.mkdtemp(prefix="dsconvert-stages-")
    clock = Clock()
    if wrapped:
        instrument(ds, clock, dump)
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=2)
    n = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for images, labels in loader:
        assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.uint8
        n += len(labels)
    main_cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out: Dict[str, Any] = {"samples": n, "main_us": main_cpu / n * 1e6, "per_s": n / wall,
                           "peak_rss_worker_mb": children.ru_maxrss / 1024,
                           "peak_rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if not wrapped:
        out["workers_us"] = (children.ru_utime + children.ru_stime) / n * 1e6
        return out
    stages: Dict[str, float] = {}
    worker_cpu = counted = 0
    for name in os.listdir(dump):
        with open(os.path.join(dump, name)) as f:
            d = json.load(f)
        for stage, ns in d["totals"].items():
            if stage not in ("samples", "dump"):
                stages[stage] = stages.get(stage, 0) + ns / 1e3
        worker_cpu += (d["cpu_ns"] - d["dump_ns"]) / 1e3
        counted += d["totals"]["samples"]
        os.remove(os.path.join(dump, name))
    os.rmdir(dump)
    out["stages_us"] = {k: v / counted for k, v in stages.items()}
    out["worker_rest_us"] = (worker_cpu - sum(stages.values())) / counted
    # the sampler alone, in this process, as the DataLoader draws it
    from torch.utils.data import BatchSampler, RandomSampler

    t = time.thread_time()
    for _ in range(3):
        for _ in BatchSampler(RandomSampler(range(n)), batch, False):
            pass
    out["sampler_us"] = (time.thread_time() - t) / (3 * n) * 1e6
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=4000)
    p.add_argument("--per-shard", type=int, default=1000)
    p.add_argument("--batch", default="64,256", help="batch sizes, comma-separated")
    p.add_argument("--transforms", default="train,eval")
    p.add_argument("--rounds", type=int, default=3, help="runs of each; the median per stage")
    p.add_argument("--work", default=None, help="folder for the photos and the output (kept between runs)")
    p.add_argument("--json", default=None)
    p.add_argument("--before", default=None, help="a checkout of an earlier revision, measured in the same rounds")
    p.add_argument("--outputs", default="wds", help="outputs read, comma-separated: wds (the source's JPEGs), "
                   "wds-restart (written with --jpeg-restart)")
    p.add_argument("--child", nargs=6, metavar=("WORK", "KIND", "BATCH", "WRAPPED", "FROM", "OUTPUT"),
                   help=argparse.SUPPRESS)


def _median(values: List[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def run(a: argparse.Namespace) -> int:
    if a.child:
        work, kind, batch, wrapped, source, output = a.child
        if source != "-":  # that checkout's dsconvert, this one's benchmarks
            sys.path.insert(0, os.path.abspath(source))
        print(json.dumps(one_run(os.path.join(work, output), kind, int(batch), wrapped == "1")))
        return 0
    import subprocess

    from benchmarks.common import self_command
    from benchmarks.train_input import prepare_ours

    work = a.work or os.path.join(tempfile.gettempdir(), "dsconvert-bench-stages")
    os.makedirs(work, exist_ok=True)
    prepare_ours(work, a.photos, a.per_shard)
    results: Dict[str, Any] = {}
    versions = [("before", a.before), ("", "-")] if a.before else [("", "-")]
    outputs = [(output, "restart" if output == "wds-restart" else "") for output in a.outputs.split(",")]
    columns = [(" ".join(x for x in (label, tag) if x), source, output)
               for output, tag in outputs for label, source in versions]
    for kind in a.transforms.split(","):
        for batch in [int(b) for b in a.batch.split(",")]:
            runs: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
            for _ in range(a.rounds):
                for label, source, output in columns:
                    for wrapped in ("1", "0"):
                        proc = subprocess.run(self_command("stages", "--child", work, kind, str(batch), wrapped,
                                                           source, output),
                                              capture_output=True, text=True, check=True, cwd=ROOT,
                                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
                        runs.setdefault((label, wrapped), []).append(json.loads(proc.stdout.splitlines()[-1]))
            for label, _, _ in columns:
                name = f"{kind} {batch}" + (f" {label}" if label else "")
                results[name] = _entry(runs[(label, "1")], runs[(label, "0")], a.rounds)
                print(f"{name}: {results[name]['total_plain_us']:.0f} us/sample in all", file=sys.stderr)
    data = {"meta": meta(), "settings": {k: v for k, v in vars(a).items() if k != "child"}, "results": results}
    print(render(data))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


def _entry(w: List[Dict[str, Any]], p: List[Dict[str, Any]], rounds: int) -> Dict[str, Any]:
    """The medians over rounds of the wrapped runs ``w`` and the plain runs ``p``."""
    return {"stages_us": {key: _median([r["stages_us"].get(key, 0.0) for r in w]) for _, key in STAGES},
            "worker_rest_us": _median([r["worker_rest_us"] for r in w]),
            "main_us": _median([r["main_us"] for r in w]),
            "sampler_us": _median([r["sampler_us"] for r in w]),
            "total_plain_us": _median([r["workers_us"] + r["main_us"] for r in p]),
            "plain_workers_us": _median([r["workers_us"] for r in p]),
            "plain_main_us": _median([r["main_us"] for r in p]),
            "plain_per_s": _median([r["per_s"] for r in p]),
            "peak_rss_worker_mb": _median([r["peak_rss_worker_mb"] for r in p]),
            "rounds": rounds}


def render(data: Dict[str, Any]) -> str:
    results = data["results"]
    cols = list(results)
    lines = ["| stage (CPU us per sample) | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]
    for label, key in STAGES:
        lines.append(f"| {label} | " + " | ".join(f"{results[c]['stages_us'][key]:.0f}" for c in cols) + " |")
    lines.append("| worker: DataLoader loop, pickling and sending the batch (IPC), clock reads | "
                 + " | ".join(f"{results[c]['worker_rest_us']:.0f}" for c in cols) + " |")
    lines.append("| trainer process: sampler, receiving the batch (IPC) | "
                 + " | ".join(f"{results[c]['main_us']:.0f}" for c in cols) + " |")
    lines.append("| (of which the sampler alone) | " + " | ".join(f"{results[c]['sampler_us']:.1f}" for c in cols)
                 + " |")
    lines.append("| **all processes, unwrapped run** | "
                 + " | ".join(f"**{results[c]['total_plain_us']:.0f}**" for c in cols) + " |")
    lines.append("| samples/s of the unwrapped run (shared machine) | "
                 + " | ".join(f"{results[c]['plain_per_s']:,.0f}" for c in cols) + " |")
    lines.append("| peak RSS of a worker, MB | "
                 + " | ".join(f"{results[c]['peak_rss_worker_mb']:,.0f}" for c in cols) + " |")
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "32", "--per-shard", "16", "--rounds", "1", "--batch", "8", "--transforms", "train",
         "--work", os.path.join(tempfile.gettempdir(), "dsconvert-bench-stages-quick")]
TABLES = {
    "stages": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds)], "render": render},
    # the same drop-in over the source's JPEGs and over the shards written with --jpeg-restart
    "stages_restart": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds),
                                          "--outputs", "wds,wds-restart"], "render": render},
}
