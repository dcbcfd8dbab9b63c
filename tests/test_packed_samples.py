"""A shard spec's samples packed (issue 39: conversion workers in bounded memory): the same
samples back, the same spec digest as the implementation every earlier output was written with,
and the memory and pickle a sample costs, the same at N and 10N."""

from __future__ import annotations

import gc
import hashlib
import json
import pickle
import random
import tracemalloc
from dataclasses import asdict, fields, replace

import numpy as np
import pytest

from dsconvert.packed_samples import PackedSamples, pack_samples
from dsconvert.plan import ShardSpec
from dsconvert.samples import Sample, SourceFile

_FILE_FIELDS = tuple(f.name for f in fields(SourceFile))


def _old_digest(spec: ShardSpec) -> str:
    """ShardSpec.digest as dsconvert 0.1 computed it (every sample a dict, one JSON string):
    what the records of finished shards hold, which a resumed run compares with."""
    d = asdict(replace(spec, samples=(), positions=()))
    d["positions"] = tuple(int(p) for p in spec.positions)
    d["samples"] = [{"key": s.key, "files": [{name: getattr(f, name) for name in _FILE_FIELDS} for f in s.files],
                     "label": s.label} for s in spec.samples]
    if not d["positions"]:
        d.pop("positions")
    for volatile in ("out_dir", "strict", "storage_options", "owner"):
        d.pop(volatile)
    if d["source_kind"] == "files":
        d.pop("source_kind")
        for sample in d["samples"]:
            for f in sample["files"]:
                f.pop("container")
                f.pop("offset")
    return hashlib.sha256(json.dumps(d, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def _tree_samples(n: int, start: int = 0):
    return [Sample(f"c{i % 7:04d}/img_{i:08d}", (SourceFile("jpg", f"c{i % 7:04d}/img_{i:08d}.jpg", 1000 + i,
                                                             1_700_000_000_000_000_000 + i),), i % 7)
            for i in range(start, start + n)]


def _tar_samples(n: int, unlabelled: bool = False):
    out = []
    for i in range(n):
        tar, key = f"part-{i // 100:06d}.tar", f"s{i:09d}"
        out.append(Sample(key, (SourceFile("cls", f"{tar}/{key}.cls", 1, 5, tar, 512 + 3072 * (i % 100)),
                                SourceFile("jpg", f"{tar}/{key}.jpg", 1200, 5, tar, 1536 + 3072 * (i % 100))),
                          None if unlabelled else i % 1000))
    return out


def _parquet_samples(n: int):
    return [Sample(f"train-{i:06d}", (SourceFile("jpg", f"train.parquet/rows/{i}", 2 ** 33 + i, -7, "train.parquet", i),
                                      SourceFile("json", f"train.parquet/rows/{i}/json", 0, -7, "train.parquet", i)),
                   None) for i in range(n)]


def _odd_samples():
    long = "d/" * 300 + "é" * 200
    return [
        Sample("ключ/写真", (SourceFile("jpg", "ключ/写真.JPG", 0, 0),), None),
        Sample("bad\udcff", (SourceFile("jpg", "bad\udcff.jpg", 3, 4),), 0),  # a name that is not UTF-8
        Sample("caf\u00e9 \U0001F600", (SourceFile("png", "t.tar/caf\u00e9 \U0001F600.png", 7, 8, "t.tar", 1536),),
               2 ** 63 - 1),
        Sample(long, (SourceFile("json", long + ".json", 2 ** 40, -5), SourceFile("png", "other/" + long, 7, 8))),
        Sample("b", (SourceFile("jpg", "b", 4, 2, "part-1.tar", 0),), -(2 ** 63)),  # the path is the key
        Sample("", (SourceFile("jpg", ".jpg", 1, 1),), 1),  # an empty key
        Sample("x", (SourceFile("jpg", "t.tarx/x.jpg", 1, 1, "t.tar", 9),), 1),  # starts with the name, not NAME/
        Sample("y", (SourceFile("jpg", "t.tar/z/y.jpg", 1, 1, "t.tar", 9),), 1),  # in it, not after the key
        Sample('q"\\\n\t', (SourceFile("a.b", 'q"\\\n\t.a.b', 1, 1),), 1),  # what JSON escapes
        Sample("c", (), None),  # no files
    ]


def _specs():
    """Specs of every kind a conversion makes, and then some."""
    rng = random.Random(5)
    tar = _tar_samples(2500)
    shuffled = tar[:]
    rng.shuffle(shuffled)
    sizes = (0, 1, 1023, 1024, 1025, 2049)
    for n in sizes:  # around the slices the digest is streamed in
        yield ShardSpec("wds", 3, "shard-000003.tar", "/src", "/out", "classification", _tree_samples(n))
        yield ShardSpec("wds", 3, "shard-000003.tar", "/src", "/out", "classification", shuffled[:n],
                        options={"compress": {"codec": "zstd", "level": 3}, "resize": [224, 224]},
                        source_kind="tar", positions=tuple(rng.sample(range(10 ** 9), n)))
    yield ShardSpec("wds", 0, "s.tar", "/src", "/out", "dict", _tar_samples(300, unlabelled=True), source_kind="tar")
    yield ShardSpec("hdf5", 1, "s.h5", "/", "/o", "dict", _parquet_samples(700), False, 10 ** 8, True,
                    {"decode": True, "size": [32, 32]}, {"anon": True}, "parquet", owner="tok")
    odd = _odd_samples()
    for kind in ("files", "tar", "output"):
        yield ShardSpec("wds", 7, "shard-000007.tar", "/s\u00e9rc", "/out", "dict", odd, source_kind=kind,
                        positions=tuple(range(len(odd)))[::-1])


@pytest.mark.parametrize("spec", list(_specs()), ids=lambda s: f"{s.source_kind}-{len(s.samples)}")
def test_the_digest_of_packed_samples_is_the_old_one(spec):
    want = _old_digest(spec)
    assert spec.digest() == want  # the samples as given, streamed
    packed = pack_samples(spec.samples)
    assert isinstance(packed, PackedSamples)
    positions = np.asarray(spec.positions, dtype=np.int64)
    for made in (replace(spec, samples=packed), replace(spec, samples=packed, positions=positions)):
        assert made.digest() == want
        again = pickle.loads(pickle.dumps(made, protocol=pickle.HIGHEST_PROTOCOL))  # what a worker gets
        assert isinstance(again.samples, PackedSamples) and again.digest() == want


def test_packed_samples_read_back_as_the_samples():
    samples = _odd_samples() + _tar_samples(1500) + _tree_samples(700) + _parquet_samples(50)
    packed = pack_samples(samples)
    assert isinstance(packed, PackedSamples) and len(packed) == len(samples)
    assert list(packed) == samples and packed == samples and samples == list(packed)
    assert [packed[i] for i in range(len(samples))] == samples and packed[-1] == samples[-1]
    assert packed[3:1700] == samples[3:1700] and packed[::7] == samples[::7] and packed[5:2] == []
    assert list(packed.iter_keys()) == [s.key for s in samples]
    assert pack_samples(samples, 10, 1030) == samples[10:1030]
    assert pickle.loads(pickle.dumps(packed)) == samples
    with pytest.raises(IndexError):
        packed[len(samples)]
    assert pack_samples([]) == [] and len(pack_samples([])) == 0


@pytest.mark.parametrize("odd", [
    Sample("a", (SourceFile("jpg", "a.jpg", 1, 1),), True),  # a bool: JSON true, not 1
    Sample("a", (SourceFile("jpg", "a.jpg", 1, 1),), 2 ** 63),  # past int64
    Sample("a", (SourceFile("jpg", "a.jpg", 1.5, 1),), 0),  # type: ignore[arg-type]
    Sample("a", (SourceFile("jpg", "a.jpg", np.int64(1), 1),), 0),  # type: ignore[arg-type]
])
def test_values_the_columns_would_change_stay_a_tuple(odd):
    samples = _tree_samples(3) + [odd]
    got = pack_samples(samples)
    assert isinstance(got, tuple) and got == tuple(samples)


def _kept_and_pickled(n: int):
    spec = ShardSpec("wds", 0, "s.tar", "/src", "/out", "classification", pack_samples(_tar_samples(n)),
                     source_kind="tar", positions=np.arange(n, dtype=np.int64))
    blob = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    gc.collect()
    tracemalloc.start()
    try:
        received = pickle.loads(blob)  # what a worker holds of its spec
        kept = tracemalloc.get_traced_memory()[0]
        received.digest()  # streamed: a slice of samples' JSON at a time
        digest_peak = tracemalloc.get_traced_memory()[1] - kept
    finally:
        tracemalloc.stop()
    return len(blob), kept, digest_peak


def test_a_packed_spec_costs_bytes_not_objects_a_sample():
    n = 2000
    small, large = _kept_and_pickled(n), _kept_and_pickled(10 * n)
    per_pickled = (large[0] - small[0]) / (9 * n)
    per_kept = (large[1] - small[1]) / (9 * n)
    # two tar members a sample: 10 bytes of key, 8 of label (and 1 of none), 8 of files' end and
    # 8 of position; 38 a member (ids, size, mtime, offset). As objects it was ~1.5 kB a sample
    assert per_pickled < 130 and per_kept < 130, (per_pickled, per_kept)
    # the digest held one slice of samples' dicts and JSON, not every sample's (~1 kB a sample)
    assert large[2] - small[2] < 9 * n * 20, (small[2], large[2])
