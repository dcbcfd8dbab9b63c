"""Compressed tar shards (.tar.gz/.tgz from webdataset's ShardWriter(compress=True), .tar.zst,
.tar.bz2, .tar.xz from GNU tar): read in place and converted, sample for sample what
webdataset reads, through their decompressed streams (never unpacked to disk), with damaged and
hostile streams skipped with their reasons and bounded work."""

import glob
import io
import os
import random
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

import dsconvert.io.decompress as decompress
from dsconvert import convert, open_dataset
from dsconvert.io.decompress import DecompressedBytes
from dsconvert.source import scan

from conftest import jpeg_crops

wds = pytest.importorskip("webdataset")

CLASSES = ["cat", "dog", "eel"]


@pytest.fixture
def gz_shards(tmp_path, photos):
    """45 samples (jpg, json, txt, cls) in 3 .tar.gz shards by webdataset's ShardWriter(compress=True)."""
    folder = tmp_path / "gz"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "train-%06d.tar.gz"), maxcount=15, compress=True, verbose=0) as sink:
        for i, jpg in enumerate(jpeg_crops(photos, 45)):
            sink.write({"__key__": f"{i:09d}", "jpg": jpg, "cls": i % 3, "txt": f"caption {i}",
                        "json": {"label": CLASSES[i % 3], "i": i}})
    return str(folder)


def webdataset_samples(urls):
    """What webdataset's own reader gives (it decompresses .tar.gz itself), fields as bytes."""
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in wds.WebDataset(sorted(urls), shardshuffle=False)]


def _gnu_tars(tmp_path, photos, flag, suffix):
    """Two tars by GNU tar, compressed by its own ``flag`` (-z, --zstd, -j, -J)."""
    out = tmp_path / f"gnu{suffix.replace('.', '-')}"
    out.mkdir()
    jpegs = jpeg_crops(photos, 12, seed=1)
    for t in range(2):
        src = tmp_path / f"files{suffix}{t}"
        (src / "part").mkdir(parents=True)
        for i in range(6):
            k = t * 6 + i
            (src / "part" / f"s{k:03d}.jpg").write_bytes(jpegs[k])
            (src / "part" / f"s{k:03d}.cls").write_text(str(k % 2))
        names = sorted(os.path.relpath(p, src) for p in glob.glob(str(src / "part" / "*")))
        subprocess.run(["tar", flag, "-cf", str(out / f"g-{t}{suffix}"), "-C", str(src), *names], check=True)
    return str(out)


# --- read in place ---------------------------------------------------------------------------


def test_shardwriter_tar_gz_read_in_place_as_webdataset_reads_them(gz_shards):
    want = webdataset_samples(glob.glob(os.path.join(gz_shards, "*.tar.gz")))
    assert len(want) == 45
    ds = open_dataset(gz_shards, decode="raw")
    assert len(ds) == 45
    assert [dict(ds[i]) for i in range(len(ds))] == want  # map-style, in order
    assert [dict(s) for s in open_dataset(gz_shards, decode="raw", stream=True)] == want
    shuffled = random.Random(3).sample(range(45), 45)  # random access goes back in the streams
    assert [dict(ds[i]) for i in shuffled] == [want[i] for i in shuffled]
    decoded = open_dataset(gz_shards, decode="numpy")[4]
    assert decoded["jpg"].ndim == 3 and decoded["json"]["i"] == 4 and decoded["txt"] == "caption 4"


def test_open_source_reads_tar_gz_members_where_they_are(gz_shards):
    """The baseline analyze and bench measure against reads members through the stream too."""
    from dsconvert import open_source

    want = webdataset_samples(glob.glob(os.path.join(gz_shards, "*.tar.gz")))
    source = open_source(gz_shards, decode="raw")
    assert [source[i]["jpg"] for i in (0, 44, 3, 17)] == [want[i]["jpg"] for i in (0, 44, 3, 17)]


def test_label_gives_an_image_folder_drop_in_over_tar_gz(gz_shards, torch):
    ds = open_dataset(gz_shards, label="json.label")
    assert ds.classes == CLASSES and len(ds) == 45
    loader = torch.utils.data.DataLoader(open_dataset(gz_shards, label="cls", decode="raw"), batch_size=5,
                                         shuffle=True, num_workers=2, collate_fn=list)
    seen = [label for batch in loader for _, label in batch]
    assert sorted(seen) == sorted(i % 3 for i in range(45))  # every sample once, in a shuffled order
    ranks = [[s["__key__"] for s in open_dataset(gz_shards, decode="raw", shuffle=True, rank=r, world_size=2)]
             for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) and set(ranks[0]) | set(ranks[1]) == {f"{i:09d}" for i in range(45)}


