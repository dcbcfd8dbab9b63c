"""The contract every registered format keeps: what a new format module must pass.

Each test runs once per id in ``dsconvert.formats.FORMATS``, through the registry's interface
only, so that adding a format (one module and its id) puts it under all of these.
"""

import os

import numpy as np
import pytest
from PIL import Image

from dsconvert import Manifest, convert, open_dataset
from dsconvert.formats import FORMATS, Format, get
from dsconvert.formats.base import ShardReader, Sink, SpansNotSupported
from dsconvert.io.shard_cache import ShardAccess
from dsconvert.source import scan
from dsconvert.verify import verify

from conftest import pil_loader, reference_image_folder, rehash_parts
from support.records import read_record, write_record

pytestmark = pytest.mark.parametrize("fmt_id", FORMATS)


@pytest.fixture
def written(tmp_path, image_folder, fmt_id):
    out = str(tmp_path / f"out-{fmt_id}")
    result = convert(image_folder, out, fmt_id, samples_per_shard=6, workers=1)
    return image_folder, out, result.manifest


def test_registry_entry_is_a_complete_format(fmt_id):
    fmt = get(fmt_id)
    assert issubclass(fmt, Format) and fmt is not Format and fmt.id == fmt_id
    assert fmt.pixels in ("never", "optional", "always")
    assert fmt.suffix.startswith(".") and fmt.overhead >= 0
    name = fmt.shard_name("shard", 3)
    assert name == f"shard-000003{fmt.suffix}" and fmt.index_name(name) == "shard-000003.idx"
    for method in ("open_sink", "open_shard"):  # what a format must supply
        assert getattr(fmt, method).__func__ is not getattr(Format, method).__func__, method
    assert not fmt.__abstractmethods__  # every @abstractmethod of the interface implemented


def test_shard_reader_keeps_the_interface_the_readers_call(written, fmt_id):
    """A format read as a stream has the byte spans the stream reader reads; any other says
    so with SpansNotSupported, never an AttributeError."""
    _, out, manifest = written
    fmt = get(fmt_id)
    entry = manifest.shards[0]
    shard = fmt.open_shard(ShardAccess(out), entry, manifest)
    try:
        assert isinstance(shard, ShardReader) and not type(shard).__abstractmethods__
        assert shard.ranged == fmt.iterable
        samples = list(range(entry.num_samples))
        if shard.ranged:
            spans = shard.image_spans()
            assert len(spans) == entry.num_samples
            source = shard.scattered(samples, True)
            try:
                for j, (offset, size) in zip(samples, spans):
                    assert shard.sample_bytes(j, True) == size
                    assert bytes(source.get(offset, size)) == bytes(shard.image(j))
            finally:
                source.close()
        else:
            calls = (shard.image_spans, lambda: shard.sample_bytes(0, True), lambda: shard.scattered(samples, True))
            for call in calls:
                with pytest.raises(SpansNotSupported):
                    call()
    finally:
        shard.close()


def test_open_sink_gives_a_complete_sink(fmt_id, tmp_path):
    """What open_sink gives is a Sink, every abstract method implemented."""
    from dsconvert.plan import ShardSpec

    fmt = get(fmt_id)
    spec = ShardSpec(fmt_id, 0, fmt.shard_name("shard", 0), str(tmp_path), str(tmp_path), "classification", ())
    path = tmp_path / spec.name
    with open(path, "wb") as f:
        sink = fmt.open_sink(spec, f, str(path))
        assert isinstance(sink, Sink) and not type(sink).__abstractmethods__
        sink.close()


def test_files_of_names_every_file_a_shard_has(written, fmt_id):
    _, out, manifest = written
    fmt = get(fmt_id)
    listed = {name for entry in manifest.shards for name in fmt.files_of(entry)}
    on_disk = {n for n in os.listdir(out) if not n.startswith(".") and n not in manifest.own_files()}
    assert listed == on_disk
    for entry in manifest.shards:
        assert fmt.files_of(entry)[0] == entry.name
        assert set(entry.parts) == set(fmt.files_of(entry)[1:])  # every other file has its digest


