"""Memory that does not grow with the dataset (issue 39), and shards replaced under a reader
(issue 40, item 1): structure, not timings.

* Opening and reading an output of 10x the samples costs no more Python memory than the small
  one (tracemalloc: records are mapped, a bounded set of shards stays open).
* A shard reader holds no per-sample Python object.
* A same-size shard of another conversion put in place after the dataset opened is refused in
  one line naming the shard, on every read path; never another sample's bytes.
* Outputs of an earlier release (JSON records) read as before, say once how to upgrade, and
  ``dsconvert upgrade`` rewrites them in place to the same samples.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from dsconvert import ManifestError, UpgradeWarning, convert, open_dataset
from dsconvert.formats.columns import Columns
from dsconvert.verify import _check_permutation, verify

from conftest import encode


def _tree(root: str, n: int, classes: int = 10) -> str:
    """``n`` JPEGs of one size in ``classes`` class folders: every shard of two conversions of it
    with other seeds has the same size, so one can stand in for the other."""
    blob = encode(Image.new("RGB", (16, 16), (200, 30, 60)), quality=80)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
    for i in range(n):
        with open(os.path.join(root, f"c{i % classes}", f"{i:06d}.jpg"), "wb") as f:
            f.write(blob)
    return root


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("flat")
    made = {}
    for n in (400, 4000):
        src = _tree(str(base / f"src{n}"), n)
        out = str(base / f"out{n}")
        convert(src, out, samples_per_shard=n // 10, workers=1)  # about as many shards: per-shard state alike
        made[n] = out
    return made


def _read_cost(out: str, reads: int = 300) -> int:
    """Python memory (tracemalloc) kept after opening ``out`` map-style and reading ``reads``
    samples at random over every shard (at most 8 shards open)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ds = open_dataset(out, decode="raw", max_open_shards=8)
        rng = random.Random(0)
        for _ in range(reads):
            ds[rng.randrange(len(ds))]
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
        del ds
        return kept
    finally:
        tracemalloc.stop()


def test_ten_times_the_samples_costs_no_more_memory_to_open_and_read(outputs):
    _read_cost(outputs[400], reads=5)  # the modules a first read imports (torch...) are not the dataset's
    small, large = _read_cost(outputs[400]), _read_cost(outputs[4000])
    # about as many shards, 10x the samples: the old JSON records held ~0.8 kB a sample for every
    # shard touched, 3,600 samples more would be ~2.9 MB
    assert large - small < 100_000, (small, large)


def test_a_shard_reader_holds_nothing_per_sample(outputs):
    ds = open_dataset(outputs[4000], decode="raw")
    ds[0]
    shard = ds.shard(0)
    per_sample = [v for v in vars(shard).values() if isinstance(v, (list, tuple, dict)) and len(v) >= 200]
    assert per_sample == [], per_sample
    assert len(shard.keys) == ds.manifest.shards[0].num_samples >= 200
    assert type(shard.keys).__name__ == "StringColumn"
    assert isinstance(shard.cols.buf, (bytes, memoryview)) or type(shard.cols.buf).__name__ == "mmap"


def test_a_bounded_number_of_shards_stays_open(outputs):
    ds = open_dataset(outputs[4000], decode="raw", max_open_shards=3)
    for i in range(0, len(ds), 40):  # every shard, many times over
        ds[i]
    assert len(ds._shards) == 3
    with pytest.raises(ValueError, match="max_open_shards"):
        open_dataset(outputs[400], decode="raw", max_open_shards=0)


def test_records_are_binary_and_small(outputs):
    out = outputs[4000]
    names = [n for n in os.listdir(out) if n.endswith(".idx")]
    assert len(names) == len(open_dataset(out).manifest.shards) and not any(
        n.endswith(".index.json") for n in os.listdir(out))
    per_sample = sum(os.path.getsize(os.path.join(out, n)) for n in names) / 4000
    assert per_sample <= 64, per_sample


def test_the_order_check_finds_a_repeat_in_any_chunk():
    order = np.random.default_rng(0).permutation(1000).astype(np.int64)
    _check_permutation(order, "x", chunk=64)
    for a, b in ((0, 999), (10, 11), (100, 900)):
        bad = order.copy()
        bad[b] = bad[a]
        with pytest.raises(ManifestError, match="not a permutation"):
            _check_permutation(bad, "x", chunk=64)
    with pytest.raises(ManifestError, match="outside"):
        _check_permutation(np.array([0, 5], dtype=np.int64), "x")


# --- a shard replaced after open (issue 40, item 1) ------------------------------------------

