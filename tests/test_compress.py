"""--compress zstd: non-image fields stored as zstd-compressed <key>.<field>.zst members, read back
by dsconvert's readers under their own names and by webdataset through the handler that
docs/compression.md documents; the same bytes for any worker count; verify, resume and a hostile
frame.

Fast tier: each test converts a few dozen small samples once or twice (the first import of
webdataset, which imports torch, is most of the time of the webdataset test)."""

import glob
import hashlib
import json
import os
import struct
import sys
import tarfile
import tracemalloc

import numpy as np
import pytest

import dsconvert
from dsconvert import (
    MissingDependencyError,
    OptionError,
    OutputExistsError,
    Writer,
    convert,
    open_dataset,
)
from dsconvert.cli import main
from dsconvert.codecs import decompress_field, is_compressible, parse_compression
from dsconvert.errors import BadInputError
from dsconvert.verify import verify

from conftest import encode
from support.records import read_record, record_path, write_record

zstandard = pytest.importorskip("zstandard", reason="zstandard is not installed (pip install 'dsconvert[zstd]')")

N = 40
WORDS = ("the a photo of on in with small large red blue dog cat street river under near old new two three "
         "people standing sitting next to tree building car water sky").split()


def make_source(root, photos, n=N):
    """A flat source of dict samples: a real JPEG, a float32 feature .npy, JSON metadata, a
    caption, a class label, and an already-gzipped file; sizes past a tar block (512 bytes),
    where compression can save anything."""
    rng = np.random.default_rng(7)
    photo = next(iter(sorted(photos.items())))[1].convert("RGB")
    os.makedirs(root)
    for i in range(n):
        stem = os.path.join(root, f"s{i:04d}")
        with open(stem + ".jpg", "wb") as f:
            f.write(encode(photo.crop((i, i, 96 + i, 72 + i))))
        features = np.maximum(rng.standard_normal(512), 0).astype(np.float32)  # ReLU'd: half zeros
        np.save(stem + ".npy", features)
        caption = " ".join(rng.choice(WORDS, size=int(rng.integers(60, 200))))
        with open(stem + ".json", "w") as f:
            json.dump({"id": i, "caption": caption[:200], "width": 96, "height": 72,
                       "tags": list(rng.choice(WORDS, size=8)), "score": float(rng.random())}, f)
        with open(stem + ".txt", "w") as f:
            f.write(caption)
        with open(stem + ".cls", "w") as f:
            f.write(str(i % 3))
        with open(stem + ".gz", "wb") as f:
            import gzip

            f.write(gzip.compress(caption.encode(), mtime=0))
    return root


@pytest.fixture
def source(tmp_path, photos):
    return make_source(str(tmp_path / "src"), photos)


@pytest.fixture
def pair(tmp_path, source):
    """The same source converted without and with --compress zstd."""
    plain, packed = str(tmp_path / "plain"), str(tmp_path / "zstd")
    convert(source, plain, workers=1, samples_per_shard=16)
    convert(source, packed, workers=1, samples_per_shard=16, compress="zstd")
    return plain, packed


def members(out):
    names = {}
    for path in sorted(glob.glob(os.path.join(out, "*.tar"))):
        with tarfile.open(path) as tf:
            for m in tf:
                names[m.name] = tf.extractfile(m).read()
    return names


def same(a, b):
    """Samples equal field by field (arrays by value)."""
    assert set(a) == set(b), (sorted(a), sorted(b))
    for name in a:
        if isinstance(a[name], np.ndarray):
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
        else:
            assert a[name] == b[name], name


# --- what is stored -----------------------------------------------------------------------


