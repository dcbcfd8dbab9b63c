"""Parquet files as a conversion source (dsconvert.source.parquet), written by the real Hugging
Face ``datasets`` library (and by pyarrow), converted for real."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tracemalloc
from typing import Any, Dict, List, Optional

import numpy as np
import pytest
from PIL import Image as PILImage

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets")

import dsconvert  # noqa: E402
from dsconvert.errors import SourceError  # noqa: E402
from dsconvert.inputs import checked  # noqa: E402
from dsconvert.inputs.parquet import read_parquet_samples  # noqa: E402
from dsconvert.plan import ShardSpec  # noqa: E402
from dsconvert.source.parquet import looks_like_parquet, parquet_source  # noqa: E402

NAMES = ["cat", "dog", "eel"]


def jpeg(seed: int, size: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png(seed: int, size: int = 12) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def hf_parquet(path: str, images: List[Optional[bytes]], labels: Optional[List[int]] = None,
               extra: Optional[Dict[str, Any]] = None, batch_size: Optional[int] = None) -> str:
    """A Parquet file as datasets' ``to_parquet`` writes it: an Image feature with embedded bytes,
    a ClassLabel (when ``labels``), other columns; row groups of ``batch_size`` rows."""
    from datasets import ClassLabel, Dataset, Features, Image

    data: Dict[str, Any] = {"image": [None if b is None else {"bytes": b, "path": None} for b in images]}
    features: Dict[str, Any] = {"image": Image()}
    if labels is not None:
        data["label"] = labels
        features["label"] = ClassLabel(names=NAMES)
    for name, values in (extra or {}).items():
        data[name] = values
    if extra:
        features.update(Dataset.from_dict(extra).features)  # as datasets infers them
    ds = Dataset.from_dict(data, features=Features(features))
    ds.to_parquet(path, **({"batch_size": batch_size} if batch_size else {}))
    return path


def parquet_images(path: str, column: str = "image") -> List[Optional[bytes]]:
    col = pq.read_table(path, columns=[column]).column(column).to_pylist()
    return [None if v is None else v["bytes"] if isinstance(v, dict) else v for v in col]


def tar_members(out: str) -> Dict[str, bytes]:
    got: Dict[str, bytes] = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(out, name)) as tf:
                for m in tf.getmembers():
                    got[m.name] = tf.extractfile(m).read()
    return got


def manifest(out: str) -> Dict[str, Any]:
    with open(os.path.join(out, "dsconvert.json")) as f:
        return json.load(f)


def spec_of(source, samples=None) -> ShardSpec:
    return ShardSpec("wds", 0, "shard-000000.tar", source.root, "/nonexistent", source.sample_type,
                     tuple(source.samples if samples is None else samples), source_kind="parquet")


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> str:
    """7 JPEG rows with ClassLabel labels, in row groups of 3."""
    d = tmp_path_factory.mktemp("labelled")
    return hf_parquet(str(d / "train.parquet"), [jpeg(i) for i in range(7)], [i % 3 for i in range(7)],
                      batch_size=3)


# --- detection ------------------------------------------------------------------------------


def test_looks_like_parquet(tmp_path, labelled):
    assert looks_like_parquet(labelled)
    assert looks_like_parquet(os.path.dirname(labelled))
    folder = tmp_path / "f"
    folder.mkdir()
    assert not looks_like_parquet(str(folder))  # empty
    (folder / "a.parquet").write_bytes(b"x")
    (folder / ".hidden").write_bytes(b"x")
    assert looks_like_parquet(str(folder))
    (folder / "a.jpg").write_bytes(jpeg(0))
    assert not looks_like_parquet(str(folder))  # an image: a folder source
    (folder / "a.jpg").unlink()
    (folder / "sub").mkdir()
    assert not looks_like_parquet(str(folder))
    assert not looks_like_parquet(str(tmp_path / "missing"))
    assert not looks_like_parquet("nosuchproto://bucket/x")
    assert not looks_like_parquet(str(tmp_path / "f" / ".hidden"))


def _not_regular(path: str, kind: str) -> None:
    if kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "broken-link":
        os.symlink(path + ".gone", path)
    else:
        os.symlink("/dev/null", path)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "broken-link", "dev-null"])
def test_a_non_regular_file_named_parquet_changes_nothing(tmp_path, labelled, kind):
    """A device, FIFO or broken link named ``b.parquet`` beside ``a.parquet`` is left out with
    its reason: the folder is still Parquet, converts, and nothing blocks; alone it is no source."""
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.parquet").write_bytes(open(labelled, "rb").read())
    _not_regular(str(folder / "b.parquet"), kind)
    assert looks_like_parquet(str(folder))
    source = dsconvert.source.scan(str(folder))
    assert source.kind == "parquet" and len(source.samples) == 7
    assert [(s.path, s.reason.startswith("not a regular file")) for s in source.ignored] == [("b.parquet", True)]
    m = dsconvert.convert(str(folder), str(tmp_path / "out"), workers=1).manifest
    assert m.num_samples == 7 and m.accounting["files_ignored"] == 1
    alone = tmp_path / "alone"
    alone.mkdir()
    _not_regular(str(alone / "b.parquet"), kind)
    assert not looks_like_parquet(str(alone))


# --- scanning -------------------------------------------------------------------------------


def spy_on_batches(monkeypatch) -> List[Dict[str, Any]]:
    """The keyword arguments of every ParquetFile.iter_batches call from now on."""
    calls: List[Dict[str, Any]] = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    return calls


def test_classlabel_scan_reads_labels_not_images(labelled, monkeypatch):
    calls = spy_on_batches(monkeypatch)
    source = parquet_source(labelled, None)
    assert source.kind == "parquet" and source.layout == "parquet"
    assert source.labelled and source.sample_type == "classification"
    assert source.classes == NAMES and source.options == {}
    assert [s.label for s in source.samples] == [i % 3 for i in range(7)]
    assert [s.key for s in source.samples] == [f"train/{i:09d}" for i in range(7)]
    f = source.samples[5].files
    assert len(f) == 1 and f[0].field == "jpg" and f[0].container == "train.parquet" and f[0].offset == 5
    assert f[0].path == "train.parquet/row 5" and f[0].size > 0
    assert f[0].mtime_ns == os.stat(labelled).st_mtime_ns
    assert source.root == os.path.dirname(labelled)
    # images are read once, to name the field: the first row group only; every other read is the label
    image_reads = [c for c in calls if "image" in c.get("columns", [])]
    assert len(image_reads) == 1 and image_reads[0]["row_groups"] == [0]
    assert all(c["columns"] == ["label"] for c in calls if c not in image_reads)


def test_explicit_label_columns(tmp_path):
    imgs = [jpeg(i) for i in range(5)]
    path = hf_parquet(str(tmp_path / "d.parquet"), imgs, extra={
        "species": ["eel", "ant", "eel", None, ""], "idx": [4, 3, -1, 1, 0], "score": [0.5] * 5})
    by_name = parquet_source(path, "species")
    assert by_name.classes == ["ant", "eel"] and by_name.options == {"label": "species"}
    assert [s.label for s in by_name.samples] == [1, 0, 1]
    assert {s.path: s.reason for s in by_name.skipped} == {"d.parquet/row 3": "no label (null)",
                                                           "d.parquet/row 4": "empty class name"}
    by_int = parquet_source(path, "idx")
    assert by_int.classes == ["0", "1", "2", "3", "4"] and [s.label for s in by_int.samples] == [4, 3, 1, 0]
    assert [s.path for s in by_int.skipped] == ["d.parquet/row 2"]
    with pytest.raises(SourceError, match="no column 'nope'"):
        parquet_source(path, "nope")
    with pytest.raises(SourceError, match="must be integers or class names"):
        parquet_source(path, "score")
    with pytest.raises(SourceError, match="names the image column"):
        parquet_source(path, "image")


def test_files_that_disagree_with_the_first_are_skipped(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    hf_parquet(str(folder / "a.parquet"), [jpeg(0), jpeg(1)], [0, 2])
    pq.write_table(pa.table({"image": pa.array([jpeg(2)], pa.binary()), "label": ["dog"]}), str(folder / "b.parquet"))
    pq.write_table(pa.table({"picture": pa.array([jpeg(3)], pa.binary())}), str(folder / "c.parquet"))
    source = parquet_source(str(folder), None)
    assert [s.key for s in source.samples] == ["a/000000000", "a/000000001"] and source.classes == NAMES
    reasons = {s.path: s.reason for s in source.skipped}
    assert reasons == {"b.parquet": "the label column 'label' holds other labels (type or class names) than in the "
                                    "first file",
                       "c.parquet": "no column 'image' (the first file has it)"}


def test_no_image_column_is_one_line_error(tmp_path):
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"text": ["a", "b"], "n": [1, 2]}), path)
    with pytest.raises(SourceError, match="no image column") as info:
        parquet_source(path, None)
    assert "\n" not in str(info.value)


def test_plain_binary_column_and_png_field(tmp_path):
    """A pyarrow-written file without Hugging Face metadata: a top-level binary column; the
    field name comes from the first image's bytes."""
    path = str(tmp_path / "raw.parquet")
    imgs = [png(i) for i in range(4)]
    pq.write_table(pa.table({"id": [10, 11, 12, 13], "img": pa.array(imgs, pa.binary())}), path)
    source = parquet_source(path, None)
    assert not source.labelled and source.classes is None
    assert [f.field for f in source.samples[0].files] == ["png", "json"]
    got = list(read_parquet_samples(spec_of(source), checked))
    assert [fields["png"] for _, fields in got] == imgs
    assert [json.loads(fields["json"]) for _, fields in got] == [{"id": i} for i in range(10, 14)]


