"""Untrusted shards are data, not code: pickles stay bytes, bombs are refused on every decode
path, malformed records name the field, and a reader writes nothing."""

import io
import json
import os
import pickle

import numpy as np
import pytest
from PIL import Image

from dsconvert import BadInputError, ManifestError, convert, open_dataset

from conftest import make_image_folder, rehash_parts, write
from test_convert import _png_bomb


class _Payload:
    """Unpickling this creates a file: a harmless stand-in for code execution."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_fields_are_never_unpickled_unless_asked(tmp_path, image_kinds):
    src = str(tmp_path / "flat")
    marker = str(tmp_path / "executed")
    write(os.path.join(src, "s1.jpg"), image_kinds["baseline"][1])
    write(os.path.join(src, "s1.pkl"), pickle.dumps(_Payload(marker)))
    write(os.path.join(src, "s1.npy"), _object_npy())
    out = str(tmp_path / "out")
    m = convert(src, out, verify=False, workers=1).manifest  # verify would refuse the object .npy
    assert m.num_samples == 1 and m.fields["pkl"] == "pickle"
    ds = open_dataset(out, decode="raw")
    (sample,) = list(ds)
    assert isinstance(sample["pkl"], bytes) and not os.path.exists(marker)
    with pytest.raises(BadInputError, match="allow_pickle=True") as exc:
        list(open_dataset(out))  # decoding the object array would unpickle
    assert "shard-000000" in str(exc.value) and "s1" in exc.value.path
    assert not os.path.exists(marker)
    trusted = list(open_dataset(out, allow_pickle=True))  # the user's explicit choice
    assert os.path.exists(marker) and trusted[0]["npy"].dtype == object


def _object_npy():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return buf.getvalue()


def _jpeg_declaring(data, height, width):
    """A real JPEG whose SOF marker claims another size."""
    i = data.index(b"\xff\xc0")
    return data[: i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[i + 9:]


@pytest.fixture
def bombs(tmp_path, photos, image_kinds):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3}, size=(40, 30))
    limit = Image.MAX_IMAGE_PIXELS
    just_over = int((limit * 1.2) ** 0.5)  # Pillow itself only warns below twice the limit
    write(os.path.join(src, "a", "z_png_bomb.png"), _png_bomb(just_over, just_over))
    write(os.path.join(src, "a", "z_jpeg_bomb.jpg"), _jpeg_declaring(image_kinds["baseline"][1], 30000, 30000))
    outs = {}
    for fmt in ("wds", "hdf5"):
        outs[fmt] = str(tmp_path / fmt)
        assert convert(src, outs[fmt], fmt, verify=False, workers=1, order="source").manifest.num_samples == 5
    return outs


@pytest.mark.parametrize("decode", ["pil", "numpy"])
def test_bombs_are_refused_when_read(bombs, decode):
    h5 = open_dataset(bombs["hdf5"], decode=decode)
    assert [h5[i][0].size if decode == "pil" else h5[i][0].shape for i in range(3)]
    for i in (3, 4):  # z_jpeg_bomb (declares 30000 x 30000), z_png_bomb (just over the limit)
        with pytest.raises(BadInputError, match="decompression bomb") as exc:
            h5[i]
        assert exc.value.path == f"shard-000000.h5[{i}]"
    wds = open_dataset(bombs["wds"], decode=decode)
    assert [wds[i] for i in range(3)]
    with pytest.raises(BadInputError, match="decompression bomb") as exc:
        wds[3]
    assert exc.value.path == "shard-000000.tar[3]"
    it = iter(open_dataset(bombs["wds"], decode=decode, stream=True))
    assert len([next(it) for _ in range(3)]) == 3
    with pytest.raises(BadInputError, match="decompression bomb") as exc:
        next(it)
    assert exc.value.path == "shard-000000.tar: a/z_jpeg_bomb"
    last = open_dataset(bombs["wds"], decode=decode, rank=4, world_size=5)  # sample 4 alone
    with pytest.raises(BadInputError, match="decompression bomb") as exc:
        list(last)
    assert exc.value.path == "shard-000000.tar: a/z_png_bomb"


def test_map_style_reader_names_the_bad_sample(tmp_path, image_kinds, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 2}, size=(40, 30))
    good = image_kinds["baseline"][1]
    write(os.path.join(src, "a", "z_truncated.jpg"), good[: len(good) // 3])
    out = str(tmp_path / "h5")
    convert(src, out, "hdf5", verify=False, workers=1)
    ds = open_dataset(out)
    assert ds[0][0].size == (40, 30)
    with pytest.raises(BadInputError, match="cannot decode|corrupt|truncated") as exc:
        ds[2]
    assert exc.value.path == "shard-000000.h5[2]"


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.update(keys=r["keys"][:-1]), "keys"),
    (lambda r: r.update(keys=[1] * len(r["keys"])), "keys"),
    (lambda r: r.update(labels=["cat"] * len(r["labels"])), "labels"),
    (lambda r: r.update(sources=["a.jpg"] * len(r["sources"])), "sources"),
    (lambda r: r.update(stats=[[[1]]] * len(r["stats"])), "stats"),
    (lambda r: r.update(stats=[[[1, 2, 3]]] * len(r["stats"])), "stats"),
    (lambda r: r.update(stats=[[[1, "2"]]] * len(r["stats"])), "stats"),
    (lambda r: r.update(stats=[[[True, 2]]] * len(r["stats"])), "stats"),
    (lambda r: r.update(stats=[[{"a": 1, "b": 2}]] * len(r["stats"])), "stats"),
    (lambda r: r.update(stats=[[1, 2]] * len(r["stats"])), "stats"),
    (lambda r: r.update(stats=r["stats"][:-1]), "stats"),
    (lambda r: r.update(sources=[[1]] * len(r["sources"])), "sources"),
    (lambda r: r.update(sources=[["a.jpg", None]] * len(r["sources"])), "sources"),
    (lambda r: r.update(sources=r["sources"] + [["x"]]), "sources"),
    (lambda r: r.update(keys=[["a"]] * len(r["keys"])), "keys"),
    (lambda r: r.update(bytes=-5), "bytes"),
    (lambda r: r.update(num_samples=True), "num_samples"),
    (lambda r: r.update(skipped=[{"path": 3}]), "skipped"),
    (lambda r: r["members"].update(jpg={"offset": [0], "size": [1]}), "members.jpg.offset"),
    (lambda r: r["members"]["cls"].update(size=[-7] * len(r["keys"])), "members.cls.size"),
    (lambda r: r.update(members=[]), "members"),
])
def test_malformed_shard_records_name_the_field(tmp_path, image_folder, mutate, field):
    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    path = os.path.join(out, "shard-000000.index.json")
    record = json.load(open(path))
    mutate(record)
    json.dump(record, open(path, "w"))
    with pytest.raises(ManifestError, match="sha256 differs from the manifest's"):
        list(open_dataset(out, decode="raw"))  # the manifest's digest of the record catches any change
    rehash_parts(out)  # a consistent hostile output: the record's own checks must catch it
    with pytest.raises(ManifestError) as exc:
        list(open_dataset(out, decode="raw"))
    assert f"field '{field}'" in str(exc.value) and exc.value.path == path