def test_non_image_fields_are_zst_members_and_images_labels_and_gz_are_copied(pair, source):
    plain, packed = pair
    stored = members(packed)
    fields = {name.split(".", 1)[1] for name in stored}
    assert fields == {"jpg", "cls", "gz", "npy.zst", "json.zst", "txt.zst"}
    for name, data in stored.items():
        key, field = name.split(".", 1)
        if field.endswith(".zst"):
            with open(os.path.join(source, f"{key}.{field[:-4]}"), "rb") as f:
                assert zstandard.ZstdDecompressor().decompress(data) == f.read()
        elif field != "cls":  # a flat source's .cls is a field too: copied as it is
            with open(os.path.join(source, name), "rb") as f:
                assert data == f.read(), name  # the JPEG and the gzip: the source's bytes
    m = dsconvert.Manifest.load(packed)
    assert m.compression == {"codec": "zstd", "level": 3, "fields": ["json", "npy", "txt"]}
    assert m.options["compress"] == "zstd:3" and "compress" not in dsconvert.Manifest.load(plain).options
    assert dsconvert.Manifest.load(plain).compression is None
    assert m.fields == dsconvert.Manifest.load(plain).fields  # field names and kinds: unchanged
    # it saves bytes (the features and the text are past a tar block each; the JPEGs stay as they are)
    size = lambda out: sum(s.bytes for s in dsconvert.Manifest.load(out).shards)  # noqa: E731
    assert size(packed) < 0.9 * size(plain)


def test_which_fields_are_compressed():
    assert all(is_compressible(f) for f in ("npy", "json", "txt", "labels.npy", "bin", "pyd", "seg.json"))
    assert not any(is_compressible(f) for f in ("jpg", "JPEG", "png", "webp", "cls", "seg.png", "gz", "zst", "npz",
                                                "mp4", "flac"))


# --- dsconvert's readers ------------------------------------------------------------------


@pytest.mark.parametrize("decode", ["raw", "pil", "numpy", "buffer"])
def test_open_dataset_gives_the_uncompressed_outputs_samples(pair, decode):
    plain, packed = pair
    for options in ({}, {"prefetch": True}):  # one pread a sample; a batch's bytes requested at once
        a, b = open_dataset(plain, decode=decode), open_dataset(packed, decode=decode, **options)
        assert len(a) == len(b) == N
        for i in range(N):
            x, y = a[i], b[i]
            if decode == "buffer":
                x, y = {k: bytes(v) if k != "__key__" else v for k, v in x.items()}, \
                       {k: bytes(v) if k != "__key__" else v for k, v in y.items()}
            if decode in ("pil", "numpy"):
                x["jpg"], y["jpg"] = np.asarray(x["jpg"]), np.asarray(y["jpg"])
            same(x, y)
        assert b.__getitems__([3, 1, 2])[0]["__key__"] == b[3]["__key__"]


@pytest.mark.parametrize("decode", ["raw", "numpy"])
def test_streaming_gives_the_uncompressed_outputs_samples(pair, decode):
    plain, packed = pair
    a = {s["__key__"]: s for s in open_dataset(plain, decode=decode, stream=True)}
    b = {s["__key__"]: s for s in open_dataset(packed, decode=decode, stream=True, prefetch=True)}
    assert len(a) == len(b) == N
    for key in a:
        same(a[key], b[key])


def test_raw_gives_the_fields_original_bytes_under_their_own_names(pair, source):
    _, packed = pair
    s = open_dataset(packed, decode="raw")[5]
    for field in ("npy", "json", "txt"):
        with open(os.path.join(source, f"{s['__key__']}.{field}"), "rb") as f:
            assert s[field] == f.read()
    assert not any(name.endswith(".zst") for name in s)


# --- webdataset -----------------------------------------------------------------------------


def zstd_handler(key, data):
    """docs/compression.md's handler: a .zst member decompressed, then decoded by its own field."""
    import webdataset as wds

    if not key.endswith(".zst"):
        return None
    return wds.autodecode.Continue(key[:-4], zstandard.ZstdDecompressor().decompress(data))


def drop_zst(sample):
    """docs/compression.md's map: the fields under their own names."""
    return {k.removesuffix(".zst"): v for k, v in sample.items()}


