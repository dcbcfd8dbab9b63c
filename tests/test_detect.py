"""dsconvert.analyze.detect: what a path holds, from headers, written by the real writers of each
format where they are installed, and never an exception on damaged or hostile bytes."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import tarfile
import zipfile

import numpy as np
import pytest

from dsconvert import convert
from dsconvert.analyze.detect import (
    KINDS,
    Detected,
    classify as detect_classify,
    crc32c,
    detect,
    limits as detect_limits,
    masked_crc32c,
    walk as detect_walk,
)
from dsconvert.optional import optional_import

from conftest import make_image_folder, write

LAST_RESORT = "could not be recognised ("  # detect's catch-all: reaching it is a bug in a parser here


@pytest.fixture(scope="module")
def small_src(tmp_path_factory, photos):
    root = str(tmp_path_factory.mktemp("detect") / "src")
    make_image_folder(root, photos, {"cat": 3, "dog": 2}, size=(32, 24))
    return root


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, small_src):
    """One dsconvert output of each format (hdf5 twice: encoded and decoded)."""
    base = tmp_path_factory.mktemp("outputs")
    made = {}
    for name, fmt, extra in (("wds", "wds", {}), ("hdf5", "hdf5", {}),
                             ("hdf5-decoded", "hdf5", {"decode": True, "size": (16, 16)}),
                             ("npy", "npy", {"size": (16, 20)})):
        made[name] = (str(base / name), convert(small_src, str(base / name), fmt, workers=1, samples_per_shard=3,
                                                **extra).manifest)
    return made


def copy_output(outputs, name, tmp_path):
    dst = str(tmp_path / name)
    shutil.copytree(outputs[name][0], dst)
    return dst


# --- CRC32C ----------------------------------------------------------------------------------

def test_crc32c_known_vectors():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"\x00" * 32) == 0x8A9136AA  # RFC 3720, B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(b"") == 0
    crc = crc32c(b"123456789")
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- dsconvert outputs -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["wds", "hdf5", "hdf5-decoded", "npy"])
def test_dsconvert_output_is_named_with_its_manifest(outputs, name):
    out, manifest = outputs[name]
    d = detect(out)
    assert isinstance(d, Detected)
    assert d.kind == "dsconvert"
    assert d.format == manifest.format
    assert d.num_samples == manifest.num_samples == 5
    assert d.reader == "dsconvert.open_dataset"
    assert d.convertible is False
    assert d.files == [os.path.join(out, s.name) for s in manifest.shards]
    assert all(os.path.exists(f) for f in d.files)
    assert d.description.startswith(f"a dsconvert {manifest.format} output: 5 samples in 2 shards")
    assert "2 classes" in d.description
    assert not d.damaged and not d.others
    if name == "npy":
        assert "16x20 uint8 RGB" in d.description
    elif name == "hdf5-decoded":
        assert "16x16 uint8 RGB" in d.description
    else:
        assert "encoded" in d.description and "jpg" in d.description


def test_dsconvert_output_with_stray_files(outputs, tmp_path):
    out = copy_output(outputs, "npy", tmp_path)
    with open(os.path.join(out, "notes.pkl"), "wb") as f:
        pickle.dump({"x": 1}, f)
    write(os.path.join(out, "README.txt"), b"made by hand\n")
    d = detect(out)
    assert d.kind == "dsconvert" and d.format == "npy" and d.num_samples == 5
    assert d.others == {"pickle": 1, "files": 1}
    assert "2 files not in the manifest" in d.description and "notes.pkl" in d.description


def test_dsconvert_output_with_a_missing_shard(outputs, tmp_path):
    out = copy_output(outputs, "wds", tmp_path)
    os.remove(os.path.join(out, "shard-000001.tar"))
    d = detect(out)
    assert d.kind == "dsconvert"
    assert d.damaged == ["shard-000001.tar: missing"]
    assert "missing" in d.description


@pytest.mark.parametrize("text", [b"{not json", b"[]", json.dumps({"schema_version": 1}).encode(), b"[" * 100000])
def test_broken_manifest_falls_back_to_the_content(outputs, tmp_path, text):
    out = copy_output(outputs, "wds", tmp_path)
    write(os.path.join(out, "dsconvert.json"), text)
    d = detect(out)
    assert d.kind == "webdataset"
    assert d.num_samples == 5
    assert "not a valid manifest" in d.description
    assert any(x.startswith("dsconvert.json: ") for x in d.damaged)


def test_shards_without_manifest_are_recognised_by_content(outputs, tmp_path):
    out = copy_output(outputs, "hdf5", tmp_path)
    os.remove(os.path.join(out, "dsconvert.json"))
    d = detect(out)
    assert d.kind == "hdf5" and d.num_samples == 5
    assert "written by dsconvert, without its manifest" in d.description
    assert d.others == {"files": 2}  # the two index.json files


# --- WebDataset ------------------------------------------------------------------------------

def test_webdataset_shardwriter_output(tmp_path):
    wds = pytest.importorskip("webdataset")
    pattern = str(tmp_path / "shards" / "train-%03d.tar")
    os.makedirs(tmp_path / "shards")
    with wds.ShardWriter(pattern, maxcount=4, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"s{i:04d}", "jpg": b"\xff\xd8\xff" + bytes(20), "cls": str(i % 3).encode()})
    d = detect(str(tmp_path / "shards"))
    assert d.kind == "webdataset"
    assert len(d.files) == 3
    assert d.num_samples == 10
    assert "3 tar files, 10 samples of" in d.description and "cls" in d.description and "jpg" in d.description
    assert d.reader == "webdataset.WebDataset" and d.convertible is False


def test_gnu_tar_groups_members_by_key_up_to_the_first_dot(tmp_path):
    if not shutil.which("tar"):
        pytest.skip("no tar program")
    src = tmp_path / "members"
    for key in ("a", "b", "c"):
        write(str(src / "dir" / f"{key}.seg.jpg"), b"\xff\xd8\xff" + bytes(10))
        write(str(src / "dir" / f"{key}.seg.json"), b"{}")
    subprocess.run(["tar", "--sort=name", "-cf", str(tmp_path / "plain.tar"), "-C", str(src), "dir"], check=True)
    subprocess.run(["tar", "--sort=name", "-czf", str(tmp_path / "zipped.tar.gz"), "-C", str(src), "dir"], check=True)
    for name in ("plain.tar", "zipped.tar.gz"):
        d = detect(str(tmp_path / name))
        assert d.kind == "webdataset", name
        assert d.num_samples == 3, name  # dir/a.seg.jpg and dir/a.seg.json: key dir/a, field seg.jpg
        assert "seg.jpg" in d.description and "seg.json" in d.description
    assert "tar.gz" in detect(str(tmp_path / "zipped.tar.gz")).description
    # members of one key apart: webdataset groups consecutive members, so it yields more samples
    unsorted = tmp_path / "unsorted.tar"
    with tarfile.open(unsorted, "w") as tf:
        for name in ("dir/a.seg.jpg", "dir/b.seg.jpg", "dir/a.seg.json", "dir/b.seg.json"):
            tf.add(str(src / name), name)
    d = detect(str(unsorted))
    assert d.num_samples == 4 and "2 keys recur" in d.description


# --- HDF5 ------------------------------------------------------------------------------------

def test_hdf5_datasets_from_metadata(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = str(tmp_path / "train.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.zeros((12, 8, 8, 3), np.uint8), chunks=(1, 8, 8, 3), compression="gzip")
        f.create_dataset("labels", data=np.arange(12))
    d = detect(path)
    assert d.kind == "hdf5" and d.num_samples == 12 and d.reader == "h5py"
    assert "'images' (12, 8, 8, 3) uint8 chunked (1, 8, 8, 3), gzip" in d.description
    assert "'labels' (12,) int64 contiguous" in d.description
    assert "gzip" in d.advice


def test_hdf5_after_a_user_block_and_without_its_extension(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = str(tmp_path / "data.bin")
    with h5py.File(path, "w", userblock_size=1024) as f:
        f.create_dataset("x", data=np.zeros((4, 5), np.float32), chunks=(2, 5))
    d = detect(path)
    assert d.kind == "hdf5" and d.num_samples == 4
    assert "chunk of 2" in d.advice


# --- npy / npz / pickle ----------------------------------------------------------------------

def test_npy_file_and_folders(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros((7, 4, 4, 3), np.uint8))
    d = detect(str(tmp_path / "one.npy"))
    assert d.kind == "npy" and d.num_samples == 7 and "(7, 4, 4, 3) uint8" in d.description
    assert "mmap_mode='r'" in d.reader and "would not make reading faster" in d.advice

    per_sample = tmp_path / "decoded"
    per_sample.mkdir()
    for i in range(6):
        np.save(per_sample / f"{i:03d}.npy", np.zeros((4, 4, 3), np.uint8))
    d = detect(str(per_sample))
    assert d.kind == "npy" and d.num_samples == 6 and "each (4, 4, 3) uint8" in d.description
    assert d.convertible is False

    xy = tmp_path / "xy"
    xy.mkdir()
    np.save(xy / "X.npy", np.zeros((9, 2), np.float32))
    np.save(xy / "y.npy", np.zeros((9,), np.int64))
    d = detect(str(xy))
    assert d.kind == "npy" and d.num_samples == 9


def test_object_npy_is_not_loaded(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    d = detect(str(tmp_path / "obj.npy"))
    assert d.kind == "npy" and "pickled Python objects" in d.description and "runs code" in d.advice


def test_npz_members_read_from_their_headers(tmp_path):
    np.savez_compressed(tmp_path / "arrays.npz", images=np.zeros((5, 3, 3), np.uint8), labels=np.arange(5))
    d = detect(str(tmp_path / "arrays.npz"))
    assert d.kind == "npz" and d.num_samples == 5
    assert "images (5, 3, 3) uint8" in d.description and "labels (5,) int64" in d.description


def test_pickles_and_torch_saves(tmp_path, torch):
    with open(tmp_path / "a.pkl", "wb") as f:
        pickle.dump([1, 2, 3], f)
    with open(tmp_path / "old.pickle", "wb") as f:
        pickle.dump([1, 2, 3], f, protocol=0)
    torch.save({"x": torch.zeros(3)}, str(tmp_path / "t.pt"))
    for name in ("a.pkl", "old.pickle", "t.pt"):
        d = detect(str(tmp_path / name))
        assert d.kind == "pickle", name
        assert "np.save" in d.advice
    assert "torch.save zip" in detect(str(tmp_path / "t.pt")).description
    # content, not the name: a protocol-2+ pickle under another name
    shutil.copy(tmp_path / "a.pkl", tmp_path / "a.dat")
    assert detect(str(tmp_path / "a.dat")).kind == "pickle"


# --- Parquet / Arrow -------------------------------------------------------------------------

def test_parquet_magic_from_bytes(tmp_path):
    body = b"\x15\x00" * 8  # not a real footer: the magic and the footer length are what is checked here
    path = write(str(tmp_path / "t.parquet"), b"PAR1" + b"\x00" * 20 + body + struct.pack("<I", len(body)) + b"PAR1")
    d = detect(path)
    assert d.kind == "parquet"
    if optional_import("pyarrow") is None:
        assert "rows unknown (pyarrow is not installed" in d.description and not d.damaged
    else:
        assert d.damaged  # pyarrow refuses the made-up footer
    shutil.copy(path, tmp_path / "renamed.bin")
    assert detect(str(tmp_path / "renamed.bin")).kind == "parquet"


def test_parquet_rows_from_the_footer(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"image": [{"bytes": b"x", "path": "a"}] * 30, "label": list(range(30))})
    folder = tmp_path / "pq"
    folder.mkdir()
    for i in range(3):
        pq.write_table(table, str(folder / f"part-{i}.parquet"))
    d = detect(str(folder))
    assert d.kind == "parquet" and d.num_samples == 90
    assert "Parquet: 3 files, 90 rows, columns image{bytes,path}, label" == d.description


def test_arrow_magic_from_bytes(tmp_path):
    path = write(str(tmp_path / "t.feather"), b"ARROW1\x00\x00" + b"\x00" * 32 + b"ARROW1")
    assert detect(path).kind == "arrow"
    stream = write(str(tmp_path / "data-00000-of-00001.arrow"), b"\xff\xff\xff\xff" + struct.pack("<i", 16) + bytes(40))
    assert detect(stream).kind == "arrow"


def test_arrow_file_and_stream_written_by_pyarrow(tmp_path):
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"x": list(range(25)), "label": [1] * 25})
    with pa.OSFile(str(tmp_path / "f.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pa.OSFile(str(tmp_path / "s.bin"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    d = detect(str(tmp_path / "f.arrow"))
    assert d.kind == "arrow" and d.num_samples == 25 and "columns x, label" in d.description
    s = detect(str(tmp_path / "s.bin"))
    assert s.kind == "arrow" and s.num_samples is None and "columns x, label" in s.description


# --- LMDB ------------------------------------------------------------------------------------

def _lmdb_meta(txnid: int, entries: int, psize: int = 4096) -> bytes:
    """One LMDB meta page as a 64-bit little-endian build writes it (checked against the
    lmdb package's own files: magic at 16, the page size in mm_dbs[0].md_pad, the main DB's
    md_entries at 16+24+48+32, mm_txnid at 16+128)."""
    page = bytearray(psize)
    struct.pack_into("<QHH", page, 0, txnid % 2, 0, 0x08)  # pgno, pad, P_META
    m = 16
    struct.pack_into("<II", page, m, 0xBEEFC0DE, 1)
    struct.pack_into("<I", page, m + 24, psize)
    struct.pack_into("<Q", page, m + 24 + 48 + 32, entries)
    struct.pack_into("<Q", page, m + 128, txnid)
    return bytes(page)


def test_lmdb_from_its_meta_pages(tmp_path):
    env = tmp_path / "env"
    env.mkdir()
    write(str(env / "data.mdb"), _lmdb_meta(4, 11) + _lmdb_meta(5, 12) + bytes(4096))
    write(str(env / "lock.mdb"), bytes(8192))
    d = detect(str(env))
    assert d.kind == "lmdb" and d.num_samples == 12  # the later transaction's meta page
    assert d.files == [str(env / "data.mdb")]
    write(str(env / "data.mdb"), bytes(3 * 4096))
    bad = detect(str(env))
    assert bad.kind == "lmdb" and "damaged" in bad.description


def test_lmdb_written_by_the_lmdb_package(tmp_path):
    lmdb = pytest.importorskip("lmdb", reason="the lmdb package is not installed")
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i in range(17):
            txn.put(f"{i:05d}".encode(), b"v" * 100)
    env.close()
    d = detect(str(tmp_path / "env"))
    assert d.kind == "lmdb" and d.num_samples == 17


# --- TFRecord --------------------------------------------------------------------------------

def tfrecord_bytes(records) -> bytes:
    """TFRecord framing: uint64 length, masked crc32c(length), data, masked crc32c(data)."""
    out = b""
    for data in records:
        length = struct.pack("<Q", len(data))
        out += length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))
    return out


def test_tfrecord_by_its_framing(tmp_path):
    folder = tmp_path / "tfr"
    for i in range(4):
        write(str(folder / f"train-{i:05d}-of-00004"), tfrecord_bytes([b"example %d" % j for j in range(3)]))
    d = detect(str(folder))
    assert d.kind == "tfrecord" and len(d.files) == 4 and d.description.startswith("TFRecord: 4 files")
    assert not d.damaged
    data = bytearray(tfrecord_bytes([b"hello"]))
    data[14] ^= 0xFF  # the first record's data
    d = detect(write(str(tmp_path / "bad.tfrecord"), bytes(data)))
    assert d.kind == "tfrecord" and "data CRC does not match" in d.description
    data = bytearray(tfrecord_bytes([b"hello"]))
    data[8] ^= 0x01  # the length's CRC: no longer a TFRecord by content
    assert detect(write(str(tmp_path / "x.bin"), bytes(data))).kind == "unknown"
    assert "damaged" in detect(write(str(tmp_path / "y.tfrecord"), bytes(data))).description


# --- loose files -----------------------------------------------------------------------------

def test_image_folder_and_lists_are_convertible(small_src, tmp_path):
    d = detect(small_src)
    assert d.kind == "files" and d.convertible is True and d.num_samples == 5
    assert d.description.startswith("an ImageFolder tree: 5 files (5 jpg), 5 samples, 2 classes")
    rows = [f"{os.path.join(small_src, 'cat', n)},0" for n in sorted(os.listdir(os.path.join(small_src, "cat")))]
    lst = write(str(tmp_path / "train.csv"), ("\n".join(rows) + "\n").encode())
    d = detect(lst)
    assert d.kind == "files" and d.convertible is True and d.num_samples == 3 and "train.csv" in d.description
    flat = tmp_path / "flat"
    for i in range(3):
        write(str(flat / f"{i}.jpg"), open(os.path.join(small_src, "cat", "cat_0000.jpg"), "rb").read())
        write(str(flat / f"{i}.json"), b"{}")
    d = detect(str(flat))
    assert d.kind == "files" and d.num_samples == 3 and d.description.startswith("a flat folder of files")


def test_a_folder_the_scanner_refuses_is_not_convertible(tmp_path):
    write(str(tmp_path / "f" / "README"), b"no extension")
    d = detect(str(tmp_path / "f"))
    assert d.kind == "files" and d.convertible is False and d.damaged
    assert "dsconvert's scanner refuses it (no samples found" in d.description


def test_mixed_folder_names_the_dominant_kind_and_the_rest(tmp_path):
    for i in range(4):
        np.save(tmp_path / f"{i}.npy", np.zeros((64, 64), np.float32))
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump([1], f)
    write(str(tmp_path / "notes.txt"), b"x")
    d = detect(str(tmp_path))
    assert d.kind == "npy" and d.num_samples == 4
    assert d.others == {"pickle": 1, "files": 1}
    assert "also 1 other file, 1 pickle file" in d.description


def test_empty_and_missing_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    assert detect(str(tmp_path / "empty")).kind == "unknown"
    d = detect(str(tmp_path / "nowhere"))
    assert d.kind == "unknown" and "cannot read" in d.description


# --- bounded reading -------------------------------------------------------------------------

class CountingStore(detect_walk.Store):
    read_bytes = 0
    opened = 0

    def open(self, path):
        CountingStore.opened += 1
        f = super().open(path)
        real_read = f.read

        def read(n=-1):
            assert n is not None and n >= 0, "a whole-file read"
            data = real_read(n)
            CountingStore.read_bytes += len(data)
            return data
        f.read = read
        return f


def test_reads_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(detect_classify, "Store", CountingStore)
    CountingStore.read_bytes = CountingStore.opened = 0
    np.save(tmp_path / "big.npy", np.zeros((8 << 20,), np.uint8))
    for i in range(40):
        np.save(tmp_path / f"s{i:03d}.npy", np.zeros((8 << 20,), np.uint8)[:1000])
    d = detect(str(tmp_path))
    assert d.kind == "npy"
    assert CountingStore.opened <= detect_limits.SNIFF_PER_GROUP * 2
    assert CountingStore.read_bytes < 1 << 20  # 8 MiB of array, a few KiB read
    assert d.num_samples is None  # not every file was read: no exact count


def test_a_big_folder_is_listed_in_part(tmp_path, monkeypatch):
    monkeypatch.setattr(detect_limits, "MAX_ENTRIES", 10)
    for i in range(30):
        np.save(tmp_path / f"{i:03d}.npy", np.zeros(3, np.uint8))
    d = detect(str(tmp_path))
    assert d.kind == "npy" and d.complete is False and len(d.files) == 10
    assert "the listing stops at 10 entries (a cap): the counts before are of the first 10 entries" in d.description


def test_symlinks_out_of_the_tree_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    np.save(outside / "secret.npy", np.zeros(3))
    tree = tmp_path / "tree"
    tree.mkdir()
    np.save(tree / "a.npy", np.zeros(3))
    os.symlink(outside / "secret.npy", tree / "link.npy")
    os.symlink(outside, tree / "linked_dir")
    os.symlink(tree, tree / "loop")
    d = detect(str(tree))
    assert d.kind == "npy" and d.files == [str(tree / "a.npy")]
    assert "2 symlinks out of the tree not followed" in d.description


def test_fsspec_file_system(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    buf = io.BytesIO()
    np.save(buf, np.zeros((3, 2), np.int16))
    for i in range(2):
        with fs.open(f"/detect-test/arr{i}.npy", "wb") as f:
            f.write(buf.getvalue())
    try:
        d = detect("/detect-test", fs=fs)
        assert d.kind == "npy" and d.num_samples == 2 and "(3, 2) int16" in d.description
    finally:
        fs.rm("/detect-test", recursive=True)


# --- hostile bytes ---------------------------------------------------------------------------

def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _tar_bytes(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _h5_bytes(tmp_path) -> bytes:
    h5py = pytest.importorskip("h5py")
    path = str(tmp_path / "real.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((50, 50)))
    return open(path, "rb").read()


def _npz_bytes() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros((100, 10)))
    return buf.getvalue()


def _zip_claiming_a_huge_directory() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.npy", _npy(np.zeros(2)))
    data = bytearray(buf.getvalue())
    at = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HHI", data, at + 8, 0xFFF0, 0xFFF0, 0x7FFFFFF0)  # entries, directory size
    return bytes(data)


def _noise(n: int) -> bytes:
    """``n`` bytes of seeded noise: the same garbage every run (os.urandom made this suite flaky:
    64 random bytes are now and then a valid pickle)."""
    import random

    return random.Random(n).randbytes(n)


def _hostile(tmp_path):
    big_header = _npy(np.zeros((1000, 100), np.uint8))
    lying_npy = bytearray(_npy(np.zeros((4,), np.uint8)))
    lying_npy[lying_npy.index(b"(4,)"):lying_npy.index(b"(4,)") + 4] = b"(9**9**9,)"[:4]
    tar = _tar_bytes([("a.jpg", b"x" * 3000), ("a.cls", b"1"), ("b.jpg", b"y" * 3000)])
    lying_tar = bytearray(tar)
    lying_tar[124:136] = b"77777777777\x00"  # the first member's size: far past the end
    chk = sum(lying_tar[:148]) + 8 * 32 + sum(lying_tar[156:512])
    lying_tar[148:156] = b"%06o\x00 " % chk
    h5 = _h5_bytes(tmp_path)
    npz = _npz_bytes()
    record = tfrecord_bytes([b"abc"])
    lying_tfr = struct.pack("<Q", 1 << 60)
    lying_tfr += struct.pack("<I", masked_crc32c(lying_tfr)) + b"abc"
    return {
        "trunc.npy": big_header[:len(big_header) // 2],
        "lying.npy": bytes(lying_npy),
        "header-only.npy": big_header[:10],
        "garbage.npy": _noise(500),
        "trunc.h5": h5[:200],
        "garbage.h5": b"\x89HDF\r\n\x1a\n" + _noise(2000),
        "trunc.tar": tar[:1200],
        "lying.tar": bytes(lying_tar),
        "garbage.tar": _noise(1024),
        "garbage.tar.gz": b"\x1f\x8b\x08\x00" + _noise(200),
        "trunc.npz": npz[: len(npz) // 2],
        "bomb.npz": _zip_claiming_a_huge_directory(),
        "trunc.parquet": b"PAR1" + _noise(100),
        "lying.parquet": b"PAR1" + _noise(100) + struct.pack("<I", 1 << 31) + b"PAR1",
        "trunc.arrow": b"ARROW1\x00\x00" + _noise(64),
        "trunc.tfrecord": record[:10],
        "lying.tfrecord": lying_tfr,
        "garbage.tfrecord": _noise(64),
        "garbage.pkl": _noise(64).replace(b"\x80", b"\x00"),
        "empty.npy": b"",
        "empty.h5": b"",
    }


def test_every_damaged_file_is_reported_not_raised(tmp_path):
    cases = _hostile(tmp_path)
    expect = {"npy": "npy", "h5": "hdf5", "tar": "webdataset", "gz": "webdataset", "npz": "npz",
              "parquet": "parquet", "arrow": "arrow", "tfrecord": "tfrecord", "pkl": "pickle"}
    for name, data in cases.items():
        path = write(str(tmp_path / "cases" / name), data)
        d = detect(path)
        assert d.kind in KINDS and not d.description.startswith(LAST_RESORT), name
        assert d.kind == expect[name.rsplit(".", 1)[-1]], (name, d)
        assert "damaged" in d.description, (name, d.description)
        assert d.damaged, name
    # all of them in one folder: one answer, no exception
    d = detect(str(tmp_path / "cases"))
    assert d.kind in KINDS and d.damaged


def test_garbage_under_a_dsconvert_output_does_not_raise(outputs, tmp_path):
    out = copy_output(outputs, "npy", tmp_path)
    for name in os.listdir(out):
        if name.endswith(".npy"):
            with open(os.path.join(out, name), "r+b") as f:
                f.truncate(20)
    d = detect(out)
    assert d.kind == "dsconvert" and d.num_samples == 5  # the manifest's word; `dsconvert verify` checks the rest


def test_tar_headers_that_declare_gigabytes_are_damage(tmp_path):
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = 4 << 30
    data = pax.tobuf(tarfile.USTAR_FORMAT) + b"x" * 4096
    d = detect(write(str(tmp_path / "pax.tar"), data))
    assert d.kind == "webdataset" and "damaged" in d.description and "header data" in d.description


def test_a_gzip_bomb_of_a_shard_is_counted_in_part(tmp_path, monkeypatch):
    monkeypatch.setattr(detect_limits, "TAR_INFLATE_BUDGET", 1 << 20)
    path = str(tmp_path / "bomb.tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for key in ("a", "b"):
            for field, size in (("bin", 4 << 20), ("cls", 1)):
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = size
                tf.addfile(info, io.BytesIO(bytes(size)))
    d = detect(path)
    assert d.kind == "webdataset" and not d.damaged
    assert d.num_samples is None and d.estimated_samples is not None and "~" in d.description


def test_outputs_in_subfolders(outputs, tmp_path):
    parent = tmp_path / "data"
    parent.mkdir()
    shutil.copytree(outputs["npy"][0], parent / "train")
    shutil.copytree(outputs["npy"][0], parent / "val")
    write(str(parent / "labels.txt"), b"cat\ndog\n")
    d = detect(str(parent))
    assert d.kind == "dsconvert" and d.format == "npy" and d.num_samples == 10
    assert d.description.startswith("2 dsconvert outputs in subfolders: train (npy, 5 samples), val (npy, 5 samples)")
    assert d.others == {"files": 1} and len(d.files) == 4
    shutil.copytree(outputs["wds"][0], parent / "wds")
    mixed = detect(str(parent))
    assert mixed.kind == "dsconvert" and mixed.format is None and mixed.num_samples == 15
    # a broken manifest in one of them: its files go to the content detection, and its tar
    # shards (jpgs) outweigh the two small npy outputs (16x20 pixels)
    write(str(parent / "wds" / "dsconvert.json"), b"{")
    d = detect(str(parent))
    assert d.kind == "webdataset" and d.num_samples == 5 and d.others["dsconvert"] == 2
    assert "also 2 dsconvert outputs: train (npy, 5 samples), val (npy, 5 samples)" in d.description


def test_the_sniff_budget_holds_for_many_extensions(tmp_path, monkeypatch):
    monkeypatch.setattr(detect_limits, "MAX_SNIFF", 5)
    calls = []
    real = detect_classify.sniff
    monkeypatch.setattr(detect_classify, "sniff", lambda store, e: calls.append(e.rel) or real(store, e))
    for i in range(30):
        np.save(tmp_path / f"a.x{i}", np.zeros(3))  # np.save adds .npy: a.x0.npy ...
        write(str(tmp_path / f"b.e{i}"), b"data")
    d = detect(str(tmp_path))
    assert len(calls) == 5
    assert d.kind == "npy" and len(d.files) == 30  # the .npy group was read first: the biggest



def test_mutated_files_of_every_kind(tmp_path, outputs):
    """Truncations and flipped bytes of real files of each kind: each is named or called damaged by
    the checks of its kind, never by detect's last-resort handler."""
    import random

    rng = random.Random(7)
    originals = dict(_hostile(tmp_path))  # already damaged ones are mutated further
    originals["real.h5"] = _h5_bytes(tmp_path)
    originals["real.npz"] = _npz_bytes()
    originals["real.tar"] = _tar_bytes([("a.jpg", b"x" * 700), ("a.cls", b"1"), ("b.jpg", b"y" * 900)])
    originals["real.tfrecord"] = tfrecord_bytes([b"abc", b"defg"])
    originals["real.npy"] = _npy(np.zeros((20, 20), np.uint8))
    originals["data.mdb"] = _lmdb_meta(0, 1) + _lmdb_meta(1, 2)
    originals["real.pkl"] = pickle.dumps({"a": [1, 2, 3]}, protocol=4)
    for name in sorted(os.listdir(outputs["wds"][0])):
        if name.endswith(".tar"):
            originals["wds-" + name] = open(os.path.join(outputs["wds"][0], name), "rb").read()
    for name, data in sorted(originals.items()):
        for i in range(12):
            blob = bytearray(data)
            if blob and i % 2:
                for _ in range(rng.randint(1, 8)):
                    blob[rng.randrange(len(blob))] = rng.randrange(256)
            else:
                blob = blob[: rng.randint(0, len(blob))]
            folder = tmp_path / "mut" / f"{name}-{i}"
            path = write(str(folder / name), bytes(blob))
            for target in (path, str(folder)):
                d = detect(target)
                assert d.kind in KINDS, (name, i)
                assert not d.description.startswith(LAST_RESORT), (name, i, d.description)


