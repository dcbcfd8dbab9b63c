"""Container sources scanned in bounded memory (issue 39): tar shards, Parquet files and a
dsconvert output appended to the scan's table on disk, a repeated key numbered without a dict
of every key, and a Dataset over a source that pickles as a reference to the table's files.
Structure, not timings: what a scan holds at 10x the samples, and the keys a dict gave."""

from __future__ import annotations

import gc
import io
import os
import pickle
import random
import tarfile
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

import pytest
from PIL import Image

from dsconvert import convert, scan_table
from dsconvert.keys import disambiguate
from dsconvert.readers.source import SourceDataset
from dsconvert.samples import Sample, SourceFile
from dsconvert.scan_table import ScanTable
from dsconvert.source import scan, tars as source_tars

from conftest import encode

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _seen_dict(keys: List[str]) -> List[str]:
    """The keys as the scanners numbered them before: a dict of every key seen."""
    seen: dict = {}
    out = []
    for key in keys:
        count = seen.get(key, 0)
        seen[key] = count + 1
        out.append(disambiguate(key, str(count)) if count else key)
    return out


def _renamed(keys: List[str]) -> List[str]:
    table = ScanTable(repeated_keys=True)
    for key in keys:
        table.append(Sample(key, (SourceFile("jpg", key + ".jpg", 1, 0, "t.tar", 512),), None))
    return [s.key for s in table.with_repeats_renamed(lambda k, n: disambiguate(k, str(n)))]


@pytest.mark.parametrize("collide", [False, True])
def test_repeated_keys_are_numbered_as_a_dict_of_every_key_numbered_them(monkeypatch, collide):
    monkeypatch.setattr(scan_table, "_READ_CHUNK", 3)
    monkeypatch.setattr(scan_table, "_SORT_CHUNK", 5)  # runs that straddle the numpy steps
    if collide:  # every key the same hash: only the keys themselves tell repeats apart
        monkeypatch.setattr(scan_table, "hash", lambda key: 0xDEADBEEF, raising=False)
    rng = random.Random(5)
    for n in (0, 1, 2, 7, 64, 300):
        keys = [f"k{rng.randrange(max(1, n // 3))}" for _ in range(n)]
        assert _renamed(keys) == _seen_dict(keys), n
    # a key that is another's numbered repeat: still numbered by the original keys only, as before
    keys = ["a", "a", disambiguate("a", "1"), "b", "a", disambiguate("a", "1")]
    assert _renamed(keys) == _seen_dict(keys)
    assert _renamed(["x"] * 40) == _seen_dict(["x"] * 40)  # one key repeated: one run across the steps


def test_unique_keys_keep_the_table_and_its_samples(monkeypatch):
    table = ScanTable(repeated_keys=True)
    samples = [Sample(f"k{i}", (SourceFile("jpg", f"k{i}.jpg", i, 0, "a.tar", 512 * i),), i) for i in range(50)]
    table.extend(samples)
    assert table.with_repeats_renamed(lambda k, n: "never") is table and list(table) == samples
    with pytest.raises(ValueError, match="repeated_keys"):
        ScanTable().with_repeats_renamed(lambda k, n: k)


_JPEG = encode(Image.new("RGB", (8, 8), (20, 200, 90)), quality=80)


