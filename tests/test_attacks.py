"""Issue 13's classes of attack, each tried for the whole class: decode limits that a hidden
header or a libjpeg warning slips past, HDF5 shards that read other files, names that a
protocol decodes into a path, files that are not files, foreign files in OUT, killed
conversions and cache fills, and counts that disagree between a manifest and its shards."""

import hashlib
import http.server
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest
from PIL import Image

from dsconvert import BadInputError, ManifestError, OutputExistsError, convert, open_dataset
from dsconvert.cli import main
from dsconvert.codecs import check_field, decode_field, decode_image, decode_rgb, jpeg_decoders
from dsconvert.manifest import Manifest
from dsconvert.verify import verify

from conftest import ROOT, encode, make_image_folder, rehash_parts, write
from support.records import read_record, record_path, write_record


def rehash_shard(out: str, name: str) -> None:
    """Make the record and the manifest agree with a shard changed on purpose (size, sha256,
    the record's own digest): a consistent hostile output, so only structural checks remain."""
    data = open(os.path.join(out, name), "rb").read()
    digest = hashlib.sha256(data).hexdigest()
    index = record_path(out, name)
    rec = read_record(index)
    rec.update(bytes=len(data), sha256=digest)
    write_record(index, rec)
    man = json.load(open(os.path.join(out, "dsconvert.json")))
    for s in man["shards"]:
        if s["name"] == name:
            s.update(bytes=len(data), sha256=digest)
    json.dump(man, open(os.path.join(out, "dsconvert.json"), "w"))
    rehash_parts(out)


def errors(report):
    return [p for p in report["problems"] if p["severity"] == "error"]


# --- decode limits: the decoder's own header, every path -------------------------------------

def _flat_jpeg(side: int) -> bytes:
    return encode(Image.new("RGB", (side, side), (90, 120, 30)), quality=50)


def _hidden_size(real: bytes, marker: int) -> bytes:
    """A JPEG whose real frame header is preceded by a parameterless marker and an APP1
    segment holding a fake 16x16 frame header: a parser that gives the parameterless marker a
    length lands on the fake one (the PyTurboJPEG-path bypass of issue 13)."""
    payload = bytearray(0xFFC0 - 2)
    payload[:9] = b"\x08\x00\x10\x00\x10\x03\x01\x11\x00"
    return real[:2] + bytes([0xFF, marker]) + b"\x00\x04" + b"\xff\xe1\xff\xc0" + bytes(payload) + real[2:]


@pytest.fixture
def low_pixel_limit(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)


@pytest.mark.parametrize("marker", [0xD0, 0xD3, 0xD7, 0x01, 0xD8])
@pytest.mark.parametrize("mode", ["pil", "numpy"])
def test_a_hidden_frame_size_is_refused_on_every_decode_path(low_pixel_limit, marker, mode):
    data = _hidden_size(_flat_jpeg(1500), marker)  # 2.25 Mpixel behind a 16x16 decoy
    # refused as a bomb, or (TEM, which Pillow does not take there) as no image at all: never decoded
    with pytest.raises((BadInputError, OSError), match="decompression bomb|cannot identify"):
        decode_image(data, mode)
    for name, _ in jpeg_decoders():
        with pytest.raises((BadInputError, OSError), match="decompression bomb|cannot identify"):
            decode_rgb(data, name)


def test_every_fast_decoder_checks_the_limit_from_its_own_header(low_pixel_limit):
    data = _flat_jpeg(1100)  # 1.21 Mpixel: over the limit, under Pillow's 2x hard limit
    names = [n for n, _ in jpeg_decoders()]
    assert names[-1] == "pil"
    for name in names:
        with pytest.raises(BadInputError, match="decompression bomb"):
            decode_rgb(data, name)


