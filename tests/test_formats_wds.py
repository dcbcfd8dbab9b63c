"""The wds format against the real webdataset reader and GNU tar."""

import filecmp
import glob
import hashlib
import json
import os
import subprocess
import tarfile

import pytest
from hypothesis import given, settings, strategies as st

from dsconvert import Manifest, convert, open_dataset
from dsconvert.formats.base import ShardRecord
from dsconvert.formats.columns import Columns, encode_record, is_binary
from dsconvert.keys import decode_key
from dsconvert.verify import verify

from conftest import encode, examples, make_image_folder, write
from support.records import read_record, to_json_records


@pytest.fixture(scope="module")
def webdataset():
    """The real webdataset reader: only the tests that read with it skip without it."""
    return pytest.importorskip("webdataset", reason="webdataset is not installed (pip install 'dsconvert[test]')")


def wds_samples(webdataset, out):
    urls = sorted(glob.glob(os.path.join(out, "*.tar")))
    return list(webdataset.WebDataset(urls, shardshuffle=False))


def test_webdataset_reads_every_sample_byte_for_byte(tmp_path, image_folder, webdataset):
    out = str(tmp_path / "out")
    result = convert(image_folder, out, samples_per_shard=5, workers=1)
    m = result.manifest
    assert m.num_samples == 16 and len(m.shards) == 4 and not m.skipped
    samples = wds_samples(webdataset, out)
    assert len(samples) == 16
    for s in samples:
        stem = decode_key(s["__key__"])
        assert set(s) - {"__key__", "__url__", "__local_path__"} == {"jpg", "cls"}
        with open(os.path.join(image_folder, stem + ".jpg"), "rb") as f:
            assert s["jpg"] == f.read()  # copied, not re-encoded
        assert int(s["cls"]) == m.classes.index(stem.split("/")[0])


def test_gnu_tar_lists_and_extracts_the_shards(tmp_path, image_folder):
    out = tmp_path / "out"
    convert(image_folder, str(out), workers=1)
    shard = out / "shard-000000.tar"
    listing = subprocess.run(["tar", "-tf", str(shard)], check=True, capture_output=True, text=True).stdout.split()
    assert len(listing) == 32 and sorted(listing)[:2] == ["cat/cat_0000.cls", "cat/cat_0000.jpg"]
    assert listing[0].endswith(".cls") and listing[1] == listing[0][:-3] + "jpg"  # a sample's members together
    dest = tmp_path / "x"
    dest.mkdir()
    subprocess.run(["tar", "-xf", str(shard), "-C", str(dest)], check=True)
    for path in glob.glob(os.path.join(image_folder, "*", "*.jpg")):
        rel = os.path.relpath(path, image_folder)
        assert filecmp.cmp(path, dest / rel, shallow=False)
    verbose = subprocess.run(["tar", "-tvf", str(shard)], check=True, capture_output=True, text=True).stdout
    assert all(" 0/0 " in line and "1970-01-01" in line for line in verbose.splitlines())


def test_index_offsets_match_tarfile(tmp_path, image_folder):
    out = tmp_path / "out"
    convert(image_folder, str(out), samples_per_shard=6, workers=1)
    for entry in Manifest.load(str(out)).shards:
        index = read_record(str(out / entry.index))
        with tarfile.open(out / entry.name) as tf:
            members = {ti.name: (ti.offset_data, ti.size) for ti in tf}
        for field, col in index["members"].items():
            for key, off, size in zip(index["keys"], col["offset"], col["size"]):
                assert members[f"{key}.{field}"] == (off, size)
        assert index["sha256"] == hashlib.sha256((out / entry.name).read_bytes()).hexdigest() == entry.sha256
        assert (out / entry.name).stat().st_size == entry.bytes


def _tree_bytes(folder):
    return {name: open(os.path.join(folder, name), "rb").read()
            for name in sorted(os.listdir(folder)) if not name.startswith(".")}