def test_planned_bytes_bound_the_shard(written, fmt_id):
    src, out, manifest = written
    fmt = get(fmt_id)
    if fmt.pixels == "always":
        pytest.skip("pixel outputs are planned from decoded sizes, not sample_bytes")
    samples = scan(src).samples
    classification = manifest.sample_type == "classification"
    start = 0
    for entry in manifest.shards:
        planned = sum(fmt.sample_bytes(s, classification) for s in samples[start: start + entry.num_samples])
        assert entry.bytes <= planned + fmt.overhead, entry.name
        start += entry.num_samples


def test_reads_back_what_imagefolder_gives(written, fmt_id):
    src, out, manifest = written
    ds = open_dataset(out)
    reference = reference_image_folder(src)
    got = list(ds)
    assert len(got) == len(ds) == len(reference) == manifest.num_samples
    for (image, label), (path, want) in zip(got, reference):
        assert label == want
        expected = np.asarray(pil_loader(path))
        assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == pil_loader(path).size
        if manifest.stored == "encoded":
            assert np.array_equal(np.asarray(image), expected)
        else:  # decoded by the fastest decoder: within a level or two of Pillow's on average
            assert np.abs(np.asarray(image, np.int16) - expected).mean() < 3


def test_open_shard_gives_every_sample(written, fmt_id):
    _, out, manifest = written
    fmt = get(fmt_id)
    access = ShardAccess(out)
    for entry in manifest.shards:
        shard = fmt.open_shard(access, entry, manifest)
        try:
            assert isinstance(shard, ShardReader)
            shard.prepare(0, entry.num_samples, prefetch=False)
            images = list(shard.images(0, entry.num_samples))
            assert [j for j, _ in images] == list(range(entry.num_samples))
            assert len(shard.labels) == entry.num_samples
            for j, image in images:
                fields = shard.fields(j)
                assert any(np.array_equal(np.asarray(memoryview(v) if isinstance(v, bytes) else v),
                                          np.asarray(memoryview(image) if isinstance(image, bytes) else image))
                           for v in fields.values())
        finally:
            shard.close()


def test_verify_passes_then_finds_each_kind_of_damage(written, fmt_id):
    _, out, manifest = written
    assert verify(out, decode=True, workers=1)["ok"]
    entry = manifest.shards[0]
    path = os.path.join(out, entry.name)
    with open(path, "r+b") as f:  # one flipped byte in the middle of the shard
        f.seek(entry.bytes // 2)
        byte = f.read(1)
        f.seek(entry.bytes // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = verify(out, workers=1)
    assert not report["ok"] and "checksum" in {p["kind"] for p in report["problems"] if p["path"] == entry.name}
    os.unlink(os.path.join(out, get(fmt_id).record_name(manifest.shards[-1])))
    report = verify(out, workers=1)
    assert any(p["kind"] == "record" and p["path"] == manifest.shards[-1].name for p in report["problems"])


def test_a_rewritten_record_is_refused_by_reader_and_verify(written, fmt_id):
    _, out, manifest = written
    fmt = get(fmt_id)
    name = fmt.record_name(manifest.shards[0])
    record = read_record(os.path.join(out, name))
    record["num_samples"] += 1
    write_record(os.path.join(out, name), record)
    report = verify(out, workers=1)
    assert not report["ok"]
    rehash_parts(out)  # consistent with the manifest's digests: the record's own checks must hold
    report = verify(out, workers=1)
    assert any(p["kind"] == "record" for p in report["problems"])


def test_resume_reuses_every_finished_shard(written, fmt_id, tmp_path):
    src, out, manifest = written
    again = convert(src, str(tmp_path / "again"), fmt_id, samples_per_shard=6, workers=1)
    os.remove(os.path.join(again.out_dir, "dsconvert.json"))
    resumed = convert(src, again.out_dir, fmt_id, samples_per_shard=6, workers=1)
    assert resumed.shards_resumed == len(manifest.shards) and resumed.shards_written == 0
    assert [e.sha256 for e in Manifest.load(again.out_dir).shards] == [e.sha256 for e in manifest.shards]
