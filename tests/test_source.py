import json
import os

import pytest

from dsconvert import SourceError, scan
from dsconvert.keys import decode_key

from conftest import encode, make_image_folder, reference_image_folder, write


def test_image_folder_order_and_labels_match_torchvision(tmp_path, photos):
    root = str(tmp_path / "src")
    # class names whose plain string sort differs from a path sort ("a b" < "a/...")
    make_image_folder(root, photos, {"a": 3, "a b": 2, "B": 2, "a_c": 1})
    # nested folders and mixed case extensions, as ImageFolder walks them
    jpg = encode(photos["astronaut"].resize((32, 32)))
    for rel in ("a/sub/x.JPG", "a/sub dir/y.jpeg", "a/sub/deeper/z.png", "a b/zz/q.Jpg"):
        write(os.path.join(root, rel), jpg)
    src = scan(root)
    assert src.layout == "imagefolder"
    assert src.classes == sorted(["a", "a b", "B", "a_c"])
    got = [(os.path.join(root, s.files[0].path), s.label) for s in src.samples]
    assert got == reference_image_folder(root)


def test_hidden_and_litter_are_ignored_not_inputs(image_folder):
    for rel in (".DS_Store", "cat/.DS_Store", "cat/Thumbs.db", "cat/._cat_0000.jpg", ".git/x.jpg",
                "__MACOSX/cat/a.jpg"):
        write(os.path.join(image_folder, rel), b"litter")
    src = scan(image_folder)
    assert src.classes == ["cat", "dog", "zebra"]
    assert len(src.samples) == 16 and not src.skipped
    assert sorted(i.path for i in src.ignored) == sorted(
        [".DS_Store", "cat/.DS_Store", "cat/Thumbs.db", "cat/._cat_0000.jpg", ".git", "__MACOSX"]
    )


def test_symlinks_followed_loops_and_broken_links_reported(image_folder):
    cat = os.path.join(image_folder, "cat")
    os.symlink(os.path.join(cat, "cat_0000.jpg"), os.path.join(image_folder, "dog", "linked.jpg"))
    os.symlink(image_folder, os.path.join(cat, "loop"))  # back to an ancestor
    os.symlink("nowhere.jpg", os.path.join(cat, "broken.jpg"))
    os.symlink("self1.jpg", os.path.join(cat, "self2.jpg"))
    os.symlink("self2.jpg", os.path.join(cat, "self1.jpg"))
    src = scan(image_folder)
    keys = [s.key for s in src.samples]
    assert "dog/linked" in keys
    reasons = {s.path: s.reason for s in src.skipped}
    assert reasons["cat/loop"].startswith("symlink loop")
    assert reasons["cat/broken.jpg"] == "broken symlink"
    assert reasons["cat/self1.jpg"] == "symlink loop" and reasons["cat/self2.jpg"] == "symlink loop"
    assert src.num_files == 16 + 1 + 4


def test_odd_names_work(tmp_path, photos):
    root = str(tmp_path / "src")
    jpg = encode(photos["rocket"].resize((40, 30)))
    names = ["with space.jpg", "ünïcödé 猫.jpg", "shot.v2.0001.jpg", "100%~real.jpg"]
    for n in names:
        write(os.path.join(root, "cls", n), jpg)
    bad = os.path.join(os.fsencode(root), b"cls", b"latin1-\xe9t\xe9.jpg")
    with open(bad, "wb") as f:
        f.write(jpg)
    src = scan(root)
    assert len(src.samples) == 5
    stems = sorted(decode_key(s.key) for s in src.samples)
    expected = sorted("cls/" + n[: -len(".jpg")] for n in names + [os.fsdecode(b"latin1-\xe9t\xe9.jpg")])
    assert stems == expected
    for s in src.samples:
        json.dumps(s.key).encode("utf-8")  # keys are strict JSON / UTF-8