@pytest.fixture
def twin(tmp_path):
    """Two conversions of one source under two seeds: same shard names and sizes, other samples."""
    src = _tree(str(tmp_path / "src"), 120, classes=4)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    convert(src, a, samples_per_shard=30, workers=1, seed=0)
    convert(src, b, samples_per_shard=30, workers=1, seed=1)
    for name in sorted(os.listdir(a)):
        if name.endswith(".tar"):
            assert os.path.getsize(os.path.join(a, name)) == os.path.getsize(os.path.join(b, name))
            assert open(os.path.join(a, name), "rb").read() != open(os.path.join(b, name), "rb").read()
    return a, b


def _replace_shards(a: str, b: str) -> None:
    for name in os.listdir(b):
        if name.endswith(".tar"):
            tmp = os.path.join(a, name + ".swap")
            with open(os.path.join(b, name), "rb") as f, open(tmp, "wb") as g:
                g.write(f.read())
            os.replace(tmp, os.path.join(a, name))


READS = {
    "map, one pread a sample": lambda out: [open_dataset(out, decode="raw")[i] for i in range(120)],
    "map, a batch fetched at once": lambda out: open_dataset(out, decode="raw", prefetch=True).__getitems__(
        list(range(120))),
    "map, zero-copy views": lambda out: [open_dataset(out, decode="buffer")[i] for i in range(120)],
    "map, dict samples": lambda out: [open_dataset(out, decode="raw")[i] for i in range(120)],
    "stream": lambda out: list(open_dataset(out, decode="raw", stream=True)),
    "stream, zero-copy views": lambda out: list(open_dataset(out, decode="buffer", stream=True)),
    "stream, read ahead": lambda out: list(open_dataset(out, decode="raw", stream=True, prefetch=True)),
    "stream, batches": lambda out: list(open_dataset(out, decode="raw", stream=True, batch_size=16, shuffle=True)),
}


@pytest.mark.parametrize("read", list(READS))
def test_a_shard_replaced_after_open_is_refused_naming_it(twin, read):
    a, b = twin
    expected = READS[read](a)  # the intact output reads
    assert len(expected) in (120, 8)
    _replace_shards(a, b)
    with pytest.raises(ManifestError, match=r"shard-\d{6}\.tar.*not the one its index describes"):
        READS[read](a)


@pytest.mark.parametrize("classes", [["\u00e4", "\u00f6", "\u00fc", "\u00e9"],  # names alike once ASCII'd
                                     ["x" * 120 + c for c in "abcd"]])  # alike in their first 100 bytes
def test_a_replaced_shard_whose_names_differ_only_in_a_pax_record_is_refused(tmp_path, classes):
    """Member names that a tar's ustar header cannot tell apart (non-ASCII, or past 100 bytes):
    their PAX record holds the whole name, and it is checked too."""
    blob = encode(Image.new("RGB", (16, 16), (20, 130, 60)), quality=80)
    src = tmp_path / "src"
    for c in classes:
        os.makedirs(src / c)
        for i in range(6):
            (src / c / f"{i:03d}.jpg").write_bytes(blob)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    convert(str(src), a, samples_per_shard=24, workers=1, seed=0)
    convert(str(src), b, samples_per_shard=24, workers=1, seed=1)
    expected = [open_dataset(a, decode="raw")[i] for i in range(24)]
    assert sorted(label for _, label in expected) == [0] * 6 + [1] * 6 + [2] * 6 + [3] * 6
    _replace_shards(a, b)
    reads = [lambda: [open_dataset(a, decode="raw")[i] for i in range(24)],
             lambda: [open_dataset(a, decode="buffer")[i] for i in range(24)],
             lambda: open_dataset(a, decode="raw", prefetch=True).__getitems__(list(range(24))),
             lambda: list(open_dataset(a, decode="raw", stream=True)),
             lambda: list(open_dataset(a, decode="buffer", stream=True))]
    for read in reads:
        with pytest.raises(ManifestError, match="header names"):
            read()


def test_a_shard_replaced_under_an_open_dataset_is_refused_when_reopened(twin):
    a, b = twin
    ds = open_dataset(a, decode="raw", max_open_shards=1)
    first = ds[0]
    _replace_shards(a, b)
    ds[0]  # still open: the descriptor reads the file it opened, which is the right one
    assert ds[0] == first
    with pytest.raises(ManifestError, match="not the one its index describes"):
        for i in range(len(ds)):  # other shards open (and the first closes): they are the new files
            ds[i]


