"""``verify``'s order check in bounded memory (issue 39, item 3): structure, not timings.

* The check of a shuffled output's order file keeps 1 bit a sample in memory (the permutation's
  bitmap): tracemalloc's peak over checking 10N samples is the one of N plus that bitmap.
* Still exact: hostile order files (a repeat, a position out of range, a swapped pair, cut short)
  and records whose positions repeat, or leave gaps, are reported as before.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tracemalloc
from types import SimpleNamespace
from typing import Any, List, Optional

import numpy as np
import pytest
from PIL import Image

from dsconvert import ManifestError, convert
from dsconvert.io.location import Location
from dsconvert.manifest import ORDER_NAME
from dsconvert.verify import _check_permutation, _OrderCheck, verify

from conftest import encode


def _npy(order: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, order, allow_pickle=False)
    return buf.getvalue()


def _check(folder: str, positions: List[np.ndarray], order: Optional[np.ndarray] = None,
           data: Optional[bytes] = None, counts: Optional[List[int]] = None) -> List[Any]:
    """The order check's problems for an output whose shards hold ``positions`` (one array a
    shard; the manifest's ``counts`` of samples, by default as many) and whose order file
    holds ``order`` (default: their argsort), or ``data``."""
    counts = counts or [len(p) for p in positions]
    n = sum(counts)
    if data is None:
        data = _npy(np.argsort(np.concatenate(positions), kind="stable").astype("<i8") if order is None
                    else order.astype("<i8"))
    with open(os.path.join(folder, ORDER_NAME), "wb") as f:
        f.write(data)
    manifest = SimpleNamespace(num_samples=n, order={"name": ORDER_NAME, "bytes": len(data),
                                                     "sha256": hashlib.sha256(data).hexdigest()})
    check = _OrderCheck(Location(folder), manifest)  # type: ignore[arg-type]
    start = 0
    try:
        for p, count in zip(positions, counts):
            check.shard(start, count, p.tolist())
            start += count
        return check.finish()
    finally:
        check.close()


def _messages(problems: List[Any]) -> List[str]:
    return [f"{p.kind}: {p.message}" for p in problems]


def _shards(perm: np.ndarray, size: int) -> List[np.ndarray]:
    return [perm[a: a + size] for a in range(0, len(perm), size)]


def _peak(folder: str, n: int, shard: int = 10_000) -> int:
    """tracemalloc's peak over the whole order check of ``n`` samples, beyond what the records
    (one shard's positions at a time) and the order file's bytes before the check take."""
    perm = np.random.default_rng(n).permutation(n).astype(np.int64)
    data = _npy(np.argsort(perm, kind="stable").astype("<i8"))
    with open(os.path.join(folder, ORDER_NAME), "wb") as f:
        f.write(data)
    manifest = SimpleNamespace(num_samples=n, order={"name": ORDER_NAME, "bytes": len(data),
                                                     "sha256": hashlib.sha256(data).hexdigest()})
    del data
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        check = _OrderCheck(Location(folder), manifest)  # type: ignore[arg-type]
        for a in range(0, n, shard):
            check.shard(a, min(shard, n - a), perm[a: a + shard].tolist())
        assert check.finish() == []
        check.close()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_the_order_check_keeps_a_bit_a_sample(tmp_path, monkeypatch):
    """From N to 10N samples the peak grows by the bitmap (1/8 byte a sample) and no more: the
    order file is read in chunks through one buffer, the records' positions go to disk, and the
    order they imply is rebuilt there in buckets of a bounded width. (It was 17 bytes a sample:
    an int64 and a bool per sample, and the order file held whole.) The read buffer and the
    buckets made small, so that both sizes fill them: the growth is then what is per sample."""
    from dsconvert.shuffle import StoredPositions

    assert _OrderCheck.CHUNK <= 1 << 20 and StoredPositions.WINDOW <= 1 << 16  # constants, not per sample
    monkeypatch.setattr(_OrderCheck, "CHUNK", 1 << 14)
    monkeypatch.setattr(StoredPositions, "WINDOW", 1 << 11)
    small, large = 10_000, 100_000
    _peak(str(tmp_path), small, 1000)  # what the first run imports (numpy.ma...) is not per sample
    grown = _peak(str(tmp_path), large, 1000) - _peak(str(tmp_path), small, 1000)
    assert grown < 0.25 * (large - small), grown / (large - small)


def test_the_bitmap_is_a_bit_a_position():
    from dsconvert.verify import _Bitmap

    assert _Bitmap(8_000_001).bits.nbytes == 1_000_001


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 4099])
def test_the_permutation_check_at_the_bitmaps_edges(n):
    order = np.random.default_rng(n).permutation(n).astype(np.int64)
    _check_permutation(order, "x", chunk=64)
    if n > 1:
        bad = order.copy()
        bad[-1] = bad[0]
        with pytest.raises(ManifestError, match="not a permutation"):
            _check_permutation(bad, "x", chunk=64)
    for outside in (-1, n):
        bad = order.copy()
        bad[n // 2] = outside
        with pytest.raises(ManifestError, match="outside"):
            _check_permutation(bad, "x", chunk=64)


def test_records_and_order_that_agree_pass_with_gaps_too(tmp_path):
    """Positions with gaps (inputs skipped while writing) and empty outputs: the order is
    their argsort, whatever their span."""
    rng = np.random.default_rng(1)
    perm = rng.permutation(5000).astype(np.int64)
    assert _check(str(tmp_path), _shards(perm, 700)) == []
    gaps = rng.choice(20_000, 5000, replace=False).astype(np.int64)  # 3 of 4 source places left out
    assert _check(str(tmp_path), _shards(gaps, 700)) == []
    assert _check(str(tmp_path), [np.zeros(0, np.int64)]) == []
    sparse = gaps.copy()
    sparse[10] = 1 << 60  # far past any conversion's span: checked in memory, still exact
    assert _check(str(tmp_path), _shards(sparse, 700)) == []


def test_hostile_order_files_are_reported_as_before(tmp_path):
    folder = str(tmp_path)
    perm = np.random.default_rng(2).permutation(3000).astype(np.int64)
    order = np.argsort(perm, kind="stable")
    shards = _shards(perm, 400)
    mismatch = ["structure: does not match the source positions in the shard records"]
    swapped = order.copy()
    swapped[[5, 2900]] = swapped[[2900, 5]]
    assert _messages(_check(folder, shards, swapped)) == mismatch
    repeated = order.copy()
    repeated[2999] = repeated[0]
    [message] = _messages(_check(folder, shards, repeated))
    assert message.startswith("structure: ") and message.endswith("not a permutation (a position is repeated)")
    outside = order.copy()
    outside[1234] = 3000
    [message] = _messages(_check(folder, shards, outside))
    assert message.endswith("positions outside 0..2999")
    cut = _npy(order.astype("<i8"))[:-8]
    [message] = _messages(_check(folder, shards, data=cut))
    assert message.endswith(f"{len(cut):,} bytes, not the {len(cut) + 8:,} of 3000 positions")
    for data in (b"", b"not a numpy file", _npy(order.astype(np.int32)), _npy(order[:-1].astype("<i8"))):
        [problem] = _check(folder, shards, data=data)
        assert problem.kind == "structure" and ("not an order file" in problem.message
                                                or "int64 positions" in problem.message), problem.message


def test_hostile_record_positions_are_reported_as_before(tmp_path):
    folder = str(tmp_path)
    perm = np.random.default_rng(3).permutation(3000).astype(np.int64)
    order = np.argsort(perm, kind="stable")
    mismatch = ["structure: does not match the source positions in the shard records"]
    for bad in ("repeat", "swap", "wrong", "short", "long", "huge"):
        shards = [s.copy() for s in _shards(perm, 400)]
        if bad == "repeat":
            shards[3][7] = shards[0][0]
        elif bad == "swap":  # two records' positions swapped: the order no longer names them
            shards[1][0], shards[6][5] = shards[6][5], shards[1][0]
        elif bad == "wrong":
            shards[7][-1] = 5000
        elif bad == "short":
            shards[2] = shards[2][:-1]
        elif bad == "long":
            shards[2] = np.append(shards[2], 4000)
        else:
            shards[4][0] = 1 << 62
        assert _messages(_check(folder, shards, order, counts=[len(s) for s in _shards(perm, 400)])) == mismatch, bad
    assert _check(folder, _shards(perm, 400), order) == []


def test_verify_reads_the_order_file_of_a_real_output_and_finds_it_changed(tmp_path):
    """End to end on a shuffled wds output: intact it passes; its order file rewritten (a
    permutation, another one), with the manifest's digest made to match, it does not."""
    blob = encode(Image.new("RGB", (16, 16), (10, 200, 60)), quality=80)
    src = tmp_path / "src"
    for i in range(90):
        os.makedirs(src / f"c{i % 3}", exist_ok=True)
        (src / f"c{i % 3}" / f"{i:03d}.jpg").write_bytes(blob)
    out = str(tmp_path / "out")
    convert(str(src), out, samples_per_shard=20, workers=1)
    assert verify(out)["ok"]
    changed = str(tmp_path / "changed")
    shutil.copytree(out, changed)
    order = np.load(os.path.join(changed, ORDER_NAME))
    data = _npy(order[::-1].copy())
    open(os.path.join(changed, ORDER_NAME), "wb").write(data)
    report = verify(changed)
    assert [p["kind"] for p in report["problems"]] == ["checksum"]  # the manifest's digest first
    m = json.load(open(os.path.join(changed, "dsconvert.json")))
    m["order"] = {"name": ORDER_NAME, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    json.dump(m, open(os.path.join(changed, "dsconvert.json"), "w"))
    report = verify(changed)
    assert [(p["kind"], p["path"]) for p in report["problems"]] == [("structure", ORDER_NAME)]
