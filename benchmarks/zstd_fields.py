"""Benchmark: --compress zstd on non-image fields: write speed, size and read cost for each level
against the uncompressed output, in interleaved rounds.

Each sample holds what LitData and MosaicML users store beside (or instead of) images: a 768-d
float32 embedding (``emb.npy``, L2-normalised Gaussian: embeddings are dense, near-random floats),
77 int64 token ids padded with zeros (``tokens.npy``, as CLIP's tokenizer gives them), 5-20 int64
label ids (``labels.npy``), JSON metadata with a caption (``json``) and a longer text (``txt``).
The text is real English: sentences of the standard library's docstrings, seeded; the token ids
are its words hashed into a 49,408-word vocabulary. Every sample is made in memory before any
timing; the same samples for every level.

Every write and read runs once untimed first (imports, first opens, the page cache). Each
round, in a shuffled order (seeded by the round): every setting writes the samples with
``dsconvert.Writer`` in one process (1,000 samples a shard; a fresh folder each time), and reads
every field of every sample of an output written before the rounds, map-style through
``open_dataset``, with ``decode="raw"`` (the stored fields' bytes, decompressed where needed) and
with ``decode="numpy"`` (arrays, JSON and text decoded). Page cache warm. The figures are medians
with the range over rounds; the ratios are each setting's time over the uncompressed output's
in the same round, their median.

    python -m benchmarks zstd_fields --samples 2000 --rounds 5 --json docs/bench/zstd_fields.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import re
import shutil
import statistics
import tempfile
import zlib
from typing import Any, Dict, List

import numpy as np

from benchmarks.common import fmt_spread, interleaved, spread
from dsconvert import Manifest, Writer, open_dataset
from dsconvert.codecs import codec_version
from dsconvert.formats import get

LEVELS = (1, 3, 9, 19)
FIELDS = ("emb.npy", "tokens.npy", "labels.npy", "json", "txt")
_MODULES = ("argparse", "collections", "csv", "email.message", "json", "logging", "os", "pathlib", "shutil",
            "subprocess", "tarfile", "threading", "typing", "unittest", "urllib.request", "zipfile")


def english() -> List[str]:
    """Sentences of the standard library's docstrings (real English, the same on every machine
    with this Python)."""
    import importlib

    sentences: List[str] = []
    for name in _MODULES:
        module = importlib.import_module(name)
        for _, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc:
                for s in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                    if 20 <= len(s) <= 300 and not s.startswith((">>>", "...")):
                        sentences.append(s)
    return sorted(set(sentences))


def make_samples(n: int) -> List[Dict[str, Any]]:
    rng = np.random.default_rng(0)
    sentences = english()
    pick = random.Random(0)
    samples = []
    for i in range(n):
        emb = rng.standard_normal(768).astype(np.float32)
        text = " ".join(pick.choice(sentences) for _ in range(pick.randint(2, 12)))
        words = text.lower().split()
        tokens = np.zeros(77, dtype=np.int64)
        ids = [zlib.crc32(w.encode()) % 49408 for w in words[:75]]
        tokens[: len(ids) + 2] = [49406, *ids, 49407]
        caption = pick.choice(sentences)
        samples.append({
            "__key__": f"{i:08d}",
            "emb.npy": emb / np.linalg.norm(emb),
            "tokens.npy": tokens,
            "labels.npy": np.sort(rng.choice(1000, size=int(rng.integers(5, 21)), replace=False)).astype(np.int64),
            "json": {"caption": caption, "url": f"https://images.example.org/{rng.integers(1 << 40):x}.jpg",
                     "width": int(rng.integers(256, 2048)), "height": int(rng.integers(256, 2048)),
                     "similarity": round(float(rng.random()), 4), "aesthetic": round(float(rng.random() * 10), 3),
                     "license": pick.choice(["cc-by", "cc-by-sa", "cc0", "unknown"]),
                     "tags": [pick.choice(sentences).split()[0].lower() for _ in range(int(rng.integers(2, 8)))]},
            "txt": text,
        })
    return samples


def write(samples: List[Dict[str, Any]], out: str, level: int) -> None:
    with Writer(out, samples_per_shard=1000, compress=f"zstd:{level}" if level else None) as w:
        for s in samples:
            w.write(s)


def read(out: str, decode: str) -> int:
    ds = open_dataset(out, decode=decode, stream=False)
    n = 0
    for i in range(len(ds)):
        n += len(ds[i])
    return n


def stored_sizes(out: str) -> Dict[str, Dict[str, int]]:
    """Per field: bytes stored (the members' data) and bytes before compression, from the records."""
    m = Manifest.load(out)
    fmt = get(m.format)
    sizes: Dict[str, Dict[str, int]] = {}
    for entry in m.shards:
        record = fmt.load_record(os.path.join(out, entry.index), None)
        packed = record.d.get("compression", {}).get("fields", {})
        for name, col in record.d["members"].items():
            field = packed.get(name, name)
            got = sizes.setdefault(field, {"stored": 0, "raw": 0})
            got["stored"] += sum(col["size"])
            got["raw"] += sum(col.get("raw_size", col["size"]))
    return sizes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    samples = make_samples(args.samples)
    settings = [0, *args.levels]  # 0: uncompressed
    work = tempfile.mkdtemp(prefix="dsconvert-bench-compress-")
    try:
        outs = {}
        for level in settings:
            outs[level] = os.path.join(work, f"out-{level}")
            write(samples, outs[level], level)
        shard_bytes = {level: sum(s.bytes for s in Manifest.load(out).shards)
                       for level, out in outs.items()}
        fields = {level: stored_sizes(out) for level, out in outs.items()}
        counter = iter(range(1 << 30))

        def writer(level: int):
            def go() -> None:
                out = os.path.join(work, f"w-{level}-{next(counter)}")
                write(samples, out, level)
                shutil.rmtree(out)
            return go

        runs = {}
        for level in settings:
            runs[f"write {level}"] = writer(level)
            runs[f"read raw {level}"] = lambda out=outs[level]: read(out, "raw")
            runs[f"read numpy {level}"] = lambda out=outs[level]: read(out, "numpy")
        for warm in runs.values():  # imports (torch, with the readers), first opens, the page cache: untimed
            warm()
        seconds = interleaved(runs, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    payload = sum(f["raw"] for f in fields[0].values())
    rows = []
    for level in settings:
        row: Dict[str, Any] = {"level": level, "bytes": shard_bytes[level],
                               "size_ratio": shard_bytes[level] / shard_bytes[0],
                               "fields": {f: v["stored"] / v["raw"] for f, v in fields[level].items()}}
        for task in ("write", "read raw", "read numpy"):
            secs = seconds[f"{task} {level}"]
            key = task.replace(" ", "_")
            row[key + "_per_s"] = spread([args.samples / s for s in secs])
            row[key + "_ratio"] = spread([s / b for s, b in zip(secs, seconds[f"{task} 0"])])
        row["write_mb_per_s"] = statistics.median(payload / 1e6 / s for s in seconds[f"write {level}"])
        rows.append(row)
        print(f"{'none' if not level else f'zstd:{level}':8s} {shard_bytes[level] / 1e6:7.2f} MB "
              f"({row['size_ratio']:.2f}x)  write {row['write_per_s']['median']:8,.0f}/s "
              f"({row['write_ratio']['median']:.2f}x)  read raw {row['read_raw_per_s']['median']:8,.0f}/s "
              f"({row['read_raw_ratio']['median']:.2f}x)  read numpy {row['read_numpy_per_s']['median']:8,.0f}/s "
              f"({row['read_numpy_ratio']['median']:.2f}x)", flush=True)
    if args.json:
        from benchmarks.common import meta as record

        meta = dict(record(), samples=args.samples, rounds=args.rounds, payload_bytes=payload,
                    versions_zstd=codec_version(),
                    loaded="The machine was shared with a CI run (2 cores): figures move with its load")
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    rows = data["rows"]
    names = {0: "none (uncompressed)"}
    lines = [f"{meta['samples']:,} samples ({meta['payload_bytes'] / 1e6:.1f} MB of fields: a 768-d float32 "
             "embedding, 77 token ids and 5-20 label ids as int64 .npy, JSON metadata, English text), "
             f"{meta.get('versions_zstd', 'zstd')}; `dsconvert.Writer` in one process, `open_dataset` map-style, "
             f"page cache warm; {meta['rounds']} interleaved rounds, median [range]; ratios: time over the "
             "uncompressed output's in the same round. " + _sentence(meta.get("loaded", "")),
             "",
             "| setting | shards, MB | size | write, samples/s | write time | read raw, samples/s | read raw time "
             "| read decoded, samples/s | read decoded time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {names.get(r['level'], 'zstd:' + str(r['level']))} | {r['bytes'] / 1e6:.2f} | "
                     f"{r['size_ratio']:.2f}x | {fmt_spread(r['write_per_s'])} | "
                     f"{fmt_spread(r['write_ratio'], '{:.2f}x')} | "
                     f"{fmt_spread(r['read_raw_per_s'])} | {fmt_spread(r['read_raw_ratio'], '{:.2f}x')} | "
                     f"{fmt_spread(r['read_numpy_per_s'])} | {fmt_spread(r['read_numpy_ratio'], '{:.2f}x')} |")
    fields = [f for f in FIELDS if f in rows[0]["fields"]]
    lines += ["", "| stored / original bytes, members' data (no tar blocks) | " + " | ".join(f"`{f}`" for f in fields)
              + " |", "| --- |" + " --- |" * len(fields)]
    for r in rows[1:]:
        lines.append(f"| zstd:{r['level']} | " + " | ".join(f"{r['fields'][f]:.2f}" for f in fields) + " |")
    return "\n".join(lines) + "\n"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "." if text else ""


QUICK = ["--samples", "60", "--rounds", "1", "--levels", "1", "3"]
TABLES = {"zstd_fields": {"argv": lambda a: ["--samples", "2000", "--rounds", str(a.rounds)], "render": render}}
