"""The bulk walk of plain tar headers (dsconvert.source.tar_walk) indexes every tar exactly as
``tarfile`` alone does: the same samples, offsets, sizes, labels and skip reasons, for tars of
every writer and format, hostile headers (mutated bytes, with and without a fixed checksum),
chunk boundaries anywhere, and data that ends past the file."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dsconvert.source import tar_walk, tars

BLOCK = 512


def _index(data: bytes, walk: bool, label=None, chunk: int = tar_walk.CHUNK):
    """The scan record of a tar held in ``data``, with or without the bulk walk."""
    saved = (tars.WALK_PLAIN, tar_walk.CHUNK)
    tars.WALK_PLAIN, tar_walk.CHUNK = walk, chunk
    try:
        try:
            return tars._scan(io.BytesIO(data), len(data), "t.tar", tars.parse_label(label))
        except Exception as exc:  # the same refusal either way
            return ("raised", type(exc).__name__, str(exc))
    finally:
        tars.WALK_PLAIN, tar_walk.CHUNK = saved


def _same(data: bytes, label=None) -> None:
    expected = _index(data, walk=False, label=label)
    for chunk in (tar_walk.CHUNK, 4 * BLOCK, BLOCK):  # runs cut at every kind of boundary
        assert _index(data, walk=True, label=label, chunk=chunk) == expected


def _tar(members, fmt=tarfile.GNU_FORMAT, pax_headers=None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=pax_headers or {}) as tf:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE or kind == tarfile.LNKTYPE:
                info.linkname = "s000.jpg"
                tf.addfile(info)
            elif kind in (tarfile.REGTYPE, tarfile.AREGTYPE):
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def _samples(n: int, start: int = 0):
    out = []
    for i in range(start, start + n):
        out.append((f"s{i:03d}.cls", str(i % 3).encode(), tarfile.REGTYPE))
        out.append((f"s{i:03d}.jpg", bytes([i % 251]) * (100 + 700 * (i % 4)), tarfile.REGTYPE))
    return out


PLAIN = _tar(_samples(12))


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_every_format_indexes_the_same(fmt):
    members = _samples(6) + [
        ("deep/" * 30 + "long.jpg", b"x" * 300, tarfile.REGTYPE),  # a prefix (ustar) or an extension
        ("dir", b"", tarfile.DIRTYPE), ("s900.jpg", b"", tarfile.SYMTYPE), ("s901.jpg", b"", tarfile.LNKTYPE),
        ("fifo.jpg", b"", tarfile.FIFOTYPE), ("ünï.jpg", b"u" * 10, tarfile.REGTYPE),
        ("a" * 120 + ".jpg", b"y" * 600, tarfile.REGTYPE)]
    try:
        data = _tar(members, fmt)
    except ValueError:  # ustar cannot hold every name: without them
        data = _tar(members[:6 * 2 + 1] + members[-3:-2], fmt)
    _same(data, label="cls")
    _same(data)


def test_a_global_pax_header_hands_every_later_member_to_tarfile():
    data = _tar(_samples(4), tarfile.PAX_FORMAT, pax_headers={"comment": "global", "path": "renamed.jpg"})
    _same(data, label="cls")


def test_plain_tars_take_the_bulk_walk():
    """The walk is used (the point of it): every member of a plain tar is a plain member."""
    walker = tar_walk.PlainHeaders(io.BytesIO(PLAIN), len(PLAIN), "utf-8", "surrogateescape")
    members = walker.run(0)
    assert [m.name for m in members[:4]] == ["s000.cls", "s000.jpg", "s001.cls", "s001.jpg"]
    assert len(members) == 24
    with tarfile.open(fileobj=io.BytesIO(PLAIN)) as tf:
        expected = [(m.name, m.size, m.offset_data) for m in tf.getmembers()]
    assert [(m.name, m.size, m.offset_data) for m in members] == expected
    _same(PLAIN, label="cls")


@pytest.mark.parametrize("cut", [1, 100, BLOCK, BLOCK + 7, 3 * BLOCK, len(PLAIN) // 2, len(PLAIN) - 2 * BLOCK - 1])
def test_truncated_tars_index_the_same(cut):
    _same(PLAIN[: len(PLAIN) - cut], label="cls")


def _checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)


def _header_offsets(data: bytes):
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [m.offset for m in tf.getmembers()]


@pytest.mark.parametrize("field,value", [
    ((124, 136), b"\x80" + bytes(7) + (1234).to_bytes(4, "big")),  # base-256 size
    ((124, 136), b"  0001234 \0 "), ((124, 136), b"-0000001234\0"), ((124, 136), b"00000012 34\0"),
    ((100, 108), b"0000644\t"), ((136, 148), b"\xff" * 12), ((329, 337), b"zzzzzzz\0"),
    ((156, 157), b"7"), ((156, 157), b"S"), ((156, 157), b"x"), ((156, 157), b"g"), ((156, 157), b"L"),
    ((0, 100), b"\0" * 100), ((0, 100), b"trailing/" + bytes(91)), ((345, 500), b"pre/fix" + bytes(148)),
    ((345, 500), b"\xff\xfe" + bytes(153)), ((0, 100), b"\xc3(" + bytes(98)),
])
@pytest.mark.parametrize("which", [0, 5, -1])
def test_odd_header_fields_index_the_same(field, value, which):
    data = bytearray(PLAIN)
    at = _header_offsets(PLAIN)[which]
    data[at + field[0]: at + field[1]] = value
    block = bytearray(data[at: at + BLOCK])
    _checksum(block)
    data[at: at + BLOCK] = block
    _same(bytes(data), label="cls")


def test_a_bad_checksum_and_a_zero_block_midway_index_the_same():
    data = bytearray(PLAIN)
    at = _header_offsets(PLAIN)[7]
    data[at + 148: at + 156] = b"0000001\0"
    _same(bytes(data), label="cls")
    data = bytearray(PLAIN)
    data[at: at + BLOCK] = bytes(BLOCK)
    _same(bytes(data), label="cls")


def test_garbage_after_the_archive_indexes_the_same():
    _same(PLAIN + b"garbage" * 100, label="cls")
    _same(PLAIN.rstrip(b"\0") + b"\0" * 700, label="cls")


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(PLAIN) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.booleans(), st.data())
def test_mutated_headers_index_the_same(changes, fix_checksums, data):
    """Any bytes changed anywhere (headers mostly), the checksums fixed or not: the bulk walk
    never decides otherwise than tarfile."""
    offsets = _header_offsets(PLAIN)
    mutated = bytearray(PLAIN)
    for at, value in changes:
        if data.draw(st.booleans()):  # aim at a header's bytes
            at = data.draw(st.sampled_from(offsets)) + at % BLOCK
        mutated[at] = value
    if fix_checksums:
        for at in offsets:
            block = bytearray(mutated[at: at + BLOCK])
            _checksum(block)
            mutated[at: at + BLOCK] = block
    _same(bytes(mutated), label="cls")


def test_the_scale_benchmark_tars_index_the_same(tmp_path):
    from benchmarks.scale import make_tars

    make_tars(str(tmp_path), 40, per_tar=40)
    data = open(os.path.join(tmp_path, "part-000000.tar"), "rb").read()
    _same(data, label="cls")
    record = _index(data, walk=True, label="cls")
    assert record["num_samples"] == 40 and not record["skipped"]


def _negative(data: bytes, which: int) -> bytes:
    """``data`` with member ``which``'s size field made negative (its checksum fixed)."""
    out = bytearray(data)
    at = _header_offsets(data)[which]
    block = bytearray(out[at: at + BLOCK])
    block[124:136] = b"-0000001000\0"
    _checksum(block)
    out[at: at + BLOCK] = block
    return bytes(out)