def test_byte_identical_for_any_worker_count(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 12, "b": 9, "c": 10})
    outs = []
    for workers in (1, 3, 2):
        out = str(tmp_path / f"out{workers}")
        convert(src, out, samples_per_shard=4, workers=workers)
        outs.append(_tree_bytes(out))
    assert outs[0] == outs[1] == outs[2]
    assert len([n for n in outs[0] if n.endswith(".tar")]) == 8


def test_a_small_source_is_spread_over_shards_byte_identically(tmp_path, photos, capsys):
    """The default limits would put 300 samples in one shard, written by one worker; the plan
    spreads them over 4 (64 at least each), the same bytes for 1 or 2 workers; with
    --min-shards 1 the summary says that a worker sat idle and what fixes it."""
    from dsconvert.cli import main

    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 150, "b": 150}, size=(16, 12))
    outs = []
    for workers in (1, 2):
        out = str(tmp_path / f"out{workers}")
        assert convert(src, out, workers=workers).workers == workers
        outs.append(_tree_bytes(out))
    assert outs[0] == outs[1] and len([n for n in outs[0] if n.endswith(".tar")]) == 4
    assert "min_shards" not in Manifest.load(str(tmp_path / "out1")).options  # the default is not recorded
    capsys.readouterr()
    assert main(["shard", src, "-o", str(tmp_path / "one"), "--workers", "2", "--min-shards", "1", "-q"]) == 0
    assert main(["shard", src, "-o", str(tmp_path / "one2"), "--workers", "2", "--min-shards", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 shard(s) for 2 workers left 1 idle" in out and "--samples-per-shard 150" in out
    assert Manifest.load(str(tmp_path / "one")).options["min_shards"] == 1


def test_odd_names_survive_webdataset(tmp_path, photos, webdataset):
    src = str(tmp_path / "flat")
    jpg = encode(photos["chelsea"].resize((24, 16)))
    stems = ["shot.v2.0001", "with space", "ünïcödé 猫", "100%~real", "d.ir/a.b.c"]
    for stem in stems:
        write(os.path.join(src, stem + ".jpg"), jpg)
        write(os.path.join(src, stem + ".json"), json.dumps({"stem": stem}).encode())
    raw_name = os.path.join(os.fsencode(src), b"caf\xe9.v1.jpg")
    with open(raw_name, "wb") as f:
        f.write(jpg)
    out = str(tmp_path / "out")
    m = convert(src, out, workers=1).manifest
    assert m.sample_type == "dict" and m.num_samples == 6
    samples = wds_samples(webdataset, out)
    assert len(samples) == 6
    got = {}
    for s in samples:
        fields = sorted(k for k in s if not k.startswith("__"))
        got[decode_key(s["__key__"])] = fields
        if "json" in s:
            assert json.loads(s["json"])["stem"] == decode_key(s["__key__"])
    expected = {stem: ["jpg", "json"] for stem in stems}
    expected[os.fsdecode(b"caf\xe9.v1")] = ["jpg"]
    assert got == expected


def test_shard_limits(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 20}, size=(200, 150))
    sizes = [os.path.getsize(p) for p in glob.glob(os.path.join(src, "a", "*"))]
    limit = 3 * max(sizes) + 20000
    m = convert(src, str(tmp_path / "bysize"), shard_size=limit, workers=1).manifest
    assert len(m.shards) > 1 and all(s.bytes <= limit for s in m.shards)
    assert sum(s.num_samples for s in m.shards) == 20
    m = convert(src, str(tmp_path / "bycount"), samples_per_shard=7, workers=1).manifest
    assert [s.num_samples for s in m.shards] == [7, 7, 6]


def test_prefetched_reads_equal_the_file(tmp_path):
    import random

    from dsconvert.io.ranges import PrefetchedBytes

    data = os.urandom(300_000)
    path = tmp_path / "blob"
    path.write_bytes(data)
    rng = random.Random(0)
    src = PrefetchedBytes.local(str(path), end=len(data), window=20_000, threads=3, piece=4096)  # many per window
    pos = 0
    while pos < len(data):
        size = rng.choice([0, 1, 100, 5000, 19_999, 45_000])  # some larger than the window
        assert src.get(pos, size) == data[pos: pos + size]
        pos += size + rng.randint(0, 3000)
    src.close()


def test_prefetch_and_mmap_paths_agree(tmp_path, photos):
    from dsconvert import open_dataset

    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 9, "b": 8})
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=4, workers=1)
    mapped = list(open_dataset(out, decode="raw", prefetch=False, stream=True))
    fetched = list(open_dataset(out, decode="raw", prefetch=True, stream=True))
    # by index: pread per sample, or a batch's members requested at once
    assert list(open_dataset(out, decode="raw", prefetch=True)) == list(open_dataset(out, decode="raw"))
    halves = [list(open_dataset(out, decode="raw", prefetch=True, rank=r, world_size=2, even=None)) for r in (0, 1)]
    assert mapped == fetched and len(mapped) == 17
    # ranks take alternate samples (the order they consume them: readers/order.py), the odd tail to the last
    assert halves[0] == mapped[0:16:2] and halves[1] == mapped[1:16:2] + mapped[16:]



