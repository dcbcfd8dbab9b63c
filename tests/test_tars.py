"""Tar shards another tool wrote: read in place by the indexed reader (the same samples as
webdataset's own reader), converted to every format, and dsconvert outputs converted again.

Shards come from the real webdataset ShardWriter and from GNU tar; hostile tars are built
byte by byte; the object-store path runs against moto's S3 server on 127.0.0.1.
"""

import glob
import io
import json
import os
import random
import shutil
import subprocess
import tarfile

import pytest

from dsconvert import SourceError, convert, open_dataset
from dsconvert.source import scan
from dsconvert.source.tars import INDEX_FOLDER, TarShards, list_tars

from conftest import crop, encode, jpeg_crops

wds = pytest.importorskip("webdataset")

CLASSES = ["cat", "dog", "eel"]


@pytest.fixture
def shardwriter_tars(tmp_path, photos):
    """60 img2dataset-like samples (jpg, json, txt, cls) in 3 tars by webdataset's ShardWriter."""
    folder = tmp_path / "wds"
    folder.mkdir()
    jpegs = jpeg_crops(photos, 60)
    with wds.ShardWriter(str(folder / "train-%06d.tar"), maxcount=25, verbose=0) as sink:
        for i, jpg in enumerate(jpegs):
            sink.write({"__key__": f"{i:09d}", "jpg": jpg, "cls": i % 3, "txt": f"caption {i}",
                        "json": {"label": CLASSES[i % 3], "i": i}})
    return str(folder)


@pytest.fixture
def gnu_tars(tmp_path, photos):
    """Two tars made by GNU tar from folders of files, keys with subfolders and dots in fields."""
    out = tmp_path / "gnu"
    out.mkdir()
    jpegs = jpeg_crops(photos, 12, seed=1)
    for t in range(2):
        src = tmp_path / f"files{t}"
        for i in range(6):
            k = t * 6 + i
            (src / "part").mkdir(parents=True, exist_ok=True)
            (src / "part" / f"s{k:03d}.jpg").write_bytes(jpegs[k])
            seg = crop(next(iter(photos.values())), random.Random(k))
            (src / "part" / f"s{k:03d}.seg.PNG").write_bytes(encode(seg, "PNG"))
            (src / "part" / f"s{k:03d}.cls").write_text(str(k % 2))
        names = sorted(os.path.relpath(p, src) for p in glob.glob(str(src / "part" / "*")))
        subprocess.run(["tar", "cf", str(out / f"g-{t}.tar"), "-C", str(src), *names], check=True)
    return str(out)


def webdataset_samples(folder):
    """What webdataset's own reader gives, with the fields as bytes."""
    urls = sorted(glob.glob(os.path.join(folder, "*.tar")))
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in wds.WebDataset(urls, shardshuffle=False)]


# --- reading tars in place ---------------------------------------------------------------


@pytest.mark.parametrize("which", ["shardwriter_tars", "gnu_tars"])
def test_reads_the_samples_webdataset_reads(which, request):
    folder = request.getfixturevalue(which)
    want = webdataset_samples(folder)
    ds = open_dataset(folder, decode="raw")
    got = list(ds)
    assert len(ds) == len(got) == len(want) > 0
    assert [dict(s) for s in got] == want  # keys, fields (lower-cased), bytes and order
    assert os.path.isdir(os.path.join(folder, INDEX_FOLDER))


def test_decoded_fields_and_dataloader_workers(shardwriter_tars, torch):
    ds = open_dataset(shardwriter_tars, decode="numpy")
    first = next(iter(ds))
    assert first["jpg"].ndim == 3 and first["cls"] == 0 and first["json"]["label"] == "cat"
    assert first["txt"] == "caption 0"
    loader = torch.utils.data.DataLoader(open_dataset(shardwriter_tars, decode="raw"), batch_size=None,
                                         num_workers=2)
    keys = [s["__key__"] for s in loader]
    assert sorted(keys) == [f"{i:09d}" for i in range(60)]  # every sample once over the workers
    ranks = [[s["__key__"] for s in open_dataset(shardwriter_tars, decode="raw", rank=r, world_size=3)]
             for r in range(3)]
    assert sorted(k for r in ranks for k in r) == sorted(keys) and all(ranks)