@pytest.fixture
def alarm():
    """A hang fails the test in seconds instead of the suite in 90 minutes."""
    import signal

    def hung(*_):
        raise TimeoutError("the walk did not end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("which", [0, 3])
def test_a_negative_size_ends_the_walk_instead_of_looping(alarm, which):
    """tarfile (3.11) moves back to the same header forever on a negative size: the scan stops
    there and says why, with or without the bulk walk."""
    data = _negative(PLAIN, which)
    _same(data, label="cls")
    record = _index(data, walk=True, label="cls")
    rest = [s for s in record["skipped"] if s["path"].endswith("(rest of the tar)")]
    assert len(rest) == 1 and "negative size (-512)" in rest[0]["reason"]
    assert record["num_samples"] == (which + 1) // 2  # the samples before it are kept


def test_verify_and_analyze_end_on_a_negative_size(alarm, image_folder, tmp_path):
    from dsconvert import convert
    from dsconvert.analyze.detect.details import tar_keys
    from dsconvert.analyze.detect.walk import Store
    from dsconvert.verify import verify

    out = str(tmp_path / "out")
    convert(image_folder, out, format="wds")
    shard = sorted(f for f in os.listdir(out) if f.endswith(".tar"))[0]
    path = os.path.join(out, shard)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(_negative(data, 2))
    report = verify(out)
    assert not report["ok"]
    assert any("negative size" in p["message"] for p in report["problems"])
    summary, why = tar_keys(Store(), path, gz=False)  # analyze's look inside a tar ends too
    assert summary["samples"] == 1