@pytest.mark.parametrize("budget", [1, 64 << 20])
@pytest.mark.parametrize("layout", ["imagefolder", "flat"])
def test_fetched_reads_equal_local_reads_in_any_order(tmp_path, photos, monkeypatch, budget, layout):
    """The latency-bound path (exact members requested ahead, in groups of at most the byte
    budget: 1 byte makes every group one sample) gives what pread gives, shuffled, batched,
    dict samples included."""
    from dsconvert import open_dataset
    from dsconvert.readers import stream

    monkeypatch.setattr(stream, "_FETCH_BUDGET", budget)
    src = str(tmp_path / "src")
    if layout == "imagefolder":
        make_image_folder(src, photos, {"a": 13, "b": 12})
    else:
        for i, path in enumerate(make_image_folder(str(tmp_path / "imgs"), photos, {"a": 25})):
            write(os.path.join(src, f"s{i:03d}.jpg"), open(path, "rb").read())
            write(os.path.join(src, f"s{i:03d}.json"), json.dumps({"i": i}).encode())
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=6, workers=1)

    def read(prefetch):
        ds = open_dataset(out, decode="raw", prefetch=prefetch, shuffle=True, seed=5, buffer_size=7)
        ds.set_epoch(3)
        return [(s["__key__"], s["jpg"], s["json"]) if isinstance(s, dict) else s for s in ds]

    local, fetched = read(False), read(True)
    assert fetched == local and len(local) == 25 and len(set(map(repr, local))) == 25


@pytest.mark.parametrize("name", ["a.jpg", "x" * 96 + ".jpg", "x" * 97 + ".jpg", "é" * 40 + ".jpg",
                                  "d/" * 150 + "k.png"])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 100_000])
