"""Hugging Face ``datasets`` exports as they are made for real (the real ``datasets`` library
writing local image files through ``to_parquet`` and ``save_to_disk``, and ``Dataset`` objects),
converted for real: byte-exact images, labels and every other column kept or accounted for;
Parquet and Arrow read in place by ``open_dataset``; hostile paths and save_to_disk folders."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from typing import Any, Dict, List

import numpy as np
import pytest
from PIL import Image as PILImage

pa = pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")
from datasets import ClassLabel, Dataset, Features, Image, Value  # noqa: E402

import dsconvert  # noqa: E402
from dsconvert.errors import SourceError  # noqa: E402
from dsconvert.source import scan  # noqa: E402

NAMES = ["cat", "dog", "eel"]
FEATURES = Features({"image": Image(), "label": ClassLabel(names=NAMES), "caption": Value("string")})


def jpeg(seed: int, size: int = 8) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def image_files(folder: str, n: int) -> List[str]:
    """n JPEG files under folder/images, their paths relative to folder."""
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    rel = []
    for i in range(n):
        rel.append(f"images/{i:04d}.jpg")
        with open(os.path.join(folder, rel[-1]), "wb") as f:
            f.write(jpeg(i))
    return rel


def from_paths(paths: List[str], n: int) -> Dataset:
    """A Dataset as users build one from local image files: paths, a ClassLabel, a caption."""
    return Dataset.from_dict({"image": paths, "label": [i % 3 for i in range(n)],
                              "caption": [f"photo number {i}" for i in range(n)]}, features=FEATURES)


def members(out: str) -> Dict[str, bytes]:
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


def assert_all_kept(out: str, folder: str, n: int, stem: str, dicts: bool = False) -> None:
    """Every row converted: its image byte for byte and its label, as (image, label) samples
    with the caption listed as not kept; or, ``dicts``, its caption too, in the json field."""
    got = members(out)
    m = manifest(out)
    assert m["num_samples"] == n and m["skipped"] == []
    assert m["classes"] == (None if dicts else NAMES) and m["sample_type"] == ("dict" if dicts else "classification")
    for i in range(n):
        key = f"{stem}/{i:09d}"
        with open(os.path.join(folder, f"images/{i:04d}.jpg"), "rb") as f:
            assert got[f"{key}.jpg"] == f.read()
        if dicts:
            assert json.loads(got[f"{key}.json"]) == {"label": i % 3, "caption": f"photo number {i}"}
            assert f"{key}.cls" not in got
        else:
            assert got[f"{key}.cls"] == str(i % 3).encode() and f"{key}.json" not in got
    captions = [e for e in m["ignored"] if e["path"].endswith("/column caption")]
    assert captions == [] if dicts else len(captions) == 1 and "--no-label" in captions[0]["reason"]


def test_to_parquet_of_local_image_paths_converts_all_600(tmp_path, monkeypatch):
    folder = str(tmp_path)
    monkeypatch.chdir(folder)  # relative paths, as a user in their project folder writes them
    rel = image_files(folder, 600)
    paths = [p if i % 2 else os.path.abspath(p) for i, p in enumerate(rel)]  # relative and absolute
    from_paths(paths, 600).to_parquet(os.path.join(folder, "train.parquet"))
    stored = pa.parquet.read_table(os.path.join(folder, "train.parquet"), columns=["image"]).column(0).to_pylist()
    assert all(v["bytes"] is None and v["path"] for v in stored)  # datasets stores the paths only
    monkeypatch.chdir("/")  # relative to the Parquet file's folder, not to the working directory
    out = str(tmp_path / "out")
    dsconvert.convert(os.path.join(folder, "train.parquet"), out, workers=1)
    assert_all_kept(out, folder, 600, "train")
    assert [e["path"] for e in manifest(out)["ignored"]] == ["train.parquet/column caption"]
    dsconvert.convert(os.path.join(folder, "train.parquet"), str(tmp_path / "dicts"), workers=1, label=False)
    assert_all_kept(str(tmp_path / "dicts"), folder, 600, "train", dicts=True)
    assert manifest(str(tmp_path / "dicts"))["ignored"] == []


def test_save_to_disk_folder_converts_all_600_as_arrow(tmp_path, monkeypatch):
    folder = str(tmp_path)
    monkeypatch.chdir(folder)
    from_paths(image_files(folder, 600), 600).save_to_disk(str(tmp_path / "saved"))
    out = str(tmp_path / "out")
    dsconvert.convert(str(tmp_path / "saved"), out, workers=1)
    assert_all_kept(out, folder, 600, "data-00000-of-00001")
    m = manifest(out)
    assert m["source"]["layout"] == "arrow"
    assert sorted(e["path"] for e in m["ignored"]) == ["data-00000-of-00001.arrow/column caption",
                                                       "dataset_info.json", "state.json"]
    assert m["accounting"]["files_seen"] == 600
    dsconvert.convert(str(tmp_path / "saved"), str(tmp_path / "dicts"), workers=1, label=False)
    assert_all_kept(str(tmp_path / "dicts"), folder, 600, "data-00000-of-00001", dicts=True)
    assert manifest(str(tmp_path / "dicts"))["accounting"]["files_seen"] == 600 * 2


def test_a_dataset_object_converts(tmp_path, monkeypatch):
    folder = str(tmp_path)
    monkeypatch.chdir(folder)
    ds = from_paths(image_files(folder, 60), 60)  # in memory: saved once beside the output
    out = str(tmp_path / "out")
    result = dsconvert.convert(ds, out, workers=1)
    assert_all_kept(out, folder, 60, "data-00000-of-00001")
    assert re.fullmatch(re.escape(out) + r"\.hf-\w+", result.manifest.source["url"])
    assert dsconvert.convert(ds, out, workers=1).already_complete  # the same Dataset again: nothing to do

    ds.save_to_disk(str(tmp_path / "saved"))
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))  # read where it lies: no copy
    result = dsconvert.convert(loaded, str(tmp_path / "out2"), workers=1)
    assert result.manifest.source["url"] == str(tmp_path / "saved")
    assert_all_kept(str(tmp_path / "out2"), folder, 60, "data-00000-of-00001")

    head = loaded.select(range(10))  # a contiguous select: the same files, sliced, no indices mapping
    assert dsconvert.convert(head, str(tmp_path / "out-head"), workers=1).manifest.num_samples == 10

    picked = loaded.select([5, 2])  # rows through an indices mapping: saved as selected
    result = dsconvert.convert(picked, str(tmp_path / "out3"), workers=1, label=False)
    got = members(str(tmp_path / "out3"))
    assert [json.loads(got[f"data-00000-of-00001/{i:09d}.json"])["caption"] for i in range(2)] == \
        ["photo number 5", "photo number 2"]


def test_open_dataset_reads_parquet_in_place_as_its_conversion(tmp_path, monkeypatch):
    folder = str(tmp_path)
    monkeypatch.chdir(folder)
    rel = image_files(folder, 40)
    Dataset.from_dict({"image": rel, "label": [i % 3 for i in range(40)]},
                      features=Features({"image": Image(), "label": ClassLabel(names=NAMES)})
                      ).to_parquet(str(tmp_path / "train.parquet"))
    out = str(tmp_path / "out")
    dsconvert.convert(str(tmp_path / "train.parquet"), out, workers=1)
    for decode in ("raw", "pil"):
        direct = dsconvert.open_dataset(str(tmp_path / "train.parquet"), decode=decode)
        converted = dsconvert.open_dataset(out, decode=decode)
        assert len(direct) == len(converted) == 40
        for i in range(40):
            a, b = direct[i], converted[i]
            assert a[1] == b[1] == i % 3
            if decode == "raw":
                assert bytes(a[0]) == bytes(b[0]) == open(rel[i], "rb").read()
            else:
                assert np.array_equal(np.asarray(a[0]), np.asarray(b[0]))
    saved = str(tmp_path / "saved")
    datasets.load_dataset("parquet", data_files=str(tmp_path / "train.parquet"), split="train").save_to_disk(saved)
    in_place = dsconvert.open_dataset(saved, decode="raw")
    assert [bytes(in_place[i][0]) for i in range(40)] == [open(p, "rb").read() for p in rel]
    with pytest.raises(dsconvert.OptionError, match="map-style"):
        dsconvert.open_dataset(str(tmp_path / "train.parquet"), stream=True)


def test_with_a_label_named_the_other_columns_are_listed_as_ignored(tmp_path, monkeypatch):
    monkeypatch.chdir(str(tmp_path))
    ds = from_paths(image_files(str(tmp_path), 6), 6)
    ds = ds.add_column("thumb", [b"\x00\x01"] * 6)  # binary: never JSON
    ds.to_parquet(str(tmp_path / "t.parquet"))
    out = str(tmp_path / "out")
    dsconvert.convert(str(tmp_path / "t.parquet"), out, workers=1, label="label")
    m = manifest(out)
    assert m["sample_type"] == "classification" and m["num_samples"] == 6
    reasons = {e["path"]: e["reason"] for e in m["ignored"]}
    assert set(reasons) == {"t.parquet/column caption", "t.parquet/column thumb"}
    assert reasons["t.parquet/column caption"].startswith("not kept: label='label' makes (image, label) samples")
    assert "binary data" in reasons["t.parquet/column thumb"]
    # label=False: dict samples keep the caption (json) and list the binary column
    dsconvert.convert(str(tmp_path / "t.parquet"), str(tmp_path / "out2"), workers=1, label=False)
    m = manifest(str(tmp_path / "out2"))
    assert m["sample_type"] == "dict" and [e["path"] for e in m["ignored"]] == ["t.parquet/column thumb"]


def write_hf_parquet(path: str, values: List[Dict[str, Any]]) -> None:
    """A Parquet file with a Hugging Face Image column holding ``values`` as given, in one row group."""
    table = pa.table({"image": pa.array(values, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))})
    features = json.dumps({"info": {"features": {"image": {"_type": "Image"}}}})
    pa.parquet.write_table(table.replace_schema_metadata({"huggingface": features}), path)


def test_hostile_paths_are_read_only_as_regular_image_files(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    good = jpeg(1)
    (tmp_path / "outside.jpg").write_bytes(good)  # beside the folder: ../outside.jpg
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.mkfifo(str(tmp_path / "fifo"))
    (tmp_path / "big.jpg").write_bytes(jpeg(2, size=64))
    rows = ["../outside.jpg", str(secret), str(tmp_path / "fifo"), "missing.jpg", str(tmp_path),
            "https://example.com/a.jpg", str(tmp_path / "big.jpg")]
    write_hf_parquet(str(folder / "t.parquet"), [{"bytes": None, "path": p} for p in rows])
    out = str(tmp_path / "out")
    big = len((tmp_path / "big.jpg").read_bytes())
    dsconvert.convert(str(folder / "t.parquet"), out, workers=1, max_sample_bytes=big - 1)
    m = manifest(out)
    reasons = {e["path"]: e["reason"] for e in m["skipped"]}
    assert members(out)["t/000000000.jpg"] == good  # ../ resolved against the Parquet file's folder
    assert reasons["t.parquet/row 1"].startswith("not a decodable image")  # read: a regular file, not an image
    assert "no regular file" in reasons["t.parquet/row 2"]  # the FIFO: never opened
    assert "does not exist" in reasons["t.parquet/row 3"]
    assert "no regular file" in reasons["t.parquet/row 4"]  # a folder
    assert "is a URL, not fetched" in reasons["t.parquet/row 5"]
    assert "over the per-sample limit" in reasons["t.parquet/row 6"]
    assert m["num_samples"] == 1  # a row skipped at read lists its json input too
    assert {p[: -len("/json")] if p.endswith("/json") else p for p in reasons} == {f"t.parquet/row {i}"
                                                                                for i in range(1, 7)}


def test_paths_among_embedded_images_are_read_at_conversion(tmp_path):
    """A row group holding embedded images is not read at scan: its path-only rows are found,
    and read or skipped, while converting."""
    big = [jpeg(i, size=48) for i in range(4)]
    (tmp_path / "named.jpg").write_bytes(jpeg(9))
    values = [{"bytes": big[0], "path": None}, {"bytes": None, "path": "named.jpg"},
              {"bytes": big[1], "path": None}, {"bytes": None, "path": "gone.jpg"}]
    write_hf_parquet(str(tmp_path / "m.parquet"), values)  # datasets' to_parquet would stat the paths itself
    out = str(tmp_path / "out")
    dsconvert.convert(str(tmp_path / "m.parquet"), out, workers=1)
    got, m = members(out), manifest(out)
    assert [got[f"m/{i:09d}.jpg"] for i in range(3)] == [big[0], jpeg(9), big[1]]
    assert "does not exist" in {e["path"]: e["reason"] for e in m["skipped"]}["m.parquet/row 3"]
    direct = dsconvert.open_dataset(str(tmp_path / "m.parquet"), decode="raw")
    assert direct[1]["jpg"] == jpeg(9)
    with pytest.raises(dsconvert.BadInputError, match="does not exist"):
        direct[3]


def test_png_files_named_by_path_stay_png_in_place_and_converted(tmp_path):
    pngs = []
    for i in range(3):
        buf = io.BytesIO()
        PILImage.fromarray(np.full((4, 4, 3), i * 40, dtype=np.uint8)).save(buf, "PNG")
        pngs.append(buf.getvalue())
        (tmp_path / f"{i}.png").write_bytes(pngs[-1])
    write_hf_parquet(str(tmp_path / "p.parquet"), [{"bytes": None, "path": f"{i}.png"} for i in range(3)])
    out = str(tmp_path / "out")
    dsconvert.convert(str(tmp_path / "p.parquet"), out, workers=1)
    direct, converted = (dsconvert.open_dataset(p, decode="raw") for p in (str(tmp_path / "p.parquet"), out))
    for i in range(3):
        assert direct[i]["png"] == converted[i]["png"] == pngs[i]


def test_hostile_save_to_disk_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(str(tmp_path))
    saved = tmp_path / "saved"
    from_paths(image_files(str(tmp_path), 6), 6).save_to_disk(str(saved), num_shards=2)
    info = json.loads((saved / "dataset_info.json").read_text())
    # dataset_info.json lies: the caption an Image, two class names for three classes
    info["features"]["caption"] = {"_type": "Image"}
    info["features"]["label"]["names"] = ["cat", "dog"]
    (saved / "dataset_info.json").write_text(json.dumps(info))
    (saved / "data-00001-of-00002.arrow").write_bytes(b"not arrow at all" * 10)
    out = str(tmp_path / "out")
    dsconvert.convert(str(saved), out, workers=1)
    m = manifest(out)
    reasons = {e["path"]: e["reason"] for e in m["skipped"]}
    assert reasons["data-00001-of-00002.arrow"].startswith("not a readable Arrow file: ")
    assert reasons["data-00000-of-00002.arrow/row 2"] == "label 2 is out of range for the 2 class names"
    got = members(out)
    assert sorted(k for k in got if k.endswith(".jpg")) == ["data-00000-of-00002/000000000.jpg",
                                                            "data-00000-of-00002/000000001.jpg"]
    assert got["data-00000-of-00002/000000001.jpg"] == (tmp_path / "images/0001.jpg").read_bytes()

    (saved / "dataset_info.json").write_text("{ not json")  # the files' own features are used
    assert len(scan(str(saved)).samples) == 3

    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": from_paths(["images/0000.jpg"], 1),
                          "test": from_paths(["images/0001.jpg"], 1)}).save_to_disk(str(dd))
    with pytest.raises(SourceError, match=r"a DatasetDict saved with save_to_disk: convert one split .*train"):
        dsconvert.convert(str(dd), str(tmp_path / "out-dd"), workers=1)


def test_docs_page_blocks_run(tmp_path, monkeypatch):
    """docs/huggingface.md: its python and bash blocks run as written, in order, in a folder
    holding the images they name."""
    import subprocess
    import sys

    doc = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "huggingface.md")
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```(python|bash)\n(.*?)```", text, re.S)
    assert blocks
    monkeypatch.chdir(str(tmp_path))
    image_files(str(tmp_path), 30)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(dsconvert.__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    for lang, code in blocks:
        cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
        done = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{lang} block failed:\n{code}\n{done.stdout}\n{done.stderr}"


# --- image classification found by itself (issue 40, item 15) ------------------------------------


def _as_built(paths: List[str], n: int, how: str) -> Dataset:
    """A Dataset built the usual ways: an image column and one label column, of each kind."""
    labels = [i % 3 for i in range(n)]
    if how == "int64":  # the first hour's: from_dict of paths and ints, the image cast
        return Dataset.from_dict({"image": paths, "label": labels}).cast_column("image", Image())
    if how in ("int8", "int32", "uint16"):
        return Dataset.from_dict({"image": paths, "label": labels}).cast_column("image", Image()).cast_column(
            "label", Value(how))
    if how == "labels":
        return Dataset.from_dict({"image": paths, "labels": labels}).cast_column("image", Image())
    if how == "classlabel":
        return Dataset.from_dict({"image": paths, "label": labels}).cast_column("image", Image()).cast_column(
            "label", ClassLabel(names=NAMES))
    if how == "int64+caption":
        return Dataset.from_dict({"image": paths, "caption": [f"c{i}" for i in range(n)], "label": labels}
                                 ).cast_column("image", Image())
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["int64", "int8", "int32", "uint16", "labels", "classlabel", "int64+caption"])
def test_an_image_and_one_label_column_is_image_classification(tmp_path, monkeypatch, capsys, how):
    """Every way of saying 'image and label' (to_parquet of paths, save_to_disk, the Dataset
    object; read in place and converted) gives (image, label) samples as ImageFolder does, with
    its classes, and info says what was chosen; --no-label gives dict samples back."""
    from dsconvert.cli import main

    monkeypatch.chdir(str(tmp_path))
    rel = image_files(str(tmp_path), 9)
    ds = _as_built(rel, 9, how)
    ds.to_parquet("t.parquet")
    ds.save_to_disk("saved")
    column = "labels" if how == "labels" else "label"
    classes = NAMES if how == "classlabel" else ["0", "1", "2"]
    pixels = [np.asarray(PILImage.open(p).convert("RGB")) for p in rel]
    for src in ("t.parquet", "saved", ds):
        out = str(tmp_path / f"out-{len(os.listdir(tmp_path))}")
        m = dsconvert.convert(src, out, workers=1).manifest
        assert m.sample_type == "classification" and m.classes == classes, (src, m.source)
        assert f"label column {column!r}" in m.source["chosen"]
        readers = [dsconvert.open_dataset(out)] + ([dsconvert.open_dataset(src)] if isinstance(src, str) else [])
        for read in readers:
            assert read.classes == classes and len(read) == 9
            for i in range(9):
                image, label = read[i]
                assert label == i % 3 and image.mode == "RGB" and np.array_equal(np.asarray(image), pixels[i])
        assert main(["info", out]) == 0
        chosen = [line for line in capsys.readouterr().out.splitlines() if line.startswith("chosen:")]
        assert len(chosen) == 1 and f"label column {column!r}" in chosen[0] and "--no-label" in chosen[0]
    # explicit options still work: --no-label (dicts of every column), --label naming the column
    assert main(["shard", "saved", "-o", "dicts", "--no-label", "-q"]) == 0
    sample = dsconvert.open_dataset("dicts")[4]
    assert isinstance(sample, dict) and json.loads(json.dumps(sample["json"]))[column] == 1
    assert dsconvert.open_dataset("t.parquet", label=False)[4]["json"][column] == 1
    assert main(["shard", "t.parquet", "-o", "named", "--label", column, "-q"]) == 0
    assert dsconvert.open_dataset("named").classes == classes


@pytest.mark.parametrize("columns, why", [
    ({"label": ClassLabel(names=NAMES), "coarse": ClassLabel(names=["a", "b", "c"])}, "several ClassLabel columns"),
    ({"label": Value("int64"), "labels": Value("int64")}, "both 'label' and 'labels'"),
    ({"label": Value("float32")}, "no ClassLabel column and no integer column named"),
    ({"label": Value("string")}, "no ClassLabel column and no integer column named"),
    ({"class_id": Value("int64")}, "no ClassLabel column and no integer column named"),
])
def test_no_label_or_several_candidates_stay_dicts_and_say_why(tmp_path, monkeypatch, columns, why):
    """Where which column is the label is not clear, the samples are dicts of every column, and
    the manifest says why (--label names the one)."""
    monkeypatch.chdir(str(tmp_path))
    rel = image_files(str(tmp_path), 4)
    data: Dict[str, Any] = {"image": rel}
    for name, feature in columns.items():
        data[name] = ["cat", "dog", "eel", "cat"] if getattr(feature, "dtype", "") == "string" else [0, 1, 2, 0]
    Dataset.from_dict(data, features=Features({"image": Image(), **columns})).to_parquet("t.parquet")
    m = dsconvert.convert("t.parquet", "out", workers=1).manifest
    assert m.sample_type == "dict" and m.classes is None and why in m.source["chosen"], m.source
    assert set(dsconvert.open_dataset("out")[1]["json"]) == set(columns)


def test_integer_labels_name_classes_up_to_the_largest(tmp_path, monkeypatch):
    """classes[label] names each label, and len(classes) is the outputs a model needs: labels
    1..5 with 3 missing are classes '0'..'5'; ids past 100,000 name no classes."""
    monkeypatch.chdir(str(tmp_path))
    rel = image_files(str(tmp_path), 4)
    Dataset.from_dict({"image": rel, "label": [1, 5, 2, 4]}).cast_column("image", Image()).to_parquet("t.parquet")
    ds = dsconvert.open_dataset("t.parquet")
    assert ds.classes == ["0", "1", "2", "3", "4", "5"] and [ds[i][1] for i in range(4)] == [1, 5, 2, 4]
    Dataset.from_dict({"image": rel, "label": [7, 10**9, 3, 0]}).cast_column("image", Image()).to_parquet("ids.parquet")
    ids = dsconvert.open_dataset("ids.parquet")
    assert ids.classes is None and ids[1][1] == 10**9