def test_tar_headers_are_checked_for_name_and_size():
    import io
    import tarfile

    from dsconvert.formats.wds import _header_problem

    def header(name, size, whole=False):
        info = tarfile.TarInfo(name)
        info.size = size
        buf = info.tobuf(tarfile.PAX_FORMAT)
        return buf if whole else buf[-512:]

    # names a ustar header cannot tell apart: the PAX record (read with it) can
    for mine, other in (("\u00e4/x.jpg", "\u00f6/x.jpg"), ("d" * 120 + "/a.jpg", "d" * 120 + "/b.jpg"),
                        ("k\udcff.jpg", "k\udcfe.jpg")):
        assert _header_problem(header(mine, 5, whole=True), mine, 5) is None
        assert _header_problem(header(other, 5, whole=True), mine, 5) == "its PAX header names another member"

    assert _header_problem(header("k1.jpg", 10), "k1.jpg", 10) is None
    assert "names" in _header_problem(header("k2.jpg", 10), "k1.jpg", 10)
    assert "declares" in _header_problem(header("k1.jpg", 11), "k1.jpg", 10)
    long = "d/" + "x" * 150 + ".jpg"  # a PAX name: the header keeps its first 100 bytes
    assert _header_problem(header(long, 3), long, 3) is None
    assert _header_problem(header("\u00e9t\u00e9.jpg", 3), "\u00e9t\u00e9.jpg", 3) is None
    assert _header_problem(header("k1.jpg", 10), None, 10) is None  # a foreign tar: its size only
    assert _header_problem(b"\0" * 512, "k1.jpg", 10) is not None
    assert _header_problem(b"garbage" * 80, None, 10) is not None
    del io


# --- outputs of an earlier release ------------------------------------------------------------

def downgrade(out: str) -> None:
    """Rewrite an output's binary records as the JSON records an earlier release wrote."""
    path = os.path.join(out, "dsconvert.json")
    manifest = json.load(open(path))
    for shard in manifest["shards"]:
        old = shard["index"]
        data = open(os.path.join(out, old), "rb").read()
        record = Columns(data, old).to_dict()
        new = old[: -len(".idx")] + ".index.json"
        text = json.dumps(record).encode()
        with open(os.path.join(out, new), "wb") as f:
            f.write(text)
        os.remove(os.path.join(out, old))
        shard["index"] = new
        parts = {k: v for k, v in shard["parts"].items() if k != old}
        parts[new] = {"bytes": len(text), "sha256": hashlib.sha256(text).hexdigest()}
        shard["parts"] = parts
    json.dump(manifest, open(path, "w"))


def test_an_earlier_releases_output_reads_says_how_to_upgrade_and_upgrades(tmp_path):
    from dsconvert.cli import main

    src = _tree(str(tmp_path / "src"), 90, classes=3)
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=20, workers=1)
    now = [open_dataset(out, decode="raw")[i] for i in range(90)]
    streamed = list(open_dataset(out, decode="raw", stream=True))
    downgrade(out)
    assert sum(n.endswith(".index.json") for n in os.listdir(out)) == 5
    with pytest.warns(UpgradeWarning, match=r"dsconvert upgrade .*out"):
        old = open_dataset(out, decode="raw")
    assert [old[i] for i in range(90)] == now
    with pytest.warns(UpgradeWarning):
        assert list(open_dataset(out, decode="raw", stream=True)) == streamed
    assert verify(out)["ok"]
    assert main(["upgrade", out]) == 0
    names = os.listdir(out)
    assert sum(n.endswith(".idx") for n in names) == 5 and not any(n.endswith(".index.json") for n in names)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UpgradeWarning)
        ds = open_dataset(out, decode="raw")
        assert [ds[i] for i in range(90)] == now
    assert verify(out)["ok"]
    assert main(["upgrade", out]) == 0  # nothing left to do


def test_upgrade_refuses_a_record_that_is_not_the_manifests(tmp_path):
    from dsconvert.upgrade import upgrade

    src = _tree(str(tmp_path / "src"), 30, classes=3)
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=10, workers=1)
    downgrade(out)
    path = os.path.join(out, "shard-000001.index.json")
    record = json.load(open(path))
    record["labels"][0] = (record["labels"][0] + 1) % 3
    json.dump(record, open(path, "w"))
    with pytest.raises(ManifestError, match="sha256 differs"):
        upgrade(out)
    assert any(n.endswith(".index.json") for n in os.listdir(out))  # the manifest still names them


# --- what an attack on the records found ------------------------------------------------------