def test_the_hidden_bomb_is_skipped_in_conversion_and_refused_in_reading(tmp_path, low_pixel_limit, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3}, size=(40, 30))
    write(os.path.join(src, "a", "bomb.jpg"), _hidden_size(_flat_jpeg(1500), 0xD0))
    for fmt, extra in (("npy", {}), ("hdf5", {"decode": True}), ("wds", {})):
        out = str(tmp_path / fmt)
        m = convert(src, out, fmt, workers=1, **extra).manifest
        assert [s["path"] for s in m.skipped] == ["a/bomb.jpg"], fmt
        assert "decompression bomb" in m.skipped[0]["reason"]
    out = str(tmp_path / "unverified")  # --no-verify lets it in: the reader must refuse it then
    convert(src, out, verify=False, workers=1)
    with pytest.raises(BadInputError, match="decompression bomb"):
        list(open_dataset(out, decode="numpy"))


def _photo_jpeg(photos) -> bytes:
    return encode(photos["astronaut"].resize((256, 192)), quality=90)


def _damaged(data: bytes, rng: random.Random):
    """Truncations and corruptions across the whole entropy-coded segment."""
    for cut in (0.97, 0.9, 0.75, 0.5, 0.3, 0.1):
        yield f"cut {cut}", data[: int(len(data) * cut)]
    for k in range(12):
        buf = bytearray(data)
        for _ in range(1 + k % 3):
            pos = rng.randrange(700, len(buf) - 2)
            buf[pos] = rng.randrange(256)
        yield f"corrupt {k}", bytes(buf)
    yield "extraneous bytes before EOI", data[:-2] + b"\x00\x00\x00" + data[-2:]


def test_fast_decoders_accept_exactly_what_pillow_accepts(photos):
    """Truncation raises with every decoder, as with Pillow; a file Pillow decodes (with a
    libjpeg warning or not) gives Pillow's pixels or the fast decoder's, never a gray fill."""
    rng = random.Random(13)
    for what, data in _damaged(_photo_jpeg(photos), rng):
        try:
            want = decode_rgb(data, "pil")
        except Exception:
            want = None
        for name, _ in jpeg_decoders():
            try:
                got = decode_rgb(data, name)
            except Exception:
                got = None
            assert (got is None) == (want is None), (what, name)
            if got is not None:
                assert got.shape == want.shape and np.abs(got.astype(int) - want).mean() < 2, (what, name)


