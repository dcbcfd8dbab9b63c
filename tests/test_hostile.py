"""Untrusted shards are data, not code: pickles stay bytes, bombs are refused on every decode
path, malformed records name the field, and a reader writes nothing."""

import io
import json
import os
import pickle
import re

import numpy as np
import pytest
from PIL import Image

from dsconvert import BadInputError, ManifestError, convert, open_dataset
from dsconvert.formats.columns import MAGIC
from dsconvert.verify import verify

from conftest import make_image_folder, rehash_parts, write
from support.records import read_record, record_path, to_json_records, write_record
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
    """An older output's JSON records (still read): the record parser names the field."""
    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    to_json_records(out)
    path = record_path(out, "shard-000000.tar")
    assert path.endswith(".index.json")
    record = read_record(path)
    mutate(record)
    write_record(path, record)
    with pytest.raises(ManifestError, match="sha256 differs from the manifest's|bytes, the manifest says"):
        list(open_dataset(out, decode="raw"))  # the manifest's digest of the record catches any change
    rehash_parts(out)  # a consistent hostile output: the record's own checks must catch it
    with pytest.raises(ManifestError) as exc:
        list(open_dataset(out, decode="raw"))
    assert f"field '{field}'" in str(exc.value) and exc.value.path == path


def _split(data):
    """(header, column bytes) of a binary record."""
    h = int.from_bytes(data[8:16], "little")
    return json.loads(data[16:16 + h]), data[16 + h:]


def _joined(head, body, header=None):
    header = json.dumps(head).encode() if header is None else header
    header += b" " * (-(16 + len(header)) % 8)  # column offsets count from the header's end
    return MAGIC + len(header).to_bytes(8, "little") + header + body


def _via_record(mutate):
    """A mutation of the record's dict, written back as binary columns (see support.records)."""
    def rewrite(path, data):
        record = read_record(path)
        mutate(record)
        write_record(path, record)
    return rewrite


def _via_header(mutate):
    """A mutation of the binary record's header ({"record": ..., "columns": ...})."""
    def rewrite(path, data):
        head, body = _split(data)
        mutate(head)
        open(path, "wb").write(_joined(head, body))
    return rewrite


def _via_bytes(mutate):
    def rewrite(path, data):
        open(path, "wb").write(mutate(data))
    return rewrite


def _shift(column, by):
    def mutate(head):
        head["columns"][column][1] += by  # its base: every value moves
    return mutate