def test_webdataset_reads_the_shards_with_the_documented_handler(pair):
    wds = pytest.importorskip("webdataset", reason="webdataset is not installed (pip install 'dsconvert[test]')")
    plain, packed = pair

    def read(out, *handlers, fix=lambda s: s):
        urls = sorted(glob.glob(os.path.join(out, "*.tar")))
        ds = wds.WebDataset(urls, shardshuffle=False).decode(*handlers).map(fix)
        return [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in ds]

    a = read(plain, "rgb8")
    b = read(packed, zstd_handler, "rgb8", fix=drop_zst)
    assert [s["__key__"] for s in a] == [s["__key__"] for s in b] and len(a) == N
    for x, y in zip(a, b):
        same(x, y)
    assert isinstance(b[0]["npy"], np.ndarray) and isinstance(b[0]["json"], dict) and b[0]["txt"] == a[0]["txt"]
    # without the handler, webdataset hands over the stored bytes under <field>.zst
    raw = read(packed)[0]
    assert json.loads(zstandard.ZstdDecompressor().decompress(raw["json.zst"])) == a[0]["json"]


# --- determinism, resume, verify ----------------------------------------------------------


def _digests(out):
    return {name: hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(out)) if not name.startswith(".")}


def test_byte_identical_for_one_or_two_workers(tmp_path, source):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    convert(source, one, workers=1, samples_per_shard=10, compress="zstd:5")
    convert(source, two, workers=2, samples_per_shard=10, compress="zstd:5")
    assert len(glob.glob(os.path.join(one, "*.tar"))) == 4
    assert _digests(one) == _digests(two)


def test_a_rerun_with_another_level_is_refused_and_resume_keeps_only_matching_shards(tmp_path, source):
    out = str(tmp_path / "out")
    first = convert(source, out, workers=1, samples_per_shard=10, compress="zstd")
    before = _digests(out)
    assert convert(source, out, workers=1, samples_per_shard=10, compress="zstd").already_complete
    with pytest.raises(OutputExistsError):
        convert(source, out, workers=1, samples_per_shard=10, compress="zstd:9")
    with pytest.raises(OutputExistsError):
        convert(source, out, workers=1, samples_per_shard=10)
    # a killed run: no manifest, one shard unfinished (its record gone)
    os.remove(os.path.join(out, "dsconvert.json"))
    os.remove(os.path.join(out, first.manifest.shards[2].index))
    again = convert(source, out, workers=1, samples_per_shard=10, compress="zstd")
    assert (again.shards_resumed, again.shards_written) == (3, 1) and _digests(out) == before
    # resumed with another level: the finished shards are not this plan's, every one is written again
    os.remove(os.path.join(out, "dsconvert.json"))
    other = convert(source, out, workers=1, samples_per_shard=10, compress="zstd:9")
    assert other.shards_resumed == 0 and other.manifest.compression["level"] == 9