def test_same_stem_images_stay_two_samples(tmp_path, photos):
    root = str(tmp_path / "src")
    img = photos["rocket"].resize((20, 20))
    write(os.path.join(root, "c", "a.jpg"), encode(img))
    write(os.path.join(root, "c", "a.png"), encode(img, "PNG"))
    src = scan(root)
    assert [decode_key(s.key) for s in src.samples] == ["c/a.jpg", "c/a.png"]
    assert len({s.key for s in src.samples}) == 2


def test_flat_layout_groups_sidecars_by_last_extension(tmp_path, photos):
    root = str(tmp_path / "flat")
    jpg = encode(photos["rocket"].resize((20, 20)))
    write(os.path.join(root, "shot.v2.0001.jpg"), jpg)
    write(os.path.join(root, "shot.v2.0001.json"), b'{"a": 1}')
    write(os.path.join(root, "shot.v2.0002.jpg"), jpg)
    write(os.path.join(root, "shot.v2.0002.cls"), b"3")
    write(os.path.join(root, "sub", "x.jpg"), jpg)
    write(os.path.join(root, "sub", "x.txt"), b"caption")
    write(os.path.join(root, "README"), b"no extension")
    write(os.path.join(root, "dup.jpg"), jpg)
    write(os.path.join(root, "dup.JPG"), jpg)
    src = scan(root)
    assert src.layout == "flat"
    by_key = {decode_key(s.key): [f.field for f in s.files] for s in src.samples}
    assert by_key == {
        "dup": ["jpg"],
        "shot.v2.0001": ["jpg", "json"],
        "shot.v2.0002": ["cls", "jpg"],
        "sub/x": ["jpg", "txt"],
    }
    reasons = {s.path: s.reason for s in src.skipped}
    assert reasons["README"].startswith("no file extension")
    assert "duplicate field 'jpg'" in reasons["dup.jpg"]
    assert src.num_files == 9


def test_image_folder_detection_and_override(image_folder):
    write(os.path.join(image_folder, "cat", "cat_0000.json"), b"{}")  # a sidecar: flat
    assert scan(image_folder).layout == "flat"
    forced = scan(image_folder, layout="imagefolder")
    assert forced.layout == "imagefolder"
    assert any(s.path == "cat/cat_0000.json" and s.reason.startswith("not an image") for s in forced.skipped)


def test_files_outside_class_folders_are_skipped(image_folder):
    write(os.path.join(image_folder, "README.txt"), b"hello")
    src = scan(image_folder)
    assert src.layout == "imagefolder"
    assert [(s.path, s.reason) for s in src.skipped] == [("README.txt", "not inside a class folder")]


def test_list_layouts(tmp_path, image_folder):
    csv_path = tmp_path / "train.csv"
    csv_path.write_text("path,label\nsrc/cat/cat_0001.jpg,cat\nsrc/dog/dog_0000.jpg,dog\n"
                        "src/missing.jpg,cat\nsrc/cat/cat_0000.jpg,cat\n")
    src = scan(str(csv_path))
    assert src.layout == "list" and src.classes == ["cat", "dog"]
    assert [(s.files[0].path, s.label) for s in src.samples] == [
        ("src/cat/cat_0001.jpg", 0), ("src/dog/dog_0000.jpg", 1), ("src/cat/cat_0000.jpg", 0)]
    assert [s.path for s in src.skipped] == ["src/missing.jpg"]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"path": "src/zebra/zebra_0000.jpg", "label": 7}\n\n'
                     '{"path": "src/cat/cat_0000.jpg", "label": 2}\n')
    src = scan(str(jsonl))
    assert src.classes is None and [s.label for s in src.samples] == [7, 2]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"file": "x.jpg"}\n')
    with pytest.raises(SourceError, match="bad.jsonl:1: expected a JSON object with 'path' and 'label'"):
        scan(str(bad))


def test_empty_or_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        scan(str(tmp_path / "nope"))
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(SourceError, match=r"no samples found .*jpg, jpeg, png"):
        scan(str(tmp_path / "empty"))


def test_fifo_is_not_read(image_folder):
    os.mkfifo(os.path.join(image_folder, "cat", "pipe.jpg"))
    src = scan(image_folder)
    assert ("cat/pipe.jpg", "not a regular file") in [(s.path, s.reason) for s in src.skipped]