def test_read_direct_is_byte_exact(labelled):
    source = parquet_source(labelled, None)
    middle = source.samples[2:6]  # rows 2..5: across row groups 0, 1
    got = list(read_parquet_samples(spec_of(source, middle), checked))
    assert [s for s, _ in got] == middle
    assert [fields["jpg"] for _, fields in got] == parquet_images(labelled)[2:6]


def test_a_row_gone_since_the_scan_comes_last_and_keeps_its_position(labelled, tmp_path):
    """A packed spec (what a conversion sends) with a row the file does not have, in the middle:
    the reader hands it last, skipped; every written sample keeps its own source position (found
    by key: readers hand made-again samples, not the spec's objects)."""
    from dataclasses import replace

    from dsconvert.convert import write_shard
    from dsconvert.formats.base import ShardRecord
    from dsconvert.packed_samples import PackedSamples, pack_samples

    source = parquet_source(labelled, None)
    samples = list(source.samples)
    gone = replace(samples[3], key="gone", files=(replace(samples[3].files[0], offset=99),))
    samples.insert(3, gone)
    packed = pack_samples(samples)
    assert isinstance(packed, PackedSamples)
    spec = replace(spec_of(source, packed), out_dir=str(tmp_path), sample_type="classification",
                   positions=np.arange(100, 100 + len(samples), dtype=np.int64))
    got = list(read_parquet_samples(spec, checked))
    assert [s.key for s, _ in got] == [s.key for s in samples if s is not gone] + ["gone"]
    result = write_shard(spec)
    assert [s.reason.split(" (")[0] for s in result.skipped] == ["changed during the conversion"]
    record = ShardRecord.load(str(tmp_path / "shard-000000.idx"), "wds")
    kept = [(s.key, 100 + i) for i, s in enumerate(samples) if s is not gone]
    assert list(zip(record.keys, record.d["positions"])) == kept