def test_a_file_of_a_dsconvert_output(outputs):
    out, manifest = outputs["npy"]
    d = detect(os.path.join(out, "dsconvert.json"))
    assert d.kind == "dsconvert" and d.num_samples == 5 and d.path == out
    shard = detect(os.path.join(out, manifest.shards[0].name))
    assert shard.kind == "npy" and f"one file of the dsconvert output in {out}" in shard.description


def test_a_long_shard_is_counted_in_proportion(tmp_path, monkeypatch):
    monkeypatch.setattr(detect_limits, "MAX_TAR_MEMBERS", 20)
    members = [(f"{i:04d}.{ext}", b"z" * 100) for i in range(100) for ext in ("jpg", "cls")]
    d = detect(write(str(tmp_path / "long.tar"), _tar_bytes(members)))
    assert d.kind == "webdataset" and d.num_samples is None and not d.damaged
    assert 70 <= d.estimated_samples <= 130 and "~" in d.description


def test_hugging_face_save_to_disk_folder(tmp_path):
    hf = tmp_path / "hf"
    write(str(hf / "data-00000-of-00001.arrow"), b"\xff\xff\xff\xff" + struct.pack("<i", 16) + bytes(400))
    write(str(hf / "state.json"), b"{}")
    write(str(hf / "dataset_info.json"), b"{}")
    d = detect(str(hf))
    assert d.kind == "arrow" and d.reader == "datasets.load_from_disk"
    assert d.description.startswith("a Hugging Face datasets folder (save_to_disk): Arrow IPC: 1 file")
    assert d.others == {"files": 2}


