"""The tar writer's fast path against ``tarfile``: the same bytes, member by member and shard by
shard, where names are long, not ASCII or undecodable, and sizes sit on block boundaries;
and the spec digest and escaped paths, made without their generic slow paths, unchanged."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import asdict

import pytest

from dsconvert.formats.tar_members import archive_end, member_header, padding
from dsconvert.formats.wds import _TarSink
from dsconvert.keys import escape_path
from dsconvert.plan import ShardSpec
from dsconvert.samples import Sample, SourceFile

NAMES = [
    "a.jpg", "n01440764/img_001.jpg", "x" * 96 + ".jpg", "x" * 97 + ".jpg", "d/" * 60 + "k.cls",
    "caf\u00e9.jpg", "\u65e5\u672c/\u753b\u50cf.png", "bad\udcff.jpg", "sp ace%25.txt", "q?.json",
]
SIZES = [0, 1, 511, 512, 513, 1024, 8 ** 11 - 1, 8 ** 11, 10 ** 13]


def _tarfile_header(name: str, size: int) -> bytes:
    """What TarFile.addfile writes before a member's data (our members: mode 0444, mtime 0)."""
    out = io.BytesIO()
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o444
    with tarfile.TarFile(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info)  # no data: only the header block(s)
        return out.getvalue()[:tf.offset]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", SIZES)
def test_member_header_is_tarfiles(name, size):
    assert member_header(name, size) == _tarfile_header(name, size)


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 10240, 10241])
def test_padding_and_end_are_tarfiles(size):
    out = io.BytesIO()
    tf = tarfile.TarFile(fileobj=out, mode="w", format=tarfile.PAX_FORMAT)
    info = tarfile.TarInfo("m")
    info.size = size
    tf.addfile(info, io.BytesIO(b"\1" * size))
    before = out.tell()
    tf.close()
    body = out.getvalue()
    assert body[512 + size: before] == padding(size)
    assert body[before:] == archive_end(before)


