"""Work bounded by the data (issue 33, class 3): a small file that declares millions of rows
costs runs, not rows; a value over the per-sample byte bound is skipped before it is decoded
(and, where its size is known ahead, before it is read); skipped runs stay runs in the
manifest, in the shard records and in ``verify --source``, while the accounting counts every
input."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import given, strategies as st
from PIL import Image

import dsconvert
from dsconvert.skips import InputSet, compact, row_run, total
from dsconvert.verify import verify

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

HF = {"info": {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": ["a", "b"]}}}}
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def jpeg(seed: int, size: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def hf_table(images: List[Optional[bytes]], labels: List[Optional[int]]) -> Any:
    col = pa.array([None if b is None else {"bytes": b, "path": None} for b in images], type=IMAGE)
    t = pa.table({"image": col, "label": pa.array(labels, type=pa.int64())})
    return t.replace_schema_metadata({b"huggingface": json.dumps(HF).encode()})


def manifest(out: str) -> Dict[str, Any]:
    with open(os.path.join(out, "dsconvert.json")) as f:
        return json.load(f)


def accounted(m: Dict[str, Any]) -> None:
    a = m["accounting"]
    assert a["files_seen"] == a["files_written"] + a["files_skipped"]
    assert a["files_skipped"] == sum(s.get("count", 1) for s in m["skipped"])


N = 300_000  # rows declared in a file of a few kB: far more than the bytes could hold images for


@pytest.mark.parametrize("statistics", [True, False], ids=["with-statistics", "without-statistics"])
@pytest.mark.parametrize("labels", ["null", "valid"])
def test_a_file_of_null_rows_costs_one_entry(tmp_path, statistics, labels):
    """Null images (with or without row-group statistics) and null labels: each run of rows is
    one skipped entry with its count, no empty shards are written, every row is counted."""
    path = str(tmp_path / "nulls.parquet")
    pq.write_table(hf_table([None] * N, [None if labels == "null" else 0] * N), path,
                   compression="zstd", row_group_size=1 << 17, write_statistics=statistics)
    assert os.path.getsize(path) < 200_000
    out = str(tmp_path / "out")
    r = dsconvert.convert(path, out, "wds", workers=1)
    m = manifest(out)
    assert r.manifest.num_samples == 0 and m["shards"] == []
    assert len(m["skipped"]) <= 3  # one run a row group at most
    assert all(s["reason"].startswith("no ") for s in m["skipped"])
    assert m["accounting"]["files_seen"] == N
    accounted(m)
    assert os.path.getsize(os.path.join(out, "dsconvert.json")) < 4096


def test_runs_of_skips_around_real_rows(tmp_path):
    """Real images between runs of null images, null labels and out-of-range labels: the images
    convert byte for byte, each run is one entry, and verify --source agrees row for row."""
    images: List[Optional[bytes]] = []
    labels: List[Optional[int]] = []
    expect: Dict[int, bytes] = {}
    for row in range(4000):
        if row % 1000 < 600:
            images.append(None)
            labels.append(0)
        elif row % 1000 < 700:
            images.append(jpeg(row))
            labels.append(None)
        elif row % 1000 < 710:
            images.append(jpeg(row))
            labels.append(7)  # out of range for the two class names
        else:
            images.append(jpeg(row))
            labels.append(row % 2)
            expect[row] = images[-1]
    path = str(tmp_path / "mixed.parquet")
    pq.write_table(hf_table(images, labels), path, row_group_size=512, write_statistics=False)
    out = str(tmp_path / "out")
    dsconvert.convert(path, out, "wds", workers=2, samples_per_shard=100, order="source")
    m = manifest(out)
    accounted(m)
    assert m["num_samples"] == len(expect)
    assert m["accounting"]["files_skipped"] == 4000 - len(expect)
    # runs of one reason, adjacent rows: a handful per thousand rows, not hundreds
    assert len(m["skipped"]) <= 4 * 4 + 4000 // 512 + 4
    got = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(out, name)) as tf:
                for member in tf.getmembers():
                    if member.name.endswith(".jpg"):
                        got[int(member.name.split("/")[-1].split(".")[0])] = tf.extractfile(member).read()
    assert got == expect
    report = verify(out, source=path)
    assert report["ok"] and report["problems"] == [], report["problems"]


@pytest.mark.parametrize("value_mib", [192])
def test_a_byte_bomb_is_skipped_unread(tmp_path, value_mib):
    """A few kB of zstd holding one value of 192 MiB that starts like a JPEG: skipped with its
    reason from the footer's sizes, before it is decompressed; the process stays small."""
    path = str(tmp_path / "bomb.parquet")
    value = b"\xff\xd8\xff\xe0" + bytes(value_mib << 20)
    pq.write_table(pa.table({"image": pa.array([value], type=pa.binary()), "label": pa.array([0])}), path,
                   compression="zstd")
    del value
    assert os.path.getsize(path) < 100_000
    out = str(tmp_path / "out")
    # VmHWM: this process's own peak (ru_maxrss carries the forking parent's across exec)
    code = ("import dsconvert\n"
            f"r = dsconvert.convert({path!r}, {out!r}, 'wds', label='label', workers=1)\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    peak_kb = int(done.stdout.split()[-1])
    assert peak_kb < value_mib * 1024, peak_kb  # less than the value itself: it was never decompressed
    m = manifest(out)
    assert m["num_samples"] == 0 and len(m["skipped"]) == 1
    assert "per-sample limit" in m["skipped"][0]["reason"]


def test_a_large_value_among_small_ones_is_skipped_before_decoding(tmp_path):
    """Where the footer's average hides it (one large value among small ones), the value is read
    with its row group and skipped by its own length before any decode; its neighbours convert."""
    small = [jpeg(i) for i in range(3)]
    big = b"\xff\xd8\xff\xe0" + os.urandom(300_000)
    path = str(tmp_path / "group.parquet")
    pq.write_table(pa.table({"image": pa.array(small + [big], type=pa.binary()), "label": pa.array([0, 1, 0, 1])}),
                   path, row_group_size=4)
    out = str(tmp_path / "out")
    r = dsconvert.convert(path, out, "wds", label="label", workers=1, max_sample_bytes=200_000, order="source")
    m = manifest(out)
    assert r.manifest.num_samples == 3
    assert [s["path"] for s in m["skipped"]] == ["group.parquet/row 3"]
    assert m["skipped"][0]["reason"].startswith("300004 bytes, over the per-sample limit of 200000")
    assert m["options"]["max_sample_bytes"] == 200_000


def test_files_over_the_limit_are_skipped_at_scan(tmp_path, image_folder):
    """Files: the scan's sizes decide, so a file over the bound is never opened."""
    big = os.path.join(image_folder, "cat", "big.jpg")
    with open(big, "wb") as f:
        f.write(jpeg(1, 64) + bytes(50_000))
    out = str(tmp_path / "out")
    r = dsconvert.convert(image_folder, out, "wds", workers=1, max_sample_bytes=40_000)
    m = manifest(out)
    assert [s["path"] for s in m["skipped"]] == ["cat/big.jpg"]
    assert "per-sample limit of 40000" in m["skipped"][0]["reason"]
    accounted(m)
    assert r.manifest.num_samples == m["accounting"]["files_written"]
    # the default bound is recorded by being left out: earlier outputs still match
    out2 = str(tmp_path / "out2")
    dsconvert.convert(image_folder, out2, "wds", workers=1)
    assert "max_sample_bytes" not in manifest(out2)["options"]


def test_cli_max_sample_bytes(tmp_path, image_folder):
    out = str(tmp_path / "out")
    done = subprocess.run([sys.executable, "-m", "dsconvert", "shard", image_folder, "-o", out, "--format", "wds",
                           "--max-sample-bytes", "1KB", "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    m = manifest(out)
    assert m["num_samples"] == 0 and m["options"]["max_sample_bytes"] == 1000
    assert all("per-sample limit of 1000 bytes" in s["reason"] for s in m["skipped"])


# --- the run arithmetic, for the whole class of inputs ---------------------------------------

entries = st.lists(st.tuples(st.sampled_from(["a.parquet", "b.parquet", "cat"]), st.integers(0, 40),
                             st.integers(1, 5), st.sampled_from(["null", "bad label"]), st.booleans()),
                   max_size=30)


def _expand(items: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    out = []
    for e in items:
        p = e["path"]
        if "/rows " in p:
            where, span = p.rsplit("/rows ", 1)
            first, last = map(int, span.split("-"))
            out += [(f"{where}/row {r}", e["reason"]) for r in range(first, last + 1)]
        else:
            out.append((p, e["reason"]))
    return out


@given(entries)
def test_compact_keeps_every_input(items):
    listed = []
    for where, first, n, reason, plain in items:
        if plain:
            listed.append({"path": f"{where}/x{first}.jpg", "reason": reason})
        else:
            listed.append({"path": row_run(where, first, first + n - 1), "reason": reason,
                           **({"count": n} if n > 1 else {})})
    squeezed = compact(listed)
    assert total(squeezed) == total(listed)
    assert _expand(squeezed) == _expand(listed)
    assert len(squeezed) <= len(listed)


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 60), st.integers(1, 6)), max_size=12),
       st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 60), st.integers(1, 6)), max_size=12),
       st.sets(st.sampled_from(["x.jpg", "y.jpg", "z.jpg"])), st.sets(st.sampled_from(["x.jpg", "y.jpg"])))
def test_input_sets_differ_as_their_rows_do(a_runs, b_runs, a_plain, b_plain):
    def build(runs, plain):
        s, rows = InputSet(), set()
        for where, first, n in runs:
            s.add(row_run(where, first, first + n - 1), n)
            rows |= {f"{where}/row {r}" for r in range(first, first + n)}
        for p in plain:
            s.add(p)
        return s, rows | set(plain)

    a, a_all = build(a_runs, a_plain)
    b, b_all = build(b_runs, b_plain)
    assert len(a) == len(a_all)
    assert sorted(p for e in a.minus(b) for p, _ in _expand([{"path": e, "reason": ""}])) == sorted(a_all - b_all)
    # rows are not runs where the inputs are files: a file named "row 1" stays itself
    files = InputSet(rows=False)
    files.add("cat/row 1")
    files.add("cat/row 2")
    assert files.minus(InputSet(rows=False)) == ["cat/row 1", "cat/row 2"]