# (rewrite, what the refusal says (a regex), who must refuse it: the reader (and verify), or verify alone for
# the columns a reader never reads (sources, stats): a reader reads the samples it always did)
BINARY_DAMAGE = [
    (_via_record(lambda r: r.update(keys=r["keys"][:-1])), "field 'keys'", "reader"),
    (_via_record(lambda r: r.update(keys=[1] * len(r["keys"]))), "field 'keys' is in its header", "reader"),
    (_via_record(lambda r: r.update(labels=r["labels"][:-1])), "field 'labels' holds", "reader"),
    (_via_record(lambda r: r.update(labels=["cat"] * len(r["labels"]))), "field 'labels' is in its header",
     "reader"),
    (_via_record(lambda r: r.update(sources=[[1]] * len(r["sources"]))), "field 'sources' is in its header",
     "reader"),
    (_via_record(lambda r: r.update(stats=[[{"a": 1, "b": 2}]] * len(r["stats"]))),
     "field 'stats' is in its header", "reader"),
    (_via_record(lambda r: r["members"].update(jpg={"offset": [0], "size": [1]})), "field 'members.jpg.offset'",
     "reader"),
    (_via_record(lambda r: r["members"]["cls"].update(size=[-7] * len(r["keys"]))), "field 'members.cls.size'",
     "reader"),
    (_via_record(lambda r: r["members"]["jpg"].update(offset=[10**12] * len(r["keys"]))),
     "index points outside the shard|the index says 1000000000000", "reader"),
    (_via_record(lambda r: r.update(bytes=-5)), "field 'bytes'", "reader"),
    (_via_record(lambda r: r.update(num_samples=True)), "field 'num_samples'", "reader"),
    (_via_record(lambda r: r.update(num_samples=r["num_samples"] + 1)),
     "holds 16 values, not 17|describes another version", "reader"),
    (_via_record(lambda r: r.update(skipped=[{"path": 3}])), "field 'skipped'", "reader"),
    # a tiny record declaring 10**12 samples of constant columns: once a MemoryError in reader and verify
    (_via_header(lambda h: [h["record"].update(num_samples=10**12)] + [
        spec.__setitem__(slice(0, 4, 3), ["", 10**12]) for spec in h["columns"].values()]),
     "field 'num_samples' is 1,000,000,000,000, more samples than its keys can name", "reader"),
    (_via_header(lambda h: h["record"].update(members=[])), "field 'members' is in its header", "reader"),
    (_via_header(lambda h: h["columns"].pop("members/jpg/size")), "member 'jpg' lacks its offset or size",
     "reader"),
    (_via_header(lambda h: h["columns"].update({"members/jpg/bogus": ["", 0, 0, 16]})),
     "column 'members/jpg/bogus' is not a member column", "reader"),
    (_via_header(lambda h: h["columns"]["labels"].__setitem__(2, 10**9)),
     "column 'labels' lies past the end of the file", "reader"),
    (_via_header(lambda h: h["columns"].update({"keys.ends": "everything"})),
     r"column 'keys.ends' is not \[dtype, base, offset, count\]", "reader"),
    (_via_header(lambda h: h["columns"]["keys.ends"].__setitem__(0, "u3")),
     r"column 'keys.ends' is not \[dtype, base, offset, count\]", "reader"),
    (_via_header(lambda h: h["columns"]["keys.ends"].__setitem__(0, [])),  # once a TypeError (unhashable)
     r"column 'keys.ends' is not \[dtype, base, offset, count\]", "reader"),
    (_via_header(_shift("keys.ends", 10**6)), "column 'keys' has string ends outside its blob", "reader"),
    (_via_header(lambda h: h.update(record=[])), "its header has no record and columns", "reader"),
    (_via_bytes(lambda d: _joined(None, _split(d)[1], header=b'{"record": {"shard": ')), "its header is not JSON",
     "reader"),
    (_via_bytes(lambda d: d[:8] + (1 << 40).to_bytes(8, "little") + d[16:]), "its header declares", "reader"),
    (_via_bytes(lambda d: d[: len(d) - 40]), "lies past the end of the file", "reader"),
    (_via_bytes(lambda d: d[:12]), "not a dsconvert binary record", "reader"),
    (_via_bytes(lambda d: d[:7] + b"\x02" + d[8:]), "not valid JSON", "reader"),  # another version: not ours
    (_via_record(lambda r: r.update(sources=r["sources"] + [["x"]])), "field 'sources'", "verify"),
    (_via_record(lambda r: r.update(stats=r["stats"][:-1])), "field 'stats'", "verify"),
    (_via_header(_shift("sources.id", 1000)), "sources.id points outside its table", "verify"),
]


@pytest.mark.parametrize("rewrite, problem, refused_by", BINARY_DAMAGE,
                         ids=[f"{i}-{p[:30]}" for i, (_, p, _) in enumerate(BINARY_DAMAGE)])
def test_damaged_binary_records_are_refused_naming_the_problem(tmp_path, image_folder, rewrite, problem,
                                                               refused_by):
    """A binary record damaged or hostile in any part (its header, a column's place, count or
    values) is refused in one line naming the problem: never a crash, never other samples."""
    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    before = list(open_dataset(out, decode="raw"))
    path = record_path(out, "shard-000000.tar")
    assert path.endswith(".idx")
    rewrite(path, open(path, "rb").read())
    with pytest.raises(ManifestError, match="sha256 differs from the manifest's|bytes, the manifest says"):
        list(open_dataset(out, decode="raw"))  # the manifest's digest of the record catches any change
    rehash_parts(out)  # a consistent hostile output: the record's own checks must catch it
    report = verify(out, workers=1)
    assert not report["ok"] and any(re.search(problem, p["message"]) for p in report["problems"]), report["problems"]
    if refused_by == "reader":
        with pytest.raises(ManifestError) as exc:
            list(open_dataset(out, decode="raw"))
        message = str(exc.value)
        assert re.search(problem, message) and "\n" not in message, message
        assert exc.value.path in (path, os.path.join(out, "shard-000000.tar"))
    else:
        assert list(open_dataset(out, decode="raw")) == before