def test_a_truncated_jpeg_never_reaches_a_decoded_cache(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 2}, size=(40, 30))
    good = _photo_jpeg(photos)
    write(os.path.join(src, "a", "truncated.jpg"), good[: len(good) // 2])
    for verify_first in (True, False):
        out = str(tmp_path / f"npy-{verify_first}")
        m = convert(src, out, "npy", verify=verify_first, workers=1).manifest
        assert [s["path"] for s in m.skipped] == ["a/truncated.jpg"], verify_first
        assert verify(out, decode=True)["ok"]


def test_max_image_pixels_raises_the_limit_as_well_as_lowering_it(tmp_path, monkeypatch, photos):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    src = str(tmp_path / "src")
    write(os.path.join(src, "a", "big.jpg"), encode(photos["coffee"].resize((40, 40))))  # 1,600 pixels
    write(os.path.join(src, "a", "big.png"), encode(photos["rocket"].resize((50, 40)), "PNG"))
    for fmt in ("wds", "npy"):
        assert convert(src, str(tmp_path / f"{fmt}-default"), fmt, workers=1).manifest.num_samples == 0
        m = convert(src, str(tmp_path / f"{fmt}-raised"), fmt, workers=1, max_image_pixels=10_000).manifest
        assert m.num_samples == 2 and not m.skipped, fmt
        m = convert(src, str(tmp_path / f"{fmt}-lowered"), fmt, workers=1, max_image_pixels=1_800).manifest
        assert m.num_samples == 1 and "decompression bomb" in m.skipped[0]["reason"], fmt
    assert Image.MAX_IMAGE_PIXELS == 1000  # the process's limit is restored after each shard


def _npy_header_only(shape, dtype="<f8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@pytest.mark.parametrize("data, reason", [
    (_npy_header_only((1 << 37,)), "declares"),                  # 128 bytes declaring a terabyte
    (_npy_header_only((1 << 62, 1 << 62)), "declares"),           # a count that overflows int64
    (_npy_header_only((3,)) + b"\0" * 8, "declares"),              # short
    (b"PK\x03\x04" + b"\0" * 60, "not a .npy"),                    # an .npz named .npy
    (b"\x93NUMPY\x09\x00" + b"\0" * 60, "not a .npy"),             # an unknown version
    (_npy_header_only((2,), "|O") + b"\0" * 16, "pickled objects"),
])
def test_npy_fields_are_checked_before_anything_is_allocated(data, reason):
    with pytest.raises(BadInputError, match=reason):
        decode_field("npy", data)
    with pytest.raises(BadInputError):
        check_field("npy", data, verify=True)


def test_deeply_nested_json_fields_are_bad_input_not_a_recursion_crash(tmp_path, image_kinds):
    src = str(tmp_path / "flat")
    write(os.path.join(src, "s1.jpg"), image_kinds["baseline"][1])
    write(os.path.join(src, "s1.json"), b"[" * 100_000 + b"]" * 100_000)
    write(os.path.join(src, "s1.npy"), _npy_header_only((1 << 37,)))
    out = str(tmp_path / "out")
    m = convert(src, out, workers=1).manifest
    assert m.num_samples == 0 and len(m.skipped) == 3  # the sample's bad fields decide for it
    convert(src, str(tmp_path / "raw"), verify=False, workers=1)
    with pytest.raises(BadInputError, match="s1"):
        list(open_dataset(str(tmp_path / "raw")))


# --- HDF5 shards that would read other files -------------------------------------------------

SECRET = b"root:x:0:0:the secret that must never come back:/root:/bin/bash\n" * 4


def _tamper_external_storage(f, tmp):
    n = f["images"].shape[0]
    del f["images"]
    f.create_dataset("images", (n, len(SECRET) // n), np.uint8, external=[(tmp["secret"], 0, len(SECRET))])


def _tamper_external_link(f, tmp):
    del f["images"]
    f["images"] = h5py().ExternalLink(tmp["other"], "/images")


def _tamper_virtual(f, tmp):
    n = f["images"].shape[0]
    layout = h5py().VirtualLayout(shape=(n, 4), dtype=np.uint8)
    layout[:] = h5py().VirtualSource(tmp["other"], "/block", shape=(n, 4))
    del f["images"]
    f.create_virtual_dataset("images", layout)


def _tamper_soft_link(f, tmp):
    f.move("images", "elsewhere")
    f["images"] = h5py().SoftLink("/elsewhere")


def _tamper_filter(f, tmp):
    labels = f["labels"][()]
    del f["labels"]
    f.create_dataset("labels", data=labels, compression="gzip", chunks=True)


def _tamper_group(f, tmp):
    del f["keys"]
    f.create_group("keys")


def _tamper_extra(f, tmp):
    f.create_dataset("payload", data=np.zeros(3))


def h5py():
    import h5py as module

    return module


@pytest.mark.parametrize("tamper, what", [
    (_tamper_external_storage, "external files"),
    (_tamper_external_link, "ExternalLink"),
    (_tamper_virtual, "virtual dataset"),
    (_tamper_soft_link, "SoftLink"),
    (_tamper_filter, "filter"),
    (_tamper_group, "not a dataset"),
    (_tamper_extra, "not part of the layout"),
])
def test_hdf5_features_that_read_outside_the_shard_are_refused(tmp_path, photos, tamper, what):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 4}, size=(40, 30))
    out = str(tmp_path / "h5")
    convert(src, out, "hdf5", workers=1)
    tmp = {"secret": str(tmp_path / "secret"), "other": str(tmp_path / "other.h5")}
    write(tmp["secret"], SECRET)
    with h5py().File(tmp["other"], "w") as other:
        other.create_dataset("images", data=np.frombuffer(SECRET[:64], np.uint8).reshape(4, 16))
        other.create_dataset("block", data=np.frombuffer(SECRET[:16], np.uint8).reshape(4, 4))
    with h5py().File(os.path.join(out, "shard-000000.h5"), "a") as f:
        tamper(f, tmp)
    rehash_shard(out, "shard-000000.h5")
    report = verify(out)
    assert not report["ok"] and {p["kind"] for p in errors(report)} == {"structure"}
    assert any(what in p["message"] for p in errors(report))
    for decode in ("raw", "pil"):
        with pytest.raises(ManifestError, match="refused"):
            open_dataset(out, decode=decode)[0]
    assert main(["verify", out, "-q"]) == 4


def test_decoded_hdf5_shapes_that_do_not_fit_their_pixels_are_bad_input(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3}, size=(40, 30))
    out = str(tmp_path / "h5")
    convert(src, out, "hdf5", decode=True, workers=1)
    with h5py().File(os.path.join(out, "shard-000000.h5"), "a") as f:
        f["shapes"][1] = (1 << 30, 1 << 30, 3)
    with pytest.raises(BadInputError, match=r"shard-000000.h5\[1\].*does not fit"):
        open_dataset(out, decode="numpy")[1]