def test_read_in_place_by_index(labelled, tmp_path):
    """open_source reads rows where they are, in any order, as the conversion does."""
    ds = dsconvert.open_source(labelled, decode="raw")
    src = parquet_images(labelled)
    order = [6, 0, 3, 2, 5, 1, 4]
    assert [ds[i] for i in order] == [(src[i], i % 3) for i in order]
    assert ds.classes == NAMES
    plain = hf_parquet(str(tmp_path / "plain.parquet"), [jpeg(i) for i in range(3)],
                       extra={"caption": ["a", "b", "c"]})
    rows = dsconvert.open_source(plain, decode="raw")
    assert json.loads(rows[2]["json"]) == {"caption": "c"} and rows[2]["jpg"] == parquet_images(plain)[2]


# --- conversions ----------------------------------------------------------------------------


def test_convert_wds_bytes_identical_and_npy_decodes(tmp_path, labelled):
    out = str(tmp_path / "wds")
    result = dsconvert.convert(labelled, out, format="wds", workers=1)
    m = manifest(out)
    assert m["classes"] == NAMES and m["sample_type"] == "classification"
    assert m["accounting"] == {"files_seen": 7, "files_written": 7, "files_skipped": 0, "files_ignored": 0}
    assert result.manifest.num_samples == 7
    members = tar_members(out)
    src = parquet_images(labelled)
    for i in range(7):
        assert members[f"train/{i:09d}.jpg"] == src[i]
        assert int(members[f"train/{i:09d}.cls"]) == i % 3

    npy = str(tmp_path / "npy")
    dsconvert.convert(labelled, npy, format="npy", workers=1)
    got = list(dsconvert.open_dataset(npy, decode="numpy"))
    assert len(got) == 7
    for i, (pixels, label) in enumerate(got):
        assert int(label) == i % 3
        np.testing.assert_array_equal(np.asarray(pixels),
                                      np.asarray(PILImage.open(io.BytesIO(src[i])).convert("RGB")))


