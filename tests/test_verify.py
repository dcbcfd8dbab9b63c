"""dsconvert verify: damaged, tampered and hostile outputs are found; clean ones pass."""

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pytest

from dsconvert import convert, open_dataset
from dsconvert.cli import main
from dsconvert.verify import EXIT_PROBLEMS, verify

from conftest import encode, make_image_folder, rehash_parts, write
from support.records import read_record, record_path, write_record
from test_convert import _png_bomb


@pytest.fixture
def src(tmp_path, photos):
    root = str(tmp_path / "src")
    make_image_folder(root, photos, {"a": 6, "b": 6}, size=(48, 36))
    return root


def kinds(report):
    return sorted({p["kind"] for p in report["problems"]})


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "npy"])
def test_clean_outputs_pass(tmp_path, src, fmt, capsys):
    out = str(tmp_path / fmt)
    convert(src, out, fmt, samples_per_shard=5, workers=1)
    report = verify(out, decode=True, source=src, workers=2)
    assert report["ok"] and report["problems"] == [], report["problems"]
    assert report["decode"]["samples"] == 12 and report["source"]["files"] == 12
    assert main(["verify", out, "--decode", "-q"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK")


def _rewrite_sums(out, shard_name):
    """Make the record and manifest agree with a shard that was changed on purpose: a
    consistent but hostile output, as a downloaded one could be."""
    path = os.path.join(out, shard_name)
    data = open(path, "rb").read()
    digest = hashlib.sha256(data).hexdigest()
    index = record_path(out, shard_name)
    rec = read_record(index)
    rec.update(bytes=len(data), sha256=digest)
    write_record(index, rec)
    record = open(index, "rb").read()
    man = json.load(open(os.path.join(out, "dsconvert.json")))
    for s in man["shards"]:
        if s["name"] == shard_name:
            s.update(bytes=len(data), sha256=digest)
            s["parts"][os.path.basename(index)] = {"bytes": len(record), "sha256": hashlib.sha256(record).hexdigest()}
    json.dump(man, open(os.path.join(out, "dsconvert.json"), "w"))


def test_damage_is_found(tmp_path, src, capsys):
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=4, workers=1)
    shards = sorted(n for n in os.listdir(out) if n.endswith(".tar"))
    with open(os.path.join(out, shards[0]), "r+b") as f:  # one flipped byte
        f.seek(3000)
        byte = f.read(1)
        f.seek(3000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with open(os.path.join(out, shards[1]), "r+b") as f:  # truncated
        f.truncate(5000)
    os.unlink(record_path(out, shards[2]))
    write(os.path.join(out, "shard-000099.tar"), b"left over")
    report = verify(out)
    by_shard = {}
    for p in report["problems"]:
        by_shard.setdefault(p["path"], set()).add(p["kind"])
    assert by_shard[shards[0]] == {"checksum"}
    assert by_shard[shards[1]] == {"size", "checksum"}
    assert by_shard[shards[2]] == {"record"}
    assert by_shard["shard-000099.tar"] == {"extra-file"}
    assert not report["ok"] and report["errors"] == 4 and report["warnings"] == 1
    os.unlink(os.path.join(out, shards[0]))
    assert main(["verify", out, "-q"]) == EXIT_PROBLEMS
    text = capsys.readouterr().out
    assert "missing-file: shard-000000.tar" in text and text.rstrip().endswith("FAILED: 4 problem(s)")


def test_hostile_tar_members_are_reported_and_never_extracted(tmp_path, src, monkeypatch):
    out = str(tmp_path / "out")
    absolute = str(tmp_path / "elsewhere" / "absolute.txt")  # a member extracted to an absolute path would land here
    convert(src, out, samples_per_shard=100, workers=1)
    shard = os.path.join(out, "shard-000000.tar")
    with tarfile.open(shard) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf]
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:  # same members at the same offsets, then
        for m, data in members:
            tf.addfile(m, io.BytesIO(data))

        def add(name, kind=tarfile.REGTYPE, data=b"x", **kw):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            for k, v in kw.items():
                setattr(info, k, v)
            tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("../evil.txt")
        add(absolute)
        add("link.jpg", tarfile.SYMTYPE, linkname="/etc/passwd")
        add("dev.jpg", tarfile.CHRTYPE, devmajor=1, devminor=3)
        add("sneaky.jpg", data=b"not in the index")
    _rewrite_sums(out, "shard-000000.tar")
    report = verify(out, decode=True)
    msgs = [p["message"] for p in report["problems"]]
    assert kinds(report) == ["structure", "unsafe-member"]
    assert any("'../evil.txt' has an unsafe path" in m for m in msgs)
    assert any(f"'{absolute}' has an unsafe path" in m for m in msgs)
    assert any("'link.jpg' is a symlink to '/etc/passwd'" in m for m in msgs)
    assert any("'dev.jpg' is a device" in m for m in msgs)
    assert any("'sneaky.jpg' is not in the index" in m for m in msgs)
    # the reader serves exactly the indexed samples and writes nothing anywhere
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path)) + sorted(os.listdir(out))
    assert len(list(open_dataset(out))) == 12
    assert sorted(os.listdir(tmp_path)) + sorted(os.listdir(out)) == before
    assert not os.path.exists(absolute)