def _old_sink_bytes(spec: ShardSpec, samples):
    """The shard and its columns as tarfile wrote them before the fast path (the reference)."""
    out = io.BytesIO()
    tf = tarfile.TarFile(fileobj=out, mode="w", format=tarfile.PAX_FORMAT)
    offsets = []
    for sample, data in samples:
        if spec.sample_type == "classification":
            data = dict(data, cls=str(sample.label).encode())
        for name in sorted(data):
            info = tarfile.TarInfo(f"{sample.key}.{name}")
            info.size, info.mtime, info.mode = len(data[name]), 0, 0o444
            tf.addfile(info, io.BytesIO(data[name]))
            offsets.append((name, tf.offset - -(-len(data[name]) // 512) * 512, len(data[name])))
    tf.close()
    return out.getvalue(), offsets


def _spec(sample_type: str, samples, options=None) -> ShardSpec:
    return ShardSpec("wds", 0, "shard-000000.tar", "/src", "/out", sample_type, tuple(samples),
                     options=options or {})


@pytest.mark.parametrize("sample_type", ["classification", "dict"])
def test_sink_writes_tarfiles_bytes(sample_type):
    keys = ["k0", "x" * 120, "caf\u00e9", "bad\udcff", "e", "d/" * 50 + "z", "n/img_000007"]
    payloads = [b"", b"\xff" * 512, b"j" * 513, b"p" * 1, b"q" * 511, b"r" * (3 << 20), b"s" * 1024]
    samples = []
    for i, (key, data) in enumerate(zip(keys, payloads)):
        sample = Sample(key, (SourceFile("jpg", f"{key}.jpg", len(data), 0),), label=i)
        fields = {"jpg": data} if sample_type == "classification" else {"jpg": data, "txt": data[:7], "json": b"{}"}
        samples.append((sample, fields))
    spec = _spec(sample_type, [s for s, _ in samples])
    out = io.BytesIO()
    sink = _TarSink(spec, out)
    for sample, fields in samples:
        sink.add(sample, dict(fields))
    extra = sink.close()
    want, offsets = _old_sink_bytes(spec, samples)
    assert out.getvalue() == want
    assert sink.sha256 == hashlib.sha256(want).hexdigest()
    got = [(name, col["offset"][i], col["size"][i]) for i in range(len(samples))
           for name, col in extra["members"].items() if col["offset"][i] >= 0]
    assert sorted(got) == sorted(offsets)
    assert [m.name for m in tarfile.open(fileobj=io.BytesIO(want))][:2] == [f"{keys[0]}.{n}" for n in sorted(
        samples[0][1] | ({"cls": b""} if sample_type == "classification" else {}))][:2]


def _asdict_digest(spec: ShardSpec) -> str:
    """ShardSpec.digest as it was written before: asdict of the whole spec."""
    d = asdict(spec)
    if not d["positions"]:
        d.pop("positions")
    for volatile in ("out_dir", "strict", "storage_options", "owner"):
        d.pop(volatile)
    if d["source_kind"] == "files":
        d.pop("source_kind")
        for sample in d["samples"]:
            for f in sample["files"]:
                f.pop("container")
                f.pop("offset")
    return hashlib.sha256(json.dumps(d, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


@pytest.mark.parametrize("kind", ["files", "tar"])
def test_spec_digest_unchanged(kind):
    samples = (
        Sample("a/b", (SourceFile("jpg", "a/b.jpg", 10, 5), SourceFile("json", "a/b.json", 2, 6)), 3),
        Sample("caf\u00e9", (SourceFile("png", "t.tar/caf\u00e9.png", 7, 8, "t.tar", 1536),), None),
        Sample("bad\udcff", (SourceFile("jpg", "bad\udcff.jpg", 0, 0),), 0),
    )
    spec = ShardSpec("wds", 3, "shard-000003.tar", "/src", "/out", "classification", samples, options={
        "compress": {"codec": "zstd", "level": 3}, "resize": [224, 224]}, source_kind=kind, positions=(2, 0, 1))
    assert spec.digest() == _asdict_digest(spec)
    bare = ShardSpec("wds", 0, "s.tar", "/src", "/out", "dict", samples[:1], source_kind=kind)
    assert bare.digest() == _asdict_digest(bare)


def test_sample_and_file_fields_are_the_digests():
    """The digest names a sample's fields by hand: a field added to Sample must be added there."""
    assert list(asdict(Sample("k", (), 1))) == ["key", "files", "label"]


@pytest.mark.parametrize("path", ["plain/a.jpg", "50%/a.jpg", "caf\u00e9.jpg", "bad\udcff.jpg", "%", ""])
def test_escape_path_fast_path_same(path):
    slow = "".join("%25" if ch == "%" else f"%{ord(ch) - 0xDC00:02X}" if 0xDC80 <= ord(ch) <= 0xDCFF else ch
                   for ch in path)
    assert escape_path(path) == slow


@pytest.mark.parametrize("key", ["k", "n0/img_1", "x" * 90, "x" * 91, "y" * 95, "caf\u00e9", "bad\udcff"])
@pytest.mark.parametrize("with_cls", [True, False])
def test_sample_tar_bytes_is_what_the_sink_writes(key, with_cls):
    """The planner's byte count (its shortcut for short ASCII names included) is exactly what
    the sink writes for the sample, for names at and past the one-header limit."""
    from dsconvert.formats.wds import sample_tar_bytes

    fields = {"jpg": b"j" * 700, "json": b"{}", "txt": b"", "x" * 9: b"z" * 512, "w" * 10: b"w"}
    files = tuple(SourceFile(name, f"{key}.{name}", len(data), 0) for name, data in fields.items())
    sample = Sample(key, files, label=5 if with_cls else None)
    out = io.BytesIO()
    sink = _TarSink(_spec("classification" if with_cls else "dict", [sample]), out)
    sink.add(sample, dict(fields))
    sink.close()
    _, offset, size, _, _ = sink.members[-1]
    assert sample_tar_bytes(sample, with_cls) == offset + size + len(padding(size))


def test_quick_samples_are_the_constructors():
    """A scan table's samples are made without the frozen dataclasses' __init__: the same
    objects (equal, same hash, same fields, pickled alike); a field added to either class
    fails here until quick_file/quick_sample set it."""
    import pickle
    from dataclasses import fields

    from dsconvert.samples import quick_file, quick_sample

    args = ("jpg", "t.tar/caf\u00e9.jpg", 12, 34, "t.tar", 512)
    made, slow = quick_file(*args), SourceFile(*args)
    assert made == slow and hash(made) == hash(slow) and vars(made) == vars(slow)
    assert list(vars(made)) == [f.name for f in fields(SourceFile)]
    sample, reference = quick_sample("k", (made,), 3), Sample("k", (slow,), 3)
    assert sample == reference and hash(sample) == hash(reference)
    assert list(vars(sample)) == [f.name for f in fields(Sample)]
    assert pickle.loads(pickle.dumps(sample)) == reference
    with pytest.raises(AttributeError):
        sample.key = "other"  # still frozen