# --- names that a protocol decodes into a path -----------------------------------------------

HOSTILE_NAMES = ["%2e%2e%2fvictim%2fshard-000000.tar", "..%2fshard-000000.tar", "%2fetc%2fpasswd",
                 "shard-000000.tar?x=1", "shard-000000.tar#frag", "shard\x00.tar", "a b.tar", "../shard.tar",
                 "/etc/passwd", "..", ".", "sub/shard.tar", "C:\\shard.tar", "shard-00000٠.tar", ""]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("field", ["name", "index", "parts"])
def test_names_in_a_manifest_must_be_plain_file_names(tmp_path, image_folder, name, field):
    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    path = os.path.join(out, "dsconvert.json")
    d = json.load(open(path))
    shard = d["shards"][0]
    if field == "parts":
        shard["parts"][name] = shard["parts"].pop(shard["index"])
    else:
        shard[field] = name
    json.dump(d, open(path, "w"))
    with pytest.raises(ManifestError, match=rf"field 'shards\[0\]\.{field}'"):
        Manifest.load(out)


class _LoggingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list = []

    def log_message(self, *args):
        pass

    def send_head(self):
        type(self).requests.append(self.path)
        return super().send_head()


def test_a_percent_encoded_shard_name_never_reaches_an_http_server(tmp_path, image_folder):
    pytest.importorskip("aiohttp", reason="fsspec's HTTP file system needs aiohttp")
    root = tmp_path / "www"
    out = str(root / "out")
    convert(image_folder, out, workers=1)
    victim = root / "victim"
    victim.mkdir()
    for n in os.listdir(out):
        if n.startswith("shard-"):
            (victim / n).write_bytes(open(os.path.join(out, n), "rb").read())
    d = json.load(open(os.path.join(out, "dsconvert.json")))
    d["shards"][0]["name"] = "%2e%2e%2fvictim%2fshard-000000.tar"
    json.dump(d, open(os.path.join(out, "dsconvert.json"), "w"))
    handler = type("H", (_LoggingHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/out"
        with pytest.raises(ManifestError, match="plain file name"):
            list(open_dataset(url, decode="raw"))
        assert main(["verify", url, "-q"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert handler.requests and not any("victim" in p.lower() or "%2e" in p.lower() for p in handler.requests)


# --- files that are not files, sizes that data declares --------------------------------------

def _run_cli(args, timeout=60):
    return subprocess.run([sys.executable, "-m", "dsconvert", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("fmt, target", [(fmt, "shard") for fmt in ("wds", "hdf5", "npy")]
                         + [(fmt, "index") for fmt in ("wds", "hdf5", "npy")] + [("npy", "samples")])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_outputs_whose_files_are_not_regular_files_end_quickly(tmp_path, photos, fmt, kind, target):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3}, size=(40, 30))
    out = str(tmp_path / "out")
    m = convert(src, out, fmt, workers=1).manifest
    name = {"shard": m.shards[0].name, "index": m.shards[0].index,
            "samples": m.shards[0].name.replace(".npy", ".samples.npy")}[target]
    path = os.path.join(out, name)
    os.remove(path)
    if kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        os.mkdir(path)
    # a reader that blocked on the fifo or read /dev/zero to its end would hang: the two
    # subprocesses' timeouts (60 s each) fail the test then, whatever the machine's load
    result = _run_cli(["verify", out, "--decode"])
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
    assert "not a regular file" in result.stdout
    code = ("import sys; from dsconvert import open_dataset\n"
            "try:\n    ds = open_dataset(sys.argv[1], decode='raw' if sys.argv[2] != 'npy' else 'numpy')\n"
            "    list(ds) if sys.argv[2] == 'wds' else ds[0]\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    read = subprocess.run([sys.executable, "-c", code, out, fmt], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    if target != "index" or fmt == "wds":  # the map-style readers never read the record
        assert "not a regular file" in read.stdout, read.stdout + read.stderr
    else:
        assert read.returncode == 0 and not read.stdout, read.stdout + read.stderr


def _pax_header_declaring(size: int) -> bytes:
    """A PAX extended header block whose size field (GNU base-256) declares ``size`` bytes."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT)[:512])
    block[124:136] = bytes([0x80]) + size.to_bytes(11, "big")
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


@pytest.mark.parametrize("where", ["end", "start"])
def test_a_tar_header_declaring_a_terabyte_is_a_problem_not_a_memory_error(tmp_path, image_folder, where):
    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    path = os.path.join(out, "shard-000000.tar")
    data = open(path, "rb").read()
    members = sum(b.count(b"ustar") for b in [data])
    hostile = _pax_header_declaring(1 << 40) + b"\0" * 512
    if where == "end":  # after the last member, before the end-of-archive blocks
        with tarfile.open(path) as tf:
            last = tf.getmembers()[-1]
        end = last.offset_data + -(-last.size // 512) * 512
        data = data[:end] + hostile + data[end:]
    else:
        data = hostile + data
    open(path, "wb").write(data)
    rehash_shard(out, "shard-000000.tar")
    result = _run_cli(["verify", out])
    assert result.returncode == 4 and "Traceback" not in result.stderr and "MemoryError" not in result.stdout
    assert "structure" in result.stdout and members


# --- counts that disagree between a manifest and its shards ----------------------------------

@pytest.mark.parametrize("fmt", ["wds", "hdf5", "npy"])
def test_a_manifest_counting_more_samples_than_its_shard_holds(tmp_path, photos, fmt):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3}, size=(40, 30))
    out = str(tmp_path / "out")
    convert(src, out, fmt, workers=1)
    path = os.path.join(out, "dsconvert.json")
    d = json.load(open(path))
    d["shards"][0]["num_samples"] += 2
    d["num_samples"] += 2
    json.dump(d, open(path, "w"))
    with pytest.raises(ManifestError):  # when it opens (a shuffled output's order file) or reads
        ds = open_dataset(out, decode="raw" if fmt != "npy" else "numpy")
        list(ds) if fmt == "wds" else ds[4]
    assert not verify(out)["ok"]


def _rows(out):
    return os.path.join(out, "shard-000000.samples.npy")


def _overflowing_rows(out):
    rows = np.load(_rows(out))
    rows[1]["height"], rows[1]["width"], rows[1]["channels"] = 2**31 - 1, 2**31 - 1, 4  # wraps int64
    rows[1]["offset"] = 0
    np.save(_rows(out), rows)


def _npz_rows(out):
    rows = np.load(_rows(out))
    with open(_rows(out), "wb") as f:
        np.savez(f, rows=rows)


def _object_rows(out):
    with open(_rows(out), "wb") as f:
        np.save(f, np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)


def _wrong_dtype_rows(out):
    np.save(_rows(out), np.zeros(3, dtype=np.int64))


@pytest.mark.parametrize("tamper", [_overflowing_rows, _npz_rows, _object_rows, _wrong_dtype_rows])
def test_npy_samples_tables_are_checked_before_use(tmp_path, photos, tamper):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3}, size=(40, 30))
    out = str(tmp_path / "out")
    convert(src, out, "npy", workers=1)
    tamper(out)
    rehash_parts(out)
    with pytest.raises(ManifestError, match="samples"):
        open_dataset(out, decode="numpy")[1]
    report = verify(out, decode=True)
    assert not report["ok"] and "structure" in [p["kind"] for p in errors(report)]


# --- files in OUT that dsconvert did not write ----------------------------------------------

@pytest.mark.parametrize("foreign", ["shard-000007.tar", "shard-000050.index.json", "shard-000050.idx",
                                     "shard-000000.h5", ".shard-000001.tar.123.tmp", "notes.txt",
                                     "sub/shard-000000.tar"])
def test_files_dsconvert_did_not_write_are_never_removed(tmp_path, image_folder, foreign, capsys):
    out = tmp_path / "out"
    write(str(out / foreign), b"precious")
    with pytest.raises(OutputExistsError, match="is not a dsconvert output"):
        convert(image_folder, str(out), workers=1)
    assert main(["shard", image_folder, "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsconvert: error:") and foreign.split("/")[0] in err[0]
    assert (out / foreign).read_bytes() == b"precious"
    assert sorted(p.name for p in out.iterdir()) == [foreign.split("/")[0]]  # not even a lock file


def test_overwrite_writes_into_a_folder_that_is_not_an_output(tmp_path, image_folder):
    out = tmp_path / "out"
    write(str(out / "notes.txt"), b"kept")
    m = convert(image_folder, str(out), workers=1, overwrite=True).manifest
    assert m.num_samples == 16 and (out / "notes.txt").read_bytes() == b"kept"
    assert convert(image_folder, str(out), workers=1).already_complete  # it is an output now


def test_an_output_killed_before_its_manifest_still_resumes(tmp_path, image_folder):
    out = tmp_path / "out"
    convert(image_folder, str(out), workers=1, samples_per_shard=4)
    os.remove(out / "dsconvert.json")  # as a kill before the manifest leaves it
    r = convert(image_folder, str(out), workers=1, samples_per_shard=4)
    assert r.shards_resumed == 4 and not r.already_complete


# --- killed processes ------------------------------------------------------------------------

def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["wds", "npy"])
def test_pool_workers_die_with_a_killed_conversion_and_the_rerun_is_not_locked_out(tmp_path, photos, fmt):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 60, "b": 60}, size=(320, 240))
    out = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "dsconvert", "shard", src, "-o", out, "--format", fmt, "--samples-per-shard", "4",
           "--workers", "2", "-q"]
    proc = subprocess.Popen(cmd, cwd=ROOT)  # not a new session: only the main PID is killed
    try:
        deadline = time.time() + 60
        while len(_children(proc.pid)) < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.005)
        workers = _children(proc.pid)
        assert len(workers) >= 2, "the pool never started"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 15
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.05)
        alive = [w for w in workers if _alive(w)]
        for w in alive:  # clean up before failing
            os.kill(w, signal.SIGKILL)
        assert not alive, "pool workers outlived the killed conversion"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert verify(out)["ok"]


@pytest.mark.slow
def test_a_killed_rerun_never_leaves_a_manifest_that_disagrees_with_its_shards(tmp_path, photos):
    """A rerun after a "changed during the conversion" skip rewrites shards; killed at any
    instant, the output has no manifest or one that matches every shard it names."""
    from dsconvert.formats.wds import Wds
    from dsconvert.inputs import read_samples
    from dsconvert.plan import ShardSpec
    from dsconvert.source import scan

    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 40, "b": 40}, size=(320, 240))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dsconvert", "shard", src, "-o", str(out), "--samples-per-shard", "4",
           "--workers", "1", "-q", "--order", "source"]  # the shard below is planned in source order
    rng = random.Random(7)
    for attempt in range(4):
        out_s = str(out)
        if out.exists():
            import shutil

            shutil.rmtree(out)
        convert(src, out_s, samples_per_shard=4, workers=1, order="source")
        # what a run that saw a file of its first shard change after the scan leaves: that shard
        # without the file, and a manifest that lists it as changed during the conversion
        source = scan(src)
        victim = source.samples[1].files[0].path
        write(os.path.join(src, victim), encode(photos["rocket"].resize((320 - attempt, 240))))
        spec = ShardSpec("wds", 0, "shard-000000.tar", source.root, out_s, "classification", tuple(source.samples[:4]))
        result = Wds.write_shard(spec, read_samples(spec))
        assert [x.path for x in result.skipped] == [victim]
        d = json.load(open(out / "dsconvert.json"))
        d["shards"][0] = {"name": result.entry.name, "num_samples": 3, "bytes": result.entry.bytes,
                          "sha256": result.entry.sha256, "index": result.entry.index, "parts": result.entry.parts}
        d["num_samples"] -= 1
        d["skipped"].append({"path": victim, "reason": result.skipped[0].reason})
        d["accounting"]["files_skipped"] += 1
        d["accounting"]["files_written"] -= 1
        json.dump(d, open(out / "dsconvert.json", "w"))
        assert verify(out_s)["ok"]  # consistent before the rerun
        proc = subprocess.Popen(cmd, cwd=ROOT)
        time.sleep(rng.uniform(0.3, 1.5))
        proc.kill()
        proc.wait()
        if (out / "dsconvert.json").exists():
            assert verify(out_s)["ok"], attempt


@pytest.mark.slow
@pytest.mark.system
def test_a_cache_fill_killed_at_any_instant_never_serves_a_short_file(tmp_path, photos, slow_mount):
    backing, mnt = slow_mount  # a read-only passthrough that delays every request
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 20, "b": 20}, size=(320, 240))
    convert(src, str(backing / "out"), samples_per_shard=5, workers=1)
    out = str(mnt / "out")
    cache = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "dsconvert", "cache", out, cache, "--workers", "2", "-q"]
    rng = random.Random(3)
    for _ in range(3):
        proc = subprocess.Popen(cmd, cwd=ROOT)
        time.sleep(rng.uniform(0.2, 1.2))
        proc.kill()
        proc.wait()
        files = os.path.join(cache, "files")
        for name in os.listdir(files) if os.path.isdir(files) else []:  # whole or absent, never short
            if name.endswith((".tmp", ".sha256")):
                continue
            original = name.split("-", 1)[1]
            assert open(os.path.join(files, name), "rb").read() == open(os.path.join(out, original), "rb").read()
    result = _run_cli(["cache", out, cache, "-q"], timeout=300)
    assert result.returncode == 0, result.stderr
    want = [(bytes(x), y) for x, y in open_dataset(out, decode="raw", stream=False)]  # by index, as the cached one
    assert [(bytes(x), y) for x, y in open_dataset(out, decode="raw", cache_dir=cache)] == want


def test_a_short_copy_in_the_cache_is_found_and_fetched_again(tmp_path, image_folder):
    from dsconvert.io.shard_cache import ShardCache

    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    cache = str(tmp_path / "cache")
    want = [(bytes(x), y) for x, y in open_dataset(out, decode="raw", cache_dir=cache)]
    shard_cache = ShardCache(cache)
    for entry in Manifest.load(out).shards:
        for name in (entry.name, entry.index):
            local = shard_cache._local_path(os.path.join(out, name))
            data = open(local, "rb").read()
            open(local, "wb").write(data[: len(data) // 2])  # what a download to the final name left
            os.remove(local + ".sha256") if os.path.exists(local + ".sha256") else None
    assert [(bytes(x), y) for x, y in open_dataset(out, decode="raw", cache_dir=cache)] == want
