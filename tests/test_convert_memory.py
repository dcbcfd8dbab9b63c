"""The conversion parent in bounded memory (issue 39, item 2): the scan on disk, the write-time
order in one uint64 a sample, specs made one at a time, the order file written from disk.
Structure, not timings: what the parent holds at 10x the samples, and the same bytes as the
definitions these replace."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import hashlib
import io
import os
import pickle
import random
import threading
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from dsconvert import convert, scan_table, shuffle
from dsconvert.samples import Sample, SourceFile
from dsconvert.scan_table import Reordered, ScanTable, SpilledInts
from dsconvert.shuffle import StoredPositions, order_bytes, shuffled_order
from dsconvert.source import folders, scan

from conftest import encode


def _old_shuffled_order(n: int, seed: int) -> list:
    """shuffled_order as it was defined before (the permutation outputs were written in)."""
    key = hashlib.sha256(str(seed).encode()).digest()[:32]
    digests = b"".join(hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8, key=key).digest() for i in range(n))
    return np.argsort(np.frombuffer(digests, dtype=">u8"), kind="stable").tolist()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1000, 65536, 65537, 150001])
def test_the_order_is_the_permutation_it_always_was(n):
    for seed in (0, 7):
        got = shuffled_order(n, seed)
        assert got.dtype == np.int64 and got.tolist() == _old_shuffled_order(n, seed)


def test_ties_in_the_sorted_bits_are_broken_by_the_whole_digest_then_the_position(monkeypatch):
    # 4 digest bits beside the position: runs of thousands of ties, re-ordered by the whole digest
    monkeypatch.setattr(shuffle, "_TOP_BITS", 4)
    for n in (17, 5000, 70000):
        assert shuffled_order(n, 3).tolist() == _old_shuffled_order(n, 3)
    # digests that tie whole (2 bits of entropy): the position decides, as the stable argsort did
    real = shuffle._digests
    coarse = lambda a, b, key: real(a, b, key) & np.uint64(0xC000000000000000)  # noqa: E731
    monkeypatch.setattr(shuffle, "_digests", coarse)
    key = hashlib.sha256(b"3").digest()[:32]
    for n in (5, 3000, 70000):
        expected = np.argsort(coarse(0, n, key), kind="stable").tolist()
        assert shuffled_order(n, 3).tolist() == expected


def _order_peak(n: int) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        shuffled_order(n, 1)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_order_costs_one_uint64_a_sample():
    small, large = _order_peak(100_000), _order_peak(300_000)
    # 8 B a sample more (the chunk of digests in flight is the same); the list of Python ints
    # and the digests it was took ~50 B a sample
    assert large - small < 200_000 * 10, (small, large)


@pytest.mark.parametrize("trial", range(12))
def test_the_order_file_from_disk_is_the_bytes_of_order_bytes(trial):
    rng = random.Random(trial)
    n = rng.choice([0, 1, 9, 500, 20000])
    stored = list(range(n))
    rng.shuffle(stored)
    stored = [p for p in stored if rng.random() > 0.2]  # samples skipped at write time leave holes
    cuts = sorted(rng.sample(range(len(stored) + 1), min(len(stored) + 1, 9)))
    shards = [stored[a:b] for a, b in zip([0] + cuts, cuts + [len(stored)])]
    positions = StoredPositions()
    positions.WINDOW = rng.choice([1, 7, 1 << 20])  # many buckets, or one
    for i in rng.sample(range(len(shards)), len(shards)):  # shards finish in any order
        positions.add(i, shards[i])
    buf = io.BytesIO()
    nbytes, sha = positions.write_order(buf, range(len(shards)))
    assert buf.getvalue() == order_bytes(stored)
    assert (nbytes, sha) == (len(buf.getvalue()), hashlib.sha256(buf.getvalue()).hexdigest())


def _samples():
    long = "d/" * 300 + "é" * 200
    return [
        Sample("n01/img_1", (SourceFile("jpg", "n01/img_1.jpg", 10, 1_700_000_000_123_456_789),), 3),
        Sample("ключ/写真", (SourceFile("jpg", "ключ/写真.JPG", 0, 0),), None),
        Sample(long, (SourceFile("json", long + ".json", 2**40, -5), SourceFile("png", "other/" + long, 7, 8))),
        Sample("a", (SourceFile("cls", "part-0.tar/a.cls", 1, 2, "part-0.tar", 512),
                     SourceFile("jpg", "part-0.tar/a.jpg", 3, 2, "part-0.tar", 1536)), None),
        Sample("b", (SourceFile("jpg", "b", 4, 2, "part-1.tar", 0),), 0),  # a path that is the key itself
        Sample("c", (), None),
    ]


def test_a_scan_table_gives_back_what_was_appended(monkeypatch):
    monkeypatch.setattr(scan_table, "_READ_CHUNK", 4)
    monkeypatch.setattr(scan_table, "_FLUSH_BYTES", 64)  # records flushed as they are appended
    samples = _samples() * 5
    table = ScanTable()
    for s in samples[:7]:
        table.append(s)
    assert table[6] == samples[6] and len(table) == 7  # read while appending
    table.extend(samples[7:])
    assert len(table) == len(samples) and list(table) == samples and table == samples
    assert [table[i] for i in range(len(samples))] == samples and table[-1] == samples[-1]
    assert table[3:17] == samples[3:17] and table[::3] == samples[::3] and table[5:2] == []
    with pytest.raises(IndexError):
        table[len(samples)]
    assert table.num_files == sum(len(s.files) for s in samples)
    assert table.nbytes == sum(s.nbytes for s in samples)
    assert table.max_file_size == 2**40
    again = pickle.loads(pickle.dumps(table))  # a Dataset over a source sent to spawned workers
    assert isinstance(again, ScanTable) and again == samples and again.nbytes == table.nbytes
    order = np.array([5, 0, 29, 2], dtype=np.int64)
    assert list(Reordered(table, order)) == [samples[i] for i in order] == Reordered(table, order)[0:4]
    spilled = SpilledInts(order)
    assert list(Reordered(table, spilled)) == [samples[i] for i in order]
    assert spilled[1:3].tolist() == [0, 29] and spilled[-1] == 2 and spilled[::-1].tolist() == [2, 29, 0, 5]


def test_a_scan_table_holds_no_sample_in_memory():
    sample = Sample("c0/000000", (SourceFile("jpg", "c0/000000.jpg", 1234, 1_700_000_000_000_000_000),), 0)
    table = ScanTable()
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(50_000):
            table.append(sample)
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # the buffer of unwritten records (up to 1 MB) at most, not 50,000 samples (~30 MB as objects)
    assert kept < 1.5e6, kept


def _tree(root: str, n: int) -> str:
    """``n`` tiny JPEGs, 100 to a class folder."""
    blob = encode(Image.new("RGB", (8, 8), (200, 30, 60)), quality=80)
    for i in range(n):
        folder = os.path.join(root, f"c{i // 100:04d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:06d}.jpg"), "wb") as f:
            f.write(blob)
    return root


def _parent_peak(src: str, out: str) -> int:
    """The parent's peak Python memory (tracemalloc) over a shuffled conversion written by two
    worker processes: what it holds of the scan, the order, the specs and the results."""
    gc.collect()
    tracemalloc.start()
    try:
        convert(src, out, samples_per_shard=100, workers=2, order="shuffled")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_the_conversion_parent_holds_nothing_per_sample(tmp_path, monkeypatch):
    # the bounded buffers made alike at both sizes: a read's slice of the table, its write
    # buffer, the digests hashed per step, a bucket of the order file
    monkeypatch.setattr(scan_table, "_READ_CHUNK", 128)
    monkeypatch.setattr(scan_table, "_FLUSH_BYTES", 4096)
    monkeypatch.setattr(shuffle, "_CHUNK", 256)
    monkeypatch.setattr(StoredPositions, "WINDOW", 256)
    small = _tree(str(tmp_path / "small"), 500)
    large = _tree(str(tmp_path / "large"), 5000)
    convert(small, str(tmp_path / "warm"), workers=2)  # the modules the first conversion imports
    a = _parent_peak(small, str(tmp_path / "a"))
    b = _parent_peak(large, str(tmp_path / "b"))
    # 4,500 samples more: the old parent held each as objects (the scan, the order list, every
    # spec, the positions of every result), ~0.8 kB a sample, +3.6 MB here. What grows now is
    # per shard (42 more: a result and its entry, ~4 kB each) and the order's 8 bytes a sample
    assert b - a < 4500 * 100, (a, b)


class _CountingExecutor(cf.Executor):
    """Threads that write shards, counting the specs submitted and not yet finished."""

    def __init__(self) -> None:
        self.pool = cf.ThreadPoolExecutor(2)
        self.lock = threading.Lock()
        self.pending = self.most = 0

    def submit(self, fn, *args, **kwargs):  # type: ignore[override]
        with self.lock:
            self.pending += 1
            self.most = max(self.most, self.pending)
        future = self.pool.submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        with self.lock:
            self.pending -= 1

    def shutdown(self, wait=True, **kwargs):
        self.pool.shutdown(wait=wait)


def test_specs_are_sent_a_few_at_a_time_and_the_bytes_are_the_same_for_any_workers(tmp_path):
    src = _tree(str(tmp_path / "src"), 1200)
    executor = _CountingExecutor()
    try:
        convert(src, str(tmp_path / "ex"), samples_per_shard=40, workers=2, executor=executor, order="shuffled")
    finally:
        executor.shutdown()
    assert 1 <= executor.most <= 4  # 30 shards: two a worker in flight, not all at once
    convert(src, str(tmp_path / "w1"), samples_per_shard=40, workers=1, order="shuffled")
    convert(src, str(tmp_path / "w2"), samples_per_shard=40, workers=2, order="shuffled")
    names = sorted(n for n in os.listdir(tmp_path / "w1") if not n.startswith("."))
    assert "dsconvert.order.npy" in names and len(names) == 2 * 30 + 2
    for other in ("w2", "ex"):
        assert sorted(n for n in os.listdir(tmp_path / other) if not n.startswith(".")) == names
        for name in names:
            assert (tmp_path / other / name).read_bytes() == (tmp_path / "w1" / name).read_bytes(), (other, name)


def _list_scan_peak(folder, rows: int) -> int:
    path = folder / f"list{rows}.csv"
    path.write_text("path,label\n" + "".join(f"img.jpg,class{i % 7}\n" for i in range(rows)))
    gc.collect()
    tracemalloc.start()
    try:
        source = scan(str(path))
        assert len(source.samples) == rows and source.classes == [f"class{i}" for i in range(7)]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_list_file_is_scanned_without_holding_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_table, "_FLUSH_BYTES", 4096)
    monkeypatch.setattr(folders, "_STAT_BATCH", 64)
    (tmp_path / "img.jpg").write_bytes(encode(Image.new("RGB", (8, 8)), quality=80))
    _list_scan_peak(tmp_path, 100)
    small, large = _list_scan_peak(tmp_path, 2000), _list_scan_peak(tmp_path, 20000)
    # the text, its rows and a sample each were held: ~0.9 kB a row, +16 MB here (now: flat)
    assert large - small < 18000 * 20, (small, large)