@pytest.mark.parametrize("flag,suffix", [("-z", ".tgz"), ("--zstd", ".tar.zst"), ("-j", ".tar.bz2"),
                                         ("-J", ".tar.xz")])
def test_gnu_tar_compressions_read_in_place_and_convert(tmp_path, photos, flag, suffix):
    if suffix == ".tar.zst":
        pytest.importorskip("zstandard")
    folder = _gnu_tars(tmp_path, photos, flag, suffix)
    plain = tmp_path / "plain"
    plain.mkdir()
    tool = {".tgz": "gzip", ".tar.zst": "zstd", ".tar.bz2": "bzip2", ".tar.xz": "xz"}[suffix]
    for path in sorted(glob.glob(os.path.join(folder, "*"))):  # the same tars, decompressed by the tool: the oracle
        plain_tar = subprocess.run([tool, "-dc", path], capture_output=True, check=True).stdout
        (plain / (os.path.basename(path).split(".")[0] + ".tar")).write_bytes(plain_tar)
    want = webdataset_samples(glob.glob(str(plain / "*.tar")))
    assert len(want) == 12
    assert [dict(s) for s in open_dataset(folder, decode="raw")] == want
    out = tmp_path / "out"
    r = convert(folder, str(out), "wds", workers=2)
    assert r.manifest.accounting["files_written"] == 24 and not r.manifest.skipped
    assert [dict(s) for s in open_dataset(str(out), decode="raw")] == want


# --- convert -----------------------------------------------------------------------------------


def test_cli_converts_tar_gz_byte_exact_with_every_member_accounted(gz_shards, tmp_path):
    from dsconvert.cli import main
    from dsconvert.verify import verify

    assert not list(scan(gz_shards).skipped) and scan(gz_shards).kind == "tar"
    out = tmp_path / "out"
    assert main(["shard", gz_shards, "-o", str(out), "--format", "wds", "--workers", "2", "-q"]) == 0
    want = webdataset_samples(glob.glob(os.path.join(gz_shards, "*.tar.gz")))
    assert [dict(s) for s in open_dataset(str(out), decode="raw")] == want
    report = verify(str(out), source=gz_shards)
    assert report["ok"] and report["source"]["missing"] == report["source"]["changed"] == []
    one = tmp_path / "one"
    convert(gz_shards, str(one), "wds", workers=1)
    assert _shard_bytes(one) == _shard_bytes(out)  # the same bytes for any number of workers
    lab = tmp_path / "lab"
    assert main(["shard", gz_shards, "-o", str(lab), "--format", "npy", "--label", "cls", "-q"]) == 0
    assert [label for _, label in open_dataset(str(lab), decode="numpy")] == [i % 3 for i in range(45)]


def _shard_bytes(out):
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(out, "shard-*")))}


def test_a_folder_of_tar_gz_is_no_longer_packed_as_gz_files(gz_shards, tmp_path):
    """The reported failure: a folder of .tar.gz shards was taken for a flat folder of files."""
    r = convert(gz_shards, str(tmp_path / "out"), "wds", workers=1)
    assert r.manifest.source["layout"] == "tars" and r.manifest.num_samples == 45
    assert set(r.manifest.fields) == {"cls", "jpg", "json", "txt"}


def test_compression_is_known_by_its_bytes_not_its_name(gz_shards, tmp_path):
    folder = tmp_path / "named"
    folder.mkdir()
    first = sorted(glob.glob(os.path.join(gz_shards, "*.tar.gz")))[0]
    shutil.copy(first, folder / "a.tar")  # gzip bytes under a plain name
    with tarfile.open(first) as tf, tarfile.open(folder / "b.tar.gz", "w") as plain:  # plain bytes, a .gz name
        for m in tf:
            plain.addfile(m, tf.extractfile(m))
    got = [dict(s) for s in open_dataset(str(folder), decode="raw")]
    want = webdataset_samples([first])
    assert got == want + want


# --- damaged and hostile streams -------------------------------------------------------------