def test_verify_passes_and_finds_a_flipped_byte_in_a_zst_member(tmp_path, pair):
    _, packed = pair
    assert verify(packed, decode=True)["ok"]
    shard = sorted(glob.glob(os.path.join(packed, "*.tar")))[0]
    with tarfile.open(shard) as tf:
        member = next(m for m in tf if m.name.endswith(".json.zst"))
    with open(shard, "r+b") as f:
        f.seek(member.offset_data + member.size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    report = verify(packed)
    assert not report["ok"]
    assert [(p["kind"], p["path"]) for p in report["problems"]] == [("checksum", os.path.basename(shard))]
    # the frame's own checksum: a reader that never verifies finds it too, naming the sample
    with pytest.raises(BadInputError, match="damaged zstd field") as exc:
        [s for s in open_dataset(packed, decode="raw")]
    assert member.name.split(".", 1)[0] in str(exc.value)


def test_verify_against_the_source_still_compares_it(tmp_path, pair, source):
    _, packed = pair
    assert verify(packed, source=source)["ok"]
    with open(os.path.join(source, "s0003.json"), "a") as f:
        f.write(" ")
    report = verify(packed, source=source)
    assert not report["ok"] and report["source"]["changed"] == ["s0003.json"]


def test_a_compressed_output_converts_again_uncompressed(tmp_path, pair):
    plain, packed = pair
    again = str(tmp_path / "again")
    convert(packed, again, workers=1)
    a, b = open_dataset(plain, decode="raw"), open_dataset(again, decode="raw")
    assert sorted(s["__key__"] for s in a) == sorted(s["__key__"] for s in b)
    by_key = {s["__key__"]: s for s in b}
    for s in a:
        same(s, by_key[s["__key__"]])


# --- a hostile member ---------------------------------------------------------------------


def _bomb(declared):
    """A zstd frame of 16 bytes declaring ``declared`` bytes of content (an 8-byte content size,
    single segment), then one RLE block."""
    header = struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", declared)
    return header + (1 | 1 << 1 | 8 << 3).to_bytes(3, "little") + b"\0"


def _replace_member(shard, suffix, data):
    """Overwrite one member's data in place (same size: the tar and its index stay whole)."""
    with tarfile.open(shard) as tf:
        member = next(m for m in tf if m.name.endswith(suffix) and m.size >= len(data))
    with open(shard, "r+b") as f:
        f.seek(member.offset_data)
        f.write(data + b"\0" * (member.size - len(data)))
    return member


@pytest.mark.parametrize("frame", ["declares 1 GiB", "declares no size"])
def test_a_zstd_bomb_allocates_nothing_and_fails_clearly(tmp_path, pair, frame):
    _, packed = pair
    if frame == "declares 1 GiB":
        data = _bomb(1 << 30)
    else:  # 16 MiB of zeros in a frame without its content size: about 500 bytes
        obj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
        data = b"".join([obj.compress(bytes(1 << 20)) for _ in range(16)] + [obj.flush()])
    shard = sorted(glob.glob(os.path.join(packed, "*.tar")))[0]
    member = _replace_member(shard, ".npy.zst", data)
    key = member.name.split(".", 1)[0]
    ds = open_dataset(packed, decode="raw")
    tracemalloc.start()
    try:
        with pytest.raises(BadInputError, match="damaged zstd field: its frame declares") as exc:
            for j in range(len(ds)):
                ds[j]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # a decompressor that trusted the frame would allocate 1 GiB or 16 MiB
    assert "\n" not in str(exc.value) and key in str(exc.value)


def test_the_decompressed_size_is_bounded_by_max_member_bytes():
    frame = zstandard.ZstdCompressor().compress(bytes(100_000))
    assert decompress_field(frame, 100_000, 1 << 20) == bytes(100_000)
    with pytest.raises(BadInputError, match="over the limit of 65,536 bytes"):
        decompress_field(frame, 100_000, 1 << 16)
    with pytest.raises(BadInputError, match="declares 100,000 bytes, the record 99,999"):
        decompress_field(frame, 99_999, 1 << 20)
    with pytest.raises(BadInputError, match="unused data"):
        decompress_field(frame + b"\0", 100_000, 1 << 20)


def test_a_stream_names_the_sample_of_a_damaged_member(tmp_path, pair):
    _, packed = pair
    shard = sorted(glob.glob(os.path.join(packed, "*.tar")))[0]
    key = _replace_member(shard, ".npy.zst", _bomb(1 << 30)).name.split(".", 1)[0]
    with pytest.raises(BadInputError, match=f"shard-000000.tar: {key}: damaged zstd field"):
        list(open_dataset(packed, decode="raw", stream=True))


def test_an_empty_field_is_one_empty_frame_and_nothing_after():
    empty = zstandard.ZstdCompressor(write_content_size=True).compress(b"")
    assert decompress_field(empty, 0, 1 << 20) == b""
    for bad in (empty + b"junk", struct.pack("<II", 0x184D2A50, 0), empty + empty):
        with pytest.raises(BadInputError, match="damaged zstd field"):
            decompress_field(bad, 0, 1 << 20)


def test_many_fields_within_the_bound_each_are_bounded_as_a_sample(tmp_path):
    """Fields of a sample that pass max_member_bytes one by one and not together: refused
    before any is decompressed (a few kB of frames holding gigabytes)."""
    out = str(tmp_path / "out")
    with Writer(out, compress="zstd") as w:
        w.write({"__key__": "k", "a.bin": bytes(300_000), "b.bin": bytes(300_000), "c.bin": bytes(300_000)})
    assert open_dataset(out, decode="raw")[0]["a.bin"] == bytes(300_000)
    with pytest.raises(BadInputError, match="hold 900,000 bytes decompressed, over the limit of 500,000"):
        open_dataset(out, decode="raw", max_member_bytes=500_000)[0]


def test_a_field_and_its_zst_twin_are_a_counted_skip_not_two_members_of_one_name(tmp_path):
    out = str(tmp_path / "out")
    with Writer(out, compress="zstd") as w:
        w.write({"__key__": "ok", "json": {"i": 1}})
        w.write({"__key__": "twin", "json": {"i": 2}, "json.zst": zstandard.ZstdCompressor().compress(b"{}")})
    m = dsconvert.Manifest.load(out)
    assert m.num_samples == 1 and "would both be stored as member 'json.zst'" in m.skipped[0]["reason"]
    assert verify(out)["ok"] and open_dataset(out, decode="numpy")[0]["json"] == {"i": 1}


@pytest.mark.parametrize("lone", ["txt.zst", "TXT.ZST", "json.zst", "a.b.zst"])
def test_a_lone_zst_field_is_a_counted_skip_not_read_back_as_another_field(tmp_path, lone):
    """Alone in its sample, a field named like another field's compressed member would be read
    back as that field compressed, and fail (verify said OK): refused when written."""
    out = str(tmp_path / "out")
    with Writer(out, compress="zstd") as w:
        w.write({"__key__": "a", "txt": "hello"})
        w.write({"__key__": "b", lone: b"not a frame"})
    m = dsconvert.Manifest.load(out)
    assert m.num_samples == 1 and "would be read back as field" in m.skipped[0]["reason"]
    assert verify(out)["ok"] and open_dataset(out, decode="raw")[0]["txt"] == b"hello"


def test_an_index_whose_compression_is_null_is_damaged(tmp_path, pair):
    _, packed = pair
    index = record_path(packed, "shard-000000.tar")
    d = read_record(index)
    d["compression"] = None
    write_record(index, d)
    from dsconvert.formats.wds import Wds

    with pytest.raises(dsconvert.ManifestError, match="compression"):
        Wds.load_record(index)


def test_an_index_stripped_of_its_compression_is_found_by_verify_and_refused_by_readers(tmp_path, pair):
    """The whole output rewritten (the index's digest in the manifest made anew): readers would
    give compressed bytes for fields; verify and the readers check the record against the manifest."""
    _, packed = pair
    index = record_path(packed, "shard-000000.tar")
    d = read_record(index)
    del d["compression"]
    write_record(index, d)
    data = open(index, "rb").read()
    manifest_path = os.path.join(packed, "dsconvert.json")
    m = json.load(open(manifest_path))
    name = os.path.basename(index)
    m["shards"][0]["parts"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(manifest_path, "w") as f:
        json.dump(m, f)
    report = verify(packed)
    assert not report["ok"] and any("compressed fields" in p["message"] for p in report["problems"]), report
    with pytest.raises(dsconvert.ManifestError, match="its compressed fields are not the manifest's"):
        open_dataset(packed, decode="raw")[0]


# --- options ------------------------------------------------------------------------------


def test_the_setting_and_its_errors():
    assert parse_compression("zstd") == {"codec": "zstd", "level": 3}
    assert parse_compression("zstd:19") == {"codec": "zstd", "level": 19}
    assert parse_compression(None) is None
    for bad in ("gzip", "zstd:0", "zstd:23", "zstd:x", "zstd:"):
        with pytest.raises(OptionError):
            parse_compression(bad)


@pytest.mark.parametrize("fmt", ["hdf5", "npy"])
def test_hdf5_and_npy_refuse_compress_in_one_line(tmp_path, image_folder, fmt):
    with pytest.raises(OptionError, match="compress applies to wds outputs") as exc:
        convert(image_folder, str(tmp_path / "out"), fmt, compress="zstd")
    assert "\n" not in str(exc.value)
    with pytest.raises(OptionError, match="compress applies to wds outputs"):
        Writer(str(tmp_path / "w"), format=fmt, compress="zstd")


def test_without_zstandard_it_is_one_line_naming_the_extra(tmp_path, source, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now raises ImportError
    with pytest.raises(MissingDependencyError) as exc:
        convert(source, str(tmp_path / "out"), compress="zstd")
    assert "pip install 'dsconvert[zstd]'" in str(exc.value) and "\n" not in str(exc.value)
    assert not os.path.exists(tmp_path / "out" / "dsconvert.json")
    assert main(["shard", source, "-o", str(tmp_path / "cli"), "--compress", "zstd", "-q"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'dsconvert[zstd]'" in err


def test_the_command_line_takes_a_level_and_refuses_a_bad_one(tmp_path, source, capsys):
    out = str(tmp_path / "out")
    assert main(["shard", source, "-o", out, "--compress", "zstd:1", "--workers", "1", "-q"]) == 0
    assert dsconvert.Manifest.load(out).compression["level"] == 1
    capsys.readouterr()
    assert main(["info", out]) == 0
    assert "compressed:  zstd level 1: json, npy, txt (members KEY.FIELD.zst" in capsys.readouterr().out
    assert main(["shard", source, "-o", str(tmp_path / "bad"), "--compress", "zstd:40"]) == 2
    assert "argument --compress: the zstd level must be within 1..22, not 40" in capsys.readouterr().err


def test_writer_and_optimize_compress_too(tmp_path):
    rng = np.random.default_rng(0)
    samples = [{"__key__": f"k{i}", "labels.npy": rng.integers(0, 5, size=300).astype(np.int64), "json": {"i": i},
                "png": rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8)} for i in range(20)]
    plain, packed = str(tmp_path / "plain"), str(tmp_path / "packed")
    for out, compress in ((plain, None), (packed, "zstd")):
        with Writer(out, samples_per_shard=8, compress=compress) as w:
            for s in samples:
                w.write(s)
    assert dsconvert.Manifest.load(packed).compression["fields"] == ["json", "labels.npy"]
    stored = members(packed)
    assert any(n.endswith(".labels.npy.zst") for n in stored) and any(n.endswith(".png") for n in stored)
    a, b = open_dataset(plain, decode="numpy"), open_dataset(packed, decode="numpy")
    for i in range(20):
        same(a[i], b[i])
    assert verify(packed, decode=True)["ok"]
    made = dsconvert.optimize(_sample, range(20), str(tmp_path / "opt"), workers=1, compress="zstd:2")
    assert made.manifest.compression == {"codec": "zstd", "level": 2, "fields": ["npy"]}
    assert np.array_equal(open_dataset(str(tmp_path / "opt"), decode="numpy")[4]["npy"], np.arange(4, 404))
    with pytest.raises(OptionError):
        dsconvert.optimize(_sample, range(2), str(tmp_path / "bad"), compress="lz4")


def _sample(i):
    return {"npy": np.arange(i, i + 400)}


def test_the_planned_bytes_bound_what_is_written(tmp_path):
    """Shards planned by size: a compressed member may be a little larger than its field
    (incompressible data), and the plan's bound covers it."""
    rng = np.random.default_rng(1)
    out = str(tmp_path / "out")
    with Writer(out, shard_size=20_000, compress="zstd:1") as w:
        for i in range(30):
            w.write({"__key__": f"k{i}", "bin": rng.bytes(int(rng.integers(400, 3000)))})
    m = dsconvert.Manifest.load(out)
    assert len(m.shards) > 2 and all(s.bytes <= 20_000 for s in m.shards)