def test_folder_of_files_and_row_groups_keeps_order(tmp_path):
    folder = tmp_path / "multi"
    folder.mkdir()
    names = ["train-00000-of-00003.parquet", "train-00001-of-00003.parquet", "train-00002-of-00003.parquet"]
    expected = []
    for f, name in enumerate(names):
        imgs = [jpeg(100 * f + i) for i in range(5 + f)]
        path = str(folder / name)
        pq.write_table(pa.table({"image": pa.array([{"bytes": b, "path": None} for b in imgs]),
                                 "kind": ["b" if i % 2 else "a" for i in range(len(imgs))]}),
                       path, row_group_size=2)
        assert pq.ParquetFile(path).metadata.num_row_groups > 1
        expected += [(name[:-8], i, b, 1 if i % 2 else 0) for i, b in enumerate(imgs)]
    (folder / "README.txt").write_text("notes")
    source = parquet_source(str(folder), "kind")
    assert [s.path for s in source.ignored] == ["README.txt"]
    assert [s.key for s in source.samples] == [f"{stem}/{i:09d}" for stem, i, _, _ in expected]

    assert not looks_like_parquet(str(folder))  # README.txt: layout="parquet" says what it is
    out = str(tmp_path / "out")
    dsconvert.convert(str(folder), out, format="wds", layout="parquet", label="kind", workers=1, min_shards=1)
    m = manifest(out)
    assert m["accounting"] == {"files_seen": 18, "files_written": 18, "files_skipped": 0, "files_ignored": 1}
    assert m["classes"] == ["a", "b"]
    assert m["num_samples"] == len(expected)
    members = tar_members(out)  # shards in name order, members in tar order
    assert [n[:-4] for n in members if n.endswith(".jpg")] == [f"{stem}/{i:09d}" for stem, i, _, _ in expected]
    for stem, i, data, label in expected:
        assert members[f"{stem}/{i:09d}.jpg"] == data
        assert int(members[f"{stem}/{i:09d}.cls"]) == label


def test_dict_output_json_holds_other_columns(tmp_path):
    imgs = [jpeg(i) for i in range(3)]
    extra = {"caption": ["a cat", "ünïcode", None], "score": [0.5, float("nan"), 2.0],
             "tags": [["x"], [], ["y", "z"]], "meta": [{"w": 1}, {"w": 2}, {"w": 3}], "ok": [True, False, True]}
    path = hf_parquet(str(tmp_path / "d.parquet"), imgs, extra=extra)
    out = str(tmp_path / "out")
    dsconvert.convert(path, out, format="wds", workers=1)
    m = manifest(out)
    assert m["sample_type"] == "dict" and m["classes"] is None
    members = tar_members(out)
    for i in range(3):
        assert members[f"d/{i:09d}.jpg"] == imgs[i]
        row = json.loads(members[f"d/{i:09d}.json"])
        want = {k: v[i] for k, v in extra.items()}
        if i == 1:
            want["score"] = None  # NaN is not JSON
        assert row == want