def test_npy_shards_without_their_manifest(outputs, tmp_path):
    out = copy_output(outputs, "npy", tmp_path)
    os.remove(os.path.join(out, "dsconvert.json"))
    d = detect(out)
    assert d.kind == "npy" and "samples tables of dsconvert npy shards, without their manifest" in d.description


@pytest.mark.parametrize("first", [b"(", b"]", b"}", b"c", b"I", b"S", b"V", b"N"])
def test_garbage_that_starts_like_a_text_pickle_is_damaged(tmp_path, first):
    """Protocol 0/1 pickles have no magic: 3 % of random files start with one of their opcodes
    (this test's hostile set flaked on that). Their opcodes are disassembled (never loaded): a
    file that does not parse to its STOP is damaged; real pickles of every protocol, whole or
    larger than what is read of them, are not."""
    import pickle
    import random

    rng = random.Random(first)
    for i in range(20):
        body = bytes(rng.getrandbits(8) for _ in range(63)).replace(b"\x80", b"\x00")
        d = detect(write(str(tmp_path / f"g{i}.pkl"), first + body))
        assert d.kind == "pickle" and d.damaged and "not a pickle" in d.description, d
    for proto in range(6):
        obj = {"x": list(range(5000)), "y": "label", "z": b"\x00" * 100}
        data = pickle.dumps(obj, protocol=proto)
        d = detect(write(str(tmp_path / f"ok{proto}.pkl"), data))
        assert d.kind == "pickle" and not d.damaged, (proto, d)
        d = detect(write(str(tmp_path / f"cut{proto}.pkl"), data[:50]))  # a whole file without its STOP
        assert d.damaged, (proto, d)