def test_index_pointing_outside_or_huge_sizes(tmp_path, src):
    from dsconvert import ManifestError

    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=100, workers=1)
    index = record_path(out, "shard-000000.tar")
    rec = read_record(index)
    rec["members"]["jpg"]["size"][3] = 10**12
    write_record(index, rec)
    report = verify(out)
    assert kinds(report) == ["checksum"]  # the manifest's digest of the index
    rehash_parts(out)
    report = verify(out)
    assert kinds(report) == ["structure"]
    assert "the index says" in report["problems"][0]["message"]
    with pytest.raises(ManifestError, match="index points outside the shard"):
        list(open_dataset(out))
    rec["members"]["jpg"]["size"] = rec["members"]["jpg"]["size"][:-1]  # a column one value short
    write_record(index, rec)
    rehash_parts(out)
    report = verify(out)
    assert kinds(report) == ["record"] and "field 'members.jpg.size'" in report["problems"][0]["message"]
    rec["members"]["jpg"]["size"] = "everything"  # not a column at all: where a binary record can put it, its header
    write_record(index, rec)
    rehash_parts(out)
    report = verify(out)
    assert kinds(report) == ["record"] and "field 'members' is in its header" in report["problems"][0]["message"]


def test_npy_and_hdf5_structure(tmp_path, src):
    import h5py

    npy = str(tmp_path / "npy")
    convert(src, npy, "npy", workers=1)
    rows_path = os.path.join(npy, "shard-000000.samples.npy")
    rows = np.load(rows_path)
    rows["offset"][5] = 10**9
    np.save(rows_path, rows)
    report = verify(npy)
    assert kinds(report) == ["checksum", "structure"]
    assert any("point outside the pixels" in p["message"] and "sample 5" in p["message"] for p in report["problems"])

    h5 = str(tmp_path / "h5")
    convert(src, h5, "hdf5", workers=1)
    with h5py.File(os.path.join(h5, "shard-000000.h5"), "a") as f:
        del f["labels"]
    report = verify(h5)
    assert "checksum" in kinds(report) and "structure" in kinds(report)
    assert any("/labels is missing" in p["message"] for p in report["problems"])


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_decode_finds_images_written_without_verification(tmp_path, src, image_kinds, fmt):
    good = image_kinds["baseline"][1]
    write(os.path.join(src, "a", "truncated.jpg"), good[: len(good) // 2])
    write(os.path.join(src, "b", "bomb.png"), _png_bomb())
    out = str(tmp_path / "out")
    m = convert(src, out, fmt, verify=False, workers=1).manifest
    assert m.num_samples == 14  # --no-verify let both in
    assert verify(out)["ok"]  # the files are exactly what the manifest says...
    report = verify(out, decode=True, workers=2)  # ...but two samples do not decode
    fails = {p["path"]: p["message"] for p in report["problems"]}
    assert kinds(report) == ["decode"] and len(fails) == 2
    assert "corrupt or truncated" in fails["a/truncated"] and "decompression bomb" in fails["b/bomb"]
    assert report["decode"] == {**report["decode"], "samples": 14, "failed": 2}


def test_source_missing_extra_changed(tmp_path, src, photos, capsys):
    out = str(tmp_path / "out")
    convert(src, out, workers=1)
    os.unlink(os.path.join(src, "a", "a_0001.jpg"))
    write(os.path.join(src, "b", "new.jpg"), encode(photos["rocket"].resize((30, 20))))
    write(os.path.join(src, "b", "b_0002.jpg"), encode(photos["coffee"].resize((31, 20))))
    report = verify(out, source=src)
    s = report["source"]
    assert (s["missing"], s["extra"], s["changed"]) == (["a/a_0001.jpg"], ["b/new.jpg"], ["b/b_0002.jpg"])
    assert kinds(report) == ["source-changed", "source-extra", "source-missing"]
    assert main(["verify", out, "--source", src, "-q"]) == EXIT_PROBLEMS
    assert "1 missing, 1 extra, 1 changed" in capsys.readouterr().out


def test_unreadable_manifest_is_an_error(tmp_path, capsys):
    (tmp_path / "dsconvert.json").write_text('{"schema_version": 1, "format": 7}')
    assert main(["verify", str(tmp_path)]) == 1
    assert "field 'format' must be a string" in capsys.readouterr().err


def test_member_header_declaring_a_huge_size(tmp_path, src):
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=100, workers=1)
    shard = os.path.join(out, "shard-000000.tar")
    data = open(shard, "rb").read()
    with tarfile.open(shard) as tf:
        last = list(tf)[-1]
    end = last.offset_data + -(-last.size // 512) * 512  # drop the end-of-archive blocks
    huge = tarfile.TarInfo("huge.jpg")
    huge.size = 10**12  # a terabyte declared, none present
    open(shard, "wb").write(data[:end] + huge.tobuf(format=tarfile.PAX_FORMAT) + b"\0" * 1024)
    _rewrite_sums(out, "shard-000000.tar")
    messages = [p["message"] for p in verify(out)["problems"]]
    assert "member 'huge.jpg' is not in the index" in messages
    assert any(m.startswith("not a readable tar") for m in messages)
    assert len(list(open_dataset(out, decode="raw"))) == 12  # the reader slices indexed members only