def test_bad_rows_skipped_with_reasons(tmp_path):
    good = [jpeg(i) for i in range(6)]
    images: List[Optional[bytes]] = list(good)
    images[1] = None  # a null image
    images[3] = good[3][: len(good[3]) // 2]  # a truncated JPEG
    path = hf_parquet(str(tmp_path / "bad.parquet"), images, [0, 1, 2, 0, 1, 2])
    # a Hugging Face image that names an external file only (datasets' to_parquet of file paths)
    from datasets import ClassLabel, Dataset, Features, Image

    img_file = tmp_path / "outside.jpg"
    img_file.write_bytes(good[0])
    folder = tmp_path / "src"
    folder.mkdir()
    os.replace(path, folder / "bad.parquet")
    Dataset.from_dict({"image": [str(img_file)], "label": [1]},
                      features=Features({"image": Image(), "label": ClassLabel(names=NAMES)})
                      ).to_parquet(str(folder / "linked.parquet"))
    out = str(tmp_path / "out")
    dsconvert.convert(str(folder), out, format="wds", workers=1, min_shards=1)
    m = manifest(out)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert set(reasons) == {"bad.parquet/row 1", "bad.parquet/row 3"}
    assert reasons["bad.parquet/row 1"] == "no image (null)"
    assert reasons["bad.parquet/row 3"].startswith("corrupt or truncated image")
    assert m["accounting"] == {"files_seen": 7, "files_written": 5, "files_skipped": 2, "files_ignored": 0}
    members = tar_members(out)
    assert sorted(n for n in members if n.endswith(".jpg")) == [f"bad/{i:09d}.jpg" for i in (0, 2, 4, 5)] + \
        ["linked/000000000.jpg"]
    assert members["linked/000000000.jpg"] == good[0]  # the file its path names, read as datasets reads it


def test_corrupt_parquet_files_are_counted_skips(tmp_path, labelled):
    folder = tmp_path / "src"
    folder.mkdir()
    with open(labelled, "rb") as f:
        data = f.read()
    (folder / "a-good.parquet").write_bytes(data)
    (folder / "b-truncated.parquet").write_bytes(data[: len(data) // 2])
    (folder / "c-garbage.parquet").write_bytes(os.urandom(2000))
    (folder / "d-empty.parquet").write_bytes(b"")
    out = str(tmp_path / "out")
    dsconvert.convert(str(folder), out, format="wds", workers=1, min_shards=1)
    m = manifest(out)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert set(reasons) == {"b-truncated.parquet", "c-garbage.parquet", "d-empty.parquet"}
    assert all(r.startswith("not a readable Parquet file: ") and "\n" not in r for r in reasons.values())
    assert m["accounting"] == {"files_seen": 10, "files_written": 7, "files_skipped": 3, "files_ignored": 0}
    # nothing readable at all: a SourceError or counted skips, never a traceback of pyarrow's
    only = tmp_path / "only"
    only.mkdir()
    (only / "x.parquet").write_bytes(b"PAR1" + os.urandom(100))
    try:
        dsconvert.convert(str(only), str(tmp_path / "out2"), format="wds", workers=1)
    except SourceError as exc:
        assert "\n" not in str(exc)
    else:
        assert manifest(str(tmp_path / "out2"))["accounting"]["files_skipped"] == 1


def test_file_changed_after_scan(tmp_path, labelled):
    path = str(tmp_path / "c.parquet")
    with open(labelled, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data)
    source = parquet_source(path, None)
    os.utime(path, ns=(1, 1))
    got = list(read_parquet_samples(spec_of(source), checked))
    assert len(got) == 7 and all("changed during the conversion" in r.reason for _, r in got)
    with open(path, "wb") as f:
        f.write(b"garbage")
    got = list(read_parquet_samples(spec_of(source), checked))
    assert len(got) == 7 and all(r.reason.startswith("unreadable Parquet file") for _, r in got)


def test_memory_flat_reads_record_batches(tmp_path, monkeypatch):
    rows, group = 4000, 500  # 16 MB in 8 row groups of 2 MB
    blob = [os.urandom(4000) for _ in range(8)]
    path = str(tmp_path / "big.parquet")
    head = jpeg(0)
    # distinct JPEG-headed blobs (not decodable: the reader is measured, not the checks)
    pq.write_table(pa.table({"image": pa.array([head[:4] + blob[i % 8] + i.to_bytes(4, "big")
                                                for i in range(rows)], pa.binary())}),
                   path, row_group_size=group, compression="none")
    size = os.path.getsize(path)
    source = parquet_source(path, None)
    assert len(source.samples) == rows
    calls = spy_on_batches(monkeypatch)
    whole: List[int] = []
    real_group = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, g, *a, **k: whole.append(g) or real_group(self, g, *a, **k))
    seen = 0

    def count(spec, sample, contents):
        nonlocal seen
        seen += sum(len(d) for d, _ in contents.values())
        return {}

    spec = spec_of(source, source.samples[600:3900])  # its samples decoded from the scan's table before measuring
    tracemalloc.start()
    n = sum(1 for _ in read_parquet_samples(spec, count))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == 3300 and seen > 3300 * 4000
    # rows 600..3899: groups 1..7 only; those wholly wanted streamed, the two cut read whole once
    assert [c["row_groups"] for c in calls] == [[g] for g in range(2, 7)] and whole == [1, 7]
    assert all(c["batch_size"] == 256 for c in calls)
    assert peak < size / 3, (peak, size)  # about two row groups' bytes, not the file's
    # the next shard in a cut group finds it kept, instead of reading the group from its start
    del whole[:]
    for a, b in ((0, 600), (600, 1000), (1000, 1400)):
        assert sum(1 for _ in read_parquet_samples(spec_of(source, source.samples[a:b]), count)) == b - a
    assert whole == [1, 2]


def test_workers_give_identical_bytes(tmp_path):
    path = hf_parquet(str(tmp_path / "w.parquet"), [jpeg(i, 8) for i in range(300)],
                      [i % 3 for i in range(300)], batch_size=70)
    outs = []
    for workers in (1, 2):
        out = str(tmp_path / f"out{workers}")
        dsconvert.convert(path, out, format="wds", workers=workers, min_shards=4)
        outs.append(out)
    files = sorted(os.listdir(outs[0]))
    assert files == sorted(os.listdir(outs[1])) and sum(f.endswith(".tar") for f in files) == 4
    for name in files:
        if name.endswith(".tar"):
            with open(os.path.join(outs[0], name), "rb") as a, open(os.path.join(outs[1], name), "rb") as b:
                assert a.read() == b.read()


@pytest.mark.system
def test_s3_folder(s3, tmp_path):
    local = tmp_path / "src"
    local.mkdir()
    imgs = [[jpeg(10 * f + i) for i in range(3)] for f in range(2)]
    for f in range(2):
        hf_parquet(str(local / f"part-{f}.parquet"), imgs[f], [f, 2 - f, 1], batch_size=2)
    url = s3.put_tree(str(local), "pq")
    assert looks_like_parquet(url, s3.options)
    source = parquet_source(url, None, s3.options)
    assert source.root == url and source.classes == NAMES and len(source.samples) == 6
    assert source.samples[0].files[0].mtime_ns > 0
    out = str(tmp_path / "out")
    dsconvert.convert(url, out, format="wds", workers=1, storage_options=s3.options)
    members = tar_members(out)
    for f in range(2):
        for i in range(3):
            assert members[f"part-{f}/{i:09d}.jpg"] == imgs[f][i]
    assert [int(members[f"part-{f}/{i:09d}.cls"]) for f in range(2) for i in range(3)] == [0, 2, 1, 1, 1, 1]


@pytest.mark.slow
def test_analyze_measures_parquet_and_its_commands_run(tmp_path):
    import shlex

    from dsconvert.analyze import analyze
    from dsconvert.cli import main

    src = hf_parquet(str(tmp_path / "train.parquet"), [jpeg(i, 64) for i in range(48)], [i % 3 for i in range(48)],
                     batch_size=16)
    report = analyze(src, sample=32, sweep_levels=[1, 2], pass_seconds=1.5, output_dir=str(tmp_path / "outs"))
    assert report["detected"]["kind"] == "parquet"
    m = report["measurements"]
    assert m["num_samples"] == 48 and m["convertible"] and m["label"] is None  # ClassLabel: no --label needed
    passes = report["loader"]["passes"]
    assert passes["source"]["warm"] > 0 and passes["npy"]["warm"] > 0
    assert report["decode"]["per_codec"]["jpeg"]["pil"]["ms"] > 0
    for line in report["verdict"]["commands"] + report["verdict"]["alternative"]:
        code = line.split("   #")[0].strip()
        assert code.startswith("dsconvert shard ") and "--label" not in code  # ClassLabel is found by itself
        assert main(shlex.split(code)[1:] + ["-q"]) == 0, code


def test_each_row_keeps_its_own_format_and_a_column_of_another_kind_is_refused(tmp_path):
    mixed = hf_parquet(str(tmp_path / "mixed.parquet"), [jpeg(0), png(1), jpeg(2)], [0, 1, 2])
    out = str(tmp_path / "out")
    dsconvert.convert(mixed, out, format="wds", workers=1)
    members = tar_members(out)
    assert sorted(n.rsplit(".", 1)[1] for n in members if not n.endswith(".cls")) == ["jpg", "jpg", "png"]
    assert members["mixed/000000001.png"] == png(1)
    folder = tmp_path / "two"
    folder.mkdir()
    pq.write_table(pa.table({"img": pa.array([jpeg(i) for i in range(3)], pa.binary()), "label": [0, 1, 2]}),
                   str(folder / "a.parquet"))
    pq.write_table(pa.table({"img": ["http://x/1.jpg", "http://x/2.jpg"],
                             "thumb": pa.array([jpeg(5), jpeg(6)], pa.binary()), "label": [0, 1]}),
                   str(folder / "b.parquet"))
    source = parquet_source(str(folder), "label")
    assert len(source.samples) == 3 and [s.path for s in source.skipped] == ["b.parquet"]
    assert "does not hold images" in source.skipped[0].reason