def test_label_makes_an_image_folder_drop_in(shardwriter_tars):
    ds = open_dataset(shardwriter_tars, label="json.label", decode="numpy")
    assert ds.classes == CLASSES
    got = list(ds)
    assert [label for _, label in got] == [i % 3 for i in range(60)]
    ints = open_dataset(shardwriter_tars, label="cls", decode="raw")
    assert ints.classes is None
    raw = list(ints)
    assert [label for _, label in raw] == [i % 3 for i in range(60)]
    assert [img for img, _ in raw] == [s["jpg"] for s in webdataset_samples(shardwriter_tars)]


def test_index_is_reused_and_rebuilt_when_the_tar_changes(shardwriter_tars, monkeypatch):
    open_dataset(shardwriter_tars)  # builds the indexes
    import dsconvert.source.tars as tars

    def no_scan(*a, **k):
        raise AssertionError("indexed again")

    monkeypatch.setattr(tars, "_scan", no_scan)
    assert len(open_dataset(shardwriter_tars)) == 60  # from the saved indexes
    first = os.path.join(shardwriter_tars, "train-000000.tar")
    with tarfile.open(first, "a") as tf:  # append a sample: the tar is another version now
        info = tarfile.TarInfo("extra.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(AssertionError, match="indexed again"):
        open_dataset(shardwriter_tars)
    monkeypatch.undo()
    assert len(open_dataset(shardwriter_tars)) == 61


@pytest.mark.parametrize("damage", ["garbage", "offsets", "truncated", "other-tar", "field-dropped",
                                    "sample-added", "keys-swapped", "one-byte"])
def test_a_damaged_saved_index_is_never_trusted(shardwriter_tars, damage):
    """Damage that keeps the index self-consistent (a field or a sample more or less, keys
    reordered, one byte changed) fails its own digest: the tar is indexed again."""
    want = webdataset_samples(shardwriter_tars)
    open_dataset(shardwriter_tars)
    path = os.path.join(shardwriter_tars, INDEX_FOLDER, "train-000001.tar.json")
    text = open(path).read()
    if damage == "garbage":
        text = "[[[[" * 10000
    elif damage == "offsets":
        d = json.loads(text)
        d["members"]["jpg"]["offset"][0] = 10**12
        text = json.dumps(d)
    elif damage == "truncated":
        text = text[: len(text) // 2]
    elif damage in ("field-dropped", "sample-added", "keys-swapped"):
        d = json.loads(text)
        if damage == "field-dropped":
            d["members"].pop("json")
            d["fields"].pop("json")
        elif damage == "sample-added":
            d["num_samples"] += 1
            d["keys"].append("zz")
            d["sources"].append([])
            for col in d["members"].values():
                col["offset"].append(-1)
                col["size"].append(-1)
            for values in d["label_values"].values():
                values.append(0)
        else:
            d["keys"] = d["keys"][::-1]
        text = json.dumps(d, indent=1)
    elif damage == "one-byte":
        at = text.index('"keys"') + 12
        text = text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1:]
    else:
        text = open(path.replace("000001", "000002")).read()
    open(path, "w").write(text)
    assert [dict(s) for s in open_dataset(shardwriter_tars, decode="raw")] == want


def test_index_goes_to_a_cache_folder_when_asked(shardwriter_tars, tmp_path):
    index_dir = str(tmp_path / "idx")
    assert len(open_dataset(shardwriter_tars, index_dir=index_dir)) == 60
    assert sorted(os.listdir(index_dir)) == [f"train-00000{i}.tar.json" for i in range(3)]
    assert not os.path.exists(os.path.join(shardwriter_tars, INDEX_FOLDER))


def test_brace_pattern_and_single_tar(shardwriter_tars):
    pattern = os.path.join(shardwriter_tars, "train-{000000..000001}.tar")
    assert len(open_dataset(pattern)) == 50
    assert len(open_dataset(os.path.join(shardwriter_tars, "train-000002.tar"))) == 10
    with pytest.raises(SourceError, match="not there"):
        open_dataset(os.path.join(shardwriter_tars, "train-{000000..000009}.tar"))


# --- hostile tars --------------------------------------------------------------------------


def _member(tf, name, data=b"x", kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def test_hostile_members_are_skipped_with_reasons(tmp_path, photos):
    folder = tmp_path / "bad"
    folder.mkdir()
    jpg = jpeg_crops(photos, 1)[0]
    with tarfile.open(folder / "a.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        _member(tf, "ok.jpg", jpg)
        _member(tf, "../escape.jpg", jpg)
        _member(tf, "/abs.jpg", jpg)
        _member(tf, "link.jpg", kind=tarfile.SYMTYPE, link="/etc/passwd")
        _member(tf, "dev.jpg", kind=tarfile.CHRTYPE)
        _member(tf, "noextension", b"data")
        _member(tf, "dup.jpg", jpg)
        _member(tf, "dup.JPG", jpg)  # the same field after lower-casing
        _member(tf, "__meta__", b"{}")
        _member(tf, "dir/", kind=tarfile.DIRTYPE)
        _member(tf, "last.jpg", jpg)
    (folder / "b.tar.gz").write_bytes(b"\x1f\x8b" + b"\0" * 100)
    (folder / "README").write_text("hello")
    source = scan(str(folder))
    assert source.kind == "tar"
    assert [s.key for s in source.samples] == ["ok", "dup", "last"]
    reasons = {s.path: s.reason for s in source.skipped}
    assert "unsafe" in reasons["a.tar/../escape.jpg"] and "unsafe" in reasons["a.tar//abs.jpg"]
    assert "symlink" in reasons["a.tar/link.jpg"] and "device" in reasons["a.tar/dev.jpg"]
    assert "extension" in reasons["a.tar/noextension"] and "repeats" in reasons["a.tar/dup.JPG"]
    assert "compressed" in reasons["b.tar.gz"]
    assert [i.path for i in source.ignored] == ["README"]
    out = tmp_path / "out"
    r = convert(str(folder), str(out), "wds", workers=1)
    acc = r.manifest.accounting
    assert acc["files_seen"] == acc["files_written"] + acc["files_skipped"] and acc["files_written"] == 3


@pytest.mark.parametrize("how", ["truncated", "garbage", "huge-size", "empty", "zeros"])
def test_broken_tars_never_read_past_their_end(tmp_path, photos, how):
    folder = tmp_path / "bad"
    folder.mkdir()
    jpgs = jpeg_crops(photos, 3)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i, j in enumerate(jpgs):
            _member(tf, f"k{i}.jpg", j)
    data = buf.getvalue()
    if how == "truncated":
        data = data[: 512 + len(jpgs[0]) + 512 + 100]  # the second member's data cut short
    elif how == "garbage":
        data = os.urandom(4096)
    elif how == "huge-size":  # the first header declares 8 GB of data
        head = bytearray(data[:512])
        head[124:136] = b"77777777777\0"
        head[148:156] = b"        "
        head[148:156] = f"{sum(head):06o}\0 ".encode()
        data = bytes(head) + data[512:]
    elif how == "empty":
        data = b""
    else:
        data = b"\0" * 10240
    (folder / "x.tar").write_bytes(data)
    (folder / "y.tar").write_bytes(buf.getvalue())  # a good one beside it
    source = scan(str(folder))
    paths = [s.files[0].path for s in source.samples]
    assert paths[-3:] == ["y.tar/k0.jpg", "y.tar/k1.jpg", "y.tar/k2.jpg"]  # the good tar whole
    if how == "truncated":
        assert paths[:-3] == ["x.tar/k0.jpg"], source.skipped
        assert any(s.path.startswith("x.tar/") and ("truncated" in s.reason or "end of data" in s.reason)
                   for s in source.skipped), source.skipped
    elif how in ("garbage",):
        assert [s.path for s in source.skipped] == ["x.tar"]
    elif how == "huge-size":
        assert any("past the end" in s.reason for s in source.skipped)
    ds = open_dataset(str(folder), decode="raw")
    assert [s["__key__"] for s in ds][-3:] == ["k0", "k1", "k2"]


# --- converting tars ------------------------------------------------------------------------


def test_conversion_carries_every_member_byte_exact(shardwriter_tars, tmp_path):
    out = tmp_path / "out"
    r = convert(shardwriter_tars, str(out), "wds", workers=2, samples_per_shard=20)
    m = r.manifest
    assert m.sample_type == "dict" and m.num_samples == 60 and m.source["layout"] == "tars"
    assert m.accounting == {"files_seen": 240, "files_written": 240, "files_skipped": 0, "files_ignored": 0}
    assert [dict(s) for s in open_dataset(str(out), decode="raw")] == webdataset_samples(shardwriter_tars)
    again = tmp_path / "again"
    convert(shardwriter_tars, str(again), "wds", workers=1, samples_per_shard=20)
    for name in os.listdir(out):
        if name.endswith(".tar"):
            assert (out / name).read_bytes() == (again / name).read_bytes()


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_label_converts_to_classification_outputs(shardwriter_tars, tmp_path, fmt):
    out = tmp_path / "out"
    r = convert(shardwriter_tars, str(out), fmt, label="json.label", workers=2, resize=16 if fmt == "npy" else None)
    m = r.manifest
    assert m.classes == CLASSES and m.num_samples == 60 and m.options["label"] == "json.label"
    assert m.accounting["files_seen"] == 60 and len(m.ignored) == 3  # json, txt, cls: counted per tar
    ds = open_dataset(str(out), decode="numpy")
    assert [ds[i][1] for i in range(len(ds))] == [i % 3 for i in range(60)]


def test_missing_and_bad_labels_are_skipped_with_reasons(tmp_path, photos):
    folder = tmp_path / "t"
    folder.mkdir()
    jpgs = jpeg_crops(photos, 4)
    with wds.TarWriter(str(folder / "a.tar")) as sink:
        sink.write({"__key__": "good", "jpg": jpgs[0], "cls": 1})
        sink.write({"__key__": "nolabel", "jpg": jpgs[1]})
        sink.write({"__key__": "badlabel", "jpg": jpgs[2], "cls": b"-3"})
        sink.write({"__key__": "noimage", "txt": "only text", "cls": 0})
    r = convert(str(folder), str(tmp_path / "out"), "npy", label="cls", workers=1)
    m = r.manifest
    assert m.num_samples == 1
    reasons = {s["path"]: s["reason"] for s in m.skipped}
    assert "no 'cls' member" in reasons["a.tar/nolabel.jpg"]
    assert "neither an integer" in reasons["a.tar/badlabel.jpg"]
    assert "no image" in reasons["a.tar/noimage.txt"]
    acc = m.accounting
    assert acc["files_seen"] == acc["files_written"] + acc["files_skipped"]


def test_conversion_from_tars_resumes(shardwriter_tars, tmp_path):
    out = tmp_path / "out"
    first = convert(shardwriter_tars, str(out), "wds", workers=1, samples_per_shard=20)
    os.remove(out / "dsconvert.json")
    os.remove(out / first.manifest.shards[1].name)  # as if killed while writing it
    again = convert(shardwriter_tars, str(out), "wds", workers=2, samples_per_shard=20)
    assert again.shards_resumed == len(first.manifest.shards) - 1 and again.shards_written == 1
    assert again.manifest.to_dict() == first.manifest.to_dict()


def test_a_tar_changed_during_conversion_is_said(shardwriter_tars, tmp_path, monkeypatch):
    from dsconvert import inputs

    real = inputs.READERS["tar"]

    def touched(spec, checked):
        os.utime(os.path.join(shardwriter_tars, "train-000000.tar"), ns=(1, 1))
        yield from real(spec, checked)

    monkeypatch.setitem(inputs.READERS, "tar", touched)
    r = convert(shardwriter_tars, str(tmp_path / "out"), "wds", workers=1)
    assert r.manifest.skipped and all("changed during" in s["reason"] for s in r.manifest.skipped)
    assert all(s["path"].startswith("train-000000.tar/") for s in r.manifest.skipped)


def test_cli_label_and_wrong_label_use(shardwriter_tars, tmp_path, image_folder, capsys):
    from dsconvert.cli import main

    assert main(["shard", shardwriter_tars, "-o", str(tmp_path / "o"), "--format", "npy", "--label", "cls",
                 "--resize", "16", "-q"]) == 0
    assert main(["shard", shardwriter_tars, "-o", str(tmp_path / "o2"), "--format", "npy", "-q"]) == 1
    assert "--label" in capsys.readouterr().err
    assert main(["shard", image_folder, "-o", str(tmp_path / "o3"), "--label", "cls", "-q"]) == 1
    assert "--label" in capsys.readouterr().err
    with pytest.raises(SourceError, match="label"):
        convert(shardwriter_tars, str(tmp_path / "o4"), "npy", label="json..x")


# --- re-conversion ------------------------------------------------------------------------------


def test_outputs_convert_again_through_their_reader(image_folder, tmp_path):
    h5 = tmp_path / "h5"
    convert(image_folder, str(h5), "hdf5", workers=1)
    again = tmp_path / "wds"
    m = convert(str(h5), str(again), "wds", workers=2).manifest
    assert m.source["layout"] == "output" and m.sample_type == "classification"
    a, b = open_dataset(str(h5), decode="raw"), list(open_dataset(str(again), decode="raw"))
    assert [a[i] for i in range(len(a))] == b  # same images byte for byte, same labels, same order
    assert open_dataset(str(again)).classes == a.classes
    small = tmp_path / "npy"
    convert(str(again), str(small), "npy", resize=20, workers=1)
    assert min(open_dataset(str(small), decode="numpy")[0][0].shape[:2]) == 20
    with pytest.raises(SourceError, match="decoded pixels.*convert from the source it was made from"):
        convert(str(small), str(tmp_path / "back"), "wds")


@pytest.mark.system
def test_remote_tars_index_in_a_cache_folder(shardwriter_tars, s3, tmp_path, monkeypatch):
    monkeypatch.setenv("DSCONVERT_CACHE", str(tmp_path / "cache"))
    shutil.rmtree(os.path.join(shardwriter_tars, INDEX_FOLDER), ignore_errors=True)
    url = s3.put_tree(shardwriter_tars, "tars")
    want = webdataset_samples(shardwriter_tars)
    ds = open_dataset(url, decode="raw", storage_options=s3.options)
    assert [dict(s) for s in ds] == want
    assert glob.glob(str(tmp_path / "cache" / "tar-index" / "*" / "train-000000.tar.json"))
    assert not s3.fs.exists(f"{s3.bucket}/tars/{INDEX_FOLDER}")  # nothing written into the store
    cached = open_dataset(url, decode="raw", storage_options=s3.options, cache_dir=str(tmp_path / "shards"))
    assert [dict(s) for s in cached] == want
    out = tmp_path / "out"
    convert(url, str(out), "wds", storage_options=s3.options, workers=1)
    assert [dict(s) for s in open_dataset(str(out), decode="raw")] == want


def test_list_tars_refuses_names_a_shard_cannot_have(tmp_path):
    (tmp_path / "ok.tar").write_bytes(b"")
    (tmp_path / "bad name.tar").write_bytes(b"")
    _, names, skipped, _ = list_tars(str(tmp_path))
    assert names == ["ok.tar"] and [s.path for s in skipped] == ["bad name.tar"]
    assert TarShards(*list_tars(str(tmp_path))[:2]).summaries["ok.tar"].num_samples == 0



# --- analyze -------------------------------------------------------------------------------------


def _run_printed(line, tmp_path):
    """Run a command analyze printed: a dsconvert command line, or an open_dataset(...) call."""
    import shlex

    from dsconvert.cli import main

    code = line.split("   #")[0].strip()
    if code.startswith("dsconvert "):
        assert main(shlex.split(code)[1:] + ["-q"]) == 0, code
        return
    assert code.startswith("open_dataset("), code
    from dsconvert.transforms import load_transform

    ds = eval(code, {"open_dataset": open_dataset, "T": load_transform("eval")})  # noqa: S307 - our own output
    assert next(iter(ds)) is not None


@pytest.mark.slow
def test_analyze_measures_tars_through_the_readers_training_uses(shardwriter_tars, tmp_path):
    from dsconvert.analyze import analyze

    report = analyze(shardwriter_tars, sample=40, sweep_levels=[1, 2], pass_seconds=1.5,
                     output_dir=str(tmp_path / "outs"))
    assert report["detected"]["kind"] == "webdataset"
    m = report["measurements"]
    assert m["num_samples"] == 60 and m["label"] == "cls" and m["convertible"]
    passes = report["loader"]["passes"]
    assert passes["source"]["warm"] > 0 and passes["tars in place, decode=numpy"]["warm"] > 0
    assert passes["tars in place, decode=numpy"]["same_data"]
    v = report["verdict"]
    printed = v["commands"] + v["alternative"]
    for line in printed:
        assert "label='cls'" in line or "--label cls" in line, line
        _run_printed(line, tmp_path)
    assert report["decode"]["per_codec"]["jpeg"]["pil"]["ms"] > 0  # decoded from the members


def test_verify_source_accounts_for_tar_members(shardwriter_tars, tmp_path):
    from dsconvert.verify import verify

    out = tmp_path / "out"
    convert(shardwriter_tars, str(out), "npy", label="cls", workers=1)
    report = verify(str(out), source=shardwriter_tars)
    assert report["source"]["missing"] == report["source"]["extra"] == report["source"]["changed"] == []
    os.utime(os.path.join(shardwriter_tars, "train-000002.tar"), ns=(1, 1))  # another version of one tar
    changed = verify(str(out), source=shardwriter_tars)["source"]["changed"]
    assert len(changed) == 10 and all(p.startswith("train-000002.tar/") for p in changed)


def test_a_damaged_manifest_is_never_read_as_foreign_tars(image_folder, tmp_path):
    from dsconvert import ManifestError, OptionError

    out = tmp_path / "out"
    convert(image_folder, str(out), "wds", workers=1)
    with pytest.raises(OptionError, match="without a manifest"):
        open_dataset(str(out), label="cls")
    (out / "dsconvert.json").write_text("")
    with pytest.raises(ManifestError):
        open_dataset(str(out))
    assert not (out / INDEX_FOLDER).exists()


def test_subfolders_beside_the_tars_do_not_change_what_they_are(shardwriter_tars, tmp_path):
    os.makedirs(os.path.join(shardwriter_tars, "logs"))
    convert(shardwriter_tars, os.path.join(shardwriter_tars, "..", "out"), "wds", workers=1)  # beside: fine
    os.makedirs(os.path.join(shardwriter_tars, "old-out"))
    open(os.path.join(shardwriter_tars, "old-out", "shard-000000.tar"), "wb").close()
    source = scan(shardwriter_tars)
    assert source.kind == "tar" and len(source.samples) == 60
    assert {i.path for i in source.ignored} == {"logs", "old-out"}
    assert len(open_dataset(shardwriter_tars)) == 60


def test_an_invalid_header_in_the_middle_is_said_not_swallowed(tmp_path, photos):
    folder = tmp_path / "t"
    folder.mkdir()
    jpg = jpeg_crops(photos, 1)[0]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(6):
            _member(tf, f"k{i}.jpg", jpg)
    data = bytearray(buf.getvalue())
    third = 2 * (512 + -(-len(jpg) // 512) * 512)
    data[third + 148] ^= 0x01  # one checksum digit of the third header
    (folder / "a.tar").write_bytes(bytes(data))
    source = scan(str(folder))
    assert [s.key for s in source.samples] == ["k0", "k1"]
    assert [s.reason for s in source.skipped if "invalid tar header" in s.reason]


def test_sparse_and_reserved_and_negative_members_are_skipped(tmp_path, photos):
    folder = tmp_path / "t"
    folder.mkdir()
    files = tmp_path / "files"
    files.mkdir()
    with open(files / "s.bin", "wb") as f:  # mostly a hole: GNU tar --sparse stores a map, not the bytes
        f.seek(1 << 20)
        f.write(b"end")
    (files / "a.jpg").write_bytes(jpeg_crops(photos, 1)[0])
    subprocess.run(["tar", "--sparse", "-cf", str(folder / "sparse.tar"), "-C", str(files), "s.bin", "a.jpg"],
                   check=True)
    with tarfile.open(folder / "odd.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        _member(tf, "b.__key__", b"EVIL")
        _member(tf, "c.jpg", jpeg_crops(photos, 1)[0])
    source = scan(str(folder))
    reasons = {s.path: s.reason for s in source.skipped}
    assert "sparse" in reasons["sparse.tar/s.bin"] and "reserves" in reasons["odd.tar/b.__key__"]
    assert [s.files[0].path for s in source.samples] == ["odd.tar/c.jpg", "sparse.tar/a.jpg"]


def test_an_unsafe_member_ends_the_run_as_webdataset_would(tmp_path, photos):
    folder = tmp_path / "t"
    folder.mkdir()
    with tarfile.open(folder / "a.tar", "w") as tf:
        _member(tf, "a.jpg", jpeg_crops(photos, 1)[0])
        _member(tf, "../a.txt", b"x")
        _member(tf, "a.cls", b"1")
    assert [sorted(f.field for f in s.files) for s in scan(str(folder)).samples] == [["jpg"], ["cls"]]


@pytest.mark.parametrize("value", [-7, 1.5, 10**30, None, True, [1], {"x": 1}, ""])
def test_tampered_label_values_in_an_index_are_not_trusted(shardwriter_tars, value):
    want = [label for _, label in open_dataset(shardwriter_tars, label="cls", decode="raw")]
    path = os.path.join(shardwriter_tars, INDEX_FOLDER, "train-000000.tar.json")
    d = json.load(open(path))
    d["label_values"]["cls"][3] = value
    json.dump(d, open(path, "w"))
    assert [label for _, label in open_dataset(shardwriter_tars, label="cls", decode="raw")] == want


def test_a_label_field_no_tar_has_is_one_line(shardwriter_tars, tmp_path):
    with pytest.raises(SourceError, match="no sample has a 'clz' member.*cls, jpg, json, txt"):
        convert(shardwriter_tars, str(tmp_path / "o"), "npy", label="clz")
    with pytest.raises(SourceError, match="clz"):
        open_dataset(shardwriter_tars, label="clz")


def test_a_shard_changed_after_its_manifest_is_not_converted_again(image_folder, tmp_path):
    out = tmp_path / "wds"
    m = convert(image_folder, str(out), "wds", workers=1, samples_per_shard=8).manifest
    shard = out / m.shards[0].name
    data = bytearray(shard.read_bytes())
    data[2000] ^= 0xFF  # inside the first image, the size kept
    shard.write_bytes(bytes(data))
    again = convert(str(out), str(tmp_path / "again"), "wds", workers=1).manifest
    assert again.num_samples == m.num_samples - m.shards[0].num_samples
    assert all("differs from its manifest" in s["reason"] for s in again.skipped) and len(again.skipped) == 8


# --- issue 33: an index is checked at every read after open, and bounded before it is read ------

def _resealed(d):
    """An index rewritten whole, its own digest made to match: only the digest taken at open tells."""
    from dsconvert.io.location import json_bytes
    from dsconvert.source.tars import _digest

    d.pop("index_sha256", None)
    return json_bytes({**d, "index_sha256": _digest(d)})


def _tamper(path, how):
    d = json.loads(open(path, "rb").read())
    if how == "labels-swapped":
        d["label_values"] = {k: v[1:] + v[:1] for k, v in d["label_values"].items()}
        d["keys"] = d["keys"][1:] + d["keys"][:1]
        data = _resealed(d)
    elif how == "offsets-moved":  # the image column points at the caption members, or at header bytes
        d["members"]["jpg"]["offset"] = [o - 512 for o in d["members"]["jpg"]["offset"]]
        data = _resealed(d)
    elif how == "empty-object":
        data = b"{}"
    elif how == "garbage":
        data = b"\x00\xffnot json"
    elif how == "other-index":
        data = open(path.replace("000001", "000000"), "rb").read()
    else:
        os.remove(path)
        if how == "folder":
            os.mkdir(path)
        elif how == "dev-zero":
            os.symlink("/dev/zero", path)
        elif how == "fifo":
            os.mkfifo(path)
        elif how == "sparse":
            with open(path, "wb") as f:
                f.truncate(3 << 30)
        return
    with open(path, "wb") as f:
        f.write(data)


TAMPERING = ["labels-swapped", "offsets-moved", "empty-object", "garbage", "other-index", "deleted", "folder",
             "dev-zero", "fifo", "sparse"]


@pytest.mark.parametrize("label", [None, "cls"])
@pytest.mark.parametrize("how", TAMPERING)
def test_an_index_changed_after_open_is_never_trusted(shardwriter_tars, how, label):
    """Every later read of a saved index checks the digest taken when the tars were opened:
    a change of any kind is one ManifestError naming the index, never other samples."""
    from dsconvert import ManifestError

    ds = open_dataset(shardwriter_tars, label=label, decode="raw")
    path = os.path.join(shardwriter_tars, INDEX_FOLDER, "train-000001.tar.json")
    _tamper(path, how)
    with pytest.raises(ManifestError) as err:
        list(ds)
    message = str(err.value)
    assert "\n" not in message and "train-000001.tar.json" in message and "open the dataset again" in message
    # opened again, the tars are read as they are (indexed again where the index is not trusted)
    again = open_dataset(shardwriter_tars, label=label, decode="raw")
    if how == "offsets-moved":  # resealed: trusted at open, but no member's own tar header is where it points
        with pytest.raises(ManifestError, match="train-000001.tar: sample .*its tar header declares") as err:
            list(again)
        assert "\n" not in str(err.value)
    else:
        assert len(list(again)) == 60


@pytest.mark.parametrize("how", ["folder", "sparse", "dev-zero", "fifo"])
def test_an_index_path_that_is_not_a_small_regular_file_never_blocks_reading(shardwriter_tars, how):
    """Before open: a folder, a sparse file of gigabytes, a device or a FIFO where an index goes
    is not read (its size is checked first) and does not stop the tars from being read."""
    import tracemalloc

    open_dataset(shardwriter_tars)
    path = os.path.join(shardwriter_tars, INDEX_FOLDER, "train-000001.tar.json")
    _tamper(path, how)
    tracemalloc.start()
    try:
        got = [dict(s) for s in open_dataset(shardwriter_tars, decode="raw")]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == webdataset_samples(shardwriter_tars)
    assert peak < 64 << 20  # the 3 GiB file was not read
    assert len(open_dataset(shardwriter_tars, label="cls")) == 60  # and again, still there


def test_a_broken_symlink_among_the_tars_is_a_counted_skip(shardwriter_tars):
    os.symlink(os.path.join(shardwriter_tars, "gone.tar"), os.path.join(shardwriter_tars, "train-000003.tar"))
    os.mkfifo(os.path.join(shardwriter_tars, "train-000004.tar"))
    with pytest.warns(UserWarning, match="2 sample.s. or member.s. not read.*train-000003.tar: a broken symlink"):
        ds = open_dataset(shardwriter_tars, decode="raw")
    assert len(ds) == 60
    reasons = {s["path"]: s["reason"] for s in ds.manifest.skipped}
    assert reasons["train-000003.tar"].startswith("a broken symlink")
    assert reasons["train-000004.tar"] == "not a regular file"
    source = scan(shardwriter_tars)  # as a conversion source too
    assert {s.path for s in source.skipped} >= {"train-000003.tar", "train-000004.tar"}


def test_scan_progress_counts_every_member_of_every_tar(shardwriter_tars):
    """A scan of tars reports its members as it indexes each tar (a bar that said "0 files" for
    minutes while 100 tars were walked), the same count when the indexes are loaded again."""
    for _ in range(2):  # built, then loaded from the saved indexes
        seen = []
        scan(shardwriter_tars, label="cls", progress=seen.append)
        assert len(seen) == 3  # one call a tar
        assert sum(seen) == 60 * 4  # jpg, json, txt, cls of each sample