def test_pickles_of_protocols_0_and_1_start_with_any_of_their_opcodes(tmp_path):
    """No magic: a float, a long, a small int, an empty tuple, a 70 kB string are all pickles;
    a head whose argument declares more bytes than the file holds is not."""
    import pickle

    for i, (proto, obj) in enumerate([(0, 1.5), (0, 2 ** 40), (1, 5), (1, ()), (1, "hello"), (1, 1.5), (1, -1),
                                      (1, "y" * 70000)]):
        d = detect(write(str(tmp_path / f"v{i}.pkl"), pickle.dumps(obj, protocol=proto)))
        assert d.kind == "pickle" and not d.damaged, (proto, obj, d)
    rng = np.random.default_rng(0)
    for i, head in enumerate([b"\x80\x04B\xff\xff\xff\x7f", b"\x80\x03X\x00\x00\x10\x00", b"T\x00\x00\x02\x00"]):
        body = rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()
        d = detect(write(str(tmp_path / f"g{i}.pkl"), head + body))
        assert d.kind == "pickle" and d.damaged and "past the file's end" in d.description, d


def test_the_sniffer_table_names_each_format_once_and_passes_on_plain_bytes(tmp_path):
    """One sniffer per format, tried in order; bytes of no format pass through every one of them."""
    from dsconvert.analyze.detect.sniffers import SNIFFERS, Head
    from dsconvert.analyze.detect.walk import Entry, Store

    names = [name for name, _ in SNIFFERS]
    assert len(names) == len(set(names))
    path = write(str(tmp_path / "notes.bin"), b"just some text, of no format at all\n" * 40)
    store = Store()
    with store.open(path) as f:
        head = f.read()
    h = Head(store, Entry("notes.bin", path, len(head)), head, head[-8:], None)
    assert [name for name, sniffer in SNIFFERS if sniffer(h) is not None] == []
    assert detect(path).kind == "unknown"