def _tars(root: str, n: int, per_tar: int = 100, repeat_every: int = 0) -> str:
    """``n`` samples (KEY.jpg + KEY.cls) in tars of ``per_tar``; with ``repeat_every``, every
    such sample takes the key of the tar's first sample (a key repeated within and across tars)."""
    os.makedirs(root, exist_ok=True)
    for t in range(-(-n // per_tar)):
        with tarfile.open(os.path.join(root, f"part-{t:05d}.tar"), "w") as tf:
            for i in range(t * per_tar, min(n, (t + 1) * per_tar)):
                key = f"s{i:08d}" if not repeat_every or i % repeat_every else f"r{i % 3}"
                for ext, data in (("cls", str(i % 5).encode()), ("jpg", _JPEG)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return root


def _scan_peak(src: str, **kw) -> int:
    scan(src, **kw)  # the indexes built and saved: the scan measured is the one that loads them
    gc.collect()
    tracemalloc.start()
    try:
        source = scan(src, **kw)
        assert len(source.samples) > 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def small_buffers(monkeypatch):
    """The scan table's bounded buffers made alike at both sizes."""
    monkeypatch.setattr(scan_table, "_FLUSH_BYTES", 4096)
    monkeypatch.setattr(scan_table, "_READ_CHUNK", 64)


def test_a_tar_scan_holds_one_tar_at_a_time(tmp_path, small_buffers, monkeypatch):
    # tars indexed one at a time (8 threads hold up to 8 tars' records, as many as finish
    # together: a peak that moves from run to run), 8 tars and 80: what grows is per tar, and
    # per sample the hash
    monkeypatch.setattr(source_tars, "ThreadPoolExecutor", lambda max_workers: ThreadPoolExecutor(1))
    small = _scan_peak(_tars(str(tmp_path / "small"), 2000, per_tar=250), label="cls")
    large = _scan_peak(_tars(str(tmp_path / "large"), 20000, per_tar=250), label="cls")
    # 18,000 samples more: every tar's record and a dict of the keys seen were held, ~0.4 kB a
    # sample (+7 MB here); now one 8-byte hash a sample and a summary a tar (~5 kB, 72 more)
    assert large - small < 18000 * 40, (small, large)


def test_repeated_tar_keys_are_the_keys_the_dict_gave(tmp_path):
    src = _tars(str(tmp_path / "t"), 700, per_tar=100, repeat_every=7)
    source = scan(src)
    listed = []
    for t in range(7):
        with tarfile.open(os.path.join(src, f"part-{t:05d}.tar")) as tf:
            listed += [m.name.rsplit(".", 1)[0] for m in tf.getmembers() if m.name.endswith(".cls")]
    assert [s.key for s in source.samples] == _seen_dict(listed)
    assert len({s.key for s in source.samples}) == 700 and any("~" in s.key for s in source.samples)


def _parquet(root: str, n: int, per_file: int = 500) -> str:
    os.makedirs(root, exist_ok=True)
    for f in range(-(-n // per_file)):
        rows = range(f * per_file, min(n, (f + 1) * per_file))
        table = pa.table({"image": pa.array([_JPEG for i in rows], pa.binary()),
                          "label": pa.array([f"class{i % 7}" if i % 11 else None for i in rows])})
        pq.write_table(table, os.path.join(root, f"part-{f:04d}.parquet"), row_group_size=100)
    return root


def test_a_parquet_scan_holds_no_row(tmp_path, small_buffers):
    small = _scan_peak(_parquet(str(tmp_path / "small"), 2000, per_file=1000), label="label")
    large = _scan_peak(_parquet(str(tmp_path / "large"), 20000, per_file=1000), label="label")
    # every row's sample, label and key seen were held (~0.5 kB a row); now a hash a row and a
    # file's summary, plus one label batch at a time
    assert large - small < 18000 * 40, (small, large)


def test_parquet_labels_read_again_give_the_same_samples(tmp_path):
    source = scan(_parquet(str(tmp_path / "p"), 1200), label="label")
    kept = [i for i in range(1200) if i % 11]
    assert source.classes == [f"class{c}" for c in range(7)]
    assert [s.label for s in source.samples] == [i % 7 for i in kept]
    assert [s.key for s in source.samples] == [f"part-{i // 500:04d}/{i % 500:09d}" for i in kept]
    assert sum(s.count for s in source.skipped) == 1200 - len(kept)


def _output_peak(src: str) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        assert len(scan(src).samples) > 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_an_output_as_a_source_holds_one_record_at_a_time(tmp_path, small_buffers):
    peaks = []
    for name, n in (("small", 2000), ("large", 20000)):
        out = str(tmp_path / f"{name}-out")
        convert(_tars(str(tmp_path / name), n, per_tar=1000), out, samples_per_shard=125, workers=2, label="cls")
        _output_peak(out)
        peaks.append(_output_peak(out))
    # every sample's objects were held (~0.6 kB a sample); now the stored order read and its
    # inverse (the source's positions, 8 bytes a sample kept) and one shard's record at a time
    assert peaks[1] - peaks[0] < 18000 * 40, peaks


def _spawned_samples(ds, torch) -> List[Optional[int]]:
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    return [int(label) for _, label in loader]


def test_a_source_dataset_pickles_as_a_reference_to_its_table(tmp_path, torch):
    sizes = []
    for name, n in (("a", 200), ("b", 2000)):
        ds = SourceDataset(scan(_tars(str(tmp_path / name), n), label="cls"), decode="raw")
        sizes.append(len(pickle.dumps(ds)))
        again = pickle.loads(pickle.dumps(ds))
        assert again.source.samples == ds.source.samples
    # the samples were pickled as the table's bytes (~60 B a sample); now the files' numbers
    assert sizes[1] - sizes[0] < 1800, sizes
    assert _spawned_samples(ds, torch) == [i % 5 for i in range(2000)]  # workers reopen the parent's table
    with pytest.raises(ValueError, match="cannot open"):
        scan_table._reopen((2**22 + 12345, [(3, 0, 0), (4, 0, 0)]), ())


def test_verify_against_a_shuffled_output_as_source_finds_a_swapped_place(tmp_path):
    """Verifying an output made from a shuffled output maps each recorded place to the source's
    sample through an int64 array (not a dict of every sample): the same verdicts."""
    import hashlib
    import json
    import shutil

    import numpy as np

    from dsconvert.manifest import ORDER_NAME
    from dsconvert.shuffle import order_bytes
    from dsconvert.verify import verify

    from support.records import read_record, write_record

    first = str(tmp_path / "first")
    convert(_tars(str(tmp_path / "t"), 300, per_tar=100), first, samples_per_shard=50, workers=1, label="cls")
    second = str(tmp_path / "second")
    convert(first, second, samples_per_shard=60, workers=1)
    assert json.load(open(os.path.join(second, "dsconvert.json")))["order"] is not None
    assert verify(second, source=first)["ok"]
    swapped = str(tmp_path / "swapped")
    shutil.copytree(second, swapped)
    m = json.load(open(os.path.join(swapped, "dsconvert.json")))
    entry = m["shards"][0]
    record_path = os.path.join(swapped, entry["index"])
    record = read_record(record_path)
    record["positions"][0], record["positions"][1] = record["positions"][1], record["positions"][0]
    write_record(record_path, record)
    data = open(record_path, "rb").read()
    entry["parts"][entry["index"]] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    stored: List[int] = []
    for e in m["shards"]:
        stored += read_record(os.path.join(swapped, e["index"]))["positions"]
    order = order_bytes(np.array(stored, dtype=np.int64))
    open(os.path.join(swapped, ORDER_NAME), "wb").write(order)
    m["order"] = {"name": ORDER_NAME, "bytes": len(order), "sha256": hashlib.sha256(order).hexdigest()}
    json.dump(m, open(os.path.join(swapped, "dsconvert.json"), "w"))
    assert verify(swapped)["ok"]  # consistent with itself
    report = verify(swapped, source=first)
    assert not report["ok"] and len(report["source"]["misplaced"]) == 2