def test_planned_member_bytes_are_what_tarfile_writes(name, size):
    import io
    import tarfile

    from dsconvert.formats.wds import TAR_MTIME, _tar_member_bytes

    buf = io.BytesIO()
    with tarfile.TarFile(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode = size, TAR_MTIME, 0o444
        tf.addfile(ti, io.BytesIO(b"\0" * size))
        written = tf.offset
    assert _tar_member_bytes(name, size) == written


# --- shard records: binary columns, and older outputs' JSON ------------------------------

# names as a filesystem can hand them over: any text, bytes that are not UTF-8 surrogate-escaped
# (os.fsdecode: \udc80-\udcff), never NUL
_escaped = st.sampled_from([chr(c) for c in range(0xDC80, 0xDD00)])
_name_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00") | _escaped
_names = st.text(_name_chars, max_size=12)
_ints = st.integers(-(2**62) + 1, 2**62 - 1)  # a column's span fits 64 bits
# paths that start with the record's own markers (an object store's key may hold NUL)
_marked = st.text(st.sampled_from("\x00\x01ab"), min_size=1, max_size=4)


@st.composite
def _records(draw):
    """A record dict as ShardRecord.build makes one (wds or another format), values at the edges."""
    n = draw(st.integers(0, 6))
    keys = draw(st.lists(_names, min_size=n, max_size=n, unique=True))  # as every writer makes them
    d = {"schema_version": 1, "format": draw(st.sampled_from(["wds", "npy"])), "shard": "shard-000000.tar",
         "spec_sha256": "ab" * 32, "bytes": draw(st.integers(0, 2**40)), "sha256": "cd" * 32, "num_samples": n,
         "fields": {"jpg": "image"}, "keys": keys,
         "labels": draw(st.none() | st.lists(_ints, min_size=n, max_size=n)),
         "skipped": draw(st.lists(st.fixed_dictionaries({"path": _names, "reason": _names}), max_size=2))}
    sources = []
    for key in keys:  # a path that starts with its key (stored as the rest of it), or any other
        sources.append(draw(st.lists(st.one_of(st.just(key), _names.map(lambda s, k=key: k + s), _names,
                                               _marked), max_size=3)))
    d["sources"] = sources
    if draw(st.booleans()):
        d["stats"] = [[[draw(st.integers(0, 2**50)), draw(_ints)] for _ in paths] for paths in sources]
    if draw(st.booleans()):
        d["positions"] = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    if draw(st.booleans()):  # wds: per field, offset and size (-1: absent), raw_size for compressed ones
        members = {}
        for field in draw(st.lists(st.text(_name_chars, min_size=1, max_size=8), max_size=3, unique=True)):
            present = draw(st.lists(st.booleans(), min_size=n, max_size=n))
            col = {"offset": [draw(st.integers(512, 2**40)) if p else -1 for p in present],
                   "size": [draw(st.integers(0, 2**31)) if p else -1 for p in present]}
            if draw(st.booleans()):
                col["raw_size"] = [draw(st.integers(0, 2**31)) if p else -1 for p in present]
            members[field] = col
        d["members"] = members
    return d


@settings(deadline=None, database=None, max_examples=examples(500))
@given(_records())
def test_binary_record_round_trips(d):
    """encode_record -> Columns gives back the record dict, whatever its names and values."""
    data = encode_record(d)
    assert is_binary(data) and len(data) % 8 == 0
    cols = Columns(data, "shard-000000.idx")
    assert cols.to_dict() == d
    assert list(cols.strings("keys")) == d["keys"] and [cols.strings("keys")[j] for j in range(len(d["keys"]))] \
        == d["keys"]
    for field, col in cols.fields().items():  # one lookup each, as the readers do
        for part, values in col.items():
            assert [values[j] for j in range(len(values))] == d["members"][field][part]
    if d["num_samples"]:
        assert ShardRecord.load("shard-000000.idx", d["format"], data).d == d


def test_an_output_with_json_records_reads_and_verifies_as_before(tmp_path, image_folder):
    """An output of the previous release (NAME.index.json records, the manifest naming them)
    reads the same samples, map-style and streamed, and verifies OK."""
    out = str(tmp_path / "out")
    convert(image_folder, out, samples_per_shard=6, workers=1)
    mapped = list(open_dataset(out, decode="raw"))  # (image bytes, label)
    streamed = list(open_dataset(out, decode="raw", stream=True))
    assert len(mapped) == len(streamed) == 16
    to_json_records(out)
    assert not glob.glob(os.path.join(out, "*.idx")) and len(glob.glob(os.path.join(out, "*.index.json"))) == 3
    assert all(e.index.endswith(".index.json") for e in Manifest.load(out).shards)
    assert list(open_dataset(out, decode="raw")) == mapped
    assert list(open_dataset(out, decode="raw", stream=True)) == streamed
    ds = open_dataset(out, decode="raw")
    assert [ds[i] for i in reversed(range(len(ds)))] == mapped[::-1]  # random access, each shard reopened
    assert verify(out, decode=True, workers=1)["ok"]
