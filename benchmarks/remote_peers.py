"""Benchmark: the default remote read, ``open_dataset(url)``, against litdata's, MosaicML
Streaming's and webdataset's from the same S3 server (moto on 127.0.0.1), with 0 ms and ~20 ms
added per request (tests/support/latency_proxy.py): raw reads (bytes and label, no decode), a
DataLoader with 2 workers and batches of 64, epoch 1 (from the server, into each reader's cache
where it keeps one) and epoch 2 (the same loader again). Every reader's epoch 1 is timed alike,
from before its dataset is constructed to its last batch, so that what a reader starts at open
(downloads in background threads) counts in its epoch; the construction's own time (dataset and
DataLoader) is reported beside it as ``open_s`` (:func:`timed_epochs`). Each contender runs in a fresh process
with a fresh cache, once per round, in an order shuffled per round; medians and ranges over the
rounds, and each ratio the median of the per-round ratios against litdata.

    python -m benchmarks remote_peers --photos 2000 --rounds 3 --python-litdata /tmp/peer-litdata/bin/python \\
        --python-mosaic /tmp/peer-mosaic/bin/python --json docs/bench/remote_peers.json

litdata and MosaicML Streaming run in their own virtual environments (``--python-litdata``,
``--python-mosaic``: a venv where ``pip install litdata s3fs boto3`` or ``pip install
mosaicml-streaming`` put them, torch included); each writes its own copy of the same photos
(litdata.optimize, MDSWriter) with chunks of about dsconvert's shard size. Without an
interpreter, that peer is left out. webdataset reads the dsconvert output's tars (they are
webdataset tars) through presigned URLs with curl, as its docs show for S3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List

from benchmarks.common import ROOT, fmt_spread, meta, self_command, spread

SUITE = "remote_peers"
CONTENDERS = ("dsconvert", "dsconvert_stream", "litdata", "mosaic", "webdataset")
LABELS = {"dsconvert": "dsconvert `open_dataset(url)` (the default: a local cache, map-style, shuffled)",
          "dsconvert_stream": "dsconvert `open_dataset(url, cache_dir=False)` (the stream, no cache)",
          "litdata": "litdata `StreamingDataset` (its own cache)",
          "mosaic": "MosaicML Streaming `StreamingDataset` (its own cache)",
          "webdataset": "webdataset `WebDataset` over presigned URLs with curl (no cache)"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--shards", type=int, default=8, help="dsconvert shards (the peers' chunks: about that size)")
    p.add_argument("--delays", default="0,20", help="ms added per request, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--python-litdata", help="litdata's interpreter (its own venv)")
    p.add_argument("--python-mosaic", help="MosaicML Streaming's interpreter (its own venv)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-remote-peers"))
    p.add_argument("--json")
    p.add_argument("--child", nargs=2, metavar=("KIND", "CONFIG"), help=argparse.SUPPRESS)
    p.add_argument("--child-write", nargs=4, metavar=("KIND", "SRC", "OUT", "BYTES"), help=argparse.SUPPRESS)


# --- the peers' copies, written in their own environments --------------------------------------


def _items(src: str) -> List[Any]:
    from dsconvert.source import scan

    return [(os.path.join(src, s.files[0].path), s.label) for s in scan(src).samples]


def _read_item(item: Any) -> Dict[str, Any]:
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def child_write(kind: str, src: str, out: str, chunk_bytes: int) -> None:
    shutil.rmtree(out, ignore_errors=True)
    items = _items(src)
    if kind == "litdata":
        import litdata

        litdata.optimize(fn=_read_item, inputs=items, output_dir=out, chunk_bytes=chunk_bytes, num_workers=1,
                         verbose=False)
    else:
        from streaming import MDSWriter

        with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, size_limit=chunk_bytes) as writer:
            for item in items:
                writer.write(_read_item(item))


# --- one contender, two epochs, in its own process -------------------------------------------


def _passthrough(samples: List[Any]) -> Any:
    """The batch as the workers made it (bytes of differing lengths, labels): what reaches the
    trainer is the same for every contender."""
    return [s[0] for s in samples], [s[1] for s in samples]


def timed_epochs(open_loader: Callable[[], Any], n: int, kind: str = "",
                 clock: Callable[[], float] = time.perf_counter) -> Dict[str, float]:
    """Two epochs of the loader ``open_loader`` builds, timed the same way for every reader:
    epoch 1 from before its dataset is constructed (what a reader does at open, downloads
    started there included) to its last batch; epoch 2 the same loader again. ``open_s``: the
    construction alone (dataset and DataLoader), inside epoch 1."""
    t = clock()
    loader = open_loader()
    opened = clock()
    out = {"open_s": opened - t}
    for epoch in ("epoch1", "epoch2"):
        got = sum(len(images) for images, _ in loader)
        now = clock()
        out[epoch] = got / (now - t)
        t = now
        if got != n:
            raise SystemExit(f"{kind}: {got} samples in an epoch, not {n}")
    return out


def child(kind: str, config: Dict[str, Any]) -> Dict[str, Any]:
    """One contender's two epochs. Its libraries are imported first, outside the timer, the
    storage client each reaches S3 with included (dsconvert's s3fs, which fsspec imports on
    first use; MosaicML Streaming's boto3, which it imports at its first download; litdata
    imports its own with itself): all the reader does at open is inside the timer."""
    import torch

    so, cache = config["storage_options"], config["cache"]
    loader_kw = dict(batch_size=config["batch"], num_workers=config["workers"], collate_fn=_passthrough)
    if kind in ("dsconvert", "dsconvert_stream"):
        import s3fs  # noqa: F401  (imported outside the timer, as every reader's client is)

        from dsconvert import open_dataset

        os.environ["DSCONVERT_CACHE"] = cache

        def make() -> Any:
            ds = open_dataset(config["url"], decode="raw", storage_options=so,
                              **({"cache_dir": False} if kind == "dsconvert_stream" else {}))
            return torch.utils.data.DataLoader(ds, shuffle=kind == "dsconvert", **loader_kw)
    elif kind == "litdata":
        import litdata

        try:  # its Rust S3 client (obstore) refuses plain http unless told: the loopback server is http
            from litdata.streaming import downloader

            downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[attr-defined]
        except (ImportError, AttributeError, TypeError):
            pass

        def make() -> Any:
            ds = litdata.StreamingDataset(config["url"], cache_dir=cache, shuffle=True, transform=_pair,
                                          storage_options={"endpoint_url": so["client_kwargs"]["endpoint_url"],
                                                           "region_name": so["client_kwargs"]["region_name"]})
            return torch.utils.data.DataLoader(ds, **loader_kw)
    elif kind == "mosaic":
        import boto3  # noqa: F401  (imported outside the timer, as every reader's client is)

        os.environ["S3_ENDPOINT_URL"] = so["client_kwargs"]["endpoint_url"]

        def make() -> Any:
            ds = _MosaicPairs(remote=config["url"], local=cache, batch_size=config["batch"], shuffle=True)
            return torch.utils.data.DataLoader(ds, **loader_kw)
    else:
        import webdataset

        urls = [f"pipe:curl -s -f '{u}'" for u in config["urls"]]

        def make() -> Any:
            ds = (webdataset.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
                  .to_tuple("jpg", "cls").map_tuple(lambda b: b, lambda c: int(c)))
            return torch.utils.data.DataLoader(ds, **loader_kw)
    return timed_epochs(make, config["n"], kind)


def _pair(sample: Dict[str, Any]) -> Any:
    """litdata's (image, label); its bytes fields may come as memoryviews of its chunk, which
    cannot cross from a worker to the trainer (the DataLoader's queue hangs on the pickling
    error): bytes, as every other reader gives."""
    image = sample["image"]
    return bytes(image) if isinstance(image, memoryview) else image, sample["label"]


try:  # MosaicML Streaming's dataset, giving (image, label) as the others do (only in its environment)
    from streaming import StreamingDataset as _MosaicBase

    class _MosaicPairs(_MosaicBase):  # type: ignore[misc,valid-type]
        def __getitem__(self, i: Any) -> Any:
            sample = super().__getitem__(i)
            return sample["image"], sample["label"]
except ImportError:
    _MosaicPairs = None  # type: ignore[assignment,misc]


# --- the rounds ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    if args.child_write:
        kind, src, out, nbytes = args.child_write
        child_write(kind, src, out, int(nbytes))
        return
    if args.child:
        kind, config = args.child
        print(json.dumps(child(kind, json.load(open(config)))))
        return
    measure(args)


def measure(args: argparse.Namespace) -> None:
    import boto3
    import s3fs

    from dsconvert import convert
    from dsconvert.demo import make_demo_dataset
    from tests.support import latency_proxy, s3server

    os.environ.update(s3server.CREDENTIALS)
    src = make_demo_dataset(os.path.join(args.work, f"photos-{args.photos}"), num_per_class=args.photos // 8)
    local = os.path.join(args.work, f"wds-{args.photos}-{args.shards}")
    per_shard = -(-args.photos // args.shards)
    convert(src, local, samples_per_shard=per_shard)
    tars = sorted(f for f in os.listdir(local) if f.endswith(".tar"))
    shard_bytes = sum(os.path.getsize(os.path.join(local, f)) for f in tars)
    chunk = shard_bytes // len(tars) + 1
    pythons = {"litdata": args.python_litdata, "mosaic": args.python_mosaic}
    copies = {}
    for kind, python in pythons.items():
        if python:
            out = os.path.join(args.work, f"{kind}-{args.photos}-{args.shards}")
            subprocess.run(self_command(SUITE, "--child-write", kind, src, out, str(chunk), python=python),
                           cwd=ROOT, check=True)
            copies[kind] = out
    contenders = [c for c in CONTENDERS if c not in pythons or pythons[c]]
    tags = [f"{float(d):g}" for d in args.delays.split(",")]
    vals: Dict[str, List[float]] = {}
    started = time.perf_counter()
    server, endpoint = s3server.start()
    proxies: List[subprocess.Popen] = []
    try:
        fs = s3fs.S3FileSystem(**s3server.storage_options(endpoint))
        bucket = f"peers-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        fs.put(local, f"{bucket}/wds", recursive=True)
        for kind, out in copies.items():
            fs.put(out, f"{bucket}/{kind}", recursive=True)
        port = int(endpoint.rsplit(":", 1)[1])
        endpoints = {}
        for tag in tags:
            if float(tag):
                proxy, pport = latency_proxy.start(port, float(tag))
                proxies.append(proxy)
                endpoints[tag] = f"http://127.0.0.1:{pport}"
            else:
                endpoints[tag] = endpoint
        n = args.photos // 8 * 8

        def one(kind: str, tag: str) -> None:
            cache = os.path.join(args.work, "cache", kind)
            shutil.rmtree(cache, ignore_errors=True)
            so = s3server.storage_options(endpoints[tag])
            config: Dict[str, Any] = {"storage_options": so, "cache": cache, "n": n, "batch": args.batch,
                                      "workers": args.workers,
                                      "url": f"s3://{bucket}/{'wds' if kind.startswith('dsconvert') else kind}"}
            if kind == "webdataset":
                client = boto3.client("s3", endpoint_url=endpoints[tag], region_name="eu-west-1")
                config["urls"] = [client.generate_presigned_url("get_object", Params={"Bucket": bucket,
                                                                                      "Key": f"wds/{t}"})
                                  for t in tars]
            path = os.path.join(args.work, "child.json")
            with open(path, "w") as f:
                json.dump(config, f)
            done = subprocess.run(self_command(SUITE, "--child", kind, path, python=pythons.get(kind)), cwd=ROOT,
                                  capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
            if done.returncode:
                raise RuntimeError(f"{kind} at {tag} ms failed: {done.stderr.strip()[-2000:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            for what in ("epoch1", "epoch2", "open_s"):
                vals.setdefault(f"{kind}@{tag}:{what}", []).append(got[what])
            shutil.rmtree(cache, ignore_errors=True)

        for r in range(args.rounds):
            order = [(kind, tag) for kind in contenders for tag in tags]
            random.Random(r).shuffle(order)
            t = time.perf_counter()
            for kind, tag in order:
                one(kind, tag)
            print(f"round {r + 1} in {time.perf_counter() - t:.0f} s: " + ", ".join(
                f"{k} {v[-1]:,.0f}" for k, v in sorted(vals.items())), flush=True)
    finally:
        for proxy in proxies:
            s3server.end(proxy)
        s3server.stop(server)

    reading = {kind: {tag: {e: spread(vals[f"{kind}@{tag}:{e}"]) for e in ("epoch1", "epoch2", "open_s")}
                      for tag in tags} for kind in contenders}
    ratios: Dict[str, Any] = {}
    if "litdata" in contenders:
        for kind in contenders:
            ratios[kind] = {tag: {e: spread([a / b for a, b in zip(vals[f"{kind}@{tag}:{e}"],
                                                                   vals[f"litdata@{tag}:{e}"])])
                                  for e in ("epoch1", "epoch2")} for tag in tags}
    res: Dict[str, Any] = {
        "meta": meta(), "photos": n, "shards": len(tars), "shard_bytes": shard_bytes, "delays_ms": tags,
        "rounds": args.rounds, "workers": args.workers, "batch": args.batch, "contenders": contenders,
        "peer_versions": {kind: _versions(python) for kind, python in pythons.items() if python},
        "wall_s": time.perf_counter() - started, "reading": reading, "vs_litdata": ratios}
    print(f"\n{n} samples, {args.rounds} rounds: median [range] samples/s (epoch 1 timed from before the open), "
          "open_s: seconds to construct the dataset and its DataLoader")
    for k in sorted(vals):
        v = vals[k]
        cell = "{:10,.3f} [{:,.3f}-{:,.3f}]" if k.endswith("open_s") else "{:10,.0f} [{:,.0f}-{:,.0f}]"
        print(f"{k:36s} " + cell.format(statistics.median(v), min(v), max(v)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def _versions(python: str) -> Dict[str, str]:
    code = ("import json, importlib.metadata as m\nout = {}\nfor p in ('litdata', 'mosaicml-streaming', 'torch'):\n"
            "    try: out[p] = m.version(p)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def render(data: Dict[str, Any]) -> str:
    tags = data["delays_ms"]
    peers = "; ".join(f"{k}: " + ", ".join(f"{p} {v}" for p, v in vs.items())
                      for k, vs in data.get("peer_versions", {}).items())
    lines = [f"{data['photos']:,} demo photos, raw reads (bytes and label, no decode) from moto's S3 server on "
             f"127.0.0.1: dsconvert's wds output in {data['shards']} shards ({data['shard_bytes'] / 1e6:.0f} MB), "
             "litdata's and MosaicML Streaming's own copies of the same photos in chunks of about that size; a "
             "delay > 0 puts a TCP proxy (`tests/support/latency_proxy.py`) in front of the server that delays "
             f"every request. A DataLoader with {data['workers']} workers and batches of {data['batch']}; epoch 1 "
             "from the server (into each reader's cache where it keeps one), timed from before the reader's "
             "dataset is constructed to its last batch (what each does at open, downloads it starts there "
             "included; \"open (s)\": that construction alone, dataset and DataLoader, in seconds), epoch 2 the same "
             "loader again. Each "
             f"contender in a fresh process with a fresh cache, {data['rounds']} interleaved rounds in a shuffled "
             "order; median [range] samples/s, and against litdata the median of the per-round ratios"
             + (f" (peers' environments: {peers})." if peers else "."), "",
             "| reader | " + " | ".join(f"{t} ms, {e}" for t in tags for e in ("open (s)", "epoch 1", "epoch 2"))
             + " |", "| --- |" + " --- |" * (3 * len(tags))]
    for kind in data["contenders"]:
        got = data["reading"][kind]
        cells = [("–" if e not in got[t] else  # open_s: not in the results of earlier runs
                  fmt_spread(got[t][e], "{:.2f}") if e == "open_s" else fmt_spread(got[t][e]))
                 for t in tags for e in ("open_s", "epoch1", "epoch2")]
        lines.append(f"| {LABELS[kind]} | " + " | ".join(cells) + " |")
    if data.get("vs_litdata"):
        lines += ["", "| against litdata (same round) | " + " | ".join(
            f"{t} ms, epoch {e}" for t in tags for e in (1, 2)) + " |", "| --- |" + " --- |" * (2 * len(tags))]
        for kind in data["contenders"]:
            if kind == "litdata":
                continue
            cells = [fmt_spread(data["vs_litdata"][kind][t][e], "{:.2f}x") for t in tags for e in ("epoch1", "epoch2")]
            lines.append(f"| {LABELS[kind].split(' (')[0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "64", "--shards", "2", "--delays", "0", "--rounds", "1",
         "--work", os.path.join(tempfile.gettempdir(), "dsconvert-bench-remote-peers-quick")]
TABLES = {"remote_peers": {
    "argv": lambda a: ["--photos", "2000", "--rounds", str(a.rounds)]
    + (["--python-litdata", a.python_litdata] if a.python_litdata else [])
    + (["--python-mosaic", a.python_mosaic] if getattr(a, "python_mosaic", None) else []),
    "render": render, "needs": lambda a: a.python_litdata}}


if __name__ == "__main__":  # pragma: no cover - run through python -m benchmarks
    sys.exit("run: python -m benchmarks remote_peers --help")