def _record(out: str, shard: str = "shard-000000.tar") -> str:
    from support.records import record_path

    return record_path(out, shard)


def test_labels_outside_the_classes_are_refused_when_the_shard_opens(tmp_path):
    from conftest import rehash_parts
    from support.records import read_record, write_record

    out = str(tmp_path / "out")
    convert(_tree(str(tmp_path / "src"), 30, classes=3), out, samples_per_shard=10, workers=1)
    for bad in (3, -1, 2**61):
        d = read_record(_record(out))
        d["labels"][4] = bad
        write_record(_record(out), d)
        rehash_parts(out)
        for read in (lambda: open_dataset(out, decode="raw")[0], lambda: list(open_dataset(out, stream=True))):
            with pytest.raises(ManifestError, match="labels outside the 3 classes"):
                read()


def test_a_record_rewritten_in_place_with_its_mtime_restored_is_checked_again(tmp_path):
    from support.records import read_record, write_record

    out = str(tmp_path / "out")
    convert(_tree(str(tmp_path / "src"), 20, classes=2), out, samples_per_shard=10, workers=1)
    assert open_dataset(out, decode="raw")[0][1] in (0, 1)  # hashed once, remembered by its version
    path = _record(out)
    st = os.stat(path)
    d = read_record(path)
    d["labels"] = [1 - v for v in d["labels"]]
    write_record(path, d)  # in place, the same size
    assert os.path.getsize(path) == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ManifestError, match="sha256"):
        open_dataset(out, decode="raw")[0]


def test_verify_reports_a_record_it_cannot_read_and_never_raises(tmp_path):
    out = str(tmp_path / "out")
    convert(_tree(str(tmp_path / "src"), 20, classes=2), out, samples_per_shard=10, workers=1)
    path = _record(out)
    os.remove(path)
    os.symlink(os.path.basename(path), path)  # a link to itself: ELOOP
    report = verify(out)
    assert not report["ok"] and any("unreadable" in p["message"] for p in report["problems"])


def test_a_tiny_record_cannot_declare_millions_of_input_files(tmp_path):
    from dsconvert.formats.columns import MAX_SOURCES, encode_record

    d = {"schema_version": 1, "format": "wds", "shard": "s.tar", "spec_sha256": "x", "bytes": 0, "sha256": "y",
         "num_samples": 2, "fields": {}, "keys": ["a", "b"], "labels": None, "skipped": [],
         "sources": [["a.jpg"] * 3, ["b.jpg"] * 3]}
    data = bytearray(encode_record(d))
    cols = Columns(bytes(data), "x")
    assert cols.to_dict()["sources"] == d["sources"]
    head = json.loads(bytes(data[16: 16 + int.from_bytes(data[8:16], "little")]))
    head["columns"]["sources.count"] = ["", MAX_SOURCES + 1, 0, 2]  # one repeated value takes no bytes
    raw = json.dumps(head).encode()
    hostile = data[:8] + len(raw).to_bytes(8, "little") + raw + data[16 + int.from_bytes(data[8:16], "little"):]
    with pytest.raises(ManifestError, match="input files"):
        Columns(bytes(hostile), "x").to_dict()


def test_a_killed_upgrades_leftover_records_are_removed_by_the_next_run(tmp_path, monkeypatch):
    from dsconvert.io.location import Location
    from dsconvert.io.owner import note, owner_token
    from dsconvert.upgrade import upgrade

    out = str(tmp_path / "out")
    convert(_tree(str(tmp_path / "src"), 30, classes=3), out, samples_per_shard=10, workers=1)
    downgrade(out)
    loc = Location(out)
    token = owner_token(loc)
    for name in os.listdir(out):  # as the release that wrote them journalled them
        if name.endswith(".index.json"):
            data = open(os.path.join(out, name), "rb").read()
            note(loc, token, name, len(data), hashlib.sha256(data).hexdigest())
    user = os.path.join(out, "shard-000009.index.json")
    open(user, "w").write("{}")  # a user's file named like one: never removed

    def killed(self, name):
        raise KeyboardInterrupt  # the kill, after the manifest names the new records
    monkeypatch.setattr(Location, "remove", killed)
    with pytest.raises(KeyboardInterrupt):
        upgrade(out)
    monkeypatch.undo()
    assert sum(n.endswith(".index.json") for n in os.listdir(out)) == 4
    assert len(open_dataset(out, decode="raw")) == 30 and verify(out)["ok"]
    assert upgrade(out)["removed"] == 3
    assert sorted(n for n in os.listdir(out) if n.endswith(".index.json")) == ["shard-000009.index.json"]