def test_a_truncated_tar_gz_keeps_what_precedes_the_cut(gz_shards, tmp_path):
    folder = tmp_path / "cut"
    folder.mkdir()
    first = sorted(glob.glob(os.path.join(gz_shards, "*.tar.gz")))[0]
    data = open(first, "rb").read()
    (folder / "x.tar.gz").write_bytes(data[: len(data) // 2])
    source = scan(str(folder))
    kept = [s.key for s in source.samples]
    want = [s["__key__"] for s in webdataset_samples([first])]
    assert 0 < len(kept) < len(want) and kept == want[: len(kept)]
    reasons = [s.reason for s in source.skipped]
    assert any("gzip stream ends before its end" in r or "truncated" in r for r in reasons), reasons
    r = convert(str(folder), str(tmp_path / "out"), "wds", workers=1)
    acc = r.manifest.accounting
    assert acc["files_seen"] == acc["files_written"] + acc["files_skipped"]
    with pytest.warns(UserWarning, match="not read"):
        ds = open_dataset(str(folder), decode="raw")
    assert [s["__key__"] for s in ds] == kept


def test_corrupt_compressed_bytes_are_a_reason_not_a_crash(gz_shards, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    first = sorted(glob.glob(os.path.join(gz_shards, "*.tar.gz")))[0]
    data = bytearray(open(first, "rb").read())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    (folder / "x.tar.gz").write_bytes(bytes(data))
    (folder / "y.tar.gz").write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(300))
    (folder / "z.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(300))
    source = scan(str(folder))
    reasons = {s.path.split("/")[0]: s.reason for s in source.skipped}
    assert set(reasons) >= {"x.tar.gz", "y.tar.gz", "z.tar.zst"}, reasons
    assert all(r for r in reasons.values())
    r = convert(str(folder), str(tmp_path / "out"), "wds", workers=1)
    acc = r.manifest.accounting
    assert acc["files_seen"] == acc["files_written"] + acc["files_skipped"]


def _plain_tar(tmp_path, n=12, size=3000):
    """A plain tar of ``n`` samples (bin + cls) of ``size`` random bytes each, and its samples."""
    buf = io.BytesIO()
    rng = random.Random(5)
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(n):
            text = " ".join(rng.choice(CLASSES) for _ in range(size // 8)).encode()  # compresses, as captions do
            for field, data in (("bin", rng.randbytes(size // 2)), ("txt", text), ("cls", str(i % 2).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{field}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    path = tmp_path / "plain" / "x.tar"
    path.parent.mkdir()
    path.write_bytes(buf.getvalue())
    return buf.getvalue(), webdataset_samples([str(path)])


SUFFIX = {"gzip": ".tar.gz", "zstd": ".tar.zst", "bzip2": ".tar.bz2", "xz": ".tar.xz"}


def _compress(kind, data):
    import bz2
    import gzip
    import lzma

    if kind == "zstd":
        return pytest.importorskip("zstandard").ZstdCompressor(write_checksum=True).compress(data)
    return {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}[kind](data)


@pytest.mark.parametrize("kind", ["gzip", "zstd", "bzip2", "xz"])
def test_a_cut_stream_keeps_the_samples_before_the_cut_and_says_so(tmp_path, kind):
    """Every compression: a stream cut at 90% keeps a prefix of the samples with a reason,
    never silently fewer (zstandard's stream reader ends quietly at a cut frame)."""
    raw, want = _plain_tar(tmp_path, n=60)
    comp = _compress(kind, raw)
    for tenths in range(1, 10):
        folder = tmp_path / f"cut{tenths}"
        folder.mkdir()
        (folder / ("x" + SUFFIX[kind])).write_bytes(comp[: len(comp) * tenths // 10])
        try:
            source = scan(str(folder))
        except Exception as exc:  # nothing readable at all: one line that says why
            assert "truncated" in str(exc) or "ends before its end" in str(exc), exc
            continue
        keys = [s.key for s in source.samples]
        assert keys == [w["__key__"] for w in want[: len(keys)]]
        reasons = [s.reason for s in source.skipped]
        assert any("truncated" in r or "ends before its end" in r for r in reasons), (tenths, reasons)


@pytest.mark.parametrize("kind", ["gzip", "zstd", "bzip2", "xz"])
def test_a_flipped_bit_never_gives_wrong_bytes(tmp_path, kind):
    """A bit flipped anywhere in the compressed data: whatever the walk stops at (a damaged tar
    header, a decoding error), every sample kept is byte-exact; the member of the stream that
    fails its checksum is not trusted, even the bytes that decompress."""
    raw, want = _plain_tar(tmp_path, n=150)  # a stream of several reads (a flip and its check in different ones)
    comp = _compress(kind, raw)
    rng = random.Random(kind)
    for trial in range(20):
        folder = tmp_path / f"flip{trial}"
        folder.mkdir()
        damaged = bytearray(comp)
        at = rng.randrange(20, len(comp) - 20)
        damaged[at] ^= 1 << rng.randrange(8)
        (folder / ("x" + SUFFIX[kind])).write_bytes(bytes(damaged))
        source = scan(str(folder))
        if not source.samples:
            continue
        got = [dict(s) for s in open_dataset(str(folder), decode="raw")] if source.samples else []
        by_key = {w["__key__"]: w for w in want}
        for sample in got:
            full = by_key[sample["__key__"]]
            assert all(sample[f] == full[f] for f in sample if f != "__key__"), (kind, at, sample["__key__"])


def test_skippable_frames_and_padding_are_valid_streams(tmp_path):
    """pzstd writes a skippable frame first; xz allows zero padding after a stream; gzip and
    xz streams may follow one another."""
    import lzma
    import struct

    zstandard = pytest.importorskip("zstandard")
    raw, want = _plain_tar(tmp_path)
    cut = len(raw) // 2
    files = {
        "pzstd.tar.zst": struct.pack("<II", 0x184D2A50, 4) + b"abcd" + zstandard.ZstdCompressor().compress(raw),
        "padded.tar.xz": lzma.compress(raw) + bytes(8),
        "two.tar.xz": lzma.compress(raw[:cut]) + lzma.compress(raw[cut:]),
        "frames.tar.zst": b"".join(zstandard.ZstdCompressor().compress(part) for part in (raw[:cut], raw[cut:])),
    }
    for name, data in files.items():
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_bytes(data)
        assert [dict(s) for s in open_dataset(str(folder), decode="raw")] == want, name


def test_a_forked_process_reads_a_stream_through_a_file_of_its_own(tmp_path):
    """A process forked while the parent's stream is open, the parent reading on: the child's
    reads are the tar's bytes (a descriptor shared across fork shares its offset)."""
    import gzip

    from dsconvert.inputs.tars import OpenTar
    from dsconvert.io.location import Location

    raw, _ = _plain_tar(tmp_path, n=150)
    (tmp_path / "x.tar.gz").write_bytes(gzip.compress(raw))
    tar = OpenTar(Location(str(tmp_path), flat=False), "x.tar.gz")
    assert tar.read(1000, 5000) == raw[1000:6000]
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: waits until the parent has read on, then reads
        os.read(go_r, 1)
        spans = [(7000, 3000), (len(raw) // 2, 4096), (100, 50), (len(raw) - 5000, 5000)]
        os._exit(0 if all(tar.read(o, n) == raw[o: o + n] for o, n in spans) else 1)
    assert tar.read(len(raw) - 20000, 10000) == raw[len(raw) - 20000: len(raw) - 10000]
    os.write(go_w, b"x")
    assert os.waitpid(pid, 0)[1] == 0
    tar.close()


def test_a_forked_dataloader_reads_streams_the_parent_opened(gz_shards, torch):
    """Workers forked after the parent read a sample (its stream open, at an offset) each read
    through a file of their own: open_source and open_dataset alike."""
    from dsconvert import open_source

    want = {w["__key__"]: w["jpg"] for w in webdataset_samples(glob.glob(os.path.join(gz_shards, "*.tar.gz")))}
    for ds in (open_source(gz_shards, decode="raw"), open_dataset(gz_shards, decode="raw")):
        ds[7]  # the parent's stream is open, mid-file
        loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=list,
                                             multiprocessing_context="fork")
        got = {s["__key__"]: s["jpg"] for batch in loader for s in batch}
        assert got == want


BOMB = textwrap.dedent("""
    import gzip, io, os, sys, tarfile
    sys.path.insert(0, {root!r})
    folder = {folder!r}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("a.txt"); info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    zeros = gzip.compress(bytes(64 << 20), 9)  # gzip members in a row: 2 GiB of zeros in about 2 MB
    with open(os.path.join(folder, "bomb.tar.gz"), "wb") as f:
        f.write(gzip.compress(buf.getvalue()) + zeros * 32)
    pax = tarfile.TarInfo("b.txt"); pax.size = 1
    huge = tarfile.TarInfo("././@PaxHeader"); huge.type = tarfile.XHDTYPE; huge.size = 1 << 40
    with gzip.open(os.path.join(folder, "pax.tar.gz"), "wb") as f:  # a PAX header declaring a terabyte
        f.write(huge.tobuf(tarfile.GNU_FORMAT) + bytes(1 << 20))
    from dsconvert.source import scan
    source = scan(folder)
    print([s.key for s in source.samples])
    print(sorted(s.path for s in source.skipped))
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            print(int(line.split()[1]) // 1024)
""")


def test_zeros_and_huge_headers_in_a_stream_cost_bounded_work(tmp_path):
    """A 2 MB gzip holding 2 GiB of zeros after its archive, and a PAX header declaring a
    terabyte: scanned in bounded memory, the archive's member kept, the bad tar skipped."""
    folder = tmp_path / "bombs"
    folder.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", BOMB.format(root=root, folder=str(folder))], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0] == "['a']"
    assert "pax.tar.gz" in out[1]
    assert int(out[2]) < 400, out  # MiB: neither the zeros nor the declared terabyte were held


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_span_of_any_stream_is_its_bytes(data):
    """``get`` in any order equals slicing the decompressed bytes: forward, kept bytes, gzip
    checkpoints and restarts alike (small settings so that every path is taken)."""
    import bz2
    import gzip

    kind = data.draw(st.sampled_from(["gzip", "gzip-members", "bzip2"]))
    rng = random.Random(data.draw(st.integers(0, 1000)))
    raw = bytes(rng.getrandbits(8) for _ in range(30000)) + bytes(rng.randrange(4) for _ in range(90000))
    if kind == "gzip":
        comp = gzip.compress(raw)
    elif kind == "gzip-members":
        cut = rng.randrange(len(raw))
        comp = gzip.compress(raw[:cut]) + b"\0" * rng.randrange(3) + gzip.compress(raw[cut:])
    else:
        comp = bz2.compress(raw)
    saved = (decompress.CHECKPOINT_EVERY, decompress.KEEP_BEHIND, decompress._CHUNK, decompress._PIECE,
             decompress.MAX_CHECKPOINTS)
    (decompress.CHECKPOINT_EVERY, decompress.KEEP_BEHIND, decompress._CHUNK, decompress._PIECE,
     decompress.MAX_CHECKPOINTS) = 4096, 2048, 512, 1024, data.draw(st.sampled_from([3, 1000]))
    try:
        src = DecompressedBytes(lambda: io.BytesIO(comp), "gzip" if kind.startswith("gzip") else kind)
        for _ in range(data.draw(st.integers(1, 12))):
            offset = data.draw(st.integers(0, len(raw)))
            n = data.draw(st.integers(0, 20000))
            assert src.read_at(offset, n) == raw[offset: offset + n]
    finally:
        (decompress.CHECKPOINT_EVERY, decompress.KEEP_BEHIND, decompress._CHUNK, decompress._PIECE,
         decompress.MAX_CHECKPOINTS) = saved


def test_a_changed_tar_gz_is_indexed_again(gz_shards, photos):
    ds = open_dataset(gz_shards, decode="raw")
    assert len(ds) == 45
    last = sorted(glob.glob(os.path.join(gz_shards, "*.tar.gz")))[-1]
    with wds.ShardWriter(last.replace("000002", "%06d"), maxcount=100, compress=True, verbose=0,
                         start_shard=2) as sink:
        for i, jpg in enumerate(jpeg_crops(photos, 4, seed=9)):
            sink.write({"__key__": f"new{i}", "jpg": jpg, "cls": 0})
    again = open_dataset(gz_shards, decode="raw")
    assert len(again) == 34 and [s["__key__"] for s in again][-4:] == [f"new{i}" for i in range(4)]


@pytest.mark.system
def test_remote_tar_gz_read_and_converted(gz_shards, s3, tmp_path, monkeypatch):
    monkeypatch.setenv("DSCONVERT_CACHE", str(tmp_path / "cache"))
    shutil.rmtree(os.path.join(gz_shards, ".dsconvert-index"), ignore_errors=True)
    url = s3.put_tree(gz_shards, "gz")
    want = webdataset_samples(glob.glob(os.path.join(gz_shards, "*.tar.gz")))
    assert [dict(s) for s in open_dataset(url, decode="raw", storage_options=s3.options)] == want
    out = tmp_path / "out"
    convert(url, str(out), "wds", storage_options=s3.options, workers=1)
    assert [dict(s) for s in open_dataset(str(out), decode="raw")] == want


def test_the_label_member_is_kept_as_the_label_and_other_members_are_said(gz_shards, tmp_path):
    """--label cls keeps the cls member (as the label): not listed as a member not kept; the
    jpg's other members are, and so is a JSON member whose one key is the label."""
    by_cls = convert(gz_shards, str(tmp_path / "cls"), "wds", label="cls", workers=1).manifest.ignored
    assert [entry["reason"].split(":")[0] for entry in by_cls] == ["members not kept (15 json, 15 txt)"] * 3
    by_json = convert(gz_shards, str(tmp_path / "json"), "wds", label="json.label", workers=1).manifest.ignored
    assert all("15 cls, 15 json, 15 txt" in entry["reason"] for entry in by_json)
